/* json_model.c - reads the JSON form of a model description into an ast_model.
 *
 * The JSON form is the DSL's language written as JSON (docs/json.md has the
 * schema). It yields exactly the AST that the DSL parser builds, so
 * elaborate.c never knows which of the two it got.
 *
 * The reader is strict: an unknown key, a missing key or a value of the wrong
 * JSON type is an error that names its place as a JSON pointer
 * (`/body/3/value/args/0`), and the walk goes on after an error so that every
 * such error in the document is reported. Syntax errors come from jansson with
 * their line and column; duplicate keys are syntax errors.
 *
 * Locations: "loc": [line, col] fields refer to the file named by the
 * document's "source" field, or to the JSON file itself when it has none. A
 * node without "loc" takes the location of the nearest enclosing node that has
 * one (so the call of a `let` gets the statement's); with none at all it gets
 * {JSON file, line 0}, which names the file in messages.
 */
#include "ast.h"
#include "json_memory.h"

#include <jansson.h>

#include <errno.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum {
    JSON_FORMAT_VERSION = 1,
    JSON_MAX_FILE_BYTES = 64 * 1024 * 1024,
    JSON_MAX_DEPTH = 256, /* statements and expressions nested, as in the DSL */
    JSON_MESSAGE_MAX = 1024,
};

/* One step of a JSON pointer. Steps live on the C stack of the walk and point
 * to their parent, so a pointer costs nothing until an error prints it. */
typedef struct json_path json_path;
struct json_path {
    const json_path *parent;
    const char *key; /* object member, or NULL for an array element */
    size_t index;
};

#define AT_KEY(parent, k) (&(json_path){(parent), (k), 0})
#define AT_INDEX(parent, i) (&(json_path){(parent), NULL, (i)})

typedef struct json_reader {
    diag_engine *d;
    ast_model *model;
    int32_t json_file; /* diag id of the JSON document: structural errors go here */
    int32_t loc_file;  /* the file that "loc" fields refer to */
    bool ok;
    bool depth_reported; /* the nesting error is reported once, not per level */
} json_reader;

/* ---- messages ------------------------------------------------------------- */

/* Copies at most DIAG_NAME_MAX bytes of s into out (>= DIAG_NAME_MAX + 4
 * bytes), control characters shown as '?', cut on a UTF-8 boundary and
 * marked "..." when long: names from the document may be 1 MB or hold
 * newlines, and a message stays one readable line. */
static const char *printable(const char *s, char *out) {
    size_t n = diag_name_length(s);
    bool cut = s[n] != '\0';
    if (cut)
        while (n > 0 && ((unsigned char)s[n] & 0xC0) == 0x80)
            n--;
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        out[i] = c < 0x20 || c == 0x7f ? '?' : (char)c;
    }
    strcpy(out + n, cut ? "..." : "");
    return out;
}

typedef char name_buffer[DIAG_NAME_MAX + 4];

/* RFC 6901: '~' is written "~0" and '/' is written "~1" inside a key. */
static void write_pointer(FILE *out, const json_path *p) {
    if (!p) return;
    write_pointer(out, p->parent);
    if (!p->key) {
        fprintf(out, "/%zu", p->index);
        return;
    }
    name_buffer name;
    fputc('/', out);
    for (const char *c = printable(p->key, name); *c; c++) {
        if (*c == '~')
            fputs("~0", out);
        else if (*c == '/')
            fputs("~1", out);
        else
            fputc(*c, out);
    }
}

/* A structural error: `file.json: error: /body/3: message`. */
static void report(json_reader *r, const json_path *at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void report(json_reader *r, const json_path *at, const char *fmt, ...) {
    r->ok = false;
    if (diag_should_stop(r->d)) return; /* past the error limit: nothing is printed */
    char message[JSON_MESSAGE_MAX];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    char *pointer = NULL;
    size_t pointer_length = 0;
    FILE *out = open_memstream(&pointer, &pointer_length);
    if (out) {
        if (at)
            write_pointer(out, at);
        else
            fputs("top level", out);
        /* fclose may fail to make the buffer: then the message has no place */
        if (fclose(out) != 0) {
            free(pointer);
            pointer = NULL;
        }
    }
    diag_error(r->d, ((smelt_loc){r->json_file, 0, 0}), "%s: %s", pointer ? pointer : "(out of memory)",
               message);
    free(pointer);
}

/* "a string", "an array", ... for "expected X, found Y". */
static const char *json_kind(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "an array";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE:
    case JSON_FALSE: return "a boolean";
    case JSON_NULL: return "null";
    }
    return "an unknown JSON value";
}

/* "'a', 'b' or 'c'" for the keys of a NULL-terminated list. */
static const char *key_list(const char *const *keys, char *out, size_t size) {
    size_t used = 0;
    out[0] = '\0';
    for (size_t i = 0; keys[i] && used < size; i++) {
        const char *separator = i == 0 ? "" : keys[i + 1] ? ", " : " or ";
        int n = snprintf(out + used, size - used, "%s'%s'", separator, keys[i]);
        if (n < 0) break;
        used += (size_t)n;
    }
    return out;
}

