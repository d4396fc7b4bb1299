/* compile_pool.h - compiling many kernels at once over a thread pool.
 *
 * `smelt compile` has hundreds of (kernel, arch) jobs. cg_compile_all()
 * runs them on `threads` workers, compiles identical jobs (same source,
 * headers, arch and options: the disk cache's key) once, goes through the
 * disk cache when one is given, and returns the results in job order. Every
 * failing job gets its own error (a job that runs out of memory: "out of
 * memory"); the count of failures is returned.
 *
 * The workers take the costliest work first (longest-processing-time
 * order, by an estimate from the source's length), so that the last
 * compile to finish is a short one and no core idles at the end.
 * cg_compile_all_with_tasks() also runs other work on the same workers in
 * that order: `smelt compile` runs the host C compiler's per-kernel
 * compiles (host_build.h) there, beside NVRTC's, on as many cores.
 *
 *   cg_compile_result results[n];
 *   size_t failed;
 *   if (!cg_compile_all(requests, n, 0, cache, results, print_progress, NULL, &failed, error, size))
 *       ... error: the pool could not be set up (out of memory) ...
 *   for (i ...) if (!results[i].ok) fprintf(stderr, "%s\n", results[i].error);
 *   cg_compile_results_free(results, n);
 */
#ifndef SMELT_CG_COMPILE_POOL_H
#define SMELT_CG_COMPILE_POOL_H

#include "kernel_cache.h"
#include "nvrtc.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* Called on the caller's thread (never concurrently) each time more jobs
 * are done: done of total, done == total last. */
typedef void (*cg_progress_fn)(size_t done, size_t total, void *user);

typedef struct cg_compile_result {
    bool ok;
    bool from_cache;      /* the disk cache had it */
    bool deduplicated;    /* an identical earlier job was compiled instead */
    cg_compiled compiled; /* valid when ok; each result owns its copy */
    char *error;          /* when !ok: the message, else NULL (free with cg_compile_results_free) */
} cg_compile_result;

/* Compiles jobs[0..count) into results[0..count) (job order) on `threads`
 * workers (0: one per online core), sets *failed to how many jobs failed and
 * returns true. cache and progress may be NULL. When the pool itself cannot
 * be set up (out of memory) it compiles nothing, returns false with a
 * message in error (may be NULL) and leaves results zeroed (none ok). */
bool cg_compile_all(const cg_compile_request *jobs, size_t count, unsigned threads, cg_cache *cache,
                    cg_compile_result *results, cg_progress_fn progress, void *progress_user, size_t *failed,
                    char *error, size_t error_size);
void cg_compile_results_free(cg_compile_result *results, size_t count);

/* Other work for the pool's workers: run(context, i) for each i in
 * [0, count), once each, on any worker, at the same time as other tasks and
 * compiles; it reports its own failures (in context). cost(context, i) is
 * its estimated run time in microseconds (cg_compile_cost_estimate's unit),
 * which places it among the compiles. */
typedef struct cg_pool_tasks {
    size_t count;
    void *context;
    uint64_t (*cost)(void *context, size_t index);
    void (*run)(void *context, size_t index);
} cg_pool_tasks;

/* cg_compile_all plus `tasks` (may be NULL) on the same workers; progress
 * counts the tasks too (total = count + tasks->count). When the pool cannot
 * be set up it returns false and runs no task either. */
bool cg_compile_all_with_tasks(const cg_compile_request *jobs, size_t count, const cg_pool_tasks *tasks,
                               unsigned threads, cg_cache *cache, cg_compile_result *results,
                               cg_progress_fn progress, void *progress_user, size_t *failed, char *error,
                               size_t error_size);

/* The estimated microseconds NVRTC takes to compile `req` (a cache miss):
 * a fixed part for the headers and the program, and a part that grows with
 * the source (NVVM and ptxas work per line). Only the order matters. */
uint64_t cg_compile_cost_estimate(const cg_compile_request *req);

#endif
