/* program.h - the launch program and memory plan of a plan file: what the
 * runtime executes for one step of T tokens (a prefill chunk or one decode
 * token). It is data, made by codegen (codegen/lower.c) and stored in the
 * plan's PROGRAM section (encoded by program_encode, program.c); the runtime
 * decodes it (program_decode) and runs it on a device (runtime/executor.c).
 *
 * Memory. Every intermediate value lives in one activation arena per device,
 * at an offset chosen by liveness (values whose lifetimes do not overlap share
 * bytes); sizes are computed at the token bound, so any T <= max_tokens fits.
 * Weights live in their own buffers (one per weight-table entry). State that
 * outlives a step (the KV cache of each attention op) lives in state buffers.
 *
 * A step:
 *   1. the runtime writes ids[T] and pos[T] (int32) at input_ids / input_pos;
 *   2. it runs the instructions in order (kernel launches and GEMMs) whose
 *      token range holds T and whose needs its device meets (prog_instr,
 *      prog_need: a scaled GEMM, or the fallback kernel beside it);
 *   3. logits [T, vocab] (f32) are at `logits` in the arena, or, on a step
 *      that asks for the greedy token, that int32 is at `greedy_token`.
 *
 * Wanted rows. A step wants the logits of all T rows (scoring), of the last
 * row alone (generation) or of none (a prompt's earlier chunks). The output
 * head's instructions (wanted_rows: the IR's rows(wanted) ops, the
 * wanted-rows pass) run on the wanted rows only: on a step that wants all,
 * as every instruction; on one that wants the last row, at one token (their
 * launch rule, GEMM rows and token argument at T = 1), each pointer into a
 * row-indexed value moved to its last row (by (T - 1) row_bytes; a GEMM's
 * A, C and residual by T - 1 rows), so that the logits' row T - 1 is where
 * it always is; on one that wants none, not at all. They are chosen by the step's T
 * like every instruction (prog_instr_runs), so the last row's logits are
 * the same kernels' as when every row is computed; and a wanted-rows GEMM
 * on a step that wants all rows computes its last row by itself (a BLAS
 * picks its kernels by the row count), so that a row's logits are the same
 * bits whichever rows a step wants.
 *
 * Buffers are named by prog_ref: arena + byte offset, weight + byte offset, or
 * state + byte offset. Launch rules and GEMM row counts are affine in T:
 * ceil((a * T + b) / c).
 */
#ifndef SMELT_PROGRAM_H
#define SMELT_PROGRAM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "smelt_dtype.h"

enum { PROGRAM_FORMAT_VERSION = 14, PROG_MAX_ARGS = 32, PROG_MAX_EOS = 16, PROG_MAX_WEIGHT_PARTS = 64 };

/* ceil((a * T + b) / c) with c >= 1; a constant is {0, value, 1}. */
typedef struct prog_affine {
    int64_t a, b, c;
} prog_affine;

static inline int64_t prog_affine_eval(prog_affine f, int64_t tokens) {
    int64_t n = f.a * tokens + f.b;
    return n <= 0 ? 0 : (n + f.c - 1) / f.c;
}

typedef enum prog_buffer {
    PROG_BUFFER_ARENA = 0,  /* the activation arena */
    PROG_BUFFER_WEIGHT = 1, /* weight-table entry `index` */
    PROG_BUFFER_STATE = 2,  /* state buffer `index` (KV caches), zeroed at reset */
} prog_buffer;

typedef struct prog_ref {
    uint8_t buffer;  /* prog_buffer */
    uint32_t index;  /* weight or state index; 0 for the arena */
    uint64_t offset; /* bytes */
} prog_ref;

/* One kernel argument: a pointer to a buffer, the token count T as an int,
 * or an integer constant (codegen makes none today; the decoder refuses
 * them). A pointer carries what the kernel may touch through it: `extent`
 * bytes from ref (affine in T, as codegen derives it from the parameter's
 * type and storage dtype, or a state buffer's size), and whether it writes. */
typedef enum prog_arg_kind {
    PROG_ARG_POINTER = 0,
    PROG_ARG_TOKENS = 1, /* int: T of this step */
    PROG_ARG_INT = 2,    /* int: the constant `value` */
} prog_arg_kind;

