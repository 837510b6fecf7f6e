"""Convolutions and the fully-connected layer: CONV_2D (grouped too), DEPTHWISE_CONV_2D,
TRANSPOSE_CONV, FULLY_CONNECTED.

All are im2col + matmul on the float view: `extract_patches` gathers, for each of the (few)
kernel taps, the strided slice of the zero-padded input it sees, and one einsum contracts the
patches with the filter. Zero padding is exact for quantized tensors too (the float view of the
input's zero point is 0.0). `extract_patches` and `spatial_geometry` are shared with pooling.py.

Also MediaPipe's custom op CUSTOM:Convolution2DTransposeBias (a transpose conv whose bias is an
input and whose output size comes from the input size, not an output_shape tensor).

The Taichi parts (delegate) are gathers: one thread per output element, serial loops over the
window taps and input channels. No `from __future__ import annotations` here: Taichi reads the
annotations of the ti.func methods below.
"""
import struct
from dataclasses import dataclass

import numpy as np

from tflite_taichi import switches
from tflite_taichi.errors import ModelError
from tflite_taichi.quant import is_float_view

from .base import Fusion, OpDef, register_op
from .common import (PADDING_SAME, PADDING_VALID, apply_activation,
                     check_activation, check_padding, conv_output_size, conv_padding_before,
                     positive_ints)
from . import kit
from .kit import SPLIT_THREADS, activation, split_count, ti

_PADDING_NAMES = {PADDING_SAME: "SAME", PADDING_VALID: "VALID"}


# -- shared helpers (also used by pooling.py) ------------------------------------------------
def spatial_geometry(node, padding, in_h, in_w, k_h, k_w, s_h, s_w, d_h=1, d_w=1):
    """(out_h, out_w, pad_top, pad_left) as TFLite computes them; ModelError when a VALID
    window does not fit in the input."""
    out_h = conv_output_size(padding, in_h, k_h, s_h, d_h)
    out_w = conv_output_size(padding, in_w, k_w, s_w, d_w)
    if out_h < 1 or out_w < 1:
        eff_h, eff_w = (k_h - 1) * d_h + 1, (k_w - 1) * d_w + 1
        raise node.fail(f"the {eff_h}x{eff_w} window (filter size with dilation) does not fit "
                        f"in the {in_h}x{in_w} input with {_PADDING_NAMES[padding]} padding")
    pad_top = conv_padding_before(padding, in_h, k_h, s_h, d_h, out_h)
    pad_left = conv_padding_before(padding, in_w, k_w, s_w, d_w, out_w)
    return out_h, out_w, pad_top, pad_left


def tap_windows(x, k_h, k_w, s_h, s_w, d_h, d_w, pad_top, pad_left, out_h, out_w, fill=0.0):
    """For each kernel tap (i, j): the [N, out_h, out_w, C] view of the padded input it sees,
    x[n, y*s_h - pad_top + i*d_h, x*s_w - pad_left + j*d_w, c] (`fill` outside the input)."""
    n, h, w, c = x.shape
    need_h = (out_h - 1) * s_h + (k_h - 1) * d_h + 1
    need_w = (out_w - 1) * s_w + (k_w - 1) * d_w + 1
    pad_bottom = max(need_h - pad_top - h, 0)
    pad_right = max(need_w - pad_left - w, 0)
    xp = np.pad(x, ((0, 0), (pad_top, pad_bottom), (pad_left, pad_right), (0, 0)),
                constant_values=fill)
    for i in range(k_h):            # kernel taps only: a small static count
        for j in range(k_w):
            yield i, j, xp[:, i * d_h: i * d_h + (out_h - 1) * s_h + 1: s_h,
                           j * d_w: j * d_w + (out_w - 1) * s_w + 1: s_w, :]


def extract_patches(x, k_h, k_w, s_h, s_w, d_h, d_w, pad_top, pad_left, out_h, out_w,
                    fill=0.0):
    """im2col on NHWC: [N, out_h, out_w, k_h, k_w, C], where patch (y, x, i, j) is
    x[n, y*s_h - pad_top + i*d_h, x*s_w - pad_left + j*d_w, c], or `fill` outside the input."""
    n, _, _, c = x.shape
    patches = np.empty((n, out_h, out_w, k_h, k_w, c), dtype=x.dtype)
    for i, j, window in tap_windows(x, k_h, k_w, s_h, s_w, d_h, d_w, pad_top, pad_left,
                                    out_h, out_w, fill):
        patches[:, :, :, i, j, :] = window
    return patches


def _require_rank(node, i, rank, what):
    spec = node.inputs[i]
    if spec.rank != rank:
        raise node.fail(f"{what} must have rank {rank}, has shape {list(spec.shape)}")
    return spec.shape


def _check_bias(node, i, channels):
    spec = node.inputs[i] if i < len(node.inputs) else None
    if spec is None:
        return
    if tuple(spec.shape) != (channels,):
        raise node.fail(f"bias must have shape [{channels}], has {list(spec.shape)}")


def _add_bias(out, bias):
    return out if bias is None else out + np.asarray(bias, out.dtype)


def _float(x):
    x = np.asarray(x)
    return x if x.dtype.kind == "f" else x.astype(np.float32)


# -- Taichi steps -----------------------------------------------------------------------------
# Every step is a gather: one thread per output element (a top-level ti.ndrange loop over the
# output, output channels innermost so neighbouring threads write neighbouring addresses),
# serial loops over the window taps and the input channels. All shapes, strides, paddings and
# activations are attributes, hence compile-time constants.
#
# Weights are laid out for that thread order at prepare (`_pack_*`, OpDef.pack): output channels
# innermost, so the threads of a warp read one contiguous run of a filter instead of one value
# every c_in floats.
#
# Split-K: an op with few outputs and a long reduction (a classifier's 1x1 conv or FC: 1000
# outputs of 1024 terms) would leave most of a GPU idle while each thread walks the reduction
# alone; it is split into SPLIT_K partial sums per output, written to scratch by one task
# and added (with bias and activation) by a second.
SPLIT_K_THREADS = SPLIT_THREADS     # below this many outputs, split the reduction...
SPLIT_K_MIN_TERMS = 64              # ...into chunks of at least this many input channels


def split_k(n_out: int, channels: int) -> int:
    """How many partial sums per output: enough to give ~SPLIT_K_THREADS threads."""
    return split_count(n_out, channels, SPLIT_K_MIN_TERMS)


def _split_k_scratch(node, splits: int) -> int:
    """OpDef.scratch of a split-K op splitting in `splits`: every partial sum of every output."""
    return splits * int(np.prod(node.outputs[0].shape)) if splits > 1 else 0


def _scratch_ref(io, splits):
    """The split-K scratch (float32, whatever the precision), when the op splits."""
    return io.scratch if splits > 1 else None


@ti.data_oriented
class SplitKStep:
    """What the convolution and fully-connected steps share: the bias of output channel `co`
    (0 without one), and the second task of a split reduction (the partial sums in scratch,
    added to the bias, the activation, the store). Subclasses set has_bias, b, out, act,
    scratch, splits and n_out."""

    @ti.func
    def bias(self, arena: ti.template(), weights: ti.template(), io: ti.template(), co):
        b = 0.0
        if ti.static(self.has_bias):
            b = self.b.load(arena, weights, io, co)
        return b

    @ti.func
    def add_partials(self, arena: ti.template(), weights: ti.template(), io: ti.template(),
                     channels: ti.template()):
        for flat in range(self.n_out):
            acc = self.bias(arena, weights, io, flat % channels)
            for s in range(self.splits):
                acc += self.scratch.load(arena, weights, io, s * self.n_out + flat)
            self.out.store(arena, io, flat, activation(acc, self.act))


