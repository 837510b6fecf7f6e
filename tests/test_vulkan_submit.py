"""Vulkan through command buffers of ours (runtime/vulkan_submit.py): the module reader against
real modules and doctored ones, and every output of real models, over invokes that carry state,
equal bit for bit to Taichi's own submissions on the same device (the same SPIR-V, dispatches and
barriers), and to the reference within the float tolerance. What a recording holds, on any
device: a barrier after every dispatch and copy; and no recording outlives a buffer it uses."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from tflite_taichi.runtime import vulkan_submit

pytestmark = pytest.mark.skipif(
    "vulkan" not in os.environ.get("TFLITE_TAICHI_TEST_BACKENDS", "cpu,vulkan,opengl"),
    reason="vulkan is not among TFLITE_TAICHI_TEST_BACKENDS")

# Runs MODELS for STEPS invokes each on vulkan (the submission path from the environment) and
# the reference, with seeded inputs that change every invoke, and saves every tensor the
# delegate exposes (experimental_preserve_all_tensors) at every step; reports the submitter's
# counts. argv: out.npz, steps, model paths...
RUN = r'''
import json, sys, warnings
import numpy as np
from tflite_taichi import Interpreter
from tflite_taichi.runtime import device
warnings.simplefilter("ignore")
out, steps, paths = sys.argv[1], int(sys.argv[2]), sys.argv[3:]
saved, report = {}, {}
for m, path in enumerate(paths):
    it = Interpreter(model_path=path, backend="vulkan", experimental_preserve_all_tensors=True)
    ref = Interpreter(model_path=path, backend="reference")
    it.allocate_tensors(); ref.allocate_tensors()
    rng = np.random.default_rng(m)
    for step in range(steps):
        for d in it.get_input_details():
            if d["dtype"] == np.float32:
                x = rng.uniform(-1, 1, d["shape"]).astype(np.float32)
            else:
                x = rng.integers(-128, 128, d["shape"]).astype(d["dtype"])
            it.set_tensor(d["index"], x); ref.set_tensor(d["index"], x)
        it.invoke(); ref.invoke()
        for t in it.get_tensor_details():
            try:
                saved[f"{m}/{step}/{t['index']}"] = it.get_tensor(t["index"])
            except ValueError:          # a tensor the delegate did not keep
                pass
        for d in it.get_output_details():
            saved[f"ref/{m}/{step}/{d['index']}"] = ref.get_tensor(d["index"])
            saved[f"out/{m}/{step}/{d['index']}"] = it.get_tensor(d["index"])
    report[path] = it.summary()["runtime"]["submit"]
sub = device.current("vulkan")._submitter
report["counts"] = None if sub is None else {"recordings": sub.recordings, "submissions": sub.submissions,
                                            "kept": len(sub._recorded)}
np.savez(out, **saved)
print("RESULT " + json.dumps(report), flush=True)
'''

# the same, with every module refused by our reader: Taichi launches them, our copies and its
# launches keep their order in one invoke (device.OrderedCapiLaunch)
REFUSE_ALL = r'''
from tflite_taichi.runtime import vulkan_submit
def refuse(data):
    raise vulkan_submit.NotReplayable("refused by the test")
vulkan_submit.ModulePlan = refuse
'''


def _run(tmp_path, name, submit, models, steps, prelude=""):
    env = dict(os.environ, TFLITE_TAICHI_VULKAN_SUBMIT=submit,
               TFLITE_TAICHI_CACHE_DIR=str(tmp_path / f"cache_{name}"))
    out = tmp_path / f"{name}.npz"
    done = subprocess.run([sys.executable, "-c", prelude + RUN, str(out), str(steps), *models],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    lines = [l for l in done.stdout.splitlines() if l.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(lines[-1][7:]), dict(np.load(out))


@pytest.fixture
def models(shared_models):
    # a float detector (one partition), and okay_nabu: int8, six variables carried from invoke
    # to invoke, partitions with host steps between them (several waits per invoke)
    return [os.path.join(shared_models, m) for m in ("face_detection_short_range.tflite",
                                                     "okay_nabu.tflite")]


def test_our_submissions_equal_taichis_bit_for_bit(tmp_path, models):
    from tflite_taichi.testing import assert_float_close
    steps = 6
    ours_report, ours = _run(tmp_path, "ours", "ours", models, steps)
    taichi_report, taichi = _run(tmp_path, "taichi", "taichi", models, steps)
    assert all(ours_report[m] == "ours" for m in models), ours_report
    assert all(taichi_report[m].startswith("Taichi's") for m in models), taichi_report
    assert set(ours) == set(taichi) and len(ours) > 100
    for key, value in taichi.items():
        assert np.array_equal(ours[key], value, equal_nan=True), key
    for key, value in ours.items():
        if key.startswith("out/"):
            expected = ours["ref/" + key[4:]]
            if value.dtype == np.float32:
                assert_float_close(value, expected, what=key)
            else:       # int8: the simulated quantization may round one code apart
                assert np.abs(value.astype(int) - expected.astype(int)).max() <= 1, key
    counts = ours_report["counts"]
    # each segment (copies in, launches, copies out between two waits) is recorded once and
    # submitted again: recordings stay a handful while submissions grow with the invokes
    assert counts["submissions"] >= 2 * steps, counts
    assert counts["recordings"] <= counts["submissions"] // 2, counts
    assert counts["kept"] <= vulkan_submit.KEPT_SEGMENTS
    assert taichi_report["counts"] is None


# ...or read by us, but every pipeline of ours refused by the driver: Taichi loads the module
PIPELINES_REFUSED = r'''
from tflite_taichi.runtime import capi, vulkan_submit
def refuse(self, vk, task):
    raise capi.CapiError("pipeline refused by the test")
vulkan_submit.Pipeline.__init__ = refuse
'''


@pytest.mark.parametrize("prelude,why", [(REFUSE_ALL, "refused by the test"),
                                         (PIPELINES_REFUSED, "pipeline refused by the test")])
def test_modules_taichi_runs_keep_their_order_among_our_commands(tmp_path, models, prelude, why):
    steps = 4
    report, mixed = _run(tmp_path, "mixed", "ours", models, steps, prelude=prelude)
    _, taichi = _run(tmp_path, "taichi", "taichi", models, steps)
    assert all(report[m].startswith(f"Taichi's for a module ({why})") for m in models), report
    for key, value in taichi.items():
        assert np.array_equal(mixed[key], value, equal_nan=True), key


def _module_bytes(tmp_path, shared_models) -> bytes:
    _run(tmp_path, "module", "ours", [os.path.join(shared_models, "face_detection_short_range.tflite")], 1)
    found = [os.path.join(root, f) for root, _, files in os.walk(tmp_path / "cache_module")
             for f in files if f == "module.tcm"]
    assert found
    with open(found[0], "rb") as f:
        return f.read()


def test_the_module_reader_takes_what_taichi_writes_and_refuses_the_rest(tmp_path, shared_models):
    import io
    import zipfile
    data = _module_bytes(tmp_path, shared_models)
    plan = vulkan_submit.ModulePlan(data)
    assert plan.kernels and not plan.physical_pointers     # lavapipe: ndarrays as descriptors
    for kernel in plan.kernels.values():
        assert kernel.tasks and kernel.args_bytes >= 32 * len(kernel.arg_fields)
        for task in kernel.tasks:
            assert task.entry and task.groups >= 1
            assert any(arg is None for _, arg in task.binds)        # the arguments' uniform

    def doctored(edit=None, spirv=None) -> bytes:
        meta, codes = vulkan_submit.read_module(data)
        if edit:
            edit(meta)
        raw = io.BytesIO()
        with zipfile.ZipFile(raw, "w") as z:
            z.writestr("metadata.json", json.dumps(meta))
            for name, code in codes.items():
                z.writestr(name + ".spv", spirv if spirv is not None else code)
        return raw.getvalue()

    def first_task(meta):
        return meta["kernels"][0]["tasks_attribs"][0]

    def global_tmps(meta):
        first_task(meta)["buffer_binds"].append({"binding": 9, "buffer": {"root_id": [-1], "type": 1}})

    def textures(meta):
        first_task(meta)["texture_binds"] = [{"arg_id": 0, "binding": 8, "is_storage": True}]

    def returns(meta):
        meta["kernels"][0]["ctx_attribs"]["rets_bytes_"] = 4

    def fields(meta):
        meta["root_buffer_size"] = 64

    for edit, why in ((global_tmps, "kind 1"), (textures, "textures"), (returns, "returns"),
                      (fields, "fields")):
        with pytest.raises(vulkan_submit.NotReplayable, match=why):
            vulkan_submit.ModulePlan(doctored(edit))
    with pytest.raises(vulkan_submit.NotReplayable, match="magic"):
        vulkan_submit.ModulePlan(doctored(spirv=b"\0" * 64))
    with pytest.raises(vulkan_submit.NotReplayable, match="gfx AOT archive"):
        vulkan_submit.ModulePlan(data[:100])


# A program that garbage collection releases while this thread is inside a device call (here:
# forced in the middle of every submission of ours) must not wait on the fence or free the
# command buffers that call is using: its release waits for the next invoke.
COLLECTED_INSIDE = r'''
import gc, json, sys, warnings
import numpy as np
from tflite_taichi import Interpreter
from tflite_taichi.runtime import vulkan_submit
warnings.simplefilter("ignore")
path = sys.argv[1]
depth, deepest = [0], [0]
real_wait, real_submit = vulkan_submit.Submitter.wait, vulkan_submit.Submitter.submit
def wait(self):
    depth[0] += 1; deepest[0] = max(deepest[0], depth[0])
    try:
        real_wait(self)
    finally:
        depth[0] -= 1
def submit(self, fence=0):
    gc.collect()            # what an allocation may trigger at any point of a submission
    real_submit(self, fence)
vulkan_submit.Submitter.wait, vulkan_submit.Submitter.submit = wait, submit
ref = Interpreter(model_path=path, backend="reference"); ref.allocate_tensors()
rng = np.random.default_rng(0)
released, mismatches = [], 0
for round in range(4):
    it = Interpreter(model_path=path, backend="vulkan"); it.allocate_tensors()
    it.cycle = it                   # only a collection frees it once it is dropped
    program = it._main.program
    for _ in range(3):
        d = it.get_input_details()[0]
        x = rng.uniform(-1, 1, d["shape"]).astype(np.float32)
        for i in (it, ref):
            i.set_tensor(d["index"], x); i.invoke()
        for o in it.get_output_details():
            mismatches += not np.allclose(it.get_tensor(o["index"]), ref.get_tensor(o["index"]),
                                          rtol=1e-4, atol=1e-4 * np.abs(ref.get_tensor(o["index"])).max())
    released.append(program._buffers)
    del it, program
print("RESULT " + json.dumps({"deepest": deepest[0], "mismatches": int(mismatches),
      "freed": [len(b) == 0 for b in released]}), flush=True)
'''


def test_a_release_by_garbage_collection_waits_out_a_device_call(tmp_path, shared_models):
    env = dict(os.environ, TFLITE_TAICHI_CACHE_DIR=str(tmp_path / "cache"))
    path = os.path.join(shared_models, "face_detection_short_range.tflite")
    done = subprocess.run([sys.executable, "-c", COLLECTED_INSIDE, path], capture_output=True,
                          text=True, timeout=600, cwd=tmp_path, env=env)
    lines = [l for l in done.stdout.splitlines() if l.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-2000:] + done.stderr[-3000:]
    result = json.loads(lines[-1][7:])
    assert result["deepest"] == 1, result          # no wait inside a wait
    assert result["mismatches"] == 0, result
    # every dropped program was freed, at the next program's invoke at the latest (the last
    # one is still garbage when the script ends)
    assert all(result["freed"][:-1]), result


# What our command buffers hold, on a real model: every vkCmd* call of ours is logged per
# command buffer (with a barrier's stage and access masks), each recording tagged when it is
# made, each submission by the recording it submits. Invokes a program, closes it (its buffers
# are freed; Taichi hands their handles out again), invokes a new one, and reports.
# argv: model path, invokes per program.
RECORDER = r'''
import ctypes as C, json, sys, warnings
import numpy as np
from tflite_taichi import Interpreter
from tflite_taichi.runtime import device, vulkan_submit
warnings.simplefilter("ignore")
path, steps = sys.argv[1], int(sys.argv[2])
commands, recorded, submitted, freed = {}, [], [], set()
by_submit_info = {}

def logged(name, real):
    def call(cb, *args):
        entry = [name]
        if name == "vkCmdPipelineBarrier":
            barrier = args[4]._obj
            entry += [args[0], args[1], barrier.srcAccessMask, barrier.dstAccessMask]
        commands.setdefault(cb, []).append(entry)
        return real(cb, *args)
    return call

def submit_logged(real):
    def call(queue, count, infos, fence):
        if count:
            submitted.append(by_submit_info[id(infos._obj)])
        return real(queue, count, infos, fence)
    return call

real_init, real_record, real_free = (vulkan_submit.Vulkan.__init__,
                                     vulkan_submit.Submitter._record, vulkan_submit.Submitter._free)
def init(self, *args):
    real_init(self, *args)
    for name in self.fn:
        if name.startswith("vkCmd"):
            self.fn[name] = logged(name, self.fn[name])
    self.fn["vkQueueSubmit"] = submit_logged(self.fn["vkQueueSubmit"])
def record(self, segment):
    commands.pop(None, None)
    rec = real_record(self, segment)
    by_submit_info[id(rec.submit_info)] = len(recorded)
    recorded.append({"cb": rec.cb, "handles": sorted(rec.handles), "commands": commands.pop(rec.cb, []),
                     "at": phase[0]})
    return rec
def free(self, cb):
    freed.add(cb)
    real_free(self, cb)
vulkan_submit.Vulkan.__init__, vulkan_submit.Submitter._record = init, record
vulkan_submit.Submitter._free = free

phase, result = ["first"], {}
ref = Interpreter(model_path=path, backend="reference"); ref.allocate_tensors()
rng = np.random.default_rng(0)
def run(it):
    for _ in range(steps):
        for d in it.get_input_details():
            x = rng.uniform(-1, 1, d["shape"]).astype(np.float32)
            it.set_tensor(d["index"], x); ref.set_tensor(d["index"], x)
        it.invoke(); ref.invoke()
        for o in it.get_output_details():
            a, b = it.get_tensor(o["index"]), ref.get_tensor(o["index"])
            assert np.allclose(a, b, rtol=1e-4, atol=1e-4 * max(np.abs(b).max(), 1)), o["name"]

first = Interpreter(model_path=path, backend="vulkan"); first.allocate_tensors()
sub = device.current("vulkan")._submitter
run(first)
first_buffers = sorted(b.handle for b in first._main.program._buffers)
first.close()
sub = device.current("vulkan")._submitter
result["after_close"] = {
    "kept": [sorted(r.handles) for r in sub._recorded.values()],
    "launches": [sorted(l.handles) for l in sub.launches],
    "freed_recordings": [i for i, r in enumerate(recorded) if r["cb"] in freed],
}
phase[0] = "second"
second = Interpreter(model_path=path, backend="vulkan"); second.allocate_tensors()
run(second)
result.update(first_buffers=first_buffers, recorded=recorded, submitted=submitted,
              second_buffers=sorted(b.handle for b in second._main.program._buffers))
print("RESULT " + json.dumps(result), flush=True)
'''


@pytest.fixture(scope="module")
def recorder_run(tmp_path_factory, shared_models):
    """RECORDER on the float detector: per invoke, a segment that copies the input in and
    launches the partition's kernel (many tasks), and one that copies the output out."""
    tmp_path = tmp_path_factory.mktemp("recorder")
    env = dict(os.environ, TFLITE_TAICHI_VULKAN_SUBMIT="ours",
               TFLITE_TAICHI_CACHE_DIR=str(tmp_path / "cache"))
    done = subprocess.run([sys.executable, "-c", RECORDER,
                           os.path.join(shared_models, "face_detection_short_range.tflite"), "3"],
                          capture_output=True, text=True, timeout=600, cwd=tmp_path, env=env)
    lines = [l for l in done.stdout.splitlines() if l.startswith("RESULT ")]
    assert done.returncode == 0 and lines, done.stdout[-2000:] + done.stderr[-3000:]
    return json.loads(lines[-1][7:])


