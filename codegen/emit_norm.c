/* emit_norm.c - kernels for the norm family: rms_norm and layer_norm over the
 * last dim.
 *
 * One block per row (every dim but the last), a multiple of 32 threads up to
 * 256; each thread strides over the row, block-wide sums go through warp
 * shuffles and 32 floats of shared memory. Formulas as the reference's
 * (reference/ref_ops.c): rms_norm scales x / sqrt(mean(x^2) + eps) by the
 * weight after normalising (Llama); layer_norm uses the biased variance of
 * the centred row (torch.nn.LayerNorm), computed in a second pass.
 *
 * A norm and the quantize of its output (an act_codes matmul's input at
 * prefill, codegen/lower.c) are one kernel, cg_emit_norm_quantize: after
 * writing the output it reads back the elements it wrote (so as stored, in
 * their storage dtype's rounding), takes their block-wide absmax for the
 * row's scale (or the static one) and writes their codes and the scale:
 * what the quantize kernel (emit_quantize.c) would write from that output,
 * bit for bit, without a launch or a second read of the output from DRAM.
 */
#include "emit_internal.h"

#include <string.h>

enum { NORM_MAX_THREADS = 256 };

/* Threads for a row of `width` elements: one per element up to 256, in whole
 * warps. */
static uint32_t norm_threads(int64_t width) {
    if (width >= NORM_MAX_THREADS) return NORM_MAX_THREADS;
    return (uint32_t)((width + 31) / 32 * 32);
}

static bool require_float_values(cg_emit *e) {
    for (uint32_t i = 0; i < e->ir->operand_count; i++) {
        smelt_dtype t = e->m->values[cg_operand(e, i)].type.dtype;
        if (!smelt_dtype_is_float(t)) {
            diag_error(e->d, e->ir->loc, "codegen supports '%s' on float values only; found %s as operand %u",
                       ir_op_info_of(e->ir->kind)->name, smelt_dtype_name(t), i);
            return false;
        }
    }
    const cg_shape x = cg_shape_of(e, cg_operand(e, 0)), result = cg_shape_of(e, cg_result(e, 0));
    if (!cg_expect(e, x.rank >= 1 && cg_same_shape(&x, &result),
                   "x with at least one dim and a result of its shape"))
        return false;
    for (uint32_t i = 1; i < e->ir->operand_count; i++) {
        cg_shape w = cg_shape_of(e, cg_operand(e, i));
        if (!cg_expect(e, w.rank == 1 && !w.token0 && w.dims[0] == x.dims[x.rank - 1],
                       "operand %u to be [%lld], the last dim of x", i, (long long)x.dims[x.rank - 1]))
            return false;
    }
    return true;
}

/* The rows a norm kernel runs over, as a name part: "" for the usual
 * [tokens, D] (one row per token), else "_rows" and the leading dims
 * ("_rowstx8" for Qwen3's q_norm over [tokens, 8, D], "_rows4" for [4, D]).
 * The kernel's source depends on them (its grid and its comment), so its
 * name must too: two norms of one width and eps over other rows are two
 * kernels. */
static const char *rows_tag(cg_emit *e, const cg_shape *x) {
    cg_shape rows = *x;
    rows.rank = (uint8_t)(x->rank - 1);
    if (rows.rank == 1 && rows.token0) return "";
    return arena_printf(&e->scratch, "_rows%s", rows.rank == 0 ? "1" : cg_shape_tag(e, &rows));
}

/* The quantize of a norm's output that the norm's kernel does as well
 * (cg_emit_norm_quantize): the kind of its codes and its static scale (0:
 * each row's own). */
typedef struct norm_quantize {
    uint32_t op; /* IR_NONE: a norm alone */
    bool int8;
    double static_scale;
} norm_quantize;

static const char *quantize_string(const ir_module *m, uint32_t op, const char *name, const char *fallback) {
    const ir_attr *a = ir_op_attr(m, op, name);
    return a && a->kind == IR_ATTR_STRING && a->as.s ? a->as.s : fallback;
}

