/* fuse.c - the fuse pass: which ops run together as one kernel.
 *
 * Requires: a verified module.
 * Guarantees: every op that does work on a device (ir_op_launches: not a
 *   declaration — input, weight, const, output — and not a view such as
 *   reshape) belongs to exactly one kernel group, op.group; groups are
 *   numbered 0, 1, ... in program order of their first op; declarations and
 *   views have no group. Every value a group reads from another group is
 *   made by a group whose first op comes earlier, so program order of first
 *   ops is a valid launch order. Codegen renders one group as one kernel (or
 *   one GEMM), reading the group's inputs and writing its outputs
 *   (codegen/emit.h).
 * Rules (each a function below; none with pass_options.no_fuse, which keeps
 *   separate weights and one op per group — the kernels smelt had before
 *   fusion). First a rewrite:
 *   - concat_sibling_weights: sibling matmuls (one x, out_in weights of one
 *     dtype that nothing else reads, all with a bias or none) become one
 *     matmul over concat(weights) {axis = 0} — a weight concatenated at
 *     compile time: it launches nothing, has the weight-table entry
 *     (plan-memory) and is filled from the parts by their names — with the
 *     biases concatenated likewise, and a split of its result; refused where
 *     a weight is read elsewhere (it would be held twice), dtypes or biases
 *     differ, or a part is declared after a reader of a sibling's result.
 *   - share_rope_tables: every rope reads the cos and sin of its angles
 *     from a rope_table(pos) with its frequencies, one per positions input
 *     and set of frequencies, inserted after pos is defined: the step
 *     computes them once, in one small kernel before the layers, instead
 *     of every rope (or GEMV epilogue) computing them for its own heads.
 *   Then the groups. They build the fused groups codegen has emitters for:
 *   a GEMV group (codegen/emit_gemv.c), matmuls over one input, each weight
 *   read once by one kernel, with
 *   - fuse_sibling_matmuls: matmuls (out_in layout, a [N, K] weight) that
 *     read the same [T, K] value and whose weights share a dtype (Q, K and
 *     V; gate and up) — one kernel over the weights side by side, as if
 *     concatenated along N;
 *   - fuse_quantize_with_readers: a quantize (precision's, for FP8 W8A8)
 *     whose readers — the act_codes matmuls taking its codes and scales —
 *     are all in one group joins it (alone when they are in several); the
 *     GEMV kernel at decode skips it and reads x, the group's ops one by one
 *     at prefill run it as the norm's epilogue (codegen); it counts as no
 *     op of the GEMV group where the rules below ask for one;
 *   - fuse_norm_prologue: the rms_norm that makes that value, when the
 *     group's matmuls (and its quantize of that value) are its only
 *     readers;
 *   - fuse_epilogues: on each matmul's result, when the next op is its only
 *     reader: a bias add (a [N] weight), then one of: a residual add (an
 *     operand of exactly the result's type), rope through a reshape to
 *     [T, H, Dh], or SwiGLU — silu of it times the result of a sibling;
 *     on a matmul over concatenated weights, the split of its result and
 *     then that chain on each part;
 *   - fuse_kv_cache_write: an attention op whose k and v are made by one
 *     fused GEMV group (k through rope or plain, v plain) gets
 *     cache_written_upto = IR_GEMV_MAX_TOKENS: that kernel writes the K/V
 *     cache in its epilogue in the steps it runs, so the attention group
 *     only reads the cache there (it writes it itself in larger steps) —
 *     or the token dim's bound, when k and v are parts of a matmul over
 *     concatenated weights: its GEMM's epilogue kernel writes the cache in
 *     the larger steps, so attention never does; not for an f8e4m3 cache
 *     (kv_dtype), whose scale per row needs the whole head that no single
 *     unit of the GEMV sees;
 *   and, where no GEMV group took the norm (GPT-2's in_out matmuls; a norm
 *   read by other ops),
 *   - fuse_residual_norm: add(a, b) and the rms_norm or layer_norm of its
 *     result, a, b and the result of one type [T, D]: one kernel writes the
 *     new residual and the normalised row (codegen/emit_norm.c);
 *   and last, among the ops left in groups of elementwise ops only,
 *   - fuse_elementwise_chains: an elementwise op whose result has one
 *     reader, elementwise with a result of the same dtype, joins the
 *     reader's group: one kernel computes the chain in registers
 *     (codegen/emit_elementwise.c).
 *   Other rules never merge a value that something outside the group reads
 *   (it would have to be written anyway), nor shapes or dtypes the kernel
 *   does not take; tests/ir/fuse.ir, fuse-concat.ir and fuse-chains.ir have
 *   a case for each refusal.
 * Breaks: schedule and plan-memory (their annotations are cleared: a new
 *   grouping needs a new order and a new memory plan).
 */
#include "interface.h"
#include "pass.h"
#include "quant.h"
#include "rope.h"

#include <stdlib.h>
#include <string.h>

typedef struct fuse_state {
    ir_module *m;
    uint32_t *leader;     /* [op_count] first op of the op's group; IR_NONE: no group */
    uint32_t *uses;       /* [value_count] readers (ir_use_counts) */
    uint32_t *reader;     /* [value_count] the op reading it when uses == 1 */
    ir_value_id *root;    /* [value_count] view roots (ir_view_roots) */
    int32_t token_symbol; /* the token dim (ir/interface.h), or -1 */
} fuse_state;

