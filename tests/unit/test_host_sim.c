/* test_host_sim.c - the host simulator and smelt_kernel.h, primitive by
 * primitive, against hand-computed truths; and the same kernel text
 * (kernels/host_sim_kernels.cu) compiled by NVRTC for sm_80 and sm_90. */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <fcntl.h>
#include <pthread.h>
#include <sys/wait.h>
#include <unistd.h>

#include "fiber.h"
#include "host_sim.h"
#include "numeric.h"

#include "kernels/host_sim_kernels.cu"

#ifdef SMELT_HAVE_NVRTC
#include SMELT_NVRTC_HEADER /* the toolkit's, by full path: codegen/nvrtc.h shadows <nvrtc.h> */
#endif

#define KERNEL(name) ((sim_kernel){#name, name##__host_entry})

static sim_status launch(sim_pool *pool, sim_kernel kernel, sim_dim3 grid, sim_dim3 block, size_t shared,
                         void **args, char *error, size_t error_size) {
    return sim_launch(pool, &kernel, grid, block, shared, args, error, error_size);
}

/* Launches that must succeed; prints the simulator's message when not. */
static void launch_ok(sim_pool *pool, sim_kernel kernel, sim_dim3 grid, sim_dim3 block, size_t shared,
                      void **args) {
    char error[512] = "";
    sim_status status = launch(pool, kernel, grid, block, shared, args, error, sizeof error);
    if (status != SIM_OK) fprintf(stderr, "launch of %s failed: %s\n", kernel.name, error);
    assert_int_equal(status, SIM_OK);
}

/* ---- fibers ---- */

typedef struct ping_pong {
    sim_fiber main, worker;
    int steps[8];
    int step_count;
} ping_pong;

static void ping_pong_worker(void *argument) {
    ping_pong *p = argument;
    double carried = 1.5; /* lives on this fiber's stack across switches */
    for (int i = 0; i < 3; i++) {
        p->steps[p->step_count++] = 100 + i;
        carried *= 2.0;
        sim_fiber_switch(&p->worker, &p->main);
    }
    p->steps[p->step_count++] = (int)carried; /* 1.5 * 8 */
    sim_fiber_exit(&p->worker, &p->main);
}

static void test_fiber_switches_back_and_forth(void **state) {
    (void)state;
    sim_stack_region stacks = {0};
    assert_true(sim_stack_region_reserve(&stacks, 2, 64 * 1024));
    ping_pong p = {0};
    sim_fiber_init_thread(&p.main);
    sim_fiber_prepare(&p.worker, sim_stack_region_stack(&stacks, 1), stacks.stack_size, ping_pong_worker, &p);
    for (int i = 0; i < 4; i++) {
        p.steps[p.step_count++] = i;
        sim_fiber_switch(&p.main, &p.worker);
    }
    int expected[] = {0, 100, 1, 101, 2, 102, 3, 12};
    assert_int_equal(p.step_count, 8);
    for (int i = 0; i < 8; i++)
        assert_int_equal(p.steps[i], expected[i]);
    /* A larger request replaces the region; a smaller one keeps it. */
    assert_true(sim_stack_region_reserve(&stacks, 4, 128 * 1024));
    assert_int_equal(stacks.count, 4);
    assert_true(stacks.stack_size >= 128 * 1024);
    unsigned char *base = stacks.base;
    assert_true(sim_stack_region_reserve(&stacks, 2, 64 * 1024));
    assert_ptr_equal(stacks.base, base);
    assert_int_equal(stacks.guarded_count, 4); /* far from the mapping limit here */
    /* The canary that stands in for a guard page when mappings run out. */
    sim_stack_region_set_canary(&stacks, 3);
    assert_true(sim_stack_region_canary_intact(&stacks, 3));
    ((volatile unsigned char *)sim_stack_region_stack(&stacks, 3))[5] ^= 1;
    assert_false(sim_stack_region_canary_intact(&stacks, 3));
    sim_stack_region_free(&stacks);
}

/* ---- indices ---- */

static void check_indices(sim_pool *pool, sim_dim3 grid, sim_dim3 block) {
    unsigned threads = block.x * block.y * block.z, blocks = grid.x * grid.y * grid.z;
    unsigned *out = calloc((size_t)threads * blocks * SIM_TEST_INDEX_FIELDS, sizeof *out);
    void *args[] = {&out};
    launch_ok(pool, KERNEL(sim_test_indices), grid, block, 0, args);
    for (unsigned bz = 0; bz < grid.z; bz++)
        for (unsigned by = 0; by < grid.y; by++)
            for (unsigned bx = 0; bx < grid.x; bx++)
                for (unsigned tz = 0; tz < block.z; tz++)
                    for (unsigned ty = 0; ty < block.y; ty++)
                        for (unsigned tx = 0; tx < block.x; tx++) {
                            unsigned b = bx + grid.x * (by + grid.y * bz),
                                     t = tx + block.x * (ty + block.y * tz);
                            const unsigned *r = out + ((size_t)b * threads + t) * SIM_TEST_INDEX_FIELDS;
                            unsigned expected[] = {tx,     ty,      tz,      bx,      by,
                                                   bz,     block.x, block.y, block.z, grid.x,
                                                   grid.y, grid.z,  t % 32,  32,      1};
                            for (unsigned f = 0; f < 15; f++)
                                assert_int_equal(r[f], expected[f]);
                        }
    free(out);
}

static void test_indices_over_3d_grids_and_blocks(void **state) {
    (void)state;
    sim_pool *pool = sim_pool_create(3);
    assert_non_null(pool);
    assert_int_equal(sim_pool_worker_count(pool), 3);
    check_indices(pool, sim_dim3_make(3, 2, 2), sim_dim3_make(4, 3, 2)); /* 24 threads: one partial warp */
    check_indices(pool, sim_dim3_make(2, 3, 1), sim_dim3_make(8, 4, 2)); /* 64 threads: two warps */
    check_indices(pool, sim_dim3_make(5, 1, 1), sim_dim3_make(1, 1, 1));
    check_indices(pool, sim_dim3_make(1, 1, 1), sim_dim3_make(1024, 1, 1));
    sim_pool_free(pool);
}

static void test_pool_of_zero_workers_uses_every_core(void **state) {
    (void)state;
    sim_pool *pool = sim_pool_create(0);
    assert_non_null(pool);
    assert_int_equal(sim_pool_worker_count(pool), (unsigned)sysconf(_SC_NPROCESSORS_ONLN));
    check_indices(pool, sim_dim3_make(7, 1, 1), sim_dim3_make(33, 1, 1));
    sim_pool_free(pool);
}

/* ---- __syncthreads ---- */

/* sim_launch from another thread than the last one: the launching thread is
 * worker 0, with its own scheduler context each time. */
typedef struct launch_from_thread {
    sim_pool *pool;
    unsigned *out;
    sim_status status;
} launch_from_thread;

static void *launch_on_thread(void *argument) {
    launch_from_thread *l = argument;
    void *args[] = {&l->out};
    l->status = sim_launch(l->pool, &KERNEL(sim_test_indices), sim_dim3_make(4, 1, 1),
                           sim_dim3_make(64, 1, 1), 0, args, NULL, 0);
    return NULL;
}

