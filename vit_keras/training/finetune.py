"""Fine-tuning pretrained weights: the input size a run uses when none is asked for, chosen for the data and the
machine.

The position embedding is resampled to any patch grid (``vit_keras.models.position``), so a pretrained ViT
fine-tunes at any size that holds whole patches, and a larger one is more accurate (docs/benchmarks.md,
"Fine-tuning a pretrained ViT") but slower: per image, each block costs about 12 D^2 a token (projections, MLP)
plus 2 D a token pair (attention). So:

  * with an accelerator (GPU, TPU): the weights' own size (a preset's; a .keras model's; else 224);
  * on CPUs: the largest size, in whole patches, at least ``MIN_GRID`` patches a side and at most the weights'
    own, whose estimated fit (the images the recipe trains on, at that cost, at ``RATE_PER_CORE`` ViT-Ti/16 images
    at 96 px a second a core) takes at most ``FIT_MINUTES``; the smallest where none does.
"""

import dataclasses
import json
import os
import zipfile

from vit_keras.data.datasets import folder_split
from vit_keras.data.shards import open_shards
from vit_keras.models.configs import model_config
from vit_keras.weights.presets import find_preset

DEFAULT_SIDE = 224  # the usual pre-training size, for a checkpoint file that names none
MIN_GRID = 4
FIT_MINUTES = 20
# Training images a second a core, of a ViT-Ti/16 at 96 px: the low end of 145-230 on 2 cores (docs/benchmarks.md).
RATE_PER_CORE = 145 / 2
FASHION_MNIST_TRAIN = 60_000


def cost(side, patch, hidden_size, num_layers):
    """Relative training cost of one image: per block, 12 D^2 a token and 2 D a token pair (class token
    included)."""
    tokens = (side // patch) ** 2 + 1
    return num_layers * tokens * (12 * hidden_size ** 2 + 2 * tokens * hidden_size)


REFERENCE_COST = cost(96, 16, 192, 12)  # a ViT-Ti/16 at 96 px, which RATE_PER_CORE was measured on


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
    patch = vit["patch_size"] if isinstance(vit["patch_size"], int) else max(vit["patch_size"])
    shape = patch, vit["hidden_size"], vit["num_layers"]
    preset = find_preset(config.weights)
    if preset is not None:
        return (*shape, preset.image_size, f"preset {preset.name}'s own")
    return (*shape, DEFAULT_SIDE, "the usual pre-training size")


def training_images(config):
    """The training images a run has in one pass, counted (folders listed and shards' manifests read, nothing
    decoded)."""
    spec = config.data
    if spec.startswith("folder:"):
        count = len(folder_split(spec[len("folder:"):], "train", config.seed, config.val_fraction)[0])
    elif spec.startswith("shards:"):
        count = len(open_shards(spec[len("shards:"):], "train"))
    elif spec.startswith("tfds:"):
        import tensorflow_datasets as tfds

        splits = tfds.builder(spec[len("tfds:"):], data_dir=config.data_dir).info.splits
        count = int(splits["train"].num_examples * (1 - config.val_fraction if list(splits) == ["train"] else 1))
    else:
        count = FASHION_MNIST_TRAIN
    return min(count, config.limit or count)


def fit_seconds(images, side, shape, cores):
    """Estimated seconds to train on ``images`` images at ``side`` (shape: patch, width, depth) on ``cores``."""
    return images * cost(side, *shape) / REFERENCE_COST / (RATE_PER_CORE * cores)


def finetune_image_size(config, cores=None, accelerators=None, images=None):
    """(side, reason): the input size of a fine-tuning run with no ``image_size`` asked for. ``images``: the
    training images (default: counted from the data)."""
    return choose_image_size(config, cores, accelerators, images)[:2]


def choose_image_size(config, cores=None, accelerators=None, images=None):
    """``finetune_image_size``'s (side, reason), and the estimated seconds of the fit at that side (None with an
    accelerator, where nothing is estimated)."""
    patch, width, depth, native, what = pretrained_shape(config)
    accelerators = accelerator_count() if accelerators is None else accelerators
    if accelerators:
        return native, f"{what} ({accelerators} accelerator(s) found)", None
    cores = usable_cores() if cores is None else cores
    images = training_images(config) if images is None else images
    seen = config.epochs * config.steps_per_epoch(images) * config.batch_size
    sides = list(range(min(patch * MIN_GRID, native), native + 1, patch))
    fitting = [side for side in sides if fit_seconds(seen, side, (patch, width, depth), cores) <= FIT_MINUTES * 60]
    side = max(fitting, default=sides[0])
    seconds = fit_seconds(seen, side, (patch, width, depth), cores)
    return side, (f"the largest whose fit takes at most {FIT_MINUTES} min on {cores} CPU core(s): about "
                  f"{seconds / 60:.0f} min for {seen:,} training images (estimated from {RATE_PER_CORE:g} img/s a "
                  f"core for a ViT-Ti/16 at 96 px); at most {what}, {native}, at least {MIN_GRID}x{MIN_GRID} "
                  "patches"), seconds


def with_image_size(config):
    """(``config`` with the image size chosen for fine-tuning where none was asked for (printed, with why), the
    estimated seconds of its fit, or None where nothing was estimated)."""
    if config.recipe != "finetune" or config.image_size is not None:
        return config, None
    side, reason, seconds = choose_image_size(config)
    print(f"image size: {side}, {reason}; --image-size overrides it.")
    return dataclasses.replace(config, image_size=side), seconds


def compare_to_estimate(seconds, estimate):
    """One line: the fit's measured time against the estimate the image size was chosen by."""
    return (f"fit: {seconds / 60:.1f} min, against the {estimate / 60:.1f} min estimated when the image size was "
            f"chosen ({seconds / estimate - 1:+.0%})")
