"""Fine-tuning pretrained weights: the input size a run uses when none is asked for, and its epochs where they
are left to the recipe, chosen for the data and the machine.

The position embedding is resampled to any patch grid (``vit_keras.models.position``), so a pretrained ViT
fine-tunes at any size that holds whole patches, and a larger one is more accurate (docs/benchmarks.md,
"Fine-tuning a pretrained ViT") but slower: per image, each block costs about 12 D^2 a token (projections, MLP)
plus 2 D a token pair (attention). So:

  * with an accelerator (GPU, TPU): the weights' own size (a preset's; a .keras model's; else 224);
  * on CPUs: the largest size, in whole patches, at least ``MIN_GRID`` patches a side and at most the weights'
    own, whose estimated fit takes at most ``FIT_MINUTES``; the smallest where none does. The estimate counts the
    images the recipe trains on and validates, at seconds an image measured by a short warm-up on this machine
    (``vit_keras.training.warmup``) and scaled to other sizes by that cost; without a warm-up, at
    ``RATE_PER_CORE`` ViT-Ti/16 images at 96 px a second a core. Where the epochs are the recipe's, the size is
    the largest at which ``FEWEST_EPOCHS`` fit, and the run takes as many of the recipe's epochs as fit at it:
    one pass at 128 px beat three at 80 in the same minutes (docs/benchmarks.md#one-pass-at-a-larger-size).
"""

import dataclasses
import json
import os
import zipfile

from vit_keras.data.datasets import folder_split
from vit_keras.devices import accelerator_count
from vit_keras.data.shards import open_shards
from vit_keras.models.configs import model_config
from vit_keras.models.layers import kept_patches
from vit_keras.validation import pair
from vit_keras.weights.presets import find_preset

DEFAULT_SIDE = 224  # the usual pre-training size, for a checkpoint file that names none
MIN_GRID = 4
FIT_MINUTES = 20
FEWEST_EPOCHS = 1  # a fine-tune that leaves its epochs to the recipe runs at least one
# Training images a second a core, of a ViT-Ti/16 at 96 px: the low end of 145-230 on 2 cores (docs/benchmarks.md).
RATE_PER_CORE = 145 / 2
FASHION_MNIST_IMAGES = {"train": 60_000, "val": 10_000}  # val is its test set


