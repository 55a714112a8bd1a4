"""int8 activation ranges, min/max against least squared error, over several calibration draws of the zoo models.

    .venv/bin/python benchmarks/int8_ranges.py --cache zoo_models --models quick,plain_gap --draws 3

Each draw calibrates the default int8 graph on 300 other training images (draw 0: the end of the training split,
as benchmarks/int8_zoo.py calibrates; draw d > 0: images 10,000·d onwards); both files of a draw share that
calibration, so the rows differ only in their ranges. Agreement with Keras and accuracy are measured on the
Fashion-MNIST test images, which neither training nor calibration saw. Models come from int8_zoo's cache (trained
there when missing).
"""

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

import numpy as np  # noqa: E402

import int8_zoo  # noqa: E402


def calibration_draw(train_images, draw):
    from vit_keras.convert.sensitivity import held_out_count

    start = len(train_images) - int8_zoo.CALIBRATION - held_out_count(int8_zoo.TARGET) if draw == 0 else 10000 * draw
    return train_images[start:start + int8_zoo.CALIBRATION]


def draw_rows(keras_path, train_images, test, test_labels, draws, folder):
    """[(draw, {ranges: (agreement, accuracy)})] for one model; and its Keras accuracy."""
    from vit_keras.constants import INT8_RANGES
    from vit_keras.convert.tflite import convert, load_vit
    from vit_keras.convert.graph import keras_scores
    from vit_keras.convert.runtime import tflite_scores
    from vit_keras.data.pipeline import fit_images

    model = load_vit(keras_path)
    size, channels = model.vit_config["image_size"], model.vit_config["channels"]
    test = fit_images(test, size, channels)
    reference = keras_scores(model, test)
    rows = []
    for draw in range(draws):
        calibration = fit_images(calibration_draw(train_images, draw), size, channels)
        cells = {}
        for ranges in INT8_RANGES:
            path = os.path.join(folder, f"{ranges}.tflite")
            with open(path, "wb") as f:
                f.write(convert(model, "int8", calibration, ranges=ranges))
            top1 = tflite_scores(path, test).argmax(-1)
            cells[ranges] = (float(np.mean(top1 == reference.argmax(-1))), float(np.mean(top1 == test_labels)))
        rows.append((draw, cells))
    return rows, float(np.mean(reference.argmax(-1) == test_labels))


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cache", required=True, help="int8_zoo's folder of trained zoo models")
    parser.add_argument("--models", default="quick,plain_gap", help="comma-separated zoo names")
    parser.add_argument("--draws", type=int, default=3, help="calibration draws a model (at most 6)")
    args = parser.parse_args(argv)
    names = [n for n in args.models.split(",") if n]
    unknown = sorted(set(names) - set(int8_zoo.ZOO))
    if unknown:
        parser.error(f"unknown --models {', '.join(unknown)}; valid: {', '.join(int8_zoo.ZOO)}")
    if not 1 <= args.draws <= 6:
        parser.error(f"--draws must be 1 to 6 (draw d calibrates on images 10,000·d onwards); got {args.draws}")
    from vit_keras.data.datasets import load_arrays

    train_images = load_arrays("fashion_mnist", "train")[0]
    test, test_labels = load_arrays("fashion_mnist", "test")[:2]
    print("| model (Keras accuracy) | draw | min/max: agreement | accuracy lost | mse: agreement | accuracy lost |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as folder:
        for name in names:
            path = int8_zoo.train_or_load(name, int8_zoo.ZOO[name], args.cache, quick=False)
            if name in int8_zoo.TINTED:
                model_train, model_test = int8_zoo.tinted(train_images, seed=1), int8_zoo.tinted(test, seed=2)
                labels = int8_zoo.folder_labels(path, test_labels)
            else:
                model_train, model_test, labels = train_images, test, test_labels
            rows, accuracy = draw_rows(path, model_train, model_test, labels, args.draws, folder)
            for draw, cells in rows:
                line = [f"{name} ({100 * accuracy:.2f}%)", str(draw)]
                for agreement, int8_accuracy in (cells["minmax"], cells["mse"]):
                    line += [f"{100 * agreement:.2f}%", f"{100 * (accuracy - int8_accuracy):+.2f}"]
                print("| " + " | ".join(line) + " |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
