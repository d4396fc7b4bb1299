/* diag.c - printing located diagnostics with source line and caret. */
#include "diag.h"

#include "arena.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

enum {
    DIAG_DEFAULT_MAX_ERRORS = 20,
    DIAG_MAX_SOURCE_BYTES = 64 * 1024 * 1024, /* files larger are not shown */
    DIAG_LINE_WINDOW = 100,                   /* bytes of a long line shown around the caret */
};

void diag_init(diag_engine *d, FILE *out) {
    memset(d, 0, sizeof *d);
    d->out = out ? out : stderr;
    d->max_errors = DIAG_DEFAULT_MAX_ERRORS;
}

void diag_free(diag_engine *d) {
    for (uint32_t i = 0; i < d->file_count; i++) {
        free(d->files[i].path);
        free(d->files[i].text);
    }
    free(d->files);
    memset(d, 0, sizeof *d);
}

static char *copy_bytes(const char *s, size_t n) {
    char *p = malloc(n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

/* Out of memory here costs only the place of later messages: the file is
 * not registered (-1, which diagnostics print without a location), or its
 * text is not kept (no caret). */
static int32_t add_file(diag_engine *d, const char *path) {
    if (d->file_count == d->file_capacity) {
        uint32_t capacity = d->file_capacity ? d->file_capacity * 2 : 8;
        diag_file *files = realloc(d->files, capacity * sizeof *files);
        if (!files) return -1;
        d->files = files;
        d->file_capacity = capacity;
    }
    diag_file *f = &d->files[d->file_count];
    memset(f, 0, sizeof *f);
    f->path = copy_bytes(path, strlen(path));
    if (!f->path) return -1;
    return (int32_t)d->file_count++;
}

int32_t diag_add_source(diag_engine *d, const char *path, const char *text, size_t length) {
    int32_t id = add_file(d, path);
    if (id < 0) return id;
    diag_file *f = &d->files[id];
    f->text = copy_bytes(text, length);
    f->length = f->text ? length : 0;
    f->load_tried = true;
    return id;
}

int32_t diag_file_id(diag_engine *d, const char *path) {
    for (uint32_t i = 0; i < d->file_count; i++)
        if (strcmp(d->files[i].path, path) == 0) return (int32_t)i;
    return add_file(d, path);
}

const char *diag_file_path(const diag_engine *d, int32_t file) {
    if (file < 0 || (uint32_t)file >= d->file_count) return NULL;
    return d->files[file].path;
}

size_t diag_name_length(const char *s) {
    size_t n = strnlen(s, DIAG_NAME_MAX + 1);
    return n > DIAG_NAME_MAX ? DIAG_NAME_MAX : n;
}

static void load_text(diag_file *f) {
    if (f->load_tried) return;
    f->load_tried = true;
    FILE *fp = fopen(f->path, "rb");
    if (!fp) return;
    size_t capacity = 4096, length = 0;
    char *text = malloc(capacity);
    if (!text) {
        fclose(fp);
        return;
    }
    size_t n;
    while ((n = fread(text + length, 1, capacity - length, fp)) > 0) {
        length += n;
        if (length == capacity) {
            if (capacity >= DIAG_MAX_SOURCE_BYTES) {
                free(text);
                fclose(fp);
                return;
            }
            capacity *= 2;
            char *grown = realloc(text, capacity);
            if (!grown) {
                free(text);
                fclose(fp);
                return;
            }
            text = grown;
        }
    }
    fclose(fp);
    f->text = text;
    f->length = length;
}

/* Prints line `line` of f with a caret under byte column `col`.
 * Long lines are cut to a window around the column. */
static void print_caret(FILE *out, diag_file *f, uint32_t line, uint32_t col) {
    load_text(f);
    if (!f->text) return;
    const char *p = f->text, *end = f->text + f->length;
    for (uint32_t l = 1; l < line; l++) {
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        if (!nl) return;
        p = nl + 1;
    }
    const char *eol = memchr(p, '\n', (size_t)(end - p));
    if (!eol) eol = end;
    if (eol > p && eol[-1] == '\r') eol--;
    size_t length = (size_t)(eol - p);
    size_t caret = col > 0 ? col - 1 : 0;
    if (caret > length) caret = length;
    size_t start = 0;
    if (caret > DIAG_LINE_WINDOW / 2 && length > DIAG_LINE_WINDOW) start = caret - DIAG_LINE_WINDOW / 2;
    size_t stop = start + DIAG_LINE_WINDOW < length ? start + DIAG_LINE_WINDOW : length;
    const char *lead = start > 0 ? "..." : "";
    fprintf(out, "%5u | %s", line, lead);
    for (size_t i = start; i < stop; i++) {
        unsigned char c = (unsigned char)p[i];
        fputc(c == '\t' || c >= 0x20 ? c : '?', out);
    }
    fprintf(out, "%s\n      | %s", stop < length ? "..." : "", lead);
    if (col > 0) {
        for (size_t i = start; i < caret; i++)
            fputc(p[i] == '\t' ? '\t' : ' ', out);
        fputc('^', out);
    }
    fputc('\n', out);
}

void diag_report(diag_engine *d, diag_severity severity, smelt_loc loc, const char *fmt, ...) {
    if (d->stopped) return;
    if (severity == DIAG_ERROR) {
        if (d->max_errors && d->error_count >= d->max_errors) {
            fprintf(d->out, "smelt: error: too many errors (%u); stopping\n", d->max_errors);
            d->stopped = true;
            return;
        }
        d->error_count++;
    } else if (severity == DIAG_WARNING) {
        d->warning_count++;
    }
    static const char *const severity_names[] = {"error", "warning", "note"};
    diag_file *f = (loc.file >= 0 && (uint32_t)loc.file < d->file_count) ? &d->files[loc.file] : NULL;
    if (f && loc.line > 0 && loc.col > 0)
        fprintf(d->out, "%s:%u:%u: ", f->path, loc.line, loc.col);
    else if (f && loc.line > 0)
        fprintf(d->out, "%s:%u: ", f->path, loc.line);
    else if (f)
        fprintf(d->out, "%s: ", f->path);
    else
        fprintf(d->out, "smelt: ");
    fprintf(d->out, "%s: ", severity_names[severity]);
    va_list ap;
    va_start(ap, fmt);
    vfprintf(d->out, fmt, ap);
    va_end(ap);
    fputc('\n', d->out);
    if (f && loc.line > 0) print_caret(d->out, f, loc.line, loc.col);
}
