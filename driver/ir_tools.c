/* ir_tools.c - the IR for people: `smelt ir` (a model's IR after some
 * passes), `smelt opt` (text IR through passes) and the pass table. */
#include "driver_internal.h"

#include "ir_io.h"
#include "pass.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

/* False when out of memory (the printers number values: arena.h). */
static bool print_module(const ir_module *m, drv_ir_format format, FILE *out, diag_engine *d) {
    arena_recovery recovery;
    if (arena_recovery_enter(&recovery, setjmp(recovery.where))) {
        diag_error(d, SMELT_NO_LOC, "out of memory printing the IR");
        return false;
    }
    switch (format) {
    case DRV_IR_TEXT: ir_print_text(m, out); break;
    case DRV_IR_JSON: ir_print_json(m, out); break;
    case DRV_IR_DOT: ir_print_dot(m, out); break;
    }
    arena_recovery_leave(&recovery);
    return true;
}

/* Writes m to `path` (NULL or "-": stdout). */
static bool write_module(const ir_module *m, drv_ir_format format, const char *path, diag_engine *d) {
    if (!path || strcmp(path, "-") == 0) return print_module(m, format, stdout, d) && fflush(stdout) == 0;
    FILE *out = fopen(path, "w");
    if (!out) {
        diag_error(d, ((smelt_loc){diag_file_id(d, path), 0, 0}), "cannot write: %s", strerror(errno));
        return false;
    }
    if (!print_module(m, format, out, d)) {
        fclose(out);
        return false;
    }
    if (fclose(out) != 0) {
        diag_error(d, ((smelt_loc){diag_file_id(d, path), 0, 0}), "write failed");
        return false;
    }
    return true;
}

/* The accuracy gate quantizes a checkpoint on calibration data: it belongs to
 * compiling with weights, not to IR printed from a source alone. */
static bool no_gate(const drv_lowering *l, diag_engine *d) {
    if (!l || !(l->precision_options.max_layer_error > 0)) return true;
    diag_error(d, SMELT_NO_LOC,
               "--max-layer-error measures quantized weights on calibration data: it is an option of "
               "`smelt compile`, `run` and `eval` with --weights and --calib");
    return false;
}

bool drv_ir_print_model(const char *model_path, const drv_source_options *given, const char *after,
                        const drv_lowering *lowering, const char *print_after, drv_ir_format format,
                        const char *output_path, diag_engine *d) {
    ir_module m = {0};
    drv_source_options source;
    char *config_path = NULL;
    bool ok = no_gate(lowering, d) && drv_source_with_folder(given, NULL, &source, &config_path, d);
    ok = ok && drv_source_parse(model_path, &source, &m, d);
    if (ok) ok = drv_run_passes(&m, after, NULL, lowering, print_after, d);
    if (ok) ok = write_module(&m, format, output_path, d);
    ir_module_free(&m);
    free(config_path);
    return ok;
}

bool drv_ir_opt(const char *path, const char *text, size_t length, const char *passes,
                const drv_lowering *lowering, const char *print_after, drv_ir_format format, FILE *out,
                diag_engine *d) {
    ir_module m = {0};
    bool ok = no_gate(lowering, d) && ir_parse_text(path, text, length, d, &m);
    if (ok) ok = drv_run_passes(&m, NULL, passes, lowering, print_after, d);
    if (ok) ok = print_module(&m, format, out, d);
    ir_module_free(&m);
    return ok;
}

void drv_print_pass_table(FILE *out) {
    size_t count;
    const pass_info *passes = pass_table(&count);
    for (size_t i = 0; i < count; i++)
        fprintf(out, "  %-14s %s\n", passes[i].name, passes[i].summary);
}
