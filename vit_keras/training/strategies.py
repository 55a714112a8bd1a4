"""Devices for training, per Keras backend: tf.distribute strategies, Keras's DataParallel on JAX, one device on torch.

    tensorflow  auto | default | mirrored | multi_worker (TF_CONFIG) | tpu     (tf.distribute)
    jax         auto | default | data_parallel                              (keras.distribution.DataParallel)
    torch       auto | default                                              (one device)

The choice lists are ``vit_keras.constants.BACKEND_STRATEGIES``. A "strategy" here is what ``get_strategy``
returns: a ``tf.distribute.Strategy``, a ``keras.distribution.DataParallel``, or None (one device); the other
functions answer the same questions of each.

Several hosts under JAX: start the same command on every host with
``KERAS_DISTRIBUTION_JOB_ADDRESSES`` (comma-separated host:port of every process, the first one the
coordinator), ``KERAS_DISTRIBUTION_NUM_PROCESSES`` and ``KERAS_DISTRIBUTION_PROCESS_ID`` set, as TF_CONFIG
is for ``multi_worker``; ``get_strategy`` then calls ``keras.distribution.initialize`` (JAX's
``jax.distributed.initialize``) before JAX starts, and DataParallel spans every process's devices. On a
Cloud TPU pod slice, set only ``KERAS_DISTRIBUTION_NUM_PROCESSES``: JAX finds the rest. Process 0 is the
chief: it writes the run folder; the others keep their backups in ``.worker-<id>``, as TensorFlow's
workers do.
"""

import contextlib
import os

import keras

from vit_keras.devices import tpu_present
from vit_keras.training.backends import check_strategy

# Keras's variables for a multi-process JAX run (keras.distribution.initialize reads them).
JAX_CLUSTER_VARIABLES = ("KERAS_DISTRIBUTION_JOB_ADDRESSES", "KERAS_DISTRIBUTION_NUM_PROCESSES",
                         "KERAS_DISTRIBUTION_PROCESS_ID")


def get_strategy(name="auto"):
    """The named strategy of this process's backend (``vit_keras.constants.BACKEND_STRATEGIES``).

    TensorFlow: auto is TPUStrategy when a TPU is found, MirroredStrategy with > 1 GPU, else the default;
    multi_worker is MultiWorkerMirroredStrategy (the cluster from the TF_CONFIG variable); tpu is TPUStrategy on
    the TPU named by TPU_NAME (empty: the local / Cloud TPU VM).
    JAX: data_parallel is DataParallel over every device (of every process, see the module's note); auto is
    DataParallel when there is more than one device, else None; default is None.
    torch: None.
    """
    backend = keras.backend.backend()
    check_strategy(name, backend)
    if backend == "tensorflow":
        return tf_strategy(name)
    if backend == "jax" and name != "default":
        return jax_data_parallel(name)
    return None


def jax_data_parallel(name):
    """DataParallel over every device; None for "auto" on a single device."""
    import jax

    if any(os.environ.get(variable) for variable in JAX_CLUSTER_VARIABLES) and not jax.distributed.is_initialized():
        keras.distribution.initialize()
    devices = jax.devices()
    if name == "auto" and len(devices) == 1:
        return None
    return keras.distribution.DataParallel(devices=devices)


def tf_strategy(name):
    import tensorflow as tf

    if name == "auto":
        if tpu_present():
            name = "tpu"
        elif len(tf.config.list_logical_devices("GPU")) > 1:
            name = "mirrored"
        else:
            name = "default"
    if name == "default":
        return tf.distribute.get_strategy()
    if name == "mirrored":
        # Without GPUs, mirror over the logical CPU devices (one replica unless they were split).
        gpus = tf.config.list_logical_devices("GPU")
        return tf.distribute.MirroredStrategy(None if gpus else [d.name for d in tf.config.list_logical_devices("CPU")])
    if name == "multi_worker":
        if "TF_CONFIG" not in os.environ:
            raise ValueError("`strategy`='multi_worker' needs the TF_CONFIG environment variable (cluster and task).")
        return tf.distribute.MultiWorkerMirroredStrategy()
    resolver = tf.distribute.cluster_resolver.TPUClusterResolver(tpu=os.environ.get("TPU_NAME", ""))
    tf.config.experimental_connect_to_cluster(resolver)
    tf.tpu.experimental.initialize_tpu_system(resolver)
    return tf.distribute.TPUStrategy(resolver)


def is_tf_multi_worker(strategy):
    if keras.backend.backend() != "tensorflow":
        return False
    import tensorflow as tf

    return isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy)


def is_distributed(strategy):
    """Whether ``strategy`` splits batches over replicas (so each device's batch is not the whole one)."""
    if strategy is None:
        return False
    if isinstance(strategy, keras.distribution.DataParallel):
        return True
    import tensorflow as tf

    return isinstance(strategy, (tf.distribute.MirroredStrategy, tf.distribute.MultiWorkerMirroredStrategy,
                                 tf.distribute.TPUStrategy))


def scope(strategy):
    """The context to build (and, for DataParallel, fit) the model in."""
    return contextlib.nullcontext() if strategy is None else strategy.scope()


def fit_scope(strategy):
    """The context to fit in: DataParallel's scope (Keras shards each batch as ``fit`` reads it), else none."""
    return strategy.scope() if isinstance(strategy, keras.distribution.DataParallel) else contextlib.nullcontext()


def replica_count(strategy):
    """How many devices share each global batch."""
    if strategy is None:
        return 1
    if isinstance(strategy, keras.distribution.DataParallel):
        return int(strategy.device_mesh.devices.size)
    return strategy.num_replicas_in_sync


def process_shard(strategy):
    """(this process's index, process count): which rows of each global batch this process feeds (DataParallel
    over several hosts takes each process's part; tf.distribute shards the dataset itself)."""
    if isinstance(strategy, keras.distribution.DataParallel):
        import jax

        return jax.process_index(), jax.process_count()
    return 0, 1


def worker_role(strategy):
    """(is_chief, task name): only the chief writes the run's files; other workers keep their own backups."""
    if isinstance(strategy, keras.distribution.DataParallel):
        index, _ = process_shard(strategy)
        return index == 0, "chief" if index == 0 else f"worker-{index}"
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not is_tf_multi_worker(strategy):
        return True, "chief"
    task_type, task_id = resolver.task_type, resolver.task_id
    chief = task_type in (None, "chief") or (task_type == "worker" and task_id == 0 and
                                             "chief" not in resolver.cluster_spec().as_dict())
    return chief, f"{task_type}-{task_id}"


def check_batch_size(batch_size, strategy):
    """DataParallel shards each batch evenly over the devices: a clear error before any data loads."""
    replicas = replica_count(strategy)
    if isinstance(strategy, keras.distribution.DataParallel) and batch_size % replicas:
        raise ValueError(f"`batch_size`={batch_size} must be divisible by the {replicas} devices that "
                         "keras.distribution.DataParallel splits each batch over.")