/* ---- members and scalars ------------------------------------------------ */

/* Reports every key of `object` that is not in `allowed` (NULL-terminated);
 * `what` names the object in messages ("a 'let' statement"). */
static void check_keys(json_reader *r, const json_path *at, json_t *object, const char *const *allowed,
                       const char *what) {
    const char *key;
    json_t *value;
    json_object_foreach(object, key, value) {
        bool known = false;
        for (size_t i = 0; allowed[i] && !known; i++)
            known = strcmp(key, allowed[i]) == 0;
        if (known) continue;
        name_buffer name;
        char expected[256];
        report(r, at, "unknown key '%s' in %s (expected %s)", printable(key, name), what,
               key_list(allowed, expected, sizeof expected));
    }
}

/* Member `key` of `object`, or NULL (reported when `required`). */
static json_t *member(json_reader *r, const json_path *at, json_t *object, const char *key, bool required,
                      const char *what) {
    json_t *v = json_object_get(object, key);
    if (!v && required) report(r, at, "missing key '%s' in %s", key, what);
    return v;
}

/* A non-empty string copied into the model's arena, or NULL (reported). */
static const char *read_name(json_reader *r, const json_path *at, json_t *v, const char *what) {
    if (!json_is_string(v)) {
        report(r, at, "expected %s (a non-empty string), found %s", what, json_kind(v));
        return NULL;
    }
    if (json_string_length(v) == 0) {
        report(r, at, "expected %s, found an empty string", what);
        return NULL;
    }
    return arena_strndup(&r->model->arena, json_string_value(v), json_string_length(v));
}

/* "loc": [line, col] with line >= 1 and col >= 0 (0: the whole line). */
static bool read_loc(json_reader *r, const json_path *at, json_t *v, smelt_loc *out) {
    json_t *line = json_array_get(v, 0), *col = json_array_get(v, 1);
    if (!json_is_array(v) || json_array_size(v) != 2 || !json_is_integer(line) || !json_is_integer(col) ||
        json_integer_value(line) < 1 || json_integer_value(line) > UINT32_MAX ||
        json_integer_value(col) < 0 || json_integer_value(col) > UINT32_MAX) {
        if (json_is_integer(line) && json_is_integer(col) && json_array_size(v) == 2)
            report(r, at,
                   "expected a location [line, column] with line >= 1 and column >= 0, found "
                   "[%" JSON_INTEGER_FORMAT ", %" JSON_INTEGER_FORMAT "]",
                   json_integer_value(line), json_integer_value(col));
        else
            report(r, at, "expected a location [line, column] (two integers), found %s", json_kind(v));
        return false;
    }
    *out = (smelt_loc){r->loc_file, (uint32_t)json_integer_value(line), (uint32_t)json_integer_value(col)};
    return true;
}

/* The node's own "loc" when it has a valid one, else the inherited one. */
static smelt_loc node_loc(json_reader *r, const json_path *at, json_t *object, smelt_loc inherited) {
    json_t *v = json_object_get(object, "loc");
    smelt_loc loc = inherited;
    if (v) read_loc(r, AT_KEY(at, "loc"), v, &loc);
    return loc;
}

static bool too_deep(json_reader *r, const json_path *at, unsigned depth) {
    if (depth <= JSON_MAX_DEPTH) return false;
    if (!r->depth_reported)
        report(r, at, "nesting deeper than %d levels of statements and expressions", JSON_MAX_DEPTH);
    r->depth_reported = true;
    r->ok = false;
    return true;
}

/* ---- expressions -------------------------------------------------------- */

static ast_expr *read_expr(json_reader *r, const json_path *at, json_t *v, smelt_loc loc, unsigned depth);

static ast_expr *new_expr(json_reader *r, ast_expr_kind kind, smelt_loc loc) {
    ast_expr *e = arena_alloc(&r->model->arena, sizeof *e);
    e->kind = kind;
    e->loc = loc;
    return e;
}

/* Reads every element of a JSON array of expressions; NULL items on error. */
/* null_ok: a JSON null item is the null literal (the operands of == and
 * !=, which test whether an object or list param was given); elsewhere null
 * is no expression. */
static ast_expr **read_expr_items(json_reader *r, const json_path *at, json_t *array, smelt_loc loc,
                                  unsigned depth, bool null_ok) {
    size_t count = json_array_size(array);
    ast_expr **items = arena_array(&r->model->arena, count ? count : 1, sizeof *items);
    for (size_t i = 0; i < count && !diag_should_stop(r->d); i++) {
        json_t *item = json_array_get(array, i);
        items[i] = null_ok && json_is_null(item) ? new_expr(r, AST_EXPR_NULL, loc)
                                                 : read_expr(r, AT_INDEX(at, i), item, loc, depth);
    }
    return items;
}

/* An array of expressions (a list literal, a shape, operator operands). */
static bool read_expr_array(json_reader *r, const json_path *at, json_t *v, smelt_loc loc, unsigned depth,
                            const char *what, bool null_ok, ast_expr ***items, uint32_t *count) {
    if (!json_is_array(v)) {
        report(r, at, "expected %s (an array), found %s", what, json_kind(v));
        return false;
    }
    *items = read_expr_items(r, at, v, loc, depth, null_ok);
    *count = (uint32_t)json_array_size(v);
    return true;
}

