/* precision.c - the precision pass: the storage dtype of every value, and
 * which weights are quantized, in what format.
 *
 * Requires: every value typed (infer-shapes).
 * Guarantees: each value's dtype is the dtype it is stored in, chosen by the
 *   preset in pass_options.precision, and m->precision names that preset;
 *   from then on float ops may mix float dtypes (they compute in f32 and
 *   store in their result's dtype), which the shape rules and the verifier
 *   accept. Integer values are stored as i32 under every preset (ids,
 *   positions and argmax results: the runtime bounds them below 2^31).
 *   A quantized weight has its codes' dtype (i4, i8, f8e4m3) and its format
 *   in its attributes (quant, group, zero, method: ops.def), so the
 *   decision prints, parses back and is verified; the driver quantizes the
 *   checkpoint's f32 tensor into that format (driver/quantize.c).
 * Presets (activations are the storage of every float value but what an
 *   `output` reads, which stays f32 with every value sharing its buffer
 *   through reshape views, a rope_table's cos and sin, f32 always, and
 *   a MoE router's weight, stored in f32 as the router computes: the
 *   top-k choice is where a rounding flips a result; norms, softmax, the
 *   router, RoPE angles and every accumulation compute in f32 whatever
 *   the storage):
 *   f32       every float value f32;
 *   bf16      every float value bf16;
 *   int4-rtn  bf16, and matmul weights W4A16: int4 codes with f16 scales and
 *             int4 zero points per group of `group_size` input columns
 *             (32, 64 or 128; a weight of fewer columns has one group per
 *             row), rounded to nearest;
 *   int4-awq  int4-rtn's format with column scales: AWQ's activation-aware
 *             per-input-channel scaling (quant/awq.c), searched on
 *             calibration statistics when the driver fills the weights;
 *   int4-gptq int4-rtn's format, codes chosen by GPTQ's Hessian-based error
 *             compensation (quant/gptq.c); with act_order each column's
 *             group is in a group index (columns by descending XᵀX diagonal);
 *   int8      bf16, and W8A8: matmul weights int8 codes, one f16 scale per
 *             output channel (symmetric), with SmoothQuant's column scales
 *             (method smooth, alpha 0.5, learnt from calibration statistics
 *             when the driver fills the weights: the 1/s of the activation
 *             side stays the matmul's column scale c[k]), and each matmul's
 *             input quantized to int8 per token at run time (act_quant "i8",
 *             act_scale "token": ops.def);
 *   fp8       bf16, and W8A8: matmul weights E4M3 codes, one f16 scale per
 *             output channel, rounded to nearest, and each matmul's input
 *             quantized to E4M3 per token (act_quant "f8e4m3").
 *   `act_quant` "none" makes int8 and fp8 weight-only (W8A16: round to
 *   nearest, no column scales, the activations stay in their float dtype);
 *   "tensor" (fp8) gives each matmul a static per-tensor scale instead,
 *   act_scale "tensor" with act_scale_value from pass_options.act_scales by
 *   its weight's name (the driver's calibration: max |x| / 448), an error
 *   at the matmul when none is given; and each moe its experts' two
 *   (below). A pre-quantized FP8 checkpoint's
 *   weights (method "checkpoint") are W8A8 under fp8 too: per tensor at
 *   their input_scale when act_scales has one for them (the last entry of a
 *   name wins), else per token.
 *   `activations` overrides the float storage ("f32" keeps the weights'
 *   quantization and stores everything else in f32: what the tests compare
 *   with the reference interpreter's dequantized arithmetic; "f16" stores
 *   every float value, unquantized weights included, in IEEE f16 instead of
 *   bf16: 3 more mantissa bits, but finite only up to 65504, so a model
 *   whose activations or weights exceed that overflows to infinity — the
 *   user's choice, docs/quantization.md).
 * Layout: an int4 matmul weight (not MoE experts) without act-order whose columns are a multiple
 *   of 128 (an imported one too) has its codes interleaved for the
 *   tensor-core dequantize-GEMM of prefill steps, layout = "mma_k16"
 *   (quant/quant.h; the decode GEMV reads that order as well).
 * Which weights are quantized: 2-D, unstacked, read only by matmuls of
 *   layout out_in as their weight (so the norms and biases stay in the
 *   activation dtype) — or only by in_out ones (GPT-2's Conv1D), each then
 *   transposed to out_in (`transposed`, ops.def; its matmuls' layout
 *   out_in) where the preset quantizes it, so a transposed weight is always
 *   a quantized one — and MoE experts: [E, N, K]
 *   weights read only by moe ops as their gate, up or down, each expert an
 *   [N, K] matrix in the same format (quant_stack_layout_of); whose input
 *   columns the group divides, and whose name (or the name without
 *   ".weight") matches none of the `keep` patterns
 *   (ir_tensor_pattern_matches: "lm_head,*.down_proj,*.experts.*"). Under int4-awq,
 *   int4-gptq and int8 (SmoothQuant) each expert learns from its own
 *   calibration statistics, over the tokens routed to it
 *   (driver/calibrate.c). Under int8 and fp8 W8A8 the experts are W8A8
 *   too: the moe's gate_up_act_quant (x, for gate and up) and
 *   down_act_quant (the hidden rows, for down), act_scale token (ops.def),
 *   each for the stacks that are quantized of the preset's kind; under
 *   "tensor" (fp8) act_scale tensor with one static scale for x and one
 *   for the hidden rows, shared by every expert (vLLM's FP8 MoE):
 *   gate_up_act_scale_value from the gate and up stacks' entries of
 *   pass_options.act_scales (by the stack's name; calibration makes each
 *   the max over the experts of max |x| / 448) and down_act_scale_value
 *   from down's, an error at the moe when one is missing.
 * The token-embedding table: under the int4 presets (any method, any group
 *   size) a 2-D, unstacked weight that an embedding of the token ids
 *   gathers from (and that nothing else reads but matmuls of layout out_in
 *   as their weight: a tied lm_head) is stored int8, one f16 scale per row
 *   (symmetric, rounded to nearest, method rtn: group = D, the format of an
 *   int8 matmul weight per output channel), unless `keep` matches its name.
 *   That one format serves both uses of a tied table, so its lm_head is
 *   int8 weight-only (no act_quant under an int4 preset), not int4: half
 *   the bf16 bytes, and the per-channel int8 rounding error rather than
 *   int4's. Other gathered tables (GPT-2's positions) and every table under
 *   the other presets stay in the activation dtype.
 * Running it again recomputes every dtype and every rounding-to-nearest
 *   decision from scratch, so it is idempotent and a later preset replaces
 *   an earlier one; a weight imported pre-quantized (method "checkpoint")
 *   keeps its format under every preset.
 * FP8 W8A8 matmuls (act_quant "f8e4m3", a weight without column scales)
 *   read the codes and scales of a quantize op of their x, one per distinct
 *   x and scale rule (act_codes, ops.def): precision_act_codes.c, which
 *   clears an earlier run's first and inserts them once act_quant is set.
 *   int8 W8A8 (SmoothQuant column scales) keeps the matmul's own coding.
 * KV caches: their dtype, pass_options.kv_cache, is precision_kv_cache.c's.
 * Breaks: the lowering annotations of a module that has them, where the
 *   quantize ops change (precision_act_codes.c); otherwise nothing. Codegen
 *   refuses, at the op, a dtype it has no kernels for.
 */
