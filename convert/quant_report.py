"""Where an int8 file loses: each quantized tensor's error against the same graph run in float.

    from vit_keras.convert.quant_report import layer_errors, format_layer_errors
    rows, summary = layer_errors("model_int8.tflite", images)   # uint8 (N, H, W, 3)
    print(format_layer_errors(rows, summary, top=20))

The reference is the file's float twin (``float_twin``): the same ops and weights, its weights dequantized and
every activation left in float32, so no name matching against another file is needed and any int8 or 16-bit
file can be read (ours, ai-edge-quantizer's, TFLite's 16x8). For each quantized activation two errors are kept,
relative RMS over the images:
- own: rounding and clipping the twin's float values with this tensor's scale and zero point, alone;
- accumulated: the int8 run's values against the twin's, all earlier rounding included.
The twin's own output against the reference scores shows what the weights' rounding costs by itself.
"""

import os

import numpy as np

from .flatbuffer import add_buffer, constant, op_names, pack_model, type_code, unpack_inline, unpack_model
from .graph import keras_scores
from .runtime import model_input, prepare, preserving_interpreter
from .verify import verify_data

CONVERSION_OPS = ("QUANTIZE", "DEQUANTIZE")


class NotQuantizedError(ValueError):
    """A per-layer report asked of a file with no quantized activations."""


def is_quantized(tensor):
    """Whether a tensor carries a quantization scale (int8, uint8, int16 or int32 values standing for floats)."""
    q = tensor.quantization
    return q is not None and q.scale is not None and len(q.scale) > 0 and tensor.type != type_code("FLOAT32")


def dequantize(values, tensor):
    """A constant's stored integers (``flatbuffer.constant``) as float32, per channel where it has one scale a
    channel."""
    values = values.astype(np.float64)
    q = tensor.quantization
    shape = [1] * values.ndim
    if len(q.scale) > 1:
        shape[q.quantizedDimension] = -1
    scale, zero = np.reshape(q.scale, shape), np.reshape(np.asarray(q.zeroPoint, np.float64), shape)
    return ((values - zero) * scale).astype(np.float32)


def float_twin(model_bytes):
    """(twin bytes, {int8 tensor index: twin tensor index}): ``model_bytes`` with every quantized tensor made
    float32 (constants dequantized) and the conversions between them dropped. A dropped conversion's output
    maps to its input, the value before rounding."""
    model = unpack_inline(model_bytes)
    graph, codes, float32 = model.subgraphs[0], op_names(model), type_code("FLOAT32")
    for tensor in graph.tensors:
        if not is_quantized(tensor):
            continue
        values = constant(model, tensor)
        if values is not None:
            tensor.buffer = add_buffer(model, dequantize(values, tensor))
        tensor.type, tensor.quantization = float32, None
    alias, kept = {}, []
    for op in graph.operators:
        op.inputs = [alias.get(int(i), int(i)) for i in op.inputs]
        source, out = int(op.inputs[0]), int(op.outputs[0])
        if codes[op.opcodeIndex] in CONVERSION_OPS and graph.tensors[source].type == float32:
            alias[out] = source
        else:
            kept.append(op)
    graph.operators = kept
    graph.outputs = [alias.get(int(i), int(i)) for i in graph.outputs]
    return pack_model(model, len(model_bytes)), alias


WEIGHT_OPS = ("FULLY_CONNECTED", "CONV_2D", "DEPTHWISE_CONV_2D", "BATCH_MATMUL")


def quantized_activations(model_bytes):
    """{tensor index: (name, op type, scale, zero point, lowest level, highest level)} of the activations a file
    computes in integers: its ops' quantized outputs (constants and the graph's input left out), and the float
    inputs that an op with int8 weights quantizes at run time, one scale a row (dynamic range; scale None)."""
    model = unpack_model(model_bytes)
    graph, codes = model.subgraphs[0], op_names(model)
    levels = {type_code("INT8"): (-128, 127), type_code("UINT8"): (0, 255), type_code("INT16"): (-32768, 32767)}
    found = {}
    for op in graph.operators:
        code, inputs = codes[op.opcodeIndex], [int(i) for i in op.inputs]
        for index in op.outputs:
            tensor = graph.tensors[int(index)]
            if is_quantized(tensor) and tensor.type in levels:
                found[int(index)] = (tensor.name.decode(), code, float(tensor.quantization.scale[0]),
                                     int(tensor.quantization.zeroPoint[0]), *levels[tensor.type])
        if code in WEIGHT_OPS and len(inputs) > 1 and graph.tensors[inputs[0]].type == type_code("FLOAT32") \
                and is_quantized(graph.tensors[inputs[1]]):
            name = graph.tensors[int(op.outputs[0])].name.decode()
            found.setdefault(inputs[0], (name, f"dynamic:{code}", None, None, -128, 127))
    return found


