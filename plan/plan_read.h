/* plan_read.h - opening a plan file: mmap, validation, section access, and a
 * bounds-checked byte cursor for reading inside sections.
 *
 *   plan_file plan;
 *   char error[512];
 *   if (!plan_open("model.plan", &plan, error, sizeof error)) {
 *       fprintf(stderr, "smelt: error: %s\n", error);   // says what to do
 *       return 1;
 *   }
 *   const uint8_t *kernels; uint64_t size;
 *   if (plan_section(&plan, PLAN_SECTION_KERNELS, &kernels, &size)) ...
 *   plan_close(&plan);
 *
 * plan_open checks everything before it returns true: the magic, the format
 * version, the header checksum, the directory (every offset and size in the
 * file with overflow-safe arithmetic, aligned, non-overlapping, no duplicate
 * or unknown kinds), that padding between sections is zero, every section's
 * checksum and the content hash. After that every byte of the file has been
 * checked, but the *contents* of a section are still untrusted: decode them
 * with a plan_cursor, which never reads past the section's end.
 *
 * Cost: verifying reads every byte once (XXH64 and XXH3 together, many GB/s),
 * so opening a plan with 16 GB of weights takes a second or two.
 * A mapped plan must not be truncated by another process while open: the
 * kernel would then fault on access (SIGBUS); plans are replaced by rename,
 * never rewritten in place (plan/plan_write.c), so that does not happen.
 *
 * plan/ code: it includes nothing from the compiler or the runtime.
 */
#ifndef SMELT_PLAN_READ_H
#define SMELT_PLAN_READ_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "plan_format.h"

typedef struct plan_section_entry {
    uint32_t kind; /* plan_section_kind */
    uint32_t flags;
    uint64_t offset; /* from the start of the file */
    uint64_t size;
    uint64_t checksum; /* XXH64, verified */
} plan_section_entry;

typedef struct plan_file {
    const uint8_t *bytes; /* the whole file, read-only */
    size_t size;          /* bytes */
    bool mapped;          /* bytes is our mmap (else the caller's buffer) */
    uint32_t format_version;
    char smelt_version[PLAN_SMELT_VERSION_SIZE + 1]; /* NUL-terminated */
    uint64_t content_hash_low, content_hash_high;    /* XXH3-128, verified */
    uint32_t section_count;
    plan_section_entry sections[PLAN_SECTION_KIND_COUNT]; /* directory order */
} plan_file;

/* Maps `path` read-only and validates it. On failure returns false, leaves
 * *out closed and writes "PATH: what is wrong: what to do" into error. */
bool plan_open(const char *path, plan_file *out, char *error, size_t error_size);

/* The same checks on bytes already in memory (tests, fuzzing, embedding).
 * The plan points into `bytes`, which must outlive it; `name` is used in
 * messages (NULL: "plan"). */
bool plan_open_bytes(const void *bytes, size_t size, const char *name, plan_file *out, char *error,
                     size_t error_size);

/* Unmaps a plan from plan_open; harmless on a zeroed or closed plan_file. */
void plan_close(plan_file *plan);

/* The section of `kind`: true and its bytes, or false when the plan has none. */
bool plan_section(const plan_file *plan, plan_section_kind kind, const uint8_t **data, uint64_t *size);

/* "0123...ef": the content hash as 32 hex digits, high half first, into
 * hex[33]. */
void plan_content_hash_hex(const plan_file *plan, char hex[33]);

/* ---- Reading inside a section -------------------------------------------- */

/* A cursor over [start, end). Every read checks the bytes left first; the
 * first failed read makes the cursor failed, after which every read fails,
 * so a decoder may check once at the end of a group of reads. */
typedef struct plan_cursor {
    const uint8_t *start, *at, *end;
    bool failed;
    uint64_t failed_at; /* offset from start of the first failed read */
} plan_cursor;

void plan_cursor_init(plan_cursor *c, const uint8_t *data, uint64_t size);
static inline uint64_t plan_cursor_offset(const plan_cursor *c) { return (uint64_t)(c->at - c->start); }
static inline uint64_t plan_cursor_left(const plan_cursor *c) { return (uint64_t)(c->end - c->at); }
bool plan_cursor_u32(plan_cursor *c, uint32_t *out);
bool plan_cursor_u64(plan_cursor *c, uint64_t *out);
bool plan_cursor_i64(plan_cursor *c, int64_t *out);
/* `size` raw bytes; *out points into the section. */
bool plan_cursor_bytes(plan_cursor *c, uint64_t size, const uint8_t **out);
/* (u64 length, bytes) as a view; the length is checked against the end. */
bool plan_cursor_text(plan_cursor *c, plan_text *out);
bool plan_cursor_blob(plan_cursor *c, plan_blob *out);

/* ---- The kernel table (KERNELS section) --------------------------------- */

typedef struct plan_kernel_table {
    uint32_t count;
    plan_kernel *kernels; /* [count]; strings and binaries point into the section */
    void *storage;        /* the one allocation behind kernels, resources, binaries */
} plan_kernel_table;

/* Decodes a kernel table without copying strings or binaries: the table's
 * views point into `data`, which must outlive it. Refuses lengths and counts
 * that run past the end, launch rules with c < 1, empty names, unknown
 * binary kinds and trailing bytes, with a message into error. */
bool plan_kernel_table_decode(const uint8_t *data, uint64_t size, plan_kernel_table *out, char *error,
                              size_t error_size);
void plan_kernel_table_free(plan_kernel_table *table);

/* ceil((a * T + b) / c) into *out; false when it overflows int64 or is
 * negative, or when c < 1. */
bool plan_affine_eval(plan_affine rule, int64_t tokens, int64_t *out);

#endif
