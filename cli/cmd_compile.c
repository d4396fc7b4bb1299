/* cmd_compile.c - `smelt compile`: a model to a plan file. */
#include "cli.h"

#include <string.h>
#include <unistd.h>

static const char usage[] =
    "usage: smelt compile MODEL [options] -o model.plan\n"
    "\n"
    "Compiles MODEL (a .smelt or .json model description) into a plan file:\n"
    "its kernels compiled by NVRTC for each CUDA target and built for the host\n"
    "simulator, the launch program, the memory plan, and (with --weights) the\n"
    "weights. A plan holds machine code: treat it like an executable, and pin\n"
    "the content hash that `smelt inspect` prints.\n"
    "\n"
    "options:\n"
    "  --config PATH             bind params from a Hugging Face config.json, or\n"
    "                            the folder holding it (default: the --weights\n"
    "                            folder's config.json, if it has one)\n"
    "  --set NAME=VALUE          set a param (wins over --config); may repeat\n"
    "  --allow-config-key KEY    ignore config key KEY, which no param binds,\n"
    "                            knowing it does not change the computation (an\n"
    "                            unbound key is an error otherwise); may repeat\n"
    "  --allow-unused-tensor GLOB\n"
    "                            leave checkpoint tensors matching GLOB unused\n"
    "                            ('*': any run of characters, '.' included; an unused\n"
    "                            tensor is an error otherwise); may repeat\n"
    "  --weights PATH            a .safetensors file, an index.json, or a model's\n"
    "                            folder; without it weights are bound at run time\n"
    "  --target LIST             sm_80,sm_90,host (default: all three)\n"
    "  --precision P             f32, bf16 (the default), or bf16 with quantized\n"
    "                            matmul weights: int4-rtn (W4A16, f16 scales and\n"
    "                            zero points per group; the token embedding int8\n"
    "                            with an f16 scale per row, under every int4\n"
    "                            preset); fp8 (W8A8: E4M3 weights per output\n"
    "                            channel, each matmul's and MoE expert's input\n"
    "                            E4M3 per token at run time); int8 (W8A8\n"
    "                            likewise, with SmoothQuant's migration learnt\n"
    "                            from --calib IDS, per expert for MoE);\n"
    "                            arithmetic is f32 either way\n"
    "  --act-quant token|tensor|none\n"
    "                            int8, fp8: per-token activation scales (default);\n"
    "                            tensor (fp8): static per-tensor scales from\n"
    "                            --calib IDS, one per matmul input and per MoE\n"
    "                            stack; none: weight-only W8A16 (no --calib)\n"
    "  --group-size 32|64|128    int4's input columns per scale (default 128)\n"
    "  --keep GLOBS              weights kept bf16: lm_head,*.down_proj (matched\n"
    "                            with and without '.weight'; '*' any run, as above);\n"
    "                            model.embed_tokens keeps the int4 presets'\n"
    "                            embedding table bf16\n"
    "  --act f32|bf16|f16        activation storage (default: the preset's); f16\n"
    "                            (unquantized weights too) is finite to 65504\n"
    "  --precision int4-awq|int4-gptq\n"
    "                            int4 with AWQ's column scales or GPTQ's error\n"
    "                            compensation, learnt from --calib IDS (token ids\n"
    "                            as `smelt eval --ids` reads them) on the reference\n"
    "  --act-order               int4-gptq: columns by descending activation energy\n"
    "  --max-layer-error E       accuracy gate: each quantized weight's output\n"
    "                            error |(W - Wq) X| / |W X| on --calib IDS (W8A8:\n"
    "                            |W X - Wq Q(X)| / |W X|, activations quantized);\n"
    "                            over E (e.g. 0.05) it stays bf16; a table on\n"
    "                            stderr and in the plan (`smelt inspect`)\n"
    "  --kv-cache auto|bf16|f16|f32|fp8\n"
    "                            KV cache storage (default auto: the activation\n"
    "                            dtype; fp8: E4M3 with an f32 scale per cached\n"
    "                            row of each kv head)\n"
    "  --tokenizer bytes         store a byte tokenizer (ids 0..255 are bytes; BOS\n"
    "                            and EOS from config.json) for `smelt run --prompt`\n"
    "                            (the plan keeps the model's EOS ids either way)\n"
    "  --no-fuse                 one op per kernel: no fusion rule (for comparison\n"
    "                            and debugging)\n"
    "  --max-step-tokens N       tokens per step the memory plan is sized for\n"
    "                            (default: the model's bound, at most 512)\n"
    "  -j N                      compile threads (default: every core)\n"
    "  --no-cache                do not read or write the kernel cache\n"
    "                            (~/.cache/smelt; SMELT_CACHE_DIR overrides)\n"
    "  --print-ir-after PASS|all print the IR after the named passes (stderr)\n"
    "  -o FILE                   the plan to write (atomically)\n"
    "  --max-errors N            stop after N errors (default 20, 0: no limit)\n"
    "  -h, --help                show this help\n";

