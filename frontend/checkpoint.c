/* checkpoint.c - opening a checkpoint as one file, an index of shards or a
 * folder, and the name table across its shards (rules: checkpoint.h).
 *
 * Every form ends in the same two steps: open a list of shard files (each
 * checked by st_file_open), then build one name table over all of them,
 * where a name seen twice is an error. An index adds the checks of its shard
 * names before anything is opened and the agreement of index and shards
 * after.
 */
/* realpath() is an X/Open extension of POSIX.1-2008. */
#define _XOPEN_SOURCE 700

#include "checkpoint.h"
#include "gguf_model.h"
#include "json_memory.h"

#include <dirent.h>
#include <errno.h>
#include <jansson.h>
#include <limits.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

enum { CK_MAX_INDEX_BYTES = 100 * 1024 * 1024 };

static const char index_file_name[] = "model.safetensors.index.json";
static const char single_file_name[] = "model.safetensors";
static const char shard_suffix[] = ".safetensors";

/* ---- the name table ---------------------------------------------------------- */

uint32_t st_checkpoint_index(const st_checkpoint *ck, const char *name) {
    if (!ck->slot_count) return UINT32_MAX;
    uint32_t mask = ck->slot_count - 1;
    for (uint32_t s = (uint32_t)st_name_hash(name) & mask; ck->slots[s]; s = (s + 1) & mask) {
        uint32_t i = ck->slots[s] - 1;
        if (strcmp(ck->tensors[i]->name, name) == 0) return i;
    }
    return UINT32_MAX;
}

const st_tensor *st_checkpoint_find(const st_checkpoint *ck, const char *name) {
    uint32_t i = st_checkpoint_index(ck, name);
    return i == UINT32_MAX ? NULL : ck->tensors[i];
}

/* Lists every tensor of every shard in one table; a name in two shards is
 * an error naming both. */
static bool build_name_table(st_checkpoint *ck, smelt_loc loc, diag_engine *d) {
    uint64_t total = 0;
    for (uint32_t s = 0; s < ck->shard_count; s++)
        total += ck->shards[s].tensor_count;
    if (total >= UINT32_MAX / 4) {
        diag_error(d, loc, "the checkpoint holds %llu tensors; at most %u are supported",
                   (unsigned long long)total, UINT32_MAX / 4 - 1);
        return false;
    }
    uint32_t slots = 8;
    while (slots < 2 * total)
        slots *= 2;
    ck->slots = arena_array(&ck->arena, slots, sizeof *ck->slots);
    ck->slot_count = slots;
    ck->tensors = arena_array(&ck->arena, total ? total : 1, sizeof *ck->tensors);
    ck->tensor_shard = arena_array(&ck->arena, total ? total : 1, sizeof *ck->tensor_shard);
    bool ok = true;
    for (uint32_t s = 0; s < ck->shard_count && !diag_should_stop(d); s++) {
        const st_file *shard = &ck->shards[s];
        for (uint32_t k = 0; k < shard->tensor_count; k++) {
            const st_tensor *t = &shard->tensors[k];
            uint32_t other = st_checkpoint_index(ck, t->name);
            if (other != UINT32_MAX) {
                diag_error(d, loc, "tensor '%.*s%s' is in two shards: '%s' and '%s'", DIAG_NAME(t->name),
                           ck->shards[ck->tensor_shard[other]].path, shard->path);
                ok = false;
                continue;
            }
            uint32_t i = ck->tensor_count++;
            ck->tensors[i] = t;
            ck->tensor_shard[i] = s;
            uint32_t slot = (uint32_t)st_name_hash(t->name) & (slots - 1);
            while (ck->slots[slot])
                slot = (slot + 1) & (slots - 1);
            ck->slots[slot] = i + 1;
        }
    }
    return ok;
}

/* Opens each of `paths` as a shard; reports every broken one. */
static bool open_shards(st_checkpoint *ck, const char *const *paths, uint32_t count, diag_engine *d) {
    ck->shards = arena_array(&ck->arena, count ? count : 1, sizeof *ck->shards);
    bool ok = true;
    for (uint32_t i = 0; i < count && !diag_should_stop(d); i++) {
        if (st_file_open(paths[i], &ck->shards[ck->shard_count], d))
            ck->shard_count++;
        else
            ok = false;
    }
    return ok && !diag_should_stop(d);
}

/* ---- paths ------------------------------------------------------------------------- */

/* `folder` joined with `name`; `folder` "" means the current folder. */
static char *join_path(arena *a, const char *folder, const char *name) {
    size_t length = strlen(folder);
    if (length == 0) return arena_strdup(a, name);
    return arena_printf(a, "%s%s%s", folder, folder[length - 1] == '/' ? "" : "/", name);
}

