"""Make tests/fixtures/weights/: small checkpoints in the real layouts + the reference's logits.

Run with the reference environment (torch, timm, transformers), not in CI:

    /work/.venv-ref/bin/python scripts/make_weight_fixtures.py

Each checkpoint gets random values in the exact layout of its source (Google's original and
AugReg npz, big_vision scanned / unscanned npz, the R26 and R50 hybrids, timm and Hugging Face
safetensors), is loaded by the reference loader (timm's ``_load_weights`` for npz, timm's
``checkpoint_filter_fn`` / ``load_state_dict`` and Hugging Face's ``from_pretrained`` for
safetensors), run on fixed inputs, and the logits are stored in expected.npz. The hybrids'
checkpoints (14M parameters of ResNet each) are not committed: tests regenerate them from
their seed and check their sha256. It also checks ``vit_keras``'s bicubic resampling matrix
against ``torch.nn.functional.interpolate(mode="bicubic", antialias=True)``.
"""

import os
import sys
from functools import partial

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import save_file as save_torch
from timm.layers import resample_abs_pos_embed
from timm.models.vision_transformer import VisionTransformer, _load_weights, checkpoint_filter_fn
from timm.models.vision_transformer_hybrid import HybridEmbed, _resnetv2

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, os.path.join(ROOT, "tests"))
import weight_checkpoints as wc  # noqa: E402

OUT = os.path.join(ROOT, wc.FIXTURES)
expected = {}


images = wc.images


@torch.no_grad()
def run(model, x):
    model.eval()
    return model(torch.from_numpy(x.transpose(0, 3, 1, 2).copy())).numpy()


def record(case, seed, logits, **extra):
    # the inputs are not stored: tests regenerate them with wc.images(image size, seed)
    expected[f"{case}/image_seed"] = np.asarray(seed)
    expected[f"{case}/logits"] = logits.astype(np.float32)
    for key, value in extra.items():
        expected[f"{case}/{key}"] = np.asarray(value)
    print(f"{case:28s} logits {logits.shape} |max| {np.abs(logits).max():.3f}")


def timm_vit(image, patch, d, heads, mlp, layers, classes, **kw):
    return VisionTransformer(img_size=image, patch_size=patch, embed_dim=d, depth=layers, num_heads=heads,
                             mlp_ratio=mlp / d, num_classes=classes, **kw)


def save_npz(name, arrays):
    path = os.path.join(OUT, name)
    np.savez(path, **arrays)
    return path


def google_cases():
    # 1. Original layout with pre_logits (the ImageNet-21k release): ViT /8.
    rng = np.random.RandomState(1)
    ckpt = wc.random_vit(rng, 8, 3, 64, 4, 128, 2, 17, 10, representation=64)
    path = save_npz("google_vit_pre_logits.npz", ckpt)
    model = timm_vit(32, 8, 64, 4, 128, 2, 10)
    _load_weights(model, path)
    x = images(32, 11)
    with torch.no_grad():  # timm dropped the representation layer: apply it and the head by hand
        model.eval()
        pooled = model.forward_head(model.forward_features(torch.from_numpy(x.transpose(0, 3, 1, 2).copy())),
                                    pre_logits=True)
        t = {k: torch.from_numpy(v) for k, v in ckpt.items()}
        logits = torch.tanh(pooled @ t["pre_logits/kernel"] + t["pre_logits/bias"]) @ t["head/kernel"] + t["head/bias"]
    record("google_vit_pre_logits", 11, logits.numpy())

    # 2. AugReg / fine-tuned layout (no pre_logits): ViT /16, plus loads at other resolutions.
    rng = np.random.RandomState(2)
    path = save_npz("google_augreg.npz", wc.random_vit(rng, 16, 3, 48, 3, 96, 3, 17, 7))
    model = timm_vit(64, 16, 48, 3, 96, 3, 7)
    _load_weights(model, path)
    record("google_augreg", 12, run(model, images(64, 12)))
    # timm's pretrained path (checkpoint_filter_fn) resamples with bicubic + antialias; its npz
    # loader uses bilinear, so the npz is first loaded at its own size, then re-filtered.
    for size in ((96, 80), (48, 48)):
        resized = timm_vit(size, 16, 48, 3, 96, 3, 7)
        resized.load_state_dict(checkpoint_filter_fn(model.state_dict(), resized))
        x = images(size, 13)
        record(f"google_augreg_{size[0]}x{size[1]}", 13, run(resized, x))

    # 3. big_vision, scanned blocks, class token (no position row for it): ViT /8.
    rng = np.random.RandomState(3)
    original = wc.random_vit(rng, 8, 3, 32, 2, 64, 2, 17, 5)
    path = save_npz("big_vision_scan.npz", wc.to_big_vision(original, 2, scanned=True))
    model = timm_vit(32, 8, 32, 2, 64, 2, 5, no_embed_class=True)
    _load_weights(model, path)
    record("big_vision_scan", 14, run(model, images(32, 14)))

    # 4. big_vision, unscanned blocks, global average pooling, no class token: ViT /14.
    rng = np.random.RandomState(4)
    original = wc.random_vit(rng, 14, 3, 32, 2, 64, 2, 9, 4, class_token=False)
    path = save_npz("big_vision_gap.npz", wc.to_big_vision(original, 2, scanned=False))
    model = timm_vit(42, 14, 32, 2, 64, 2, 4, class_token=False, global_pool="avg", fc_norm=False)
    _load_weights(model, path)
    record("big_vision_gap", 15, run(model, images(42, 15)))


