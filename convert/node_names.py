"""The export graph's node names: how an op of the converted file is found again.

The TFLite converter keeps nothing of a TensorFlow op but its name, so the ops int8 treats apart (kept in float,
stored in float16, re-rounded) are named here once: ``graph`` and ``integer_graph`` name their ops with these, and
``int8`` and ``dynamic_int8`` find the converted ops by them. TensorFlow numbers a repeated name ("residual",
"residual_1", ...; ``numbered``) and the converter joins the names of the ops it fuses ("MatMul_7;mlp_out_2";
``carries``).
"""

import functools
import re

# The dense layers by role (FULLY_CONNECTED); no digits, as TF and the converter append numbers.
QKV, ATTENTION_OUT, MLP_IN, MLP_OUT = "qkv", "attention_out", "mlp_in", "mlp_out"
SEQUENCE_POOL, PRE_LOGITS, HEAD = "sequence_pool", "pre_logits", "head"
DENSE_ROLES = (QKV, ATTENTION_OUT, MLP_IN, MLP_OUT, SEQUENCE_POOL, PRE_LOGITS, HEAD)
# The ADDs static int8 keeps in float: the position embedding, the residual stream, LayerNorm's shift and
# epsilon, LSA's mask, the attention rollout.
POSITION_ADD, RESIDUAL, LAYERNORM_SHIFT, LAYERNORM_EPSILON = "embedding", "residual", "layernorm_shift", "layernorm_epsilon"
ATTENTION_MASK, ROLLOUT_ADD = "attention_mask", "attention_rollout"
# A ResNet stem's own residual stream, which static int8 keeps in float.
GROUPNORM_SHIFT, STEM_RESIDUAL, STEM_POOL = "groupnorm_shift", "stem_residual", "stem_pool"


def numbered(base_names, count):
    """The names TensorFlow gives ``count`` ops of each base name: name, name_1, name_2, ..."""
    return [f"{name}_{i}" if i else name for name in base_names for i in range(count)]


def carries(tensor_name, base_names):
    """Whether a converted op's output name carries one of ``base_names``: one of the parts the converter joined
    with ";" is a base name with a number after it or none."""
    pattern = numbered_pattern(tuple(base_names))
    return any(pattern.match(part) for part in tensor_name.split(";"))


@functools.lru_cache(maxsize=64)
def numbered_pattern(base_names):
    """One regex for a base name of ``base_names`` with TensorFlow's number after it or none (compiled once: a
    graph's every op name is matched against it)."""
    return re.compile(r"^(?:%s)_?\d*$" % "|".join(map(re.escape, base_names)))
