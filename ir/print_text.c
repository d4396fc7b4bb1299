/* print_text.c - writes a module as text IR, the IR's truth (ir_io.h).
 *
 *   module llama {
 *     source "examples/llama.smelt"
 *     param rms_norm_eps: float = 1e-05
 *     dim tokens <= 8192
 *     ignore "lm_head.weight"
 *     %0 = input() {name = "ids"} : i32[tokens] loc(14:3)
 *     %1, %2 = split(%0) {axis = 0, sizes = [2, 2]} : ?, ?
 *     output(%1) {name = "logits"} loc(40:3)
 *   }
 *
 * After the lowering passes the module also says what they decided: its
 * precision policy and arena size (header lines), each value's buffer after
 * its type and each op's kernel group, launch step and, for the output head,
 * that it runs on the rows whose logits the step wants:
 *
 *     precision "bf16"
 *     arena 1048576 bytes for 512 tokens
 *     %9 = rms_norm(%3, %4) {eps = 1e-05} : bf16[tokens, 64] arena(65536) group(1) step(1) loc(42:13)
 *     %12 = matmul(%9, %11) : f32[tokens, 97] arena(0) group(2) step(2) rows(wanted) loc(44:21)
 *
 * The output is canonical, so that parse_text.c reads it back into a module
 * that prints the same bytes: values are renumbered %0, %1, ... in order of
 * definition over the live ops, attributes come in schema order and are
 * left out when equal to their default, and floats are written with the
 * fewest digits that read back exactly. Names that are not identifiers
 * (a module called "my model") are written as quoted strings.
 */
#include "ir_io.h"

#include <inttypes.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

const char *ir_format_float(double v, char *buffer, size_t size) {
    char text[48];
    if (isnan(v)) {
        strcpy(text, "nan");
    } else if (isinf(v)) {
        strcpy(text, v < 0 ? "-inf" : "inf");
    } else {
        /* Plain decimals read best where they stay short (10000.0, 0.0625);
         * elsewhere the shortest %g form. Both loops stop at the first text
         * that reads back as exactly v (%.17g always does). */
        double magnitude = fabs(v);
        bool plain = false;
        if (magnitude == 0.0 || (magnitude >= 1e-4 && magnitude < 1e15)) {
            for (int decimals = 1; decimals <= 20 && !plain; decimals++) {
                snprintf(text, sizeof text, "%.*f", decimals, v);
                plain = strtod(text, NULL) == v;
            }
        }
        for (int precision = 1; precision <= 17 && !plain; precision++) {
            snprintf(text, sizeof text, "%.*g", precision, v);
            if (strtod(text, NULL) == v) break;
        }
        if (!strpbrk(text, ".eni")) strcat(text, ".0"); /* 1.0, not 1: it is a float */
    }
    if (size > 0) snprintf(buffer, size, "%s", text);
    return buffer;
}

uint32_t *ir_value_numbers(const ir_module *m) {
    uint32_t *numbers = malloc((m->value_count ? m->value_count : 1) * sizeof *numbers);
    if (!numbers) arena_out_of_memory(); /* printers run under a recovery point */
    for (uint32_t i = 0; i < m->value_count; i++)
        numbers[i] = UINT32_MAX;
    uint32_t next = 0;
    for (uint32_t i = 0; i < m->op_count; i++) {
        const ir_op *op = &m->ops[i];
        if (op->dead) continue;
        for (uint32_t r = 0; r < op->result_count; r++)
            if (op->results[r] < m->value_count) numbers[op->results[r]] = next++;
    }
    return numbers;
}