#include "interface.h"
#include "pass.h"
#include "quant.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

typedef struct precision_preset {
    const char *name;
    smelt_dtype activations;
    quant_kind weights; /* QUANT_NONE: matmul weights in the activation dtype */
    quant_method method;
} precision_preset;

static const precision_preset presets[] = {
    {"f32", SMELT_DTYPE_F32, QUANT_NONE, QUANT_METHOD_RTN},
    {"bf16", SMELT_DTYPE_BF16, QUANT_NONE, QUANT_METHOD_RTN},
    {"int4-rtn", SMELT_DTYPE_BF16, QUANT_INT4, QUANT_METHOD_RTN},
    {"int8", SMELT_DTYPE_BF16, QUANT_INT8, QUANT_METHOD_RTN},
    {"fp8", SMELT_DTYPE_BF16, QUANT_FP8, QUANT_METHOD_RTN},
    {"int4-awq", SMELT_DTYPE_BF16, QUANT_INT4, QUANT_METHOD_AWQ},
    {"int4-gptq", SMELT_DTYPE_BF16, QUANT_INT4, QUANT_METHOD_GPTQ},
};
enum { PRESET_COUNT = sizeof presets / sizeof presets[0] };

/* Does the weight `name` match one of the comma-separated patterns of `keep`,
 * as itself or without its ".weight" suffix? */
