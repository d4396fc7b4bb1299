#!/bin/sh
# Fault-injection sweep: fails each allocation site of a small `smelt compile`
# (--target host) and a small `smelt run --backend host` in turn, and requires
# every run to end with exit status 1 and a message on stderr: never a signal,
# an abort (134), a sanitizer report (ASan, LSan leaks, UBSan), a hang, or
# exit 0 with output that differs from an undisturbed run.
#   sweep.sh SMELT FAILMALLOC_SO WORK_DIR [EVERY]
# A counting pass with the shim (tests/fault/failmalloc.c) lists the distinct
# call sites (return addresses in smelt's own code); then each site's first
# allocation is failed in its own run. EVERY=K tests only every K-th site
# (ctest's sample; tools/faultsweep.sh runs them all). FAULT_JOBS runs that
# many at once (default 2). Under an ASan build leak checking is on.
set -eu
smelt=$1 shim=$2 work=$3 every=${4:-1}
root=$(cd "$(dirname "$0")/../.." && pwd)
jobs=${FAULT_JOBS:-2}
limit=${FAULT_TIMEOUT:-120}
mkdir -p "$work"
rm -f "$work"/*.sites "$work"/*.err "$work"/*.out "$work"/*.report "$work"/*.plan "$work"/*.injected "$work"/failures

# Sanitizer reports get exit statuses of their own, never 1.
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}:verify_asan_link_order=0:exitcode=86:abort_on_error=0
LSAN_OPTIONS=exitcode=87
UBSAN_OPTIONS=exitcode=88:halt_on_error=1:print_stacktrace=1
export ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS
export SMELT_CACHE_DIR="$work/kernel-cache"
FAILMALLOC_EXE=$smelt
export FAILMALLOC_EXE

compile_args="compile $root/examples/llama.smelt --config $root/tests/fixtures/llama/config.json
 --weights $root/tests/fixtures/llama/model.safetensors --target host"
run_args="--backend host --prompt-ids 1,2,3 --max-tokens 3"

# Undisturbed runs give the expected plan and tokens.
# shellcheck disable=SC2086
"$smelt" $compile_args -o "$work/expected.plan" 2>"$work/expected.err"
# shellcheck disable=SC2086
"$smelt" run "$work/expected.plan" $run_args >"$work/expected.out" 2>>"$work/expected.err"

# Counting passes.
# shellcheck disable=SC2086
FAILMALLOC_LIST="$work/compile.sites" LD_PRELOAD="$shim" "$smelt" $compile_args -o "$work/count.plan" 2>/dev/null
# shellcheck disable=SC2086
FAILMALLOC_LIST="$work/run.sites" LD_PRELOAD="$shim" "$smelt" run "$work/expected.plan" $run_args >/dev/null 2>&1

# One run: MODE (compile|run) and SITE; prints a line per failure to failures.
one() {
    mode=$1 site=$2 name=$1-$2
    report="$work/$name.report"
    rm -f "$report"
    set +e
    if [ "$mode" = compile ]; then
        # shellcheck disable=SC2086
        FAILMALLOC_SITE=$site FAILMALLOC_REPORT="$report" LD_PRELOAD="$shim" \
            timeout -k 5 "$limit" "$smelt" $compile_args -o "$work/$name.plan" >"$work/$name.out" 2>"$work/$name.err"
    else
        # shellcheck disable=SC2086
        FAILMALLOC_SITE=$site FAILMALLOC_REPORT="$report" LD_PRELOAD="$shim" \
            timeout -k 5 "$limit" "$smelt" run "$work/expected.plan" $run_args >"$work/$name.out" 2>"$work/$name.err"
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
            cmp -s "$work/$name.plan" "$work/expected.plan" || why="exit 0 with a different plan"
        else
            cmp -s "$work/$name.out" "$work/expected.out" || why="exit 0 with different output"
        fi
    elif [ $rc -ne 1 ]; then
        why="exit status $rc"
    elif [ ! -s "$work/$name.err" ]; then
        why="exit 1 without a message"
    fi
    if [ -n "$why" ]; then
        where=$(addr2line -f -i -p -e "$smelt" "0x$site" 2>/dev/null | head -1 || true)
        echo "$mode site $site ($where): $why; stderr: $(head -c 300 "$work/$name.err" | tr '\n' ' ')" >>"$work/failures"
    else
        rm -f "$work/$name.plan" "$work/$name.out" "$work/$name.err"
    fi
    [ -s "$report" ] && echo injected >>"$work/$mode.injected"
    rm -f "$report"
    return 0
}

for mode in compile run; do
    n=0
    while read -r site count; do
        n=$((n + 1))
        [ $(((n - 1) % every)) -eq 0 ] || continue
        echo "$mode $site"
    done <"$work/$mode.sites"
done >"$work/todo"
total=$(wc -l <"$work/todo")
sites_compile=$(wc -l <"$work/compile.sites")
sites_run=$(wc -l <"$work/run.sites")
echo "fault sweep: $sites_compile compile sites, $sites_run run sites; testing $total (every $every), $jobs at a time"

i=0
while read -r mode site; do
    one "$mode" "$site" &
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
