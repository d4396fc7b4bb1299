/* emit_gemv.c - the fused GEMV kernel of a GEMV group (passes/fuse.c): the
 * matmuls of one input x [T, K] with their prologue and epilogues, for the
 * small token counts of a decode step.
 *
 * The group's matmuls are laid side by side as one weight of N rows — or
 * are one matmul over a weight concatenated at compile time (passes/fuse.c)
 * whose result a split takes apart, each part a segment starting at its
 * FIRST_ROW of that weight: the work is a list of segments,
 * one per group output, each a number of units; a unit — one or two
 * weight rows against the rows of x — runs on LANES (4) lanes of a warp,
 * so a warp holds 8 units and one shuffle reduces 8 sums (a group too small
 * to fill an H200 takes one lane a unit and no shuffles, gemv_shape):
 *
 *   plain   out[t, n] = x[t] . w[n] (+ bias[n]) (+ residual[t, n])
 *   swiglu  out[t, n] = silu(x[t] . gate[n] + bg[n]) * (x[t] . up[n] + bu[n])
 *           (the gate and up rows of n in one unit: both weights once)
 *   rope    the rotary pair (i, i + r/2) (neox) or (2i, 2i + 1) (interleaved)
 *           of a head in one unit, rotated by the cos and sin of pair i that
 *           the step's rope table holds for token t (passes/fuse.c; without
 *           a table, of pos[t] * inv_freq[i], the inverse frequencies baked
 *           in as emit_rope.c bakes them); the head dims past the rotary
 *           ones are plain units
 *
 * With an rms_norm prologue the kernel reads the norm's input h and its
 * weight g: x[t] . w[n] = inverse_rms(t) * sum_k w[n, k] h[t, k] g[k], and
 * the sum of squares of h[t] is accumulated in the same pass as the dot
 * product, so each unit gets it for free (no norm launch, no second pass).
 *
 * Every lane reads 8 consecutive elements of K at a time — one 128-bit load
 * of a bf16 weight row, two of an f32 one (smelt_load_global_128) — when K
 * is a multiple of 8 (every row then starts 16-byte aligned: the arena and
 * the weights are 256-byte aligned); otherwise one element at a time. The
 * partial sums are reduced across the unit's lanes with shuffles, in f32
 * (every lane of the warp runs the dot product and its shuffles together;
 * the units then part ways for their epilogues). Every
 * weight byte is read once for up to TOKEN_TILE tokens; larger T loops over
 * tiles of tokens (the plan runs the unfused lowering above the threshold,
 * codegen/lower.c). Blocks are WARPS warps (2, 4 or 8, block_warps), as
 * many as keep every SM of an H200 busy (Llama-3-8B: QKV, o and down 224 to
 * 256 blocks of 2 warps, gate/up 448 of 4, the lm_head 2004 of 8).
 *
 * Above those token counts a group over a concatenated weight runs one GEMM
 * and then this file's other kernel, the GEMM epilogue (below): the same
 * segments and epilogues, reading the GEMM's output columns instead of dot
 * products.
 * A unit's 4 lanes read 64 consecutive bytes of its bf16 row per load: whole
 * 32-byte sectors (a one-lane unit reads a sector's two halves in two loads).
 *
 * Quantized weights (quant/quant.h's packed layout, set by `precision`) are
 * read once as well and dequantized in registers, exactly as quant_value
 * defines: w = (q - z) * s (* c[k] with column scales), then the same f32
 * dot product. A lane then takes VECTOR = 32 int4 codes or 16 int8 / E4M3
 * codes at a time — one 128-bit load — with the group's f16 scale (and
 * zero point) read once per load, when K and the group are multiples of
 * VECTOR (else one code at a time); x and the norm weight are read with as
 * many 128-bit loads as those VECTOR elements take. All of a group's
 * weights share one format (passes/fuse.c). Interleaved int4 codes (layout
 * mma_k16, for the dequantize-GEMM) are read the same way, a load holding
 * the columns write_interleaved_quant_loader names. A matmul of a quantized
 * weight alone runs this kernel for steps of at most TOKEN_TILE tokens and
 * the tensor-core dequantize-GEMM above (emit_dequant_gemm.c) when that
 * takes it; otherwise this kernel at every step, tile by tile of TOKEN_TILE
 * tokens (docs/design.md §4).
 *
 * The quantize ops of a W8A8 group (the codes and scales of x that its
 * act_codes matmuls hand to a scaled GEMM above the fused range, ir/ops.def)
 * are skipped: this kernel codes x in registers as the quantize would; a
 * group whose codes or scales something outside it reads is refused.
 */
#include "emit_internal.h"

#include "ir_io.h"
#include "quant.h"
#include "rope.h"

#include <math.h>
#include <string.h>

enum { GEMV_LANES = 4, GEMV_TOKEN_TILE = IR_GEMV_MAX_TOKENS, GEMV_VECTOR = 8, GEMV_MAX_SEGMENTS = 8 };
enum { GEMV_INT4_VECTOR = 32, GEMV_BYTE_CODE_VECTOR = 16 }; /* codes per 128-bit load */

typedef enum gemv_kind { GEMV_PLAIN, GEMV_SWIGLU, GEMV_ROPE } gemv_kind;

typedef struct gemv_segment {
    gemv_kind kind;
    ir_value_id weight[2], bias[2]; /* [1]: swiglu's up; IR_NO_VALUE when absent */
    int64_t first_row[2];           /* of weight[r] and bias[r]: the part of a concatenated weight */
    ir_value_id residual, out;
    int64_t rows; /* N of the output */
    int64_t heads, head_dim, half, passed;
    bool interleaved;
    double theta;
    ir_rope_tables rope; /* the frequencies (ir/rope.c), in the scratch arena */
    uint32_t rope_op;
    ir_value_id table; /* the rope's rope_table [T, HALF, 2] (cos, sin); IR_NO_VALUE: angles computed */
    int64_t units;
    uint32_t attention; /* the attention op whose K (cache_role 1) or V (2) cache this output
                           goes to as well (cache_written_upto); IR_NONE */
    int cache_role;
    int64_t max_seq;
    double act_scale[2]; /* W8A8 with static scales: the act_scale_value of weight[r]'s matmul */
    uint32_t p_weight[2], p_bias[2], p_residual, p_out, p_cache, p_written, p_table; /* kernel parameters */
} gemv_segment;

typedef struct gemv_plan {
    ir_value_id x, norm_weight, pos;
    double eps, norm_offset; /* the norm's weights are norm_offset + w (Gemma: 1) */
    bool norm;
    int64_t k;
    uint32_t segment_count;
    gemv_segment segments[GEMV_MAX_SEGMENTS];
    bool quantized;       /* the weights are in quant/quant.h's packed layout, of this format: */
    quant_format format;  /* one for all of them */
    quant_kind act_quant; /* W8A8 (matmul act_quant, ir/ops.def): QUANT_INT8 or QUANT_FP8 when the
                             matmuls quantize their input as well; else QUANT_NONE */
    bool act_static;      /* W8A8: static per-tensor scales (act_scale "tensor", each segment's
                             act_scale), else each token's own */
} gemv_plan;

/* The op of the group reading v (directly, or a rope reading a reshape of
 * v when through_view); IR_NONE when none. *via receives the reshape. */
static uint32_t group_reader(const ir_module *m, const cg_group *g, ir_value_id v, bool through_view) {
    for (uint32_t i = 0; i < g->op_count; i++) {
        const ir_op *op = &m->ops[g->ops[i]];
        for (uint32_t j = 0; j < op->operand_count; j++) {
            ir_value_id operand = op->operands[j];
            if (operand == v) return g->ops[i];
            const ir_op *def = &m->ops[m->values[operand].def_op];
            if (through_view && def->kind == IR_OP_RESHAPE && def->operands[0] == v) return g->ops[i];
        }
    }
    return IR_NONE;
}

static bool is_output(const cg_group *g, ir_value_id v) {
    for (uint32_t i = 0; i < g->output_count; i++)
        if (g->outputs[i] == v) return true;
    return false;
}

static bool refuse(cg_emit *e, const char *why) {
    diag_error(e->d, e->ir->loc, "codegen cannot emit this GEMV group: %s", why);
    return false;
}

/* Position of op in g->ops, or UINT32_MAX. */
static uint32_t position_in(const cg_group *g, uint32_t op) {
    for (uint32_t i = 0; i < g->op_count; i++)
        if (g->ops[i] == op) return i;
    return UINT32_MAX;
}

/* What one segment computes before its epilogue: a matmul's result, or one
 * part of it that a split of the group takes (a matmul over a weight
 * concatenated at compile time, passes/fuse.c), rows [row, row + rows) of
 * its weight. */
typedef struct gemv_part {
    uint32_t matmul;
    ir_value_id value;
    int64_t row, rows;
    bool up; /* SwiGLU's up: read by its gate's segment */
} gemv_part;

typedef struct group_reading {
    cg_emit *e;
    const cg_group *g;
    bool *taken; /* [g->op_count] ops accounted for */
    gemv_part *parts;
    uint32_t part_count;
} group_reading;

static void take(group_reading *r, uint32_t op) {
    uint32_t at = position_in(r->g, op);
    if (at != UINT32_MAX) r->taken[at] = true;
}

/* The matmul of the group making v, directly or through a bias add of the
 * group (*bias receives the bias); IR_NONE when v is made otherwise. */
static uint32_t matmul_of(group_reading *r, ir_value_id v, ir_value_id *bias) {
    const ir_module *m = r->e->m;
    uint32_t def = m->values[v].def_op;
    *bias = IR_NO_VALUE;
    if (position_in(r->g, def) == UINT32_MAX) return IR_NONE;
    if (m->ops[def].kind == IR_OP_MATMUL) return def;
    if (m->ops[def].kind != IR_OP_ADD) return IR_NONE;
    for (uint32_t j = 0; j < 2; j++) {
        uint32_t inner = m->values[m->ops[def].operands[j]].def_op;
        ir_value_id other = m->ops[def].operands[1 - j];
        if (m->ops[inner].kind == IR_OP_MATMUL && position_in(r->g, inner) != UINT32_MAX &&
            m->ops[m->values[other].def_op].kind == IR_OP_WEIGHT) {
            *bias = other;
            take(r, def);
            return inner;
        }
    }
    return IR_NONE;
}

/* The part whose value is v, or made by the bias add that makes v
 * (*bias receives the bias); UINT32_MAX when none. */
static uint32_t part_of(group_reading *r, ir_value_id v, ir_value_id *bias) {
    *bias = IR_NO_VALUE;
    for (uint32_t i = 0; i < r->part_count; i++)
        if (r->parts[i].value == v) return i;
    uint32_t matmul = matmul_of(r, v, bias);
    for (uint32_t i = 0; matmul != IR_NONE && i < r->part_count; i++)
        if (r->parts[i].matmul == matmul && r->parts[i].value == r->e->m->ops[matmul].results[0]) return i;
    return UINT32_MAX;
}

/* The segment of part `which`: its weight and bias, then the chain of
 * epilogue ops of the group that read its value. */
