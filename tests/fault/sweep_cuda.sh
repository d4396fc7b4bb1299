#!/bin/sh
# Fault-injection sweep of the CUDA compile path: a small `smelt compile
# --target sm_80 --no-cache` (NVRTC really runs), failing in turn the first
# allocation at each call site that lies in codegen/nvrtc.c or
# codegen/compile_pool.c, and requiring every run to end with exit status 1
# and "out of memory" on stderr: never a signal, an abort, a sanitizer report
# (under ASan: a leak), a hang or another message.
#   sweep_cuda.sh SMELT FAILMALLOC_SO WORK_DIR
# Sites are the shim's offsets into the smelt executable (tests/fault/
# failmalloc.c); addr2line maps each (the call, one byte before the return
# address) to its source file, the innermost inlined one (the two files'
# allocation helpers are always inlined, so each caller is a site). Slow-ish
# (NVRTC runs every time), so it is tools/faultsweep.sh --cuda, not a ctest
# entry. FAULT_JOBS runs that many at once (default 2); FAULT_FILES replaces
# the list of source files.
set -eu
smelt=$1 shim=$2 work=$3
root=$(cd "$(dirname "$0")/../.." && pwd)
jobs=${FAULT_JOBS:-2}
limit=${FAULT_TIMEOUT:-300}
files=${FAULT_FILES:-codegen/nvrtc.c codegen/compile_pool.c}
mkdir -p "$work"
rm -f "$work"/*.sites "$work"/*.err "$work"/*.plan "$work"/*.report "$work"/failures "$work"/passed

# shellcheck source=environment.sh
. "$root/tests/fault/environment.sh"

compile_args="compile $root/examples/llama.smelt --config $root/tests/fixtures/llama/config.json
 --weights $root/tests/fixtures/llama/model.safetensors --target sm_80 --no-cache"

# An undisturbed run must succeed (and, under ASan, be clean).
# shellcheck disable=SC2086
"$smelt" $compile_args -o "$work/expected.plan" 2>"$work/expected.err" || {
    echo "fault sweep --cuda: the undisturbed compile failed:"
    cat "$work/expected.err"
    exit 1
}
# Counting pass: every call site of smelt's own code.
# shellcheck disable=SC2086
FAILMALLOC_LIST="$work/all.sites" LD_PRELOAD="$shim" "$smelt" $compile_args -o "$work/count.plan" 2>/dev/null

# Keep the sites whose call lies in one of $files: "OFFSET COUNT FILE:LINE".
while read -r site count; do
    call=$(printf '%x' $((0x$site - 1)))
    where=$(addr2line -i -e "$smelt" "0x$call" 2>/dev/null | head -1 | cut -d' ' -f1)
    for f in $files; do
        case "$where" in
        */"$f":*) echo "$site $count $(basename "$where")" ;;
        esac
    done
done <"$work/all.sites" >"$work/selected.sites"

one() {
    site=$1 where=$2 name=site-$1
    set +e
    # shellcheck disable=SC2086
    env FAILMALLOC_SITE="$site" FAILMALLOC_REPORT="$work/$name.report" LD_PRELOAD="$shim" \
        timeout -k 5 "$limit" "$smelt" $compile_args -o "$work/$name.plan" >/dev/null 2>"$work/$name.err"
    rc=$?
    set -e
    why=""
    if [ ! -s "$work/$name.report" ]; then
        why="no failure injected"
    elif grep -q 'Sanitizer\|runtime error:\|internal error' "$work/$name.err"; then
        why="sanitizer report or internal error"
    elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        why="hang (no exit in ${limit}s)"
    elif [ $rc -ne 1 ]; then
        why="exit status $rc"
    elif ! grep -q 'out of memory' "$work/$name.err"; then
        why="exit 1 without \"out of memory\""
    fi
    if [ -n "$why" ]; then
        echo "site $site ($where): $why; stderr: $(head -c 300 "$work/$name.err" | tr '\n' ' ')" >>"$work/failures"
    else
        echo "site $site ($where): $(grep -m1 'out of memory' "$work/$name.err")" >>"$work/passed"
        rm -f "$work/$name.plan" "$work/$name.err"
    fi
    rm -f "$work/$name.report"
}

total=$(wc -l <"$work/selected.sites")
echo "fault sweep --cuda: $(wc -l <"$work/all.sites") sites in all, $total in $files; $jobs runs at a time"
if [ "$total" -eq 0 ]; then
    echo "fault sweep --cuda: no call site found in $files (is $smelt built with debug info?)"
    exit 1
fi
i=0
while read -r site count where; do
    one "$site" "$where" &
    i=$((i + 1))
    if [ $((i % jobs)) -eq 0 ]; then wait; fi
done <"$work/selected.sites"
wait

if [ -s "$work/failures" ]; then
    echo "fault sweep --cuda: $(wc -l <"$work/failures") of $total sites failed badly:"
    cat "$work/failures"
    exit 1
fi
sort -t: -k1,1 "$work/passed"
echo "fault sweep --cuda: all $total sites exited with status 1 and \"out of memory\""
