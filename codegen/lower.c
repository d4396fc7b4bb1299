/* lower.c - an inferred module becomes kernels, a launch program, a memory
 * plan and a weight table (see lower.h). Three walks over the op list:
 *   1. emit: what each op becomes (codegen/emit.h);
 *   2. liveness: the root buffer of every value (reshape aliases its operand)
 *      and the last op that uses it;
 *   3. program: arena offsets by first fit, then one instruction per kernel
 *      launch or GEMM, in op order.
 */
#include "lower.h"

#include <stdlib.h>
#include <string.h>

enum { ARENA_ALIGNMENT = 256 };
#define NEVER_USED UINT32_MAX
#define USED_UNTIL_END (UINT32_MAX - 1)

typedef struct lowering_state {
    const ir_module *m;
    const cg_options *options;
    cg_lowered *out;
    diag_engine *d;
    int32_t token_symbol;
    int64_t max_tokens;
    cg_op_lowering *ops;      /* [op_count] */
    ir_value_id *root;        /* [value_count] buffer owner after aliasing */
    uint32_t *last_use;       /* [value_count] by root */
    uint32_t *weight_index;   /* [op_count] weight-table entry of a weight op */
    uint32_t *state_base;     /* [op_count] first state buffer of an op */
    uint32_t kernel_capacity; /* of out->kernels */
} lowering_state;

static const ir_op *defining_op(const lowering_state *s, ir_value_id v) {
    return &s->m->ops[s->m->values[v].def_op];
}

/* The op named `name` of `kind` (an input or output), or UINT32_MAX. */
static uint32_t find_named_op(const ir_module *m, ir_op_kind kind, const char *name) {
    for (uint32_t i = 0; i < m->op_count; i++) {
        if (m->ops[i].dead || m->ops[i].kind != kind) continue;
        const ir_attr *a = ir_op_attr(m, i, "name");
        if (a && strcmp(a->as.s, name) == 0) return i;
    }
    return UINT32_MAX;
}

/* Bytes of value v with the token dim at max_tokens, in its storage dtype. */
static bool value_bytes(const lowering_state *s, ir_value_id v, uint64_t *bytes) {
    const ir_type *t = &s->m->values[v].type;
    uint64_t n = smelt_dtype_element_bytes(cg_storage_dtype(s->m, v, s->options));
    for (unsigned i = 0; i < t->rank; i++) {
        int64_t size = t->dims[i].symbol == s->token_symbol ? s->max_tokens : t->dims[i].size;
        if (t->dims[i].symbol >= 0 && t->dims[i].symbol != s->token_symbol) return false;
        if (size_mul_overflow(n, (uint64_t)size, &n)) return false;
    }
    *bytes = n;
    return true;
}

/* ---- 1. emit ------------------------------------------------------------- */

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

static bool emit_all(lowering_state *s) {
    bool ok = true;
    uint32_t states = 0, weights = 0;
    for (uint32_t i = 0; i < s->m->op_count && !diag_should_stop(s->d); i++) {
        if (s->m->ops[i].dead) continue;
        if (!cg_emit_op(s->m, i, s->options, &s->out->arena, &s->ops[i], s->d)) {
            ok = false;
            continue;
        }
        s->state_base[i] = states;
        states += s->ops[i].state_count;
        if (s->m->ops[i].kind == IR_OP_WEIGHT) s->weight_index[i] = weights++;
    }
    s->out->program.state_count = states;
    s->out->program.weight_count = weights;
    return ok;
}

/* ---- 2. liveness ------------------------------------------------------------ */

static void compute_liveness(lowering_state *s) {
    const ir_module *m = s->m;
    for (ir_value_id v = 0; v < m->value_count; v++) {
        s->root[v] = v;
        s->last_use[v] = NEVER_USED;
    }
    for (uint32_t i = 0; i < m->op_count; i++) {
        const ir_op *op = &m->ops[i];
        if (op->dead) continue;
        if (s->ops[i].kind == CG_LOWER_ALIAS) s->root[op->results[0]] = s->root[op->operands[0]];
        uint32_t use = op->kind == IR_OP_OUTPUT ? USED_UNTIL_END : i;
        for (uint32_t j = 0; j < op->operand_count; j++) {
            ir_value_id r = s->root[op->operands[j]];
            if (s->last_use[r] == NEVER_USED || s->last_use[r] < use) s->last_use[r] = use;
        }
    }
}

/* ---- 3. memory and program ------------------------------------------------ */

typedef struct live_block {
    uint64_t offset, end;
    ir_value_id root;
} live_block;

typedef struct arena_planner {
    live_block *blocks; /* sorted by offset */
    uint32_t count, capacity;
    uint64_t peak;
} arena_planner;

