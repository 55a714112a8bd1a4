"""What a checkpoint folder says about its model: the architecture, head, classes, normalization and eval resize.

    describe("vit-base-patch16-224/")   # a Hugging Face folder: config.json (+ preprocessor_config.json)
    describe("vit_small_patch16_224/")  # a timm folder: config.json with architecture and pretrained_cfg
    describe("keras_hub_preset/")       # a keras-hub preset: config.json, task.json, image_converter.json

Hugging Face folders state every dimension in config.json. timm folders name an architecture
(``vit_small_patch14_reg4_dinov2``) and may give ``model_args``; the dimensions then come from the weights' own
shapes (read from the safetensors header, no data), the head count from ``model_args`` or the name's size
(timm's ViTs have 64-wide heads). A part we don't build (SwiGLU, qk-norm, attention-pool heads, ...) is an error
that names the field or tensor and its value.
"""

import dataclasses
import os
import re

import numpy as np

from vit_keras.files import read_json
from vit_keras.weights.keras_hub import is_keras_hub_folder, keras_hub_arguments
from vit_keras.weights.normalization import TIMM_CONFIG, checkpoint_normalization

HF_MODEL_TYPES = ("vit", "deit", "dinov2", "dinov2_with_registers")
HF_GELU = {"gelu": False, "gelu_new": True, "gelu_pytorch_tanh": True}  # hidden_act -> gelu_approximate
TIMM_POOLS = {"token": "token", "avg": "gap"}
TIMM_HEADS = {"tiny": 3, "small": 6, "base": 12, "large": 16, "huge": 16}  # timm's ViT sizes' head counts
TIMM_NAME = re.compile(r"(?:vit|deit3?)_(?P<size>tiny|small|base|large|huge|giant)_(?:distilled_)?patch(?P<patch>\d+)")
# timm tensors of parts we don't build, and what they are
TIMM_UNSUPPORTED = {"fc_norm.weight": "fc_norm (a LayerNorm after the pooling)", "norm_pre.weight":
                    "norm_pre (CLIP's LayerNorm before the blocks)", "attn_pool.latent": "an attention-pool (MAP) head",
                    "blocks.0.attn.q_norm.weight": "qk-norm", "blocks.0.mlp.fc1_g.weight": "a SwiGLU MLP",
                    "blocks.0.mlp.w12.weight": "a SwiGLU MLP"}
WEIGHT_FILES = ("model.safetensors",)
ARCHITECTURE_KEYS = ("patch_size", "hidden_size", "num_heads", "mlp_dim", "num_layers", "channels")
RESAMPLE = {0: "nearest", 1: "lanczos", 2: "bilinear", 3: "bicubic"}  # PIL's codes, as image processors store them


@dataclasses.dataclass(frozen=True)
class Description:
    """A checkpoint folder's own account of its model.

    arguments: ``VisionTransformer`` keyword arguments (dimensions, head, tokens, pooling, epsilon, image size);
    class_names: the label of each class, or None; normalization: (mean, std) in [0, 1] units, or None;
    eval_resize: {"size": resize target, "crop": (h, w), "interpolation": name} as the folder evaluates, or None;
    weights: the file holding the weights; source: what was read, for messages.
    """

    arguments: dict
    class_names: list = None
    normalization: tuple = None
    eval_resize: dict = None
    weights: str = None
    source: str = ""


def describe(folder):
    """The ``Description`` of a checkpoint folder, or a ValueError naming what is missing or unsupported."""
    folder = os.fspath(folder)
    if not os.path.isdir(folder):
        raise ValueError(f"`weights` {folder} is not a folder; a checkpoint folder holds config.json and its weights.")
    if is_keras_hub_folder(folder):
        return Description(keras_hub_arguments(folder), normalization=checkpoint_normalization(folder),
                           weights=folder, source=f"{folder} (keras-hub preset)")
    config_path = os.path.join(folder, TIMM_CONFIG)
    config = read_json(config_path)
    if config is None:
        raise ValueError(f"{folder}: no {TIMM_CONFIG}; a Hugging Face, timm or keras-hub folder describes its model "
                         "there. Pass a model name with `weights` set to the checkpoint file instead.")
    weights = next((os.path.join(folder, n) for n in WEIGHT_FILES if os.path.isfile(os.path.join(folder, n))), None)
    if weights is None:
        raise ValueError(f"{folder}: no {' or '.join(WEIGHT_FILES)} (a .bin or .pth pickle is not read: "
                         "re-save it with safetensors).")
    if "model_type" in config:
        return hugging_face(config, config_path, weights)
    if "architecture" in config:
        return timm(config, config_path, weights)
    raise ValueError(f"{config_path}: neither a Hugging Face config (`model_type`) nor a timm one (`architecture`).")