static bool is_identifier(const char *s) {
    if (!s || !((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || *s == '_')) return false;
    for (s++; *s; s++)
        if (!((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || (*s >= '0' && *s <= '9') || *s == '_'))
            return false;
    return true;
}

/* "..." with \" \\ \n \t and \xNN for other control bytes and DEL; bytes
 * >= 0x80 are written as they are, so UTF-8 stays readable. */
static void print_string(FILE *out, const char *s) {
    fputc('"', out);
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++) {
        switch (*p) {
        case '"': fputs("\\\"", out); break;
        case '\\': fputs("\\\\", out); break;
        case '\n': fputs("\\n", out); break;
        case '\t': fputs("\\t", out); break;
        default:
            if (*p < 0x20 || *p == 0x7f)
                fprintf(out, "\\x%02x", *p);
            else
                fputc(*p, out);
        }
    }
    fputc('"', out);
}

/* A module, param or dim name: bare when it is an identifier, else quoted. */
static void print_name(FILE *out, const char *name) {
    if (is_identifier(name))
        fputs(name, out);
    else
        print_string(out, name);
}

static void print_dim(const ir_module *m, ir_dim d, FILE *out) {
    if (!ir_dim_is_symbol(d))
        fprintf(out, "%" PRId64, d.size);
    else if ((uint32_t)d.symbol < m->symbol_count)
        print_name(out, m->symbols[d.symbol].name);
    else
        fprintf(out, "<invalid symbol %" PRId32 ">", d.symbol); /* the parser refuses it */
}

static void print_type(const ir_module *m, const ir_type *t, FILE *out) {
    if (t->dtype == SMELT_DTYPE_UNKNOWN) {
        fputc('?', out);
        return;
    }
    fprintf(out, "%s[", smelt_dtype_name(t->dtype));
    unsigned rank = t->rank <= IR_MAX_DIMS ? t->rank : IR_MAX_DIMS;
    for (unsigned i = 0; i < rank; i++) {
        if (i) fputs(", ", out);
        print_dim(m, t->dims[i], out);
    }
    fputc(']', out);
}

static void print_attr_value(const ir_module *m, const ir_attr *a, FILE *out) {
    char number[48];
    switch (a->kind) {
    case IR_ATTR_NONE: break;
    case IR_ATTR_INT: fprintf(out, "%" PRId64, a->as.i); break;
    case IR_ATTR_FLOAT: fputs(ir_format_float(a->as.f, number, sizeof number), out); break;
    case IR_ATTR_BOOL: fputs(a->as.b ? "true" : "false", out); break;
    case IR_ATTR_STRING: print_string(out, a->as.s); break;
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
            print_dim(m, a->as.shape.items[i], out);
        }
        fputc(']', out);
        break;
    case IR_ATTR_FLOATS:
        fputc('[', out);
        for (uint32_t i = 0; i < a->as.floats.count; i++) {
            if (i) fputs(", ", out);
            fputs(ir_format_float(a->as.floats.items[i], number, sizeof number), out);
        }
        fputc(']', out);
        break;
    }
}

/* True when `a` equals the schema's default, read the way
 * ir_op_fill_defaults reads it (so the parser puts the same value back). */
static bool is_schema_default(const ir_attr_schema *s, const ir_attr *a) {
    const char *t = s->default_text;
    if (!t || a->kind != s->kind) return false;
    ir_attr def = {.kind = s->kind};
    switch (s->kind) {
    case IR_ATTR_INT: def.as.i = strtoll(t, NULL, 10); break;
    case IR_ATTR_FLOAT: def.as.f = strtod(t, NULL); break;
    case IR_ATTR_BOOL: def.as.b = strcmp(t, "true") == 0; break;
    case IR_ATTR_STRING: { /* the default text is quoted: "neox" */
        size_t n = strlen(t);
        size_t inner = n >= 2 ? n - 2 : 0;
        return a->as.s && strlen(a->as.s) == inner && memcmp(a->as.s, t + 1, inner) == 0;
    }
    case IR_ATTR_FLOATS: return a->as.floats.count == 0; /* the only default is [] */
    default: return false;
    }
    return ir_attr_equal(a, &def);
}

/* A value's buffer after its type: " arena(4096)", " weight(3)", or nothing. */
static void print_buffer(const ir_buffer *b, FILE *out) {
    if (b->kind == IR_BUFFER_ARENA)
        fprintf(out, " arena(%" PRIu64 ")", b->offset);
    else if (b->kind == IR_BUFFER_WEIGHT)
        fprintf(out, " weight(%" PRIu64 ")", b->offset);
}

/* The op without indentation, loc or newline. With numbers, values print as
 * %N (the text form); without (NULL), the results are left out and each
 * operand prints as its type: the op's signature. With `lowering`, each
 * result's buffer follows its type and the op's group and step come last. */
