"""int8 on a zoo of models trained differently: ours against ai-edge-quantizer's recipes, on held-out images.

    .venv/bin/python benchmarks/int8_zoo.py --quick            # tiny trainings (minutes): checks the script
    .venv/bin/python benchmarks/int8_zoo.py --cache zoo_models # the full zoo (hours of training, cached)

Each zoo model is trained on Fashion-MNIST (or loaded from ``--cache``), exported to float32 and to int8 by
our exporter (the default, dynamic activations; static, with and without LayerNorm smoothing, and with
``min_agreement``), and the same float32 file is
quantized by ai-edge-quantizer (``pip install ai-edge-quantizer==0.10.0``; its rows are skipped without it).
Agreement and accuracy are measured on test images that neither training nor calibration saw; latency is
LiteRT's, batch 1, both runtimes, 1 and 2 threads, as a ratio to our float32 file.
"""

import argparse
import os
import sys
import tempfile

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

import numpy as np

# name -> vit_keras.training.train.train options (the zoo: recipes, and models trained differently)
ZOO = {
    "quick": dict(recipe="quick"),
    "long": dict(recipe="long"),
    "no_label_smoothing": dict(recipe="quick", label_smoothing=0.0),
    "heads_8x8": dict(recipe="quick", model_overrides=dict(hidden_size=64, num_heads=8)),
    "own_normalization": dict(recipe="quick", model_overrides=dict(pixel_mean=(0.286,), pixel_std=(0.353,))),
    "plain_gap": dict(recipe="quick", model_overrides=dict(stem=None)),
    "token_pooling": dict(recipe="quick", model_overrides=dict(pooling="token", class_token=True)),
    "hybrid_r8": dict(recipe="quick", model_overrides=dict(stem="r8")),  # a ResNetV2 stem at 28x28
    "trained_4x": dict(recipe="quick", epochs=48),
    # RGB: Fashion-MNIST tinted per image (``tinted``), normalized per channel with its own mean and std
    "rgb_per_channel": dict(recipe="quick"),
}
TINTED = {"rgb_per_channel"}  # models that train and are tested on tinted images
TINT_RANGES = ((0.6, 1.0), (0.3, 0.8), (0.1, 0.5))  # per channel: the channels' statistics differ
# static_wi8_ai16 (a16w8) is left out: it gives the file int16 inputs, which LiteRT's CompiledModel buffers refuse
# ("Unsupported dtype: int16") and verify.prepare does not quantize.
AEQ_RECIPES = ("static_wi8_ai8", "dynamic_wi8_afp32")
CALIBRATION = 300  # images int8 calibrates on, as the export's default
TARGET = 0.995  # the sweep's --min-agreement


def tinted(images, seed):
    """Fashion-MNIST in colour: each image's grey times its own random tint, one range a channel (TINT_RANGES)."""
    low, high = np.array(TINT_RANGES).T
    tint = np.random.default_rng(seed).uniform(low, high, (len(images), 1, 1, 3))
    return np.round(np.asarray(images, "float32") * tint).astype(np.uint8)


def tinted_folder(cache, limit):
    """``cache``/tinted: train/ and test/ folders of tinted Fashion-MNIST PNGs (written once), and the training
    images' per-channel (mean, std) in [0, 1] units."""
    from PIL import Image

    from vit_keras.data.datasets import FASHION_MNIST_CLASSES, load_arrays

    root = os.path.join(cache, "tinted" + (f"_{limit}" if limit else ""))
    train_images = tinted(load_arrays("fashion_mnist", "train", limit=limit)[0], seed=1)
    if not os.path.exists(os.path.join(root, "done")):
        names = [folder_name(n) for n in FASHION_MNIST_CLASSES]
        for split, seed in (("train", 1), ("test", 2)):
            images, labels, _ = load_arrays("fashion_mnist", split, limit=limit)
            for i, (image, label) in enumerate(zip(tinted(images, seed), labels)):
                os.makedirs(os.path.join(root, split, names[label]), exist_ok=True)
                Image.fromarray(image).save(os.path.join(root, split, names[label], f"{i:05d}.png"))
        open(os.path.join(root, "done"), "w").close()
    pixels = train_images.reshape(-1, 3) / 255.0
    return root, tuple(np.round(pixels.mean(0), 3)), tuple(np.round(pixels.std(0), 3))


def folder_labels(keras_path, labels):
    """Fashion-MNIST's label indices as the indices of a model trained on a folder (its labels.txt order)."""
    from vit_keras.data.datasets import FASHION_MNIST_CLASSES

    with open(os.path.join(os.path.dirname(keras_path), "labels.txt")) as f:
        order = [line.strip() for line in f if line.strip()]
    index = {name: i for i, name in enumerate(order)}
    return np.array([index[folder_name(FASHION_MNIST_CLASSES[label])] for label in labels])


