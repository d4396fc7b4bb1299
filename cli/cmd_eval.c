/* cmd_eval.c - `smelt eval`: perplexity over a file of token ids.
 *
 * Windows of --context tokens start every --stride tokens; each window runs
 * from an empty KV cache and scores only the tokens no earlier window scored,
 * each predicted from the tokens before it in the window: the sliding-window
 * perplexity of Hugging Face's guide, which it reproduces exactly. With
 * stride < context every token after the first is scored once; with
 * stride == context the first token of each window has no history and is
 * not scored. */
#include "cli.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

static const char usage[] =
    "usage: smelt eval MODEL|PLAN --ids FILE [options]\n"
    "\n"
    "Prints the perplexity of the model over the token ids in FILE, with the\n"
    "number of tokens scored. The name decides the format: FILE.bin holds\n"
    "little-endian uint16 ids (as tests/fixtures/demo/heldout_ids.bin); any\n"
    "other FILE holds decimal ids as text, separated by commas, spaces or\n"
    "newlines, and nothing else.\n"
    "\n"
    "options:\n"
    "  --context N            tokens per window (default 256)\n"
    "  --stride N             tokens between window starts (default context / 2)\n"
    "  --max-ids N            use only the first N ids of FILE\n"
    "  --backend auto|host|cuda|ref, --config, --set, --weights, --precision, --kv-cache,\n"
    "  --group-size, --keep, --act, --calib, --act-order, --act-quant,\n"
    "  --max-layer-error E,\n"
    "  --no-fuse, --expect-hash H, --allow-config-key KEY, --allow-unused-tensor GLOB\n"
    "                         as for `smelt run`\n"
    "  --max-errors N         stop after N errors (default 20, 0: no limit)\n"
    "  -h, --help             show this help\n";

typedef struct eval_command {
    const char *ids_path;
    unsigned context, stride, max_ids, max_errors;
    drv_model_options model;
} eval_command;

static int parse_arguments(int argc, char **argv, eval_command *c) {
    cli_args a = {argc, argv, 1, "smelt eval", NULL};
    const char *value;
    c->context = 256;
    c->max_errors = 20;
    c->model = drv_model_options_default();
    while (a.index < a.argc) {
        int model_status = cli_model_option(&a, &c->model);
        if (model_status == CLI_USAGE_ERROR) return CLI_USAGE_ERROR;
        if (model_status == CLI_OK) continue;
        if (cli_flag(&a, "--help") || cli_flag(&a, "-h")) {
            fputs(usage, stdout);
            return CLI_HELP_SHOWN;
        } else if (cli_flag_value(&a, "--ids", &value)) {
            if (!value) return CLI_USAGE_ERROR;
            c->ids_path = value;
        } else if (cli_flag_value(&a, "--context", &value)) {
            if (!value || !cli_parse_count(&a, value, &c->context)) return CLI_USAGE_ERROR;
        } else if (cli_flag_value(&a, "--stride", &value)) {
            if (!value || !cli_parse_count(&a, value, &c->stride)) return CLI_USAGE_ERROR;
        } else if (cli_flag_value(&a, "--max-ids", &value)) {
            if (!value || !cli_parse_count(&a, value, &c->max_ids)) return CLI_USAGE_ERROR;
        } else if (cli_flag_value(&a, "--max-errors", &value)) {
            if (!value || !cli_parse_count(&a, value, &c->max_errors)) return CLI_USAGE_ERROR;
        } else if (!cli_positional(&a, &c->model.model_path, "model or plan")) {
            return CLI_USAGE_ERROR;
        }
    }
    if (c->stride == 0) c->stride = c->context / 2 ? c->context / 2 : 1;
    const char *problem = !c->model.model_path     ? "no model or plan given"
                          : !c->ids_path           ? "no --ids given"
                          : c->context < 2         ? "--context must be at least 2"
                          : c->stride > c->context ? "--stride must not exceed --context"
                                                   : NULL;
    if (problem) {
        cli_usage_error(&a, "%s", problem);
        return CLI_USAGE_ERROR;
    }
    return cli_check_plan_options(&a, &c->model) ? CLI_OK : CLI_USAGE_ERROR;
}

/* -log softmax(row)[target], computed stably in double. */
static double negative_log_likelihood(const float *row, uint64_t vocab, int32_t target) {
    double max = row[0];
    for (uint64_t i = 1; i < vocab; i++)
        if (row[i] > max) max = row[i];
    double sum = 0;
    for (uint64_t i = 0; i < vocab; i++)
        sum += exp((double)row[i] - max);
    return log(sum) + max - (double)row[target];
}

