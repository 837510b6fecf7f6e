"""One memory budget for the whole model: the tensors of every subgraph prepared (nested IF
branches included) and the temporary arrays an op's numpy reference makes (CONV_2D's patches)
count against one limit, 16 x max_tensor_bytes, checked at allocate_tensors before anything is
allocated. A fresh 16x budget per subgraph let every level of nested IFs add gigabytes, and
CONV_2D's im2col was not counted at all.

What the budget holds is checked on its numbers (ModelBudget.held()) as well as by what it
refuses: a refused resize keeps exactly the previous charges; a conv's temporaries count inside
IF branches and WHILE bodies, the largest of nested calls whichever call makes it, and again
when a cached call is reused by a later allocation (with the calls inside it, even those the
first allocation had counted already); what a data-dependent op is left at invoke leaves room
for the largest temporary.

The hostile models run in a child process whose address space is capped at 1.5 GiB above what
it has after its imports: the refusal must come out as a TensorTooLargeError naming the limit,
never a MemoryError or a kill, and no test allocates gigabytes."""
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from tflite_taichi import Interpreter
from tflite_taichi.builder import ModelBuilder
from tflite_taichi.errors import InputError, TensorTooLargeError

HEADROOM = 3 << 29              # 1.5 GiB above the child's address space after its imports
BIG = 60_000_000                # float32 elements: 240 MB, under the default 256 MiB per tensor

_CHILD = textwrap.dedent("""
    import resource, sys
    import numpy as np
    from tflite_taichi import Interpreter

    def address_space():
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize"))

    path, resize = sys.argv[1], sys.argv[2:]
    limit = address_space() + int(%d)
    resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
    try:
        it = Interpreter(model_path=path, backend="reference")
        for d in it.get_input_details():
            if resize and d["dtype"] == np.float32:
                it.resize_tensor_input(d["index"], [int(n) for n in resize])
        it.allocate_tensors()
        for d in it.get_input_details():
            it.set_tensor(d["index"], np.ones(d["shape"], d["dtype"]))
        it.invoke()
        print("ran")
    except BaseException as e:
        cause = e.__cause__
        print(type(e).__name__, e, "| cause:", type(cause).__name__ if cause else None)
""" % HEADROOM)


def _run_capped(tmp_path, model: bytes, *resize) -> str:
    """What the child says: 'ran', or the exception's type and message (and its cause's type)."""
    path = tmp_path / "model.tflite"
    path.write_bytes(model)
    env = {**os.environ, "OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", _CHILD, str(path), *map(str, resize)],
                          capture_output=True, text=True, timeout=300, env=env)
    assert done.returncode == 0, f"the child died ({done.returncode}): {done.stderr[-2000:]}"
    return done.stdout.strip()


def nested_ifs(levels: int, n: int, adds: int = 6) -> bytes:
    """Subgraph k (c, x[n]) computes `adds` ADDs of x (t1 = x + x, t2 = t1 + x, ...), then
    hands the last to IF(c) calling subgraph k + 1 on both branches, for k < `levels`; the last
    subgraph is a RELU of x. Each subgraph's tensors are adds + 2 arrays of n floats."""
    b = ModelBuilder()
    for level in range(levels + 1):
        g = b.subgraph(f"level{level}")
        c, x = g.input("c", (), np.bool_), g.input("x", (n,))
        if level == levels:
            y = g.tensor("y", (n,))
            g.op("RELU", [x], [y])
            g.output(y)
            continue
        t = x
        for i in range(adds):
            s = g.tensor(f"t{i}", (n,))
            g.op("ADD", [t, x], [s])
            t = s
        y = g.tensor("y", (n,))
        g.op("IF", [c, c, t], [y], then_subgraph_index=level + 1, else_subgraph_index=level + 1)
        g.output(y)
    return b.finish()


def conv_of_inputs(size: int, kernel: int) -> bytes:
    """CONV_2D of a size x size input by a kernel x kernel filter, both model inputs: a file of
    a few hundred bytes whose reference builds size^2 x kernel^2 floats of patches (im2col)."""
    b = ModelBuilder()
    g = b.subgraph("main")
    x = g.input("x", (1, size, size, 1))
    w = g.input("w", (1, kernel, kernel, 1))
    y = g.tensor("y", (1, size, size, 1))
    g.op("CONV_2D", [x, w], [y], padding="SAME", stride_w=1, stride_h=1)
    g.output(y)
    return b.finish()


