"""Random checkpoints in Google's exact layouts, from a seed (numpy only).

Shared by scripts/make_weight_fixtures.py (which runs them through timm to record the
expected logits) and tests/test_weights.py. ``np.random.RandomState`` streams are frozen
by numpy's compatibility policy (NEP 19), so the hybrids, whose ResNet stems are too big
to commit (~14M parameters), are regenerated bit for bit in the tests; a sha256 of the
arrays, recorded by the fixture script, proves it.
"""

import hashlib

import numpy as np

FIXTURES = "tests/fixtures/weights"
HYBRIDS = {  # name -> stem depths, seed, model config (small transformer on the real ResNet stems)
    "hybrid_r26_s32": dict(depths=(2, 2, 2, 2), seed=26, stride=32,
                           config=dict(image_size=64, hidden_size=64, num_heads=4, mlp_dim=128, num_layers=2,
                                       num_classes=10)),
    "hybrid_r50_b16": dict(depths=(3, 4, 9), seed=50, stride=16,
                           config=dict(image_size=64, hidden_size=64, num_heads=4, mlp_dim=128, num_layers=2,
                                       num_classes=10)),
}


def images(size, seed):
    """Fixed inputs in [-1, 1], (2, H, W, 3), as the Google checkpoints expect."""
    h, w = (size, size) if isinstance(size, int) else size
    return np.random.RandomState(seed).uniform(-1, 1, (2, h, w, 3)).astype(np.float32)


def _normal(rng, shape, scale):
    return (rng.standard_normal(shape) * scale).astype(np.float32)


def _norm(rng, out, name, width, scale_key="scale"):
    out[f"{name}/{scale_key}"] = 1.0 + _normal(rng, (width,), 0.1)
    out[f"{name}/bias"] = _normal(rng, (width,), 0.1)


def _dense(rng, out, name, shape):
    out[f"{name}/kernel"] = _normal(rng, shape, 1.0 / np.sqrt(np.prod(shape[:-1]) if len(shape) > 1 else 1))
    out[f"{name}/bias"] = _normal(rng, shape[-1:], 0.1)


def random_vit(rng, patch, channels, hidden, heads, mlp, layers, tokens, classes, representation=None,
               class_token=True, in_features=None):
    """google-research/vision_transformer's original layout (``in_features``: a hybrid's feature map)."""
    d, dh = hidden, hidden // heads
    out = {}
    kernel_in = in_features or channels
    out["embedding/kernel"] = _normal(rng, (patch, patch, kernel_in, d), 1.0 / np.sqrt(patch * patch * kernel_in))
    out["embedding/bias"] = _normal(rng, (d,), 0.1)
    if class_token:
        out["cls"] = _normal(rng, (1, 1, d), 0.1)
    out["Transformer/posembed_input/pos_embedding"] = _normal(rng, (1, tokens, d), 0.1)
    for i in range(layers):
        b = f"Transformer/encoderblock_{i}/"
        _norm(rng, out, b + "LayerNorm_0", d)
        for name in ("query", "key", "value"):
            out[f"{b}MultiHeadDotProductAttention_1/{name}/kernel"] = _normal(rng, (d, heads, dh), d ** -0.5)
            out[f"{b}MultiHeadDotProductAttention_1/{name}/bias"] = _normal(rng, (heads, dh), 0.1)
        out[f"{b}MultiHeadDotProductAttention_1/out/kernel"] = _normal(rng, (heads, dh, d), d ** -0.5)
        out[f"{b}MultiHeadDotProductAttention_1/out/bias"] = _normal(rng, (d,), 0.1)
        _norm(rng, out, b + "LayerNorm_2", d)
        _dense(rng, out, b + "MlpBlock_3/Dense_0", (d, mlp))
        _dense(rng, out, b + "MlpBlock_3/Dense_1", (mlp, d))
    _norm(rng, out, "Transformer/encoder_norm", d)
    if representation:
        _dense(rng, out, "pre_logits", (d, representation))
    _dense(rng, out, "head", (representation or d, classes))
    return out


def random_resnet(rng, depths, channels=3, width=64):
    """The hybrids' ResNet-v2 stem: conv_root, gn_root, block{b}/unit{u}/{conv,gn}{1,2,3,_proj}."""
    out = {"conv_root/kernel": _normal(rng, (7, 7, channels, width), 1.0)}
    _norm(rng, out, "gn_root", width)
    in_ch = width
    for b, depth in enumerate(depths, start=1):
        f = width * 2 ** (b - 1)
        for u in range(1, depth + 1):
            p = f"block{b}/unit{u}/"
            shapes = {"conv1": (1, 1, in_ch, f), "conv2": (3, 3, f, f), "conv3": (1, 1, f, 4 * f)}
            if u == 1:
                shapes["conv_proj"] = (1, 1, in_ch, 4 * f)
            for conv, shape in shapes.items():  # weight-standardized: the scale does not matter
                out[p + conv + "/kernel"] = _normal(rng, shape, 1.0)
                _norm(rng, out, p + conv.replace("conv", "gn"), shape[-1])
            in_ch = 4 * f
    return out, in_ch


def hybrid_checkpoint(name):
    spec = HYBRIDS[name]
    rng = np.random.RandomState(spec["seed"])
    cfg = spec["config"]
    stem, features = random_resnet(rng, spec["depths"])
    grid = cfg["image_size"] // spec["stride"]
    vit = random_vit(rng, 1, 3, cfg["hidden_size"], cfg["num_heads"], cfg["mlp_dim"], cfg["num_layers"],
                     grid * grid + 1, cfg["num_classes"], in_features=features)
    return {**stem, **vit}


BIG_VISION = {"MultiHeadDotProductAttention_1": "MultiHeadDotProductAttention_0", "LayerNorm_2": "LayerNorm_1",
              "MlpBlock_3": "MlpBlock_0"}


def to_big_vision(original, layers, scanned):
    """big_vision's layout: ``params/`` prefix, _0/_1 module names, top-level pos_embedding without a
    class row, and (scanned) one ``Transformer/encoderblock`` with a leading layer axis."""
    out = {}
    for name, value in original.items():
        if name == "Transformer/posembed_input/pos_embedding":
            name, value = "pos_embedding", value[:, 1:] if "cls" in original else value
        elif name.startswith("Transformer/encoderblock_"):
            parts = name.split("/")
            parts[2] = BIG_VISION.get(parts[2], parts[2])
            name = "/".join(parts)
        out["params/" + name] = value
    if scanned:
        stacked = {}
        for name in list(out):
            if "/encoderblock_0/" in name:
                rest = name.split("/encoderblock_0/")[1]
                stacked[f"params/Transformer/encoderblock/{rest}"] = np.stack(
                    [out.pop(name.replace("encoderblock_0", f"encoderblock_{i}")) for i in range(layers)])
        out.update(stacked)
    return out


def arrays_sha256(arrays):
    digest = hashlib.sha256()
    for name in sorted(arrays):
        digest.update(name.encode() + str(arrays[name].shape).encode() + np.ascontiguousarray(arrays[name]).tobytes())
    return digest.hexdigest()
