"""Fuzzing: mutated .tflite files must load and run, or raise a ModelError, within a time limit.

A hostile or damaged model file must never crash the process, hang it, or make it allocate
what the machine does not have. This module checks that:

- seed models: small models written by `builder` (convolutions, element-wise chains, a folded
  shape chain, an op "zoo", int8 and QAT-style quantized models, a sparse constant, and a
  multi-subgraph model with CALL_ONCE, VAR_HANDLE/READ/ASSIGN_VARIABLE, IF, WHILE and a
  signature), plus the real models in ../shared/models (env TFLITE_TAICHI_MODELS);
- a walker (`walk`) that reads the flatbuffer generically against the TFLite schema and records
  where every offset, vector length, string, tensor shape, buffer index, opcode index, op
  tensor index, options field and quantization parameter lies;
- seeded mutators, one per class (`MUTATORS`): bit flips, truncation, offsets and vector
  lengths rewritten, shapes set to 0 / negative / 2^31-1, buffer indices swapped, opcode and
  op tensor indices out of range (or pointing elsewhere), cycles between ops, strings without
  terminators, builtin-options fields, tensor types, quantization parameters. A case is a
  seed model plus 1-3 mutations; each mutation is recorded as byte edits, so a case is
  reproduced exactly from (run seed, case number) or from its saved edits;
- a runner: a pool of long-lived worker processes (`python bench/fuzz.py --worker`),
  each case loaded with `Interpreter(model_content=...)`, `allocate_tensors()`, random inputs
  of the declared shapes and dtypes, `invoke()`, outputs read, under a per-case time limit of
  5 s of CPU time (SIGPROF in the worker, whose numpy runs single-threaded, so that a machine
  busy with other work does not turn a 2 s case into a "timeout"), and a hard kill by the
  parent when the worker has not answered after 3x that in wall time + 5 s (a loop inside C
  code, a deadlock). A worker that dies or hangs is recorded and replaced;
- outcomes: `ok`; `model_error` (tflite_taichi.errors.ModelError or a subclass, with a
  message); `input_error` (an InputError from invoke(): the random input data is refused at
  run time, e.g. a GATHER index out of range - the documented answer to bad data): all passes.
  `endless_loop`: the time limit struck inside a WHILE loop whose condition never turned false
  - documented behaviour (no iteration limit, as in LiteRT), counted apart, not a failure -
  decided from the loop's progress, not from where the limit struck: the loop (its
  iterations counted while the case runs) has made ENDLESS_MIN_ITERATIONS iterations and began
  its last within ENDLESS_STALE_FRACTION of the limit. A limit striking inside a WHILE that
  iterated only a few times, or whose current iteration stalls, is a `timeout` like any other.
  Everything else fails: `exception` (any other type, and InputError/InterpreterStateError
  outside invoke), `empty_message`, `timeout` (the limit struck elsewhere, and again when
  the case ran once more with 4x the limit; a case that finishes then was heavy work - a
  mutation can make tensors as large as the memory limit allows - and is counted `slow`, with
  its outcome, and listed), `hang` (no answer in 3x the limit + 5 s of wall time: killed,
  twice), `crash` (the worker died). Cases on Taichi's cpu backend (`--cpu-share`, builder
  seeds only) get 30 s: kernels compile;
- failures are minimised (edits dropped while the failure stays the same) and saved, with
  the bytes, the seed and the mutations, under the output folder.

A tool beside the runtime, not part of the installed package: run it from the
repository root, with tflite_taichi installed (editable or not).

    python bench/fuzz.py --cases 300 [--seed S] [--jobs 2] [--cpu-share 0.03] [--out DIR]
    python bench/fuzz.py --seed S --case N [--cpu-share X]  # rerun one case, in this process
    python bench/fuzz_long.py --cases 10000 --jobs 2 --cpu-share 0.03   # long mode, writes a report
"""
from __future__ import annotations

import argparse
import collections
import glob
import json
import os
import pickle
import platform
import queue
import random
import select
import signal
import struct
import subprocess
import sys
import threading
import time
import traceback
from dataclasses import dataclass, field
from typing import Optional

import numpy as np

TIME_LIMIT_S = 5.0              # per case: load, allocate, set inputs, invoke, read outputs
CPU_TIME_LIMIT_S = 30.0         # a case on Taichi's cpu backend: compiling kernels is real work
                                # (the zoo seed's 67 ops compile in ~6 s here; a whole shared
                                # model in more than 8 s, so those run on the reference path only)
SLOW_FACTOR = 4.0               # a case over the limit runs again with 4x the limit: if it
                                # finishes then, it was heavy work (a large tensor a mutation
                                # let through the memory limit), counted as `slow`, not a hang
ENDLESS_MIN_ITERATIONS = 100   # a timeout is an `endless_loop` only inside a WHILE that has run
ENDLESS_STALE_FRACTION = 0.1    # this many iterations and began its last one within this share
                                # of the limit: a loop still iterating, not a stall inside it
HARD_KILL_FACTOR, HARD_KILL_GRACE_S = 3.0, 5.0   # the parent kills a worker that has not
                                # answered after FACTOR x the limit + GRACE seconds (wall time)
WORKER_MEMORY_LIMIT = 12 << 30  # address space of a worker (RLIMIT_AS): a runaway allocation
                                # is a MemoryError there (a failure), never the machine's OOM


# == seed models ===================================================================================
def _q(scale, zp=0, dim=0):
    return (np.atleast_1d(np.asarray(scale, np.float32)), np.atleast_1d(np.asarray(zp, np.int64)), dim)


def _seed_cnn():
    from tflite_taichi.builder import ModelBuilder
    rng = np.random.default_rng(1)
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (1, 8, 8, 3))
    y1 = g.tensor("conv", (1, 8, 8, 4))
    g.op("CONV_2D", [x, g.const("w", rng.normal(size=(4, 3, 3, 3)).astype(np.float32)),
                     g.const("b", rng.normal(size=4).astype(np.float32))], [y1],
         padding="SAME", stride_w=1, stride_h=1, fused_activation_function="RELU")
    y2 = g.tensor("dw", (1, 4, 4, 4))
    g.op("DEPTHWISE_CONV_2D", [y1, g.const("dw_w", rng.normal(size=(1, 3, 3, 4)).astype(np.float32)),
                               g.const("dw_b", np.zeros(4, np.float32))], [y2],
         padding="SAME", stride_w=2, stride_h=2, depth_multiplier=1)
    y3 = g.tensor("pool", (1, 2, 2, 4))
    g.op("MAX_POOL_2D", [y2], [y3], padding="VALID", stride_w=2, stride_h=2, filter_width=2,
         filter_height=2)
    y4 = g.tensor("flat", (1, 16))
    g.op("RESHAPE", [y3, g.const("shape", np.array([1, 16], np.int32))], [y4], new_shape=[1, 16])
    y5 = g.tensor("fc", (1, 5))
    g.op("FULLY_CONNECTED", [y4, g.const("fc_w", rng.normal(size=(5, 16)).astype(np.float32)),
                             g.const("fc_b", np.zeros(5, np.float32))], [y5])
    out = g.tensor("probs", (1, 5))
    g.op("SOFTMAX", [y5], [out], beta=1.0)
    g.output(out)
    return b


def _seed_elementwise():
    from tflite_taichi.builder import ModelBuilder
    b = ModelBuilder()
    g = b.subgraph()
    a, c = g.input("a", (2, 3, 4)), g.input("c", (2, 3, 4))
    s = g.tensor("sum", (2, 3, 4))
    g.op("ADD", [a, c], [s])
    m = g.tensor("scaled", (2, 3, 4))
    g.op("MUL", [s, g.const("k", np.array([0.5, 1.0, 2.0, -1.0], np.float32))], [m])
    t = g.tensor("tanh", (2, 3, 4))
    g.op("TANH", [m], [t])
    cat = g.tensor("cat", (2, 3, 8))
    g.op("CONCATENATION", [t, a], [cat], axis=-1)
    tr = g.tensor("tr", (2, 8, 3))
    g.op("TRANSPOSE", [cat, g.const("perm", np.array([0, 2, 1], np.int32))], [tr])
    mean = g.tensor("mean", (2, 3))
    g.op("MEAN", [tr, g.const("axes", np.array([1], np.int32))], [mean], keep_dims=False)
    sl = g.tensor("slice", (2, 2))
    g.op("STRIDED_SLICE", [mean, g.const("begin", np.array([0, 1], np.int32)),
                           g.const("end", np.array([2, 3], np.int32)),
                           g.const("strides", np.array([1, 1], np.int32))], [sl])
    pad = g.tensor("pad", (4, 2))
    g.op("PAD", [sl, g.const("paddings", np.array([[1, 1], [0, 0]], np.int32))], [pad])
    out = g.tensor("out", (4, 2))
    g.op("LOGISTIC", [pad], [out])
    g.output(out, mean)
    return b


def _seed_shape_chain():
    """SHAPE -> STRIDED_SLICE -> REDUCE_PROD -> PACK -> RESHAPE: folded at prepare; FILL and
    RANGE folded too."""
    from tflite_taichi.builder import ModelBuilder
    I32 = np.int32
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (1, 4, 6))
    shp = g.tensor("shape", (3,), I32)
    g.op("SHAPE", [x], [shp], out_type="INT32")
    tail = g.tensor("tail", (2,), I32)
    g.op("STRIDED_SLICE", [shp, g.const("b0", np.array([1], I32)), g.const("e0", np.array([3], I32)),
                           g.const("s0", np.array([1], I32))], [tail])
    prod = g.tensor("prod", (), I32)
    g.op("REDUCE_PROD", [tail, g.const("ax0", np.array([0], I32))], [prod], keep_dims=False)
    packed = g.tensor("packed", (2,), I32)
    g.op("PACK", [g.const("one", I32(1)), prod], [packed], values_count=2, axis=0)
    flat = g.tensor("flat", (1, 24))
    g.op("RESHAPE", [x, packed], [flat])
    filled = g.tensor("filled", (1, 24))
    g.op("FILL", [g.const("dims", np.array([1, 24], I32)), g.const("v", np.float32(0.25))], [filled])
    r = g.tensor("range", (24,), I32)
    g.op("RANGE", [g.const("start", I32(0)), g.const("limit", I32(24)), g.const("delta", I32(1))], [r])
    rf = g.tensor("range_f", (24,))
    g.op("CAST", [r], [rf], in_data_type="INT32", out_data_type="FLOAT32")
    s1 = g.tensor("s1", (1, 24))
    g.op("ADD", [flat, filled], [s1])
    out = g.tensor("out", (1, 24))
    g.op("MUL", [s1, rf], [out])
    g.output(out)
    return b


