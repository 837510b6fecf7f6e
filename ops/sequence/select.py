"""How the FULL kernel's Taichi step runs on an arch: its state in one block's shared memory
(where the arch has barriers and the state fits) or in scratch with a thread per batch row; the
block's width; the chunks of time steps Mesa's loop limit allows a dispatch.
"""
from typing import NamedTuple, Tuple

from .. import kit
from .kernels import state_layout

MAX_LANES = 256                 # threads of the block (shared-memory archs)
# Archs where Taichi 1.7 has block barriers (ti.simt.block.sync): not gles, whose shared
# arrays kit.has_shared_memory() reports but whose sync() raises "not supported".
BARRIER_ARCHS = ("cuda", "amdgpu", "vulkan", "metal", "opengl", "dx11")
# Shared memory the state may take: Vulkan guarantees 16 KiB per workgroup, OpenGL 32 KiB.
MAX_SHARED_FLOATS = 4096
# Mesa's software drivers (lavapipe for Vulkan, llvmpipe for OpenGL) end every loop of a shader
# invocation once all its loops together have iterated LP_MAX_TGSI_LOOP_ITERATIONS (65535)
# times, silently: a block that ran the whole sequence left the last steps unwritten. On these
# archs the time loop is split into chunks of steps, each its own top-level loop (a dispatch,
# whose invocations count afresh), the state carried between them in the scratch buffer. A
# quarter of the limit is kept for loops the count below does not see. (On a hardware device
# the chunks only cost a dispatch each: a few per sequence.)
MESA_LOOP_LIMIT = 65535
LOOP_BUDGET = MESA_LOOP_LIMIT * 3 // 4
LOOP_LIMITED_ARCHS = ("vulkan", "opengl", "gles")


def block_barriers(arch: str) -> bool:
    """Whether Taichi arch `arch` gives this op block-shared memory and barriers."""
    return kit.has_shared_memory(arch) and arch in BARRIER_ARCHS


def block_lanes(L) -> int:
    """Threads of the block: one per widest phase's item, up to MAX_LANES, a power of two
    (Taichi's block_dim must be one on OpenGL, Metal and DX11; CUDA and Vulkan also take
    multiples of 32)."""
    widest = max(L.n_batch * L.n_cell, L.n_batch * L.n_output, 32)
    return min(MAX_LANES, 1 << (widest - 1).bit_length())


def _loop(trips: int, body: int = 0) -> int:
    """Loop iterations a loop of `trips` passes costs, each running `body` iterations of inner
    loops (one more for the exit test)."""
    return trips * (1 + body) + 1


def step_iterations(L, lanes: int, rows: int) -> int:
    """An upper bound on the loop iterations one thread runs per time step (SequenceLstmStep's
    phases: `rows` batch rows shared by `lanes` threads)."""
    def items(width):
        return -(-rows * width // lanes)
    dot = _loop(L.n_input) + (0 if L.diagonal else _loop(L.n_output))
    gates = 4                                          # CIFG has 3: the bound keeps 4
    total = _loop(items(L.n_cell), gates * dot)        # gates, or layer norm's sums
    if L.layer_norm:
        statistics = 4 * 2 * _loop(L.n_cell)           # mean and variance of each gate
        total += 2 * _loop(items(1), statistics) + 2 * _loop(items(L.n_cell), dot)
    total += _loop(items(L.n_output), _loop(L.n_cell) if L.projection else 0)
    return 1 + total


def step_chunks(L, lanes: int, rows: int, arch: str) -> tuple:
    """(first, end) time steps of each chunk: the whole sequence, or on LOOP_LIMITED_ARCHS
    as many steps as LOOP_BUDGET allows a thread (at least one)."""
    if arch not in LOOP_LIMITED_ARCHS:
        return ((0, L.n_time),)
    state_copies = 4 * _loop(-(-rows * max(L.n_cell, L.n_output) // lanes))
    per_chunk = max(1, (LOOP_BUDGET - state_copies) // step_iterations(L, lanes, rows))
    return tuple((t, min(t + per_chunk, L.n_time))
                 for t in range(0, max(L.n_time, 1), per_chunk))



class BlockPlan(NamedTuple):
    """How a SequenceLstmStep runs: its state in one block's shared memory or in scratch, the
    threads that share a sequence, and the (first, end) time steps of each dispatch."""
    shared: bool
    lanes: int
    chunks: Tuple[Tuple[int, int], ...]


def block_plan(L, arch: str) -> BlockPlan:
    """The state in block-shared memory (one block of block_lanes threads, with barriers) or,
    where the arch has none or the state does not fit MAX_SHARED_FLOATS, in the scratch buffer
    with a thread per batch row. Both split the time loop into chunks of steps on
    LOOP_LIMITED_ARCHS. A thread per row that passes the budget in a single step (about
    4 n_cell (n_input + n_output) iterations: 96 cells of 96 inputs) cannot be bounded so: on
    lavapipe and llvmpipe that path is still cut short (a state over MAX_SHARED_FLOATS, or gles,
    with such a step); supports() knows no arch to refuse it by."""
    if not (block_barriers(arch) and state_layout(L)[1] <= MAX_SHARED_FLOATS):
        return BlockPlan(False, 1, step_chunks(L, 1, 1, arch))
    lanes = block_lanes(L)
    return BlockPlan(True, lanes, step_chunks(L, lanes, L.n_batch, arch))

