#!/bin/sh
# Issue 9's targets, read from a plan (no GPU needed): compiles the Llama-3-8B
# spec in bf16 without weights (examples/llama.smelt with
# examples/configs/llama-3-8b.json) for sm_80, sm_90 and the host, and prints
# from `smelt inspect --json` (driver/inspect.c has the model and the GPU
# peaks it uses):
#   - launches per decoder layer at decode                     (target <= 5)
#   - modeled DRAM bytes of a batch-1 decode step at context C
#     against the unavoidable bytes                            (target <= 1.05x)
#   - modeled H200 time of that step against unavoidable
#     bytes / 4.8 TB/s                                         (target <= 1.15x)
#   - modeled H200 time of an N-token prefill against its flop
#     floor (its flops, the output head's on the sampled row
#     alone) / 989 TFLOP/s                                     (target <= 1.4x)
#   - `smelt compile` wall time, cold (an empty kernel cache)
#     and warm (the same compile again)                        (<= 5 s, <= 0.5 s)
#
#   bench/decode_model.sh [--smelt PATH] [--context C] [--prefill N] [--kv-cache K]
#
# PATH defaults to build-release/cli/smelt, else build/cli/smelt; C to 1024,
# N to 512; K (the KV cache's dtype: auto, fp8) to auto. Needs jq (to read the JSON) and a CUDA toolkit with NVRTC (to
# compile for sm_80 and sm_90).
set -eu
root=$(cd "$(dirname "$0")/.." && pwd)
smelt=""
context=1024
prefill=512
kv_cache=auto
while [ $# -gt 0 ]; do
    case "$1" in
    --smelt) smelt=$2; shift 2 ;;
    --context) context=$2; shift 2 ;;
    --prefill) prefill=$2; shift 2 ;;
    --kv-cache) kv_cache=$2; shift 2 ;;
    -h | --help) sed -n '2,23p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    *) echo "usage: bench/decode_model.sh [--smelt PATH] [--context C] [--prefill N] [--kv-cache K]" >&2; exit 2 ;;
    esac
done
if [ -z "$smelt" ]; then
    for candidate in "$root/build-release/cli/smelt" "$root/build/cli/smelt"; do
        if [ -x "$candidate" ]; then smelt=$candidate; break; fi
    done
fi
if [ -z "$smelt" ] || [ ! -x "$smelt" ]; then
    echo "bench/decode_model.sh: no smelt binary (build one, or pass --smelt PATH)" >&2
    exit 2
fi
command -v jq >/dev/null 2>&1 || { echo "bench/decode_model.sh: needs jq" >&2; exit 2; }

work=$(mktemp -d "${TMPDIR:-/tmp}/smelt-bench-XXXXXX")
trap 'rm -rf "$work"' EXIT INT TERM

now() { date +%s.%N; }
compile() {
    SMELT_CACHE_DIR="$work/cache" "$smelt" compile "$root/examples/llama.smelt" \
        --config "$root/examples/configs/llama-3-8b.json" --precision bf16 \
        --kv-cache "$kv_cache" -o "$work/llama-3-8b.plan" \
        2>"$work/compile.log" || { cat "$work/compile.log" >&2; exit 1; }
}
start=$(now); compile; cold=$(echo "$start $(now)" | awk '{printf "%.2f", $2 - $1}')
start=$(now); compile; warm=$(echo "$start $(now)" | awk '{printf "%.2f", $2 - $1}')

"$smelt" inspect "$work/llama-3-8b.plan" --json --prefill "$prefill" --decode-context "$context" >"$work/model.json"
get() { jq -r "$1" "$work/model.json"; }
decode='.steps[] | select(.kind == "decode")'
prefill_step='.steps[] | select(.kind == "prefill")'

per_layer=$(get "$decode | .launches_per_layer")
per_step=$(get "$decode | .launches_per_step")
bytes=$(get "$decode | .modeled_dram_bytes")
unavoidable=$(get "$decode | .unavoidable_dram_bytes")
decode_seconds=$(get "$decode | .modeled_seconds.h200")
decode_floor=$(get "$decode | .unavoidable_seconds.h200")
prefill_seconds=$(get "$prefill_step | .modeled_seconds.h200")
prefill_floor=$(get "$prefill_step | .flop_floor_seconds.h200")
weights=$(get ".weight_bytes")

echo "Llama-3-8B, bf16, KV cache $kv_cache ($weights weight bytes), modeled by smelt inspect (H200: 4.8 TB/s, 989 TFLOP/s bf16, 1.3 us a launch)"
echo "$per_layer $per_step" | awk '{printf "  decode launches per decoder layer:        %s (%s per step; target <= 5)\n", $1, $2}'
echo "$bytes $unavoidable" | awk -v c="$context" '{printf "  decode DRAM bytes at context %-5s        %.3f GB modeled / %.3f GB unavoidable = %.3fx (target <= 1.05x)\n", c ":", $1 / 1e9, $2 / 1e9, $1 / $2}'
echo "$decode_seconds $decode_floor" | awk '{printf "  decode H200 time:                         %.3f ms modeled / %.3f ms unavoidable bytes = %.3fx (target <= 1.15x)\n", $1 * 1e3, $2 * 1e3, $1 / $2}'
echo "$prefill_seconds $prefill_floor" | awk -v n="$prefill" '{printf "  %s-token prefill H200 time:              %.3f ms modeled / %.3f ms flop floor = %.3fx (target <= 1.4x)\n", n, $1 * 1e3, $2 * 1e3, $1 / $2}'
echo "  smelt compile (sm_80, sm_90, host):       ${cold} s cold (target <= 5 s), ${warm} s warm (target <= 0.5 s)"
