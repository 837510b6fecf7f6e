"""Writes .tflite models: one-op models for tests, small demo models, users' own op tests.

    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (1, 8, 8, 3))
    w = g.const("w", np.ones((4, 3, 3, 3), np.float32))
    bias = g.const("b", np.zeros(4, np.float32))
    y = g.tensor("y", (1, 8, 8, 4))
    g.op("CONV_2D", [x, w, bias], [y], padding="SAME", fused_activation_function="RELU")
    g.output(y)
    model_bytes = b.finish()

Options are the schema's field names in snake_case; enum fields take their names as strings.
Everything goes through the `tflite` package's generated builder functions.
"""
from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Optional, Sequence

import flatbuffers
import numpy as np
import tflite
from tflite.utils import BUILTIN_OPCODE2NAME

from tflite_taichi.ops.base import lookup
from tflite_taichi.tensors import DENSE, Quantization, Sparsity, sparsify

_NAME2OPCODE = {name: code for code, name in BUILTIN_OPCODE2NAME.items()}
_OPTION_TYPES = {name: code for name, code in vars(tflite.BuiltinOptions).items()
                 if not name.startswith("_") and isinstance(code, int)}
# tables of the schema's second options union, written to builtin_options_2
# (StableHLOCompositeOptions, ...); no name is in both unions
_OPTION_2_TYPES = {name: code for name, code in vars(tflite.BuiltinOptions2).items()
                   if not name.startswith("_") and isinstance(code, int) and code}
_DTYPE2TYPE = {np.dtype(np.float32): 0, np.dtype(np.float16): 1, np.dtype(np.int32): 2,
               np.dtype(np.uint8): 3, np.dtype(np.int64): 4, np.dtype(np.bool_): 6,
               np.dtype(np.int16): 7, np.dtype(np.complex64): 8, np.dtype(np.int8): 9, np.dtype(np.float64): 10,
               np.dtype(np.uint64): 12, np.dtype(np.uint32): 15, np.dtype(np.uint16): 16}
RESOURCE = "resource"   # pass as dtype for a resource tensor (VAR_HANDLE outputs)

# Option fields whose values are schema enums, so they can be written by name.
_ENUM_FIELDS = {
    "padding": tflite.Padding,
    "fused_activation_function": tflite.ActivationFunctionType,
    "weights_format": tflite.FullyConnectedOptionsWeightsFormat,
    "mode": tflite.MirrorPadMode,
    "kernel_type": tflite.LSTMKernelType,
    "output_type": tflite.TensorType,
    "out_type": tflite.TensorType,
    "idx_out_type": tflite.TensorType,
    "in_data_type": tflite.TensorType,
    "out_data_type": tflite.TensorType,
    "quantized_bias_type": tflite.TensorType,      # CONV_2D, FULLY_CONNECTED, TRANSPOSE_CONV
}

# Ops whose options class is not <CamelCaseName>Options.
_OPTIONS_CLASS = {
    "MAXIMUM": "MaximumMinimumOptions", "MINIMUM": "MaximumMinimumOptions",
    "AVERAGE_POOL_2D": "Pool2DOptions", "MAX_POOL_2D": "Pool2DOptions", "L2_POOL_2D": "Pool2DOptions",
    "MEAN": "ReducerOptions", "SUM": "ReducerOptions", "REDUCE_MAX": "ReducerOptions",
    "REDUCE_MIN": "ReducerOptions", "REDUCE_PROD": "ReducerOptions", "REDUCE_ANY": "ReducerOptions",
    "LSTM": "LSTMOptions", "UNIDIRECTIONAL_SEQUENCE_LSTM": "UnidirectionalSequenceLSTMOptions",
    "CONV_2D": "Conv2DOptions", "DEPTHWISE_CONV_2D": "DepthwiseConv2DOptions",
    "RESHAPE": "ReshapeOptions", "PADV2": "PadV2Options", "SELECT_V2": "SelectV2Options",
    "SPLIT_V": "SplitVOptions", "TOPK_V2": "TopKV2Options", "REVERSE_V2": "ReverseV2Options",
    "BATCH_MATMUL": "BatchMatMulOptions", "RFFT2D": "Rfft2dOptions",
    "L2_NORMALIZATION": "L2NormOptions", "ARG_MAX": "ArgMaxOptions", "ARG_MIN": "ArgMinOptions",
    "BATCH_TO_SPACE_ND": "BatchToSpaceNDOptions", "SPACE_TO_BATCH_ND": "SpaceToBatchNDOptions",
    "GATHER_ND": "GatherNdOptions", "ADD_N": "AddNOptions", "RESIZE_NEAREST_NEIGHBOR": "ResizeNearestNeighborOptions",
}


