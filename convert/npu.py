"""Whether a phone NPU, reached through LiteRT's NPU path, can run a .tflite file whole; checked statically.

LiteRT's ``CompiledModel`` API hands a model to a vendor compiler plugin, which partitions it: the ops the plugin
legalizes go to the NPU, the rest stay on the CPU. This module applies two plugins' partition rules to the ops of
subgraph 0, read from the flatbuffer, as of google-ai-edge/LiteRT at commit f67457790c9c (2026-08-21):

* Qualcomm (AI Engine Direct / QNN HTP), litert/vendors/qualcomm/compiler/: ``LiteRtCompilerPluginPartition`` in
  qnn_compiler_plugin.cc keeps an op when ``ConvertOp`` in qnn_compose_graph.cc finds a builder for its op code
  (the ``GetOpBuilders`` table; a CUSTOM op only with a registered QNN op package) and QNN validates it. Tensor
  types: ``ConvertDataType`` in qnn_compose_graph.cc; block-wise quantization is refused by ``ConvertTensor``.
  Qualcomm_QNN_Compiler.md in that folder tabulates both.
* MediaTek (NeuroPilot / Neuron), litert/vendors/mediatek/compiler/: ``IsOpSupported`` in compiler_plugin.cc
  keeps an op whose code is in ``kSupportedOps`` and whose every tensor ``GetNeuronTensorType``
  (legalizations/neuron_utils.cc, called by ``VerifyCommonOp`` in legalizations/common_op_legalization.cc) maps
  to a Neuron type. MediaTek_Neuro_Compiler.md ("LiteRT to MediaTek Neuron Compiler Support") tabulates both.
  (Older, narrower copies of both plugins: tensorflow/tensorflow, tensorflow/lite/experimental/litert/vendors/.)

Float: both plugins map float32 and float16 tensors (Qualcomm's HTP runs an unquantized graph in FP16, per
Qualcomm's QNN FAQ), but the NPU path is built for integer graphs: ai-edge-quantizer's README (0.10.0, "Hardware &
Recipe Decision Guide") recommends "dynamic quantization for CPU/GPU deployment and static quantization for NPU
deployment" (``static_wi8_ai8`` / ``static_wi8_ai16``). So here an op that computes in float counts as refused,
with its own reason, apart from the plugins' own refusals.

Not modelled: each legalization's per-op shape and option checks, and the vendor SDK's final say (QNN's
``ValidateOp``, Neuron's ``GetSupportedOperations``), which need the SDK; so "whole" is necessary, not sufficient.
"""

import collections
import os

from .flatbuffer import FLOAT_TYPES, is_constant, op_names, type_names
from .metadata import read_flatbuffer, unpack_model

# qnn_compose_graph.cc, GetOpBuilders(): the TFLite op codes with a QNN builder.
QUALCOMM_OPS = frozenset({
    "ABS", "ADD", "ARG_MAX", "ARG_MIN", "AVERAGE_POOL_2D", "BATCH_MATMUL", "BATCH_TO_SPACE_ND", "BROADCAST_TO",
    "CAST", "CEIL", "CONCATENATION", "CONV_2D", "CONV_3D", "COS", "CUMSUM", "DEPTH_TO_SPACE", "DEPTHWISE_CONV_2D",
    "DEQUANTIZE", "DIV", "DYNAMIC_UPDATE_SLICE", "ELU", "EMBEDDING_LOOKUP", "EQUAL", "EXP", "FLOOR", "FLOOR_DIV",
    "FLOOR_MOD", "FULLY_CONNECTED", "GATHER", "GATHER_ND", "GELU", "GREATER", "GREATER_EQUAL", "HARD_SWISH",
    "L2_NORMALIZATION", "L2_POOL_2D", "LEAKY_RELU", "LESS", "LESS_EQUAL", "LOG", "LOG_SOFTMAX", "LOGICAL_AND",
    "LOGICAL_NOT", "LOGICAL_OR", "LOGISTIC", "MAX_POOL_2D", "MAXIMUM", "MEAN", "MINIMUM", "MIRROR_PAD", "MUL", "NEG",
    "NOT_EQUAL", "ONE_HOT", "PACK", "PAD", "PADV2", "POW", "PRELU", "QUANTIZE", "REDUCE_ALL", "REDUCE_ANY",
    "REDUCE_MAX", "REDUCE_MIN", "RELU", "RELU6", "RELU_0_TO_1", "RELU_N1_TO_1", "RESHAPE", "RESIZE_BILINEAR",
    "RESIZE_NEAREST_NEIGHBOR", "REVERSE_V2", "ROUND", "RSQRT", "SCATTER_ND", "SELECT", "SELECT_V2", "SIGN", "SIN",
    "SLICE", "SOFTMAX", "SPACE_TO_BATCH_ND", "SPACE_TO_DEPTH", "SPLIT", "SPLIT_V", "SQRT", "SQUARE",
    "SQUARED_DIFFERENCE", "STABLEHLO_COMPOSITE", "STRIDED_SLICE", "SUB", "SUM", "TANH", "TILE", "TOPK_V2",
    "TRANSPOSE", "TRANSPOSE_CONV", "UNPACK"})