static bool kept(const char *keep, const char *name) {
    if (!keep) return false;
    size_t length = strlen(name);
    char *stem = malloc(length + 1), *patterns = strdup(keep);
    bool found = false;
    if (stem && patterns) {
        memcpy(stem, name, length + 1);
        if (length > 7 && strcmp(name + length - 7, ".weight") == 0) stem[length - 7] = '\0';
        for (char *save = NULL, *p = strtok_r(patterns, ",", &save); p && !found;
             p = strtok_r(NULL, ",", &save))
            found = ir_tensor_pattern_matches(p, name) || ir_tensor_pattern_matches(p, stem);
    }
    free(stem);
    free(patterns);
    return found;
}

/* The format weight op `op` gets under the preset, or false when it stays
 * in the activation dtype. only_matmul[v]: every reader of v is a matmul
 * (out_in) reading it as its weight; only_experts[v]: every reader is a moe
 * reading it as its gate, up or down experts. */
static bool weight_format(const ir_module *m, uint32_t op, const precision_preset *preset, int64_t group_size,
                          const char *keep, bool act_order, const bool *only_matmul, const bool *only_experts,
                          quant_format *out) {
    const ir_value *value = &m->values[m->ops[op].results[0]];
    const ir_type *t = &value->type;
    ir_value_id v = m->ops[op].results[0];
    bool matrix = only_matmul[v] && t->rank == 2 && ir_op_string(m, op, "stack")[0] == '\0';
    bool experts = only_experts[v] && t->rank == 3 && !ir_dim_is_symbol(t->dims[0]) && t->dims[0].size > 0;
    if (preset->weights == QUANT_NONE || !(matrix || experts) || ir_dim_is_symbol(t->dims[t->rank - 2]) ||
        ir_dim_is_symbol(t->dims[t->rank - 1]) || !smelt_dtype_is_float(t->dtype) ||
        kept(keep, ir_op_string(m, op, "name")))
        return false;
    int64_t rows = t->dims[t->rank - 2].size, columns = t->dims[t->rank - 1].size;
    *out = (quant_format){.kind = preset->weights,
                          .method = preset->method,
                          .has_column_scale =
                              preset->method == QUANT_METHOD_AWQ || preset->method == QUANT_METHOD_SMOOTH,
                          .has_group_index = preset->method == QUANT_METHOD_GPTQ && act_order};
    if (preset->weights == QUANT_INT4) {
        int64_t group = columns < group_size ? columns : group_size;
        if (group <= 0 || columns % group != 0) return false;
        out->group = (uint32_t)group;
        out->has_zero = true;
    } else {
        out->group = (uint32_t)columns;
    }
    /* interleaved for the prefill dequantize-GEMM; experts stay row-major (the moe kernels) */
    out->interleaved = !experts && columns > 0 && quant_can_interleave(out, (uint64_t)columns);
    quant_layout l;
    uint64_t stride, total;
    return columns > 0 && rows > 0 &&
           quant_stack_layout_of(out, experts ? (uint64_t)t->dims[0].size : 1, (uint64_t)rows,
                                 (uint64_t)columns, &l, &stride, &total) == NULL;
}

/* The format of weight op `op` when it is the token-embedding table under
 * an int4 preset (above): int8, one scale per row; false otherwise.
 * gathered[v]: an embedding of the token ids reads v as its table;
 * only_gather_or_matmul[v]: every reader does, or is a matmul (out_in)
 * reading v as its weight. */
static bool embedding_format(const ir_module *m, uint32_t op, const precision_preset *preset,
                             const char *keep, const bool *gathered, const bool *only_gather_or_matmul,
                             quant_format *out) {
    ir_value_id v = m->ops[op].results[0];
    const ir_type *t = &m->values[v].type;
    if (preset->weights != QUANT_INT4 || !gathered[v] || !only_gather_or_matmul[v] || t->rank != 2 ||
        ir_op_string(m, op, "stack")[0] != '\0' || ir_dim_is_symbol(t->dims[0]) ||
        ir_dim_is_symbol(t->dims[1]) || t->dims[0].size <= 0 || t->dims[1].size <= 0 ||
        !smelt_dtype_is_float(t->dtype) || kept(keep, ir_op_string(m, op, "name")))
        return false;
    *out = (quant_format){.kind = QUANT_INT8, .method = QUANT_METHOD_RTN, .group = (uint32_t)t->dims[1].size};
    quant_layout l;
    return t->dims[1].size <= UINT32_MAX &&
           quant_layout_of(out, (uint64_t)t->dims[0].size, (uint64_t)t->dims[1].size, &l) == NULL;
}

