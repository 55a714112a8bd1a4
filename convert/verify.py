"""Check an exported .tflite against its Keras model: size, LiteRT latency, agreement, accuracy, score error.

Both LiteRT CPU runtimes are timed: the classic ``ai_edge_litert.interpreter.Interpreter``
and the newer ``ai_edge_litert.compiled_model.CompiledModel``. Latency is the median of
``runs`` invocations at batch 1 after ``warmup`` invocations. ``delegation_report``
is the per-op profile: which ops XNNPACK runs and which fall back to the slower
reference kernels, splitting the graph into more partitions. ``gpu_delegate.gpu_refusals`` names the ops the
LiteRT GPU delegate would refuse, checked statically (no GPU runs here).
"""

import os

import numpy as np

from vit_keras.constants import RUNTIMES
from vit_keras.data.datasets import load_dataset
from vit_keras.training.runs import data_split

from .export import load_vit
from .gpu_delegate import gpu_refusals, litert_gpu_coverage
from .graph import keras_scores
from .runtime import latency_ms, op_precisions, tflite_scores


def float_ops_cell(row):
    """The table's "ops in float" cell: "all" for a float file, else each float op type and its count."""
    if not row.get("integer_ops"):
        return "all"
    return ", ".join(f"{name} {count}" for name, count in sorted(row["float_ops"].items())) or "none"


def gpu_cell(row):
    """The table's "GPU delegate refuses" cell: "none", or each op type it would refuse and its count."""
    refused = row.get("gpu_refused")
    if refused is None:
        return "-"
    return ", ".join(f"{name} {count}" for name, count in sorted(refused.items())) if refused else "none"


def gpu_note(rows):
    """The line under the table on LiteRT's own GPU accelerator: its verdict per file where it could start,
    else that it could not, so the column is a static check and nothing more."""
    verdicts = {row["file"]: row.get("litert_gpu") for row in rows}
    if all(v is None for v in verdicts.values()):
        return ("GPU: a static check of each op against the GPU delegate's rules; CompiledModel's GPU accelerator "
                "could not start on this machine (no GPU adapter), so nothing ran on a GPU.")
    said = {True: "every op on the GPU", False: "some ops left to the CPU", None: "could not start"}
    return "CompiledModel's GPU accelerator: " + "; ".join(f"{f}: {said[v]}" for f, v in verdicts.items())


def verify(tflite_path, keras_scores, labels, images, threads=(1, 2), runs=50, runtimes=RUNTIMES):
    """One row of the verification table, as a dict."""
    scores = tflite_scores(tflite_path, images)
    float_ops, integer_ops = op_precisions(tflite_path)
    row = {
        "file": os.path.basename(os.fspath(tflite_path)),
        "float_ops": float_ops,
        "integer_ops": integer_ops,
        "gpu_refused": gpu_refusals(tflite_path)[0],
        "litert_gpu": litert_gpu_coverage(tflite_path),
        "size_mb": os.path.getsize(tflite_path) / 1e6,
        "agreement": float(np.mean(scores.argmax(-1) == keras_scores.argmax(-1))),
        "accuracy": float(np.mean(scores.argmax(-1) == labels)),
        "keras_accuracy": float(np.mean(keras_scores.argmax(-1) == labels)),
        "max_abs_diff": float(np.abs(scores - keras_scores).max()),
    }
    for runtime in runtimes:
        for n in threads:
            row[f"{runtime}_{n}t_ms"] = latency_ms(tflite_path, runtime, n, runs=runs)
    return row


def format_table(rows, threads=(1, 2), runtimes=RUNTIMES, split="test"):
    """A Markdown table of ``verify`` rows; ``split`` names the accuracy column's data."""
    short = {"interpreter": "Interpreter", "compiled": "CompiledModel"}
    latency_cols = [(f"{r}_{n}t_ms", f"{short[r]} {n}T ms") for r in runtimes for n in threads]
    header = ["file", "size MB"] + [title for _, title in latency_cols] + [
        "top-1 agreement", f"{split} accuracy (Keras)", "max abs diff", "GPU delegate refuses", "ops in float"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row["file"], f"{row['size_mb']:.2f}"] + [
            f"{row[key]:.2f}" if key in row else "-" for key, _ in latency_cols] + [
            f"{100 * row['agreement']:.2f}%", f"{100 * row['accuracy']:.2f}% ({100 * row['keras_accuracy']:.2f}%)",
            f"{row['max_abs_diff']:.4f}", gpu_cell(row), float_ops_cell(row)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def verify_files(tflite_paths, keras_path, data, split="test", limit=None, runs=50, threads=(1, 2), data_dir=None):
    """The Markdown verification table of ``tflite_paths`` against the .keras model on ``data`` (tfds' folder:
    ``data_dir``)."""
    from vit_keras.data.pipeline import fit_images


    for path in tflite_paths:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"`tflite` file {path!r} does not exist.")
    model = load_vit(keras_path)
    dataset = load_dataset(data, split=split, limit=limit, image_size=model.vit_config["image_size"], data_dir=data_dir,
                           **data_split(keras_path, data))  # the training folder's held-out part, else all of it
    images = fit_images(dataset.images, model.vit_config["image_size"], model.vit_config["channels"])
    labels = dataset.labels
    reference = keras_scores(model, images)
    rows = [verify(path, reference, labels, images, threads=threads, runs=runs) for path in tflite_paths]
    used = f" ({dataset.source})" if dataset.source else ""
    return (f"{len(images):,} {split} images of {data}{used}; latency at batch 1, median of {runs} runs after "
            "warm-up.\n\n"
            + format_table(rows, threads, split=split) + "\n\n" + gpu_note(rows))