def describe(model_bytes, found):
    """{tensor index: a readable name}: a conversion's output is named by the op that reads it ("input of ...")."""
    model = unpack_model(model_bytes)
    graph, codes = model.subgraphs[0], op_names(model)
    readers = {}
    for op in graph.operators:
        for index in op.inputs:
            readers.setdefault(int(index), (codes[op.opcodeIndex], graph.tensors[int(op.outputs[0])].name.decode()))
    names = {}
    for index, (name, op, *_) in found.items():
        reader = readers.get(index)
        if op.startswith("dynamic:"):
            names[index] = f"input of {op.split(':')[1]} {name} (per row at run time)"
        elif op in CONVERSION_OPS and reader:
            names[index] = f"input of {reader[0]} {reader[1]}"
        else:
            names[index] = f"{op} {name}"
    return names


class ErrorTotals:
    """Sums over the images for one quantized tensor: signal, own and accumulated squared error, clipped count,
    and each channel's largest magnitude (last axis)."""

    def __init__(self, scale, zero, low, high):
        self.scale, self.zero, self.low, self.high = scale, zero, low, high
        self.power = self.own = self.accumulated = 0.0
        self.clipped = self.count = 0
        self.channel_max = 0.0

    def add(self, twin, quantized):
        twin, quantized = twin.astype(np.float64), quantized.astype(np.float64)
        if self.scale is None:  # dynamic range: each row its own asymmetric int8 scale, the run's values float
            rows = twin.reshape(-1, twin.shape[-1])
            low, high = np.minimum(rows.min(1, keepdims=True), 0), np.maximum(rows.max(1, keepdims=True), 0)
            scale = np.maximum(high - low, 1e-30) / (self.high - self.low)
            zero = np.round(self.low - low / scale)
            rounded = ((np.clip(np.round(rows / scale) + zero, self.low, self.high) - zero) * scale).reshape(twin.shape)
            levels, dequantized = np.zeros(1), quantized
        else:
            levels = np.round(twin / self.scale) + self.zero
            rounded = (np.clip(levels, self.low, self.high) - self.zero) * self.scale
            dequantized = (quantized - self.zero) * self.scale
        self.power += float(np.sum(twin ** 2))
        self.own += float(np.sum((rounded - twin) ** 2))
        self.accumulated += float(np.sum((dequantized - twin) ** 2))
        self.clipped += int(np.sum((levels < self.low) | (levels > self.high)))
        self.count += twin.size
        channels = np.abs(twin).reshape(-1, twin.shape[-1]).max(axis=0) if twin.ndim else np.abs(twin)
        self.channel_max = np.maximum(self.channel_max, channels)

    def row(self, name):
        power = max(self.power, 1e-30)
        channels = np.atleast_1d(self.channel_max)
        return {"tensor": name, "own": (self.own / power) ** 0.5, "accumulated": (self.accumulated / power) ** 0.5,
                "clipped": self.clipped / max(self.count, 1), "scale": self.scale,  # None: per row
                "outlier_ratio": float(channels.max() / max(np.median(channels), 1e-30))}


def feeds(path, images):
    """(the int8 file's input, its float twin's) for uint8 ``images``: the file's own input form (verify.prepare),
    and the float values that input stands for."""
    from ai_edge_litert.interpreter import Interpreter

    dtype, _, norm = model_input(path)
    scale, zero = Interpreter(model_path=str(path)).get_input_details()[0]["quantization"]
    batch = prepare(images, dtype, norm, quantization=(scale, zero))
    if not np.issubdtype(batch.dtype, np.integer):
        return batch, batch
    return batch, (batch.astype(np.float32) - zero) * (scale or 1.0)