typedef struct prog_arg {
    uint8_t kind;       /* prog_arg_kind */
    prog_ref ref;       /* PROG_ARG_POINTER */
    prog_affine extent; /* PROG_ARG_POINTER: bytes from ref the kernel may touch at T tokens */
    bool writes;        /* PROG_ARG_POINTER: the kernel stores through it */
    /* PROG_ARG_POINTER of a wanted-rows instruction: bytes per token row when
     * it points at a row-indexed value (dim 0 the tokens), moved by
     * (T - 1) row_bytes on a step that wants the last row; 0: not moved. */
    uint64_t row_bytes;
    int64_t value; /* PROG_ARG_INT */
} prog_arg;

typedef enum prog_op {
    PROG_OP_LAUNCH = 0, /* a kernel of the plan's kernel table */
    PROG_OP_GEMM = 1,   /* C[M, N] = A[M, K] x B (+ bias[N]) (+ residual[M, N]); cuBLASLt / OpenBLAS */
} prog_op;

/* Launch geometry of a kernel: grid and block dims, dynamic shared memory. */
typedef struct prog_launch_rule {
    prog_affine grid[3];
    uint32_t block[3];
    uint32_t dynamic_shared_bytes;
} prog_launch_rule;

typedef struct prog_launch {
    uint32_t kernel; /* index in the plan's kernel table */
    prog_launch_rule rule;
    uint32_t arg_count;
    prog_arg args[PROG_MAX_ARGS];
} prog_launch;

/* Row-major C[M, N] = A[M, K] . op(B) (+ bias[N]) (+ residual[M, N]) with
 * f32 accumulation. B is a weight stored [N, K] (b_transposed: out_in
 * layout, C = A B^T) or [K, N] (in_out, C = A B). M is affine in T. The bias
 * is cuBLASLt's bias epilogue, the residual its C operand with beta = 1
 * (of C's dtype, in another buffer than C: the output goes to D = C here). */
/*
 * Scaled GEMM (W8A8, an act_codes matmul: ops.def): A holds codes (f8e4m3 or
 * i8) with one f32 scale per row (a_scale, [M], what the quantize op wrote),
 * B a quantized weight's codes of the same kind with one scale per output
 * channel (b_scale, [N] of dtype_b_scale: the weight's own f16 scales, inside
 * it at quant/quant.h's offset), and C[i, j] = a_scale[i] b_scale[j]
 * sum_k A[i, k] B[j, k] (+ bias) (+ residual), the product exact and summed
 * in f32. On CUDA, cuBLASLt's FP8 GEMM with outer-vector scales
 * (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F); where a device cannot run it,
 * the instruction is guarded (prog_instr.needs) and a smelt kernel beside it
 * does the same. */
typedef struct prog_gemm {
    prog_affine m;
    int64_t n, k;
    uint8_t dtype_a, dtype_b, dtype_c, dtype_bias; /* smelt_dtype */
    bool b_transposed;
    bool has_bias;
    bool has_residual;
    bool has_scales;       /* a scaled GEMM: A and B codes, a_scale and b_scale (above) */
    uint8_t dtype_b_scale; /* smelt_dtype of b_scale: f16 (a weight's) or f32 */
    prog_ref a, b, c, bias, residual;
    prog_ref a_scale, b_scale; /* with has_scales */
} prog_gemm;

/* ---- The cost model ------------------------------------------------------
 *
 * What one instruction costs, modeled: the DRAM bytes it reads and writes
 * and the floating-point operations it does (a multiply-add is 2), each a
 * polynomial in the step's token count T and its context C, the positions
 * already in the KV cache when the step starts (its tokens then sit at
 * positions C .. C+T-1):
 *
 *   constant + per_token T + per_context C + per_token_context T C + per_token_squared T^2
 *
 * A decode step at context C is (T = 1, C); a prefill of N tokens (T = N,
 * C = 0). Causal attention over the step's own tokens is where T^2 comes in
 * (T C + T (T + 1) / 2 positions attended). Coefficients are finite, >= 0
 * and at most PROGRAM_COST_COEFFICIENT_LIMIT (the decoder checks), so a cost
 * is never negative and never overflows a double for any T and C.
 *
 * Nothing executes on it: `smelt inspect` reads it (driver/inspect.c) to
 * print what a step moves and how long that takes at a GPU's peaks. Codegen
 * derives it for every instruction (program_launch_cost, program_gemm_cost
 * below: each byte an argument may touch, once), unless the kernel's
 * emitter knows its traffic better (cg_kernel.cost, codegen/emit.h). */