static uint64_t planner_allocate(arena_planner *p, uint64_t bytes, ir_value_id root) {
    bytes = (bytes + ARENA_ALIGNMENT - 1) / ARENA_ALIGNMENT * ARENA_ALIGNMENT;
    if (bytes == 0) bytes = ARENA_ALIGNMENT;
    uint64_t offset = 0;
    uint32_t at = 0;
    for (; at < p->count; at++) {
        if (p->blocks[at].offset - offset >= bytes) break;
        offset = p->blocks[at].end;
    }
    if (p->count == p->capacity) {
        p->capacity = p->capacity ? p->capacity * 2 : 64;
        p->blocks = realloc(p->blocks, p->capacity * sizeof *p->blocks);
        if (!p->blocks) SMELT_DIE("out of memory");
    }
    memmove(&p->blocks[at + 1], &p->blocks[at], (p->count - at) * sizeof *p->blocks);
    p->blocks[at] = (live_block){offset, offset + bytes, root};
    p->count++;
    if (offset + bytes > p->peak) p->peak = offset + bytes;
    return offset;
}

static void planner_release(arena_planner *p, ir_value_id root) {
    for (uint32_t i = 0; i < p->count; i++)
        if (p->blocks[i].root == root) {
            memmove(&p->blocks[i], &p->blocks[i + 1], (p->count - i - 1) * sizeof *p->blocks);
            p->count--;
            return;
        }
}

/* Where value v lives, as the program names it. */
static bool value_ref(const lowering_state *s, ir_value_id v, prog_ref *ref) {
    ir_value_id r = s->root[v];
    const ir_op *def = defining_op(s, r);
    if (def->kind == IR_OP_WEIGHT) {
        *ref = (prog_ref){PROG_BUFFER_WEIGHT, s->weight_index[s->m->values[r].def_op], 0};
        return true;
    }
    if (s->out->value_offsets[r] == UINT64_MAX) return false;
    *ref = (prog_ref){PROG_BUFFER_ARENA, 0, s->out->value_offsets[r]};
    return true;
}

static bool needs_arena(const lowering_state *s, uint32_t op) {
    cg_lowering_kind kind = s->ops[op].kind;
    return kind == CG_LOWER_KERNELS || kind == CG_LOWER_GEMM || s->m->ops[op].kind == IR_OP_INPUT;
}

static bool plan_memory(lowering_state *s) {
    const ir_module *m = s->m;
    arena_planner planner = {0};
    bool ok = true;
    for (uint32_t i = 0; i < m->op_count && ok; i++) {
        const ir_op *op = &m->ops[i];
        if (op->dead) continue;
        if (needs_arena(s, i))
            for (uint32_t r = 0; r < op->result_count; r++) {
                ir_value_id v = op->results[r];
                uint64_t bytes;
                if (!value_bytes(s, v, &bytes)) {
                    diag_error(s->d, op->loc, "%s: the buffer of result %u has no size for %lld tokens",
                               ir_op_info_of(op->kind)->name, r, (long long)s->max_tokens);
                    ok = false;
                    break;
                }
                s->out->value_offsets[v] = planner_allocate(&planner, bytes, v);
            }
        /* Buffers whose last use is this op are free for the ops after it. */
        for (uint32_t j = 0; j < op->operand_count; j++) {
            ir_value_id r = s->root[op->operands[j]];
            if (s->last_use[r] == i) planner_release(&planner, r);
        }
        for (uint32_t r = 0; r < op->result_count; r++)
            if (s->last_use[op->results[r]] == NEVER_USED) planner_release(&planner, op->results[r]);
    }
    s->out->program.arena_bytes = planner.peak;
    free(planner.blocks);
    return ok;
}

static prog_affine rows_of(const lowering_state *s, const ir_type *t) {
    int64_t rows = 1;
    bool tokens = false;
    for (unsigned i = 0; i + 1 < t->rank; i++) {
        if (t->dims[i].symbol == s->token_symbol) tokens = true;
        else rows *= t->dims[i].size;
    }
    return tokens ? (prog_affine){rows, 0, 1} : (prog_affine){0, rows, 1};
}

static bool build_gemm(lowering_state *s, uint32_t i, prog_instr *instr) {
    const ir_module *m = s->m;
    const ir_op *op = &m->ops[i];
    prog_gemm *g = &instr->as.gemm;
    const ir_type *x = &m->values[op->operands[0]].type;
    const ir_type *y = &m->values[op->results[0]].type;
    instr->op = PROG_OP_GEMM;
    g->m = rows_of(s, x);
    g->k = x->dims[x->rank - 1].size;
    g->n = y->dims[y->rank - 1].size;
    g->b_transposed = strcmp(ir_op_string(m, i, "layout"), "out_in") == 0;
    g->has_bias = op->operand_count == 3;
    g->dtype_a = cg_storage_dtype(m, op->operands[0], s->options);
    g->dtype_b = cg_storage_dtype(m, op->operands[1], s->options);
    g->dtype_c = cg_storage_dtype(m, op->results[0], s->options);
    bool ok = value_ref(s, op->operands[0], &g->a) && value_ref(s, op->operands[1], &g->b) &&
              value_ref(s, op->results[0], &g->c);
    if (g->has_bias) {
        g->dtype_bias = cg_storage_dtype(m, op->operands[2], s->options);
        ok = ok && value_ref(s, op->operands[2], &g->bias);
    }
    if (!ok) diag_error(s->d, op->loc, "matmul: an operand has no buffer (a constant cannot be a matmul operand)");
    return ok;
}

