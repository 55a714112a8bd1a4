"""Fast inference on CPU: a batch runs as micro-batches whose XLA programs execute concurrently.

One XLA program per batch leaves cores idle: TensorFlow's GEMM scales poorly over threads, and
LayerNorm, softmax and GELU are mostly single-threaded. Splitting the batch into ``micro_batches``
separately compiled calls lets TensorFlow's inter-op pool run them side by side, so one call's GEMM
overlaps another's elementwise work (the speed-ups: docs/benchmarks.md#concurrent-micro-batches).
Results equal ``model(x, training=False)`` example by example. Training has the same idea in
``microbatch``.

    forward = predict_function(model)          # a callable: images (B, H, W, C) -> outputs
    logits = predict(model, images_or_dataset)  # numpy, for arrays, tf.data or other iterables of batches

The micro-batches are TensorFlow's (tf.function, its inter-op pool). Under the other Keras backends both
run the model's own predict step, batch by batch (compiled by Keras: XLA under JAX), without TensorFlow.
"""

import keras
import numpy as np


def check_micro_batches(micro_batches):
    if isinstance(micro_batches, bool) or not isinstance(micro_batches, int) or micro_batches < 1:
        raise ValueError(f"`micro_batches` must be a positive int; got {micro_batches!r}.")
    return micro_batches


def split_sizes(batch, parts):
    """Sizes of ``parts`` near-equal pieces of ``batch`` (a Python int or a scalar tensor); some may be 0."""
    if isinstance(batch, int):
        return [batch // parts + (i < batch % parts) for i in range(parts)]
    import tensorflow as tf

    return tf.stack([batch // parts + tf.cast(i < batch % parts, batch.dtype) for i in range(parts)])


def predict_function(model, micro_batches=4, jit_compile=True):
    """``images -> model(images, training=False)``, run as up to ``micro_batches`` concurrent calls.

    Traced once per batch size; a batch smaller than ``micro_batches`` runs one example per call.
    Inside another tf.function with the batch size unknown until run time (Keras' test step), the
    batch splits into ``micro_batches`` parts when it runs, empty ones for a batch smaller than that.
    Not under TensorFlow: ``model.predict_on_batch`` (one compiled program a batch).
    """
    check_micro_batches(micro_batches)
    if keras.backend.backend() != "tensorflow":
        return model.predict_on_batch
    import tensorflow as tf

    forward = tf.function(lambda x: model(x, training=False), jit_compile=jit_compile, autograph=False)

    @tf.function(autograph=False)
    def run(images):
        batch = images.shape[0]
        if micro_batches == 1 or (batch is not None and batch < 2):
            return forward(images)
        if batch is None:
            sizes = split_sizes(tf.shape(images)[0], micro_batches)
        else:
            sizes = split_sizes(batch, min(micro_batches, batch))
        outputs = [forward(chunk) for chunk in tf.split(images, sizes)]
        return tf.nest.map_structure(lambda *parts: tf.concat(parts, 0), *outputs)

    return run


def predict(model, data, batch_size=32, micro_batches=4, jit_compile=True):
    """Outputs for an array of images (split into ``batch_size`` batches), or an iterable of batches of images or
    of (images, labels): a ``tf.data`` dataset, a ``keras.utils.PyDataset`` (``vit_keras.data.array_pipeline``), ..."""
    if int(batch_size) < 1:
        raise ValueError(f"`batch_size` must be a positive int; got {batch_size}.")
    run = predict_function(model, micro_batches, jit_compile)
    if hasattr(data, "shape"):  # an array: NumPy, or the backend's
        batches = (data[i:i + batch_size] for i in range(0, len(data), batch_size))
    else:
        batches = (element[0] if isinstance(element, tuple) else element for element in data)
    outputs = [keras.tree.map_structure(keras.ops.convert_to_numpy, run(keras.ops.convert_to_tensor(x)))
               for x in batches]
    if not outputs:
        raise ValueError("`data` is empty: there is nothing to predict.")
    return keras.tree.map_structure(lambda *parts: np.concatenate(parts, 0), *outputs)
