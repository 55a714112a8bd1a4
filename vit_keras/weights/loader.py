"""Pretrained weights in and out of a ``VisionTransformer``.

    load_weights(model, "ViT-B_16.npz")                   # Google / AugReg / hybrid / big_vision .npz
    load_weights(model, "model.safetensors")              # timm or Hugging Face ViT
    load_weights(model, "vit-base-patch16-224/")           # a Hugging Face / timm folder: its model.safetensors
    load_weights(model, "keras_hub_preset/")               # a keras-hub ViT preset (save_to_preset's folder)
    checkpoint_normalization("vit-base-patch16-224/")      # the (mean, std) the folder records, or None
    load_weights(model, "https://.../x.npz#sha256=...")   # downloaded once into the cache
    save_npz(model, "mine.npz")                           # the original Google layout

Every format is first read into one canonical layout (google-research/vision_transformer's
names and shapes, see ``weights_google``), then checked against the model as a whole:
nothing is assigned until every array fits, so a model is never left half-loaded.
What may legitimately differ is handled, with a warning, the paper's way:
  * another number of classes (or a checkpoint without a head): the head is skipped and starts at
    zero, and so is a checkpoint's ``pre_logits`` layer skipped if the model has none (fine-tuning
    replaces the whole head with a zero-initialized one, section 3.2);
  * another image size: the position embedding is resampled to the model's grid with
    ``resize_position_embedding`` (2-D bicubic, a = -0.5, antialiased: PyTorch's
    ``interpolate(mode="bicubic", antialias=True)``, timm's ``resample_abs_pos_embed`` default).
    ``save_npz`` records the grid (``GRID``); other files are read as Google's and timm's are written
    (``position.table_layout``: square grids; a timm table may lack the class-token row);
  * a sequence-pooled or LSA model and a checkpoint without its token scores or logit scales (or the
    reverse): they are skipped, as a head is (``save_npz`` writes them as ``sequence_pool/`` and ``logit_scale``);
  * a 1-channel model and an RGB patch embedding: the kernel is summed over RGB (exact for
    grey images, which are R = G = B).
Anything else is a ValueError that lists every mismatched, missing and unexpected name.
"""

import logging
import os
import warnings

import numpy as np
from keras import ops

from vit_keras.models import stems
from vit_keras.models.normalization import pixel_normalization
from vit_keras.files import atomic_path
from vit_keras.models.vision_transformer import VisionTransformer
from vit_keras.models.position import resize_axis_embedding, resize_position_embedding, table_layout
from vit_keras.weights.fetch import resolve
from vit_keras.weights.google import GRID, PICKLE_HINT, POS, Checkpoint, add_class_position, canonical_google, read_npz
from vit_keras.weights.keras_hub import canonical_keras_hub
from vit_keras.weights.normalization import checkpoint_normalization  # noqa: F401  (public here, beside load_weights)
from vit_keras.weights.torch import DISTILLATION, LAYER_SCALE, REGISTERS, canonical_torch, read_safetensors

log = logging.getLogger("vit_keras.weights.loader")

# Not in any Google file: our own names so that save_npz -> load_weights round-trips these options too.
# Ours, not in Google's layout: the token scores of pooling="sequence", and LSA's per-block logit scale
SEQUENCE_POOL = "sequence_pool"
LOGIT_SCALE = "logit_scale"
POS_ROW, POS_COL, POS_CLS = (f"Transformer/posembed_input/{n}" for n in ("pos_row", "pos_col", "pos_cls"))


class Slot:
    """One Keras variable and the canonical arrays it is made of (several for the fused qkv)."""

    def __init__(self, names, variable, pack=None, unpack=None):
        self.names, self.variable = tuple(names), variable
        self.pack = pack or (lambda arrays: arrays[0])
        self.unpack = unpack or (lambda value: [value])


def _dense(prefix, layer):
    return [Slot([prefix + "/kernel"], layer.kernel), Slot([prefix + "/bias"], layer.bias)]


def _norm(prefix, layer):
    return [Slot([prefix + "/scale"], layer.gamma), Slot([prefix + "/bias"], layer.beta)]


