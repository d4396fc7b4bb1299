/* emit_moe.c - the mixture-of-experts kernels (Mixtral's sparse MoE block).
 *
 * moe(x[T, D], router[E, D], gate[E, F, D], up[E, F, D], down[E, D, F]) -> [T, D]
 * as reference/ref_ops_attention.c: router logits x . router[e], a softmax
 * over the E experts, the top_k most probable (ties to the lower index, as
 * torch.topk), their probabilities divided by their sum when normalize, and
 * out = sum_k weight_k * down_e(silu(gate_e x) * up_e x).
 *
 * Four launches, the tokens grouped by expert so that each chosen expert's
 * weights are streamed once per step, by many blocks:
 *
 *   1. moe_route: one warp per token: the router logits, softmax, top-k and
 *      renormalisation; writes the token's K choices (slot t * K + k) as an
 *      expert id and a weight into the state buffers `route_expert` and
 *      `route_weight`.
 *   2. moe_gate_up: a grouped GEMM over (F-tile, expert) blocks. A block
 *      first gathers its expert's slots from route_expert in slot order (a
 *      ballot compaction in shared memory, one window of THREADS slots at a
 *      time: the per-expert token list, built where it is used, so no
 *      separate sort launch), then each warp owns rows of gate and up and
 *      streams them with 128-bit loads, each 8-element chunk of weights
 *      applied to TILE tokens at once; f32 accumulation; SwiGLU in the
 *      epilogue: hidden[slot, f] = silu(gate x) * up x into the scratch state.
 *   3. moe_down: the same grouped GEMM over (D-tile, expert) blocks on the
 *      hidden rows; the router weight of the slot is applied in the epilogue:
 *      partial[slot, d] = weight * down_e(hidden[slot]).
 *   4. moe_combine: out[t, d] = sum over k of partial[t * K + k, d], in k
 *      order: each token's results are summed by one thread, no atomics, so
 *      the result does not depend on the order blocks run in.
 *
 * At batch 1 the two GEMMs have E * ceil(F / ROWS) blocks, of which the
 * chosen experts' K * ceil(F / ROWS) have work (896 for Mixtral-8x7B's gate_up):
 * every SM streams weights. The blocks of an expert nobody chose leave after
 * one scan of the T * K choices. Prefill runs on CUDA cores (a block re-reads
 * its weight rows from L1/L2 per tile of TILE tokens), not on tensor cores.
 *
 * Quantized experts (passes/precision.c: an [E, N, K] stack whose expert e
 * is an [N, K] matrix in quant/quant.h's packed layout, at byte e * stride,
 * quant_stack_layout_of) are read with the GEMV's row reader
 * (cg_write_quant_loader): one 128-bit load of 32 int4 or 16 int8/fp8 codes
 * per lane, dequantized in registers as quant_value defines. Gate and up
 * share one kernel and so must share one format.
 *
 * W8A8 experts (the moe's gate_up_act_quant / down_act_quant, ops.def:
 * int8 or E4M3 stacks with one scale per output channel): after the
 * gather, one warp per slot finds the slot's activation scale, the absmax
 * of its input row (x for gate_up, its hidden row for down) times the
 * expert's column scales (gate's and up's apart) / 127 or / 448, into
 * shared memory; the GEMM then quantizes each input element to its code
 * as it streams the weight's codes and sums code products (int8 in int32,
 * exact; E4M3 in f32), scaled by the slot's and the row's scales in the
 * epilogue, as the GEMV's W8A8 does. The hidden rows are then kept in f32
 * (the reference quantizes them unrounded), whatever the result's dtype.
 * With static scales (act_scale tensor: gate_up_act_scale_value for x,
 * down_act_scale_value for the hidden rows, one each for every slot and
 * every expert) the scale is a constant of the kernel, ACT_SCALE, and the
 * absmax pass is not emitted.
 */
#include "emit_internal.h"
#include "quant.h"

#include <math.h>

enum {
    MOE_THREADS = 256, /* every kernel: 8 warps */
    MOE_WARPS = MOE_THREADS / 32,
    MOE_ROWS_PER_WARP = 2,   /* weight rows one warp owns in a GEMM block */
    MOE_TILE = 8,            /* tokens that share one load of a weight chunk */
    MOE_VECTOR = 8,          /* elements per lane per chunk: one 128-bit bf16 load */
    MOE_EXPERT_LIMIT = 1024, /* the route kernel's logits stay in shared memory */
};
#define MOE_STATE_LIMIT (1ull << 40)

enum { MOE_STATE_EXPERT = 0, MOE_STATE_WEIGHT = 1, MOE_STATE_SCRATCH = 2 };

typedef struct moe_shape {
    int64_t model_dim, experts, ffn, top_k, token_bound;
    bool normalize;
    cg_count tokens;
    smelt_dtype scratch_dtype; /* hidden and partial rows: the result's storage dtype (f32 under W8A8 down) */
    const char *tag;           /* name part: dtypes and dims */
} moe_shape;

/* Device helpers: an aligned 128-bit vector and loads of 8 consecutive
 * elements as floats (one ld.global.v4 for bf16 or f16, two for f32). */
static void write_vector_helpers(cg_text *t) {
    cg_line(t, "typedef struct __align__(16) moe_vector {");
    cg_line(t, "unsigned int word[4];");
    cg_line(t, "} moe_vector;");
    cg_blank(t);
    cg_line(t, "/* p[0..8) as floats; p is 16-byte aligned */");
    cg_line(t, "SMELT_DEVICE void load8_bf16(const smelt_bf16 *p, float *out) {");
    cg_line(t, "moe_vector v = *(const moe_vector *)p;");
    cg_line(t, "for (int i = 0; i < 4; i++) {");
    cg_line(t, "out[2 * i] = __uint_as_float(v.word[i] << 16);");
    cg_line(t, "out[2 * i + 1] = __uint_as_float(v.word[i] & 0xffff0000u);");
    cg_line(t, "}");
    cg_line(t, "}");
    cg_blank(t);
    cg_line(t, "/* p[0..8) as floats; p is 32-byte aligned */");
    cg_line(t, "SMELT_DEVICE void load8_f32(const float *p, float *out) {");
    cg_line(t, "for (int half = 0; half < 2; half++) {");
    cg_line(t, "moe_vector v = *(const moe_vector *)(p + 4 * half);");
    cg_line(t, "for (int i = 0; i < 4; i++)");
    cg_line(t, "    out[4 * half + i] = __uint_as_float(v.word[i]);");
    cg_line(t, "}");
    cg_line(t, "}");
    cg_blank(t);
    cg_line(t, "/* p[0..8) as floats; p is 16-byte aligned */");
    cg_line(t, "SMELT_DEVICE void load8_f16(const smelt_f16 *p, float *out) {");
    cg_line(t, "smelt_unpack_f16x8(*(const uint4 *)p, out);");
    cg_line(t, "}");
    cg_blank(t);
}

