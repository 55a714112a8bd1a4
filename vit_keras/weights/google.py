"""Google ``.npz`` checkpoints, all layouts, as one canonical layout.

The canonical layout is google-research/vision_transformer's original one (the names and
shapes of its Flax model, flattened with "/"), which ``save_npz`` also writes:
    embedding/{kernel (P,P,C,D), bias}   cls (1,1,D)   Transformer/posembed_input/pos_embedding (1,T,D)
    Transformer/encoderblock_{i}/LayerNorm_0|LayerNorm_2/{scale,bias}
        .../MultiHeadDotProductAttention_1/{query,key,value}/{kernel (D,H,D/H), bias (H,D/H)}
        .../MultiHeadDotProductAttention_1/out/{kernel (H,D/H,D), bias}
        .../MlpBlock_3/Dense_0|Dense_1/{kernel,bias}
    Transformer/encoder_norm/{scale,bias}   pre_logits/{kernel,bias} (optional)   head/{kernel,bias}
    hybrids: conv_root/kernel, gn_root/{scale,bias}, block{b}/unit{u}/conv1..3|conv_proj/kernel,
             block{b}/unit{u}/gn1..3|gn_proj/{scale,bias}; embedding then works on the feature map.

The ImageNet-21k, fine-tuned and AugReg releases use these names (AugReg and fine-tuned
files simply lack ``pre_logits``). Other layouts are renamed into it:
  * ``opt/target/`` (Flax optimizer checkpoints), ``params/`` and ``params/img/`` (big_vision) prefixes;
  * big_vision blocks name their modules LayerNorm_0, MultiHeadDotProductAttention_0, LayerNorm_1,
    MlpBlock_0, and a scanned model stacks all blocks in ``Transformer/encoderblock/...`` with a
    leading layer axis; its ``pos_embedding`` sits at the top level and has no class-token row
    (the class token is concatenated after the position embedding is added).
  * bfloat16 arrays (stored by numpy as 2-byte void) become float32.
"""

import collections.abc
import re
import zipfile
import zlib

import numpy as np

POS = "Transformer/posembed_input/pos_embedding"
# Not in any Google file: the patch grid (rows, cols) ``save_npz`` records, for a (1, N, D) table alone cannot
# tell 9x16 from 12x12. Read into ``Checkpoint.grid``, not left among the weights.
GRID = "Transformer/posembed_input/grid_size"
PREFIXES = ("opt/target/", "params/img/", "params/")
SCANNED = "Transformer/encoderblock/"
# big_vision's Encoder1DBlock module names -> the original ones.
BIG_VISION_MODULES = {
    "MultiHeadDotProductAttention_0": "MultiHeadDotProductAttention_1",
    "LayerNorm_1": "LayerNorm_2",
    "MlpBlock_0": "MlpBlock_3",
}


PICKLE_HINT = ("PyTorch pickles (.bin, .pth, .pt; zip archives since torch 1.6) are not read: save the state dict "
               "with safetensors first.")


class Checkpoint(collections.abc.Mapping):
    """A checkpoint in the canonical layout (name -> array), with what its reader found about its position table.

    grid: the patch grid (rows, cols) the file records, or None (then the loader infers it from the table);
    timm_table: the table is timm's, which has no class-token row when the model was made with no_embed_class;
    antialias: whether its library resamples the table antialiased (timm, ours) or not (Hugging Face);
    normalization: the (mean, std) its folder records, or None.
    """

    def __init__(self, arrays, grid=None, timm_table=False, antialias=True):
        self.normalization = None  # (mean, std) its folder records, where the loader found one
        self.arrays = dict(arrays)
        self.grid = None if grid is None else tuple(int(v) for v in np.ravel(grid))
        self.timm_table = bool(timm_table)
        self.antialias = bool(antialias)

    def __getitem__(self, name):
        return self.arrays[name]

    def __iter__(self):
        return iter(self.arrays)

    def __len__(self):
        return len(self.arrays)


def corrupt_error(path, kind, error):
    import os

    size = os.path.getsize(path) if os.path.exists(path) else 0
    return ValueError(
        f"{path} is not a readable {kind} checkpoint: the file is corrupt or truncated ({size} bytes; "
        f"{type(error).__name__}: {error}). Delete it and download it again."
    )


def read_npz(path):
    """Every array of an ``.npz`` file, read eagerly so a damaged member fails here, not later."""
    try:
        with np.load(path, allow_pickle=False) as archive:
            arrays = {name: archive[name] for name in archive.files}
    except (zipfile.BadZipFile, EOFError, OSError, ValueError, zlib.error, KeyError) as error:
        raise corrupt_error(path, ".npz", error) from error
    foreign = sorted(name for name, value in arrays.items() if not isinstance(value, np.ndarray))
    if foreign:  # another zip: numpy hands back the raw bytes of members that are not .npy files
        raise ValueError(f"{path} is a zip archive but not an .npz: {', '.join(foreign[:3])} are not arrays. "
                         f"{PICKLE_HINT}")
    return arrays


def as_float32(array):
    if array.dtype.kind == "V" and array.dtype.itemsize == 2:  # bfloat16 saved without ml_dtypes
        return (array.view(np.uint16).astype(np.uint32) << 16).view(np.float32)
    if array.dtype.name == "bfloat16" or array.dtype.kind == "f":
        return array.astype(np.float32)
    return array


def _block_name(index, rest, big_vision):
    if big_vision:
        module, _, tail = rest.partition("/")
        rest = f"{BIG_VISION_MODULES.get(module, module)}/{tail}"
    return f"Transformer/encoderblock_{index}/{rest}"


def canonical_google(arrays):
    """Any Google / big_vision layout (flat name -> array) -> a ``Checkpoint`` in the canonical layout above."""
    prefix = next((p for p in PREFIXES if f"{p}embedding/kernel" in arrays), "")
    if prefix:  # drop optimizer state, text towers and anything else outside the image model
        arrays = {k[len(prefix):]: v for k, v in arrays.items() if k.startswith(prefix)}
    big_vision = prefix.startswith("params/") or "pos_embedding" in arrays or f"{SCANNED}LayerNorm_0/scale" in arrays
    out, rowless_table = {}, False
    for name, value in arrays.items():
        value = as_float32(value)
        match = re.fullmatch(r"Transformer/encoderblock_(\d+)/(.+)", name)
        if name.startswith(SCANNED):
            for i in range(value.shape[0]):
                out[_block_name(i, name[len(SCANNED):], big_vision)] = value[i]
        elif match:
            out[_block_name(int(match.group(1)), match.group(2), big_vision)] = value
        elif big_vision and name == "pos_embedding":
            out[POS], rowless_table = value, True
        else:
            out[name] = value
    if rowless_table:  # big_vision concatenates the class token after adding positions: its table has no row
        add_class_position(out)
    return Checkpoint(out, grid=out.pop(GRID, None))


def add_class_position(checkpoint, rows=1):
    """Give the class token (and a distillation token: ``rows`` 2) a zero position row (big_vision, timm's
    no_embed_class).

    Those models never add a position to the class token, so prepending a zero row to
    the (1, N, D) table gives our (1, N+1, D) table the same function.
    """
    pos = checkpoint.get(POS)
    if "cls" in checkpoint and pos is not None and pos.ndim == 3:
        checkpoint[POS] = np.concatenate([np.zeros_like(pos[:, :rows]), pos], axis=1)
    return checkpoint
