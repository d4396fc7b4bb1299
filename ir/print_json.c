/* print_json.c - the module as a flat program in smelt's JSON model language.
 *
 * `smelt ir X --format json` writes this; reading it back (frontend/
 * json_model.c) and elaborating it builds the same ops in the same order, so
 * `smelt ir X.json` prints the same text IR as `smelt ir X`. docs/json.md has
 * the language; the shape of the dump is
 *
 *   {
 *     "smelt": 1,
 *     "model": "llama",
 *     "source": "examples/llama.smelt",
 *     "body": [
 *       {"param": "hidden_size", "type": "int", "default": 64},
 *       {"dim": "tokens", "max": 8192},
 *       {"ignore": "lm_head.weight"},
 *       {"input": "ids", "dtype": "i32", "shape": ["tokens"], "loc": [14, 3]},
 *       {"weight": "%1", "dtype": "f32", "shape": [97, 64], "name": "model.embed_tokens.weight"},
 *       {"let": "%2", "value": {"call": "embedding", "args": ["%1", "ids"], "loc": [17, 11]}},
 *       {"let": ["%3", "%4"], "value": {"call": "split", "args": ["%2"], "attrs": {"axis": 1, "sizes": [32,
 * 32]}}},
 *       {"output": "logits", "value": "%3", "loc": [40, 3]}
 *     ]
 *   }
 *
 * Params carry their bound values as defaults. An input's value is named by
 * the input's own name; every other value by "%N", N counting the results of
 * the (live) ops from 0 as the text printer does. Attributes equal to their
 * schema default are left out. One statement per line keeps diffs readable.
 */
#include "ir_io.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { FLOAT_TEXT_BYTES = 32 };

/* ---- JSON scalars --------------------------------------------------------- */

/* Length of the valid UTF-8 sequence at s (1..4), or 0 when invalid. */
static size_t utf8_sequence_length(const unsigned char *s) {
    unsigned char c = s[0];
    size_t length;
    unsigned char low = 0x80, high = 0xBF; /* range of the second byte */
    if (c >= 0xC2 && c <= 0xDF)
        length = 2;
    else if (c >= 0xE0 && c <= 0xEF)
        length = 3, low = c == 0xE0 ? 0xA0 : 0x80, high = c == 0xED ? 0x9F : 0xBF;
    else if (c >= 0xF0 && c <= 0xF4)
        length = 4, low = c == 0xF0 ? 0x90 : 0x80, high = c == 0xF4 ? 0x8F : 0xBF;
    else
        return 0;
    if (s[1] < low || s[1] > high) return 0;
    for (size_t i = 2; i < length; i++)
        if ((s[i] & 0xC0) != 0x80) return 0;
    return length;
}

/* A JSON string. Bytes that are not UTF-8 (JSON cannot hold them) become
 * U+FFFD; names that came from a DSL or JSON file are UTF-8 already. */
static void write_string(FILE *out, const char *text) {
    const unsigned char *s = (const unsigned char *)text;
    fputc('"', out);
    while (*s) {
        unsigned char c = *s;
        if (c >= 0x80) {
            size_t n = utf8_sequence_length(s);
            if (n == 0) {
                fputs("\\ufffd", out);
                s++;
            } else {
                fwrite(s, 1, n, out);
                s += n;
            }
            continue;
        }
        switch (c) {
        case '"': fputs("\\\"", out); break;
        case '\\': fputs("\\\\", out); break;
        case '\n': fputs("\\n", out); break;
        case '\t': fputs("\\t", out); break;
        case '\r': fputs("\\r", out); break;
        default:
            if (c < 0x20)
                fprintf(out, "\\u%04x", c);
            else
                fputc(c, out);
        }
        s++;
    }
    fputc('"', out);
}

/* A float that reads back as the same double and as a JSON real (never an
 * integer). JSON and the model language have no infinity or NaN literal:
 * those are written as the expressions 1.0 / 0.0, -(1.0 / 0.0) and 0.0 / 0.0,
 * which say what the value was but which the elaborator refuses (division by
 * zero), so such a module does not read back. */
static void write_float(FILE *out, double v) {
    if (isnan(v)) {
        fputs("{\"op\": \"/\", \"args\": [0.0, 0.0]}", out);
    } else if (isinf(v)) {
        fputs(v > 0 ? "{\"op\": \"/\", \"args\": [1.0, 0.0]}"
                    : "{\"op\": \"-\", \"args\": [{\"op\": \"/\", \"args\": [1.0, 0.0]}]}",
              out);
    } else {
        char text[FLOAT_TEXT_BYTES];
        fputs(ir_format_float(v, text, sizeof text), out);
    }
}

static void write_dim(FILE *out, const ir_module *m, ir_dim d) {
    if (!ir_dim_is_symbol(d))
        fprintf(out, "%" PRId64, d.size);
    else if ((uint32_t)d.symbol < m->symbol_count)
        write_string(out, m->symbols[d.symbol].name);
    else
        fprintf(out, "\"?symbol%" PRId32 "\"", d.symbol);
}

