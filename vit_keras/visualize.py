"""See inside a ViT: the pictures of the paper's Fig. 7 and an attention-rollout overlay.

Array functions (numpy in, numpy out):
  attention_rollout        Abnar & Zuidema (2020): rolled-out attention (B, T, T), rows sum to 1.
  attention_heatmap        where the output looks in an image: (B, grid_h, grid_w).
  overlay_heatmap          that heatmap blended over the image, an RGB uint8 array.
  mean_attention_distance  per layer and head, in input pixels (Fig. 7 right): (L, heads).
  position_similarity      cosine similarity of the position embeddings (Fig. 7 centre): (gh, gw, gh, gw).
  embedding_components     principal components of the patch-embedding filters (Fig. 7 left).

The ``plot_*`` writers draw those arrays to PNG files. matplotlib is imported only
inside them and draws on an Agg canvas, so no display and no global pyplot state.

``images`` arguments are pixels 0-255, (N, H, W, C), as a user holds them; they are
normalized here when the model has no preprocessing layer (pass ``pixels=False`` for
inputs already in the model's range).
"""

import os

import numpy as np

from vit_keras.constants import LUMA_WEIGHTS
from vit_keras.data.datasets import decode_image
from vit_keras.files import atomic_path
from vit_keras.models.normalization import normalize
from vit_keras.models.vision_transformer import vision_transformer_of


def _embedding(model):
    encoder = getattr(model, "patch_encoder", None)
    if encoder is None:
        raise ValueError("`model` must be a vit_keras VisionTransformer (it has no patch encoder).")
    return encoder


def token_geometry(model):
    """((grid_h, grid_w), (cell_h, cell_w) in input pixels, prefix tokens) of a model's tokens: the prefix is the
    count of tokens before the patches (class, distillation and register tokens)."""
    embedding = _embedding(model)
    height, width = model.input_shape[1:3]
    gh, gw = embedding.grid_size
    return (gh, gw), (height / gh, width / gw), embedding.prefix_tokens


def model_inputs(model, images, pixels=True):
    """float32 (N, H, W, C) inputs for ``model`` from 0-255 ``images`` (a single image gets a batch axis)."""
    images = np.asarray(images, dtype="float32")
    if images.ndim == 3:
        images = images[None]
    expected = tuple(model.input_shape[1:])
    if images.ndim != 4 or images.shape[1:] != expected:
        raise ValueError(f"`images` must have shape (N, {', '.join(map(str, expected))}); got {images.shape}. "
                         "Use `load_image` to resize a file to the model's input.")
    if pixels and getattr(model, "preprocessing", None) is None:
        images = normalize(images, model.vit_config)  # its pixel_mean / pixel_std (default: the [-1, 1] range)
    return images


def load_image(path, model):
    """An image file as 0-255 float32 (H, W, C) at the model's input size and channels, decoded as training
    and the app decode it (EXIF orientation, 16-bit, alpha on white); a clear ValueError for unreadable files."""
    height, width, channels = model.input_shape[1:]
    if channels not in (1, 3):
        raise ValueError(f"Only models with 1 or 3 input channels take image files; this one has {channels}.")
    try:
        array = decode_image(path, (height, width)).astype("float32")
    except Exception as error:  # Pillow raises many types for bad files
        raise ValueError(f"{path}: not a readable image ({type(error).__name__}: {error})") from None
    if array.shape[-1] == channels:
        return array
    if channels == 3:
        return np.repeat(array, 3, axis=-1)
    return (array @ np.array(LUMA_WEIGHTS, "float32"))[..., None]


# ----------------------------------------------------------------------------- attention rollout


