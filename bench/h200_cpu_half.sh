#!/bin/bash
# The CPU half's H200 measurements, in parts that each fit one device call (bench/results/cpu_half_h200.md).
#   bash bench/h200_cpu_half.sh hidden|auto|gpus|first MODELS_DIR OUT_DIR
# hidden: a user's step with the GPU hidden (CUDA_VISIBLE_DEVICES= and no Vulkan/EGL driver):
#         LiteRT 16 threads vs `auto`.
# auto:   with the GPU, each alone in a process: LiteRT CPU, LiteRT's GPU path and `auto` (cold
#         caches; it waits for its kernels and makes its choice in the warm-up); AUTO_BACKENDS
#         picks some of them.
# gpus:   the same steps on our cuda and our vulkan, each in its own process beside LiteRT.
# first:  the first result with `auto`, import included, cold (fresh caches) and warm, then
#         stepping on to see when the GPU takes over; LiteRT's own first result beside it.
# lgpu:   LiteRT's GPU path, a process per model (it refuses some models with an error, and has
#         crashed its process on others), fresh caches each.
# WARMUP_S (default 0.5): each runtime steps this long before it is timed (an idle GPU climbs to
# its clock over ~0.25 s of work; 25 steps were too few for cuda alone, auto_h100.md).
set -u
part=$1; dir=$2; out=$3
models=$(ls "$dir"/*.tflite)
fresh() {   # a fresh cache for ours, CUDA's and the drivers'
    local c; c=$(mktemp -d /tmp/ttc-XXXX)
    export TFLITE_TAICHI_CACHE_DIR=$c CUDA_CACHE_PATH=$c/nv MESA_SHADER_CACHE_DIR=$c/mesa \
        XDG_CACHE_HOME=$c/xdg __GL_SHADER_DISK_CACHE_PATH=$c/gl
}
case $part in
hidden)
    fresh
    CUDA_VISIBLE_DEVICES= VK_ICD_FILENAMES=/none __EGL_VENDOR_LIBRARY_FILENAMES=/none \
        python3 bench/cpu_step.py $models mobilenet_v2 --backends litert,auto --threads 16 \
        --steps 100 --json "$out/hidden16.json"
    ;;
auto)      # each runtime alone in its process: LiteRT's 16 spinning threads beside a GPU
           # backend's launching thread slow it (one process each, as gpu_anchors.py does)
    for b in ${AUTO_BACKENDS:-litert litert_gpu auto}; do      # LiteRT's GPU path has crashed its process
        fresh
        python3 bench/cpu_step.py $models mobilenet_v2 --backends $b --threads 16 \
            --steps 100 --warmup 25 --warmup-s ${WARMUP_S:-0.5} --json "$out/alone_$b.json"
    done
    ;;
gpus)
    for b in cuda vulkan; do
        fresh
        python3 bench/cpu_step.py $models mobilenet_v2 --backends litert,$b --threads 16 \
            --steps 100 --warmup-s ${WARMUP_S:-0.5} --json "$out/gpu_$b.json"
    done
    ;;
lgpu)
    for m in $models ${EXTRA_MODELS:-}; do
        fresh
        timeout 60 python3 bench/cpu_step.py $m --backends litert_gpu --threads 16 --steps 100 \
            --warmup 25 --warmup-s ${WARMUP_S:-0.5} --json "$out/lgpu_$(basename "$m" .tflite).json" 2>&1 | grep litert_gpu | tail -1
    done
    ;;
first)     # FIRST_MODELS="a b": those of MODELS_DIR only
    [ -n "${FIRST_MODELS:-}" ] && models=$(for n in $FIRST_MODELS; do echo "$dir/$n.tflite"; done)
    for m in $models; do
        fresh
        echo "== $(basename "$m")"
        echo -n "cold: "; timeout 60 python3 bench/first_result.py ours "$m" --follow "${FOLLOW_COLD:-15}" 2>/dev/null
        echo -n "warm: "; timeout 60 python3 bench/first_result.py ours "$m" --follow "${FOLLOW_WARM:-6}" 2>/dev/null
        echo -n "litert: "; timeout 60 python3 bench/first_result.py litert "$m" 2>/dev/null
    done
    ;;
esac
