"""Training: the paper's recipe with ``model.fit``, mixed precision, tf.distribute, resumable runs.

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
"""

import csv
import json
import math
import os
import time

import keras
import numpy as np
import tensorflow as tf

from .constants import PRECISIONS, STRATEGIES
from .layers import pair, register
from .microbatch import enable_micro_batches
from .runs import NonFiniteLoss  # noqa: F401  (re-exported: callers catch it from here)

# Variable names (``variable.name``) kept out of weight decay: LayerNorm/BatchNorm scale and offset,
# all biases, the position embeddings and the class token.
NO_DECAY_PATTERN = r"^(gamma|beta|bias|pos_embedding|pos_row|pos_col|pos_cls|cls)$"
BASE_BATCH_SIZE = 512


@register
class WarmupCosine(keras.optimizers.schedules.LearningRateSchedule):
    """Linear warmup from 0 to ``peak`` over ``warmup_steps``, then cosine decay to ``end`` at ``total_steps``."""

    def __init__(self, peak, total_steps, warmup_steps=0, end=0.0):
        if total_steps < 1 or not 0 <= warmup_steps <= total_steps:
            raise ValueError(f"Need 0 <= warmup_steps <= total_steps and total_steps >= 1; "
                             f"got warmup_steps={warmup_steps}, total_steps={total_steps}.")
        self.peak, self.end = float(peak), float(end)
        self.total_steps, self.warmup_steps = int(total_steps), int(warmup_steps)

    def __call__(self, step):
        step = tf.cast(step, tf.float32)
        warmup = self.peak * step / max(self.warmup_steps, 1)
        progress = tf.clip_by_value((step - self.warmup_steps) / max(self.total_steps - self.warmup_steps, 1), 0.0, 1.0)
        cosine = self.end + 0.5 * (self.peak - self.end) * (1.0 + tf.cos(math.pi * progress))
        return tf.where(step < self.warmup_steps, warmup, cosine)

    def get_config(self):
        return dict(peak=self.peak, total_steps=self.total_steps, warmup_steps=self.warmup_steps, end=self.end)


def scaled_learning_rate(base_lr, batch_size, base_batch_size=BASE_BATCH_SIZE):
    """The linear scaling rule: the peak LR grows in proportion to the global batch size."""
    return base_lr * batch_size / base_batch_size


def make_optimizer(schedule, weight_decay=0.05, clipnorm=1.0, precision="float32", beta_2=0.999):
    """AdamW with the no-decay exclusions and global-norm clipping (loss-scaled under float16)."""
    optimizer = keras.optimizers.AdamW(learning_rate=schedule, weight_decay=weight_decay, beta_1=0.9, beta_2=beta_2,
                                       global_clipnorm=clipnorm)
    optimizer.exclude_from_weight_decay(var_names=[NO_DECAY_PATTERN])
    if precision == "mixed_float16":
        optimizer = keras.optimizers.LossScaleOptimizer(optimizer)
    return optimizer


def set_precision(precision):
    """Set the global Keras dtype policy; call before building the model."""
    if precision not in PRECISIONS:
        raise ValueError(f"Unknown `precision`={precision!r}; valid values are {', '.join(map(repr, PRECISIONS))}.")
    keras.mixed_precision.set_global_policy(precision)


def get_strategy(name="auto"):
    """A tf.distribute strategy by name.

    auto: TPUStrategy when a TPU is found, MirroredStrategy with > 1 GPU, else the default.
    multi_worker: MultiWorkerMirroredStrategy; the cluster comes from the TF_CONFIG variable.
    tpu: TPUStrategy on the TPU named by TPU_NAME (empty: the local / Cloud TPU VM).
    """
    if name not in STRATEGIES:
        raise ValueError(f"Unknown `strategy`={name!r}; valid values are {', '.join(map(repr, STRATEGIES))}.")
    if name == "auto":
        if _tpu_present():
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


def _tpu_present():
    # Cheap checks first: a TPU VM exposes /dev/accel* or /dev/vfio; Cloud TPU nodes set TPU_NAME.
    if not (os.environ.get("TPU_NAME") or os.path.exists("/dev/accel0") or os.path.isdir("/dev/vfio")):
        return False
    try:
        tf.distribute.cluster_resolver.TPUClusterResolver(tpu=os.environ.get("TPU_NAME", ""))
        return True
    except (ValueError, tf.errors.NotFoundError):
        return False


