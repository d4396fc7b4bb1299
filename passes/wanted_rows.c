/* wanted_rows.c - the wanted-rows pass: which ops need compute only the rows
 * whose logits a step wants.
 *
 * A step runs T tokens, but not every row of its logits is wanted: `smelt
 * eval` scores all T, generation samples the last row alone (and a prompt's
 * earlier chunks want none). The output head — the ops between the last op
 * that mixes rows (attention) and the output 'logits': the final norm and
 * the lm_head, and in a decoder the last layer's o projection and MLP too —
 * is row-wise, so on a step that wants the last row it can run on that row
 * alone: a 512-token prefill runs its lm_head on one row, not 512.
 *
 * Requires: fuse (kernel groups; a module without them is taken op by op).
 * Guarantees: op.wanted_rows (printed `rows(wanted)`) exactly on the live ops
 *   that (1) are row-wise (ir_op_row_wise, ir/interface.h), (2) feed the
 *   output 'logits', (3) whose every result is read only by rows(wanted) ops
 *   or by that output, and (4) whose kernel group is rows(wanted) whole: the
 *   largest such set. Codegen renders the mark (codegen/lower.c): each
 *   instruction of such a group is a wanted-rows instruction of the launch
 *   program (plan/program.h), which a step that wants the last row alone
 *   runs at one token, on its operands' last rows.
 * Breaks: nothing (fuse clears the marks with the groups they depend on).
 */
#include "interface.h"
#include "pass.h"

#include <stdlib.h>
#include <string.h>

/* Unmarks op i's producers and its group's ops while some mark breaks rule 3
 * or 4; returns whether anything changed. */
static bool drop_broken(ir_module *m, bool *wanted, bool *group_broken, uint32_t logits, uint32_t groups) {
    bool changed = false;
    memset(group_broken, 0, groups ? groups : 1);
    for (uint32_t i = 0; i < m->op_count; i++) {
        const ir_op *op = &m->ops[i];
        if (op->dead) continue;
        if (!wanted[i] && op->group != IR_NONE) group_broken[op->group] = true;
        if (wanted[i] || i == logits) continue;
        /* op i reads every row of its operands: their producers must make them. */
        for (uint32_t j = 0; j < op->operand_count; j++) {
            uint32_t producer = m->values[op->operands[j]].def_op;
            if (wanted[producer]) wanted[producer] = false, changed = true;
        }
    }
    for (uint32_t i = 0; i < m->op_count; i++)
        if (wanted[i] && m->ops[i].group != IR_NONE && group_broken[m->ops[i].group])
            wanted[i] = false, changed = true;
    return changed;
}

bool pass_wanted_rows(ir_module *m, const pass_options *o, diag_engine *d) {
    (void)o;
    uint32_t logits = ir_role_op(m, IR_ROLE_LOGITS), groups = 0;
    for (uint32_t i = 0; i < m->op_count; i++) {
        m->ops[i].wanted_rows = false;
        if (!m->ops[i].dead && m->ops[i].group != IR_NONE && m->ops[i].group >= groups)
            groups = m->ops[i].group + 1;
    }
    if (logits == IR_NONE) return true; /* no head: every op computes every row */
    bool *wanted = calloc(m->op_count ? m->op_count : 1, sizeof *wanted);
    bool *group_broken = calloc(groups ? groups : 1, sizeof *group_broken);
    if (!wanted || !group_broken) {
        free(wanted);
        free(group_broken);
        diag_error(d, SMELT_NO_LOC, "out of memory in the wanted-rows pass");
        return false;
    }
    /* Rules 1 and 2: the row-wise ops that feed the logits, found from the
     * output back (operands are defined before their readers). */
    wanted[logits] = true;
    for (uint32_t i = m->op_count; i-- > 0;) {
        const ir_op *op = &m->ops[i];
        if (op->dead || !wanted[i]) continue;
        if (i != logits && !ir_op_row_wise(m, i)) {
            wanted[i] = false;
            continue;
        }
        for (uint32_t j = 0; j < op->operand_count; j++)
            wanted[m->values[op->operands[j]].def_op] = true;
    }
    wanted[logits] = false; /* the output computes nothing */
    /* Rules 3 and 4, until nothing breaks them. */
    while (drop_broken(m, wanted, group_broken, logits, groups)) {
    }
    for (uint32_t i = 0; i < m->op_count; i++)
        m->ops[i].wanted_rows = wanted[i];
    free(wanted);
    free(group_broken);
    return true;
}
