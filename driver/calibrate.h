/* calibrate.h - calibration: the fp32 reference run over sample token ids,
 * gathering the statistics of every matmul's input that the calibrated
 * quantizers need (quant/calib.h: mean |x|, absmax, XᵀX). Internal to the
 * driver: the compile step that quantizes weights looks a weight's input up
 * here by the weight's name.
 *
 *   drv_calib_options c = {.ids_path = "tests/fixtures/demo/calib_ids.bin", .xtx = true};
 *   drv_calibration cal;
 *   if (!drv_calibrate(&model_options, &c, &cal, &d)) ...    // reported to d
 *   const quant_act_stats *s = drv_calibration_stats(&cal, "model.layers.0.mlp.down_proj.weight");
 *   ...
 *   drv_calibration_free(&cal);
 *
 * The ids run in consecutive windows of `context` ids, each from an empty
 * KV cache (the last window may be shorter); every token of every window is
 * gathered. Weights that multiply the same input value (q/k/v, gate/up)
 * share one record, so XᵀX is gathered once for them. Only matmuls whose
 * weight operand is a weight op are observed, and the experts inside a
 * `moe` op, each over the tokens routed to it.
 *
 * With sample_rows, each record also keeps a uniform sample of up to that
 * many of its input rows (quant_act_stats_keep_sample): the accuracy gate
 * measures W8A8 matmuls on them, activation rounding included. Its memory
 * is sample_rows * cols * 4 bytes a record (DRV_CALIB_SAMPLE_ROWS: 1 KiB a
 * column), no more than the record's XᵀX (cols^2 * 8 bytes, which the gate
 * gathers too) whenever cols >= 128.
 */
#ifndef SMELT_DRIVER_CALIBRATE_H
#define SMELT_DRIVER_CALIBRATE_H

#include "driver.h"

#include "calib.h"
#include "ir.h"

typedef struct drv_calib_options {
    const char *ids_path; /* token ids, read by drv_token_ids_read */
    unsigned context;     /* ids per window; 0: 256 (capped at the model's positions) */
    unsigned max_ids;     /* use only the first max_ids ids; 0: all */
    bool xtx;             /* gather XᵀX (GPTQ; AWQ's error): cols^2 doubles per input */
    unsigned sample_rows; /* keep a sample of up to this many rows of each input; 0: none */
    bool progress;        /* "smelt: calibrate: N of M ids" on stderr when it is a terminal */
} drv_calib_options;

/* The rows kept of each input when the accuracy gate measures W8A8 matmuls
 * (drv_calibrate_for_precision). */
#define DRV_CALIB_SAMPLE_ROWS 256u

typedef struct drv_calib_weight {
    char *name;     /* the weight's external name */
    uint32_t input; /* index into drv_calibration.inputs */
} drv_calib_weight;

/* A stack of a moe's experts (its gate, up or down weight op [E, N, K]):
 * the records of its experts' inputs, E consecutive ones. */
typedef struct drv_calib_stack {
    char *name;           /* the stack weight op's name (a template: "...experts.{e}.w1.weight") */
    uint32_t first_input; /* index into drv_calibration.inputs of expert 0's record */
    uint32_t experts;     /* E */
} drv_calib_stack;

typedef struct drv_calibration {
    quant_act_stats *inputs; /* [input_count]: one per distinct matmul input */
    uint32_t input_count;
    drv_calib_weight *weights; /* [weight_count] */
    uint32_t weight_count;
    drv_calib_stack *stacks; /* [stack_count]: 3 per moe op (gate, up, down) */
    uint32_t stack_count;
    uint64_t ids; /* ids run */
} drv_calibration;

/* Opens `model` (a source with its weights) on the reference backend in
 * f32, whatever its precision says, and runs o's ids through it. *out is
 * zeroed on failure (after reporting). */
bool drv_calibrate(const drv_model_options *model, const drv_calib_options *o, drv_calibration *out,
                   diag_engine *d);

/* The statistics of the input that weight `name` multiplies; NULL when no
 * observed matmul reads that weight. An expert of a moe op's stacked gate,
 * up or down weight has its own, over the tokens routed to it, under
 * drv_expert_name's name. */
const quant_act_stats *drv_calibration_stats(const drv_calibration *c, const char *name);

/* The name of expert e of weight op `op` [E, N, K]: its part's checkpoint
 * name when stacked ("...experts.3.w1.weight"), else "NAME[3]"; in arena a. */
const char *drv_expert_name(const ir_module *m, uint32_t op, uint64_t e, arena *a);

/* For a preset whose quantizers learn from calibration (int4-awq,
 * int4-gptq), or any quantizing preset with the accuracy gate
 * (max_layer_error, accuracy_gate.h): drv_calibrate over
 * model->precision_options.calib_path, with XᵀX and progress (and, for
 * the gate under a W8A8 preset, int8 or fp8 without --act-quant none, a
 * sample of DRV_CALIB_SAMPLE_ROWS rows of every input); refused
 * without --calib or --weights, and the gate for a preset that quantizes
 * nothing. Otherwise *out is zeroed and nothing runs. */
bool drv_calibrate_for_precision(const drv_model_options *model, drv_calibration *out, diag_engine *d);

/* fp8's static activation scales (--act-quant tensor): for every weight c
 * calibrated, max |x| of its input over all the ids and channels / 448 (1
 * for an input that was always zero); and for every stack of experts, under
 * the stack's name, one scale for all its experts (vLLM's FP8 MoE): the
 * max over the experts of their inputs' max |x| / 448 — for gate and up
 * the max |x| of every token that reached the moe, for down that of every
 * (token, chosen expert) hidden row. *out (freed by the caller; its names
 * are c's) is NULL when there are none. False after reporting. */
struct pass_act_scale;
bool drv_calibration_act_scales(const drv_calibration *c, struct pass_act_scale **out, uint32_t *count,
                                diag_engine *d);

/* Harmless on a zeroed drv_calibration. */
void drv_calibration_free(drv_calibration *c);

/* Fills t (format and layout set, data zeroed; quant.h) from the f32
 * weight w[rows][cols] named `name` by t's method, with the statistics
 * calibration gathered for its input (quantize_calibrated.c):
 *   awq     quant_awq with the clip search (mean |x| and XᵀX);
 *   gptq    quant_gptq, act-order when the format has a group_index
 *           (XᵀX; damp 0.01, lazy batches of 128);
 *   smooth  quant_smooth, alpha 0.5 (max |x|).
 * False after reporting, naming the weight: no statistics for it (cal
 * NULL, or no observed matmul reads it), no XᵀX when the method needs it,
 * another method, or the quantizer's refusal. */
bool drv_quantize_calibrated(const char *name, const float *w, const drv_calibration *cal, quant_tensor *t,
                             diag_engine *d);
/* The same with the weight's input statistics s at hand (NULL: none):
 * NULL on success, else why not, for the caller to report. */
const char *drv_quantize_from_stats(const quant_act_stats *s, const float *w, quant_tensor *t);

#endif
