"""The LSTMs' Taichi steps (the delegate's part): the FULL kernel's time steps in one block with
its state in shared memory, or a thread per batch row with it in scratch (select.py chooses,
per arch), and the BASIC cell's three parallel loops.
No `from __future__ import annotations` here: Taichi reads the annotations of the ti.func
methods below.
"""
from ..common import ACT_TANH
from ..kit import activation, ti
from .layout import (CELL_STATE, CELL_TO_GATE, GATE_BIAS, INPUT, INPUT_TO_GATE, LAYER_NORM,
                     LAYER_NORM_EPSILON, OUTPUT_STATE, PROJECTION_BIAS, PROJECTION_WEIGHTS,
                     RECURRENT_TO_GATE)

# -- the steps ----------------------------------------------------------------------------------
# The FULL kernel (both ops): one parallel task whose threads walk the time steps together.
# The time steps are serial (each needs all of the previous h), so the threads that share one
# sequence must wait for each other between the phases of a step:
# - on archs with block-shared memory (GPUs): one thread block of up to MAX_LANES threads (select.py) takes
#   every batch row; the state (h, c, h' before projection, the layer-norm sums and statistics)
#   lives in shared memory, and the phases are separated by block barriers. Per time step:
#     without layer norm: (batch row, cell) items compute the gates (dot products over the input
#       and the previous h), c' and h' = o * act(c');
#     with layer norm: items for the raw input/forget/cell gate sums, (row, gate) items for
#       their mean and variance, items for c' and the raw output gate sum, rows for its
#       statistics, items for h';
#     then (row, output unit) items project h' (or copy it), write the output and the next h.
# - elsewhere (Taichi's CPU backends have neither, GLES no barriers): one thread per batch row
#   runs the same phases alone, its state in the float32 scratch buffer (OpDef.scratch).
# The first step reads output_state and cell_state from their tensors; h stays float32 between
# steps (the reference's float view), whatever the output's storage. Compile time does not grow
# with the sequence (an unrolled time loop compiled each step as its own task: measured 0.5-1 s
# per step on Taichi's cpu backend, lavapipe and llvmpipe), but for one copy of the block's loop
# per chunk of steps on LOOP_LIMITED_ARCHS (select.py, LOOP_BUDGET).


@ti.func
def _sigmoid_ti(v):
    return 1.0 / (1.0 + ti.exp(-ti.min(ti.max(v, -80.0), 80.0)))


@ti.func
def _cell_act(v, act: ti.template()):
    r = v
    if ti.static(act == ACT_TANH):
        r = ti.tanh(ti.min(ti.max(v, -20.0), 20.0))   # tanh(+-20) is +-1 in float32
    else:
        r = activation(v, act)
    return r


def state_layout(L):
    """(offsets, total size) of the state buffers, in float32 elements."""
    B, C, O = L.n_batch, L.n_cell, L.n_output
    off, at = {}, 0
    for name, size in (("h", B * O), ("c", B * C), ("hc", B * C),
                       ("pre", 4 * B * C if L.layer_norm else 0),
                       ("stat", 8 * B if L.layer_norm else 0)):
        off[name] = at
        at += size
    return off, at