def cost(side, patch, hidden_size, num_layers, patch_dropout=0.0):
    """Relative cost of one image: per block, 12 D^2 a token and 2 D a token pair (class token included); in
    training under ``patch_dropout`` the tokens are the kept ones."""
    tokens = kept_patches((side // patch) ** 2, patch_dropout) + 1
    return num_layers * tokens * (12 * hidden_size ** 2 + 2 * tokens * hidden_size)


REFERENCE_COST = cost(96, 16, 192, 12)  # a ViT-Ti/16 at 96 px, which RATE_PER_CORE was measured on


def usable_cores():
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1


def saved_config(path):
    """A .keras file's VisionTransformer config, read from its config.json without building the model."""
    with zipfile.ZipFile(path) as archive:
        return json.loads(archive.read("config.json"))["config"]


def model_shape(vit, what="the model's own size"):
    """(patch, width, depth, side, ``what`` that side is) of the model ``vit`` (its config). A hybrid's patch is
    its stem's stride (the encoder takes 1x1 patches of its feature map)."""
    patch = vit["patch_size"] if isinstance(vit["patch_size"], int) else max(vit["patch_size"])
    return patch, vit["hidden_size"], vit["num_layers"], max(pair(vit["image_size"], "image_size")), what


def pretrained_shape(config):
    """``model_shape`` of a fine-tuning run's model, its side the weights' own."""
    if str(config.weights).endswith(".keras"):
        return model_shape(saved_config(config.weights), "the saved model's size")
    vit = model_config(config.model_name, **{key: value for key, value in (config.model_overrides or {}).items()
                                             if key in ("patch_size", "hidden_size", "num_layers")})
    patch = vit["patch_size"] if isinstance(vit["patch_size"], int) else max(vit["patch_size"])
    shape = patch, vit["hidden_size"], vit["num_layers"]
    preset = find_preset(config.weights)
    if preset is not None:
        return (*shape, preset.image_size, f"preset {preset.name}'s own")
    return (*shape, DEFAULT_SIDE, "the usual pre-training size")


def split_images(config, split="train"):
    """The images a run has in one pass of ``split`` ("train" or "val"), counted (folders listed and shards'
    manifests read, nothing decoded)."""
    spec = config.data
    if spec.startswith("folder:"):
        count = len(folder_split(spec[len("folder:"):], split, config.seed, config.val_fraction)[0])
    elif spec.startswith("shards:"):
        count = len(open_shards(spec[len("shards:"):], split))
    elif spec.startswith("tfds:"):
        import tensorflow_datasets as tfds

        splits = tfds.builder(spec[len("tfds:"):], data_dir=config.data_dir).info.splits
        given = {"train": "train", "val": "validation" if "validation" in splits else "test"}[split]
        if given in splits and (split == "val" or list(splits) != ["train"]):
            count = splits[given].num_examples
        else:  # a seeded part of train is held out
            share = config.val_fraction if split == "val" else 1 - config.val_fraction
            count = int(splits["train"].num_examples * share)
    else:
        count = FASHION_MNIST_IMAGES[split]
    return min(count, config.limit or count)


@dataclasses.dataclass(frozen=True)
class StepTimes:
    """Seconds a training image (``train``) and a validation image (``evaluate``) take at ``side`` px, the
    seconds compiling the two steps took (``compile``), and the seconds the measurement itself took."""
    side: int
    train: float
    evaluate: float
    compile: float
    measured_in: float = 0.0

    def at(self, side, shape, patch_dropout=0.0):
        """These times scaled to ``side`` by the cost model (``cost``; shape: patch, width, depth), training's
        under ``patch_dropout`` (validation sees every token)."""
        train = cost(side, *shape, patch_dropout) / cost(self.side, *shape, patch_dropout)
        evaluate = cost(side, *shape) / cost(self.side, *shape)
        return dataclasses.replace(self, side=side, train=self.train * train, evaluate=self.evaluate * evaluate)

    def fit_seconds(self, trained, validated):
        return trained * self.train + validated * self.evaluate + self.compile


def fit_seconds(images, side, shape, cores, patch_dropout=0.0):
    """Estimated seconds to train on ``images`` images at ``side`` (shape: patch, width, depth) on ``cores``."""
    return images * cost(side, *shape, patch_dropout) / REFERENCE_COST / (RATE_PER_CORE * cores)


def finetune_image_size(config, cores=None, accelerators=None, images=None):
    """(side, reason): the input size of a fine-tuning run with no ``image_size`` asked for, by the table rate.
    ``images``: the training images (default: counted from the data)."""
    choice = choose_image_size(config, cores, accelerators, images)
    return choice.side, choice.reason


def largest_within(sides, seconds):
    """The largest of ``sides`` whose ``seconds(side)`` is at most ``FIT_MINUTES``; the smallest where none is."""
    return max((side for side in sides if seconds(side) <= FIT_MINUTES * 60), default=sides[0])


def epoch_choices(config):
    """The epochs a fine-tune may run, most first: the recipe's down to ``FEWEST_EPOCHS`` where the epochs were
    left to it (a larger image in fewer epochs: resolution mattered more than passes), else those asked for."""
    if "epochs" not in config.from_recipe:
        return [config.epochs]
    return list(range(config.epochs, min(FEWEST_EPOCHS, config.epochs) - 1, -1))


@dataclasses.dataclass(frozen=True)
class FitChoice:
    """A fine-tune's input ``side`` and ``epochs``, why (``reason``), and its fit's estimated ``seconds`` (None
    with an accelerator, where nothing is estimated)."""
    side: int
    epochs: int
    reason: str
    seconds: float | None = None

    def line(self):
        """The choice and why, as a run prints it."""
        return f"image size: {self.side}, {self.epochs} epoch(s): {self.reason}"


@dataclasses.dataclass(frozen=True)
class SizeSearch:
    """What a fine-tune on CPUs chooses from: the ``sides`` (in whole patches) and epoch ``choices`` (most first) of
    ``config``'s run on ``images`` training images of a model of ``shape`` (patch, width, depth)."""
    config: object
    shape: tuple
    sides: list
    choices: list
    images: int

    @property
    def dropout(self):
        """The share of patch tokens a training step drops (what it costs counts the kept ones)."""
        return self.config.patch_dropout or 0.0

    def trained(self, epochs):
        """The images ``epochs`` epochs train on (the step floor may repeat the data)."""
        return epochs * self.config.steps_per_epoch(self.images, epochs) * self.config.batch_size

    def largest(self, seconds):
        """The largest side at which the fewest epochs fit, by ``seconds(side, epochs)``."""
        return largest_within(self.sides, lambda side: seconds(side, self.choices[-1]))

    def most_epochs(self, seconds, side):
        """(epochs, their seconds): the most of ``choices`` that fit at ``side``; the fewest where none does."""
        epochs = max((epochs for epochs in self.choices if seconds(side, epochs) <= FIT_MINUTES * 60),
                     default=self.choices[-1])
        return epochs, seconds(side, epochs)


def choose_image_size(config, cores=None, accelerators=None, images=None, measure=None, shape=None,
                      val_images=None):
    """The ``FitChoice`` of a fine-tune with no ``image_size`` asked for: on CPUs the largest side at which the
    fewest epochs it may run (``epoch_choices``) fit ``FIT_MINUTES``, then the most epochs that fit at that side.
    ``measure``: side -> ``StepTimes`` measured on this machine (``vit_keras.training.warmup.step_times``), at the
    table's choice and, where the measurement moves it, at the new one; without it, the table rate. ``shape``:
    the model's (patch, width, depth, its own side, what that side is) (default: ``pretrained_shape``);
    ``images``, ``val_images``: the training and validation images (default: counted from the data)."""
    patch, width, depth, native, what = pretrained_shape(config) if shape is None else shape
    accelerators = accelerator_count() if accelerators is None else accelerators
    if accelerators:
        return FitChoice(native, config.epochs, f"{what} ({accelerators} accelerator(s) found)")
    cores = usable_cores() if cores is None else cores
    search = SizeSearch(config, (patch, width, depth), list(range(min(patch * MIN_GRID, native), native + 1, patch)),
                        epoch_choices(config), split_images(config) if images is None else images)
    bounds = f"at most {what}, {native}, at least {MIN_GRID}x{MIN_GRID} patches"
    table = table_choice(search, cores, bounds)
    if measure is None:
        return table
    val_images = split_images(config, "val") if val_images is None else val_images
    return measured_choice(search, measure, table.side, val_images, bounds)


def table_choice(search, cores, bounds):
    """The ``FitChoice`` by the table rate (``RATE_PER_CORE``) on ``cores`` cores."""

    def seconds(side, epochs):
        return fit_seconds(search.trained(epochs), side, search.shape, cores, search.dropout)

    side = search.largest(seconds)
    epochs, total = search.most_epochs(seconds, side)
    return FitChoice(side, epochs, f"{fits(search.choices, epochs, f'on {cores} CPU core(s)')}: about "
                     f"{total / 60:.0f} min for {search.trained(epochs):,} training images (estimated from "
                     f"{RATE_PER_CORE:g} img/s a core for a ViT-Ti/16 at 96 px); {bounds}", total)


def measured_choice(search, measure, first_side, val_images, bounds):
    """The ``FitChoice`` by steps timed here: ``measure`` at ``first_side`` (the table's choice), then at the side
    that measurement points to where it differs; each side estimated from the measurement nearest in size."""
    measured = [measure(first_side)]

    def nearest(side):
        return min(measured, key=lambda times: abs(times.side - side))

    def seconds(side, epochs):
        return nearest(side).at(side, search.shape, search.dropout).fit_seconds(search.trained(epochs),
                                                                               epochs * val_images)

    better = search.largest(seconds)
    if better != first_side:
        measured.append(measure(better))
    side = search.largest(seconds)
    epochs, total = search.most_epochs(seconds, side)
    times = nearest(side)
    return FitChoice(side, epochs, f"{fits(search.choices, epochs, 'here')}: about {total / 60:.1f} min for "
                     f"{search.trained(epochs):,} training and {epochs * val_images:,} validation images, at "
                     f"{1 / times.train:.1f} and {1 / times.evaluate:.1f} img/s at {times.side} px, measured by a "
                     f"{sum(times.measured_in for times in measured):.0f} s warm-up; {bounds}", total)


def fits(choices, epochs, where):
    """Why this size and ``epochs`` (of ``choices``, ``epoch_choices``), in words."""
    if len(choices) == 1:
        return f"the largest at which the {epochs} epoch(s) asked for fit {FIT_MINUTES} min {where}"
    return (f"the largest at which {choices[-1]} epoch(s) fit {FIT_MINUTES} min {where}, and the most epochs of the "
            f"recipe's {choices[0]} that fit at it")


def with_image_size(config, measure=None, recorded=None):
    """(``config`` with the image size and epochs chosen for fine-tuning where no size was asked for (printed,
    with why), the estimated seconds of its fit, or None where nothing was estimated). ``measure``: see
    ``choose_image_size``; ``recorded``: the choices of the run being resumed (``image_size``, and ``epochs`` and
    ``warmup_epochs`` where the recipe's: a rerun goes on with them)."""
    if config.recipe != "finetune" or config.image_size is not None:
        return config, None
    if recorded and recorded.get("image_size"):
        kept = {name: value for name, value in recorded.items()
                if name == "image_size" or name in config.from_recipe and value is not None}
        print(f"image size: {recorded['image_size']}, epochs: {kept.get('epochs', config.epochs)}, as the run being "
              "resumed chose; --image-size and --epochs override them.")
        return config.chosen(**kept), None
    choice = choose_image_size(config, measure=measure)
    print(f"{choice.line()}; --image-size and --epochs override them.")
    return config.chosen(image_size=choice.side, **fewer_epochs(config, choice.epochs)), choice.seconds


def fewer_epochs(config, epochs):
    """The settings of ``config`` with ``epochs`` in place of the recipe's: the warm-up keeps its share of the
    run where the recipe set it."""
    if epochs == config.epochs:
        return {}
    if "warmup_epochs" not in config.from_recipe:
        return dict(epochs=epochs)
    return dict(epochs=epochs, warmup_epochs=config.warmup_epochs * epochs / config.epochs)


def compare_to_estimate(seconds, estimate):
    """One line: the fit's measured time against the estimate the image size was chosen by."""
    return (f"fit: {seconds / 60:.1f} min, against the {estimate / 60:.1f} min estimated when the image size was "
            f"chosen ({seconds / estimate - 1:+.0%})")
