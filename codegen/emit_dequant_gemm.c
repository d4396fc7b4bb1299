/* emit_dequant_gemm.c - the tensor-core dequantize-GEMM of a quantized matmul
 * in the steps above the GEMV's token counts (prefill):
 *
 *   out[t, n] = sum_k x[t, k] * w[n, k] (+ bias[n])     w = (q - z) * s (* c[k])
 *
 * over an int4 weight whose codes are interleaved (quant/quant.h, layout
 * "mma_k16", which `precision` chose at compile time), in the spirit of
 * Marlin. One block of 4 warps computes a tile of BLOCK_M (64) tokens by
 * BLOCK_N (64) output rows, each warp 32 x 32 of it as 2 x 4 m16n8 tiles of
 * mma.m16n8k16 (bf16 in, f32 accumulate). Per k-block of BLOCK_K (128)
 * columns, the x rows and the weight rows of the tile go to shared memory
 * by cp.async, STAGES (3) k-blocks in flight; then
 *
 *   A  by ldmatrix.x4 from the x tile (bf16 activations), or, for f32
 *      activations or column scales, built from it as the sum of bf16
 *      parts (three for f32: x to 2^-24; two for bf16 x times c[k]), each
 *      multiplied by the same B: f32's rounding, as the reference has;
 *   B  one 128-bit shared load per n8 tile and lane holds that lane's
 *      fragments for all 8 k16 steps of the block (the interleaved order):
 *      two codes per register, minus the zero point, exactly in bf16;
 *   s  the group scales multiply each group's partial sums (the m16n8
 *      accumulator of the group's k16 steps) into the f32 result, so the
 *      weights are never rounded: the kernel computes what quant_value
 *      defines, to f32 rounding.
 *
 * Each weight byte is read from DRAM once per step (the blocks of one
 * column of tiles run together and share it through L2), each x row once
 * per column of tiles, from L2 after the first. The bias and a residual are
 * added in the epilogue: the matmul's own bias, and the adds after it that
 * codegen/lower.c hands over as a GEMM's epilogue when it runs a fused
 * group's ops one by one (cg_emit_dequant_gemm_epilogue).
 *
 * int8 and E4M3 weights (one scale per output channel, or groups) run the
 * same kernel over their row-major byte codes: a k-block of 64 rows of 128
 * codes to shared memory by cp.async, each B register two 16-bit shared
 * loads' codes as bf16 (exact: 8 significant bits at most).
 *
 * W8A8 (matmul act_quant "i8" or "f8e4m3", ir/ops.def; the weight's codes
 * of the same kind, one scale per output channel) computes what the
 * reference's matmul_quantized_activations does, to f32 rounding:
 *
 *   out[t, n] = sum_k code(x[t, k] c[k] / s_t) wcode[n, k] * s_t * s_w[n] (+ bias[n])
 *
 *   s_t  the token's activation scale: with act_scale "token" its row's
 *        max_k |x[t, k] c[k]| / 127 (i8) or / 448 (E4M3), 1 for a row of
 *        zeros, which a first pass finds (one warp a row of the block's
 *        BLOCK_M, from L2: x is small) into shared memory while the first
 *        k-blocks land; with "tensor" the static act_scale_value;
 *   code the int8 code rint(.) clamped to +-127 (NaN: 0) or the E4M3 value
 *        rounded to nearest even, saturating: both exact in bf16, so A is
 *        one bf16 fragment of codes. Once a k-block has landed the block
 *        codes its x tile once (code_chunk: each thread 8 columns of every
 *        8th row, x * c / s by division as the reference has it; a product
 *        by 1 / s can differ from it in the last bit), as bf16 over the same
 *        shared bytes for bf16 x or into a bf16 tile of its own after the
 *        stages for f32 x; after a __syncthreads each warp takes its A
 *        fragments from it by ldmatrix.x4 as the bf16 path does, and the
 *        mma multiplies codes by codes: int8 products
 *        are integers below 2^14 and E4M3 ones have 8 significant bits, so
 *        each is exact in f32 and only the order of the f32 sums differs
 *        from the reference's (exact for int8 while they stay below 2^24);
 *   the accumulator times s_t, then s_w[n], in the epilogue, as the GEMV
 *        scales its sums (emit_gemv.c; the reference rounds once, from
 *        double), so that an int8 matmul gives the same floats in both
 *        kernels; then the bias and residual as above.
 *
 * The column scales c[k] are int8's SmoothQuant factors (quant method
 * smooth: the activation side's 1 / s, applied to x as the reference does).
 * The coding is ALU work the cost model (bytes and tensor-core flops) does
 * not count: a division, a rounding and, for E4M3, the software conversions
 * of smelt_kernel.h per element, once per block. In NVRTC's sm_90 PTX for
 * Llama-3-8B's fp8 4096 x 4096 over bf16 x, a k16 step is about 430
 * instructions (8 mma, their ldmatrix and B codes) plus 750 of a thread's
 * share of the coding, against about 1,970 when each warp coded its own
 * fragments. On sm_89 and up the E4M3 coding is the hardware's
 * cvt.rn.satfinite.e4m3x2.f32 (cg_write_activation_code: the PTX ISA's
 * rounding is the reference's; not yet run on a GPU).
 *
 * An act_codes matmul (ir/ops.def; the fallback of the scaled GEMM that
 * codegen/lower.c puts beside it, for devices without one) reads the codes
 * and scales a quantize op wrote instead of x: the k-blocks of the code
 * rows land in shared memory as the weight's do (128 bytes a row, padded
 * by 16), each lane takes its A fragments from them two bytes a register
 * as it takes B's (code_pair: exact in bf16; an E4M3 byte by e4m3_value,
 * branch-free), with no absmax pass and no coding, and the epilogue multiplies the sums by the row's scale
 * from the quantize, then by the weight's, as above: the same codes, products, sums and roundings as the
 * kernel coding x itself, so the same output bit for bit (tests/unit/test_emit_act_codes.c).
 *
 * What it takes (cg_dequant_gemm_fits): int4 codes interleaved (so K is a
 * multiple of 128, and no act-order: a group index would give a k16 step
 * columns of many groups), or int8 / E4M3 codes with K a multiple of 128
 * and no act-order, weight-only or W8A8 as above; groups a multiple of 16
 * columns, x [tokens, K] and out [tokens, N] in f32 or bf16; any N (rows
 * past it are zeros) and any token count (rows past the step are zeros).
 * Other quantized matmuls keep the GEMV kernel at every step (emit_gemv.c).
 */
#include "emit_attention.h" /* attention_write_template, attention_without_semicolon */
#include "emit_internal.h"

#include "interface.h"
#include "quant.h"

#include <string.h>

