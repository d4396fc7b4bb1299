/* arena.h - bump allocator that owns all memory of an IR module or AST.
 *
 * Everything allocated from an arena is freed at once by arena_free().
 *
 * Out of memory is bad luck, not a broken invariant, so it must end in a
 * diagnostic and a false status - but every part of the compiler allocates
 * from arenas, hundreds of calls deep, and checking each for NULL would hide
 * the code. So arena allocation never returns NULL: when malloc fails, the
 * arena marks itself (a->out_of_memory, sticky) and unwinds, with longjmp, to
 * the innermost *recovery point* of the calling thread. Each library
 * operation that allocates (parsing, elaboration, the pass driver, lowering
 * and codegen) sets one at its entry:
 *
 *     arena_recovery recovery;
 *     if (arena_recovery_enter(&recovery, setjmp(recovery.where))) {
 *         ... free what this operation owns ...
 *         diag_error(d, SMELT_NO_LOC, "out of memory");
 *         return false;
 *     }
 *     ... work ...
 *     arena_recovery_leave(&recovery);
 *
 * The rule this puts on code under a recovery point: memory taken with
 * malloc must not be held across a call that may allocate from an arena,
 * unless the entry point's handler can find and free it (it lives in the
 * operation's context struct), or the function holding it sets a recovery
 * point of its own that frees it and calls arena_out_of_memory() again to
 * pass the failure outwards. Objects modified after setjmp and read by the
 * handler live in memory reached through a pointer, or are volatile.
 * A plain malloc under a recovery point that fails may call
 * arena_out_of_memory() too, under the same rule.
 *
 * Allocating from an arena, or calling arena_out_of_memory(), with no
 * recovery point set is a broken invariant (smelt_die): every entry point
 * sets one, and the fault-injection sweep (tests/fault) checks it.
 */
#ifndef SMELT_ARENA_H
#define SMELT_ARENA_H

#include <setjmp.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef struct arena_chunk arena_chunk;

typedef struct arena {
    arena_chunk *head;  /* most recent chunk; older ones follow ->next */
    size_t bytes_used;  /* total bytes handed out, for statistics */
    bool out_of_memory; /* sticky: an allocation failed (see above) */
} arena;

/* A recovery point (see above); one lives in the frame of the entry point. */
typedef struct arena_recovery {
    jmp_buf where;
    struct arena_recovery *outer;
} arena_recovery;

/* Called with setjmp's result: 0 (just set) pushes r as the thread's
 * innermost recovery point and returns false; non-zero (an allocation
 * failed; r is already popped) returns true. */
bool arena_recovery_enter(arena_recovery *r, int jumped);
/* Pops r, which must be the innermost recovery point. */
void arena_recovery_leave(arena_recovery *r);
/* Unwinds to the innermost recovery point (popping it). */
_Noreturn void arena_out_of_memory(void);

void arena_init(arena *a);
void arena_free(arena *a);

/* Zeroed memory of `size` bytes, aligned for any type. */
void *arena_alloc(arena *a, size_t size);
/* Zeroed array of `count` elements; a size overflow is out of memory. */
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
