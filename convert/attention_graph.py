"""The export graph's multi-head self-attention (Eq. 5 of the paper's appendix), in two layouts of builtin ops.

- Heads batched (the float and int8 CPU files): one qkv FULLY_CONNECTED, a SPLIT into q, k and v, each RESHAPEd
  to (B, T, heads, head_dim) and TRANSPOSEd to heads-first (k straight to (B, heads, head_dim, T), so no
  BATCH_MATMUL needs an adjoint flag), then two 4-D BATCH_MATMULs over all heads at once. About 13 ops a block:
  LiteRT parallelizes and joins every op on its own, so a graph of few ops is what lets a second thread help.
- One head at a time (the int16 integer graph, the calibration pass that watches each head, and files that output
  the attention maps): 3-D tensors, a small FULLY_CONNECTED a head and q/k/v, or with per-head int8 scales one
  qkv FULLY_CONNECTED SPLIT into heads; XNNPACK delegates a SPLIT of at most 4 outputs, hence trees of them.

Both equal the Keras layer in float: 1/sqrt(d_head) (or LSA's learned scale) is folded into the q columns.
"""

import math

import keras
import numpy as np
import tensorflow as tf

from .attention_output import token_slice
from .node_names import ATTENTION_MASK, ATTENTION_OUT, QKV

# LSA's diagonal mask: float16 holds -3e4, not -1e9; an int16 graph needs the logits' range kept narrow, and int16
# SOFTMAX counts anything 10 below the row's largest logit as exp(-10) already.
FLOAT_MASK, INTEGER_MASK = -3e4, -64.0


def numpy(variable):
    """A weight as a numpy constant, read eagerly even while tracing (the graph embeds constants)."""
    with tf.init_scope():
        return np.asarray(keras.ops.convert_to_numpy(variable), dtype="float32")


def dense(layer, x, role, kernel=None, bias=None):
    """``layer`` as one FULLY_CONNECTED, named by its ``role`` (one of DENSE_ROLES: int8 may keep a role in float)."""
    kernel = numpy(layer.kernel) if kernel is None else kernel
    bias = numpy(layer.bias) if bias is None else bias
    # The MatMul carries the role: the converter folds away a zero bias's ADD, and its name with it.
    y = tf.add(tf.matmul(x, tf.constant(kernel), name=role), tf.constant(bias), name=f"{role}_bias")
    return y if layer.activation is keras.activations.linear else layer.activation(y)


def attention(attn, x, query_tokens=None, scales=None, observe=None, row_scale=None, maps=None, mask=FLOAT_MASK,
              out_scale=None, batched=True):
    """Multi-head self-attention equal to MultiHeadSelfAttention in float, as builtin ops (module docstring).

    query_tokens: compute the outputs for the first k queries alone, as the layer does.
    scales: per head (alpha, beta), from ``int8.qkv_scales``: the heads' q/k and v/out ranges equalized for the
      int8 graph's one qkv scale (q.k^T and attn @ v @ out are unchanged).
    observe: called eagerly as observe(attn, head, q, k, v) (the calibration pass of ``int8.qkv_scales``).
    row_scale: the preceding LayerNorm's smoothing factor (``smoothing``), undone on the qkv kernel's rows.
    maps: a list that gets this layer's attention weights appended, one (B, queries, T) tensor a head.
    mask: the logit LSA's diagonal gets (FLOAT_MASK, or INTEGER_MASK in the int16 graph).
    out_scale: (D,) factors on the output's channels (the int16 graph's residual stream scale).
    batched: all heads in 4-D ops; ``observe`` and ``maps`` need one head at a time and get it.
    """
    kernel, bias, out_kernel, out_bias = folded_weights(attn, scales, row_scale, out_scale)
    if batched and observe is None and maps is None:
        y = batched_heads(attn, x, kernel, bias, query_tokens, mask)
    else:
        y = one_head_at_a_time(attn, x, kernel, bias, query_tokens, scales is not None, observe, maps, mask)
    return dense(attn.out, y, ATTENTION_OUT, kernel=out_kernel, bias=out_bias)


def folded_weights(attn, scales, row_scale, out_scale):
    """(qkv kernel, qkv bias, out kernel, out bias) with the logit scale, ``scales``, ``row_scale`` and
    ``out_scale`` (``attention``) folded in."""
    d = attn.qkv.kernel.shape[0]
    head_dim = d // attn.num_heads
    kernel, bias = numpy(attn.qkv.kernel).copy(), numpy(attn.qkv.bias).copy()
    if row_scale is not None:
        kernel *= row_scale[:, None]
    out_kernel, out_bias = numpy(attn.out.kernel).copy(), numpy(attn.out.bias)
    if out_scale is not None:
        out_kernel, out_bias = out_kernel * out_scale, out_bias * out_scale
    logit_scale = float(numpy(attn.logit_scale)) if attn.locality else 1.0 / math.sqrt(head_dim)
    kernel[:, :d] *= logit_scale
    bias[:d] *= logit_scale
    for (q, k, v), (alpha, beta) in zip(head_columns(attn), scales or ()):
        kernel[:, q], bias[q] = kernel[:, q] * alpha, bias[q] * alpha
        kernel[:, k], bias[k] = kernel[:, k] / alpha, bias[k] / alpha
        kernel[:, v], bias[v] = kernel[:, v] * beta, bias[v] * beta
        out_kernel[v.start - 2 * d: v.stop - 2 * d] /= beta
    return kernel, bias, out_kernel, out_bias


