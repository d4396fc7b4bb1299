/* test_scaled_gemm.c - scaled GEMMs (W8A8: prog_gemm.has_scales) and the
 * instructions guarded by what a device can do (prog_instr.needs): their
 * encoding and the decoder's refusals, `smelt inspect`'s lines and the cost
 * model, the executor's choice of side (a recording device, the
 * SMELT_NO_SCALED_GEMM knob, prepare_gemm and its fallback), and the host
 * device's scaled product against values worked out in double precision.
 * The cuda device's FP8 path is tested on the stand-in driver
 * (tests/unit/fake_cuda.c): here through an engine, its attributes and
 * numbers in test_runtime.c.
 *
 * The scaled toy model (vocab 4, K 16): a kernel makes, for token t of id
 * `id`, codes a[t, k] = table[(3 id + k) % 8] with a_scale[t] = 0.5 + id and
 * a residual r[t, j] = id - j / 4; a weight of codes w[j, k] =
 * table[(5 j + 3 k) % 8] with f16 scales ws[j] and an f32 bias make
 * logits[t, j] = (sum_k a[t, k] w[j, k]) a_scale[t] ws[j] + bias[j] + r[t, j],
 * by the scaled GEMM or by its fallback kernel. The table's codes are E4M3
 * values that are multiples of 1/4 (and, read as int8, small integers), so
 * every sum is exact in f32 in any order and both sides give the very same
 * bits as the double-precision loop here.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "device.h"
#include "executor.h"
#include "fake_cuda_build.h"
#include "host_build.h"
#include "numeric.h"
#include "plan_print.h"
#include "plan_read.h"
#include "plan_scratch.h"
#include "plan_write.h"
#include "program.h"
#include "quant.h"
#include "smelt.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { VOCAB = 4, K = 16, MAX_TOKENS = 8 };

/* Arena (bytes): ids, pos, codes [T, 16], a_scale [T], residual [T, 4] f32, logits [T, 4]. */
enum {
    AT_IDS = 0,
    AT_POS = 32,
    AT_CODES = 64,
    AT_SCALES = 192,
    AT_RESIDUAL = 224,
    AT_LOGITS = 352,
    ARENA_BYTES = 480,
    BIAS_DATA_OFFSET = 128, /* in WEIGHT_DATA, after the quantized weight */
};

/* E4M3 codes of 0.5, -1, 1.5, 2, -3, 0.25, 4, -0.75; as int8 48, -72, 60, 64, -60, 40, 72, -76. */
static const uint8_t table[8] = {0x30, 0xb8, 0x3c, 0x40, 0xc4, 0x28, 0x48, 0xb4};
static const float weight_scales[VOCAB] = {0.5f, 0.25f, 2.0f, 1.5f}; /* exact in f16 */
static const float bias[VOCAB] = {1.0f, -2.0f, 0.5f, 3.0f};

static float code_value(smelt_dtype dtype, uint8_t code) {
    return dtype == SMELT_DTYPE_I8 ? (float)(int8_t)code : plan_f8e4m3_to_f32(code);
}
static float expected_logit_scaled(smelt_dtype dtype, int id, int j, float factor);
static float expected_logit(smelt_dtype dtype, int id, int j) {
    return expected_logit_scaled(dtype, id, j, 1.0f);
}
static uint8_t weight_code(int j, int k) { return table[(5 * j + 3 * k) % 8]; }
static uint8_t token_code(int id, int k) { return table[(3 * id + k) % 8]; }

/* The weight's f16 scales (weight_scales times `factor`, exact in f16) and
 * their values as a GEMM reads them. */
static void weight_scales_f16(float factor, uint16_t halves[VOCAB], float widened[VOCAB]) {
    for (int j = 0; j < VOCAB; j++)
        halves[j] = plan_f32_to_f16(factor * weight_scales[j]);
    plan_f16_row_to_f32(halves, widened, VOCAB);
}

/* The logit (t of id `id`, j) in double, then scaled (the weight's scales
 * times `factor`) and added in the order the kernels use. */
static float expected_logit_scaled(smelt_dtype dtype, int id, int j, float factor) {
    double sum = 0;
    for (int k = 0; k < K; k++)
        sum += (double)code_value(dtype, token_code(id, k)) * code_value(dtype, weight_code(j, k));
    uint16_t halves[VOCAB];
    float scales[VOCAB];
    weight_scales_f16(factor, halves, scales);
    float v = ((float)sum * (0.5f + (float)id)) * scales[j];
    v += bias[j];
    v += (float)id - 0.25f * (float)j;
    return v;
}

/* ---- The kernels --------------------------------------------------------------- */

static const char quant_source[] =
    "#include \"smelt_kernel.h\"\n"
    "/* codes, scale and residual of token t, from its id */\n"
    "SMELT_KERNEL void toy_quant(const int *ids, unsigned char *codes, float *scales, float *residual,\n"
    "                            int tokens) {\n"
    "    const unsigned char table[8] = {0x30, 0xb8, 0x3c, 0x40, 0xc4, 0x28, 0x48, 0xb4};\n"
    "    int t = blockIdx.x, k = threadIdx.x;\n"
    "    if (t >= tokens || k >= 16) return;\n"
    "    int id = ids[t];\n"
    "    codes[t * 16 + k] = table[(id * 3 + k) % 8];\n"
    "    if (k == 0) scales[t] = 0.5f + (float)id;\n"
    "    if (k < 4) residual[t * 4 + k] = (float)id - 0.25f * (float)k;\n"
    "}\n"
    "#ifdef SMELT_HOST\n"
    "SMELT_HOST_ENTRY(toy_quant) {\n"
    "    toy_quant(SMELT_ARG(const int *, 0), SMELT_ARG(unsigned char *, 1), SMELT_ARG(float *, 2),\n"
    "              SMELT_ARG(float *, 3), SMELT_ARG(int, 4));\n"
    "}\n"
    "#endif\n";

/* The fallback: the same product by hand (name, code decoding, offset of the f16 scales). */
static const char fallback_template[] =
    "#include \"smelt_kernel.h\"\n"
    "/* logits[t, j] = (sum_k a[t, k] w[j, k]) * scales[t] * ws[j] + bias[j] + residual[t, j] */\n"
    "#define DECODE(b) %s\n"
    "SMELT_KERNEL void %s(const unsigned char *codes, const float *scales, const unsigned char *w,\n"
    "                     const float *bias, const float *residual, float *logits, int tokens) {\n"
    "    int t = blockIdx.x, j = threadIdx.x;\n"
    "    if (t >= tokens || j >= 4) return;\n"
    "    float sum = 0.0f;\n"
    "    for (int k = 0; k < 16; k++) sum += DECODE(codes[t * 16 + k]) * DECODE(w[j * 16 + k]);\n"
    "    float ws = smelt_f16_to_f32(((const unsigned short *)(w + %u))[j]);\n"
    "    logits[t * 4 + j] = (sum * scales[t]) * ws + bias[j] + residual[t * 4 + j];\n"
    "}\n"
    "#ifdef SMELT_HOST\n"
    "SMELT_HOST_ENTRY(%s) {\n"
    "    %s(SMELT_ARG(const unsigned char *, 0), SMELT_ARG(const float *, 1),\n"
    "       SMELT_ARG(const unsigned char *, 2), SMELT_ARG(const float *, 3), SMELT_ARG(const float *, 4),\n"
    "       SMELT_ARG(float *, 5), SMELT_ARG(int, 6));\n"
    "}\n"
    "#endif\n";