/* ---- groups ----------------------------------------------------------------------------- */

static uint32_t producer_group(const fuse_state *s, ir_value_id v) {
    return s->leader[s->m->values[s->root[v]].def_op];
}

/* Merges the groups led by a and b, when every value the merged group reads
 * from another group comes from one that starts before it. */
static bool merge_groups(fuse_state *s, uint32_t a, uint32_t b) {
    if (a == b) return true;
    uint32_t first = a < b ? a : b;
    const ir_module *m = s->m;
    for (uint32_t i = first; i < m->op_count; i++) {
        if (s->leader[i] != a && s->leader[i] != b) continue;
        const ir_op *op = &m->ops[i];
        for (uint32_t j = 0; j < op->operand_count; j++) {
            uint32_t g = producer_group(s, op->operands[j]);
            if (g != IR_NONE && g != a && g != b && g > first) return false;
        }
    }
    for (uint32_t i = first; i < m->op_count; i++)
        if (s->leader[i] == a || s->leader[i] == b) s->leader[i] = first;
    return true;
}

/* ---- what a GEMV group may hold ----------------------------------------------------------- */

static const ir_type *type_of(const fuse_state *s, ir_value_id v) { return &s->m->values[v].type; }

static const ir_op *def_of(const fuse_state *s, ir_value_id v) { return &s->m->ops[s->m->values[v].def_op]; }

/* A weight, or weights concatenated at compile time (concat_sibling_weights). */
static bool is_weight(const fuse_state *s, ir_value_id v) {
    return def_of(s, v)->kind == IR_OP_WEIGHT || ir_op_is_weight_concat(s->m, s->m->values[v].def_op);
}

static bool is_float(const ir_type *t) {
    return t->dtype == SMELT_DTYPE_F32 || t->dtype == SMELT_DTYPE_BF16 || t->dtype == SMELT_DTYPE_F16;
}

/* [tokens, n] with a constant n, in f32, bf16 or f16. */
static bool is_token_rows(const fuse_state *s, const ir_type *t) {
    return t->rank == 2 && s->token_symbol >= 0 && t->dims[0].symbol == s->token_symbol &&
           !ir_dim_is_symbol(t->dims[1]) && is_float(t);
}

/* The weights of v and w are stored alike: one dtype and, when quantized,
 * one format (the GEMV kernel dequantizes every row the same way). */
static bool same_storage(const fuse_state *s, ir_value_id v, ir_value_id w) {
    quant_format a, b;
    bool qa = ir_weight_quant(s->m, s->m->values[v].def_op, &a),
         qb = ir_weight_quant(s->m, s->m->values[w].def_op, &b);
    return type_of(s, v)->dtype == type_of(s, w)->dtype && qa == qb &&
           (!qa || quant_format_same_storage(&a, &b));
}

/* A matmul the GEMV kernel takes: x [T, K], an out_in weight [N, K] (float,
 * or quantized: precision), an optional [N] weight as bias, a [T, N] float
 * result. */
static bool is_gemv_matmul(const fuse_state *s, uint32_t i) {
    const ir_module *m = s->m;
    const ir_op *op = &m->ops[i];
    if (op->dead || op->kind != IR_OP_MATMUL || strcmp(ir_op_string(m, i, "layout"), "out_in") != 0)
        return false;
    const ir_type *x = type_of(s, op->operands[0]), *w = type_of(s, op->operands[1]);
    const ir_type *y = type_of(s, op->results[0]);
    if (!is_token_rows(s, x) || !is_token_rows(s, y) || !is_weight(s, op->operands[1]) || w->rank != 2 ||
        !(is_float(w) || ir_weight_quant(m, m->values[op->operands[1]].def_op, &(quant_format){0})) ||
        ir_dim_is_symbol(w->dims[0]) || w->dims[1].size != x->dims[1].size ||
        w->dims[0].size != y->dims[1].size)
        return false;
    ir_value_id bias = ir_matmul_bias(m, i);
    if (bias != IR_NO_VALUE) {
        const ir_type *b = type_of(s, bias);
        if (!is_weight(s, bias) || b->rank != 1 || !is_float(b) || b->dims[0].size != w->dims[0].size)
            return false;
    }
    return true;
}

/* The one op reading v, or IR_NONE (no reader, several, or the output). */
static uint32_t only_reader(const fuse_state *s, ir_value_id v) {
    if (s->uses[v] != 1) return IR_NONE;
    uint32_t r = s->reader[v];
    return s->m->ops[r].kind == IR_OP_OUTPUT ? IR_NONE : r;
}

/* ---- weights concatenated at compile time --------------------------------------------------- */

enum { CONCAT_MAX_MEMBERS = 8 }; /* the GEMV kernel's outputs (codegen/emit_gemv.c) */

/* One matmul of a concatenation: y = matmul(x, weight) (+ bias, as its
 * third operand or as the add that is y's only reader). `result` is what a
 * result of the split replaces: y, or the bias add's result. */
typedef struct concat_member {
    uint32_t matmul, bias_add; /* bias_add: IR_NONE when none */
    ir_value_id weight, bias, result;
} concat_member;

static const ir_type *concat_type(const fuse_state *c, ir_value_id v) { return &c->m->values[v].type; }

