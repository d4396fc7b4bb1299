/* emit.h - the kernel emitters: what one kernel group of the IR becomes on
 * a device. This is the emitter contract: the fusion rules (passes/fuse.c)
 * make groups, an emitter renders one; nothing else decides anything here
 * (dtypes, buffers and the launch order are in the IR already).
 *
 * Each compute or layout op is lowered by the emitter of its family
 * (ops.def's family column; one file per family, emit_<family>.c) into one
 * or more CUDA C kernels in the C-compatible subset of docs/design.md §4: the
 * same text that NVRTC compiles for a GPU and the host C compiler builds for
 * the simulator. A kernel comes with its parameter list (which buffers, in
 * which order) and its launch rule (grid affine in the token count T, block,
 * dynamic shared memory); codegen/lower.c turns those into a prog_launch.
 *
 *   cg_group_lowering l;
 *   if (!cg_emit_group(&m, &group, &arena, &l, &diag)) ...   // reported at the op
 *   for (uint32_t i = 0; i < l.kernel_count; i++)
 *       ... l.kernels[i].name, .source, .params, .rule ...
 *
 * Kernels are named by their specialisation (family, storage dtypes, static
 * dims, baked attributes: `rms_norm_f32_d64_eps1em05`) followed by 8 hex
 * digits of a hash of their source (`rms_norm_f32_d64_eps1em05_3fa9c2d1`),
 * never by the op's position: the 32 identical layers of a model give one
 * name and byte-identical sources, compiled once, and two kernels whose
 * sources differ in anything (rows, an attribute the readable part omits)
 * differ in name. The IR text of the op itself (with its %N) is in ops_text.
 *
 * Shapes: static dims are baked into the source as named constants; the only
 * dynamic dim is the module's token dim (dim 0 of the input "ids"), and only
 * as dim 0 of a value; it reaches a kernel as its `int tokens` argument.
 */
#ifndef SMELT_CG_EMIT_H
#define SMELT_CG_EMIT_H

#include "arena.h"
#include "diag.h"
#include "ir.h"
#include "program.h"

#include <stdbool.h>
#include <stdint.h>

/* Is v a quantized weight (its op's quant attribute, ops.def), stored in
 * quant/quant.h's packed layout and passed to kernels as uint8_t bytes? */
bool cg_is_quantized(const ir_module *m, ir_value_id v);
/* Is v the codes a quantize op makes (its result 0, f8e4m3 or i8, ir/ops.def)?
 * They are stored as bytes, one a code, like a quantized weight's. */
bool cg_is_activation_codes(const ir_module *m, ir_value_id v);
/* Storage dtype of value v: its dtype in the IR (set by the precision pass).
 * Only f32, bf16, f16 and i32 have kernels today; cg_emit_group refuses any other
 * at the op before an emitter asks for it. */
smelt_dtype cg_storage_dtype(const ir_module *m, ir_value_id v);

typedef enum cg_param_kind {
    CG_PARAM_VALUE,    /* pointer to the buffer of IR value `value` */
    CG_PARAM_STATE,    /* pointer to state buffer `state` of this op (see cg_group_lowering) */
    CG_PARAM_TOKENS,   /* int: T, the token count of the step */
    CG_PARAM_OP_STATE, /* pointer to state buffer `state` of another group's op `op` (a GEMV
                          epilogue writing an attention op's KV cache) */
} cg_param_kind;

typedef struct cg_param {
    cg_param_kind kind;
    ir_value_id value;  /* CG_PARAM_VALUE */
    uint32_t state;     /* CG_PARAM_STATE, CG_PARAM_OP_STATE */
    uint32_t op;        /* CG_PARAM_OP_STATE: the op owning the state */
    prog_affine extent; /* CG_PARAM_VALUE: the value's bytes at T tokens (its type, storage dtype) */
    bool writes;        /* the kernel stores through this pointer */
} cg_param;

