#!/bin/sh
# Copies the shared libraries that smelt's binaries need and a machine with
# only the CUDA driver lacks (jansson, xxhash, OpenBLAS and its runtime,
# NVRTC) into BUILD_DIR/gpu-libs, so that BUILD_DIR can be carried there.
set -eu
build=${1:-build}
mkdir -p "$build/gpu-libs"
for binary in "$build/cli/smelt" "$build/tests/check_fixture" "$build/examples/generate"; do
    ldd "$binary" | awk '/=> \// { print $3 }'
done | sort -u | grep -E 'jansson|xxhash|openblas|gfortran|quadmath|nvrtc' | while read -r lib; do
    cp -L "$lib" "$build/gpu-libs/"
done
du -sh "$build/gpu-libs"