/* The kernel's name for the quantize too: "_f8e4m3_token", "_i8_tensor0p02". */
static const char *quantize_tag(cg_emit *e, const norm_quantize *q) {
    if (q->op == IR_NONE) return "";
    const char *codes = q->int8 ? "i8" : "f8e4m3";
    if (q->static_scale > 0.0)
        return arena_printf(&e->scratch, "_%s_tensor%s", codes, cg_float_name(e, q->static_scale));
    return arena_printf(&e->scratch, "_%s_token", codes);
}

/* The part every norm kernel shares: parameters, launch, constants and
 * signature. Returns the row width. With a quantize, params 4 and 5 are
 * its codes and scales. */
static int64_t open_norm_kernel(cg_kernel_builder *b, cg_emit *e, const char *name, const char *summary,
                                uint32_t *params, bool with_bias, const norm_quantize *q) {
    cg_shape x = cg_shape_of(e, cg_operand(e, 0));
    int64_t width = x.dims[x.rank - 1];
    uint32_t threads = norm_threads(width);
    cg_kernel_begin(b, e, name, summary);
    params[0] = cg_param_value(b, "x", cg_operand(e, 0), true);
    params[1] = cg_param_value(b, "weight", cg_operand(e, 1), true);
    if (with_bias) params[2] = cg_param_value(b, "bias", cg_operand(e, 2), true);
    params[3] = cg_param_value(b, "out", cg_result(e, 0), false);
    if (q->op != IR_NONE) {
        params[4] = cg_param_value(b, "codes", e->m->ops[q->op].results[0], false);
        params[5] = cg_param_value(b, "scales", e->m->ops[q->op].results[1], false);
    }
    cg_kernel_launch(b, cg_count_blocks(cg_shape_count(&x, 0, x.rank - 1u), 1), (prog_affine){0, 1, 1},
                     threads);
    cg_kernel_open(b);
    cg_line(&b->text, "enum { WIDTH = %lld, THREADS = %u };", (long long)width, threads);
    cg_line(&b->text, "#define EPS %s", cg_float_literal(e, cg_attr_float(e, "eps", 1e-5)));
    if (e->ir->kind == IR_OP_RMS_NORM && cg_attr_float(e, "offset", 0.0) != 0.0)
        cg_line(&b->text, "#define OFFSET %s /* added to the weight */",
                cg_float_literal(e, cg_attr_float(e, "offset", 0.0)));
    if (q->op != IR_NONE && q->static_scale > 0.0)
        cg_line(&b->text, "#define ACTIVATION_SCALE %s /* the quantize's act_scale tensor: every row's */",
                cg_float_literal(e, (float)q->static_scale));
    else if (q->op != IR_NONE)
        cg_line(&b->text, "#define CODE_MAX %s /* a row's scale: the absmax of its output over CODE_MAX */",
                q->int8 ? "127.0f" : "448.0f");
    cg_blank(&b->text);
    cg_write_block_reductions(&b->text, q->op != IR_NONE && q->static_scale <= 0.0);
    if (q->op != IR_NONE) {
        cg_write_activation_code(&b->text, q->int8);
        cg_blank(&b->text);
    }
    cg_kernel_signature(b);
    cg_line(&b->text, "__shared__ float scratch[32];");
    cg_line(&b->text, "long long base = (long long)blockIdx.x * WIDTH; /* the row's first element */");
    return width;
}

/* The last loop of a norm kernel: out = `value` for each element of the
 * row; with a quantize, then the codes of out as stored (read back by the
 * thread that wrote it: its storage dtype's rounding, what a quantize
 * kernel reading out would see) over the row's scale, and the scale. */
