"""Moving a model's inputs and outputs through Taichi's C API: the candidates, measured side by
side on one device (issue #12, item 4: what CUDA's IO path, and the others', should be).

    python lab/capi_io.py --backend cuda [--kb 600] [--runs 200]

For an input of `--kb` KB (default 600: a 224x224x3 float32 image) and the same amount back:
- `map`: a host-visible C API buffer, `ti_map_memory` + memcpy + unmap, each way (on CUDA the
  C API's host-visible memory is CUDA managed memory);
- `staging+copy` (gfx archs): map a host-visible staging buffer, memcpy, then an enqueued
  `ti_copy_memory_device_to_device` into device-local memory, and back, with the wait;
- `cuMemcpy pageable` / `cuMemcpy pinned` (cuda): the CUDA driver's copies between numpy memory
  (pageable, or pinned with cuMemAllocHost) and the exported device pointer of a device-local
  C API buffer;
- `host memory` (x64): a numpy array imported with `ti_import_cpu_memory`, read and written in
  place.
Each row: median, p10, p90 in microseconds over --runs after 10 warm-up, and a check that the
bytes arrived. The delegate uses, per arch, the row device.py names (its docstring says why).
"""
import argparse
import ctypes as C
import json
import sys
import time

import numpy as np


def stats(fn, runs):
    for _ in range(10):
        fn()
    ts = []
    for _ in range(runs):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    ts = np.array(ts) * 1e6
    return {"median_us": round(float(np.median(ts)), 1), "p10": round(float(np.percentile(ts, 10)), 1),
            "p90": round(float(np.percentile(ts, 90)), 1)}


def _tiny_model(backend: str, runs: int) -> dict:
    """The host's part of an invoke: a one-op model (RELU of 8 floats) whose kernel does next to
    nothing, so invoke() is the runtime's own cost: the input copy, the launch, the output copy
    and the wait."""
    import warnings
    from tflite_taichi import Interpreter
    from tflite_taichi.testing import Input, Output, one_op_model
    model = one_op_model("RELU", [Input((1, 8))], [Output((1, 8))])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        it = Interpreter(model_content=model, backend=backend)
        it.allocate_tensors()
    x = np.linspace(-1, 1, 8, dtype=np.float32).reshape(1, 8)
    it.set_tensor(0, x)

    def step():
        it.set_tensor(0, x)
        it.invoke()
        return it.get_tensor(it.get_output_details()[0]["index"])
    ok = bool(np.array_equal(step(), np.maximum(x, 0)))
    return {"tiny model invoke": stats(it.invoke, runs), "tiny model step (set+invoke+get)": stats(step, runs),
            "tiny model ok": ok, "tiny model waits": it.summary()["runtime"]["waits_per_invoke"]}


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--backend", default="vulkan")
    p.add_argument("--kb", type=int, default=600)
    p.add_argument("--runs", type=int, default=200)
    a = p.parse_args(argv)
    from tflite_taichi.runtime import device
    d = device.CapiDevice(a.backend)
    n = a.kb * 1024 // 4
    host = np.random.default_rng(0).random(n, dtype=np.float32)
    back = np.empty_like(host)
    rows = {"backend": a.backend, "kb": a.kb}
    lib = d.lib

    if d.arch in ("x64", "arm64"):
        buf = d.allocate(n, "f32")
        view = buf.host.view(np.float32)

        def host_memory():
            view[:] = host
            d.wait()
            back[:] = view
        rows["host memory"] = stats(host_memory, a.runs)
        rows["host memory ok"] = bool(np.array_equal(back, host))
    else:
        hv = d.allocate(n, "f32", host_write=True, host_read=True)

        def mapped():
            ptr = d.map(hv)
            C.memmove(ptr, host.ctypes.data, host.nbytes)
            d.unmap(hv)
            ptr = d.map(hv)
            C.memmove(back.ctypes.data, ptr, back.nbytes)
            d.unmap(hv)
        rows["map (in + out)"] = stats(mapped, a.runs)
        rows["map ok"] = bool(np.array_equal(back, host))
        io = d.allocate(n, "f32")
        if d.arch == "cuda":
            cuda = d._cuda
            ptr = d.device_pointer(io)
            pinned = cuda.pinned(n)

            def pageable():
                cuda.copy_in(ptr, host)
                cuda.copy_out(back, ptr)
            rows["cuMemcpy pageable (in + out)"] = stats(pageable, a.runs)
            rows["cuMemcpy pageable ok"] = bool(np.array_equal(back, host))

            def pinned_copy():
                pinned[:] = host
                cuda.copy_in(ptr, pinned)
                cuda.copy_out(pinned, ptr)
                back[:] = pinned
            rows["cuMemcpy pinned (in + out)"] = stats(pinned_copy, a.runs)
            rows["cuMemcpy pinned ok"] = bool(np.array_equal(back, host))
        else:
            link = d.link(io)
            whole = [(0, n)]

            def staged():
                link.put([(0, host)])
                link.request(whole)
                d.wait()
                back[:] = link.take(whole)[0]
            rows["staging+copy (in + out, one wait)"] = stats(staged, a.runs)
            rows["staging+copy ok"] = bool(np.array_equal(back, host))

            def wait_only():
                d.wait()
            rows["wait alone"] = stats(wait_only, a.runs)
    rows.update(_tiny_model(a.backend, a.runs))
    del lib
    print("RESULT " + json.dumps(rows), flush=True)
    for k, v in rows.items():
        print(f"  {k:<36} {v}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
