"""Comparisons (EQUAL, NOT_EQUAL, LESS, LESS_EQUAL, GREATER, GREATER_EQUAL), the logical ops
LOGICAL_OR and LOGICAL_NOT (LOGICAL_AND lives with the binary ops in elementwise.py), SELECT,
SELECT_V2 and CAST.

Comparisons broadcast like numpy and write bool. Float, bool and plain integer inputs compare
their values. Quantized 8-bit inputs (uint8/int8; int16 for EQUAL/NOT_EQUAL) compare the way
LiteRT's kernels do, which is not an exact comparison of real values: each side becomes
`(q - zero_point) * 2^8` times its scale in TFLite's fixed point (a multiplier below one,
double rounding), so real values closer than about 1/256 can compare equal. The float view
recovers `q - zero_point` exactly (round(x / scale)) and computes the same integers. LiteRT
aborts on 8-bit comparisons whose scale is 0 (a non-quantized int8 tensor), exactly 1, or
where only one side is quantized, and returns garbage for scales above 1: here a
non-quantized pair compares its raw values, a scale >= 1 compares the exact real values
(times 256), and a pair with one quantized side is a ModelError. Quantized int16 LESS,
LESS_EQUAL, GREATER and GREATER_EQUAL compare the raw integers, ignoring the scales (LiteRT's
int16 kernels do; so do all comparisons of quantized int32/int64 tensors).

SELECT (condition scalar, rank 1 along the first dimension, or the values' shape) and
SELECT_V2 (the three shapes broadcast) pick from x or y. On the float view a quantized x, y
and output select real values and the output is snapped to its grid; LiteRT copies the raw
integers, which is the same thing when the three share a scale (as the converter makes them).

CAST follows LiteRT's kernel: float -> integer truncates toward zero and saturates (NaN gives
the type's maximum), integer -> integer wraps, anything -> bool is `!= 0` (complex: of the real
part), bool -> number is 0/1, -> float16 rounds through float32 to nearest-even. CAST reads and
writes raw integers even when a tensor carries quantization parameters.

Taichi: comparisons and LOGICAL_OR are a `CompareStep` (one thread per output element; each
input's key, as above, computed by a `CompareKey` in int32 arithmetic, which every backend
has), LOGICAL_NOT and the CASTs the delegate carries (float32/float16/bool at both ends)
a `CastStep`, SELECT/SELECT_V2 a `SelectStep`. bool travels as 0/1.
"""
import math
from dataclasses import dataclass

import numpy as np

from .base import ELEMENTWISE_UNARY, OpDef, register_op
from .common import broadcast_shapes
from .kit import BroadcastBinaryStep, ElementwiseStep, broadcast_flat, ti

COMPARISONS = ("EQUAL", "NOT_EQUAL", "LESS", "LESS_EQUAL", "GREATER", "GREATER_EQUAL")
_EQUALITY = ("EQUAL", "NOT_EQUAL")

_INT8 = {np.dtype(np.int8), np.dtype(np.uint8)}
# LiteRT's comparison kernels (comparisons.cc): EQUAL/NOT_EQUAL also take bool (and strings).
_ORDER_DTYPES = {np.dtype(t) for t in (np.float32, np.float16, np.int8, np.uint8, np.int16,
                                       np.int32, np.int64)}
_EQUALITY_DTYPES = _ORDER_DTYPES | {np.dtype(np.bool_)}

_NUMPY = {"EQUAL": np.equal, "NOT_EQUAL": np.not_equal, "LESS": np.less,
          "LESS_EQUAL": np.less_equal, "GREATER": np.greater, "GREATER_EQUAL": np.greater_equal}

# How one side of a comparison is turned into the value compared (see the module docstring).
VALUE, SCALED, SCALED_FLOAT, RAW = range(4)

# TFLite's ComparisonParams.left_shift for quantized inputs.
_LEFT_SHIFT = 8


def _dtype(spec):
    return None if spec is None or spec.dtype is None else np.dtype(spec.dtype)


def _dtype_name(spec) -> str:
    d = _dtype(spec)
    return "opaque" if d is None else d.name


def _check_output_bool(node):
    out = node.outputs[0]
    if _dtype(out) is not None and _dtype(out) != np.bool_:
        raise node.fail(f"output '{out.name}' has dtype {_dtype_name(out)}; the op writes bool")


def _check_per_tensor(node, spec, what):
    if spec.quantization is not None and spec.quantization.per_channel:
        raise node.fail(f"{what} '{spec.name}' has per-channel quantization; the op takes one "
                        "scale per tensor")