/* {"op": "+", "args": [a, b]}: "-" and "!" with one operand are unary. */
static ast_expr *read_operator(json_reader *r, const json_path *at, json_t *v, smelt_loc loc,
                               unsigned depth) {
    static const char *const keys[] = {"op", "args", NULL};
    check_keys(r, at, v, keys, "an operator expression");
    json_t *op = json_object_get(v, "op"), *args = member(r, at, v, "args", true, "an operator expression");
    ast_expr **operands = NULL;
    uint32_t count = 0;
    bool compares = json_is_string(op) &&
                    (strcmp(json_string_value(op), "==") == 0 || strcmp(json_string_value(op), "!=") == 0);
    bool have_args = args && read_expr_array(r, AT_KEY(at, "args"), args, loc, depth + 1, "the operands",
                                             compares, &operands, &count);
    if (!json_is_string(op)) {
        report(r, AT_KEY(at, "op"), "expected an operator (a string such as \"+\"), found %s", json_kind(op));
        return NULL;
    }
    const char *text = json_string_value(op);
    bool known = false;
    for (int o = AST_OP_NEG; o <= AST_OP_INDEX; o++) {
        if (strcmp(text, ast_operator_text((ast_operator)o)) != 0) continue;
        known = true;
        bool unary = o == AST_OP_NEG || o == AST_OP_NOT;
        if (!have_args || count != (unary ? 1u : 2u)) continue;
        for (uint32_t i = 0; i < count; i++)
            if (!operands[i]) return NULL;
        ast_expr *e = new_expr(r, unary ? AST_EXPR_UNARY : AST_EXPR_BINARY, loc);
        if (unary) {
            e->as.unary.op = (ast_operator)o;
            e->as.unary.operand = operands[0];
        } else {
            e->as.binary.op = (ast_operator)o;
            e->as.binary.lhs = operands[0];
            e->as.binary.rhs = operands[1];
        }
        return e;
    }
    if (!known) {
        name_buffer name;
        report(r, AT_KEY(at, "op"),
               "unknown operator '%s' (expected one of - ! * / %% + < <= > >= == != && || [])",
               printable(text, name));
    } else if (have_args) {
        const char *takes = strcmp(text, "-") == 0   ? "1 or 2 operands"
                            : strcmp(text, "!") == 0 ? "1 operand"
                                                     : "2 operands";
        report(r, AT_KEY(at, "args"), "operator '%s' takes %s, found %u", text, takes, count);
    }
    return NULL;
}

/* {"call": "matmul", "args": [...]?, "attrs": {...}?, "loc": [l, c]?}
 * Attributes become keyword arguments after the positional ones, in file order. */
static ast_expr *read_call(json_reader *r, const json_path *at, json_t *v, smelt_loc loc, unsigned depth) {
    static const char *const keys[] = {"call", "args", "attrs", "loc", NULL};
    check_keys(r, at, v, keys, "a call");
    loc = node_loc(r, at, v, loc);
    bool ok = true;
    const char *name = read_name(r, AT_KEY(at, "call"), json_object_get(v, "call"), "an op or function name");
    json_t *args = json_object_get(v, "args"), *attrs = json_object_get(v, "attrs");
    if (args && !json_is_array(args)) {
        report(r, AT_KEY(at, "args"), "expected the arguments (an array), found %s", json_kind(args));
        args = NULL;
        ok = false;
    }
    if (attrs && !json_is_object(attrs)) {
        report(r, AT_KEY(at, "attrs"), "expected the attributes (an object), found %s", json_kind(attrs));
        attrs = NULL;
        ok = false;
    }
    size_t positional = json_array_size(args), keywords = json_object_size(attrs);
    size_t arg_count = positional + keywords;
    ast_arg *list = arena_array(&r->model->arena, arg_count ? arg_count : 1, sizeof *list);
    for (size_t i = 0; i < positional && !diag_should_stop(r->d); i++) {
        list[i].value =
            read_expr(r, AT_INDEX(AT_KEY(at, "args"), i), json_array_get(args, i), loc, depth + 1);
        ok = ok && list[i].value;
        list[i].loc = list[i].value ? list[i].value->loc : loc;
    }
    size_t count = positional;
    const char *key;
    json_t *value;
    json_object_foreach(attrs, key, value) {
        const json_path *attr_at = AT_KEY(AT_KEY(at, "attrs"), key);
        ast_arg *arg = &list[count++];
        if (key[0] == '\0') {
            report(r, attr_at, "expected an attribute name, found an empty key");
            ok = false;
        }
        arg->keyword = arena_strdup(&r->model->arena, key);
        arg->value = read_expr(r, attr_at, value, loc, depth + 1);
        arg->loc = arg->value ? arg->value->loc : loc;
        ok = ok && arg->value;
    }
    if (!ok || !name) return NULL;
    ast_expr *e = new_expr(r, AST_EXPR_CALL, loc);
    e->as.call.name = name;
    e->as.call.args = list;
    e->as.call.arg_count = (uint32_t)count;
    return e;
}

