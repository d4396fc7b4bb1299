/* cmd_run.c - `smelt run`: greedy generation from a prompt of token ids.
 *
 * Today the model is compiled in memory (frontend + passes) and run on the
 * fp32 reference backend; plan files and the host/cuda backends come with
 * code generation. Prints the prompt, then each generated token as it is
 * produced; --dump-logits keeps every step's logits:
 *   row 0: after the prompt; row i: after feeding the i-th generated token. */
#include "cli.h"

#include "checkpoint.h"
#include "frontend.h"
#include "npy.h"
#include "reference.h"
#include "weights.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char usage[] =
    "usage: smelt run MODEL --weights W --prompt-ids IDS [options]\n"
    "\n"
    "Generates greedily from a prompt of token ids and prints the tokens as\n"
    "they are produced, then the time taken by prefill and decode.\n"
    "\n"
    "options:\n"
    "  --config FILE          bind params from a Hugging Face config.json\n"
    "  --set NAME=VALUE       set a param (wins over --config); may repeat\n"
    "  --weights PATH         a .safetensors file, a model.safetensors.index.json,\n"
    "                         or a folder holding them\n"
    "  --prompt-ids 1,2,3     the prompt's token ids\n"
    "  --max-tokens N         tokens to generate (default 16)\n"
    "  --backend ref          the fp32 reference backend (the only one so far;\n"
    "                         host and cuda come with code generation)\n"
    "  --dump-logits F.npy    write float32 logits [N, vocab]: row 0 after the\n"
    "                         prompt, row i after the i-th generated token\n"
    "  --max-errors N         stop after N errors (default 20, 0: no limit)\n"
    "  -h, --help             show this help\n";

enum { RUN_MAX_PROMPT = 1 << 20, RUN_MAX_TOKENS = 1 << 20 };

typedef struct run_command {
    const char *model_path;
    const char *weights_path;
    const char *prompt_text;
    const char *dump_path;
    unsigned max_tokens;
    unsigned max_errors;
    fe_options frontend;
} run_command;

static int parse_arguments(int argc, char **argv, run_command *c) {
    cli_args a = {argc, argv, 1, "smelt run"};
    const char *value;
    c->max_tokens = 16;
    c->max_errors = 20;
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
            if (strcmp(value, "ref") != 0) {
                cli_usage_error(&a, "backend '%s' is not available yet; use --backend ref", value);
                return CLI_USAGE_ERROR;
            }
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
    const char *missing = !c->model_path     ? "no model file given"
                          : !c->weights_path ? "no --weights given"
                          : !c->prompt_text  ? "no --prompt-ids given"
                                             : NULL;
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

static bool read_weight(void *context, uint32_t op, float *dst, uint64_t count) {
    return fe_weight_read_f32(context, op, dst, count);
}

/* Prefill, then one token per step; rows[i * vocab] keeps the logits that
 * choose token i+1. */
static bool generate(ref_model *r, const int32_t *prompt, uint32_t prompt_length, uint32_t max_tokens,
                     float *rows, diag_engine *d) {
    uint64_t vocab = ref_model_vocab(r);
    uint64_t capacity = ref_model_output_count(r, prompt_length);
    if (capacity == 0) {
        diag_error(d, SMELT_NO_LOC, "the prompt of %u tokens is longer than the model's token bound",
                   prompt_length);
        return false;
    }
    float *logits = malloc(capacity * sizeof *logits);
    if (!logits) SMELT_DIE("out of memory");
    int32_t *positions = malloc(prompt_length * sizeof *positions);
    if (!positions) SMELT_DIE("out of memory");
    for (uint32_t i = 0; i < prompt_length; i++) positions[i] = (int32_t)i;

    double start = seconds_now();
    bool ok = ref_model_step(r, prompt, positions, prompt_length, logits, capacity, d);
    double prefill_seconds = seconds_now() - start;
    if (ok) memcpy(rows, logits + (prompt_length - 1) * vocab, vocab * sizeof *rows);

    if (ok) printf("tokens:");
    start = seconds_now();
    uint32_t decoded = 0;
    for (uint32_t i = 1; ok && i <= max_tokens; i++) {
        int32_t token = argmax(rows + (uint64_t)(i - 1) * vocab, vocab);
        printf(" %d", token);
        fflush(stdout);
        if (i == max_tokens) break;
        int32_t position = (int32_t)(prompt_length + i - 1);
        ok = ref_model_step(r, &token, &position, 1, rows + (uint64_t)i * vocab, vocab, d);
        decoded += ok;
    }
    if (ok || decoded > 0) printf("\n");
    double decode_seconds = seconds_now() - start;
    if (ok)
        fprintf(stderr, "ref: prefill %u tokens in %.3f s (%.1f tokens/s), decode %u tokens in %.3f s (%.1f tokens/s)\n",
                prompt_length, prefill_seconds, prompt_length / (prefill_seconds > 0 ? prefill_seconds : 1e-9),
                decoded, decode_seconds, decoded / (decode_seconds > 0 ? decode_seconds : 1e-9));
    free(positions);
    free(logits);
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
    st_checkpoint checkpoint = {0};
    fe_weight_binding binding = {0};
    ref_model *r = NULL;
    int32_t *prompt = NULL;
    float *rows = NULL;
    uint32_t prompt_length = 0;

    bool ok = parse_prompt(c.prompt_text, &prompt, &prompt_length, &d);
    ok = ok && cli_compile_model(c.model_path, &c.frontend, NULL, &m, &d);
    ok = ok && st_checkpoint_open(c.weights_path, &checkpoint, &d);
    ok = ok && fe_bind_weights(&m, &checkpoint, &d, &binding);
    ok = ok && (r = ref_model_create(&m, read_weight, &binding, &d)) != NULL;
    if (ok && c.max_tokens > 0) {
        uint64_t vocab = ref_model_vocab(r), elements;
        if (size_mul_overflow(vocab, c.max_tokens, &elements) || elements > (1ull << 32))
            SMELT_DIE("logits of %u steps x %llu do not fit", c.max_tokens, (unsigned long long)vocab);
        rows = malloc(elements * sizeof *rows);
        if (!rows) SMELT_DIE("out of memory");
        printf("prompt:");
        for (uint32_t i = 0; i < prompt_length; i++) printf(" %d", prompt[i]);
        printf("\n");
        ok = generate(r, prompt, prompt_length, c.max_tokens, rows, &d);
        if (ok && c.dump_path) ok = npy_write_f32(c.dump_path, rows, c.max_tokens, vocab, &d);
    }
    free(rows);
    free(prompt);
    ref_model_free(r);
    fe_weight_binding_free(&binding);
    st_checkpoint_close(&checkpoint);
    ir_module_free(&m);
    status = ok && !diag_has_errors(&d) ? CLI_OK : CLI_INPUT_ERROR;
    diag_free(&d);
    return status;
}
