"""A .tflite file in LiteRT: its runners (Interpreter, CompiledModel), scores, latency, and each op's precision."""

import collections
import os
import statistics
import time

import numpy as np

from vit_keras import framework
from vit_keras.constants import RUNTIMES
from vit_keras.ticker import Ticker

from . import metadata as tflite_metadata
from .flatbuffer import builtin_name, read_model, type_code


def model_input(path):
    """(input dtype, input shape, (mean, std) or None) of an exported classifier."""
    from ai_edge_litert.interpreter import Interpreter

    detail = Interpreter(model_path=os.fspath(path)).get_input_details()[0]
    try:
        norm = tflite_metadata.input_normalization(tflite_metadata.read_model_metadata(path)[0])
    except ValueError:
        norm = None
    return np.dtype(detail["dtype"]), tuple(int(v) for v in detail["shape"]), norm


def prepare(images, dtype, norm, channels=3, quantization=None):
    """uint8 (N, H, W, 1|3) images -> the model's RGB input: raw uint8 pixels, or normalized per the metadata, and
    for an integer input then quantized with its (scale, zero point) (``quantization``, the input detail's)."""
    images = np.asarray(images)
    if images.shape[-1] == 1 and channels == 3:
        images = np.repeat(images, 3, axis=-1)
    scale, zero = quantization or (0.0, 0)
    raw = norm is None or (list(norm[0]) == [0.0] and list(norm[1]) == [1.0])
    if dtype == np.uint8 and raw and (not scale or (scale, zero) == (1.0, 0)):
        return images.astype(np.uint8)
    mean, std = (np.asarray(v, "float32") for v in (norm or ([0.0], [1.0])))
    normalized = (images.astype("float32") - mean) / std
    if not np.issubdtype(dtype, np.integer):
        return normalized.astype(dtype)
    if not scale:
        raise ValueError(f"the model's {np.dtype(dtype).name} input has no quantization scale to take pixels by.")
    info = np.iinfo(dtype)
    return np.clip(np.round(normalized / scale) + zero, info.min, info.max).astype(dtype)


class InterpreterRunner:
    def __init__(self, path, threads=2):
        from ai_edge_litert.interpreter import Interpreter

        self.interpreter = Interpreter(model_path=os.fspath(path), num_threads=threads)
        self.interpreter.allocate_tensors()
        self.input = self.interpreter.get_input_details()[0]
        self.output = self.interpreter.get_output_details()[0]
        self.input_quantization, self.output_quantization = self.input["quantization"], self.output["quantization"]

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
        self.output_shape, self.output_dtype = details.output["shape"], np.dtype(details.output["dtype"])
        self.input_quantization, self.output_quantization = details.input_quantization, details.output_quantization

    def set_input(self, batch):
        self.inputs[0].write(batch)

    def invoke(self):
        self.model.run_by_index(0, self.inputs, self.outputs)

    def get_output(self):
        count = int(np.prod(self.output_shape))
        if self.output_dtype == np.int16:  # ai-edge-litert 2.3.0 reads no int16 (the npu target's scores): bytes
            return self.outputs[0].read(count * 2, np.uint8).view(np.int16).reshape(self.output_shape)
        return self.outputs[0].read(count, self.output_dtype).reshape(self.output_shape)


def runner(path, runtime="interpreter", threads=2):
    if runtime not in RUNTIMES:
        raise ValueError(f"Unknown `runtime`={runtime!r}; valid values are {', '.join(RUNTIMES)}.")
    return (InterpreterRunner if runtime == "interpreter" else CompiledModelRunner)(path, threads)


def latency_ms(path, runtime="interpreter", threads=2, runs=50, warmup=10):
    """Median wall time of one batch-1 invocation, in milliseconds."""
    run = runner(path, runtime, threads)
    dtype, shape, norm = model_input(path)
    rng = np.random.default_rng(0)
    run.set_input(prepare(rng.integers(0, 256, (1, *shape[1:]), dtype=np.uint8), dtype, norm,
                          quantization=run.input_quantization))
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


def tflite_scores(path, images, runtime="interpreter", threads=2):
    """Scores (N, classes) of a batch-1 .tflite classifier on uint8 images; an integer output dequantized."""
    run = runner(path, runtime, threads)
    dtype, _, norm = model_input(path)
    batch = prepare(images, dtype, norm, quantization=run.input_quantization)
    scale, zero = run.output_quantization
    scores, ticker = [], Ticker(f"scoring {os.path.basename(os.fspath(path))}", len(batch))
    for image in batch:
        run.set_input(image[None])
        run.invoke()
        output = np.array(run.get_output()[0], dtype="float32")
        scores.append((output - zero) * scale if scale else output)
        ticker.update(1)
    return np.stack(scores)


def delegation_report(path, threads=2):
    """Per-op profile of the runtime graph: {'partitions': XNNPACK partitions, 'fallback': Counter of
    ops left to reference kernels, 'ops': Counter of all ops}."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_path=os.fspath(path), num_threads=threads)
    interpreter.allocate_tensors()
    details = framework.ops_details(interpreter)
    delegates = [d for d in details if d["op_name"] == "DELEGATE"]
    original = [d for d in details if d["op_name"] != "DELEGATE"]
    producer = {int(t): d for d in original for t in d["outputs"]}
    from_delegate = {int(t) for d in delegates for t in d["outputs"]}
    # Walk back from what the executed plan needs: tensors no delegate produces come from fallback ops.
    needed = framework.output_indices(interpreter) + [int(t) for d in delegates for t in d["inputs"]]
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
    with open(path, "rb") as f:
        model = read_model(f.read())
    quantized = {type_code(name) for name in QUANTIZED_TYPES}
    precision = {"float": collections.Counter(), "integer": collections.Counter()}
    for s in range(model.SubgraphsLength()):
        graph = model.Subgraphs(s)
        for i in range(graph.OperatorsLength()):
            op = graph.Operators(i)
            name = builtin_name(model.OperatorCodes(op.OpcodeIndex()))
            if name in CONVERSION_OPS:
                continue
            tensors = [int(t) for t in (*op.InputsAsNumpy(), *op.OutputsAsNumpy()) if t >= 0]
            integer = any(graph.Tensors(t).Type() in quantized for t in tensors)
            precision["integer" if integer else "float"][name] += 1
    return dict(precision["float"]), dict(precision["integer"])


def preserving_interpreter(model_bytes):
    """An interpreter that keeps every tensor (without XNNPACK: a delegate's inner tensors are not kept)."""
    from ai_edge_litert.interpreter import Interpreter, OpResolverType

    interpreter = Interpreter(model_content=bytes(model_bytes), experimental_preserve_all_tensors=True,
                              experimental_op_resolver_type=OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES)
    interpreter.allocate_tensors()
    return interpreter