/* An expression object has exactly one of the keys "str", "op" and "call". */
static ast_expr *read_expr_object(json_reader *r, const json_path *at, json_t *v, smelt_loc loc,
                                  unsigned depth) {
    static const char *const kinds[] = {"str", "op", "call", NULL};
    const char *found = NULL;
    for (size_t i = 0; kinds[i]; i++) {
        if (!json_object_get(v, kinds[i])) continue;
        if (found) {
            report(r, at,
                   "an expression has both '%s' and '%s'; expected exactly one of 'str', 'op' or 'call'",
                   found, kinds[i]);
            return NULL;
        }
        found = kinds[i];
    }
    if (!found) {
        report(r, at, "expected an expression object with one of the keys 'str', 'op' or 'call'");
        return NULL;
    }
    if (strcmp(found, "op") == 0) return read_operator(r, at, v, loc, depth);
    if (strcmp(found, "call") == 0) return read_call(r, at, v, loc, depth);
    static const char *const keys[] = {"str", NULL};
    check_keys(r, at, v, keys, "a string literal");
    json_t *text = json_object_get(v, "str");
    if (!json_is_string(text)) {
        report(r, AT_KEY(at, "str"), "expected the text of a string literal, found %s", json_kind(text));
        return NULL;
    }
    ast_expr *e = new_expr(r, AST_EXPR_STRING, loc);
    e->as.s = arena_strndup(&r->model->arena, json_string_value(text), json_string_length(text));
    return e;
}

static ast_expr *read_expr(json_reader *r, const json_path *at, json_t *v, smelt_loc loc, unsigned depth) {
    if (too_deep(r, at, depth)) return NULL;
    ast_expr *e;
    switch (json_typeof(v)) {
    case JSON_INTEGER:
        e = new_expr(r, AST_EXPR_INT, loc);
        e->as.i = json_integer_value(v);
        return e;
    case JSON_REAL:
        e = new_expr(r, AST_EXPR_FLOAT, loc);
        e->as.f = json_real_value(v);
        return e;
    case JSON_TRUE:
    case JSON_FALSE:
        e = new_expr(r, AST_EXPR_BOOL, loc);
        e->as.b = json_is_true(v);
        return e;
    case JSON_STRING: {
        const char *name = read_name(r, at, v, "a name");
        if (!name) return NULL;
        e = new_expr(r, AST_EXPR_NAME, loc);
        e->as.s = name;
        return e;
    }
    case JSON_ARRAY: {
        ast_expr **items = read_expr_items(r, at, v, loc, depth + 1, false);
        uint32_t count = (uint32_t)json_array_size(v);
        for (uint32_t i = 0; i < count; i++)
            if (!items[i]) return NULL;
        e = new_expr(r, AST_EXPR_LIST, loc);
        e->as.list.items = items;
        e->as.list.count = count;
        return e;
    }
    case JSON_OBJECT: return read_expr_object(r, at, v, loc, depth);
    case JSON_NULL: break;
    }
    report(r, at, "expected an expression, found %s", json_kind(v));
    return NULL;
}

/* ---- statements ----------------------------------------------------------- */

/* The keys a statement may have; keys[0] is the one that says its kind. */
typedef struct stmt_schema {
    ast_stmt_kind kind;
    const char *what; /* for messages */
    const char *keys[7];
} stmt_schema;

static const stmt_schema stmt_schemas[] = {
    {AST_STMT_PARAM, "a 'param' statement", {"param", "type", "default", "loc", NULL}},
    {AST_STMT_DIM, "a 'dim' statement", {"dim", "max", "loc", NULL}},
    {AST_STMT_INPUT, "an 'input' statement", {"input", "dtype", "shape", "loc", NULL}},
    {AST_STMT_WEIGHT, "a 'weight' statement", {"weight", "dtype", "shape", "name", "stacked", "loc", NULL}},
    {AST_STMT_LET, "a 'let' statement", {"let", "value", "loc", NULL}},
    {AST_STMT_ASSIGN, "a 'set' statement", {"set", "value", "loc", NULL}},
    {AST_STMT_FOR, "a 'for' statement", {"for", "from", "to", "body", "loc", NULL}},
    {AST_STMT_IF, "an 'if' statement", {"if", "then", "else", "loc", NULL}},
    {AST_STMT_OUTPUT, "an 'output' statement", {"output", "value", "loc", NULL}},
    {AST_STMT_REQUIRE, "a 'require' statement", {"require", "message", "loc", NULL}},
    {AST_STMT_IGNORE, "an 'ignore' statement", {"ignore", "loc", NULL}},
};
enum { STMT_SCHEMA_COUNT = sizeof stmt_schemas / sizeof stmt_schemas[0] };

static void read_block(json_reader *r, const json_path *at, json_t *v, smelt_loc loc, unsigned depth,
                       ast_block *out);

