/* calibrated.h - the quantizers that learn from calibration data (calib.h):
 * AWQ and SmoothQuant choose per-input-channel column scales, GPTQ chooses
 * the codes themselves. Each writes the one packed layout of quant.h, so
 * whatever reads a round-to-nearest weight reads these too.
 *
 * Every function takes w[rows][cols] (row-major f32, rows = output features)
 * and a tensor t whose format and layout are set and whose data holds
 * layout.total zeroed bytes, as quant_rtn does; it returns NULL, or a static
 * message for inconsistent arguments (the format's sections, a matrix that
 * is not positive definite).
 */
#ifndef SMELT_QUANT_CALIBRATED_H
#define SMELT_QUANT_CALIBRATED_H

#include "quant.h"

/* ---- AWQ: activation-aware column scaling (awq.c) --------------------------------
 *
 * Lin et al., "AWQ: Activation-aware Weight Quantization" (2023). The input
 * channels that carry large activations matter most; scaling their weight
 * columns up by s[k] before rounding (and the activations down by s[k])
 * gives them finer steps. s[k] = mean|x[k]|^alpha, normalised so that
 * max(s) * min(s) = 1, with alpha searched on the grid 0, 1/grid, ..., 1
 * for the least output error on the calibration inputs (alpha 0 is plain
 * round-to-nearest, so AWQ never does worse than it there). The weight is
 * stored with column scales c[k] = 1/s[k] (quant.h: the kernel multiplies
 * x[k] by c[k]). With `clip`, each group's range is then shrunk by the
 * factor in 1, 1 - 1/clip_grid, ..., 0.5 that lowers the row's whole output
 * error the most (AWQ's clip search, one group after another, on the exact
 * loss through XᵀX with the other groups' cross terms), or kept when none
 * does: clipping never raises a row's error on the calibration inputs.
 *
 * Each weight gets its own s, even when weights share an input (q/k/v):
 * the kernel applies c per weight, so nothing needs folding into the norm
 * before it, unlike llm-awq's one scale per input shared by its consumers.
 */
typedef struct quant_awq_options {
    unsigned grid;      /* alpha steps; 20 as llm-awq; 0 means 20 */
    bool clip;          /* also search each group's clipping range */
    unsigned clip_grid; /* shrink steps down to 0.5; 0 means 20 */
} quant_awq_options;

typedef struct quant_awq_report {
    float alpha;      /* the chosen migration strength */
    double error;     /* output error of the result (calib.h) */
    double rtn_error; /* output error of round-to-nearest, the same format without column scales */
} quant_awq_report;

/* mean_abs[cols]: mean |x| of the input (quant_act_stats_mean_abs); xtx:
 * its XᵀX [cols][cols] (quant_act_stats). t's format has column scales.
 * report may be NULL. The search costs (grid + 1) * rows * cols^2 flops. */
const char *quant_awq(const float *w, const float *mean_abs, const double *xtx, const quant_awq_options *o,
                      quant_tensor *t, quant_awq_report *report);

/* ---- GPTQ: Hessian-based error compensation (gptq.c) -------------------------------
 *
 * Frantar et al., "GPTQ: Accurate Post-Training Quantization for Generative
 * Pre-trained Transformers" (2022). Columns are quantized one at a time;
 * the rounding error of each is spread over the columns not yet quantized
 * through the inverse Hessian H^-1 (H = XᵀX + damp * mean(diag) * I), which
 * minimises the output error ||X W^T - X Ŵ^T||^2 column by column. The
 * upper Cholesky factor of H^-1 gives every update; updates to columns
 * beyond the current block of `block` columns are batched (the "lazy batch"
 * of the paper), which changes the arithmetic's order, not its result.
 *
 * Groups: a group's scale and zero point are computed, by quant_rtn's rule,
 * from the group's columns as updated when its first column is reached
 * (as the reference implementation does). The block is shrunk to a
 * multiple or divisor of the group size so that every column of a group
 * has all earlier updates applied by then.
 *
 * act_order: columns are processed by descending diag(H) (most activated
 * first; ties by index), and groups are formed over consecutive processed
 * columns, so a group's columns are scattered: the format must then have a
 * group_index section, which records each column's group (AutoGPTQ's
 * desc_act with g_idx, not its "static groups" variant). Without act_order
 * the format must not have one. Columns whose input was always zero
 * (diag(H) = 0) are quantized as zero.
 *
 * Column scales are not supported (the format must lack them). */
typedef struct quant_gptq_options {
    double damp;    /* dampening, a fraction of mean(diag(H)); 0 means 0.01 */
    uint32_t block; /* lazy-batch columns; 0 means 128 */
    bool act_order;
} quant_gptq_options;

/* h: XᵀX [cols][cols] (any positive multiple: the result does not change). */
const char *quant_gptq(const float *w, const double *h, const quant_gptq_options *o, quant_tensor *t);

/* ---- SmoothQuant: migration for W8A8 (smooth.c) ------------------------------------
 *
 * Xiao et al., "SmoothQuant" (2022). Activation outliers make per-token
 * int8 activations coarse; the migration divides input channel k by
 * s[k] = max|x[k]|^alpha / max_n|w[n][k]|^(1 - alpha) and multiplies the
 * weight column by it, balancing the two ranges (alpha 0.5). The weight is
 * stored with column scales c[k] = 1/s[k]: the codes quantize w[n][k] * s[k]
 * and the kernel multiplies x[k] by c[k] before quantizing the activation
 * per token (the activation side is the kernel's: quant.h). A channel whose
 * activation or weight is all zero keeps s = 1. */

/* act_absmax[cols]: max |x| of the input (quant_act_stats); c[cols] out. */
void quant_smooth_scales(const float *w, uint64_t rows, uint64_t cols, const float *act_absmax, float alpha,
                         float *c);

/* The migration, then round-to-nearest with those column scales. t's
 * format has column scales (typically int8, one group per row). */
const char *quant_smooth(const float *w, const float *act_absmax, float alpha, quant_tensor *t);

#endif
