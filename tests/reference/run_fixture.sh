#!/bin/sh
# One fixture end to end: `smelt run` on the fixture's config and weights,
# then check_fixture against its PyTorch logits and greedy tokens.
#   run_fixture.sh SMELT CHECK_FIXTURE MODEL.smelt FIXTURE_DIR WORK_DIR BACKEND PRECISION TOLERANCE [GGUF]
# BACKEND ref interprets the IR; host compiles a plan of PRECISION (f32,
# bf16, or f16: bf16 with --act f16) and runs its kernels on the host
# simulator; host-nofuse the same with --no-fuse (one op per kernel). With GGUF, the weights and the params
# come from that GGUF file alone (no --config).
set -eu
smelt=$1 check=$2 model=$3 fixture=$4 work=$5 backend=$6 precision=$7 tolerance=$8 gguf=${9:-}
mkdir -p "$work"
name=$(basename "$fixture")-$backend-$precision
if [ -n "$gguf" ]; then
    name=$(basename "$gguf" .gguf)-gguf-$backend-$precision
    set -- --weights "$gguf"
else
    set -- --config "$fixture/config.json" --weights "$fixture/model.safetensors"
fi
rows=$(( $(tr ',' '\n' <"$fixture/tokens.txt" | grep -c .) + 1 ))
if [ "$precision" = f16 ]; then
    set -- "$@" --precision bf16 --act f16
else
    set -- "$@" --precision "$precision"
fi
if [ "$backend" = host-nofuse ]; then
    backend=host
    set -- "$@" --no-fuse
fi
"$smelt" run "$model" "$@" \
    --backend "$backend" --prompt-ids "$(cat "$fixture/prompt.txt")" \
    --max-tokens "$rows" --dump-logits "$work/$name.npy" >"$work/$name.out"
cat "$work/$name.out"
"$check" "$fixture" "$work/$name.npy" "$work/$name.out" "$tolerance"
