/* lower.c - a lowered module becomes kernels, a launch program, a memory
 * plan and a weight table (see lower.h). In launch order, each kernel group
 * is emitted (codegen/emit.h) and becomes one GEMM or its kernels' launches;
 * buffers are where plan-memory put them. A group the wanted-rows pass
 * marked rows(wanted) becomes wanted-rows instructions (plan/program.h,
 * "Wanted rows"), each pointer into a row-indexed value with its row size.
 *
 * A fused group run op by op (above its fused kernel's token counts) runs a
 * norm and the quantize of its result as one kernel (emit_norm.c), and each
 * act_codes matmul as a guarded pair (plan/program.h, prog_instr.needs): a
 * scaled GEMM of the quantize's codes and the weight's codes and scales
 * (PROG_NEED_SCALED_GEMM), then the kernel that computes the same where the
 * device runs no scaled GEMM (PROG_NEED_NO_SCALED_GEMM: smelt's
 * dequantize-GEMM over the codes, or the GEMV over x where that does not
 * fit), both with the bias and residual adds after the matmul when the
 * dequantize-GEMM takes them.
 */
#include "lower.h"

#include "interface.h"
#include "quant.h"

#include <stdlib.h>
#include <string.h>

/* What a GEMM of a fused group's matmul takes from the ops after it in a
 * step that runs the group op by op: a bias add (a [N] weight, when the
 * matmul has none: cuBLASLt's bias epilogue) and a residual add (an operand
 * of the result's type and storage: cuBLASLt's C with beta = 1). `out` is
 * what the GEMM writes: the last of those adds' results, or the matmul's. */
typedef struct gemm_epilogue {
    ir_value_id bias, residual, out;
} gemm_epilogue;

typedef struct lowering_state {
    const ir_module *m;
    cg_lowered *out;
    diag_engine *d;
    uint32_t step_count;
    cg_group *groups;             /* [step_count] by launch step */
    cg_group_lowering *lowerings; /* [step_count] */
    uint32_t *state_base;         /* [step_count] first state buffer of the group */
    cg_group_lowering **unfused;  /* [step_count + 1] a fused group's ops one by one (its op_count
                                     lowerings), run above its fused_max_tokens; NULL: none */
    gemm_epilogue **epilogues;    /* [step_count + 1] beside unfused: each matmul's GEMM epilogue */
    uint32_t kernel_capacity;     /* of out->kernels */
    bool greedy;                  /* groups[step_count] is the greedy kernel (cg_emit_greedy) */
} lowering_state;

/* ---- the lowered module, as the passes left it ---------------------------- */

static bool check_lowered(const ir_module *m, diag_engine *d) {
    bool scheduled = true;
    for (uint32_t i = 0; i < m->op_count && scheduled; i++)
        if (ir_op_launches(m, i)) scheduled = m->ops[i].group != IR_NONE && m->ops[i].step != IR_NONE;
    if (m->precision && m->planned_tokens > 0 && scheduled) return true;
    diag_error(
        d, SMELT_NO_LOC,
        "codegen renders a lowered module: run the passes precision, fuse, schedule and plan-memory first "
        "(the module lacks %s)",
        !m->precision ? "storage dtypes"
        : !scheduled  ? "kernel groups or launch steps"
                      : "a memory plan");
    return false;
}

/* The groups by step, each with its ops, inputs and outputs. */
static bool collect_groups(lowering_state *s) {
    const ir_module *m = s->m;
    arena *a = &s->out->arena;
    for (uint32_t i = 0; i < m->op_count; i++)
        if (!m->ops[i].dead && m->ops[i].step != IR_NONE && m->ops[i].step >= s->step_count)
            s->step_count = m->ops[i].step + 1;
    uint32_t n = s->step_count ? s->step_count : 1;
    /* One more slot after the steps: the greedy kernel (emit_groups). */
    s->groups = arena_array(a, n + 1, sizeof *s->groups);
    /* All in the lowering's arena, so that out of memory leaks nothing (arena.h). */
    s->lowerings = arena_array(a, n + 1, sizeof *s->lowerings);
    s->state_base = arena_array(a, n + 1, sizeof *s->state_base);
    uint32_t *group_of_value = arena_array(a, m->value_count ? m->value_count : 1, sizeof *group_of_value);
    uint32_t *reads =
        arena_array(a, m->value_count ? m->value_count : 1, sizeof *reads); /* readers outside */
    ir_value_id *roots = ir_view_roots(m);
    if (!roots) arena_out_of_memory();
    for (ir_value_id v = 0; v < m->value_count; v++)
        group_of_value[v] = IR_NONE;
    for (uint32_t i = 0; i < m->op_count; i++) {
        const ir_op *op = &m->ops[i];
        if (op->dead) continue;
        if (op->step != IR_NONE) s->groups[op->step].op_count++;
        for (uint32_t r = 0; r < op->result_count; r++)
            group_of_value[op->results[r]] = op->group;
    }
    /* A view (reshape) is its root's buffer: of the root's group, and read
     * where its readers read it. */
    for (ir_value_id v = 0; v < m->value_count; v++)
        group_of_value[v] = group_of_value[roots[v]];
    for (uint32_t i = 0; i < m->op_count; i++) {
        const ir_op *op = &m->ops[i];
        if (op->dead || (ir_op_info_of(op->kind)->flags & IR_OPF_VIEW)) continue;
        for (uint32_t j = 0; j < op->operand_count; j++)
            if (op->group == IR_NONE || group_of_value[op->operands[j]] != op->group) {
                reads[op->operands[j]]++;
                reads[roots[op->operands[j]]]++;
            }
    }
    free(roots);
    uint32_t **ops = arena_array(a, n, sizeof *ops); /* each group's ops, filled below */
    for (uint32_t g = 0; g < s->step_count; g++) {
        cg_group *group = &s->groups[g];
        ops[g] = arena_array(a, group->op_count ? group->op_count : 1, sizeof *ops[g]);
        group->ops = ops[g];
        group->op_count = 0;
    }
    for (uint32_t i = 0; i < m->op_count; i++) {
        const ir_op *op = &m->ops[i];
        if (op->dead || op->step == IR_NONE) continue;
        cg_group *group = &s->groups[op->step];
        group->id = op->group;
        ops[op->step][group->op_count++] = i;
    }
    for (uint32_t g = 0; g < s->step_count; g++) {
        cg_group *group = &s->groups[g];
        uint32_t inputs = 0, outputs = 0;
        for (uint32_t k = 0; k < group->op_count; k++) {
            const ir_op *op = &m->ops[group->ops[k]];
            inputs += op->operand_count;
            outputs += op->result_count;
        }
        ir_value_id *in = arena_array(a, inputs ? inputs : 1, sizeof *in);
        ir_value_id *out = arena_array(a, outputs ? outputs : 1, sizeof *out);
        for (uint32_t k = 0; k < group->op_count; k++) {
            const ir_op *op = &m->ops[group->ops[k]];
            for (uint32_t j = 0; j < op->operand_count; j++) {
                ir_value_id v = op->operands[j];
                bool seen = group_of_value[v] == group->id;
                for (uint32_t q = 0; q < group->input_count && !seen; q++)
                    seen = in[q] == v;
                if (!seen) in[group->input_count++] = v;
            }
            for (uint32_t r = 0; r < op->result_count; r++)
                if (reads[op->results[r]] > 0 || group->op_count == 1)
                    out[group->output_count++] = op->results[r];
        }
        group->inputs = in;
        group->outputs = out;
    }
    return true;
}

