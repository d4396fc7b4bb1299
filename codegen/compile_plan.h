/* compile_plan.h - `smelt compile`: a lowered module to a plan file.
 *
 *   // the module after the whole pass pipeline (pass_pipeline_until("all"))
 *   cg_plan_options o = {.archs = {90}, .arch_count = 1, .host = true};
 *   cg_plan_report r;
 *   if (!cg_compile_plan(&m, &o, "model.plan", &r, &diag)) ...   // reported
 *
 * The module is rendered (lower.h), every distinct kernel is compiled by
 * NVRTC for each CUDA arch to cubin (plus PTX of the newest arch, which the
 * driver can JIT on later GPUs) and, at the same time on the same thread
 * pool (compile_pool.h: the costliest compiles first), by the host C
 * compiler into the host simulator's shared object, both through the disk
 * cache; then the plan is written atomically: manifest, kernels, host
 * kernels, program, memory plan, and the weights when a reader is given.
 */
#ifndef SMELT_CG_COMPILE_PLAN_H
#define SMELT_CG_COMPILE_PLAN_H

#include "compile_pool.h"
#include "emit.h"
#include "ir.h"

enum { CG_MAX_ARCHS = 8 };

/* Fills dst (count floats, row-major in the weight's IR type) with the data
 * of weight op `op`. */
typedef bool (*cg_weight_reader)(void *context, uint32_t op, float *dst, uint64_t count);
/* Fills dst (bytes, the weight's whole packed layout, quant/quant.h) with
 * quantized weight op `op` in the format of its attributes. */
typedef bool (*cg_packed_weight_reader)(void *context, uint32_t op, uint8_t *dst, uint64_t bytes);

typedef struct cg_plan_options {
    int archs[CG_MAX_ARCHS]; /* CUDA targets: 80 = sm_80 */
    uint32_t arch_count;
    bool host;                                  /* build the host simulator's object */
    unsigned jobs;                              /* compile threads; 0: every core */
    bool no_cache;                              /* do not use the disk cache */
    cg_weight_reader read_weight;               /* NULL: a plan without weights (bound at run time) */
    cg_packed_weight_reader read_packed_weight; /* the quantized weights' (with read_weight) */
    void *weight_context;
    const char *tokenizer_json; /* NULL, or the TOKENIZER section: {"type": "bytes", "bos": N, "eos": N} */
    const int32_t *eos_tokens;  /* the model's EOS ids, kept in the launch program; each < vocab */
    uint32_t eos_token_count;   /* at most PROG_MAX_EOS */
    const char *accuracy_gate_json; /* NULL, or the manifest's "accuracy_gate" object (JSON text) */
    cg_progress_fn progress;        /* NULL: quiet */
    void *progress_user;
} cg_plan_options;

typedef struct cg_plan_report {
    uint32_t kernel_count;      /* distinct kernels */
    uint32_t launches_per_step; /* kernel launches + GEMMs in a decode step (T = 1) */
    uint32_t compile_jobs;      /* (kernel, arch) pairs */
    uint32_t cache_hits;
    uint64_t arena_bytes;
    uint64_t weight_bytes;
    uint64_t file_size;
    char content_hash[33];
    double seconds;
} cg_plan_report;

bool cg_compile_plan(const ir_module *m, const cg_plan_options *o, const char *path, cg_plan_report *report,
                     diag_engine *d);

/* The text of runtime/smelt_kernel.h, embedded at build time. */
extern const char cg_smelt_kernel_header[];

#endif
