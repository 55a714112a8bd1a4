"""The pieces of the full-integer ``npu`` graph that hold in 16-bit integer arithmetic, and their calibration.

TFLite's 16x8 mode gives each activation tensor one int16 scale. Pretrained ViTs write a few "massive
activations" (the real ImageNet ViT-Ti/16: residual channel 41 near 590 in blocks 7-10, made by a few MLP hidden
units near 200), so every tensor that holds them would leave ordinary tokens a few levels. Each is written so that
no tensor mixes the two (docs/export.md#full-integer-for-npus---target-npu):

- The residual stream keeps its outlier channels scaled down (``IntegerRanges.stream_scale``): the writers'
  columns carry the scale, and ``layer_norm`` computes the true statistics and output from the scaled stream.
- An MLP's outlier hidden units get their own dense columns and, past ``GELU_LINEAR_FROM``, GELU's linear part
  as a separate ReLU (``mlp``): int16 GELU is a 513-entry table over its input's range.
- LayerNorm's sum of squares is a per-token (1, D) x (D, 1) product (BATCH_MATMUL accumulates in 64 bits); its
  variance is read by three RSQRTs of clipped ranges (``piecewise_rsqrt``: int16 RSQRT is off by up to 70% below
  integer level ~250), the lower ones from the variance of clipped values (``fine_sum_of_squares``), which an
  ordinary token's variance fills.

``IntegerRanges`` records every range these need in one eager float pass, then the traced graph applies them.
"""

import math

import numpy as np
import tensorflow as tf

from .node_names import LAYERNORM_EPSILON, MLP_IN, MLP_OUT

RSQRT_SPAN = 32.0  # the input range over which one int16 RSQRT stays exact: from its largest value down to 1/32 of it
RSQRT_PIECES = 3  # 32^3 = 32768: the whole int16 range of the variance
OUTLIER_FACTOR = 8.0  # a channel whose largest |value| is above 8x the median channel's is an outlier
GELU_LINEAR_FROM = 8.0  # GELU(x) = x for x >= 8 and 0 for x <= -8, to float32 precision


def sum_of_squares(x):
    """sum_c x_c^2 over the last axis of (B, T, D) ``x``, as (B, T, 1): one (1, D) x (D, 1) product per token."""
    tokens, width = x.shape[1], x.shape[2]
    rows, columns = tf.reshape(x, (-1, 1, width)), tf.reshape(x, (-1, width, 1))
    return tf.reshape(tf.matmul(rows, columns), (-1, tokens, 1))


def clip_level(largest, width, span=RSQRT_SPAN):
    """A: the centred values' clip for ``fine_sum_of_squares``. A token with any |x_c| > A has a variance of at
    least A^2 / width, the top piece's threshold: below it nothing was clipped, above it the lower pieces
    saturate either way."""
    return math.sqrt(largest / span * width)


def fine_sum_of_squares(parts, largest, width, span=RSQRT_SPAN):
    """sum_c clip(x_c, -A, A)^2 over the channels of the one or two (B, T, .) ``parts`` of a width-``width`` token (A:
    ``clip_level``): the sum of squares for every token whose variance is below the top piece."""
    level = clip_level(largest, width, span)
    sums = [sum_of_squares(tf.clip_by_value(part, -level, level)) for part in parts]
    return sums[0] if len(sums) == 1 else sums[0] + sums[1]  # no ADD_N: it has no int16 kernel


def piecewise_rsqrt(variance, largest, pieces=RSQRT_PIECES, span=RSQRT_SPAN, fine=None):
    """1 / sqrt(variance) as the product of RSQRTs of ``variance`` clipped to consecutive ranges.

    With thresholds t_1 > t_2 > ... (each ``span`` below the last, from ``largest``), rsqrt(v) equals
    prod_i rsqrt(clip(v, t_i, t_{i-1})) * prod_i sqrt(t_i): every clipped factor but one is a constant
    rsqrt(t_i) that the last product cancels, and each RSQRT's calibrated range is one ``span`` wide.
    fine: the same variance wherever it is below t_1 (``fine_sum_of_squares``), read by the lower pieces."""
    thresholds = [largest / span ** (i + 1) for i in range(pieces - 1)]
    bounds = [None, *thresholds, None]
    result = None
    for upper, lower in zip(bounds[:-1], bounds[1:]):
        source = variance if upper is None or fine is None else fine
        clipped = source if lower is None else tf.maximum(source, lower)
        clipped = clipped if upper is None else tf.minimum(clipped, upper)
        factor = tf.math.rsqrt(clipped)
        result = factor if result is None else result * factor
    return result * math.sqrt(math.prod(thresholds))


def outliers(largest):
    """The channels whose largest |value| is above OUTLIER_FACTOR times the median channel's."""
    return np.flatnonzero(largest > OUTLIER_FACTOR * np.median(largest))