/* The C expression loading 8 elements of parameter p at `index` into `out`. */
static const char *load8(cg_kernel_builder *b, uint32_t p, const char *index, const char *out) {
    smelt_dtype dt = b->params[p].dtype;
    return arena_printf(&b->e->scratch, "load8_%s(%s + (%s), %s)", cg_dtype_name(dt), b->params[p].name,
                        index, out);
}

static bool vectorizable(const cg_kernel_builder *b, uint32_t p) {
    smelt_dtype dt = b->params[p].dtype;
    return dt == SMELT_DTYPE_BF16 || dt == SMELT_DTYPE_F16 || dt == SMELT_DTYPE_F32;
}

static void write_popcount(cg_text *t) {
    cg_line(t, "SMELT_DEVICE int popcount(unsigned int v) {");
    cg_line(t, "v = v - ((v >> 1) & 0x55555555u);");
    cg_line(t, "v = (v & 0x33333333u) + ((v >> 2) & 0x33333333u);");
    cg_line(t, "return (int)((((v + (v >> 4)) & 0x0f0f0f0fu) * 0x01010101u) >> 24);");
    cg_line(t, "}");
    cg_blank(t);
}

/* ---- 1. route ------------------------------------------------------------------------- */

static void emit_route(cg_emit *e, const moe_shape *s) {
    ir_value_id x = cg_operand(e, 0), router = cg_operand(e, 1);
    const char *name = arena_printf(&e->scratch, "moe_route_%s%s", s->tag, s->normalize ? "" : "_nonorm");
    cg_kernel_builder b;
    cg_kernel_begin(&b, e, name,
                    "One warp per token: router logits, softmax over the experts, the top_k (ties to the "
                    "lower index), renormalised when normalize; writes the token's choices as slots "
                    "t * TOP_K + k of route_expert and route_weight.");
    uint32_t p_x = cg_param_value(&b, "x", x, true);
    uint32_t p_router = cg_param_value(&b, "router", router, true);
    uint32_t p_expert = cg_param_state(&b, "route_expert", MOE_STATE_EXPERT, SMELT_DTYPE_I32);
    uint32_t p_weight = cg_param_state(&b, "route_weight", MOE_STATE_WEIGHT, SMELT_DTYPE_F32);
    cg_param_tokens(&b);
    cg_kernel_launch(&b, cg_count_blocks(s->tokens, MOE_WARPS), (prog_affine){0, 1, 1}, MOE_THREADS);
    cg_kernel_open(&b);
    cg_text *t = &b.text;
    cg_line(t, "enum { MODEL_DIM = %lld, EXPERTS = %lld, TOP_K = %lld, NORMALIZE = %d };",
            (long long)s->model_dim, (long long)s->experts, (long long)s->top_k, s->normalize ? 1 : 0);
    cg_line(t, "enum { THREADS = %d, WARPS = THREADS / 32 };", MOE_THREADS);
    cg_blank(t);
    bool vector = s->model_dim % MOE_VECTOR == 0 && vectorizable(&b, p_x) && vectorizable(&b, p_router);
    if (vector) write_vector_helpers(t);
    cg_write_warp_sum(t);
    cg_kernel_signature(&b);
    cg_line(t, "__shared__ float probabilities[WARPS][EXPERTS]; /* one row per warp's token */");
    cg_line(t, "int lane = threadIdx.x %% 32, warp = threadIdx.x / 32;");
    cg_line(t, "long long token = (long long)blockIdx.x * WARPS + warp;");
    cg_line(t, "if (token >= tokens)");
    cg_line(t, "    return; /* the whole warp: no block barrier follows */");
    cg_line(t, "float *p = probabilities[warp];");
    cg_line(t, "for (int expert = 0; expert < EXPERTS; expert++) {");
    cg_line(t, "float dot = 0.0f;");
    if (vector) {
        cg_line(t, "for (int i = lane * 8; i < MODEL_DIM; i += 32 * 8) {");
        cg_line(t, "float xs[8], ws[8];");
        cg_line(t, "%s;", load8(&b, p_x, "token * MODEL_DIM + i", "xs"));
        cg_line(t, "%s;", load8(&b, p_router, "(long long)expert * MODEL_DIM + i", "ws"));
        cg_line(t, "for (int j = 0; j < 8; j++)");
        cg_line(t, "    dot += xs[j] * ws[j];");
        cg_line(t, "}");
    } else {
        cg_line(t, "for (int i = lane; i < MODEL_DIM; i += 32)");
        cg_line(t, "    dot += %s * %s;", cg_load(&b, p_x, "token * MODEL_DIM + i"),
                cg_load(&b, p_router, "(long long)expert * MODEL_DIM + i"));
    }
    cg_line(t, "dot = warp_sum(dot);");
    cg_line(t, "if (lane == 0)");
    cg_line(t, "    p[expert] = dot;");
    cg_line(t, "}");
    cg_line(t, "__syncwarp(0xffffffffu);");
    cg_line(t, "if (lane != 0)");
    cg_line(t, "    return;");
    cg_line(t, "/* softmax and top-k by lane 0 (E is small) */");
    cg_line(t, "float max = p[0], total = 0.0f, chosen_total = 0.0f;");
    cg_line(t, "for (int expert = 1; expert < EXPERTS; expert++)");
    cg_line(t, "    max = fmaxf(max, p[expert]);");
    cg_line(t, "for (int expert = 0; expert < EXPERTS; expert++) {");
    cg_line(t, "p[expert] = expf(p[expert] - max);");
    cg_line(t, "total += p[expert];");
    cg_line(t, "}");
    cg_line(t, "for (int expert = 0; expert < EXPERTS; expert++)");
    cg_line(t, "    p[expert] /= total;");
    cg_line(t, "int chosen[TOP_K];");
    cg_line(t, "for (int k = 0; k < TOP_K; k++) {");
    cg_line(t, "int best = -1;");
    cg_line(t, "for (int expert = 0; expert < EXPERTS; expert++) {");
    cg_line(t, "int taken = 0;");
    cg_line(t, "for (int j = 0; j < k; j++)");
    cg_line(t, "    taken |= chosen[j] == expert;");
    cg_line(t, "if (!taken && (best < 0 || p[expert] > p[best]))");
    cg_line(t, "    best = expert;");
    cg_line(t, "}");
    cg_line(t, "chosen[k] = best;");
    cg_line(t, "chosen_total += p[best];");
    cg_line(t, "}");
    cg_line(t, "for (int k = 0; k < TOP_K; k++) {");
    cg_line(t, "route_expert[token * TOP_K + k] = chosen[k];");
    cg_line(t, "%s",
            cg_store(&b, p_weight, "token * TOP_K + k", "p[chosen[k]] / (NORMALIZE ? chosen_total : 1.0f)"));
    cg_line(t, "}");
    (void)p_expert;
    cg_kernel_end(&b);
}