/* A weight the concatenation may take: declared by a plain weight op (not
 * stacked, not quantized, row-major, not transposed: a part is bound as its
 * tensor's rows), float, read by nothing else. */
static bool concat_weight(const fuse_state *c, ir_value_id v, unsigned rank) {
    const ir_module *m = c->m;
    uint32_t def = m->values[v].def_op;
    const ir_type *t = concat_type(c, v);
    if (m->ops[def].kind != IR_OP_WEIGHT || c->uses[v] != 1 || t->rank != rank || !is_float(t) ||
        ir_op_string(m, def, "stack")[0] != '\0' || strcmp(ir_op_string(m, def, "quant"), "none") != 0 ||
        strcmp(ir_op_string(m, def, "layout"), "row_major") != 0 || ir_op_bool(m, def, "transposed"))
        return false;
    for (unsigned d = 0; d < rank; d++)
        if (ir_dim_is_symbol(t->dims[d])) return false;
    return true;
}

/* Matmul i as a member: x [T, K] and y [T, N] float, an out_in [N, K] weight. */
static bool concat_member_of(const fuse_state *c, uint32_t i, concat_member *out) {
    const ir_module *m = c->m;
    const ir_op *op = &m->ops[i];
    if (op->dead || op->kind != IR_OP_MATMUL || strcmp(ir_op_string(m, i, "layout"), "out_in") != 0)
        return false;
    const ir_type *x = concat_type(c, op->operands[0]), *y = concat_type(c, op->results[0]);
    ir_value_id codes, scales; /* a matmul over quantize codes has a quantized weight: never concatenated */
    if (ir_matmul_act_codes(m, i, &codes, &scales) || x->rank != 2 || y->rank != 2 || c->token_symbol < 0 ||
        x->dims[0].symbol != c->token_symbol || y->dims[0].symbol != c->token_symbol ||
        ir_dim_is_symbol(x->dims[1]) || !is_float(x) || !is_float(y) || !concat_weight(c, op->operands[1], 2))
        return false;
    const ir_type *w = concat_type(c, op->operands[1]);
    if (w->dims[1].size != x->dims[1].size || w->dims[0].size != y->dims[1].size) return false;
    *out = (concat_member){i, IR_NONE, op->operands[1], IR_NO_VALUE, op->results[0]};
    ir_value_id bias = ir_matmul_bias(m, i);
    if (bias != IR_NO_VALUE) {
        if (!concat_weight(c, bias, 1) || concat_type(c, bias)->dims[0].size != w->dims[0].size) return false;
        out->bias = bias;
        return true;
    }
    ir_value_id v = op->results[0];
    if (c->uses[v] != 1) return true;
    uint32_t r = c->reader[v];
    const ir_op *add = &m->ops[r];
    if (add->kind != IR_OP_ADD) return true;
    ir_value_id b = add->operands[0] == v ? add->operands[1] : add->operands[0];
    if (b != v && concat_weight(c, b, 1) && concat_type(c, b)->dims[0].size == w->dims[0].size &&
        ir_type_equal(concat_type(c, add->results[0]), y)) {
        out->bias_add = r;
        out->bias = b;
        out->result = add->results[0];
    }
    return true;
}

/* Can b join a concatenation led by a: the same x, dtypes of weight, bias
 * and result, both with a bias or neither. */
static bool concat_siblings(const fuse_state *c, const concat_member *a, const concat_member *b) {
    const ir_module *m = c->m;
    if (m->ops[a->matmul].operands[0] != m->ops[b->matmul].operands[0] ||
        concat_type(c, a->weight)->dtype != concat_type(c, b->weight)->dtype ||
        concat_type(c, a->result)->dtype != concat_type(c, b->result)->dtype ||
        (a->bias == IR_NO_VALUE) != (b->bias == IR_NO_VALUE))
        return false;
    return a->bias == IR_NO_VALUE || concat_type(c, a->bias)->dtype == concat_type(c, b->bias)->dtype;
}

/* concat(parts...) {axis = 0} of the members' weights (or biases) at `at`. */
static ir_value_id insert_weight_concat(fuse_state *c, uint32_t at, const ir_value_id *parts, uint32_t count,
                                        smelt_loc loc) {
    ir_module *m = c->m;
    uint32_t op = ir_insert_op(m, at, IR_OP_CONCAT, parts, count, 1, loc);
    ir_op_fill_defaults(m, op);
    ir_op_set_int(m, op, "axis", 0);
    ir_type t = *concat_type(c, parts[0]);
    for (uint32_t j = 1; j < count; j++)
        t.dims[0].size += concat_type(c, parts[j])->dims[0].size;
    m->values[m->ops[op].results[0]].type = t;
    return m->ops[op].results[0];
}

/* Replaces the members by one matmul over their weights (and biases)
 * concatenated along N, and a split of its result into theirs. Returns the
 * ops inserted, 0 when the members' operands are not all defined before the
 * first reader of their results (the new ops go between them). */
