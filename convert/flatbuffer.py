"""Reading and editing a .tflite flatbuffer's graph: op names, op codes, tensor types. TensorFlow-free.

The other modules edit files through these (``metadata`` owns packing and the metadata tables).
"""

import functools

import numpy as np

from .metadata import pack_model, unpack_model

FLOAT_TYPES = ("FLOAT32", "FLOAT16")


@functools.lru_cache(maxsize=None)
def builtin_names():
    """{builtin operator code: name}, e.g. 9 -> "FULLY_CONNECTED"."""
    from ai_edge_litert import schema_py_generated as schema

    return {value: name for name, value in vars(schema.BuiltinOperator).items() if not name.startswith("_")}


@functools.lru_cache(maxsize=None)
def type_names():
    """{tensor type code: name}, e.g. 9 -> "INT8"."""
    from ai_edge_litert import schema_py_generated as schema

    return {value: name for name, value in vars(schema.TensorType).items() if not name.startswith("_")}


def builtin_code(code):
    """An operator code's builtin: the larger of its two fields (the deprecated one caps at 127). ``code`` is an
    unpacked OperatorCodeT or the reading API's OperatorCode (``model.OperatorCodes(i)``)."""
    if hasattr(code, "builtinCode"):
        return max(code.builtinCode, code.deprecatedBuiltinCode)
    return max(code.BuiltinCode(), code.DeprecatedBuiltinCode())


def builtin_name(code):
    """An operator code's op type name ("CUSTOM" for a custom op); either kind of code, as ``builtin_code``."""
    return builtin_names().get(builtin_code(code), "CUSTOM")


def op_names(model):
    """The op type name of each of an unpacked model's operator codes ("CUSTOM" for custom ops)."""
    return [builtin_name(code) for code in model.operatorCodes]


def opcode_index(model, builtin, version):
    """The index of ``builtin``'s operator code in an unpacked model (added if it has none), at ``version`` at
    least: an op code's version is the least runtime version that runs every op of that code, so an existing
    code's version is raised, never lowered, and every op of that builtin keeps the one index."""
    from ai_edge_litert import schema_py_generated as schema

    for index, code in enumerate(model.operatorCodes):
        if builtin_code(code) == builtin:
            code.version = max(code.version, version)
            return index
    code = schema.OperatorCodeT()
    code.builtinCode, code.deprecatedBuiltinCode, code.version = builtin, min(builtin, 127), version
    model.operatorCodes.append(code)
    return len(model.operatorCodes) - 1


def stored_after(buffer):
    """Whether a buffer's bytes sit after the flatbuffer, addressed by offset and size (ai-edge-quantizer's files)."""
    return getattr(buffer, "offset", 0) > 1 and getattr(buffer, "size", 0) > 0


def unpack_inline(model_bytes):
    """``unpack_model`` with every buffer's bytes inline: a file may keep them after the flatbuffer, addressed by
    offset and size (ai-edge-quantizer writes its files so), which packing the object tree again would drop."""
    model = unpack_model(model_bytes)
    for buffer in model.buffers:
        if stored_after(buffer):
            buffer.data = np.frombuffer(model_bytes, np.uint8, count=buffer.size, offset=buffer.offset).copy()
            buffer.offset = buffer.size = 0
    return model


def is_constant(model, tensor):
    """Whether a tensor holds weights (a non-empty buffer) rather than values computed as the graph runs. A buffer
    is inline data, or (as ai-edge-quantizer writes them) an offset and size into bytes after the flatbuffer."""
    buffer = model.buffers[tensor.buffer] if tensor.buffer < len(model.buffers) else None
    if buffer is None:
        return False
    return (buffer.data is not None and len(buffer.data) > 0) or stored_after(buffer)


def float_compute_ops(model_bytes):
    """[(op name, first float tensor's name)] of the ops that compute in float: an input or output that is a float
    tensor computed at run time. A DEQUANTIZE of a constant (weights unpacked at load) computes nothing."""
    model = unpack_model(model_bytes)
    graph, names = model.subgraphs[0], op_names(model)
    found = []
    for op in graph.operators:
        name = names[op.opcodeIndex]
        inputs = [graph.tensors[i] for i in op.inputs if i >= 0]
        if name == "DEQUANTIZE" and all(is_constant(model, t) for t in inputs):
            continue
        for tensor in inputs + [graph.tensors[i] for i in op.outputs]:
            if type_names()[tensor.type] in FLOAT_TYPES and not is_constant(model, tensor):
                found.append((name, tensor.name.decode() if isinstance(tensor.name, bytes) else str(tensor.name)))
                break
    return found


def compact(model_bytes):
    """The file without what no runtime reads: each tensor's calibrated min / max (its scale and zero point are
    what kernels use) and, of a name the converter joined from the ops it fused ("mul_5;layernorm_shift;qkv"),
    all but the last."""
    model = unpack_inline(model_bytes)
    for tensor in model.subgraphs[0].tensors:
        if tensor.quantization is not None:
            tensor.quantization.min = tensor.quantization.max = None
        if tensor.name:
            tensor.name = bytes(tensor.name).rsplit(b";", 1)[-1]
    return bytes(pack_model(model, len(model_bytes)))


def raw_pixel_input(model_bytes):
    """An integer graph's float input, which only QUANTIZE ops read, taken as uint8 raw pixels (scale 1, zero
    point 0): each QUANTIZE then requantizes uint8 to the graph's own type. The converter's float input was
    calibrated on [0, 255] (``tflite.representative_dataset`` pins it), so the values are the same."""
    from ai_edge_litert import schema_py_generated as schema

    model = unpack_model(model_bytes)
    graph, names = model.subgraphs[0], op_names(model)
    index = graph.inputs[0]
    readers = [names[op.opcodeIndex] for op in graph.operators if index in list(op.inputs)]
    if set(readers) != {"QUANTIZE"}:
        raise ValueError(f"the integer graph's input is read by {sorted(set(readers))}, not by QUANTIZE alone; it "
                         "cannot take uint8 pixels.")
    quantization = schema.QuantizationParametersT()
    quantization.scale, quantization.zeroPoint = np.array([1.0], np.float32), np.array([0], np.int64)
    graph.tensors[index].type, graph.tensors[index].quantization = schema.TensorType.UINT8, quantization
    return bytes(pack_model(model, len(model_bytes)))
