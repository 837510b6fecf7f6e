"""The convolutions' Taichi steps (the delegate's part): gathers, one thread per output element,
serial loops over the window taps and input channels; a register-tiled 1x1 conv; shared-memory
GEMM tiles; split-K partial sums. Which step and tile shape an instance runs is select.py's.
No `from __future__ import annotations` here: Taichi reads the annotations of the ti.func
methods below.
"""
from ..kit import activation, ti

# -- the steps --------------------------------------------------------------------------------
# Every step is a gather: one thread per output element (a top-level ti.ndrange loop over the
# output, output channels innermost so neighbouring threads write neighbouring addresses),
# serial loops over the window taps and the input channels. All shapes, strides, paddings and
# activations are attributes, hence compile-time constants.
#
# Weights are laid out for that thread order at prepare (`_pack_*`, OpDef.pack): output channels
# innermost, so the threads of a warp read one contiguous run of a filter instead of one value
# every c_in floats.
#
# Split-K (select.py decides how many splits): an op with few outputs and a long reduction is
# split into partial sums per output, written to scratch by one task and added (with bias and
# activation) by a second.


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


def gemm_blocks(m: int, n: int, config: tuple = GEMM_CONFIG) -> int:
    return -(-m // config[0]) * -(-n // config[1])


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