def attention_rollout(attention_maps, add_residual=True):
    """Roll attention out through the layers (Abnar & Zuidema 2020).

    attention_maps: L arrays (B, heads, T, T), as ``VisionTransformer.attention_maps`` returns.
    Per layer: mean over heads, add the identity for the residual connection,
    renormalize the rows, then multiply the layers together (last @ ... @ first).
    Returns (B, T, T); row t is how much output token t draws on each input token.
    """
    rolled = None
    for weights in attention_maps:
        layer = np.asarray(weights, dtype="float64").mean(axis=1)
        if add_residual:
            layer = layer + np.eye(layer.shape[-1])
        layer = layer / layer.sum(axis=-1, keepdims=True)
        rolled = layer if rolled is None else layer @ rolled
    if rolled is None:
        raise ValueError("`attention_maps` is empty; pass one (B, heads, T, T) array per layer.")
    return rolled


def rollout_heatmap(rollout, grid, class_token, pooling="token", token_weights=None):
    """(B, gh, gw) over the patches from a rollout (B, T, T).

    class_token: the number of tokens before the patches (True: the class token alone).
    pooling="token": the class token's row (what the prediction reads);
    pooling="token_gap": the mean of that row and the patch rows' mean (the readout concatenates both);
    pooling="gap": the mean of the patch rows, since GAP averages every patch's output;
    pooling="sequence": the patch rows weighted by the readout's ``token_weights`` (B, N) for these images.
    """
    gh, gw = grid
    prefix = int(class_token)
    if pooling in ("token", "token_gap"):
        if not class_token:
            raise ValueError(f"`pooling`={pooling!r} needs `class_token`; use pooling='gap' for a model without one.")
        weights = rollout[:, 0, prefix:]
        if pooling == "token_gap":
            weights = (weights + rollout[:, prefix:, prefix:].mean(axis=1)) / 2
    elif pooling == "sequence":
        if token_weights is None:
            raise ValueError("`pooling`='sequence' weights the patch rows by the readout: pass `token_weights` "
                             "(B, N), from the model's pooling_layer.token_weights.")
        weights = np.einsum("bn,bnt->bt", np.asarray(token_weights, "float64"), rollout[:, prefix:, prefix:])
    else:
        weights = rollout[:, prefix:, prefix:].mean(axis=1)
    return weights.reshape(-1, gh, gw)


def readout_token_weights(model, inputs, batch_size=32):
    """Sequence pooling's weights over the patch tokens (B, N) for model ``inputs``."""
    import keras

    features = keras.Model(model.inputs, model.encoder_norm.output)
    z = features.predict(inputs, batch_size=batch_size, verbose=0)
    return keras.ops.convert_to_numpy(model.pooling_layer.token_weights(z))


def attention_heatmap(model, images, pixels=True, batch_size=32):
    """Attention-rollout heatmaps (B, gh, gw) of ``images`` in ``model``'s patch grid."""
    inputs = model_inputs(model, images, pixels)
    maps = model.attention_maps(inputs, batch_size=batch_size)
    grid, _, class_token = token_geometry(model)
    pooling = model.pooling_layer.pooling
    weights = readout_token_weights(model, inputs, batch_size) if pooling == "sequence" else None
    return rollout_heatmap(attention_rollout(maps), grid, class_token, pooling, weights)


def upsample(heatmap, size):
    """Bilinear resize of a 2-D map to ``size`` = (height, width)."""
    from PIL import Image

    resized = Image.fromarray(np.asarray(heatmap, dtype="float32")).resize((size[1], size[0]), Image.BILINEAR)
    return np.asarray(resized)


def overlay_heatmap(image, heatmap, alpha=0.5, cmap="inferno"):
    """The image (0-255, (H, W, 1|3)) with ``heatmap`` drawn over it: uint8 RGB (H, W, 3)."""
    import matplotlib

    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"`alpha` must be in [0, 1]; got {alpha}.")
    image = np.asarray(image, dtype="float32")
    if image.ndim == 2:
        image = image[..., None]
    if image.ndim != 3 or image.shape[-1] not in (1, 3):
        raise ValueError(f"`image` must be (H, W, 1) or (H, W, 3); got {image.shape}.")
    rgb = np.repeat(image, 3, axis=-1) if image.shape[-1] == 1 else image
    heat = upsample(heatmap, image.shape[:2]).astype("float64")
    heat = (heat - heat.min()) / max(heat.max() - heat.min(), 1e-12)
    colored = matplotlib.colormaps[cmap](heat)[..., :3] * 255.0
    return np.clip((1 - alpha) * rgb + alpha * colored, 0, 255).astype("uint8")


