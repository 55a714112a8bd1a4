"""Which int8 a model gets (``resolve_int8``: dynamic or static), which ops a static int8 file keeps in float,
and the quantization that keeps them there.

    from vit_keras.convert.int8 import quantize_int8, default_float_nodes
    int8_bytes = quantize_int8(calibrated, float_nodes=default_float_nodes(model, calibrated))

``calibrated`` is the converter's calibrated float graph (``export.convert_graph(model, "int8", images)``). Op
types are kept in float by type (``INT8_FLOAT_OPS``), single ops by the node names convert/graph.py gives them.
"""

import collections
import functools

import numpy as np
import tensorflow as tf

from vit_keras import framework
from vit_keras.constants import INT8_ACTIVATIONS, INT8_RANGES
from vit_keras.models.stems import ResNetV2Stem

from .graph import forward, norm_count
from .attention_output import rollout_output_names
from .half_tables import store_in_half
from .node_names import (ATTENTION_MASK, DENSE_ROLES, GROUPNORM_SHIFT, LAYERNORM_EPSILON, LAYERNORM_SHIFT, POSITION_ADD,
                         RESIDUAL, ROLLOUT_ADD, STEM_POOL, STEM_RESIDUAL, carries, numbered)
from .smoothing import smoothing_scales

# int8 keeps these ops in float. BATCH_MATMUL, SOFTMAX, GELU, RSQRT: XNNPACK has no int8
# kernel for them, so in int8 each one splits the graph and runs on slow single-threaded
# reference kernels (their cost: docs/benchmarks.md#export-verification-per-op-sensitivity-and-latency); MEAN, SUB, MUL: LayerNorm's
# statistics, the most sensitive ops in the per-op sensitivity sweep (convert/sensitivity.py).
# These are also the ViT ops known to lose accuracy in int8 (softmax, GELU, LayerNorm outliers).
# CONCATENATION, SPLIT, SLICE, TRANSPOSE and the ADDs of the position embedding, the residual stream and LayerNorm's
# shift (nodes named in default_float_nodes): the heads' concat, the fused qkv's split and the heads' transposes
# around the float BATCH_MATMULs, the class-token readout, the
# residual stream from its start and whole LayerNorms in float need no conversions of their own, so each
# FULLY_CONNECTED has just a QUANTIZE in and a DEQUANTIZE out. A stem (but the conv reading the image) and the
# reshapes and pads stay in float too (stem_nodes, layout_nodes). The residual stream is never rounded to int8:
# on models trained elsewhere that rounding was most of int8's loss 
# (docs/benchmarks.md#int8-on-models-trained-elsewhere).
# The QUANTIZE/DEQUANTIZE ops run inside XNNPACK, so the graph stays one delegated partition and the
# FULLY_CONNECTED / CONV_2D layers, where the time and the weights are, run in int8.
INT8_FLOAT_OPS = ("BATCH_MATMUL", "SOFTMAX", "GELU", "RSQRT", "MEAN", "SUB", "MUL", "CONCATENATION", "SLICE",
                  "SPLIT", "TRANSPOSE")
INT8_XNNPACK_FLOAT_OPS = INT8_FLOAT_OPS[:4]  # the minimum that keeps every op in XNNPACK
DYNAMIC_MIN_WIDTH = 192  # "auto" int8 is dynamic from this width (ViT-Ti) up (``resolve_int8``)
INT8_FLOAT_NODES = (LAYERNORM_EPSILON,)  # with RSQRT: LayerNorm's variance + epsilon
LAYOUT_OPS = ("RESHAPE", "PAD")  # int8 keeps them in float where they don't read the input (``layout_nodes``)


def default_float_nodes(model, calibrated):
    """The nodes the default int8 export keeps in float besides its op types: the ADDs of the position
    embedding, the residual stream, LayerNorm's shift and LSA's mask (named in convert/graph.py), a stem
    (``stem_nodes``) and the reshapes and pads (``layout_nodes``)."""
    heads = sum(block.num_heads for block in model.blocks)
    return ([POSITION_ADD] + numbered((RESIDUAL, LAYERNORM_SHIFT), norm_count(model))
            + numbered((ATTENTION_MASK,), heads) + stem_nodes(model, calibrated)
            + layout_nodes(calibrated))


def layout_nodes(calibrated):
    """Names of the RESHAPE and PAD ops that don't read the image input.

    They compute nothing, but in int8 the converter rounds their input to int8 for them: the tokens' reshape
    after the patch embedding and the class token's PAD rounded the residual stream at its start, and a
    hybrid's GroupNorm reshapes its stem's activations
    (docs/benchmarks.md#int8-on-models-trained-elsewhere). In float one between int8 ops would cost a conversion pair; ours sit next to float ops.
    """
    return [name for op in LAYOUT_OPS for name, reads_input in op_outputs(calibrated, op) if not reads_input]


