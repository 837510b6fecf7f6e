"""Run by backend.probe in a subprocess: can Taichi run a kernel on this arch, and on what device?

A script, not a module import, so a crash in a driver cannot take the caller down. Prints
"PROBE-OK <arch> <renderer>" on success; Taichi's trace log (stderr) names the Vulkan device.
"""
import os
import sys

os.environ.setdefault("ENABLE_TAICHI_HEADER_PRINT", "False")
name = sys.argv[1]
import taichi as ti
arch = {"cpu": ti.cpu}.get(name) or getattr(ti, name)
ti.init(arch=arch, enable_fallback=False, offline_cache=False, log_level=ti.TRACE)
got = ti.lang.impl.current_cfg().arch.name
x = ti.ndarray(ti.f32, 4)
@ti.kernel
def fill(a: ti.types.ndarray()):
    for i in a:
        a[i] = i * 2.0
fill(x)
assert x.to_numpy().tolist() == [0.0, 2.0, 4.0, 6.0], "wrong result"
renderer = ""
if name in ("opengl", "gles"):
    try:
        import ctypes
        gl = ctypes.CDLL("libGL.so.1") if name == "opengl" else ctypes.CDLL("libGLESv2.so.2")
        gl.glGetString.restype = ctypes.c_char_p
        renderer = (gl.glGetString(0x1F01) or b"").decode()
    except Exception:
        renderer = ""
print("PROBE-OK", got, renderer, flush=True)
