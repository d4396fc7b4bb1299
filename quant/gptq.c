/* gptq.c - GPTQ: column-by-column rounding with the error compensated
 * through the inverse Hessian (calibrated.h has the contract).
 *
 * Learned from the GPTQ paper (Algorithm 1) and the reference code's
 * fasterquant; written here in f64 over the packed layout of quant.h.
 * Shapes: W[rows][cols] (row-major, as the weight), H[cols][cols].
 * In act-order every column index below is a position in the processing
 * order; order[i] is the weight's own column at position i.
 */
#include "calibrated.h"
#include "quant_group.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* In place: a[n][n] symmetric positive definite -> its lower Cholesky
 * factor L (a = L L^T) in the lower triangle, the upper set to 0. False
 * when a pivot is not positive. */
static bool cholesky_lower(double *a, uint64_t n) {
    for (uint64_t j = 0; j < n; j++) {
        double d = a[j * n + j];
        for (uint64_t k = 0; k < j; k++)
            d -= a[j * n + k] * a[j * n + k];
        if (!(d > 0)) return false;
        d = sqrt(d);
        a[j * n + j] = d;
        for (uint64_t i = j + 1; i < n; i++) {
            double v = a[i * n + j];
            for (uint64_t k = 0; k < j; k++)
                v -= a[i * n + k] * a[j * n + k];
            a[i * n + j] = v / d;
        }
        for (uint64_t i = 0; i < j; i++)
            a[i * n + j] = 0;
    }
    return true;
}

/* In place: the lower factor L -> (L L^T)^-1 = L^-T L^-1, symmetric. */
static bool inverse_from_cholesky(double *a, uint64_t n) {
    double *inv = calloc(n * n, sizeof *inv); /* L^-1, lower */
    if (!inv) return false;
    for (uint64_t j = 0; j < n; j++) { /* column j of L^-1 by forward substitution */
        inv[j * n + j] = 1.0 / a[j * n + j];
        for (uint64_t i = j + 1; i < n; i++) {
            double v = 0;
            for (uint64_t k = j; k < i; k++)
                v -= a[i * n + k] * inv[k * n + j];
            inv[i * n + j] = v / a[i * n + i];
        }
    }
    for (uint64_t i = 0; i < n; i++) /* (L^-T L^-1)[i][j] = sum_k inv[k][i] inv[k][j], k >= max(i, j) */
        for (uint64_t j = 0; j <= i; j++) {
            double v = 0;
            for (uint64_t k = i; k < n; k++)
                v += inv[k * n + i] * inv[k * n + j];
            a[i * n + j] = a[j * n + i] = v;
        }
    free(inv);
    return true;
}

/* In place: a symmetric positive definite -> its upper factor U (a = U^T U). */
static bool cholesky_upper(double *a, uint64_t n) {
    if (!cholesky_lower(a, n)) return false;
    for (uint64_t i = 0; i < n; i++) /* U = L^T */
        for (uint64_t j = i + 1; j < n; j++)
            a[i * n + j] = a[j * n + i], a[j * n + i] = 0;
    return true;
}

/* The lazy-batch size: a multiple of the group when at least one group,
 * else a divisor of it, so a group never starts inside a batch it outlives. */
static uint64_t batch_size(uint64_t block, uint64_t group) {
    if (block >= group) return block / group * group;
    while (group % block)
        block--;
    return block;
}

typedef struct gptq_work {
    double *w;                  /* [rows][cols], columns in processing order */
    double *h;                  /* [cols][cols]: H, then the upper factor U of H^-1 */
    double *err;                /* [rows][batch]: scaled errors of the current batch */
    float *group;               /* [group]: one row's values of a starting group */
    quant_group_params *params; /* [rows]: the current group's */
    uint64_t *order;            /* [cols] */
} gptq_work;

static void work_free(gptq_work *g) {
    free(g->w), free(g->h), free(g->err), free(g->group), free(g->params), free(g->order);
}

/* Columns by descending diag(h), ties by index (a stable insertion sort
 * would be quadratic: merge sort by hand keeps it n log n). */
static void sort_by_diagonal(uint64_t *order, uint64_t *tmp, uint64_t n, const double *h, uint64_t cols) {
    if (n < 2) return;
    uint64_t half = n / 2;
    sort_by_diagonal(order, tmp, half, h, cols);
    sort_by_diagonal(order + half, tmp, n - half, h, cols);
    uint64_t i = 0, j = half, o = 0;
    while (i < half || j < n) {
        bool left = j >= n || (i < half && h[order[i] * cols + order[i]] >= h[order[j] * cols + order[j]]);
        tmp[o++] = left ? order[i++] : order[j++];
    }
    memcpy(order, tmp, n * sizeof *order);
}

/* W and H permuted into processing order, dead columns zeroed, H damped
 * and replaced by the upper factor of its inverse. */