def folder_name(class_name):
    """A class's folder name ("T-shirt/top" has a slash)."""
    return class_name.replace("/", "-")


def train_or_load(name, options, cache, quick):
    """The zoo model's .keras path, trained into ``cache/name`` unless it is there already."""
    from vit_keras.training.train import train

    folder = os.path.join(cache, name + ("_quick" if quick else ""))
    path = os.path.join(folder, "model.keras")
    if not os.path.exists(path):
        options, data = dict(options), "fashion_mnist"
        if quick:  # the 4x model keeps its ratio to the quick one
            options.update(epochs=4 if name == "trained_4x" else 1, limit=4000)
        if name in TINTED:
            root, mean, std = tinted_folder(cache, options.get("limit"))
            data = "folder:" + root
            options["model_overrides"] = {**options.get("model_overrides", {}), "pixel_mean": mean, "pixel_std": std}
        train(data, folder, verbose=0, tensorboard=False, **options)
    return path


def ai_edge_quantize(float_path, recipe_name, images, out):
    """``float_path`` quantized by ai-edge-quantizer's ``recipe_name``, calibrated on ``images`` (uint8)."""
    from ai_edge_quantizer import quantizer, recipe

    from vit_keras.convert.runtime import model_input, prepare

    dtype, _, norm = model_input(float_path)
    with open(float_path, "rb") as f:
        q = quantizer.Quantizer(with_signature(f.read()), getattr(recipe, recipe_name)())
    calibration = None
    if q.need_calibration:
        calibration = q.calibrate({"serving_default": [{"image": x[None]} for x in prepare(images, dtype, norm)]})
    data = q.quantize(calibration, enable_progress_report=False).quantized_model
    with open(out, "wb") as f:  # it keeps the float file's metadata (normalization, labels)
        f.write(bytes(data))
    return out


def with_signature(model_bytes):
    """The flatbuffer with a "serving_default" signature (image -> scores), which ai-edge-quantizer needs; the
    converter does not always write one for our concrete function."""
    from ai_edge_litert import schema_py_generated as schema

    from vit_keras.convert.metadata import pack_model, unpack_model

    model = unpack_model(model_bytes)
    graph = model.subgraphs[0]

    def tensor_map(name, index):
        entry = schema.TensorMapT()
        entry.name, entry.tensorIndex = name, int(index)
        return entry

    signature = schema.SignatureDefT()
    signature.signatureKey, signature.subgraphIndex = "serving_default", 0
    signature.inputs, signature.outputs = [tensor_map("image", graph.inputs[0])], [tensor_map("scores", graph.outputs[0])]
    model.signatureDefs = [signature]
    return bytearray(pack_model(model))


def measure(path, reference, labels, images, runs):
    from vit_keras.constants import RUNTIMES
    from vit_keras.convert.runtime import latency_ms, tflite_scores

    scores = tflite_scores(path, images)
    row = {"agreement": float(np.mean(scores.argmax(-1) == reference.argmax(-1))),
           "accuracy": float(np.mean(scores.argmax(-1) == labels)), "bytes": os.path.getsize(path)}
    for runtime in RUNTIMES:
        for threads in (1, 2):
            row[f"{runtime}_{threads}t"] = latency_ms(path, runtime, threads, runs=runs)
    return row


def zoo_rows(name, keras_path, calibration, test, test_labels, folder, runs):
    """{variant: measured row} for one zoo model."""
    from vit_keras.convert.export import export_tflite
    from vit_keras.convert.tflite import load_vit
    from vit_keras.convert.graph import keras_scores
    from vit_keras.data.pipeline import fit_images

    model = load_vit(keras_path)
    size, channels = model.vit_config["image_size"], model.vit_config["channels"]
    everything, test = fit_images(calibration, size, channels), fit_images(test, size, channels)
    calibration = everything[:CALIBRATION]
    reference = keras_scores(model, test)
    rows = {"keras": {"accuracy": float(np.mean(reference.argmax(-1) == test_labels))}}
    files = {"float32": dict(quantize="float32"), "ours int8": dict(quantize="int8", calibration=calibration),
             "ours int8 static": dict(quantize="int8", calibration=calibration, int8_activations="static"),
             f"ours int8 sweep {TARGET}": dict(quantize="int8", calibration=everything, min_agreement=TARGET,
                                               calibration_size=len(everything), int8_activations="static")}
    for variant, settings in files.items():
        path = os.path.join(folder, f"{name}_{variant.replace(' ', '_')}.tflite")
        summary = export_tflite(model, path, labels=[str(i) for i in range(model.vit_config["num_classes"])],
                                **settings)
        rows[variant] = measure(path, reference, test_labels, test, runs)
        if "sweep" in summary:
            rows[variant]["kept"] = kept_in_float(summary["sweep"])
    rows["ours int8 static, no smoothing"] = no_smoothing_row(model, calibration, test, reference, folder)
    try:
        import ai_edge_quantizer  # noqa: F401
    except ImportError:
        return rows
    for recipe_name in AEQ_RECIPES:
        out = os.path.join(folder, f"{name}_aeq_{recipe_name}.tflite")
        rows[f"aeq {recipe_name}"] = measure(ai_edge_quantize(os.path.join(folder, f"{name}_float32.tflite"),
                                                              recipe_name, calibration, out),
                                             reference, test_labels, test, runs)
    return rows


