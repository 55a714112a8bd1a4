"""Float constants of an int8 file stored in float16, dequantized once when the runtime loads the file.

    from vit_keras.convert.half_tables import store_in_half
    model_bytes = store_in_half(model_bytes, ("embedding",))

int8 keeps the position embedding's ADD in float, so its table is the one float32 weight left in the file
(docs/benchmarks.md#int8-on-models-trained-elsewhere). In float16 it takes half the bytes, as in a float16
file: a DEQUANTIZE op turns it back into float32, and XNNPACK unpacks such a static tensor at load time, so the
graph runs as before.
"""

import numpy as np

from .flatbuffer import opcode_index
from .metadata import pack_model, unpack_model

HALF_DEQUANTIZE_VERSION = 3  # DEQUANTIZE's version for float16 inputs, as the converter writes in float16 files


def store_in_half(model_bytes, op_outputs):
    """``model_bytes`` with each constant float32 input of the ops writing ``op_outputs`` (tensor names) kept in
    float16 behind a DEQUANTIZE. A name that no op writes is an error, so a renamed graph node cannot go unseen."""
    from ai_edge_litert import schema_py_generated as schema

    model = unpack_model(model_bytes)
    graph = model.subgraphs[0]
    names = {tensor.name.decode(): i for i, tensor in enumerate(graph.tensors)}  # the object API keeps bytes
    missing = [name for name in op_outputs if name not in names]
    if missing:
        raise ValueError(f"no tensor named {', '.join(missing)} in the graph; it has no op to store in half.")
    wanted = {names[name] for name in op_outputs}
    operators = []
    for op in graph.operators:
        operators.append(op)
        if not wanted & set(int(t) for t in op.outputs):
            continue
        for index in op.inputs:
            tensor = graph.tensors[index]
            data = model.buffers[tensor.buffer].data if tensor.buffer else None
            if tensor.type != schema.TensorType.FLOAT32 or data is None or len(data) == 0:
                continue
            half = schema.TensorT()
            half.name, half.shape, half.type = tensor.name + b"_half", tensor.shape, schema.TensorType.FLOAT16
            buffer = schema.BufferT()
            buffer.data = np.asarray(data, np.uint8).view(np.float32).astype(np.float16).view(np.uint8)
            model.buffers.append(buffer)
            half.buffer = len(model.buffers) - 1
            graph.tensors.append(half)
            old_buffer, tensor.buffer = tensor.buffer, 0  # the float32 tensor becomes the DEQUANTIZE's output
            if all(t.buffer != old_buffer for t in graph.tensors):  # unless the converter shared the constant
                model.buffers[old_buffer] = schema.BufferT()
            unpack = schema.OperatorT()
            unpack.opcodeIndex = opcode_index(model, schema.BuiltinOperator.DEQUANTIZE, HALF_DEQUANTIZE_VERSION)
            unpack.inputs, unpack.outputs = [len(graph.tensors) - 1], [index]
            operators.insert(len(operators) - 1, unpack)  # just before its op: XNNPACK's partition stays one
    graph.operators = operators
    return pack_model(model, len(model_bytes))

