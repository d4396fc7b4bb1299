/* gguf.c - mapping a GGUF file and checking every byte of its header before
 * any of it is used (format and rules: gguf.h).
 *
 * The header is read front to back by a cursor that refuses to step past
 * the end of the file: each read says what it needs and fails, naming the
 * byte offset, when fewer bytes remain. A count is checked against the
 * bytes that remain before anything is allocated for it (each element takes
 * at least one byte, a string at least eight). The first problem in the
 * header stops the reading (what follows would be read at a wrong offset);
 * the tensors are then checked one by one and together (no overlap), and
 * every problem among them is reported.
 */
#include "gguf.h"
#include "safetensors.h" /* st_utf8_valid */

#include <errno.h>
#include <stdarg.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

_Static_assert(__BYTE_ORDER__ == __ORDER_LITTLE_ENDIAN__, "GGUF is little-endian; so must the host be");

static const char gguf_magic[4] = {'G', 'G', 'U', 'F'};

/* ---- types ----------------------------------------------------------------- */

static const char *const value_type_names[GGUF_VALUE_TYPE_COUNT] = {
    "u8", "i8", "u16", "i16", "u32", "i32", "f32", "bool", "string", "array", "u64", "i64", "f64",
};
static const uint8_t value_type_sizes[GGUF_VALUE_TYPE_COUNT] = {1, 1, 2, 2, 4, 4, 4, 1, 0, 0, 8, 8, 8};

const char *gguf_value_type_name(gguf_value_type t) {
    return (unsigned)t < GGUF_VALUE_TYPE_COUNT ? value_type_names[t] : "unknown";
}

/* ggml's type ids, for messages about the ones smelt does not read. */
static const char *const ggml_type_names[] = {
    [0] = "F32",     [1] = "F16",    [2] = "Q4_0",     [3] = "Q4_1",    [6] = "Q5_0",     [7] = "Q5_1",
    [8] = "Q8_0",    [9] = "Q8_1",   [10] = "Q2_K",    [11] = "Q3_K",   [12] = "Q4_K",    [13] = "Q5_K",
    [14] = "Q6_K",   [15] = "Q8_K",  [16] = "IQ2_XXS", [17] = "IQ2_XS", [18] = "IQ3_XXS", [19] = "IQ1_S",
    [20] = "IQ4_NL", [21] = "IQ3_S", [22] = "IQ2_S",   [23] = "IQ4_XS", [24] = "I8",      [25] = "I16",
    [26] = "I32",    [27] = "I64",   [28] = "F64",     [29] = "IQ1_M",  [30] = "BF16",    [34] = "TQ1_0",
    [35] = "TQ2_0",  [39] = "MXFP4",
};

const char *gguf_type_name(uint32_t id) {
    if (id < sizeof ggml_type_names / sizeof ggml_type_names[0] && ggml_type_names[id])
        return ggml_type_names[id];
    return "unknown";
}

bool gguf_type_supported(uint32_t id, uint32_t *block, uint32_t *block_bytes) {
    uint32_t values = 0, bytes = 0;
    switch (id) {
#define X(e, type_id, type_block, type_bytes)                                                                \
    case type_id:                                                                                            \
        values = type_block;                                                                                 \
        bytes = type_bytes;                                                                                  \
        break;
        GGUF_TENSOR_TYPES(X)
#undef X
    default: return false;
    }
    if (block) *block = values;
    if (block_bytes) *block_bytes = bytes;
    return true;
}

/* ---- values ---------------------------------------------------------------- */

static bool is_integer_type(gguf_value_type t) {
    return t == GGUF_VALUE_U8 || t == GGUF_VALUE_I8 || t == GGUF_VALUE_U16 || t == GGUF_VALUE_I16 ||
           t == GGUF_VALUE_U32 || t == GGUF_VALUE_I32 || t == GGUF_VALUE_U64 || t == GGUF_VALUE_I64 ||
           t == GGUF_VALUE_BOOL;
}

