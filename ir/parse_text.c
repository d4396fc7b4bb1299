/* parse_text.c - reads text IR back into a module (the format in ir_io.h).
 *
 * A recursive-descent parser over the tokens of text_lexer.c, one statement
 * per line; nothing recurses on the input, so nesting cannot exhaust the
 * stack. An error skips the rest of its line and parsing goes on, so one
 * run reports every bad line. Values named on a bad line are remembered as
 * "poisoned": later uses of them are not reported again.
 *
 * What is checked here is what the text form itself promises: names defined
 * once and before use, ops and attributes that exist, attribute values of
 * the schema's kind, result counts, declared types on input/weight/const,
 * dims declared before use, numbers that fit. Operand counts, required
 * attributes, STRING choices and shapes are the verifier's (verify.c).
 *
 * On failure `out` is freed (and left zeroed, so freeing it again is
 * harmless); on success the caller owns it and frees it with ir_module_free.
 */
#include "ir_io.h"
#include "text_lexer.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- name tables: name -> index, open addressing ------------------------ */

typedef struct name_entry {
    const char *name; /* NULL: empty slot; not NUL-terminated (points into the text) */
    size_t length;
    uint32_t index; /* value id, symbol or param index; or VALUE_PENDING, VALUE_POISONED */
    smelt_loc loc;  /* where it was defined, for notes */
} name_entry;

typedef struct name_table {
    name_entry *slots;
    size_t capacity; /* a power of two, or 0 */
    size_t count;
} name_table;

static uint64_t hash_bytes(const char *s, size_t n) { /* FNV-1a */
    uint64_t h = 1469598103934665603u;
    for (size_t i = 0; i < n; i++)
        h = (h ^ (unsigned char)s[i]) * 1099511628211u;
    return h;
}

static name_entry *name_table_slot(const name_table *t, const char *name, size_t length) {
    size_t i = (size_t)hash_bytes(name, length) & (t->capacity - 1);
    while (t->slots[i].name && !(t->slots[i].length == length && memcmp(t->slots[i].name, name, length) == 0))
        i = (i + 1) & (t->capacity - 1);
    return &t->slots[i];
}

static name_entry *name_table_find(const name_table *t, const char *name, size_t length) {
    if (t->capacity == 0) return NULL;
    name_entry *e = name_table_slot(t, name, length);
    return e->name ? e : NULL;
}

/* Adds a name that is not in the table yet; keeps the load under one half. */
static name_entry *name_table_add(name_table *t, const char *name, size_t length, uint32_t index,
                                  smelt_loc loc) {
    if (2 * (t->count + 1) > t->capacity) {
        name_table grown = {.capacity = t->capacity ? 2 * t->capacity : 64};
        if (grown.capacity < t->capacity) SMELT_DIE("name table overflow");
        grown.slots = calloc(grown.capacity, sizeof *grown.slots);
        if (!grown.slots) arena_out_of_memory(); /* ir_parse_text frees the tables */
        for (size_t i = 0; i < t->capacity; i++)
            if (t->slots[i].name)
                *name_table_slot(&grown, t->slots[i].name, t->slots[i].length) = t->slots[i];
        grown.count = t->count;
        free(t->slots);
        *t = grown;
    }
    name_entry *e = name_table_slot(t, name, length);
    *e = (name_entry){name, length, index, loc};
    t->count++;
    return e;
}

/* ---- parser state and error helpers ------------------------------------- */

enum { PARSER_MAX_ATTRS = 32 }; /* more than any op's schema has */

/* Value table entries for names without a value: one being defined on the
 * current line (a use of it is a use before definition), and one whose
 * line failed (a use of it fails quietly: the failure was reported). */
#define VALUE_PENDING (IR_NO_VALUE - 1)
#define VALUE_POISONED IR_NO_VALUE

typedef struct parser {
    ir_lexer lexer;
    ir_token token; /* the current token */
    diag_engine *diag;
    ir_module *m;
    arena scratch; /* decoded names and number texts; dropped at the end */
    name_table values, symbols, params;
    bool failed;      /* some error was reported */
    bool line_failed; /* the current line has an error: skip the rest of it */
    bool have_source, have_precision, have_arena;
    smelt_loc source_loc;
    /* The op being parsed (too big for the stack of a deep caller). */
    ir_token results[IR_MAX_RESULTS];
    ir_value_id operands[IR_MAX_OPERANDS];
    ir_type types[IR_MAX_RESULTS];
    ir_buffer buffers[IR_MAX_RESULTS];
    smelt_loc type_locs[IR_MAX_RESULTS];
    ir_attr attrs[PARSER_MAX_ATTRS];
    int64_t *ints; /* INTS attribute being read (malloc'd, grows) */
    size_t ints_capacity;
    double *floats; /* FLOATS attribute being read (malloc'd, grows) */
    size_t floats_capacity;
} parser;

#define PARSE_ERROR(p, loc, ...)                                                                             \
    do {                                                                                                     \
        (p)->failed = (p)->line_failed = true;                                                               \
        diag_error((p)->diag, (loc), __VA_ARGS__);                                                           \
    } while (0)

static void advance(parser *p) { p->token = ir_lexer_next(&p->lexer); }

static bool at(const parser *p, ir_token_kind kind) { return p->token.kind == kind; }

