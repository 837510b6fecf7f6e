"""Run by backend.probe in a subprocess: can Taichi run a kernel on this arch, and on what device?

A script, not a module import, so a crash in a driver cannot take the caller down. Prints
"PROBE-OK <arch> <renderer>" on success; Taichi's trace log (stderr) names the Vulkan device.
"""
import os
import sys

os.environ.setdefault("ENABLE_TAICHI_HEADER_PRINT", "False")
name = sys.argv[1]
import taichi as ti  # noqa: E402  (after the header switch above, which taichi reads at import)
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


def gl_renderer() -> str:
    """GL_RENDERER of the context Taichi made current in this thread ("llvmpipe (LLVM ...)" for
    Mesa's software rasteriser). glGetString from libGL/libGLESv2 where installed, else through
    EGL, which Taichi's GL backend needs anyway: a machine without libgl1 (the README's packages)
    must still be told apart from a GPU. "" when nobody can tell (the caller treats that as a
    software device)."""
    import ctypes
    for library in ["libGL.so.1", "libGLESv2.so.2"] if name == "opengl" else ["libGLESv2.so.2"]:
        try:
            gl = ctypes.CDLL(library)
            gl.glGetString.restype = ctypes.c_char_p
            gl.glGetString.argtypes = [ctypes.c_uint]
            return (gl.glGetString(0x1F01) or b"").decode(errors="replace")
        except (OSError, AttributeError):
            continue
    try:
        egl = ctypes.CDLL("libEGL.so.1")
        egl.eglGetProcAddress.restype = ctypes.c_void_p
        egl.eglGetProcAddress.argtypes = [ctypes.c_char_p]
        address = egl.eglGetProcAddress(b"glGetString")
        if address:
            get_string = ctypes.CFUNCTYPE(ctypes.c_char_p, ctypes.c_uint)(address)
            return (get_string(0x1F01) or b"").decode(errors="replace")
    except (OSError, AttributeError):
        pass
    return ""


renderer = gl_renderer() if name in ("opengl", "gles") else ""
print("PROBE-OK", got, renderer, flush=True)
