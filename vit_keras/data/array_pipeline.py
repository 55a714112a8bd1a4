"""The input pipeline without TensorFlow: arrays -> augmented batches on any Keras backend, deterministic given a seed.

    uint8 arrays -> shuffle (each epoch) -> batch -> [random-resized-crop | resize] -> channels (gray <-> RGB)
        -> flip -> [RandAugment] -> float32 0..255 -> [random erasing] -> [MixUp | CutMix]

The steps of the tf.data pipeline (``vit_keras.data.pipeline``, which TensorFlow runs keep), as a
``keras.utils.PyDataset``: crops, resizing and flips in NumPy, RandAugment, MixUp and CutMix by Keras's
own layers on the backend. Each batch draws from a generator seeded by (seed, epoch, batch index) alone,
so its content does not depend on which worker thread makes it, or when. The draws are not
TensorFlow's: the same seed gives other crops, of the same distribution.

The pixels match TensorFlow's where no randomness is involved: ``fit_batch`` resizes with
``tf.image.resize(antialias=True)``'s triangle filter and converts channels by the same luma weights;
a random-resized crop samples the pixel centres that ``pipeline.random_resized_crop`` samples, with
the edge pixel repeated beyond the image.
"""

import math
import os
import threading

import keras
import numpy as np

from vit_keras.constants import AUGMENTATIONS, LUMA_WEIGHTS
from vit_keras.data.targets import hard_targets
from vit_keras.validation import pair

# Random erasing (Zhong et al. 2020): the erased rectangle's area fraction and aspect ratio (height / width).
ERASE_AREA = (0.02, 0.4)
ERASE_ASPECT = (0.3, 1 / 0.3)

# Worker threads making batches ahead of the model (NumPy's kernels release the GIL), and batches queued.
WORKERS = max(1, min(os.cpu_count() or 1, 4))
QUEUED_BATCHES = 4


def check_crop_scale(crop_scale):
    """``crop_scale`` as a [min, max] list of floats, or a clear error."""
    scale = [float(v) for v in np.ravel(crop_scale)]
    if len(scale) != 2 or not 0 < scale[0] <= scale[1] <= 1:
        raise ValueError(f"`crop_scale` must be (min, max) area fractions with 0 < min <= max <= 1; got {crop_scale}.")
    return scale


def check_arrays(images, labels, num_classes, batch_size, augment, mixup, cutmix, one_hot, teacher=None, erase=0.0):
    """(images as (N, H, W, C), int64 labels) after the checks both pipelines make, with clear errors."""
    if not 0 <= erase <= 1:
        raise ValueError(f"`erase` is the probability that an image has a rectangle erased, in [0, 1]; got {erase}.")
    if augment not in AUGMENTATIONS:
        raise ValueError(f"Unknown `augment`={augment!r}; valid values are {', '.join(map(repr, AUGMENTATIONS))}.")
    if (mixup or cutmix) and not one_hot:
        raise ValueError("`mixup`/`cutmix` mix labels, so they need `one_hot=True`.")
    if teacher is not None and not one_hot:
        raise ValueError("`teacher` mixes its labels into the targets, so it needs `one_hot=True`.")
    images, labels = np.asarray(images), np.asarray(labels, np.int64)
    if int(num_classes) < 1 or (labels.size and not 0 <= labels.min() <= labels.max() < int(num_classes)):
        raise ValueError(f"`labels` must be class indices in [0, `num_classes`={num_classes}); got values in "
                         f"[{labels.min() if labels.size else '-'}, {labels.max() if labels.size else '-'}].")
    if mixup < 0 or cutmix < 0:
        raise ValueError(f"`mixup` and `cutmix` must be >= 0 (0 = off); got {mixup} and {cutmix}.")
    if images.ndim == 3:
        images = images[..., None]
    if images.ndim != 4 or len(images) != len(labels):
        raise ValueError(f"Expected images (N, H, W, C) and labels (N,); got {images.shape} and {labels.shape}.")
    if int(batch_size) != batch_size or int(batch_size) < 1:
        raise ValueError(f"`batch_size` must be a positive int; got {batch_size}.")
    return images, labels