static const char *fallback_name(smelt_dtype dtype) {
    return dtype == SMELT_DTYPE_I8 ? "toy_fallback_i8" : "toy_fallback_f8";
}

/* The quantized weight's layout: [4, 16] codes, one f16 scale a row. */
static quant_layout weight_layout(smelt_dtype dtype) {
    quant_format f = {.kind = dtype == SMELT_DTYPE_I8 ? QUANT_INT8 : QUANT_FP8, .group = K};
    quant_layout l;
    assert_null(quant_layout_of(&f, VOCAB, K, &l));
    return l;
}

/* The host object of toy_quant and both fallbacks, built once. */
static cg_host_object host_object;

static const cg_host_object *scaled_host_object(void) {
    if (host_object.bytes) return &host_object;
    static char fallbacks[2][2048];
    const smelt_dtype dtypes[2] = {SMELT_DTYPE_F8E4M3, SMELT_DTYPE_I8};
    for (int i = 0; i < 2; i++) {
        const char *name = fallback_name(dtypes[i]);
        snprintf(fallbacks[i], sizeof fallbacks[i], fallback_template,
                 dtypes[i] == SMELT_DTYPE_I8 ? "((float)(signed char)(b))" : "smelt_f8e4m3_to_f32(b)", name,
                 (unsigned)weight_layout(dtypes[i]).scales, name, name);
    }
    cg_host_source sources[3] = {
        {"toy_quant", quant_source}, {"toy_fallback_f8", fallbacks[0]}, {"toy_fallback_i8", fallbacks[1]}};
    cg_host_build_request req = {.sources = sources,
                                 .source_count = 3,
                                 .include_dir = SMELT_SOURCE_DIR "/runtime",
                                 .sanitize_address = cg_host_build_process_is_sanitized()};
    char error[2048];
    if (!cg_host_build(&req, NULL, &host_object, error, sizeof error)) fail_msg("host build: %s", error);
    return &host_object;
}

/* ---- The program ---------------------------------------------------------------- */

typedef struct scaled_program {
    program p;
    prog_weight weights[2];
    prog_instr instrs[3];
} scaled_program;

static prog_ref arena_at(uint64_t offset) { return (prog_ref){PROG_BUFFER_ARENA, 0, offset}; }
static prog_ref weight_at(uint32_t index, uint64_t offset) {
    return (prog_ref){PROG_BUFFER_WEIGHT, index, offset};
}

static prog_arg pointer(prog_ref ref, prog_affine extent, bool writes) {
    return (prog_arg){.kind = PROG_ARG_POINTER, .ref = ref, .extent = extent, .writes = writes};
}

/* A launch of T blocks of 32 threads. */
static prog_instr block_per_token(uint32_t kernel) {
    prog_instr in = {.op = PROG_OP_LAUNCH, .ir_op = 3};
    prog_launch *l = &in.as.launch;
    l->kernel = kernel;
    l->rule.grid[0] = (prog_affine){1, 0, 1};
    l->rule.grid[1] = l->rule.grid[2] = (prog_affine){0, 1, 1};
    l->rule.block[0] = 32;
    l->rule.block[1] = l->rule.block[2] = 1;
    return in;
}

/* Kernel 0 (toy_quant), the scaled GEMM (needs scaled GEMMs), kernel 1
 * (its fallback, needs none). */
static void scaled_program_make(scaled_program *s, smelt_dtype dtype) {
    memset(s, 0, sizeof *s);
    program *p = &s->p;
    p->format_version = PROGRAM_FORMAT_VERSION;
    p->max_tokens = MAX_TOKENS;
    p->arena_bytes = ARENA_BYTES;
    p->vocab = VOCAB;
    p->input_ids = arena_at(AT_IDS);
    p->input_pos = arena_at(AT_POS);
    p->logits = arena_at(AT_LOGITS);
    p->id_table = UINT32_MAX;
    quant_layout layout = weight_layout(dtype);
    prog_weight *w = &s->weights[0];
    *w = (prog_weight){
        .name = "toy.q.weight", .dtype = dtype, .rank = 2, .bytes = layout.total, .data_offset = 0};
    w->shape[0] = VOCAB, w->shape[1] = K;
    w->quant = (prog_quant){.kind = dtype == SMELT_DTYPE_I8 ? PROG_QUANT_INT8 : PROG_QUANT_FP8, .group = K};
    s->weights[1] = (prog_weight){.name = "toy.q.bias",
                                  .dtype = SMELT_DTYPE_F32,
                                  .rank = 1,
                                  .bytes = VOCAB * 4,
                                  .data_offset = BIAS_DATA_OFFSET};
    s->weights[1].shape[0] = VOCAB;
    p->weight_count = 2;
    p->weights = s->weights;

    prog_instr *quant = &s->instrs[0];
    *quant = block_per_token(0);
    quant->as.launch.arg_count = 5;
    quant->as.launch.args[0] = pointer(arena_at(AT_IDS), (prog_affine){4, 0, 1}, false);
    quant->as.launch.args[1] = pointer(arena_at(AT_CODES), (prog_affine){K, 0, 1}, true);
    quant->as.launch.args[2] = pointer(arena_at(AT_SCALES), (prog_affine){4, 0, 1}, true);
    quant->as.launch.args[3] = pointer(arena_at(AT_RESIDUAL), (prog_affine){VOCAB * 4, 0, 1}, true);
    quant->as.launch.args[4] = (prog_arg){.kind = PROG_ARG_TOKENS};

    prog_instr *gemm = &s->instrs[1];
    *gemm = (prog_instr){.op = PROG_OP_GEMM, .ir_op = 7, .needs = PROG_NEED_SCALED_GEMM};
    gemm->as.gemm = (prog_gemm){.m = {1, 0, 1},
                                .n = VOCAB,
                                .k = K,
                                .dtype_a = dtype,
                                .dtype_b = dtype,
                                .dtype_c = SMELT_DTYPE_F32,
                                .dtype_bias = SMELT_DTYPE_F32,
                                .b_transposed = true,
                                .has_bias = true,
                                .has_residual = true,
                                .has_scales = true,
                                .dtype_b_scale = SMELT_DTYPE_F16,
                                .a = arena_at(AT_CODES),
                                .b = weight_at(0, layout.codes),
                                .c = arena_at(AT_LOGITS),
                                .bias = weight_at(1, 0),
                                .residual = arena_at(AT_RESIDUAL),
                                .a_scale = arena_at(AT_SCALES),
                                .b_scale = weight_at(0, layout.scales)};
    gemm->cost = program_gemm_cost(&gemm->as.gemm);

    prog_instr *fallback = &s->instrs[2];
    *fallback = block_per_token(1);
    fallback->ir_op = 7;
    fallback->needs = PROG_NEED_NO_SCALED_GEMM;
    prog_launch *l = &fallback->as.launch;
    l->arg_count = 7;
    l->args[0] = pointer(arena_at(AT_CODES), (prog_affine){K, 0, 1}, false);
    l->args[1] = pointer(arena_at(AT_SCALES), (prog_affine){4, 0, 1}, false);
    l->args[2] = pointer(weight_at(0, 0), (prog_affine){0, (int64_t)layout.total, 1}, false);
    l->args[3] = pointer(weight_at(1, 0), (prog_affine){0, VOCAB * 4, 1}, false);
    l->args[4] = pointer(arena_at(AT_RESIDUAL), (prog_affine){VOCAB * 4, 0, 1}, false);
    l->args[5] = pointer(arena_at(AT_LOGITS), (prog_affine){VOCAB * 4, 0, 1}, true);
    l->args[6] = (prog_arg){.kind = PROG_ARG_TOKENS};
    p->instr_count = 3;
    p->instrs = s->instrs;
}

