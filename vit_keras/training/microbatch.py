"""Training on CPU with concurrent micro-batches: ``model.fit`` that keeps both cores busy.

One XLA program per training step leaves cores idle on a small CPU: TensorFlow's GEMM scales poorly
over threads, and LayerNorm, softmax, GELU and their gradients run mostly on one thread. Here each
batch's gradients come from ``micro_batches`` separately compiled XLA programs that TensorFlow's
inter-op pool runs side by side; their size-weighted mean is the batch gradient, and one optimizer
step applies it. Each program is a pure function (``stateless_call``): it takes the variables'
values and returns gradients and new state, so no two programs touch the same resource.

Equal to the plain step up to float summation order for models without batch statistics (every
plain ViT). A BatchNorm (the conv stem) normalizes each micro-batch by its own statistics ("ghost
batch norm") and its moving averages take the weighted mean of the micro-batches' updates.
Dropout, drop-path and patch dropout draw from a separate seed stream per micro-batch.

The speed-ups: docs/benchmarks.md#concurrent-micro-batches.

    enable_micro_batches(model, 4)   # after compile(jit_compile=False); then model.fit(...)
"""

import keras

if keras.backend.backend() == "tensorflow":  # the module is TensorFlow's; elsewhere it only refuses (below)
    import tensorflow as tf

from vit_keras import framework
from vit_keras.inference.predict import check_micro_batches, predict_function, split_sizes

# Added to a seed generator's seed per micro-batch index, so micro-batches draw different masks.
SEED_STRIDE = 0x2545F491


def enable_micro_batches(model, micro_batches):
    """Make ``model.fit`` / ``evaluate`` run each batch as ``micro_batches`` concurrent XLA programs.

    The model must be compiled with ``jit_compile=False``: each micro-batch is compiled on its own,
    and one XLA program around the whole step would serialize them again. Not for tf.distribute
    strategies (the replicas already split the batch). Returns the model.
    """
    check_micro_batches(micro_batches)
    if keras.backend.backend() != "tensorflow":
        raise ValueError(f"enable_micro_batches is TensorFlow's (its inter-op pool runs the micro-batches side by "
                         f"side); this process runs Keras on {keras.backend.backend()!r}: train with "
                         "micro_batches=1, or with KERAS_BACKEND=tensorflow.")
    if model.jit_compile:
        raise ValueError("enable_micro_batches needs a model compiled with jit_compile=False (each micro-batch "
                         "is an XLA program of its own).")
    if tf.distribute.has_strategy():
        raise ValueError("enable_micro_batches is for one device; under a tf.distribute strategy the replicas "
                         "already split the batch.")
    gradients = tf.function(lambda *args: _micro_gradients(model, *args), jit_compile=True, autograph=False)
    # The mean of the parts' gradients and the optimizer step as one XLA program too: outside XLA, AdamW's
    # per-variable updates with clipping are hundreds of small TensorFlow ops (their cost: docs/benchmarks.md).
    apply = tf.function(lambda grads, weights: model.optimizer.apply_gradients(
        zip([_weighted_sum(g, weights) for g in zip(*grads)], model.trainable_variables)),
        jit_compile=True, autograph=False)
    forward = predict_function(model, micro_batches)

    def train_step(data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        batch = tf.shape(x)[0]
        sizes = split_sizes(batch, micro_batches)
        weights = tf.cast(sizes, "float32") / tf.cast(batch, "float32")
        trainable = [v.value for v in model.trainable_variables]
        state = [v.value for v in model.non_trainable_variables]
        metric_state = [v.value for v in model.metrics_variables]
        scale = model.optimizer.scale_loss(tf.constant(1.0))  # the loss scale under mixed_float16, else 1
        parts = zip(tf.split(x, sizes), tf.split(y, sizes),
                    [None] * micro_batches if sample_weight is None else tf.split(sample_weight, sizes))
        outputs = [gradients(trainable, _reseed(model, state, i), metric_state, xi, yi, wi, scale)
                   for i, (xi, yi, wi) in enumerate(parts)]
        losses, grads, new_states, predictions = zip(*outputs)
        loss = _weighted_sum(losses, weights)
        for variable, first, values in zip(model.non_trainable_variables, new_states[0], zip(*new_states)):
            variable.assign(_weighted_sum(values, weights) if keras.backend.is_float_dtype(variable.dtype) else first)
        framework.loss_tracker(model).update_state(loss, sample_weight=batch)
        apply(grads, weights)
        y_pred = tf.nest.map_structure(lambda *p: tf.concat(p, 0), *predictions)
        return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    def test_step(data):
        x, y, sample_weight = keras.utils.unpack_x_y_sample_weight(data)
        y_pred = forward(x)
        loss = framework.compute_loss(model, x=x, y=y, y_pred=y_pred, sample_weight=sample_weight, training=False)
        framework.loss_tracker(model).update_state(loss, sample_weight=tf.shape(x)[0])
        return model.compute_metrics(x, y, y_pred, sample_weight=sample_weight)

    model.train_step, model.test_step = train_step, test_step
    model.train_function = model.test_function = None  # rebuilt around the new steps
    return model


def _micro_gradients(model, trainable, state, metric_state, x, y, sample_weight, scale):
    """One micro-batch: (mean loss, gradients, new non-trainable state, predictions), as pure tensors."""
    with tf.GradientTape() as tape:
        tape.watch(trainable)
        y_pred, state = model.stateless_call(trainable, state, x, training=True)
        loss, (_, state, _) = model.stateless_compute_loss(trainable, state, metric_state, x=x, y=y, y_pred=y_pred,
                                                           sample_weight=sample_weight, training=True)
        scaled = loss * tf.cast(scale, loss.dtype)
    grads = tape.gradient(scaled, trainable)
    # An empty micro-batch (a final batch smaller than micro_batches) gives NaN; its weight is 0.
    return loss, grads, state, y_pred


def _reseed(model, state, index):
    """The state for micro-batch ``index``: seed generators moved to a stream of their own."""
    if index == 0:
        return state
    moved = []
    for variable, value in zip(model.non_trainable_variables, state):
        if variable.path.endswith("seed_generator_state"):
            value = value + tf.constant([SEED_STRIDE * index % (1 << 31), 0], value.dtype)
        moved.append(value)
    return moved


def _weighted_sum(values, weights):
    """sum_i w_i * v_i, where a part of weight 0 (an empty micro-batch, NaN) counts as 0."""
    return tf.add_n([tf.math.multiply_no_nan(v, tf.cast(weights[i], v.dtype)) for i, v in enumerate(values)])