/* ---- kernels -------------------------------------------------------------- */

/* One entry per distinct kernel: identical layers give one name and one
 * source. A name ends in a hash of its source (codegen/emit.c,
 * name_by_source), so one name with two sources is a broken invariant (or a
 * 32-bit hash collision, which we would rather see than miscompile). */
static uint32_t add_kernel(lowering_state *s, const cg_kernel *k) {
    cg_lowered *l = s->out;
    for (uint32_t i = 0; i < l->kernel_count; i++) {
        if (strcmp(l->kernels[i].name, k->name) != 0) continue;
        if (strcmp(l->kernels[i].source, k->source) != 0)
            SMELT_DIE("two kernels named '%s' with different sources", k->name);
        return i;
    }
    if (l->kernel_count == s->kernel_capacity) {
        uint32_t grown = s->kernel_capacity ? s->kernel_capacity * 2 : 16;
        l->kernels = arena_grow(&l->arena, l->kernels, l->kernel_count, grown, sizeof *l->kernels);
        s->kernel_capacity = grown;
    }
    l->kernels[l->kernel_count] = *k;
    return l->kernel_count++;
}

/* A fused group's ops, each as it runs alone: what a step of more tokens than
 * the fused kernel is made for runs (the buffers of the group's inner values
 * are planned, plan-memory). A group over a concatenated weight runs the ops
 * up to its matmul so, the matmul as one GEMM, and the ops after it as one
 * kernel over the GEMM's output (cg_emit_gemm_epilogue), the lowering of the
 * op after the matmul; the rest lower to nothing. */
static bool is_group_output(const cg_group *g, ir_value_id v) {
    for (uint32_t i = 0; i < g->output_count; i++)
        if (g->outputs[i] == v) return true;
    return false;
}

/* The epilogue the GEMM of the matmul at position i of group g takes; the
 * ops it takes lower to nothing (*taken: how many after i). */
static gemm_epilogue find_gemm_epilogue(const lowering_state *s, const cg_group *g, uint32_t i,
                                        uint32_t *taken) {
    const ir_module *m = s->m;
    const ir_op *matmul = &m->ops[g->ops[i]];
    gemm_epilogue ep = {IR_NO_VALUE, IR_NO_VALUE, matmul->results[0]};
    *taken = 0;
    smelt_dtype storage = cg_storage_dtype(m, ep.out);
    for (uint32_t j = i + 1; j < g->op_count && j <= i + 2; j++) {
        const ir_op *add = &m->ops[g->ops[j]];
        if (add->kind != IR_OP_ADD || is_group_output(g, ep.out) ||
            cg_storage_dtype(m, add->results[0]) != storage ||
            !ir_type_equal(&m->values[add->results[0]].type, &m->values[ep.out].type))
            break;
        ir_value_id other = add->operands[0] == ep.out ? add->operands[1] : add->operands[0];
        if (other == ep.out || (add->operands[0] != ep.out && add->operands[1] != ep.out)) break;
        const ir_type *t = &m->values[other].type;
        bool weight = m->ops[m->values[other].def_op].kind == IR_OP_WEIGHT && t->rank == 1;
        if (weight && ep.bias == IR_NO_VALUE && ep.residual == IR_NO_VALUE &&
            ir_matmul_bias(m, g->ops[i]) == IR_NO_VALUE)
            ep.bias = other;
        else if (!weight && ep.residual == IR_NO_VALUE && ir_type_equal(t, &m->values[ep.out].type) &&
                 cg_storage_dtype(m, other) == storage)
            ep.residual = other;
        else
            break;
        ep.out = add->results[0];
        ++*taken;
    }
    return ep;
}

/* The position (after i) of the quantize of the result of the norm at
 * position i of group g, or UINT32_MAX when op i is no norm or none reads it. */