static void test_launches_from_several_threads(void **state) {
    (void)state;
    sim_pool *pool = sim_pool_create(2);
    assert_non_null(pool);
    for (int round = 0; round < 3; round++) {
        unsigned *out = calloc(4 * 64 * SIM_TEST_INDEX_FIELDS, sizeof *out);
        launch_from_thread l = {pool, out, SIM_ERROR_INVALID_LAUNCH};
        pthread_t thread;
        assert_int_equal(pthread_create(&thread, NULL, launch_on_thread, &l), 0);
        assert_int_equal(pthread_join(thread, NULL), 0);
        assert_int_equal(l.status, SIM_OK);
        for (unsigned b = 0; b < 4; b++)
            for (unsigned t = 0; t < 64; t++) {
                assert_int_equal(out[(b * 64 + t) * SIM_TEST_INDEX_FIELDS + 0], t);
                assert_int_equal(out[(b * 64 + t) * SIM_TEST_INDEX_FIELDS + 3], b);
            }
        free(out);
        check_indices(pool, sim_dim3_make(3, 1, 1), sim_dim3_make(64, 1, 1)); /* and from this one */
    }
    sim_pool_free(pool);
    /* One worker: no thread but the caller's. */
    pool = sim_pool_create(1);
    assert_int_equal(sim_pool_worker_count(pool), 1);
    check_indices(pool, sim_dim3_make(2, 2, 1), sim_dim3_make(40, 1, 1));
    sim_pool_free(pool);
}

static void test_syncthreads_orders_shared_memory(void **state) {
    (void)state;
    sim_pool *pool = sim_pool_create(2);
    enum { BLOCKS = 4, THREADS = 96 };
    int out[BLOCKS * THREADS];
    int with_barrier = 1;
    int *out_pointer = out;
    void *args[] = {&out_pointer, &with_barrier};
    launch_ok(pool, KERNEL(sim_test_neighbour), sim_dim3_make(BLOCKS, 1, 1), sim_dim3_make(THREADS, 1, 1), 0,
              args);
    for (int b = 0; b < BLOCKS; b++)
        for (int t = 0; t < THREADS; t++)
            assert_int_equal(out[b * THREADS + t], (t + 1) % THREADS + 1);

    /* Without the barrier the data flow is wrong, so the barrier above did
     * the work: after the first barrier thread 95 runs on and reads slot 0
     * before thread 0 has written it (round-robin order). */
    with_barrier = 0;
    launch_ok(pool, KERNEL(sim_test_neighbour), sim_dim3_make(BLOCKS, 1, 1), sim_dim3_make(THREADS, 1, 1), 0,
              args);
    int wrong = 0;
    for (int i = 0; i < BLOCKS * THREADS; i++)
        wrong += out[i] != (i % THREADS + 1) % THREADS + 1;
    assert_true(wrong > 0);
    assert_int_equal(out[THREADS - 1], 0);
    sim_pool_free(pool);
}

static void test_shared_memory_reduction(void **state) {
    (void)state;
    sim_pool *pool = sim_pool_create(2);
    enum { BLOCKS = 6 };
    float x[BLOCKS * 256], sums[BLOCKS];
    for (int i = 0; i < BLOCKS * 256; i++)
        x[i] = (float)(i % 17); /* integers: every order sums exactly */
    void *args[] = {&(const float *){x}, &(float *){sums}};
    launch_ok(pool, KERNEL(sim_test_reduce), sim_dim3_make(BLOCKS, 1, 1), sim_dim3_make(256, 1, 1), 0, args);
    for (int b = 0; b < BLOCKS; b++) {
        float expected = 0;
        for (int i = 0; i < 256; i++)
            expected += (float)((b * 256 + i) % 17);
        assert_float_equal(sums[b], expected, 0.0f);
    }
    sim_pool_free(pool);
}

static void test_shared_memory_is_per_block(void **state) {
    (void)state;
    sim_pool *pool = sim_pool_create(4); /* more workers than cores: blocks interleave */
    enum { BLOCKS = 64, THREADS = 128 };
    int *ok = calloc(BLOCKS * THREADS, sizeof *ok);
    int rounds = 40;
    void *args[] = {&ok, &rounds};
    launch_ok(pool, KERNEL(sim_test_shared_isolation), sim_dim3_make(BLOCKS, 1, 1),
              sim_dim3_make(THREADS, 1, 1), THREADS * sizeof(int), args);
    for (int i = 0; i < BLOCKS * THREADS; i++)
        assert_int_equal(ok[i], 1);
    free(ok);
    sim_pool_free(pool);
}

static void test_barrier_loop_many_blocks(void **state) {
    (void)state;
    sim_pool *pool = sim_pool_create(2);
    int out[2 * 9] = {0};
    int iterations = 300;
    void *args[] = {&(int *){out}, &iterations};
    launch_ok(pool, KERNEL(sim_test_barrier_loop), sim_dim3_make(9, 1, 1), sim_dim3_make(256, 1, 1), 0, args);
    for (int b = 0; b < 9; b++) {
        assert_int_equal(out[b], 300);
        assert_int_equal(out[9 + b], 0); /* nobody saw a stale count */
    }
    sim_pool_free(pool);
}

/* ---- warps ---- */

static int value_of(int t) { return 10 * t + 1; }

/* What lane `t` gets from source lane `source` of its warp in a block of
 * `n` threads: the source's value when it exists, else its own. */
static int shuffled(int t, int source, int n) {
    int warp_base = t / 32 * 32;
    return source >= 0 && source < 32 && warp_base + source < n ? value_of(warp_base + source) : value_of(t);
}

static void test_shuffles_and_votes_with_partial_warp(void **state) {
    (void)state;
    sim_pool *pool = sim_pool_create(1);
    enum { N = 48 };
    int out[N * SIM_TEST_WARP_FIELDS];
    memset(out, 0x55, sizeof out);
    void *args[] = {&(int *){out}};
    launch_ok(pool, KERNEL(sim_test_warp_ops), sim_dim3_make(1, 1, 1), sim_dim3_make(N, 1, 1), 0, args);
    for (int t = 0; t < N; t++) {
        const int *r = out + t * SIM_TEST_WARP_FIELDS;
        int lane = t % 32, warp = t / 32;
        assert_int_equal(r[0], shuffled(t, lane ^ 1, N));
        assert_int_equal(r[1], shuffled(t, lane + 3, N));
        assert_int_equal(r[2], shuffled(t, lane - 5, N));
        assert_int_equal(r[3], shuffled(t, 7, N));
        assert_int_equal(r[4], shuffled(t, 31 - lane, N));
        unsigned ballot = warp == 0 ? 0x49249249u : 0x9249u; /* lanes 0, 3, 6, ... that exist */
        assert_int_equal((unsigned)r[5], ballot);
        assert_int_equal(r[6], warp == 1); /* thread 40 is in warp 1 */
        assert_int_equal(r[7], warp == 0); /* threads 40..47 fail t < 40 */
        assert_int_equal(r[8], warp == 0 ? (t ^ 16) : t);
        assert_int_equal(r[9], warp == 0 ? 4992 : 12672);
        assert_int_equal(r[10], value_of(t ^ 1));
        assert_int_equal(r[11], warp == 0 && lane < 16 ? value_of(t + 16) : value_of(t));
    }
    /* A few by hand. */
    assert_int_equal(out[0 * SIM_TEST_WARP_FIELDS + 0], 11);   /* lane 0 gets lane 1's 11 */
    assert_int_equal(out[31 * SIM_TEST_WARP_FIELDS + 1], 311); /* down 3 past the end: own */
    assert_int_equal(out[40 * SIM_TEST_WARP_FIELDS + 3], 391); /* lane 7 of warp 1 is thread 39 */
    assert_int_equal(out[47 * SIM_TEST_WARP_FIELDS + 4], 471); /* lane 31-15=16 of warp 1 does not exist */
    sim_pool_free(pool);
}

static void test_xor_shuffle_paths(void **state) {
    (void)state;
    sim_pool *pool = sim_pool_create(2);
    enum { N = 64 };
    int out[3 * N];
    memset(out, 0x55, sizeof out);
    void *args[] = {&(int *){out}};
    launch_ok(pool, KERNEL(sim_test_xor_paths), sim_dim3_make(3, 1, 1), sim_dim3_make(N, 1, 1), 0, args);
    for (int t = 0; t < N; t++) {
        int lane = t % 32;
        assert_int_equal(out[3 * t], shuffled(t, lane ^ 5, N));
        assert_int_equal(out[3 * t + 1], shuffled(t, lane ^ (lane % 4), N));
        assert_int_equal(out[3 * t + 2], value_of(t)); /* lane ^ 35 is past the warp */
    }
    assert_int_equal(out[3 * 0], 51);       /* lane 0 gets lane 5's 51 */
    assert_int_equal(out[3 * 7 + 1], 41);   /* lane 7 xor 3 is lane 4 */
    assert_int_equal(out[3 * 33 + 1], 321); /* thread 33: lane 1 xor 1 is thread 32 */
    sim_pool_free(pool);
}

