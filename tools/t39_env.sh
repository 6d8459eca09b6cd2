# Source this on the device to run under triton 3.9 instead of the image's 3.6.
# The stripped libtriton (.whl/libtriton39.so.xz, 41 MB) and the Python tree without the AMD
# backend, cupti and the bundled binaries (.whl/triton39py.tar.xz) are made by
# tools/pack_triton39.sh; carry `.whl`. ptxas comes from the image (CUDA 13.0), since the
# 3.9 wheel's own (34 / 51 MB) do not fit the carry beside libtriton.
T39=${T39:-/tmp/t39}
if [ ! -f "$T39/triton/_C/libtriton.so" ]; then
  mkdir -p "$T39" && tar xJf .whl/triton39py.tar.xz -C "$T39" \
    && xz -dc .whl/libtriton39.so.xz > "$T39/triton/_C/libtriton.so" || return 1
fi
# triton 3.9 compiles sm_90 with its "ptxas-blackwell" (CUDA 13): take the image's CUDA 13.0 one.
PTX=$(command -v ptxas || ls /usr/local/cuda/bin/ptxas 2>/dev/null || python3 -c "import triton, os; \
print(os.path.join(os.path.dirname(triton.__file__), 'backends/nvidia/bin/ptxas'))")
export TRITON_PTXAS_PATH=${TRITON_PTXAS_PATH:-$PTX} TRITON_PTXAS_BLACKWELL_PATH=${TRITON_PTXAS_BLACKWELL_PATH:-$PTX}
export TRITON_DEFAULT_FP_FUSION=${TRITON_DEFAULT_FP_FUSION:-1}
export PYTHONPATH="$T39:$PWD"