/* ---- 2, 3. the grouped GEMMs ---------------------------------------------------------- */

/* The slot gathering every GEMM block starts a window with: slots
 * [window, window + THREADS) whose expert is this block's, in slot order,
 * into `slots`; `found` is how many. */
static void write_gather(cg_text *t) {
    cg_line(t, "int index = window + threadIdx.x;");
    cg_line(t, "int hit = index < choices && route_expert[index] == expert;");
    cg_line(t, "unsigned int votes = __ballot_sync(0xffffffffu, hit);");
    cg_line(t, "if (lane == 0)");
    cg_line(t, "    warp_hits[warp] = popcount(votes);");
    cg_line(t, "__syncthreads();");
    cg_line(t, "int found = 0, before = 0;");
    cg_line(t, "for (int w = 0; w < WARPS; w++) {");
    cg_line(t, "before += w < warp ? warp_hits[w] : 0;");
    cg_line(t, "found += warp_hits[w];");
    cg_line(t, "}");
    cg_line(t, "if (hit)");
    cg_line(t, "    slots[before + popcount(votes & ((1u << lane) - 1u))] = index;");
    cg_line(t, "__syncthreads();");
}

/* How a grouped projection's expert weights are stored: float elements, or
 * each expert a quantized [ROWS_OUT, INNER] matrix `stride` bytes after the
 * one before. */
typedef struct expert_storage {
    bool quantized;
    quant_format format;
    quant_layout matrix; /* one expert's sections */
    uint64_t stride;
    int vector; /* codes per load: 32 int4 or 16 int8 / fp8 (128 bits), or 1 */
} expert_storage;

/* The storage of expert weight operand `operand` (2, 3 or 4); false (and a
 * diagnostic) when its format does not fit it. */
static bool expert_storage_of(cg_emit *e, uint32_t operand, expert_storage *out) {
    ir_value_id w = cg_operand(e, operand);
    const ir_type *t = &e->m->values[w].type;
    *out = (expert_storage){.vector = 1};
    out->quantized = ir_weight_quant(e->m, e->m->values[w].def_op, &out->format);
    if (!out->quantized) return true;
    uint64_t total;
    if (t->rank != 3 ||
        quant_stack_layout_of(&out->format, (uint64_t)t->dims[0].size, (uint64_t)t->dims[1].size,
                              (uint64_t)t->dims[2].size, &out->matrix, &out->stride, &total)) {
        diag_error(e->d, e->ir->loc, "moe: quantized experts whose format does not fit them");
        return false;
    }
    int codes = out->format.kind == QUANT_INT4 ? 32 : 16;
    if (t->dims[2].size % codes == 0 && out->format.group % (uint32_t)codes == 0) out->vector = codes;
    return true;
}

/* The constants and the row reader of quantized experts. */
static void write_expert_reader(cg_text *t, const expert_storage *w, bool codes_only) {
    cg_line(t, "enum { K = INNER, VECTOR = %d, GROUP = %u, GROUPS = K / GROUP }; /* %s codes%s */", w->vector,
            w->format.group, quant_kind_name(w->format.kind), w->format.has_zero ? ", zero points" : "");
    cg_line(
        t,
        "enum { SCALES_AT = %llu, ZEROS_AT = %llu, COLUMN_SCALES_AT = %llu, GROUP_INDEX_AT = %llu }; /* one "
        "expert's sections */",
        (unsigned long long)w->matrix.scales, (unsigned long long)w->matrix.zeros,
        (unsigned long long)w->matrix.column_scale, (unsigned long long)w->matrix.group_index);
    cg_line(t, "#define EXPERT_BYTES %lluull /* from one expert's weights to the next */",
            (unsigned long long)w->stride);
    cg_blank(t);
    cg_write_quant_loader(t, &w->format, w->vector, codes_only);
}

/* W8A8 experts (ops.def, moe's gate_up_act_quant / down_act_quant): the
 * codes of a weight row without their scale, its scale, its column scales,
 * and an activation's code, as the GEMV's W8A8 computes them
 * (emit_gemv.c) and the reference does (ref_ops.c, ref_w8a8_row_codes);
 * the warp's max for the absmax pass, unless the scale is static. */
static void write_w8a8_helpers(cg_text *t, const expert_storage *w, quant_kind act, bool static_scale) {
    bool int8 = act == QUANT_INT8;
    cg_write_w8a8_weight_codes(t, int8, w->vector);
    cg_line(t, "/* The expert's column scale c[k] (SmoothQuant's 1 / s)%s. */",
            w->format.has_column_scale ? "" : ": 1 without them");
    cg_line(t, "SMELT_DEVICE float column_scale(quant_row r, long long k)");
    cg_line(t, "{");
    if (w->format.has_column_scale)
        cg_line(t, "return ((const float *)(r.w + r.column_scales))[k];");
    else
        cg_line(t, "return (void)r, (void)k, 1.0f;");
    cg_line(t, "}");
    cg_blank(t);
    cg_write_activation_code(t, int8);
    if (int8) {
        cg_blank(t);
        cg_line(t, "/* The sum over the 32 lanes of a warp, in every lane (exact: integers). */");
        cg_line(t, "SMELT_DEVICE int warp_sum_i32(int v)");
        cg_line(t, "{");
        cg_line(t, "for (int offset = 16; offset > 0; offset /= 2)");
        cg_line(t, "    v += smelt_shfl_xor_i32(0xffffffffu, v, offset);");
        cg_line(t, "return v;");
        cg_line(t, "}");
    }
    if (static_scale) return;
    cg_blank(t);
    cg_write_warp_max(t);
}

/* A grouped projection: block (row tile, expert) computes rows
 * [tile * ROWS, +ROWS) of weight[expert] (ROWS_OUT x INNER) (two weights,
 * gate and up, when swiglu) against the input rows of its expert's slots:
 * x[slot / TOP_K] for gate_up, hidden[slot] for down. */
typedef struct grouped_spec {
    const char *kind; /* "gate_up", "down" */
    bool swiglu;
    int64_t rows, inner;
} grouped_spec;

/* The row of the input (x for gate_up, hidden for down) that slot `slot` multiplies. */
static const char *input_row_of(cg_kernel_builder *b, const grouped_spec *g, const char *slot) {
    return arena_printf(&b->e->scratch,
                        g->swiglu ? "(long long)(%s / TOP_K) * INNER" : "(long long)%s * INNER", slot);
}

/* W8A8, after the gather: each found slot's activation scale into
 * act_scale, one warp per slot: max_k |in[k] * c[k]| / 127 or / 448 (1 for
 * a row of zeros), c the expert's column scales of gate and of up (down). */