/* The required expression member `key`; NULL when missing or bad (reported). */
static ast_expr *expr_member(json_reader *r, const json_path *at, json_t *object, const char *key,
                             const stmt_schema *s, smelt_loc loc, unsigned depth) {
    json_t *v = member(r, at, object, key, true, s->what);
    return v ? read_expr(r, AT_KEY(at, key), v, loc, depth + 1) : NULL;
}

static const char *name_member(json_reader *r, const json_path *at, json_t *object, const char *key,
                               bool required, const stmt_schema *s, const char *what) {
    json_t *v = member(r, at, object, key, required, s->what);
    return v ? read_name(r, AT_KEY(at, key), v, what) : NULL;
}

/* "dtype": a name from ir.h's dtype table. */
static const char *read_dtype(json_reader *r, const json_path *at, json_t *v) {
    if (json_is_string(v) &&
        smelt_dtype_from_name(json_string_value(v), json_string_length(v)) != SMELT_DTYPE_UNKNOWN)
        return arena_strdup(&r->model->arena, json_string_value(v));
    char expected[256] = "";
    for (int t = SMELT_DTYPE_UNKNOWN + 1; t < SMELT_DTYPE_COUNT; t++) {
        size_t used = strlen(expected);
        snprintf(expected + used, sizeof expected - used, "%s%s", t > 1 ? ", " : "",
                 smelt_dtype_name((smelt_dtype)t));
    }
    if (json_is_string(v)) {
        name_buffer name;
        report(r, at, "unknown dtype '%s' (expected one of %s)", printable(json_string_value(v), name),
               expected);
    } else {
        report(r, at, "expected a dtype (one of %s), found %s", expected, json_kind(v));
    }
    return NULL;
}

/* "dtype" (required for inputs) and "shape" of an input or weight. */
static bool read_type(json_reader *r, const json_path *at, json_t *object, const stmt_schema *s,
                      bool dtype_required, smelt_loc loc, unsigned depth, ast_type *out) {
    bool ok = true;
    json_t *dtype = member(r, at, object, "dtype", dtype_required, s->what);
    if (dtype) ok = (out->dtype = read_dtype(r, AT_KEY(at, "dtype"), dtype)) != NULL;
    out->dtype_loc = loc;
    json_t *shape = member(r, at, object, "shape", true, s->what);
    if (!shape) return false;
    if (!read_expr_array(r, AT_KEY(at, "shape"), shape, loc, depth + 1, "a shape", false, &out->dims,
                         &out->rank))
        return false;
    for (uint32_t i = 0; i < out->rank; i++)
        ok = ok && out->dims[i];
    return ok;
}

/* "let"/"set": a name or a non-empty array of names. */
static bool read_targets(json_reader *r, const json_path *at, json_t *v, ast_stmt *stmt) {
    bool single = json_is_string(v);
    if (!single && (!json_is_array(v) || json_array_size(v) == 0)) {
        report(r, at, "expected a name or a non-empty array of names, found %s", json_kind(v));
        return false;
    }
    uint32_t count = single ? 1 : (uint32_t)json_array_size(v);
    stmt->as.let.names = arena_array(&r->model->arena, count, sizeof(const char *));
    stmt->as.let.name_locs = arena_array(&r->model->arena, count, sizeof(smelt_loc));
    stmt->as.let.name_count = count;
    bool ok = true;
    for (uint32_t i = 0; i < count; i++) {
        stmt->as.let.names[i] = single ? read_name(r, at, v, "a name")
                                       : read_name(r, AT_INDEX(at, i), json_array_get(v, i), "a name");
        stmt->as.let.name_locs[i] = stmt->loc;
        ok = ok && stmt->as.let.names[i];
    }
    return ok;
}

static bool read_param(json_reader *r, const json_path *at, json_t *v, const stmt_schema *s, unsigned depth,
                       ast_stmt *stmt) {
    bool ok = (stmt->as.param.name = name_member(r, at, v, "param", true, s, "a param name")) != NULL;
    json_t *type = member(r, at, v, "type", true, s->what);
    if (type) {
        bool known = false;
        /* "int", ..., "object", "list", or "list[T]" with T a scalar type. */
        const char *text = json_is_string(type) ? json_string_value(type) : "";
        for (int t = IR_PARAM_INT; t <= IR_PARAM_LIST && !known; t++) {
            known = strcmp(text, ir_param_type_name((ir_param_type)t)) == 0;
            if (known) stmt->as.param.type = stmt->as.param.item_type = (ir_param_type)t;
        }
        for (int t = IR_PARAM_INT; t <= IR_PARAM_STRING && !known; t++) {
            const char *item = ir_param_type_name((ir_param_type)t);
            size_t length = strlen(item);
            known = strncmp(text, "list[", 5) == 0 && strncmp(text + 5, item, length) == 0 &&
                    strcmp(text + 5 + length, "]") == 0;
            if (known) {
                stmt->as.param.type = IR_PARAM_LIST;
                stmt->as.param.item_type = (ir_param_type)t;
            }
        }
        if (!known && json_is_string(type)) {
            name_buffer name;
            report(r, AT_KEY(at, "type"),
                   "unknown param type '%s' (expected \"int\", \"float\", \"bool\", \"string\", "
                   "\"object\", \"list\" or \"list[T]\" with T a scalar type)",
                   printable(json_string_value(type), name));
        } else if (!known) {
            report(r, AT_KEY(at, "type"),
                   "expected a param type (\"int\", \"float\", \"bool\", \"string\", \"object\" or "
                   "\"list\"), found %s",
                   json_kind(type));
        }
        ok = ok && known;
    } else {
        ok = false;
    }
    json_t *value = json_object_get(v, "default");
    if (value && json_is_null(value)) { /* an object or list param's default; null is no other expression */
        stmt->as.param.default_value = new_expr(r, AST_EXPR_NULL, stmt->loc);
    } else if (value) {
        stmt->as.param.default_value = read_expr(r, AT_KEY(at, "default"), value, stmt->loc, depth + 1);
        ok = ok && stmt->as.param.default_value;
    }
    return ok;
}

