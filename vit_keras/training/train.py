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

import dataclasses
import math
import os
import time
import warnings

import keras
import numpy as np

from vit_keras import framework
from vit_keras.constants import OPTIMIZERS, PRECISIONS
from vit_keras.data import flip_check
from vit_keras.data.datasets import folder_image_size
from vit_keras.factory import create_model
from vit_keras.models.layers import register
from vit_keras.models.vision_transformer import VisionTransformer, load_model, resize_model
from vit_keras.training import backup, distill, inputs, memory, runs, strategies
from vit_keras.training.plan import FitPlan
from vit_keras.training.progress import ProgressLog, fit_verbosity
from vit_keras.training.config import RECIPE_SIDES, RECIPES, TrainConfig, check_weights, is_saved_model
from vit_keras.training.finetune import compare_to_estimate, with_image_size
# Re-exported: callers catch NonFiniteLoss and read the recipe's rule and the choice of devices from here.
from vit_keras.training.config import scaled_learning_rate  # noqa: F401
from vit_keras.training.runs import NonFiniteLoss  # noqa: F401
from vit_keras.training.strategies import get_strategy, worker_role  # noqa: F401
from vit_keras.validation import check_choice, check_keywords, pair

# Variable names (``variable.name``) kept out of weight decay: LayerNorm/BatchNorm scale and offset,
# all biases, the position embeddings and the class token.
NO_DECAY_PATTERN = r"^(gamma|beta|bias|pos_embedding|pos_row|pos_col|pos_cls|cls|logit_scale)$"