@ti.data_oriented
class SequenceLstmStep:
    def __init__(self, L, opts, refs, out, scratch, plan, state=()):
        """`plan`: select.BlockPlan, where the state lives and how the block runs."""
        self.L, self.out, self.s, self.shared = L, out, scratch, plan.shared
        # where the last h and c go (the variable tensors' slots: StepIO.state), if anywhere
        self.h_last = state[0] if state and L.n_time > 0 else None
        self.c_last = state[1] if len(state) > 1 and L.n_time > 0 else None
        self.writes_h, self.writes_c = self.h_last is not None, self.c_last is not None
        self.act = int(opts.fused_activation_function)
        self.cell_clip = float(opts.cell_clip)
        self.proj_clip = float(opts.proj_clip)
        self.cifg, self.peephole, self.layer_norm = L.cifg, L.peephole, L.layer_norm
        self.projection, self.projection_bias = L.projection, L.projection_bias
        self.diagonal, self.time_major = L.diagonal, L.time_major
        self.T, self.B = L.n_time, L.n_batch
        self.n_input, self.n_cell, self.n_output = L.n_input, L.n_cell, L.n_output
        self.x, self.h0, self.c0 = refs[INPUT], refs[OUTPUT_STATE], refs[CELL_STATE]
        # per gate (input, forget, cell, output); the input gate's are unused with CIFG
        self.w = tuple(refs[i] for i in INPUT_TO_GATE)
        self.r = tuple(refs[i] for i in RECURRENT_TO_GATE)
        self.b = tuple(refs[i] for i in GATE_BIAS)
        self.p = tuple(refs[i] if i is not None else None for i in CELL_TO_GATE)
        self.ln = tuple(refs[i] if i < len(refs) else None for i in LAYER_NORM)
        self.proj_w = refs[PROJECTION_WEIGHTS]
        self.proj_b = refs[PROJECTION_BIAS]
        off, self.state_size = state_layout(L)
        self.h_off, self.c_off, self.hc_off = off["h"], off["c"], off["hc"]
        self.pre_off, self.stat_off = off["pre"], off["stat"]
        # gates whose layer-norm statistics come before the cell update (i unless CIFG, f, c)
        self.early_gates = (1, 2) if L.cifg else (0, 1, 2)
        self.lanes, self.chunks = plan.lanes, plan.chunks

    # -- the state: shared memory (one block) or this row's part of the scratch buffer --------
    @ti.func
    def _ld(self, arena: ti.template(), weights: ti.template(), io: ti.template(),
            sh: ti.template(), i):
        v = 0.0
        if ti.static(self.shared):
            v = sh[i]
        else:
            v = self.s.load(arena, weights, io, i)
        return v

    @ti.func
    def _st(self, arena: ti.template(), io: ti.template(), sh: ti.template(), i, v):
        if ti.static(self.shared):
            sh[i] = v
        else:
            self.s.store(arena, io, i, v)

    @ti.func
    def _sync(self):
        if ti.static(self.shared):
            ti.simt.block.sync()

    # -- reads -------------------------------------------------------------------------------
    @ti.func
    def _x(self, arena: ti.template(), weights: ti.template(), io: ti.template(), t, b, j):
        flat = 0
        if ti.static(self.time_major):
            flat = (t * self.B + b) * self.n_input + j
        else:
            flat = (b * self.T + t) * self.n_input + j
        return self.x.load(arena, weights, io, flat)

    @ti.func
    def _h(self, arena: ti.template(), weights: ti.template(), io: ti.template(),
           sh: ti.template(), t, b, j):
        """h before time step t (output_state for the first)."""
        v = 0.0
        if t == 0:
            v = self.h0.load(arena, weights, io, b * self.n_output + j)
        else:
            v = self._ld(arena, weights, io, sh, self.h_off + b * self.n_output + j)
        return v

    @ti.func
    def _c(self, arena: ti.template(), weights: ti.template(), io: ti.template(),
           sh: ti.template(), t, b, k):
        """c before time step t (cell_state for the first)."""
        v = 0.0
        if t == 0:
            v = self.c0.load(arena, weights, io, b * self.n_cell + k)
        else:
            v = self._ld(arena, weights, io, sh, self.c_off + b * self.n_cell + k)
        return v

    @ti.func
    def _sum(self, arena: ti.template(), weights: ti.template(), io: ti.template(),
             sh: ti.template(), g: ti.template(), t, b, k):
        """W_g x_t + R_g h for batch row b, cell k (no peephole, no bias)."""
        acc = 0.0
        for j in range(self.n_input):
            acc += (self.w[g].load(arena, weights, io, k * self.n_input + j)
                    * self._x(arena, weights, io, t, b, j))
        if ti.static(self.diagonal):
            acc += self.r[g].load(arena, weights, io, k) * self._h(arena, weights, io, sh, t, b, k)
        else:
            for j in range(self.n_output):
                acc += (self.r[g].load(arena, weights, io, k * self.n_output + j)
                        * self._h(arena, weights, io, sh, t, b, j))
        return acc

    @ti.func
    def _normalized(self, arena: ti.template(), weights: ti.template(), io: ti.template(),
                    sh: ti.template(), g: ti.template(), b, k):
        """Layer norm of gate g's raw sum times its coefficient, plus its bias."""
        raw = self._ld(arena, weights, io, sh, self.pre_off + (g * self.B + b) * self.n_cell + k)
        mean = self._ld(arena, weights, io, sh, self.stat_off + (g * self.B + b) * 2)
        rstd = self._ld(arena, weights, io, sh, self.stat_off + (g * self.B + b) * 2 + 1)
        return ((raw - mean) * rstd * self.ln[g].load(arena, weights, io, k)
                + self.b[g].load(arena, weights, io, k))

    @ti.func
    def _statistics(self, arena: ti.template(), weights: ti.template(), io: ti.template(),
                    sh: ti.template(), g: ti.template(), b):
        """Mean and 1/sqrt(variance + eps) of gate g's raw sums over the cells of row b."""
        base = self.pre_off + (g * self.B + b) * self.n_cell
        total = 0.0
        for k in range(self.n_cell):
            total += self._ld(arena, weights, io, sh, base + k)
        mean = total / self.n_cell
        var = 0.0
        for k in range(self.n_cell):
            d = self._ld(arena, weights, io, sh, base + k) - mean
            var += d * d
        var = var / self.n_cell
        self._st(arena, io, sh, self.stat_off + (g * self.B + b) * 2, mean)
        self._st(arena, io, sh, self.stat_off + (g * self.B + b) * 2 + 1,
                 1.0 / ti.sqrt(var + LAYER_NORM_EPSILON))

    @ti.func
    def _clip_cell(self, c):
        r = c
        if ti.static(self.cell_clip > 0):
            r = ti.min(ti.max(c, -self.cell_clip), self.cell_clip)
        return r

    # -- the phases of a time step: `width` items per row of this thread's rows ---------------
    @ti.func
    def _items(self, lane, rows, width):
        """How many of rows * width items lane takes (items lane, lane + lanes, ...)."""
        return (rows * width - lane + self.lanes - 1) // self.lanes

    @ti.func
    def _gates(self, arena: ti.template(), weights: ti.template(), io: ti.template(),
               sh: ti.template(), t, b, k):
        """Without layer norm: c' into the state, h' into hc."""
        c_prev = self._c(arena, weights, io, sh, t, b, k)
        pre_f = (self._sum(arena, weights, io, sh, 1, t, b, k)
                 + self.b[1].load(arena, weights, io, k))
        if ti.static(self.peephole):
            pre_f += self.p[1].load(arena, weights, io, k) * c_prev
        f = _sigmoid_ti(pre_f)
        i = 1.0 - f
        if ti.static(not self.cifg):
            pre_i = (self._sum(arena, weights, io, sh, 0, t, b, k)
                     + self.b[0].load(arena, weights, io, k))
            if ti.static(self.peephole):
                pre_i += self.p[0].load(arena, weights, io, k) * c_prev
            i = _sigmoid_ti(pre_i)
        g = _cell_act(self._sum(arena, weights, io, sh, 2, t, b, k)
                      + self.b[2].load(arena, weights, io, k), self.act)
        c_new = self._clip_cell(f * c_prev + i * g)
        pre_o = (self._sum(arena, weights, io, sh, 3, t, b, k)
                 + self.b[3].load(arena, weights, io, k))
        if ti.static(self.peephole):
            pre_o += self.p[3].load(arena, weights, io, k) * c_new
        self._st(arena, io, sh, self.c_off + b * self.n_cell + k, c_new)
        self._st(arena, io, sh, self.hc_off + b * self.n_cell + k,
                 _sigmoid_ti(pre_o) * _cell_act(c_new, self.act))

    @ti.func
    def _early_sums(self, arena: ti.template(), weights: ti.template(), io: ti.template(),
                    sh: ti.template(), t, b, k):
        """Layer norm, first phase: the raw sums of the input, forget and cell gates."""
        c_prev = self._c(arena, weights, io, sh, t, b, k)
        for g in ti.static(self.early_gates):
            v = self._sum(arena, weights, io, sh, g, t, b, k)
            if ti.static(self.peephole and g != 2):
                v += self.p[g].load(arena, weights, io, k) * c_prev
            self._st(arena, io, sh, self.pre_off + (g * self.B + b) * self.n_cell + k, v)

    @ti.func
    def _cell_update(self, arena: ti.template(), weights: ti.template(), io: ti.template(),
                     sh: ti.template(), t, b, k):
        """Layer norm, third phase: c' and the raw output gate sum."""
        c_prev = self._c(arena, weights, io, sh, t, b, k)
        f = _sigmoid_ti(self._normalized(arena, weights, io, sh, 1, b, k))
        i = 1.0 - f
        if ti.static(not self.cifg):
            i = _sigmoid_ti(self._normalized(arena, weights, io, sh, 0, b, k))
        g = _cell_act(self._normalized(arena, weights, io, sh, 2, b, k), self.act)
        c_new = self._clip_cell(f * c_prev + i * g)
        v = self._sum(arena, weights, io, sh, 3, t, b, k)
        if ti.static(self.peephole):
            v += self.p[3].load(arena, weights, io, k) * c_new
        self._st(arena, io, sh, self.pre_off + (3 * self.B + b) * self.n_cell + k, v)
        self._st(arena, io, sh, self.c_off + b * self.n_cell + k, c_new)

    @ti.func
    def _output_gate(self, arena: ti.template(), weights: ti.template(), io: ti.template(),
                     sh: ti.template(), b, k):
        """Layer norm, last phase: h' into hc."""
        o = _sigmoid_ti(self._normalized(arena, weights, io, sh, 3, b, k))
        c_new = self._ld(arena, weights, io, sh, self.c_off + b * self.n_cell + k)
        self._st(arena, io, sh, self.hc_off + b * self.n_cell + k, o * _cell_act(c_new, self.act))

    @ti.func
    def _emit(self, arena: ti.template(), weights: ti.template(), io: ti.template(),
              sh: ti.template(), t, b, n):
        """Output unit n of row b at step t: h' projected (or h' itself), to the output tensor
        and to h for the next step."""
        r = 0.0
        if ti.static(self.projection):
            if ti.static(self.projection_bias):
                r = self.proj_b.load(arena, weights, io, n)
            for k in range(self.n_cell):
                r += (self.proj_w.load(arena, weights, io, n * self.n_cell + k)
                      * self._ld(arena, weights, io, sh, self.hc_off + b * self.n_cell + k))
            if ti.static(self.proj_clip > 0):
                r = ti.min(ti.max(r, -self.proj_clip), self.proj_clip)
        else:
            r = self._ld(arena, weights, io, sh, self.hc_off + b * self.n_cell + n)
        flat = 0
        if ti.static(self.time_major):
            flat = (t * self.B + b) * self.n_output + n
        else:
            flat = (b * self.T + t) * self.n_output + n
        self.out.store(arena, io, flat, r)
        self._st(arena, io, sh, self.h_off + b * self.n_output + n, r)

    @ti.func
    def _sequence(self, arena: ti.template(), weights: ti.template(), io: ti.template(),
                  sh: ti.template(), lane, row0, rows, first: ti.template(), end: ti.template()):
        """Time steps [first, end) for batch rows [row0, row0 + rows), this thread taking its
        items."""
        C, O = self.n_cell, self.n_output
        for t in range(first, end):
            if ti.static(self.layer_norm):
                for m in range(self._items(lane, rows, C)):
                    e = lane + m * self.lanes
                    self._early_sums(arena, weights, io, sh, t, row0 + e // C, e % C)
                self._sync()
                for m in range(self._items(lane, rows, 1)):
                    b = row0 + lane + m * self.lanes
                    for g in ti.static(self.early_gates):
                        self._statistics(arena, weights, io, sh, g, b)
                self._sync()
                for m in range(self._items(lane, rows, C)):
                    e = lane + m * self.lanes
                    self._cell_update(arena, weights, io, sh, t, row0 + e // C, e % C)
                self._sync()
                for m in range(self._items(lane, rows, 1)):
                    self._statistics(arena, weights, io, sh, 3, row0 + lane + m * self.lanes)
                self._sync()
                for m in range(self._items(lane, rows, C)):
                    e = lane + m * self.lanes
                    self._output_gate(arena, weights, io, sh, row0 + e // C, e % C)
            else:
                for m in range(self._items(lane, rows, C)):
                    e = lane + m * self.lanes
                    self._gates(arena, weights, io, sh, t, row0 + e // C, e % C)
            self._sync()
            for m in range(self._items(lane, rows, O)):
                e = lane + m * self.lanes
                self._emit(arena, weights, io, sh, t, row0 + e // O, e % O)
            self._sync()

    @ti.func
    def _carry(self, arena: ti.template(), weights: ti.template(), io: ti.template(),
               sh: ti.template(), lane, to_shared: ti.template()):
        """The block's h and c between shared memory and the scratch buffer (same offsets), at
        the edge of a chunk of time steps."""
        for offset, width in ti.static(((self.h_off, self.n_output), (self.c_off, self.n_cell))):
            for m in range(self._items(lane, self.B, width)):
                i = offset + lane + m * self.lanes
                if ti.static(to_shared):
                    sh[i] = self.s.load(arena, weights, io, i)
                else:
                    self.s.store(arena, io, i, sh[i])
        self._sync()

    @ti.func
    def _write_state(self, arena: ti.template(), weights: ti.template(), io: ti.template(),
                     sh: ti.template(), lane, row0, rows):
        """The last h and c into output_state and cell_state, where the delegate keeps them
        (after every step's reads of the first state: the loop above ends on a barrier)."""
        if ti.static(self.writes_h):
            for m in range(self._items(lane, rows, self.n_output)):
                e = lane + m * self.lanes
                i = (row0 + e // self.n_output) * self.n_output + e % self.n_output
                self.h_last.store(arena, io, i, self._ld(arena, weights, io, sh, self.h_off + i))
        if ti.static(self.writes_c):
            for m in range(self._items(lane, rows, self.n_cell)):
                e = lane + m * self.lanes
                i = (row0 + e // self.n_cell) * self.n_cell + e % self.n_cell
                self.c_last.store(arena, io, i, self._ld(arena, weights, io, sh, self.c_off + i))

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        if ti.static(self.shared):
            for c in ti.static(range(len(self.chunks))):   # a top-level loop (dispatch) each
                ti.loop_config(block_dim=self.lanes)
                for lane in range(self.lanes):            # one block: every batch row
                    sh = ti.simt.block.SharedArray((self.state_size,), ti.f32)
                    if ti.static(self.chunks[c][0] > 0):
                        self._carry(arena, weights, io, sh, lane, True)
                    self._sequence(arena, weights, io, sh, lane, 0, self.B, self.chunks[c][0],
                                   self.chunks[c][1])
                    if ti.static(self.chunks[c][1] < self.T):
                        self._carry(arena, weights, io, sh, lane, False)
                    else:
                        self._write_state(arena, weights, io, sh, lane, 0, self.B)
        else:
            for c in ti.static(range(len(self.chunks))):   # a top-level loop (dispatch) each
                for b in range(self.B):               # a thread per batch row
                    self._sequence(arena, weights, io, self.s, 0, b, 1, self.chunks[c][0],
                                   self.chunks[c][1])
                    if ti.static(self.chunks[c][1] >= self.T):
                        self._write_state(arena, weights, io, self.s, 0, b, 1)


# -- the BASIC kernel: three parallel loops ----------------------------------------------------
@ti.data_oriented
class BasicLstmStep:
    """concat (one thread per element), the gate sums activ (one thread per row and gate unit:
    written to its output and to scratch), then state and activation (one per row and unit)."""

    def __init__(self, B, refs, outs, scratch):
        self.x, self.h, self.w, self.bias, self.c = refs
        self.out_h, self.out_c, self.out_concat, self.out_activ = outs
        self.s = scratch
        self.B, self.I, self.O = B.n_batch, B.n_input, B.n_output

    @ti.func
    def _concat(self, arena: ti.template(), weights: ti.template(), io: ti.template(), b, j):
        v = 0.0
        if j < self.I:
            v = self.x.load(arena, weights, io, b * self.I + j)
        else:
            v = self.h.load(arena, weights, io, b * self.O + j - self.I)
        return v

    @ti.func
    def run(self, arena: ti.template(), weights: ti.template(), io: ti.template()):
        depth = self.I + self.O
        for b, j in ti.ndrange(self.B, depth):
            self.out_concat.store(arena, io, b * depth + j, self._concat(arena, weights, io, b, j))
        for b, u in ti.ndrange(self.B, 4 * self.O):
            acc = self.bias.load(arena, weights, io, u)
            for j in range(depth):
                acc += (self.w.load(arena, weights, io, u * depth + j)
                        * self._concat(arena, weights, io, b, j))
            self.out_activ.store(arena, io, b * 4 * self.O + u, acc)
            self.s.store(arena, io, b * 4 * self.O + u, acc)
        for b, k in ti.ndrange(self.B, self.O):
            base = b * 4 * self.O + k
            i = _sigmoid_ti(self.s.load(arena, weights, io, base))
            g = _cell_act(self.s.load(arena, weights, io, base + self.O), ACT_TANH)
            f = _sigmoid_ti(self.s.load(arena, weights, io, base + 2 * self.O))
            o = _sigmoid_ti(self.s.load(arena, weights, io, base + 3 * self.O))
            state = i * g + f * self.c.load(arena, weights, io, b * self.O + k)
            self.out_c.store(arena, io, b * self.O + k, state)
            self.out_h.store(arena, io, b * self.O + k, o * _cell_act(state, ACT_TANH))

