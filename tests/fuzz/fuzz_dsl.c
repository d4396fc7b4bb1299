/* fuzz_dsl.c - the DSL parser and the elaborator on arbitrary bytes. */
#include "frontend.h"
#include "fuzz.h"
#include "pass.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    diag_engine d;
    diag_init(&d, fuzz_null_stream());
    ast_model ast;
    ast_model_init(&ast);
    ir_module m = {0};
    if (fe_parse_dsl_text("fuzz.smelt", (const char *)data, size, &d, &ast)) {
        fe_options o = {0};
        if (fe_elaborate(&ast, &o, &d, &m)) {
            pass_list list;
            if (pass_pipeline_until("all", &list, &d)) pass_run_list(&m, list.items, list.count, NULL, &d);
        }
    }
    ir_module_free(&m);
    ast_model_free(&ast);
    diag_free(&d);
    return 0;
}
