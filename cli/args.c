/* args.c - scanning subcommand arguments and reading inputs. */
#include "cli.h"

#include <errno.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

bool cli_flag(cli_args *a, const char *name) {
    if (strcmp(a->argv[a->index], name) != 0) return false;
    a->index++;
    return true;
}

bool cli_flag_value(cli_args *a, const char *name, const char **value) {
    const char *arg = a->argv[a->index];
    size_t n = strlen(name);
    if (strncmp(arg, name, n) != 0) return false;
    if (arg[n] == '=') {
        *value = arg + n + 1;
        a->index++;
        return true;
    }
    if (arg[n] != '\0') return false;
    if (a->index + 1 >= a->argc) {
        cli_usage_error(a, "option '%s' needs a value", name);
        *value = NULL;
        a->index++;
        return true;
    }
    *value = a->argv[a->index + 1];
    a->index += 2;
    return true;
}

void cli_usage_error(const cli_args *a, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "%s: ", a->command);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fprintf(stderr, " (see '%s --help')\n", a->command);
}

bool cli_parse_format(const cli_args *a, const char *text, drv_ir_format *out) {
    static const char *const names[] = {"text", "json", "dot"};
    for (unsigned i = 0; i < 3; i++)
        if (strcmp(text, names[i]) == 0) {
            *out = (drv_ir_format)i;
            return true;
        }
    cli_usage_error(a, "unknown format '%s' (text, json or dot)", text);
    return false;
}

bool cli_parse_precision(const cli_args *a, const char *text, drv_precision *out) {
    if (drv_precision_from_name(text, out)) return true;
    cli_usage_error(a, "unknown precision '%s' (f32, bf16, int4-rtn, int4-awq, int4-gptq, int8 or fp8)",
                    text);
    return false;
}

bool cli_parse_kv_cache(const cli_args *a, const char *text, drv_kv_cache *out) {
    if (drv_kv_cache_from_name(text, out)) return true;
    cli_usage_error(a, "unknown KV cache dtype '%s' (auto, bf16, f16, f32 or fp8)", text);
    return false;
}

bool cli_parse_tokenizer(const cli_args *a, const char *text) {
    if (strcmp(text, "bytes") == 0) return true;
    cli_usage_error(a, "unknown tokenizer '%s' (bytes)", text);
    return false;
}

bool cli_positional(cli_args *a, const char **slot, const char *what) {
    const char *arg = a->argv[a->index];
    if (arg[0] == '-' && arg[1] != '\0') {
        cli_usage_error(a, "unknown option '%s'", arg);
        return false;
    }
    if (*slot) {
        cli_usage_error(a, "more than one %s ('%s' and '%s')", what, *slot, arg);
        return false;
    }
    *slot = arg;
    a->index++;
    return true;
}

void cli_out_of_memory(void) {
    fputs("smelt: error: out of memory\n", stderr);
    exit(CLI_INPUT_ERROR);
}

void *cli_alloc(size_t bytes) {
    void *p = malloc(bytes ? bytes : 1);
    if (!p) cli_out_of_memory();
    return p;
}

enum { CLI_MAX_INPUT_BYTES = 256 * 1024 * 1024 };

char *cli_read_file(const char *path, size_t *length, diag_engine *d) {
    FILE *fp = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!fp) {
        diag_error(d, SMELT_NO_LOC, "cannot read '%s': %s", path, strerror(errno));
        return NULL;
    }
    size_t capacity = 1 << 16, n = 0;
    char *text = cli_alloc(capacity);
    for (;;) {
        size_t got = fread(text + n, 1, capacity - n, fp);
        n += got;
        if (got == 0) break;
        if (n == capacity) {
            if (capacity >= CLI_MAX_INPUT_BYTES) {
                diag_error(d, ((smelt_loc){diag_file_id(d, path), 0, 0}), "file is larger than %d MiB",
                           CLI_MAX_INPUT_BYTES >> 20);
                free(text);
                if (fp != stdin) fclose(fp);
                return NULL;
            }
            capacity *= 2;
            char *grown = realloc(text, capacity);
            if (!grown) cli_out_of_memory();
            text = grown;
        }
    }
    bool failed = ferror(fp);
    if (fp != stdin) fclose(fp);
    if (failed) {
        diag_error(d, ((smelt_loc){diag_file_id(d, path), 0, 0}), "read error");
        free(text);
        return NULL;
    }
    *length = n;
    return text;
}