static bool imported(const ir_module *m, uint32_t op) {
    quant_format f;
    return ir_weight_quant(m, op, &f) && f.method == QUANT_METHOD_CHECKPOINT;
}

/* The static activation scale given for the input of weight `name`, the
 * last one given (a checkpoint's input_scale, after calibration's); 0: none. */
static float static_scale_of(const pass_options *o, const char *name) {
    float scale = 0.0f;
    for (uint32_t i = 0; o && i < o->act_scale_count; i++)
        if (strcmp(o->act_scales[i].weight, name) == 0) scale = o->act_scales[i].scale;
    return scale;
}

/* Matmul op `op`'s activation quantization (W8A8, ops.def), of the dtype of
 * its weight's codes, when `wanted` and the weight is int8 or E4M3 with one
 * scale per output channel — a pre-quantized checkpoint's only when its
 * codes are the preset's `kind` — per token, or with `static_scales` (or
 * the checkpoint's input_scale) per tensor at the scale pass_options gives
 * for the weight; else none. False after reporting a static scale that is
 * missing or not a positive number. */
static bool set_act_quant(ir_module *m, uint32_t op, bool wanted, quant_kind kind_wanted, bool static_scales,
                          const pass_options *o, diag_engine *d) {
    const ir_op *matmul = &m->ops[op];
    quant_format f;
    const char *kind = "none";
    bool per_tensor = false;
    float scale = 0.0f;
    if (wanted && matmul->operand_count >= 2 && strcmp(ir_op_string(m, op, "layout"), "out_in") == 0 &&
        ir_weight_quant(m, m->values[matmul->operands[1]].def_op, &f) &&
        (f.kind == QUANT_INT8 || f.kind == QUANT_FP8) && !f.has_zero && !f.has_group_index &&
        f.group == (uint64_t)m->values[matmul->operands[1]].type.dims[1].size) {
        const char *name = ir_op_string(m, m->values[matmul->operands[1]].def_op, "name");
        scale = static_scale_of(o, name);
        bool checkpoint = f.method == QUANT_METHOD_CHECKPOINT;
        per_tensor = static_scales || (checkpoint && scale != 0.0f);
        if (!checkpoint || f.kind == kind_wanted)
            kind = f.kind == QUANT_INT8 ? "i8" : "f8e4m3";
        else
            per_tensor = false;
        if (per_tensor && !(scale > 0.0f && isfinite(scale))) {
            diag_error(d, matmul->loc,
                       "matmul: weight '%.*s%s' has no static activation scale (act_quant tensor needs "
                       "calibration: --calib IDS)",
                       DIAG_NAME(name));
            return false;
        }
    }
    bool none = strcmp(kind, "none") == 0;
    ir_op_set_string(m, op, "act_quant", kind);
    ir_op_set_string(m, op, "act_scale", none ? "none" : per_tensor ? "tensor" : "token");
    ir_op_set_float(m, op, "act_scale_value", !none && per_tensor ? scale : 0.0);
    return true;
}

/* Is operand `operand` of moe op `op` a stack of experts that W8A8 can
 * multiply codes with: int8 or E4M3 codes (a pre-quantized checkpoint's
 * only when they are `kind_wanted`), one scale per output channel? */
static bool w8a8_experts(const ir_module *m, uint32_t op, uint32_t operand, quant_kind kind_wanted,
                         quant_kind *kind) {
    ir_value_id w = m->ops[op].operands[operand];
    const ir_type *t = &m->values[w].type;
    quant_format f;
    if (!ir_weight_quant(m, m->values[w].def_op, &f) || (f.kind != QUANT_INT8 && f.kind != QUANT_FP8) ||
        f.has_zero || f.has_group_index || t->rank != 3 || ir_dim_is_symbol(t->dims[2]) ||
        f.group != (uint64_t)t->dims[2].size ||
        (f.method == QUANT_METHOD_CHECKPOINT && f.kind != kind_wanted))
        return false;
    *kind = f.kind;
    return true;
}

/* The static scale pass_options gives for the input of stack operand
 * `operand` of moe op `op`, by the stack's name (its experts' one scale,
 * calibration's: driver/calibrate.h); false after reporting that there is
 * none, or that it is not a positive number. */
