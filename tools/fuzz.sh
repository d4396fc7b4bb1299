#!/bin/sh
# Runs one libFuzzer harness of tests/fuzz for a while (docs/fuzzing.md).
#
#   tools/fuzz.sh HARNESS SECONDS [LIBFUZZER_FLAG...]
#
# HARNESS is dsl, json, ir_text, safetensors, plan or gguf. Configures and builds the
# fuzz build when needed (CC=clang cmake -S . -B build-fuzz -DSMELT_FUZZ=ON;
# SMELT_FUZZ_BUILD_DIR overrides the folder), then fuzzes for SECONDS:
#   - the committed seeds, tests/fuzz/corpus/HARNESS/, are read-only input;
#   - new units go to BUILD/corpus/HARNESS/ (kept between runs);
#   - a crash, leak, timeout or out-of-memory input is written to
#     BUILD/findings/HARNESS/ and the script exits 1.
# At the end it prints executions and coverage (libFuzzer's cov: and ft:);
# the whole log is BUILD/logs/HARNESS.log. Run one at a time on a shared
# machine: each takes a core.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
build=${SMELT_FUZZ_BUILD_DIR:-$root/build-fuzz}

if [ $# -lt 2 ]; then
    sed -n '2,15p' "$0" | sed 's/^# \{0,1\}//' >&2
    exit 2
fi
harness=$1
seconds=$2
shift 2
case "$harness" in
dsl | json | ir_text | safetensors | plan | gguf) ;;
*) echo "tools/fuzz.sh: no harness '$harness' (dsl, json, ir_text, safetensors, plan, gguf)" >&2; exit 2 ;;
esac

if [ ! -f "$build/CMakeCache.txt" ]; then
    CC=${CC:-clang} cmake -S "$root" -B "$build" -DSMELT_FUZZ=ON >/dev/null
fi
cmake --build "$build" -j 2 --target "fuzz_$harness" >/dev/null

# Seeds beyond the committed corpus: the same inputs ctest replays.
seeds="$root/tests/fuzz/corpus/$harness"
case "$harness" in
dsl) seeds="$seeds $root/examples" ;;
json) seeds="$seeds $root/tests/diag/Inputs" ;;
ir_text) seeds="$seeds $root/tests/ir" ;;
gguf) seeds="$seeds $root/tests/corpus/gguf" ;;
esac

output="$build/corpus/$harness"
findings="$build/findings/$harness"
artifacts="$build/artifacts/$harness"
log="$build/logs/$harness.log"
mkdir -p "$output" "$findings" "$artifacts" "$build/logs"
rm -f "$artifacts"/*

# libFuzzer writes new units only into the first corpus folder: the output.
status=0
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1} \
    "$build/tests/fuzz_$harness" -max_total_time="$seconds" -timeout=10 -rss_limit_mb=2048 \
    -print_final_stats=1 -artifact_prefix="$artifacts/" "$@" "$output" $seeds >"$log" 2>&1 || status=$?

# The last status line (#N ... cov: C ft: F corp: U/S ...) and the final stats.
last=$(grep -E '^#[0-9]+.*cov: ' "$log" | tail -n 1 || true)
executions=$(sed -n 's/^stat::number_of_executed_units: *//p' "$log" | tail -n 1)
[ -n "$executions" ] || executions=$(printf '%s\n' "$last" | sed -n 's/^#\([0-9]*\).*/\1/p')
cov=$(printf '%s\n' "$last" | sed -n 's/.* cov: \([0-9]*\).*/\1/p')
ft=$(printf '%s\n' "$last" | sed -n 's/.* ft: \([0-9]*\).*/\1/p')
units=$(find "$output" -type f | wc -l)
echo "fuzz $harness: ${executions:-?} executions in $seconds s, cov: ${cov:-?} ft: ${ft:-?}, output corpus: $units units ($output)"

found=0
for f in "$artifacts"/*; do
    [ -f "$f" ] || continue
    cp "$f" "$findings/"
    echo "fuzz $harness: finding $findings/$(basename "$f")"
    found=1
done
if [ "$found" -ne 0 ] || [ "$status" -ne 0 ]; then
    grep -E 'ERROR: |SUMMARY: |==[0-9]+==' "$log" | head -n 5 || true
    echo "fuzz $harness: FAILED (exit $status); log in $log" >&2
    exit 1
fi