def make_batches(images, labels, num_classes, image_size=None, channels=None, batch_size=128, training=False, seed=0,
                 augment="crop", crop_scale=(0.35, 1.0), flip=True, mixup=0.0, cutmix=0.0, one_hot=True,
                 drop_remainder=None, shard=(0, 1), workers=WORKERS, batches_per_epoch=None, teacher=None, erase=0.0):
    """A ``keras.utils.PyDataset`` of (float32 images 0..255, labels) from uint8 arrays; the arguments are
    ``vit_keras.data.pipeline.make_dataset``'s. ``shard``: (this process's index, process count): each process
    gets its rows of every global batch (``batch_size`` is global, divisible by the count).
    ``batches_per_epoch``: more batches an epoch than one pass holds (the step floor of small data): the data
    repeats, each pass in its own shuffle."""
    crop_scale = check_crop_scale(crop_scale)
    images, labels = check_arrays(images, labels, num_classes, batch_size, augment, mixup, cutmix, one_hot, teacher,
                                  erase)
    index, count = shard
    if int(batch_size) % count:
        raise ValueError(f"`batch_size`={batch_size} must be divisible by the {count} processes.")
    size = pair(image_size, "image_size") if image_size is not None else images.shape[1:3]
    return ArrayBatches(images, labels, int(num_classes), size, int(channels or images.shape[-1]), int(batch_size),
                        training, seed, augment if training else "none", crop_scale, flip,
                        (mixup, cutmix) if training else (0, 0), one_hot,
                        training if drop_remainder is None else drop_remainder, (index, count), workers,
                        batches_per_epoch, teacher if training else None, float(erase) if training else 0.0)


class ArrayBatches(keras.utils.PyDataset):
    """Batches of uint8 arrays, made on demand (see ``make_batches``); ``on_epoch_end`` moves to the next epoch's
    shuffle and draws (Keras calls it after the epoch's worker threads have stopped)."""

    def __init__(self, images, labels, num_classes, size, channels, batch_size, training, seed, augment, crop_scale,
                 flip, mix, one_hot, drop_remainder, shard, workers, batches_per_epoch=None, teacher=None, erase=0.0):
        super().__init__(workers=workers, use_multiprocessing=False, max_queue_size=QUEUED_BATCHES)
        self.images, self.labels, self.num_classes = images, labels, num_classes
        self.size, self.channels, self.batch_size = tuple(size), channels, batch_size
        self.training, self.seed, self.augment, self.crop_scale, self.flip = training, seed, augment, crop_scale, flip
        self.one_hot, self.drop_remainder, self.shard = one_hot, drop_remainder, shard
        self.rand_augment = SeededLayer("RandAugment", seed, per_image=True) if augment == "randaugment" else None
        self.mixers = [SeededLayer(name, seed, **{key: float(value)})
                       for name, key, value in (("MixUp", "alpha", mix[0]), ("CutMix", "factor", mix[1])) if value]
        self.teacher, self.erase = teacher, erase
        self.epoch, self.orders, self.lock = 0, {}, threading.Lock()
        self.batches_per_epoch = max(batches_per_epoch or 0, self.batches_per_pass())

    def batches_per_pass(self):
        batches = len(self.images) / self.batch_size
        return int(batches) if self.drop_remainder else math.ceil(batches)

    def __len__(self):
        return self.batches_per_epoch

    def pass_order(self, data_pass):
        """A pass's example order: a permutation drawn from (seed, epoch, pass) in training, else as given."""
        if not self.training:
            return np.arange(len(self.images))
        key = (self.epoch, data_pass)
        with self.lock:
            if key not in self.orders:
                seed = [self.seed, self.epoch] if data_pass == 0 else [self.seed, self.epoch, data_pass]
                self.orders = {k: v for k, v in self.orders.items() if k[0] == self.epoch}
                self.orders[key] = np.random.default_rng(seed).permutation(len(self.images))
            return self.orders[key]

    def __getitem__(self, index):
        if not 0 <= index < len(self):
            raise IndexError(f"batch {index} of {len(self)}")
        data_pass, within = divmod(index, self.batches_per_pass())
        rows = self.pass_order(data_pass)[within * self.batch_size:(within + 1) * self.batch_size]
        x, y = self.transform(self.images[rows].astype("float32"), self.labels[rows],
                              np.random.default_rng([self.seed, self.epoch, index]))
        part, parts = self.shard
        if parts > 1:
            share = len(x) // parts
            x, y = x[part * share:(part + 1) * share], y[part * share:(part + 1) * share]
        return x, y

    def transform(self, x, y, rng):
        """One batch's steps, in the tf.data pipeline's order; every draw comes from ``rng``, in a fixed order."""
        if self.augment in ("crop", "randaugment"):
            x = random_resized_crop(x, self.size, self.crop_scale, rng)
        x = fit_batch(x, self.size, self.channels)
        if self.augment != "none" and self.flip:
            x = random_flip(x, rng)
        if self.rand_augment is not None:  # the only step that can leave 0..255 (the others interpolate)
            x = np.clip(self.rand_augment(seeds(rng, len(x)), x), 0.0, 255.0)
        if self.erase:
            x = random_erase(x, self.erase, rng)
        if self.one_hot:
            y = np.eye(self.num_classes, dtype="float32")[y]
        if self.mixers:
            mixer = self.mixers[int(rng.uniform() < 0.5)] if len(self.mixers) == 2 else self.mixers[0]
            out = mixer(seeds(rng, 1)[0], {"images": x, "labels": y})
            x, y = out["images"], out["labels"]
        if self.teacher is not None:  # the whole batch's: each process then keeps its rows
            y = keras.ops.convert_to_numpy(hard_targets(y, self.teacher(x, training=False)))
        return x, y

    def on_epoch_end(self):
        self.epoch += 1


