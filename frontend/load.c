/* load.c - a model file to an IR module: parse (DSL or JSON by the file's
 * suffix), then elaborate with the config and --set bindings. */
#include "frontend.h"
#include "gguf.h"

#include <string.h>

static bool has_suffix(const char *s, const char *suffix) {
    size_t n = strlen(s), k = strlen(suffix);
    return n >= k && strcmp(s + n - k, suffix) == 0;
}

bool fe_load_model(const char *path, const fe_options *o, diag_engine *d, ir_module *out) {
    if (gguf_is_file(path)) { /* a common slip: the GGUF where the spec goes */
        smelt_loc loc = {diag_file_id(d, path), 0, 0};
        diag_error(
            d, loc,
            "a GGUF file holds a model's weights and params, not its description: give it as --weights "
            "(or --config) with the spec of its architecture, e.g. examples/llama.smelt");
        ir_module_init(out, NULL);
        return false;
    }
    ast_model model;
    ast_model_init(&model);
    bool parsed = has_suffix(path, ".json") ? fe_parse_json(path, d, &model) : fe_parse_dsl(path, d, &model);
    bool ok = false;
    if (parsed)
        ok = fe_elaborate(&model, o, d, out);
    else /* a partial tree would only add confusing errors: stop at the parse errors */
        ir_module_init(out, NULL);
    ast_model_free(&model);
    return ok;
}