static bool read_segment(group_reading *r, gemv_plan *p, uint32_t which) {
    cg_emit *e = r->e;
    const ir_module *m = e->m;
    const cg_group *g = r->g;
    const gemv_part *part = &r->parts[which];
    uint32_t index = part->matmul;
    const ir_op *op = &m->ops[index];
    if (strcmp(ir_op_string(m, index, "layout"), "out_in") != 0)
        return refuse(e, "a matmul that is not out_in");
    ir_value_id input = op->operands[0];
    if (p->norm) {
        const ir_op *def = &m->ops[m->values[input].def_op];
        if (def->kind != IR_OP_RMS_NORM || position_in(g, m->values[input].def_op) == UINT32_MAX)
            return refuse(e, "a matmul that does not read the group's norm");
        input = def->operands[0];
    }
    if (p->x != IR_NO_VALUE && p->x != input) return refuse(e, "matmuls of different inputs");
    p->x = input;
    if (p->segment_count == GEMV_MAX_SEGMENTS) return refuse(e, "too many outputs");
    gemv_segment *s = &p->segments[p->segment_count++];
    memset(s, 0, sizeof *s);
    s->kind = GEMV_PLAIN;
    s->weight[0] = op->operands[1];
    s->weight[1] = s->bias[1] = s->residual = s->table = IR_NO_VALUE;
    s->bias[0] = ir_matmul_bias(m, index);
    s->first_row[0] = part->row;
    s->rows = part->rows;
    take(r, index);
    ir_value_id v = part->value;
    for (uint32_t c; (c = group_reader(m, g, v, true)) != IR_NONE;) {
        const ir_op *co = &m->ops[c];
        take(r, c);
        if (co->kind == IR_OP_ADD) { /* bias (a [N] weight, first) or residual */
            ir_value_id other = co->operands[0] == v ? co->operands[1] : co->operands[0];
            bool weight =
                m->ops[m->values[other].def_op].kind == IR_OP_WEIGHT && m->values[other].type.rank == 1;
            if (weight && s->bias[0] == IR_NO_VALUE && s->residual == IR_NO_VALUE)
                s->bias[0] = other;
            else if (s->residual == IR_NO_VALUE && !weight)
                s->residual = other;
            else
                return refuse(e, "an add that is neither one bias nor one residual");
            v = co->results[0];
        } else if (co->kind == IR_OP_ROPE && s->residual == IR_NO_VALUE) {
            const ir_type *t = &m->values[co->operands[0]].type;
            s->kind = GEMV_ROPE;
            s->rope_op = c;
            s->heads = t->dims[1].size;
            s->head_dim = t->dims[2].size;
            ir_rope_params rope = ir_rope_params_of(m, c, s->head_dim);
            char why[256];
            if (!ir_rope_params_check(&rope, s->head_dim, why, sizeof why)) return refuse(e, why);
            int64_t rotary = rope.rotary_dim;
            if (rotary < 2 || rotary > s->head_dim) return refuse(e, "a rotary_dim outside [2, head dim]");
            ir_rope_tables_compute(
                &rope, arena_array(&e->scratch, ir_rope_tables_floats(&rope), sizeof(float)), &s->rope);
            s->table = co->operand_count == 3 ? co->operands[2] : IR_NO_VALUE;
            if (s->rope.long_inv_freq && s->table == IR_NO_VALUE)
                return refuse(e, "longrope without a rope table (its frequencies depend on the step)");
            s->half = rotary / 2;
            s->passed = s->head_dim - 2 * s->half;
            s->interleaved = strcmp(ir_op_string(m, c, "style"), "interleaved") == 0;
            s->theta = ir_op_float(m, c, "theta");
            if (s->table == IR_NO_VALUE) { /* the angles computed from the positions */
                if (p->pos != IR_NO_VALUE && p->pos != co->operands[1])
                    return refuse(e, "two position inputs");
                p->pos = co->operands[1];
            }
            v = co->results[0];
            break;
        } else if (co->kind == IR_OP_SILU && s->residual == IR_NO_VALUE) {
            uint32_t mul = group_reader(m, g, co->results[0], false);
            if (mul == IR_NONE || m->ops[mul].kind != IR_OP_MUL) return refuse(e, "a silu without its mul");
            const ir_op *mo = &m->ops[mul];
            ir_value_id u = mo->operands[0] == co->results[0] ? mo->operands[1] : mo->operands[0];
            uint32_t which_up = part_of(r, u, &s->bias[1]);
            if (which_up == UINT32_MAX || !r->parts[which_up].up || r->parts[which_up].rows != s->rows)
                return refuse(e, "a SwiGLU whose up is no matmul of the group");
            uint32_t up = r->parts[which_up].matmul;
            if (ir_matmul_bias(m, up) != IR_NO_VALUE) {
                if (s->bias[1] != IR_NO_VALUE) return refuse(e, "two biases on SwiGLU's up");
                s->bias[1] = ir_matmul_bias(m, up);
            }
            take(r, mul);
            take(r, up);
            s->kind = GEMV_SWIGLU;
            s->weight[1] = m->ops[up].operands[1];
            s->first_row[1] = r->parts[which_up].row;
            v = mo->results[0];
            break;
        } else {
            return refuse(e, "an op that is no epilogue the kernel has");
        }
    }
    if (!is_output(g, v)) return refuse(e, "a result that nothing outside the group reads");
    s->out = v;
    s->units = s->kind == GEMV_ROPE ? s->heads * (s->half + s->passed) : s->rows;
    return true;
}

/* v itself, or what v is a view (reshape) of. */
static ir_value_id view_root(const ir_module *m, ir_value_id v) {
    while (m->ops[m->values[v].def_op].kind == IR_OP_RESHAPE)
        v = m->ops[m->values[v].def_op].operands[0];
    return v;
}

/* The attention ops whose cache the fused kernel writes (cache_written_upto,
 * passes/fuse.c): their k and v are outputs of this group. */
static bool find_caches(cg_emit *e, gemv_plan *p) {
    const ir_module *m = e->m;
    for (uint32_t i = 0; i < p->segment_count; i++)
        p->segments[i].attention = IR_NONE;
    for (uint32_t a = 0; a < m->op_count; a++) {
        const ir_op *op = &m->ops[a];
        const ir_attr *upto = ir_op_attr(m, a, "cache_written_upto");
        if (op->dead || op->kind != IR_OP_ATTENTION || !upto || upto->kind != IR_ATTR_INT || upto->as.i == 0)
            continue;
        int found = 0;
        for (int role = 1; role <= 2; role++)
            for (uint32_t i = 0; i < p->segment_count; i++) {
                gemv_segment *s = &p->segments[i];
                if (view_root(m, op->operands[role]) != s->out) continue;
                if (s->attention != IR_NONE || s->kind == GEMV_SWIGLU || (role == 2 && s->kind != GEMV_PLAIN))
                    return refuse(e, "a KV cache write the kernel does not have");
                s->attention = a;
                s->cache_role = role;
                s->max_seq = ir_op_int(m, a, "max_seq");
                found++;
            }
        if (found == 0) continue;
        if (found != 2 || upto->as.i < IR_GEMV_MAX_TOKENS)
            return refuse(e, "an attention whose cache it writes only in part");
        if (p->pos != IR_NO_VALUE && p->pos != op->operands[3]) return refuse(e, "two position inputs");
        p->pos = op->operands[3];
    }
    return true;
}

/* Reads the group's structure (what fuse.c's rules make) into p. */
static bool read_group(cg_emit *e, const cg_group *g, gemv_plan *p) {
    const ir_module *m = e->m;
    memset(p, 0, sizeof *p);
    p->x = p->norm_weight = p->pos = IR_NO_VALUE;
    bool *taken = arena_array(&e->scratch, g->op_count, sizeof *taken);
    bool *probed = arena_array(&e->scratch, g->op_count, sizeof *probed); /* what finding an up takes */
    group_reading r = {e, g, taken, NULL, 0};
    /* The parts: each matmul's result, or the results of the split of it. */
    uint32_t parts = 0;
    for (uint32_t i = 0; i < g->op_count; i++)
        parts += m->ops[g->ops[i]].kind == IR_OP_SPLIT ? m->ops[g->ops[i]].result_count : 1;
    r.parts = arena_array(&e->scratch, parts, sizeof *r.parts);
    for (uint32_t i = 0; i < g->op_count; i++) {
        const ir_op *op = &m->ops[g->ops[i]];
        if (op->kind != IR_OP_MATMUL) continue;
        uint32_t split = group_reader(m, g, op->results[0], false);
        if (split == IR_NONE || m->ops[split].kind != IR_OP_SPLIT) {
            r.parts[r.part_count++] =
                (gemv_part){g->ops[i], op->results[0], 0, m->values[op->results[0]].type.dims[1].size, false};
            continue;
        }
        const ir_op *so = &m->ops[split];
        int64_t axis = ir_op_int(m, split, "axis");
        if (axis != 1 && axis != -1) return refuse(e, "a split of a matmul's result not along its columns");
        take(&r, split);
        int64_t row = 0;
        for (uint32_t k = 0; k < so->result_count; k++) {
            int64_t rows = m->values[so->results[k]].type.dims[1].size;
            r.parts[r.part_count++] = (gemv_part){g->ops[i], so->results[k], row, rows, false};
            row += rows;
        }
    }
    for (uint32_t i = 0; i < g->op_count; i++) {
        const ir_op *op = &m->ops[g->ops[i]];
        if (op->kind == IR_OP_RMS_NORM) {
            if (p->norm) return refuse(e, "two norms");
            p->norm = true;
            p->norm_weight = op->operands[1];
            p->eps = ir_op_float(m, g->ops[i], "eps");
            p->norm_offset = ir_op_float(m, g->ops[i], "offset");
            taken[i] = true;
        } else if (op->kind == IR_OP_QUANTIZE) {
            /* the codes of an act_codes matmul's x (ir/ops.def): the kernel reads x and codes it in
             * registers, as the quantize would; its results are the GEMM's, above the fused range */
            if (is_output(g, op->results[0]) || is_output(g, op->results[1]))
                return refuse(e, "a quantize whose codes or scales a reader outside the group needs (the "
                                 "fused kernel codes x in registers and writes neither)");
            taken[i] = true;
        } else if (op->kind == IR_OP_SILU) { /* mul(silu(gate), up): the up matmul is the gate's */
            uint32_t mul = group_reader(m, g, op->results[0], false);
            if (mul == IR_NONE || m->ops[mul].kind != IR_OP_MUL) return refuse(e, "a silu without its mul");
            const ir_op *mo = &m->ops[mul];
            ir_value_id u = mo->operands[0] == op->results[0] ? mo->operands[1] : mo->operands[0];
            ir_value_id bias;
            group_reading probe = r; /* marks the up's bias add in probed, not in taken */
            probe.taken = probed;
            uint32_t up = part_of(&probe, u, &bias);
            if (up != UINT32_MAX) r.parts[up].up = true;
        }
    }
    for (uint32_t i = 0; i < r.part_count; i++)
        if (!r.parts[i].up && !read_segment(&r, p, i)) return false;
    for (uint32_t i = 0; i < g->op_count; i++)
        if (!taken[i]) return refuse(e, "an op that is neither the norm, a matmul nor an epilogue");
    if (p->segment_count == 0) return refuse(e, "no matmul");
    p->k = m->values[p->x].type.dims[1].size;
    /* A matmul alone (a quantized weight's, codegen/emit.c) leaves its KV cache to attention. */
    for (uint32_t i = 0; i < p->segment_count; i++)
        p->segments[i].attention = IR_NONE;
    return g->op_count == 1 || find_caches(e, p);
}

/* ---- the kernel ------------------------------------------------------------------------- */

/* The helper reading 8 (or 1) elements of one storage dtype as floats. */
/* The loader of VECTOR elements of a float dtype: one 128-bit load per 8
 * bf16 or f16 (two per 8 f32), `vector` elements at a time (1: one by one). */
