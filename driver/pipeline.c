/* pipeline.c - a model source through the frontend and the passes: the
 * driver's one door into each. */
#include "driver_internal.h"

#include "frontend.h"
#include "gguf.h"
#include "pass.h"

#include <stdlib.h>
#include <string.h>

_Static_assert((int)DRV_MAX_SETTINGS == (int)FE_MAX_SETTINGS &&
                   (int)DRV_MAX_SETTINGS == (int)FE_MAX_ALLOWANCES,
               "drv_source_options holds what fe_options holds");

static void frontend_options(const drv_source_options *o, fe_options *out) {
    memset(out, 0, sizeof *out);
    out->config_path = o->config_path;
    for (uint32_t i = 0; i < o->setting_count; i++)
        fe_options_set(out, o->settings[i].name, o->settings[i].value);
    memcpy(out->allowed_keys, o->allowed_keys, sizeof out->allowed_keys);
    out->allowed_key_count = o->allowed_key_count;
    memcpy(out->allowed_unused_tensors, o->allowed_unused_tensors, sizeof out->allowed_unused_tensors);
    out->allowed_unused_tensor_count = o->allowed_unused_tensor_count;
}

bool drv_run_passes(ir_module *m, const char *after, const char *names, const drv_lowering *l,
                    const char *print_after, diag_engine *d) {
    pass_list list = {.count = 0};
    if (after ? !pass_pipeline_until(after, &list, d) : names && !pass_parse_list(names, &list, d))
        return false;
    if (print_after && strcmp(print_after, "all") != 0) {
        pass_list named; /* reports an unknown pass name */
        if (!pass_parse_list(print_after, &named, d)) return false;
    }
    pass_driver_options o = {.print_after = print_after, .print_out = stderr};
    if (l) {
        o.pass.precision = drv_precision_name(l->precision);
        o.pass.activations = l->precision_options.activations;
        o.pass.group_size = l->precision_options.group_size;
        o.pass.keep = l->precision_options.keep;
        o.pass.act_order = l->precision_options.act_order;
        o.pass.act_quant = l->precision_options.act_quant;
        o.pass.act_scales = l->act_scales;
        o.pass.act_scale_count = l->act_scale_count;
        o.pass.kv_cache = drv_kv_cache_name(l->kv_cache);
        o.pass.max_tokens = l->max_step_tokens;
        o.pass.no_fuse = l->no_fuse;
    }
    return pass_run_list(m, list.items, list.count, &o, d);
}

drv_source_options drv_source_options_for_weights(const drv_source_options *o, const char *weights_path) {
    drv_source_options with = *o;
    if (!with.config_path && weights_path && gguf_is_file(weights_path)) with.config_path = weights_path;
    return with;
}

bool drv_source_parse(const char *path, const drv_source_options *o, ir_module *m, diag_engine *d) {
    fe_options options;
    frontend_options(o, &options);
    return fe_load_model(path, &options, d, m);
}

bool drv_source_passes(const char *config_path, const drv_lowering *l, const char *passes,
                       const char *print_after, ir_module *m, diag_engine *d) {
    /* The lowering's static activation scales, and a checkpoint's input_scales after them. */
    drv_lowering with = *l;
    pass_act_scale *scales = NULL;
    uint32_t count = l->act_scale_count;
    if (count && !(scales = malloc(count * sizeof *scales))) {
        diag_error(d, SMELT_NO_LOC, "out of memory for %u activation scales", count);
        return false;
    }
    if (count) memcpy(scales, l->act_scales, count * sizeof *scales);
    bool ok = drv_import_checkpoint_formats(m, config_path, l->weights_path, &scales, &count, d);
    with.act_scales = scales;
    with.act_scale_count = count;
    ok = ok && drv_run_passes(m, passes, NULL, &with, print_after, d);
    free(scales);
    return ok;
}

bool drv_source_load(const char *path, const drv_source_options *o, const drv_lowering *l,
                     const char *print_after, ir_module *m, diag_engine *d) {
    if (!drv_source_parse(path, o, m, d)) return false;
    if (!l) return drv_run_passes(m, "all", NULL, l, print_after, d);
    return drv_source_passes(o->config_path, l, "all", print_after, m, d);
}