static void write_w8a8_scales(cg_kernel_builder *b, const grouped_spec *g, uint32_t p_in, quant_kind act) {
    cg_text *t = &b->text;
    const char *bound = act == QUANT_INT8 ? "127.0f" : "448.0f";
    cg_line(t, "/* each slot's activation scale: its row's absmax (times the column scales) / %s */",
            act == QUANT_INT8 ? "127" : "448");
    if (g->swiglu) {
        cg_line(
            t, "quant_row gate_columns = quant_row_at(gate + expert * EXPERT_BYTES, 0, SCALES_AT, ZEROS_AT,");
        cg_line(t, "                                      COLUMN_SCALES_AT, GROUP_INDEX_AT);");
        cg_line(t, "quant_row up_columns = quant_row_at(up + expert * EXPERT_BYTES, 0, SCALES_AT, ZEROS_AT,");
        cg_line(t, "                                    COLUMN_SCALES_AT, GROUP_INDEX_AT);");
    } else {
        cg_line(
            t, "quant_row down_columns = quant_row_at(down + expert * EXPERT_BYTES, 0, SCALES_AT, ZEROS_AT,");
        cg_line(t, "                                      COLUMN_SCALES_AT, GROUP_INDEX_AT);");
    }
    cg_line(t, "/* one warp per slot: the loop is warp-uniform */");
    cg_line(t, "for (int m = warp; m < found; m += WARPS) {");
    cg_line(t, "long long in_row = %s;", input_row_of(b, g, "slots[m]"));
    cg_line(t, g->swiglu ? "float gate_max = 0.0f, up_max = 0.0f;" : "float down_max = 0.0f;");
    cg_line(t, "for (int k = lane; k < INNER; k += 32) {");
    cg_line(t, "float v = %s;", cg_load(b, p_in, "in_row + k"));
    if (g->swiglu) {
        cg_line(t, "gate_max = fmaxf(gate_max, fabsf(v * column_scale(gate_columns, k)));");
        cg_line(t, "up_max = fmaxf(up_max, fabsf(v * column_scale(up_columns, k)));");
    } else {
        cg_line(t, "down_max = fmaxf(down_max, fabsf(v * column_scale(down_columns, k)));");
    }
    cg_line(t, "}");
    if (g->swiglu) {
        cg_line(t, "gate_max = warp_max(gate_max);");
        cg_line(t, "up_max = warp_max(up_max);");
        cg_line(t, "if (lane == 0) {");
        cg_line(t, "act_scale[m][0] = gate_max > 0.0f ? gate_max / %s : 1.0f;", bound);
        cg_line(t, "act_scale[m][1] = up_max > 0.0f ? up_max / %s : 1.0f;", bound);
        cg_line(t, "}");
    } else {
        cg_line(t, "down_max = warp_max(down_max);");
        cg_line(t, "if (lane == 0)");
        cg_line(t, "    act_scale[m][0] = down_max > 0.0f ? down_max / %s : 1.0f;", bound);
    }
    cg_line(t, "}");
    cg_line(t, "__syncthreads();");
}

/* W8A8, one tile of TILE slots against this warp's row: each element of a
 * slot's input row times the column scale becomes a code of the slot's
 * scale (ACT_SCALE when static_scale), summed times the weight's codes
 * (int8: in int32, exact for INNER < 2^31 / 127^2; E4M3: in f32, each
 * product exact), then times the slot's and the row's scales, as the
 * GEMV's W8A8 (emit_gemv.c). */
static void write_w8a8_tile(cg_kernel_builder *b, const grouped_spec *g, uint32_t p_in, uint32_t p_weight,
                            uint32_t p_scratch, quant_kind act, bool static_scale) {
    cg_text *t = &b->text;
    const char *code_type = act == QUANT_INT8 ? "int" : "float";
    /* each slot's scale against gate's (and down's) column scales, and against up's */
    const char *scale = static_scale ? "ACT_SCALE" : "act_scale[tile + m][0]";
    const char *up_scale = static_scale ? "ACT_SCALE" : "act_scale[tile + m][1]";
    if (g->swiglu) {
        cg_line(t, "%s g[TILE], u[TILE]; /* sums of code products */", code_type);
        cg_line(t, "for (int m = 0; m < TILE; m++)");
        cg_line(t, "    g[m] = u[m] = 0;");
    } else {
        cg_line(t, "%s sum[TILE]; /* sums of code products */", code_type);
        cg_line(t, "for (int m = 0; m < TILE; m++)");
        cg_line(t, "    sum[m] = 0;");
    }
    cg_line(t, "for (int c = lane; c < INNER / VECTOR; c += 32) {");
    if (g->swiglu) {
        cg_line(t, "%s gq[VECTOR], uq[VECTOR];", code_type);
        cg_line(t, "load_codes(gate_row, c, gq);");
        cg_line(t, "load_codes(up_row, c, uq);");
    } else {
        cg_line(t, "%s dq[VECTOR];", code_type);
        cg_line(t, "load_codes(down_row, c, dq);");
    }
    cg_line(t, "for (int m = 0; m < TILE; m++) {");
    cg_line(t, "if (m >= count)");
    cg_line(t, "    break;");
    cg_line(t, "for (int j = 0; j < VECTOR; j++) {");
    cg_line(t, "long long k = (long long)c * VECTOR + j;");
    cg_line(t, "float v = %s;", cg_load(b, p_in, "input_row[m] + k"));
    if (g->swiglu) {
        cg_line(t, "g[m] += activation_code(v * column_scale(gate_row, k) / %s) * gq[j];", scale);
        cg_line(t, "u[m] += activation_code(v * column_scale(up_row, k) / %s) * uq[j];", up_scale);
    } else {
        cg_line(t, "sum[m] += activation_code(v * column_scale(down_row, k) / %s) * dq[j];", scale);
    }
    cg_line(t, "}");
    cg_line(t, "}");
    cg_line(t, "}");
    const char *reduce = act == QUANT_INT8 ? "warp_sum_i32" : "warp_sum";
    cg_line(t, "for (int m = 0; m < TILE; m++) {");
    cg_line(t, "if (m >= count)");
    cg_line(t, "    break; /* warp-uniform */");
    if (g->swiglu) {
        cg_line(t, "float gm = (float)%s(g[m]) * %s * row_scale(gate_row);", reduce, scale);
        cg_line(t, "float um = (float)%s(u[m]) * %s * row_scale(up_row);", reduce, up_scale);
        cg_line(t, "if (lane == 0)");
        cg_line(t, "    %s",
                cg_store(b, p_scratch, "(long long)slots[tile + m] * FFN_DIM + row",
                         "gm / (1.0f + expf(-gm)) * um"));
    } else {
        cg_line(t, "float total = (float)%s(sum[m]) * %s * row_scale(down_row);", reduce, scale);
        cg_line(t, "int slot = slots[tile + m];");
        cg_line(t, "if (lane == 0)");
        cg_line(t, "    %s",
                cg_store(b, p_scratch, "(long long)SLOTS * FFN_DIM + (long long)slot * MODEL_DIM + row",
                         arena_printf(&b->e->scratch, "%s * total", cg_load(b, p_weight, "slot"))));
    }
    /* the caller closes the loop over the tile's slots */
}

