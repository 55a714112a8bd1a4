"""Check an exported .tflite against its Keras model: size, LiteRT latency, agreement, accuracy, score error.

Both LiteRT CPU runtimes are timed: the classic ``ai_edge_litert.interpreter.Interpreter``
and the newer ``ai_edge_litert.compiled_model.CompiledModel``. Latency is the median of
``runs`` invocations at batch 1 after ``warmup`` invocations. ``delegation_report``
is the per-op profile: which ops XNNPACK runs and which fall back to the slower
reference kernels, splitting the graph into more partitions. ``gpu_delegate.gpu_refusals`` names the ops the
LiteRT GPU delegate would refuse, checked statically (no GPU runs here).
"""

import collections
import os
import statistics
import time

import numpy as np

from vit_keras.constants import RUNTIMES

from . import metadata as tflite_metadata
from .gpu_delegate import gpu_refusals, litert_gpu_coverage


def model_input(path):
    """(input dtype, input shape, (mean, std) or None) of an exported classifier."""
    from ai_edge_litert.interpreter import Interpreter

    detail = Interpreter(model_path=os.fspath(path)).get_input_details()[0]
    try:
        norm = tflite_metadata.input_normalization(tflite_metadata.read_model_metadata(path)[0])
    except ValueError:
        norm = None
    return np.dtype(detail["dtype"]), tuple(int(v) for v in detail["shape"]), norm


def prepare(images, dtype, norm, channels=3):
    """uint8 (N, H, W, 1|3) images -> the model's RGB input (raw uint8, or float normalized per the metadata)."""
    images = np.asarray(images)
    if images.shape[-1] == 1 and channels == 3:
        images = np.repeat(images, 3, axis=-1)
    if dtype == np.uint8:
        return images.astype(np.uint8)
    mean, std = (np.asarray(v, "float32") for v in (norm or ([0.0], [1.0])))
    return ((images.astype("float32") - mean) / std).astype(dtype)


class InterpreterRunner:
    def __init__(self, path, threads=2):
        from ai_edge_litert.interpreter import Interpreter

        self.interpreter = Interpreter(model_path=os.fspath(path), num_threads=threads)
        self.interpreter.allocate_tensors()
        self.input = self.interpreter.get_input_details()[0]
        self.output = self.interpreter.get_output_details()[0]

    def set_input(self, batch):
        self.interpreter.set_tensor(self.input["index"], batch)

    def invoke(self):
        self.interpreter.invoke()

    def get_output(self):
        return self.interpreter.get_tensor(self.output["index"])


class CompiledModelRunner:
    def __init__(self, path, threads=2):
        from ai_edge_litert.compiled_model import CompiledModel
        from ai_edge_litert.hardware_accelerator import HardwareAccelerator
        from ai_edge_litert.options import CpuOptions, Options

        options = Options(hardware_accelerators=HardwareAccelerator.CPU, cpu_options=CpuOptions(num_threads=threads))
        self.model = CompiledModel.from_file(os.fspath(path), options=options)
        self.inputs = self.model.create_input_buffers(0)
        self.outputs = self.model.create_output_buffers(0)
        details = InterpreterRunner(path, threads=1)  # shapes and dtypes of the signature
        self.output_shape, self.output_dtype = details.output["shape"], details.output["dtype"]

    def set_input(self, batch):
        self.inputs[0].write(batch)

    def invoke(self):
        self.model.run_by_index(0, self.inputs, self.outputs)

    def get_output(self):
        return self.outputs[0].read(int(np.prod(self.output_shape)), self.output_dtype).reshape(self.output_shape)


def runner(path, runtime="interpreter", threads=2):
    if runtime not in RUNTIMES:
        raise ValueError(f"Unknown `runtime`={runtime!r}; valid values are {', '.join(RUNTIMES)}.")
    return (InterpreterRunner if runtime == "interpreter" else CompiledModelRunner)(path, threads)


def latency_ms(path, runtime="interpreter", threads=2, runs=50, warmup=10):
    """Median wall time of one batch-1 invocation, in milliseconds."""
    run = runner(path, runtime, threads)
    dtype, shape, norm = model_input(path)
    rng = np.random.default_rng(0)
    run.set_input(prepare(rng.integers(0, 256, (1, *shape[1:]), dtype=np.uint8), dtype, norm))
    for _ in range(warmup):
        run.invoke()
    return median_invoke_ms(run, runs)


def median_invoke_ms(run, runs):
    """Median wall time of ``runs`` invocations of a prepared runner, in milliseconds."""
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run.invoke()
        times.append(time.perf_counter() - start)
    return 1000.0 * statistics.median(times)


