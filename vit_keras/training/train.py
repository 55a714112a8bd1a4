"""Training: the paper's recipe with ``model.fit``, mixed precision, several devices, resumable runs; on any backend.

Recipe (Dosovitskiy et al. 2020, Appendix B; DeiT for the small-data regularizers):
  AdamW (no weight decay on norms, biases, position embedding, cls token), linear warmup
  then cosine decay (``WarmupCosine``), label smoothing, global-norm clipping at 1.0, drop-path.

Batch size is global: each of R replicas sees batch_size / R. Following Goyal et al. (2017)
the peak learning rate scales linearly with it, ``lr = base_lr * batch_size / 512``
(``scaled_learning_rate``), with the warmup absorbing the large-batch start.

Mixed precision: the policy is global (``keras.mixed_precision``); LayerNorm computes in
float32 (``ops.layer_normalization`` upcasts), attention's softmax runs in float32 (the
core's MultiHeadSelfAttention) and the head is a float32 layer, so logits and loss are float32.
mixed_float16 wraps the optimizer in ``keras.optimizers.LossScaleOptimizer``.

Backends (``KERAS_BACKEND``): TensorFlow feeds ``fit`` from the tf.data pipeline (``vit_keras.data.pipeline``) and
distributes with tf.distribute; JAX and PyTorch from the NumPy one (``vit_keras.data.array_pipeline``), JAX over
every device with ``keras.distribution.DataParallel`` (``vit_keras.training.strategies``). Concurrent micro-batches
(``vit_keras.training.microbatch``) are TensorFlow's; on the others a step is one program. ``jit_compile`` is XLA on
TensorFlow and JAX; the torch backend runs eagerly (no torch.compile).
"""

import contextlib
import dataclasses
import os
import time
import warnings

from vit_keras import locks
from vit_keras.cpu import cpu_features
from vit_keras.data import flip_check
from vit_keras.training import backup, distill, inputs, runs, strategies, warmup
from vit_keras.training.building import build_for_fit, decode_size
from vit_keras.training.progress import ProgressLog, fit_verbosity
from vit_keras.training.config import TrainConfig, is_saved_model
from vit_keras.devices import accelerator_count
from vit_keras.training.finetune import compare_to_estimate, with_image_size
from vit_keras.validation import check_keywords
from vit_keras.weights.fetch import resolve
# Re-exported: the training API callers build, compile and catch from here (the recipe's model and optimizer,
# NonFiniteLoss, the recipes and the choice of devices).
from vit_keras.training.building import build_model_to_train, finetune_from, recipe_image_size, recipe_patch  # noqa: F401
from vit_keras.training.config import RECIPES, scaled_learning_rate  # noqa: F401
from vit_keras.training.optimizer import WarmupCosine, compile_model, fast_precision, make_optimizer, set_precision  # noqa: F401
from vit_keras.training.runs import NonFiniteLoss  # noqa: F401
from vit_keras.training.strategies import get_strategy, worker_role  # noqa: F401


def train(data, out_dir, overwrite=False, **options):
    """Train on ``data`` ("fashion_mnist" | "tfds:NAME" | "folder:PATH") into ``out_dir``; rerun to resume.
    ``out_dir`` holding a run with other settings is refused (naming them), unless ``overwrite`` starts afresh.

    ``options`` are ``TrainConfig``'s fields (model_name, epochs, batch_size, learning_rate, precision, ...):
    unset hyper-parameters come from ``RECIPES[recipe]``, and an unknown keyword is refused, naming the nearest
    valid one. Returns the run's record (config.json) with the final metrics. Raises ``NonFiniteLoss`` if the
    loss blows up.
    """
    check_keywords(options, TrainConfig.option_names(), "train()")
    return train_with_config(TrainConfig(data, **options), out_dir, overwrite)