def options_class_for(op_name: str) -> Optional[str]:
    """The options table of a builtin op: the registered OpDef's, else the schema's naming rule."""
    opdef = lookup(op_name)
    if opdef is not None and opdef.options_class:
        return opdef.options_class
    if op_name in _OPTIONS_CLASS:
        return _OPTIONS_CLASS[op_name]
    camel = "".join(p.capitalize() for p in op_name.split("_")) + "Options"
    return camel if camel in _OPTION_TYPES else None


def _camel(snake: str) -> str:
    return "".join(p[:1].upper() + p[1:] for p in snake.split("_"))


def as_quantization(q) -> Optional[Quantization]:
    """(scale, zero_point), (scales, zero_points, dim), or a Quantization."""
    if q is None or isinstance(q, Quantization):
        return q
    if len(q) == 2:
        scale, zp, dim = q[0], q[1], 0
    else:
        scale, zp, dim = q
    return Quantization(scale=np.atleast_1d(np.asarray(scale, np.float32)),
                        zero_point=np.atleast_1d(np.asarray(zp, np.int64)),
                        quantized_dimension=int(dim))


@dataclass
class _Tensor:
    name: str
    shape: tuple
    dtype: object
    buffer: int = 0
    quantization: Optional[Quantization] = None
    shape_signature: Optional[tuple] = None
    is_variable: bool = False
    sparsity: Optional[Sparsity] = None


@dataclass
class _Op:
    opcode: int
    inputs: list
    outputs: list
    options_class: Optional[str]
    options: dict
    custom_options: Optional[bytes]


class SubgraphBuilder:
    def __init__(self, model: "ModelBuilder", name: str):
        self._model = model
        self.name = name
        self.tensors: list = []
        self.ops: list = []
        self.inputs: list = []
        self.outputs: list = []

    def tensor(self, name: str, shape: Sequence[int], dtype=np.float32, quantization=None,
               shape_signature=None, is_variable=False) -> int:
        """A tensor written by an op (or left for the runtime); returns its index."""
        dtype = dtype if dtype == RESOURCE else np.dtype(dtype)
        self.tensors.append(_Tensor(name=name, shape=tuple(int(d) for d in shape), dtype=dtype,
                                    quantization=as_quantization(quantization),
                                    shape_signature=tuple(shape_signature) if shape_signature else None,
                                    is_variable=is_variable))
        return len(self.tensors) - 1

    def input(self, name: str, shape, dtype=np.float32, quantization=None, shape_signature=None) -> int:
        t = self.tensor(name, shape, dtype, quantization, shape_signature)
        self.inputs.append(t)
        return t

    def const(self, name: str, value, dtype=None, quantization=None) -> int:
        """A constant tensor holding `value` (stored in `dtype`, default value's dtype)."""
        value = np.array(value, dtype=dtype, order="C")   # keeps a scalar rank 0
        t = self.tensor(name, value.shape, value.dtype, quantization)
        self.tensors[t].buffer = self._model._add_buffer(value.astype(value.dtype.newbyteorder("<")).tobytes())
        return t

    # -- sparse constants (the TFLite sparsity format; see ops/sparse.py) ----------------------
    def sparse_const(self, name: str, value, formats, *, block_map=(), block_size=(),
                     traversal_order=None, index_dtype=np.int32, dtype=None, quantization=None) -> int:
        """A constant stored sparse: `value` (dense, stored in `dtype`) encoded with one format
        per traversal level ("DENSE"/"SPARSE_CSR"), optional blocks (block_map=(1,),
        block_size=(4,): 1x4 blocks of a matrix) and SparseIndexVector type `index_dtype`
        (int32, uint16 or uint8, or one per level). Returns the tensor index."""
        dense = np.array(value, dtype=dtype, order="C")
        values, sparsity = sparsify(dense, formats, block_map, block_size, traversal_order, index_dtype)
        return self.raw_sparse_const(name, dense.shape, values, sparsity, quantization)

    def raw_sparse_const(self, name: str, shape, values, sparsity: Sparsity, quantization=None) -> int:
        """A sparse constant written exactly as given (no checks): the stored `values` and
        their `sparsity` metadata, for models with hand-made or malformed metadata."""
        values = np.asarray(values)
        t = self.tensor(name, shape, values.dtype, quantization)
        self.tensors[t].sparsity = sparsity
        self.tensors[t].buffer = self._model._add_buffer(values.astype(values.dtype.newbyteorder("<")).tobytes())
        return t

    def op(self, name: str, inputs: Sequence[int], outputs: Sequence[int], /, *, version: int = 1,
           custom_options: Optional[bytes] = None, options_class: Optional[str] = None,
           option_fields: Optional[dict] = None, **options) -> int:
        """Add an op: a builtin name ("CONV_2D") or "CUSTOM:<code>"; options by schema field name.
        An option may be called `name` (the first parameters are positional-only); one called
        as a keyword of op() itself (StableHLOCompositeOptions' `version`) goes in `option_fields`."""
        options = {**(option_fields or {}), **options}
        opcode = self._model._opcode(name, version)
        cls = None
        if not name.startswith("CUSTOM:"):
            cls = options_class or options_class_for(name)
            if options and cls is None:
                raise ValueError(f"{name} has no builtin options table; got {sorted(options)}")
        self.ops.append(_Op(opcode=opcode, inputs=list(inputs), outputs=list(outputs),
                            options_class=cls, options=options, custom_options=custom_options))
        return len(self.ops) - 1

    def output(self, *tensors: int):
        self.outputs.extend(tensors)


