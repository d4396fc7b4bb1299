/* plan_write.h - building a plan file in memory and writing it atomically.
 *
 *   plan_writer w;
 *   plan_writer_init(&w, SMELT_VERSION);
 *   plan_writer_add_section(&w, PLAN_SECTION_MANIFEST, json, strlen(json));
 *   plan_writer_add_kernels(&w, kernels, kernel_count);
 *   plan_writer_add_stream(&w, PLAN_SECTION_WEIGHT_DATA, write_weights, &ctx);
 *   if (!plan_write_file(&w, "model.plan", NULL, error, sizeof error)) ...
 *   plan_writer_free(&w);
 *
 * Sections given as bytes are copied into the writer. A streamed section
 * (weights: up to tens of GB) is produced while the file is written: the
 * callback pushes its bytes through plan_sink_write, which hashes them and
 * writes them out, so they never sit in memory twice.
 *
 * plan_write_file writes a temporary file in the destination's folder,
 * fsyncs it, renames it over the destination and fsyncs the folder: a reader
 * sees the old plan or the new one, never half of one. SIGINT or SIGTERM
 * during the write removes the temporary before the signal takes its usual
 * effect (plan_write.c, "Interruption"). Section checksums and
 * the content hash are computed as the bytes go out. The layout is in
 * plan/plan_format.h; plan/plan_read.c reads it back.
 *
 * Adding a section of an unknown kind or the same kind twice is a bug in the
 * compiler and dies; I/O failures are returned with a message.
 */
#ifndef SMELT_PLAN_PLAN_WRITE_H
#define SMELT_PLAN_PLAN_WRITE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "plan_format.h"

/* Where a streamed section's bytes go while the file is written. */
typedef struct plan_sink plan_sink;

/* Appends bytes to the section being streamed. False after an I/O error
 * (the writer reports it); the callback should then stop and return false. */
bool plan_sink_write(plan_sink *sink, const void *bytes, size_t size);

/* Records why the producer failed, for plan_write_file's message; the
 * callback then returns false. */
void plan_sink_fail(plan_sink *sink, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* Produces a streamed section: pushes all its bytes, returns true, or
 * calls plan_sink_fail and returns false. */
typedef bool (*plan_stream_fn)(void *context, plan_sink *sink);

typedef struct plan_writer_section {
    bool present;
    uint8_t *bytes; /* owned copy, when not streamed */
    uint64_t size;
    plan_stream_fn stream; /* when streamed */
    void *stream_context;
} plan_writer_section;

typedef struct plan_writer {
    char smelt_version[PLAN_SMELT_VERSION_SIZE];               /* NUL-padded */
    plan_writer_section sections[PLAN_SECTION_KIND_COUNT + 1]; /* by kind; [0] unused */
    bool out_of_memory; /* a section could not be copied: plan_write_file refuses */
} plan_writer;

/* What a written plan is; the same values `smelt inspect` prints. */
typedef struct plan_write_summary {
    uint64_t file_size;
    uint64_t content_hash_low, content_hash_high;
} plan_write_summary;

/* smelt_version longer than 16 bytes is cut to 16. */
void plan_writer_init(plan_writer *w, const char *smelt_version);
void plan_writer_free(plan_writer *w);

void plan_writer_add_section(plan_writer *w, plan_section_kind kind, const void *bytes, uint64_t size);
void plan_writer_add_stream(plan_writer *w, plan_section_kind kind, plan_stream_fn stream, void *context);
/* Encodes the kernel table (plan_format.h) as the KERNELS section. */
void plan_writer_add_kernels(plan_writer *w, const plan_kernel *kernels, uint32_t count);

/* Writes the plan to `path` atomically. summary may be NULL. On failure the
 * destination is untouched, no temporary file is left, and error says why. */
bool plan_write_file(const plan_writer *w, const char *path, plan_write_summary *summary, char *error,
                     size_t error_size);

/* ---- The kernel table encoding ------------------------------------------ */

/* A growable byte buffer (malloc; dies when memory runs out). */
typedef struct plan_buffer {
    uint8_t *data;
    size_t size, capacity;
    bool failed; /* out of memory: later puts do nothing */
} plan_buffer;

void plan_buffer_free(plan_buffer *b);

/* Appends the KERNELS encoding of kernels[count] to out. A kernel with an
 * empty name, a launch rule dividing by less than 1 or an unknown binary kind
 * is a compiler bug and dies; out of memory sets out->failed. */
void plan_kernels_encode(const plan_kernel *kernels, uint32_t count, plan_buffer *out);

#endif
