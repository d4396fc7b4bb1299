/* smelt_dtype.h - the one dtype enum of smelt: the IR's value types, the
 * plan format's encoded dtypes and the public API (smelt.h) all use it.
 *
 * Every dtype has one size rule, in bits: i4 is 4 bits, packed two to a
 * byte (element 2k in the low nibble), so the bytes of n elements are
 * ceil(n * bits / 8). Nothing else in smelt sizes a tensor.
 *
 * The values are encoded in plans (one byte): append new dtypes at the end
 * and never renumber one.
 *
 * This header depends on nothing; plan/, the compiler and the runtime all
 * include it.
 */
#ifndef SMELT_DTYPE_H
#define SMELT_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

/* X(ENUM, name, bits, is_float) */
#define SMELT_DTYPES(X)                                                                                      \
    X(F32, "f32", 32, true)                                                                                  \
    X(F16, "f16", 16, true)                                                                                  \
    X(BF16, "bf16", 16, true)                                                                                \
    X(F8E4M3, "f8e4m3", 8, true)                                                                             \
    X(F8E5M2, "f8e5m2", 8, true)                                                                             \
    X(I8, "i8", 8, false)                                                                                    \
    X(I4, "i4", 4, false)                                                                                    \
    X(I32, "i32", 32, false)                                                                                 \
    X(I64, "i64", 64, false)

typedef enum smelt_dtype {
    SMELT_DTYPE_UNKNOWN = 0, /* not known yet (a type before infer-shapes); prints as `?` */
#define SMELT_DTYPE_ENUM(e, name, bits, is_float) SMELT_DTYPE_##e,
    SMELT_DTYPES(SMELT_DTYPE_ENUM)
#undef SMELT_DTYPE_ENUM
        SMELT_DTYPE_COUNT
} smelt_dtype;

/* "bf16"; "?" for SMELT_DTYPE_UNKNOWN or a value that is no dtype. */
static inline const char *smelt_dtype_name(smelt_dtype t) {
    switch (t) {
#define SMELT_DTYPE_NAME(e, name, bits, is_float)                                                            \
    case SMELT_DTYPE_##e: return name;
        SMELT_DTYPES(SMELT_DTYPE_NAME)
#undef SMELT_DTYPE_NAME
    default: return "?";
    }
}

/* Bits of one element; 0 for SMELT_DTYPE_UNKNOWN or a value that is no dtype. */
static inline unsigned smelt_dtype_bits(smelt_dtype t) {
    switch (t) {
#define SMELT_DTYPE_BITS(e, name, bits, is_float)                                                            \
    case SMELT_DTYPE_##e: return bits;
        SMELT_DTYPES(SMELT_DTYPE_BITS)
#undef SMELT_DTYPE_BITS
    default: return 0;
    }
}

static inline bool smelt_dtype_is_float(smelt_dtype t) {
    switch (t) {
#define SMELT_DTYPE_FLOAT(e, name, bits, is_float)                                                           \
    case SMELT_DTYPE_##e: return is_float;
        SMELT_DTYPES(SMELT_DTYPE_FLOAT)
#undef SMELT_DTYPE_FLOAT
    default: return false;
    }
}

/* SMELT_DTYPE_UNKNOWN when `name` (of `length` bytes, not terminated) is no dtype. */
static inline smelt_dtype smelt_dtype_from_name(const char *name, size_t length) {
    for (int t = 1; t < SMELT_DTYPE_COUNT; t++) {
        const char *n = smelt_dtype_name((smelt_dtype)t);
        if (strlen(n) == length && memcmp(n, name, length) == 0) return (smelt_dtype)t;
    }
    return SMELT_DTYPE_UNKNOWN;
}

/* Bytes of one element for a dtype of whole bytes; 0 for i4 (and unknown):
 * a caller that needs it for a sub-byte dtype has a bug. */
static inline unsigned smelt_dtype_element_bytes(smelt_dtype t) {
    unsigned bits = smelt_dtype_bits(t);
    return bits % 8 == 0 ? bits / 8 : 0;
}

/* Bytes that `elements` elements of `t` take (sub-byte dtypes packed,
 * rounded up to whole bytes); false when t is unknown or on overflow. */
static inline bool smelt_dtype_storage_bytes(smelt_dtype t, uint64_t elements, uint64_t *bytes) {
    uint64_t bits = smelt_dtype_bits(t), total;
    if (bits == 0 || __builtin_mul_overflow(elements, bits, &total)) return false;
    *bytes = total / 8 + (total % 8 != 0);
    return true;
}

#endif
