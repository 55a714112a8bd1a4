"""The API of faustomorales/vit-keras (PyPI ``vit-keras`` 0.2.0), on this package's models and weight loader.

Code written for that package keeps working: ``vit.vit_b16(image_size=384, pretrained=True)`` and the rest
build a ``VisionTransformer`` (``vit_keras.models``), and ``pretrained=True`` fetches the same files as before
(``BASE_URL``) through ``vit_keras.weights.loader.load_weights`` and its download cache (``vit_keras.weights.fetch``).
What differs, and why:
  * the model is a ``VisionTransformer`` with this package's layer names (``embedding``, ``encoderblock_{i}``,
    ``encoder_norm``, ``pool``, ``head``), not the old ``Transformer/encoderblock_{i}`` names;
  * ``activation`` other than ``"linear"`` returns a small functional model, the ``VisionTransformer`` followed
    by an ``Activation`` layer (``vision_transformer_of`` finds the former), since the library's head emits logits;
  * a head that is not loaded (``pretrained_top=False``) starts at zero, as the library's loader does when it
    skips a head (the paper's fine-tuning, section 3.2);
  * the old package warned and replaced ``classes`` when it did not fit ``pretrained_top``; this raises instead.
"""

import keras
import numpy as np
from keras import ops

from vit_keras.compat.utils import load_weights_numpy
from vit_keras.constants import PIXEL_MEAN, PIXEL_STD
from vit_keras.models.vision_transformer import VisionTransformer, vision_transformer_of  # noqa: F401  (the old API's)
from vit_keras.weights.fetch import DownloadError, cache_path

CONFIG_B = {"dropout": 0.1, "mlp_dim": 3072, "num_heads": 12, "num_layers": 12, "hidden_size": 768}
CONFIG_L = {"dropout": 0.1, "mlp_dim": 4096, "num_heads": 16, "num_layers": 24, "hidden_size": 1024}

# The old package's download location: Google's checkpoints (gs://vit_models/{weights}/ViT-{size}.npz),
# re-hosted there as ViT-{size}_{weights}.npz.
BASE_URL = "https://github.com/faustomorales/vit-keras/releases/download/dl"
WEIGHTS = {"imagenet21k": 21_843, "imagenet21k+imagenet2012": 1_000}  # weights -> classes of their head
SIZES = {"B_16", "B_32", "L_16", "L_32"}


def preprocess_inputs(X):
    """0-255 pixels -> the checkpoints' [-1, 1] range (NumPy in, NumPy out; a tensor stays a tensor)."""
    if ops.is_tensor(X):
        return (ops.cast(X, "float32") - PIXEL_MEAN) / PIXEL_STD
    return (np.asarray(X, dtype="float32") - PIXEL_MEAN) / PIXEL_STD


def build_model(image_size, patch_size, num_layers, hidden_size, num_heads, name, mlp_dim, classes, dropout=0.1,
                activation="linear", include_top=True, representation_size=None):
    """A ViT of the given shape: a ``VisionTransformer``, its head followed by ``activation`` unless linear."""
    linear = activation in (None, "linear") or not include_top  # the activation is the head's
    if not linear:
        try:
            keras.activations.get(activation)
        except ValueError:
            raise ValueError(f"`activation` must be a Keras activation (e.g. 'linear', 'sigmoid', 'softmax'); "
                             f"got {activation!r}.") from None
    model = VisionTransformer(
        image_size=image_size, patch_size=patch_size, num_layers=num_layers, hidden_size=hidden_size,
        num_heads=num_heads, mlp_dim=mlp_dim, num_classes=classes, dropout=dropout, include_top=include_top,
        representation_size=representation_size, name=name,
    )
    if linear:
        return model
    outputs = keras.layers.Activation(activation, dtype="float32", name="activation")(model(model.inputs[0]))
    return keras.Model(model.inputs, outputs, name=name)


def validate_pretrained_top(include_top, pretrained, classes, weights):
    """The number of classes of the head that ``pretrained_top`` loads; a clear error when it cannot."""
    expected = WEIGHTS[check_weights_name(weights)]
    if classes is not None and classes != expected:
        raise ValueError(f"`pretrained_top`=True loads the {weights!r} head, which has {expected} classes; got "
                         f"`classes`={classes}. Pass `classes`={expected} (or leave it out), or "
                         "`pretrained_top`=False to train a new head.")
    if not include_top:
        raise ValueError("`pretrained_top`=True needs `include_top`=True; pass `pretrained_top`=False for features.")
    if not pretrained:
        raise ValueError("`pretrained_top`=True needs `pretrained`=True; pass `pretrained_top`=False for a "
                         "randomly initialized model.")
    return expected


