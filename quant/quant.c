/* quant.c - the packed layout of quantized weights, dequantization and
 * round-to-nearest quantization (quant.h has the contract). */
#include "quant.h"
#include "quant_group.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "numeric.h"
#include "program.h"

_Static_assert((int)PROG_QUANT_NONE == (int)QUANT_NONE && (int)PROG_QUANT_INT4 == (int)QUANT_INT4 &&
                   (int)PROG_QUANT_INT8 == (int)QUANT_INT8 && (int)PROG_QUANT_FP8 == (int)QUANT_FP8,
               "a plan's quantization kinds are quant_kind's");

quant_format quant_format_from_program(const prog_quant *q) {
    return (quant_format){.kind = (quant_kind)q->kind,
                          .method = (quant_method)q->method,
                          .group = q->group,
                          .has_zero = q->flags & PROG_QUANT_ZERO,
                          .has_group_index = q->flags & PROG_QUANT_GROUP_INDEX,
                          .has_column_scale = q->flags & PROG_QUANT_COLUMN_SCALE,
                          .interleaved = q->flags & PROG_QUANT_INTERLEAVED};
}

prog_quant quant_format_to_program(const quant_format *f) {
    return (prog_quant){.kind = (uint8_t)f->kind,
                        .method = (uint8_t)f->method,
                        .flags = (uint8_t)((f->has_zero ? PROG_QUANT_ZERO : 0) |
                                           (f->has_group_index ? PROG_QUANT_GROUP_INDEX : 0) |
                                           (f->has_column_scale ? PROG_QUANT_COLUMN_SCALE : 0) |
                                           (f->interleaved ? PROG_QUANT_INTERLEAVED : 0)),
                        .group = f->group};
}

bool quant_format_same_storage(const quant_format *a, const quant_format *b) {
    return a->kind == b->kind && a->group == b->group && a->has_zero == b->has_zero &&
           a->has_group_index == b->has_group_index && a->has_column_scale == b->has_column_scale &&
           a->interleaved == b->interleaved;
}

bool quant_format_equal(const quant_format *a, const quant_format *b) {
    return a->method == b->method && quant_format_same_storage(a, b);
}

static const char *const kind_names[] = {"none", "int4", "int8", "fp8"};
static const char *const method_names[] = {"rtn", "awq", "gptq", "smooth", "checkpoint"};

const char *quant_kind_name(quant_kind k) {
    return (unsigned)k < sizeof kind_names / sizeof *kind_names ? kind_names[k] : "?";
}

bool quant_kind_from_name(const char *name, quant_kind *out) {
    for (unsigned i = 0; i < sizeof kind_names / sizeof *kind_names; i++)
        if (strcmp(name, kind_names[i]) == 0) return *out = (quant_kind)i, true;
    return false;
}

const char *quant_method_name(quant_method m) {
    return (unsigned)m < sizeof method_names / sizeof *method_names ? method_names[m] : "?";
}

bool quant_method_from_name(const char *name, quant_method *out) {
    for (unsigned i = 0; i < sizeof method_names / sizeof *method_names; i++)
        if (strcmp(name, method_names[i]) == 0) return *out = (quant_method)i, true;
    return false;
}

smelt_dtype quant_code_dtype(quant_kind k) {
    switch (k) {
    case QUANT_INT4: return SMELT_DTYPE_I4;
    case QUANT_INT8: return SMELT_DTYPE_I8;
    case QUANT_FP8: return SMELT_DTYPE_F8E4M3;
    default: return SMELT_DTYPE_UNKNOWN;
    }
}

/* *at += size, rounded up to QUANT_ALIGN first; false on overflow. */
static bool place(uint64_t *at, uint64_t size, uint64_t *offset) {
    uint64_t start = (*at + QUANT_ALIGN - 1) / QUANT_ALIGN * QUANT_ALIGN;
    if (start < *at || size > UINT64_MAX - start) return false;
    *offset = size ? start : 0;
    *at = size ? start + size : *at;
    return true;
}

/* a * b, or false when it overflows. */
static bool mul_ok(uint64_t a, uint64_t b, uint64_t *out) {
    if (b && a > UINT64_MAX / b) return false;
    *out = a * b;
    return true;
}

