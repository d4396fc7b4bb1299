/* options.c - the names of the driver's choices, and source settings. */
#include "driver.h"

#include <string.h>

static const char *const precision_names[] = {"f32", "bf16",     "int4-rtn", "int8",
                                              "fp8", "int4-awq", "int4-gptq"};

bool drv_precision_from_name(const char *name, drv_precision *out) {
    for (unsigned i = 0; i < sizeof precision_names / sizeof precision_names[0]; i++)
        if (strcmp(name, precision_names[i]) == 0) {
            *out = (drv_precision)i;
            return true;
        }
    return false;
}

const char *drv_precision_name(drv_precision p) {
    return (unsigned)p < sizeof precision_names / sizeof precision_names[0] ? precision_names[p] : "f32";
}

bool drv_precision_needs_calibration(drv_precision p, const drv_precision_options *o) {
    bool weight_only = o && o->act_quant && strcmp(o->act_quant, "none") == 0;
    bool static_scales = o && o->act_quant && strcmp(o->act_quant, "tensor") == 0;
    return p == DRV_PRECISION_INT4_AWQ || p == DRV_PRECISION_INT4_GPTQ ||
           (p == DRV_PRECISION_INT8 && !weight_only) || (p == DRV_PRECISION_FP8 && static_scales);
}

static const char *const kv_cache_names[] = {"auto", "bf16", "f32", "fp8", "f16"};

bool drv_kv_cache_from_name(const char *name, drv_kv_cache *out) {
    for (unsigned i = 0; i < sizeof kv_cache_names / sizeof kv_cache_names[0]; i++)
        if (strcmp(name, kv_cache_names[i]) == 0) {
            *out = (drv_kv_cache)i;
            return true;
        }
    return false;
}

const char *drv_kv_cache_name(drv_kv_cache k) {
    return (unsigned)k < sizeof kv_cache_names / sizeof kv_cache_names[0] ? kv_cache_names[k] : "auto";
}

bool drv_backend_from_name(const char *name, drv_backend *out) {
    static const char *const names[] = {"auto", "host", "cuda", "ref"};
    for (unsigned i = 0; i < sizeof names / sizeof names[0]; i++)
        if (strcmp(name, names[i]) == 0) {
            *out = (drv_backend)i;
            return true;
        }
    return false;
}

bool drv_source_options_set(drv_source_options *o, const char *name, const char *value) {
    if (o->setting_count >= DRV_MAX_SETTINGS) return false;
    o->settings[o->setting_count].name = name;
    o->settings[o->setting_count].value = value;
    o->setting_count++;
    return true;
}

bool drv_source_options_allow_key(drv_source_options *o, const char *key) {
    if (o->allowed_key_count >= DRV_MAX_SETTINGS) return false;
    o->allowed_keys[o->allowed_key_count++] = key;
    return true;
}

bool drv_source_options_allow_unused_tensor(drv_source_options *o, const char *pattern) {
    if (o->allowed_unused_tensor_count >= DRV_MAX_SETTINGS) return false;
    o->allowed_unused_tensors[o->allowed_unused_tensor_count++] = pattern;
    return true;
}
