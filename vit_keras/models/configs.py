"""The paper's model configs by name: a variant (Table 1, plus DeiT's Ti/S widths), a patch size and a stem."""

from vit_keras.models.vision_transformer import VIT_KEYWORDS
from vit_keras.validation import check_keywords

# Table 1 of the paper, plus the Ti/S widths of DeiT / AugReg.
VARIANTS = {
    "ti": dict(hidden_size=192, num_heads=3, mlp_dim=768, num_layers=12),
    "s": dict(hidden_size=384, num_heads=6, mlp_dim=1536, num_layers=12),
    "b": dict(hidden_size=768, num_heads=12, mlp_dim=3072, num_layers=12),
    "l": dict(hidden_size=1024, num_heads=16, mlp_dim=4096, num_layers=24),
    "h": dict(hidden_size=1280, num_heads=16, mlp_dim=5120, num_layers=32),
}

# name -> (variant, patch size, stem). Hybrids take 1x1 patches of the stem's feature map.
MODELS = {
    "vit_ti16": ("ti", 16, None),
    "vit_s16": ("s", 16, None),
    "vit_s32": ("s", 32, None),
    "vit_b16": ("b", 16, None),
    "vit_b32": ("b", 32, None),
    "vit_b8": ("b", 8, None),
    "vit_l16": ("l", 16, None),
    "vit_l32": ("l", 32, None),
    "vit_h14": ("h", 14, None),
    "vit_r26_s32": ("s", 32, "r26"),
    "vit_r50_b16": ("b", 16, "r50"),
    "vit_r50_l32": ("l", 32, "r50_s32"),
}


def list_models():
    """Names accepted by ``create_model``."""
    return sorted(MODELS)


def model_config(name, **overrides):
    """The constructor arguments of a named model with ``overrides`` applied."""
    if name not in MODELS:
        raise ValueError(f"Unknown model name {name!r}; valid names are {', '.join(list_models())}.")
    check_keywords(overrides, VIT_KEYWORDS, "model_config")
    variant, patch_size, stem = MODELS[name]
    config = dict(VARIANTS[variant], patch_size=patch_size, stem=stem)
    config.update({k: v for k, v in overrides.items() if v is not None or k == "stem"})
    return config