static bool at_word(const parser *p, const char *word) {
    size_t n = strlen(word);
    return p->token.kind == IR_TOKEN_IDENT && p->token.length == n && memcmp(p->token.text, word, n) == 0;
}

static bool accept(parser *p, ir_token_kind kind) {
    if (!at(p, kind)) return false;
    advance(p);
    return true;
}

/* "expected WHAT, found X" at the current token. A token the lexer already
 * refused is not reported twice. */
static void expected(parser *p, const char *what) {
    const ir_token *t = &p->token;
    if (t->kind == IR_TOKEN_ERROR) {
        p->failed = p->line_failed = true;
    } else if (t->kind == IR_TOKEN_EOF) {
        PARSE_ERROR(p, t->loc, "expected %s, found end of input", what);
    } else if (t->kind == IR_TOKEN_NEWLINE) {
        PARSE_ERROR(p, t->loc, "expected %s, found end of line", what);
    } else if (t->kind == IR_TOKEN_STRING) {
        PARSE_ERROR(p, t->loc, "expected %s, found a string", what);
    } else {
        PARSE_ERROR(p, t->loc, "expected %s, found '%.*s%s'", what, IR_TOKEN_NAME(t));
    }
}

static bool expect(parser *p, ir_token_kind kind, const char *what) {
    if (accept(p, kind)) return true;
    expected(p, what);
    return false;
}

/* Skips to the end of the line without reporting what it skips. */
static void skip_line(parser *p) {
    p->lexer.quiet = true;
    while (!at(p, IR_TOKEN_NEWLINE) && !at(p, IR_TOKEN_EOF))
        advance(p);
    p->lexer.quiet = false;
}

static void skip_newlines(parser *p) {
    while (at(p, IR_TOKEN_NEWLINE))
        advance(p);
}

/* ---- literals ----------------------------------------------------------- */

/* The INT token at hand, negated when a '-' (at `loc`) came before it. */
static bool int_from_token(parser *p, bool negative, smelt_loc loc, int64_t *out) {
    const ir_token *t = &p->token;
    uint64_t limit = negative ? (uint64_t)INT64_MAX + 1 : (uint64_t)INT64_MAX;
    if (t->int_overflow || t->int_value > limit) {
        PARSE_ERROR(p, loc, "integer '%s%.*s%s' does not fit in 64 bits", negative ? "-" : "",
                    IR_TOKEN_NAME(t));
        return false;
    }
    if (!negative)
        *out = (int64_t)t->int_value;
    else
        *out = t->int_value == limit ? INT64_MIN : -(int64_t)t->int_value;
    advance(p);
    return true;
}

static bool at_float(const parser *p) {
    return at(p, IR_TOKEN_INT) || at(p, IR_TOKEN_FLOAT) || at_word(p, "inf") || at_word(p, "nan");
}

/* The INT, FLOAT, inf or nan token at hand (at_float), negated after '-':
 * an integer literal is a fine float. */
static bool float_from_token(parser *p, bool negative, smelt_loc loc, double *out) {
    double v;
    if (at_word(p, "inf")) {
        v = INFINITY;
    } else if (at_word(p, "nan")) {
        v = NAN;
    } else {
        char *text = ir_token_text(&p->token, &p->scratch);
        errno = 0;
        v = strtod(text, NULL);
        if (errno == ERANGE && isinf(v)) {
            PARSE_ERROR(p, loc, "float '%s%.*s%s' is out of range", negative ? "-" : "",
                        IR_TOKEN_NAME(&p->token));
            return false;
        }
    }
    *out = negative ? -v : v;
    advance(p);
    return true;
}

/* ['-'] INT that fits in int64. */
static bool parse_int(parser *p, int64_t *out, const char *what) {
    smelt_loc loc = p->token.loc;
    bool negative = accept(p, IR_TOKEN_MINUS);
    if (at(p, IR_TOKEN_INT)) return int_from_token(p, negative, loc, out);
    expected(p, what);
    return false;
}

/* ['-'] (INT | FLOAT | inf | nan) */
static bool parse_float(parser *p, double *out, const char *what) {
    smelt_loc loc = p->token.loc;
    bool negative = accept(p, IR_TOKEN_MINUS);
    if (at_float(p)) return float_from_token(p, negative, loc, out);
    expected(p, what);
    return false;
}

static bool parse_bool(parser *p, bool *out) {
    if (at_word(p, "true") || at_word(p, "false")) {
        *out = at_word(p, "true");
        advance(p);
        return true;
    }
    expected(p, "true or false");
    return false;
}

/* A STRING token's value, in `a`. */
static bool parse_string(parser *p, const char **out, arena *a) {
    if (!at(p, IR_TOKEN_STRING)) {
        expected(p, "a string");
        return false;
    }
    *out = ir_token_string(&p->token, a);
    advance(p);
    return true;
}

/* name := IDENT | STRING (names that are not identifiers print quoted). */
static bool parse_name(parser *p, const char **out, smelt_loc *loc) {
    *loc = p->token.loc;
    if (at(p, IR_TOKEN_IDENT)) {
        *out = ir_token_text(&p->token, &p->scratch);
        advance(p);
        return true;
    }
    if (at(p, IR_TOKEN_STRING)) return parse_string(p, out, &p->scratch);
    expected(p, "a name");
    return false;
}

/* ---- types ---------------------------------------------------------------- */

