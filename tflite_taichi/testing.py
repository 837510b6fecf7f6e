"""Test helpers: one-op models, LiteRT as the oracle, comparisons with stated tolerances,
hypothesis strategies. Used by the project's tests and by anyone adding an op.

    model = one_op_model("ADD", [Input((2, 3)), Const(np.ones(3, np.float32))],
                         [Output((2, 3))], fused_activation_function="RELU")
    check_against_litert(model, seed=0)      # ours (reference) vs LiteRT's reference kernels

LiteRT (`ai-edge-litert`) is imported only when a check needs it.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence

import numpy as np

from tflite_taichi import switches
from tflite_taichi.builder import ModelBuilder, as_quantization
from tflite_taichi.quant import quantize

# Hypothesis examples. Every count a test states is its count under CI's profile ("ci",
# max_examples CI_EXAMPLES = 50: tests/conftest.py); examples(n) scales it by the loaded
# profile's max_examples / CI_EXAMPLES, so that "thorough" (500) runs ten times as many in every
# test and "explore" as many as it is given (TFLITE_TAICHI_EXPLORE_EXAMPLES). Tests without a
# count run the profile's max_examples.
CI_EXAMPLES = 50


def examples(ci_count: int) -> int:
    """`ci_count` examples under the "ci" profile, scaled by the loaded profile (at least 1)."""
    try:
        from hypothesis import settings
        scale = settings.default.max_examples / CI_EXAMPLES
    except ImportError:
        scale = 1.0
    return max(1, round(ci_count * scale))


# Per Taichi-vs-reference property test: each example compiles a kernel on every backend under
# test, so CI runs 20 (fewer than the LiteRT tests' 50); the profile scales it (200 under
# "thorough"); TFLITE_TAICHI_EXAMPLES, if set, fixes it. Read when this module is imported
# (tests import it after tests/conftest.py has loaded the profile).
TAICHI_EXAMPLES = switches.value("TFLITE_TAICHI_EXAMPLES") or examples(20)

# Tolerances, stated once. Float: one op vs LiteRT's reference kernels may differ only by
# float32 rounding and summation order, so 1e-5 of the output's largest magnitude. Quantized:
# the float view rounds once where LiteRT's integer kernels round in fixed point, so an output
# may land one quantization step away.
FLOAT_RTOL = 1e-5
QUANT_UNITS = 1


@dataclass(frozen=True)
class Input:
    """A model input (set at invoke). `quantization`: (scale, zero_point) or (scales, zps, dim)."""
    shape: tuple
    dtype: object = np.float32
    quantization: object = None
    name: str = ""


@dataclass(frozen=True)
class Const:
    """A constant input: `value` as stored (int8 data for a quantized constant)."""
    value: np.ndarray
    quantization: object = None
    name: str = ""


@dataclass(frozen=True)
class Output:
    shape: tuple
    dtype: object = np.float32
    quantization: object = None
    name: str = ""


def one_op_model(op: str, inputs: Sequence, outputs: Sequence, *, version: int = 1,
                 custom_options: Optional[bytes] = None, **options) -> bytes:
    """A model with one op. `inputs` holds Input, Const, or None (an omitted optional input)."""
    b = ModelBuilder()
    g = b.subgraph()
    in_idx = []
    for i, spec in enumerate(inputs):
        if spec is None:
            in_idx.append(-1)
        elif isinstance(spec, Const):
            in_idx.append(g.const(spec.name or f"const_{i}", spec.value, quantization=spec.quantization))
        else:
            in_idx.append(g.input(spec.name or f"input_{i}", spec.shape, spec.dtype, spec.quantization))
    out_idx = [g.tensor(spec.name or f"output_{i}", spec.shape, spec.dtype, spec.quantization)
               for i, spec in enumerate(outputs)]
    g.op(op, in_idx, out_idx, version=version, custom_options=custom_options, **options)
    g.output(*out_idx)
    return b.finish()


def random_input(detail: dict, rng: np.random.Generator, low=-3.0, high=3.0) -> np.ndarray:
    """Random data for an input detail dict: uniform reals, quantized when the input is."""
    shape, dtype = tuple(detail["shape"]), np.dtype(detail["dtype"])
    if dtype == np.bool_:
        return rng.integers(0, 2, shape).astype(np.bool_)
    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        if detail["quantization_parameters"]["scales"].size:
            return rng.integers(info.min, int(info.max) + 1, shape).astype(dtype)
        return rng.integers(max(info.min, -100), min(info.max, 100) + 1, shape).astype(dtype)
    return rng.uniform(low, high, shape).astype(dtype)


PLAIN_INTEGERS = (0, 100)      # made-up plain integer inputs no op declares a range for


def model_random_inputs(it, rng: np.random.Generator, low=0.0, high=1.0) -> list:
    """Random inputs for an allocated Interpreter, in get_input_details() order, that the model
    accepts: floats uniform in [low, high), quantized integers over their whole range, plain
    integers within what every op reading them accepts (OpDef.input_ranges: an embedding's ids
    within its table, GATHER's indices within the axis, followed through reshapes), other plain
    integers in PLAIN_INTEGERS (non-negative: counts, lengths and ids more often than not)."""
    prepared = it._main.prepared
    ranges = _integer_input_ranges(prepared) if prepared is not None else {}
    inputs = []
    for d in it.get_input_details():
        dtype, shape = np.dtype(d["dtype"]), tuple(d["shape"])
        if (np.issubdtype(dtype, np.integer) and dtype != np.bool_
                and not d["quantization_parameters"]["scales"].size):
            lo, hi = ranges.get(d["index"], PLAIN_INTEGERS)
            info = np.iinfo(dtype)
            lo, hi = max(lo, int(info.min)), min(hi, int(info.max) + 1)
            inputs.append(rng.integers(lo, max(hi, lo + 1), shape).astype(dtype))
        else:
            inputs.append(random_input(d, rng, low, high))
    return inputs


def _integer_input_ranges(prepared) -> dict:
    """{graph input: (low, high)}: the intersection of the ranges its readers declare."""
    readers = {}
    for step in prepared.steps:
        for position, t in enumerate(step.op.inputs):
            if t != -1:
                readers.setdefault(t, []).append((step, position))
    found = {}

    def visit(t, source, seen):
        for step, position in readers.get(t, ()):
            if step.opdef.fusion.alias_input == position and id(step) not in seen:     # a reshape
                visit(step.op.outputs[0], source, seen | {id(step)})
            elif step.opdef.input_ranges is not None:
                try:
                    bounds = step.opdef.input_ranges(step.node).get(position)
                except Exception:       # a malformed op: its own error comes at invoke
                    bounds = None
                if bounds is not None:
                    lo, hi = found.get(source, bounds)
                    found[source] = (max(lo, int(bounds[0])), min(hi, int(bounds[1])))
    for t in prepared.subgraph.inputs:
        visit(t, t, frozenset())
    return found


def run_litert(model: bytes, inputs: Sequence[np.ndarray], kernels: str = "reference") -> list:
    """Outputs of LiteRT on `inputs`. kernels: 'reference' (BUILTIN_REF, the plain kernels the
    semantics are defined by), 'builtin' (optimized, no XNNPACK) or 'xnnpack' (the default)."""
    from ai_edge_litert.interpreter import Interpreter as LiteRT, OpResolverType
    resolver = {"reference": OpResolverType.BUILTIN_REF,
                "builtin": OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES,
                "xnnpack": OpResolverType.AUTO}[kernels]
    it = LiteRT(model_content=model, experimental_op_resolver_type=resolver)
    return _run(it, inputs)


def run_ours(model: bytes, inputs: Sequence[np.ndarray], backend: str = "reference") -> list:
    from tflite_taichi.interpreter import Interpreter
    return _run(Interpreter(model_content=model, backend=backend), inputs)


def _run(it, inputs) -> list:
    details = it.get_input_details()
    for d, x in zip(details, inputs):
        if tuple(d["shape"]) != np.shape(x):
            it.resize_tensor_input(d["index"], np.shape(x))
    if type(it).__module__.startswith("ai_edge_litert"):   # its XNNPACK note: to our log
        from tflite_taichi.litert_cpu import xnnpack_note_to_the_log
        with xnnpack_note_to_the_log():
            it.allocate_tensors()
    else:
        it.allocate_tensors()
    for d, x in zip(it.get_input_details(), inputs):
        it.set_tensor(d["index"], x)
    it.invoke()
    return [it.get_tensor(d["index"]) for d in it.get_output_details()]


def run_sequence(it, sequence: Sequence[Sequence[np.ndarray]]) -> list:
    """Invoke `it` (ours or LiteRT's) once per entry of `sequence` (a list of inputs), keeping
    its state between invokes; returns each invoke's outputs. For stateful models."""
    return list(run_sequence_steps(it, sequence))


def synthetic_portrait(height: int, width: int, rng: Optional[np.random.Generator] = None) -> np.ndarray:
    """A [1, H, W, 3] float32 picture in 0..1 of a head and shoulders on a shaded background
    (plus a little seeded noise when `rng` is given): an input on which a segmentation model's
    mask spans its range (selfie_segmentation: up to ~0.7), where uniform noise leaves it in the
    sigmoid's tail (~1e-9), so that relative comparisons measure the model, not that tail."""
    yy, xx = np.mgrid[0:height, 0:width] / np.array([height, width])[:, None, None]
    img = np.zeros((height, width, 3)) + np.array([0.2, 0.5, 0.3]) + 0.2 * xx[..., None]
    head = ((xx - 0.5) / 0.12) ** 2 + ((yy - 0.3) / 0.16) ** 2 < 1
    shoulders = (np.abs(xx - 0.5) < 0.25) & (yy > 0.45)
    eyes = ((((xx - 0.45) / 0.02) ** 2 + ((yy - 0.28) / 0.015) ** 2 < 1)
            | (((xx - 0.55) / 0.02) ** 2 + ((yy - 0.28) / 0.015) ** 2 < 1))
    img[head] = [0.85, 0.65, 0.5]
    img[shoulders] = [0.15, 0.15, 0.5]
    img[eyes] = [0.05, 0.05, 0.05]
    if rng is not None:
        img += rng.normal(0, 0.02, img.shape)
    return np.clip(img, 0, 1)[None].astype(np.float32)


def natural_image(height: int, width: int, rng: np.random.Generator, channels: int = 3) -> np.ndarray:
    """A [1, H, W, C] float32 picture in 0..1 with a natural image's statistics: an amplitude
    spectrum falling as 1/f (Field 1987: photographs of scenes have a power spectrum near
    1/f**2), random phases, the channels sharing most of their structure as colour channels
    do. Unlike uniform noise it has large smooth regions and few edges, so a model's outputs
    land where real pictures put them rather than in an activation's tail."""
    fy = np.fft.fftfreq(height)[:, None]
    fx = np.fft.rfftfreq(width)[None, :]
    amplitude = 1.0 / np.maximum(np.hypot(fy, fx), 1.0 / max(height, width))
    amplitude[0, 0] = 0.0

    def field():
        phase = rng.uniform(0, 2 * np.pi, amplitude.shape)
        return np.fft.irfft2(amplitude * np.exp(1j * phase), s=(height, width))

    shared = field()
    img = np.stack([0.8 * shared + 0.2 * field() for _ in range(channels)], axis=-1)
    img = (img - img.min()) / max(float(img.max() - img.min()), 1e-12)
    return img[None].astype(np.float32)


def model_inputs(model: bytes, seed: int = 0, low=-3.0, high=3.0) -> list:
    from tflite_taichi.interpreter import Interpreter
    rng = np.random.default_rng(seed)
    return [random_input(d, rng, low, high) for d in Interpreter(model_content=model, backend="reference").get_input_details()]


def assert_float_close(actual, expected, rtol: float = FLOAT_RTOL, what: str = "output",
                       floor: float = 0.0):
    """|actual - expected| <= rtol * max(max|expected|, floor) everywhere; NaN must match NaN.
    `floor`: the magnitude of the values the output was computed from, where a result can be
    far smaller than them (cancellation: float32 rounds relative to the operands, not to the
    result)."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    if actual.dtype == np.bool_ or np.issubdtype(actual.dtype, np.integer):
        np.testing.assert_array_equal(actual, expected, err_msg=what)
        return
    if np.iscomplexobj(actual):     # real and imaginary parts, as pairs of floats
        actual = np.stack([actual.real, actual.imag], axis=-1)
        expected = np.stack([expected.real, expected.imag], axis=-1)
    a, e = actual.astype(np.float64), expected.astype(np.float64)
    nan_a, nan_e = np.isnan(a), np.isnan(e)
    assert np.array_equal(nan_a, nan_e), f"{what}: NaN positions differ"
    inf_e = np.isinf(e)
    assert np.array_equal(a[inf_e], e[inf_e]), f"{what}: infinities differ"
    finite = ~(nan_e | inf_e)
    if not finite.any():
        return
    scale = max(float(np.max(np.abs(e[finite]))), floor, np.finfo(np.float32).tiny)
    err = float(np.max(np.abs(a[finite] - e[finite])))
    assert err <= rtol * scale, (f"{what}: max |diff| {err:.3g} > {rtol:g} x max|expected| "
                                 f"({scale:.3g})")


def assert_quantized_close(actual, expected, units: int = QUANT_UNITS, what: str = "output"):
    """Integer outputs within `units` quantization steps everywhere."""
    actual, expected = np.asarray(actual), np.asarray(expected)
    assert actual.shape == expected.shape, f"{what}: shape {actual.shape} != {expected.shape}"
    assert actual.dtype == expected.dtype, f"{what}: dtype {actual.dtype} != {expected.dtype}"
    diff = np.abs(actual.astype(np.int64) - expected.astype(np.int64))
    worst = int(diff.max()) if diff.size else 0
    assert worst <= units, (f"{what}: {int((diff > units).sum())} of {diff.size} values differ "
                            f"by more than {units} unit(s) (worst {worst})")


def check_against_litert(model: bytes, inputs: Optional[Sequence[np.ndarray]] = None, *,
                         seed: int = 0, rtol: float = FLOAT_RTOL, units: int = QUANT_UNITS,
                         kernels: str = "reference", backend: str = "reference",
                         floor: float = 0.0) -> list:
    """Run `model` on ours and on LiteRT; every output must agree (floats within `rtol` of the
    largest magnitude, or of `floor` if larger: see assert_float_close; quantized integers
    within `units`). Returns our outputs."""
    if inputs is None:
        inputs = model_inputs(model, seed)
    expected = run_litert(model, inputs, kernels)
    actual = run_ours(model, inputs, backend)
    from tflite_taichi.interpreter import Interpreter
    details = Interpreter(model_content=model, backend="reference").get_output_details()
    for i, (a, e, d) in enumerate(zip(actual, expected, details)):
        quantized = d["quantization_parameters"]["scales"].size > 0 and np.dtype(d["dtype"]).kind in "iu"
        if quantized:
            assert_quantized_close(a, e, units, what=f"output {i} ('{d['name']}')")
        else:
            assert_float_close(a, e, rtol, what=f"output {i} ('{d['name']}')", floor=floor)
    return actual


def quantize_array(x: np.ndarray, quantization, dtype=np.int8) -> np.ndarray:
    """Real values -> their integer form under `quantization` (for quantized Const data)."""
    return quantize(np.asarray(x, np.float32), as_quantization(quantization), dtype)


# -- hypothesis strategies (imported lazily so the package does not need hypothesis) ----------
def strategies():
    """A namespace of hypothesis strategies for op tests (requires hypothesis)."""
    from hypothesis import strategies as st

    class S:
        @staticmethod
        def shapes(min_rank=1, max_rank=4, min_side=1, max_side=6):
            return st.lists(st.integers(min_side, max_side), min_size=min_rank,
                            max_size=max_rank).map(tuple)

        @staticmethod
        def activations():
            return st.sampled_from(["NONE", "RELU", "RELU_N1_TO_1", "RELU6"])

        @staticmethod
        def scales(lo=1e-3, hi=0.2):
            return st.floats(np.log(lo), np.log(hi)).map(lambda v: float(np.float32(np.exp(v))))

        @staticmethod
        def quant_params(dtype=np.int8, symmetric=False, scale_range=(1e-3, 0.2)):
            """(scale, zero_point) for an int8/uint8/int16 tensor (int16: zero point 0)."""
            lo, hi = (0, 0) if symmetric or np.dtype(dtype) == np.int16 else (
                (-128, 127) if np.dtype(dtype) == np.int8 else (0, 255))
            return st.tuples(S.scales(*scale_range), st.integers(lo, hi))

        @staticmethod
        def seeds():
            return st.integers(0, 2**31 - 1)

    return S


# -- Taichi backends in worker processes -------------------------------------------------------
# Taichi runs one arch per process, so each backend under test lives in its own worker process;
# a test sends a model and inputs to every worker at once (they run in parallel) and compares
# each answer with the reference path in the test's own process. A crash in a driver kills a
# worker, not the test run.

def _worker_main(conn, backend: str):
    import traceback
    try:
        from tflite_taichi.interpreter import Interpreter
        from tflite_taichi.testing import _run as run
        import warnings
        probe = one_op_model("RELU", [Input((2,))], [Output((2,))])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            actual = Interpreter(model_content=probe, backend=backend).backend
        conn.send(("ready", actual))
    except BaseException as e:  # report, never hang the parent
        conn.send(("error", f"{type(e).__name__}: {e}"))
        return
    while True:
        try:
            request = conn.recv()
        except EOFError:
            return
        if request is None:
            return
        model, inputs, precision, kwargs = request
        try:
            import importlib
            import sys
            sys.path.extend(p for p in kwargs.pop("sys_path", ()) if p not in sys.path)
            for module in kwargs.pop("plugins", ()):   # users' op modules (register_op at import)
                importlib.import_module(module)
            from tflite_taichi.partition import notes_into
            # the delegate's warnings and its logged INFO notes, in the order they came
            with warnings.catch_warnings(record=True) as caught, notes_into(caught):
                warnings.simplefilter("always")
                sequence = kwargs.pop("sequence", None)
                it = Interpreter(model_content=model, backend=kwargs.pop("backend", backend),
                                 precision=precision, **kwargs)
                if sequence is None:
                    outputs = run(it, inputs)
                else:       # one invoke per entry, state kept; tensors of every step
                    outputs, steps = [], []
                    for step_outputs in run_sequence_steps(it, sequence):
                        outputs.append(step_outputs)
                        if kwargs.get("experimental_preserve_all_tensors"):
                            steps.append(_all_op_outputs(it))
            summary = it.summary()
            summary["warnings"] = [w if isinstance(w, str) else str(w.message) for w in caught]
            if kwargs.get("experimental_preserve_all_tensors"):      # every op's output
                summary["tensors"] = (_all_op_outputs(it) if sequence is None else steps)
            if kwargs.get("profile"):
                it.invoke()
                summary["profile"] = it.profile()
            conn.send(("ok", outputs, summary))
        except BaseException as e:
            conn.send(("error", f"{type(e).__name__}: {e}\n{traceback.format_exc()}"))


def _all_op_outputs(it) -> dict:
    tensors = it.model.main.tensors
    return {t: it.get_tensor(t) for op in it.model.main.operators
            for t in op.outputs if t in it._main.values and tensors[t].dtype is not None}


def run_sequence_steps(it, sequence):
    """run_sequence, one invoke at a time (a generator), so callers can read state between."""
    it.allocate_tensors()
    for inputs in sequence:
        for d, x in zip(it.get_input_details(), inputs):
            it.set_tensor(d["index"], x)
        it.invoke()
        yield [it.get_tensor(d["index"]) for d in it.get_output_details()]


class BackendWorker:
    """A subprocess running the delegate on one Taichi backend."""

    def __init__(self, backend: str, timeout: float = 300.0):
        self.backend = backend
        self.timeout = timeout
        self._start()

    def _start(self):
        from tflite_taichi.runtime.children import ConnectedChild
        backend = self.backend
        self._proc = ConnectedChild(_worker_main, (backend,))     # no import from the cwd
        self._conn = self._proc.conn
        reply = self._receive()
        if reply[0] != "ready":
            self.close()
            raise RuntimeError(f"backend {backend} failed to start: {reply[1]}")
        if reply[1] != backend:
            self.close()
            raise RuntimeError(f"asked for backend {backend}, the worker runs {reply[1]}")

    def _receive(self):
        if not self._conn.poll(self.timeout):
            self.close()
            raise RuntimeError(f"backend {self.backend}: no answer within {self.timeout:.0f} s")
        try:
            return self._conn.recv()
        except EOFError:
            raise RuntimeError(f"backend {self.backend}: the worker died "
                               f"(exit code {self._proc.exitcode})") from None

    def submit(self, model: bytes, inputs, precision: str = "fp32", **kwargs):
        if not self._proc.is_alive():      # a driver crash in an earlier case: start afresh
            self._start()
        if kwargs.get("plugins"):          # the worker imports them from the caller's path
            import sys
            kwargs["sys_path"] = list(sys.path)
        self._conn.send((model, list(inputs), precision, kwargs))

    def result(self):
        """(outputs, summary) of the last submit; RuntimeError with the worker's traceback."""
        reply = self._receive()
        if reply[0] != "ok":
            raise RuntimeError(f"backend {self.backend}: {reply[1]}")
        return reply[1], reply[2]

    def run(self, model: bytes, inputs, precision: str = "fp32", **kwargs):
        self.submit(model, inputs, precision, **kwargs)
        return self.result()

    def close(self):
        try:
            self._conn.send(None)
        except (OSError, ValueError):
            pass
        self._proc.join(5)
        if self._proc.is_alive():
            self._proc.kill()


# precision='fp16' (planner.py): the arena (intermediates) and the weights buffer hold float16,
# the io buffer (a partition's inputs and outputs) float32, and the math runs in float32. A
# value stored in float16 (round to nearest, 11 significant bits) is off by at most half an
# ulp: 2^-11 of its magnitude, for normal float16 values (|v| >= 2^-14). A float32 op adds a
# few 2^-24 (a 3x3x4 conv's sum of positive terms: at most 36 x 2^-24 < 2^-18, and the
# reference's own float32 math as much again): FP16_OP_SLACK per op covers both.
FP16_HALF_ULP = 2.0 ** -11
FP16_OP_SLACK = 2.0 ** -17

# The delegate vs the reference: the same float32 math in another summation order, so the
# tolerance of one op against LiteRT. fp16: a one-op model's input and output stay float32 (io),
# its weights pass through float16 (one rounding, FP16_HALF_ULP of each weight); the small
# multi-op models of tests/test_taichi_*.py store a few intermediates in float16 on the way to an
# output: 4 roundings' worth (2^-9 = 1.95e-3) of the output's largest magnitude. Seen: at most
# 0.64 of a half-ulp over 78 comparisons (HYPOTHESIS_PROFILE=explore, cpu and vulkan; an earlier
# run: 5.0e-4 = 1.02 half-ulps over 84). Chains stored in float16 derive theirs: fp16_chain_rtol;
# whole models on realistic inputs keep their own criterion (test_taichi_models.py).
TAICHI_RTOL = {"fp32": FLOAT_RTOL, "fp16": 4 * FP16_HALF_ULP}


def fp16_chain_rtol(stored_tensors: int, rounded_weights: int = 0, ops: int = 1) -> float:
    """Relative error bound of a chain whose values stay positive and whose ops add relative
    errors at most (conv/pool/ADD of positive terms: the largest operand error; MUL: their
    sum): each tensor stored in float16 on the way (or weight rounded to float16, in an op
    the chain passes) adds FP16_HALF_ULP, each float32 op FP16_OP_SLACK."""
    return (stored_tensors + rounded_weights) * FP16_HALF_ULP + ops * FP16_OP_SLACK


def check_delegate(model: bytes, workers, inputs: Optional[Sequence[np.ndarray]] = None, *,
                   seed: int = 0, precision: str = "fp32", rtol: Optional[float] = None,
                   expect_all_delegated: bool = True, floor: float = 0.0, **kwargs) -> dict:
    """Run `model` on every worker's backend and on the reference path; outputs must agree
    (float view values within `rtol` of the largest magnitude, or of `floor` if larger: see
    assert_float_close) and, unless told otherwise, every op that is not folded at prepare must
    run inside a delegated partition."""
    workers = list(workers)
    if not workers:
        raise ValueError("check_delegate: no backend worker given, so nothing would be checked "
                         "(an empty TFLITE_TAICHI_TEST_BACKENDS?)")
    if inputs is None:
        inputs = model_inputs(model, seed)
    from tflite_taichi.interpreter import Interpreter
    ref_it = Interpreter(model_content=model, backend="reference")
    expected = _run(ref_it, inputs)
    details = ref_it.get_output_details()
    rtol = TAICHI_RTOL[precision] if rtol is None else rtol
    for w in workers:
        w.submit(model, inputs, precision, **kwargs)
    answers = {}
    for w in workers:       # collect every answer before asserting: a pipe left unread would
        try:                # hand its stale answer to the next test
            answers[w.backend] = w.result()
        except RuntimeError as e:
            answers[w.backend] = e
    summaries = {}
    for w in workers:
        if isinstance(answers[w.backend], Exception):
            raise answers[w.backend]
        outputs, summary = answers[w.backend]
        summaries[w.backend] = summary
        assert summary["backend"] == w.backend, f"ran on {summary['backend']}, not {w.backend}"
        if expect_all_delegated:
            assert not summary["fallback"], f"{w.backend}: ops left on the CPU: {summary['fallback']}"
        for i, (a, e, d) in enumerate(zip(outputs, expected, details)):
            what = f"{w.backend}/{precision} output {i} ('{d['name']}')"
            q = d["quantization_parameters"]
            if q["scales"].size and np.dtype(d["dtype"]).kind in "iu":
                # the same float math in another order: a value on a rounding boundary may
                # snap to either neighbour, so one unit
                assert_quantized_close(a, e, 1, what=what)
            else:
                assert_float_close(a, e, rtol, what=what, floor=floor)
    return summaries


def check_op(cases, *, workers=(), plugins=(), litert: bool = False,
             max_examples: Optional[int] = None, precision: str = "fp32") -> None:
    """Property-test an op, yours or ours (the built-in ops' delegate tests go through it too).

    `cases` is a hypothesis strategy drawing (model_bytes, inputs) - usually one-op models from
    `one_op_model` - or (model_bytes, inputs, options). `inputs` None: seeded inputs drawn from
    the model's input details (`model_inputs(model, options.get("seed", 0))`: int8 codes over
    their whole range). Each case runs on the reference path; with `litert=True` it must match
    LiteRT (for ops LiteRT has); on every worker's Taichi backend it must be delegated and match
    the reference (check_delegate, which takes `options`: seed, rtol, floor,
    expect_all_delegated). `plugins` names the modules that register your ops, so workers
    import them too. With neither workers nor `litert=True` nothing would be compared (only
    the reference would run): a ValueError, as is an empty list of workers.
    `max_examples`: the count; by default TAICHI_EXAMPLES (which the hypothesis profile scales).
    """
    from hypothesis import given, settings

    workers = list(workers)
    if not workers and not litert:
        raise ValueError("check_op: no backend worker and litert=False, so nothing would be "
                         "checked (an empty TFLITE_TAICHI_TEST_BACKENDS?)")

    @settings(max_examples=max_examples or TAICHI_EXAMPLES, deadline=None)
    @given(cases)
    def property_test(case):
        model, inputs, options = case if len(case) == 3 else (*case, {})
        if inputs is None:
            inputs = model_inputs(model, options.get("seed", 0))
        if litert:
            check_against_litert(model, inputs)
        if workers:                 # (check_delegate runs the reference path)
            check_delegate(model, workers, inputs, precision=precision, plugins=list(plugins),
                           **options)

    property_test()
