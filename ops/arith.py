"""Math ops: ABS, NEG, SQRT, RSQRT, SQUARE, LOG, SIN, COS, FLOOR, CEIL, ROUND, SIGN, ELU, GELU
(element-wise), POW, FLOOR_DIV, FLOOR_MOD, ATAN2, RIGHT_SHIFT (broadcasting binary, as
ops/elementwise.py) and ADD_N (any number of same-shape inputs).

Float semantics are LiteRT's (tflite/kernels/elementwise.cc, floor_div.cc, floor_mod.cc,
pow.cc, round.cc, activations.cc, gelu.h, add_n.cc, LiteRT 2.3), checked against it:
- ROUND rounds half to even; SIGN keeps NaN; LOG/SQRT/RSQRT of a negative give NaN, of zero
  -inf / 0 / inf.
- FLOOR_DIV is floor(double(a) / double(b)) cast back: float32 division alone can round a
  quotient just below an integer up to it (1 // 0.1 is 9, not 10). FLOOR_MOD is fmod (exact)
  then + b where the signs differ. LiteRT refuses a zero divisor at invoke (any dtype; float
  FLOOR_MOD gives NaN); here an integer zero divisor gives 0 (as DIV does) and a float one the
  IEEE result (+-inf, NaN).
- Integer POW is std::pow in double cast to int32: a negative exponent (which LiteRT refuses at
  invoke) truncates toward zero (2^-1 = 0, 1^-n = 1), and a result outside int32 gives INT_MIN
  (x86's conversion, what LiteRT returns on overflow).
- ATAN2(y, x): the angle of (x, y) in [-pi, pi], C's atan2 (LiteRT's atan2.cc: std::atan2)
  with its special values: atan2(+-0, +0 or x > 0) = +-0, atan2(+-0, -0 or x < 0) = +-pi,
  atan2(y != 0, +-0) = +-pi/2, +-inf against +-inf the odd multiples of pi/4, a finite y
  against +inf +-0 and against -inf +-pi, NaN in either gives NaN. float32 (and float64 on the
  CPU, as LiteRT). LiteRT does not broadcast (it requires equal ranks and then walks the first
  input's elements, reading the second as if it had the same shape); here the inputs
  broadcast (numpy rules), tested against np.arctan2 where the shapes differ.
- RIGHT_SHIFT(x, n): int8/uint8/int16/uint16/int32/uint32 (LiteRT's types), one dtype for
  both inputs and the output, broadcasting; an arithmetic shift (a negative x stays negative,
  rounding toward -inf), the count clamped to [0, bits - 1] as LiteRT's right_shift.cc does
  to avoid C++'s undefined shifts: a negative count shifts by 0, a count >= the bit width by
  bits - 1 (a negative x gives -1, a non-negative one 0, an unsigned one its top bit). A
  quantized tensor is refused: LiteRT would shift its stored integers, which the float view
  does not carry. It stays on the CPU: integer tensors are not carried by the delegate (its
  float32 storage holds int32 exactly only below 2^24).
- GELU: 0.5 x erfc(-x / sqrt 2), or with GeluOptions.approximate the tanh form. numpy has no
  erfc: the reference uses the Chebyshev-fitted erfc of Numerical Recipes (fractional error
  below 1.2e-7, measured 1.05e-7 against math.erfc), in float64.

Quantized tensors arrive as real values (the float view), so each reference is the float formula
and the runtime snaps the output to its grid. Where LiteRT's int8 kernels differ in kind:
- LOG's int8/int16 lookup table maps x <= 0 to the lowest output value: on a quantized output,
  log(x <= 0) is -inf here, which snaps to the same place.
- NEG, FLOOR_DIV and FLOOR_MOD on int8/int16 in LiteRT ignore the quantization and work on the
  raw integers (-q, floor(qa / qb), ...): they agree with the real semantics only for zero
  points 0 and equal scales (FLOOR_DIV: also output scale 1), and NEG wraps -(-128) to -128.
  Here they compute on the real values.

Taichi: the element-wise ops are one `MathUnaryStep` (one thread per element, the formula chosen
at compile time), POW / FLOOR_DIV / FLOOR_MOD a `MathBinaryStep` (broadcast like BinaryStep),
ADD_N an `AddNStep`. Float FLOOR_DIV and FLOOR_MOD are exact without float64 (which GLES and
Metal lack): the quotient or remainder comes from an integer long division of the mantissas.
ATAN2 is its own
polynomial (Cephes' atanf on [0, 1] after reducing by pi/4; relative error about 2e-7) with
every special value an explicit branch on the bits: GLSL's atan(y, x) leaves x = 0 undefined,
and GPUs' native arctangents differ in accuracy. SIN and COS reduce |x| > pi by 2 pi in
integer arithmetic first (GPUs' native sin loses
accuracy with |x|; see _REDUCTIONS). Domain errors are explicit branches (GLSL leaves log, sqrt,
pow of negatives undefined); NaN and infinity tests read the bits (fast math may fold x != x);
on a quantized output a NaN becomes 0, where the reference's fake-quant puts it.
"""
from dataclasses import dataclass

