"""What the input pipelines do to a batch, as two validated settings objects that every pipeline takes.

``Augmentation``: what happens to training images (crops, flips, RandAugment, random erasing, MixUp/CutMix).
``Batching``: the rest of a pipeline's settings (classes, the model's input, batch size, seed, one-hot labels,
training or evaluation). Both check their values when they are made, with errors naming the setting and its valid
values, so the tf.data pipelines (``vit_keras.data.pipeline``, ``vit_keras.data.stream``), the NumPy one
(``vit_keras.data.array_pipeline``) and ``TrainConfig`` check them once, the same way.
"""

import dataclasses
import numbers

import numpy as np

from vit_keras.constants import AUGMENTATIONS, CHANNEL_COUNTS
from vit_keras.validation import check_choice, pair

# Random erasing (Zhong et al. 2020): the erased rectangle's area fraction and aspect ratio (height / width).
ERASE_AREA = (0.02, 0.4)
ERASE_ASPECT = (0.3, 1 / 0.3)


def is_real(value):
    """A real number that is not a bool."""
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


def check_crop_scale(crop_scale):
    """``crop_scale`` as a [min, max] list of floats, or a clear error."""
    try:
        scale = [float(v) for v in np.ravel(crop_scale)]
    except (TypeError, ValueError):
        scale = []
    if len(scale) != 2 or not 0 < scale[0] <= scale[1] <= 1:
        raise ValueError(f"`crop_scale` must be (min, max) area fractions with 0 < min <= max <= 1; got {crop_scale}.")
    return scale


def check_bounds(name, value, test, bounds):
    """``value`` of setting ``name`` if it is a real number passing ``test``; else an error saying ``bounds``."""
    if not (is_real(value) and test(value)):
        raise ValueError(f"`{name}` must be {bounds}; got {value!r}.")
    return float(value)


@dataclasses.dataclass(frozen=True)
class Augmentation:
    """The augmentation of training batches; evaluation batches get none (``in_training``).

    augment: "none" | "flip" | "crop" (random-resized crop + flip) | "randaugment" (crop + flip + RandAugment).
    crop_scale: (min, max) fraction of the image's area that a random-resized crop keeps.
    flip: left-right flips where ``augment`` has them (off where flips change labels: ``vit_keras.data.flip_check``).
    mixup / cutmix: alpha of keras.layers.MixUp / factor of keras.layers.CutMix (0 = off); when both are on, each
      batch gets one of them at random. They mix labels, so they need one-hot labels.
    erase: the probability that a training image has a random rectangle replaced by noise (random erasing).
    """

    augment: str = "crop"
    crop_scale: tuple = (0.35, 1.0)
    flip: bool = True
    mixup: float = 0.0
    cutmix: float = 0.0
    erase: float = 0.0

    def __post_init__(self):
        check_choice(self.augment, "augment", AUGMENTATIONS)
        object.__setattr__(self, "crop_scale", tuple(check_crop_scale(self.crop_scale)))
        check_choice(self.flip, "flip", (True, False))
        for name in ("mixup", "cutmix"):
            object.__setattr__(self, name, check_bounds(name, getattr(self, name), lambda v: v >= 0, ">= 0"))
        object.__setattr__(self, "erase", check_bounds("erase", self.erase, lambda v: 0 <= v <= 1, "in [0, 1]"))

    @property
    def crops(self):
        return self.augment in ("crop", "randaugment")

    @property
    def flips(self):
        return self.augment != "none" and self.flip

    @property
    def mixes(self):
        return bool(self.mixup or self.cutmix)

    def in_training(self, training):
        """This augmentation for training batches; none for evaluation batches."""
        return self if training else NO_AUGMENTATION


NO_AUGMENTATION = Augmentation("none", flip=False)


