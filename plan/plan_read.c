/* plan_read.c - opening and validating a plan file, the byte cursor, and the
 * kernel table decoder (the layout is in plan_format.h).
 *
 * Nothing in a plan is trusted before it is checked. plan_open_bytes checks,
 * in this order, so that each failure gets the most useful message:
 *   1. the magic ("not a smelt plan") and the format version (bytes 0..11,
 *      which every format version keeps): "rebuild the plan";
 *   2. that the header and directory are all there, then their checksum;
 *   3. the file size the header promises against the real one ("truncated");
 *   4. every directory entry: known kind, no flags, no duplicate, aligned,
 *      after the directory, inside the file (overflow-safe), no overlap;
 *   5. zero padding, every section's checksum, the content hash.
 */
#include "plan_read.h"

#include "plan_error.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

#define DAMAGED "the file is damaged; rebuild the plan"
#define REBUILD "rebuild the plan with `smelt compile`"

/* Bytes hashed at a time when verifying, so both hashes see each chunk while
 * it is in cache. */
enum { PLAN_HASH_CHUNK = 1 << 20 };

/* ---- Header and directory ------------------------------------------------ */

/* Step 1: magic and version, which are at the same place in every version. */
static bool check_identity(const uint8_t *bytes, size_t size, const char *name, char *error,
                           size_t error_size) {
    if (size == 0) return plan_error(error, error_size, name, "empty file: not a smelt plan");
    size_t magic_bytes = size < PLAN_MAGIC_SIZE ? size : PLAN_MAGIC_SIZE;
    if (memcmp(bytes, PLAN_MAGIC, magic_bytes) != 0)
        return plan_error(error, error_size, name, "not a smelt plan (it does not start with '%s')",
                          PLAN_MAGIC);
    if (size < PLAN_AT_FORMAT_VERSION + 4)
        return plan_error(error, error_size, name,
                          "truncated (only %zu bytes, less than a plan header): " DAMAGED, size);
    uint32_t version = plan_get_u32(bytes + PLAN_AT_FORMAT_VERSION);
    if (version != PLAN_FORMAT_VERSION)
        return plan_error(error, error_size, name,
                          "this plan has format version %" PRIu32
                          " but this smelt reads version %d: " REBUILD,
                          version, PLAN_FORMAT_VERSION);
    return true;
}

/* Step 2: the header and directory are present and their checksum holds. */
static bool check_header(const uint8_t *bytes, size_t size, const char *name, char *error,
                         size_t error_size) {
    if (size < PLAN_HEADER_SIZE)
        return plan_error(error, error_size, name,
                          "truncated (only %zu bytes, less than a plan header): " DAMAGED, size);
    uint32_t count = plan_get_u32(bytes + PLAN_AT_SECTION_COUNT);
    if (count > PLAN_SECTION_KIND_COUNT)
        return plan_error(error, error_size, name,
                          "the header is corrupt (it lists %" PRIu32
                          " sections; there are only %d kinds): " DAMAGED,
                          count, PLAN_SECTION_KIND_COUNT);
    size_t header_bytes = PLAN_HEADER_SIZE + (size_t)count * PLAN_DIRECTORY_ENTRY_SIZE;
    if (size < header_bytes)
        return plan_error(error, error_size, name,
                          "truncated (only %zu bytes, less than its header and section directory): " DAMAGED,
                          size);
    uint8_t copy[PLAN_HEADER_SIZE + PLAN_SECTION_KIND_COUNT * PLAN_DIRECTORY_ENTRY_SIZE];
    memcpy(copy, bytes, header_bytes);
    memset(copy + PLAN_AT_HEADER_CHECKSUM, 0, 8);
    if (XXH64(copy, header_bytes, 0) != plan_get_u64(bytes + PLAN_AT_HEADER_CHECKSUM))
        return plan_error(error, error_size, name, "the header is corrupt (checksum mismatch): " DAMAGED);
    return true;
}

