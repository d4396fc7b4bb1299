/* tokenizer.c - the tokenizer format: the TOKENIZER section of a plan is
 * JSON, {"type": "bytes", "bos": N, "eos": N}; "bytes" means ids 0..255 are
 * the bytes of the text, and BOS/EOS (-1: none) come from config.json's
 * bos_token_id and eos_token_id. */
#include "driver_internal.h"

#include <jansson.h>
#include <string.h>

char *drv_tokenizer_json(const char *config_path) {
    json_t *config = config_path ? json_load_file(config_path, 0, NULL) : NULL;
    json_t *bos = json_object_get(config, "bos_token_id"), *eos = json_object_get(config, "eos_token_id");
    json_t *t = json_pack("{s:s, s:I, s:I}", "type", "bytes", "bos",
                          json_is_integer(bos) ? json_integer_value(bos) : -1, "eos",
                          json_is_integer(eos) ? json_integer_value(eos) : -1);
    char *text = t ? json_dumps(t, JSON_COMPACT | JSON_PRESERVE_ORDER) : NULL;
    json_decref(t);
    json_decref(config);
    return text;
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
