"""``create_model``: a named ViT or a preset, with its weights if asked; ``from_pretrained``: the model a checkpoint
folder or hub name describes, whole."""

import inspect
import os

from vit_keras.models.configs import MODELS, model_config
from vit_keras.models.normalization import CHECKPOINT, check_normalization
from vit_keras.models.vision_transformer import VIT_KEYWORDS, VisionTransformer
from vit_keras.validation import check_keywords
from vit_keras.weights.describe import describe, described_arguments, is_described_folder
from vit_keras.weights.hub import hub_folder, is_hub_name
from vit_keras.weights.loader import load_weights
from vit_keras.weights.normalization import recorded_normalization
from vit_keras.weights.presets import is_preset, preset_arguments


def create_model(
    name=None,
    image_size=None,
    num_classes=None,
    pooling=None,
    position_embedding=None,
    dropout=0.0,
    drop_path=0.0,
    include_top=True,
    include_preprocessing=True,
    weights=None,
    **overrides,
):
    """Build a named ViT (default vit_b16, 224 pixels, 1,000 classes), optionally loading ``weights`` (a path or
    URL to a checkpoint, a Hugging Face or keras-hub folder, or a preset name).

    The model takes raw 0-255 pixels and normalizes them as its weights were trained
    (``include_preprocessing=True``, as every model a run saves and every exported file does);
    ``include_preprocessing=False`` takes normalized pixels instead. ``model.input_description`` says which.

    ``name`` may be a preset (``vit_keras.list_presets()``): its model with its weights, image size, classes and
    normalization, each unless given (``weights.presets.preset_arguments``). ``overrides`` take any
    ``VisionTransformer`` argument (patch_size, hidden_size, num_heads, mlp_dim, num_layers, stem, channels,
    representation_size, class_names, pixel_mean, pixel_std, attention_dropout, gelu_approximate, ...).
    ``pixel_mean="checkpoint"`` takes the input normalization the weights record
    (``weights.checkpoint_normalization``), and refuses weights that record none.
    """
    check_keywords(overrides, VIT_KEYWORDS | set(inspect.signature(create_model).parameters) - {"overrides"},
                   "create_model")
    if is_hub_name(weights):
        weights = hub_folder(weights)
    if is_described_folder(weights):  # a Hugging Face or timm folder: what it says fills what was left unset
        description = describe(weights)
        arguments = described_arguments(description, dict(
            overrides, image_size=image_size, num_classes=num_classes, pooling=pooling,
            position_embedding=position_embedding), named=name is not None)
        image_size, num_classes, pooling, position_embedding = (arguments.pop(key, None) for key in (
            "image_size", "num_classes", "pooling", "position_embedding"))
        arguments.pop("include_top", None)  # create_model's own: a folder without a head gets a new one
        overrides, weights = arguments, description.weights
    pooling, position_embedding = pooling or "token", position_embedding or "learned"
    if is_preset(name) or is_preset(weights) or (name is not None and name not in MODELS):
        name, weights, overrides = preset_arguments(name, weights, dict(
            overrides, image_size=image_size, num_classes=num_classes, pooling=pooling,
            position_embedding=position_embedding, include_top=include_top))
        image_size, num_classes, pooling, position_embedding, include_top = (overrides.pop(key) for key in (
            "image_size", "num_classes", "pooling", "position_embedding", "include_top"))
    config = model_config(name or "vit_b16", **overrides)
    config.setdefault("name", name or "vit_b16")
    if CHECKPOINT in [config.get(key) for key in ("pixel_mean", "pixel_std") if isinstance(config.get(key), str)]:
        config["pixel_mean"], config["pixel_std"] = check_normalization(
            config.get("pixel_mean"), config.get("pixel_std"), int(config.get("channels", 3)),
            checkpoint=lambda: recorded_normalization(weights))
    model = VisionTransformer(
        image_size=224 if image_size is None else image_size, num_classes=1000 if num_classes is None else num_classes,
        pooling=pooling, position_embedding=position_embedding, dropout=dropout, drop_path=drop_path,
        include_top=include_top, include_preprocessing=include_preprocessing, **config,
    )
    if weights is not None:
        load_weights(model, weights)
    return model


def from_pretrained(source, include_preprocessing=True, cache_dir=None, **overrides):
    """The whole model a checkpoint describes, with its weights: its architecture, head, class names, layer-norm
    epsilon, tokens, pooling and input normalization, as the checkpoint's own files state them.

    source: a Hugging Face or timm folder (config.json + model.safetensors, as ``save_pretrained`` and timm's
      ``save_for_hf`` write them), a keras-hub preset folder, a hub name (``hf://org/name``, ``hf-hub:org/name``,
      fetched through huggingface_hub's cache), or one of our presets (``vit_keras.list_presets()``).
    overrides: any ``VisionTransformer`` argument, over the folder's. Another ``num_classes`` than the folder's
      drops its head (a new one starts at zero, and its class names go with it): fine-tuning.
    include_preprocessing: the model takes 0-255 pixels and normalizes them as the folder says.
    """
    if is_preset(source):
        return create_model(source, include_preprocessing=include_preprocessing, **overrides)
    folder = hub_folder(source, cache_dir) if is_hub_name(source) else os.fspath(source)
    description = describe(folder)
    given = dict(overrides)
    if given.get("num_classes") is not None:
        given.setdefault("include_top", True)
    arguments = described_arguments(description, given)
    model = VisionTransformer(include_preprocessing=include_preprocessing, **arguments)
    load_weights(model, description.weights)
    return model
