/* model.c - opening and stepping a model (driver.h): a plan on an engine,
 * a model source compiled in memory to a temporary plan, or a model source
 * interpreted by the reference backend. */
#include "accuracy_gate.h"

#include "pass.h"
#include "reference.h"

#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

struct drv_model {
    drv_model_info info;
    drv_source_options source; /* a source: the options with the config found (model_folder.c) */
    char *config_path;         /* source.config_path's storage */
    ref_model *ref;            /* backend ref */
    smelt_engine *engine;      /* every other backend */
    ir_module module;          /* a source: the module compiled or interpreted */
    drv_source_weights weights;
    drv_calibration calibration; /* int4-awq, int4-gptq, int8, the accuracy gate: their statistics */
    pass_act_scale *act_scales;  /* fp8 --act-quant tensor: from the calibration (its names) */
    drv_gate gate;               /* --max-layer-error */
    bool weights_open;
};

bool drv_is_plan_file(const char *path) {
    FILE *f = fopen(path, "rb");
    char magic[8] = {0};
    bool plan = f && fread(magic, 1, sizeof magic, f) == sizeof magic && memcmp(magic, "SMELTPLN", 8) == 0;
    if (f) fclose(f);
    return plan;
}

static const char *device_name(drv_backend backend) {
    switch (backend) {
    case DRV_BACKEND_HOST: return "host";
    case DRV_BACKEND_CUDA: return "cuda";
    default: return "auto";
    }
}

/* Compiles the model source into a temporary plan for this run: host
 * kernels, and cubins when a GPU may be used; weights inside. */
static bool compile_temporary_plan(const drv_model_options *o, drv_model *r, char *path, size_t size,
                                   diag_engine *d) {
    const char *folder = getenv("TMPDIR");
    snprintf(path, size, "%s/smelt-run-XXXXXX", folder && *folder ? folder : "/tmp");
    int fd = mkstemp(path);
    if (fd < 0) {
        diag_error(d, SMELT_NO_LOC, "cannot create a temporary plan in '%s': %s", folder ? folder : "/tmp",
                   strerror(errno));
        path[0] = '\0';
        return false;
    }
    close(fd);
    drv_compile_options c = {.host = true}; /* precision: the module is lowered already */
    if (o->backend != DRV_BACKEND_HOST) {
        c.archs[c.arch_count++] = 80;
        c.archs[c.arch_count++] = 90;
    }
    char *tokenizer = NULL;
    if (o->byte_tokenizer && !drv_tokenizer_json(r->source.config_path, &r->module, &tokenizer, d))
        return false;
    drv_plan_contents contents = {.weights = &r->weights, .tokenizer_json = tokenizer, .eos = &r->info.eos};
    bool ok = drv_write_plan(&r->module, &c, &contents, path, NULL, d);
    free(tokenizer);
    return ok;
}

static bool open_engine(drv_model *r, const drv_model_options *o, const char *plan_path,
                        const char *weights_path, diag_engine *d) {
    program p = {0};
    drv_ignored_tensors ignored = {0};
    if (!drv_plan_tables_read(plan_path, &p, &r->info.tokenizer, &ignored, d)) return false;
    smelt_plan *plan;
    bool ok = smelt_plan_open(plan_path, &plan) == SMELT_OK;
    if (!ok) {
        diag_error(d, SMELT_NO_LOC, "%s", smelt_last_error());
        program_free(&p);
        drv_ignored_tensors_free(&ignored);
        return false;
    }
    smelt_plan_info info;
    smelt_plan_get_info(plan, &info);
    smelt_engine_options options = smelt_engine_options_default();
    options.device = device_name(o->backend);
    options.expected_content_hash = o->expected_hash;
    options.gemv_max_tokens = o->gemv_max_tokens;
    ok = smelt_engine_create(plan, &options, &r->engine) == SMELT_OK;
    if (!ok) diag_error(d, SMELT_NO_LOC, "%s", smelt_last_error());
    if (ok && weights_path)
        ok = drv_bind_checkpoint(plan, o->random_weights ? NULL : &p, r->engine, weights_path, &ignored,
                                 &o->source, d);
    drv_ignored_tensors_free(&ignored);
    smelt_plan_close(plan);
    if (ok && o->random_weights) ok = drv_bind_random_weights(r->engine, &p, o->random_seed, d);
    program_free(&p);
    r->info.name = ok ? smelt_engine_device_name(r->engine) : "engine";
    r->info.vocab = info.vocab;
    r->info.max_step_tokens = (uint64_t)info.max_tokens;
    r->info.max_positions = (uint64_t)info.max_positions;
    r->info.eos.count = info.eos_token_count;
    for (uint32_t i = 0; i < info.eos_token_count && i < DRV_MAX_EOS; i++)
        r->info.eos.ids[i] = info.eos_tokens[i];
    return ok;
}

