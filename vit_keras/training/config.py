"""A training run's settings: the recipes' defaults and ``TrainConfig``, checked in full when it is made.

``vit_keras.training.train.train(data, out_dir, **options)`` makes a ``TrainConfig`` from its keywords before any data
loads or any file is written. ``TrainConfig.record`` is what the run folder's config.json holds: the settings
that decide the run plus the facts of its data and model, and a rerun whose record is the same resumes it.
"""

import dataclasses
import numbers
import os

from vit_keras.constants import (BASE_BATCH_SIZE, BOUNDS, DISTILLATIONS, INPUT_MODES, MICRO_BATCHES, OPTIMIZERS,
                                 PRECISIONS, RECIPE_TABLES, STEPS_PER_EXECUTION, VAL_FRACTION)
from vit_keras.data.augmentation import Augmentation, check_crop_scale
from vit_keras.models.configs import MODELS
from vit_keras.training.backends import check_strategy
from vit_keras.training.memory import accumulation_steps
from vit_keras.training.plan import parse_every
from vit_keras.validation import check_choice, pair
from vit_keras.weights.describe import describe, is_described_folder
from vit_keras.weights.hub import hub_folder, is_hub_name
from vit_keras.weights.keras_hub import is_keras_hub_folder
from vit_keras.weights.presets import check_architecture, find_preset, nearest_presets

RECIPES = RECIPE_TABLES  # the recipes' tables (vit_keras.constants: the CLI's help states their values)

# The input sizes the recipes' ViT takes (vit_keras.training.train.recipe_image_size): images are resized to the first
# that holds them in whole patches.
RECIPE_SIDES = (28, 32, 64)
# The settings a recipe gives a value to when they are left unset (None).
RECIPE_SETTINGS = ("epochs", "min_steps", "batch_size", "optimizer", "weight_decay", "label_smoothing", "drop_path",
                   "patch_dropout", "augment", "crop_scale", "mixup", "cutmix", "erase", "warmup_epochs",
                   "teacher_steps")
# The settings config.json records as they are (with the run's facts: see ``TrainConfig.record``).
RECORDED = RECIPE_SETTINGS + ("data", "recipe", "precision", "strategy", "seed", "val_fraction", "limit", "weights",
                              "learning_rate", "distill")
VERBOSITIES = ("auto", 0, 1, 2)  # model.fit's
# What a checkpoint folder's config gives a run's model (``weights.describe``); the rest (pooling, normalization)
# create_model reads from the folder itself.
FOLDER_SHAPE = ("patch_size", "hidden_size", "num_heads", "mlp_dim", "num_layers", "norm_epsilon", "gelu_approximate",
                "class_token", "distillation_token", "register_tokens", "layer_scale")


def scaled_learning_rate(base_lr, batch_size, base_batch_size=BASE_BATCH_SIZE):
    """The linear scaling rule: the peak LR grows in proportion to the global batch size."""
    return base_lr * batch_size / base_batch_size


def is_saved_model(weights):
    """Whether ``weights`` is a .keras model (its own architecture), not a checkpoint for a named one."""
    return str(weights or "").endswith(".keras")


# ``weights`` of the recipe a model in hand fine-tunes with (``vit_keras.training.api.finetune_recipe``): the
# weights are the model's own, so no file is read.
MODEL_IN_HAND = "the model passed in"


def check_weights(weights, model_name, overrides):
    """A .keras file and a preset bring their own architecture; any other checkpoint needs a named model."""
    if not weights or weights == MODEL_IN_HAND:
        return
    if is_saved_model(weights):
        if model_name or overrides:
            raise ValueError(f"`weights`={str(weights)!r} is a saved model with its own architecture; drop "
                             f"`model_name`/architecture overrides ({model_name or ', '.join(overrides)}) or pass a "
                             "checkpoint (.npz, .safetensors) with `model_name`.")
    elif model_name is None and find_preset(weights) is None:
        near = [] if os.path.exists(str(weights)) else nearest_presets(weights)
        raise ValueError(f"`weights`={str(weights)!r} is a checkpoint for a named model: pass `model_name` (e.g. "
                         "'vit_ti16'), a preset, or a .keras model saved by an earlier run."
                         + (f" The nearest presets: {', '.join(near)}." if near else ""))


