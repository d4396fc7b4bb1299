/* generate.c - the smallest program that runs a smelt plan: it uses only
 * smelt.h. Build it against libsmelt_runtime (see examples/CMakeLists.txt).
 *
 *   smelt compile examples/llama.smelt --config C --weights W -o model.plan
 *   generate model.plan 47,32,58 8
 *
 * prints the new token ids as they are produced, greedily, on the GPU when
 * there is one and on the CPU simulator otherwise, until the model's EOS
 * (the plan keeps its config's eos_token_id), MAX_TOKENS, or the end of its
 * positions; then why it stopped. */
#include "smelt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool print_token(int32_t token, void *user) {
    (void)user;
    printf(" %d", token);
    fflush(stdout);
    return true; /* keep going */
}

int main(int argc, char **argv) {
    if (argc < 3 || argc > 4) {
        fprintf(stderr, "usage: generate model.plan PROMPT_IDS [MAX_TOKENS]\n"
                        "  e.g. generate model.plan 47,32,58 8\n");
        return 2;
    }
    /* The prompt: comma-separated token ids. */
    int32_t prompt[4096];
    size_t prompt_length = 0;
    for (char *p = argv[2]; *p && prompt_length < 4096;) {
        char *end;
        long id = strtol(p, &end, 10);
        if (end == p || id < 0) {
            fprintf(stderr, "generate: '%s' is not a list of token ids\n", argv[2]);
            return 2;
        }
        prompt[prompt_length++] = (int32_t)id;
        p = *end == ',' ? end + 1 : end;
    }
    int max_tokens = argc == 4 ? atoi(argv[3]) : 16;

    smelt_plan *plan;
    if (smelt_plan_open(argv[1], &plan) != SMELT_OK) {
        fprintf(stderr, "generate: %s\n", smelt_last_error());
        return 1;
    }
    smelt_engine *engine;
    smelt_status status = smelt_engine_create(plan, NULL, &engine); /* device "auto" */
    smelt_plan_close(plan);
    if (status != SMELT_OK) {
        fprintf(stderr, "generate: %s\n", smelt_last_error());
        return 1;
    }

    smelt_request request = smelt_request_default();
    request.prompt = prompt;
    request.prompt_length = prompt_length;
    request.max_tokens = (uint32_t)(max_tokens > 0 ? max_tokens : 16);
    request.on_token = print_token; /* temperature 0: greedy */
    printf("tokens:");
    smelt_generation result;
    status = smelt_engine_generate(engine, &request, &result);
    printf("\n");
    if (status != SMELT_OK) {
        fprintf(stderr, "generate: %s\n", smelt_last_error());
        smelt_engine_destroy(engine);
        return 1;
    }
    smelt_stats stats;
    smelt_engine_stats(engine, &stats);
    fprintf(stderr, "generate: stop: %s", smelt_finish_reason_name(result.reason));
    if (result.reason == SMELT_FINISH_EOS) fprintf(stderr, " (token %d)", result.stop_token);
    fprintf(stderr, "\ngenerate: %zu tokens on %s; prefill %.1f tokens/s, decode %.1f tokens/s\n",
            result.token_count, smelt_engine_device_name(engine), stats.prefill_tokens_per_second,
            stats.decode_tokens_per_second);
    smelt_engine_destroy(engine);
    return 0;
}