class IntegerRanges:
    """The npu graph's calibrated ranges: each normalization's largest variance (plus epsilon), the residual
    stream's largest |value| per channel, each MLP's hidden units' largest |value|.

    Recording (``recording`` True): the graph is the plain float one (``graph.forward`` run eagerly), and
    ``observe`` / ``rsqrt`` keep what they see. Then (``recording`` False) the traced graph applies them."""

    def __init__(self):
        self.largest, self.hidden, self.stream = {}, {}, None
        self.recording = True

    def largest_of(self, layer):
        if layer.path not in self.largest:
            raise ValueError(f"no calibrated variance range for the normalization layer {layer.path!r}; "
                             "calibrate the full-integer graph on the model being exported.")
        return max(self.largest[layer.path], 1e-12)

    def observe_stream(self, z):
        if self.recording:
            seen = np.abs(z.numpy()).max(axis=(0, 1))
            self.stream = seen if self.stream is None else np.maximum(self.stream, seen)

    def observe_hidden(self, layer, a):
        if self.recording:
            seen = np.abs(a.numpy()).max(axis=(0, 1))
            self.hidden[layer.path] = np.maximum(self.hidden.get(layer.path, seen), seen)

    def stream_scale(self):
        """(D,) factors the residual stream is kept at: OUTLIER_FACTOR x the median channel's range over each
        outlier channel's, 1 elsewhere; None while recording or where no channel is an outlier."""
        if self.recording or self.stream is None or not len(outliers(self.stream)):
            return None
        bound = OUTLIER_FACTOR * np.median(self.stream)
        return np.minimum(1.0, bound / np.maximum(self.stream, 1e-12)).astype("float32")

    def hidden_outliers(self, layer):
        return np.array([], int) if self.recording else outliers(self.hidden[layer.path])

    def rsqrt(self, layer, variance, parts=None, width=None):
        """parts, width: the centred token's (B, T, .) pieces and its width, whose clipped variance the lower
        pieces read (``fine_sum_of_squares``)."""
        if self.recording:
            seen = float(tf.reduce_max(variance))
            self.largest[layer.path] = max(self.largest.get(layer.path, 0.0), seen)
            return tf.math.rsqrt(variance)
        largest = self.largest_of(layer)
        fine = None
        if parts is not None:
            fine = fine_sum_of_squares(parts, largest, width) * (1.0 / width) + layer.epsilon
        return piecewise_rsqrt(variance, largest, fine=fine)


def channels(x, indices):
    """x[..., indices] as SLICEs (and a CONCATENATION): not every NPU plugin takes GATHER."""
    pieces = [x[..., int(c):int(c) + 1] for c in indices]
    return pieces[0] if len(pieces) == 1 else tf.concat(pieces, axis=-1)


def layer_norm(layer, x, gamma, beta, ranges):
    """LayerNorm of the residual stream ``x`` (B, T, D) as ``ranges`` keeps it (``IntegerRanges.stream_scale``),
    with ``gamma`` and ``beta`` (numpy): the true statistics, and the true output, with no tensor that holds an
    outlier channel's full values next to ordinary ones."""
    width = x.shape[-1]
    scale = ranges.stream_scale()
    if scale is None:
        centred = x - tf.reduce_mean(x, axis=-1, keepdims=True)
        variance = tf.add(sum_of_squares(centred) * (1.0 / width), layer.epsilon, name=LAYERNORM_EPSILON)
        return centred * ranges.rsqrt(layer, variance, [centred], width) * gamma + beta
    big = np.flatnonzero(scale < 1)
    restore = (1.0 / scale[big]).astype("float32")
    mean = tf.reduce_mean(x, axis=-1, keepdims=True) + tf.reduce_sum(
        channels(x, big) * (restore - 1.0), axis=-1, keepdims=True) * (1.0 / width)
    centred = x - mean * scale  # still at the stream's scale
    ordinary = centred * (scale == 1).astype("float32")
    true_outliers = channels(centred, big) * restore
    variance = (sum_of_squares(ordinary) + sum_of_squares(true_outliers)) * (1.0 / width) + layer.epsilon
    normalized = centred * ranges.rsqrt(layer, variance, [ordinary, true_outliers], width)
    out = normalized * (gamma * (scale == 1))
    for restored, channel in zip(restore, big):  # each outlier channel put back in place at its true value
        piece = channels(normalized, [channel]) * float(restored * gamma[channel])
        out = out + tf.pad(piece, [[0, 0], [0, 0], [channel, width - channel - 1]])
    return out + beta


def dense(x, kernel, bias=None, name=None):
    y = tf.matmul(x, tf.constant(kernel.astype("float32")), name=name)
    return y if bias is None else y + tf.constant(bias.astype("float32"))


def mlp(x, fc1, fc2, approximate, ranges, column_scale=None):
    """The MLP of Eq. 3 on LayerNorm's output ``x``: ``fc1``, ``fc2`` the (layer, kernel, bias) of its dense
    layers; its output columns at the stream's ``column_scale``. Outlier hidden units (``IntegerRanges``) get
    their own fc1 columns, and GELU(a) = GELU(clip(a, +-L)) + ReLU(a - L) (L: GELU_LINEAR_FROM) read by their fc2
    rows twice, so the common GELU's table spans ordinary values."""
    (layer1, kernel1, bias1), (_, kernel2, bias2) = fc1, fc2
    if column_scale is not None:
        kernel2, bias2 = kernel2 * column_scale, bias2 * column_scale
    big = ranges.hidden_outliers(layer1)
    if ranges.recording or not len(big):
        hidden = dense(x, kernel1, bias1, name=MLP_IN)
        ranges.observe_hidden(layer1, hidden)
        return dense(tf.nn.gelu(hidden, approximate=approximate), kernel2, bias2, name=MLP_OUT)
    usual = np.setdiff1d(np.arange(kernel1.shape[1]), big)
    hidden = tf.nn.gelu(dense(x, kernel1[:, usual], bias1[usual], name=MLP_IN), approximate=approximate)
    outlier = dense(x, kernel1[:, big], bias1[big], name=f"{MLP_IN}_outliers")
    bent = tf.nn.gelu(tf.clip_by_value(outlier, -GELU_LINEAR_FROM, GELU_LINEAR_FROM), approximate=approximate)
    linear = tf.nn.relu(outlier - GELU_LINEAR_FROM)
    return (dense(hidden, kernel2[usual], bias2, name=MLP_OUT) + dense(bent, kernel2[big])
            + dense(linear, kernel2[big]))
