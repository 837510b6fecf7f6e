#!/bin/bash
# The GPU machine's speed run (bench/results/gpu_h200*.md). Carries .whl .gl (device-prep),
# .litert (a slim LiteRT 2.3.0 cp312 build: the interpreter wrapper and its one library, from the
# ai-edge-litert wheel) and .models_bench (mobilenet_v1_fp32, selfie_segmentation,
# hand_landmark_lite). Writes the reports under $OUT.
#   bash bench/gpu_bench.sh fp32|fp16|batch|notiles
# notiles: the fp32 run with the shared-memory GEMM tiles switched off (TFLITE_TAICHI_NO_SHARED_TILES),
# the A/B for ops/conv.py's GemmTileStep.
set -u
source bench/gpu_setup.sh
tar -xJf .litert/ai_edge_litert-*-cp312-slim.tar.xz -C /tmp/site
python3 -c "import ai_edge_litert.interpreter as l; print('LiteRT', l.__file__)"
case "${1:-fp32}" in
  fp32) python3 bench/bench.py .models_bench/mobilenet_v1_fp32.tflite .models_bench/selfie_segmentation.tflite \
          .models_bench/hand_landmark_lite.tflite --backends litert cuda vulkan opengl --threads 16 \
          --runs 100 --warmup 10 --out "$OUT/gpu_h200_fp32" --title "H200, float32" ;;
  fp16) python3 bench/bench.py .models_bench/mobilenet_v1_fp32.tflite .models_bench/selfie_segmentation.tflite \
          .models_bench/hand_landmark_lite.tflite --backends litert cuda vulkan --precision fp16 --threads 16 \
          --runs 100 --warmup 10 --out "$OUT/gpu_h200_fp16" --title "H200, fp16 storage" ;;
  notiles) TFLITE_TAICHI_NO_SHARED_TILES=1 python3 bench/bench.py .models_bench/mobilenet_v1_fp32.tflite \
          .models_bench/selfie_segmentation.tflite .models_bench/hand_landmark_lite.tflite \
          --backends litert cuda vulkan opengl --threads 16 --runs 100 --warmup 10 \
          --out "$OUT/gpu_h200_fp32_no_tiles" --title "H200, float32, shared-memory tiles off" ;;
  batch) for b in cuda vulkan; do python3 bench/batch_throughput.py .models_bench/mobilenet_v1_fp32.tflite \
          --backend $b --batch 32 --runs 20 --litert-threads 16; done ;;
esac
