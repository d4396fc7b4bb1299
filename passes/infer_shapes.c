/* infer_shapes.c - the infer-shapes pass: the dtype and shape of every value.
 *
 * Requires:   a module in program order whose declared-type ops (input,
 *             weight, const) carry their types; other result types may be
 *             unknown (`?`), as the frontend leaves them.
 * Guarantees: every result of every live op whose operands could be typed
 *             has the type its shape rule (ir_infer_op_types) gives; a
 *             result that already had a type keeps it only where the rule
 *             agrees, else that is an error. Returns false on any error.
 * Breaks:     nothing: no op or value is added, removed or reordered.
 *
 * One error per root cause: an op whose operand is still unknown (because
 * an earlier op failed) is skipped silently, and so are its users.
 */
#include "pass.h"

#include <stdlib.h>

static bool operands_known(const ir_module *m, const ir_op *op) {
    for (uint32_t i = 0; i < op->operand_count; i++) {
        ir_value_id id = op->operands[i];
        /* A bad id is left to ir_infer_op_types, which reports it. */
        if (id < m->value_count && m->values[id].type.dtype == SMELT_DTYPE_UNKNOWN) return false;
    }
    return true;
}

/* Stores the inferred types, or reports where a result's type disagrees. */
static bool store_types(ir_module *m, const ir_op *op, const ir_type *inferred, diag_engine *d) {
    bool ok = true;
    for (uint32_t r = 0; r < op->result_count; r++) {
        ir_type *type = &m->values[op->results[r]].type;
        if (type->dtype == SMELT_DTYPE_UNKNOWN) {
            *type = inferred[r];
        } else if (!ir_type_matches(m, type, &inferred[r])) {
            char declared[IR_TYPE_TEXT_MAX], found[IR_TYPE_TEXT_MAX], which[32] = "";
            if (op->result_count > 1) snprintf(which, sizeof which, " %u", r);
            diag_error(d, op->loc, "%s: op result%s declared as %s but inferred %s",
                       ir_op_info_of(op->kind)->name, which,
                       ir_format_type(m, type, declared, sizeof declared),
                       ir_format_type(m, &inferred[r], found, sizeof found));
            ok = false;
        }
    }
    return ok;
}

bool pass_infer_shapes(ir_module *m, diag_engine *d) {
    ir_type *inferred = calloc(IR_MAX_RESULTS, sizeof *inferred);
    if (!inferred) {
        diag_error(d, SMELT_NO_LOC, "out of memory");
        return false;
    }
    bool ok = true;
    for (uint32_t i = 0; i < m->op_count && !diag_should_stop(d); i++) {
        const ir_op *op = &m->ops[i];
        if (op->dead) continue;
        bool known_kind = (unsigned)op->kind < IR_OP_COUNT;
        if (known_kind && (ir_op_info_of(op->kind)->flags & IR_OPF_DECLARES_TYPE)) continue;
        if (!operands_known(m, op)) continue;
        if (op->result_count > IR_MAX_RESULTS) {
            diag_error(d, op->loc, "op has %u results, more than %d", op->result_count, IR_MAX_RESULTS);
            ok = false;
            continue;
        }
        if (!ir_infer_op_types(m, i, inferred, d) || !store_types(m, op, inferred, d)) ok = false;
    }
    free(inferred);
    return ok && !diag_should_stop(d);
}
