"""LiteRT (CPU and GPU) and every backend of ours on a set of models, side by side.

    python bench/bench.py MODEL... [--models DIR] [--backends B ...] [--threads N] [--runs 100]
                          [--warmup 10] [--out bench/results/NAME] [--note TEXT]

MODEL is a .tflite path or a name in --models (default $TFLITE_TAICHI_MODELS or ../shared/models).
Backends: litert (LiteRT CPU, XNNPACK), litert_gpu / litert_gpu_fp16 (LiteRT's GPU path, ML Drift,
fp32 / fp16), reference, auto and the Taichi backends. Default: litert, litert_gpu (only where a
hardware GPU backend of ours starts: never on a CPU-only machine), reference, those GPU backends
and cpu. Each backend runs in fresh subprocesses (see tflite_taichi/bench.py for what is measured
and how): cold start, warm start and warm as a % of cold, median/p10/p90/min latency of a step (set
every input, invoke, get every output), launches and waits per invoke, device kind and cache state
(ours), and the outputs' largest difference from LiteRT CPU's. Writes NAME.md (machine, versions,
command, table), NAME.json (every number, every timed step) and NAME.png (median step latency with
p10-p90 bars; needs matplotlib: pip install '.[bench]').

    python bench/bench.py mobilenet_v1_fp32 selfie_segmentation --backends litert reference cpu vulkan \\
        --out bench/results/cpu_lavapipe_2core
"""
import argparse
import os
import shlex
import sys

HERE = os.path.dirname(os.path.abspath(__file__))

from tflite_taichi.tools import bench  # noqa: E402  (the installed package: pip install -e . for a checkout)

DEFAULT_MODELS = os.environ.get("TFLITE_TAICHI_MODELS",
                                os.path.join(HERE, "..", "..", "shared", "models"))


def resolve(model: str, models_dir: str) -> str:
    if os.path.isfile(model):
        return model
    for candidate in (os.path.join(models_dir, model), os.path.join(models_dir, model + ".tflite")):
        if os.path.isfile(candidate):
            return candidate
    raise SystemExit(f"bench.py: no model {model!r} (not a file, nor in {models_dir})")


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("models", nargs="+", metavar="MODEL")
    p.add_argument("--models", dest="models_dir", default=DEFAULT_MODELS,
                   help="where bare model names are looked up")
    bench.add_arguments(p)
    p.add_argument("--out", default=None, help="NAME of NAME.md/.json/.png (default bench/results/bench_DATE)")
    p.add_argument("--title", default="", help="the report's title")
    p.add_argument("--note", default="", help="a note at the top of the report (e.g. the machine was shared)")
    args = p.parse_args(argv)
    if args.runs < 1:
        p.error("--runs must be >= 1")
    paths = [resolve(m, args.models_dir) for m in args.models]
    backends = bench.check_backends(args.backends) if args.backends else bench.default_backends()
    threads = args.threads or os.cpu_count() or 1
    out = args.out or os.path.join(HERE, "results", "bench_" + bench.now().split()[0])
    started, machine = bench.now(), bench.machine_info()     # load average before the run
    devices = {b: bench.device_of(b, threads) for b in backends}
    for b, d in devices.items():
        print(f"{b}: {d['device'] if d['ok'] else 'does not start: ' + d['detail']}", file=sys.stderr)
    results = bench.bench_models(paths, backends, args, threads, devices)
    command = "python " + " ".join(shlex.quote(a) for a in
                                   [os.path.relpath(__file__)] + list(sys.argv[1:] if argv is None else argv))
    report = bench.make_report(results, command, machine, title=args.title or
                               f"Benchmark: {', '.join(r['model'] for r in results)}", note=args.note,
                               started=started)
    written = bench.write_report(report, out)
    print(bench.render_text(results))
    if len(backends) > 1:
        print()
        print(bench.render_speed_text(results))
    print("written: " + ", ".join(written))
    if "plot_note" in report:
        print(report["plot_note"])
    failed = [(res["model"], r["backend"], r["error"]) for res in results for r in res["rows"] if not r["ok"]]
    for model, backend, error in failed:
        print(f"{model} on {backend}: {error}", file=sys.stderr)
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