/* WEIGHT_DATA: the quantized weight's codes and f16 scales, then the bias. */
static size_t scaled_weight_data(smelt_dtype dtype, uint8_t data[256]) {
    quant_layout l = weight_layout(dtype);
    memset(data, 0, 256);
    for (int j = 0; j < VOCAB; j++)
        for (int k = 0; k < K; k++)
            data[l.codes + (uint64_t)j * K + (uint64_t)k] = weight_code(j, k);
    uint16_t halves[VOCAB];
    float widened[VOCAB];
    weight_scales_f16(1.0f, halves, widened);
    memcpy(data + l.scales, halves, sizeof halves);
    memcpy(data + BIAS_DATA_OFFSET, bias, sizeof bias);
    return BIAS_DATA_OFFSET + sizeof bias;
}

/* Encodes s, decodes it, expects a refusal holding `expected`. */
static void expect_refused(scaled_program *s, const char *name, const char *expected) {
    uint8_t *bytes;
    size_t size;
    assert_true(program_encode(&s->p, &bytes, &size));
    program d;
    char error[512] = "";
    bool ok = program_decode(bytes, size, &d, error, sizeof error);
    free(bytes);
    if (ok) {
        program_free(&d);
        fail_msg("%s: accepted a program that should fail with '%s'", name, expected);
    }
    if (!strstr(error, expected)) fail_msg("%s: expected '%s' in: %s", name, expected, error);
}

static void assert_refs_equal(prog_ref a, prog_ref b) {
    assert_int_equal(a.buffer, b.buffer);
    assert_int_equal(a.index, b.index);
    assert_int_equal(a.offset, b.offset);
}

/* ---- Encoding ------------------------------------------------------------------- */

static void test_round_trip(void **state) {
    (void)state;
    const smelt_dtype dtypes[2] = {SMELT_DTYPE_F8E4M3, SMELT_DTYPE_I8};
    for (int i = 0; i < 2; i++) {
        scaled_program s;
        scaled_program_make(&s, dtypes[i]);
        uint8_t *bytes;
        size_t size;
        assert_true(program_encode(&s.p, &bytes, &size));
        program d;
        char error[512];
        if (!program_decode(bytes, size, &d, error, sizeof error)) fail_msg("%s", error);
        assert_int_equal(d.instrs[0].needs, PROG_NEED_NONE);
        assert_int_equal(d.instrs[1].needs, PROG_NEED_SCALED_GEMM);
        assert_int_equal(d.instrs[2].needs, PROG_NEED_NO_SCALED_GEMM);
        const prog_gemm *g = &d.instrs[1].as.gemm;
        assert_true(g->has_scales);
        assert_int_equal(g->dtype_a, dtypes[i]);
        assert_int_equal(g->dtype_b, dtypes[i]);
        assert_int_equal(g->dtype_b_scale, SMELT_DTYPE_F16);
        assert_refs_equal(g->a_scale, arena_at(AT_SCALES));
        assert_refs_equal(g->b_scale, s.instrs[1].as.gemm.b_scale);
        assert_true(g->b_scale.offset > 0);
        /* The device's side of each: the GEMM where scaled GEMMs run, the fallback where not. */
        assert_true(prog_instr_needs_met(&d.instrs[0], true) && prog_instr_needs_met(&d.instrs[0], false));
        assert_true(prog_instr_needs_met(&d.instrs[1], true) && !prog_instr_needs_met(&d.instrs[1], false));
        assert_true(!prog_instr_needs_met(&d.instrs[2], true) && prog_instr_needs_met(&d.instrs[2], false));
        uint8_t *again;
        size_t again_size;
        assert_true(program_encode(&d, &again, &again_size));
        assert_int_equal(again_size, size);
        assert_memory_equal(again, bytes, size);
        free(again);
        program_free(&d);
        /* Every prefix is refused, cleanly. */
        for (size_t n = 0; n < size; n++) {
            if (program_decode(bytes, n, &d, error, sizeof error))
                fail_msg("a %zu-byte prefix of %zu was accepted", n, size);
            assert_true(strncmp(error, "program: ", 9) == 0);
        }
        free(bytes);
    }
}

/* The refusals: each case a change to a good program (the f8e4m3 one) and
 * what the decoder must say of it. */
static void old_version(scaled_program *s) { s->p.format_version = 12; } /* before scaled GEMMs */
static void needs_out_of_range(scaled_program *s) { s->instrs[0].needs = 3; }
static void launch_needs_scaled(scaled_program *s) { s->instrs[0].needs = PROG_NEED_SCALED_GEMM; }
static void gemm_needs_none(scaled_program *s) { s->instrs[1].needs = PROG_NEED_NONE; }
static void plain_gemm_needs_scaled(scaled_program *s) { /* a plain GEMM (bf16 here) may not need them */
    s->instrs[1].as.gemm.has_scales = false;
    s->instrs[1].as.gemm.dtype_a = s->instrs[1].as.gemm.dtype_b = SMELT_DTYPE_BF16;
    s->instrs[1].as.gemm.k = K / 2;
}
static void gemm_needs_fallback(scaled_program *s) { s->instrs[1].needs = PROG_NEED_NO_SCALED_GEMM; }
static void fallback_unguarded(scaled_program *s) { s->instrs[2].needs = PROG_NEED_NONE; }
static void fallback_writes_elsewhere(scaled_program *s) {
    s->instrs[2].as.launch.args[5].ref.offset = AT_RESIDUAL;
    s->instrs[2].as.launch.args[4].ref.offset = AT_LOGITS;
}
static void greedy(scaled_program *s) { /* the greedy instruction always runs */
    s->p.has_greedy = true;
    s->p.greedy_token = arena_at(AT_LOGITS);
}
static void a_bf16(scaled_program *s) { s->instrs[1].as.gemm.dtype_a = SMELT_DTYPE_BF16; }
static void b_i8(scaled_program *s) { s->instrs[1].as.gemm.dtype_b = SMELT_DTYPE_I8; }
static void b_scale_bf16(scaled_program *s) { s->instrs[1].as.gemm.dtype_b_scale = SMELT_DTYPE_BF16; }
static void b_not_transposed(scaled_program *s) { s->instrs[1].as.gemm.b_transposed = false; }
static void b_scale_in_bias(scaled_program *s) { s->instrs[1].as.gemm.b_scale = weight_at(1, 0); }
static void a_scale_past_arena(scaled_program *s) { /* 8 tokens' scales: 32 bytes */
    s->instrs[1].as.gemm.a_scale = arena_at(ARENA_BYTES - 16);
}
static void a_scale_unaligned(scaled_program *s) { s->instrs[1].as.gemm.a_scale = arena_at(AT_SCALES + 2); }
static void a_scale_in_no_state(scaled_program *s) {
    s->instrs[1].as.gemm.a_scale = (prog_ref){PROG_BUFFER_STATE, 0, 0};
}
static void b_scale_past_weight(scaled_program *s) { /* 4 f16 scales: 8 bytes */
    s->instrs[1].as.gemm.b_scale.offset = s->weights[0].bytes - 4;
}
static void b_scale_end_overflows(scaled_program *s) { s->instrs[1].as.gemm.b_scale.offset = UINT64_MAX - 2; }
static void b_scale_f32(scaled_program *s) { /* 4 f32 scales: 16 bytes from 64 of 72 */
    s->instrs[1].as.gemm.dtype_b_scale = SMELT_DTYPE_F32;
}
static void c_i8(scaled_program *s) {
    s->instrs[1].as.gemm.dtype_c = SMELT_DTYPE_I8;
} /* floats as in any GEMM */