static uint32_t quantize_of_norm(const lowering_state *s, const cg_group *g, uint32_t i) {
    const ir_op *norm = &s->m->ops[g->ops[i]];
    if (norm->kind != IR_OP_RMS_NORM && norm->kind != IR_OP_LAYER_NORM) return UINT32_MAX;
    for (uint32_t j = i + 1; j < g->op_count; j++) {
        const ir_op *q = &s->m->ops[g->ops[j]];
        if (q->kind == IR_OP_QUANTIZE && q->operands[0] == norm->results[0]) return j;
    }
    return UINT32_MAX;
}

/* The norm at position i and the quantize of its result at position j as
 * one kernel (quantization in the norm's epilogue, emit_norm.c): it writes
 * the norm's output and the codes and scales. */
static bool emit_norm_quantize(lowering_state *s, const cg_group *group, uint32_t i, uint32_t j,
                               cg_group_lowering *out) {
    const ir_module *m = s->m;
    uint32_t *ops = arena_array(&s->out->arena, 2, sizeof *ops);
    ops[0] = group->ops[i];
    ops[1] = group->ops[j];
    const ir_op *norm = &m->ops[ops[0]], *quantize = &m->ops[ops[1]];
    ir_value_id *outputs = arena_array(&s->out->arena, 3, sizeof *outputs);
    outputs[0] = norm->results[0];
    outputs[1] = quantize->results[0];
    outputs[2] = quantize->results[1];
    cg_group pair = {.id = group->id,
                     .op_count = 2,
                     .ops = ops,
                     .input_count = norm->operand_count,
                     .inputs = norm->operands,
                     .output_count = 3,
                     .outputs = outputs};
    return cg_emit_group(m, &pair, &s->out->arena, out, s->d);
}

static bool emit_unfused(lowering_state *s, uint32_t g) {
    const cg_group *group = &s->groups[g];
    s->unfused[g] = arena_array(&s->out->arena, group->op_count, sizeof *s->unfused[g]);
    memset(s->unfused[g], 0, group->op_count * sizeof *s->unfused[g]);
    s->epilogues[g] = arena_array(&s->out->arena, group->op_count, sizeof *s->epilogues[g]);
    /* the quantizes that their norm's kernel does (their lowering: none) */
    bool *in_norm = arena_array(&s->out->arena, group->op_count, sizeof *in_norm);
    memset(in_norm, 0, group->op_count * sizeof *in_norm);
    uint32_t concat = cg_group_concat_matmul(s->m, group), epilogue = UINT32_MAX, skip = 0;
    bool ok = true;
    for (uint32_t i = 0; i < group->op_count && ok; i++) {
        if (epilogue != UINT32_MAX) continue; /* in the epilogue kernel */
        if (skip > 0) {                       /* in the GEMM's epilogue */
            skip--;
            continue;
        }
        if (in_norm[i]) continue;
        uint32_t quantize = quantize_of_norm(s, group, i);
        s->epilogues[g][i] = (gemm_epilogue){IR_NO_VALUE, IR_NO_VALUE, s->m->ops[group->ops[i]].results[0]};
        if (quantize != UINT32_MAX) {
            in_norm[quantize] = true;
            ok = emit_norm_quantize(s, group, i, quantize, &s->unfused[g][i]);
            continue; /* a norm's kernel keeps no state */
        }
        ok = cg_emit_op(s->m, group->ops[i], &s->out->arena, &s->unfused[g][i], s->d);
        if (ok && s->unfused[g][i].kind == CG_LOWER_KERNELS && cg_dequant_gemm_fits(s->m, group->ops[i])) {
            /* a quantized matmul's dequantize-GEMM takes the bias and residual adds after it too (and
             * so does the scaled GEMM of an act_codes matmul beside it) */
            uint32_t taken;
            gemm_epilogue ep = find_gemm_epilogue(s, group, i, &taken);
            if (taken > 0) {
                ok = cg_emit_dequant_gemm_epilogue(s->m, &group->ops[i], 1 + taken, &s->out->arena,
                                                   &s->unfused[g][i], s->d);
                skip = taken;
                s->epilogues[g][i] = ep;
            }
        }
        if (ok && s->unfused[g][i].kind == CG_LOWER_GEMM && group->ops[i] != concat)
            s->epilogues[g][i] = find_gemm_epilogue(s, group, i, &skip);
        else if (ok && s->unfused[g][i].kind == CG_LOWER_GEMM)
            s->epilogues[g][i] =
                (gemm_epilogue){IR_NO_VALUE, IR_NO_VALUE, s->m->ops[group->ops[i]].results[0]};
        if (ok && group->ops[i] == concat && i + 1 < group->op_count) {
            epilogue = i + 1;
            ok = cg_emit_gemm_epilogue(s->m, group, &s->out->arena, &s->unfused[g][epilogue], s->d);
        }
        if (ok && s->unfused[g][i].state_count > 0)
            SMELT_DIE("op %u of fused group %u keeps state", group->ops[i], group->id);
    }
    return ok;
}

