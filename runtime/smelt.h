/* smelt.h - the smelt runtime: run a compiled plan on a GPU or on the CPU.
 *
 * This header is the whole public API of libsmelt_runtime. It is plain C11,
 * needs nothing but the C library, and knows nothing about the compiler.
 *
 * ---- A tour --------------------------------------------------------------
 *
 * `smelt compile` turns a model into a plan file: generated CUDA kernels
 * (machine code for each GPU architecture, PTX, and a host shared object that
 * runs the very same kernel source on the CPU), the launch program, the memory
 * plan and, usually, the converted weights. Running it takes four calls:
 *
 *   #include "smelt.h"
 *
 *   smelt_plan *plan;
 *   if (smelt_plan_open("model.plan", &plan) != SMELT_OK) {
 *       fprintf(stderr, "%s\n", smelt_last_error());
 *       return 1;
 *   }
 *   smelt_engine *engine;
 *   if (smelt_engine_create(plan, NULL, &engine) != SMELT_OK) ...  // NULL: device "auto"
 *   smelt_plan_close(plan);           // the engine keeps what it needs
 *
 *   int32_t prompt[] = {256, 73, 110};
 *   int32_t out[64];
 *   smelt_request req = smelt_request_default();
 *   req.prompt = prompt;
 *   req.prompt_length = 3;
 *   req.max_tokens = 64;              // new tokens at most; the model's EOS stops it sooner
 *   req.output = out;                 // optional; or a token callback:
 *   req.output_capacity = 64;
 *   smelt_generation result;
 *   if (smelt_engine_generate(engine, &req, &result) != SMELT_OK) ...
 *   // out[0 .. result.token_count) holds the new tokens
 *   smelt_engine_destroy(engine);
 *
 * Devices. "cuda" runs the plan's cubins (or JIT-compiles its PTX) through the
 * CUDA driver, with cuBLASLt for matrix products and a CUDA graph replayed for
 * every decode step. The driver and cuBLASLt are opened with dlopen when an
 * engine is created, so a program linked with smelt runs on machines without
 * a GPU or driver: there "cuda" fails with SMELT_ERROR_NO_DEVICE and "auto"
 * (the default) picks "host". "host" runs the plan's host kernels on the CPU
 * in a simulator of CUDA's thread model (one fiber per CUDA thread) and
 * matrix products with OpenBLAS: slow, but the same kernel text as the GPU
 * runs, which is what makes it a debugger.
 *
 * Sequences. An engine holds one sequence: its KV caches and the number of
 * tokens it has seen (its position). smelt_engine_generate feeds the prompt
 * at the current position and continues from there, so two calls make a
 * conversation; smelt_engine_reset starts a new sequence. The last token
 * generated is reported but not fed to the model: pass it at the start of the
 * next prompt to continue from it. smelt_engine_forward is the low-level
 * step under generate: it runs tokens at positions of your choosing and
 * returns the logits of every one, or of the last alone — then the output
 * head (the lm_head and what feeds only it) runs on that row alone, which is
 * what generation wants: a 512-token prompt computes one row of logits, not
 * 512.
 *
 * Weights. A plan usually holds its weights; on the host they are used in
 * place from the mapped file. A plan compiled without weights needs each one
 * bound by name before the first step (smelt_engine_bind_weight), from f32,
 * bf16 or f16 data, converted to the plan's storage dtype.
 *
 * Errors. Every function that can fail returns a smelt_status; the message
 * for the calling thread's last failure is smelt_last_error(). Nothing in
 * this library exits or aborts on bad input.
 *
 * Threads. One engine is used by one thread at a time; distinct engines may
 * run at once on distinct threads. Plans are reference counted and may be
 * shared.
 */
#ifndef SMELT_H
#define SMELT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "smelt_dtype.h"