static void write_loader(cg_text *t, smelt_dtype dtype, int vector) {
    const char *name = cg_dtype_name(dtype), *ctype = cg_dtype_ctype(dtype);
    cg_line(t, "SMELT_DEVICE void load_%s(const %s *p, float v[VECTOR])", name, ctype);
    cg_line(t, "{");
    if (vector > GEMV_VECTOR) { /* the VECTOR elements of a quantized weight's load, 8 at a time */
        cg_line(t, "for (int h = 0; h < VECTOR / 8; h++) {");
        if (dtype == SMELT_DTYPE_BF16) {
            cg_line(t, "smelt_u32x4 q = smelt_load_global_128(p + 8 * h); /* 8 bf16, low half first */");
            cg_line(t, "uint32_t words[4] = {q.x, q.y, q.z, q.w};");
            cg_line(t, "for (int i = 0; i < 4; i++) {");
            cg_line(t, "v[8 * h + 2 * i] = __uint_as_float(words[i] << 16);");
            cg_line(t, "v[8 * h + 2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);");
            cg_line(t, "}");
        } else if (dtype == SMELT_DTYPE_F16) {
            cg_line(t, "smelt_u32x4 q = smelt_load_global_128(p + 8 * h); /* 8 f16, low half first */");
            cg_line(t, "uint32_t words[4] = {q.x, q.y, q.z, q.w};");
            cg_line(t, "for (int i = 0; i < 4; i++) {");
            cg_line(t, "v[8 * h + 2 * i] = smelt_f16_to_f32((smelt_f16)(words[i] & 0xffffu));");
            cg_line(t, "v[8 * h + 2 * i + 1] = smelt_f16_to_f32((smelt_f16)(words[i] >> 16));");
            cg_line(t, "}");
        } else {
            cg_line(t, "smelt_u32x4 a = smelt_load_global_128(p + 8 * h), b = smelt_load_global_128(p + 8 * "
                       "h + 4);");
            cg_line(t, "uint32_t words[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};");
            cg_line(t, "for (int i = 0; i < 8; i++)");
            cg_line(t, "    v[8 * h + i] = __uint_as_float(words[i]);");
        }
        cg_line(t, "}");
    } else if (vector == 1) {
        cg_line(t, "v[0] = %s;",
                dtype == SMELT_DTYPE_BF16  ? "smelt_bf16_to_f32(p[0])"
                : dtype == SMELT_DTYPE_F16 ? "smelt_f16_to_f32(p[0])"
                                           : "p[0]");
    } else if (dtype == SMELT_DTYPE_BF16) {
        cg_line(t, "smelt_u32x4 q = smelt_load_global_128(p); /* 8 bf16, low half first */");
        cg_line(t, "uint32_t words[4] = {q.x, q.y, q.z, q.w};");
        cg_line(t, "for (int i = 0; i < 4; i++) {");
        cg_line(t, "v[2 * i] = __uint_as_float(words[i] << 16);");
        cg_line(t, "v[2 * i + 1] = __uint_as_float(words[i] & 0xffff0000u);");
        cg_line(t, "}");
    } else if (dtype == SMELT_DTYPE_F16) {
        cg_line(t, "smelt_u32x4 q = smelt_load_global_128(p); /* 8 f16, low half first */");
        cg_line(t, "uint32_t words[4] = {q.x, q.y, q.z, q.w};");
        cg_line(t, "for (int i = 0; i < 4; i++) {");
        cg_line(t, "v[2 * i] = smelt_f16_to_f32((smelt_f16)(words[i] & 0xffffu));");
        cg_line(t, "v[2 * i + 1] = smelt_f16_to_f32((smelt_f16)(words[i] >> 16));");
        cg_line(t, "}");
    } else {
        cg_line(t, "smelt_u32x4 a = smelt_load_global_128(p), b = smelt_load_global_128(p + 4);");
        cg_line(t, "uint32_t words[8] = {a.x, a.y, a.z, a.w, b.x, b.y, b.z, b.w};");
        cg_line(t, "for (int i = 0; i < 8; i++)");
        cg_line(t, "    v[i] = __uint_as_float(words[i]);");
    }
    cg_line(t, "}");
    cg_blank(t);
}

/* Codes interleaved for the dequantize-GEMM (quant/quant.h, layout
 * "mma_k16"): load c of a row is still its 16 bytes from byte 16 c, but they
 * hold chunk c % 4 of block c / 4, the columns COLUMN_OF(c, e) below (8
 * steps of 16 columns, 4 columns each), element e at nibble e % 8 / 2 + 4 (e
 * % 2) of word e / 8; x and the norm weight are read at those columns
 * (load_<dtype>_interleaved), and each step's group is its own. */
static void write_interleaved_quant_loader(cg_text *t, const quant_format *f) {
    cg_line(t, "/* The column of element e of load c (quant/quant.h's mma_k16 order); its first. */");
    cg_line(t, "#define COLUMN_OF(c, e) ((c) / 4 * 128 + (e) / 4 * 16 + (c) %% 4 * 2 + (e) %% 2 + (e) %% 4 / "
               "2 * 8)");
    cg_blank(t);
    cg_line(t, "/* The VECTOR weights of load c of row r, element e for column COLUMN_OF(c, e):");
    cg_line(t, " * (q - z) * s%s, in f32. */", f->has_column_scale ? " * c[k]" : "");
    cg_line(t, "SMELT_DEVICE void load_weight(quant_row r, int c, float v[VECTOR])");
    cg_line(t, "{");
    cg_line(t, "const uint16_t *scales = (const uint16_t *)(r.w + r.scales);");
    cg_line(t, "smelt_u32x4 q = smelt_load_global_128(r.w + (r.first + (long long)c * VECTOR) / 2);");
    cg_line(t, "uint32_t words[4] = {q.x, q.y, q.z, q.w};");
    cg_line(t, "for (int step = 0; step < 8; step++) {");
    cg_line(t,
            "long long group = r.first_group + COLUMN_OF(c, 4 * step) / GROUP; /* a step is in one group */");
    cg_line(t, f->has_zero ? "int zero = (r.w[r.zeros + group / 2] >> (group %% 2 * 4)) & 15u;"
                           : "int zero = 8; /* symmetric codes */");
    cg_line(t, "float scale = smelt_f16_to_f32(scales[group]);");
    cg_line(t, "for (int i = 0; i < 4; i++) {");
    cg_line(t, "int e = 4 * step + i;");
    cg_line(t, "int code = (int)((words[e / 8] >> ((e %% 8 / 2 + 4 * (e %% 2)) * 4)) & 15u);");
    cg_line(t, "v[e] = (float)(code - zero) * scale;");
    if (f->has_column_scale) cg_line(t, "v[e] *= ((const float *)(r.w + r.column_scales))[COLUMN_OF(c, e)];");
    cg_line(t, "}");
    cg_line(t, "}");
    cg_line(t, "}");
    cg_blank(t);
}

/* The loader of a float dtype at the columns of an interleaved load (p at
 * its first column, COLUMN_OF(c, 0)): element e from p[COLUMN_OF(0, e)]. */
static void write_interleaved_loader(cg_text *t, smelt_dtype dtype) {
    const char *name = cg_dtype_name(dtype), *ctype = cg_dtype_ctype(dtype);
    cg_line(t, "SMELT_DEVICE void load_%s_interleaved(const %s *p, float v[VECTOR])", name, ctype);
    cg_line(t, "{");
    cg_line(t, "for (int e = 0; e < VECTOR; e++)");
    cg_line(t, "    v[e] = %s;",
            dtype == SMELT_DTYPE_BF16 ? "smelt_bf16_to_f32(p[COLUMN_OF(0, e)])" : "p[COLUMN_OF(0, e)]");
    cg_line(t, "}");
    cg_blank(t);
}

/* One row of a quantized weight (quant/quant.h's packed layout) and its
 * loader: VECTOR codes from column c * VECTOR, dequantized as quant_value
 * does, (q - z) * s (* c[k]); codes_only: the raw codes (W8A8 sums them). Also
 * the MoE experts' (emit_moe.c). */
void cg_write_quant_loader(cg_text *t, const quant_format *f, int vector, bool codes_only) {
    cg_line(t, "/* A row of a quantized weight: its codes start at code `first` of the codes section");
    cg_line(t, " * (at byte 0 of w), its group scales%s at entry `first_group` of theirs; the other",
            f->has_zero ? " and zero points" : "");
    cg_line(t, " * sections start at their byte offsets (quant/quant.h). */");
    cg_line(t, "typedef struct quant_row {");
    cg_line(t, "const uint8_t *w;");
    cg_line(t, "long long first, first_group;");
    cg_line(t, "long long scales, zeros, column_scales, group_index;");
    cg_line(t, "} quant_row;");
    cg_blank(t);
    cg_line(t, "SMELT_DEVICE quant_row quant_row_at(const uint8_t *w, long long row, long long scales, long "
               "long zeros,");
    cg_line(t, "                                    long long column_scales, long long group_index)");
    cg_line(t, "{");
    cg_line(t, "quant_row r;");
    cg_line(t, "r.w = w;");
    cg_line(t, "r.first = row * K;");
    cg_line(t, "r.first_group = row * GROUPS;");
    cg_line(t, "r.scales = scales;");
    cg_line(t, "r.zeros = zeros;");
    cg_line(t, "r.column_scales = column_scales;");
    cg_line(t, "r.group_index = group_index;");
    cg_line(t, "return r;");
    cg_line(t, "}");
    cg_blank(t);
    if (codes_only) return; /* W8A8 reads the codes and scales apart: write_w8a8_helpers */
    bool int4 = f->kind == QUANT_INT4;
    /* The code of element i of the load (or of the one element), as a float. */
    const char *code =
        vector > 1
            ? (int4                    ? "(float)((int)((words[i / 8] >> (i % 8 * 4)) & 15u) - zero)"
               : f->kind == QUANT_INT8 ? "(float)(int8_t)(uint8_t)(words[i / 4] >> (i % 4 * 8))"
                                       : "smelt_f8e4m3_to_f32((uint8_t)(words[i / 4] >> (i % 4 * 8)))")
            : (int4 ? "(float)((int)((r.w[(r.first + k0) / 2] >> ((r.first + k0) % 2 * 4)) & 15u) - zero)"
               : f->kind == QUANT_INT8 ? "(float)(int8_t)r.w[r.first + k0]"
                                       : "smelt_f8e4m3_to_f32(r.w[r.first + k0])");
    if (f->interleaved) {
        write_interleaved_quant_loader(t, f);
        return;
    }
    cg_line(t, "/* VECTOR weights of row r from column c * VECTOR: (q - z) * s%s, in f32. */",
            f->has_column_scale ? " * c[k]" : "");
    cg_line(t, "SMELT_DEVICE void load_weight(quant_row r, int c, float v[VECTOR])");
    cg_line(t, "{");
    cg_line(t, "long long k0 = (long long)c * VECTOR;");
    cg_line(t, "const uint16_t *scales = (const uint16_t *)(r.w + r.scales);");
    if (vector > 1) {
        cg_line(t, "smelt_u32x4 q = smelt_load_global_128(r.w + %s); /* %d codes%s */",
                int4 ? "(r.first + k0) / 2" : "r.first + k0", vector, int4 ? ", the low nibble first" : "");
        cg_line(t, "uint32_t words[4] = {q.x, q.y, q.z, q.w};");
    }
    if (f->has_group_index) { /* act-order: each column's own group */
        cg_line(t, "const uint32_t *group_of = (const uint32_t *)(r.w + r.group_index);");
        cg_line(t, "for (int i = 0; i < VECTOR; i++) {");
        cg_line(t, "long long group = r.first_group + group_of[k0 + i];");
    } else {
        cg_line(t, "long long group = r.first_group + k0 / GROUP; /* one group for all VECTOR */");
    }
    if (int4)
        cg_line(t, f->has_zero ? "int zero = (r.w[r.zeros + group / 2] >> (group %% 2 * 4)) & 15u;"
                               : "int zero = 8; /* symmetric codes */");
    cg_line(t, "float scale = smelt_f16_to_f32(scales[group]);");
    if (!f->has_group_index) cg_line(t, "for (int i = 0; i < VECTOR; i++) {");
    cg_line(t, "v[i] = %s * scale;", code);
    if (f->has_column_scale) cg_line(t, "v[i] *= ((const float *)(r.w + r.column_scales))[k0 + i];");
    cg_line(t, "}");
    cg_line(t, "}");
    cg_blank(t);
}

static const char *segment_tag(cg_emit *e, const gemv_segment *s) {
    const char *extras = arena_printf(&e->scratch, "%s%s", s->bias[0] != IR_NO_VALUE ? "b" : "",
                                      s->residual != IR_NO_VALUE ? "r" : "");
    if (s->cache_role) /* and into a K or V cache of max_seq positions */
        extras = arena_printf(&e->scratch, "%s%s%lld", extras, s->cache_role == 1 ? "kc" : "vc",
                              (long long)s->max_seq);
    switch (s->kind) {
    case GEMV_PLAIN: return arena_printf(&e->scratch, "n%lld%s", (long long)s->rows, extras);
    case GEMV_SWIGLU: return arena_printf(&e->scratch, "swiglu%lld%s", (long long)s->rows, extras);
    case GEMV_ROPE:
        if (s->table != IR_NO_VALUE) /* the angles from the table: no frequencies in the source */
            return arena_printf(&e->scratch, "rope%s%lldx%lldr%lldtab%s", s->interleaved ? "i" : "",
                                (long long)s->heads, (long long)s->head_dim, (long long)(2 * s->half),
                                extras);
        return arena_printf(&e->scratch, "rope%s%lldx%lldr%lldth%s%s", s->interleaved ? "i" : "",
                            (long long)s->heads, (long long)s->head_dim, (long long)(2 * s->half),
                            cg_float_name(e, s->theta), extras);
    }
    return "";
}

