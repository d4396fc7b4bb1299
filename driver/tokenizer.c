/* tokenizer.c - the tokenizer format: the TOKENIZER section of a plan is
 * JSON, {"type": "bytes", "bos": N, "eos": N}; "bytes" means ids 0..255 are
 * the bytes of the text, and BOS/EOS (-1: none) come from config.json's
 * bos_token_id and eos_token_id. */
#include "driver_internal.h"

#include "interface.h"

#include <jansson.h>
#include <stdint.h>
#include <string.h>

uint64_t drv_module_vocab(const ir_module *m) {
    ir_value_id logits = ir_role_value(m, IR_ROLE_LOGITS);
    if (logits == IR_NO_VALUE) return 0;
    const ir_type *t = &m->values[logits].type;
    return t->rank > 0 && t->dims[t->rank - 1].symbol < 0 ? (uint64_t)t->dims[t->rank - 1].size : 0;
}

/* config.json's `key` as a token id: -1 when absent, null or not an
 * integer (eos_token_id may be a list); false after an error when it lies
 * outside [0, vocab). */
static bool token_id(const json_t *config, const char *key, uint64_t vocab, smelt_loc loc, int32_t *out,
                     diag_engine *d) {
    const json_t *v = json_object_get(config, key);
    *out = -1;
    if (!json_is_integer(v)) return true;
    json_int_t id = json_integer_value(v);
    if (id < 0 || (vocab > 0 && (uint64_t)id >= vocab) || id > INT32_MAX) {
        diag_error(
            d, loc,
            "%s is %lld, outside the model's vocabulary [0, %llu): the byte tokenizer needs a token id", key,
            (long long)id, (unsigned long long)vocab);
        return false;
    }
    *out = (int32_t)id;
    return true;
}

bool drv_tokenizer_fits(const drv_tokenizer *t, const drv_eos *eos, uint64_t vocab, const char *what,
                        diag_engine *d) {
    /* The byte tokenizer makes ids 0..255 and BOS/EOS: a vocabulary with more
     * ids than those belongs to a tokenizer of its own, whose ids bytes would
     * be read as (a 49,152-token model printed garbage). */
    uint64_t covered = 256 + (t->bos >= 256);
    for (uint32_t i = 0; eos && i < eos->count; i++)
        covered += eos->ids[i] >= 256 && eos->ids[i] != t->bos;
    if (t->eos >= 256 && t->eos != t->bos && !(eos && eos->count)) covered++;
    if (vocab <= covered) return true;
    diag_error(d, SMELT_NO_LOC,
               "%s covers ids 0..255 and BOS/EOS, %llu ids, but this model's vocabulary has %llu: it needs "
               "its own tokenizer, which smelt cannot read yet",
               what, (unsigned long long)covered, (unsigned long long)vocab);
    return false;
}

bool drv_tokenizer_json(const char *config_path, const ir_module *m, char **out, diag_engine *d) {
    *out = NULL;
    json_t *config = config_path ? drv_config_object(config_path, d) : NULL;
    if (config_path && !config) return false;
    smelt_loc loc = {config_path ? diag_file_id(d, config_path) : -1, 0, 0};
    uint64_t vocab = drv_module_vocab(m);
    int32_t bos, single_eos;
    drv_eos eos;
    bool ok = token_id(config, "bos_token_id", vocab, loc, &bos, d);
    ok &= token_id(config, "eos_token_id", vocab, loc, &single_eos, d);
    ok = ok && drv_eos_tokens(config_path, vocab, &eos, d);
    /* The tokenizer's EOS: the model's first (a list, or generation_config.json's). */
    int32_t first_eos = ok && eos.count ? eos.ids[0] : single_eos;
    drv_tokenizer bytes = {true, bos, first_eos};
    ok = ok && drv_tokenizer_fits(&bytes, &eos, vocab, "--tokenizer bytes", d);
    int32_t eos_id = first_eos;
    json_t *t =
        ok ? json_pack("{s:s, s:I, s:I}", "type", "bytes", "bos", (json_int_t)bos, "eos", (json_int_t)eos_id)
           : NULL;
    *out = t ? json_dumps(t, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    if (ok && !*out) {
        diag_error(d, SMELT_NO_LOC, "out of memory");
        ok = false;
    }
    json_decref(t);
    json_decref(config);
    return ok;
}

void drv_tokenizer_parse(const char *json, size_t length, drv_tokenizer *out, diag_engine *d) {
    json_t *t = json_loadb(json, length, 0, NULL);
    json_t *type = json_object_get(t, "type");
    out->present = json_is_string(type) && strcmp(json_string_value(type), "bytes") == 0;
    out->bos = (int32_t)json_integer_value(json_object_get(t, "bos"));
    out->eos = (int32_t)json_integer_value(json_object_get(t, "eos"));
    if (!out->present)
        diag_warning(d, SMELT_NO_LOC, "the plan's tokenizer is of a kind this smelt does not know");
    json_decref(t);
}

size_t drv_tokenizer_encode(const drv_tokenizer *t, const char *text, size_t length, int32_t *ids) {
    size_t count = 0;
    if (t->bos >= 0) ids[count++] = t->bos;
    for (size_t i = 0; i < length; i++)
        ids[count++] = (unsigned char)text[i];
    return count;
}

int drv_tokenizer_byte(const drv_tokenizer *t, int32_t id) {
    (void)t; /* every tokenizer this smelt knows is the byte one */
    return id >= 0 && id < 256 ? id : -1;
}