static void test_refusals(void **state) {
    (void)state;
    const struct {
        const char *name;
        void (*mutate)(scaled_program *s);
        const char *expected;
    } cases[] = {
        {"old version", old_version,
         "format version 12 is not the version"}, /* the current one follows: test_runtime checks its text */
        /* needs */
        {"needs out of range", needs_out_of_range, "instruction 0 has needs 3 (expected 0, 1 or 2)"},
        {"launch needs scaled", launch_needs_scaled,
         "instruction 0 has needs 1 (scaled-gemm) but is no scaled gemm"},
        {"gemm needs none", gemm_needs_none, "instruction 1 is a scaled gemm without needs 1 (scaled-gemm)"},
        {"plain gemm needs scaled", plain_gemm_needs_scaled,
         "instruction 1 has needs 1 (scaled-gemm) but is no scaled gemm"},
        {"gemm needs fallback", gemm_needs_fallback, "instruction 1 is a scaled gemm without needs 1"},
        {"fallback unguarded", fallback_unguarded,
         "instruction 1, a scaled gemm, has no fallback: no launch of needs 2 (no-scaled-gemm) writes its "
         "output"},
        {"fallback writes elsewhere", fallback_writes_elsewhere,
         "instruction 1, a scaled gemm, has no fallback"},
        {"greedy", greedy, "the greedy instruction has needs 2 (expected none)"},
        /* the scaled GEMM's fields */
        {"a bf16", a_bf16,
         "instruction 1: a scaled gemm multiplies codes of one dtype (f8e4m3 or i8), not bf16 x f8e4m3"},
        {"b i8", b_i8, "not f8e4m3 x i8"},
        {"b_scale bf16", b_scale_bf16,
         "instruction 1: a scaled gemm's b_scale has dtype 3 (expected f16 or f32)"},
        {"b not transposed", b_not_transposed,
         "instruction 1: a scaled gemm's B must be stored [N, K] (b_transposed)"},
        {"b_scale in the bias", b_scale_in_bias,
         "instruction 1: a scaled gemm's B and b_scale must lie in one weight"},
        {"a_scale past the arena", a_scale_past_arena,
         "instruction 1 gemm operand a_scale needs 32 bytes at arena 0 offset 464 but that buffer has 480"},
        {"a_scale unaligned", a_scale_unaligned,
         "instruction 1 gemm operand a_scale at arena offset 194 is not aligned to 4 bytes"},
        {"a_scale in no state", a_scale_in_no_state,
         "instruction 1 gemm operand a_scale names state 0, which does not exist"},
        {"b_scale past the weight", b_scale_past_weight,
         "instruction 1 gemm operand b_scale needs 8 bytes at weight 0 offset"},
        {"b_scale end overflows", b_scale_end_overflows,
         "instruction 1 gemm operand b_scale needs 8 bytes at weight 0 offset 18446744073709551613"},
        {"b_scale f32", b_scale_f32,
         "instruction 1 gemm operand b_scale needs 16 bytes at weight 0 offset 64"},
        {"c i8", c_i8, "instruction 1: gemm operand c has dtype 6 (expected f32, bf16 or f16)"},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        scaled_program s;
        scaled_program_make(&s, SMELT_DTYPE_F8E4M3);
        cases[i].mutate(&s);
        expect_refused(&s, cases[i].name, cases[i].expected);
    }
}

/* The codes alone are not enough: a scaled GEMM's weight must be read as
 * its codes and per-channel scales (runtime/plan_open.c). */
/* Writes s as a plan with its kernels' host object and, with cuda, a
 * stand-in PTX for each (the stand-in driver runs their host entries). */
static void write_scaled_plan(const char *path, scaled_program *s, smelt_dtype dtype, bool cuda) {
    plan_kernel kernels[2];
    const char *names[2] = {"toy_quant", fallback_name(dtype)};
    for (int k = 0; k < 2; k++)
        scratch_toy_kernel(&kernels[k], &s->p, (uint32_t)k, names[k], "%3 = toy(%0)",
                           "/* in the host object */", (plan_affine){1, 0, 1});
    plan_kernel_binary ptx = {.arch = plan_text_from("compute_80"),
                              .kind = PLAN_BINARY_PTX,
                              .bytes = {(const uint8_t *)"// no NVRTC: a stand-in", 23}};
    for (int k = 0; cuda && k < 2; k++) {
        kernels[k].binary_count = 1;
        kernels[k].binaries = &ptx;
    }
    uint8_t weight_data[256];
    const cg_host_object *object = scaled_host_object();
    scratch_toy_plan sections = {.program = &s->p,
                                 .kernels = kernels,
                                 .kernel_count = 2,
                                 .host_kernels = object->bytes,
                                 .host_kernels_size = object->size,
                                 .weight_data = weight_data,
                                 .weight_data_size = scaled_weight_data(dtype, weight_data)};
    scratch_toy_plan_write(path, &sections);
}

static smelt_plan *open_scaled_plan(const char *name, scaled_program *s, smelt_dtype dtype, bool cuda) {
    char path[256];
    scratch_path(path, sizeof path, name);
    write_scaled_plan(path, s, dtype, cuda);
    smelt_plan *plan = NULL;
    smelt_status status = smelt_plan_open(path, &plan);
    if (status != SMELT_OK) fail_msg("open %s: %s: %s", path, smelt_status_name(status), smelt_last_error());
    return plan;
}

