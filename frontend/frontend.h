/* frontend.h - from a model file (DSL or JSON) plus its bindings to an IR module.
 *
 *   fe_options opts = {.config_path = "config.json"};
 *   fe_options_set(&opts, "num_hidden_layers", "2");   // --set
 *   ir_module m;
 *   if (!fe_load_model("examples/llama.smelt", &opts, &diag, &m)) ...
 *
 * Params are bound in declaration order: a `--set` value wins, then the
 * config.json key of the same name (null counts as absent), then the param's
 * default expression (which may use earlier params). A param left without a
 * value is an error naming it. A config key that no param binds is an error
 * unless it is known not to change the computation (config_keys.c) or is
 * named in allowed_keys; a `--set` of a name that is no param is an error.
 * Patterns in allowed_unused_tensors join the model's `ignore` patterns.
 */
#ifndef SMELT_FRONTEND_H
#define SMELT_FRONTEND_H

#include "ast.h"
#include "diag.h"
#include "ir.h"

typedef struct fe_setting {
    const char *name;
    const char *value; /* text as written: 2, 1e-5, true, qwen2 */
} fe_setting;

enum { FE_MAX_SETTINGS = 64, FE_MAX_ALLOWANCES = 64 };

typedef struct fe_options {
    const char *config_path; /* Hugging Face config.json, or NULL */
    fe_setting settings[FE_MAX_SETTINGS];
    uint32_t setting_count;
    const char *allowed_keys[FE_MAX_ALLOWANCES]; /* --allow-config-key: config keys to ignore knowingly */
    uint32_t allowed_key_count;
    const char *allowed_unused_tensors[FE_MAX_ALLOWANCES]; /* --allow-unused-tensor: ignore patterns */
    uint32_t allowed_unused_tensor_count;
} fe_options;

/* Adds a --set; false when there are too many. */
bool fe_options_set(fe_options *o, const char *name, const char *value);

/* Builds the IR of a parsed model (result types left unknown: run the
 * infer-shapes pass next). Reports every error found; false on any.
 * `out` is initialised whatever the result: free it with ir_module_free. */
bool fe_elaborate(const ast_model *model, const fe_options *o, diag_engine *d, ir_module *out);

/* Parses `path` (".json" -> JSON, anything else -> DSL) and elaborates it.
 * `out` is initialised whatever the result: free it with ir_module_free. */
bool fe_load_model(const char *path, const fe_options *o, diag_engine *d, ir_module *out);

#endif
