/* plan_compile.c - a model into a plan file. drv_write_plan is the driver's
 * one call into codegen (compile_plan.h), on a module the passes have
 * lowered (drv_source_load): the driver's options become the codegen's here
 * and nowhere else. */
#include "accuracy_gate.h"

#include "compile_plan.h"
#include "pass.h"
#include "program.h"

#include <stdlib.h>
#include <string.h>

_Static_assert((int)DRV_MAX_ARCHS == (int)CG_MAX_ARCHS,
               "drv_compile_options holds what cg_plan_options holds");

bool drv_write_plan(const ir_module *m, const drv_compile_options *o, const drv_plan_contents *contents,
                    const char *path, drv_compile_report *report, diag_engine *d) {
    cg_plan_options p = {0};
    memcpy(p.archs, o->archs, sizeof p.archs);
    p.arch_count = o->arch_count;
    p.host = o->host;
    p.jobs = o->jobs;
    p.no_cache = o->no_cache;
    if (contents->weights) {
        p.read_weight = drv_source_weights_read;
        p.read_packed_weight = drv_source_weights_read_packed;
        p.weight_context = contents->weights;
    }
    p.tokenizer_json = contents->tokenizer_json;
    json_t *gate = contents->gate ? drv_gate_to_json(contents->gate) : NULL;
    char *gate_json = gate ? json_dumps(gate, JSON_PRESERVE_ORDER | JSON_REAL_PRECISION(9)) : NULL;
    json_decref(gate);
    if (contents->gate && !gate_json) {
        diag_error(d, SMELT_NO_LOC, "out of memory for the manifest's accuracy gate");
        return false;
    }
    p.accuracy_gate_json = gate_json;
    _Static_assert((int)DRV_MAX_EOS <= (int)PROG_MAX_EOS, "a plan keeps every EOS id the driver reads");
    if (contents->eos) {
        p.eos_tokens = contents->eos->ids;
        p.eos_token_count = contents->eos->count;
    }
    p.progress = o->progress;
    p.progress_user = o->progress_user;
    cg_plan_report r;
    bool ok = cg_compile_plan(m, &p, path, &r, d);
    free(gate_json);
    if (ok && report) {
        *report = (drv_compile_report){
            .kernel_count = r.kernel_count,
            .launches_per_step = r.launches_per_step,
            .compile_jobs = r.compile_jobs,
            .cache_hits = r.cache_hits,
            .arena_bytes = r.arena_bytes,
            .weight_bytes = r.weight_bytes,
            .file_size = r.file_size,
            .seconds = r.seconds,
        };
        memcpy(report->content_hash, r.content_hash, sizeof report->content_hash);
    }
    return ok;
}

bool drv_compile(const char *model_path, const drv_source_options *given, const drv_compile_options *o,
                 const char *plan_path, drv_compile_report *report, diag_engine *d) {
    ir_module m = {0};
    drv_source_weights weights = {0};
    drv_lowering lowering = {.precision = o->precision,
                             .kv_cache = o->kv_cache,
                             .precision_options = o->precision_options,
                             .max_step_tokens = o->max_step_tokens,
                             .no_fuse = o->no_fuse,
                             .weights_path = o->weights_path};
    drv_source_options source;
    char *config_path = NULL;
    /* Calibration first: fp8's static activation scales are the precision pass's to print. */
    drv_model_options calibrated = drv_model_options_default();
    calibrated.model_path = model_path;
    calibrated.weights_path = o->weights_path;
    calibrated.precision = o->precision;
    calibrated.precision_options = o->precision_options;
    calibrated.source = *given;
    drv_calibration calibration = {0};
    pass_act_scale *act_scales = NULL;
    bool ok = drv_calibrate_for_precision(&calibrated, &calibration, d) &&
              drv_calibration_act_scales(&calibration, &act_scales, &lowering.act_scale_count, d);
    lowering.act_scales = act_scales;
    ok = ok && drv_source_with_folder(given, o->weights_path, &source, &config_path, d);
    if (ok) source = drv_source_options_for_weights(&source, o->weights_path); /* a GGUF: its metadata */
    drv_gate gate = {0};
    bool gated = o->precision_options.max_layer_error > 0;
    if (ok && gated) {
        ok = drv_gate_run(model_path, &source, &lowering, &calibration, &gate, d);
        lowering.precision_options.keep = gate.keep; /* the weights over the limit stay unquantized */
        if (ok) drv_gate_print(&gate, stderr);
    }
    ok = ok && drv_source_load(model_path, &source, &lowering, o->print_after, &m, d);
    if (ok && o->weights_path)
        ok = drv_source_weights_open(&weights, o->weights_path, source.config_path, &m, d);
    weights.calibration = &calibration;
    weights.gate = &gate;
    drv_eos eos = {.count = 0};
    if (ok) ok = drv_eos_tokens(source.config_path, drv_module_vocab(&m), &eos, d);
    char *tokenizer = NULL;
    if (ok && o->byte_tokenizer) ok = drv_tokenizer_json(source.config_path, &m, &tokenizer, d);
    drv_plan_contents contents = {.weights = o->weights_path ? &weights : NULL,
                                  .tokenizer_json = tokenizer,
                                  .eos = &eos,
                                  .gate = gated ? &gate : NULL};
    ok = ok && drv_write_plan(&m, o, &contents, plan_path, report, d);
    free(tokenizer);
    free(config_path);
    if (o->weights_path) drv_source_weights_close(&weights);
    free(act_scales);
    drv_calibration_free(&calibration);
    drv_gate_free(&gate);
    ir_module_free(&m);
    return ok;
}