# -- the whole model, one budget --------------------------------------------------------------
def test_nested_ifs_share_one_budget(tmp_path):
    """Three subgraphs of 8 x 240 MB each: 1.9 GB apiece, under the old per-subgraph 4.3 GB,
    5.8 GB together. Before: allocate_tensors passed and invoke ran out of memory."""
    model = nested_ifs(levels=2, n=BIG)
    assert len(model) < 8000
    said = _run_capped(tmp_path, model)
    assert said.startswith("TensorTooLargeError "), said
    assert "of shape [60000000], the model's tensors (all its subgraphs) would take" in said
    assert f"above the limit of 16 x {4 * len(model) + (256 << 20)} bytes" in said


def test_a_resize_of_nested_ifs_is_held_to_the_budget_too(tmp_path):
    """The same model declared with 2 elements, resized to 60M: an InputError naming the input,
    its cause the TensorTooLargeError; before, invoke ran out of memory."""
    said = _run_capped(tmp_path, nested_ifs(levels=2, n=2), BIG)
    assert said.startswith(f"InputError resizing input 'x' to [{BIG}] does not fit the model: "), said
    assert "the model's tensors (all its subgraphs) would take" in said
    assert said.endswith("| cause: TensorTooLargeError")


def test_a_conv_whose_patches_dwarf_its_tensors_is_refused(tmp_path):
    """A 1 MiB input and output, 4 GiB of patches: the reference's temporaries count."""
    model = conv_of_inputs(512, 64)
    assert len(model) < 1000
    said = _run_capped(tmp_path, model)
    assert said.startswith("TensorTooLargeError subgraph 0: with the 4296294400 bytes of temporary "
                           "arrays the numpy reference of op #0 (CONV_2D) makes, the model's "
                           "tensors (all its subgraphs) would take"), said


# -- the accounting, on small limits ----------------------------------------------------------
def test_every_level_of_nesting_counts():
    """14 tensors of 400 bytes per IF level, limit 16 x 1000 bytes: two levels (12 KB with the
    last RELU) fit, three (17.6 KB) do not; each level alone would."""
    x = np.arange(-50, 50, dtype=np.float32)
    it = Interpreter(model_content=nested_ifs(levels=2, n=100, adds=12), backend="reference",
                     max_tensor_bytes=1000)
    it.allocate_tensors()
    it.set_tensor(0, np.array(True))
    it.set_tensor(1, x)
    it.invoke()
    np.testing.assert_array_equal(it.get_tensor(it.get_output_details()[0]["index"]),
                                  np.maximum(13 * 13 * x, 0))
    deeper = Interpreter(model_content=nested_ifs(levels=3, n=100, adds=12), backend="reference",
                         max_tensor_bytes=1000)
    with pytest.raises(TensorTooLargeError, match=r"^op #12 \(IF\): in subgraph 1: .*in subgraph 3: "
                                                  r"subgraph 3: with input 1 \('x'\) of shape \[100\], "
                                                  r"the model's tensors \(all its subgraphs\) would "
                                                  r"take 16\d\d\d bytes together, above the limit of "
                                                  r"16 x 1000 bytes"):
        deeper.allocate_tensors()


def held_from_the_start(model: bytes, max_tensor_bytes: int, **resized) -> tuple:
    """What the budget of an interpreter allocated at these input shapes (by tensor name)
    from the start holds: ModelBudget.held()."""
    it = Interpreter(model_content=model, backend="reference", max_tensor_bytes=max_tensor_bytes)
    for d in it.get_input_details():
        if d["name"] in resized:
            it.resize_tensor_input(d["index"], resized[d["name"]])
    it.allocate_tensors()
    return it._runtime.budget.held()


def test_a_refused_resize_keeps_the_previous_charges():
    """A refused resize leaves the budget holding exactly the previous allocation's charges,
    however often it is tried (neither released nor charged twice); a smaller one then fits,
    and each allocation's charges replace the last ones: the budget holds what an interpreter
    allocated at those shapes from the start holds."""
    model = nested_ifs(levels=3, n=2, adds=12)
    it = Interpreter(model_content=model, backend="reference", max_tensor_bytes=1000)
    it.allocate_tensors()
    budget = it._runtime.budget
    before = budget.held()
    assert before == held_from_the_start(model, 1000) and before[0] > 0
    for _ in range(2):
        it.resize_tensor_input(1, [100])
        with pytest.raises(InputError, match=r"resizing input 'x' to \[100\] does not fit") as info:
            it.allocate_tensors()
        assert isinstance(info.value.__cause__, TensorTooLargeError)
        assert budget.held() == before
    for n in (50, 60, 50, 60):      # 50 and 60 together would not fit
        it.resize_tensor_input(1, [n])
        it.allocate_tensors()
        assert budget.held() == held_from_the_start(model, 1000, x=[n])
    it.set_tensor(0, np.array(False))
    it.set_tensor(1, np.full(60, -1.0, np.float32))
    it.invoke()
    np.testing.assert_array_equal(it.get_tensor(it.get_output_details()[0]["index"]), np.zeros(60))


