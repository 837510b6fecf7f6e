"""The tools beside the runtime: the command line's benchmark (`bench`, with `bench_child`, the
process each measurement runs in), the model zoo (`zoo`: models as a user builds them, for the
benchmarks and tests) and the demo (`demo`). The runtime never imports them."""
