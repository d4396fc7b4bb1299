#!/bin/sh
# A fixture with an f8e4m3 KV cache (--kv-cache fp8): PyTorch has no logits
# of that rounding, so the ref backend's, which rounds each cached row
# through E4M3 with its scale as the kernels do, become the truth, and a
# host plan must match them within TOLERANCE of their range with the same
# greedy tokens. Also prints how far the fp8 logits are from the fixture's
# own (PyTorch, f32 cache) and whether the greedy tokens stay the same.
#   run_kv_agreement.sh SMELT CHECK_FIXTURE MODEL.smelt FIXTURE_DIR WORK_DIR PRECISION TOLERANCE
# PRECISION f16 is bf16 with --act f16.
set -eu
smelt=$1 check=$2 model=$3 fixture=$4 work=$5 precision=$6 tolerance=$7
name=$(basename "$fixture")-kvfp8
truth=$work/$name-ref
mkdir -p "$truth"
cp "$fixture/prompt.txt" "$truth/prompt.txt"
set -- --config "$fixture/config.json" --weights "$fixture/model.safetensors" --kv-cache fp8
rows=$(( $(tr ',' '\n' <"$fixture/tokens.txt" | grep -c .) + 1 ))
"$smelt" run "$model" "$@" --backend ref --prompt-ids "$(cat "$fixture/prompt.txt")" \
    --max-tokens "$rows" --dump-logits "$truth/logits.npy" >"$truth/ref.out"
# the fixture's greedy tokens: all but the last printed (its logits row is not dumped)
sed -n 's/^tokens: //p' "$truth/ref.out" | tr ' ' '\n' | head -n $((rows - 1)) | paste -sd, >"$truth/tokens.txt"
echo "ref with an fp8 KV cache against PyTorch (f32 cache), for the record:"
"$check" "$fixture" "$truth/logits.npy" "$truth/ref.out" 0.5 || true
if [ "$precision" = f16 ]; then
    set -- "$@" --precision bf16 --act f16
else
    set -- "$@" --precision "$precision"
fi
"$smelt" run "$model" "$@" --backend host --prompt-ids "$(cat "$fixture/prompt.txt")" \
    --max-tokens "$rows" --dump-logits "$work/$name-host-$precision.npy" >"$work/$name-host-$precision.out"
cat "$work/$name-host-$precision.out"
"$check" "$truth" "$work/$name-host-$precision.npy" "$work/$name-host-$precision.out" "$tolerance"