def is_described_folder(weights):
    """Whether ``weights`` is a Hugging Face or timm folder, whose config.json describes the model."""
    if not isinstance(weights, (str, os.PathLike)) or not os.path.isdir(weights):
        return False
    config = read_json(os.path.join(weights, TIMM_CONFIG)) or {}
    return "model_type" in config or "architecture" in config


def tensor_shapes(path):
    """{name: shape} of a .safetensors file, from its header alone."""
    from safetensors import safe_open

    with safe_open(path, framework="numpy") as f:
        return {name: tuple(f.get_slice(name).get_shape()) for name in f.keys()}


def hugging_face(config, config_path, weights):
    """A transformers ViT, DeiT or DINOv2 folder."""
    model_type = config["model_type"]
    if model_type not in HF_MODEL_TYPES:
        raise ValueError(f"{config_path}: `model_type`={model_type!r} is not a ViT we build; we build "
                         f"{', '.join(HF_MODEL_TYPES)}.")
    for field, unsupported in (("use_swiglu_ffn", True), ("qkv_bias", False)):
        if field in config and config[field] == unsupported:
            raise ValueError(f"{config_path}: `{field}`={unsupported} is not a part we build.")
    act = config.get("hidden_act", "gelu")
    if act not in HF_GELU:
        raise ValueError(f"{config_path}: `hidden_act`={act!r}; we build {', '.join(HF_GELU)}.")
    architecture = (config.get("architectures") or [f"{model_type}Model"])[0]
    hidden = int(config["hidden_size"])
    arguments = dict(patch_size=int(config["patch_size"]), hidden_size=hidden,
                     num_heads=int(config["num_attention_heads"]), num_layers=int(config["num_hidden_layers"]),
                     mlp_dim=int(config.get("intermediate_size") or hidden * config.get("mlp_ratio", 4)),
                     channels=int(config.get("num_channels", 3)),
                     norm_epsilon=float(config.get("layer_norm_eps", 1e-12)),
                     gelu_approximate=HF_GELU[act], image_size=int(config.get("image_size", 224)))
    if model_type.startswith("dinov2"):
        arguments.update(layer_scale=float(config.get("layerscale_value", 1.0)),
                         register_tokens=int(config.get("num_register_tokens", 0)))
    if model_type == "deit":
        arguments["distillation_token"] = True
    shapes = tensor_shapes(weights)
    has_head = any(name.endswith("classifier.weight") for name in shapes)
    class_names = None
    if has_head:
        labels = {int(k): v for k, v in (config.get("id2label") or {}).items()}
        count = next(shape[0] for name, shape in shapes.items() if name.endswith("classifier.weight"))
        arguments["num_classes"] = count
        if len(labels) == count and not all(labels[i] == f"LABEL_{i}" for i in range(count)):
            class_names = [labels[i] for i in range(count)]
        if model_type.startswith("dinov2"):
            arguments["pooling"] = "token_gap"
    else:
        arguments["include_top"] = False
        if "pooler.dense.weight" in shapes or f"{model_type}.pooler.dense.weight" in shapes:
            arguments["representation_size"] = hidden
    resize = hugging_face_resize(read_json(os.path.join(os.path.dirname(config_path), "preprocessor_config.json")))
    if resize is not None:
        arguments["image_size"] = resize["crop"]
    return Description(arguments, class_names, checkpoint_normalization(os.path.dirname(config_path)), resize,
                       weights, f"{config_path} (Hugging Face {architecture})")


def hugging_face_resize(processor):
    """The eval resize an image processor declares: resize to ``size``, then center-crop ``crop``."""
    if not processor:
        return None
    size = processor.get("size")
    if isinstance(size, int):
        size = {"shortest_edge": size}
    size = size or {}
    target = size.get("shortest_edge") or (size.get("height"), size.get("width"))
    crop = processor.get("crop_size") if processor.get("do_center_crop") else None
    if isinstance(crop, dict):
        crop = (crop["height"], crop["width"])
    elif isinstance(crop, int):
        crop = (crop, crop)
    if crop is None:
        crop = target if isinstance(target, tuple) else (target, target)
    return dict(size=target, crop=tuple(int(c) for c in crop),
                interpolation=RESAMPLE.get(processor.get("resample", 2), "bilinear"))


