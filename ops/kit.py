"""The op kit: what every op's Taichi part builds on, ours and a user's alike: tensor
references with static offsets, loads and stores (with the float view's quantization simulation
fused into the store), the fused activations, NaN-keeping min/max, broadcast index math.

The public names (`__all__`) are what an op registered with `tflite_taichi.register_op` may use:
`ti` (Taichi, imported when something compiles), `TensorRef` (what `StepIO` hands the op's
factory, one per input and output: `load`, `store`, `snap`, `shape`, `size`, `strides`), `StepIO`,
the two element-wise step templates (`ElementwiseStep`, `BroadcastBinaryStep`: a subclass gives
the formula, the template the loop and the fused variants) and `CopyStep` (the identity), `activation`, `keep_nan`, `nan_max`, `nan_min`, `broadcast_flat`, `load_broadcast`, `unravel`,
`split_count` with `SPLIT_THREADS`, and `has_shared_memory`. The rest (the buffer numbers, the
stand-ins fusion puts in a TensorRef's place) is the delegate's.

A `TensorRef` is a plain Python object; inside a kernel its attributes are compile-time
constants, so `ref.load(arena, weights, io, i)` compiles to one indexed read at a fixed offset.
Kernels take four 1-D buffers; ops see three names, passed to every load and store:
- `arena`   the partition's intermediates, offsets reused by lifetime (planner.py);
- `weights` the partition's constants, dequantized (and laid out for their op) once at prepare;
- `io`      a tuple (io_in, io_out, scratch, weights): the partition's inputs and outputs,
            which live in the program's io buffer on the device (delegate.py: the generated
            kernels pass the same buffer as io_in and io_out), a float32 device buffer for the
            partial results of ops that split their reductions (float32 even with
            precision='fp16'; every op's scratch starts at 0: ops run one after another), and
            the weights again, for an op fused into another's store (EpilogueRef), which has no
            weights argument. Ops pass `io` on untouched; only load/store look inside.
"""

from dataclasses import dataclass
from typing import Optional

from tflite_taichi import switches
from .common import ACT_RELU, ACT_RELU6, ACT_RELU_N1_TO_1, ACT_SIGN_BIT, ACT_TANH
from .lazy_taichi import LazyTaichi, realize  # noqa: F401  (realize: for what compiles)

# Taichi itself is imported only when something is compiled (lazy_taichi.py): a warm start,
# which loads its kernels through Taichi's C API, and backend='reference' never import it
ti = LazyTaichi()

ARENA, WEIGHTS, IO_IN, IO_OUT, SCRATCH = 0, 1, 2, 3, 4

__all__ = ["SPLIT_THREADS", "BroadcastBinaryStep", "CopyStep", "ElementwiseStep", "StepIO", "TensorRef",
           "activation", "broadcast_flat", "has_shared_memory", "keep_nan", "load_broadcast",
           "nan_max", "nan_min", "split_count", "ti", "unravel"]