/* A source on the reference interpreter. */
static bool open_ref(drv_model *r, const drv_model_options *o, diag_engine *d) {
    r->ref = ref_model_create_packed(&r->module, drv_source_weights_read, drv_source_weights_read_packed,
                                     &r->weights, d);
    r->info.name = "ref";
    r->info.vocab = r->ref ? ref_model_vocab(r->ref) : 0;
    bool ok = r->ref != NULL;
    /* The sequence bound: the shortest KV cache, as a plan's max_positions. */
    for (uint32_t i = 0; i < r->module.op_count; i++) {
        const ir_op *op = ir_op_at(&r->module, i);
        if (op->dead || op->kind != IR_OP_ATTENTION) continue;
        uint64_t max_seq = (uint64_t)ir_op_int(&r->module, i, "max_seq");
        if (r->info.max_positions == 0 || max_seq < r->info.max_positions) r->info.max_positions = max_seq;
    }
    if (ok && o->byte_tokenizer) {
        char *text = NULL;
        ok = drv_tokenizer_json(r->source.config_path, &r->module, &text, d);
        if (ok) drv_tokenizer_parse(text, strlen(text), &r->info.tokenizer, d);
        free(text);
    }
    return ok;
}

/* A file named *.plan is a plan or nothing: never read as a model source
 * (a file too short for the magic used to be parsed as DSL). */
static bool check_plan_name(const char *path, diag_engine *d) {
    size_t n = strlen(path);
    if (n < 5 || strcmp(path + n - 5, ".plan") != 0) return true;
    struct stat st;
    if (stat(path, &st) != 0) {
        diag_error(d, SMELT_NO_LOC, "cannot read '%s': %s", path, strerror(errno));
        return false;
    }
    smelt_loc loc = {diag_file_id(d, path), 0, 0};
    if (S_ISREG(st.st_mode) && st.st_size < 8)
        diag_error(d, loc, "not a plan: %lld bytes, too short for its 8-byte magic", (long long)st.st_size);
    else
        diag_error(
            d, loc,
            "not a plan: it does not start with 'SMELTPLN' (a model source is named *.smelt or *.json)");
    return false;
}

static bool open_model(drv_model *r, const drv_model_options *o, diag_engine *d) {
    bool is_plan = drv_is_plan_file(o->model_path), ref = o->backend == DRV_BACKEND_REF;
    if (!is_plan && !check_plan_name(o->model_path, d)) return false;
    if (is_plan && ref) {
        diag_error(d, SMELT_NO_LOC,
                   "the ref backend interprets a model's IR: give it the model source, not a plan");
        return false;
    }
    if (is_plan) return open_engine(r, o, o->model_path, o->weights_path, d);
    if (o->expected_hash) {
        diag_error(d, SMELT_NO_LOC,
                   "--expect-hash pins a plan file's content; '%.*s%s' is a model source, compiled in memory",
                   DIAG_NAME(o->model_path));
        return false;
    }

    /* The reference interprets in f32 whatever the preset, with the preset's
     * quantized weights dequantized (quant_value): the oracle of a plan
     * compiled with the same preset; and with an fp8 KV cache's rounding (a
     * cache in the activation dtype is f32 there too). A plan gets both. */
    bool ref_auto_cache = ref && o->kv_cache != DRV_KV_CACHE_FP8;
    drv_lowering lowering = {.precision = o->precision,
                             .precision_options = o->precision_options,
                             .kv_cache = ref_auto_cache ? DRV_KV_CACHE_AUTO : o->kv_cache,
                             .no_fuse = o->no_fuse,
                             .weights_path = o->weights_path};
    if (ref) lowering.precision_options.activations = "f32";
    /* Calibration first: fp8's static activation scales are the precision pass's to print. */
    bool ok = drv_calibrate_for_precision(o, &r->calibration, d) &&
              drv_calibration_act_scales(&r->calibration, &r->act_scales, &lowering.act_scale_count, d);
    lowering.act_scales = r->act_scales;
    ok = ok && drv_source_with_folder(&o->source, o->weights_path, &r->source, &r->config_path, d);
    if (ok)
        r->source = drv_source_options_for_weights(&r->source, o->weights_path); /* a GGUF: its metadata */
    if (ok && !o->weights_path) {
        diag_error(d, SMELT_NO_LOC, "running a model source needs --weights");
        ok = false;
    }
    if (ok && o->precision_options.max_layer_error > 0) {
        ok = drv_gate_run(o->model_path, &r->source, &lowering, &r->calibration, &r->gate, d);
        lowering.precision_options.keep = r->gate.keep; /* the weights over the limit stay unquantized */
        if (ok) drv_gate_print(&r->gate, stderr);
    }
    ok = ok && drv_source_load(o->model_path, &r->source, &lowering, NULL, &r->module, d);
    if (ok) ok = drv_eos_tokens(r->source.config_path, drv_module_vocab(&r->module), &r->info.eos, d);
    if (ok) {
        r->weights_open = true; /* closed later even when binding fails half way */
        ok = drv_source_weights_open(&r->weights, o->weights_path, r->source.config_path, &r->module, d);
    }
    r->weights.calibration = &r->calibration;
    r->weights.gate = &r->gate;
    if (ok && ref) return open_ref(r, o, d);
    char plan_path[4096] = "";
    ok = ok && compile_temporary_plan(o, r, plan_path, sizeof plan_path, d);
    ok = ok && open_engine(r, o, plan_path, NULL, d);
    if (plan_path[0]) unlink(plan_path);
    return ok;
}

