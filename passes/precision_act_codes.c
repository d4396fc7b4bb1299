/* precision_act_codes.c - the precision pass's quantize ops: the codes an
 * FP8 W8A8 matmul's GEMM reads. Part of `precision` (precision.c clears them
 * first, before it assigns dtypes, and inserts them last, once act_quant is
 * set), kept apart so that the W8A8 policy and the dataflow it needs change
 * independently.
 *
 * Requires: act_quant, act_scale and act_scale_value set on every matmul
 *   (precision.c's set_act_quant), and no quantize op or act_codes operand
 *   left from an earlier run (precision_act_codes_clear removes those an
 *   act_codes matmul read and nothing else does; a quantize written by hand stays).
 * Guarantees: every live matmul with act_quant "f8e4m3" whose weight has no
 *   column scales reads the codes and scales of its x as its last two
 *   operands, act_codes = true (ir/ops.def): one
 *     %c, %s = quantize(%x) {dtype = "f8e4m3", act_scale = ..., act_scale_value = ...}
 *   per distinct (x, act_scale, act_scale_value), inserted right before the
 *   first matmul that reads it (after x's definition: the order stays
 *   valid), so that Q, K and V share one, gate and up another. The codes
 *   are f8e4m3 and the scales f32 under every preset and activation dtype
 *   (--act f32 too): inserted after the dtypes are assigned, they keep the
 *   dtypes the shape rule gives. A scaled GEMM reads the codes (the plan's
 *   cuBLASLt FP8 GEMM); the GEMV and the reference may still read x.
 * Not touched: int8 W8A8 matmuls, whose SmoothQuant column scales multiply
 *   x before it is coded (the codes are of x c, not of x: they keep the
 *   matmul's own quantization, act_codes false); a checkpoint's FP8 weights
 *   with column scales likewise; moe ops (their experts quantize inside the
 *   moe kernels); matmuls a --keep or the accuracy gate leaves unquantized
 *   (no act_quant, no quantize).
 * Idempotent with precision_act_codes_clear before it: running precision
 *   again removes the quantizes and the act_codes operands, then inserts
 *   them again for the new decisions.
 * Breaks: where it removes or inserts a quantize, the lowering passes'
 *   annotations (kernel groups, launch steps, rows(wanted), the memory
 *   plan) of a module that had them: cleared, as fuse clears what follows
 *   it; run fuse and the passes after it again.
 */
#include "pass.h"
#include "quant.h"

#include <stdlib.h>
#include <string.h>

/* The lowering passes' annotations, which a change of the op list makes
 * stale: groups, steps, wanted rows and the memory plan (fuse and the
 * passes after it make them again). */
static void clear_lowering(ir_module *m) {
    for (uint32_t i = 0; i < m->op_count; i++) {
        m->ops[i].group = m->ops[i].step = IR_NONE;
        m->ops[i].wanted_rows = false;
    }
    for (ir_value_id v = 0; v < m->value_count; v++)
        m->values[v].buffer = (ir_buffer){IR_BUFFER_NONE, 0};
    m->planned_tokens = 0;
    m->arena_bytes = 0;
}

void precision_act_codes_clear(ir_module *m) {
    /* The quantizes act_codes matmuls read: this file's. One that nothing
     * else reads goes with their operands; a quantize written by hand (read
     * by other ops, or by none) stays. */
    bool *coded = arena_array(&m->arena, m->op_count ? m->op_count : 1, sizeof *coded);
    for (uint32_t i = 0; i < m->op_count; i++) {
        ir_op *op = &m->ops[i];
        if (op->dead || op->kind != IR_OP_MATMUL) continue;
        ir_value_id codes, scales;
        if (ir_matmul_act_codes(m, i, &codes, &scales)) {
            coded[m->values[codes].def_op] = coded[m->values[scales].def_op] = true;
            op->operand_count -= 2;
        }
        ir_op_set_bool(m, i, "act_codes", false);
    }
    uint32_t *uses = ir_use_counts(m);
    bool removed = false;
    for (uint32_t i = 0; i < m->op_count; i++) {
        ir_op *op = &m->ops[i];
        if (!op->dead && op->kind == IR_OP_QUANTIZE && coded[i] && uses[op->results[0]] == 0 &&
            uses[op->results[1]] == 0)
            op->dead = removed = true;
    }
    free(uses);
    if (!removed) return;
    ir_module_compact(m);
    clear_lowering(m);
}

