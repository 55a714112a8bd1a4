"""The tf.data input pipeline: arrays -> augmented batches, deterministic given a seed.

    uint8 arrays -> cache -> shuffle -> batch -> [random-resized-crop | resize]
        -> channels (gray <-> RGB) -> flip -> [RandAugment] -> float32 0..255
        -> [random erasing] -> [MixUp | CutMix] -> [a teacher's labels mixed in] -> prefetch

Images are decoded once by ``vit_keras.data.datasets`` (streams: ``vit_keras.data.stream`` decodes them on the
way and hands its batches to ``augment_batches``); every step here works on whole
batches (``tf.image.crop_and_resize`` with per-image random boxes, stateless
random ops seeded per batch) so a 2-core CPU spends its time in the model, not
here. Normalization is left to the model (``include_preprocessing=True`` maps
0..255 to -1..1), so exported models take raw pixels. The other Keras backends
train from ``vit_keras.data.array_pipeline``: the same steps in NumPy, without TensorFlow.
"""

import os

import keras
import numpy as np
import tensorflow as tf

from vit_keras.data.augmentation import ERASE_AREA, ERASE_ASPECT, check_arrays, pipeline_settings
from vit_keras.data.targets import hard_targets
from vit_keras.validation import pair

# Fixed parallelism instead of tf.data's autotuning: destroying an autotuned iterator, which Keras does
# at every epoch's start, waited on a tf.data thread and left the quick recipe idle for seconds each epoch
# (a fifth of its training time). The steps work on whole batches, so a map over the cores and two
# batches in the queue keep up with the model.
PARALLEL_BATCHES = max(1, min(os.cpu_count() or 1, 16))
PREFETCH_BATCHES = 2
EXAMPLE_SHUFFLE = 10_000  # examples a tf.data.Dataset handed to ``example_batches`` is shuffled over


def make_dataset(images, labels, num_classes, image_size=None, channels=None, batch_size=128, training=False, seed=0,
                 augmentation=None, one_hot=True, drop_remainder=None, repeat=False, teacher=None):
    """A batched ``tf.data.Dataset`` of (float32 images 0..255, labels) from uint8 arrays.

    The settings are ``vit_keras.data.augmentation.Batching``'s (num_classes ... drop_remainder) and an
    ``Augmentation`` (None: the default one), which only training batches get.
    repeat: the data repeats, each pass in its own shuffle (the step floor of small data).
    teacher: a Keras classifier of the batches; in training each batch's targets become
      ``vit_keras.training.distill.hard_targets`` of the labels and its predictions (DeiT's hard distillation).
    """
    batching, augmentation = pipeline_settings(num_classes, image_size, channels, batch_size, training, seed,
                                               augmentation, one_hot, drop_remainder, teacher)
    images, labels = check_arrays(images, labels, batching)
    batching = batching.resolve(images.shape[1:])
    dataset = tf.data.Dataset.from_tensor_slices((images, labels)).cache()
    return batched(dataset, batching, augmentation, min(len(images), 50_000), repeat, teacher)


def batched(dataset, batching, augmentation, shuffle_buffer, repeat=False, teacher=None):
    """(image, label) examples -> the augmented batches of a resolved ``batching`` (``augment_batches``): in
    training shuffled (``shuffle_buffer`` examples; a new order each pass), repeated where asked."""
    if batching.training:
        dataset = dataset.shuffle(shuffle_buffer, seed=batching.seed, reshuffle_each_iteration=True)
    if repeat:
        dataset = dataset.repeat()
    dataset = dataset.batch(batching.batch_size, drop_remainder=batching.drop_remainder)
    # One stateless seed per batch, different every epoch, the same for every run with this seed.
    batch_seeds = tf.data.Dataset.random(seed=batching.seed, rerandomize_each_iteration=True).batch(2)
    dataset = augment_batches(tf.data.Dataset.zip((dataset, batch_seeds)), batching, augmentation, teacher)
    return finish(dataset, tf.data.experimental.AutoShardPolicy.DATA)


