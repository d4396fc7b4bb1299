/* emit_norm.c - kernels for the norm family: rms_norm and layer_norm over the
 * last dim.
 *
 * One block per row (every dim but the last), a multiple of 32 threads up to
 * 256; each thread strides over the row, block-wide sums go through warp
 * shuffles and 32 floats of shared memory. Formulas as the reference's
 * (reference/ref_ops.c): rms_norm scales x / sqrt(mean(x^2) + eps) by the
 * weight after normalising (Llama); layer_norm uses the biased variance of
 * the centred row (torch.nn.LayerNorm), computed in a second pass.
 */
#include "emit_internal.h"

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

/* The part every norm kernel shares: parameters, launch, constants and
 * signature. Returns the row width. */
static int64_t open_norm_kernel(cg_kernel_builder *b, cg_emit *e, const char *name, const char *summary,
                                uint32_t *params, bool with_bias) {
    cg_shape x = cg_shape_of(e, cg_operand(e, 0));
    int64_t width = x.dims[x.rank - 1];
    uint32_t threads = norm_threads(width);
    cg_kernel_begin(b, e, name, summary);
    params[0] = cg_param_value(b, "x", cg_operand(e, 0), true);
    params[1] = cg_param_value(b, "weight", cg_operand(e, 1), true);
    if (with_bias) params[2] = cg_param_value(b, "bias", cg_operand(e, 2), true);
    params[3] = cg_param_value(b, "out", cg_result(e, 0), false);
    cg_kernel_launch(b, cg_count_blocks(cg_shape_count(&x, 0, x.rank - 1u), 1), (prog_affine){0, 1, 1},
                     threads);
    cg_kernel_open(b);
    cg_line(&b->text, "enum { WIDTH = %lld, THREADS = %u };", (long long)width, threads);
    cg_line(&b->text, "#define EPS %s", cg_float_literal(e, cg_attr_float(e, "eps", 1e-5)));
    if (e->ir->kind == IR_OP_RMS_NORM && cg_attr_float(e, "offset", 0.0) != 0.0)
        cg_line(&b->text, "#define OFFSET %s /* added to the weight */",
                cg_float_literal(e, cg_attr_float(e, "offset", 0.0)));
    cg_blank(&b->text);
    cg_write_block_reductions(&b->text, false);
    cg_kernel_signature(b);
    cg_line(&b->text, "__shared__ float scratch[32];");
    cg_line(&b->text, "long long base = (long long)blockIdx.x * WIDTH; /* the row's first element */");
    return width;
}

bool cg_emit_rms_norm(cg_emit *e) {
    if (!require_float_values(e)) return false;
    ir_value_id stored[3] = {cg_operand(e, 0), cg_operand(e, 1), cg_result(e, 0)};
    cg_shape x = cg_shape_of(e, stored[0]);
    double eps = cg_attr_float(e, "eps", 1e-5), offset = cg_attr_float(e, "offset", 0.0);
    const char *name =
        arena_printf(&e->scratch, "rms_norm_%s_d%lld_eps%s%s%s%s", cg_dtype_tag(e, stored, 3),
                     (long long)x.dims[x.rank - 1], cg_float_name(e, eps), offset != 0.0 ? "_offset" : "",
                     offset != 0.0 ? cg_float_name(e, offset) : "", rows_tag(e, &x));
    cg_kernel_builder b;
    uint32_t p[4];
    open_norm_kernel(&b, e, name,
                     offset != 0.0
                         ? "One block per row: out = x / sqrt(mean(x^2) + eps) * (OFFSET + weight), "
                           "the weight applied after normalising (Gemma's RMSNorm, offset 1)."
                         : "One block per row: out = x / sqrt(mean(x^2) + eps) * weight, the weight "
                           "applied after normalising (Llama's RMSNorm).",
                     p, false);
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
    cg_line(t, "for (int i = threadIdx.x; i < WIDTH; i += THREADS) {");
    cg_line(t, "float normalised = %s * inverse_rms;", cg_load(&b, p[0], "base + i"));
    cg_line(t, "%s", cg_store(&b, p[3], "base + i", arena_printf(&e->scratch, "normalised * %s", weight)));
    cg_line(t, "}");
    cg_kernel_end(&b);
    e->out->kind = CG_LOWER_KERNELS;
    return true;
}

bool cg_emit_layer_norm(cg_emit *e) {
    if (!require_float_values(e)) return false;
    bool with_bias = e->ir->operand_count == 3;
    ir_value_id stored[4] = {cg_operand(e, 0), cg_operand(e, 1),
                             with_bias ? cg_operand(e, 2) : cg_result(e, 0), cg_result(e, 0)};
    cg_shape x = cg_shape_of(e, stored[0]);
    double eps = cg_attr_float(e, "eps", 1e-5);
    const char *name = arena_printf(&e->scratch, "layer_norm_%s_d%lld_eps%s%s%s",
                                    cg_dtype_tag(e, stored, with_bias ? 4 : 3), (long long)x.dims[x.rank - 1],
                                    cg_float_name(e, eps), with_bias ? "_bias" : "", rows_tag(e, &x));
    cg_kernel_builder b;
    uint32_t p[4];
    open_norm_kernel(&b, e, name,
                     "One block per row: out = (x - mean) / sqrt(var + eps) * weight (+ bias), the biased "
                     "variance of the centred row (torch.nn.LayerNorm).",
                     p, with_bias);
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
    cg_line(t, "for (int i = threadIdx.x; i < WIDTH; i += THREADS) {");
    cg_line(t, "float normalised = (%s - mean) * inverse_std;", cg_load(&b, p[0], "base + i"));
    const char *value = with_bias ? arena_printf(&e->scratch, "normalised * %s + %s", cg_load(&b, p[1], "i"),
                                                 cg_load(&b, p[2], "i"))
                                  : arena_printf(&e->scratch, "normalised * %s", cg_load(&b, p[1], "i"));
    cg_line(t, "%s", cg_store(&b, p[3], "base + i", value));
    cg_line(t, "}");
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
