/* arena.c - bump allocator in chunks; see arena.h. */
#include "arena.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { ARENA_CHUNK_MIN = 64 * 1024, ARENA_ALIGN = 16 };

struct arena_chunk {
    arena_chunk *next;
    size_t capacity; /* bytes of data[] */
    size_t used;
    _Alignas(16) unsigned char data[];
};

static _Thread_local arena_recovery *innermost;

bool arena_recovery_enter(arena_recovery *r, int jumped) {
    if (jumped) return true;
    r->outer = innermost;
    innermost = r;
    return false;
}

void arena_recovery_leave(arena_recovery *r) {
    if (innermost != r) SMELT_DIE("arena recovery points left out of order");
    innermost = r->outer;
}

_Noreturn void arena_out_of_memory(void) {
    arena_recovery *r = innermost;
    if (!r) SMELT_DIE("out of memory with no recovery point set (see arena.h)");
    innermost = r->outer;
    longjmp(r->where, 1);
}

static _Noreturn void fail(arena *a) {
    a->out_of_memory = true;
    arena_out_of_memory();
}

void arena_init(arena *a) {
    a->head = NULL;
    a->bytes_used = 0;
    a->out_of_memory = false;
}

void arena_free(arena *a) {
    arena_chunk *c = a->head;
    while (c) {
        arena_chunk *next = c->next;
        free(c);
        c = next;
    }
    a->head = NULL;
    a->bytes_used = 0;
    a->out_of_memory = false;
}

void *arena_alloc(arena *a, size_t size) {
    size_t rounded = (size + ARENA_ALIGN - 1) & ~(size_t)(ARENA_ALIGN - 1);
    if (rounded < size) fail(a);
    if (rounded == 0) rounded = ARENA_ALIGN;
    arena_chunk *c = a->head;
    if (!c || c->capacity - c->used < rounded) {
        size_t capacity = rounded > ARENA_CHUNK_MIN ? rounded : ARENA_CHUNK_MIN;
        if (capacity > SIZE_MAX - sizeof(arena_chunk)) fail(a);
        c = malloc(sizeof(arena_chunk) + capacity);
        if (!c) fail(a);
        c->capacity = capacity;
        c->used = 0;
        c->next = a->head;
        a->head = c;
    }
    void *p = c->data + c->used;
    c->used += rounded;
    a->bytes_used += rounded;
    memset(p, 0, size);
    return p;
}

void *arena_array(arena *a, size_t count, size_t elem_size) {
    uint64_t bytes;
    if (size_mul_overflow(count, elem_size, &bytes) || bytes > SIZE_MAX / 2) fail(a);
    return arena_alloc(a, (size_t)bytes);
}

void *arena_grow(arena *a, const void *old, size_t old_count, size_t new_count, size_t elem_size) {
    void *p = arena_array(a, new_count, elem_size);
    if (old && old_count) memcpy(p, old, old_count * elem_size);
    return p;
}

char *arena_strndup(arena *a, const char *s, size_t n) {
    char *p = arena_alloc(a, n + 1);
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

char *arena_strdup(arena *a, const char *s) { return arena_strndup(a, s, strlen(s)); }

char *arena_printf(arena *a, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    if (n < 0) SMELT_DIE("bad format '%s'", fmt);
    char *p = arena_alloc(a, (size_t)n + 1);
    va_start(ap, fmt);
    vsnprintf(p, (size_t)n + 1, fmt, ap);
    va_end(ap);
    return p;
}

_Noreturn void smelt_die(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "%s:%d: internal error: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}
