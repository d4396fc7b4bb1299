/* safetensors_write.c - writing a safetensors file atomically (contract in
 * safetensors.h).
 *
 * The header is written by hand so that keys keep the caller's order and the
 * text matches what the reference implementation writes: compact JSON,
 * "__metadata__" first, then space padding to a multiple of 8 bytes so that
 * the data section starts aligned. The whole file goes to a temporary file
 * in the target folder, is fsync'd and renamed over the target, so a reader
 * sees the old file or the new one, never half of one.
 */
#include "safetensors.h"
#include "json_memory.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- checking the tensors --------------------------------------------------- */

static int compare_names(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Byte sizes of every tensor into `sizes`; reports every bad tensor. */
static bool check_tensors(const st_write_tensor *tensors, size_t count, uint64_t *sizes, smelt_loc loc,
                          diag_engine *d) {
    bool ok = true;
    for (size_t i = 0; i < count && !diag_should_stop(d); i++) {
        const st_write_tensor *t = &tensors[i];
        const char *name = t->name ? t->name : "";
        if (!t->name || !st_utf8_valid(t->name, strlen(t->name))) {
            diag_error(d, loc, "tensor %zu: the name is %s", i, t->name ? "not valid UTF-8" : "missing");
            ok = false;
            continue;
        }
        if (strcmp(name, "__metadata__") == 0) {
            diag_error(d, loc, "tensor %zu: '__metadata__' is reserved and cannot name a tensor", i);
            ok = false;
        }
        if ((unsigned)t->dtype >= ST_DTYPE_COUNT) {
            diag_error(d, loc, "tensor '%.*s%s': invalid dtype %d", DIAG_NAME(name), (int)t->dtype);
            ok = false;
            continue;
        }
        if (t->rank > ST_MAX_RANK || (t->rank && !t->shape)) {
            diag_error(d, loc, "tensor '%.*s%s': rank %u; expected a shape of at most %d dims",
                       DIAG_NAME(name), t->rank, ST_MAX_RANK);
            ok = false;
            continue;
        }
        uint64_t bytes = st_dtype_size(t->dtype);
        bool overflow = false;
        for (uint32_t k = 0; k < t->rank; k++)
            overflow |= size_mul_overflow(bytes, t->shape[k], &bytes) != 0;
        if (overflow) {
            diag_error(d, loc, "tensor '%.*s%s': the byte size overflows 64 bits", DIAG_NAME(name));
            ok = false;
            continue;
        }
        if (bytes && !t->data) {
            diag_error(d, loc, "tensor '%.*s%s': %llu bytes of data expected, found none", DIAG_NAME(name),
                       (unsigned long long)bytes);
            ok = false;
        }
        sizes[i] = bytes;
    }
    if (!ok || count < 2) return ok;
    const char **names = malloc(count * sizeof *names);
    if (!names) {
        diag_error(d, loc, "out of memory sorting %zu tensor names", count);
        return false;
    }
    for (size_t i = 0; i < count; i++)
        names[i] = tensors[i].name;
    qsort(names, count, sizeof *names, compare_names);
    for (size_t i = 1; i < count; i++)
        if (strcmp(names[i - 1], names[i]) == 0 && (i < 2 || strcmp(names[i - 2], names[i]) != 0)) {
            diag_error(d, loc, "tensor '%.*s%s' is given more than once", DIAG_NAME(names[i]));
            ok = false;
        }
    free(names);
    return ok;
}

/* ---- the header text ------------------------------------------------------------ */

/* A growing text buffer (malloc'd; the header can be megabytes). Out of
 * memory is sticky: later appends do nothing and `failed` is reported. */
typedef struct st_text {
    char *bytes;
    size_t length, capacity;
    bool failed;
} st_text;

static void text_append(st_text *t, const char *s, size_t n) {
    if (t->failed) return;
    if (t->capacity - t->length <= n) {
        size_t capacity = t->capacity ? t->capacity : 4096;
        while (capacity - t->length <= n) {
            if (capacity > SIZE_MAX / 2) SMELT_DIE("safetensors header too large");
            capacity *= 2;
        }
        char *grown = realloc(t->bytes, capacity);
        if (!grown) {
            t->failed = true;
            return;
        }
        t->bytes = grown;
        t->capacity = capacity;
    }
    memcpy(t->bytes + t->length, s, n);
    t->length += n;
    t->bytes[t->length] = '\0';
}

static void text_printf(st_text *t, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
static void text_printf(st_text *t, const char *fmt, ...) {
    char buffer[128];
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(buffer, sizeof buffer, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= sizeof buffer) SMELT_DIE("text_printf of %d bytes", n);
    text_append(t, buffer, (size_t)n);
}

/* A JSON string literal: quotes, backslashes and control characters escaped. */
static void text_json_string(st_text *t, const char *s) {
    text_append(t, "\"", 1);
    for (const char *p = s; *p; p++) {
        unsigned char c = (unsigned char)*p;
        if (c == '"' || c == '\\') {
            char escaped[2] = {'\\', (char)c};
            text_append(t, escaped, 2);
        } else if (c < 0x20) {
            text_printf(t, "\\u%04x", c);
        } else {
            text_append(t, p, 1);
        }
    }
    text_append(t, "\"", 1);
}

/* "__metadata__" from the caller's JSON text, which must be an object of
 * strings; written compactly in its own key order. */
static bool append_metadata(st_text *t, const char *metadata_json, smelt_loc loc, diag_engine *d) {
    json_error_t error = {0}; /* jansson leaves its code byte unset on success */
    fe_json_memory_begin();
    json_t *root = json_loads(metadata_json, JSON_REJECT_DUPLICATES, &error);
    if (fe_json_out_of_memory(&error)) {
        if (root) json_decref(root);
        diag_error(d, loc, "out of memory reading the metadata");
        return false;
    }
    if (!root) {
        diag_error(d, loc, "metadata is not valid JSON: %s", error.text);
        return false;
    }
    if (!json_is_object(root)) {
        diag_error(d, loc, "metadata must be a JSON object of strings, found another JSON value");
        json_decref(root);
        return false;
    }
    bool ok = true, first = true;
    const char *key;
    json_t *value;
    text_append(t, "\"__metadata__\":{", 16);
    json_object_foreach(root, key, value) {
        if (!json_is_string(value)) {
            diag_error(d, loc, "metadata must be a JSON object of strings; '%.*s%s' is not a string",
                       DIAG_NAME(key));
            ok = false;
            continue;
        }
        if (!first) text_append(t, ",", 1);
        first = false;
        text_json_string(t, key);
        text_append(t, ":", 1);
        text_json_string(t, json_string_value(value));
    }
    text_append(t, "}", 1);
    json_decref(root);
    return ok;
}

static void append_tensor(st_text *t, const st_write_tensor *tensor, uint64_t begin, uint64_t end) {
    text_json_string(t, tensor->name);
    text_printf(t, ":{\"dtype\":\"%s\",\"shape\":[", st_dtype_name(tensor->dtype));
    for (uint32_t k = 0; k < tensor->rank; k++)
        text_printf(t, "%s%llu", k ? "," : "", (unsigned long long)tensor->shape[k]);
    text_printf(t, "],\"data_offsets\":[%llu,%llu]}", (unsigned long long)begin, (unsigned long long)end);
}

/* ---- the file ---------------------------------------------------------------------- */

static bool write_all(int fd, const void *bytes, uint64_t length) {
    const unsigned char *p = bytes;
    while (length > 0) {
        size_t chunk = length > (1u << 30) ? (1u << 30) : (size_t)length;
        ssize_t n = write(fd, p, chunk);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        p += n;
        length -= (uint64_t)n;
    }
    return true;
}

/* Makes the rename itself durable. Best effort: a folder that cannot be
 * opened or synced (some file systems) leaves a correct, just less durable,
 * result, so failures here are not errors. */
static void sync_folder_of(const char *path) {
    const char *slash = strrchr(path, '/');
    char *folder = slash ? strndup(path, (size_t)(slash - path) + 1) : strdup(".");
    if (!folder) return; /* best effort, as above */
    int fd = open(folder, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd >= 0) {
        (void)fsync(fd);
        close(fd);
    }
    free(folder);
}

/* Writes header and data to a temporary file beside `path`, then renames. */
static bool write_atomically(const char *path, const st_text *header, const st_write_tensor *tensors,
                             const uint64_t *sizes, size_t count, smelt_loc loc, diag_engine *d) {
    size_t path_length = strlen(path);
    char *temporary = malloc(path_length + sizeof ".tmp.XXXXXX");
    if (!temporary) {
        diag_error(d, loc, "out of memory");
        return false;
    }
    memcpy(temporary, path, path_length);
    memcpy(temporary + path_length, ".tmp.XXXXXX", sizeof ".tmp.XXXXXX");
    int fd = mkstemp(temporary);
    if (fd < 0) {
        diag_error(d, loc, "cannot create a temporary file beside the output: %s", strerror(errno));
        free(temporary);
        return false;
    }
    unsigned char length_bytes[8];
    for (int i = 0; i < 8; i++)
        length_bytes[i] = (unsigned char)((uint64_t)header->length >> (8 * i));
    bool ok = write_all(fd, length_bytes, 8) && write_all(fd, header->bytes, header->length);
    for (size_t i = 0; ok && i < count; i++)
        ok = write_all(fd, tensors[i].data, sizes[i]);
    const char *step = "write";
    if (ok) {
        step = "sync";
        ok = fchmod(fd, 0644) == 0 && fsync(fd) == 0;
    }
    int saved_errno = errno;
    if (close(fd) != 0 && ok) {
        saved_errno = errno;
        ok = false;
    }
    if (ok) {
        step = "rename";
        ok = rename(temporary, path) == 0;
        saved_errno = errno;
    }
    if (!ok) {
        diag_error(d, loc, "cannot %s the file: %s", step, strerror(saved_errno));
        unlink(temporary);
    }
    free(temporary);
    if (ok) sync_folder_of(path);
    return ok;
}

bool st_write_file(const char *path, const st_write_tensor *tensors, size_t count, const char *metadata_json,
                   diag_engine *d) {
    smelt_loc loc = {diag_file_id(d, path), 0, 0};
    if (count > UINT32_MAX || (count && !tensors)) {
        diag_error(d, loc, "cannot write %zu tensors", count);
        return false;
    }
    uint64_t *sizes = calloc(count ? count : 1, sizeof *sizes);
    if (!sizes) {
        diag_error(d, loc, "out of memory");
        return false;
    }
    bool ok = check_tensors(tensors, count, sizes, loc, d);
    st_text header = {0};
    text_append(&header, "{", 1);
    if (ok && metadata_json) ok = append_metadata(&header, metadata_json, loc, d);
    uint64_t offset = 0;
    for (size_t i = 0; ok && i < count; i++) {
        if (i > 0 || metadata_json) text_append(&header, ",", 1);
        uint64_t end;
        if (size_add_overflow(offset, sizes[i], &end)) {
            diag_error(d, loc, "the data section overflows 64 bits at tensor '%.*s%s'",
                       DIAG_NAME(tensors[i].name));
            ok = false;
            break;
        }
        append_tensor(&header, &tensors[i], offset, end);
        offset = end;
    }
    text_append(&header, "}", 1);
    while (header.length % 8 != 0)
        text_append(&header, " ", 1);
    if (ok && header.failed) {
        diag_error(d, loc, "out of memory building the header");
        ok = false;
    }
    if (ok && header.length > ST_MAX_HEADER_BYTES) {
        diag_error(d, loc, "the header would be %zu bytes, over the limit of %d", header.length,
                   ST_MAX_HEADER_BYTES);
        ok = false;
    }
    if (ok) ok = write_atomically(path, &header, tensors, sizes, count, loc, d);
    free(header.bytes);
    free(sizes);
    return ok;
}
