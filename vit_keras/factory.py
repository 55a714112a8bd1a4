"""``create_model``: a named ViT or a preset, with its weights if asked."""

import inspect

from vit_keras.models.configs import MODELS, model_config
from vit_keras.models.normalization import CHECKPOINT, check_normalization
from vit_keras.models.vision_transformer import VIT_KEYWORDS, VisionTransformer
from vit_keras.validation import check_keywords
from vit_keras.weights.loader import load_weights
from vit_keras.weights.normalization import recorded_normalization
from vit_keras.weights.presets import is_preset, preset_arguments


def create_model(
    name=None,
    image_size=None,
    num_classes=None,
    pooling="token",
    position_embedding="learned",
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
