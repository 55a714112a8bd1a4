"""Fine-tuning with no flag but --weights, measured whole: does the fit land on the estimate its image size was
chosen by (docs/finetuning.md, "Resolution for the data and the machine")?

Runs `vit-keras train --data folder:DATA --weights WEIGHTS --out OUT` (stdout to a pipe, as in a log), samples the
RSS of its process tree every second, and prints: the size it chose and why (with the warm-up's rates), the fit's
measured minutes against the estimate, the final validation accuracy (DATA's test/ folder where it has one), the
whole command's seconds and its peak RSS.

    VIT_KERAS_WEIGHTS_MIRROR=/path/mirror python benchmarks/finetune_estimate.py --data /path/cifar10 \
        --weights vit_tiny_patch16_224.augreg_in21k_ft_in1k --out /tmp/finetune
"""

import argparse
import json
import os
import sys

from train_at_scale import run


def main():
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--data", required=True, help="a folder of photos: train/ and test/, one sub-folder a class")
    parser.add_argument("--weights", required=True, help="a preset, a checkpoint or a .keras model")
    parser.add_argument("--out", default="/tmp/finetune_estimate")
    parser.add_argument("--backend", default="tensorflow")
    args = parser.parse_args()
    vit_keras = os.path.join(os.path.dirname(sys.executable), "vit-keras")
    command = [vit_keras, "train", "--data", f"folder:{args.data}", "--weights", args.weights, "--out", args.out,
               "--overwrite"]
    os.makedirs(args.out, exist_ok=True)
    with open(args.out + ".log", "w") as log:
        figures = run(command, dict(os.environ, KERAS_BACKEND=args.backend), log=log)
    lines = figures["output"].splitlines()
    for prefix in ("image size:", "fit:"):
        print(next((line for line in lines if line.startswith(prefix)), f"{prefix} (not printed)"))
    try:
        with open(os.path.join(args.out, "config.json")) as f:
            record = json.load(f)
    except (OSError, ValueError):
        record = {}
    accuracy = record.get("final_val_accuracy")
    print(f"final validation accuracy: {accuracy:.2%}" if accuracy is not None else "final validation accuracy: none "
          "(the run did not finish)")
    print(f"whole command: {figures['seconds']:.0f} s, peak RSS {figures['peak_gb']:.2f} GB, rc {figures['rc']}")


if __name__ == "__main__":
    main()