static bool emit_groups(lowering_state *s) {
    bool ok = true;
    uint32_t states = 0;
    /* One slot per step and the greedy kernel's; NULL: no unfused ops. */
    s->unfused = arena_array(&s->out->arena, s->step_count + 1, sizeof *s->unfused);
    memset(s->unfused, 0, (s->step_count + 1) * sizeof *s->unfused);
    s->epilogues = arena_array(&s->out->arena, s->step_count + 1, sizeof *s->epilogues);
    for (uint32_t g = 0; g < s->step_count && !diag_should_stop(s->d); g++) {
        if (!cg_emit_group(s->m, &s->groups[g], &s->out->arena, &s->lowerings[g], s->d)) {
            ok = false;
            continue;
        }
        int64_t fused = s->lowerings[g].fused_max_tokens;
        if (fused > 0 && fused < s->m->planned_tokens && !emit_unfused(s, g)) {
            ok = false;
            continue;
        }
        s->state_base[g] = states;
        states += s->lowerings[g].state_count;
    }
    /* After the last step, the greedy kernel over the logits (bind_interface
     * found the output), run only on steps that ask for the token. */
    uint32_t logits_op = ir_role_op(s->m, IR_ROLE_LOGITS), g = s->step_count;
    if (ok && logits_op != IR_NONE) {
        uint32_t *op = arena_array(&s->out->arena, 1, sizeof *op);
        *op = logits_op;
        s->groups[g] = (cg_group){.id = IR_NONE, .op_count = 1, .ops = op};
        ok = cg_emit_greedy(s->m, logits_op, &s->out->arena, &s->lowerings[g], s->d);
        s->greedy = ok;
        s->state_base[g] = states;
        states += ok ? s->lowerings[g].state_count : 0;
    }
    s->out->program.state_count = states;
    return ok;
}

/* ---- the program ---------------------------------------------------------- */

/* Where value v lives, as the program names it. */
static bool value_ref(const lowering_state *s, ir_value_id v, prog_ref *ref) {
    const ir_buffer *b = &s->m->values[v].buffer;
    if (b->kind == IR_BUFFER_WEIGHT) {
        *ref = (prog_ref){PROG_BUFFER_WEIGHT, (uint32_t)b->offset, 0};
        return true;
    }
    if (b->kind != IR_BUFFER_ARENA) return false;
    *ref = (prog_ref){PROG_BUFFER_ARENA, 0, b->offset};
    return true;
}

static prog_affine rows_of(int32_t token_symbol, const ir_type *t) {
    int64_t rows = 1;
    bool tokens = false;
    for (unsigned i = 0; i + 1 < t->rank; i++) {
        if (t->dims[i].symbol == token_symbol)
            tokens = true;
        else
            rows *= t->dims[i].size;
    }
    return tokens ? (prog_affine){rows, 0, 1} : (prog_affine){0, rows, 1};
}

/* An act_codes matmul's GEMM (ir/ops.def; plan/program.h, "Scaled GEMM"):
 * A is the quantize's codes with its f32 scale per row, B the weight's codes
 * (per output channel, of the codes' kind) with its f16 scales, which lie
 * inside the weight at quant/quant.h's offset. */
static bool scale_gemm(lowering_state *s, uint32_t i, prog_gemm *g) {
    const ir_module *m = s->m;
    const ir_op *op = &m->ops[i];
    ir_value_id codes, scales, w = op->operands[1];
    ir_matmul_act_codes(m, i, &codes, &scales);
    quant_format f;
    quant_layout l;
    const ir_type *wt = &m->values[w].type;
    smelt_dtype codes_dtype = cg_storage_dtype(m, codes);
    if (!ir_weight_quant(m, m->values[w].def_op, &f) || wt->rank != 2 ||
        quant_layout_of(&f, (uint64_t)wt->dims[0].size, (uint64_t)wt->dims[1].size, &l) ||
        (f.kind != QUANT_FP8 && f.kind != QUANT_INT8) || f.group != (uint32_t)wt->dims[1].size ||
        f.has_zero || f.has_column_scale || f.has_group_index ||
        codes_dtype != (f.kind == QUANT_FP8 ? SMELT_DTYPE_F8E4M3 : SMELT_DTYPE_I8) || !g->b_transposed) {
        diag_error(
            s->d, op->loc,
            "matmul: act_codes needs an out_in weight of codes of the activations' kind with one scale "
            "per output channel (no zero points, column scales or act-order)");
        return false;
    }
    g->has_scales = true;
    g->dtype_a = codes_dtype;
    g->dtype_b_scale = SMELT_DTYPE_F16;
    bool ok = value_ref(s, codes, &g->a) && value_ref(s, scales, &g->a_scale) && value_ref(s, w, &g->b_scale);
    g->b_scale.offset += l.scales;
    if (!ok) diag_error(s->d, op->loc, "matmul: the codes or scales of its input have no buffer");
    return ok;
}

/* The GEMM of matmul i, with its epilogue (NULL: none; the matmul's own
 * bias operand is the bias either way). An act_codes matmul's is a scaled
 * GEMM of the codes (scale_gemm). */
static bool build_gemm(lowering_state *s, uint32_t i, const gemm_epilogue *ep, prog_instr *instr) {
    const ir_module *m = s->m;
    const ir_op *op = &m->ops[i];
    prog_gemm *g = &instr->as.gemm;
    instr->wanted_rows = op->wanted_rows;
    const ir_type *x = &m->values[op->operands[0]].type;
    const ir_type *y = &m->values[op->results[0]].type;
    ir_value_id out = ep ? ep->out : op->results[0];
    ir_value_id bias = ir_matmul_bias(m, i) != IR_NO_VALUE ? ir_matmul_bias(m, i)
                       : ep                                ? ep->bias
                                                           : IR_NO_VALUE;
    instr->op = PROG_OP_GEMM;
    g->m = rows_of(ir_token_symbol(m), x);
    g->k = x->dims[x->rank - 1].size;
    g->n = y->dims[y->rank - 1].size;
    g->b_transposed = strcmp(ir_op_string(m, i, "layout"), "out_in") == 0;
    g->has_bias = bias != IR_NO_VALUE;
    g->has_residual = ep && ep->residual != IR_NO_VALUE;
    g->dtype_a = cg_storage_dtype(m, op->operands[0]);
    g->dtype_b = cg_storage_dtype(m, op->operands[1]);
    g->dtype_c = cg_storage_dtype(m, out);
    bool ok = value_ref(s, op->operands[0], &g->a) && value_ref(s, op->operands[1], &g->b) &&
              value_ref(s, out, &g->c);
    if (g->has_bias) {
        g->dtype_bias = cg_storage_dtype(m, bias);
        ok = ok && value_ref(s, bias, &g->bias);
    }
    if (g->has_residual) ok = ok && value_ref(s, ep->residual, &g->residual);
    if (!ok)
        diag_error(s->d, op->loc, "matmul: an operand has no buffer (a constant cannot be a matmul operand)");
    ir_value_id codes, scales;
    return ok && (!ir_matmul_act_codes(m, i, &codes, &scales) || scale_gemm(s, i, g));
}

