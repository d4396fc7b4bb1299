/* gguf.h - reading GGUF files (llama.cpp's format, versions 2 and 3),
 * strictly checked, and dequantizing their tensors to f32.
 *
 * A GGUF file, all little-endian:
 *
 *   "GGUF"  u32 version  u64 tensor_count  u64 kv_count
 *   kv_count x { string key, u32 value type, value }          metadata
 *   tensor_count x { string name, u32 n_dims, u64 ne[n_dims],
 *                    u32 ggml type, u64 offset }              tensor infos
 *   padding to `general.alignment` (default 32)
 *   data: each tensor at data start + offset (a multiple of the alignment)
 *
 * A string is a u64 byte length and the bytes (no NUL). A value is one of
 * the 13 value types below; an array is a u32 element type, a u64 count and
 * the elements. ne[0] is the innermost (contiguous) dim: a Hugging Face
 * weight of shape [rows, cols] is stored with ne = {cols, rows}. Quantized
 * types pack ne[0] in blocks (32 or 256 values in a fixed number of bytes).
 *
 * The reader maps the file read-only and refuses it, with the byte offset
 * of the problem, unless: the magic and version (2 or 3) are right; every
 * count, string length and array fits in the bytes that remain (so a huge
 * count is refused before anything is allocated for it); keys and tensor
 * names are non-empty UTF-8, keys unique, tensor names unique and shorter
 * than 64 bytes (ggml's limit); every value type is known, booleans are 0 or
 * 1, arrays of arrays are refused; general.alignment, when present, is a u32
 * power of two; every tensor has 1..4 dims whose element count fits in 63
 * bits, a type smelt can dequantize (gguf_type_supported), ne[0] a multiple
 * of its block, an aligned offset, and lies inside the file without
 * overlapping another tensor. Everything the header holds is copied out of
 * the mapping while it is checked, and tensor data is read with pread from
 * the descriptor kept open, as st_tensor_read_f32 does: a file truncated
 * after opening is an error, not SIGBUS.
 *
 *   gguf_file f;
 *   if (!gguf_file_open("model.gguf", &f, &diag)) return false;   // reported
 *   const gguf_kv *kv = gguf_file_find_kv(&f, "llama.block_count");
 *   int64_t layers;
 *   if (kv && gguf_kv_int(kv, &layers)) ...
 *   const gguf_tensor *t = gguf_file_find(&f, "blk.0.attn_q.weight");
 *   float *w = malloc(t->element_count * sizeof *w);
 *   gguf_tensor_read_f32(&f, t, w, 0, t->element_count, &diag);
 *   gguf_file_close(&f);
 *
 * How GGUF models become smelt weights and params is gguf_model.c's
 * (gguf_model.h); this file knows nothing of architectures.
 */
#ifndef SMELT_GGUF_H
#define SMELT_GGUF_H

#include "arena.h"
#include "diag.h"

#include <stdbool.h>
#include <stdint.h>

/* The metadata value types, numbered as the format numbers them. */
typedef enum gguf_value_type {
    GGUF_VALUE_U8 = 0,
    GGUF_VALUE_I8 = 1,
    GGUF_VALUE_U16 = 2,
    GGUF_VALUE_I16 = 3,
    GGUF_VALUE_U32 = 4,
    GGUF_VALUE_I32 = 5,
    GGUF_VALUE_F32 = 6,
    GGUF_VALUE_BOOL = 7,
    GGUF_VALUE_STRING = 8,
    GGUF_VALUE_ARRAY = 9,
    GGUF_VALUE_U64 = 10,
    GGUF_VALUE_I64 = 11,
    GGUF_VALUE_F64 = 12,
    GGUF_VALUE_TYPE_COUNT
} gguf_value_type;

const char *gguf_value_type_name(gguf_value_type t); /* "u32", "string", "array", ... */

/* X(ENUM, ggml type id, values per block, bytes per block) - the tensor
 * types smelt dequantizes. Layouts (bytes of one block, in order; f16 and
 * i8 little-endian, q = the quantized value of element j):
 *   F32, F16, BF16  one value
 *   Q8_0   f16 d, i8 q[32]:                         x = d * q
 *   Q4_0   f16 d, u8 nibbles[16]:                   x = d * (q - 8)
 *   Q4_1   f16 d, f16 m, u8 nibbles[16]:            x = d * q + m
 *          (element j < 16 in the low nibble of byte j, j >= 16 in the high
 *          nibble of byte j - 16)
 *   Q4_K   f16 d, f16 dmin, u8 scales[12], u8 nibbles[128]: 8 sub-blocks of
 *          32 with 6-bit scale sc and min m: x = (d * sc) * q - (dmin * m)
 *   Q5_K   as Q4_K with u8 qh[32] before the nibbles: bit s of qh[l] is the
 *          fifth bit of element l of sub-block s
 *   Q6_K   u8 ql[128], u8 qh[64], i8 scales[16], f16 d: 16 sub-blocks of
 *          16, x = (d * scale) * (q - 32), q = 4 low bits | 2 high bits << 4
 * (gguf_quants.c spells out the bit positions.) */
/* clang-format off */
#define GGUF_TENSOR_TYPES(X)   \
    X(F32, 0, 1, 4)            \
    X(F16, 1, 1, 2)            \
    X(Q4_0, 2, 32, 18)         \
    X(Q4_1, 3, 32, 20)         \
    X(Q8_0, 8, 32, 34)         \
    X(Q4_K, 12, 256, 144)      \
    X(Q5_K, 13, 256, 176)      \
    X(Q6_K, 14, 256, 210)      \
    X(BF16, 30, 1, 2)
