/* host_sim.c - the host simulator's workers, launches, blocks and the block
 * barrier (the warp barrier is in host_sim_warp.c; the design is described
 * in host_sim.h and host_sim_block.h).
 *
 * A launch is posted to every worker of the pool; each worker takes block
 * numbers from one atomic counter until they run out or an error stops the
 * launch, runs each block to completion on its own fibers, and reports back.
 * Worker 0 is the thread that calls sim_launch (a pool of N workers starts
 * N - 1 threads): it starts on the blocks at once instead of sleeping while
 * the others wake up, which is most of a small launch, and when the blocks
 * run out it closes the launch and waits only for the workers that joined
 * it before that (a worker still asleep, or descheduled on a busy machine,
 * holds nothing up). The other workers, done with a launch, watch for the
 * next one for a short while (SIM_SPIN_NANOSECONDS) before they sleep, as a
 * decode step posts its launches back to back. Per worker and reused across blocks and launches:
 * the fiber stacks, the thread and warp records, the run queue and the
 * dynamic shared memory.
 */
#include "host_sim_block.h"

#include <pthread.h>
#include <sched.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* The fiber running on this worker thread, read by every threadIdx. */
_Thread_local const smelt_sim_thread_view *smelt_sim_current;

#if defined(__SANITIZE_ADDRESS__)
#define SIM_STACK_SIZE (256u * 1024u) /* ASan's redzones make frames several times larger */
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
#define SIM_STACK_SIZE (256u * 1024u)
#endif
#endif
#ifndef SIM_STACK_SIZE
#define SIM_STACK_SIZE (64u * 1024u)
#endif

enum { SIM_MAX_WORKERS = 1024, SIM_KERNEL_NAME_MAX = 64, SIM_DYNAMIC_SHARED_ALIGNMENT = 128 };

/* Fiber i's stack starts (i % SIM_STACK_COLORS) cache lines below the top of
 * its mapping. The mappings are a whole number of pages apart, so without it
 * every thread's hot frames would fall in the same few sets of the L1 cache
 * and a block would miss on every switch. The stacks are mapped that much
 * larger, so each still has SIM_STACK_SIZE. */
enum {
    SIM_STACK_COLORS = 64,
    SIM_CACHE_LINE = 64,
    SIM_STACK_COLOR_BYTES = SIM_STACK_COLORS * SIM_CACHE_LINE
};

/* How long an idle worker, or sim_launch waiting for the last blocks, polls
 * before it sleeps on the condition variable: longer than the host's work
 * between two launches of a step, short enough not to matter to others. */
#define SIM_SPIN_NANOSECONDS 100000ll

/* One launch, as the workers see it. */
typedef struct sim_job {
    const sim_kernel *kernel;
    sim_dim3 grid, block_dim;
    size_t dynamic_shared_bytes;
    void **args;
    uint64_t block_count;
    unsigned threads_per_block;
    atomic_uint_least64_t next_block;
    atomic_bool stopped; /* an error: start no more blocks */
    pthread_mutex_t error_lock;
    sim_status status; /* the first error */
    char message[SIM_MESSAGE_SIZE];
} sim_job;

typedef struct sim_worker {
    sim_pool *pool;
    pthread_t thread;
    sim_stack_region stacks;
    sim_thread *threads; /* [thread_capacity] */
    sim_warp *warps;     /* [thread_capacity / 32 rounded up] */
    unsigned *run_queue; /* [thread_capacity] */
    unsigned thread_capacity;
    unsigned char *dynamic_shared;
    size_t dynamic_shared_capacity;
    bool stacks_hold_abandoned_frames; /* a block failed mid-run */
    sim_block block;
} sim_worker;

