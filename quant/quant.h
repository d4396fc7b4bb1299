/* quant.h - quantized weights: their formats, the one packed layout every
 * part of smelt agrees on, quantization by rounding and dequantization.
 *
 * A quantized weight is a matmul weight W[rows][cols] (rows = output
 * features, cols = input features, the layout of a Hugging Face Linear)
 * stored as codes plus per-group parameters. Its effective value is
 *
 *   int4  w[n][k] = (q[n][k] - z[n][g]) * s[n][g] * c[k]     q, z in 0..15
 *         (z = 8 for every group when the format has no zero points)
 *   int8  w[n][k] =  q[n][k]            * s[n][g] * c[k]     q in -127..127
 *   fp8   w[n][k] = e4m3(q[n][k])       * s[n][g] * c[k]     q an E4M3 byte
 *
 * with g = k / group (or g = group_index[k] when the format has one, for
 * GPTQ's act-order) and c[k] = 1 unless the format has column scales (the
 * 1/s of AWQ's and SmoothQuant's per-input-channel migration: the kernel
 * multiplies x[k] by c[k]). The reference interpreter, the generated kernels
 * and every importer compute exactly this, in f32.
 *
 * Layout of one weight's bytes (one plan weight; sections in this order,
 * each starting at a multiple of QUANT_ALIGN bytes from the first):
 *   codes        rows*cols codes, row-major; int4 two per byte, element 2i
 *                in the low nibble (the smelt_dtype i4 rule), int8 and fp8
 *                one byte each
 *   scales       rows*groups f16, row-major [n][g]
 *   zeros        int4 with a zero point only: rows*groups 4-bit codes,
 *                packed as the codes are, row-major [n][g]
 *   group_index  with act-order only: cols u32, the group of each column
 *   column_scale with column scales only: cols f32
 * where groups = cols / group (group divides cols; group == cols is one
 * scale per output channel). All multi-byte values are little-endian.
 *
 * The codes of an int4 weight may instead be interleaved for the tensor-core
 * dequantize-GEMM (`interleaved`, the IR's weight layout "mma_k16"; it needs
 * cols a multiple of QUANT_MMA_BLOCK and no act-order): each row is still
 * its own K / 2 bytes, but each block of 128 columns of a row is stored as
 * four 16-byte chunks, chunk c holding what lane c of a quad needs for the
 * B fragments of the eight m16n8k16 steps (16 columns each) of the block:
 * for step s, the columns 16s + 2c, 16s + 2c + 1, 16s + 2c + 8, 16s + 2c + 9
 * (element e = 4s + i of the chunk, i in that order). Within each 32-bit
 * word (elements 8w .. 8w + 7: steps 2w and 2w + 1), element 8w + 2p + h
 * sits at nibble p + 4h, so that (word >> 4p) & 0x000f000f is the pair of
 * codes one B register takes, low column first. So one 128-bit load is a
 * lane's B fragments for a whole block, and the decode GEMV reads its rows
 * as 128-bit chunks too (quant_code_position has the formula).
 *
 * This module depends on plan/ (numeric.h, smelt_dtype.h) alone, so the
 * frontend, the reference, the driver and the runtime may all use it.
 */
#ifndef SMELT_QUANT_H
#define SMELT_QUANT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "smelt_dtype.h"

#define QUANT_ALIGN 16u
#define QUANT_MMA_BLOCK 128u /* columns per interleaved block (the "mma_k16" layout above) */

typedef enum quant_kind {
    QUANT_NONE = 0, /* not quantized: stored in its float dtype */
    QUANT_INT4,
    QUANT_INT8,
    QUANT_FP8,
} quant_kind;

/* How the codes were chosen: printed in the IR, not needed to dequantize. */
typedef enum quant_method {
    QUANT_METHOD_RTN = 0,   /* round to nearest */
    QUANT_METHOD_AWQ,       /* activation-aware column scaling, then rounding */
    QUANT_METHOD_GPTQ,      /* Hessian-based error compensation */
    QUANT_METHOD_SMOOTH,    /* SmoothQuant migration, then rounding */
    QUANT_METHOD_CHECKPOINT /* imported as a pre-quantized checkpoint held it */
} quant_method;

typedef struct quant_format {
    quant_kind kind;
    quant_method method;
    uint32_t group;        /* columns per scale; == cols for per-channel */
    bool has_zero;         /* int4 only: asymmetric with a zero point */
    bool has_group_index;  /* a group_index section (act-order) */
    bool has_column_scale; /* a column_scale section */
    bool interleaved;      /* int4 codes in the "mma_k16" order (above), else row-major */
} quant_format;

/* Are a and b the same format, field by field (method too)? */
bool quant_format_equal(const quant_format *a, const quant_format *b);
/* Are weights in a and b stored alike: every field but the method, which
 * does not change what the bytes mean (one kernel reads both)? */
bool quant_format_same_storage(const quant_format *a, const quant_format *b);

/* Byte offsets of the sections of a weight of `rows` x `cols`; a section the
 * format lacks has offset 0 and size 0. `total` is the whole weight. */
