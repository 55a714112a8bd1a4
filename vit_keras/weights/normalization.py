"""The input normalization a checkpoint records, for ``create_model(..., pixel_mean="checkpoint")``.

What each layout records (README, "Input normalization"):
  Google / AugReg / big_vision .npz   nothing: their ViTs take (pixel - 127.5) / 127.5, the default;
  a bare timm or HF .safetensors      nothing: the weights alone (timm's ImageNet default is pixel_mean="imagenet");
  a Hugging Face folder               preprocessor_config.json: image_mean, image_std (do_normalize, rescale_factor);
  a timm folder (Hub, save_for_hf)    config.json: pretrained_cfg mean, std;
  a keras-hub preset folder           image_converter.json: scale, offset (pixel * scale + offset).
"""

import os

from vit_keras.files import read_json
from vit_keras.weights.fetch import resolve

HF_PREPROCESSOR = "preprocessor_config.json"
TIMM_CONFIG = "config.json"
KERAS_HUB_CONVERTER = "image_converter.json"  # a keras-hub preset's ImageConverter: scale and offset


def checkpoint_normalization(path):
    """(mean, std) lists in [0, 1] units, per channel, that a checkpoint's folder records; None where none.

    path: a local checkpoint file or its folder. A ``.safetensors`` file is read with the JSON files beside it
    (a Hugging Face or timm folder); an ``.npz`` records none.
    """
    path = os.fspath(path)
    if os.path.isdir(path):
        folder = path
    elif path.endswith((".safetensors", ".weights.h5")):
        folder = os.path.dirname(os.path.abspath(path))
    else:
        return None
    preprocessor = read_json(os.path.join(folder, HF_PREPROCESSOR))
    if preprocessor is not None and "image_mean" in preprocessor:
        return hugging_face_normalization(preprocessor, os.path.join(folder, HF_PREPROCESSOR))
    converter = (read_json(os.path.join(folder, KERAS_HUB_CONVERTER)) or {}).get("config", {})
    if "scale" in converter:
        return keras_hub_normalization(converter)
    config = read_json(os.path.join(folder, TIMM_CONFIG))
    if config is not None:
        pretrained = config.get("pretrained_cfg", config if "architecture" in config else {})  # old form: top level
        if isinstance(pretrained, dict) and "mean" in pretrained and "std" in pretrained:
            return as_list(pretrained["mean"]), as_list(pretrained["std"])
    return None


def hugging_face_normalization(preprocessor, source):
    """(mean, std) of an image processor: rescale by 1/255, then (x - image_mean) / image_std if do_normalize."""
    if not preprocessor.get("do_rescale", True) or abs(preprocessor.get("rescale_factor", 1 / 255) - 1 / 255) > 1e-9:
        raise ValueError(f"{source}: the processor does not rescale by 1/255 (do_rescale="
                         f"{preprocessor.get('do_rescale')}, rescale_factor={preprocessor.get('rescale_factor')}); "
                         "a vit_keras model takes 0-255 pixels: pass pixel_mean / pixel_std yourself.")
    mean, std = as_list(preprocessor["image_mean"]), as_list(preprocessor.get("image_std", [1.0]))
    if not preprocessor.get("do_normalize", True):
        return [0.0] * len(mean), [1.0] * len(mean)
    return mean, std


def keras_hub_normalization(converter):
    """(mean, std) of a keras-hub ImageConverter, which maps pixels to pixel * scale + offset (scalars or one a
    channel): std = 1 / (255 scale), mean = -offset std."""
    scale, offset = as_list(converter["scale"]), as_list(converter.get("offset") or 0.0)
    channels = max(len(scale), len(offset))
    scale, offset = (values * channels if len(values) == 1 else values for values in (scale, offset))
    std = [1.0 / (255.0 * s) for s in scale]
    return [-o * d for o, d in zip(offset, std)], std


def recorded_normalization(weights):
    """create_model's ``pixel_mean="checkpoint"``: the (mean, std) ``weights`` record, or a ValueError."""
    if weights is None:
        raise ValueError("`pixel_mean`='checkpoint' reads the normalization from `weights`; no `weights` given.")
    path = resolve(weights)
    found = checkpoint_normalization(path)
    if found is None:
        raise ValueError(
            f"`pixel_mean`='checkpoint': {path} records no input normalization (Google and big_vision .npz files "
            f"and a bare .safetensors don't; a Hugging Face folder's {HF_PREPROCESSOR} and a timm folder's "
            f"{TIMM_CONFIG} do). Give it: pixel_mean=None for the Google / AugReg checkpoints' (pixel - 127.5) / "
            "127.5, pixel_mean='imagenet' for timm's ImageNet default, or the values.")
    return found


def as_list(values):
    """A recorded mean or std as a list (a single number stands for every channel)."""
    return list(values) if isinstance(values, (list, tuple)) else [values]
