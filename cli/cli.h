/* cli.h - what the `smelt` subcommands share: argument scanning, reading
 * input files and writing the IR in the chosen format. The CLI parses
 * arguments and calls the library; it holds no compiler logic. */
#ifndef SMELT_CLI_H
#define SMELT_CLI_H

#include "checkpoint.h"
#include "diag.h"
#include "emit.h"
#include "pass.h"
#include "frontend.h"
#include "weights.h"
#include "ir.h"

#include <stdbool.h>
#include <stdio.h>

/* Exit statuses: 0 success, 1 errors in the input, 2 bad command line. */
enum { CLI_OK = 0, CLI_INPUT_ERROR = 1, CLI_USAGE_ERROR = 2 };
/* Returned by argument parsers after printing --help; the command exits 0. */
enum { CLI_HELP_SHOWN = -1 };

/* Walks argv of a subcommand. `--name value` and `--name=value` both work. */
typedef struct cli_args {
    int argc;
    char **argv;
    int index;
    const char *command; /* for messages: "smelt ir" */
} cli_args;

/* True if argv[index] is the flag `name` (a value then follows, via *value). */
bool cli_flag_value(cli_args *a, const char *name, const char **value);
bool cli_flag(cli_args *a, const char *name);
void cli_usage_error(const cli_args *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

typedef enum cli_format { CLI_FORMAT_TEXT, CLI_FORMAT_JSON, CLI_FORMAT_DOT } cli_format;
/* --format's value; false after a usage message. */
bool cli_parse_format(const cli_args *a, const char *text, cli_format *out);
/* --precision's value (f32, bf16); false after a usage message. */
bool cli_parse_precision(const cli_args *a, const char *text, const char **out);
/* --tokenizer's value (bytes); false after a usage message. */
bool cli_parse_tokenizer(const cli_args *a, const char *text);
/* The positional argument at a->index into *slot (`what` names it in
 * messages: "model file"); false after a usage message when it is an
 * unknown option or a second one. */
bool cli_positional(cli_args *a, const char **slot, const char *what);
void cli_print_module(const ir_module *m, cli_format format, FILE *out);

/* --set NAME=VALUE into o; false (after a usage message) when malformed. */
bool cli_add_setting(const cli_args *a, fe_options *o, const char *text);
/* A non-negative decimal count; false (after a usage message) otherwise. */
bool cli_parse_count(const cli_args *a, const char *text, unsigned *out);

/* Runs the passes of the pipeline up to and including `after` ("all": every
 * pass), printing the IR after the passes named by print_after (NULL, a
 * name, or "all") to stderr. */
bool cli_run_passes(ir_module *m, const char *after, const pass_options *passes, const char *print_after,
                    diag_engine *d);
/* The frontend and every pass: what compile and run start from. */
bool cli_compile_model(const char *path, const fe_options *o, const pass_options *passes, const char *print_after,
                       ir_module *m,
                       diag_engine *d);
/* Runs the comma-separated passes `names` (NULL: none; the module is still
 * verified), printing as for cli_run_passes. */
bool cli_run_pass_list(ir_module *m, const char *names, const char *print_after, diag_engine *d);
/* Writes m to `path` (NULL or "-": stdout). */
bool cli_write_module(const ir_module *m, cli_format format, const char *path, diag_engine *d);

/* Reads a whole file ("-": stdin), at most 256 MiB; reports failure to d. */
char *cli_read_file(const char *path, size_t *length, diag_engine *d);

/* A checkpoint bound to a module's weights (weights.c). */
typedef struct cli_weights {
    st_checkpoint checkpoint;
    fe_weight_binding binding;
} cli_weights;
bool cli_weights_open(cli_weights *w, const char *path, const ir_module *m, diag_engine *d);
/* A ref_weight_reader / cg_weight_reader over a cli_weights. */
bool cli_weights_read(void *context, uint32_t op, float *dst, uint64_t count);
void cli_weights_close(cli_weights *w);

int cmd_ir(int argc, char **argv);
int cmd_opt(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_compile(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_eval(int argc, char **argv);

#endif