/* Stores `value` as the segment's element (t0 + i, row), and into the KV
 * cache row of the token's position when the segment feeds one. */
static void write_store(cg_kernel_builder *b, const gemv_segment *s, uint32_t index, const char *row,
                        const char *value) {
    cg_emit *e = b->e;
    cg_text *t = &b->text;
    const char *at = arena_printf(&e->scratch, "(t0 + i) * ROWS_%u + %s", index, row);
    if (s->cache_role == 0) {
        cg_line(t, "%s", cg_store(b, s->p_out, at, value));
        return;
    }
    cg_line(t, "{");
    cg_line(t, "float stored = %s;", value);
    cg_line(t, "%s", cg_store(b, s->p_out, at, "stored"));
    cg_line(t, "if (position >= 0 && position < MAX_SEQ_%u) /* the %s cache row of this position */", index,
            s->cache_role == 1 ? "K" : "V");
    cg_line(t, "    %s",
            cg_store(b, s->p_cache,
                     arena_printf(&e->scratch, "(long long)position * ROWS_%u + %s", index, row), "stored"));
    cg_line(t, "}");
}

/* The first lines of a token loop: the token's position when the segment
 * writes a KV cache, and (unit 0 of the keys) its written flag. */
static void write_position(cg_kernel_builder *b, const gemv_segment *s, uint32_t index, uint32_t pos,
                           bool flag_unit) {
    if (s->cache_role == 0) return;
    cg_text *t = &b->text;
    cg_line(t, "int position = %s;", cg_load(b, pos, "t0 + i"));
    if (s->cache_role == 1 && flag_unit) {
        cg_line(t, "if (unit == 0 && position >= 0 && position < MAX_SEQ_%u)", index);
        cg_line(t, "    %s[position] = 1; /* attention reads this position from now on */",
                b->params[s->p_written].name);
    }
}

/* Row `row` of the output as a row of weight (and bias) r: past the rows of
 * the parts before it in a concatenated weight. */
static const char *weight_row(cg_emit *e, const gemv_segment *s, int r, uint32_t index, const char *row) {
    if (s->first_row[r] == 0) return row;
    return arena_printf(&e->scratch, "(%s_%u + %s)", r ? "UP_FIRST_ROW" : "FIRST_ROW", index, row);
}

/* A pointer to weight parameter `weight`'s row `row` (an expression, past a
 * concatenated weight's earlier parts already) for output `index`: into its
 * elements, or a quantized weight's quant_row. */
static const char *weight_pointer(cg_kernel_builder *b, bool quantized, uint32_t weight, uint32_t index,
                                  const char *row) {
    const char *w = b->params[weight].name;
    if (!quantized) return arena_printf(&b->e->scratch, "%s + %s * K", w, row);
    return arena_printf(
        &b->e->scratch,
        "quant_row_at(%s, %s, SCALES_AT_%u, ZEROS_AT_%u, COLUMN_SCALES_AT_%u, GROUP_INDEX_AT_%u)", w, row,
        index, index, index, index);
}

/* Row `row` of weight (and bias) r of output `index`, as a GEMV reads it (a
 * pointer to the weight's row, or its quant_row) or as a GEMM's epilogue
 * does (the product's column). */
static const char *selected_row(cg_kernel_builder *b, const gemv_plan *p, const gemv_segment *s,
                                uint32_t index, bool epilogue, int r, const char *row) {
    const char *at = weight_row(b->e, s, r, index, row);
    return epilogue ? at : weight_pointer(b, p->quantized, s->p_weight[r], index, at);
}

/* The unit's rows of output `index`: row0 (and row1); in a GEMV the weight
 * rows wa and wb, in a GEMM's epilogue the product's columns ca and cb;
 * rows = 1 or 2; pair for a rotary pair. */
static void write_select(cg_kernel_builder *b, const gemv_plan *p, const gemv_segment *s, uint32_t index,
                         bool epilogue) {
    cg_text *t = &b->text;
    const char *v = epilogue ? "c" : "w"; /* the rows' variables: ca and cb, or wa and wb */
    switch (s->kind) {
    case GEMV_PLAIN:
        cg_line(t, "row0 = unit;");
        cg_line(t, "%sa = %sb = %s;", v, v, selected_row(b, p, s, index, epilogue, 0, "row0"));
        break;
    case GEMV_SWIGLU:
        cg_line(t, "row0 = unit;");
        cg_line(t, "%sa = %s; /* gate */", v, selected_row(b, p, s, index, epilogue, 0, "row0"));
        cg_line(t, "%sb = %s; /* up */", v, selected_row(b, p, s, index, epilogue, 1, "row0"));
        cg_line(t, "rows = 2;");
        break;
    case GEMV_ROPE:
        cg_line(t, "if (unit < HEADS_%u * HALF_%u) { /* a rotary pair */", index, index);
        cg_line(t, "long long head = unit / HALF_%u;", index);
        cg_line(t, "pair = unit %% HALF_%u;", index);
        if (s->interleaved)
            cg_line(t, "row0 = head * HEAD_DIM_%u + 2 * pair, row1 = row0 + 1;", index);
        else
            cg_line(t, "row0 = head * HEAD_DIM_%u + pair, row1 = row0 + HALF_%u;", index, index);
        cg_line(t, "rows = 2;");
        if (s->passed > 0) {
            cg_line(t, "} else { /* a head dim past the rotary ones: not rotated */");
            cg_line(t, "long long rest = unit - HEADS_%u * HALF_%u;", index, index);
            cg_line(t, "row0 = row1 = rest / PASSED_%u * HEAD_DIM_%u + 2 * HALF_%u + rest %% PASSED_%u;",
                    index, index, index, index);
        }
        cg_line(t, "}");
        cg_line(t, "%sa = %s;", v, selected_row(b, p, s, index, epilogue, 0, "row0"));
        cg_line(t, "%sb = %s;", v, selected_row(b, p, s, index, epilogue, 0, "row1"));
        break;
    }
}

/* The epilogue of output `index` for token t0 + i: bias, residual, rope,
 * SwiGLU; the stores (and the KV cache's). */
static void write_epilogue(cg_kernel_builder *b, const gemv_plan *p, const gemv_segment *s, uint32_t index,
                           uint32_t pos) {
    cg_emit *e = b->e;
    cg_text *t = &b->text;
    const char *scale = p->norm ? "inverse_rms(squares[i])" : "1.0f";
    const char *bias0 =
        s->bias[0] != IR_NO_VALUE ? cg_load(b, s->p_bias[0], weight_row(e, s, 0, index, "row0")) : NULL;
    const char *plus0 = bias0 ? " + " : "";
    switch (s->kind) {
    case GEMV_PLAIN:
        write_position(b, s, index, pos, true);
        cg_line(t, "float value = sums[i][0] * %s%s%s%s%s;", scale, plus0, bias0 ? bias0 : "",
                s->residual != IR_NO_VALUE ? " + " : "",
                s->residual != IR_NO_VALUE
                    ? cg_load(b, s->p_residual, arena_printf(&e->scratch, "(t0 + i) * ROWS_%u + row0", index))
                    : "");
        write_store(b, s, index, "row0", "value");
        break;
    case GEMV_SWIGLU: {
        const char *bias1 =
            s->bias[1] != IR_NO_VALUE ? cg_load(b, s->p_bias[1], weight_row(e, s, 1, index, "row0")) : NULL;
        cg_line(t, "float gate = sums[i][0] * %s%s%s;", scale, plus0, bias0 ? bias0 : "");
        cg_line(t, "float up = sums[i][1] * %s%s%s;", scale, bias1 ? " + " : "", bias1 ? bias1 : "");
        write_store(b, s, index, "row0", "gate / (1.0f + expf(-gate)) * up");
        break;
    }
    case GEMV_ROPE: {
        const char *bias1 =
            s->bias[0] != IR_NO_VALUE ? cg_load(b, s->p_bias[0], weight_row(e, s, 0, index, "row1")) : NULL;
        write_position(b, s, index, pos, true);
        cg_line(t, "float a = sums[i][0] * %s%s%s;", scale, plus0, bias0 ? bias0 : "");
        cg_line(t, "if (rows == 2) { /* a rotary pair */");
        cg_line(t, "float b = sums[i][1] * %s%s%s;", scale, bias1 ? " + " : "", bias1 ? bias1 : "");
        if (s->table != IR_NO_VALUE) { /* the step's (cos, sin), scaled already */
            const char *at = arena_printf(&e->scratch, "((t0 + i) * HALF_%u + pair) * 2", index);
            cg_line(t, "float cosine = %s;", cg_load(b, s->p_table, at));
            cg_line(t, "float sine = %s;", cg_load(b, s->p_table, arena_printf(&e->scratch, "%s + 1", at)));
        } else {
            cg_line(t, "float angle = (float)%s * INVERSE_FREQUENCY_%u[pair];", cg_load(b, pos, "t0 + i"),
                    index);
            if (s->rope.attention_factor != 1.0f)
                cg_line(t,
                        "float cosine = cosf(angle) * ATTENTION_FACTOR_%u, sine = sinf(angle) * "
                        "ATTENTION_FACTOR_%u;",
                        index, index);
            else
                cg_line(t, "float cosine = cosf(angle), sine = sinf(angle);");
        }
        write_store(b, s, index, "row0", "a * cosine - b * sine");
        write_store(b, s, index, "row1", "b * cosine + a * sine");
        if (s->passed > 0) {
            cg_line(t, "} else {");
            write_store(b, s, index, "row0", "a");
        }
        cg_line(t, "}");
        break;
    }
    }
}

/* W8A8: the codes of a weight row without their scale (load_codes, VECTOR
 * of them from column c * VECTOR), as int8 integers or E4M3 values, and the
 * row's scale (row_scale): the GEMV's and the moe kernels' (emit_moe.c). */
void cg_write_w8a8_weight_codes(cg_text *t, bool int8, int vector) {
    const char *code_type = int8 ? "int" : "float";
    cg_line(t, "/* VECTOR codes of row r from column c * VECTOR, without their scale: %s. */",
            int8 ? "int8 integers" : "E4M3 values");
    cg_line(t, "SMELT_DEVICE void load_codes(quant_row r, int c, %s v[VECTOR])", code_type);
    cg_line(t, "{");
    cg_line(t, "long long k0 = (long long)c * VECTOR;");
    if (vector > 1) {
        cg_line(t, "smelt_u32x4 q = smelt_load_global_128(r.w + r.first + k0); /* %d codes */", vector);
        cg_line(t, "uint32_t words[4] = {q.x, q.y, q.z, q.w};");
        cg_line(t, "for (int i = 0; i < VECTOR; i++)");
        cg_line(t, int8 ? "    v[i] = (int)(int8_t)(uint8_t)(words[i / 4] >> (i %% 4 * 8));"
                        : "    v[i] = smelt_f8e4m3_to_f32((uint8_t)(words[i / 4] >> (i %% 4 * 8)));");
    } else {
        cg_line(t, int8 ? "v[0] = (int)(int8_t)r.w[r.first + k0];"
                        : "v[0] = smelt_f8e4m3_to_f32(r.w[r.first + k0]);");
    }
    cg_line(t, "}");
    cg_blank(t);
    cg_line(t, "/* The row's scale: one per output channel (GROUP = K). */");
    cg_line(t, "SMELT_DEVICE float row_scale(quant_row r)");
    cg_line(t, "{");
    cg_line(t, "return smelt_f16_to_f32(((const uint16_t *)(r.w + r.scales))[r.first_group]);");
    cg_line(t, "}");
    cg_blank(t);
}