def train_with_config(config, out_dir, overwrite=False):
    """Train as ``config`` (a ``TrainConfig``) says into ``out_dir``, holding it (``vit_keras.locks``: a second
    writer is refused); see ``train``."""
    set_precision(config.precision)
    dist = get_strategy(config.strategy)  # before other TF or JAX work: several workers or hosts need a fresh start
    chief, _ = worker_role(dist)
    runs.check_out_dir(out_dir)
    with locks.hold(out_dir, "train") if chief else contextlib.nullcontext():  # the chief writes the run's files
        return train_in(config, out_dir, overwrite, dist)


def train_in(config, out_dir, overwrite, dist):
    """``train_with_config``'s run, in the held ``out_dir``."""
    precision, why_not = fast_precision(config.precision, cpu_features(), accelerator_count())
    if why_not:
        warnings.warn(f"`precision`={config.precision!r} would train slower than float32 here: {why_not}; "
                      "training in float32.", stacklevel=2)
        config = config.chosen(precision=precision)
        set_precision(precision)
    print(config.recipe_reason())
    print(f"{cpu_features().describe()}; precision {config.precision}")
    if config.weights and not is_saved_model(config.weights):
        resolve(config.weights)  # downloaded (or found missing) now, before the data is read or a warm-up runs
    config, estimate = with_image_size(config, lambda side: warmup.step_times(config, side, dist),
                                       None if overwrite else runs.recorded_choices(out_dir))
    strategies.check_batch_size(config.batch_size, dist)
    train_data, val_data = load_splits(config)
    with strategies.scope(dist):
        model, plan, micro = build_for_fit(config, train_data, dist)
    record = config.record(model.get_config(), train_data.class_names, plan.steps, micro, plan.accumulation,
                           strategies.replica_count(dist), len(train_data), len(val_data),
                           len(train_data.skipped) + len(val_data.skipped))
    chief, task = worker_role(dist)
    finished = runs.start_run(out_dir, record, chief, overwrite)
    if finished:
        return finished
    try:
        teacher = make_teacher(config, model.get_config(), out_dir, train_data, val_data, chief)
        seconds = fit(model, config, out_dir, train_data, val_data, plan, worker=None if chief else task,
                      dist=dist, teacher=teacher)
    except FileNotFoundError:
        # A worker may still write its last backup when the chief, done, removes every task's backups: the run
        # is complete, not broken, once the chief has recorded it so.
        if chief or not runs.read_json(os.path.join(out_dir, "config.json")).get("completed"):
            raise
        seconds = 0.0
    if estimate and seconds:
        print(compare_to_estimate(seconds, estimate))
    return runs.finish_run(out_dir, model, record, seconds, chief)


def load_splits(config):
    """The training and validation data (in memory, or streamed: ``vit_keras.training.inputs.load_splits``),
    decoded at the model's size where it is known beforehand."""
    return inputs.load_splits(config, decode_size(config.data, config.model_name, config.image_size, config.weights,
                                                  config.recipe))


def choose_flips(config, train_data):
    """Left-right flips for ``config.augment``, unless the flip rule (``vit_keras.data.flip_check``) finds that they
    change this data's labels: then the recipe's flips are turned off, and flips asked for get a warning."""
    augment = config.augmentation(len(train_data))
    if augment == "none" or len(train_data) < 20:  # too few images to tell
        return augment != "none"

    images, labels = ((train_data.images, train_data.labels) if not inputs.is_streamed(train_data) else
                      train_data.sample(flip_check.STREAM_PROBE_IMAGES, config.seed))
    keep, plain, flipped = flip_check.flips_keep_labels(images, labels, config.seed)
    if keep:
        return True
    if "augment" in config.from_recipe:
        print(f"flips off: they look label-changing on this data ({flip_check.describe(plain, flipped)}); "
              "`--augment flip` asks for them anyway.")
        return False
    print(f"warning: `augment`={augment!r} flips images, but flips look label-changing on this data "
          f"({flip_check.describe(plain, flipped)}).")
    return True