static bool emit_grouped(cg_emit *e, const moe_shape *s, const grouped_spec *g) {
    ir_value_id x = cg_operand(e, 0);
    expert_storage storage, up_storage;
    if (!expert_storage_of(e, g->swiglu ? 2 : 4, &storage) ||
        (g->swiglu && !expert_storage_of(e, 3, &up_storage)))
        return false;
    if (g->swiglu &&
        (storage.quantized != up_storage.quantized ||
         (storage.quantized && !quant_format_same_storage(&storage.format, &up_storage.format)))) {
        diag_error(e->d, e->ir->loc,
                   "moe: the gate and up experts are stored differently (one kernel reads both): quantize "
                   "or keep both (--keep)");
        return false;
    }
    /* W8A8: the input rows quantized per row to the codes of the experts' kind (ops.def) */
    const char *act_name = cg_attr_string(e, g->swiglu ? "gate_up_act_quant" : "down_act_quant", "none");
    quant_kind act = strcmp(act_name, "i8") == 0       ? QUANT_INT8
                     : strcmp(act_name, "f8e4m3") == 0 ? QUANT_FP8
                                                       : QUANT_NONE;
    if (act != QUANT_NONE && (!storage.quantized || storage.format.kind != act)) {
        diag_error(e->d, e->ir->loc, "moe: %s_act_quant = \"%s\" over experts that are not %s", g->kind,
                   act_name, quant_kind_name(act));
        return false;
    }
    /* act_scale tensor: one static scale for every slot of every expert (ops.def) */
    double static_scale = 0.0;
    if (act != QUANT_NONE && strcmp(cg_attr_string(e, "act_scale", "none"), "tensor") == 0) {
        const char *value_name = g->swiglu ? "gate_up_act_scale_value" : "down_act_scale_value";
        static_scale = cg_attr_float(e, value_name, 0.0);
        if (!((float)static_scale > 0.0f) || !isfinite((float)static_scale)) {
            diag_error(e->d, e->ir->loc, "moe: expected %s > 0 for act_scale tensor", value_name);
            return false;
        }
    }
    const char *name = arena_printf(&e->scratch, "moe_%s_%s", g->kind, s->tag);
    if (storage.quantized) /* the format: group, zero points, act-order, column scales */
        name = arena_printf(&e->scratch, "%s_g%u%s%s%s", name, storage.format.group,
                            storage.format.has_zero ? "z" : "", storage.format.has_group_index ? "o" : "",
                            storage.format.has_column_scale ? "c" : "");
    if (act != QUANT_NONE) /* W8A8: the activations' codes, per row or (s) of a static scale */
        name = arena_printf(&e->scratch, "%s_a%s%s", name, act == QUANT_INT8 ? "i8" : "f8",
                            static_scale > 0.0 ? "s" : "");
    cg_kernel_builder b;
    cg_kernel_begin(&b, e, name,
                    g->swiglu
                        ? "Grouped GEMM over (F-tile, expert) blocks: the block gathers its expert's "
                          "slots, each warp streams ROWS_PER_WARP rows of gate and up (128-bit loads, "
                          "f32 sums) over TILE slots at a time; hidden = silu(gate x) * up x."
                        : "Grouped GEMM over (D-tile, expert) blocks: the block gathers its expert's "
                          "slots, each warp streams ROWS_PER_WARP rows of down (128-bit loads, f32 "
                          "sums) over TILE hidden rows at a time; partial = route weight * down hidden.");
    uint32_t p_in = 0, p_gate = 0, p_up = 0, p_down = 0;
    if (g->swiglu) {
        p_in = cg_param_value(&b, "x", x, true);
        p_gate = cg_param_value(&b, "gate", cg_operand(e, 2), true);
        p_up = cg_param_value(&b, "up", cg_operand(e, 3), true);
    } else {
        p_down = cg_param_value(&b, "down", cg_operand(e, 4), true);
    }
    cg_param_state(&b, "route_expert", MOE_STATE_EXPERT, SMELT_DTYPE_I32);
    uint32_t p_weight = cg_param_state(&b, "route_weight", MOE_STATE_WEIGHT, SMELT_DTYPE_F32);
    uint32_t p_scratch = cg_param_state(&b, "scratch", MOE_STATE_SCRATCH, s->scratch_dtype);
    if (!g->swiglu) p_in = p_scratch;
    cg_param_tokens(&b);
    int64_t rows_per_block = MOE_WARPS * MOE_ROWS_PER_WARP;
    cg_kernel_launch(&b, (prog_affine){0, (g->rows + rows_per_block - 1) / rows_per_block, 1},
                     (prog_affine){0, s->experts, 1}, MOE_THREADS);
    cg_kernel_open(&b);
    cg_text *t = &b.text;
    cg_line(t, "enum { MODEL_DIM = %lld, FFN_DIM = %lld, TOP_K = %lld };", (long long)s->model_dim,
            (long long)s->ffn, (long long)s->top_k);
    cg_line(t, "enum { ROWS_OUT = %s, INNER = %s }; /* the weight's rows and their length */",
            g->swiglu ? "FFN_DIM" : "MODEL_DIM", g->swiglu ? "MODEL_DIM" : "FFN_DIM");
    cg_line(t, "enum { THREADS = %d, WARPS = THREADS / 32, ROWS_PER_WARP = %d, TILE = %d };", MOE_THREADS,
            MOE_ROWS_PER_WARP, MOE_TILE);
    cg_line(t, "enum { SLOTS = %lld }; /* token bound * TOP_K: hidden rows, then partial rows, in scratch */",
            (long long)(s->token_bound * s->top_k));
    if (static_scale > 0.0)
        cg_line(t, "#define ACT_SCALE %s /* act_scale tensor: %s's static scale, every slot's */",
                cg_float_literal(e, (float)static_scale), g->swiglu ? "x" : "the hidden rows");
    cg_blank(t);
    bool quantized = storage.quantized;
    /* the x rows element by element too (W8A8 reads them so: one code each) */
    if (quantized && act == QUANT_NONE && !vectorizable(&b, p_in)) storage.vector = 1;
    bool vector = act != QUANT_NONE ? false
                  : quantized       ? storage.vector > 1
                                    : g->inner % MOE_VECTOR == 0 && vectorizable(&b, p_in) &&
                                    (g->swiglu ? vectorizable(&b, p_gate) && vectorizable(&b, p_up)
                                               : vectorizable(&b, p_down));
    if (vector) write_vector_helpers(t);
    if (quantized) write_expert_reader(t, &storage, act != QUANT_NONE);
    if (act != QUANT_NONE) write_w8a8_helpers(t, &storage, act, static_scale > 0.0);
    write_popcount(t);
    if (act != QUANT_INT8) cg_write_warp_sum(t); /* int8 sums its integers: warp_sum_i32 */
    cg_kernel_signature(&b);
    cg_line(t, "__shared__ int slots[THREADS];    /* this expert's slots in the window */");
    cg_line(t, "__shared__ int warp_hits[WARPS];");
    if (act != QUANT_NONE && static_scale <= 0.0)
        cg_line(t, "__shared__ float act_scale[THREADS][%d]; /* each slot's activation scale%s */",
                g->swiglu ? 2 : 1, g->swiglu ? ": against gate's (0) and up's (1) column scales" : "");
    cg_line(t, "int lane = threadIdx.x %% 32, warp = threadIdx.x / 32;");
    cg_line(t, "long long expert = blockIdx.y;");
    cg_line(t, "int choices = tokens * TOP_K;");
    cg_line(t, "for (int window = 0; window < choices; window += THREADS) {");
    write_gather(t);
    if (act != QUANT_NONE && static_scale <= 0.0) write_w8a8_scales(&b, g, p_in, act);
    cg_line(t, "for (int r = 0; r < ROWS_PER_WARP; r++) {");
    cg_line(t, "int row = (blockIdx.x * WARPS + warp) * ROWS_PER_WARP + r;");
    cg_line(t, "if (row >= ROWS_OUT)");
    cg_line(t, "    break; /* warp-uniform */");
    if (!quantized) {
        cg_line(t, "long long weight_row = (expert * ROWS_OUT + row) * INNER;");
    } else if (g->swiglu) {
        cg_line(t,
                "quant_row gate_row = quant_row_at(gate + expert * EXPERT_BYTES, row, SCALES_AT, ZEROS_AT,");
        cg_line(t, "                                  COLUMN_SCALES_AT, GROUP_INDEX_AT);");
        cg_line(t, "quant_row up_row = quant_row_at(up + expert * EXPERT_BYTES, row, SCALES_AT, ZEROS_AT,");
        cg_line(t, "                                COLUMN_SCALES_AT, GROUP_INDEX_AT);");
    } else {
        cg_line(t,
                "quant_row down_row = quant_row_at(down + expert * EXPERT_BYTES, row, SCALES_AT, ZEROS_AT,");
        cg_line(t, "                                  COLUMN_SCALES_AT, GROUP_INDEX_AT);");
    }
    cg_line(t, "for (int tile = 0; tile < found; tile += TILE) {");
    cg_line(t, "int count = found - tile < TILE ? found - tile : TILE;");
    cg_line(t, "long long input_row[TILE];");
    cg_line(t, "for (int m = 0; m < TILE; m++)");
    if (g->swiglu)
        cg_line(t, "    input_row[m] = m < count ? (long long)(slots[tile + m] / TOP_K) * INNER : 0;");
    else
        cg_line(t, "    input_row[m] = m < count ? (long long)slots[tile + m] * INNER : 0;");
    if (act != QUANT_NONE) {
        write_w8a8_tile(&b, g, p_in, p_weight, p_scratch, act, static_scale > 0.0);
    } else {
        if (g->swiglu) {
            cg_line(t, "float g[TILE], u[TILE];");
            cg_line(t, "for (int m = 0; m < TILE; m++)");
            cg_line(t, "    g[m] = u[m] = 0.0f;");
        } else {
            cg_line(t, "float sum[TILE];");
            cg_line(t, "for (int m = 0; m < TILE; m++)");
            cg_line(t, "    sum[m] = 0.0f;");
        }
        if (quantized && vector) {
            cg_line(t, "for (int c = lane; c < INNER / VECTOR; c += 32) {");
            if (g->swiglu) {
                cg_line(t, "float gs[VECTOR], us[VECTOR];");
                cg_line(t, "load_weight(gate_row, c, gs);");
                cg_line(t, "load_weight(up_row, c, us);");
            } else {
                cg_line(t, "float ds[VECTOR];");
                cg_line(t, "load_weight(down_row, c, ds);");
            }
            cg_line(t, "for (int m = 0; m < TILE; m++) {");
            cg_line(t, "if (m >= count)");
            cg_line(t, "    break;");
            cg_line(t, "for (int h = 0; h < VECTOR / 8; h++) {");
            cg_line(t, "float xs[8];");
            cg_line(t, "%s;", load8(&b, p_in, "input_row[m] + (long long)c * VECTOR + 8 * h", "xs"));
            cg_line(t, "for (int j = 0; j < 8; j++) {");
            if (g->swiglu) {
                cg_line(t, "g[m] += xs[j] * gs[8 * h + j];");
                cg_line(t, "u[m] += xs[j] * us[8 * h + j];");
            } else {
                cg_line(t, "sum[m] += xs[j] * ds[8 * h + j];");
            }
            cg_line(t, "}");
            cg_line(t, "}");
            cg_line(t, "}");
            cg_line(t, "}");
        } else if (vector) {
            cg_line(t, "for (int i = lane * 8; i < INNER; i += 32 * 8) {");
            if (g->swiglu) {
                cg_line(t, "float gs[8], us[8];");
                cg_line(t, "%s;", load8(&b, p_gate, "weight_row + i", "gs"));
                cg_line(t, "%s;", load8(&b, p_up, "weight_row + i", "us"));
            } else {
                cg_line(t, "float ds[8];");
                cg_line(t, "%s;", load8(&b, p_down, "weight_row + i", "ds"));
            }
            cg_line(t, "for (int m = 0; m < TILE; m++) {");
            cg_line(t, "if (m >= count)");
            cg_line(t, "    break;");
            cg_line(t, "float xs[8];");
            cg_line(t, "%s;", load8(&b, p_in, "input_row[m] + i", "xs"));
            cg_line(t, "for (int j = 0; j < 8; j++) {");
            if (g->swiglu) {
                cg_line(t, "g[m] += xs[j] * gs[j];");
                cg_line(t, "u[m] += xs[j] * us[j];");
            } else {
                cg_line(t, "sum[m] += xs[j] * ds[j];");
            }
            cg_line(t, "}");
            cg_line(t, "}");
            cg_line(t, "}");
        } else {
            cg_line(t, "for (int i = lane; i < INNER; i += 32) {");
            if (quantized && g->swiglu) {
                cg_line(t, "float gw, uw;");
                cg_line(t, "load_weight(gate_row, i, &gw);");
                cg_line(t, "load_weight(up_row, i, &uw);");
            } else if (quantized) {
                cg_line(t, "float dw;");
                cg_line(t, "load_weight(down_row, i, &dw);");
            } else if (g->swiglu) {
                cg_line(t, "float gw = %s, uw = %s;", cg_load(&b, p_gate, "weight_row + i"),
                        cg_load(&b, p_up, "weight_row + i"));
            } else {
                cg_line(t, "float dw = %s;", cg_load(&b, p_down, "weight_row + i"));
            }
            cg_line(t, "for (int m = 0; m < TILE; m++) {");
            cg_line(t, "if (m >= count)");
            cg_line(t, "    break;");
            cg_line(t, "float xv = %s;", cg_load(&b, p_in, "input_row[m] + i"));
            if (g->swiglu) {
                cg_line(t, "g[m] += xv * gw;");
                cg_line(t, "u[m] += xv * uw;");
            } else {
                cg_line(t, "sum[m] += xv * dw;");
            }
            cg_line(t, "}");
            cg_line(t, "}");
        }
        cg_line(t, "for (int m = 0; m < TILE; m++) {");
        cg_line(t, "if (m >= count)");
        cg_line(t, "    break; /* warp-uniform */");
        if (g->swiglu) {
            cg_line(t, "float gm = warp_sum(g[m]), um = warp_sum(u[m]);");
            cg_line(t, "if (lane == 0)");
            cg_line(t, "    %s",
                    cg_store(&b, p_scratch, "(long long)slots[tile + m] * FFN_DIM + row",
                             "gm / (1.0f + expf(-gm)) * um"));
        } else {
            cg_line(t, "float total = warp_sum(sum[m]);");
            cg_line(t, "int slot = slots[tile + m];");
            cg_line(t, "if (lane == 0)");
            cg_line(t, "    %s",
                    cg_store(&b, p_scratch, "(long long)SLOTS * FFN_DIM + (long long)slot * MODEL_DIM + row",
                             arena_printf(&e->scratch, "%s * total", cg_load(&b, p_weight, "slot"))));
        }
    }
    cg_line(t, "}");
    cg_line(t, "}");
    cg_line(t, "}");
    cg_line(t, "__syncthreads(); /* slots is rewritten by the next window */");
    cg_line(t, "}");
    (void)p_weight;
    cg_kernel_end(&b);
    return true;
}

