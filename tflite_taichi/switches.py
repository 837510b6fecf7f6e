"""Every TFLITE_TAICHI_* environment variable, in one place: its type, default and meaning, and
whether it changes the kernels we generate. This module is the only reader of them.

- `value(NAME)` is a switch's typed value (its default when unset or empty); a value that does
  not parse raises InputError naming the variable.
- `kernel_key()` is what the kernel cache adds to a module's key: every set switch marked
  `kernels=True`. The key is derived from this table, so a new switch that changes kernels
  cannot be forgotten there (runtime/cache.py used to list them by hand).
- `inherited()` / `apply(...)`: what a child process (a compile worker) must see, and how it
  takes it.

Switches are read when asked, not at import: tests and bench/ scripts set them between
interpreters. Most are A/B switches of bench/ (measurements name them); `docs/switches.md`
is this table in prose.
"""
import contextlib
import os
from dataclasses import dataclass
from typing import Callable, Optional

from tflite_taichi.errors import InputError

PREFIX = "TFLITE_TAICHI_"


def _flag_on(text: str) -> bool:
    """'0' is off, anything else on (the variables that switch a default-on feature off)."""
    return text != "0"


def _present(text: str) -> bool:
    """Set to anything (non-empty) is on."""
    return True


def _natural(text: str) -> int:
    number = int(text)
    if number < 0:
        raise ValueError("a number of 0 or more")
    return number


def _positive(text: str) -> int:
    number = int(text)
    if number < 1:
        raise ValueError("a number of 1 or more")
    return number


def _number(text: str) -> float:
    return float(text)


def _seconds(text: str) -> float:
    number = float(text)
    if not number > 0:
        raise ValueError("a number of seconds above 0")
    return number


def _choice(*names: str) -> Callable[[str], str]:
    def parse(text: str) -> str:
        text = text.lower()
        if text not in names:
            raise ValueError("choose " + " or ".join(repr(n) for n in names))
        return text
    return parse


def _names(text: str) -> tuple:
    """Comma-separated names, in their order, each once."""
    return tuple(dict.fromkeys(filter(None, (part.strip() for part in text.split(",")))))


def _tile_shape(text: str) -> tuple:
    parts = tuple(int(v) for v in text.split(","))
    if len(parts) != 4 or min(parts) < 1:
        raise ValueError("four positive numbers tile_m,tile_n,micro_m,micro_n")
    tile_m, tile_n, micro_m, micro_n = parts
    if tile_m % micro_m or tile_n % micro_n:
        raise ValueError("tile sizes must be multiples of the micro tile")
    return parts


def _text(text: str) -> str:
    return text


@dataclass(frozen=True)
class Switch:
    name: str                           # the variable, with its prefix
    parse: Callable[[str], object]      # raises ValueError on a bad value
    default: object
    doc: str
    kernels: bool = False               # changes generated kernels: part of the cache key
    scope: str = "runtime"              # runtime | bench | testing
    empty_is_value: bool = False        # set but empty is a value ("no backends"), not the default


