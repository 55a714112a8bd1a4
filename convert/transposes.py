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

from .flatbuffer import builtin_code, builtin_name, type_names

# TRANSPOSE's op version by its input's tensor type and rank (TFLite's op_version.cc: int8 v2, bool v3, rank 5 v4,
# int16 v5, rank 6 v6); float32 and anything else at rank <= 4: v1.
TRANSPOSE_TYPE_VERSIONS = {"INT8": 2, "BOOL": 3, "INT16": 5}


def schema_module():
    from ai_edge_litert import schema_py_generated as schema

    return schema


def adjoint_matmuls(model_bytes):
    """[(subgraph, op index, "adj_x" / "adj_y")] of every BATCH_MATMUL flag set in a .tflite flatbuffer."""
    schema = schema_module()
    model = schema.Model.GetRootAs(model_bytes, 0)
    flagged = []
    for s in range(model.SubgraphsLength()):
        graph = model.Subgraphs(s)
        for i in range(graph.OperatorsLength()):
            op = graph.Operators(i)
            if builtin_name(model.OperatorCodes(op.OpcodeIndex())) != "BATCH_MATMUL":
                continue
            table = op.BuiltinOptions()
            if table is None:
                continue
            options = schema.BatchMatMulOptions()
            options.Init(table.Bytes, table.Pos)
            flagged += [(s, i, flag) for flag, value in (("adj_x", options.AdjX()), ("adj_y", options.AdjY())) if value]
    return flagged


def transpose_version(tensor):
    """TRANSPOSE's op version for ``tensor`` (TensorT) as its input."""
    rank = len(tensor.shape) if tensor.shape is not None else 0
    return max(TRANSPOSE_TYPE_VERSIONS.get(type_names()[tensor.type], 1), 4 if rank > 4 else 1, 6 if rank > 5 else 1)


class Rewriter:
    """Adds TRANSPOSE ops to an unpacked model (ModelT): one op code per version, one perm tensor per rank."""

    def __init__(self, schema, model):
        self.schema, self.model = schema, model
        self.codes, self.perms = {}, {}

    def opcode(self, version):
        if version not in self.codes:
            code = self.schema.OperatorCodeT()
            code.builtinCode = code.deprecatedBuiltinCode = self.schema.BuiltinOperator.TRANSPOSE
            code.version = version
            self.model.operatorCodes.append(code)
            self.codes[version] = len(self.model.operatorCodes) - 1
        return self.codes[version]

    def buffer(self, data=None):
        buffer = self.schema.BufferT()
        if data is not None:
            buffer.data = np.frombuffer(data, dtype=np.uint8)
        self.model.buffers.append(buffer)
        return len(self.model.buffers) - 1

    def perm(self, graph, rank):
        """The constant perm tensor that swaps the last two axes of a rank-``rank`` tensor."""
        if (id(graph), rank) not in self.perms:
            order = np.arange(rank, dtype="<i4")
            order[-2:] = order[-2:][::-1]
            tensor = self.schema.TensorT()
            tensor.shape, tensor.type = np.array([rank], dtype=np.int32), self.schema.TensorType.INT32
            tensor.buffer, tensor.name = self.buffer(order.tobytes()), f"adjoint_perm_{rank}d"
            graph.tensors.append(tensor)
            self.perms[id(graph), rank] = len(graph.tensors) - 1
        return self.perms[id(graph), rank]

    def transpose(self, graph, index):
        """(TRANSPOSE op, output tensor index) that swap the last two axes of tensor ``index``."""
        source = graph.tensors[index]
        tensor = copy.deepcopy(source)
        tensor.shape = swap_last_two(source.shape)
        tensor.shapeSignature = swap_last_two(source.shapeSignature)
        tensor.buffer = self.buffer()
        tensor.name = (source.name or b"tensor") + b"/transposed"
        graph.tensors.append(tensor)
        output = len(graph.tensors) - 1
        op = self.schema.OperatorT()
        op.opcodeIndex = self.opcode(transpose_version(source))
        op.inputs = np.array([index, self.perm(graph, len(source.shape))], dtype=np.int32)
        op.outputs = np.array([output], dtype=np.int32)
        op.builtinOptionsType = self.schema.BuiltinOptions.TransposeOptions
        op.builtinOptions = self.schema.TransposeOptionsT()
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
    from .metadata import pack_model, unpack_model

    schema = schema_module()
    model = unpack_model(model_bytes)
    rewriter = Rewriter(schema, model)
    matmuls = {i for i, code in enumerate(model.operatorCodes)
               if builtin_code(code) == schema.BuiltinOperator.BATCH_MATMUL}
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
