/* json_memory.c - jansson's allocations, watched (see json_memory.h). */
#include "json_memory.h"

#include <pthread.h>
#include <stdlib.h>

static _Thread_local bool allocation_failed;
static _Thread_local bool parsing; /* between fe_json_memory_begin and fe_json_out_of_memory */
static pthread_once_t installed = PTHREAD_ONCE_INIT;

/* jansson 2.14 does not survive every failed allocation (a NULL inside
 * json_loadb can crash it), so a failure is served from this reserve while
 * it lasts: the parse goes on, and its result is thrown away because the
 * flag is set. Reset by fe_json_memory_begin, when no tree holds any of it
 * (a flagged tree is freed at once). */
enum { RESERVE_BYTES = 16 * 1024 };
static _Thread_local struct {
    _Alignas(16) unsigned char bytes[RESERVE_BYTES];
    size_t used;
} reserve;

static void *watched_malloc(size_t size) {
    void *p = malloc(size);
    if (p) return p;
    allocation_failed = true;
    if (!parsing) return NULL; /* json_dumps and the like: their callers free with free() */
    size_t rounded = (size + 15) & ~(size_t)15;
    if (rounded < size || rounded > RESERVE_BYTES - reserve.used) return NULL;
    p = reserve.bytes + reserve.used;
    reserve.used += rounded;
    return p;
}

static void watched_free(void *p) {
    unsigned char *bytes = p;
    if (bytes >= reserve.bytes && bytes < reserve.bytes + RESERVE_BYTES) return;
    free(p);
}

static void install(void) { json_set_alloc_funcs(watched_malloc, watched_free); }

void fe_json_memory_begin(void) {
    pthread_once(&installed, install);
    allocation_failed = false;
    parsing = true;
    reserve.used = 0;
}

bool fe_json_out_of_memory(const json_error_t *error) {
    parsing = false;
    return allocation_failed || (error && json_error_code(error) == json_error_out_of_memory);
}