def worker_role(strategy):
    """(is_chief, task name): only the chief writes the run's files; other workers keep their own backups."""
    resolver = getattr(strategy, "cluster_resolver", None)
    if resolver is None or not isinstance(strategy, tf.distribute.MultiWorkerMirroredStrategy):
        return True, "chief"
    task_type, task_id = resolver.task_type, resolver.task_id
    chief = task_type in (None, "chief") or (task_type == "worker" and task_id == 0 and
                                             "chief" not in resolver.cluster_spec().as_dict())
    return chief, f"{task_type}-{task_id}"


def compile_model(model, schedule, precision="float32", weight_decay=0.05, label_smoothing=0.1, clipnorm=1.0,
                  jit_compile="auto", steps_per_execution=1):
    """Compile with the recipe's optimizer and a label-smoothed loss on one-hot labels."""
    model.compile(
        optimizer=make_optimizer(schedule, weight_decay, clipnorm, precision),
        loss=keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=label_smoothing),
        metrics=[keras.metrics.CategoricalAccuracy(name="accuracy")],
        jit_compile=jit_compile,
        steps_per_execution=steps_per_execution,
    )
    return model


# The quick recipe: a hybrid ViT whose conv stem (two 3x3 stride-2 convs, Xiao et al. 2021) feeds a 7x7 or
# 8x8 token grid to 3 blocks of width 64, GAP pooling (no class token), tanh GELU. On Fashion-MNIST, 12 epochs
# reach 90.9-91.5% test in ~6 min of fit on 2 cores (docs/benchmarks.md: the runs and trials; peak LR 4e-3 at
# batch 128 beat 2e-3 and 6e-3, label smoothing 0.1 beat 0, batch 128 beat 256). The long recipe is the same
# design at width 96 and 4 blocks (0.32M parameters) for 30 epochs (91.95-92.15%), with flips only and drop-path
# 0.05: the 0.8M-parameter long recipe before it (random-resized crops, drop-path 0.1) was still under-fitted
# after 20 epochs (90.5%).
QUICK = dict(hidden_size=64, num_heads=2, mlp_dim=128, num_layers=3, pooling="gap", class_token=False,
             gelu_approximate=True, stem="conv")
RECIPES = {
    "quick": dict(model=QUICK, epochs=12, batch_size=128, base_lr=1.6e-2, weight_decay=0.05, warmup_epochs=0.5,
                  label_smoothing=0.1, drop_path=0.0, augment="flip", crop_scale=(0.35, 1.0), mixup=0.0, cutmix=0.0),
    "long": dict(model=dict(QUICK, hidden_size=96, num_heads=3, mlp_dim=192, num_layers=4), epochs=30,
                 batch_size=128, base_lr=1.6e-2, weight_decay=0.05, warmup_epochs=1, label_smoothing=0.1,
                 drop_path=0.05, augment="flip", crop_scale=(0.64, 1.0), mixup=0.0, cutmix=0.0),
}


def quick_patch(side):
    """A power-of-two patch (the conv stem halves the image per conv) giving a 7x7 or 8x8 grid, or close."""
    return 1 << max(round(math.log2(max(side, 2) / 7.5)), 1)


def quick_image_size(data_size):
    """The quick recipe's input size and patch: 28 -> (28, 4), 32 -> (32, 4), smaller up to 28, bigger to 64."""
    side = max(data_size)
    side = 28 if side <= 28 else 32 if side <= 32 else 64
    patch = quick_patch(side)
    return (side, side), patch


