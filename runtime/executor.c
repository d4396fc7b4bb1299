/* executor.c - one step of a program on a device: inputs in, instructions in
 * order, logits out. See executor.h. */
#include "executor.h"

#include <stdlib.h>
#include <string.h>

/* $SMELT_NO_SCALED_GEMM set to anything but "" or "0": the fallback kernels. */
static bool scaled_gemms_forbidden(void) {
    const char *v = getenv("SMELT_NO_SCALED_GEMM");
    return v && *v && strcmp(v, "0") != 0;
}

/* Does the device run the scaled GEMMs of every code dtype p uses? False
 * when p has none (then no fallback kernel stands in for anything). */
static bool device_runs_scaled_gemms(const program *p, rt_device *device) {
    bool any = false, asked[2] = {false, false}; /* f8e4m3, i8 */
    for (uint32_t i = 0; i < p->instr_count; i++) {
        const prog_instr *in = &p->instrs[i];
        if (in->op != PROG_OP_GEMM || !in->as.gemm.has_scales) continue;
        int which = in->as.gemm.dtype_a == SMELT_DTYPE_I8;
        any = true;
        if (asked[which]) continue;
        asked[which] = true;
        if (!device->ops->runs_scaled_gemm ||
            !device->ops->runs_scaled_gemm(device, (smelt_dtype)in->as.gemm.dtype_a))
            return false;
    }
    return any && !scaled_gemms_forbidden();
}

/* A kernel argument's value: what args[i] points at. */
typedef union rt_arg_slot {
    void *address;
    int32_t value;
} rt_arg_slot;

smelt_status rt_executor_init(rt_executor *x, const program *p, rt_device *device, void *const *weights,
                              bool use_graphs, rt_error *e) {
    memset(x, 0, sizeof *x);
    x->program = p;
    x->device = device;
    x->weights = weights;
    const rt_device_ops *ops = device->ops;
    x->use_graphs = use_graphs && ops->capture_begin && ops->capture_end && ops->replay;
    x->scaled_gemms = device_runs_scaled_gemms(p, device);
    smelt_status s = ops->alloc(device, p->arena_bytes, &x->arena, e);
    if (s != SMELT_OK) return s;
    if (p->choice_count) {
        x->choice_sides = calloc(p->choice_count, PROG_CHOICE_MAX_TOKENS);
        if (!x->choice_sides) {
            rt_executor_free(x);
            return rt_fail(e, SMELT_ERROR_OUT_OF_MEMORY, "out of memory for %u choices", p->choice_count);
        }
        rt_executor_choose(x, 0);
    }
    if (p->state_count) {
        x->states = calloc(p->state_count, sizeof *x->states);
        if (!x->states) {
            rt_executor_free(x);
            return rt_fail(e, SMELT_ERROR_OUT_OF_MEMORY, "out of memory for %u state buffers",
                           p->state_count);
        }
    }
    for (uint32_t i = 0; i < p->state_count; i++) {
        if (p->state_bytes[i] == 0) continue;
        s = ops->alloc(device, p->state_bytes[i], &x->states[i], e);
        if (s != SMELT_OK) {
            rt_executor_free(x);
            return s;
        }
    }
    return SMELT_OK;
}

void rt_executor_free(rt_executor *x) {
    if (!x->device) return;
    const rt_device_ops *ops = x->device->ops;
    for (uint32_t i = 0; x->states && i < x->program->state_count; i++)
        ops->free(x->device, x->states[i]);
    free(x->states);
    free(x->choice_sides);
    ops->free(x->device, x->arena);
    memset(x, 0, sizeof *x);
}