def _seed_zoo():
    """One op after another, many op types: an opcode index rewritten to another entry of this
    opcode table runs another op's checks on these tensors."""
    from tflite_taichi.builder import ModelBuilder
    I32, F32 = np.int32, np.float32
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (1, 4, 4, 2))
    counter = [0]

    def op(name, inputs, shape, dtype=F32, **opts):
        counter[0] += 1
        y = g.tensor(f"{name.lower()}_{counter[0]}", shape, dtype)
        g.op(name, inputs, [y], **opts)
        return y

    def c(name, value, dtype=None):
        return g.const(name, np.asarray(value, dtype))

    s4 = (1, 4, 4, 2)
    t = op("ABS", [x], s4)
    t = op("ADD", [t, c("one", [1.0, 1.0], F32)], s4)
    for name in ("SQRT", "LOG", "RSQRT", "EXP", "NEG", "SIN", "COS", "SQUARE", "CEIL", "FLOOR",
                 "ROUND", "SIGN", "RELU", "RELU6", "RELU_N1_TO_1", "ELU", "HARD_SWISH", "GELU",
                 "LOGISTIC", "TANH"):
        t = op(name, [t], s4)
    t = op("LEAKY_RELU", [t], s4, alpha=0.2)
    for name in ("SUB", "MAXIMUM", "MINIMUM", "SQUARED_DIFFERENCE", "MUL"):
        t = op(name, [t, x], s4)
    t = op("DIV", [t, c("two", 2.0, F32)], s4)
    t = op("POW", [op("ABS", [t], s4), c("p", 2.0, F32)], s4)
    t = op("RESIZE_BILINEAR", [t, c("size", [8, 8], I32)], (1, 8, 8, 2))
    t = op("SPACE_TO_DEPTH", [t], (1, 4, 4, 8), block_size=2)
    t = op("DEPTH_TO_SPACE", [t], (1, 8, 8, 2), block_size=2)
    t = op("MIRROR_PAD", [t, c("mp", [[0, 0], [1, 1], [1, 1], [0, 0]], I32)], (1, 10, 10, 2), mode="REFLECT")
    t = op("SLICE", [t, c("sb", [0, 1, 1, 0], I32), c("ss", [1, 8, 8, 2], I32)], (1, 8, 8, 2))
    t = op("REVERSE_V2", [t, c("rax", [1], I32)], (1, 8, 8, 2))
    t = op("AVERAGE_POOL_2D", [t], (1, 4, 4, 2), padding="VALID", stride_w=2, stride_h=2,
           filter_width=2, filter_height=2)
    t = op("RESIZE_NEAREST_NEIGHBOR", [t, c("size2", [8, 8], I32)], (1, 8, 8, 2))
    t = op("TRANSPOSE", [t, c("perm", [0, 3, 1, 2], I32)], (1, 2, 8, 8))
    m = op("RESHAPE", [t, c("rs", [2, 64], I32)], (2, 64))
    m = op("SOFTMAX", [m], (2, 64), beta=1.0)
    m = op("LOG_SOFTMAX", [m], (2, 64))
    m = op("L2_NORMALIZATION", [m], (2, 64))
    m = op("CUMSUM", [m, c("cax", 1, I32)], (2, 64))
    r = op("REDUCE_MAX", [m, c("rax2", [1], I32)], (2, 1), keep_dims=True)
    r = op("TILE", [r, c("mult", [1, 3], I32)], (2, 3))
    bm = op("BATCH_MATMUL", [r, c("bmw", np.arange(12).reshape(3, 4) / 10, F32)], (2, 4))
    am = op("ARG_MAX", [bm, c("amax", 1, I32)], (2,), I32, output_type="INT32")
    ga = op("GATHER", [bm, am], (2, 2), axis=1)
    oh = op("ONE_HOT", [am, c("depth", 4, I32), c("on", 1.0, F32), c("off", 0.0, F32)], (2, 4), axis=-1)
    tk = g.tensor("topk_values", (2, 2))
    ti_ = g.tensor("topk_indices", (2, 2), I32)
    g.op("TOPK_V2", [oh, c("k", 2, I32)], [tk, ti_])
    e = op("EXPAND_DIMS", [tk, c("eax", 0, I32)], (1, 2, 2))
    e = op("SQUEEZE", [e], (2, 2), squeeze_dims=[0])
    p = op("PACK", [e, ga], (2, 2, 2), values_count=2, axis=0)
    u1, u2 = g.tensor("unpack_0", (2, 2)), g.tensor("unpack_1", (2, 2))
    g.op("UNPACK", [p], [u1, u2], num=2, axis=0)
    gt = op("GREATER", [u1, u2], (2, 2), np.bool_)
    sel = op("SELECT_V2", [gt, u1, u2], (2, 2))
    s1, s2 = g.tensor("split_0", (2, 1)), g.tensor("split_1", (2, 1))
    g.op("SPLIT", [c("spax", 1, I32), sel], [s1, s2], num_splits=2)
    cat = op("CONCATENATION", [s2, s1], (2, 2), axis=1)
    cast = op("CAST", [gt], (2, 2), in_data_type="BOOL", out_data_type="FLOAT32")
    z = op("ADD", [cat, cast], (2, 2))
    z = op("ADD", [z, op("ZEROS_LIKE", [z], (2, 2))], (2, 2))
    z = op("BROADCAST_TO", [z, c("bshape", [3, 2, 2], I32)], (3, 2, 2))
    z = op("PADV2", [z, c("pv", [[0, 0], [1, 0], [0, 1]], I32), c("pval", 0.5, F32)], (3, 3, 3))
    z = op("SUM", [z, c("sax", [0, 2], I32)], (3,), keep_dims=False)
    g.output(z)
    return b


def _seed_int8(qat=False):
    """int8 CONV_2D (per-channel filter) -> AVERAGE_POOL_2D -> RESHAPE -> FULLY_CONNECTED; with
    qat=True float IO through QUANTIZE/DEQUANTIZE."""
    from tflite_taichi.builder import ModelBuilder
    rng = np.random.default_rng(2)
    I8 = np.int8
    qx, qy, qo = _q(0.05, -3), _q(0.1, 2), _q(0.2, 0)
    w_scale = np.array([0.02, 0.03, 0.01], np.float32)
    b = ModelBuilder()
    g = b.subgraph()
    if qat:
        xf = g.input("x_float", (1, 6, 6, 2))
        x = g.tensor("x", (1, 6, 6, 2), I8, qx)
        g.op("QUANTIZE", [xf], [x])
    else:
        x = g.input("x", (1, 6, 6, 2), I8, qx)
    w = g.const("w", rng.integers(-127, 128, (3, 3, 3, 2)).astype(I8), quantization=_q(w_scale, [0, 0, 0], 0))
    bias = g.const("bias", rng.integers(-50, 50, 3).astype(np.int32),
                   quantization=_q(0.05 * w_scale, [0, 0, 0], 0))
    y = g.tensor("conv", (1, 6, 6, 3), I8, qy)
    g.op("CONV_2D", [x, w, bias], [y], padding="SAME", stride_w=1, stride_h=1,
         fused_activation_function="RELU")
    p = g.tensor("pool", (1, 3, 3, 3), I8, qy)
    g.op("AVERAGE_POOL_2D", [y], [p], padding="VALID", stride_w=2, stride_h=2, filter_width=2,
         filter_height=2)
    f = g.tensor("flat", (1, 27), I8, qy)
    g.op("RESHAPE", [p, g.const("shape", np.array([1, 27], np.int32))], [f])
    o = g.tensor("fc", (1, 4), I8, qo)
    g.op("FULLY_CONNECTED", [f, g.const("fc_w", rng.integers(-127, 128, (4, 27)).astype(I8), quantization=_q(0.02)),
                             g.const("fc_b", np.zeros(4, np.int32), quantization=_q(0.1 * 0.02))], [o])
    if qat:
        of = g.tensor("out", (1, 4))
        g.op("DEQUANTIZE", [o], [of])
        g.output(of)
    else:
        g.output(o)
    return b


def _seed_sparse():
    from tflite_taichi.builder import ModelBuilder
    dense = np.zeros((4, 8), np.float32)
    dense[0, 1], dense[1, 5], dense[2, 2], dense[3, 7], dense[3, 0] = 1.5, -2.0, 0.5, 3.0, 1.0
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (1, 8))
    w = g.sparse_const("w", dense, ["DENSE", "SPARSE_CSR"])
    y = g.tensor("y", (1, 4))
    g.op("FULLY_CONNECTED", [x, w, g.const("bias", np.zeros(4, np.float32))], [y])
    w2 = g.tensor("w_dense", (4, 8))
    g.op("DENSIFY", [g.sparse_const("w2", dense, ["DENSE", "SPARSE_CSR"], index_dtype=np.uint8)], [w2])
    z = g.tensor("z", (1, 4))
    g.op("FULLY_CONNECTED", [x, w2, g.const("bias2", np.ones(4, np.float32))], [z])
    g.output(y, z)
    return b


