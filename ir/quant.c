/* quant.c - a weight op's quantization attributes as a quant_format
 * (quant/quant.h), and the bytes a value takes in storage. */
#include "ir.h"
#include "quant.h"

#include <string.h>

bool ir_weight_quant(const ir_module *m, uint32_t op, quant_format *out) {
    memset(out, 0, sizeof *out);
    if (op >= m->op_count || m->ops[op].kind != IR_OP_WEIGHT) return false;
    const ir_attr *quant = ir_op_attr(m, op, "quant");
    if (!quant || quant->kind != IR_ATTR_STRING || !quant_kind_from_name(quant->as.s, &out->kind) ||
        out->kind == QUANT_NONE)
        return false;
    const ir_attr *a;
    if ((a = ir_op_attr(m, op, "group")) && a->kind == IR_ATTR_INT && a->as.i > 0 && a->as.i <= UINT32_MAX)
        out->group = (uint32_t)a->as.i;
    if ((a = ir_op_attr(m, op, "method")) && a->kind == IR_ATTR_STRING)
        quant_method_from_name(a->as.s, &out->method);
    if ((a = ir_op_attr(m, op, "zero")) && a->kind == IR_ATTR_BOOL) out->has_zero = a->as.b;
    if ((a = ir_op_attr(m, op, "act_order")) && a->kind == IR_ATTR_BOOL) out->has_group_index = a->as.b;
    if ((a = ir_op_attr(m, op, "column_scale")) && a->kind == IR_ATTR_BOOL) out->has_column_scale = a->as.b;
    if ((a = ir_op_attr(m, op, "layout")) && a->kind == IR_ATTR_STRING)
        out->interleaved = strcmp(a->as.s, "mma_k16") == 0;
    return true;
}

void ir_weight_set_quant(ir_module *m, uint32_t op, const quant_format *f) {
    ir_op_set_string(m, op, "quant", quant_kind_name(f->kind));
    ir_op_set_int(m, op, "group", f->group);
    ir_op_set_bool(m, op, "zero", f->has_zero);
    ir_op_set_string(m, op, "method", quant_method_name(f->method));
    ir_op_set_bool(m, op, "act_order", f->has_group_index);
    ir_op_set_bool(m, op, "column_scale", f->has_column_scale);
    ir_op_set_string(m, op, "layout", f->interleaved ? "mma_k16" : "row_major");
}

void ir_weight_clear_quant(ir_module *m, uint32_t op) {
    ir_op_set_string(m, op, "quant", "none");
    ir_op_set_int(m, op, "group", 0);
    ir_op_set_bool(m, op, "zero", false);
    ir_op_set_string(m, op, "method", "none");
    ir_op_set_bool(m, op, "act_order", false);
    ir_op_set_bool(m, op, "column_scale", false);
    ir_op_set_string(m, op, "layout", "row_major");
}

bool ir_value_bytes(const ir_module *m, ir_value_id v, int32_t token_symbol, int64_t tokens, uint64_t *out) {
    const ir_value *value = &m->values[v];
    quant_format f;
    if (!ir_weight_quant(m, value->def_op, &f))
        return ir_type_bytes(m, &value->type, token_symbol, tokens, out);
    quant_layout l;
    const ir_type *t = &value->type;
    if (t->rank != 2 && t->rank != 3) return false;
    for (unsigned i = 0; i < t->rank; i++)
        if (ir_dim_is_symbol(t->dims[i]) || t->dims[i].size < 0) return false;
    uint64_t matrices = t->rank == 3 ? (uint64_t)t->dims[0].size : 1, stride;
    return quant_stack_layout_of(&f, matrices, (uint64_t)t->dims[t->rank - 2].size,
                                 (uint64_t)t->dims[t->rank - 1].size, &l, &stride, out) == NULL;
}
