/* diag.h - diagnostics: located errors with the source line and a caret.
 *
 *   examples/llama.smelt:12:9: error: unknown op 'matmull'
 *      12 |   let q = matmull(x, wq)
 *         |           ^
 *
 * Every part of the compiler reports bad input here and returns false; it
 * never exits. The engine keeps going until `max_errors` errors (default 20)
 * have been reported, then prints one "too many errors" line and swallows
 * the rest; long-running loops should poll diag_should_stop().
 */
#ifndef SMELT_DIAG_H
#define SMELT_DIAG_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* A position in a source file known to the diag engine.
 * file < 0: no file; line == 0: whole file (no caret); col == 0: whole line. */
typedef struct smelt_loc {
    int32_t file;
    uint32_t line; /* 1-based */
    uint32_t col;  /* 1-based, in bytes */
} smelt_loc;

#define SMELT_NO_LOC ((smelt_loc){-1, 0, 0})

typedef enum diag_severity { DIAG_ERROR, DIAG_WARNING, DIAG_NOTE } diag_severity;

typedef struct diag_file {
    char *path;
    char *text; /* owned copy, or NULL when not (yet) loaded */
    size_t length;
    bool load_tried;
} diag_file;

typedef struct diag_engine {
    diag_file *files;
    uint32_t file_count, file_capacity;
    FILE *out; /* where diagnostics go; stderr by default */
    unsigned error_count;
    unsigned warning_count;
    unsigned max_errors; /* 0 = unlimited */
    bool stopped;        /* max_errors reached */
} diag_engine;

void diag_init(diag_engine *d, FILE *out);
void diag_free(diag_engine *d);

/* Registers a file whose text is already in memory (copied). */
int32_t diag_add_source(diag_engine *d, const char *path, const char *text, size_t length);
/* Finds or registers a file by path; its text is read from disk on demand
 * when a caret is printed. */
int32_t diag_file_id(diag_engine *d, const char *path);
const char *diag_file_path(const diag_engine *d, int32_t file);

void diag_report(diag_engine *d, diag_severity severity, smelt_loc loc, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
#define diag_error(d, loc, ...) diag_report((d), DIAG_ERROR, (loc), __VA_ARGS__)
#define diag_warning(d, loc, ...) diag_report((d), DIAG_WARNING, (loc), __VA_ARGS__)
#define diag_note(d, loc, ...) diag_report((d), DIAG_NOTE, (loc), __VA_ARGS__)

static inline bool diag_has_errors(const diag_engine *d) { return d->error_count > 0; }
static inline bool diag_should_stop(const diag_engine *d) { return d->stopped; }

/* Names in messages are cut to this many bytes so that a 1 MB identifier
 * gives a readable one-line error. */
enum { DIAG_NAME_MAX = 64 };
/* "%.*s%s" arguments that print at most DIAG_NAME_MAX bytes of s, then "...". */
#define DIAG_NAME(s) (int)diag_name_length(s), (s), (diag_name_length(s) < __builtin_strlen(s) ? "..." : "")
size_t diag_name_length(const char *s);

#endif