/* ---- 4. combine ----------------------------------------------------------------------- */

static void emit_combine(cg_emit *e, const moe_shape *s) {
    const char *name = arena_printf(&e->scratch, "moe_combine_%s", s->tag);
    cg_kernel_builder b;
    cg_kernel_begin(&b, e, name,
                    "One thread per output element: the sum of the token's TOP_K weighted expert rows "
                    "from scratch, in k order.");
    uint32_t p_scratch = cg_param_state(&b, "scratch", MOE_STATE_SCRATCH, s->scratch_dtype);
    uint32_t p_out = cg_param_value(&b, "out", cg_result(e, 0), false);
    cg_param_tokens(&b);
    cg_count elements = {s->tokens.per_token * s->model_dim, s->tokens.constant * s->model_dim};
    cg_kernel_launch(&b, cg_count_blocks(elements, MOE_THREADS), (prog_affine){0, 1, 1}, MOE_THREADS);
    cg_kernel_open(&b);
    cg_text *t = &b.text;
    cg_line(t, "enum { MODEL_DIM = %lld, FFN_DIM = %lld, TOP_K = %lld, THREADS = %d };",
            (long long)s->model_dim, (long long)s->ffn, (long long)s->top_k, MOE_THREADS);
    cg_line(t, "enum { SLOTS = %lld }; /* partial rows start after SLOTS hidden rows */",
            (long long)(s->token_bound * s->top_k));
    cg_blank(t);
    cg_kernel_signature(&b);
    cg_line(t, "long long i = (long long)blockIdx.x * THREADS + threadIdx.x;");
    cg_line(t, "if (i >= (long long)tokens * MODEL_DIM)");
    cg_line(t, "    return;");
    cg_line(t, "long long token = i / MODEL_DIM, d = i %% MODEL_DIM;");
    cg_line(t, "float total = 0.0f;");
    cg_line(t, "for (int k = 0; k < TOP_K; k++)");
    cg_line(t, "    total += %s;",
            cg_load(&b, p_scratch, "(long long)SLOTS * FFN_DIM + (token * TOP_K + k) * MODEL_DIM + d"));
    cg_line(t, "%s", cg_store(&b, p_out, "i", "total"));
    cg_kernel_end(&b);
}

