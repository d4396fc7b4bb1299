/* cmd_run.c - `smelt run`: greedy generation from a prompt of token ids.
 *
 * Two kinds of runner behind one generation loop:
 *   - a plan on the "host" or "cuda" device, through the runtime's public API
 *     (smelt.h); a model source (.smelt/.json) is first compiled in memory;
 *   - the fp32 reference backend ("ref"), which interprets the IR of a model
 *     source directly: the oracle the other two are checked against.
 * Prints the prompt, then each generated token as it is produced, then the
 * time of prefill and decode; --dump-logits keeps every step's logits:
 *   row 0: after the prompt; row i: after feeding the i-th generated token. */
#include "cli.h"

#include "compile_plan.h"
#include "npy.h"
#include "plan_read.h"
#include "program.h"
#include "reference.h"
#include "smelt.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char usage[] =
    "usage: smelt run MODEL|PLAN --prompt-ids IDS [options]\n"
    "\n"
    "Generates greedily from a prompt of token ids and prints the tokens as\n"
    "they are produced, then the tokens/s of prefill and decode. PLAN is a file\n"
    "from `smelt compile`; a MODEL source is compiled in memory first.\n"
    "\n"
    "options:\n"
    "  --backend auto|host|cuda|ref\n"
    "                         auto (default): cuda where a GPU is present, else\n"
    "                         host (the CPU simulator running the same kernels);\n"
    "                         ref: the fp32 reference interpreter (MODEL only)\n"
    "  --config FILE          bind params from a Hugging Face config.json (MODEL)\n"
    "  --set NAME=VALUE       set a param (MODEL); may repeat\n"
    "  --weights PATH         a .safetensors file, a model.safetensors.index.json,\n"
    "                         or a folder; needed unless the plan holds weights\n"
    "  --precision f32|bf16   storage when compiling MODEL in memory (default f32)\n"
    "  --prompt-ids 1,2,3     the prompt's token ids\n"
    "  --max-tokens N         tokens to generate (default 16)\n"
    "  --dump-logits F.npy    write float32 logits [N, vocab]: row 0 after the\n"
    "                         prompt, row i after the i-th generated token\n"
    "  --random-weights SEED  bind every weight of PLAN to random values (for\n"
    "                         speed measurements of plans compiled without weights)\n"
    "  --max-errors N         stop after N errors (default 20, 0: no limit)\n"
    "  -h, --help             show this help\n";

enum { RUN_MAX_PROMPT = 1 << 20, RUN_MAX_TOKENS = 1 << 20 };

typedef struct run_command {
    const char *model_path, *weights_path, *prompt_text, *dump_path, *backend;
    unsigned max_tokens, max_errors, random_seed;
    bool random_weights;
    cg_precision precision;
    fe_options frontend;
} run_command;