static void test_plan_open_checks_weight_scales(void **state) {
    (void)state;
    scaled_program s;
    scaled_program_make(&s, SMELT_DTYPE_F8E4M3);
    s.instrs[1].as.gemm.b_scale.offset = 0; /* the codes read as scales */
    char path[256];
    scratch_path(path, sizeof path, "bad-scales.plan");
    write_scaled_plan(path, &s, SMELT_DTYPE_F8E4M3, false);
    smelt_plan *plan = NULL;
    assert_int_equal(smelt_plan_open(path, &plan), SMELT_ERROR_BAD_PLAN);
    assert_non_null(strstr(smelt_last_error(), "instruction 1, a scaled gemm, does not read quantized weight "
                                               "'toy.q.weight' as [4, 16] codes with one f16 scale per row"));
    scaled_program_make(&s, SMELT_DTYPE_F8E4M3);
    s.weights[0].quant.group = K / 2; /* two scales a row */
    quant_format halves = {.kind = QUANT_FP8, .group = K / 2};
    quant_layout two_scales;
    assert_null(quant_layout_of(&halves, VOCAB, K, &two_scales));
    s.weights[0].bytes = two_scales.total;
    s.instrs[2].as.launch.args[2].extent.b = (int64_t)s.weights[0].bytes;
    write_scaled_plan(path, &s, SMELT_DTYPE_F8E4M3, false);
    assert_int_equal(smelt_plan_open(path, &plan), SMELT_ERROR_BAD_PLAN);
    assert_non_null(strstr(smelt_last_error(), "does not read quantized weight"));
}

/* `smelt inspect`: the scales of each operand, the needs of each side. */
static void test_print(void **state) {
    (void)state;
    scaled_program s;
    scaled_program_make(&s, SMELT_DTYPE_F8E4M3);
    char path[256], error[512];
    scratch_path(path, sizeof path, "print.plan");
    write_scaled_plan(path, &s, SMELT_DTYPE_F8E4M3, false);
    plan_file plan;
    assert_true(plan_open(path, &plan, error, sizeof error));
    char *text = scratch_plan_print(&plan, (plan_print_options){0}, true, error, sizeof error);
    const char *lines[] = {
        "per step (prefill chunk or decode token): 1 kernel launches + 1 GEMMs\n",
        "scaled GEMMs: 1 (where the device runs none, their fallback kernels run instead)\n",
        "gemm M=ceil(T * 1 / 1) N=4 K=16 f8e4m3 x f8e4m3^T -> f32: arena+64 * scales arena+192 x weight[0] * "
        "scales "
        "weight[0]+64 (f16) + weight[1] + residual arena+224 -> arena+352 [needs scaled GEMMs]",
        "launch toy_fallback_f8(arena+64, arena+192, weight[0], weight[1], arena+224, arena+352, T) "
        "grid (ceil(T * 1 / 1), 1, 1) block (32, 1, 1) [fallback: where no scaled GEMMs run]",
    };
    for (size_t i = 0; i < sizeof lines / sizeof lines[0]; i++)
        if (!strstr(text, lines[i])) {
            fputs(text, stderr); /* longer than cmocka's message */
            fail_msg("expected '%s' in the text above", lines[i]);
        }
    free(text);
    plan_close(&plan);
}

/* The cost of a scaled GEMM [T, 16] x [4, 16]^T: codes one byte each, a_scale
 * 4 bytes a row, b_scale 2 bytes a channel, the f32 bias, the residual and
 * C (f32); 2 M N K + M N flops, on tensor cores. */
static void test_cost(void **state) {
    (void)state;
    scaled_program s;
    scaled_program_make(&s, SMELT_DTYPE_F8E4M3);
    prog_cost c = program_gemm_cost(&s.instrs[1].as.gemm);
    double t = 5;
    assert_true(prog_poly_eval(c.read, t, 100) ==
                t * K + VOCAB * K + t * 4 + VOCAB * 2 + VOCAB * 4 + t * VOCAB * 4);
    assert_true(prog_poly_eval(c.written, t, 100) == t * VOCAB * 4);
    assert_true(prog_poly_eval(c.flops, t, 100) == t * (2 * VOCAB * K + VOCAB));
    assert_true(c.tensor_cores);
}

/* ---- The executor's side ------------------------------------------------------------ */

/* A device that counts launches and GEMMs and answers runs_scaled_gemm and
 * prepare_gemm as told. */
typedef struct counting_device {
    rt_device base;
    bool runs_f8, runs_i8;
    smelt_status prepare_answer;
    int asked[2]; /* runs_scaled_gemm calls: f8e4m3, i8 */
    int launches, gemms, prepared;
    rt_gemm_args last_gemm, last_prepared;
} counting_device;

static smelt_status count_alloc(rt_device *d, uint64_t bytes, void **out, rt_error *e) {
    (void)d, (void)e;
    *out = calloc(1, bytes);
    return SMELT_OK;
}
static void count_free(rt_device *d, void *address) { (void)d, free(address); }
static smelt_status count_copy(rt_device *d, void *dst, const void *src, uint64_t bytes, rt_error *e) {
    (void)d, (void)e;
    memmove(dst, src, bytes);
    return SMELT_OK;
}
static smelt_status count_zero(rt_device *d, void *address, uint64_t bytes, rt_error *e) {
    (void)d, (void)e;
    memset(address, 0, bytes);
    return SMELT_OK;
}
static smelt_status count_launch(rt_device *device, uint32_t kernel, const rt_launch_dims *dims, void **args,
                                 rt_error *e) {
    (void)kernel, (void)dims, (void)args, (void)e;
    ((counting_device *)device)->launches++;
    return SMELT_OK;
}
static smelt_status count_gemm(rt_device *device, const rt_gemm_args *g, rt_error *e) {
    (void)e;
    counting_device *d = (counting_device *)device;
    d->gemms++;
    d->last_gemm = *g;
    return SMELT_OK;
}
static bool count_runs_scaled_gemm(rt_device *device, smelt_dtype dtype) {
    counting_device *d = (counting_device *)device;
    d->asked[dtype == SMELT_DTYPE_I8]++;
    return dtype == SMELT_DTYPE_I8 ? d->runs_i8 : d->runs_f8;
}
static smelt_status count_prepare(rt_device *device, const rt_gemm_args *g, rt_error *e) {
    counting_device *d = (counting_device *)device;
    d->prepared++;
    d->last_prepared = *g;
    if (d->prepare_answer != SMELT_OK) return rt_fail(e, d->prepare_answer, "cannot run that shape");
    return SMELT_OK;
}

static const rt_device_ops counting_ops = {
    .kind = "counting",
    .alloc = count_alloc,
    .free = count_free,
    .copy_in = count_copy,
    .copy_out = count_copy,
    .zero = count_zero,
    .launch = count_launch,
    .gemm = count_gemm,
    .runs_scaled_gemm = count_runs_scaled_gemm,
    .prepare_gemm = count_prepare,
};

static const rt_device_ops counting_ops_without_scaled = {
    .kind = "counting",
    .alloc = count_alloc,
    .free = count_free,
    .copy_in = count_copy,
    .copy_out = count_copy,
    .zero = count_zero,
    .launch = count_launch,
    .gemm = count_gemm,
};

