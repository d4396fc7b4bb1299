#!/bin/sh
# One fixture under a quantizing preset: the reference backend with the
# preset's weights (quantized, then dequantized as quant_value defines; f32
# arithmetic) is the oracle, and the host plan of the same preset must match
# it within TOLERANCE of its logit range, with the same greedy tokens.
#   run_quant_fixture.sh SMELT CHECK_FIXTURE MODEL.smelt FIXTURE_DIR WORK_DIR PRESET ACT TOLERANCE [PROMPT ROWS]
# ACT is the host plan's activation storage (--act): f32 isolates the
# quantized kernels (the bound is 1e-3); bf16 is the preset as deployed.
# PROMPT (comma-separated ids) and ROWS (steps) stand in for the fixture's
# prompt.txt and tokens.txt where it has none (the demo model).
# SMELT_QUANT_FLAGS (environment, optional) adds options to both runs: the
# calibration of int4-awq and int4-gptq (--calib IDS, --act-order).
# SMELT_NO_SCALED_GEMM=1 (environment, optional) runs the host plan's
# fallback kernels in place of its scaled GEMMs (docs/design.md).
set -eu
smelt=$1 check=$2 model=$3 fixture=$4 work=$5 preset=$6 act=$7 tolerance=$8
name=$(basename "$fixture")-$preset
[ -z "${SMELT_QUANT_FLAGS:-}" ] || name=$name-$(printf %s "$SMELT_QUANT_FLAGS" | cksum | cut -d" " -f1)
[ -z "${SMELT_NO_SCALED_GEMM:-}" ] || name=$name-fallback
oracle=$work/$name-ref
mkdir -p "$oracle"
if [ $# -ge 10 ]; then
    prompt=${9} rows=${10}
else
    prompt=$(cat "$fixture/prompt.txt") rows=$(( $(tr ',' '\n' <"$fixture/tokens.txt" | grep -c .) + 1 ))
fi
set -- --config "$fixture/config.json" --weights "$fixture/model.safetensors" --precision "$preset" \
    --prompt-ids "$prompt" --max-tokens "$rows" ${SMELT_QUANT_FLAGS:-}
"$smelt" run "$model" "$@" --backend ref --dump-logits "$oracle/logits.npy" >"$oracle/stdout"
sed -n 's/^tokens: //p' "$oracle/stdout" | tr ' ' ',' >"$oracle/tokens.txt"
"$smelt" run "$model" "$@" --backend host --act "$act" --dump-logits "$work/$name-host-$act.npy" \
    >"$work/$name-host-$act.out"
cat "$work/$name-host-$act.out"
"$check" "$oracle" "$work/$name-host-$act.npy" "$work/$name-host-$act.out" "$tolerance"
