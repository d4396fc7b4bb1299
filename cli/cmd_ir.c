/* cmd_ir.c - `smelt ir`: a model file through the frontend and the passes
 * up to --after, printed as text IR, JSON or Graphviz. */
#include "cli.h"

static const char usage[] =
    "usage: smelt ir MODEL [options]\n"
    "\n"
    "Prints the IR of MODEL (a .smelt DSL file or a .json model description).\n"
    "\n"
    "options:\n"
    "  --config PATH          bind params from a Hugging Face config.json, or\n"
    "                         the folder holding it\n"
    "  --set NAME=VALUE       set a param (wins over --config); may repeat\n"
    "  --allow-config-key KEY ignore config key KEY, which no param binds,\n"
    "                         knowing it does not change the computation (an\n"
    "                         unbound key is an error otherwise); may repeat\n"
    "  --allow-unused-tensor GLOB\n"
    "                         leave checkpoint tensors matching GLOB unused ('*':\n"
    "                         any run of characters, '.' included; an unused tensor\n"
    "                         is an error otherwise); may repeat\n"
    "  --after PASS|all       run the pipeline up to and including PASS\n"
    "                         (default: infer-shapes; `all`: every pass)\n"
    "  --print-ir-after PASS|all\n"
    "                         also print the IR after each named pass (to stderr)\n"
    "  --precision P          the precision pass's preset: f32 (default), bf16,\n"
    "                         int4-rtn, int4-awq, int4-gptq, int8, fp8;\n"
    "                         --group-size, --keep, --act, --act-order,\n"
    "                         --act-quant token|tensor|none (int8, fp8: W8A8 or W8A16)\n"
    "  --kv-cache auto|bf16|f16|f32|fp8\n"
    "                         the precision pass's KV cache dtype (default auto)\n"
    "  --no-fuse              the fuse pass applies no rule: one op per group\n"
    "  --max-step-tokens N    tokens per step plan-memory sizes buffers for\n"
    "                         (default: the token dim's bound)\n"
    "  --format text|json|dot output format (default text)\n"
    "  -o FILE                write to FILE instead of standard output\n"
    "  --max-errors N         stop after N errors (default 20, 0: no limit)\n"
    "  -h, --help             show this help\n";

typedef struct ir_command {
    const char *model_path;
    const char *after;
    const char *print_after;
    const char *output_path;
    drv_ir_format format;
    unsigned max_errors;
    drv_lowering lowering;
    drv_source_options source;
} ir_command;

/* Returns CLI_OK, or CLI_USAGE_ERROR after printing the problem. */
static int parse_arguments(int argc, char **argv, ir_command *c) {
    cli_args a = {argc, argv, 1, "smelt ir", NULL};
    const char *value;
    c->after = "infer-shapes";
    c->max_errors = 20;
    while (a.index < a.argc) {
        int lowering_status = cli_lowering_option(&a, &c->lowering);
        if (lowering_status == CLI_USAGE_ERROR) return CLI_USAGE_ERROR;
        if (lowering_status == CLI_OK) continue;
        int allowance = cli_allowance_option(&a, &c->source);
        if (allowance == CLI_USAGE_ERROR) return CLI_USAGE_ERROR;
        if (allowance == CLI_OK) continue;
        if (cli_flag(&a, "--help") || cli_flag(&a, "-h")) {
            fputs(usage, stdout);
            return CLI_HELP_SHOWN;
        } else if (cli_flag_value(&a, "--config", &value)) {
            if (!value) return CLI_USAGE_ERROR;
            c->source.config_path = value;
        } else if (cli_flag_value(&a, "--set", &value)) {
            if (!value) return CLI_USAGE_ERROR;
            if (!cli_add_setting(&a, &c->source, value)) return CLI_USAGE_ERROR;
        } else if (cli_flag_value(&a, "--after", &value)) {
            if (!value) return CLI_USAGE_ERROR;
            c->after = value;
        } else if (cli_flag_value(&a, "--print-ir-after", &value)) {
            if (!value) return CLI_USAGE_ERROR;
            c->print_after = value;
        } else if (cli_flag_value(&a, "--format", &value)) {
            if (!value || !cli_parse_format(&a, value, &c->format)) return CLI_USAGE_ERROR;
        } else if (cli_flag_value(&a, "-o", &value)) {
            if (!value) return CLI_USAGE_ERROR;
            c->output_path = value;
        } else if (cli_flag_value(&a, "--max-errors", &value)) {
            if (!value || !cli_parse_count(&a, value, &c->max_errors)) return CLI_USAGE_ERROR;
        } else if (!cli_positional(&a, &c->model_path, "model file")) {
            return CLI_USAGE_ERROR;
        }
    }
    if (!c->model_path) {
        cli_usage_error(&a, "no model file given");
        return CLI_USAGE_ERROR;
    }
    return CLI_OK;
}

int cmd_ir(int argc, char **argv) {
    ir_command c = {0};
    int status = parse_arguments(argc, argv, &c);
    if (status != CLI_OK) return status == CLI_HELP_SHOWN ? CLI_OK : status;

    diag_engine d;
    diag_init(&d, stderr);
    d.max_errors = c.max_errors;
    bool ok = drv_ir_print_model(c.model_path, &c.source, c.after, &c.lowering, c.print_after, c.format,
                                 c.output_path, &d);
    status = ok && !diag_has_errors(&d) ? CLI_OK : CLI_INPUT_ERROR;
    diag_free(&d);
    return status;
}
