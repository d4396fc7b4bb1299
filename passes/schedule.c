/* schedule.c - the schedule pass: the launch order of the kernel groups.
 *
 * Requires: fuse (every op that does work is in a group).
 * Guarantees: every op in a group carries its group's launch step, op.step;
 *   steps are 0, 1, ... with one step per group, and a group comes after
 *   every group that makes one of its inputs. Today the order is program
 *   order (the op list defines values before their uses, so it is a valid
 *   order); a later scheduler may reorder for overlap or memory.
 * Breaks: plan-memory (the arena plan depends on the order: cleared).
 */
#include "pass.h"

#include <stdlib.h>

bool pass_schedule(ir_module *m, const pass_options *o, diag_engine *d) {
    (void)o;
    uint32_t group_count = 0;
    for (uint32_t i = 0; i < m->op_count; i++) {
        const ir_op *op = &m->ops[i];
        if (ir_op_launches(m, i) && op->group == IR_NONE) {
            diag_error(d, op->loc, "%s: op has no kernel group; run the fuse pass before schedule",
                       ir_op_info_of(op->kind)->name);
            return false;
        }
        if (!op->dead && op->group != IR_NONE && op->group >= group_count) group_count = op->group + 1;
    }
    uint32_t *step_of = malloc((group_count ? group_count : 1) * sizeof *step_of);
    if (!step_of) {
        diag_error(d, SMELT_NO_LOC, "out of memory scheduling %u kernel groups", group_count);
        return false;
    }
    for (uint32_t g = 0; g < group_count; g++)
        step_of[g] = IR_NONE;
    uint32_t next = 0;
    for (uint32_t i = 0; i < m->op_count; i++) {
        ir_op *op = &m->ops[i];
        if (op->dead || op->group == IR_NONE) {
            op->step = IR_NONE;
            continue;
        }
        if (step_of[op->group] == IR_NONE) step_of[op->group] = next++;
        op->step = step_of[op->group];
    }
    free(step_of);
    for (ir_value_id v = 0; v < m->value_count; v++)
        m->values[v].buffer = (ir_buffer){IR_BUFFER_NONE, 0};
    m->arena_bytes = 0;
    m->planned_tokens = 0;
    return true;
}