typedef struct quant_layout {
    uint64_t rows, cols, groups;
    uint64_t codes, codes_bytes;
    uint64_t scales, scales_bytes;
    uint64_t zeros, zeros_bytes;
    uint64_t group_index, group_index_bytes;
    uint64_t column_scale, column_scale_bytes;
    uint64_t total;
} quant_layout;

/* A weight in the packed layout: `data` holds layout.total bytes. */
typedef struct quant_tensor {
    quant_format format;
    quant_layout layout;
    uint8_t *data;
} quant_tensor;

/* "int4", "int8", "fp8", "none"; and back (false for an unknown name). */
const char *quant_kind_name(quant_kind k);
bool quant_kind_from_name(const char *name, quant_kind *out);
/* "rtn", "awq", "gptq", "smooth", "checkpoint"; and back. */
const char *quant_method_name(quant_method m);
bool quant_method_from_name(const char *name, quant_method *out);

/* The dtype of the codes: i4, i8 or f8e4m3. */
smelt_dtype quant_code_dtype(quant_kind k);

/* Fills *out for a weight of rows x cols. Returns NULL on success, else a
 * static message: a kind that is no quantization, a group of 0 or one that
 * does not divide cols, a zero point on anything but int4, interleaved codes
 * on anything but int4 without act-order whose cols QUANT_MMA_BLOCK divides,
 * a size that overflows 64 bits. */
const char *quant_layout_of(const quant_format *f, uint64_t rows, uint64_t cols, quant_layout *out);

/* A stack of `matrices` quantized weights of rows x cols each (MoE experts:
 * a weight [E, N, K] whose expert e is an [N, K] matrix with its own
 * scales, zero points, group index and column scales): each matrix in the
 * layout above, one after another, matrix e at byte e * *stride. One matrix
 * (a 2-D weight) has *stride = *total = the layout's total; a stack of more
 * rounds each matrix up to QUANT_ALIGN bytes so that every section of every
 * expert stays 16-byte aligned. Returns NULL or quant_layout_of's message
 * (or an overflow of the whole). */
const char *quant_stack_layout_of(const quant_format *f, uint64_t matrices, uint64_t rows, uint64_t cols,
                                  quant_layout *matrix, uint64_t *stride, uint64_t *total);
/* Can a weight of `cols` columns in format f (interleaved or not) have its
 * codes interleaved? int4, no act-order, cols a multiple of QUANT_MMA_BLOCK. */
bool quant_can_interleave(const quant_format *f, uint64_t cols);
/* Where code (row, col) is in the codes section, counted in codes (nibbles
 * for int4): row * cols + col, or its interleaved place. */
uint64_t quant_code_position(const quant_format *f, uint64_t cols, uint64_t row, uint64_t col);
/* Rewrites t's codes in place into the order `interleaved` says (and sets
 * its format's flag); NULL, or a static message (the format cannot be
 * interleaved, out of memory). */
const char *quant_set_interleaved(quant_tensor *t, bool interleaved);

/* Accessors of a tensor's sections (no bounds checks beyond the layout). */
unsigned quant_code(const quant_tensor *t, uint64_t row, uint64_t col); /* the raw code */
float quant_scale(const quant_tensor *t, uint64_t row, uint64_t group);
/* The zero point: int4's stored code, or 8 for int4 without zero points
 * (symmetric codes); 0 for int8 and fp8. */
unsigned quant_zero(const quant_tensor *t, uint64_t row, uint64_t group);
uint64_t quant_group_of(const quant_tensor *t, uint64_t col);
float quant_column_scale(const quant_tensor *t, uint64_t col); /* 1 without column scales */

/* The effective value of one element, by the formula above, in f32. */
float quant_value(const quant_tensor *t, uint64_t row, uint64_t col);
/* All of them, row-major [rows][cols]. */
void quant_dequantize(const quant_tensor *t, float *out);

/* A plan weight-table entry's format (plan/program.h's prog_quant, which
 * holds the same numbers) and back. */
struct prog_quant;
quant_format quant_format_from_program(const struct prog_quant *q);
struct prog_quant quant_format_to_program(const quant_format *f);

/* Round-to-nearest quantization of w[rows][cols] (row-major f32) into `t`,
 * whose format and layout are set and whose data holds layout.total bytes
 * (zeroed by the caller). `column_scale` (cols values, or NULL) is c[k]: the
 * codes quantize w[n][k] / c[k] and the section stores c[k]; the format must
 * have column scales exactly when it is given. Group parameters:
 *   int4 with zero: s = (max - min) / 15, z = round(-min / s) clamped to
 *                   0..15 (min <= 0 <= max extended to include 0);
 *   int4 without:   s = absmax / 7, codes q + 8 with z = 8 (symmetric);
 *   int8:           s = absmax / 127;
 *   fp8:            s = absmax / 448 (E4M3's largest finite value);
 * a group of zeros gets s = 1. Scales are rounded to f16 before the codes
 * are chosen, so the codes are the nearest for the scale that is stored.
 * Returns NULL, or a static message (inconsistent arguments). */
const char *quant_rtn(const float *w, const float *column_scale, quant_tensor *t);

#endif
