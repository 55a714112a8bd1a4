"""Which ops of a .tflite file the LiteRT GPU delegate would refuse, checked statically, without a GPU.

TensorFlow's model analyzer has a GPU-compatibility mode (``tf.lite.experimental.Analyzer.analyze(...,
gpu_compatibility=True)``), but the one in TensorFlow 2.21 and in ai-edge-litert 2.3.0 flags nothing, not even
TOPK_V2 or a three-input ADD_N, which the delegate's own rules (tensorflow/lite/tools/versioning/
gpu_compatibility.cc, ``CheckGpuDelegateCompatibility``) refuse. So this module applies those rules itself, to
each op's signature read from the flatbuffer: the op types the delegate builds, and the per-op conditions that
an exported ViT can meet or miss (input ranks, broadcasting, constant inputs, fused activations, options).

It also knows the delegate's bugs that its rules do not state (``known_bugs``): ops it takes but computes
wrongly, and shapes it refuses, each with the LiteRT issue that documents it.

It is a static check of op signatures, not a run: a GPU driver may still refuse a shape or run out of memory.
``litert_gpu_coverage`` asks LiteRT's own GPU accelerator where one can start.
"""

import collections
import os

from .flatbuffer import activation_names, builtin_name, options_table, read_model, type_names

# The op types CheckGpuDelegateCompatibility accepts (its switch); any other builtin is "Not supported op".
UNARY = {"ABS", "CEIL", "COS", "ELU", "EXP", "FLOOR", "GELU", "LOG", "LOGISTIC", "NEG", "RSQRT", "SIGN", "SIN",
         "SQRT", "SQUARE", "TANH"}
BINARY = {"ATAN2", "DIV", "EQUAL", "FLOOR_DIV", "FLOOR_MOD", "GREATER", "GREATER_EQUAL", "LOGICAL_AND", "LESS",
          "LESS_EQUAL", "MAXIMUM", "MINIMUM", "NOT_EQUAL", "POW", "SQUARED_DIFFERENCE", "SUB"}
REDUCTIONS = {"MEAN", "SUM", "REDUCE_MAX", "REDUCE_MIN", "REDUCE_PROD"}
ONE_INPUT = {"RESHAPE", "TRANSPOSE", "TILE", "QUANTIZE", "RESIZE_BILINEAR", "RESIZE_NEAREST_NEIGHBOR",
             "SPACE_TO_DEPTH", "DEPTH_TO_SPACE", "HARD_SWISH"}
OTHERS = {"ADD", "ADD_N", "AVERAGE_POOL_2D", "MAX_POOL_2D", "BATCH_MATMUL", "CAST", "CONCATENATION", "CONV_2D",
          "CUMSUM", "DENSIFY", "DEPTHWISE_CONV_2D", "DEQUANTIZE", "DYNAMIC_UPDATE_SLICE", "EMBEDDING_LOOKUP",
          "FULLY_CONNECTED", "GATHER", "LSTM", "MUL", "ONE_HOT", "PACK", "PAD", "PADV2", "MIRROR_PAD", "PRELU",
          "RELU", "RELU6", "RELU_N1_TO_1", "LEAKY_RELU", "SELECT", "SELECT_V2", "SLICE", "SOFTMAX", "SPLIT",
          "SPLIT_V", "STRIDED_SLICE", "TRANSPOSE_CONV", "STABLEHLO_CLAMP", "CUSTOM"}
SUPPORTED = UNARY | BINARY | REDUCTIONS | ONE_INPUT | OTHERS
ACTIVATION_OPS = {"CONV_2D": "Conv2DOptions", "MUL": "MulOptions", "SUB": "SubOptions", "DIV": "DivOptions"}
REFUSED_ACTIVATIONS = ("SIGN_BIT", "SIGMOID")  # fused activations the delegate cannot apply
# The delegate's known bugs, by the LiteRT issue that documents each: it ignores BATCH_MATMUL's adj_x / adj_y and
# multiplies the operands as stored, a wrong answer and no error (found on Whisper); and it refuses adj_y where the
# output has fewer rows than columns (M < N) and N is no multiple of 4, e.g. a class-token readout (M = 1).
ADJOINT_IGNORED = "LiteRT#8913"
ADJ_Y_REFUSED = "LiteRT#6518"
ISSUE_URLS = {ADJOINT_IGNORED: "https://github.com/google-ai-edge/LiteRT/issues/8913",
              ADJ_Y_REFUSED: "https://github.com/google-ai-edge/LiteRT/issues/6518"}
CASTS = {("BOOL", "FLOAT32"), ("BOOL", "FLOAT16"), ("FLOAT32", "BOOL"), ("FLOAT16", "BOOL"),
         ("FLOAT32", "FLOAT32"), ("FLOAT32", "INT32"), ("INT32", "FLOAT32"), ("INT32", "INT32")}


