#!/bin/bash
# The GPU machine's runs for issue #13 (kernels: fusion, layouts): bench/results/kernels_h200.md.
# Carries .whl (device-prep --capi --litert), .gl and the models folder named below; writes under $OUT.
#   bash bench/gpu_issue13.sh all FOLDER MODELS... # check_models (vs LiteRT's saved outputs) cold and
#                                                  # warm on cuda, vulkan, opengl; then bench.py side by
#                                                  # side (LiteRT CPU 16 threads + GPU, ours), 100 runs
#   bash bench/gpu_issue13.sh ours FOLDER MODELS... # the same without LiteRT (models too big to carry with it)
#   bash bench/gpu_issue13.sh bench FOLDER MODELS...# bench.py only (its diff column checks against LiteRT)
#   bash bench/gpu_issue13.sh profile MODEL         # per-op and per-task times, cuda (kernel profiler)
#   bash bench/gpu_issue13.sh fusion MODELS...      # TFLITE_TAICHI_FUSION=none / store / all, cuda and
#                                                   # vulkan, side by side (bench.py per setting)
set -u
source bench/gpu_setup.sh
export TFLITE_TAICHI_CACHE_DIR=/tmp/issue13-cache
[ -f /tmp/site/.compiled ] || { python3 -m compileall -q -j 16 /tmp/site >/dev/null 2>&1; touch /tmp/site/.compiled; }
what=${1:-all}; shift || true
case "$what" in
  all|ours|bench)
    folder=$1; shift
    names=$(for m in "$@"; do basename "$m" .tflite; done)
    [ "$what" = bench ] || for b in cuda vulkan opengl; do for pass in cold warm; do
      echo "=== $b $pass"
      python3 bench/check_models.py --backend $b --models "$folder" --expected "$folder" --runs 20 --only $names 2>&1 \
        | grep -v -E "DelegateWarning|^  it\.|^\[Taichi\]|SyntaxWarning|Save a field"
    done; done
    backends="litert litert_gpu cuda vulkan opengl"
    [ "$what" = ours ] && backends="cuda vulkan opengl"
    python3 bench/bench.py "$@" --backends $backends --threads 16 --runs 100 --warmup 10 \
      --out "$OUT/bench_$what" --title "H200: LiteRT CPU and GPU, tflite_taichi with fusion (issue 13)" ;;
  fusion)
    for f in none store all; do
      echo "=== TFLITE_TAICHI_FUSION=$f"
      TFLITE_TAICHI_FUSION=$f python3 bench/bench.py "$@" --backends cuda vulkan --threads 16 --runs 100 \
        --warmup 10 --out "$OUT/fusion_$f" --title "H200: TFLITE_TAICHI_FUSION=$f" 2>&1 | grep -v "step/s"
    done ;;
  profile)
    python3 bench/profile_invoke.py "$1" --backend cuda --runs 50 --kernel-profiler --tasks 25 2>&1 | grep -v -E "SyntaxWarning|Save a field" ;;
esac
