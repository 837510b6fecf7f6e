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
# bytecode, as a user's `pip install` leaves it: without it every first import on the machine
# compiles the sources (the `tflite` bindings' ~190 modules alone: ~0.1 s of a first result)
python3 -m compileall -q -j 0 /tmp/site >/dev/null 2>&1
export PYTHONPATH=/tmp/site PYTHONUNBUFFERED=1 TI_SKIP_VERSION_CHECK=ON
if ! ls /usr/share/vulkan/icd.d/*.json >/dev/null 2>&1 && [ -f /usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json ]; then
  export VK_DRIVER_FILES=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
  export __EGL_VENDOR_LIBRARY_FILENAMES=/usr/local/nvidia/share/glvnd/egl_vendor.d/10_nvidia.json
fi
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
export GPU_SETUP_DONE=1
fi
