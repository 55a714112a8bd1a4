"""The input pipeline without TensorFlow: arrays -> augmented batches on any Keras backend, deterministic given a seed.
(Streams from disk: ``vit_keras.data.stream_batches``, the same batches of rows read as they are needed.)

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

from vit_keras.constants import LUMA_WEIGHTS
from vit_keras.data.augmentation import ERASE_AREA, ERASE_ASPECT, check_arrays, pipeline_settings
from vit_keras.data.targets import hard_targets

# Worker threads making batches ahead of the model (NumPy's kernels release the GIL), and batches queued.
WORKERS = max(1, min(os.cpu_count() or 1, 4))
QUEUED_BATCHES = 4


def make_batches(images, labels, num_classes, image_size=None, channels=None, batch_size=128, training=False, seed=0,
                 augmentation=None, one_hot=True, drop_remainder=None, shard=(0, 1), workers=WORKERS,
                 batches_per_epoch=None, teacher=None):
    """A ``keras.utils.PyDataset`` of (float32 images 0..255, labels) from uint8 arrays; the settings are
    ``vit_keras.data.pipeline.make_dataset``'s. ``shard``: (this process's index, process count): each process
    gets its rows of every global batch (``batch_size`` is global, divisible by the count).
    ``batches_per_epoch``: more batches an epoch than one pass holds (the step floor of small data): the data
    repeats, each pass in its own shuffle."""
    batching, augmentation = pipeline_settings(num_classes, image_size, channels, batch_size, training, seed,
                                               augmentation, one_hot, drop_remainder, teacher)
    images, labels = check_arrays(images, labels, batching)
    batching.check_shards(shard[1])
    return ArrayBatches(MemoryRows(images, labels), batching.resolve(images.shape[1:]), augmentation, shard, workers,
                        batches_per_epoch, teacher if training else None)


class MemoryRows:
    """Examples held in memory: uint8 images (N, H, W, C) and int64 labels, taken by row."""

    def __init__(self, images, labels):
        self.images, self.labels = images, labels

    def __len__(self):
        return len(self.labels)

    def take(self, rows):
        return self.images[rows], self.labels[rows]


class ArrayBatches(keras.utils.PyDataset):
    """Batches of ``rows`` (``MemoryRows`` or a stream's), made on demand (see ``make_batches``) for a resolved
    ``Batching`` and the ``Augmentation`` its batches get; ``on_epoch_end`` moves to the next epoch's shuffle and
    draws (Keras calls it after the epoch's worker threads have stopped). ``epoch``: the epoch to start at (a
    resumed run's)."""

    def __init__(self, rows, batching, augmentation, shard=(0, 1), workers=WORKERS, batches_per_epoch=None,
                 teacher=None, epoch=0):
        super().__init__(workers=workers, use_multiprocessing=False, max_queue_size=QUEUED_BATCHES)
        self.rows, self.batching, self.augmentation, self.shard = rows, batching, augmentation, shard
        self.size, self.seed = tuple(batching.image_size), batching.seed
        self.rand_augment = (SeededLayer("RandAugment", self.seed, per_image=True)
                             if augmentation.augment == "randaugment" else None)
        self.mixers = [SeededLayer(name, self.seed, **{key: value}) for name, key, value in
                       (("MixUp", "alpha", augmentation.mixup), ("CutMix", "factor", augmentation.cutmix)) if value]
        self.teacher = teacher
        self.epoch, self.orders, self.lock = epoch, {}, threading.Lock()
        self.batches_per_epoch = max(batches_per_epoch or 0, self.batches_per_pass())
        self.skip = 0  # the first epoch's batches left out (a stream resumed mid-epoch)

    def batches_per_pass(self):
        batches = len(self.rows) / self.batching.batch_size
        return int(batches) if self.batching.drop_remainder else math.ceil(batches)

    def __len__(self):
        return self.batches_per_epoch - self.skip

    def pass_order(self, data_pass):
        """A pass's example order: a permutation drawn from (seed, epoch, pass) in training, else as given."""
        if not self.batching.training:
            return np.arange(len(self.rows))
        key = (self.epoch, data_pass)
        with self.lock:
            if key not in self.orders:
                seed = [self.seed, self.epoch] if data_pass == 0 else [self.seed, self.epoch, data_pass]
                self.orders = {k: v for k, v in self.orders.items() if k[0] == self.epoch}
                self.orders[key] = np.random.default_rng(seed).permutation(len(self.rows))
            return self.orders[key]

    def __getitem__(self, index):
        if not 0 <= index < len(self):
            raise IndexError(f"batch {index} of {len(self)}")
        index += self.skip
        data_pass, within = divmod(index, self.batches_per_pass())
        size = self.batching.batch_size
        rows = self.pass_order(data_pass)[within * size:(within + 1) * size]
        part, parts = self.shard
        if parts > 1 and not self.batching.training:  # image by image: each process reads only its rows
            rows, parts = rows[part * (len(rows) // parts):(part + 1) * (len(rows) // parts)], 1
        x, y = self.rows.take(rows)
        x, y = self.transform(x.astype("float32"), y, np.random.default_rng([self.seed, self.epoch, index]))
        if parts > 1:  # training: mixing and a teacher see the whole batch, each process keeps its rows
            share = len(x) // parts
            x, y = x[part * share:(part + 1) * share], y[part * share:(part + 1) * share]
        return x, y

    def transform(self, x, y, rng):
        """One batch's steps, in the tf.data pipeline's order; every draw comes from ``rng``, in a fixed order."""
        augmentation = self.augmentation
        if augmentation.crops:
            x = random_resized_crop(x, self.size, augmentation.crop_scale, rng)
        x = fit_batch(x, self.size, self.batching.channels)
        if augmentation.flips:
            x = random_flip(x, rng)
        if self.rand_augment is not None:  # the only step that can leave 0..255 (the others interpolate)
            x = np.clip(self.rand_augment(seeds(rng, len(x)), x), 0.0, 255.0)
        if augmentation.erase:
            x = random_erase(x, augmentation.erase, rng)
        if self.batching.one_hot:
            y = np.eye(self.batching.num_classes, dtype="float32")[y]
        if self.mixers:
            mixer = self.mixers[int(rng.uniform() < 0.5)] if len(self.mixers) == 2 else self.mixers[0]
            out = mixer(seeds(rng, 1)[0], {"images": x, "labels": y})
            x, y = out["images"], out["labels"]
        if self.teacher is not None:  # the whole batch's: each process then keeps its rows
            y = keras.ops.convert_to_numpy(hard_targets(y, self.teacher(x, training=False)))
        return x, y

    def on_epoch_end(self):
        self.epoch, self.skip = self.epoch + 1, 0


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
    rows = sample_points(top, h, height, size[0])
    cols = sample_points(left, w, width, size[1])
    x = lerp_rows(x, *rows).transpose(0, 2, 1, 3)  # (n, W, out_h, C): the columns as rows
    return lerp_rows(np.ascontiguousarray(x), *cols).transpose(0, 2, 1, 3)


def sample_points(start, extent, pixels, out):
    """(index below, index above, weight of the one above), each (n, out): the two source pixels and their
    weights of each bilinear sample that ``interpolation_weights`` describes as a dense matrix."""
    centres = (start[:, None] + (np.arange(out) + 0.5) * (extent[:, None] / out)) * pixels - 0.5
    low = np.floor(centres)
    return (np.clip(low, 0, pixels - 1).astype(np.intp), np.clip(low + 1, 0, pixels - 1).astype(np.intp),
            (centres - low).astype("float32"))


def lerp_rows(x, below, above, weight):
    """``x`` (n, H, ...) sampled along its rows between rows ``below`` and ``above`` (n, out): whole rows are
    gathered (a dense matrix of the two weights a row would cost H times more)."""
    images = np.arange(len(x))[:, None]
    weight = weight.reshape(*weight.shape, *([1] * (x.ndim - 2)))
    return (1.0 - weight) * x[images, below] + weight * x[images, above]


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
