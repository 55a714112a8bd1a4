"""Keras's own model.quantize + model.export against `vit-keras export`, on the same model: size, LiteRT latency,
top-1 agreement with the float Keras model, accuracy.

    .venv/bin/python benchmarks/keras_quantize.py                      # runs/fashion_mnist/model.keras if trained
    .venv/bin/python benchmarks/keras_quantize.py --model M.keras --images 1000 --runs 50

Rows: vit-keras export in each of its modes (int8 calibrated on 300 training images), then model.export(format=
"litert") of the float model, and for each Keras mode the model.quantize(mode) model itself (its saved .keras,
reloaded in safe mode and run by Keras) and its model.export. Latency: LiteRT's Interpreter at
batch 1, median of --runs after warm-up, every file timed in turn round after round (a shared CPU's load drifts
over all alike). Without a trained model it uses the quick recipe's seeded, untrained model: sizes and latency
hold, agreement and accuracy then mean little.
"""

import argparse
import os
import statistics
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import numpy as np  # noqa: E402

KERAS_MODES = ("int8", "int4", "float8")


def softmax(logits):
    e = np.exp(logits - logits.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


class KerasFile:
    """A Keras-exported .tflite: float input in the model's own channels (raw pixels), logits out."""

    def __init__(self, path, threads):
        from ai_edge_litert.interpreter import Interpreter

        self.interpreter = Interpreter(model_path=path, num_threads=threads)
        self.interpreter.allocate_tensors()
        self.input, self.output = self.interpreter.get_input_details()[0], self.interpreter.get_output_details()[0]

    def set_input(self, image):
        self.interpreter.set_tensor(self.input["index"], np.asarray(image, "float32")[None])

    def invoke(self):
        self.interpreter.invoke()

    def scores(self, images):
        out = []
        for image in images:
            self.set_input(image)
            self.invoke()
            out.append(self.interpreter.get_tensor(self.output["index"])[0].copy())
        return softmax(np.stack(out))


def load(model_path):
    if model_path and os.path.isfile(model_path):
        from vit_keras.models.vision_transformer import load_model

        return load_model(model_path), model_path
    from vit_keras.training.train import build_model_to_train

    return build_model_to_train(10, 1, (28, 28)), "the quick recipe's model, untrained"


def export_files(model_path, workdir, calibration):
    """{row name: (path, "vit-keras" | "keras")}: every file, made from the same float model."""
    import keras

    from vit_keras.constants import QUANTIZATIONS
    from vit_keras.convert.export import export_tflite

    model, _ = load(model_path)
    labels = [f"class_{i}" for i in range(model.vit_config["num_classes"])]
    files = {}
    for mode in QUANTIZATIONS:
        files[f"vit-keras export --quantize {mode}"] = (os.path.join(workdir, f"vit_keras_{mode}.tflite"), "vit-keras")
        export_tflite(model, files[f"vit-keras export --quantize {mode}"][0], quantize=mode, calibration=calibration,
                      labels=labels)
    files["model.export (float)"] = (os.path.join(workdir, "keras_float.tflite"), "keras")
    model.export(files["model.export (float)"][0], format="litert", verbose=False)
    for mode in KERAS_MODES:
        quantized, _ = load(model_path)
        quantized.quantize(mode)
        files[f"model.quantize('{mode}'), the .keras in Keras"] = (os.path.join(workdir, f"{mode}.keras"), "in keras")
        quantized.save(files[f"model.quantize('{mode}'), the .keras in Keras"][0])
        files[f"model.quantize('{mode}') + model.export"] = (os.path.join(workdir, f"keras_{mode}.tflite"), "keras")
        quantized.export(files[f"model.quantize('{mode}') + model.export"][0], format="litert", verbose=False)
        keras.backend.clear_session()
    return files


def runners(files, threads):
    from vit_keras.convert.runtime import model_input, prepare, runner

    made = {}
    for name, (path, maker) in files.items():
        for n in threads if maker != "in keras" else ():  # LiteRT latency of .tflite files only
            if maker == "keras":
                run = KerasFile(path, n)
                run.set_input(np.zeros(run.input["shape"][1:], "float32"))
            else:
                run = runner(path, "interpreter", n)
                dtype, shape, norm = model_input(path)
                run.set_input(prepare(np.zeros((1, *shape[1:]), np.uint8), dtype, norm))
            made[name, n] = run
    return made


def latencies(files, threads, runs, rounds=5):
    """{(row, threads): median ms}, interleaved rounds."""
    from vit_keras.convert.runtime import median_invoke_ms

    made = runners(files, threads)
    for run in made.values():
        median_invoke_ms(run, 5)
    samples = {key: [] for key in made}
    for _ in range(rounds):
        for key, run in made.items():
            samples[key].append(median_invoke_ms(run, max(runs // rounds, 3)))
    return {key: statistics.median(values) for key, values in samples.items()}


def runtime_cells(path):
    """(the count of ops the GPU delegate would refuse or compute wrongly, the oldest TFLite that runs the file)."""
    from vit_keras.convert.gpu_delegate import gpu_report
    from vit_keras.convert.runtime_version import required_runtime

    report, runtime = gpu_report(path), required_runtime(path)
    flagged = sum(report["refused"].values()) + sum(report["wrong"].values())
    return f"{flagged} of {report['ops']}", runtime["version"] or "unknown: " + ", ".join(runtime["unknown"])


def file_scores(path, maker, images):
    from vit_keras.convert.runtime import tflite_scores

    if maker == "in keras":
        import keras

        return softmax(keras.saving.load_model(path, safe_mode=True).predict(images.astype("float32"), verbose=0))
    if maker == "keras":
        return KerasFile(path, 2).scores(images.astype("float32"))
    return tflite_scores(path, images)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", default="runs/fashion_mnist/model.keras")
    parser.add_argument("--images", type=int, default=1000, help="Fashion-MNIST test images to compare on")
    parser.add_argument("--runs", type=int, default=50, help="timed runs per latency figure")
    parser.add_argument("--threads", default="1,2")
    args = parser.parse_args(argv)

    from vit_keras.convert.graph import keras_scores
    from vit_keras.data.datasets import load_arrays
    from vit_keras.data.pipeline import fit_images

    model, described = load(args.model)
    config = model.vit_config
    test_images, labels, _ = load_arrays("fashion_mnist", "test", limit=args.images)
    images = fit_images(test_images, config["image_size"], config["channels"])
    calibration = load_arrays("fashion_mnist", "train", limit=300)[0]
    reference = keras_scores(model, images)
    threads = [int(t) for t in args.threads.split(",")]
    files = export_files(args.model, tempfile.mkdtemp(prefix="keras-quantize-"), calibration)
    times = latencies(files, threads, args.runs)
    print(f"{described}; {len(images)} Fashion-MNIST test images; Keras float accuracy "
          f"{100 * np.mean(reference.argmax(-1) == labels):.2f}%\n")
    print("| file | size MB | " + " | ".join(f"Interpreter {n}T ms" for n in threads)
          + " | top-1 agreement with Keras float | accuracy | max abs score diff | ops the GPU delegate refuses "
          "| oldest TFLite |")
    print("|" + "---|" * (7 + len(threads)))
    for name, (path, maker) in files.items():
        scores = file_scores(path, maker, images)
        print(f"| {name} | {os.path.getsize(path) / 1e6:.3f} | "
              + " | ".join(f"{times[name, n]:.3f}" if (name, n) in times else "-" for n in threads)
              + f" | {100 * np.mean(scores.argmax(-1) == reference.argmax(-1)):.2f}% | "
              f"{100 * np.mean(scores.argmax(-1) == labels):.2f}% | {np.abs(scores - reference).max():.4f} | "
              + (" | ".join(runtime_cells(path)) if maker != "in keras" else "- | -") + " |", flush=True)


if __name__ == "__main__":
    main()
