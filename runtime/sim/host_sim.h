/* host_sim.h - the host simulator: runs smelt kernels on CPU threads.
 *
 * Kernels are compiled by the host C compiler from the same text NVRTC
 * compiles (runtime/smelt_kernel.h explains the two halves). A launch here
 * behaves like cuLaunchKernel, synchronously:
 *
 *   sim_pool *pool = sim_pool_create(0);                  // one worker per core
 *   sim_kernel k = {"rms_norm_64", rms_norm_64__host_entry};
 *   void *args[] = {&x, &w, &y, &tokens};                 // pointers to each argument
 *   char error[256];
 *   if (sim_launch(pool, &k, sim_dim3_make(tokens, 1, 1), sim_dim3_make(64, 1, 1), 0, args,
 *                  error, sizeof error) != SIM_OK) fprintf(stderr, "%s\n", error);
 *   sim_pool_free(pool);
 *
 * How it runs: blocks are handed to the pool's workers through an atomic
 * counter (worker 0 is the thread that calls sim_launch); a worker runs one
 * block at a time, each CUDA thread of it as a fiber on a 64 KiB stack
 * (256 KiB under ASan; guard page below; one mapping per worker, reused by
 * every block and launch). Fibers run until they return or wait at a
 * barrier: the block barrier (__syncthreads) releases when every live thread
 * of the block has arrived, a warp barrier (shuffles, votes, __syncwarp,
 * mma, ldmatrix) when every live lane of the warp has; the lanes a warp
 * barrier releases run next, so a warp runs on through its shuffles before
 * another warp takes over (host_sim_block.h). A barrier that can never release (some
 * threads returned while others wait at __syncthreads; lanes of one warp
 * waiting at different barriers) stops the launch with SIM_ERROR_DEADLOCK
 * and a message naming the kernel, the block and what each thread waits at.
 * A thread that overflows its stack hits the guard page and the process
 * dies with SIGSEGV (or, for stacks that got no guard page because the
 * process ran out of mappings, the launch fails with SIM_ERROR_STACK_OVERFLOW
 * when the block ends; see fiber.h).
 *
 * The pool runs one launch at a time (sim_launch serializes callers). A host
 * kernel object loaded with dlopen must resolve the smelt_sim_* symbols of
 * this library from the process (link the executable with --export-dynamic),
 * and reads smelt_sim_current with the initial-exec TLS model: the library
 * must be part of the executable or of a library loaded with it, not
 * dlopen()ed itself.
 */
#ifndef SMELT_HOST_SIM_H
#define SMELT_HOST_SIM_H

#include <stddef.h>

typedef struct sim_pool sim_pool;

typedef struct sim_dim3 {
    unsigned x, y, z;
} sim_dim3;

static inline sim_dim3 sim_dim3_make(unsigned x, unsigned y, unsigned z) {
    sim_dim3 d = {x, y, z};
    return d;
}

/* A kernel as the simulator sees it: its name (for messages) and the host
 * entry that unpacks the cuLaunchKernel-style argument array. */
typedef struct sim_kernel {
    const char *name;
    void (*host_entry)(void **args);
} sim_kernel;

typedef enum sim_status {
    SIM_OK = 0,
    SIM_ERROR_INVALID_LAUNCH, /* bad dims, shared memory size, or kernel */
    SIM_ERROR_DEADLOCK,       /* a barrier that not every thread can reach */
    SIM_ERROR_WARP_MISUSE, /* lanes at different warp operations, a mask without the caller, a partial warp at
                              mma */
    SIM_ERROR_OUT_OF_MEMORY,  /* fiber stacks or shared memory could not be mapped */
    SIM_ERROR_STACK_OVERFLOW, /* a thread overran a fiber stack that had no guard page */
} sim_status;

/* Limits checked at launch, those of sm_90. */
enum {
    SIM_MAX_THREADS_PER_BLOCK = 1024,
    SIM_MAX_BLOCK_DIM_Z = 64,
    SIM_MAX_GRID_DIM_YZ = 65535,
    SIM_MAX_DYNAMIC_SHARED_BYTES = 227 * 1024,
};
#define SIM_MAX_GRID_DIM_X 2147483647u

/* workers == 0: one per online core. NULL when threads or memory cannot be
 * had. */
sim_pool *sim_pool_create(unsigned workers);
void sim_pool_free(sim_pool *pool);
unsigned sim_pool_worker_count(const sim_pool *pool);

/* Runs every block of the grid and returns when all have finished, or when
 * the first error has stopped the launch (blocks not yet started are not
 * run). On error, `error` (when error_size > 0) holds one line without a
 * trailing newline. `args` is passed unchanged to every thread's entry. */
sim_status sim_launch(sim_pool *pool, const sim_kernel *kernel, sim_dim3 grid, sim_dim3 block,
                      size_t dynamic_shared_bytes, void **args, char *error, size_t error_size);

const char *sim_status_name(sim_status status);

#endif
