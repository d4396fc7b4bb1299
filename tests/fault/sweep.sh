#!/bin/sh
# Fault-injection sweep: fails each allocation site of a small `smelt compile`
# (--target host), a small `smelt run --backend host` and `smelt ir --after
# all` (the printers) in turn, and requires
# every run to end with exit status 1 and a message on stderr: never a signal,
# an abort (134), a sanitizer report (ASan, LSan leaks, UBSan), a hang, or
# exit 0 with output that differs from an undisturbed run.
#   sweep.sh SMELT FAILMALLOC_SO WORK_DIR [EVERY]
# A counting pass with the shim (tests/fault/failmalloc.c) lists the distinct
# call sites (return addresses in smelt's own code) and counts allocations.
# Then, each in its own run: the first allocation at every site is failed,
# and the N-th allocation for N = 1, 1+EVERY, 1+2*EVERY, ... (EVERY=1: every
# allocation of the run; ctest samples, tools/faultsweep.sh runs them all).
# A run that still exits 0 must give the same tokens as an undisturbed one
# (a compile: its plan must run to them). FAULT_JOBS runs that many at once
# (default 2). Under an ASan build leak checking is on.
set -eu
smelt=$1 shim=$2 work=$3 every=${4:-1}
root=$(cd "$(dirname "$0")/../.." && pwd)
jobs=${FAULT_JOBS:-2}
limit=${FAULT_TIMEOUT:-120}
mkdir -p "$work"
rm -f "$work"/*.ir "$work"/*.sites "$work"/*.err "$work"/*.out "$work"/*.report "$work"/*.plan "$work"/*.injected "$work"/failures

# shellcheck source=environment.sh
. "$root/tests/fault/environment.sh"

compile_args="compile $root/examples/llama.smelt --config $root/tests/fixtures/llama/config.json
 --weights $root/tests/fixtures/llama/model.safetensors --target host"
run_args="--backend host --prompt-ids 1,2,3 --max-tokens 3"
ir_args="ir $root/examples/llama.smelt --config $root/tests/fixtures/llama/config.json --after all"

# Undisturbed runs give the expected plan and tokens.
# shellcheck disable=SC2086
"$smelt" $compile_args -o "$work/expected.plan" 2>"$work/expected.err"
# shellcheck disable=SC2086
"$smelt" run "$work/expected.plan" $run_args >"$work/expected.out" 2>>"$work/expected.err"
# shellcheck disable=SC2086
"$smelt" $ir_args >"$work/expected.ir" 2>>"$work/expected.err"

# Counting passes.
# shellcheck disable=SC2086
FAILMALLOC_LIST="$work/compile.sites" LD_PRELOAD="$shim" "$smelt" $compile_args -o "$work/count.plan" 2>/dev/null
# shellcheck disable=SC2086
FAILMALLOC_LIST="$work/run.sites" LD_PRELOAD="$shim" "$smelt" run "$work/expected.plan" $run_args >/dev/null 2>&1
# shellcheck disable=SC2086
FAILMALLOC_LIST="$work/ir.sites" LD_PRELOAD="$shim" "$smelt" $ir_args >/dev/null 2>&1

# One run: MODE (compile|run), KIND (site|nth) and WHICH (a site's offset,
# or N); prints a line per failure to failures.
one() {
    mode=$1 kind=$2 which=$3 name=$1-$2-$3
    report="$work/$name.report"
    rm -f "$report"
    if [ "$kind" = site ]; then select="FAILMALLOC_SITE=$which"; else select="FAILMALLOC_NTH=$which"; fi
    set +e
    if [ "$mode" = compile ]; then
        # shellcheck disable=SC2086
        env "$select" FAILMALLOC_REPORT="$report" LD_PRELOAD="$shim" \
            timeout -k 5 "$limit" "$smelt" $compile_args -o "$work/$name.plan" >"$work/$name.out" 2>"$work/$name.err"
    elif [ "$mode" = run ]; then
        # shellcheck disable=SC2086
        env "$select" FAILMALLOC_REPORT="$report" LD_PRELOAD="$shim" \
            timeout -k 5 "$limit" "$smelt" run "$work/expected.plan" $run_args >"$work/$name.out" 2>"$work/$name.err"
    else
        # shellcheck disable=SC2086
        env "$select" FAILMALLOC_REPORT="$report" LD_PRELOAD="$shim" \
            timeout -k 5 "$limit" "$smelt" $ir_args >"$work/$name.out" 2>"$work/$name.err"
    fi
    rc=$?
    set -e
    why=""
    if grep -q 'Sanitizer\|runtime error:\|internal error' "$work/$name.err"; then
        why="sanitizer report or internal error"
    elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then
        why="hang (no exit in ${limit}s)"
    elif [ $rc -eq 0 ]; then
        if [ "$mode" = compile ]; then
            # A plan may differ in bytes (a host object built afresh); it must run the same.
            # shellcheck disable=SC2086
            cmp -s "$work/$name.plan" "$work/expected.plan" ||
                { "$smelt" run "$work/$name.plan" $run_args 2>/dev/null | cmp -s - "$work/expected.out"; } ||
                why="exit 0 with a plan that runs differently"
        elif [ "$mode" = run ]; then
            cmp -s "$work/$name.out" "$work/expected.out" || why="exit 0 with different output"
        else
            cmp -s "$work/$name.out" "$work/expected.ir" || why="exit 0 with different IR"
        fi
    elif [ $rc -ne 1 ]; then
        why="exit status $rc"
    elif [ ! -s "$work/$name.err" ]; then
        why="exit 1 without a message"
    fi
    if [ -n "$why" ]; then
        where=""
        site=$(cat "$report" 2>/dev/null | cut -d' ' -f2)
        [ -n "$site" ] && where=$(addr2line -f -i -p -e "$smelt" "0x$site" 2>/dev/null | head -1 || true)
        echo "$mode $kind $which ($where): $why; stderr: $(head -c 300 "$work/$name.err" | tr '\n' ' ')" >>"$work/failures"
    else
        rm -f "$work/$name.plan" "$work/$name.out" "$work/$name.err"
    fi
    [ -s "$report" ] && echo injected >>"$work/$mode.injected"
    rm -f "$report"
    return 0
}

for mode in compile run ir; do
    allocations=0
    while read -r site count; do
        echo "$mode site $site"
        allocations=$((allocations + count))
    done <"$work/$mode.sites"
    echo "$allocations" >"$work/$mode.allocations"
    n=1
    while [ $n -le $allocations ]; do
        echo "$mode nth $n"
        n=$((n + every))
    done
done >"$work/todo"
total=$(wc -l <"$work/todo")
echo "fault sweep: compile: $(wc -l <"$work/compile.sites") sites, $(cat "$work/compile.allocations") allocations;" \
    "run: $(wc -l <"$work/run.sites") sites, $(cat "$work/run.allocations") allocations;" \
    "ir: $(wc -l <"$work/ir.sites") sites, $(cat "$work/ir.allocations") allocations;" \
    "$total runs (every site, every ${every}th allocation), $jobs at a time"

i=0
while read -r mode kind which; do
    one "$mode" "$kind" "$which" &
    i=$((i + 1))
    if [ $((i % jobs)) -eq 0 ]; then wait; fi
done <"$work/todo"
wait

injected=$(cat "$work"/*.injected 2>/dev/null | wc -l)
if [ -s "$work/failures" ]; then
    echo "fault sweep: $(wc -l <"$work/failures") of $total runs failed badly ($injected injected):"
    cat "$work/failures"
    exit 1
fi
echo "fault sweep: all $total runs exited cleanly ($injected with a failure injected)"
