/* cmd_run.c - `smelt run`: greedy generation from a prompt.
 *
 * Steps a plan on the host or cuda device, or the reference interpreter on a
 * model source, through the driver (driver.h). Prints the prompt, then each generated token as
 * it is produced (decoded text when the plan has a byte tokenizer and the
 * prompt was --prompt TEXT), then why it stopped (the model's EOS, the
 * token limit, or the end of its positions) and the tokens/s of prefill and
 * decode. Without --dump-logits each token is picked on the device (only its
 * id crosses to the host); --dump-logits copies and keeps every step's logits:
 *   row 0: after the prompt; row i: after feeding the i-th generated token. */
#include "cli.h"

#include "npy.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static const char usage[] =
    "usage: smelt run MODEL|PLAN (--prompt-ids IDS | --prompt TEXT) [options]\n"
    "\n"
    "Generates greedily from a prompt and prints the tokens as they are\n"
    "produced, then why it stopped (stop: eos, max-tokens, or length when\n"
    "the model's positions are used up) and the tokens/s of prefill and\n"
    "decode. PLAN is a file from `smelt compile`; a MODEL source is compiled\n"
    "in memory first.\n"
    "\n"
    "options:\n"
    "  --backend auto|host|cuda|ref\n"
    "                         auto (default): cuda where a GPU is present, else\n"
    "                         host (the CPU simulator running the same kernels);\n"
    "                         ref: the fp32 reference interpreter (MODEL only)\n"
    "  --config PATH          bind params from a Hugging Face config.json, or the\n"
    "                         folder holding it (MODEL; default: the --weights\n"
    "                         folder's config.json, if it has one)\n"
    "  --set NAME=VALUE       set a param (MODEL); may repeat\n"
    "  --allow-config-key KEY ignore config key KEY, which no param binds,\n"
    "                         knowing it does not change the computation (an\n"
    "                         unbound key is an error otherwise); may repeat\n"
    "  --allow-unused-tensor GLOB\n"
    "                         leave checkpoint tensors matching GLOB unused ('*':\n"
    "                         any run of characters, '.' included; an unused tensor\n"
    "                         is an error otherwise); may repeat\n"
    "  --weights PATH         a .safetensors file, a model.safetensors.index.json,\n"
    "                         or a model's folder (with its config.json and\n"
    "                         generation_config.json); needed unless the plan\n"
    "                         holds weights\n"
    "  --precision P          storage when compiling MODEL in memory: f32 (default),\n"
    "                         bf16, int4-rtn, int8, fp8 (with --group-size 32|64|128,\n"
    "                         --keep GLOBS, --act f32|bf16|f16,\n"
    "                         --act-quant token|tensor|none as for `smelt compile`);\n"
    "                         int8 W8A8, int4-awq and\n"
    "                         int4-gptq with --calib IDS [--act-order];\n"
    "                         --max-layer-error E with --calib IDS: the accuracy\n"
    "                         gate of `smelt compile`;\n"
    "                         with --backend ref: quantized weights dequantized, f32\n"
    "  --kv-cache auto|bf16|f16|f32|fp8\n"
    "                         MODEL: KV cache storage (default auto: the activation\n"
    "                         dtype; fp8: E4M3 with a scale per cached row and kv\n"
    "                         head; the ref backend rounds through it as well)\n"
    "  --no-fuse              MODEL: one op per kernel (no fusion rule)\n"
    "  --tokenizer bytes      MODEL: ids 0..255 are bytes (BOS/EOS from config.json)\n"
    "  --expect-hash H        refuse a plan whose content hash (`smelt inspect`)\n"
    "                         is not H, before any of its code is loaded\n"
    "  --prompt-ids 1,2,3     the prompt's token ids\n"
    "  --prompt TEXT          the prompt as text (needs a byte tokenizer); the\n"
    "                         output is decoded and streamed as text\n"
    "  --max-tokens N         tokens to generate, at least 1 (default 16)\n"
    "  --ignore-eos           do not stop at the model's EOS ids (eos_token_id of\n"
    "                         config.json, or of generation_config.json beside it)\n"
    "  --dump-logits F.npy    write float32 logits [N, vocab]: row 0 after the\n"
    "                         prompt, row i after the i-th generated token\n"
    "  --random-weights SEED  bind every weight of PLAN to random values (for\n"
    "                         speed measurements of plans compiled without weights)\n"
    "  --max-errors N         stop after N errors (default 20, 0: no limit)\n"
    "  -h, --help             show this help\n";

