/* canonicalize.c - the canonicalize pass: folding, identities, CSE and DCE.
 *
 * Requires:   a module that verifies, with every type known (run
 *             infer-shapes first; an unknown type is an error).
 * Guarantees: at a fixpoint (or after CANONICALIZE_MAX_ROUNDS rounds):
 *             - add/mul of two consts is one const holding the folded value
 *               (computed in double; integer dtypes fold only when the
 *               result is an integer their range holds);
 *             - mul(x, 1.0), add(x, 0.0) (either side), a reshape to its
 *               operand's own shape and a transpose by the identity perm are
 *               replaced by their operand, where the result type is the
 *               operand's type;
 *             - reshape(reshape(x)) is reshape(x); transpose(transpose(x))
 *               is one transpose by the composed perm (or x);
 *             - no two live pure, stateless ops have the same kind,
 *               operands, attributes and result types (CSE keeps the first);
 *             - every op has a use, a side effect or is an input (DCE);
 *             - every attribute with a schema default is present.
 * Breaks:     op indices (ops are removed and the list compacted); value
 *             ids are kept, so removed ops leave unused values behind.
 *
 * Each round is one forward sweep and one backward sweep, both O(ops):
 * the forward sweep redirects operands through `forward` (value -> the value
 * that replaces it), rewrites the op, then looks it up in a hash table of
 * the ops seen so far (CSE); the backward sweep removes unused ops.
 */
#include "pass.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { CANONICALIZE_MAX_ROUNDS = 16 };

typedef struct canonicalizer {
    ir_module *m;
    ir_value_id *forward; /* value_count entries; forward[v] == v when v stays */
    uint32_t *table;      /* CSE hash table of op index + 1; 0 is empty */
    uint32_t table_mask;  /* capacity - 1, capacity a power of two */
    bool changed;
} canonicalizer;

/* ---- replacing values ---------------------------------------------------------- */

static ir_value_id resolve(canonicalizer *c, ir_value_id v) {
    ir_value_id root = v;
    while (c->forward[root] != root)
        root = c->forward[root];
    while (c->forward[v] != root) { /* path compression */
        ir_value_id next = c->forward[v];
        c->forward[v] = root;
        v = next;
    }
    return root;
}

/* Every use of the (single) result of op `index` goes to `by`; the op is removed. */
static void replace_result(canonicalizer *c, uint32_t index, ir_value_id by) {
    ir_op *op = &c->m->ops[index];
    c->forward[op->results[0]] = by;
    op->dead = true;
    c->changed = true;
}

/* Every use of a result of op `index` goes to the same result of the equal
 * op `same` (CSE); the op is removed. */
static void replace_op(canonicalizer *c, uint32_t index, uint32_t same) {
    ir_op *op = &c->m->ops[index];
    for (uint32_t r = 0; r < op->result_count; r++)
        c->forward[op->results[r]] = c->m->ops[same].results[r];
    op->dead = true;
    c->changed = true;
}

/* ---- folding and identities ------------------------------------------------------ */

static const ir_type *type_of(const canonicalizer *c, ir_value_id v) { return &c->m->values[v].type; }

static const ir_op *def_of(const canonicalizer *c, ir_value_id v) {
    return &c->m->ops[c->m->values[v].def_op];
}

/* The value of a const op defining v. */
static bool const_value(const canonicalizer *c, ir_value_id v, double *out) {
    const ir_op *def = def_of(c, v);
    if (def->kind != IR_OP_CONST || def->dead) return false;
    const ir_attr *value = ir_op_attr(c->m, c->m->values[v].def_op, "value");
    if (!value || value->kind != IR_ATTR_FLOAT) return false;
    *out = value->as.f;
    return true;
}

/* Can a const of dtype `t` hold `v` exactly as the runtime computes it? */
static bool dtype_holds(smelt_dtype t, double v) {
    if (smelt_dtype_is_float(t)) return true;
    if (v != floor(v)) return false;
    switch (t) {
    case SMELT_DTYPE_I4: return v >= -8 && v <= 7;
    case SMELT_DTYPE_I8: return v >= -128 && v <= 127;
    case SMELT_DTYPE_I32: return v >= -2147483648.0 && v <= 2147483647.0;
    case SMELT_DTYPE_I64: return fabs(v) <= 9007199254740992.0; /* 2^53: exact in double */
    default: return false;
    }
}

