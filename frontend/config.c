/* config.c - params bound from a Hugging Face config.json and from --set.
 *
 * The config is read once with jansson (duplicate keys rejected); a lookup
 * then finds a param's key and converts the JSON value to the param's type.
 * A key that names no param is not ignored silently: config_keys.c checks,
 * after elaboration, that each one is known not to change the computation.
 * --set values are text and convert by the param's type. See config.h for
 * the conversion table.
 */
#include "config.h"
#include "gguf_model.h"
#include "json_memory.h"

#include <errno.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

bool fe_options_set(fe_options *o, const char *name, const char *value) {
    if (!o || !name || !value || o->setting_count >= FE_MAX_SETTINGS) return false;
    o->settings[o->setting_count++] = (fe_setting){name, value};
    return true;
}

int fe_options_find(const fe_options *o, const char *name) {
    if (!o) return -1;
    for (uint32_t i = o->setting_count; i-- > 0;)
        if (strcmp(o->settings[i].name, name) == 0) return (int)i;
    return -1;
}

/* ---- config.json ------------------------------------------------------- */

enum { FE_CONFIG_MAX_BYTES = 64 * 1024 * 1024 };

bool fe_config_open(fe_config *c, const char *path, diag_engine *d) {
    memset(c, 0, sizeof *c);
    c->file = -1;
    if (!path) return true;
    c->path = path;
    c->file = diag_file_id(d, path);
    smelt_loc whole_file = {c->file, 0, 0};
    if (gguf_is_file(path)) {
        /* a GGUF model: its metadata as the config.json it stands for */
        c->broken = !fe_gguf_config(path, &c->root, d);
        return !c->broken;
    }

    FILE *fp = fopen(path, "rb");
    if (!fp) {
        diag_error(d, whole_file, "cannot read the config: %s", strerror(errno));
        c->broken = true;
        return false;
    }
    /* Read whole, so that a value's line and column can be found again for
     * messages (jansson keeps no positions of values). */
    size_t capacity = 1 << 14, length = 0;
    char *text = malloc(capacity);
    bool read_failed = false, too_large = false;
    int read_errno = 0;
    while (text) {
        length += fread(text + length, 1, capacity - length, fp);
        if (ferror(fp)) {
            read_failed = true;
            read_errno = errno;
            break;
        }
        if (length < capacity) break;
        if (capacity >= FE_CONFIG_MAX_BYTES) {
            too_large = true;
            break;
        }
        char *grown = realloc(text, capacity * 2);
        if (!grown) {
            free(text);
            text = NULL;
            break;
        }
        text = grown;
        capacity *= 2;
    }
    fclose(fp);
    if (!text || read_failed || too_large) {
        if (!text)
            diag_error(d, whole_file, "out of memory reading the config");
        else if (too_large)
            diag_error(d, whole_file, "the config is larger than %d MiB", FE_CONFIG_MAX_BYTES >> 20);
        else
            diag_error(d, whole_file, "cannot read the config: %s", strerror(read_errno));
        free(text);
        c->broken = true;
        return false;
    }
    c->text = text;
    c->length = length;
    json_error_t error = {0}; /* jansson leaves its code byte unset on success */
    fe_json_memory_begin();
    json_t *root = json_loadb(text, length, JSON_REJECT_DUPLICATES, &error);
    bool out_of_memory = fe_json_out_of_memory(&error);
    if (root && out_of_memory) {
        json_decref(root);
        root = NULL;
    }
    if (!root) {
        if (out_of_memory) {
            diag_error(d, whole_file, "out of memory reading the config");
        } else {
            smelt_loc at = {c->file, error.line > 0 ? (uint32_t)error.line : 0,
                            error.column > 0 ? (uint32_t)error.column : 0};
            diag_error(d, at, "config is not valid JSON: %s", error.text);
        }
        c->broken = true;
        return false;
    }
    if (!json_is_object(root)) {
        diag_error(d, whole_file, "the config must be a JSON object of settings, found %s",
                   json_is_array(root) ? "a list" : "a single value");
        json_decref(root);
        c->broken = true;
        return false;
    }
    c->root = root;
    return true;
}

void fe_config_close(fe_config *c) {
    if (c->root) json_decref(c->root);
    free(c->text);
    memset(c, 0, sizeof *c);
    c->file = -1;
}

static const char *json_kind_name(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "a list";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an int";
    case JSON_REAL: return "a float";
    case JSON_TRUE:
    case JSON_FALSE: return "a bool";
    case JSON_NULL: return "null";
    }
    return "a value";
}

