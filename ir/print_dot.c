/* print_dot.c - the module as a Graphviz graph (`smelt ir --format dot`).
 *
 *   digraph llama {
 *     node [fontname="monospace"];
 *     n0 [label="%0 = input\nids\ni32[tokens]", shape=box];
 *     n2 [label="%2 = embedding\nf32[tokens, 64]"];
 *     n1 -> n2;
 *     n0 -> n2;
 *     n5 [label="output\nlogits", shape=doubleoctagon];
 *     n3 -> n5 [label="0"];
 *   }
 *
 * One node per live op, named by its index in the op list; one edge per
 * operand from the op that defines it, labelled with the result index when
 * that op has several results. Inputs and weights are boxes showing their
 * names, outputs double octagons. Values are numbered as in the text form,
 * and the output depends on nothing but the module, so it diffs cleanly.
 */
#include "ir_io.h"

#include <stdlib.h>
#include <string.h>
#include <strings.h>

enum { DOT_NAME_MAX = 200 }; /* bytes of a name shown in a label */

/* Writes the bytes of s (at most `max`, then "...") escaped for a DOT
 * double-quoted string. */
static void print_escaped(FILE *out, const char *s, size_t max) {
    size_t n = 0;
    for (const unsigned char *p = (const unsigned char *)(s ? s : ""); *p; p++, n++) {
        if (n == max) {
            fputs("...", out);
            return;
        }
        if (*p == '"' || *p == '\\')
            fprintf(out, "\\%c", *p);
        else if (*p == '\n')
            fputs("\\n", out);
        else if (*p < 0x20 || *p == 0x7f)
            fprintf(out, "\\\\x%02x", *p); /* shows as \xNN */
        else
            fputc(*p, out);
    }
}

static bool is_dot_id(const char *s) {
    static const char *const keywords[] = {"node", "edge", "graph", "digraph", "subgraph", "strict"};
    if (!s || !((*s >= 'a' && *s <= 'z') || (*s >= 'A' && *s <= 'Z') || *s == '_')) return false;
    for (const char *p = s + 1; *p; p++)
        if (!((*p >= 'a' && *p <= 'z') || (*p >= 'A' && *p <= 'Z') || (*p >= '0' && *p <= '9') || *p == '_'))
            return false;
    for (size_t i = 0; i < sizeof keywords / sizeof keywords[0]; i++)
        if (strcasecmp(s, keywords[i]) == 0) return false;
    return true;
}

static void print_node(const ir_module *m, uint32_t index, const uint32_t *numbers, FILE *out) {
    const ir_op *op = &m->ops[index];
    const ir_op_info *info = ir_op_info_of(op->kind);
    fprintf(out, "  n%u [label=\"", index);
    for (uint32_t r = 0; r < op->result_count; r++) {
        ir_value_id v = op->results[r];
        fprintf(out, "%s%%%u", r ? ", " : "", v < m->value_count ? numbers[v] : 0);
    }
    fprintf(out, "%s%s", op->result_count ? " = " : "", info->name);

    bool declares = op->kind == IR_OP_INPUT || op->kind == IR_OP_WEIGHT || op->kind == IR_OP_OUTPUT;
    const ir_attr *name = declares ? ir_op_attr(m, index, "name") : NULL;
    if (name && name->kind == IR_ATTR_STRING) {
        fputs("\\n", out);
        print_escaped(out, name->as.s, DOT_NAME_MAX);
    }
    const ir_attr *value = op->kind == IR_OP_CONST ? ir_op_attr(m, index, "value") : NULL;
    if (value && value->kind == IR_ATTR_FLOAT) {
        char number[48];
        fprintf(out, "\\n%s", ir_format_float(value->as.f, number, sizeof number));
    }
    if (op->result_count) fputs("\\n", out);
    for (uint32_t r = 0; r < op->result_count; r++) {
        char type[IR_TYPE_TEXT_MAX];
        ir_value_id v = op->results[r];
        if (r) fputs(", ", out);
        print_escaped(out,
                      v < m->value_count ? ir_format_type(m, &m->values[v].type, type, sizeof type) : "?",
                      sizeof type);
    }
    fputc('"', out);
    if (op->kind == IR_OP_INPUT || op->kind == IR_OP_WEIGHT)
        fputs(", shape=box", out);
    else if (op->kind == IR_OP_OUTPUT)
        fputs(", shape=doubleoctagon", out);
    fputs("];\n", out);
}

static void print_edges(const ir_module *m, uint32_t index, const uint32_t *numbers, FILE *out) {
    const ir_op *op = &m->ops[index];
    for (uint32_t i = 0; i < op->operand_count; i++) {
        ir_value_id v = op->operands[i];
        if (v >= m->value_count || numbers[v] == UINT32_MAX) continue; /* verify.c reports it */
        uint32_t def = m->values[v].def_op;
        if (def >= m->op_count) continue;
        fprintf(out, "  n%u -> n%u", def, index);
        if (m->ops[def].result_count > 1) fprintf(out, " [label=\"%u\"]", m->values[v].result_index);
        fputs(";\n", out);
    }
}

void ir_print_dot(const ir_module *m, FILE *out) {
    const char *name = m->name ? m->name : "module";
    if (is_dot_id(name)) {
        fprintf(out, "digraph %s {\n", name);
    } else {
        fputs("digraph \"", out);
        print_escaped(out, name, DOT_NAME_MAX);
        fputs("\" {\n", out);
    }
    fputs("  node [fontname=\"monospace\"];\n", out);
    uint32_t *numbers = ir_value_numbers(m);
    for (uint32_t i = 0; i < m->op_count; i++) {
        if (m->ops[i].dead) continue;
        print_node(m, i, numbers, out);
        print_edges(m, i, numbers, out);
    }
    free(numbers);
    fputs("}\n", out);
}