def head_columns(attn):
    """[(q, k, v) column slices of the fused qkv kernel] a head."""
    d = attn.qkv.kernel.shape[0]
    head_dim = d // attn.num_heads
    return [[slice(part * d + h * head_dim, part * d + (h + 1) * head_dim) for part in range(3)]
            for h in range(attn.num_heads)]


def project(inputs, kernel, bias, columns):
    """The qkv FULLY_CONNECTED restricted to ``columns``."""
    return tf.add(tf.matmul(inputs, tf.constant(kernel[:, columns]), name=QKV), tf.constant(bias[columns]),
                  name=f"{QKV}_bias")


def masked_softmax(attn, logits, mask):
    """softmax over keys, after LSA's diagonal mask where the layer has one (an ADD static int8 keeps in float)."""
    if attn.locality:
        diagonal = mask * np.eye(logits.shape[-2], logits.shape[-1], dtype="float32")
        logits = tf.add(logits, tf.constant(diagonal), name=ATTENTION_MASK)
    return tf.nn.softmax(logits, axis=-1)


def batched_heads(attn, x, kernel, bias, query_tokens, mask):
    """softmax(q k^T) v for every head in 4-D ops; (B, queries, D) before the out projection."""
    d, tokens = x.shape[-1], x.shape[1]
    heads, head_dim = attn.num_heads, d // attn.num_heads
    if query_tokens:  # the queries' rows alone: q and kv as two FULLY_CONNECTEDs
        q = project(token_slice(x, 0, query_tokens), kernel, bias, slice(0, d))
        k, v = tf.split(project(x, kernel, bias, slice(d, 3 * d)), 2, axis=-1)
    else:
        q, k, v = tf.split(project(x, kernel, bias, slice(0, 3 * d)), 3, axis=-1)
    queries = q.shape[1]
    q = tf.transpose(tf.reshape(q, (-1, queries, heads, head_dim)), (0, 2, 1, 3))  # (B, H, Tq, Dh)
    k = tf.transpose(tf.reshape(k, (-1, tokens, heads, head_dim)), (0, 2, 3, 1))  # (B, H, Dh, T)
    v = tf.transpose(tf.reshape(v, (-1, tokens, heads, head_dim)), (0, 2, 1, 3))  # (B, H, T, Dh)
    y = tf.matmul(masked_softmax(attn, tf.matmul(q, k), mask), v)  # (B, H, Tq, Dh)
    return tf.reshape(tf.transpose(y, (0, 2, 1, 3)), (-1, queries, d))


def one_head_at_a_time(attn, x, kernel, bias, query_tokens, fused, observe, maps, mask):
    """softmax(q k^T) v a head at a time on 3-D tensors; (B, queries, D) before the out projection. fused: one qkv
    FULLY_CONNECTED SPLIT into heads (the int8 graph's, whose heads then share one scale) where the heads split
    into trees of <= 4-output SPLITs, else one a head and q/k/v (fastest in float)."""
    d = x.shape[-1]
    cols = head_columns(attn)
    if fused and not query_tokens and fusable_heads(attn.num_heads):
        order = np.concatenate([np.arange(d * 3)[col] for head in cols for col in head])  # head-major q, k, v
        per_head = [tf.split(y, 3, axis=-1) for y in split_even(project(x, kernel, bias, order), attn.num_heads)]
    else:
        queries = token_slice(x, 0, query_tokens) if query_tokens else x
        per_head = [(project(queries, kernel, bias, q), project(x, kernel, bias, k), project(x, kernel, bias, v))
                    for q, k, v in cols]
    outputs, weights_per_head = [], []
    for h, (q, k, v) in enumerate(per_head):
        if observe is not None:
            observe(attn, h, q, k, v)
        weights = masked_softmax(attn, tf.matmul(q, k, transpose_b=True), mask)
        weights_per_head.append(weights)
        outputs.append(tf.matmul(weights, v))
    if maps is not None:
        maps.append(weights_per_head)
    return concat_even(outputs)


def split_even(y, parts):
    """``parts`` equal slices of the last axis, as a tree of SPLITs of at most 4 outputs each."""
    if parts <= 4:
        return tf.split(y, parts, axis=-1) if parts > 1 else [y]
    factor = next(f for f in (4, 3, 2) if parts % f == 0)
    return [piece for group in tf.split(y, factor, axis=-1) for piece in split_even(group, parts // factor)]


def concat_even(pieces):
    """Concatenate on the last axis as a tree of CONCATENATIONs of at most 4 inputs (XNNPACK's limit)."""
    if len(pieces) <= 4:
        return tf.concat(pieces, axis=-1) if len(pieces) > 1 else pieces[0]
    factor = next((f for f in (4, 3, 2) if len(pieces) % f == 0), 4)
    size = -(-len(pieces) // factor)
    return concat_even([concat_even(pieces[i:i + size]) for i in range(0, len(pieces), size)])


def fusable_heads(heads):
    """Whether ``heads`` slices split into a tree of <= 4-output SPLITs (prime factors 2 and 3)."""
    while heads % 2 == 0 or heads % 3 == 0:
        heads //= 2 if heads % 2 == 0 else 3
    return heads == 1