def attention_map(model, image):
    """faustomorales/vit-keras's attention map: ``image`` masked by where the prediction looks.

    ``image``: 0-255 pixels (H, W), (H, W, 1) or (H, W, 3) at any size, resized here to the model's input.
    Its attention-rollout heatmap, scaled to a maximum of 1 and upsampled to (H, W), multiplies the image:
    returns uint8 of the image's shape. ``model``: a ``VisionTransformer`` or a ``vit_keras.compat.vit`` model.
    """
    vit = vision_transformer_of(model)
    pixels = np.asarray(image, dtype="float32")
    if pixels.ndim not in (2, 3) or pixels.ndim == 3 and pixels.shape[-1] not in (1, 3) or not pixels.size:
        raise ValueError(f"`image` must be (H, W), (H, W, 1) or (H, W, 3) pixels; got shape {pixels.shape}.")
    planes = pixels[..., None] if pixels.ndim == 2 else pixels
    height, width, channels = vit.input_shape[1:]
    resized = np.stack([upsample(planes[..., c], (height, width)) for c in range(planes.shape[-1])], axis=-1)
    if (resized.shape[-1], channels) == (1, 3):
        resized = np.repeat(resized, 3, axis=-1)
    elif (resized.shape[-1], channels) == (3, 1):
        resized = resized @ np.array(LUMA_WEIGHTS, "float32")[:, None]
    heatmap = attention_heatmap(vit, resized[None])[0]
    mask = np.clip(upsample(heatmap / heatmap.max(), pixels.shape[:2]), 0.0, 1.0)
    mask = mask[..., None] if pixels.ndim == 3 else mask
    return (mask * pixels).astype("uint8")


# ----------------------------------------------------------------------------- attention distance


def patch_distances(grid, cell_size):
    """(N, N) Euclidean distances in pixels between patch centres, patches in row-major order."""
    gh, gw = grid
    rows, cols = np.divmod(np.arange(gh * gw), gw)
    y, x = rows * cell_size[0], cols * cell_size[1]
    return np.hypot(y[:, None] - y[None, :], x[:, None] - x[None, :])


def mean_attention_distance(attention_maps, grid, cell_size, class_token, renormalize=True):
    """Mean attention distance (L, heads) in input pixels, as in the paper's Fig. 7 (right).

    For each head: sum over keys of attention weight x distance between the query's
    and the key's patch centres, averaged over query patches and images. The class
    token is left out as query and as key; with ``renormalize`` each query's weights
    over the patch keys are rescaled to sum to 1, so the result is a true mean
    distance and not shrunk by the share of attention that goes to the class token.
    """
    distances = patch_distances(grid, cell_size)
    prefix = int(class_token)  # a count of tokens before the patches, or True for the class token alone
    per_layer = []
    for weights in attention_maps:
        weights = np.asarray(weights, dtype="float64")[..., prefix:, prefix:]
        if weights.shape[-1] != distances.shape[0]:
            raise ValueError(f"Attention over {weights.shape[-1]} patches does not match the {grid} grid.")
        if renormalize:
            weights = weights / np.maximum(weights.sum(axis=-1, keepdims=True), 1e-12)
        per_query = (weights * distances).sum(axis=-1)  # (B, heads, N)
        per_layer.append(per_query.mean(axis=(0, 2)))
    return np.stack(per_layer)


def attention_distance(model, images, pixels=True, batch_size=32):
    """``mean_attention_distance`` of ``model`` over ``images``: (L, heads) in input pixels."""
    maps = model.attention_maps(model_inputs(model, images, pixels), batch_size=batch_size)
    grid, cell, class_token = token_geometry(model)
    return mean_attention_distance(maps, grid, cell, class_token)


# ----------------------------------------------------------------------------- embeddings