/* add/mul of two consts becomes a const, in place: its result keeps its id. */
static bool fold_constants(canonicalizer *c, uint32_t index) {
    ir_op *op = &c->m->ops[index];
    double a, b;
    if (!const_value(c, op->operands[0], &a) || !const_value(c, op->operands[1], &b)) return false;
    double folded = op->kind == IR_OP_ADD ? a + b : a * b;
    if (!dtype_holds(type_of(c, op->results[0])->dtype, folded)) return false;
    op->kind = IR_OP_CONST;
    op->operand_count = 0;
    op->attrs = arena_array(&c->m->arena, ir_op_info_of(IR_OP_CONST)->attr_count, sizeof(ir_attr));
    ir_op_set_float(c->m, index, "value", folded);
    c->changed = true;
    return true;
}

/* mul(x, 1.0) -> x and add(x, 0.0) -> x, either side, keeping the type. */
static bool drop_neutral_operand(canonicalizer *c, uint32_t index, double neutral) {
    ir_op *op = &c->m->ops[index];
    const ir_type *result = type_of(c, op->results[0]);
    for (unsigned side = 0; side < 2; side++) {
        double value;
        ir_value_id kept = op->operands[1 - side];
        if (const_value(c, op->operands[side], &value) && value == neutral &&
            ir_type_equal(type_of(c, kept), result)) {
            replace_result(c, index, kept);
            return true;
        }
    }
    return false;
}

static void simplify_reshape(canonicalizer *c, uint32_t index) {
    ir_op *op = &c->m->ops[index];
    const ir_op *inner = def_of(c, op->operands[0]);
    if (inner->kind == IR_OP_RESHAPE && !inner->dead) { /* reshape(reshape(x)) -> reshape(x) */
        op->operands[0] = inner->operands[0];
        c->changed = true;
    }
    if (ir_type_equal(type_of(c, op->operands[0]), type_of(c, op->results[0])))
        replace_result(c, index, op->operands[0]);
}

/* A perm attribute of `count` entries, each < count (verified modules have them). */
static bool valid_perm(const ir_attr *perm, uint32_t count) {
    if (!perm || perm->kind != IR_ATTR_INTS || perm->as.ints.count != count || count > IR_MAX_DIMS)
        return false;
    for (uint32_t i = 0; i < count; i++)
        if (perm->as.ints.items[i] < 0 || perm->as.ints.items[i] >= (int64_t)count) return false;
    return true;
}

static bool is_identity(const int64_t *perm, uint32_t count) {
    for (uint32_t i = 0; i < count; i++)
        if (perm[i] != (int64_t)i) return false;
    return true;
}

static void simplify_transpose(canonicalizer *c, uint32_t index) {
    ir_op *op = &c->m->ops[index];
    const ir_attr *perm = ir_op_attr(c->m, index, "perm");
    uint32_t n = type_of(c, op->results[0])->rank;
    if (!valid_perm(perm, n)) return;
    const ir_op *inner = def_of(c, op->operands[0]);
    const ir_attr *inner_perm = ir_op_attr(c->m, c->m->values[op->operands[0]].def_op, "perm");
    if (inner->kind == IR_OP_TRANSPOSE && !inner->dead && valid_perm(inner_perm, n)) {
        /* outer dim j is inner dim p2[j], which is x dim p1[p2[j]]. */
        int64_t composed[IR_MAX_DIMS];
        for (uint32_t j = 0; j < n; j++)
            composed[j] = inner_perm->as.ints.items[perm->as.ints.items[j]];
        op->operands[0] = inner->operands[0];
        ir_op_set_attr(c->m, index, "perm",
                       &(ir_attr){.kind = IR_ATTR_INTS, .as.ints = {.count = n, .items = composed}});
        perm = ir_op_attr(c->m, index, "perm");
        c->changed = true;
    }
    if (is_identity(perm->as.ints.items, perm->as.ints.count) &&
        ir_type_equal(type_of(c, op->operands[0]), type_of(c, op->results[0])))
        replace_result(c, index, op->operands[0]);
}

/* Rewrites op `index` in place; false when the op is gone. */
static bool rewrite(canonicalizer *c, uint32_t index) {
    ir_op *op = &c->m->ops[index];
    switch (op->kind) {
    case IR_OP_ADD:
        if (fold_constants(c, index)) return true;
        return !drop_neutral_operand(c, index, 0.0);
    case IR_OP_MUL:
        if (fold_constants(c, index)) return true;
        return !drop_neutral_operand(c, index, 1.0);
    case IR_OP_RESHAPE: simplify_reshape(c, index); break;
    case IR_OP_TRANSPOSE: simplify_transpose(c, index); break;
    default: break;
    }
    return !op->dead;
}