TIMM_HYBRID_SAMPLES = [
    "patch_embed.backbone.stem.conv.weight", "patch_embed.backbone.stem.norm.weight",
    "patch_embed.backbone.stages.0.blocks.0.conv1.weight", "patch_embed.backbone.stages.0.blocks.0.norm3.bias",
    "patch_embed.backbone.stages.0.blocks.0.downsample.norm.weight",
    "patch_embed.backbone.stages.2.blocks.1.norm2.bias", "patch_embed.proj.bias",
]


def hybrid_cases():
    for name, spec in wc.HYBRIDS.items():
        ckpt = wc.hybrid_checkpoint(name)
        path = f"/tmp/{name}.npz"
        np.savez(path, **ckpt)
        cfg = spec["config"]
        backbone = _resnetv2(spec["depths"])
        model = timm_vit(cfg["image_size"], 1, cfg["hidden_size"], cfg["num_heads"], cfg["mlp_dim"],
                         cfg["num_layers"], cfg["num_classes"], embed_layer=partial(HybridEmbed, backbone=backbone))
        _load_weights(model, path)
        x = images(cfg["image_size"], 16)
        state = model.state_dict()
        record(name, 16, run(model, x), sha256=wc.arrays_sha256(ckpt),
               timm_keys=[f"{k}|{','.join(map(str, v.shape))}" for k, v in state.items()])
        # a few small tensors of timm's own state dict: tests check the timm-hybrid name mapping with them
        for key in TIMM_HYBRID_SAMPLES:
            expected[f"{name}/timm/{key}"] = state[key].numpy()
        os.remove(path)