static uint32_t concat_members(fuse_state *c, const concat_member *members, uint32_t count) {
    ir_module *m = c->m;
    const ir_op *first = &m->ops[members[0].matmul];
    uint32_t at = m->values[first->operands[0]].def_op + 1, first_use = UINT32_MAX;
    for (uint32_t k = 0; k < count; k++) {
        ir_value_id defined[2] = {members[k].weight, members[k].bias};
        for (int j = 0; j < 2; j++)
            if (defined[j] != IR_NO_VALUE && m->values[defined[j]].def_op + 1 > at)
                at = m->values[defined[j]].def_op + 1;
    }
    for (uint32_t i = 0; i < m->op_count; i++) {
        const ir_op *op = &m->ops[i];
        for (uint32_t j = 0; j < op->operand_count && !op->dead && i < first_use; j++)
            for (uint32_t k = 0; k < count; k++)
                if (op->operands[j] == members[k].result) first_use = i;
    }
    if (at > first_use) return 0;
    smelt_loc loc = first->loc;
    ir_value_id x = first->operands[0], weights[CONCAT_MAX_MEMBERS], biases[CONCAT_MAX_MEMBERS];
    ir_type y = *concat_type(c, members[0].result);
    y.dims[1].size = 0;
    ir_attr sizes = {.kind = IR_ATTR_INTS,
                     .as.ints = {count, arena_array(&m->arena, count, sizeof(int64_t))}};
    for (uint32_t k = 0; k < count; k++) {
        weights[k] = members[k].weight;
        biases[k] = members[k].bias;
        sizes.as.ints.items[k] = concat_type(c, members[k].result)->dims[1].size;
        y.dims[1].size += sizes.as.ints.items[k];
        m->ops[members[k].matmul].dead = true;
        if (members[k].bias_add != IR_NONE) m->ops[members[k].bias_add].dead = true;
    }
    uint32_t inserted = 0;
    ir_value_id operands[3] = {x, insert_weight_concat(c, at + inserted++, weights, count, loc), IR_NO_VALUE};
    if (members[0].bias != IR_NO_VALUE)
        operands[2] = insert_weight_concat(c, at + inserted++, biases, count, loc);
    uint32_t matmul =
        ir_insert_op(m, at + inserted++, IR_OP_MATMUL, operands, operands[2] != IR_NO_VALUE ? 3 : 2, 1, loc);
    ir_op_fill_defaults(m, matmul);
    ir_op_set_string(m, matmul, "layout", "out_in");
    ir_value_id joined = m->ops[matmul].results[0];
    m->values[joined].type = y;
    uint32_t split = ir_insert_op(m, at + inserted++, IR_OP_SPLIT, &joined, 1, count, loc);
    ir_op_fill_defaults(m, split);
    ir_op_set_int(m, split, "axis", 1);
    ir_op_set_attr(m, split, "sizes", &sizes);
    for (uint32_t k = 0; k < count; k++) {
        ir_value_id part = m->ops[split].results[k];
        m->values[part].type = *concat_type(c, members[k].result);
        ir_replace_uses(m, members[k].result, part);
    }
    return inserted;
}

/* The use tables of the module as it is now (after a rewrite, again):
 * readers of each value, and the op reading it when there is one. */
static void count_uses(fuse_state *c) {
    ir_module *m = c->m;
    free(c->uses);
    c->uses = NULL;
    c->uses = ir_use_counts(m);
    free(c->reader);
    c->reader = NULL;
    c->reader = malloc((m->value_count ? m->value_count : 1) * sizeof *c->reader);
    if (!c->reader) arena_out_of_memory();
    for (uint32_t i = 0; i < m->op_count; i++)
        if (!m->ops[i].dead)
            for (uint32_t j = 0; j < m->ops[i].operand_count; j++)
                c->reader[m->ops[i].operands[j]] = i;
}

/* Sibling matmuls (the same x, out_in weights of one dtype that nothing
 * else reads, all with a bias or none: Q, K and V; gate and up) become one
 * matmul over their weights concatenated along N at compile time
 * (concat {axis = 0} of weights, which launches nothing: the plan holds the
 * one [sum N, K] weight, filled from the parts by their names), with their
 * biases likewise, and a split of its [T, sum N] result into theirs. The
 * decode GEMV reads that weight; a prefill step runs one GEMM over it. */
static void concat_sibling_weights(fuse_state *c) {
    ir_module *m = c->m;
    c->token_symbol = ir_token_symbol(m);
    count_uses(c);
    for (uint32_t i = 0; i < m->op_count; i++) {
        concat_member members[CONCAT_MAX_MEMBERS];
        if (!concat_member_of(c, i, &members[0])) continue;
        uint32_t count = 1;
        for (uint32_t j = i + 1; j < m->op_count && count < CONCAT_MAX_MEMBERS; j++)
            if (concat_member_of(c, j, &members[count]) && concat_siblings(c, &members[0], &members[count]))
                count++;
        if (count < 2) continue;
        uint32_t inserted = concat_members(c, members, count);
        if (inserted == 0) continue;
        count_uses(c);
    }
}

/* ---- one rope table per step ------------------------------------------------------------- */

/* rope_table(pos) with rope op `rope`'s frequencies (rotary_dim resolved
 * resolved), inserted right after pos is defined (and the tables made
 * before it): a kernel of the step that reads only the inputs. Returns its
 * value. */