struct sim_pool {
    unsigned worker_count; /* workers[0] is sim_launch's caller, the others have threads */
    unsigned threads_started;
    sim_worker *workers;
    pthread_mutex_t launch_lock; /* one launch at a time */
    pthread_mutex_t lock;        /* guards the fields below (the atomics are also read without it) */
    pthread_cond_t job_posted, job_finished;
    atomic_uint_least64_t job_generation; /* of the last launch posted */
    /* The generation of the launch workers may still join, 0 once closed.
     * A worker counts itself in `joined`, then checks it is open; the
     * launching thread closes it, then waits for `joined` to drop to 0
     * (sequentially consistent: one of the two sees the other). */
    atomic_uint_least64_t open_generation;
    atomic_uint joined;
    atomic_bool shutting_down;
    _Atomic(sim_job *) job; /* the open launch's */
};

const char *sim_status_name(sim_status status) {
    switch (status) {
    case SIM_OK: return "ok";
    case SIM_ERROR_INVALID_LAUNCH: return "invalid launch";
    case SIM_ERROR_DEADLOCK: return "deadlock";
    case SIM_ERROR_WARP_MISUSE: return "warp misuse";
    case SIM_ERROR_OUT_OF_MEMORY: return "out of memory";
    case SIM_ERROR_STACK_OVERFLOW: return "stack overflow";
    }
    return "unknown status";
}

/* "%.*s%s" arguments that print a kernel name cut to SIM_KERNEL_NAME_MAX. */
#define SIM_NAME(s)                                                                                          \
    (int)strnlen((s), SIM_KERNEL_NAME_MAX), (s),                                                             \
        (strnlen((s), SIM_KERNEL_NAME_MAX + 1) > SIM_KERNEL_NAME_MAX ? "..." : "")

static void sim_job_fail(sim_job *job, sim_status status, const char *message) {
    pthread_mutex_lock(&job->error_lock);
    if (job->status == SIM_OK) {
        job->status = status;
        snprintf(job->message, sizeof job->message, "%s", message);
    }
    pthread_mutex_unlock(&job->error_lock);
    atomic_store(&job->stopped, true);
}

/* ---- inside a block ---- */

static void sim_block_set_message(sim_block *block, sim_status status, const char *format, va_list args) {
    const char *name = block->kernel->name;
    int used = snprintf(block->message, sizeof block->message,
                        "kernel '%.*s%s' block (%u, %u, %u): ", SIM_NAME(name), block->index.x,
                        block->index.y, block->index.z);
    if (used > 0 && (size_t)used < sizeof block->message)
        vsnprintf(block->message + used, sizeof block->message - (size_t)used, format, args);
    block->status = status;
}

_Noreturn void sim_block_fail(sim_block *block, sim_thread *self, sim_status status, const char *format,
                              ...) {
    va_list args;
    va_start(args, format);
    sim_block_set_message(block, status, format, args);
    va_end(args);
    smelt_sim_current = NULL;
    sim_fiber_exit(&self->fiber, &block->scheduler);
}

_Noreturn void sim_block_deadlock(sim_block *block, sim_thread *self) {
    for (unsigned w = 0; w < block->warp_count; w++) {
        const sim_warp *warp = &block->warps[w];
        if (!warp->arrived_lanes) continue;
        /* Nothing runs, so the warp's other live lanes wait at the block barrier. */
        sim_block_fail(block, self, SIM_ERROR_DEADLOCK,
                       "%s in warp %u is not reached by every thread of the warp: "
                       "%d threads wait at it, %d wait at __syncthreads()",
                       sim_warp_op_name(warp->op), w, __builtin_popcount(warp->arrived_lanes),
                       __builtin_popcount(warp->live_lanes & ~warp->arrived_lanes));
    }
    sim_block_fail(block, self, SIM_ERROR_DEADLOCK,
                   "__syncthreads() is not reached by every thread of the block: "
                   "%u threads wait at it, %u have returned",
                   block->at_block_barrier, block->returned_count);
}