/* Step 4 for one entry: everything that does not involve other entries. */
static bool check_entry(const plan_section_entry *e, uint64_t directory_end, uint64_t file_size,
                        const char *name, char *error, size_t error_size) {
    if (!plan_section_kind_known(e->kind))
        return plan_error(error, error_size, name, "has a section of unknown kind %" PRIu32 ": " REBUILD,
                          e->kind);
    const char *kind = plan_section_kind_name(e->kind);
    if (e->flags != 0)
        return plan_error(error, error_size, name, "section %s has unknown flags 0x%" PRIx32 ": " REBUILD,
                          kind, e->flags);
    uint64_t alignment = plan_section_alignment(e->kind);
    if (e->offset % alignment != 0)
        return plan_error(error, error_size, name,
                          "section %s at offset %" PRIu64 " is not aligned to %" PRIu64 " bytes: " DAMAGED,
                          kind, e->offset, alignment);
    if (e->offset < directory_end)
        return plan_error(error, error_size, name,
                          "section %s at offset %" PRIu64 " overlaps the header and directory: " DAMAGED,
                          kind, e->offset);
    uint64_t end;
    if (__builtin_add_overflow(e->offset, e->size, &end) || end > file_size)
        return plan_error(error, error_size, name,
                          "section %s (offset %" PRIu64 ", %" PRIu64
                          " bytes) runs past the end of the file (%" PRIu64 " bytes): " DAMAGED,
                          kind, e->offset, e->size, file_size);
    return true;
}

static bool zero_bytes(const uint8_t *p, uint64_t size) {
    for (uint64_t i = 0; i < size; i++)
        if (p[i] != 0) return false;
    return true;
}

/* Step 4 across entries (no duplicates, no overlap) and the zero padding. */
static bool check_layout(const plan_file *plan, uint64_t directory_end, const char *name, char *error,
                         size_t error_size) {
    const plan_section_entry *sorted[PLAN_SECTION_KIND_COUNT];
    uint32_t n = plan->section_count;
    for (uint32_t i = 0; i < n; i++) {
        const plan_section_entry *e = &plan->sections[i];
        for (uint32_t j = 0; j < i; j++)
            if (plan->sections[j].kind == e->kind)
                return plan_error(error, error_size, name, "section %s appears twice: " DAMAGED,
                                  plan_section_kind_name(e->kind));
        uint32_t at = i; /* insertion sort by offset: at most 8 entries */
        while (at > 0 && sorted[at - 1]->offset > e->offset) {
            sorted[at] = sorted[at - 1];
            at--;
        }
        sorted[at] = e;
    }
    uint64_t covered = directory_end; /* every byte before this is checked */
    for (uint32_t i = 0; i < n; i++) {
        const plan_section_entry *e = sorted[i];
        if (e->offset < covered)
            return plan_error(error, error_size, name, "sections %s and %s overlap: " DAMAGED,
                              plan_section_kind_name(sorted[i - 1]->kind), plan_section_kind_name(e->kind));
        if (!zero_bytes(plan->bytes + covered, e->offset - covered))
            return plan_error(error, error_size, name, "the padding before section %s is not zero: " DAMAGED,
                              plan_section_kind_name(e->kind));
        covered = e->offset + e->size;
    }
    if (!zero_bytes(plan->bytes + covered, plan->size - covered))
        return plan_error(error, error_size, name,
                          "the padding after the last section is not zero: " DAMAGED);
    return true;
}

