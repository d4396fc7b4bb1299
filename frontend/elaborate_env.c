/* elaborate_env.c - the elaborator's environment (a hash map from names to
 * values), its error reporting, and its guards against runaway models. */
#include "elaborate.h"

#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

const char *fe_value_kind_text(fe_value_kind kind) {
    switch (kind) {
    case FE_VALUE_ERROR: return "an invalid value";
    case FE_VALUE_INT: return "an int";
    case FE_VALUE_FLOAT: return "a float";
    case FE_VALUE_BOOL: return "a bool";
    case FE_VALUE_STRING: return "a string";
    case FE_VALUE_TENSOR: return "a tensor";
    case FE_VALUE_DIM: return "a symbolic dim";
    case FE_VALUE_LIST: return "a list";
    case FE_VALUE_RESULTS: return "several results";
    case FE_VALUE_NULL: return "null";
    case FE_VALUE_OBJECT: return "an object";
    }
    return "a value";
}

/* ---- name map ------------------------------------------------------------ */

static uint64_t hash_bytes(uint64_t h, const void *data, size_t size) {
    const unsigned char *p = data;
    for (size_t i = 0; i < size; i++) {
        h ^= p[i];
        h *= 0x100000001b3ull; /* FNV-1a */
    }
    return h;
}

/* Hashes the length and at most 64 bytes from each end, so that a huge
 * name costs little more than the strcmp that confirms a match. */
static uint64_t hash_name(const char *name, size_t length) {
    uint64_t h = hash_bytes(0xcbf29ce484222325ull, &length, sizeof length);
    if (length <= 128) return hash_bytes(h, name, length);
    h = hash_bytes(h, name, 64);
    return hash_bytes(h, name + length - 64, 64);
}

void fe_name_map_free(fe_name_map *map) {
    free(map->slots);
    memset(map, 0, sizeof *map);
}

/* The slot holding `name` (of `length` bytes), or the empty slot where it would go. */
static fe_binding_entry *find_slot(const fe_name_map *map, const char *name, size_t length, uint64_t hash) {
    uint32_t mask = map->capacity - 1;
    for (uint32_t i = (uint32_t)hash & mask;; i = (i + 1) & mask) {
        fe_binding_entry *e = &map->slots[i];
        if (!e->name) return e;
        if (e->hash == hash && strncmp(e->name, name, length) == 0 && e->name[length] == '\0') return e;
    }
}

static void grow(fe_name_map *map) {
    uint32_t capacity = map->capacity ? map->capacity * 2 : 64;
    if (capacity < map->capacity) SMELT_DIE("name map of %u slots overflows", map->capacity);
    fe_name_map grown = {calloc(capacity, sizeof(fe_binding_entry)), capacity, map->used};
    if (!grown.slots) arena_out_of_memory(); /* the map is freed with its elaboration */
    for (uint32_t i = 0; i < map->capacity; i++)
        if (map->slots[i].name) {
            const fe_binding_entry *e = &map->slots[i];
            *find_slot(&grown, e->name, strlen(e->name), e->hash) = *e;
        }
    free(map->slots);
    *map = grown;
}

fe_binding_entry *fe_name_map_get_bytes(const fe_name_map *map, const char *name, size_t length) {
    if (map->capacity == 0) return NULL;
    fe_binding_entry *e = find_slot(map, name, length, hash_name(name, length));
    return e->name && e->bound ? e : NULL;
}

fe_binding_entry *fe_name_map_get(const fe_name_map *map, const char *name) {
    return fe_name_map_get_bytes(map, name, strlen(name));
}

fe_binding_entry *fe_name_map_bind(fe_name_map *map, const char *name, fe_value value,
                                   fe_binding_origin origin, smelt_loc loc) {
    if ((map->used + 1) * 2 > map->capacity) grow(map); /* load factor <= 1/2 */
    size_t length = strlen(name);
    uint64_t hash = hash_name(name, length);
    fe_binding_entry *e = find_slot(map, name, length, hash);
    if (!e->name) {
        e->name = name;
        e->hash = hash;
        map->used++;
    }
    e->bound = true;
    e->value = value;
    e->origin = origin;
    e->loc = loc;
    return e;
}

void fe_name_map_unbind(fe_name_map *map, const char *name) {
    fe_binding_entry *e = fe_name_map_get(map, name);
    if (e) e->bound = false;
}

/* ---- diagnostics --------------------------------------------------------- */

static void report(fe_elaborator *el, diag_severity severity, smelt_loc loc, const char *fmt, va_list ap) {
    char message[1024];
    vsnprintf(message, sizeof message, fmt, ap);
    if (severity == DIAG_NOTE) {
        if (el->last_error_shown) diag_report(el->diag, DIAG_NOTE, loc, "%s", message);
        return;
    }
    el->failed = true;
    uint64_t h = hash_bytes(0xcbf29ce484222325ull, &loc, sizeof loc);
    h = hash_bytes(h, message, strlen(message));
    for (uint32_t i = 0; i < el->reported_count; i++) {
        if (el->reported[i] == h) {
            el->last_error_shown = false;
            return;
        }
    }
    if (el->reported_count < sizeof el->reported / sizeof el->reported[0])
        el->reported[el->reported_count++] = h;
    diag_report(el->diag, severity, loc, "%s", message);
    el->last_error_shown = !diag_should_stop(el->diag);
    if (diag_should_stop(el->diag)) el->stopped = true;
}

void fe_error(fe_elaborator *el, smelt_loc loc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    report(el, DIAG_ERROR, loc, fmt, ap);
    va_end(ap);
}

void fe_note(fe_elaborator *el, smelt_loc loc, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    report(el, DIAG_NOTE, loc, fmt, ap);
    va_end(ap);
}

/* ---- guards -------------------------------------------------------------- */

bool fe_spend_work(fe_elaborator *el, smelt_loc loc, uint64_t units) {
    if (el->stopped) return false;
    el->work += units;
    if (el->work <= FE_MAX_WORK) return true;
    fe_error(el, loc, "elaboration stopped after %llu steps; is a loop bound too large?",
             (unsigned long long)FE_MAX_WORK);
    el->stopped = true;
    return false;
}

bool fe_room_for_op(fe_elaborator *el, smelt_loc loc) {
    if (el->stopped) return false;
    if (el->module->op_count < FE_MAX_OPS) return true;
    fe_error(el, loc, "the model grows past %d ops; is a loop bound too large?", FE_MAX_OPS);
    el->stopped = true;
    return false;
}

bool fe_enter(fe_elaborator *el, smelt_loc loc) {
    if (el->stopped) return false;
    if (el->depth < FE_MAX_NESTING) {
        el->depth++;
        return true;
    }
    fe_error(el, loc, "blocks and expressions are nested more than %d levels deep", FE_MAX_NESTING);
    el->stopped = true;
    return false;
}
