"""The attention rollout as a second output of the export graph: built in the graph, ordered after the scores,
described in the metadata.

The rollout (Abnar & Zuidema, 2020) is what vit_keras.visualize.attention_heatmap computes from the Keras model;
here the converter gets it as builtin ops, so the device draws the map from its own output.
"""

import numpy as np
import tensorflow as tf

from .flatbuffer import read_model
from .node_names import ROLLOUT_ADD



def readout_row(weights, prefix, pooling):
    """The row of one head's attention (B, queries, T) that the prediction reads: the class token's, under
    GAP the mean of the patch tokens' rows, under token_gap the mean of those two. (B, 1, T)."""
    mean = tf.reduce_mean(token_slice(weights, prefix), axis=1, keepdims=True) if pooling != "token" else None
    if pooling == "gap":
        return mean
    first = weights if weights.shape[1] == 1 else token_slice(weights, 0, 1)
    return first if mean is None else (first + mean) * 0.5


def rollout_graph(model, maps, token_weights=None):
    """The attention rollout (Abnar & Zuidema, 2020) of ``maps`` (``forward``'s attention_maps), as
    vit_keras.visualize.attention_heatmap computes it, over the patch grid: (B, grid_h, grid_w).

    Only the row the prediction reads is carried, from the last block down: row <- row (A + I) / 2, with A the
    heads' mean (its rows sum to 1, so (A + I) / 2 is the renormalized matrix): one vector-matrix
    BATCH_MATMUL a head and block. Under sequence pooling the first row is its ``token_weights`` (B, 1, N) over
    the patch tokens. Its ADDs are named, so int8 can keep them in float (``rollout_output_names`` finds the
    last op, which the converter renames after the output)."""
    encoder = model.patch_encoder
    pooling = model.pooling_layer.pooling
    prefix = encoder.prefix_tokens
    tokens = maps[0][0].shape[-1]
    row = None
    if pooling == "sequence":  # the readout row over all T tokens: the weights, zero at a class token
        row = token_weights
        if prefix:
            row = tf.matmul(row, tf.constant(np.eye(tokens, dtype="float32")[prefix:]))
    start = np.zeros((1, 1, tokens), "float32")  # the identity's part of the first row
    share = 0.5 if pooling == "token_gap" else 1.0  # token_gap reads both rows, each at half
    if pooling in ("gap", "token_gap"):
        start[..., prefix:] = share / (tokens - prefix)
    if pooling != "gap":
        start[..., 0] += share
    for heads in reversed(maps):
        parts = [readout_row(w, prefix, pooling) for w in heads] if row is None else [tf.matmul(row, w) for w in heads]
        total = parts[0]
        for part in parts[1:]:
            total = tf.add(total, part, name=ROLLOUT_ADD)
        identity = tf.constant(0.5 * start) if row is None else row * 0.5
        row = tf.add(total * (0.5 / len(heads)), identity, name=ROLLOUT_ADD)
    batch = row.shape[0]  # the patches' columns (a SLICE at a static batch, as token_slice does for rows)
    patches = row[:, :, prefix:] if batch is None else tf.slice(row, [0, 0, prefix], [batch, 1, tokens - prefix])
    return tf.reshape(patches, (-1, *encoder.grid_size))


ATTENTION_LABELS = "attention_labels.txt"


def attention_labels(model):
    """One name a patch, row-major ("patch ROW,COL"): MediaPipe's ImageClassifier reads every output as a
    classification head, and a head needs as many labels as values."""
    height, width = model.patch_encoder.grid_size
    return [f"patch {row},{col}" for row in range(height) for col in range(width)]


def attention_metadata(model):
    """The output metadata of ``attention_output``'s rollout map (what apps/classifier.py reads as attention)."""
    height, width = model.patch_encoder.grid_size
    return {"name": "attention",
            "description": f"Attention rollout (Abnar & Zuidema, 2020) over the {height}x{width} patch grid, from the "
                           "token the prediction reads; unnormalized weights, larger means more attended.",
            "content": {"content_properties_type": "FeatureProperties", "content_properties": {}},
            "associated_files": [{"name": ATTENTION_LABELS, "description": "The patches, row-major.",
                                  "type": "TENSOR_AXIS_LABELS"}]}


def rollout_output_names(model_bytes):
    """The tensor names of the converted model's rollout output (every output but the 2-D scores): the names by
    which int8 keeps its last op in float."""
    graph = read_model(model_bytes).Subgraphs(0)
    tensors = [graph.Tensors(int(t)) for t in graph.OutputsAsNumpy()]
    return [t.Name().decode("utf-8") for t in tensors if t.ShapeLength() != 2]


def scores_output_first(model_bytes):
    """The flatbuffer with its (1, classes) scores as the subgraph's first output: the converter orders several
    outputs as it likes, and MediaPipe's ImageClassifier and Android read the first as the classification."""
    data = bytearray(model_bytes)
    graph = read_model(data).Subgraphs(0)
    outputs = graph.OutputsAsNumpy()  # a view into ``data``: swapping its entries edits the file in place
    first = next(i for i, t in enumerate(outputs) if graph.Tensors(int(t)).ShapeLength() == 2)
    outputs[[0, first]] = outputs[[first, 0]]
    return bytes(data)


def token_slice(x, start, count=None):
    """Tokens ``start:start + count`` of (B, T, D) ``x``, in a form XNNPACK takes: a SLICE with static sizes,
    or under a dynamic batch a STRIDED_SLICE that masks the batch axis (XNNPACK rejects a SLICE of size -1)."""
    batch, length, width = x.shape
    count = length - start if count is None else count
    if batch is None:
        return x[:, start:start + count, :]
    return tf.slice(x, [0, start, 0], [batch, count, width])
