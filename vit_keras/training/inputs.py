"""A training run's input: its splits, kept in memory or streamed from disk, and the pipelines that feed ``fit``.

``load_splits`` reads the training and validation splits as ``vit_keras.data.sources.load_splits`` chooses (in
memory when their decoded images fit the memory budget, else streamed; ``TrainConfig.input_mode`` forces either)
and says which it chose and why. ``input_pipelines`` makes the batches: tf.data under TensorFlow
(``vit_keras.data.pipeline`` in memory, ``vit_keras.data.stream`` streamed, each worker of a multi-worker strategy
reading only its own files), else ``keras.utils.PyDataset`` batches (``vit_keras.data.array_pipeline``,
``vit_keras.data.stream_batches``), each JAX process reading only its own part.
"""

import dataclasses

import keras

from vit_keras.data.augmentation import Batching
from vit_keras.data.arrays import ArrayDataset
from vit_keras.training import strategies


def is_streamed(data):
    """Whether ``data`` is read from disk as training goes (a stream source), not held in memory."""
    return not isinstance(data, ArrayDataset)


def load_splits(config, image_size=None):
    """(training data, validation data) of ``config.data``, decoded at ``image_size`` where it is known
    beforehand; prints how they are read, and why."""
    from vit_keras.data import sources

    options = dict(limit=config.limit, seed=config.seed, data_dir=config.data_dir, val_fraction=config.val_fraction,
                   image_size=image_size)
    (train_data, val_data), mode, why = sources.load_splits(config.data, ("train", "val"), config.input_mode,
                                                             **options)
    print(f"input: {'streamed from disk' if mode == 'stream' else 'in memory'}: {why}")
    for split, data in (("training", train_data), ("validation", val_data)):
        print(f"{split}: {len(data):,} images of {config.data}" + (f", {data.source}" if data.source else ""))
    return train_data, val_data


def fixed_size(spec, data):
    """The input size shards were written at (a model trains on them at that size), else None."""
    return tuple(data.image_shape[:2]) if str(spec).startswith("shards:") else None


def check_model_size(spec, data, model):
    """Shards hold images at one size: a model that takes another (a saved one, say) is a clear error."""
    size = fixed_size(spec, data)
    if size is not None and tuple(model.input_shape[1:3]) != size:
        raise ValueError(f"The shards hold {size[0]}x{size[1]} images, but the model takes "
                         f"{model.input_shape[1]}x{model.input_shape[2]}: write shards at its size with "
                         "`vit-keras prepare --image-size`, or train at theirs.")


def pipeline_count(dist):
    """How many input pipelines share each global batch: tf.distribute's workers (MultiWorkerMirroredStrategy's
    tasks, a TPU's hosts), or JAX's processes."""
    if keras.backend.backend() != "tensorflow":
        return strategies.process_shard(dist)[1]
    if strategies.is_tf_multi_worker(dist):
        spec = dist.cluster_resolver.cluster_spec()
        return sum(spec.num_tasks(job) for job in ("chief", "worker") if job in spec.jobs)
    return int(getattr(dist.extended, "num_hosts", 1)) if strategies.is_distributed(dist) else 1


def stream_steps(config, train_data, dist):
    """A streamed run's steps an epoch: a pass over the data, every worker the same number of batches from its
    own part (or the step floor's, where that is more)."""
    from vit_keras.data.sources import steps_per_pass

    passes = steps_per_pass(train_data, config.batch_size, pipeline_count(dist))
    if passes < 1:
        raise ValueError(f"`batch_size`={config.batch_size} is larger than the {len(train_data)} training images "
                         "(over the workers); use a smaller batch size.")
    return max(passes, -(-config.min_steps // config.epochs))


def input_pipelines(vit, config, train_data, val_data, augmentation, dist=None, steps_per_epoch=None, teacher=None,
                    epoch=0, accumulation=1, skip=0):
    """(training, validation) batches at the model's input ``vit`` (its config) with ``augmentation``. DataParallel
    needs every batch split evenly over its devices, so the validation set ends at a multiple of the device count
    (fewer than that many images are left out). ``steps_per_epoch``: in memory, epochs longer than a pass (the
    step floor: the data repeats); streamed, the steps of every epoch. ``teacher``: its labels are mixed into the
    training targets (``vit_keras.training.distill``). ``epoch``: a resumed run's first (a stream starts that
    epoch's pass again). ``accumulation``: training batches are that many parts of ``config.batch_size``
    (``vit_keras.training.memory``), and so are validation batches. ``skip``: a stream resumed mid-epoch leaves
    out that epoch's first ``skip`` batches (data in memory is drawn afresh instead)."""
    train = Batching(train_data.num_classes, vit["image_size"], vit["channels"], config.batch_size // accumulation,
                     True, config.seed)
    # Validation batches as large as a training step: a whole batch's forward pass at 224 px would hold more.
    val = Batching(train_data.num_classes, vit["image_size"], vit["channels"], config.batch_size // accumulation,
                   False, config.seed)
    if is_streamed(train_data):
        return stream_pipelines(train_data, val_data, train, val, augmentation, dist, steps_per_epoch, teacher, epoch,
                                skip)
    repeat = steps_per_epoch is not None
    if keras.backend.backend() == "tensorflow":
        from vit_keras.data.pipeline import make_dataset

        return (make_dataset(train_data.images, train_data.labels, **dataclasses.asdict(train),
                             augmentation=augmentation, repeat=repeat, teacher=teacher),
                make_dataset(val_data.images, val_data.labels, **dataclasses.asdict(val)))
    from vit_keras.data.array_pipeline import make_batches

    shard = strategies.process_shard(dist)
    val_images, val_labels = val_data.images, val_data.labels
    if strategies.is_distributed(dist):
        count = len(val_images) - len(val_images) % config.batch_size % strategies.replica_count(dist)
        val_images, val_labels = val_images[:count], val_labels[:count]
    return (make_batches(train_data.images, train_data.labels, **dataclasses.asdict(train), augmentation=augmentation,
                         shard=shard, batches_per_epoch=steps_per_epoch, teacher=teacher),
            make_batches(val_images, val_labels, **dataclasses.asdict(val), shard=shard))


def stream_pipelines(train_data, val_data, train, val, augmentation, dist, steps, teacher, epoch, skip=0):
    """``input_pipelines`` for stream sources: each worker or process streams only its own part."""
    pipelines = pipeline_count(dist)
    if keras.backend.backend() == "tensorflow":
        from vit_keras.data import stream

        if pipelines > 1:
            train_batches = stream.distributed_stream(dist, pipelines, train_data, train, augmentation, teacher,
                                                      epoch, skip)[0]
        else:
            train_batches = stream.stream_dataset(train_data, train, augmentation, teacher, steps=steps, epoch=epoch,
                                                  skip=skip)
        return train_batches, stream.stream_dataset(val_data, val, augmentation)
    from vit_keras.data.stream_batches import StreamBatches

    index, count = strategies.process_shard(dist)
    local = Batching(**{**dataclasses.asdict(train), "batch_size": train.batch_size // count})
    if strategies.is_distributed(dist):  # whole batches for every device
        kept = len(val_data) - len(val_data) % val.batch_size % strategies.replica_count(dist)
        val_data = val_data.head(kept)
    return (StreamBatches(train_data.part(index, count), local, augmentation, steps, teacher, epoch, skip=skip),
            StreamBatches(val_data, val, augmentation.in_training(False), shard=(index, count)))
