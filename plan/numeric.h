/* numeric.h - bit-exact conversions between f32 and the narrow float formats.
 *
 * The checkpoint reader, the weight converter of the plan writer, the
 * runtime (weight binding, the host device's GEMMs, the simulator's tensor
 * cores) and the tests all need the same answers, so they come from here, the
 * one copy (smelt_kernel.h, which must stand alone, repeats the bf16 and f16
 * pairs and the f8e4m3 one bit for bit), written by hand on the bit patterns (no compiler _Float16, no
 * libm):
 *
 *   format     sign exp mant bias  largest finite  infinity  NaN
 *   f16         1    5   10   15   65504           yes       exp all ones, mant != 0
 *   bf16        1    8    7  127   ~3.39e38        yes       exp all ones, mant != 0
 *   f8e5m2      1    5    2   15   57344           yes       exp all ones, mant != 0
 *   f8e4m3      1    4    3    7   448             no        0x7f and 0xff only (OCP "fn")
 *
 * Widening (to f32) is exact for every input. Narrowing (from f32) rounds to
 * nearest, ties to even, keeps the sign of zero and of NaN and turns NaN
 * into a quiet NaN. f16, bf16 and f8e5m2 overflow to infinity as IEEE does;
 * f8e4m3 has no infinity, so it saturates to +-448 (the "satfinite" mode of
 * CUDA's __nv_cvt_float_to_fp8, what quantizers use after scaling).
 */
#ifndef SMELT_NUMERIC_H
#define SMELT_NUMERIC_H

#include <stddef.h>
#include <stdint.h>
#include <string.h>

static inline float plan_f32_from_bits(uint32_t bits) {
    float f;
    memcpy(&f, &bits, sizeof f);
    return f;
}

static inline uint32_t plan_f32_to_bits(float f) {
    uint32_t bits;
    memcpy(&bits, &f, sizeof bits);
    return bits;
}

/* ---- widening: exact -------------------------------------------------- */

static inline float plan_bf16_to_f32(uint16_t h) { return plan_f32_from_bits((uint32_t)h << 16); }

/* A narrow float with `exp_bits` exponent and `mant_bits` mantissa bits in
 * the low bits of `bits` (sign just above them) as f32. `has_inf`: the top
 * exponent means inf/NaN (IEEE style); otherwise only the all-ones pattern
 * is NaN and the top exponent holds ordinary numbers (f8e4m3fn). */
static inline float plan_small_float_to_f32(uint32_t bits, unsigned exp_bits, unsigned mant_bits,
                                            int has_inf) {
    uint32_t sign = (bits >> (exp_bits + mant_bits)) & 1u;
    uint32_t exp = (bits >> mant_bits) & ((1u << exp_bits) - 1);
    uint32_t mant = bits & ((1u << mant_bits) - 1);
    uint32_t top = (1u << exp_bits) - 1;
    int bias = (1 << (exp_bits - 1)) - 1;
    uint32_t out;
    if (has_inf && exp == top) {
        out = 0x7f800000u | (mant ? 0x400000u | (mant << (23 - mant_bits)) : 0);
    } else if (!has_inf && exp == top && mant == (1u << mant_bits) - 1) {
        out = 0x7fc00000u;
    } else if (exp == 0) {
        /* Subnormal: mant * 2^(1 - bias - mant_bits); scaling an integer of
         * at most 10 bits by a power of two is exact in f32. */
        float scale = plan_f32_from_bits((uint32_t)(127 - (bias - 1 + (int)mant_bits)) << 23);
        float magnitude = (float)mant * scale;
        return sign ? -magnitude : magnitude;
    } else {
        out = ((exp - (uint32_t)bias + 127u) << 23) | (mant << (23 - mant_bits));
    }
    return plan_f32_from_bits(out | (sign << 31));
}

static inline float plan_f16_to_f32(uint16_t h) { return plan_small_float_to_f32(h, 5, 10, 1); }
static inline float plan_f8e5m2_to_f32(uint8_t b) { return plan_small_float_to_f32(b, 5, 2, 1); }
static inline float plan_f8e4m3_to_f32(uint8_t b) { return plan_small_float_to_f32(b, 4, 3, 0); }

/* n halves widened into dst[n]: a weight's f16 scales for an f32 GEMM
 * epilogue (the cuda device's copy, the host device's product). */
static inline void plan_f16_row_to_f32(const uint16_t *src, float *dst, size_t n) {
    for (size_t i = 0; i < n; i++)
        dst[i] = plan_f16_to_f32(src[i]);
}
static inline void plan_bf16_row_to_f32(const uint16_t *src, float *dst, size_t n) {
    for (size_t i = 0; i < n; i++)
        dst[i] = plan_bf16_to_f32(src[i]);
}