static ir_value_id insert_rope_table(fuse_state *c, uint32_t rope, const ir_rope_params *params) {
    ir_module *m = c->m;
    ir_value_id pos = m->ops[rope].operands[1];
    smelt_loc loc = m->ops[rope].loc;
    uint32_t at = m->values[pos].def_op + 1;
    while (at < rope && m->ops[at].kind == IR_OP_ROPE_TABLE) /* after the tables before it */
        at++;
    uint32_t table = ir_insert_op(m, at, IR_OP_ROPE_TABLE, &pos, 1, 1, loc);
    rope++; /* inserted before it */
    const ir_op_info *info = ir_op_info_of(IR_OP_ROPE_TABLE);
    for (uint32_t a = 0; a < info->attr_count; a++) {
        const ir_attr *given = ir_op_attr(m, rope, info->attrs[a].name);
        if (given) ir_op_set_attr(m, table, info->attrs[a].name, given);
    }
    ir_op_set_int(m, table, "rotary_dim", params->rotary_dim);
    ir_op_fill_defaults(m, table);
    ir_type *t = &m->values[m->ops[table].results[0]].type;
    *t = (ir_type){.dtype = SMELT_DTYPE_F32, .rank = 3};
    t->dims[0] = m->values[pos].type.dims[0];
    t->dims[1] = ir_dim_const(params->rotary_dim / 2);
    t->dims[2] = ir_dim_const(2);
    return m->ops[table].results[0];
}

/* Every rope reads the cos and sin of its angles from a rope_table that
 * the ropes of one positions input and one set of frequencies share (every
 * layer's q and k of a Llama: one table; Gemma 3's local and global
 * layers: two), computed once per step instead of in each rope's kernel;
 * a rope that reads one already keeps it. The table is f32 under every
 * preset (ir/ops.def). */
static void share_rope_tables(fuse_state *c) {
    ir_module *m = c->m;
    for (uint32_t i = 0; i < m->op_count; i++) {
        if (m->ops[i].dead || m->ops[i].kind != IR_OP_ROPE || m->ops[i].operand_count != 2) continue;
        const ir_type *x = &m->values[m->ops[i].operands[0]].type;
        ir_rope_params params = ir_rope_params_of(m, i, x->dims[2].size);
        ir_value_id pos = m->ops[i].operands[1], table = IR_NO_VALUE;
        for (uint32_t j = 0; j < m->op_count && table == IR_NO_VALUE; j++) {
            const ir_op *t = &m->ops[j];
            if (t->dead || t->kind != IR_OP_ROPE_TABLE || t->operands[0] != pos) continue;
            ir_rope_params theirs = ir_rope_table_params_of(m, j);
            if (ir_rope_params_equal(&params, &theirs)) table = t->results[0];
        }
        if (table == IR_NO_VALUE) {
            table = insert_rope_table(c, i, &params);
            i++; /* the rope moved one op on */
        }
        ir_op *rope = &m->ops[i];
        ir_value_id *operands = arena_array(&m->arena, 3, sizeof *operands);
        operands[0] = rope->operands[0];
        operands[1] = rope->operands[1];
        operands[2] = table;
        rope->operands = operands;
        rope->operand_count = 3;
    }
}

/* ---- the rules ---------------------------------------------------------------------------- */

/* Matmuls reading the same x with weights stored alike: one group. */
static void fuse_sibling_matmuls(fuse_state *s) {
    const ir_module *m = s->m;
    for (uint32_t i = 0; i < m->op_count; i++) {
        if (!is_gemv_matmul(s, i)) continue;
        const ir_op *a = &m->ops[i];
        for (uint32_t j = i + 1; j < m->op_count; j++) {
            if (!is_gemv_matmul(s, j) || s->leader[j] == s->leader[i]) continue;
            const ir_op *b = &m->ops[j];
            if (b->operands[0] != a->operands[0] || !same_storage(s, b->operands[1], a->operands[1]))
                continue;
            merge_groups(s, s->leader[i], s->leader[j]);
        }
    }
}

/* A quantize whose readers (the act_codes matmuls reading its codes and
 * scales) are all in one group joins that group: the norm + Q, K, V group
 * at decode, whose GEMV reads x and skips the quantize, and whose ops run
 * one by one at prefill, where the quantize is one kernel with the norm
 * before it (codegen). Readers in several groups: it stays alone. */
static void fuse_quantize_with_readers(fuse_state *s) {
    const ir_module *m = s->m;
    for (uint32_t i = 0; i < m->op_count; i++) {
        const ir_op *q = &m->ops[i];
        if (q->dead || q->kind != IR_OP_QUANTIZE) continue;
        uint32_t group = IR_NONE;
        bool one_group = true;
        for (uint32_t j = i + 1; j < m->op_count && one_group; j++) {
            const ir_op *op = &m->ops[j];
            for (uint32_t k = 0; k < op->operand_count && !op->dead && one_group; k++) {
                if (op->operands[k] != q->results[0] && op->operands[k] != q->results[1]) continue;
                one_group = s->leader[j] != IR_NONE && (group == IR_NONE || s->leader[j] == group);
                group = s->leader[j];
            }
        }
        if (one_group && group != IR_NONE) merge_groups(s, s->leader[i], group);
    }
}

/* rms_norm(h [T, K], w [K]) whose every reader is a matmul of one GEMV group
 * (or the quantize of that group, which codes the norm's result for them). */
