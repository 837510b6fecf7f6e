"""One memory budget for the whole model (issue 26, item 4): the tensors of every subgraph
prepared (nested IF branches included) and the temporary arrays an op's numpy reference makes
(CONV_2D's patches) count against one limit, 16 x max_tensor_bytes, checked at
allocate_tensors before anything is allocated. Before, each subgraph had a fresh 16x budget, so
every level of nested IFs added gigabytes, and CONV_2D's im2col was not counted at all.

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


def test_a_resize_back_within_the_budget_works_again():
    """A refused resize keeps the previous shapes and charges; a smaller one then fits."""
    it = Interpreter(model_content=nested_ifs(levels=3, n=2, adds=12), backend="reference",
                     max_tensor_bytes=1000)
    it.allocate_tensors()
    it.resize_tensor_input(1, [100])
    with pytest.raises(InputError, match=r"resizing input 'x' to \[100\] does not fit") as info:
        it.allocate_tensors()
    assert isinstance(info.value.__cause__, TensorTooLargeError)
    for _ in range(3):              # charges replace the state's last ones: they never pile up
        it.resize_tensor_input(1, [50])
        it.allocate_tensors()
        it.resize_tensor_input(1, [60])
        it.allocate_tensors()
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