typedef struct prog_poly {
    double constant, per_token, per_context, per_token_context, per_token_squared;
} prog_poly;

typedef struct prog_cost {
    prog_poly read;    /* DRAM bytes read */
    prog_poly written; /* DRAM bytes written */
    prog_poly flops;   /* floating-point operations */
    bool tensor_cores; /* the flops run on tensor cores (else on CUDA cores, at the f32 rate) */
} prog_cost;

#define PROGRAM_COST_COEFFICIENT_LIMIT 1e18

static inline double prog_poly_eval(prog_poly f, double tokens, double context) {
    return f.constant + f.per_token * tokens + f.per_context * context +
           f.per_token_context * tokens * context + f.per_token_squared * tokens * tokens;
}

static inline prog_poly prog_poly_scaled(prog_poly f, double k) {
    return (prog_poly){f.constant * k, f.per_token * k, f.per_context * k, f.per_token_context * k,
                       f.per_token_squared * k};
}

static inline prog_poly prog_poly_sum(prog_poly f, prog_poly g) {
    return (prog_poly){f.constant + g.constant, f.per_token + g.per_token, f.per_context + g.per_context,
                       f.per_token_context + g.per_token_context, f.per_token_squared + g.per_token_squared};
}

/* An instruction runs in a step of T tokens when min_tokens <= T and
 * (max_tokens == 0 || T <= max_tokens): a fused kernel made for small T
 * (a decode GEMV) and the unfused launches of the same ops for larger T are
 * both in the program, each guarded by its range. 0 and 0: every step. */
/* What a device must (not) be able to do for an instruction to run on it
 * (prog_instr.needs): a scaled FP8 GEMM (prog_gemm.has_scales) runs where the
 * device can run it, and the smelt kernel that computes the same runs where
 * it cannot. The runtime asks its device once, when it opens the plan. The
 * decoder holds a program to this: every scaled GEMM, and nothing else, has
 * PROG_NEED_SCALED_GEMM; PROG_NEED_NO_SCALED_GEMM is on launches alone; and
 * every scaled GEMM has a fallback, a PROG_NEED_NO_SCALED_GEMM launch that
 * writes its C, so a program computes every value on every device. */
typedef enum prog_need {
    PROG_NEED_NONE = 0,
    PROG_NEED_SCALED_GEMM = 1,    /* runs only where the device runs scaled GEMMs */
    PROG_NEED_NO_SCALED_GEMM = 2, /* runs only where it does not (the fallback kernel) */
} prog_need;

typedef struct prog_instr {
    uint8_t op;     /* prog_op */
    uint8_t needs;  /* prog_need */
    uint32_t ir_op; /* the IR op (index in the compiled module) it implements, for messages */
    int64_t min_tokens, max_tokens;
    uint32_t choice;  /* 0: none; c: a side of choices[c - 1] ("Choices" below) */
    uint8_t side;     /* of that choice: 0 the fused kernel, 1 the ops one by one */
    bool wanted_rows; /* of the output head: runs on the rows whose logits the step wants ("Wanted rows") */
    union {
        prog_launch launch;
        prog_gemm gemm;
    } as;
    prog_cost cost; /* modeled; not used to execute */
} prog_instr;

/* ---- Choices ------------------------------------------------------------
 *
 * A fused GEMV group (codegen/emit_gemv.c) is one kernel in small steps and
 * its ops one by one (GEMMs on cuBLASLt, an epilogue kernel) in large ones.
 * For the steps between, min_tokens..max_tokens tokens, the program holds
 * both lowerings, each instruction marked with its choice and side, and the
 * runtime runs one side per step: the one whose modeled time is the smaller
 * on its device (program_choice_side). A choice records, per side and per
 * token count T of its range, what that side's instructions do at T —
 * DRAM bytes, flops (on tensor cores or not) and launches — as codegen
 * models them (the GEMV reads its weights once per tile of 4 tokens); the
 * runtime only evaluates the roofline of each and compares. */
