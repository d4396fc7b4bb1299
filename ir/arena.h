/* arena.h - bump allocator that owns all memory of an IR module or AST.
 *
 * Everything allocated from an arena is freed at once by arena_free().
 * Allocation failure is a broken invariant of the machine (out of memory):
 * it calls smelt_die() rather than returning NULL, so callers never check.
 */
#ifndef SMELT_ARENA_H
#define SMELT_ARENA_H

#include <stddef.h>
#include <stdint.h>

typedef struct arena_chunk arena_chunk;

typedef struct arena {
    arena_chunk *head; /* most recent chunk; older ones follow ->next */
    size_t bytes_used; /* total bytes handed out, for statistics */
} arena;

void arena_init(arena *a);
void arena_free(arena *a);

/* Zeroed memory of `size` bytes, aligned for any type. */
void *arena_alloc(arena *a, size_t size);
/* Zeroed array of `count` elements; dies on size overflow. */
void *arena_array(arena *a, size_t count, size_t elem_size);
/* Grows an arena array: returns a new array of new_count elements holding
 * the first old_count elements of old (which is left in place). */
void *arena_grow(arena *a, const void *old, size_t old_count, size_t new_count, size_t elem_size);
char *arena_strdup(arena *a, const char *s);
char *arena_strndup(arena *a, const char *s, size_t n);
char *arena_printf(arena *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Broken invariant of our own: print file:line and message, abort. */
_Noreturn void smelt_die(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define SMELT_DIE(...) smelt_die(__FILE__, __LINE__, __VA_ARGS__)

/* Overflow-checked size arithmetic: return 0 on success, 1 on overflow. */
static inline int size_mul_overflow(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_mul_overflow(a, b, out);
}
static inline int size_add_overflow(uint64_t a, uint64_t b, uint64_t *out) {
    return __builtin_add_overflow(a, b, out);
}

#endif