/* The folder part of `path` with its slash ("a/b/" for "a/b/x.json"), or "". */
static char *folder_of(arena *a, const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? arena_strndup(a, path, (size_t)(slash - path) + 1) : arena_strdup(a, "");
}

static char *real_path(arena *a, const char *path) {
    char *resolved = arena_alloc(a, PATH_MAX); /* first: nothing to free if it fails */
    return realpath(*path ? path : ".", resolved);
}

static bool ends_with(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

static bool is_regular_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* ---- an index ------------------------------------------------------------------------ */

/* One distinct shard name of the index, and the opened file it resolved to. */
typedef struct ck_shard_name {
    const char *name;
    uint32_t file; /* index into the list of files to open; UINT32_MAX when refused */
} ck_shard_name;

typedef struct ck_index {
    st_checkpoint *ck;
    diag_engine *d;
    smelt_loc loc;
    const char *folder;      /* of the index, with its slash, or "" */
    const char *folder_real; /* its real path followed by '/' */
    ck_shard_name *names;
    uint32_t name_count;
    const char **files;      /* shard paths to open (folder + name) */
    const char **files_real; /* their real paths, to open each file once */
    uint32_t file_count;
} ck_index;

/* `name` with "." and empty components dropped and each ".." taking back
 * the component before it ("sub/../b.safetensors" -> "b.safetensors") into
 * *normalised; why the name may not be used, or NULL when it may. */
static const char *shard_name_problem(arena *a, const char *name, const char **normalised) {
    if (!*name) return "is empty";
    if (name[0] == '/') return "is an absolute path; shard names must be relative to the index's folder";
    size_t length = strlen(name);
    char *out = arena_alloc(a, length + 1);
    size_t used = 0;
    for (const char *p = name; *p;) {
        const char *slash = strchr(p, '/');
        size_t n = slash ? (size_t)(slash - p) : strlen(p);
        if (n == 2 && p[0] == '.' && p[1] == '.') {
            if (used == 0) return "leaves the index's folder through '..'";
            while (used > 0 && out[used - 1] != '/')
                used--;
            if (used > 0) used--; /* the slash before the component taken back */
        } else if (n > 0 && !(n == 1 && p[0] == '.')) {
            if (used > 0) out[used++] = '/';
            memcpy(out + used, p, n);
            used += n;
        }
        p += n + (slash != NULL);
    }
    out[used] = '\0';
    if (used == 0) return "names the index's folder itself, not a file";
    *normalised = out;
    return NULL;
}

/* The entry of `name` in the index's shard names, checked and resolved the
 * first time it is seen. */
static const ck_shard_name *shard_name_entry(ck_index *x, const char *name, const char *tensor) {
    for (uint32_t i = 0; i < x->name_count; i++)
        if (strcmp(x->names[i].name, name) == 0) return &x->names[i];
    ck_shard_name *entry = &x->names[x->name_count++];
    arena *a = &x->ck->arena;
    entry->name = arena_strdup(a, name);
    entry->file = UINT32_MAX;
    const char *normalised = NULL;
    const char *problem = shard_name_problem(a, name, &normalised);
    if (problem) {
        diag_error(x->d, x->loc, "shard '%.*s%s' (of tensor '%.*s%s') %s", DIAG_NAME(name), DIAG_NAME(tensor),
                   problem);
        return entry;
    }
    /* The folders on the way must stay inside (a symbolic link among them
     * may not lead out); the last component may be a symbolic link anywhere,
     * as in a Hugging Face hub cache, whose snapshot links into ../../blobs. */
    const char *path = join_path(a, x->folder, normalised);
    const char *inner = folder_of(a, normalised);
    if (*inner) {
        const char *inner_real = real_path(a, join_path(a, x->folder, inner));
        const char *with_slash = inner_real ? arena_printf(a, "%s/", inner_real) : NULL;
        if (with_slash && strncmp(with_slash, x->folder_real, strlen(x->folder_real)) != 0) {
            diag_error(x->d, x->loc,
                       "shard '%.*s%s' (of tensor '%.*s%s') lies in '%.*s%s', outside the index's folder",
                       DIAG_NAME(name), DIAG_NAME(tensor), DIAG_NAME(inner_real));
            return entry;
        }
    }
    const char *resolved = real_path(a, path);
    if (!resolved) {
        diag_error(x->d, x->loc, "cannot open shard '%.*s%s' (of tensor '%.*s%s'): %s", DIAG_NAME(name),
                   DIAG_NAME(tensor), strerror(errno));
        return entry;
    }
    for (uint32_t f = 0; f < x->file_count; f++)
        if (strcmp(x->files_real[f], resolved) == 0) {
            entry->file = f;
            return entry;
        }
    entry->file = x->file_count;
    x->files[x->file_count] = path;
    x->files_real[x->file_count++] = resolved;
    return entry;
}

/* Index and shards agree: every listed tensor is in its shard, every shard
 * tensor is listed for its shard. */
static bool check_index_agrees(ck_index *x, const json_t *weight_map, const uint32_t *listed_file) {
    st_checkpoint *ck = x->ck;
    bool ok = true;
    size_t k = 0;
    const char *tensor;
    json_t *value;
    json_object_foreach((json_t *)weight_map, tensor, value) {
        if (diag_should_stop(x->d)) return false;
        const st_file *shard = &ck->shards[listed_file[k++]];
        if (!st_file_find(shard, tensor)) {
            diag_error(x->d, x->loc, "the index lists tensor '%.*s%s' in shard '%s', which does not hold it",
                       DIAG_NAME(tensor), shard->path);
            ok = false;
        }
    }
    for (uint32_t s = 0; s < ck->shard_count; s++) {
        const st_file *shard = &ck->shards[s];
        for (uint32_t i = 0; i < shard->tensor_count && !diag_should_stop(x->d); i++) {
            const char *name = shard->tensors[i].name;
            const json_t *listed = json_object_get(weight_map, name);
            if (!listed) {
                diag_error(x->d, x->loc, "shard '%s' holds tensor '%.*s%s', which the index does not list",
                           shard->path, DIAG_NAME(name));
                ok = false;
            } else if (shard_name_entry(x, json_string_value(listed), name)->file != s) {
                diag_error(x->d, x->loc,
                           "shard '%s' holds tensor '%.*s%s', which the index lists in shard '%.*s%s'",
                           shard->path, DIAG_NAME(name), DIAG_NAME(json_string_value(listed)));
                ok = false;
            }
        }
    }
    return ok;
}

static json_t *load_index(const char *path, smelt_loc loc, diag_engine *d) {
    struct stat st;
    if (stat(path, &st) != 0) {
        diag_error(d, loc, "cannot open the index: %s", strerror(errno));
        return NULL;
    }
    if (!S_ISREG(st.st_mode) || st.st_size > CK_MAX_INDEX_BYTES) {
        diag_error(d, loc, "the index must be a JSON file of at most 100 MiB, found %s",
                   S_ISREG(st.st_mode) ? "a larger file" : "something that is not a regular file");
        return NULL;
    }
    json_error_t error = {0}; /* jansson leaves its code byte unset on success */
    fe_json_memory_begin();
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &error);
    if (fe_json_out_of_memory(&error)) {
        if (root) json_decref(root);
        diag_error(d, loc, "out of memory reading the index");
        return NULL;
    }
    if (!root) {
        smelt_loc at = {loc.file, error.line > 0 ? (uint32_t)error.line : 0,
                        error.line > 0 && error.column > 0 ? (uint32_t)error.column : 0};
        diag_error(d, at, "the index is not valid JSON: %s", error.text);
        return NULL;
    }
    const json_t *weight_map = json_is_object(root) ? json_object_get(root, "weight_map") : NULL;
    const char *found = !json_is_object(root)          ? "another JSON value"
                        : !weight_map                  ? "no \"weight_map\""
                        : !json_is_object(weight_map)  ? "a \"weight_map\" that is no object"
                        : json_object_size(weight_map) ? NULL
                                                       : "an empty \"weight_map\"";
    if (found) {
        diag_error(d, loc,
                   "the index must be a JSON object whose \"weight_map\" maps tensor names to shard files, "
                   "found %s",
                   found);
        json_decref(root);
        return NULL;
    }
    return root;
}

