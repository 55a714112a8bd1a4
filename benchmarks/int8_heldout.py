"""Every int8 file of a trained model, judged on held-out test photos: TensorFlow's dynamic range, the default int8
and the npu target's full-integer file, each against the Keras model (top-1 agreement) and the labels (accuracy).

    python benchmarks/int8_heldout.py runs/cifar10/model.keras --data folder:cifar10 [--limit 2000] [--out DIR]

Calibration: the export's own default (the first calibration images of the data's training split); the judged
photos: ``--limit`` drawn at random (seed 0) from its test split, never calibrated on. Prints a Markdown table and
the CPU.
"""

import argparse
import os
import sys
import tempfile
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

FILES = (("dynamic (TensorFlow's dynamic range)", dict(quantize="dynamic")),
         ("int8 (the default)", dict(quantize="int8")),
         ("int8 --target npu", dict(quantize="int8", target="npu")))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", help="a .keras file saved by vit-keras (labels.txt beside it or class names in it)")
    parser.add_argument("--data", required=True, help="the data spec it was trained on (folder:PATH, fashion_mnist...)")
    parser.add_argument("--limit", type=int, default=2000, help="test photos judged (default 2000)")
    parser.add_argument("--out", default=None, help="where the .tflite files go (default: a temporary folder)")
    args = parser.parse_args(argv)
    from vit_keras.convert.export import export_tflite
    from vit_keras.cpu import cpu_features
    from vit_keras.convert.graph import keras_scores
    from vit_keras.convert.runtime import tflite_scores
    from vit_keras.convert.tflite import load_vit
    from vit_keras.data.datasets import load_arrays

    model = load_vit(args.model)
    images, labels = load_arrays(args.data, split="test", image_size=model.vit_config["image_size"])[:2]
    pick = np.random.default_rng(0).choice(len(images), min(args.limit, len(images)), replace=False)
    images, labels = images[pick], labels[pick]
    reference = keras_scores(model, images).argmax(-1)
    rows = ["| file | size MB | agreement with Keras | accuracy (Keras) | export s |", "|---|---|---|---|---|"]
    with tempfile.TemporaryDirectory() as scratch:
        for name, options in FILES:
            path = os.path.join(args.out or scratch, name.split()[0] + ("_npu" if "npu" in name else "") + ".tflite")
            start = time.perf_counter()
            summary = export_tflite(args.model, path, calibration=args.data, **options)
            seconds = time.perf_counter() - start
            top = tflite_scores(path, images).argmax(-1)
            rows.append(f"| {name} | {summary['bytes'] / 1e6:.2f} | {100 * np.mean(top == reference):.2f}% | "
                        f"{100 * np.mean(top == labels):.2f}% ({100 * np.mean(reference == labels):.2f}%) | "
                        f"{seconds:.0f} |")
    print(f"{os.path.basename(args.model)}, {len(images)} test photos of {args.data}; {cpu_features().describe()}\n")
    print("\n".join(rows))


if __name__ == "__main__":
    main()
