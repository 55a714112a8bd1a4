"""int8 with run-time activation scales: int8 weights, and each dense layer's input rounded to int8 a token at a time.

    from vit_keras.convert.dynamic_int8 import int8_from_float
    int8_bytes = int8_from_float(float_bytes)   # the float graph of export.convert_graph(model, "int8", images)

Static int8 gives each activation one scale, fixed at calibration. Pretrained ViTs write a few tokens far larger
than the rest into the residual stream ("massive activations"), and such a tensor rounded to one scale leaves the
other tokens a few levels (where it lost: ``vit-keras verify --per-layer``). Here every FULLY_CONNECTED keeps
float inputs and outputs with int8 weights, one scale an output channel; XNNPACK quantizes each input row (token)
to int8 with its own scale when the layer runs and multiplies in int8 (VNNI, AMX), as the dynamic-range mode does.
The graph is the int8 graph (one qkv layer a block, inputs smoothed into the weights: ``smoothing``), the convs
and the position table are stored in float16, and the input is raw uint8 pixels, as the static int8 file's.
"""

import numpy as np

from .flatbuffer import (add_buffer, add_tensor, builtin, constant, free_buffers, new_op, opcode_index, pack_model,
                         quantization, type_code, unpack_model)
from .half_tables import store_in_half
from .int8 import nodes_named, op_outputs
from .node_names import POSITION_ADD
from .weight_rounding import WEIGHT_LEVELS, compensated_levels, layer_input_grams

HYBRID_FC_VERSION = 12  # FULLY_CONNECTED with int8 per-channel weights on float inputs, as the converter writes it
DEQUANTIZE_VERSION = 2  # DEQUANTIZE of a uint8 input
FEW_ROWS = 8  # a dense layer reading at most this many rows computes in float: rounding them would gain no time


def quantize_rows(weights, gram=None):
    """(int8 weights, float32 scale an output row) of a (out, in) FULLY_CONNECTED kernel, symmetric per row.

    gram: the layer's input X^T X over calibration rows; given, each input column's rounding error is spread
    over the columns not yet rounded, as X sees them (GPTQ, Frantar et al. 2023; ``compensated_levels``)."""
    scale = np.maximum(np.abs(weights).max(axis=1), 1e-12) / WEIGHT_LEVELS
    if gram is not None:
        return compensated_levels(weights, scale, gram), scale.astype(np.float32)
    levels = np.clip(np.round(weights / scale[:, None]), -WEIGHT_LEVELS, WEIGHT_LEVELS).astype(np.int8)
    return levels, scale.astype(np.float32)


def int8_dense_weights(model_bytes, grams=None):
    """Every float FULLY_CONNECTED with a constant kernel given int8 per-output-channel weights (``quantize_rows``).
    One that reads more than FEW_ROWS rows multiplies in int8 with its input rounded a row at a time as it runs;
    one that reads fewer (the head, a last block that computes the class token alone) keeps a float input and
    product, its kernel unpacked to float once at load by a DEQUANTIZE: the same bytes, and no time to speak of.
    grams: {op output index: X^T X} for ``quantize_rows``."""
    model = unpack_model(model_bytes)
    graph, float32 = model.subgraphs[0], type_code("FLOAT32")
    hybrid = opcode_index(model, builtin("FULLY_CONNECTED"), HYBRID_FC_VERSION)
    freed, operators = set(), []
    for op in graph.operators:
        kernel = graph.tensors[op.inputs[1]] if op.opcodeIndex == hybrid else None
        weights = constant(model, kernel) if kernel is not None else None
        if weights is None or kernel.type != float32 or graph.tensors[op.inputs[0]].type != float32:
            operators.append(op)
            continue
        levels, scale = quantize_rows(weights, (grams or {}).get(int(op.outputs[0])))
        freed.add(kernel.buffer)
        store_levels(model, kernel, levels, scale)
        if np.prod(np.maximum(graph.tensors[op.inputs[0]].shape[:-1], 1)) > FEW_ROWS:
            op.builtinOptions.asymmetricQuantizeInputs = True
        else:
            operators.append(unpacked_kernel(model, op))
        operators.append(op)
    graph.operators = operators
    free_buffers(model, freed)  # the float kernels
    return pack_model(model, len(model_bytes))


def store_levels(model, kernel, levels, scale):
    """``kernel`` (a TensorT) made int8 with ``levels`` in a new buffer and one scale an output channel."""
    kernel.buffer, kernel.type = add_buffer(model, levels), type_code("INT8")
    kernel.quantization = quantization(scale, axis=0)


def unpacked_kernel(model, op):
    """A DEQUANTIZE of ``op``'s int8 kernel into a new float32 tensor, which ``op`` then reads."""
    graph = model.subgraphs[0]
    kernel = graph.tensors[op.inputs[1]]
    unpacked = add_tensor(graph, kernel.name + b"_float", kernel.shape, "FLOAT32")
    unpack = new_op(opcode_index(model, builtin("DEQUANTIZE"), DEQUANTIZE_VERSION), [op.inputs[1]], [unpacked])
    op.inputs = [op.inputs[0], unpacked, *op.inputs[2:]]
    return unpack


def uint8_input(model_bytes):
    """The graph's float32 raw-pixel input taken as uint8 (scale 1, zero point 0) through a DEQUANTIZE: the same
    input as the static int8 file's, so apps and MediaPipe feed it the same raw pixels."""
    model = unpack_model(model_bytes)
    graph = model.subgraphs[0]
    index = int(graph.inputs[0])
    source = graph.tensors[index]
    pixels = add_tensor(graph, source.name, source.shape, "UINT8", quantization=quantization(1.0),
                        shape_signature=source.shapeSignature)
    source.name = source.name + b"_float"
    graph.operators.insert(0, new_op(opcode_index(model, builtin("DEQUANTIZE"), DEQUANTIZE_VERSION), [pixels], [index]))
    graph.inputs = [pixels] + [int(i) for i in graph.inputs[1:]]
    return pack_model(model, len(model_bytes))


def int8_from_float(float_bytes, calibration=None):
    """The int8 file from the float graph (raw-pixel float input, inputs smoothed): int8 dense weights (rounded
    with their inputs' statistics over ``calibration``, float32 RGB raw pixels, where given), float16 convs and
    position table, uint8 input."""
    grams = None if calibration is None else layer_input_grams(float_bytes, calibration)
    model_bytes = int8_dense_weights(float_bytes, grams)
    halves = [name for name, _ in op_outputs(model_bytes, "CONV_2D")] + nodes_named(model_bytes, "ADD", (POSITION_ADD,))
    return uint8_input(store_in_half(model_bytes, halves))
