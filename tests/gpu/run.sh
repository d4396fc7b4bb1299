#!/bin/sh
# GPU checks: the end-to-end fixture tests on the cuda backend, generate.c on
# the GPU, the kernel lab (bench/kernel_lab.c --quick: the first shape of
# every kernel family against the reference on the host simulator — ctest
# runs the same, and the whole host sweep is ctest's business — then the
# GPU shapes timed against the copy bandwidth and bf16 mma rate it measures,
# with the cost of an empty launch and of a graph node; the dequantize-GEMMs
# at Llama-3-8B's prefill shapes and the rope table are also checked on the
# GPU, at one shape each for the GEMMs), and Llama-3-8B-shaped plans with
# random weights: decode at contexts 128, 1024 and 8160 (+32 tokens: the
# 8192 the KV cache holds) and prefills of 512 and 2048 tokens, each as a fraction of the
# measured copy bandwidth (decode: unavoidable bytes per token / time) or
# tensor rate (prefill: flops / time), fused and, where `smelt compile` has
# --no-fuse, unfused. One command, inside 10 minutes on an H200 (the lent
# machine has 15 minutes of device time in all, its start included, so keep
# additions to a few shapes and iterations): a step that would start past
# LIMIT seconds (default 540) is skipped and counted.
# Exits 77 (skipped, for ctest) where there is no GPU.
#
#   tests/gpu/run.sh [BUILD_DIR]
#
# On a machine without our Debian packages (the lent GPU machine), build here
# and carry BUILD_DIR with the shared libraries its binaries need:
#   tests/gpu/prepare.sh build     # copies them into build/gpu-libs and
#                                  # compiles the 8B plans into build/gpu-plans
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "tests/gpu/run.sh: no GPU here: skipping"
    exit 77
fi
[ -d "$build/gpu-libs" ] && export LD_LIBRARY_PATH="$build/gpu-libs:${LD_LIBRARY_PATH:-}"
# The machine's own NVRTC and cuBLASLt (dlopen()ed by name: libnvrtc.so.13,
# libcublasLt.so.13), which prepare.sh does not carry.
cuda_libraries=${CUDA_HOME:-/usr/local/cuda}/lib64
[ -d "$cuda_libraries" ] && export LD_LIBRARY_PATH="${LD_LIBRARY_PATH:+$LD_LIBRARY_PATH:}$cuda_libraries"
export SMELT_CACHE_DIR="${SMELT_CACHE_DIR:-$build/kernel-cache}"
smelt=$build/cli/smelt check=$build/tests/check_fixture generate=$build/examples/generate
lab=$build/bench/bench_kernel_lab
limit=${LIMIT:-540}
started=$(date +%s)
# in_time WHAT: whether there is time left to start WHAT (else counts it as a failure)
in_time() {
    if [ $(($(date +%s) - started)) -lt "$limit" ]; then return 0; fi
    echo "SKIPPED (out of time): $1"
    failures=$((failures + 1))
    return 1
}
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
nvidia-smi -L
failures=0

