#!/bin/sh
# A quantized GGUF has no PyTorch fixture of its own: the ref backend's
# logits on it become one, and a host plan must match them.
#   run_gguf_agreement.sh SMELT CHECK_FIXTURE MODEL.smelt GGUF PROMPT_FILE WORK_DIR PRECISION TOLERANCE
# Both sides dequantize the same GGUF at compile time, so they see the same
# f32 weights: the bound is docs/design.md §7's for the plan's precision.
set -eu
smelt=$1 check=$2 model=$3 gguf=$4 prompt=$5 work=$6 precision=$7 tolerance=$8
name=$(basename "$gguf" .gguf)
truth=$work/$name-ref
mkdir -p "$truth"
cp "$prompt" "$truth/prompt.txt"
rows=9
"$smelt" run "$model" --weights "$gguf" --backend ref --prompt-ids "$(cat "$prompt")" \
    --max-tokens "$rows" --dump-logits "$truth/logits.npy" >"$truth/ref.out"
# the fixture's greedy tokens: all but the last printed (its logits row is not dumped)
sed -n 's/^tokens: //p' "$truth/ref.out" | tr ' ' '\n' | head -n $((rows - 1)) | paste -sd, >"$truth/tokens.txt"
"$smelt" run "$model" --weights "$gguf" --backend host --precision "$precision" \
    --prompt-ids "$(cat "$prompt")" --max-tokens "$rows" --dump-logits "$work/$name-host-$precision.npy" \
    >"$work/$name-host-$precision.out"
cat "$work/$name-host-$precision.out"
"$check" "$truth" "$work/$name-host-$precision.npy" "$work/$name-host-$precision.out" "$tolerance"
