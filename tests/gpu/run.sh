#!/bin/sh
# GPU checks: the end-to-end fixture tests on the cuda backend, generate.c on
# the GPU, and the speed of a Llama-3-8B-shaped plan with random weights.
# Exits 77 (skipped, for ctest) where there is no GPU.
#
#   tests/gpu/run.sh [BUILD_DIR]
#
# On a machine without our Debian packages (the lent GPU machine), build here
# and carry BUILD_DIR with the shared libraries its binaries need:
#   tests/gpu/prepare.sh build     # copies them into build/gpu-libs
set -u
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-$root/build}
if ! command -v nvidia-smi >/dev/null 2>&1 || ! nvidia-smi -L >/dev/null 2>&1; then
    echo "tests/gpu/run.sh: no GPU here: skipping"
    exit 77
fi
[ -d "$build/gpu-libs" ] && export LD_LIBRARY_PATH="$build/gpu-libs:${LD_LIBRARY_PATH:-}"
export SMELT_CACHE_DIR=${SMELT_CACHE_DIR:-$build/kernel-cache}
smelt=$build/cli/smelt check=$build/tests/check_fixture generate=$build/examples/generate
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

echo "== Llama-3-8B-shaped plan, random bf16 weights: prefill 512 tokens, decode 128"
"$smelt" compile "$root/examples/llama.smelt" --config "$root/examples/configs/llama-3-8b.json" \
    --target sm_90 --precision bf16 --max-step-tokens 512 -o "$work/llama-3-8b.plan" || failures=$((failures + 1))
prompt=$(seq -s, 1 512)
"$smelt" run "$work/llama-3-8b.plan" --backend cuda --random-weights 1 --prompt-ids "$prompt" \
    --max-tokens 128 >/dev/null || failures=$((failures + 1))

echo "tests/gpu/run.sh: $failures failures"
[ $failures -eq 0 ]