static int parse_arguments(int argc, char **argv, run_command *c) {
    cli_args a = {argc, argv, 1, "smelt run"};
    const char *value;
    c->max_tokens = 16;
    c->max_errors = 20;
    c->backend = "auto";
    c->precision = CG_PRECISION_F32;
    while (a.index < a.argc) {
        const char *arg = a.argv[a.index];
        if (cli_flag(&a, "--help") || cli_flag(&a, "-h")) {
            fputs(usage, stdout);
            return CLI_HELP_SHOWN;
        } else if (cli_flag_value(&a, "--config", &value)) {
            if (!value) return CLI_USAGE_ERROR;
            c->frontend.config_path = value;
        } else if (cli_flag_value(&a, "--set", &value)) {
            if (!value || !cli_add_setting(&a, &c->frontend, value)) return CLI_USAGE_ERROR;
        } else if (cli_flag_value(&a, "--weights", &value)) {
            if (!value) return CLI_USAGE_ERROR;
            c->weights_path = value;
        } else if (cli_flag_value(&a, "--prompt-ids", &value)) {
            if (!value) return CLI_USAGE_ERROR;
            c->prompt_text = value;
        } else if (cli_flag_value(&a, "--max-tokens", &value)) {
            if (!value || !cli_parse_count(&a, value, &c->max_tokens)) return CLI_USAGE_ERROR;
        } else if (cli_flag_value(&a, "--backend", &value)) {
            if (!value) return CLI_USAGE_ERROR;
            if (strcmp(value, "auto") && strcmp(value, "host") && strcmp(value, "cuda") && strcmp(value, "ref")) {
                cli_usage_error(&a, "unknown backend '%s' (auto, host, cuda or ref)", value);
                return CLI_USAGE_ERROR;
            }
            c->backend = value;
        } else if (cli_flag_value(&a, "--precision", &value)) {
            if (!value) return CLI_USAGE_ERROR;
            if (strcmp(value, "f32") == 0) c->precision = CG_PRECISION_F32;
            else if (strcmp(value, "bf16") == 0) c->precision = CG_PRECISION_BF16;
            else {
                cli_usage_error(&a, "unknown precision '%s' (f32 or bf16)", value);
                return CLI_USAGE_ERROR;
            }
        } else if (cli_flag_value(&a, "--random-weights", &value)) {
            if (!value || !cli_parse_count(&a, value, &c->random_seed)) return CLI_USAGE_ERROR;
            c->random_weights = true;
        } else if (cli_flag_value(&a, "--dump-logits", &value)) {
            if (!value) return CLI_USAGE_ERROR;
            c->dump_path = value;
        } else if (cli_flag_value(&a, "--max-errors", &value)) {
            if (!value || !cli_parse_count(&a, value, &c->max_errors)) return CLI_USAGE_ERROR;
        } else if (arg[0] == '-' && arg[1] != '\0') {
            cli_usage_error(&a, "unknown option '%s'", arg);
            return CLI_USAGE_ERROR;
        } else if (c->model_path) {
            cli_usage_error(&a, "more than one model file ('%s' and '%s')", c->model_path, arg);
            return CLI_USAGE_ERROR;
        } else {
            c->model_path = arg;
            a.index++;
        }
    }
    const char *missing = !c->model_path ? "no model or plan given" : !c->prompt_text ? "no --prompt-ids given" : NULL;
    if (missing) {
        cli_usage_error(&a, "%s", missing);
        return CLI_USAGE_ERROR;
    }
    if (c->max_tokens > RUN_MAX_TOKENS) {
        cli_usage_error(&a, "--max-tokens is at most %d", RUN_MAX_TOKENS);
        return CLI_USAGE_ERROR;
    }
    return CLI_OK;
}

/* "1,2,3" -> ids; false with a message naming the bad entry. */
static bool parse_prompt(const char *text, int32_t **ids, uint32_t *count, diag_engine *d) {
    size_t capacity = 1;
    for (const char *p = text; *p; p++) capacity += *p == ',';
    if (capacity > RUN_MAX_PROMPT) {
        diag_error(d, SMELT_NO_LOC, "--prompt-ids: more than %d ids", RUN_MAX_PROMPT);
        return false;
    }
    *ids = malloc(capacity * sizeof **ids);
    if (!*ids) SMELT_DIE("out of memory");
    *count = 0;
    const char *p = text;
    for (;;) {
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX || (*end != ',' && *end != '\0')) {
            diag_error(d, SMELT_NO_LOC, "--prompt-ids: entry %u is not a token id (expected 1,2,3)", *count + 1);
            return false;
        }
        (*ids)[(*count)++] = (int32_t)v;
        if (*end == '\0') return true;
        p = end + 1;
    }
}

/* ---- runners ----------------------------------------------------------------- */

/* One step of n tokens: logits of all n into logits[n * vocab]. */
typedef struct runner {
    const char *name;
    uint64_t vocab;
    uint64_t max_step_tokens; /* prompts longer than this run in chunks */
    bool (*step)(struct runner *r, const int32_t *ids, const int32_t *pos, uint32_t n, float *logits,
                 diag_engine *d);
    ref_model *ref;
    smelt_engine *engine;
} runner;