import numpy as np

from .base import ELEMENTWISE_UNARY, Fusion, OpDef, register_op
from .common import TANH_SATURATION, broadcast_shapes, register_binary, unbroadcast_inputs
from .kit import BroadcastBinaryStep, ElementwiseStep, ti

_QUANTIZED_DTYPES = {np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int16)}


def _dtype_name(spec) -> str:
    if spec.dtype is None:
        return "opaque"
    name = np.dtype(spec.dtype).name
    return f"quantized {name}" if spec.is_quantized else name


def _check_dtypes(node, ints=()):
    """Every input and the output share one dtype: float32, a quantized 8/16-bit type (float
    view), or one of the integer dtypes `ints` the op computes on (LiteRT's type checks)."""
    specs = [s for s in node.inputs if s is not None] + [node.outputs[0]]
    allowed = {np.dtype(np.float32)} | {np.dtype(t) for t in ints}
    for spec in specs:
        if spec.dtype is None:
            continue
        dtype = np.dtype(spec.dtype)
        if spec.is_quantized and dtype in _QUANTIZED_DTYPES:
            continue
        if dtype not in allowed:
            expected = ", ".join(["float32"] + [np.dtype(t).name for t in ints]
                                 + ["quantized int8/uint8/int16"])
            raise node.fail(f"tensor '{spec.name}' has dtype {_dtype_name(spec)}; "
                            f"expected {expected}")
    kinds = {(np.dtype(s.dtype), s.is_quantized) for s in specs if s.dtype is not None}
    if len(kinds) > 1:
        raise node.fail("inputs and output must have the same dtype, got "
                        + ", ".join(f"'{s.name}' {_dtype_name(s)}" for s in specs))


def _is_int(x) -> bool:
    return np.issubdtype(np.asarray(x).dtype, np.integer)


# -- Taichi ----------------------------------------------------------------------------------
_ABS, _NEG, _SQRT, _RSQRT, _SQUARE, _LOG, _SIN, _COS, _FLOOR, _CEIL, _ROUND, _SIGN, _ELU, \
    _GELU, _GELU_TANH = range(15)
_UNARY_CODES = {"ABS": _ABS, "NEG": _NEG, "SQRT": _SQRT, "RSQRT": _RSQRT, "SQUARE": _SQUARE,
                "LOG": _LOG, "SIN": _SIN, "COS": _COS, "FLOOR": _FLOOR, "CEIL": _CEIL,
                "ROUND": _ROUND, "SIGN": _SIGN, "ELU": _ELU, "GELU": _GELU}