def example_batches(dataset, batching, augmentation, steps=None):
    """Batches of a ``tf.data.Dataset`` of (image, int label) examples (images 0-255, uint8 or float) for a
    ``Batching`` whose channels are unset (the data's); images of differing sizes need its ``image_size``, to
    which each is resized. Training: shuffled, and ``steps`` batches each time it is iterated (repeating)."""
    spec = dataset.element_spec
    if not (isinstance(spec, tuple) and len(spec) == 2 and spec[0].shape.rank == 3 and spec[0].shape[-1]):
        raise ValueError(f"`data` must be a tf.data.Dataset of (image (H, W, C), label) examples, unbatched; got "
                         f"elements {spec}.")
    shape = spec[0].shape
    if not shape.is_fully_defined():
        if batching.image_size is None:
            raise ValueError("`data` has images of differing sizes: pass `image_size` (or a recipe) to resize them.")
        size = batching.image_size
        dataset = dataset.map(lambda x, y: (tf.image.resize(tf.cast(x, tf.float32), size), y),
                              num_parallel_calls=PARALLEL_BATCHES, deterministic=True)
        shape = (*size, shape[-1])
    batching = batching.resolve(tuple(shape))
    dataset = dataset.map(lambda x, y: (tf.cast(x, tf.float32), tf.cast(y, tf.int64)))
    training_steps = steps if batching.training else None
    dataset = batched(dataset, batching, augmentation.in_training(batching.training), EXAMPLE_SHUFFLE,
                      repeat=bool(training_steps))
    return dataset.take(training_steps) if training_steps else dataset


def augment_batches(dataset, batching, augmentation, teacher=None):
    """((uint8 images, labels), stateless seed) batches -> (float32 images 0..255 at the model's input, targets):
    the steps of the module's doc, for a resolved ``batching`` and the ``augmentation`` its batches get."""
    rand_augment = (keras.layers.RandAugment(value_range=(0, 255), seed=batching.seed)
                    if augmentation.augment == "randaugment" else None)
    mix = mixer(augmentation.mixup, augmentation.cutmix, batching.seed) if augmentation.mixes else None
    size, channels = batching.image_size, batching.channels

    def transform(batch, batch_seed):
        x, y = batch
        x = tf.cast(x, tf.float32)
        if augmentation.crops:
            x = random_resized_crop(x, size, augmentation.crop_scale, batch_seed)
        x = fit_batch(x, size, channels)
        if augmentation.flips:
            x = random_flip(x, batch_seed + 1)
        if rand_augment is not None:  # per image: on a batch, Keras draws one set of ops for all of it
            x = tf.map_fn(lambda image: rand_augment(image, training=True), x, parallel_iterations=1)
        x = tf.clip_by_value(x, 0.0, 255.0)
        if augmentation.erase:
            x = random_erase(x, augmentation.erase, batch_seed + 3)
        if batching.one_hot:
            y = tf.one_hot(y, batching.num_classes, dtype=tf.float32)
        return (x, y, batch_seed) if mix else (x, y)

    # Sequential maps: the Keras layers' seed generators are stateful, so order must not vary.
    if rand_augment is None:
        dataset = dataset.map(transform, num_parallel_calls=PARALLEL_BATCHES, deterministic=True)
    else:
        dataset = dataset.map(transform)
    if mix:
        dataset = dataset.map(mix)
    if batching.training and teacher is not None:
        dataset = dataset.map(lambda x, y: (x, hard_targets(y, teacher(x, training=False))),
                              num_parallel_calls=PARALLEL_BATCHES, deterministic=True)
    return dataset


def finish(dataset, shard_policy):
    """``dataset`` deterministic, with fixed parallelism (no autotuning), the given auto-shard policy for
    tf.distribute, and batches prefetched."""
    options = tf.data.Options()
    options.deterministic = True
    options.autotune.enabled = False
    options.experimental_distribute.auto_shard_policy = shard_policy
    return dataset.with_options(options).prefetch(PREFETCH_BATCHES)


def mixer(mixup, cutmix, seed):
    """A map that mixes (images, labels, seed) batches by MixUp or CutMix (one drawn per batch when both are on)."""
    layers = []
    if mixup:
        layers.append(keras.layers.MixUp(alpha=float(mixup), seed=seed))
    if cutmix:
        layers.append(keras.layers.CutMix(factor=float(cutmix), seed=seed + 1))

    def mix(x, y, batch_seed):
        data = {"images": x, "labels": y}
        if len(layers) == 1:
            out = layers[0](data, training=True)
        else:  # each batch gets one of the two, drawn from the batch's own seed
            choose_mixup = tf.random.stateless_uniform((), seed=batch_seed + 2)
            out = tf.cond(choose_mixup < 0.5, lambda: layers[0](data, training=True),
                          lambda: layers[1](data, training=True))
        return out["images"], out["labels"]

    return mix


