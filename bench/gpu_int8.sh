#!/bin/bash
# The GPU machine's int8 run (bench/results/gpu_int8.md): mobilenet_v1_int8 over 20
# seeded inputs and okay_nabu over a 10-step sequence on cuda, vulkan and opengl, against LiteRT's
# tensors recorded beforehand (LiteRT is not installed there):
#   python bench/int8_diffs.py --model .models_int8/mobilenet_v1_int8.tflite --inputs 20 --all-tensors 4 \
#       --make-expected .models_int8/mobilenet_v1_int8.int8.npz
#   python bench/int8_diffs.py --model .models_int8/okay_nabu.tflite --inputs 10 \
#       --make-expected .models_int8/okay_nabu.int8.npz
set -u
source bench/gpu_setup.sh
status=0
for b in ${1:-cuda vulkan opengl}; do
  for m in mobilenet_v1_int8 okay_nabu; do
    echo "=== $m backend=$b"
    python3 bench/int8_diffs.py --model .models_int8/$m.tflite --backend "$b" \
      --expected .models_int8/$m.int8.npz 2>&1 | grep -v -E "^\[Taichi\]" || status=1
  done
done
exit $status
