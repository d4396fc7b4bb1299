/* plan_format.h - the on-disk layout of a plan file, shared by the writer
 * (plan/plan_write.c, called by codegen) and the reader (plan/plan_read.c,
 * called by the runtime).
 *
 * plan/ owns the format so that both sides share it without depending on
 * each other: the runtime reads plans without any compiler code, and codegen
 * writes them without linking the runtime. Nothing in plan/ includes a
 * header from outside plan/.
 *
 * A plan is one little-endian file, made to be mmapped read-only:
 *
 *   [ header: 64 bytes ][ section directory: 32 bytes per section ]
 *   [ zero padding ][ section ][ zero padding ][ section ] ...
 *
 * Header (every field little-endian, read and written byte by byte):
 *
 *   offset size  field
 *        0    8  magic            "SMELTPLN"
 *        8    4  format_version   PLAN_FORMAT_VERSION; bytes 0..11 never move,
 *                                 so any smelt can say which version a plan has
 *       12    4  section_count    0..PLAN_SECTION_KIND_COUNT
 *       16   16  smelt_version    the writer's version, ASCII, NUL-padded
 *                                 (all 16 bytes may be used: no terminator then)
 *       32    8  file_size        total bytes of the file; less on disk = truncated
 *       40    8  content_hash_low   XXH3-128 of the sections (see below), low half
 *       48    8  content_hash_high  ... high half
 *       56    8  header_checksum  XXH64 (seed 0) of the header and the whole
 *                                 section directory, with these 8 bytes as zero
 *
 * Section directory entry i, at 64 + 32 * i:
 *
 *   offset size  field
 *        0    4  kind       plan_section_kind; unknown kinds are refused
 *        4    4  flags      no flags are defined yet: must be 0
 *        8    8  offset     from the start of the file; a multiple of the
 *                           kind's alignment (64, or 4096 for WEIGHT_DATA so
 *                           weights can be mapped and used in place)
 *       16    8  size       bytes
 *       24    8  checksum   XXH64 (seed 0) of the section's bytes
 *
 * The writer lays sections out after the directory in kind order, so equal
 * inputs give byte-identical plans. The reader requires that each kind
 * appears at most once, that sections lie after the directory and do not
 * overlap, and that every byte outside them (padding) is zero, so every byte
 * of the file is covered by a check.
 *
 * Content hash: XXH3-128 over, for each section in directory order, its bytes
 * followed by its kind (u32) and size (u64) (after, so that a streamed section
 * need not know its size in advance; read from the end, this is unambiguous).
 * It is what `smelt inspect` prints for a deployer to pin: it names the
 * plan's content, whatever smelt version wrote the header. It is printed
 * high half first, as xxhsum prints XXH128.
 *
 * Strings and blobs inside sections are (u64 length, bytes), not NUL-terminated.
 *
 * Kernel table (the KERNELS section):
 *
 *   u32 kernel_count
 *   kernel_count times:
 *     string name                 the extern "C" entry point, non-empty
 *     string family               emitter family, e.g. "rmsnorm"
 *     string ops                  the IR ops it implements, as text
 *     string source               CUDA C text (C-compatible subset, docs/design.md §4)
 *     6 x affine {i64 a, i64 b, i64 c}   grid x, y, z, then block x, y, z
 *     u64 dynamic_shared_bytes
 *     u32 param_count (<= PLAN_MAX_KERNEL_PARAMS), then per parameter, in
 *       argument order: u32 kind (0: a pointer, 1: the step's token count),
 *       affine extent (a pointer: the bytes the kernel may touch through it
 *       at T tokens; {0, 0, 1} otherwise), u32 writes (1: it stores through it)
 *     u32 resource_count, then per arch:
 *       string arch ("sm_90"), u32 registers, u64 shared_bytes,
 *       u64 stack_bytes, u64 spill_store_bytes, u64 spill_load_bytes
 *     u32 binary_count, then per binary:
 *       string arch, u32 kind (plan_binary_kind), blob bytes
 *
 * An affine rule gives ceil((a * T + b) / c) for T tokens in a step, c >= 1.
 */
#ifndef SMELT_PLAN_FORMAT_H
#define SMELT_PLAN_FORMAT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#define PLAN_MAGIC "SMELTPLN"
enum {
    PLAN_MAGIC_SIZE = 8,
    PLAN_FORMAT_VERSION = 2,
    PLAN_MAX_KERNEL_PARAMS = 32,
    PLAN_SMELT_VERSION_SIZE = 16,
    PLAN_HEADER_SIZE = 64,
    PLAN_DIRECTORY_ENTRY_SIZE = 32,
    PLAN_SECTION_ALIGNMENT = 64,
    PLAN_WEIGHT_ALIGNMENT = 4096,
};

/* Header field offsets (the table above). */
enum {
    PLAN_AT_MAGIC = 0,
    PLAN_AT_FORMAT_VERSION = 8,
    PLAN_AT_SECTION_COUNT = 12,
    PLAN_AT_SMELT_VERSION = 16,
    PLAN_AT_FILE_SIZE = 32,
    PLAN_AT_CONTENT_HASH_LOW = 40,
    PLAN_AT_CONTENT_HASH_HIGH = 48,
    PLAN_AT_HEADER_CHECKSUM = 56,
};

/* Directory entry field offsets, relative to the entry. */
enum {
    PLAN_ENTRY_AT_KIND = 0,
    PLAN_ENTRY_AT_FLAGS = 4,
    PLAN_ENTRY_AT_OFFSET = 8,
    PLAN_ENTRY_AT_SIZE = 16,
    PLAN_ENTRY_AT_CHECKSUM = 24,
};

