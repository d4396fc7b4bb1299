/* quantize.c - a checkpoint's f32 weight into its quantized format: the one
 * place a quantizer is chosen (by the format's method), for plans compiled
 * with weights, for the reference backend, and for checkpoints bound to a
 * plan at run time. */
#include "accuracy_gate.h"

#include <stdlib.h>
#include <string.h>

bool drv_quantize_weight(const char *name, const float *w, uint64_t rows, uint64_t cols,
                         const quant_format *f, const drv_weight_stats *stats, quant_tensor *out,
                         diag_engine *d) {
    memset(out, 0, sizeof *out);
    out->format = *f;
    const char *why = quant_layout_of(f, rows, cols, &out->layout);
    if (!why && !(out->data = calloc(out->layout.total ? out->layout.total : 1, 1))) why = "out of memory";
    if (!why) {
        switch (f->method) {
        case QUANT_METHOD_RTN: why = quant_rtn(w, NULL, out); break;
        case QUANT_METHOD_AWQ:
        case QUANT_METHOD_GPTQ:
        case QUANT_METHOD_SMOOTH: why = drv_quantize_from_stats(stats, w, out); break;
        default: why = "a pre-quantized checkpoint's weight is copied, not quantized"; break;
        }
    }
    if (why) {
        diag_error(d, SMELT_NO_LOC, "cannot quantize weight '%.*s%s' (%s %llu x %llu, group %u, %s): %s",
                   DIAG_NAME(name), quant_kind_name(f->kind), (unsigned long long)rows,
                   (unsigned long long)cols, f->group, quant_method_name(f->method), why);
        free(out->data);
        out->data = NULL;
        return false;
    }
    return true;
}

/* Statistics standing in for an expert that no calibration token was routed
 * to: white inputs (mean |x| = max |x| = 1, XᵀX = I, one token), under
 * which AWQ searches no migration and GPTQ compensates nothing across
 * columns. False when memory runs out. */
static bool white_stats(uint64_t cols, quant_act_stats *out) {
    if (!quant_act_stats_init(out, cols, true)) return false;
    out->tokens = 1;
    for (uint64_t k = 0; k < cols; k++) {
        out->abs_sum[k] = 1.0;
        out->absmax[k] = 1.0f;
        out->xtx[k * cols + k] = 1.0;
    }
    return true;
}

bool drv_source_weights_read_packed(void *context, uint32_t op, uint8_t *dst, uint64_t bytes) {
    const drv_source_weights *w = context;
    const ir_module *m = w->module;
    quant_format f;
    if (!m || !ir_weight_quant(m, op, &f)) return false;
    if (f.method == QUANT_METHOD_CHECKPOINT) return drv_read_checkpoint_packed(w, op, &f, dst, bytes);
    const char *name = ir_op_string(m, op, "name");
    const quant_tensor *measured = drv_gate_quantized(w->gate, name, &f); /* quantized already */
    if (measured && measured->layout.total == bytes) {
        memcpy(dst, measured->data, bytes);
        return true;
    }
    const ir_type *t = &m->values[m->ops[op].results[0]].type;
    if (t->rank != 2 && t->rank != 3) return false;
    /* A stack of experts [E, N, K]: expert e quantized on its own into bytes [e * stride, +stride). */
    uint64_t matrices = t->rank == 3 ? (uint64_t)t->dims[0].size : 1;
    uint64_t rows = (uint64_t)t->dims[t->rank - 2].size, cols = (uint64_t)t->dims[t->rank - 1].size;
    quant_layout layout;
    uint64_t stride, total;
    if (quant_stack_layout_of(&f, matrices, rows, cols, &layout, &stride, &total) || total != bytes)
        return false;
    float *values = malloc(matrices * rows * cols * sizeof *values + 1);
    bool ok = values && fe_weight_read_f32(&w->binding, op, values, matrices * rows * cols);
    diag_engine why; /* to stderr; the caller then reports the weight it could not read */
    diag_init(&why, NULL);
    const drv_weight_stats *stats =
        w->calibration && matrices == 1 ? drv_calibration_stats(w->calibration, name) : NULL;
    /* An expert's statistics are its own, over the tokens routed to it. */
    bool per_expert = t->rank == 3 && w->calibration && f.method != QUANT_METHOD_RTN;
    arena names;
    arena_init(&names);
    memset(dst, 0, bytes); /* the padding between experts */
    for (uint64_t e = 0; ok && e < matrices; e++) {
        quant_tensor q = {0};
        quant_act_stats white = {0};
        const char *expert = per_expert ? drv_expert_name(m, op, e, &names) : name;
        if (per_expert) stats = drv_calibration_stats(w->calibration, expert);
        if (per_expert && stats && stats->tokens == 0) stats = white_stats(cols, &white) ? &white : NULL;
        ok = drv_quantize_weight(expert, values + e * rows * cols, rows, cols, &f, stats, &q, &why) &&
             q.layout.total <= stride;
        if (ok) memcpy(dst + e * stride, q.data, q.layout.total);
        free(q.data);
        quant_act_stats_free(&white);
    }
    arena_free(&names);
    diag_free(&why);
    free(values);
    return ok;
}
