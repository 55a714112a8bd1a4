"""The Keras user's path: the fine-tuning recipe for a model in hand, and the batches ``model.fit`` takes.

    model = vit_keras.create_model("vit_tiny_patch16_224.augreg_in21k_ft_in1k", num_classes=10)
    recipe = vit_keras.finetune_recipe(model, "photos/train")      # size, optimizer, schedule, augmentation
    train = vit_keras.image_dataset("photos/train", recipe, training=True)
    model = recipe.prepare(model, train.class_names)                # at the recipe's size, compiled
    model.fit(train, validation_data=vit_keras.image_dataset("photos/test", recipe), epochs=recipe.epochs)

``finetune_recipe`` is the ``vit-keras train --weights ...`` recipe (``RECIPES["finetune"]``, the image size chosen
by a measured warm-up on this machine), as a ``Recipe`` of plain Keras objects. ``image_dataset`` reads a folder,
shards, a named dataset, arrays or a ``tf.data.Dataset``, in memory or streamed from disk as its size asks, and
returns a ``tf.data.Dataset`` under TensorFlow, a ``keras.utils.PyDataset`` under JAX and PyTorch.
"""

import dataclasses
import numbers
import os
import warnings

import keras
import numpy as np

from vit_keras.constants import INPUT_MODES, VAL_FRACTION
from vit_keras.data import datasets, sources
from vit_keras.data.arrays import ArrayDataset
from vit_keras.data.augmentation import Augmentation, Batching
from vit_keras.models.vision_transformer import VisionTransformer
from vit_keras.training import warmup
from vit_keras.training.config import MODEL_IN_HAND, RECIPE_SETTINGS, TrainConfig
from vit_keras.training.finetune import choose_image_size, fewer_epochs, model_shape, split_images
from vit_keras.training.recipe import Recipe
from vit_keras.training.train import choose_flips
from vit_keras.validation import check_choice, check_keywords, pair

# finetune_recipe's keywords besides its own: the recipe settings a run may change, and the run's options.
RECIPE_OPTIONS = (*RECIPE_SETTINGS, "learning_rate", "precision", "seed", "accumulate", "micro_batches",
                  "steps_per_execution", "jit_compile")
NAMED_DATA = ("fashion_mnist", "tfds:", "folder:", "shards:")
# image_dataset's tf.data batches are shuffled already; Keras says so at every fit (shuffle defaults to True).
warnings.filterwarnings("ignore", r"`shuffle=True` was passed, but will be ignored", UserWarning)


def finetune_recipe(model, train_data, val_data=0, image_size=None, measure=True, **options):
    """The fine-tuning recipe for ``model`` (a pretrained ``VisionTransformer``) on ``train_data``: a ``Recipe``.

    train_data, val_data: the training and validation images: counts, or data ``image_dataset`` reads (counted;
      of the training data, a sample is decoded for the flip rule, ``vit_keras.data.flip_check``: flips that change
      its labels are turned off, as the CLI does). The validation images only count toward the size's estimate.
    image_size: the input to fine-tune at; None: chosen as the CLI chooses it, the weights' own size with an
      accelerator, on CPUs the largest whose fit is estimated at most ``finetune.FIT_MINUTES`` minutes, from a
      short warm-up of this model on this machine (``measure``; False: from a fixed table, no warm-up), and with
      no ``epochs`` in ``options``, the epochs too (``vit_keras.training.finetune.choose_image_size``).
    options: the recipe's settings to change (epochs, batch_size, learning_rate, optimizer, weight_decay,
      label_smoothing, patch_dropout, augment, crop_scale, mixup, cutmix, erase, warmup_epochs, min_steps, ...),
      checked as the CLI's flags are. patch_dropout: the recipe's (``Recipe.prepare`` gives the model its rate).
    """
    if not isinstance(model, VisionTransformer):
        raise ValueError(f"`model` must be a vit_keras VisionTransformer; got {type(model).__name__}.")
    check_keywords(options, RECIPE_OPTIONS, "finetune_recipe")
    (train_size, listed), (val_size, _) = listing(train_data, "train_data"), listing(val_data, "val_data", empty=True)
    config = TrainConfig(MODEL_IN_HAND, recipe="finetune", weights=MODEL_IN_HAND, image_size=image_size,
                         drop_path=model.vit_config["drop_path"], **options)
    if train_size < config.batch_size:
        raise ValueError(f"`batch_size`={config.batch_size} is larger than the {train_size} training images; pass a "
                         "smaller `batch_size`.")
    vit, facts = {**model.get_config(), "patch_dropout": config.patch_dropout}, {}
    if image_size is None:
        measured = (lambda side: warmup.step_times(config, side, model=model)) if measure else None
        choice = choose_image_size(config, images=train_size, measure=measured, shape=model_shape(vit),
                                   val_images=val_size)
        config = config.chosen(**fewer_epochs(config, choice.epochs))
        vit = {**vit, "image_size": (choice.side, choice.side)}
        facts = dict(estimated_seconds=choice.seconds, why=choice.line())
    else:
        vit = {**vit, "image_size": pair(image_size, "image_size")}
    flip = choose_flips(config, listed) if listed is not None else True
    return Recipe.from_config(config, vit, config.steps_per_epoch(train_size), train_examples=train_size, flip=flip,
                              **facts)