_POW, _FLOOR_DIV, _FLOOR_MOD, _ATAN2 = range(4)
_BINARY_CODES = {"POW": _POW, "FLOOR_DIV": _FLOOR_DIV, "FLOOR_MOD": _FLOOR_MOD, "ATAN2": _ATAN2}

_INF, _NAN = float("inf"), float("nan")
_SQRT_2_OVER_PI = float(np.sqrt(2.0 / np.pi))
_SQRT1_2 = float(np.sqrt(0.5))
# Numerical Recipes' erfc: t exp(-z^2 + c0 + t (c1 + t (c2 + ...))), t = 1 / (1 + z / 2), z >= 0.
_ERFC = (-1.26551223, 1.00002368, 0.37409196, 0.09678418, -0.18628806, 0.27886807,
         -1.13520398, 1.48851587, -0.82215223, 0.17087277)
# Below this |x|, ELU's exp(x) - 1 would lose relative precision: a Taylor polynomial instead
# (its first omitted term, x^6/720, is below 1.4e-8 relative there).
_EXPM1_TAYLOR = 0.1
# SIN/COS: GPUs' native sin and cos (NVIDIA's hardware approximation on CUDA with fast math,
# Vulkan and OpenGL) lose absolute accuracy in proportion to |x|: measured on an H200, 4e-6 at
# |x| <= 30, 1.4e-4 at 1000 (lavapipe, llvmpipe and Taichi's cpu stay near 1e-7). So |x| > pi
# is first reduced by 2 pi exactly in integer arithmetic, where fast math cannot reassociate
# it (a float Cody-Waite reduction was folded back into x - n * float32(2 pi) on cpu and
# CUDA): x * 2^q is an exact int32 while |x| < bound (x's ulp is >= 2^-q there), minus n times
# round(2 pi 2^q), then back to float less n times the rounding of that constant. With it the
# H200's three backends stayed within 7.8e-7 up to |x| = 1e6. Beyond the last bound (2^21) the
# native function is used.
_TWO_PI = 2.0 * np.pi
_REDUCTIONS = tuple(
    (float(bound), int(round(_TWO_PI * 2.0 ** q)),
     float(np.float32(_TWO_PI - round(_TWO_PI * 2.0 ** q) / 2.0 ** q)), float(2.0 ** q),
     float(2.0 ** -q))
    for bound, q in ((256.0, 22), (16384.0, 15), (2097152.0, 9)))   # |x 2^q|, |n p| < 2^31
_INV_TWO_PI = float(np.float32(1.0 / _TWO_PI))
_PI = float(np.float32(np.pi))
# Float FLOOR_DIV: quotients of this magnitude or more are integers in float32 already, so
# floor(a / b) is exact to float32 rounding and the long division is skipped.
_BIG_QUOTIENT = float(2 ** 22)
# ATAN2: Cephes' atanf polynomial, atan(t) ~ t + t^3 (c0 + t^2 (c1 + ...)) for |t| <= tan(pi/8)
_ATAN_POLY = (-3.33329491539e-1, 1.99777106478e-1, -1.38776856032e-1, 8.05374449538e-2)
_TAN_PI_8 = float(np.float32(np.sqrt(2.0) - 1.0))
_PI_4, _PI_2 = float(np.float32(np.pi / 4)), float(np.float32(np.pi / 2))


@ti.func
def _non_finite(v):
    """inf or NaN, from the bits (fast-math may fold v != v away)."""
    return (ti.bit_cast(v, ti.i32) & 0x7FFFFFFF) >= 0x7F800000


@ti.func
def _is_nan(v):
    return (ti.bit_cast(v, ti.i32) & 0x7FFFFFFF) > 0x7F800000


@ti.func
def _is_inf(v):
    return (ti.bit_cast(v, ti.i32) & 0x7FFFFFFF) == 0x7F800000


@ti.func
def _sign_bit(v):
    return ti.bit_cast(v, ti.i32) < 0


@ti.func
def _odd(y):
    """y (integer-valued) is odd; exact: y / 2 and its floor are exact in float32."""
    return y - 2.0 * ti.floor(y * 0.5) == 1.0


