"""The runtime wing: what a process needs to get a program's kernels and run them, kept apart from
what the delegate decides so that a start loads only this: the process's Taichi session (session.py), which
backend (backend.py sits above, choosing), devices and their host links (device.py, capi.py,
vulkan_submit.py), the kernel cache (cache.py) and kernels compiled in worker processes
(compile_workers.py, kernels.py)."""
