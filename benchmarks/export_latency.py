"""LiteRT latency of exported ViTs per quantization mode, both runtimes, with the int8/float32 ratio.

    .venv/bin/python benchmarks/export_latency.py                       # ViT-Ti/16 at 224 + Fashion-MNIST model
    .venv/bin/python benchmarks/export_latency.py --models ti16 --runs 100 --repeats 3

"fmnist" uses --fmnist-model (a trained run's model.keras) when it exists, else a
seeded untrained model of the same shape (the quick recipe's, as scripts/main.sh trains it); "ti16" is a seeded
ViT-Ti/16 (1000 classes)
calibrated on noise: latency does not depend on the weights' values. Run it on a
quiet machine: ratios measured in the same run stay meaningful under load, absolute
figures do not.
"""

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

MODES = ("float32", "float16", "dynamic", "int8")
# Baselines for comparison: "int8_plain" is our graph quantized with every op in int8;
# "int8_ln_int8" keeps only the XNNPACK-less ops in float (LayerNorm statistics in int8);
# "usual_*" convert the Keras model itself the usual way (from its own call graph, full int8);
# "adj_y_*" is the export as the converter leaves it, q.k^T a BATCH_MATMUL with adj_y (convert/transposes.py).
BASELINES = ("int8_plain", "int8_ln_int8", "usual_float32", "usual_int8") + tuple(f"adj_y_{m}" for m in MODES)


def export_baseline(model, path, mode, calibration, labels):
    import tensorflow as tf

    from vit_keras.convert.export import export_tflite
    from vit_keras.convert.tflite import representative_dataset
    from vit_keras.convert.int8 import INT8_XNNPACK_FLOAT_OPS

    if mode.startswith("adj_y_"):
        from unittest import mock

        with mock.patch("vit_keras.convert.export.explicit_transposes", bytes):  # the converter's own form
            return export_tflite(model, path, quantize=mode[len("adj_y_"):], calibration=calibration, labels=labels)
    if mode in ("int8_plain", "int8_ln_int8"):
        float_ops = () if mode == "int8_plain" else INT8_XNNPACK_FLOAT_OPS
        return export_tflite(model, path, quantize="int8", calibration=calibration, labels=labels, float_ops=float_ops)
    height, width = model.vit_config["image_size"]
    spec = tf.TensorSpec((1, height, width, model.vit_config["channels"]), tf.float32)
    function = tf.function(lambda x: model(x, training=False), input_signature=[spec]).get_concrete_function()
    converter = tf.lite.TFLiteConverter.from_concrete_functions([function])
    if mode == "usual_int8":
        converter.optimizations = [tf.lite.Optimize.DEFAULT]
        rgb = representative_dataset(calibration)
        channels = model.vit_config["channels"]
        converter.representative_dataset = lambda: ([x[0][..., :channels]] for x in rgb())
        converter.target_spec.supported_ops = [tf.lite.OpsSet.TFLITE_BUILTINS_INT8]
        converter.inference_input_type = tf.uint8
    with open(path, "wb") as f:
        f.write(converter.convert())


def build(name, fmnist_model):
    import vit_keras

    if name == "fmnist":
        if fmnist_model and os.path.isfile(fmnist_model):
            from vit_keras.convert.tflite import load_vit

            model = load_vit(fmnist_model)
            label_file = os.path.join(os.path.dirname(fmnist_model), "labels.txt")
            labels = open(label_file).read().split("\n") if os.path.isfile(label_file) else None
        else:
            from vit_keras.training.train import build_model_to_train

            model = build_model_to_train(10, 1, (28, 28))  # the quick recipe's ViT, seeded
            labels = None
        labels = [v for v in (labels or []) if v] or [f"class_{i}" for i in range(model.vit_config["num_classes"])]
        calibration = np.random.default_rng(0).integers(0, 256, (128, 28, 28, model.vit_config["channels"]), "uint8")
        try:
            from vit_keras.data.datasets import load_arrays

            calibration = load_arrays("fashion_mnist", "train", limit=300)[0]
        except Exception:  # noqa: BLE001 - noise calibrates latency just as well
            pass
        return model, labels, calibration
    import keras

    keras.utils.set_random_seed(0)
    model = vit_keras.create_model("vit_ti16", image_size=224, num_classes=1000, include_preprocessing=True)
    calibration = np.random.default_rng(0).integers(0, 256, (128, 224, 224, 3), "uint8")
    return model, [f"class_{i}" for i in range(1000)], calibration