def stem_nodes(model, calibrated):
    """Names of a stem's ops that int8 keeps in float: every CONV_2D but the one reading the image input (a conv
    stem's or a ResNet stem's convs, and the 1x1 patch embedding after either), and a ResNet stem's GroupNorm
    shifts and unit residuals, the ADDs of its own residual stream (none for a model without a stem).

    A stem fixes the tokens' precision: rounded to int8 inside it, the tokens carry that error into every block
    (what keeping it in float buys in agreement and costs in bytes: docs/benchmarks.md#the-conv-stem-in-float
    and docs/benchmarks.md#int8-on-models-trained-elsewhere). The conv that reads the input (RGB -> gray, or the normalization)
    stays int8, so the input stays uint8.
    """
    if model.stem is None:
        return []
    convs = [name for name, reads_input in op_outputs(calibrated, "CONV_2D") if not reads_input]
    if not isinstance(model.stem, ResNetV2Stem):
        return convs
    return (convs + nodes_named(calibrated, "ADD", (GROUPNORM_SHIFT, STEM_RESIDUAL))
            + nodes_named(calibrated, "MAX_POOL_2D", (STEM_POOL,)))


def dense_role_nodes(calibrated, roles):
    """Names of the FULLY_CONNECTED ops of ``roles`` (node_names.DENSE_ROLES)."""
    return nodes_named(calibrated, "FULLY_CONNECTED", roles)


def nodes_named(calibrated, op_name, base_names):
    """Output names of the ``op_name`` ops that carry one of ``base_names``. The converter names a fused op by
    all the nodes it fused ("MatMul_7;mlp_out_2", "Relu;groupnorm_shift"), and the quantizer keeps an op in
    float only by that whole name; a base name among the parts has a number after it or none."""
    if not base_names:
        return []
    return [name for name, _ in op_outputs(calibrated, op_name) if carries(name, base_names)]


def op_outputs(model_bytes, op_name):
    """(output tensor name, whether it reads the graph's input) for each ``op_name`` op, in graph order."""
    return [(name, reads_input) for op, name, reads_input in graph_outputs(bytes(model_bytes)) if op == op_name]


@functools.lru_cache(maxsize=4)
def graph_outputs(model_bytes):
    """(op name, output tensor name, whether the op reads the graph's input) for every op output: cached, since
    the sweep asks the same calibrated graph for each dense role."""
    from ai_edge_litert.interpreter import Interpreter

    interpreter = Interpreter(model_content=model_bytes)
    names = {d["index"]: d["name"] for d in interpreter.get_tensor_details()}
    inputs = {d["index"] for d in interpreter.get_input_details()}
    return tuple((op["op_name"], names[int(t)], bool(inputs & {int(i) for i in op["inputs"]}))
                 for op in framework.ops_details(interpreter) for t in op["outputs"])


def split_float_ops(float_ops):
    """(op types, dense roles) of ``float_ops``, whose entries are TFLite op types ("SOFTMAX") or
    "FULLY_CONNECTED:<role>" for one of node_names.DENSE_ROLES: that layer of every block ("FULLY_CONNECTED:mlp_out")."""
    op_types, roles = [], []
    for entry in float_ops:
        op_type, _, role = entry.partition(":")
        if role and (op_type != "FULLY_CONNECTED" or role not in DENSE_ROLES):
            raise ValueError(f"`float_ops` entry {entry!r}: a dense role is written FULLY_CONNECTED:<role>, the "
                             f"role one of {', '.join(DENSE_ROLES)}.")
        (roles if role else op_types).append(role or op_type)
    return op_types, roles


def quantize_int8(calibrated, float_ops=INT8_FLOAT_OPS, num_norms=1000, float_nodes=(), half_table=True):
    """Full-integer model from a calibrated one: uint8 raw-pixel input, float32 scores, ``float_ops`` (op types,
    or dense roles: ``split_float_ops``) and the ops named in ``float_nodes`` in float.

    half_table: a float position-embedding ADD's table stored in float16 (``half_tables.store_in_half``)."""
    import tensorflow as tf
    from tensorflow.lite.python import convert as tf_convert
    from tensorflow.lite.python import util as tf_util

    op_types, roles = split_float_ops(float_ops)
    nodes = numbered(INT8_FLOAT_NODES, num_norms) if "RSQRT" in op_types else []
    nodes += list(float_nodes) + dense_role_nodes(calibrated, roles)
    quantized = tf_convert.mlir_quantize(calibrated, fully_quantize=False, denylisted_ops=op_types,
                                         denylisted_nodes=nodes)
    quantized = tf_util.modify_model_io_type(quantized, tf.uint8, tf.float32)
    return store_in_half(quantized, nodes_named(quantized, "ADD", (POSITION_ADD,))) if half_table else quantized