def is_count(value):
    """A positive int (bools are not counts)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool) and value >= 1


@dataclasses.dataclass(frozen=True)
class TrainConfig:
    """Everything ``train`` needs to know but the output folder; every value is checked when it is made.

    data: "fashion_mnist" | "tfds:NAME" | "folder:PATH" | "shards:PATH" (written by `vit-keras prepare`).
    model_name: a named ViT (``vit_keras.MODELS``); None: the recipe's small ViT for the data's size.
    image_size: the model's input size (default: the data's, or the quick recipe's for it).
    recipe: the defaults (``RECIPES``) of the hyper-parameters left unset (None), from epochs to warmup_epochs;
      unset: "finetune" where ``weights`` are given (they are pretrained), else "quick" (``recipe_reason`` says).
    optimizer: "adamw" (decoupled weight decay) or "sgd" (momentum 0.9), both clipped at global norm 1.
    min_steps: the fewest optimizer steps a run takes (the step floor of small data): when ``epochs`` passes over
      the data are fewer steps, each of the ``epochs`` epochs runs ``ceil(min_steps / epochs)`` steps over the
      repeated data (``steps_per_epoch``). Unset: the recipe's when ``epochs`` is unset too, else 0 (epochs as
      asked).
    learning_rate: the peak LR for the global ``batch_size`` (default: the recipe's base LR scaled linearly from
      batch 512, ``scaled_learning_rate``).
    drop_path: unset with a saved model as ``weights``: the saved model's own.
    patch_dropout: the share of patch tokens each training image drops (``vit_keras.models.layers.PatchDropout``);
      validation and inference see them all.
    crop_scale: (min, max) area fraction of the random-resized crops (``augment="crop"`` or "randaugment").
    erase: the probability that a training image has a random rectangle replaced by noise (random erasing, Zhong
      et al. 2020; ``vit_keras.data.array_pipeline.random_erase``).
    distill: "cnn": the ViT learns from a small CNN's labels too (DeiT's hard distillation, ``vit_keras.training.distill``),
      the CNN trained first for ``teacher_steps`` steps; "none": from the data's alone; "auto": "cnn" where the
      recipe's own ViT trains from scratch on data the step floor repeats (small data), else "none".
    weights: a .keras model to fine-tune, a checkpoint for ``model_name``, a preset name
      (``vit_keras.list_presets()``), which brings its model: another ``model_name`` or architecture is refused, or
      a keras-hub preset folder, whose config.json gives the model's shape when ``model_name`` is unset.
    limit, data_dir, val_fraction, seed: the data (the first ``limit`` examples of each split; tfds' folder; a
      folder dataset's held-out fraction; the shuffle, augmentation and initialization seed).
    backup_every: how often a run writes the state a rerun resumes from, besides each epoch's end: "auto" (every
      ``BACKUP_MINUTES`` minutes of training), "epoch" (epoch ends only), a number of steps, or "<m>min".
    accumulate: the steps whose gradients make one update of ``batch_size`` images (each step takes batch_size /
      accumulate of them); "auto": the fewest that keep a step's activations within ``ACTIVATION_BUDGET``
      (``vit_keras.training.memory``).
    input_mode: "auto" keeps data whose decoded images fit the memory budget in memory and streams larger
      data from disk ("folder:PATH", "shards:PATH"; ``vit_keras.data.sources.memory_budget``); "memory" or
      "stream" forces either.
    strategy: one of the Keras backend's (``vit_keras.constants.BACKEND_STRATEGIES``; ``vit_keras.training.strategies``).
    steps_per_execution: steps per call into the backend's compiled step: fewer Python round trips and callback
      syncs, the same results. Under tf.distribute strategies and on torch it is 1 (Keras 3.15's multi-step loop
      fails under MirroredStrategy; its torch trainer has none).
    micro_batches: > 1 computes each batch's gradients as that many concurrent XLA programs on a single device
      with ``jit_compile`` under TensorFlow (``vit_keras.training.microbatch``; BatchNorm then sees micro-batch
      statistics); other backends run one program per step.
    verbose, tensorboard: model.fit's progress display; TensorBoard logs in the run folder.
    model_overrides: VisionTransformer arguments (e.g. hidden_size, num_layers, patch_size) changing the
      architecture.
    """

    data: str
    model_name: str | None = None
    image_size: int | tuple | None = None
    recipe: str | None = None
    epochs: int | None = None
    min_steps: int | None = None
    batch_size: int | None = None
    optimizer: str | None = None
    learning_rate: float | None = None
    weight_decay: float | None = None
    label_smoothing: float | None = None
    drop_path: float | None = None
    patch_dropout: float | None = None
    augment: str | None = None
    crop_scale: tuple | list | None = None
    mixup: float | None = None
    cutmix: float | None = None
    erase: float | None = None
    warmup_epochs: float | None = None
    distill: str = "auto"
    teacher_steps: int | None = None
    precision: str = "float32"
    strategy: str = "auto"
    weights: str | None = None
    seed: int = 0
    limit: int | None = None
    data_dir: str | None = None
    val_fraction: float = VAL_FRACTION
    backup_every: int | str = "auto"
    accumulate: int | str = "auto"
    input_mode: str = "auto"
    jit_compile: bool | str = True
    steps_per_execution: int = STEPS_PER_EXECUTION
    micro_batches: int = MICRO_BATCHES
    verbose: int | str = "auto"
    tensorboard: bool = True
    model_overrides: dict | None = None
    # The recipe settings left unset, so the recipe's: the flip rule may turn the recipe's flips off, and small data
    # gets the recipe's small-data augmentation and erasing (``small_data_default``).
    from_recipe: frozenset = dataclasses.field(default=frozenset(), init=False, repr=False)

    @classmethod
    def option_names(cls):
        """The keywords ``train`` takes: every field but ``data`` and the derived ones."""
        return [field.name for field in dataclasses.fields(cls) if field.init and field.name != "data"]

    def __post_init__(self):
        self.choose_recipe()
        check_choice(self.precision, "precision", PRECISIONS)
        check_strategy(self.strategy)  # the choices of this process's Keras backend
        self.fill_from_recipe()
        self.check_model()
        self.check_hyper_parameters()
        self.check_run_options()
        if self.learning_rate is None:  # once batch_size is known to be a count
            object.__setattr__(self, "learning_rate",
                               scaled_learning_rate(RECIPES[self.recipe]["base_lr"], self.batch_size))

    def choose_recipe(self):
        """Unset (None): "finetune" where ``weights`` are given (pretrained), else "quick" (from scratch)."""
        if self.recipe is None:
            object.__setattr__(self, "recipe", "finetune" if self.weights else "quick")
        check_choice(self.recipe, "recipe", tuple(RECIPES))
        if self.recipe == "finetune" and not self.weights:
            raise ValueError("`recipe`='finetune' fine-tunes pretrained weights: pass `weights` (a preset, a "
                             "checkpoint or a .keras model), or choose 'quick' or 'long' to train from scratch.")

    def recipe_reason(self):
        """One line: the recipe the run uses and why."""
        if self.recipe != "finetune":
            why = "no pretrained weights: training from scratch" if not self.weights else \
                "asked for: training from scratch's defaults, though the weights are pretrained"
        else:
            why = f"the weights are pretrained ({self.weights})"
        optimizer = "SGD (momentum 0.9)" if self.optimizer == "sgd" else "AdamW"
        settings = (f"{optimizer} at peak LR {self.learning_rate:.3g}, batch {self.batch_size}, weight decay "
                    f"{self.weight_decay:g}, label smoothing {self.label_smoothing:g}, warm-up {self.warmup_epochs:g} "
                    f"epochs then cosine decay, {self.epochs_in_words()}")
        return f"recipe: {self.recipe}, because {why}: {settings}; every flag overrides it."

    def epochs_in_words(self):
        """"3 epochs", or where a fine-tune leaves them to the recipe "up to 3 epochs" (``finetune`` may choose
        fewer at a larger size)."""
        left = self.recipe == "finetune" and "epochs" in self.from_recipe and self.image_size is None
        return f"{'up to ' if left else ''}{self.epochs} epochs"

    def fill_from_recipe(self):
        """Unset hyper-parameters take the recipe's values; the crop scale becomes a [min, max] list."""
        defaults = RECIPES[self.recipe]
        unset = frozenset(name for name in RECIPE_SETTINGS if getattr(self, name) is None)
        object.__setattr__(self, "from_recipe", unset)
        keep_drop_path = is_saved_model(self.weights)  # a fine-tuned saved model keeps its own unless asked
        if self.min_steps is None and self.epochs is not None:  # epochs asked for: as many passes as asked
            object.__setattr__(self, "min_steps", 0)
        for name in RECIPE_SETTINGS:
            if getattr(self, name) is None and not (name == "drop_path" and keep_drop_path):
                object.__setattr__(self, name, defaults[name])
        object.__setattr__(self, "crop_scale", check_crop_scale(self.crop_scale))
        if isinstance(self.weights, os.PathLike):
            object.__setattr__(self, "weights", os.fspath(self.weights))

    def check_model(self):
        preset = find_preset(self.weights)
        if preset is not None:  # the preset brings its model: another name or architecture is refused
            check_architecture(preset, self.model_name, self.model_overrides or {})
            object.__setattr__(self, "model_name", preset.model)
        elif self.model_name is None and (is_hub_name(self.weights) or is_keras_hub_folder(str(self.weights))
                                          or is_described_folder(self.weights)):
            folder = hub_folder(self.weights) if is_hub_name(self.weights) else self.weights
            shape = {key: value for key, value in describe(folder).arguments.items() if key in FOLDER_SHAPE}
            object.__setattr__(self, "model_name", "vit_b16")  # a named model, its shape the folder's config
            object.__setattr__(self, "model_overrides", {**shape, **(self.model_overrides or {})})
        if self.model_name is not None:
            check_choice(self.model_name, "model_name", tuple(MODELS))
        if self.image_size is not None:
            pair(self.image_size, "image_size")
        if self.model_overrides is not None and not isinstance(self.model_overrides, dict):
            raise ValueError("`model_overrides` must be a dict of VisionTransformer arguments or None; got "
                             f"{self.model_overrides!r}.")
        check_weights(self.weights, self.model_name, self.model_overrides)

    def check_hyper_parameters(self):
        for name in ("epochs", "batch_size", "steps_per_execution", "micro_batches", "teacher_steps"):
            if not is_count(getattr(self, name)):
                raise ValueError(f"`{name}` must be a positive int; got {getattr(self, name)!r}.")
        if not (self.min_steps == 0 or is_count(self.min_steps)):
            raise ValueError(f"`min_steps` must be an int >= 0; got {self.min_steps!r}.")
        for name, test, bounds in BOUNDS:
            value = getattr(self, name)
            if value is None and name in ("drop_path", "learning_rate"):  # the saved model's; the scaled LR
                continue
            if not (isinstance(value, numbers.Real) and not isinstance(value, bool) and test(value)):
                raise ValueError(f"`{name}` must be {bounds}; got {value!r}.")
        self.build_augmentation(self.augment, self.erase)  # checks augment, crop_scale, mixup, cutmix and erase
        check_choice(self.optimizer, "optimizer", OPTIMIZERS)
        check_choice(self.distill, "distill", DISTILLATIONS)

    def check_run_options(self):
        if self.limit is not None and not is_count(self.limit):
            raise ValueError(f"`limit` must be a positive int or None; got {self.limit!r}.")
        if not (isinstance(self.seed, numbers.Integral) and not isinstance(self.seed, bool) and self.seed >= 0):
            raise ValueError(f"`seed` must be an int >= 0; got {self.seed!r}.")
        parse_every(self.backup_every)
        if self.accumulate != "auto" and not (is_count(self.accumulate) and self.batch_size % self.accumulate == 0):
            raise ValueError(f"`accumulate` must be 'auto' or a positive int that divides `batch_size`="
                             f"{self.batch_size}; got {self.accumulate!r}.")
        check_choice(self.input_mode, "input_mode", INPUT_MODES)
        check_choice(self.jit_compile, "jit_compile", (True, False, "auto"))
        check_choice(self.verbose, "verbose", VERBOSITIES)
        check_choice(self.tensorboard, "tensorboard", (True, False))

    def steps_per_epoch(self, train_examples, epochs=None):
        """Optimizer steps an epoch of a run of ``epochs`` (default: ``epochs``'s): one pass over the training
        examples (whole batches), or more where the step floor (``min_steps``) asks."""
        return max(train_examples // self.batch_size, -(-self.min_steps // (epochs or self.epochs)))

    def passes(self, train_examples):
        """How many times the run trains on each of its ``train_examples`` images."""
        return self.epochs * self.steps_per_epoch(train_examples) * self.batch_size / train_examples

    def chosen(self, **settings):
        """This config with ``settings`` the run chose (the image size, the epochs): the settings left to the
        recipe stay so (``from_recipe``), as ``dataclasses.replace`` alone would not keep them."""
        changed = dataclasses.replace(self, **settings)
        object.__setattr__(changed, "from_recipe", self.from_recipe)
        return changed

    def repeats_data(self, train_examples):
        """Whether the step floor makes each epoch several passes over the data (small data)."""
        return self.steps_per_epoch(train_examples) > train_examples // self.batch_size

    def small_data_default(self, name, train_examples):
        """Whether setting ``name`` takes the recipe's small-data value: it was left unset and the step floor
        repeats the data (many passes over each image). A value asked for is kept."""
        return name in self.from_recipe and self.repeats_data(train_examples)

    def augmentation(self, train_examples):
        """The augmentation the run uses: ``augment``, or where it was left to the recipe, on small data the
        recipe's ``small_data_augment`` (crops: more than flips), and in a run that sees each image once its
        ``single_pass_augment`` (nothing is seen twice, so nothing to vary)."""
        if self.small_data_default("augment", train_examples):
            return RECIPES[self.recipe]["small_data_augment"]
        if "augment" in self.from_recipe and self.passes(train_examples) <= 1:
            return RECIPES[self.recipe]["single_pass_augment"]
        return self.augment

    def build_augmentation(self, augment, erase, flip=True):
        """The ``Augmentation`` of these settings with ``augment``, ``erase`` and ``flip`` as given."""
        return Augmentation(augment, self.crop_scale, flip, self.mixup, self.cutmix, erase)

    def augmentation_of(self, train_examples, flip=True):
        """The run's ``Augmentation`` for ``train_examples`` images (``augmentation``, ``erasing``), with ``flip``."""
        return self.build_augmentation(self.augmentation(train_examples), self.erasing(train_examples), flip)

    def erasing(self, train_examples):
        """The random-erasing probability the run uses: ``erase``, or on small data the recipe's
        ``small_data_erase``, scaled down where the run makes fewer than ``erase_passes`` passes over the images
        (erasing counters memorizing images seen many times; with fewer passes it cost accuracy)."""
        if not self.small_data_default("erase", train_examples):
            return self.erase
        recipe = RECIPES[self.recipe]
        return round(recipe["small_data_erase"] * min(1.0, self.passes(train_examples) / recipe["erase_passes"]), 3)

    def distills(self, train_examples):
        """Whether the ViT learns from a CNN teacher's labels too: as asked, or under "auto" where the recipe's
        own ViT trains from scratch (no named model, no saved one) on data the step floor repeats."""
        if self.distill != "auto":
            return self.distill == "cnn"
        return self.model_name is None and not self.weights and self.repeats_data(train_examples)

    def accumulation_of(self, vit, parallel=1):
        """The steps an update of the model ``vit`` (its config) accumulates: ``accumulate``, or under "auto"
        ``memory.accumulation_steps``; each step's images divide evenly over ``parallel`` (devices, micro-batches)."""
        steps = accumulation_steps(vit, self.batch_size, parallel) if self.accumulate == "auto" else self.accumulate
        if (self.batch_size // steps) % parallel:
            raise ValueError(f"`batch_size`={self.batch_size} in {steps} accumulated steps gives steps of "
                             f"{self.batch_size // steps} images, which do not split over {parallel} devices or "
                             "micro-batches: change `accumulate` or `batch_size`.")
        return steps

    def record(self, vit, class_names, steps_per_epoch, micro_batches, accumulation, replicas, train_examples,
               val_examples, skipped_images):
        """The run's config.json: the recorded settings, the model's config (``vit``, whose drop_path is the
        one trained with), and the facts of the data and of the devices (``micro_batches`` as used)."""
        settings = dict({name: getattr(self, name) for name in RECORDED}, augment=self.augmentation(train_examples),
                        erase=self.erasing(train_examples),
                        distill="cnn" if self.distills(train_examples) else "none")
        return dict(settings, model=self.model_name or "vit_quick", drop_path=vit["drop_path"], vit=vit,
                    class_names=list(class_names), steps_per_epoch=steps_per_epoch, micro_batches=micro_batches,
                    accumulation=accumulation,
                    replicas=replicas, train_examples=train_examples, val_examples=val_examples,
                    skipped_images=skipped_images)
