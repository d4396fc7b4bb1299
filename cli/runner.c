/* runner.c - opening and stepping what `smelt run` and `smelt eval` use
 * (see runner.h). */
#include "runner.h"

#include "compile_plan.h"
#include "plan_read.h"
#include "program.h"

#include <errno.h>
#include <jansson.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static bool is_plan_file(const char *path) {
    FILE *f = fopen(path, "rb");
    char magic[8] = {0};
    bool plan = f && fread(magic, 1, sizeof magic, f) == sizeof magic && memcmp(magic, "SMELTPLN", 8) == 0;
    if (f) fclose(f);
    return plan;
}

char *cli_tokenizer_json(const char *config_path) {
    json_t *config = config_path ? json_load_file(config_path, 0, NULL) : NULL;
    json_t *bos = json_object_get(config, "bos_token_id"), *eos = json_object_get(config, "eos_token_id");
    json_t *t = json_pack("{s:s, s:I, s:I}", "type", "bytes", "bos", json_is_integer(bos) ? json_integer_value(bos) : -1,
                          "eos", json_is_integer(eos) ? json_integer_value(eos) : -1);
    char *text = json_dumps(t, JSON_COMPACT | JSON_PRESERVE_ORDER);
    json_decref(t);
    json_decref(config);
    return text;
}

/* Compiles the model source into a temporary plan for this run: host kernels,
 * and cubins when a GPU may be used; weights inside. */
static bool compile_temporary_plan(const cli_runner_options *o, cli_runner *r, char *path, size_t size,
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
    cg_plan_options p = {.codegen.precision = o->precision, .host = true};
    if (strcmp(o->backend, "host") != 0) {
        p.archs[p.arch_count++] = 80;
        p.archs[p.arch_count++] = 90;
    }
    p.read_weight = cli_weights_read;
    p.weight_context = &r->weights;
    char *tokenizer = o->tokenizer ? cli_tokenizer_json(o->frontend.config_path) : NULL;
    p.tokenizer_json = tokenizer;
    cg_plan_report report;
    bool ok = cg_compile_plan(&r->module, &p, path, &report, d);
    free(tokenizer);
    return ok;
}

/* Binds every checkpoint tensor the plan names (for a plan compiled
 * without weights), converted to f32 first whatever its dtype. */
static bool bind_checkpoint(const smelt_plan *plan, smelt_engine *engine, const char *weights_path,
                            diag_engine *d) {
    st_checkpoint ck;
    if (!st_checkpoint_open(weights_path, &ck, d)) return false;
    bool ok = true;
    for (uint32_t i = 0; i < ck.tensor_count && ok; i++) {
        const st_tensor *t = ck.tensors[i];
        /* A tensor the plan does not name is not used by the model. */
        if (!st_dtype_is_float(t->dtype) || !smelt_plan_has_weight(plan, t->name)) continue;
        uint64_t count = t->byte_size / st_dtype_size(t->dtype);
        float *values = malloc(count * sizeof *values + 1);
        if (!values) SMELT_DIE("out of memory");
        st_convert_to_f32(t->dtype, t->data, values, count);
        int64_t shape[ST_MAX_RANK];
        for (uint32_t k = 0; k < t->rank; k++) shape[k] = (int64_t)t->shape[k];
        smelt_status s = smelt_engine_bind_weight(engine, t->name, SMELT_DTYPE_F32, values, shape, t->rank);
        free(values);
        if (s != SMELT_OK) {
            diag_error(d, SMELT_NO_LOC, "%s", smelt_last_error());
            ok = false;
        }
    }
    st_checkpoint_close(&ck);
    return ok;
}