enum { DEFAULT_MAX_STEP_TOKENS = 512 };

typedef struct compile_command {
    const char *model_path, *output_path;
    unsigned max_errors, jobs, max_step_tokens;
    drv_source_options source;
    drv_compile_options plan;
} compile_command;

/* "sm_80,sm_90,host" into the plan options. */
static bool parse_targets(const cli_args *a, const char *text, drv_compile_options *o) {
    o->arch_count = 0;
    o->host = false;
    const char *p = text;
    while (*p) {
        const char *end = strchr(p, ',');
        size_t n = end ? (size_t)(end - p) : strlen(p);
        int arch;
        char rest;
        char item[32];
        snprintf(item, sizeof item, "%.*s", (int)(n < sizeof item - 1 ? n : sizeof item - 1), p);
        if (strcmp(item, "host") == 0) {
            o->host = true;
        } else if (sscanf(item, "sm_%d%c", &arch, &rest) == 1 && arch >= 50 && arch < 1000 &&
                   o->arch_count < DRV_MAX_ARCHS) {
            o->archs[o->arch_count++] = arch;
        } else {
            cli_usage_error(a, "unknown target '%s' (expected sm_XY or host, e.g. sm_80,sm_90,host)", item);
            return false;
        }
        p = end ? end + 1 : p + n;
    }
    if (o->arch_count == 0 && !o->host) {
        cli_usage_error(a, "--target names no target");
        return false;
    }
    return true;
}