enum {
    GEMM_THREADS = 128, /* 4 warps, 2 x 2 over the block's tile */
    GEMM_BLOCK_M = 64,  /* tokens per block */
    GEMM_BLOCK_N = 64,  /* output rows per block */
    GEMM_BLOCK_K = 128, /* columns per k-block: one interleaved block of the codes */
    GEMM_STAGES = 3,    /* k-blocks in flight */
};

/* Does a step have more tokens than the GEMV serves? At most the planned
 * token count (plan-memory's; a plan of steps of at most 4 tokens has no
 * use for the kernel, and the program refuses a token range past its
 * bound), or, before plan-memory (the emitter tests), the token dim's. */
static bool steps_above_gemv(const ir_module *m, int32_t tokens) {
    int64_t bound = m->planned_tokens > 0 ? m->planned_tokens : m->symbols[tokens].bound;
    return bound > IR_GEMV_MAX_TOKENS;
}

/* The kind of matmul op's activation codes (act_quant, ir/ops.def):
 * QUANT_INT8, QUANT_FP8, or QUANT_NONE (weight-only). */
static quant_kind dequant_gemm_act_quant(const ir_module *m, uint32_t op) {
    const char *act_quant = ir_op_string(m, op, "act_quant");
    return strcmp(act_quant, "i8") == 0       ? QUANT_INT8
           : strcmp(act_quant, "f8e4m3") == 0 ? QUANT_FP8
                                              : QUANT_NONE;
}

/* The static activation scale of a W8A8 matmul (act_scale "tensor"); 0:
 * each token's own. */
static double dequant_gemm_static_scale(const ir_module *m, uint32_t op) {
    return strcmp(ir_op_string(m, op, "act_scale"), "tensor") == 0 ? ir_op_float(m, op, "act_scale_value")
                                                                   : 0.0;
}

bool cg_dequant_gemm_fits(const ir_module *m, uint32_t op) {
    const ir_op *o = &m->ops[op];
    quant_format f;
    if (o->kind != IR_OP_MATMUL || o->operand_count < 2 ||
        !ir_weight_quant(m, m->values[o->operands[1]].def_op, &f))
        return false;
    /* W8A8 (act_quant) too: ir_verify has checked that the weight's codes
     * are of the activations' kind, one scale per output channel, and that
     * a static scale is positive; the kernel codes the activations. */
    const ir_type *w = &m->values[o->operands[1]].type;
    const ir_type *x = &m->values[o->operands[0]].type, *y = &m->values[o->results[0]].type;
    smelt_dtype xd = cg_storage_dtype(m, o->operands[0]), yd = cg_storage_dtype(m, o->results[0]);
    bool floats = (xd == SMELT_DTYPE_F32 || xd == SMELT_DTYPE_BF16) &&
                  (yd == SMELT_DTYPE_F32 || yd == SMELT_DTYPE_BF16);
    if (ir_matmul_bias(m, op) != IR_NO_VALUE) {
        smelt_dtype bd = cg_storage_dtype(m, ir_matmul_bias(m, op));
        floats = floats && (bd == SMELT_DTYPE_F32 || bd == SMELT_DTYPE_BF16);
    }
    int32_t tokens = ir_token_symbol(m);
    /* int4: interleaved codes (so K % 128 == 0); int8 and E4M3: row-major bytes, K a multiple of the k-block
     */
    bool codes = f.kind == QUANT_INT4 ? f.interleaved
                                      : (f.kind == QUANT_INT8 || f.kind == QUANT_FP8) && w->rank == 2 &&
                                            w->dims[1].size % GEMM_BLOCK_K == 0;
    return codes && !f.has_group_index && f.group % 16 == 0 && floats && x->rank == 2 &&
           x->dims[0].symbol == tokens && tokens >= 0 && y->rank == 2 && y->dims[0].symbol == tokens &&
           (uint32_t)tokens < m->symbol_count && steps_above_gemv(m, tokens);
}

static const char gemm_helpers[] = "\
/* Copies k-block kb of the tile's x rows and weight rows into one stage\n\
 * (cp.async, 16 bytes a copy); rows past the step or past N are zeros. */\n\
SMELT_DEVICE void load_stage(X_TYPE *a, uint8_t *b, const X_TYPE *x, const uint8_t *w, long long row0, long long n0, int kb, int rows)\n\
{\n\
    uint4 zero = {0u, 0u, 0u, 0u};\n\
    for (int i = threadIdx.x; i < BLOCK_M * A_CHUNKS; i += THREADS) {\n\
        int row = i / A_CHUNKS, column = i % A_CHUNKS * A_CHUNK;\n\
        X_TYPE *to = a + row * A_STRIDE + column;\n\
        if (row0 + row < rows) {\n\
            smelt_cp_async_16(to, x + (row0 + row) * K + kb * BLOCK_K + column);\n\
        } else {\n\
            *(uint4 *)to = zero;\n\
        }\n\
    }\n\
    for (int i = threadIdx.x; i < BLOCK_N * (B_ROW_BYTES / 16); i += THREADS) {\n\
        int row = i / (B_ROW_BYTES / 16), chunk = i % (B_ROW_BYTES / 16);\n\
        uint8_t *to = b + row * B_STRIDE + chunk * 16;\n\
        if (n0 + row < N) {\n\
            smelt_cp_async_16(to, w + (n0 + row) * CODE_ROW_BYTES + kb * B_ROW_BYTES + chunk * 16);\n\
        } else {\n\
            *(uint4 *)to = zero;\n\
        }\n\
    }\n\
}\n\
\n";

static const char gemm_int4_helper[] = "\
/* The two int4 codes at bits 0..3 and 16..19 of `pair`, minus the zero\n\
 * point, as the bf16 pair of one B register (lower column in the low half).\n\
 * 0x4b000000 | q is the float 2^23 + q, and biased_zero is 2^23 + z, so the\n\
 * difference is q - z exactly, and |q - z| <= 15 is exact in bf16. */\n\
SMELT_DEVICE uint32_t dequantize_pair(uint32_t pair, float biased_zero)\n\
{\n\
    float low = __uint_as_float(0x4b000000u | (pair & 15u)) - biased_zero;\n\
    float high = __uint_as_float(0x4b000000u | ((pair >> 16) & 15u)) - biased_zero;\n\
    return (__float_as_uint(low) >> 16) | (__float_as_uint(high) & 0xffff0000u);\n\
}\n\
\n";

static const char gemm_byte_helper[] = "\
/* The codes at p[0] and p[1] as the bf16 pair of one B register (lower\n\
 * column in the low half): CODE(q) is an int8 code or an E4M3 byte as a\n\
 * float, exact in bf16 (8 significant bits; E4M3 has 4). */\n\
SMELT_DEVICE uint32_t code_pair(const uint8_t *p)\n\
{\n\
    return (__float_as_uint(CODE(p[0])) >> 16) | (__float_as_uint(CODE(p[1])) & 0xffff0000u);\n\
}\n\
\n";

