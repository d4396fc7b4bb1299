/* cmd_inspect.c - `smelt inspect`: everything a plan holds, readable. */
#include "cli.h"

static const char usage[] = "usage: smelt inspect model.plan [--source]\n"
                            "\n"
                            "Prints a plan: format and smelt versions, the content hash to pin, the\n"
                            "section table with checksums, the manifest, every kernel with its launch\n"
                            "rule and per-arch registers, shared memory and spills, the launch program\n"
                            "(launches per step), the memory plan and the weight table.\n"
                            "\n"
                            "options:\n"
                            "  --source    also print every kernel's CUDA C source\n"
                            "  -h, --help  show this help\n";

int cmd_inspect(int argc, char **argv) {
    cli_args a = {argc, argv, 1, "smelt inspect", NULL};
    const char *path = NULL;
    bool kernel_source = false;
    while (a.index < a.argc) {
        if (cli_flag(&a, "--help") || cli_flag(&a, "-h")) {
            fputs(usage, stdout);
            return CLI_OK;
        } else if (cli_flag(&a, "--source")) {
            kernel_source = true;
        } else if (!cli_positional(&a, &path, "plan")) {
            return CLI_USAGE_ERROR;
        }
    }
    if (!path) {
        cli_usage_error(&a, "no plan given");
        return CLI_USAGE_ERROR;
    }
    diag_engine d;
    diag_init(&d, stderr);
    bool ok = drv_plan_print(path, kernel_source, stdout, &d);
    diag_free(&d);
    return ok ? CLI_OK : CLI_INPUT_ERROR;
}