enum { PROG_CHOICE_MAX_TOKENS = 16 }; /* token counts in one choice's range, at most */

typedef struct prog_choice_cost {
    double bytes, flops; /* DRAM bytes read and written; floating-point operations */
    uint32_t launches;
    bool tensor_cores; /* the flops run on tensor cores */
} prog_choice_cost;

typedef struct prog_choice {
    int64_t min_tokens, max_tokens; /* 1 <= min <= max, max - min < PROG_CHOICE_MAX_TOKENS */
    prog_choice_cost cost[2][PROG_CHOICE_MAX_TOKENS]; /* [side][T - min_tokens] */
} prog_choice;

/* What a device does per second and per launch: its DRAM bandwidth, its
 * tensor-core and CUDA-core peaks, and the cost of one launch (or graph
 * node). */
typedef struct prog_device_figures {
    double bytes_per_second, tensor_flops_per_second, flops_per_second, launch_seconds;
} prog_device_figures;

/* The modeled seconds of side `side` of choice c in a step of `tokens`
 * tokens (within its range) on a device of figures f:
 * max(bytes / bandwidth, flops / peak) + launches x launch cost. */
double program_choice_seconds(const prog_choice *c, int side, int64_t tokens, const prog_device_figures *f);
/* The side (0 or 1) whose modeled time is the smaller, the fused kernel on
 * a tie; outside the choice's range the one the token ranges leave (0 below,
 * 1 above). */
int program_choice_side(const prog_choice *c, int64_t tokens, const prog_device_figures *f);
/* The largest T up to which the fused side is chosen from min_tokens on
 * (min_tokens - 1: from none; the range's end: in all of it). */
int64_t program_choice_threshold(const prog_choice *c, const prog_device_figures *f);

/* One tensor of a concatenated weight: its Hugging Face name and the rows
 * of dim 0 it fills (after the parts before it). */
typedef struct prog_weight_part {
    const char *name;
    int64_t rows;
} prog_weight_part;

/* A quantized weight's format, as quant/quant.h's quant_format says it
 * (plan/ includes nothing of smelt: quant.c asserts that the numbers agree).
 * kind 0: not quantized. */
enum { PROG_QUANT_NONE = 0, PROG_QUANT_INT4 = 1, PROG_QUANT_INT8 = 2, PROG_QUANT_FP8 = 3 };
enum {
    PROG_QUANT_ZERO = 1,
    PROG_QUANT_GROUP_INDEX = 2,
    PROG_QUANT_COLUMN_SCALE = 4,
    PROG_QUANT_INTERLEAVED = 8
};
typedef struct prog_quant {
    uint8_t kind;   /* PROG_QUANT_* */
    uint8_t method; /* quant_method: how the codes were chosen (binding at run time re-quantizes by it) */
    uint8_t flags;  /* PROG_QUANT_ZERO | PROG_QUANT_GROUP_INDEX | PROG_QUANT_COLUMN_SCALE |
                       PROG_QUANT_INTERLEAVED (int4 codes in quant.h's "mma_k16" order) */
    uint32_t group; /* input columns per scale; divides shape[1] */
} prog_quant;

/* A weight-table entry: the tensor(s) of one IR weight op as the plan stores
 * them. `name` is the Hugging Face name; when stacked, a template holding
 * "{e}" whose parts 0..shape[0]-1 are stacked along dim 0. A concatenated
 * weight (an IR concat of weights along dim 0, passes/fuse.c: Q, K and V as
 * one [Nq + Nk + Nv, K] weight) lists its parts, each bound by its own
 * name into its rows; its `name` (the parts' names joined by " + ") binds
 * the whole. A quantized weight [N, K] (quant.kind != 0; neither stacked
 * nor concatenated) is stored in quant/quant.h's packed layout: dtype is
 * its codes' (i4, i8, f8e4m3) and bytes the whole layout (codes, scales,
 * zeros, ...), which the runtime checks with quant_layout_of. */
/* A weight's layout flags (the encoding's u8 after its dtype). */
enum { PROG_WEIGHT_STACKED = 1, PROG_WEIGHT_TRANSPOSED = 2 };