const char *quant_layout_of(const quant_format *f, uint64_t rows, uint64_t cols, quant_layout *out) {
    memset(out, 0, sizeof *out);
    if (f->kind != QUANT_INT4 && f->kind != QUANT_INT8 && f->kind != QUANT_FP8)
        return "the format is no quantization";
    if (f->group == 0 || cols % f->group != 0) return "the group size does not divide the input columns";
    if (f->has_zero && f->kind != QUANT_INT4) return "only int4 has zero points";
    if (f->interleaved && !quant_can_interleave(f, cols))
        return "interleaved codes (layout mma_k16) need int4 without act-order and columns a multiple of 128";
    uint64_t elements, code_bits, groups = cols / f->group, group_elements;
    code_bits = f->kind == QUANT_INT4 ? 4 : 8;
    if (!mul_ok(rows, cols, &elements) || !mul_ok(rows, groups, &group_elements) || elements > UINT64_MAX / 8)
        return "the weight's size overflows";
    out->rows = rows, out->cols = cols, out->groups = groups;
    out->codes_bytes = (elements * code_bits + 7) / 8;
    if (!mul_ok(group_elements, 2, &out->scales_bytes)) return "the weight's size overflows";
    out->zeros_bytes = f->has_zero ? group_elements / 2 + group_elements % 2 : 0;
    if (f->has_group_index && !mul_ok(cols, 4, &out->group_index_bytes)) return "the weight's size overflows";
    if (f->has_column_scale && !mul_ok(cols, 4, &out->column_scale_bytes))
        return "the weight's size overflows";
    uint64_t at = 0;
    if (!place(&at, out->codes_bytes, &out->codes) || !place(&at, out->scales_bytes, &out->scales) ||
        !place(&at, out->zeros_bytes, &out->zeros) ||
        !place(&at, out->group_index_bytes, &out->group_index) ||
        !place(&at, out->column_scale_bytes, &out->column_scale))
        return "the weight's size overflows";
    out->total = at;
    return NULL;
}

const char *quant_stack_layout_of(const quant_format *f, uint64_t matrices, uint64_t rows, uint64_t cols,
                                  quant_layout *matrix, uint64_t *stride, uint64_t *total) {
    *stride = *total = 0;
    const char *why = quant_layout_of(f, rows, cols, matrix);
    if (why) return why;
    if (matrices == 0) return "a stack of no matrices";
    if (matrices == 1) {
        *stride = *total = matrix->total;
        return NULL;
    }
    if (matrix->total > UINT64_MAX - (QUANT_ALIGN - 1)) return "the weight's size overflows";
    *stride = (matrix->total + QUANT_ALIGN - 1) / QUANT_ALIGN * QUANT_ALIGN;
    if (!mul_ok(matrices, *stride, total)) return "the weight's size overflows";
    return NULL;
}

static unsigned nibble(const uint8_t *bytes, uint64_t i) { return (bytes[i / 2] >> (i % 2 * 4)) & 15u; }

static void set_nibble(uint8_t *bytes, uint64_t i, unsigned v) {
    uint8_t shift = (uint8_t)(i % 2 * 4);
    bytes[i / 2] = (uint8_t)((bytes[i / 2] & ~(15u << shift)) | ((v & 15u) << shift));
}

