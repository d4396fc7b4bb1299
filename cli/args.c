/* args.c - scanning subcommand arguments, reading inputs, printing IR. */
#include "cli.h"

#include "ir_io.h"

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

bool cli_parse_format(const cli_args *a, const char *text, cli_format *out) {
    static const char *const names[] = {"text", "json", "dot"};
    for (unsigned i = 0; i < 3; i++)
        if (strcmp(text, names[i]) == 0) {
            *out = (cli_format)i;
            return true;
        }
    cli_usage_error(a, "unknown format '%s' (text, json or dot)", text);
    return false;
}

bool cli_parse_precision(const cli_args *a, const char *text, const char **out) {
    if (strcmp(text, "f32") == 0 || strcmp(text, "bf16") == 0) {
        *out = text;
    } else {
        cli_usage_error(a, "unknown precision '%s' (f32 or bf16; fp8 and int4 come later)", text);
        return false;
    }
    return true;
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

void cli_print_module(const ir_module *m, cli_format format, FILE *out) {
    switch (format) {
    case CLI_FORMAT_TEXT: ir_print_text(m, out); break;
    case CLI_FORMAT_JSON: ir_print_json(m, out); break;
    case CLI_FORMAT_DOT: ir_print_dot(m, out); break;
    }
}

enum { CLI_MAX_INPUT_BYTES = 256 * 1024 * 1024 };

char *cli_read_file(const char *path, size_t *length, diag_engine *d) {
    FILE *fp = strcmp(path, "-") == 0 ? stdin : fopen(path, "rb");
    if (!fp) {
        diag_error(d, SMELT_NO_LOC, "cannot read '%s': %s", path, strerror(errno));
        return NULL;
    }
    size_t capacity = 1 << 16, n = 0;
    char *text = malloc(capacity);
    if (!text) SMELT_DIE("out of memory");
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
            if (!grown) SMELT_DIE("out of memory");
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

bool cli_add_setting(const cli_args *a, fe_options *o, const char *text) {
    const char *equals = strchr(text, '=');
    if (!equals || equals == text) {
        cli_usage_error(a, "--set expects NAME=VALUE, got '%s'", text);
        return false;
    }
    /* The name is cut out of the argv string in place (C lets a program
     * modify its argv strings), so nothing needs freeing. */
    char *name = (char *)text;
    name[equals - text] = '\0';
    if (!fe_options_set(o, name, equals + 1)) {
        cli_usage_error(a, "too many --set options (at most %d)", FE_MAX_SETTINGS);
        return false;
    }
    return true;
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

bool cli_write_module(const ir_module *m, cli_format format, const char *path, diag_engine *d) {
    if (!path || strcmp(path, "-") == 0) {
        cli_print_module(m, format, stdout);
        return fflush(stdout) == 0;
    }
    FILE *out = fopen(path, "w");
    if (!out) {
        diag_error(d, ((smelt_loc){diag_file_id(d, path), 0, 0}), "cannot write: %s", strerror(errno));
        return false;
    }
    cli_print_module(m, format, out);
    if (fclose(out) != 0) {
        diag_error(d, ((smelt_loc){diag_file_id(d, path), 0, 0}), "write failed");
        return false;
    }
    return true;
}