void rt_executor_choose(rt_executor *x, int64_t gemv_max_tokens) {
    const program *p = x->program;
    const rt_device_ops *ops = x->device->ops;
    prog_device_figures figures;
    bool measured = gemv_max_tokens <= 0 && ops->figures && ops->figures(x->device, &figures);
    for (uint32_t i = 0; i < p->choice_count; i++) {
        const prog_choice *c = &p->choices[i];
        for (int64_t t = c->min_tokens; t <= c->max_tokens; t++) {
            int side = gemv_max_tokens > 0 ? t > gemv_max_tokens
                       : measured          ? program_choice_side(c, t, &figures)
                                           : 1;
            x->choice_sides[i * PROG_CHOICE_MAX_TOKENS + (t - c->min_tokens)] = (uint8_t)side;
        }
    }
    x->graph_ready = false; /* a captured step ran the sides of before */
}

/* Does instruction `in` run in a step of `tokens` tokens as far as its
 * choice goes (the side chosen at T; outside the choice's range its token
 * range decides)? */
static bool chosen(const rt_executor *x, const prog_instr *in, uint32_t tokens) {
    if (in->choice == 0) return true;
    const prog_choice *c = &x->program->choices[in->choice - 1];
    if (tokens < c->min_tokens || tokens > c->max_tokens) return true;
    return x->choice_sides[(in->choice - 1) * PROG_CHOICE_MAX_TOKENS + (tokens - c->min_tokens)] == in->side;
}

smelt_status rt_executor_reset(rt_executor *x, rt_error *e) {
    for (uint32_t i = 0; i < x->program->state_count; i++) {
        if (!x->states[i]) continue;
        smelt_status s = x->device->ops->zero(x->device, x->states[i], x->program->state_bytes[i], e);
        if (s != SMELT_OK) return s;
    }
    return SMELT_OK;
}

void rt_executor_invalidate_graph(rt_executor *x) { x->graph_ready = false; }

static void *resolve(const rt_executor *x, prog_ref r) {
    switch (r.buffer) {
    case PROG_BUFFER_WEIGHT: return rt_address_at(x->weights[r.index], r.offset);
    case PROG_BUFFER_STATE: return rt_address_at(x->states[r.index], r.offset);
    default: return rt_address_at(x->arena, r.offset);
    }
}

/* r moved on by `rows` rows of row_bytes each: a wanted-rows instruction's
 * pointer at the last row (program_decode bounded it inside r's region). */
static void *resolve_row(const rt_executor *x, prog_ref r, uint64_t row_bytes, uint64_t rows) {
    r.offset += row_bytes * rows;
    return resolve(x, r);
}

/* Prefixes a device's message with the instruction that failed. */
static smelt_status locate(const rt_executor *x, uint32_t index, smelt_status s, rt_error *e) {
    if (!e) return s;
    char device_message[RT_ERROR_MESSAGE_SIZE];
    memcpy(device_message, e->message, sizeof device_message);
    const prog_instr *in = &x->program->instrs[index];
    if (in->op == PROG_OP_LAUNCH)
        return rt_fail(e, s, "instruction %u (kernel %u, IR op %u): %s", index, in->as.launch.kernel,
                       in->ir_op, device_message);
    return rt_fail(e, s, "instruction %u (gemm, IR op %u): %s", index, in->ir_op, device_message);
}

/* Launch l at `tokens` tokens, each moving pointer `skipped` rows on (a
 * wanted-rows launch on a step that wants the last row; else 0). */