/* Reads the plan's launch program (its weight table) and TOKENIZER section. */
static bool read_plan_tables(const char *plan_path, program *p, cli_tokenizer *tokenizer, diag_engine *d) {
    plan_file file;
    char error[512];
    const uint8_t *data;
    uint64_t size;
    if (!plan_open(plan_path, &file, error, sizeof error) || !plan_section(&file, PLAN_SECTION_PROGRAM, &data, &size) ||
        !program_decode(data, size, p, error, sizeof error)) {
        diag_error(d, SMELT_NO_LOC, "%s", error);
        plan_close(&file);
        return false;
    }
    if (plan_section(&file, PLAN_SECTION_TOKENIZER, &data, &size)) {
        json_t *t = json_loadb((const char *)data, size, 0, NULL);
        json_t *type = json_object_get(t, "type");
        tokenizer->present = json_is_string(type) && strcmp(json_string_value(type), "bytes") == 0;
        tokenizer->bos = (int32_t)json_integer_value(json_object_get(t, "bos"));
        tokenizer->eos = (int32_t)json_integer_value(json_object_get(t, "eos"));
        if (!tokenizer->present) diag_warning(d, SMELT_NO_LOC, "the plan's tokenizer is of a kind this smelt does not know");
        json_decref(t);
    }
    plan_close(&file);
    return true;
}

/* Binds every weight of the plan to uniform noise in [-0.05, 0.05) from a
 * xorshift generator: enough to time a plan, meaningless as a model. */
static bool bind_random_weights(smelt_engine *engine, const program *p, unsigned seed, diag_engine *d) {
    uint64_t state = 0x9e3779b97f4a7c15ull ^ seed;
    bool ok = true;
    for (uint32_t i = 0; i < p->weight_count && ok; i++) {
        const prog_weight *w = &p->weights[i];
        uint64_t count = w->bytes / smelt_dtype_element_bytes(w->dtype);
        float *values = malloc(count * sizeof *values + 1);
        if (!values) SMELT_DIE("out of memory");
        for (uint64_t k = 0; k < count; k++) {
            state ^= state << 13, state ^= state >> 7, state ^= state << 17;
            values[k] = (float)((double)(state >> 11) / 9007199254740992.0 - 0.5) * 0.1f;
        }
        ok = smelt_engine_bind_weight(engine, w->name, SMELT_DTYPE_F32, values, w->shape, w->rank) == SMELT_OK;
        if (!ok) diag_error(d, SMELT_NO_LOC, "%s", smelt_last_error());
        free(values);
    }
    return ok;
}

static bool open_engine(cli_runner *r, const cli_runner_options *o, const char *plan_path, const char *weights_path,
                        diag_engine *d) {
    program p = {0};
    if (!read_plan_tables(plan_path, &p, &r->tokenizer, d)) return false;
    smelt_plan *plan;
    bool ok = smelt_plan_open(plan_path, &plan) == SMELT_OK;
    if (!ok) {
        diag_error(d, SMELT_NO_LOC, "%s", smelt_last_error());
        program_free(&p);
        return false;
    }
    smelt_plan_info info;
    smelt_plan_get_info(plan, &info);
    smelt_engine_options options = smelt_engine_options_default();
    options.device = o->backend;
    ok = smelt_engine_create(plan, &options, &r->engine) == SMELT_OK;
    if (!ok) diag_error(d, SMELT_NO_LOC, "%s", smelt_last_error());
    if (ok && weights_path) ok = bind_checkpoint(plan, r->engine, weights_path, d);
    smelt_plan_close(plan);
    if (ok && o->random_weights) ok = bind_random_weights(r->engine, &p, o->random_seed, d);
    program_free(&p);
    r->name = ok ? smelt_engine_device_name(r->engine) : "engine";
    r->vocab = info.vocab;
    r->max_step_tokens = (uint64_t)info.max_tokens;
    return ok;
}