static bool read_weight(json_reader *r, const json_path *at, json_t *v, const stmt_schema *s, unsigned depth,
                        ast_stmt *stmt) {
    bool ok = (stmt->as.weight.name = name_member(r, at, v, "weight", true, s, "a weight name")) != NULL;
    ok = read_type(r, at, v, s, false, stmt->loc, depth, &stmt->as.weight.type) && ok;
    stmt->as.weight.hf_name = name_member(r, at, v, "name", true, s, "a tensor name");
    stmt->as.weight.hf_name_loc = stmt->loc;
    ok = ok && stmt->as.weight.hf_name;
    if (json_object_get(v, "stacked")) {
        stmt->as.weight.stack_var = name_member(r, at, v, "stacked", false, s, "a template variable");
        ok = ok && stmt->as.weight.stack_var;
    }
    return ok;
}

static bool read_stmt_fields(json_reader *r, const json_path *at, json_t *v, const stmt_schema *s,
                             unsigned depth, ast_stmt *stmt) {
    smelt_loc loc = stmt->loc;
    bool ok;
    switch (s->kind) {
    case AST_STMT_PARAM: return read_param(r, at, v, s, depth, stmt);
    case AST_STMT_DIM:
        ok = (stmt->as.dim.name = name_member(r, at, v, "dim", true, s, "a dim name")) != NULL;
        stmt->as.dim.bound = expr_member(r, at, v, "max", s, loc, depth);
        return ok && stmt->as.dim.bound;
    case AST_STMT_INPUT:
        ok = (stmt->as.input.name = name_member(r, at, v, "input", true, s, "an input name")) != NULL;
        return read_type(r, at, v, s, true, loc, depth, &stmt->as.input.type) && ok;
    case AST_STMT_WEIGHT: return read_weight(r, at, v, s, depth, stmt);
    case AST_STMT_LET:
    case AST_STMT_ASSIGN: {
        const char *key = s->keys[0];
        ok = read_targets(r, AT_KEY(at, key), json_object_get(v, key), stmt);
        stmt->as.let.value = expr_member(r, at, v, "value", s, loc, depth);
        return ok && stmt->as.let.value;
    }
    case AST_STMT_FOR: {
        ok = (stmt->as.loop.var = name_member(r, at, v, "for", true, s, "a loop variable")) != NULL;
        stmt->as.loop.from = expr_member(r, at, v, "from", s, loc, depth);
        stmt->as.loop.to = expr_member(r, at, v, "to", s, loc, depth);
        json_t *body = member(r, at, v, "body", true, s->what);
        if (body) read_block(r, AT_KEY(at, "body"), body, loc, depth + 1, &stmt->as.loop.body);
        return ok && stmt->as.loop.from && stmt->as.loop.to && body;
    }
    case AST_STMT_IF: {
        stmt->as.branch.cond = read_expr(r, AT_KEY(at, "if"), json_object_get(v, "if"), loc, depth + 1);
        json_t *then_body = member(r, at, v, "then", true, s->what);
        if (then_body)
            read_block(r, AT_KEY(at, "then"), then_body, loc, depth + 1, &stmt->as.branch.then_body);
        json_t *else_body = json_object_get(v, "else");
        if (else_body)
            read_block(r, AT_KEY(at, "else"), else_body, loc, depth + 1, &stmt->as.branch.else_body);
        return stmt->as.branch.cond && then_body;
    }
    case AST_STMT_OUTPUT:
        ok = (stmt->as.output.name = name_member(r, at, v, "output", true, s, "an output name")) != NULL;
        stmt->as.output.value = expr_member(r, at, v, "value", s, loc, depth);
        return ok && stmt->as.output.value;
    case AST_STMT_REQUIRE:
        stmt->as.require.cond = expr_member(r, at, v, "require", s, loc, depth);
        if (json_object_get(v, "message")) {
            stmt->as.require.message = name_member(r, at, v, "message", false, s, "a message");
            if (!stmt->as.require.message) return false;
        }
        return stmt->as.require.cond != NULL;
    case AST_STMT_IGNORE:
        stmt->as.ignore.pattern = name_member(r, at, v, "ignore", true, s, "a tensor name pattern");
        stmt->as.ignore.pattern_loc = loc;
        return stmt->as.ignore.pattern != NULL;
    }
    SMELT_DIE("statement kind %d has no reader", (int)s->kind);
}