# mediatek/compiler/compiler_plugin.cc, kSupportedOps.
MEDIATEK_OPS = frozenset({
    "ABS", "ADD", "AVERAGE_POOL_2D", "BATCH_MATMUL", "CAST", "CONCATENATION", "CONV_2D", "DEPTHWISE_CONV_2D",
    "DEQUANTIZE", "DIV", "FULLY_CONNECTED", "GELU", "GREATER", "HARD_SWISH", "L2_NORMALIZATION", "LEAKY_RELU", "LESS",
    "LOGISTIC", "MAX_POOL_2D", "MAXIMUM", "MEAN", "MINIMUM", "MUL", "PAD", "PADV2", "PRELU", "QUANTIZE", "REDUCE_MAX",
    "RELU", "RESHAPE", "RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR", "RSQRT", "SLICE", "SOFTMAX", "SPLIT", "SQRT",
    "SQUARED_DIFFERENCE", "STABLEHLO_COMPOSITE", "STRIDED_SLICE", "SUB", "SUM", "TANH", "TRANSPOSE",
    "TRANSPOSE_CONV"})
# The STABLEHLO_COMPOSITE names each legalizes: qnn_compose_graph.cc BuildShloCompositeOp; MediaTek VerifyCommonOp.
COMPOSITES = {"Qualcomm": {"odml.rms_norm", "odml.group_norm", "odml.l2_norm"},
              "MediaTek": {"odml.rms_norm", "odml.l2_norm"}}
# qnn_compose_graph.cc, ConvertDataType: the element types with a QNN type, quantized or not (no UINT4, BFLOAT16,
# FLOAT8, STRING, COMPLEX). Quantization: per-tensor or per-channel, not block-wise.
QUALCOMM_TYPES = frozenset({"BOOL", "INT2", "INT4", "INT8", "INT16", "INT32", "INT64", "UINT8", "UINT16", "UINT32",
                            "UINT64", "FLOAT16", "FLOAT32", "FLOAT64"})
# neuron_utils.cc, GetNeuronTensorType: element type -> the quantizations it takes (None: any). INT16 and UINT16
# per-tensor only; INT8 and INT4 must be quantized; INT64 only as a constant (cast to int32); an INT32 per-channel
# tensor needs all-zero zero points.
MEDIATEK_TYPES = {"FLOAT32": None, "FLOAT16": None, "BOOL": None, "UINT8": None, "INT32": None,
                  "INT16": {"per-tensor"}, "UINT16": {"per-tensor"}, "INT8": {"per-tensor", "per-channel"},
                  "INT4": {"per-tensor", "per-channel"}, "INT64": "constant"}
VENDORS = {"Qualcomm": QUALCOMM_OPS, "MediaTek": MEDIATEK_OPS}
FLOAT_REASON = "computes in float (NPUs take statically quantized integer graphs)"

Tensor = collections.namedtuple("Tensor", "type quantization zero_points_zero constant")
Op = collections.namedtuple("Op", "name inputs outputs composite float")


def quantization(tensor):
    """"none", "per-tensor", "per-channel" or "blockwise", as LiteRT's MapQuantization reads a tensor's."""
    q = tensor.quantization
    if q is None:
        return "none"
    if q.detailsType == 2:  # QuantizationDetails.BlockwiseQuantization
        return "blockwise"
    count = max(len(q.scale) if q.scale is not None else 0, len(q.zeroPoint) if q.zeroPoint is not None else 0)
    return "none" if count == 0 else "per-tensor" if count == 1 else "per-channel"