bool cli_runner_open(cli_runner *r, const cli_runner_options *o, diag_engine *d) {
    memset(r, 0, sizeof *r);
    r->tokenizer = (cli_tokenizer){false, -1, -1};
    bool is_plan = is_plan_file(o->model_path), ref = strcmp(o->backend, "ref") == 0;
    if (is_plan && ref) {
        diag_error(d, SMELT_NO_LOC, "the ref backend interprets a model's IR: give it the model source, not a plan");
        return false;
    }
    if (is_plan) return open_engine(r, o, o->model_path, o->weights_path, d);

    bool ok = cli_compile_model(o->model_path, &o->frontend, NULL, &r->module, d);
    if (ok && !o->weights_path) {
        diag_error(d, SMELT_NO_LOC, "running a model source needs --weights");
        ok = false;
    }
    if (ok) {
        r->weights_open = true; /* closed later even when binding fails half way */
        ok = cli_weights_open(&r->weights, o->weights_path, &r->module, d);
    }
    if (ok && ref) {
        ok = (r->ref = ref_model_create(&r->module, cli_weights_read, &r->weights, d)) != NULL;
        r->name = "ref";
        r->vocab = ok ? ref_model_vocab(r->ref) : 0;
        if (o->tokenizer) {
            char *text = cli_tokenizer_json(o->frontend.config_path);
            json_t *t = json_loads(text, 0, NULL);
            r->tokenizer = (cli_tokenizer){true, (int32_t)json_integer_value(json_object_get(t, "bos")),
                                           (int32_t)json_integer_value(json_object_get(t, "eos"))};
            json_decref(t);
            free(text);
        }
        return ok;
    }
    char plan_path[4096] = "";
    ok = ok && compile_temporary_plan(o, r, plan_path, sizeof plan_path, d);
    ok = ok && open_engine(r, o, plan_path, NULL, d);
    if (plan_path[0]) unlink(plan_path);
    return ok;
}

bool cli_runner_step(cli_runner *r, const int32_t *ids, const int32_t *pos, uint32_t n, float *logits,
                     diag_engine *d) {
    if (r->ref) return ref_model_step(r->ref, ids, pos, n, logits, (uint64_t)n * r->vocab, d);
    smelt_status s = smelt_engine_forward(r->engine, ids, pos, n, logits, (size_t)n * r->vocab);
    if (s != SMELT_OK) diag_error(d, SMELT_NO_LOC, "%s", smelt_last_error());
    return s == SMELT_OK;
}

void cli_runner_reset(cli_runner *r) {
    if (r->ref) ref_model_reset(r->ref);
    if (r->engine) smelt_engine_reset(r->engine);
}

void cli_runner_close(cli_runner *r) {
    ref_model_free(r->ref);
    smelt_engine_destroy(r->engine);
    if (r->weights_open) cli_weights_close(&r->weights);
    ir_module_free(&r->module);
    memset(r, 0, sizeof *r);
}

int cli_runner_option(cli_args *a, cli_runner_options *o) {
    const char *value;
    if (cli_flag_value(a, "--config", &value)) {
        if (!value) return CLI_USAGE_ERROR;
        o->frontend.config_path = value;
    } else if (cli_flag_value(a, "--set", &value)) {
        if (!value || !cli_add_setting(a, &o->frontend, value)) return CLI_USAGE_ERROR;
    } else if (cli_flag_value(a, "--weights", &value)) {
        if (!value) return CLI_USAGE_ERROR;
        o->weights_path = value;
    } else if (cli_flag_value(a, "--backend", &value)) {
        if (!value) return CLI_USAGE_ERROR;
        if (strcmp(value, "auto") && strcmp(value, "host") && strcmp(value, "cuda") && strcmp(value, "ref")) {
            cli_usage_error(a, "unknown backend '%s' (auto, host, cuda or ref)", value);
            return CLI_USAGE_ERROR;
        }
        o->backend = value;
    } else if (cli_flag_value(a, "--precision", &value)) {
        if (!value || !cli_parse_precision(a, value, &o->precision)) return CLI_USAGE_ERROR;
    } else if (cli_flag_value(a, "--tokenizer", &value)) {
        if (!value || !cli_parse_tokenizer(a, value)) return CLI_USAGE_ERROR;
        o->tokenizer = value;
    } else {
        return CLI_NOT_MINE;
    }
    return CLI_OK;
}