def test_conv_patches_count_against_the_limit():
    """A 5x5 conv of a 16x16 input: 1 KB tensors, 25.6 KB of patches (+ the padded input)."""
    model = conv_of_inputs(16, 5)
    with pytest.raises(TensorTooLargeError, match=r"temporary arrays the numpy reference of op #0 "
                                                  r"\(CONV_2D\) makes"):
        Interpreter(model_content=model, backend="reference", max_tensor_bytes=1024).allocate_tensors()
    Interpreter(model_content=model, backend="reference", max_tensor_bytes=4096).allocate_tensors()


def test_data_dependent_shapes_get_what_the_model_leaves():
    """WHERE's output is known only at invoke: it must fit in what the prepared tensors leave
    of the budget (696 bytes here), which 60 indices (480 bytes) do and 100 (800) do not; the
    interpreter stays usable."""
    b = ModelBuilder()
    g = b.subgraph()
    t = g.input("x", (100,))
    for i in range(37):
        y = g.tensor(f"r{i}", (100,))
        g.op("RELU", [t], [y])
        t = y
    positive = g.tensor("positive", (100,), np.bool_)
    g.op("GREATER", [t, g.const("zero", np.float32(0))], [positive])
    where = g.tensor("where", (1, 1), np.int64)
    g.op("WHERE", [positive], [where])
    g.output(t, where)
    it = Interpreter(model_content=b.finish(), backend="reference", max_tensor_bytes=1000)
    it.allocate_tensors()
    x = np.full(100, -1.0, np.float32)
    for ones, fits in ((60, True), (100, False), (10, True)):
        x[:] = -1.0
        x[:ones] = 1.0
        it.set_tensor(0, x)
        if fits:
            it.invoke()
            assert it.get_tensor(it.get_output_details()[1]["index"]).shape == (ones, 1)
            continue
        with pytest.raises(TensorTooLargeError, match=r"^op #38 \(WHERE\): its outputs of shapes "
                                                      r"\[\[100, 1\]\] would take 800 bytes, above "
                                                      r"the 696 bytes the model's other tensors leave"):
            it.invoke()


# -- temporaries of called subgraphs ----------------------------------------------------------
SIDE = 16                       # the convs' inputs below: 1 x 16 x 16 x 1 floats, 1 KiB


def _conv(g, x, kernel: int, name: str = "h") -> int:
    """A SAME conv of x (1 x SIDE x SIDE x 1) by a constant kernel x kernel filter of ones."""
    h = g.tensor(name, (1, SIDE, SIDE, 1))
    w = g.const(f"{name}_filter", np.ones((1, kernel, kernel, 1), np.float32))
    g.op("CONV_2D", [x, w], [h], padding="SAME", stride_w=1, stride_h=1)
    return h


def conv_called_by(op: str) -> bytes:
    """main calls subgraph 1 (IF: both branches; WHILE: the body, i < n the cond) on x, which
    convolves x by a 5x5 filter: 1 KiB tensors, 27364 bytes of patches and padded input."""
    b = ModelBuilder()
    g = b.subgraph("main")
    shape = (1, SIDE, SIDE, 1)
    if op == "IF":
        c, x = g.input("c", (), np.bool_), g.input("x", shape)
        y = g.tensor("y", shape)
        g.op("IF", [c, c, x], [y], then_subgraph_index=1, else_subgraph_index=1)
        g.output(y)
        s = b.subgraph("branch")
        s.input("c", (), np.bool_)
        s.output(_conv(s, s.input("x", shape), 5))
        return b.finish()
    ins = [g.input("i", (), np.int32), g.input("n", (), np.int32), g.input("x", shape)]
    outs = [g.tensor("i_out", (), np.int32), g.tensor("n_out", (), np.int32), g.tensor("y", shape)]
    g.op("WHILE", ins, outs, cond_subgraph_index=2, body_subgraph_index=1)
    g.output(outs[2])
    s = b.subgraph("body")
    i, n, x = s.input("i", (), np.int32), s.input("n", (), np.int32), s.input("x", shape)
    i_next = s.tensor("i_next", (), np.int32)
    s.op("ADD", [i, s.const("one", np.int32(1))], [i_next])
    s.output(i_next, n, _conv(s, x, 5))
    s = b.subgraph("cond")
    i, n = s.input("i", (), np.int32), s.input("n", (), np.int32)
    s.input("x", shape)
    go = s.tensor("go", (), np.bool_)
    s.op("LESS", [i, n], [go])
    s.output(go)
    return b.finish()