/* ---- the op ----------------------------------------------------------------------------- */

static bool read_shape(cg_emit *e, moe_shape *s) {
    ir_value_id x = cg_operand(e, 0), result = cg_result(e, 0);
    cg_shape xs = cg_shape_of(e, x), router = cg_shape_of(e, cg_operand(e, 1));
    cg_shape gate = cg_shape_of(e, cg_operand(e, 2)), up = cg_shape_of(e, cg_operand(e, 3));
    cg_shape down = cg_shape_of(e, cg_operand(e, 4));
    bool floats = true; /* or quantized experts, whose codes dequantize to floats */
    for (uint32_t i = 0; i < 5; i++)
        floats &= smelt_dtype_is_float(e->m->values[cg_operand(e, i)].type.dtype) ||
                  (i >= 2 && cg_is_quantized(e->m, cg_operand(e, i)));
    if (!floats || xs.rank != 2 || router.rank != 2 || gate.rank != 3 || up.rank != 3 || down.rank != 3) {
        diag_error(e->d, e->ir->loc,
                   "moe: expected float x[T, D], router[E, D], gate[E, F, D], up[E, F, D] and down[E, D, F]");
        return false;
    }
    int64_t model_dim = xs.dims[1], experts = router.dims[0], ffn = gate.dims[1];
    bool consistent = router.dims[1] == model_dim && gate.dims[0] == experts && gate.dims[2] == model_dim &&
                      up.dims[0] == experts && up.dims[1] == ffn && up.dims[2] == model_dim &&
                      down.dims[0] == experts && down.dims[1] == model_dim && down.dims[2] == ffn &&
                      !router.token0 && !gate.token0 && !up.token0 && !down.token0;
    if (!consistent) {
        diag_error(e->d, e->ir->loc,
                   "moe: the expert weights do not agree on E = %lld, D = %lld and F = %lld",
                   (long long)experts, (long long)model_dim, (long long)ffn);
        return false;
    }
    cg_shape out_shape = cg_shape_of(e, result);
    if (!cg_expect(e, cg_same_shape(&xs, &out_shape), "a result of x's shape")) return false;
    int64_t top_k = cg_attr_int(e, "top_k", 0);
    if (top_k < 1 || top_k > experts) {
        diag_error(e->d, e->ir->loc, "moe: top_k %lld must be in [1, %lld] (the number of experts)",
                   (long long)top_k, (long long)experts);
        return false;
    }
    if (experts > MOE_EXPERT_LIMIT) {
        diag_error(e->d, e->ir->loc,
                   "moe: codegen keeps the router's probabilities in shared memory: at most %d "
                   "experts, not %lld",
                   MOE_EXPERT_LIMIT, (long long)experts);
        return false;
    }
    ir_value_id stored[6] = {x,     cg_operand(e, 1), cg_operand(e, 2), cg_operand(e, 3), cg_operand(e, 4),
                             result};
    *s = (moe_shape){.model_dim = model_dim,
                     .experts = experts,
                     .ffn = ffn,
                     .top_k = top_k,
                     .token_bound = xs.dims[0],
                     .normalize = cg_attr_bool(e, "normalize", true),
                     .tokens = cg_shape_count(&xs, 0, 1),
                     .scratch_dtype = cg_storage_dtype(e->m, result)};
    /* W8A8 down quantizes the hidden rows as f32 (ops.def): they are not rounded to the storage dtype first
     */
    if (strcmp(cg_attr_string(e, "down_act_quant", "none"), "none") != 0) s->scratch_dtype = SMELT_DTYPE_F32;
    s->tag = arena_printf(&e->scratch, "%s_e%lld_k%lld_d%lld_f%lld", cg_dtype_tag(e, stored, 6),
                          (long long)experts, (long long)top_k, (long long)model_dim, (long long)ffn);
    return true;
}