enum { RUN_MAX_PROMPT = 1 << 20, RUN_MAX_TOKENS = 1 << 20 };

typedef struct run_command {
    const char *prompt_ids, *prompt_text, *dump_path;
    unsigned max_tokens, max_errors;
    bool ignore_eos;
    drv_model_options model;
} run_command;

static int parse_arguments(int argc, char **argv, run_command *c) {
    cli_args a = {argc, argv, 1, "smelt run", NULL};
    const char *value;
    c->max_tokens = 16;
    c->max_errors = 20;
    c->model = drv_model_options_default();
    while (a.index < a.argc) {
        int model_status = cli_model_option(&a, &c->model);
        if (model_status == CLI_USAGE_ERROR) return CLI_USAGE_ERROR;
        if (model_status == CLI_OK) continue;
        if (cli_flag(&a, "--help") || cli_flag(&a, "-h")) {
            fputs(usage, stdout);
            return CLI_HELP_SHOWN;
        } else if (cli_flag_value(&a, "--prompt-ids", &value)) {
            if (!value) return CLI_USAGE_ERROR;
            c->prompt_ids = value;
        } else if (cli_flag_value(&a, "--prompt", &value)) {
            if (!value) return CLI_USAGE_ERROR;
            c->prompt_text = value;
        } else if (cli_flag(&a, "--ignore-eos")) {
            c->ignore_eos = true;
        } else if (cli_flag_value(&a, "--max-tokens", &value)) {
            if (!value || !cli_parse_count(&a, value, &c->max_tokens)) return CLI_USAGE_ERROR;
        } else if (cli_flag_value(&a, "--random-weights", &value)) {
            if (!value || !cli_parse_count(&a, value, &c->model.random_seed)) return CLI_USAGE_ERROR;
            c->model.random_weights = true;
        } else if (cli_flag_value(&a, "--dump-logits", &value)) {
            if (!value) return CLI_USAGE_ERROR;
            c->dump_path = value;
        } else if (cli_flag_value(&a, "--max-errors", &value)) {
            if (!value || !cli_parse_count(&a, value, &c->max_errors)) return CLI_USAGE_ERROR;
        } else if (!cli_positional(&a, &c->model.model_path, "model or plan")) {
            return CLI_USAGE_ERROR;
        }
    }
    const char *problem = !c->model.model_path                ? "no model or plan given"
                          : !c->prompt_ids && !c->prompt_text ? "no --prompt-ids or --prompt given"
                          : c->prompt_ids && c->prompt_text   ? "give --prompt-ids or --prompt, not both"
                          : c->max_tokens == 0                ? "--max-tokens must be at least 1"
                          : c->max_tokens > RUN_MAX_TOKENS    ? "--max-tokens is at most 1048576"
                                                              : NULL;
    if (problem) {
        cli_usage_error(&a, "%s", problem);
        return CLI_USAGE_ERROR;
    }
    return cli_check_plan_options(&a, &c->model) ? CLI_OK : CLI_USAGE_ERROR;
}

/* "1,2,3" -> ids; false with a message naming the bad entry. */
static bool parse_prompt_ids(const char *text, int32_t **ids, uint32_t *count, diag_engine *d) {
    size_t capacity = 1;
    for (const char *p = text; *p; p++)
        capacity += *p == ',';
    if (capacity > RUN_MAX_PROMPT) {
        diag_error(d, SMELT_NO_LOC, "--prompt-ids: more than %d ids", RUN_MAX_PROMPT);
        return false;
    }
    *ids = cli_alloc(capacity * sizeof **ids);
    *count = 0;
    const char *p = text;
    for (;;) {
        char *end;
        errno = 0;
        long long v = strtoll(p, &end, 10);
        if (end == p || errno || v < 0 || v > INT32_MAX || (*end != ',' && *end != '\0')) {
            diag_error(d, SMELT_NO_LOC, "--prompt-ids: entry %u is not a token id (expected 1,2,3)",
                       *count + 1);
            return false;
        }
        (*ids)[(*count)++] = (int32_t)v;
        if (*end == '\0') return true;
        p = end + 1;
    }
}

