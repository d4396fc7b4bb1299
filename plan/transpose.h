/* transpose.h - a matrix transposed, for weights whose checkpoint tensor is
 * the transpose of what the plan stores (prog_weight.transposed: GPT-2's
 * Conv1D weights [K, N], stored [N, K] out_in). Binding is the only user,
 * once per weight, so the plain loop is enough. */
#ifndef SMELT_PLAN_TRANSPOSE_H
#define SMELT_PLAN_TRANSPOSE_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* dst [columns, rows] = the transpose of src [rows, columns], elements of
 * element_bytes bytes; src and dst must not overlap. */
static inline void plan_transpose(void *dst, const void *src, uint64_t rows, uint64_t columns,
                                  size_t element_bytes) {
    unsigned char *out = dst;
    const unsigned char *in = src;
    for (uint64_t r = 0; r < rows; r++)
        for (uint64_t c = 0; c < columns; c++)
            memcpy(out + (c * rows + r) * element_bytes, in + (r * columns + c) * element_bytes,
                   element_bytes);
}

#endif
