/* quantize_calibrated.c - the quantizers that need calibration, behind one
 * call for the driver's weight quantization step (calibrate.h). The
 * precision pass decides each weight's format (its method among them); the
 * step that fills a quantized weight's bytes calls this for the methods
 * AWQ, GPTQ and SmoothQuant, and quant_rtn for round to nearest. */
#include "calibrate.h"

#include "calibrated.h"

#include <stdlib.h>

const char *drv_quantize_from_stats(const quant_act_stats *s, const float *w, quant_tensor *t) {
    const quant_format *f = &t->format;
    if (!s || s->tokens == 0) return "it needs calibration statistics of its input (--calib)";
    if (s->cols != t->layout.cols) return "its input's calibration statistics have another width";
    if ((f->method == QUANT_METHOD_AWQ || f->method == QUANT_METHOD_GPTQ) && !s->xtx)
        return "it needs XᵀX, which calibration did not gather";
    switch (f->method) {
    case QUANT_METHOD_AWQ: {
        float *mean = malloc(s->cols * sizeof *mean);
        if (!mean) return "out of memory";
        quant_act_stats_mean_abs(s, mean);
        const char *problem = quant_awq(w, mean, s->xtx, &(quant_awq_options){.clip = true}, t, NULL);
        free(mean);
        return problem;
    }
    case QUANT_METHOD_GPTQ:
        return quant_gptq(w, s->xtx, &(quant_gptq_options){.act_order = f->has_group_index}, t);
    case QUANT_METHOD_SMOOTH: return quant_smooth(w, s->absmax, 0.5f, t);
    default: return "the method learns nothing from calibration (round to nearest is quant_rtn)";
    }
}

bool drv_quantize_calibrated(const char *name, const float *w, const drv_calibration *cal, quant_tensor *t,
                             diag_engine *d) {
    const quant_act_stats *s = cal ? drv_calibration_stats(cal, name) : NULL;
    const char *problem =
        !cal ? "it needs calibration statistics of its input (--calib), and none were gathered"
        : !s ? "it needs calibration statistics of its input, and no calibrated matmul reads it"
             : drv_quantize_from_stats(s, w, t);
    if (problem)
        diag_error(d, SMELT_NO_LOC, "cannot quantize weight '%s' (%s): %s", name,
                   quant_method_name(t->format.method), problem);
    return problem == NULL;
}
