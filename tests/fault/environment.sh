# environment.sh - sourced by the fault sweeps (sweep.sh, sweep_cuda.sh) after
# they set $smelt and $work: what every injected run shares.
# Sanitizer reports get exit statuses of their own, never 1, so that "exit 1
# with a message" cannot be a sanitizer's report; the shim acts only in
# smelt itself (not in timeout or env); kernels are cached in the work folder.
ASAN_OPTIONS=${ASAN_OPTIONS:-detect_leaks=1}:verify_asan_link_order=0:exitcode=86:abort_on_error=0
LSAN_OPTIONS=exitcode=87
UBSAN_OPTIONS=exitcode=88:halt_on_error=1:print_stacktrace=1
export ASAN_OPTIONS LSAN_OPTIONS UBSAN_OPTIONS
export SMELT_CACHE_DIR="$work/kernel-cache"
FAILMALLOC_EXE=$smelt
export FAILMALLOC_EXE
