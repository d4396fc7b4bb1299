/* plan_memory.c - the plan-memory pass: where every value lives in a step.
 *
 * Requires: schedule (every op that does work has a launch step); the model
 *   interface's token dim (dim 0 of input 'ids', ir/interface.h).
 * Guarantees:
 *   - every weight has buffer weight(i): its entry in the weight table, i in
 *     program order of the weight ops — but a weight read only by weight
 *     concats (passes/fuse.c), which has none: it is a part of theirs, and
 *     each such concat has the entry (ir_weight_table_ops);
 *   - every input and every result of an op in a group has buffer arena(o):
 *     o a multiple of 256, the value's bytes (its storage dtype, sub-byte
 *     dtypes packed) with the token dim at m->planned_tokens and any other
 *     symbolic dim at its bound fit in [o, o + bytes) below m->arena_bytes;
 *   - a view (reshape) has its operand's buffer: same bytes, other shape;
 *   - constants have none (they are baked into the kernels that read them);
 *   - two values whose lifetimes overlap never share bytes. A value lives
 *     from the step that writes it (inputs: from before the first step) to
 *     the last step that reads it or any view of it; a value an output reads
 *     lives to the end of the step; one nobody reads dies with its step.
 *   Buffers are placed first fit in launch order, freeing each after the
 *   step of its last reader (the reader may not write over its own input;
 *   the ops of one group share a step, so none writes over another's).
 *   planned_tokens is pass_options.max_tokens, or the token dim's bound when
 *   that is 0 or larger.
 * Breaks: nothing.
 */
#include "interface.h"
#include "pass.h"

#include <stdlib.h>
#include <string.h>

enum { ARENA_ALIGNMENT = 256 };
#define NEVER_READ UINT32_MAX
#define READ_UNTIL_END (UINT32_MAX - 1)

typedef struct live_block {
    uint64_t offset, end;
    ir_value_id root;
} live_block;

/* The arena as first fit sees it: the blocks in use, sorted by offset. */
typedef struct arena_plan {
    live_block *blocks;
    uint32_t count, capacity;
    uint64_t peak;
} arena_plan;

static bool plan_allocate(arena_plan *p, uint64_t bytes, ir_value_id root, uint64_t *offset_out) {
    if (bytes > UINT64_MAX - ARENA_ALIGNMENT) return false;
    bytes = (bytes + ARENA_ALIGNMENT - 1) / ARENA_ALIGNMENT * ARENA_ALIGNMENT;
    if (bytes == 0) bytes = ARENA_ALIGNMENT;
    uint64_t offset = 0;
    uint32_t at = 0;
    for (; at < p->count; at++) {
        if (p->blocks[at].offset - offset >= bytes) break;
        offset = p->blocks[at].end;
    }
    if (offset > UINT64_MAX - bytes) return false;
    if (p->count == p->capacity) {
        uint32_t capacity = p->capacity ? p->capacity * 2 : 64;
        live_block *grown = realloc(p->blocks, capacity * sizeof *grown);
        if (!grown) return false;
        p->blocks = grown;
        p->capacity = capacity;
    }
    memmove(&p->blocks[at + 1], &p->blocks[at], (p->count - at) * sizeof *p->blocks);
    p->blocks[at] = (live_block){offset, offset + bytes, root};
    p->count++;
    if (offset + bytes > p->peak) p->peak = offset + bytes;
    *offset_out = offset;
    return true;
}

static void plan_release(arena_plan *p, ir_value_id root) {
    for (uint32_t i = 0; i < p->count; i++)
        if (p->blocks[i].root == root) {
            memmove(&p->blocks[i], &p->blocks[i + 1], (p->count - i - 1) * sizeof *p->blocks);
            p->count--;
            return;
        }
}

typedef struct memory_state {
    ir_module *m;
    diag_engine *d;
    int32_t token_symbol;
    ir_value_id *root;   /* [value_count] the value whose buffer it is (views share) */
    uint32_t *last_read; /* [value_count] by root: the last step that reads it */
    arena_plan arena;
} memory_state;

static bool value_bytes(const memory_state *s, ir_value_id v, uint64_t *bytes) {
    return ir_type_bytes(s->m, &s->m->values[v].type, s->token_symbol, s->m->planned_tokens, bytes);
}

static bool allocate_results(memory_state *s, uint32_t op) {
    const ir_op *o = &s->m->ops[op];
    for (uint32_t r = 0; r < o->result_count; r++) {
        ir_value_id v = o->results[r];
        uint64_t bytes, offset;
        if (!value_bytes(s, v, &bytes)) {
            diag_error(s->d, o->loc, "%s: result %u has no size in bytes for %lld tokens",
                       ir_op_info_of(o->kind)->name, r, (long long)s->m->planned_tokens);
            return false;
        }
        if (!plan_allocate(&s->arena, bytes, v, &offset)) {
            diag_error(s->d, o->loc, "%s: out of memory planning the arena", ir_op_info_of(o->kind)->name);
            return false;
        }
        s->m->values[v].buffer = (ir_buffer){IR_BUFFER_ARENA, offset};
    }
    return true;
}

/* After the last op of step `step` (or an input before the first step), for
 * op `op` of that step: frees the operands whose last reader is in the step
 * and the results nobody reads. A step's values all stay until its last op,
 * so that the ops of one kernel group (which may also run one after another,
 * codegen/emit.h) never write over what another op of the group reads. */
static void release_after(memory_state *s, uint32_t op, uint32_t step) {
    const ir_op *o = &s->m->ops[op];
    for (uint32_t j = 0; j < o->operand_count; j++) {
        ir_value_id r = s->root[o->operands[j]];
        if (s->last_read[r] == step) plan_release(&s->arena, r);
    }
    for (uint32_t r = 0; r < o->result_count; r++)
        if (s->last_read[o->results[r]] == NEVER_READ) plan_release(&s->arena, o->results[r]);
}