static bool ref_step(runner *r, const int32_t *ids, const int32_t *pos, uint32_t n, float *logits, diag_engine *d) {
    return ref_model_step(r->ref, ids, pos, n, logits, (uint64_t)n * r->vocab, d);
}

static bool engine_step(runner *r, const int32_t *ids, const int32_t *pos, uint32_t n, float *logits,
                        diag_engine *d) {
    smelt_status s = smelt_engine_forward(r->engine, ids, pos, n, logits, (size_t)n * r->vocab);
    if (s != SMELT_OK) diag_error(d, SMELT_NO_LOC, "%s", smelt_last_error());
    return s == SMELT_OK;
}

/* ---- generation ---------------------------------------------------------------- */

static int32_t argmax(const float *row, uint64_t n) {
    uint64_t best = 0;
    for (uint64_t i = 1; i < n; i++)
        if (row[i] > row[best]) best = i;
    return (int32_t)best;
}

static double seconds_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Prefill (in chunks of the runner's step bound), then one token per step;
 * rows[i * vocab] keeps the logits that choose token i+1. */
static bool generate(runner *r, const int32_t *prompt, uint32_t prompt_length, uint32_t max_tokens, float *rows,
                     diag_engine *d) {
    uint64_t vocab = r->vocab, chunk = r->max_step_tokens ? r->max_step_tokens : prompt_length;
    if (chunk > prompt_length) chunk = prompt_length;
    float *logits = malloc(chunk * vocab * sizeof *logits);
    int32_t *positions = malloc(prompt_length * sizeof *positions);
    if (!logits || !positions) SMELT_DIE("out of memory");
    for (uint32_t i = 0; i < prompt_length; i++) positions[i] = (int32_t)i;

    double start = seconds_now();
    bool ok = true;
    for (uint32_t at = 0; ok && at < prompt_length; at += (uint32_t)chunk) {
        uint32_t n = prompt_length - at < chunk ? prompt_length - at : (uint32_t)chunk;
        ok = r->step(r, prompt + at, positions + at, n, logits, d);
        if (ok && at + n == prompt_length) memcpy(rows, logits + (uint64_t)(n - 1) * vocab, vocab * sizeof *rows);
    }
    double prefill_seconds = seconds_now() - start;

    if (ok) printf("tokens:");
    start = seconds_now();
    uint32_t decoded = 0;
    for (uint32_t i = 1; ok && i <= max_tokens; i++) {
        int32_t token = argmax(rows + (uint64_t)(i - 1) * vocab, vocab);
        printf(" %d", token);
        fflush(stdout);
        if (i == max_tokens) break;
        int32_t position = (int32_t)(prompt_length + i - 1);
        ok = r->step(r, &token, &position, 1, rows + (uint64_t)i * vocab, d);
        decoded += ok;
    }
    if (ok || decoded > 0) printf("\n");
    double decode_seconds = seconds_now() - start;
    if (ok)
        fprintf(stderr, "%s: prefill %u tokens in %.3f s (%.1f tokens/s), decode %u tokens in %.3f s (%.1f tokens/s)\n",
                r->name, prompt_length, prefill_seconds, prompt_length / (prefill_seconds > 0 ? prefill_seconds : 1e-9),
                decoded, decode_seconds, decoded / (decode_seconds > 0 ? decode_seconds : 1e-9));
    free(positions);
    free(logits);
    return ok;
}

/* ---- opening what runs ---------------------------------------------------------- */

static bool is_plan_file(const char *path) {
    FILE *f = fopen(path, "rb");
    char magic[8] = {0};
    bool plan = f && fread(magic, 1, sizeof magic, f) == sizeof magic && memcmp(magic, "SMELTPLN", 8) == 0;
    if (f) fclose(f);
    return plan;
}

/* Compiles the model source into a temporary plan for this run: host kernels,
 * and cubins when a GPU may be used; weights inside. */
static bool compile_temporary_plan(const run_command *c, const ir_module *m, cli_weights *weights, char *path,
                                   size_t size, diag_engine *d) {
    const char *folder = getenv("TMPDIR");
    snprintf(path, size, "%s/smelt-run-XXXXXX", folder && *folder ? folder : "/tmp");
    int fd = mkstemp(path);
    if (fd < 0) {
        diag_error(d, SMELT_NO_LOC, "cannot create a temporary plan in '%s': %s", folder ? folder : "/tmp",
                   strerror(errno));
        return false;
    }
    close(fd);
    cg_plan_options o = {.codegen.precision = c->precision, .host = true};
    if (strcmp(c->backend, "host") != 0) {
        o.archs[o.arch_count++] = 80;
        o.archs[o.arch_count++] = 90;
    }
    o.read_weight = cli_weights_read;
    o.weight_context = weights;
    cg_plan_report report;
    bool ok = cg_compile_plan(m, &o, path, &report, d);
    if (!ok) unlink(path);
    return ok;
}

/* Binds every checkpoint tensor the plan names (for a plan compiled
 * without weights). Tensors converted to f32 first, whatever their dtype. */
static bool bind_checkpoint(smelt_engine *engine, const char *weights_path, diag_engine *d) {
    st_checkpoint ck;
    if (!st_checkpoint_open(weights_path, &ck, d)) return false;
    bool ok = true;
    for (uint32_t i = 0; i < ck.tensor_count && ok; i++) {
        const st_tensor *t = ck.tensors[i];
        if (!st_dtype_is_float(t->dtype)) continue;
        uint64_t count = t->byte_size / st_dtype_size(t->dtype);
        float *values = malloc(count * sizeof *values + 1);
        if (!values) SMELT_DIE("out of memory");
        st_convert_to_f32(t->dtype, t->data, values, count);
        int64_t shape[ST_MAX_RANK];
        for (uint32_t k = 0; k < t->rank; k++) shape[k] = (int64_t)t->shape[k];
        smelt_status s = smelt_engine_bind_weight(engine, t->name, SMELT_DTYPE_F32, values, shape, t->rank);
        free(values);
        /* A tensor the plan does not name is not used by the model. */
        if (s != SMELT_OK && !strstr(smelt_last_error(), "has no weight")) {
            diag_error(d, SMELT_NO_LOC, "%s", smelt_last_error());
            ok = false;
        }
    }
    st_checkpoint_close(&ck);
    return ok;
}

/* Binds every weight of the plan to uniform noise in [-0.05, 0.05) from a
 * xorshift generator: enough to time a plan, meaningless as a model. */
static bool bind_random_weights(smelt_engine *engine, const char *plan_path, unsigned seed, diag_engine *d) {
    plan_file file;
    char error[512];
    const uint8_t *data;
    uint64_t size;
    program p;
    if (!plan_open(plan_path, &file, error, sizeof error) || !plan_section(&file, PLAN_SECTION_PROGRAM, &data, &size) ||
        !program_decode(data, size, &p, error, sizeof error)) {
        diag_error(d, SMELT_NO_LOC, "%s", error);
        plan_close(&file);
        return false;
    }
    uint64_t state = 0x9e3779b97f4a7c15ull ^ seed;
    bool ok = true;
    for (uint32_t i = 0; i < p.weight_count && ok; i++) {
        const prog_weight *w = &p.weights[i];
        uint64_t count = w->bytes / prog_dtype_size(w->dtype);
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
    program_free(&p);
    plan_close(&file);
    return ok;
}

static bool open_engine(const run_command *c, const char *plan_path, runner *r, diag_engine *d) {
    smelt_plan *plan;
    if (smelt_plan_open(plan_path, &plan) != SMELT_OK) {
        diag_error(d, SMELT_NO_LOC, "%s", smelt_last_error());
        return false;
    }
    smelt_plan_info info;
    smelt_plan_get_info(plan, &info);
    smelt_engine_options o = smelt_engine_options_default();
    o.device = c->backend;
    bool ok = smelt_engine_create(plan, &o, &r->engine) == SMELT_OK;
    if (!ok) diag_error(d, SMELT_NO_LOC, "%s", smelt_last_error());
    smelt_plan_close(plan);
    if (ok && c->weights_path) ok = bind_checkpoint(r->engine, c->weights_path, d);
    if (ok && c->random_weights) ok = bind_random_weights(r->engine, plan_path, c->random_seed, d);
    r->name = ok ? smelt_engine_device_name(r->engine) : "engine";
    r->vocab = info.vocab;
    r->max_step_tokens = (uint64_t)info.max_tokens;
    r->step = engine_step;
    return ok;
}

int cmd_run(int argc, char **argv) {
    run_command c = {0};
    int status = parse_arguments(argc, argv, &c);
    if (status != CLI_OK) return status == CLI_HELP_SHOWN ? CLI_OK : status;

    diag_engine d;
    diag_init(&d, stderr);
    d.max_errors = c.max_errors;
    ir_module m = {0};
    cli_weights weights = {0};
    bool weights_open = false;
    runner r = {0};
    int32_t *prompt = NULL;
    float *rows = NULL;
    uint32_t prompt_length = 0;
    char temporary_plan[4096] = "";
    bool is_plan = is_plan_file(c.model_path);

    bool ok = parse_prompt(c.prompt_text, &prompt, &prompt_length, &d);
    if (ok && is_plan && strcmp(c.backend, "ref") == 0) {
        diag_error(&d, SMELT_NO_LOC, "the ref backend interprets a model's IR: give it the model source, not a plan");
        ok = false;
    }
    if (ok && !is_plan) {
        ok = cli_compile_model(c.model_path, &c.frontend, NULL, &m, &d);
        if (ok && !c.weights_path) {
            diag_error(&d, SMELT_NO_LOC, "running a model source needs --weights");
            ok = false;
        }
        if (ok) {
            weights_open = true; /* closed below even when binding fails half way */
            ok = cli_weights_open(&weights, c.weights_path, &m, &d);
        }
    }
    if (ok && strcmp(c.backend, "ref") == 0) {
        ok = (r.ref = ref_model_create(&m, cli_weights_read, &weights, &d)) != NULL;
        r.name = "ref";
        r.vocab = ok ? ref_model_vocab(r.ref) : 0;
        r.step = ref_step;
    } else if (ok && is_plan) {
        ok = open_engine(&c, c.model_path, &r, &d);
    } else if (ok) {
        ok = compile_temporary_plan(&c, &m, &weights, temporary_plan, sizeof temporary_plan, &d);
        run_command plan_run = c;
        plan_run.weights_path = NULL; /* they are in the plan */
        ok = ok && open_engine(&plan_run, temporary_plan, &r, &d);
        if (temporary_plan[0]) unlink(temporary_plan);
    }
    if (ok && c.max_tokens > 0) {
        uint64_t elements;
        if (size_mul_overflow(r.vocab, c.max_tokens, &elements) || elements > (1ull << 32))
            SMELT_DIE("logits of %u steps x %llu do not fit", c.max_tokens, (unsigned long long)r.vocab);
        rows = malloc(elements * sizeof *rows);
        if (!rows) SMELT_DIE("out of memory");
        printf("prompt:");
        for (uint32_t i = 0; i < prompt_length; i++) printf(" %d", prompt[i]);
        printf("\n");
        ok = generate(&r, prompt, prompt_length, c.max_tokens, rows, &d);
        if (ok && c.dump_path) ok = npy_write_f32(c.dump_path, rows, c.max_tokens, r.vocab, &d);
    }
    free(rows);
    free(prompt);
    ref_model_free(r.ref);
    smelt_engine_destroy(r.engine);
    if (weights_open) cli_weights_close(&weights);
    ir_module_free(&m);
    status = ok && !diag_has_errors(&d) ? CLI_OK : CLI_INPUT_ERROR;
    diag_free(&d);
    return status;
}