static void fuse_norm_prologue(fuse_state *s) {
    const ir_module *m = s->m;
    for (uint32_t i = 0; i < m->op_count; i++) {
        const ir_op *norm = &m->ops[i];
        if (norm->dead || norm->kind != IR_OP_RMS_NORM || !is_token_rows(s, type_of(s, norm->operands[0])))
            continue;
        ir_value_id x = norm->results[0];
        uint32_t group = IR_NONE, readers = 0, matmuls = 0;
        bool all_matmuls = true;
        for (uint32_t j = i + 1; j < m->op_count && all_matmuls; j++) {
            const ir_op *op = &m->ops[j];
            if (op->dead) continue;
            for (uint32_t k = 0; k < op->operand_count; k++) {
                if (op->operands[k] != x) continue;
                readers++;
                bool matmul = is_gemv_matmul(s, j);
                matmuls += matmul;
                /* a quantize fits when it is in the matmuls' group: the check below */
                bool fits = k == 0 && (matmul || m->ops[j].kind == IR_OP_QUANTIZE) &&
                            (group == IR_NONE || s->leader[j] == group);
                if (!fits) all_matmuls = false;
                group = s->leader[j];
            }
        }
        if (all_matmuls && matmuls > 0 && readers == s->uses[x] && group != IR_NONE)
            merge_groups(s, s->leader[i], group);
    }
}

/* Op c (the only reader of the group's value it reads) joins group g. */
static bool absorb(fuse_state *s, uint32_t c, uint32_t g) { return merge_groups(s, g, s->leader[c]); }

static void fuse_epilogue_chain(fuse_state *s, uint32_t g, ir_value_id v);

/* The epilogue chain on the result of matmul i: bias, then residual | rope |
 * SwiGLU; or, on a matmul over concatenated weights, the split of its result
 * along N and a chain on each part. */
static void fuse_epilogue_of(fuse_state *s, uint32_t i) {
    ir_module *m = s->m;
    uint32_t g = s->leader[i];
    ir_value_id v = m->ops[i].results[0];
    uint32_t c = only_reader(s, v);
    if (c != IR_NONE && m->ops[c].kind == IR_OP_SPLIT &&
        (ir_op_int(m, c, "axis") == 1 || ir_op_int(m, c, "axis") == -1) &&
        type_of(s, v)->rank == 2) { /* axis 1 or -1: along N */
        bool floats = true;
        for (uint32_t r = 0; r < m->ops[c].result_count; r++)
            floats = floats && is_token_rows(s, type_of(s, m->ops[c].results[r]));
        if (!floats || !absorb(s, c, g)) return;
        for (uint32_t r = 0; r < m->ops[c].result_count; r++)
            fuse_epilogue_chain(s, g, m->ops[c].results[r]);
        return;
    }
    fuse_epilogue_chain(s, g, v);
}

/* The epilogue chain on v, a matmul's result (or a part of it) in group g. */
static void fuse_epilogue_chain(fuse_state *s, uint32_t g, ir_value_id v) {
    ir_module *m = s->m;
    uint32_t c = only_reader(s, v);
    if (c == IR_NONE) return;
    const ir_op *op = &m->ops[c];
    /* bias: add(v, b[N]) or add(b[N], v) */
    if (op->kind == IR_OP_ADD) {
        ir_value_id other = op->operands[0] == v ? op->operands[1] : op->operands[0];
        const ir_type *t = type_of(s, other);
        if (is_weight(s, other) && t->rank == 1 && is_float(t) &&
            t->dims[0].size == type_of(s, v)->dims[1].size &&
            ir_type_equal(type_of(s, op->results[0]), type_of(s, v))) {
            if (!absorb(s, c, g)) return;
            v = op->results[0];
            c = only_reader(s, v);
            if (c == IR_NONE) return;
            op = &m->ops[c];
        }
    }
    if (op->kind == IR_OP_ADD) { /* residual: add(v, r) with r of v's type */
        ir_value_id other = op->operands[0] == v ? op->operands[1] : op->operands[0];
        if (other != v && ir_type_equal(type_of(s, other), type_of(s, v)) &&
            ir_type_equal(type_of(s, op->results[0]), type_of(s, v)) && producer_group(s, other) != g)
            absorb(s, c, g);
        return;
    }
    if (op->kind == IR_OP_RESHAPE) { /* rope(reshape(v) [T, H, Dh], pos) */
        uint32_t r = only_reader(s, op->results[0]);
        const ir_type *t = type_of(s, op->results[0]);
        if (r == IR_NONE || m->ops[r].kind != IR_OP_ROPE || m->ops[r].operands[0] != op->results[0] ||
            t->rank != 3 || t->dims[0].symbol != s->token_symbol ||
            !is_float(type_of(s, m->ops[r].results[0])) ||
            /* longrope picks its frequencies per step: the rope kernel's (its table holds the
             * step's set, so the GEMV could rotate it, but Phi-3's bf16 fixture then rounds past
             * its bound: 0.021 of the logit range, against 0.0155 as its own kernel) */
            ir_rope_params_of(m, r, t->dims[2].size).scaling == IR_ROPE_LONGROPE)
            return;
        absorb(s, r, g);
        return;
    }
    if (op->kind == IR_OP_SILU) { /* mul(silu(v), u) with u a sibling's result */
        uint32_t mul = only_reader(s, op->results[0]);
        if (mul == IR_NONE || m->ops[mul].kind != IR_OP_MUL) return;
        const ir_op *mo = &m->ops[mul];
        ir_value_id u = mo->operands[0] == op->results[0] ? mo->operands[1] : mo->operands[0];
        if (u == op->results[0] || only_reader(s, u) != mul || s->leader[m->values[u].def_op] != g ||
            !ir_type_equal(type_of(s, u), type_of(s, v)) ||
            !ir_type_equal(type_of(s, mo->results[0]), type_of(s, v)) ||
            !ir_type_equal(type_of(s, op->results[0]), type_of(s, v)))
            return;
        const ir_op *ud = def_of(s, u);
        bool sibling = ud->kind == IR_OP_MATMUL || ud->kind == IR_OP_SPLIT ||
                       (ud->kind == IR_OP_ADD && def_of(s, ud->operands[0])->kind == IR_OP_MATMUL);
        if (sibling && absorb(s, c, g)) absorb(s, mul, g);
    }
}

