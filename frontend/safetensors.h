/* safetensors.h - reading and writing safetensors files, strictly checked.
 *
 * A safetensors file is an 8-byte little-endian header length N, N bytes of
 * UTF-8 JSON, then the data section:
 *
 *   {"__metadata__": {"format": "pt"},
 *    "model.embed_tokens.weight": {"dtype": "BF16", "shape": [32000, 4096],
 *                                  "data_offsets": [0, 262144000]}, ...}
 *
 * data_offsets are [begin, end) byte offsets into the data section. The
 * reader maps the file read-only and refuses it, naming the file and the
 * tensor, unless every entry is well-formed, every byte size equals
 * product(shape) * dtype size, and the entries tile the data section exactly
 * (no overlap, gap, trailing byte or offset past the end). It reports every
 * problem of the header, not just the first.
 *
 *   st_file f;
 *   if (!st_file_open("model.safetensors", &f, &diag)) return false;   // reported
 *   const st_tensor *t = st_file_find(&f, "model.norm.weight");
 *   ...                          // t->data points into the mapping: use memcpy
 *   st_file_close(&f);
 *
 * A checkpoint (checkpoint.h) is one such file or several shards.
 * Tensor data is little-endian, as the format defines; smelt assumes a
 * little-endian host. Data is not aligned in general (N and the offsets are
 * arbitrary), so read it with memcpy or the converters below.
 */
#ifndef SMELT_SAFETENSORS_H
#define SMELT_SAFETENSORS_H

#include "arena.h"
#include "diag.h"
#include "ir.h"

#include <stdbool.h>
#include <stdint.h>

/* X(ENUM, header name, bytes per element, float?) - the dtypes smelt reads.
 * Others the format knows (BOOL, F64, I16, U16, U32, U64, F8_E8M0, F4, ...)
 * are refused as unsupported. */
/* clang-format off */
#define ST_DTYPES(X)               \
    X(F32, "F32", 4, true)         \
    X(F16, "F16", 2, true)         \
    X(BF16, "BF16", 2, true)       \
    X(F8_E4M3, "F8_E4M3", 1, true) \
    X(F8_E5M2, "F8_E5M2", 1, true) \
    X(I8, "I8", 1, false)          \
    X(I32, "I32", 4, false)        \
    X(I64, "I64", 8, false)        \
    X(U8, "U8", 1, false)

typedef enum st_dtype {
#define X(e, name, size, is_float) ST_DTYPE_##e,
    ST_DTYPES(X)
#undef X
    ST_DTYPE_COUNT
    /* clang-format on */
} st_dtype;

const char *st_dtype_name(st_dtype t);
unsigned st_dtype_size(st_dtype t); /* bytes per element */
bool st_dtype_is_float(st_dtype t);
/* The IR dtype of the same bits; SMELT_DTYPE_UNKNOWN for U8. */
smelt_dtype st_dtype_to_ir(st_dtype t);
/* Looks up a header dtype name; false when smelt does not read it. */
bool st_dtype_from_name(const char *name, st_dtype *out);

enum {
    ST_MAX_RANK = 8,
    ST_MAX_HEADER_BYTES = 100 * 1024 * 1024, /* the reference implementation's cap */
};

typedef struct st_tensor {
    const char *name;
    st_dtype dtype;
    uint32_t rank;
    uint64_t shape[ST_MAX_RANK];
    const void *data;     /* into the mapping; unaligned; byte_size bytes (see "Truncation") */
    uint64_t byte_size;   /* product(shape) * st_dtype_size(dtype) */
    uint64_t offset;      /* of data within the data section */
    uint64_t file_offset; /* of data within the file */
    int fd;               /* of its st_file, open while the file is, for st_tensor_read_f32 */
    int32_t diag_file;    /* diag file id of its file */
    /* A tensor of a GGUF checkpoint (gguf_model.h): read through it; dtype
     * and byte_size then describe the values as read, data is NULL. */
    const struct fe_gguf_view *gguf;
} st_tensor;

typedef struct st_metadata_entry {
    const char *key, *value;
} st_metadata_entry;

