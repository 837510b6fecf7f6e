#!/bin/bash
# The GPU machine's run of the taichi-forge build (issue 28, item 5; bench/results/forge_starts.md):
# carries .forge/ (taichi-forge 0.7.0 and its runtime for Python 3.12, slimmed: no hardware
# providers, no AMDGPU/OpenCL bitcode; with the tflite and flatbuffers wheels), .models, .gl.
#   bash lab/gpu_forge.sh MODELS...   # start_times on cuda with TFLITE_TAICHI_TAICHI=forge (1 cold,
#                                       # 3 warm), then each model's outputs against the reference path
set -u
mkdir -p /tmp/forge /tmp/extra
[ -f /tmp/forge/.done ] || { tar -xJf .forge/forge312.tar.xz -C /tmp/forge && touch /tmp/forge/.done; } || exit 1
python3 -m pip install -q --no-index --no-deps --target /tmp/extra .forge/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --upgrade --target /tmp/extra . || exit 1
export PYTHONPATH=/tmp/forge:/tmp/extra TI_SKIP_VERSION_CHECK=ON PYTHONUNBUFFERED=1 TFLITE_TAICHI_TAICHI=forge
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 bench/start_times.py "$@" --runners cuda --variant forge= --warm 3 --steps 30 \
  --json "$OUT/forge_starts_$(date +%s).json" 2>&1
for m in "$@"; do python3 - "$m" <<'PY'
import sys, numpy as np
from tflite_taichi import Interpreter
from tflite_taichi.runtime import cache, capi
model = sys.argv[1]
ours, ref = Interpreter(model_path=model, backend="cuda"), Interpreter(model_path=model, backend="reference")
ours.allocate_tensors(); ref.allocate_tensors()
rng = np.random.default_rng(0)
for d in ours.get_input_details():
    x = rng.random(d["shape"], dtype=np.float32).astype(d["dtype"])
    ours.set_tensor(d["index"], x); ref.set_tensor(d["index"], x)
ours.invoke(); ref.invoke()
def scale(b):   # the output's range; a one-element output (a score) has none: its magnitude
    return max(float(np.ptp(b)), float(np.abs(b).max()), 1e-6)
worst = max(float(np.abs(ours.get_tensor(o["index"]) - ref.get_tensor(o["index"])).max())
            / scale(ref.get_tensor(o["index"])) for o in ours.get_output_details())
print(model.split("/")[-1], "cuda (forge) vs reference: worst |diff| / output scale", f"{worst:.2e}",
      ours.summary()["cache"]["state"], cache.taichi_version(), capi.library_path().split("/")[-1])
PY
done