@pytest.mark.parametrize("op", ["IF", "WHILE"])
def test_a_conv_in_a_called_subgraph_is_refused_like_one_in_main(op):
    """The conv's 27364 bytes of temporaries do not fit 16 x 1024 bytes beside its tensors,
    which alone would: allocate_tensors refuses it, naming the conv in the called subgraph."""
    model = conv_called_by(op)
    with pytest.raises(TensorTooLargeError, match=rf"^op #0 \({op}\): in subgraph 1: subgraph 1: "
                                                  r"with the 27364 bytes of temporary arrays the "
                                                  r"numpy reference of op #\d \(CONV_2D\) makes"):
        Interpreter(model_content=model, backend="reference", max_tensor_bytes=1024).allocate_tensors()
    it = Interpreter(model_content=model, backend="reference", max_tensor_bytes=4096)
    it.allocate_tensors()
    assert it._runtime.budget.held()[1] == 27364


def convs_in_ifs(kernels) -> bytes:
    """main (inputs c, x, z) hands x to IF calling subgraph 1 and RELUs z; subgraph k convolves
    its x by a kernels[k-1]-square filter, then hands the result to IF calling subgraph k + 1
    (the last returns its conv). Temporaries: 52292 bytes for a 7x7 conv, 10660 for a 3x3."""
    b = ModelBuilder()
    g = b.subgraph("main")
    shape = (1, SIDE, SIDE, 1)
    c, x, z = g.input("c", (), np.bool_), g.input("x", shape), g.input("z", (1,))
    y, relu = g.tensor("y", shape), g.tensor("relu", (1,))
    g.op("IF", [c, c, x], [y], then_subgraph_index=1, else_subgraph_index=1)
    g.op("RELU", [z], [relu])
    g.output(y, relu)
    for level, kernel in enumerate(kernels, start=1):
        s = b.subgraph(f"level{level}")
        c, x = s.input("c", (), np.bool_), s.input("x", shape)
        h = _conv(s, x, kernel)
        if level < len(kernels):
            y = s.tensor("y", shape)
            s.op("IF", [c, c, h], [y], then_subgraph_index=level + 1, else_subgraph_index=level + 1)
            h = y
        s.output(h)
    return b.finish()


# 16 x 4096 bytes: the tensors of convs_in_ifs with z of 1000 floats (15403 bytes) fit beside
# a 3x3 conv's temporaries, not beside a 7x7's; with z of one float (7411 bytes), they do
NESTED_LIMIT = 4096
REFUSED_FOR_THE_7X7 = r"would take 15403 bytes together \+ 52292 bytes of an op's temporary arrays"


@pytest.mark.parametrize("kernels", [(7, 3), (3, 7)], ids=["outer-largest", "inner-largest"])
def test_the_largest_temporary_of_nested_calls_counts(kernels):
    """Charged as the nested calls are prepared: the 7x7 conv's temporaries count whether it
    is the outer call's or the inner one's, and whichever is charged last."""
    it = Interpreter(model_content=convs_in_ifs(kernels), backend="reference",
                     max_tensor_bytes=NESTED_LIMIT)
    it.resize_tensor_input(2, [1000])
    with pytest.raises(InputError, match=REFUSED_FOR_THE_7X7):
        it.allocate_tensors()


@pytest.mark.parametrize("kernels", [(7, 3), (3, 7)], ids=["outer-largest", "inner-largest"])
def test_a_reused_call_brings_the_largest_temporary_of_its_calls(kernels):
    """The IF's call, prepared by the first allocation, is reused by the next (a resize of z
    alone): what it charges then carries the 7x7 conv's temporaries, wherever that conv is
    nested."""
    model = convs_in_ifs(kernels)
    it = Interpreter(model_content=model, backend="reference", max_tensor_bytes=NESTED_LIMIT)
    it.allocate_tensors()
    assert it._runtime.budget.held() == (7411, 52292)
    it.resize_tensor_input(2, [1000])
    with pytest.raises(InputError, match=r"resizing input 'z' to \[1000\] does not fit the model: "
                                         r".*" + REFUSED_FOR_THE_7X7):
        it.allocate_tensors()
    assert it._runtime.budget.held() == (7411, 52292)


