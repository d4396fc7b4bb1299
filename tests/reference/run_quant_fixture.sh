#!/bin/sh
# One fixture under a quantizing preset: the reference backend with the
# preset's weights (quantized, then dequantized as quant_value defines; f32
# arithmetic) is the oracle, and the host plan of the same preset must match
# it within TOLERANCE of its logit range, with the same greedy tokens.
#   run_quant_fixture.sh SMELT CHECK_FIXTURE MODEL.smelt FIXTURE_DIR WORK_DIR PRESET ACT TOLERANCE
# ACT is the host plan's activation storage (--act): f32 isolates the
# quantized kernels (the bound is 1e-3); bf16 is the preset as deployed.
set -eu
smelt=$1 check=$2 model=$3 fixture=$4 work=$5 preset=$6 act=$7 tolerance=$8
name=$(basename "$fixture")-$preset
oracle=$work/$name-ref
mkdir -p "$oracle"
rows=$(( $(tr ',' '\n' <"$fixture/tokens.txt" | grep -c .) + 1 ))
set -- --config "$fixture/config.json" --weights "$fixture/model.safetensors" --precision "$preset" \
    --prompt-ids "$(cat "$fixture/prompt.txt")" --max-tokens "$rows"
"$smelt" run "$model" "$@" --backend ref --dump-logits "$oracle/logits.npy" >"$oracle/stdout"
sed -n 's/^tokens: //p' "$oracle/stdout" | tr ' ' ',' >"$oracle/tokens.txt"
"$smelt" run "$model" "$@" --backend host --act "$act" --dump-logits "$work/$name-host-$act.npy" \
    >"$work/$name-host-$act.out"
cat "$work/$name-host-$act.out"
"$check" "$oracle" "$work/$name-host-$act.npy" "$work/$name-host-$act.out" "$tolerance"
