/* cmd_inspect.c - `smelt inspect`: everything a plan holds, readable, and
 * its performance model. */
#include "cli.h"

#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: smelt inspect model.plan [--source] [--json] [--prefill N[,N...]] [--decode-context C[,C...]]\n"
    "\n"
    "Prints a plan: format and smelt versions, the content hash to pin, the\n"
    "section table with checksums, the manifest, every kernel with its launch\n"
    "rule and per-arch registers, shared memory and spills, the launch program\n"
    "(launches per step), the memory plan and the weight table. Then its\n"
    "performance model, for each step kind: launches per step and per decoder\n"
    "layer, every kernel's modeled DRAM bytes read and written and flops, the\n"
    "totals, the bytes no implementation can avoid, and the time they take at\n"
    "the peak bandwidth and tensor throughput of an A100, H100 and H200.\n"
    "\n"
    "options:\n"
    "  --source              also print every kernel's CUDA C source\n"
    "  --json                print the performance model alone, as JSON\n"
    "  --prefill N           model a prefill of N tokens (repeatable, or a list;\n"
    "                        default 512, or the plan's token bound when lower)\n"
    "  --decode-context C    model a decode step with C positions already cached\n"
    "                        (repeatable, or a list; default 1024, or the longest\n"
    "                        the plan's KV caches allow)\n"
    "  -h, --help            show this help\n";

enum { MAX_STEPS = 64 };

/* "128,1024" appended to list[*count]; false after a usage message. */
static bool parse_counts(const cli_args *a, const char *option, const char *text, unsigned *list,
                         uint32_t *count) {
    if (!text) return false;
    const char *p = text;
    for (;;) {
        size_t length = strcspn(p, ",");
        char item[32];
        if (length == 0 || length >= sizeof item) {
            cli_usage_error(a, "%s: expected counts separated by commas, got '%s'", option, text);
            return false;
        }
        if (*count == MAX_STEPS) {
            cli_usage_error(a, "at most %d step kinds of each kind", MAX_STEPS);
            return false;
        }
        memcpy(item, p, length);
        item[length] = '\0';
        if (!cli_parse_count(a, item, &list[*count])) return false;
        (*count)++;
        if (p[length] == '\0') return true;
        p += length + 1;
    }
}

int cmd_inspect(int argc, char **argv) {
    cli_args a = {argc, argv, 1, "smelt inspect", NULL};
    const char *path = NULL, *value;
    unsigned prefill[MAX_STEPS], decode[MAX_STEPS];
    drv_inspect_options o = {.prefill_tokens = prefill, .decode_contexts = decode};
    while (a.index < a.argc) {
        if (cli_flag(&a, "--help") || cli_flag(&a, "-h")) {
            fputs(usage, stdout);
            return CLI_OK;
        } else if (cli_flag(&a, "--source")) {
            o.kernel_source = true;
        } else if (cli_flag(&a, "--json")) {
            o.json = true;
        } else if (cli_flag_value(&a, "--prefill", &value)) {
            if (!parse_counts(&a, "--prefill", value, prefill, &o.prefill_count)) return CLI_USAGE_ERROR;
        } else if (cli_flag_value(&a, "--decode-context", &value)) {
            if (!parse_counts(&a, "--decode-context", value, decode, &o.decode_count)) return CLI_USAGE_ERROR;
        } else if (!cli_positional(&a, &path, "plan")) {
            return CLI_USAGE_ERROR;
        }
    }
    if (!path) {
        cli_usage_error(&a, "no plan given");
        return CLI_USAGE_ERROR;
    }
    if (o.json && o.kernel_source) {
        cli_usage_error(&a, "--source prints the plan, --json only its performance model: give one");
        return CLI_USAGE_ERROR;
    }
    diag_engine d;
    diag_init(&d, stderr);
    bool ok = drv_plan_print(path, &o, stdout, &d);
    diag_free(&d);
    return ok ? CLI_OK : CLI_INPUT_ERROR;
}
