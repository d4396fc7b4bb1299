/* cmd_opt.c - `smelt opt`: text IR in, passes run, text IR out. This is what
 * every pass test drives: `smelt opt --pass NAME in.ir | FileCheck in.ir`. */
#include "cli.h"

#include <stdlib.h>
#include <string.h>

static const char usage[] =
    "usage: smelt opt --pass NAME[,NAME...] [options] IN.ir\n"
    "\n"
    "Parses text IR (IN.ir, or - for standard input), runs the named passes in\n"
    "order, verifying the IR after each, and prints the result.\n"
    "\n"
    "options:\n"
    "  --pass NAME[,NAME...]   passes to run (none: parse, verify and print)\n"
    "  --print-ir-after PASS|all\n"
    "                          also print the IR after each named pass (to stderr)\n"
    "  --split-input-file      treat each `# -----` separated chunk as its own\n"
    "                          module; outputs are separated the same way\n"
    "  --precision P           the precision pass's preset: f32 (default), bf16,\n"
    "                          int4-rtn, int4-awq, int4-gptq, int8, fp8;\n"
    "                         --group-size, --keep, --act, --act-order,\n"
    "                          --act-quant token|tensor|none (int8, fp8: W8A8 or W8A16)\n"
    "  --kv-cache auto|bf16|f16|f32|fp8\n"
    "                          the precision pass's KV cache dtype (default auto)\n"
    "  --no-fuse               the fuse pass applies no rule: one op per group\n"
    "  --max-step-tokens N     tokens per step plan-memory sizes buffers for\n"
    "                          (default: the token dim's bound)\n"
    "  --format text|json|dot  output format (default text)\n"
    "  -o FILE                 write to FILE instead of standard output\n"
    "  --max-errors N          stop after N errors (default 20, 0: no limit)\n"
    "  --list-passes           print the known passes and exit\n"
    "  -h, --help              show this help\n";

typedef struct opt_command {
    const char *input_path;
    const char *pass_list;
    const char *print_after;
    const char *output_path;
    drv_ir_format format;
    bool split_input;
    unsigned max_errors;
    drv_lowering lowering;
} opt_command;

static int parse_arguments(int argc, char **argv, opt_command *c) {
    cli_args a = {argc, argv, 1, "smelt opt", NULL};
    const char *value;
    c->max_errors = 20;
    while (a.index < a.argc) {
        int lowering_status = cli_lowering_option(&a, &c->lowering);
        if (lowering_status == CLI_USAGE_ERROR) return CLI_USAGE_ERROR;
        if (lowering_status == CLI_OK) continue;
        if (cli_flag(&a, "--help") || cli_flag(&a, "-h")) {
            fputs(usage, stdout);
            return CLI_HELP_SHOWN;
        } else if (cli_flag(&a, "--list-passes")) {
            drv_print_pass_table(stdout);
            return CLI_HELP_SHOWN;
        } else if (cli_flag_value(&a, "--pass", &value)) {
            if (!value) return CLI_USAGE_ERROR;
            c->pass_list = value;
        } else if (cli_flag_value(&a, "--print-ir-after", &value)) {
            if (!value) return CLI_USAGE_ERROR;
            c->print_after = value;
        } else if (cli_flag(&a, "--split-input-file")) {
            c->split_input = true;
        } else if (cli_flag_value(&a, "--format", &value)) {
            if (!value || !cli_parse_format(&a, value, &c->format)) return CLI_USAGE_ERROR;
        } else if (cli_flag_value(&a, "-o", &value)) {
            if (!value) return CLI_USAGE_ERROR;
            c->output_path = value;
        } else if (cli_flag_value(&a, "--max-errors", &value)) {
            if (!value || !cli_parse_count(&a, value, &c->max_errors)) return CLI_USAGE_ERROR;
        } else if (!cli_positional(&a, &c->input_path, "input file")) {
            return CLI_USAGE_ERROR;
        }
    }
    if (!c->input_path) {
        cli_usage_error(&a, "no input file given (use - for standard input)");
        return CLI_USAGE_ERROR;
    }
    return CLI_OK;
}

/* One module: parse, run passes, print. The chunk text starts with as many
 * newlines as lines precede it in the file, so diagnostics keep their lines. */
static bool run_one(const opt_command *c, const char *text, size_t length, FILE *out, diag_engine *d) {
    return drv_ir_opt(c->input_path, text, length, c->pass_list, &c->lowering, c->print_after, c->format, out,
                      d);
}

/* True when the line at `p` is a chunk separator: `# -----` (and more dashes). */
static bool is_separator(const char *p, const char *end) {
    static const char mark[] = "# -----";
    size_t n = sizeof mark - 1;
    return (size_t)(end - p) >= n && memcmp(p, mark, n) == 0;
}

static bool run_split(const opt_command *c, const char *text, size_t length, FILE *out, diag_engine *d) {
    const char *end = text + length, *chunk = text;
    unsigned chunk_first_line = 1, line = 1;
    bool ok = true, first = true;
    for (const char *p = text;; line++) {
        const char *eol = memchr(p, '\n', (size_t)(end - p));
        const char *next = eol ? eol + 1 : end;
        bool last = next >= end;
        if (is_separator(p, end) || last) {
            const char *chunk_end = is_separator(p, end) ? p : end;
            size_t padding = chunk_first_line - 1, n = (size_t)(chunk_end - chunk);
            char *padded = cli_alloc(padding + n + 1);
            memset(padded, '\n', padding);
            memcpy(padded + padding, chunk, n);
            if (!first) fputs("# -----\n", out);
            first = false;
            ok &= run_one(c, padded, padding + n, out, d);
            free(padded);
            chunk = next;
            chunk_first_line = line + 1;
        }
        if (last || diag_should_stop(d)) break;
        p = next;
    }
    return ok;
}

int cmd_opt(int argc, char **argv) {
    opt_command c = {0};
    int status = parse_arguments(argc, argv, &c);
    if (status != CLI_OK) return status == CLI_HELP_SHOWN ? CLI_OK : status;

    diag_engine d;
    diag_init(&d, stderr);
    d.max_errors = c.max_errors;
    size_t length = 0;
    char *text = cli_read_file(c.input_path, &length, &d);
    bool ok = text != NULL;
    FILE *out = stdout;
    if (ok && c.output_path && strcmp(c.output_path, "-") != 0) {
        out = fopen(c.output_path, "w");
        if (!out) {
            diag_error(&d, ((smelt_loc){diag_file_id(&d, c.output_path), 0, 0}), "cannot write");
            ok = false;
        }
    }
    if (ok) ok = c.split_input ? run_split(&c, text, length, out, &d) : run_one(&c, text, length, out, &d);
    if (out && out != stdout && fclose(out) != 0) ok = false;
    free(text);
    status = ok && !diag_has_errors(&d) ? CLI_OK : CLI_INPUT_ERROR;
    diag_free(&d);
    return status;
}