static void write_norm_output(cg_kernel_builder *b, const uint32_t *p, const char *normalised,
                              const char *value, const norm_quantize *q) {
    cg_emit *e = b->e;
    cg_text *t = &b->text;
    const char *stored = cg_load(b, p[3], "base + i");
    bool token = q->op != IR_NONE && q->static_scale <= 0.0;
    if (token) cg_line(t, "float absmax = 0.0f; /* of the row's output as stored */");
    cg_line(t, "for (int i = threadIdx.x; i < WIDTH; i += THREADS) {");
    cg_line(t, "float normalised = %s;", normalised);
    cg_line(t, "%s", cg_store(b, p[3], "base + i", value));
    if (token)
        cg_line(t, "absmax = fmaxf(absmax, fabsf(%s));", stored);
    else if (q->op != IR_NONE)
        cg_line(t, "codes[base + i] = activation_byte(%s / ACTIVATION_SCALE);", stored);
    cg_line(t, "}");
    if (q->op == IR_NONE) return;
    if (token) {
        cg_line(t, "absmax = block_max(absmax, scratch);");
        cg_line(t, "float s = absmax > 0.0f ? absmax / CODE_MAX : 1.0f; /* 1 for a row of zeros */");
        cg_line(t, "for (int i = threadIdx.x; i < WIDTH; i += THREADS)");
        cg_line(t, "    codes[base + i] = activation_byte(%s / s);", stored);
    }
    cg_line(t, "if (threadIdx.x == 0)");
    cg_line(t, "    scales[blockIdx.x] = %s;", token ? "s" : "ACTIVATION_SCALE");
    (void)e;
}

static bool emit_rms_norm(cg_emit *e, const norm_quantize *q);
static bool emit_layer_norm(cg_emit *e, const norm_quantize *q);

static const norm_quantize no_quantize = {IR_NONE, false, 0.0};

bool cg_emit_rms_norm(cg_emit *e) { return emit_rms_norm(e, &no_quantize); }
bool cg_emit_layer_norm(cg_emit *e) { return emit_layer_norm(e, &no_quantize); }

/* A norm and the quantize of its output (emit.c's group_is_norm_quantize):
 * the norm's kernel writes its output, then the codes of the output as
 * stored over each row's scale, and the scales, so that they are the
 * codes and scales a quantize kernel (emit_quantize.c) reading that output
 * would write. One launch and no second read of the output from DRAM. */
bool cg_emit_norm_quantize(cg_emit *e, const cg_group *g) {
    const ir_module *m = e->m;
    uint32_t quantize = g->ops[1];
    const ir_op *qo = &m->ops[quantize];
    smelt_dtype codes = cg_storage_dtype(m, qo->results[0]);
    norm_quantize q = {quantize, codes == SMELT_DTYPE_I8, 0.0};
    if (strcmp(quantize_string(m, quantize, "act_scale", "token"), "tensor") == 0) {
        const ir_attr *value = ir_op_attr(m, quantize, "act_scale_value");
        q.static_scale = value && value->kind == IR_ATTR_FLOAT ? value->as.f : 0.0;
        if (!((float)q.static_scale > 0.0f)) {
            diag_error(e->d, qo->loc, "quantize: expected act_scale_value > 0 for act_scale tensor");
            return false;
        }
    }
    cg_shape x = cg_shape_of(e, cg_result(e, 0)), cs = cg_shape_of(e, qo->results[0]),
             ss = cg_shape_of(e, qo->results[1]);
    if ((codes != SMELT_DTYPE_I8 && codes != SMELT_DTYPE_F8E4M3) || !cg_same_shape(&x, &cs) ||
        ss.rank + 1 != x.rank || cg_storage_dtype(m, qo->results[1]) != SMELT_DTYPE_F32) {
        diag_error(e->d, qo->loc,
                   "quantize: expected codes (f8e4m3 or i8) of the norm's output's shape and one f32 scale "
                   "per row");
        return false;
    }
    return e->ir->kind == IR_OP_RMS_NORM ? emit_rms_norm(e, &q) : emit_layer_norm(e, &q);
}

/* A norm kernel's summary, and its quantize's when it has one. */
static const char *with_quantize_summary(cg_emit *e, const char *summary, const norm_quantize *q) {
    if (q->op == IR_NONE) return summary;
    return arena_printf(
        &e->scratch, "%s Then the quantize of out as stored: codes = code(out / s), s = %s; scales[row] = s.",
        summary, q->static_scale > 0.0 ? "ACTIVATION_SCALE" : "max |out| / CODE_MAX (1 for a row of zeros)");
}