bool cli_add_setting(const cli_args *a, drv_source_options *o, const char *text) {
    const char *equals = strchr(text, '=');
    if (!equals || equals == text) {
        cli_usage_error(a, "--set expects NAME=VALUE, got '%s'", text);
        return false;
    }
    /* The name is cut out of the argv string in place (C lets a program
     * modify its argv strings), so nothing needs freeing. */
    char *name = (char *)text;
    name[equals - text] = '\0';
    if (!drv_source_options_set(o, name, equals + 1)) {
        cli_usage_error(a, "too many --set options (at most %d)", DRV_MAX_SETTINGS);
        return false;
    }
    return true;
}

int cli_allowance_option(cli_args *a, drv_source_options *o) {
    const char *value, *flag = NULL;
    if (cli_flag_value(a, "--allow-config-key", &value)) {
        flag = "--allow-config-key";
        if (!value) return CLI_USAGE_ERROR;
        if (!drv_source_options_allow_key(o, value)) {
            cli_usage_error(a, "too many --allow-config-key options (at most %d)", DRV_MAX_SETTINGS);
            return CLI_USAGE_ERROR;
        }
    } else if (cli_flag_value(a, "--allow-unused-tensor", &value)) {
        /* not a source option: binding a plan's weights at run time takes it too */
        if (!value) return CLI_USAGE_ERROR;
        if (!drv_source_options_allow_unused_tensor(o, value)) {
            cli_usage_error(a, "too many --allow-unused-tensor options (at most %d)", DRV_MAX_SETTINGS);
            return CLI_USAGE_ERROR;
        }
    } else {
        return CLI_NOT_MINE;
    }
    if (flag && !a->source_option) a->source_option = flag;
    return CLI_OK;
}

bool cli_parse_count(const cli_args *a, const char *text, unsigned *out) {
    char *end;
    errno = 0;
    unsigned long v = strtoul(text, &end, 10);
    if (errno || end == text || *end || text[0] == '-' || v > 1000000) {
        cli_usage_error(a, "expected a count, got '%s'", text);
        return false;
    }
    *out = (unsigned)v;
    return true;
}

int cli_precision_option(cli_args *a, drv_precision_options *o) {
    const char *value;
    unsigned group;
    if (cli_flag_value(a, "--act", &value)) {
        if (!value) return CLI_USAGE_ERROR;
        if (strcmp(value, "f32") != 0 && strcmp(value, "bf16") != 0 && strcmp(value, "f16") != 0) {
            cli_usage_error(a, "unknown activation dtype '%s' (f32, bf16 or f16)", value);
            return CLI_USAGE_ERROR;
        }
        o->activations = value;
    } else if (cli_flag_value(a, "--group-size", &value)) {
        if (!value || !cli_parse_count(a, value, &group)) return CLI_USAGE_ERROR;
        if (group != 32 && group != 64 && group != 128) {
            cli_usage_error(a, "--group-size %u: int4 groups are 32, 64 or 128 input columns", group);
            return CLI_USAGE_ERROR;
        }
        o->group_size = group;
    } else if (cli_flag_value(a, "--keep", &value)) {
        if (!value) return CLI_USAGE_ERROR;
        o->keep = value;
    } else if (cli_flag_value(a, "--calib", &value)) {
        if (!value) return CLI_USAGE_ERROR;
        o->calib_path = value;
    } else if (cli_flag(a, "--act-order")) {
        o->act_order = true;
    } else if (cli_flag_value(a, "--act-quant", &value)) {
        if (!value) return CLI_USAGE_ERROR;
        if (strcmp(value, "token") != 0 && strcmp(value, "tensor") != 0 && strcmp(value, "none") != 0) {
            cli_usage_error(a, "unknown activation quantization '%s' (token, tensor or none)", value);
            return CLI_USAGE_ERROR;
        }
        o->act_quant = value;
    } else if (cli_flag_value(a, "--max-layer-error", &value)) {
        if (!value) return CLI_USAGE_ERROR;
        char *end;
        errno = 0;
        double limit = strtod(value, &end);
        if (errno || end == value || *end || !(limit > 0 && limit < 1e30)) {
            cli_usage_error(a, "--max-layer-error: expected a positive number (e.g. 0.05), got '%s'", value);
            return CLI_USAGE_ERROR;
        }
        o->max_layer_error = limit;
    } else {
        return CLI_NOT_MINE;
    }
    return CLI_OK;
}