def broadcastable(a, b):
    """NumPy broadcasting of shapes ``a`` and ``b`` (the delegate's offline, "enhanced broadcast" rule)."""
    return all(x == y or 1 in (x, y) for x, y in zip(reversed(a), reversed(b)))


class OpSignature:
    """One op of a flatbuffer subgraph: its name, input and output tensors (shape, type, constness), options.

    folded: tensors the delegate holds as constants although an op makes them (``constant_dequantized``)."""

    def __init__(self, model, graph, op, folded=frozenset()):
        self.op = op
        self.name = builtin_name(model.OperatorCodes(op.OpcodeIndex()))

        def spec(index):
            tensor = graph.Tensors(index)
            buffer = model.Buffers(tensor.Buffer())
            constant = index in folded or bool(buffer is not None and (buffer.DataLength() or buffer.Offset() > 1))
            return tuple(int(d) for d in tensor.ShapeAsNumpy()) if tensor.ShapeLength() else (), \
                type_names()[tensor.Type()], constant

        self.inputs = [spec(int(t)) for t in op.InputsAsNumpy() if t >= 0]
        self.outputs = [spec(int(t)) for t in op.OutputsAsNumpy() if t >= 0]
        self.runtime_inputs = sum(not constant for _, _, constant in self.inputs)

    def options(self, kind):
        return options_table(self.op, kind)


def refusal(sig):
    """Why the GPU delegate would refuse this op, or None where its rules accept it."""
    name, inputs = sig.name, sig.inputs
    ranks = [len(shape) for shape, _, _ in inputs]
    if name not in SUPPORTED:
        return "not an op the GPU delegate builds"
    if name in UNARY and (sig.runtime_inputs != 1 or len(inputs) != 1):
        return "needs exactly one runtime input"
    if name in BINARY and not (len(inputs) == 2 and sig.runtime_inputs >= 1):
        return "needs two inputs, at least one at run time"
    if name in REDUCTIONS | ONE_INPUT and sig.runtime_inputs != 1:
        return "needs exactly one runtime input"
    if name in REDUCTIONS and not (len(inputs) > 1 and inputs[1][2] and inputs[1][1] == "INT32"):
        return "axes must be a constant int32 tensor"
    if name == "ADD_N" and len(inputs) != 2:
        return f"ADD_N of {len(inputs)} inputs (two only)"
    if name in ("ADD", "MUL") and len(inputs) != 2:
        return "needs two inputs"
    if name in ("ADD", "MUL") and ranks[0] > 1 and ranks[1] > 1 and ranks[0] != ranks[1] \
            and not broadcastable(inputs[0][0], inputs[1][0]):
        return f"broadcast of {list(inputs[0][0])} and {list(inputs[1][0])}"
    if name == "MUL" and ranks[0] == ranks[1]:
        a, b = inputs[0][0], inputs[1][0]
        if any(x < y for x, y in zip(a, b)) and any(y < x for x, y in zip(a, b)):
            return f"MUL of {list(a)} and {list(b)} (an outer product)"
    if name in ("SLICE", "STRIDED_SLICE") and ranks[0] not in (3, 4):
        return f"{name} of a {ranks[0]}-D tensor (3-D or 4-D only)"
    if name == "STRIDED_SLICE":
        options = sig.options("StridedSliceOptions")
        if options and (options.EllipsisMask() or options.NewAxisMask() or options.ShrinkAxisMask()):
            return "STRIDED_SLICE with an ellipsis, new-axis or shrink-axis mask"
    if name in ("PAD", "PADV2", "MIRROR_PAD"):
        if sig.runtime_inputs != 1 or len(inputs) < 2 or inputs[1][0][1:] != (2,) or inputs[1][0][0] not in (3, 4):
            return "paddings must be a constant 3x2 or 4x2 tensor"
    if name == "FULLY_CONNECTED":
        options = sig.options("FullyConnectedOptions")
        if inputs[0][2]:
            return "FULLY_CONNECTED of a constant input"
        if sig.runtime_inputs > 2 or (options and options.WeightsFormat() != 0):
            return "FULLY_CONNECTED with runtime weights and bias, or shuffled weights"
        if options and options.KeepNumDims() and ranks[0] != len(sig.outputs[0][0]):
            return "FULLY_CONNECTED keep_num_dims with a different output rank"
    if name == "SOFTMAX":
        options = sig.options("SoftmaxOptions")
        if options and options.Beta() != 1.0:
            return "SOFTMAX with beta != 1"
    if name == "CAST" and (inputs[0][1], sig.outputs[0][1]) not in CASTS:
        return f"CAST from {inputs[0][1]} to {sig.outputs[0][1]}"
    if name == "DEQUANTIZE" and inputs[0][1] == "INT16":
        return "DEQUANTIZE of int16"
    if name in ACTIVATION_OPS:
        options = sig.options(ACTIVATION_OPS[name])
        activations = activation_names()
        if options and activations.get(options.FusedActivationFunction()) in REFUSED_ACTIVATIONS:
            return f"fused {activations[options.FusedActivationFunction()]} activation"
    return None