/* Does matmul `op` read quantize codes: act_quant f8e4m3, a weight without
 * column scales (set_act_quant has checked the rest: E4M3 codes, one scale
 * per output channel)? */
static bool wants_codes(const ir_module *m, uint32_t op) {
    quant_format f;
    return strcmp(ir_op_string(m, op, "act_quant"), "f8e4m3") == 0 &&
           ir_weight_quant(m, m->values[m->ops[op].operands[1]].def_op, &f) && !f.has_column_scale;
}

/* Quantize op q codes x as matmul `op` would: the same x and scale rule. */
static bool same_coding(const ir_module *m, uint32_t q, uint32_t op) {
    return m->ops[q].operands[0] == m->ops[op].operands[0] &&
           strcmp(ir_op_string(m, q, "act_scale"), ir_op_string(m, op, "act_scale")) == 0 &&
           ir_op_float(m, q, "act_scale_value") == ir_op_float(m, op, "act_scale_value");
}

/* quantize(x) before op `at` with matmul `op`'s coding; returns its index. */
static uint32_t insert_quantize(ir_module *m, uint32_t at, uint32_t op) {
    ir_value_id x = m->ops[op].operands[0];
    uint32_t q = ir_insert_op(m, at, IR_OP_QUANTIZE, &x, 1, 2, m->ops[op].loc);
    op++; /* inserted before it */
    ir_op_fill_defaults(m, q);
    ir_op_set_string(m, q, "dtype", ir_op_string(m, op, "act_quant"));
    ir_op_set_string(m, q, "act_scale", ir_op_string(m, op, "act_scale"));
    ir_op_set_float(m, q, "act_scale_value", ir_op_float(m, op, "act_scale_value"));
    const ir_type *t = &m->values[x].type;
    ir_type *codes = &m->values[m->ops[q].results[0]].type, *scales = &m->values[m->ops[q].results[1]].type;
    *codes = *t;
    codes->dtype = SMELT_DTYPE_F8E4M3;
    *scales = *t;
    scales->rank = t->rank ? t->rank - 1 : 0;
    scales->dtype = SMELT_DTYPE_F32;
    return q;
}

void precision_act_codes_insert(ir_module *m) {
    /* The quantizes inserted so far, by their codes (their op index moves
     * as ops are inserted before it; the value's def_op follows). */
    ir_value_id *made = malloc((m->op_count ? m->op_count : 1) * sizeof *made);
    if (!made) arena_out_of_memory();
    arena_recovery recovery; /* an insertion out of memory frees the table, then fails the pass */
    if (arena_recovery_enter(&recovery, setjmp(recovery.where))) {
        free(made);
        arena_out_of_memory();
    }
    uint32_t count = 0;
    for (uint32_t i = 0; i < m->op_count; i++) {
        if (m->ops[i].dead || m->ops[i].kind != IR_OP_MATMUL || !wants_codes(m, i)) continue;
        uint32_t q = IR_NONE;
        for (uint32_t k = 0; k < count && q == IR_NONE; k++)
            if (same_coding(m, m->values[made[k]].def_op, i)) q = m->values[made[k]].def_op;
        if (q == IR_NONE) {
            q = insert_quantize(m, i, i);
            made[count++] = m->ops[q].results[0];
            i++; /* the matmul moved one op on */
        }
        ir_op *matmul = &m->ops[i];
        ir_value_id *operands = arena_array(&m->arena, matmul->operand_count + 2, sizeof *operands);
        memcpy(operands, matmul->operands, matmul->operand_count * sizeof *operands);
        operands[matmul->operand_count] = m->ops[q].results[0];
        operands[matmul->operand_count + 1] = m->ops[q].results[1];
        matmul->operands = operands;
        matmul->operand_count += 2;
        ir_op_set_bool(m, i, "act_codes", true);
    }
    arena_recovery_leave(&recovery);
    free(made);
    if (count) clear_lowering(m);
}