void smelt_sim_syncthreads(void) {
    sim_thread *self = sim_thread_running();
    sim_block *block = self->block;
    if (++block->at_block_barrier == block->live_count && block->returned_count == 0) {
        /* Everyone is here: release them all, and run on. */
        block->at_block_barrier = 0;
        for (unsigned i = 0; i < block->thread_count; i++)
            if (i != self->index) sim_block_make_runnable(block, i);
        return;
    }
    sim_block_wait(block, self);
}

/* Every fiber starts here. */
static void sim_thread_main(void *argument) {
    sim_thread *self = argument;
    sim_block *block = self->block;
    block->kernel->host_entry(block->args);

    block->live_count--;
    block->returned_count++;
    sim_warp_lane_returned(block, self);
    sim_thread *next = sim_block_pop_runnable(block);
    if (next) {
        smelt_sim_current = &next->view;
        sim_fiber_exit(&self->fiber, &next->fiber);
    }
    if (block->live_count > 0) sim_block_deadlock(block, self);
    smelt_sim_current = NULL;
    sim_fiber_exit(&self->fiber, &block->scheduler); /* the block is done */
}

/* ---- workers ---- */

/* Grows the worker's per-block resources to what `job` needs. */
static bool sim_worker_reserve(sim_worker *worker, const sim_job *job, char *message, size_t message_size) {
    unsigned threads = job->threads_per_block;
    if (threads > worker->thread_capacity) {
        unsigned warps = (threads + SIM_WARP_LANES - 1) / SIM_WARP_LANES;
        sim_thread *thread_records = aligned_alloc(_Alignof(sim_thread), threads * sizeof *thread_records);
        sim_warp *warp_records = calloc(warps, sizeof *warp_records);
        unsigned *queue = calloc(threads, sizeof *queue);
        if (!thread_records || !warp_records || !queue) {
            free(thread_records);
            free(warp_records);
            free(queue);
            snprintf(message, message_size, "cannot allocate the records of %u threads", threads);
            return false;
        }
        free(worker->threads);
        free(worker->warps);
        free(worker->run_queue);
        worker->threads = thread_records;
        worker->warps = warp_records;
        worker->run_queue = queue;
        worker->thread_capacity = threads;
    }
    if (!sim_stack_region_reserve(&worker->stacks, threads, SIM_STACK_SIZE + SIM_STACK_COLOR_BYTES)) {
        snprintf(message, message_size, "cannot map %u fiber stacks of %u KiB", threads,
                 SIM_STACK_SIZE / 1024);
        return false;
    }
    size_t shared = job->dynamic_shared_bytes ? job->dynamic_shared_bytes : 1;
    if (shared > worker->dynamic_shared_capacity) {
        size_t rounded = (shared + SIM_DYNAMIC_SHARED_ALIGNMENT - 1) / SIM_DYNAMIC_SHARED_ALIGNMENT *
                         SIM_DYNAMIC_SHARED_ALIGNMENT;
        unsigned char *buffer = aligned_alloc(SIM_DYNAMIC_SHARED_ALIGNMENT, rounded);
        if (!buffer) {
            snprintf(message, message_size, "cannot allocate %zu bytes of dynamic shared memory", shared);
            return false;
        }
        free(worker->dynamic_shared);
        worker->dynamic_shared = buffer;
        worker->dynamic_shared_capacity = rounded;
    }
    return true;
}

static sim_dim3 sim_unlinearize(uint64_t linear, sim_dim3 dims) {
    sim_dim3 index;
    index.x = (unsigned)(linear % dims.x);
    index.y = (unsigned)(linear / dims.x % dims.y);
    index.z = (unsigned)(linear / dims.x / dims.y);
    return index;
}

/* Runs one block on this worker's fibers; false when it failed (the block's
 * status and message say why). */
