/* config.h - binding params from a Hugging Face config.json and from --set
 * (internal to frontend/; elaborate.c is the user).
 *
 *   fe_config config;
 *   fe_config_open(&config, opts->config_path, d);   // NULL path: no config
 *   ir_param p = {.name = "hidden_size", .type = IR_PARAM_INT};
 *   switch (fe_config_lookup(&config, &p, &scratch, d)) { ... }
 *   fe_config_close(&config);
 *
 * A lookup converts the bound value to the param's type: int <- JSON integer
 * (or a real with an integral value), float <- integer or real, bool <-
 * true/false, string <- string; --set text converts the same way. Every
 * mismatch is reported (at the config file, or with the --set text) and
 * gives FE_BINDING_INVALID.
 */
#ifndef SMELT_FE_CONFIG_H
#define SMELT_FE_CONFIG_H

#include "frontend.h"

struct json_t;

typedef struct fe_config {
    struct json_t *root; /* the config's top-level object; NULL when none or broken */
    const char *path;    /* as given; NULL when no config */
    int32_t file;        /* diag file id of path, or -1 */
    bool broken;         /* given but unreadable or malformed (already reported) */
    char *text;          /* the file's bytes (malloc'd), to locate values in messages */
    size_t length;
} fe_config;

/* Reads `path` (NULL: no config, always succeeds): a config.json, or a GGUF
 * model file, whose metadata stands for one (fe_gguf_config, gguf_model.h). On failure reports the
 * error, sets c->broken and returns false; c must still be closed. */
bool fe_config_open(fe_config *c, const char *path, diag_engine *d);
void fe_config_close(fe_config *c);

typedef enum fe_binding {
    FE_BINDING_ABSENT,  /* nothing binds the param here */
    FE_BINDING_FOUND,   /* param->value holds the converted value */
    FE_BINDING_INVALID, /* bound, but the value does not convert (reported) */
} fe_binding;

/* Looks up param->name in the config (a null value counts as absent) and
 * converts it to param->type into param->value; strings are copied to `a`. */
fe_binding fe_config_lookup(const fe_config *c, ir_param *param, arena *a, diag_engine *d);

/* Where the config binds `name` (as fe_config_lookup finds it): true with
 * the value's line and column, false when the config does not bind it. */
bool fe_config_value_loc(const fe_config *c, const char *name, smelt_loc *loc);

/* ---- No key silently ignored (config_keys.c) ----------------------------
 *
 * Every key a config source gives must be bound by a param of the spec,
 * covered by the table of keys known not to change the computation, or
 * allowed by the user (--allow-config-key); each other one is an error at
 * the key, naming it, the source and the spec. The check is a function of
 * the keys and the spec's params, so that any config source (config.json,
 * GGUF metadata) can call it. */

/* A key as a config source gives it. */
typedef struct fe_config_key {
    const char *name;           /* the name params bind: "rope_theta" */
    const char *shown;          /* as the source writes it: "rope_parameters.rope_theta" */
    const struct json_t *value; /* its value (null counts as absent and is always allowed) */
    smelt_loc loc;              /* the key in the source */
} fe_config_key;

/* The object whose members bind params as if they were top-level keys
 * (transformers 5's "rope_parameters"); config_value looks there too. */
extern const char *const fe_config_nested_object;
/* The object a pre-quantized checkpoint's config carries ("quantization_config"):
 * fe_check_config_keys leaves it to qck_scheme_of_config (quant_checkpoint.h). */
extern const char *const fe_config_quantization_object;

/* The keys of config.json: every top-level key, then every member of the
 * nested object (named by the member, shown as "rope_parameters.member").
 * In `a`; returns the count. */
uint32_t fe_config_keys(const fe_config *c, arena *a, fe_config_key **out);

typedef struct fe_config_key_check {
    const char *spec_path;     /* for messages: the model source */
    const char *const *params; /* the spec's param names */
    uint32_t param_count;
    const char *const *allowed; /* --allow-config-key: names (or shown names) allowed anyway */
    uint32_t allowed_count;
} fe_config_key_check;

/* Reports every key that is neither null, bound, harmless nor allowed;
 * false when there was one. */
bool fe_check_config_keys(const fe_config_key *keys, uint32_t count, const fe_config_key_check *check,
                          diag_engine *d);

/* Why `key` with `value` is known not to change the computation, or NULL. */
const char *fe_config_key_harmless(const char *key, const struct json_t *value);
/* The object of config key `name` (top level, or in rope_parameters): FOUND
 * with *out set (owned by the config), ABSENT when missing or null, INVALID
 * (reported) when not an object. */
fe_binding fe_config_lookup_object(const fe_config *c, const char *name, const struct json_t **out,
                                   diag_engine *d);

/* The same for a list param: FOUND with *out a JSON array (owned by the
 * config), ABSENT when missing or null, INVALID (reported) when no list. */
fe_binding fe_config_lookup_list(const fe_config *c, const char *name, const struct json_t **out,
                                 diag_engine *d);
/* Where item `index` of the list of config key `key` is in the file (the
 * list itself when it has fewer items; the whole file when not found). */
smelt_loc fe_config_item_loc(const fe_config *c, const char *key, size_t index);

/* Where the value of config key `key` is in the file, or member `member`
 * (not NULL) of that object; the whole file when not found. */
smelt_loc fe_config_loc(const fe_config *c, const char *key, const char *member);

/* Index of the last --set of `name` in o (a later --set wins), or -1. */
int fe_options_find(const fe_options *o, const char *name);

/* Converts the --set of param->name (if any) to param->type. */
fe_binding fe_setting_lookup(const fe_options *o, ir_param *param, arena *a, diag_engine *d);

#endif