typedef struct cg_kernel {
    const char *name;     /* the extern "C" entry point; names the specialisation */
    const char *family;   /* "norm", "attention", ...: ops.def's family */
    const char *ops_text; /* the IR op it implements, as the text form prints it */
    const char *source;   /* the whole .cu text, including "smelt_kernel.h" */
    uint32_t param_count;
    cg_param params[PROG_MAX_ARGS]; /* in the order of the kernel's arguments */
    prog_launch_rule rule;          /* grid affine in T, block, dynamic shared bytes */
    /* The modeled DRAM traffic and flops of one launch (program.h, "The cost
     * model"). NULL: codegen/lower.c derives it from the parameters
     * (program_launch_cost: each extent once, KV caches by rows), which is
     * right for a kernel that touches each byte of its arguments once. An
     * emitter whose kernel does otherwise (gathers rows, re-reads a buffer
     * per block) or computes much (attention) points this at its own cost,
     * in the arena of the kernel's strings, after cg_kernel_end. */
    const prog_cost *cost;
    /* Flops added to the derived cost (cost NULL): a kernel whose bytes the
     * default gets right but that computes (a GEMV: 2 N K per token). */
    prog_poly flops;
    int64_t min_tokens; /* runs in steps of at least this many tokens (0: every step) */
    int64_t max_tokens; /* and of at most this many (0: no bound); the executor skips it otherwise */
    bool tensor_cores;  /* the derived cost's flops run on tensor cores (cost NULL) */
    /* The smelt kernel of a scaled GEMM (cg_group_lowering.scaled_gemm): it
     * runs only where the device cannot run that GEMM (PROG_NEED_NO_SCALED_GEMM). */
    bool fallback;
} cg_kernel;

typedef enum cg_lowering_kind {
    CG_LOWER_NONE,    /* input, weight, const (baked into users), output */
    CG_LOWER_KERNELS, /* kernels[0..kernel_count) */
    CG_LOWER_GEMM,    /* matmul: the lead's lowering makes a prog_gemm */
    CG_LOWER_ALIAS,   /* reshape: the result is the operand's buffer */
} cg_lowering_kind;

/* State buffers of an attention op (zeroed when a sequence starts):
 *   0  K cache  [max_seq, Hkv, D]  in the storage dtype of k
 *   1  V cache  [max_seq, Hkv, Dv] in the storage dtype of v
 *   2  written  int32[max_seq]: 1 once a step has written that position, so
 *      that attention skips positions never written (as the reference does)
 *   3  partials f32: the split-KV decode kernel's per-split results
 *   4  counters int32: per (token, kv head), the splits finished this step
 *      (the last one merges them and sets it back to 0)
 *   5  key scales   f32 [max_seq, Hkv]: an f8e4m3 cache's (kv_dtype) scale
 *   6  value scales f32 [max_seq, Hkv]   of each row, code * scale = value
 * States 3 and 4 are a workspace, not indexed by position (rows 0); an op
 * without the decode kernel has them of 0 bytes. States 5 and 6 exist only
 * with an f8e4m3 cache (the others have 3 or 5 states). */
enum { CG_MAX_KERNELS = 4, CG_MAX_STATES = 7 };
enum {
    CG_STATE_KEYS = 0,
    CG_STATE_VALUES = 1,
    CG_STATE_WRITTEN = 2,
    CG_STATE_PARTIALS = 3,
    CG_STATE_COUNTERS = 4,
    CG_STATE_KEY_SCALES = 5,
    CG_STATE_VALUE_SCALES = 6
};

typedef struct cg_group_lowering {
    cg_lowering_kind kind;
    uint32_t kernel_count;
    cg_kernel kernels[CG_MAX_KERNELS]; /* launched in this order */
    uint32_t state_count;
    uint64_t state_bytes[CG_MAX_STATES];
    uint64_t state_rows[CG_MAX_STATES]; /* positions (max_seq) each holds; 0: not indexed by position */
    /* > 0: the kernels are a fused group's, made for steps of at most this
     * many tokens; a step of more runs the group's ops one by one, each as
     * cg_emit_op lowers it (codegen/lower.c guards both by the token count). */
    int64_t fused_max_tokens;
    /* An act_codes matmul (ir/ops.def) alone, CG_LOWER_KERNELS: besides its
     * kernels it becomes a scaled GEMM of the quantize's codes and scales and
     * the weight's codes and scales (prog_gemm.has_scales), which runs in the
     * steps of at least scaled_gemm_min_tokens tokens where the device runs
     * scaled GEMMs (PROG_NEED_SCALED_GEMM); its kernels marked `fallback`
     * (smelt's dequantize-GEMM over the codes, or the GEMV over x where that
     * does not fit) run in those steps where it does not. codegen/lower.c
     * builds the GEMM (with the bias and residual the fallback takes). */
    bool scaled_gemm;
    int64_t scaled_gemm_min_tokens;
} cg_group_lowering;