static bool stack_static_scale(const ir_module *m, uint32_t op, uint32_t operand, const pass_options *o,
                               diag_engine *d, float *scale) {
    const char *name = ir_op_string(m, m->values[m->ops[op].operands[operand]].def_op, "name");
    *scale = static_scale_of(o, name);
    if (*scale > 0.0f && isfinite(*scale)) return true;
    diag_error(d, m->ops[op].loc,
               "moe: experts '%.*s%s' have no static activation scale (act_quant tensor needs calibration: "
               "--calib IDS)",
               DIAG_NAME(name));
    return false;
}

/* Moe op `op`'s activation quantization (W8A8, ops.def): when `wanted`, x
 * is quantized for gate and up when both stacks are W8A8 experts of one
 * kind, the hidden rows for down when it is; per row (act_scale token), or
 * with `static_scales` per tensor (act_scale tensor): x at the larger of
 * the gate and up stacks' scales (calibration gives both the same, their
 * experts' inputs being x), the hidden rows at down's. False after
 * reporting a static scale that is missing. */
static bool set_moe_act_quant(ir_module *m, uint32_t op, bool wanted, quant_kind kind_wanted,
                              bool static_scales, const pass_options *o, diag_engine *d) {
    quant_kind gate = QUANT_NONE, up = QUANT_NONE, down = QUANT_NONE;
    bool gate_up = wanted && m->ops[op].operand_count == 5 && w8a8_experts(m, op, 2, kind_wanted, &gate) &&
                   w8a8_experts(m, op, 3, kind_wanted, &up) && gate == up;
    bool down_quantized =
        wanted && m->ops[op].operand_count == 5 && w8a8_experts(m, op, 4, kind_wanted, &down);
    float gate_scale = 0.0f, up_scale = 0.0f, down_scale = 0.0f;
    bool per_tensor = static_scales && (gate_up || down_quantized), ok = true;
    if (per_tensor && gate_up)
        ok = stack_static_scale(m, op, 2, o, d, &gate_scale) && stack_static_scale(m, op, 3, o, d, &up_scale);
    if (per_tensor && down_quantized) ok = stack_static_scale(m, op, 4, o, d, &down_scale) && ok;
    ir_op_set_string(m, op, "gate_up_act_quant", !gate_up ? "none" : gate == QUANT_INT8 ? "i8" : "f8e4m3");
    ir_op_set_string(m, op, "down_act_quant",
                     !down_quantized      ? "none"
                     : down == QUANT_INT8 ? "i8"
                                          : "f8e4m3");
    ir_op_set_string(m, op, "act_scale",
                     !(gate_up || down_quantized) ? "none"
                     : per_tensor                 ? "tensor"
                                                  : "token");
    ir_op_set_float(m, op, "gate_up_act_scale_value",
                    ok ? (gate_scale > up_scale ? gate_scale : up_scale) : 0.0);
    ir_op_set_float(m, op, "down_act_scale_value", ok ? down_scale : 0.0);
    return ok;
}

/* What pass_precision decides for every value and weight, and the tables
 * it decides from (root views, readers), which the pass frees. */
typedef struct precision_run {
    const precision_preset *preset, *chosen;
    int64_t group_size;
    const pass_options *o;
    smelt_dtype activations;
    ir_value_id *root;
    bool *read_by_output, *only_matmul, *only_experts, *only_router, *gathered, *only_gather_or_matmul;
} precision_run;

static void free_tables(precision_run *a) {
    free(a->gathered);
    free(a->only_gather_or_matmul);
    free(a->only_router);
    free(a->root);
    free(a->read_by_output);
    free(a->only_matmul);
    free(a->only_experts);
}

/* Weight op `op`'s value, [K, N] read in_out by every reader (matmuls, as
 * their weight), becomes its transpose [N, K] read out_in (`transposed`,
 * ops.def: the checkpoint still holds [K, N]), or back again. */
static void flip_in_out(ir_module *m, uint32_t op, bool to_out_in) {
    ir_value_id v = m->ops[op].results[0];
    ir_dim rows = m->values[v].type.dims[0];
    m->values[v].type.dims[0] = m->values[v].type.dims[1];
    m->values[v].type.dims[1] = rows;
    ir_op_set_bool(m, op, "transposed", to_out_in);
    for (uint32_t i = 0; i < m->op_count; i++)
        if (!m->ops[i].dead && m->ops[i].kind == IR_OP_MATMUL && m->ops[i].operand_count >= 2 &&
            m->ops[i].operands[1] == v)
            ir_op_set_string(m, i, "layout", to_out_in ? "out_in" : "in_out");
}