static void test_returning_lanes_complete_a_shuffle(void **state) {
    (void)state;
    sim_pool *pool = sim_pool_create(1);
    enum { N = 64 };
    int out[N];
    for (int t = 0; t < N; t++)
        out[t] = -1;
    void *args[] = {&(int *){out}};
    launch_ok(pool, KERNEL(sim_test_return_completes_shuffle), sim_dim3_make(1, 1, 1), sim_dim3_make(N, 1, 1),
              0, args);
    for (int t = 0; t < N; t++) {
        int lane = t % 32;
        if (lane >= 16) {
            assert_int_equal(out[t], -1);
            continue;
        }
        int a = value_of(t ^ 1);
        /* down 8 from lanes 8-15 reaches lanes 16-23, which have returned: own */
        int b = lane < 8 ? value_of((t + 8) ^ 1) : a;
        assert_int_equal(out[t], a * 1000 + b);
    }
    assert_int_equal(out[0], 11 * 1000 + 91); /* lane 0: lane 1's 11, then lane 8's a = lane 9's 91 */
    sim_pool_free(pool);
}

static void test_rms_norm_example(void **state) {
    (void)state;
    sim_pool *pool = sim_pool_create(2);
    enum { TOKENS = 5 };
    float x[TOKENS * 64], w[64], y[TOKENS * 64];
    for (int i = 0; i < TOKENS * 64; i++)
        x[i] = sinf(0.37f * (float)i) * 3.0f;
    for (int i = 0; i < 64; i++)
        w[i] = 0.5f + (float)i / 64.0f;
    int tokens = TOKENS;
    void *args[] = {&(const float *){x}, &(const float *){w}, &(float *){y}, &tokens};
    launch_ok(pool, KERNEL(sim_test_rms_norm_64), sim_dim3_make(TOKENS + 2, 1, 1), sim_dim3_make(64, 1, 1), 0,
              args);
    for (int row = 0; row < TOKENS; row++) {
        double sum = 0;
        for (int i = 0; i < 64; i++)
            sum += (double)x[row * 64 + i] * x[row * 64 + i];
        double scale = 1.0 / sqrt(sum / 64 + 1e-5);
        for (int i = 0; i < 64; i++)
            assert_float_equal(y[row * 64 + i], x[row * 64 + i] * scale * w[i], 1e-5);
    }
    sim_pool_free(pool);
}

static void test_cp_async_and_math(void **state) {
    (void)state;
    sim_pool *pool = sim_pool_create(1);
    float src[128], dst[128];
    for (int i = 0; i < 128; i++)
        src[i] = (float)i;
    void *copy_args[] = {&(const float *){src}, &(float *){dst}};
    launch_ok(pool, KERNEL(sim_test_cp_async), sim_dim3_make(1, 1, 1), sim_dim3_make(32, 1, 1), 0, copy_args);
    for (int t = 0; t < 32; t++)
        for (int i = 0; i < 4; i++)
            assert_float_equal(dst[t * 4 + i], (float)((31 - t) * 4 + i), 0.0f);

    enum { N = 9 };
    float x[N] = {-2.5f, -1.0f, -0.3f, 0.0f, 0.2f, 0.7f, 1.0f, 2.0f, 3.5f}, y[N * 12];
    int n = N;
    void *math_args[] = {&(const float *){x}, &(float *){y}, &n};
    launch_ok(pool, KERNEL(sim_test_math), sim_dim3_make(2, 1, 1), sim_dim3_make(8, 1, 1), 0, math_args);
    for (int i = 0; i < N; i++) {
        double v = x[i], a = fabs(v);
        double expected[12] = {exp(v),
                               log(a + 1),
                               sqrt(a),
                               1 / sqrt(a + 1),
                               tanh(v),
                               erf(v),
                               fmax(v, 0.25) + fmin(v, -0.25),
                               exp(v),
                               v / 3,
                               2 * v,
                               (i < 3 ? i : 3) + (i > 3 ? i : 3),
                               pow(a, 1.5)};
        for (int f = 0; f < 12; f++)
            assert_float_equal(y[i * 12 + f], expected[f], 1e-5 * fmax(1.0, fabs(expected[f])));
    }
    sim_pool_free(pool);
}

/* ---- atomics ---- */

static void test_atomics_from_many_blocks(void **state) {
    (void)state;
    sim_pool *pool = sim_pool_create(4);
    enum { BLOCKS = 64, THREADS = 256 };
    int counts[2] = {0, 0}, max_int = -1;
    float sum = 0, max_float = -1;
    unsigned winners[BLOCKS + 1] = {0};
    void *args[] = {&(int *){counts}, &(float *){&sum}, &(int *){&max_int}, &(float *){&max_float},
                    &(unsigned *){winners}};
    launch_ok(pool, KERNEL(sim_test_atomics), sim_dim3_make(BLOCKS, 1, 1), sim_dim3_make(THREADS, 1, 1), 0,
              args);
    int expected_max = 0;
    for (int g = 0; g < BLOCKS * THREADS; g++)
        if ((g * 7919) % 10007 > expected_max) expected_max = (g * 7919) % 10007;
    assert_int_equal(counts[0], BLOCKS * THREADS);
    assert_int_equal(counts[1], 2 * BLOCKS * THREADS);
    assert_float_equal(sum, 0.1 * BLOCKS * THREADS, 0.1 * BLOCKS * THREADS * 1e-3);
    assert_int_equal(max_int, expected_max);
    assert_float_equal(max_float, 0.5f * (float)expected_max, 0.0f);
    assert_int_equal(winners[BLOCKS], BLOCKS);
    for (int b = 0; b < BLOCKS; b++) {
        assert_true(winners[b] >= (unsigned)b * THREADS + 1);
        assert_true(winners[b] <= (unsigned)(b + 1) * THREADS);
    }
    sim_pool_free(pool);
}

/* ---- errors ---- */

static void test_half_return_before_barrier_is_a_deadlock(void **state) {
    (void)state;
    sim_pool *pool = sim_pool_create(2);
    int out[64] = {0};
    void *args[] = {&(int *){out}};
    char error[512];
    sim_status status = launch(pool, KERNEL(sim_test_half_return), sim_dim3_make(1, 1, 1),
                               sim_dim3_make(64, 1, 1), 0, args, error, sizeof error);
    assert_int_equal(status, SIM_ERROR_DEADLOCK);
    assert_string_equal(error,
                        "kernel 'sim_test_half_return' block (0, 0, 0): __syncthreads() is not reached by "
                        "every thread of the block: 32 threads wait at it, 32 have returned");
    for (int i = 0; i < 64; i++)
        assert_int_equal(out[i], 0);

    /* Many blocks: one error, the launch stops, the pool stays usable. */
    status = launch(pool, KERNEL(sim_test_half_return), sim_dim3_make(50, 2, 1), sim_dim3_make(8, 2, 1), 0,
                    args, error, sizeof error);
    assert_int_equal(status, SIM_ERROR_DEADLOCK);
    assert_non_null(strstr(error, "8 threads wait at it, 8 have returned"));
    assert_true(strncmp(error, "kernel 'sim_test_half_return' block (", 37) == 0);
    check_indices(pool, sim_dim3_make(3, 1, 1), sim_dim3_make(64, 1, 1));
    sim_pool_free(pool);
}

