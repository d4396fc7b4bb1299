#!/bin/sh
# Runs `smelt ir` on every malformed input under corpus/ (`smelt run` with
# --weights on each GGUF file under corpus/gguf/) (and on large inputs
# generated here: 1 MB identifiers, 10,000-deep nesting, binary garbage) and
# requires each to be refused with exit status 1 and an error message: a
# crash, a sanitizer report (exit status != 1) or a hang (timeout) fails.
set -u
smelt=$1 corpus=$2 generated=$3
mkdir -p "$generated"

generate_large_inputs() {
    # 1 MB identifier, used before it is defined
    { printf 'model m {\n  output o = '; head -c 1048576 /dev/zero | tr '\0' 'a'; printf '\n}\n'; } >"$generated/long_identifier.smelt"
    # 1 MB string
    { printf 'model m {\n  weight w: [2] = "'; head -c 1048576 /dev/zero | tr '\0' 'x'; printf '\n}\n'; } >"$generated/long_string.smelt"
    # 10,000-deep parentheses and blocks
    { printf 'model m {\n  param p: int = '; head -c 10000 /dev/zero | tr '\0' '('; printf '1'; head -c 10000 /dev/zero | tr '\0' ')'; printf '\n}\n'; } >"$generated/deep_parens.smelt"
    { printf 'model m {\n'; i=0; while [ $i -lt 10000 ]; do printf 'if true {'; i=$((i+1)); done; printf '\n}\n'; } >"$generated/deep_blocks.smelt"
    { head -c 10000 /dev/zero | tr '\0' '['; head -c 10000 /dev/zero | tr '\0' ']'; } >"$generated/deep_arrays.json"
    # binary garbage, deterministic
    awk 'BEGIN { srand(7); for (i = 0; i < 65536; i++) printf "%c", int(rand() * 256) }' >"$generated/garbage.smelt" 2>/dev/null
    cp "$generated/garbage.smelt" "$generated/garbage.json"
    : >"$generated/empty.smelt"
    : >"$generated/empty.json"
    # GGUF magic and version 3, then garbage
    { printf 'GGUF\003\000\000\000'; cat "$generated/garbage.smelt"; } >"$generated/garbage.gguf"
}
generate_large_inputs

failures=0 count=0
for input in "$corpus"/*.smelt "$corpus"/*.json "$corpus"/*.ir "$corpus"/gguf/*.gguf "$generated"/*; do
    [ -e "$input" ] || continue
    count=$((count+1))
    case "$input" in
        *.ir) timeout 60 "$smelt" opt --pass infer-shapes "$input" >/dev/null 2>"$generated/stderr" ;;
        # GGUF (tests/corpus/make_gguf_corpus.py): params and weights from the file
        *.gguf) timeout 60 "$smelt" run "$corpus/../../examples/llama.smelt" --weights "$input" --backend ref \
                    --prompt-ids 1 >/dev/null 2>"$generated/stderr" ;;
        *) timeout 60 "$smelt" ir "$input" >/dev/null 2>"$generated/stderr" ;;
    esac
    status=$?
    if [ $status -ne 1 ] || ! grep -q 'error' "$generated/stderr"; then
        echo "FAIL: $input: exit status $status"
        head -c 2000 "$generated/stderr"
        failures=$((failures+1))
    fi
done
echo "$count malformed inputs, $failures failures"
[ $failures -eq 0 ]
