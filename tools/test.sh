#!/bin/sh
# What CI runs (.ci/run), on a fresh clone as root. In order:
#   1. Debug build in build/ (tools/setup.sh, which first installs the Debian packages)
#   2. format check: tools/format.sh --check (skipped with SMELT_SKIP_FORMAT=1)
#   3. the whole test suite in the Debug build
#   4. Release build in build-release/ (-O3 -DNDEBUG: -Werror must hold with the
#      optimiser's warnings too) and the whole test suite in it
#   5. Debug build with AddressSanitizer + UndefinedBehaviorSanitizer in
#      build-asan/, and the whole test suite in it
# Steps 4 and 5 run their tests with the Debug build's kernel cache
# (build/tests/kernel-cache), which step 3 filled.
# A failed build or test stops the run. A failed format check does not: the
# builds and tests still run, and the exit status is 1 at the end. The time of
# each part is printed as it ends and again in a summary.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
jobs=$(nproc)
summary=""
failed=0

# part NAME COMMAND...: runs COMMAND, prints and records its time.
part() {
    name=$1
    shift
    echo "== $name"
    start=$(date +%s)
    status=0
    "$@" || status=$?
    seconds=$(($(date +%s) - start))
    result=ok
    [ "$status" -eq 0 ] || result="FAILED (exit $status)"
    echo "== $name: $result, ${seconds} s"
    record "$name" "${seconds} s" "$result"
    return "$status"
}

record() { # NAME TIME RESULT: a line of the summary
    summary="$summary$(printf '  %-30s %6s  %s' "$1" "$2" "$3")
"
}

print_summary() {
    echo "== summary"
    printf '%s' "$summary"
}
trap print_summary EXIT

run_tests() { # BUILD_DIR
    ctest --test-dir "$1" --output-on-failure -j "$jobs"
}

run_sanitized_tests() { # BUILD_DIR
    env ASAN_OPTIONS=detect_leaks=1:abort_on_error=1 UBSAN_OPTIONS=print_stacktrace=1:halt_on_error=1 \
        ctest --test-dir "$1" --output-on-failure -j "$jobs"
}

part "build (Debug)" "$root/tools/setup.sh"

if [ "${SMELT_SKIP_FORMAT:-0}" = 1 ]; then
    record "format check" "" "skipped (SMELT_SKIP_FORMAT=1)"
else
    part "format check" "$root/tools/format.sh" --check || failed=1
fi

part "tests (Debug)" run_tests "$root/build"

# The later builds' tests share the Debug build's kernel cache (tests/CMakeLists.txt):
# NVRTC compiles each test kernel once per run, not once per build.
kernel_cache="-DSMELT_TEST_KERNEL_CACHE=$root/build/tests/kernel-cache"
part "build (Release)" env SMELT_BUILD_DIR="$root/build-release" SMELT_BUILD_TYPE=Release \
    SMELT_CMAKE_ARGS="$kernel_cache" "$root/tools/setup.sh"
part "tests (Release)" run_tests "$root/build-release"

part "build (Debug, ASan + UBSan)" env SMELT_BUILD_DIR="$root/build-asan" SMELT_CMAKE_ARGS="-DSMELT_SANITIZE=ON $kernel_cache" \
    "$root/tools/setup.sh"
part "tests (Debug, ASan + UBSan)" run_sanitized_tests "$root/build-asan"

[ "$failed" -eq 0 ] || echo "tools/test.sh: everything built and passed except the format check (tools/format.sh)"
exit "$failed"