static void test_warp_misuse_is_reported(void **state) {
    (void)state;
    sim_pool *pool = sim_pool_create(1);
    int out[64];
    float d[48];
    void *args[] = {&(int *){out}};
    char error[512];

    sim_status status = launch(pool, KERNEL(sim_test_warp_divergence), sim_dim3_make(1, 1, 1),
                               sim_dim3_make(64, 1, 1), 0, args, error, sizeof error);
    assert_int_equal(status, SIM_ERROR_DEADLOCK);
    assert_string_equal(
        error, "kernel 'sim_test_warp_divergence' block (0, 0, 0): __shfl_xor_sync() in warp 0 is not "
               "reached by every thread of the warp: 16 threads wait at it, 16 wait at __syncthreads()");

    /* A lane that leaves a reduction halfway, after the warp has run on
     * through its first shuffle. */
    status = launch(pool, KERNEL(sim_test_lane_leaves_reduction), sim_dim3_make(1, 1, 1),
                    sim_dim3_make(64, 1, 1), 0, args, error, sizeof error);
    assert_int_equal(status, SIM_ERROR_DEADLOCK);
    assert_string_equal(
        error, "kernel 'sim_test_lane_leaves_reduction' block (0, 0, 0): __shfl_xor_sync() in warp 0 is not "
               "reached by every thread of the warp: 31 threads wait at it, 1 wait at __syncthreads()");

    status = launch(pool, KERNEL(sim_test_mixed_warp_ops), sim_dim3_make(1, 1, 1), sim_dim3_make(32, 1, 1), 0,
                    args, error, sizeof error);
    assert_int_equal(status, SIM_ERROR_WARP_MISUSE);
    assert_string_equal(
        error, "kernel 'sim_test_mixed_warp_ops' block (0, 0, 0): threads of warp 0 wait at different "
               "warp operations: 16 at __shfl_xor_sync(), lane 16 at __ballot_sync()");

    status = launch(pool, KERNEL(sim_test_bad_mask), sim_dim3_make(1, 1, 1), sim_dim3_make(32, 1, 1), 0, args,
                    error, sizeof error);
    assert_int_equal(status, SIM_ERROR_WARP_MISUSE);
    assert_string_equal(error,
                        "kernel 'sim_test_bad_mask' block (0, 0, 0): __shfl_xor_sync() in warp 0, lane 16: "
                        "the mask 0x0000ffff does not include the calling lane");

    void *mma_args[] = {&(float *){d}};
    status = launch(pool, KERNEL(sim_test_mma_partial_warp), sim_dim3_make(1, 1, 1), sim_dim3_make(48, 1, 1),
                    0, mma_args, error, sizeof error);
    assert_int_equal(status, SIM_ERROR_WARP_MISUSE);
    assert_string_equal(
        error, "kernel 'sim_test_mma_partial_warp' block (0, 0, 0): smelt_mma_m16n8k16_bf16_f32() in "
               "warp 1 needs all 32 lanes of the warp; 16 take part");

    /* After abandoned blocks the worker's fibers start clean. */
    check_indices(pool, sim_dim3_make(2, 1, 1), sim_dim3_make(96, 1, 1));
    sim_pool_free(pool);
}

static void noop_kernel_entry(void **args) { (void)args; }

static void expect_invalid(sim_pool *pool, const sim_kernel *kernel, sim_dim3 grid, sim_dim3 block,
                           size_t shared, const char *message) {
    char error[512] = "";
    assert_int_equal(sim_launch(pool, kernel, grid, block, shared, NULL, error, sizeof error),
                     SIM_ERROR_INVALID_LAUNCH);
    assert_string_equal(error, message);
}

static void test_bad_launch_dimensions(void **state) {
    (void)state;
    sim_pool *pool = sim_pool_create(1);
    sim_kernel k = {"k", noop_kernel_entry};
    sim_dim3 one = sim_dim3_make(1, 1, 1);
    expect_invalid(pool, &k, one, sim_dim3_make(1025, 1, 1), 0,
                   "kernel 'k': block (1025, 1, 1) exceeds the limits (1024, 1024, 64)");
    expect_invalid(pool, &k, one, sim_dim3_make(32, 32, 2), 0,
                   "kernel 'k': block (32, 32, 2) has 2048 threads; expected at most 1024");
    expect_invalid(pool, &k, one, sim_dim3_make(1, 1, 65), 0,
                   "kernel 'k': block (1, 1, 65) exceeds the limits (1024, 1024, 64)");
    expect_invalid(pool, &k, sim_dim3_make(4, 0, 1), one, 0,
                   "kernel 'k': launch dimensions must be at least 1; found grid (4, 0, 1), block (1, 1, 1)");
    expect_invalid(pool, &k, one, sim_dim3_make(0, 1, 1), 0,
                   "kernel 'k': launch dimensions must be at least 1; found grid (1, 1, 1), block (0, 1, 1)");
    expect_invalid(pool, &k, sim_dim3_make(1, 65536, 1), one, 0,
                   "kernel 'k': grid (1, 65536, 1) exceeds the limits (2147483647, 65535, 65535)");
    expect_invalid(pool, &k, sim_dim3_make(2147483648u, 1, 1), one, 0,
                   "kernel 'k': grid (2147483648, 1, 1) exceeds the limits (2147483647, 65535, 65535)");
    expect_invalid(pool, &k, one, one, 227 * 1024 + 1,
                   "kernel 'k': 232449 bytes of dynamic shared memory requested; expected at most 232448");
    sim_kernel no_entry = {"k", NULL};
    expect_invalid(pool, &no_entry, one, one, 0, "launch of a kernel without a host entry function");
    expect_invalid(NULL, &k, one, one, 0, "launch without a simulator pool");

    /* A 1 MB name is cut in the message. */
    char *long_name = malloc(1 << 20);
    memset(long_name, 'n', (1 << 20) - 1);
    long_name[(1 << 20) - 1] = '\0';
    sim_kernel long_kernel = {long_name, noop_kernel_entry};
    char error[512];
    assert_int_equal(
        sim_launch(pool, &long_kernel, one, sim_dim3_make(2000, 1, 1), 0, NULL, error, sizeof error),
        SIM_ERROR_INVALID_LAUNCH);
    assert_true(strlen(error) < 200);
    assert_non_null(strstr(error, "nnn...': block (2000, 1, 1)"));
    /* No buffer for the message: still the status. */
    assert_int_equal(sim_launch(pool, &long_kernel, one, sim_dim3_make(2000, 1, 1), 0, NULL, NULL, 0),
                     SIM_ERROR_INVALID_LAUNCH);
    free(long_name);
    /* The largest legal dynamic shared memory works. */
    assert_int_equal(sim_launch(pool, &k, one, one, 227 * 1024, NULL, error, sizeof error), SIM_OK);
    sim_pool_free(pool);
}

/* A kernel that recurses past its fiber's stack; host-only. */
static int deep_recursion(int depth) {
    volatile char frame[1024];
    frame[0] = (char)depth;
    return depth > 0 ? deep_recursion(depth - 1) + frame[0] : frame[0];
}
static void stack_overflow_entry(void **args) { *(int *)args[0] = deep_recursion(100000); }

/* 60 KiB of locals in every thread: each fiber has its 64 KiB, whichever
 * cache colour its stack starts at (thread 63 starts 63 lines down). */
static int big_frame(int seed) {
    volatile unsigned char frame[60 * 1024];
    for (size_t i = 0; i < sizeof frame; i += 512)
        frame[i] = (unsigned char)(seed + (int)i);
    int sum = 0;
    for (size_t i = 0; i < sizeof frame; i += 512)
        sum += frame[i];
    return sum;
}
static void big_frame_entry(void **args) { smelt_atomic_add_i32(*(int **)args[0], big_frame(1) > 0); }

