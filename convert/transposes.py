"""Explicit transposes in place of BATCH_MATMUL's adj_x / adj_y flags, so every runtime reads one orientation.

The export graph computes attention's q.k^T with k transposed, and the TFLite converter folds a TRANSPOSE that
feeds a BATCH_MATMUL into the op's adj_y flag, whatever form the graph gives it (a TRANSPOSE per head or per
block). LiteRT's GPU delegate ignores those flags and computes the product in the wrong orientation, silently
(google-ai-edge/LiteRT#8913), and refuses adj_y outright at some shapes (#6518). So after conversion each flag is
turned back into a TRANSPOSE of that operand, which every runtime and delegate reads the same way: the same
values, one cheap op more per flag.

    model_bytes = explicit_transposes(model_bytes)      # no flag set afterwards
    adjoint_matmuls(model_bytes)                        # [] for a GPU-safe file
"""

import copy

import numpy as np

from .flatbuffer import (add_buffer, add_opcode, add_tensor, builtin, builtin_code, builtin_name, new_op,
                         options_table, pack_model, read_model, type_names, unpack_model)

# TRANSPOSE's op version by its input's tensor type and rank (TFLite's op_version.cc: int8 v2, bool v3, rank 5 v4,
# int16 v5, rank 6 v6); float32 and anything else at rank <= 4: v1.
TRANSPOSE_TYPE_VERSIONS = {"INT8": 2, "BOOL": 3, "INT16": 5}


def adjoint_matmuls(model_bytes):
    """[(subgraph, op index, "adj_x" / "adj_y")] of every BATCH_MATMUL flag set in a .tflite flatbuffer."""
    model = read_model(model_bytes)
    flagged = []
    for s in range(model.SubgraphsLength()):
        graph = model.Subgraphs(s)
        for i in range(graph.OperatorsLength()):
            op = graph.Operators(i)
            if builtin_name(model.OperatorCodes(op.OpcodeIndex())) != "BATCH_MATMUL":
                continue
            options = options_table(op, "BatchMatMulOptions")
            if options is None:
                continue
            flagged += [(s, i, flag) for flag, value in (("adj_x", options.AdjX()), ("adj_y", options.AdjY())) if value]
    return flagged


def transpose_version(tensor):
    """TRANSPOSE's op version for ``tensor`` (TensorT) as its input."""
    rank = len(tensor.shape) if tensor.shape is not None else 0
    return max(TRANSPOSE_TYPE_VERSIONS.get(type_names()[tensor.type], 1), 4 if rank > 4 else 1, 6 if rank > 5 else 1)


class Rewriter:
    """Adds TRANSPOSE ops to an unpacked model (ModelT): one op code per version, one perm tensor per rank."""

    def __init__(self, model):
        self.model = model
        self.codes, self.perms = {}, {}

    def opcode(self, version):
        if version not in self.codes:
            self.codes[version] = add_opcode(self.model, builtin("TRANSPOSE"), version)
        return self.codes[version]

    def perm(self, graph, rank):
        """The constant perm tensor that swaps the last two axes of a rank-``rank`` tensor."""
        if (id(graph), rank) not in self.perms:
            order = np.arange(rank, dtype="<i4")
            order[-2:] = order[-2:][::-1]
            self.perms[id(graph), rank] = add_tensor(graph, f"adjoint_perm_{rank}d", np.array([rank], dtype=np.int32),
                                                     "INT32", buffer=add_buffer(self.model, order))
        return self.perms[id(graph), rank]

    def transpose(self, graph, index):
        """(TRANSPOSE op, output tensor index) that swap the last two axes of tensor ``index``."""
        source = graph.tensors[index]
        tensor = copy.deepcopy(source)
        tensor.shape = swap_last_two(source.shape)
        tensor.shapeSignature = swap_last_two(source.shapeSignature)
        tensor.buffer = add_buffer(self.model)
        tensor.name = (source.name or b"tensor") + b"/transposed"
        graph.tensors.append(tensor)
        output = len(graph.tensors) - 1
        op = new_op(self.opcode(transpose_version(source)), [index, self.perm(graph, len(source.shape))], [output],
                    options="TransposeOptions")
        return op, output


def swap_last_two(shape):
    if shape is None or len(shape) < 2:
        return shape
    shape = np.array(shape, dtype=np.int32)
    shape[-2:] = shape[-2:][::-1]
    return shape


def explicit_transposes(model_bytes):
    """``model_bytes`` with every BATCH_MATMUL adj_x / adj_y flag replaced by a TRANSPOSE of that operand, placed
    just before the op (the op order stays topological); the bytes unchanged where no flag is set."""
    if not adjoint_matmuls(model_bytes):
        return bytes(model_bytes)
    model = unpack_model(model_bytes)
    rewriter = Rewriter(model)
    matmuls = {i for i, code in enumerate(model.operatorCodes) if builtin_code(code) == builtin("BATCH_MATMUL")}
    for graph in model.subgraphs:
        operators = []
        for op in graph.operators:
            options = op.builtinOptions if op.opcodeIndex in matmuls else None
            for slot, flag in ((0, "adjX"), (1, "adjY")):
                if options is not None and getattr(options, flag):
                    transpose, output = rewriter.transpose(graph, int(op.inputs[slot]))
                    operators.append(transpose)
                    op.inputs[slot] = output
                    setattr(options, flag, False)
            operators.append(op)
        graph.operators = operators
    return pack_model(model, len(model_bytes) + 4096)