static void print_op_line(const ir_module *m, const ir_op *op, const uint32_t *numbers, bool lowering,
                          FILE *out) {
    const ir_op_info *info = ir_op_info_of(op->kind);
    for (uint32_t r = 0; numbers && r < op->result_count; r++)
        fprintf(out, "%s%%%" PRIu32, r ? ", " : "",
                op->results[r] < m->value_count ? numbers[op->results[r]] : 0);
    if (numbers && op->result_count) fputs(" = ", out);

    fprintf(out, "%s(", info->name);
    for (uint32_t i = 0; i < op->operand_count; i++) {
        ir_value_id v = op->operands[i];
        if (i) fputs(", ", out);
        if (!numbers && v < m->value_count)
            print_type(m, &m->values[v].type, out);
        else if (!numbers)
            fputc('?', out);
        else if (v < m->value_count && numbers[v] != UINT32_MAX)
            fprintf(out, "%%%" PRIu32, numbers[v]);
        else /* no live op defines it: a name the parser reports as undefined */
            fprintf(out, "%%undefined.%" PRIu32, v);
    }
    fputc(')', out);

    bool any = false;
    for (uint32_t i = 0; i < info->attr_count; i++) {
        const ir_attr *a = &op->attrs[i];
        if (a->kind == IR_ATTR_NONE || is_schema_default(&info->attrs[i], a)) continue;
        fputs(any ? ", " : " {", out);
        any = true;
        fprintf(out, "%s = ", info->attrs[i].name);
        print_attr_value(m, a, out);
    }
    if (any) fputc('}', out);

    if (op->result_count) {
        fputs(" : ", out);
        for (uint32_t r = 0; r < op->result_count; r++) {
            if (r) fputs(", ", out);
            ir_value_id v = op->results[r];
            if (v < m->value_count)
                print_type(m, &m->values[v].type, out);
            else
                fputc('?', out);
            if (lowering && v < m->value_count) print_buffer(&m->values[v].buffer, out);
        }
    }
    if (lowering && op->group != IR_NONE) fprintf(out, " group(%" PRIu32 ")", op->group);
    if (lowering && op->step != IR_NONE) fprintf(out, " step(%" PRIu32 ")", op->step);
    if (lowering && op->wanted_rows) fputs(" rows(wanted)", out);
}

static void print_op(const ir_module *m, const ir_op *op, const uint32_t *numbers, FILE *out) {
    fputs("  ", out);
    print_op_line(m, op, numbers, true, out);
    if (m->source_file >= 0 && op->loc.file == m->source_file && op->loc.line > 0)
        fprintf(out, " loc(%" PRIu32 ":%" PRIu32 ")", op->loc.line, op->loc.col);
    fputc('\n', out);
}

void ir_print_op(const ir_module *m, uint32_t op, FILE *out) {
    uint32_t *numbers = ir_value_numbers(m);
    print_op_line(m, &m->ops[op], numbers, false, out);
    free(numbers);
}

void ir_print_op_signature(const ir_module *m, uint32_t op, FILE *out) {
    print_op_line(m, &m->ops[op], NULL, false, out);
}

static void print_param(const ir_param *p, FILE *out) {
    char number[48];
    fputs("  param ", out);
    print_name(out, p->name);
    fprintf(out, ": %s = ", ir_param_type_name(p->type));
    switch (p->type) {
    case IR_PARAM_INT: fprintf(out, "%" PRId64, p->value.i); break;
    case IR_PARAM_FLOAT: fputs(ir_format_float(p->value.f, number, sizeof number), out); break;
    case IR_PARAM_BOOL: fputs(p->value.b ? "true" : "false", out); break;
    case IR_PARAM_STRING: print_string(out, p->value.s); break;
    case IR_PARAM_OBJECT:
    case IR_PARAM_LIST: fputs("null", out); break; /* never in a module (ir.h) */
    }
    fputc('\n', out);
}

void ir_print_text(const ir_module *m, FILE *out) {
    fputs("module ", out);
    print_name(out, m->name ? m->name : "module");
    fputs(" {\n", out);
    if (m->source_path) {
        fputs("  source ", out);
        print_string(out, m->source_path);
        fputc('\n', out);
    }
    for (uint32_t i = 0; i < m->param_count; i++)
        print_param(&m->params[i], out);
    for (uint32_t i = 0; i < m->symbol_count; i++) {
        fputs("  dim ", out);
        print_name(out, m->symbols[i].name);
        fprintf(out, " <= %" PRId64 "\n", m->symbols[i].bound);
    }
    for (uint32_t i = 0; i < m->ignored_tensor_count; i++) {
        fputs("  ignore ", out);
        print_string(out, m->ignored_tensors[i]);
        fputc('\n', out);
    }
    if (m->precision) {
        fputs("  precision ", out);
        print_string(out, m->precision);
        fputc('\n', out);
    }
    if (m->planned_tokens > 0)
        fprintf(out, "  arena %" PRIu64 " bytes for %" PRId64 " tokens\n", m->arena_bytes, m->planned_tokens);
    uint32_t *numbers = ir_value_numbers(m);
    for (uint32_t i = 0; i < m->op_count; i++)
        if (!m->ops[i].dead) print_op(m, &m->ops[i], numbers, out);
    free(numbers);
    fputs("}\n", out);
}
