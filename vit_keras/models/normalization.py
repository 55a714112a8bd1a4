"""A model's input normalization, per channel: (pixel / 255 - mean) / std, mean and std in [0, 1] units as timm
gives them (``pretrained_cfg["mean"]``, ``["std"]``).

``pixel_mean`` / ``pixel_std`` of None are the Google checkpoints' 0.5 on every channel, (pixel - 127.5) / 127.5.
A VisionTransformer's config records both; its "preprocessing" layer (``include_preprocessing=True``) applies
them, and export, the app, ``explain`` and ``inspect`` read them from the config (``pixel_normalization``).
Backend-neutral: NumPy here, Keras only to build the layer.
"""

import math
import numbers

import numpy as np

from vit_keras.constants import NORMALIZATIONS

DEFAULT = 0.5  # PIXEL_MEAN / 255 and PIXEL_STD / 255
CHECKPOINT = "checkpoint"  # create_model's preset: what the weights' folder records (weights.checkpoint_normalization)
PRESETS = (CHECKPOINT, *NORMALIZATIONS)


def check_normalization(pixel_mean, pixel_std, channels, checkpoint=None):
    """(mean, std): each a list of ``channels`` floats, or None for the default; a preset name gives both.

    checkpoint: for the 'checkpoint' preset, a function that returns the (mean, std) the weights record
    (create_model passes one). Raises a ValueError naming the parameter for an unknown preset, a wrong
    length, a value outside [0, 1] or a std <= 0.
    """
    named = [(key, value) for key, value in (("pixel_mean", pixel_mean), ("pixel_std", pixel_std))
             if isinstance(value, str)]
    if named:
        return preset_values(named, pixel_mean, pixel_std, channels, checkpoint)
    return (check_values(pixel_mean, "pixel_mean", channels, std=False),
            check_values(pixel_std, "pixel_std", channels, std=True))


def preset_values(named, pixel_mean, pixel_std, channels, checkpoint=None):
    """A preset's (mean, std) lists for ``channels``: a uniform preset fits any channel count, imagenet RGB only."""
    key, name = named[0]
    if name not in PRESETS:
        raise ValueError(f"Unknown `{key}`={name!r}; valid presets are {', '.join(map(repr, PRESETS))}, or give "
                         f"{channels} value(s) in [0, 1], one a channel.")
    others = [value for value in (pixel_mean, pixel_std) if not (isinstance(value, str) and value == name)]
    if any(value is not None for value in others):
        raise ValueError(f"`{key}`={name!r} sets both `pixel_mean` and `pixel_std`: leave the other None; got "
                         f"pixel_mean={pixel_mean!r}, pixel_std={pixel_std!r}.")
    if name == CHECKPOINT and checkpoint is None:
        raise ValueError(f"`{key}`='checkpoint' reads the normalization from the weights: it is a create_model "
                         "option, with `weights` (create_model(..., weights=PATH, pixel_mean='checkpoint')).")
    mean, std = checkpoint() if name == CHECKPOINT else NORMALIZATIONS[name]
    mean, std = list(mean), list(std)
    if len(mean) != channels and len(set(mean)) == len(set(std)) == 1:
        mean, std = mean[:1] * channels, std[:1] * channels
    return (check_values(mean, "pixel_mean", channels, std=False, origin=repr(name)),
            check_values(std, "pixel_std", channels, std=True, origin=repr(name)))


def check_values(values, name, channels, std, origin=None):
    """``values`` as a list of ``channels`` floats in [0, 1] (a std > 0), or None.

    origin: where preset values came from, named in the error ("'imagenet'", "'checkpoint'")."""
    if values is None:
        return None
    where = f"`{name}`" + (f"={origin}" if origin else "")
    shape = f"{channels} value(s) in [0, 1], one a channel (pixel / 255 units, as timm's `mean` / `std`)"
    if isinstance(values, (str, bytes, dict)) or np.ndim(values) != 1:
        raise ValueError(f"{where} must be {shape}, or a preset ({', '.join(PRESETS)}); got {values!r}.")
    if len(values) != channels:
        raise ValueError(f"{where} has {len(values)} value(s) but the model has `channels`={channels}; "
                         f"give {shape}.")
    checked = []
    for value in values:
        if isinstance(value, (bool, np.bool_)) or not isinstance(value, numbers.Real) or not math.isfinite(value):
            raise ValueError(f"{where} must be {shape}; got {list(values)!r}.")
        if not ((value > 0 if std else value >= 0) and value <= 1):
            hint = " (0-255 units? divide by 255)" if 1 < value <= 255 else ""
            bound = "(0, 1]: a std must be > 0" if std else "[0, 1]"
            raise ValueError(f"{where} values must be in {bound}, in pixel / 255 units; got {list(values)!r}{hint}.")
        checked.append(float(value))
    return checked