static uint32_t load_u32(const uint8_t *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void store_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

bool quant_can_interleave(const quant_format *f, uint64_t cols) {
    return f->kind == QUANT_INT4 && !f->has_group_index && cols > 0 && cols % QUANT_MMA_BLOCK == 0;
}

uint64_t quant_code_position(const quant_format *f, uint64_t cols, uint64_t row, uint64_t col) {
    if (!f->interleaved) return row * cols + col;
    uint64_t block = col / QUANT_MMA_BLOCK, in_block = col % QUANT_MMA_BLOCK;
    unsigned step = (unsigned)(in_block / 16), q = (unsigned)(in_block % 16);
    unsigned lane = q % 8 / 2, i = q % 2 + q / 8 * 2; /* the quad lane and the element of its step */
    unsigned e = 4 * step + i, word = e / 8, nibble = e % 8 / 2 + 4 * (e % 2);
    return row * cols + block * QUANT_MMA_BLOCK + 32 * lane + 8 * word + nibble;
}

const char *quant_set_interleaved(quant_tensor *t, bool interleaved) {
    if (t->format.interleaved == interleaved) return NULL;
    quant_format to = t->format;
    to.interleaved = interleaved;
    if (interleaved && !quant_can_interleave(&to, t->layout.cols))
        return "the weight's codes cannot be interleaved (int4 without act-order, columns a multiple of 128)";
    uint8_t *codes = t->data + t->layout.codes,
            *copy = malloc(t->layout.codes_bytes ? t->layout.codes_bytes : 1);
    if (!copy) return "out of memory";
    memcpy(copy, codes, t->layout.codes_bytes);
    for (uint64_t n = 0; n < t->layout.rows; n++)
        for (uint64_t k = 0; k < t->layout.cols; k++)
            set_nibble(codes, quant_code_position(&to, t->layout.cols, n, k),
                       nibble(copy, quant_code_position(&t->format, t->layout.cols, n, k)));
    free(copy);
    t->format.interleaved = interleaved;
    return NULL;
}

unsigned quant_code(const quant_tensor *t, uint64_t row, uint64_t col) {
    uint64_t i = quant_code_position(&t->format, t->layout.cols, row, col);
    const uint8_t *codes = t->data + t->layout.codes;
    return t->format.kind == QUANT_INT4 ? nibble(codes, i) : codes[i];
}

float quant_scale(const quant_tensor *t, uint64_t row, uint64_t group) {
    const uint8_t *p = t->data + t->layout.scales + 2 * (row * t->layout.groups + group);
    return plan_f16_to_f32((uint16_t)(p[0] | p[1] << 8));
}

unsigned quant_zero(const quant_tensor *t, uint64_t row, uint64_t group) {
    if (t->format.kind != QUANT_INT4) return 0;
    if (!t->format.has_zero) return 8;
    return nibble(t->data + t->layout.zeros, row * t->layout.groups + group);
}

uint64_t quant_group_of(const quant_tensor *t, uint64_t col) {
    if (!t->format.has_group_index) return col / t->format.group;
    return load_u32(t->data + t->layout.group_index + 4 * col);
}

float quant_column_scale(const quant_tensor *t, uint64_t col) {
    if (!t->format.has_column_scale) return 1.0f;
    return plan_f32_from_bits(load_u32(t->data + t->layout.column_scale + 4 * col));
}

float quant_value(const quant_tensor *t, uint64_t row, uint64_t col) {
    uint64_t g = quant_group_of(t, col);
    unsigned q = quant_code(t, row, col);
    float code;
    switch (t->format.kind) {
    case QUANT_INT4: code = (float)((int)q - (int)quant_zero(t, row, g)); break;
    case QUANT_INT8: code = (float)(int8_t)(uint8_t)q; break;
    default: code = plan_f8e4m3_to_f32((uint8_t)q); break;
    }
    return code * quant_scale(t, row, g) * quant_column_scale(t, col);
}

void quant_dequantize(const quant_tensor *t, float *out) {
    for (uint64_t n = 0; n < t->layout.rows; n++)
        for (uint64_t k = 0; k < t->layout.cols; k++)
            out[n * t->layout.cols + k] = quant_value(t, n, k);
}

/* ---- one group's parameters and codes (quant_group.h) ----------------------------- */

static float clampf(float v, float lo, float hi) { return v < lo ? lo : v > hi ? hi : v; }

/* The stored f16 scale for a group whose wanted scale is `s`: never zero, so
 * a group of zeros (or one too small for f16) still divides. */
static float stored_scale(float s) {
    float h = plan_f16_to_f32(plan_f32_to_f16(s));
    return h > 0 && isfinite(h) ? h : 1.0f;
}

quant_group_params quant_group_params_from_range(const quant_format *f, float lo, float hi) {
    float amax = hi > -lo ? hi : -lo;
    switch (f->kind) {
    case QUANT_INT4:
        if (f->has_zero) {
            float s = stored_scale((hi - lo) / 15.0f);
            return (quant_group_params){s, (unsigned)clampf(nearbyintf(-lo / s), 0, 15)};
        }
        return (quant_group_params){stored_scale(amax / 7.0f), 8};
    case QUANT_INT8: return (quant_group_params){stored_scale(amax / 127.0f), 0};
    default: return (quant_group_params){stored_scale(amax / 448.0f), 0};
    }
}

quant_group_params quant_group_params_of(const quant_format *f, const float *values, uint64_t count) {
    float lo = 0, hi = 0;
    for (uint64_t i = 0; i < count; i++)
        lo = values[i] < lo ? values[i] : lo, hi = values[i] > hi ? values[i] : hi;
    return quant_group_params_from_range(f, lo, hi);
}

unsigned quant_group_encode(const quant_format *f, quant_group_params p, float v) {
    v /= p.scale;
    switch (f->kind) {
    case QUANT_INT4: return (unsigned)clampf(nearbyintf(v) + (float)p.zero, 0, 15);
    case QUANT_INT8: return (uint8_t)(int8_t)clampf(nearbyintf(v), -127, 127);
    default: return plan_f32_to_f8e4m3(clampf(v, -448, 448));
    }
}

float quant_group_decode(const quant_format *f, quant_group_params p, unsigned q) {
    switch (f->kind) {
    case QUANT_INT4: return (float)((int)q - (int)p.zero) * p.scale;
    case QUANT_INT8: return (float)(int8_t)(uint8_t)q * p.scale;
    default: return plan_f8e4m3_to_f32((uint8_t)q) * p.scale;
    }
}

void quant_store_code(quant_tensor *t, uint64_t row, uint64_t col, unsigned code) {
    uint64_t i = quant_code_position(&t->format, t->layout.cols, row, col);
    uint8_t *codes = t->data + t->layout.codes;
    if (t->format.kind == QUANT_INT4)
        set_nibble(codes, i, code);
    else
        codes[i] = (uint8_t)code;
}

void quant_store_params(quant_tensor *t, uint64_t row, uint64_t group, quant_group_params p) {
    uint64_t i = row * t->layout.groups + group;
    uint16_t h = plan_f32_to_f16(p.scale);
    uint8_t *at = t->data + t->layout.scales + 2 * i;
    at[0] = (uint8_t)h, at[1] = (uint8_t)(h >> 8);
    if (t->format.has_zero) set_nibble(t->data + t->layout.zeros, i, p.zero);
}

void quant_store_group_index(quant_tensor *t, uint64_t col, uint32_t group) {
    store_u32(t->data + t->layout.group_index + 4 * col, group);
}

void quant_store_column_scale(quant_tensor *t, uint64_t col, float c) {
    store_u32(t->data + t->layout.column_scale + 4 * col, plan_f32_to_bits(c));
}

/* ---- round to nearest --------------------------------------------------------------- */

const char *quant_rtn(const float *w, const float *column_scale, quant_tensor *t) {
    const quant_format *f = &t->format;
    const quant_layout *l = &t->layout;
    if (f->has_group_index) return "round-to-nearest quantizes contiguous groups; act-order is GPTQ's";
    if (f->has_column_scale != (column_scale != NULL))
        return "column scales are given exactly when the format has them";
    for (uint64_t k = 0; column_scale && k < l->cols; k++) {
        if (!(column_scale[k] > 0) || !isfinite(column_scale[k])) return "a column scale is not positive";
        quant_store_column_scale(t, k, column_scale[k]);
    }
    for (uint64_t n = 0; n < l->rows; n++) {
        const float *row = w + n * l->cols;
        for (uint64_t g = 0; g < l->groups; g++) {
            uint64_t k0 = g * f->group;
            float lo = 0, hi = 0;
            for (uint64_t k = k0; k < k0 + f->group; k++) {
                float v = row[k] / (column_scale ? column_scale[k] : 1.0f);
                lo = v < lo ? v : lo, hi = v > hi ? v : hi;
            }
            quant_group_params p = quant_group_params_from_range(f, lo, hi);
            quant_store_params(t, n, g, p);
            for (uint64_t k = k0; k < k0 + f->group; k++)
                quant_store_code(t, n, k,
                                 quant_group_encode(f, p, row[k] / (column_scale ? column_scale[k] : 1.0f)));
        }
    }
    return NULL;
}
