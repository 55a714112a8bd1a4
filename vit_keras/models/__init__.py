"""The architecture: the paper's equations 1-4 as Keras layers, and the model that chains them."""

from vit_keras.models.configs import MODELS, VARIANTS, list_models, model_config
from vit_keras.models.encoder import MultiHeadSelfAttention, TransformerBlock
from vit_keras.models.layers import DropPath, PatchDropout, PatchEncoder, Patches
from vit_keras.models.position import resize_position_embedding
from vit_keras.models.readout import TokenPooling
from vit_keras.models.stems import ConvStem, ResNetV2Stem, StdConv2D
from vit_keras.models.vision_transformer import VisionTransformer, load_model, resize_model

__all__ = [
    "MODELS", "VARIANTS", "ConvStem", "DropPath", "MultiHeadSelfAttention", "PatchDropout", "PatchEncoder", "Patches",
    "ResNetV2Stem", "StdConv2D", "TokenPooling", "TransformerBlock", "VisionTransformer", "list_models", "load_model", "model_config",
    "resize_model", "resize_position_embedding",
]
