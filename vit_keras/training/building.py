"""The model a run trains, built and compiled as its fit runs it: the recipe's small ViT, a named ViT (with
pretrained weights or none), or a saved model resized; steps accumulated where a batch's activations would not fit
(``vit_keras.training.memory``) and TensorFlow's concurrent micro-batches (``vit_keras.training.microbatch``)."""

import math

import keras
import numpy as np

from vit_keras import framework
from vit_keras.data.datasets import folder_image_size
from vit_keras.factory import create_model
from vit_keras.models.vision_transformer import VisionTransformer, load_model, resize_model
from vit_keras.training import inputs, memory, strategies
from vit_keras.training.config import RECIPE_SIDES, RECIPES, TrainConfig, check_weights, is_saved_model
from vit_keras.training.recipe import Recipe
from vit_keras.training.plan import FitPlan
from vit_keras.validation import pair


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


def build_model_to_train(num_classes, channels, data_size, config=None, image_size=None, pretrained=True,
                         class_names=None, **settings):
    """The model ``config`` (a ``TrainConfig``; default: one of ``settings``, its keywords) trains, taking raw
    0-255 pixels: its named ViT (``model_name``, with ``weights`` and ``model_overrides``), its saved model, or the
    recipe's small ViT for data of ``data_size`` (h, w) with ``channels``. ``image_size``: the input (default
    ``config``'s); ``pretrained``=False leaves a named ViT's weights random (the same model, to time it);
    ``class_names``: the data's, which the model keeps."""
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
    common = dict(num_classes=num_classes, channels=channels, include_preprocessing=True, drop_path=drop_path,
                  patch_dropout=config.patch_dropout, class_names=None if class_names is None else list(class_names))
    check_weights(weights, model_name, overrides)
    if is_saved_model(weights):
        return finetune_from(weights, num_classes, image_size, drop_path, common["class_names"],
                             config.patch_dropout)
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
    return create_model(model_name, image_size=image_size or data_size, weights=weights if pretrained else None,
                        **common, **overrides)


def decode_size(data, model_name=None, image_size=None, weights=None, recipe="quick"):
    """The size to decode folder images at, where the model's input size is known before they load: the
    asked ``image_size``, or the recipe's size for the folder. None: the data's own size."""
    if image_size is not None:
        return pair(image_size, "image_size")
    if model_name is None and not is_saved_model(weights) and str(data).startswith("folder:"):
        return recipe_image_size(folder_image_size(data[len("folder:"):]) or (28, 28), recipe)[0]
    return None


def finetune_from(path, num_classes, image_size=None, drop_path=None, class_names=None, patch_dropout=None):
    """A saved VisionTransformer, resized to ``image_size``, with a zero head for ``num_classes`` and the
    given ``drop_path`` and ``patch_dropout`` (None: the saved ones) and ``class_names`` (None: the saved ones where
    the head is kept)."""
    model = load_model(path)
    if image_size is not None:
        model = resize_model(model, image_size)
    config = model.get_config()
    changes = {key: value for key, value in dict(num_classes=num_classes, drop_path=drop_path,
                                                 patch_dropout=patch_dropout, class_names=class_names).items()
               if value is not None and config.get(key) != value}
    if changes:  # a new num_classes gets the paper's zero-initialized D x K head (section 3.2)
        model = model.rebuild(**changes)
    return model


def build_for_fit(config, train_data, dist):
    """(model, its ``FitPlan``, micro-batches its steps use): the model built and compiled in ``dist``'s scope."""
    num_classes, (height, width, channels) = train_data.num_classes, train_data.image_shape
    fixed = inputs.fixed_size(config.data, train_data) if config.model_name is None else None
    image_size = config.image_size or fixed  # the recipe's ViT trains on shards at their size
    model = build_model_to_train(num_classes, channels, (height, width), config, image_size,
                                 class_names=train_data.class_names)
    inputs.check_model_size(config.data, train_data, model)
    if len(train_data) < config.batch_size:
        raise ValueError(f"`batch_size`={config.batch_size} is larger than the {len(train_data)} "
                         "training images; use a smaller batch size.")
    steps_per_epoch = (inputs.stream_steps(config, train_data, dist) if inputs.is_streamed(train_data) else
                       config.steps_per_epoch(len(train_data)))
    plan, micro = compile_for_fit(model, config, steps_per_epoch,
                                  config.repeats_data(len(train_data)) and not inputs.is_streamed(train_data), dist)
    print(memory.describe(model.get_config(), config.batch_size, plan.accumulation))
    return model, plan, micro


def compile_for_fit(model, config, steps_per_epoch, repeated=False, dist=None):
    """(``FitPlan``, micro-batches a step uses): ``model`` compiled as ``config``'s fit runs it on ``dist``, for
    epochs of ``steps_per_epoch`` updates (``repeated``: several passes over a small dataset), through the
    ``Recipe`` the Python API gives its users too."""
    recipe = Recipe.from_config(config, model.get_config(), steps_per_epoch, dist)
    recipe.compile(model)
    if strategies.is_tf_multi_worker(dist):
        prebuild_multi_worker(model, recipe.step_batch_size, model.get_config()["num_classes"])
    return FitPlan(steps_per_epoch, recipe.accumulation, repeated), recipe.micro_batches


def prebuild_multi_worker(model, batch_size, num_classes):
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
