"""Per-channel smoothing of what int8 rounds before each dense layer of a block, moved into that layer's weights.

    from vit_keras.convert.smoothing import smoothing_scales
    scales = smoothing_scales(model, images)        # {layer path: per-channel factor s}
    graph.concrete_function(model, ..., norm_scales=scales)

SmoothQuant (Xiao et al., 2023), as RepQ-ViT (Li et al., 2023) does for LayerNorm: pretrained ViTs carry a few
input channels far larger than the rest, and one int8 scale (a tensor's, or a token's at run time) spread over
them leaves the others a few levels. Dividing channel j by s_j and multiplying row j of the next kernel by s_j is
exact in float and moves that range into the weights, which int8 scales per output channel. Three inputs a block:
- after norm1 and norm2, gamma and beta absorb the division (``graph.layer_norm``), so it costs nothing at run
  time;
- after the GELU (fc2's input), a per-channel MUL in float does it (``graph.transformer_block``).
s_j = max|x_j|^alpha / max|W_j|^(1 - alpha) over the calibration images, scaled to a geometric mean of 1, alpha
searched a layer at a time: the one whose rounded layer's output is closest to the float one (``layer_error``).
"""

import numpy as np

from .graph import forward, numpy

SEARCHED_ALPHAS = (0.3, 0.4, 0.5, 0.6, 0.7, 0.8)  # how much of each channel's range moves into the weights


def smoothed_inputs(model):
    """{path of the layer whose output (or, for fc2, input) is smoothed: the kernel that absorbs it}."""
    kernels = {}
    for block in model.blocks:
        kernels[block.norm1.path] = numpy(block.attn.qkv.kernel)
        kernels[block.norm2.path] = numpy(block.fc1.kernel)
        kernels[block.fc2.path] = numpy(block.fc2.kernel)
    return kernels


def fake_quantize_rows(x, levels=255):
    """``x`` (rows, channels) rounded as XNNPACK's dynamic int8 does: each row its own asymmetric scale."""
    low, high = np.minimum(x.min(1, keepdims=True), 0), np.maximum(x.max(1, keepdims=True), 0)
    scale = np.maximum(high - low, 1e-12) / levels
    zero = np.round(-low / scale)
    return (np.clip(np.round(x / scale) + zero, 0, levels) - zero) * scale


def fake_quantize_columns(w, levels=127):
    """A (in, out) kernel rounded as int8 weights are: symmetric, one scale an output channel."""
    scale = np.maximum(np.abs(w).max(0, keepdims=True), 1e-12) / levels
    return np.round(w / scale) * scale


def layer_error(x, w, s):
    """Relative squared error of the dense layer's output with its input divided by ``s`` and rounded a row at a
    time, and its kernel's rows multiplied by ``s`` and rounded per output channel."""
    exact = x @ w
    rounded = fake_quantize_rows(x / s) @ fake_quantize_columns(w * s[:, None])
    return float(np.sum((rounded - exact) ** 2) / max(np.sum(exact ** 2), 1e-30))


def channel_samples(model, images, rows_per_image=8, batch_size=50, seed=0):
    """{layer path: (each channel's largest magnitude, sample rows)} of the smoothed inputs over ``images``
    (uint8, N, H, W, C). A LayerNorm's beta is left out: it folds into the next layer's bias, so int8 never
    rounds it."""
    import tensorflow as tf

    ranges, samples, rng = {}, {}, np.random.default_rng(seed)

    def observe(layer, y):
        values = (y.numpy() - (numpy(layer.beta) if hasattr(layer, "beta") else 0.0)).reshape(len(y), -1, y.shape[-1])
        ranges[layer.path] = np.maximum(ranges.get(layer.path, 0.0), np.abs(values).max(axis=(0, 1)))
        rows = rng.integers(0, values.shape[1], (len(values), rows_per_image))
        chosen = np.take_along_axis(values, rows[..., None], 1).reshape(-1, y.shape[-1])
        samples.setdefault(layer.path, []).append(chosen)

    rgb = np.repeat(images, 3, axis=-1) if images.shape[-1] == 1 else np.asarray(images)
    for start in range(0, len(rgb), batch_size):
        forward(model, tf.constant(rgb[start:start + batch_size], tf.float32), raw_pixels=True, observe_norm=observe)
    return {path: (ranges[path], np.concatenate(samples[path])) for path in ranges}


def factors(seen, weight, alpha):
    s = np.maximum(seen, 1e-5) ** alpha / np.maximum(weight, 1e-5) ** (1 - alpha)
    return (s / np.exp(np.log(s).mean())).astype("float32")  # geometric mean 1: the overall scale stays


def smoothing_scales(model, images, alpha=None, batch_size=50):
    """{layer path: per-channel factor s} for ``graph.forward``'s ``norm_scales``, from ``images`` (uint8).

    alpha: one migration strength for every layer, or None: each layer's own, the one of SEARCHED_ALPHAS whose
    rounded layer (``layer_error``) is closest to the float one on sample rows of the calibration images."""
    if alpha is not None and not 0 <= alpha <= 1:
        raise ValueError(f"`alpha` must be in [0, 1] (0: no smoothing, 1: all of each range into the weights) or "
                         f"None (searched a layer at a time); got {alpha}.")
    kernels = smoothed_inputs(model)
    scales = {}
    for path, (seen, rows) in channel_samples(model, images, batch_size=batch_size).items():
        weight = np.abs(kernels[path]).max(axis=1)
        candidates = [alpha] if alpha is not None else SEARCHED_ALPHAS
        errors = [layer_error(rows, kernels[path], factors(seen, weight, a)) for a in candidates]
        scales[path] = factors(seen, weight, candidates[int(np.argmin(errors))])
    return scales