typedef struct prog_weight {
    const char *name;
    uint8_t dtype; /* smelt_dtype: storage dtype in the plan and on the device */
    bool stacked;
    /* [N, K] stored, the checkpoint tensor `name` is [K, N] (a Conv1D
     * weight read out_in: ops.def's "transposed"): the driver transposes it
     * before quantizing it (drv_bind_checkpoint). A quantized matrix,
     * neither stacked nor concatenated. */
    bool transposed;
    uint32_t rank;
    int64_t shape[8];
    uint64_t bytes;
    uint64_t data_offset;    /* in the WEIGHT_DATA section; UINT64_MAX: not in the plan, bind at run time */
    uint32_t part_count;     /* 0, or 2..PROG_MAX_WEIGHT_PARTS: concatenated along dim 0 from these */
    prog_weight_part *parts; /* [part_count], rows summing to shape[0] */
    prog_quant quant;
} prog_weight;

typedef struct program {
    uint32_t format_version;
    int64_t max_tokens;   /* T bound */
    uint64_t arena_bytes; /* at max_tokens */
    uint64_t vocab;       /* last dim of logits */
    prog_ref input_ids;   /* int32[T] */
    prog_ref input_pos;   /* int32[T] */
    prog_ref logits;      /* f32[T, vocab] */
    int64_t
        max_positions;  /* positions must lie in [0, max_positions) (the KV caches' length); 0: unchecked */
    int64_t id_bound;   /* ids must lie in [0, id_bound) (rows of the embedding table); 0: [0, vocab) */
    uint32_t id_table;  /* weight index of the embedding table the ids index; UINT32_MAX: none */
    uint32_t eos_count; /* the model's end-of-sequence ids, where generation stops */
    int32_t eos[PROG_MAX_EOS]; /* [eos_count], each in [0, vocab), distinct */
    /* Greedy decoding on the device: with has_greedy, the last instruction
     * (a launch) writes the argmax of the last logits row, int32, at
     * greedy_token. It runs only on steps that ask for the token, and those
     * copy out that int32 instead of the logits. */
    bool has_greedy;
    prog_ref greedy_token;
    uint32_t state_count;
    uint64_t *state_bytes; /* [state_count] */
    uint64_t *state_rows;  /* [state_count] positions (max_seq) of a KV cache; 0: not indexed by position */
    uint32_t weight_count;
    prog_weight *weights; /* [weight_count] */
    uint32_t instr_count;
    prog_instr *instrs; /* [instr_count] */
    uint32_t choice_count;
    prog_choice *choices; /* [choice_count] ("Choices") */
} program;

/* ---- Encoding (the plan's PROGRAM section) --------------------------------
 *
 * Little-endian, byte by byte, strings as (u64 length, bytes) as everywhere in
 * a plan (plan_format.h); the layout is written out in program.c. The decoder
 * is the runtime's gate: after program_decode succeeds, every count, index,
 * dtype, affine rule and buffer reference has been checked, and every region
 * a GEMM, a kernel (its arguments' extents) or the runtime itself reads or
 * writes lies inside its buffer at max_tokens (overflow-safe arithmetic), so
 * the executor needs no checks of its own beyond the token count. Kernel
 * indices, launch rules (equal to the kernel table's) and weight data
 * offsets are checked against the rest of the plan by program_check_plan;
 * the plan opener (runtime/plan_open.c) runs both.
 */

/* Encodes p into a malloc'ed buffer (*bytes, *size); false only when out of
 * memory. */
bool program_encode(const program *p, uint8_t **bytes, size_t *size);

/* Decodes and validates a PROGRAM section into *out (which then owns copies
 * of everything: `bytes` need not outlive it). On failure returns false,
 * leaves *out empty (program_free is harmless on it) and writes a message
 * saying what is wrong and where into error. */
bool program_decode(const uint8_t *bytes, size_t size, program *out, char *error, size_t error_size);

struct plan_kernel;

/* Checks what the program says about the rest of its plan: every launched
 * kernel exists (kernel_count entries of `kernels`, the plan's kernel table),
 * each launch's grid, block and dynamic shared memory are the kernel table's
 * launch rule for that kernel (the kernel is generated to be safe for exactly
 * that rule), every launch passes exactly the parameters its kernel declares
 * (kind, extent, access: plan_kernel.params), and every weight stored in the plan lies inside the
 * WEIGHT_DATA section (weight_data_size bytes) at an offset aligned to its
 * element size. */
