/* model_folder.c - a model as Hugging Face saves it: a folder holding
 * config.json, generation_config.json and the weights (model.safetensors,
 * or shards with model.safetensors.index.json).
 *
 * --config takes the file or its folder; without --config, a --weights
 * folder that holds a config.json gives it, so that `--weights DIR/` alone
 * is a whole model. The EOS ids where generation stops come from
 * generation_config.json beside the config when it has them (transformers'
 * generate reads them there first), else from config.json: eos_token_id,
 * one id or a list of them. */
#include "driver_internal.h"
#include "gguf.h"
#include "gguf_model.h"

#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

static bool is_folder(const char *path) {
    struct stat st;
    return path && stat(path, &st) == 0 && S_ISDIR(st.st_mode);
}

static bool is_file(const char *path) {
    struct stat st;
    return stat(path, &st) == 0 && S_ISREG(st.st_mode);
}

/* folder + "/" + name, malloc'd; NULL when out of memory (reported). */
static char *path_in(const char *folder, const char *name, diag_engine *d) {
    size_t n = strlen(folder);
    bool slash = n > 0 && folder[n - 1] == '/';
    size_t size = n + !slash + strlen(name) + 1;
    char *path = malloc(size);
    if (!path) {
        diag_error(d, SMELT_NO_LOC, "out of memory");
        return NULL;
    }
    snprintf(path, size, "%s%s%s", folder, slash ? "" : "/", name);
    return path;
}

bool drv_find_config(const char *config_path, const char *weights_path, char **out, diag_engine *d) {
    *out = NULL;
    if (config_path && !is_folder(config_path)) {
        *out = strdup(config_path);
        if (!*out) diag_error(d, SMELT_NO_LOC, "out of memory");
        return *out != NULL;
    }
    const char *folder = config_path ? config_path : is_folder(weights_path) ? weights_path : NULL;
    if (!folder) return true;
    char *path = path_in(folder, "config.json", d);
    if (!path) return false;
    if (is_file(path)) {
        *out = path;
        return true;
    }
    free(path);
    if (config_path) {
        diag_error(d, SMELT_NO_LOC,
                   "--config %s is a folder without a config.json: give the config file, or the folder "
                   "of a model saved by Hugging Face",
                   config_path);
        return false;
    }
    return true; /* a folder of weights alone: the params come from --set and defaults */
}

bool drv_source_with_folder(const drv_source_options *o, const char *weights_path, drv_source_options *out,
                            char **config_storage, diag_engine *d) {
    *out = *o;
    if (!drv_find_config(o->config_path, weights_path, config_storage, d)) return false;
    out->config_path = *config_storage;
    return true;
}

/* eos_token_id of the JSON object `root` into e (replacing what it held):
 * an id or a list of ids, each in [0, vocab); a null or absent key leaves e
 * alone and gives false in *found. */
static bool read_eos(const json_t *root, const char *path, uint64_t vocab, drv_eos *e, bool *found,
                     diag_engine *d) {
    *found = false;
    const json_t *v = json_object_get(root, "eos_token_id");
    if (!v || json_is_null(v)) return true;
    smelt_loc loc = {diag_file_id(d, path), 0, 0};
    const json_t *items[DRV_MAX_EOS];
    size_t count = 0;
    if (json_is_integer(v)) {
        items[count++] = v;
    } else if (json_is_array(v)) {
        if (json_array_size(v) > DRV_MAX_EOS) {
            diag_error(d, loc, "eos_token_id lists %zu ids; smelt keeps at most %d", json_array_size(v),
                       DRV_MAX_EOS);
            return false;
        }
        for (size_t i = 0; i < json_array_size(v); i++)
            items[count++] = json_array_get(v, i);
    } else {
        diag_error(d, loc, "eos_token_id must be a token id or a list of them");
        return false;
    }
    drv_eos read = {.count = 0};
    for (size_t i = 0; i < count; i++) {
        json_int_t id = json_is_integer(items[i]) ? json_integer_value(items[i]) : -1;
        if (!json_is_integer(items[i]) || id < 0 || id > INT32_MAX || (vocab > 0 && (uint64_t)id >= vocab)) {
            if (json_is_integer(items[i]))
                diag_error(d, loc, "eos_token_id is %lld, outside the model's vocabulary [0, %llu)",
                           (long long)id, (unsigned long long)vocab);
            else
                diag_error(d, loc, "eos_token_id must be a token id or a list of them");
            return false;
        }
        bool seen = false;
        for (uint32_t k = 0; k < read.count; k++)
            seen |= read.ids[k] == (int32_t)id;
        if (!seen) read.ids[read.count++] = (int32_t)id;
    }
    *e = read;
    *found = true;
    return true;
}

/* The config object at path: a JSON file, or a GGUF file's metadata as the
 * config it stands for (frontend/gguf_model.c). */
json_t *drv_config_object(const char *path, diag_engine *d) {
    if (gguf_is_file(path)) {
        json_t *config = NULL;
        return fe_gguf_config(path, &config, d) ? config : NULL;
    }
    json_error_t error = {0};
    json_t *root = json_load_file(path, JSON_REJECT_DUPLICATES, &error);
    if (!root || !json_is_object(root)) {
        smelt_loc loc = {diag_file_id(d, path), root ? 0 : (uint32_t)(error.line > 0 ? error.line : 0),
                         root ? 0 : (uint32_t)(error.column > 0 ? error.column : 0)};
        diag_error(d, loc, "%s", root ? "expected a JSON object" : error.text);
        json_decref(root);
        return NULL;
    }
    return root;
}

bool drv_eos_tokens(const char *config_path, uint64_t vocab, drv_eos *out, diag_engine *d) {
    *out = (drv_eos){.count = 0};
    if (!config_path) return true;
    json_t *config = drv_config_object(config_path, d);
    if (!config) return false;
    bool found;
    bool ok = read_eos(config, config_path, vocab, out, &found, d);
    json_decref(config);

    /* generation_config.json beside config.json overrides it (a GGUF file
     * carries its own). */
    if (!ok || gguf_is_file(config_path)) return ok;
    const char *slash = strrchr(config_path, '/');
    size_t folder_length = slash ? (size_t)(slash - config_path) : 1;
    char *folder = malloc(folder_length + 1);
    if (!folder) {
        diag_error(d, SMELT_NO_LOC, "out of memory");
        return false;
    }
    memcpy(folder, slash ? config_path : ".", folder_length);
    folder[folder_length] = '\0';
    char *generation = ok ? path_in(folder, "generation_config.json", d) : NULL;
    free(folder);
    if (!generation) return false;
    if (is_file(generation)) {
        json_t *root = drv_config_object(generation, d);
        ok = root && read_eos(root, generation, vocab, out, &found, d);
        json_decref(root);
    }
    free(generation);
    return ok;
}