echo "== fixtures on cuda (f32 within 1e-4, bf16 within 2e-2 of the logit range; same greedy tokens)"
for entry in llama:llama qwen2:llama mixtral:mixtral gpt2:gpt2; do
    name=${entry%%:*} model=$root/examples/${entry##*:}.smelt fixture=$root/tests/fixtures/${entry%%:*}
    for setting in f32:1e-4 bf16:2e-2; do
        precision=${setting%%:*} tolerance=${setting##*:}
        if ! "$root/tests/reference/run_fixture.sh" "$smelt" "$check" "$model" "$fixture" "$work" cuda \
                "$precision" "$tolerance"; then
            echo "FAIL: $name $precision on cuda"
            failures=$((failures + 1))
        fi
    done
done

echo "== generate.c on cuda"
"$smelt" compile "$root/examples/llama.smelt" --config "$root/tests/fixtures/llama/config.json" \
    --weights "$root/tests/fixtures/llama/model.safetensors" --target sm_80,sm_90 --precision f32 \
    -o "$work/llama.plan" && "$generate" "$work/llama.plan" "$(cat "$root/tests/fixtures/llama/prompt.txt")" 8 ||
    failures=$((failures + 1))

echo "== kernel lab: first shapes against the reference on the host, then timed (and some checked) on the GPU (bf16)"
copy_gbps="" mma_tflops=""
if [ -x "$lab" ] && in_time "kernel lab"; then
    timeout 180 "$lab" --gpu --quick >"$work/lab.txt" 2>&1 || { echo "FAIL: kernel lab"; failures=$((failures + 1)); }
    grep -v '^  sm_' "$work/lab.txt" | grep -E '^(gpu|  host|  check:|ERROR|\[  (FAILED|SKIPPED|PASSED))|note:' || true
    copy_gbps=$(awk '$1 == "gpu" && $2 == "d2d_copy_bandwidth_GBps" { print $3 }' "$work/lab.txt")
    mma_tflops=$(awk '$1 == "gpu" && $2 == "gemm_mma_bf16_TFLOPs" { print $3 }' "$work/lab.txt")
fi
echo "measured: device-to-device copy ${copy_gbps:-?} GB/s, bf16 mma ${mma_tflops:-?} TFLOP/s"

echo "== Llama-3-8B-shaped plans, random bf16 weights (2048 tokens a step)"
variants=fused
"$smelt" compile --help 2>&1 | grep -q -- --no-fuse && variants="fused nofuse"
mkdir -p "$work/plans"
for variant in $variants; do
    plan=$build/gpu-plans/llama-3-8b-$variant.plan model=$build/gpu-plans/llama-3-8b-$variant.model
    if [ ! -f "$plan" ]; then # not prepared: compile here (needs NVRTC)
        plan=$work/plans/llama-3-8b-$variant.plan model=$work/plans/llama-3-8b-$variant.model
        flag=""
        [ "$variant" = nofuse ] && flag=--no-fuse
        # shellcheck disable=SC2086 # $flag is empty or one word
        "$smelt" compile "$root/examples/llama.smelt" --config "$root/examples/configs/llama-3-8b.json" \
            --target sm_80,sm_90 --precision bf16 --max-step-tokens 2048 $flag -o "$plan" ||
            { echo "FAIL: compile the $variant 8B plan"; failures=$((failures + 1)); continue; }
        command -v jq >/dev/null 2>&1 &&
            "$smelt" inspect "$plan" --json --prefill 512,2048 --decode-context 128,1024,8160 |
            jq -r '.steps[] | "\(.kind) \(.tokens) \(.context) \(.unavoidable_dram_bytes) \(.flops)"' >"$model"
    fi
    # decode at context C: a prompt of C ids, then 32 tokens; prefill N: a prompt of N ids, one token.
    for step in decode:128 decode:1024 decode:8160 prefill:512 prefill:2048; do
        kind=${step%%:*} size=${step##*:}
        in_time "$variant $kind $size" || continue
        tokens=32
        [ "$kind" = prefill ] && tokens=1
        if ! timeout 120 "$smelt" run "$plan" --backend cuda --random-weights 1 --prompt-ids "$(seq -s, 1 "$size")" \
                --max-tokens "$tokens" >/dev/null 2>"$work/run.txt"; then
            echo "FAIL: $variant $kind $size"; cat "$work/run.txt"; failures=$((failures + 1)); continue
        fi
        # "...: prefill N tokens in S s (R tokens/s), decode M tokens in S s (R tokens/s)"
        seconds=$(sed -n 's/.*prefill [0-9]* tokens in \([0-9.]*\) s.*decode \([0-9]*\) tokens in \([0-9.]*\) s.*/\1 \2 \3/p' "$work/run.txt")
        figures=""
        [ -f "$model" ] && figures=$(awk -v k="$kind" -v n="$size" \
            '$1 == k && (k == "decode" ? $3 == n : $2 == n) { print $4, $5 }' "$model")
        echo "$seconds $figures" | awk -v variant="$variant" -v kind="$kind" -v n="$size" \
            -v copy="$copy_gbps" -v mma="$mma_tflops" '{
            if (kind == "decode") {
                per_token = $3 / ($2 > 0 ? $2 : 1)
                line = sprintf("%-6s decode at context %-5s %8.3f ms/token", variant, n ":", per_token * 1e3)
                if ($4 != "" && copy != "")
                    line = line sprintf("  %7.1f GB/s of unavoidable bytes = %5.1f%% of measured copy bandwidth",
                                        $4 / per_token / 1e9, 100 * $4 / per_token / 1e9 / copy)
            } else {
                line = sprintf("%-6s prefill of %-5s tokens %8.3f ms", variant, n, $1 * 1e3)
                if ($5 != "" && mma != "")
                    line = line sprintf("  %7.1f TFLOP/s = %5.1f%% of measured bf16 mma rate",
                                        $5 / $1 / 1e12, 100 * $5 / $1 / 1e12 / mma)
            }
            print line
        }'
    done
done
echo "== run.sh took $(($(date +%s) - started)) s"

echo "tests/gpu/run.sh: $failures failures"
[ $failures -eq 0 ]