def op_types(path):
    """Every op of subgraph 0 of a .tflite file as an ``Op``: builtin name, input and output ``Tensor``s (type
    name, quantization kind, zero points all 0, constant), its composite name (STABLEHLO_COMPOSITE) and whether it
    computes in float: a float tensor computed at run time among its inputs or outputs, where a DEQUANTIZE of a
    constant (weights unpacked at load) computes nothing."""
    data = read_flatbuffer(os.fspath(path))
    try:
        model = unpack_model(data)
        graph, names = model.subgraphs[0], op_names(model)
    except Exception as error:  # a truncated or corrupt flatbuffer fails anywhere in the generated reader
        raise ValueError(f"`tflite` file {os.fspath(path)!r} is not a readable TFLite model: "
                         f"{type(error).__name__}: {error}") from None

    def spec(index):
        t = graph.tensors[index]
        zero = t.quantization is None or t.quantization.zeroPoint is None or not any(t.quantization.zeroPoint)
        return Tensor(type_names()[t.type], quantization(t), zero, is_constant(model, t))

    found = []
    for op in graph.operators:
        name = names[op.opcodeIndex]
        inputs = [spec(i) for i in op.inputs if i >= 0]
        outputs = [spec(i) for i in op.outputs if i >= 0]
        composite = op.builtinOptions2.name if name == "STABLEHLO_COMPOSITE" and op.builtinOptions2 else None
        composite = composite.decode() if isinstance(composite, bytes) else composite
        unpacks_weights = name == "DEQUANTIZE" and all(t.constant for t in inputs)
        computes_float = not unpacks_weights and any(
            t.type in FLOAT_TYPES and not t.constant for t in inputs + outputs)
        found.append(Op(name, inputs, outputs, composite, computes_float))
    return found


def type_refusal(vendor, tensor):
    """Why ``vendor``'s plugin has no type for a ``Tensor``, or None where it maps it."""
    kind, quant = tensor.type, tensor.quantization
    if vendor == "Qualcomm":
        if kind not in QUALCOMM_TYPES:
            return f"no QNN type for {kind}"
        return "block-wise quantization" if quant == "blockwise" else None
    if kind not in MEDIATEK_TYPES:
        return f"no Neuron type for {kind}"
    wanted = MEDIATEK_TYPES[kind]
    if wanted == "constant" and not tensor.constant:
        return f"{kind} computed at run time (constants only)"
    if isinstance(wanted, set) and quant not in wanted:
        return f"{kind} {'unquantized' if quant == 'none' else quant} (takes {' or '.join(sorted(wanted))})"
    if kind == "INT32" and quant == "per-channel" and not tensor.zero_points_zero:
        return "INT32 per-channel with non-zero zero points"
    return None


def refusals(vendor, op):
    """[why] ``vendor``'s NPU plugin would leave this ``Op`` on the CPU; [] where it takes it."""
    why = []
    if op.name not in VENDORS[vendor]:
        why.append("not an op the plugin legalizes")
    elif op.name == "STABLEHLO_COMPOSITE" and op.composite not in COMPOSITES[vendor]:
        why.append(f"composite {op.composite!r} not legalized")
    if op.float:
        why.append(FLOAT_REASON)
    why += sorted({r for t in op.inputs + op.outputs for r in [type_refusal(vendor, t)] if r})
    return why


def float_ops(path):
    """{op name: count} of the ops of a .tflite file that compute in float (see ``op_types``)."""
    return dict(collections.Counter(op.name for op in op_types(path) if op.float).most_common())


def npu_report(path):
    """What the Qualcomm and MediaTek NPU plugins would do with a .tflite file:
    {"full_integer": no op computes in float, "float_ops": {op: count}, "ops": count, "vendors": {vendor:
    {"refused": {op: count}, "reasons": {op: [why]}, "whole": nothing refused}}}."""
    ops = op_types(path)
    floats = collections.Counter(op.name for op in ops if op.float)
    vendors = {}
    for vendor in VENDORS:
        refused, reasons = collections.Counter(), collections.defaultdict(list)
        for op in ops:
            why = refusals(vendor, op)
            if why:
                refused[op.name] += 1
                reasons[op.name] += [w for w in why if w not in reasons[op.name]]
        vendors[vendor] = {"refused": dict(refused.most_common()), "reasons": dict(reasons), "whole": not refused}
    return {"full_integer": not floats, "float_ops": dict(floats.most_common()), "ops": len(ops),
            "vendors": vendors}


def counts(ops, most=4):
    """ "A ×2, B ×1" for {op: count}, the ``most`` commonest, then "…" for the rest."""
    items = sorted(ops.items(), key=lambda item: (-item[1], item[0]))
    return ", ".join(f"{name} ×{n}" for name, n in items[:most]) + (", …" if len(items) > most else "")


def npu_cell(report):
    """One line of Markdown for a verify table: "Qualcomm, MediaTek: whole", "Qualcomm: whole; MediaTek: refuses
    GATHER ×1", or "not full-integer (12 float ops: FULLY_CONNECTED ×4, …)"."""
    if not report["full_integer"]:
        floats = report["float_ops"]
        return f"not full-integer ({sum(floats.values())} float ops: {counts(floats)})"
    vendors = report["vendors"]
    whole = [vendor for vendor, verdict in vendors.items() if verdict["whole"]]
    parts = [f"{', '.join(whole)}: whole"] if whole else []
    parts += [f"{vendor}: refuses {counts(verdict['refused'])}" for vendor, verdict in vendors.items()
              if not verdict["whole"]]
    return "; ".join(parts)