/* A statement: an object with exactly one kind key, its fields, "loc"?. */
static ast_stmt *read_stmt(json_reader *r, const json_path *at, json_t *v, smelt_loc loc, unsigned depth) {
    if (too_deep(r, at, depth)) return NULL;
    if (!json_is_object(v)) {
        report(r, at, "expected a statement (an object), found %s", json_kind(v));
        return NULL;
    }
    const stmt_schema *s = NULL;
    for (size_t i = 0; i < STMT_SCHEMA_COUNT; i++) {
        if (!json_object_get(v, stmt_schemas[i].keys[0])) continue;
        if (s) {
            report(r, at, "a statement has both '%s' and '%s' keys; expected exactly one statement kind",
                   s->keys[0], stmt_schemas[i].keys[0]);
            return NULL;
        }
        s = &stmt_schemas[i];
    }
    if (!s) {
        report(r, at,
               "expected a statement: an object with one of the keys 'param', 'dim', 'input', "
               "'weight', 'let', 'set', 'for', 'if', 'output', 'require' or 'ignore'");
        return NULL;
    }
    check_keys(r, at, v, s->keys, s->what);
    ast_stmt *stmt = arena_alloc(&r->model->arena, sizeof *stmt);
    stmt->kind = s->kind;
    stmt->loc = node_loc(r, at, v, loc);
    return read_stmt_fields(r, at, v, s, depth, stmt) ? stmt : NULL;
}

/* An array of statements; statements with errors are left out. */
static void read_block(json_reader *r, const json_path *at, json_t *v, smelt_loc loc, unsigned depth,
                       ast_block *out) {
    if (!json_is_array(v)) {
        report(r, at, "expected a block (an array of statements), found %s", json_kind(v));
        return;
    }
    size_t count = json_array_size(v);
    out->items = arena_array(&r->model->arena, count ? count : 1, sizeof *out->items);
    for (size_t i = 0; i < count && !diag_should_stop(r->d); i++) {
        ast_stmt *stmt = read_stmt(r, AT_INDEX(at, i), json_array_get(v, i), loc, depth);
        if (stmt) out->items[out->count++] = stmt;
    }
}

/* ---- the document --------------------------------------------------------- */

static void read_document(json_reader *r, const char *path, json_t *root) {
    ast_model *model = r->model;
    model->source_path = arena_strdup(&model->arena, path);
    model->source_file = r->json_file;
    model->loc = (smelt_loc){r->json_file, 0, 0};
    if (!json_is_object(root)) {
        report(r, NULL, "expected an object with the keys 'smelt', 'model' and 'body', found %s",
               json_kind(root));
        return;
    }
    static const char *const keys[] = {"smelt", "model", "source", "body", NULL};
    check_keys(r, NULL, root, keys, "the document");
    json_t *version = member(r, NULL, root, "smelt", true, "the document (the format version, 1)");
    if (version && !json_is_integer(version)) {
        report(r, AT_KEY(NULL, "smelt"), "expected the format version (an integer), found %s",
               json_kind(version));
    } else if (version && json_integer_value(version) != JSON_FORMAT_VERSION) {
        report(r, AT_KEY(NULL, "smelt"), "unsupported format version %" JSON_INTEGER_FORMAT " (expected %d)",
               json_integer_value(version), JSON_FORMAT_VERSION);
        return; /* another version has another schema: its keys mean other things */
    }
    json_t *source = json_object_get(root, "source");
    if (source) {
        const char *source_path = read_name(r, AT_KEY(NULL, "source"), source, "a file path");
        if (source_path) {
            r->loc_file = diag_file_id(r->d, source_path);
            model->source_path = source_path;
            model->source_file = r->loc_file;
        }
    }
    json_t *name = member(r, NULL, root, "model", true, "the document");
    if (name) model->name = read_name(r, AT_KEY(NULL, "model"), name, "a model name");
    json_t *body = member(r, NULL, root, "body", true, "the document");
    if (body) read_block(r, AT_KEY(NULL, "body"), body, model->loc, 1, &model->body);
}

/* A jansson syntax error at its line and (byte) column. */
static void report_syntax_error(diag_engine *d, int32_t file, const char *text, size_t length,
                                const json_error_t *e) {
    smelt_loc loc = {file, e->line > 0 ? (uint32_t)e->line : 0, 0};
    if (loc.line > 0 && e->position >= 0 && (size_t)e->position <= length) {
        /* jansson counts columns in characters; diagnostics want bytes */
        size_t line_start = 0;
        for (uint32_t l = 1; l < loc.line && line_start < length; l++) {
            const char *nl = memchr(text + line_start, '\n', length - line_start);
            if (!nl) break;
            line_start = (size_t)(nl - text) + 1;
        }
        if ((size_t)e->position >= line_start) loc.col = (uint32_t)((size_t)e->position - line_start);
    }
    char message[sizeof e->text];
    size_t i = 0;
    for (; e->text[i] && i + 1 < sizeof message; i++) {
        unsigned char c = (unsigned char)e->text[i];
        message[i] = c < 0x20 || c >= 0x7f ? '?' : (char)c;
    }
    message[i] = '\0';
    bool duplicate = json_error_code(e) == json_error_duplicate_key;
    diag_error(d, loc, "invalid JSON: %s%s", message,
               duplicate && !strstr(message, "duplicate") ? " (duplicate key)" : "");
}