def seeds(rng, count):
    """``count`` (2,) seeds for Keras's stateless random ops, in the range every backend's seed type holds."""
    return rng.integers(0, 2**31 - 1, (count, 2)).astype("int32")


class SeededLayer:
    """A Keras random preprocessing layer (``keras.layers.<name>``) called with the seed given, statelessly: the
    same seed, the same draw, from any thread. ``per_image``: each image of a batch with its own seed (a batch
    call draws one set of RandAugment ops for all of it). Compiled under JAX (vmapped over the images)."""

    def __init__(self, name, seed, per_image=False, **options):
        self.name, self.seed, self.per_image, self.options = name, seed, per_image, options
        self.lock, self.apply = threading.Lock(), None

    def __call__(self, seed, data):
        with self.lock:  # the first call builds; Keras's eager backends are not thread-safe either
            if self.apply is None:
                self.apply = self.build(data)
            out = self.apply(np.asarray(seed, "int32"), data)
            return keras.tree.map_structure(lambda t: np.asarray(keras.ops.convert_to_numpy(t)), out)

    def build(self, data):
        extra = {"value_range": (0, 255)} if self.name == "RandAugment" else {}
        layer = getattr(keras.layers, self.name)(seed=self.seed, **extra, **self.options)
        images = data["images"] if isinstance(data, dict) else data
        layer.build(images.shape[1:] if self.per_image else images.shape)
        state = [v.path for v in layer.non_trainable_variables].index(layer.generator.state.path)
        values = [v.value for v in layer.non_trainable_variables]
        seed_dtype = layer.generator.state.dtype

        def call(seed, inputs):
            moved = list(values)
            moved[state] = keras.ops.cast(seed, seed_dtype)
            inputs = dict(inputs) if isinstance(inputs, dict) else inputs  # the layer writes into a dict input
            return layer.stateless_call([], moved, inputs, training=True)[0]

        if keras.backend.backend() == "jax":
            import jax

            return jax.jit(jax.vmap(call) if self.per_image else call)
        if keras.backend.backend() == "tensorflow":  # a graph: RandAugment op by op is slow eagerly
            import tensorflow as tf

            call = tf.function(call, autograph=False)
        if self.per_image:
            return lambda seed, images: np.stack([keras.ops.convert_to_numpy(call(s, image))
                                                  for s, image in zip(seed, images)])
        return call


def random_resized_crop(x, size, scale, rng, ratio=(3 / 4, 4 / 3)):
    """Inception-style crop of each image: area in ``scale``, aspect ratio in ``ratio``, resized to ``size``
    by bilinear sampling at the output pixels' centres (the edge pixel repeats beyond the image)."""
    n, height, width = x.shape[:3]
    area = rng.uniform(scale[0], scale[1], n)
    aspect = np.exp(rng.uniform(np.log(ratio[0]), np.log(ratio[1]), n))
    h, w = np.minimum(np.sqrt(area / aspect), 1.0), np.minimum(np.sqrt(area * aspect), 1.0)
    top, left = rng.uniform(size=n) * (1.0 - h), rng.uniform(size=n) * (1.0 - w)
    rows = interpolation_weights(top, h, height, size[0])
    cols = interpolation_weights(left, w, width, size[1])
    return separable(x, rows, cols)