static smelt_status run_launch(rt_executor *x, uint32_t index, const prog_launch *l, uint32_t tokens,
                               uint32_t skipped, rt_error *e) {
    rt_launch_dims dims;
    for (int k = 0; k < 3; k++) {
        /* program_decode bounded every rule at max_tokens. */
        dims.grid[k] = (uint32_t)prog_affine_eval(l->rule.grid[k], tokens);
        dims.block[k] = l->rule.block[k];
    }
    dims.dynamic_shared_bytes = l->rule.dynamic_shared_bytes; /* the grid is not empty: prog_instr_runs */
    rt_arg_slot slots[PROG_MAX_ARGS];
    void *args[PROG_MAX_ARGS + 1] = {0}; /* NULL-terminated (device.h) */
    for (uint32_t a = 0; a < l->arg_count; a++) {
        const prog_arg *arg = &l->args[a];
        memset(&slots[a], 0, sizeof slots[a]);
        if (arg->kind == PROG_ARG_POINTER)
            slots[a].address = resolve_row(x, arg->ref, arg->row_bytes, skipped);
        else if (arg->kind == PROG_ARG_TOKENS)
            slots[a].value = (int32_t)tokens;
        else
            slots[a].value = (int32_t)arg->value;
        args[a] = &slots[a];
    }
    x->launches_last_step++;
    smelt_status s = x->device->ops->launch(x->device, l->kernel, &dims, args, e);
    if (s != SMELT_OK) return locate(x, index, s, e);
    return SMELT_OK;
}

/* The device's arguments of GEMM g at `tokens` rows, A, its scales, C and
 * the residual moved `skipped` rows on (as run_launch). */
static rt_gemm_args gemm_args(const rt_executor *x, const prog_gemm *g, int64_t tokens, uint64_t skipped) {
    uint64_t a_row = (uint64_t)g->k * smelt_dtype_element_bytes(g->dtype_a);
    uint64_t c_row = (uint64_t)g->n * smelt_dtype_element_bytes(g->dtype_c);
    return (rt_gemm_args){
        .m = prog_affine_eval(g->m, tokens),
        .n = g->n,
        .k = g->k,
        .dtype_a = (smelt_dtype)g->dtype_a,
        .dtype_b = (smelt_dtype)g->dtype_b,
        .dtype_c = (smelt_dtype)g->dtype_c,
        .dtype_bias = (smelt_dtype)g->dtype_bias,
        .b_transposed = g->b_transposed,
        .has_bias = g->has_bias,
        .a = resolve_row(x, g->a, a_row, skipped),
        .b = resolve(x, g->b),
        .c = resolve_row(x, g->c, c_row, skipped),
        .bias = g->has_bias ? resolve(x, g->bias) : NULL,
        .residual = g->has_residual ? resolve_row(x, g->residual, c_row, skipped) : NULL,
        .b_weight = g->b.buffer == PROG_BUFFER_WEIGHT ? g->b.index : RT_NOT_A_WEIGHT,
        .b_weight_offset = g->b.offset,
        .has_scales = g->has_scales,
        .a_scale = g->has_scales ? resolve_row(x, g->a_scale, sizeof(float), skipped) : NULL,
        .b_scale = g->has_scales ? resolve(x, g->b_scale) : NULL,
        .dtype_b_scale = (smelt_dtype)g->dtype_b_scale,
        .b_scale_offset = g->b_scale.offset, /* in weight b_weight (program_decode: the same one) */
    };
}

/* GEMM g at `tokens` rows, A, C and the residual moved `skipped` rows on (as
 * run_launch). */
static smelt_status run_gemm(rt_executor *x, uint32_t index, const prog_gemm *g, uint32_t tokens,
                             uint32_t skipped, rt_error *e) {
    rt_gemm_args args = gemm_args(x, g, tokens, skipped);
    if (args.m == 0) return SMELT_OK;
    x->launches_last_step++;
    smelt_status s = x->device->ops->gemm(x->device, &args, e);
    if (s != SMELT_OK) return locate(x, index, s, e);
    return SMELT_OK;
}

