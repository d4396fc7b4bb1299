/* accuracy_gate.h - the accuracy gate (--max-layer-error E): after the
 * precision pass has chosen each weight's format, every weight it
 * quantizes is quantized from the checkpoint (by its method, with the
 * calibration statistics of its input) and its output error is measured on
 * the calibration inputs against the checkpoint's own values. A weight-only
 * matmul (int4, W8A16) computes X Ŵ^T, so its error is
 *
 *   error = ||X W^T - X Ŵ^T||_F / ||X W^T||_F      (quant_relative_output_error)
 *
 * over every calibration token, through the XᵀX that calibration gathered
 * (quant/calib.h), so X itself is never kept. A W8A8 matmul (its act_quant
 * i8 or f8e4m3, ops.def) computes Q(X) Ŵ^T, its activations quantized too,
 * which XᵀX cannot see; its error is
 *
 *   error = ||X W^T - Q(X) Ŵ^T||_F / ||X W^T||_F    (drv_gate_w8a8_error)
 *
 * on the sample of input rows calibration kept (DRV_CALIB_SAMPLE_ROWS of
 * them, uniform over the tokens; calibrate.h), Q the matmul's own coding:
 * per token or with its static per-tensor scale, each row times the
 * weight's SmoothQuant column scales under int8, by the reference
 * interpreter's functions (ref_w8a8_row_codes), and the product its
 * s_t * s_w[n] * sum_k xcode[k] * wcode[n, k] in double. The XᵀX number is
 * kept beside it (weight_error: the weights' part). Each row of the table
 * says which it used. A weight whose error exceeds E is kept unquantized: its name
 * joins the --keep globs the precision pass is run with for the module that
 * is compiled (or interpreted), so the IR after `precision` shows it in the
 * activation dtype like any kept weight. Internal to the driver:
 *
 *   drv_gate gate;
 *   if (!drv_gate_run(model, &source, &lowering, &calibration, &gate, &d)) ...   // reported
 *   lowering.precision_options.keep = gate.keep;     // the compiled module's precision
 *   weights.gate = &gate;                            // its quantized bytes, reused
 *   char *json = drv_gate_json(&gate);               // the plan manifest's "accuracy_gate"
 *   drv_gate_free(&gate);
 *
 * The table (each weight: its decoder layer, name, method, error and the
 * decision; then each decoder layer: its weights, worst error, how many
 * kept) prints from that JSON, on stderr while compiling and in `smelt
 * inspect`, by one function. A weight's decoder layer is the first number
 * among the dot-separated parts of its name (model.layers.3.mlp.up_proj.weight:
 * 3); a weight without one (lm_head) is in none.
 *
 * A stack of MoE experts [E, N, K] is one entry, measured as a whole:
 * each expert quantized on its own statistics and measured through the XᵀX
 * of the tokens routed to it, the stack's error
 *
 *   sqrt(sum_e ||X_e W_e^T - X_e Ŵ_e^T||_F^2 / sum_e ||X_e W_e^T||_F^2)
 *
 * over every (token, chosen expert) pair (an expert no token reached adds
 * nothing); a stack over E stays unquantized as a whole (its name template
 * joins the --keep globs), and a moe's gate and up stacks are kept
 * together (one kernel reads both, in one format). Under W8A8 experts
 * (the moe's gate_up_act_quant, down_act_quant) the same sum runs over each
 * expert's sample of its (token, chosen expert) rows with the activations
 * quantized, each expert's part weighted by its tokens over its sample's
 * rows, so the stack's error is the W8A8 one like a matmul's.
 *
 * Weights imported pre-quantized (method "checkpoint") have no unquantized
 * values to compare with and are not gated; nor is a quantized weight that
 * no matmul reads (the int8 token-embedding table of the int4 presets,
 * which an embedding gathers: it stays int8 whatever E, and only --keep
 * keeps it bf16). A table tied to the lm_head is gated as the lm_head: its
 * error is the head's output error, and over E it stays bf16 for both.
 */
