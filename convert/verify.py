"""Check an exported .tflite against its Keras model: size, LiteRT latency, agreement, accuracy, score error.

Both LiteRT CPU runtimes are timed: the classic ``ai_edge_litert.interpreter.Interpreter``
and the newer ``ai_edge_litert.compiled_model.CompiledModel``. Latency is the median of
``runs`` invocations at batch 1 after ``warmup`` invocations. ``delegation_report``
is the per-op profile: which ops XNNPACK runs and which fall back to the slower
reference kernels, splitting the graph into more partitions. ``gpu_delegate.gpu_report`` names the ops the
LiteRT GPU delegate would refuse or is known to compute wrongly, checked statically (no GPU runs here);
``npu.npu_report`` whether Qualcomm's and MediaTek's LiteRT NPU plugins would take the file whole, also
statically; ``runtime_version.required_runtime`` the oldest TFLite runtime that runs the file.
"""

import os

import numpy as np

from vit_keras.constants import RUNTIMES
from vit_keras.data.pipeline import fit_images
from vit_keras.data.sources import choose_input, list_split, load_in_memory
from vit_keras.ticker import Ticker
from vit_keras.training.evaluation import label_mapping
from vit_keras.training.runs import data_split

from . import metadata as tflite_metadata
from . import npu
from .gpu_delegate import ISSUE_URLS, gpu_report, litert_gpu_coverage
from .graph import keras_scores
from .runtime import latency_ms, op_precisions, tflite_scores
from .runtime_version import describe as describe_runtime
from .runtime_version import required_runtime
from .tflite import load_vit

CHUNK_IMAGES = 512  # decoded and scored at a time: a split of any size verifies in bounded memory


def check_image_classifier(path):
    """A clear error unless ``path`` is a TFLite model whose first input is an image batch (B, H, W, 1|3)."""
    from ai_edge_litert.interpreter import Interpreter

    tflite_metadata.read_flatbuffer(path)
    try:
        details = Interpreter(model_path=os.fspath(path)).get_input_details()
    except Exception as error:  # LiteRT raises ValueError or RuntimeError for a file it cannot read
        raise ValueError(f"`tflite` file {os.fspath(path)!r} is not a model LiteRT can load: {error}") from None
    shapes = [tuple(int(v) for v in d["shape"]) for d in details]
    if not shapes or len(shapes[0]) != 4 or shapes[0][-1] not in (1, 3):
        raise ValueError(f"`tflite` file {os.fspath(path)!r} has no image input (inputs: {shapes or 'none'}); "
                         "verify takes image classifiers whose first input is (batch, height, width, 1 or 3).")
    return details[0]


def float_ops_cell(row):
    """The table's "ops in float" cell: "all" for a float file, else each float op type and its count."""
    if not row.get("integer_ops"):
        return "all"
    return ", ".join(f"{name} {count}" for name, count in sorted(row["float_ops"].items())) or "none"


def gpu_cell(row):
    """The table's "GPU delegate" cell: "none", or what it would compute wrongly and what it would refuse (each op
    type and its count), with the LiteRT issue that documents a known bug."""
    refused, wrong = row.get("gpu_refused"), row.get("gpu_wrong") or {}
    if refused is None:
        return "-"
    issues = row.get("gpu_issues") or {}
    parts = [f"computes wrongly: {what}, {issues[what]} ({count} ops)" for what, count in sorted(wrong.items())]
    if refused:
        tags = sorted({issues[why] for reasons in (row.get("gpu_reasons") or {}).values() for why in reasons
                       if why in issues})
        parts.append("refuses: " + ", ".join(f"{name} {count}" for name, count in sorted(refused.items()))
                     + "".join(f", {tag}" for tag in tags))
    return "; ".join(parts) or "none"


def npu_cell(row):
    """The table's "NPU" cell: which vendors' LiteRT NPU plugins take the file whole, what each refuses, or that
    the file is not full-integer (``npu.npu_cell``); "-" for a row without an NPU report."""
    report = row.get("npu")
    return "-" if report is None else npu.npu_cell(report)


def gpu_whole(row):
    """True where the GPU delegate's static check passes every op (none refused, none known to compute wrongly)
    and LiteRT's GPU accelerator, where it could start, left no op to the CPU; None where the row has no GPU
    check."""
    if row.get("gpu_refused") is None:
        return None
    return not row["gpu_refused"] and not row.get("gpu_wrong") and row.get("litert_gpu") is not False


def accelerators(row):
    """What can run the file whole: the CPU always (LiteRT's kernels run every builtin op), then "GPU delegate"
    and "NPU (vendor, ...)" where their static checks pass."""
    names = ["CPU"]
    if gpu_whole(row):
        names.append("GPU delegate")
    report = row.get("npu")
    whole = [vendor for vendor, verdict in (report or {}).get("vendors", {}).items()
             if report["full_integer"] and verdict["whole"]]
    if whole:
        names.append(f"NPU ({', '.join(whole)})")
    return names


