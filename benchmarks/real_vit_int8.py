"""int8 on a real ImageNet-pretrained ViT-Ti/16: every export mode's size, latency, agreement and accuracy, two folds.

    python benchmarks/real_vit_int8.py /path/to/real-imagenet [--out DIR] [--limit N] [--runs 50] [--static]
        [--compare] [--min-agreement 0.98]

The folder is what shared/fixtures/real_imagenet.py writes: vit_ti16_in1k.safetensors (timm's layout, inputs
normalized with mean = std = 0.5), photos/<class index>/<file>.JPEG (one photo a class) and labels.txt. Photos are
resized to 248 on the short side (bicubic) and centre-cropped to 224, as timm evaluates. Two folds: int8
calibrates on the even classes' photos and is judged on the odd ones', then the reverse, so every photo is judged
by a file that never saw it; float files need no calibration and are judged on the same halves. Agreement is top-1
against the Keras model, accuracy against the photo's class. Latency: batch 1, the median of --runs invocations,
rounds of every file interleaved, the fold-1 file of each int8 mode. Prints a Markdown table and the CPU.

Always: "int8 --target npu", the full-integer file (int8 weights, int16 activations), judged on every photo of
its half like the CPU files (other files slower than SLOW_MS an image on SLOW_SAMPLE of them).

--compare adds, calibrated on the same photos, ai-edge-quantizer 0.10.0's recipes applied to our float32 file
(static int8, 16-bit activations with int8 weights, dynamic) and TFLite's own 16x8 mode (16-bit activations, int8
weights) of the same graph; and ai-edge-quantizer's two static recipes applied to the float32 file of the npu
target's own graph (written to hold in int16, ``convert/integer_graph.py``). --min-agreement adds the static sweep's file (``export_tflite(min_agreement=...)``,
its held-out part taken from the fold's calibration photos) and prints how long each fold's sweep took.
"""

import argparse
import os
import sys
import tempfile

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))  # int8_zoo's ai-edge-quantizer helper

from vit_keras.cpu import cpu_features  # noqa: E402  (after the path)

CROP, RESIZE = 224, 248  # timm's evaluation transform for 224-pixel ViTs (crop_pct 0.9)
MODES = ("float32", "float16", "dynamic", "int8")
AEQ_RECIPES = ("static_wi8_ai8", "static_wi8_ai16", "dynamic_wi8_afp32")  # ai-edge-quantizer 0.10.0's
SLOW_MS, SLOW_SAMPLE = 200, 100  # files slower than this an image are judged on this many photos a half
NPU_MODE = "int8 --target npu"  # judged on every photo however slow: its agreement is a target


def load_photos(folder, limit=None):
    """(uint8 images (N, 224, 224, 3), class indices) of photos/<index>/*, resized and cropped as timm does."""
    from PIL import Image

    images, labels = [], []
    for name in sorted(os.listdir(os.path.join(folder, "photos"))):
        for file in sorted(os.listdir(os.path.join(folder, "photos", name)))[:1]:
            with Image.open(os.path.join(folder, "photos", name, file)) as photo:
                photo = photo.convert("RGB")
                scale = RESIZE / min(photo.size)
                photo = photo.resize((round(photo.width * scale), round(photo.height * scale)), Image.BICUBIC)
                left, top = (photo.width - CROP) // 2, (photo.height - CROP) // 2
                images.append(np.asarray(photo.crop((left, top, left + CROP, top + CROP))))
            labels.append(int(name))
    images, labels = np.stack(images), np.array(labels)
    folds = [np.flatnonzero(labels % 2 == parity)[:limit] for parity in (0, 1)]
    keep = np.sort(np.concatenate(folds))
    return images[keep], labels[keep]


def build_model(folder):
    import vit_keras

    return vit_keras.create_model("vit_ti16", weights=os.path.join(folder, "vit_ti16_in1k.safetensors"),
                                  pixel_mean="inception", pixel_std="inception", include_preprocessing=True)


def export_files(model, labels, images, classes, out, args):
    """{(mode, fold): path}; fold None for float files, else the parity of the classes int8 calibrated on."""
    import time

    from vit_keras.convert.export import export_tflite

    files = {}
    for mode in MODES[:3]:
        files[(mode, None)] = os.path.join(out, f"{mode}.tflite")
        if not (args.reuse and os.path.isfile(files[(mode, None)])):
            export_tflite(model, files[(mode, None)], quantize=mode, labels=labels)
    int8_modes = [("int8", dict(int8_activations="dynamic")), (NPU_MODE, dict(target="npu"))]
    if args.static:
        int8_modes.append(("int8 static", dict(int8_activations="static")))
    if args.min_agreement:
        int8_modes.append((f"int8 --min-agreement {args.min_agreement}", dict(min_agreement=args.min_agreement)))
    for name, options in int8_modes:
        for fold in (0, 1):
            calibration = images[classes % 2 == fold]
            path = os.path.join(out, f"{name.replace(' ', '_')}_calibrated_on_{'odd' if fold else 'even'}.tflite")
            files[(name, fold)] = path
            if args.reuse and os.path.isfile(path):
                continue
            start = time.perf_counter()
            export_tflite(model, path, quantize="int8", labels=labels, calibration=calibration,
                          calibration_size=len(calibration), **options)
            if "min_agreement" in options:
                print(f"{name}, calibrated on the {'odd' if fold else 'even'} classes: the sweep and export took "
                      f"{time.perf_counter() - start:.0f} s")
    if args.compare:
        files.update(compared_files(model, labels, images, classes, files[("float32", None)], out, args.reuse))
    return files