/* ---- attributes ------------------------------------------------------------ */

/* Whether `a` equals the schema's default (defaults in ops.def are C-literal
 * text: 0, -1, true, "neox"); required attributes have none. */
static bool attr_is_default(const ir_attr_schema *s, const ir_attr *a) {
    const char *t = s->default_text;
    if (!t || a->kind != s->kind) return false;
    switch (a->kind) {
    case IR_ATTR_INT: return a->as.i == strtoll(t, NULL, 10);
    case IR_ATTR_FLOAT: {
        double d = strtod(t, NULL);
        return a->as.f == d && signbit(a->as.f) == signbit(d);
    }
    case IR_ATTR_BOOL: return a->as.b == (strcmp(t, "true") == 0);
    case IR_ATTR_STRING: {
        size_t n = strlen(t);
        return n >= 2 && strlen(a->as.s) == n - 2 && memcmp(a->as.s, t + 1, n - 2) == 0;
    }
    case IR_ATTR_FLOATS: return a->as.floats.count == 0; /* the only default is [] */
    default: return false;
    }
}

static void write_attr(FILE *out, const ir_module *m, const ir_attr *a) {
    switch (a->kind) {
    case IR_ATTR_INT: fprintf(out, "%" PRId64, a->as.i); break;
    case IR_ATTR_FLOAT: write_float(out, a->as.f); break;
    case IR_ATTR_BOOL: fputs(a->as.b ? "true" : "false", out); break;
    case IR_ATTR_STRING:
        fputs("{\"str\": ", out);
        write_string(out, a->as.s);
        fputc('}', out);
        break;
    case IR_ATTR_INTS:
        fputc('[', out);
        for (uint32_t i = 0; i < a->as.ints.count; i++)
            fprintf(out, "%s%" PRId64, i ? ", " : "", a->as.ints.items[i]);
        fputc(']', out);
        break;
    case IR_ATTR_SHAPE:
        fputc('[', out);
        for (uint32_t i = 0; i < a->as.shape.count; i++) {
            if (i) fputs(", ", out);
            write_dim(out, m, a->as.shape.items[i]);
        }
        fputc(']', out);
        break;
    case IR_ATTR_FLOATS:
        fputc('[', out);
        for (uint32_t i = 0; i < a->as.floats.count; i++) {
            if (i) fputs(", ", out);
            write_float(out, a->as.floats.items[i]);
        }
        fputc(']', out);
        break;
    case IR_ATTR_NONE: fputs("null", out); break;
    }
}

/* ---- values, types, locations ------------------------------------------- */

typedef struct json_printer {
    FILE *out;
    const ir_module *m;
    uint32_t *numbers; /* value id -> print number, UINT32_MAX: not defined by a live op */
} json_printer;

/* The name attribute of an op, or "?" in a module that lacks it. */
static const char *name_attr(const ir_module *m, uint32_t op, const char *name) {
    const ir_attr *a = ir_op_attr(m, op, name);
    return a && a->kind == IR_ATTR_STRING ? a->as.s : "?";
}

static void write_value(const json_printer *p, ir_value_id v) {
    const ir_module *m = p->m;
    if (v >= m->value_count || p->numbers[v] == UINT32_MAX) {
        fprintf(p->out, "\"%%?%" PRIu32 "\"", v); /* a broken module still prints */
        return;
    }
    uint32_t def = m->values[v].def_op;
    if (m->ops[def].kind == IR_OP_INPUT)
        write_string(p->out, name_attr(m, def, "name"));
    else
        fprintf(p->out, "\"%%%" PRIu32 "\"", p->numbers[v]);
}

/* `"dtype": "f32", "shape": [...]` of an op's only result. */
static void write_type(const json_printer *p, uint32_t op) {
    const ir_op *o = &p->m->ops[op];
    const ir_type *t = o->result_count ? &p->m->values[o->results[0]].type : &(ir_type){0};
    fputs("\"dtype\": ", p->out);
    write_string(p->out, smelt_dtype_name(t->dtype));
    fputs(", \"shape\": [", p->out);
    for (unsigned i = 0; i < t->rank && i < IR_MAX_DIMS; i++) {
        if (i) fputs(", ", p->out);
        write_dim(p->out, p->m, t->dims[i]);
    }
    fputc(']', p->out);
}

/* `, "loc": [line, col]` for locations in the module's source file. */
static void write_loc(const json_printer *p, smelt_loc loc) {
    if (p->m->source_file < 0 || loc.file != p->m->source_file || loc.line == 0) return;
    fprintf(p->out, ", \"loc\": [%" PRIu32 ", %" PRIu32 "]", loc.line, loc.col);
}

/* ---- statements ------------------------------------------------------------ */

