/* fuzz_ir_text.c - the text IR parser, verifier and passes on arbitrary
 * bytes; what parses must print and parse back to the same text. */
#include "fuzz.h"
#include "ir_io.h"
#include "pass.h"

#include <stdlib.h>
#include <string.h>

static char *print_to_memory(const ir_module *m, size_t *size) {
    char *text = NULL;
    FILE *f = open_memstream(&text, size);
    ir_print_text(m, f);
    fclose(f);
    return text;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    diag_engine d;
    diag_init(&d, fuzz_null_stream());
    ir_module m = {0};
    if (ir_parse_text("fuzz.ir", (const char *)data, size, &d, &m)) {
        size_t first_size, second_size;
        char *first = print_to_memory(&m, &first_size);
        ir_module again = {0};
        if (!ir_parse_text("printed.ir", first, first_size, &d, &again)) abort(); /* printed IR must parse */
        char *second = print_to_memory(&again, &second_size);
        if (first_size != second_size || memcmp(first, second, first_size) != 0) abort(); /* and round-trip */
        free(first);
        free(second);
        ir_module_free(&again);
        pass_list list;
        if (pass_pipeline_until("all", &list, &d)) pass_run_list(&m, list.items, list.count, NULL, &d);
    }
    ir_module_free(&m);
    diag_free(&d);
    return 0;
}
