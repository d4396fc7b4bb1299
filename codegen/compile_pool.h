/* compile_pool.h - compiling many kernels at once over a thread pool.
 *
 * `smelt compile` has hundreds of (kernel, arch) jobs. cg_compile_all()
 * runs them on `threads` workers, compiles identical jobs (same source,
 * headers, arch and options: the disk cache's key) once, goes through the
 * disk cache when one is given, and returns the results in job order. Every
 * failing job gets its own error (a job that runs out of memory: "out of
 * memory"); the count of failures is returned.
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

#endif
