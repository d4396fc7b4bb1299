#!/bin/sh
# Makes BUILD_DIR carriable to a GPU machine that has the CUDA driver and
# none of our Debian packages (tests/gpu/run.sh runs there):
#   - copies the shared libraries smelt's binaries need and that machine
#     lacks (jansson, xxhash, OpenBLAS and its runtime) into BUILD_DIR/gpu-libs.
#     NVRTC is not among them: smelt dlopen()s it only to compile, and it is
#     larger than what can be carried (64 MiB);
#   - compiles, here, the Llama-3-8B-shaped plans run.sh times (bf16, no
#     weights, sm_80 and sm_90, 2048 tokens a step) into BUILD_DIR/gpu-plans,
#     fused and, where `smelt compile` has --no-fuse, unfused, with the
#     figures `smelt inspect --json` models for each step run.sh measures
#     (llama-3-8b-VARIANT.model: "KIND TOKENS CONTEXT UNAVOIDABLE_BYTES FLOPS"
#     per line; needs jq here), so the GPU machine needs no NVRTC for them.
#
#   tests/gpu/prepare.sh [BUILD_DIR]
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-build}
smelt=$build/cli/smelt
mkdir -p "$build/gpu-libs" "$build/gpu-plans"
for binary in "$smelt" "$build/tests/check_fixture" "$build/examples/generate" "$build/bench/bench_kernel_lab"; do
    [ -x "$binary" ] && ldd "$binary" | awk '/=> \// { print $3 }'
done | sort -u | grep -E 'jansson|xxhash|openblas|gfortran|quadmath|cmocka' | while read -r lib; do
    cp -L "$lib" "$build/gpu-libs/"
done

variants=fused
"$smelt" compile --help 2>&1 | grep -q -- --no-fuse && variants="fused nofuse"
for variant in $variants; do
    plan=$build/gpu-plans/llama-3-8b-$variant.plan
    flag=""
    [ "$variant" = nofuse ] && flag=--no-fuse
    # shellcheck disable=SC2086 # $flag is empty or one word
    "$smelt" compile "$root/examples/llama.smelt" --config "$root/examples/configs/llama-3-8b.json" \
        --target sm_80,sm_90 --precision bf16 --max-step-tokens 2048 $flag -o "$plan"
    if command -v jq >/dev/null 2>&1; then
        "$smelt" inspect "$plan" --json --prefill 512,2048 --decode-context 128,1024,8160 |
            jq -r '.steps[] | "\(.kind) \(.tokens) \(.context) \(.unavoidable_dram_bytes) \(.flops)"' \
                >"${plan%.plan}.model"
    fi
done
du -sh "$build/gpu-libs" "$build/gpu-plans"
size=$(du -sm "$build" | cut -f1)
echo "tests/gpu/prepare.sh: $build is $size MiB (at most 64 MiB can be carried)"
[ "$size" -le 64 ] || echo "tests/gpu/prepare.sh: warning: $build is too large to carry; use a Release build" >&2