#ifdef __cplusplus
extern "C" {
#endif

/* ---- Status and errors --------------------------------------------------- */

typedef enum smelt_status {
    SMELT_OK = 0,
    SMELT_ERROR_INVALID_ARGUMENT, /* a NULL handle, a bad size, an id or position out of range */
    SMELT_ERROR_IO,               /* a file could not be read */
    SMELT_ERROR_BAD_PLAN,         /* the plan is damaged, from another version, or inconsistent */
    SMELT_ERROR_NO_DEVICE,        /* the device asked for is not here (no CUDA driver or GPU) */
    SMELT_ERROR_UNSUPPORTED,      /* the plan needs something this device cannot do */
    SMELT_ERROR_OUT_OF_MEMORY,    /* host or device memory */
    SMELT_ERROR_DEVICE,           /* a device call failed (a kernel, the driver, BLAS) */
    SMELT_ERROR_MISSING_WEIGHT,   /* a weight the plan does not hold was never bound */
    SMELT_ERROR_CAPACITY,         /* a caller's buffer is too small */
} smelt_status;

/* "SMELT_ERROR_BAD_PLAN"; "SMELT_UNKNOWN_STATUS" for a value not above. */
const char *smelt_status_name(smelt_status status);

/* The message of the calling thread's last failure ("" before any). It says
 * what went wrong and, where it can, what to do. Valid until the thread's
 * next smelt call. */
const char *smelt_last_error(void);

/* ---- Plans ----------------------------------------------------------------- */

typedef struct smelt_plan smelt_plan;

/* Maps and checks a plan file (every section checksum, every count and offset
 * of the launch program). A plan from another format version is refused with
 * a message that says to rebuild it. */
smelt_status smelt_plan_open(const char *path, smelt_plan **out);

/* The same from bytes in memory; `bytes` must outlive the plan and every
 * engine made from it. */
smelt_status smelt_plan_open_memory(const void *bytes, size_t size, smelt_plan **out);

/* Drops the caller's reference; the plan is freed once its last engine is
 * destroyed too. NULL is harmless. */
void smelt_plan_close(smelt_plan *plan);

enum { SMELT_MAX_EOS_TOKENS = 16 };

typedef struct smelt_plan_info {
    uint64_t vocab;        /* logits per token */
    int64_t max_tokens;    /* tokens per step at most (longer prompts run in chunks) */
    int64_t max_positions; /* sequence length bound; 0 when the plan sets none */
    uint32_t kernel_count;
    uint32_t weight_count;
    uint32_t unbound_weight_count; /* weights the plan does not hold */
    bool has_host_kernels;         /* runs on "host" */
    bool has_cuda_kernels;         /* holds cubins or PTX */
    char content_hash[33];         /* hex, as `smelt inspect` prints it */
    /* The model's end-of-sequence ids (eos_token_id of its config.json, or of
     * generation_config.json beside it): smelt_engine_generate stops at them. */
    uint32_t eos_token_count;
    int32_t eos_tokens[SMELT_MAX_EOS_TOKENS];
} smelt_plan_info;

smelt_status smelt_plan_get_info(const smelt_plan *plan, smelt_plan_info *out);

/* True when the plan's weight table has a weight that `name` binds (its
 * Hugging Face name, or one part of a stacked weight such as an expert's
 * "model.layers.0.mlp.experts.3.w1.weight", or one part of a weight
 * concatenated at compile time such as "model.layers.0.self_attn.k_proj.weight"
 * of the layer's Q/K/V weight): exactly the names
 * smelt_engine_bind_weight does not refuse as unknown. A loader binding a
 * whole checkpoint asks this to skip the tensors the model does not use.
 * False for a NULL plan or name. */
bool smelt_plan_has_weight(const smelt_plan *plan, const char *name);

/* ---- Engines --------------------------------------------------------------- */

typedef struct smelt_engine smelt_engine;

typedef struct smelt_engine_options {
    const char *device;    /* "auto" (NULL too), "host" or "cuda" */
    int cuda_device;       /* ordinal for "cuda" and "auto" */
    unsigned host_threads; /* simulator workers on "host"; 0: one per core */
    bool cuda_graphs;      /* replay a captured CUDA graph for decode steps (default true) */
    /* The plan's content hash as `smelt inspect` prints it (32 hex digits,
     * any case). When set, a plan whose hash differs is refused
     * (SMELT_ERROR_BAD_PLAN) before any of its code is loaded: a plan
     * carries machine code, so pin the plans you trust. NULL or "": any. */
    const char *expected_content_hash;
    /* Steps of up to this many tokens run a fused GEMV group as its one
     * kernel where the plan has both it and the group's ops one by one
     * (GEMMs) for that step; 0: the device decides (on a GPU the cheaper by
     * the plan's model at the GPU's bandwidth and peaks, on the host the
     * GEMV only in the steps it alone serves). For tests and tuning. */
    int gemv_max_tokens;
} smelt_engine_options;

static inline smelt_engine_options smelt_engine_options_default(void) {
    smelt_engine_options o = {"auto", 0, 0, true, NULL, 0};
    return o;
}

/* Creates an engine for `plan` on a device: allocates the activation arena
 * and the state buffers, loads the kernels and binds the weights the plan
 * holds. options NULL: smelt_engine_options_default(). */
smelt_status smelt_engine_create(smelt_plan *plan, const smelt_engine_options *options, smelt_engine **out);

void smelt_engine_destroy(smelt_engine *engine);

/* "host" or "cuda" (with the GPU's name where known). */
const char *smelt_engine_device_name(const smelt_engine *engine);

/* smelt_dtype (smelt_dtype.h): F32, BF16 and F16 data can be bound. */

/* Binds weight `name` (its Hugging Face name, as the plan's weight table has
 * it) from `data`, a row-major tensor of `dtype` with the given shape, which
 * must equal the plan's (a part of a stacked or concatenated weight: that
 * part's shape; it goes to its rows). The data is converted to the plan's
 * storage dtype and copied: it need not outlive the call. Binding a weight
 * the plan holds replaces it. */
smelt_status smelt_engine_bind_weight(smelt_engine *engine, const char *name, smelt_dtype dtype,
                                      const void *data, const int64_t *shape, uint32_t rank);

/* Binds weight `name` from `bytes` bytes that are already in the plan's
 * storage: a quantized weight's packed layout (quant/quant.h: codes, f16
 * scales, zero points, ...), in the order the plan's weight table gives
 * (int4 codes interleaved when it says mma_k16: the runtime does not
 * reorder), which is what a quantized weight takes, since
 * smelt_engine_bind_weight does not quantize; or the storage dtype's
 * elements of any other weight. `bytes` must equal the weight's size in the
 * plan (`smelt inspect` prints it); the data is copied. Stacked weights are
 * bound whole. */
smelt_status smelt_engine_bind_weight_bytes(smelt_engine *engine, const char *name, const void *data,
                                            uint64_t bytes);

/* Which rows of logits a step returns. The plan's output head runs on those
 * rows alone; the logits of a row are the same whichever is asked for. */
typedef enum smelt_logits {
    SMELT_LOGITS_ALL = 0,  /* every token's, [n, vocab]: scoring (perplexity) */
    SMELT_LOGITS_LAST = 1, /* the last token's, [1, vocab]: generation */
    SMELT_LOGITS_NONE = 2, /* none (logits may be NULL): a prompt's chunks before its last */
} smelt_logits;

/* One step: n tokens (1 <= n <= max_tokens) with their ids and positions;
 * writes the logits that `rows` asks for into logits (capacity in floats):
 * all n tokens', [n, vocab] row-major, or the last one's, [vocab], or none.
 * The caches keep what the step wrote (every token's keys and values,
 * whatever rows); the engine's position becomes the largest position + 1. */
smelt_status smelt_engine_forward(smelt_engine *engine, const int32_t *ids, const int32_t *pos, uint32_t n,
                                  smelt_logits rows, float *logits, size_t capacity);

/* One step as smelt_engine_forward with SMELT_LOGITS_LAST, for greedy
 * decoding: *token is the id of the first largest logit of the last of the n
 * tokens (NaN never wins). A plan compiled by this smelt picks it on the
 * device, so only the id crosses to the host; the logits themselves are not
 * returned. */
smelt_status smelt_engine_forward_greedy(smelt_engine *engine, const int32_t *ids, const int32_t *pos,
                                         uint32_t n, int32_t *token);

/* Forgets the sequence: zeroes the caches, position 0. */
smelt_status smelt_engine_reset(smelt_engine *engine);

/* ---- Generation ------------------------------------------------------------ */

/* Called with each new token as it is produced; return false to stop. */
typedef bool (*smelt_token_callback)(int32_t token, void *user);

typedef struct smelt_request {
    const int32_t *prompt; /* fed at the engine's position; may be empty when the sequence has tokens */
    size_t prompt_length;
    uint32_t max_tokens;        /* new tokens at most */
    float temperature;          /* <= 0: greedy (argmax; ties to the lowest id) */
    uint32_t top_k;             /* keep the k most likely; 0: all */
    float top_p;                /* keep the smallest set with probability >= p; >= 1: all */
    uint64_t seed;              /* of the sampler; equal seeds give equal samples */
    const int32_t *stop_tokens; /* generation ends at any of these (not reported as output) */
    size_t stop_token_count;
    smelt_token_callback on_token; /* may be NULL */
    void *user;
    int32_t *output; /* may be NULL; else receives up to output_capacity new tokens */
    size_t output_capacity;
    bool ignore_eos; /* true: do not stop at the plan's EOS ids (smelt_plan_info) */
} smelt_request;

static inline smelt_request smelt_request_default(void) {
    smelt_request r = {0};
    r.max_tokens = 16;
    r.top_p = 1.0f;
    return r;
}

typedef enum smelt_finish_reason {
    SMELT_FINISH_LENGTH = 0,   /* max_tokens produced */
    SMELT_FINISH_STOP_TOKEN,   /* a stop token of the request was sampled */
    SMELT_FINISH_CALLBACK,     /* the callback returned false */
    SMELT_FINISH_CONTEXT_FULL, /* the plan's max_positions was reached */
    SMELT_FINISH_EOS,          /* one of the model's EOS ids was sampled */
} smelt_finish_reason;

/* "max-tokens", "stop-token", "callback", "length" (the context is full),
 * "eos"; "unknown" for another value. */
const char *smelt_finish_reason_name(smelt_finish_reason reason);

typedef struct smelt_generation {
    size_t token_count; /* new tokens produced (a stop or EOS token is not counted) */
    smelt_finish_reason reason;
    int32_t stop_token; /* the token that stopped it: reason SMELT_FINISH_STOP_TOKEN or SMELT_FINISH_EOS */
} smelt_generation;

/* Feeds the prompt (in chunks of max_tokens), then samples up to max_tokens
 * new tokens, one decode step each, stopping early at one of the model's EOS
 * ids (unless ignore_eos), at a stop token, or when the sequence reaches the
 * plan's max_positions (SMELT_FINISH_CONTEXT_FULL, not an error). result may
 * be NULL. */
smelt_status smelt_engine_generate(smelt_engine *engine, const smelt_request *request,
                                   smelt_generation *result);

/* ---- Statistics ------------------------------------------------------------ */

typedef struct smelt_stats {
    uint64_t prefill_tokens; /* tokens run in steps of more than one token */
    double prefill_seconds;
    uint64_t decode_tokens; /* tokens run in steps of one token */
    double decode_seconds;
    double prefill_tokens_per_second; /* 0 when no time was spent */
    double decode_tokens_per_second;
    uint64_t steps;
    uint32_t launches_per_step; /* kernel launches + GEMMs of the last step */
    uint64_t graph_replays;     /* decode steps replayed from a CUDA graph */
} smelt_stats;

/* Totals since the engine was created (reset does not clear them). */
smelt_status smelt_engine_stats(const smelt_engine *engine, smelt_stats *out);

#ifdef __cplusplus
}
#endif

#endif