/* An integral real in int64 range converts to int: configs written by
 * Python sometimes hold 4096.0 where an int is meant. */
static bool real_to_int(double r, int64_t *out) {
    if (!isfinite(r) || r != floor(r)) return false;
    /* -2^63 is exact in a double; 2^63 is the first value past the range. */
    if (r < -9223372036854775808.0 || r >= 9223372036854775808.0) return false;
    *out = (int64_t)r;
    return true;
}

const char *const fe_config_nested_object = "rope_parameters";

/* The value of `name` in the config: a top-level key, or else a key of the
 * "rope_parameters" object, where transformers 5 keeps rope_theta. */
static json_t *config_value(const fe_config *c, const char *name) {
    json_t *v = json_object_get(c->root, name);
    if (v && !json_is_null(v)) return v;
    json_t *rope = json_object_get(c->root, fe_config_nested_object);
    v = json_is_object(rope) ? json_object_get(rope, name) : NULL;
    return v && !json_is_null(v) ? v : NULL;
}

/* ---- where a value is ---------------------------------------------------
 *
 * A scan of the text jansson has already accepted, so it only needs to step
 * over well-formed JSON: strings (with escapes), nested objects and lists,
 * and scalars. Keys are compared as written (a key with escapes is not
 * found, and the message falls back to the whole file). */

static bool is_json_space(char c) { return c == ' ' || c == '\t' || c == '\r' || c == '\n'; }

static size_t skip_space(const char *t, size_t n, size_t i) {
    while (i < n && is_json_space(t[i]))
        i++;
    return i;
}

/* i at '"': the index past the closing quote. */
static size_t skip_string(const char *t, size_t n, size_t i) {
    for (i++; i < n; i++) {
        if (t[i] == '\\')
            i++;
        else if (t[i] == '"')
            return i + 1;
    }
    return n;
}

/* i at a value's first byte: the index past the value. */
static size_t skip_value(const char *t, size_t n, size_t i) {
    if (i >= n) return n;
    if (t[i] == '"') return skip_string(t, n, i);
    if (t[i] == '{' || t[i] == '[') {
        size_t depth = 0;
        while (i < n) {
            char ch = t[i];
            if (ch == '"') {
                i = skip_string(t, n, i);
                continue;
            }
            if (ch == '{' || ch == '[') depth++;
            if ((ch == '}' || ch == ']') && --depth == 0) return i + 1;
            i++;
        }
        return n;
    }
    while (i < n && t[i] != ',' && t[i] != '}' && t[i] != ']' && !is_json_space(t[i]))
        i++;
    return i;
}

/* The offset of the value of member `key` of the object at i ('{'), or
 * SIZE_MAX. */
static size_t member_offset(const char *t, size_t n, size_t i, const char *key) {
    size_t k = strlen(key);
    if (i >= n || t[i] != '{') return SIZE_MAX;
    i = skip_space(t, n, i + 1);
    while (i < n && t[i] == '"') {
        size_t end = skip_string(t, n, i);
        bool match = end >= i + 2 && end - i - 2 == k && memcmp(t + i + 1, key, k) == 0;
        i = skip_space(t, n, end);
        if (i >= n || t[i] != ':') return SIZE_MAX;
        i = skip_space(t, n, i + 1);
        if (match) return i;
        i = skip_space(t, n, skip_value(t, n, i));
        if (i < n && t[i] == ',') i = skip_space(t, n, i + 1);
    }
    return SIZE_MAX;
}

/* Line and column of byte `at` of the text; the whole file for SIZE_MAX. */
static smelt_loc offset_loc(const fe_config *c, size_t at) {
    const char *t = c->text;
    if (at == SIZE_MAX) return (smelt_loc){c->file, 0, 0};
    uint32_t line = 1, col = 1;
    for (size_t i = 0; i < at; i++) {
        if (t[i] == '\n') {
            line++;
            col = 1;
        } else {
            col++;
        }
    }
    return (smelt_loc){c->file, line, col};
}

/* Where config_value(c, name) is in the file — or, when `member` is not
 * NULL, member `member` of that object: line and column of its first byte,
 * or the whole file when it cannot be found. */
static smelt_loc member_loc(const fe_config *c, const char *name, const char *member) {
    const char *t = c->text;
    size_t n = c->length, top = skip_space(t, n, 0);
    size_t at = member_offset(t, n, top, name);
    if (at == SIZE_MAX || (n - at >= 4 && memcmp(t + at, "null", 4) == 0)) {
        size_t rope = member_offset(t, n, top, fe_config_nested_object);
        at = rope == SIZE_MAX ? SIZE_MAX : member_offset(t, n, rope, name);
    }
    if (at != SIZE_MAX && member) at = member_offset(t, n, at, member);
    return offset_loc(c, at);
}