SWITCHES = {s.name: s for s in (
    # -- where things are kept --------------------------------------------------------------
    Switch("TFLITE_TAICHI_CACHE_DIR", _text, None,
           "the kernel cache's folder (default $XDG_CACHE_HOME/tflite_taichi or "
           "~/.cache/tflite_taichi); an Interpreter's cache_dir= wins over it"),
    Switch("TFLITE_TAICHI_CACHE_MAX_MB", _number, None,
           "the kernel cache's cap in MiB (default 2048): least recently used records go first"),
    Switch("TFLITE_TAICHI_CAPI_LIB", _text, None,
           "the path of libtaichi_c_api.so to use instead of the taichi wheel's"),
    # -- how the runtime runs ---------------------------------------------------------------
    Switch("TFLITE_TAICHI_TAICHI", _choice("taichi", "forge"), "taichi",
           "which Taichi: upstream 1.7.4 or the taichi-forge fork (the `forge` extra)"),
    Switch("TFLITE_TAICHI_RUNTIME", _choice("capi", "python"), "capi",
           "Taichi's C API (default) or its Python runtime (an A/B switch)"),
    Switch("TFLITE_TAICHI_COMPILE_WORKERS", _natural, None,
           "processes that compile kernels in parallel (0: in this process; default: one per "
           "usable core, at most one per module)"),
    Switch("TFLITE_TAICHI_COMPILE_DEADLINE", _seconds, 600.0,
           "seconds a compile worker may go without compiling a kernel before it is killed and "
           "its modules are compiled in the caller's process"),
    Switch("TFLITE_TAICHI_VULKAN_SUBMIT", _choice("ours", "taichi"), "ours",
           "vulkan: our own command buffers, recorded once (default), or Taichi's submissions"),
    Switch("TFLITE_TAICHI_VULKAN_WAIT", _choice("fence", "taichi"), "fence",
           "vulkan: the host polls a fence of ours (default) or calls Taichi's ti_wait"),
    Switch("TFLITE_TAICHI_VULKAN_BOOST", _flag_on, True,
           "0: no CUDA context beside a Vulkan device of an NVIDIA GPU (which raises its clocks)"),
    Switch("TFLITE_TAICHI_FRONTEND_PATCH", _flag_on, True,
           "0: leave Taichi 1.7.4's frontend unpatched (its compile builds error messages "
           "eagerly: slower starts)"),
    # -- what kernels are generated (each part of the cache key) ----------------------------
    Switch("TFLITE_TAICHI_FUSION", _choice("all", "store", "none"), "all", kernels=True,
           doc="which fusions codegen makes: all, into stores only, or none (every op a task)"),
    Switch("TFLITE_TAICHI_CHUNK_STEPS", _positive, None, kernels=True,
           doc="the most tasks in one kernel (default per backend; 1 maps profiler tasks to ops)"),
    Switch("TFLITE_TAICHI_IO_CODES", _flag_on, True, kernels=True,
           doc="0: quantized IO as real values (de)quantized by numpy, not integer codes"),
    Switch("TFLITE_TAICHI_SPIRV_CAPS_OFF", _names, (), kernels=True,
           doc="comma-separated SPIR-V capabilities not to use (e.g. spirv_has_int64)"),
    Switch("TFLITE_TAICHI_NO_SHARED_TILES", _present, False, kernels=True,
           doc="set: no shared-memory GEMM tiles on any arch"),
    Switch("TFLITE_TAICHI_GEMM_TILES", _tile_shape, None, kernels=True,
           doc="force one GEMM tile shape tile_m,tile_n,micro_m,micro_n (bench/gemm_micro.py)"),
    Switch("TFLITE_TAICHI_GEMM_MIN_BLOCKS", _natural, None, kernels=True,
           doc="tiles from which a product runs as GEMM tiles (default 400: ops/conv/select.py)"),
    Switch("TFLITE_TAICHI_POINTWISE_SPLIT", _flag_on, True, kernels=True,
           doc="0: a pointwise conv's split-K counts outputs, not threads"),
    # -- bench/ and tests -------------------------------------------------------------------
    Switch("TFLITE_TAICHI_BENCH_CUDA_CONTEXT", _flag_on, False, scope="bench",
           doc="1: LiteRT GPU's benchmark child holds a CUDA context (the clocks' A/B)"),
    Switch("TFLITE_TAICHI_EXAMPLES", _positive, None, scope="testing",
           doc="examples per Taichi-vs-reference property test (default by hypothesis profile)"),
    Switch("TFLITE_TAICHI_EXPLORE_EXAMPLES", _positive, 200, scope="testing",
           doc="examples per test under the `explore` hypothesis profile"),
    Switch("TFLITE_TAICHI_TEST_BACKENDS", _names, ("cpu", "vulkan", "opengl"), scope="testing",
           empty_is_value=True, doc="the Taichi backends the test suite runs (empty: none)"),
    Switch("TFLITE_TAICHI_TEST_GLES", _text, "gles", scope="testing",
           doc="without 'gles': the GLES tests are skipped"),
    Switch("TFLITE_TAICHI_TEST_RUN_CACHE", _text, None, scope="testing",
           doc="set by the suite (tests/conftest.py): the kernel cache its run made, in which "
               "each test process makes a folder of its own"),
    Switch("TFLITE_TAICHI_BATCH_FAULT", _text, None, scope="testing",
           doc="tests of batch's retries: KIND:SUFFIX:MARKER makes a worker die or hang once"),
    Switch("TFLITE_TAICHI_MODELS", _text, None, scope="testing",
           doc="the folder of the shared models the tests run (default ../shared/models)"),
    Switch("TFLITE_TAICHI_EXPECT_GPU", _choice("none"), None, scope="testing",
           doc="none: this machine has no hardware GPU, and the tests hold `auto` to that"),
    Switch("TFLITE_TAICHI_FULL", _flag_on, False, scope="testing",
           doc="1: the zoo's tests run every model, float and int8"),
    Switch("TFLITE_TAICHI_FUZZ_CASES", _positive, 1200, scope="testing",
           doc="mutated models per fuzz test run"),
    Switch("TFLITE_TAICHI_FUZZ_CPU_SHARE", _number, 0.03, scope="testing",
           doc="the share of fuzz cases that also run on the cpu backend"),
    Switch("TFLITE_TAICHI_FUZZ_SEED", _natural, None, scope="testing",
           doc="the fuzz test's seed (default: from the clock, printed)"),
    Switch("TFLITE_TAICHI_FUZZ_OUT", _text, None, scope="testing",
           doc="where the fuzz test saves minimised failures (default: pytest's tmp folder)"),
)}