/* Step 5: one pass over each section feeds its checksum and the content hash. */
static bool check_contents(const plan_file *plan, const char *name, char *error, size_t error_size) {
    XXH64_state_t *section_hash = XXH64_createState();
    XXH3_state_t *content_hash = XXH3_createState();
    bool ok = section_hash && content_hash && XXH3_128bits_reset(content_hash) == XXH_OK;
    if (!ok) plan_error(error, error_size, name, "out of memory while checking the plan");
    for (uint32_t i = 0; ok && i < plan->section_count; i++) {
        const plan_section_entry *e = &plan->sections[i];
        const uint8_t *data = plan->bytes + e->offset;
        XXH64_reset(section_hash, 0);
        for (uint64_t done = 0; done < e->size;) {
            size_t chunk = e->size - done < PLAN_HASH_CHUNK ? (size_t)(e->size - done) : PLAN_HASH_CHUNK;
            XXH64_update(section_hash, data + done, chunk);
            XXH3_128bits_update(content_hash, data + done, chunk);
            done += chunk;
        }
        uint8_t framing[12];
        plan_put_u32(framing, e->kind);
        plan_put_u64(framing + 4, e->size);
        XXH3_128bits_update(content_hash, framing, sizeof framing);
        if (XXH64_digest(section_hash) != e->checksum)
            ok = plan_error(error, error_size, name, "section %s is corrupt (checksum mismatch): " DAMAGED,
                            plan_section_kind_name(e->kind));
    }
    if (ok) {
        XXH128_hash_t hash = XXH3_128bits_digest(content_hash);
        if (hash.low64 != plan->content_hash_low || hash.high64 != plan->content_hash_high)
            ok =
                plan_error(error, error_size, name, "the content hash does not match the sections: " DAMAGED);
    }
    XXH64_freeState(section_hash);
    XXH3_freeState(content_hash);
    return ok;
}

bool plan_open_bytes(const void *bytes_in, size_t size, const char *name, plan_file *out, char *error,
                     size_t error_size) {
    memset(out, 0, sizeof *out);
    const uint8_t *bytes = bytes_in;
    if (!bytes) size = 0;
    if (!check_identity(bytes, size, name, error, error_size) ||
        !check_header(bytes, size, name, error, error_size))
        return false;

    plan_file plan = {.bytes = bytes, .size = size, .format_version = PLAN_FORMAT_VERSION};
    plan.section_count = plan_get_u32(bytes + PLAN_AT_SECTION_COUNT);
    memcpy(plan.smelt_version, bytes + PLAN_AT_SMELT_VERSION, PLAN_SMELT_VERSION_SIZE);
    plan.smelt_version[PLAN_SMELT_VERSION_SIZE] = '\0';
    plan.content_hash_low = plan_get_u64(bytes + PLAN_AT_CONTENT_HASH_LOW);
    plan.content_hash_high = plan_get_u64(bytes + PLAN_AT_CONTENT_HASH_HIGH);

    uint64_t file_size = plan_get_u64(bytes + PLAN_AT_FILE_SIZE);
    if (file_size > size)
        return plan_error(error, error_size, name,
                          "truncated (it has %zu bytes but its header says %" PRIu64 "): " DAMAGED, size,
                          file_size);
    if (file_size < size)
        return plan_error(error, error_size, name,
                          "has %" PRIu64 " bytes after the end its header gives (%" PRIu64
                          " bytes): " DAMAGED,
                          (uint64_t)size - file_size, file_size);

    uint64_t directory_end = PLAN_HEADER_SIZE + (uint64_t)plan.section_count * PLAN_DIRECTORY_ENTRY_SIZE;
    for (uint32_t i = 0; i < plan.section_count; i++) {
        const uint8_t *p = bytes + PLAN_HEADER_SIZE + (size_t)i * PLAN_DIRECTORY_ENTRY_SIZE;
        plan_section_entry *e = &plan.sections[i];
        e->kind = plan_get_u32(p + PLAN_ENTRY_AT_KIND);
        e->flags = plan_get_u32(p + PLAN_ENTRY_AT_FLAGS);
        e->offset = plan_get_u64(p + PLAN_ENTRY_AT_OFFSET);
        e->size = plan_get_u64(p + PLAN_ENTRY_AT_SIZE);
        e->checksum = plan_get_u64(p + PLAN_ENTRY_AT_CHECKSUM);
        if (!check_entry(e, directory_end, file_size, name, error, error_size)) return false;
    }
    if (!check_layout(&plan, directory_end, name, error, error_size) ||
        !check_contents(&plan, name, error, error_size))
        return false;
    *out = plan;
    return true;
}

