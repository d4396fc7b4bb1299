/* smooth.c - SmoothQuant's migration of activation outliers into the
 * weight, for W8A8 (calibrated.h has the contract). */
#include "calibrated.h"

#include <math.h>
#include <stdlib.h>

void quant_smooth_scales(const float *w, uint64_t rows, uint64_t cols, const float *act_absmax, float alpha,
                         float *c) {
    for (uint64_t k = 0; k < cols; k++) {
        float wmax = 0;
        for (uint64_t n = 0; n < rows; n++)
            wmax = fabsf(w[n * cols + k]) > wmax ? fabsf(w[n * cols + k]) : wmax;
        float s = 1.0f;
        if (act_absmax[k] > 0 && wmax > 0 && isfinite(act_absmax[k]))
            s = powf(act_absmax[k], alpha) / powf(wmax, 1.0f - alpha);
        /* keep s (and 1/s) well inside f32 for any input */
        s = s < 1e-5f ? 1e-5f : s > 1e5f ? 1e5f : s;
        c[k] = 1.0f / s;
    }
}

const char *quant_smooth(const float *w, const float *act_absmax, float alpha, quant_tensor *t) {
    if (!t->format.has_column_scale) return "SmoothQuant stores column scales: the format must have them";
    float *c = malloc(t->layout.cols * sizeof *c);
    if (!c) return "out of memory";
    quant_smooth_scales(w, t->layout.rows, t->layout.cols, act_absmax, alpha, c);
    const char *problem = quant_rtn(w, c, t);
    free(c);
    return problem;
}
