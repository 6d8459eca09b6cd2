#!/usr/bin/env bash
# Pack triton 3.9 (cp312 wheel) small enough for the device tool's 64 MiB carry:
# libtriton.so without debug info, xz'd (488 MB -> 41 MB), and the Python tree without the AMD
# backend, cupti, proton and the bundled binaries (2 MB). Output in .whl/ (git-ignored).
set -euo pipefail
W=$(mktemp -d); trap 'rm -rf "$W"' EXIT
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 -d "$W" triton==3.9.0
(cd "$W" && unzip -q ./*.whl 'triton/*')
strip --strip-debug "$W/triton/_C/libtriton.so"
mkdir -p .whl && xz -9e -T2 -c "$W/triton/_C/libtriton.so" > .whl/libtriton39.so.xz
rm -rf "$W/triton/_C/libtriton.so" "$W/triton/_C/libproton.so" "$W/triton/backends/amd/lib" \
  "$W"/triton/backends/nvidia/lib/cupti* "$W"/triton/backends/nvidia/bin/* "$W/triton/instrumentation"
tar cJf .whl/triton39py.tar.xz -C "$W" triton
ls -la .whl