/* Runs window [begin, end) from an empty cache in steps of at most the
 * model's bound, adding the NLL of every token at index >= score_from. */
static bool score_window(drv_model *model, const int32_t *ids, size_t begin, size_t end, size_t score_from,
                         float *logits, int32_t *positions, double *nll, size_t *scored, diag_engine *d) {
    const drv_model_info *r = drv_model_get_info(model);
    drv_model_reset(model);
    size_t step = r->max_step_tokens ? r->max_step_tokens : end - begin;
    for (size_t at = begin; at < end; at += step) {
        uint32_t n = (uint32_t)(end - at < step ? end - at : step);
        for (uint32_t i = 0; i < n; i++)
            positions[i] = (int32_t)(at - begin + i);
        if (!drv_model_step(model, ids + at, positions, n, DRV_ROWS_ALL, logits, d)) return false;
        /* logits row i predicts token at + i + 1 */
        for (uint32_t i = 0; i < n; i++) {
            size_t target = at + i + 1;
            if (target >= end || target < score_from) continue;
            int32_t id = ids[target];
            if (id < 0 || (uint64_t)id >= r->vocab) {
                diag_error(d, SMELT_NO_LOC, "id %d at index %zu is outside the vocabulary [0, %llu)", id,
                           target, (unsigned long long)r->vocab);
                return false;
            }
            *nll += negative_log_likelihood(logits + (uint64_t)i * r->vocab, r->vocab, id);
            (*scored)++;
        }
    }
    return true;
}

int cmd_eval(int argc, char **argv) {
    eval_command c = {0};
    int status = parse_arguments(argc, argv, &c);
    if (status != CLI_OK) return status == CLI_HELP_SHOWN ? CLI_OK : status;

    diag_engine d;
    diag_init(&d, stderr);
    d.max_errors = c.max_errors;
    size_t count = 0;
    int32_t *ids = drv_token_ids_read(c.ids_path, &count, &d);
    drv_model *model = NULL;
    bool ok = ids != NULL && drv_model_open(&c.model, &model, &d);
    const drv_model_info *r = ok ? drv_model_get_info(model) : NULL;
    if (ids && c.max_ids && c.max_ids < count) count = c.max_ids;
    if (ok && count < 2) {
        diag_error(&d, SMELT_NO_LOC, "'%s' holds %zu ids; perplexity needs at least 2", c.ids_path, count);
        ok = false;
    }
    double nll = 0;
    size_t scored = 0;
    struct timespec start, stop;
    clock_gettime(CLOCK_MONOTONIC, &start);
    if (ok) {
        size_t step = r->max_step_tokens && r->max_step_tokens < c.context ? r->max_step_tokens : c.context;
        float *logits = cli_alloc(step * r->vocab * sizeof *logits);
        int32_t *positions = cli_alloc(step * sizeof *positions);
        size_t scored_until = 1; /* the first id has no prediction */
        for (size_t begin = 0; ok && scored_until < count; begin += c.stride) {
            size_t end = begin + c.context < count ? begin + c.context : count;
            ok = score_window(model, ids, begin, end, scored_until, logits, positions, &nll, &scored, &d);
            scored_until = end;
            if (isatty(fileno(stderr))) fprintf(stderr, "\rsmelt: eval: %zu of %zu ids", end, count);
        }
        if (isatty(fileno(stderr))) fputc('\n', stderr);
        free(logits);
        free(positions);
    }
    clock_gettime(CLOCK_MONOTONIC, &stop);
    if (ok) {
        double mean = nll / (double)scored;
        double seconds = (double)(stop.tv_sec - start.tv_sec) + (double)(stop.tv_nsec - start.tv_nsec) * 1e-9;
        printf("perplexity %.4f over %zu tokens (mean NLL %.5f nats = %.5f bits per token; context %u, "
               "stride %u, %s)\n",
               exp(mean), scored, mean, mean / log(2.0), c.context, c.stride, r->name);
        fprintf(stderr, "smelt: eval: %.1f s, %.1f tokens/s\n", seconds,
                (double)scored / (seconds > 0 ? seconds : 1e-9));
    }
    drv_model_close(model);
    free(ids);
    status = ok && !diag_has_errors(&d) ? CLI_OK : CLI_INPUT_ERROR;
    diag_free(&d);
    return status;
}