static smelt_loc value_loc(const fe_config *c, const char *name) { return member_loc(c, name, NULL); }

smelt_loc fe_config_loc(const fe_config *c, const char *key, const char *member) {
    if (!c->text) return SMELT_NO_LOC;
    return member_loc(c, key, member);
}

fe_binding fe_config_lookup_object(const fe_config *c, const char *name, const struct json_t **out,
                                   diag_engine *d) {
    if (!c->root) return FE_BINDING_ABSENT;
    json_t *v = config_value(c, name);
    if (!v) return FE_BINDING_ABSENT;
    if (!json_is_object(v)) {
        diag_error(d, value_loc(c, name), "param '%.*s%s' is an object but the config gives %s",
                   DIAG_NAME(name), json_kind_name(v));
        return FE_BINDING_INVALID;
    }
    *out = v;
    return FE_BINDING_FOUND;
}

fe_binding fe_config_lookup_list(const fe_config *c, const char *name, const struct json_t **out,
                                 diag_engine *d) {
    if (!c->root) return FE_BINDING_ABSENT;
    json_t *v = config_value(c, name);
    if (!v) return FE_BINDING_ABSENT;
    if (!json_is_array(v)) {
        diag_error(d, value_loc(c, name), "param '%.*s%s' is a list but the config gives %s", DIAG_NAME(name),
                   json_kind_name(v));
        return FE_BINDING_INVALID;
    }
    *out = v;
    return FE_BINDING_FOUND;
}

smelt_loc fe_config_item_loc(const fe_config *c, const char *key, size_t index) {
    if (!c->text) return SMELT_NO_LOC;
    const char *t = c->text;
    size_t n = c->length, top = skip_space(t, n, 0);
    size_t at = member_offset(t, n, top, key);
    if (at == SIZE_MAX || (n - at >= 4 && memcmp(t + at, "null", 4) == 0)) {
        size_t rope = member_offset(t, n, top, fe_config_nested_object);
        at = rope == SIZE_MAX ? SIZE_MAX : member_offset(t, n, rope, key);
    }
    if (at == SIZE_MAX || t[at] != '[') return offset_loc(c, at);
    size_t list = at;
    at = skip_space(t, n, at + 1);
    for (size_t i = 0; i < index && at < n; i++) {
        at = skip_space(t, n, skip_value(t, n, at));
        if (at >= n || t[at] != ',') return offset_loc(c, list); /* fewer items: the list */
        at = skip_space(t, n, at + 1);
    }
    return offset_loc(c, at < n ? at : list);
}

bool fe_config_value_loc(const fe_config *c, const char *name, smelt_loc *loc) {
    if (!c->root || !config_value(c, name)) return false;
    *loc = value_loc(c, name);
    return true;
}

uint32_t fe_config_keys(const fe_config *c, arena *a, fe_config_key **out) {
    *out = NULL;
    if (!c->root) return 0;
    const char *t = c->text;
    size_t n = c->length, top = skip_space(t, n, 0);
    json_t *nested = json_object_get(c->root, fe_config_nested_object);
    size_t count = json_object_size(c->root) + (json_is_object(nested) ? json_object_size(nested) : 0);
    fe_config_key *keys = arena_alloc(a, (count ? count : 1) * sizeof *keys);
    uint32_t k = 0;
    const char *key;
    json_t *value;
    json_object_foreach(c->root, key, value) {
        keys[k++] = (fe_config_key){arena_strdup(a, key), arena_strdup(a, key), value,
                                    offset_loc(c, member_offset(t, n, top, key))};
    }
    if (json_is_object(nested)) {
        size_t parent = member_offset(t, n, top, fe_config_nested_object);
        json_object_foreach(nested, key, value) {
            size_t length = strlen(fe_config_nested_object) + 1 + strlen(key) + 1;
            char *shown = arena_alloc(a, length);
            snprintf(shown, length, "%s.%s", fe_config_nested_object, key);
            size_t at = parent == SIZE_MAX ? SIZE_MAX : member_offset(t, n, parent, key);
            keys[k++] = (fe_config_key){arena_strdup(a, key), shown, value, offset_loc(c, at)};
        }
    }
    *out = keys;
    return k;
}