/* X(NAME, value): every section kind, in the order the writer lays them out. */
// clang-format off
#define PLAN_SECTION_KINDS(X) \
    X(MANIFEST, 1)            \
    X(KERNELS, 2)             \
    X(HOST_KERNELS, 3)        \
    X(PROGRAM, 4)             \
    X(MEMORY, 5)              \
    X(WEIGHT_TABLE, 6)        \
    X(WEIGHT_DATA, 7)         \
    X(TOKENIZER, 8)
// clang-format on

typedef enum plan_section_kind {
#define PLAN_KIND_ENUM(name, value) PLAN_SECTION_##name = value,
    PLAN_SECTION_KINDS(PLAN_KIND_ENUM)
#undef PLAN_KIND_ENUM
} plan_section_kind;

enum { PLAN_SECTION_KIND_COUNT = 8 }; /* kinds are 1..PLAN_SECTION_KIND_COUNT */
#define PLAN_KIND_COUNT_CHECK(name, value) +1
_Static_assert(0 PLAN_SECTION_KINDS(PLAN_KIND_COUNT_CHECK) == PLAN_SECTION_KIND_COUNT,
               "PLAN_SECTION_KIND_COUNT must match PLAN_SECTION_KINDS");
#undef PLAN_KIND_COUNT_CHECK

static inline bool plan_section_kind_known(uint32_t kind) {
    return kind >= 1 && kind <= PLAN_SECTION_KIND_COUNT;
}

/* "KERNELS"; "UNKNOWN" for a kind this smelt does not know. */
static inline const char *plan_section_kind_name(uint32_t kind) {
    switch (kind) {
        // clang-format off
#define PLAN_KIND_NAME(name, value) case value: return #name;
        PLAN_SECTION_KINDS(PLAN_KIND_NAME)
#undef PLAN_KIND_NAME
        // clang-format on
    }
    return "UNKNOWN";
}

static inline uint64_t plan_section_alignment(uint32_t kind) {
    return kind == PLAN_SECTION_WEIGHT_DATA ? PLAN_WEIGHT_ALIGNMENT : PLAN_SECTION_ALIGNMENT;
}

typedef enum plan_binary_kind {
    PLAN_BINARY_CUBIN = 1, /* machine code for one sm_XY */
    PLAN_BINARY_PTX = 2,   /* PTX text, JIT-compiled by the driver */
} plan_binary_kind;

static inline const char *plan_binary_kind_name(uint32_t kind) {
    return kind == PLAN_BINARY_CUBIN ? "cubin" : kind == PLAN_BINARY_PTX ? "ptx" : "unknown";
}

/* Little-endian fields, byte by byte: independent of the host's byte order
 * and of alignment (mmapped data has no alignment promise inside sections). */
static inline void plan_put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline void plan_put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static inline uint32_t plan_get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 3; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}
static inline uint64_t plan_get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 7; i >= 0; i--)
        v = (v << 8) | p[i];
    return v;
}

/* ---- Kernel table, in memory ------------------------------------------- */

/* A byte string that is not NUL-terminated: on the decode side a view into
 * the mapped plan, on the encode side whatever the caller points at. */
typedef struct plan_text {
    const char *data;
    uint64_t length;
} plan_text;

static inline plan_text plan_text_from(const char *s) { return (plan_text){s, s ? strlen(s) : 0}; }

typedef struct plan_blob {
    const uint8_t *data;
    uint64_t size; /* bytes */
} plan_blob;

/* ceil((a * T + b) / c) for T tokens; c >= 1. A constant n is {0, n, 1}. */
typedef struct plan_affine {
    int64_t a, b, c;
} plan_affine;

typedef struct plan_launch_rule {
    plan_affine grid[3];  /* x, y, z: blocks */
    plan_affine block[3]; /* x, y, z: threads per block */
    uint64_t dynamic_shared_bytes;
} plan_launch_rule;

/* What a kernel's source touches through one of its parameters: a fact of
 * the code, declared beside it, which every launch of the kernel must match
 * (program_check_plan), so that no edit of the launch program alone can
 * make a kernel reach outside its buffers. */
typedef struct plan_kernel_param {
    uint32_t kind;      /* 0: a pointer, 1: the step's token count (prog_arg_kind) */
    plan_affine extent; /* a pointer: bytes it may touch at T tokens */
    uint32_t writes;    /* a pointer: 1 when the kernel stores through it */
} plan_kernel_param;

/* What ptxas reported for the kernel compiled for one architecture. */
typedef struct plan_kernel_resources {
    plan_text arch;             /* "sm_90" */
    uint32_t registers;         /* per thread */
    uint64_t shared_bytes;      /* static __shared__ per block */
    uint64_t stack_bytes;       /* per thread stack frame */
    uint64_t spill_store_bytes; /* per thread */
    uint64_t spill_load_bytes;  /* per thread */
} plan_kernel_resources;

typedef struct plan_kernel_binary {
    plan_text arch; /* "sm_90" for a cubin, "compute_90" or "sm_90" for PTX */
    uint32_t kind;  /* plan_binary_kind */
    plan_blob bytes;
} plan_kernel_binary;

typedef struct plan_kernel {
    plan_text name;   /* extern "C" entry point */
    plan_text family; /* emitter family */
    plan_text ops;    /* the IR ops it implements, as text */
    plan_text source; /* CUDA C (C-compatible subset) */
    plan_launch_rule launch;
    uint32_t param_count;
    plan_kernel_param params[PLAN_MAX_KERNEL_PARAMS];
    uint32_t resource_count;
    const plan_kernel_resources *resources; /* [resource_count] */
    uint32_t binary_count;
    const plan_kernel_binary *binaries; /* [binary_count] */
} plan_kernel;

#endif
