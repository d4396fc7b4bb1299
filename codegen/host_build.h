/* host_build.h - building the host simulator's shared object from kernel
 * sources with the host C compiler.
 *
 * The host backend runs the very text NVRTC compiles (docs/design.md §4): the
 * kernels are compiled as C11 against the host half of smelt_kernel.h into
 * one shared object, which the plan stores as bytes and the runtime
 * dlopen()s. cg_host_build() writes the sources into a fresh temporary
 * folder, compiles each kernel on its own, as many at once as there are
 * cores (compile_pool.h),
 *
 *   cc -std=c11 -O2 -fPIC -shared [sanitizer] [extra flags] -c -I<tmp> -I<include_dir>
 *      -o <tmp>/kernel_0000.o <tmp>/kernel_0000.c
 *
 * links them,
 *
 *   cc -std=c11 -O2 -fPIC -shared [sanitizer] [extra flags] -o <tmp>/kernels.so
 *      <tmp>/kernel_0000.o ... [link flags]
 *
 * (posix_spawn, no shell; $SMELT_HOST_CC or `cc`, split at blanks), reads
 * kernels.so back and removes the folder. Each source starts with a #line
 * naming its kernel, so compiler messages say "rmsnorm_0.c:12:5: error".
 * The result goes through the disk cache, keyed by the sources, headers,
 * flags and the compiler's `--version` output.
 *
 * The same build also goes in steps (cg_host_build_begin ... _finish), so
 * that `smelt compile` runs the per-kernel compiles on the pool that runs
 * NVRTC's, at the same time.
 */
#ifndef SMELT_CG_HOST_BUILD_H
#define SMELT_CG_HOST_BUILD_H

#include "kernel_cache.h"
#include "nvrtc.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* One kernel's C source for the host. */
typedef struct cg_host_source {
    const char *name; /* kernel name, for messages and the #line */
    const char *text;
} cg_host_source;

typedef struct cg_host_build_request {
    const cg_host_source *sources;
    size_t source_count;
    /* Headers written beside the sources (plain file names, no '/'). */
    const cg_header *headers;
    size_t header_count;
    /* A folder of headers (the one holding smelt_kernel.h), or NULL; the
     * *.h files in it are part of the cache key. */
    const char *include_dir;
    /* -fsanitize=address -fno-omit-frame-pointer. Such an object can only
     * be loaded by a process that itself runs under ASan; see
     * cg_host_build_process_is_sanitized(). */
    bool sanitize_address;
    const char *const *extra_flags; /* before -o, e.g. "-g", "-march=native" */
    size_t extra_flag_count;
    const char *const *link_flags; /* after the sources, e.g. "-lm" */
    size_t link_flag_count;
    const char *compiler; /* NULL: $SMELT_HOST_CC, else "cc" */
} cg_host_build_request;

typedef struct cg_host_object {
    uint8_t *bytes; /* the shared object's file contents */
    size_t size;
    bool from_cache;
} cg_host_object;

/* Builds the shared object; cache may be NULL. On failure returns false
 * with the compiler's output (its first lines) in error. */
bool cg_host_build(const cg_host_build_request *req, cg_cache *cache, cg_host_object *out, char *error,
                   size_t error_size);
void cg_host_object_free(cg_host_object *object);

/* The build in steps. begin checks and keys the request and looks in the
 * cache; on a miss it writes the sources into a temporary folder and leaves
 * cg_host_build_unit_count() compiles (one per kernel; 0 on a hit) to run,
 * each once, in any order, on any threads at once. finish links them (or
 * takes the hit), stores the object in the cache, removes the folder and
 * frees the build, on success and failure alike; cancel does that without
 * linking. req and everything it points to must outlive the build. */
typedef struct cg_host_builder cg_host_builder;
bool cg_host_build_begin(const cg_host_build_request *req, cg_cache *cache, cg_host_builder **build,
                         char *error, size_t error_size);
size_t cg_host_build_unit_count(const cg_host_builder *build);
/* Estimated microseconds of one compile (cg_compile_cost_estimate's unit). */
uint64_t cg_host_build_unit_cost(const cg_host_builder *build, size_t unit);
void cg_host_build_run_unit(cg_host_builder *build, size_t unit);
bool cg_host_build_finish(cg_host_builder *build, cg_host_object *out, char *error, size_t error_size);
void cg_host_build_cancel(cg_host_builder *build); /* NULL: nothing */

/* Whether this process runs under AddressSanitizer (smelt built with
 * SMELT_SANITIZE): then host objects should be built with sanitize_address. */
bool cg_host_build_process_is_sanitized(void);

#endif