@ti.func
def _erfc(z):
    a = ti.abs(z)
    t = 1.0 / (1.0 + 0.5 * a)
    p = 0.0
    for c in ti.static(_ERFC[:0:-1]):
        p = c + t * p
    r = t * ti.exp(-a * a + _ERFC[0] + t * p)
    return ti.select(z >= 0.0, r, 2.0 - r)


@ti.func
def _tanh(x):
    r = ti.tanh(ti.min(ti.max(x, -TANH_SATURATION), TANH_SATURATION))
    if x > TANH_SATURATION:
        r = 1.0
    elif x < -TANH_SATURATION:
        r = -1.0
    return r


@ti.func
def _reduce_two_pi(x):
    """x - n 2 pi in [-pi, pi] (about), exact but for the final float rounding; see _REDUCTIONS."""
    r = x
    todo = ti.abs(x) > _PI
    for bound, p, c, up, down in ti.static(_REDUCTIONS):
        if todo and ti.abs(x) < bound:
            n = ti.floor(x * _INV_TWO_PI + 0.5)
            rem = ti.cast(x * up, ti.i32) - ti.cast(n, ti.i32) * p
            r = ti.cast(rem, ti.f32) * down - n * c
            todo = False
    return r


@ti.func
def _round_half_even(x):
    f = ti.floor(x)
    d = x - f                       # exact
    r = f
    if d > 0.5 or (d == 0.5 and _odd(f)):
        r = f + 1.0
    return r


@ti.func
def _unary_formula(x, code: ti.template(), quantized: ti.template()):
    r = x
    if ti.static(code == _ABS):
        r = ti.abs(x)
    elif ti.static(code == _NEG):
        r = -x
    elif ti.static(code == _SQRT):
        r = ti.sqrt(x)             # NaN stays NaN (no max: it drops NaN)
        if x < 0.0:
            r = _NAN
    elif ti.static(code == _RSQRT):
        r = 1.0 / ti.sqrt(x)
        if x < 0.0:
            r = _NAN
        elif x == 0.0:
            r = ti.select(_sign_bit(x), -_INF, _INF)
    elif ti.static(code == _SQUARE):
        r = x * x
    elif ti.static(code == _LOG):
        r = ti.log(x)
        if x < 0.0:
            # LiteRT's quantized LOG table maps x <= 0 to the lowest output value
            r = -_INF if ti.static(quantized) else _NAN
        elif x == 0.0:
            r = -_INF
    elif ti.static(code == _SIN):
        r = ti.sin(_reduce_two_pi(x))
    elif ti.static(code == _COS):
        r = ti.cos(_reduce_two_pi(x))
    elif ti.static(code == _FLOOR):
        r = ti.floor(x)
    elif ti.static(code == _CEIL):
        r = ti.ceil(x)
    elif ti.static(code == _ROUND):
        r = _round_half_even(x)
    elif ti.static(code == _SIGN):
        r = ti.select(x > 0.0, 1.0, ti.select(x < 0.0, -1.0, x))   # 0 and NaN stay
    elif ti.static(code == _ELU):
        if x < 0.0:
            r = ti.exp(x) - 1.0
            if x > -_EXPM1_TAYLOR:
                r = x * (1.0 + x * (0.5 + x * (1.0 / 6.0 + x * (1.0 / 24.0 + x * (1.0 / 120.0)))))
    elif ti.static(code == _GELU):
        r = 0.5 * x * _erfc(x * -_SQRT1_2)
    else:
        r = 0.5 * x * (1.0 + _tanh(_SQRT_2_OVER_PI * (x + 0.044715 * x * x * x)))
    return r