/* Bytes of one token row of value v when dim 0 is the tokens (a
 * wanted-rows launch moves its pointer by that per row), else 0. */
static uint64_t row_bytes_of(const ir_module *m, ir_value_id v) {
    const ir_type *t = &m->values[v].type;
    int32_t tokens = ir_token_symbol(m);
    uint64_t bytes = 0;
    if (t->rank == 0 || t->dims[0].symbol != tokens || !ir_type_bytes(m, t, tokens, 1, &bytes)) return 0;
    return bytes;
}

static bool build_launch(lowering_state *s, uint32_t g, const cg_kernel *k, prog_instr *instr) {
    prog_launch *launch = &instr->as.launch;
    instr->wanted_rows = s->m->ops[s->groups[g].ops[0]].wanted_rows;
    instr->op = PROG_OP_LAUNCH;
    instr->needs = k->fallback ? PROG_NEED_NO_SCALED_GEMM : PROG_NEED_NONE; /* a scaled GEMM's fallback */
    launch->kernel = add_kernel(s, k);
    instr->min_tokens = k->min_tokens;
    instr->max_tokens = k->max_tokens;
    launch->rule = k->rule;
    launch->arg_count = k->param_count;
    for (uint32_t p = 0; p < k->param_count; p++) {
        const cg_param *param = &k->params[p];
        prog_arg *arg = &launch->args[p];
        switch (param->kind) {
        case CG_PARAM_TOKENS: arg->kind = PROG_ARG_TOKENS; break;
        case CG_PARAM_OP_STATE: {
            uint32_t step = s->m->ops[param->op].step;
            if (step >= s->step_count || param->state >= s->lowerings[step].state_count)
                SMELT_DIE("%s: op %u has no state %u", k->name, param->op, param->state);
            arg->kind = PROG_ARG_POINTER;
            arg->ref = (prog_ref){PROG_BUFFER_STATE, s->state_base[step] + param->state, 0};
            arg->extent = (prog_affine){0, (int64_t)s->lowerings[step].state_bytes[param->state], 1};
            arg->writes = param->writes;
            break;
        }
        case CG_PARAM_STATE:
            arg->kind = PROG_ARG_POINTER;
            arg->ref = (prog_ref){PROG_BUFFER_STATE, s->state_base[g] + param->state, 0};
            /* A state is the kernel's own: it may touch all of it. */
            arg->extent = (prog_affine){0, (int64_t)s->lowerings[g].state_bytes[param->state], 1};
            arg->writes = param->writes;
            break;
        case CG_PARAM_VALUE:
            arg->kind = PROG_ARG_POINTER;
            arg->extent = param->extent;
            arg->writes = param->writes;
            arg->row_bytes = instr->wanted_rows ? row_bytes_of(s->m, param->value) : 0;
            if (!value_ref(s, param->value, &arg->ref)) {
                diag_error(s->d, s->m->ops[s->groups[g].ops[0]].loc, "%s: operand %%%u has no buffer",
                           k->name, param->value);
                return false;
            }
            break;
        }
    }
    return true;
}

/* The entry of a weight concat (ir_op_is_weight_concat): its parts by
 * their names, and a name of its own, the parts' joined by " + " (or the
 * first's and a count, were that too long for a plan). */
static void concat_parts(lowering_state *s, uint32_t i, prog_weight *w) {
    const ir_module *m = s->m;
    const ir_op *op = &m->ops[i];
    if (op->operand_count > PROG_MAX_WEIGHT_PARTS)
        SMELT_DIE("a weight concat of %u parts (fuse makes at most %d)", op->operand_count,
                  PROG_MAX_WEIGHT_PARTS);
    w->part_count = op->operand_count;
    w->parts = arena_array(&s->out->arena, op->operand_count, sizeof *w->parts);
    const char *name = "";
    for (uint32_t k = 0; k < op->operand_count; k++) {
        ir_value_id part = op->operands[k];
        w->parts[k].name = ir_op_string(m, m->values[part].def_op, "name");
        w->parts[k].rows = m->values[part].type.dims[0].size;
        name = arena_printf(&s->out->arena, "%s%s%s", name, k ? " + " : "", w->parts[k].name);
    }
    if (strlen(name) > 4096)
        name = arena_printf(&s->out->arena, "%s + %u more", w->parts[0].name, op->operand_count - 1);
    w->name = name;
}