@dataclasses.dataclass(frozen=True)
class Batching:
    """A pipeline's settings besides the augmentation; ``resolve`` fills the input size and channels from the data's.

    num_classes: labels are class indices in [0, num_classes).
    image_size: the model's input (h, w); None until resolved: the data's own size.
    channels: the model's input channels (1 or 3); None until resolved: the data's own.
    batch_size: the global batch size. seed: the shuffle and augmentation seed.
    training: shuffle and augment; otherwise in order, unaugmented.
    one_hot: labels as float one-hot vectors (needed by label smoothing, MixUp and a teacher) or int64.
    drop_remainder: drop a last partial batch (default: in training).
    """

    num_classes: int
    image_size: tuple | None = None
    channels: int | None = None
    batch_size: int = 128
    training: bool = False
    seed: int = 0
    one_hot: bool = True
    drop_remainder: bool | None = None

    def __post_init__(self):
        if not (isinstance(self.num_classes, numbers.Integral) and self.num_classes >= 1):
            raise ValueError(f"`num_classes` must be a positive int; got {self.num_classes!r}.")
        if not (is_real(self.batch_size) and int(self.batch_size) == self.batch_size and self.batch_size >= 1):
            raise ValueError(f"`batch_size` must be a positive int; got {self.batch_size}.")
        object.__setattr__(self, "num_classes", int(self.num_classes))
        object.__setattr__(self, "batch_size", int(self.batch_size))
        if self.image_size is not None:
            object.__setattr__(self, "image_size", pair(self.image_size, "image_size"))
        if self.channels is not None:
            check_choice(self.channels, "channels", CHANNEL_COUNTS)
        if not (isinstance(self.seed, numbers.Integral) and not isinstance(self.seed, bool)):
            raise ValueError(f"`seed` must be an int; got {self.seed!r}.")
        check_choice(self.training, "training", (True, False))
        check_choice(self.one_hot, "one_hot", (True, False))
        if self.drop_remainder is None:
            object.__setattr__(self, "drop_remainder", self.training)

    def resolve(self, image_shape):
        """These settings with the input size and channels that were left unset taken from the data's
        ``image_shape`` (h, w, c)."""
        return dataclasses.replace(self, image_size=self.image_size or tuple(image_shape[:2]),
                                   channels=self.channels or int(image_shape[2]))

    def check_targets(self, augmentation, teacher=None):
        """The labels these settings make suit ``augmentation`` and ``teacher``: both mix into one-hot targets."""
        if augmentation.mixes and not self.one_hot:
            raise ValueError("`mixup`/`cutmix` mix labels, so they need `one_hot=True`.")
        if teacher is not None and not self.one_hot:
            raise ValueError("`teacher` mixes its labels into the targets, so it needs `one_hot=True`.")

    def check_labels(self, labels):
        """``labels`` as int64 class indices in [0, num_classes), or a clear error."""
        labels = np.asarray(labels, np.int64)
        if labels.size and not 0 <= labels.min() <= labels.max() < self.num_classes:
            raise ValueError(f"`labels` must be class indices in [0, `num_classes`={self.num_classes}); got values "
                             f"in [{labels.min()}, {labels.max()}].")
        return labels

    def check_shards(self, count):
        """Each of ``count`` processes gets an equal part of every global batch."""
        if self.batch_size % count:
            raise ValueError(f"`batch_size`={self.batch_size} must be divisible by the {count} processes.")


def check_arrays(images, labels, batching):
    """(images as (N, H, W, C), int64 labels) for ``batching``, with clear errors."""
    images, labels = np.asarray(images), batching.check_labels(labels)
    if images.ndim == 3:
        images = images[..., None]
    if images.ndim != 4 or len(images) != len(labels):
        raise ValueError(f"Expected images (N, H, W, C) and labels (N,); got {images.shape} and {labels.shape}.")
    return images, labels


def pipeline_settings(num_classes, image_size, channels, batch_size, training, seed, augmentation, one_hot,
                      drop_remainder, teacher):
    """(Batching, Augmentation) from a pipeline function's keywords, checked; ``augmentation`` None: the default
    ``Augmentation()``, which only training batches get."""
    augmentation = Augmentation() if augmentation is None else augmentation
    if not isinstance(augmentation, Augmentation):
        raise ValueError(f"`augmentation` must be a vit_keras.data.augmentation.Augmentation or None; got "
                         f"{augmentation!r}.")
    batching = Batching(num_classes, image_size, channels, batch_size, training, seed, one_hot, drop_remainder)
    batching.check_targets(augmentation, teacher)
    return batching, augmentation.in_training(training)