/* Only JSON whitespace (or nothing at all). */
static bool is_blank(const char *text, size_t length) {
    for (size_t i = 0; i < length; i++)
        if (text[i] != ' ' && text[i] != '\t' && text[i] != '\r' && text[i] != '\n') return false;
    return true;
}

static bool parse_document(const char *path, int32_t file, const char *text, size_t length, diag_engine *d,
                           ast_model *out) {
    smelt_loc whole_file = {file, 0, 0};
    if (is_blank(text, length)) {
        diag_error(d, whole_file,
                   "empty input: expected a JSON object with the keys 'smelt', 'model' and 'body'");
        return false;
    }
    json_error_t error = {0}; /* jansson leaves its code byte unset on success */
    fe_json_memory_begin();
    json_t *root = json_loadb(text, length, JSON_REJECT_DUPLICATES | JSON_DECODE_ANY, &error);
    if (fe_json_out_of_memory(&error)) {
        if (root) json_decref(root);
        diag_error(d, whole_file, "out of memory reading the JSON model");
        return false;
    }
    if (!root) {
        report_syntax_error(d, file, text, length, &error);
        return false;
    }
    json_reader r = {.d = d, .model = out, .json_file = file, .loc_file = file, .ok = true};
    arena_recovery recovery;
    if (arena_recovery_enter(&recovery, setjmp(recovery.where))) {
        json_decref(root);
        diag_error(d, whole_file, "out of memory");
        return false;
    }
    read_document(&r, path, root);
    arena_recovery_leave(&recovery);
    json_decref(root);
    return r.ok;
}

static void report_too_large(diag_engine *d, int32_t file, uint64_t bytes) {
    diag_error(d, ((smelt_loc){file, 0, 0}),
               "file too large: %" PRIu64 " bytes, the limit for a JSON model is %d MiB", bytes,
               JSON_MAX_FILE_BYTES / (1024 * 1024));
}

/* Reads a whole file of at most JSON_MAX_FILE_BYTES; caller frees *text. */
static bool read_file(const char *path, int32_t file, diag_engine *d, char **text, size_t *length) {
    smelt_loc whole_file = {file, 0, 0};
    FILE *in = fopen(path, "rb");
    if (!in) {
        diag_error(d, whole_file, "cannot open the file: %s", strerror(errno));
        return false;
    }
    struct stat info;
    if (fstat(fileno(in), &info) == 0 && S_ISREG(info.st_mode) && info.st_size > JSON_MAX_FILE_BYTES) {
        report_too_large(d, file, (uint64_t)info.st_size);
        fclose(in);
        return false;
    }
    /* The size is checked again while reading: pipes and devices have none. */
    size_t capacity = 64 * 1024, used = 0;
    char *buffer = malloc(capacity);
    if (!buffer) {
        fclose(in);
        diag_error(d, whole_file, "out of memory reading the file");
        return false;
    }
    bool ok = true;
    for (;;) {
        if (used == capacity) {
            capacity *= 2; /* at most 128 MiB: reading stops past 64 MiB */
            char *grown = realloc(buffer, capacity);
            if (!grown) {
                diag_error(d, whole_file, "out of memory reading the file");
                ok = false;
                break;
            }
            buffer = grown;
        }
        size_t n = fread(buffer + used, 1, capacity - used, in);
        used += n;
        if (used > JSON_MAX_FILE_BYTES) {
            report_too_large(d, file, used);
            ok = false;
            break;
        }
        if (n == 0) {
            if (ferror(in)) {
                diag_error(d, whole_file, "cannot read the file: %s", strerror(errno));
                ok = false;
            }
            break;
        }
    }
    fclose(in);
    if (!ok) {
        free(buffer);
        return false;
    }
    *text = buffer;
    *length = used;
    return true;
}

bool fe_parse_json(const char *path, diag_engine *d, ast_model *out) {
    ast_model_init(out);
    int32_t file = diag_file_id(d, path);
    if (file < 0) { /* out of memory: without it, locations would be lost */
        diag_error(d, SMELT_NO_LOC, "out of memory");
        return false;
    }
    char *text;
    size_t length;
    if (!read_file(path, file, d, &text, &length)) return false;
    bool ok = parse_document(path, file, text, length, d, out);
    free(text);
    return ok;
}

bool fe_parse_json_text(const char *path, const char *text, size_t length, diag_engine *d, ast_model *out) {
    ast_model_init(out);
    if (length > JSON_MAX_FILE_BYTES) {
        report_too_large(d, diag_file_id(d, path), length);
        return false;
    }
    int32_t file = diag_add_source(d, path, text, length);
    if (file < 0) { /* out of memory: without it, locations would be lost */
        diag_error(d, SMELT_NO_LOC, "out of memory");
        return false;
    }
    return parse_document(path, file, text, length, d, out);
}