@ti.data_oriented
class TensorRef:
    """A tensor's place: which buffer, its offset, its shape and row-major strides, and for an
    op output whose tensor is quantized in the model, the grid to snap values to.

    `codes`: the buffer holds the tensor's integer codes q (as float32, exact for 8/16 bits)
    rather than its real values (q - zp) * scale: for the model's quantized inputs and outputs
    in io, so that the host only casts them (numpy's quantize of a 257x257x21 output costs 3 ms
    on the host, the cast 0.2: the device does the arithmetic). Loads and stores convert, so an
    op reads and writes real values either way, bit for bit the same (the store's snap computes
    the same q, the load the same product)."""

    def __init__(self, buffer: int, offset: int, shape: tuple, quant: Optional[tuple] = None,
                 storage: str = "f32", codes: bool = False):
        self.buffer = buffer
        self.storage = storage          # the buffers' element type: "f32", or "f16" for fp16 precision
        self.offset = int(offset)
        self.shape = tuple(int(d) for d in shape)
        strides, acc = [], 1
        for d in reversed(self.shape):
            strides.append(acc)
            acc *= d
        self.strides = tuple(reversed(strides))
        self.size = acc
        self.rank = len(self.shape)
        # (scale, zero_point, qmin, qmax) of a per-tensor quantized output
        self.quant = quant
        self.quantized = quant is not None
        if codes and (quant is None or buffer not in (IO_IN, IO_OUT)):
            raise ValueError("integer codes are for quantized tensors in io")
        self.codes = bool(codes)
        if quant is not None:
            self.q_scale, self.q_zero, self.q_min, self.q_max = (float(v) for v in quant)
            self.q_zero_int = int(round(self.q_zero))

    def __repr__(self):
        return f"TensorRef(buf={self.buffer}, off={self.offset}, shape={self.shape})"

    @ti.func
    def load(self, arena: ti.template(), weights: ti.template(), io: ti.template(), flat):
        """Element `flat` (row-major) as f32, whatever the storage precision."""
        v = 0.0
        if ti.static(self.buffer == ARENA):
            v = ti.cast(arena[self.offset + flat], ti.f32)
        elif ti.static(self.buffer == WEIGHTS):
            v = ti.cast(weights[self.offset + flat], ti.f32)
        elif ti.static(self.buffer == IO_IN):
            v = io[0][self.offset + flat]
        elif ti.static(self.buffer == IO_OUT):
            v = io[1][self.offset + flat]
        else:
            v = io[2][self.offset + flat]
        if ti.static(self.codes):
            # q - zp in integers, then one rounding: the product of two exact float32 values,
            # as numpy's dequantize computes it. Written in floats, (v - zp) * scale may be
            # reassociated under fast math (v * scale - zp * scale), and one ulp decides FLOOR,
            # CEIL, FLOOR_DIV and POW's sign rule at integer points (14 units seen on int8 CEIL)
            v = ti.cast(ti.cast(v, ti.i32) - self.q_zero_int, ti.f32) * self.q_scale
        return v

    @ti.func
    def code(self, value):
        """The integer code storing `value` gives a quantized tensor, as a float32:
        q = clamp(round_half_away(x / scale) + zp, qmin, qmax)."""
        q = ti.cast(value, ti.f32) / self.q_scale   # divide, as quant.fake_quant: bit-identical
        q = ti.math.sign(q) * ti.floor(ti.abs(q) + 0.5) + self.q_zero
        # NaN has no grid point: the zero point (real 0), as quant.quantize
        return ti.select(ti.math.isnan(q), ti.cast(self.q_zero, ti.f32),
                         ti.min(ti.max(q, self.q_min), self.q_max))

    @ti.func
    def snap(self, value):
        """`value` as storing it here makes it: through the quantization simulation when the
        tensor is quantized, x = (code(x) - zp) * scale (float32 either way)."""
        v = ti.cast(value, ti.f32)
        if ti.static(self.quantized):
            v = (self.code(v) - self.q_zero) * self.q_scale
        return v

    @ti.func
    def store(self, arena: ti.template(), io: ti.template(), flat, value):
        """Write element `flat`, snapped to the tensor's grid where it is quantized (snap), or
        as its code (`codes`)."""
        v = ti.cast(value, ti.f32)
        if ti.static(self.codes):
            v = self.code(v)
        else:
            v = self.snap(v)
        if ti.static(self.buffer == ARENA and self.storage == "f16"):
            arena[self.offset + flat] = ti.cast(v, ti.f16)
        elif ti.static(self.buffer == ARENA):
            arena[self.offset + flat] = v
        elif ti.static(self.buffer == IO_OUT):
            io[1][self.offset + flat] = v
        else:
            ti.static_assert(self.buffer == SCRATCH, "only the arena, io_out and scratch are written")
            io[2][self.offset + flat] = v

    @ti.func
    def flat_index(self, I):
        """Row-major position of a ti.Vector index of this tensor's rank."""
        f = 0
        for d in ti.static(range(self.rank)):
            f += I[d] * self.strides[d]
        return f


# NaN. ti.max/ti.min drop it (LLVM's maxnum on cpu/cuda; SPIR-V's FMax leaves it undefined and
# lavapipe drops it), and comparisons with NaN are unreliable on OpenGL/llvmpipe (NaN < 0 came
# out true there), while ti.math.isnan is right on every backend (measured, Taichi 1.7.4). The
# reference and LiteRT keep NaN through RELU-like clamps, so these helpers test for it first.
@ti.func
def keep_nan(v, r):
    """r, or v where v is NaN."""
    return ti.select(ti.math.isnan(v), v, r)


@ti.func
def nan_max(a, b):
    """max that propagates NaN, as np.maximum."""
    return ti.select(ti.math.isnan(a), a, ti.select(ti.math.isnan(b), b, ti.max(a, b)))


@ti.func
def nan_min(a, b):
    """min that propagates NaN, as np.minimum."""
    return ti.select(ti.math.isnan(a), a, ti.select(ti.math.isnan(b), b, ti.min(a, b)))


@ti.func
def activation(v, act: ti.template()):
    """A fused activation (tflite.ActivationFunctionType), chosen at compile time. NaN passes
    through the clamps, as in LiteRT."""
    r = v
    if ti.static(act == ACT_RELU):
        r = keep_nan(v, ti.max(v, 0.0))
    elif ti.static(act == ACT_RELU_N1_TO_1):
        r = keep_nan(v, ti.min(ti.max(v, -1.0), 1.0))
    elif ti.static(act == ACT_RELU6):
        r = keep_nan(v, ti.min(ti.max(v, 0.0), 6.0))
    elif ti.static(act == ACT_TANH):
        r = ti.tanh(v)
    elif ti.static(act == ACT_SIGN_BIT):
        r = ti.select(v < 0.0, 1.0, 0.0)
    return r