def _attention_slots(prefix, attn):
    heads, head_dim = attn.num_heads, attn.head_dim
    d = heads * head_dim
    qkv = [f"{prefix}{n}" for n in ("query", "key", "value")]
    return [
        Slot([n + "/kernel" for n in qkv], attn.qkv.kernel,
             lambda a: np.concatenate([x.reshape(x.shape[0], -1) for x in a], axis=1),
             lambda v: [x.reshape(-1, heads, head_dim) for x in np.split(v, 3, axis=1)]),
        Slot([n + "/bias" for n in qkv], attn.qkv.bias,
             lambda a: np.concatenate([x.reshape(-1) for x in a]),
             lambda v: [x.reshape(heads, head_dim) for x in np.split(v, 3)]),
        Slot([prefix + "out/kernel"], attn.out.kernel,
             lambda a: a[0].reshape(-1, a[0].shape[-1]), lambda v: [v.reshape(heads, head_dim, d)]),
        Slot([prefix + "out/bias"], attn.out.bias),
    ] + ([Slot([prefix + LOGIT_SCALE], attn.logit_scale)] if attn.locality else [])


def _stem_slots(stem):
    if isinstance(stem, stems.ResNetV2Stem):
        slots = [Slot(["conv_root/kernel"], stem.conv_root.kernel), *_norm("gn_root", stem.gn_root)]
        for unit in stem.units:
            for key, layer in unit.items():  # layer names are block{b}_unit{u}_{key}
                name = layer.name.replace("_unit", "/unit").replace(f"_{key}", f"/{key}")
                slots += [Slot([name + "/kernel"], layer.kernel)] if key.startswith("conv") else _norm(name, layer)
        return slots
    slots = []  # ConvStem has no Google layout: our own names, for save/load round trips
    for i, (conv, bn) in enumerate(stem.blocks):
        slots.append(Slot([f"conv_stem/conv{i}/kernel"], conv.kernel))
        for ours, var in (("scale", bn.gamma), ("bias", bn.beta), ("mean", bn.moving_mean),
                          ("var", bn.moving_variance)):
            slots.append(Slot([f"conv_stem/bn{i}/{ours}"], var))
    return slots


def model_slots(model):
    """The canonical name(s) behind every weight of a ``VisionTransformer``, in layer order."""
    if not isinstance(model, VisionTransformer):
        raise ValueError(f"`model` must be a vit_keras VisionTransformer (e.g. from create_model); "
                         f"got {type(model).__name__}.")
    slots = _stem_slots(model.stem) if model.stem is not None else []
    emb = model.patch_encoder
    slots += [Slot(["embedding/kernel"], emb.kernel), Slot(["embedding/bias"], emb.bias)]
    if emb.class_token:
        slots.append(Slot(["cls"], emb.cls))
    if emb.distillation_token:
        slots.append(Slot([DISTILLATION], emb.dist))
    if emb.register_tokens:
        slots.append(Slot([REGISTERS], emb.registers))
    if emb.position_embedding == "learned":
        slots.append(Slot([POS], emb.pos_embedding))
    elif emb.position_embedding == "learned_2d":
        slots += [Slot([POS_ROW], emb.pos_row), Slot([POS_COL], emb.pos_col)]
        slots += [Slot([POS_CLS], emb.pos_cls)] if emb.class_token else []
    for i, block in enumerate(model.blocks):
        prefix = f"Transformer/encoderblock_{i}/"
        slots += _norm(prefix + "LayerNorm_0", block.norm1)
        slots += _attention_slots(prefix + "MultiHeadDotProductAttention_1/", block.attn)
        slots += _norm(prefix + "LayerNorm_2", block.norm2)
        slots += _dense(prefix + "MlpBlock_3/Dense_0", block.fc1) + _dense(prefix + "MlpBlock_3/Dense_1", block.fc2)
        if block.layer_scale is not None:
            slots += [Slot([prefix + LAYER_SCALE.format(k)], getattr(block, f"gamma_{k}")) for k in (1, 2)]
    slots += _norm("Transformer/encoder_norm", model.encoder_norm)
    if model.pooling_layer.score is not None:  # our name: Google's layout has no sequence pooling
        slots += _dense(SEQUENCE_POOL, model.pooling_layer.score)
    for name, layer in (("pre_logits", model.pre_logits), ("head", model.head)):
        if layer is not None:
            slots += _dense(name, layer)
    return slots


def model_arrays(model):
    """A model's weights as the canonical (Google) name -> float32 array dict."""
    arrays = {}
    for slot in model_slots(model):
        arrays.update(zip(slot.names, slot.unpack(ops.convert_to_numpy(slot.variable))))
    return arrays


