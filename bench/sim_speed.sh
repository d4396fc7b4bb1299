#!/bin/sh
# Issue 9 item 6, the host simulator keeps up: how fast the fused demo plan
# runs on the host backend, against the targets.
#   - decode: README's first command (`smelt run build/demo.plan --prompt
#     "In the beginning" --max-tokens 200 --backend host`), decode tokens/s
#                                                              (target >= 150)
#   - `smelt eval` of 2,048 held-out ids (tests/fixtures/demo/heldout_ids.bin,
#     context 256, stride 128), wall seconds                   (target <= 60)
# each run RUNS times (default 5), printed as min / median / max, with the
# process's CPU seconds beside the wall time (the machine may be shared:
# CPU seconds say what the simulator costs, wall seconds what a user waits).
# Then the simulator's own microbenchmark (bench_sim_barrier, block barriers
# and warp shuffles) for one worker.
#
#   bench/sim_speed.sh [--smelt PATH] [--runs RUNS] [--no-fuse]
#
# PATH defaults to build-release/cli/smelt, else build/cli/smelt. The plan is
# compiled into a temporary folder (with --no-fuse: one op per kernel, for
# comparison). Needs only the build and a POSIX shell with awk.
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
smelt=""
runs=5
fuse=""
while [ $# -gt 0 ]; do
    case "$1" in
    --smelt) smelt=$2; shift 2 ;;
    --runs) runs=$2; shift 2 ;;
    --no-fuse) fuse=--no-fuse; shift ;;
    -h | --help) sed -n '2,19p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "usage: bench/sim_speed.sh [--smelt PATH] [--runs RUNS] [--no-fuse]" >&2; exit 2 ;;
    esac
done
if [ -z "$smelt" ]; then
    for candidate in "$root/build-release/cli/smelt" "$root/build/cli/smelt"; do
        if [ -x "$candidate" ]; then smelt=$candidate; break; fi
    done
fi
if [ -z "$smelt" ] || [ ! -x "$smelt" ]; then
    echo "sim_speed: no smelt binary (build first, or pass --smelt PATH)" >&2
    exit 2
fi
barrier_bench=$(dirname "$(dirname "$smelt")")/bench/bench_sim_barrier
demo=$root/tests/fixtures/demo
work=$(mktemp -d "${TMPDIR:-/tmp}/sim_speed.XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM

"$smelt" compile "$root/examples/llama.smelt" --config "$demo/config.json" --weights "$demo/model.safetensors" \
    --tokenizer bytes $fuse -o "$work/demo.plan" >"$work/compile.log" 2>&1 || {
    cat "$work/compile.log" >&2
    exit 1
}

# "min / median / max" of the numbers in a file, one a line.
summary() {
    sort -g "$1" | awk '{v[NR] = $1} END {
        if (NR == 0) { print "no runs"; exit }
        m = NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2
        printf "%.2f / %.2f / %.2f", v[1], m, v[NR] }'
}

# Runs "$@" once; appends its wall and CPU seconds (user + system, children
# included) to $work/wall and $work/cpu; its output goes to $work/out.
timed() {
    start=$(date +%s.%N)
    cpu_before=$(awk '{print $14 + $15 + $16 + $17}' /proc/$$/stat)
    "$@" >"$work/out" 2>&1 || { cat "$work/out" >&2; exit 1; }
    end=$(date +%s.%N)
    cpu_after=$(awk '{print $14 + $15 + $16 + $17}' /proc/$$/stat)
    ticks=$(getconf CLK_TCK)
    echo "$start $end" | awk '{print $2 - $1}' >>"$work/wall"
    echo "$cpu_before $cpu_after $ticks" | awk '{print ($2 - $1) / $3}' >>"$work/cpu"
}

: >"$work/rate"
: >"$work/wall"
: >"$work/cpu"
i=0
while [ $i -lt "$runs" ]; do
    timed "$smelt" run "$work/demo.plan" --prompt "In the beginning" --max-tokens 200 --backend host
    # "host (N simulator workers): prefill ... decode 199 tokens in S s (R tokens/s)"
    sed -n 's/.*decode [0-9]* tokens in [0-9.]* s (\([0-9.]*\) tokens\/s).*/\1/p' "$work/out" >>"$work/rate"
    i=$((i + 1))
done
workers=$(sed -n 's/.*host (\([0-9]*\) simulator workers).*/\1/p' "$work/out")
decode=$(summary "$work/rate")
decode_cpu=$(summary "$work/cpu")
median_rate=$(sort -g "$work/rate" | awk '{v[NR] = $1} END {print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}')

: >"$work/wall"
: >"$work/cpu"
i=0
while [ $i -lt "$runs" ]; do
    timed "$smelt" eval "$work/demo.plan" --ids "$demo/heldout_ids.bin" --context 256 --stride 128 \
        --max-ids 2048 --backend host
    i=$((i + 1))
done
eval_wall=$(summary "$work/wall")
eval_cpu=$(summary "$work/cpu")
median_eval=$(sort -g "$work/wall" | awk '{v[NR] = $1} END {print NR % 2 ? v[(NR + 1) / 2] : (v[NR / 2] + v[NR / 2 + 1]) / 2}')

verdict() { awk -v a="$1" -v op="$2" -v b="$3" 'BEGIN { ok = op == ">=" ? a >= b : a <= b; print ok ? "met" : "NOT met" }'; }
echo "host simulator, demo plan${fuse:+ ($fuse)}, $workers workers, $(nproc) cores, $runs runs each (min / median / max):"
echo "  decode, 200 tokens:        $decode tokens/s   (target >= 150: $(verdict "$median_rate" ">=" 150)); CPU s per run $decode_cpu"
echo "  eval, 2,048 held-out ids:  $eval_wall s wall         (target <= 60: $(verdict "$median_eval" "<=" 60)); CPU s $eval_cpu"
if [ -x "$barrier_bench" ]; then
    echo "microbenchmark (one worker):"
    "$barrier_bench" 1 | sed 's/^/  /'
fi
