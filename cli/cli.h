/* cli.h - what the `smelt` subcommands share: argument scanning and reading
 * input files. The CLI parses arguments and calls the driver library
 * (driver.h); it holds no compiler logic. */
#ifndef SMELT_CLI_H
#define SMELT_CLI_H

#include "diag.h"
#include "driver.h"

#include <stdbool.h>
#include <stddef.h>
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
    const char *command;       /* for messages: "smelt ir" */
    const char *source_option; /* first option seen that applies only to a model source, or NULL */
} cli_args;

/* True if argv[index] is the flag `name` (a value then follows, via *value). */
bool cli_flag_value(cli_args *a, const char *name, const char **value);
bool cli_flag(cli_args *a, const char *name);
void cli_usage_error(const cli_args *a, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

/* --format's value; false after a usage message. */
bool cli_parse_format(const cli_args *a, const char *text, drv_ir_format *out);
/* --precision's value (f32, bf16); false after a usage message. */
bool cli_parse_precision(const cli_args *a, const char *text, drv_precision *out);
/* --kv-cache's value (auto, bf16, f16, f32, fp8); false after a usage message. */
bool cli_parse_kv_cache(const cli_args *a, const char *text, drv_kv_cache *out);
/* --tokenizer's value (bytes); false after a usage message. */
bool cli_parse_tokenizer(const cli_args *a, const char *text);
/* The positional argument at a->index into *slot (`what` names it in
 * messages: "model file"); false after a usage message when it is an
 * unknown option or a second one. */
bool cli_positional(cli_args *a, const char **slot, const char *what);

/* --set NAME=VALUE into o; false (after a usage message) when malformed. */
bool cli_add_setting(const cli_args *a, drv_source_options *o, const char *text);
/* --allow-config-key KEY and --allow-unused-tensor GLOB, which every command
 * that reads a model source takes: CLI_OK, CLI_USAGE_ERROR after a message,
 * or CLI_NOT_MINE. */
int cli_allowance_option(cli_args *a, drv_source_options *o);
/* A non-negative decimal count; false (after a usage message) otherwise. */
bool cli_parse_count(const cli_args *a, const char *text, unsigned *out);

/* Consumes one of the options every command that steps a model takes
 * (--backend, --config, --set, --weights, --precision, --tokenizer): CLI_OK,
 * or CLI_USAGE_ERROR after a message, or CLI_NOT_MINE. */
enum { CLI_NOT_MINE = -2 };
int cli_model_option(cli_args *a, drv_model_options *o);
/* Consumes one of the precision pass's options besides --precision (--act
 * f32|bf16|f16, --group-size 32|64|128, --keep GLOBS): CLI_OK, CLI_USAGE_ERROR
 * after a message, or CLI_NOT_MINE. */
int cli_precision_option(cli_args *a, drv_precision_options *o);
/* Consumes one of the lowering passes' options that `smelt ir` and `smelt opt`
 * take (--precision, --max-step-tokens): CLI_OK, CLI_USAGE_ERROR after a
 * message, or CLI_NOT_MINE. */
int cli_lowering_option(cli_args *a, drv_lowering *o);
/* A plan's params, precision and tokenizer were fixed when it was compiled:
 * false (after a usage message) when o->model_path is a plan and one of
 * --config, --set, --precision or --tokenizer was given. */
bool cli_check_plan_options(const cli_args *a, const drv_model_options *o);

/* Reads a whole file ("-": stdin), at most 256 MiB; reports failure to d. */
char *cli_read_file(const char *path, size_t *length, diag_engine *d);

/* malloc, or the program ends with "out of memory": the CLI may exit, the
 * library below it may not. */
void *cli_alloc(size_t bytes);
_Noreturn void cli_out_of_memory(void);

int cmd_ir(int argc, char **argv);
int cmd_opt(int argc, char **argv);
int cmd_run(int argc, char **argv);
int cmd_compile(int argc, char **argv);
int cmd_inspect(int argc, char **argv);
int cmd_eval(int argc, char **argv);

#endif