/* The state buffers: route_expert int32[SLOTS], route_weight f32[SLOTS] and
 * scratch [SLOTS * (F + D)] of the result's dtype (hidden rows, then the
 * partial rows), SLOTS = token bound * top_k. Each step writes every slot it
 * reads first, so they need no zeroing. */
static bool size_states(cg_emit *e, const moe_shape *s) {
    uint64_t slots, scratch_elements, scratch_bytes, slot_bytes;
    bool ok = !__builtin_mul_overflow((uint64_t)s->token_bound, (uint64_t)s->top_k, &slots) &&
              !__builtin_mul_overflow(slots, (uint64_t)s->ffn + (uint64_t)s->model_dim, &scratch_elements) &&
              !__builtin_mul_overflow(scratch_elements, (uint64_t)smelt_dtype_element_bytes(s->scratch_dtype),
                                      &scratch_bytes) &&
              !__builtin_mul_overflow(slots, 4u, &slot_bytes) && scratch_bytes <= MOE_STATE_LIMIT &&
              slots <= INT32_MAX / 2;
    if (!ok) {
        diag_error(e->d, e->ir->loc,
                   "moe: the scratch rows of %lld tokens x top_k %lld x (F %lld + D %lld) are too large",
                   (long long)s->token_bound, (long long)s->top_k, (long long)s->ffn,
                   (long long)s->model_dim);
        return false;
    }
    e->out->state_count = 3;
    e->out->state_bytes[MOE_STATE_EXPERT] = slot_bytes;
    e->out->state_bytes[MOE_STATE_WEIGHT] = slot_bytes;
    e->out->state_bytes[MOE_STATE_SCRATCH] = scratch_bytes;
    for (int i = 0; i < 3; i++)
        e->out->state_rows[i] = 0;
    return true;
}

static prog_cost *new_cost(cg_emit *e, uint32_t kernel) {
    prog_cost *cost = arena_alloc(e->a, sizeof *cost);
    *cost = (prog_cost){0};
    e->out->kernels[kernel].cost = cost;
    return cost;
}

/* Modeled costs (program.h): the router read once (L2 serves the other
 * blocks), x and the route slots once; each chosen expert's gate, up and
 * down matrices once per step: top_k experts, the decode truth (a step of T
 * tokens touches min(E, T * top_k) experts, which a polynomial in T cannot
 * say: prefill is modeled low on weight bytes, and is flop-bound there); the
 * hidden and partial rows written once and read once. */
/* Bytes of one expert of weight operand `operand` (2, 3, 4): its rows x
 * cols elements, or its quantized matrix with scales, zeros, ... */
static double expert_bytes(cg_emit *e, uint32_t operand) {
    expert_storage w;
    const ir_type *t = &e->m->values[cg_operand(e, operand)].type;
    if (expert_storage_of(e, operand, &w) && w.quantized) return (double)w.stride;
    return (double)t->dims[1].size * (double)t->dims[2].size *
           (double)smelt_dtype_element_bytes(cg_storage_dtype(e->m, cg_operand(e, operand)));
}

static void set_costs(cg_emit *e, const moe_shape *s) {
    double bytes[6];
    for (uint32_t i = 0; i < 5; i++)
        bytes[i] = (double)smelt_dtype_element_bytes(cg_storage_dtype(e->m, cg_operand(e, i)));
    bytes[5] = (double)smelt_dtype_element_bytes(cg_storage_dtype(e->m, cg_result(e, 0)));
    double scratch = (double)smelt_dtype_element_bytes(s->scratch_dtype);
    double d = (double)s->model_dim, f = (double)s->ffn, k = (double)s->top_k, experts = (double)s->experts;
    prog_poly tokens = {.constant = (double)s->tokens.constant, .per_token = (double)s->tokens.per_token};
    prog_poly one = {.constant = 1};
    prog_cost *route = new_cost(e, 0), *gate_up = new_cost(e, 1), *down = new_cost(e, 2),
              *combine = new_cost(e, 3);
    route->read =
        prog_poly_sum(prog_poly_scaled(one, experts * d * bytes[1]), prog_poly_scaled(tokens, d * bytes[0]));
    route->written = prog_poly_scaled(tokens, k * 8);
    route->flops = prog_poly_scaled(tokens, 2 * experts * d);
    gate_up->read = prog_poly_sum(prog_poly_scaled(one, k * (expert_bytes(e, 2) + expert_bytes(e, 3))),
                                  prog_poly_scaled(tokens, d * bytes[0] + k * 4));
    gate_up->written = prog_poly_scaled(tokens, k * f * scratch);
    gate_up->flops = prog_poly_scaled(tokens, k * 4 * f * d);
    down->read = prog_poly_sum(prog_poly_scaled(one, k * expert_bytes(e, 4)),
                               prog_poly_scaled(tokens, k * f * scratch + k * 8));
    down->written = prog_poly_scaled(tokens, k * d * scratch);
    down->flops = prog_poly_scaled(tokens, k * 2 * d * f);
    combine->read = prog_poly_scaled(tokens, k * d * scratch);
    combine->written = prog_poly_scaled(tokens, d * bytes[5]);
    combine->flops = prog_poly_scaled(tokens, k * d);
}

bool cg_emit_moe(cg_emit *e) {
    moe_shape s;
    if (!read_shape(e, &s) || !size_states(e, &s)) return false;
    emit_route(e, &s);
    if (!emit_grouped(e, &s, &(grouped_spec){"gate_up", true, s.ffn, s.model_dim}) ||
        !emit_grouped(e, &s, &(grouped_spec){"down", false, s.model_dim, s.ffn}))
        return false;
    emit_combine(e, &s);
    set_costs(e, &s);
    e->out->kind = CG_LOWER_KERNELS;
    return true;
}
