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

import dataclasses
import warnings
import weakref

import keras
import numpy as np

from vit_keras.inference.precision import AGREEMENTS, Agreement, resolve, twin
from vit_keras.models.normalization import check_pixels


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


# model -> {(micro_batches, jit_compile, dtype policy): its compiled function}, so every call of ``predict`` on a
# model reuses one function (a new tf.function per call retraced and recompiled each time). The functions hold
# their model weakly: a model dropped by the user frees its entry.
COMPILED = weakref.WeakKeyDictionary()


def predict_function(model, micro_batches=4, jit_compile=True, precision="float32"):
    """``images -> model(images, training=False)``, run as up to ``micro_batches`` concurrent calls.

    ``precision`` "bfloat16" or "int8" runs the model's twin in that precision (vit_keras.inference.precision)
    where this CPU has fast kernels for it, else float32 with a warning. Its first CHECK_IMAGES images also run
    in float32: under the floor of top-1 agreement it must keep, it warns with the figure and the model runs
    float32 from then on.

    One function per model and settings, reused by every later call (``COMPILED``); traced once per batch
    size; a batch smaller than ``micro_batches`` runs one example per call. Inside another tf.function with
    the batch size unknown until run time (Keras' test step), the batch splits into ``micro_batches`` parts
    when it runs, empty ones for a batch smaller than that. Not under TensorFlow: ``model.predict_on_batch``
    (one compiled program a batch, which Keras keeps).
    """
    check_micro_batches(micro_batches)
    lower, jit_lower = resolve(precision, jit_compile)
    if lower != "float32":
        return checked_function(model, lower, predict_function(twin(model, lower), micro_batches, jit_lower),
                                predict_function(model, micro_batches, jit_compile))
    if keras.backend.backend() != "tensorflow":
        return model.predict_on_batch
    key = (micro_batches, bool(jit_compile), model.dtype_policy.name)
    functions = COMPILED.setdefault(model, {})
    if key not in functions:
        functions[key] = compiled_predict(weakref.ref(model), micro_batches, jit_compile)
    return functions[key]


def checked_function(model, precision, lower, reference):
    """``lower``, checked against ``reference`` (float32) on its first images (``Agreement``): while the check runs
    both run; under the floor, a warning with the figure and ``reference`` from then on."""
    model_ref = weakref.ref(model)

    def forward(images):
        agreement = AGREEMENTS.setdefault(model_ref(), {}).setdefault(precision, Agreement())
        if agreement.settled:
            return lower(images) if agreement.kept else reference(images)
        outputs, expected = lower(images), reference(images)
        if agreement.add(outputs, expected):
            warnings.warn(agreement.describe(precision) + "; using float32.", stacklevel=3)
        return outputs if agreement.kept else expected

    return forward


def compiled_predict(model_ref, micro_batches, jit_compile):
    """``predict_function``'s tf.function for the model ``model_ref`` refers to."""
    import tensorflow as tf

    forward = tf.function(lambda x: model_ref()(x, training=False), jit_compile=jit_compile, autograph=False)

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


def predict(model, data, batch_size=32, micro_batches=4, jit_compile=True, top_k=None, precision="float32"):
    """Outputs for an array of images (split into ``batch_size`` batches), or an iterable of batches of images or
    of (images, labels): a ``tf.data`` dataset, a ``keras.utils.PyDataset`` (``vit_keras.data.array_pipeline``), ...

    ``top_k``: instead of logits, the ``top_k`` most likely classes of each image with their softmax
    probabilities and labels (``TopK``; the model's ``class_names``, else "class i").
    ``precision``: "float32", or "bfloat16" / "int8" where the CPU computes them fast (``predict_function``)."""
    if int(batch_size) < 1:
        raise ValueError(f"`batch_size` must be a positive int; got {batch_size}.")
    if top_k is not None:
        check_top_k(top_k, model)
    run = predict_function(model, micro_batches, jit_compile, precision)
    if hasattr(data, "shape"):  # an array: NumPy, or the backend's
        check_pixels(data, getattr(model, "vit_config", {}), "data")
        batches = (data[i:i + batch_size] for i in range(0, len(data), batch_size))
    else:
        batches = (element[0] if isinstance(element, tuple) else element for element in data)
    outputs = [keras.tree.map_structure(keras.ops.convert_to_numpy, run(keras.ops.convert_to_tensor(x)))
               for x in batches]
    if not outputs:
        raise ValueError("`data` is empty: there is nothing to predict.")
    logits = keras.tree.map_structure(lambda *parts: np.concatenate(parts, 0), *outputs)
    return logits if top_k is None else TopK.of(logits, top_k, getattr(model, "class_names", None))


def check_top_k(top_k, model):
    classes = model.output_shape[-1]
    if isinstance(top_k, bool) or not isinstance(top_k, int) or not 1 <= top_k <= classes:
        raise ValueError(f"`top_k` must be an int from 1 to the model's {classes} classes; got {top_k!r}.")


@dataclasses.dataclass(frozen=True)
class TopK:
    """The most likely classes of each image, most likely first: ``indices`` (N, k) ints, ``scores`` (N, k)
    softmax probabilities, ``labels`` (N, k) their class names."""
    indices: np.ndarray
    scores: np.ndarray
    labels: np.ndarray

    @classmethod
    def of(cls, logits, k, class_names=None):
        logits = np.asarray(logits, "float64")
        probabilities = np.exp(logits - logits.max(-1, keepdims=True))
        probabilities /= probabilities.sum(-1, keepdims=True)
        indices = np.argsort(-probabilities, axis=-1, kind="stable")[:, :k]
        names = np.asarray(class_names if class_names is not None else
                           [f"class {i}" for i in range(logits.shape[-1])], dtype=object)
        return cls(indices, np.take_along_axis(probabilities, indices, -1).astype("float32"), names[indices])

    def __len__(self):
        return len(self.indices)

    def rows(self):
        """One list an image of (label, score) pairs, most likely first."""
        return [list(zip(labels.tolist(), map(float, scores))) for labels, scores in zip(self.labels, self.scores)]
