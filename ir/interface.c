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