def randomize(model, seed):
    """Every parameter random (LayerNorm scales near 1), so no weight is left at a trivial value."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            n = torch.randn(p.shape, generator=gen)
            if p.ndim == 1:
                p.copy_(1 + 0.1 * n if "norm" in name and name.endswith("weight") else 0.1 * n)
            elif "token" in name or "pos" in name:
                p.copy_(0.1 * n)
            else:
                p.copy_(n / np.sqrt(np.prod(p.shape[1:])))


def torch_cases():
    # 5. timm VisionTransformer state dict: ViT /16 at 48.
    model = timm_vit(48, 16, 64, 2, 128, 2, 6)
    randomize(model, 5)
    save_torch(model.state_dict(), os.path.join(OUT, "timm_vit.safetensors"))
    record("timm_vit", 17, run(model, images(48, 17)))

    from transformers import ViTConfig, ViTForImageClassification, ViTModel

    # 6. Hugging Face ViTForImageClassification, saved by save_pretrained (the hub's names).
    config = ViTConfig(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                       image_size=32, patch_size=8, num_labels=10)  # layer_norm_eps stays HF's 1e-12
    hf = ViTForImageClassification(config)
    randomize(hf, 6)
    hf.save_pretrained("/tmp/hf_vit_classifier")
    reloaded = ViTForImageClassification.from_pretrained("/tmp/hf_vit_classifier").eval()
    os.replace("/tmp/hf_vit_classifier/model.safetensors", os.path.join(OUT, "hf_vit_classifier.safetensors"))
    x = images(32, 18)
    with torch.no_grad():
        logits = reloaded(pixel_values=torch.from_numpy(x.transpose(0, 3, 1, 2).copy())).logits.numpy()
    record("hf_vit_classifier", 18, logits, layer_norm_eps=config.layer_norm_eps)

    # 7. Hugging Face ViTModel with its pooler (dense + tanh = pre_logits), transformers 5's names.
    config = ViTConfig(hidden_size=32, num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                       image_size=32, patch_size=8)
    hf = ViTModel(config).eval()
    randomize(hf, 7)
    save_torch(hf.state_dict(), os.path.join(OUT, "hf_vit_model.safetensors"))
    x = images(32, 19)
    with torch.no_grad():
        pooled = hf(pixel_values=torch.from_numpy(x.transpose(0, 3, 1, 2).copy())).pooler_output.numpy()
    record("hf_vit_model", 19, pooled, layer_norm_eps=config.layer_norm_eps)


def check_resample_matrix():
    """vit_keras.models.position.resample_matrix vs torch bicubic antialias=True, in float64 and float32."""
    source = open(os.path.join(ROOT, "vit_keras", "position.py")).read()
    start, end = source.index("def _cubic"), source.index("def resize_position_embedding")
    helpers = {"np": np}
    exec(source[start:end], helpers)  # the two pure-numpy helpers, without importing keras
    worst = {torch.float64: 0.0, torch.float32: 0.0}
    for old in (1, 2, 3, 4, 7, 14, 16, 24):
        for new in (1, 2, 3, 5, 6, 8, 12, 14, 24, 32):
            for dtype in worst:
                x = torch.randn(1, 4, old, old + 1, dtype=dtype)
                ref = F.interpolate(x, size=(new, new + 3), mode="bicubic", antialias=True).double().numpy()
                rows, cols = helpers["resample_matrix"](old, new), helpers["resample_matrix"](old + 1, new + 3)
                ours = np.einsum("ih,jw,bchw->bcij", rows, cols, x.double().numpy())
                worst[dtype] = max(worst[dtype], float(np.abs(ref - ours).max()))
    # and through timm's own function, on a class-token table
    pos = torch.randn(1, 1 + 16, 8)
    ref = resample_abs_pos_embed(pos, new_size=(6, 5), num_prefix_tokens=1).numpy()
    rows, cols = helpers["resample_matrix"](4, 6), helpers["resample_matrix"](4, 5)
    grid = np.einsum("ih,jw,bhwd->bijd", rows, cols, pos[:, 1:].double().numpy().reshape(1, 4, 4, 8))
    timm_diff = float(np.abs(ref[:, 1:] - grid.reshape(1, 30, 8)).max())
    print(f"resample matrix vs torch bicubic antialias: float64 {worst[torch.float64]:.2e}, "
          f"float32 {worst[torch.float32]:.2e}; vs timm resample_abs_pos_embed {timm_diff:.2e}")
    assert worst[torch.float64] < 1e-12 and timm_diff < 1e-5


def main():
    os.makedirs(OUT, exist_ok=True)
    torch.manual_seed(0)
    check_resample_matrix()
    google_cases()
    hybrid_cases()
    torch_cases()
    path = os.path.join(OUT, "expected.npz")
    np.savez(path, **expected)
    for name in os.listdir(OUT):
        os.chmod(os.path.join(OUT, name), 0o644)
    total = sum(os.path.getsize(os.path.join(OUT, f)) for f in os.listdir(OUT))
    print(f"wrote {len(os.listdir(OUT))} files, {total / 1e6:.2f} MB in {OUT}")


if __name__ == "__main__":
    main()
