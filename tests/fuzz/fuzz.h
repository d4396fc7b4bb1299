/* fuzz.h - what smelt's fuzz harnesses share. Each harness defines
 * LLVMFuzzerTestOneInput for one parser of untrusted input. Built with
 * clang -fsanitize=fuzzer (cmake -DSMELT_FUZZ=ON) they are libFuzzer targets;
 * otherwise they link driver.c, which replays the files of a corpus folder,
 * and ctest runs every corpus that way (under ASan+UBSan in the sanitizer
 * build). */
#ifndef SMELT_FUZZ_H
#define SMELT_FUZZ_H

#include "diag.h"
#include "frontend.h"
#include "pass.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A diag engine that prints nowhere: errors are the expected outcome. */
static inline FILE *fuzz_null_stream(void) {
    static FILE *null_stream;
    if (!null_stream) null_stream = fopen("/dev/null", "w");
    return null_stream;
}

/* The tiny config.json the model harnesses elaborate with: every size param
 * of the example models small, so that mutated models reach the IR and the
 * passes quickly. Unknown keys are ignored, so one file serves them all. */
static const char fuzz_tiny_config_text[] =
    "{\"vocab_size\": 16, \"hidden_size\": 8, \"intermediate_size\": 16, \"num_hidden_layers\": 1,\n"
    " \"num_attention_heads\": 2, \"num_key_value_heads\": 1, \"head_dim\": 4,\n"
    " \"max_position_embeddings\": 8, \"num_local_experts\": 2, \"num_experts_per_tok\": 1,\n"
    " \"n_embd\": 8, \"n_layer\": 1, \"n_head\": 2, \"n_inner\": 16, \"n_positions\": 8,\n"
    " \"rms_norm_eps\": 1e-5, \"rope_theta\": 10000.0, \"bos_token_id\": 1, \"eos_token_id\": 2}\n";

static char fuzz_tiny_config_file[64];
static inline void fuzz_tiny_config_remove(void) { unlink(fuzz_tiny_config_file); }

/* The options that point the elaborator at the tiny config (written to
 * /tmp once per process, removed at exit). */
static inline fe_options fuzz_tiny_options(void) {
    if (!fuzz_tiny_config_file[0]) {
        snprintf(fuzz_tiny_config_file, sizeof fuzz_tiny_config_file, "/tmp/smelt-fuzz-config-%ld.json",
                 (long)getpid());
        FILE *f = fopen(fuzz_tiny_config_file, "w");
        if (!f) abort();
        fputs(fuzz_tiny_config_text, f);
        fclose(f);
        atexit(fuzz_tiny_config_remove);
    }
    return (fe_options){.config_path = fuzz_tiny_config_file};
}

/* The whole pass pipeline (`smelt ir --after all`) on m, with a small token
 * bound; the precision, bf16 or f32, is picked by the input's size so that
 * both policies are fuzzed. False when a pass refuses the module. */
static inline bool fuzz_run_pipeline(ir_module *m, size_t input_size, diag_engine *d) {
    pass_list list;
    if (!pass_pipeline_until("all", &list, d)) abort();
    pass_driver_options o = {.pass = {.precision = input_size % 2 ? "bf16" : "f32", .max_tokens = 2}};
    return pass_run_list(m, list.items, list.count, &o, d);
}

#endif