static bool build_weight_table(lowering_state *s) {
    const ir_module *m = s->m;
    program *p = &s->out->program;
    for (uint32_t i = 0; i < m->op_count; i++)
        if (!m->ops[i].dead && m->ops[i].result_count == 1 &&
            m->values[m->ops[i].results[0]].buffer.kind == IR_BUFFER_WEIGHT)
            p->weight_count++;
    p->weights = arena_array(&s->out->arena, p->weight_count ? p->weight_count : 1, sizeof *p->weights);
    bool ok = true;
    for (uint32_t i = 0; i < m->op_count; i++) {
        const ir_op *op = &m->ops[i];
        if (op->dead || op->result_count != 1) continue;
        const ir_value *value = &m->values[op->results[0]];
        if (value->buffer.kind != IR_BUFFER_WEIGHT) continue;
        if (value->buffer.offset >= p->weight_count ||
            (op->kind != IR_OP_WEIGHT && !ir_op_is_weight_concat(m, i)))
            SMELT_DIE("op %u has a weight buffer but is no weight-table entry", i);
        prog_weight *w = &p->weights[value->buffer.offset];
        if (op->kind == IR_OP_WEIGHT) {
            w->name = ir_op_string(m, i, "name");
            w->stacked = ir_op_string(m, i, "stack")[0] != '\0';
            w->transposed = ir_op_bool(m, i, "transposed");
        } else {
            concat_parts(s, i, w);
        }
        w->dtype = cg_storage_dtype(m, op->results[0]);
        w->rank = value->type.rank;
        for (unsigned d = 0; d < value->type.rank; d++)
            w->shape[d] = value->type.dims[d].size;
        quant_format f;
        if (ir_weight_quant(m, i, &f)) w->quant = quant_format_to_program(&f);
        if (!ir_value_bytes(m, op->results[0], -1, 0, &w->bytes)) {
            diag_error(s->d, op->loc, "weight '%.*s%s' has no size in bytes", DIAG_NAME(w->name));
            ok = false;
        }
        w->data_offset = UINT64_MAX;
    }
    return ok;
}

/* The emitter's own model, or each byte of each argument once plus the
 * flops the emitter declares. */
static prog_cost kernel_cost(const program *p, const cg_kernel *k, const prog_launch *l) {
    if (k->cost) return *k->cost;
    prog_cost cost = program_launch_cost(p, l);
    cost.flops = prog_poly_sum(cost.flops, k->flops);
    cost.tensor_cores = cost.tensor_cores || k->tensor_cores;
    return cost;
}

_Static_assert(IR_GEMV_CHOICE_MAX_TOKENS - IR_GEMV_MAX_TOKENS <= PROG_CHOICE_MAX_TOKENS,
               "a choice's range fits the program's");

/* What side `side` of choice `choice` (1-based) does in a step of `tokens`
 * tokens: the instructions [from, to) of that side that run, their bytes
 * (at context 0: a GEMV group touches no cached rows but its own) and flops
 * as their costs say, the fused GEMV's weights once more for every 4-token
 * tile past the first (emit_gemv.c loops over tiles of TOKEN_TILE tokens).
 * The output head's groups are modeled at T rows too, though a step that
 * wants the last row runs either side at one. Of an act_codes matmul's
 * guarded pair (a scaled GEMM and its fallback kernel, prog_instr.needs)
 * only the scaled GEMM counts: the two never run in one step, and the
 * choice is made for the devices that run the GEMM (a device without it
 * runs the fallback on the side the model picked for it). */

static prog_choice_cost choice_cost(const program *p, uint32_t from, uint32_t to, uint32_t choice, int side,
                                    int64_t tokens) {
    prog_choice_cost cost = {0};
    for (uint32_t i = from; i < to; i++) {
        const prog_instr *in = &p->instrs[i];
        if (in->choice != choice || in->side != side || !prog_instr_runs(in, tokens)) continue;
        if (in->needs == PROG_NEED_NO_SCALED_GEMM) continue; /* the scaled GEMM beside it is counted */
        cost.launches++;
        cost.bytes += prog_poly_eval(in->cost.read, (double)tokens, 0) +
                      prog_poly_eval(in->cost.written, (double)tokens, 0);
        cost.flops += prog_poly_eval(in->cost.flops, (double)tokens, 0);
        cost.tensor_cores |= in->cost.tensor_cores;
        int64_t tiles = (tokens + IR_GEMV_MAX_TOKENS - 1) / IR_GEMV_MAX_TOKENS;
        for (uint32_t a = 0; side == 0 && in->op == PROG_OP_LAUNCH && a < in->as.launch.arg_count; a++) {
            const prog_arg *arg = &in->as.launch.args[a];
            if (arg->kind == PROG_ARG_POINTER && arg->ref.buffer == PROG_BUFFER_WEIGHT)
                cost.bytes += (double)(tiles - 1) * (double)prog_affine_eval(arg->extent, tokens);
        }
    }
    return cost;
}

/* A fused GEMV group whose ops also run one by one (in steps above its
 * bound) gets both lowerings in the steps of bound + 1 ..
 * IR_GEMV_CHOICE_MAX_TOKENS tokens: a choice (program.h, "Choices") over
 * instructions [from, to), its sides' modeled costs per token count. */
static void add_choice(lowering_state *s, uint32_t from, uint32_t to, int64_t bound, int64_t last) {
    program *p = &s->out->program;
    prog_choice *c = &p->choices[p->choice_count++];
    c->min_tokens = bound + 1;
    c->max_tokens = last;
    for (uint32_t i = from; i < to; i++)
        p->instrs[i].choice = p->choice_count;
    for (int side = 0; side < 2; side++)
        for (int64_t t = c->min_tokens; t <= c->max_tokens; t++)
            c->cost[side][t - c->min_tokens] = choice_cost(p, from, to, p->choice_count, side, t);
}

/* A kernel of an op run alone above a fused group's bound that serves only
 * steps at or below it (a quantized matmul's GEMV, whose dequantize-GEMM
 * takes the larger steps): left out of the program. */
static bool serves_none_above(const cg_kernel *k, int64_t bound) {
    return k->max_tokens != 0 && k->max_tokens <= bound;
}

/* The scaled GEMM of an act_codes matmul `op` whose lowering `l` has its
 * fallback kernels (cg_group_lowering.scaled_gemm), before them: it runs
 * where the device runs scaled GEMMs, they where it does not, in the same
 * steps, and both write the same output (ep's: the bias and residual adds
 * the fallback takes, or none). */