@ti.func
def _mantissa(v):
    """|v| (finite, nonzero) as m * 2^(e - 150), m an integer below 2^24."""
    bits = ti.bit_cast(v, ti.i32) & 0x7FFFFFFF
    e = bits >> 23
    m = bits & 0x7FFFFF
    if e != 0:
        m = m | 0x800000
    else:
        e = 1                       # subnormal
    return m, e


@ti.func
def _pow2(e):
    """2^e for -126 <= e <= 127, from the exponent bits."""
    return ti.bit_cast((e + 127) << 23, ti.f32)


@ti.func
def _long_division(a, b):
    """For finite nonzero a, b: (n, rem) with |a| = n |b| + rem, 0 <= rem < |b| (rem exact, n
    meaningful only while it fits in 31 bits): the mantissas divided bit by bit in integers."""
    ma, ea = _mantissa(a)
    mb, eb = _mantissa(b)
    n = 0
    r = ma
    k = ea - eb
    rem = ti.abs(a)
    if k >= 0:
        n = r // mb
        r = r % mb
        for _ in range(k):
            r = r * 2
            n = n * 2
            if r >= mb:
                r -= mb
                n += 1
        # rem = r * 2^(eb - 150), in two steps that stay in the normal range
        e = eb - 150
        half = e // 2
        rem = ti.cast(r, ti.f32) * _pow2(half) * _pow2(e - half)
    return n, rem


@ti.func
def _floor_div(a, b):
    q = a / b
    r = ti.floor(q)
    if b == 0.0:
        r = ti.select(a > 0.0, _INF, ti.select(a < 0.0, -_INF, _NAN))
    elif ti.abs(q) < _BIG_QUOTIENT and a != 0.0 and not _non_finite(b):
        n, rem = _long_division(a, b)
        if (a < 0.0) != (b < 0.0):
            n = -n - ti.select(rem != 0.0, 1, 0)
        r = ti.cast(n, ti.f32)
    return r


@ti.func
def _floor_mod(a, b):
    m = a                           # fmod(a, +-inf) = a; fmod(0, b) = 0
    if _non_finite(a) or b == 0.0 or _is_nan(b):
        m = _NAN
    elif a != 0.0 and not _non_finite(b):
        _, rem = _long_division(a, b)
        m = ti.select(a < 0.0, -rem, rem)
    if m != 0.0 and (b < 0.0) != (m < 0.0):
        m = m + b
    return m


@ti.func
def _pow(x, y):
    ax = ti.abs(x)
    r = ti.pow(ax, y)
    if y == 0.0 or x == 1.0:
        r = 1.0
    elif x == 0.0:
        r = ti.select(y > 0.0, 0.0, ti.select(_sign_bit(x) and y < 0.0 and _odd(y), -_INF, _INF))
    elif x < 0.0:
        if y != ti.floor(y):
            r = _NAN
        elif _odd(y):
            r = -r
    return r


@ti.func
def _atan_unit(t):
    """atan(t) for 0 <= t <= 1: by pi/4 above tan(pi/8), then the odd polynomial."""
    base = 0.0
    u = t
    if t > _TAN_PI_8:
        base = _PI_4
        u = (t - 1.0) / (t + 1.0)
    z = u * u
    p = 0.0
    for c in ti.static(_ATAN_POLY[::-1]):
        p = c + z * p
    return base + (u + u * z * p)


@ti.func
def _atan2(y, x):
    """C's atan2 (special values in the module docstring): the angle in the first quadrant
    from |y| and |x|, then reflected by the signs (from the bits: -0 counts as negative)."""
    ay, ax = ti.abs(y), ti.abs(x)
    r = 0.0
    if _is_nan(y) or _is_nan(x):
        r = _NAN
    elif _is_inf(y) or _is_inf(x):
        if _is_inf(y) and _is_inf(x):
            r = _PI_4
        elif _is_inf(y):
            r = _PI_2
    elif ay != 0.0 or ax != 0.0:
        if ay > ax:
            r = _PI_2 - _atan_unit(ax / ay)
        else:
            r = _atan_unit(ay / ax)
    if _sign_bit(x):
        r = _PI - r
    if _sign_bit(y):
        r = -r
    return r


