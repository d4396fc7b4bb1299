/* sim_barrier.c - how fast the host simulator runs a block barrier.
 *
 *   bench_sim_barrier [workers [blocks [iterations]]]
 *
 * A kernel of 256 threads does `iterations` __syncthreads() in a loop
 * (default 1000) over `blocks` blocks (default 8 per worker). Every thread
 * reaching a barrier is one arrival; the figure is arrivals per second per
 * worker, which is what one core sustains when workers <= cores and nothing
 * else runs; and arrivals per CPU-second (the process's CPU time over the
 * launch), which stays meaningful on a busy machine. The design target is 10
 * million per second per core.
 */
#include "host_sim.h"
#include "smelt_kernel.h"

#include <stdio.h>
#include <stdlib.h>
#include <time.h>

enum { BENCH_THREADS = 256 };

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

int main(int argc, char **argv) {
    int workers = argc > 1 ? parse_positive(argv[1], "workers") : 1;
    int blocks = argc > 2 ? parse_positive(argv[2], "blocks") : 8 * workers;
    int iterations = argc > 3 ? parse_positive(argv[3], "iterations") : 1000;

    sim_pool *pool = sim_pool_create((unsigned)workers);
    int *out = calloc((size_t)blocks, sizeof *out);
    if (!pool || !out) {
        fprintf(stderr, "bench_sim_barrier: cannot create %d workers\n", workers);
        return 1;
    }
    sim_kernel kernel = {"bench_barrier_loop", bench_barrier_loop__host_entry};
    void *args[] = {&out, &iterations};
    char error[512];

    /* The first launch maps the stacks and touches them; time the second. */
    if (sim_launch(pool, &kernel, sim_dim3_make((unsigned)workers, 1, 1), sim_dim3_make(BENCH_THREADS, 1, 1),
                   0, args, error, sizeof error) != SIM_OK) {
        fprintf(stderr, "bench_sim_barrier: %s\n", error);
        return 1;
    }
    double start = seconds_now(CLOCK_MONOTONIC), cpu_start = seconds_now(CLOCK_PROCESS_CPUTIME_ID);
    sim_status status = sim_launch(pool, &kernel, sim_dim3_make((unsigned)blocks, 1, 1),
                                   sim_dim3_make(BENCH_THREADS, 1, 1), 0, args, error, sizeof error);
    double elapsed = seconds_now(CLOCK_MONOTONIC) - start;
    double cpu = seconds_now(CLOCK_PROCESS_CPUTIME_ID) - cpu_start;
    if (status != SIM_OK) {
        fprintf(stderr, "bench_sim_barrier: %s\n", error);
        return 1;
    }
    for (int b = 0; b < blocks; b++)
        if (out[b] != iterations) {
            fprintf(stderr, "bench_sim_barrier: block %d counted %d rounds, expected %d\n", b, out[b],
                    iterations);
            return 1;
        }

    double arrivals = (double)blocks * BENCH_THREADS * iterations;
    printf("%d workers, %d blocks of %d threads, %d barriers each: %.3f s (%.3f s of CPU)\n", workers, blocks,
           BENCH_THREADS, iterations, elapsed, cpu);
    printf(
        "%.1f million arrivals/s in all, %.1f million arrivals/s per worker, %.1f million per CPU-second\n",
        arrivals / elapsed / 1e6, arrivals / elapsed / 1e6 / workers, arrivals / cpu / 1e6);
    free(out);
    sim_pool_free(pool);
    return 0;
}