/* One step of 3 tokens; how many launches and GEMMs it ran. */
static void step(rt_executor *x, counting_device *d, int *launches, int *gemms) {
    const int32_t ids[3] = {2, 0, 3}, pos[3] = {0, 1, 2};
    float logits[3 * VOCAB];
    rt_error e = {0};
    int l = d->launches, g = d->gemms;
    assert_int_equal(rt_executor_step(x, ids, pos, 3, PROG_ROWS_ALL, logits, NULL, &e), SMELT_OK);
    *launches = d->launches - l;
    *gemms = d->gemms - g;
}

static void test_executor_sides(void **state) {
    (void)state;
    scaled_program s;
    scaled_program_make(&s, SMELT_DTYPE_F8E4M3);
    uint8_t weight_memory[2][128] = {{0}};
    void *weights[2] = {weight_memory[0], weight_memory[1]};
    rt_error e = {0};
    int launches, gemms;
    unsetenv("SMELT_NO_SCALED_GEMM");

    /* A device that runs them: the GEMM, with its scales resolved, after prepare_gemm saw it. */
    counting_device d = {.base.ops = &counting_ops, .runs_f8 = true};
    rt_executor x;
    assert_int_equal(rt_executor_init(&x, &s.p, &d.base, weights, false, &e), SMELT_OK);
    assert_true(x.scaled_gemms);
    assert_int_equal(d.asked[0], 1); /* asked once, for the one dtype the program uses */
    assert_int_equal(d.asked[1], 0);
    assert_int_equal(rt_executor_prepare_gemms(&x, 1, &e), SMELT_OK); /* the bias weight: no GEMM's B */
    assert_int_equal(d.prepared, 0);
    assert_int_equal(rt_executor_prepare_gemms(&x, 0, &e), SMELT_OK);
    assert_int_equal(d.prepared, 1);
    assert_int_equal(d.last_prepared.m, MAX_TOKENS);
    assert_true(d.last_prepared.has_scales);
    assert_int_equal(d.last_prepared.b_weight, 0);
    assert_int_equal(d.last_prepared.b_scale_offset, s.instrs[1].as.gemm.b_scale.offset);
    assert_ptr_equal(d.last_prepared.b_scale, weight_memory[0] + s.instrs[1].as.gemm.b_scale.offset);
    step(&x, &d, &launches, &gemms);
    assert_int_equal(launches, 1); /* toy_quant */
    assert_int_equal(gemms, 1);
    assert_true(d.last_gemm.has_scales);
    assert_int_equal(d.last_gemm.m, 3);
    assert_int_equal(d.last_gemm.dtype_a, SMELT_DTYPE_F8E4M3);
    assert_int_equal(d.last_gemm.dtype_b_scale, SMELT_DTYPE_F16);
    assert_ptr_equal(d.last_gemm.a_scale, (uint8_t *)x.arena + AT_SCALES);
    assert_ptr_equal(d.last_gemm.b_scale, weight_memory[0] + s.instrs[1].as.gemm.b_scale.offset);
    /* A device that cannot run the shape it was prepared for: the fallback, from then on. */
    d.prepare_answer = SMELT_ERROR_UNSUPPORTED;
    assert_int_equal(rt_executor_prepare_gemms(&x, RT_NOT_A_WEIGHT, &e), SMELT_OK);
    assert_false(x.scaled_gemms);
    step(&x, &d, &launches, &gemms);
    assert_int_equal(launches, 2);
    assert_int_equal(gemms, 0);
    assert_int_equal(rt_executor_prepare_gemms(&x, RT_NOT_A_WEIGHT, &e), SMELT_OK); /* nothing to prepare */
    assert_int_equal(d.prepared, 2);
    rt_executor_free(&x);

    /* Another failure of prepare is the caller's error, naming the instruction. */
    d = (counting_device){.base.ops = &counting_ops, .runs_f8 = true, .prepare_answer = SMELT_ERROR_DEVICE};
    assert_int_equal(rt_executor_init(&x, &s.p, &d.base, weights, false, &e), SMELT_OK);
    assert_int_equal(rt_executor_prepare_gemms(&x, RT_NOT_A_WEIGHT, &e), SMELT_ERROR_DEVICE);
    assert_non_null(strstr(e.message, "instruction 1 (gemm, IR op 7): cannot run that shape"));
    rt_executor_free(&x);

    /* The knob: the fallback on a device that runs them; never asked for prepare. */
    setenv("SMELT_NO_SCALED_GEMM", "1", 1);
    d = (counting_device){.base.ops = &counting_ops, .runs_f8 = true};
    assert_int_equal(rt_executor_init(&x, &s.p, &d.base, weights, false, &e), SMELT_OK);
    assert_false(x.scaled_gemms);
    assert_int_equal(rt_executor_prepare_gemms(&x, RT_NOT_A_WEIGHT, &e), SMELT_OK);
    assert_int_equal(d.prepared, 0);
    step(&x, &d, &launches, &gemms);
    assert_int_equal(launches, 2);
    assert_int_equal(gemms, 0);
    rt_executor_free(&x);
    setenv("SMELT_NO_SCALED_GEMM", "0", 1); /* "0" is off */
    assert_int_equal(rt_executor_init(&x, &s.p, &d.base, weights, false, &e), SMELT_OK);
    assert_true(x.scaled_gemms);
    rt_executor_free(&x);
    unsetenv("SMELT_NO_SCALED_GEMM");

    /* A device without the member, or one that runs another dtype alone: the fallback. */
    d = (counting_device){.base.ops = &counting_ops_without_scaled};
    assert_int_equal(rt_executor_init(&x, &s.p, &d.base, weights, false, &e), SMELT_OK);
    assert_false(x.scaled_gemms);
    step(&x, &d, &launches, &gemms);
    assert_int_equal(launches, 2);
    assert_int_equal(gemms, 0);
    rt_executor_free(&x);
    d = (counting_device){.base.ops = &counting_ops, .runs_i8 = true};
    assert_int_equal(rt_executor_init(&x, &s.p, &d.base, weights, false, &e), SMELT_OK);
    assert_false(x.scaled_gemms);
    rt_executor_free(&x);
}

/* ---- The host device ---------------------------------------------------------------- */

/* The host device's scaled product alone, against the double-precision
 * loop: [3, 32] x [5, 32]^T codes, f16 or f32 b_scale, a bias (bf16) and
 * a residual, out in f32 and in bf16. */
