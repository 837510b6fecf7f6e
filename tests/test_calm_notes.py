"""What the delegate says about where ops run, Python's way: an op the delegate cannot take is
a DelegateWarning (the user may act on it); what it keeps on the CPU by its own choice (auto's
numpy policy, the cost estimate, the partition limit, a partition of variable reads and writes
alone) and the closing summary are logged at INFO on "tflite_taichi.delegate", which prints
nothing unless the application asks (logging.basicConfig(level=logging.INFO))."""
import logging
import os
import subprocess
import sys
import warnings

import numpy as np

from cases.conv import big_conv
from cases.state import accumulator_model
from tflite_taichi import graph as graph_mod
from tflite_taichi.builder import ModelBuilder
from tflite_taichi.cli import _plain_warnings
from tflite_taichi.model import read_model
from tflite_taichi.partition import DelegateWarning, build_schedule
from tflite_taichi.tools.demo import build_tiny_mlp

LOGGER = "tflite_taichi.delegate"
CANNOT = "cannot be handled by this delegate"
LIMIT = "max_delegated_partitions=1, the default"


def split_by_a_float64_constant() -> bytes:
    """x -> ADD -> RELU -> ADD(float64 constant: the delegate cannot take it) -> MUL -> RELU6:
    two groups of two the delegate can take; it keeps the first (the partition limit, 1) and
    leaves the second on the CPU by that choice."""
    b = ModelBuilder()
    g = b.subgraph()
    x = g.input("x", (1, 8))
    t = [g.tensor(f"t{i}", (1, 8)) for i in range(5)]
    g.op("ADD", [x, g.const("a", np.ones((1, 8), np.float32))], [t[0]])
    g.op("RELU", [t[0]], [t[1]])
    g.op("ADD", [t[1], g.const("wide", np.ones((1, 8)))], [t[2]])
    g.op("MUL", [t[2], g.const("m", np.full((1, 8), 2, np.float32))], [t[3]])
    g.op("RELU6", [t[3]], [t[4]])
    g.output(t[4])
    return b.finish()


def _prepared(model: bytes, subgraph: int = 0):
    m = read_model(model)
    sg = m.subgraphs[subgraph]
    return graph_mod.prepare(sg, graph_mod.resolve_ops(m),
                             {t: tuple(sg.tensors[t].shape) for t in sg.inputs})


def _schedule_notes(caplog, model: bytes, subgraph: int = 0, **options):
    """build_schedule's warnings and INFO records for `model`: (warning texts, logged texts)."""
    prepared = _prepared(model, subgraph)
    caplog.clear()
    with caplog.at_level(logging.INFO, logger=LOGGER), \
            warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        schedule = build_schedule(prepared, backend="cpu", **options)
    warned = [str(w.message) for w in caught if issubclass(w.category, DelegateWarning)]
    logged = [r.getMessage() for r in caplog.records if r.name == LOGGER]
    assert all(r.levelno == logging.INFO for r in caplog.records if r.name == LOGGER)
    return schedule, warned, logged


def _says_nothing_else(logged: list, choices: int):
    """`choices` logged lines about ops kept on the CPU, and the summary line last."""
    assert len(logged) == choices + 1 and " ops run on " in logged[-1], logged
    assert all(CANNOT in line and not line.startswith(("INFO", "WARNING")) for line in logged[:-1])


# -- in the process: each kind of reason lands where it belongs ---------------------------------
def test_what_the_delegate_cannot_take_warns_and_the_partition_limit_is_logged(caplog):
    schedule, warned, logged = _schedule_notes(caplog, split_by_a_float64_constant())
    assert warned == [f"WARNING: op code #2 (ADD) {CANNOT}: constant 'wide' is float64; the "
                      "delegate's weights are float32 (or float16)"], warned
    _says_nothing_else(logged, choices=2)              # MUL and RELU6: one line per op kind
    assert all(LIMIT in line for line in logged[:-1]), logged
    assert logged[-1].startswith("2 of 5 ops run on the delegate's cpu backend"), logged
    assert schedule.chosen == {3, 4} and set(schedule.refused) == {2, 3, 4}