/* Text -> BOS (when the tokenizer has one) and one id per byte. */
static bool encode_prompt(const drv_tokenizer *t, const char *text, int32_t **ids, uint32_t *count,
                          diag_engine *d) {
    if (!t->present) {
        diag_error(d, SMELT_NO_LOC,
                   "--prompt needs a plan with a byte tokenizer (compile with --tokenizer bytes); "
                   "use --prompt-ids otherwise");
        return false;
    }
    size_t n = strlen(text);
    if (n + 1 > RUN_MAX_PROMPT) {
        diag_error(d, SMELT_NO_LOC, "--prompt: longer than %d bytes", RUN_MAX_PROMPT - 1);
        return false;
    }
    *ids = cli_alloc((n + 1) * sizeof **ids);
    *count = (uint32_t)drv_tokenizer_encode(t, text, n, *ids);
    return true;
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

/* Prints a generated token: its byte when decoding text, else its id. */
static void print_token(const drv_tokenizer *t, int32_t token, bool as_text) {
    if (as_text) {
        int byte = drv_tokenizer_byte(t, token);
        if (byte >= 0) putchar(byte);
    } else {
        printf(" %d", token);
    }
    fflush(stdout);
}

static bool is_eos(const drv_eos *eos, int32_t token) {
    for (uint32_t i = 0; i < eos->count; i++)
        if (eos->ids[i] == token) return true;
    return false;
}

/* Why generation ended, as `smelt run` prints it. */
typedef enum run_stop { RUN_STOP_MAX_TOKENS, RUN_STOP_EOS, RUN_STOP_LENGTH } run_stop;

/* Prefill (in chunks of the model's step bound), then one token per step;
 * with rows, rows[i * vocab] keeps the logits that choose token i+1; without
 * (no --dump-logits), each step's argmax is picked on the device and only
 * the token id crosses to the host. Stops at the
 * model's EOS ids (unless ignore_eos; the EOS token is not printed), after
 * max_tokens, or when the sequence has used the model's positions. Returns
 * the number of logits rows kept (with rows), or -1. */
static long generate(drv_model *model, const int32_t *prompt, uint32_t prompt_length, uint32_t max_tokens,
                     bool as_text, bool ignore_eos, float *rows, diag_engine *d) {
    const drv_model_info *r = drv_model_get_info(model);
    uint64_t vocab = r->vocab, chunk = r->max_step_tokens ? r->max_step_tokens : prompt_length;
    if (chunk > prompt_length) chunk = prompt_length;
    float *logits = rows ? cli_alloc(vocab * sizeof *logits) : NULL; /* a chunk's last row */
    int32_t next = -1; /* without rows: the argmax of the last step's last row */
    int32_t *positions = cli_alloc(prompt_length * sizeof *positions);
    for (uint32_t i = 0; i < prompt_length; i++)
        positions[i] = (int32_t)i;

    double start = seconds_now();
    bool ok = true;
    for (uint32_t at = 0; ok && at < prompt_length; at += (uint32_t)chunk) {
        uint32_t n = prompt_length - at < chunk ? prompt_length - at : (uint32_t)chunk;
        if (!rows) {
            ok = drv_model_step_greedy(model, prompt + at, positions + at, n, &next, d);
            continue;
        }
        ok = drv_model_step(model, prompt + at, positions + at, n, DRV_ROWS_LAST, logits, d);
        if (ok && at + n == prompt_length) memcpy(rows, logits, vocab * sizeof *rows);
    }
    double prefill_seconds = seconds_now() - start;

    if (ok) fputs(as_text ? "" : "tokens:", stdout);
    start = seconds_now();
    uint32_t decoded = 0, kept = ok ? 1 : 0, printed = 0;
    run_stop stop = RUN_STOP_MAX_TOKENS;
    int32_t token = -1;
    for (uint32_t i = 1; ok && i <= max_tokens; i++) {
        token = rows ? argmax(rows + (uint64_t)(i - 1) * vocab, vocab) : next;
        if (!ignore_eos && is_eos(&r->eos, token)) {
            stop = RUN_STOP_EOS;
            break;
        }
        print_token(&r->tokenizer, token, as_text);
        printed++;
        if (i == max_tokens) break;
        /* The token goes in at the next position, which must exist. */
        uint64_t position = (uint64_t)prompt_length + i - 1;
        if (r->max_positions && position >= r->max_positions) {
            stop = RUN_STOP_LENGTH;
            break;
        }
        int32_t at = (int32_t)position;
        ok = rows ? drv_model_step(model, &token, &at, 1, DRV_ROWS_LAST, rows + (uint64_t)i * vocab, d)
                  : drv_model_step_greedy(model, &token, &at, 1, &next, d);
        decoded += ok;
        kept += ok;
    }
    if (ok || decoded > 0) printf("\n");
    fflush(stdout);
    double decode_seconds = seconds_now() - start;
    if (ok) {
        if (stop == RUN_STOP_EOS)
            fprintf(stderr, "stop: eos (token %d) after %u tokens\n", token, printed);
        else if (stop == RUN_STOP_LENGTH)
            fprintf(stderr,
                    "stop: length after %u tokens: the sequence holds the model's %llu positions, "
                    "all used\n",
                    printed, (unsigned long long)r->max_positions);
        else
            fprintf(stderr, "stop: max-tokens after %u tokens\n", printed);
        fprintf(
            stderr,
            "%s: prefill %u tokens in %.3f s (%.1f tokens/s), decode %u tokens in %.3f s (%.1f tokens/s)\n",
            r->name, prompt_length, prefill_seconds,
            prompt_length / (prefill_seconds > 0 ? prefill_seconds : 1e-9), decoded, decode_seconds,
            decoded / (decode_seconds > 0 ? decode_seconds : 1e-9));
    }
    free(positions);
    free(logits);
    return ok ? (long)kept : -1;
}

int cmd_run(int argc, char **argv) {
    run_command c = {0};
    int status = parse_arguments(argc, argv, &c);
    if (status != CLI_OK) return status == CLI_HELP_SHOWN ? CLI_OK : status;

    diag_engine d;
    diag_init(&d, stderr);
    d.max_errors = c.max_errors;
    drv_model *model = NULL;
    int32_t *prompt = NULL;
    float *rows = NULL;
    uint32_t prompt_length = 0;
    bool as_text = c.prompt_text != NULL;

    bool ok = drv_model_open(&c.model, &model, &d);
    const drv_model_info *r = ok ? drv_model_get_info(model) : NULL;
    if (ok)
        ok = as_text ? encode_prompt(&r->tokenizer, c.prompt_text, &prompt, &prompt_length, &d)
                     : parse_prompt_ids(c.prompt_ids, &prompt, &prompt_length, &d);
    /* Nothing to step: no logits would exist to choose the first token from. */
    if (ok && prompt_length == 0) {
        diag_error(&d, SMELT_NO_LOC,
                   "--prompt is empty and the plan's tokenizer adds no BOS token: give at least one byte");
        ok = false;
    }
    if (ok && r->max_positions && prompt_length > r->max_positions) {
        diag_error(&d, SMELT_NO_LOC, "the prompt's %u tokens do not fit the model's %llu positions",
                   prompt_length, (unsigned long long)r->max_positions);
        ok = false;
    }
    uint64_t elements = 0;
    bool too_many =
        ok && (__builtin_mul_overflow(r->vocab, c.max_tokens, &elements) || elements > (1ull << 32));
    if (too_many) {
        diag_error(&d, SMELT_NO_LOC, "logits of %u steps x %llu do not fit", c.max_tokens,
                   (unsigned long long)r->vocab);
        ok = false;
    }
    if (ok && c.max_tokens > 0) {
        if (c.dump_path) rows = cli_alloc(elements * sizeof *rows); /* else greedy on the device */
        if (as_text) {
            fputs(c.prompt_text, stdout);
        } else {
            printf("prompt:");
            for (uint32_t i = 0; i < prompt_length; i++)
                printf(" %d", prompt[i]);
            printf("\n");
        }
        long produced = generate(model, prompt, prompt_length, c.max_tokens, as_text, c.ignore_eos, rows, &d);
        ok = produced >= 0;
        if (ok && c.dump_path) ok = npy_write_f32(c.dump_path, rows, (uint64_t)produced, r->vocab, &d);
    }
    free(rows);
    free(prompt);
    drv_model_close(model);
    status = ok && !diag_has_errors(&d) ? CLI_OK : CLI_INPUT_ERROR;
    diag_free(&d);
    return status;
}