/* Op indices of the grouped ops by (step, program order); *count receives how many. */
static uint32_t *launch_order(const ir_module *m, uint32_t *count) {
    uint32_t n = 0, steps = 0;
    for (uint32_t i = 0; i < m->op_count; i++)
        if (!m->ops[i].dead && m->ops[i].step != IR_NONE) {
            n++;
            if (m->ops[i].step >= steps) steps = m->ops[i].step + 1;
        }
    uint32_t *order = malloc((n ? n : 1) * sizeof *order), *start = calloc(steps + 1, sizeof *start);
    if (!order || !start) {
        free(order);
        free(start);
        return NULL;
    }
    for (uint32_t i = 0; i < m->op_count; i++) /* counting sort by step, stable */
        if (!m->ops[i].dead && m->ops[i].step != IR_NONE) start[m->ops[i].step + 1]++;
    for (uint32_t k = 0; k < steps; k++)
        start[k + 1] += start[k];
    for (uint32_t i = 0; i < m->op_count; i++)
        if (!m->ops[i].dead && m->ops[i].step != IR_NONE) order[start[m->ops[i].step]++] = i;
    free(start);
    *count = n;
    return order;
}

static bool check_scheduled(const ir_module *m, diag_engine *d) {
    for (uint32_t i = 0; i < m->op_count; i++)
        if (ir_op_launches(m, i) && m->ops[i].step == IR_NONE) {
            diag_error(d, m->ops[i].loc,
                       "%s: op has no launch step; run fuse and schedule before plan-memory",
                       ir_op_info_of(m->ops[i].kind)->name);
            return false;
        }
    return true;
}

static void compute_liveness(memory_state *s) {
    const ir_module *m = s->m;
    for (ir_value_id v = 0; v < m->value_count; v++)
        s->last_read[v] = NEVER_READ;
    for (uint32_t i = 0; i < m->op_count; i++) {
        const ir_op *op = &m->ops[i];
        if (op->dead) continue;
        uint32_t when = op->kind == IR_OP_OUTPUT ? READ_UNTIL_END : op->step;
        if (when == IR_NONE) continue; /* views and declarations read nothing at run time */
        for (uint32_t j = 0; j < op->operand_count; j++) {
            ir_value_id r = s->root[op->operands[j]];
            if (s->last_read[r] == NEVER_READ || s->last_read[r] < when) s->last_read[r] = when;
        }
    }
}

static bool place_values(memory_state *s) {
    ir_module *m = s->m;
    uint64_t weights = 0;
    bool *entry = ir_weight_table_ops(m);
    if (!entry) {
        diag_error(s->d, SMELT_NO_LOC, "out of memory listing the weights of %u ops", m->op_count);
        return false;
    }
    for (uint32_t i = 0; i < m->op_count; i++) {
        ir_op *op = &m->ops[i];
        for (uint32_t r = 0; r < op->result_count; r++)
            m->values[op->results[r]].buffer = (ir_buffer){IR_BUFFER_NONE, 0};
        if (!op->dead && entry[i])
            m->values[op->results[0]].buffer = (ir_buffer){IR_BUFFER_WEIGHT, weights++};
    }
    free(entry);
    uint32_t count = 0;
    uint32_t *order = launch_order(m, &count);
    if (!order) {
        diag_error(s->d, SMELT_NO_LOC, "out of memory ordering %u ops", m->op_count);
        return false;
    }
    bool ok = true;
    for (uint32_t i = 0; i < m->op_count && ok; i++) /* inputs are written before the first step */
        if (!m->ops[i].dead && m->ops[i].kind == IR_OP_INPUT) {
            ok = allocate_results(s, i);
            release_after(s, i, IR_NONE);
        }
    for (uint32_t k = 0, first = 0; k < count && ok; k++) {
        ok = allocate_results(s, order[k]);
        uint32_t step = m->ops[order[k]].step;
        if (k + 1 < count && m->ops[order[k + 1]].step == step) continue;
        for (; first <= k; first++) /* the step is over */
            release_after(s, order[first], step);
    }
    free(order);
    if (!ok) return false;
    for (ir_value_id v = 0; v < m->value_count; v++) /* views share their root's buffer */
        if (s->root[v] != v) m->values[v].buffer = m->values[s->root[v]].buffer;
    m->arena_bytes = s->arena.peak;
    return true;
}

bool pass_plan_memory(ir_module *m, const pass_options *o, diag_engine *d) {
    if (!check_scheduled(m, d)) return false;
    memory_state s = {.m = m, .d = d, .token_symbol = ir_token_symbol(m)};
    if (s.token_symbol < 0) {
        diag_error(d, SMELT_NO_LOC,
                   "plan-memory needs the token dim: input 'ids' with a symbolic dim 0, such as i32[tokens]");
        return false;
    }
    int64_t bound = m->symbols[s.token_symbol].bound, wanted = o ? o->max_tokens : 0;
    m->planned_tokens = wanted <= 0 || wanted > bound ? bound : wanted;
    s.root = ir_view_roots(m);
    s.last_read = malloc((m->value_count ? m->value_count : 1) * sizeof *s.last_read);
    bool ok = s.root && s.last_read;
    if (!ok) diag_error(d, SMELT_NO_LOC, "out of memory planning %u values", m->value_count);
    if (ok) {
        compute_liveness(&s);
        ok = place_values(&s);
    }
    if (!ok) {
        m->planned_tokens = 0;
        m->arena_bytes = 0;
    }
    free(s.root);
    free(s.last_read);
    free(s.arena.blocks);
    return ok;
}
