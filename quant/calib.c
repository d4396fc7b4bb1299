/* calib.c - calibration statistics of matmul inputs and the output error of
 * a quantized weight (calib.h has the contract). */
#include "calib.h"
#include "quant_group.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

bool quant_act_stats_init(quant_act_stats *s, uint64_t cols, bool with_xtx) {
    memset(s, 0, sizeof *s);
    if (cols == 0 || cols > UINT32_MAX) return false; /* cols^2 fits in 64 bits */
    s->cols = cols;
    s->abs_sum = calloc(cols, sizeof *s->abs_sum);
    s->absmax = calloc(cols, sizeof *s->absmax);
    if (with_xtx && cols * cols <= SIZE_MAX / sizeof(double)) s->xtx = calloc(cols * cols, sizeof *s->xtx);
    if (!s->abs_sum || !s->absmax || (with_xtx && !s->xtx)) {
        quant_act_stats_free(s);
        return false;
    }
    return true;
}

void quant_act_stats_free(quant_act_stats *s) {
    free(s->abs_sum);
    free(s->absmax);
    free(s->xtx);
    free(s->sample);
    memset(s, 0, sizeof *s);
}

bool quant_act_stats_keep_sample(quant_act_stats *s, uint64_t capacity) {
    if (capacity == 0 || s->cols == 0 || s->tokens != 0 || capacity > SIZE_MAX / sizeof(float) / s->cols)
        return false;
    float *sample = malloc(capacity * s->cols * sizeof *sample);
    if (!sample) return false;
    free(s->sample);
    s->sample = sample;
    s->sample_rows = 0;
    s->sample_capacity = capacity;
    s->sample_state = 0x9e3779b97f4a7c15u; /* fixed: the same rows give the same sample */
    return true;
}

/* splitmix64's next number (Steele, Lea, Flood 2014). */
static uint64_t next_random(uint64_t *state) {
    uint64_t z = *state += 0x9e3779b97f4a7c15u;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9u;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebu;
    return z ^ (z >> 31);
}

/* Row `seen` (counted from 0 over every row added) offered to the sample:
 * algorithm R (Vitter 1985). The modulo's bias is below seen / 2^64. */
static void sample_row(quant_act_stats *s, const float *row, uint64_t seen) {
    uint64_t slot = seen < s->sample_capacity ? seen : next_random(&s->sample_state) % (seen + 1);
    if (slot >= s->sample_capacity) return;
    memcpy(s->sample + slot * s->cols, row, s->cols * sizeof *row);
    if (seen < s->sample_capacity) s->sample_rows = seen + 1;
}

void quant_act_stats_add(quant_act_stats *s, const float *x, uint64_t rows) {
    uint64_t cols = s->cols;
    for (uint64_t r = 0; r < rows; r++) {
        const float *row = x + r * cols;
        if (s->sample) sample_row(s, row, s->tokens + r);
        for (uint64_t k = 0; k < cols; k++) {
            float a = fabsf(row[k]);
            s->abs_sum[k] += a;
            if (a > s->absmax[k]) s->absmax[k] = a;
        }
        if (!s->xtx) continue;
        /* The upper triangle, then its mirror: a rank-1 update of XᵀX. */
        for (uint64_t j = 0; j < cols; j++) {
            double xj = row[j];
            double *line = s->xtx + j * cols;
            if (xj == 0) continue;
            for (uint64_t k = j; k < cols; k++)
                line[k] += xj * row[k];
        }
    }
    s->tokens += rows;
    if (!s->xtx) return;
    for (uint64_t j = 0; j < cols; j++)
        for (uint64_t k = j + 1; k < cols; k++)
            s->xtx[k * cols + j] = s->xtx[j * cols + k];
}

void quant_act_stats_mean_abs(const quant_act_stats *s, float *out) {
    for (uint64_t k = 0; k < s->cols; k++)
        out[k] = s->tokens ? (float)(s->abs_sum[k] / (double)s->tokens) : 0.0f;
}

double quant_quadratic_form(const double *e, const double *h, uint64_t n, uint64_t stride) {
    double total = 0;
    for (uint64_t j = 0; j < n; j++) {
        if (e[j] == 0) continue;
        const double *line = h + j * stride;
        double dot = 0;
        for (uint64_t k = 0; k < n; k++)
            dot += line[k] * e[k];
        total += e[j] * dot;
    }
    return total;
}

double quant_output_error_dense(const float *w, const float *w_hat, uint64_t rows, uint64_t cols,
                                const double *xtx) {
    double *e = malloc(cols * sizeof *e), total = 0;
    if (!e) return NAN;
    for (uint64_t n = 0; n < rows; n++) {
        for (uint64_t k = 0; k < cols; k++)
            e[k] = (double)w[n * cols + k] - (double)w_hat[n * cols + k];
        total += quant_quadratic_form(e, xtx, cols, cols);
    }
    free(e);
    return total;
}

double quant_output_error(const float *w, const quant_tensor *t, const double *xtx) {
    uint64_t cols = t->layout.cols;
    double *e = malloc(cols * sizeof *e), total = 0;
    if (!e) return NAN;
    for (uint64_t n = 0; n < t->layout.rows; n++) {
        for (uint64_t k = 0; k < cols; k++)
            e[k] = (double)w[n * cols + k] - (double)quant_value(t, n, k);
        total += quant_quadratic_form(e, xtx, cols, cols);
    }
    free(e);
    return total;
}

double quant_relative_output_error(const float *w, const quant_tensor *t, const double *xtx) {
    uint64_t cols = t->layout.cols;
    double *row = malloc(cols * sizeof *row), output = 0;
    if (!row) return NAN;
    for (uint64_t n = 0; n < t->layout.rows; n++) {
        for (uint64_t k = 0; k < cols; k++)
            row[k] = w[n * cols + k];
        output += quant_quadratic_form(row, xtx, cols, cols);
    }
    free(row);
    double error = quant_output_error(w, t, xtx);
    return output > 0 ? sqrt(error / output) : isnan(error) ? NAN : 0.0;
}