def _seed_control():
    """Six subgraphs: main runs CALL_ONCE (init: VAR_HANDLE + ASSIGN_VARIABLE), reads and
    updates a resource variable, an IF (then: ADD, else: MUL) and a WHILE counting to 3; a
    signature names main's tensors."""
    from tflite_taichi.builder import RESOURCE, ModelBuilder
    I32 = np.int32
    b = ModelBuilder()
    g = b.subgraph("main")
    cond = g.input("cond", (), np.bool_)
    x = g.input("x", (2,))
    g.op("CALL_ONCE", [], [], init_subgraph_index=1)
    h = g.tensor("h", (), RESOURCE)
    g.op("VAR_HANDLE", [], [h], shared_name="acc")
    state = g.tensor("state", (2,))
    g.op("READ_VARIABLE", [h], [state])
    total = g.tensor("total", (2,))
    g.op("ADD", [state, x], [total])
    g.op("ASSIGN_VARIABLE", [h, total], [])
    branched = g.tensor("branched", (2,))
    g.op("IF", [cond, total, x], [branched], then_subgraph_index=2, else_subgraph_index=3)
    i_out, w_out = g.tensor("i_out", (), I32), g.tensor("w_out", (2,))
    g.op("WHILE", [g.const("i0", I32(0)), branched], [i_out, w_out], cond_subgraph_index=4,
         body_subgraph_index=5)
    g.output(w_out, i_out)
    b.signature("serve", 0, {"cond": cond, "x": x}, {"y": w_out, "count": i_out})

    init = b.subgraph("init")
    hi = init.tensor("h", (), RESOURCE)
    init.op("VAR_HANDLE", [], [hi], shared_name="acc")
    init.op("ASSIGN_VARIABLE", [hi, init.const("zeros", np.zeros(2, np.float32))], [])

    for name, opname in (("then", "ADD"), ("else", "MUL")):
        s = b.subgraph(name)
        a1, a2 = s.input("a", (2,)), s.input("b", (2,))
        r = s.tensor("r", (2,))
        s.op(opname, [a1, a2], [r])
        s.output(r)

    c = b.subgraph("cond")
    ci = c.input("i", (), I32)
    c.input("w", (2,))
    go = c.tensor("go", (), np.bool_)
    c.op("LESS", [ci, c.const("n", I32(3))], [go])
    c.output(go)

    body = b.subgraph("body")
    bi, bw = body.input("i", (), I32), body.input("w", (2,))
    ni, nw = body.tensor("i_next", (), I32), body.tensor("w_next", (2,))
    body.op("ADD", [bi, body.const("one", I32(1))], [ni])
    body.op("MUL", [bw, body.const("half", np.float32(0.5))], [nw])
    body.output(ni, nw)
    return b


_BUILDER_SEEDS = {
    "cnn": _seed_cnn, "elementwise": _seed_elementwise, "shape_chain": _seed_shape_chain,
    "zoo": _seed_zoo, "int8": _seed_int8, "qat": lambda: _seed_int8(qat=True),
    "sparse": _seed_sparse, "control": _seed_control,
}


class _ForceDefaults:
    """While active, the builder writes every scalar field, defaults included (a float32
    tensor's type 0, buffer 0, ...), so that mutators find those fields in the bytes."""

    def __enter__(self):
        import flatbuffers

        from tflite_taichi import builder
        base = flatbuffers.Builder

        class Builder(base):
            def __init__(self, *args, **kwargs):
                super().__init__(*args, **kwargs)
                self.forceDefaults = True

        shim = type(sys)("flatbuffers_force_defaults")
        shim.Builder = Builder
        self._builder_module, self._saved = builder, builder.flatbuffers
        builder.flatbuffers = shim
        return self

    def __exit__(self, *exc):
        self._builder_module.flatbuffers = self._saved


def builder_seeds() -> dict:
    """name -> model bytes: each builder seed as written, and with every default written."""
    out = {}
    for name, make in _BUILDER_SEEDS.items():
        out[name] = make().finish()
        with _ForceDefaults():
            out[name + "+defaults"] = make().finish()
    out["cnn+external"] = _seed_cnn().finish(external_buffers=True)
    return out


def shared_models_folder() -> Optional[str]:
    """TFLITE_TAICHI_MODELS, else ../shared/models next to the repository (as tests/conftest.py)."""
    path = os.environ.get("TFLITE_TAICHI_MODELS")
    if path is None:
        path = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "shared", "models")
    path = os.path.abspath(path)
    return path if os.path.isdir(path) else None


def shared_seeds(folder=None, max_bytes: Optional[int] = None) -> dict:
    folder = folder or shared_models_folder()
    out = {}
    if folder is None:
        return out
    for path in sorted(glob.glob(os.path.join(folder, "*.tflite"))):
        if max_bytes is not None and os.path.getsize(path) > max_bytes:
            continue
        with open(path, "rb") as f:
            out["shared:" + os.path.basename(path)[:-len(".tflite")]] = f.read()
    return out


# == the flatbuffer walker =========================================================================
# field slot -> (name, kind) for the tables of the TFLite schema we walk. Kinds: scalars
# ("u8", "i8", "i32", "u32", "u64"), "str", "[u8]", "[i32]", "[i64]", "[f32]", "[Table]" (a
# vector of tables), "Table" (one table), "options" (a union table of unknown layout),
# "index_vector" (SparseIndexVector union, element size from the type field before it).
SCHEMA = {
    "Model": ["version:u32", "operator_codes:[OperatorCode]", "subgraphs:[SubGraph]",
              "description:str", "buffers:[Buffer]", "metadata_buffer:[i32]", "metadata:[Metadata]",
              "signature_defs:[SignatureDef]"],
    "OperatorCode": ["deprecated_builtin_code:i8", "custom_code:str", "version:i32", "builtin_code:i32"],
    "SubGraph": ["tensors:[Tensor]", "inputs:[i32]", "outputs:[i32]", "operators:[Operator]",
                 "name:str", "debug_metadata_index:i32"],
    "Tensor": ["shape:[i32]", "type:i8", "buffer:u32", "name:str",
               "quantization:QuantizationParameters", "is_variable:u8",
               "sparsity:SparsityParameters", "shape_signature:[i32]", "has_rank:u8",
               "variant_tensors:[VariantSubType]"],
    "QuantizationParameters": ["min:[f32]", "max:[f32]", "scale:[f32]", "zero_point:[i64]",
                               "details_type:u8", "details:options", "quantized_dimension:i32"],
    "Operator": ["opcode_index:u32", "inputs:[i32]", "outputs:[i32]", "builtin_options_type:u8",
                 "builtin_options:options", "custom_options:[u8]", "custom_options_format:i8",
                 "mutating_variable_inputs:[u8]", "intermediates:[i32]",
                 "large_custom_options_offset:u64", "large_custom_options_size:u64",
                 "builtin_options_2_type:u8", "builtin_options_2:options", "debug_metadata_index:i32"],
    "Buffer": ["data:[u8]", "offset:u64", "size:u64"],
    "Metadata": ["name:str", "buffer:u32"],
    "SignatureDef": ["inputs:[TensorMap]", "outputs:[TensorMap]", "signature_key:str",
                     "deprecated_tag:str", "subgraph_index:u32"],
    "TensorMap": ["name:str", "tensor_index:u32"],
    "SparsityParameters": ["traversal_order:[i32]", "block_map:[i32]", "dim_metadata:[DimensionMetadata]"],
    "DimensionMetadata": ["format:i8", "dense_size:i32", "array_segments_type:u8",
                          "array_segments:index_vector", "array_indices_type:u8",
                          "array_indices:index_vector"],
    "VariantSubType": ["shape:[i32]", "type:i8", "has_rank:u8"],
}
_SCALARS = {"u8": ("<B", 1), "i8": ("<b", 1), "i32": ("<i", 4), "u32": ("<I", 4), "u64": ("<Q", 8)}
_ELEMS = {"[u8]": 1, "[i32]": 4, "[i64]": 8, "[f32]": 4}
_INDEX_ELEM = {1: 4, 2: 2, 3: 1}


class _Bad(Exception):
    pass


@dataclass
class Layout:
    """Where things are in one model's bytes (positions are absolute)."""

    size: int = 0
    offsets: list = field(default_factory=list)    # (pos, kind): "root" / "uoffset" / "soffset"
    vectors: list = field(default_factory=list)    # (length pos, element size, count, what)
    strings: list = field(default_factory=list)    # (length pos, count, what)
    scalars: dict = field(default_factory=dict)    # "Table.field" -> [(pos, size)]
    tensors: list = field(default_factory=list)    # per subgraph: [dict]
    ops: list = field(default_factory=list)        # per subgraph: [dict]
    subgraph_io: list = field(default_factory=list)  # per subgraph: (inputs, outputs) [(pos, value)]
    options: list = field(default_factory=list)    # (pos, size guess) of builtin options fields
    quant: list = field(default_factory=list)      # dict: scale/zero_point element positions, qdim
    data: list = field(default_factory=list)       # (start, end) of buffer contents
    n_opcodes: int = 0
    n_buffers: int = 0

    def structure_bytes(self) -> int:
        return self.size - sum(e - s for s, e in self.data)