static const char *prepare(gptq_work *g, const float *w, const double *h, uint64_t rows, uint64_t cols,
                           const quant_gptq_options *o) {
    for (uint64_t i = 0; i < cols; i++)
        g->order[i] = i;
    if (o->act_order) {
        uint64_t *tmp = malloc(cols * sizeof *tmp);
        if (!tmp) return "out of memory";
        sort_by_diagonal(g->order, tmp, cols, h, cols);
        free(tmp);
    }
    double mean = 0;
    for (uint64_t i = 0; i < cols; i++) {
        uint64_t a = g->order[i];
        bool dead = h[a * cols + a] == 0;
        for (uint64_t n = 0; n < rows; n++)
            g->w[n * cols + i] = dead ? 0.0 : (double)w[n * cols + a];
        for (uint64_t j = 0; j < cols; j++)
            g->h[i * cols + j] = h[a * cols + g->order[j]];
        if (dead) g->h[i * cols + i] = 1.0;
        mean += g->h[i * cols + i];
    }
    double damp = (o->damp > 0 ? o->damp : 0.01) * mean / (double)cols;
    for (uint64_t i = 0; i < cols; i++)
        g->h[i * cols + i] += damp;
    if (!cholesky_lower(g->h, cols)) return "the Hessian is not positive definite (raise the dampening)";
    if (!inverse_from_cholesky(g->h, cols)) return "out of memory";
    if (!cholesky_upper(g->h, cols)) return "the inverse Hessian is not positive definite";
    return NULL;
}

const char *quant_gptq(const float *w, const double *h, const quant_gptq_options *options, quant_tensor *t) {
    const quant_format *f = &t->format;
    uint64_t rows = t->layout.rows, cols = t->layout.cols, group = f->group;
    quant_gptq_options o = options ? *options : (quant_gptq_options){0};
    if (f->has_column_scale) return "GPTQ does not take column scales";
    if (f->has_group_index != o.act_order) return "act-order needs a group_index section, and only it";
    for (uint64_t i = 0; i < cols; i++)
        if (!(h[i * cols + i] >= 0) || !isfinite(h[i * cols + i]))
            return "the Hessian's diagonal is not finite";
    uint64_t batch = batch_size(o.block ? o.block : 128, group);
    if (batch > cols) batch = cols;
    if (cols && (cols > SIZE_MAX / sizeof(double) / cols || rows > SIZE_MAX / sizeof(double) / cols))
        return "the weight is too large for GPTQ's working copies";
    gptq_work g = {
        .w = malloc(rows * cols * sizeof *g.w),
        .h = malloc(cols * cols * sizeof *g.h),
        .err = malloc(rows * batch * sizeof *g.err),
        .group = malloc(group * sizeof *g.group),
        .params = malloc(rows * sizeof *g.params),
        .order = malloc(cols * sizeof *g.order),
    };
    if (!g.w || !g.h || !g.err || !g.group || !g.params || !g.order) {
        work_free(&g);
        return "out of memory";
    }
    const char *problem = prepare(&g, w, h, rows, cols, &o);
    for (uint64_t i1 = 0; !problem && i1 < cols; i1 += batch) {
        uint64_t i2 = i1 + batch < cols ? i1 + batch : cols;
        for (uint64_t i = i1; i < i2; i++) {
            const double *u = g.h + i * cols; /* row i of U */
            if (i % group == 0) /* the group starts: its parameters from its columns as updated now */
                for (uint64_t n = 0; n < rows; n++) {
                    for (uint64_t k = 0; k < group; k++)
                        g.group[k] = (float)g.w[n * cols + i + k];
                    g.params[n] = quant_group_params_of(f, g.group, group);
                    quant_store_params(t, n, i / group, g.params[n]);
                }
            for (uint64_t n = 0; n < rows; n++) {
                double *row = g.w + n * cols;
                unsigned q = quant_group_encode(f, g.params[n], (float)row[i]);
                quant_store_code(t, n, g.order[i], q);
                double e = (row[i] - (double)quant_group_decode(f, g.params[n], q)) / u[i];
                g.err[n * batch + (i - i1)] = e;
                for (uint64_t j = i + 1; j < i2; j++) /* within the batch: now */
                    row[j] -= e * u[j];
            }
        }
        for (uint64_t n = 0; n < rows; n++) { /* beyond it: the batch's errors at once */
            double *row = g.w + n * cols;
            for (uint64_t i = i1; i < i2; i++) {
                double e = g.err[n * batch + (i - i1)];
                const double *u = g.h + i * cols;
                for (uint64_t j = i2; j < cols; j++)
                    row[j] -= e * u[j];
            }
        }
    }
    for (uint64_t i = 0; !problem && f->has_group_index && i < cols; i++)
        quant_store_group_index(t, g.order[i], (uint32_t)(i / group));
    work_free(&g);
    return problem;
}
