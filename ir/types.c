/* types.c - types as text for diagnostics, and attribute comparison.
 *
 * The spelling is the text IR's (ir_io.h): `f32[tokens, 64]`, `f32[]` for a
 * scalar, `?` for a type not inferred yet. Messages from the shape rules,
 * the verifier and the passes print types through here so that an error
 * reads like the IR it refers to.
 */
#include "ir.h"

#include <stdarg.h>
#include <stdio.h>
#include <string.h>

/* Appends printf output to buffer[*used..size), never past the end. */
static void append(char *buffer, size_t size, size_t *used, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void append(char *buffer, size_t size, size_t *used, const char *fmt, ...) {
    if (*used >= size) return;
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buffer + *used, size - *used, fmt, ap);
    va_end(ap);
    if (n < 0) return;
    *used += (size_t)n < size - *used ? (size_t)n : size - *used - 1;
}

const char *ir_format_dim(const ir_module *m, ir_dim d, char *buffer, size_t size) {
    if (size == 0) return buffer;
    if (!ir_dim_is_symbol(d))
        snprintf(buffer, size, "%lld", (long long)d.size);
    else if ((uint32_t)d.symbol < m->symbol_count && m->symbols[d.symbol].name)
        snprintf(buffer, size, "%.*s%s", DIAG_NAME(m->symbols[d.symbol].name));
    else
        snprintf(buffer, size, "?symbol%d", (int)d.symbol);
    return buffer;
}

const char *ir_format_type(const ir_module *m, const ir_type *t, char *buffer, size_t size) {
    if (size == 0) return buffer;
    buffer[0] = '\0';
    size_t used = 0;
    if (t->dtype == SMELT_DTYPE_UNKNOWN) {
        append(buffer, size, &used, "?");
        return buffer;
    }
    append(buffer, size, &used, "%s[", smelt_dtype_name(t->dtype));
    unsigned rank = t->rank <= IR_MAX_DIMS ? t->rank : IR_MAX_DIMS;
    for (unsigned i = 0; i < rank; i++) {
        char dim[DIAG_NAME_MAX + 32];
        append(buffer, size, &used, "%s%s", i ? ", " : "", ir_format_dim(m, t->dims[i], dim, sizeof dim));
    }
    append(buffer, size, &used, "%s]", t->rank > IR_MAX_DIMS ? ", ..." : "");
    return buffer;
}

static bool same_string(const char *a, const char *b) {
    if (!a || !b) return a == b;
    return strcmp(a, b) == 0;
}

bool ir_attr_equal(const ir_attr *a, const ir_attr *b) {
    if (a->kind != b->kind) return false;
    switch (a->kind) {
    case IR_ATTR_NONE: return true;
    case IR_ATTR_INT: return a->as.i == b->as.i;
    case IR_ATTR_FLOAT: return memcmp(&a->as.f, &b->as.f, sizeof a->as.f) == 0;
    case IR_ATTR_BOOL: return a->as.b == b->as.b;
    case IR_ATTR_STRING: return same_string(a->as.s, b->as.s);
    case IR_ATTR_INTS:
        if (a->as.ints.count != b->as.ints.count) return false;
        for (uint32_t i = 0; i < a->as.ints.count; i++)
            if (a->as.ints.items[i] != b->as.ints.items[i]) return false;
        return true;
    case IR_ATTR_FLOATS:
        if (a->as.floats.count != b->as.floats.count) return false;
        for (uint32_t i = 0; i < a->as.floats.count; i++)
            if (memcmp(&a->as.floats.items[i], &b->as.floats.items[i], sizeof(double)) != 0) return false;
        return true;
    case IR_ATTR_SHAPE:
        if (a->as.shape.count != b->as.shape.count) return false;
        for (uint32_t i = 0; i < a->as.shape.count; i++)
            if (!ir_dim_equal(a->as.shape.items[i], b->as.shape.items[i])) return false;
        return true;
    }
    return false;
}
