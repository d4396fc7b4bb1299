/* safetensors.c - mapping a safetensors file and checking every byte of its
 * header before any of it is used (format and rules: safetensors.h).
 *
 * Order of the checks: the 8-byte length and its cap, the header's UTF-8,
 * the JSON (jansson, exact N bytes, duplicate keys rejected), each entry on
 * its own, then the tiling of the data section by all entries together.
 * Problems are reported as they are found, at the file (no line: the file
 * is binary), each naming the tensor it is about.
 */
#include "safetensors.h"
#include "gguf_model.h"
#include "json_memory.h"

#include "ir_io.h"
#include "numeric.h"

#include <errno.h>
#include <fcntl.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__,
               "safetensors data is little-endian; so must the host be");

/* ---- dtypes --------------------------------------------------------------- */

static const struct {
    const char *name;
    unsigned size;
    bool is_float;
} dtype_table[] = {
#define X(e, name, size, is_float) {name, size, is_float},
    ST_DTYPES(X)
#undef X
};
_Static_assert(sizeof dtype_table / sizeof dtype_table[0] == ST_DTYPE_COUNT, "one row per st_dtype");

/* Dtypes of the format that smelt refuses, named so that the message can say
 * "not supported" rather than "unknown". */
static const char *const unsupported_dtypes[] = {"BOOL",    "F64",     "I16",     "U16", "U32", "U64",
                                                 "F8_E8M0", "F6_E2M3", "F6_E3M2", "F4",  "C64"};

const char *st_dtype_name(st_dtype t) { return (unsigned)t < ST_DTYPE_COUNT ? dtype_table[t].name : "?"; }
unsigned st_dtype_size(st_dtype t) { return (unsigned)t < ST_DTYPE_COUNT ? dtype_table[t].size : 0; }
bool st_dtype_is_float(st_dtype t) { return (unsigned)t < ST_DTYPE_COUNT && dtype_table[t].is_float; }

smelt_dtype st_dtype_to_ir(st_dtype t) {
    switch (t) {
    case ST_DTYPE_F32: return SMELT_DTYPE_F32;
    case ST_DTYPE_F16: return SMELT_DTYPE_F16;
    case ST_DTYPE_BF16: return SMELT_DTYPE_BF16;
    case ST_DTYPE_F8_E4M3: return SMELT_DTYPE_F8E4M3;
    case ST_DTYPE_F8_E5M2: return SMELT_DTYPE_F8E5M2;
    case ST_DTYPE_I8: return SMELT_DTYPE_I8;
    case ST_DTYPE_I32: return SMELT_DTYPE_I32;
    case ST_DTYPE_I64: return SMELT_DTYPE_I64;
    default: return SMELT_DTYPE_UNKNOWN;
    }
}

bool st_dtype_from_name(const char *name, st_dtype *out) {
    for (unsigned i = 0; i < ST_DTYPE_COUNT; i++)
        if (strcmp(dtype_table[i].name, name) == 0) {
            *out = (st_dtype)i;
            return true;
        }
    return false;
}

static bool dtype_is_unsupported(const char *name) {
    for (size_t i = 0; i < sizeof unsupported_dtypes / sizeof unsupported_dtypes[0]; i++)
        if (strcmp(unsupported_dtypes[i], name) == 0) return true;
    return false;
}

/* ---- small helpers -------------------------------------------------------- */

uint64_t st_name_hash(const char *name) {
    uint64_t h = 0xcbf29ce484222325u;
    for (const unsigned char *p = (const unsigned char *)name; *p; p++)
        h = (h ^ *p) * 0x100000001b3u;
    return h;
}

const char *st_format_shape(const uint64_t *shape, uint32_t rank, char *buffer, size_t size) {
    size_t used = 0;
    if (size == 0) return buffer;
    buffer[0] = '\0';
    used += (size_t)snprintf(buffer, size, "[");
    for (uint32_t i = 0; i < rank && i < ST_MAX_RANK && used < size; i++)
        used += (size_t)snprintf(buffer + used, size - used, "%s%llu", i ? ", " : "",
                                 (unsigned long long)shape[i]);
    if (used < size) snprintf(buffer + used, size - used, "]");
    return buffer;
}

/* Length of the UTF-8 sequence that starts with `lead`, and the bits of its
 * code point that the lead byte holds; 0 for a byte no sequence starts with. */