static void test_every_thread_has_its_whole_stack(void **state) {
    (void)state;
    fflush(NULL);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        sim_pool *pool = sim_pool_create(1);
        int count = 0;
        void *args[] = {&(int *){&count}};
        sim_kernel k = {"big_frame", big_frame_entry};
        sim_status status =
            sim_launch(pool, &k, sim_dim3_make(2, 1, 1), sim_dim3_make(128, 1, 1), 0, args, NULL, 0);
        _exit(status == SIM_OK && count == 256 ? 0 : 3);
    }
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    assert_true(WIFEXITED(status));
    assert_int_equal(WEXITSTATUS(status), 0);
}

static void test_stack_overflow_hits_the_guard_page(void **state) {
    (void)state;
    fflush(NULL);
    pid_t child = fork();
    assert_true(child >= 0);
    if (child == 0) {
        int quiet = open("/dev/null", O_WRONLY); /* the crash report is expected */
        if (quiet >= 0) dup2(quiet, STDERR_FILENO);
        sim_pool *pool = sim_pool_create(1);
        int result = 0;
        void *args[] = {&result};
        sim_kernel k = {"overflow", stack_overflow_entry};
        sim_launch(pool, &k, sim_dim3_make(1, 1, 1), sim_dim3_make(2, 1, 1), 0, args, NULL, 0);
        _exit(0); /* reaching here would mean the overflow went unnoticed */
    }
    int status = 0;
    assert_int_equal(waitpid(child, &status, 0), child);
    /* SIGSEGV, or ASan's report of it (it exits or aborts). */
    assert_true(WIFSIGNALED(status) || (WIFEXITED(status) && WEXITSTATUS(status) != 0));
}

/* ---- bf16 ---- */

