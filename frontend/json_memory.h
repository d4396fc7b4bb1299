/* json_memory.h - telling jansson's out of memory apart from bad JSON.
 *
 * jansson reports a failed allocation while parsing as a parse error whose
 * text depends on where it happened. Its allocations go through our own
 * functions (json_set_alloc_funcs, installed once, process-wide), which note
 * a failure for the calling thread:
 *
 *     fe_json_memory_begin();
 *     json_t *root = json_loadb(text, length, 0, &error);
 *     if (fe_json_out_of_memory(&error)) ... free root (if any): "out of memory" ...
 *
 * A parse that ran out of memory may still return a tree (see json_memory.c):
 * check the flag whatever json_load* returned.
 */
#ifndef SMELT_JSON_MEMORY_H
#define SMELT_JSON_MEMORY_H

#include <jansson.h>
#include <stdbool.h>

/* Installs the allocation functions (once) and clears this thread's flag. */
void fe_json_memory_begin(void);
/* Whether an allocation inside jansson failed since fe_json_memory_begin(),
 * or `error` (may be NULL) says so. Ends the parse: call it right after.
 * `error` must start zeroed (json_error_t error = {0}): jansson sets its
 * code only when a parse fails, and a stale code would read as out of memory. */
bool fe_json_out_of_memory(const json_error_t *error);

#endif