def compare_modes(node) -> tuple:
    """(mode of input 0, mode of input 1): how each side becomes the value compared."""
    a, b = node.inputs
    dtype = _dtype(a)
    qa, qb = a.quantization is not None, b.quantization is not None
    if not (qa or qb):
        return VALUE, VALUE
    if dtype in _INT8 or (dtype == np.int16 and node.op in _EQUALITY and qa):
        # LiteRT's ComparisonQuantized (int16: only when the first input is quantized)
        return tuple(SCALED if float(s.quantization.scale[0]) < 1.0 else SCALED_FLOAT
                     for s in (a, b))
    return RAW, RAW


def _infer_compare(node):
    a, b = node.inputs
    da, db = _dtype(a), _dtype(b)
    if da is not None and db is not None:
        if da != db:
            raise node.fail(f"inputs have different dtypes ({da.name} and {db.name})")
        allowed = _EQUALITY_DTYPES if node.op in _EQUALITY else _ORDER_DTYPES
        if da not in allowed:
            raise node.fail(f"inputs have dtype {da.name}; expected one of "
                            + ", ".join(sorted(t.name for t in allowed)))
        for spec, what in ((a, "input"), (b, "input")):
            _check_per_tensor(node, spec, what)
        qa, qb = a.quantization is not None, b.quantization is not None
        if qa != qb and (da in _INT8 or (da == np.int16 and node.op in _EQUALITY and qa)):
            raise node.fail("one input is quantized and the other is not (LiteRT aborts); "
                            "quantize both or neither")
        for spec in (a, b):
            if spec.quantization is not None and not float(spec.quantization.scale[0]) > 0:
                raise node.fail(f"input '{spec.name}' has scale {float(spec.quantization.scale[0])}"
                                "; a quantization scale must be positive")
    _check_output_bool(node)
    return [broadcast_shapes(node, a.shape, b.shape)]


def lite_multiplier(scale: float) -> tuple:
    """(multiplier, right shift) of TFLite's QuantizeMultiplierSmallerThanOneExp for a
    per-tensor scale in (0, 1) (a float32, as TfLiteQuantizationParams holds it)."""
    m = float(np.float32(scale))
    q, shift = math.frexp(m)
    fixed = int(math.floor(q * (1 << 31) + 0.5))       # std::round of a positive value
    if fixed == 1 << 31:
        fixed //= 2
        shift += 1
    if shift < -31:
        return 0, 0
    return fixed, -shift


def scaled_keys(d: np.ndarray, scale: float) -> np.ndarray:
    """TFLite's MultiplyByQuantizedMultiplierSmallerThanOneExp(d << 8, multiplier, shift) for
    the integers d = q - zero_point: SaturatingRoundingDoublingHighMul, then
    RoundingDivideByPOT (int64 arithmetic)."""
    multiplier, shift = lite_multiplier(scale)
    ab = d.astype(np.int64) * (1 << _LEFT_SHIFT) * multiplier
    v = ab + np.where(ab >= 0, 1 << 30, 1 - (1 << 30))
    high = np.where(v >= 0, v >> 31, -((-v) >> 31))     # C++ division truncates toward zero
    if shift == 0:
        return high
    mask = (1 << shift) - 1
    threshold = (mask >> 1) + (high < 0)
    return (high >> shift) + ((high & mask) > threshold)


def _raw(x: np.ndarray, spec) -> np.ndarray:
    """The stored integers of a tensor on the float view (as is when not quantized)."""
    if spec.quantization is None:
        return x
    scale = float(spec.quantization.scale[0])
    zero_point = int(spec.quantization.zero_point[0])
    d = np.floor(np.asarray(x, np.float64) / scale + 0.5).astype(np.int64)
    return d + zero_point


def _compare_key(x, spec, mode):
    if mode == VALUE:
        return x
    if mode == RAW:
        return _raw(x, spec)
    if mode == SCALED_FLOAT:
        return np.asarray(x, np.float64) * (1 << _LEFT_SHIFT)
    d = _raw(x, spec) - int(spec.quantization.zero_point[0])
    return scaled_keys(d, float(spec.quantization.scale[0]))


def _compare_reference(node, inputs):
    modes = compare_modes(node)
    a, b = (_compare_key(x, s, m) for x, s, m in zip(inputs, node.inputs, modes))
    return [_NUMPY[node.op](a, b)]


