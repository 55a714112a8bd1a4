"""Attention rollout (Abnar & Zuidema, 2020) in NumPy, and the heat-map overlay the app draws.

Kept tiny and dependency-free so the app runs without TensorFlow; vit_keras has its own for notebooks.
"""

import math

import numpy as np
from PIL import Image


def rollout(layers, head_fusion="mean"):
    """Per-layer attention (heads, T, T) arrays, first block first -> rolled-out (T, T) attention.

    Each layer's head-averaged attention gets the residual (identity) added and rows renormalized; the
    product over layers tracks how much each output token draws on each input token.
    """
    result = None
    for weights in layers:
        weights = np.asarray(weights, np.float64)
        fused = weights.max(axis=0) if head_fusion == "max" else weights.mean(axis=0)
        fused = fused + np.eye(fused.shape[-1])
        fused /= fused.sum(axis=-1, keepdims=True)
        result = fused if result is None else fused @ result
    return result


def _token_map(rolled, grid=None):
    """(T, T) rollout -> (grid_h, grid_w): the class token's row, or the mean row without a class token.

    ``grid`` (gh, gw) lays out any grid; without it the grid must be square.
    """
    tokens = rolled.shape[-1]
    if grid is not None:
        gh, gw = grid
        if tokens in (gh * gw, gh * gw + 1):
            return rolled.mean(axis=0).reshape(gh, gw) if tokens == gh * gw else rolled[0, 1:].reshape(gh, gw)
        raise ValueError(f"cannot lay {tokens} tokens out on a {gh}x{gw} grid")
    side = math.isqrt(tokens)
    if side * side == tokens:  # no class token (gap pooling)
        return rolled.mean(axis=0).reshape(side, side)
    side = math.isqrt(tokens - 1)
    if side * side == tokens - 1:
        return rolled[0, 1:].reshape(side, side)
    raise ValueError(f"cannot lay {tokens} tokens out on a square grid")


def attention_heatmap(outputs, grid=None):
    """Attention outputs of a model (batch 1) -> a (grid_h, grid_w) map scaled to [0, 1].

    Accepts what an exporter may emit: stacked (1, L, heads, T, T), per-layer (1, heads, T, T) tensors,
    one (1, T, T) matrix, or a ready map (1, gh, gw) / (1, N). ``grid``: the patch grid, where it is known.
    """
    layers, ready = [], None
    for array in outputs:
        array = np.asarray(array, np.float64)[0]
        if array.ndim == 4:
            layers += list(array)
        elif array.ndim == 3 and array.shape[-1] == array.shape[-2] and array.shape[0] < array.shape[-1]:
            layers.append(array)  # (heads, T, T)
        elif array.ndim == 2 and array.shape[0] == array.shape[1] and math.isqrt(array.shape[0] - 1) ** 2 == \
                array.shape[0] - 1 and np.allclose(array.sum(-1), 1.0, atol=1e-2):  # softmax rows, not a map
            layers.append(array[None])
        elif array.ndim == 2:
            ready = array
        elif array.ndim == 1:
            side = math.isqrt(array.size)
            ready = array.reshape(side, side) if side * side == array.size else array[1:].reshape(
                math.isqrt(array.size - 1), -1)
    heat = _token_map(rollout(layers), grid) if layers else ready
    if heat is None:
        return None
    heat = heat - heat.min()
    return (heat / heat.max() if heat.max() > 0 else heat).astype(np.float32)


def _colormap(values):
    """[0, 1] -> RGB uint8 with a perceptually ordered dark-blue -> red -> yellow ramp."""
    stops = np.array([[0, 0, 4], [87, 16, 110], [188, 55, 84], [249, 142, 9], [252, 255, 164]], np.float64)
    positions = np.linspace(0, 1, len(stops))
    channels = [np.interp(values, positions, stops[:, c]) for c in range(3)]
    return np.stack(channels, axis=-1).astype(np.uint8)


def overlay(image, heat, alpha=0.5, min_side=224):
    """The image (upscaled to at least ``min_side`` for display) with ``heat`` blended on top."""
    image = image.convert("RGB")
    if min(image.size) < min_side:
        scale = math.ceil(min_side / min(image.size))
        image = image.resize((image.width * scale, image.height * scale), Image.NEAREST)
    if heat is None:
        return image
    heat_image = Image.fromarray((np.clip(heat, 0, 1) * 255).astype(np.uint8), "L")
    heat_image = heat_image.resize(image.size, Image.BILINEAR)
    colored = Image.fromarray(_colormap(np.asarray(heat_image, np.float64) / 255.0), "RGB")
    return Image.blend(image, colored, alpha)
