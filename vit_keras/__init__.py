"""vit-keras: Vision Transformers (Dosovitskiy et al., 2020) for Keras 3."""

import os

os.environ.setdefault("KERAS_BACKEND", "tensorflow")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

from .inference import predict, predict_function  # noqa: E402
from .microbatch import enable_micro_batches  # noqa: E402
from .layers import (  # noqa: E402
    DropPath,
    MultiHeadSelfAttention,
    PatchEncoder,
    Patches,
    TokenPooling,
    TransformerBlock,
)
from .models import (  # noqa: E402
    MODELS,
    VARIANTS,
    VisionTransformer,
    create_model,
    list_models,
    model_config,
    resize_model,
    resize_position_embedding,
    vit_b8,
    vit_b16,
    vit_b32,
    vit_h14,
    vit_l16,
    vit_l32,
    vit_r26_s32,
    vit_r50_b16,
    vit_r50_l32,
    vit_s16,
    vit_s32,
    vit_ti16,
)
from .stems import ConvStem, ResNetV2Stem, StdConv2D  # noqa: E402

__version__ = "0.1.0"