# -- Taichi: comparisons and LOGICAL_OR ------------------------------------------------------
_CODES = {"EQUAL": 0, "NOT_EQUAL": 1, "LESS": 2, "LESS_EQUAL": 3, "GREATER": 4,
          "GREATER_EQUAL": 5, "LOGICAL_OR": 6}


@ti.data_oriented
class CompareKey:
    """One side of a comparison: x (a real value on the float view) -> the value compared.
    SCALED: TFLite's fixed-point rescale of d = q - zp (|d| <= 2^15), in int32 only:
    t = floor((|d| * M + c) / 2^23) with c = 2^22 (d >= 0) or 2^22 - 1 (d < 0), M split in
    16-bit halves so no product passes 2^31, then a rounding right shift, then the sign."""

    def __init__(self, mode, spec=None):
        self.mode = mode
        self.scale, self.zero_point, self.m_hi, self.m_lo, self.shift = 1.0, 0.0, 0, 0, 0
        if spec is not None and spec.quantization is not None:
            self.scale = float(spec.quantization.scale[0])
            self.zero_point = float(spec.quantization.zero_point[0])
            if mode == SCALED:
                multiplier, self.shift = lite_multiplier(self.scale)
                self.m_hi, self.m_lo = multiplier >> 16, multiplier & 0xFFFF

    @ti.func
    def of(self, x):
        k = x
        if ti.static(self.mode == RAW):
            k = ti.floor(x / self.scale + 0.5) + self.zero_point
        elif ti.static(self.mode == SCALED_FLOAT):
            # from d, so a value rounded by float16 storage still gives the reference's key
            k = ti.floor(x / self.scale + 0.5) * (self.scale * 256.0)
        elif ti.static(self.mode == SCALED):
            d = ti.cast(ti.floor(x / self.scale + 0.5), ti.i32)
            u = ti.abs(d)
            p = u * self.m_hi
            q = u * self.m_lo
            c = 4194304
            if d < 0:
                c = 4194303
            t = (p >> 7) + (q >> 23) + ((((p & 127) << 16) + (q & 8388607) + c) >> 23)
            r = t
            if ti.static(self.shift >= 31):
                r = 0
            elif ti.static(self.shift > 0):
                r = (t + (1 << (self.shift - 1))) >> self.shift
            if d < 0:
                r = -r
            k = ti.cast(r, ti.f32)
        return k


@ti.func
def _compare(x, y, code: ti.template()):
    r = 0.0
    if ti.static(code == 0):
        r = ti.select(x == y, 1.0, 0.0)
    elif ti.static(code == 1):
        r = ti.select(x == y, 0.0, 1.0)      # NaN != anything; Taichi's `!=` is ordered on cpu
    elif ti.static(code == 2):
        r = ti.select(x < y, 1.0, 0.0)
    elif ti.static(code == 3):
        r = ti.select(x <= y, 1.0, 0.0)
    elif ti.static(code == 4):
        r = ti.select(x > y, 1.0, 0.0)
    elif ti.static(code == 5):
        r = ti.select(x >= y, 1.0, 0.0)
    else:
        # nested selects, not `|` of comparisons (as LOGICAL_AND in elementwise.py: Taichi's
        # GLSL backend miscompiles combined comparisons)
        r = ti.select(x != 0.0, 1.0, ti.select(y != 0.0, 1.0, 0.0))
    return r


@ti.data_oriented
class CompareStep(BroadcastBinaryStep):
    """out = op(key_a(a[...]), key_b(b[...])) as 0/1, inputs broadcast (the kit's template)."""

    def __init__(self, code, a, b, out, key_a, key_b):
        super().__init__(a, b, out)
        self.code, self.key_a, self.key_b = code, key_a, key_b

    @ti.func
    def formula(self, x, y):
        return _compare(self.key_a.of(x), self.key_b.of(y), self.code)


def _wide_quantized(spec) -> bool:
    """A quantized int32/int64 tensor: its raw integers do not fit float32's 24 bits."""
    return (spec is not None and spec.quantization is not None
            and _dtype(spec) is not None and _dtype(spec).itemsize > 2)


def _compare_supports(node):
    for spec, mode in zip(node.inputs, compare_modes(node)):
        if _wide_quantized(spec):
            return (f"tensor '{spec.name}' is {_dtype_name(spec)}-quantized: the comparison "
                    "reads its raw integers, beyond float32 precision")
        if mode == SCALED and _dtype(spec) == np.int16 and int(spec.quantization.zero_point[0]):
            # |q - zp| would pass 2^15, where CompareKey's int32 products overflow
            return f"tensor '{spec.name}' is int16-quantized with a nonzero zero point"
    return None


