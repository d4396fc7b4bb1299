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
    uint64_t rows = (uint64_t)t->dims[0].size, cols = (uint64_t)t->dims[1].size;
    float *values = malloc(rows * cols * sizeof *values + 1);
    bool ok = values && fe_weight_read_f32(&w->binding, op, values, rows * cols);
    quant_tensor q = {0};
    diag_engine why; /* to stderr; the caller then reports the weight it could not read */
    diag_init(&why, NULL);
    const drv_weight_stats *stats = w->calibration ? drv_calibration_stats(w->calibration, name) : NULL;
    ok = ok && drv_quantize_weight(name, values, rows, cols, &f, stats, &q, &why);
    ok = ok && q.layout.total == bytes;
    if (ok) memcpy(dst, q.data, bytes);
    diag_free(&why);
    free(q.data);
    free(values);
    return ok;
}