/* ---- common subexpressions ----------------------------------------------------- */

static uint64_t mix(uint64_t h, uint64_t v) { /* FNV-1a over the 8 bytes of v */
    for (int i = 0; i < 8; i++)
        h = (h ^ ((v >> (8 * i)) & 0xff)) * 1099511628211ull;
    return h;
}

static uint64_t mix_dim(uint64_t h, ir_dim d) {
    return mix(mix(h, (uint64_t)(int64_t)d.symbol), ir_dim_is_symbol(d) ? 0 : (uint64_t)d.size);
}

static uint64_t hash_attr(uint64_t h, const ir_attr *a) {
    h = mix(h, a->kind);
    switch (a->kind) {
    case IR_ATTR_INT: return mix(h, (uint64_t)a->as.i);
    case IR_ATTR_FLOAT: {
        uint64_t bits;
        memcpy(&bits, &a->as.f, sizeof bits);
        return mix(h, bits);
    }
    case IR_ATTR_BOOL: return mix(h, a->as.b);
    case IR_ATTR_STRING:
        for (const char *s = a->as.s; s && *s; s++)
            h = mix(h, (unsigned char)*s);
        return h;
    case IR_ATTR_INTS:
        for (uint32_t i = 0; i < a->as.ints.count; i++)
            h = mix(h, (uint64_t)a->as.ints.items[i]);
        return h;
    case IR_ATTR_SHAPE:
        for (uint32_t i = 0; i < a->as.shape.count; i++)
            h = mix_dim(h, a->as.shape.items[i]);
        return h;
    case IR_ATTR_FLOATS:
        for (uint32_t i = 0; i < a->as.floats.count; i++) {
            uint64_t bits;
            memcpy(&bits, &a->as.floats.items[i], sizeof bits);
            h = mix(h, bits);
        }
        return h;
    default: return h;
    }
}

static uint64_t hash_op(const ir_module *m, const ir_op *op) {
    uint64_t h = mix(14695981039346656037ull, op->kind);
    for (uint32_t i = 0; i < op->operand_count; i++)
        h = mix(h, op->operands[i]);
    for (uint32_t i = 0; i < ir_op_info_of(op->kind)->attr_count; i++)
        h = hash_attr(h, &op->attrs[i]);
    for (uint32_t r = 0; r < op->result_count; r++) {
        const ir_type *t = &m->values[op->results[r]].type;
        h = mix(mix(h, t->dtype), t->rank);
        for (unsigned i = 0; i < t->rank; i++)
            h = mix_dim(h, t->dims[i]);
    }
    return h;
}

static bool same_op(const ir_module *m, const ir_op *a, const ir_op *b) {
    if (a->kind != b->kind || a->operand_count != b->operand_count || a->result_count != b->result_count)
        return false;
    for (uint32_t i = 0; i < a->operand_count; i++)
        if (a->operands[i] != b->operands[i]) return false;
    for (uint32_t i = 0; i < ir_op_info_of(a->kind)->attr_count; i++)
        if (!ir_attr_equal(&a->attrs[i], &b->attrs[i])) return false;
    for (uint32_t r = 0; r < a->result_count; r++)
        if (!ir_type_equal(&m->values[a->results[r]].type, &m->values[b->results[r]].type)) return false;
    return true;
}

static bool mergeable(const ir_op *op) {
    unsigned flags = ir_op_info_of(op->kind)->flags;
    return (flags & IR_OPF_PURE) && !(flags & (IR_OPF_STATEFUL | IR_OPF_SIDE_EFFECT));
}

/* Merges op `index` into an equal earlier op, or remembers it. */
static void eliminate_common(canonicalizer *c, uint32_t index) {
    const ir_op *op = &c->m->ops[index];
    if (!mergeable(op)) return;
    for (uint32_t slot = (uint32_t)hash_op(c->m, op) & c->table_mask;; slot = (slot + 1) & c->table_mask) {
        if (c->table[slot] == 0) {
            c->table[slot] = index + 1;
            return;
        }
        uint32_t other = c->table[slot] - 1;
        if (same_op(c->m, &c->m->ops[other], op)) {
            replace_op(c, index, other);
            return;
        }
    }
}