def _compare_taichi(node, io):
    if node.op == "LOGICAL_OR":
        keys = (CompareKey(VALUE), CompareKey(VALUE))
    else:
        keys = tuple(CompareKey(m, s) for m, s in zip(compare_modes(node), node.inputs))
    return CompareStep(_CODES[node.op], io.inputs[0], io.inputs[1], io.outputs[0], *keys)


for _name in COMPARISONS:
    register_op(OpDef(name=_name, infer=_infer_compare, reference=_compare_reference,
                      supports=_compare_supports, taichi=_compare_taichi,
                      min_inputs=2, max_inputs=2))


# -- LOGICAL_OR, LOGICAL_NOT -----------------------------------------------------------------
def _check_bool_inputs(node):
    for spec in node.inputs:
        if _dtype(spec) is not None and _dtype(spec) != np.bool_:
            raise node.fail(f"input '{spec.name}' has dtype {_dtype_name(spec)}; expected bool")
    _check_output_bool(node)


def infer_logical(node):
    """LOGICAL_OR (and LOGICAL_AND's checks, should elementwise.py want them): bool in and out,
    broadcast."""
    _check_bool_inputs(node)
    return [broadcast_shapes(node, *(s.shape for s in node.inputs))]


def _infer_logical_not(node):
    _check_bool_inputs(node)
    return [tuple(node.inputs[0].shape)]


LOGICAL_OR = register_op(OpDef(
    name="LOGICAL_OR", infer=infer_logical,
    reference=lambda node, inputs: [np.logical_or(inputs[0], inputs[1])],
    taichi=_compare_taichi, min_inputs=2, max_inputs=2))


# -- Taichi: LOGICAL_NOT and CAST (element-wise, one thread per element) ----------------------
COPY, NONZERO, LOGICAL_NOT_CODE, ROUND_F16 = range(4)
_INF = float("inf")


@ti.func
def round_to_f16(v):
    """v rounded to the nearest float16 value (ties to even, overflow to inf), kept as f32:
    integer arithmetic on the float32 bits for the normal range, exact float32 steps for
    float16's subnormals (multiples of 2^-24)."""
    b = ti.bit_cast(v, ti.i32)
    a = b & 0x7FFFFFFF
    r = v
    if a >= 0x7F800000:                 # inf, NaN: as they are
        r = v
    elif a >= 0x477FF000:               # |v| >= 65520: beyond float16's largest, 65504
        r = ti.select(b < 0, -_INF, _INF)
    elif a >= 0x38800000:               # |v| >= 2^-14: keep 10 of float32's 23 mantissa bits
        kept = (a + 0xFFF + ((a >> 13) & 1)) & -8192
        r = ti.bit_cast(kept | (b & -2147483648), ti.f32)
    else:
        y = ti.abs(v) * 16777216.0      # exact: a power of two
        n = ti.floor(y)
        f = y - n
        if f > 0.5:
            n += 1.0
        elif f == 0.5:
            if n - 2.0 * ti.floor(n * 0.5) == 1.0:
                n += 1.0
        r = ti.select(b < 0, -n, n) / 16777216.0
    return r


@ti.func
def _cast_formula(x, code: ti.template()):
    r = x
    if ti.static(code == NONZERO):
        r = ti.select(x == 0.0, 0.0, 1.0)       # NaN -> true (Taichi's `!=` is ordered on cpu)
    elif ti.static(code == LOGICAL_NOT_CODE):
        r = ti.select(x == 0.0, 1.0, 0.0)
    elif ti.static(code == ROUND_F16):
        r = round_to_f16(x)
    return r


@ti.data_oriented
class CastStep(ElementwiseStep):
    """CAST, LOGICAL_NOT and float16 rounding, element by element (the kit's template)."""

    def __init__(self, code, x, out):
        super().__init__(x, out)
        self.code = code

    @ti.func
    def formula(self, v):
        return _cast_formula(v, self.code)


LOGICAL_NOT = register_op(OpDef(
    name="LOGICAL_NOT", infer=_infer_logical_not,
    reference=lambda node, inputs: [np.logical_not(inputs[0])],
    taichi=lambda node, io: CastStep(LOGICAL_NOT_CODE, io.inputs[0], io.outputs[0]),
    min_inputs=1, max_inputs=1))