/* E4M3 codes (weights, or a quantize's activations) as floats for CODE(q):
 * smelt_f8e4m3_to_f32's value without its branches, which cost the k16
 * step more than its mma (about 15 instructions a code, two codes a
 * register, in NVRTC's sm_90 PTX). */
static const char gemm_e4m3_helper[] = "\
/* An E4M3 code as a float, without branches: its 7 magnitude bits as the top\n\
 * of a float's exponent and mantissa, times 2^120 (exact: a normal code's\n\
 * exponent rebiased 7 -> 127; a subnormal one is a float subnormal, which\n\
 * the product makes normal, no flush to zero), NaN for 0x7f, and its sign:\n\
 * smelt_f8e4m3_to_f32's value, bit for bit. */\n\
SMELT_DEVICE float e4m3_value(uint8_t q)\n\
{\n\
    unsigned int magnitude = q & 0x7fu;\n\
    float v = __uint_as_float(magnitude << 20) * __uint_as_float(0x7b800000u); /* 2^120 */\n\
    v = magnitude == 0x7fu ? __uint_as_float(0x7fc00000u) : v;\n\
    return __uint_as_float(__float_as_uint(v) | (unsigned int)(q & 0x80u) << 24);\n\
}\n\
\n";

static const char gemm_activation_pair_helper[] = "\
/* The codes of two activations (already x * c / s) as one A register, the\n\
 * first in the low half: exact in bf16, whose upper 16 bits of the float\n\
 * they are (an int8 code is an integer of at most 8 bits). */\n\
SMELT_DEVICE uint32_t activation_pair(float a, float b)\n\
{\n\
    float code_a = (float)activation_code(a), code_b = (float)activation_code(b);\n\
    return (__float_as_uint(code_a) >> 16) | (__float_as_uint(code_b) & 0xffff0000u);\n\
}\n\
\n\
/* Row `row`'s 8 columns from `column` of the k-block's x tile as their\n\
 * codes, x * c / s rounded as activation_code does, 8 bf16 in one 16-byte\n\
 * store to the tile of codes (over the same bytes for bf16 x). */\n\
SMELT_DEVICE void code_chunk(const X_TYPE *x_tile, smelt_bf16 *code_tile, int row, int column, float s, const float c[8])\n\
{\n\
    float v[8];\n\
    LOAD_X8(x_tile + row * A_STRIDE + column, v);\n\
    uint4 codes = {activation_pair(v[0] * c[0] / s, v[1] * c[1] / s), activation_pair(v[2] * c[2] / s, v[3] * c[3] / s),\n\
                   activation_pair(v[4] * c[4] / s, v[5] * c[5] / s), activation_pair(v[6] * c[6] / s, v[7] * c[7] / s)};\n\
    *(uint4 *)(code_tile + row * CODE_STRIDE + column) = codes;\n\
}\n\
\n";

static const char gemm_split_helper[] = "\
/* Two x values as register r of the SPLIT A fragments: their bf16\n\
 * rounding, then the bf16 rounding of what that leaves, and so on, so that\n\
 * the parts sum to x to 2^-8 per part (each difference is exact in f32). */\n\
SMELT_DEVICE void split_pair(float a, float b, uint32_t parts[SPLIT][4], int r)\n\
{\n\
    for (int p = 0; p < SPLIT; p++) {\n\
        smelt_bf16 a_part = smelt_f32_to_bf16(a), b_part = smelt_f32_to_bf16(b);\n\
        parts[p][r] = smelt_bf16x2_pack(a_part, b_part);\n\
        a -= smelt_bf16_to_f32(a_part);\n\
        b -= smelt_bf16_to_f32(b_part);\n\
    }\n\
}\n\
\n";

/* The body, in pieces the emitter strings together: the head; the group
 * sums (weight-only: W8A8 sums into acc, its one scale in the epilogue);
 * the first k-blocks in flight, and W8A8's row scales meanwhile; the main
 * loop up to the B fragments of a k16 step; the A fragments and the mma
 * (split, by ldmatrix, or by ldmatrix from W8A8's tile of codes, which
 * the block writes at the top of the k-block); the group's end (weight-only);
 * W8A8's scales; the epilogue. Its holes are the macros the emitter defines (X_TYPE,
 * LOAD_X, UNPACK_X, ZERO_POINT, COLUMN_SCALE, SUMS, CODE_MAX,
 * ACTIVATION_SCALE, CODE_TILE, LOAD_X8, ROW_SCALE, BIAS, RESIDUAL, STORE_OUTPUT). */
static const char gemm_body_head[] = "\
SMELT_DYNAMIC_SHARED(unsigned char, shared);\n\
X_TYPE *a_stages = (X_TYPE *)shared;                         /* [STAGES][BLOCK_M][A_STRIDE] */\n\
uint8_t *b_stages = (uint8_t *)(shared + STAGES * A_STAGE_BYTES); /* [STAGES][BLOCK_N][B_STRIDE] */\n\
long long row0 = (long long)blockIdx.x * BLOCK_M, n0 = (long long)blockIdx.y * BLOCK_N;\n\
int rows = (int)STEP_ROWS;\n\
int lane = threadIdx.x % 32, warp = threadIdx.x / 32;\n\
int group_id = lane / 4, thread_in_group = lane % 4; /* the mma fragment coordinates */\n\
int warp_m = warp / 2 * WARP_M, warp_n = warp % 2 * WARP_N; /* the warp's tile in the block's */\n\
const uint16_t *scales = (const uint16_t *)(w + SCALES_AT);\n\
float acc[M_TILES][N_TILES][4]; /* the result, before the epilogue */\n\
for (int i = 0; i < M_TILES; i++) {\n\
    for (int j = 0; j < N_TILES; j++) {\n\
        for (int e = 0; e < 4; e++) {\n\
            acc[i][j][e] = 0.0f;\n\
        }\n\
    }\n\
}\n\
";

static const char gemm_part_state[] = "\
float part[M_TILES][N_TILES][4]; /* the current group's sums, before its scale */\n\
for (int i = 0; i < M_TILES; i++) {\n\
    for (int j = 0; j < N_TILES; j++) {\n\
        for (int e = 0; e < 4; e++) {\n\
            part[i][j][e] = 0.0f;\n\
        }\n\
    }\n\
}\n\
";

static const char gemm_int4_state[] = "\
float biased_zero[N_TILES]; /* 2^23 + the zero point of each of this lane's B rows in this group */\n\
for (int j = 0; j < N_TILES; j++) {\n\
    biased_zero[j] = 8388608.0f;\n\
}\n\
";

