/* inspect.c - `smelt inspect`: a plan printed for people (plan_print.h). */
#include "driver_internal.h"

#include "plan_print.h"
#include "plan_read.h"

bool drv_plan_print(const char *plan_path, bool kernel_source, FILE *out, diag_engine *d) {
    plan_file plan;
    char error[1024];
    if (!plan_open(plan_path, &plan, error, sizeof error)) {
        diag_error(d, SMELT_NO_LOC, "%s", error);
        return false;
    }
    plan_print_options options = {.kernel_source = kernel_source};
    bool ok = plan_print(out, &plan, &options, error, sizeof error);
    if (!ok) diag_error(d, SMELT_NO_LOC, "%s", error);
    plan_close(&plan);
    return ok;
}