static bool is_signed_type(gguf_value_type t) {
    return t == GGUF_VALUE_I8 || t == GGUF_VALUE_I16 || t == GGUF_VALUE_I32 || t == GGUF_VALUE_I64;
}

bool gguf_kv_int(const gguf_kv *kv, int64_t *out) {
    if (kv->type == GGUF_VALUE_ARRAY || !is_integer_type(kv->type)) return false;
    if (is_signed_type(kv->type)) {
        *out = kv->scalar.i;
        return true;
    }
    if (kv->scalar.u > (uint64_t)INT64_MAX) return false;
    *out = (int64_t)kv->scalar.u;
    return true;
}

bool gguf_kv_float(const gguf_kv *kv, double *out) {
    if (kv->type == GGUF_VALUE_F32 || kv->type == GGUF_VALUE_F64) {
        *out = kv->scalar.f;
        return true;
    }
    int64_t i;
    if (kv->type == GGUF_VALUE_BOOL || !gguf_kv_int(kv, &i)) return false;
    *out = (double)i;
    return true;
}

/* The element at p of numeric type t as a scalar union. */
static void decode_scalar(gguf_value_type t, const uint8_t *p, gguf_kv *kv) {
    switch (t) {
    case GGUF_VALUE_U8:
    case GGUF_VALUE_BOOL: kv->scalar.u = p[0]; break;
    case GGUF_VALUE_I8: kv->scalar.i = (int8_t)p[0]; break;
    case GGUF_VALUE_U16: {
        uint16_t v;
        memcpy(&v, p, 2);
        kv->scalar.u = v;
        break;
    }
    case GGUF_VALUE_I16: {
        int16_t v;
        memcpy(&v, p, 2);
        kv->scalar.i = v;
        break;
    }
    case GGUF_VALUE_U32: {
        uint32_t v;
        memcpy(&v, p, 4);
        kv->scalar.u = v;
        break;
    }
    case GGUF_VALUE_I32: {
        int32_t v;
        memcpy(&v, p, 4);
        kv->scalar.i = v;
        break;
    }
    case GGUF_VALUE_F32: {
        float v;
        memcpy(&v, p, 4);
        kv->scalar.f = v;
        break;
    }
    case GGUF_VALUE_U64: memcpy(&kv->scalar.u, p, 8); break;
    case GGUF_VALUE_I64: memcpy(&kv->scalar.i, p, 8); break;
    case GGUF_VALUE_F64: memcpy(&kv->scalar.f, p, 8); break;
    default: SMELT_DIE("decode_scalar of %s", gguf_value_type_name(t));
    }
}

bool gguf_kv_array_int(const gguf_kv *kv, uint64_t i, int64_t *out) {
    if (kv->type != GGUF_VALUE_ARRAY || i >= kv->count || !is_integer_type(kv->element_type)) return false;
    gguf_kv element = {.type = kv->element_type};
    decode_scalar(kv->element_type, (const uint8_t *)kv->elements + i * value_type_sizes[kv->element_type],
                  &element);
    return gguf_kv_int(&element, out);
}

const char *gguf_kv_text(const gguf_kv *kv, char *buffer, size_t size) {
    int64_t i;
    switch (kv->type) {
    case GGUF_VALUE_STRING: snprintf(buffer, size, "'%.*s%s'", DIAG_NAME(kv->string)); break;
    case GGUF_VALUE_ARRAY:
        snprintf(buffer, size, "an array of %llu %s", (unsigned long long)kv->count,
                 gguf_value_type_name(kv->element_type));
        break;
    case GGUF_VALUE_BOOL: snprintf(buffer, size, "%s", kv->scalar.u ? "true" : "false"); break;
    case GGUF_VALUE_F32:
    case GGUF_VALUE_F64: snprintf(buffer, size, "%.9g", kv->scalar.f); break;
    default:
        if (gguf_kv_int(kv, &i))
            snprintf(buffer, size, "%lld", (long long)i);
        else
            snprintf(buffer, size, "%llu", (unsigned long long)kv->scalar.u);
    }
    return buffer;
}

