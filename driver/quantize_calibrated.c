/* quantize_calibrated.c - the quantizers that need calibration, behind one
 * call for the driver's weight quantization step (calibrate.h). The
 * precision pass decides each weight's format (its method among them); the
 * step that fills a quantized weight's bytes calls this for the methods
 * AWQ, GPTQ and SmoothQuant, and quant_rtn for round to nearest. */
#include "calibrate.h"

#include "calibrated.h"

#include <stdlib.h>

bool drv_quantize_calibrated(const char *name, const float *w, const drv_calibration *cal, quant_tensor *t,
                             diag_engine *d) {
    const quant_format *f = &t->format;
    const quant_act_stats *s = cal ? drv_calibration_stats(cal, name) : NULL;
    if (!s || s->cols != t->layout.cols || s->tokens == 0) {
        diag_error(d, SMELT_NO_LOC,
                   "weight '%s': %s quantization needs calibration statistics of its input (--calib), and "
                   "%s",
                   name, quant_method_name(f->method),
                   !cal ? "none were gathered"
                   : !s ? "no calibrated matmul reads it"
                        : "they do not fit it");
        return false;
    }
    if ((f->method == QUANT_METHOD_AWQ || f->method == QUANT_METHOD_GPTQ) && !s->xtx) {
        diag_error(d, SMELT_NO_LOC, "weight '%s': %s needs XᵀX, which calibration did not gather", name,
                   quant_method_name(f->method));
        return false;
    }
    const char *problem;
    switch (f->method) {
    case QUANT_METHOD_AWQ: {
        float *mean = malloc(s->cols * sizeof *mean);
        if (!mean) {
            problem = "out of memory";
            break;
        }
        quant_act_stats_mean_abs(s, mean);
        problem = quant_awq(w, mean, s->xtx, &(quant_awq_options){.clip = true}, t, NULL);
        free(mean);
        break;
    }
    case QUANT_METHOD_GPTQ:
        problem = quant_gptq(w, s->xtx, &(quant_gptq_options){.act_order = f->has_group_index}, t);
        break;
    case QUANT_METHOD_SMOOTH: problem = quant_smooth(w, s->absmax, 0.5f, t); break;
    default: problem = "the method learns nothing from calibration (round to nearest is quant_rtn)"; break;
    }
    if (problem)
        diag_error(d, SMELT_NO_LOC, "weight '%s': %s: %s", name, quant_method_name(f->method), problem);
    return problem == NULL;
}
