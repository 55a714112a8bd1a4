"""vit-keras: Vision Transformers (Dosovitskiy et al., 2020) for Keras 3.

``import vit_keras`` is light: it imports neither Keras nor TensorFlow. Each public name loads its module on first
use (PEP 562), so the device runtime (``vit_keras.apps``) and the other Keras backends are not tied to TensorFlow.
"""

import importlib
import importlib.util
import os

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")  # TensorFlow's C++ start-up chatter, if it is ever imported

__version__ = "0.1.0"

# public name -> the submodule that defines it
_EXPORTS = {
    "inference": ("predict", "predict_function"),
    "microbatch": ("enable_micro_batches",),
    "layers": ("DropPath", "PatchEncoder", "Patches"),
    "encoder": ("MultiHeadSelfAttention", "TransformerBlock"),
    "readout": ("TokenPooling",),
    "models": (
        "MODELS", "VARIANTS", "VisionTransformer", "create_model", "list_models", "load_model", "model_config",
        "resize_model", "vit_b8", "vit_b16", "vit_b32", "vit_h14", "vit_l16", "vit_l32",
        "vit_r26_s32", "vit_r50_b16", "vit_r50_l32", "vit_s16", "vit_s32", "vit_ti16",
    ),
    "position": ("resize_position_embedding",),
    "stems": ("ConvStem", "ResNetV2Stem", "StdConv2D"),
    "weights_presets": ("get_preset", "list_presets", "preset_labels"),
}
_WHERE = {name: module for module, names in _EXPORTS.items() for name in names}

__all__ = sorted(_WHERE)


def __getattr__(name):
    module = _WHERE.get(name)
    if module is not None:
        value = getattr(importlib.import_module(f".{module}", __name__), name)
    elif not name.startswith("_") and importlib.util.find_spec(f"{__name__}.{name}") is not None:
        value = importlib.import_module(f".{name}", __name__)  # a submodule: vit_keras.vit, vit_keras.train, ...
    else:
        raise AttributeError(f"module 'vit_keras' has no attribute {name!r}")
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__():
    return sorted(set(globals()) | set(__all__))
