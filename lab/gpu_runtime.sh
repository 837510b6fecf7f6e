#!/bin/bash
# The GPU machine's runs for issue #12 (AOT modules through Taichi's C API, one wait per invoke):
# bench/results/runtime_h200.md. Carries .whl (device-prep --capi --litert), .gl and the models
# folder named below; writes under $OUT.
#   bash lab/gpu_runtime.sh smoke           # C API IO candidates; 4 models cold then warm, every backend
#   bash lab/gpu_runtime.sh bench MODELS... # bench.py side by side (LiteRT CPU + GPU, ours), 100 runs
#   bash lab/gpu_runtime.sh ours MODELS...  # the same without LiteRT (a model too big to carry with it)
#   bash lab/gpu_runtime.sh litert MODELS...# LiteRT CPU + GPU only
#   bash lab/gpu_runtime.sh lifetime MODEL  # 100 create/destroy cycles and 10,000 invokes per backend
#   bash lab/gpu_runtime.sh io              # lab/capi_io.py: IO candidates and a one-op model's invoke
#   bash lab/gpu_runtime.sh starts MODEL    # bench/start_profile.py cold then warm, per backend
#   bash lab/gpu_runtime.sh verify FOLDER   # mobilenet_v1_fp32 vs LiteRT cold/warm, starts, runtime tests
set -u
source bench/gpu_setup.sh
export TFLITE_TAICHI_CACHE_DIR=/tmp/issue12-cache
# pip installed with --no-compile: byte-compile once, or every import would pay it (users' installs have .pyc)
[ -f /tmp/site/.compiled ] || { python3 -m compileall -q -j 16 /tmp/site >/dev/null 2>&1; touch /tmp/site/.compiled; }
what=${1:-smoke}; shift || true
case "$what" in
  smoke)
    (cd /tmp && python3 -c "from tflite_taichi import capi; print('C API archs:', capi.available_archs())")
    for b in cuda vulkan opengl; do python3 lab/capi_io.py --backend $b --runs 200; done
    for b in cuda vulkan opengl; do for pass in cold warm; do
      echo "=== $b $pass"
      python3 bench/check_models.py --backend $b --models .models --expected .models --runs 50 \
        --only face_detection_short_range hand_landmark_lite selfie_segmentation iris_landmark 2>&1 \
        | grep -v -E "DelegateWarning|^  it\.|^\[Taichi\]"
    done; done ;;
  bench|ours|litert)
    backends="litert litert_gpu cuda vulkan opengl"
    [ "$what" = ours ] && backends="cuda vulkan opengl"
    [ "$what" = litert ] && backends="litert litert_gpu"
    python3 bench/bench.py "$@" --backends $backends --threads 16 --runs 100 --warmup 10 \
      --out "$OUT/bench_$what" --title "H200: LiteRT CPU and GPU, tflite_taichi through Taichi's C API" ;;
  lifetime)
    for b in cuda vulkan opengl; do python3 bench/lifetime.py "$1" --backend $b --cycles 100 --invokes 10000 \
      --json "$OUT/lifetime_$b.json" 2>&1 | grep RESULT; done ;;
  io)
    for b in cuda vulkan opengl; do python3 lab/capi_io.py --backend $b --runs 300 2>&1 | grep RESULT; done ;;
  starts)
    export TFLITE_TAICHI_CACHE_DIR=/tmp/starts-$$
    for b in vulkan opengl cuda; do for pass in cold warm; do python3 bench/start_profile.py "$1" --backend $b --top 30 \
      2>&1 | grep -v -E "SyntaxWarning|Save a field"; done; done ;;
  verify)
    # mobilenet_v1_fp32 against LiteRT's outputs (check_models --make-expected, run here before),
    # cold then warm, every backend; a start profile with the import; the runtime's tests
    python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl_test/*.whl 2>&1 | grep -v "already exists"
    export TFLITE_TAICHI_CACHE_DIR=/tmp/verify-$$
    for b in cuda vulkan opengl; do for pass in cold warm; do
      echo "=== $b $pass"
      python3 bench/check_models.py --backend $b --models "$1" --expected "$1" --runs 50 --only mobilenet_v1_fp32 2>&1 \
        | grep -v -E "DelegateWarning|^  it\.|^\[Taichi\]|SyntaxWarning|Save a field"
    done; done
    for b in vulkan opengl; do python3 bench/start_profile.py "$1/mobilenet_v1_fp32.tflite" --backend $b --top 3 2>&1 | grep "construct to first"; done
    (cd tests && TFLITE_TAICHI_TEST_BACKENDS=cuda,vulkan,opengl python3 -m pytest -q -p no:cacheprovider \
       test_runtime.py test_delegate.py -k "not missing_arch and not auto_without" 2>&1 | tail -3) ;;
esac
