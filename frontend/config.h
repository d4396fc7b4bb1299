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

/* Index of the last --set of `name` in o (a later --set wins), or -1. */
int fe_options_find(const fe_options *o, const char *name);

/* Converts the --set of param->name (if any) to param->type. */
fe_binding fe_setting_lookup(const fe_options *o, ir_param *param, arena *a, diag_engine *d);

#endif