def known_bugs(sig):
    """[("wrong" | "refused", what, issue)]: where the delegate is known to compute this op wrongly or refuse it."""
    if sig.name != "BATCH_MATMUL":
        return []
    options = sig.options("BatchMatMulOptions")
    if options is None or not (options.AdjX() or options.AdjY()):
        return []
    found = [("wrong", f"BATCH_MATMUL {flag}", ADJOINT_IGNORED)
             for flag, on in (("adj_x", options.AdjX()), ("adj_y", options.AdjY())) if on]
    (a, _, _), (b, _, _) = sig.inputs[:2]
    if options.AdjY() and len(a) >= 2 and len(b) >= 2:
        rows, columns = (a[-1] if options.AdjX() else a[-2]), b[-2]
        if rows < columns and columns % 4:
            found.append(("refused", f"adj_y with M={rows} < N={columns}, N not a multiple of 4", ADJ_Y_REFUSED))
    return found


def constant_dequantized(model, graph):
    """Outputs of DEQUANTIZE ops of constant tensors (a float16 file's weights): the delegate folds them into
    float32 constants before it looks at the ops that read them, so those ops see constant weights."""
    folded = set()
    for i in range(graph.OperatorsLength()):
        op = graph.Operators(i)
        if builtin_name(model.OperatorCodes(op.OpcodeIndex())) != "DEQUANTIZE":
            continue
        buffer = model.Buffers(graph.Tensors(int(op.Inputs(0))).Buffer())
        if buffer is not None and (buffer.DataLength() or buffer.Offset() > 1):
            folded.add(int(op.Outputs(0)))
    return frozenset(folded)


def op_signatures(path):
    """Every op of a .tflite file as an ``OpSignature``; a clear error for a file that is no TFLite model."""
    from .metadata import read_flatbuffer

    data = read_flatbuffer(os.fspath(path))
    try:
        model = read_model(data)
        signatures = []
        for s in range(model.SubgraphsLength()):
            graph = model.Subgraphs(s)
            folded = constant_dequantized(model, graph)
            signatures += [OpSignature(model, graph, graph.Operators(i), folded)
                           for i in range(graph.OperatorsLength())]
    except Exception as error:  # a truncated or corrupt flatbuffer fails anywhere in the generated reader
        raise ValueError(f"`tflite` file {os.fspath(path)!r} is not a readable TFLite model: "
                         f"{type(error).__name__}: {error}") from None
    return signatures


def gpu_report(path):
    """What the LiteRT GPU delegate would do with a .tflite file: {"refused": {op: count}, "reasons": {op: [why]},
    "wrong": {what: count} it would compute wrongly, "issues": {what or reason: LiteRT issue}, "ops": count}."""
    refused, reasons = collections.Counter(), collections.defaultdict(list)
    wrong, issues = collections.Counter(), {}
    signatures = op_signatures(path)
    for sig in signatures:
        why = [reason for reason in (refusal(sig),) if reason]
        for kind, what, issue in known_bugs(sig):
            issues[what] = issue
            if kind == "wrong":
                wrong[what] += 1
            else:
                why.append(what)
        if why:
            refused[sig.name] += 1
            reasons[sig.name] += [w for w in why if w not in reasons[sig.name]]
    return {"refused": dict(refused), "reasons": dict(reasons), "wrong": dict(wrong), "issues": issues,
            "ops": len(signatures)}


def gpu_refusals(path):
    """({op: count} the LiteRT GPU delegate would refuse, {op: [reasons]}, number of ops) of a .tflite file."""
    report = gpu_report(path)
    return report["refused"], report["reasons"], report["ops"]


def litert_gpu_coverage(path):
    """True where LiteRT's GPU accelerator (CompiledModel, GPU only) takes every op, False where it refuses some,
    None where no GPU accelerator can start on this machine (no GPU adapter: nothing is measured)."""
    from ai_edge_litert.compiled_model import CompiledModel
    from ai_edge_litert.hardware_accelerator import HardwareAccelerator
    from ai_edge_litert.options import Options

    try:
        model = CompiledModel.from_file(os.fspath(path), options=Options(
            hardware_accelerators=HardwareAccelerator.GPU))
    except RuntimeError as error:
        return False if "not accelerated" in str(error) else None
    return bool(model.is_fully_accelerated())
