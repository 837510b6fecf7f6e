#!/bin/bash
# The GPU machine's runs for issue #17 (batch inference): bench/results/batch_h200.md.
# Two calls on one warm machine, because taichi + its C API + LiteRT + Pillow (.whl) and the
# 17 MB model do not fit in one call's carry:
#   bash lab/gpu_batch.sh prep          # carries .whl (device-prep --capi --litert, plus a
#                                           # Pillow wheel) and .gl: installs, writes 10,000 JPEGs
#   bash lab/gpu_batch.sh run MODEL     # carries the model's folder only (.whl and /tmp stay
#                                           # on the warm machine): bench/batch_scale.py run
#   bash lab/gpu_batch.sh gap MODEL     # the same way: lab/batch_gap.py
set -u
IMAGES=/tmp/issue17_images
export TFLITE_TAICHI_CACHE_DIR=/tmp/issue17-cache
case "${1:-}" in
  prep)
    source bench/gpu_setup.sh
    python3 -c "import PIL, tqdm; print('Pillow', PIL.__version__)" || exit 1
    time python3 bench/batch_scale.py images none $IMAGES --n ${N:-10000} --side 224 ;;
  run)
    if [ -d /tmp/site/taichi ]; then      # installed by prep on this machine: only its environment
      export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TI_SKIP_VERSION_CHECK=ON
      for f in .gl/*.deb; do [ -f "$f" ] && dpkg -x "$f" /; done; ldconfig 2>/dev/null
      nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
    else
      source bench/gpu_setup.sh
    fi
    ls $IMAGES | wc -l
    python3 bench/batch_scale.py run "$2" $IMAGES --backend cuda --workers 1 2 4 8 --batch 1 32 \
      --preprocess signed --runtimes ours litert --threads 16 --work /tmp/issue17_work \
      --out "$OUT/issue17_batch_h200" \
      --title "H200: tflite-taichi batch over 10,000 JPEGs of mobilenet_v1_fp32, 1/2/4/8 workers on one GPU" ;;
  anchors)                                # after prep: every runtime's loop beside batch, N images
    export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TI_SKIP_VERSION_CHECK=ON
    python3 bench/batch_scale.py run "$2" $IMAGES --backend cuda --workers 4 --batch 32 \
      --preprocess signed --runtimes ours litert litert-gpu torch torch:32 ours:32 --threads 16 \
      --work /tmp/issue17_work --out "$OUT/issue17_anchors_h200" \
      --title "H200: ${N:-2000} JPEGs of mobilenet_v1_fp32, users' loops of LiteRT CPU and GPU, PyTorch and ours beside tflite-taichi batch" ;;
  gap)                                    # after prep: lab/batch_gap.py (one worker vs a loop)
    export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TI_SKIP_VERSION_CHECK=ON
    python3 lab/batch_gap.py "$2" $IMAGES --n ${N:-3000} --backend cuda --out "$OUT/issue17_gap${SUFFIX:-}_h200.json" ;;
  *) echo "usage: $0 prep | run MODEL | gap MODEL"; exit 2 ;;
esac