def _orders_compute_and_transfer(barrier) -> bool:
    """Whether a logged barrier (name, source stages, destination stages, source access,
    destination access) makes a dispatch's or copy's writes visible to the next dispatch or copy."""
    def stages(mask):
        wanted = vulkan_submit.PIPE_COMPUTE | vulkan_submit.PIPE_TRANSFER
        return bool(mask & vulkan_submit.PIPE_ALL_COMMANDS) or mask & wanted == wanted

    def access(mask):
        wanted = vulkan_submit.ACCESS_SHADER_RW | vulkan_submit.ACCESS_TRANSFER_RW
        return mask & vulkan_submit.ACCESS_MEMORY_RW == vulkan_submit.ACCESS_MEMORY_RW \
            or mask & wanted == wanted
    return (barrier[0] == "vkCmdPipelineBarrier" and stages(barrier[1]) and stages(barrier[2])
            and access(barrier[3]) and access(barrier[4]))


def test_a_barrier_follows_every_dispatch_and_every_copy(recorder_run):
    """Taichi puts a barrier after every dispatch and copy (VulkanCommandList::memory_barrier);
    ours must too, or a dispatch may read what the one before is still writing."""
    recorded = recorder_run["recorded"]
    assert recorded
    seen = {"vkCmdDispatch": 0, "vkCmdCopyBuffer": 0}
    for number, recording in enumerate(recorded):
        commands = recording["commands"]
        names = [c[0] for c in commands]
        # the command buffer's edges: all earlier work (and the host's writes) before it,
        # all of it visible to the host after
        assert names[0] == names[-1] == "vkCmdPipelineBarrier", (number, names)
        for edge in (commands[0], commands[-1]):
            assert edge[1] & vulkan_submit.PIPE_ALL_COMMANDS and edge[2] & vulkan_submit.PIPE_HOST
        for at, name in enumerate(names):
            if name in seen:
                seen[name] += 1
                assert _orders_compute_and_transfer(commands[at + 1]), \
                    (f"recording {number}: {name} at {at} is followed by {commands[at + 1]}", names)
    assert seen["vkCmdDispatch"] > 0 and seen["vkCmdCopyBuffer"] > 0, seen


def test_a_recording_is_dropped_when_a_buffer_it_uses_is_freed(recorder_run):
    """Taichi hands a freed allocation's handle out again: a command buffer kept past the free
    would run on memory that is gone (a use-after-free on the GPU), or on another program's."""
    run = recorder_run
    freed_handles = set(run["first_buffers"])
    first = [i for i, r in enumerate(run["recorded"]) if r["at"] == "first"]
    assert first and freed_handles
    using = [i for i in first if freed_handles & set(run["recorded"][i]["handles"])]
    assert using, "no recording used the program's buffers"
    after = run["after_close"]
    # nothing kept uses a freed buffer: no recording, no launch (its descriptor sets)
    assert not any(freed_handles & set(handles) for handles in after["kept"]), after
    assert not any(freed_handles & set(handles) for handles in after["launches"]), after
    # each such recording's command buffer was freed with it
    assert set(using) <= set(after["freed_recordings"]), (using, after["freed_recordings"])
    # the next program is recorded anew, never served a recording made for the closed one
    second = [i for i, r in enumerate(run["recorded"]) if r["at"] == "second"]
    assert second
    submitted_after = run["submitted"][run["submitted"].index(second[0]):]
    assert not set(submitted_after) & set(using), submitted_after
