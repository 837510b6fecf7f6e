#!/bin/bash
# The GPU machine's run (see bench/results/gpu_models.md): the five float models on every
# GPU backend, fp32 and fp16, against LiteRT's outputs computed beforehand (LiteRT is not
# installed there). Run from the repository root after ../shared/tools/device-prep, with the
# models and their .expected.npz in .models/ (python bench/check_models.py --make-expected).
set -u
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
mkdir -p /tmp/site && tar -xJf .whl/taichi-1.7.4-cp312-slim.tar.xz -C /tmp/site \
  && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --target /tmp/site . || exit 1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TI_SKIP_VERSION_CHECK=ON
if ! ls /usr/share/vulkan/icd.d/*.json >/dev/null 2>&1 && [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
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
