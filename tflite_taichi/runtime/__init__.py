"""The runtime wing: what a process needs to get a program's kernels and run them (issue 28,
item 7; issue 32 moved the rest here): the process's Taichi session (session.py), which
backend (backend.py sits above, choosing), devices and their host links (device.py, capi.py,
vulkan_submit.py), the kernel cache (cache.py) and kernels compiled in worker processes
(compile_workers.py, kernels.py)."""