/* W8A8: an activation's code of x / s, as the reference rounds it
 * (ref_ops.c) and a quantize op stores it (ir/ops.def): int8 to nearest
 * even, clamped to +-127, NaN 0; or E4M3, to nearest even, saturating to
 * +-448 (NaN stays NaN). activation_code is the code's value (what the dot
 * products multiply), activation_byte the byte a quantize kernel stores;
 * the value is the byte's, so both are one rounding. On sm_89 and up the
 * E4M3 rounding is the hardware's cvt.rn.satfinite.e4m3x2.f32 (by the PTX
 * ISA: round to nearest even, finite values saturating to +-448, which is
 * what smelt_f32_to_f8e4m3 computes; a NaN keeps the software's bits, as the
 * instruction's NaN sign is not specified); elsewhere, and on the host,
 * smelt_f32_to_f8e4m3. The hardware path has not yet run on a GPU. */
void cg_write_activation_code(cg_text *t, bool int8) {
    if (int8) {
        cg_line(t, "/* An activation's int8 code: x / s rounded to nearest even, clamped to +-127. */");
        cg_line(t, "SMELT_DEVICE int activation_code(float v)");
        cg_line(t, "{");
        cg_line(t, "if (!(v == v))");
        cg_line(t, "    return 0;");
        cg_line(t, "float r = rintf(v);");
        cg_line(t, "return (int)(r > 127.0f ? 127.0f : r < -127.0f ? -127.0f : r);");
        cg_line(t, "}");
        cg_blank(t);
        cg_line(t, "/* The int8 code as the byte a quantize stores (two's complement). */");
        cg_line(t, "SMELT_DEVICE uint8_t activation_byte(float v)");
        cg_line(t, "{");
        cg_line(t, "return (uint8_t)(int8_t)activation_code(v);");
        cg_line(t, "}");
    } else {
        cg_line(t,
                "/* An activation's E4M3 code byte: x / s rounded to nearest even, saturating to +-448. */");
        cg_line(t, "SMELT_DEVICE uint8_t activation_byte(float v)");
        cg_line(t, "{");
        cg_text_printf(t, "#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 890\n"); /* at column 0 */
        cg_line(t, "/* the hardware's rounding; a NaN keeps smelt_f32_to_f8e4m3's bits */");
        cg_line(t, "if (v == v) {");
        cg_line(t, "unsigned short pair; /* the code of v in the low byte, of 0 in the high one */");
        cg_line(
            t, "asm(\"cvt.rn.satfinite.e4m3x2.f32 %%0, %%1, %%2;\" : \"=h\"(pair) : \"f\"(0.0f), \"f\"(v));");
        cg_line(t, "return (uint8_t)(pair & 0xffu);");
        cg_line(t, "}");
        cg_text_printf(t, "#endif\n");
        cg_line(t, "return smelt_f32_to_f8e4m3(v);");
        cg_line(t, "}");
        cg_blank(t);
        cg_line(t, "/* An activation's E4M3 code, as its value (exact in float). */");
        cg_line(t, "SMELT_DEVICE float activation_code(float v)");
        cg_line(t, "{");
        cg_line(t, "return smelt_f8e4m3_to_f32(activation_byte(v));");
        cg_line(t, "}");
    }
}

/* W8A8 (matmul act_quant, ir/ops.def): the codes of a weight row without
 * their scale, and the activation codes, for the integer (int8) or E4M3
 * dot product of write_w8a8_dot_rows. */
static void write_w8a8_helpers(cg_text *t, const gemv_plan *p, int vector, int lanes) {
    bool int8 = p->act_quant == QUANT_INT8;
    cg_write_w8a8_weight_codes(t, int8, vector);
    cg_line(t, "/* The column scales c[k] of VECTOR columns from c * VECTOR (SmoothQuant's 1 / s)%s. */",
            p->format.has_column_scale ? "" : ": 1 without them");
    cg_line(t, "SMELT_DEVICE void load_column_scales(quant_row r, int c, float v[VECTOR])");
    cg_line(t, "{");
    if (p->format.has_column_scale) {
        cg_line(
            t,
            "const float *column_scales = (const float *)(r.w + r.column_scales) + (long long)c * VECTOR;");
        cg_line(t, "for (int i = 0; i < VECTOR; i++)");
        cg_line(t, "    v[i] = column_scales[i];");
    } else {
        cg_line(t, "(void)r, (void)c;");
        cg_line(t, "for (int i = 0; i < VECTOR; i++)");
        cg_line(t, "    v[i] = 1.0f;");
    }
    cg_line(t, "}");
    cg_blank(t);
    cg_write_activation_code(t, int8);
    cg_blank(t);
    if (lanes > 1 && !p->act_static) {
        cg_line(t, "SMELT_DEVICE float unit_max(float v)");
        cg_line(t, "{");
        cg_line(t, "for (int offset = LANES / 2; offset > 0; offset /= 2)");
        cg_line(t, "    v = fmaxf(v, smelt_shfl_xor_f32(0xffffffffu, v, offset));");
        cg_line(t, "return v;");
        cg_line(t, "}");
        cg_blank(t);
    }
    if (lanes > 1 && int8) {
        cg_line(t, "SMELT_DEVICE int unit_sum_i32(int v)");
        cg_line(t, "{");
        cg_line(t, "for (int offset = LANES / 2; offset > 0; offset /= 2)");
        cg_line(t, "    v += smelt_shfl_xor_i32(0xffffffffu, v, offset);");
        cg_line(t, "return v;");
        cg_line(t, "}");
        cg_blank(t);
    }
}

/* `float v = ` element j of the row of x as the matmul sees it: times the
 * norm's weight g (offset, as Gemma's 1 + g) when the group has a norm. */
static void write_normed_value(cg_text *t, const gemv_plan *p) {
    if (!p->norm)
        cg_line(t, "float v = xv[j];");
    else if (p->norm_offset != 0.0)
        cg_line(t, "float v = xv[j] * (NORM_OFFSET + gv[j]);");
    else
        cg_line(t, "float v = xv[j] * gv[j];");
}

/* dot_rows of a W8A8 group: a first pass over the row of x finds each
 * token's activation scale (the max |x * g * c| over K, / 127 or / 448:
 * the norm's 1 / rms, a positive factor of the whole row, cancels out of
 * the codes and is applied after, as in the float dot) and the sum of
 * squares; the second quantizes x * g * c to codes of that scale and sums
 * their products with the weight's codes (int8: in int32, exact for K <
 * 2^31 / 127^2; E4M3: in f32, each product exact); the sum is then scaled
 * by the activation's and the row's scales. */
static void write_w8a8_dot_rows(cg_kernel_builder *b, const gemv_plan *p, uint32_t x, uint32_t norm_weight,
                                int lanes) {
    cg_text *t = &b->text;
    bool int8 = p->act_quant == QUANT_INT8;
    const char *code_type = int8 ? "int" : "float";
    const char *xt = cg_dtype_ctype(b->params[x].dtype), *xn = cg_dtype_name(b->params[x].dtype);
    const char *gt = p->norm ? cg_dtype_ctype(b->params[norm_weight].dtype) : "float";
    cg_line(t, "/* sums[i][r] = x[t0 + i] . w_r as W8A8 computes it (x scaled by the norm weight when there");
    cg_line(t, " * is one): x * g * c quantized to %s codes of the token's scale (its max |.| / %s), their",
            int8 ? "int8" : "E4M3", int8 ? "127" : "448");
    cg_line(t, " * products with the weight's codes summed, times both scales; squares[i] = x . x. */");
    cg_line(t, "SMELT_DEVICE void dot_rows(quant_row w0, quant_row w1, int rows, const %s *x, const %s *g,",
            xt, gt);
    cg_line(t, "                           long long t0, int tokens, float sums[TOKEN_TILE][2],");
    cg_line(t, "                           float squares[TOKEN_TILE]%s)",
            p->act_static ? ", float static_a, float static_b" : "");
    cg_line(t, "{");
    cg_line(t, lanes > 1 ? "int lane = threadIdx.x %% LANES;" : "const int lane = 0, LANE_STEP = 1;");
    if (lanes > 1) cg_line(t, "enum { LANE_STEP = LANES };");
    cg_line(t, "float scales[TOKEN_TILE][2]; /* each token's activation scale against w0's and w1's c */");
    cg_line(t, "%s dots[TOKEN_TILE][2];", code_type);
    cg_line(t, "for (int i = 0; i < TOKEN_TILE; i++) {");
    cg_line(t, "scales[i][0] = scales[i][1] = squares[i] = 0.0f;");
    cg_line(t, "dots[i][0] = dots[i][1] = 0;");
    cg_line(t, "}");
    bool dynamic = !p->act_static;
    if (dynamic || p->norm) { /* a static scale needs only the norm's sum of squares */
        cg_line(t, dynamic ? "/* 1: the absmax of x * g * c and the sum of squares, per token */"
                           : "/* 1: the sum of squares, per token */");
        cg_line(t, "for (int c = lane; c < K / VECTOR; c += LANE_STEP) {");
        cg_line(t, "float xv[VECTOR]%s%s;", p->norm ? ", gv[VECTOR]" : "",
                dynamic ? ", ca[VECTOR], cb[VECTOR]" : "");
        if (dynamic) {
            cg_line(t, "load_column_scales(w0, c, ca);");
            cg_line(t, "load_column_scales(rows == 2 ? w1 : w0, c, cb);");
        }
        if (p->norm && dynamic)
            cg_line(t, "load_%s(g + c * VECTOR, gv);", cg_dtype_name(b->params[norm_weight].dtype));
        cg_line(t, "for (int i = 0; i < TOKEN_TILE && t0 + i < tokens; i++) {");
        cg_line(t, "load_%s(x + (t0 + i) * K + c * VECTOR, xv);", xn);
        cg_line(t, "for (int j = 0; j < VECTOR; j++) {");
        if (p->norm) cg_line(t, "squares[i] += xv[j] * xv[j];");
        if (dynamic) {
            write_normed_value(t, p);
            cg_line(t, "scales[i][0] = fmaxf(scales[i][0], fabsf(v * ca[j]));");
            cg_line(t, "scales[i][1] = fmaxf(scales[i][1], fabsf(v * cb[j]));");
        }
        cg_line(t, "}");
        cg_line(t, "}");
        cg_line(t, "}");
    }
    if (!p->norm) cg_line(t, "(void)g;");
    cg_line(t, "for (int i = 0; i < TOKEN_TILE && t0 + i < tokens; i++) {");
    if (lanes > 1 && dynamic) {
        cg_line(t, "scales[i][0] = unit_max(scales[i][0]); /* uniform bound: every lane shuffles */");
        cg_line(t, "scales[i][1] = unit_max(scales[i][1]);");
    }
    if (lanes > 1 && p->norm) cg_line(t, "squares[i] = unit_sum(squares[i]);");
    if (!dynamic) { /* the static scale of the norm's output: of h * g, ACT_SCALE * rms */
        cg_line(t, "scales[i][0] = static_a%s;", p->norm ? " / inverse_rms(squares[i])" : "");
        cg_line(t, "scales[i][1] = static_b%s;", p->norm ? " / inverse_rms(squares[i])" : "");
    } else {
        cg_line(t, "for (int r = 0; r < 2; r++)");
        cg_line(t, "    scales[i][r] = scales[i][r] > 0.0f ? scales[i][r] / %s : 1.0f;",
                int8 ? "127.0f" : "448.0f");
    }
    cg_line(t, "}");
    cg_line(t, "/* 2: the codes' dot products */");
    cg_line(t, "for (int c = lane; c < K / VECTOR; c += LANE_STEP) {");
    /* b zeroed: a C compiler cannot see that load_codes fills it whenever rows == 2 reads it */
    cg_line(t, "%s a[VECTOR], b[VECTOR] = {0};", code_type);
    cg_line(t, "float xv[VECTOR]%s, ca[VECTOR], cb[VECTOR];", p->norm ? ", gv[VECTOR]" : "");
    cg_line(t, "load_codes(w0, c, a);");
    cg_line(t, "load_column_scales(w0, c, ca);");
    cg_line(t, "if (rows == 2)");
    cg_line(t, "    load_codes(w1, c, b);");
    cg_line(t, "load_column_scales(rows == 2 ? w1 : w0, c, cb);");
    if (p->norm) cg_line(t, "load_%s(g + c * VECTOR, gv);", cg_dtype_name(b->params[norm_weight].dtype));
    cg_line(t, "for (int i = 0; i < TOKEN_TILE && t0 + i < tokens; i++) {");
    cg_line(t, "load_%s(x + (t0 + i) * K + c * VECTOR, xv);", xn);
    cg_line(t, "for (int j = 0; j < VECTOR; j++) {");
    write_normed_value(t, p);
    cg_line(t, "dots[i][0] += activation_code(v * ca[j] / scales[i][0]) * a[j];");
    cg_line(t, "if (rows == 2)");
    cg_line(t, "    dots[i][1] += activation_code(v * cb[j] / scales[i][1]) * b[j];");
    cg_line(t, "}");
    cg_line(t, "}");
    cg_line(t, "}");
    cg_line(t, "for (int i = 0; i < TOKEN_TILE && t0 + i < tokens; i++) {");
    if (lanes > 1) {
        cg_line(t, int8 ? "dots[i][0] = unit_sum_i32(dots[i][0]);" : "dots[i][0] = unit_sum(dots[i][0]);");
        cg_line(t, int8 ? "dots[i][1] = unit_sum_i32(dots[i][1]);" : "dots[i][1] = unit_sum(dots[i][1]);");
    }
    cg_line(t, "sums[i][0] = (float)dots[i][0] * scales[i][0] * row_scale(w0);");
    cg_line(t, "sums[i][1] = rows == 2 ? (float)dots[i][1] * scales[i][1] * row_scale(w1) : 0.0f;");
    cg_line(t, "}");
    cg_line(t, "}");
    cg_blank(t);
}