def check_weights_name(weights):
    if weights not in WEIGHTS:
        raise ValueError(f"`weights` must be one of {', '.join(map(repr, WEIGHTS))}; got {weights!r}.")
    return weights


def weights_url(size, weights):
    """Where the old package downloaded ``ViT-{size}`` pretrained on ``weights``."""
    if size not in SIZES:
        raise ValueError(f"`size` must be one of {', '.join(sorted(SIZES))}; got {size!r}.")
    return f"{BASE_URL}/ViT-{size}_{check_weights_name(weights)}.npz"


def load_pretrained(size, weights, pretrained_top, model, num_x_patches=None, num_y_patches=None):
    """Load the old package's checkpoint for ``size`` / ``weights`` into ``model``, through the cache.

    ``num_x_patches`` / ``num_y_patches`` are accepted for the old signature; the loader reads the grid from
    the model and resamples the position embedding itself.
    """
    url = weights_url(size, weights)
    try:
        load_weights_numpy(model, url, pretrained_top)
    except DownloadError as error:  # the loader's hint names create_model's `weights`, which means a file there
        reason = getattr(error.__cause__, "reason", error.__cause__)
        raise DownloadError(
            f"`pretrained`=True could not download {url} ({reason}). If this machine is offline, download the "
            f"file elsewhere and put it at {cache_path(url)}, or build with `pretrained`=False and call "
            "vit_keras.compat.utils.load_weights_numpy(model, path, pretrained_top)."
        ) from error


def _build(size, default_name, config, patch_size, image_size, classes, activation, include_top, pretrained,
           pretrained_top, weights):
    check_weights_name(weights)
    for key, value in dict(include_top=include_top, pretrained=pretrained, pretrained_top=pretrained_top).items():
        if not isinstance(value, (bool, np.bool_)):
            raise ValueError(f"`{key}` must be True or False; got {value!r}.")
    if pretrained_top:
        classes = validate_pretrained_top(include_top, pretrained, classes, weights)
    elif classes is None:
        classes = 1000
    model = build_model(
        **config, patch_size=patch_size, image_size=image_size, classes=classes, activation=activation,
        include_top=include_top, name=default_name,
        # the ImageNet-21k checkpoints have a tanh pre-logits layer; the fine-tuned ones do not
        representation_size=config["hidden_size"] if weights == "imagenet21k" else None,
    )
    if pretrained:
        load_pretrained(size, weights, pretrained_top, model)
    return model


def vit_b16(image_size=(224, 224), classes=None, activation="linear", include_top=True, pretrained=True,
            pretrained_top=True, weights="imagenet21k+imagenet2012"):
    """ViT-B/16. ``classes``: 1000, or the ``weights``' head size with ``pretrained_top``."""
    return _build("B_16", "vit-b16", CONFIG_B, 16, image_size, classes, activation, include_top, pretrained,
                  pretrained_top, weights)


def vit_b32(image_size=(224, 224), classes=None, activation="linear", include_top=True, pretrained=True,
            pretrained_top=True, weights="imagenet21k+imagenet2012"):
    """ViT-B/32. ``classes``: 1000, or the ``weights``' head size with ``pretrained_top``."""
    return _build("B_32", "vit-b32", CONFIG_B, 32, image_size, classes, activation, include_top, pretrained,
                  pretrained_top, weights)


def vit_l16(image_size=(384, 384), classes=None, activation="linear", include_top=True, pretrained=True,
            pretrained_top=True, weights="imagenet21k+imagenet2012"):
    """ViT-L/16. ``classes``: 1000, or the ``weights``' head size with ``pretrained_top``."""
    return _build("L_16", "vit-l16", CONFIG_L, 16, image_size, classes, activation, include_top, pretrained,
                  pretrained_top, weights)


def vit_l32(image_size=(384, 384), classes=None, activation="linear", include_top=True, pretrained=True,
            pretrained_top=True, weights="imagenet21k+imagenet2012"):
    """ViT-L/32. ``classes``: 1000, or the ``weights``' head size with ``pretrained_top``."""
    return _build("L_32", "vit-l32", CONFIG_L, 32, image_size, classes, activation, include_top, pretrained,
                  pretrained_top, weights)
