/* runner.h - what `smelt run` and `smelt eval` step a model with: a plan on
 * the runtime's "host" or "cuda" device (a model source is compiled in memory
 * first), or the fp32 reference interpreter ("ref") on a model source.
 *
 *   cli_runner_options o = {.model_path = "m.smelt", .weights_path = "w/", .backend = "auto"};
 *   cli_runner r;
 *   if (!cli_runner_open(&r, &o, &diag)) ...      // reported
 *   cli_runner_step(&r, ids, pos, n, logits, &diag);   // logits [n, r.vocab]
 *   cli_runner_reset(&r);                          // a new sequence
 *   cli_runner_close(&r);
 */
#ifndef SMELT_CLI_RUNNER_H
#define SMELT_CLI_RUNNER_H

#include "cli.h"
#include "emit.h"
#include "reference.h"
#include "smelt.h"

typedef struct cli_runner_options {
    const char *model_path;   /* a plan, or a .smelt/.json source */
    const char *weights_path; /* NULL: the plan holds them */
    const char *backend;      /* auto, host, cuda or ref */
    const char *precision;    /* when compiling a source: "f32" or "bf16" (the precision pass's policy) */
    const char *tokenizer;    /* NULL, or "bytes": store a byte tokenizer when compiling a source */
    bool random_weights;
    unsigned random_seed;
    fe_options frontend;
} cli_runner_options;

/* The tokenizer a plan carries (its TOKENIZER section). */
typedef struct cli_tokenizer {
    bool present;     /* "bytes": ids 0..255 are bytes */
    int32_t bos, eos; /* -1: none */
} cli_tokenizer;

typedef struct cli_runner {
    const char *name;         /* "ref", or the engine's device name */
    uint64_t vocab;
    uint64_t max_step_tokens; /* 0: no bound */
    cli_tokenizer tokenizer;
    ref_model *ref;
    smelt_engine *engine;
    ir_module module;         /* ref: the module it interprets */
    cli_weights weights;
    bool weights_open;
} cli_runner;

/* The TOKENIZER section of a byte tokenizer, {"type": "bytes", "bos": N,
 * "eos": N}, with the ids of config.json's bos_token_id and eos_token_id (-1
 * when absent); malloc'd. */
char *cli_tokenizer_json(const char *config_path);

/* Consumes one of the options every runner command takes (--backend,
 * --config, --set, --weights, --precision, --tokenizer): CLI_OK, or
 * CLI_USAGE_ERROR after a message, or CLI_NOT_MINE. */
enum { CLI_NOT_MINE = -2 };
int cli_runner_option(cli_args *a, cli_runner_options *o);

bool cli_runner_open(cli_runner *r, const cli_runner_options *o, diag_engine *d);
bool cli_runner_step(cli_runner *r, const int32_t *ids, const int32_t *pos, uint32_t n, float *logits,
                     diag_engine *d);
void cli_runner_reset(cli_runner *r);
void cli_runner_close(cli_runner *r);

#endif
