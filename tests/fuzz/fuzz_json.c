/* fuzz_json.c - the JSON model reader, the elaborator (with the tiny config
 * of fuzz.h) and the whole pass pipeline on arbitrary bytes. */
#include "frontend.h"
#include "fuzz.h"
#include "pass.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    diag_engine d;
    diag_init(&d, fuzz_null_stream());
    ast_model ast;
    ast_model_init(&ast);
    ir_module m = {0};
    if (fe_parse_json_text("fuzz.json", (const char *)data, size, &d, &ast)) {
        fe_options o = fuzz_tiny_options();
        if (fe_elaborate(&ast, &o, &d, &m)) fuzz_run_pipeline(&m, size, &d);
    }
    ir_module_free(&m);
    ast_model_free(&ast);
    diag_free(&d);
    return 0;
}