/* dim := INT | name   (a name must have been declared by a `dim` line) */
static bool parse_dim_item(parser *p, ir_dim *out) {
    if (at(p, IR_TOKEN_INT)) {
        int64_t size;
        if (!parse_int(p, &size, "a dim")) return false;
        *out = ir_dim_const(size);
        return true;
    }
    if (!at(p, IR_TOKEN_IDENT) && !at(p, IR_TOKEN_STRING)) {
        expected(p, "a dim size or name");
        return false;
    }
    ir_token t = p->token;
    const char *name = t.text;
    size_t length = t.length;
    if (t.kind == IR_TOKEN_STRING) {
        name = ir_token_string(&t, &p->scratch);
        length = strlen(name);
    }
    const name_entry *e = name_table_find(&p->symbols, name, length);
    if (!e) {
        PARSE_ERROR(p, t.loc, "use of undeclared dim '%.*s%s'", IR_TOKEN_NAME(&t));
        return false;
    }
    *out = ir_dim_symbol((int32_t)e->index);
    advance(p);
    return true;
}

/* type := '?' | DTYPE '[' [dim (',' dim)*] ']' */
static bool parse_type(parser *p, ir_type *out) {
    memset(out, 0, sizeof *out);
    if (accept(p, IR_TOKEN_QUESTION)) return true;
    if (!at(p, IR_TOKEN_IDENT)) {
        expected(p, "a type");
        return false;
    }
    out->dtype = smelt_dtype_from_name(p->token.text, p->token.length);
    if (out->dtype == SMELT_DTYPE_UNKNOWN) {
        PARSE_ERROR(p, p->token.loc, "unknown dtype '%.*s%s'", IR_TOKEN_NAME(&p->token));
        return false;
    }
    advance(p);
    if (!expect(p, IR_TOKEN_LBRACKET, "'['")) return false;
    if (accept(p, IR_TOKEN_RBRACKET)) return true;
    for (;;) {
        if (out->rank == IR_MAX_DIMS) {
            PARSE_ERROR(p, p->token.loc, "a type has at most %d dims", IR_MAX_DIMS);
            return false;
        }
        if (!parse_dim_item(p, &out->dims[out->rank])) return false;
        out->rank++;
        if (!accept(p, IR_TOKEN_COMMA)) break;
    }
    return expect(p, IR_TOKEN_RBRACKET, "',' or ']'");
}

/* ---- attributes ----------------------------------------------------------- */

static const char *kind_with_article(ir_attr_kind kind) {
    switch (kind) {
    case IR_ATTR_INT: return "an int";
    case IR_ATTR_FLOAT: return "a float";
    case IR_ATTR_BOOL: return "a bool";
    case IR_ATTR_STRING: return "a string";
    case IR_ATTR_INTS: return "a list of ints";
    case IR_ATTR_SHAPE: return "a shape";
    case IR_ATTR_FLOATS: return "a list of floats";
    default: return "nothing";
    }
}

/* "attribute 'eps' of 'rms_norm' expects a float, found a string" */
static void attr_kind_error(parser *p, const ir_op_info *info, const ir_attr_schema *s) {
    const ir_token *t = &p->token;
    const char *found = NULL;
    if (t->kind == IR_TOKEN_INT)
        found = "an int";
    else if (t->kind == IR_TOKEN_FLOAT || at_word(p, "inf") || at_word(p, "nan"))
        found = "a float";
    else if (at_word(p, "true") || at_word(p, "false"))
        found = "a bool";
    else if (t->kind == IR_TOKEN_STRING)
        found = "a string";
    else if (t->kind == IR_TOKEN_LBRACKET)
        found = "a list";
    if (t->kind == IR_TOKEN_ERROR)
        p->failed = p->line_failed = true;
    else if (found)
        PARSE_ERROR(p, t->loc, "attribute '%s' of '%s' expects %s, found %s", s->name, info->name,
                    kind_with_article(s->kind), found);
    else {
        char what[96];
        snprintf(what, sizeof what, "%s for attribute '%s'", kind_with_article(s->kind), s->name);
        expected(p, what);
    }
}

static bool parse_ints(parser *p, ir_attr *out) {
    size_t count = 0;
    if (!accept(p, IR_TOKEN_RBRACKET)) {
        for (;;) {
            if (count == p->ints_capacity) {
                size_t capacity = p->ints_capacity ? 2 * p->ints_capacity : 16;
                if (capacity > UINT32_MAX) {
                    PARSE_ERROR(p, p->token.loc, "list has too many entries");
                    return false;
                }
                int64_t *grown = realloc(p->ints, capacity * sizeof *grown);
                if (!grown) arena_out_of_memory(); /* ir_parse_text frees p->ints */
                p->ints = grown;
                p->ints_capacity = capacity;
            }
            if (!parse_int(p, &p->ints[count], "an int")) return false;
            count++;
            if (!accept(p, IR_TOKEN_COMMA)) break;
        }
        if (!expect(p, IR_TOKEN_RBRACKET, "',' or ']'")) return false;
    }
    out->as.ints.count = (uint32_t)count;
    out->as.ints.items = arena_array(&p->m->arena, count ? count : 1, sizeof(int64_t));
    if (count) memcpy(out->as.ints.items, p->ints, count * sizeof(int64_t));
    return true;
}