@ti.func
def _binary_formula(a, b, code: ti.template()):
    r = 0.0
    if ti.static(code == _POW):
        r = _pow(a, b)
    elif ti.static(code == _ATAN2):
        r = _atan2(a, b)
    elif ti.static(code == _FLOOR_DIV):
        r = _floor_div(a, b)
    else:
        r = _floor_mod(a, b)
    return r


@ti.func
def _finish(v, quantized: ti.template()):
    """On a quantized output a NaN goes to 0, where the reference's fake-quant puts it."""
    r = v
    if ti.static(quantized):
        if _is_nan(v):
            r = 0.0
    return r


@ti.data_oriented
class MathUnaryStep(ElementwiseStep):
    """A math op, element by element (the kit's template)."""

    def __init__(self, code, x, out):
        super().__init__(x, out)
        self.code = code

    @ti.func
    def formula(self, v):
        return _finish(_unary_formula(v, self.code, self.out.quantized), self.out.quantized)


@ti.data_oriented
class MathBinaryStep(BroadcastBinaryStep):
    """POW, FLOOR_DIV, FLOOR_MOD, ATAN2, both inputs broadcast (the kit's template)."""

    def __init__(self, code, a, b, out):
        super().__init__(a, b, out)
        self.code = code

    @ti.func
    def formula(self, x, y):
        return _finish(_binary_formula(x, y, self.code), self.out.quantized)


@ti.data_oriented
class AddNStep:
    """One thread per element: the inputs summed in order (as LiteRT's loop)."""

    def __init__(self, inputs, out):
        self.inputs, self.out = tuple(inputs), out
        self.n = out.size

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        for i in range(self.n):
            acc = self.inputs[0].load(arena, weights, io, i)
            for k in ti.static(range(1, len(self.inputs))):
                acc += self.inputs[k].load(arena, weights, io, i)
            self.out.store(arena, io, i, acc)

    @ti.func
    def fused_store(self, arena: ti.template(), weights: ti.template(), io: ti.template(), flat,
                    value, position: ti.template()):
        """Element `flat` with input `position` handed over, summed in the same order."""
        acc = value
        if ti.static(position != 0):
            acc = self.inputs[0].load(arena, weights, io, flat)
        for k in ti.static(range(1, len(self.inputs))):
            if ti.static(k == position):
                acc += value
            else:
                acc += self.inputs[k].load(arena, weights, io, flat)
        self.out.store(arena, io, flat, acc)


def _unary_taichi(node, io):
    code = _UNARY_CODES[node.op]
    if node.op == "GELU" and node.options.approximate:
        code = _GELU_TANH
    return MathUnaryStep(code, io.inputs[0], io.outputs[0])


def _binary_taichi(node, io):
    return MathBinaryStep(_BINARY_CODES[node.op], io.inputs[0], io.inputs[1], io.outputs[0])


def _add_n_taichi(node, io):
    return AddNStep(io.inputs, io.outputs[0])


# -- element-wise ------------------------------------------------------------------------------
def _unary(name, fn, ints=(), parse=None, options_class=None):
    def infer(node):
        _check_dtypes(node, ints)
        return [tuple(node.inputs[0].shape)]

    def reference(node, inputs):
        x = np.asarray(inputs[0])
        if not _is_int(x):
            x = x.astype(np.float32, copy=False)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
            return [np.asarray(fn(node, x)).astype(x.dtype, copy=False)]

    return register_op(OpDef(name=name, infer=infer, reference=reference,
                             parse=parse if parse is not None else (lambda _o: None),
                             options_class=options_class, taichi=_unary_taichi,
                             min_inputs=1, max_inputs=1, fusion=ELEMENTWISE_UNARY))