def test_autos_numpy_policy_is_a_choice(caplog):
    schedule, warned, logged = _schedule_notes(caplog, big_conv(),
                                               reference_ops=frozenset({"CONV_2D"}))
    assert not warned, warned
    _says_nothing_else(logged, choices=1)
    assert "backend='auto' without a GPU runs it on numpy" in logged[0], logged
    assert schedule.chosen == {0}


def test_autos_cost_estimate_is_a_choice(caplog):
    schedule, warned, logged = _schedule_notes(caplog, build_tiny_mlp(), cost_backend="vulkan")
    assert not warned, warned
    assert not schedule.partitions and schedule.chosen == set(schedule.refused), schedule.refused
    assert any("numpy runs its partition of 3 op(s) faster than vulkan" in line for line in logged)


def test_a_partition_of_variable_reads_and_writes_alone_is_a_choice(caplog):
    """The init subgraph: VAR_HANDLE <- ASSIGN_VARIABLE(constant) computes nothing on a device."""
    schedule, warned, logged = _schedule_notes(caplog, accumulator_model((2,), np.zeros(2, np.float32)),
                                               subgraph=1)
    assert not warned, warned
    assert schedule.refused and schedule.chosen == set(schedule.refused), schedule.refused
    assert any("variable reads and writes alone computes nothing" in line for line in logged)


def test_the_command_lines_block_keeps_the_notes_off_every_handler(caplog):
    """run -v prints the notes it collects; none reach a handler the application has (stderr)."""
    prepared = _prepared(split_by_a_float64_constant())
    with caplog.at_level(logging.INFO):                # a handler on the root logger
        with _plain_warnings() as notes:
            build_schedule(prepared, backend="cpu")
    assert not [r for r in caplog.records if r.name == LOGGER], caplog.records
    assert notes[0].startswith(f"WARNING: op code #2 (ADD) {CANNOT}"), notes
    assert [n for n in notes[1:] if LIMIT in n and n.startswith("INFO: op code #")] == notes[1:3], notes
    assert notes[-1].startswith("INFO: 2 of 5 ops run on "), notes
    assert len(notes) == 4, notes


# -- a user's tf.lite-style code and the command line, in their own processes -------------------
USER_CODE = r"""
import logging, sys
import numpy as np
from tflite_taichi import Interpreter
if sys.argv[2:] == ["info"]:
    logging.basicConfig(level=logging.INFO)
it = Interpreter(model_path=sys.argv[1], backend="cpu")
it.allocate_tensors()
it.set_tensor(it.get_input_details()[0]["index"], np.ones((1, 8), np.float32))
it.invoke()
print("RESULT", it.get_tensor(it.get_output_details()[0]["index"]).tolist())
"""


def _delegate_lines(text: str) -> list:
    return [line for line in text.splitlines() if CANNOT in line or " ops run on " in line]


def _run(args: list, cwd) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "ENABLE_TAICHI_HEADER_PRINT"}
    done = subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=600,
                          cwd=cwd, env=env)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-3000:]
    return done


def test_users_code_sees_a_warning_only_for_what_the_delegate_cannot_take(tmp_path):
    model = tmp_path / "split.tflite"
    model.write_bytes(split_by_a_float64_constant())
    (tmp_path / "user_code.py").write_text(USER_CODE)
    done = _run(["user_code.py", str(model)], tmp_path)
    assert "RESULT [[6.0, 6.0, 6.0, 6.0, 6.0, 6.0, 6.0, 6.0]]" in done.stdout, done.stdout
    lines = _delegate_lines(done.stderr)
    assert len(lines) == 1 and lines[0].endswith(f"DelegateWarning: WARNING: op code #2 (ADD) "
                                                  f"{CANNOT}: constant 'wide' is float64; the "
                                                  "delegate's weights are float32 (or float16)"), done.stderr
    assert "INFO" not in done.stderr, done.stderr

    done = _run(["user_code.py", str(model), "info"], tmp_path)    # logging asked for
    lines = _delegate_lines(done.stderr)
    assert len(lines) == 4, done.stderr
    assert "DelegateWarning: WARNING: op code #2 (ADD)" in lines[0], lines
    assert lines[1].startswith(f"INFO:{LOGGER}:op code #3 (MUL) {CANNOT}") and LIMIT in lines[1], lines
    assert lines[2].startswith(f"INFO:{LOGGER}:op code #4 (RELU6) {CANNOT}") and LIMIT in lines[2], lines
    assert lines[3].startswith(f"INFO:{LOGGER}:2 of 5 ops run on the delegate's cpu backend"), lines