/* '[' already read: float { ',' float } ']' (or ']'), into the module's arena. */
static bool parse_floats(parser *p, ir_attr *out) {
    size_t count = 0;
    if (!accept(p, IR_TOKEN_RBRACKET)) {
        for (;;) {
            if (count == p->floats_capacity) {
                size_t capacity = p->floats_capacity ? 2 * p->floats_capacity : 16;
                if (capacity > UINT32_MAX) {
                    PARSE_ERROR(p, p->token.loc, "list has too many entries");
                    return false;
                }
                double *grown = realloc(p->floats, capacity * sizeof *grown);
                if (!grown) arena_out_of_memory(); /* ir_parse_text frees p->floats */
                p->floats = grown;
                p->floats_capacity = capacity;
            }
            if (!parse_float(p, &p->floats[count], "a float")) return false;
            count++;
            if (!accept(p, IR_TOKEN_COMMA)) break;
        }
        if (!expect(p, IR_TOKEN_RBRACKET, "',' or ']'")) return false;
    }
    out->as.floats.count = (uint32_t)count;
    out->as.floats.items = arena_array(&p->m->arena, count ? count : 1, sizeof(double));
    if (count) memcpy(out->as.floats.items, p->floats, count * sizeof(double));
    return true;
}

static bool parse_shape(parser *p, ir_attr *out) {
    ir_dim dims[IR_MAX_DIMS];
    uint32_t count = 0;
    if (!accept(p, IR_TOKEN_RBRACKET)) {
        for (;;) {
            if (count == IR_MAX_DIMS) {
                PARSE_ERROR(p, p->token.loc, "a shape has at most %d dims", IR_MAX_DIMS);
                return false;
            }
            if (!parse_dim_item(p, &dims[count])) return false;
            count++;
            if (!accept(p, IR_TOKEN_COMMA)) break;
        }
        if (!expect(p, IR_TOKEN_RBRACKET, "',' or ']'")) return false;
    }
    out->as.shape.count = count;
    out->as.shape.items = arena_array(&p->m->arena, count ? count : 1, sizeof(ir_dim));
    if (count) memcpy(out->as.shape.items, dims, count * sizeof(ir_dim));
    return true;
}

/* value := ['-'] (INT | FLOAT | inf | nan) | true | false | STRING | '[' list ']'
 * of the kind the schema gives; an INT is a fine FLOAT. */
static bool parse_attr_value(parser *p, const ir_op_info *info, const ir_attr_schema *s, ir_attr *value) {
    smelt_loc loc = p->token.loc;
    bool negative = (s->kind == IR_ATTR_INT || s->kind == IR_ATTR_FLOAT) && accept(p, IR_TOKEN_MINUS);
    bool fits = s->kind == IR_ATTR_INT      ? at(p, IR_TOKEN_INT)
                : s->kind == IR_ATTR_FLOAT  ? at_float(p)
                : s->kind == IR_ATTR_BOOL   ? at_word(p, "true") || at_word(p, "false")
                : s->kind == IR_ATTR_STRING ? at(p, IR_TOKEN_STRING)
                                            : at(p, IR_TOKEN_LBRACKET);
    if (!fits) {
        attr_kind_error(p, info, s);
        return false;
    }
    switch (s->kind) {
    case IR_ATTR_INT: return int_from_token(p, negative, loc, &value->as.i);
    case IR_ATTR_FLOAT: return float_from_token(p, negative, loc, &value->as.f);
    case IR_ATTR_BOOL: return parse_bool(p, &value->as.b);
    case IR_ATTR_STRING: return parse_string(p, &value->as.s, &p->m->arena);
    case IR_ATTR_INTS: advance(p); return parse_ints(p, value);
    case IR_ATTR_SHAPE: advance(p); return parse_shape(p, value);
    case IR_ATTR_FLOATS: advance(p); return parse_floats(p, value);
    default: SMELT_DIE("attribute '%s' of '%s' has kind %d", s->name, info->name, (int)s->kind);
    }
}

/* attr := IDENT '=' value */
static bool parse_attr(parser *p, const ir_op_info *info) {
    if (!at(p, IR_TOKEN_IDENT)) {
        expected(p, "an attribute name");
        return false;
    }
    ir_token name = p->token;
    int slot = -1;
    char key[DIAG_NAME_MAX + 1];
    if (name.length < sizeof key) {
        memcpy(key, name.text, name.length);
        key[name.length] = '\0';
        slot = ir_attr_slot(info->kind, key);
    }
    if (slot < 0) {
        PARSE_ERROR(p, name.loc, "unknown attribute '%.*s%s' for op '%s'", IR_TOKEN_NAME(&name), info->name);
        return false;
    }
    ir_attr *a = &p->attrs[slot];
    if (a->kind != IR_ATTR_NONE) {
        PARSE_ERROR(p, name.loc, "duplicate attribute '%s'", info->attrs[slot].name);
        return false;
    }
    advance(p);
    if (!expect(p, IR_TOKEN_EQUAL, "'='")) return false;

    ir_attr value = {.kind = info->attrs[slot].kind};
    if (!parse_attr_value(p, info, &info->attrs[slot], &value)) return false;
    *a = value;
    return true;
}

/* ---- ops ------------------------------------------------------------------ */