def listing(data, name, empty=False):
    """(the images of ``data``, its examples where they can be read: arrays or a stream source, else None).
    ``data``: a count, or data ``image_dataset`` reads; a folder or shards are listed, not decoded."""
    if isinstance(data, numbers.Integral) and not isinstance(data, bool) and (data >= 1 or empty and data == 0):
        return int(data), None
    if isinstance(data, tuple) and len(data) == 2:
        arrays = array_split(data)
        return len(arrays), arrays
    if isinstance(data, (str, os.PathLike)):
        spec, split, whole = data_spec(data, None, training=True)
        listed = sources.list_split(spec, split, whole_folder=whole, val_fraction=VAL_FRACTION)
        return (len(listed), listed) if listed is not None else (split_images(TrainConfig(spec), split), None)
    length = getattr(data, "num_images", None)
    if length is not None:
        return int(length), None
    raise ValueError(f"`{name}` must be a count of images (a positive int) or data vit_keras.image_dataset reads "
                     f"(a folder, or one of {', '.join(NAMED_DATA)}...); got {data!r}.")


def data_spec(data, split, training):
    """(spec, split, whole folder) of a path or data spec: a folder of class folders is read whole unless a
    split is asked for; a folder of split folders (train/, val/, test/) gives the split asked, else train/ in
    training and val/ (or test/) otherwise."""
    text = os.fspath(data)
    if os.path.isdir(text):
        text = "folder:" + text
    if not text.startswith(NAMED_DATA):
        raise ValueError(f"`data`={text!r} is neither a folder nor a dataset name: pass a folder of class folders "
                         f"(or of train/, val/, test/ folders), one of {', '.join(NAMED_DATA)}..., arrays (images, "
                         "labels) or a tf.data.Dataset of (image, label).")
    whole = split is None and text.startswith("folder:") and not datasets.folder_layout(text[len("folder:"):])
    split = split or ("train" if training else "val")
    check_choice(split, "split", ("train", "val", "test"))
    return text, split, whole