static bool build_launch(lowering_state *s, uint32_t i, const cg_kernel *k, prog_instr *instr) {
    prog_launch *launch = &instr->as.launch;
    instr->op = PROG_OP_LAUNCH;
    launch->kernel = add_kernel(s, k);
    launch->rule = k->rule;
    launch->arg_count = k->param_count;
    for (uint32_t p = 0; p < k->param_count; p++) {
        const cg_param *param = &k->params[p];
        prog_arg *arg = &launch->args[p];
        switch (param->kind) {
        case CG_PARAM_TOKENS: arg->kind = PROG_ARG_TOKENS; break;
        case CG_PARAM_STATE:
            arg->kind = PROG_ARG_POINTER;
            arg->ref = (prog_ref){PROG_BUFFER_STATE, s->state_base[i] + param->state, 0};
            break;
        case CG_PARAM_VALUE:
            arg->kind = PROG_ARG_POINTER;
            if (!value_ref(s, param->value, &arg->ref)) {
                diag_error(s->d, s->m->ops[i].loc, "%s: operand %%%u has no buffer", k->name, param->value);
                return false;
            }
            break;
        }
    }
    return true;
}

static bool build_program(lowering_state *s) {
    const ir_module *m = s->m;
    cg_lowered *l = s->out;
    program *p = &l->program;
    uint32_t count = 0;
    for (uint32_t i = 0; i < m->op_count; i++)
        if (!m->ops[i].dead) count += s->ops[i].kind == CG_LOWER_GEMM ? 1 : s->ops[i].kind == CG_LOWER_KERNELS ? s->ops[i].kernel_count : 0;
    p->instrs = arena_array(&l->arena, count ? count : 1, sizeof *p->instrs);
    p->state_bytes = arena_array(&l->arena, p->state_count ? p->state_count : 1, sizeof *p->state_bytes);
    p->weights = arena_array(&l->arena, p->weight_count ? p->weight_count : 1, sizeof *p->weights);
    bool ok = true;
    for (uint32_t i = 0; i < m->op_count; i++) {
        const ir_op *op = &m->ops[i];
        const cg_op_lowering *lo = &s->ops[i];
        if (op->dead) continue;
        for (uint32_t st = 0; st < lo->state_count; st++) p->state_bytes[s->state_base[i] + st] = lo->state_bytes[st];
        if (op->kind == IR_OP_WEIGHT) {
            prog_weight *w = &p->weights[s->weight_index[i]];
            const ir_type *t = &m->values[op->results[0]].type;
            w->name = ir_op_string(m, i, "name");
            w->stacked = ir_op_string(m, i, "stack")[0] != '\0';
            w->dtype = cg_storage_dtype(m, op->results[0], s->options);
            w->rank = t->rank;
            for (unsigned d = 0; d < t->rank; d++) w->shape[d] = t->dims[d].size;
            ok = ok && value_bytes(s, op->results[0], &w->bytes);
            w->data_offset = UINT64_MAX;
        } else if (lo->kind == CG_LOWER_GEMM) {
            p->instrs[p->instr_count].ir_op = i;
            ok = build_gemm(s, i, &p->instrs[p->instr_count++]) && ok;
        } else if (lo->kind == CG_LOWER_KERNELS) {
            for (uint32_t k = 0; k < lo->kernel_count; k++) {
                p->instrs[p->instr_count].ir_op = i;
                ok = build_launch(s, i, &lo->kernels[k], &p->instrs[p->instr_count++]) && ok;
            }
        }
    }
    l->launches_per_step = p->instr_count;
    return ok;
}

/* Bounds the runtime checks before a step: positions below the shortest KV
 * cache, ids below the smallest embedding table that the ids index. */