static const char gemm_body_prologue[] = "\
for (int s = 0; s < STAGES - 1; s++) {\n\
    if (s < K_BLOCKS) {\n\
        load_stage(a_stages + s * BLOCK_M * A_STRIDE, b_stages + s * BLOCK_N * B_STRIDE, A_ROWS, w, row0, n0, s, rows);\n\
    }\n\
    smelt_cp_async_commit();\n\
}\n\
";

/* W8A8, per token: each row's scale while the first k-blocks land. */
static const char gemm_token_scales[] = "\
/* the activation scale of each of the block's rows: max_k |x * c| / CODE_MAX, 1 for a row of zeros\n\
 * (or past the step); a warp a row, 16 bytes a lane at a time */\n\
__shared__ float row_scales[BLOCK_M];\n\
for (int r = warp; r < BLOCK_M; r += THREADS / 32) {\n\
    float absmax = 0.0f;\n\
    if (row0 + r < rows) {\n\
        const X_TYPE *x_row = x + (row0 + r) * K;\n\
        for (int c = lane; c < K / A_CHUNK; c += 32) {\n\
            float v[A_CHUNK];\n\
            UNPACK_X(*(const uint4 *)(x_row + c * A_CHUNK), v);\n\
            for (int q = 0; q < A_CHUNK; q++) {\n\
                absmax = fmaxf(absmax, fabsf(v[q] * COLUMN_SCALE(c * A_CHUNK + q)));\n\
            }\n\
        }\n\
    }\n\
    for (int offset = 16; offset > 0; offset /= 2) {\n\
        absmax = fmaxf(absmax, smelt_shfl_xor_f32(0xffffffffu, absmax, offset));\n\
    }\n\
    if (lane == 0) {\n\
        row_scales[r] = absmax > 0.0f ? absmax / CODE_MAX : 1.0f;\n\
    }\n\
}\n\
__syncthreads();\n\
float row_scale[M_TILES][2]; /* of this lane's A rows: group_id and group_id + 8 of each m tile */\n\
for (int i = 0; i < M_TILES; i++) {\n\
    row_scale[i][0] = row_scales[warp_m + i * 16 + group_id];\n\
    row_scale[i][1] = row_scales[warp_m + i * 16 + group_id + 8];\n\
}\n\
";

/* An act_codes matmul: each row's scale is the quantize's. */
static const char gemm_code_scales[] = "\
float row_scale[M_TILES][2]; /* of this lane's A rows (group_id and group_id + 8 of each m tile): the quantize's */\n\
for (int i = 0; i < M_TILES; i++) {\n\
    long long row = row0 + warp_m + i * 16 + group_id;\n\
    row_scale[i][0] = row < rows ? code_scales[row] : 0.0f;\n\
    row_scale[i][1] = row + 8 < rows ? code_scales[row + 8] : 0.0f;\n\
}\n\
";

/* W8A8, per tensor: one static scale for every row. */
static const char gemm_static_scales[] = "\
float row_scale[M_TILES][2]; /* of this lane's A rows: the static scale */\n\
for (int i = 0; i < M_TILES; i++) {\n\
    row_scale[i][0] = ACTIVATION_SCALE;\n\
    row_scale[i][1] = ACTIVATION_SCALE;\n\
}\n\
";

static const char gemm_body_loop[] = "\
for (int kb = 0; kb < K_BLOCKS; kb++) {\n\
    smelt_cp_async_wait_group(STAGES - 2); /* k-block kb has landed; the next ones may be in flight */\n\
    __syncthreads();                       /* for every thread; and k-block kb - 1 is done with */\n\
    int next = kb + STAGES - 1;\n\
    if (next < K_BLOCKS) {\n\
        load_stage(a_stages + next % STAGES * BLOCK_M * A_STRIDE, b_stages + next % STAGES * BLOCK_N * B_STRIDE, A_ROWS, w, row0, n0, next, rows);\n\
    }\n\
    smelt_cp_async_commit();\n\
    const X_TYPE *a_tile = a_stages + kb % STAGES * BLOCK_M * A_STRIDE;\n\
    const uint8_t *b_tile = b_stages + kb % STAGES * BLOCK_N * B_STRIDE;\n\
";

static const char gemm_int4_codes[] = "\
    /* this lane's 16 bytes of each of its B rows: its fragments for the block's 8 steps */\n\
    uint32_t codes[N_TILES][4];\n\
    for (int j = 0; j < N_TILES; j++) {\n\
        uint4 chunk = *(const uint4 *)(b_tile + (warp_n + j * 8 + group_id) * B_STRIDE + thread_in_group * 16);\n\
        codes[j][0] = chunk.x;\n\
        codes[j][1] = chunk.y;\n\
        codes[j][2] = chunk.z;\n\
        codes[j][3] = chunk.w;\n\
    }\n\
";

static const char gemm_step[] = "\
    for (int step = 0; step < BLOCK_K / 16; step++) {\n\
";

static const char gemm_group_of_step[] = "\
        int column = kb * BLOCK_K + step * 16, group = column / GROUP;\n\
";

static const char gemm_int4_fragments[] = "\
        /* a group starts: the zero points of this lane's B rows */\n\
        if (column % GROUP == 0) {\n\
            for (int j = 0; j < N_TILES; j++) {\n\
                biased_zero[j] = 8388608.0f + (float)ZERO_POINT(n0 + warp_n + j * 8 + group_id, group);\n\
            }\n\
        }\n\
        uint32_t b[N_TILES][2];\n\
        for (int j = 0; j < N_TILES; j++) {\n\
            uint32_t word = codes[j][step / 2] >> (step % 2 * 8);\n\
            b[j][0] = dequantize_pair(word, biased_zero[j]);\n\
            b[j][1] = dequantize_pair(word >> 4, biased_zero[j]);\n\
        }\n\
";

static const char gemm_byte_fragments[] = "\
        uint32_t b[N_TILES][2]; /* rows of codes: this lane's columns 2 c, 2 c + 1 and + 8, + 9 of the step */\n\
        for (int j = 0; j < N_TILES; j++) {\n\
            const uint8_t *row = b_tile + (warp_n + j * 8 + group_id) * B_STRIDE + step * 16 + 2 * thread_in_group;\n\
            b[j][0] = code_pair(row);\n\
            b[j][1] = code_pair(row + 8);\n\
        }\n\
";