/* ---- the rounds ------------------------------------------------------------------- */

static void forward_sweep(canonicalizer *c) {
    ir_module *m = c->m;
    memset(c->table, 0, ((size_t)c->table_mask + 1) * sizeof *c->table);
    for (uint32_t i = 0; i < m->op_count; i++) {
        ir_op *op = &m->ops[i];
        if (op->dead) continue;
        for (uint32_t j = 0; j < op->operand_count; j++) {
            ir_value_id to = resolve(c, op->operands[j]);
            if (to != op->operands[j]) {
                op->operands[j] = to;
                c->changed = true;
            }
        }
        if (rewrite(c, i)) eliminate_common(c, i);
    }
}

/* Marks unused ops dead, last to first, so that chains go in one sweep. */
static void remove_unused(canonicalizer *c) {
    ir_module *m = c->m;
    uint32_t *uses = ir_use_counts(m);
    for (uint32_t i = m->op_count; i-- > 0;) {
        ir_op *op = &m->ops[i];
        if (op->dead || op->kind == IR_OP_INPUT || (ir_op_info_of(op->kind)->flags & IR_OPF_SIDE_EFFECT))
            continue;
        bool used = false;
        for (uint32_t r = 0; r < op->result_count && !used; r++)
            used = uses[op->results[r]] > 0;
        if (used) continue;
        op->dead = true;
        c->changed = true;
        for (uint32_t j = 0; j < op->operand_count; j++)
            uses[op->operands[j]]--;
    }
    free(uses);
}

/* Types known and ids in range; reports the first op that is not ready. */
static bool ready(const ir_module *m, diag_engine *d) {
    for (uint32_t i = 0; i < m->op_count; i++) {
        const ir_op *op = &m->ops[i];
        if (op->dead) continue;
        bool ids_ok = (unsigned)op->kind < IR_OP_COUNT;
        for (uint32_t j = 0; ids_ok && j < op->operand_count; j++)
            ids_ok = op->operands[j] < m->value_count && m->values[op->operands[j]].def_op < m->op_count;
        for (uint32_t r = 0; ids_ok && r < op->result_count; r++)
            ids_ok = op->results[r] < m->value_count;
        if (!ids_ok) {
            diag_error(d, op->loc, "canonicalize needs a module that verifies; op %u does not", i);
            return false;
        }
        for (uint32_t r = 0; r < op->result_count; r++) {
            if (m->values[op->results[r]].type.dtype != SMELT_DTYPE_UNKNOWN) continue;
            diag_error(d, op->loc, "canonicalize needs inferred types; run infer-shapes first");
            return false;
        }
    }
    return true;
}

bool pass_canonicalize(ir_module *m, diag_engine *d) {
    if (!ready(m, d)) return false;
    if (m->op_count > UINT32_MAX / 4) {
        diag_error(d, SMELT_NO_LOC, "canonicalize: %u ops are more than it can index", m->op_count);
        return false;
    }
    for (uint32_t i = 0; i < m->op_count; i++)
        if (!m->ops[i].dead) ir_op_fill_defaults(m, i);
    uint32_t capacity = 16;
    while (capacity < 2 * (uint64_t)m->op_count + 1)
        capacity *= 2;
    canonicalizer c = {.m = m, .table_mask = capacity - 1};
    c.forward = malloc((m->value_count ? m->value_count : 1) * sizeof *c.forward);
    c.table = malloc(capacity * sizeof *c.table);
    if (!c.forward || !c.table) {
        free(c.forward);
        free(c.table);
        diag_error(d, SMELT_NO_LOC, "out of memory");
        return false;
    }
    arena_recovery recovery; /* rewrites allocate: free the tables, then fail the pass */
    if (arena_recovery_enter(&recovery, setjmp(recovery.where))) {
        free(c.forward);
        free(c.table);
        arena_out_of_memory();
    }
    for (ir_value_id v = 0; v < m->value_count; v++)
        c.forward[v] = v;
    for (unsigned round = 0; round < CANONICALIZE_MAX_ROUNDS; round++) {
        c.changed = false;
        forward_sweep(&c);
        remove_unused(&c);
        ir_module_compact(m);
        if (!c.changed) break;
    }
    arena_recovery_leave(&recovery);
    free(c.forward);
    free(c.table);
    return true;
}