class ModelBuilder:
    def __init__(self, description: str = "written by tflite_taichi.builder"):
        self.description = description
        self.subgraphs: list = []
        self._buffers: list = [b""]          # buffer 0 is the empty one, by convention
        self._opcodes: dict = {}             # (name, version) -> index
        self._signatures: list = []
        self._metadata: list = []            # (name, buffer index)

    def metadata(self, name: str, data: bytes):
        """A metadata entry: `data` in a buffer of its own, under `name` (e.g. "TFLITE_METADATA",
        tflite_taichi.metadata.normalization_metadata's bytes)."""
        self._metadata.append((name, self._add_buffer(bytes(data))))

    def subgraph(self, name: str = "") -> SubgraphBuilder:
        """A new subgraph; the first one is the model's main graph."""
        sg = SubgraphBuilder(self, name or ("main" if not self.subgraphs else f"subgraph_{len(self.subgraphs)}"))
        self.subgraphs.append(sg)
        return sg

    def signature(self, key: str, subgraph: int, inputs: dict, outputs: dict):
        """A signature def: names -> tensor indices of `subgraph`."""
        self._signatures.append((key, subgraph, dict(inputs), dict(outputs)))

    def _add_buffer(self, data: bytes) -> int:
        self._buffers.append(data)
        return len(self._buffers) - 1

    def _opcode(self, name: str, version: int) -> int:
        key = (name, version)
        if key not in self._opcodes:
            if not name.startswith("CUSTOM:") and name not in _NAME2OPCODE:
                raise ValueError(f"unknown builtin op {name!r}")
            self._opcodes[key] = len(self._opcodes)
        return self._opcodes[key]

    # -- serialisation ------------------------------------------------------------------------
    def finish(self, external_buffers: bool = False) -> bytes:
        """The model's bytes. external_buffers=True stores constant data after the flatbuffer,
        addressed by (offset, size), as converters do for models over 2 GB."""
        if not self.subgraphs:
            raise ValueError("a model needs at least one subgraph")
        if not external_buffers:
            return self._serialise(None)
        # Offsets are absolute, so they depend on the flatbuffer's own length; the offset/size
        # fields have a fixed width, so a first pass with placeholders gives that length.
        placeholder = self._serialise([(2, len(d)) for d in self._buffers])
        base = _align(len(placeholder), 16)
        spans, blob, pos = [], bytearray(), base
        for data in self._buffers:
            spans.append((pos, len(data)) if data else None)
            blob += data + bytes(_align(len(data), 16) - len(data))
            pos += _align(len(data), 16)
        head = self._serialise([s if s else (2, 0) for s in spans])
        assert len(head) == len(placeholder), "external buffer layout changed between passes"
        return head + bytes(base - len(head)) + bytes(blob)

    def _serialise(self, external) -> bytes:
        b = flatbuffers.Builder(1024)
        if external is None:
            buffers = [self._write_buffer(b, data) for data in self._buffers]
        else:
            buffers = [self._write_external_buffer(b, *span) for span in external]
        subgraphs = [self._write_subgraph(b, sg) for sg in self.subgraphs]
        opcodes = [self._write_opcode(b, name, version)
                   for (name, version), _ in sorted(self._opcodes.items(), key=lambda kv: kv[1])]
        signatures = [self._write_signature(b, *s) for s in self._signatures]
        metadata = [self._write_metadata(b, name, buffer) for name, buffer in self._metadata]
        description = b.CreateString(self.description)
        M = importlib.import_module("tflite.Model")
        vectors = {"OperatorCodes": opcodes, "Subgraphs": subgraphs, "Buffers": buffers,
                   "SignatureDefs": signatures, "Metadata": metadata}
        offsets = {k: _table_vector(b, M, "Model", k, v) for k, v in vectors.items()}
        M.ModelStart(b)
        M.ModelAddVersion(b, 3)
        M.ModelAddDescription(b, description)
        for k, off in offsets.items():
            getattr(M, f"ModelAdd{k}")(b, off)
        b.Finish(M.ModelEnd(b), file_identifier=b"TFL3")
        return bytes(b.Output())

    @staticmethod
    def _write_metadata(b, name: str, buffer: int):
        MD = importlib.import_module("tflite.Metadata")
        name_offset = b.CreateString(name)
        MD.MetadataStart(b)
        MD.MetadataAddName(b, name_offset)
        MD.MetadataAddBuffer(b, buffer)
        return MD.MetadataEnd(b)

    @staticmethod
    def _write_buffer(b, data: bytes):
        B = importlib.import_module("tflite.Buffer")
        vec = None
        if data:
            b.StartVector(1, len(data), 16)      # 16-byte alignment for SIMD kernels
            b.head -= len(data)
            b.Bytes[b.head:b.head + len(data)] = data
            vec = b.EndVector()
        B.BufferStart(b)
        if vec is not None:
            B.BufferAddData(b, vec)
        return B.BufferEnd(b)

    @staticmethod
    def _write_external_buffer(b, offset: int, size: int):
        B = importlib.import_module("tflite.Buffer")
        B.BufferStart(b)
        if size:
            B.BufferAddOffset(b, offset)
            B.BufferAddSize(b, size)
        return B.BufferEnd(b)

    @staticmethod
    def _write_opcode(b, name: str, version: int):
        OC = importlib.import_module("tflite.OperatorCode")
        custom = b.CreateString(name[len("CUSTOM:"):]) if name.startswith("CUSTOM:") else None
        code = 32 if custom is not None else _NAME2OPCODE[name]
        OC.OperatorCodeStart(b)
        OC.OperatorCodeAddDeprecatedBuiltinCode(b, min(code, 127))
        OC.OperatorCodeAddBuiltinCode(b, code)
        OC.OperatorCodeAddVersion(b, version)
        if custom is not None:
            OC.OperatorCodeAddCustomCode(b, custom)
        return OC.OperatorCodeEnd(b)

    def _write_subgraph(self, b, sg: SubgraphBuilder):
        S = importlib.import_module("tflite.SubGraph")
        tensors = [self._write_tensor(b, t) for t in sg.tensors]
        ops = [self._write_op(b, op) for op in sg.ops]
        name = b.CreateString(sg.name)
        t_vec = _table_vector(b, S, "SubGraph", "Tensors", tensors)
        o_vec = _table_vector(b, S, "SubGraph", "Operators", ops)
        i_vec = b.CreateNumpyVector(np.array(sg.inputs, np.int32))
        out_vec = b.CreateNumpyVector(np.array(sg.outputs, np.int32))
        S.SubGraphStart(b)
        S.SubGraphAddTensors(b, t_vec)
        S.SubGraphAddOperators(b, o_vec)
        S.SubGraphAddInputs(b, i_vec)
        S.SubGraphAddOutputs(b, out_vec)
        S.SubGraphAddName(b, name)
        return S.SubGraphEnd(b)

    @staticmethod
    def _write_tensor(b, t: _Tensor):
        T = importlib.import_module("tflite.Tensor")
        name = b.CreateString(t.name)
        shape = b.CreateNumpyVector(np.array(t.shape, np.int32))
        sig = b.CreateNumpyVector(np.array(t.shape_signature, np.int32)) if t.shape_signature else None
        quant = _write_quantization(b, t.quantization) if t.quantization is not None else None
        sparsity = _write_sparsity(b, t.sparsity) if t.sparsity is not None else None
        T.TensorStart(b)
        T.TensorAddShape(b, shape)
        if sig is not None:
            T.TensorAddShapeSignature(b, sig)
        T.TensorAddType(b, 13 if t.dtype == RESOURCE else _DTYPE2TYPE[np.dtype(t.dtype)])
        T.TensorAddBuffer(b, t.buffer)
        T.TensorAddName(b, name)
        if quant is not None:
            T.TensorAddQuantization(b, quant)
        if t.is_variable:
            T.TensorAddIsVariable(b, True)
        if sparsity is not None:
            T.TensorAddSparsity(b, sparsity)
        return T.TensorEnd(b)

    @staticmethod
    def _write_op(b, op: _Op):
        O = importlib.import_module("tflite.Operator")
        opts = _write_options(b, op.options_class, op.options) if op.options_class else None
        custom = b.CreateByteVector(op.custom_options) if op.custom_options is not None else None
        ins = b.CreateNumpyVector(np.array(op.inputs, np.int32))
        outs = b.CreateNumpyVector(np.array(op.outputs, np.int32))
        O.OperatorStart(b)
        O.OperatorAddOpcodeIndex(b, op.opcode)
        O.OperatorAddInputs(b, ins)
        O.OperatorAddOutputs(b, outs)
        if opts is not None and op.options_class in _OPTION_2_TYPES:
            O.OperatorAddBuiltinOptions2Type(b, _OPTION_2_TYPES[op.options_class])
            O.OperatorAddBuiltinOptions2(b, opts)
        elif opts is not None:
            O.OperatorAddBuiltinOptionsType(b, _OPTION_TYPES[op.options_class])
            O.OperatorAddBuiltinOptions(b, opts)
        if custom is not None:
            O.OperatorAddCustomOptions(b, custom)
        return O.OperatorEnd(b)

    @staticmethod
    def _write_signature(b, key, subgraph, inputs, outputs):
        SD = importlib.import_module("tflite.SignatureDef")
        TM = importlib.import_module("tflite.TensorMap")

        def tensor_map(name, index):
            n = b.CreateString(name)
            TM.TensorMapStart(b)
            TM.TensorMapAddName(b, n)
            TM.TensorMapAddTensorIndex(b, index)
            return TM.TensorMapEnd(b)

        ins = _table_vector(b, SD, "SignatureDef", "Inputs", [tensor_map(k, v) for k, v in inputs.items()])
        outs = _table_vector(b, SD, "SignatureDef", "Outputs", [tensor_map(k, v) for k, v in outputs.items()])
        k = b.CreateString(key)
        SD.SignatureDefStart(b)
        SD.SignatureDefAddInputs(b, ins)
        SD.SignatureDefAddOutputs(b, outs)
        SD.SignatureDefAddSignatureKey(b, k)
        SD.SignatureDefAddSubgraphIndex(b, subgraph)
        return SD.SignatureDefEnd(b)