static bool add_scaled_gemm(lowering_state *s, uint32_t op, const gemm_epilogue *ep,
                            const cg_group_lowering *l) {
    program *p = &s->out->program;
    prog_instr *instr = &p->instrs[p->instr_count++];
    instr->ir_op = op;
    bool ok = build_gemm(s, op, ep, instr);
    instr->needs = PROG_NEED_SCALED_GEMM;
    instr->min_tokens = l->scaled_gemm_min_tokens;
    instr->cost = program_gemm_cost(&instr->as.gemm);
    return ok;
}

static bool build_program(lowering_state *s) {
    const ir_module *m = s->m;
    cg_lowered *l = s->out;
    program *p = &l->program;
    uint32_t count = 0, groups = s->step_count + (s->greedy ? 1 : 0);
    for (uint32_t g = 0; g < groups; g++) {
        count += s->lowerings[g].kind == CG_LOWER_GEMM ? 1 : s->lowerings[g].kernel_count;
        count += s->lowerings[g].scaled_gemm;
        for (uint32_t i = 0; s->unfused[g] && i < s->groups[g].op_count; i++)
            count += (s->unfused[g][i].kind == CG_LOWER_GEMM ? 1 : s->unfused[g][i].kernel_count) +
                     s->unfused[g][i].scaled_gemm;
    }
    p->instrs = arena_array(&l->arena, count ? count : 1, sizeof *p->instrs);
    p->choices = arena_array(&l->arena, groups ? groups : 1, sizeof *p->choices);
    p->state_bytes = arena_array(&l->arena, p->state_count ? p->state_count : 1, sizeof *p->state_bytes);
    p->state_rows = arena_array(&l->arena, p->state_count ? p->state_count : 1, sizeof *p->state_rows);
    /* Every state first: a launch's default cost reads the rows of states
     * that later groups own (a QKV GEMV writes attention's KV cache). */
    for (uint32_t g = 0; g < groups; g++)
        for (uint32_t st = 0; st < s->lowerings[g].state_count; st++) {
            p->state_bytes[s->state_base[g] + st] = s->lowerings[g].state_bytes[st];
            p->state_rows[s->state_base[g] + st] = s->lowerings[g].state_rows[st];
        }
    bool ok = true;
    for (uint32_t g = 0; g < groups; g++) {
        const cg_group_lowering *lo = &s->lowerings[g];
        uint32_t first = s->groups[g].ops[0];
        /* A fused group with its unfused ops: the fused kernels for T <= its
         * bound, the ops one by one above it. */
        int64_t bound = s->unfused[g] ? lo->fused_max_tokens : 0;
        /* ... and both in the steps up to `last`, where the runtime chooses. */
        int64_t last = bound > 0 && m->planned_tokens > bound
                           ? (m->planned_tokens < IR_GEMV_CHOICE_MAX_TOKENS ? m->planned_tokens
                                                                            : IR_GEMV_CHOICE_MAX_TOKENS)
                           : bound;
        uint32_t from = p->instr_count, group_from = from;
        if (lo->kind == CG_LOWER_GEMM) {
            prog_instr *instr = &p->instrs[p->instr_count++];
            instr->ir_op = first;
            ok = build_gemm(s, first, NULL, instr) && ok;
            instr->cost = program_gemm_cost(&instr->as.gemm);
        } else if (lo->kind == CG_LOWER_KERNELS) {
            if (lo->scaled_gemm) ok = add_scaled_gemm(s, first, NULL, lo) && ok;
            for (uint32_t k = 0; k < lo->kernel_count; k++) {
                prog_instr *instr = &p->instrs[p->instr_count++];
                instr->ir_op = first;
                ok = build_launch(s, g, &lo->kernels[k], instr) && ok;
                /* The emitter's own model, or each byte of each argument once. */
                instr->cost = kernel_cost(p, &lo->kernels[k], &instr->as.launch);
            }
        }
        for (uint32_t i = from; i < p->instr_count && s->unfused[g]; i++)
            p->instrs[i].max_tokens = last;
        for (uint32_t i = 0; s->unfused[g] && i < s->groups[g].op_count; i++) {
            const cg_group_lowering *one = &s->unfused[g][i];
            uint32_t op = s->groups[g].ops[i];
            from = p->instr_count;
            if (one->kind == CG_LOWER_GEMM) {
                prog_instr *instr = &p->instrs[p->instr_count++];
                instr->ir_op = op;
                ok = build_gemm(s, op, &s->epilogues[g][i], instr) && ok;
                instr->cost = program_gemm_cost(&instr->as.gemm);
            }
            if (one->scaled_gemm) ok = add_scaled_gemm(s, op, &s->epilogues[g][i], one) && ok;
            for (uint32_t k = 0; one->kind == CG_LOWER_KERNELS && k < one->kernel_count; k++) {
                if (serves_none_above(&one->kernels[k], bound)) continue; /* a decode kernel of the op */
                prog_instr *instr = &p->instrs[p->instr_count++];
                instr->ir_op = op;
                ok = build_launch(s, g, &one->kernels[k], instr) && ok;
                instr->cost = kernel_cost(p, &one->kernels[k], &instr->as.launch);
            }
            for (uint32_t k = from; k < p->instr_count; k++) {
                if (p->instrs[k].min_tokens < bound + 1) p->instrs[k].min_tokens = bound + 1;
                p->instrs[k].side = 1;
            }
        }
        if (last > bound) add_choice(s, group_from, p->instr_count, bound, last);
    }
    if (s->greedy) {
        p->has_greedy = true;
        p->greedy_token = (prog_ref){PROG_BUFFER_STATE, s->state_base[s->step_count], 0};
    }
    /* Of a decode step (T = 1); the greedy launch runs only when asked; of
     * a guarded pair (a scaled GEMM and its fallback) one runs. */
    l->launches_per_step = 0;
    for (uint32_t i = 0; i + (s->greedy ? 1 : 0) < p->instr_count; i++)
        l->launches_per_step +=
            prog_instr_runs(&p->instrs[i], 1) && p->instrs[i].needs != PROG_NEED_NO_SCALED_GEMM;
    (void)m;
    return ok;
}

