/* calib.h - what calibration measures of a matmul's input, and the output
 * error a quantized weight makes on it.
 *
 * For a matmul y = x W^T with W[rows][cols] (quant.h), calibration runs the
 * fp32 reference over sample text and gathers, over every token's input row
 * x[cols]:
 *   abs_sum[k]   sum |x[k]|            (mean |x| = abs_sum / tokens: AWQ)
 *   absmax[k]    max |x[k]|            (SmoothQuant, static activation scales)
 *   xtx[j][k]    sum x[j] x[k] (f64)   (XᵀX: GPTQ's Hessian up to a factor,
 *                                       and the output error below)
 * Weights that multiply the same input (q/k/v, gate/up) share one record.
 * On request a record also keeps a sample of the rows themselves (the
 * accuracy gate's W8A8 error, whose activation rounding XᵀX cannot see): a
 * uniform sample of at most `sample_capacity` of the rows seen, without
 * replacement (reservoir sampling, algorithm R, with a fixed seed, so the
 * same rows in the same order give the same sample); sample_capacity * cols
 * floats, allocated once.
 *
 * The output error of a quantized weight Ŵ on those tokens is
 *   ||X W^T - X Ŵ^T||_F^2 = sum_n (w_n - ŵ_n)^T (XᵀX) (w_n - ŵ_n)
 * so XᵀX measures it exactly without keeping X.
 */
#ifndef SMELT_QUANT_CALIB_H
#define SMELT_QUANT_CALIB_H

#include "quant.h"

typedef struct quant_act_stats {
    uint64_t cols;
    uint64_t tokens; /* input rows seen */
    double *abs_sum; /* [cols] */
    float *absmax;   /* [cols] */
    double *xtx;     /* [cols][cols], symmetric; NULL when not gathered */
    float *sample;   /* [sample_capacity][cols]: kept input rows, the first sample_rows valid;
                        NULL when not kept */
    uint64_t sample_rows, sample_capacity;
    uint64_t sample_state; /* the sampler's random state */
} quant_act_stats;

/* Zeroed statistics of an input of `cols` features; XᵀX only when asked
 * (cols^2 doubles). False when memory runs out or the size overflows. */
bool quant_act_stats_init(quant_act_stats *s, uint64_t cols, bool with_xtx);
void quant_act_stats_free(quant_act_stats *s);

/* Keeps a sample of up to `capacity` (> 0) of the rows added: capacity *
 * cols floats. Call it before adding any. False when memory runs out, the
 * size overflows or rows were added already (s unchanged). */
bool quant_act_stats_keep_sample(quant_act_stats *s, uint64_t capacity);

/* Adds `rows` input rows x[rows][cols] (row-major), to the sample too when
 * one is kept: row i of all seen (from 0) fills slot i while the sample has
 * room, and afterwards replaces a slot chosen uniformly in 0..i when that
 * slot is below the capacity, so every row is in the sample with the same
 * probability capacity / rows seen. */
void quant_act_stats_add(quant_act_stats *s, const float *x, uint64_t rows);

/* mean |x[k]| over the tokens seen (0 before any), into out[cols]. */
void quant_act_stats_mean_abs(const quant_act_stats *s, float *out);

/* sum_n (w_n - ŵ_n)^T xtx (w_n - ŵ_n): the squared output error of the
 * quantized t against w[rows][cols] on the calibration inputs. */
double quant_output_error(const float *w, const quant_tensor *t, const double *xtx);

/* The same for a float matrix w_hat[rows][cols] in place of t. */
double quant_output_error_dense(const float *w, const float *w_hat, uint64_t rows, uint64_t cols,
                                const double *xtx);

/* sqrt(quant_output_error / sum_n w_n^T xtx w_n): the output error of t
 * relative to the output itself, ||X W^T - X Ŵ^T||_F / ||X W^T||_F (the
 * accuracy gate's measure, driver/accuracy_gate.h); 0 when the output is 0
 * (an input never seen), NaN when memory runs out. */
double quant_relative_output_error(const float *w, const quant_tensor *t, const double *xtx);

#endif