/* Under a preset that quantizes matmul weights, every 2-D weight that only
 * in_out matmuls read as their weight (GPT-2's Conv1D projections) is
 * transposed to out_in where the preset then quantizes it: the formats and
 * kernels of quantized weights are out_in alone. only_matmul[v] becomes
 * true for those. So a transposed weight is always a quantized one; an
 * earlier run's transpositions are undone first (from scratch, as every
 * decision of the pass). */
static void transpose_in_out_weights(ir_module *m, precision_run *a) {
    for (uint32_t i = 0; i < m->op_count; i++) /* an earlier run's decisions, undone first */
        if (!m->ops[i].dead && m->ops[i].kind == IR_OP_WEIGHT && ir_op_bool(m, i, "transposed")) {
            flip_in_out(m, i, false);
            a->only_matmul[m->ops[i].results[0]] = false;
            m->values[m->ops[i].results[0]].type.dtype = SMELT_DTYPE_F32; /* floats again, as assign does */
            ir_weight_clear_quant(m, i);
        }
    if (a->chosen->weights == QUANT_NONE) return;
    bool *in_out = malloc((m->value_count ? m->value_count : 1) * sizeof *in_out);
    bool *read = calloc(m->value_count ? m->value_count : 1, sizeof *read);
    if (!in_out || !read) {
        free(in_out);
        free(read);
        arena_out_of_memory(); /* assign's recovery point frees the tables and fails the pass */
    }
    for (ir_value_id v = 0; v < m->value_count; v++)
        in_out[v] = true;
    for (uint32_t i = 0; i < m->op_count; i++) {
        const ir_op *op = &m->ops[i];
        if (op->dead) continue;
        for (uint32_t j = 0; j < op->operand_count; j++) {
            read[op->operands[j]] = true;
            in_out[op->operands[j]] &=
                op->kind == IR_OP_MATMUL && j == 1 && strcmp(ir_op_string(m, i, "layout"), "in_out") == 0;
        }
    }
    const char *keep = a->o ? a->o->keep : NULL;
    for (uint32_t i = 0; i < m->op_count; i++) {
        const ir_op *op = &m->ops[i];
        if (op->dead || op->kind != IR_OP_WEIGHT || imported(m, i)) continue;
        ir_value_id v = op->results[0];
        const ir_type *t = &m->values[v].type;
        if (!read[v] || !in_out[v] || t->rank != 2 || ir_op_string(m, i, "stack")[0] != '\0' ||
            !smelt_dtype_is_float(t->dtype))
            continue;
        flip_in_out(m, i, true);
        a->only_matmul[v] = true;
        quant_format f;
        if (weight_format(m, i, a->chosen, a->group_size, keep, a->o && a->o->act_order, a->only_matmul,
                          a->only_experts, &f))
            continue;
        flip_in_out(m, i, false); /* kept, or a shape the format cannot take: read in_out as before */
        a->only_matmul[v] = false;
    }
    free(in_out);
    free(read);
}

/* Every dtype and weight format; formats and attributes allocate from the
 * module's arena. */
