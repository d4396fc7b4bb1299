#!/bin/sh
# examples/generate.c end to end: compile a fixture into a plan with its
# weights (host target), generate its greedy tokens with the program that
# uses only smelt.h, and compare them with the fixture's.
#   run_generate.sh SMELT GENERATE MODEL.smelt FIXTURE_DIR WORK_DIR PRECISION
# (bf16 plans must keep the tokens too: the fixtures' greedy margins are
# twice the bf16 bound, tests/reference/README.md)
set -eu
smelt=$1 generate=$2 model=$3 fixture=$4 work=$5 precision=$6
mkdir -p "$work"
plan="$work/$(basename "$fixture")-$precision.plan"
"$smelt" compile "$model" --config "$fixture/config.json" --weights "$fixture/model.safetensors" \
    --target host --precision "$precision" -o "$plan"
count=$(tr ',' '\n' <"$fixture/tokens.txt" | grep -c .)
got=$("$generate" "$plan" "$(cat "$fixture/prompt.txt")" "$count")
want="tokens: $(tr ',' ' ' <"$fixture/tokens.txt" | tr -d '\n')"
echo "$got"
if [ "$got" != "$want" ]; then
    echo "FAIL: expected '$want'"
    exit 1
fi