@ti.func
def broadcast_flat(out_index, ref: ti.template(), out_rank: ti.template()):
    """Position in `ref` of the element broadcast to output index `out_index` (numpy rules:
    trailing dims aligned, size-1 dims repeat)."""
    f = 0
    for d in ti.static(range(ref.rank)):
        od = out_rank - ref.rank + d
        if ti.static(ref.shape[d] != 1):
            f += out_index[od] * ref.strides[d]
    return f


@ti.func
def load_broadcast(ref: ti.template(), out: ti.template(), arena: ti.template(),
                   weights: ti.template(), io: ti.template(), flat):
    """Element of `ref` broadcast (numpy rules) to row-major position `flat` of `out`, with the
    index arithmetic the shapes need: none for the same shape or one element, a remainder
    for a trailing-dims operand (a per-channel bias or scale), else unravel."""
    v = 0.0
    if ti.static(tuple(ref.shape) == tuple(out.shape)):
        v = ref.load(arena, weights, io, flat)
    elif ti.static(ref.size == 1):
        v = ref.load(arena, weights, io, 0)
    elif ti.static(_trailing(ref.shape, out.shape)):
        v = ref.load(arena, weights, io, flat % ref.size)
    else:
        v = ref.load(arena, weights, io, broadcast_flat(unravel(flat, out), ref, out.rank))
    return v


def _trailing(shape, out_shape) -> bool:
    """`shape` is `out_shape`'s last dims, after leading 1s: it repeats every prod(shape)."""
    dims = list(shape)
    while dims and dims[0] == 1:
        dims.pop(0)
    return len(dims) <= len(out_shape) and tuple(out_shape[len(out_shape) - len(dims):]) == tuple(dims)


def _take_place(ref_like, ref):
    """Give a ref that stands in for `ref` (LoadRef, EpilogueRef) its place, shape and grid,
    so that ops read them as they would the TensorRef."""
    for name in ("buffer", "storage", "offset", "shape", "strides", "size", "rank", "quant",
                 "quantized", "codes", "q_scale", "q_zero", "q_zero_int", "q_min", "q_max"):
        if hasattr(ref, name):
            setattr(ref_like, name, getattr(ref, name))


@ti.data_oriented
class LoadRef:
    """The output of an op computed again at each load of its only reader (codegen's load
    fusion, Fusion.computed_at_load: a PAD, or an ADD/MUL with a broadcast operand): never
    stored; `load(flat)` asks the op's step for element `flat` (its `fused_load`), snapped to the
    tensor's grid as storing it would. Quacks like the TensorRef it replaces. `step` is set once
    the op's step is built (codegen builds readers first)."""

    def __init__(self, ref):
        self.ref, self.step = ref, None
        _take_place(self, ref)

    def __repr__(self):
        return f"LoadRef({self.ref!r} <- {type(self.step).__name__})"

    @ti.func
    def load(self, arena: ti.template(), weights: ti.template(), io: ti.template(), flat):
        return self.step.fused_load(arena, weights, io, flat)

    @ti.func
    def snap(self, value):
        return self.ref.snap(value)

    @ti.func
    def flat_index(self, I):
        return self.ref.flat_index(I)


SPLIT_THREADS = 65536      # an op with fewer outputs than this leaves a GPU mostly idle

# Archs whose kernels have block-shared memory and barriers (ti.simt.block.SharedArray, sync);
# Taichi's CPU backends refuse the array ("not supported for arch x64"), and on gles Taichi
# 1.7.4 refuses block.sync().
SHARED_MEMORY_ARCHS = ("cuda", "vulkan", "opengl", "metal", "amdgpu", "dx11", "dx12")


def has_shared_memory(arch: str) -> bool:
    """Whether Taichi arch `arch` (a step's StepIO.arch) gives kernels block-shared memory."""
    if switches.value("TFLITE_TAICHI_NO_SHARED_TILES"):    # bench/'s A/B switch, see gpu_bench.sh
        return False
    return arch in SHARED_MEMORY_ARCHS