def position_grid(model):
    """The patch rows of the position embedding as (gh, gw, D), any kind (learned, learned_2d, sincos_2d)."""
    from keras import ops

    embedding = _embedding(model)
    table = embedding.position_table()
    if table is None:
        raise ValueError("The model has position_embedding='none': there is no position embedding to compare.")
    table = np.asarray(ops.convert_to_numpy(table))[0, embedding.positioned_prefix:]
    return table.reshape(*embedding.grid_size, -1)


def cosine_similarity_grid(table):
    """(gh, gw, gh, gw) cosine similarities between all pairs of (gh, gw, D) vectors."""
    table = np.asarray(table, dtype="float64")
    gh, gw, d = table.shape
    flat = table.reshape(gh * gw, d)
    flat = flat / np.maximum(np.linalg.norm(flat, axis=1, keepdims=True), 1e-12)
    return (flat @ flat.T).reshape(gh, gw, gh, gw)


def position_similarity(model):
    """Fig. 7 (centre): cosine similarity of each patch's position embedding with every other's."""
    return cosine_similarity_grid(position_grid(model))


def embedding_components(model, num_components=28):
    """Fig. 7 (left): principal components of the patch-embedding filters.

    The kernel (P, P, C, D) holds D filters of P*P*C values. PCA over those D
    filters gives components that are P x P x C images. Returns
    (components (n, P, P, C), explained-variance ratio (n,)), n <= num_components;
    each component's sign is fixed so its largest-magnitude value is positive.
    """
    from keras import ops

    if num_components < 1:
        raise ValueError(f"`num_components` must be >= 1; got {num_components}.")
    kernel = np.asarray(ops.convert_to_numpy(_embedding(model).kernel), dtype="float64")
    ph, pw, c, d = kernel.shape
    filters = kernel.reshape(ph * pw * c, d).T
    filters = filters - filters.mean(axis=0)
    _, singular, basis = np.linalg.svd(filters, full_matrices=False)
    n = min(num_components, basis.shape[0])
    basis = basis[:n]
    signs = np.sign(basis[np.arange(n), np.abs(basis).argmax(axis=1)])
    variance = singular ** 2
    ratio = variance[:n] / max(variance.sum(), 1e-30)
    return (basis * signs[:, None]).reshape(n, ph, pw, c), ratio


# ----------------------------------------------------------------------------- PNG writers


def _figure(width, height):
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    figure = Figure(figsize=(width, height), dpi=100)
    FigureCanvasAgg(figure)
    return figure


def _save(figure, path):
    """Write the figure as PNG atomically (temp file in the same folder, then rename)."""
    path = os.fspath(path)
    with atomic_path(path) as temp:
        figure.savefig(temp, format="png", bbox_inches="tight")
    return path


def plot_confusion_matrix(confusion, class_names, path, title="Confusion matrix"):
    """PNG: a labelled confusion-matrix heat map (rows: true class, columns: predicted)."""
    n = len(class_names)
    figure = _figure(1.0 + 0.6 * n, 0.8 + 0.55 * n)
    axis = figure.subplots()
    axis.imshow(confusion, cmap="Blues")
    axis.set_xticks(range(n), class_names, rotation=45, ha="right")
    axis.set_yticks(range(n), class_names)
    axis.set(xlabel="predicted", ylabel="true", title=title)
    limit = confusion.max() / 2 if confusion.size else 0
    for i in range(n):
        for j in range(n):
            axis.text(j, i, str(confusion[i, j]), ha="center", va="center", fontsize=7,
                      color="white" if confusion[i, j] > limit else "black")
    return _save(figure, path)


def plot_attention_overlay(image, heatmap, path, title=None, alpha=0.5):
    """PNG: the image beside its attention-rollout overlay."""
    image = np.asarray(image, dtype="float32")
    figure = _figure(6, 3.2)
    left, right = figure.subplots(1, 2)
    shown = image[..., 0] if image.shape[-1] == 1 else image / 255.0
    left.imshow(shown, cmap="gray" if image.shape[-1] == 1 else None, vmin=0, vmax=255 if image.shape[-1] == 1 else 1)
    left.set_title("image")
    right.imshow(overlay_heatmap(image, heatmap, alpha=alpha))
    right.set_title("attention rollout")
    for axis in (left, right):
        axis.axis("off")
    if title:
        figure.suptitle(title)
    return _save(figure, path)