static void find_input_bounds(const lowering_state *s, uint32_t ids_op) {
    const ir_module *m = s->m;
    ir_value_id ids = m->ops[ids_op].results[0];
    program *p = &s->out->program;
    for (uint32_t i = 0; i < m->op_count; i++) {
        const ir_op *op = &m->ops[i];
        if (op->dead) continue;
        if (op->kind == IR_OP_ATTENTION) {
            int64_t max_seq = ir_op_int(m, i, "max_seq");
            if (p->max_positions == 0 || max_seq < p->max_positions) p->max_positions = max_seq;
        } else if (op->kind == IR_OP_EMBEDDING && op->operands[1] == ids) {
            int64_t rows = m->values[op->operands[0]].type.dims[0].size;
            if (p->id_bound == 0 || rows < p->id_bound) p->id_bound = rows;
        }
    }
}

/* The conventions every backend shares: inputs "ids" and "pos" of shape
 * [tokens], output "logits" with a constant last dim. */
static bool find_interface(lowering_state *s) {
    const ir_module *m = s->m;
    uint32_t ids = find_named_op(m, IR_OP_INPUT, "ids"), pos = find_named_op(m, IR_OP_INPUT, "pos");
    uint32_t logits = find_named_op(m, IR_OP_OUTPUT, "logits");
    if (ids == UINT32_MAX || pos == UINT32_MAX || logits == UINT32_MAX) {
        diag_error(s->d, SMELT_NO_LOC, "codegen needs inputs 'ids' and 'pos' and an output 'logits'; the model lacks %s",
                   ids == UINT32_MAX ? "input 'ids'" : pos == UINT32_MAX ? "input 'pos'" : "output 'logits'");
        return false;
    }
    const ir_type *t = &m->values[m->ops[ids].results[0]].type;
    if (t->rank != 1 || t->dims[0].symbol < 0) {
        diag_error(s->d, m->ops[ids].loc, "input 'ids' must have the shape [tokens] with a symbolic dim");
        return false;
    }
    s->token_symbol = t->dims[0].symbol;
    int64_t bound = m->symbols[s->token_symbol].bound;
    if (s->max_tokens <= 0 || s->max_tokens > bound) s->max_tokens = bound;
    const ir_type *out = &m->values[m->ops[logits].operands[0]].type;
    if (out->rank == 0 || out->dims[out->rank - 1].symbol >= 0) {
        diag_error(s->d, m->ops[logits].loc, "output 'logits' must have a constant last dim");
        return false;
    }
    s->out->program.vocab = (uint64_t)out->dims[out->rank - 1].size;
    find_input_bounds(s, ids);
    return true;
}

bool cg_lower_module(const ir_module *m, const cg_options *o, int64_t max_tokens, cg_lowered *out,
                     diag_engine *d) {
    memset(out, 0, sizeof *out);
    arena_init(&out->arena);
    lowering_state s = {.m = m, .options = o, .out = out, .d = d, .max_tokens = max_tokens};
    if (!find_interface(&s)) return false;
    s.ops = calloc(m->op_count ? m->op_count : 1, sizeof *s.ops);
    s.root = calloc(m->value_count ? m->value_count : 1, sizeof *s.root);
    s.last_use = calloc(m->value_count ? m->value_count : 1, sizeof *s.last_use);
    s.weight_index = calloc(m->op_count ? m->op_count : 1, sizeof *s.weight_index);
    s.state_base = calloc(m->op_count ? m->op_count : 1, sizeof *s.state_base);
    out->value_offsets = arena_array(&out->arena, m->value_count ? m->value_count : 1, sizeof *out->value_offsets);
    if (!s.ops || !s.root || !s.last_use || !s.weight_index || !s.state_base) SMELT_DIE("out of memory");
    for (ir_value_id v = 0; v < m->value_count; v++) out->value_offsets[v] = UINT64_MAX;

    out->program.format_version = PROGRAM_FORMAT_VERSION;
    out->program.max_tokens = s.max_tokens;
    bool ok = emit_all(&s);
    if (ok) {
        compute_liveness(&s);
        ok = plan_memory(&s) && build_program(&s);
    }
    if (ok) {
        program *p = &out->program;
        uint32_t ids = find_named_op(m, IR_OP_INPUT, "ids"), pos = find_named_op(m, IR_OP_INPUT, "pos");
        uint32_t logits = find_named_op(m, IR_OP_OUTPUT, "logits");
        ok = value_ref(&s, m->ops[ids].results[0], &p->input_ids) &&
             value_ref(&s, m->ops[pos].results[0], &p->input_pos) &&
             value_ref(&s, m->ops[logits].operands[0], &p->logits);
        if (ok && cg_storage_dtype(m, m->ops[logits].operands[0], o) != SMELT_DTYPE_F32) {
            diag_error(d, m->ops[logits].loc, "output 'logits' must be stored as f32");
            ok = false;
        }
    }
    free(s.ops);
    free(s.root);
    free(s.last_use);
    free(s.weight_index);
    free(s.state_base);
    return ok;
}

void cg_lowered_free(cg_lowered *l) {
    arena_free(&l->arena);
    memset(l, 0, sizeof *l);
}