static const char gemm_split_fragments[] = "\
        int k = step * 16 + 2 * thread_in_group; /* this lane's first A column in the tile */\n\
        float c[4]; /* the column scales of this lane's columns 2 c, 2 c + 1, 2 c + 8, 2 c + 9 */\n\
        for (int q = 0; q < 4; q++) {\n\
            c[q] = COLUMN_SCALE(column + 2 * thread_in_group + q % 2 + q / 2 * 8);\n\
        }\n\
        for (int i = 0; i < M_TILES; i++) {\n\
            const X_TYPE *r0 = a_tile + (warp_m + i * 16 + group_id) * A_STRIDE + k, *r1 = r0 + 8 * A_STRIDE;\n\
            uint32_t a[SPLIT][4];\n\
            split_pair(LOAD_X(r0[0]) * c[0], LOAD_X(r0[1]) * c[1], a, 0);\n\
            split_pair(LOAD_X(r1[0]) * c[0], LOAD_X(r1[1]) * c[1], a, 1);\n\
            split_pair(LOAD_X(r0[8]) * c[2], LOAD_X(r0[9]) * c[3], a, 2);\n\
            split_pair(LOAD_X(r1[8]) * c[2], LOAD_X(r1[9]) * c[3], a, 3);\n\
            for (int j = 0; j < N_TILES; j++) {\n\
                for (int p = 0; p < SPLIT; p++) {\n\
                    smelt_mma_m16n8k16_bf16_f32(SUMS[i][j], a[p], b[j], SUMS[i][j]);\n\
                }\n\
            }\n\
";

/* W8A8: the k-block's x tile as codes, once for the block (not each warp
 * its fragments: the two warps of a row of the 2 x 2 share them). */
static const char gemm_code_tile[] = "\
    /* the k-block's activations as their codes: each thread 8 columns of every 8th row */\n\
    smelt_bf16 *code_tile = CODE_TILE;\n\
    {\n\
        int column = threadIdx.x % (BLOCK_K / 8) * 8;\n\
        float c[8]; /* the column scales of this thread's columns */\n\
        for (int q = 0; q < 8; q++) {\n\
            c[q] = COLUMN_SCALE(kb * BLOCK_K + column + q);\n\
        }\n\
        for (int row = threadIdx.x / (BLOCK_K / 8); row < BLOCK_M; row += THREADS / (BLOCK_K / 8)) {\n\
            code_chunk(a_tile, code_tile, row, column, ROW_SCALE(row), c);\n\
        }\n\
    }\n\
    __syncthreads(); /* the codes, for every warp */\n\
";

static const char gemm_code_fragments[] = "\
        int matrix = lane / 8, matrix_row = lane % 8; /* the row this lane addresses for ldmatrix */\n\
        for (int i = 0; i < M_TILES; i++) {\n\
            uint32_t a[4];\n\
            const smelt_bf16 *a_row = code_tile + (warp_m + i * 16 + (matrix & 1) * 8 + matrix_row) * CODE_STRIDE;\n\
            smelt_ldmatrix_x4(a, a_row + step * 16 + (matrix >> 1) * 8);\n\
            for (int j = 0; j < N_TILES; j++) {\n\
                smelt_mma_m16n8k16_bf16_f32(SUMS[i][j], a, b[j], SUMS[i][j]);\n\
            }\n\
";

/* An act_codes matmul: A from the shared rows of the quantize's codes, two
 * bytes a register as the B side's (code_pair: exact in bf16). */
static const char gemm_byte_a_fragments[] = "\
        int k = step * 16 + 2 * thread_in_group; /* this lane's first A column in the tile */\n\
        for (int i = 0; i < M_TILES; i++) {\n\
            const uint8_t *r0 = a_tile + (warp_m + i * 16 + group_id) * A_STRIDE + k, *r1 = r0 + 8 * A_STRIDE;\n\
            uint32_t a[4] = {code_pair(r0), code_pair(r1), code_pair(r0 + 8), code_pair(r1 + 8)};\n\
            for (int j = 0; j < N_TILES; j++) {\n\
                smelt_mma_m16n8k16_bf16_f32(SUMS[i][j], a, b[j], SUMS[i][j]);\n\
            }\n\
";

static const char gemm_ldmatrix_fragments[] = "\
        int matrix = lane / 8, matrix_row = lane % 8; /* the row this lane addresses for ldmatrix */\n\
        for (int i = 0; i < M_TILES; i++) {\n\
            uint32_t a[4];\n\
            const X_TYPE *a_row = a_tile + (warp_m + i * 16 + (matrix & 1) * 8 + matrix_row) * A_STRIDE;\n\
            smelt_ldmatrix_x4(a, a_row + step * 16 + (matrix >> 1) * 8);\n\
            for (int j = 0; j < N_TILES; j++) {\n\
                smelt_mma_m16n8k16_bf16_f32(SUMS[i][j], a, b[j], SUMS[i][j]);\n\
            }\n\
";

static const char gemm_fragments_end[] = "\
        }\n\
";

static const char gemm_group_end[] = "\
        /* the group ends: its sums times their rows' scales */\n\
        if ((column + 16) % GROUP == 0) {\n\
            for (int j = 0; j < N_TILES; j++) {\n\
                for (int e = 0; e < 2; e++) {\n\
                    long long n = n0 + warp_n + j * 8 + 2 * thread_in_group + e;\n\
                    float scale = n < N ? smelt_f16_to_f32(scales[n * GROUPS + group]) : 0.0f;\n\
                    for (int i = 0; i < M_TILES; i++) {\n\
                        acc[i][j][e] += part[i][j][e] * scale;\n\
                        acc[i][j][e + 2] += part[i][j][e + 2] * scale;\n\
                        part[i][j][e] = 0.0f;\n\
                        part[i][j][e + 2] = 0.0f;\n\
                    }\n\
                }\n\
            }\n\
        }\n\
";

static const char gemm_loops_end[] = "\
    }\n\
}\n\
";

/* W8A8: the whole sums times the token's scale, then the row's (as the GEMV scales its sums). */
static const char gemm_w8a8_scales[] = "\
/* the sums times each row's activation scale, then the output row's weight scale */\n\
for (int j = 0; j < N_TILES; j++) {\n\
    for (int e = 0; e < 2; e++) {\n\
        long long n = n0 + warp_n + j * 8 + 2 * thread_in_group + e;\n\
        float scale = n < N ? smelt_f16_to_f32(scales[n]) : 0.0f;\n\
        for (int i = 0; i < M_TILES; i++) {\n\
            acc[i][j][e] = acc[i][j][e] * row_scale[i][0] * scale;\n\
            acc[i][j][e + 2] = acc[i][j][e + 2] * row_scale[i][1] * scale;\n\
        }\n\
    }\n\
}\n\
";