def compared_files(model, labels, images, classes, float_path, out, reuse=False):
    """ai-edge-quantizer's recipes and TFLite's 16x8 mode, each fold calibrated on its classes' photos."""
    from int8_zoo import ai_edge_quantize

    files = {}
    for fold in (0, 1):
        calibration, side = images[classes % 2 == fold], "odd" if fold else "even"
        for recipe_name in AEQ_RECIPES:
            path = os.path.join(out, f"aeq_{recipe_name}_calibrated_on_{side}.tflite")
            if not (reuse and os.path.isfile(path)):
                ai_edge_quantize(float_path, recipe_name, calibration, path)
            files[(f"ai-edge-quantizer {recipe_name}", fold)] = path
        path = os.path.join(out, f"tflite_16x8_calibrated_on_{side}.tflite")
        if not (reuse and os.path.isfile(path)):
            tflite_16x8(model, labels, calibration, path)
        files[("TFLite 16x8", fold)] = path
        integer_float = os.path.join(out, f"npu_graph_float32_calibrated_on_{side}.tflite")
        if not (reuse and os.path.isfile(integer_float)):
            npu_graph_float32(model, labels, calibration, integer_float)
        for recipe_name in AEQ_RECIPES[:2]:
            path = os.path.join(out, f"aeq_{recipe_name}_npu_graph_calibrated_on_{side}.tflite")
            if not (reuse and os.path.isfile(path)):
                ai_edge_quantize(integer_float, recipe_name, calibration, path)
            files[(f"ai-edge-quantizer {recipe_name}, npu graph", fold)] = path
    return files


def npu_graph_float32(model, labels, calibration, path):
    """The npu target's graph (its LayerNorms' ranges calibrated on ``calibration``) as a float32 file taking raw
    pixels, for ai-edge-quantizer to quantize."""
    import tensorflow as tf

    from vit_keras.convert import metadata as tflite_metadata
    from vit_keras.convert.export import classifier_metadata
    from vit_keras.convert.graph import concrete_function
    from vit_keras.convert.tflite import calibrated_variances

    function = concrete_function(model, raw_pixels=True, variances=calibrated_variances(model, calibration))
    converted = tf.lite.TFLiteConverter.from_concrete_functions([function]).convert()
    meta = classifier_metadata(model, labels, "int8", np.float32)  # raw 0-255 pixels: mean 0, std 1
    data = tflite_metadata.populate(converted, meta, {"labels.txt": ("\n".join(labels) + "\n").encode()})
    with open(path, "wb") as f:
        f.write(data)
    return path


def tflite_16x8(model, labels, calibration, path):
    """TFLite's 16-bit-activation, 8-bit-weight mode of the export graph (raw-pixel float input, our metadata)."""
    import tensorflow as tf

    from vit_keras.convert import metadata as tflite_metadata
    from vit_keras.convert.export import classifier_metadata
    from vit_keras.convert.graph import concrete_function
    from vit_keras.convert.tflite import representative_dataset

    converter = tf.lite.TFLiteConverter.from_concrete_functions([concrete_function(model, raw_pixels=True)])
    converter.optimizations = [tf.lite.Optimize.DEFAULT]
    converter.representative_dataset = representative_dataset(calibration)
    converter.target_spec.supported_ops = [tf.lite.OpsSet.EXPERIMENTAL_TFLITE_BUILTINS_ACTIVATIONS_INT16_WEIGHTS_INT8]
    meta = classifier_metadata(model, labels, "int8", np.float32)  # raw 0-255 pixels: mean 0, std 1
    data = tflite_metadata.populate(converter.convert(), meta, {"labels.txt": ("\n".join(labels) + "\n").encode()})
    with open(path, "wb") as f:
        f.write(data)
    return path


def judge(files, images, classes, reference):
    """{(mode, fold): (agreement, accuracy, photos judged, Keras's accuracy on them)} on the photos of the classes each file never calibrated
    on; a file slower than SLOW_MS an image (16-bit activations run on reference kernels) on the first
    SLOW_SAMPLE of them."""
    from vit_keras.convert.runtime import latency_ms, tflite_scores

    results = {}
    for (mode, fold), path in files.items():
        slow = latency_ms(path, threads=2, runs=1, warmup=0) > SLOW_MS and mode != NPU_MODE
        for judged in ((1 - fold,) if fold is not None else (1, 0)):
            chosen = np.flatnonzero(classes % 2 == judged)[:SLOW_SAMPLE if slow else None]
            top = tflite_scores(path, images[chosen]).argmax(-1)
            results[(mode, 1 - judged)] = (float(np.mean(top == reference[chosen])),
                                          float(np.mean(top == classes[chosen])), len(chosen),
                                          float(np.mean(reference[chosen] == classes[chosen])))
    return results