def kept_in_float(sweep):
    """What the sweep's chosen file keeps in float besides the default int8 file's float ops."""
    from vit_keras.convert.int8 import INT8_FLOAT_OPS

    chosen = next(row for row in sweep if row.get("chosen"))
    if not chosen["float_ops"]:
        return "nothing (full int8)"
    extra = [op for op in chosen["float_ops"] if op not in INT8_FLOAT_OPS]
    missing = [op for op in INT8_FLOAT_OPS if op not in chosen["float_ops"]]
    return ", ".join(extra + [f"not {op}" for op in missing]) or "the default's"


def no_smoothing_row(model, calibration, test, reference, folder):
    """Agreement of our default int8 graph without the LayerNorm smoothing (the technique's measured effect)."""
    from vit_keras.convert.tflite import convert_graph
    from vit_keras.convert.int8 import default_float_nodes, quantize_int8
    from vit_keras.convert.graph import norm_count
    from vit_keras.convert.runtime import tflite_scores

    calibrated = convert_graph(model, "int8", calibration)
    path = os.path.join(folder, "no_smoothing.tflite")
    with open(path, "wb") as f:
        f.write(quantize_int8(calibrated, num_norms=norm_count(model),
                              float_nodes=default_float_nodes(model, calibrated)))
    return {"agreement": float(np.mean(tflite_scores(path, test).argmax(-1) == reference.argmax(-1)))}


def format_rows(name, rows):
    base = rows["float32"]
    keras_accuracy = rows["keras"]["accuracy"]
    lines = []
    for variant, row in rows.items():
        if variant in ("keras", "float32"):
            continue
        label = f"{variant} (kept: {row['kept']})" if "kept" in row else variant
        cells = [name, label, f"{100 * row['agreement']:.2f}%"]
        if "accuracy" in row:
            cells += [f"{100 * (keras_accuracy - row['accuracy']):+.2f}", f"{row['bytes'] / base['bytes']:.2f}"]
            cells += [f"{row[key] / base[key]:.2f}" for key in base if key.endswith(("_1t", "_2t"))]
        else:
            cells += ["-"] * 6
        lines.append("| " + " | ".join(cells) + " |")
    return lines


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="1 epoch on 4,000 images a model, 1,000 test images")
    parser.add_argument("--cache", default=None, help="folder of trained zoo models (default: a temporary one)")
    parser.add_argument("--models", default=",".join(ZOO), help="comma-separated zoo names")
    parser.add_argument("--test-images", type=int, default=None, help="held-out test images (default 10,000)")
    parser.add_argument("--runs", type=int, default=None, help="latency runs a measurement")
    args = parser.parse_args(argv)
    from vit_keras.data.datasets import load_arrays

    names = [n for n in args.models.split(",") if n]
    unknown = sorted(set(names) - set(ZOO))
    if unknown:
        parser.error(f"unknown --models {', '.join(unknown)}; valid: {', '.join(ZOO)}")
    n_test = args.test_images or (1000 if args.quick else 10000)
    runs = args.runs or (20 if args.quick else 100)
    train_images = load_arrays("fashion_mnist", "train")[0]
    from vit_keras.convert.sensitivity import held_out_count

    # The end of train (--quick's trainings never saw it): int8 calibrates on the first CALIBRATION; the sweep
    # calibrates on those too and measures on the rest.
    calibration = train_images[-CALIBRATION - held_out_count(TARGET):]
    test, test_labels = load_arrays("fashion_mnist", "test", limit=n_test)[:2]
    header = ["model", "file", "int8 agreement", "accuracy lost (points)", "size ratio", "Interpreter 1T",
              "Interpreter 2T", "CompiledModel 1T", "CompiledModel 2T"]
    print(f"{n_test:,} Fashion-MNIST test images; latency ratios to our float32 file, batch 1.\n")
    print("| " + " | ".join(header) + " |\n" + "|---" * len(header) + "|")
    with tempfile.TemporaryDirectory() as scratch:
        cache = args.cache or scratch
        for name in names:
            path = train_or_load(name, ZOO[name], cache, args.quick)
            if name in TINTED:  # the same images in the same tints as its folders, whose classes are sorted by name
                rows = zoo_rows(name, path, tinted(train_images, seed=1)[-len(calibration):], tinted(test, seed=2),
                                folder_labels(path, test_labels), scratch, runs)
            else:
                rows = zoo_rows(name, path, calibration, test, test_labels, scratch, runs)
            print("\n".join(format_rows(name, rows)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