static bool sim_worker_run_block(sim_worker *worker, const sim_job *job, uint64_t block_number) {
    sim_block *block = &worker->block;
    unsigned n = job->threads_per_block;
    block->kernel = job->kernel;
    block->args = job->args;
    block->index = sim_unlinearize(block_number, job->grid);
    block->threads = worker->threads;
    block->thread_count = n;
    block->warps = worker->warps;
    block->warp_count = (n + SIM_WARP_LANES - 1) / SIM_WARP_LANES;
    block->live_count = n;
    block->returned_count = 0;
    block->at_block_barrier = 0;
    block->run_queue = worker->run_queue;
    block->queue_head = 0;
    block->queue_length = 0;
    block->resumed_lanes = 0;
    block->status = SIM_OK;
    block->message[0] = '\0';

    if (worker->stacks_hold_abandoned_frames) {
        sim_stack_region_forget_frames(&worker->stacks);
        worker->stacks_hold_abandoned_frames = false;
    }
    for (unsigned w = 0; w < block->warp_count; w++) {
        unsigned lanes = n - w * SIM_WARP_LANES < SIM_WARP_LANES ? n - w * SIM_WARP_LANES : SIM_WARP_LANES;
        block->warps[w].live_lanes = lanes == 32 ? 0xffffffffu : (1u << lanes) - 1u;
        block->warps[w].arrived_lanes = 0;
        block->warps[w].op = SIM_WARP_SYNC;
    }
    smelt_sim_dim3 block_index = {block->index.x, block->index.y, block->index.z};
    smelt_sim_dim3 block_dim = {job->block_dim.x, job->block_dim.y, job->block_dim.z};
    smelt_sim_dim3 grid_dim = {job->grid.x, job->grid.y, job->grid.z};
    for (unsigned i = 0; i < n; i++) {
        sim_thread *thread = &block->threads[i];
        sim_dim3 thread_index = sim_unlinearize(i, job->block_dim);
        thread->view.thread_index = (smelt_sim_dim3){thread_index.x, thread_index.y, thread_index.z};
        thread->view.block_index = block_index;
        thread->view.block_dim = block_dim;
        thread->view.grid_dim = grid_dim;
        thread->view.lane = i % SIM_WARP_LANES;
        thread->view.dynamic_shared = worker->dynamic_shared;
        thread->block = block;
        thread->index = i;
        sim_fiber_prepare(&thread->fiber, sim_stack_region_stack(&worker->stacks, i),
                          worker->stacks.stack_size - i % SIM_STACK_COLORS * SIM_CACHE_LINE, sim_thread_main,
                          thread);
        if (i >= worker->stacks.guarded_count) sim_stack_region_set_canary(&worker->stacks, i);
        sim_block_make_runnable(block, i);
    }

    sim_thread *first = sim_block_pop_runnable(block);
    smelt_sim_current = &first->view;
    sim_fiber_switch(&block->scheduler, &first->fiber);
    smelt_sim_current = NULL;
    if (block->status != SIM_OK) {
        worker->stacks_hold_abandoned_frames = true;
        return false;
    }
    for (unsigned i = worker->stacks.guarded_count; i < n; i++) {
        if (sim_stack_region_canary_intact(&worker->stacks, i)) continue;
        /* Too late to be sure of anything this block did: fail the launch. */
        snprintf(block->message, sizeof block->message,
                 "kernel '%.*s%s' block (%u, %u, %u): thread %u overran its %u KiB fiber stack",
                 SIM_NAME(block->kernel->name), block->index.x, block->index.y, block->index.z, i,
                 SIM_STACK_SIZE / 1024);
        block->status = SIM_ERROR_STACK_OVERFLOW;
        return false;
    }
    return true;
}

static void sim_worker_run_job(sim_worker *worker, sim_job *job) {
    bool reserved = false;
    while (!atomic_load_explicit(&job->stopped, memory_order_relaxed)) {
        uint64_t block_number = atomic_fetch_add_explicit(&job->next_block, 1, memory_order_relaxed);
        if (block_number >= job->block_count) break;
        /* Only a worker that gets a block needs stacks for it. */
        char message[SIM_MESSAGE_SIZE / 2];
        if (!reserved && !sim_worker_reserve(worker, job, message, sizeof message)) {
            char full[SIM_MESSAGE_SIZE];
            snprintf(full, sizeof full, "kernel '%.*s%s': %s", SIM_NAME(job->kernel->name), message);
            sim_job_fail(job, SIM_ERROR_OUT_OF_MEMORY, full);
            break;
        }
        reserved = true;
        if (!sim_worker_run_block(worker, job, block_number)) {
            sim_job_fail(job, worker->block.status, worker->block.message);
            break;
        }
    }
}

