#!/bin/bash
# The GPU machine's runs for issue 28 (start in a second): bench/results/start_times.md.
# Carries .whl (device-prep --capi --litert), .gl and the models folder named below; writes under $OUT.
#   bash lab/gpu_starts.sh starts MODELS...   # start_times.py: cuda, vulkan, opengl (before: Taichi's
#                                                # frontend unpatched, compiled in the process; now),
#                                                # LiteRT CPU and GPU, cold and warm, fresh processes
#   bash lab/gpu_starts.sh answer MODELS...   # Interpreter(answer_while_compiling=True): first result
#                                                # and first delegated step, cuda, vulkan, opengl
#   bash lab/gpu_starts.sh chunks MODELS...   # now, with 8 steps per kernel (more modules to compile
#                                                # in parallel) against 32: start and step, cuda + vulkan
#   bash lab/gpu_starts.sh zoo NAMES...       # the zoo's models (built there): now, cuda, vulkan, opengl, LiteRT
#                                                # (RUNNERS=a,b  TIMEOUT=s per process  VARIANT=NAME=VAR=V: one more)
#   BEFORE=.base28 bash lab/gpu_starts.sh import   # import_time.py: import tflite_taichi now and
#                                                # in BEFORE (a copy of an older commit's package folders)
#   BEFORE=.base28 bash lab/gpu_starts.sh ab MODELS...  # starts of BEFORE's package against now's,
#                                                # cuda, vulkan, opengl, 3 warm processes per cold one
#   bash lab/gpu_starts.sh llvmwarm MODELS...  # cuda's warm start: modules from the workers (now),
#                                                # from one in-process compile, and 8 steps per kernel
set -u
source bench/gpu_setup.sh
[ -f /tmp/site/.compiled ] || { python3 -m compileall -q -j 16 /tmp/site >/dev/null 2>&1; touch /tmp/site/.compiled; }
nproc; python3 -c "import platform, numpy; print(platform.python_version(), 'numpy', numpy.__version__)"
before="before=TFLITE_TAICHI_FRONTEND_PATCH=0,TFLITE_TAICHI_COMPILE_WORKERS=0"
what=${1:-starts}; shift || true
case "$what" in
  starts)
    python3 bench/start_times.py "$@" --runners cuda,vulkan,opengl,litert_cpu,litert_gpu \
      --variant "$before" --variant now= --steps 30 --json "$OUT/starts_$(date +%s).json" 2>&1 ;;
  answer)
    python3 bench/start_times.py "$@" --runners cuda+answer,vulkan+answer,opengl+answer --variant now= \
      --steps 30 --json "$OUT/answer_$(date +%s).json" 2>&1 ;;
  chunks)
    python3 bench/start_times.py "$@" --runners cuda,vulkan --variant now= \
      --variant chunks8=TFLITE_TAICHI_CHUNK_STEPS=8 --steps 100 --json "$OUT/chunks_$(date +%s).json" 2>&1 ;;
  import)
    python3 bench/import_time.py --runs 15 ${BEFORE:+--before "$BEFORE"} --json "$OUT/import_$(date +%s).json" 2>&1 ;;
  ab)
    python3 bench/start_times.py "$@" --runners cuda,vulkan,opengl --variant "before=PYTHONPATH=$PWD/$BEFORE:/tmp/site" \
      --variant now= --warm 3 --steps 30 --json "$OUT/ab_$(date +%s).json" 2>&1 ;;
  llvmwarm)
    python3 bench/start_times.py "$@" --runners cuda --variant now= --variant inproc=TFLITE_TAICHI_COMPILE_WORKERS=0 \
      --variant chunks8=TFLITE_TAICHI_CHUNK_STEPS=8 --warm 3 --steps 30 --json "$OUT/llvmwarm_$(date +%s).json" 2>&1 ;;
  zoo)
    mkdir -p /tmp/zoo
    for name in "$@"; do python3 -c "
import sys; from tflite_taichi import zoo
open('/tmp/zoo/$name.tflite', 'wb').write(zoo.build('$name'))" || exit 1; done
    python3 bench/start_times.py $(for n in "$@"; do echo /tmp/zoo/$n.tflite; done) \
      --runners "${RUNNERS:-cuda,vulkan,opengl,litert_cpu,litert_gpu}" --variant now= ${VARIANT:+--variant "$VARIANT"} \
      --steps 30 --timeout "${TIMEOUT:-300}" --json "$OUT/zoo_$(date +%s).json" 2>&1 ;;
esac
