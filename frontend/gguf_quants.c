/* gguf_quants.c - ggml's block formats to f32 (layouts: gguf.h).
 *
 * Each format is written from its published block layout. The arithmetic
 * is gguf-py's (gguf/quants.py, what tests/reference/make_gguf_fixtures.py
 * checks against): the same f32 products and sums in the same order, e.g.
 * Q4_K's (d * sc) * q - (dmin * m), so the values agree bit for bit. That
 * needs every operation rounded on its own: this file is compiled with
 * -ffp-contract=off (frontend/CMakeLists.txt), so that no multiply-add is
 * fused into one rounding where the compiler could.
 */
#include "gguf.h"
#include "numeric.h"

#include <string.h>

static float f16_at(const uint8_t *p) {
    uint16_t h;
    memcpy(&h, p, 2);
    return plan_f16_to_f32(h);
}

enum { QK = 32, QK_K = 256 };

/* Q8_0: f16 d, i8 q[32]. */
static void dequantize_q8_0(const uint8_t *block, float *y) {
    float d = f16_at(block);
    for (int j = 0; j < QK; j++)
        y[j] = (float)(int8_t)block[2 + j] * d;
}

/* Q4_0: f16 d, 16 bytes of nibbles; element j < 16 is the low nibble of
 * byte j, element j + 16 its high nibble; both offset by 8. */
static void dequantize_q4_0(const uint8_t *block, float *y) {
    float d = f16_at(block);
    const uint8_t *qs = block + 2;
    for (int j = 0; j < QK / 2; j++) {
        y[j] = d * (float)((qs[j] & 0x0f) - 8);
        y[j + QK / 2] = d * (float)((qs[j] >> 4) - 8);
    }
}

/* Q4_1: f16 d, f16 m, nibbles as Q4_0 without the offset. */
static void dequantize_q4_1(const uint8_t *block, float *y) {
    float d = f16_at(block), m = f16_at(block + 2);
    const uint8_t *qs = block + 4;
    for (int j = 0; j < QK / 2; j++) {
        y[j] = d * (float)(qs[j] & 0x0f) + m;
        y[j + QK / 2] = d * (float)(qs[j] >> 4) + m;
    }
}

/* The 6-bit scale and min of sub-block s (0..7) of a Q4_K/Q5_K block from
 * its 12 scale bytes: sub-blocks 0..3 take the low 6 bits of bytes s (scale)
 * and s + 4 (min); sub-blocks 4..7 take a nibble of byte s + 4 (low: scale,
 * high: min) and, as bits 4..5, the top two bits of bytes s - 4 (scale) and
 * s (min). */
static void k_scale_min(const uint8_t *scales, int s, unsigned *scale, unsigned *min) {
    if (s < 4) {
        *scale = scales[s] & 63u;
        *min = scales[s + 4] & 63u;
    } else {
        *scale = (scales[s + 4] & 0x0fu) | ((unsigned)(scales[s - 4] >> 6) << 4);
        *min = (unsigned)(scales[s + 4] >> 4) | ((unsigned)(scales[s] >> 6) << 4);
    }
}

/* Q4_K: f16 d, f16 dmin, 12 scale bytes, 128 bytes of nibbles. Sub-blocks
 * of 32: sub-block 2k holds the low nibbles of bytes 32k..32k+31, sub-block
 * 2k+1 their high nibbles. */
static void dequantize_q4_k(const uint8_t *block, float *y) {
    float d = f16_at(block), dmin = f16_at(block + 2);
    const uint8_t *scales = block + 4, *qs = block + 16;
    for (int s = 0; s < 8; s++) {
        unsigned scale, min;
        k_scale_min(scales, s, &scale, &min);
        float ds = d * (float)scale, dm = dmin * (float)min;
        const uint8_t *q = qs + 32 * (s / 2);
        int shift = 4 * (s % 2);
        for (int l = 0; l < 32; l++)
            y[32 * s + l] = ds * (float)((q[l] >> shift) & 0x0f) - dm;
    }
}