static const ir_op_info *find_op(const ir_token *name) {
    char key[32];
    if (name->length >= sizeof key) return NULL;
    memcpy(key, name->text, name->length);
    key[name->length] = '\0';
    return ir_op_info_by_name(key);
}

/* results := VALUE (',' VALUE)* '='
 * Each name goes into the value table at once, pending until its op
 * exists, so that `%a, %a = ...` is a redefinition and `%a = silu(%a)` a
 * use before definition. */
static bool parse_results(parser *p, uint32_t *count) {
    for (;;) {
        if (!at(p, IR_TOKEN_VALUE)) {
            expected(p, "a value name");
            return false;
        }
        const ir_token *t = &p->token;
        if (*count == IR_MAX_RESULTS) {
            PARSE_ERROR(p, t->loc, "an op has at most %d results", IR_MAX_RESULTS);
            return false;
        }
        const name_entry *first = name_table_find(&p->values, t->text, t->length);
        if (first) {
            PARSE_ERROR(p, t->loc, "redefinition of '%.*s%s'", IR_TOKEN_NAME(t));
            diag_note(p->diag, first->loc, "'%.*s%s' was first defined here", IR_TOKEN_NAME(t));
            return false;
        }
        name_table_add(&p->values, t->text, t->length, VALUE_PENDING, t->loc);
        p->results[(*count)++] = *t;
        advance(p);
        if (!accept(p, IR_TOKEN_COMMA)) break;
    }
    return expect(p, IR_TOKEN_EQUAL, "',' or '='");
}

/* operands := [VALUE (',' VALUE)*] ')' */
static bool parse_operands(parser *p, uint32_t *count) {
    if (accept(p, IR_TOKEN_RPAREN)) return true;
    for (;;) {
        if (!at(p, IR_TOKEN_VALUE)) {
            expected(p, "a value");
            return false;
        }
        const ir_token *t = &p->token;
        if (*count == IR_MAX_OPERANDS) {
            PARSE_ERROR(p, t->loc, "an op has at most %d operands", IR_MAX_OPERANDS);
            return false;
        }
        const name_entry *e = name_table_find(&p->values, t->text, t->length);
        if (!e || e->index == VALUE_PENDING) {
            PARSE_ERROR(p, t->loc, "use of undefined value '%.*s%s'", IR_TOKEN_NAME(t));
            return false;
        }
        if (e->index == VALUE_POISONED) { /* its line failed and was reported */
            p->line_failed = true;
            return false;
        }
        p->operands[(*count)++] = e->index;
        advance(p);
        if (!accept(p, IR_TOKEN_COMMA)) break;
    }
    return expect(p, IR_TOKEN_RPAREN, "',' or ')'");
}

/* loc := 'loc' '(' LINE ':' COL ')'   in the file of the `source` line */
static bool parse_loc(parser *p, smelt_loc *out) {
    smelt_loc at_loc = p->token.loc;
    advance(p);
    if (!p->have_source) {
        PARSE_ERROR(p, at_loc, "'loc(...)' needs a 'source' line before it");
        return false;
    }
    int64_t line, col;
    if (!expect(p, IR_TOKEN_LPAREN, "'('")) return false;
    smelt_loc line_loc = p->token.loc;
    if (!parse_int(p, &line, "a line number")) return false;
    if (line < 1 || line > UINT32_MAX) {
        PARSE_ERROR(p, line_loc, "expected a line number from 1 to %u, found %lld", UINT32_MAX,
                    (long long)line);
        return false;
    }
    if (!expect(p, IR_TOKEN_COLON, "':'")) return false;
    smelt_loc col_loc = p->token.loc;
    if (!parse_int(p, &col, "a column number")) return false;
    if (col < 0 || col > UINT32_MAX) {
        PARSE_ERROR(p, col_loc, "expected a column number from 0 to %u, found %lld", UINT32_MAX,
                    (long long)col);
        return false;
    }
    if (!expect(p, IR_TOKEN_RPAREN, "')'")) return false;
    *out = (smelt_loc){p->m->source_file, (uint32_t)line, (uint32_t)col};
    return true;
}

/* '(' INT ')' with the INT in [0, max]: an annotation's argument. */
static bool parse_annotation_int(parser *p, const char *what, int64_t max, int64_t *out) {
    advance(p); /* the annotation's word */
    if (!expect(p, IR_TOKEN_LPAREN, "'('")) return false;
    smelt_loc loc = p->token.loc;
    if (!parse_int(p, out, what)) return false;
    if (*out < 0 || *out > max) {
        PARSE_ERROR(p, loc, "expected %s from 0 to %lld, found %lld", what, (long long)max, (long long)*out);
        return false;
    }
    return expect(p, IR_TOKEN_RPAREN, "')'");
}

/* rows := 'rows' '(' 'wanted' ')'   (after group and step) */
static bool parse_rows(parser *p, bool *wanted) {
    advance(p); /* 'rows' */
    if (!expect(p, IR_TOKEN_LPAREN, "'('")) return false;
    if (!at_word(p, "wanted")) {
        expected(p, "'wanted'");
        return false;
    }
    advance(p);
    *wanted = true;
    return expect(p, IR_TOKEN_RPAREN, "')'");
}

