"""PyTorch-ecosystem ``.safetensors`` (timm, Hugging Face) as the canonical Google layout.

Read with ``safetensors.numpy``; torch is never imported. PyTorch stores a Linear
weight as (out, in) and a Conv2d weight as (out, in, kh, kw); the Google layout keeps
(in, out) kernels and (kh, kw, in, out) convolutions, with attention projections split
per head. Supported names:
  timm ``VisionTransformer`` (+ hybrid ResNetV2 backbone):
    patch_embed.proj, cls_token, pos_embed, blocks.{i}.{norm1, attn.qkv, attn.proj, norm2,
    mlp.fc1, mlp.fc2}, norm, head; patch_embed.backbone.stem.{conv,norm},
    patch_embed.backbone.stages.{s}.blocks.{b}.{conv1..3, norm1..3, downsample.conv, downsample.norm}
    and the later ViTs' dist_token, head_dist (DeiT), reg_token (registers), blocks.{i}.ls{1,2}.gamma (LayerScale)
  Hugging Face ``ViTModel`` / ``ViTForImageClassification`` (optionally under ``vit.``), both the
  hub files' names and transformers 5's in-memory ones:
    embeddings.{cls_token, position_embeddings, patch_embeddings.projection},
    encoder.layer.{i}.{layernorm_before, attention.attention.{query,key,value}, attention.output.dense,
    layernorm_after, intermediate.dense, output.dense}  |  layers.{i}.{attention.{q,k,v,o}_proj, mlp.fc1, mlp.fc2},
    layernorm, pooler.dense (-> pre_logits, tanh), classifier (-> head);
  Hugging Face DeiT (under ``deit.``: embeddings.distillation_token, cls_classifier, distillation_classifier) and
  DINOv2 (under ``dinov2.``: embeddings.register_tokens, encoder.layer.{i}.{norm1, norm2, mlp.fc1, mlp.fc2,
  layer_scale1.lambda1, layer_scale2.lambda1}; its mask_token, a pre-training part, is dropped).
A distilled model's two heads are folded into one on [z^0; z^distil] (``models.readout``): the mean of their logits,
as DeiT predicts; a DeiT classifier without the distillation head reads z^0 alone (zeros for z^distil).

Names that map to nothing are kept as they are, so the loader lists them as unexpected.
"""

import re

import numpy as np

from vit_keras.weights.google import POS, Checkpoint, as_float32, corrupt_error

# canonical names of what the 2020 layout lacks (the loader's slots use the same ones)
DISTILLATION, REGISTERS, LAYER_SCALE = "dist", "registers", "LayerScale_{}/scale"

BLOCK = "Transformer/encoderblock_{}/"
MHA = BLOCK + "MultiHeadDotProductAttention_1/"
STAGE = r"patch_embed\.backbone\.stages\.(\d+)\.blocks\.(\d+)\."


def _unit(m):
    return f"block{int(m.group(1)) + 1}/unit{int(m.group(2)) + 1}/"