static void fuse_epilogues(fuse_state *s) {
    for (uint32_t i = 0; i < s->m->op_count; i++)
        if (is_gemv_matmul(s, i)) fuse_epilogue_of(s, i);
}

/* The fused GEMV group (more than one op, one a matmul) whose segment
 * output v is: v made by a rope, a matmul or a bias add of that group.
 * IR_NONE otherwise. */
static uint32_t gemv_output_group(const fuse_state *s, ir_value_id v, bool rope_allowed) {
    const ir_module *m = s->m;
    uint32_t def = m->values[v].def_op, g = s->leader[def];
    ir_op_kind kind = m->ops[def].kind;
    if (g == IR_NONE || !(kind == IR_OP_MATMUL || kind == IR_OP_ADD || kind == IR_OP_SPLIT ||
                          (rope_allowed && kind == IR_OP_ROPE)))
        return IR_NONE;
    uint32_t ops = 0;
    bool matmul = false;
    for (uint32_t i = g; i < m->op_count; i++) /* a quantize is no part of the GEMV kernel */
        if (s->leader[i] == g && m->ops[i].kind != IR_OP_QUANTIZE) {
            ops++;
            matmul |= m->ops[i].kind == IR_OP_MATMUL;
        }
    return ops > 1 && matmul ? g : IR_NONE;
}

/* Ops in op i's group (1 for an op alone). */
static uint32_t group_size(const fuse_state *s, uint32_t i) {
    uint32_t g = s->leader[i], n = 0;
    for (uint32_t j = g; g != IR_NONE && j < s->m->op_count; j++)
        n += s->leader[j] == g;
    return n;
}

static void fuse_residual_norm(fuse_state *s) {
    const ir_module *m = s->m;
    for (uint32_t i = 0; i < m->op_count; i++) {
        const ir_op *norm = &m->ops[i];
        if (norm->dead || (norm->kind != IR_OP_RMS_NORM && norm->kind != IR_OP_LAYER_NORM) ||
            group_size(s, i) != 1 ||
            /* cg_emit_add_norm has no (1 + w) weights (Gemma's offset): the norm kernel's */
            (norm->kind == IR_OP_RMS_NORM && ir_op_float(m, i, "offset") != 0.0))
            continue;
        ir_value_id x = norm->operands[0];
        uint32_t add = m->values[x].def_op;
        const ir_op *ao = &m->ops[add];
        if (ao->kind != IR_OP_ADD || group_size(s, add) != 1 || !is_token_rows(s, type_of(s, x)) ||
            !ir_type_equal(type_of(s, ao->operands[0]), type_of(s, x)) ||
            !ir_type_equal(type_of(s, ao->operands[1]), type_of(s, x)) ||
            !ir_type_equal(type_of(s, norm->results[0]), type_of(s, x)))
            continue;
        merge_groups(s, s->leader[add], s->leader[i]);
    }
}

/* Is op i elementwise (add, mul, the activations: ops.def's flag), in a
 * group of elementwise ops only (alone, or a chain this rule made)? */
static bool in_elementwise_group(const fuse_state *s, uint32_t i) {
    const ir_module *m = s->m;
    uint32_t g = s->leader[i];
    if (m->ops[i].dead || g == IR_NONE) return false;
    for (uint32_t j = g; j < m->op_count; j++)
        if (s->leader[j] == g && !(ir_op_info_of(m->ops[j].kind)->flags & IR_OPF_ELEMENTWISE)) return false;
    return true;
}

/* An elementwise op whose result has one reader, an elementwise op whose
 * result has the same dtype, joins that reader's group, when both groups
 * hold elementwise ops only: Gemma 2's gelu(gate) * up and the mul and tanh
 * of its softcap, Qwen2-MoE's sigmoid gate and its mul. The chain is one
 * kernel over the elements of its last result, the inner values in
 * registers (codegen/emit_elementwise.c); a result that broadcasts into its
 * reader's (Qwen2-MoE's [T, 1] gate into [T, D]) is computed at each element
 * it reaches. Not merged: a result read twice or by an op of another kind
 * (a view that reshapes it, a norm), or by an op whose result has another
 * dtype (the bf16 softcap's last mul into f32 logits: the rounding to bf16
 * in between is the plan's). At most CHAIN_MAX_OPS ops (the emitter's
 * bound). */
enum { CHAIN_MAX_OPS = 16 };