def test_run_v_prints_the_warning_and_the_choices_and_stderr_neither(tmp_path):
    model = tmp_path / "split.tflite"
    model.write_bytes(split_by_a_float64_constant())
    done = _run(["-m", "tflite_taichi", "run", str(model), "--backend", "cpu", "-v"], tmp_path)
    notes = [line.strip() for line in done.stdout.splitlines() if line.startswith("  delegate: ")]
    assert len(notes) == 4, done.stdout
    assert notes[0].startswith(f"delegate: WARNING: op code #2 (ADD) {CANNOT}"), notes
    assert all(n.startswith("delegate: INFO: op code #") and LIMIT in n for n in notes[1:3]), notes
    assert notes[3].startswith("delegate: INFO: 2 of 5 ops run on "), notes
    assert not _delegate_lines(done.stderr), done.stderr


def test_the_library_configures_no_handlers_of_its_own():
    """The application decides where log records go: the package adds only a NullHandler."""
    package = logging.getLogger("tflite_taichi")
    assert package.handlers and all(type(h) is logging.NullHandler for h in package.handlers)
    delegate = logging.getLogger(LOGGER)
    assert not delegate.handlers and delegate.propagate and delegate.level == logging.NOTSET


# -- LiteRT's own INFO line ------------------------------------------------------------------------
def test_litert_s_xnnpack_note_goes_to_the_log_and_other_stderr_stays(capfd, caplog, monkeypatch):
    """LiteRT's C++ prints 'INFO: Created TensorFlow Lite XNNPACK delegate for CPU.' at the first
    allocation of a process, with no switch to turn it off: it goes to our log at INFO; anything
    else written to stderr meanwhile comes out as it was."""
    from tflite_taichi import litert_cpu
    monkeypatch.setitem(litert_cpu._note, "seen", False)
    caplog.set_level(logging.INFO, logger="tflite_taichi.litert")
    with litert_cpu.xnnpack_note_to_the_log():
        os.write(2, b"before\n" + litert_cpu.XNNPACK_NOTE + b"after\n")
    assert capfd.readouterr().err == "before\nafter\n"
    assert [r.getMessage() for r in caplog.records] == [
        "Created TensorFlow Lite XNNPACK delegate for CPU."]
    with litert_cpu.xnnpack_note_to_the_log():     # seen: stderr is left alone from then on
        os.write(2, litert_cpu.XNNPACK_NOTE)
    assert capfd.readouterr().err == litert_cpu.XNNPACK_NOTE.decode()


def test_the_default_backend_without_a_gpu_prints_nothing_on_stderr(tmp_path):
    """tf.lite code on the default backend (`auto` -> litert here): not a line on stderr."""
    from tflite_taichi.tools.demo import build_demo_model
    path = tmp_path / "demo.tflite"
    path.write_bytes(build_demo_model())
    script = (
        "import sys, numpy as np\n"
        "from tflite_taichi import Interpreter\n"
        "it = Interpreter(model_path=sys.argv[1])\n"
        "it.allocate_tensors()\n"
        "d = it.get_input_details()[0]\n"
        "it.set_tensor(d['index'], np.zeros(d['shape'], d['dtype']))\n"
        "it.invoke()\n"
        "print(it.backend)\n")
    done = subprocess.run([sys.executable, "-c", script, str(path)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip() == "litert", done.stdout + done.stderr
    assert done.stderr == "", done.stderr