static void write_dot_rows(cg_kernel_builder *b, const gemv_plan *p, uint32_t x, uint32_t norm_weight,
                           uint32_t weight, int lanes) {
    bool two_rows = false; /* a rotary or SwiGLU pair: some unit reads two rows */
    for (uint32_t i = 0; i < p->segment_count; i++)
        two_rows |= p->segments[i].kind != GEMV_PLAIN;
    cg_text *t = &b->text;
    const char *wt = p->quantized ? "" : cg_dtype_ctype(b->params[weight].dtype);
    const char *wn = p->quantized ? "" : cg_dtype_name(b->params[weight].dtype);
    const char *xt = cg_dtype_ctype(b->params[x].dtype), *xn = cg_dtype_name(b->params[x].dtype);
    const char *gt = p->norm ? cg_dtype_ctype(b->params[norm_weight].dtype) : "float";
    if (lanes > 1) {
        cg_line(t, "/* The sum over the LANES lanes of a unit (an aligned group of the warp), in each;");
        cg_line(t, " * every lane of the warp takes part. */");
        cg_line(t, "SMELT_DEVICE float unit_sum(float v)");
        cg_line(t, "{");
        cg_line(t, "for (int offset = LANES / 2; offset > 0; offset /= 2)");
        cg_line(t, "    v += smelt_shfl_xor_f32(0xffffffffu, v, offset);");
        cg_line(t, "return v;");
        cg_line(t, "}");
        cg_blank(t);
    }
    if (p->act_quant != QUANT_NONE) {
        write_w8a8_dot_rows(b, p, x, norm_weight, lanes);
        return;
    }
    cg_line(t, "/* sums[i][r] = x[t0 + i] . w_r (x scaled by the norm weight when there is one) and");
    cg_line(t, " * squares[i] = x[t0 + i] . x[t0 + i], over the whole row, in every lane of the unit;");
    if (lanes > 1) {
        cg_line(t, " * its lanes take VECTOR consecutive k at a time, every weight byte read once. Called");
        cg_line(t, " * by every lane of the warp together (the reductions shuffle). */");
    } else {
        cg_line(t, " * VECTOR consecutive k at a time, every weight byte read once (a unit is one lane). */");
    }
    if (p->quantized)
        cg_line(t,
                "SMELT_DEVICE void dot_rows(quant_row w0, quant_row w1, int rows, const %s *x, const %s *g,",
                xt, gt);
    else
        cg_line(t,
                "SMELT_DEVICE void dot_rows(const %s *w0, const %s *w1, int rows, const %s *x, const %s *g,",
                wt, wt, xt, gt);
    cg_line(t, "                           long long t0, int tokens, float sums[TOKEN_TILE][2],");
    cg_line(t, "                           float squares[TOKEN_TILE])");
    cg_line(t, "{");
    if (lanes > 1) cg_line(t, "int lane = threadIdx.x %% LANES;");
    cg_line(t, "for (int i = 0; i < TOKEN_TILE; i++) {");
    cg_line(t, "sums[i][0] = sums[i][1] = squares[i] = 0.0f;");
    cg_line(t, "}");
    cg_line(t, lanes > 1 ? "for (int c = lane; c < K / VECTOR; c += LANES) {"
                         : "for (int c = 0; c < K / VECTOR; c++) {");
    if (p->quantized) {
        /* b zeroed: a C compiler cannot see that load_weight fills it whenever rows == 2 reads it */
        cg_line(t, "float a[VECTOR], b[VECTOR] = {0.0f}, xv[VECTOR];");
        cg_line(t, "load_weight(w0, c, a);");
        cg_line(t, "if (rows == 2)");
        cg_line(t, "    load_weight(w1, c, b);");
    } else {
        cg_line(t, "float a[VECTOR], b[VECTOR], xv[VECTOR];");
        cg_line(t, "load_%s(w0 + c * VECTOR, a);", wn);
        cg_line(t, "if (rows == 2)");
        cg_line(t, "    load_%s(w1 + c * VECTOR, b);", wn);
    }
    /* interleaved codes: x and g at the load's columns (write_interleaved_quant_loader) */
    bool interleaved = p->quantized && p->format.interleaved;
    const char *column = interleaved ? "COLUMN_OF(c, 0)" : "c * VECTOR",
               *how = interleaved ? "_interleaved" : "";
    if (p->norm) {
        cg_line(t, "float gv[VECTOR];");
        cg_line(t, "load_%s%s(g + %s, gv);", cg_dtype_name(b->params[norm_weight].dtype), how, column);
    } else {
        cg_line(t, "(void)g;");
    }
    cg_line(t, "for (int i = 0; i < TOKEN_TILE && t0 + i < tokens; i++) {");
    cg_line(t, "load_%s%s(x + (t0 + i) * K + %s, xv);", xn, how, column);
    cg_line(t, "for (int j = 0; j < VECTOR; j++) {");
    if (p->norm) {
        cg_line(t, "squares[i] += xv[j] * xv[j];");
        cg_line(t, p->norm_offset != 0.0 ? "xv[j] *= NORM_OFFSET + gv[j];" : "xv[j] *= gv[j];");
    }
    cg_line(t, "sums[i][0] += a[j] * xv[j];");
    cg_line(t, "if (rows == 2)");
    cg_line(t, "    sums[i][1] += b[j] * xv[j];");
    cg_line(t, "}");
    cg_line(t, "}");
    cg_line(t, "}");
    if (lanes > 1) {
        cg_line(t, "/* the bound is uniform across the warp: every lane shuffles */");
        cg_line(t, "for (int i = 0; i < TOKEN_TILE && t0 + i < tokens; i++) {");
        cg_line(t, "sums[i][0] = unit_sum(sums[i][0]);");
        if (two_rows) cg_line(t, "sums[i][1] = unit_sum(sums[i][1]);");
        if (p->norm) cg_line(t, "squares[i] = unit_sum(squares[i]);");
        cg_line(t, "}");
    }
    cg_line(t, "}");
    cg_blank(t);
}

/* Warps per block for `units` units (8 a warp): the most, of 8, 4 and 2,
 * that still leave two blocks per SM of an H200 (132 SMs), else one block
 * per SM; 0 for a model too small to fill the SMs at all (gemv_shape). */
static int block_warps(int64_t units) {
    const int64_t sms = 132;
    for (int64_t wanted = 2 * sms; wanted >= sms; wanted -= sms)
        for (int warps = 8; warps >= 2; warps /= 2)
            if ((units + warps * (32 / GEMV_LANES) - 1) / (warps * (32 / GEMV_LANES)) >= wanted) return warps;
    return 0;
}

/* Lanes per unit and warps per block. A group with the units to fill an
 * H200 has GEMV_LANES lanes a unit (block_warps). One too small to fill it
 * even in blocks of 2 warps (fewer than 132 * 16 units: the bundled demo,
 * not Llama-3-8B) leaves SMs idle whatever the split, so it takes one lane a
 * unit and no shuffles: a lane still loads 128 bits at a time and reads its
 * row once, its 4x more loads independent of each other; blocks of
 * SMALL_WARPS warps spread the units over more SMs (and simulator workers). */
enum { GEMV_SMALL_WARPS = 2 };
static void gemv_shape(int64_t units, int *lanes, int *warps) {
    *warps = block_warps(units);
    *lanes = GEMV_LANES;
    if (*warps == 0) {
        *warps = GEMV_SMALL_WARPS;
        *lanes = 1;
    }
}

static uint32_t param_once(cg_kernel_builder *b, const char *name, ir_value_id v, bool is_const);

/* The K (and its written flags) or V cache output i stores into, when it
 * does; the rope table it reads, when it does (one parameter for all). */
static void write_cache_params(cg_kernel_builder *b, gemv_segment *s, uint32_t i) {
    cg_emit *e = b->e;
    if (s->table != IR_NO_VALUE)
        s->p_table = param_once(b, arena_printf(&e->scratch, "rope_table%u", i), s->table, true);
    smelt_dtype stored = cg_storage_dtype(e->m, s->out);
    if (s->cache_role == 1) {
        s->p_cache = cg_param_op_state(b, arena_printf(&e->scratch, "k_cache%u", i), s->attention,
                                       CG_STATE_KEYS, stored);
        s->p_written = cg_param_op_state(b, arena_printf(&e->scratch, "written%u", i), s->attention,
                                         CG_STATE_WRITTEN, SMELT_DTYPE_I32);
    } else if (s->cache_role == 2) {
        s->p_cache = cg_param_op_state(b, arena_printf(&e->scratch, "v_cache%u", i), s->attention,
                                       CG_STATE_VALUES, stored);
    }
}

static uint32_t param_once(cg_kernel_builder *b, const char *name, ir_value_id v, bool is_const) {
    for (uint32_t i = 0; i < b->k->param_count; i++)
        if (b->k->params[i].kind == CG_PARAM_VALUE && b->k->params[i].value == v) return i;
    return cg_param_value(b, name, v, is_const);
}

/* The matmul of the group whose result a split of the group takes (its
 * weight concatenated at compile time, passes/fuse.c, or one fused weight as
 * Phi-3's qkv_proj) over a float weight, which a GEMM runs in larger steps;
 * IR_NONE when none (a quantized weight runs in the GEMV at every step). */
uint32_t cg_group_concat_matmul(const ir_module *m, const cg_group *g) {
    for (uint32_t i = 0; i < g->op_count; i++) {
        const ir_op *op = &m->ops[g->ops[i]];
        if (op->kind != IR_OP_MATMUL || op->operand_count < 2 ||
            !smelt_dtype_is_float(m->values[op->operands[1]].type.dtype))
            continue;
        uint32_t split = group_reader(m, g, op->results[0], false);
        if (split != IR_NONE && m->ops[split].kind == IR_OP_SPLIT) return g->ops[i];
    }
    return IR_NONE;
}

static bool emit_gemm_epilogue(cg_emit *e, const cg_group *g, gemv_plan *p);

/* Each output's constants (rows, units, a quantized weight's sections, rope
 * tables) and the first unit of each. */