# (module regex, canonical module name from the match, kind)
TIMM_MODULES = [
    (r"patch_embed\.proj", lambda m: "embedding", "conv"),
    (r"patch_embed\.backbone\.stem\.conv", lambda m: "conv_root", "conv"),
    (r"patch_embed\.backbone\.stem\.norm", lambda m: "gn_root", "norm"),
    (STAGE + r"conv(\d)", lambda m: _unit(m) + f"conv{m.group(3)}", "conv"),
    (STAGE + r"norm(\d)", lambda m: _unit(m) + f"gn{m.group(3)}", "norm"),
    (STAGE + r"downsample\.conv", lambda m: _unit(m) + "conv_proj", "conv"),
    (STAGE + r"downsample\.norm", lambda m: _unit(m) + "gn_proj", "norm"),
    (r"blocks\.(\d+)\.norm1", lambda m: BLOCK.format(m.group(1)) + "LayerNorm_0", "norm"),
    (r"blocks\.(\d+)\.attn\.qkv", lambda m: MHA.format(m.group(1)), "qkv"),
    (r"blocks\.(\d+)\.attn\.proj", lambda m: MHA.format(m.group(1)) + "out", "out"),
    (r"blocks\.(\d+)\.norm2", lambda m: BLOCK.format(m.group(1)) + "LayerNorm_2", "norm"),
    (r"blocks\.(\d+)\.mlp\.fc1", lambda m: BLOCK.format(m.group(1)) + "MlpBlock_3/Dense_0", "linear"),
    (r"blocks\.(\d+)\.mlp\.fc2", lambda m: BLOCK.format(m.group(1)) + "MlpBlock_3/Dense_1", "linear"),
    (r"norm", lambda m: "Transformer/encoder_norm", "norm"),
    (r"head", lambda m: "head", "linear"),
    (r"head_dist", lambda m: DISTILLED_HEAD, "linear"),
]
TIMM_TENSORS = {"cls_token": "cls", "pos_embed": POS, "dist_token": DISTILLATION, "reg_token": REGISTERS}
TIMM_LAYER_SCALE = r"blocks\.(\d+)\.ls([12])\.gamma"
DISTILLED_HEAD = "head_distillation"  # folded into "head" before the checkpoint leaves canonical_torch

HF_LAYER = r"(?:encoder\.layer|layers)\.(\d+)\."
HF_QKV = {"query": "query", "key": "key", "value": "value", "q_proj": "query", "k_proj": "key", "v_proj": "value"}
HF_MODULES = [
    (r"embeddings\.patch_embeddings\.projection", lambda m: "embedding", "conv"),
    (HF_LAYER + r"(?:layernorm_before|norm1)", lambda m: BLOCK.format(m.group(1)) + "LayerNorm_0", "norm"),
    (HF_LAYER + r"attention\.(?:attention\.)?(query|key|value|q_proj|k_proj|v_proj)",
     lambda m: MHA.format(m.group(1)) + HF_QKV[m.group(2)], "heads"),
    (HF_LAYER + r"attention\.(?:output\.dense|o_proj)", lambda m: MHA.format(m.group(1)) + "out", "out"),
    (HF_LAYER + r"(?:layernorm_after|norm2)", lambda m: BLOCK.format(m.group(1)) + "LayerNorm_2", "norm"),
    (HF_LAYER + r"(?:intermediate\.dense|mlp\.fc1)", lambda m: BLOCK.format(m.group(1)) + "MlpBlock_3/Dense_0",
     "linear"),
    (HF_LAYER + r"(?:output\.dense|mlp\.fc2)", lambda m: BLOCK.format(m.group(1)) + "MlpBlock_3/Dense_1", "linear"),
    (r"layernorm", lambda m: "Transformer/encoder_norm", "norm"),
    (r"pooler\.dense", lambda m: "pre_logits", "linear"),
    (r"(?:cls_)?classifier", lambda m: "head", "linear"),
    (r"distillation_classifier", lambda m: DISTILLED_HEAD, "linear"),
]
HF_TENSORS = {"embeddings.cls_token": "cls", "embeddings.position_embeddings": POS,
              "embeddings.distillation_token": DISTILLATION, "embeddings.register_tokens": REGISTERS}
HF_LAYER_SCALE = HF_LAYER + r"layer_scale([12])\.lambda1"
HF_PREFIXES = ("vit.", "deit.", "dinov2.", "dinov2_with_registers.")
HF_DROPPED = ("embeddings.mask_token",)  # DINOv2's masked-image-modelling token: no part of inference


def read_safetensors(path):
    from safetensors import SafetensorError
    from safetensors.numpy import load_file

    try:
        return load_file(path)
    except (SafetensorError, OSError, ValueError, TypeError) as error:
        raise corrupt_error(path, ".safetensors", error) from error