int cli_lowering_option(cli_args *a, drv_lowering *o) {
    const char *value;
    unsigned tokens;
    int precision = cli_precision_option(a, &o->precision_options);
    if (precision != CLI_NOT_MINE) return precision;
    if (cli_flag_value(a, "--precision", &value)) {
        if (!value || !cli_parse_precision(a, value, &o->precision)) return CLI_USAGE_ERROR;
    } else if (cli_flag_value(a, "--kv-cache", &value)) {
        if (!value || !cli_parse_kv_cache(a, value, &o->kv_cache)) return CLI_USAGE_ERROR;
    } else if (cli_flag(a, "--no-fuse")) {
        o->no_fuse = true;
    } else if (cli_flag_value(a, "--max-step-tokens", &value)) {
        if (!value || !cli_parse_count(a, value, &tokens)) return CLI_USAGE_ERROR;
        o->max_step_tokens = tokens;
    } else {
        return CLI_NOT_MINE;
    }
    return CLI_OK;
}

int cli_model_option(cli_args *a, drv_model_options *o) {
    const char *value;
    int allowance = cli_allowance_option(a, &o->source);
    if (allowance != CLI_NOT_MINE) return allowance;
    int precision = cli_precision_option(a, &o->precision_options);
    if (precision != CLI_NOT_MINE) {
        if (!a->source_option)
            a->source_option =
                "--act, --group-size, --keep, --calib, --act-order, --act-quant or --max-layer-error";
        return precision;
    }
    if (cli_flag_value(a, "--config", &value)) {
        if (!value) return CLI_USAGE_ERROR;
        o->source.config_path = value;
        if (!a->source_option) a->source_option = "--config";
    } else if (cli_flag_value(a, "--set", &value)) {
        if (!value || !cli_add_setting(a, &o->source, value)) return CLI_USAGE_ERROR;
        if (!a->source_option) a->source_option = "--set";
    } else if (cli_flag_value(a, "--weights", &value)) {
        if (!value) return CLI_USAGE_ERROR;
        o->weights_path = value;
    } else if (cli_flag_value(a, "--backend", &value)) {
        if (!value) return CLI_USAGE_ERROR;
        if (!drv_backend_from_name(value, &o->backend)) {
            cli_usage_error(a, "unknown backend '%s' (auto, host, cuda or ref)", value);
            return CLI_USAGE_ERROR;
        }
    } else if (cli_flag_value(a, "--precision", &value)) {
        if (!value || !cli_parse_precision(a, value, &o->precision)) return CLI_USAGE_ERROR;
        if (!a->source_option) a->source_option = "--precision";
    } else if (cli_flag_value(a, "--kv-cache", &value)) {
        if (!value || !cli_parse_kv_cache(a, value, &o->kv_cache)) return CLI_USAGE_ERROR;
        if (!a->source_option) a->source_option = "--kv-cache";
    } else if (cli_flag(a, "--no-fuse")) {
        o->no_fuse = true;
        if (!a->source_option) a->source_option = "--no-fuse";
    } else if (cli_flag_value(a, "--expect-hash", &value)) {
        if (!value) return CLI_USAGE_ERROR;
        o->expected_hash = value;
    } else if (cli_flag_value(a, "--tokenizer", &value)) {
        if (!value || !cli_parse_tokenizer(a, value)) return CLI_USAGE_ERROR;
        if (!a->source_option) a->source_option = "--tokenizer";
        o->byte_tokenizer = true;
    } else {
        return CLI_NOT_MINE;
    }
    return CLI_OK;
}

bool cli_check_plan_options(const cli_args *a, const drv_model_options *o) {
    if (!a->source_option || !drv_is_plan_file(o->model_path)) return true;
    cli_usage_error(a,
                    "%s applies only to a model source; '%s' is a plan, whose params, precision and "
                    "tokenizer were fixed when it was compiled",
                    a->source_option, o->model_path);
    return false;
}
