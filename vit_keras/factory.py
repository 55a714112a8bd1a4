"""``create_model``: a named ViT, with its weights if asked."""

import inspect

from vit_keras.models.configs import model_config
from vit_keras.models.normalization import CHECKPOINT, check_normalization
from vit_keras.models.vision_transformer import VIT_KEYWORDS, VisionTransformer
from vit_keras.validation import check_keywords
from vit_keras.weights.loader import load_weights
from vit_keras.weights.normalization import recorded_normalization


def create_model(
    name="vit_b16",
    image_size=224,
    num_classes=1000,
    pooling="token",
    position_embedding="learned",
    dropout=0.0,
    drop_path=0.0,
    include_top=True,
    weights=None,
    **overrides,
):
    """Build a named ViT, optionally loading ``weights`` (a path or URL to a checkpoint, or a Hugging Face folder).

    ``overrides`` take any ``VisionTransformer`` argument (patch_size, hidden_size,
    num_heads, mlp_dim, num_layers, stem, channels, representation_size,
    include_preprocessing, pixel_mean, pixel_std, attention_dropout, gelu_approximate, ...).
    ``pixel_mean="checkpoint"`` takes the input normalization the weights record
    (``weights.checkpoint_normalization``), and refuses weights that record none.
    """
    check_keywords(overrides, VIT_KEYWORDS | set(inspect.signature(create_model).parameters) - {"overrides"},
                   "create_model")
    config = model_config(name, **overrides)
    config.setdefault("name", name)
    if CHECKPOINT in [config.get(key) for key in ("pixel_mean", "pixel_std") if isinstance(config.get(key), str)]:
        config["pixel_mean"], config["pixel_std"] = check_normalization(
            config.get("pixel_mean"), config.get("pixel_std"), int(config.get("channels", 3)),
            checkpoint=lambda: recorded_normalization(weights))
    model = VisionTransformer(
        image_size=image_size, num_classes=num_classes, pooling=pooling,
        position_embedding=position_embedding, dropout=dropout, drop_path=drop_path,
        include_top=include_top, **config,
    )
    if weights is not None:
        load_weights(model, weights)
    return model
