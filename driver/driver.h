/* driver.h - smelt as a library: open a model or a plan and step it, compile
 * a model to a plan, print a model's IR. The `smelt` command parses its
 * arguments and calls this; an HTTP server or a Python binding calls the
 * same functions.
 *
 * ---- A tour --------------------------------------------------------------
 *
 * A model is a plan file from `smelt compile`, recognised by its magic, or a
 * model source (.smelt DSL or .json) bound to a Hugging Face config.json,
 * which is compiled in memory first. Opening one gives a drv_model that
 * steps like an engine, whichever backend runs it:
 *
 *   #include "driver.h"
 *
 *   diag_engine d;
 *   diag_init(&d, stderr);           // every error is reported here
 *   drv_model_options o = drv_model_options_default();
 *   o.model_path = "examples/llama.smelt";
 *   o.source.config_path = "tests/fixtures/llama/config.json";
 *   o.weights_path = "tests/fixtures/llama/model.safetensors";
 *   o.backend = DRV_BACKEND_HOST;    // or REF: the fp32 interpreter of the IR
 *   drv_model *model;
 *   if (!drv_model_open(&o, &model, &d)) ...   // reported to d
 *   const drv_model_info *info = drv_model_get_info(model);
 *   int32_t ids[3] = {1, 2, 3}, pos[3] = {0, 1, 2};
 *   float *logits = malloc(3 * info->vocab * sizeof *logits);
 *   drv_model_step(model, ids, pos, 3, logits, &d);   // logits [3, vocab]
 *   drv_model_reset(model);          // a new sequence
 *   drv_model_close(model);
 *
 * Compiling to a file is one call, drv_compile; `smelt ir` and `smelt opt`
 * are drv_ir_print_model and drv_ir_opt; `smelt inspect` is drv_plan_print.
 *
 * Errors. The driver drives the compiler, so it reports through the
 * compiler's diagnostics engine (diag.h): located where the input has a
 * location, "smelt: error: ..." otherwise; runtime failures arrive there
 * with smelt_last_error()'s text. Every function that can fail returns
 * false; nothing here exits or aborts on bad input.
 *
 * Threads. A drv_model is used by one thread at a time; a diag_engine too.
 */
#ifndef SMELT_DRIVER_H
#define SMELT_DRIVER_H

#include "diag.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* ---- Names of choices ----------------------------------------------------- */

/* Storage of weights and activations in a compiled plan (arithmetic is f32
 * either way): the precision pass's presets (passes/precision.c). bf16:
 * every float value bf16 except what an `output` op consumes; int4-rtn:
 * bf16 with the matmul weights quantized (weight-only); int8 and fp8: W8A8,
 * the matmuls' inputs quantized per token as well (int8 with SmoothQuant's
 * migration, from calibration: --calib), or weight-only with --act-quant none. */
typedef enum drv_precision {
    DRV_PRECISION_F32,
    DRV_PRECISION_BF16,
    DRV_PRECISION_INT4_RTN,
    DRV_PRECISION_INT8,
    DRV_PRECISION_FP8,
    DRV_PRECISION_INT4_AWQ, /* int4 with AWQ's column scales, from calibration (--calib) */
    DRV_PRECISION_INT4_GPTQ /* int4 with GPTQ's error compensation, from calibration (--calib) */
} drv_precision;

/* The precision pass's other options (--act, --group-size, --keep). */
typedef struct drv_precision_options {
    const char *activations; /* "f32", "bf16" or "f16"; NULL: the preset's */
    int64_t group_size;      /* int4: 32, 64 or 128; 0: 128 */
    const char *keep;        /* comma-separated globs of weights kept unquantized; NULL: none */
    const char *calib_path;  /* int4-awq, int4-gptq: token ids to calibrate on (--calib) */
    bool act_order;          /* int4-gptq: columns by descending activation energy (--act-order) */
    const char *act_quant;   /* int8, fp8: "token" (NULL means it: W8A8), fp8: "tensor" (static scales
                                from --calib) or "none" (W8A16; --act-quant) */
    double max_layer_error;  /* > 0: the accuracy gate keeps unquantized each weight whose relative
                                output error on --calib exceeds it (--max-layer-error); 0: none */
} drv_precision_options;

/* Whether the preset's quantizers learn from calibration data (--calib):
 * int4-awq, int4-gptq, int8 W8A8 (SmoothQuant's migration) and fp8 with
 * static activation scales (--act-quant tensor). */
bool drv_precision_needs_calibration(drv_precision p, const drv_precision_options *o);