def _log(node, x):
    out = np.log(x)
    if node.outputs[0].is_quantized:
        out = np.where(x <= 0, np.float32(-np.inf), out)   # LiteRT's table: the lowest value
    return out


def _round(_node, x):
    return np.rint(x)                   # half to even, as TFLite's RoundToNearest


def _sign(_node, x):
    return np.sign(x)                   # NaN stays NaN (LiteRT 2.3 too)


def _elu(_node, x):
    return np.where(x < 0, np.expm1(np.minimum(x, 0)), x)


def _erfc_np(z):
    """Numerical Recipes' erfc (fractional error < 1.2e-7), vectorised, float64."""
    a = np.abs(z)
    t = 1.0 / (1.0 + 0.5 * a)
    p = np.zeros_like(t)
    for c in _ERFC[:0:-1]:
        p = c + t * p
    r = t * np.exp(-a * a + _ERFC[0] + t * p)
    return np.where(z >= 0, r, 2.0 - r)


def _gelu(node, x):
    if node.options.approximate:
        k = np.float32(_SQRT_2_OVER_PI)
        u = k * (x + np.float32(0.044715) * x * x * x)
        return np.float32(0.5) * x * (np.float32(1) + np.tanh(u))
    x64 = x.astype(np.float64)
    return 0.5 * x64 * _erfc_np(x64 * -_SQRT1_2)


@dataclass(frozen=True)
class GeluOptions:
    approximate: bool = False


def _parse_gelu(opts) -> GeluOptions:
    return GeluOptions(bool(opts.Approximate()))


ABS = _unary("ABS", lambda _n, x: np.abs(x), ints=(np.int32, np.int16))
NEG = _unary("NEG", lambda _n, x: np.negative(x), ints=(np.int32, np.int64, np.int8, np.int16))
SQRT = _unary("SQRT", lambda _n, x: np.sqrt(x))
RSQRT = _unary("RSQRT", lambda _n, x: np.float32(1) / np.sqrt(x))
SQUARE = _unary("SQUARE", lambda _n, x: x * x)
LOG = _unary("LOG", _log)
SIN = _unary("SIN", lambda _n, x: np.sin(x))
COS = _unary("COS", lambda _n, x: np.cos(x))
FLOOR = _unary("FLOOR", lambda _n, x: np.floor(x))
CEIL = _unary("CEIL", lambda _n, x: np.ceil(x))
ROUND = _unary("ROUND", _round)
SIGN = _unary("SIGN", _sign, ints=(np.int32,))
ELU = _unary("ELU", _elu)
GELU = _unary("GELU", _gelu, parse=_parse_gelu, options_class="GeluOptions")


# -- broadcasting binary ops -------------------------------------------------------------------
def _pow_np(a, b):
    if not _is_int(a):
        return np.power(a, b)
    # std::pow in double, converted to the integer type (out of range: INT_MIN, as on x86)
    r = np.trunc(np.power(a.astype(np.float64), b.astype(np.float64)))
    info = np.iinfo(a.dtype)
    bad = ~np.isfinite(r) | (r < info.min) | (r > info.max)
    return np.where(bad, info.min, r).astype(a.dtype)


def _floor_div_np(a, b):
    if _is_int(a):
        safe = np.where(b == 0, 1, b).astype(b.dtype)
        return np.where(b == 0, 0, np.floor_divide(a, safe)).astype(np.result_type(a, b))
    # floor(double(a) / double(b)), cast back (float32 division could round up to an integer)
    return np.floor(a.astype(np.float64) / b.astype(np.float64)).astype(np.float32)


def _floor_mod_np(a, b):
    if _is_int(a):
        safe = np.where(b == 0, 1, b).astype(b.dtype)
        return np.where(b == 0, 0, np.mod(a, safe)).astype(np.result_type(a, b))
    m = np.fmod(a, b)                                       # exact
    return np.where((m != 0) & ((b < 0) != (m < 0)), m + b, m)