static long long sim_nanoseconds(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (long long)now.tv_sec * 1000000000ll + now.tv_nsec;
}

static inline void sim_cpu_relax(void) {
#if defined(__x86_64__) || defined(__i386__)
    __builtin_ia32_pause();
#elif defined(__aarch64__)
    __asm__ __volatile__("yield");
#endif
}

/* Polls until done() holds or SIM_SPIN_NANOSECONDS have passed; whether it
 * holds. After the first few polls it yields the core between polls: on a
 * busy machine the thread it waits for may need this very core. */
static bool sim_spin_until(bool (*done)(sim_pool *, uint64_t), sim_pool *pool, uint64_t value) {
    long long deadline = sim_nanoseconds() + SIM_SPIN_NANOSECONDS;
    for (unsigned i = 0;; i++) {
        if (done(pool, value)) return true;
        if (i < 64) {
            sim_cpu_relax();
            continue;
        }
        if (sim_nanoseconds() > deadline) return false;
        sched_yield();
    }
}

static bool sim_job_posted_since(sim_pool *pool, uint64_t generation) {
    return atomic_load_explicit(&pool->job_generation, memory_order_acquire) != generation ||
           atomic_load_explicit(&pool->shutting_down, memory_order_relaxed);
}

static bool sim_workers_done(sim_pool *pool, uint64_t unused) {
    (void)unused;
    return atomic_load(&pool->joined) == 0;
}

static void *sim_worker_main(void *argument) {
    sim_worker *worker = argument;
    sim_pool *pool = worker->pool;
    sim_fiber_init_thread(&worker->block.scheduler);
    uint64_t generation_done = 0;
    for (;;) {
        if (!sim_spin_until(sim_job_posted_since, pool, generation_done)) {
            pthread_mutex_lock(&pool->lock);
            while (!sim_job_posted_since(pool, generation_done))
                pthread_cond_wait(&pool->job_posted, &pool->lock);
            pthread_mutex_unlock(&pool->lock);
        }
        if (atomic_load(&pool->shutting_down)) break;
        uint64_t generation = atomic_load(&pool->job_generation);
        generation_done = generation;
        atomic_fetch_add(&pool->joined, 1);
        /* Closed already (or a newer one posted, joined next time round). */
        if (atomic_load(&pool->open_generation) == generation)
            sim_worker_run_job(worker, atomic_load(&pool->job));
        if (atomic_fetch_sub(&pool->joined, 1) == 1) {
            pthread_mutex_lock(&pool->lock);
            pthread_cond_signal(&pool->job_finished);
            pthread_mutex_unlock(&pool->lock);
        }
    }
    return NULL;
}

static void sim_worker_release(sim_worker *worker) {
    sim_stack_region_free(&worker->stacks);
    free(worker->threads);
    free(worker->warps);
    free(worker->run_queue);
    free(worker->dynamic_shared);
}

/* ---- the pool ---- */