def raw(name: str) -> Optional[str]:
    """The variable's text as set (stripped), or None when unset (or empty, for most)."""
    switch = SWITCHES[name]
    given = os.environ.get(switch.name)
    if given is None or (not given.strip() and not switch.empty_is_value):
        return None
    return given.strip()


def value(name: str):
    """The switch's typed value; its default when the variable is unset or empty."""
    switch = SWITCHES[name]
    given = raw(name)
    if given is None:
        return switch.default
    try:
        return switch.parse(given)
    except ValueError as e:
        reason = str(e)
        if reason.startswith(("invalid literal", "could not convert")):    # int() / float()'s words
            reason = "not a number"
        raise InputError(f"{switch.name}={given!r}: {reason} ({switch.doc})") from None


def kernel_key() -> dict:
    """The set switches that change generated kernels, as their text: part of a module's key."""
    return {name: raw(name) for name, s in SWITCHES.items() if s.kernels and raw(name) is not None}


def inherited() -> dict:
    """Every TFLITE_TAICHI_* variable of this process, as set: what a child must see."""
    return {k: v for k, v in os.environ.items() if k.startswith(PREFIX)}


def apply(variables: dict) -> None:
    """Make this process's TFLITE_TAICHI_* variables exactly `variables` (a child's start)."""
    for name in [n for n in os.environ if n.startswith(PREFIX)]:
        if name not in variables:
            del os.environ[name]
    os.environ.update(variables)


@contextlib.contextmanager
def overriding(variables: dict):
    """These switches set (as text) while the block runs; every switch as it was after."""
    unknown_names = sorted(set(variables) - set(SWITCHES))
    if unknown_names:
        raise KeyError(f"no such switch: {', '.join(unknown_names)}")
    saved = inherited()
    os.environ.update(variables)
    try:
        yield
    finally:
        apply(saved)


def unknown() -> list:
    """TFLITE_TAICHI_* variables set here that no switch knows (a typo of one, most likely)."""
    return sorted(k for k in os.environ if k.startswith(PREFIX) and k not in SWITCHES)


def table() -> str:
    """The switches as a Markdown table (docs/switches.md is checked against it)."""
    lines = ["| variable | default | changes kernels | for | meaning |",
             "| --- | --- | --- | --- | --- |"]
    for s in SWITCHES.values():
        default = ("-" if s.default in (None, ()) else ",".join(s.default)
                   if isinstance(s.default, tuple) else s.default)
        lines.append(f"| `{s.name}` | {default} | {'yes' if s.kernels else ''} | {s.scope} | {s.doc} |")
    return "\n".join(lines)
