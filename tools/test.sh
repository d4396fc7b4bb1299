#!/bin/sh
# Runs the whole test suite twice: in the Debug build (build/) and in the
# Debug build with AddressSanitizer + UndefinedBehaviorSanitizer (build-asan/).
# Both are configured and built first (tools/setup.sh).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
jobs=$(nproc)

"$root/tools/setup.sh"
echo "== tests (Debug)"
ctest --test-dir "$root/build" --output-on-failure -j "$jobs"

SMELT_BUILD_DIR="$root/build-asan" SMELT_CMAKE_ARGS="-DSMELT_SANITIZE=ON" "$root/tools/setup.sh"
echo "== tests (Debug, ASan + UBSan)"
ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
    ctest --test-dir "$root/build-asan" --output-on-failure -j "$jobs"