def save_npz(model, path):
    """Write ``model``'s weights as an ``.npz`` in the original Google layout (atomically)."""
    path = os.fspath(path)
    arrays = {**model_arrays(model), GRID: np.asarray(model.grid_size, np.int32)}
    with atomic_path(path) as temp, open(temp, "wb") as f:
        np.savez(f, **arrays)
    return path


def read_checkpoint(path, num_heads):
    """A local checkpoint file in any supported format -> a ``Checkpoint`` (canonical name -> array)."""
    path = os.fspath(path)
    if path.endswith((".pth", ".pt", ".bin")):
        raise ValueError(f"{path}: {PICKLE_HINT}")
    with open(path, "rb") as f:
        magic = f.read(9)
    if magic[:2] == b"PK":
        return canonical_google(read_npz(path))
    if magic[:8] == b"\x89HDF\r\n\x1a\n" or path.endswith(".weights.h5"):  # a keras-hub preset's Keras weights
        return canonical_keras_hub(path)
    if len(magic) == 9 and magic[8:9] == b"{":
        return canonical_torch(read_safetensors(path), num_heads)
    if path.endswith(".npz"):
        return canonical_google(read_npz(path))  # raises the corrupt-file error
    if path.endswith(".safetensors"):
        return canonical_torch(read_safetensors(path), num_heads)
    raise ValueError(
        f"{path} is neither an .npz (Google, AugReg, big_vision), a .safetensors (timm, Hugging Face) nor a "
        f"keras-hub preset's .weights.h5 checkpoint. {PICKLE_HINT}"
    )


def load_weights(model, weights, cache_dir=None, sha256=None):
    """Load a checkpoint (path or http(s) URL) into ``model``, all or nothing; returns ``model``."""
    model_slots(model)  # fail on a wrong `model` before any download
    path = resolve(weights, cache_dir=cache_dir, sha256=sha256)
    checkpoint = read_checkpoint(path, model.blocks[0].num_heads)
    checkpoint.normalization = checkpoint_normalization(path)
    plan = plan_assignment(model, checkpoint, source=path)
    for variable, value in plan:
        variable.assign(value)
    head = model.head
    if head is not None:
        assigned = {id(variable) for variable, _ in plan}
        if id(head.kernel) not in assigned:  # a skipped head: the paper's zero-initialized D x K layer
            for variable in (head.kernel, head.bias):
                variable.assign(np.zeros(variable.shape, variable.dtype))
    return model


def _warn(message):
    warnings.warn(message, UserWarning, stacklevel=6)  # the caller of load_weights


def _adapt(model, arrays, expected, checkpoint):
    """Apply the allowed differences (head, pre_logits, image size, grey input) to ``arrays`` in place."""
    _skip_head(arrays, expected)
    _skip_our_additions(arrays, expected)
    _resample_position(model, arrays, expected, checkpoint)
    _sum_rgb_kernel(model, arrays, expected, checkpoint.normalization)


def _skip_our_additions(checkpoint, expected):
    """Sequence pooling's scores and LSA's logit scales, where only one of the checkpoint and the model has
    them: the model's start afresh (as a new head does), the checkpoint's are skipped."""
    for what, option, ours in (
            ("sequence-pooling weights", "`pooling`='sequence'", lambda n: n.startswith(SEQUENCE_POOL + "/")),
            ("LSA logit scales", "`locality_attention`=True", lambda n: n.endswith("/" + LOGIT_SCALE))):
        in_model, in_checkpoint = [n for n in expected if ours(n)], [n for n in checkpoint if ours(n)]
        if in_model and not in_checkpoint:
            _warn(f"The checkpoint has no {what}: the model ({option}) keeps its initial ones.")
            for name in in_model:
                expected.pop(name)
        elif in_checkpoint and not in_model:
            _warn(f"Skipping the checkpoint's {what} (the model does not have {option}).")
            for name in in_checkpoint:
                checkpoint.pop(name)