static const char gemm_body_tail[] = "\
smelt_cp_async_wait_all();\n\
/* element e of acc[i][j] is row group_id + (e / 2) * 8 of m tile i, column 2 * thread_in_group + e % 2 of n tile j */\n\
for (int i = 0; i < M_TILES; i++) {\n\
    for (int j = 0; j < N_TILES; j++) {\n\
        for (int e = 0; e < 4; e++) {\n\
            long long row = row0 + warp_m + i * 16 + group_id + e / 2 * 8;\n\
            long long n = n0 + warp_n + j * 8 + 2 * thread_in_group + e % 2;\n\
            if (row < rows && n < N) {\n\
                STORE_OUTPUT(row * N + n, acc[i][j][e] + BIAS(n) + RESIDUAL(row * N + n));\n\
            }\n\
        }\n\
    }\n\
}\n";

/* ceil((a T + b) / c) bytes as a polynomial in T (without the ceiling), as
 * plan/program_cost.c counts an extent. */
static prog_poly extent_poly(prog_affine f) {
    double c = f.c >= 1 ? (double)f.c : 1.0;
    return (prog_poly){.constant = (double)f.b / c, .per_token = (double)f.a / c};
}

/* The cost of a W8A8 GEMM with per-token scales: the default (each
 * parameter's bytes once, the flops declared) plus x's once more, read by
 * the absmax pass. That pass re-reads each block's rows, which the tiles
 * then read again: from L2 when x fits there (T K elements, 4 MB for 512
 * tokens of Llama-3-8B's 4096 columns in bf16, against an H200's 50 MB),
 * from DRAM when it does not; counted as DRAM so the model never promises
 * the pass for free. */
static const prog_cost *dequant_gemm_cost(cg_emit *e, const cg_kernel *kernel, uint32_t x) {
    prog_cost *cost = arena_alloc(e->a, sizeof *cost);
    *cost = (prog_cost){.flops = kernel->flops, .tensor_cores = true};
    for (uint32_t i = 0; i < kernel->param_count; i++) {
        const cg_param *p = &kernel->params[i];
        if (p->kind != CG_PARAM_VALUE) continue;
        prog_poly bytes = extent_poly(p->extent);
        if (p->writes)
            cost->written = prog_poly_sum(cost->written, bytes);
        else
            cost->read = prog_poly_sum(cost->read, prog_poly_scaled(bytes, i == x ? 2.0 : 1.0));
    }
    return cost;
}