static bool write_segment_constants(cg_kernel_builder *b, const gemv_plan *p) {
    cg_emit *e = b->e;
    cg_text *t = &b->text;
    for (uint32_t i = 0; i < p->segment_count; i++) {
        const gemv_segment *s = &p->segments[i];
        cg_line(t, "enum { ROWS_%u = %lld, UNITS_%u = %lld };", i, (long long)s->rows, i,
                (long long)s->units);
        if (s->first_row[0] != 0)
            cg_line(t, "enum { FIRST_ROW_%u = %lld }; /* its rows of the concatenated weight start here */",
                    i, (long long)s->first_row[0]);
        if (s->first_row[1] != 0)
            cg_line(t, "enum { UP_FIRST_ROW_%u = %lld }; /* and its up rows here */", i,
                    (long long)s->first_row[1]);
        if (p->quantized) {
            /* the sections of the whole weight the output's rows are in (one
             * fused weight as Phi-3's qkv_proj holds several outputs' rows) */
            const ir_type *w = &e->m->values[b->k->params[s->p_weight[0]].value].type;
            quant_layout l;
            if (w->rank != 2 || quant_layout_of(&p->format, (uint64_t)w->dims[0].size, (uint64_t)p->k, &l))
                return refuse(e, "a quantized weight whose format does not fit it");
            cg_line(t,
                    "enum { SCALES_AT_%u = %llu, ZEROS_AT_%u = %llu, COLUMN_SCALES_AT_%u = %llu, "
                    "GROUP_INDEX_AT_%u = %llu }; /* its weights' sections */",
                    i, (unsigned long long)l.scales, i, (unsigned long long)l.zeros, i,
                    (unsigned long long)l.column_scale, i, (unsigned long long)l.group_index);
        }
        if (s->cache_role)
            cg_line(t, "enum { MAX_SEQ_%u = %lld }; /* positions of the KV cache */", i,
                    (long long)s->max_seq);
        if (s->kind == GEMV_ROPE) {
            cg_line(t, "enum { HEADS_%u = %lld, HEAD_DIM_%u = %lld, HALF_%u = %lld, PASSED_%u = %lld };", i,
                    (long long)s->heads, i, (long long)s->head_dim, i, (long long)s->half, i,
                    (long long)s->passed);
            if (s->table != IR_NO_VALUE) continue; /* the angles are the rope table's */
            char theta_text[48];
            cg_line(t,
                    "/* inv_freq of rope_type %s (theta = %s, over %lld dims), in float32 as Hugging Face "
                    "computes it (ir/rope.c). */",
                    ir_rope_scaling_name(ir_rope_params_of(e->m, s->rope_op, s->head_dim).scaling),
                    ir_format_float(s->theta, theta_text, sizeof theta_text), (long long)(2 * s->half));
            cg_line(t, "static __device__ const float INVERSE_FREQUENCY_%u[HALF_%u] = {", i, i);
            for (int64_t j = 0; j < s->half; j++)
                cg_line(t, "%s%s", cg_float_literal(e, s->rope.inv_freq[j]), j + 1 < s->half ? "," : "");
            cg_line(t, "};");
            if (s->rope.attention_factor != 1.0f)
                cg_line(t, "#define ATTENTION_FACTOR_%u %s /* cos and sin are scaled by it */", i,
                        cg_float_literal(e, s->rope.attention_factor));
        }
    }
    cg_text_printf(t, "enum { START_0 = 0"); /* the first unit of each output */
    for (uint32_t i = 1; i <= p->segment_count; i++)
        cg_text_printf(t, ", START_%u = START_%u + UNITS_%u", i, i - 1, i - 1);
    cg_text_printf(t, " };\n");
    return true;
}

bool cg_emit_gemv_group(cg_emit *e, const cg_group *g) {
    gemv_plan p;
    if (!read_group(e, g, &p)) return false;
    if (e->gemm_epilogue) return emit_gemm_epilogue(e, g, &p);
    const ir_module *m = e->m;
    smelt_dtype weight_dtype = cg_storage_dtype(m, p.segments[0].weight[0]);
    p.quantized = ir_weight_quant(m, m->values[p.segments[0].weight[0]].def_op, &p.format);
    for (uint32_t i = 0; i < p.segment_count; i++)
        for (int r = 0; r < 2; r++) {
            ir_value_id w = p.segments[i].weight[r];
            quant_format f;
            if (w == IR_NO_VALUE) continue;
            bool quantized = ir_weight_quant(m, m->values[w].def_op, &f);
            if (cg_storage_dtype(m, w) != weight_dtype || quantized != p.quantized ||
                (quantized && !quant_format_same_storage(&f, &p.format)))
                return refuse(e, "weights stored differently (dtype or quantization format)");
        }
    /* W8A8: every matmul of the group quantizes its input alike (precision
     * gives each the kind of its weight's codes, per token). */
    p.act_quant = QUANT_NONE;
    p.act_static = false;
    bool first_matmul = true;
    for (uint32_t i = 0; i < g->op_count; i++) {
        uint32_t op = g->ops[i];
        if (m->ops[op].kind != IR_OP_MATMUL) continue;
        const char *kind = ir_op_string(m, op, "act_quant");
        quant_kind act = strcmp(kind, "i8") == 0       ? QUANT_INT8
                         : strcmp(kind, "f8e4m3") == 0 ? QUANT_FP8
                                                       : QUANT_NONE;
        double scale = strcmp(ir_op_string(m, op, "act_scale"), "tensor") == 0
                           ? ir_op_float(m, op, "act_scale_value")
                           : 0.0;
        if (!first_matmul && (act != p.act_quant || (scale > 0) != p.act_static))
            return refuse(e, "matmuls whose activations are quantized differently");
        first_matmul = false;
        p.act_static = scale > 0;
        for (uint32_t s = 0; s < p.segment_count; s++)
            for (int r = 0; r < 2; r++)
                if (p.segments[s].weight[r] == m->ops[op].operands[1]) p.segments[s].act_scale[r] = scale;
        if (act != QUANT_NONE && !p.quantized)
            return refuse(e, "act_quant over a weight that is not quantized");
        p.act_quant = act;
    }
    /* Elements per load: 8 floats; a quantized weight's 128 bits of codes
     * when K and its group are multiples of them; else one. */
    int vector = p.k % GEMV_VECTOR == 0 ? GEMV_VECTOR : 1;
    if (p.quantized) {
        int codes = p.format.kind == QUANT_INT4 ? GEMV_INT4_VECTOR : GEMV_BYTE_CODE_VECTOR;
        vector = p.k % codes == 0 && p.format.group % (uint32_t)codes == 0 ? codes : 1;
        if (p.format.interleaved && vector != GEMV_INT4_VECTOR)
            return refuse(e, "interleaved int4 codes in groups that are not a multiple of 32 columns");
    }
    int64_t units = 0;
    cg_text name;
    cg_text_init(&name);
    ir_value_id typed[3] = {p.x, p.segments[0].weight[0], p.segments[0].out};
    cg_text_printf(&name, "gemv_%s_k%lld", cg_dtype_tag(e, typed, 3), (long long)p.k);
    if (p.quantized) /* the format: group, zero points, act-order, column scales */
        cg_text_printf(&name, "_g%u%s%s%s%s", p.format.group, p.format.has_zero ? "z" : "",
                       p.format.has_group_index ? "o" : "", p.format.has_column_scale ? "c" : "",
                       p.format.interleaved ? "i" : "");
    if (p.act_quant != QUANT_NONE) /* W8A8: the activations' codes, per token or of a static scale */
        cg_text_printf(&name, "_a%s%s", p.act_quant == QUANT_INT8 ? "i8" : "f8", p.act_static ? "s" : "");
    if (p.norm) cg_text_printf(&name, "_rms%s", cg_float_name(e, p.eps));
    for (uint32_t i = 0; i < p.segment_count; i++) {
        cg_text_printf(&name, "_%s", segment_tag(e, &p.segments[i]));
        if (cg_storage_dtype(m, p.segments[i].out) != cg_storage_dtype(m, p.segments[0].out))
            cg_text_printf(&name, "%s", cg_dtype_name(cg_storage_dtype(m, p.segments[i].out)));
        units += p.segments[i].units;
    }
    const char *kernel_name = arena_strdup(&e->scratch, name.data);
    cg_text_free(&name);

    cg_kernel_builder b;
    cg_kernel_begin(
        &b, e, kernel_name,
        "One unit (a weight row, or the two rows of a rotary pair or of SwiGLU's gate and up) per "
        "LANES lanes, WARPS warps per block: VECTOR elements of K per lane per load (128-bit "
        "loads), f32 sums reduced across the unit's lanes; the norm's sum of squares in the same "
        "pass");
    b.k->family = "gemv";
    uint32_t x = cg_param_value(&b, p.norm ? "h" : "x", p.x, true);
    uint32_t norm_weight = p.norm ? cg_param_value(&b, "norm_weight", p.norm_weight, true) : UINT32_MAX;
    uint32_t pos = p.pos != IR_NO_VALUE ? cg_param_value(&b, "pos", p.pos, true) : UINT32_MAX;
    for (uint32_t i = 0; i < p.segment_count; i++) {
        gemv_segment *s = &p.segments[i];
        s->p_weight[0] =
            param_once(&b, arena_printf(&e->scratch, "%s%u", s->kind == GEMV_SWIGLU ? "gate" : "w", i),
                       s->weight[0], true);
        if (s->weight[1] != IR_NO_VALUE)
            s->p_weight[1] = param_once(&b, arena_printf(&e->scratch, "up%u", i), s->weight[1], true);
        for (int r = 0; r < 2; r++)
            if (s->bias[r] != IR_NO_VALUE)
                s->p_bias[r] = param_once(&b, arena_printf(&e->scratch, "bias%u%s", i, r ? "_up" : ""),
                                          s->bias[r], true);
        if (s->residual != IR_NO_VALUE)
            s->p_residual = param_once(&b, arena_printf(&e->scratch, "residual%u", i), s->residual, true);
        s->p_out = cg_param_value(&b, arena_printf(&e->scratch, "out%u", i), s->out, false);
        write_cache_params(&b, s, i);
    }
    cg_param_tokens(&b);
    int lanes, warps;
    gemv_shape(units, &lanes, &warps);
    cg_kernel_launch(&b, (prog_affine){0, units, warps * (32 / lanes)}, (prog_affine){0, 1, 1},
                     32 * (uint32_t)warps);
    cg_kernel_open(&b);
    cg_text *t = &b.text;
    cg_line(t, "enum { K = %lld, VECTOR = %d, WARPS = %d, LANES = %d, UNITS_PER_WARP = 32 / LANES };",
            (long long)p.k, vector, warps, lanes);
    if (p.quantized)
        cg_line(
            t, "enum { GROUP = %u, GROUPS = K / GROUP }; /* %s codes, one f16 scale per GROUP columns%s */",
            p.format.group, quant_kind_name(p.format.kind), p.format.has_zero ? " with a zero point" : "");
    cg_line(t, "enum { TOKEN_TILE = %d, UNITS = %lld };", GEMV_TOKEN_TILE, (long long)units);
    for (uint32_t i = 0; p.act_static && i < p.segment_count; i++) {
        cg_line(t, "#define ACT_SCALE_%u %s /* output %u's activations: their static scale */", i,
                cg_float_literal(e, p.segments[i].act_scale[0]), i);
        if (p.segments[i].weight[1] != IR_NO_VALUE)
            cg_line(t, "#define UP_ACT_SCALE_%u %s /* and its up matmul's */", i,
                    cg_float_literal(e, p.segments[i].act_scale[1]));
    }
    if (!write_segment_constants(&b, &p)) return false;
    if (p.norm) cg_line(t, "#define EPS %s", cg_float_literal(e, p.eps));
    if (p.norm && p.norm_offset != 0.0)
        cg_line(t, "#define NORM_OFFSET %s /* the norm's weights are NORM_OFFSET + w (Gemma) */",
                cg_float_literal(e, p.norm_offset));
    cg_blank(t);
    if (p.quantized) cg_write_quant_loader(t, &p.format, vector, p.act_quant != QUANT_NONE);
    if (p.act_quant != QUANT_NONE)
        write_w8a8_helpers(t, &p, vector, lanes);
    else if (!p.quantized)
        write_loader(t, weight_dtype, vector);
    if (p.quantized && p.format.interleaved) {
        write_interleaved_loader(t, cg_storage_dtype(m, p.x));
        if (p.norm && cg_storage_dtype(m, p.norm_weight) != cg_storage_dtype(m, p.x))
            write_interleaved_loader(t, cg_storage_dtype(m, p.norm_weight));
    } else {
        if (p.quantized || cg_storage_dtype(m, p.x) != weight_dtype)
            write_loader(t, cg_storage_dtype(m, p.x), vector);
        if (p.norm && (p.quantized || cg_storage_dtype(m, p.norm_weight) != weight_dtype) &&
            cg_storage_dtype(m, p.norm_weight) != cg_storage_dtype(m, p.x))
            write_loader(t, cg_storage_dtype(m, p.norm_weight), vector);
    }
    if (p.norm) {
        cg_line(t, "SMELT_DEVICE float inverse_rms(float squares)");
        cg_line(t, "{");
        cg_line(t, "return 1.0f / sqrtf(squares / (float)K + EPS);");
        cg_line(t, "}");
        cg_blank(t);
    }
    write_dot_rows(&b, &p, x, norm_weight, p.segments[0].p_weight[0], lanes);
    cg_kernel_signature(&b);
    bool rope = false;
    for (uint32_t i = 0; i < p.segment_count; i++)
        rope |= p.segments[i].kind == GEMV_ROPE;
    const char *wtype = cg_dtype_ctype(weight_dtype), *first = b.params[p.segments[0].p_weight[0]].name;
    cg_line(t, "long long warp_unit = ((long long)blockIdx.x * WARPS + threadIdx.x / 32) * UNITS_PER_WARP;");
    cg_line(t, "if (warp_unit >= UNITS)");
    cg_line(t, "    return; /* the whole warp: past the last unit */");
    cg_line(t, "long long global_unit = warp_unit + threadIdx.x %% 32 / LANES;");
    cg_line(t, "int active = global_unit < UNITS, first_lane = threadIdx.x %% LANES == 0;");
    cg_line(t, "/* The unit's weight rows (an inactive unit reads row 0 and stores nothing). */");
    cg_line(t, "long long unit = 0, row0 = 0%s;", rope ? ", row1 = 0, pair = 0" : "");
    if (p.quantized)
        cg_line(t, "quant_row wa = %s, wb = wa;",
                weight_pointer(&b, true, p.segments[0].p_weight[0], 0, "0"));
    else
        cg_line(t, "const %s *wa = %s, *wb = %s;", wtype, first, first);
    cg_line(t, "int rows = 1;");
    if (p.act_static)
        cg_line(t, "float static_a = 1.0f, static_b = 1.0f; /* the unit's activation scales */");
    for (uint32_t i = 0; i < p.segment_count; i++) {
        if (i == 0) cg_line(t, "if (!active) {");
        if (i + 1 < p.segment_count)
            cg_line(t, "} else if (global_unit < START_%u) {", i + 1);
        else
            cg_line(t, "} else {");
        cg_line(t, "/* output %u: %s */", i, segment_tag(e, &p.segments[i]));
        cg_line(t, "unit = global_unit - START_%u;", i);
        write_select(&b, &p, &p.segments[i], i, false);
        if (p.act_static)
            cg_line(t, "static_a = ACT_SCALE_%u, static_b = %s_%u;", i,
                    p.segments[i].weight[1] != IR_NO_VALUE ? "UP_ACT_SCALE" : "ACT_SCALE", i);
    }
    cg_line(t, "}");
    cg_line(t, "float sums[TOKEN_TILE][2], squares[TOKEN_TILE];");
    cg_line(t, "for (long long t0 = 0; t0 < tokens; t0 += TOKEN_TILE) {");
    cg_line(t, "dot_rows(wa, wb, rows, %s, %s, t0, tokens, sums, squares%s);", b.params[x].name,
            p.norm ? b.params[norm_weight].name : "0", p.act_static ? ", static_a, static_b" : "");
    cg_line(t, "for (int i = 0; i < TOKEN_TILE && active && first_lane && t0 + i < tokens; i++) {");
    for (uint32_t i = 0; i < p.segment_count; i++) {
        if (p.segment_count == 1)
            cg_line(t, "{");
        else if (i == 0)
            cg_line(t, "if (global_unit < START_1) {");
        else if (i + 1 < p.segment_count)
            cg_line(t, "} else if (global_unit < START_%u) {", i + 1);
        else
            cg_line(t, "} else {");
        cg_line(t, "/* output %u */", i);
        write_epilogue(&b, &p, &p.segments[i], i, pos);
    }
    cg_line(t, "}");
    cg_line(t, "}");
    cg_line(t, "}");
    cg_kernel_end(&b);
    double rows = 0; /* 2 N K flops per token over every output */
    for (uint32_t i = 0; i < p.segment_count; i++)
        rows += (double)p.segments[i].rows * (p.segments[i].kind == GEMV_SWIGLU ? 2 : 1);
    b.k->flops = (prog_poly){.per_token = 2.0 * rows * (double)p.k};
    e->out->kind = CG_LOWER_KERNELS;
    /* A matmul alone (a quantized weight's, which has no GEMM) serves every step. */
    e->out->fused_max_tokens = g->op_count > 1 ? IR_GEMV_MAX_TOKENS : 0;
    return true;
}