/* buffer := 'arena' '(' INT ')' | 'weight' '(' INT ')'   (after a result's type) */
static bool parse_buffer(parser *p, ir_buffer *out) {
    *out = (ir_buffer){IR_BUFFER_NONE, 0};
    int64_t offset;
    if (at_word(p, "arena")) {
        if (!parse_annotation_int(p, "an arena offset", INT64_MAX, &offset)) return false;
        *out = (ir_buffer){IR_BUFFER_ARENA, (uint64_t)offset};
    } else if (at_word(p, "weight")) {
        if (!parse_annotation_int(p, "a weight index", UINT32_MAX - 1, &offset)) return false;
        *out = (ir_buffer){IR_BUFFER_WEIGHT, (uint64_t)offset};
    }
    return true;
}

/* The checks that need the whole line: result count, type count, declared
 * types. Reports every one that fails. */
static bool check_op(parser *p, const ir_op_info *info, const ir_token *name, uint32_t result_count,
                     bool have_types, uint32_t type_count, smelt_loc types_loc) {
    bool ok = true;
    uint32_t expected_results = result_count;
    if (info->results >= 0) {
        expected_results = (uint32_t)info->results;
    } else { /* split: one result per `sizes` entry */
        int slot = ir_attr_slot(info->kind, "sizes");
        if (slot >= 0 && p->attrs[slot].kind == IR_ATTR_INTS) expected_results = p->attrs[slot].as.ints.count;
    }
    if (result_count != expected_results) {
        PARSE_ERROR(p, name->loc, "expected %u result%s for '%s', found %u", expected_results,
                    expected_results == 1 ? "" : "s", info->name, result_count);
        ok = false;
    }
    if (have_types && type_count != result_count) {
        PARSE_ERROR(p, types_loc, "expected %u type%s for the results of '%s', found %u", result_count,
                    result_count == 1 ? "" : "s", info->name, type_count);
        ok = false;
    }
    if (ok && (info->flags & IR_OPF_DECLARES_TYPE)) {
        for (uint32_t r = 0; r < result_count; r++) {
            if (!have_types) {
                PARSE_ERROR(p, name->loc, "op '%s' needs a declared type (': dtype[dims]')", info->name);
                ok = false;
                break;
            }
            if (p->types[r].dtype == SMELT_DTYPE_UNKNOWN) {
                PARSE_ERROR(p, p->type_locs[r], "op '%s' needs a known type, found '?'", info->name);
                ok = false;
            }
        }
    }
    return ok;
}

/* op := [results '='] NAME '(' operands ')' ['{' attr (',' attr)* '}']
 *       [':' type buffer (',' type buffer)*] ['group' '(' INT ')'] ['step' '(' INT ')'] [rows] [loc]
 * Without `: types` every result type is unknown. */
static void parse_op_line(parser *p, uint32_t *results) {
    uint32_t result_count = 0, operand_count = 0, type_count = 0;
    bool results_ok = !at(p, IR_TOKEN_VALUE) || parse_results(p, &result_count);
    *results = result_count;
    if (!results_ok) return;
    if (!at(p, IR_TOKEN_IDENT)) {
        expected(p, "an op name");
        return;
    }
    ir_token name = p->token;
    const ir_op_info *info = find_op(&name);
    if (!info) {
        PARSE_ERROR(p, name.loc, "unknown op '%.*s%s'", IR_TOKEN_NAME(&name));
        return;
    }
    if (info->attr_count > PARSER_MAX_ATTRS)
        SMELT_DIE("op '%s' has %u attributes", info->name, info->attr_count);
    advance(p);
    if (!expect(p, IR_TOKEN_LPAREN, "'('") || !parse_operands(p, &operand_count)) return;

    memset(p->attrs, 0, sizeof p->attrs);
    if (accept(p, IR_TOKEN_LBRACE) && !accept(p, IR_TOKEN_RBRACE)) {
        for (;;) {
            if (!parse_attr(p, info)) return;
            if (!accept(p, IR_TOKEN_COMMA)) break;
        }
        if (!expect(p, IR_TOKEN_RBRACE, "',' or '}'")) return;
    }

    smelt_loc types_loc = p->token.loc;
    bool have_types = accept(p, IR_TOKEN_COLON);
    if (have_types) {
        for (;;) {
            if (type_count == IR_MAX_RESULTS) {
                PARSE_ERROR(p, p->token.loc, "an op has at most %d results", IR_MAX_RESULTS);
                return;
            }
            p->type_locs[type_count] = p->token.loc;
            if (!parse_type(p, &p->types[type_count]) || !parse_buffer(p, &p->buffers[type_count])) return;
            type_count++;
            if (!accept(p, IR_TOKEN_COMMA)) break;
        }
    }

    int64_t group = IR_NONE, step = IR_NONE;
    if (at_word(p, "group") && !parse_annotation_int(p, "a group number", UINT32_MAX - 1, &group)) return;
    if (at_word(p, "step") && !parse_annotation_int(p, "a step number", UINT32_MAX - 1, &step)) return;
    bool wanted_rows = false;
    if (at_word(p, "rows") && !parse_rows(p, &wanted_rows)) return;
    smelt_loc loc = name.loc; /* its own place in the .ir file unless loc(...) says */
    if (at_word(p, "loc") && !parse_loc(p, &loc)) return;
    if (!at(p, IR_TOKEN_NEWLINE) && !at(p, IR_TOKEN_EOF) && !at(p, IR_TOKEN_RBRACE)) {
        expected(p, "end of line");
        return;
    }
    if (!check_op(p, info, &name, result_count, have_types, type_count, types_loc)) return;

    uint32_t index = ir_append_op(p->m, info->kind, p->operands, operand_count, result_count, loc);
    ir_op *op = &p->m->ops[index];
    for (uint32_t i = 0; i < info->attr_count; i++)
        op->attrs[i] = p->attrs[i];
    ir_op_fill_defaults(p->m, index);
    op->group = (uint32_t)group;
    op->step = (uint32_t)step;
    op->wanted_rows = wanted_rows;
    for (uint32_t r = 0; r < result_count; r++) {
        ir_value_id v = op->results[r];
        if (have_types) {
            p->m->values[v].type = p->types[r];
            p->m->values[v].buffer = p->buffers[r];
        }
        name_table_find(&p->values, p->results[r].text, p->results[r].length)->index = v;
    }
}

