"""Fine-tuning pretrained weights: the input size a run uses when none is asked for, chosen for the machine.

The position embedding is resampled to any patch grid (``vit_keras.models.position``), so a pretrained ViT fine-tunes
at any size that holds whole patches. Its cost per image grows with the token count times its width squared and
its depth; on a CPU that cost decides how many images a minute trains, and fewer, smaller images lose less than
fewer steps do (docs/benchmarks.md, "Fine-tuning a pretrained ViT"). So:

  * with an accelerator (GPU, TPU): the weights' own size (a preset's; a .keras model's; else 224);
  * on CPUs: the largest size, in whole patches and at most the weights' own, whose cost per image fits
    ``COST_PER_CORE`` times the cores this process may use (a ViT-Ti/16 at 96 pixels on 2 cores), and never
    fewer than ``MIN_GRID`` patches a side.
"""

import dataclasses
import json
import os
import zipfile

from vit_keras.models.configs import model_config
from vit_keras.weights.presets import find_preset

DEFAULT_SIDE = 224  # the usual pre-training size, for a checkpoint file that names none
MIN_GRID = 4
TI16 = dict(hidden_size=192, num_layers=12)
COST_PER_CORE = (96 // 16) ** 2 * TI16["hidden_size"] ** 2 * TI16["num_layers"] / 2


def cost(side, patch, hidden_size, num_layers):
    """Relative training cost of one image: tokens x width^2 x depth."""
    return (side // patch) ** 2 * hidden_size ** 2 * num_layers


def usable_cores():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def accelerator_count():
    """GPUs or TPUs the Keras backend can use."""
    import keras

    backend = keras.backend.backend()
    if backend == "jax":
        import jax

        return sum(device.platform != "cpu" for device in jax.devices())
    if backend == "torch":
        import torch

        return torch.cuda.device_count()
    import tensorflow as tf

    from vit_keras.training.strategies import tpu_present

    return len(tf.config.list_logical_devices("GPU")) + int(tpu_present())


def saved_config(path):
    """A .keras file's VisionTransformer config, read from its config.json without building the model."""
    with zipfile.ZipFile(path) as archive:
        return json.loads(archive.read("config.json"))["config"]


def pretrained_shape(config):
    """(patch, width, depth, the weights' own side, what that side is) of a fine-tuning run's model. A hybrid's
    patch is its stem's stride (the encoder takes 1x1 patches of its feature map)."""
    if str(config.weights).endswith(".keras"):
        vit = saved_config(config.weights)
        patch = vit["patch_size"] if isinstance(vit["patch_size"], int) else max(vit["patch_size"])
        return patch, vit["hidden_size"], vit["num_layers"], max(vit["image_size"]), "the saved model's size"
    vit = model_config(config.model_name, **{key: value for key, value in (config.model_overrides or {}).items()
                                             if key in ("patch_size", "hidden_size", "num_layers")})
    shape = vit["patch_size"], vit["hidden_size"], vit["num_layers"]
    preset = find_preset(config.weights)
    if preset is not None:
        return (*shape, preset.image_size, f"preset {preset.name}'s own")
    return (*shape, DEFAULT_SIDE, "the usual pre-training size")


def finetune_image_size(config, cores=None, accelerators=None):
    """(side, reason): the input size of a fine-tuning run with no ``image_size`` asked for."""
    stride, width, depth, native, what = pretrained_shape(config)
    accelerators = accelerator_count() if accelerators is None else accelerators
    if accelerators:
        return native, f"{what} ({accelerators} accelerator(s) found)"
    cores = usable_cores() if cores is None else cores
    smallest = stride * MIN_GRID
    fitting = [side for side in range(smallest, native + 1, stride)
               if cost(side, stride, width, depth) <= COST_PER_CORE * cores]
    side = max(fitting, default=min(smallest, native))
    return side, (f"the largest whose cost fits {cores} CPU core(s) (a ViT-Ti/16 at 96 px per 2 cores; at least "
                  f"{MIN_GRID}x{MIN_GRID} patches, at most {what}, {native})")


def with_image_size(config):
    """``config`` with the image size chosen for fine-tuning (printed, with why) where none was asked for."""
    if config.recipe != "finetune" or config.image_size is not None:
        return config
    side, reason = finetune_image_size(config)
    print(f"image size: {side}, {reason}; --image-size overrides it.")
    return dataclasses.replace(config, image_size=side)
