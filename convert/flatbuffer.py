"""Reading and editing a .tflite flatbuffer's graph: op names and codes, tensor types, constants, new tensors,
buffers and ops. TensorFlow-free.

Every other module of the converter reads and edits files through these, never through the generated schema
(``metadata`` owns packing and the metadata tables). Two APIs: ``read_model`` (the reading API: no copy, for
queries over large files) and ``unpack_model`` / ``pack_model`` (the object tree, to edit).
"""

import functools

import numpy as np

from .metadata import pack_model, unpack_model

FLOAT_TYPES = ("FLOAT32", "FLOAT16")
NUMPY_TYPES = {"FLOAT32": np.float32, "FLOAT16": np.float16, "INT8": np.int8, "UINT8": np.uint8, "INT16": np.int16,
               "INT32": np.int32, "INT64": np.int64}


def schema():
    """ai-edge-litert's generated TFLite schema, imported on first use."""
    from ai_edge_litert import schema_py_generated

    return schema_py_generated


def read_model(model_bytes):
    """The reading API's ``Model`` of a .tflite flatbuffer: a view of the bytes, nothing unpacked."""
    return schema().Model.GetRootAs(model_bytes, 0)


def options_table(op, name):
    """The reading API's builtin options of ``op`` as table ``name`` ("BatchMatMulOptions"), or None."""
    table = op.BuiltinOptions()
    if table is None:
        return None
    options = getattr(schema(), name)()
    options.Init(table.Bytes, table.Pos)
    return options


def type_code(name):
    """A tensor type's code: "INT8" -> 9."""
    return getattr(schema().TensorType, name)


def builtin(name):
    """A builtin operator's code: "FULLY_CONNECTED" -> 9."""
    return getattr(schema().BuiltinOperator, name)


@functools.lru_cache(maxsize=None)
def builtin_names():
    """{builtin operator code: name}, e.g. 9 -> "FULLY_CONNECTED"."""
    return {value: name for name, value in vars(schema().BuiltinOperator).items() if not name.startswith("_")}


@functools.lru_cache(maxsize=None)
def type_names():
    """{tensor type code: name}, e.g. 9 -> "INT8"."""
    return {value: name for name, value in vars(schema().TensorType).items() if not name.startswith("_")}


@functools.lru_cache(maxsize=None)
def activation_names():
    """{fused activation code: name}, e.g. 1 -> "RELU"."""
    return {value: name for name, value in vars(schema().ActivationFunctionType).items() if not name.startswith("_")}


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
    for index, code in enumerate(model.operatorCodes):
        if builtin_code(code) == builtin:
            code.version = max(code.version, version)
            return index
    return add_opcode(model, builtin, version)


def add_opcode(model, builtin, version):
    """A new operator code for ``builtin`` at ``version`` in an unpacked model; its index."""
    code = schema().OperatorCodeT()
    code.builtinCode, code.deprecatedBuiltinCode, code.version = builtin, min(builtin, 127), version
    model.operatorCodes.append(code)
    return len(model.operatorCodes) - 1


def add_buffer(model, data=None):
    """A new buffer holding ``data`` (a NumPy array, its bytes as stored; None: empty) in an unpacked model; its
    index."""
    buffer = schema().BufferT()
    if data is not None:
        buffer.data = np.ascontiguousarray(data).view(np.uint8).ravel()
    model.buffers.append(buffer)
    return len(model.buffers) - 1


def quantization(scale, zero_point=None, axis=0):
    """Quantization parameters: ``scale`` (one a tensor or one a channel along ``axis``), zero points 0 unless
    given."""
    params = schema().QuantizationParametersT()
    params.scale = np.asarray(scale, np.float32).reshape(-1)
    params.zeroPoint = (np.zeros(len(params.scale), np.int64) if zero_point is None
                        else np.asarray(zero_point, np.int64).reshape(-1))
    params.quantizedDimension = axis
    return params


def add_tensor(graph, name, shape, type_name, buffer=0, quantization=None, shape_signature=None):
    """A new tensor in an unpacked subgraph (``type_name`` as "FLOAT32"; ``buffer`` 0: computed at run time); its
    index."""
    tensor = schema().TensorT()
    tensor.name, tensor.shape, tensor.type, tensor.buffer = name, shape, type_code(type_name), buffer
    tensor.quantization, tensor.shapeSignature = quantization, shape_signature
    graph.tensors.append(tensor)
    return len(graph.tensors) - 1


def new_op(opcode_index, inputs, outputs, options=None):
    """An operator (not yet placed in a subgraph's op list) of operator code ``opcode_index``; ``options``: the name
    of its builtin options table ("TransposeOptions"), created empty."""
    op = schema().OperatorT()
    op.opcodeIndex, op.inputs, op.outputs = opcode_index, np.asarray(inputs, np.int32), np.asarray(outputs, np.int32)
    if options is not None:
        op.builtinOptionsType = getattr(schema().BuiltinOptions, options)
        op.builtinOptions = getattr(schema(), options + "T")()
    return op


def constant(model, tensor):
    """A constant tensor's values as an array of its shape and type (None for a tensor computed at run time). A
    buffer kept after the flatbuffer (ai-edge-quantizer's files) is refused: read such a file with
    ``unpack_inline``."""
    buffer = model.buffers[tensor.buffer] if tensor.buffer else None
    if buffer is not None and stored_after(buffer):
        raise ValueError(f"tensor {tensor.name!r} keeps its values after the flatbuffer; unpack the file with "
                         "flatbuffer.unpack_inline to read them.")
    data = buffer.data if buffer is not None else None
    if data is None or not len(data):
        return None
    values = np.asarray(data, np.uint8).view(NUMPY_TYPES[type_names()[tensor.type]])
    return values.reshape(tensor.shape) if tensor.shape is not None else values


def free_buffers(model, indices):
    """Empty each of the buffers ``indices`` that no tensor reads any more (the converter may share a constant's
    buffer between tensors)."""
    used = {tensor.buffer for graph in model.subgraphs for tensor in graph.tensors}
    for index in set(indices) - used:
        model.buffers[index] = schema().BufferT()


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
    model = unpack_model(model_bytes)
    graph, names = model.subgraphs[0], op_names(model)
    index = graph.inputs[0]
    readers = [names[op.opcodeIndex] for op in graph.operators if index in list(op.inputs)]
    if set(readers) != {"QUANTIZE"}:
        raise ValueError(f"the integer graph's input is read by {sorted(set(readers))}, not by QUANTIZE alone; it "
                         "cannot take uint8 pixels.")
    graph.tensors[index].type, graph.tensors[index].quantization = type_code("UINT8"), quantization(1.0)
    return bytes(pack_model(model, len(model_bytes)))