/* A failed line leaves its value names poisoned, not pending. */
static void parse_op(parser *p) {
    uint32_t result_count = 0;
    parse_op_line(p, &result_count);
    if (!p->line_failed) return;
    for (uint32_t r = 0; r < result_count; r++)
        name_table_find(&p->values, p->results[r].text, p->results[r].length)->index = VALUE_POISONED;
}

/* ---- header lines ----------------------------------------------------------- */

/* source := 'source' STRING */
static void parse_source(parser *p) {
    smelt_loc loc = p->token.loc;
    advance(p);
    if (p->have_source) {
        PARSE_ERROR(p, loc, "duplicate 'source' line");
        diag_note(p->diag, p->source_loc, "the first 'source' line is here");
        return;
    }
    const char *path;
    if (!parse_string(p, &path, &p->m->arena)) return;
    p->m->source_path = path;
    p->m->source_file = diag_file_id(p->diag, path);
    p->have_source = true;
    p->source_loc = loc;
}

/* A param or dim name not seen before in `table`. */
static bool parse_new_name(parser *p, name_table *table, const char *kind, const char **name,
                           smelt_loc *loc) {
    if (!parse_name(p, name, loc)) return false;
    const name_entry *first = name_table_find(table, *name, strlen(*name));
    if (first) {
        PARSE_ERROR(p, *loc, "redefinition of %s '%.*s%s'", kind, DIAG_NAME(*name));
        diag_note(p->diag, first->loc, "'%.*s%s' was first defined here", DIAG_NAME(*name));
        return false;
    }
    return true;
}

/* param := 'param' name ':' ('int' | 'float' | 'bool' | 'string') '=' literal */
static void parse_param(parser *p) {
    advance(p);
    const char *name;
    smelt_loc loc;
    if (!parse_new_name(p, &p->params, "param", &name, &loc)) return;
    if (!expect(p, IR_TOKEN_COLON, "':'")) return;
    static const struct {
        const char *word;
        ir_param_type type;
    } types[] = {{"int", IR_PARAM_INT},
                 {"float", IR_PARAM_FLOAT},
                 {"bool", IR_PARAM_BOOL},
                 {"string", IR_PARAM_STRING}};
    size_t t = 0;
    while (t < sizeof types / sizeof types[0] && !at_word(p, types[t].word))
        t++;
    if (t == sizeof types / sizeof types[0]) {
        expected(p, "a param type (int, float, bool or string)");
        return;
    }
    advance(p);
    if (!expect(p, IR_TOKEN_EQUAL, "'='")) return;
    ir_param value = {.type = types[t].type};
    bool ok = false;
    switch (value.type) {
    case IR_PARAM_INT: ok = parse_int(p, &value.value.i, "an int"); break;
    case IR_PARAM_FLOAT: ok = parse_float(p, &value.value.f, "a float"); break;
    case IR_PARAM_BOOL: ok = parse_bool(p, &value.value.b); break;
    case IR_PARAM_STRING: ok = parse_string(p, &value.value.s, &p->m->arena); break;
    case IR_PARAM_OBJECT:
    case IR_PARAM_LIST: SMELT_DIE("the text IR has no object or list params");
    }
    if (!ok) return;
    ir_param *param = ir_add_param(p->m, name, value.type);
    param->value = value.value;
    name_table_add(&p->params, param->name, strlen(param->name), p->m->param_count - 1, loc);
}

/* dim := 'dim' name '<=' INT   (the bound is at least 1) */
static void parse_dim(parser *p) {
    advance(p);
    const char *name;
    smelt_loc loc;
    if (!parse_new_name(p, &p->symbols, "dim", &name, &loc)) return;
    if (!expect(p, IR_TOKEN_LESS_EQUAL, "'<='")) return;
    smelt_loc bound_loc = p->token.loc;
    int64_t bound;
    if (!parse_int(p, &bound, "an upper bound")) return;
    if (bound < 1) {
        PARSE_ERROR(p, bound_loc, "expected a dim bound >= 1, found %lld", (long long)bound);
        return;
    }
    int32_t index = ir_add_symbol(p->m, name, bound, loc);
    name_table_add(&p->symbols, p->m->symbols[index].name, strlen(p->m->symbols[index].name), (uint32_t)index,
                   loc);
}