@register
class WarmupCosine(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup from 0 to ``peak`` over ``warmup_steps``, then cosine decay to ``end`` at ``total_steps``,
    counted in updates: with ``steps_per_update`` > 1 (gradient accumulation) the optimizer's step count, which
    counts every accumulated step, is divided by it."""

    def __init__(self, peak, total_steps, warmup_steps=0, end=0.0, steps_per_update=1):
        if total_steps < 1 or not 0 <= warmup_steps <= total_steps:
            raise ValueError(f"Need 0 <= warmup_steps <= total_steps and total_steps >= 1; "
                             f"got warmup_steps={warmup_steps}, total_steps={total_steps}.")
        self.peak, self.end = float(peak), float(end)
        self.total_steps, self.warmup_steps = int(total_steps), int(warmup_steps)
        self.steps_per_update = int(steps_per_update)

    def __call__(self, step):
        ops = keras.ops
        step = ops.floor(ops.cast(step, "float32") / self.steps_per_update)
        warmup = self.peak * step / max(self.warmup_steps, 1)
        progress = ops.clip((step - self.warmup_steps) / max(self.total_steps - self.warmup_steps, 1), 0.0, 1.0)
        cosine = self.end + 0.5 * (self.peak - self.end) * (1.0 + ops.cos(math.pi * progress))
        return ops.where(step < self.warmup_steps, warmup, cosine)

    def get_config(self):
        return dict(peak=self.peak, total_steps=self.total_steps, warmup_steps=self.warmup_steps, end=self.end,
                    steps_per_update=self.steps_per_update)


def make_optimizer(schedule, weight_decay=0.05, clipnorm=1.0, precision="float32", beta_2=0.999, name="adamw",
                   accumulation=1):
    """AdamW, or SGD with momentum 0.9 (``name``="sgd", the paper's fine-tuning), with the no-decay exclusions and
    global-norm clipping (loss-scaled under float16); ``accumulation`` > 1 averages that many steps' gradients
    into each update (``schedule`` then counts steps, not updates)."""
    check_choice(name, "optimizer", OPTIMIZERS)
    common = dict(learning_rate=schedule, weight_decay=weight_decay, global_clipnorm=clipnorm,
                  gradient_accumulation_steps=accumulation if accumulation > 1 else None)
    if name == "sgd":
        optimizer = keras.optimizers.SGD(momentum=0.9, **common)
    else:
        optimizer = keras.optimizers.AdamW(beta_1=0.9, beta_2=beta_2, **common)
    optimizer.exclude_from_weight_decay(var_names=[NO_DECAY_PATTERN])
    if precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


def set_precision(precision):
    """Set the global Keras dtype policy; call before building the model."""
    check_choice(precision, "precision", PRECISIONS)
    keras.mixed_precision.set_global_policy(precision)


def compile_model(model, schedule, precision="float32", weight_decay=0.05, label_smoothing=0.1, clipnorm=1.0,
                  jit_compile="auto", steps_per_execution=1, optimizer="adamw", accumulation=1):
    """Compile with the recipe's optimizer and a label-smoothed loss on one-hot labels."""
    model.compile(
        optimizer=make_optimizer(schedule, weight_decay, clipnorm, precision, name=optimizer,
                                 accumulation=accumulation),
        loss=keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=label_smoothing),
        metrics=[keras.metrics.CategoricalAccuracy(name="accuracy")],
        jit_compile=jit_compile,
        steps_per_execution=steps_per_execution,
    )
    return model


def recipe_patch(side, grid):
    """A power-of-two patch (the conv stem halves the image per conv) giving a token grid of ``grid``'s sides
    (the recipe's (fewest, most) tokens a side), or close."""
    return 1 << max(round(math.log2(max(side, 2) / (sum(grid) / 2))), 1)


def recipe_image_size(data_size, recipe="quick"):
    """The recipe's input size and patch for images of ``data_size``: the first of ``RECIPE_SIDES`` that holds
    them in whole patches (the largest for bigger images). Both recipes' 4x4 grid: 28 or 32 -> (32, 8); bigger
    images -> (64, 16)."""
    side, grid = max(data_size), RECIPES[recipe]["grid"]
    for candidate in RECIPE_SIDES:
        patch = recipe_patch(candidate, grid)
        if (candidate >= side and candidate % patch == 0) or candidate == RECIPE_SIDES[-1]:
            return (candidate, candidate), patch


def build_model_to_train(num_classes, channels, data_size, config=None, image_size=None, **settings):
    """The model ``config`` (a ``TrainConfig``; default: one of ``settings``, its keywords) trains, taking raw
    0-255 pixels: its named ViT (``model_name``, with ``weights`` and ``model_overrides``), its saved model, or the
    recipe's small ViT for data of ``data_size`` (h, w) with ``channels``. ``image_size``: the input (default
    ``config``'s)."""
    if config is None:
        config = TrainConfig(settings.pop("data", "fashion_mnist"), **settings)
    elif settings:
        raise ValueError(f"build_model_to_train takes a `config` or settings, not both; got {sorted(settings)}.")
    image_size = config.image_size if image_size is None else image_size
    model_name, recipe, drop_path, weights = config.model_name, config.recipe, config.drop_path, config.weights
    keras.utils.set_random_seed(config.seed)
    overrides = dict(config.model_overrides or {})
    if "pooling" in overrides:  # a class token where its pooling reads one, unless asked otherwise
        overrides.setdefault("class_token", overrides["pooling"] == "token")
    common = dict(num_classes=num_classes, channels=channels, include_preprocessing=True, drop_path=drop_path)
    check_weights(weights, model_name, overrides)
    if is_saved_model(weights):
        return finetune_from(weights, num_classes, image_size, drop_path)
    if model_name is None:
        size, patch = recipe_image_size(data_size, recipe)
        if image_size is not None:
            size, grid = pair(image_size, "image_size"), RECIPES[recipe]["grid"]
            patch = recipe_patch(max(size), grid)
            if any(side % patch for side in size):  # e.g. 21 or 30: the largest whole patch, a grid a bit finer
                patch = next(p for p in range(max(max(size) // grid[0], 1), 0, -1) if not any(s % p for s in size))
        settings = {**RECIPES[recipe]["model"], "patch_size": patch, **overrides}
        if settings.get("stem") == "conv" and settings["patch_size"] & (settings["patch_size"] - 1):
            settings["stem"] = None  # the conv stem halves per conv: plain patch embedding for other patches
        return VisionTransformer(image_size=size, name="vit_quick", **settings, **common)
    return create_model(model_name, image_size=image_size or data_size, weights=weights, **common, **overrides)


def decode_size(data, model_name=None, image_size=None, weights=None, recipe="quick"):
    """The size to decode folder images at, where the model's input size is known before they load: the
    asked ``image_size``, or the recipe's size for the folder. None: the data's own size."""
    if image_size is not None:
        return pair(image_size, "image_size")
    if model_name is None and not is_saved_model(weights) and str(data).startswith("folder:"):
        return recipe_image_size(folder_image_size(data[len("folder:"):]) or (28, 28), recipe)[0]
    return None


def finetune_from(path, num_classes, image_size=None, drop_path=None):
    """A saved VisionTransformer, resized to ``image_size``, with a zero head for ``num_classes`` and the
    given ``drop_path`` (None: the saved one)."""
    model = load_model(path)
    if image_size is not None:
        model = resize_model(model, image_size)
    config = model.get_config()
    changes = {key: value for key, value in dict(num_classes=num_classes, drop_path=drop_path).items()
               if value is not None and config[key] != value}
    if changes:  # a new num_classes gets the paper's zero-initialized D x K head (section 3.2)
        model = model.rebuild(**changes)
    return model


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
    """Train as ``config`` (a ``TrainConfig``) says into ``out_dir``; see ``train``."""
    set_precision(config.precision)
    dist = get_strategy(config.strategy)  # before other TF or JAX work: several workers or hosts need a fresh start
    print(config.recipe_reason())
    config, estimate = with_image_size(config)
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


def build_for_fit(config, train_data, dist):
    """(model, its ``FitPlan``, micro-batches its steps use): the model built and compiled in ``dist``'s scope."""
    num_classes, (height, width, channels) = train_data.num_classes, train_data.image_shape
    fixed = inputs.fixed_size(config.data, train_data) if config.model_name is None else None
    image_size = config.image_size or fixed  # the recipe's ViT trains on shards at their size
    model = build_model_to_train(num_classes, channels, (height, width), config, image_size)
    inputs.check_model_size(config.data, train_data, model)
    if len(train_data) < config.batch_size:
        raise ValueError(f"`batch_size`={config.batch_size} is larger than the {len(train_data)} "
                         "training images; use a smaller batch size.")
    steps_per_epoch = (inputs.stream_steps(config, train_data, dist) if inputs.is_streamed(train_data) else
                       config.steps_per_epoch(len(train_data)))
    single_device, backend = not strategies.is_distributed(dist), keras.backend.backend()
    micro = config.micro_batches if backend == "tensorflow" and single_device and config.jit_compile else 1
    accumulation = config.accumulation_of(model.get_config(), micro * strategies.replica_count(dist))
    print(memory.describe(model.get_config(), config.batch_size, accumulation))
    plan = FitPlan(steps_per_epoch, accumulation,
                   config.repeats_data(len(train_data)) and not inputs.is_streamed(train_data))
    total = plan.steps * config.epochs
    schedule = WarmupCosine(config.learning_rate, total, min(int(plan.steps * config.warmup_epochs), total),
                            steps_per_update=accumulation)
    # Keras 3.15: one step per execution under tf.distribute (its multi-step loop fails there) and on torch.
    # Accumulated steps run one update an execution where that is few steps, else one step (a long multi-step
    # loop holds more memory, and such steps are large, so a round trip each costs little).
    several_steps = backend == "jax" or (backend == "tensorflow" and single_device)
    per_execution = config.steps_per_execution if several_steps else 1
    if accumulation > 1:
        per_execution = accumulation if accumulation <= per_execution else 1
    compile_model(model, schedule, config.precision, config.weight_decay, config.label_smoothing,
                  jit_compile=config.jit_compile and micro == 1 and backend != "torch",
                  steps_per_execution=per_execution, optimizer=config.optimizer, accumulation=accumulation)
    if micro > 1:
        from vit_keras.training.microbatch import enable_micro_batches

        enable_micro_batches(model, micro)
    if strategies.is_tf_multi_worker(dist):
        _prebuild(model, config.batch_size // accumulation, num_classes)
    return model, plan, micro


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


def _prebuild(model, batch_size, num_classes):
    """Work around two Keras 3.15 TF-trainer bugs under MultiWorkerMirroredStrategy (per instance).

    1. ``fit`` builds the model by all-reducing a nested (x, y) batch, which the collective reduce
       cannot take ("unsupported type PerReplica"): build from shapes here and skip that step.
    2. Step logs are reduced with ``strategy.reduce("MEAN", v, axis=0)``, which fails on the scalar
       metrics: give them a leading axis of 1, so the mean over workers is the usual scalar.
    """
    x = np.zeros((batch_size, *model.input_shape[1:]), "float32")
    framework.symbolic_build(model, (x, np.zeros((batch_size, num_classes), "float32")))
    framework.skip_symbolic_build(model)
    for name in ("train_step", "test_step"):
        step = getattr(model, name)
        setattr(model, name, lambda data, step=step: {k: keras.ops.reshape(v, [1]) for k, v in step(data).items()})
