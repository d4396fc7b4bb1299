/* fuzz_json.c - the JSON model reader and the elaborator on arbitrary bytes. */
#include "frontend.h"
#include "fuzz.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    diag_engine d;
    diag_init(&d, fuzz_null_stream());
    ast_model ast;
    ast_model_init(&ast);
    ir_module m = {0};
    if (fe_parse_json_text("fuzz.json", (const char *)data, size, &d, &ast)) {
        fe_options o = {0};
        fe_elaborate(&ast, &o, &d, &m);
    }
    ir_module_free(&m);
    ast_model_free(&ast);
    diag_free(&d);
    return 0;
}