/* ---- the model interface --------------------------------------------------- */

/* Bounds the runtime checks before a step: positions below the shortest KV
 * cache, ids below the smallest embedding table that the ids index. */
static void find_input_bounds(const lowering_state *s, ir_value_id ids) {
    const ir_module *m = s->m;
    program *p = &s->out->program;
    for (uint32_t i = 0; i < m->op_count; i++) {
        const ir_op *op = &m->ops[i];
        if (op->dead) continue;
        if (op->kind == IR_OP_ATTENTION) {
            int64_t max_seq = ir_op_int(m, i, "max_seq");
            if (p->max_positions == 0 || max_seq < p->max_positions) p->max_positions = max_seq;
        } else if (op->kind == IR_OP_EMBEDDING && op->operands[1] == ids) {
            const ir_value *table = &m->values[op->operands[0]];
            int64_t rows = table->type.dims[0].size;
            if (p->id_bound == 0 || rows < p->id_bound) {
                p->id_bound = rows;
                p->id_table =
                    table->buffer.kind == IR_BUFFER_WEIGHT ? (uint32_t)table->buffer.offset : UINT32_MAX;
            }
        }
    }
}

/* A rope with dynamic NTK scaling has static frequencies only below its
 * max_position_embeddings (ir/rope.h): a plan whose KV caches hold more
 * positions than that is refused, rather than run with frequencies that
 * transformers would have rescaled. */
static bool check_dynamic_rope(const lowering_state *s) {
    const ir_module *m = s->m;
    int64_t positions = s->out->program.max_positions;
    bool ok = true;
    for (uint32_t i = 0; i < m->op_count; i++) {
        const ir_op *op = &m->ops[i];
        if (op->dead || op->kind != IR_OP_ROPE || strcmp(ir_op_string(m, i, "scaling"), "dynamic") != 0)
            continue;
        int64_t static_positions = ir_op_int(m, i, "max_position_embeddings");
        if (positions > static_positions) {
            diag_error(s->d, op->loc,
                       "rope: dynamic NTK scaling recomputes its frequencies past max_position_embeddings "
                       "(%lld), but the KV caches hold %lld positions; smelt compiles dynamic only for "
                       "contexts up to max_position_embeddings",
                       (long long)static_positions, (long long)positions);
            ok = false;
        }
    }
    return ok;
}

/* The roles every backend shares (ir/interface.h): ids and pos of shape
 * [tokens], logits with a constant last dim, stored as f32. */
static bool bind_interface(lowering_state *s) {
    const ir_module *m = s->m;
    program *p = &s->out->program;
    ir_value_id ids = ir_role_value(m, IR_ROLE_IDS), pos = ir_role_value(m, IR_ROLE_POS);
    ir_value_id logits = ir_role_value(m, IR_ROLE_LOGITS);
    if (ids == IR_NO_VALUE || pos == IR_NO_VALUE || logits == IR_NO_VALUE) {
        diag_error(s->d, SMELT_NO_LOC,
                   "codegen needs inputs 'ids' and 'pos' and an output 'logits'; the model lacks %s",
                   ir_role_info_of(ids == IR_NO_VALUE   ? IR_ROLE_IDS
                                   : pos == IR_NO_VALUE ? IR_ROLE_POS
                                                        : IR_ROLE_LOGITS)
                       ->summary);
        return false;
    }
    uint32_t ids_op = ir_role_op(m, IR_ROLE_IDS), logits_op = ir_role_op(m, IR_ROLE_LOGITS);
    const ir_type *t = &m->values[ids].type;
    if (t->rank != 1 || t->dims[0].symbol < 0) {
        diag_error(s->d, m->ops[ids_op].loc, "input 'ids' must have the shape [tokens] with a symbolic dim");
        return false;
    }
    const ir_type *out = &m->values[logits].type;
    if (out->rank == 0 || out->dims[out->rank - 1].symbol >= 0) {
        diag_error(s->d, m->ops[logits_op].loc, "output 'logits' must have a constant last dim");
        return false;
    }
    p->vocab = (uint64_t)out->dims[out->rank - 1].size;
    find_input_bounds(s, ids);
    if (!check_dynamic_rope(s)) return false;
    if (!value_ref(s, ids, &p->input_ids) || !value_ref(s, pos, &p->input_pos) ||
        !value_ref(s, logits, &p->logits)) {
        diag_error(s->d, m->ops[logits_op].loc, "the model interface has a value without a buffer");
        return false;
    }
    if (out->dtype != SMELT_DTYPE_F32) {
        diag_error(s->d, m->ops[logits_op].loc, "output 'logits' must be stored as f32");
        return false;
    }
    return true;
}

bool cg_lower_module(const ir_module *m, cg_lowered *out, diag_engine *d) {
    memset(out, 0, sizeof *out);
    arena_init(&out->arena);
    if (!check_lowered(m, d)) return false;
    lowering_state s = {.m = m, .out = out, .d = d};
    out->program.format_version = PROGRAM_FORMAT_VERSION;
    out->program.max_tokens = m->planned_tokens;
    out->program.arena_bytes = m->arena_bytes;
    out->program.id_table = UINT32_MAX;
    return collect_groups(&s) && bind_interface(&s) && emit_groups(&s) && build_weight_table(&s) &&
           build_program(&s);
}

void cg_lowered_free(cg_lowered *l) {
    arena_free(&l->arena);
    memset(l, 0, sizeof *l);
}
