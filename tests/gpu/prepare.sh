#!/bin/sh
# Makes BUILD_DIR carriable to a GPU machine that has the CUDA driver and
# none of our Debian packages (tests/gpu/run.sh runs there):
#   - copies the shared libraries smelt's binaries need and that machine
#     lacks (jansson, xxhash, OpenBLAS and its runtime) into BUILD_DIR/gpu-libs,
#     emptied first so that nothing an older prepare.sh copied stays there.
#     NVRTC is not among them (libnvrtc is 109 MB, more than can be carried):
#     smelt dlopen()s libnvrtc.so.MAJOR only to compile, and the GPU machine
#     has its own (CUDA 13, in /usr/local/cuda/lib64, which run.sh puts on
#     LD_LIBRARY_PATH);
#   - compiles, here, the Llama-3-8B-shaped plans run.sh times (bf16, no
#     weights, sm_80 and sm_90, 2048 tokens a step) into BUILD_DIR/gpu-plans,
#     fused and, where `smelt compile` has --no-fuse, unfused, with the
#     figures `smelt inspect --json` models for each step run.sh measures
#     (llama-3-8b-VARIANT.model: "KIND TOKENS CONTEXT UNAVOIDABLE_BYTES FLOPS"
#     per line; needs jq here), so the GPU machine needs no NVRTC for them;
#   - checks that BUILD_DIR, all of which is carried, is at most 64 MiB (the
#     limit on what travels to the GPU machine), and fails, naming its
#     largest parts, when it is not (a Release build is smaller than Debug).
#
#   tests/gpu/prepare.sh [BUILD_DIR]
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-build}
smelt=$build/cli/smelt
rm -rf "$build/gpu-libs"
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
# What is carried is every file of BUILD_DIR, by its bytes (apparent size).
limit=$((64 * 1024 * 1024))
bytes=$(du -sb "$build" | cut -f1)
mib=$(awk -v b="$bytes" 'BEGIN { printf "%.1f", b / 1048576 }')
if [ "$bytes" -gt "$limit" ]; then
    echo "tests/gpu/prepare.sh: $build is $mib MiB: more than the 64 MiB that can be carried to the GPU machine." >&2
    echo "tests/gpu/prepare.sh: its largest parts (MiB); what ctest leaves (tests/cli/Output, tests/kernel-cache)" \
        "can go, and a fresh or Release build is smaller:" >&2
    du -sm --apparent-size "$build"/* | sort -rn | head -8 >&2
    exit 1
fi
echo "tests/gpu/prepare.sh: $build is $mib MiB ($bytes bytes; at most 64 MiB can be carried)"
