/* quant_group.h - the rule of one group's parameters and codes, shared by
 * round-to-nearest (quant.c) and the quantizers that choose codes around
 * it (awq.c, gptq.c, smooth.c), so that every one of them stores exactly
 * what quant_value decodes. Internal to quant/.
 *
 * Values here are already divided by their column scale c[k]: the codes
 * quantize w[n][k] / c[k] (quant.h).
 */
#ifndef SMELT_QUANT_GROUP_H
#define SMELT_QUANT_GROUP_H

#include "quant.h"

/* One group's stored parameters: the f16-rounded scale (never 0) and the
 * zero point (int4; 8 for symmetric int4, 0 for int8 and fp8). */
typedef struct quant_group_params {
    float scale;
    unsigned zero;
} quant_group_params;

/* The parameters of a group of `count` values (quant_rtn's rule, quant.h). */
quant_group_params quant_group_params_of(const quant_format *f, const float *values, uint64_t count);
/* The same from the group's extremes: lo = min(values, 0), hi = max(values, 0). */
quant_group_params quant_group_params_from_range(const quant_format *f, float lo, float hi);

/* The code of value v under p (nearest, clamped to the kind's range). */
unsigned quant_group_encode(const quant_format *f, quant_group_params p, float v);
/* The value code q stands for under p, before the column scale:
 * (q - z) * s, or e4m3(q) * s; quant_value's arithmetic. */
float quant_group_decode(const quant_format *f, quant_group_params p, unsigned q);

/* Writers of a tensor's sections (quant.h's layout). */
void quant_store_code(quant_tensor *t, uint64_t row, uint64_t col, unsigned code);
void quant_store_params(quant_tensor *t, uint64_t row, uint64_t group, quant_group_params p);
void quant_store_group_index(quant_tensor *t, uint64_t col, uint32_t group);
void quant_store_column_scale(quant_tensor *t, uint64_t col, float c);

/* e^T h e for e[n] and the n x n block of h at h, rows `stride` apart (a
 * diagonal block of a larger XᵀX: h + k0 * cols + k0, stride cols). */
double quant_quadratic_form(const double *e, const double *h, uint64_t n, uint64_t stride);

#endif