/* The preset's name, as --precision spells it. */
const char *drv_precision_name(drv_precision p);

/* What steps a model: "auto" (cuda where a GPU is present, else host),
 * "host" (the CPU simulator running the plan's kernels), "cuda", or "ref"
 * (the fp32 reference interpreter; model sources only). */
typedef enum drv_backend {
    DRV_BACKEND_AUTO,
    DRV_BACKEND_HOST,
    DRV_BACKEND_CUDA,
    DRV_BACKEND_REF
} drv_backend;

/* "f32", "bf16", "int4-rtn", "int8", "fp8" -> *out; false (nothing reported) for another name. */
bool drv_precision_from_name(const char *name, drv_precision *out);
/* The KV cache storage (--kv-cache): auto is the activation dtype; bf16,
 * f16 and f32 name it (and must be it); fp8 is E4M3 with a scale per cached
 * row and kv head (passes/precision_kv_cache.c). */
typedef enum drv_kv_cache {
    DRV_KV_CACHE_AUTO,
    DRV_KV_CACHE_BF16,
    DRV_KV_CACHE_F32,
    DRV_KV_CACHE_FP8,
    DRV_KV_CACHE_F16
} drv_kv_cache;
bool drv_kv_cache_from_name(const char *name, drv_kv_cache *out);
/* "auto", "bf16", "f32", "fp8" or "f16": the precision pass's kv_cache option. */
const char *drv_kv_cache_name(drv_kv_cache k);
/* "auto", "host", "cuda", "ref" -> *out; false (nothing reported) otherwise. */
bool drv_backend_from_name(const char *name, drv_backend *out);

/* ---- Model sources ---------------------------------------------------------- */

enum { DRV_MAX_SETTINGS = 64 };

/* How a model source's params are bound: a `--set` value wins, then the
 * config.json key of the same name, then the param's default. Every key of
 * the config must be bound by a param or known not to change the
 * computation; allowed_keys names others to ignore deliberately. Every
 * tensor of a checkpoint must be used by a weight or match one of the
 * model's `ignore` patterns or of allowed_unused_tensors. */
typedef struct drv_source_options {
    const char *config_path; /* Hugging Face config.json or a folder holding one, or NULL */
    struct {
        const char *name;
        const char *value; /* text as written: 2, 1e-5, true, qwen2 */
    } settings[DRV_MAX_SETTINGS];
    uint32_t setting_count;
    const char *allowed_keys[DRV_MAX_SETTINGS]; /* --allow-config-key KEY */
    uint32_t allowed_key_count;
    const char *allowed_unused_tensors[DRV_MAX_SETTINGS]; /* --allow-unused-tensor GLOB */
    uint32_t allowed_unused_tensor_count;
} drv_source_options;

/* Adds a setting (the strings are not copied); false when there are
 * DRV_MAX_SETTINGS already. */
bool drv_source_options_set(drv_source_options *o, const char *name, const char *value);
/* Adds a config key to ignore deliberately / a pattern of checkpoint tensors
 * that may stay unused ('*': any run of characters without a '.'); false
 * when there are DRV_MAX_SETTINGS already. */
bool drv_source_options_allow_key(drv_source_options *o, const char *key);
bool drv_source_options_allow_unused_tensor(drv_source_options *o, const char *pattern);

/* True when `path` is a plan file (starts with the plan magic). False for a
 * source, a missing file and anything else. */
bool drv_is_plan_file(const char *path);

/* ---- Tokenizers --------------------------------------------------------------- */

/* The tokenizer a plan carries (its TOKENIZER section, JSON
 * {"type": "bytes", "bos": N, "eos": N}). "bytes": ids 0..255 are bytes. */
typedef struct drv_tokenizer {
    bool present;     /* a byte tokenizer */
    int32_t bos, eos; /* -1: none */
} drv_tokenizer;

/* Text -> ids: BOS (when the tokenizer has one), then one id per byte.
 * `ids` has room for length + 1; returns how many were written. */
size_t drv_tokenizer_encode(const drv_tokenizer *t, const char *text, size_t length, int32_t *ids);

/* The byte token `id` stands for, or -1 when it is no byte. */
int drv_tokenizer_byte(const drv_tokenizer *t, int32_t id);

/* ---- Files of token ids --------------------------------------------------------- */

/* The ids in `path`, as `smelt eval --ids` and `--calib` read them. The name
 * decides the format: FILE.bin holds little-endian uint16 ids (as
 * tests/fixtures/demo/heldout_ids.bin); any other FILE holds decimal ids as
 * text, separated by commas, spaces or newlines, and nothing else. Returns
 * the ids (free them) and their number in *count; NULL after reporting. */