bool drv_model_open(const drv_model_options *o, drv_model **out, diag_engine *d) {
    *out = NULL;
    drv_model *r = calloc(1, sizeof *r);
    if (!r) {
        diag_error(d, SMELT_NO_LOC, "out of memory");
        return false;
    }
    r->info.tokenizer = (drv_tokenizer){false, -1, -1};
    if (!open_model(r, o, d)) {
        drv_model_close(r);
        return false;
    }
    *out = r;
    return true;
}

const drv_model_info *drv_model_get_info(const drv_model *m) { return &m->info; }

ref_model *drv_model_ref(drv_model *m) { return m->ref; }

const ir_module *drv_model_module(const drv_model *m) { return &m->module; }

/* The reference computes every row; the last is copied out when that is all
 * that is asked for. */
static bool ref_step(drv_model *m, const int32_t *ids, const int32_t *pos, uint32_t n, drv_rows rows,
                     float *logits, diag_engine *d) {
    uint64_t vocab = m->info.vocab;
    if (rows == DRV_ROWS_ALL) return ref_model_step(m->ref, ids, pos, n, logits, (uint64_t)n * vocab, d);
    float *all = malloc((size_t)n * vocab * sizeof *all);
    if (!all) {
        diag_error(d, SMELT_NO_LOC, "out of memory for the logits of %u tokens", n);
        return false;
    }
    bool ok = ref_model_step(m->ref, ids, pos, n, all, (uint64_t)n * vocab, d);
    if (ok) memcpy(logits, all + (uint64_t)(n - 1) * vocab, vocab * sizeof *all);
    free(all);
    return ok;
}

bool drv_model_step(drv_model *m, const int32_t *ids, const int32_t *pos, uint32_t n, drv_rows rows,
                    float *logits, diag_engine *d) {
    if (m->ref) return ref_step(m, ids, pos, n, rows, logits, d);
    bool all = rows == DRV_ROWS_ALL;
    smelt_status s = smelt_engine_forward(m->engine, ids, pos, n, all ? SMELT_LOGITS_ALL : SMELT_LOGITS_LAST,
                                          logits, (size_t)(all ? n : 1) * m->info.vocab);
    if (s != SMELT_OK) diag_error(d, SMELT_NO_LOC, "%s", smelt_last_error());
    return s == SMELT_OK;
}

bool drv_model_step_greedy(drv_model *m, const int32_t *ids, const int32_t *pos, uint32_t n, int32_t *token,
                           diag_engine *d) {
    if (m->engine) {
        smelt_status s = smelt_engine_forward_greedy(m->engine, ids, pos, n, token);
        if (s != SMELT_OK) diag_error(d, SMELT_NO_LOC, "%s", smelt_last_error());
        return s == SMELT_OK;
    }
    uint64_t vocab = m->info.vocab;
    float *logits = malloc(vocab * sizeof *logits);
    if (!logits) {
        diag_error(d, SMELT_NO_LOC, "out of memory for a row of logits");
        return false;
    }
    bool ok = drv_model_step(m, ids, pos, n, DRV_ROWS_LAST, logits, d);
    const float *row = logits;
    int64_t best = -1;
    for (uint64_t i = 0; ok && i < vocab; i++)
        if (!isnan(row[i]) && (best < 0 || row[i] > row[best])) best = (int64_t)i;
    if (ok && best < 0) {
        diag_error(d, SMELT_NO_LOC, "every logit is NaN: the model's arithmetic broke down");
        ok = false;
    }
    if (ok) *token = (int32_t)best;
    free(logits);
    return ok;
}

void drv_model_reset(drv_model *m) {
    if (m->ref) ref_model_reset(m->ref);
    if (m->engine) smelt_engine_reset(m->engine);
}

void drv_model_close(drv_model *m) {
    if (!m) return;
    ref_model_free(m->ref);
    smelt_engine_destroy(m->engine);
    if (m->weights_open) drv_source_weights_close(&m->weights);
    free(m->act_scales);
    drv_calibration_free(&m->calibration);
    drv_gate_free(&m->gate);
    ir_module_free(&m->module);
    free(m->config_path);
    free(m);
}