def latencies(paths, runs):
    """{path: {(runtime, threads): ms}}: the best of interleaved rounds of each file's median."""
    from vit_keras.constants import RUNTIMES
    from vit_keras.convert.runtime import latency_ms

    timings = {path: {} for path in paths}
    slow = {path for path in paths if latency_ms(path, threads=2, runs=1, warmup=0) > SLOW_MS}
    for runtime in RUNTIMES:
        for threads in (1, 2):
            for _ in range(3):
                for path in paths:
                    try:  # reference-kernel files: a few runs say enough
                        ms = latency_ms(path, runtime, threads, runs=min(runs, 5) if path in slow else runs,
                                        warmup=1 if path in slow else 10)
                    except ValueError:  # CompiledModel takes no int16 input (16-bit activation files)
                        ms = float("nan")
                    key = (runtime, threads)
                    timings[path][key] = min(timings[path].get(key, ms), ms)
    return timings


def table(files, results, timings):
    base = files[("float32", None)]
    lines = ["| file | size MB (× float32) | Interpreter 1T / 2T ms | CompiledModel 1T / 2T ms | latency × float32 "
             "(I 1T / 2T, C 1T / 2T) | agreement, calibrated on even / odd | accuracy lost, points, even / odd |",
             "|---|---|---|---|---|---|---|"]
    keys = [(runtime, threads) for runtime in ("interpreter", "compiled") for threads in (1, 2)]
    for mode in dict.fromkeys(mode for mode, _ in files):
        path = files.get((mode, 1), files.get((mode, None)))
        size = os.path.getsize(path) / 1e6
        t = timings[path]
        ratios = " / ".join(f"{t[k] / timings[base][k]:.2f}" for k in keys)
        agreement = " / ".join(f"{100 * results[(mode, fold)][0]:.1f}%" for fold in (0, 1))
        lost = " / ".join(f"{100 * (results[(mode, fold)][3] - results[(mode, fold)][1]):+.1f}" for fold in (0, 1))
        judged = {results[(mode, fold)][2] for fold in (0, 1)}
        sample = f" (on {min(judged)} photos a half)" if min(judged) < SLOW_SAMPLE + 1 else ""
        lines.append(f"| {mode}{sample} | {size:.2f} ({size * 1e6 / os.path.getsize(base):.3f}) | "
                     f"{t[keys[0]]:.1f} / {t[keys[1]]:.1f} | {t[keys[2]]:.1f} / {t[keys[3]]:.1f} | {ratios} | "
                     f"{agreement} | {lost} |")
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("folder", help="the fixture folder (vit_ti16_in1k.safetensors, photos/, labels.txt)")
    parser.add_argument("--out", default=None, help="where the .tflite files go (default: a temporary folder)")
    parser.add_argument("--limit", type=int, default=None, help="photos a fold (default all: 500)")
    parser.add_argument("--runs", type=int, default=50, help="timed invocations a latency figure")
    parser.add_argument("--static", action="store_true", help="also static int8 (--int8-activations static)")
    parser.add_argument("--compare", action="store_true",
                        help="also ai-edge-quantizer's recipes and TFLite's 16x8 mode on the same photos")
    parser.add_argument("--reuse", action="store_true", help="keep the files already in --out instead of exporting")
    parser.add_argument("--min-agreement", type=float, default=None, metavar="FRACTION",
                        help="also static int8's --min-agreement file (its sweep timed)")
    args = parser.parse_args(argv)
    from vit_keras.convert.graph import keras_scores

    with open(os.path.join(args.folder, "labels.txt"), encoding="utf-8") as f:
        labels = [line.strip() for line in f if line.strip()]
    model = build_model(args.folder)
    images, classes = load_photos(args.folder, args.limit)
    reference = keras_scores(model, images, batch_size=32).argmax(-1)
    float_accuracy = {fold: float(np.mean((reference == classes)[classes % 2 != fold])) for fold in (0, 1)}
    with tempfile.TemporaryDirectory() as scratch:
        out = args.out or scratch
        files = export_files(model, labels, images, classes, out, args)
        results = judge(files, images, classes, reference)
        paths = list(dict.fromkeys(files.get((m, 1), files.get((m, None))) for m, _ in files))
        timings = latencies(paths, args.runs)
        print(f"ViT-Ti/16 (ImageNet-1k), {len(images)} photos; Keras top-1 {100 * np.mean(reference == classes):.1f}%"
              f" (judged halves: classes calibrated on even {100 * float_accuracy[0]:.1f}%, odd "
              f"{100 * float_accuracy[1]:.1f}%); {cpu_features().describe()}\n")
        print(table(files, results, timings))


if __name__ == "__main__":
    main()
