/* kernel_cache.h - the on-disk cache of compiled kernels and host objects.
 *
 * NVRTC takes tens to hundreds of milliseconds per kernel and a model has
 * hundreds of kernels, so `smelt compile` keeps what it compiled. An entry
 * is keyed by the XXH3 128-bit hash of everything that decides the output:
 * for a kernel its source, every header's name and text, the architecture,
 * the exact NVRTC options, NVRTC's version and this cache's format version;
 * for the host-simulator object its sources, the compiler's `--version`
 * output and the flags (host_build.c).
 *
 * The folder is $SMELT_CACHE_DIR, else $XDG_CACHE_HOME/smelt, else
 * ~/.cache/smelt, created on first store with mode 0700. Each entry is one
 * file named by the key in hex: a 56-byte header (magic, format version,
 * kind, key, blob count, payload size, XXH64 of the payload) and the payload
 * (blobs, each a little-endian u64 size and its bytes). Entries are written
 * to a temporary file in the same folder, fsync'ed and renamed into place,
 * so a reader sees a whole entry or none. An entry that is truncated,
 * corrupt or for another key is never trusted: it counts as a miss and the
 * next store replaces it.
 *
 * A cache that cannot be written (read-only folder, no home) is not an
 * error: compiling goes on, and cg_cache_warning() says once why nothing is
 * kept. One cache may be used from several threads at once.
 */
#ifndef SMELT_CG_KERNEL_CACHE_H
#define SMELT_CG_KERNEL_CACHE_H

#include "nvrtc.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

enum {
    CG_CACHE_FORMAT_VERSION = 1, /* bump when an entry's layout or meaning changes */
    CG_CACHE_MAX_BLOBS = 8,
};

/* What an entry holds; part of the key, so kinds never collide. */
typedef enum cg_cache_kind {
    CG_CACHE_KERNEL = 1,      /* blobs: cubin, PTX, ptxas log */
    CG_CACHE_HOST_OBJECT = 2, /* blobs: the host-simulator shared object */
} cg_cache_kind;

typedef struct cg_cache_key {
    uint8_t bytes[16]; /* XXH3-128, big-endian canonical form */
} cg_cache_key;

typedef struct cg_cache_stats {
    uint64_t hits;
    uint64_t misses;
    uint64_t stores;           /* entries written */
    uint64_t store_failures;   /* entries that could not be written */
    uint64_t rejected_entries; /* corrupt, truncated or mismatched files ignored */
} cg_cache_stats;

typedef struct cg_cache cg_cache;

/* Opens the cache in `folder`, or in the default folder when folder is NULL.
 * Never fails: without a usable folder the cache keeps nothing and says why
 * in cg_cache_warning(). Nothing is created on disk until the first store. */
cg_cache *cg_cache_open(const char *folder);
void cg_cache_close(cg_cache *cache);
const char *cg_cache_folder(const cg_cache *cache); /* "" when there is none */
/* NULL, or one line saying why entries are not being kept (set once). */
const char *cg_cache_warning(cg_cache *cache);
cg_cache_stats cg_cache_get_stats(cg_cache *cache);

/* The default folder ($SMELT_CACHE_DIR, $XDG_CACHE_HOME/smelt, ~/.cache/smelt);
 * false when none can be named (no HOME) or it does not fit in `size`. */
bool cg_cache_default_folder(char *out, size_t size);

/* Building a key: every field is fed with its length, so ("ab", "c") and
 * ("a", "bc") differ, and a NULL string differs from "". */
typedef struct cg_cache_hasher cg_cache_hasher;
cg_cache_hasher *cg_cache_hasher_begin(cg_cache_kind kind);
void cg_cache_hash_bytes(cg_cache_hasher *h, const void *data, size_t size);
void cg_cache_hash_string(cg_cache_hasher *h, const char *s);
void cg_cache_hash_u64(cg_cache_hasher *h, uint64_t value);
cg_cache_key cg_cache_hasher_finish(cg_cache_hasher *h); /* frees h */
/* False for the key a hasher that ran out of memory gives (the cache
 * neither loads nor stores it; all such keys are equal). */
bool cg_cache_key_usable(const cg_cache_key *key);

/* "0f3a..." (32 hex digits and a NUL). */
void cg_cache_key_hex(const cg_cache_key *key, char out[33]);

/* The key of a kernel compile: source, headers, arch, cubin/PTX wanted, the
 * full NVRTC option list, NVRTC's version, the format version (and the
 * kernel name when -lineinfo puts it into the output). */
cg_cache_key cg_kernel_cache_key(const cg_compile_request *req);

/* A piece of an entry. */
typedef struct cg_cache_blob {
    const void *data;
    size_t size;
} cg_cache_blob;

/* An entry read back; blobs point into `payload`. */
typedef struct cg_cache_entry {
    uint8_t *payload;
    size_t payload_size;
    cg_cache_blob blobs[CG_CACHE_MAX_BLOBS];
    uint32_t blob_count;
} cg_cache_entry;

/* Looks the key up; true and *out filled on a hit (free with
 * cg_cache_entry_free). Counts a hit or a miss. */
bool cg_cache_load(cg_cache *cache, const cg_cache_key *key, cg_cache_kind kind, cg_cache_entry *out);
void cg_cache_entry_free(cg_cache_entry *entry);
/* Writes an entry; false when it could not (then the warning is set). */
bool cg_cache_store(cg_cache *cache, const cg_cache_key *key, cg_cache_kind kind, const cg_cache_blob *blobs,
                    uint32_t blob_count);

/* cg_compile_kernel through the cache: a hit returns the stored cubin, PTX
 * and log (resources re-parsed from the log); a miss compiles and stores.
 * cache may be NULL (plain compile). *from_cache (optional) tells which. */
bool cg_compile_kernel_cached(cg_cache *cache, const cg_compile_request *req, cg_compiled *out,
                              bool *from_cache, char *error, size_t error_size);
/* The same with the key already computed (the compile pool has it). */
bool cg_compile_kernel_cached_with_key(cg_cache *cache, const cg_compile_request *req,
                                       const cg_cache_key *key, cg_compiled *out, bool *from_cache,
                                       char *error, size_t error_size);

#endif
