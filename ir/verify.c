/* verify.c - the invariants of a module (ir_verify, declared in ir.h).
 *
 * Checked for every live op, in program order, reporting every violation at
 * the op's location and going on (the diag engine stops after its limit):
 *   - the kind is known; operand and result counts match ops.def (split: one
 *     result per entry of `sizes`);
 *   - every operand is the result of an earlier live op (straight-line SSA),
 *     every result is a value of this op, defined once;
 *   - required attributes are present, every attribute has its schema's
 *     kind, STRING attributes lie within their `choices`;
 *   - every type has rank <= IR_MAX_DIMS, valid symbols, constant dims >= 0,
 *     and an element count and byte size (symbols at their bounds) that fit
 *     in 64 bits; declared-type ops (input, weight, const) have a type;
 *   - output names are unique;
 *   - a quantized weight (quant != "none") has its codes' dtype, the shape
 *     [N, K] that its format fits (quant_layout_of), a method, and only
 *     matmuls (out_in) read it, as their weight, and, when it is int8 with
 *     one scale per row (group = K, row-major, no zero points, group index
 *     or column scales), embeddings as their table; or it is an [E, N, K]
 *     stack (MoE experts, each [N, K] in that format) that only moe
 *     ops read, as their gate, up or down experts; an unquantized one has
 *     every other quantization attribute at its default;
 *   - a matmul's act_quant has a quantized weight of its kind, one scale per
 *     output channel, and a scale rule (tensor: act_scale_value > 0); with
 *     act_codes its last two operands are results 0 and 1 of one quantize op
 *     of its x (operand 0) with its act_quant, act_scale and act_scale_value,
 *     and its weight has no column scales; a quantize has codes of its dtype
 *     (f8e4m3 or i8) and f32 scales, and a scale rule like a matmul's;
 *   - a moe's gate_up_act_quant and down_act_quant each have stacks of their
 *     kind with one scale per output channel, act_scale token or tensor when
 *     either is set (none otherwise), and under tensor the static scale of
 *     each quantized input (gate_up_act_scale_value, down_act_scale_value)
 *     > 0 and finite; every other of the two values is 0;
 *   - where every operand and result type is known, the shape rule gives the
 *     result types back.
 * Unknown result types are allowed: a module is valid before infer-shapes.
 */
#include "interface.h"
#include "ir.h"
#include "quant.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct verifier {
    const ir_module *m;
    diag_engine *d;
    bool ok;
    uint8_t *state; /* value_count entries, a value_state each */
} verifier;

typedef enum value_state {
    VALUE_UNDEFINED = 0, /* no live op has defined it so far */
    VALUE_DEFINED,
    VALUE_BAD_TYPE, /* defined, with a malformed type (already reported) */
} value_state;

#define TYPE_TEXT(v, t) ir_format_type((v)->m, (t), (char[IR_TYPE_TEXT_MAX]){0}, IR_TYPE_TEXT_MAX)

