"""Real checkpoint folders loaded from the folder alone, against their owners' logits on the 1,000 real photos.

    .venv/bin/python benchmarks/pretrained_parity.py --real REAL_DIR --peers-python /work/.venv-ref/bin/python

Runs ``benchmarks/pretrained_reference.py`` in the benchmark-only venv (timm, transformers), which writes a timm
folder and a 200-class transformers folder of the real ViT-Ti/16 with their logits; then, here,
``vit_keras.from_pretrained(folder)`` with no other argument, and prints per folder: the largest logit difference,
top-1 agreement, the class names and normalization it took, and the exported int8 file's labels (no --labels).
"""

import argparse
import os
import subprocess
import sys
import tempfile
import time

import numpy as np

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--real", required=True, help="the real ViT-Ti/16 fixture folder (real_imagenet.py's OUT)")
    parser.add_argument("--peers-python", required=True, help="the reference venv's python (torch, timm, transformers)")
    parser.add_argument("--work", default=None, help="where the folders go (default: a temporary folder)")
    args = parser.parse_args()
    work = args.work or tempfile.mkdtemp(prefix="pretrained_parity_")
    subprocess.run([args.peers_python, os.path.join(HERE, "pretrained_reference.py"), args.real, work], check=True)

    from PIL import Image

    import vit_keras
    from vit_keras.convert.export import export_tflite
    from vit_keras.convert.metadata import read_labels

    images = np.load(os.path.join(work, "photos.npy")).astype("float32")
    reference = np.load(os.path.join(work, "reference.npz"))
    fixtures = os.path.join(os.path.dirname(HERE), "tests", "fixtures", "pretrained")
    for key in sorted(k for k in reference.files if k.startswith("fixture_")):
        case = key[len("fixture_"):]
        model = vit_keras.from_pretrained(os.path.join(fixtures, case))
        size = model.input_shape[1]
        small = np.stack([np.asarray(Image.fromarray(image.astype("uint8")).resize((size, size), Image.BICUBIC))
                          for image in images]).astype("float32")
        ours = model.predict(small, batch_size=100, verbose=0)
        agreement = 100 * (ours.argmax(-1) == reference[key].argmax(-1)).mean()
        print(f"{case} (random weights, {size} px): max |logit difference| {np.abs(ours - reference[key]).max():.1e} "
              f"on the {len(images)} photos, top-1 agreement {agreement:.1f}%")
    for name in ("timm_vit_tiny", "hf_vit_tiny_200"):
        start = time.perf_counter()
        model = vit_keras.from_pretrained(os.path.join(work, name))
        ours = model.predict(images, batch_size=50, verbose=0)
        theirs = reference[name]
        agreement = float((ours.argmax(-1) == theirs.argmax(-1)).mean())
        print(f"{name}: {model!r}; eps {model.vit_config['norm_epsilon']}, mean {model.vit_config['pixel_mean']}, "
              f"{len(model.class_names or [])} class names ({(model.class_names or ['-'])[0]!r}, ...)")
        print(f"  {len(images)} photos: max |logit difference| {np.abs(ours - theirs).max():.2e}, top-1 agreement "
              f"{100 * agreement:.1f}% ({time.perf_counter() - start:.0f} s)")
        out = os.path.join(work, name + "_int8.tflite")
        export_tflite(model, out, quantize="int8", calibration=images[::4][:300])
        labels = read_labels(out)
        print(f"  int8 .tflite without --labels: {len(labels)} labels, first {labels[0]!r}, equal to the folder's: "
              f"{labels == model.class_names}")


if __name__ == "__main__":
    sys.exit(main())