sim_pool *sim_pool_create(unsigned workers) {
    if (workers == 0) {
        long cores = sysconf(_SC_NPROCESSORS_ONLN);
        workers = cores > 0 ? (unsigned)cores : 1;
    }
    if (workers > SIM_MAX_WORKERS) workers = SIM_MAX_WORKERS;
    sim_pool *pool = calloc(1, sizeof *pool);
    if (!pool) return NULL;
    pool->workers = calloc(workers, sizeof *pool->workers);
    if (!pool->workers) {
        free(pool);
        return NULL;
    }
    pool->worker_count = workers;
    pthread_mutex_init(&pool->launch_lock, NULL);
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->job_posted, NULL);
    pthread_cond_init(&pool->job_finished, NULL);
    atomic_init(&pool->job_generation, 0);
    atomic_init(&pool->open_generation, 0);
    atomic_init(&pool->joined, 0);
    atomic_init(&pool->job, NULL);
    atomic_init(&pool->shutting_down, false);
    pool->workers[0].pool = pool;
    for (unsigned i = 1; i < workers; i++) {
        pool->workers[i].pool = pool;
        if (pthread_create(&pool->workers[i].thread, NULL, sim_worker_main, &pool->workers[i]) != 0) {
            sim_pool_free(pool); /* frees the ones that started */
            return NULL;
        }
        pool->threads_started = i;
    }
    return pool;
}

void sim_pool_free(sim_pool *pool) {
    if (!pool) return;
    pthread_mutex_lock(&pool->lock);
    atomic_store(&pool->shutting_down, true);
    pthread_cond_broadcast(&pool->job_posted);
    pthread_mutex_unlock(&pool->lock);
    for (unsigned i = 1; i <= pool->threads_started; i++)
        pthread_join(pool->workers[i].thread, NULL);
    for (unsigned i = 0; i < pool->worker_count; i++)
        sim_worker_release(&pool->workers[i]);
    pthread_cond_destroy(&pool->job_finished);
    pthread_cond_destroy(&pool->job_posted);
    pthread_mutex_destroy(&pool->lock);
    pthread_mutex_destroy(&pool->launch_lock);
    free(pool->workers);
    free(pool);
}

unsigned sim_pool_worker_count(const sim_pool *pool) { return pool ? pool->worker_count : 0; }

/* ---- launch ---- */

static void sim_copy_error(char *error, size_t error_size, const char *message) {
    if (error && error_size > 0) snprintf(error, error_size, "%s", message);
}

/* Checks a launch against sm_90's limits; writes the complaint to `message`. */
static sim_status sim_validate_launch(const sim_pool *pool, const sim_kernel *kernel, sim_dim3 grid,
                                      sim_dim3 block, size_t dynamic_shared_bytes, char *message,
                                      size_t size) {
    if (!pool) {
        snprintf(message, size, "launch without a simulator pool");
        return SIM_ERROR_INVALID_LAUNCH;
    }
    if (!kernel || !kernel->name || !kernel->host_entry) {
        snprintf(message, size, "launch of a kernel without %s",
                 !kernel         ? "a description"
                 : !kernel->name ? "a name"
                                 : "a host entry function");
        return SIM_ERROR_INVALID_LAUNCH;
    }
    const char *name = kernel->name;
    if (block.x == 0 || block.y == 0 || block.z == 0 || grid.x == 0 || grid.y == 0 || grid.z == 0) {
        snprintf(message, size,
                 "kernel '%.*s%s': launch dimensions must be at least 1; found grid (%u, %u, %u), block (%u, "
                 "%u, %u)",
                 SIM_NAME(name), grid.x, grid.y, grid.z, block.x, block.y, block.z);
        return SIM_ERROR_INVALID_LAUNCH;
    }
    if (block.x > SIM_MAX_THREADS_PER_BLOCK || block.y > SIM_MAX_THREADS_PER_BLOCK ||
        block.z > SIM_MAX_BLOCK_DIM_Z) {
        snprintf(message, size, "kernel '%.*s%s': block (%u, %u, %u) exceeds the limits (%d, %d, %d)",
                 SIM_NAME(name), block.x, block.y, block.z, SIM_MAX_THREADS_PER_BLOCK,
                 SIM_MAX_THREADS_PER_BLOCK, SIM_MAX_BLOCK_DIM_Z);
        return SIM_ERROR_INVALID_LAUNCH;
    }
    uint64_t threads = (uint64_t)block.x * block.y * block.z;
    if (threads > SIM_MAX_THREADS_PER_BLOCK) {
        snprintf(message, size, "kernel '%.*s%s': block (%u, %u, %u) has %llu threads; expected at most %d",
                 SIM_NAME(name), block.x, block.y, block.z, (unsigned long long)threads,
                 SIM_MAX_THREADS_PER_BLOCK);
        return SIM_ERROR_INVALID_LAUNCH;
    }
    if (grid.x > SIM_MAX_GRID_DIM_X || grid.y > SIM_MAX_GRID_DIM_YZ || grid.z > SIM_MAX_GRID_DIM_YZ) {
        snprintf(message, size, "kernel '%.*s%s': grid (%u, %u, %u) exceeds the limits (%u, %d, %d)",
                 SIM_NAME(name), grid.x, grid.y, grid.z, SIM_MAX_GRID_DIM_X, SIM_MAX_GRID_DIM_YZ,
                 SIM_MAX_GRID_DIM_YZ);
        return SIM_ERROR_INVALID_LAUNCH;
    }
    if (dynamic_shared_bytes > SIM_MAX_DYNAMIC_SHARED_BYTES) {
        snprintf(message, size,
                 "kernel '%.*s%s': %zu bytes of dynamic shared memory requested; expected at most %d",
                 SIM_NAME(name), dynamic_shared_bytes, SIM_MAX_DYNAMIC_SHARED_BYTES);
        return SIM_ERROR_INVALID_LAUNCH;
    }
    return SIM_OK;
}