static bool emit_rms_norm(cg_emit *e, const norm_quantize *q) {
    if (!require_float_values(e)) return false;
    ir_value_id stored[3] = {cg_operand(e, 0), cg_operand(e, 1), cg_result(e, 0)};
    cg_shape x = cg_shape_of(e, stored[0]);
    double eps = cg_attr_float(e, "eps", 1e-5), offset = cg_attr_float(e, "offset", 0.0);
    const char *name =
        arena_printf(&e->scratch, "rms_norm_%s_d%lld_eps%s%s%s%s%s", cg_dtype_tag(e, stored, 3),
                     (long long)x.dims[x.rank - 1], cg_float_name(e, eps), offset != 0.0 ? "_offset" : "",
                     offset != 0.0 ? cg_float_name(e, offset) : "", quantize_tag(e, q), rows_tag(e, &x));
    const char *summary = offset != 0.0
                              ? "One block per row: out = x / sqrt(mean(x^2) + eps) * (OFFSET + weight), "
                                "the weight applied after normalising (Gemma's RMSNorm, offset 1)."
                              : "One block per row: out = x / sqrt(mean(x^2) + eps) * weight, the weight "
                                "applied after normalising (Llama's RMSNorm).";
    summary = with_quantize_summary(e, summary, q);
    cg_kernel_builder b;
    uint32_t p[6];
    open_norm_kernel(&b, e, name, summary, p, false, q);
    cg_text *t = &b.text;
    const char *weight = cg_load(&b, p[1], "i");
    if (offset != 0.0) weight = arena_printf(&e->scratch, "(OFFSET + %s)", weight);
    cg_line(t, "float squares = 0.0f;");
    cg_line(t, "for (int i = threadIdx.x; i < WIDTH; i += THREADS) {");
    cg_line(t, "float v = %s;", cg_load(&b, p[0], "base + i"));
    cg_line(t, "squares += v * v;");
    cg_line(t, "}");
    cg_line(t, "squares = block_sum(squares, scratch);");
    cg_line(t, "float inverse_rms = 1.0f / sqrtf(squares / (float)WIDTH + EPS);");
    write_norm_output(&b, p, arena_printf(&e->scratch, "%s * inverse_rms", cg_load(&b, p[0], "base + i")),
                      arena_printf(&e->scratch, "normalised * %s", weight), q);
    cg_kernel_end(&b);
    e->out->kind = CG_LOWER_KERNELS;
    return true;
}

static bool emit_layer_norm(cg_emit *e, const norm_quantize *q) {
    if (!require_float_values(e)) return false;
    bool with_bias = e->ir->operand_count == 3;
    ir_value_id stored[4] = {cg_operand(e, 0), cg_operand(e, 1),
                             with_bias ? cg_operand(e, 2) : cg_result(e, 0), cg_result(e, 0)};
    cg_shape x = cg_shape_of(e, stored[0]);
    double eps = cg_attr_float(e, "eps", 1e-5);
    const char *name =
        arena_printf(&e->scratch, "layer_norm_%s_d%lld_eps%s%s%s%s",
                     cg_dtype_tag(e, stored, with_bias ? 4 : 3), (long long)x.dims[x.rank - 1],
                     cg_float_name(e, eps), with_bias ? "_bias" : "", quantize_tag(e, q), rows_tag(e, &x));
    const char *summary =
        "One block per row: out = (x - mean) / sqrt(var + eps) * weight (+ bias), the biased "
        "variance of the centred row (torch.nn.LayerNorm).";
    summary = with_quantize_summary(e, summary, q);
    cg_kernel_builder b;
    uint32_t p[6];
    open_norm_kernel(&b, e, name, summary, p, with_bias, q);
    cg_text *t = &b.text;
    cg_line(t, "float sum = 0.0f;");
    cg_line(t, "for (int i = threadIdx.x; i < WIDTH; i += THREADS)");
    cg_line(t, "    sum += %s;", cg_load(&b, p[0], "base + i"));
    cg_line(t, "float mean = block_sum(sum, scratch) / (float)WIDTH;");
    cg_line(t, "float squares = 0.0f;");
    cg_line(t, "for (int i = threadIdx.x; i < WIDTH; i += THREADS) {");
    cg_line(t, "float centred = %s - mean;", cg_load(&b, p[0], "base + i"));
    cg_line(t, "squares += centred * centred;");
    cg_line(t, "}");
    cg_line(t, "float inverse_std = 1.0f / sqrtf(block_sum(squares, scratch) / (float)WIDTH + EPS);");
    const char *value = with_bias ? arena_printf(&e->scratch, "normalised * %s + %s", cg_load(&b, p[1], "i"),
                                                 cg_load(&b, p[2], "i"))
                                  : arena_printf(&e->scratch, "normalised * %s", cg_load(&b, p[1], "i"));
    write_norm_output(&b, p,
                      arena_printf(&e->scratch, "(%s - mean) * inverse_std", cg_load(&b, p[0], "base + i")),
                      value, q);
    cg_kernel_end(&b);
    e->out->kind = CG_LOWER_KERNELS;
    return true;
}

