/* kernel_cache.c - on-disk cache of compiled kernels and host objects,
 * keyed by XXH3-128; entries are written atomically and checked on every
 * read (see kernel_cache.h for the layout and the rules). */
#include "kernel_cache.h"

#include "arena.h"

#include <errno.h>
#include <fcntl.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

enum {
    HEADER_SIZE = 56,
    FOLDER_MAX = 4096,
    WARNING_MAX = 512 + FOLDER_MAX,
};
/* An entry file larger than this is not ours (cubins are megabytes). */
#define ENTRY_MAX_BYTES ((uint64_t)1 << 31)

static const char entry_magic[8] = {'s', 'm', 'e', 'l', 't', 'k', 'c', '\0'};

struct cg_cache {
    char folder[FOLDER_MAX]; /* "" when there is none */
    pthread_mutex_t lock;    /* guards everything below */
    bool writable;           /* false after the first failed store */
    bool folder_created;
    char warning[WARNING_MAX]; /* "" until something goes wrong */
    cg_cache_stats stats;
};

/* NULL when out of memory: every caller has a way to fail (a miss, a failed
 * store, a key no entry matches). */
static void *allocate(size_t size) { return malloc(size ? size : 1); }

/* ---- little-endian fields ----------------------------------------------- */

static void put_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static void put_u64(uint8_t *p, uint64_t v) {
    for (int i = 0; i < 8; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}
static uint32_t get_u32(const uint8_t *p) {
    uint32_t v = 0;
    for (int i = 0; i < 4; i++)
        v |= (uint32_t)p[i] << (8 * i);
    return v;
}
static uint64_t get_u64(const uint8_t *p) {
    uint64_t v = 0;
    for (int i = 0; i < 8; i++)
        v |= (uint64_t)p[i] << (8 * i);
    return v;
}

/* ---- keys ---------------------------------------------------------------- */

struct cg_cache_hasher {
    XXH3_state_t *state; /* NULL: out of memory, the key will be unusable */
};

/* The hasher handed out when there is no memory for one; its key is
 * unusable_key, which the cache neither loads nor stores. */
static cg_cache_hasher no_memory_hasher;
static const cg_cache_key unusable_key = {
    {0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}};

static bool key_usable(const cg_cache_key *key) {
    return memcmp(key->bytes, unusable_key.bytes, sizeof key->bytes) != 0;
}

bool cg_cache_key_usable(const cg_cache_key *key) { return key_usable(key); }

cg_cache_hasher *cg_cache_hasher_begin(cg_cache_kind kind) {
    cg_cache_hasher *h = allocate(sizeof *h);
    if (!h) return &no_memory_hasher;
    h->state = XXH3_createState();
    if (!h->state) {
        free(h);
        return &no_memory_hasher;
    }
    XXH3_128bits_reset(h->state);
    cg_cache_hash_u64(h, CG_CACHE_FORMAT_VERSION);
    cg_cache_hash_u64(h, (uint64_t)kind);
    return h;
}

void cg_cache_hash_bytes(cg_cache_hasher *h, const void *data, size_t size) {
    cg_cache_hash_u64(h, size);
    if (size && h->state) XXH3_128bits_update(h->state, data, size);
}

void cg_cache_hash_u64(cg_cache_hasher *h, uint64_t value) {
    uint8_t bytes[8];
    put_u64(bytes, value);
    if (h->state) XXH3_128bits_update(h->state, bytes, sizeof bytes);
}

void cg_cache_hash_string(cg_cache_hasher *h, const char *s) {
    cg_cache_hash_u64(h, s ? 1 : 0);
    if (s) cg_cache_hash_bytes(h, s, strlen(s));
}

cg_cache_key cg_cache_hasher_finish(cg_cache_hasher *h) {
    if (!h->state) return unusable_key;
    XXH128_canonical_t canonical;
    XXH128_canonicalFromHash(&canonical, XXH3_128bits_digest(h->state));
    XXH3_freeState(h->state);
    free(h);
    cg_cache_key key;
    _Static_assert(sizeof canonical.digest == sizeof key.bytes, "XXH3-128 is 16 bytes");
    memcpy(key.bytes, canonical.digest, sizeof key.bytes);
    if (!key_usable(&key)) key.bytes[15] = 0xfe; /* one in 2^128: keep the sentinel unique */
    return key;
}

void cg_cache_key_hex(const cg_cache_key *key, char out[33]) {
    static const char digits[] = "0123456789abcdef";
    for (int i = 0; i < 16; i++) {
        out[2 * i] = digits[key->bytes[i] >> 4];
        out[2 * i + 1] = digits[key->bytes[i] & 15];
    }
    out[32] = '\0';
}

cg_cache_key cg_kernel_cache_key(const cg_compile_request *req) {
    cg_cache_hasher *h = cg_cache_hasher_begin(CG_CACHE_KERNEL);
    int major = 0, minor = 0;
    cg_nvrtc_version(&major, &minor);
    cg_cache_hash_u64(h, (uint64_t)major);
    cg_cache_hash_u64(h, (uint64_t)minor);
    cg_cache_hash_u64(h, (uint64_t)(int64_t)req->arch);
    cg_cache_hash_u64(h, req->want_cubin);
    cg_cache_hash_u64(h, req->want_ptx);
    cg_fixed_options fixed;
    cg_nvrtc_fixed_options(req, &fixed);
    cg_cache_hash_u64(h, fixed.count + req->extra_option_count);
    for (size_t i = 0; i < fixed.count; i++)
        cg_cache_hash_string(h, fixed.options[i]);
    for (size_t i = 0; i < req->extra_option_count; i++)
        cg_cache_hash_string(h, req->extra_options ? req->extra_options[i] : NULL);
    /* With -lineinfo the program name ("<kernel>.cu") is written into the
     * output; without it the name only shows in error messages. */
    cg_cache_hash_string(h, req->line_info ? req->kernel_name : NULL);
    cg_cache_hash_string(h, req->source);
    cg_cache_hash_u64(h, req->header_count);
    for (size_t i = 0; i < req->header_count && req->headers; i++) {
        cg_cache_hash_string(h, req->headers[i].name);
        cg_cache_hash_string(h, req->headers[i].text);
    }
    return cg_cache_hasher_finish(h);
}

/* ---- the folder -------------------------------------------------------- */

/* Copies base + suffix into out; false when it does not fit. */
static bool join(char *out, size_t size, const char *base, const char *suffix) {
    int n = snprintf(out, size, "%s%s", base, suffix);
    return n >= 0 && (size_t)n < size;
}

bool cg_cache_default_folder(char *out, size_t size) {
    const char *explicit_folder = getenv("SMELT_CACHE_DIR");
    if (explicit_folder && explicit_folder[0]) return join(out, size, explicit_folder, "");
    /* The XDG spec says a relative XDG_CACHE_HOME is to be ignored. */
    const char *xdg = getenv("XDG_CACHE_HOME");
    if (xdg && xdg[0] == '/') return join(out, size, xdg, "/smelt");
    const char *home = getenv("HOME");
    if (home && home[0]) return join(out, size, home, "/.cache/smelt");
    if (size) out[0] = '\0';
    return false;
}

static void warn_once(cg_cache *cache, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
/* Records the first reason entries are not kept; the caller holds the lock. */
static void warn_once(cg_cache *cache, const char *fmt, ...) {
    if (cache->warning[0]) return;
    va_list args;
    va_start(args, fmt);
    vsnprintf(cache->warning, sizeof cache->warning, fmt, args);
    va_end(args);
}

cg_cache *cg_cache_open(const char *folder) {
    cg_cache *cache = allocate(sizeof *cache);
    if (!cache) return NULL; /* compiling without a cache, as with --no-cache */
    memset(cache, 0, sizeof *cache);
    pthread_mutex_init(&cache->lock, NULL);
    cache->writable = true;
    bool named = folder ? join(cache->folder, sizeof cache->folder, folder, "")
                        : cg_cache_default_folder(cache->folder, sizeof cache->folder);
    if (!named || !cache->folder[0]) {
        cache->folder[0] = '\0';
        cache->writable = false;
        warn_once(cache, "kernel cache disabled: no folder for it (set SMELT_CACHE_DIR or HOME); "
                         "compiling without it");
    }
    return cache;
}

void cg_cache_close(cg_cache *cache) {
    if (!cache) return;
    pthread_mutex_destroy(&cache->lock);
    free(cache);
}

const char *cg_cache_folder(const cg_cache *cache) { return cache->folder; }

const char *cg_cache_warning(cg_cache *cache) {
    pthread_mutex_lock(&cache->lock);
    const char *w = cache->warning[0] ? cache->warning : NULL;
    pthread_mutex_unlock(&cache->lock);
    return w;
}

cg_cache_stats cg_cache_get_stats(cg_cache *cache) {
    pthread_mutex_lock(&cache->lock);
    cg_cache_stats s = cache->stats;
    pthread_mutex_unlock(&cache->lock);
    return s;
}

/* mkdir -p with mode 0700; errno is kept from the failing mkdir. */
static bool make_folders(const char *path) {
    char partial[FOLDER_MAX];
    if (!join(partial, sizeof partial, path, "")) {
        errno = ENAMETOOLONG;
        return false;
    }
    size_t length = strlen(partial);
    for (size_t i = 1; i <= length; i++) {
        if (partial[i] != '/' && partial[i] != '\0') continue;
        char saved = partial[i];
        partial[i] = '\0';
        if (mkdir(partial, 0700) != 0 && errno != EEXIST) return false;
        partial[i] = saved;
    }
    struct stat st;
    if (stat(path, &st) != 0) return false;
    if (!S_ISDIR(st.st_mode)) {
        errno = ENOTDIR;
        return false;
    }
    return true;
}

static bool entry_path(const cg_cache *cache, const cg_cache_key *key, char *out, size_t size) {
    char hex[33];
    cg_cache_key_hex(key, hex);
    int n = snprintf(out, size, "%s/%s", cache->folder, hex);
    return n >= 0 && (size_t)n < size;
}

/* ---- reading ----------------------------------------------------------- */

/* Reads the whole file at `path` if it is a plausible entry; NULL if not. */
static uint8_t *read_entry_file(const char *path, size_t *size) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return NULL;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size < HEADER_SIZE ||
        (uint64_t)st.st_size > ENTRY_MAX_BYTES) {
        close(fd);
        return NULL;
    }
    size_t total = (size_t)st.st_size;
    uint8_t *bytes = allocate(total);
    if (!bytes) {
        close(fd);
        return NULL;
    }
    size_t done = 0;
    while (done < total) {
        ssize_t n = read(fd, bytes + done, total - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        done += (size_t)n;
    }
    close(fd);
    if (done != total) {
        free(bytes);
        return NULL;
    }
    *size = total;
    return bytes;
}

/* Checks an entry's header, checksum and blob list; fills blobs. */
static bool parse_entry(const uint8_t *bytes, size_t size, const cg_cache_key *key, cg_cache_kind kind,
                        cg_cache_entry *out) {
    if (size < HEADER_SIZE || memcmp(bytes, entry_magic, sizeof entry_magic) != 0) return false;
    if (get_u32(bytes + 8) != CG_CACHE_FORMAT_VERSION || get_u32(bytes + 12) != (uint32_t)kind) return false;
    if (memcmp(bytes + 16, key->bytes, sizeof key->bytes) != 0) return false;
    uint32_t blob_count = get_u32(bytes + 32);
    uint64_t payload_size = get_u64(bytes + 40);
    if (blob_count > CG_CACHE_MAX_BLOBS || payload_size != size - HEADER_SIZE) return false;
    const uint8_t *payload = bytes + HEADER_SIZE;
    if (XXH64(payload, (size_t)payload_size, 0) != get_u64(bytes + 48)) return false;
    uint64_t offset = 0;
    for (uint32_t i = 0; i < blob_count; i++) {
        if (payload_size - offset < 8) return false;
        uint64_t blob_size = get_u64(payload + offset);
        offset += 8;
        if (blob_size > payload_size - offset) return false;
        out->blobs[i].data = payload + offset;
        out->blobs[i].size = (size_t)blob_size;
        offset += blob_size;
    }
    if (offset != payload_size) return false;
    out->blob_count = blob_count;
    return true;
}

/* Reads and checks the entry of `key`; *present tells whether a file was
 * there at all. Counts nothing. */
static bool load_entry(cg_cache *cache, const cg_cache_key *key, cg_cache_kind kind, cg_cache_entry *out,
                       bool *present) {
    memset(out, 0, sizeof *out);
    *present = false;
    char path[FOLDER_MAX + 64];
    if (!cache->folder[0] || !key_usable(key) || !entry_path(cache, key, path, sizeof path)) return false;
    *present = access(path, F_OK) == 0;
    size_t size = 0;
    uint8_t *bytes = *present ? read_entry_file(path, &size) : NULL;
    if (!bytes || !parse_entry(bytes, size, key, kind, out)) {
        free(bytes);
        memset(out, 0, sizeof *out);
        return false;
    }
    out->payload = bytes;
    out->payload_size = size;
    return true;
}

static void count_lookup(cg_cache *cache, bool hit, bool rejected) {
    pthread_mutex_lock(&cache->lock);
    if (hit)
        cache->stats.hits++;
    else
        cache->stats.misses++;
    if (rejected) cache->stats.rejected_entries++;
    pthread_mutex_unlock(&cache->lock);
}

bool cg_cache_load(cg_cache *cache, const cg_cache_key *key, cg_cache_kind kind, cg_cache_entry *out) {
    bool present;
    bool hit = load_entry(cache, key, kind, out, &present);
    count_lookup(cache, hit, present && !hit);
    return hit;
}

void cg_cache_entry_free(cg_cache_entry *entry) {
    free(entry->payload);
    memset(entry, 0, sizeof *entry);
}

/* ---- writing ----------------------------------------------------------- */

static bool write_all(int fd, const void *data, size_t size) {
    const uint8_t *p = data;
    while (size > 0) {
        ssize_t n = write(fd, p, size);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        p += n;
        size -= (size_t)n;
    }
    return true;
}

/* Writes the entry to a temporary file beside its final name, syncs it and
 * renames it into place. errno tells why on failure. */
static bool write_entry(const cg_cache *cache, const cg_cache_key *key, cg_cache_kind kind,
                        const cg_cache_blob *blobs, uint32_t blob_count) {
    char path[FOLDER_MAX + 64], temporary[FOLDER_MAX + 96];
    char hex[33];
    cg_cache_key_hex(key, hex);
    if (!entry_path(cache, key, path, sizeof path) ||
        snprintf(temporary, sizeof temporary, "%s/.tmp-%s-XXXXXX", cache->folder, hex) >=
            (int)sizeof temporary) {
        errno = ENAMETOOLONG;
        return false;
    }
    uint64_t payload_size = 0;
    for (uint32_t i = 0; i < blob_count; i++)
        if (size_add_overflow(payload_size, 8, &payload_size) ||
            size_add_overflow(payload_size, blobs[i].size, &payload_size)) {
            errno = EFBIG;
            return false;
        }
    if (payload_size > ENTRY_MAX_BYTES - HEADER_SIZE) {
        errno = EFBIG;
        return false;
    }
    /* The payload is built in memory once: the checksum needs all of it. */
    uint8_t *file = allocate(HEADER_SIZE + (size_t)payload_size);
    if (!file) {
        errno = ENOMEM;
        return false;
    }
    uint8_t *payload = file + HEADER_SIZE;
    size_t offset = 0;
    for (uint32_t i = 0; i < blob_count; i++) {
        put_u64(payload + offset, blobs[i].size);
        offset += 8;
        if (blobs[i].size) memcpy(payload + offset, blobs[i].data, blobs[i].size);
        offset += blobs[i].size;
    }
    memcpy(file, entry_magic, sizeof entry_magic);
    put_u32(file + 8, CG_CACHE_FORMAT_VERSION);
    put_u32(file + 12, (uint32_t)kind);
    memcpy(file + 16, key->bytes, sizeof key->bytes);
    put_u32(file + 32, blob_count);
    put_u32(file + 36, 0);
    put_u64(file + 40, payload_size);
    put_u64(file + 48, XXH64(payload, (size_t)payload_size, 0));

    int fd = mkstemp(temporary);
    bool ok = fd >= 0;
    ok = ok && write_all(fd, file, HEADER_SIZE + (size_t)payload_size);
    ok = ok && fsync(fd) == 0;
    int saved = errno;
    if (fd >= 0 && close(fd) != 0 && ok) {
        ok = false;
        saved = errno;
    }
    if (ok && rename(temporary, path) != 0) {
        ok = false;
        saved = errno;
    }
    if (!ok && fd >= 0) unlink(temporary);
    free(file);
    errno = saved;
    return ok;
}

bool cg_cache_store(cg_cache *cache, const cg_cache_key *key, cg_cache_kind kind, const cg_cache_blob *blobs,
                    uint32_t blob_count) {
    if (blob_count > CG_CACHE_MAX_BLOBS) SMELT_DIE("cache entry with %u blobs", blob_count);
    if (!key_usable(key)) return false;
    pthread_mutex_lock(&cache->lock);
    bool writable = cache->writable;
    if (writable && !cache->folder_created) {
        if (make_folders(cache->folder)) {
            cache->folder_created = true;
        } else {
            warn_once(cache, "kernel cache '%s' cannot be created (%s); compiling without caching",
                      cache->folder, strerror(errno));
            cache->writable = writable = false;
        }
    }
    pthread_mutex_unlock(&cache->lock);
    bool ok = writable && write_entry(cache, key, kind, blobs, blob_count);
    int saved = errno;
    pthread_mutex_lock(&cache->lock);
    if (ok) {
        cache->stats.stores++;
    } else {
        cache->stats.store_failures++;
        if (writable) {
            warn_once(cache, "kernel cache '%s' is not writable (%s); compiling without caching",
                      cache->folder, strerror(saved));
            cache->writable = false;
        }
    }
    pthread_mutex_unlock(&cache->lock);
    return ok;
}

/* ---- kernels through the cache ----------------------------------------------- */

enum { KERNEL_BLOB_CUBIN, KERNEL_BLOB_PTX, KERNEL_BLOB_LOG, KERNEL_BLOB_COUNT };

static char *text_from_blob(const cg_cache_blob *blob) {
    char *text = allocate(blob->size + 1);
    if (!text) return NULL;
    if (blob->size) memcpy(text, blob->data, blob->size);
    text[blob->size] = '\0';
    return text;
}

/* Rebuilds a compile result from an entry; false if the entry does not hold
 * what the request wants (then it is treated as a miss). */
static bool compiled_from_entry(const cg_compile_request *req, const cg_cache_entry *entry,
                                cg_compiled *out) {
    memset(out, 0, sizeof *out);
    if (entry->blob_count != KERNEL_BLOB_COUNT) return false;
    const cg_cache_blob *cubin = &entry->blobs[KERNEL_BLOB_CUBIN], *ptx = &entry->blobs[KERNEL_BLOB_PTX];
    if ((cubin->size > 0) != req->want_cubin || (ptx->size > 0) != req->want_ptx) return false;
    /* Out of memory here is a miss: the kernel is compiled again. */
    if (req->want_cubin) {
        out->cubin = allocate(cubin->size);
        if (!out->cubin) return false;
        memcpy(out->cubin, cubin->data, cubin->size);
        out->cubin_size = cubin->size;
    }
    if (req->want_ptx) {
        out->ptx = text_from_blob(ptx);
        if (!out->ptx) {
            cg_compiled_free(out);
            return false;
        }
        out->ptx_size = strlen(out->ptx);
    }
    out->log = text_from_blob(&entry->blobs[KERNEL_BLOB_LOG]);
    if (!out->log) {
        cg_compiled_free(out);
        return false;
    }
    if (!cg_parse_ptxas_log(out->log, &out->resources)) {
        cg_compiled_free(out);
        return false;
    }
    return true;
}

bool cg_compile_kernel_cached_with_key(cg_cache *cache, const cg_compile_request *req,
                                       const cg_cache_key *key, cg_compiled *out, bool *from_cache,
                                       char *error, size_t error_size) {
    if (from_cache) *from_cache = false;
    if (cache) {
        cg_cache_entry entry;
        bool present;
        bool hit = load_entry(cache, key, CG_CACHE_KERNEL, &entry, &present);
        /* a well-formed entry without what the request wants is no hit either */
        hit = hit && compiled_from_entry(req, &entry, out);
        cg_cache_entry_free(&entry);
        count_lookup(cache, hit, present && !hit);
        if (hit) {
            if (from_cache) *from_cache = true;
            return true;
        }
    }
    if (!cg_compile_kernel(req, out, error, error_size)) return false;
    if (cache) {
        cg_cache_blob blobs[KERNEL_BLOB_COUNT] = {
            [KERNEL_BLOB_CUBIN] = {out->cubin, out->cubin_size},
            [KERNEL_BLOB_PTX] = {out->ptx, out->ptx_size},
            [KERNEL_BLOB_LOG] = {out->log, out->log ? strlen(out->log) : 0},
        };
        cg_cache_store(cache, key, CG_CACHE_KERNEL, blobs, KERNEL_BLOB_COUNT);
    }
    return true;
}

bool cg_compile_kernel_cached(cg_cache *cache, const cg_compile_request *req, cg_compiled *out,
                              bool *from_cache, char *error, size_t error_size) {
    cg_cache_key key = cg_kernel_cache_key(req);
    return cg_compile_kernel_cached_with_key(cache, req, &key, out, from_cache, error, error_size);
}
