/* json_memory.c - jansson's allocations, watched (see json_memory.h). */
#include "json_memory.h"

#include <pthread.h>
#include <stdlib.h>

static _Thread_local bool allocation_failed;
static pthread_once_t installed = PTHREAD_ONCE_INIT;

static void *watched_malloc(size_t size) {
    void *p = malloc(size);
    if (!p) allocation_failed = true;
    return p;
}

static void install(void) { json_set_alloc_funcs(watched_malloc, free); }

void fe_json_memory_begin(void) {
    pthread_once(&installed, install);
    allocation_failed = false;
}

bool fe_json_out_of_memory(const json_error_t *error) {
    return allocation_failed || (error && json_error_code(error) == json_error_out_of_memory);
}
