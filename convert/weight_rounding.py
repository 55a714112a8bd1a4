"""int8 weights rounded with their inputs' statistics (GPTQ, Frantar et al. 2023), for both int8 files.

    from vit_keras.convert.weight_rounding import layer_input_grams, compensated_levels, recompensate
    grams = layer_input_grams(float_bytes, images)             # X^T X of each dense / patch conv input
    integer_bytes = recompensate(integer_bytes, float_bytes, images)  # the npu file's kernels re-rounded

Rounding each weight to its nearest int8 level ignores that a layer's inputs are correlated; GPTQ rounds one input
column at a time and moves each column's error onto the columns not yet rounded, so that X W changes least. The
levels' scales are kept, so a file's bias and output scales stay valid. A ViT's patch embedding reads raw pixels,
whose neighbours are strongly correlated: it gains the most (docs/export.md).
"""

import numpy as np

from vit_keras.framework import ops_details

from .flatbuffer import op_names, pack_model, unpack_inline, unpack_model
from .runtime import preserving_interpreter

WEIGHT_LEVELS = 127  # symmetric int8 weights: -127..127, zero point 0
ROUNDED_OPS = ("FULLY_CONNECTED", "CONV_2D")


def compensated_levels(weights, scale, gram, damping=0.01):
    """int8 levels of ``weights`` (out, in) rounded one input column at a time, each column's error moved onto the
    later columns through the inverse of ``gram`` (its Cholesky factor), so that X W changes least."""
    w, h = weights.astype(np.float64).copy(), gram.astype(np.float64).copy()
    dead = np.diag(h) == 0  # an input that is always 0: its weights don't matter
    h[dead, dead], w[:, dead] = 1.0, 0.0
    h[np.diag_indices_from(h)] += damping * np.mean(np.diag(h))
    upper = np.linalg.cholesky(np.linalg.inv(h)).T
    levels = np.zeros(w.shape, np.int8)
    for j in range(w.shape[1]):
        levels[:, j] = np.clip(np.round(w[:, j] / scale), -WEIGHT_LEVELS, WEIGHT_LEVELS)
        error = (w[:, j] - levels[:, j] * scale) / upper[j, j]
        w[:, j + 1:] -= np.outer(error, upper[j, j + 1:])
    return levels


def patch_rows(x, kernel_shape, strides):
    """A (B, H, W, C) input as the (B * patches, kh * kw * C) rows a non-overlapping conv (stride = kernel, VALID)
    multiplies, in the (kh, kw, C) order of a TFLite (out, kh, kw, C) kernel; None for any other conv."""
    _, kh, kw, _ = kernel_shape
    batch, height, width, channels = x.shape
    if tuple(strides) != (kh, kw) or height % kh or width % kw:
        return None
    x = x.reshape(batch, height // kh, kh, width // kw, kw, channels).transpose(0, 1, 3, 2, 4, 5)
    return x.reshape(-1, kh * kw * channels)


def layer_input_grams(float_bytes, images, kinds=("FULLY_CONNECTED",)):
    """{output tensor index: X^T X of its input rows} of each op of ``kinds`` in the float graph over ``images``
    (float32 RGB raw pixels, as the float graph takes them). A CONV_2D counts where it is a patch embedding
    (``patch_rows``)."""
    interpreter = preserving_interpreter(float_bytes)
    layers = []
    for op in ops_details(interpreter):
        if op["op_name"] in kinds:
            strides = None
            if op["op_name"] == "CONV_2D":
                strides = conv_strides(float_bytes, int(op["outputs"][0]))
            layers.append((int(op["outputs"][0]), int(op["inputs"][0]), int(op["inputs"][1]), strides))
    feed, grams = interpreter.get_input_details()[0]["index"], {}
    for image in images:
        interpreter.set_tensor(feed, np.asarray(image[None], np.float32))
        interpreter.invoke()
        for out, index, kernel, strides in layers:
            x = interpreter.get_tensor(index).astype(np.float64)
            if strides is not None:
                x = patch_rows(x, interpreter.get_tensor(kernel).shape, strides)
                if x is None:
                    continue
            x = x.reshape(-1, x.shape[-1])
            grams[out] = grams.get(out, 0.0) + x.T @ x
    return grams


def conv_strides(model_bytes, output_index):
    graph = unpack_model(model_bytes).subgraphs[0]
    op = next(op for op in graph.operators if list(op.outputs) == [output_index])
    return op.builtinOptions.strideH, op.builtinOptions.strideW


def recompensate(integer_bytes, float_bytes, images):
    """``integer_bytes`` (a converter-quantized file of the graph ``float_bytes`` holds in float) with every int8
    FULLY_CONNECTED and patch-embedding CONV_2D kernel re-rounded by ``compensated_levels`` at its own per-channel
    scales, over ``images``' layer inputs. The two files' ops are matched in order; a kernel whose shape or scales
    don't match its float twin raises, nothing is guessed."""
    grams = layer_input_grams(float_bytes, images, ROUNDED_OPS)
    floats = preserving_interpreter(float_bytes)
    float_ops = [op for op in ops_details(floats) if op["op_name"] in ROUNDED_OPS]
    model = unpack_inline(integer_bytes)
    graph, names = model.subgraphs[0], op_names(model)
    integer_ops = [op for op in graph.operators if names[op.opcodeIndex] in ROUNDED_OPS]
    if len(integer_ops) != len(float_ops):
        raise ValueError(f"the integer file has {len(integer_ops)} dense/conv ops, its float graph "
                         f"{len(float_ops)}: they are not the same graph.")
    for float_op, op in zip(float_ops, integer_ops):
        gram = grams.get(int(float_op["outputs"][0]))
        if gram is None:
            continue
        weights = floats.get_tensor(int(float_op["inputs"][1])).astype(np.float64)
        kernel = graph.tensors[op.inputs[1]]
        scale = np.asarray(kernel.quantization.scale, np.float64)
        rows = weights.reshape(len(weights), -1)
        expected = np.maximum(np.abs(rows).max(axis=1), 1e-12) / WEIGHT_LEVELS
        if tuple(kernel.shape) != weights.shape or scale.shape != expected.shape or \
                not np.allclose(scale, expected, rtol=1e-3):
            raise ValueError(f"the int8 kernel of {kernel.name!r} does not match its float twin's shape and "
                             "per-channel scales; its levels can't be re-rounded.")
        levels = compensated_levels(rows, scale, gram)
        model.buffers[kernel.buffer].data = levels.reshape(weights.shape).view(np.uint8).ravel()
    return bytes(pack_model(model, len(integer_bytes)))