bool plan_open(const char *path, plan_file *out, char *error, size_t error_size) {
    memset(out, 0, sizeof *out);
    /* O_NONBLOCK: opening a FIFO must not wait for a writer; it is then
     * refused as not a regular file. */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return plan_error(error, error_size, path, "cannot open: %s", strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int saved = errno;
        close(fd);
        return plan_error(error, error_size, path, "cannot stat: %s", strerror(saved));
    }
    if (!S_ISREG(st.st_mode)) {
        close(fd);
        return plan_error(error, error_size, path, "not a regular file: not a smelt plan");
    }
    if (st.st_size == 0) {
        close(fd);
        return plan_open_bytes(NULL, 0, path, out, error, error_size);
    }
    if ((uint64_t)st.st_size > SIZE_MAX) {
        close(fd);
        return plan_error(error, error_size, path, "too large to map on this machine");
    }
    size_t size = (size_t)st.st_size;
    void *map = mmap(NULL, size, PROT_READ, MAP_PRIVATE, fd, 0);
    int saved = errno;
    close(fd); /* the mapping keeps the file */
    if (map == MAP_FAILED) return plan_error(error, error_size, path, "cannot map: %s", strerror(saved));
    if (!plan_open_bytes(map, size, path, out, error, error_size)) {
        munmap(map, size);
        return false;
    }
    out->mapped = true;
    return true;
}

void plan_close(plan_file *plan) {
    if (plan->mapped && plan->bytes) munmap((void *)plan->bytes, plan->size);
    memset(plan, 0, sizeof *plan);
}

bool plan_section(const plan_file *plan, plan_section_kind kind, const uint8_t **data, uint64_t *size) {
    for (uint32_t i = 0; i < plan->section_count; i++) {
        if (plan->sections[i].kind != (uint32_t)kind) continue;
        *data = plan->bytes + plan->sections[i].offset;
        *size = plan->sections[i].size;
        return true;
    }
    *data = NULL;
    *size = 0;
    return false;
}

void plan_content_hash_hex(const plan_file *plan, char hex[33]) {
    snprintf(hex, 33, "%016" PRIx64 "%016" PRIx64, plan->content_hash_high, plan->content_hash_low);
}

/* ---- Cursor -------------------------------------------------------------- */

void plan_cursor_init(plan_cursor *c, const uint8_t *data, uint64_t size) {
    c->start = c->at = data;
    c->end = data ? data + size : data;
    c->failed = false;
    c->failed_at = 0;
}

/* Takes `size` bytes or fails the cursor; the one place that checks bounds. */
static const uint8_t *take(plan_cursor *c, uint64_t size) {
    if (c->failed) return NULL;
    if (size > plan_cursor_left(c)) {
        c->failed = true;
        c->failed_at = plan_cursor_offset(c);
        return NULL;
    }
    const uint8_t *p = c->at;
    c->at += size;
    return p;
}

bool plan_cursor_u32(plan_cursor *c, uint32_t *out) {
    const uint8_t *p = take(c, 4);
    *out = p ? plan_get_u32(p) : 0;
    return p != NULL;
}

bool plan_cursor_u64(plan_cursor *c, uint64_t *out) {
    const uint8_t *p = take(c, 8);
    *out = p ? plan_get_u64(p) : 0;
    return p != NULL;
}

bool plan_cursor_i64(plan_cursor *c, int64_t *out) {
    uint64_t v;
    bool ok = plan_cursor_u64(c, &v);
    memcpy(out, &v, sizeof *out); /* two's complement, without an out-of-range conversion */
    return ok;
}

bool plan_cursor_bytes(plan_cursor *c, uint64_t size, const uint8_t **out) {
    *out = take(c, size);
    return *out != NULL;
}

bool plan_cursor_blob(plan_cursor *c, plan_blob *out) {
    uint64_t size;
    const uint8_t *data = NULL;
    bool ok = plan_cursor_u64(c, &size) && plan_cursor_bytes(c, size, &data);
    *out = ok ? (plan_blob){data, size} : (plan_blob){NULL, 0};
    return ok;
}