def accelerator_note(rows):
    """The line under the table on which accelerators run each file whole, and what the NPU column checks."""
    files = "; ".join(f"{row['file']}: {', '.join(accelerators(row))}" for row in rows)
    return (f"Runs whole on: {files}. NPU: each op of the file against the partition rules of the Qualcomm "
            "(QNN HTP) and MediaTek (NeuroPilot) NPU compiler plugins, checked statically; a float file is not "
            "full-integer, which NPUs need (`vit-keras export --target npu` writes one). \"whole\" is necessary, "
            "not sufficient: each op's shape checks and the vendor SDK's own say are not modelled.")


def runtime_cell(row):
    """The table's "runtime" cell: the oldest TFLite version that runs the file, from its op versions."""
    runtime = row.get("runtime")
    if runtime is None:
        return "-"
    return f"TFLite >= {runtime['version']}" if runtime["version"] else "unknown"


def runtime_note(rows):
    """The line under the table on which runtime packages run each file, and which ops set that version."""
    lines = []
    for row in rows:
        runtime = row.get("runtime")
        if runtime:
            why = ", ".join(runtime["unknown"] or runtime["limiting"])
            lines.append(f"{row['file']}: {describe_runtime(runtime)}, set by {why}")
    return "Oldest runtime, from each file's op versions: " + "; ".join(lines) if lines else ""


def gpu_note(rows):
    """The line under the table on LiteRT's own GPU accelerator: its verdict per file where it could start,
    else that it could not, so the column is a static check and nothing more."""
    verdicts = {row["file"]: row.get("litert_gpu") for row in rows}
    cited = sorted({issue for row in rows for issue in (row.get("gpu_issues") or {}).values()})
    bugs = "".join(f"{issue}: {ISSUE_URLS[issue]}. " for issue in cited if issue in ISSUE_URLS)
    if all(v is None for v in verdicts.values()):
        return bugs + ("GPU: a static check of each op against the GPU delegate's rules; CompiledModel's GPU "
                       "accelerator could not start on this machine (no GPU adapter), so nothing ran on a GPU.")
    said = {True: "every op on the GPU", False: "some ops left to the CPU", None: "could not start"}
    return bugs + "CompiledModel's GPU accelerator: " + "; ".join(f"{f}: {said[v]}" for f, v in verdicts.items())


def verify(tflite_path, keras_scores, labels, images, threads=(1, 2), runs=50, runtimes=RUNTIMES, scores=None):
    """One row of the verification table, as a dict; ``scores``: the file's scores of ``images`` where they are
    already known (``images`` then unused)."""
    scores = tflite_scores(tflite_path, images) if scores is None else scores
    float_ops, integer_ops = op_precisions(tflite_path)
    gpu = gpu_report(tflite_path)
    npu_verdict = npu.npu_report(tflite_path)
    runtime = required_runtime(tflite_path)
    row = {
        "file": os.path.basename(os.fspath(tflite_path)),
        "float_ops": float_ops,
        "integer_ops": integer_ops,
        "gpu_refused": gpu["refused"],
        "gpu_reasons": gpu["reasons"],
        "gpu_wrong": gpu["wrong"],
        "gpu_issues": gpu["issues"],
        "npu": npu_verdict,
        "runtime": runtime,
        "litert_gpu": litert_gpu_coverage(tflite_path),
        "size_mb": os.path.getsize(tflite_path) / 1e6,
        "agreement": float(np.mean(scores.argmax(-1) == keras_scores.argmax(-1))),
        # labels None: the data's classes are not the model's, and no accuracy is stated
        "accuracy": None if labels is None else float(np.mean(scores.argmax(-1) == labels)),
        "keras_accuracy": None if labels is None else float(np.mean(keras_scores.argmax(-1) == labels)),
        "max_abs_diff": float(np.abs(scores - keras_scores).max()),
    }
    for runtime in runtimes:
        for n in threads:
            row[f"{runtime}_{n}t_ms"] = latency_ms(tflite_path, runtime, n, runs=runs)
    return row


def accuracy_cell(row):
    """The table's accuracy cell: the file's and Keras's, or "not stated" where the data's classes aren't the
    model's."""
    if row.get("accuracy") is None:
        return "not stated"
    return f"{100 * row['accuracy']:.2f}% ({100 * row['keras_accuracy']:.2f}%)"


def model_labels(keras_path, tflite_paths):
    """The model's class names: labels.txt beside the .keras file, else the first .tflite's metadata; None if
    neither."""
    from .export import read_labels_file

    beside = os.path.join(os.path.dirname(os.path.abspath(keras_path)), "labels.txt")
    if os.path.isfile(beside):
        return read_labels_file(beside)
    try:
        return tflite_metadata.read_labels(tflite_paths[0])
    except (ValueError, OSError):
        return None