static void assign(ir_module *m, precision_run *a) {
    ir_value_id ids = ir_role_value(m, IR_ROLE_IDS);
    for (ir_value_id v = 0; v < m->value_count; v++)
        a->only_matmul[v] = a->only_experts[v] = a->only_router[v] = a->only_gather_or_matmul[v] = true;
    for (uint32_t i = 0; i < m->op_count; i++) {
        const ir_op *op = &m->ops[i];
        if (op->dead) continue;
        if (op->kind == IR_OP_OUTPUT && op->operand_count == 1)
            a->read_by_output[a->root[op->operands[0]]] = true;
        bool gather = op->kind == IR_OP_EMBEDDING && op->operand_count == 2 && ids != IR_NO_VALUE &&
                      op->operands[1] == ids;
        if (gather) a->gathered[op->operands[0]] = true;
        for (uint32_t j = 0; j < op->operand_count; j++) {
            bool matmul_weight =
                op->kind == IR_OP_MATMUL && j == 1 && strcmp(ir_op_string(m, i, "layout"), "out_in") == 0;
            if (!matmul_weight) a->only_matmul[op->operands[j]] = false;
            if (!matmul_weight && !(gather && j == 0)) a->only_gather_or_matmul[op->operands[j]] = false;
            if (op->kind != IR_OP_MOE || j < 2) a->only_experts[op->operands[j]] = false;
            if (op->kind != IR_OP_MOE || j != 1) a->only_router[op->operands[j]] = false;
        }
    }
    transpose_in_out_weights(m, a);
    for (uint32_t i = 0; i < m->op_count; i++) {
        const ir_op *op = &m->ops[i];
        if (op->dead) continue;
        if (op->kind == IR_OP_WEIGHT && !imported(m, i)) {
            ir_type *t = &m->values[op->results[0]].type;
            quant_format f;
            if (ir_weight_quant(m, i, &f)) t->dtype = SMELT_DTYPE_F32; /* a former decision: floats again */
            ir_weight_clear_quant(m, i);
            const char *keep = a->o ? a->o->keep : NULL;
            if (weight_format(m, i, a->chosen, a->group_size, keep, a->o && a->o->act_order, a->only_matmul,
                              a->only_experts, &f) ||
                embedding_format(m, i, a->preset, keep, a->gathered, a->only_gather_or_matmul, &f)) {
                ir_weight_set_quant(m, i, &f);
                t->dtype = quant_code_dtype(f.kind);
                continue;
            }
        } else if (op->kind == IR_OP_WEIGHT) {
            /* imported codes keep their dtype and format; int4 ones are interleaved as ours are */
            quant_format f;
            const ir_type *t = &m->values[op->results[0]].type;
            if (ir_weight_quant(m, i, &f) && t->rank == 2 && !ir_dim_is_symbol(t->dims[1]) &&
                t->dims[1].size > 0 && quant_can_interleave(&f, (uint64_t)t->dims[1].size)) {
                f.interleaved = true;
                ir_weight_set_quant(m, i, &f);
            }
            continue;
        }
        if (op->kind == IR_OP_QUANTIZE) { /* codes and scales keep their dtypes under every preset */
            bool int8 = strcmp(ir_op_string(m, i, "dtype"), "i8") == 0;
            m->values[op->results[0]].type.dtype = int8 ? SMELT_DTYPE_I8 : SMELT_DTYPE_F8E4M3;
            m->values[op->results[1]].type.dtype = SMELT_DTYPE_F32;
            continue;
        }
        for (uint32_t r = 0; r < op->result_count; r++) {
            ir_value_id v = op->results[r];
            ir_type *t = &m->values[v].type;
            if (t->dtype == SMELT_DTYPE_UNKNOWN) continue; /* the verifier reports untyped values */
            if (!smelt_dtype_is_float(t->dtype))
                t->dtype = SMELT_DTYPE_I32;
            else
                t->dtype = a->read_by_output[a->root[v]] || op->kind == IR_OP_ROPE_TABLE ||
                                   (op->kind == IR_OP_WEIGHT && a->only_router[v])
                               ? SMELT_DTYPE_F32
                               : a->activations;
        }
    }
}

/* assign() under a recovery point of its own: an arena allocation that
 * fails frees the tables, then fails the pass (ir/arena.h). */
static void assign_recovering(ir_module *m, precision_run *a) {
    arena_recovery recovery;
    if (arena_recovery_enter(&recovery, setjmp(recovery.where))) {
        free_tables(a);
        arena_out_of_memory();
    }
    assign(m, a);
    arena_recovery_leave(&recovery);
}