def random_resized_crop(x, size, scale, seed, ratio=(3 / 4, 4 / 3)):
    """Inception-style crop of each image: area in ``scale``, aspect ratio in ``ratio``, resized to ``size``."""
    n = tf.shape(x)[0]
    seeds = tf.random.experimental.stateless_split(tf.cast(seed, tf.int64), 4)
    area = tf.random.stateless_uniform([n], seeds[0], scale[0], scale[1])
    log_ratio = tf.random.stateless_uniform([n], seeds[1], np.log(ratio[0]), np.log(ratio[1]))
    aspect = tf.exp(log_ratio)
    h = tf.minimum(tf.sqrt(area / aspect), 1.0)
    w = tf.minimum(tf.sqrt(area * aspect), 1.0)
    top = tf.random.stateless_uniform([n], seeds[2]) * (1.0 - h)
    left = tf.random.stateless_uniform([n], seeds[3]) * (1.0 - w)
    # crop_and_resize puts the first/last samples exactly on the box corners (in units of H - 1), so place the
    # corners on the centres of the first/last output pixels: a full box is then the identity. An enlarged crop's
    # edge samples then fall up to half a pixel outside the image, where crop_and_resize writes black: a 1-pixel
    # border that repeats the edge (coordinates shifted by 1) gives them the edge pixel, as tf.image.resize does.
    height, width = tf.cast(tf.shape(x)[1], tf.float32), tf.cast(tf.shape(x)[2], tf.float32)
    out_h, out_w = float(size[0]), float(size[1])

    def corners(start, extent, pixels, out):
        first = (start + 0.5 * extent / out) * pixels + 0.5  # - 0.5 to the pixel centre, + 1 for the border
        last = (start + extent - 0.5 * extent / out) * pixels + 0.5
        return first / (pixels + 1.0), last / (pixels + 1.0)  # the bordered image is pixels + 2 wide

    y1, y2 = corners(top, h, height, out_h)
    x1, x2 = corners(left, w, width, out_w)
    bordered = tf.pad(x, [[0, 0], [1, 1], [1, 1], [0, 0]], mode="SYMMETRIC")
    return tf.image.crop_and_resize(bordered, tf.stack([y1, x1, y2, x2], axis=1), tf.range(n), size)


def random_erase(x, probability, seed):
    """Random erasing, as ``vit_keras.data.array_pipeline.random_erase`` (the same distribution, TensorFlow's draws)."""
    n, height, width = tf.shape(x)[0], x.shape[1], x.shape[2]
    draws = tf.random.stateless_uniform((5, n), seed=seed)
    erased = draws[0] < probability
    area = ERASE_AREA[0] + draws[1] * (ERASE_AREA[1] - ERASE_AREA[0])
    aspect = tf.exp(np.log(ERASE_ASPECT[0]) + draws[2] * (np.log(ERASE_ASPECT[1]) - np.log(ERASE_ASPECT[0])))
    h, w = tf.minimum(tf.sqrt(area * aspect), 1.0), tf.minimum(tf.sqrt(area / aspect), 1.0)
    top, left = draws[3] * (1.0 - h), draws[4] * (1.0 - w)
    noise = tf.random.stateless_uniform(tf.shape(x), seed=seed + 1, maxval=255.0)
    rows = (tf.range(height, dtype=tf.float32) + 0.5) / height
    cols = (tf.range(width, dtype=tf.float32) + 0.5) / width
    inside = ((rows >= top[:, None]) & (rows < (top + h)[:, None]))[:, :, None] & \
             ((cols >= left[:, None]) & (cols < (left + w)[:, None]))[:, None, :]
    return tf.where((erased[:, None, None] & inside)[..., None], noise, x)


def random_flip(x, seed):
    """Left-right flip of a random half of the batch."""
    coin = tf.random.stateless_uniform([tf.shape(x)[0], 1, 1, 1], tf.cast(seed, tf.int64)) < 0.5
    return tf.where(coin, tf.reverse(x, axis=[2]), x)


def fit_images(images, image_size, channels, batch_size=256):
    """uint8 (N, H, W, C) images at the model's ``image_size`` and ``channels``, resized as evaluation resizes
    them and rounded back to uint8: what export calibrates on and verify compares with."""
    images = np.asarray(images)
    images = images[..., None] if images.ndim == 3 else images
    size = pair(image_size, "image_size")
    if images.shape[1:] == (*size, channels):
        return images
    batches = [fit_batch(tf.cast(images[start:start + batch_size], tf.float32), size, channels)
               for start in range(0, len(images), batch_size)]
    return np.clip(np.round(np.concatenate(batches)), 0, 255).astype(np.uint8)


def fit_batch(x, size, channels):
    """A float batch at ``size`` (antialiased resize where it differs) with the model's ``channels``."""
    if tuple(x.shape[1:3]) != tuple(size):
        x = tf.image.resize(x, size, antialias=True)
    return convert_channels(x, channels)


def convert_channels(x, channels):
    """Gray -> RGB by repetition, RGB -> gray by luma, as the model's input wants."""
    have = x.shape[-1]
    if have == channels:
        return x
    if have == 1 and channels == 3:
        return tf.repeat(x, 3, axis=-1)
    if have == 3 and channels == 1:
        return tf.image.rgb_to_grayscale(x)
    raise ValueError(f"Cannot convert images with {have} channels to the model's {channels}.")