def _skip_head(checkpoint, expected):
    head, model_head = checkpoint.get("head/kernel"), expected.get("head/kernel")
    if model_head is not None and head is None:
        _warn("The checkpoint has no classification head: the model's head starts at zero (fine-tuning, as the "
              "paper's section 3.2 does).")
    elif model_head is not None and head.ndim == 2 and head.shape != model_head.shape \
            and head.shape[0] == model_head.shape[0]:
        _warn(f"Skipping the checkpoint's head: it has {head.shape[1]} classes and the model {model_head.shape[1]} "
              "(fine-tuning); the model's head starts at zero, as in the paper's section 3.2.")
    elif model_head is not None or head is None:
        return  # both have the same head, or neither has one
    # else include_top=False: the features are what was asked for
    for name in ("head/kernel", "head/bias"):
        expected.pop(name, None)
        checkpoint.pop(name, None)
    if "pre_logits/kernel" in checkpoint and "pre_logits/kernel" not in expected:
        _warn("Skipping the checkpoint's pre_logits layer with its head (the model has representation_size=None).")
        for name in ("pre_logits/kernel", "pre_logits/bias"):
            checkpoint.pop(name, None)


def _resample_position(model, checkpoint, expected, source):
    """Fit the checkpoint's position embedding to the model's patch grid, as its library would (``source``: the
    ``Checkpoint`` the arrays came from).

    The grid is recorded by ``save_npz``. Other files carry only a (1, R, D) table; its class-token row and
    grid are inferred by ``table_layout``. A timm table has no class row when the model was made with
    ``no_embed_class`` (a zero row is then added: the class token had no position).
    """
    old_grid, timm_table = source.grid, source.timm_table
    emb = model.patch_encoder
    new_grid = tuple(emb.grid_size)
    for name, axis in ((POS_ROW, 0), (POS_COL, 1)):  # learned_2d: one table per axis, its length is its grid
        table, want = checkpoint.get(name), expected.get(name)
        if table is not None and want is not None and table.ndim == 2 and table.shape[0] != want.shape[0]:
            checkpoint[name] = resize_axis_embedding(table, new_grid[axis])
    pos, want = checkpoint.get(POS), expected.get(POS)
    if pos is None or want is None or pos.ndim != 3 or pos.shape[2] != want.shape[2]:
        return
    prefix_rows = emb.positioned_prefix if "cls" in checkpoint else 0  # the class (and distillation) token's
    if old_grid is not None:
        has_rows = prefix_rows
    else:
        layout = table_layout(pos.shape[1], prefix_rows, want.shape[1], new_grid, timm_table)
        if layout is None:
            return  # reported as a shape mismatch, with a hint
        has_rows, old_grid = layout
    if prefix_rows and not has_rows:
        add_class_position(checkpoint, prefix_rows)
        pos = checkpoint[POS]
    if old_grid != new_grid and pos.shape[1] == prefix_rows + old_grid[0] * old_grid[1]:
        checkpoint[POS] = resize_position_embedding(pos, new_grid, old_grid, prefix_rows, source.antialias)
        log.info("Resampled the position embedding from a %dx%d grid to %dx%d.", *old_grid, *new_grid)


def _sum_rgb_kernel(model, checkpoint, expected, normalization=None):
    """A 1-channel model from an RGB patch embedding: exact for grey images (R = G = B). Where the checkpoint's
    folder records a per-channel normalization (m_c, s_c), the kernel and bias take it and the model's own (m, s):
    K' = s * sum_c K_c / s_c, b' = b - sum(K_c m_c / s_c) + sum(K' m / s), over the kernel's pixels."""
    kernel, want = checkpoint.get("embedding/kernel"), expected.get("embedding/kernel")
    if kernel is None or want is None or model.stem is not None:
        return
    if kernel.ndim == 4 and kernel.shape[2] == 3 and want.shape[2] == 1 \
            and kernel.shape[:2] + kernel.shape[3:] == want.shape[:2] + want.shape[3:]:
        _warn("The model takes 1-channel images: summing the RGB patch-embedding kernel over channels.")
        if normalization is None or len(normalization[0]) != 3 or "embedding/bias" not in checkpoint:
            checkpoint["embedding/kernel"] = kernel.sum(axis=2, keepdims=True)
            return
        (means, stds), (mean,), (std,) = normalization, *(v / 255.0 for v in pixel_normalization(model.vit_config))
        per_channel = kernel.astype("float64") / np.asarray(stds)[None, None, :, None]
        folded = std * per_channel.sum(axis=2, keepdims=True)
        shift = (per_channel * np.asarray(means)[None, None, :, None]).sum(axis=(0, 1, 2))
        checkpoint["embedding/kernel"] = folded.astype("float32")
        checkpoint["embedding/bias"] = (checkpoint["embedding/bias"] - shift
                                        + folded.sum(axis=(0, 1, 2)) * mean / std).astype("float32")