bool plan_cursor_text(plan_cursor *c, plan_text *out) {
    plan_blob blob;
    bool ok = plan_cursor_blob(c, &blob);
    *out = (plan_text){(const char *)blob.data, blob.size};
    return ok;
}

/* ---- Kernel table -------------------------------------------------------- */

/* The fewest bytes each encoded item can take, to refuse counts that cannot
 * fit before looping over them. */
enum {
    MIN_KERNEL_BYTES = 4 * 8 + 6 * 3 * 8 + 8 + 4 + 4 + 4,
    MIN_RESOURCE_BYTES = 8 + 4 + 4 * 8,
    MIN_BINARY_BYTES = 8 + 4 + 8,
};

typedef struct kernel_decoder {
    plan_cursor cursor;
    char *error;
    size_t error_size;
    uint32_t kernel; /* index of the kernel being read, for messages */
} kernel_decoder;

static bool decode_fail(kernel_decoder *d, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static bool decode_fail(kernel_decoder *d, const char *fmt, ...) {
    if (!d->error || d->error_size == 0) return false;
    int used = snprintf(d->error, d->error_size, "kernel table: kernel %" PRIu32 ": ", d->kernel);
    if (used < 0 || (size_t)used >= d->error_size) return false;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->error + used, d->error_size - (size_t)used, fmt, ap);
    va_end(ap);
    return false;
}

static bool cut_off(kernel_decoder *d, const char *what) {
    return decode_fail(d, "%s is cut off at byte %" PRIu64 " of the %" PRIu64 "-byte section", what,
                       d->cursor.failed_at, (uint64_t)(d->cursor.end - d->cursor.start));
}

static bool read_u32(kernel_decoder *d, uint32_t *out, const char *what) {
    return plan_cursor_u32(&d->cursor, out) || cut_off(d, what);
}

static bool read_u64(kernel_decoder *d, uint64_t *out, const char *what) {
    return plan_cursor_u64(&d->cursor, out) || cut_off(d, what);
}

/* A (u64 length, bytes) field; a length past the end says so. Like the cursor
 * readers, it and read_text write `out` on every path ({NULL, 0} on failure). */
static bool read_blob(kernel_decoder *d, plan_blob *out, const char *what) {
    *out = (plan_blob){NULL, 0};
    uint64_t length;
    if (!read_u64(d, &length, what)) return false;
    if (length > plan_cursor_left(&d->cursor))
        return decode_fail(d, "%s claims %" PRIu64 " bytes but only %" PRIu64 " are left in the section",
                           what, length, plan_cursor_left(&d->cursor));
    const uint8_t *data;
    plan_cursor_bytes(&d->cursor, length, &data);
    *out = (plan_blob){data, length};
    return true;
}

static bool read_text(kernel_decoder *d, plan_text *out, const char *what) {
    plan_blob blob;
    bool ok = read_blob(d, &blob, what);
    *out = (plan_text){(const char *)blob.data, blob.size};
    return ok;
}

/* A count of items of at least `min_bytes` each, refused if they cannot fit. */
static bool read_count(kernel_decoder *d, uint32_t *out, uint64_t min_bytes, const char *what) {
    if (!read_u32(d, out, what)) return false;
    if (*out > plan_cursor_left(&d->cursor) / min_bytes)
        return decode_fail(d, "%s is %" PRIu32 " but only %" PRIu64 " bytes are left in the section", what,
                           *out, plan_cursor_left(&d->cursor));
    return true;
}

static bool read_affine(kernel_decoder *d, plan_affine *rule, const char *what) {
    if (!plan_cursor_i64(&d->cursor, &rule->a) || !plan_cursor_i64(&d->cursor, &rule->b) ||
        !plan_cursor_i64(&d->cursor, &rule->c))
        return cut_off(d, what);
    if (rule->c < 1)
        return decode_fail(d, "%s divides by %" PRId64 " (it must divide by 1 or more)", what, rule->c);
    return true;
}