sim_status sim_launch(sim_pool *pool, const sim_kernel *kernel, sim_dim3 grid, sim_dim3 block,
                      size_t dynamic_shared_bytes, void **args, char *error, size_t error_size) {
    char message[SIM_MESSAGE_SIZE];
    sim_status status =
        sim_validate_launch(pool, kernel, grid, block, dynamic_shared_bytes, message, sizeof message);
    if (status != SIM_OK) {
        sim_copy_error(error, error_size, message);
        return status;
    }

    sim_job job = {
        .kernel = kernel,
        .grid = grid,
        .block_dim = block,
        .dynamic_shared_bytes = dynamic_shared_bytes,
        .args = args,
        .block_count = (uint64_t)grid.x * grid.y * grid.z,
        .threads_per_block = block.x * block.y * block.z,
        .status = SIM_OK,
    };
    atomic_init(&job.next_block, 0);
    atomic_init(&job.stopped, false);
    pthread_mutex_init(&job.error_lock, NULL);

    pthread_mutex_lock(&pool->launch_lock);
    /* A grid of one block needs no other worker. */
    bool posted = pool->worker_count > 1 && job.block_count > 1;
    if (posted) {
        atomic_store(&pool->job, &job);
        uint64_t generation = atomic_load(&pool->job_generation) + 1;
        atomic_store(&pool->open_generation, generation);
        pthread_mutex_lock(&pool->lock);
        atomic_store(&pool->job_generation, generation);
        pthread_cond_broadcast(&pool->job_posted);
        pthread_mutex_unlock(&pool->lock);
    }
    /* This thread is worker 0 (the launching thread may differ from launch to
     * launch: its scheduler context is its own). */
    sim_worker *caller = &pool->workers[0];
    sim_fiber_init_thread(&caller->block.scheduler);
    sim_worker_run_job(caller, &job);
    if (posted) {
        atomic_store(&pool->open_generation, 0); /* no worker joins from here on */
        if (!sim_spin_until(sim_workers_done, pool, 0)) {
            pthread_mutex_lock(&pool->lock);
            while (!sim_workers_done(pool, 0))
                pthread_cond_wait(&pool->job_finished, &pool->lock);
            pthread_mutex_unlock(&pool->lock);
        }
        atomic_store(&pool->job, NULL);
    }
    pthread_mutex_unlock(&pool->launch_lock);

    pthread_mutex_destroy(&job.error_lock);
    if (job.status != SIM_OK) sim_copy_error(error, error_size, job.message);
    return job.status;
}
