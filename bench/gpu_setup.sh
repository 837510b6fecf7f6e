# Sourced by the GPU machine's scripts: installs the GL/Vulkan loaders and the slim taichi that
# ../shared/tools/device-prep put in .gl/ and .whl/, then this package, under /tmp/site.
if [ -z "${GPU_SETUP_DONE:-}" ]; then
for f in .gl/*.deb; do dpkg -x "$f" /; done; ldconfig
# every tarball device-prep made: taichi (slim), with --capi Taichi's C API, with --litert LiteRT
# (WHL: another folder of them, e.g. without LiteRT, where a big model must travel too)
WHL=${WHL:-.whl}
mkdir -p /tmp/site && for t in $WHL/*.tar.xz; do tar -xJf "$t" -C /tmp/site || exit 1; done \
  && python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site $WHL/*.whl \
  && python3 -m pip install -q --no-index --no-deps --no-build-isolation --upgrade --target /tmp/site . || exit 1
# Taichi's C API, or every GPU number measures Taichi's Python runtime instead (device-prep drops
# the C API unless asked: the H200 runs at e679e99 measured that runtime unawares,
# bench/results/auto_h100.md)
if [ ! -f /tmp/site/taichi/_lib/c_api/lib/libtaichi_c_api.so ] && [ -z "${ALLOW_NO_CAPI:-}" ]; then
  echo "gpu_setup: no Taichi C API among $WHL's tarballs: run ../shared/tools/device-prep --capi" \
       "(ALLOW_NO_CAPI=1 measures Taichi's Python runtime on purpose)" >&2
  return 1 2>/dev/null || exit 1
fi
# bytecode, as a user's `pip install` leaves it: without it a machine's first import of each
# module compiles its source, and the first first-result measured pays for it
python3 -m compileall -q -j 0 /tmp/site >/dev/null 2>&1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TI_SKIP_VERSION_CHECK=ON
if ! ls /usr/share/vulkan/icd.d/*.json >/dev/null 2>&1 && [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
export GPU_SETUP_DONE=1
fi