static bool open_index(st_checkpoint *ck, const char *path, diag_engine *d) {
    smelt_loc loc = {diag_file_id(d, path), 0, 0};
    json_t *root = load_index(path, loc, d);
    if (!root) return false;
    arena_recovery recovery; /* the tree is freed, then st_checkpoint_open's handler runs */
    if (arena_recovery_enter(&recovery, setjmp(recovery.where))) {
        json_decref(root);
        arena_out_of_memory();
    }
    const json_t *weight_map = json_object_get(root, "weight_map");
    size_t entries = json_object_size(weight_map);
    arena *a = &ck->arena;
    ck_index x = {.ck = ck, .d = d, .loc = loc, .folder = folder_of(a, path)};
    const char *folder_real = real_path(a, x.folder);
    if (!folder_real) {
        diag_error(d, loc, "cannot resolve the index's folder: %s", strerror(errno));
        arena_recovery_leave(&recovery);
        json_decref(root);
        return false;
    }
    x.folder_real = ends_with(folder_real, "/") ? folder_real : arena_printf(a, "%s/", folder_real);
    x.names = arena_array(a, entries, sizeof *x.names);
    x.files = arena_array(a, entries, sizeof *x.files);
    x.files_real = arena_array(a, entries, sizeof *x.files_real);
    uint32_t *listed_file = arena_array(a, entries, sizeof *listed_file);

    bool ok = true;
    size_t k = 0;
    const char *tensor;
    json_t *value;
    json_object_foreach((json_t *)weight_map, tensor, value) {
        if (diag_should_stop(d)) break;
        if (!json_is_string(value)) {
            diag_error(d, loc,
                       "\"weight_map\" must map names to shard files; tensor '%.*s%s' maps to no string",
                       DIAG_NAME(tensor));
            ok = false;
            continue;
        }
        listed_file[k] = shard_name_entry(&x, json_string_value(value), tensor)->file;
        ok &= listed_file[k++] != UINT32_MAX;
    }
    ok = ok && !diag_should_stop(d) && open_shards(ck, x.files, x.file_count, d);
    ok = ok && build_name_table(ck, loc, d);
    ok = ok && check_index_agrees(&x, weight_map, listed_file);
    arena_recovery_leave(&recovery);
    json_decref(root);
    return ok;
}

