"""The GPUs and TPUs the Keras backend computes on, beside this machine's CPU (``vit_keras.cpu``).

    accelerator_count()   # 0: the backend computes on the CPU

The backends are imported inside the functions, so importing this module loads none of them.
"""

import os


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

    return len(tf.config.list_logical_devices("GPU")) + int(tpu_present())


def tpu_present():
    """Whether TensorFlow can reach a TPU (cheap checks first: a TPU VM exposes /dev/accel* or /dev/vfio; Cloud TPU
    nodes set TPU_NAME)."""
    if not (os.environ.get("TPU_NAME") or os.path.exists("/dev/accel0") or os.path.isdir("/dev/vfio")):
        return False
    import tensorflow as tf

    try:
        tf.distribute.cluster_resolver.TPUClusterResolver(tpu=os.environ.get("TPU_NAME", ""))
        return True
    except (ValueError, tf.errors.NotFoundError):
        return False