def format_table(rows, threads=(1, 2), runtimes=RUNTIMES, split="test"):
    """A Markdown table of ``verify`` rows; ``split`` names the accuracy column's data."""
    short = {"interpreter": "Interpreter", "compiled": "CompiledModel"}
    latency_cols = [(f"{r}_{n}t_ms", f"{short[r]} {n}T ms") for r in runtimes for n in threads]
    header = ["file", "size MB", "runtime"] + [title for _, title in latency_cols] + [
        "top-1 agreement", f"{split} accuracy (Keras)", "max abs diff", "NPU", "GPU delegate", "ops in float"]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for row in rows:
        cells = [row["file"], f"{row['size_mb']:.2f}", runtime_cell(row)] + [
            f"{row[key]:.2f}" if key in row else "-" for key, _ in latency_cols] + [
            f"{100 * row['agreement']:.2f}%", accuracy_cell(row),
            f"{row['max_abs_diff']:.4f}", npu_cell(row), gpu_cell(row), float_ops_cell(row)]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def check_files(tflite_paths):
    for path in tflite_paths:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"`tflite` file {path!r} does not exist.")
        check_image_classifier(path)


def data_line(count, split, data, source, mapping):
    """Which images were verified, and how their classes map to the model's."""
    line = f"{count:,} {split} images of {data}{f' ({source})' if source else ''}; their classes {mapping.how}"
    return line if mapping else line + ": top-1 agreement only, no accuracy"


def verify_data(tflite_paths, keras_path, data, split="test", limit=None, data_dir=None):
    """(Keras model, uint8 images fitted to it, its output index per image or None, a line saying which images and
    how their classes map to the model's), all in memory, for a report that needs every image at once."""
    check_files(tflite_paths)
    model = load_vit(keras_path)
    dataset = load_in_memory(data, split, "verify", limit=limit, image_size=model.vit_config["image_size"],
                             data_dir=data_dir, **data_split(keras_path, data))  # a training folder's held-out part
    images = fit_images(dataset.images, model.vit_config["image_size"], model.vit_config["channels"])
    mapping = label_mapping(dataset.class_names, model_labels(keras_path, tflite_paths),
                            model.vit_config["num_classes"])
    line = data_line(len(images), split, data, dataset.source, mapping)
    return model, images, mapping.labels(dataset.labels) if mapping else None, line


def split_chunks(data, split, image_size, limit=None, data_dir=None, **split_options):
    """(class names, source, image count, an iterator of (uint8 images, labels) of at most ``CHUNK_IMAGES``) of
    ``data``'s split: decoded at once where it fits the memory budget, else read from disk a chunk at a time."""
    listed = list_split(data, split, image_size=image_size, limit=limit, data_dir=data_dir, **split_options)
    if listed is not None and choose_input("auto", [listed])[0] == "stream":
        return listed.class_names, listed.source, len(listed), listed.chunks(CHUNK_IMAGES)
    dataset = (listed.decode_all() if listed is not None else
               load_in_memory(data, split, "verify", limit=limit, image_size=image_size, data_dir=data_dir,
                              **split_options))
    count = len(dataset.labels)
    return dataset.class_names, dataset.source, count, (
        (dataset.images[start:start + CHUNK_IMAGES], dataset.labels[start:start + CHUNK_IMAGES])
        for start in range(0, count, CHUNK_IMAGES))


def verify_files(tflite_paths, keras_path, data, split="test", limit=None, runs=50, threads=(1, 2), data_dir=None):
    """The Markdown verification table of ``tflite_paths`` against the .keras model on ``data`` (tfds' folder:
    ``data_dir``), scored a chunk of images at a time (a folder too large for memory is read as it goes)."""
    check_files(tflite_paths)
    model = load_vit(keras_path)
    vit = model.vit_config
    names, source, count, chunks = split_chunks(data, split, vit["image_size"], limit, data_dir,
                                                **data_split(keras_path, data))  # a training folder's held-out part
    mapping = label_mapping(names, model_labels(keras_path, tflite_paths), vit["num_classes"])
    reference, scores, labels, ticker = [], {path: [] for path in tflite_paths}, [], Ticker("verify", count)
    for images, part_labels in chunks:
        images = fit_images(images, vit["image_size"], vit["channels"])
        reference.append(keras_scores(model, images))
        for path in tflite_paths:
            scores[path].append(tflite_scores(path, images))
        labels.append(part_labels)
        ticker.update(len(images))
    reference, labels = np.concatenate(reference), np.concatenate(labels)
    labels = mapping.labels(labels) if mapping else None
    rows = [verify(path, reference, labels, None, threads=threads, runs=runs, scores=np.concatenate(scores[path]))
            for path in tflite_paths]
    return (f"{data_line(len(reference), split, data, source, mapping)}; latency at batch 1, median of {runs} runs "
            "after warm-up.\n\n" + format_table(rows, threads, split=split) + "\n\n" + accelerator_note(rows)
            + "\n\n" + gpu_note(rows) + "\n\n" + runtime_note(rows))
