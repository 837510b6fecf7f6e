#!/bin/bash
# The GPU machine's runs for issue 31 (bench/results/issue31_*.md). Carries .whl (device-prep
# --capi --litert), .gl, .models (the shared models) and .anchors (../shared/tools/gpu_anchors.py);
# writes under $OUT. The zoo's models are built there (bench/make_zoo.py).
#   bash lab/gpu_launch_costs.sh floor              # launch_floor.py on vulkan: our command buffers
#                                                # against Taichi's submissions (TFLITE_TAICHI_VULKAN_SUBMIT)
#   bash lab/gpu_launch_costs.sh floor cuda         # launch_floor.py on cuda: item 4's launch floor
#   bash lab/gpu_launch_costs.sh table MODELS...    # tflite-taichi bench: LiteRT CPU 16 threads, LiteRT GPU,
#                                                # cuda, vulkan side by side (the README's table;
#                                                # $BACKENDS and $PRECISION change the set)
#   bash lab/gpu_launch_costs.sh gemm BACKEND       # gemm_micro.py: the 17x17 and 33x33 pointwise class,
#                                                # untiled against shared-memory tile shapes
#   bash lab/gpu_launch_costs.sh fp16 ARCH...       # fp16_compute.py: f32, f16 storage, f16 arithmetic
#   bash lab/gpu_launch_costs.sh ab BACKEND MODELS  # ab_tiles.py: whole models, GEMM tile selections
#                                                # alternating in one process ($VARIANTS)
set -u
source bench/gpu_setup.sh
[ -f /tmp/site/.compiled ] || { python3 -m compileall -q -j 16 /tmp/site >/dev/null 2>&1; touch /tmp/site/.compiled; }
nproc; python3 -c "import platform, numpy; print(platform.python_version(), 'numpy', numpy.__version__)"
zoo() { python3 bench/make_zoo.py .zoo --only "$1" >/dev/null 2>&1; }
what=${1:-floor}; shift || true
case "$what" in
  floor)
    zoo mobilenet_v2,posenet
    if [ "${1:-vulkan}" = cuda ]; then
      python3 lab/launch_floor.py --backend cuda --runs 300 --launches 1 4 16 --tasks 1 32 \
        --model .zoo/mobilenet_v2_fp32.tflite .zoo/posenet_fp32.tflite --json "$OUT/floor_cuda.json" 2>&1
      exit
    fi
    for s in ours taichi; do
      echo "== TFLITE_TAICHI_VULKAN_SUBMIT=$s"
      TFLITE_TAICHI_VULKAN_SUBMIT=$s python3 lab/launch_floor.py --backend vulkan --runs 300 \
        --launches 1 4 16 --tasks 1 32 --model .zoo/mobilenet_v2_fp32.tflite .zoo/posenet_fp32.tflite \
        --json "$OUT/floor_$s.json" 2>&1
    done ;;
  table)
    zoo "${ZOO:-mobilenet_v2,mobilenet_v3_large,mobilenet_v3_small,efficientnet_lite0,posenet}"
    # BACKENDS / PRECISION: e.g. BACKENDS="litert_gpu_fp16 vulkan" PRECISION=fp16 for the fp16 pair
    python3 -m tflite_taichi bench "$@" --backends ${BACKENDS:-litert litert_gpu cuda vulkan} \
      --precision "${PRECISION:-fp32}" --threads 16 \
      --runs 100 --wide --out "$OUT/table_$(date +%s)" 2>&1 ;;
  gemm)
    python3 bench/gemm_micro.py --backend "${1:-cuda}" --layers 8 --runs 100 \
      --shapes 17x512 17x1024 33x256 --configs off 64,64,4,4 32,64,2,4 32,32,2,2 16,64,1,4 2>&1 ;;
  ab)
    backend=$1; shift
    zoo "${ZOO:-posenet,deeplab_v3,mobilenet_v2}"
    for m in "$@"; do
      python3 lab/ab_tiles.py "$m" --backend "$backend" --rounds "${ROUNDS:-2}" --runs 200 \
        --variant ${VARIANTS:-off:NO_SHARED_TILES=1 default:} 2>&1
    done ;;
  fp16)
    for arch in "$@"; do python3 lab/fp16_compute.py --arch "$arch" --runs 20 2>&1; done ;;
esac