static unsigned utf8_sequence_length(unsigned char lead, uint32_t *bits) {
    if (lead < 0x80) return *bits = lead, 1;
    if ((lead & 0xe0) == 0xc0) return *bits = lead & 0x1fu, 2;
    if ((lead & 0xf0) == 0xe0) return *bits = lead & 0x0fu, 3;
    if ((lead & 0xf8) == 0xf0) return *bits = lead & 0x07u, 4;
    return 0;
}

bool st_utf8_valid(const void *bytes, uint64_t length) {
    static const uint32_t smallest[5] = {0, 0, 0x80, 0x800, 0x10000}; /* by sequence length */
    const unsigned char *p = bytes;
    for (uint64_t i = 0; i < length;) {
        uint32_t cp;
        unsigned n = utf8_sequence_length(p[i], &cp);
        if (n == 0 || length - i < n) return false;
        for (unsigned k = 1; k < n; k++) {
            if ((p[i + k] & 0xc0) != 0x80) return false;
            cp = (cp << 6) | (p[i + k] & 0x3fu);
        }
        if (cp < smallest[n] || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return false;
        i += n;
    }
    return true;
}

static const char *json_kind_text(const json_t *v) {
    switch (json_typeof(v)) {
    case JSON_OBJECT: return "an object";
    case JSON_ARRAY: return "a list";
    case JSON_STRING: return "a string";
    case JSON_INTEGER: return "an integer";
    case JSON_REAL: return "a real number";
    case JSON_TRUE: return "true";
    case JSON_FALSE: return "false";
    default: return "null";
    }
}

/* A JSON value as a message shows it: numbers by value, others by kind. */
static const char *json_value_text(const json_t *v, char *buffer, size_t size) {
    if (json_is_integer(v))
        snprintf(buffer, size, "%lld", (long long)json_integer_value(v));
    else if (json_is_real(v))
        ir_format_float(json_real_value(v), buffer, size);
    else
        snprintf(buffer, size, "%s", json_kind_text(v));
    return buffer;
}

/* ---- mapping -------------------------------------------------------------- */

bool st_map_file(const char *path, smelt_loc loc, const char *format, uint64_t min_size,
                 const char *too_short, st_mapping *out, diag_engine *d) {
    int fd = open(path, O_RDONLY | O_NONBLOCK | O_CLOEXEC);
    if (fd < 0) {
        diag_error(d, loc, "cannot open the file: %s", strerror(errno));
        return false;
    }
    struct stat st;
    if (fstat(fd, &st) != 0) {
        diag_error(d, loc, "cannot read the file: %s", strerror(errno));
        close(fd);
        return false;
    }
    if (!S_ISREG(st.st_mode)) {
        diag_error(d, loc, "expected a %s file, found %s", format,
                   S_ISDIR(st.st_mode) ? "a folder" : "something that is not a regular file");
        close(fd);
        return false;
    }
    uint64_t size = (uint64_t)st.st_size;
    if (size < min_size) {
        diag_error(d, loc, "file is %llu bytes; %s", (unsigned long long)size, too_short);
        close(fd);
        return false;
    }
    if (size > SIZE_MAX) {
        diag_error(d, loc, "file of %llu bytes is too large to map", (unsigned long long)size);
        close(fd);
        return false;
    }
    void *map = mmap(NULL, (size_t)size, PROT_READ, MAP_PRIVATE, fd, 0);
    int map_errno = errno;
    if (map == MAP_FAILED) {
        close(fd);
        diag_error(d, loc, "cannot map the file: %s", strerror(map_errno));
        return false;
    }
    *out = (st_mapping){fd, map, size};
    return true;
}

/* Maps f->path into f->map; the descriptor is kept for st_tensor_read_f32. */
static bool map_file(st_file *f, smelt_loc loc, diag_engine *d) {
    st_mapping m;
    if (!st_map_file(f->path, loc, "safetensors", 8,
                     "a safetensors file starts with an 8-byte header length (truncated file?)", &m, d))
        return false;
    f->fd = m.fd;
    f->map = m.map;
    f->map_size = m.size;
    return true;
}

/* ---- header entries -------------------------------------------------------- */

typedef struct st_reader {
    st_file *f;
    diag_engine *d;
    smelt_loc loc;
    uint64_t data_size; /* bytes of the data section */
    const unsigned char *data;
    bool ok;
    bool offsets_known; /* every entry has well-formed data_offsets: tiling can be checked */
    uint64_t *ends;     /* data_offsets[1] per tensor */
} st_reader;

/* A non-negative JSON integer, or false (the caller reports). */
static bool json_to_u64(const json_t *v, uint64_t *out) {
    if (!json_is_integer(v) || json_integer_value(v) < 0) return false;
    *out = (uint64_t)json_integer_value(v);
    return true;
}

static bool read_metadata(st_reader *r, const json_t *v) {
    if (!json_is_object(v)) {
        diag_error(r->d, r->loc, "'__metadata__' must be an object of strings, found %s", json_kind_text(v));
        return false;
    }
    st_file *f = r->f;
    f->metadata = arena_array(&f->arena, json_object_size(v), sizeof *f->metadata);
    bool ok = true;
    const char *key;
    json_t *value;
    json_object_foreach((json_t *)v, key, value) {
        if (!json_is_string(value)) {
            diag_error(r->d, r->loc, "'__metadata__' must be an object of strings; '%.*s%s' holds %s",
                       DIAG_NAME(key), json_kind_text(value));
            ok = false;
            continue;
        }
        f->metadata[f->metadata_count++] = (st_metadata_entry){
            arena_strdup(&f->arena, key), arena_strdup(&f->arena, json_string_value(value))};
    }
    return ok;
}

static bool read_dtype(st_reader *r, const char *name, const json_t *v, st_dtype *out) {
    if (!json_is_string(v)) {
        diag_error(r->d, r->loc, "tensor '%.*s%s': 'dtype' must be a string such as \"F32\", found %s",
                   DIAG_NAME(name), json_kind_text(v));
        return false;
    }
    const char *text = json_string_value(v);
    if (st_dtype_from_name(text, out)) return true;
    if (dtype_is_unsupported(text))
        diag_error(r->d, r->loc,
                   "tensor '%.*s%s': dtype %s is not supported; smelt reads F32, F16, BF16, F8_E4M3, "
                   "F8_E5M2, I8, I32, I64 and U8",
                   DIAG_NAME(name), text);
    else
        diag_error(r->d, r->loc,
                   "tensor '%.*s%s': unknown dtype '%.*s%s'; expected one of F32, F16, BF16, F8_E4M3, "
                   "F8_E5M2, I8, I32, I64, U8",
                   DIAG_NAME(name), DIAG_NAME(text));
    return false;
}

static bool read_shape(st_reader *r, const char *name, const json_t *v, st_tensor *t) {
    if (!json_is_array(v)) {
        diag_error(r->d, r->loc, "tensor '%.*s%s': 'shape' must be a list of non-negative integers, found %s",
                   DIAG_NAME(name), json_kind_text(v));
        return false;
    }
    size_t rank = json_array_size(v);
    if (rank > ST_MAX_RANK) {
        diag_error(r->d, r->loc, "tensor '%.*s%s': shape has %zu dims; at most %d are supported",
                   DIAG_NAME(name), rank, ST_MAX_RANK);
        return false;
    }
    bool ok = true;
    for (size_t i = 0; i < rank; i++) {
        const json_t *dim = json_array_get(v, i);
        if (!json_to_u64(dim, &t->shape[i])) {
            char text[64];
            diag_error(r->d, r->loc, "tensor '%.*s%s': shape[%zu] is %s; expected a non-negative integer",
                       DIAG_NAME(name), i, json_value_text(dim, text, sizeof text));
            ok = false;
        }
    }
    t->rank = (uint32_t)rank;
    return ok;
}

static bool read_offsets(st_reader *r, const char *name, const json_t *v, uint64_t *begin, uint64_t *end) {
    if (!json_is_array(v) || json_array_size(v) != 2) {
        diag_error(r->d, r->loc,
                   "tensor '%.*s%s': 'data_offsets' must be a list [begin, end] of two non-negative "
                   "integers, found %s%s",
                   DIAG_NAME(name), json_kind_text(v), json_is_array(v) ? " of another length" : "");
        return false;
    }
    bool ok = true;
    uint64_t *targets[2] = {begin, end};
    for (size_t i = 0; i < 2; i++) {
        const json_t *item = json_array_get(v, i);
        if (!json_to_u64(item, targets[i])) {
            char text[64];
            diag_error(r->d, r->loc,
                       "tensor '%.*s%s': data_offsets[%zu] is %s; expected a non-negative integer",
                       DIAG_NAME(name), i, json_value_text(item, text, sizeof text));
            ok = false;
        }
    }
    if (ok && *begin > *end) {
        diag_error(r->d, r->loc, "tensor '%.*s%s': data_offsets [%llu, %llu] end before they begin",
                   DIAG_NAME(name), (unsigned long long)*begin, (unsigned long long)*end);
        ok = false;
    }
    return ok;
}

/* One tensor entry: exactly dtype, shape and data_offsets, consistent with
 * each other. Fills t (without data); *end gets data_offsets[1] when the
 * offsets themselves are well-formed (*offsets_ok). */
static bool read_entry(st_reader *r, const char *name, const json_t *v, st_tensor *t, uint64_t *end,
                       bool *offsets_ok) {
    *offsets_ok = false;
    if (!json_is_object(v)) {
        diag_error(r->d, r->loc,
                   "tensor '%.*s%s': expected an object with dtype, shape and data_offsets, found %s",
                   DIAG_NAME(name), json_kind_text(v));
        return false;
    }
    bool ok = true;
    const char *key;
    json_t *field;
    json_object_foreach((json_t *)v, key, field) {
        if (strcmp(key, "dtype") != 0 && strcmp(key, "shape") != 0 && strcmp(key, "data_offsets") != 0) {
            diag_error(r->d, r->loc,
                       "tensor '%.*s%s': unexpected field '%.*s%s'; an entry holds only dtype, shape and "
                       "data_offsets",
                       DIAG_NAME(name), DIAG_NAME(key));
            ok = false;
        }
    }
    static const char *const required[] = {"dtype", "shape", "data_offsets"};
    for (size_t i = 0; i < 3; i++)
        if (!json_object_get(v, required[i])) {
            diag_error(r->d, r->loc, "tensor '%.*s%s': missing field '%s'", DIAG_NAME(name), required[i]);
            ok = false;
        }
    const json_t *dtype = json_object_get(v, "dtype"), *shape = json_object_get(v, "shape"),
                 *offsets = json_object_get(v, "data_offsets");
    bool dtype_ok = dtype && read_dtype(r, name, dtype, &t->dtype);
    bool shape_ok = shape && read_shape(r, name, shape, t);
    uint64_t begin = 0;
    *offsets_ok = offsets && read_offsets(r, name, offsets, &begin, end);
    t->offset = begin;
    ok = ok && dtype_ok && shape_ok && *offsets_ok;
    if (!dtype_ok || !shape_ok) return false;

    char shape_text[ST_SHAPE_TEXT_MAX];
    uint64_t bytes = st_dtype_size(t->dtype);
    for (uint32_t i = 0; i < t->rank; i++)
        if (size_mul_overflow(bytes, t->shape[i], &bytes)) {
            diag_error(r->d, r->loc, "tensor '%.*s%s': the byte size of %s%s overflows 64 bits",
                       DIAG_NAME(name), st_dtype_name(t->dtype),
                       st_format_shape(t->shape, t->rank, shape_text, sizeof shape_text));
            return false;
        }
    t->byte_size = bytes;
    if (*offsets_ok && *end - begin != bytes) {
        diag_error(
            r->d, r->loc, "tensor '%.*s%s': data_offsets [%llu, %llu] hold %llu bytes but %s%s needs %llu",
            DIAG_NAME(name), (unsigned long long)begin, (unsigned long long)*end,
            (unsigned long long)(*end - begin), st_dtype_name(t->dtype),
            st_format_shape(t->shape, t->rank, shape_text, sizeof shape_text), (unsigned long long)bytes);
        return false;
    }
    return ok;
}

/* ---- tiling of the data section ----------------------------------------- */

/* One claim on the data section, for sorting. */
typedef struct st_span {
    uint64_t begin, end;
    uint32_t tensor;
} st_span;

static int compare_spans(const void *a, const void *b) {
    const st_span *x = a, *y = b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    if (x->end != y->end) return x->end < y->end ? -1 : 1;
    return x->tensor < y->tensor ? -1 : x->tensor > y->tensor;
}

/* The entries, sorted by offset, must cover [0, data_size) exactly once.
 * The first entry past the end is reported with a count of the others and
 * ends the check, so that one truncation gives one message. */
static bool check_tiling(st_reader *r) {
    st_file *f = r->f;
    uint32_t count = f->tensor_count;
    st_span *spans = arena_array(&f->arena, count ? count : 1, sizeof *spans);
    for (uint32_t i = 0; i < count; i++)
        spans[i] = (st_span){f->tensors[i].offset, r->ends[i], i};
    qsort(spans, count, sizeof *spans, compare_spans);

    bool ok = true;
    uint64_t covered = 0;       /* every byte before this is claimed */
    const st_span *last = NULL; /* the span that reaches `covered` */
    for (uint32_t k = 0; k < count && !diag_should_stop(r->d); k++) {
        const st_span *s = &spans[k];
        const char *name = f->tensors[s->tensor].name;
        uint64_t begin = s->begin, end = s->end;
        if (end > r->data_size) {
            /* A truncated file: every later tensor is cut off too. One
             * message for all of them, then stop. */
            uint32_t more = 0;
            uint64_t needed = end;
            for (uint32_t j = k + 1; j < count; j++)
                if (spans[j].end > r->data_size) {
                    more++;
                    if (spans[j].end > needed) needed = spans[j].end;
                }
            char also[160] = "";
            if (more)
                snprintf(also, sizeof also,
                         "; so do %u more tensor%s after it (a truncated file? its tensors need %llu bytes)",
                         more, more == 1 ? "" : "s", (unsigned long long)needed);
            diag_error(r->d, r->loc,
                       "tensor '%.*s%s': data_offsets [%llu, %llu] run past the end of the data section, "
                       "which holds %llu bytes%s",
                       DIAG_NAME(name), (unsigned long long)begin, (unsigned long long)end,
                       (unsigned long long)r->data_size, also);
            return false;
        }
        if (begin > covered) {
            diag_error(
                r->d, r->loc,
                "bytes [%llu, %llu) of the data section belong to no tensor (a gap before tensor '%.*s%s')",
                (unsigned long long)covered, (unsigned long long)begin, DIAG_NAME(name));
            ok = false;
        } else if (begin < covered) {
            diag_error(r->d, r->loc,
                       "tensor '%.*s%s': data_offsets [%llu, %llu] overlap tensor '%.*s%s' at [%llu, %llu]",
                       DIAG_NAME(name), (unsigned long long)s->begin, (unsigned long long)s->end,
                       DIAG_NAME(f->tensors[last->tensor].name), (unsigned long long)last->begin,
                       (unsigned long long)last->end);
            ok = false;
        }
        if (end >= covered) {
            covered = end;
            last = s;
        }
    }
    if (covered < r->data_size && !diag_should_stop(r->d)) {
        uint64_t trailing = r->data_size - covered;
        diag_error(r->d, r->loc,
                   "the last %llu byte%s of the data section (from byte %llu) belong%s to no tensor",
                   (unsigned long long)trailing, trailing == 1 ? "" : "s", (unsigned long long)covered,
                   trailing == 1 ? "s" : "");
        ok = false;
    }
    return ok;
}

/* ---- the header ------------------------------------------------------------ */

static void build_name_table(st_file *f) {
    uint32_t slots = 8;
    while (slots < 2 * (uint64_t)f->tensor_count)
        slots *= 2;
    f->slots = arena_array(&f->arena, slots, sizeof *f->slots);
    f->slot_count = slots;
    for (uint32_t i = 0; i < f->tensor_count; i++) {
        uint32_t s = (uint32_t)st_name_hash(f->tensors[i].name) & (slots - 1);
        while (f->slots[s])
            s = (s + 1) & (slots - 1);
        f->slots[s] = i + 1;
    }
}

static bool read_header(st_reader *r, const char *text, uint64_t length) {
    json_error_t error = {0}; /* jansson leaves its code byte unset on success */
    fe_json_memory_begin();
    json_t *root = json_loadb(text, (size_t)length, JSON_REJECT_DUPLICATES, &error);
    if (fe_json_out_of_memory(&error)) {
        if (root) json_decref(root);
        diag_error(r->d, r->loc, "out of memory reading the header");
        return false;
    }
    if (!root) {
        diag_error(r->d, r->loc, "header is not valid JSON: %s (at byte %d of the header)", error.text,
                   error.position);
        return false;
    }
    if (!json_is_object(root)) {
        diag_error(r->d, r->loc, "header is %s; expected a JSON object of tensors", json_kind_text(root));
        json_decref(root);
        return false;
    }
    arena_recovery recovery; /* the tree is freed, then st_file_open's handler runs */
    if (arena_recovery_enter(&recovery, setjmp(recovery.where))) {
        json_decref(root);
        arena_out_of_memory();
    }
    st_file *f = r->f;
    size_t entries = json_object_size(root);
    f->tensors = arena_array(&f->arena, entries ? entries : 1, sizeof *f->tensors);
    r->ends = arena_array(&f->arena, entries ? entries : 1, sizeof *r->ends);
    r->offsets_known = true;
    bool ok = true;
    const char *key;
    json_t *value;
    json_object_foreach(root, key, value) {
        if (diag_should_stop(r->d)) {
            ok = false;
            break;
        }
        if (strcmp(key, "__metadata__") == 0) {
            ok &= read_metadata(r, value);
            continue;
        }
        st_tensor *t = &f->tensors[f->tensor_count];
        memset(t, 0, sizeof *t);
        bool offsets_ok;
        ok &= read_entry(r, key, value, t, &r->ends[f->tensor_count], &offsets_ok);
        r->offsets_known &= offsets_ok;
        t->name = arena_strdup(&f->arena, key);
        f->tensor_count++;
    }
    arena_recovery_leave(&recovery);
    json_decref(root);
    /* Offsets we could not read would turn into gaps: only check the tiling
     * when every entry has them. */
    if (r->offsets_known && !diag_should_stop(r->d)) ok &= check_tiling(r);
    return ok;
}

bool st_file_open(const char *path, st_file *out, diag_engine *d) {
    memset(out, 0, sizeof *out);
    arena_init(&out->arena);
    arena_recovery recovery;
    if (arena_recovery_enter(&recovery, setjmp(recovery.where))) {
        st_file_close(out);
        diag_error(d, SMELT_NO_LOC, "out of memory opening '%.*s%s'", DIAG_NAME(path));
        return false;
    }
    out->path = arena_strdup(&out->arena, path);
    out->diag_file = diag_file_id(d, path);
    smelt_loc loc = {out->diag_file, 0, 0};
    if (!map_file(out, loc, d)) {
        arena_recovery_leave(&recovery);
        st_file_close(out);
        return false;
    }
    const unsigned char *bytes = out->map;
    uint64_t header_length = 0;
    for (int i = 7; i >= 0; i--)
        header_length = (header_length << 8) | bytes[i];
    st_reader r = {.f = out, .d = d, .loc = loc};
    bool ok = false;
    if (header_length > ST_MAX_HEADER_BYTES) {
        diag_error(d, loc,
                   "header length %llu is over the limit of %d bytes (100 MiB); not a safetensors file?",
                   (unsigned long long)header_length, ST_MAX_HEADER_BYTES);
    } else if (header_length > out->map_size - 8) {
        diag_error(d, loc,
                   "header length %llu runs past the end of the file: only %llu bytes follow the 8-byte "
                   "length (truncated file?)",
                   (unsigned long long)header_length, (unsigned long long)(out->map_size - 8));
    } else if (!st_utf8_valid(bytes + 8, header_length)) {
        diag_error(d, loc, "header is not valid UTF-8");
    } else {
        r.data = bytes + 8 + header_length;
        r.data_size = out->map_size - 8 - header_length;
        ok = read_header(&r, (const char *)bytes + 8, header_length);
    }
    if (!ok) {
        arena_recovery_leave(&recovery);
        st_file_close(out);
        return false;
    }
    for (uint32_t i = 0; i < out->tensor_count; i++) {
        st_tensor *t = &out->tensors[i];
        t->data = r.data + t->offset;
        t->fd = out->fd;
        t->diag_file = out->diag_file;
        t->file_offset = 8 + header_length + t->offset;
    }
    build_name_table(out);
    arena_recovery_leave(&recovery);
    return true;
}

void st_file_close(st_file *f) {
    if (f->map) {
        munmap(f->map, (size_t)f->map_size);
        close(f->fd);
    }
    arena_free(&f->arena);
    memset(f, 0, sizeof *f);
}

const st_tensor *st_file_find(const st_file *f, const char *name) {
    if (!f->slot_count) return NULL;
    uint32_t mask = f->slot_count - 1;
    for (uint32_t s = (uint32_t)st_name_hash(name) & mask; f->slots[s]; s = (s + 1) & mask) {
        const st_tensor *t = &f->tensors[f->slots[s] - 1];
        if (strcmp(t->name, name) == 0) return t;
    }
    return NULL;
}

const char *st_file_metadata(const st_file *f, const char *key) {
    for (uint32_t i = 0; i < f->metadata_count; i++)
        if (strcmp(f->metadata[i].key, key) == 0) return f->metadata[i].value;
    return NULL;
}

/* ---- conversion ------------------------------------------------------------ */

bool st_read_file_bytes(int fd, int32_t file_id, const char *tensor, void *dst, uint64_t size,
                        uint64_t offset, diag_engine *d) {
    smelt_loc loc = {file_id, 0, 0};
    uint8_t *p = dst;
    while (size > 0) {
        size_t want = size > (1u << 30) ? (size_t)1 << 30 : (size_t)size;
        ssize_t got = pread(fd, p, want, (off_t)offset);
        if (got < 0 && errno == EINTR) continue;
        if (got <= 0) {
            if (got < 0)
                diag_error(d, loc, "tensor '%.*s%s': cannot read its data: %s", DIAG_NAME(tensor),
                           strerror(errno));
            else
                diag_error(d, loc,
                           "tensor '%.*s%s': the file ends at byte %llu, inside the tensor's data; it was "
                           "truncated after it was opened",
                           DIAG_NAME(tensor), (unsigned long long)offset);
            return false;
        }
        p += got;
        offset += (uint64_t)got;
        size -= (uint64_t)got;
    }
    return true;
}

static bool read_tensor_bytes(const st_tensor *t, void *dst, uint64_t size, uint64_t offset, diag_engine *d) {
    return st_read_file_bytes(t->fd, t->diag_file, t->name, dst, size, offset, d);
}

bool st_tensor_read_f32(const st_tensor *t, float *dst, diag_engine *d) {
    if (t->gguf) return fe_gguf_view_read_f32(t->gguf, dst, d);
    uint64_t count = t->byte_size / st_dtype_size(t->dtype);
    if (t->dtype == ST_DTYPE_F32) return read_tensor_bytes(t, dst, t->byte_size, t->file_offset, d);
    /* Other float dtypes go through a bounce buffer, a chunk at a time. */
    enum { CHUNK_BYTES = 1 << 16 };
    _Alignas(8) unsigned char chunk[CHUNK_BYTES];
    unsigned size = st_dtype_size(t->dtype);
    uint64_t per_chunk = CHUNK_BYTES / size;
    for (uint64_t done = 0; done < count; done += per_chunk) {
        uint64_t n = count - done < per_chunk ? count - done : per_chunk;
        if (!read_tensor_bytes(t, chunk, n * size, t->file_offset + done * size, d)) return false;
        st_convert_to_f32(t->dtype, chunk, dst + done, n);
    }
    return true;
}

void st_convert_to_f32(st_dtype dtype, const void *src, float *dst, uint64_t count) {
    const unsigned char *p = src;
    switch (dtype) {
    case ST_DTYPE_F32: memcpy(dst, p, (size_t)count * 4); return;
    case ST_DTYPE_F16:
        for (uint64_t i = 0; i < count; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = plan_f16_to_f32(h);
        }
        return;
    case ST_DTYPE_BF16:
        for (uint64_t i = 0; i < count; i++) {
            uint16_t h;
            memcpy(&h, p + 2 * i, 2);
            dst[i] = plan_bf16_to_f32(h);
        }
        return;
    case ST_DTYPE_F8_E4M3:
        for (uint64_t i = 0; i < count; i++)
            dst[i] = plan_f8e4m3_to_f32(p[i]);
        return;
    case ST_DTYPE_F8_E5M2:
        for (uint64_t i = 0; i < count; i++)
            dst[i] = plan_f8e5m2_to_f32(p[i]);
        return;
    default: SMELT_DIE("st_convert_to_f32 of non-float dtype %s", st_dtype_name(dtype));
    }
}