static void test_host_scaled_gemm(void **state) {
    (void)state;
    enum { M = 3, N = 5, KK = 32 };
    rt_device *device;
    rt_error e = {0};
    assert_int_equal(rt_device_host_create(1, &device, &e), SMELT_OK);
    assert_true(device->ops->runs_scaled_gemm(device, SMELT_DTYPE_F8E4M3));
    assert_true(device->ops->runs_scaled_gemm(device, SMELT_DTYPE_I8));
    assert_false(device->ops->runs_scaled_gemm(device, SMELT_DTYPE_BF16));
    const float a_scale[M] = {0.5f, 3.0f, 0.125f};
    const float b_scale_f32[N] = {2.0f, 0.75f, 1.0f, 0.0625f, 4.0f};
    uint16_t b_scale_f16[N], bias_bf16[N];
    float b_scale_widened[N]; /* the f16 scales as the GEMM reads them: exact, so b_scale_f32 again */
    for (int j = 0; j < N; j++) {
        b_scale_f16[j] = plan_f32_to_f16(b_scale_f32[j]);
        bias_bf16[j] = plan_f32_to_bf16((float)j - 1.5f);
    }
    plan_f16_row_to_f32(b_scale_f16, b_scale_widened, N);
    assert_memory_equal(b_scale_widened, b_scale_f32, sizeof b_scale_f32);
    const smelt_dtype dtypes[2] = {SMELT_DTYPE_F8E4M3, SMELT_DTYPE_I8};
    for (int di = 0; di < 2; di++)
        for (int f16 = 0; f16 < 2; f16++)
            for (int bf16_out = 0; bf16_out < 2; bf16_out++) {
                smelt_dtype dtype = dtypes[di], out = bf16_out ? SMELT_DTYPE_BF16 : SMELT_DTYPE_F32;
                uint8_t a[M * KK], b[N * KK];
                for (int i = 0; i < M * KK; i++)
                    a[i] = table[(i * 7 + 1) % 8];
                for (int i = 0; i < N * KK; i++)
                    b[i] = table[(i * 5 + 3) % 8];
                float residual_f32[M * N], c_f32[M * N];
                uint16_t residual_bf16[M * N], c_bf16[M * N];
                for (int i = 0; i < M * N; i++) {
                    residual_f32[i] = 0.25f * (float)i - 1.0f;
                    residual_bf16[i] = plan_f32_to_bf16(residual_f32[i]);
                }
                rt_gemm_args g = {.m = M,
                                  .n = N,
                                  .k = KK,
                                  .dtype_a = dtype,
                                  .dtype_b = dtype,
                                  .dtype_c = out,
                                  .dtype_bias = SMELT_DTYPE_BF16,
                                  .b_transposed = true,
                                  .has_bias = true,
                                  .a = a,
                                  .b = b,
                                  .bias = bias_bf16,
                                  .residual = bf16_out ? (const void *)residual_bf16 : residual_f32,
                                  .c = bf16_out ? (void *)c_bf16 : c_f32,
                                  .b_weight = RT_NOT_A_WEIGHT,
                                  .has_scales = true,
                                  .a_scale = a_scale,
                                  .b_scale = f16 ? (const void *)b_scale_f16 : b_scale_f32,
                                  .dtype_b_scale = f16 ? SMELT_DTYPE_F16 : SMELT_DTYPE_F32};
                assert_int_equal(device->ops->gemm(device, &g, &e), SMELT_OK);
                for (int i = 0; i < M; i++)
                    for (int j = 0; j < N; j++) {
                        double sum = 0; /* exact: multiples of 1/16 (E4M3) or integers (i8) */
                        for (int k = 0; k < KK; k++)
                            sum +=
                                (double)code_value(dtype, a[i * KK + k]) * code_value(dtype, b[j * KK + k]);
                        float v = ((float)sum * a_scale[i]) * (f16 ? b_scale_widened : b_scale_f32)[j];
                        v += plan_bf16_to_f32(bias_bf16[j]);
                        v += bf16_out ? plan_bf16_to_f32(residual_bf16[i * N + j]) : residual_f32[i * N + j];
                        if (bf16_out)
                            assert_int_equal(c_bf16[i * N + j], plan_f32_to_bf16(v));
                        else if (c_f32[i * N + j] != v)
                            fail_msg("%s %s: C[%d, %d] = %.9g, expected %.9g", smelt_dtype_name(dtype),
                                     f16 ? "f16" : "f32", i, j, (double)c_f32[i * N + j], (double)v);
                    }
            }
    /* What the host cannot multiply is refused, not guessed at. */
    rt_gemm_args bad = {.m = 1,
                        .n = 1,
                        .k = 1,
                        .dtype_a = SMELT_DTYPE_BF16,
                        .dtype_b = SMELT_DTYPE_BF16,
                        .dtype_c = SMELT_DTYPE_F32,
                        .b_transposed = true,
                        .has_scales = true};
    assert_int_equal(device->ops->gemm(device, &bad, &e), SMELT_ERROR_UNSUPPORTED);
    assert_non_null(strstr(e.message, "no scaled product of bf16 x bf16^T on the host"));
    rt_device_destroy(device);
}

/* The executor on the host device: the scaled GEMM where it runs them, its
 * fallback kernel under SMELT_NO_SCALED_GEMM=1; both give the
 * double-precision loop's logits. */
static void test_host_executor_sides(void **state) {
    (void)state;
    const smelt_dtype dtypes[2] = {SMELT_DTYPE_F8E4M3, SMELT_DTYPE_I8};
    const cg_host_object *object = scaled_host_object();
    for (int di = 0; di < 2; di++)
        for (int forbid = 0; forbid < 2; forbid++) {
            smelt_dtype dtype = dtypes[di];
            scaled_program s;
            scaled_program_make(&s, dtype);
            plan_kernel kernels[2] = {{.name = plan_text_from("toy_quant")},
                                      {.name = plan_text_from(fallback_name(dtype))}};
            rt_kernel_set set = {kernels, 2, object->bytes, object->size, true};
            uint8_t weight_data[256];
            scaled_weight_data(dtype, weight_data);
            void *weights[2] = {weight_data, weight_data + BIAS_DATA_OFFSET};
            if (forbid)
                setenv("SMELT_NO_SCALED_GEMM", "1", 1);
            else
                unsetenv("SMELT_NO_SCALED_GEMM");
            rt_device *device;
            rt_error e = {0};
            assert_int_equal(rt_device_host_create(2, &device, &e), SMELT_OK);
            assert_int_equal(device->ops->load_kernels(device, &set, &e), SMELT_OK);
            rt_executor x;
            assert_int_equal(rt_executor_init(&x, &s.p, device, weights, false, &e), SMELT_OK);
            assert_int_equal(x.scaled_gemms, !forbid);
            assert_int_equal(rt_executor_prepare_gemms(&x, RT_NOT_A_WEIGHT, &e), SMELT_OK);
            const int32_t ids[3] = {2, 0, 3}, pos[3] = {0, 1, 2};
            float logits[3 * VOCAB];
            if (rt_executor_step(&x, ids, pos, 3, PROG_ROWS_ALL, logits, NULL, &e) != SMELT_OK)
                fail_msg("%s", e.message);
            assert_int_equal(x.launches_last_step, 2); /* toy_quant and one side */
            for (int t = 0; t < 3; t++)
                for (int j = 0; j < VOCAB; j++)
                    if (logits[t * VOCAB + j] != expected_logit(dtype, ids[t], j))
                        fail_msg("%s, %s: logit [%d, %d] = %.9g, expected %.9g", smelt_dtype_name(dtype),
                                 forbid ? "fallback" : "scaled GEMM", t, j, (double)logits[t * VOCAB + j],
                                 (double)expected_logit(dtype, ids[t], j));
            rt_executor_free(&x);
            rt_device_destroy(device);
        }
    unsetenv("SMELT_NO_SCALED_GEMM");
}