def interpolation_weights(start, extent, pixels, out):
    """(n, out, pixels) bilinear weights: output pixel i samples the source at the centre of its share of the
    crop [start, start + extent) (fractions of the side), clamped to the edge pixels."""
    centres = (start[:, None] + (np.arange(out) + 0.5) * (extent[:, None] / out)) * pixels - 0.5
    low = np.floor(centres)
    frac = (centres - low)[..., None]
    grid = np.arange(pixels)
    below = grid == np.clip(low, 0, pixels - 1)[..., None]
    above = grid == np.clip(low + 1, 0, pixels - 1)[..., None]
    return ((1.0 - frac) * below + frac * above).astype("float32")


def separable(x, rows, cols):
    """Apply (n, H', H) row and (n, W', W) column weights to (n, H, W, C) images: (n, H', W', C)."""
    n, height, width, channels = x.shape
    x = np.matmul(rows, x.reshape(n, height, width * channels)).reshape(n, -1, width, channels)
    return np.einsum("npw,nhwc->nhpc", cols, x, optimize=True)


def random_flip(x, rng):
    """Left-right flip of a random half of the batch."""
    coin = rng.uniform(size=len(x)) < 0.5
    x = x.copy()
    x[coin] = x[coin, :, ::-1]
    return x


def random_erase(x, probability, rng):
    """Random erasing: with ``probability``, a rectangle of each image (area fraction in ``ERASE_AREA``, aspect
    in ``ERASE_ASPECT``, clipped to the image) becomes uniform noise in 0..255. It hides part of the object but
    cannot turn it into another class, so the label stays."""
    n, height, width = x.shape[:3]
    erased = rng.uniform(size=n) < probability
    area = rng.uniform(*ERASE_AREA, n)
    aspect = np.exp(rng.uniform(np.log(ERASE_ASPECT[0]), np.log(ERASE_ASPECT[1]), n))
    h, w = np.minimum(np.sqrt(area * aspect), 1.0), np.minimum(np.sqrt(area / aspect), 1.0)
    top, left = rng.uniform(size=n) * (1.0 - h), rng.uniform(size=n) * (1.0 - w)
    noise = rng.uniform(0.0, 255.0, x.shape).astype(x.dtype)
    rows = (np.arange(height) + 0.5) / height
    cols = (np.arange(width) + 0.5) / width
    inside = ((rows >= top[:, None]) & (rows < (top + h)[:, None]))[:, :, None] & \
             ((cols >= left[:, None]) & (cols < (left + w)[:, None]))[:, None, :]
    return np.where((erased[:, None, None] & inside)[..., None], noise, x)


def resize_weights(source, target):
    """(target, source) weights of ``tf.image.resize(antialias=True)``'s bilinear (triangle) filter: widened by
    the downscale factor, renormalized over the pixels inside the image."""
    scale = target / source
    kernel = max(1.0 / scale, 1.0)
    centres = (np.arange(target) + 0.5) / scale
    weights = np.maximum(0.0, 1.0 - np.abs(np.arange(source)[None, :] + 0.5 - centres[:, None]) / kernel)
    return (weights / weights.sum(1, keepdims=True)).astype("float32")


def fit_batch(x, size, channels):
    """A float batch at ``size`` (antialiased resize where it differs) with the model's ``channels``: the pixels
    of ``vit_keras.data.pipeline.fit_batch``, without TensorFlow."""
    n, height, width = x.shape[:3]
    if (height, width) != tuple(size):
        rows, cols = resize_weights(height, size[0]), resize_weights(width, size[1])
        x = separable(x, np.broadcast_to(rows, (n, *rows.shape)), np.broadcast_to(cols, (n, *cols.shape)))
    return convert_channels(x, channels)


def convert_channels(x, channels):
    """Gray -> RGB by repetition, RGB -> gray by luma (``LUMA_WEIGHTS``), as the model's input wants."""
    have = x.shape[-1]
    if have == channels:
        return x
    if have == 1 and channels == 3:
        return np.repeat(x, 3, axis=-1)
    if have == 3 and channels == 1:
        return np.tensordot(x, np.asarray(LUMA_WEIGHTS, x.dtype), axes=[[-1], [0]])[..., None]
    raise ValueError(f"Cannot convert images with {have} channels to the model's {channels}.")