bool pass_precision(ir_module *m, const pass_options *o, diag_engine *d) {
    const char *name = o && o->precision ? o->precision : "f32";
    const precision_preset *preset = NULL;
    for (unsigned i = 0; i < PRESET_COUNT && !preset; i++)
        if (strcmp(name, presets[i].name) == 0) preset = &presets[i];
    if (!preset) {
        diag_error(
            d, SMELT_NO_LOC,
            "unknown precision '%.*s%s'; known presets: f32, bf16, int4-rtn, int4-awq, int4-gptq, int8, fp8",
            DIAG_NAME(name));
        return false;
    }
    smelt_dtype activations = preset->activations;
    if (o && o->activations) {
        if (strcmp(o->activations, "f32") == 0)
            activations = SMELT_DTYPE_F32;
        else if (strcmp(o->activations, "bf16") == 0)
            activations = SMELT_DTYPE_BF16;
        else if (strcmp(o->activations, "f16") == 0)
            activations = SMELT_DTYPE_F16;
        else {
            diag_error(d, SMELT_NO_LOC, "unknown activation dtype '%.*s%s'; known: f32, bf16, f16",
                       DIAG_NAME(o->activations));
            return false;
        }
    }
    bool act_quant = preset->weights == QUANT_INT8 || preset->weights == QUANT_FP8;
    bool static_scales = o && o->act_quant && strcmp(o->act_quant, "tensor") == 0;
    if (o && o->act_quant && strcmp(o->act_quant, "none") == 0)
        act_quant = false;
    else if (o && o->act_quant && strcmp(o->act_quant, "token") != 0 && !static_scales) {
        diag_error(d, SMELT_NO_LOC, "unknown activation quantization '%.*s%s'; known: token, tensor, none",
                   DIAG_NAME(o->act_quant));
        return false;
    }
    if (static_scales && preset->weights == QUANT_INT8) {
        diag_error(d, SMELT_NO_LOC,
                   "static per-tensor activation scales (act_quant tensor) are fp8's; %.*s%s quantizes "
                   "activations per token",
                   DIAG_NAME(preset->name));
        return false;
    }
    precision_preset chosen = *preset; /* int8's migration is for W8A8 alone */
    if (chosen.weights == QUANT_INT8 && act_quant) chosen.method = QUANT_METHOD_SMOOTH;
    int64_t group_size = o && o->group_size ? o->group_size : 128;
    if (group_size != 32 && group_size != 64 && group_size != 128) {
        diag_error(d, SMELT_NO_LOC, "group size %lld: int4 groups are 32, 64 or 128 input columns",
                   (long long)group_size);
        return false;
    }
    precision_act_codes_clear(m); /* an earlier run's quantizes: removed before the tables are made */
    ir_value_id *root = ir_view_roots(m);
    bool *read_by_output = calloc(m->value_count ? m->value_count : 1, sizeof *read_by_output);
    bool *only_matmul = malloc((m->value_count ? m->value_count : 1) * sizeof *only_matmul);
    bool *only_experts = malloc((m->value_count ? m->value_count : 1) * sizeof *only_experts);
    bool *only_router = malloc((m->value_count ? m->value_count : 1) * sizeof *only_router);
    bool *gathered = calloc(m->value_count ? m->value_count : 1, sizeof *gathered);
    bool *only_gather_or_matmul =
        malloc((m->value_count ? m->value_count : 1) * sizeof *only_gather_or_matmul);
    if (!root || !read_by_output || !only_matmul || !only_experts || !only_router || !gathered ||
        !only_gather_or_matmul) {
        free(gathered);
        free(only_gather_or_matmul);
        free(only_router);
        free(root);
        free(read_by_output);
        free(only_matmul);
        free(only_experts);
        diag_error(d, SMELT_NO_LOC, "out of memory assigning dtypes to %u values", m->value_count);
        return false;
    }
    precision_run run = {.preset = preset,
                         .chosen = &chosen,
                         .group_size = group_size,
                         .o = o,
                         .activations = activations,
                         .root = root,
                         .read_by_output = read_by_output,
                         .only_matmul = only_matmul,
                         .only_experts = only_experts,
                         .only_router = only_router,
                         .gathered = gathered,
                         .only_gather_or_matmul = only_gather_or_matmul};
    assign_recovering(m, &run);
    free_tables(&run);
    bool scales_ok = true;
    for (uint32_t i = 0; i < m->op_count; i++) {
        if (!m->ops[i].dead && m->ops[i].kind == IR_OP_MATMUL)
            scales_ok &= set_act_quant(m, i, act_quant, preset->weights, static_scales, o, d);
        if (!m->ops[i].dead && m->ops[i].kind == IR_OP_MOE)
            scales_ok &= set_moe_act_quant(m, i, act_quant, preset->weights, static_scales, o, d);
    }
    if (!scales_ok) return false;
    precision_act_codes_insert(m);
    m->precision = preset->name;
    if ((preset->weights == QUANT_INT8 || preset->weights == QUANT_FP8) && !act_quant)
        m->precision = arena_printf(&m->arena, "%s, weight-only", m->precision);
    if (activations != preset->activations)
        m->precision =
            arena_printf(&m->arena, "%s, activations %s", m->precision, smelt_dtype_name(activations));
    return pass_precision_kv_cache(m, o ? o->kv_cache : NULL, smelt_dtype_name(activations), d);
}