def predict(path, images, runtime="interpreter", threads=2):
    """Scores (N, classes) of a batch-1 .tflite classifier on uint8 images."""
    run = runner(path, runtime, threads)
    dtype, _, norm = model_input(path)
    batch = prepare(images, dtype, norm)
    scores = []
    for image in batch:
        run.set_input(image[None])
        run.invoke()
        scores.append(np.array(run.get_output()[0], dtype="float32"))
    return np.stack(scores)


def delegation_report(path, threads=2):
    """Per-op profile of the runtime graph: {'partitions': XNNPACK partitions, 'fallback': Counter of
    ops left to reference kernels, 'ops': Counter of all ops}."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=os.fspath(path), num_threads=threads)
    interpreter.allocate_tensors()
    details = interpreter._get_ops_details()
    delegates = [d for d in details if d["op_name"] == "DELEGATE"]
    original = [d for d in details if d["op_name"] != "DELEGATE"]
    producer = {int(t): d for d in original for t in d["outputs"]}
    from_delegate = {int(t) for d in delegates for t in d["outputs"]}
    # Walk back from what the executed plan needs: tensors no delegate produces come from fallback ops.
    needed = [int(t) for t in interpreter._interpreter.OutputIndices()] + [int(t) for d in delegates for t in d["inputs"]]
    fallback, seen = {}, set()
    while needed:
        tensor = needed.pop()
        if tensor in seen or tensor in from_delegate or tensor not in producer:
            continue
        seen.add(tensor)
        node = producer[tensor]
        fallback[node["index"]] = node["op_name"]
        needed.extend(int(t) for t in node["inputs"] if t >= 0)
    return {"partitions": len(delegates), "fallback": collections.Counter(fallback.values()),
            "ops": collections.Counter(d["op_name"] for d in original)}


QUANTIZED_TYPES = ("INT8", "UINT8", "INT16", "INT4")  # an op touching these computes in integers
CONVERSION_OPS = ("QUANTIZE", "DEQUANTIZE")  # between the two: neither


def op_precisions(path):
    """({op: count} computing in float, {op: count} computing in integers) of a .tflite file's graph.

    An op is integer when an input or output tensor is quantized (int8 activations, or a dynamic-range
    op's int8 weights); QUANTIZE and DEQUANTIZE, the conversions between the two, are in neither."""
    from ai_edge_litert import schema_py_generated as schema

    with open(path, "rb") as f:
        model = schema.Model.GetRootAs(f.read(), 0)
    op_names = {value: name for name, value in vars(schema.BuiltinOperator).items() if not name.startswith("_")}
    quantized = {getattr(schema.TensorType, name) for name in QUANTIZED_TYPES}
    precision = {"float": collections.Counter(), "integer": collections.Counter()}
    for s in range(model.SubgraphsLength()):
        graph = model.Subgraphs(s)
        for i in range(graph.OperatorsLength()):
            op = graph.Operators(i)
            code = model.OperatorCodes(op.OpcodeIndex())
            name = op_names.get(max(code.BuiltinCode(), code.DeprecatedBuiltinCode()), "CUSTOM")
            if name in CONVERSION_OPS:
                continue
            tensors = [int(t) for t in (*op.InputsAsNumpy(), *op.OutputsAsNumpy()) if t >= 0]
            integer = any(graph.Tensors(t).Type() in quantized for t in tensors)
            precision["integer" if integer else "float"][name] += 1
    return dict(precision["float"]), dict(precision["integer"])


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
    scores = predict(tflite_path, images)
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
    from vit_keras.data.sources import load_in_memory
    from vit_keras.training.runs import data_split

    from .export import load_vit
    from .graph import keras_scores

    for path in tflite_paths:
        if not os.path.isfile(path):
            raise FileNotFoundError(f"`tflite` file {path!r} does not exist.")
    model = load_vit(keras_path)
    dataset = load_in_memory(data, split, "verify", limit=limit, image_size=model.vit_config["image_size"],
                             data_dir=data_dir, **data_split(keras_path, data))  # a training folder's held-out part
    images = fit_images(dataset.images, model.vit_config["image_size"], model.vit_config["channels"])
    labels = dataset.labels
    reference = keras_scores(model, images)
    rows = [verify(path, reference, labels, images, threads=threads, runs=runs) for path in tflite_paths]
    used = f" ({dataset.source})" if dataset.source else ""
    return (f"{len(images):,} {split} images of {data}{used}; latency at batch 1, median of {runs} runs after "
            "warm-up.\n\n"
            + format_table(rows, threads, split=split) + "\n\n" + gpu_note(rows))