def layer_errors(path, images, reference=None):
    """(rows worst own error first, summary) for the int8 file at ``path`` on uint8 ``images``.

    reference: scores (N, classes) the summary's agreements are measured against.
    NotQuantizedError for a file with no quantized activations (a float or a dynamic-range file)."""
    with open(path, "rb") as f:
        model_bytes = f.read()
    found = quantized_activations(model_bytes)
    if not found:
        raise NotQuantizedError(
            f"{os.path.basename(os.fspath(path))} has no int8 (or 16-bit) activations and no int8 weights: it is a "
            "float file (float32 or float16), so there is no per-layer int8 error to report. Give an int8 or "
            "dynamic-range file.")
    twin_bytes, alias = float_twin(model_bytes)
    quantized, twin = preserving_interpreter(model_bytes), preserving_interpreter(twin_bytes)
    totals = {index: ErrorTotals(*found[index][2:]) for index in found}
    scores = {"int8": [], "twin": []}
    for pair in zip(*feeds(path, images)):
        for name, interpreter, image in (("int8", quantized, pair[0]), ("twin", twin, pair[1])):
            interpreter.set_tensor(interpreter.get_input_details()[0]["index"], image[None])
            interpreter.invoke()
            scores[name].append(interpreter.get_tensor(interpreter.get_output_details()[0]["index"])[0])
        for index, total in totals.items():
            total.add(twin.get_tensor(alias.get(index, index)), quantized.get_tensor(index))
    names = describe(model_bytes, found)
    rows = sorted((total.row(names[index]) for index, total in totals.items()), key=lambda r: -r["own"])
    return rows, summarize(scores, reference)


def summarize(scores, reference):
    """Top-1 agreements: int8 against its float twin, and each against ``reference`` where given."""
    top = {name: np.argmax(np.stack(values), -1) for name, values in scores.items()}
    summary = {"images": len(top["int8"]), "int8_vs_twin": float(np.mean(top["int8"] == top["twin"]))}
    if reference is not None:
        expected = np.argmax(reference, -1)
        summary.update(int8_vs_reference=float(np.mean(top["int8"] == expected)),
                       twin_vs_reference=float(np.mean(top["twin"] == expected)))
    return summary


def format_layer_errors(rows, summary, top=None, file="int8 file"):
    """The report as Markdown: what the agreements say, then one row a quantized tensor, worst first."""
    lines = [f"{file}: {len(rows)} quantized activations, {summary['images']} images. Top-1 agreement of the int8 "
             f"run with its float twin (same weights, activations in float): {100 * summary['int8_vs_twin']:.2f}%."]
    if "twin_vs_reference" in summary:
        lines.append(f"Against the reference: int8 {100 * summary['int8_vs_reference']:.2f}%, float twin "
                     f"{100 * summary['twin_vs_reference']:.2f}% (what the weights' rounding costs alone).")
    lines += ["", "| tensor | own error | accumulated error | clipped | scale | largest channel / median |",
              "|---|---|---|---|---|---|"]
    for row in rows[:top]:
        scale = "per row" if row["scale"] is None else format(row["scale"], ".4g")
        lines.append(f"| {row['tensor'][:90]} | {100 * row['own']:.2f}% | {100 * row['accumulated']:.2f}% | "
                     f"{100 * row['clipped']:.3f}% | {scale} | {row['outlier_ratio']:.1f} |")
    if top is not None and len(rows) > top:
        lines.append(f"({len(rows) - top} more, with less own error)")
    return "\n".join(lines)


def layer_report_files(tflite_paths, keras_path, data, split="test", limit=None, top=None, data_dir=None):
    """``verify --per-layer``: for each file, its quantized tensors' errors on ``data`` against its float twin, and
    its top-1 agreement with the Keras model; a file with nothing quantized gets a line saying so."""
    model, images, _, line = verify_data(tflite_paths, keras_path, data, split, limit, data_dir)
    reference = keras_scores(model, images)
    parts = [line.split(";")[0] + "; per-layer int8 error, worst first."]
    for path in tflite_paths:
        name = os.path.basename(os.fspath(path))
        try:
            rows, summary = layer_errors(path, images, reference)
        except NotQuantizedError as error:
            parts.append(f"{name}: {error}")
            continue
        parts.append(format_layer_errors(rows, summary, top=top, file=name))
    return "\n\n".join(parts)