def _binary(name, fn, ints):
    def infer(node):
        _check_dtypes(node, ints)
        return [broadcast_shapes(node, node.inputs[0].shape, node.inputs[1].shape)]

    def reference(node, inputs):
        a, b = (np.asarray(v) for v in inputs)
        if not _is_int(a) and a.dtype != np.float64:     # float64: an op that takes it (ATAN2)
            a, b = a.astype(np.float32, copy=False), b.astype(np.float32, copy=False)
        with np.errstate(divide="ignore", invalid="ignore", over="ignore", under="ignore"):
            out = fn(a, b)
        return [np.broadcast_to(out, node.outputs[0].shape)]

    return register_binary(name, infer, reference, _binary_taichi)


POW = _binary("POW", _pow_np, ints=(np.int32,))
FLOOR_DIV = _binary("FLOOR_DIV", _floor_div_np, ints=(np.int32, np.int8, np.int16))
FLOOR_MOD = _binary("FLOOR_MOD", _floor_mod_np, ints=(np.int32, np.int64, np.int8, np.int16))
ATAN2 = _binary("ATAN2", np.arctan2, ints=(np.float64,))   # ints: dtypes beyond float32


# -- RIGHT_SHIFT (CPU: integers) -----------------------------------------------------------------
_SHIFT_DTYPES = tuple(np.dtype(t) for t in (np.int8, np.uint8, np.int16, np.uint16, np.int32,
                                             np.uint32))


def _infer_right_shift(node):
    specs = list(node.inputs) + [node.outputs[0]]
    for spec in specs:
        if spec.dtype is None or np.dtype(spec.dtype) not in _SHIFT_DTYPES or spec.is_quantized:
            raise node.fail(f"tensor '{spec.name}' has dtype {_dtype_name(spec)}; RIGHT_SHIFT "
                            "shifts int8/uint8/int16/uint16/int32/uint32 (not quantized)")
    if len({np.dtype(spec.dtype) for spec in specs}) > 1:
        raise node.fail("inputs and output must have the same dtype, got "
                        + ", ".join(f"'{s.name}' {_dtype_name(s)}" for s in specs))
    return [broadcast_shapes(node, node.inputs[0].shape, node.inputs[1].shape)]


def _right_shift(node, inputs):
    x, n = (np.asarray(v) for v in inputs)
    bits = 8 * x.dtype.itemsize
    # LiteRT's clamp of the count to [0, bits - 1] (C++ leaves other counts undefined)
    count = np.clip(n.astype(np.int64), 0, bits - 1).astype(x.dtype)
    return [np.broadcast_to(np.right_shift(x, count), node.outputs[0].shape).copy()]


RIGHT_SHIFT = register_op(OpDef(name="RIGHT_SHIFT", infer=_infer_right_shift,
                                reference=_right_shift, min_inputs=2, max_inputs=2))


# -- ADD_N -------------------------------------------------------------------------------------
def _infer_add_n(node):
    _check_dtypes(node, (np.int32,))
    shape = tuple(node.inputs[0].shape)
    for spec in node.inputs[1:]:
        if tuple(spec.shape) != shape:
            raise node.fail(f"input '{spec.name}' has shape {list(spec.shape)}, the first input "
                            f"{list(shape)}: ADD_N adds tensors of one shape")
    return [shape]


def _add_n_reference(node, inputs):
    out = np.array(inputs[0], copy=True)
    if not _is_int(out):
        out = out.astype(np.float32, copy=False)
    with np.errstate(over="ignore", invalid="ignore"):
        for x in inputs[1:]:                # in order, in the tensor's type, as LiteRT
            out = out + np.asarray(x, out.dtype)
    return [out]


ADD_N = register_op(OpDef(name="ADD_N", infer=_infer_add_n, reference=_add_n_reference,
                          taichi=_add_n_taichi, min_inputs=2, max_inputs=None,
                          fusion=Fusion(stores_once=True, epilogue_inputs=unbroadcast_inputs)))