def _align(n: int, to: int) -> int:
    return (n + to - 1) // to * to


def _table_vector(b, module, table: str, field_name: str, offsets: list):
    getattr(module, f"{table}Start{field_name}Vector")(b, len(offsets))
    for off in reversed(offsets):
        b.PrependUOffsetTRelative(off)
    return b.EndVector()


def _write_quantization(b, q: Quantization):
    Q = importlib.import_module("tflite.QuantizationParameters")
    scale = b.CreateNumpyVector(np.asarray(q.scale, np.float32))
    zp = b.CreateNumpyVector(np.asarray(q.zero_point, np.int64))
    Q.QuantizationParametersStart(b)
    Q.QuantizationParametersAddScale(b, scale)
    Q.QuantizationParametersAddZeroPoint(b, zp)
    Q.QuantizationParametersAddQuantizedDimension(b, q.quantized_dimension)
    return Q.QuantizationParametersEnd(b)


# SparseIndexVector union: numpy dtype of the stored indices -> (union type, table module)
_INDEX_VECTORS = {np.dtype(np.int32): (1, "Int32Vector"), np.dtype(np.uint16): (2, "Uint16Vector"),
                  np.dtype(np.uint8): (3, "Uint8Vector")}


def _write_index_vector(b, values):
    values = np.asarray(values)
    if values.dtype not in _INDEX_VECTORS:
        values = values.astype(np.int32)
    code, name = _INDEX_VECTORS[values.dtype]
    mod = importlib.import_module(f"tflite.{name}")
    vec = b.CreateNumpyVector(values.astype(values.dtype.newbyteorder("<")))
    getattr(mod, f"{name}Start")(b)
    getattr(mod, f"{name}AddValues")(b, vec)
    return code, getattr(mod, f"{name}End")(b)