bool cg_emit_dequant_gemm(cg_emit *e) {
    const ir_module *m = e->m;
    ir_value_id xv = cg_operand(e, 0), wv = cg_operand(e, 1), yv = cg_result(e, 0);
    ir_value_id bv = ir_matmul_bias(m, e->op), residual_v = IR_NO_VALUE;
    /* an act_codes matmul (ir/ops.def): A is the quantize's codes, with its scales, not x */
    ir_value_id codes_v, code_scales_v;
    bool from_codes = ir_matmul_act_codes(m, e->op, &codes_v, &code_scales_v);
    /* the adds after the matmul in the group (cg_emit_dequant_gemm_epilogue): a
     * bias ([N] weight) or a residual, into the last one's result */
    for (uint32_t i = 1; e->dequant_epilogue && i < e->group->op_count; i++) {
        const ir_op *add = &m->ops[e->group->ops[i]];
        ir_value_id other = add->operands[0] == yv ? add->operands[1] : add->operands[0];
        const ir_value *o = &m->values[other];
        if (m->ops[o->def_op].kind == IR_OP_WEIGHT && o->type.rank == 1 && bv == IR_NO_VALUE)
            bv = other;
        else
            residual_v = other;
        yv = add->results[0];
    }
    quant_format f;
    if (!ir_weight_quant(m, m->values[wv].def_op, &f))
        SMELT_DIE("cg_emit_dequant_gemm: weight is not quantized");
    const ir_type *wt = &m->values[wv].type;
    int64_t n = wt->dims[0].size, k = wt->dims[1].size;
    quant_layout l;
    if (quant_layout_of(&f, (uint64_t)n, (uint64_t)k, &l))
        return cg_expect(e, false, "matmul: a quantized weight whose format does not fit it");
    /* the A rows the tiles load: x, or the quantize's byte codes */
    smelt_dtype xd = from_codes ? cg_storage_dtype(m, codes_v) : cg_storage_dtype(m, xv);
    /* W8A8: the activations' codes (the weight's kind), per token or of a static scale */
    quant_kind act = dequant_gemm_act_quant(m, e->op);
    double static_scale = act != QUANT_NONE ? dequant_gemm_static_scale(m, e->op) : 0.0;
    if (from_codes && !cg_expect(e,
                                 act != QUANT_NONE && f.kind == act && !f.has_column_scale &&
                                     xd == (act == QUANT_INT8 ? SMELT_DTYPE_I8 : SMELT_DTYPE_F8E4M3),
                                 "act_codes over the weight's kind of codes, without column scales"))
        return false;
    int64_t a_element = from_codes ? 1 : xd == SMELT_DTYPE_F32 ? 4 : 2; /* bytes of a shared A element */
    /* A in bf16 parts: three for f32 activations (x to 2^-24, f32's own
     * rounding), two for bf16 ones times column scales (to 2^-16); none
     * (ldmatrix) for bf16 activations alone, which are exact in bf16; none
     * for W8A8 (one fragment of codes). */
    int split = act != QUANT_NONE ? 0 : xd == SMELT_DTYPE_F32 ? 3 : f.has_column_scale ? 2 : 0;
    int64_t pad = 16 / a_element; /* elements after each shared A row (16 bytes; codes: as B's rows) */
    int64_t a_stage = GEMM_BLOCK_M * (GEMM_BLOCK_K + pad) * a_element;
    bool int4 = f.kind == QUANT_INT4;
    int64_t b_row = int4 ? GEMM_BLOCK_K / 2 : GEMM_BLOCK_K; /* a k-block of one row's codes, in bytes */
    /* shared code rows: int4's 64 bytes are read 16 a lane, conflict-free; byte
     * rows are padded by 16 so that the 8 rows a warp's 16-bit loads touch
     * fall in different banks */
    int64_t b_stride = int4 ? b_row : b_row + 16;
    int64_t b_stage = GEMM_BLOCK_N * b_stride;

    ir_value_id typed[3] = {from_codes ? codes_v : xv, wv, yv};
    /* W8A8 as emit_gemv.c names it: _ai8 or _af8, s for a static scale */
    const char *w8a8 = act == QUANT_NONE
                           ? ""
                           : arena_printf(&e->scratch, "_a%s%s%s", act == QUANT_INT8 ? "i8" : "f8",
                                          static_scale > 0.0 ? "s" : "", from_codes ? "_codes" : "");
    const char *name =
        arena_printf(&e->scratch, "dequant_gemm_%s_n%lld_k%lld_g%u%s%s%s%s", cg_dtype_tag(e, typed, 3),
                     (long long)n, (long long)k, f.group, f.has_zero ? "z" : "",
                     f.has_column_scale ? "c" : "", w8a8, bv != IR_NO_VALUE ? "_bias" : "");
    if (residual_v != IR_NO_VALUE) name = arena_printf(&e->scratch, "%s_residual", name);
    cg_kernel_builder b;
    cg_kernel_begin(
        &b, e, name,
        int4 ? "Tensor-core dequantize-GEMM (prefill steps): one block per 64 tokens x 64 output "
               "rows, 4 warps of 32 x 32; mma.m16n8k16 bf16 with f32 accumulation; int4 codes "
               "interleaved (layout mma_k16) so that one 128-bit load is a lane's B fragments "
               "for 128 columns; 3 k-blocks of 128 columns in flight by cp.async; group scales "
               "applied to each group's partial sums"
        : from_codes
            ? "Tensor-core W8A8 GEMM over a quantize's codes (prefill steps, where the device runs no "
              "scaled GEMM): one block per 64 tokens x 64 output rows, 4 warps of 32 x 32; "
              "mma.m16n8k16 bf16 with f32 accumulation over the activations' byte codes and the "
              "weight's, both exact in bf16; 3 k-blocks of 128 columns in flight by cp.async; the "
              "quantize's row scales and the weight's channel scales applied to the whole sums"
        : act != QUANT_NONE
            ? "Tensor-core W8A8 GEMM (prefill steps): one block per 64 tokens x 64 output rows, 4 "
              "warps of 32 x 32; mma.m16n8k16 bf16 with f32 accumulation over the activations' "
              "codes (x * c / s, each token's scale from a first pass over its row, or a static "
              "one) and the weight's byte codes, both exact in bf16; 3 k-blocks of 128 columns "
              "in flight by cp.async; both scales applied to the whole sums"
            : "Tensor-core dequantize-GEMM (prefill steps): one block per 64 tokens x 64 output "
              "rows, 4 warps of 32 x 32; mma.m16n8k16 bf16 with f32 accumulation; byte codes "
              "(exact in bf16) read from shared rows; 3 k-blocks of 128 columns in flight by "
              "cp.async; group scales applied to each group's partial sums");
    b.k->family = "gemm";
    uint32_t x = from_codes ? cg_param_value(&b, "codes", codes_v, true) : cg_param_value(&b, "x", xv, true);
    if (from_codes) cg_param_value(&b, "code_scales", code_scales_v, true);
    uint32_t w = cg_param_value(&b, "w", wv, true);
    uint32_t bias = bv != IR_NO_VALUE ? cg_param_value(&b, "bias", bv, true) : UINT32_MAX;
    uint32_t residual =
        residual_v != IR_NO_VALUE ? cg_param_value(&b, "residual", residual_v, true) : UINT32_MAX;
    uint32_t out = cg_param_value(&b, "out", yv, false);
    cg_param_tokens(&b);
    cg_shape xs = cg_shape_of(e, xv);
    cg_count rows = cg_shape_count(&xs, 0, 1);
    cg_kernel_launch(&b, cg_count_blocks(rows, GEMM_BLOCK_M), (prog_affine){0, n, GEMM_BLOCK_N},
                     GEMM_THREADS);
    /* W8A8 over f32 x: a bf16 tile of codes after the stages (bf16 x is coded in place) */
    int64_t code_tile =
        act != QUANT_NONE && !from_codes && xd == SMELT_DTYPE_F32 ? GEMM_BLOCK_M * (GEMM_BLOCK_K + 8) * 2 : 0;
    b.k->rule.dynamic_shared_bytes = (uint32_t)(GEMM_STAGES * (a_stage + b_stage) + code_tile);
    b.k->min_tokens = IR_GEMV_MAX_TOKENS + 1;
    cg_kernel_open(&b);
    cg_text *t = &b.text;
    cg_line(
        t,
        "enum { K = %lld, N = %lld, GROUP = %u, GROUPS = K / GROUP }; /* %s codes, an f16 scale per GROUP "
        "columns%s */",
        (long long)k, (long long)n, f.group, quant_kind_name(f.kind), f.has_zero ? " with a zero point" : "");
    cg_line(
        t, "enum { SCALES_AT = %llu, ZEROS_AT = %llu, COLUMN_SCALES_AT = %llu }; /* the weight's sections */",
        (unsigned long long)l.scales, (unsigned long long)l.zeros, (unsigned long long)l.column_scale);
    cg_line(t,
            "enum { THREADS = %d, BLOCK_M = %d, BLOCK_N = %d, BLOCK_K = %d, STAGES = %d, K_BLOCKS = K / "
            "BLOCK_K };",
            GEMM_THREADS, GEMM_BLOCK_M, GEMM_BLOCK_N, GEMM_BLOCK_K, GEMM_STAGES);
    cg_line(t, "enum { WARP_M = 32, WARP_N = 32, M_TILES = WARP_M / 16, N_TILES = WARP_N / 8 }; /* m16n8 "
               "tiles a warp */");
    cg_line(t,
            "enum { A_STRIDE = BLOCK_K + %lld, A_CHUNK = 16 / %d, A_CHUNKS = BLOCK_K / A_CHUNK }; /* padded "
            "shared %s rows */",
            (long long)pad, (int)a_element, from_codes ? "code" : "x");
    cg_line(t,
            "enum { A_STAGE_BYTES = %lld, B_ROW_BYTES = %lld, B_STRIDE = %lld, CODE_ROW_BYTES = %lld }; /* a "
            "stage: x tile, then code rows */",
            (long long)a_stage, (long long)b_row, (long long)b_stride, (long long)(int4 ? k / 2 : k));
    if (split)
        cg_line(t, "enum { SPLIT = %d }; /* A as the sum of SPLIT bf16 parts: %s */", split,
                xd == SMELT_DTYPE_F32 ? "f32 activations" : "bf16 activations times column scales");
    else if (from_codes)
        cg_line(t, "/* A from the shared rows of the quantize's %s codes, two a register (exact in bf16) */",
                act == QUANT_INT8 ? "int8" : "E4M3");
    else if (act != QUANT_NONE) {
        cg_line(t, "/* A by ldmatrix from the tile of the %s codes of the activations (exact in bf16): %s */",
                act == QUANT_INT8 ? "int8" : "E4M3",
                xd == SMELT_DTYPE_F32 ? "its own, after the stages" : "over the k-block's x tile");
        cg_line(t, "enum { CODE_STRIDE = BLOCK_K + 8%s };",
                xd == SMELT_DTYPE_F32 ? ", CODE_TILE_AT = STAGES * (A_STAGE_BYTES + BLOCK_N * B_STRIDE)"
                                      : "");
        cg_line(t, "#define CODE_TILE %s",
                xd == SMELT_DTYPE_F32 ? "((smelt_bf16 *)(shared + CODE_TILE_AT))"
                                      : "(a_stages + kb % STAGES * BLOCK_M * A_STRIDE)");
        cg_line(t, "#define LOAD_X8(p, v) %s /* 8 x of a row as floats */",
                xd == SMELT_DTYPE_F32 ? "(smelt_unpack_f32x4(((const uint4 *)(p))[0], v), "
                                        "smelt_unpack_f32x4(((const uint4 *)(p))[1], (v) + 4))"
                                      : "smelt_unpack_bf16x8(*(const uint4 *)(p), v)");
        cg_line(t, "#define ROW_SCALE(r) %s", static_scale > 0.0 ? "ACTIVATION_SCALE" : "row_scales[r]");
    } else
        cg_line(t, "/* A by ldmatrix from the bf16 activations */");
    cg_line(t, "#define X_TYPE %s", from_codes ? "uint8_t" : cg_dtype_ctype(xd));
    cg_line(t, "#define A_ROWS %s /* what the A tiles load */", from_codes ? "codes" : "x");
    if (!from_codes) /* (the quantize's codes and scales leave nothing to compute) */
        cg_line(t, "#define LOAD_X(v) %s", xd == SMELT_DTYPE_F32 ? "(v)" : "smelt_bf16_to_f32(v)");
    if (act != QUANT_NONE && !from_codes && static_scale > 0.0)
        cg_line(t, "#define ACTIVATION_SCALE %s /* act_scale tensor: every row's */",
                cg_float_literal(e, (float)static_scale));
    else if (act != QUANT_NONE && !from_codes)
        cg_line(t, "#define UNPACK_X(chunk, v) smelt_unpack_%sx%d(chunk, v) /* A_CHUNK of a row */",
                xd == SMELT_DTYPE_F32 ? "f32" : "bf16", xd == SMELT_DTYPE_F32 ? 4 : 8);
    if (act != QUANT_NONE && !from_codes && static_scale <= 0.0)
        cg_line(t, "#define CODE_MAX %s /* a row's scale: its absmax over CODE_MAX */",
                act == QUANT_INT8 ? "127.0f" : "448.0f");
    cg_line(t, "#define STEP_ROWS (%s) /* tokens in this step */", cg_count_text(e, rows));
    if (int4 && f.has_zero)
        cg_line(t, "#define ZERO_POINT(n, group) ((n) < N ? (w[ZEROS_AT + ((n) * GROUPS + (group)) / 2] >> "
                   "(((n) * GROUPS + (group)) %% 2 * 4)) & 15 : 8)");
    else if (int4)
        cg_line(t, "#define ZERO_POINT(n, group) 8 /* symmetric codes */");
    else
        cg_line(t, "#define CODE(q) %s",
                f.kind == QUANT_INT8 ? "((float)(int8_t)(q))" : "e4m3_value(q) /* smelt_f8e4m3_to_f32's */");
    if (f.has_column_scale)
        cg_line(t, "#define COLUMN_SCALE(k) ((const float *)(w + COLUMN_SCALES_AT))[k]");
    else
        cg_line(t, "#define COLUMN_SCALE(k) 1.0f /* no column scales */");
    if (act != QUANT_NONE) {
        cg_line(t, "#define SUMS acc /* the whole sum: one scale per output channel, at the end */");
    } else {
        cg_line(t, "#define SUMS part /* each group's, times its scale at the group's end */");
    }
    cg_line(t, "#define BIAS(n) %s", bias != UINT32_MAX ? cg_load(&b, bias, "(n)") : "0.0f");
    cg_line(t, "#define RESIDUAL(i) %s", residual != UINT32_MAX ? cg_load(&b, residual, "(i)") : "0.0f");
    cg_line(t, "#define STORE_OUTPUT(i, value) %s",
            attention_without_semicolon(e, cg_store(&b, out, "(i)", "(value)")));
    cg_blank(t);
    attention_write_template(t, gemm_helpers);
    if (f.kind == QUANT_FP8) attention_write_template(t, gemm_e4m3_helper);
    attention_write_template(t, int4 ? gemm_int4_helper : gemm_byte_helper);
    if (split) attention_write_template(t, gemm_split_helper);
    if (act != QUANT_NONE && !from_codes) {
        cg_write_activation_code(t, act == QUANT_INT8); /* the GEMV's, the reference's rounding */
        cg_blank(t);
        attention_write_template(t, gemm_activation_pair_helper);
    }
    cg_kernel_signature(&b);
    attention_write_template(t, gemm_body_head);
    if (act == QUANT_NONE) attention_write_template(t, gemm_part_state);
    if (int4) attention_write_template(t, gemm_int4_state);
    attention_write_template(t, gemm_body_prologue);
    if (act != QUANT_NONE)
        attention_write_template(t, from_codes           ? gemm_code_scales
                                    : static_scale > 0.0 ? gemm_static_scales
                                                         : gemm_token_scales);
    attention_write_template(t, gemm_body_loop);
    if (int4) attention_write_template(t, gemm_int4_codes);
    if (act != QUANT_NONE && !from_codes) attention_write_template(t, gemm_code_tile);
    attention_write_template(t, gemm_step);
    if (act == QUANT_NONE) attention_write_template(t, gemm_group_of_step);
    attention_write_template(t, int4 ? gemm_int4_fragments : gemm_byte_fragments);
    attention_write_template(t, from_codes          ? gemm_byte_a_fragments
                                : act != QUANT_NONE ? gemm_code_fragments
                                : split             ? gemm_split_fragments
                                                    : gemm_ldmatrix_fragments);
    attention_write_template(t, gemm_fragments_end);
    if (act == QUANT_NONE) attention_write_template(t, gemm_group_end);
    attention_write_template(t, gemm_loops_end);
    if (act != QUANT_NONE) attention_write_template(t, gemm_w8a8_scales);
    attention_write_template(t, gemm_body_tail);
    cg_kernel_end(&b);
    (void)x;
    (void)w;
    /* Modeled: x, the weight, the bias and a residual read once, out written
     * once (the default from the parameters), 2 T N K flops on tensor cores;
     * W8A8 per token reads x once more, its absmax pass (dequant_gemm_cost). */
    cg_kernel *kernel = &e->out->kernels[e->out->kernel_count - 1];
    kernel->flops = (prog_poly){.per_token = 2.0 * (double)n * (double)k};
    kernel->tensor_cores = true;
    if (act != QUANT_NONE && !from_codes && static_scale <= 0.0)
        kernel->cost = dequant_gemm_cost(e, kernel, x);
    return true;
}