def interleaved_latency(paths, cols, runs, rounds, warmup=10):
    """{(mode, runtime, threads): median ms}, timing every model in turn, round after round, so a
    shared CPU's load drifts over all of them alike; ratios come from the same rounds."""
    from vit_keras.convert.runtime import median_invoke_ms, model_input, prepare, runner

    runners = {}
    for mode, path in paths.items():
        dtype, shape, norm = model_input(path)
        batch = prepare(np.random.default_rng(0).integers(0, 256, (1, *shape[1:]), dtype=np.uint8), dtype, norm, shape[-1])
        for runtime, threads in cols:
            run = runner(path, runtime, threads)
            run.set_input(batch)
            median_invoke_ms(run, warmup)
            runners[mode, runtime, threads] = run
    samples = {key: [] for key in runners}
    per_round = max(runs // rounds, 5)
    for _ in range(rounds):
        for key, run in runners.items():
            samples[key].append(median_invoke_ms(run, per_round))
    return samples


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--models", default="ti16,fmnist", help="comma list of ti16, fmnist")
    parser.add_argument("--modes", default=",".join(MODES), help=f"of {MODES + BASELINES}")
    parser.add_argument("--threads", default="1,2")
    parser.add_argument("--runtimes", default="interpreter,compiled")
    parser.add_argument("--runs", type=int, default=100, help="timed runs per figure, split over the rounds")
    parser.add_argument("--rounds", type=int, default=10, help="interleaved rounds (see interleaved_latency)")
    parser.add_argument("--fmnist-model", default="runs/fashion_mnist/model.keras")
    parser.add_argument("--workdir", default=None, help="keep the .tflite files here")
    parser.add_argument("--reuse", action="store_true", help="reuse .tflite files already in --workdir")
    args = parser.parse_args(argv)

    import statistics

    from vit_keras.convert.export import export_tflite
    from vit_keras.convert.runtime import delegation_report

    threads = [int(t) for t in args.threads.split(",")]
    cols = [(r, n) for r in args.runtimes.split(",") for n in threads]
    modes = args.modes.split(",")
    workdir = args.workdir or tempfile.mkdtemp(prefix="vit-export-")
    os.makedirs(workdir, exist_ok=True)
    print("| model | mode | size MB | " + " | ".join(f"{r} {n}T ms" for r, n in cols)
          + " | ÷ own float32 (per-round median) | XNNPACK partitions | fallback ops |")
    print("|" + "---|" * (6 + len(cols)))
    for name in args.models.split(","):
        paths = {mode: os.path.join(workdir, f"{name}_{mode}.tflite") for mode in modes}
        if not (args.reuse and all(os.path.isfile(p) for p in paths.values())):
            model, labels, calibration = build(name, args.fmnist_model)
            for mode, path in paths.items():
                if mode in BASELINES:
                    export_baseline(model, path, mode, calibration, labels)
                else:
                    export_tflite(model, path, quantize=mode, calibration=calibration, labels=labels)
        samples = interleaved_latency(paths, cols, args.runs, args.rounds)
        for mode, path in paths.items():
            ratio = []
            for runtime, n in cols:
                if "float32" in paths:
                    per_round = [a / b for a, b in zip(samples[mode, runtime, n], samples["float32", runtime, n])]
                    ratio.append(f"{statistics.median(per_round):.2f}x ({runtime} {n}T)")
            report = delegation_report(path)
            fallback = ", ".join(f"{op} x{n}" for op, n in report["fallback"].most_common()) or "none"
            print(f"| {name} | {mode} | {os.path.getsize(path) / 1e6:.2f} | "
                  + " | ".join(f"{statistics.median(samples[mode, r, n]):.2f}" for r, n in cols)
                  + f" | {'; '.join(ratio)} | {report['partitions']} | {fallback} |", flush=True)
    print(f"\n(files in {workdir}; batch 1; each figure is the median over {args.rounds} interleaved rounds of "
          f"the median of {max(args.runs // args.rounds, 5)} runs, after warm-up)")


if __name__ == "__main__":
    main()
