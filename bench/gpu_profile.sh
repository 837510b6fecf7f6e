#!/bin/bash
# The GPU machine's invoke profile: where an invoke's time goes, per backend.
#   bash bench/gpu_profile.sh "cuda vulkan opengl" "mobilenet_v1_fp32 selfie_segmentation"
set -u
source bench/gpu_setup.sh
for m in ${2:-mobilenet_v1_fp32}; do
  for b in ${1:-cuda vulkan opengl}; do
    echo "=== $m backend=$b"
    python3 bench/profile_invoke.py .models/$m.tflite --backend "$b" --runs 100 2>&1 | grep -v -E "^\[Taichi\]"
  done
done