def build_model(num_classes, channels, data_size, model_name=None, image_size=None, recipe="quick",
                drop_path=0.0, weights=None, seed=0, overrides=None):
    """The model to train: a named ViT (``model_name``) or the recipe's small ViT, taking raw 0-255 pixels."""
    from .models import VisionTransformer, create_model

    keras.utils.set_random_seed(seed)
    common = dict(num_classes=num_classes, channels=channels, include_preprocessing=True, drop_path=drop_path)
    check_weights(weights, model_name, overrides)
    if is_saved_model(weights):
        return finetune_from(weights, num_classes, image_size, drop_path)
    if model_name is None:
        size, patch = quick_image_size(data_size)
        if image_size is not None:
            size = pair(image_size, "image_size")
            patch = quick_patch(max(size))
            if any(side % patch for side in size):  # e.g. 21 or 30: a 7x7 / 8x8 grid of odd-sized patches
                patch = max(max(size) // 7 if max(size) % 7 == 0 else max(size) // 8, 1)
        config = {**RECIPES[recipe]["model"], "patch_size": patch, **(overrides or {})}
        if config.get("stem") == "conv" and patch & (patch - 1):
            config["stem"] = None  # the conv stem halves per conv: plain patch embedding for other patches
        return VisionTransformer(image_size=size, name="vit_quick", **config, **common)
    return create_model(model_name, image_size=image_size or data_size, weights=weights, **common, **(overrides or {}))


def decode_size(data, model_name=None, image_size=None, weights=None):
    """The size to decode folder images at, where the model's input size is known before they load: the
    asked ``image_size``, or the quick recipe's size for the folder. None: the data's own size."""
    if image_size is not None:
        return pair(image_size, "image_size")
    if model_name is None and not is_saved_model(weights) and str(data).startswith("folder:"):
        from .data import folder_image_size

        return quick_image_size(folder_image_size(data[len("folder:"):]) or (28, 28))[0]
    return None


def is_saved_model(weights):
    """Whether ``weights`` is a .keras model (its own architecture), not a checkpoint for a named one."""
    return str(weights or "").endswith(".keras")


def check_weights(weights, model_name, overrides):
    """A .keras file brings its own architecture; any other checkpoint needs a named model to load into."""
    if not weights:
        return
    if is_saved_model(weights):
        if model_name or overrides:
            raise ValueError(f"`weights`={str(weights)!r} is a saved model with its own architecture; drop "
                             f"`model_name`/architecture overrides ({model_name or ', '.join(overrides)}) or pass a "
                             "checkpoint (.npz, .safetensors) with `model_name`.")
    elif model_name is None:
        raise ValueError(f"`weights`={str(weights)!r} is a checkpoint for a named model: pass `model_name` (e.g. "
                         "'vit_ti16'), or a .keras model saved by an earlier run.")


def finetune_from(path, num_classes, image_size=None, drop_path=None):
    """A saved VisionTransformer, resized to ``image_size``, with a zero head for ``num_classes`` and the
    given ``drop_path`` (None: the saved one)."""
    from .models import VisionTransformer, load_model, resize_model

    model = load_model(path)
    if image_size is not None:
        model = resize_model(model, image_size)
    config = model.get_config()
    changes = {key: value for key, value in dict(num_classes=num_classes, drop_path=drop_path).items()
               if value is not None and config[key] != value}
    if changes:
        fresh = VisionTransformer.from_config({**config, **changes})
        for source, target in zip(model.layers, fresh.layers):
            if target.name != "head" or "num_classes" not in changes:
                target.set_weights(source.get_weights())
            else:  # the paper's fine-tuning: a zero-initialized D x K head (section 3.2)
                target.set_weights([np.zeros_like(w) for w in target.get_weights()])
        model = fresh
    return model


def train(data, out_dir, model_name=None, image_size=None, recipe="quick", epochs=None, batch_size=None,
          learning_rate=None, weight_decay=None, label_smoothing=None, drop_path=None, augment=None, crop_scale=None,
          mixup=None, cutmix=None, warmup_epochs=None, precision="float32", strategy="auto", weights=None, seed=0,
          limit=None, data_dir=None, val_fraction=0.1, backup_every="epoch", jit_compile=True, steps_per_execution=8,
          micro_batches=2, verbose="auto", tensorboard=True, model_overrides=None):
    """Train on ``data`` ("fashion_mnist" | "tfds:NAME" | "folder:PATH") into ``out_dir``; rerun to resume.

    Unset hyper-parameters come from ``RECIPES[recipe]``; ``learning_rate`` is the peak LR for the
    given global ``batch_size`` (default: the recipe's base LR scaled linearly from batch 512).
    ``crop_scale`` = (min, max) area fraction of the random-resized crops (``augment="crop"`` or "randaugment").
    ``model_overrides`` (e.g. hidden_size, num_layers, patch_size) change the model's architecture.
    ``steps_per_execution`` steps run per call into TensorFlow on a single device: fewer Python round trips
    and callback syncs, the same results. Under other strategies it is 1 (Keras 3.15's multi-step loop fails
    under MirroredStrategy). ``micro_batches`` > 1 computes each batch's gradients as that many concurrent
    XLA programs on a single device (``vit_keras.microbatch``; BatchNorm then sees micro-batch statistics).
    Returns the resolved config with the final metrics. Raises ``NonFiniteLoss`` if the loss blows up.
    """
    from . import runs
    from .data import load_dataset
    from .pipeline import check_crop_scale, make_dataset

    if recipe not in RECIPES:
        raise ValueError(f"Unknown `recipe`={recipe!r}; valid values are {', '.join(map(repr, RECIPES))}.")
    set_precision(precision)
    dist = get_strategy(strategy)  # before other TF work: multi-worker needs a fresh context
    defaults = RECIPES[recipe]
    hp = dict(epochs=epochs, batch_size=batch_size, weight_decay=weight_decay, label_smoothing=label_smoothing,
              drop_path=drop_path, augment=augment, crop_scale=crop_scale, mixup=mixup, cutmix=cutmix,
              warmup_epochs=warmup_epochs)
    hp = {k: defaults[k] if v is None else v for k, v in hp.items()}
    hp["crop_scale"] = check_crop_scale(hp["crop_scale"])  # before anything is loaded or written
    check_weights(weights, model_name, model_overrides)
    for key, value in dict(epochs=hp["epochs"], batch_size=hp["batch_size"], steps_per_execution=steps_per_execution,
                           micro_batches=micro_batches).items():
        if int(value) < 1:
            raise ValueError(f"`{key}` must be a positive int; got {value}.")
    for key, valid, bounds in (("warmup_epochs", hp["warmup_epochs"] >= 0, ">= 0"),
                               ("weight_decay", hp["weight_decay"] >= 0, ">= 0"),
                               ("label_smoothing", 0 <= hp["label_smoothing"] < 1, "in [0, 1)"),
                               ("drop_path", 0 <= hp["drop_path"] < 1, "in [0, 1)"),
                               ("mixup", hp["mixup"] >= 0, ">= 0"), ("cutmix", hp["cutmix"] >= 0, ">= 0")):
        if not valid:  # before any data loads
            raise ValueError(f"`{key}` must be {bounds}; got {hp[key]}.")
    # A saved model fine-tuned without `drop_path` keeps its own (the recipe's default is for new models).
    keep_drop_path = drop_path is None and is_saved_model(weights)
    if learning_rate is not None and not learning_rate > 0:
        raise ValueError(f"`learning_rate` must be > 0; got {learning_rate}.")
    hp["learning_rate"] = learning_rate or scaled_learning_rate(defaults["base_lr"], hp["batch_size"])

    sources = dict(limit=limit, seed=seed, data_dir=data_dir, val_fraction=val_fraction,
                   image_size=decode_size(data, model_name, image_size, weights))
    train_data, val_data = load_dataset(data, "train", **sources), load_dataset(data, "val", **sources)
    num_classes, channels = train_data.num_classes, train_data.images.shape[-1]
    data_size = train_data.images.shape[1:3]
    chief, task = worker_role(dist)
    os.makedirs(out_dir, exist_ok=True)
    config_path = os.path.join(out_dir, "config.json")

    with dist.scope():
        model = build_model(num_classes, channels, data_size, model_name, image_size, recipe,
                            None if keep_drop_path else hp["drop_path"],
                            weights, seed, model_overrides)
        vit = model.get_config()
        hp["drop_path"] = vit["drop_path"]
        steps_per_epoch = len(train_data.images) // hp["batch_size"]
        if steps_per_epoch < 1:
            raise ValueError(f"`batch_size`={hp['batch_size']} is larger than the {len(train_data.images)} "
                             "training images; use a smaller batch size.")
        schedule = WarmupCosine(hp["learning_rate"], steps_per_epoch * hp["epochs"],
                                min(int(steps_per_epoch * hp["warmup_epochs"]), steps_per_epoch * hp["epochs"]))
        single_device = not tf.distribute.has_strategy()
        micro = int(micro_batches) if single_device and jit_compile else 1
        compile_model(model, schedule, precision, hp["weight_decay"], hp["label_smoothing"],
                      jit_compile=jit_compile and micro == 1,
                      steps_per_execution=steps_per_execution if single_device else 1)
        if micro > 1:
            enable_micro_batches(model, micro)
        if isinstance(dist, tf.distribute.MultiWorkerMirroredStrategy):
            _prebuild(model, hp["batch_size"], num_classes)

    config = dict(data=data, model=model_name or "vit_quick", recipe=recipe, precision=precision, strategy=strategy,
                  replicas=dist.num_replicas_in_sync, micro_batches=micro, seed=seed, val_fraction=val_fraction,
                  limit=limit, weights=weights, vit=vit,
                  class_names=train_data.class_names, train_examples=len(train_data.images),
                  val_examples=len(val_data.images), skipped_images=len(train_data.skipped) + len(val_data.skipped),
                  steps_per_epoch=steps_per_epoch, **hp)
    previous = runs.read_json(config_path)
    same = {k: previous.get(k) for k in config} == json.loads(json.dumps(config))
    if previous.get("completed") and same:
        print(f"{out_dir} already holds this finished run; nothing to do (delete the folder to retrain).")
        return previous
    if previous and not same and chief:  # another run's history and backup would mix in, or fail to restore
        print(f"{out_dir} holds a run with another config; starting this one afresh there.")
        runs.clear_run(out_dir)
    if chief:
        runs.write_json(config_path, config)
        runs.write_text(os.path.join(out_dir, "labels.txt"), "\n".join(train_data.class_names) + "\n")

    size, model_channels = vit["image_size"], vit["channels"]
    pipeline = dict(num_classes=num_classes, image_size=size, channels=model_channels, seed=seed)
    train_ds = make_dataset(train_data.images, train_data.labels, batch_size=hp["batch_size"], training=True,
                            augment=hp["augment"], crop_scale=hp["crop_scale"], mixup=hp["mixup"], cutmix=hp["cutmix"],
                            **pipeline)
    val_ds = make_dataset(val_data.images, val_data.labels, batch_size=hp["batch_size"], **pipeline)
    callbacks = runs.make_callbacks(out_dir, hp["batch_size"], None if chief else task, backup_every,
                                    tensorboard and chief)
    start = time.perf_counter()
    model.fit(train_ds, validation_data=val_ds, epochs=hp["epochs"], callbacks=callbacks, verbose=verbose,
              shuffle=False)  # the pipeline shuffles, seeded
    seconds = time.perf_counter() - start

    history_path = os.path.join(out_dir, "history.csv")
    if chief:
        runs.clean_history(history_path)
    config.update(completed=True, fit_seconds_last_session=round(seconds, 1), **_last_row(history_path))
    if chief:  # then the backups go, the workers' too: until the run is complete, a rerun must resume everywhere
        runs.save_model(model, os.path.join(out_dir, "model.keras"))
        runs.write_json(config_path, config)
        runs.remove_backups(out_dir)
    return config


def _prebuild(model, batch_size, num_classes):
    """Work around two Keras 3.15 TF-trainer bugs under MultiWorkerMirroredStrategy (per instance).

    1. ``fit`` builds the model by all-reducing a nested (x, y) batch, which the collective reduce
       cannot take ("unsupported type PerReplica"): build from shapes here and skip that step.
    2. Step logs are reduced with ``strategy.reduce("MEAN", v, axis=0)``, which fails on the scalar
       metrics: give them a leading axis of 1, so the mean over workers is the usual scalar.
    """
    x = np.zeros((batch_size, *model.input_shape[1:]), "float32")
    model._symbolic_build(data_batch=(x, np.zeros((batch_size, num_classes), "float32")))
    model._maybe_symbolic_build = lambda iterator=None, data_batch=None: None
    for name in ("train_step", "test_step"):
        step = getattr(model, name)
        setattr(model, name, lambda data, step=step: {k: tf.reshape(v, [1]) for k, v in step(data).items()})


def _last_row(path):
    """The final epoch's metrics from a CSV history, as floats."""
    try:
        with open(path) as f:
            rows = list(csv.DictReader(f))
    except OSError:
        return {}
    return {f"final_{k}": float(v) for k, v in rows[-1].items() if k != "epoch" and v} if rows else {}