static bool read_launch(kernel_decoder *d, plan_launch_rule *launch) {
    static const char *const names[6] = {"grid.x", "grid.y", "grid.z", "block.x", "block.y", "block.z"};
    for (int i = 0; i < 3; i++)
        if (!read_affine(d, &launch->grid[i], names[i])) return false;
    for (int i = 0; i < 3; i++)
        if (!read_affine(d, &launch->block[i], names[3 + i])) return false;
    return read_u64(d, &launch->dynamic_shared_bytes, "dynamic shared bytes");
}

/* The parameters the kernel declares: how many, their kinds, extents, access. */
static bool read_params(kernel_decoder *d, plan_kernel *k) {
    if (!read_u32(d, &k->param_count, "parameter count")) return false;
    if (k->param_count > PLAN_MAX_KERNEL_PARAMS)
        return decode_fail(d, "declares %" PRIu32 " parameters (at most %d)", k->param_count,
                           PLAN_MAX_KERNEL_PARAMS);
    for (uint32_t p = 0; p < k->param_count; p++) {
        plan_kernel_param *param = &k->params[p];
        if (!read_u32(d, &param->kind, "parameter kind") ||
            !read_affine(d, &param->extent, "parameter extent") ||
            !read_u32(d, &param->writes, "parameter access"))
            return false;
        if (param->kind > 1 || param->writes > 1)
            return decode_fail(
                d, "parameter %" PRIu32 " has kind %" PRIu32 " and access %" PRIu32 " (expected 0 or 1 each)",
                p, param->kind, param->writes);
    }
    return true;
}

static bool read_resources(kernel_decoder *d, plan_kernel_resources *r) {
    return read_text(d, &r->arch, "resource arch") && read_u32(d, &r->registers, "registers") &&
           read_u64(d, &r->shared_bytes, "shared bytes") && read_u64(d, &r->stack_bytes, "stack bytes") &&
           read_u64(d, &r->spill_store_bytes, "spill stores") &&
           read_u64(d, &r->spill_load_bytes, "spill loads");
}

static bool read_binary(kernel_decoder *d, plan_kernel_binary *b) {
    if (!read_text(d, &b->arch, "binary arch") || !read_u32(d, &b->kind, "binary kind")) return false;
    if (b->kind != PLAN_BINARY_CUBIN && b->kind != PLAN_BINARY_PTX)
        return decode_fail(d, "binary for '%.*s' has unknown kind %" PRIu32,
                           (int)(b->arch.length < 64 ? b->arch.length : 64), b->arch.data, b->kind);
    return read_blob(d, &b->bytes, "binary");
}

/* Reads one kernel. With resources/binaries NULL it only validates and
 * counts (the first pass); otherwise it fills them (the second). */
static bool read_kernel(kernel_decoder *d, plan_kernel *k, plan_kernel_resources *resources,
                        plan_kernel_binary *binaries) {
    if (!read_text(d, &k->name, "name")) return false;
    if (k->name.length == 0) return decode_fail(d, "has an empty name");
    if (!read_text(d, &k->family, "family") || !read_text(d, &k->ops, "ops") ||
        !read_text(d, &k->source, "source") || !read_launch(d, &k->launch) || !read_params(d, k) ||
        !read_count(d, &k->resource_count, MIN_RESOURCE_BYTES, "resource count"))
        return false;
    for (uint32_t i = 0; i < k->resource_count; i++) {
        plan_kernel_resources scratch;
        if (!read_resources(d, resources ? &resources[i] : &scratch)) return false;
    }
    if (!read_count(d, &k->binary_count, MIN_BINARY_BYTES, "binary count")) return false;
    for (uint32_t i = 0; i < k->binary_count; i++) {
        plan_kernel_binary scratch;
        if (!read_binary(d, binaries ? &binaries[i] : &scratch)) return false;
    }
    k->resources = resources;
    k->binaries = binaries;
    return true;
}

