"""The runtime wing: what a process needs to get a program's kernels and run them (issue 28,
item 7; the house issue moves the rest here): Taichi's frontend made cheaper
(taichi_frontend.py) and kernels compiled in worker processes (compile_workers.py)."""