def _convert(kind, param, value, num_heads):
    """One PyTorch tensor -> {canonical suffix: array}."""
    if kind == "norm":
        return {"scale" if param == "weight" else "bias": value}
    if kind == "conv":
        return {"kernel": value.transpose(2, 3, 1, 0)} if param == "weight" else {"bias": value}
    if kind == "linear":
        return {"kernel": value.T} if param == "weight" else {"bias": value}
    d_out = value.shape[0]
    if kind == "out":  # (D, H*Dh) -> (H, Dh, D)
        return {"kernel": value.T.reshape(num_heads, -1, d_out)} if param == "weight" else {"bias": value}
    if kind == "heads":  # (H*Dh, D) -> (D, H, Dh); bias (H*Dh,) -> (H, Dh)
        return {"kernel": value.T.reshape(value.shape[1], num_heads, -1)} if param == "weight" \
            else {"bias": value.reshape(num_heads, -1)}
    # timm's fused qkv: rows ordered [q | k | v]
    parts = np.split(value, 3, axis=0)
    return {f"{name}/{k}": v for name, part in zip(("query", "key", "value"), parts)
            for k, v in _convert("heads", param, part, num_heads).items()}


def canonical_torch(tensors, num_heads):
    """A timm or Hugging Face ViT state dict -> a ``Checkpoint`` in the canonical Google layout.

    A timm position table may lack the class-token row (``Checkpoint.timm_table``): the loader decides on the
    model's grid (``position.table_layout``)."""
    if any("patch_embeddings.projection" in k for k in tensors):
        modules, whole, scales, timm = HF_MODULES, HF_TENSORS, HF_LAYER_SCALE, False
        tensors = {strip_prefix(k, HF_PREFIXES): v for k, v in tensors.items() if strip_prefix(k, HF_PREFIXES)
                   not in HF_DROPPED}
    elif "patch_embed.proj.weight" in tensors:
        modules, whole, scales, timm = TIMM_MODULES, TIMM_TENSORS, TIMM_LAYER_SCALE, True
    else:
        shown = ", ".join(sorted(tensors)[:8])
        raise ValueError(
            "This .safetensors file is neither a timm VisionTransformer nor a Hugging Face ViT state dict "
            f"(no 'patch_embed.proj.weight' or '*embeddings.patch_embeddings.projection.weight'); it has: {shown}..."
        )
    out = {}
    for key, value in tensors.items():
        value = as_float32(value)
        if key in whole:
            out[whole[key]] = value
            continue
        scale = re.fullmatch(scales, key)
        if scale:
            out[BLOCK.format(scale.group(1)) + LAYER_SCALE.format(scale.group(2))] = value
            continue
        module, _, param = key.rpartition(".")
        for pattern, name, kind in modules:
            match = re.fullmatch(pattern, module)
            if match and param in ("weight", "bias"):
                base = name(match)
                for suffix, array in _convert(kind, param, value, num_heads).items():
                    out[f"{base}/{suffix}" if not base.endswith("/") else base + suffix] = array
                break
        else:
            out[key] = value  # unknown: reported by the loader as unexpected
    fold_distilled_head(out)
    # how the owner resamples E_pos at another size: timm and transformers' DINOv2-with-registers antialiased,
    # transformers' ViT, DeiT and DINOv2 not (PyTorch's plain bicubic)
    return Checkpoint(out, timm_table=timm and POS in out, antialias=timm or REGISTERS in out)


def strip_prefix(key, prefixes):
    return next((key[len(p):] for p in prefixes if key.startswith(p)), key)


def fold_distilled_head(arrays):
    """DeiT's heads on z^0 and z^distil as one head on [z^0; z^distil] (``models.readout``), in place: the
    mean of the two heads' logits. Without a distillation head (Hugging Face's DeiTForImageClassification reads
    z^0 alone) the z^distil half is zero."""
    if DISTILLATION not in arrays or "head/kernel" not in arrays:
        return
    kernel, bias = arrays["head/kernel"], arrays["head/bias"]
    if DISTILLED_HEAD + "/kernel" in arrays:
        kernel = np.concatenate([kernel, arrays.pop(DISTILLED_HEAD + "/kernel")]) / 2
        bias = (bias + arrays.pop(DISTILLED_HEAD + "/bias")) / 2
    else:
        kernel = np.concatenate([kernel, np.zeros_like(kernel)])
    arrays["head/kernel"], arrays["head/bias"] = kernel.astype("float32"), bias.astype("float32")