/* precision := 'precision' STRING   (the policy the precision pass applied) */
static void parse_precision(parser *p) {
    smelt_loc loc = p->token.loc;
    advance(p);
    if (p->have_precision) {
        PARSE_ERROR(p, loc, "duplicate 'precision' line");
        return;
    }
    const char *policy;
    if (!parse_string(p, &policy, &p->m->arena)) return;
    p->m->precision = policy;
    p->have_precision = true;
}

/* ignore := 'ignore' STRING   (checkpoint tensors the model leaves unused) */
static void parse_ignore(parser *p) {
    advance(p);
    const char *pattern;
    if (!parse_string(p, &pattern, &p->m->arena)) return;
    ir_add_ignored_tensor(p->m, pattern);
}

/* arena := 'arena' INT 'bytes' 'for' INT 'tokens'   (the memory plan's size) */
static void parse_arena(parser *p) {
    smelt_loc loc = p->token.loc;
    advance(p);
    if (p->have_arena) {
        PARSE_ERROR(p, loc, "duplicate 'arena' line");
        return;
    }
    int64_t bytes, tokens;
    if (!parse_int(p, &bytes, "the arena's size in bytes")) return;
    if (!at_word(p, "bytes")) {
        expected(p, "'bytes'");
        return;
    }
    advance(p);
    if (!at_word(p, "for")) {
        expected(p, "'for'");
        return;
    }
    advance(p);
    smelt_loc tokens_loc = p->token.loc;
    if (!parse_int(p, &tokens, "a token count")) return;
    if (!at_word(p, "tokens")) {
        expected(p, "'tokens'");
        return;
    }
    advance(p);
    if (bytes < 0 || tokens < 1) {
        PARSE_ERROR(p, bytes < 0 ? loc : tokens_loc, "expected an arena of >= 0 bytes for >= 1 tokens");
        return;
    }
    p->m->arena_bytes = (uint64_t)bytes;
    p->m->planned_tokens = tokens;
    p->have_arena = true;
}

/* ---- module ------------------------------------------------------------------ */

static void parse_statement(parser *p) {
    if (at_word(p, "source"))
        parse_source(p);
    else if (at_word(p, "param"))
        parse_param(p);
    else if (at_word(p, "dim"))
        parse_dim(p);
    else if (at_word(p, "precision"))
        parse_precision(p);
    else if (at_word(p, "arena"))
        parse_arena(p);
    else if (at_word(p, "ignore"))
        parse_ignore(p);
    else if (at(p, IR_TOKEN_VALUE) || at(p, IR_TOKEN_IDENT))
        parse_op(p);
    else
        expected(p, "'param', 'dim', 'source', 'ignore', 'precision', 'arena' or an op");
}

/* module := 'module' name '{' NEWLINE (statement NEWLINE)* '}' */
static void parse_module(parser *p) {
    skip_newlines(p);
    if (!at_word(p, "module")) {
        expected(p, "'module'");
        return;
    }
    advance(p);
    const char *name;
    smelt_loc name_loc;
    if (!parse_name(p, &name, &name_loc)) return;
    p->m->name = arena_strdup(&p->m->arena, name);
    if (!expect(p, IR_TOKEN_LBRACE, "'{'")) return;
    for (;;) {
        if (diag_should_stop(p->diag)) return;
        p->line_failed = false;
        skip_newlines(p);
        if (accept(p, IR_TOKEN_RBRACE)) break;
        if (at(p, IR_TOKEN_EOF)) {
            PARSE_ERROR(p, p->token.loc, "expected '}' at the end of module '%.*s%s', found end of input",
                        DIAG_NAME(p->m->name));
            return;
        }
        parse_statement(p);
        if (!p->line_failed && !at(p, IR_TOKEN_NEWLINE) && !at(p, IR_TOKEN_EOF) && !at(p, IR_TOKEN_RBRACE))
            expected(p, "end of line");
        if (p->line_failed) skip_line(p);
    }
    skip_newlines(p);
    if (!at(p, IR_TOKEN_EOF)) expected(p, "end of input after the module's '}'");
}

bool ir_parse_text(const char *path, const char *text, size_t length, diag_engine *d, ir_module *out) {
    if (!text) {
        text = "";
        length = 0;
    }
    int32_t file = diag_add_source(d, path ? path : "<input>", text, length);
    if (file < 0) { /* out of memory: without it, locations would be lost */
        diag_error(d, SMELT_NO_LOC, "out of memory");
        return false;
    }
    ir_module_init(out, NULL);
    parser *p = calloc(1, sizeof *p);
    if (!p) {
        diag_error(d, SMELT_NO_LOC, "out of memory");
        return false;
    }
    p->m = out;
    p->diag = d;
    arena_init(&p->scratch);
    ir_lexer_init(&p->lexer, text, length, file, d); /* allocates nothing */
    bool ok = false;
    arena_recovery recovery;
    if (arena_recovery_enter(&recovery, setjmp(recovery.where))) {
        diag_error(d, SMELT_NO_LOC, "out of memory");
    } else {
        out->name = arena_strdup(&out->arena, "module");
        advance(p);
        parse_module(p);
        ok = !p->failed && p->lexer.error_count == 0;
        arena_recovery_leave(&recovery);
    }
    free(p->values.slots);
    free(p->symbols.slots);
    free(p->params.slots);
    free(p->ints);
    free(p->floats);
    arena_free(&p->scratch);
    free(p);
    if (!ok) ir_module_free(out);
    return ok;
}
