/* awq.c - AWQ: activation-aware column scaling searched on calibration
 * data, then rounding (calibrated.h has the contract).
 *
 * Learned from the AWQ paper and llm-awq's auto_scale/auto_clip; written
 * for the packed layout here, with the output error measured through XᵀX
 * (calib.h) rather than by rerunning the block on stored activations.
 */
#include "calib.h"
#include "calibrated.h"
#include "quant_group.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* Row n of w under column scales c[cols], each group's range shrunk by
 * shrink[g] (NULL: 1): out[cols] gets the values quant_value would decode;
 * with t, the codes and parameters are stored too. */
static void quantize_row(const quant_format *f, const float *w, const float *c, uint64_t cols,
                         const float *shrink, float *out, quant_tensor *t, uint64_t n) {
    for (uint64_t k0 = 0, g = 0; k0 < cols; k0 += f->group, g++) {
        float lo = 0, hi = 0, r = shrink ? shrink[g] : 1.0f;
        for (uint64_t k = k0; k < k0 + f->group; k++) {
            float v = w[k] / c[k];
            lo = v < lo ? v : lo, hi = v > hi ? v : hi;
        }
        quant_group_params p = quant_group_params_from_range(f, lo * r, hi * r);
        if (t) quant_store_params(t, n, g, p);
        for (uint64_t k = k0; k < k0 + f->group; k++) {
            unsigned q = quant_group_encode(f, p, w[k] / c[k]);
            if (t) quant_store_code(t, n, k, q);
            out[k] = quant_group_decode(f, p, q) * c[k];
        }
    }
}

/* The output error of the whole weight under column scales c. */
static double error_with(const quant_format *f, const float *w, uint64_t rows, uint64_t cols, const float *c,
                         const double *xtx, float *row_out, double *e) {
    double total = 0;
    for (uint64_t n = 0; n < rows; n++) {
        const float *row = w + n * cols;
        quantize_row(f, row, c, cols, NULL, row_out, NULL, 0);
        for (uint64_t k = 0; k < cols; k++)
            e[k] = (double)row[k] - (double)row_out[k];
        total += quant_quadratic_form(e, xtx, cols, cols);
    }
    return total;
}

/* c = 1/s for s = mean_abs^alpha (at least 1e-4), normalised by
 * sqrt(max(s) * min(s)) as llm-awq does. */
static void column_scales_for(const float *mean_abs, uint64_t cols, float alpha, float *c) {
    float lo = INFINITY, hi = 0;
    for (uint64_t k = 0; k < cols; k++) {
        float s = alpha == 0 ? 1.0f : powf(mean_abs[k], alpha);
        c[k] = s > 1e-4f ? s : 1e-4f;
        lo = c[k] < lo ? c[k] : lo, hi = c[k] > hi ? c[k] : hi;
    }
    float norm = sqrtf(lo * hi);
    for (uint64_t k = 0; k < cols; k++)
        c[k] = norm / c[k];
}

/* The clip search of row `row` (AWQ's auto_clip, on the exact loss): from
 * every group at its full range, each group in turn takes the shrink factor
 * in 1, 1 - 1/grid, ..., 0.5 that lowers the row's whole output error
 * e^T XᵀX e the most (cross terms with the other groups included, through
 * h_e = XᵀX e kept up to date), and keeps its range when none lowers it. So
 * the row's error never exceeds its unclipped error. row_out and e: cols
 * scratch values each. False when memory runs out (shrink is then all 1). */
