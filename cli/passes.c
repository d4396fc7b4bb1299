/* passes.c - the CLI's bridge to the pass driver: --pass, --after and
 * --print-ir-after. */
#include "cli.h"

#include "pass.h"

#include <string.h>

static bool run_list(ir_module *m, const pass_list *list, const pass_options *passes, const char *print_after,
                     diag_engine *d) {
    if (print_after && strcmp(print_after, "all") != 0) {
        pass_list named; /* reports an unknown pass name */
        if (!pass_parse_list(print_after, &named, d)) return false;
    }
    pass_driver_options o = {.print_after = print_after, .print_out = stderr};
    if (passes) o.pass = *passes;
    return pass_run_list(m, list->items, list->count, &o, d);
}

bool cli_run_passes(ir_module *m, const char *after, const pass_options *passes, const char *print_after,
                    diag_engine *d) {
    pass_list list;
    return pass_pipeline_until(after, &list, d) && run_list(m, &list, passes, print_after, d);
}

bool cli_run_pass_list(ir_module *m, const char *names, const char *print_after, diag_engine *d) {
    pass_list list = {.count = 0};
    if (names && !pass_parse_list(names, &list, d)) return false;
    return run_list(m, &list, NULL, print_after, d);
}

bool cli_compile_model(const char *path, const fe_options *o, const pass_options *passes, const char *print_after,
                       ir_module *m, diag_engine *d) {
    return fe_load_model(path, o, d, m) && cli_run_passes(m, "all", passes, print_after, d);
}
