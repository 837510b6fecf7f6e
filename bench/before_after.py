"""The same benchmark from two source trees of the package, alternating, for a change that must
not move the numbers (a restructuring). Each round runs `python -m tflite_taichi bench`
once from each tree's root (which imports that tree: tests/test_source_tree.py), the trees'
order swapped every round so drift falls on both; the report gives, per model and runtime, each
tree's median step (the median of its rounds' medians), the after/before ratio, the warm start
and the largest difference from the oracle.

    git worktree add /tmp/before <commit>
    python bench/before_after.py --before /tmp/before --after . --rounds 2 \\
        --backends litert,reference,cpu,vulkan --runs 30 MODEL.tflite ... --out bench/results/x.md
"""
from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import tempfile
import time


def run_bench(tree: str, models: list, args, out_json: str) -> list:
    """One `tflite-taichi bench` from `tree`'s root; its per-model JSON records."""
    cmd = [sys.executable, "-m", "tflite_taichi", "bench", *models, "--backends", args.backends,
           "--runs", str(args.runs), "--warmup", str(args.warmup), "--json", out_json]
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    subprocess.run(cmd, cwd=tree, env=env, check=True, stdout=subprocess.DEVNULL,
                   stderr=subprocess.DEVNULL)
    with open(out_json) as f:
        data = json.load(f)
    return data if isinstance(data, list) else [data]


def git_head(tree: str) -> str:
    out = subprocess.run(["git", "-C", tree, "log", "-1", "--format=%h %s"], capture_output=True,
                         text=True)
    return out.stdout.strip()[:80] or "?"


def collect(args) -> dict:
    """(tree, model, backend) -> per-round {"median", "p10", "p90", "warm_s", "diff", "ok"}."""
    found: dict = {}
    trees = [("before", args.before), ("after", args.after)]
    with tempfile.TemporaryDirectory() as tmp:
        for round_ in range(args.rounds):
            for name, tree in (trees if round_ % 2 == 0 else trees[::-1]):
                path = os.path.join(tmp, f"{name}{round_}.json")
                start = time.perf_counter()
                for record in run_bench(tree, [os.path.abspath(m) for m in args.models], args, path):
                    for row in record["rows"]:
                        lat = row.get("latency_ms") or {}
                        found.setdefault((name, record["model"], row["backend"]), []).append({
                            "ok": row.get("ok"), "median": lat.get("median"),
                            "p10": lat.get("p10"), "p90": lat.get("p90"),
                            "warm_s": (row.get("warm") or {}).get("start_s"),
                            "diff": row.get("max_rel_diff")})
                print(f"round {round_ + 1}/{args.rounds} {name}: {time.perf_counter() - start:.0f} s",
                      file=sys.stderr)
    return found


def _median(values):
    values = [v for v in values if v is not None]
    return statistics.median(values) if values else None


def report(found: dict, args) -> str:
    models = sorted({m for _, m, _ in found})
    backends = [b for b in args.backends.split(",") if any(k[2] == b for k in found)]
    lines = [f"# Before and after: {args.title}", "",
             f"- command: `python bench/before_after.py {' '.join(sys.argv[1:])}`",
             f"- before: `{git_head(args.before)}`", f"- after: `{git_head(args.after)}`",
             f"- machine: {platform.machine()}, {os.cpu_count()} cores, {platform.system()} "
             f"{platform.release()}; Python {platform.python_version()}",
             f"- {args.rounds} rounds, trees alternating; each round `tflite-taichi bench --runs "
             f"{args.runs} --warmup {args.warmup}`: the step's median per round, and here the "
             "median of those (p10-p90 of the last round)", "",
             "| model | runtime | before ms (p10-p90) | after ms (p10-p90) | after/before | "
             "warm start s before/after | max rel. diff before/after |",
             "| --- | --- | --- | --- | --- | --- | --- |"]
    for model in models:
        for backend in backends:
            b, a = found.get(("before", model, backend), []), found.get(("after", model, backend), [])
            if not b or not a:
                continue
            mb, ma = _median(r["median"] for r in b), _median(r["median"] for r in a)
            ratio = f"{ma / mb:.2f}" if mb and ma else "-"

            def cell(rows, med):
                if med is None:
                    return "failed" if not all(r["ok"] for r in rows) else "-"
                last = rows[-1]
                return f"{med:.2f} ({last['p10']:.2f}-{last['p90']:.2f})"

            def fmt(v, spec):
                return format(v, spec) if isinstance(v, (int, float)) else "-"
            lines.append(f"| {model} | {backend} | {cell(b, mb)} | {cell(a, ma)} | {ratio} | "
                         f"{fmt(_median(r['warm_s'] for r in b), '.2f')} / "
                         f"{fmt(_median(r['warm_s'] for r in a), '.2f')} | "
                         f"{fmt(b[-1]['diff'], '.1e')} / {fmt(a[-1]['diff'], '.1e')} |")
    return "\n".join(lines) + "\n"


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("models", nargs="+")
    parser.add_argument("--before", required=True, help="a source tree's root (a git worktree)")
    parser.add_argument("--after", required=True, help="another one (this clone: .)")
    parser.add_argument("--backends", default="litert,reference,cpu,vulkan")
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--runs", type=int, default=30)
    parser.add_argument("--warmup", type=int, default=5)
    parser.add_argument("--title", default="the same benchmark from two trees")
    parser.add_argument("--out", help="also write the markdown report here")
    args = parser.parse_args(argv)
    text = report(collect(args), args)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
