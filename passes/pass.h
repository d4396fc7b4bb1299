/* pass.h - the passes over an IR module, their table and the driver.
 *
 * Every pass lives in its own file (passes/<name>.c) that opens with its
 * contract: what it requires, what it guarantees, what it may break. The
 * table lists them in pipeline order (docs/design.md §2); the driver runs a list
 * of them, verifies the module after each, and prints it on request:
 *
 *   pass_list list;
 *   if (!pass_parse_list("infer-shapes,canonicalize", &list, &diag)) ...
 *   pass_driver_options o = {.print_after = "all", .print_out = stdout};
 *   if (!pass_run_list(&m, list.items, list.count, &o, &diag)) ...
 *
 * A pass reports bad input through the diag engine and returns false; it
 * never exits.
 */
#ifndef SMELT_PASS_H
#define SMELT_PASS_H

#include "diag.h"
#include "ir.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* A static per-tensor activation scale (W8A8 fp8, act_scale "tensor"): the
 * input of the matmul whose weight is named `weight` is quantized as
 * e4m3(x / scale), or, when `weight` names a stack of MoE experts (its
 * template), the input of that stack's experts, one scale for all of them.
 * From calibration (the input's max |x| / 448, the max over the experts for
 * a stack) or a pre-quantized checkpoint's input_scale. */
typedef struct pass_act_scale {
    const char *weight;
    float scale;
} pass_act_scale;

/* What the lowering passes are told (smelt compile's --precision and
 * --max-step-tokens reach them here). Zero means the default. */
typedef struct pass_options {
    const char *precision; /* precision preset: "f32" (NULL means it), "bf16", "int4-rtn", "int8" or "fp8" */
    const char *activations; /* precision: "f32", "bf16" or "f16" float storage; NULL: the preset's */
    int64_t group_size;      /* precision: int4's columns per scale (32, 64 or 128); 0: 128 */
    const char *keep;        /* precision: comma-separated globs of weights kept unquantized; NULL: none */
    bool act_order;          /* precision, int4-gptq: act-order (each column's group in a group index) */
    const char *act_quant;   /* precision, int8 and fp8: "token" (NULL means it: W8A8, per-token
                                activation scales at run time), "tensor" (fp8: static per-tensor
                                scales, from act_scales) or "none" (weight-only W8A16) */
    const char *kv_cache;    /* precision: KV cache storage, "auto" (NULL means it), "fp8" or the
                                activation dtype (passes/precision_kv_cache.c) */
    int64_t max_tokens;      /* plan-memory: tokens per step buffers are sized for; 0 or more than
                                the token dim's bound: that bound */
    bool no_fuse;            /* fuse: apply no fusion rule, one op per kernel group (--no-fuse) */
    /* precision: the static activation scales by weight name ("tensor"; a
     * checkpoint's input_scale), act_scale_count of them */
    const pass_act_scale *act_scales;
    uint32_t act_scale_count;
} pass_options;

typedef struct pass_info {
    const char *name;    /* as on the command line: "infer-shapes" */
    const char *summary; /* one line for --help */
    bool (*run)(ir_module *m, const pass_options *o, diag_engine *d);
} pass_info;

/* The passes, in pipeline order; *count receives their number. */
const pass_info *pass_table(size_t *count);
/* The pass called `name`, or NULL. */
const pass_info *pass_find(const char *name);
/* The pass names in pipeline order, "infer-shapes, canonicalize", for
 * messages. Returns buffer. */
const char *pass_names(char *buffer, size_t size);

/* A list of passes to run, such as "infer-shapes,canonicalize". */
enum { PASS_LIST_MAX = 64 };
typedef struct pass_list {
    const pass_info *items[PASS_LIST_MAX];
    size_t count;
} pass_list;

/* Parses "a,b,c"; an unknown or empty name is reported with the list of
 * known passes. False on any error. */
bool pass_parse_list(const char *text, pass_list *out, diag_engine *d);
/* Every pass of the pipeline up to and including `name`; "all" is the whole
 * pipeline (for `smelt ir --after NAME|all`). False on an unknown name. */
bool pass_pipeline_until(const char *name, pass_list *out, diag_engine *d);

typedef struct pass_driver_options {
    const char *print_after; /* NULL, "all" or a pass name: print the IR after it */
    FILE *print_out;         /* where printed IR goes; NULL means stdout */
    pass_options pass;       /* handed to every pass */
} pass_driver_options;

/* Verifies the module, then runs the passes in order, verifying after each;
 * stops at the first pass that fails or leaves an invalid module. Prints
 * the IR after the passes that options->print_after names, each dump headed
 * by `# -----// IR Dump After NAME //----- #`. `options` may be NULL. */
bool pass_run_list(ir_module *m, const pass_info *const *passes, size_t count,
                   const pass_driver_options *options, diag_engine *d);

/* The passes (one per file; each file opens with its contract). */
bool pass_infer_shapes(ir_module *m, diag_engine *d);
bool pass_canonicalize(ir_module *m, diag_engine *d);
bool pass_precision(ir_module *m, const pass_options *o, diag_engine *d); /* precision.c */
/* precision's choice of every attention op's KV cache dtype, under `policy`
 * (the activation dtype's name): precision_kv_cache.c. */
bool pass_precision_kv_cache(ir_module *m, const char *kv_cache, const char *policy, diag_engine *d);
/* precision's quantize ops for FP8 W8A8 matmuls (precision_act_codes.c):
 * clear removes those of an earlier run and every act_codes operand; insert
 * adds one quantize per distinct x and coding and sets act_codes. */
void precision_act_codes_clear(ir_module *m);
void precision_act_codes_insert(ir_module *m);
bool pass_fuse(ir_module *m, const pass_options *o, diag_engine *d);        /* fuse.c */
bool pass_wanted_rows(ir_module *m, const pass_options *o, diag_engine *d); /* wanted_rows.c */
bool pass_schedule(ir_module *m, const pass_options *o, diag_engine *d);    /* schedule.c */
bool pass_plan_memory(ir_module *m, const pass_options *o, diag_engine *d); /* plan_memory.c */

#endif