typedef struct st_file {
    arena arena;        /* names, tables */
    const char *path;   /* as given to st_file_open */
    int32_t diag_file;  /* diag file id of path */
    void *map;          /* the whole file, read-only; NULL when closed */
    int fd;             /* the file, open while map is not NULL */
    uint64_t map_size;  /* bytes */
    st_tensor *tensors; /* in header order */
    uint32_t tensor_count;
    st_metadata_entry *metadata; /* "__metadata__", in header order */
    uint32_t metadata_count;
    uint32_t *slots;     /* open-addressing hash: tensor index + 1, 0 = empty */
    uint32_t slot_count; /* power of two */
} st_file;

/* Maps and checks `path`. Reports every problem found; on false nothing is
 * left open (st_file_close on *out is still allowed and does nothing). */
bool st_file_open(const char *path, st_file *out, diag_engine *d);
void st_file_close(st_file *f);

const st_tensor *st_file_find(const st_file *f, const char *name);
/* The value of `key` in "__metadata__", or NULL. */
const char *st_file_metadata(const st_file *f, const char *key);

/* Writes "[4, 8]" (as diagnostics print shapes) into buffer; returns it. */
enum { ST_SHAPE_TEXT_MAX = ST_MAX_RANK * 22 + 4 };
const char *st_format_shape(const uint64_t *shape, uint32_t rank, char *buffer, size_t size);

/* True when bytes[0, length) is well-formed UTF-8 (no overlong forms, no
 * surrogates, nothing above U+10FFFF). */
bool st_utf8_valid(const void *bytes, uint64_t length);

/* A file mapped read-only whole, with its descriptor kept open. */
typedef struct st_mapping {
    int fd;
    void *map;
    uint64_t size;
} st_mapping;

/* Maps `path` read-only. A FIFO or device must not block us, so the file is
 * opened non-blocking and must be a regular file ("expected a <format> file"
 * otherwise), of at least min_size bytes ("file is N bytes; <too_short>"
 * otherwise). Errors at `loc`. Shared by the safetensors and GGUF readers. */
bool st_map_file(const char *path, smelt_loc loc, const char *format, uint64_t min_size,
                 const char *too_short, st_mapping *out, diag_engine *d);

/* Reads `size` bytes at `offset` of file `fd` (pread, in chunks; EINTR
 * retried) into dst: false after an error naming `tensor` in file
 * `diag_file` when the read fails or the file ends early (truncated after it
 * was opened). Shared by the safetensors and GGUF readers. */
bool st_read_file_bytes(int fd, int32_t file_id, const char *tensor, void *dst, uint64_t size,
                        uint64_t offset, diag_engine *d);

/* FNV-1a of a NUL-terminated name, for the name tables. */
uint64_t st_name_hash(const char *name);

/* ---- writing (safetensors_write.c) ------------------------------------- */

typedef struct st_write_tensor {
    const char *name;
    st_dtype dtype;
    uint32_t rank;
    const uint64_t *shape; /* rank entries */
    const void *data;      /* product(shape) * dtype size bytes; NULL allowed when 0 */
} st_write_tensor;

/* Writes a safetensors file: header keys in the given order ("__metadata__"
 * first when metadata_json is not NULL; it must be a JSON object of strings),
 * header padded with spaces to a multiple of 8 bytes, data packed in the
 * given order. Atomic: the bytes go to `path.tmp.XXXXXX` in the same folder,
 * are fsync'd, then renamed over `path`. Reports and returns false on bad
 * tensors (duplicate or non-UTF-8 name, rank > 8, size overflow) or I/O
 * errors, leaving no temporary file behind. */
bool st_write_file(const char *path, const st_write_tensor *tensors, size_t count, const char *metadata_json,
                   diag_engine *d);

/* ---- converting to f32 -------------------------------------------------- */

/* Truncation. A file shortened by another process after st_file_open would
 * kill a reader of the mapping with SIGBUS. st_tensor_read_f32 therefore
 * reads tensor data with pread from the descriptor kept open, so that a
 * short file is an error, not a signal; everything that loads weights for a
 * run or a plan goes through it. t->data (the mapping) is for callers that
 * hold the file still, such as tests. */

/* Tensor t (a float dtype) as f32 into dst (byte_size / dtype size values).
 * False after an error naming the file and the tensor when its data can no
 * longer be read (the file was truncated after it was opened). */
bool st_tensor_read_f32(const st_tensor *t, float *dst, diag_engine *d);

/* Converts `count` elements of a float dtype at `src` (unaligned, little-
 * endian) to f32, exactly. Dies on a non-float dtype (callers check). */
void st_convert_to_f32(st_dtype dtype, const void *src, float *dst, uint64_t count);

#endif