fe_binding fe_config_lookup(const fe_config *c, ir_param *param, arena *a, diag_engine *d) {
    if (!c->root) return FE_BINDING_ABSENT;
    json_t *v = config_value(c, param->name);
    if (!v) return FE_BINDING_ABSENT;
    switch (param->type) {
    case IR_PARAM_INT:
        if (json_is_integer(v)) {
            param->value.i = (int64_t)json_integer_value(v);
            return FE_BINDING_FOUND;
        }
        if (json_is_real(v)) {
            if (real_to_int(json_real_value(v), &param->value.i)) return FE_BINDING_FOUND;
            diag_error(d, value_loc(c, param->name),
                       "param '%.*s%s' is int but the config gives the float %g", DIAG_NAME(param->name),
                       json_real_value(v));
            return FE_BINDING_INVALID;
        }
        break;
    case IR_PARAM_FLOAT:
        if (json_is_number(v)) {
            param->value.f = json_number_value(v);
            return FE_BINDING_FOUND;
        }
        break;
    case IR_PARAM_BOOL:
        if (json_is_boolean(v)) {
            param->value.b = json_is_true(v);
            return FE_BINDING_FOUND;
        }
        break;
    case IR_PARAM_STRING:
        if (json_is_string(v)) {
            param->value.s = arena_strndup(a, json_string_value(v), json_string_length(v));
            return FE_BINDING_FOUND;
        }
        break;
    case IR_PARAM_OBJECT: SMELT_DIE("object param '%s': use fe_config_lookup_object", param->name);
    case IR_PARAM_LIST: SMELT_DIE("list param '%s': use fe_config_lookup_list", param->name);
    }
    diag_error(d, value_loc(c, param->name), "param '%.*s%s' is %s but the config gives %s",
               DIAG_NAME(param->name), ir_param_type_name(param->type), json_kind_name(v));
    return FE_BINDING_INVALID;
}

/* ---- --set ------------------------------------------------------------- */

static bool text_to_int(const char *text, int64_t *out) {
    if (!(text[0] >= '0' && text[0] <= '9') && !(text[0] == '-' || text[0] == '+')) return false;
    char *end;
    errno = 0;
    long long v = strtoll(text, &end, 10);
    if (end == text || *end != '\0' || errno == ERANGE) return false;
    *out = v;
    return true;
}

static bool text_to_float(const char *text, double *out) {
    /* strtod skips leading blanks and reads "nan"/"inf"; neither is a value. */
    if (text[0] == '\0' || text[0] == ' ' || text[0] == '\t') return false;
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || *end != '\0' || !isfinite(v)) return false;
    *out = v;
    return true;
}

fe_binding fe_setting_lookup(const fe_options *o, ir_param *param, arena *a, diag_engine *d) {
    int index = fe_options_find(o, param->name);
    if (index < 0) return FE_BINDING_ABSENT;
    const char *text = o->settings[index].value;
    bool ok = false;
    switch (param->type) {
    case IR_PARAM_INT: ok = text_to_int(text, &param->value.i); break;
    case IR_PARAM_FLOAT: ok = text_to_float(text, &param->value.f); break;
    case IR_PARAM_BOOL:
        ok = strcmp(text, "true") == 0 || strcmp(text, "false") == 0;
        param->value.b = strcmp(text, "true") == 0;
        break;
    case IR_PARAM_STRING:
        param->value.s = arena_strdup(a, text);
        ok = true;
        break;
    case IR_PARAM_OBJECT:
    case IR_PARAM_LIST:
        diag_error(d, SMELT_NO_LOC, "--set %.*s%s=...: '%.*s%s' is %s param; give it in config.json",
                   DIAG_NAME(param->name), DIAG_NAME(param->name),
                   param->type == IR_PARAM_LIST ? "a list" : "an object");
        return FE_BINDING_INVALID;
    }
    if (ok) return FE_BINDING_FOUND;
    static const char *const expected[] = {
        [IR_PARAM_INT] = "a decimal integer that fits in 64 bits",
        [IR_PARAM_FLOAT] = "a finite number",
        [IR_PARAM_BOOL] = "true or false",
        [IR_PARAM_STRING] = "text",
        [IR_PARAM_OBJECT] = "a config.json object",
        [IR_PARAM_LIST] = "a config.json list",
    };
    const char *article = param->type == IR_PARAM_INT ? "an" : "a";
    diag_error(d, SMELT_NO_LOC, "--set %.*s%s=%.*s%s: '%.*s%s' is %s %s param; expected %s",
               DIAG_NAME(param->name), DIAG_NAME(text), DIAG_NAME(param->name), article,
               ir_param_type_name(param->type), expected[param->type]);
    return FE_BINDING_INVALID;
}
