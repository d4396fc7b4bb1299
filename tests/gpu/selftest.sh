#!/bin/sh
# Runs tests/gpu/run.sh on this machine, without a GPU, against stand-ins: an
# nvidia-smi that names a GPU, a smelt whose `run` prints fixed timings, and
# a kernel lab that prints fixed peaks. So what run.sh computes from what it
# measures (per-token times, GB/s, fractions of the peaks, the --no-fuse
# guard) is checked where no GPU is, against figures worked out by hand.
#   tests/gpu/selftest.sh
set -eu
root=$(cd "$(dirname "$0")/../.." && pwd)
fake=$(mktemp -d "${TMPDIR:-/tmp}/smelt-gpu-selftest-XXXXXX")
trap 'rm -rf "$fake"' EXIT INT TERM
mkdir -p "$fake/bin" "$fake/build/cli" "$fake/build/bench" "$fake/build/gpu-plans"
cat >"$fake/bin/nvidia-smi" <<'SCRIPT'
#!/bin/sh
echo "GPU 0: stand-in"
SCRIPT
# 32 decode tokens in 0.320 s: 10 ms a token; a prefill in 0.050 s.
cat >"$fake/build/cli/smelt" <<'SCRIPT'
#!/bin/sh
case "$1" in
run)
    decoded=32
    case "$*" in *"--max-tokens 1"*) decoded=0 ;; esac
    echo "smelt: prefill 512 tokens in 0.050 s (10240.0 tokens/s), decode $decoded tokens in 0.320 s (100.0 tokens/s)" >&2 ;;
compile) [ "${2:-}" = --help ] && echo "  --no-fuse" ;;
*) exit 1 ;;
esac
SCRIPT
cat >"$fake/build/bench/bench_kernel_lab" <<'SCRIPT'
#!/bin/sh
printf 'gpu d2d_copy_bandwidth_GBps 4000.0\ngpu gemm_mma_bf16_TFLOPs 700.0\n'
SCRIPT
chmod +x "$fake/bin/nvidia-smi" "$fake/build/cli/smelt" "$fake/build/bench/bench_kernel_lab"
for variant in fused nofuse; do
    : >"$fake/build/gpu-plans/llama-3-8b-$variant.plan"
    printf 'decode 1 128 15000000000 0\nprefill 2048 0 0 35000000000000\n' >"$fake/build/gpu-plans/llama-3-8b-$variant.model"
done
PATH=$fake/bin:$PATH sh "$root/tests/gpu/run.sh" "$fake/build" >"$fake/out.txt" 2>&1 || true
status=0
# 15 GB in 10 ms = 1500 GB/s = 37.5% of 4000; 35 TFLOP in 50 ms = 700 TFLOP/s = 100% of 700.
for want in "measured: device-to-device copy 4000.0 GB/s, bf16 mma 700.0 TFLOP/s" \
    "fused  decode at context 128:    10.000 ms/token   1500.0 GB/s of unavoidable bytes =  37.5% of measured copy bandwidth" \
    "nofuse decode at context 128:    10.000 ms/token   1500.0 GB/s" \
    "fused  prefill of 2048  tokens   50.000 ms    700.0 TFLOP/s = 100.0% of measured bf16 mma rate"; do
    if ! grep -qF -- "$want" "$fake/out.txt"; then
        echo "selftest: missing from run.sh's output: $want"
        status=1
    fi
done
[ $status -eq 0 ] || cat "$fake/out.txt"
exit $status
