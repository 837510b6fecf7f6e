#!/bin/bash
# The GPU machine's runs for issue #13 (kernels: fusion, layouts): bench/results/kernels_h200.md.
# Carries .whl (device-prep --capi --litert), .gl and the models folder named below; writes under $OUT.
#   bash lab/gpu_kernels.sh all FOLDER MODELS... # check_models (vs LiteRT's saved outputs) cold and
#                                                  # warm on cuda, vulkan, opengl; then bench.py side by
#                                                  # side (LiteRT CPU 16 threads + GPU, ours), 100 runs
#   bash lab/gpu_kernels.sh ours FOLDER MODELS... # the same without LiteRT (models too big to carry with it)
#   bash lab/gpu_kernels.sh bench FOLDER MODELS...# bench.py only (its diff column checks against LiteRT)
#   bash lab/gpu_kernels.sh profile MODEL         # per-op and per-task times, cuda (kernel profiler)
#   bash lab/gpu_kernels.sh fusion MODELS...      # TFLITE_TAICHI_FUSION=none / store / all, cuda and
#                                                   # vulkan, side by side (bench.py per setting)
#   bash lab/gpu_kernels.sh wait MODELS...        # vulkan's host wait: TFLITE_TAICHI_VULKAN_WAIT=taichi
#                                                   # (ti_wait) then fence (vulkan_host.py): cost_constants'
#                                                   # empty invoke and task slope, and bench.py
#   bash lab/gpu_kernels.sh chains [N]            # conv_shapes.py --chain N (default 10), cuda + vulkan
#   bash lab/gpu_kernels.sh split MODELS...       # pointwise convs split by their thread count, then
#                                                   # TFLITE_TAICHI_POINTWISE_SPLIT=0 (by outputs), ours only
#   bash lab/gpu_kernels.sh zoo FOLDER            # the zoo models of the README's table, built there
#   bash lab/gpu_kernels.sh chunks MODELS...      # one kernel per partition (TFLITE_TAICHI_CHUNK_STEPS
#                                                   # =1000) against 32 steps per kernel, vulkan
#   bash lab/gpu_kernels.sh fp16 MODELS...        # fp16 against fp32, batch 1 (bench.py) and batch 32
#                                                   # (batch_throughput.py), cuda and vulkan
#   bash lab/gpu_kernels.sh accuracy MODELS...    # fp16_accuracy.py on cuda and vulkan with LiteRT GPU's fp16
#   bash lab/gpu_kernels.sh profiles MODELS...    # each miss's profile: profile_invoke.py per model on
#                                                   # cuda (kernel profiler, per task) and on vulkan
#                                                   # (per partition), and cost_constants' floors
#   bash lab/gpu_kernels.sh codes MODELS...       # int8 IO as codes (TensorRef.codes): bench.py side by
#                                                   # side (LiteRT CPU 16 threads + GPU, ours), then ours
#                                                   # with TFLITE_TAICHI_IO_CODES=0 (numpy (de)quantizes)
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
  wait)
    for w in taichi fence; do
      echo "=== TFLITE_TAICHI_VULKAN_WAIT=$w"
      (cd bench && TFLITE_TAICHI_VULKAN_WAIT=$w python3 cost_constants.py --backends vulkan --runs 300 \
        --json "$OUT/wait_${w}_constants.json")
      TFLITE_TAICHI_VULKAN_WAIT=$w python3 bench/bench.py "$@" --backends vulkan --threads 16 --runs 100 \
        --warmup 10 --out "$OUT/wait_$w" --title "H200: vulkan, TFLITE_TAICHI_VULKAN_WAIT=$w" 2>&1 | grep -v "step/s"
    done ;;
  boost)      # the final side by side: LiteRT (CPU 16 threads, GPU, GPU holding a CUDA context as our
              # vulkan does: equal clocks), ours with vulkan_host.py's fence and boost
    folder=$1; shift
    python3 bench/bench.py "$@" --backends litert litert_gpu cuda vulkan opengl --threads 16 --runs 100 \
      --warmup 10 --out "$OUT/boost" --title "H200: LiteRT CPU and GPU, tflite_taichi (issue 13)" 2>&1 | grep -v "step/s"
    TFLITE_TAICHI_BENCH_CUDA_CONTEXT=1 python3 bench/bench.py "$@" --backends litert_gpu --runs 100 \
      --warmup 10 --out "$OUT/boost_litert_gpu_cuda_context" \
      --title "H200: LiteRT GPU with a CUDA context held (the clocks our vulkan gets)" 2>&1 | grep -v "step/s"
    for b in vulkan; do TFLITE_TAICHI_VULKAN_BOOST=0 python3 bench/bench.py "$@" --backends $b --runs 100 \
      --warmup 10 --out "$OUT/boost_off_$b" --title "H200: $b without the clock boost" 2>&1 | grep -v "step/s"; done ;;
  chains)
    (cd bench && python3 conv_shapes.py --backends cuda vulkan --runs 100 --chain "${1:-10}" \
      --json "$OUT/conv_chains.json") ;;
  split)
    for v in 1 0; do
      echo "=== TFLITE_TAICHI_POINTWISE_SPLIT=$v"
      TFLITE_TAICHI_POINTWISE_SPLIT=$v python3 bench/bench.py "$@" --backends cuda vulkan opengl --runs 200 \
        --warmup 20 --out "$OUT/split_$v" --title "H200: ours, TFLITE_TAICHI_POINTWISE_SPLIT=$v" 2>&1 | grep -v "step/s"
    done ;;
  codes)
    python3 bench/bench.py "$@" --backends litert litert_gpu cuda vulkan --threads 16 --runs 100 \
      --warmup 10 --out "$OUT/codes" --title "H200: LiteRT CPU and GPU, ours with int8 IO on the device" 2>&1 | grep -v "step/s"
    TFLITE_TAICHI_IO_CODES=0 python3 bench/bench.py "$@" --backends cuda vulkan --runs 100 --warmup 10 \
      --out "$OUT/codes_off" --title "H200: ours, TFLITE_TAICHI_IO_CODES=0 (numpy (de)quantizes the IO)" 2>&1 | grep -v "step/s" ;;
  zoo)
    python3 bench/make_zoo.py "$1" --only deeplab_v3,mobilenet_v3_small,efficientnet_lite0,posenet ;;
  chunks)
    for c in 32 1000; do
      echo "=== TFLITE_TAICHI_CHUNK_STEPS=$c"
      TFLITE_TAICHI_CHUNK_STEPS=$c python3 bench/bench.py "$@" --backends vulkan --runs 200 --warmup 20 \
        --out "$OUT/chunks_$c" --title "H200: vulkan, TFLITE_TAICHI_CHUNK_STEPS=$c" 2>&1 | grep -v "step/s"
    done ;;
  fp16)
    python3 bench/bench.py "$@" --backends cuda vulkan --precision fp16 --runs 100 --warmup 10 \
      --out "$OUT/fp16_batch1" --title "H200: ours, precision fp16, batch 1" 2>&1 | grep -v "step/s"
    for m in "$@"; do for b in cuda vulkan; do for p in fp32 fp16; do
      python3 bench/batch_throughput.py "$m" --backend $b --precision $p --batch 32 --runs 20 2>&1 \
        | grep -v -E "DelegateWarning|SyntaxWarning|Save a field"
    done; done; done ;;
  accuracy)
    python3 bench/fp16_accuracy.py "$@" --backends cuda vulkan --seeds 3 --litert-gpu \
      --out "$OUT/fp16_accuracy_h200" 2>&1 | grep -v -E "^\{" ;;
  profiles)
    (cd bench && python3 cost_constants.py --backends cuda vulkan --runs 300 --json "$OUT/floors.json") 2>&1 | tail -8
    for m in "$@"; do
      echo "=== $m"
      python3 bench/profile_invoke.py "$m" --backend vulkan --runs 100 2>&1 | grep -v -E "SyntaxWarning|Save a field|DelegateWarning"
      python3 bench/profile_invoke.py "$m" --backend cuda --runs 50 --kernel-profiler --tasks 12 2>&1 \
        | grep -v -E "SyntaxWarning|Save a field|DelegateWarning"
    done ;;
  profile)
    python3 bench/profile_invoke.py "$1" --backend cuda --runs 50 --kernel-profiler --tasks 25 2>&1 | grep -v -E "SyntaxWarning|Save a field" ;;
esac