/* clang-format on */

typedef enum gguf_type {
#define X(e, id, block, bytes) GGUF_TYPE_##e = id,
    GGUF_TENSOR_TYPES(X)
#undef X
} gguf_type;

/* The name of ggml type `id` as llama.cpp prints it ("Q2_K"), for the types
 * smelt reads and the others it knows of; "unknown" otherwise. */
const char *gguf_type_name(uint32_t id);
/* True when smelt dequantizes type `id`; then *block and *block_bytes (each
 * may be NULL) are its values and bytes per block. */
bool gguf_type_supported(uint32_t id, uint32_t *block, uint32_t *block_bytes);

/* Dequantizes `count` values (a multiple of the type's block) of a supported
 * type from `src` (unaligned, count / block blocks) to f32 in `dst`, with
 * the arithmetic of gguf-py's gguf.quants.dequantize (the same f32
 * operations in the same order, so the results are bit for bit the same).
 * Dies on an unsupported type or a partial block (callers check). */
void gguf_dequantize(uint32_t type, const void *src, float *dst, uint64_t count);

enum {
    GGUF_MAX_DIMS = 4,
    GGUF_MAX_NAME = 64, /* bytes of a tensor name, NUL included (ggml's GGML_MAX_NAME) */
    GGUF_DEFAULT_ALIGNMENT = 32,
    GGUF_MAX_COUNT = 1u << 28, /* metadata entries, tensors: far beyond any model's */
};

/* One metadata entry. Scalars are held by value; strings (and the elements
 * of arrays) are copies in the file's arena, so they outlive the mapping. */
typedef struct gguf_kv {
    const char *key;
    gguf_value_type type;
    gguf_value_type element_type; /* of an array; else = type */
    uint64_t count;               /* elements of an array; 1 for a scalar */
    uint64_t offset;              /* file offset of the entry (its key's length) */
    union {
        uint64_t u; /* U8, U16, U32, U64, BOOL */
        int64_t i;  /* I8, I16, I32, I64 */
        double f;   /* F32, F64 */
    } scalar;
    const char *string;     /* STRING: NUL-terminated copy */
    uint64_t string_length; /* bytes, without the NUL (a string may hold NULs) */
    const void *elements;   /* numeric ARRAY: count little-endian elements */
    const char **strings;   /* STRING ARRAY: count NUL-terminated copies */
    const uint64_t *string_lengths;
} gguf_kv;

/* A scalar of any integer type (or bool) as int64; false for other types and
 * for a u64 above INT64_MAX. */
bool gguf_kv_int(const gguf_kv *kv, int64_t *out);
/* A scalar F32/F64 (or integer) as a double; false for other types. */
bool gguf_kv_float(const gguf_kv *kv, double *out);
/* Element i of a numeric array as int64 / double; false when out of range
 * or not convertible. */
bool gguf_kv_array_int(const gguf_kv *kv, uint64_t i, int64_t *out);
/* Writes the value as messages show it ("42", "1e-05", "'linear'", "an
 * array of 3 u32") into buffer; returns it. */
const char *gguf_kv_text(const gguf_kv *kv, char *buffer, size_t size);

typedef struct gguf_tensor {
    const char *name;
    uint32_t type; /* ggml type id; gguf_type_supported(type) holds */
    uint32_t rank;
    uint64_t ne[GGUF_MAX_DIMS]; /* ne[0] innermost; 1 past rank */
    uint64_t element_count;
    uint64_t byte_size;   /* bytes of its data */
    uint64_t offset;      /* of its data within the data section */
    uint64_t file_offset; /* of its data within the file */
    uint64_t info_offset; /* of its tensor-info entry within the file */
    const void *data;     /* into the mapping (tests, fuzzing); readers use gguf_tensor_read_f32 */
} gguf_tensor;

typedef struct gguf_file {
    arena arena;
    const char *path;
    int32_t diag_file;
    void *map; /* the whole file, read-only; NULL when closed */
    int fd;    /* open while map is not NULL */
    uint64_t map_size;
    uint32_t version;
    uint32_t alignment;
    uint64_t data_offset; /* file offset of the data section */
    gguf_kv *kvs;         /* in file order */
    uint32_t kv_count;
    gguf_tensor *tensors; /* in file order */
    uint32_t tensor_count;
    /* open-addressing hashes of keys and tensor names: index + 1, 0 = empty */
    uint32_t *kv_slots, *tensor_slots;
    uint32_t kv_slot_count, tensor_slot_count; /* powers of two */
} gguf_file;

/* True when `path` is a regular file that starts with the magic "GGUF". */
bool gguf_is_file(const char *path);

/* Maps and checks `path`. Reports the problem (with its byte offset); on
 * false nothing is left open (gguf_file_close on *out is still allowed). */
bool gguf_file_open(const char *path, gguf_file *out, diag_engine *d);
void gguf_file_close(gguf_file *f);

const gguf_kv *gguf_file_find_kv(const gguf_file *f, const char *key);
const gguf_tensor *gguf_file_find(const gguf_file *f, const char *name);

/* Values [first, first + count) of tensor t (in its flat order, ne[0]
 * fastest) as f32 into dst; first and count must be multiples of the
 * type's block (dies otherwise). Reads with pread: false after an error
 * naming the file and the tensor when the file was truncated after it was
 * opened. */
bool gguf_tensor_read_f32(const gguf_file *f, const gguf_tensor *t, float *dst, uint64_t first,
                          uint64_t count, diag_engine *d);

#endif