static bool search_clip(const quant_format *f, const float *row, const float *c, uint64_t cols,
                        const double *xtx, unsigned grid, float *shrink, float *row_out, double *e) {
    uint64_t groups = cols / f->group, size = f->group;
    for (uint64_t g = 0; g < groups; g++)
        shrink[g] = 1.0f;
    double *h_e = malloc(cols * sizeof *h_e), *delta = malloc(size * sizeof *delta);
    float *trial = malloc(groups * sizeof *trial);
    if (!h_e || !delta || !trial) {
        free(h_e), free(delta), free(trial);
        return false;
    }
    quantize_row(f, row, c, cols, NULL, row_out, NULL, 0);
    for (uint64_t k = 0; k < cols; k++)
        e[k] = (double)row[k] - (double)row_out[k];
    for (uint64_t j = 0; j < cols; j++) {
        double dot = 0;
        for (uint64_t k = 0; k < cols; k++)
            dot += xtx[j * cols + k] * e[k];
        h_e[j] = dot;
    }
    for (uint64_t g = 0, k0 = 0; g < groups; g++, k0 += size) {
        double best = 0; /* the change of the error; keeping the range changes nothing */
        float best_r = 1.0f;
        for (unsigned j = 1; j <= grid / 2; j++) {
            float r = 1.0f - (float)j / (float)grid;
            for (uint64_t i = 0; i < groups; i++)
                trial[i] = r;
            quantize_row(f, row, c, cols, trial, row_out, NULL, 0); /* only group g's values are used */
            /* e_g' - e_g = old decoded - new decoded */
            double change = 0;
            for (uint64_t a = 0; a < size; a++)
                delta[a] = ((double)row[k0 + a] - (double)row_out[k0 + a]) - e[k0 + a];
            for (uint64_t a = 0; a < size; a++)
                change += 2 * delta[a] * h_e[k0 + a];
            change += quant_quadratic_form(delta, xtx + k0 * cols + k0, size, cols);
            if (change < best) best = change, best_r = r;
        }
        if (best_r == 1.0f) continue;
        shrink[g] = best_r;
        for (uint64_t i = 0; i < groups; i++)
            trial[i] = best_r;
        quantize_row(f, row, c, cols, trial, row_out, NULL, 0);
        for (uint64_t a = 0; a < size; a++) {
            double next = (double)row[k0 + a] - (double)row_out[k0 + a];
            delta[a] = next - e[k0 + a];
            e[k0 + a] = next;
        }
        for (uint64_t j = 0; j < cols; j++) {
            double dot = 0;
            for (uint64_t a = 0; a < size; a++)
                dot += xtx[j * cols + k0 + a] * delta[a];
            h_e[j] += dot;
        }
    }
    free(h_e), free(delta), free(trial);
    return true;
}

const char *quant_awq(const float *w, const float *mean_abs, const double *xtx, const quant_awq_options *o,
                      quant_tensor *t, quant_awq_report *report) {
    const quant_format *f = &t->format;
    uint64_t rows = t->layout.rows, cols = t->layout.cols;
    if (!f->has_column_scale) return "AWQ stores column scales: the format must have them";
    if (f->has_group_index) return "AWQ quantizes contiguous groups; act-order is GPTQ's";
    for (uint64_t k = 0; k < cols; k++)
        if (!(mean_abs[k] >= 0) || !isfinite(mean_abs[k])) return "a mean |x| is negative or not finite";
    unsigned grid = o && o->grid ? o->grid : 20, clip_grid = o && o->clip_grid ? o->clip_grid : 20;
    float *c = malloc(cols * sizeof *c), *best_c = malloc(cols * sizeof *best_c);
    float *row_out = malloc(cols * sizeof *row_out), *shrink = malloc(t->layout.groups * sizeof *shrink);
    double *e = malloc(cols * sizeof *e);
    if (!c || !best_c || !row_out || !shrink || !e) {
        free(c), free(best_c), free(row_out), free(shrink), free(e);
        return "out of memory";
    }
    double best = INFINITY, rtn = 0;
    float best_alpha = 0;
    for (unsigned i = 0; i <= grid; i++) {
        float alpha = (float)i / (float)grid;
        column_scales_for(mean_abs, cols, alpha, c);
        double err = error_with(f, w, rows, cols, c, xtx, row_out, e);
        if (i == 0) rtn = err;
        if (err < best) {
            best = err, best_alpha = alpha;
            memcpy(best_c, c, cols * sizeof *c);
        }
    }
    for (uint64_t k = 0; k < cols; k++)
        quant_store_column_scale(t, k, best_c[k]);
    for (uint64_t n = 0; n < rows; n++) {
        const float *row = w + n * cols;
        bool clipped = o && o->clip && search_clip(f, row, best_c, cols, xtx, clip_grid, shrink, row_out, e);
        quantize_row(f, row, best_c, cols, clipped ? shrink : NULL, row_out, t, n);
    }
    if (report) {
        report->alpha = best_alpha;
        report->rtn_error = rtn;
        report->error = o && o->clip ? quant_output_error(w, t, xtx) : best;
    }
    free(c), free(best_c), free(row_out), free(shrink), free(e);
    return NULL;
}
