/* ops.c - the op table, generated from ops.def. */
#include "ir.h"

#include <string.h>

/* One attribute-schema array per op. */
#define A(name, kind, def, choices) {#name, IR_ATTR_##kind, def, choices},
#define ATTRS(...)                                                                                           \
    {                                                                                                        \
        __VA_ARGS__ { NULL, IR_ATTR_NONE, NULL, NULL }                                                       \
    }
#define OP(e, name, mn, mx, nres, flags, family, attrs) static const ir_attr_schema attrs_##e[] = attrs;
#include "ops.def"
#undef OP
#undef ATTRS

#define OP(e, name, mn, mx, nres, flags, family, attrs)                                                      \
    {IR_OP_##e, #name,     mn,                                                                               \
     mx,        nres,      flags,                                                                            \
     #family,   attrs_##e, (uint32_t)(sizeof attrs_##e / sizeof attrs_##e[0] - 1)},
static const ir_op_info op_table[] = {
#include "ops.def"
};
#undef OP

_Static_assert(sizeof op_table / sizeof op_table[0] == IR_OP_COUNT, "ops.def and ir_op_kind disagree");

const ir_op_info *ir_op_info_of(ir_op_kind kind) {
    if ((unsigned)kind >= IR_OP_COUNT) SMELT_DIE("bad op kind %d", (int)kind);
    return &op_table[kind];
}

const ir_op_info *ir_op_info_by_name(const char *name) {
    for (unsigned i = 0; i < IR_OP_COUNT; i++)
        if (strcmp(op_table[i].name, name) == 0) return &op_table[i];
    return NULL;
}

int ir_attr_slot(ir_op_kind kind, const char *name) {
    const ir_op_info *info = ir_op_info_of(kind);
    for (uint32_t i = 0; i < info->attr_count; i++)
        if (strcmp(info->attrs[i].name, name) == 0) return (int)i;
    return -1;
}

const char *ir_attr_kind_name(ir_attr_kind k) {
    static const char *const names[] = {"none",   "int",      "float", "bool",
                                        "string", "int list", "shape", "float list"};
    return (unsigned)k < sizeof names / sizeof names[0] ? names[k] : "?";
}

const char *ir_param_type_name(ir_param_type t) {
    static const char *const names[] = {"int", "float", "bool", "string", "object", "list"};
    return (unsigned)t < sizeof names / sizeof names[0] ? names[t] : "?";
}
