/* fuse.c - the fuse pass: which ops run together as one kernel.
 *
 * Requires: a verified module.
 * Guarantees: every op that does work on a device (ir_op_launches: not a
 *   declaration — input, weight, const, output — and not a view such as
 *   reshape) belongs to exactly one kernel group, op.group; groups are
 *   numbered 0, 1, ... in program order of their first op; declarations and
 *   views have no group. Codegen renders one group as one kernel (or one
 *   GEMM), reading the group's inputs and writing its outputs (codegen/emit.h).
 * Rules: none yet, so every group holds one op — exactly the kernels smelt
 *   had before groups existed. A fusion rule is a function that merges the
 *   group of a consumer into its producer's; the fusion issue adds them here.
 * Breaks: schedule and plan-memory (their annotations are cleared: a new
 *   grouping needs a new order and a new memory plan).
 */
#include "pass.h"

bool pass_fuse(ir_module *m, const pass_options *o, diag_engine *d) {
    (void)o;
    (void)d;
    uint32_t groups = 0;
    for (uint32_t i = 0; i < m->op_count; i++) {
        ir_op *op = &m->ops[i];
        op->group = ir_op_launches(m, i) ? groups++ : IR_NONE;
        op->step = IR_NONE;
    }
    for (ir_value_id v = 0; v < m->value_count; v++)
        m->values[v].buffer = (ir_buffer){IR_BUFFER_NONE, 0};
    m->arena_bytes = 0;
    m->planned_tokens = 0;
    return true;
}