/* A fused group {add, norm} (passes/fuse.c, fuse_residual_norm): x = a + b
 * (the new residual, written out in its storage dtype, as the add alone
 * would), then the norm of x — one read of a and b, no launch between. The
 * norm reads x back from where it was just written by the same thread (so
 * it sees exactly the rounded residual the unfused ops would). */
bool cg_emit_add_norm(cg_emit *e, const cg_group *g) {
    const ir_module *m = e->m;
    if (g->op_count != 2 || m->ops[g->ops[0]].kind != IR_OP_ADD) {
        diag_error(e->d, e->ir->loc, "codegen cannot emit this group: expected an add and then a norm");
        return false;
    }
    uint32_t add = g->ops[0], norm = g->ops[1];
    const ir_op *ao = &m->ops[add], *no = &m->ops[norm];
    bool layer = no->kind == IR_OP_LAYER_NORM, with_bias = layer && no->operand_count == 3;
    ir_value_id a = ao->operands[0], b = ao->operands[1], x = ao->results[0], out = no->results[0];
    cg_shape xs = cg_shape_of(e, x), as = cg_shape_of(e, a), bs = cg_shape_of(e, b), os = cg_shape_of(e, out);
    if ((no->kind != IR_OP_RMS_NORM && !layer) || no->operands[0] != x || !cg_same_shape(&xs, &as) ||
        !cg_same_shape(&xs, &bs) || !cg_same_shape(&xs, &os) || xs.rank < 1) {
        diag_error(
            e->d, e->ir->loc,
            "codegen cannot emit this group: expected norm(add(a, b)) with a, b and both results of one "
            "shape");
        return false;
    }
    int64_t width = xs.dims[xs.rank - 1];
    for (uint32_t i = 1; i < no->operand_count; i++) {
        cg_shape w = cg_shape_of(e, no->operands[i]);
        if (w.rank != 1 || w.token0 || w.dims[0] != width) {
            diag_error(e->d, no->loc, "codegen cannot emit this group: the norm's operand %u is not [%lld]",
                       i, (long long)width);
            return false;
        }
    }
    double eps = ir_op_float(m, norm, "eps");
    ir_value_id stored[6] = {a, b, no->operands[1], with_bias ? no->operands[2] : x, x, out};
    const char *name =
        arena_printf(&e->scratch, "add_%s_%s_d%lld_eps%s%s%s", layer ? "layer_norm" : "rms_norm",
                     cg_dtype_tag(e, stored, 6), (long long)width, cg_float_name(e, eps),
                     with_bias ? "_bias" : "", rows_tag(e, &xs));
    uint32_t threads = norm_threads(width);
    cg_kernel_builder kb;
    cg_kernel_begin(&kb, e, name,
                    layer ? "One block per row: residual = a + b (written), then out = (residual - mean) / "
                            "sqrt(var + eps) * weight (+ bias), the biased variance (torch.nn.LayerNorm)."
                          : "One block per row: residual = a + b (written), then out = residual / "
                            "sqrt(mean(residual^2) + eps) * weight (Llama's RMSNorm).");
    uint32_t pa = cg_param_value(&kb, "a", a, true), pb = cg_param_value(&kb, "b", b, true);
    uint32_t pw = cg_param_value(&kb, "weight", no->operands[1], true);
    uint32_t pbias = with_bias ? cg_param_value(&kb, "bias", no->operands[2], true) : 0;
    uint32_t pr = cg_param_value(&kb, "residual", x, false), po = cg_param_value(&kb, "out", out, false);
    cg_kernel_launch(&kb, cg_count_blocks(cg_shape_count(&xs, 0, xs.rank - 1u), 1), (prog_affine){0, 1, 1},
                     threads);
    cg_kernel_open(&kb);
    cg_text *t = &kb.text;
    cg_line(t, "enum { WIDTH = %lld, THREADS = %u };", (long long)width, threads);
    cg_line(t, "#define EPS %s", cg_float_literal(e, eps));
    cg_blank(t);
    cg_write_block_reductions(t, false);
    cg_kernel_signature(&kb);
    cg_line(t, "__shared__ float scratch[32];");
    cg_line(t, "long long base = (long long)blockIdx.x * WIDTH; /* the row's first element */");
    cg_line(t, "/* each thread reads back only the elements it wrote: no barrier needed */");
    cg_line(t, "float %s = 0.0f;", layer ? "sum" : "squares");
    cg_line(t, "for (int i = threadIdx.x; i < WIDTH; i += THREADS) {");
    cg_line(t, "%s",
            cg_store(&kb, pr, "base + i",
                     arena_printf(&e->scratch, "%s + %s", cg_load(&kb, pa, "base + i"),
                                  cg_load(&kb, pb, "base + i"))));
    cg_line(t, "float v = %s;", cg_load(&kb, pr, "base + i"));
    cg_line(t, "%s", layer ? "sum += v;" : "squares += v * v;");
    cg_line(t, "}");
    if (layer) {
        cg_line(t, "float mean = block_sum(sum, scratch) / (float)WIDTH;");
        cg_line(t, "float squares = 0.0f;");
        cg_line(t, "for (int i = threadIdx.x; i < WIDTH; i += THREADS) {");
        cg_line(t, "float centred = %s - mean;", cg_load(&kb, pr, "base + i"));
        cg_line(t, "squares += centred * centred;");
        cg_line(t, "}");
        cg_line(t, "float inverse_std = 1.0f / sqrtf(block_sum(squares, scratch) / (float)WIDTH + EPS);");
        cg_line(t, "for (int i = threadIdx.x; i < WIDTH; i += THREADS) {");
        cg_line(t, "float normalised = (%s - mean) * inverse_std;", cg_load(&kb, pr, "base + i"));
        const char *value = with_bias ? arena_printf(&e->scratch, "normalised * %s + %s",
                                                     cg_load(&kb, pw, "i"), cg_load(&kb, pbias, "i"))
                                      : arena_printf(&e->scratch, "normalised * %s", cg_load(&kb, pw, "i"));
        cg_line(t, "%s", cg_store(&kb, po, "base + i", value));
        cg_line(t, "}");
    } else {
        cg_line(t, "squares = block_sum(squares, scratch);");
        cg_line(t, "float inverse_rms = 1.0f / sqrtf(squares / (float)WIDTH + EPS);");
        cg_line(t, "for (int i = threadIdx.x; i < WIDTH; i += THREADS) {");
        cg_line(t, "float normalised = %s * inverse_rms;", cg_load(&kb, pr, "base + i"));
        cg_line(t, "%s",
                cg_store(&kb, po, "base + i",
                         arena_printf(&e->scratch, "normalised * %s", cg_load(&kb, pw, "i"))));
        cg_line(t, "}");
    }
    cg_kernel_end(&kb);
    e->out->kind = CG_LOWER_KERNELS;
    return true;
}