bool plan_kernel_table_decode(const uint8_t *data, uint64_t size, plan_kernel_table *out, char *error,
                              size_t error_size) {
    memset(out, 0, sizeof *out);
    kernel_decoder d = {.error = error, .error_size = error_size};

    /* Pass 1: validate everything and count what to allocate. */
    plan_cursor_init(&d.cursor, data, size);
    uint32_t count;
    if (!plan_cursor_u32(&d.cursor, &count)) {
        if (error && error_size) snprintf(error, error_size, "kernel table: the kernel count is cut off");
        return false;
    }
    if (count > plan_cursor_left(&d.cursor) / MIN_KERNEL_BYTES) {
        if (error && error_size)
            snprintf(error, error_size, "kernel table: %" PRIu32 " kernels cannot fit in %" PRIu64 " bytes",
                     count, plan_cursor_left(&d.cursor));
        return false;
    }
    uint64_t resource_total = 0, binary_total = 0;
    for (d.kernel = 0; d.kernel < count; d.kernel++) {
        plan_kernel k;
        if (!read_kernel(&d, &k, NULL, NULL)) return false;
        resource_total += k.resource_count; /* bounded by the section size */
        binary_total += k.binary_count;
    }
    if (plan_cursor_left(&d.cursor) != 0) {
        if (error && error_size)
            snprintf(error, error_size, "kernel table: %" PRIu64 " unexpected bytes after the last kernel",
                     plan_cursor_left(&d.cursor));
        return false;
    }

    if (count == 0) return true; /* an empty table owns nothing */

    /* One allocation for the three arrays; every element holds 8-byte fields,
     * so each array starts aligned. */
    uint64_t kernel_bytes, resource_bytes, binary_bytes, total;
    if (__builtin_mul_overflow((uint64_t)count, sizeof(plan_kernel), &kernel_bytes) ||
        __builtin_mul_overflow(resource_total, sizeof(plan_kernel_resources), &resource_bytes) ||
        __builtin_mul_overflow(binary_total, sizeof(plan_kernel_binary), &binary_bytes) ||
        __builtin_add_overflow(kernel_bytes, resource_bytes, &total) ||
        __builtin_add_overflow(total, binary_bytes, &total) || total > SIZE_MAX) {
        if (error && error_size) snprintf(error, error_size, "kernel table: too large for this machine");
        return false;
    }
    uint8_t *storage = calloc(1, (size_t)total); /* total > 0: count > 0 */
    if (!storage) {
        if (error && error_size) snprintf(error, error_size, "kernel table: out of memory");
        return false;
    }
    plan_kernel *kernels = (plan_kernel *)storage;
    plan_kernel_resources *resources = (plan_kernel_resources *)(storage + kernel_bytes);
    plan_kernel_binary *binaries = (plan_kernel_binary *)(storage + kernel_bytes + resource_bytes);

    /* Pass 2: the same reads, now filling the arrays; it cannot fail. */
    plan_cursor_init(&d.cursor, data, size);
    plan_cursor_u32(&d.cursor, &count);
    for (d.kernel = 0; d.kernel < count; d.kernel++) {
        if (!read_kernel(&d, &kernels[d.kernel], resources, binaries)) {
            free(storage);
            return false;
        }
        resources += kernels[d.kernel].resource_count;
        binaries += kernels[d.kernel].binary_count;
    }
    out->count = count;
    out->kernels = kernels;
    out->storage = storage;
    return true;
}

void plan_kernel_table_free(plan_kernel_table *table) {
    free(table->storage);
    memset(table, 0, sizeof *table);
}

bool plan_affine_eval(plan_affine rule, int64_t tokens, int64_t *out) {
    int64_t product, numerator;
    if (rule.c < 1 || __builtin_mul_overflow(rule.a, tokens, &product) ||
        __builtin_add_overflow(product, rule.b, &numerator) || numerator < 0)
        return false;
    *out = numerator / rule.c + (numerator % rule.c != 0);
    return true;
}