/* Through the public API: a plan file on the host engine, its weights in
 * the plan, then rebound (new scales reach the GEMM). */
static void test_host_engine(void **state) {
    (void)state;
    unsetenv("SMELT_NO_SCALED_GEMM");
    scaled_program s;
    scaled_program_make(&s, SMELT_DTYPE_F8E4M3);
    smelt_plan *plan = open_scaled_plan("scaled.plan", &s, SMELT_DTYPE_F8E4M3, false);
    smelt_engine_options options = smelt_engine_options_default();
    options.device = "host";
    options.host_threads = 2;
    smelt_engine *engine = NULL;
    assert_int_equal(smelt_engine_create(plan, &options, &engine), SMELT_OK);
    smelt_plan_close(plan);
    const int32_t ids[3] = {2, 0, 3}, pos[3] = {0, 1, 2};
    float logits[3 * VOCAB];
    assert_int_equal(smelt_engine_forward(engine, ids, pos, 3, SMELT_LOGITS_ALL, logits, 3 * VOCAB),
                     SMELT_OK);
    for (int t = 0; t < 3; t++)
        for (int j = 0; j < VOCAB; j++)
            assert_true(logits[t * VOCAB + j] == expected_logit(SMELT_DTYPE_F8E4M3, ids[t], j));
    /* Rebound with every scale doubled: the logits' product part doubles. */
    uint8_t data[256];
    scaled_weight_data(SMELT_DTYPE_F8E4M3, data);
    quant_layout l = weight_layout(SMELT_DTYPE_F8E4M3);
    uint16_t halves[VOCAB];
    float widened[VOCAB];
    weight_scales_f16(2.0f, halves, widened);
    memcpy(data + l.scales, halves, sizeof halves);
    assert_int_equal(smelt_engine_bind_weight_bytes(engine, "toy.q.weight", data, l.total), SMELT_OK);
    assert_int_equal(smelt_engine_forward(engine, ids, pos, 3, SMELT_LOGITS_ALL, logits, 3 * VOCAB),
                     SMELT_OK);
    for (int t = 0; t < 3; t++)
        for (int j = 0; j < VOCAB; j++)
            assert_true(logits[t * VOCAB + j] == expected_logit_scaled(SMELT_DTYPE_F8E4M3, ids[t], j, 2.0f));
    smelt_engine_destroy(engine);
}

/* The cuda device on the stand-in driver through an engine: the FP8 GEMM
 * (prepared when the weights are bound, before the decode graph is
 * captured) or, under SMELT_NO_SCALED_GEMM=1, the fallback kernel; the
 * double-precision loop's logits either way, in prefill and in replayed
 * decode steps. */
static void test_cuda_engine_on_fake_driver(void **state) {
    (void)state;
    char driver[256], kernels_path[256];
    fake_cuda_build(scratch_folder, driver, sizeof driver);
    scratch_path(kernels_path, sizeof kernels_path, "scaled-kernels.so");
    const cg_host_object *object = scaled_host_object();
    scratch_write(kernels_path, object->bytes, object->size);
    setenv("SMELT_CUDA_DRIVER", driver, 1);
    setenv("SMELT_CUBLASLT", driver, 1);
    setenv("FAKE_CUDA_HOST_KERNELS", kernels_path, 1);
    void *fake = dlopen(driver, RTLD_NOW | RTLD_LOCAL);
    assert_non_null(fake);
    void (*counters)(int[4]) = (void (*)(int[4]))(uintptr_t)dlsym(fake, "fake_cuda_counters");
    void (*shutdown)(void) = (void (*)(void))(uintptr_t)dlsym(fake, "fake_cuda_shutdown");
    assert_non_null(counters);
    assert_non_null(shutdown);
    scaled_program s;
    scaled_program_make(&s, SMELT_DTYPE_F8E4M3);
    smelt_plan *plan = open_scaled_plan("cuda-scaled.plan", &s, SMELT_DTYPE_F8E4M3, true);
    for (int forbid = 0; forbid < 2; forbid++) {
        if (forbid)
            setenv("SMELT_NO_SCALED_GEMM", "1", 1);
        else
            unsetenv("SMELT_NO_SCALED_GEMM");
        smelt_engine_options options = smelt_engine_options_default();
        options.device = "cuda";
        smelt_engine *engine = NULL;
        if (smelt_engine_create(plan, &options, &engine) != SMELT_OK) fail_msg("%s", smelt_last_error());
        int before[4], after[4];
        counters(before);
        const int32_t ids[3] = {2, 0, 3}, pos[3] = {0, 1, 2};
        float logits[3 * VOCAB];
        if (smelt_engine_forward(engine, ids, pos, 3, SMELT_LOGITS_ALL, logits, 3 * VOCAB) != SMELT_OK)
            fail_msg("%s", smelt_last_error());
        counters(after);
        assert_int_equal(after[2] - before[2], forbid ? 0 : 1); /* matmuls */
        assert_int_equal(after[0] - before[0], forbid ? 2 : 1); /* launches */
        for (int t = 0; t < 3; t++)
            for (int j = 0; j < VOCAB; j++)
                if (logits[t * VOCAB + j] != expected_logit(SMELT_DTYPE_F8E4M3, ids[t], j))
                    fail_msg("%s: logit [%d, %d] = %.9g, expected %.9g", forbid ? "fallback" : "FP8 GEMM", t,
                             j, (double)logits[t * VOCAB + j],
                             (double)expected_logit(SMELT_DTYPE_F8E4M3, ids[t], j));
        for (int step = 0; step < 3; step++) { /* run, captured and replayed, replayed */
            const int32_t id = step + 1, at = 3 + step;
            float row[VOCAB];
            assert_int_equal(smelt_engine_forward(engine, &id, &at, 1, SMELT_LOGITS_LAST, row, VOCAB),
                             SMELT_OK);
            for (int j = 0; j < VOCAB; j++)
                assert_true(row[j] == expected_logit(SMELT_DTYPE_F8E4M3, id, j));
        }
        smelt_stats stats;
        assert_int_equal(smelt_engine_stats(engine, &stats), SMELT_OK);
        assert_int_equal(stats.graph_replays, 2);
        smelt_engine_destroy(engine);
    }
    smelt_plan_close(plan);
    shutdown();
    dlclose(fake);
    unsetenv("SMELT_NO_SCALED_GEMM");
    unsetenv("SMELT_CUDA_DRIVER");
    unsetenv("SMELT_CUBLASLT");
    unsetenv("FAKE_CUDA_HOST_KERNELS");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_round_trip),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_plan_open_checks_weight_scales),
        cmocka_unit_test(test_print),
        cmocka_unit_test(test_cost),
        cmocka_unit_test(test_executor_sides),
        cmocka_unit_test(test_host_scaled_gemm),
        cmocka_unit_test(test_host_executor_sides),
        cmocka_unit_test(test_host_engine),
        cmocka_unit_test(test_cuda_engine_on_fake_driver),
    };
    int failures = cmocka_run_group_tests(tests, scratch_folder_make, scratch_folder_remove);
    cg_host_object_free(&host_object);
    return failures;
}