bool program_check_plan(const program *p, const struct plan_kernel *kernels, uint32_t kernel_count,
                        uint64_t weight_data_size, char *error, size_t error_size);

/* Fills out->param_count and out->params with what kernel `kernel` touches
 * through each parameter, as its first launch in p passes it: what the
 * writer of a plan declares in the kernel table (every launch of a kernel
 * passes the same, since it follows from the kernel's source). Leaves no
 * parameters when p never launches the kernel. */
void program_declare_params(const program *p, uint32_t kernel, struct plan_kernel *out);

/* The dtypes a program may store in a buffer today (f32, bf16, f16, i32): what
 * the decoder accepts, so what codegen may emit kernels for. */
bool program_dtype_stored(uint8_t dtype);

/* Part e of stacked weight w when `name` is w's template with a decimal e
 * in place of "{e}" (0 <= e < shape[0], no leading zeros); -1 otherwise. */
int64_t program_stacked_part(const prog_weight *w, const char *name);

/* The cost of launch l of p when nothing better is known: every byte each
 * pointer argument may touch (its extent at T), once — read, or written when
 * the kernel stores through it. A state buffer indexed by position (a KV
 * cache, state_rows > 0) counts by rows: a kernel that writes it writes the
 * step's T rows, one that reads it reads the C + T rows written so far. No
 * flops (the plan does not say what a kernel computes); an emitter that
 * knows better gives its own (cg_kernel.cost). Arguments that name no valid
 * buffer count nothing. */
prog_cost program_launch_cost(const program *p, const prog_launch *l);

/* The cost of a GEMM: A, B, the bias and the residual read once, C written
 * once, 2 M N K flops (+ M N for the bias; the residual's adds count none,
 * as an add kernel's do not), on tensor cores when A and B are bf16 or f16,
 * or codes of a scaled GEMM (which reads a_scale and b_scale once too). */
prog_cost program_gemm_cost(const prog_gemm *g);

/* Does instruction `in` do work in a step of `tokens` tokens? Not when its
 * token range excludes T, nor when it is a launch whose grid is empty at T
 * (a kernel made for some steps only, such as attention's decode and prefill
 * kernels, codegen/emit_attention.c). */
static inline bool prog_instr_runs(const prog_instr *in, int64_t tokens) {
    if (tokens < in->min_tokens || (in->max_tokens != 0 && tokens > in->max_tokens)) return false;
    if (in->op != PROG_OP_LAUNCH) return true;
    for (int i = 0; i < 3; i++)
        if (prog_affine_eval(in->as.launch.rule.grid[i], tokens) <= 0) return false;
    return true;
}

/* Does instruction `in` run on a device that runs scaled GEMMs (`scaled`)
 * or on one that does not (prog_need)? */
static inline bool prog_instr_needs_met(const prog_instr *in, bool scaled) {
    return in->needs == PROG_NEED_NONE || (in->needs == PROG_NEED_SCALED_GEMM) == scaled;
}

/* The rows of logits a step wants ("Wanted rows" above). */
typedef enum prog_rows {
    PROG_ROWS_ALL = 0,  /* every row: the wanted-rows instructions run as the others */
    PROG_ROWS_LAST = 1, /* the last: they run at one token, on the last rows */
    PROG_ROWS_NONE = 2, /* none: they do not run */
} prog_rows;

/* The token count instruction `in` runs at in a step of `tokens` tokens that
 * wants `rows`: 1 for a wanted-rows instruction on a step that wants the
 * last row, else `tokens` (call it for an instruction that runs at all). */
static inline int64_t prog_instr_tokens(const prog_instr *in, int64_t tokens, prog_rows rows) {
    return in->wanted_rows && rows == PROG_ROWS_LAST ? 1 : tokens;
}

/* Frees what program_decode allocated and zeroes *p. */
void program_free(program *p);

/* ceil((a * T + b) / c) for T in [1, max_tokens] at its largest, or -1 when a
 * rule overflows int64 somewhere in that range (or has c < 1). The rule is
 * affine, so its extremes are at T = 1 and T = max_tokens. */
int64_t program_affine_max(prog_affine f, int64_t max_tokens);

#endif