/* ---- the GEMM epilogue ------------------------------------------------------------------ */

/* Above the GEMV's token counts, a group over a weight concatenated at
 * compile time runs its matmul as one GEMM (cuBLASLt; OpenBLAS on the host),
 * the concatenated bias in the GEMM's epilogue, and then this one kernel
 * over the GEMM's output product [T, N]: each output's epilogue as the GEMV
 * has it (a part of the split copied out, rotated, SwiGLU, a residual
 * added), one thread per unit, TOKENS_PER_BLOCK tokens per block row, and
 * the KV cache rows of k and v when attention leaves them to the group in
 * every step (cache_written_upto at the token bound, passes/fuse.c). */
enum { EPILOGUE_THREADS = 256, EPILOGUE_TOKENS_PER_BLOCK = 16 };

static bool emit_gemm_epilogue(cg_emit *e, const cg_group *g, gemv_plan *p) {
    const ir_module *m = e->m;
    uint32_t matmul = cg_group_concat_matmul(m, g);
    if (matmul == IR_NONE) return refuse(e, "no matmul over a concatenated weight for a GEMM epilogue");
    ir_value_id product = m->ops[matmul].results[0];
    int64_t n = m->values[product].type.dims[1].size, units = 0;
    p->norm = false; /* the norm ran before the GEMM, the bias in it */
    for (uint32_t i = 0; i < p->segment_count; i++) {
        gemv_segment *s = &p->segments[i];
        if (s->weight[0] != m->ops[matmul].operands[1]) return refuse(e, "outputs of more than one matmul");
        s->bias[0] = s->bias[1] = IR_NO_VALUE;
        /* The KV cache: this kernel's to write when attention leaves it every step above the GEMV's. */
        if (s->cache_role && ir_op_int(m, s->attention, "cache_written_upto") < m->planned_tokens) {
            s->cache_role = 0;
            s->attention = IR_NONE;
        }
        units += s->units;
    }
    cg_text name;
    cg_text_init(&name);
    ir_value_id typed[2] = {product, p->segments[0].out};
    cg_text_printf(&name, "gemm_epilogue_%s_n%lld", cg_dtype_tag(e, typed, 2), (long long)n);
    for (uint32_t i = 0; i < p->segment_count; i++) {
        cg_text_printf(&name, "_%s", segment_tag(e, &p->segments[i]));
        if (cg_storage_dtype(m, p->segments[i].out) != cg_storage_dtype(m, p->segments[0].out))
            cg_text_printf(&name, "%s", cg_dtype_name(cg_storage_dtype(m, p->segments[i].out)));
    }
    const char *kernel_name = arena_strdup(&e->scratch, name.data);
    cg_text_free(&name);

    cg_kernel_builder b;
    cg_kernel_begin(
        &b, e, kernel_name,
        "The epilogue of a GEMM over concatenated weights: one thread per unit (an output column, "
        "or the two columns of a rotary pair or of SwiGLU's gate and up) of each output, "
        "TOKENS_PER_BLOCK tokens per block row");
    b.k->family = "gemv";
    uint32_t c = cg_param_value(&b, "product", product, true);
    uint32_t pos = p->pos != IR_NO_VALUE ? cg_param_value(&b, "pos", p->pos, true) : UINT32_MAX;
    for (uint32_t i = 0; i < p->segment_count; i++) {
        gemv_segment *s = &p->segments[i];
        if (s->residual != IR_NO_VALUE)
            s->p_residual = param_once(&b, arena_printf(&e->scratch, "residual%u", i), s->residual, true);
        s->p_out = cg_param_value(&b, arena_printf(&e->scratch, "out%u", i), s->out, false);
        write_cache_params(&b, s, i);
    }
    cg_param_tokens(&b);
    cg_kernel_launch(&b, (prog_affine){0, units, EPILOGUE_THREADS},
                     (prog_affine){1, EPILOGUE_TOKENS_PER_BLOCK - 1, EPILOGUE_TOKENS_PER_BLOCK},
                     EPILOGUE_THREADS);
    cg_kernel_open(&b);
    cg_text *t = &b.text;
    cg_line(t, "enum { N = %lld, UNITS = %lld, TOKENS_PER_BLOCK = %d }; /* product is [tokens, N] */",
            (long long)n, (long long)units, EPILOGUE_TOKENS_PER_BLOCK);
    if (!write_segment_constants(&b, p)) return false;
    cg_blank(t);
    cg_kernel_signature(&b);
    bool rope = false;
    for (uint32_t i = 0; i < p->segment_count; i++)
        rope |= p->segments[i].kind == GEMV_ROPE;
    cg_line(t, "long long global_unit = (long long)blockIdx.x * blockDim.x + threadIdx.x;");
    cg_line(t, "if (global_unit >= UNITS)");
    cg_line(t, "    return;");
    cg_line(t, "/* The unit's columns of product: ca (and cb, when rows == 2). */");
    cg_line(t, "long long unit = 0, row0 = 0, ca = 0, cb = 0%s;", rope ? ", row1 = 0, pair = 0" : "");
    cg_line(t, "int rows = 1;");
    for (uint32_t i = 0; i < p->segment_count; i++) {
        if (p->segment_count == 1)
            cg_line(t, "{");
        else if (i == 0)
            cg_line(t, "if (global_unit < START_1) {");
        else if (i + 1 < p->segment_count)
            cg_line(t, "} else if (global_unit < START_%u) {", i + 1);
        else
            cg_line(t, "} else {");
        cg_line(t, "/* output %u: %s */", i, segment_tag(e, &p->segments[i]));
        cg_line(t, "unit = global_unit - START_%u;", i);
        write_select(&b, p, &p->segments[i], i, true);
    }
    cg_line(t, "}");
    cg_line(t, "long long first = (long long)blockIdx.y * TOKENS_PER_BLOCK;");
    cg_line(t, "for (long long t0 = first; t0 < first + TOKENS_PER_BLOCK && t0 < tokens; t0++) {");
    cg_line(t, "const int i = 0; /* the GEMV's epilogue on a tile of one token */");
    cg_line(t, "float sums[1][2];");
    cg_line(t, "sums[i][0] = %s;", cg_load(&b, c, "t0 * N + ca"));
    cg_line(t, "sums[i][1] = rows == 2 ? %s : 0.0f;", cg_load(&b, c, "t0 * N + cb"));
    for (uint32_t i = 0; i < p->segment_count; i++) {
        if (p->segment_count == 1)
            cg_line(t, "{");
        else if (i == 0)
            cg_line(t, "if (global_unit < START_1) {");
        else if (i + 1 < p->segment_count)
            cg_line(t, "} else if (global_unit < START_%u) {", i + 1);
        else
            cg_line(t, "} else {");
        cg_line(t, "/* output %u */", i);
        write_epilogue(&b, p, &p->segments[i], i, pos);
    }
    cg_line(t, "}");
    cg_line(t, "}");
    cg_kernel_end(&b);
    e->out->kind = CG_LOWER_KERNELS;
    return true;
}
