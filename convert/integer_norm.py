"""LayerNorm's statistics in a form that holds in 16-bit integer arithmetic (the full-integer ``npu`` target).

Two TFLite int16 kernels lose a ViT's LayerNorm, both measured on the real ImageNet ViT-Ti/16 (docs/export.md):

- The elementwise square of the centred tokens: its one int16 scale is set by the few "massive activations"
  (one residual channel near 590 in blocks 7-10), so an ordinary token's squares round to zero. The sum of squares
  is taken instead as a batched dot product of each token with itself: BATCH_MATMUL accumulates in 64-bit
  integers and rounds only the sum.
- RSQRT of an int16 tensor is exact to 0.1% where the input's integer level is above ~1000, and off by up to 70%
  below ~250: a token whose variance is far below the layer's largest (which the massive tokens set) gets a wrong
  scale. ``piecewise_rsqrt`` splits the range so that every RSQRT sees a narrow one.
"""

import math

import tensorflow as tf

RSQRT_SPAN = 32.0  # the input range over which one int16 RSQRT stays exact: from its largest value down to 1/32 of it
RSQRT_PIECES = 3  # 32^3 = 32768: the whole int16 range of the variance


def sum_of_squares(x):
    """sum_c x_c^2 over the last axis of (B, T, D) ``x``, as (B, T, 1): one (1, D) x (D, 1) product per token."""
    tokens, width = x.shape[1], x.shape[2]
    rows, columns = tf.reshape(x, (-1, 1, width)), tf.reshape(x, (-1, width, 1))
    return tf.reshape(tf.matmul(rows, columns), (-1, tokens, 1))


def piecewise_rsqrt(variance, largest, pieces=RSQRT_PIECES, span=RSQRT_SPAN):
    """1 / sqrt(variance) as the product of RSQRTs of ``variance`` clipped to consecutive ranges.

    With thresholds t_1 > t_2 > ... (each ``span`` below the last, from ``largest``), rsqrt(v) equals
    prod_i rsqrt(clip(v, t_i, t_{i-1})) * prod_i sqrt(t_i): every clipped factor but one is a constant
    rsqrt(t_i) that the last product cancels, and each RSQRT's calibrated range is one ``span`` wide."""
    thresholds = [largest / span ** (i + 1) for i in range(pieces - 1)]
    bounds = [None, *thresholds, None]
    result = None
    for upper, lower in zip(bounds[:-1], bounds[1:]):
        clipped = variance if lower is None else tf.maximum(variance, lower)
        clipped = clipped if upper is None else tf.minimum(clipped, upper)
        factor = tf.math.rsqrt(clipped)
        result = factor if result is None else result * factor
    return result * math.sqrt(math.prod(thresholds))


class VarianceRanges:
    """Each normalization layer's largest variance (plus epsilon) over calibration images, then its piecewise rsqrt.

    Recording (``recording`` True): ``rsqrt`` returns the plain rsqrt and keeps the largest value seen per layer
    path; the eager calibration pass of ``graph.forward``. Then (``recording`` False) ``rsqrt`` is
    ``piecewise_rsqrt`` at that layer's range, as the traced export graph uses it."""

    def __init__(self):
        self.largest = {}
        self.recording = True

    def rsqrt(self, layer, variance):
        if self.recording:
            seen = float(tf.reduce_max(variance))
            self.largest[layer.path] = max(self.largest.get(layer.path, 0.0), seen)
            return tf.math.rsqrt(variance)
        if layer.path not in self.largest:
            raise ValueError(f"no calibrated variance range for the normalization layer {layer.path!r}; "
                             "calibrate the full-integer graph on the model being exported.")
        return piecewise_rsqrt(variance, max(self.largest[layer.path], 1e-12))