class _Walker:
    def __init__(self, buf: bytes):
        self.buf = buf
        self.lay = Layout(size=len(buf))
        self.seen = set()

    def get(self, fmt: str, pos: int):
        n = struct.calcsize(fmt)
        if pos < 0 or pos + n > len(self.buf):
            raise _Bad(f"read of {n} at {pos}")
        return struct.unpack_from(fmt, self.buf, pos)[0]

    def deref(self, pos: int) -> int:
        self.lay.offsets.append((pos, "uoffset"))
        return pos + self.get("<I", pos)

    def fields(self, table: int) -> dict:
        """slot -> absolute position of the fields present in the table at `table`."""
        self.lay.offsets.append((table, "soffset"))
        vt = table - self.get("<i", table)
        vt_len = self.get("<H", vt)
        out = {}
        for slot in range((vt_len - 4) // 2):
            off = self.get("<H", vt + 4 + 2 * slot)
            if off:
                out[slot] = table + off
        return out

    def vector(self, pos: int, esize: int, what: str):
        """(count, first element position) of the vector whose offset field is at `pos`."""
        vec = self.deref(pos)
        n = self.get("<I", vec)
        if vec + 4 + n * esize > len(self.buf):
            raise _Bad(f"{what}: vector past the end")
        self.lay.vectors.append((vec, esize, n, what))
        return n, vec + 4

    def table(self, kind: str, pos: int) -> dict:
        """Walk the table at `pos`; returns {field name: value} for scalars and int vectors,
        with '@name' holding the field position (scalars) or element positions (vectors)."""
        if (kind, pos) in self.seen:
            raise _Bad("a table visited twice")
        self.seen.add((kind, pos))
        present = self.fields(pos)
        rec = {"@table": pos}
        types = {}
        for slot, spec in enumerate(SCHEMA[kind]):
            name, ftype = spec.split(":")
            if slot not in present:
                continue
            fp = present[slot]
            if ftype in _SCALARS:
                fmt, size = _SCALARS[ftype]
                rec[name] = self.get(fmt, fp)
                rec["@" + name] = fp
                types[name] = rec[name]
                self.lay.scalars.setdefault(f"{kind}.{name}", []).append((fp, size))
            elif ftype == "str":
                s = self.deref(fp)
                n = self.get("<I", s)
                rec[name] = self.buf[s + 4:s + 4 + min(n, 256)].decode("utf-8", "replace")
                self.lay.strings.append((s, n, f"{kind}.{name}"))
                self.lay.vectors.append((s, 1, n, f"{kind}.{name}"))
            elif ftype in _ELEMS:
                esize = _ELEMS[ftype]
                n, first = self.vector(fp, esize, f"{kind}.{name}")
                if ftype == "[i32]":
                    rec[name] = [self.get("<i", first + 4 * i) for i in range(min(n, 4096))]
                    rec["@" + name] = [first + 4 * i for i in range(min(n, 4096))]
                elif ftype in ("[f32]", "[i64]"):
                    rec["@" + name] = [first + esize * i for i in range(min(n, 4096))]
                elif ftype == "[u8]":
                    rec["@" + name] = (first, first + n)
            elif ftype.startswith("[") and ftype[1:-1] in SCHEMA:
                sub = ftype[1:-1]
                n, first = self.vector(fp, 4, f"{kind}.{name}")
                rec[name] = [self.table(sub, self.deref(first + 4 * i)) for i in range(n)]
            elif ftype in SCHEMA:
                rec[name] = self.table(ftype, self.deref(fp))
            elif ftype == "options":
                opts = self.deref(fp)
                rec["@" + name] = opts
                self.options_table(opts)
            elif ftype == "index_vector":
                esize = _INDEX_ELEM.get(types.get(name + "_type"), 4)
                iv = self.deref(fp)
                ivf = self.fields(iv)
                if 0 in ivf:
                    self.vector(ivf[0], esize, f"{kind}.{name}")
        return rec

    def options_table(self, pos: int):
        present = self.fields(pos)
        spots = sorted(present.values())
        for i, fp in enumerate(spots):
            nxt = spots[i + 1] if i + 1 < len(spots) else fp + 4
            self.lay.options.append((fp, max(1, min(4, nxt - fp))))

    def model(self) -> Layout:
        lay = self.lay
        lay.offsets.append((0, "root"))
        root = self.get("<I", 0)
        m = self.table("Model", root)
        lay.n_opcodes = len(m.get("operator_codes", []))
        lay.n_buffers = len(m.get("buffers", []))
        for buf in m.get("buffers", []):
            if "@data" in buf:
                lay.data.append(buf["@data"])
        for sg in m.get("subgraphs", []):
            tensors = []
            for t in sg.get("tensors", []):
                tensors.append({"shape": t.get("@shape", []), "shape_signature": t.get("@shape_signature", []),
                                "buffer": (t["@buffer"], t["buffer"]) if "@buffer" in t else None,
                                "type": t.get("@type"), "name": t.get("name")})
                q = t.get("quantization")
                if q is not None:
                    lay.quant.append({"scale": q.get("@scale", []), "zero_point": q.get("@zero_point", []),
                                      "quantized_dimension": q.get("@quantized_dimension")})
            lay.tensors.append(tensors)
            ops = []
            for o in sg.get("operators", []):
                ops.append({"opcode": (o["@opcode_index"], o["opcode_index"]) if "@opcode_index" in o else None,
                            "inputs": list(zip(o.get("@inputs", []), o.get("inputs", []))),
                            "outputs": list(zip(o.get("@outputs", []), o.get("outputs", []))),
                            "options": o.get("@builtin_options")})
            lay.ops.append(ops)
            lay.subgraph_io.append((list(zip(sg.get("@inputs", []), sg.get("inputs", []))),
                                    list(zip(sg.get("@outputs", []), sg.get("outputs", [])))))
        return lay


def walk(buf: bytes) -> Layout:
    """The layout of a valid model's bytes (raises ValueError on a malformed seed)."""
    try:
        return _Walker(buf).model()
    except _Bad as e:
        raise ValueError(f"cannot walk the model: {e}") from None


# == mutations =====================================================================================
@dataclass
class Mutation:
    cls: str                   # the mutation class (a MUTATORS key)
    desc: str                  # what it did, in words
    edits: list                # [(pos, new bytes)]; applied in order
    cut: Optional[int] = None  # truncation: keep this many bytes

    def to_json(self) -> dict:
        return {"cls": self.cls, "desc": self.desc, "cut": self.cut,
                "edits": [[p, bytes(b).hex()] for p, b in self.edits]}

    @staticmethod
    def from_json(d) -> "Mutation":
        return Mutation(d["cls"], d["desc"], [(p, bytes.fromhex(h)) for p, h in d["edits"]], d.get("cut"))


def apply_mutations(base: bytes, mutations) -> bytes:
    out = bytearray(base)
    cut = None
    for m in mutations:
        for pos, new in m.edits:
            if 0 <= pos and pos + len(new) <= len(out):
                out[pos:pos + len(new)] = new
        if m.cut is not None:
            cut = m.cut if cut is None else min(cut, m.cut)
    return bytes(out[:cut] if cut is not None else out)


def _i32(v):
    return struct.pack("<i", v)


def _u32(v):
    return struct.pack("<I", v & 0xFFFFFFFF)


def _structure_pos(rng, lay: Layout) -> int:
    """A random position, outside buffer contents (the weights) with probability ~3/4."""
    if lay.data and rng.random() < 0.75:
        for _ in range(20):
            pos = rng.randrange(lay.size)
            if not any(s <= pos < e for s, e in lay.data):
                return pos
    return rng.randrange(lay.size)


def _m_bitflip(rng, lay, base):
    edits, where = [], []
    for _ in range(rng.choice([1, 1, 2, 3, 8])):
        pos = _structure_pos(rng, lay)
        bit = rng.randrange(8)
        edits.append((pos, bytes([base[pos] ^ (1 << bit)])))
        where.append(f"{pos}.{bit}")
    return Mutation("bitflip", "flipped bits " + ", ".join(where), edits)


def _m_truncate(rng, lay, base):
    r = rng.random()
    if r < 0.4:
        cut = rng.randrange(lay.size)
    elif r < 0.7:
        cut = lay.size - rng.randint(1, min(64, lay.size))
    else:
        cut = rng.randrange(min(lay.size, 256))
    return Mutation("truncate", f"truncated to {cut} of {lay.size} bytes", [], cut=cut)


def _m_offset(rng, lay, base):
    pos, kind = rng.choice(lay.offsets)
    old = struct.unpack_from("<i" if kind == "soffset" else "<I", base, pos)[0]
    choices = [0, 1, 2, 3, 4, -4, 0x7FFFFFFF, -0x80000000, 0xFFFFFFFF - 3, lay.size - pos,
               lay.size - pos - 2, old + rng.choice([-8, -4, -1, 1, 4, 8]), rng.randrange(-lay.size, lay.size),
               -pos]
    new = rng.choice(choices)
    return Mutation("offset", f"{kind} at {pos}: {old} -> {new}", [(pos, _u32(new))])


def _m_vector_length(rng, lay, base):
    vec, esize, n, what = rng.choice(lay.vectors)
    new = rng.choice([0, 1, n + 1, max(n - 1, 0), n * 2 + 1, 0x7FFFFFFF, 0xFFFFFFFF, 0x80000000,
                      lay.size // max(esize, 1), (lay.size - vec) // max(esize, 1), rng.randrange(1 << 16)])
    return Mutation("vector_length", f"{what} vector at {vec}: length {n} -> {new}", [(vec, _u32(new))])


_BIG_DIMS = [0x7FFFFFFF, 0x40000000, 0x10000000, 1 << 24]


def _tensor_list(lay):
    return [(sg, i, t) for sg, ts in enumerate(lay.tensors) for i, t in enumerate(ts)]


def _m_shape(rng, lay, base):
    cands = [(sg, i, t) for sg, i, t in _tensor_list(lay) if t["shape"] or t["shape_signature"]]
    if not cands:
        return None
    inputs = [(sg, i, t) for sg, i, t in cands if any(v == i for _, v in lay.subgraph_io[sg][0])]
    if inputs and rng.random() < 0.5:       # an input: the new shape flows through inference
        sg, i, t = rng.choice(inputs)
        pos = rng.choice(t["shape"] or t["shape_signature"])
        new = rng.choice([0, 1, 1, 2, 3, 5, 7, 16, 0x7FFFFFFF, -1])
        return Mutation("shape", f"subgraph {sg} input tensor {i} ('{t['name']}') dim at {pos} -> {new}",
                        [(pos, _i32(new))])
    sg, i, t = rng.choice(cands)
    key = "shape" if t["shape"] and (not t["shape_signature"] or rng.random() < 0.8) else "shape_signature"
    dims = t[key]
    r = rng.random()
    if r < 0.15:    # every dimension big: an element count that overflows int64
        return Mutation("shape", f"subgraph {sg} tensor {i} {key}: every dim 2^31-1",
                        [(p, _i32(0x7FFFFFFF)) for p in dims])
    pos = rng.choice(dims)
    new = rng.choice([0, 0, -1, -1, -2, -0x80000000, 0x7FFFFFFF, 0x7FFFFFFF, rng.choice(_BIG_DIMS),
                      rng.randint(2, 9)])
    return Mutation("shape", f"subgraph {sg} tensor {i} ('{t['name']}') {key} dim at {pos} -> {new}",
                    [(pos, _i32(new))])


def _m_buffer_index(rng, lay, base):
    cands = [(sg, i, t) for sg, i, t in _tensor_list(lay) if t["buffer"] is not None]
    if not cands:
        return None
    if len(cands) >= 2 and rng.random() < 0.6:
        (sa, ia, ta), (sb, ib, tb) = rng.sample(cands, 2)
        (pa, va), (pb, vb) = ta["buffer"], tb["buffer"]
        return Mutation("buffer_index", f"swapped buffers of tensor {sa}:{ia} ({va}) and {sb}:{ib} ({vb})",
                        [(pa, _u32(vb)), (pb, _u32(va))])
    sg, i, t = rng.choice(cands)
    pos, old = t["buffer"]
    new = rng.choice([lay.n_buffers, lay.n_buffers + 1, 0xFFFFFFFF, 0x80000000, 0,
                      rng.randrange(max(lay.n_buffers, 1))])
    return Mutation("buffer_index", f"subgraph {sg} tensor {i} buffer {old} -> {new}", [(pos, _u32(new))])


def _op_list(lay):
    return [(sg, i, o) for sg, ops in enumerate(lay.ops) for i, o in enumerate(ops)]


def _m_opcode_index(rng, lay, base):
    cands = [(sg, i, o) for sg, i, o in _op_list(lay) if o["opcode"] is not None]
    if not cands:
        return None
    sg, i, o = rng.choice(cands)
    pos, old = o["opcode"]
    new = rng.choice([lay.n_opcodes, lay.n_opcodes + 7, 0xFFFFFFFF, 0x80000000] +
                     [rng.randrange(max(lay.n_opcodes, 1))] * 4)
    return Mutation("opcode_index", f"subgraph {sg} op {i} opcode index {old} -> {new}", [(pos, _u32(new))])


def _m_op_index(rng, lay, base):
    cands = []
    for sg, i, o in _op_list(lay):
        cands += [(sg, f"op {i} input", p, v) for p, v in o["inputs"]]
        cands += [(sg, f"op {i} output", p, v) for p, v in o["outputs"]]
    for sg, (ins, outs) in enumerate(lay.subgraph_io):
        cands += [(sg, "subgraph input", p, v) for p, v in ins]
        cands += [(sg, "subgraph output", p, v) for p, v in outs]
    if not cands:
        return None
    sg, what, pos, old = rng.choice(cands)
    n = len(lay.tensors[sg]) if sg < len(lay.tensors) else 0
    if what.endswith("input") and what.startswith("op") and rng.random() < 0.5:
        # another tensor that exists when the op runs: the op's checks see other shapes/dtypes
        k = int(what.split()[1])
        ready = {v for _, v in lay.subgraph_io[sg][0]}
        ready |= {i for i, t in enumerate(lay.tensors[sg]) if t["buffer"] is not None and t["buffer"][1]}
        for o in lay.ops[sg][:k]:
            ready |= {v for _, v in o["outputs"]}
        ready.discard(old)
        if ready:
            new = rng.choice(sorted(ready))
            return Mutation("op_index", f"subgraph {sg} {what} tensor {old} -> {new} (exists by then)",
                            [(pos, _i32(new))])
    new = rng.choice([n, n + 1, -1, -2, 0x7FFFFFFF, -0x80000000, rng.randrange(max(n, 1)),
                      rng.randrange(max(n, 1))])
    return Mutation("op_index", f"subgraph {sg} {what} tensor {old} -> {new}", [(pos, _i32(new))])


def _m_cycle(rng, lay, base):
    """An op reads its own output or a later op's, or writes a tensor another op writes."""
    sgs = [sg for sg, ops in enumerate(lay.ops) if any(o["inputs"] for o in ops)
           and any(o["outputs"] for o in ops)]
    if not sgs:
        return None
    sg = rng.choice(sgs)
    ops = lay.ops[sg]
    readers = [i for i, o in enumerate(ops) if o["inputs"]]
    i = rng.choice(readers)
    later = [j for j in range(i, len(ops)) if ops[j]["outputs"]]
    if later and rng.random() < 0.75:
        j = rng.choice(later)
        pos, old = rng.choice(ops[i]["inputs"])
        _, produced = rng.choice(ops[j]["outputs"])
        return Mutation("cycle", f"subgraph {sg} op {i} reads op {j}'s output {produced} (was {old})",
                        [(pos, _i32(produced))])
    writers = [j for j, o in enumerate(ops) if o["outputs"]]
    a, b = rng.choice(writers), rng.choice(writers)
    pos, old = rng.choice(ops[b]["outputs"])
    _, other = rng.choice(ops[a]["outputs"])
    return Mutation("cycle", f"subgraph {sg} op {b} writes op {a}'s output {other} (was {old})",
                    [(pos, _i32(other))])


def _m_string(rng, lay, base):
    if not lay.strings:
        return None
    s, n, what = rng.choice(lay.strings)
    r = rng.random()
    if r < 0.4 and s + 4 + n < lay.size:        # the terminator overwritten
        return Mutation("string", f"{what} at {s}: terminator overwritten",
                        [(s + 4 + n, bytes([rng.choice([0x41, 0xFF, 0x80, 0x0A])]))])
    if r < 0.8:                                   # length runs past the terminator
        new = n + rng.choice([1, 2, 5, 64, 4096])
        edits = [(s, _u32(new))]
        if s + 4 + n < lay.size:
            edits.append((s + 4 + n, b"\xff"))
        return Mutation("string", f"{what} at {s}: length {n} -> {new}, no terminator", edits)
    if n == 0:
        return None
    pos = s + 4 + rng.randrange(n)              # invalid UTF-8 inside
    return Mutation("string", f"{what} at {s}: byte {pos} -> 0xC3 (broken UTF-8)", [(pos, b"\xc3")])


def _m_options(rng, lay, base):
    spots = list(lay.options)
    spots += [(p, 1) for p, _ in lay.scalars.get("Operator.builtin_options_type", [])]
    spots += [(p, 4) for p, _ in lay.scalars.get("SignatureDef.subgraph_index", [])]
    spots += [(p, 4) for p, _ in lay.scalars.get("TensorMap.tensor_index", [])]
    spots += [(p, s) for p, s in lay.scalars.get("OperatorCode.builtin_code", [])]
    spots += [(p, s) for p, s in lay.scalars.get("OperatorCode.version", [])]
    if not spots:
        return None
    pos, size = rng.choice(spots)
    if size == 1:
        new = bytes([rng.choice([0, 1, 2, 5, 0x7F, 0x80, 0xFF, rng.randrange(256)])])
    elif size == 2:
        new = struct.pack("<H", rng.choice([0, 1, 0xFFFF, 0x7FFF, rng.randrange(1 << 16)]))
    else:
        new = _i32(rng.choice([0, 1, -1, 2, 3, 7, 100, -100, 0x7FFFFFFF, -0x80000000, 65536, rng.randint(-9, 9)]))
    return Mutation("options", f"field at {pos} ({size} bytes) -> {new.hex()}", [(pos, new)])


def _m_tensor_type(rng, lay, base):
    cands = [(sg, i, t) for sg, i, t in _tensor_list(lay) if t["type"] is not None]
    if not cands:
        return None
    sg, i, t = rng.choice(cands)
    new = rng.choice(list(range(18)) + [18, 0x7F, 0x80, 0xFF])
    return Mutation("tensor_type", f"subgraph {sg} tensor {i} ('{t['name']}') type -> {new}",
                    [(t["type"], bytes([new]))])


def _m_quantization(rng, lay, base):
    cands = [q for q in lay.quant if q["scale"] or q["zero_point"] or q["quantized_dimension"]]
    if not cands:
        return None
    q = rng.choice(cands)
    r = rng.random()
    if q["scale"] and r < 0.5:
        pos = rng.choice(q["scale"])
        v = rng.choice([0.0, -1.0, float("nan"), float("inf"), 1e-45, 1e38])
        return Mutation("quantization", f"scale at {pos} -> {v}", [(pos, struct.pack("<f", v))])
    if q["zero_point"] and r < 0.8:
        pos = rng.choice(q["zero_point"])
        v = rng.choice([-(1 << 63), (1 << 63) - 1, 128, -129, 1 << 40])
        return Mutation("quantization", f"zero point at {pos} -> {v}", [(pos, struct.pack("<q", v))])
    if q["quantized_dimension"] is not None:
        pos = q["quantized_dimension"]
        v = rng.choice([-1, 4, 17, 0x7FFFFFFF, -0x80000000])
        return Mutation("quantization", f"quantized_dimension at {pos} -> {v}", [(pos, _i32(v))])
    return None


MUTATORS = {
    "bitflip": _m_bitflip, "truncate": _m_truncate, "offset": _m_offset,
    "vector_length": _m_vector_length, "shape": _m_shape, "buffer_index": _m_buffer_index,
    "opcode_index": _m_opcode_index, "op_index": _m_op_index, "cycle": _m_cycle,
    "string": _m_string, "options": _m_options, "tensor_type": _m_tensor_type,
    "quantization": _m_quantization,
}
WEIGHTS = {"bitflip": 3, "truncate": 1, "offset": 2, "vector_length": 2, "shape": 3,
           "buffer_index": 1, "opcode_index": 2, "op_index": 2, "cycle": 1, "string": 1,
           "options": 3, "tensor_type": 1, "quantization": 1}


# == cases ===========================================================================================
class Corpus:
    """The seed models, their layouts, and how often each is picked."""

    def __init__(self, include_shared: bool = True, shared_weight: float = 0.25,
                 shared_max_bytes: Optional[int] = None):
        self.models = builder_seeds()
        shared = shared_seeds(max_bytes=shared_max_bytes) if include_shared else {}
        self.models.update(shared)
        self.layouts = {name: walk(data) for name, data in self.models.items()}
        self.names = sorted(self.models)
        # builder seeds share (1 - shared_weight) of the picks, shared models the rest
        n_b = sum(1 for n in self.names if not n.startswith("shared:"))
        n_s = len(self.names) - n_b
        self.weights = [(shared_weight / n_s if n.startswith("shared:") else
                         (1 - shared_weight if n_s else 1.0) / n_b) for n in self.names]


@dataclass
class Case:
    index: int
    run_seed: int
    model: str
    mutations: list
    input_seed: int
    backend: str = "reference"

    @property
    def classes(self) -> list:
        return [m.cls for m in self.mutations]

    def data(self, corpus: Corpus) -> bytes:
        return apply_mutations(corpus.models[self.model], self.mutations)

    def to_json(self) -> dict:
        return {"index": self.index, "run_seed": self.run_seed, "model": self.model,
                "input_seed": self.input_seed, "backend": self.backend,
                "mutations": [m.to_json() for m in self.mutations]}


def make_case(corpus: Corpus, run_seed: int, index: int, cpu_share: float = 0.0,
              classes=None) -> Case:
    """Case `index` of run `run_seed`: deterministic (same corpus, same case)."""
    # the module's old name stays in the key: (run seed, case) gives the same case as before
    rng = random.Random(f"tflite_taichi.fuzz:{run_seed}:{index}")
    model = rng.choices(corpus.names, weights=corpus.weights)[0]
    lay, base = corpus.layouts[model], corpus.models[model]
    names = list(classes or MUTATORS)
    weights = [WEIGHTS.get(n, 1) for n in names]
    count = 1 if rng.random() < 0.7 else rng.randint(2, 3)
    mutations = []
    for _ in range(30):
        if len(mutations) >= count:
            break
        cls = rng.choices(names, weights=weights)[0]
        if cls == "truncate" and any(m.cut is not None for m in mutations):
            continue
        m = MUTATORS[cls](rng, lay, base)
        if m is not None:
            mutations.append(m)
        elif classes and not mutations:     # the class does not apply here: another model
            model = rng.choices(corpus.names, weights=corpus.weights)[0]
            lay, base = corpus.layouts[model], corpus.models[model]
    input_seed = rng.randrange(1 << 32)
    on_cpu = rng.random() < cpu_share and not model.startswith("shared:")
    backend = "cpu" if on_cpu else "reference"
    return Case(index=index, run_seed=run_seed, model=model, mutations=mutations,
                input_seed=input_seed, backend=backend)


# == running one case ============================================================================
class CaseTimeout(BaseException):
    """Raised in the worker by SIGPROF (BaseException: no `except Exception` swallows it)."""


def _random_inputs(interpreter, rng):
    """Random values of each input's shape and dtype (a large input repeats a random block of
    64K values: the point is the run, not the numbers)."""
    for d in interpreter.get_input_details():
        dtype = d["dtype"]
        if dtype is None:
            continue
        shape = tuple(int(s) for s in d["shape"])
        dt = np.dtype(dtype)
        count = int(np.prod(shape, dtype=np.float64))
        block = shape if count <= (1 << 16) else (1 << 16,)
        if dt.kind == "f":
            value = rng.standard_normal(block, dtype=np.float32).astype(dt)
        elif dt.kind == "b":
            value = rng.integers(0, 2, block).astype(bool)
        elif dt.kind == "c":
            value = (rng.standard_normal(block, dtype=np.float32) * (1 + 1j)).astype(dt)
        elif dt in (np.dtype(np.int8), np.dtype(np.uint8), np.dtype(np.int16)):
            info = np.iinfo(dt)
            value = rng.integers(info.min, int(info.max) + 1, block, dtype=dt)
        else:                      # int32/int64 inputs are often indices or counts: keep them small
            value = rng.integers(0, 4, block, dtype=dt)
        if block != shape:
            value = np.resize(value, shape)
        interpreter.set_tensor(d["index"], value)


class _WhileWatch:
    """The WHILE loops running now and their progress: control._run (which runs a cond or a
    body subgraph) is wrapped while a case runs, and each call from _while_reference counts for
    that loop (two calls an iteration) with the CPU time it began at. A loop is held by its
    frame (identity, never a reused id) and forgotten once it is no longer among the callers."""

    def __init__(self):
        from tflite_taichi.ops import control
        self.control, self.run, self.code = control, control._run, control._while_reference.__code__
        self.loops: list = []      # [frame, calls, CPU time of the last call], outermost first

    def __enter__(self):
        run = self.run

        def counted(*args, **kwargs):
            frame = sys._getframe(1)
            if frame.f_code is self.code:
                self._seen(frame)
            return run(*args, **kwargs)
        self.control._run = counted
        return self

    def __exit__(self, *exc):
        self.control._run = self.run      # the loops stay, for endless() on the timeout

    def _seen(self, frame) -> None:
        callers = []
        f = frame
        while f is not None:
            callers.append(f)
            f = f.f_back
        self.loops = [loop for loop in self.loops if any(loop[0] is c for c in callers)]
        for loop in self.loops:
            if loop[0] is frame:
                break
        else:
            loop = [frame, 0, 0.0]
            self.loops.append(loop)
        loop[1] += 1
        loop[2] = time.process_time()

    def endless(self, tb, time_limit: float) -> Optional[dict]:
        """The timeout's WHILE loop if one among the traceback's frames was still iterating:
        ENDLESS_MIN_ITERATIONS begun, the last within ENDLESS_STALE_FRACTION of the limit.
        A timeout inside a WHILE whose current iteration stalls (a slow or stuck op in its
        body), or one that iterated only a few times, is no endless loop: it counts as a
        timeout (run again with SLOW_FACTOR x the limit, a failure if it does not finish)."""
        frames = [f for f, _ in traceback.walk_tb(tb)]
        now = time.process_time()
        for frame, calls, last in self.loops:
            if any(frame is f for f in frames) and calls // 2 >= ENDLESS_MIN_ITERATIONS \
                    and now - last <= ENDLESS_STALE_FRACTION * time_limit:
                return {"iterations": calls // 2, "since_last_s": round(now - last, 4)}
        return None

    def summary(self, tb) -> list:
        frames = [f for f, _ in traceback.walk_tb(tb)]
        now = time.process_time()
        return [{"iterations": calls // 2, "since_last_s": round(now - last, 4)}
                for frame, calls, last in self.loops if any(frame is f for f in frames)]


def check_model(data: bytes, backend: str = "reference", input_seed: int = 0,
                time_limit: Optional[float] = None) -> dict:
    """Load, allocate, feed random inputs, invoke and read the outputs of one model; the
    outcome as a dict (see the module docstring)."""
    from tflite_taichi import Interpreter
    from tflite_taichi.errors import InputError, ModelError
    start = time.perf_counter()
    stage = "load"
    previous = None
    watch = _WhileWatch()
    if time_limit:
        previous = signal.signal(signal.SIGPROF, _on_alarm)
        # CPU time of this process; then again every 10 ms of CPU: a CaseTimeout raised where
        # Python ignores exceptions (a __del__, a weakref callback) must not let the case run on
        signal.setitimer(signal.ITIMER_PROF, time_limit, 0.01)
    try:
        try:
            watch.__enter__()
            it = Interpreter(model_content=data, backend=backend)
            stage = "allocate"
            it.allocate_tensors()
            stage = "inputs"
            _random_inputs(it, np.random.default_rng(input_seed))
            stage = "invoke"
            it.invoke()
            stage = "outputs"
            for d in it.get_output_details():
                it.get_tensor(d["index"])
            result = {"outcome": "ok"}
        finally:
            if time_limit:
                signal.setitimer(signal.ITIMER_PROF, 0)
                signal.signal(signal.SIGPROF, previous)
            watch.__exit__()
    except CaseTimeout as e:
        loop = watch.endless(e.__traceback__, time_limit)
        result = {"outcome": "endless_loop" if loop else "timeout",
                  "exc_type": "CaseTimeout", "message": f"over {time_limit} s of CPU time",
                  "traceback": "".join(traceback.format_tb(e.__traceback__)[-8:]),
                  "while_loops": watch.summary(e.__traceback__)}
    except BaseException as e:   # noqa: B036  (the point is to classify everything)
        if isinstance(e, KeyboardInterrupt):
            raise
        kind = f"{type(e).__module__}.{type(e).__qualname__}"
        message = str(e)
        if isinstance(e, (ModelError, InputError)) and not message.strip():
            outcome = "empty_message"
        elif isinstance(e, ModelError):
            outcome = "model_error"
        elif isinstance(e, InputError) and stage == "invoke":
            outcome = "input_error"     # data only known at run time (an index out of range)
        else:
            outcome = "exception"
        result = {"outcome": outcome, "exc_type": kind, "message": message[:2000]}
        cause = e.__cause__
        if isinstance(e, ModelError) and cause is not None and not isinstance(cause, ModelError):
            # graph.execute's guard: an op's reference failed on what the model gave it
            op = message.split(":", 1)[0]
            result["guarded"] = f"{op}: {type(cause).__name__}"
            result["traceback"] = "".join(traceback.format_exception(type(cause), cause, cause.__traceback__)[-6:])
        if outcome not in PASSES:
            result["traceback"] = "".join(traceback.format_exception(type(e), e, e.__traceback__)[-12:])
    result["stage"] = stage
    result["seconds"] = time.perf_counter() - start
    return result


# == the worker process ==========================================================================
def _send(fd: int, obj):
    payload = pickle.dumps(obj, protocol=pickle.HIGHEST_PROTOCOL)
    data = struct.pack("<Q", len(payload)) + payload
    view = memoryview(data)
    while view:
        n = os.write(fd, view)
        view = view[n:]


def _recv_exact(fd: int, n: int, deadline: Optional[float]) -> Optional[bytes]:
    chunks, got = [], 0
    while got < n:
        if deadline is not None:
            left = deadline - time.monotonic()
            if left <= 0:
                raise TimeoutError
            ready, _, _ = select.select([fd], [], [], left)
            if not ready:
                raise TimeoutError
        chunk = os.read(fd, min(n - got, 1 << 20))
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def _recv(fd: int, deadline: Optional[float] = None):
    head = _recv_exact(fd, 8, deadline)
    if head is None:
        return None
    body = _recv_exact(fd, struct.unpack("<Q", head)[0], deadline)
    return None if body is None else pickle.loads(body)


def _on_alarm(signum, frame):
    raise CaseTimeout()


def worker_main(fd_in: int, fd_out: int, backend: str):
    """A worker: reads (data, backend, input seed, limit) requests, answers outcome dicts."""
    try:
        import resource
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        limit = WORKER_MEMORY_LIMIT if backend == "reference" else max(WORKER_MEMORY_LIMIT, 64 << 30)
        if hard == resource.RLIM_INFINITY or hard > limit:
            resource.setrlimit(resource.RLIMIT_AS, (limit, hard))
    except (ImportError, ValueError, OSError):
        pass
    import warnings
    warnings.simplefilter("ignore")
    signal.signal(signal.SIGPROF, _on_alarm)
    import tflite_taichi  # noqa: F401  (the import cost is paid before "ready")
    if backend != "reference":      # start the Taichi runtime once
        check_model(_seed_elementwise().finish(), backend)
    _send(fd_out, {"ready": os.getpid()})
    while True:
        req = _recv(fd_in)
        if req is None:
            return
        try:
            result = check_model(req["data"], req["backend"], req["input_seed"], req["limit"])
        except CaseTimeout:     # the alarm landed just as the case ended: it was at the limit
            result = {"outcome": "timeout", "exc_type": "CaseTimeout", "stage": "?",
                      "message": f"over {req['limit']} s of CPU time", "seconds": req["limit"]}
        _send(fd_out, result)


class _Worker:
    """A long-lived worker process and the pipes to it."""

    def __init__(self, backend: str, log_dir: str):
        self.backend = backend
        req_r, req_w = os.pipe()
        resp_r, resp_w = os.pipe()
        os.makedirs(log_dir, exist_ok=True)
        self.log_path = os.path.join(log_dir, f"worker-{backend}-{time.monotonic_ns()}.log")
        env = dict(os.environ, PYTHONFAULTHANDLER="1", TI_LOG_LEVEL="error", OMP_NUM_THREADS="1",
                   OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
        with open(self.log_path, "wb") as log:
            self.proc = subprocess.Popen(
                [sys.executable, os.path.abspath(__file__), "--worker", backend,
                 "--fds", str(req_r), str(resp_w)],
                stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                pass_fds=(req_r, resp_w), env=env, close_fds=True,
                cwd=log_dir)    # a script puts its own folder (bench/) first on sys.path, not
                                # the cwd: the worker imports the installed tflite_taichi
        os.close(req_r)
        os.close(resp_w)
        self.fd_req, self.fd_resp = req_w, resp_r
        ready = None
        try:
            ready = _recv(self.fd_resp, time.monotonic() + 180)
        except TimeoutError:
            pass
        if not ready:
            self.kill()
            raise RuntimeError(f"fuzz worker ({backend}) did not start; see {self.log_path}")

    def run(self, data: bytes, backend: str, input_seed: int, limit: float) -> dict:
        try:
            _send(self.fd_req, {"data": data, "backend": backend, "input_seed": input_seed, "limit": limit})
            wall = HARD_KILL_FACTOR * limit + HARD_KILL_GRACE_S
            result = _recv(self.fd_resp, time.monotonic() + wall)
        except TimeoutError:
            self.kill()
            return {"outcome": "hang", "message": f"no answer within {wall} s; killed",
                    "stage": "?", "seconds": wall}
        except (BrokenPipeError, OSError):
            result = None
        if result is None:
            code = self.proc.wait(timeout=30)
            tail = self._log_tail()
            self.close()
            what = f"signal {-code} ({signal.Signals(-code).name})" if code < 0 else f"exit code {code}"
            return {"outcome": "crash", "message": f"worker died: {what}", "traceback": tail,
                    "stage": "?", "seconds": 0.0}
        return result

    def _log_tail(self) -> str:
        try:
            with open(self.log_path, "rb") as f:
                return f.read()[-3000:].decode("utf-8", "replace")
        except OSError:
            return ""

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self):
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait()
        self.close()

    def close(self):
        for fd in (self.fd_req, self.fd_resp):
            try:
                os.close(fd)
            except OSError:
                pass
        self.fd_req = self.fd_resp = -1
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        try:
            os.unlink(self.log_path)
        except OSError:
            pass


class Pool:
    """`jobs` slots, each keeping one worker per backend; a worker that crashes, hangs or times
    out is replaced before the next case. A case that gets no answer (`hang`) runs once more;
    one over its CPU-time limit (`timeout`) runs once more with SLOW_FACTOR x the limit: if it
    finishes then, its outcome counts and the case is marked `slow` (listed in the report)."""

    def __init__(self, jobs: int = 2, time_limit: float = TIME_LIMIT_S, log_dir: Optional[str] = None,
                 cpu_time_limit: float = CPU_TIME_LIMIT_S, slow_factor: float = SLOW_FACTOR):
        self.jobs = max(1, jobs)
        self.slow_factor = slow_factor
        self.time_limit = time_limit
        self.cpu_time_limit = cpu_time_limit
        self.log_dir = log_dir or os.path.join(os.environ.get("TMPDIR", "/tmp"), f"tflite_taichi_fuzz_{os.getpid()}")
        self._slots = [dict() for _ in range(self.jobs)]
        self.restarts = 0

    def _worker(self, slot: int, backend: str) -> _Worker:
        w = self._slots[slot].get(backend)
        if w is None or not w.alive:
            w = _Worker(backend, self.log_dir)
            self._slots[slot][backend] = w
        return w

    def run_one(self, slot: int, data: bytes, backend: str, input_seed: int) -> dict:
        result = self._run(slot, data, backend, input_seed)
        if result["outcome"] == "hang":         # no answer at all: once more, the same limit
            again = self._run(slot, data, backend, input_seed)
            if again["outcome"] != "hang":
                again.setdefault("slow", "hang once")
                result = again
        if result["outcome"] == "timeout":      # over the limit: is it work, or stuck?
            again = self._run(slot, data, backend, input_seed, self.slow_factor)
            if again["outcome"] in PASSES:
                again["slow"] = f"{again['seconds']:.1f} s"
            result = again
        return result

    def _run(self, slot, data, backend, input_seed, factor: float = 1.0):
        w = self._worker(slot, backend)
        limit = factor * (self.time_limit if backend == "reference" else self.cpu_time_limit)
        result = w.run(data, backend, input_seed, limit)
        if result["outcome"] in ("crash", "hang") or result["outcome"] == "timeout":
            if result["outcome"] == "timeout":
                w.kill()            # state after an interrupted case is not trusted
            self._slots[slot].pop(backend, None)
            self.restarts += 1
        return result

    def map(self, jobs_iter, run):
        """Run `run(slot, item)` for every item of `jobs_iter`, `self.jobs` at a time, in
        threads (the work happens in the worker processes). Yields (item, result)."""
        q = queue.Queue()
        items = list(jobs_iter)
        for item in items:
            q.put(item)
        out = queue.Queue()

        def loop(slot):
            while True:
                try:
                    item = q.get_nowait()
                except queue.Empty:
                    return
                try:
                    out.put((item, run(slot, item)))
                except BaseException as e:     # noqa: B036  (report, keep the pool going)
                    out.put((item, {"outcome": "harness", "exc_type": type(e).__name__,
                                    "message": str(e), "traceback": traceback.format_exc(),
                                    "stage": "?", "seconds": 0.0}))

        threads = [threading.Thread(target=loop, args=(s,), daemon=True) for s in range(self.jobs)]
        for t in threads:
            t.start()
        for _ in items:
            yield out.get()
        for t in threads:
            t.join()

    def close(self):
        for slot in self._slots:
            for w in slot.values():
                w.kill()
            slot.clear()
        try:
            os.rmdir(self.log_dir)
        except OSError:
            pass


# == a run ===========================================================================================
PASSES = ("ok", "model_error", "input_error", "endless_loop")


def failure_signature(result: dict) -> tuple:
    return (result["outcome"], result.get("exc_type"))


def minimise(pool: Pool, slot: int, case: Case, corpus: Corpus, result: dict, budget: int = 40):
    """The smallest set of edits (from the case's mutations) that still fails the same way.
    Returns (mutations, data)."""
    want = failure_signature(result)
    base = corpus.models[case.model]
    # one Mutation per edit (and one for the cut), then drop what is not needed
    atoms = []
    for m in case.mutations:
        for e in m.edits:
            atoms.append(Mutation(m.cls, m.desc, [e]))
        if m.cut is not None:
            atoms.append(Mutation(m.cls, m.desc, [], cut=m.cut))
    tries = 0

    def fails(muts) -> bool:
        nonlocal tries
        tries += 1
        r = pool.run_one(slot, apply_mutations(base, muts), case.backend, case.input_seed)
        return failure_signature(r) == want

    i = 0
    while i < len(atoms) and tries < budget and len(atoms) > 1:
        trial = atoms[:i] + atoms[i + 1:]
        if fails(trial):
            atoms = trial
        else:
            i += 1
    return atoms, apply_mutations(base, atoms)


def save_failure(folder: str, case: Case, corpus: Corpus, result: dict, minimal=None,
                 command: Optional[str] = None) -> str:
    path = os.path.join(folder, f"seed{case.run_seed}-case{case.index}")
    os.makedirs(path, exist_ok=True)
    with open(os.path.join(path, "case.tflite"), "wb") as f:
        f.write(case.data(corpus))
    record = {"case": case.to_json(), "result": result,
              "reproduce": command or f"python bench/fuzz.py --seed {case.run_seed} --case {case.index}"}
    if minimal is not None:
        atoms, data = minimal
        with open(os.path.join(path, "minimal.tflite"), "wb") as f:
            f.write(data)
        record["minimal_mutations"] = [m.to_json() for m in atoms]
    with open(os.path.join(path, "case.json"), "w") as f:
        json.dump(record, f, indent=1, default=str)
    return path


@dataclass
class Report:
    seed: int
    cases: int
    jobs: int
    seconds: float
    outcomes: collections.Counter
    by_class: dict                  # class -> Counter of outcomes
    by_model: dict                  # model -> Counter of outcomes
    error_types: collections.Counter
    stages: collections.Counter     # stage of model errors
    guarded: collections.Counter    # "CauseType in OP" of graph.execute's guard
    guarded_examples: dict          # the same -> the first case index that raised it
    slow: int
    slow_cases: list                # (index, model, mutations, time, outcome)
    restarts: int
    failures: list                  # (case, result, saved folder or None)
    backends: collections.Counter
    case_seconds: list
    cpu_share: float = 0.0
    classes: Optional[list] = None

    def reproduce_command(self, index) -> str:
        extra = f" --cpu-share {self.cpu_share}" if self.cpu_share else ""
        extra += f" --classes {','.join(self.classes)}" if self.classes else ""
        return f"python bench/fuzz.py --seed {self.seed} --case {index}{extra}"

    @property
    def failed(self) -> int:
        return len(self.failures)

    @property
    def rate(self) -> float:
        return self.cases / self.seconds if self.seconds else 0.0

    def summary(self) -> str:
        lines = [f"fuzz seed {self.seed}: {self.cases} cases in {self.seconds:.1f} s "
                 f"({self.rate:.1f}/s, {self.jobs} jobs), worker restarts {self.restarts}, slow {self.slow}",
                 "outcomes: " + ", ".join(f"{k} {v}" for k, v in sorted(self.outcomes.items())),
                 "model errors by stage: " + ", ".join(f"{k} {v}" for k, v in self.stages.most_common()),
                 "guarded op failures: " + (", ".join(f"{k} {v} (case {self.guarded_examples.get(k)})"
                                                      for k, v in self.guarded.most_common()) or "none")]
        for case, result, saved in self.failures[:20]:
            lines.append(f"FAIL case {case.index} ({case.model}; {'; '.join(m.desc for m in case.mutations)}; "
                         f"{case.backend}): {result['outcome']} {result.get('exc_type', '')}: "
                         f"{str(result.get('message', ''))[:300]}")
            lines.append(f"  reproduce: {self.reproduce_command(case.index)}"
                         + (f"  (saved: {saved})" if saved else ""))
            if result.get("traceback"):
                lines.append("  " + result["traceback"].strip().replace("\n", "\n  ")[-1500:])
        return "\n".join(lines)


def run_fuzz(cases: int = 300, seed: Optional[int] = None, jobs: int = 2, out: Optional[str] = None,
             cpu_share: float = 0.0, include_shared: bool = True, time_limit: float = TIME_LIMIT_S,
             shared_weight: float = 0.25, progress=None, minimise_failures: int = 10,
             corpus: Optional[Corpus] = None, classes=None) -> Report:
    """Run `cases` mutated models; failures minimised and saved under `out` (if given)."""
    seed = int(time.time() * 1000) % (1 << 31) if seed is None else int(seed)
    corpus = corpus or Corpus(include_shared=include_shared, shared_weight=shared_weight)
    pool = Pool(jobs, time_limit)
    start = time.perf_counter()
    outcomes, error_types, stages, backends, guarded = (collections.Counter() for _ in range(5))
    by_class = collections.defaultdict(collections.Counter)
    by_model = collections.defaultdict(collections.Counter)
    failures, slow, case_seconds, guarded_examples, slow_cases = [], 0, [], {}, []

    def run(slot, index):
        case = make_case(corpus, seed, index, cpu_share, classes)
        result = pool.run_one(slot, case.data(corpus), case.backend, case.input_seed)
        return case, result

    try:
        done = 0
        for _index, (case, result) in pool.map(range(cases), run):
            done += 1
            o = result["outcome"]
            outcomes[o] += 1
            backends[case.backend] += 1
            for cls in sorted(set(case.classes)):
                by_class[cls][o] += 1
            by_model[case.model][o] += 1
            if o == "model_error":
                error_types[result["exc_type"].rsplit(".", 1)[-1]] += 1
                stages[result["stage"]] += 1
                if "guarded" in result:
                    key = (result["guarded"].split(": ", 1)[-1] + " in "
                           + result["guarded"].split(" (", 1)[-1].split(")")[0])
                    guarded[key] += 1
                    guarded_examples.setdefault(key, case.index)
            if "slow" in result:
                slow += 1
                slow_cases.append((case.index, case.model, "; ".join(m.desc for m in case.mutations),
                                   result["slow"], result["outcome"]))
            case_seconds.append(result.get("seconds", 0.0))
            if o not in PASSES:
                failures.append((case, result, None))
            if progress:
                progress(done, cases, case, result)
        seconds = time.perf_counter() - start
        saved = []
        for n, (case, result, _) in enumerate(failures):
            minimal = None
            if n < minimise_failures:
                try:
                    minimal = minimise(pool, 0, case, corpus, result)
                except Exception:     # noqa: BLE001  (minimising is best effort)
                    minimal = None
            extra = f" --cpu-share {cpu_share}" if cpu_share else ""
            extra += f" --classes {','.join(classes)}" if classes else ""
            command = f"python bench/fuzz.py --seed {seed} --case {case.index}{extra}"
            folder = save_failure(out, case, corpus, result, minimal, command) if out else None
            saved.append((case, result, folder))
        failures = saved
    finally:
        pool.close()
    return Report(seed=seed, cases=cases, jobs=jobs, seconds=seconds, outcomes=outcomes,
                  by_class=dict(by_class), by_model=dict(by_model), error_types=error_types,
                  stages=stages, guarded=guarded, guarded_examples=guarded_examples, slow=slow,
                  slow_cases=slow_cases, restarts=pool.restarts, failures=failures,
                  backends=backends, case_seconds=case_seconds, cpu_share=cpu_share,
                  classes=list(classes) if classes else None)


def _versions() -> str:
    import flatbuffers
    import tflite_taichi
    parts = [f"python {platform.python_version()}", f"numpy {np.__version__}",
             f"flatbuffers {getattr(flatbuffers, '__version__', '?')}",
             f"tflite_taichi {tflite_taichi.__version__}"]
    try:
        import importlib.metadata as md
        parts.append(f"tflite (bindings) {md.version('tflite')}")
        parts.append(f"taichi {md.version('taichi')}")
    except Exception:   # noqa: BLE001
        pass
    return ", ".join(parts)


def _git_commit() -> str:
    try:
        return subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True,
                              cwd=os.path.dirname(os.path.abspath(__file__)), timeout=10).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        return "?"


def report_markdown(report: Report, command: str) -> str:
    """The long run's record (bench/results/fuzz_long.md)."""
    cs = sorted(report.case_seconds) or [0.0]
    cpu = os.cpu_count()
    lines = [
        "# Fuzzing: mutated models (long mode)", "",
        f"- command: `{command}`",
        f"- date: {time.strftime('%Y-%m-%d %H:%M:%S %Z')}; commit {_git_commit()} (plus the working tree)",
        f"- machine: {platform.machine()}, {cpu} CPU cores, {platform.platform()}",
        f"- versions: {_versions()}",
        f"- seed: {report.seed} (rerun one case: `{report.reproduce_command('N')}`)",
        f"- cases: {report.cases}, jobs: {report.jobs}, backends: "
        + ", ".join(f"{k} {v}" for k, v in sorted(report.backends.items())),
        f"- duration: {report.seconds:.0f} s ({report.rate:.1f} cases/s); per case median "
        f"{cs[len(cs) // 2] * 1000:.0f} ms, 99th percentile {cs[int(len(cs) * 0.99)] * 1000:.0f} ms, "
        f"max {cs[-1] * 1000:.0f} ms",
        f"- worker restarts: {report.restarts}; slow cases (over {TIME_LIMIT_S:g} s of CPU time, finished "
        f"within {SLOW_FACTOR:g}x that): {report.slow}",
        f"- failures: **{report.failed}**", "",
        "## Outcomes", "", "| outcome | cases |", "| --- | --- |",
    ]
    lines += [f"| {k} | {v} |" for k, v in sorted(report.outcomes.items(), key=lambda kv: -kv[1])]
    names = sorted(set(PASSES) | {o for c in report.by_class.values() for o in c})
    lines += ["", "## Per mutation class (a case with several mutations counts for each class)", "",
              "| class | " + " | ".join(names) + " |", "| --- |" + " --- |" * len(names)]
    for cls in sorted(report.by_class):
        c = report.by_class[cls]
        lines.append(f"| {cls} | " + " | ".join(str(c.get(n, 0)) for n in names) + " |")
    lines += ["", "## Per seed model", "", "| model | " + " | ".join(names) + " |",
              "| --- |" + " --- |" * len(names)]
    for model in sorted(report.by_model):
        c = report.by_model[model]
        lines.append(f"| {model} | " + " | ".join(str(c.get(n, 0)) for n in names) + " |")
    lines += ["", "## Documented errors", "",
              "By type: " + ", ".join(f"{k} {v}" for k, v in report.error_types.most_common()),
              "", "By stage: " + ", ".join(f"{k} {v}" for k, v in report.stages.most_common()),
              "", "Raised by graph.execute's guard (an op's computation failed on what the mutated "
              "model gave it; the original exception is the ModelError's `__cause__`): "
              + (", ".join(f"{k} {v}" for k, v in report.guarded.most_common()) or "none")]
    if report.slow_cases:
        lines += ["", "## Slow cases (heavy work a mutation let through the memory limit)", "",
                  "| case | model | mutations | time | outcome |", "| --- | --- | --- | --- | --- |"]
        lines += [f"| {i} | {m} | {d} | {t} | {o} |" for i, m, d, t, o in report.slow_cases[:30]]
    if report.failures:
        lines += ["", "## Failures", "", "```", report.summary(), "```"]
    return "\n".join(lines) + "\n"


def reproduce(seed: int, index: int, cpu_share: float = 0.0, include_shared: bool = True,
              shared_weight: float = 0.25, classes=None) -> dict:
    """Rerun one case in this process (for a debugger); prints what it does."""
    corpus = Corpus(include_shared=include_shared, shared_weight=shared_weight)
    case = make_case(corpus, seed, index, cpu_share, classes)
    print(f"case {index} of seed {seed}: model {case.model}, backend {case.backend}, input seed {case.input_seed}")
    for m in case.mutations:
        print(f"  {m.cls}: {m.desc}")
    result = check_model(case.data(corpus), case.backend, case.input_seed)
    print(json.dumps(result, indent=1, default=str))
    return result


def main(argv=None, default_cases: int = 300, default_report: Optional[str] = None,
         prog: str = "python bench/fuzz.py") -> int:
    p = argparse.ArgumentParser(prog="python bench/fuzz.py", description=__doc__.split("\n")[0])
    p.add_argument("--cases", type=int, default=default_cases)
    p.add_argument("--seed", type=int, default=None,
                   help="run seed (default: TFLITE_TAICHI_FUZZ_SEED, else from the clock)")
    p.add_argument("--jobs", type=int, default=2)
    p.add_argument("--out", default="fuzz-failures", help="folder for failing cases")
    p.add_argument("--report", default=default_report, help="write a markdown report here")
    p.add_argument("--cpu-share", type=float, default=0.0,
                   help="share of cases run on Taichi's cpu backend instead of the reference path")
    p.add_argument("--shared-weight", type=float, default=0.25,
                   help="share of cases built from ../shared/models")
    p.add_argument("--no-shared", action="store_true", help="builder seeds only")
    p.add_argument("--time-limit", type=float, default=TIME_LIMIT_S)
    p.add_argument("--classes", default=None,
                   help="comma-separated mutation classes to use (default: all): " + ", ".join(MUTATORS))
    p.add_argument("--case", type=int, default=None, help="rerun case N of --seed in this process")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--fds", type=int, nargs=2, default=None, help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    classes = args.classes.split(",") if args.classes else None
    if classes and not set(classes) <= set(MUTATORS):
        p.error(f"unknown mutation classes: {sorted(set(classes) - set(MUTATORS))}")
    if args.worker:
        worker_main(args.fds[0], args.fds[1], args.worker)
        return 0
    seed = args.seed
    if seed is None and os.environ.get("TFLITE_TAICHI_FUZZ_SEED"):
        seed = int(os.environ["TFLITE_TAICHI_FUZZ_SEED"])
    if args.case is not None:
        if seed is None:
            p.error("--case needs --seed")
        result = reproduce(seed, args.case, args.cpu_share, not args.no_shared, args.shared_weight, classes)
        return 0 if result["outcome"] in PASSES else 1

    def progress(done, total, case, result):
        if done % 100 == 0 or done == total or result["outcome"] not in PASSES:
            print(f"[{done}/{total}] case {case.index}: {result['outcome']}", flush=True)

    report = run_fuzz(cases=args.cases, seed=seed, jobs=args.jobs, out=args.out,
                      cpu_share=args.cpu_share, include_shared=not args.no_shared,
                      time_limit=args.time_limit, shared_weight=args.shared_weight, progress=progress,
                      classes=classes)
    print(report.summary())
    if args.report:
        command = " ".join([prog] + (argv if argv is not None else sys.argv[1:]))
        os.makedirs(os.path.dirname(os.path.abspath(args.report)), exist_ok=True)
        with open(args.report, "w") as f:
            f.write(report_markdown(report, command))
        print(f"report: {args.report}")
    return 1 if report.failed else 0


if __name__ == "__main__":
    sys.exit(main())
