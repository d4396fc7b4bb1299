/* fuzz_ir_text.c - the text IR parser (lowering annotations included:
 * precision, arena, arena(OFFSET), weight(I), group(N) step(N)), the verifier
 * and the whole pass pipeline on arbitrary bytes. What parses must print and
 * parse back to the same text, and so must what the pipeline lowers. */
#include "fuzz.h"
#include "ir_io.h"
#include "pass.h"

#include <stdlib.h>
#include <string.h>

static char *print_to_memory(const ir_module *m, size_t *size) {
    char *text = NULL;
    FILE *f = open_memstream(&text, size);
    if (!f) abort();
    ir_print_text(m, f);
    if (fclose(f) != 0 || !text) abort();
    return text;
}

/* Prints m, parses the text back and prints that: both texts must agree. */
static void check_round_trip(const ir_module *m, diag_engine *d) {
    size_t first_size, second_size;
    char *first = print_to_memory(m, &first_size);
    ir_module again = {0};
    if (!ir_parse_text("printed.ir", first, first_size, d, &again)) abort(); /* printed IR must parse */
    char *second = print_to_memory(&again, &second_size);
    if (first_size != second_size || memcmp(first, second, first_size) != 0) abort(); /* and round-trip */
    free(first);
    free(second);
    ir_module_free(&again);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    diag_engine d;
    diag_init(&d, fuzz_null_stream());
    ir_module m = {0};
    if (ir_parse_text("fuzz.ir", (const char *)data, size, &d, &m)) {
        check_round_trip(&m, &d);
        if (fuzz_run_pipeline(&m, size, &d)) check_round_trip(&m, &d);
    }
    ir_module_free(&m);
    diag_free(&d);
    return 0;
}