smelt_status rt_executor_prepare_gemms(rt_executor *x, uint32_t weight, rt_error *e) {
    const program *p = x->program;
    rt_device *d = x->device;
    if (!x->scaled_gemms || !d->ops->prepare_gemm) return SMELT_OK;
    for (uint32_t i = 0; i < p->instr_count; i++) {
        const prog_instr *in = &p->instrs[i];
        if (in->needs != PROG_NEED_SCALED_GEMM) continue;
        const prog_gemm *g = &in->as.gemm;
        if (weight != RT_NOT_A_WEIGHT && g->b.index != weight) continue; /* B is a weight (program_decode) */
        /* At the most rows it runs at, as a device may plan for them. */
        rt_gemm_args args = gemm_args(x, g, p->max_tokens, 0);
        smelt_status s = d->ops->prepare_gemm(d, &args, e);
        if (s == SMELT_ERROR_UNSUPPORTED) { /* the fallback kernels, for every scaled GEMM from now on */
            x->scaled_gemms = false;
            x->graph_ready = false;
            return SMELT_OK;
        }
        if (s != SMELT_OK) return locate(x, i, s, e);
    }
    return SMELT_OK;
}

/* The program's instructions, the wanted-rows ones on the rows wanted
 * (program.h, "Wanted rows"); the greedy one (the last) only with `greedy`. */
static smelt_status run_instructions(rt_executor *x, uint32_t tokens, prog_rows rows, bool greedy,
                                     rt_error *e) {
    const program *p = x->program;
    x->launches_last_step = 0;
    uint32_t count = p->has_greedy && !greedy ? p->instr_count - 1 : p->instr_count;
    for (uint32_t i = 0; i < count; i++) {
        const prog_instr *in = &p->instrs[i];
        if (!prog_instr_runs(in, tokens)) continue;               /* guarded for another token count */
        if (!chosen(x, in, tokens)) continue;                     /* the other side of its choice runs */
        if (!prog_instr_needs_met(in, x->scaled_gemms)) continue; /* its fallback runs, or it is one */
        if (in->wanted_rows && rows == PROG_ROWS_NONE) continue;
        uint32_t at = (uint32_t)prog_instr_tokens(in, tokens, rows), skipped = tokens - at;
        smelt_status s;
        if (in->op == PROG_OP_LAUNCH) {
            s = run_launch(x, i, &in->as.launch, at, skipped, e);
        } else if (in->wanted_rows && rows == PROG_ROWS_ALL && tokens > 1) {
            /* A BLAS picks its kernels by the row count, so row T - 1 of a
             * T-row product may differ in its last bits from the same row
             * alone: the last row by itself, as a step wanting it alone
             * computes it, so that a row's logits are the same whichever
             * rows a step wants (program.h). */
            s = run_gemm(x, i, &in->as.gemm, tokens - 1, 0, e);
            if (s == SMELT_OK) s = run_gemm(x, i, &in->as.gemm, 1, tokens - 1, e);
        } else {
            s = run_gemm(x, i, &in->as.gemm, at, skipped, e);
        }
        if (s != SMELT_OK) return s;
    }
    return SMELT_OK;
}

static smelt_status check_inputs(const program *p, const int32_t *ids, const int32_t *pos, uint32_t tokens,
                                 rt_error *e) {
    if (tokens < 1 || tokens > (uint64_t)p->max_tokens)
        return rt_fail(e, SMELT_ERROR_INVALID_ARGUMENT, "a step of %u tokens is outside [1, %lld]", tokens,
                       (long long)p->max_tokens);
    int64_t id_bound = p->id_bound ? p->id_bound : (int64_t)p->vocab;
    for (uint32_t t = 0; t < tokens; t++) {
        if (ids[t] < 0 || ids[t] >= id_bound)
            return rt_fail(e, SMELT_ERROR_INVALID_ARGUMENT,
                           "token id %d (token %u of the step) is outside the vocabulary [0, %lld)", ids[t],
                           t, (long long)id_bound);
        if (pos[t] < 0 || (p->max_positions && pos[t] >= p->max_positions))
            return rt_fail(e, SMELT_ERROR_INVALID_ARGUMENT,
                           "position %d (token %u of the step) is outside [0, %lld): the plan's sequence "
                           "length bound",
                           pos[t], t, (long long)(p->max_positions ? p->max_positions : INT32_MAX));
    }
    return SMELT_OK;
}

