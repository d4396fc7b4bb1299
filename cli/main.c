/* main.c - the `smelt` command: picks the subcommand and hands over argv. */
#include "cli.h"

#include <stdio.h>
#include <string.h>

static const char usage[] =
    "usage: smelt <command> [options]\n"
    "\n"
    "smelt compiles transformer model descriptions (DSL or JSON, bound to a\n"
    "Hugging Face config.json) through an IR and its passes.\n"
    "\n"
    "commands:\n"
    "  ir    MODEL [--config C] [--set K=V]... [--after PASS|all] [--format text|json|dot]\n"
    "        print the IR of a model\n"
    "  opt   --pass NAME[,NAME...] IN.ir   run passes on text IR and print the result\n"
    "  compile MODEL [--config C] [--weights W] [--target sm_80,sm_90,host]\n"
    "        [--precision f32|bf16|int4-rtn|int8|fp8] -o model.plan   compile to a plan file\n"
    "  inspect model.plan                  print everything a plan holds\n"
    "  run   MODEL|PLAN --prompt-ids 1,2,3 | --prompt TEXT [--max-tokens N] [--backend B]\n"
    "        generate greedily: on a GPU, the host simulator, or the reference\n"
    "  eval  MODEL|PLAN --ids FILE [--context N]   perplexity over token ids\n"
    "\n"
    "`smelt <command> --help` describes a command's options.\n";

typedef struct command {
    const char *name;
    int (*run)(int argc, char **argv);
} command;

static const command commands[] = {
    {"ir", cmd_ir},           {"opt", cmd_opt},         {"run", cmd_run},
    {"compile", cmd_compile}, {"inspect", cmd_inspect}, {"eval", cmd_eval},
};

int main(int argc, char **argv) {
    if (argc < 2) {
        fputs(usage, stderr);
        return CLI_USAGE_ERROR;
    }
    const char *name = argv[1];
    if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0 || strcmp(name, "help") == 0) {
        fputs(usage, stdout);
        return CLI_OK;
    }
    if (strcmp(name, "--version") == 0) {
        printf("smelt %s\n", SMELT_VERSION);
        return CLI_OK;
    }
    for (size_t i = 0; i < sizeof commands / sizeof commands[0]; i++)
        if (strcmp(commands[i].name, name) == 0) return commands[i].run(argc - 1, argv + 1);
    fprintf(stderr, "smelt: unknown command '%s'\n\n%s", name, usage);
    return CLI_USAGE_ERROR;
}