def image_dataset(data, recipe=None, training=False, split=None, batch_size=None, image_size=None,
                  augmentation=None, class_names=None, seed=None, input_mode="auto"):
    """Batches of (float32 0-255 images, one-hot labels) of ``data`` for ``model.fit``/``evaluate``: a
    ``tf.data.Dataset`` under TensorFlow, a ``keras.utils.PyDataset`` otherwise; it has ``class_names`` and
    ``num_images``.

    data: a folder of class folders (read whole) or of split folders (``split``: "train", "val" or "test"),
      "folder:PATH", "shards:PATH" (``vit-keras prepare``), "fashion_mnist", "tfds:NAME"; (images, labels)
      arrays; or, under TensorFlow, a ``tf.data.Dataset`` of (uint8 image, int label) examples (needs
      ``class_names`` and, where its images differ in size, ``image_size``).
    recipe: a ``Recipe``: its image size, step batch, seed and, in ``training``, its augmentation and its
      steps an epoch (the data repeats where the recipe's step floor asks); each keyword given overrides it.
    training: shuffled, augmented and whole batches; else in order, as is, the last batch kept.
    input_mode: "auto" streams folders and shards from disk where their decoded images exceed the memory budget
      (``vit_keras.data.sources``), "memory" or "stream" forces either.
    """
    check_choice(training, "training", (True, False))
    check_choice(input_mode, "input_mode", INPUT_MODES)
    if recipe is not None and not isinstance(recipe, Recipe):
        raise ValueError(f"`recipe` must be a vit_keras Recipe (vit_keras.finetune_recipe) or None; got {recipe!r}.")
    batch_size = batch_size or (recipe.step_batch_size if recipe else 32)
    image_size = image_size or (recipe.image_size if recipe else None)
    seed = (recipe.seed if recipe else 0) if seed is None else seed
    if augmentation is None:
        augmentation = recipe.augmentation if recipe else Augmentation()
    steps = recipe.fit_steps_per_epoch if recipe and training else None
    if is_tf_dataset(data):
        from vit_keras.data.pipeline import example_batches

        if class_names is None:
            raise ValueError("`class_names` is needed with a tf.data.Dataset: the labels' names, in index order.")
        batching = Batching(len(class_names), image_size, None, batch_size, training, seed)
        dataset = example_batches(data, batching, augmentation, steps)
        return described(dataset, class_names, None)
    split_data = load_split(data, split, training, image_size, seed, input_mode, class_names)
    batching = Batching(split_data.num_classes, image_size, None, batch_size, training, seed)
    return described(batches(split_data, batching, augmentation, steps), split_data.class_names, len(split_data))


def is_tf_dataset(data):
    return type(data).__module__.startswith("tensorflow") and hasattr(data, "element_spec")


def load_split(data, split, training, image_size, seed, input_mode, class_names):
    """One split of ``data`` as an ``ArrayDataset`` or a stream source (``image_dataset``'s ``data``)."""
    if isinstance(data, tuple) and len(data) == 2:
        return array_split(data, class_names)
    spec, split, whole = data_spec(data, split, training)
    options = dict(seed=seed, image_size=image_size, val_fraction=VAL_FRACTION)
    listed = sources.list_split(spec, split, whole_folder=whole, **options)
    if listed is None:  # a named dataset: in memory
        return datasets.load_dataset(spec, split, **options)
    if not len(listed):
        raise ValueError(f"`data`={os.fspath(data)!r} has no images in its {split!r} split.")
    return listed if sources.choose_input(input_mode, [listed])[0] == "stream" else listed.decode_all()


def array_split(data, class_names=None):
    """(uint8 images, labels) as an ``ArrayDataset``, its classes ``class_names`` (default: "0", "1", ...)."""
    images, labels = np.asarray(data[0]), np.asarray(data[1], np.int64)
    if images.dtype != np.uint8:
        raise ValueError(f"`data` images must be uint8 0-255 pixels (N, H, W, C); got dtype {images.dtype}.")
    names = class_names or [str(i) for i in range(int(labels.max(initial=-1)) + 1)]
    return ArrayDataset(images if images.ndim == 4 else images[..., None], labels, list(names))


def batches(data, batching, augmentation, steps=None):
    """The batches of one split (in memory or streamed) on this process's backend; ``steps``: a training epoch's
    (the data repeats where a pass holds fewer)."""
    batching = batching.resolve(data.image_shape)
    streamed = not isinstance(data, ArrayDataset)
    per_pass = len(data) // batching.batch_size
    if keras.backend.backend() == "tensorflow":
        if streamed:
            from vit_keras.data.stream import stream_dataset

            dataset = stream_dataset(data, batching, augmentation, steps=steps, pass_per_iteration=True)
        else:
            from vit_keras.data.pipeline import make_dataset

            dataset = make_dataset(data.images, data.labels, **dataclasses.asdict(batching), augmentation=augmentation,
                                   repeat=bool(steps and steps > per_pass))
        return dataset.take(steps) if steps and batching.training else dataset
    if streamed:
        from vit_keras.data.stream_batches import StreamBatches

        return StreamBatches(data, batching, augmentation, steps)
    from vit_keras.data.array_pipeline import ArrayBatches, MemoryRows

    return ArrayBatches(MemoryRows(data.images, data.labels), batching, augmentation.in_training(batching.training),
                        batches_per_epoch=steps if steps and steps > per_pass else None)


def described(dataset, class_names, count):
    """``dataset`` with the names of its classes and its image count (None: unknown) as attributes."""
    dataset.class_names, dataset.num_images = list(class_names), count
    return dataset