def check_int8_options(activations, float_ops=None, ranges=None, min_agreement=None):
    """ValueError for an unknown `int8_activations` or `ranges`, or for static int8's options asked of dynamic int8,
    which keeps no ops in float and calibrates no ranges."""
    if activations not in INT8_ACTIVATIONS:
        raise ValueError(f"Unknown `int8_activations`={activations!r} (--int8-activations); valid values are "
                         f"{', '.join(INT8_ACTIVATIONS)}.")
    if ranges is not None:
        check_ranges(ranges)
    if activations != "dynamic":
        return
    for name, value in (("`float_ops`", float_ops), ("`ranges` (--ranges)", ranges),
                        ("`min_agreement` (--min-agreement)", min_agreement)):
        if value is not None:
            raise ValueError(f"{name} applies to static int8: pass int8_activations='static' (--int8-activations "
                             "static) or 'auto'; dynamic int8 rounds each layer's input as it runs.")


def resolve_int8(model, activations, float_ops=None, ranges=None, min_agreement=None, target="cpu"):
    """(activations, float_ops, ranges) with "auto" decided and static int8's defaults filled in. "auto" is static
    where a static option is given, else dynamic for models at least DYNAMIC_MIN_WIDTH wide: the pretrained ViTs,
    whose few huge activations one static scale can't hold (docs/benchmarks.md, issue 33); narrower models, trained
    here, keep static int8, faster than dynamic at their size. The "npu" target is "int16": full integer, int16
    activations (``tflite.convert_full_integer``)."""
    if target == "npu":  # export.check_target refuses int8 options beside it
        return "int16", None, None
    check_int8_options(activations, float_ops, ranges, min_agreement)
    if activations == "auto":
        static_asked = any(value is not None for value in (float_ops, ranges, min_agreement))
        wide = model.vit_config["hidden_size"] >= DYNAMIC_MIN_WIDTH
        activations = "dynamic" if wide and not static_asked else "static"
    if activations == "dynamic":
        return activations, None, None
    return activations, (INT8_FLOAT_OPS if float_ops is None else float_ops), ("mse" if ranges is None else ranges)


def quantize_static(model, calibrated, float_ops, attention_output):
    """Static int8 from the calibrated graph: ``float_ops`` and the default float nodes kept in float."""
    nodes = default_float_nodes(model, calibrated) if float_ops else ()  # () alone: plain full int8
    if attention_output:  # the rollout's ADDs and output: its values, ~1/tokens, would lose to int8's rounding
        nodes = list(nodes) + rollout_output_names(calibrated) + numbered((ROLLOUT_ADD,), sum(
            block.attn.num_heads for block in model.blocks))
    return quantize_int8(calibrated, float_ops, num_norms=norm_count(model), float_nodes=nodes)


def check_ranges(ranges):
    if ranges not in INT8_RANGES:
        raise ValueError(f"Unknown `ranges`={ranges!r} (--ranges); valid values are {', '.join(INT8_RANGES)}.")


def int8_graph_scales(model, calibration, activations):
    """(fused qkv's per-head scales, smoothing factors or None) for int8's graph. Static int8 equalizes the heads
    for their one shared scale (``qkv_scales``) and does not smooth (a gain within one calibration draw's noise:
    docs/benchmarks.md#layernorm-smoothing); dynamic int8 needs no equal heads, but smooths."""
    if activations == "static":
        return qkv_scales(model, calibration), None
    same = {block.attn.path: [(1.0, 1.0)] * block.attn.num_heads for block in model.blocks}  # one qkv layer a block
    return same, smoothing_scales(model, calibration)


def qkv_scales(model, images, batch_size=50):
    """Per attention layer and head, (alpha, beta) that equalize the fused qkv output for one int8 scale.

    Cross-layer equalization (Nagel et al., 2019): q * alpha and k / alpha leave q.k^T unchanged, and
    v * beta with the out projection's rows / beta leaves the output unchanged. alpha gives q and k the
    same range, the geometric mean of theirs; beta brings every v to the largest of those, so each head
    uses the shared scale's full range. Ranges are max |q|, |k|, |v| over ``images`` (uint8, N, H, W, C).
    """
    ranges = collections.defaultdict(dict)  # {attention path: {head: [max |q|, max |k|, max |v|]}}

    def observe(attn, head, q, k, v):
        seen = ranges[attn.path]
        seen[head] = np.maximum(seen.get(head, 0.0), [float(tf.reduce_max(tf.abs(t))) for t in (q, k, v)])

    rgb = np.repeat(images, 3, axis=-1) if images.shape[-1] == 1 else np.asarray(images)
    for start in range(0, len(rgb), batch_size):
        forward(model, tf.constant(rgb[start:start + batch_size], tf.float32), raw_pixels=True, observe=observe)
    scales = {}
    for path, heads in ranges.items():
        r = np.maximum([heads[h] for h in sorted(heads)], 1e-6)
        shared = np.sqrt(r[:, 0] * r[:, 1])
        scales[path] = [(float(a), float(b)) for a, b in zip(np.sqrt(r[:, 1] / r[:, 0]), shared.max() / r[:, 2])]
    return scales