int32_t *drv_token_ids_read(const char *path, size_t *count, diag_engine *d);

/* ---- Where generation stops ------------------------------------------------------ */

enum { DRV_MAX_EOS = 16 };

/* The model's end-of-sequence ids: generation_config.json's eos_token_id
 * (beside config.json) when it has one, else config.json's; one id or a
 * list. A plan keeps them (smelt_plan_info.eos_tokens). */
typedef struct drv_eos {
    int32_t ids[DRV_MAX_EOS];
    uint32_t count; /* 0: the model declares none */
} drv_eos;

/* ---- Models you can step -------------------------------------------------------- */

typedef struct drv_model_options {
    const char *model_path;   /* a plan, or a .smelt/.json source */
    const char *weights_path; /* .safetensors, index.json or folder (whose config.json binds the
                                 params when source.config_path is NULL); NULL: the plan holds them */
    drv_backend backend;
    drv_precision precision; /* when compiling a source */
    drv_precision_options precision_options;
    drv_kv_cache kv_cache; /* when compiling a source (and for the ref backend): --kv-cache */
    bool no_fuse;          /* when compiling a source: one op per kernel (--no-fuse) */
    bool byte_tokenizer;   /* when compiling a source: ids 0..255 are bytes (BOS/EOS from config.json) */
    bool random_weights;   /* bind every weight of the plan to noise (for timing) */
    unsigned random_seed;
    const char *expected_hash; /* a plan's content hash to require (smelt_engine_options); NULL: any */
    int gemv_max_tokens;       /* smelt_engine_options.gemv_max_tokens: 0, the device decides */
    drv_source_options source; /* when compiling a source */
} drv_model_options;

/* Backend auto, precision f32, nothing else set. */
static inline drv_model_options drv_model_options_default(void) {
    drv_model_options o = {0};
    o.backend = DRV_BACKEND_AUTO;
    o.precision = DRV_PRECISION_F32;
    return o;
}

typedef struct drv_model_info {
    const char *name;         /* "ref", or the engine's device name */
    uint64_t vocab;           /* logits per token */
    uint64_t max_step_tokens; /* tokens per step at most; 0: no bound */
    uint64_t max_positions;   /* positions of one sequence at most; 0: no bound */
    drv_tokenizer tokenizer;
    drv_eos eos; /* where generation stops */
} drv_model_info;

typedef struct drv_model drv_model;

/* Opens o->model_path: a plan on the engine of o->backend (binding
 * o->weights_path's tensors, or random weights, when asked); a source is
 * compiled to a temporary plan first (weights inside), or interpreted by
 * the reference backend. *out is NULL on failure. */
bool drv_model_open(const drv_model_options *o, drv_model **out, diag_engine *d);

const drv_model_info *drv_model_get_info(const drv_model *m);

/* Which rows of a step's logits drv_model_step writes: every token's
 * (scoring), or the last one's (generation: an engine runs its output head
 * on that row alone, smelt_engine_forward). */
typedef enum drv_rows { DRV_ROWS_ALL, DRV_ROWS_LAST } drv_rows;

/* One step: n tokens (1 <= n <= max_step_tokens when bounded) with their ids
 * and positions; writes logits [n, vocab] row-major, or with DRV_ROWS_LAST
 * the last token's [vocab]. */
bool drv_model_step(drv_model *m, const int32_t *ids, const int32_t *pos, uint32_t n, drv_rows rows,
                    float *logits, diag_engine *d);
/* One step for greedy decoding: *token is the argmax (the first largest,
 * NaN never wins) of the last token's logits. On an engine the device picks
 * it and only the id crosses to the host (smelt_engine_forward_greedy); the
 * reference computes the logits and picks it here. */
bool drv_model_step_greedy(drv_model *m, const int32_t *ids, const int32_t *pos, uint32_t n, int32_t *token,
                           diag_engine *d);

/* Forgets the sequence: empty KV caches, position 0. */
void drv_model_reset(drv_model *m);

/* NULL is harmless. */
void drv_model_close(drv_model *m);

/* ---- Compiling to a plan file ----------------------------------------------------- */

enum { DRV_MAX_ARCHS = 8 };

typedef void (*drv_progress_fn)(size_t done, size_t total, void *user);