/* A decode step on a device that has graphs: the first runs as it is (so
 * that libraries finish their lazy set-up, which a capture forbids), the
 * second is captured (arguments never change at T = 1), every later one
 * replays the graph. The graph holds the greedy launch too (one small
 * kernel), so that one graph serves greedy and sampled steps. */
static smelt_status run_graph(rt_executor *x, rt_error *e) {
    const rt_device_ops *ops = x->device->ops;
    smelt_status s;
    if (!x->decode_warmed) {
        s = run_instructions(x, 1, PROG_ROWS_ALL, true, e);
        if (s == SMELT_OK) x->decode_warmed = true;
        return s;
    }
    if (!x->graph_ready) {
        if ((s = ops->capture_begin(x->device, e)) != SMELT_OK) return s;
        s = run_instructions(x, 1, PROG_ROWS_ALL, true, e);
        smelt_status end = ops->capture_end(x->device, e);
        if (s != SMELT_OK) return s;
        if (end != SMELT_OK) return end;
        x->graph_ready = true;
        x->graph_launches = x->launches_last_step;
    }
    x->launches_last_step = x->graph_launches;
    if ((s = ops->replay(x->device, e)) != SMELT_OK) return s;
    x->graph_replays++;
    return SMELT_OK;
}

smelt_status rt_executor_step(rt_executor *x, const int32_t *ids, const int32_t *pos, uint32_t tokens,
                              prog_rows rows, float *logits, int32_t *greedy_token, rt_error *e) {
    const program *p = x->program;
    const rt_device_ops *ops = x->device->ops;
    smelt_status s = check_inputs(p, ids, pos, tokens, e);
    if (s != SMELT_OK) return s;
    if (rows != PROG_ROWS_ALL && rows != PROG_ROWS_LAST && rows != PROG_ROWS_NONE)
        return rt_fail(e, SMELT_ERROR_INVALID_ARGUMENT, "unknown logits rows %d", (int)rows);
    if (greedy_token && rows != PROG_ROWS_LAST)
        return rt_fail(e, SMELT_ERROR_INVALID_ARGUMENT,
                       "the greedy token is of the last row: a step that "
                       "asks for it wants the last row's logits");
    uint64_t bytes = (uint64_t)tokens * sizeof(int32_t);
    if ((s = ops->copy_in(x->device, rt_address_at(x->arena, p->input_ids.offset), ids, bytes, e)) !=
            SMELT_OK ||
        (s = ops->copy_in(x->device, rt_address_at(x->arena, p->input_pos.offset), pos, bytes, e)) !=
            SMELT_OK)
        return s;
    bool on_device = greedy_token && p->has_greedy;
    if (tokens == 1 && x->use_graphs) {
        s = run_graph(x, e); /* at one token every row is the last; the graph runs the head whatever rows */
    } else {
        s = run_instructions(x, tokens, rows, on_device, e);
    }
    if (s != SMELT_OK) return s;
    if (on_device) {
        const void *token = resolve(x, p->greedy_token);
        if ((s = ops->copy_out(x->device, greedy_token, token, sizeof *greedy_token, e)) != SMELT_OK)
            return s;
        if (*greedy_token < 0 || (uint64_t)*greedy_token >= p->vocab)
            return rt_fail(e, SMELT_ERROR_DEVICE, "every logit is NaN: the model's arithmetic broke down");
        return SMELT_OK;
    }
    if (rows == PROG_ROWS_NONE) return SMELT_OK;
    uint64_t row_bytes = p->vocab * sizeof(float), first_row = rows == PROG_ROWS_LAST ? tokens - 1 : 0;
    uint64_t offset = p->logits.offset + first_row * row_bytes;
    return ops->copy_out(x->device, logits, rt_address_at(x->arena, offset), (tokens - first_row) * row_bytes,
                         e);
}
