/* interface.c - the role table of the model interface (interface.h). */
#include "interface.h"

#include <string.h>

static const ir_role_info roles[] = {
    [IR_ROLE_IDS] = {"ids", IR_OP_INPUT, "input 'ids'"},
    [IR_ROLE_POS] = {"pos", IR_OP_INPUT, "input 'pos'"},
    [IR_ROLE_LOGITS] = {"logits", IR_OP_OUTPUT, "output 'logits'"},
};
_Static_assert(sizeof roles / sizeof roles[0] == IR_ROLE_COUNT, "one row per role");

const ir_role_info *ir_role_info_of(ir_role role) {
    if ((unsigned)role >= IR_ROLE_COUNT) SMELT_DIE("bad role %d", (int)role);
    return &roles[role];
}

ir_role ir_op_role(const ir_module *m, uint32_t op) {
    const ir_op *o = &m->ops[op];
    if (o->dead || (o->kind != IR_OP_INPUT && o->kind != IR_OP_OUTPUT)) return IR_ROLE_COUNT;
    const ir_attr *name = ir_op_attr(m, op, "name");
    if (!name || name->kind != IR_ATTR_STRING) return IR_ROLE_COUNT;
    for (unsigned r = 0; r < IR_ROLE_COUNT; r++)
        if (roles[r].kind == o->kind && strcmp(roles[r].name, name->as.s) == 0) return (ir_role)r;
    return IR_ROLE_COUNT;
}

uint32_t ir_role_op(const ir_module *m, ir_role role) {
    for (uint32_t i = 0; i < m->op_count; i++)
        if (ir_op_role(m, i) == role) return i;
    return IR_NONE;
}

ir_value_id ir_role_value(const ir_module *m, ir_role role) {
    uint32_t op = ir_role_op(m, role);
    if (op == IR_NONE) return IR_NO_VALUE;
    const ir_op *o = &m->ops[op];
    if (o->kind == IR_OP_INPUT) return o->result_count == 1 ? o->results[0] : IR_NO_VALUE;
    return o->operand_count == 1 ? o->operands[0] : IR_NO_VALUE;
}

int32_t ir_token_symbol(const ir_module *m) {
    ir_value_id ids = ir_role_value(m, IR_ROLE_IDS);
    if (ids == IR_NO_VALUE) return -1;
    const ir_type *t = &m->values[ids].type;
    return t->rank >= 1 && ir_dim_is_symbol(t->dims[0]) ? t->dims[0].symbol : -1;
}

/* 0: t has the token symbol as dim 0 and nowhere else; 1: nowhere; -1: elsewhere. */
static int token_rows(const ir_type *t, int32_t tokens) {
    bool at_zero = false, elsewhere = false;
    for (unsigned d = 0; d < t->rank && d < IR_MAX_DIMS; d++)
        if (t->dims[d].symbol == tokens) {
            if (d == 0)
                at_zero = true;
            else
                elsewhere = true;
        }
    return elsewhere ? -1 : at_zero ? 0 : 1;
}

/* The op's integer attribute `name` normalised to [0, rank) of operand 0, or -1. */
static int64_t axis_of(const ir_module *m, uint32_t op, const char *name) {
    const ir_attr *a = ir_op_attr(m, op, name);
    const ir_op *o = &m->ops[op];
    if (!a || a->kind != IR_ATTR_INT || o->operand_count == 0 || o->operands[0] >= m->value_count) return -1;
    int64_t rank = m->values[o->operands[0]].type.rank, axis = a->as.i;
    if (axis < 0) axis += rank;
    return axis >= 0 && axis < rank ? axis : -1;
}

bool ir_op_row_wise(const ir_module *m, uint32_t op) {
    const ir_op *o = &m->ops[op];
    int32_t tokens = ir_token_symbol(m);
    if (o->dead || tokens < 0 || o->result_count == 0) return false;
    switch (o->kind) {
    case IR_OP_EMBEDDING:
    case IR_OP_MATMUL:
    case IR_OP_ADD:
    case IR_OP_MUL:
    case IR_OP_RMS_NORM:
    case IR_OP_LAYER_NORM:
    case IR_OP_ROPE:
    case IR_OP_SILU:
    case IR_OP_GELU:
    case IR_OP_TANH:
    case IR_OP_SIGMOID:
    case IR_OP_QUANTIZE:
    case IR_OP_RESHAPE: break;
    case IR_OP_SOFTMAX:
    case IR_OP_ARGMAX:
    case IR_OP_CONCAT:
    case IR_OP_SPLIT:
    case IR_OP_SLICE:
        if (axis_of(m, op, "axis") < 1) return false;
        break;
    case IR_OP_TRANSPOSE: {
        const ir_attr *perm = ir_op_attr(m, op, "perm");
        if (!perm || perm->kind != IR_ATTR_INTS || perm->as.ints.count == 0 || perm->as.ints.items[0] != 0)
            return false;
        break;
    }
    default: return false;
    }
    for (uint32_t r = 0; r < o->result_count; r++)
        if (o->results[r] >= m->value_count || token_rows(&m->values[o->results[r]].type, tokens) != 0)
            return false;
    ir_value_id codes = IR_NO_VALUE, scales = IR_NO_VALUE;
    if (o->kind == IR_OP_MATMUL) ir_matmul_act_codes(m, op, &codes, &scales);
    for (uint32_t i = 0; i < o->operand_count; i++) {
        if (o->operands[i] >= m->value_count) return false;
        int rows = token_rows(&m->values[o->operands[i]].type, tokens);
        /* A matmul's weight and bias are read whole; its x, and the codes and
         * scales of x (act_codes), are row-indexed. */
        bool row_operand = i == 0 || (codes != IR_NO_VALUE && i + 2 >= o->operand_count);
        if (rows < 0 || (o->kind == IR_OP_MATMUL && row_operand != (rows == 0))) return false;
    }
    return true;
}
