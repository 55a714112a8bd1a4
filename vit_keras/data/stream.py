"""tf.data pipelines that stream a folder or shards from disk, for data larger than memory.

    training:   passes from `epoch` on, pass e: this worker's files in an order seeded by (seed, e)
                    -> read and decode in parallel (unreadable files skipped, logged) -> batch -> the first
                    `steps` batches -> the augmentation of ``vit_keras.data.pipeline.augment_batches``
    evaluation: one pass in order, the last batch kept

A folder's images are decoded by ``vit_keras.data.datasets.decode_image`` (Pillow, through ``tf.numpy_function``:
tf.data's own decoders differ from the app's on EXIF orientation, 16-bit data and transparency), so a streamed
model sees the pixels an in-memory one does; Pillow releases the GIL while it decodes and resizes, so the parallel
map uses every core. Shards are read and decoded by TensorFlow's ops. Each pass is the same `steps` batches long,
so an epoch is one pass and a resumed run starts its epoch's pass again, in the same order (``epoch``).

Several workers: ``shard`` (worker index, count) gives each worker every count-th file (a folder's images, or a
shard set's files), as tf.data's file-level auto-sharding does; ``distributed_stream`` builds each worker's part
with ``strategy.distribute_datasets_from_function``, and ``sources.steps_per_pass`` the steps all can take.
"""

import dataclasses

import numpy as np
import tensorflow as tf

from vit_keras.data.pipeline import PARALLEL_BATCHES, augment_batches, finish
from vit_keras.data.shards import ShardSource
from vit_keras.data.sources import steps_per_pass

DECODE_CALLS = max(2, 2 * PARALLEL_BATCHES)  # images decoded at once: Pillow's waits on the disk overlap
INTERLEAVED_FILES = 4  # shard files read at once
SHUFFLE_BYTES = 64 * 2**20  # the encoded records a shard stream shuffles together
MAX_PASSES = 2**40


def pass_seed(seed, epoch):
    """A stateless (2,) int64 seed for pass ``epoch``."""
    return tf.stack([tf.constant(seed, tf.int64), tf.cast(epoch, tf.int64)])


def folder_images(source, batching, epoch, skip=0):
    """(uint8 image, label) of a ``FileSource``'s readable files, in pass ``epoch``'s order in training, from the
    ``skip``-th on (nothing decoded before it)."""
    count, shape = len(source), tuple(source.image_shape)
    labels = tf.constant(source.labels, tf.int64)
    indices = tf.data.Dataset.range(count)
    if batching.training:
        indices = indices.map(lambda i: tf.random.experimental.index_shuffle(i, pass_seed(batching.seed, epoch),
                                                                             count - 1))
    indices = indices.skip(skip)

    def read(index):
        image = source.read_or_none(int(index))
        return (np.zeros(shape, np.uint8), False) if image is None else (image, True)

    def decode(index):
        image, ok = tf.numpy_function(read, [index], (tf.uint8, tf.bool), stateful=False)
        return tf.ensure_shape(image, shape), tf.gather(labels, index), ok

    def readable(image, label, ok):
        return ok

    def example(image, label, ok):
        return image, label

    images = indices.map(decode, num_parallel_calls=DECODE_CALLS, deterministic=True)
    return images.filter(readable).map(example)


def shuffle_buffer(source):
    """The records a shard stream's shuffle buffer holds: ``SHUFFLE_BYTES`` of them, encoded."""
    return int(np.clip(SHUFFLE_BYTES / max(source.record_bytes(), 1), 256, 16384))