def split_count(n_out: int, terms: int, min_terms: int) -> int:
    """How many partial results per output an op with `n_out` outputs, each reducing `terms`
    values, splits its reduction into (chunks of at least `min_terms`) to reach ~SPLIT_THREADS
    threads; 1 when it has enough threads already or too short a reduction."""
    if n_out >= SPLIT_THREADS or terms < 2 * min_terms:
        return 1
    return int(min(terms // min_terms, -(-SPLIT_THREADS // n_out)))


@ti.data_oriented
class ElementwiseStep:
    """The one-thread-per-element step: out[i] = self.formula(x[i]). A subclass gives `formula`
    (a ti.func of one float32 value); `fused_store` applies it to a value the producer's store
    hands over (an op declaring base.ELEMENTWISE_UNARY)."""

    def __init__(self, x, out):
        self.x, self.out = x, out
        self.n = out.size

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        for i in range(self.n):
            self.out.store(arena, io, i, self.formula(self.x.load(arena, weights, io, i)))

    @ti.func
    def fused_store(self, arena: ti.template(), weights: ti.template(), io: ti.template(), flat,
                    value, position: ti.template()):
        self.out.store(arena, io, flat, self.formula(value))


@ti.data_oriented
class CopyStep(ElementwiseStep):
    """out[i] = x[i] through the output's store (its grid, or its codes): QUANTIZE, DEQUANTIZE,
    and a variable's copies to and from its slot."""

    @ti.func
    def formula(self, v):
        return v


@ti.data_oriented
class BroadcastBinaryStep:
    """One thread per output element of a binary op whose inputs broadcast (numpy rules):
    out = self.formula(a[...], b[...]), `formula` a ti.func of two float32 values given by the
    subclass. `fused_store` takes input `position` as the value its producer's store hands over
    and loads the other (epilogue_inputs); `fused_load` computes element `flat` for a reader's
    load (computed_at_load)."""

    def __init__(self, a, b, out):
        self.a, self.b, self.out = a, b, out
        self.loop = out.shape or (1,)

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        for I in ti.grouped(ti.ndrange(*self.loop)):
            x = self.a.load(arena, weights, io, broadcast_flat(I, self.a, self.out.rank))
            y = self.b.load(arena, weights, io, broadcast_flat(I, self.b, self.out.rank))
            self.out.store(arena, io, self.out.flat_index(I), self.formula(x, y))

    @ti.func
    def fused_store(self, arena: ti.template(), weights: ti.template(), io: ti.template(), flat,
                    value, position: ti.template()):
        x = value
        y = value
        if ti.static(position == 0):
            y = load_broadcast(self.b, self.out, arena, weights, io, flat)
        else:
            x = load_broadcast(self.a, self.out, arena, weights, io, flat)
        self.out.store(arena, io, flat, self.formula(x, y))

    @ti.func
    def fused_load(self, arena: ti.template(), weights: ti.template(), io: ti.template(), flat):
        x = load_broadcast(self.a, self.out, arena, weights, io, flat)
        y = load_broadcast(self.b, self.out, arena, weights, io, flat)
        return self.out.snap(self.formula(x, y))


@dataclass
class StepIO:
    """What an op's Taichi factory receives: a TensorRef per input (None: omitted optional
    input) and per output."""
    inputs: tuple
    outputs: tuple
    scratch: Optional[TensorRef] = None     # float32 scratch the op asked for (OpDef.scratch)
    # an op declaring OpDef.state.taichi_writes_state, whose state inputs are variable tensors the
    # delegate keeps: per position of OpDef.state.state_inputs, the ref to write the new state into
    # (the variable's slot in io; the same place as that input's ref); () where they are not
    state: tuple = ()
    # the Taichi arch the kernel is built for ('cuda', 'vulkan', 'x64', ...): ops that specialise
    # on it (shared-memory tiles, barriers) read it here, not from the process
    arch: str = ""


@ti.func
def unravel(flat, ref: ti.template()):
    """The index (a ti.Vector of `ref.rank` ints, one for a scalar) of row-major position
    `flat` of `ref`."""
    I = ti.Vector([0] * max(ref.rank, 1))
    r = flat
    for d in ti.static(range(ref.rank)):
        I[d] = r // ref.strides[d]
        r -= I[d] * ref.strides[d]
    return I


@ti.data_oriented
class EpilogueRef:
    """The output of an op whose only reader is an element-wise op fused into its store (codegen's
    epilogue fusion): the op stores v as usual; this snaps v to the tensor's grid where the
    model quantizes it (what storing it would have done) and hands it to the reader's
    `fused_store`, which computes its own element and stores that (into another EpilogueRef, for
    a chain). The intermediate tensor never touches memory. Quacks like the TensorRef it replaces
    (same shape, strides, quantization). The reader may load its other inputs from the weights:
    the kernel passes them as io[3]."""

    def __init__(self, ref, reader, position: int):
        self.ref, self.reader, self.position = ref, reader, int(position)
        _take_place(self, ref)

    def __repr__(self):
        return f"EpilogueRef({self.ref!r} -> {type(self.reader).__name__})"

    @ti.func
    def snap(self, value):
        return self.ref.snap(value)

    @ti.func
    def store(self, arena: ti.template(), io: ti.template(), flat, value):
        self.reader.fused_store(arena, io[3], io, flat, self.ref.snap(value), self.position)

    @ti.func
    def flat_index(self, I):
        return self.ref.flat_index(I)
