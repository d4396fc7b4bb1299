/* sim_barrier.c - how fast the host simulator runs a block barrier and a
 * warp shuffle.
 *
 *   bench_sim_barrier [workers [blocks [iterations]]]
 *
 * Two kernels of 256 threads, over `blocks` blocks (default 8 per worker):
 * one does `iterations` __syncthreads() in a loop (default 1000), the other
 * `iterations` warp sums (five __shfl_xor_sync each, as every reduction in
 * smelt's kernels) with a __syncthreads() after every eighth. Every thread
 * reaching a barrier or a shuffle is one arrival; the figures are arrivals
 * per second per worker, which is what one core sustains when workers <=
 * cores and nothing else runs, and arrivals per CPU-second (the process's
 * CPU time over the launch), which stays meaningful on a busy machine. The
 * design target is 10 million per second per core.
 */
#include "host_sim.h"
#include "smelt_kernel.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { BENCH_THREADS = 256, SHUFFLES_PER_SUM = 5, SUMS_PER_BARRIER = 8 };

SMELT_KERNEL void bench_barrier_loop(int *out, int iterations) {
    __shared__ int rounds;
    if (threadIdx.x == 0) rounds = 0;
    for (int i = 0; i < iterations; i++) {
        __syncthreads();
        if (threadIdx.x == 0) rounds++;
    }
    if (threadIdx.x == 0) out[blockIdx.x] = rounds;
}
SMELT_HOST_ENTRY(bench_barrier_loop) { bench_barrier_loop(SMELT_ARG(int *, 0), SMELT_ARG(int, 1)); }

/* Each round every lane adds 1 to its value and the warp sums it: 32 more
 * per round in every lane, so the block's thread 0 ends with 32 * rounds. */
SMELT_KERNEL void bench_shuffle_loop(int *out, int iterations) {
    int v = 0;
    for (int i = 0; i < iterations; i++) {
        int sum = 1;
        for (int offset = 16; offset > 0; offset /= 2)
            sum += smelt_shfl_xor_i32(0xffffffffu, sum, offset);
        v += sum;
        if (i % SUMS_PER_BARRIER == SUMS_PER_BARRIER - 1) __syncthreads();
    }
    if (threadIdx.x == 0) out[blockIdx.x] = v / 32;
}
SMELT_HOST_ENTRY(bench_shuffle_loop) { bench_shuffle_loop(SMELT_ARG(int *, 0), SMELT_ARG(int, 1)); }

static double seconds_now(clockid_t clock) {
    struct timespec now;
    clock_gettime(clock, &now);
    return (double)now.tv_sec + (double)now.tv_nsec * 1e-9;
}

static int parse_positive(const char *text, const char *what) {
    char *end;
    long value = strtol(text, &end, 10);
    if (*end != '\0' || value <= 0 || value > 1000000) {
        fprintf(stderr, "bench_sim_barrier: expected a positive number of %s, found '%s'\n", what, text);
        exit(2);
    }
    return (int)value;
}

/* Times one launch of `kernel` (after an untimed one that maps the stacks);
 * prints its figures. Returns 0, or 1 on a failed launch or a wrong count. */
static int bench(sim_pool *pool, const char *what, sim_kernel kernel, int workers, int blocks, int iterations,
                 double arrivals_per_iteration) {
    int *out = calloc((size_t)blocks, sizeof *out);
    if (!out) return 1;
    void *args[] = {&out, &iterations};
    char error[512];
    if (sim_launch(pool, &kernel, sim_dim3_make((unsigned)workers, 1, 1), sim_dim3_make(BENCH_THREADS, 1, 1),
                   0, args, error, sizeof error) != SIM_OK) {
        fprintf(stderr, "bench_sim_barrier: %s\n", error);
        free(out);
        return 1;
    }
    double start = seconds_now(CLOCK_MONOTONIC), cpu_start = seconds_now(CLOCK_PROCESS_CPUTIME_ID);
    sim_status status = sim_launch(pool, &kernel, sim_dim3_make((unsigned)blocks, 1, 1),
                                   sim_dim3_make(BENCH_THREADS, 1, 1), 0, args, error, sizeof error);
    double elapsed = seconds_now(CLOCK_MONOTONIC) - start;
    double cpu = seconds_now(CLOCK_PROCESS_CPUTIME_ID) - cpu_start;
    if (status != SIM_OK) {
        fprintf(stderr, "bench_sim_barrier: %s\n", error);
        free(out);
        return 1;
    }
    for (int b = 0; b < blocks; b++)
        if (out[b] != iterations) {
            fprintf(stderr, "bench_sim_barrier: %s: block %d counted %d rounds, expected %d\n", what, b,
                    out[b], iterations);
            free(out);
            return 1;
        }
    double arrivals = (double)blocks * BENCH_THREADS * iterations * arrivals_per_iteration;
    printf("%s: %d workers, %d blocks of %d threads, %d rounds each: %.3f s (%.3f s of CPU)\n", what, workers,
           blocks, BENCH_THREADS, iterations, elapsed, cpu);
    printf(
        "  %.1f million arrivals/s in all, %.1f million arrivals/s per worker, %.1f million per CPU-second\n",
        arrivals / elapsed / 1e6, arrivals / elapsed / 1e6 / workers, arrivals / cpu / 1e6);
    free(out);
    return 0;
}

int main(int argc, char **argv) {
    int workers = argc > 1 ? parse_positive(argv[1], "workers") : 1;
    int blocks = argc > 2 ? parse_positive(argv[2], "blocks") : 8 * workers;
    int iterations = argc > 3 ? parse_positive(argv[3], "iterations") : 1000;

    sim_pool *pool = sim_pool_create((unsigned)workers);
    if (!pool) {
        fprintf(stderr, "bench_sim_barrier: cannot create %d workers\n", workers);
        return 1;
    }
    sim_kernel barrier = {"bench_barrier_loop", bench_barrier_loop__host_entry};
    sim_kernel shuffle = {"bench_shuffle_loop", bench_shuffle_loop__host_entry};
    int failed = bench(pool, "__syncthreads()", barrier, workers, blocks, iterations, 1.0) ||
                 bench(pool, "warp sums", shuffle, workers, blocks, iterations,
                       SHUFFLES_PER_SUM + 1.0 / SUMS_PER_BARRIER);
    sim_pool_free(pool);
    return failed;
}