static void write_param(FILE *out, const ir_param *param) {
    fputs("{\"param\": ", out);
    write_string(out, param->name);
    fprintf(out, ", \"type\": \"%s\", \"default\": ", ir_param_type_name(param->type));
    switch (param->type) {
    case IR_PARAM_INT: fprintf(out, "%" PRId64, param->value.i); break;
    case IR_PARAM_FLOAT: write_float(out, param->value.f); break;
    case IR_PARAM_BOOL: fputs(param->value.b ? "true" : "false", out); break;
    case IR_PARAM_OBJECT:
    case IR_PARAM_LIST: fputs("null", out); break; /* never in a module (ir.h) */
    case IR_PARAM_STRING:
        fputs("{\"str\": ", out);
        write_string(out, param->value.s ? param->value.s : "");
        fputc('}', out);
        break;
    }
    fputc('}', out);
}

static void write_dim_decl(FILE *out, const ir_symbol *s) {
    fputs("{\"dim\": ", out);
    write_string(out, s->name);
    fprintf(out, ", \"max\": %" PRId64 "}", s->bound);
}

/* {"let": "%N" | ["%N", ...], "value": {"call": OP, "args"?, "attrs"?, "loc"?}} */
static void write_call(const json_printer *p, uint32_t op) {
    FILE *out = p->out;
    const ir_op *o = &p->m->ops[op];
    const ir_op_info *info = ir_op_info_of(o->kind);
    fputs("{\"let\": ", out);
    if (o->result_count != 1) fputc('[', out);
    for (uint32_t i = 0; i < o->result_count; i++) {
        if (i) fputs(", ", out);
        write_value(p, o->results[i]);
    }
    if (o->result_count != 1) fputc(']', out);
    fprintf(out, ", \"value\": {\"call\": \"%s\"", info->name);
    if (o->operand_count) {
        fputs(", \"args\": [", out);
        for (uint32_t i = 0; i < o->operand_count; i++) {
            if (i) fputs(", ", out);
            write_value(p, o->operands[i]);
        }
        fputc(']', out);
    }
    bool any = false;
    for (uint32_t i = 0; i < info->attr_count; i++) {
        const ir_attr *a = &o->attrs[i];
        if (a->kind == IR_ATTR_NONE || attr_is_default(&info->attrs[i], a)) continue;
        fprintf(out, "%s\"%s\": ", any ? ", " : ", \"attrs\": {", info->attrs[i].name);
        write_attr(out, p->m, a);
        any = true;
    }
    if (any) fputc('}', out);
    write_loc(p, o->loc);
    fputs("}}", out);
}

static void write_op(const json_printer *p, uint32_t op) {
    FILE *out = p->out;
    const ir_module *m = p->m;
    const ir_op *o = &m->ops[op];
    switch (o->kind) {
    case IR_OP_INPUT:
        fputs("{\"input\": ", out);
        write_string(out, name_attr(m, op, "name"));
        fputs(", ", out);
        write_type(p, op);
        break;
    case IR_OP_WEIGHT: {
        fputs("{\"weight\": ", out);
        write_value(p, o->result_count ? o->results[0] : IR_NO_VALUE);
        fputs(", ", out);
        write_type(p, op);
        fputs(", \"name\": ", out);
        write_string(out, name_attr(m, op, "name"));
        const ir_attr *stack = ir_op_attr(m, op, "stack");
        if (stack && stack->kind == IR_ATTR_STRING && stack->as.s[0]) {
            fputs(", \"stacked\": ", out);
            write_string(out, stack->as.s);
        }
        break;
    }
    case IR_OP_OUTPUT:
        fputs("{\"output\": ", out);
        write_string(out, name_attr(m, op, "name"));
        fputs(", \"value\": ", out);
        write_value(p, o->operand_count ? o->operands[0] : IR_NO_VALUE);
        break;
    default: write_call(p, op); return;
    }
    write_loc(p, o->loc);
    fputc('}', out);
}

void ir_print_json(const ir_module *m, FILE *out) {
    json_printer p = {out, m, ir_value_numbers(m)};
    fputs("{\n  \"smelt\": 1,\n  \"model\": ", out);
    write_string(out, m->name ? m->name : "model");
    if (m->source_path) {
        fputs(",\n  \"source\": ", out);
        write_string(out, m->source_path);
    }
    fputs(",\n  \"body\": [", out);
    const char *separator = "\n    ";
    for (uint32_t i = 0; i < m->param_count; i++, separator = ",\n    ") {
        fputs(separator, out);
        write_param(out, &m->params[i]);
    }
    for (uint32_t i = 0; i < m->symbol_count; i++, separator = ",\n    ") {
        fputs(separator, out);
        write_dim_decl(out, &m->symbols[i]);
    }
    for (uint32_t i = 0; i < m->ignored_tensor_count; i++, separator = ",\n    ") {
        fputs(separator, out);
        fputs("{\"ignore\": ", out);
        write_string(out, m->ignored_tensors[i]);
        fputc('}', out);
    }
    for (uint32_t i = 0; i < m->op_count; i++) {
        if (m->ops[i].dead) continue;
        fputs(separator, out);
        separator = ",\n    ";
        write_op(&p, i);
    }
    fputs(separator[0] == ',' ? "\n  ]\n}\n" : "]\n}\n", out);
    free(p.numbers);
}