def shared_call(n: int, adds: int = 12) -> bytes:
    """main (c, x, y, z): IF(c, y) calls subgraph 2 directly, then IF(c, x) calls subgraph 1,
    whose IF(c, x) calls subgraph 2 too, and z is RELUed; subgraph 2 makes `adds` ADDs of x."""
    b = ModelBuilder()
    g = b.subgraph("main")
    c, x, y, z = g.input("c", (), np.bool_), g.input("x", (n,)), g.input("y", (n,)), g.input("z", (1,))
    from_y, from_x, relu = g.tensor("from_y", (n,)), g.tensor("from_x", (n,)), g.tensor("relu", (1,))
    g.op("IF", [c, c, y], [from_y], then_subgraph_index=2, else_subgraph_index=2)
    g.op("IF", [c, c, x], [from_x], then_subgraph_index=1, else_subgraph_index=1)
    g.op("RELU", [z], [relu])
    g.output(from_y, from_x, relu)
    s = b.subgraph("outer")
    c, x = s.input("c", (), np.bool_), s.input("x", (n,))
    out = s.tensor("out", (n,))
    s.op("IF", [c, c, x], [out], then_subgraph_index=2, else_subgraph_index=2)
    s.output(out)
    s = b.subgraph("inner")
    s.input("c", (), np.bool_)
    t = x = s.input("x", (n,))
    for i in range(adds):
        u = s.tensor(f"t{i}", (n,))
        s.op("ADD", [t, x], [u])
        t = u
    s.output(t)
    return b.finish()


def test_a_reused_call_brings_the_calls_the_allocation_had_counted_already():
    """Subgraph 2 on 100 floats (5201 bytes) is counted once by the first allocation, for both
    IFs; when a resize of y leaves it called only from inside subgraph 1's cached preparation,
    it still counts: the budget holds what an interpreter allocated at those shapes from the
    start holds. Within 16 x 476 bytes (7616), 7611 at first, a resize of y to one float and z
    to 100 (53 bytes more, subgraph 2 on one float included) is refused."""
    model = shared_call(100)
    it = Interpreter(model_content=model, backend="reference", max_tensor_bytes=1000)
    it.allocate_tensors()
    assert it._runtime.budget.held() == (7611, 0)
    it.resize_tensor_input(2, [1])
    it.allocate_tensors()
    assert it._runtime.budget.held() == held_from_the_start(model, 1000, y=[1]) == (6872, 0)
    tight = Interpreter(model_content=model, backend="reference", max_tensor_bytes=476)
    tight.allocate_tensors()
    tight.resize_tensor_input(2, [1])
    tight.resize_tensor_input(3, [100])
    with pytest.raises(InputError, match=r"resizing input 'y' to \[1\], 'z' to \[100\] does not "
                                         r"fit the model: .*would take 7664 bytes together"):
        tight.allocate_tensors()


# -- what is left for shapes known only at invoke ---------------------------------------------
def test_data_dependent_shapes_leave_room_for_the_largest_temporary():
    """WHERE beside a 5x5 conv: the conv runs after it, so WHERE's output must leave room for
    the conv's 27364 bytes of temporaries besides the prepared tensors (4712 bytes): 692 bytes
    of 16 x 2048, which 80 indices (640 bytes) fit and 100 (800) do not."""
    b = ModelBuilder()
    g = b.subgraph()
    v = g.input("v", (512,))
    positive = g.tensor("positive", (512,), np.bool_)
    g.op("GREATER", [v, g.const("zero", np.float32(0))], [positive])
    where = g.tensor("where", (1, 1), np.int64)
    g.op("WHERE", [positive], [where])
    x = g.input("x", (1, SIDE, SIDE, 1))
    g.output(where, _conv(g, x, 5, "y"))
    it = Interpreter(model_content=b.finish(), backend="reference", max_tensor_bytes=2048)
    it.allocate_tensors()
    assert it._runtime.budget.held() == (4712, 27364)
    it.set_tensor(it.get_input_details()[1]["index"], np.ones((1, SIDE, SIDE, 1), np.float32))
    v = np.full(512, -1.0, np.float32)
    v[:80] = 1.0
    it.set_tensor(0, v)
    it.invoke()
    assert it.get_tensor(it.get_output_details()[0]["index"]).shape == (80, 1)
    v[:100] = 1.0
    it.set_tensor(0, v)
    with pytest.raises(TensorTooLargeError, match=r"^op #1 \(WHERE\): its outputs of shapes "
                                                  r"\[\[100, 1\]\] would take 800 bytes, above "
                                                  r"the 692 bytes the model's other tensors leave"):
        it.invoke()
