"""Cases for arith ops shared by the tests (moved from test_ops_arith.py): hypothesis
strategies, one-op model builders and their helpers, used by test_ops_arith.py and the
delegate's tests."""
import numpy as np


UNARY = ["ABS", "NEG", "SQRT", "RSQRT", "SQUARE", "LOG", "SIN", "COS", "FLOOR", "CEIL", "ROUND",
         "SIGN", "ELU", "GELU"]


BINARY = ["POW", "FLOOR_DIV", "FLOOR_MOD"]


POSITIVE = {"SQRT", "RSQRT", "LOG"}                 # real-valued on x > 0 only


def unary_options(op, approximate):
    return {"approximate": approximate} if op == "GELU" else {}


def unary_data(op, rng, shape, magnitude):
    """Float inputs for `op`: positive where it is real-valued only there; half of the values
    of FLOOR/CEIL/ROUND on integers and halves (ROUND's ties). GELU's first value is positive:
    its tanh form at x < -3 is 0.5 x (1 + tanh(u)) with tanh(u) near -1, which no float32
    evaluation gets to 1e-5 of itself (LiteRT's Eigen tanh and numpy's differ by an ulp
    there, 3% of an output of 0.003), so a value of the input's own size sets the scale.
    SIN/COS reach |x| of 900 (positional encodings; GPUs' native sin needs a reduction there)."""
    if op in ("SIN", "COS"):
        magnitude *= 30
    if op in POSITIVE:
        return rng.uniform(magnitude * 1e-3, magnitude, shape).astype(np.float32)
    x = rng.uniform(-magnitude, magnitude, shape)
    if op in ("FLOOR", "CEIL", "ROUND"):
        x = np.where(rng.random(shape) < 0.5, np.round(x * 2) / 2, x)
    if op == "GELU":
        x = np.array(x)
        x.flat[0] = abs(x.flat[0]) + magnitude / 4
    return x.astype(np.float32)


def binary_data(op, rng, a_shape, b_shape, decimals=False):
    """Float (a, b): POW with positive bases, or any base and integer exponents; FLOOR_DIV/MOD
    with divisors away from 0, or (decimals) tenths whose float32 quotients sit next to
    integers (1 // 0.1 is 9: the quotient is computed in double)."""
    if op == "POW":
        if decimals:
            a = rng.uniform(-4, 4, a_shape)
            b = rng.integers(-3, 5, b_shape)
        else:
            a = rng.uniform(0.05, 4, a_shape)
            b = rng.uniform(-3, 3, b_shape)
    elif decimals:
        a = rng.integers(-60, 61, a_shape) / 10
        b = rng.choice([0.1, -0.1, 0.2, 0.3, -0.3, 0.7, 1.1, -2.5], b_shape)
    else:
        a = rng.uniform(-10, 10, a_shape)
        b = rng.uniform(0.2, 4, b_shape) * rng.choice([-1, 1], b_shape)
    return a.astype(np.float32), np.asarray(b, np.float32).reshape(b_shape)


# -- ATAN2 -------------------------------------------------------------------------------------
ATAN2_SPECIALS = np.array([0.0, -0.0, 1.0, -1.0, 2.5, -1e-3, np.inf, -np.inf, np.nan, 1e-30],
                          np.float32)


def atan2_data(rng, shape, magnitude, dtype=np.float32):
    """Values up to `magnitude`, a fifth of them +-0 (the axes' special cases)."""
    v = rng.uniform(-magnitude, magnitude, shape)
    v = np.where(rng.random(shape) < 0.2, np.where(rng.random(shape) < 0.5, 0.0, -0.0), v)
    return np.asarray(v, dtype).reshape(shape)