/* A kernel group, as the fuse pass made it (op.group): the ops of one
 * kernel in program order, the values it reads that other groups (or inputs,
 * weights and constants) make, and the values it makes that something outside
 * the group reads. codegen/lower.c builds it from the IR; an emitter turns it
 * into kernels (or a GEMM) that read `inputs` and write `outputs`, keeping
 * every other value of the group in registers or shared memory. */
typedef struct cg_group {
    uint32_t id; /* op.group */
    uint32_t op_count;
    const uint32_t *ops; /* op indices, program order */
    uint32_t input_count;
    const ir_value_id *inputs;
    uint32_t output_count;
    const ir_value_id *outputs;
} cg_group;

/* Emits what group `g` becomes (its ops live and typed with storage dtypes,
 * after the lowering passes); strings go to `a`. A group of one op goes to
 * the emitter of the op's family (ops.def's family column); the fusion rules
 * that make larger groups come with emitters for them, registered here:
 * a group holding a matmul is a GEMV group (codegen/emit_gemv.c; its
 * quantize ops are skipped: the kernel codes x in registers); an add and the
 * norm of its result, a residual norm (emit_norm.c); a norm and the quantize
 * of its result, one kernel writing both (emit_norm.c: what codegen/lower.c
 * makes of them in a GEMV group run op by op).
 * Errors (a dtype without kernels, a symbolic dim that is not the token dim 0,
 * a group no emitter takes) are reported at the group's first op and give
 * false. */
bool cg_emit_group(const ir_module *m, const cg_group *g, arena *a, cg_group_lowering *out, diag_engine *d);
/* The greedy-decoding kernel of a plan: the index (int32, into its state 0
 * of 4 bytes) of the first maximum of the last row of the logits that
 * output op `logits_op` returns (f32 [T, vocab]), so that at temperature 0
 * only the token crosses to the host (emit_argmax.c). */
bool cg_emit_greedy(const ir_module *m, uint32_t logits_op, arena *a, cg_group_lowering *out, diag_engine *d);

/* A GEMV group over a weight concatenated at compile time (passes/fuse.c),
 * in the steps above its fused_max_tokens, runs its ops before the matmul
 * one by one, the matmul as one GEMM, and then what follows the matmul as
 * one kernel over the GEMM's output (emit_gemv.c): this is that kernel.
 * cg_group_concat_matmul names the matmul (IR_NONE: the group has none, and
 * runs its ops one by one). */
uint32_t cg_group_concat_matmul(const ir_module *m, const cg_group *g);
bool cg_emit_gemm_epilogue(const ir_module *m, const cg_group *g, arena *a, cg_group_lowering *out,
                           diag_engine *d);

/* A quantized matmul that the tensor-core dequantize-GEMM takes
 * (emit_dequant_gemm.c), ops[0], with the bias and residual adds after it
 * (ops[1..op_count), as codegen/lower.c finds a GEMM's epilogue) in its
 * epilogue: one kernel for the steps above IR_GEMV_MAX_TOKENS that writes
 * the last add's result. */
bool cg_dequant_gemm_fits(const ir_module *m, uint32_t op);
bool cg_emit_dequant_gemm_epilogue(const ir_module *m, const uint32_t *ops, uint32_t op_count, arena *a,
                                   cg_group_lowering *out, diag_engine *d);

/* The group of op `op` alone: what the emitter tests use. */
bool cg_emit_op(const ir_module *m, uint32_t op, arena *a, cg_group_lowering *out, diag_engine *d);

#endif