/* Reports "<op>: <message>" at the op's location. */
static void violation(verifier *v, const ir_op *op, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void violation(verifier *v, const ir_op *op, const char *fmt, ...) {
    char message[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    diag_error(v->d, op->loc, "%s: %s", ir_op_info_of(op->kind)->name, message);
    v->ok = false;
}

/* ---- attributes -------------------------------------------------------------- */

/* Is `s` one of the '|'-separated words of `choices`? */
static bool in_choices(const char *s, const char *choices) {
    size_t n = strlen(s);
    for (const char *p = choices;;) {
        const char *bar = strchr(p, '|');
        size_t length = bar ? (size_t)(bar - p) : strlen(p);
        if (length == n && memcmp(p, s, n) == 0) return true;
        if (!bar) return false;
        p = bar + 1;
    }
}

static bool check_dim(verifier *v, const ir_op *op, const char *what, unsigned index, ir_dim d) {
    if (ir_dim_is_symbol(d) && (uint32_t)d.symbol >= v->m->symbol_count) {
        violation(v, op, "%s: dim %u refers to symbol %d, which does not exist (the module has %u)", what,
                  index, (int)d.symbol, v->m->symbol_count);
        return false;
    }
    if (!ir_dim_is_symbol(d) && d.size < 0) {
        violation(v, op, "%s: dim %u is %lld; constant dims must be >= 0", what, index, (long long)d.size);
        return false;
    }
    return true;
}

static bool check_attribute(verifier *v, const ir_op *op, const ir_attr_schema *s, const ir_attr *a) {
    if (a->kind == IR_ATTR_NONE) {
        if (s->default_text) return true;
        violation(v, op, "missing required attribute '%s'", s->name);
        return false;
    }
    if (a->kind != s->kind) {
        violation(v, op, "attribute '%s' must be %s, found %s", s->name, ir_attr_kind_name(s->kind),
                  ir_attr_kind_name(a->kind));
        return false;
    }
    switch (a->kind) {
    case IR_ATTR_STRING:
        if (!a->as.s) break;
        if (s->choices && !in_choices(a->as.s, s->choices)) {
            violation(v, op, "attribute '%s' must be one of %s, found '%.*s%s'", s->name, s->choices,
                      DIAG_NAME(a->as.s));
            return false;
        }
        return true;
    case IR_ATTR_INTS:
        if (a->as.ints.count && !a->as.ints.items) break;
        return true;
    case IR_ATTR_FLOATS:
        if (a->as.floats.count && !a->as.floats.items) break;
        return true;
    case IR_ATTR_SHAPE: {
        if (a->as.shape.count && !a->as.shape.items) break;
        if (a->as.shape.count > IR_MAX_DIMS) {
            violation(v, op, "attribute '%s' has %u dims, more than %d", s->name, a->as.shape.count,
                      IR_MAX_DIMS);
            return false;
        }
        char what[64];
        snprintf(what, sizeof what, "attribute '%s'", s->name);
        bool ok = true;
        for (uint32_t i = 0; i < a->as.shape.count; i++)
            ok &= check_dim(v, op, what, i, a->as.shape.items[i]);
        return ok;
    }
    default: return true;
    }
    violation(v, op, "attribute '%s' has no value", s->name);
    return false;
}

static bool check_attributes(verifier *v, const ir_op *op) {
    const ir_op_info *info = ir_op_info_of(op->kind);
    if (info->attr_count && !op->attrs) {
        violation(v, op, "the op has no attribute table");
        return false;
    }
    bool ok = true;
    for (uint32_t i = 0; i < info->attr_count; i++)
        ok &= check_attribute(v, op, &info->attrs[i], &op->attrs[i]);
    return ok;
}

/* ---- operands, results, types ------------------------------------------------ */

static bool check_operands(verifier *v, const ir_op *op) {
    const ir_op_info *info = ir_op_info_of(op->kind);
    const ir_module *m = v->m;
    unsigned max = info->max_operands < 0 ? IR_MAX_OPERANDS : (unsigned)info->max_operands;
    bool ok = true;
    if (op->operand_count < (unsigned)info->min_operands || op->operand_count > max) {
        if ((unsigned)info->min_operands == max)
            violation(v, op, "expected %u operand%s, found %u", max, max == 1 ? "" : "s", op->operand_count);
        else
            violation(v, op, "expected %d to %u operands, found %u", info->min_operands, max,
                      op->operand_count);
        ok = false;
    }
    for (uint32_t i = 0; i < op->operand_count; i++) {
        ir_value_id id = op->operands[i];
        if (id < m->value_count && v->state[id] != VALUE_UNDEFINED) continue;
        ok = false;
        if (id >= m->value_count) {
            violation(v, op, "operand %u refers to a value that does not exist", i);
            continue;
        }
        uint32_t def = m->values[id].def_op;
        if (def < m->op_count && m->ops[def].dead)
            violation(v, op, "operand %u uses a value whose defining op was removed", i);
        else
            violation(v, op, "operand %u is used before its definition", i);
    }
    return ok;
}

/* Results are values of this op, each defined once; their count is right. */
static bool check_results(verifier *v, const ir_op *op, uint32_t index, bool attrs_ok) {
    const ir_op_info *info = ir_op_info_of(op->kind);
    const ir_module *m = v->m;
    bool ok = true;
    if (info->results >= 0 && op->result_count != (unsigned)info->results) {
        violation(v, op, "expected %d result%s, found %u", info->results, info->results == 1 ? "" : "s",
                  op->result_count);
        ok = false;
    } else if (info->results < 0 && attrs_ok) {
        const ir_attr *sizes = ir_op_attr(m, index, "sizes");
        if (sizes && sizes->as.ints.count != op->result_count) {
            violation(v, op, "expected %u results (one per entry of 'sizes'), found %u", sizes->as.ints.count,
                      op->result_count);
            ok = false;
        }
    }
    for (uint32_t r = 0; r < op->result_count; r++) {
        ir_value_id id = op->results[r];
        if (id >= m->value_count) {
            violation(v, op, "result %u refers to a value that does not exist", r);
            ok = false;
        } else if (v->state[id] != VALUE_UNDEFINED) {
            violation(v, op, "result %u is a value defined twice", r);
            ok = false;
        } else if (m->values[id].def_op != index || m->values[id].result_index != r) {
            violation(v, op, "result %u records op %u result %u as its definition", r, m->values[id].def_op,
                      m->values[id].result_index);
            ok = false;
        }
    }
    return ok;
}

/* Rank, symbols, dims >= 0 and a 64-bit element count and byte size. */
static bool check_type(verifier *v, const ir_op *op, uint32_t result, const ir_type *t) {
    char what[32];
    snprintf(what, sizeof what, "result %u", result);
    if (t->dtype == SMELT_DTYPE_UNKNOWN) return true;
    if ((unsigned)t->dtype >= SMELT_DTYPE_COUNT) {
        violation(v, op, "%s has no valid dtype (%d)", what, (int)t->dtype);
        return false;
    }
    if (t->rank > IR_MAX_DIMS) {
        violation(v, op, "%s has rank %u, more than %d", what, t->rank, IR_MAX_DIMS);
        return false;
    }
    bool ok = true;
    for (unsigned i = 0; i < t->rank; i++)
        ok &= check_dim(v, op, what, i, t->dims[i]);
    if (!ok) return false;
    uint64_t elements, bytes;
    if (!ir_type_max_elements(v->m, t, &elements)) {
        violation(v, op, "%s has more than 2^64 elements", TYPE_TEXT(v, t));
        return false;
    }
    /* elements * bits / 8, rounded up, without overflowing the product. */
    uint64_t bits = smelt_dtype_bits(t->dtype), whole, rest = (elements % 8 * bits + 7) / 8;
    if (size_mul_overflow(elements / 8, bits, &whole) || size_add_overflow(whole, rest, &bytes)) {
        violation(v, op, "%s takes more than 2^64 bytes", TYPE_TEXT(v, t));
        return false;
    }
    return true;
}

/* Declared types exist and every result type is well formed; marks the
 * results defined (with a bad type where one is malformed). */
static bool check_result_types(verifier *v, const ir_op *op, bool *all_known) {
    const ir_module *m = v->m;
    bool ok = true;
    for (uint32_t r = 0; r < op->result_count; r++) {
        if (op->results[r] >= m->value_count) continue;
        const ir_type *t = &m->values[op->results[r]].type;
        if (t->dtype == SMELT_DTYPE_UNKNOWN) {
            *all_known = false;
            if (ir_op_info_of(op->kind)->flags & IR_OPF_DECLARES_TYPE) {
                violation(v, op, "the declared type is missing");
                ok = false;
            }
        }
        bool well_formed = check_type(v, op, r, t);
        v->state[op->results[r]] = well_formed ? VALUE_DEFINED : VALUE_BAD_TYPE;
        ok &= well_formed;
    }
    return ok;
}

/* The shape rule, run again, gives the types the results have. */
static void check_inferred_types(verifier *v, uint32_t index, ir_type *scratch) {
    const ir_op *op = &v->m->ops[index];
    if (!ir_infer_op_types(v->m, index, scratch, v->d)) {
        v->ok = false;
        return;
    }
    for (uint32_t r = 0; r < op->result_count; r++) {
        const ir_type *actual = &v->m->values[op->results[r]].type;
        if (ir_type_matches(v->m, actual, &scratch[r])) continue;
        char prefix[32] = "result";
        if (op->result_count > 1) snprintf(prefix, sizeof prefix, "result %u", r);
        violation(v, op, "%s type %s does not match the inferred %s", prefix, TYPE_TEXT(v, actual),
                  TYPE_TEXT(v, &scratch[r]));
    }
}

/* ---- output names ------------------------------------------------------------- */

typedef struct named_output {
    const char *name;
    uint32_t op;
} named_output;

/* The module is not known to be valid: a status, like any violation. */
static void out_of_memory(verifier *v) {
    diag_error(v->d, SMELT_NO_LOC, "out of memory verifying the module");
    v->ok = false;
}

static int compare_outputs(const void *a, const void *b) {
    const named_output *x = a, *y = b;
    int c = strcmp(x->name, y->name);
    return c ? c : (x->op > y->op) - (x->op < y->op);
}

static void check_output_names(verifier *v) {
    const ir_module *m = v->m;
    named_output *outputs = calloc(m->op_count ? m->op_count : 1, sizeof *outputs);
    if (!outputs) {
        out_of_memory(v);
        return;
    }
    uint32_t count = 0;
    for (uint32_t i = 0; i < m->op_count; i++) {
        const ir_op *op = &m->ops[i];
        if (op->dead || op->kind != IR_OP_OUTPUT || !op->attrs) continue;
        const ir_attr *name = &op->attrs[ir_attr_slot(IR_OP_OUTPUT, "name")];
        if (name->kind == IR_ATTR_STRING && name->as.s) outputs[count++] = (named_output){name->as.s, i};
    }
    qsort(outputs, count, sizeof *outputs, compare_outputs);
    for (uint32_t i = 1; i < count && !diag_should_stop(v->d); i++) {
        if (strcmp(outputs[i].name, outputs[i - 1].name) != 0) continue;
        uint32_t first = i - 1;
        while (first > 0 && strcmp(outputs[first - 1].name, outputs[i].name) == 0)
            first--;
        violation(v, &m->ops[outputs[i].op], "output name '%.*s%s' is used twice",
                  DIAG_NAME(outputs[i].name));
        diag_note(v->d, m->ops[outputs[first].op].loc, "the first output named '%.*s%s' is here",
                  DIAG_NAME(outputs[i].name));
    }
    free(outputs);
}

/* ---- quantized weights --------------------------------------------------------- */

static void check_weight_quant(verifier *v, uint32_t index) {
    const ir_module *m = v->m;
    const ir_op *op = &m->ops[index];
    const ir_attr *transposed = ir_op_attr(m, index, "transposed"), *stack = ir_op_attr(m, index, "stack");
    quant_format f;
    if (transposed && transposed->as.b &&
        (m->values[op->results[0]].type.rank != 2 || (stack && stack->as.s[0] != '\0') ||
         !ir_weight_quant(m, index, &f)))
        violation(v, op, "a transposed weight is a quantized matrix (rank 2, not stacked), not %s",
                  TYPE_TEXT(v, &m->values[op->results[0]].type));
    if (!ir_weight_quant(m, index, &f)) {
        const ir_attr *group = ir_op_attr(m, index, "group"), *zero = ir_op_attr(m, index, "zero");
        const ir_attr *method = ir_op_attr(m, index, "method"), *order = ir_op_attr(m, index, "act_order");
        const ir_attr *columns = ir_op_attr(m, index, "column_scale"),
                      *layout = ir_op_attr(m, index, "layout");
        if ((group && group->as.i != 0) || (zero && zero->as.b) || (order && order->as.b) ||
            (columns && columns->as.b) || (method && strcmp(method->as.s, "none") != 0))
            violation(v, op, "quantization attributes on a weight with quant = \"none\"");
        if (layout && layout->kind == IR_ATTR_STRING && strcmp(layout->as.s, "row_major") != 0)
            violation(v, op, "layout \"%s\" is a quantized weight's (int4 codes interleaved)", layout->as.s);
        return;
    }
    const ir_type *t = &m->values[op->results[0]].type;
    if (t->dtype != quant_code_dtype(f.kind)) {
        violation(v, op, "%s codes are stored as %s, not %s", quant_kind_name(f.kind),
                  smelt_dtype_name(quant_code_dtype(f.kind)), smelt_dtype_name(t->dtype));
        return;
    }
    bool constant = true;
    for (unsigned i = 0; i < t->rank; i++)
        constant = constant && !ir_dim_is_symbol(t->dims[i]);
    if (!constant || (t->rank != 2 && t->rank != 3)) {
        violation(v, op,
                  "a quantized weight is a constant [N, K] matrix or an [E, N, K] stack of experts, not %s",
                  TYPE_TEXT(v, t));
        return;
    }
    const ir_attr *method = ir_op_attr(m, index, "method");
    if (!method || method->kind != IR_ATTR_STRING || strcmp(method->as.s, "none") == 0)
        violation(v, op, "a quantized weight needs a method (rtn, awq, gptq, smooth or checkpoint)");
    quant_layout l;
    uint64_t stride, total;
    const char *why = quant_stack_layout_of(&f, t->rank == 3 ? (uint64_t)t->dims[0].size : 1,
                                            (uint64_t)t->dims[t->rank - 2].size,
                                            (uint64_t)t->dims[t->rank - 1].size, &l, &stride, &total);
    if (why) violation(v, op, "group %u on %s: %s", f.group, TYPE_TEXT(v, t), why);
}

/* Can an embedding gather rows of a weight of format f and K columns?
 * int8 codes with one scale per row and nothing else: what its kernel
 * dequantizes (codegen/emit_embedding.c). */
static bool gatherable(const quant_format *f, int64_t columns) {
    return f->kind == QUANT_INT8 && f->group == (uint64_t)columns && !f->has_zero && !f->has_group_index &&
           !f->has_column_scale && !f->interleaved;
}

/* Only a matmul reads a quantized weight, as its out_in weight (operand 1),
 * and an embedding an int8 one with a scale per row, as its table (operand
 * 0); only a moe reads a quantized stack of experts, as gate, up or down
 * (operands 2, 3, 4). */
static void check_quant_readers(verifier *v, uint32_t index) {
    const ir_module *m = v->m;
    const ir_op *op = &m->ops[index];
    for (uint32_t i = 0; i < op->operand_count; i++) {
        ir_value_id id = op->operands[i];
        if (id >= m->value_count || v->state[id] != VALUE_DEFINED) continue;
        quant_format f;
        if (!ir_weight_quant(m, m->values[id].def_op, &f)) continue;
        if (m->values[id].type.rank == 3) {
            if (op->kind != IR_OP_MOE || i < 2)
                violation(
                    v, op,
                    "operand %u is a quantized stack of experts, which only a moe reads as its gate, up "
                    "or down",
                    i);
            continue;
        }
        const ir_attr *layout = op->kind == IR_OP_MATMUL ? ir_op_attr(m, index, "layout") : NULL;
        bool matmul =
            layout && layout->kind == IR_ATTR_STRING && strcmp(layout->as.s, "out_in") == 0 && i == 1;
        const ir_type *t = &m->values[id].type;
        if (op->kind == IR_OP_EMBEDDING && i == 0 && t->rank == 2) {
            if (!gatherable(&f, t->dims[1].size))
                violation(v, op,
                          "operand 0 is a quantized %s table that an embedding cannot gather (int8 with one "
                          "scale per row only)",
                          quant_kind_name(f.kind));
        } else if (!matmul) {
            violation(v, op,
                      "operand %u is a quantized weight, which only a matmul (layout out_in) reads as its "
                      "weight (or an embedding as its table, int8 with one scale per row)",
                      i);
        }
    }
}

static bool act_codes(const ir_module *m, uint32_t index);

/* A matmul's activation quantization (W8A8, ops.def): a quantized weight of
 * the matching kind with one scale per output channel (and, with act_codes,
 * no column scales), and a scale rule. */
static void check_act_quant(verifier *v, uint32_t index) {
    const ir_module *m = v->m;
    const ir_op *op = &m->ops[index];
    const ir_attr *quant = ir_op_attr(m, index, "act_quant"), *scale = ir_op_attr(m, index, "act_scale");
    const ir_attr *value = ir_op_attr(m, index, "act_scale_value");
    const char *kind = quant && quant->kind == IR_ATTR_STRING ? quant->as.s : "none";
    const char *rule = scale && scale->kind == IR_ATTR_STRING ? scale->as.s : "none";
    double static_scale = value && value->kind == IR_ATTR_FLOAT ? value->as.f : 0.0;
    if (strcmp(kind, "none") == 0) {
        if (strcmp(rule, "none") != 0 || static_scale != 0.0)
            violation(v, op, "act_scale without act_quant: the activations are not quantized");
        return;
    }
    if (strcmp(rule, "token") == 0 && static_scale != 0.0)
        violation(v, op, "act_scale \"token\" is computed at run time: act_scale_value must be 0");
    else if (strcmp(rule, "tensor") == 0 && !(static_scale > 0.0 && isfinite(static_scale)))
        violation(v, op, "act_scale \"tensor\" needs act_scale_value > 0 (the static scale), found %g",
                  static_scale);
    else if (strcmp(rule, "none") == 0)
        violation(v, op, "act_quant = \"%s\" needs act_scale \"token\" or \"tensor\"", kind);
    ir_value_id w = op->operand_count > 1 ? op->operands[1] : IR_NO_VALUE;
    quant_format f;
    if (w == IR_NO_VALUE || w >= m->value_count || v->state[w] != VALUE_DEFINED ||
        !ir_weight_quant(m, m->values[w].def_op, &f)) {
        violation(v, op, "act_quant = \"%s\" needs a quantized weight (W8A8)", kind);
        return;
    }
    quant_kind wanted = strcmp(kind, "i8") == 0 ? QUANT_INT8 : QUANT_FP8;
    const ir_type *t = &m->values[w].type;
    if (f.kind != wanted)
        violation(v, op, "act_quant = \"%s\" needs an %s weight, found %s", kind, quant_kind_name(wanted),
                  quant_kind_name(f.kind));
    else if (t->rank != 2 || ir_dim_is_symbol(t->dims[1]) || f.group != (uint64_t)t->dims[1].size ||
             f.has_zero || f.has_group_index)
        violation(v, op,
                  "act_quant needs one weight scale per output channel (group = K, no zero points or "
                  "group index)");
    else if (f.has_column_scale && act_codes(m, index))
        violation(v, op,
                  "act_codes needs a weight without column scales (the codes are of x itself, not of x "
                  "times the column scales)");
}

static bool act_codes(const ir_module *m, uint32_t index) {
    const ir_attr *a = ir_op_attr(m, index, "act_codes");
    return a && a->kind == IR_ATTR_BOOL && a->as.b;
}

/* Attribute `name` of op `index`, or `absent` where it is absent or of
 * another kind (an op that failed its own checks is read too). */
static const char *string_or(const ir_module *m, uint32_t index, const char *name, const char *absent) {
    const ir_attr *a = ir_op_attr(m, index, name);
    return a && a->kind == IR_ATTR_STRING && a->as.s ? a->as.s : absent;
}

static double float_or_zero(const ir_module *m, uint32_t index, const char *name) {
    const ir_attr *a = ir_op_attr(m, index, name);
    return a && a->kind == IR_ATTR_FLOAT ? a->as.f : 0.0;
}

/* A matmul with act_codes (ops.def): its last two operands are the codes
 * and the scales, results 0 and 1 of one quantize op of the matmul's x
 * (operand 0, the very value) with the matmul's act_quant, act_scale and
 * act_scale_value. (check_act_quant checks the weight and the scale rule.) */
static void check_act_codes(verifier *v, uint32_t index) {
    const ir_module *m = v->m;
    const ir_op *op = &m->ops[index];
    if (!act_codes(m, index)) return;
    const char *kind = string_or(m, index, "act_quant", "none");
    if (strcmp(kind, "none") == 0) {
        violation(v, op, "act_codes without act_quant: there are no codes of x to read");
        return;
    }
    ir_value_id codes, scales;
    if (!ir_matmul_act_codes(m, index, &codes, &scales)) {
        violation(v, op,
                  "act_codes needs the codes and scales of x as its last two operands, found %u operands",
                  op->operand_count);
        return;
    }
    uint32_t q = m->values[codes].def_op;
    if (m->ops[q].kind != IR_OP_QUANTIZE || m->values[codes].result_index != 0 ||
        m->values[scales].def_op != q || m->values[scales].result_index != 1) {
        violation(v, op,
                  "act_codes: operands %u and %u must be the codes and the scales (results 0 and 1) of one "
                  "quantize op",
                  op->operand_count - 2, op->operand_count - 1);
        return;
    }
    if (m->ops[q].operand_count != 1 || m->ops[q].operands[0] != op->operands[0]) {
        violation(v, op, "act_codes: the quantize op reads another value than the matmul's x (operand 0)");
        return;
    }
    const char *dtype = string_or(m, q, "dtype", "?"), *rule = string_or(m, q, "act_scale", "token");
    const char *matmul_rule = string_or(m, index, "act_scale", "none");
    double value = float_or_zero(m, q, "act_scale_value"),
           matmul_value = float_or_zero(m, index, "act_scale_value");
    if (strcmp(dtype, kind) != 0 || strcmp(rule, matmul_rule) != 0 || value != matmul_value)
        violation(v, op,
                  "act_codes: the quantize op (dtype \"%s\", act_scale \"%s\", act_scale_value %g) does not "
                  "quantize as the matmul does (act_quant \"%s\", act_scale \"%s\", act_scale_value %g)",
                  dtype, rule, value, kind, matmul_rule, matmul_value);
}

/* A quantize op (ops.def): codes of its dtype and f32 scales, one per row
 * of x (the shape rule checks the dims; after precision a float dtype may
 * stand for another, so the dtypes are checked here), and a scale rule:
 * tensor with its static scale > 0, token with none. */
static void check_quantize(verifier *v, uint32_t index) {
    const ir_module *m = v->m;
    const ir_op *op = &m->ops[index];
    const char *dtype = string_or(m, index, "dtype", "f8e4m3"),
               *rule = string_or(m, index, "act_scale", "token");
    double value = float_or_zero(m, index, "act_scale_value");
    smelt_dtype code = strcmp(dtype, "i8") == 0 ? SMELT_DTYPE_I8 : SMELT_DTYPE_F8E4M3;
    const ir_type *codes = &m->values[op->results[0]].type, *scales = &m->values[op->results[1]].type;
    if (codes->dtype != SMELT_DTYPE_UNKNOWN && codes->dtype != code)
        violation(v, op, "the codes (result 0) of dtype \"%s\" are %s, found %s", dtype,
                  smelt_dtype_name(code), TYPE_TEXT(v, codes));
    if (scales->dtype != SMELT_DTYPE_UNKNOWN && scales->dtype != SMELT_DTYPE_F32)
        violation(v, op, "the scales (result 1) are f32, one per row of x, found %s", TYPE_TEXT(v, scales));
    if (strcmp(rule, "token") == 0 && value != 0.0)
        violation(v, op, "act_scale \"token\" is computed at run time: act_scale_value must be 0");
    else if (strcmp(rule, "tensor") == 0 && !(value > 0.0 && isfinite(value)))
        violation(v, op, "act_scale \"tensor\" needs act_scale_value > 0 (the static scale), found %g",
                  value);
}

/* A moe's activation quantization (W8A8, ops.def): each quantized input
 * (gate_up_act_quant: x, for the gate and up stacks; down_act_quant: the
 * hidden rows, for down) over stacks of the matching kind with one scale
 * per output channel, act_scale token or tensor exactly when one is
 * quantized, and under tensor each quantized input's static scale
 * (gate_up_act_scale_value, down_act_scale_value) > 0 and finite; every
 * other scale value 0. */
static void check_moe_act_quant(verifier *v, uint32_t index) {
    const ir_module *m = v->m;
    const ir_op *op = &m->ops[index];
    const char *attrs[2] = {"gate_up_act_quant", "down_act_quant"};
    const char *values[2] = {"gate_up_act_scale_value", "down_act_scale_value"};
    const uint32_t first[2] = {2, 4}, last[2] = {3, 4}; /* the stacks each input is multiplied by */
    const char *rule = string_or(m, index, "act_scale", "none");
    bool any = false, per_tensor = strcmp(rule, "tensor") == 0;
    for (int input = 0; input < 2; input++) {
        const char *kind = string_or(m, index, attrs[input], "none");
        double value = float_or_zero(m, index, values[input]);
        bool quantized = strcmp(kind, "none") != 0;
        if (quantized && per_tensor && !(value > 0.0 && isfinite(value)))
            violation(v, op, "act_scale \"tensor\" needs %s > 0 (the static scale of %s), found %g",
                      values[input], input == 0 ? "x" : "the hidden rows", value);
        else if (quantized && !per_tensor && value != 0.0)
            violation(v, op, "%s must be 0 under act_scale \"%s\" (computed at run time), found %g",
                      values[input], rule, value);
        else if (!quantized && value != 0.0)
            violation(v, op, "%s must be 0 without %s (the input is not quantized), found %g", values[input],
                      attrs[input], value);
        if (!quantized) continue;
        any = true;
        quant_kind wanted = strcmp(kind, "i8") == 0 ? QUANT_INT8 : QUANT_FP8;
        for (uint32_t i = first[input]; i <= last[input] && i < op->operand_count; i++) {
            ir_value_id w = op->operands[i];
            quant_format f;
            if (w >= m->value_count || v->state[w] != VALUE_DEFINED) continue;
            const ir_type *t = &m->values[w].type;
            if (!ir_weight_quant(m, m->values[w].def_op, &f))
                violation(v, op, "%s = \"%s\" needs quantized experts in operand %u (W8A8)", attrs[input],
                          kind, i);
            else if (f.kind != wanted)
                violation(v, op, "%s = \"%s\" needs %s experts in operand %u, found %s", attrs[input], kind,
                          quant_kind_name(wanted), i, quant_kind_name(f.kind));
            else if (t->rank != 3 || ir_dim_is_symbol(t->dims[2]) || f.group != (uint64_t)t->dims[2].size ||
                     f.has_zero || f.has_group_index)
                violation(v, op,
                          "%s needs one weight scale per output channel of each expert in operand %u (group "
                          "= K, no zero points or group index)",
                          attrs[input], i);
        }
    }
    if (any && strcmp(rule, "token") != 0 && !per_tensor)
        violation(v, op,
                  "a moe's quantized activations need act_scale \"token\" (computed per row at run time) or "
                  "\"tensor\" (static scales)");
    else if (!any && strcmp(rule, "none") != 0)
        violation(v, op,
                  "act_scale without gate_up_act_quant or down_act_quant: the activations are not "
                  "quantized");
}

/* ---- the module --------------------------------------------------------------- */

static void verify_op(verifier *v, uint32_t index, ir_type *scratch) {
    const ir_op *op = &v->m->ops[index];
    if ((unsigned)op->kind >= IR_OP_COUNT) {
        diag_error(v->d, op->loc, "op %u has no valid kind (%d)", index, (int)op->kind);
        v->ok = false;
        return;
    }
    bool operands_ok = check_operands(v, op);
    bool attrs_ok = check_attributes(v, op);
    bool results_ok = check_results(v, op, index, attrs_ok);
    bool all_known = true;
    bool types_ok = check_result_types(v, op, &all_known) && results_ok;
    if (!operands_ok || !attrs_ok || !types_ok || op->result_count > IR_MAX_RESULTS) return;
    if (op->kind == IR_OP_WEIGHT) check_weight_quant(v, index);
    check_quant_readers(v, index);
    if (op->kind == IR_OP_MATMUL) check_act_quant(v, index);
    if (op->kind == IR_OP_MATMUL) check_act_codes(v, index);
    if (op->kind == IR_OP_QUANTIZE) check_quantize(v, index);
    if (op->kind == IR_OP_MOE) check_moe_act_quant(v, index);
    for (uint32_t i = 0; i < op->operand_count; i++) {
        ir_value_id id = op->operands[i];
        if (v->m->values[id].type.dtype == SMELT_DTYPE_UNKNOWN || v->state[id] == VALUE_BAD_TYPE)
            all_known = false;
    }
    if (all_known) check_inferred_types(v, index, scratch);
}

/* ---- lowering annotations ----------------------------------------------------- */

/* What fuse, schedule and plan-memory wrote is consistent: a step only on a
 * grouped op, one step per group, and every arena buffer inside the arena at
 * the planned token count. */
typedef struct group_step {
    uint32_t group, step, op;
} group_step;

static int compare_group_steps(const void *a, const void *b) {
    const group_step *x = a, *y = b;
    if (x->group != y->group) return x->group < y->group ? -1 : 1;
    return x->op < y->op ? -1 : x->op > y->op;
}

/* Every op of a group has the group's step. */
static void check_group_steps(verifier *v) {
    const ir_module *m = v->m;
    group_step *pairs = malloc((m->op_count ? m->op_count : 1) * sizeof *pairs);
    if (!pairs) {
        out_of_memory(v);
        return;
    }
    uint32_t count = 0;
    for (uint32_t i = 0; i < m->op_count; i++)
        if (!m->ops[i].dead && m->ops[i].group != IR_NONE)
            pairs[count++] = (group_step){m->ops[i].group, m->ops[i].step, i};
    qsort(pairs, count, sizeof *pairs, compare_group_steps);
    for (uint32_t k = 1; k < count && !diag_should_stop(v->d); k++)
        if (pairs[k].group == pairs[k - 1].group && pairs[k].step != pairs[k - 1].step)
            violation(v, &m->ops[pairs[k].op], "group %u has two launch steps", pairs[k].group);
    free(pairs);
}

/* rows(wanted) (passes/wanted_rows.c): such an op is row-wise, and what it
 * computes — the wanted rows alone — is read only by ops that want no more
 * (other rows(wanted) ops, the output 'logits'); a kernel group is on the
 * wanted rows whole or not at all. */
static void check_wanted_rows(verifier *v) {
    const ir_module *m = v->m;
    uint32_t groups = 0;
    for (uint32_t i = 0; i < m->op_count; i++)
        if (!m->ops[i].dead && m->ops[i].group != IR_NONE && m->ops[i].group >= groups)
            groups = m->ops[i].group + 1;
    /* Per group: 1 some op is on the wanted rows, 2 some op is not. */
    uint8_t *seen = calloc(groups ? groups : 1, 1);
    if (!seen) {
        out_of_memory(v);
        return;
    }
    uint32_t logits = ir_role_op(m, IR_ROLE_LOGITS);
    for (uint32_t i = 0; i < m->op_count && !diag_should_stop(v->d); i++) {
        const ir_op *op = &m->ops[i];
        if (op->dead) continue;
        if (op->group != IR_NONE) seen[op->group] |= op->wanted_rows ? 1 : 2;
        if (op->wanted_rows && !ir_op_row_wise(m, i))
            violation(v, op, "rows(wanted) on an op that is not row-wise");
        if (op->wanted_rows || i == logits) continue;
        for (uint32_t j = 0; j < op->operand_count; j++) {
            ir_value_id x = op->operands[j];
            if (x < m->value_count && m->values[x].def_op < m->op_count &&
                m->ops[m->values[x].def_op].wanted_rows)
                violation(v, op,
                          "operand %u is computed on the wanted rows alone (rows(wanted)) but this op "
                          "reads every row",
                          j);
        }
    }
    for (uint32_t i = 0; i < m->op_count && !diag_should_stop(v->d); i++) {
        const ir_op *op = &m->ops[i];
        if (!op->dead && op->group != IR_NONE && seen[op->group] == 3) {
            violation(v, op, "group %u is on the wanted rows in part (rows(wanted) on some of its ops)",
                      op->group);
            seen[op->group] = 0;
        }
    }
    free(seen);
}

static void check_lowering(verifier *v) {
    const ir_module *m = v->m;
    check_group_steps(v);
    check_wanted_rows(v);
    /* The symbol sized at planned_tokens: dim 0 of the ids input (ir/interface.h),
     * read with the bounds checks a module that may be malformed needs. */
    int32_t tokens = -1;
    uint32_t ids = ir_role_op(m, IR_ROLE_IDS);
    if (ids != IR_NONE && m->ops[ids].result_count == 1 && m->ops[ids].results[0] < m->value_count) {
        const ir_type *t = &m->values[m->ops[ids].results[0]].type;
        if (t->rank >= 1 && ir_dim_is_symbol(t->dims[0])) tokens = t->dims[0].symbol;
    }
    for (uint32_t i = 0; i < m->op_count && !diag_should_stop(v->d); i++) {
        const ir_op *op = &m->ops[i];
        if (op->dead) continue;
        if (op->step != IR_NONE && op->group == IR_NONE)
            violation(v, op, "a launch step without a kernel group");
        for (uint32_t r = 0; r < op->result_count; r++) {
            if (op->results[r] >= m->value_count) continue;
            const ir_value *value = &m->values[op->results[r]];
            if (value->buffer.kind != IR_BUFFER_ARENA) continue;
            if (m->planned_tokens <= 0) {
                violation(v, op, "an arena buffer in a module without an 'arena' line");
                continue;
            }
            uint64_t bytes = 0;
            bool sized = ir_type_bytes(m, &value->type, tokens, m->planned_tokens, &bytes);
            if (sized &&
                (value->buffer.offset > m->arena_bytes || bytes > m->arena_bytes - value->buffer.offset))
                violation(v, op, "result %u at arena(%llu), %llu bytes, ends past the arena's %llu bytes", r,
                          (unsigned long long)value->buffer.offset, (unsigned long long)bytes,
                          (unsigned long long)m->arena_bytes);
        }
    }
}

bool ir_verify(const ir_module *m, diag_engine *d) {
    verifier v = {.m = m, .d = d, .ok = true};
    v.state = calloc(m->value_count ? m->value_count : 1, sizeof *v.state);
    ir_type *scratch = calloc(IR_MAX_RESULTS, sizeof *scratch);
    if (!v.state || !scratch) {
        out_of_memory(&v);
        free(scratch);
        free(v.state);
        return false;
    }
    for (uint32_t i = 0; i < m->op_count && !diag_should_stop(d); i++)
        if (!m->ops[i].dead) verify_op(&v, i, scratch);
    if (!diag_should_stop(d)) check_output_names(&v);
    if (!diag_should_stop(d)) check_lowering(&v);
    free(scratch);
    free(v.state);
    return v.ok;
}