def shard_images(source, batching, epoch, buffer=256, skip=0):
    """(uint8 image, label) of a ``ShardSource``'s records: in training its files in pass ``epoch``'s order,
    interleaved, each block of ``buffer`` records shuffled by a seed of (seed, epoch, block); in evaluation in
    order."""
    files, counts = tf.constant(source.files), tf.constant(source.counts, tf.int64)
    order = tf.data.Dataset.range(len(source.files))
    if batching.training:
        order = order.map(lambda i: tf.random.experimental.index_shuffle(i, pass_seed(batching.seed, epoch),
                                                                         len(source.files) - 1))
    interleaved = min(len(source.files), INTERLEAVED_FILES) if batching.training else 1
    records = order.interleave(lambda i: tf.data.TFRecordDataset(files[i]).skip(1).take(counts[i]),
                               cycle_length=interleaved, block_length=1, num_parallel_calls=interleaved,
                               deterministic=True)
    if batching.training:  # blocks of `buffer` records, each in a stateless order of its own
        records = records.batch(buffer).enumerate().map(
            lambda block, chunk: tf.random.experimental.stateless_shuffle(
                chunk, tf.stack([tf.cast(epoch, tf.int64) * 1_000_003 + batching.seed, block]))).unbatch()
    features = {"image": tf.io.FixedLenFeature([], tf.string), "label": tf.io.FixedLenFeature([], tf.int64)}
    shape, png = tuple(source.image_shape), source.encoding == "png"

    def decode(record):
        example = tf.io.parse_single_example(record, features)
        channels = shape[2]
        image = (tf.io.decode_png(example["image"], channels=channels) if png else
                 tf.io.decode_jpeg(example["image"], channels=channels, dct_method="INTEGER_ACCURATE"))
        return tf.ensure_shape(image, shape), example["label"]

    images = records.skip(skip).map(decode, num_parallel_calls=DECODE_CALLS, deterministic=True)
    return images.ignore_errors(log_warning=True)  # a damaged record: the epoch goes on


def stream_dataset(source, batching, augmentation, teacher=None, shard=(0, 1), steps=None, epoch=0, skip=0,
                   pass_per_iteration=False):
    """Batches of a stream source (``vit_keras.data.sources``) for a resolved ``Batching``: this worker's part
    (``shard``), at ``batching.batch_size`` a batch (the worker's share of the global batch). Training: the
    passes from ``epoch`` on, each ``steps`` batches (default: ``steps_per_pass``), the first without its first
    ``skip`` batches (a run resumed mid-epoch: the rest of that pass, as an uninterrupted run sees it).
    ``pass_per_iteration``: in training, one pass each time the dataset is iterated, in an order drawn afresh
    (``model.fit`` without ``steps_per_epoch`` iterates it once an epoch)."""
    augmentation = augmentation.in_training(batching.training)
    local = source.part(*shard)
    if isinstance(local, ShardSource):
        buffer = shuffle_buffer(local)
        images_of = lambda pass_epoch, left: shard_images(local, batching, pass_epoch, buffer, left)  # noqa: E731
    else:
        images_of = lambda pass_epoch, left: folder_images(local, batching, pass_epoch, left)  # noqa: E731
    steps = steps or steps_per_pass(local, batching.batch_size)

    def one_pass(pass_epoch):
        skipped = tf.where(tf.equal(pass_epoch, epoch), tf.constant(skip, tf.int64), tf.constant(0, tf.int64))
        batches = images_of(pass_epoch, skipped * batching.batch_size).batch(
            batching.batch_size, drop_remainder=batching.drop_remainder)
        seeds = tf.data.Dataset.range(skipped, MAX_PASSES).map(
            lambda i: tf.stack([tf.cast(pass_epoch, tf.int64) * 1_000_003 + batching.seed, i]))
        return tf.data.Dataset.zip((batches.take(steps - skipped) if batching.training else batches, seeds))

    if batching.training and pass_per_iteration:
        draws = tf.data.Dataset.random(seed=batching.seed, rerandomize_each_iteration=True).take(1)
        dataset = draws.flat_map(lambda draw: one_pass(tf.math.floormod(draw, MAX_PASSES)))
    elif batching.training:
        dataset = tf.data.Dataset.range(epoch, MAX_PASSES).flat_map(one_pass)
    else:
        dataset = one_pass(tf.constant(0, tf.int64))
    return finish(augment_batches(dataset, batching, augmentation, teacher), tf.data.experimental.AutoShardPolicy.DATA)


def distributed_stream(strategy, pipelines, source, batching, augmentation, teacher=None, epoch=0, skip=0):
    """(a ``tf.distribute.DistributedDataset`` in which each of the ``pipelines`` input pipelines (workers)
    streams only its own part of ``source``, the steps of an epoch) for training under ``strategy``;
    ``batching.batch_size`` is global."""
    steps = steps_per_pass(source, batching.batch_size, pipelines)

    def worker_dataset(context):
        replica = context.get_per_replica_batch_size(batching.batch_size)
        per_worker = batching.batch_size // context.num_input_pipelines  # a step's images from each worker
        local = dataclasses.replace(batching, batch_size=replica)
        part = (context.input_pipeline_id, context.num_input_pipelines)
        return stream_dataset(source, local, augmentation, teacher, part, steps * per_worker // replica, epoch,
                              skip * per_worker // replica)

    return strategy.distribute_datasets_from_function(worker_dataset), steps
