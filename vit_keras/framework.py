"""Every private Keras, TensorFlow and LiteRT internal the project relies on, in one place, each with its reason;
and the Keras behaviours it works around for speed.

They are why Keras and TensorFlow are pinned to one minor version (pyproject.toml): an upgrade has this one module
to check. ``check_versions`` names what was verified; each wrapper fails with a message naming the internal.
"""

import contextlib
import gc
import warnings

VERIFIED = {"keras": "3.15", "tensorflow": "2.21"}  # minor versions these internals were checked against


def check_versions():
    """Warn once if Keras or TensorFlow is not the minor version whose internals this module was checked on."""
    import importlib.metadata

    for package, verified in VERIFIED.items():
        try:
            version = importlib.metadata.version(package if package != "tensorflow" else "tensorflow-cpu")
        except importlib.metadata.PackageNotFoundError:
            continue
        if not version.startswith(verified + "."):
            warnings.warn(f"vit_keras.framework was checked against {package} {verified}.x; {version} is installed, "
                          "and the private internals it wraps may have changed.", stacklevel=2)


def internal(owner, name):
    """``owner``'s private attribute ``name``, with an error that says which internal moved."""
    try:
        return getattr(owner, name)
    except AttributeError:
        raise RuntimeError(f"{type(owner).__name__}.{name} is gone: vit_keras.framework needs updating for this "
                           f"version (checked on {VERIFIED}).") from None


# Keras: the multi-worker build (training.train), and concurrent micro-batches' test step (training.microbatch).
def symbolic_build(model, data_batch):
    """Build ``model``'s optimizer and metrics from one batch's shapes, as ``fit`` would on its first step.
    Why: under MultiWorkerMirroredStrategy ``fit``'s own build all-reduces a nested batch, which fails."""
    internal(model, "_symbolic_build")(data_batch=data_batch)


def skip_symbolic_build(model):
    """Keep ``fit`` from building ``model`` again (see ``symbolic_build``)."""
    internal(model, "_maybe_symbolic_build")
    model._maybe_symbolic_build = lambda iterator=None, data_batch=None: None


def set_initial_epoch(model, epoch):
    """Make the next ``fit`` start at ``epoch``, as Keras's own BackupAndRestore does when it restores a backup
    (``fit`` reads ``_initial_epoch`` before its ``initial_epoch`` argument)."""
    internal(model, "_initial_epoch")
    model._initial_epoch = epoch


def compute_loss(model, **kwargs):
    """``model``'s compiled loss without its metrics side effects (the test step's)."""
    return internal(model, "_compute_loss")(**kwargs)


def loss_tracker(model):
    """The metric ``fit`` reports as "loss", which a replaced train or test step must update itself."""
    return internal(model, "_loss_tracker")


def flatten_layers(model, include_self=False):
    """Every layer inside ``model``, nested ones included (Keras has no public walk)."""
    return internal(model, "_flatten_layers")(include_self=include_self)


# TensorFlow's TFLite converter: int8 export calibrates, then quantizes with its own float-kept ops (convert.tflite).
def calibrate_only(converter):
    """Make ``converter.convert()`` return the calibrated float model (the QuantizationDebugger's path)."""
    converter._experimental_calibrate_only = True


# LiteRT's interpreter: the op graph, which has no public reader (convert.runtime, convert.int8).
def ops_details(interpreter):
    """[{'op_name', 'inputs', 'outputs', ...}] for each op the interpreter runs, delegates included."""
    return internal(interpreter, "_get_ops_details")()


def output_indices(interpreter):
    """The tensor indices of the graph's outputs."""
    return [int(t) for t in internal(interpreter, "_interpreter").OutputIndices()]


# Keras behaviours worked around: each costs time, not correctness.
def build_optimizer(model):
    """Create the compiled optimizer's variables before ``fit`` traces its train step. Without a distribution
    strategy, Keras's TensorFlow trainer creates them inside the step's first trace, and TensorFlow then traces the
    step a second time: twice the wait for the first step (docs/training.md#the-first-step)."""
    import keras

    optimizer = getattr(model, "optimizer", None)
    if keras.backend.backend() != "tensorflow" or optimizer is None or optimizer.built or not model.built:
        return
    with model.distribute_strategy.scope():
        optimizer.build(model.trainable_variables)


def tracing_graph():
    """The TensorFlow graph a ``tf.function`` is tracing now, or None (eager, or another backend)."""
    import keras

    if keras.backend.backend() != "tensorflow":
        return None
    import tensorflow as tf

    return tf.compat.v1.get_default_graph() if tf.inside_function() else None


@contextlib.contextmanager
def one_garbage_collection():
    """Run a block that deletes Keras variables with one garbage collection at its end.

    Keras's ``Layer.__delattr__`` runs ``gc.collect()`` after every variable a layer deletes, a pass over the whole
    heap each time; quantizing a ViT deletes one kernel per Dense layer
    (docs/export.md#quantize-and-the-garbage-collector). The objects that exist before the block are frozen for its
    length (``gc.freeze``), so those passes walk only the new ones; one full pass follows. A process that froze
    objects of its own keeps its choice: nothing changes.
    """
    if gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()
        gc.collect()


check_versions()
