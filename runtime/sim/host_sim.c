/* host_sim.c - the host simulator's workers, launches, blocks and the block
 * barrier (the warp barrier is in host_sim_warp.c; the design is described
 * in host_sim.h and host_sim_block.h).
 *
 * A launch is posted to every worker of the pool; each worker takes block
 * numbers from one atomic counter until they run out or an error stops the
 * launch, runs each block to completion on its own fibers, and reports back.
 * Per worker and reused across blocks and launches: the fiber stacks, the
 * thread and warp records, the run queue and the dynamic shared memory.
 */
#include "host_sim_block.h"

#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
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
    unsigned worker_count;
    sim_worker *workers;
    pthread_mutex_t launch_lock; /* one launch at a time */
    pthread_mutex_t lock;        /* guards the fields below */
    pthread_cond_t job_posted, job_finished;
    uint64_t job_generation;
    unsigned workers_busy;
    bool shutting_down;
    sim_job *job;
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

static sim_thread *sim_block_pop_runnable(sim_block *block) {
    if (block->queue_length == 0) return NULL;
    unsigned index = block->run_queue[block->queue_head];
    if (++block->queue_head == block->thread_count) block->queue_head = 0;
    block->queue_length--;
    return &block->threads[index];
}

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

/* No thread can run but some have not returned: say who waits at what. */
static _Noreturn void sim_block_deadlock(sim_block *block, sim_thread *self) {
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

void sim_block_wait(sim_block *block, sim_thread *self) {
    sim_thread *next = sim_block_pop_runnable(block);
    if (!next) sim_block_deadlock(block, self);
    smelt_sim_current = &next->view;
    sim_fiber_switch(&self->fiber, &next->fiber);
    /* Released and resumed: whoever switched here set smelt_sim_current. */
}

void smelt_sim_syncthreads(void) {
    sim_thread *self = sim_thread_running();
    sim_block *block = self->block;
    if (++block->at_block_barrier == block->live_count && block->returned_count == 0) {
        /* Everyone is here: release them all, and run on. */
        block->at_block_barrier = 0;
        for (unsigned i = 0; i < block->thread_count; i++) {
            sim_thread *thread = &block->threads[i];
            if (thread != self) sim_block_make_runnable(block, thread);
        }
        return;
    }
    self->state = SIM_THREAD_AT_BLOCK_BARRIER;
    sim_block_wait(block, self);
}

/* Every fiber starts here. */
static void sim_thread_main(void *argument) {
    sim_thread *self = argument;
    sim_block *block = self->block;
    block->kernel->host_entry(block->args);

    self->state = SIM_THREAD_RETURNED;
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
        sim_thread *thread_records = calloc(threads, sizeof *thread_records);
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
    if (!sim_stack_region_reserve(&worker->stacks, threads, SIM_STACK_SIZE)) {
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
        thread->request = NULL;
        sim_fiber_prepare(&thread->fiber, sim_stack_region_stack(&worker->stacks, i),
                          worker->stacks.stack_size, sim_thread_main, thread);
        if (i >= worker->stacks.guarded_count) sim_stack_region_set_canary(&worker->stacks, i);
        sim_block_make_runnable(block, thread);
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
                 "kernel '%.*s%s' block (%u, %u, %u): thread %u overran its %zu KiB fiber stack",
                 SIM_NAME(block->kernel->name), block->index.x, block->index.y, block->index.z, i,
                 worker->stacks.stack_size / 1024);
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

static void *sim_worker_main(void *argument) {
    sim_worker *worker = argument;
    sim_pool *pool = worker->pool;
    sim_fiber_init_thread(&worker->block.scheduler);
    uint64_t generation_done = 0;
    pthread_mutex_lock(&pool->lock);
    for (;;) {
        while (!pool->shutting_down && pool->job_generation == generation_done)
            pthread_cond_wait(&pool->job_posted, &pool->lock);
        if (pool->shutting_down) break;
        generation_done = pool->job_generation;
        sim_job *job = pool->job;
        pthread_mutex_unlock(&pool->lock);
        sim_worker_run_job(worker, job);
        pthread_mutex_lock(&pool->lock);
        if (--pool->workers_busy == 0) pthread_cond_signal(&pool->job_finished);
    }
    pthread_mutex_unlock(&pool->lock);
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
    pthread_mutex_init(&pool->launch_lock, NULL);
    pthread_mutex_init(&pool->lock, NULL);
    pthread_cond_init(&pool->job_posted, NULL);
    pthread_cond_init(&pool->job_finished, NULL);
    for (unsigned i = 0; i < workers; i++) {
        pool->workers[i].pool = pool;
        if (pthread_create(&pool->workers[i].thread, NULL, sim_worker_main, &pool->workers[i]) != 0) {
            pool->worker_count = i; /* free the ones that started */
            sim_pool_free(pool);
            return NULL;
        }
    }
    pool->worker_count = workers;
    return pool;
}

void sim_pool_free(sim_pool *pool) {
    if (!pool) return;
    pthread_mutex_lock(&pool->lock);
    pool->shutting_down = true;
    pthread_cond_broadcast(&pool->job_posted);
    pthread_mutex_unlock(&pool->lock);
    for (unsigned i = 0; i < pool->worker_count; i++) {
        pthread_join(pool->workers[i].thread, NULL);
        sim_worker_release(&pool->workers[i]);
    }
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
    pthread_mutex_lock(&pool->lock);
    pool->job = &job;
    pool->workers_busy = pool->worker_count;
    pool->job_generation++;
    pthread_cond_broadcast(&pool->job_posted);
    while (pool->workers_busy > 0)
        pthread_cond_wait(&pool->job_finished, &pool->lock);
    pool->job = NULL;
    pthread_mutex_unlock(&pool->lock);
    pthread_mutex_unlock(&pool->launch_lock);

    pthread_mutex_destroy(&job.error_lock);
    if (job.status != SIM_OK) sim_copy_error(error, error_size, job.message);
    return job.status;
}
