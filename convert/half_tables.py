"""Float constants of an int8 file stored in float16, dequantized once when the runtime loads the file.

    from vit_keras.convert.half_tables import store_in_half
    model_bytes = store_in_half(model_bytes, ("embedding",))

int8 keeps the position embedding's ADD in float, so its table is the one float32 weight left in the file
(docs/benchmarks.md#int8-on-models-trained-elsewhere). In float16 it takes half the bytes, as in a float16
file: a DEQUANTIZE op turns it back into float32, and XNNPACK unpacks such a static tensor at load time, so the
graph runs as before.
"""

import numpy as np

from .flatbuffer import (add_buffer, add_tensor, builtin, constant, free_buffers, new_op, opcode_index, pack_model,
                         type_code, unpack_model)

HALF_DEQUANTIZE_VERSION = 3  # DEQUANTIZE's version for float16 inputs, as the converter writes in float16 files


def store_in_half(model_bytes, op_outputs):
    """``model_bytes`` with each constant float32 input of the ops writing ``op_outputs`` (tensor names) kept in
    float16 behind a DEQUANTIZE. A name that no op writes is an error, so a renamed graph node cannot go unseen."""
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
            values = constant(model, tensor) if tensor.type == type_code("FLOAT32") else None
            if values is None:
                continue
            half = add_tensor(graph, tensor.name + b"_half", tensor.shape, "FLOAT16",
                              buffer=add_buffer(model, values.astype(np.float16)))
            old_buffer, tensor.buffer = tensor.buffer, 0  # the float32 tensor becomes the DEQUANTIZE's output
            free_buffers(model, [old_buffer])
            unpack = new_op(opcode_index(model, builtin("DEQUANTIZE"), HALF_DEQUANTIZE_VERSION), [half], [index])
            operators.insert(len(operators) - 1, unpack)  # just before its op: XNNPACK's partition stays one
    graph.operators = operators
    return pack_model(model, len(model_bytes))

