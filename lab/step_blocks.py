"""One model, one backend, one process: the step's medians in blocks after `auto` has chosen,
which threads burnt CPU meanwhile, and the step split into set / invoke / get.

    python lab/step_blocks.py MODEL.tflite BACKEND      # BACKEND: litert (LiteRT's own), auto, cuda, ...

Asked once (bench/results/auto_side_by_side_h100.md): was `auto`'s step on the GPU slower than
the backend alone (a thread of ours busy beside it), or was one side-by-side process unlucky?"""
import os, sys, time, threading
import numpy as np
path, backend = sys.argv[1], sys.argv[2]
t0 = time.perf_counter()
if backend == "litert":
    from ai_edge_litert.interpreter import Interpreter as L
    it = L(model_path=path, num_threads=16)
else:
    from tflite_taichi import Interpreter
    it = Interpreter(model_path=path, backend=backend, num_threads=16)
it.allocate_tensors()
if hasattr(it, "wait_for_kernels"):
    it.wait_for_kernels()
rng = np.random.default_rng(0)
ins = []
for d in it.get_input_details():
    dt = np.dtype(d["dtype"])
    x = rng.integers(-100, 100, d["shape"]).astype(dt) if dt.kind in "iu" else rng.random(d["shape"]).astype(dt)
    ins.append((d["index"], x))
outs = [d["index"] for d in it.get_output_details()]
def step():
    for i, x in ins: it.set_tensor(i, x)
    it.invoke()
    return [it.get_tensor(o) for o in outs]
end = time.perf_counter() + 0.5
while time.perf_counter() < end: step()
if backend == "auto":
    deadline = time.perf_counter() + 60
    while it.backend not in ("litert", "reference", "cpu") and (it.summary().get("auto_choice") is None) and time.perf_counter() < deadline:
        for _ in range(50): step()
    print("auto ->", it.backend, (it.summary().get("auto_choice") or {}).get("text"))
def task_cpu():
    r = {}
    for t in os.listdir("/proc/self/task"):
        try:
            s = open(f"/proc/self/task/{t}/stat").read()
            comm = s[s.index("(") + 1:s.rindex(")")]
            f = s[s.rindex(")") + 2:].split()
            r[t] = (comm, (int(f[11]) + int(f[12])) / os.sysconf("SC_CLK_TCK"))
        except OSError:
            pass
    return r
for block in range(3):
    a = task_cpu(); w0 = time.perf_counter()
    ts = []
    for _ in range(400):
        s = time.perf_counter(); step(); ts.append(time.perf_counter() - s)
    wall = time.perf_counter() - w0; b = task_cpu()
    busy = sorted(((b[t][1] - a.get(t, (0, 0))[1], b[t][0], t) for t in b), reverse=True)[:4]
    print(f"block {block}: median {np.median(ts)*1e3:.4f} ms p10 {np.percentile(ts,10)*1e3:.4f} p90 {np.percentile(ts,90)*1e3:.4f}; "
          f"cpu/wall {sum(x[0] for x in busy)/wall:.2f}; busiest threads " + ", ".join(f"{c}:{s:.2f}s" for s, c, t in busy))
print("threads:", len(os.listdir("/proc/self/task")), "python threads:", [t.name for t in threading.enumerate()])
# phases, split
n = 400; ph = np.zeros(3)
for _ in range(n):
    s = time.perf_counter()
    for i, x in ins: it.set_tensor(i, x)
    s1 = time.perf_counter(); it.invoke(); s2 = time.perf_counter()
    [it.get_tensor(o) for o in outs]; s3 = time.perf_counter()
    ph += (s1 - s, s2 - s1, s3 - s2)
print("phases ms (set, invoke, get):", np.round(ph / n * 1e3, 4))
