"""vit-keras: Vision Transformers (Dosovitskiy et al., 2020) for Keras 3.

``import vit_keras`` is light: it imports neither Keras nor TensorFlow. Each public name loads its module on first
use (PEP 562), so the device runtime (``vit_keras.apps``) and the other Keras backends are not tied to TensorFlow.
"""

import importlib
import importlib.util
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ start-up chatter, if it is ever imported

__version__ = "0.1.0"

# public name -> the module that defines it
_EXPORTS = {
    "inference.predict": ("predict", "predict_function", "TopK"),
    "training.microbatch": ("enable_micro_batches",),
    "models.layers": ("DropPath", "PatchDropout", "PatchEncoder", "Patches"),
    "models.encoder": ("MultiHeadSelfAttention", "TransformerBlock"),
    "models.readout": ("TokenPooling",),
    "models.vision_transformer": ("VisionTransformer", "load_model", "resize_model"),
    "models.configs": ("MODELS", "VARIANTS", "list_models", "model_config"),
    "models.position": ("resize_position_embedding",),
    "models.stems": ("ConvStem", "ResNetV2Stem", "StdConv2D"),
    "factory": ("create_model", "from_pretrained"),
    "training.api": ("finetune_recipe", "image_dataset"),
    "training.recipe": ("Recipe",),
    "weights.presets": ("get_preset", "list_presets", "preset_labels"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

# Module names from before the subpackages: ``from vit_keras import vit, utils`` (the old vit-keras API) and
# ``from vit_keras import train`` keep working.
_MOVED = {
    "vit": "compat.vit", "utils": "compat.utils", "train": "training.train", "pipeline": "data.pipeline",
    "array_pipeline": "data.array_pipeline", "flip_check": "data.flip_check", "distill": "training.distill",
    "runs": "training.runs", "evaluation": "training.evaluation", "strategies": "training.strategies",
    "backends": "training.backends", "microbatch": "training.microbatch", "train_config": "training.config",
}

__all__ = sorted(_WHERE)


def __getattr__(name):
    if name in _WHERE:
        value = getattr(importlib.import_module(f".{_WHERE[name]}", __name__), name)
    elif name in _MOVED:
        value = importlib.import_module(f".{_MOVED[name]}", __name__)
    elif name.startswith("vit_"):  # the per-name factories that were here
        raise AttributeError(f"vit_keras.{name} is gone: build named models with vit_keras.create_model({name!r}, "
                             f"...). (vit_keras.vit.{name} is the old vit-keras API, which downloads weights.)")
    elif not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f".{name}", __name__)  # a subpackage: vit_keras.models, vit_keras.data, ...
    else:
        raise AttributeError(f"module 'vit_keras' has no attribute {name!r}")
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