def timm(config, config_path, weights):
    """A timm ViT folder (``save_for_hf`` / the Hub): architecture name, model_args, pretrained_cfg."""
    architecture = config["architecture"]
    pretrained = config.get("pretrained_cfg") or {}
    model_args = config.get("model_args") or {}
    shapes = tensor_shapes(weights)
    for tensor, part in TIMM_UNSUPPORTED.items():
        if tensor in shapes:
            raise ValueError(f"{config_path}: `architecture`={architecture!r} has {part} ({tensor}), which we "
                             "don't build.")
    if "patch_embed.proj.weight" not in shapes:
        raise ValueError(f"{config_path}: `architecture`={architecture!r} is not a plain ViT (no "
                         "patch_embed.proj.weight); we build timm's vit_*, deit_* and deit3_* models.")
    if "blocks.0.attn.qkv.bias" not in shapes:
        raise ValueError(f"{config_path}: `architecture`={architecture!r} has no qkv bias (qkv_bias=False), "
                         "which we don't build.")
    pool = config.get("global_pool", model_args.get("global_pool", "token"))
    if pool not in TIMM_POOLS:
        raise ValueError(f"{config_path}: `global_pool`={pool!r}; we build {', '.join(map(repr, TIMM_POOLS))}.")
    hidden, channels, patch, _ = (shapes["patch_embed.proj.weight"][i] for i in (0, 1, 2, 3))
    layers = len({name.split(".")[1] for name in shapes if name.startswith("blocks.")})
    name = TIMM_NAME.match(architecture)
    heads = model_args.get("num_heads") or (TIMM_HEADS.get(name.group("size")) if name else None) or hidden // 64
    arguments = dict(patch_size=patch, hidden_size=hidden, num_heads=int(heads), num_layers=layers,
                     mlp_dim=shapes["blocks.0.mlp.fc1.weight"][0], channels=channels, norm_epsilon=1e-6,
                     pooling=TIMM_POOLS[pool], class_token="cls_token" in shapes,
                     distillation_token="dist_token" in shapes,
                     register_tokens=shapes["reg_token"][1] if "reg_token" in shapes else 0,
                     layer_scale=1e-5 if "blocks.0.ls1.gamma" in shapes else None)
    input_size = pretrained.get("test_input_size") or pretrained.get("input_size") or model_args.get("img_size")
    if input_size is not None:
        arguments["image_size"] = tuple(input_size[-2:]) if not isinstance(input_size, int) else input_size
    if "head.weight" in shapes:
        arguments["num_classes"] = shapes["head.weight"][0]
    else:
        arguments["include_top"] = False
    names = config.get("label_names") or pretrained.get("label_names")
    class_names = list(names) if names and len(names) == arguments.get("num_classes") else None
    resize = None
    if input_size is not None:
        crop = tuple(arguments["image_size"]) if not isinstance(arguments["image_size"], int) \
            else (arguments["image_size"],) * 2
        pct = float(pretrained.get("test_crop_pct") or pretrained.get("crop_pct") or 0.875)
        resize = dict(size=int(crop[0] / pct), crop=crop, interpolation=pretrained.get("interpolation", "bicubic"))
    return Description(arguments, class_names, checkpoint_normalization(os.path.dirname(config_path)), resize,
                       weights, f"{config_path} (timm {architecture})")


def described_arguments(description, arguments, named=False):
    """``arguments`` (create_model's or from_pretrained's) with what the folder says filled in where unset (None).

    named: a model name was given, which fixes the dimensions (a folder of another size then fails to load, by
    name and shape). The folder's class names and normalization come with its own head and where none is given.
    """
    filled = dict(arguments)
    for key, value in description.arguments.items():
        if not (named and key in ARCHITECTURE_KEYS) and filled.get(key) is None:
            filled[key] = value
    if description.normalization and filled.get("pixel_mean") is None and filled.get("pixel_std") is None:
        mean, std = (list(v) for v in description.normalization)
        if filled.get("channels") == 1 and len(mean) == 3:  # grey from RGB: the loader folds the per-channel part
            mean, std = [float(np.mean(mean))], [float(np.mean(std))]
        filled["pixel_mean"], filled["pixel_std"] = mean, std
    own_head = filled.get("include_top", True) and filled.get("num_classes") == description.arguments.get(
        "num_classes")
    if own_head and description.class_names and filled.get("class_names") is None:
        filled["class_names"] = description.class_names
    return filled