def make_teacher(config, vit, out_dir, train_data, val_data, chief=True):
    """The CNN teacher of a distilling run (``TrainConfig.distills``), trained on the un-augmented training images
    at the ViT's input (or the run folder's, when resuming; the chief saves it); None when the run does not
    distill. Every worker trains the same teacher: the same data, seed and steps."""
    if not config.distills(len(train_data)):
        return None

    def train_teacher():
        # Under a distribution strategy the teacher trains on this process's default device: its labels are made
        # by the input pipeline, outside the replicated step.
        plain = dataclasses.replace(config, augment="none", mixup=0.0, cutmix=0.0, erase=0.0)
        batches, val_batches = inputs.input_pipelines(vit, plain, train_data, val_data,
                                                      plain.build_augmentation("none", 0.0, flip=False),
                                                      steps_per_epoch=config.teacher_steps)
        return distill.train_teacher(batches, (*vit["image_size"], vit["channels"]), train_data.num_classes,
                                     config.teacher_steps, config.seed, val_batches)

    return distill.run_teacher(out_dir, train_teacher, save=chief)


def fit(model, config, out_dir, train_data, val_data, plan, worker=None, dist=None, teacher=None):
    """``model.fit`` as ``plan`` (a ``FitPlan``: the steps of an epoch, accumulated in fit steps) says, with the
    run folder's callbacks (``worker``: a non-chief task's name) on ``dist`` (a strategy of
    ``vit_keras.training.strategies``), the targets mixed with ``teacher``'s labels where there is one
    (``vit_keras.training.distill``); returns its seconds. A run cut short goes on from its newest backup
    (``vit_keras.training.backup``): one in the middle of an epoch first runs that epoch's remaining steps."""
    count, streamed = len(train_data), inputs.is_streamed(train_data)
    augmentation = config.augmentation_of(count, choose_flips(config, train_data))
    if plan.repeated:
        print(f"step floor: {config.epochs} epochs of {plan.steps} steps ({config.epochs * plan.steps:,} steps, "
              f"min_steps {config.min_steps:,}), {plan.steps * config.batch_size / count:.1f} passes over the training "
              f"images an epoch; augment {augmentation.augment!r}, erase {augmentation.erase}")
    start = backup.resume_point(model, runs.backup_dir(out_dir, worker))
    if start.path:
        print(start.describe(plan.fit_steps))
    started = time.perf_counter()
    for first, last, skip in plan.phases(start, config.epochs):
        fed_steps = plan.fit_steps - skip
        train_ds, val_ds = inputs.input_pipelines(model.get_config(), config, train_data, val_data, augmentation,
                                                  dist, plan.fit_steps if plan.fixed_steps(streamed) else None,
                                                  teacher, first if streamed else 0, plan.accumulation, skip)
        progress = (ProgressLog(config.batch_size // plan.accumulation, plan.fit_steps, config.epochs, start.epoch,
                                start.step) if fit_verbosity(config.verbose) == 2 else None)
        callbacks = runs.make_callbacks(out_dir, config.batch_size // plan.accumulation, worker, config.backup_every,
                                        config.tensorboard and worker is None, plan.accumulation, start, progress)
        with strategies.fit_scope(dist), warnings.catch_warnings():
            # A streamed validation split's size is known once read (unreadable files are skipped): Keras warns at
            # its end. The training stream has no end.
            warnings.filterwarnings("ignore", "Your input ran out of data")
            model.fit(train_ds, validation_data=val_ds, initial_epoch=first, epochs=last, callbacks=callbacks,
                      steps_per_epoch=fed_steps if plan.fixed_steps(streamed) or skip else None,
                      verbose=fit_verbosity(config.verbose), shuffle=False)  # the pipeline shuffles, seeded
    skipped = train_data.skipped + val_data.skipped
    if streamed and skipped:
        print(f"skipped {len(skipped):,} unreadable image(s) while streaming, e.g. {skipped[0][0]}")
    return time.perf_counter() - started