def _write_sparsity(b, sp: Sparsity):
    SP = importlib.import_module("tflite.SparsityParameters")
    DM = importlib.import_module("tflite.DimensionMetadata")
    dims = []
    for md in sp.dim_metadata:
        segments = indices = None
        if md.format != DENSE:
            segments = _write_index_vector(b, md.segments) if md.segments is not None else None
            indices = _write_index_vector(b, md.indices) if md.indices is not None else None
        DM.DimensionMetadataStart(b)
        DM.DimensionMetadataAddFormat(b, md.format)
        DM.DimensionMetadataAddDenseSize(b, int(md.dense_size))
        for part, add_type, add in ((segments, DM.DimensionMetadataAddArraySegmentsType, DM.DimensionMetadataAddArraySegments),
                                    (indices, DM.DimensionMetadataAddArrayIndicesType, DM.DimensionMetadataAddArrayIndices)):
            if part is not None:
                add_type(b, part[0])
                add(b, part[1])
        dims.append(DM.DimensionMetadataEnd(b))
    order = b.CreateNumpyVector(np.array(sp.traversal_order, np.int32))
    block_map = b.CreateNumpyVector(np.array(sp.block_map, np.int32)) if len(sp.block_map) else None
    dim_vec = _table_vector(b, SP, "SparsityParameters", "DimMetadata", dims)
    SP.SparsityParametersStart(b)
    SP.SparsityParametersAddTraversalOrder(b, order)
    if block_map is not None:
        SP.SparsityParametersAddBlockMap(b, block_map)
    SP.SparsityParametersAddDimMetadata(b, dim_vec)
    return SP.SparsityParametersEnd(b)


def _write_options(b, class_name: str, options: dict):
    mod = importlib.import_module(f"tflite.{class_name}")
    values = {}
    for key, value in options.items():
        if isinstance(value, (bytes, bytearray)):   # a [ubyte] field (composite_attributes)
            values[key] = b.CreateByteVector(bytes(value))
        elif isinstance(value, (list, tuple, np.ndarray)):
            values[key] = b.CreateNumpyVector(np.asarray(value, np.int32))
        elif isinstance(value, str):
            enum = _ENUM_FIELDS.get(key)
            if enum is None:                  # a string field (VAR_HANDLE's shared_name, ...)
                values[key] = b.CreateString(value)
            elif not hasattr(enum, value):
                raise ValueError(f"{class_name}.{key}: {value!r} is not a {enum.__name__}")
            else:
                values[key] = getattr(enum, value)
        else:
            values[key] = value
    getattr(mod, f"{class_name}Start")(b)
    for key, value in values.items():
        adder = getattr(mod, f"{class_name}Add{_camel(key)}", None)
        if adder is None:
            raise ValueError(f"{class_name} has no field {key!r}")
        adder(b, value)
    return getattr(mod, f"{class_name}End")(b)