static float float_of_bits(uint32_t bits) {
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static void test_bf16_conversion_bits(void **state) {
    (void)state;
    assert_int_equal(smelt_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(smelt_f32_to_bf16(-2.0f), 0xc000);
    assert_int_equal(smelt_f32_to_bf16(0.0f), 0x0000);
    assert_int_equal(smelt_f32_to_bf16(-0.0f), 0x8000);
    /* Exactly halfway: ties go to the even neighbour. */
    assert_int_equal(smelt_f32_to_bf16(float_of_bits(0x3f808000u)), 0x3f80);
    assert_int_equal(smelt_f32_to_bf16(float_of_bits(0x3f818000u)), 0x3f82);
    /* Off halfway: to the nearer. */
    assert_int_equal(smelt_f32_to_bf16(float_of_bits(0x3f808001u)), 0x3f81);
    assert_int_equal(smelt_f32_to_bf16(float_of_bits(0x3f807fffu)), 0x3f80);
    /* Mantissa carry into the exponent, and overflow to infinity. */
    assert_int_equal(smelt_f32_to_bf16(float_of_bits(0x3fffffffu)), 0x4000);
    assert_int_equal(smelt_f32_to_bf16(float_of_bits(0x7f7fffffu)), 0x7f80);
    assert_int_equal(smelt_f32_to_bf16(INFINITY), 0x7f80);
    assert_int_equal(smelt_f32_to_bf16(-INFINITY), 0xff80);
    /* NaN stays NaN, even a signalling NaN whose payload sits in the low bits. */
    assert_int_equal(smelt_f32_to_bf16(float_of_bits(0x7fc00000u)), 0x7fc0);
    assert_int_equal(smelt_f32_to_bf16(float_of_bits(0x7f800001u)), 0x7fc0);
    assert_int_equal(smelt_f32_to_bf16(float_of_bits(0xffffffffu)), 0xffff);
    assert_true(isnan(smelt_bf16_to_f32(smelt_f32_to_bf16(NAN))));
    /* Subnormals round like everything else. */
    assert_int_equal(smelt_f32_to_bf16(float_of_bits(0x00018000u)), 0x0002);
    assert_float_equal(smelt_bf16_to_f32(0x3f80), 1.0f, 0.0f);
    assert_float_equal(smelt_bf16_to_f32(0xc040), -3.0f, 0.0f);
    assert_int_equal(smelt_bf16x2_pack(0x1234, 0xabcd), 0xabcd1234u);

    /* The same functions run inside a kernel. */
    sim_pool *pool = sim_pool_create(1);
    enum { N = 40 };
    float in[N], back[N];
    smelt_bf16 bits[N];
    for (int i = 0; i < N; i++)
        in[i] = (float)(i - 20) * 0.3333f;
    int n = N;
    void *args[] = {&(const float *){in}, &(smelt_bf16 *){bits}, &(float *){back}, &n};
    launch_ok(pool, KERNEL(sim_test_bf16), sim_dim3_make(2, 1, 1), sim_dim3_make(32, 1, 1), 0, args);
    for (int i = 0; i < N; i++) {
        assert_int_equal(bits[i], smelt_f32_to_bf16(in[i]));
        assert_float_equal(back[i], in[i], fabsf(in[i]) / 256.0f); /* 8 mantissa bits */
    }
    sim_pool_free(pool);
}

/* smelt_kernel.h keeps its own bf16 conversions (it must stand alone): they
 * give plan/numeric.h's bits for every bf16 and for f32 bit patterns across
 * the whole range (every 4093rd, plus the neighbours of every tie and of
 * infinity). */
/* The quantized weights' f16 scales and E4M3 codes: every bit pattern
 * converts to plan/numeric.h's value (NaNs to NaNs). */
static void test_f16_conversion_matches_plan_numeric(void **state) {
    (void)state;
    for (uint32_t h = 0; h <= 0xffffu; h++) {
        float kernel = smelt_f16_to_f32((uint16_t)h), plan = plan_f16_to_f32((uint16_t)h);
        if (isnan(plan))
            assert_true(isnan(kernel));
        else
            assert_memory_equal(&kernel, &plan, sizeof kernel);
    }
    assert_float_equal(smelt_f16_to_f32(0x3c00), 1.0f, 0.0f);
}

static void test_bf16_conversion_matches_plan_numeric(void **state) {
    (void)state;
    for (uint32_t h = 0; h <= 0xffffu; h++) {
        uint32_t kernel_bits, plan_bits;
        float kernel = smelt_bf16_to_f32((smelt_bf16)h), plan = plan_bf16_to_f32((uint16_t)h);
        memcpy(&kernel_bits, &kernel, sizeof kernel_bits);
        memcpy(&plan_bits, &plan, sizeof plan_bits);
        assert_int_equal(kernel_bits, plan_bits);
        uint32_t tie = h << 16 | 0x8000u;
        for (uint32_t bits = tie - 1; bits != tie + 2; bits++)
            assert_int_equal(smelt_f32_to_bf16(float_of_bits(bits)), plan_f32_to_bf16(float_of_bits(bits)));
    }
    for (uint64_t bits = 0; bits <= 0xffffffffu; bits += 4093)
        assert_int_equal(smelt_f32_to_bf16(float_of_bits((uint32_t)bits)),
                         plan_f32_to_bf16(float_of_bits((uint32_t)bits)));
    for (uint32_t bits = 0x7f7ffff0u; bits != 0x7f800010u; bits++)
        assert_int_equal(smelt_f32_to_bf16(float_of_bits(bits)), plan_f32_to_bf16(float_of_bits(bits)));
}

/* ---- f16 (--act f16) ---- */

/* Hand-computed roundings: f16 has 10 mantissa bits, exponents -14..15,
 * subnormals of 2^-24 each, largest finite 65504 (0x7bff). */
static void test_f16_conversion_bits(void **state) {
    (void)state;
    assert_int_equal(smelt_f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(smelt_f32_to_f16(-2.0f), 0xc000);
    assert_int_equal(smelt_f32_to_f16(0.0f), 0x0000);
    assert_int_equal(smelt_f32_to_f16(-0.0f), 0x8000);
    assert_int_equal(smelt_f32_to_f16(0.1f), 0x2e66); /* 0.0999755859375 */
    /* Ties go to the even neighbour: 1 + 2^-11 between 0x3c00 and 0x3c01,
     * 1 + 3 * 2^-11 between 0x3c01 and 0x3c02; 2049 between 2048 and 2050. */
    assert_int_equal(smelt_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
    assert_int_equal(smelt_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);
    assert_int_equal(smelt_f32_to_f16(2049.0f), 0x6800);
    assert_int_equal(smelt_f32_to_f16(2051.0f), 0x6802);
    /* Off halfway: to the nearer. */
    assert_int_equal(smelt_f32_to_f16(float_of_bits(0x3f801001u)), 0x3c01);
    assert_int_equal(smelt_f32_to_f16(float_of_bits(0x3f800fffu)), 0x3c00);
    /* Mantissa carry into the exponent: 2 - 2^-12 rounds up to 2. */
    assert_int_equal(smelt_f32_to_f16(2.0f - 0x1p-12f), 0x4000);
    /* The top: 65504 is finite, 65519 rounds down to it, 65520 (the tie with
     * 65536) goes to the even neighbour, infinity, as does anything larger. */
    assert_int_equal(smelt_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(smelt_f32_to_f16(65519.0f), 0x7bff);
    assert_int_equal(smelt_f32_to_f16(65520.0f), 0x7c00);
    assert_int_equal(smelt_f32_to_f16(-1e5f), 0xfc00);
    assert_int_equal(smelt_f32_to_f16(float_of_bits(0x7f7fffffu)), 0x7c00);
    assert_int_equal(smelt_f32_to_f16(INFINITY), 0x7c00);
    assert_int_equal(smelt_f32_to_f16(-INFINITY), 0xfc00);
    /* Subnormals (no flush to zero): 2^-24 is 0x0001; 2^-25 ties to 0, a hair
     * more to 1; 3 * 2^-25 ties between 1 and 2, to 2; 2^-14 - 2^-25 ties
     * between the largest subnormal and the smallest normal, to 0x0400. */
    assert_int_equal(smelt_f32_to_f16(0x1p-24f), 0x0001);
    assert_int_equal(smelt_f32_to_f16(0x1p-25f), 0x0000);
    assert_int_equal(smelt_f32_to_f16(float_of_bits(0x33000001u)), 0x0001);
    assert_int_equal(smelt_f32_to_f16(3 * 0x1p-25f), 0x0002);
    assert_int_equal(smelt_f32_to_f16(-(0x1p-14f - 0x1p-25f)), 0x8400);
    assert_int_equal(smelt_f32_to_f16(0x1p-14f - 0x1p-24f), 0x03ff);
    assert_int_equal(smelt_f32_to_f16(0x1p-14f), 0x0400);
    assert_int_equal(smelt_f32_to_f16(-0x1p-30f), 0x8000);
    /* NaN becomes the quiet NaN of its sign, even a signalling one. */
    assert_int_equal(smelt_f32_to_f16(float_of_bits(0x7fc00000u)), 0x7e00);
    assert_int_equal(smelt_f32_to_f16(float_of_bits(0x7f800001u)), 0x7e00);
    assert_int_equal(smelt_f32_to_f16(float_of_bits(0xffffffffu)), 0xfe00);
    assert_float_equal(smelt_f16_to_f32(0x0001), 0x1p-24f, 0.0f);
    assert_float_equal(smelt_f16_to_f32(0x7bff), 65504.0f, 0.0f);
    assert_float_equal(smelt_f16_to_f32(0xc500), -5.0f, 0.0f);
    assert_true(isinf(smelt_f16_to_f32(0xfc00)) && smelt_f16_to_f32(0xfc00) < 0);
    assert_true(isnan(smelt_f16_to_f32(0x7e00)));
    assert_int_equal(smelt_f16x2_pack(0x1234, 0xabcd), 0xabcd1234u);
    uint4 chunk = {0x3c00bc00u, 0x00017bffu, 0x80000400u, 0x7c00c500u};
    float unpacked[8];
    smelt_unpack_f16x8(chunk, unpacked);
    const float expected[8] = {-1.0f, 1.0f, 65504.0f, 0x1p-24f, 0x1p-14f, -0.0f, -5.0f, INFINITY};
    assert_memory_equal(unpacked, expected, sizeof expected);

    /* The same functions run inside a kernel. */
    sim_pool *pool = sim_pool_create(1);
    enum { N = 40 };
    float in[N], back[N];
    smelt_f16 bits[N];
    for (int i = 0; i < N; i++)
        in[i] = (float)(i - 20) * 0.3333f;
    int n = N;
    void *args[] = {&(const float *){in}, &(smelt_f16 *){bits}, &(float *){back}, &n};
    launch_ok(pool, KERNEL(sim_test_f16), sim_dim3_make(2, 1, 1), sim_dim3_make(32, 1, 1), 0, args);
    for (int i = 0; i < N; i++) {
        assert_int_equal(bits[i], smelt_f32_to_f16(in[i]));
        assert_float_equal(back[i], in[i], fabsf(in[i]) / 2048.0f); /* 11 significant bits */
    }
    sim_pool_free(pool);
}

/* smelt_kernel.h's narrowing gives plan/numeric.h's bits: f32 patterns
 * across the whole range (every 4093rd), and for every f16 value the
 * midpoint to its successor with its f32 neighbours (the ties of every
 * binade, subnormals included), and around the overflow edge. */
static void test_f16_narrowing_matches_plan_numeric(void **state) {
    (void)state;
    for (uint64_t bits = 0; bits <= 0xffffffffu; bits += 4093)
        assert_int_equal(smelt_f32_to_f16(float_of_bits((uint32_t)bits)),
                         plan_f32_to_f16(float_of_bits((uint32_t)bits)));
    for (uint32_t h = 0; h < 0x7c00u; h++) {
        for (uint32_t sign = 0; sign <= 0x8000u; sign += 0x8000u) {
            float mid =
                (plan_f16_to_f32((uint16_t)(h | sign)) + plan_f16_to_f32((uint16_t)((h + 1) | sign))) / 2;
            uint32_t m;
            memcpy(&m, &mid, sizeof m);
            for (uint32_t bits = m - 1; bits != m + 2; bits++)
                assert_int_equal(smelt_f32_to_f16(float_of_bits(bits)), plan_f32_to_f16(float_of_bits(bits)));
        }
    }
    for (uint32_t bits = 0x477fe000u; bits != 0x47800010u; bits++)
        assert_int_equal(smelt_f32_to_f16(float_of_bits(bits)), plan_f32_to_f16(float_of_bits(bits)));
}

/* Both against numpy's float32 -> float16 cast, an independent
 * implementation (tests/reference/make_f16_fixture.py: edges, ties of
 * normals and subnormals, overflow, NaNs, random patterns). numpy keeps a
 * NaN's payload bits; smelt gives the quiet NaN of the same sign. */
static void test_f16_narrowing_matches_numpy(void **state) {
    (void)state;
    FILE *f = fopen(SMELT_SOURCE_DIR "/tests/fixtures/f16/numpy_float16.bin", "rb");
    assert_non_null(f);
    char magic[8];
    uint32_t count = 0;
    assert_int_equal(fread(magic, 1, 8, f), 8);
    assert_memory_equal(magic, "F16NPY01", 8);
    assert_int_equal(fread(&count, sizeof count, 1, f), 1);
    assert_true(count > 3000);
    uint32_t nans = 0, subnormals = 0, infinities = 0;
    for (uint32_t i = 0; i < count; i++) {
        uint8_t record[6];
        assert_int_equal(fread(record, 1, 6, f), 6);
        uint32_t bits = (uint32_t)record[0] | (uint32_t)record[1] << 8 | (uint32_t)record[2] << 16 |
                        (uint32_t)record[3] << 24;
        uint16_t numpy = (uint16_t)(record[4] | record[5] << 8);
        float x = float_of_bits(bits);
        uint16_t kernel = smelt_f32_to_f16(x), plan = plan_f32_to_f16(x);
        assert_int_equal(kernel, plan);
        if ((numpy & 0x7c00u) == 0x7c00u && (numpy & 0x3ffu)) { /* NaN */
            assert_int_equal(kernel, (numpy & 0x8000u) | 0x7e00u);
            nans++;
            continue;
        }
        if (kernel != numpy) fprintf(stderr, "f32 0x%08x: smelt 0x%04x, numpy 0x%04x\n", bits, kernel, numpy);
        assert_int_equal(kernel, numpy);
        subnormals += (numpy & 0x7c00u) == 0 && (numpy & 0x3ffu) != 0;
        infinities += (numpy & 0x7fffu) == 0x7c00u;
    }
    fclose(f);
    assert_true(nans >= 5 && subnormals >= 100 && infinities >= 10); /* the file covers them */
}

/* ---- f8e4m3 ---- */

/* smelt_kernel.h's f8e4m3 conversions (the KV cache's) give plan/numeric.h's
 * bits: every code widened, f32 bit patterns across the whole range (every
 * 4093rd) narrowed, and around every code the neighbours of its ties with
 * the next code (round to nearest even) and the saturation at 448. */
static void test_f8e4m3_conversion_matches_plan_numeric(void **state) {
    (void)state;
    for (uint32_t code = 0; code <= 0xffu; code++) {
        float kernel = smelt_f8e4m3_to_f32((smelt_f8e4m3)code), plan = plan_f8e4m3_to_f32((uint8_t)code);
        uint32_t kernel_bits, plan_bits;
        memcpy(&kernel_bits, &kernel, sizeof kernel_bits);
        memcpy(&plan_bits, &plan, sizeof plan_bits);
        if (isnan(plan))
            assert_true(isnan(kernel) && signbit(kernel) == signbit(plan));
        else
            assert_int_equal(kernel_bits, plan_bits);
        if ((code & 0x7fu) >= 0x7eu || isnan(plan)) continue;
        /* the tie between this code and the next magnitude, and its neighbours */
        float next = plan_f8e4m3_to_f32((uint8_t)(code + 1));
        uint32_t tie = plan_f32_to_bits((plan + next) / 2.0f);
        for (uint32_t bits = tie - 2; bits != tie + 3; bits++)
            assert_int_equal(smelt_f32_to_f8e4m3(float_of_bits(bits)),
                             plan_f32_to_f8e4m3(float_of_bits(bits)));
    }
    for (uint64_t bits = 0; bits <= 0xffffffffu; bits += 4093)
        assert_int_equal(smelt_f32_to_f8e4m3(float_of_bits((uint32_t)bits)),
                         plan_f32_to_f8e4m3(float_of_bits((uint32_t)bits)));
    assert_int_equal(smelt_f32_to_f8e4m3(448.0f), 0x7e);
    assert_int_equal(smelt_f32_to_f8e4m3(1e9f), 0x7e);      /* saturates */
    assert_int_equal(smelt_f32_to_f8e4m3(-INFINITY), 0xfe); /* no infinity */
    assert_int_equal(smelt_f32_to_f8e4m3(NAN) & 0x7f, 0x7f);
    assert_int_equal(smelt_f32_to_f8e4m3(0.001953125f), 0x01);  /* the least subnormal, 2^-9 */
    assert_int_equal(smelt_f32_to_f8e4m3(0.0009765625f), 0x00); /* half of it: a tie, to even */
    assert_float_equal(smelt_f8e4m3_row_scale(0.0f), 1.0f, 0.0f);
    assert_float_equal(smelt_f8e4m3_row_scale(896.0f), plan_f8e4m3_row_scale(896.0f), 0.0f);
    /* sixteen codes of one 16-byte load, low byte first */
    uint4 chunk = {0x03020100u, 0x07060504u, 0x38b8407eu, 0xfe7f0880u};
    float out[16];
    smelt_unpack_f8e4m3x16(chunk, out);
    for (int i = 0; i < 8; i++)
        assert_float_equal(out[i], plan_f8e4m3_to_f32((uint8_t)i), 0.0f);
    assert_float_equal(out[8], 448.0f, 0.0f);
    assert_float_equal(out[9], 2.0f, 0.0f);
    assert_float_equal(out[10], -1.0f, 0.0f);
    assert_float_equal(out[11], 1.0f, 0.0f);
    assert_float_equal(out[13], 0.015625f, 0.0f); /* 0x08: the least normal, 2^-6 */
    assert_true(isnan(out[14]));
    assert_float_equal(out[15], -448.0f, 0.0f);
}

/* ---- tensor cores ---- */

static uint32_t random_state = 12345;
static uint32_t next_random(void) {
    random_state = random_state * 1664525u + 1013904223u;
    return random_state >> 8;
}
static float random_unit(void) { return (float)(next_random() % 2001) / 1000.0f - 1.0f; }

static void test_ldmatrix_x4_layout(void **state) {
    (void)state;
    sim_pool *pool = sim_pool_create(1);
    smelt_bf16 tile[32 * 8];
    for (int i = 0; i < 32 * 8; i++)
        tile[i] = (smelt_bf16)(0x1000 + i);
    uint32_t rows[32 * 4];
    void *args[] = {&(const smelt_bf16 *){tile}, &(uint32_t *){rows}};
    launch_ok(pool, KERNEL(sim_test_ldmatrix), sim_dim3_make(1, 1, 1), sim_dim3_make(32, 1, 1), 0, args);
    for (int lane = 0; lane < 32; lane++)
        for (int m = 0; m < 4; m++) {
            int row = m * 8 + lane / 4, column = 2 * (lane % 4);
            uint32_t expected = (uint32_t)tile[row * 8 + column] | (uint32_t)tile[row * 8 + column + 1] << 16;
            assert_int_equal(rows[lane * 4 + m], expected);
        }
    /* By hand: lane 5 gets row 1, columns 2 and 3 of matrix 0: elements 10 and 11. */
    assert_int_equal(rows[5 * 4 + 0], 0x100b100au);
    /* lane 30, matrix 3: row 24 + 7 = 31, columns 4, 5: elements 252, 253. */
    assert_int_equal(rows[30 * 4 + 3], 0x10fd10fcu);
    sim_pool_free(pool);
}

static void test_mma_m16n8k16_against_triple_loop(void **state) {
    (void)state;
    sim_pool *pool = sim_pool_create(1);
    for (int trial = 0; trial < 6; trial++) {
        smelt_bf16 a[16 * 16], b[16 * 8];
        float c[16 * 8], d[16 * 8];
        for (int i = 0; i < 16 * 16; i++)
            a[i] = smelt_f32_to_bf16(random_unit() * 4.0f);
        for (int i = 0; i < 16 * 8; i++)
            b[i] = smelt_f32_to_bf16(random_unit());
        for (int i = 0; i < 16 * 8; i++)
            c[i] = trial == 0 ? 0.0f : random_unit();
        int in_place = trial % 2;
        void *args[] = {&(const smelt_bf16 *){a}, &(const smelt_bf16 *){b}, &(const float *){c},
                        &(float *){d}, &in_place};
        launch_ok(pool, KERNEL(sim_test_mma), sim_dim3_make(1, 1, 1), sim_dim3_make(32, 1, 1), 0, args);
        for (int m = 0; m < 16; m++)
            for (int n = 0; n < 8; n++) {
                float expected = c[m * 8 + n];
                for (int k = 0; k < 16; k++)
                    expected += smelt_bf16_to_f32(a[m * 16 + k]) * smelt_bf16_to_f32(b[k * 8 + n]);
                assert_float_equal(d[m * 8 + n], expected, 1e-6f * fmaxf(1.0f, fabsf(expected)));
            }
    }
    /* A single 1 placed at A[3][5] and B[5][6] lands at D[3][6] only. */
    smelt_bf16 a[16 * 16] = {0}, b[16 * 8] = {0};
    float c[16 * 8] = {0}, d[16 * 8];
    a[3 * 16 + 5] = 0x3f80;
    b[5 * 8 + 6] = 0x4000; /* 2.0 */
    int in_place = 0;
    void *args[] = {&(const smelt_bf16 *){a}, &(const smelt_bf16 *){b}, &(const float *){c}, &(float *){d},
                    &in_place};
    launch_ok(pool, KERNEL(sim_test_mma), sim_dim3_make(1, 1, 1), sim_dim3_make(32, 1, 1), 0, args);
    for (int i = 0; i < 16 * 8; i++)
        assert_float_equal(d[i], i == 3 * 8 + 6 ? 2.0f : 0.0f, 0.0f);
    sim_pool_free(pool);
}

/* The f16 twin: smelt_mma_m16n8k16_f16_f32 against the same triple loop
 * (products of f16 are exact in f32), on values bf16 could not hold exactly. */
static void test_mma_m16n8k16_f16_against_triple_loop(void **state) {
    (void)state;
    sim_pool *pool = sim_pool_create(1);
    for (int trial = 0; trial < 4; trial++) {
        smelt_f16 a[16 * 16], b[16 * 8];
        float c[16 * 8], d[16 * 8];
        for (int i = 0; i < 16 * 16; i++)
            a[i] = smelt_f32_to_f16(random_unit() * 4.0f);
        for (int i = 0; i < 16 * 8; i++)
            b[i] = smelt_f32_to_f16(random_unit());
        for (int i = 0; i < 16 * 8; i++)
            c[i] = trial == 0 ? 0.0f : random_unit();
        void *args[] = {&(const smelt_f16 *){a}, &(const smelt_f16 *){b}, &(const float *){c}, &(float *){d}};
        launch_ok(pool, KERNEL(sim_test_mma_f16), sim_dim3_make(1, 1, 1), sim_dim3_make(32, 1, 1), 0, args);
        for (int m = 0; m < 16; m++)
            for (int n = 0; n < 8; n++) {
                float expected = c[m * 8 + n];
                for (int k = 0; k < 16; k++)
                    expected += smelt_f16_to_f32(a[m * 16 + k]) * smelt_f16_to_f32(b[k * 8 + n]);
                assert_float_equal(d[m * 8 + n], expected, 1e-6f * fmaxf(1.0f, fabsf(expected)));
            }
    }
    /* 1 + 2^-10 (f16 0x3c01; bf16 would round it to 1) at A[3][5] times 2 at
     * B[5][6] lands at D[3][6] only, exactly: the inputs are read as f16. */
    smelt_f16 a[16 * 16] = {0}, b[16 * 8] = {0};
    float c[16 * 8] = {0}, d[16 * 8];
    a[3 * 16 + 5] = 0x3c01;
    b[5 * 8 + 6] = 0x4000; /* 2.0 */
    void *args[] = {&(const smelt_f16 *){a}, &(const smelt_f16 *){b}, &(const float *){c}, &(float *){d}};
    launch_ok(pool, KERNEL(sim_test_mma_f16), sim_dim3_make(1, 1, 1), sim_dim3_make(32, 1, 1), 0, args);
    for (int i = 0; i < 16 * 8; i++)
        assert_float_equal(d[i], i == 3 * 8 + 6 ? 2.0f + 0x1p-9f : 0.0f, 0.0f);
    sim_pool_free(pool);
}

/* ---- NVRTC: the same text compiles for the GPU ---- */

#ifdef SMELT_HAVE_NVRTC
static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)size + 1);
    size_t got = fread(text, 1, (size_t)size, f);
    text[got] = '\0';
    fclose(f);
    return text;
}

#endif

static void test_nvrtc_compiles_the_same_kernels(void **state) {
    (void)state;
#ifndef SMELT_HAVE_NVRTC
    skip();
#else
    char *header = read_text(SMELT_SOURCE_DIR "/runtime/smelt_kernel.h");
    char *kernels = read_text(SMELT_SOURCE_DIR "/tests/unit/kernels/host_sim_kernels.cu");
    assert_non_null(header);
    assert_non_null(kernels);
    const char *architectures[] = {"--gpu-architecture=sm_80", "--gpu-architecture=sm_90"};
    for (int i = 0; i < 2; i++) {
        nvrtcProgram program;
        const char *headers[] = {header};
        const char *include_names[] = {"smelt_kernel.h"};
        assert_int_equal(
            nvrtcCreateProgram(&program, kernels, "host_sim_kernels.cu", 1, headers, include_names),
            NVRTC_SUCCESS);
        const char *options[] = {architectures[i]};
        nvrtcResult result = nvrtcCompileProgram(program, 1, options);
        size_t log_size = 0;
        nvrtcGetProgramLogSize(program, &log_size);
        char *log = malloc(log_size + 1);
        nvrtcGetProgramLog(program, log);
        if (result != NVRTC_SUCCESS) fprintf(stderr, "%s:\n%s\n", architectures[i], log);
        assert_int_equal(result, NVRTC_SUCCESS);
        size_t cubin_size = 0;
        assert_int_equal(nvrtcGetCUBINSize(program, &cubin_size), NVRTC_SUCCESS);
        assert_true(cubin_size > 0);
        char *cubin = malloc(cubin_size);
        assert_int_equal(nvrtcGetCUBIN(program, cubin), NVRTC_SUCCESS);
        /* extern "C": the kernels keep their names in the cubin. */
        const char *names[] = {"sim_test_mma", "sim_test_mma_f16", "sim_test_warp_ops",
                               "sim_test_shared_isolation", "sim_test_atomics"};
        for (int n = 0; n < 5; n++) {
            int found = 0;
            size_t length = strlen(names[n]);
            for (size_t at = 0; at + length <= cubin_size && !found; at++)
                found = memcmp(cubin + at, names[n], length) == 0 && cubin[at + length] == '\0';
            assert_true(found);
        }
        free(cubin);
        free(log);
        nvrtcDestroyProgram(&program);
    }
    free(header);
    free(kernels);
#endif
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_fiber_switches_back_and_forth),
        cmocka_unit_test(test_indices_over_3d_grids_and_blocks),
        cmocka_unit_test(test_pool_of_zero_workers_uses_every_core),
        cmocka_unit_test(test_launches_from_several_threads),
        cmocka_unit_test(test_syncthreads_orders_shared_memory),
        cmocka_unit_test(test_shared_memory_reduction),
        cmocka_unit_test(test_shared_memory_is_per_block),
        cmocka_unit_test(test_barrier_loop_many_blocks),
        cmocka_unit_test(test_shuffles_and_votes_with_partial_warp),
        cmocka_unit_test(test_xor_shuffle_paths),
        cmocka_unit_test(test_returning_lanes_complete_a_shuffle),
        cmocka_unit_test(test_rms_norm_example),
        cmocka_unit_test(test_cp_async_and_math),
        cmocka_unit_test(test_atomics_from_many_blocks),
        cmocka_unit_test(test_half_return_before_barrier_is_a_deadlock),
        cmocka_unit_test(test_warp_misuse_is_reported),
        cmocka_unit_test(test_bad_launch_dimensions),
        cmocka_unit_test(test_every_thread_has_its_whole_stack),
        cmocka_unit_test(test_stack_overflow_hits_the_guard_page),
        cmocka_unit_test(test_bf16_conversion_bits),
        cmocka_unit_test(test_bf16_conversion_matches_plan_numeric),
        cmocka_unit_test(test_f8e4m3_conversion_matches_plan_numeric),
        cmocka_unit_test(test_f16_conversion_matches_plan_numeric),
        cmocka_unit_test(test_f16_conversion_bits),
        cmocka_unit_test(test_f16_narrowing_matches_plan_numeric),
        cmocka_unit_test(test_f16_narrowing_matches_numpy),
        cmocka_unit_test(test_ldmatrix_x4_layout),
        cmocka_unit_test(test_mma_m16n8k16_against_triple_loop),
        cmocka_unit_test(test_mma_m16n8k16_f16_against_triple_loop),
        cmocka_unit_test(test_nvrtc_compiles_the_same_kernels),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
