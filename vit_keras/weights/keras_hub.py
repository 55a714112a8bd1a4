"""keras-hub ViT presets (a folder ``save_to_preset`` writes) as the canonical Google layout.

A preset folder holds the backbone (``config.json``, ``model.weights.h5``) and, for an ``ImageClassifier``, its
head (``task.json``, ``task.weights.h5``). Keras 3 stores a layer's variables at ``layers/<path>/vars/<i>``,
each path named after the layer classes (``vi_t_encoder_block_3``: the fourth ``ViTEncoderBlock``). keras-hub's
``ViTBackbone`` keeps Google's shapes: a Conv2D patch embedding (P, P, C, D), ``MultiHeadAttention`` kernels
(D, H, D/H) and (H, D/H, D), an ``Embedding`` position table (T, D) and a (1, 1, D) class token. The
classifier reads the class token (``pooling="token"``) or the mean of all tokens, then an optional tanh
``intermediate_dim`` layer (pre_logits), then its ``Dense`` head.

Read with h5py (Keras's own dependency); keras-hub is never imported.
"""

import os
import re

import numpy as np

from vit_keras.files import read_json
from vit_keras.weights.google import POS, Checkpoint, corrupt_error

BACKBONE_WEIGHTS = "model.weights.h5"
TASK_WEIGHTS, TASK_CONFIG, BACKBONE_CONFIG = "task.weights.h5", "task.json", "config.json"
BLOCK = r"encoder_block(?:_(\d+))?/"
# (path regex -> canonical name of its vars/0 and vars/1); the block index is the regex's first group.
BLOCK_PARTS = {
    "layer_norm_1": "LayerNorm_0/{}", "layer_norm_2": "LayerNorm_2/{}",
    "mha/query_dense": "MultiHeadDotProductAttention_1/query/{}",
    "mha/key_dense": "MultiHeadDotProductAttention_1/key/{}",
    "mha/value_dense": "MultiHeadDotProductAttention_1/value/{}",
    "mha/output_dense": "MultiHeadDotProductAttention_1/out/{}",
    "mlp/dense_1": "MlpBlock_3/Dense_0/{}", "mlp/dense_2": "MlpBlock_3/Dense_1/{}",
}
NORM_VARS, DENSE_VARS = ("scale", "bias"), ("kernel", "bias")


def is_keras_hub_folder(folder):
    """Whether ``folder`` holds a keras-hub preset's backbone (config.json naming a keras-hub class, weights)."""
    config = read_json(os.path.join(folder, BACKBONE_CONFIG)) or {}
    return os.path.isfile(os.path.join(folder, BACKBONE_WEIGHTS)) and \
        str(config.get("registered_name", "")).startswith("keras_hub>")


def read_h5(path):
    """Every variable of a Keras weights file: {"layers/.../vars/i": array}."""
    import h5py

    arrays = {}
    try:
        with h5py.File(path, "r") as f:
            f.visititems(lambda name, item: arrays.__setitem__(name, item[()]) if isinstance(item, h5py.Dataset)
                         else None)
    except (OSError, ValueError) as error:
        raise corrupt_error(path, "Keras .weights.h5", error) from error
    return arrays


def backbone_name(path):
    """The canonical name of one backbone variable (a ``read_h5`` key), or None where it maps to nothing."""
    match = re.search(r"patching_and_embedding/(?:(patch_embedding|position_embedding)/)?vars/(\d)$", path)
    if match:
        part, index = match.group(1), int(match.group(2))
        return {None: "cls", "position_embedding": POS}.get(part) or f"embedding/{DENSE_VARS[index]}"
    match = re.search(BLOCK + r"(.+)/vars/(\d)$", path)
    if match and match.group(2) in BLOCK_PARTS:
        kind = NORM_VARS if "norm" in match.group(2) else DENSE_VARS
        block = f"Transformer/encoderblock_{int(match.group(1) or 0)}/"
        return block + BLOCK_PARTS[match.group(2)].format(kind[int(match.group(3))])
    match = re.search(r"encoder/layer_norm/vars/(\d)$", path)
    return f"Transformer/encoder_norm/{NORM_VARS[int(match.group(1))]}" if match else None


def canonical_keras_hub(path):
    """A keras-hub ViT preset's ``model.weights.h5`` (with the task head beside it, if any) -> a ``Checkpoint``."""
    folder = os.path.dirname(os.path.abspath(path))
    backbone = (read_json(os.path.join(folder, BACKBONE_CONFIG)) or {}).get("config", {})
    if backbone and not backbone.get("use_class_token", True):
        raise ValueError(f"{folder}: a keras-hub ViT without a class token (use_class_token=False) has a position "
                         "table for its patches alone; it is not supported.")
    out = {}
    for key, value in read_h5(path).items():
        name = backbone_name(key)
        out[name or key] = np.asarray(value, np.float32)
    if POS in out and out[POS].ndim == 2:
        out[POS] = out[POS][None]
    out.update(task_head(folder))
    return Checkpoint(out)


def task_head(folder):
    """The classifier's head (and tanh pre_logits) from task.json / task.weights.h5, or {} for a backbone alone."""
    task = (read_json(os.path.join(folder, TASK_CONFIG)) or {}).get("config", {})
    weights = os.path.join(folder, TASK_WEIGHTS)
    if not task or not os.path.isfile(weights):
        return {}
    if task.get("pooling", "token") != "token" or task.get("activation") not in (None, "linear"):
        raise ValueError(f"{folder}: a keras-hub classifier with pooling={task.get('pooling')!r}, activation="
                         f"{task.get('activation')!r}: only the class token's logits (pooling='token', no "
                         "activation) load; load the backbone alone (remove task.json) to fine-tune a new head.")
    dense = {key: value for key, value in read_h5(weights).items() if key.startswith("layers/dense")}
    layers = sorted({key.split("/")[1] for key in dense}, key=lambda n: int(n.rpartition("_")[2] or 0)
                    if n != "dense" else 0)
    names = ["pre_logits", "head"] if task.get("intermediate_dim") else ["head"]
    if len(layers) != len(names):
        raise ValueError(f"{weights}: expected {len(names)} Dense layer(s) ({', '.join(names)}); found {layers}.")
    return {f"{name}/{DENSE_VARS[i]}": np.asarray(dense[f"layers/{layer}/vars/{i}"], np.float32)
            for name, layer in zip(names, layers) for i in (0, 1)}


def keras_hub_arguments(folder):
    """create_model's architecture arguments for a keras-hub ViT preset folder (its config.json and task.json)."""
    backbone = (read_json(os.path.join(folder, BACKBONE_CONFIG)) or {}).get("config", {})
    task = (read_json(os.path.join(folder, TASK_CONFIG)) or {}).get("config", {})
    height, width = backbone["image_shape"][:2]
    patch = backbone["patch_size"]
    patch = patch[0] if not isinstance(patch, int) and patch[0] == patch[1] else patch
    arguments = dict(image_size=(height, width), patch_size=patch if isinstance(patch, int) else tuple(patch),
                     hidden_size=backbone["hidden_dim"], num_heads=backbone["num_heads"], mlp_dim=backbone["mlp_dim"],
                     num_layers=backbone["num_layers"], norm_epsilon=backbone.get("layer_norm_epsilon", 1e-6),
                     channels=backbone["image_shape"][2])
    if task:
        arguments.update(num_classes=task["num_classes"], representation_size=task.get("intermediate_dim"))
    return arguments
