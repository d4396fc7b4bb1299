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
 *   through reshape views; norms, softmax, the router, RoPE angles and every
 *   accumulation compute in f32 whatever the storage):
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
 *   int8      bf16, and matmul weights W8A16: int8 codes, one f16 scale per
 *             output channel (symmetric), rounded to nearest;
 *   fp8       bf16, and matmul weights E4M3 codes, one f16 scale per output
 *             channel (weight-only: the activations stay bf16).
 *   `activations` overrides the float storage ("f32" keeps the weights'
 *   quantization and stores everything else in f32: what the tests compare
 *   with the reference interpreter's dequantized arithmetic).
 * Layout: an int4 weight without act-order whose columns are a multiple
 *   of 128 (an imported one too) has its codes interleaved for the
 *   tensor-core dequantize-GEMM of prefill steps, layout = "mma_k16"
 *   (quant/quant.h; the decode GEMV reads that order as well).
 * Which weights are quantized: 2-D, unstacked, read only by matmuls of
 *   layout out_in as their weight (so an embedding tied to the lm_head, the
 *   norms, biases, MoE experts and GPT-2's in_out projections stay in the
 *   activation dtype), whose input columns the group divides, and whose name
 *   (or the name without ".weight") matches none of the `keep` globs
 *   (fnmatch: "lm_head,*.down_proj").
 * Running it again recomputes every dtype and every rounding-to-nearest
 *   decision from scratch, so it is idempotent and a later preset replaces
 *   an earlier one; a weight imported pre-quantized (method "checkpoint")
 *   keeps its format under every preset.
 * KV caches: their dtype, pass_options.kv_cache, is precision_kv_cache.c's.
 * Breaks: nothing; codegen refuses, at the op, a dtype it has no kernels for.
 */
#include "pass.h"
#include "quant.h"

#include <fnmatch.h>
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

/* Does the weight `name` match one of the comma-separated globs of `keep`,
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
            found = fnmatch(p, name, 0) == 0 || fnmatch(p, stem, 0) == 0;
    }
    free(stem);
    free(patterns);
    return found;
}

/* The format weight op `op` gets under the preset, or false when it stays
 * in the activation dtype. only_matmul[v]: every reader of v is a matmul
 * (out_in) reading it as its weight. */
static bool weight_format(const ir_module *m, uint32_t op, const precision_preset *preset, int64_t group_size,
                          const char *keep, bool act_order, const bool *only_matmul, quant_format *out) {
    const ir_value *value = &m->values[m->ops[op].results[0]];
    const ir_type *t = &value->type;
    if (preset->weights == QUANT_NONE || !only_matmul[m->ops[op].results[0]] || t->rank != 2 ||
        ir_dim_is_symbol(t->dims[0]) || ir_dim_is_symbol(t->dims[1]) || !smelt_dtype_is_float(t->dtype) ||
        ir_op_string(m, op, "stack")[0] != '\0' || kept(keep, ir_op_string(m, op, "name")))
        return false;
    int64_t columns = t->dims[1].size;
    *out = (quant_format){.kind = preset->weights,
                          .method = preset->method,
                          .has_column_scale = preset->method == QUANT_METHOD_AWQ,
                          .has_group_index = preset->method == QUANT_METHOD_GPTQ && act_order};
    if (preset->weights == QUANT_INT4) {
        int64_t group = columns < group_size ? columns : group_size;
        if (group <= 0 || columns % group != 0) return false;
        out->group = (uint32_t)group;
        out->has_zero = true;
    } else {
        out->group = (uint32_t)columns;
    }
    out->interleaved = columns > 0 && quant_can_interleave(out, (uint64_t)columns);
    quant_layout l;
    return columns > 0 && t->dims[0].size > 0 &&
           quant_layout_of(out, (uint64_t)t->dims[0].size, (uint64_t)columns, &l) == NULL;
}

static bool imported(const ir_module *m, uint32_t op) {
    quant_format f;
    return ir_weight_quant(m, op, &f) && f.method == QUANT_METHOD_CHECKPOINT;
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
        else {
            diag_error(d, SMELT_NO_LOC, "unknown activation dtype '%.*s%s'; known: f32, bf16",
                       DIAG_NAME(o->activations));
            return false;
        }
    }
    int64_t group_size = o && o->group_size ? o->group_size : 128;
    if (group_size != 32 && group_size != 64 && group_size != 128) {
        diag_error(d, SMELT_NO_LOC, "group size %lld: int4 groups are 32, 64 or 128 input columns",
                   (long long)group_size);
        return false;
    }
    ir_value_id *root = ir_view_roots(m);
    bool *read_by_output = calloc(m->value_count ? m->value_count : 1, sizeof *read_by_output);
    bool *only_matmul = malloc((m->value_count ? m->value_count : 1) * sizeof *only_matmul);
    if (!root || !read_by_output || !only_matmul) {
        free(root);
        free(read_by_output);
        free(only_matmul);
        diag_error(d, SMELT_NO_LOC, "out of memory assigning dtypes to %u values", m->value_count);
        return false;
    }
    for (ir_value_id v = 0; v < m->value_count; v++)
        only_matmul[v] = true;
    for (uint32_t i = 0; i < m->op_count; i++) {
        const ir_op *op = &m->ops[i];
        if (op->dead) continue;
        if (op->kind == IR_OP_OUTPUT && op->operand_count == 1) read_by_output[root[op->operands[0]]] = true;
        for (uint32_t j = 0; j < op->operand_count; j++)
            if (op->kind != IR_OP_MATMUL || j != 1 || strcmp(ir_op_string(m, i, "layout"), "out_in") != 0)
                only_matmul[op->operands[j]] = false;
    }
    for (uint32_t i = 0; i < m->op_count; i++) {
        const ir_op *op = &m->ops[i];
        if (op->dead) continue;
        if (op->kind == IR_OP_WEIGHT && !imported(m, i)) {
            ir_type *t = &m->values[op->results[0]].type;
            quant_format f;
            if (ir_weight_quant(m, i, &f)) t->dtype = SMELT_DTYPE_F32; /* a former decision: floats again */
            ir_weight_clear_quant(m, i);
            if (weight_format(m, i, preset, group_size, o ? o->keep : NULL, o && o->act_order, only_matmul,
                              &f)) {
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
        for (uint32_t r = 0; r < op->result_count; r++) {
            ir_value_id v = op->results[r];
            ir_type *t = &m->values[v].type;
            if (t->dtype == SMELT_DTYPE_UNKNOWN) continue; /* the verifier reports untyped values */
            if (!smelt_dtype_is_float(t->dtype))
                t->dtype = SMELT_DTYPE_I32;
            else
                t->dtype = read_by_output[root[v]] ? SMELT_DTYPE_F32 : activations;
        }
    }
    free(root);
    free(read_by_output);
    free(only_matmul);
    m->precision = preset->name;
    if (activations != preset->activations)
        m->precision =
            arena_printf(&m->arena, "%s, activations %s", preset->name, smelt_dtype_name(activations));
    return pass_precision_kv_cache(m, o ? o->kv_cache : NULL, smelt_dtype_name(activations), d);
}