static void fuse_elementwise_chains(fuse_state *s) {
    const ir_module *m = s->m;
    for (uint32_t i = 0; i < m->op_count; i++) {
        if (!in_elementwise_group(s, i) || m->ops[i].result_count != 1) continue;
        ir_value_id v = m->ops[i].results[0];
        uint32_t c = only_reader(s, v);
        if (c == IR_NONE || !in_elementwise_group(s, c) || s->leader[c] == s->leader[i] ||
            type_of(s, m->ops[c].results[0])->dtype != type_of(s, v)->dtype || !is_float(type_of(s, v)) ||
            group_size(s, i) + group_size(s, c) > CHAIN_MAX_OPS)
            continue;
        merge_groups(s, s->leader[i], s->leader[c]);
    }
}

/* Is v (or the value a rope of the group makes it from) a part of the split
 * of a matmul over a concatenated weight? Such a group runs, in steps above
 * the GEMV's, one GEMM and one epilogue kernel (codegen/emit_gemv.c), which
 * writes the KV cache too. */
static bool from_concatenated_matmul(const fuse_state *s, ir_value_id v) {
    const ir_module *m = s->m;
    const ir_op *def = def_of(s, v);
    if (def->kind == IR_OP_ROPE) def = def_of(s, s->root[def->operands[0]]);
    if (def->kind != IR_OP_SPLIT) return false;
    const ir_op *matmul = def_of(s, def->operands[0]);
    return matmul->kind == IR_OP_MATMUL && ir_op_is_weight_concat(m, m->values[matmul->operands[1]].def_op);
}

static void fuse_kv_cache_write(fuse_state *s) {
    ir_module *m = s->m;
    for (uint32_t i = 0; i < m->op_count; i++) {
        const ir_op *op = &m->ops[i];
        if (op->dead || op->kind != IR_OP_ATTENTION) continue;
        ir_value_id k = s->root[op->operands[1]], v = s->root[op->operands[2]];
        uint32_t g = gemv_output_group(s, k, true);
        if (g == IR_NONE || gemv_output_group(s, v, false) != g || !is_float(type_of(s, k)) ||
            !is_float(type_of(s, v)) || strcmp(ir_op_string(m, i, "kv_dtype"), "auto") != 0)
            continue;
        /* The GEMV writes the cache in its steps; a concatenated group's epilogue kernel in every larger one.
         */
        bool every_step =
            from_concatenated_matmul(s, k) && from_concatenated_matmul(s, v) && s->token_symbol >= 0;
        ir_op_set_int(m, i, "cache_written_upto",
                      every_step ? m->symbols[s->token_symbol].bound : IR_GEMV_MAX_TOKENS);
    }
}

/* ---- the pass ----------------------------------------------------------------------------- */

/* The rules, on the state's tables (allocated here, freed by the caller). */
static void apply_rules(fuse_state *s) {
    ir_module *m = s->m;
    s->token_symbol = ir_token_symbol(m);
    count_uses(s);
    s->root = ir_view_roots(m);
    if (!s->root) arena_out_of_memory();
    fuse_sibling_matmuls(s);
    fuse_quantize_with_readers(s);
    fuse_norm_prologue(s);
    fuse_epilogues(s);
    fuse_kv_cache_write(s);
    fuse_residual_norm(s);
    fuse_elementwise_chains(s);
}

static void free_state(fuse_state *s) {
    free(s->leader);
    free(s->uses);
    free(s->reader);
    free(s->root);
    free(s);
}

bool pass_fuse(ir_module *m, const pass_options *o, diag_engine *d) {
    /* On the heap, set before the recovery point: a jump out of the rules
     * (out of memory in the IR's arena) frees it, then fails the pass. */
    fuse_state *s = calloc(1, sizeof *s);
    if (!s) {
        diag_error(d, SMELT_NO_LOC, "out of memory fusing %u ops", m->op_count);
        return false;
    }
    s->m = m;
    arena_recovery recovery;
    if (arena_recovery_enter(&recovery, setjmp(recovery.where))) {
        free_state(s);
        arena_out_of_memory();
    }
    if (!(o && o->no_fuse)) { /* they insert ops: before the tables by op */
        concat_sibling_weights(s);
        share_rope_tables(s);
    }
    s->leader = malloc((m->op_count ? m->op_count : 1) * sizeof *s->leader);
    if (!s->leader) arena_out_of_memory();
    uint32_t *leader = s->leader;
    for (uint32_t i = 0; i < m->op_count; i++) {
        leader[i] = ir_op_launches(m, i) ? i : IR_NONE;
        const ir_attr *written = ir_op_attr(m, i, "cache_written_upto"); /* a rule's, set again below */
        if (written && written->kind == IR_ATTR_INT && written->as.i != 0)
            ir_op_set_int(m, i, "cache_written_upto", 0);
    }
    if (!(o && o->no_fuse)) apply_rules(s);
    arena_recovery_leave(&recovery);
    /* Groups numbered by their first op, in program order. */
    uint32_t groups = 0;
    for (uint32_t i = 0; i < m->op_count; i++) {
        ir_op *op = &m->ops[i];
        op->step = IR_NONE;
        op->group = IR_NONE;
        op->wanted_rows = false; /* wanted-rows marks whole groups */
        if (leader[i] == IR_NONE) continue;
        op->group = leader[i] == i ? groups++ : m->ops[leader[i]].group;
    }
    free_state(s);
    for (ir_value_id v = 0; v < m->value_count; v++)
        m->values[v].buffer = (ir_buffer){IR_BUFFER_NONE, 0};
    m->arena_bytes = 0;
    m->planned_tokens = 0;
    return true;
}
