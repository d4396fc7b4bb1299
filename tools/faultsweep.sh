#!/bin/sh
# The fault-injection sweep (tests/fault/sweep.sh) on an ASan build with leak
# checking: every allocation site and every allocation of a small `smelt
# compile --target host`, `smelt run --backend host` and `smelt ir` failed in turn, each
# run required to end with exit status 1 and a message (no signal, abort,
# sanitizer report, leak or hang). ctest runs the same as fault/sweep.
#   tools/faultsweep.sh [EVERY]     EVERY=K: only every K-th allocation
#   tools/faultsweep.sh --cuda      instead: every allocation site in
#       codegen/nvrtc.c and codegen/compile_pool.c during a `smelt compile
#       --target sm_80 --no-cache` (tests/fault/sweep_cuda.sh; needs NVRTC,
#       no GPU; NVRTC runs each time)
# SMELT_BUILD_DIR (default build-asan) is configured with -DSMELT_SANITIZE=ON.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
build=${SMELT_BUILD_DIR:-$root/build-asan}
SMELT_BUILD_DIR=$build SMELT_CMAKE_ARGS="-DSMELT_SANITIZE=ON ${SMELT_CMAKE_ARGS:-}" "$root/tools/setup.sh"
if [ "${1:-}" = --cuda ]; then
    ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} \
        exec "$root/tests/fault/sweep_cuda.sh" "$build/cli/smelt" "$build/tests/failmalloc.so" "$build/tests/fault-sweep-cuda"
fi
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} \
    exec "$root/tests/fault/sweep.sh" "$build/cli/smelt" "$build/tests/failmalloc.so" "$build/tests/fault-sweep" "${1:-1}"