static int parse_arguments(int argc, char **argv, compile_command *c) {
    cli_args a = {argc, argv, 1, "smelt compile", NULL};
    const char *value;
    c->max_errors = 20;
    c->plan.precision = DRV_PRECISION_BF16;
    parse_targets(&a, "sm_80,sm_90,host", &c->plan);
    while (a.index < a.argc) {
        int allowance = cli_allowance_option(&a, &c->source);
        if (allowance == CLI_USAGE_ERROR) return CLI_USAGE_ERROR;
        if (allowance == CLI_OK) continue;
        int precision = cli_precision_option(&a, &c->plan.precision_options);
        if (precision == CLI_USAGE_ERROR) return CLI_USAGE_ERROR;
        if (precision == CLI_OK) continue;
        if (cli_flag(&a, "--help") || cli_flag(&a, "-h")) {
            fputs(usage, stdout);
            return CLI_HELP_SHOWN;
        } else if (cli_flag_value(&a, "--config", &value)) {
            if (!value) return CLI_USAGE_ERROR;
            c->source.config_path = value;
        } else if (cli_flag_value(&a, "--set", &value)) {
            if (!value || !cli_add_setting(&a, &c->source, value)) return CLI_USAGE_ERROR;
        } else if (cli_flag_value(&a, "--weights", &value)) {
            if (!value) return CLI_USAGE_ERROR;
            c->plan.weights_path = value;
        } else if (cli_flag_value(&a, "--target", &value)) {
            if (!value || !parse_targets(&a, value, &c->plan)) return CLI_USAGE_ERROR;
        } else if (cli_flag_value(&a, "--precision", &value)) {
            if (!value || !cli_parse_precision(&a, value, &c->plan.precision)) return CLI_USAGE_ERROR;
        } else if (cli_flag_value(&a, "--kv-cache", &value)) {
            if (!value || !cli_parse_kv_cache(&a, value, &c->plan.kv_cache)) return CLI_USAGE_ERROR;
        } else if (cli_flag_value(&a, "--tokenizer", &value)) {
            if (!value || !cli_parse_tokenizer(&a, value)) return CLI_USAGE_ERROR;
            c->plan.byte_tokenizer = true;
        } else if (cli_flag_value(&a, "--max-step-tokens", &value)) {
            if (!value || !cli_parse_count(&a, value, &c->max_step_tokens)) return CLI_USAGE_ERROR;
        } else if (cli_flag_value(&a, "-j", &value)) {
            if (!value || !cli_parse_count(&a, value, &c->jobs)) return CLI_USAGE_ERROR;
        } else if (cli_flag(&a, "--no-fuse")) {
            c->plan.no_fuse = true;
        } else if (cli_flag(&a, "--no-cache")) {
            c->plan.no_cache = true;
        } else if (cli_flag_value(&a, "--print-ir-after", &value)) {
            if (!value) return CLI_USAGE_ERROR;
            c->plan.print_after = value;
        } else if (cli_flag_value(&a, "-o", &value)) {
            if (!value) return CLI_USAGE_ERROR;
            c->output_path = value;
        } else if (cli_flag_value(&a, "--max-errors", &value)) {
            if (!value || !cli_parse_count(&a, value, &c->max_errors)) return CLI_USAGE_ERROR;
        } else if (!cli_positional(&a, &c->model_path, "model file")) {
            return CLI_USAGE_ERROR;
        }
    }
    if (!c->model_path || !c->output_path) {
        cli_usage_error(&a, !c->model_path ? "no model file given" : "no output given (-o model.plan)");
        return CLI_USAGE_ERROR;
    }
    return CLI_OK;
}

/* Progress on a terminal: "compiling kernels: 12/24". */
static void show_progress(size_t done, size_t total, void *user) {
    (void)user;
    fprintf(stderr, "\rsmelt: compiling kernels: %zu/%zu", done, total);
    if (done == total) fputc('\n', stderr);
}

int cmd_compile(int argc, char **argv) {
    compile_command c = {0};
    int status = parse_arguments(argc, argv, &c);
    if (status != CLI_OK) return status == CLI_HELP_SHOWN ? CLI_OK : status;

    diag_engine d;
    diag_init(&d, stderr);
    d.max_errors = c.max_errors;
    c.plan.jobs = c.jobs;
    c.plan.max_step_tokens = c.max_step_tokens ? c.max_step_tokens : DEFAULT_MAX_STEP_TOKENS;
    if (isatty(STDERR_FILENO)) c.plan.progress = show_progress;
    drv_compile_report report;
    bool ok = drv_compile(c.model_path, &c.source, &c.plan, c.output_path, &report, &d);
    if (ok)
        fprintf(
            stderr,
            "smelt: wrote %s: %u kernels (%u compile jobs, %u from the cache), %u launches per decode step, "
            "arena %.1f MiB, weights %.1f MiB, %.1f MiB in all, %.2f s\n"
            "smelt: content hash %s\n",
            c.output_path, report.kernel_count, report.compile_jobs, report.cache_hits,
            report.launches_per_step, report.arena_bytes / 1048576.0, report.weight_bytes / 1048576.0,
            report.file_size / 1048576.0, report.seconds, report.content_hash);
    status = ok && !diag_has_errors(&d) ? CLI_OK : CLI_INPUT_ERROR;
    diag_free(&d);
    return status;
}
