/* driver_internal.h - what the files of driver/ share and the public header
 * keeps out of sight: the IR module between frontend and codegen, a
 * checkpoint bound to a module's weights, the plan's tables. */
#ifndef SMELT_DRIVER_INTERNAL_H
#define SMELT_DRIVER_INTERNAL_H

#include "driver.h"

#include "checkpoint.h"
#include "ir.h"
#include "program.h"
#include "quant.h"
#include "smelt.h"
#include "weights.h"

/* ---- pipeline.c: frontend and passes ---- */

/* The model source through the frontend alone (.json -> JSON, else DSL).
 * *m is initialised whatever the result: free it with ir_module_free. */
bool drv_source_parse(const char *path, const drv_source_options *o, ir_module *m, diag_engine *d);

/* A parsed module's pre-quantized checkpoint formats imported (the
 * checkpoint's input_scales after l's static activation scales), then the
 * passes `passes` ("all", or a list) with `l`. */
bool drv_source_passes(const char *config_path, const drv_lowering *l, const char *passes,
                       const char *print_after, ir_module *m, diag_engine *d);

/* The model source through the frontend and every pass, lowered with `l`:
 * what compiling and running a source start from. *m is initialised
 * whatever the result. */
bool drv_source_load(const char *path, const drv_source_options *o, const drv_lowering *l,
                     const char *print_after, ir_module *m, diag_engine *d);
/* The source options of a model whose weights are at weights_path: as
 * given, except that a GGUF checkpoint is also the config when no config is
 * given (its metadata holds the hyperparameters). */
drv_source_options drv_source_options_for_weights(const drv_source_options *o, const char *weights_path);
/* Runs the passes of the pipeline up to and including `after` ("all": every
 * pass), or (after NULL) the comma-separated `names` (NULL: none), printing
 * the IR after the passes named by print_after to stderr. The one place the
 * driver calls the pass driver. */
bool drv_run_passes(ir_module *m, const char *after, const char *names, const drv_lowering *l,
                    const char *print_after, diag_engine *d);

/* ---- source_weights.c: a checkpoint bound to a module's weights ---- */

typedef struct drv_source_weights {
    st_checkpoint checkpoint;
    fe_weight_binding binding;
    const ir_module *module;                   /* the weights' module (their quantization formats) */
    const struct drv_calibration *calibration; /* AWQ's and GPTQ's statistics; NULL: none */
    const struct drv_gate *gate;               /* the accuracy gate's quantized weights, reused; NULL: none */
} drv_source_weights;
bool drv_source_weights_open(drv_source_weights *w, const char *path, const char *config_path,
                             const ir_module *m, diag_engine *d);
/* A ref_weight_reader / cg_weight_reader over a drv_source_weights. */
bool drv_source_weights_read(void *context, uint32_t op, float *dst, uint64_t count);
/* Harmless on a zeroed drv_source_weights. */
void drv_source_weights_close(drv_source_weights *w);
/* A cg_packed_weight_reader / ref_packed_weight_reader: quantized weight op
 * `op` read as f32 and quantized into its format (drv_quantize_weight);
 * false unless its packed layout is `bytes` bytes. */
bool drv_source_weights_read_packed(void *context, uint32_t op, uint8_t *dst, uint64_t bytes);

/* ---- quant_import.c: pre-quantized checkpoints ---- */

/* Before the passes: every weight op whose Linear the checkpoint at
 * weights_path holds pre-quantized (config_path's quantization_config:
 * AWQ, GPTQ, FP8) takes the checkpoint's format, method "checkpoint", and
 * its codes' dtype; the precision pass keeps it under every preset and
 * drv_source_weights_read_packed copies the checkpoint's bytes. Nothing to
 * do without a quantization_config or a weights path. An FP8 checkpoint
 * with static activations (input_scale tensors) adds, per weight, the static
 * scale its matmul's W8A8 input is quantized by, after any in *scales (a
 * malloc'd array of *count that the caller frees; the names are m's): the
 * input_scale times the per-tensor weight scale (the weight's column scale,
 * which the W8A8 kernel applies to x before quantizing: ir/ops.def). */
struct pass_act_scale;
bool drv_import_checkpoint_formats(ir_module *m, const char *config_path, const char *weights_path,
                                   struct pass_act_scale **scales, uint32_t *count, diag_engine *d);
/* Weight op `op` of format f (method "checkpoint") as the checkpoint packs
 * it: `bytes` bytes into dst, the format checked against f. */
bool drv_read_checkpoint_packed(const drv_source_weights *w, uint32_t op, const quant_format *f, uint8_t *dst,
                                uint64_t bytes);

/* ---- quantize.c: the one place a quantizer is chosen ---- */

/* Calibration statistics of one weight's input (per-channel absmax and mean
 * |x|, XᵀX), which AWQ, GPTQ and SmoothQuant take (quant/calib.h). */
typedef struct quant_act_stats drv_weight_stats;
/* w[rows][cols] (row-major f32, a Hugging Face Linear's [out, in]) into
 * *out in format f (quant/quant.h's packed layout; out->data malloc'd, the
 * caller frees it), by f->method: rtn is quant_rtn; awq, gptq and smooth
 * need `stats` (NULL: none). Reports at no location, naming the weight. */