#ifndef SMELT_DRIVER_ACCURACY_GATE_H
#define SMELT_DRIVER_ACCURACY_GATE_H

#include "calibrate.h"
#include "driver_internal.h"

#include <jansson.h>

/* How a weight's error was measured. */
typedef enum drv_gate_formula {
    DRV_GATE_XTX,  /* ||X W^T - X Ŵ^T|| / ||X W^T|| over every token, through XᵀX */
    DRV_GATE_W8A8, /* ||X W^T - Q(X) Ŵ^T|| / ||X W^T|| on the sampled input rows */
} drv_gate_formula;

typedef struct drv_gate_weight {
    char *name;               /* the weight's external name */
    int64_t layer;            /* its decoder layer; -1: none */
    quant_format format;      /* what precision chose for it */
    double error;             /* relative output error on the calibration inputs: what is compared */
    drv_gate_formula formula; /* how error was measured */
    double weight_error;      /* the XᵀX formula's number (error itself under DRV_GATE_XTX) */
    uint64_t sample_rows;     /* DRV_GATE_W8A8: the input rows measured (a stack: all its experts') */
    bool kept;                /* error > the limit: stored unquantized */
    quant_tensor tensor;      /* the quantized weight (data NULL when kept), for the plan writer */
} drv_gate_weight;

typedef struct drv_gate {
    double max_error;         /* E */
    uint64_t calibration_ids; /* the ids the statistics came from */
    drv_gate_weight *weights; /* [weight_count], in the module's order */
    uint32_t weight_count;
    char *keep; /* the --keep patterns, then each kept weight's name */
} drv_gate;

/* Lowers the model source through `precision` with l, quantizes each
 * weight precision quantizes from the checkpoint at l->weights_path with
 * the statistics of cal (which must hold XᵀX), measures each and decides.
 * *out is zeroed on failure (after reporting). */
bool drv_gate_run(const char *model_path, const drv_source_options *source, const drv_lowering *l,
                  const drv_calibration *cal, drv_gate *out, diag_engine *d);

/* The W8A8 output error of quantized weight t (int8 or fp8, one scale per
 * output channel) against w[N][K] on input rows x[count][K]: adds
 * ||X W^T - Q(X) Ŵ^T||_F^2 to *error and ||X W^T||_F^2 to *output, Q(X)
 * Ŵ^T as a matmul with act_quant `act` (t's kind) computes it, per token
 * when static_scale is 0, else with that per-tensor scale (ops.def). False
 * when memory runs out. */
bool drv_gate_w8a8_error(const float *w, const quant_tensor *t, quant_kind act, float static_scale,
                         const float *x, uint64_t count, double *error, double *output);

/* The gate's quantized weight `name` when it was measured in format f and
 * not kept; NULL otherwise. */
const quant_tensor *drv_gate_quantized(const drv_gate *g, const char *name, const quant_format *f);

/* The gate as the plan manifest's "accuracy_gate" object: {"max_layer_error",
 * "calibration_ids", "error" (the XᵀX formula, in words), "w8a8_error" (the
 * W8A8 one), "weights": [{"name", "layer" (null: none), "quant", "method",
 * "group", "error", "formula" ("xtx" or "w8a8"), "weight_error",
 * "sample_rows" (w8a8 only), "kept"}], "layers": [{"layer", "weights",
 * "max_error", "worst", "kept"}]}. NULL when out of memory. A plan written
 * before the W8A8 formula lacks "formula", "weight_error", "sample_rows"
 * and "w8a8_error": its rows are read as "xtx". */
json_t *drv_gate_to_json(const drv_gate *g);

/* The table of such an object, for people. False when it is not one (a
 * plan's manifest is untrusted: a malformed object is refused, not printed). */
bool drv_gate_print_table(const json_t *gate, FILE *out);

/* drv_gate_print_table of drv_gate_to_json(g) (nothing when out of memory). */
void drv_gate_print(const drv_gate *g, FILE *out);

/* Harmless on a zeroed drv_gate. */
void drv_gate_free(drv_gate *g);

#endif
