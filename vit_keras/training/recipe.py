"""A training recipe as plain Keras objects: the optimizer and its schedule, the loss and metrics a model compiles
with, the augmentation its training batches get, and the input size, batch and epochs its fit runs.

``Recipe.from_config`` makes one from a run's ``TrainConfig``; the CLI's fit (``vit_keras.training.building``) and
the Python entry point (``vit_keras.training.api.finetune_recipe``) both compile through ``Recipe.compile``, so
the two cannot drift.
"""

import dataclasses

import keras

from vit_keras.data.augmentation import NO_AUGMENTATION, Augmentation
from vit_keras.models.vision_transformer import VisionTransformer
from vit_keras.training import strategies
from vit_keras.training.optimizer import WarmupCosine, compile_model, make_optimizer
from vit_keras.validation import pair


@dataclasses.dataclass(frozen=True)
class Recipe:
    """How a model trains; every value is the user's to read or change (``dataclasses.replace``).

    image_size: the (h, w) input the model trains at. batch_size: images an optimizer update.
    accumulation: the steps whose gradients make one update (each of batch_size / accumulation images).
    epochs, steps_per_epoch: epochs, and updates an epoch (``fit_steps_per_epoch`` counts fit's steps).
    learning_rate: the peak, reached after ``warmup_steps`` updates of linear warm-up; then cosine decay to 0.
    optimizer: "sgd" (momentum 0.9) or "adamw"; weight_decay, label_smoothing, clipnorm (global norm).
    augmentation: the ``Augmentation`` of training batches (``vit_keras.image_dataset`` applies it).
    patch_dropout: the share of patch tokens each training image drops (the model's ``PatchDropout``; ``prepare``
      gives the model this rate).
    micro_batches: > 1 runs each step as that many concurrent XLA programs (TensorFlow, one device).
    steps_per_execution, jit_compile, precision, seed: as Keras's ``compile`` and the run's.
    estimated_seconds: the fit's estimated time where the image size was chosen by it; why: the choices, in words.
    """

    image_size: tuple
    batch_size: int
    epochs: int
    steps_per_epoch: int
    learning_rate: float
    warmup_steps: int = 0
    optimizer: str = "sgd"
    weight_decay: float = 0.0
    label_smoothing: float = 0.0
    augmentation: Augmentation = NO_AUGMENTATION
    patch_dropout: float = 0.0
    accumulation: int = 1
    micro_batches: int = 1
    steps_per_execution: int = 1
    jit_compile: bool | str = True
    precision: str = "float32"
    clipnorm: float = 1.0
    seed: int = 0
    estimated_seconds: float | None = None
    why: str = ""

    def __post_init__(self):
        object.__setattr__(self, "image_size", pair(self.image_size, "image_size"))
        if self.batch_size % self.accumulation:
            raise ValueError(f"`batch_size`={self.batch_size} must be divisible by `accumulation`="
                             f"{self.accumulation}.")
        if not isinstance(self.augmentation, Augmentation):
            raise ValueError(f"`augmentation` must be a vit_keras.data.augmentation.Augmentation; got "
                             f"{self.augmentation!r}.")

    @classmethod
    def from_config(cls, config, vit, steps_per_epoch, dist=None, train_examples=None, flip=True, **facts):
        """The recipe ``config`` (a ``TrainConfig``) gives the model ``vit`` (its config) on ``dist``: epochs of
        ``steps_per_epoch`` updates; the augmentation for ``train_examples`` images (small data gets the
        recipe's) with ``flip``; ``facts``: estimated_seconds, why."""
        single_device, backend = not strategies.is_distributed(dist), keras.backend.backend()
        micro = config.micro_batches if backend == "tensorflow" and single_device and config.jit_compile else 1
        accumulation = config.accumulation_of(vit, micro * strategies.replica_count(dist))
        # Keras 3.15: one step per execution under tf.distribute (its multi-step loop fails there) and on torch.
        # Accumulated steps run one update an execution where that is few steps, else one step (a long multi-step
        # loop holds more memory, and such steps are large, so a round trip each costs little).
        several_steps = backend == "jax" or (backend == "tensorflow" and single_device)
        per_execution = config.steps_per_execution if several_steps else 1
        if accumulation > 1:
            per_execution = accumulation if accumulation <= per_execution else 1
        total = steps_per_epoch * config.epochs
        augmentation = (config.augmentation_of(train_examples, flip) if train_examples else
                        config.build_augmentation(config.augment, config.erase, flip))
        return cls(vit["image_size"], config.batch_size, config.epochs, steps_per_epoch, config.learning_rate,
                   warmup_steps=min(int(steps_per_epoch * config.warmup_epochs), total), optimizer=config.optimizer,
                   weight_decay=config.weight_decay, label_smoothing=config.label_smoothing,
                   augmentation=augmentation, patch_dropout=config.patch_dropout, accumulation=accumulation,
                   micro_batches=micro, steps_per_execution=per_execution, jit_compile=config.jit_compile,
                   precision=config.precision, seed=config.seed, **facts)

    @property
    def fit_steps_per_epoch(self):
        """The steps ``model.fit`` takes an epoch: every update's accumulated steps."""
        return self.steps_per_epoch * self.accumulation

    @property
    def step_batch_size(self):
        """The images of one fit step (a batch ``vit_keras.image_dataset`` makes)."""
        return self.batch_size // self.accumulation

    def schedule(self):
        """Linear warm-up to the peak, then cosine decay to 0 at the last update (``WarmupCosine``)."""
        return WarmupCosine(self.learning_rate, self.steps_per_epoch * self.epochs, self.warmup_steps,
                            steps_per_update=self.accumulation)

    def make_optimizer(self):
        """The optimizer with the schedule, clipping and weight-decay exclusions (a new one each call)."""
        return make_optimizer(self.schedule(), self.weight_decay, self.clipnorm, self.precision, name=self.optimizer,
                              accumulation=self.accumulation)

    def loss(self):
        return keras.losses.CategoricalCrossentropy(from_logits=True, label_smoothing=self.label_smoothing)

    def compile(self, model):
        """``model`` compiled with the recipe (optimizer, loss on one-hot labels, accuracy; micro-batches where
        they run); returned."""
        backend = keras.backend.backend()
        compile_model(model, self.schedule(), self.precision, self.weight_decay, self.label_smoothing, self.clipnorm,
                      jit_compile=self.jit_compile and self.micro_batches == 1 and backend != "torch",
                      steps_per_execution=self.steps_per_execution, optimizer=self.optimizer,
                      accumulation=self.accumulation)
        if self.micro_batches > 1:
            from vit_keras.training.microbatch import enable_micro_batches

            enable_micro_batches(model, self.micro_batches)
        return model

    def prepare(self, model, class_names=None):
        """``model`` (a ``VisionTransformer``) at the recipe's image size (its position embedding resampled) and
        patch dropout, naming its classes ``class_names`` where given (e.g. the training data's), compiled
        (``compile``)."""
        if not isinstance(model, VisionTransformer):
            raise ValueError(f"`model` must be a vit_keras VisionTransformer; got {type(model).__name__}.")
        changes = {}
        if tuple(model.vit_config["image_size"]) != self.image_size:
            changes["image_size"] = self.image_size
        if model.vit_config.get("patch_dropout", 0.0) != self.patch_dropout:
            changes["patch_dropout"] = self.patch_dropout
        if class_names is not None and list(class_names) != model.class_names:
            if len(class_names) != model.vit_config["num_classes"]:
                raise ValueError(f"`class_names` names {len(class_names)} classes, but the model has "
                                 f"{model.vit_config['num_classes']}: build it with num_classes="
                                 f"{len(class_names)} (create_model(..., num_classes=len(train.class_names))).")
            changes["class_names"] = list(class_names)
        return self.compile(model.rebuild(**changes) if changes else model)

    def __str__(self):
        h, w = self.image_size
        optimizer = "SGD (momentum 0.9)" if self.optimizer == "sgd" else "AdamW"
        lines = [f"{h}x{w} px, batch {self.batch_size}"
                 + (f" in {self.accumulation} accumulated steps" if self.accumulation > 1 else "")
                 + f", {self.epochs} epochs of {self.steps_per_epoch} updates; {optimizer} at peak LR "
                 f"{self.learning_rate:.3g} after {self.warmup_steps} warm-up updates, then cosine decay; weight "
                 f"decay {self.weight_decay:g}, label smoothing {self.label_smoothing:g}, patch dropout "
                 f"{self.patch_dropout:g}, clipping at global norm "
                 f"{self.clipnorm:g}; augment {self.augmentation.augment!r} (crop scale "
                 f"{tuple(self.augmentation.crop_scale)}, flips {self.augmentation.flips}, erase "
                 f"{self.augmentation.erase:g})"]
        if self.why:
            lines.append(self.why)
        return "\n".join(lines)