bool drv_quantize_weight(const char *name, const float *w, uint64_t rows, uint64_t cols,
                         const quant_format *f, const drv_weight_stats *stats, quant_tensor *out,
                         diag_engine *d);

/* ---- model.c: what calibration (calibrate.c) reaches inside a model ---- */

/* The reference interpreter of a model opened on the ref backend; NULL on
 * any other backend. */
struct ref_model *drv_model_ref(drv_model *m);
/* The module of a model opened from a source (empty for a plan). */
const ir_module *drv_model_module(const drv_model *m);

/* ---- plan_compile.c: the one call into codegen ---- */

/* What a plan holds besides its kernels. */
typedef struct drv_plan_contents {
    drv_source_weights *weights; /* NULL: weights bound at run time */
    const char *tokenizer_json;  /* NULL, or the TOKENIZER section */
    const drv_eos *eos;          /* NULL, or the model's EOS ids */
    const struct drv_gate *gate; /* NULL, or the accuracy gate, kept in the manifest */
} drv_plan_contents;

/* Writes the plan of the inferred module m to `path`. */
bool drv_write_plan(const ir_module *m, const drv_compile_options *o, const drv_plan_contents *contents,
                    const char *path, drv_compile_report *report, diag_engine *d);

/* ---- tokenizer.c ---- */

/* The vocabulary of m: the last dim of its logits, or 0 when unknown. */
uint64_t drv_module_vocab(const ir_module *m);

/* The TOKENIZER section of a byte tokenizer, {"type": "bytes", "bos": N,
 * "eos": N}, with config.json's bos_token_id and eos_token_id (-1 when
 * absent) into *out (malloc'd). False after an error when an id lies outside
 * the vocabulary of m (the last dim of its logits) or memory runs out. */
bool drv_tokenizer_json(const char *config_path, const ir_module *m, char **out, diag_engine *d);
/* False after an error naming `what` when the byte tokenizer t (with the
 * model's EOS ids, when given) does not cover a vocabulary of `vocab` ids. */
bool drv_tokenizer_fits(const drv_tokenizer *t, const drv_eos *eos, uint64_t vocab, const char *what,
                        diag_engine *d);
/* The section's JSON read into *out; a kind this smelt does not know is a
 * warning and leaves out->present false. */
void drv_tokenizer_parse(const char *json, size_t length, drv_tokenizer *out, diag_engine *d);

/* ---- model_folder.c: config.json, generation_config.json, a model's folder ---- */

/* The config.json to bind: config_path when it is a file, config_path's
 * config.json when it is a folder (an error when it has none), else the
 * config.json of a weights_path folder when there is one, else none. *out
 * is malloc'd (NULL: no config); false after an error. */
bool drv_find_config(const char *config_path, const char *weights_path, char **out, diag_engine *d);
/* *o with its config_path found by drv_find_config (kept in *config_storage,
 * which the caller frees). */
bool drv_source_with_folder(const drv_source_options *o, const char *weights_path, drv_source_options *out,
                            char **config_storage, diag_engine *d);
/* The EOS ids of the model whose config.json is config_path (NULL: none),
 * each checked to lie in [0, vocab) (vocab 0: unchecked). */
bool drv_eos_tokens(const char *config_path, uint64_t vocab, drv_eos *out, diag_engine *d);

/* ---- plan_tables.c ---- */

/* The checkpoint tensors a plan's model leaves unused knowingly: the
 * manifest's "ignored_tensors" (its `ignore` patterns). */
typedef struct drv_ignored_tensors {
    char **patterns;
    uint32_t count;
} drv_ignored_tensors;
void drv_ignored_tensors_free(drv_ignored_tensors *t);

/* Reads the plan's launch program (its weight table, which random weights
 * need), its TOKENIZER section into *tokenizer, if it has one, and (unless
 * ignored is NULL) the manifest's ignored tensors; a byte tokenizer that
 * does not cover the plan's vocabulary is an error. */
bool drv_plan_tables_read(const char *plan_path, program *p, drv_tokenizer *tokenizer,
                          drv_ignored_tensors *ignored, diag_engine *d);

/* ---- checkpoint_bind.c: weights into an engine ---- */

/* Binds every tensor of the checkpoint at weights_path that the plan names,
 * converted to f32 first whatever its float dtype. Every error names the
 * checkpoint: an integer tensor the plan names, a binding the engine
 * refuses, (unless p is NULL) each weight the plan holds no data for that
 * the checkpoint lacks, and (unless ignored is NULL) the tensors the plan
 * does not name that match neither the model's ignored patterns nor
 * `allowed` (--allow-unused-tensor). */
bool drv_bind_checkpoint(const smelt_plan *plan, const program *p, smelt_engine *engine,
                         const char *weights_path, const drv_ignored_tensors *ignored,
                         const drv_source_options *allowed, diag_engine *d);
/* Binds every weight of the program to uniform noise in [-0.05, 0.05). */
bool drv_bind_random_weights(smelt_engine *engine, const program *p, unsigned seed, diag_engine *d);

/* The config object at `path` (a JSON file, or a GGUF file's metadata as
 * the config it stands for), owned by the caller; NULL (reported) when it
 * cannot be read. */
struct json_t *drv_config_object(const char *path, diag_engine *d);

#endif