/* ---- narrowing: round to nearest even ---------------------------------- */

static inline uint16_t plan_f32_to_bf16(float f) {
    uint32_t bits = plan_f32_to_bits(f);
    if ((bits & 0x7fffffffu) > 0x7f800000u) return (uint16_t)((bits >> 16) | 0x40u); /* quiet NaN */
    uint32_t round = 0x7fffu + ((bits >> 16) & 1u);
    return (uint16_t)((bits + round) >> 16);
}

/* `magnitude >> shift`, rounded to nearest, ties to even. shift in 1..31. */
static inline uint32_t plan_shift_right_rne(uint32_t magnitude, unsigned shift) {
    uint32_t kept = magnitude >> shift;
    uint32_t rest = magnitude & ((1u << shift) - 1);
    uint32_t half = 1u << (shift - 1);
    return kept + (rest > half || (rest == half && (kept & 1u)));
}

/* f32 to a narrow IEEE-style float (layout as in plan_small_float_to_f32).
 * `has_inf` 0 gives the f8e4m3fn behaviour: no infinity, saturation to the
 * largest finite value, NaN as the all-ones pattern. */
static inline uint32_t plan_f32_to_small_float(float f, unsigned exp_bits, unsigned mant_bits, int has_inf) {
    uint32_t bits = plan_f32_to_bits(f);
    uint32_t sign = (bits >> 31) << (exp_bits + mant_bits);
    uint32_t abs_bits = bits & 0x7fffffffu;
    uint32_t top = (1u << exp_bits) - 1;
    uint32_t mant_mask = (1u << mant_bits) - 1;
    /* Largest finite: IEEE style top-1 exponent, all-ones mantissa; fn style
     * top exponent, mantissa all ones but the last bit. */
    uint32_t max_finite =
        has_inf ? ((top - 1) << mant_bits) | mant_mask : (top << mant_bits) | (mant_mask - 1);
    uint32_t nan = has_inf ? (top << mant_bits) | (1u << (mant_bits - 1)) : (top << mant_bits) | mant_mask;
    uint32_t overflow = has_inf ? top << mant_bits : max_finite;
    if (abs_bits > 0x7f800000u) return sign | nan;
    if (abs_bits == 0x7f800000u) return sign | overflow;
    int bias = (1 << (exp_bits - 1)) - 1;
    int exp = (int)(abs_bits >> 23) - 127 + bias; /* biased exponent in the narrow format */
    uint32_t mant = (abs_bits & 0x7fffffu) | 0x800000u;
    uint32_t result;
    if (exp >= 1) {
        /* Normal: drop 23 - mant_bits bits; a carry out of the mantissa
         * correctly bumps the exponent. */
        if (exp > (int)top + 1) return sign | overflow;
        result = plan_shift_right_rne(mant, 23 - mant_bits) + ((uint32_t)(exp - 1) << mant_bits);
    } else {
        /* Subnormal (or zero): value * 2^(bias - 1 + mant_bits) as an integer. */
        unsigned shift = (unsigned)(23 - (int)mant_bits + 1 - exp);
        if ((abs_bits >> 23) == 0 || shift > 25) return sign; /* f32 subnormal or far below half the step */
        result = plan_shift_right_rne(mant, shift);
    }
    if (result > max_finite) return sign | overflow;
    return sign | result;
}

static inline uint16_t plan_f32_to_f16(float f) { return (uint16_t)plan_f32_to_small_float(f, 5, 10, 1); }
static inline uint8_t plan_f32_to_f8e5m2(float f) { return (uint8_t)plan_f32_to_small_float(f, 5, 2, 1); }
static inline uint8_t plan_f32_to_f8e4m3(float f) { return (uint8_t)plan_f32_to_small_float(f, 4, 3, 0); }

/* ---- rows with their own scale: an f8e4m3 KV cache -------------------- */

/* A row x[n] (one kv head's keys or values at one position) is stored as
 * the codes plan_f32_to_f8e4m3(x[i] / scale) with scale = absmax / 448
 * (absmax = the largest |x[i]|, by fmaxf, so a NaN element does not set it;
 * 1 for a row of zeros), and read back as plan_f8e4m3_to_f32(code) * scale.
 * The division and the product are single IEEE operations, so the
 * reference, the host simulator and a GPU (smelt_kernel.h repeats this)
 * store the same codes for the same row. */
static inline float plan_f8e4m3_row_scale(float absmax) { return absmax > 0.0f ? absmax / 448.0f : 1.0f; }

#endif