@ti.data_oriented
class ConvStep(SplitKStep):
    """CONV_2D (grouped too) and DEPTHWISE_CONV_2D as one gather. Output channel `co` reads
    input channels (co // per_group) * c_f + c, c < c_f; its filter tap (i, j), channel c is
    filter element co * w_co + (i * k_w + j) * w_tap + c * w_c.
    CONV_2D packed [H, W, I/groups, O]: w_co = 1, w_tap = c_f*O, w_c = O (as stored [O, H, W,
    I/groups]: w_co = H*W*c_f, w_tap = c_f, w_c = 1).
    DEPTHWISE [1, H, W, C*M]:   c_f = 1, per_group = M, w_co = 1, w_tap = C*M."""

    def __init__(self, x, w, b, out, k, s, d, pad, c_f, per_group, w_strides, act, scratch=None,
                 splits=1):
        self.x, self.w, self.out = x, w, out
        self.has_bias = b is not None
        self.b = b if b is not None else w          # never read without a bias
        _, self.in_h, self.in_w, self.c_in = x.shape
        self.k_h, self.k_w = k
        self.s_h, self.s_w = s
        self.d_h, self.d_w = d
        self.pad_top, self.pad_left = pad
        self.c_f, self.per_group = c_f, per_group
        self.w_co, self.w_tap, self.w_c = w_strides
        self.act = act
        self.splits = splits if scratch is not None else 1
        self.scratch = scratch if scratch is not None else out
        self.chunk = -(-c_f // self.splits)
        self.n_out = out.size

    @ti.func
    def partial(self, arena: ti.template(), weights: ti.template(), io: ti.template(),
                n, oy, ox, co, c_lo, c_hi):
        acc = 0.0
        c0 = (co // self.per_group) * self.c_f
        for i in range(self.k_h):
            iy = oy * self.s_h - self.pad_top + i * self.d_h
            if (iy >= 0) and (iy < self.in_h):
                for j in range(self.k_w):
                    ix = ox * self.s_w - self.pad_left + j * self.d_w
                    if (ix >= 0) and (ix < self.in_w):
                        xb = ((n * self.in_h + iy) * self.in_w + ix) * self.c_in + c0
                        wb = co * self.w_co + (i * self.k_w + j) * self.w_tap
                        for c in range(c_lo, c_hi):
                            acc += (self.x.load(arena, weights, io, xb + c)
                                    * self.w.load(arena, weights, io, wb + c * self.w_c))
        return acc

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        if ti.static(self.splits == 1):
            for n, oy, ox, co in ti.ndrange(*self.out.shape):
                acc = self.bias(arena, weights, io, co) + self.partial(arena, weights, io, n, oy, ox, co, 0, self.c_f)
                flat = ((n * self.out.shape[1] + oy) * self.out.shape[2] + ox) * self.out.shape[3] + co
                self.out.store(arena, io, flat, activation(acc, self.act))
        else:
            for s, n, oy, ox, co in ti.ndrange(self.splits, *self.out.shape):
                lo = s * self.chunk
                flat = ((n * self.out.shape[1] + oy) * self.out.shape[2] + ox) * self.out.shape[3] + co
                self.scratch.store(arena, io, s * self.n_out + flat, self.partial(
                    arena, weights, io, n, oy, ox, co, lo, ti.min(lo + self.chunk, self.c_f)))
            self.add_partials(arena, weights, io, self.out.shape[3])


PIXEL_TILE = 4     # pixels per thread in a pointwise conv: each weight load feeds 4 FMAs


def pointwise_splits(pixels: int, c_in: int, c_out: int) -> int:
    """Partial sums per output of a PointwiseConvStep: its threads (a PIXEL_TILE of pixels by
    one output channel each) counted, not its outputs, so a classifier tail's 14x14x512 conv
    (25K threads of 512 terms) splits in 3 and its 7x7x1024 one in 5.
    TFLITE_TAICHI_POINTWISE_SPLIT=0 (bench/'s A/B switch) counts outputs, as other convs do."""
    if not switches.value("TFLITE_TAICHI_POINTWISE_SPLIT"):
        return split_k(pixels * c_out, c_in)
    return split_count(-(-pixels // PIXEL_TILE) * c_out, c_in, SPLIT_K_MIN_TERMS)


@ti.data_oriented
class PointwiseConvStep(SplitKStep):
    """A 1x1, stride-1, ungrouped CONV_2D (most of a MobileNet's work) as a matrix product with
    register tiling: each thread computes PIXEL_TILE neighbouring pixels of one output channel,
    so every weight it loads (packed [I, O], coalesced across the warp) feeds PIXEL_TILE
    multiply-adds, and the pixels' inputs are the same for the whole warp (broadcast).
    With `splits` > 1 (pointwise_splits: too few threads to fill a GPU) each thread sums one
    chunk of the input channels into scratch, and a second task adds the chunks, the bias and
    the activation."""

    def __init__(self, x, w, b, out, act, scratch=None, splits=1):
        self.x, self.w, self.out = x, w, out
        self.has_bias = b is not None
        self.b = b if b is not None else w
        self.c_in = x.shape[3]
        self.c_out = out.shape[3]
        self.pixels = out.size // self.c_out
        self.tiles = -(-self.pixels // PIXEL_TILE)
        self.act = act
        self.splits = splits if scratch is not None else 1
        self.scratch = scratch if scratch is not None else out
        self.chunk = -(-self.c_in // self.splits)
        self.n_out = out.size

    @ti.func
    def tile_sums(self, arena: ti.template(), weights: ti.template(), io: ti.template(),
                  tile, co, c_lo, c_hi, start):
        """Sums over input channels [c_lo, c_hi) for the tile's pixels, each from `start`."""
        acc = ti.Vector([start] * PIXEL_TILE)
        p0 = tile * PIXEL_TILE
        for c in range(c_lo, c_hi):
            wv = self.w.load(arena, weights, io, c * self.c_out + co)
            for t in ti.static(range(PIXEL_TILE)):
                p = ti.min(p0 + t, self.pixels - 1)     # a last, partial tile re-reads
                acc[t] += self.x.load(arena, weights, io, p * self.c_in + c) * wv
        return acc

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        if ti.static(self.splits == 1):
            for tile, co in ti.ndrange(self.tiles, self.c_out):
                acc = self.tile_sums(arena, weights, io, tile, co, 0, self.c_in,
                                     self.bias(arena, weights, io, co))
                p0 = tile * PIXEL_TILE
                for t in ti.static(range(PIXEL_TILE)):
                    if p0 + t < self.pixels:
                        self.out.store(arena, io, (p0 + t) * self.c_out + co,
                                       activation(acc[t], self.act))
        else:
            for s, tile, co in ti.ndrange(self.splits, self.tiles, self.c_out):
                lo = s * self.chunk
                acc = self.tile_sums(arena, weights, io, tile, co, lo,
                                     ti.min(lo + self.chunk, self.c_in), 0.0)
                p0 = tile * PIXEL_TILE
                for t in ti.static(range(PIXEL_TILE)):
                    if p0 + t < self.pixels:
                        self.scratch.store(arena, io, s * self.n_out + (p0 + t) * self.c_out + co,
                                           acc[t])
            self.add_partials(arena, weights, io, self.c_out)


# Shared-memory GEMM tiles: out[M, N] = x[M, K] @ w[K, N] (+ bias, activation), for a pointwise
# CONV_2D (M pixels, K input channels, N output channels, filter packed [I, O]) and a
# FULLY_CONNECTED with enough rows (weights packed [D, U]). A block owns a tile_m x tile_n tile of
# the output; per step of GEMM_K reduction terms it stages an x tile and a w tile in shared
# memory (each element read from global memory once per block instead of once per thread), then
# every thread accumulates a micro_m x micro_n register tile of pixels x channels from them.
GEMM_K = 16
GEMM_CONFIG = (64, 64, 4, 4)        # tile_m, tile_n, micro_m, micro_n: 256 threads a block
# Below this many tiles the op runs as the register-tiled gather (PointwiseConvStep). Measured on
# the H200 (bench/results/gemm_tiles.md): in whole batch-1 models a kernel with tiled ops ran
# slower (MobileNet v1 on cuda 1.2-1.5 ms against 0.83-1.0 ms without, alternating in one
# process), although an isolated chain of 112x112x64 layers ran 15% faster tiled; at batch 32,
# tiling every pointwise conv and FC raised MobileNet from 1436 to 2368 images/s on cuda and
# from 1179 to 1717 on vulkan. Batch-1 ops of the models here have at most 256 tiles, batch-32
# MobileNet's at least 400: tiles are for batches (and very large images).
GEMM_MIN_BLOCKS = 400
# The small-grid class, on Vulkan: a product with too few 64x64 tiles to fill the GPU but at
# least SMALL_GRID_MIN_BLOCKS of 32x32 (PoseNet's and DeepLab's 17x17 and 33x33 pointwise convs
# of 256-1024 channels) runs as 32x32 tiles of 2x2 per thread. Measured on the H200 with our own
# Vulkan submissions (bench/results/issue31_gemm_h200.md): an isolated 17x17 1024->1024 layer
# 430 -> 157 us, 33x33x256 93 -> 65 us; whole PoseNet 1.08-1.15 -> 0.86-0.89 ms, DeepLab v3 and
# MobileNet v2 level or 2-7% faster, alternating in one process. On cuda the same selection ran
# whole PoseNet 5-10% slower (the gather's 17x17 1024->1024 layer is 152 us there already), so
# cuda keeps the gather; other archs with shared memory are unmeasured and keep it too.
SMALL_GRID_CONFIG = (32, 32, 2, 2)
SMALL_GRID_MIN_BLOCKS = 150
SMALL_GRID_ARCHS = frozenset({"vulkan"})


def gemm_min_blocks() -> int:
    """GEMM_MIN_BLOCKS; tests lower it (TFLITE_TAICHI_GEMM_MIN_BLOCKS) to reach the tiled
    kernel with shapes small enough for a software rasteriser."""
    given = switches.value("TFLITE_TAICHI_GEMM_MIN_BLOCKS")
    return GEMM_MIN_BLOCKS if given is None else given


def gemm_blocks(m: int, n: int, config: tuple = GEMM_CONFIG) -> int:
    return -(-m // config[0]) * -(-n // config[1])


def gemm_choice(m: int, n: int, k: int, arch: str):
    """The tile shape (tile_m, tile_n, micro_m, micro_n) a [m, k] @ [k, n] product runs with on
    Taichi arch `arch` (the step's StepIO.arch), or None for the register-tiled gather: an arch with
    block-shared memory, a reduction long enough to stage, and enough tiles of a measured class.
    TFLITE_TAICHI_GEMM_TILES forces one shape from gemm_min_blocks() tiles (bench/gemm_micro.py)."""
    if not kit.has_shared_memory(arch) or k < GEMM_K:
        return None
    forced = switches.value("TFLITE_TAICHI_GEMM_TILES")
    if forced:
        return forced if gemm_blocks(m, n, forced) >= gemm_min_blocks() else None
    if gemm_blocks(m, n, GEMM_CONFIG) >= gemm_min_blocks():
        return GEMM_CONFIG
    if arch in SMALL_GRID_ARCHS and gemm_blocks(m, n, SMALL_GRID_CONFIG) >= SMALL_GRID_MIN_BLOCKS:
        return SMALL_GRID_CONFIG
    return None


@ti.data_oriented
class GemmTileStep:
    """Row-major x [M, K] times packed weights [K, N] into out [M, N], in shared-memory tiles.

    Thread t of a block computes rows (t // lanes_n) + lanes_m * i and columns
    (t % lanes_n) + lanes_n * j of the block's tile (i < micro_m, j < micro_n): neighbouring
    threads read neighbouring w columns (no shared-memory bank conflicts) and write neighbouring
    output addresses (coalesced); the threads of one row read the same x value (a broadcast)."""

    def __init__(self, x, w, b, out, m, k, n, act, config):
        self.x, self.w, self.out = x, w, out
        self.has_bias = b is not None
        self.b = b if b is not None else w
        self.m, self.k, self.n = m, k, n
        self.tile_m, self.tile_n, self.micro_m, self.micro_n = config
        self.lanes_m = self.tile_m // self.micro_m
        self.lanes_n = self.tile_n // self.micro_n
        self.threads = self.lanes_m * self.lanes_n
        self.x_loads = -(-self.tile_m * GEMM_K // self.threads)    # staged elements per thread
        self.w_loads = -(-self.tile_n * GEMM_K // self.threads)
        self.blocks_n = -(-n // self.tile_n)
        self.blocks = gemm_blocks(m, n, (self.tile_m, self.tile_n))
        self.k_steps = -(-k // GEMM_K)
        self.act = act

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        ti.loop_config(block_dim=self.threads)
        for i in range(self.blocks * self.threads):
            block, t = i // self.threads, i % self.threads
            row0 = (block // self.blocks_n) * self.tile_m
            col0 = (block % self.blocks_n) * self.tile_n
            ty, tx = t // self.lanes_n, t % self.lanes_n
            xs = ti.simt.block.SharedArray((self.tile_m, GEMM_K), ti.f32)
            ws = ti.simt.block.SharedArray((GEMM_K, self.tile_n), ti.f32)
            acc = ti.Matrix([[0.0] * self.micro_n for _ in range(self.micro_m)])
            for ks in range(self.k_steps):
                k0 = ks * GEMM_K
                # stage the tiles, the fastest index along contiguous memory (x rows along k,
                # w rows along n); out-of-range elements are zeros
                for l in ti.static(range(self.x_loads)):
                    e = t + l * self.threads
                    r, c = e // GEMM_K, e % GEMM_K
                    if r < self.tile_m:
                        v = 0.0
                        if (row0 + r < self.m) and (k0 + c < self.k):
                            v = self.x.load(arena, weights, io, (row0 + r) * self.k + k0 + c)
                        xs[r, c] = v
                for l in ti.static(range(self.w_loads)):
                    e = t + l * self.threads
                    r, c = e // self.tile_n, e % self.tile_n
                    if r < GEMM_K:
                        v = 0.0
                        if (k0 + r < self.k) and (col0 + c < self.n):
                            v = self.w.load(arena, weights, io, (k0 + r) * self.n + col0 + c)
                        ws[r, c] = v
                ti.simt.block.sync()
                for kk in range(GEMM_K):
                    xv = ti.Vector([xs[ty + self.lanes_m * a, kk] for a in ti.static(range(self.micro_m))])
                    wv = ti.Vector([ws[kk, tx + self.lanes_n * c] for c in ti.static(range(self.micro_n))])
                    acc += xv.outer_product(wv)
                ti.simt.block.sync()
            for a, c in ti.static(ti.ndrange(self.micro_m, self.micro_n)):
                row = row0 + ty + self.lanes_m * a
                col = col0 + tx + self.lanes_n * c
                if (row < self.m) and (col < self.n):
                    v = acc[a, c]
                    if ti.static(self.has_bias):
                        v += self.b.load(arena, weights, io, col)
                    self.out.store(arena, io, row * self.n + col, activation(v, self.act))


@ti.data_oriented
class TransposeConvStep:
    """TRANSPOSE_CONV and Convolution2DTransposeBias, as a gather over the output: output
    (oy, ox) takes input pixel iy with iy * s_h + i - pad_top == oy, i.e. the taps
    i = (oy + pad_top) mod s_h + a * s_h. Weights [O, H, W, I]."""

    def __init__(self, x, w, b, out, s, pad, act, kernel_size, packed):
        self.x, self.w, self.out = x, w, out
        self.has_bias = b is not None
        self.b = b if b is not None else w
        _, self.in_h, self.in_w, self.c_in = x.shape
        self.k_h, self.k_w = kernel_size
        c_out = out.shape[3]
        # weight (co, i, j, c) at co*w_co + (i*k_w + j)*w_tap + c*w_c: packed [H, W, I, O] or [O, H, W, I]
        self.w_co, self.w_tap, self.w_c = ((1, self.c_in * c_out, c_out) if packed
                                           else (self.k_h * self.k_w * self.c_in, self.c_in, 1))
        self.s_h, self.s_w = s
        self.pad_top, self.pad_left = pad
        self.n_i = -(-self.k_h // self.s_h)     # taps of one residue class, at most
        self.n_j = -(-self.k_w // self.s_w)
        self.act = act

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        for n, oy, ox, co in ti.ndrange(*self.out.shape):
            acc = 0.0
            if ti.static(self.has_bias):
                acc = self.b.load(arena, weights, io, co)
            ty = oy + self.pad_top
            tx = ox + self.pad_left
            for a in range(self.n_i):
                i = ty % self.s_h + a * self.s_h
                iy = (ty - i) // self.s_h
                if (i < self.k_h) and (iy >= 0) and (iy < self.in_h):
                    for bj in range(self.n_j):
                        j = tx % self.s_w + bj * self.s_w
                        ix = (tx - j) // self.s_w
                        if (j < self.k_w) and (ix >= 0) and (ix < self.in_w):
                            xb = ((n * self.in_h + iy) * self.in_w + ix) * self.c_in
                            wb = co * self.w_co + (i * self.k_w + j) * self.w_tap
                            for c in range(self.c_in):
                                acc += (self.x.load(arena, weights, io, xb + c)
                                        * self.w.load(arena, weights, io, wb + c * self.w_c))
            flat = ((n * self.out.shape[1] + oy) * self.out.shape[2] + ox) * self.out.shape[3] + co
            self.out.store(arena, io, flat, activation(acc, self.act))


@ti.data_oriented
class FullyConnectedStep(SplitKStep):
    """out[r, u] = bias[u] + sum_d x[r * depth + d] * w[u * depth + d] (row-major flat views)."""

    def __init__(self, x, w, b, out, depth, units, act, packed, scratch=None, splits=1):
        self.x, self.w, self.out = x, w, out
        self.has_bias = b is not None
        self.b = b if b is not None else w
        self.depth = depth
        self.units = units
        self.rows = out.size // self.units
        self.act = act
        # weight (u, d) at u*w_u + d*w_d: packed [D, U] (units innermost) or as stored [U, D]
        self.w_u, self.w_d = (1, units) if packed else (depth, 1)
        self.splits = splits if scratch is not None else 1
        self.scratch = scratch if scratch is not None else out
        self.chunk = -(-depth // self.splits)
        self.n_out = self.rows * units

    @ti.func
    def partial(self, arena: ti.template(), weights: ti.template(), io: ti.template(), r, u, lo, hi):
        acc = 0.0
        for d in range(lo, hi):
            acc += (self.x.load(arena, weights, io, r * self.depth + d)
                    * self.w.load(arena, weights, io, u * self.w_u + d * self.w_d))
        return acc

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        if ti.static(self.splits == 1):
            for r, u in ti.ndrange(self.rows, self.units):
                acc = self.partial(arena, weights, io, r, u, 0, self.depth)
                if ti.static(self.has_bias):
                    acc += self.b.load(arena, weights, io, u)
                self.out.store(arena, io, r * self.units + u, activation(acc, self.act))
        else:
            for s, r, u in ti.ndrange(self.splits, self.rows, self.units):
                lo = s * self.chunk
                self.scratch.store(arena, io, s * self.n_out + r * self.units + u, self.partial(
                    arena, weights, io, r, u, lo, ti.min(lo + self.chunk, self.depth)))
            self.add_partials(arena, weights, io, self.units)


def _data_inputs_supported(node, *indices):
    """The delegate reads these inputs through the arena or the weights buffer: a constant that
    neither carries (e.g. an int8 filter without quantization) stays on the CPU."""
    for i in indices:
        spec = node.inputs[i] if i < len(node.inputs) else None
        if spec is None or spec.value is None:
            continue
        if not (np.dtype(spec.dtype).kind == "f" or is_float_view(spec.dtype, spec.quantization)):
            return (f"constant input {i} ('{spec.name}') is {np.dtype(spec.dtype).name} without "
                    "quantization; the delegate reads float (or quantized) weights")
    return None


def _bias_ref(io, i):
    return io.inputs[i] if i < len(io.inputs) else None


# -- CONV_2D ----------------------------------------------------------------------------------
@dataclass(frozen=True)
class ConvOptions:
    padding: int = PADDING_SAME
    stride_h: int = 1
    stride_w: int = 1
    dilation_h: int = 1
    dilation_w: int = 1
    fused_activation_function: int = 0
    depth_multiplier: int = 0          # DEPTHWISE_CONV_2D only


def _parse_conv(opts) -> ConvOptions:
    return ConvOptions(padding=int(opts.Padding()), stride_h=int(opts.StrideH()),
                       stride_w=int(opts.StrideW()), dilation_h=int(opts.DilationHFactor()),
                       dilation_w=int(opts.DilationWFactor()),
                       fused_activation_function=int(opts.FusedActivationFunction()))


def _parse_depthwise(opts) -> ConvOptions:
    return ConvOptions(padding=int(opts.Padding()), stride_h=int(opts.StrideH()),
                       stride_w=int(opts.StrideW()), dilation_h=int(opts.DilationHFactor()),
                       dilation_w=int(opts.DilationWFactor()),
                       fused_activation_function=int(opts.FusedActivationFunction()),
                       depth_multiplier=int(opts.DepthMultiplier()))


def _check_conv_options(node):
    o = node.options
    check_padding(node, o.padding)
    check_activation(node, o.fused_activation_function)
    positive_ints(node, "strides", o.stride_h, o.stride_w)
    positive_ints(node, "dilation factors", o.dilation_h, o.dilation_w)


def _conv_geometry(node, k_h, k_w):
    o = node.options
    _, in_h, in_w, _ = node.inputs[0].shape
    return spatial_geometry(node, o.padding, in_h, in_w, k_h, k_w, o.stride_h, o.stride_w,
                            o.dilation_h, o.dilation_w)


def _infer_conv(node):
    _check_conv_options(node)
    n, _, _, c_in = _require_rank(node, 0, 4, "input")
    c_out, k_h, k_w, c_f = _require_rank(node, 1, 4, "filter")
    if c_f < 1 or c_in % c_f:
        raise node.fail(f"input channels ({c_in}) must be a multiple of the filter's input "
                        f"channels ({c_f})")
    groups = c_in // c_f
    if groups < 1 or c_out % groups:
        raise node.fail(f"output channels ({c_out}) must be a multiple of the number of "
                        f"groups ({groups} = {c_in} input channels / {c_f} per filter)")
    positive_ints(node, "filter size", k_h, k_w)
    _check_bias(node, 2, c_out)
    out_h, out_w, _, _ = _conv_geometry(node, k_h, k_w)
    return [(n, out_h, out_w, c_out)]


def _conv_patches(node, x, k_h, k_w):
    """im2col of a CONV_2D / DEPTHWISE_CONV_2D input: (patches, out_h, out_w)."""
    o = node.options
    out_h, out_w, pad_top, pad_left = _conv_geometry(node, k_h, k_w)
    p = extract_patches(x, k_h, k_w, o.stride_h, o.stride_w, o.dilation_h, o.dilation_w,
                        pad_top, pad_left, out_h, out_w)
    return p, out_h, out_w


def _reference_conv(node, inputs):
    o = node.options
    x, w = _float(inputs[0]), _float(inputs[1])
    bias = inputs[2] if len(inputs) > 2 else None
    c_out, k_h, k_w, c_f = w.shape
    n, _, _, c_in = x.shape
    groups = c_in // c_f
    out_h, out_w, pad_top, pad_left = _conv_geometry(node, k_h, k_w)
    if groups == 1 and (k_h, k_w, o.stride_h, o.stride_w) == (1, 1, 1, 1):
        # a pointwise conv is one matrix product (BLAS), no patches
        out = x.reshape(-1, c_in) @ w.reshape(c_out, c_in).T
    elif groups == 1:
        # im2col, then one matrix product with the filter as [taps * channels, c_out]
        p, _, _ = _conv_patches(node, x, k_h, k_w)
        out = p.reshape(-1, k_h * k_w * c_f) @ w.transpose(1, 2, 3, 0).reshape(-1, c_out)
    else:
        p, _, _ = _conv_patches(node, x, k_h, k_w)
        p = p.reshape(n, out_h, out_w, k_h, k_w, groups, c_f)
        wg = w.reshape(groups, c_out // groups, k_h, k_w, c_f)
        out = np.einsum("nyxijgc,goijc->nyxgo", p, wg, optimize=True)
    out = _add_bias(out.reshape(n, out_h, out_w, c_out), bias)
    return [apply_activation(out, o.fused_activation_function)]


def _float_bytes(spec) -> int:
    """Bytes per element of a reference's float working arrays (_float: float64 stays)."""
    return 8 if spec.dtype is not None and np.dtype(spec.dtype) == np.float64 else 4


def _padded_bytes(node, k_h, k_w) -> int:
    """The zero-padded copy of the input tap_windows makes."""
    n, in_h, in_w, c_in = node.inputs[0].shape
    return n * (in_h + k_h * node.options.dilation_h) * (in_w + k_w * node.options.dilation_w) * c_in


def _conv_temp_bytes(node) -> int:
    """The reference's patches (im2col: every output pixel's window, k_h x k_w times the input;
    a 64x64 filter over a 512x512 input makes 4 GiB of them for a 1 MiB output), the padded
    input and, grouped, the einsum's copy of the patches."""
    o = node.options
    c_out, k_h, k_w, c_f = node.inputs[1].shape
    n, _, _, c_in = node.inputs[0].shape
    grouped = c_f != c_in
    if not grouped and (k_h, k_w, o.stride_h, o.stride_w) == (1, 1, 1, 1):
        return 0                    # one matrix product on the input as it is
    _, out_h, out_w, _ = node.outputs[0].shape
    patches = n * out_h * out_w * k_h * k_w * c_in
    elements = patches * (2 if grouped else 1) + _padded_bytes(node, k_h, k_w)
    return elements * _float_bytes(node.inputs[0])


def _runs_pointwise(node) -> bool:
    """A 1x1, stride-1, ungrouped conv with a constant (packed) filter: PointwiseConvStep."""
    o = node.options
    c_out, k_h, k_w, c_f = node.inputs[1].shape
    return (node.inputs[1].value is not None and node.inputs[0].shape[3] == c_f
            and (k_h, k_w, o.stride_h, o.stride_w) == (1, 1, 1, 1))


def _conv_splits(node) -> int:
    c_out, _, _, c_f = node.inputs[1].shape
    if _runs_pointwise(node):
        return pointwise_splits(int(np.prod(node.outputs[0].shape[:3])), c_f, c_out)
    return split_k(int(np.prod(node.outputs[0].shape)), c_f)


def _conv_scratch(node) -> int:
    return _split_k_scratch(node, _conv_splits(node))


def _pack_filter_out_channels_last(node, i, value):
    """[O, H, W, I] -> [H, W, I, O]: output channels innermost, as the threads run."""
    return value.transpose(1, 2, 3, 0) if i == 1 else None


def _conv_taichi(node, io):
    o = node.options
    c_out, k_h, k_w, c_f = node.inputs[1].shape
    groups = node.inputs[0].shape[3] // c_f
    _, _, pad_top, pad_left = _conv_geometry(node, k_h, k_w)
    packed = node.inputs[1].value is not None          # constants are packed by the planner
    splits = _conv_splits(node)
    pointwise = (groups == 1 and (k_h, k_w, o.stride_h, o.stride_w) == (1, 1, 1, 1))
    pixels = int(np.prod(node.outputs[0].shape[:3]))
    tiles = gemm_choice(pixels, c_out, c_f, io.arch) if packed and pointwise else None
    if tiles and _scratch_ref(io, splits) is None:
        return GemmTileStep(io.inputs[0], io.inputs[1], _bias_ref(io, 2), io.outputs[0],
                            pixels, c_f, c_out, o.fused_activation_function, tiles)
    if packed and pointwise:
        return PointwiseConvStep(io.inputs[0], io.inputs[1], _bias_ref(io, 2), io.outputs[0],
                                 o.fused_activation_function, _scratch_ref(io, splits), splits)
    return ConvStep(io.inputs[0], io.inputs[1], _bias_ref(io, 2), io.outputs[0], (k_h, k_w),
                    (o.stride_h, o.stride_w), (o.dilation_h, o.dilation_w), (pad_top, pad_left),
                    c_f=c_f, per_group=c_out // groups,
                    w_strides=(1, c_f * c_out, c_out) if packed else (k_h * k_w * c_f, c_f, 1),
                    act=o.fused_activation_function, scratch=_scratch_ref(io, splits), splits=splits)


def _conv_supports(node):
    return _data_inputs_supported(node, 0, 1, 2)


# numpy_faster_on_cpu: on a machine without a hardware GPU, backend='auto' keeps these ops on
# numpy rather than Taichi's cpu backend, which is slower for them (BLAS matrix products;
# depthwise as tap-by-tap vector multiply-adds): measured per op on the shared models,
# bench/results/cpu_2core.md.
CONV_2D = register_op(OpDef(
    name="CONV_2D", infer=_infer_conv, reference=_reference_conv, parse=_parse_conv,
    options_class="Conv2DOptions", supports=_conv_supports, taichi=_conv_taichi,
    pack=_pack_filter_out_channels_last, scratch=_conv_scratch, min_inputs=2, max_inputs=3,
    fusion=Fusion(stores_once=True), litert_checks_omitted_inputs=True,
    numpy_faster_on_cpu=True, temp_bytes=_conv_temp_bytes))


# -- DEPTHWISE_CONV_2D -------------------------------------------------------------------------
def _infer_depthwise(node):
    _check_conv_options(node)
    n, _, _, c_in = _require_rank(node, 0, 4, "input")
    one, k_h, k_w, c_out = _require_rank(node, 1, 4, "filter")
    if one != 1:
        raise node.fail(f"filter must have shape [1, H, W, C*M], has {list(node.inputs[1].shape)}")
    positive_ints(node, "filter size", k_h, k_w)
    if c_in < 1 or c_out % c_in:
        raise node.fail(f"filter channels ({c_out}) must be a multiple of the input channels "
                        f"({c_in})")
    # The depth multiplier is c_out / c_in. Like LiteRT, the options' depth_multiplier is not
    # checked: converters have written inconsistent values, and LiteRT derives it from shapes.
    _check_bias(node, 2, c_out)
    out_h, out_w, _, _ = _conv_geometry(node, k_h, k_w)
    return [(n, out_h, out_w, c_out)]


def _reference_depthwise(node, inputs):
    o = node.options
    x, w = _float(inputs[0]), _float(inputs[1])
    bias = inputs[2] if len(inputs) > 2 else None
    _, k_h, k_w, c_out = w.shape
    n, _, _, c_in = x.shape
    mult = c_out // c_in
    o_ = node.options
    out_h, out_w, pad_top, pad_left = _conv_geometry(node, k_h, k_w)
    # output channel c*mult + m reads input channel c: accumulate tap by tap, each a broadcast
    # multiply of the window the tap sees (no patches: a depthwise tap has no reduction)
    w = w.reshape(k_h, k_w, c_in, mult)
    out = np.zeros((n, out_h, out_w, c_in, mult), dtype=np.result_type(x.dtype, w.dtype))
    for i, j, window in tap_windows(x, k_h, k_w, o_.stride_h, o_.stride_w, o_.dilation_h,
                                    o_.dilation_w, pad_top, pad_left, out_h, out_w):
        out += window[..., None] * w[i, j]
    out = _add_bias(out.reshape(n, out_h, out_w, c_out), bias)
    return [apply_activation(out, o.fused_activation_function)]


def _depthwise_taichi(node, io):
    o = node.options
    _, k_h, k_w, c_out = node.inputs[1].shape
    mult = c_out // node.inputs[0].shape[3]
    _, _, pad_top, pad_left = _conv_geometry(node, k_h, k_w)
    return ConvStep(io.inputs[0], io.inputs[1], _bias_ref(io, 2), io.outputs[0], (k_h, k_w),
                    (o.stride_h, o.stride_w), (o.dilation_h, o.dilation_w), (pad_top, pad_left),
                    c_f=1, per_group=mult, w_strides=(1, c_out, 0),
                    act=o.fused_activation_function)


DEPTHWISE_CONV_2D = register_op(OpDef(
    name="DEPTHWISE_CONV_2D", infer=_infer_depthwise, reference=_reference_depthwise,
    parse=_parse_depthwise, options_class="DepthwiseConv2DOptions", supports=_conv_supports,
    taichi=_depthwise_taichi, min_inputs=2, max_inputs=3, fusion=Fusion(stores_once=True),
    numpy_faster_on_cpu=True, litert_checks_omitted_inputs=True))   # see CONV_2D


# -- TRANSPOSE_CONV ----------------------------------------------------------------------------
@dataclass(frozen=True)
class TransposeConvOptions:
    padding: int = PADDING_SAME
    stride_h: int = 1
    stride_w: int = 1
    fused_activation_function: int = 0


def _parse_transpose_conv(opts) -> TransposeConvOptions:
    return TransposeConvOptions(padding=int(opts.Padding()), stride_h=int(opts.StrideH()),
                                stride_w=int(opts.StrideW()),
                                fused_activation_function=int(opts.FusedActivationFunction()))


def _transpose_conv_padding(node, out_h, out_w, k_h, k_w):
    """TFLite pads a transpose conv as the forward conv from its output back to its input:
    ComputePaddingHeightWidth on the output's size (dilation 1), offset dropped."""
    o = node.options
    fwd_h = conv_output_size(o.padding, out_h, k_h, o.stride_h)
    fwd_w = conv_output_size(o.padding, out_w, k_w, o.stride_w)
    return (conv_padding_before(o.padding, out_h, k_h, o.stride_h, 1, fwd_h),
            conv_padding_before(o.padding, out_w, k_w, o.stride_w, 1, fwd_w))


def _infer_transpose_conv(node):
    o = node.options
    check_padding(node, o.padding)
    check_activation(node, o.fused_activation_function)
    positive_ints(node, "strides", o.stride_h, o.stride_w)
    shape_spec = node.inputs[0]
    if shape_spec.dtype is not None and np.dtype(shape_spec.dtype) != np.int32:
        raise node.fail(f"output_shape must be int32, is {np.dtype(shape_spec.dtype)}")
    out_shape = np.asarray(node.input_value(0, "output_shape")).reshape(-1)
    if out_shape.size != 4:
        raise node.fail(f"output_shape must hold 4 values (NHWC), holds {out_shape.tolist()}")
    out_shape = tuple(int(d) for d in out_shape)
    c_out, k_h, k_w, c_w = _require_rank(node, 1, 4, "weights")
    n, _, _, c_in = _require_rank(node, 2, 4, "input")
    positive_ints(node, "weights size", k_h, k_w)
    if c_in != c_w:
        raise node.fail(f"input channels ({c_in}) != the weights' input channels ({c_w})")
    if out_shape[0] != n or out_shape[3] != c_out or min(out_shape) < 1:
        raise node.fail(f"output_shape {list(out_shape)} does not match batch {n} and "
                        f"{c_out} output channels")
    _check_bias(node, 3, c_out)
    # LiteRT requires the input to be what the forward conv of output_shape would produce.
    _, in_h, in_w, _ = node.inputs[2].shape
    want = (conv_output_size(o.padding, out_shape[1], k_h, o.stride_h),
            conv_output_size(o.padding, out_shape[2], k_w, o.stride_w))
    if (in_h, in_w) != want:
        raise node.fail(f"input is {in_h}x{in_w}, but a {_PADDING_NAMES[o.padding]} "
                        f"{k_h}x{k_w} stride {o.stride_h}x{o.stride_w} convolution of the "
                        f"{out_shape[1]}x{out_shape[2]} output_shape gives {want[0]}x{want[1]}")
    return [out_shape]


def _transpose_conv(x, w, bias, out_h, out_w, s_h, s_w, pad_top, pad_left):
    """out[n, oy, ox, o] = bias[o] + sum of x[n, iy, ix, c] * w[o, i, j, c] over the input
    pixels and taps with iy*s_h + i - pad_top == oy and ix*s_w + j - pad_left == ox."""
    n, in_h, in_w, _ = x.shape
    c_out, k_h, k_w, _ = w.shape
    # every input pixel times every tap, then scattered onto a canvas holding the whole
    # (uncropped) output; the output is the canvas shifted by the padding
    contrib = np.einsum("nyxc,oijc->nyxijo", x, w, optimize=True)
    full_h = max((in_h - 1) * s_h + k_h, pad_top + out_h)
    full_w = max((in_w - 1) * s_w + k_w, pad_left + out_w)
    canvas = np.zeros((n, full_h, full_w, c_out), dtype=contrib.dtype)
    for i in range(k_h):            # kernel taps only
        for j in range(k_w):
            canvas[:, i: i + (in_h - 1) * s_h + 1: s_h,
                   j: j + (in_w - 1) * s_w + 1: s_w, :] += contrib[:, :, :, i, j, :]
    out = canvas[:, pad_top: pad_top + out_h, pad_left: pad_left + out_w, :]
    return _add_bias(out, bias)


def _transpose_temp_bytes(node, x, w) -> int:
    """_transpose_conv's arrays besides the output: every input pixel times every tap
    (`contrib`, and einsum's copy of it) and the uncropped canvas."""
    n, in_h, in_w, _ = x.shape
    c_out, k_h, k_w, _ = w.shape
    _, out_h, out_w, _ = node.outputs[0].shape
    o = node.options
    contrib = n * in_h * in_w * k_h * k_w * c_out
    canvas = (n * max((in_h - 1) * o.stride_h, out_h) + k_h) * (max((in_w - 1) * o.stride_w, out_w) + k_w) * c_out
    return (2 * contrib + canvas) * _float_bytes(x)


def _transpose_conv_temp_bytes(node) -> int:
    return _transpose_temp_bytes(node, node.inputs[2], node.inputs[1])


def _reference_transpose_conv(node, inputs):
    o = node.options
    w, x = _float(inputs[1]), _float(inputs[2])
    bias = inputs[3] if len(inputs) > 3 else None
    _, out_h, out_w, _ = node.outputs[0].shape
    _, k_h, k_w, _ = w.shape
    pad_top, pad_left = _transpose_conv_padding(node, out_h, out_w, k_h, k_w)
    out = _transpose_conv(x, w, bias, out_h, out_w, o.stride_h, o.stride_w, pad_top, pad_left)
    return [apply_activation(out, o.fused_activation_function)]


def _transpose_conv_taichi(node, io):
    o = node.options
    _, out_h, out_w, _ = node.outputs[0].shape
    _, k_h, k_w, _ = node.inputs[1].shape
    pad = _transpose_conv_padding(node, out_h, out_w, k_h, k_w)
    return TransposeConvStep(io.inputs[2], io.inputs[1], _bias_ref(io, 3), io.outputs[0],
                             (o.stride_h, o.stride_w), pad, o.fused_activation_function,
                             (k_h, k_w), packed=node.inputs[1].value is not None)


def _transpose_conv_supports(node):
    return _data_inputs_supported(node, 1, 2, 3)


TRANSPOSE_CONV = register_op(OpDef(
    name="TRANSPOSE_CONV", infer=_infer_transpose_conv, reference=_reference_transpose_conv,
    parse=_parse_transpose_conv, options_class="TransposeConvOptions",
    supports=_transpose_conv_supports, taichi=_transpose_conv_taichi,
    pack=_pack_filter_out_channels_last, min_inputs=3, max_inputs=4, fusion=Fusion(stores_once=True),
    numpy_faster_on_cpu=True, temp_bytes=_transpose_conv_temp_bytes,   # see CONV_2D
    litert_checks_omitted_inputs=True))


# -- FULLY_CONNECTED ---------------------------------------------------------------------------
WEIGHTS_FORMAT_DEFAULT = 0
_WEIGHTS_FORMAT_NAMES = {0: "DEFAULT", 1: "SHUFFLED4x16INT8"}


@dataclass(frozen=True)
class FullyConnectedOptions:
    fused_activation_function: int = 0
    weights_format: int = WEIGHTS_FORMAT_DEFAULT
    keep_num_dims: bool = False


def _parse_fully_connected(opts) -> FullyConnectedOptions:
    return FullyConnectedOptions(fused_activation_function=int(opts.FusedActivationFunction()),
                                 weights_format=int(opts.WeightsFormat()),
                                 keep_num_dims=bool(opts.KeepNumDims()))


def _infer_fully_connected(node):
    o = node.options
    check_activation(node, o.fused_activation_function)
    if o.weights_format != WEIGHTS_FORMAT_DEFAULT:
        name = _WEIGHTS_FORMAT_NAMES.get(o.weights_format, str(o.weights_format))
        raise node.fail(f"weights_format {name} is not supported (only DEFAULT)")
    in_shape = tuple(node.inputs[0].shape)
    units, depth = _require_rank(node, 1, 2, "weights")
    _check_bias(node, 2, units)
    size = int(np.prod(in_shape, dtype=np.int64))
    if depth < 1 or not in_shape or size % depth:
        raise node.fail(f"input of shape {list(in_shape)} cannot be read as rows of {depth} "
                        "(the weights' second dimension)")
    if o.keep_num_dims:
        if in_shape[-1] != depth:
            raise node.fail(f"keep_num_dims needs the input's last dimension ({in_shape[-1]}) "
                            f"to equal the weights' second dimension ({depth})")
        return [in_shape[:-1] + (units,)]
    return [(size // depth, units)]


def _reference_fully_connected(node, inputs):
    x, w = _float(inputs[0]), _float(inputs[1])
    bias = inputs[2] if len(inputs) > 2 else None
    units, depth = w.shape
    out = _add_bias(x.reshape(-1, depth) @ w.T, bias)
    out = apply_activation(out, node.options.fused_activation_function)
    return [out.reshape(node.outputs[0].shape)]


def _fc_splits(node) -> int:
    return split_k(int(np.prod(node.outputs[0].shape)), node.inputs[1].shape[1])


def _fc_scratch(node) -> int:
    return _split_k_scratch(node, _fc_splits(node))


def _pack_fc_weights(node, i, value):
    """[U, D] -> [D, U]: units innermost, as the threads run."""
    return value.T if i == 1 else None


def _fully_connected_taichi(node, io):
    units, depth = node.inputs[1].shape
    splits = _fc_splits(node)
    rows = int(np.prod(node.outputs[0].shape)) // units
    packed = node.inputs[1].value is not None
    tiles = gemm_choice(rows, units, depth, io.arch) if packed and splits == 1 else None
    if tiles:
        return GemmTileStep(io.inputs[0], io.inputs[1], _bias_ref(io, 2), io.outputs[0],
                            rows, depth, units, node.options.fused_activation_function, tiles)
    return FullyConnectedStep(io.inputs[0], io.inputs[1], _bias_ref(io, 2), io.outputs[0],
                              depth, units, node.options.fused_activation_function,
                              packed=node.inputs[1].value is not None,
                              scratch=_scratch_ref(io, splits), splits=splits)


FULLY_CONNECTED = register_op(OpDef(
    name="FULLY_CONNECTED", infer=_infer_fully_connected, reference=_reference_fully_connected,
    parse=_parse_fully_connected, options_class="FullyConnectedOptions",
    supports=_conv_supports, taichi=_fully_connected_taichi, pack=_pack_fc_weights,
    scratch=_fc_scratch, min_inputs=2, max_inputs=3, fusion=Fusion(stores_once=True),
    numpy_faster_on_cpu=True, litert_checks_omitted_inputs=True))   # see CONV_2D

# -- CUSTOM:Convolution2DTransposeBias (MediaPipe) ---------------------------------------------
# MediaPipe's transpose conv with a bias input (mediapipe/util/tflite/operations/
# transpose_conv_bias.cc): inputs are the input [N, H, W, I], weights [O, kH, kW, I] and bias
# [O]; custom_options are the raw bytes of a C TfLiteTransposeConvParams, read as its leading
# int32 fields (padding, stride_width, stride_height; newer TFLite appends fields that the op
# ignores). The padding there is the C enum TfLitePadding, not the schema's Padding.
# The output size comes from the input, as MediaPipe's Prepare computes it:
#   SAME:  total pad = max(0, k - (in - 1) % s - 1),  VALID: 0;
#   out = s * (in - 1) + k - total pad,  and the padding before is total pad // 2.
# No fused activation. MediaPipe's kernel takes float32 only.
TFLITE_PADDING_SAME, TFLITE_PADDING_VALID = 1, 2        # TfLitePadding (C API)
_TFLITE_PADDING_NAMES = {TFLITE_PADDING_SAME: "SAME", TFLITE_PADDING_VALID: "VALID"}
TRANSPOSE_CONV_PARAMS = struct.Struct("<iii")           # padding, stride_width, stride_height


@dataclass(frozen=True)
class TransposeConvBiasOptions:
    padding: int          # TfLitePadding: 1 SAME, 2 VALID
    stride_h: int
    stride_w: int


def _parse_transpose_conv_bias(op) -> TransposeConvBiasOptions:
    raw = op.custom_options or b""
    if len(raw) < TRANSPOSE_CONV_PARAMS.size:
        raise ModelError(f"op #{op.index} ({op.name}): custom_options must hold a "
                         "TfLiteTransposeConvParams (padding, stride_width, stride_height as "
                         f"int32: {TRANSPOSE_CONV_PARAMS.size} bytes), has {len(raw)} bytes")
    padding, stride_w, stride_h = TRANSPOSE_CONV_PARAMS.unpack_from(raw)
    return TransposeConvBiasOptions(padding=padding, stride_h=stride_h, stride_w=stride_w)


def _transpose_conv_bias_geometry(node):
    """(out_h, out_w, pad_top, pad_left) as MediaPipe's Prepare and Eval compute them."""
    o = node.options
    _, in_h, in_w, _ = node.inputs[0].shape
    _, k_h, k_w, _ = node.inputs[1].shape
    pad_h = pad_w = 0
    if o.padding == TFLITE_PADDING_SAME:
        pad_h = max(0, k_h - (in_h - 1) % o.stride_h - 1)
        pad_w = max(0, k_w - (in_w - 1) % o.stride_w - 1)
    return (o.stride_h * (in_h - 1) + k_h - pad_h, o.stride_w * (in_w - 1) + k_w - pad_w,
            pad_h // 2, pad_w // 2)


def _infer_transpose_conv_bias(node):
    o = node.options
    if o.padding not in _TFLITE_PADDING_NAMES:
        raise node.fail(f"unknown padding {o.padding} in custom_options (TfLitePadding: "
                        f"{TFLITE_PADDING_SAME} SAME, {TFLITE_PADDING_VALID} VALID)")
    positive_ints(node, "strides", o.stride_h, o.stride_w)
    n, _, _, c_in = _require_rank(node, 0, 4, "input")
    c_out, k_h, k_w, c_w = _require_rank(node, 1, 4, "weights")
    positive_ints(node, "weights size", k_h, k_w)
    if c_in != c_w:
        raise node.fail(f"input channels ({c_in}) != the weights' input channels ({c_w})")
    _require_rank(node, 2, 1, "bias")
    _check_bias(node, 2, c_out)
    for what, spec in (("input", node.inputs[0]), ("weights", node.inputs[1]),
                       ("bias", node.inputs[2]), ("output", node.outputs[0])):
        if spec.dtype is None or np.dtype(spec.dtype) != np.float32:
            dtype = np.dtype(spec.dtype).name if spec.dtype is not None else "untyped"
            raise node.fail(f"{what} is {dtype}; MediaPipe's op takes float32 only")
    out_h, out_w, _, _ = _transpose_conv_bias_geometry(node)
    return [(n, out_h, out_w, c_out)]


def _transpose_conv_bias_temp_bytes(node) -> int:
    return _transpose_temp_bytes(node, node.inputs[0], node.inputs[1])


def _reference_transpose_conv_bias(node, inputs):
    x, w, bias = (_float(v) for v in inputs)
    out_h, out_w, pad_top, pad_left = _transpose_conv_bias_geometry(node)
    o = node.options
    return [_transpose_conv(x, w, bias, out_h, out_w, o.stride_h, o.stride_w, pad_top, pad_left)]


def _transpose_conv_bias_taichi(node, io):
    o = node.options
    _, _, pad_top, pad_left = _transpose_conv_bias_geometry(node)
    _, k_h, k_w, _ = node.inputs[1].shape
    return TransposeConvStep(io.inputs[0], io.inputs[1], io.inputs[2], io.outputs[0],
                             (o.stride_h, o.stride_w), (pad_top, pad_left), 0, (k_h, k_w),
                             packed=node.inputs[1].value is not None)


CONVOLUTION_2D_TRANSPOSE_BIAS = register_op(OpDef(
    name="CUSTOM:Convolution2DTransposeBias", infer=_infer_transpose_conv_bias,
    reference=_reference_transpose_conv_bias, parse=_parse_transpose_conv_bias,
    taichi=_transpose_conv_bias_taichi, pack=_pack_filter_out_channels_last, min_inputs=3,
    max_inputs=3, fusion=Fusion(stores_once=True), numpy_faster_on_cpu=True,
    temp_bytes=_transpose_conv_bias_temp_bytes))   # see CONV_2D

__all__ = ["CONV_2D", "DEPTHWISE_CONV_2D", "TRANSPOSE_CONV", "FULLY_CONNECTED",
           "CONVOLUTION_2D_TRANSPOSE_BIAS", "extract_patches", "spatial_geometry"]