/* ---- a folder ----------------------------------------------------------------------------- */

static int compare_strings(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Every *.safetensors file of the folder, in name order. */
static bool open_folder_shards(st_checkpoint *ck, const char *folder, smelt_loc loc, diag_engine *d) {
    DIR *dir = opendir(folder);
    if (!dir) {
        diag_error(d, loc, "cannot read the folder: %s", strerror(errno));
        return false;
    }
    arena *a = &ck->arena;
    uint32_t count = 0, capacity = 16;
    const char **paths = arena_array(a, capacity, sizeof *paths);
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        if (!ends_with(entry->d_name, shard_suffix) || entry->d_name[0] == '.') continue;
        const char *path = join_path(a, folder, entry->d_name);
        if (!is_regular_file(path)) continue;
        if (count == capacity) {
            if (capacity >= UINT32_MAX / 4) break;
            paths = arena_grow(a, paths, count, capacity * 2, sizeof *paths);
            capacity *= 2;
        }
        paths[count++] = path;
    }
    closedir(dir);
    if (count == 0) {
        diag_error(d, loc, "the folder holds no %s, no %s and no other *.safetensors file", index_file_name,
                   single_file_name);
        return false;
    }
    qsort(paths, count, sizeof *paths, compare_strings);
    return open_shards(ck, paths, count, d) && build_name_table(ck, loc, d);
}

/* ---- opening -------------------------------------------------------------------------------- */

static bool open_single(st_checkpoint *ck, const char *path, smelt_loc loc, diag_engine *d) {
    return open_shards(ck, &path, 1, d) && build_name_table(ck, loc, d);
}

bool st_checkpoint_open(const char *path, st_checkpoint *out, diag_engine *d) {
    memset(out, 0, sizeof *out);
    arena_init(&out->arena);
    arena_recovery recovery;
    if (arena_recovery_enter(&recovery, setjmp(recovery.where))) {
        st_checkpoint_close(out);
        diag_error(d, SMELT_NO_LOC, "out of memory opening the checkpoint");
        return false;
    }
    out->path = arena_strdup(&out->arena, path);
    out->diag_file = diag_file_id(d, path);
    smelt_loc loc = {out->diag_file, 0, 0};
    struct stat st;
    bool ok;
    if (stat(path, &st) != 0) {
        diag_error(d, loc, "cannot open the checkpoint: %s", strerror(errno));
        ok = false;
    } else if (S_ISDIR(st.st_mode)) {
        const char *index = join_path(&out->arena, path, index_file_name);
        const char *single = join_path(&out->arena, path, single_file_name);
        if (is_regular_file(index))
            ok = open_index(out, index, d);
        else if (is_regular_file(single))
            ok = open_single(out, single, loc, d);
        else
            ok = open_folder_shards(out, path, loc, d);
    } else if (gguf_is_file(path)) {
        ok = fe_gguf_checkpoint_open(out, path, d);
    } else if (ends_with(path, ".json")) {
        ok = open_index(out, path, d);
    } else {
        ok = open_single(out, path, loc, d);
    }
    arena_recovery_leave(&recovery);
    if (!ok) st_checkpoint_close(out);
    return ok;
}

void st_checkpoint_close(st_checkpoint *ck) {
    if (ck->gguf) fe_gguf_checkpoint_close(ck);
    for (uint32_t s = 0; s < ck->shard_count; s++)
        st_file_close(&ck->shards[s]);
    arena_free(&ck->arena);
    memset(ck, 0, sizeof *ck);
}