def pixel_normalization(config):
    """(mean, std) of a model's input per channel in 0-255 pixel units: float64 arrays of ``channels`` values.

    ``config``: a VisionTransformer's config (``model.vit_config``); files saved before these options have none
    and get the default."""
    channels = int(config["channels"])
    mean, std = (np.asarray(config.get(key) or [DEFAULT] * channels, "float64") * 255.0
                 for key in ("pixel_mean", "pixel_std"))
    return mean, std


def is_uniform(config):
    """Whether every channel has the same mean and std: one scalar mean and std describe the input (TFLite
    metadata with a single value, which MediaPipe's ImageClassifier requires)."""
    mean, std = pixel_normalization(config)
    return bool(np.all(mean == mean[0]) and np.all(std == std[0]))


def normalize(images, config):
    """0-255 ``images`` (..., channels) as the model's input: float32 (pixel - mean) / std per channel."""
    mean, std = pixel_normalization(config)
    return ((np.asarray(images, "float32") - mean) / std).astype("float32")


def rescaling_layer(config, name):
    """The "preprocessing" layer: ``Rescaling(1 / std, offset=-mean / std)`` in pixel units, per channel.

    Scalars where the channels agree, so the default is exactly ``Rescaling(1 / 127.5, offset=-1)``."""
    import keras

    mean, std = pixel_normalization(config)
    scale, offset = 1.0 / std, -mean / std
    if is_uniform(config):
        return keras.layers.Rescaling(float(scale[0]), offset=float(offset[0]), name=name)
    return keras.layers.Rescaling(scale.tolist(), offset=offset.tolist(), name=name)


def describe(config):
    """The normalization in words, e.g. 'mean (0.485, 0.456, 0.406), std (0.229, 0.224, 0.225) of pixel / 255'."""
    mean, std = (np.round(values / 255.0, 6) for values in pixel_normalization(config))
    return (f"mean ({', '.join(f'{v:g}' for v in mean)}), std ({', '.join(f'{v:g}' for v in std)}) "
            "of pixel / 255")


def input_range(config):
    """(lowest, highest) value a model's input can take: 0-255 pixels, or their normalized range."""
    if config.get("include_preprocessing"):
        return 0.0, 255.0
    mean, std = pixel_normalization(config)
    return float(np.min(-mean / std)), float(np.max((255.0 - mean) / std))


def input_description(config):
    """The input a model takes, in words."""
    if config.get("include_preprocessing"):
        return "raw 0-255 pixels"
    low, high = input_range(config)
    return f"normalized pixels in [{low:.3g}, {high:.3g}] ({describe(config)})"


CHECKED_IMAGES = 64  # the images of an array batch whose range is checked: enough to tell, cheap to read
RAW_PIXEL_FLOOR = 8.0  # a batch of raw pixels fed to a normalizing model has values above this, unless near black


def check_pixels(images, config, name="images"):
    """Refuse an array of ``images`` whose values are obviously scaled for the other input than the model's
    (``config``: a VisionTransformer's): normalized values given to a model that takes raw 0-255 pixels, or raw
    pixels given to one that takes normalized ones. Datasets and tensors are not read (that would cost a batch)."""
    if not config or not isinstance(images, np.ndarray) or images.ndim != 4 or not images.size:
        return
    if images.dtype.kind not in "biuf":
        raise ValueError(f"`{name}` must hold numbers (uint8 pixels or floats); got dtype {images.dtype}.")
    sample = images[:CHECKED_IMAGES]
    low, high = float(sample.min()), float(sample.max())
    expected_low, expected_high = input_range(config)
    margin = 0.01 * (expected_high - expected_low)
    if config.get("include_preprocessing"):
        scaled = images.dtype.kind == "f" and (low < 0 or 0 < high <= 1.0)
        wrong = scaled or high > 255 + margin
        fix = ("pass raw 0-255 pixels (the model normalizes them itself), or build it with "
               "include_preprocessing=False")
    else:  # raw pixels: far above the range (a standard normal's few sigmas are not refused)
        wrong = high > max(RAW_PIXEL_FLOOR, 2 * expected_high - expected_low)
        fix = ("normalize them as the model expects (vit_keras.models.normalization.normalize), or build it with "
               "include_preprocessing=True to pass raw 0-255 pixels")
    if wrong:
        raise ValueError(f"`{name}` holds values in [{low:.3g}, {high:.3g}], but the model takes "
                         f"{input_description(config)}, in [{expected_low:.3g}, {expected_high:.3g}]: {fix}.")