/* Q5_K: f16 d, f16 dmin, 12 scale bytes, qh[32], 128 bytes of nibbles (as
 * Q4_K); bit s of qh[l] is bit 4 of element l of sub-block s. */
static void dequantize_q5_k(const uint8_t *block, float *y) {
    float d = f16_at(block), dmin = f16_at(block + 2);
    const uint8_t *scales = block + 4, *qh = block + 16, *qs = block + 48;
    for (int s = 0; s < 8; s++) {
        unsigned scale, min;
        k_scale_min(scales, s, &scale, &min);
        float ds = d * (float)scale, dm = dmin * (float)min;
        const uint8_t *q = qs + 32 * (s / 2);
        int shift = 4 * (s % 2);
        for (int l = 0; l < 32; l++) {
            unsigned value = ((q[l] >> shift) & 0x0fu) | (((qh[l] >> s) & 1u) << 4);
            y[32 * s + l] = ds * (float)value - dm;
        }
    }
}

/* Q6_K: ql[128], qh[64], i8 scales[16], f16 d. Two halves of 128 values;
 * in half h, value 32 * k + l (k 0..3, l 0..31) has its low 4 bits in
 * ql[64 h + 32 (k % 2) + l] (low nibble for k < 2, high for k >= 2) and its
 * high 2 bits at bit 2k of qh[32 h + l]; it is offset by 32 and scaled by
 * d * scales[(128 h + 32 k + l) / 16]. */
static void dequantize_q6_k(const uint8_t *block, float *y) {
    const uint8_t *ql = block, *qh = block + 128, *scales = block + 192;
    float d = f16_at(block + 208);
    for (int h = 0; h < 2; h++)
        for (int k = 0; k < 4; k++)
            for (int l = 0; l < 32; l++) {
                int e = 128 * h + 32 * k + l;
                unsigned low = (ql[64 * h + 32 * (k % 2) + l] >> (4 * (k / 2))) & 0x0fu;
                unsigned high = (qh[32 * h + l] >> (2 * k)) & 3u;
                int q = (int)(low | (high << 4)) - 32;
                float ds = d * (float)(int8_t)scales[e / 16];
                y[e] = ds * (float)q;
            }
}

void gguf_dequantize(uint32_t type, const void *src, float *dst, uint64_t count) {
    const uint8_t *p = src;
    uint32_t block, block_bytes;
    if (!gguf_type_supported(type, &block, &block_bytes) || count % block)
        SMELT_DIE("gguf_dequantize of %llu values of type %u", (unsigned long long)count, type);
    uint64_t blocks = count / block;
    void (*block_fn)(const uint8_t *, float *) = NULL; /* a quantized type: one block at a time */
    switch ((gguf_type)type) {
    case GGUF_TYPE_F32: memcpy(dst, p, (size_t)count * 4); return;
    case GGUF_TYPE_F16:
        for (uint64_t i = 0; i < count; i++)
            dst[i] = f16_at(p + 2 * i);
        return;
    case GGUF_TYPE_BF16:
        for (uint64_t i = 0; i < count; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = plan_bf16_to_f32(h);
        }
        return;
    case GGUF_TYPE_Q8_0: block_fn = dequantize_q8_0; break;
    case GGUF_TYPE_Q4_0: block_fn = dequantize_q4_0; break;
    case GGUF_TYPE_Q4_1: block_fn = dequantize_q4_1; break;
    case GGUF_TYPE_Q4_K: block_fn = dequantize_q4_k; break;
    case GGUF_TYPE_Q5_K: block_fn = dequantize_q5_k; break;
    case GGUF_TYPE_Q6_K: block_fn = dequantize_q6_k; break;
    }
    if (!block_fn) SMELT_DIE("gguf_dequantize: type %u", type);
    for (uint64_t b = 0; b < blocks; b++)
        block_fn(p + b * block_bytes, dst + b * block);
}