/* ---- the cursor -------------------------------------------------------------- */

typedef struct gguf_reader {
    gguf_file *f;
    diag_engine *d;
    smelt_loc loc;
    const uint8_t *bytes;
    uint64_t size;
    uint64_t at; /* next byte to read */
    bool ok;
} gguf_reader;

static void reader_error(gguf_reader *r, uint64_t at, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void reader_error(gguf_reader *r, uint64_t at, const char *fmt, ...) {
    char message[512];
    va_list args;
    va_start(args, fmt);
    vsnprintf(message, sizeof message, fmt, args);
    va_end(args);
    diag_error(r->d, r->loc, "at byte %llu: %s", (unsigned long long)at, message);
    r->ok = false;
}

static uint64_t remaining(const gguf_reader *r) { return r->size - r->at; }

/* `n` bytes at the cursor, advancing it; NULL after an error saying what
 * was being read. */
static const uint8_t *take(gguf_reader *r, uint64_t n, const char *what) {
    if (!r->ok) return NULL;
    if (n > remaining(r)) {
        reader_error(r, r->at, "the file ends (at byte %llu) inside %s, which needs %llu bytes",
                     (unsigned long long)r->size, what, (unsigned long long)n);
        return NULL;
    }
    const uint8_t *p = r->bytes + r->at;
    r->at += n;
    return p;
}

static bool read_u32(gguf_reader *r, uint32_t *out, const char *what) {
    const uint8_t *p = take(r, 4, what);
    if (p) memcpy(out, p, 4);
    return p != NULL;
}

static bool read_u64(gguf_reader *r, uint64_t *out, const char *what) {
    const uint8_t *p = take(r, 8, what);
    if (p) memcpy(out, p, 8);
    return p != NULL;
}

/* A string: its length checked against the bytes left, then copied with a
 * NUL into the arena. */
static const char *read_string(gguf_reader *r, uint64_t *length_out, const char *what) {
    uint64_t start = r->at, length;
    if (!read_u64(r, &length, what)) return NULL;
    if (length > remaining(r)) {
        reader_error(r, start, "%s is %llu bytes long, but only %llu bytes of the file remain", what,
                     (unsigned long long)length, (unsigned long long)remaining(r));
        return NULL;
    }
    const uint8_t *p = take(r, length, what);
    if (!p) return NULL;
    if (length_out) *length_out = length;
    return arena_strndup(&r->f->arena, (const char *)p, (size_t)length);
}

/* A key or tensor name: non-empty UTF-8 without NUL. */
static const char *read_name(gguf_reader *r, const char *what) {
    uint64_t start = r->at, length = 0;
    const char *s = read_string(r, &length, what);
    if (!s) return NULL;
    if (length == 0 || memchr(s, '\0', (size_t)length) || !st_utf8_valid(s, length)) {
        reader_error(r, start, "%s %s", what,
                     length == 0 ? "is empty" : "is not valid UTF-8 text (or holds a NUL byte)");
        return NULL;
    }
    return s;
}

/* ---- metadata ---------------------------------------------------------------- */

static bool read_array(gguf_reader *r, gguf_kv *kv) {
    uint64_t start = r->at;
    uint32_t element_type;
    if (!read_u32(r, &element_type, "an array's element type") ||
        !read_u64(r, &kv->count, "an array's element count"))
        return false;
    if (element_type >= GGUF_VALUE_TYPE_COUNT) {
        reader_error(r, start, "metadata '%.*s%s' is an array of unknown value type %u", DIAG_NAME(kv->key),
                     element_type);
        return false;
    }
    kv->element_type = (gguf_value_type)element_type;
    if (kv->element_type == GGUF_VALUE_ARRAY) {
        reader_error(r, start, "metadata '%.*s%s' is an array of arrays, which smelt does not read",
                     DIAG_NAME(kv->key));
        return false;
    }
    /* each element takes at least 1 byte (8 for a string's length) */
    uint64_t least = kv->element_type == GGUF_VALUE_STRING ? 8 : value_type_sizes[kv->element_type];
    if (kv->count > remaining(r) / least) {
        reader_error(r, start + 4,
                     "metadata '%.*s%s' claims %llu elements of %s, more than the %llu bytes left can hold",
                     DIAG_NAME(kv->key), (unsigned long long)kv->count,
                     gguf_value_type_name(kv->element_type), (unsigned long long)remaining(r));
        return false;
    }
    arena *a = &r->f->arena;
    if (kv->element_type == GGUF_VALUE_STRING) {
        const char **strings = arena_array(a, kv->count ? kv->count : 1, sizeof *strings);
        uint64_t *lengths = arena_array(a, kv->count ? kv->count : 1, sizeof *lengths);
        for (uint64_t i = 0; i < kv->count; i++)
            if (!(strings[i] = read_string(r, &lengths[i], "a string of an array"))) return false;
        kv->strings = strings;
        kv->string_lengths = lengths;
        return true;
    }
    uint64_t bytes = kv->count * least; /* cannot overflow: checked against remaining above */
    const uint8_t *p = take(r, bytes, "an array's elements");
    if (!p) return false;
    if (kv->element_type == GGUF_VALUE_BOOL)
        for (uint64_t i = 0; i < kv->count; i++)
            if (p[i] > 1) {
                reader_error(r, r->at - bytes + i, "metadata '%.*s%s': element %llu is a bool of value %u",
                             DIAG_NAME(kv->key), (unsigned long long)i, p[i]);
                return false;
            }
    void *copy = arena_alloc(a, bytes ? (size_t)bytes : 1);
    memcpy(copy, p, (size_t)bytes);
    kv->elements = copy;
    return true;
}

static bool read_kv(gguf_reader *r, gguf_kv *kv) {
    kv->offset = r->at;
    if (!(kv->key = read_name(r, "a metadata key"))) return false;
    uint64_t type_at = r->at;
    uint32_t type;
    if (!read_u32(r, &type, "a metadata value type")) return false;
    if (type >= GGUF_VALUE_TYPE_COUNT) {
        reader_error(r, type_at, "metadata '%.*s%s' has unknown value type %u", DIAG_NAME(kv->key), type);
        return false;
    }
    kv->type = kv->element_type = (gguf_value_type)type;
    kv->count = 1;
    if (kv->type == GGUF_VALUE_ARRAY) return read_array(r, kv);
    if (kv->type == GGUF_VALUE_STRING)
        return (kv->string = read_string(r, &kv->string_length, "a metadata string")) != NULL;
    uint64_t value_at = r->at;
    const uint8_t *p = take(r, value_type_sizes[kv->type], "a metadata value");
    if (!p) return false;
    decode_scalar(kv->type, p, kv);
    if (kv->type == GGUF_VALUE_BOOL && kv->scalar.u > 1) {
        reader_error(r, value_at, "metadata '%.*s%s' is a bool of value %llu (must be 0 or 1)",
                     DIAG_NAME(kv->key), (unsigned long long)kv->scalar.u);
        return false;
    }
    return true;
}

/* The alignment of the data section: general.alignment (a u32 power of
 * two), or 32. */
static bool read_alignment(gguf_reader *r) {
    r->f->alignment = GGUF_DEFAULT_ALIGNMENT;
    const gguf_kv *kv = gguf_file_find_kv(r->f, "general.alignment");
    if (!kv) return true;
    if (kv->type != GGUF_VALUE_U32 || kv->scalar.u == 0 || (kv->scalar.u & (kv->scalar.u - 1)) != 0) {
        char text[96];
        reader_error(r, kv->offset, "general.alignment must be a u32 power of two, found %s %s",
                     gguf_value_type_name(kv->type), gguf_kv_text(kv, text, sizeof text));
        return false;
    }
    r->f->alignment = (uint32_t)kv->scalar.u;
    return true;
}

/* ---- tensors ----------------------------------------------------------------- */

static bool read_tensor_info(gguf_reader *r, gguf_tensor *t) {
    t->info_offset = r->at;
    if (!(t->name = read_name(r, "a tensor name"))) return false;
    if (strlen(t->name) >= GGUF_MAX_NAME) {
        reader_error(r, t->info_offset, "tensor name '%.*s%s' is %zu bytes; GGUF allows at most %d",
                     DIAG_NAME(t->name), strlen(t->name), GGUF_MAX_NAME - 1);
        return false;
    }
    uint64_t rank_at = r->at;
    if (!read_u32(r, &t->rank, "a tensor's dim count")) return false;
    if (t->rank < 1 || t->rank > GGUF_MAX_DIMS) {
        reader_error(r, rank_at, "tensor '%.*s%s' has %u dims; GGUF tensors have 1 to %d", DIAG_NAME(t->name),
                     t->rank, GGUF_MAX_DIMS);
        return false;
    }
    uint64_t dims_at = r->at;
    for (uint32_t i = 0; i < GGUF_MAX_DIMS; i++)
        t->ne[i] = 1;
    for (uint32_t i = 0; i < t->rank; i++)
        if (!read_u64(r, &t->ne[i], "a tensor's dims")) return false;
    uint64_t type_at = r->at;
    if (!read_u32(r, &t->type, "a tensor's type") || !read_u64(r, &t->offset, "a tensor's offset"))
        return false;

    uint64_t elements = 1;
    for (uint32_t i = 0; i < t->rank; i++)
        if (size_mul_overflow(elements, t->ne[i], &elements) || elements > (uint64_t)INT64_MAX) {
            reader_error(r, dims_at, "tensor '%.*s%s' has more elements than fit in 63 bits",
                         DIAG_NAME(t->name));
            return false;
        }
    t->element_count = elements;
    uint32_t block, block_bytes;
    if (!gguf_type_supported(t->type, &block, &block_bytes)) {
        reader_error(r, type_at,
                     "tensor '%.*s%s' has type %s (%u), which smelt does not read; it reads F32, F16, BF16, "
                     "Q8_0, Q4_0, Q4_1, Q4_K, Q5_K and Q6_K",
                     DIAG_NAME(t->name), gguf_type_name(t->type), t->type);
        return false;
    }
    if (t->ne[0] % block != 0) {
        reader_error(r, dims_at,
                     "tensor '%.*s%s' of type %s has rows of %llu values, not a multiple of its "
                     "block of %u",
                     DIAG_NAME(t->name), gguf_type_name(t->type), (unsigned long long)t->ne[0], block);
        return false;
    }
    t->byte_size = elements / block * block_bytes; /* < 2^63 / 1 * 34 / 32: fits */
    return true;
}

static int compare_offsets(const void *x, const void *y) {
    const gguf_tensor *a = *(const gguf_tensor *const *)x, *b = *(const gguf_tensor *const *)y;
    return a->offset < b->offset ? -1 : a->offset > b->offset;
}

/* Checks each tensor's place in the data section and that no two overlap;
 * reports every problem. */
static bool place_tensors(gguf_reader *r) {
    gguf_file *f = r->f;
    uint64_t data_size = f->map_size - f->data_offset;
    bool ok = true;
    for (uint32_t i = 0; i < f->tensor_count; i++) {
        gguf_tensor *t = &f->tensors[i];
        uint64_t end;
        if (t->offset % f->alignment != 0) {
            diag_error(r->d, r->loc,
                       "at byte %llu: tensor '%.*s%s' has data offset %llu, not a multiple of the "
                       "alignment %u",
                       (unsigned long long)t->info_offset, DIAG_NAME(t->name), (unsigned long long)t->offset,
                       f->alignment);
            ok = false;
        } else if (size_add_overflow(t->offset, t->byte_size, &end) || end > data_size) {
            diag_error(
                r->d, r->loc,
                "at byte %llu: tensor '%.*s%s' (%llu bytes at data offset %llu) ends past the end of the "
                "file (the data section holds %llu bytes from byte %llu)",
                (unsigned long long)t->info_offset, DIAG_NAME(t->name), (unsigned long long)t->byte_size,
                (unsigned long long)t->offset, (unsigned long long)data_size,
                (unsigned long long)f->data_offset);
            ok = false;
        } else {
            t->file_offset = f->data_offset + t->offset;
            t->data = (const uint8_t *)f->map + t->file_offset;
        }
    }
    if (!ok) return false;
    /* overlap: neighbours in offset order */
    const gguf_tensor **order = arena_array(&f->arena, f->tensor_count ? f->tensor_count : 1, sizeof *order);
    for (uint32_t i = 0; i < f->tensor_count; i++)
        order[i] = &f->tensors[i];
    qsort(order, f->tensor_count, sizeof *order, compare_offsets);
    for (uint32_t k = 1; k < f->tensor_count; k++) {
        const gguf_tensor *a = order[k - 1], *b = order[k];
        if (a->offset + a->byte_size > b->offset && b->byte_size > 0 && a->byte_size > 0) {
            diag_error(
                r->d, r->loc,
                "at byte %llu: tensor '%.*s%s' (data bytes [%llu, %llu)) overlaps tensor '%.*s%s' (data "
                "bytes [%llu, %llu))",
                (unsigned long long)b->info_offset, DIAG_NAME(b->name), (unsigned long long)b->offset,
                (unsigned long long)(b->offset + b->byte_size), DIAG_NAME(a->name),
                (unsigned long long)a->offset, (unsigned long long)(a->offset + a->byte_size));
            ok = false;
        }
    }
    return ok;
}

/* ---- name tables ------------------------------------------------------------- */

/* A table of 2 * count slots at least (count < 2^30: the caller checks). */
static uint32_t *new_slots(arena *a, uint64_t count, uint32_t *slot_count) {
    uint32_t slots = 8;
    while (slots < 2 * count)
        slots *= 2;
    *slot_count = slots;
    return arena_array(a, slots, sizeof(uint32_t));
}

static const char *kv_name(const gguf_file *f, uint32_t i) { return f->kvs[i].key; }
static const char *tensor_name(const gguf_file *f, uint32_t i) { return f->tensors[i].name; }

/* The slot of `name` in a table whose used slots hold i + 1 for entry i
 * (named name_of(f, i)): the slot holding it, or the empty one where it
 * would go. */
static uint32_t find_slot(const gguf_file *f, const uint32_t *slots, uint32_t slot_count, const char *name,
                          const char *(*name_of)(const gguf_file *, uint32_t)) {
    uint32_t mask = slot_count - 1, s = (uint32_t)st_name_hash(name) & mask;
    while (slots[s] && strcmp(name_of(f, slots[s] - 1), name) != 0)
        s = (s + 1) & mask;
    return s;
}

/* ---- the file ---------------------------------------------------------------- */

bool gguf_is_file(const char *path) {
    struct stat st;
    if (stat(path, &st) != 0 || !S_ISREG(st.st_mode)) return false;
    FILE *fp = fopen(path, "rb");
    char magic[4] = {0};
    bool yes = fp && fread(magic, 1, 4, fp) == 4 && memcmp(magic, gguf_magic, 4) == 0;
    if (fp) fclose(fp);
    return yes;
}

static bool map_file(gguf_file *f, smelt_loc loc, diag_engine *d) {
    st_mapping m;
    if (!st_map_file(f->path, loc, "GGUF", 24,
                     "a GGUF file starts with a 24-byte header (magic, version, tensor and metadata counts): "
                     "truncated?",
                     &m, d))
        return false;
    f->fd = m.fd;
    f->map = m.map;
    f->map_size = m.size;
    return true;
}

static bool read_header(gguf_reader *r) {
    gguf_file *f = r->f;
    const uint8_t *magic = take(r, 4, "the magic");
    if (!magic) return false;
    if (memcmp(magic, gguf_magic, 4) != 0) {
        reader_error(r, 0, "not a GGUF file: it does not start with the magic 'GGUF'");
        return false;
    }
    if (!read_u32(r, &f->version, "the version")) return false;
    if (f->version != 2 && f->version != 3) {
        uint32_t swapped = __builtin_bswap32(f->version);
        reader_error(r, 4, "GGUF version %u; smelt reads versions 2 and 3%s", f->version,
                     f->version == 1 ? " (version 1 is obsolete: convert the model again)"
                     : swapped == 2 || swapped == 3
                         ? " (this is a big-endian GGUF file; smelt reads little-endian ones)"
                         : "");
        return false;
    }
    uint64_t tensor_count, kv_count;
    if (!read_u64(r, &tensor_count, "the tensor count") || !read_u64(r, &kv_count, "the metadata count"))
        return false;
    /* a metadata entry takes at least 13 bytes (key length, one key byte,
     * type, a 1-byte value), a tensor info at least 33 */
    if (kv_count > remaining(r) / 13) {
        reader_error(r, 16, "the metadata count %llu is more than the %llu bytes left can hold",
                     (unsigned long long)kv_count, (unsigned long long)remaining(r));
        return false;
    }
    if (tensor_count > remaining(r) / 33) {
        reader_error(r, 8, "the tensor count %llu is more than the %llu bytes left can hold",
                     (unsigned long long)tensor_count, (unsigned long long)remaining(r));
        return false;
    }
    if (kv_count > GGUF_MAX_COUNT || tensor_count > GGUF_MAX_COUNT) {
        reader_error(r, kv_count > GGUF_MAX_COUNT ? 16 : 8, "%s count %llu is more than smelt reads (%u)",
                     kv_count > GGUF_MAX_COUNT ? "the metadata" : "the tensor",
                     (unsigned long long)(kv_count > GGUF_MAX_COUNT ? kv_count : tensor_count),
                     GGUF_MAX_COUNT);
        return false;
    }
    f->kvs = arena_array(&f->arena, kv_count ? kv_count : 1, sizeof *f->kvs);
    f->kv_slots = new_slots(&f->arena, kv_count, &f->kv_slot_count);
    for (uint64_t i = 0; i < kv_count; i++) {
        gguf_kv *kv = &f->kvs[i];
        if (!read_kv(r, kv)) return false;
        uint32_t s = find_slot(f, f->kv_slots, f->kv_slot_count, kv->key, kv_name);
        if (f->kv_slots[s]) {
            reader_error(r, kv->offset, "metadata key '%.*s%s' appears twice", DIAG_NAME(kv->key));
            return false;
        }
        f->kv_slots[s] = ++f->kv_count;
    }
    if (!read_alignment(r)) return false;
    f->tensors = arena_array(&f->arena, tensor_count ? tensor_count : 1, sizeof *f->tensors);
    f->tensor_slots = new_slots(&f->arena, tensor_count, &f->tensor_slot_count);
    for (uint64_t i = 0; i < tensor_count; i++) {
        gguf_tensor *t = &f->tensors[i];
        if (!read_tensor_info(r, t)) return false;
        uint32_t s = find_slot(f, f->tensor_slots, f->tensor_slot_count, t->name, tensor_name);
        if (f->tensor_slots[s]) {
            reader_error(r, t->info_offset, "tensor '%.*s%s' appears twice", DIAG_NAME(t->name));
            return false;
        }
        f->tensor_slots[s] = ++f->tensor_count;
    }
    uint64_t data = r->at, padded;
    if (size_add_overflow(data, f->alignment - 1, &padded)) padded = UINT64_MAX;
    padded -= padded % f->alignment;
    if (padded > r->size && tensor_count > 0) {
        reader_error(r, r->at,
                     "the file ends before its data section (at byte %llu, the alignment %u after the "
                     "tensor infos)",
                     (unsigned long long)padded, f->alignment);
        return false;
    }
    f->data_offset = padded > r->size ? r->size : padded;
    return true;
}

bool gguf_file_open(const char *path, gguf_file *out, diag_engine *d) {
    memset(out, 0, sizeof *out);
    out->fd = -1;
    arena_init(&out->arena);
    arena_recovery recovery;
    if (arena_recovery_enter(&recovery, setjmp(recovery.where))) {
        gguf_file_close(out);
        diag_error(d, SMELT_NO_LOC, "out of memory reading the GGUF file");
        return false;
    }
    out->path = arena_strdup(&out->arena, path);
    out->diag_file = diag_file_id(d, path);
    smelt_loc loc = {out->diag_file, 0, 0};
    bool ok = map_file(out, loc, d);
    if (ok) {
        gguf_reader r = {.f = out, .d = d, .loc = loc, .bytes = out->map, .size = out->map_size, .ok = true};
        ok = read_header(&r) && place_tensors(&r);
    }
    arena_recovery_leave(&recovery);
    if (!ok) gguf_file_close(out);
    return ok;
}

void gguf_file_close(gguf_file *f) {
    if (f->map) munmap(f->map, (size_t)f->map_size);
    if (f->map && f->fd >= 0) close(f->fd);
    arena_free(&f->arena);
    memset(f, 0, sizeof *f);
    f->fd = -1;
}

const gguf_kv *gguf_file_find_kv(const gguf_file *f, const char *key) {
    if (!f->kv_slot_count) return NULL;
    uint32_t s = find_slot(f, f->kv_slots, f->kv_slot_count, key, kv_name);
    return f->kv_slots[s] ? &f->kvs[f->kv_slots[s] - 1] : NULL;
}

const gguf_tensor *gguf_file_find(const gguf_file *f, const char *name) {
    if (!f->tensor_slot_count) return NULL;
    uint32_t s = find_slot(f, f->tensor_slots, f->tensor_slot_count, name, tensor_name);
    return f->tensor_slots[s] ? &f->tensors[f->tensor_slots[s] - 1] : NULL;
}

/* ---- reading data ------------------------------------------------------------ */

static bool read_bytes(const gguf_file *f, const gguf_tensor *t, void *dst, uint64_t size, uint64_t offset,
                       diag_engine *d) {
    return st_read_file_bytes(f->fd, f->diag_file, t->name, dst, size, offset, d);
}

bool gguf_tensor_read_f32(const gguf_file *f, const gguf_tensor *t, float *dst, uint64_t first,
                          uint64_t count, diag_engine *d) {
    uint32_t block, block_bytes;
    if (!gguf_type_supported(t->type, &block, &block_bytes) || first % block || count % block ||
        first > t->element_count || count > t->element_count - first)
        SMELT_DIE("gguf_tensor_read_f32 of [%llu, +%llu) of '%s'", (unsigned long long)first,
                  (unsigned long long)count, t->name);
    uint64_t offset = t->file_offset + first / block * block_bytes;
    if (t->type == GGUF_TYPE_F32) return read_bytes(f, t, dst, count * 4, offset, d);
    /* the rest through a bounce buffer, a whole number of blocks at a time */
    enum { CHUNK_BYTES = 1 << 16 };
    _Alignas(8) unsigned char chunk[CHUNK_BYTES];
    uint64_t blocks_per_chunk = CHUNK_BYTES / block_bytes;
    for (uint64_t done = 0; done < count; done += blocks_per_chunk * block) {
        uint64_t blocks = (count - done) / block;
        if (blocks > blocks_per_chunk) blocks = blocks_per_chunk;
        if (!read_bytes(f, t, chunk, blocks * block_bytes, offset + done / block * block_bytes, d))
            return false;
        gguf_dequantize(t->type, chunk, dst + done, blocks * block);
    }
    return true;
}