# -- SELECT, SELECT_V2 ---------------------------------------------------------------------------
def _flat_size(shape) -> int:
    return int(np.prod(shape, dtype=np.int64))


def _select_layout(node) -> str:
    """'scalar' (every tensor holds one element: the output keeps its declared shape, as in
    LiteRT), 'same', 'rank_one' (SELECT: the condition picks slices along the first
    dimension; a rank-0 condition the whole tensor) or 'broadcast' (SELECT_V2)."""
    cond, x, y = (s.shape for s in node.inputs)
    if all(_flat_size(s) == 1 for s in (cond, x, y, node.outputs[0].shape)):
        return "scalar"
    if tuple(cond) == tuple(x) == tuple(y):
        return "same"
    return "rank_one" if node.op == "SELECT" else "broadcast"


def _infer_select(node):
    cond, x, y = node.inputs
    if _dtype(cond) is not None and _dtype(cond) != np.bool_:
        raise node.fail(f"condition '{cond.name}' has dtype {_dtype_name(cond)}; expected bool")
    dx, dy, do = _dtype(x), _dtype(y), _dtype(node.outputs[0])
    if dx is not None and dy is not None and dx != dy:
        raise node.fail(f"x and y have different dtypes ({dx.name} and {dy.name})")
    if dx is not None and do is not None and do != dx:
        raise node.fail(f"output has dtype {do.name}; x and y have {dx.name}")
    quantized = [s.quantization is not None for s in (x, y, node.outputs[0])]
    if any(quantized) and not all(quantized):
        raise node.fail("x, y and the output must all be quantized or all not")
    for spec, what in ((x, "x"), (y, "y"), (node.outputs[0], "output")):
        _check_per_tensor(node, spec, what)
    layout = _select_layout(node)
    if layout == "scalar":
        return [tuple(node.outputs[0].shape)]
    if layout == "same":
        return [tuple(x.shape)]
    if layout == "broadcast":
        return [broadcast_shapes(node, cond.shape, x.shape, y.shape)]
    if tuple(x.shape) != tuple(y.shape):
        raise node.fail(f"x {list(x.shape)} and y {list(y.shape)} must have the same shape")
    if not (cond.rank == 0 or (cond.rank == 1 and x.rank >= 1 and cond.shape[0] == x.shape[0])):
        raise node.fail(f"condition {list(cond.shape)} must be a scalar, x's shape "
                        f"{list(x.shape)}, or 1-D of x's first dimension")
    return [tuple(x.shape)]


def _select_reference(node, inputs):
    cond, x, y = inputs
    layout = _select_layout(node)
    out_shape = node.outputs[0].shape
    if layout == "scalar":
        return [np.where(cond.reshape(()), x.reshape(()), y.reshape(())).reshape(out_shape)]
    if layout == "rank_one" and np.ndim(cond) == 1:
        cond = cond.reshape((-1,) + (1,) * (np.ndim(x) - 1))
    return [np.where(cond, x, y)]


@ti.data_oriented
class SelectStep:
    """One thread per output element: out = cond ? x : y, each read where it broadcasts to
    (rank_one: the condition's element is the output's first index)."""

    def __init__(self, cond, x, y, out, rank_one):
        self.cond, self.x, self.y, self.out, self.rank_one = cond, x, y, out, rank_one
        self.loop = out.shape or (1,)

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        for I in ti.grouped(ti.ndrange(*self.loop)):
            ci = 0
            if ti.static(self.rank_one):
                ci = I[0]
            else:
                ci = broadcast_flat(I, self.cond, self.out.rank)
            c = self.cond.load(arena, weights, io, ci)
            v = 0.0
            if c != 0.0:
                v = self.x.load(arena, weights, io, broadcast_flat(I, self.x, self.out.rank))
            else:
                v = self.y.load(arena, weights, io, broadcast_flat(I, self.y, self.out.rank))
            self.out.store(arena, io, self.out.flat_index(I), v)


def _select_supports(node):
    for spec in node.inputs[1:]:
        if _wide_quantized(spec):
            return f"tensor '{spec.name}' is {_dtype_name(spec)}-quantized"
    return None


def _select_taichi(node, io):
    rank_one = _select_layout(node) == "rank_one" and node.inputs[0].rank == 1
    return SelectStep(io.inputs[0], io.inputs[1], io.inputs[2], io.outputs[0], rank_one)


for _name in ("SELECT", "SELECT_V2"):
    register_op(OpDef(name=_name, infer=_infer_select, reference=_select_reference,
                      supports=_select_supports, taichi=_select_taichi,
                      min_inputs=3, max_inputs=3))