def plot_attention_distance(distances, path, title="Mean attention distance"):
    """PNG like Fig. 7 (right): one dot per head against depth. ``distances``: (L, heads) or {label: (L, heads)}."""
    series = distances if isinstance(distances, dict) else {"": distances}
    figure = _figure(5, 3.6)
    axis = figure.subplots()
    for index, (label, values) in enumerate(series.items()):
        values = np.asarray(values)
        layers, heads = values.shape
        depth = np.repeat(np.arange(1, layers + 1), heads) + (index - (len(series) - 1) / 2) * 0.15
        axis.scatter(depth, values.reshape(-1), s=18, alpha=0.75, label=label or None)
        axis.plot(np.arange(1, layers + 1) + (index - (len(series) - 1) / 2) * 0.15, values.mean(axis=1),
                  alpha=0.5)
    axis.set_xlabel("network depth (layer)")
    axis.set_ylabel("mean attention distance (pixels)")
    axis.set_title(title)
    if len(series) > 1:
        axis.legend()
    return _save(figure, path)


def similarity_mosaic(similarity):
    """One image of all (gh, gw) similarity maps, tiled in patch order and separated by a NaN gap."""
    gh, gw = similarity.shape[:2]
    mosaic = np.full((gh * (gh + 1) - 1, gw * (gw + 1) - 1), np.nan)
    for r in range(gh):
        for c in range(gw):
            mosaic[r * (gh + 1):r * (gh + 1) + gh, c * (gw + 1):c * (gw + 1) + gw] = similarity[r, c]
    return mosaic


def plot_position_similarity(similarity, path, title="Position embedding similarity"):
    """PNG like Fig. 7 (centre): tile (r, c) is patch (r, c)'s cosine similarity with every patch."""
    gh, gw = similarity.shape[:2]
    figure = _figure(min(2 + 0.45 * gw, 12), min(1.6 + 0.45 * gh, 12))
    axis = figure.subplots()
    image = axis.imshow(similarity_mosaic(similarity), cmap="viridis", vmin=-1, vmax=1)
    axis.set_xticks(np.arange(gw) * (gw + 1) + (gw - 1) / 2, labels=np.arange(1, gw + 1))
    axis.set_yticks(np.arange(gh) * (gh + 1) + (gh - 1) / 2, labels=np.arange(1, gh + 1))
    axis.set_xlabel("input patch column")
    axis.set_ylabel("input patch row")
    axis.set_title(title)
    figure.colorbar(image, ax=axis, label="cosine similarity", shrink=0.8)
    return _save(figure, path)


def plot_embedding_components(components, path, ratio=None, title="Patch-embedding filters: principal components"):
    """PNG like Fig. 7 (left): each component (P, P, 1|3) as an image, scaled to its own range."""
    components = np.asarray(components)
    channels = components.shape[-1]
    if channels not in (1, 3):
        raise ValueError(f"Components with {channels} channels are not images (is the model a hybrid with a stem?).")
    n = len(components)
    cols = min(n, 7)
    rows = -(-n // cols)
    figure = _figure(1.1 * cols, 1.1 * rows + 0.5)
    axes = np.atleast_1d(figure.subplots(rows, cols, squeeze=False)).reshape(-1)
    for index, axis in enumerate(axes):
        axis.axis("off")
        if index >= n:
            continue
        component = components[index]
        scaled = (component - component.min()) / max(component.max() - component.min(), 1e-12)
        axis.imshow(scaled[..., 0] if channels == 1 else scaled, cmap="gray" if channels == 1 else None,
                    vmin=0, vmax=1, interpolation="nearest")
        if ratio is not None:
            axis.set_title(f"{100 * ratio[index]:.0f}%", fontsize=7)
    figure.suptitle(title, fontsize=9)
    return _save(figure, path)