typedef struct drv_compile_options {
    drv_precision precision;
    drv_kv_cache kv_cache;
    drv_precision_options precision_options;
    int archs[DRV_MAX_ARCHS]; /* CUDA targets: 80 = sm_80 */
    uint32_t arch_count;
    bool host;                /* build the host simulator's object */
    int64_t max_step_tokens;  /* tokens per step the arena is sized for; 0: the model's bound */
    bool no_fuse;             /* one op per kernel: the fuse pass applies no rule */
    unsigned jobs;            /* compile threads; 0: every core */
    bool no_cache;            /* do not use the kernel cache */
    const char *weights_path; /* NULL: weights are bound at run time */
    bool byte_tokenizer;      /* store a byte tokenizer (BOS/EOS from config.json) */
    const char *print_after;  /* NULL, a pass name or "all": IR after those passes to stderr */
    drv_progress_fn progress; /* NULL: quiet */
    void *progress_user;
} drv_compile_options;

typedef struct drv_compile_report {
    uint32_t kernel_count;      /* distinct kernels */
    uint32_t launches_per_step; /* kernel launches + GEMMs in a decode step (T = 1) */
    uint32_t compile_jobs;      /* (kernel, arch) pairs */
    uint32_t cache_hits;
    uint64_t arena_bytes;
    uint64_t weight_bytes;
    uint64_t file_size;
    char content_hash[33];
    double seconds;
} drv_compile_report;

/* The model source through the frontend and every pass, then into a plan
 * at plan_path (written atomically). */
bool drv_compile(const char *model_path, const drv_source_options *source, const drv_compile_options *o,
                 const char *plan_path, drv_compile_report *report, diag_engine *d);

/* ---- IR and plans for people ------------------------------------------------------ */

typedef enum drv_ir_format { DRV_IR_TEXT, DRV_IR_JSON, DRV_IR_DOT } drv_ir_format;

/* `smelt ir`: the model source through the passes up to and including
 * `after` ("all": every pass), printing the IR after the passes named by
 * print_after (NULL, a name or "all") to stderr, then the result to
 * output_path (NULL or "-": stdout; the file is written only on success). */
/* What the lowering passes are told: --precision's policy, the tokens per
 * step buffers are sized for (0: the model's bound) and --no-fuse. */
typedef struct drv_lowering {
    drv_precision precision;
    drv_kv_cache kv_cache; /* --kv-cache */
    drv_precision_options precision_options;
    int64_t max_step_tokens;
    bool no_fuse; /* --no-fuse: one op per kernel (the fuse pass applies no rule) */
    /* The checkpoint: when the config says it is pre-quantized (AWQ, GPTQ,
     * FP8), its quantized weights keep their format (drv_import_checkpoint_formats). */
    const char *weights_path;
    /* Static activation scales by weight name (fp8 --act-quant tensor: the
     * calibration's max |x| / 448), owned by the caller; NULL: none. */
    const struct pass_act_scale *act_scales;
    uint32_t act_scale_count;
} drv_lowering;

bool drv_ir_print_model(const char *model_path, const drv_source_options *source, const char *after,
                        const drv_lowering *lowering, const char *print_after, drv_ir_format format,
                        const char *output_path, diag_engine *d);

/* `smelt opt`: text IR (named `path` in diagnostics) parsed, the
 * comma-separated `passes` run (NULL: none; the module is still verified),
 * printing as above, the result to out. */
bool drv_ir_opt(const char *path, const char *text, size_t length, const char *passes,
                const drv_lowering *lowering, const char *print_after, drv_ir_format format, FILE *out,
                diag_engine *d);

/* Every pass with its one-line summary, one a line. */
void drv_print_pass_table(FILE *out);

/* What `smelt inspect` prints besides the plan itself: its performance
 * model (driver/inspect.c) for the step kinds given. */
typedef struct drv_inspect_options {
    bool kernel_source;              /* every kernel's CUDA C source as well */
    bool json;                       /* the performance model alone, as JSON */
    uint32_t prefill_count;          /* prefills of prefill_tokens[i] tokens; none: one of 512 */
    const unsigned *prefill_tokens;  /*   (or the plan's token bound, when lower) */
    uint32_t decode_count;           /* decode steps at context decode_contexts[i]; none: one at */
    const unsigned *decode_contexts; /*   1024 (or the longest the plan's KV caches allow) */
} drv_inspect_options;

/* `smelt inspect`: everything a plan holds, readable, then its performance
 * model, to out; or (o->json) the model alone as JSON. o may be NULL (the
 * defaults). A step the plan cannot run (more tokens than its bound, a
 * context beyond its KV caches) is an error. */
bool drv_plan_print(const char *plan_path, const drv_inspect_options *o, FILE *out, diag_engine *d);

#endif