def _block_count(names):
    return len({n.split("/")[1] for n in names if n.startswith("Transformer/encoderblock_")})


HINTS = [
    (lambda c, e: _block_count(c) != _block_count(e),
     lambda c, e: f"the checkpoint has {_block_count(c)} encoder blocks and the model {_block_count(e)}: "
                  f"use num_layers={_block_count(c)}"),
    (lambda c, e: "conv_root/kernel" in c and "conv_root/kernel" not in e,
     "the checkpoint is a hybrid (ResNet stem): create vit_r26_s32, vit_r50_b16 or vit_r50_l32"),
    (lambda c, e: "conv_root/kernel" in e and "conv_root/kernel" not in c,
     "the model is a hybrid but the checkpoint has no ResNet stem"),
    (lambda c, e: "pre_logits/kernel" in c and "pre_logits/kernel" not in e,
     "the checkpoint has a pre_logits (representation) layer: pass representation_size="
     "<its width> to keep it, or a different num_classes to drop it with the head"),
    (lambda c, e: "pre_logits/kernel" in e and "pre_logits/kernel" not in c,
     "the model has a pre_logits layer the checkpoint lacks: use representation_size=None"),
    (lambda c, e: POS in c and POS not in e,
     "the checkpoint has a learned position embedding: use position_embedding='learned'"),
    (lambda c, e: any(k.startswith("MAPHead") for k in c),
     "attention-pooling (MAP) heads are not supported"),
    (lambda c, e: any(k.startswith("fc_norm.") for k in c),
     "timm's fc_norm (a LayerNorm after average pooling) is not supported: our GAP pools after encoder_norm"),
    (lambda c, e: "cls" in e and "cls" not in c,
     "the checkpoint has no class token: use pooling='gap' (class_token=False)"),
    (lambda c, e: "cls" in c and "cls" not in e,
     "the checkpoint has a class token: use class_token=True (pooling='token')"),
    (lambda c, e: POS in c and POS in e and c[POS].shape[1] != e[POS].shape[1],
     "the position embedding's rows fit no square grid of the model's kind: load the checkpoint into a model at "
     "its own image size, then call resize_model"),
]


def plan_assignment(model, checkpoint, source="checkpoint"):
    """(variable, value) for every weight of ``model``, or a ValueError listing everything that does not fit.

    ``checkpoint``: a ``Checkpoint``, or a plain name -> array mapping (then nothing is known of its table).
    """
    if not isinstance(checkpoint, Checkpoint):
        checkpoint = Checkpoint(checkpoint)
    slots = model_slots(model)
    expected = {}
    for slot in slots:
        expected.update(zip(slot.names, slot.unpack(np.zeros(slot.variable.shape, "float32"))))
    original = checkpoint.arrays
    arrays = dict(original)
    _adapt(model, arrays, expected, checkpoint)
    mismatched = [n for n in expected if n in arrays and arrays[n].shape != expected[n].shape]
    missing = [n for n in expected if n not in arrays]
    unexpected = sorted(n for n in arrays if n not in expected)
    if mismatched or missing or unexpected:
        lines = [f"  shape mismatch: {n}: checkpoint {tuple(arrays[n].shape)}, model {tuple(expected[n].shape)}"
                 for n in mismatched]
        lines += [f"  missing from checkpoint: {n} {tuple(expected[n].shape)}" for n in missing]
        lines += [f"  unexpected in checkpoint: {n} {tuple(arrays[n].shape)}" for n in unexpected]
        hints = [text(original, expected) if callable(text) else text
                 for test, text in HINTS if test(original, expected)]
        raise ValueError(
            f"The checkpoint {source} does not fit model {model.name!r} ({len(mismatched)} shape mismatches, "
            f"{len(missing)} missing, {len(unexpected)} unexpected); nothing was loaded.\n" + "\n".join(lines)
            + "".join(f"\nHint: {h}." for h in hints)
        )
    plan = []
    for slot in slots:
        if not all(n in expected for n in slot.names):
            continue  # a skipped head
        value = np.asarray(slot.pack([arrays[n] for n in slot.names]), dtype=slot.variable.dtype)
        if tuple(value.shape) != tuple(slot.variable.shape):  # cannot happen once names and shapes agree
            raise ValueError(f"{slot.names[0]}: packed shape {value.shape} != variable shape {slot.variable.shape}")
        plan.append((slot.variable, value))
    return plan