# -- CAST ----------------------------------------------------------------------------------------
CAST_DTYPES = {np.dtype(t) for t in (np.float16, np.float32, np.float64, np.int8, np.uint8,
                                     np.int16, np.uint16, np.int32, np.uint32, np.int64,
                                     np.bool_, np.complex64)}


@dataclass(frozen=True)
class CastOptions:
    in_data_type: int = 0       # tflite.TensorType; LiteRT ignores both (the tensors decide)
    out_data_type: int = 0


def _parse_cast(opts) -> CastOptions:
    return CastOptions(int(opts.InDataType()), int(opts.OutDataType()))


def _infer_cast(node):
    for spec, what in ((node.inputs[0], "input"), (node.outputs[0], "output")):
        if _dtype(spec) is not None and _dtype(spec) not in CAST_DTYPES:
            raise node.fail(f"{what} '{spec.name}' has dtype {_dtype_name(spec)}; CAST takes "
                            + ", ".join(sorted(t.name for t in CAST_DTYPES)))
    return [tuple(node.inputs[0].shape)]


def _saturating_float_to_int(x: np.ndarray, dst: np.dtype) -> np.ndarray:
    """LiteRT's SaturatingCastFloatingToInteger: NaN -> max, beyond the range -> its ends,
    else truncation toward zero (x is float32 or float64, compared in its own type)."""
    info = np.iinfo(dst)
    lo, hi = x.dtype.type(info.min), x.dtype.type(info.max)
    if int(hi) > info.max:                       # max not representable: the float below it
        hi = np.nextafter(hi, x.dtype.type(0))
    inside = (x >= lo) & (x <= hi)
    out = np.trunc(np.where(inside, x, 0)).astype(dst)
    out = np.where(x < lo, dst.type(info.min), out)
    out = np.where((x > hi) | np.isnan(x), dst.type(info.max), out)
    return out.astype(dst)


def cast_values(x: np.ndarray, dst) -> np.ndarray:
    """LiteRT's CAST of the stored values `x` to `dst` (see the module docstring)."""
    dst = np.dtype(dst)
    x = np.asarray(x)
    if x.dtype.kind == "c" and dst.kind != "c":
        x = np.real(x)                           # LiteRT casts the real part
    with np.errstate(invalid="ignore", over="ignore"):
        if dst == np.bool_:
            return x != 0
        if dst == np.float16:
            return x.astype(np.float32).astype(np.float16)
        if x.dtype.kind == "f" and dst.kind in "iu":
            if x.dtype == np.float16:
                x = x.astype(np.float32)
            return _saturating_float_to_int(x, dst)
        return x.astype(dst)


def _cast_reference(node, inputs):
    x, spec, out = inputs[0], node.inputs[0], node.outputs[0]
    if spec.quantization is not None:            # the float view -> the stored integers
        scale, zero_point = spec.quantization.broadcastable(np.ndim(x))
        x = (np.floor(np.asarray(x, np.float64) / scale + 0.5) + zero_point).astype(spec.dtype)
    y = cast_values(x, out.dtype if out.dtype is not None else x.dtype)
    if out.quantization is not None:             # stored integers -> the float view
        scale, zero_point = out.quantization.broadcastable(np.ndim(y))
        y = ((y.astype(np.float64) - zero_point) * scale).astype(np.float32)
    return [y]


def _cast_supports(node):
    for spec in (node.inputs[0], node.outputs[0]):
        if spec.quantization is not None:
            return (f"tensor '{spec.name}' is quantized: CAST converts its raw integers, which "
                    "the delegate does not carry")
    return None      # other integer tensors: refused by partition.delegate_reason


def _cast_code(node) -> int:
    src, dst = _dtype(node.inputs[0]), _dtype(node.outputs[0])
    if dst == np.bool_:
        return COPY if src == np.bool_ else NONZERO
    if dst == np.float16 and src == np.float32:
        return ROUND_F16
    return COPY          # float16 -> float32, same type, bool -> float: the value as it is


CAST = register_op(OpDef(
    name="CAST", infer=_infer_cast, reference=_cast_reference, parse=_parse_cast,
    options_class="CastOptions", supports=_cast_supports,
    taichi=lambda node, io: CastStep(_cast_code(node), io.inputs[0], io.outputs[0]),
    min_inputs=1, max_inputs=1, fusion=ELEMENTWISE_UNARY))
