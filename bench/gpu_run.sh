#!/bin/bash
# The GPU machine's run (see bench/results/gpu_models.md): the five float models on every
# GPU backend, fp32 and fp16, against LiteRT's outputs computed beforehand (LiteRT is not
# installed there). Run from the repository root after ../shared/tools/device-prep, with the
# models and their .expected.npz in .models/ (python bench/check_models.py --make-expected).
set -u
source bench/gpu_setup.sh
(cd /tmp && python3 -c "from tflite_taichi import backend; print('auto ->', backend.choose_auto(), {n: backend.probe(n) for n in ('cuda','vulkan','opengl','gles')})")
status=0
for run in "${@:-cuda:fp32 vulkan:fp32 opengl:fp32 cuda:fp16 vulkan:fp16}"; do
  for spec in $run; do
    b=${spec%%:*}; p=${spec##*:}
    echo "=== backend=$b precision=$p"
    python3 bench/check_models.py --backend "$b" --precision "$p" --models .models --expected .models --runs 50 2>&1 \
      | grep -v -E "DelegateWarning|^  it\.|^\[Taichi\]" || status=1
  done
done
exit $status
