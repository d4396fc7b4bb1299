/* test_runtime.c - the runtime: program encoding and its validating decoder,
 * the host device end to end on hand-made plans, weight binding, greedy and
 * sampled generation, statistics, and the cuda device's clean "no driver".
 *
 * The toy model (vocab 4, width 4): a hand-written kernel in the
 * smelt_kernel.h subset makes h[t, j] = (ids[t] == j) * 2 + b[j], then one
 * GEMM (f32 plan) or two (bf16 plan) make the logits. Every expected logit
 * below was computed by hand from the weights written next to it.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "device.h"
#include "executor.h"
#include "fake_cuda.h"
#include "fake_cuda_build.h"
#include "host_build.h"
#include "nvrtc.h"
#include "numeric.h"
#include "plan_print.h"
#include "plan_read.h"
#include "plan_scratch.h"
#include "plan_write.h"
#include "program.h"
#include "sampler.h"
#include "smelt.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { VOCAB = 4, WIDTH = 4, MAX_TOKENS = 8 };

/* ---- The kernels, in the smelt_kernel.h subset --------------------------------- */

static const char toy_embed_source[] =
    "#include \"smelt_kernel.h\"\n"
    "/* h[t, j] = (ids[t] == j) * 2 + b[j]: out = a * 2 + b with a one-hot a */\n"
    "enum { WIDTH = 4 };\n"
    "SMELT_KERNEL void toy_embed(const int *ids, const float *b, float *h, int tokens) {\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i >= tokens * WIDTH) return;\n"
    "    int t = i / WIDTH, j = i % WIDTH;\n"
    "    float a = ids[t] == j ? 1.0f : 0.0f;\n"
    "    h[i] = a * 2.0f + b[j];\n"
    "}\n"
    "#ifdef SMELT_HOST\n"
    "SMELT_HOST_ENTRY(toy_embed) {\n"
    "    toy_embed(SMELT_ARG(const int *, 0), SMELT_ARG(const float *, 1), SMELT_ARG(float *, 2),\n"
    "              SMELT_ARG(int, 3));\n"
    "}\n"
    "#endif\n";

static const char toy_embed_bf16_source[] =
    "#include \"smelt_kernel.h\"\n"
    "/* the same, stored as bf16 */\n"
    "enum { WIDTH = 4 };\n"
    "SMELT_KERNEL void toy_embed_bf16(const int *ids, const float *b, smelt_bf16 *h, int tokens) {\n"
    "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
    "    if (i >= tokens * WIDTH) return;\n"
    "    int t = i / WIDTH, j = i % WIDTH;\n"
    "    float a = ids[t] == j ? 1.0f : 0.0f;\n"
    "    h[i] = smelt_f32_to_bf16(a * 2.0f + b[j]);\n"
    "}\n"
    "#ifdef SMELT_HOST\n"
    "SMELT_HOST_ENTRY(toy_embed_bf16) {\n"
    "    toy_embed_bf16(SMELT_ARG(const int *, 0), SMELT_ARG(const float *, 1), SMELT_ARG(smelt_bf16 *, 2),\n"
    "                   SMELT_ARG(int, 3));\n"
    "}\n"
    "#endif\n";

/* ---- The toy program ---------------------------------------------------------------- */

/* Arena (bytes): ids [0, 32), pos [32, 64), h [64, 192) f32 or [64, 128)
 * bf16, h2 [128, 192) bf16, logits [192, 320). */
enum { AT_IDS = 0, AT_POS = 32, AT_H = 64, AT_H2 = 128, AT_LOGITS = 192, ARENA_BYTES = 320 };

typedef struct toy_program {
    program p;
    prog_weight weights[5];
    prog_instr instrs[3];
    uint64_t state_bytes[1];
    uint64_t state_rows[1];
} toy_program;

static prog_ref arena_at(uint64_t offset) { return (prog_ref){PROG_BUFFER_ARENA, 0, offset}; }
static prog_ref weight_at(uint32_t index) { return (prog_ref){PROG_BUFFER_WEIGHT, index, 0}; }

static prog_weight toy_weight(const char *name, smelt_dtype dtype, int64_t d0, int64_t d1,
                              uint64_t data_offset) {
    prog_weight w = {.name = name, .dtype = dtype, .rank = d1 ? 2 : 1, .data_offset = data_offset};
    w.shape[0] = d0;
    w.shape[1] = d1;
    w.bytes = (uint64_t)d0 * (uint64_t)(d1 ? d1 : 1) * smelt_dtype_element_bytes(dtype);
    return w;
}

static prog_instr toy_launch(uint32_t kernel) {
    prog_instr in = {.op = PROG_OP_LAUNCH, .ir_op = 4};
    prog_launch *l = &in.as.launch;
    l->kernel = kernel;
    l->rule.grid[0] = (prog_affine){WIDTH, 0, 32}; /* ceil(4 T / 32) blocks of 32 */
    l->rule.grid[1] = l->rule.grid[2] = (prog_affine){0, 1, 1};
    l->rule.block[0] = 32;
    l->rule.block[1] = l->rule.block[2] = 1;
    l->arg_count = 4;
    int64_t h_element = kernel == 0 ? 4 : 2; /* toy_embed stores f32, toy_embed_bf16 bf16 */
    l->args[0] = (prog_arg){.kind = PROG_ARG_POINTER, .ref = arena_at(AT_IDS), .extent = {4, 0, 1}};
    l->args[1] = (prog_arg){.kind = PROG_ARG_POINTER, .ref = weight_at(0), .extent = {0, WIDTH * 4, 1}};
    l->args[2] = (prog_arg){
        .kind = PROG_ARG_POINTER, .ref = arena_at(AT_H), .extent = {WIDTH * h_element, 0, 1}, .writes = true};
    l->args[3] = (prog_arg){.kind = PROG_ARG_TOKENS};
    return in;
}

static prog_instr toy_gemm(prog_ref a, smelt_dtype ta, prog_ref b, smelt_dtype tb, bool transposed,
                           prog_ref c, smelt_dtype tc, bool has_bias, prog_ref bias, smelt_dtype tbias) {
    prog_instr in = {.op = PROG_OP_GEMM, .ir_op = 7};
    in.as.gemm = (prog_gemm){.m = {1, 0, 1},
                             .n = VOCAB,
                             .k = WIDTH,
                             .dtype_a = ta,
                             .dtype_b = tb,
                             .dtype_c = tc,
                             .dtype_bias = tbias,
                             .b_transposed = transposed,
                             .has_bias = has_bias,
                             .a = a,
                             .b = b,
                             .c = c,
                             .bias = bias};
    return in;
}

/* f32: logits = h W^T + bias. bf16: h2 = h W1 + bias1 (W1 in_out, bf16
 * out), logits = h2 W^T (f32 out). Weights live in the plan at 64-byte
 * aligned offsets, or (in_plan false) must be bound at run time. */
static void toy_program_make(toy_program *t, bool bf16, bool in_plan, int64_t max_positions) {
    memset(t, 0, sizeof *t);
    program *p = &t->p;
    p->format_version = PROGRAM_FORMAT_VERSION;
    p->max_tokens = MAX_TOKENS;
    p->arena_bytes = ARENA_BYTES;
    p->vocab = VOCAB;
    p->input_ids = arena_at(AT_IDS);
    p->input_pos = arena_at(AT_POS);
    p->logits = arena_at(AT_LOGITS);
    p->max_positions = max_positions;
    p->id_table = UINT32_MAX;
    uint64_t none = UINT64_MAX;
    t->weights[0] = toy_weight("toy.embed_bias", SMELT_DTYPE_F32, WIDTH, 0, in_plan ? 0 : none);
    if (!bf16) {
        t->weights[1] = toy_weight("toy.head.weight", SMELT_DTYPE_F32, VOCAB, WIDTH, in_plan ? 64 : none);
        t->weights[2] = toy_weight("toy.head.bias", SMELT_DTYPE_F32, VOCAB, 0, in_plan ? 128 : none);
        p->weight_count = 3;
        t->instrs[0] = toy_launch(0);
        t->instrs[1] = toy_gemm(arena_at(AT_H), SMELT_DTYPE_F32, weight_at(1), SMELT_DTYPE_F32, true,
                                arena_at(AT_LOGITS), SMELT_DTYPE_F32, true, weight_at(2), SMELT_DTYPE_F32);
        p->instr_count = 2;
    } else {
        t->weights[1] = toy_weight("toy.mix.weight", SMELT_DTYPE_BF16, WIDTH, WIDTH, in_plan ? 64 : none);
        t->weights[2] = toy_weight("toy.mix.bias", SMELT_DTYPE_BF16, WIDTH, 0, in_plan ? 128 : none);
        t->weights[3] = toy_weight("toy.head.weight", SMELT_DTYPE_BF16, VOCAB, WIDTH, in_plan ? 192 : none);
        p->weight_count = 4;
        t->instrs[0] = toy_launch(1);
        t->instrs[1] = toy_gemm(arena_at(AT_H), SMELT_DTYPE_BF16, weight_at(1), SMELT_DTYPE_BF16, false,
                                arena_at(AT_H2), SMELT_DTYPE_BF16, true, weight_at(2), SMELT_DTYPE_BF16);
        t->instrs[2] = toy_gemm(arena_at(AT_H2), SMELT_DTYPE_BF16, weight_at(3), SMELT_DTYPE_BF16, true,
                                arena_at(AT_LOGITS), SMELT_DTYPE_F32, false, weight_at(0), SMELT_DTYPE_F32);
        p->instr_count = 3;
    }
    p->weights = t->weights;
    p->instrs = t->instrs;
}

/* The weights, as the plan stores them. */
static const float embed_bias[WIDTH] = {0.5f, -1.0f, 3.0f, 0.25f};
static const float head_weight[VOCAB][WIDTH] = {
    {1, 0, 0, 0}, {0, 1, 1, 0}, {2, 0, 0, -1}, {0.5f, 0.5f, 0.5f, 0.5f}};
static const float head_bias[VOCAB] = {0, 1, -2, 10};
static const float mix_weight[WIDTH][WIDTH] = {
    {1, 0, 2, 0}, {0, 1, 0, -1}, {1, 1, 0, 0}, {0, 0, 64, 1}}; /* [in][out] */
static const float mix_bias[WIDTH] = {1, 0, 0.5f, 2};

static void put_bf16(uint8_t *dst, const float *src, size_t count) {
    for (size_t i = 0; i < count; i++) {
        uint16_t h = plan_f32_to_bf16(src[i]);
        memcpy(dst + 2 * i, &h, 2);
    }
}

/* WEIGHT_DATA for toy_program_make(.., in_plan = true). */
static size_t toy_weight_data(bool bf16, uint8_t data[256]) {
    memset(data, 0, 256);
    memcpy(data, embed_bias, sizeof embed_bias);
    if (!bf16) {
        memcpy(data + 64, head_weight, sizeof head_weight);
        memcpy(data + 128, head_bias, sizeof head_bias);
        return 192;
    }
    put_bf16(data + 64, &mix_weight[0][0], WIDTH * WIDTH);
    put_bf16(data + 128, mix_bias, WIDTH);
    put_bf16(data + 192, &head_weight[0][0], VOCAB * WIDTH);
    return 256;
}

/* ---- Plan files ------------------------------------------------------------------ */

/* The host object of both kernels, built once. */
static cg_host_object host_object;

static const cg_host_object *toy_host_object(void) {
    if (host_object.bytes) return &host_object;
    cg_host_source sources[2] = {{"toy_embed", toy_embed_source}, {"toy_embed_bf16", toy_embed_bf16_source}};
    cg_host_build_request req = {.sources = sources,
                                 .source_count = 2,
                                 .include_dir = SMELT_SOURCE_DIR "/runtime",
                                 .sanitize_address = cg_host_build_process_is_sanitized()};
    char error[2048];
    if (!cg_host_build(&req, NULL, &host_object, error, sizeof error)) fail_msg("host build: %s", error);
    return &host_object;
}

/* PTX of a kernel from NVRTC for sm_80, when this build has NVRTC; a stand-in
 * otherwise (the runtime never loads it here: there is no GPU). */
typedef struct toy_ptx {
    cg_compiled compiled;
    bool real;
} toy_ptx;

static void toy_ptx_make(toy_ptx *out, const char *source, const char *name) {
    memset(out, 0, sizeof *out);
    char *header = (char *)scratch_read(SMELT_SOURCE_DIR "/runtime/smelt_kernel.h", NULL);
    cg_header headers[1] = {{"smelt_kernel.h", header}};
    cg_compile_request req = {.source = source,
                              .kernel_name = name,
                              .headers = headers,
                              .header_count = 1,
                              .arch = 80,
                              .want_ptx = true};
    char error[1024];
    out->real = cg_compile_kernel(&req, &out->compiled, error, sizeof error);
    free(header);
#ifdef SMELT_HAVE_NVRTC
    if (!out->real) fail_msg("NVRTC: %s", error);
    assert_non_null(strstr(out->compiled.ptx, name));
#endif
}

static void rich_program(toy_program *t);

typedef struct toy_plan_options {
    bool rich; /* rich_program: bf16, a state buffer, a stacked weight to bind */
    bool bf16;
    bool weights_in_plan;
    bool cuda_binaries; /* PTX in the kernel table */
    bool host_kernels;
    int64_t max_positions;
    bool has_eos; /* the model has an EOS id: eos */
    int32_t eos;
    bool wanted_head; /* the GEMMs are the output head: wanted-rows instructions */
    bool concat_head; /* toy.head.weight as a concatenation of toy.head.top (row 0) and toy.head.rest */
    bool residual;    /* the f32 head GEMM adds h (WIDTH == VOCAB) as its residual */
} toy_plan_options;

static void write_toy_plan(const char *path, const toy_plan_options *o) {
    toy_program t;
    if (o->rich)
        rich_program(&t);
    else
        toy_program_make(&t, o->bf16, o->weights_in_plan, o->max_positions);
    if (o->has_eos) {
        t.p.eos_count = 1;
        t.p.eos[0] = o->eos;
    }
    for (uint32_t i = 1; o->wanted_head && i < t.p.instr_count; i++)
        t.instrs[i].wanted_rows = true; /* bf16: h2 feeds only the head */
    static prog_weight_part head_parts[2] = {{"toy.head.top", 1}, {"toy.head.rest", VOCAB - 1}};
    if (o->residual) {
        t.instrs[1].as.gemm.has_residual = true;
        t.instrs[1].as.gemm.residual = arena_at(AT_H);
    }
    if (o->concat_head) {
        t.weights[1].name = "toy.head.top + toy.head.rest";
        t.weights[1].part_count = 2;
        t.weights[1].parts = head_parts;
    }
    toy_ptx ptx[2];
    plan_kernel_binary binaries[2];
    plan_kernel kernels[2];
    const char *names[2] = {"toy_embed", "toy_embed_bf16"};
    const char *sources[2] = {toy_embed_source, toy_embed_bf16_source};
    for (int k = 0; k < 2; k++) {
        scratch_toy_kernel(&kernels[k], &t.p, (uint32_t)k, names[k], "%4 = toy(%0, %1)", sources[k],
                           (plan_affine){WIDTH, 0, 32});
        memset(&ptx[k], 0, sizeof ptx[k]);
        if (o->cuda_binaries) {
            toy_ptx_make(&ptx[k], sources[k], names[k]);
            binaries[k].arch = plan_text_from("compute_80");
            binaries[k].kind = PLAN_BINARY_PTX;
            binaries[k].bytes =
                ptx[k].real ? (plan_blob){(const uint8_t *)ptx[k].compiled.ptx, ptx[k].compiled.ptx_size}
                            : (plan_blob){(const uint8_t *)"// no NVRTC in this build", 25};
            kernels[k].binary_count = 1;
            kernels[k].binaries = &binaries[k];
        }
    }
    uint8_t weight_data[256];
    size_t weight_size = toy_weight_data(o->bf16 || o->rich, weight_data);
    const cg_host_object *object = o->host_kernels ? toy_host_object() : NULL;
    scratch_toy_plan sections = {.program = &t.p,
                                 .kernels = kernels,
                                 .kernel_count = 2,
                                 .host_kernels = object ? object->bytes : NULL,
                                 .host_kernels_size = object ? object->size : 0,
                                 .weight_data = o->weights_in_plan ? weight_data : NULL,
                                 .weight_data_size = weight_size};
    scratch_toy_plan_write(path, &sections);
    for (int k = 0; k < 2; k++)
        cg_compiled_free(&ptx[k].compiled);
}

static smelt_plan *open_toy_plan(const char *name, const toy_plan_options *o) {
    char path[256];
    scratch_path(path, sizeof path, name);
    write_toy_plan(path, o);
    smelt_plan *plan = NULL;
    smelt_status s = smelt_plan_open(path, &plan);
    if (s != SMELT_OK) fail_msg("open %s: %s: %s", path, smelt_status_name(s), smelt_last_error());
    return plan;
}

static smelt_engine *host_engine(smelt_plan *plan) {
    smelt_engine_options options = smelt_engine_options_default();
    options.device = "host";
    options.host_threads = 2;
    smelt_engine *engine = NULL;
    smelt_status s = smelt_engine_create(plan, &options, &engine);
    if (s != SMELT_OK) fail_msg("engine: %s: %s", smelt_status_name(s), smelt_last_error());
    return engine;
}

/* ---- Program encoding -------------------------------------------------------------- */

/* The toy program plus what it lacks: a state buffer, a stacked weight, a
 * pointer into a state. */
static void rich_program(toy_program *t) {
    toy_program_make(t, true, true, 512);
    t->state_bytes[0] = 96;
    t->state_rows[0] = 0;
    t->p.state_count = 1;
    t->p.state_bytes = t->state_bytes;
    t->p.state_rows = t->state_rows;
    t->p.id_bound = 3;
    prog_weight stacked = toy_weight("experts.{e}.w", SMELT_DTYPE_F32, 2, 3, UINT64_MAX);
    stacked.stacked = true;
    t->weights[t->p.weight_count++] = stacked;
    prog_launch *l = &t->instrs[0].as.launch;
    l->args[l->arg_count++] =
        (prog_arg){.kind = PROG_ARG_POINTER, .ref = {PROG_BUFFER_STATE, 0, 40}, .extent = {0, 56, 1}};
}

static void assert_refs_equal(prog_ref a, prog_ref b) {
    assert_int_equal(a.buffer, b.buffer);
    assert_int_equal(a.index, b.index);
    assert_int_equal(a.offset, b.offset);
}

static void test_program_round_trip(void **state) {
    (void)state;
    toy_program t;
    rich_program(&t);
    t.instrs[0].max_tokens = 4; /* token ranges: as a fused kernel for small steps, a GEMM above */
    t.instrs[1].min_tokens = 5;
    uint8_t *bytes;
    size_t size;
    assert_true(program_encode(&t.p, &bytes, &size));
    program d;
    char error[512];
    if (!program_decode(bytes, size, &d, error, sizeof error)) fail_msg("%s", error);
    assert_int_equal(d.max_tokens, MAX_TOKENS);
    assert_int_equal(d.arena_bytes, ARENA_BYTES);
    assert_int_equal(d.vocab, VOCAB);
    assert_int_equal(d.max_positions, 512);
    assert_int_equal(d.id_bound, 3);
    assert_refs_equal(d.logits, t.p.logits);
    assert_int_equal(d.state_count, 1);
    assert_int_equal(d.state_bytes[0], 96);
    assert_int_equal(d.weight_count, 5);
    for (uint32_t i = 0; i < d.weight_count; i++) {
        assert_string_equal(d.weights[i].name, t.weights[i].name);
        assert_int_equal(d.weights[i].dtype, t.weights[i].dtype);
        assert_int_equal(d.weights[i].rank, t.weights[i].rank);
        assert_memory_equal(d.weights[i].shape, t.weights[i].shape, t.weights[i].rank * sizeof(int64_t));
        assert_int_equal(d.weights[i].bytes, t.weights[i].bytes);
        assert_int_equal(d.weights[i].data_offset, t.weights[i].data_offset);
    }
    assert_true(d.weights[4].stacked);
    assert_int_equal(d.instr_count, 3);
    const prog_launch *l = &d.instrs[0].as.launch;
    assert_int_equal(d.instrs[0].op, PROG_OP_LAUNCH);
    assert_int_equal(d.instrs[0].ir_op, 4);
    assert_int_equal(d.instrs[0].min_tokens, 0);
    assert_int_equal(d.instrs[0].max_tokens, 4);
    assert_int_equal(d.instrs[1].min_tokens, 5);
    assert_int_equal(d.instrs[1].max_tokens, 0);
    assert_true(prog_instr_runs(&d.instrs[0], 4) && !prog_instr_runs(&d.instrs[0], 5));
    assert_true(!prog_instr_runs(&d.instrs[1], 4) && prog_instr_runs(&d.instrs[1], 8));
    assert_int_equal(l->kernel, 1);
    assert_int_equal(l->rule.grid[0].a, WIDTH);
    assert_int_equal(l->rule.grid[0].c, 32);
    assert_int_equal(l->rule.block[0], 32);
    assert_int_equal(l->arg_count, 5);
    assert_int_equal(l->args[3].kind, PROG_ARG_TOKENS);
    assert_refs_equal(l->args[4].ref, (prog_ref){PROG_BUFFER_STATE, 0, 40});
    assert_int_equal(l->args[4].extent.b, 56);
    assert_false(l->args[4].writes);
    assert_true(l->args[2].writes);
    assert_int_equal(l->args[2].extent.a, WIDTH * 2);
    const prog_gemm *g = &d.instrs[1].as.gemm;
    assert_int_equal(d.instrs[1].op, PROG_OP_GEMM);
    assert_false(g->b_transposed);
    assert_true(g->has_bias);
    assert_int_equal(g->dtype_c, SMELT_DTYPE_BF16);
    assert_refs_equal(g->bias, weight_at(2));
    assert_true(d.instrs[2].as.gemm.b_transposed);
    /* Encoding the decoded program gives the same bytes. */
    uint8_t *again;
    size_t again_size;
    assert_true(program_encode(&d, &again, &again_size));
    assert_int_equal(again_size, size);
    assert_memory_equal(again, bytes, size);
    free(again);
    program_free(&d);
    free(bytes);
}

static void test_program_decode_refuses_truncation(void **state) {
    (void)state;
    toy_program t;
    rich_program(&t);
    uint8_t *bytes;
    size_t size;
    assert_true(program_encode(&t.p, &bytes, &size));
    char error[512];
    for (size_t n = 0; n < size; n++) {
        program d;
        if (program_decode(bytes, n, &d, error, sizeof error))
            fail_msg("a %zu-byte prefix of %zu was accepted", n, size);
        assert_true(strncmp(error, "program: ", 9) == 0);
    }
    /* One byte too many is refused too. */
    uint8_t *longer = malloc(size + 1);
    memcpy(longer, bytes, size);
    longer[size] = 0;
    program d;
    assert_false(program_decode(longer, size + 1, &d, error, sizeof error));
    assert_non_null(strstr(error, "1 unexpected bytes after the last choice"));
    free(longer);
    free(bytes);
}

/* Encodes t, decodes it, expects a refusal holding `expected`. */
static void expect_refused(toy_program *t, const char *expected) {
    uint8_t *bytes;
    size_t size;
    assert_true(program_encode(&t->p, &bytes, &size));
    program d;
    char error[512] = "";
    bool ok = program_decode(bytes, size, &d, error, sizeof error);
    free(bytes);
    if (ok) {
        program_free(&d);
        fail_msg("accepted a program that should fail with '%s'", expected);
    }
    if (!strstr(error, expected)) fail_msg("expected '%s' in: %s", expected, error);
}

static void test_program_decode_refuses_lies(void **state) {
    (void)state;
    toy_program t;

    toy_program_make(&t, false, true, 0);
    t.p.format_version = PROGRAM_FORMAT_VERSION + 1;
    char other_version[128];
    snprintf(other_version, sizeof other_version,
             "format version %d is not the version %d this smelt reads: rebuild the plan",
             PROGRAM_FORMAT_VERSION + 1, PROGRAM_FORMAT_VERSION);
    expect_refused(&t, other_version);

    prog_weight_part parts[2] = {{"toy.head.top", 1}, {"toy.head.rest", VOCAB}};
    toy_program_make(&t, false, true, 0); /* a concatenation's parts fill its rows exactly */
    t.weights[1].part_count = 2;
    t.weights[1].parts = parts;
    expect_refused(&t, "the parts of weight 'toy.head.weight' have 5 rows, but it has 4");
    parts[1] = (prog_weight_part){"toy.head.bias", VOCAB - 1}; /* names unique among weights and parts */
    toy_program_make(&t, false, true, 0);
    t.weights[1].part_count = 2;
    t.weights[1].parts = parts;
    expect_refused(&t, "weight 'toy.head.bias' appears twice");
    toy_program_make(&t, false, true, 0);
    t.weights[1].part_count = 1;
    t.weights[1].parts = parts;
    expect_refused(&t, "has 1 parts");

    toy_program_make(&t, false, true, 0); /* a GEMM's residual is not its output */
    t.instrs[1].as.gemm.has_residual = true;
    t.instrs[1].as.gemm.residual = t.instrs[1].as.gemm.c;
    expect_refused(&t, "gemm residual overlaps its output");
    toy_program_make(&t, false, true, 0); /* and lies inside its buffer */
    t.instrs[1].as.gemm.has_residual = true;
    t.instrs[1].as.gemm.residual = arena_at(ARENA_BYTES);
    expect_refused(&t, "gemm operand residual");
    /* A quantized weight: codes of its kind's dtype, [N, K] with groups that
     * divide K, zero points on int4 alone, at least its codes' bytes. */
    toy_program_make(&t, false, true, 0);
    t.weights[1].quant = (prog_quant){.kind = PROG_QUANT_INT4, .method = 0, .group = WIDTH};
    expect_refused(&t, "weight 'toy.head.weight' has quantization 1 with codes of dtype 1");
    toy_program_make(&t, false, true, 0);
    t.weights[1].dtype = SMELT_DTYPE_I4;
    expect_refused(&t, "weight 'toy.head.weight' has the codes' dtype 7 but is not quantized");
    toy_program_make(&t, false, true, 0);
    t.weights[1].dtype = SMELT_DTYPE_I8;
    t.weights[1].quant = (prog_quant){.kind = PROG_QUANT_INT8, .flags = PROG_QUANT_ZERO, .group = WIDTH};
    expect_refused(&t, "weight 'toy.head.weight' has quantization flags 1");
    toy_program_make(&t, false, true, 0);
    t.weights[1].dtype = SMELT_DTYPE_I8;
    t.weights[1].quant = (prog_quant){.kind = PROG_QUANT_INT8, .group = WIDTH + 1};
    expect_refused(&t, "quantized weight 'toy.head.weight' is not [N, K] with groups that divide K");
    toy_program_make(&t, false, true, 0);
    t.weights[1].dtype = SMELT_DTYPE_I8;
    t.weights[1].quant = (prog_quant){.kind = PROG_QUANT_INT8, .group = WIDTH};
    t.weights[1].bytes = VOCAB * WIDTH - 1;
    expect_refused(&t, "has 15 bytes, fewer than its codes");
    prog_weight_part halves[2] = {{"toy.head.top", 1}, {"toy.head.rest", VOCAB - 1}};
    toy_program_make(&t, false, true, 0); /* a concatenation is not quantized */
    t.weights[1].dtype = SMELT_DTYPE_I8;
    t.weights[1].quant = (prog_quant){.kind = PROG_QUANT_INT8, .group = WIDTH};
    t.weights[1].part_count = 2;
    t.weights[1].parts = halves;
    expect_refused(&t, "weight 'toy.head.weight' is both concatenated and quantized");
    /* A transposed weight (bound from its [K, N] tensor) is a quantized
     * matrix, not stacked: the driver transposes it before quantizing. */
    toy_program_make(&t, false, true, 0);
    t.weights[1].transposed = true;
    expect_refused(&t, "transposed weight 'toy.head.weight' is concatenated or not quantized");
    toy_program_make(&t, false, true, 0);
    t.weights[1].dtype = SMELT_DTYPE_I8;
    t.weights[1].quant = (prog_quant){.kind = PROG_QUANT_INT8, .group = WIDTH};
    t.weights[1].transposed = true;
    t.weights[1].stacked = true;
    expect_refused(&t, "transposed weight 'toy.head.weight' is not a matrix (rank 2, not stacked)");
    toy_program_make(&t, false, true, 0); /* and its flag round-trips */
    t.weights[1].dtype = SMELT_DTYPE_I8;
    t.weights[1].quant = (prog_quant){.kind = PROG_QUANT_INT8, .group = WIDTH};
    t.weights[1].bytes = VOCAB * WIDTH * sizeof(float); /* what the toy GEMM reads of it */
    t.weights[1].transposed = true;
    {
        uint8_t *bytes;
        size_t size;
        assert_true(program_encode(&t.p, &bytes, &size));
        program d;
        char error[512] = "";
        bool ok = program_decode(bytes, size, &d, error, sizeof error);
        free(bytes);
        if (!ok) fail_msg("a transposed int8 weight was refused: %s", error);
        assert_true(d.weights[1].transposed);
        assert_false(d.weights[0].transposed);
        program_free(&d);
    }

    toy_program_make(&t, false, true, 0); /* EOS ids index the vocabulary, each once */
    t.p.eos_count = 1;
    t.p.eos[0] = (int32_t)t.p.vocab;
    expect_refused(&t, "EOS id");
    toy_program_make(&t, false, true, 0);
    t.p.eos_count = 2;
    t.p.eos[0] = t.p.eos[1] = 1;
    expect_refused(&t, "EOS id 1 is listed twice");
    toy_program_make(&t, false, true, 0);
    t.p.eos_count = PROG_MAX_EOS + 1;
    expect_refused(&t, "17 EOS ids; at most 16 are allowed");

    toy_program_make(&t, false, true, 0); /* the greedy token: never in a weight, always by a launch */
    t.p.has_greedy = true;
    t.p.greedy_token = weight_at(1);
    expect_refused(&t, "greedy_token is in a weight");
    toy_program_make(&t, false, true, 0);
    t.p.has_greedy = true;
    t.p.greedy_token = (prog_ref){PROG_BUFFER_ARENA, 0, ARENA_BYTES - 2};
    expect_refused(&t, "greedy_token needs 4 bytes at arena 0 offset 318");
    toy_program_make(&t, false, true, 0);
    t.p.has_greedy = true;
    t.p.greedy_token = (prog_ref){PROG_BUFFER_ARENA, 0, 0};
    expect_refused(&t, "the greedy instruction is not a launch"); /* the toy's last is a GEMM */

    /* Wanted rows: what runs at one token on the last rows stays inside
     * what it may touch at T (program.c). */
    toy_program_make(&t, false, true, 0);
    t.instrs[1].wanted_rows = true;
    t.instrs[1].as.gemm.m = (prog_affine){1, 0, 2}; /* T / 2 rows: row T - 1 is no token's */
    expect_refused(&t, "instruction 1: a gemm on the wanted rows has rows rule ceil((1 * T + 0) / 2), not T");
    toy_program_make(&t, false, true, 0);
    t.instrs[0].as.launch.args[2].row_bytes = WIDTH * 4; /* moved, but the launch runs on every row */
    expect_refused(&t, "instruction 0 argument 2 has row_bytes 16 but runs on every row");
    toy_program_make(&t, false, true, 0);
    t.instrs[0].wanted_rows = true;
    t.instrs[0].as.launch.args[2].row_bytes = WIDTH * 4 + 1; /* a row past its extent's rows */
    expect_refused(&t, "instruction 0 argument 2: a pointer moved by 17 bytes a row must be into the arena");
    toy_program_make(&t, false, true, 0);
    t.instrs[0].wanted_rows = true;
    t.instrs[0].as.launch.args[1].row_bytes = 4; /* a weight is not indexed by token */
    expect_refused(&t, "instruction 0 argument 1: a pointer moved by 4 bytes a row must be into the arena");
    toy_program_make(&t, false, true, 0);
    t.instrs[0].wanted_rows = true;
    t.instrs[0].as.launch.rule.grid[0] = (prog_affine){1, -1, 1}; /* T - 1 blocks: none at one token */
    expect_refused(&t, "instruction 0 runs on the wanted rows but its grid is empty at one token");

    /* Token ranges: a fused kernel for T <= 4, its unfused ops above. */
    toy_program_make(&t, false, true, 0);
    t.instrs[0].min_tokens = 5;
    t.instrs[0].max_tokens = 4;
    expect_refused(&t, "instruction 0 runs for T in [5, 4] (expected 0 <= min <= max <= 8");
    toy_program_make(&t, false, true, 0);
    t.instrs[1].max_tokens = 9;
    expect_refused(&t, "instruction 1 runs for T in [0, 9]");
    toy_program_make(&t, false, true, 0);
    t.instrs[1].min_tokens = -1;
    expect_refused(&t, "instruction 1 runs for T in [-1, 0]");
    toy_program_make(&t, false, true, 0);
    t.instrs[1].min_tokens = 9;
    expect_refused(&t, "instruction 1 runs for T in [9, 0]");

    toy_program_make(&t, false, true, 0);
    t.weights[1].bytes = 60;
    expect_refused(&t, "weight 'toy.head.weight' says it has 60 bytes but its shape and dtype make 64");

    toy_program_make(&t, false, true, 0); /* C would run past the arena at 8 tokens */
    t.instrs[1].as.gemm.c.offset = AT_LOGITS + 4;
    expect_refused(
        &t, "instruction 1 gemm operand C needs 128 bytes at arena 0 offset 196 but that buffer has 320");

    toy_program_make(&t, false, true, 0); /* B wider than the weight */
    t.instrs[1].as.gemm.k = 5;
    expect_refused(
        &t, "instruction 1 gemm operand B needs 80 bytes at weight 1 offset 0 but that buffer has 64 bytes");

    toy_program_make(&t, false, true, 0);
    t.instrs[0].as.launch.args[1].ref.index = 9;
    expect_refused(&t, "instruction 0 (kernel 0) argument 1 names weight 9, which does not exist");

    toy_program_make(&t, false, true, 0);
    t.instrs[0].as.launch.args[2].ref.offset = ARENA_BYTES;
    expect_refused(&t, "instruction 0 (kernel 0) argument 2 needs 128 bytes at arena 0 offset 320");

    toy_program_make(&t, false, true, 0); /* the start is inside, the end is not */
    t.instrs[0].as.launch.args[2].ref.offset = ARENA_BYTES - 4;
    expect_refused(&t, "instruction 0 (kernel 0) argument 2 needs 128 bytes at arena 0 offset 316");

    toy_program_make(&t, false, true, 0);
    t.instrs[0].as.launch.args[2].ref = weight_at(1);
    t.instrs[0].as.launch.args[2].extent = (prog_affine){0, 16, 1};
    expect_refused(&t, "instruction 0 (kernel 0) argument 2: the kernel writes weight 1");

    toy_program_make(&t, false, true, 0);
    t.instrs[0].as.launch.args[1].extent = (prog_affine){1, 0, 0};
    expect_refused(&t, "instruction 0 (kernel 0) argument 1: extent rule ceil((1 * T + 0) / 0) is invalid");

    toy_program_make(&t, false, true, 0); /* positions past the KV cache */
    t.state_bytes[0] = 64, t.state_rows[0] = 16;
    t.p.state_count = 1, t.p.state_bytes = t.state_bytes, t.p.state_rows = t.state_rows;
    t.p.max_positions = 17;
    expect_refused(&t, "max_positions 17 disagrees with state 0, which holds 16 positions");

    toy_program_make(&t, false, true, 0); /* ids past the embedding table */
    t.p.id_table = 1, t.p.id_bound = 5;
    expect_refused(&t, "id_bound 5 disagrees with the 4 rows of the embedding table 'toy.head.weight'");

    toy_program_make(&t, false, true, 0); /* vocab larger than what the head writes */
    t.p.vocab = 2;
    expect_refused(&t, "no instruction writes the logits as max_tokens (8) rows of vocab (2) floats");

    toy_program_make(&t, false, true, 0);
    t.instrs[0].as.launch.rule.grid[0] = (prog_affine){INT64_MAX / 2, 0, 1};
    expect_refused(&t, "instruction 0: grid dim 0 rule");

    toy_program_make(&t, false, true, 0);
    t.instrs[0].as.launch.rule.grid[1].c = 0;
    expect_refused(&t, "instruction 0: grid dim 1 rule");

    toy_program_make(&t, false, true, 0);
    t.instrs[0].as.launch.rule.block[0] = 1024, t.instrs[0].as.launch.rule.block[1] = 2;
    expect_refused(&t, "a block of 2048 threads exceeds 1024");

    toy_program_make(&t, false, true, 0);
    t.instrs[0].as.launch.args[0] = (prog_arg){.kind = PROG_ARG_INT, .value = 7};
    expect_refused(&t, "instruction 0 (kernel 0) argument 0 is an integer constant, which no kernel takes");

    toy_program_make(&t, false, true, 0);
    t.weights[2].name = "toy.head.weight";
    expect_refused(&t, "weight 'toy.head.weight' appears twice");

    toy_program_make(&t, false, true, 0);
    t.weights[2].name = "";
    expect_refused(&t, "weight 2 has an empty");

    toy_program_make(&t, false, true, 0);
    t.p.logits.offset = 200;
    expect_refused(&t, "logits needs 128 bytes at arena 0 offset 200");

    toy_program_make(&t, false, true, 0);
    t.p.input_ids.buffer = PROG_BUFFER_STATE;
    expect_refused(&t, "input_ids must be in the arena");

    toy_program_make(&t, false, true, 0);
    t.p.max_tokens = 0;
    expect_refused(&t, "max_tokens 0 is outside");

    toy_program_make(&t, false, true, 0);
    t.instrs[1].as.gemm.c = weight_at(1);
    expect_refused(&t, "instruction 1: gemm writes a weight");

    toy_program_make(&t, false, true, 0);
    t.instrs[1].as.gemm.dtype_a = SMELT_DTYPE_I32;
    expect_refused(&t, "gemm operand a has dtype 8 (expected f32, bf16 or f16)");

    toy_program_make(&t, false, true, 0);
    t.instrs[1].op = 7;
    expect_refused(&t, "instruction 1 has unknown op 7");

    toy_program_make(&t, false, true, 0);
    t.instrs[0].as.launch.arg_count = PROG_MAX_ARGS + 1;
    expect_refused(&t, "33 arguments (at most 32)");

    /* A count the bytes left cannot back is refused before any allocation. */
    toy_program_make(&t, false, true, 0);
    uint8_t *bytes;
    size_t size;
    assert_true(program_encode(&t.p, &bytes, &size));
    size_t at_state_count = 4 + 8 + 8 + 8 + 3 * 13 + 8 + 8 + 4 + 4 + 1 +
                            13; /* ... id_table, has_greedy, greedy_token, eos_count (0) */
    plan_put_u32(bytes + at_state_count, 0xffffffffu);
    program d;
    char error[512];
    assert_false(program_decode(bytes, size, &d, error, sizeof error));
    assert_non_null(strstr(error, "state count 4294967295 does not fit"));
    free(bytes);

    /* The plan-level checks: kernels and weight data. */
    toy_program_make(&t, false, true, 0);
    plan_kernel kernel = {.name = plan_text_from("toy_embed")};
    kernel.launch.grid[0] = (plan_affine){WIDTH, 0, 32};
    kernel.launch.grid[1] = kernel.launch.grid[2] = (plan_affine){0, 1, 1};
    kernel.launch.block[0] = (plan_affine){0, 32, 1};
    kernel.launch.block[1] = kernel.launch.block[2] = (plan_affine){0, 1, 1};
    program_declare_params(&t.p, 0, &kernel);
    assert_true(program_check_plan(&t.p, &kernel, 1, 192, error, sizeof error));
    assert_false(program_check_plan(&t.p, &kernel, 0, 192, error, sizeof error));
    assert_non_null(strstr(error, "instruction 0 launches kernel 0 but the plan has 0 kernels"));
    assert_false(program_check_plan(&t.p, &kernel, 1, 143, error, sizeof error));
    assert_non_null(
        strstr(error, "weight 'toy.head.bias' (16 bytes at offset 128) lies outside the 143 bytes"));
    /* A grid other than the kernel table's rule for the kernel. */
    t.instrs[0].as.launch.rule.grid[0] = (prog_affine){0, 1000000, 1};
    assert_false(program_check_plan(&t.p, &kernel, 1, 192, error, sizeof error));
    assert_non_null(strstr(error, "instruction 0 launches kernel 0 'toy_embed' with a grid, block or shared "
                                  "memory that is not the kernel table's launch rule"));
    /* A launch whose argument is not what the kernel table declares: another
     * extent (as a program rewritten with its buffers would have), another
     * access, or another count. */
    toy_program_make(&t, false, true, 0);
    t.instrs[1] = toy_launch(0);
    t.instrs[1].as.launch.args[1].extent.b = 8;
    assert_false(program_check_plan(&t.p, &kernel, 1, 192, error, sizeof error));
    assert_non_null(strstr(error,
                           "instruction 1 (kernel 0 'toy_embed') argument 1 is not what the kernel table "
                           "declares for it (kind, extent or access differ)"));
    toy_program_make(&t, false, true, 0);
    kernel.params[2].writes = !kernel.params[2].writes;
    assert_false(program_check_plan(&t.p, &kernel, 1, 192, error, sizeof error));
    assert_non_null(strstr(error, "instruction 0 (kernel 0 'toy_embed') argument 2 is not what"));
    kernel.params[2].writes = !kernel.params[2].writes;
    kernel.param_count--;
    assert_false(program_check_plan(&t.p, &kernel, 1, 192, error, sizeof error));
    assert_non_null(strstr(error, "launches kernel 0 'toy_embed' with 4 arguments, but it declares 3"));
}

static uint64_t next_random(uint64_t *s) {
    *s ^= *s << 13, *s ^= *s >> 7, *s ^= *s << 17;
    return *s;
}

/* Random damage: every result is a clean refusal or a program whose
 * references all hold (ASan watches the decoder's reads). */
static void test_program_decode_fuzz(void **state) {
    (void)state;
    toy_program t;
    rich_program(&t);
    uint8_t *bytes;
    size_t size;
    assert_true(program_encode(&t.p, &bytes, &size));
    uint8_t *mutated = malloc(size);
    uint64_t seed = 0x9e3779b97f4a7c15ull;
    unsigned accepted = 0, refused = 0;
    for (int round = 0; round < 20000; round++) {
        memcpy(mutated, bytes, size);
        int flips = 1 + (int)(next_random(&seed) % 4);
        for (int f = 0; f < flips; f++) {
            size_t at = next_random(&seed) % size;
            uint64_t r = next_random(&seed);
            mutated[at] = r & 1 ? (uint8_t)(r >> 8) : (uint8_t)(mutated[at] ^ (1u << ((r >> 8) % 8)));
        }
        size_t length = next_random(&seed) % 8 == 0 ? next_random(&seed) % size : size;
        program d;
        char error[512];
        if (!program_decode(mutated, length, &d, error, sizeof error)) {
            refused++;
            assert_true(strncmp(error, "program: ", 9) == 0);
            continue;
        }
        accepted++;
        for (uint32_t i = 0; i < d.instr_count; i++) {
            if (d.instrs[i].op == PROG_OP_LAUNCH) { /* every pointer's extent inside its buffer */
                const prog_launch *l = &d.instrs[i].as.launch;
                for (uint32_t a = 0; a < l->arg_count; a++) {
                    const prog_arg *arg = &l->args[a];
                    assert_true(arg->kind != PROG_ARG_INT);
                    if (arg->kind != PROG_ARG_POINTER) continue;
                    int64_t extent = program_affine_max(arg->extent, d.max_tokens);
                    uint64_t buffer_bytes = arg->ref.buffer == PROG_BUFFER_ARENA ? d.arena_bytes
                                            : arg->ref.buffer == PROG_BUFFER_WEIGHT
                                                ? d.weights[arg->ref.index].bytes
                                                : d.state_bytes[arg->ref.index];
                    assert_true(extent >= 1 && arg->ref.offset + (uint64_t)extent <= buffer_bytes);
                    assert_false(arg->writes && arg->ref.buffer == PROG_BUFFER_WEIGHT);
                }
            }
            if (d.instrs[i].op != PROG_OP_GEMM) continue;
            const prog_gemm *g = &d.instrs[i].as.gemm;
            int64_t m = program_affine_max(g->m, d.max_tokens);
            assert_true(m >= 0);
            if (g->c.buffer == PROG_BUFFER_ARENA)
                assert_true(g->c.offset + (uint64_t)m * g->n * smelt_dtype_element_bytes(g->dtype_c) <=
                            d.arena_bytes);
        }
        program_free(&d);
    }
    assert_true(refused > 1000); /* the loop really damaged programs */
    assert_true(accepted > 0);   /* and some damage (a weight value, an INT) is harmless */
    free(mutated);
    free(bytes);
}

/* Names in the kernel table and the weight table of a program that decodes:
 * the program printer escapes their control bytes too. */
static void assert_contains(const char *text, const char *needle) {
    if (!strstr(text, needle)) fail_msg("expected '%s' in:\n%s", needle, text);
}

static void test_print_escapes_kernel_and_weight_names(void **state) {
    (void)state;
    program p = {.format_version = PROGRAM_FORMAT_VERSION,
                 .max_tokens = 1,
                 .arena_bytes = 16,
                 .vocab = 1,
                 .input_ids = {PROG_BUFFER_ARENA, 0, 0},
                 .input_pos = {PROG_BUFFER_ARENA, 0, 4},
                 .logits = {PROG_BUFFER_ARENA, 0, 8},
                 .id_table = UINT32_MAX};
    prog_weight weight = {
        .name = "w\x1b]0;x\x07", .dtype = SMELT_DTYPE_F32, .rank = 1, .bytes = 4, .data_offset = UINT64_MAX};
    weight.shape[0] = 1;
    prog_instr instrs[2] = {{.op = PROG_OP_LAUNCH}, {.op = PROG_OP_GEMM}};
    prog_launch *l = &instrs[0].as.launch;
    for (int d = 0; d < 3; d++)
        l->rule.grid[d] = (prog_affine){0, 1, 1}, l->rule.block[d] = 1;
    l->arg_count = 1;
    l->args[0] = (prog_arg){
        .kind = PROG_ARG_POINTER, .ref = {PROG_BUFFER_ARENA, 0, 12}, .extent = {0, 4, 1}, .writes = true};
    instrs[1].as.gemm = (prog_gemm){.m = {1, 0, 1},
                                    .n = 1,
                                    .k = 1,
                                    .dtype_a = SMELT_DTYPE_F32,
                                    .dtype_b = SMELT_DTYPE_F32,
                                    .dtype_c = SMELT_DTYPE_F32,
                                    .a = {PROG_BUFFER_ARENA, 0, 12},
                                    .b = {PROG_BUFFER_WEIGHT, 0, 0},
                                    .c = {PROG_BUFFER_ARENA, 0, 8}};
    p.weight_count = 1, p.weights = &weight, p.instr_count = 2, p.instrs = instrs;
    uint8_t *encoded;
    size_t encoded_size;
    assert_true(program_encode(&p, &encoded, &encoded_size));
    plan_kernel kernel = {.name = plan_text_from("k\x1b[31m"), .family = plan_text_from("f\x9b")};
    for (int d = 0; d < 3; d++)
        kernel.launch.grid[d] = kernel.launch.block[d] = (plan_affine){0, 1, 1};

    plan_writer w;
    plan_writer_init(&w, "0.1.0");
    plan_writer_add_kernels(&w, &kernel, 1);
    plan_writer_add_section(&w, PLAN_SECTION_PROGRAM, encoded, encoded_size);
    char path[256], error[512] = "";
    scratch_path(path, sizeof path, "escaped.plan");
    scratch_plan_write(&w, path, NULL);
    free(encoded);
    plan_file plan;
    assert_true(plan_open(path, &plan, error, sizeof error));
    char *text = scratch_plan_print(&plan, (plan_print_options){0}, true, error, sizeof error);
    assert_contains(text, "kernel 0: k\\x1b[31m\n");
    assert_contains(text, "launch k\\x1b[31m(");
    assert_contains(text, "[0] w\\x1b]0;x\\x07 f32[1]");
    assert_true(strchr(text, 0x1b) == NULL && strchr(text, 0x07) == NULL);
    free(text);
    plan_close(&plan);
}

/* ---- Sampler ------------------------------------------------------------------------ */

static void test_sampler(void **state) {
    (void)state;
    /* pcg32 reference output for seed 42, stream 54 (pcg-c-basic's demo). */
    rt_pcg32 g;
    rt_pcg32_seed(&g, 42, 54);
    const uint32_t expected[6] = {0xa15c02b7u, 0x7b47f409u, 0xba1d3330u,
                                  0x83d2f293u, 0xbfa4784bu, 0xcbed606eu};
    for (int i = 0; i < 6; i++)
        assert_int_equal(rt_pcg32_next(&g), expected[i]);

    rt_sampler s;
    rt_error e = {0};
    assert_int_equal(rt_sampler_init(&s, 4, &e), SMELT_OK);
    int32_t token;
    const float tie[4] = {1, 3, 3, NAN};
    assert_int_equal(rt_sampler_argmax(tie, 4, &token, &e), SMELT_OK);
    assert_int_equal(token, 1); /* ties go to the lowest id; NaN is ignored */
    const float all_nan[4] = {NAN, NAN, NAN, NAN};
    assert_int_equal(rt_sampler_argmax(all_nan, 4, &token, &e), SMELT_ERROR_DEVICE);

    /* p = (1/4, 3/4) at temperature 1: 10000 draws land within 4 sigma. */
    const float logits[4] = {0.0f, logf(3.0f), -INFINITY, -INFINITY};
    rt_sampler_settings settings = {1.0f, 0, 1.0f};
    rt_sampler_seed(&s, 7);
    int counts[4] = {0};
    for (int i = 0; i < 10000; i++) {
        assert_int_equal(rt_sampler_pick(&s, logits, &settings, &token, &e), SMELT_OK);
        counts[token]++;
    }
    assert_int_equal(counts[2] + counts[3], 0);
    assert_true(abs(counts[1] - 7500) < 4 * 44); /* sigma = sqrt(10000 * 3/16) ~ 43.3 */
    /* top-p 0.5 keeps only the 3/4 token; top-k 1 keeps the argmax. */
    settings.top_p = 0.5f;
    for (int i = 0; i < 100; i++) {
        assert_int_equal(rt_sampler_pick(&s, logits, &settings, &token, &e), SMELT_OK);
        assert_int_equal(token, 1);
    }
    settings = (rt_sampler_settings){5.0f, 1, 1.0f};
    assert_int_equal(rt_sampler_pick(&s, tie, &settings, &token, &e), SMELT_OK);
    assert_int_equal(token, 1);
    rt_sampler_free(&s);
}

/* ---- The host device end to end --------------------------------------------------------- */

static void test_host_forward_f32(void **state) {
    (void)state;
    toy_plan_options o = {.host_kernels = true, .weights_in_plan = true, .wanted_head = true};
    smelt_plan *plan = open_toy_plan("f32.plan", &o);
    smelt_plan_info info;
    assert_int_equal(smelt_plan_get_info(plan, &info), SMELT_OK);
    assert_int_equal(info.vocab, VOCAB);
    assert_int_equal(info.kernel_count, 2);
    assert_true(info.has_host_kernels);
    assert_false(info.has_cuda_kernels);
    assert_int_equal(info.unbound_weight_count, 0);
    assert_int_equal(strlen(info.content_hash), 32);
    smelt_engine *engine = host_engine(plan);
    smelt_plan_close(plan); /* the engine keeps it alive */
    assert_non_null(strstr(smelt_engine_device_name(engine), "host"));

    /* h = onehot(id) * 2 + (0.5, -1, 3, 0.25); logits = h W^T + (0, 1, -2, 10). */
    const int32_t ids[3] = {2, 0, 3}, pos[3] = {0, 1, 2};
    float logits[3 * VOCAB];
    assert_int_equal(smelt_engine_forward(engine, ids, pos, 3, SMELT_LOGITS_ALL, logits, 3 * VOCAB),
                     SMELT_OK);
    const float expected[3 * VOCAB] = {0.5f, 5.0f, -1.25f, 12.375f,  /* id 2: h = (0.5, -1, 5, 0.25) */
                                       2.5f, 3.0f, 2.75f,  12.375f,  /* id 0: h = (2.5, -1, 3, 0.25) */
                                       0.5f, 3.0f, -3.25f, 12.375f}; /* id 3: h = (0.5, -1, 3, 2.25) */
    assert_memory_equal(logits, expected, sizeof expected);
    /* The last token's alone: one row, the head run on it only, equal to the
     * last row of all; none: nothing written, the logits may be NULL. */
    float last[VOCAB] = {NAN, NAN, NAN, NAN};
    assert_int_equal(smelt_engine_forward(engine, ids, pos, 3, SMELT_LOGITS_LAST, last, VOCAB), SMELT_OK);
    assert_memory_equal(last, expected + 2 * VOCAB, sizeof last);
    assert_int_equal(smelt_engine_forward(engine, ids, pos, 3, SMELT_LOGITS_NONE, NULL, 0), SMELT_OK);
    assert_int_equal(smelt_engine_forward(engine, ids, pos, 3, SMELT_LOGITS_LAST, last, VOCAB - 1),
                     SMELT_ERROR_CAPACITY);
    assert_non_null(strstr(smelt_last_error(), "logits of 1 tokens need 4 floats but the buffer holds 3"));
    assert_int_equal(smelt_engine_forward(engine, ids, pos, 3, SMELT_LOGITS_LAST, NULL, VOCAB),
                     SMELT_ERROR_INVALID_ARGUMENT);
    assert_int_equal(smelt_engine_forward(engine, ids, pos, 3, (smelt_logits)7, last, VOCAB),
                     SMELT_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(smelt_last_error(), "rows 7 is not a smelt_logits"));
    assert_int_equal(smelt_engine_reset(engine), SMELT_OK);
    assert_int_equal(smelt_engine_forward(engine, ids, pos, 3, SMELT_LOGITS_ALL, logits, 3 * VOCAB),
                     SMELT_OK);

    smelt_stats stats;
    assert_int_equal(smelt_engine_stats(engine, &stats), SMELT_OK);
    assert_int_equal(stats.prefill_tokens, 4 * 3);
    assert_int_equal(stats.decode_tokens, 0);
    assert_int_equal(stats.steps, 4);
    assert_int_equal(stats.launches_per_step, 3); /* one kernel; the head GEMM, its last row by itself */

    /* A decode step of one token. */
    const int32_t one = 0, at = 3;
    float row[VOCAB] = {NAN, NAN, NAN, NAN};
    assert_int_equal(smelt_engine_forward(engine, &one, &at, 1, SMELT_LOGITS_LAST, row, VOCAB), SMELT_OK);
    const float expected_row[VOCAB] = {2.5f, 3.0f, 2.75f, 12.375f}; /* id 0: h = (2.5, -1, 3, 0.25) */
    assert_memory_equal(row, expected_row, sizeof expected_row);
    assert_int_equal(smelt_engine_stats(engine, &stats), SMELT_OK);
    assert_int_equal(stats.decode_tokens, 1);

    /* Bad input is refused with a message. */
    const int32_t bad_id = 4;
    assert_int_equal(smelt_engine_forward(engine, &bad_id, &at, 1, SMELT_LOGITS_LAST, row, VOCAB),
                     SMELT_ERROR_INVALID_ARGUMENT);
    assert_non_null(
        strstr(smelt_last_error(), "token id 4 (token 0 of the step) is outside the vocabulary [0, 4)"));
    assert_int_equal(smelt_engine_forward(engine, ids, pos, 3, SMELT_LOGITS_ALL, logits, 3 * VOCAB - 1),
                     SMELT_ERROR_CAPACITY);
    assert_int_equal(smelt_engine_forward(engine, ids, pos, 9, SMELT_LOGITS_ALL, logits, 9 * VOCAB),
                     SMELT_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(smelt_last_error(), "a step of 9 tokens is outside [1, 8]"));
    const int32_t negative = -1;
    assert_int_equal(smelt_engine_forward(engine, &one, &negative, 1, SMELT_LOGITS_LAST, row, VOCAB),
                     SMELT_ERROR_INVALID_ARGUMENT);

    /* Binding a weight the plan holds replaces it (the engine's own copy). */
    const float new_bias[VOCAB] = {100, 0, 0, -100};
    const int64_t vector[1] = {VOCAB};
    assert_int_equal(smelt_engine_bind_weight(engine, "toy.head.bias", SMELT_DTYPE_F32, new_bias, vector, 1),
                     SMELT_OK);
    assert_int_equal(smelt_engine_forward(engine, &one, &at, 1, SMELT_LOGITS_LAST, row, VOCAB), SMELT_OK);
    const float rebound_row[VOCAB] = {102.5f, 2.0f, 4.75f, -97.625f};
    assert_memory_equal(row, rebound_row, sizeof rebound_row);
    smelt_engine_destroy(engine);
}

static void test_host_forward_bf16(void **state) {
    (void)state;
    toy_plan_options o = {.bf16 = true, .host_kernels = true, .weights_in_plan = true, .wanted_head = true};
    smelt_plan *plan = open_toy_plan("bf16.plan", &o);
    smelt_engine *engine = host_engine(plan);
    smelt_plan_close(plan);
    /* h (bf16) as in the f32 test; h2 = h W1 + (1, 0, 0.5, 2) rounded to
     * bf16: token 3's 145.5 is a tie between 145 and 146 and goes to even
     * (146); logits = h2 W^T in f32. */
    const int32_t ids[3] = {2, 0, 3}, pos[3] = {0, 1, 2};
    float logits[3 * VOCAB];
    assert_int_equal(smelt_engine_forward(engine, ids, pos, 3, SMELT_LOGITS_ALL, logits, 3 * VOCAB),
                     SMELT_OK);
    const float expected[3 * VOCAB] = {6.5f, 21.5f,  9.75f, 15.625f,  /* h2 = (6.5, 4, 17.5, 3.25) */
                                       6.5f, 23.5f,  9.75f, 16.625f,  /* h2 = (6.5, 2, 21.5, 3.25) */
                                       4.5f, 148.0f, 3.75f, 78.875f}; /* h2 = (4.5, 2, 146, 5.25) */
    assert_memory_equal(logits, expected, sizeof expected);
    smelt_stats stats;
    assert_int_equal(smelt_engine_stats(engine, &stats), SMELT_OK);
    assert_int_equal(stats.launches_per_step,
                     5); /* a kernel and 2 head GEMMs, each with its last row apart */
    float last[VOCAB];
    assert_int_equal(smelt_engine_forward(engine, ids, pos, 3, SMELT_LOGITS_LAST, last, VOCAB), SMELT_OK);
    assert_memory_equal(last, expected + 2 * VOCAB, sizeof last);
    assert_int_equal(smelt_engine_stats(engine, &stats), SMELT_OK);
    assert_int_equal(stats.launches_per_step, 3);
    smelt_engine_destroy(engine);
}

/* ---- Binding and generation ----------------------------------------------------------------- */

/* Binds the "next token" model: b = 0, W[v][j] = 1 when v = (j + 1) % 4, so
 * the logits of token j peak at j + 1. W goes in as f16, the bias as bf16. */
static void bind_successor_weights(smelt_engine *engine) {
    const float zeros[WIDTH] = {0};
    const int64_t vector[1] = {WIDTH}, matrix[2] = {VOCAB, WIDTH};
    assert_int_equal(smelt_engine_bind_weight(engine, "toy.embed_bias", SMELT_DTYPE_F32, zeros, vector, 1),
                     SMELT_OK);
    uint16_t w[VOCAB][WIDTH] = {{0}};
    for (int j = 0; j < WIDTH; j++)
        w[(j + 1) % VOCAB][j] = 0x3c00; /* 1.0 in f16 */
    assert_int_equal(smelt_engine_bind_weight(engine, "toy.head.weight", SMELT_DTYPE_F16, w, matrix, 2),
                     SMELT_OK);
    const uint16_t bias[VOCAB] = {0x8000, 0, 0, 0}; /* -0 and 0 in bf16 */
    assert_int_equal(smelt_engine_bind_weight(engine, "toy.head.bias", SMELT_DTYPE_BF16, bias, vector, 1),
                     SMELT_OK);
}

typedef struct token_log {
    int32_t tokens[16];
    int count, stop_after;
} token_log;

static bool log_token(int32_t token, void *user) {
    token_log *log = user;
    log->tokens[log->count++] = token;
    return log->count != log->stop_after;
}

static void test_bind_and_generate(void **state) {
    (void)state;
    toy_plan_options o = {.host_kernels = true, .weights_in_plan = false, .max_positions = 6};
    smelt_plan *plan = open_toy_plan("unbound.plan", &o);
    smelt_plan_info info;
    assert_int_equal(smelt_plan_get_info(plan, &info), SMELT_OK);
    assert_int_equal(info.unbound_weight_count, 3);
    smelt_engine *engine = host_engine(plan);
    smelt_plan_close(plan);

    /* Nothing runs before every weight is bound. */
    const int32_t id = 1, at = 0;
    float row[VOCAB];
    assert_int_equal(smelt_engine_forward(engine, &id, &at, 1, SMELT_LOGITS_LAST, row, VOCAB),
                     SMELT_ERROR_MISSING_WEIGHT);
    assert_non_null(
        strstr(smelt_last_error(), "weight 'toy.embed_bias' is not bound (3 of 3 weights are missing)"));
    const float wrong[6] = {0};
    const int64_t wrong_shape[1] = {6};
    assert_int_equal(
        smelt_engine_bind_weight(engine, "toy.embed_bias", SMELT_DTYPE_F32, wrong, wrong_shape, 1),
        SMELT_ERROR_INVALID_ARGUMENT);
    assert_non_null(
        strstr(smelt_last_error(), "weight 'toy.embed_bias' has shape [4] in the plan but [6] was given"));
    assert_int_equal(smelt_engine_bind_weight(engine, "toy.nothing", SMELT_DTYPE_F32, wrong, wrong_shape, 1),
                     SMELT_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(smelt_last_error(), "the plan has no weight 'toy.nothing'"));
    bind_successor_weights(engine);

    /* Greedy: 1 -> 2 -> 3 -> 0 ...; max_tokens ends it. */
    int32_t prompt[1] = {1}, out[16];
    smelt_request req = smelt_request_default();
    req.prompt = prompt;
    req.prompt_length = 1;
    req.max_tokens = 4;
    req.output = out;
    req.output_capacity = 16;
    smelt_generation g;
    assert_int_equal(smelt_engine_generate(engine, &req, &g), SMELT_OK);
    assert_int_equal(g.token_count, 4);
    assert_int_equal(g.reason, SMELT_FINISH_LENGTH);
    const int32_t successors[6] = {2, 3, 0, 1, 2, 3};
    assert_memory_equal(out, successors, 4 * sizeof(int32_t));

    /* The plan's 6 positions: the prompt and five fed tokens fill them. */
    assert_int_equal(smelt_engine_reset(engine), SMELT_OK);
    req.max_tokens = 10;
    assert_int_equal(smelt_engine_generate(engine, &req, &g), SMELT_OK);
    assert_int_equal(g.reason, SMELT_FINISH_CONTEXT_FULL);
    assert_int_equal(g.token_count, 6);
    assert_memory_equal(out, successors, 6 * sizeof(int32_t));
    /* A full sequence takes no more prompt. */
    assert_int_equal(smelt_engine_generate(engine, &req, &g), SMELT_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(smelt_last_error(), "does not fit the plan's 6 positions"));

    /* A stop token ends generation and is not reported. */
    assert_int_equal(smelt_engine_reset(engine), SMELT_OK);
    const int32_t stop[1] = {0};
    token_log log = {.stop_after = -1};
    req.stop_tokens = stop;
    req.stop_token_count = 1;
    req.on_token = log_token;
    req.user = &log;
    assert_int_equal(smelt_engine_generate(engine, &req, &g), SMELT_OK);
    assert_int_equal(g.reason, SMELT_FINISH_STOP_TOKEN);
    assert_int_equal(g.stop_token, 0);
    assert_int_equal(g.token_count, 2);
    assert_int_equal(log.count, 2);
    assert_memory_equal(log.tokens, successors, 2 * sizeof(int32_t));

    /* The callback may stop it. */
    assert_int_equal(smelt_engine_reset(engine), SMELT_OK);
    log = (token_log){.stop_after = 3};
    req.stop_token_count = 0;
    assert_int_equal(smelt_engine_generate(engine, &req, &g), SMELT_OK);
    assert_int_equal(g.reason, SMELT_FINISH_CALLBACK);
    assert_int_equal(g.token_count, 3);
    assert_memory_equal(log.tokens, successors, 3 * sizeof(int32_t));
    req.on_token = NULL;

    /* The plan's EOS id stops it unless the request ignores it; a request's
     * own stop token is told apart. */
    toy_plan_options with_eos = o;
    with_eos.has_eos = true;
    with_eos.eos = 0;
    smelt_plan *eos_plan = open_toy_plan("eos.plan", &with_eos);
    assert_int_equal(smelt_plan_get_info(eos_plan, &info), SMELT_OK);
    assert_int_equal(info.eos_token_count, 1);
    assert_int_equal(info.eos_tokens[0], 0);
    smelt_engine *eos_engine = host_engine(eos_plan);
    smelt_plan_close(eos_plan);
    bind_successor_weights(eos_engine);
    req.max_tokens = 5;
    assert_int_equal(smelt_engine_generate(eos_engine, &req, &g), SMELT_OK);
    assert_int_equal(g.reason, SMELT_FINISH_EOS);
    assert_string_equal(smelt_finish_reason_name(g.reason), "eos");
    assert_int_equal(g.stop_token, 0);
    assert_int_equal(g.token_count, 2);
    assert_int_equal(smelt_engine_reset(eos_engine), SMELT_OK);
    req.ignore_eos = true;
    assert_int_equal(smelt_engine_generate(eos_engine, &req, &g), SMELT_OK);
    assert_int_equal(g.reason, SMELT_FINISH_LENGTH);
    assert_string_equal(smelt_finish_reason_name(g.reason), "max-tokens");
    assert_int_equal(g.token_count, 5);
    assert_memory_equal(out, successors, 5 * sizeof(int32_t));
    assert_int_equal(smelt_engine_reset(eos_engine), SMELT_OK);
    req.ignore_eos = false;
    const int32_t stop_three[1] = {3};
    req.stop_tokens = stop_three;
    req.stop_token_count = 1;
    assert_int_equal(smelt_engine_generate(eos_engine, &req, &g), SMELT_OK);
    assert_int_equal(g.reason, SMELT_FINISH_STOP_TOKEN);
    assert_int_equal(g.token_count, 1);
    req.stop_token_count = 0;
    smelt_engine_destroy(eos_engine);

    /* Sampling with top-k 1 is greedy; equal seeds give equal samples. */
    req.on_token = NULL;
    req.max_tokens = 5;
    req.temperature = 0.7f;
    req.top_k = 1;
    assert_int_equal(smelt_engine_reset(engine), SMELT_OK);
    assert_int_equal(smelt_engine_generate(engine, &req, &g), SMELT_OK);
    assert_memory_equal(out, successors, 5 * sizeof(int32_t));
    req.top_k = 0;
    req.temperature = 3.0f; /* logits 2 vs 0: the successor with p = e^(2/3) / (e^(2/3) + 3) ~ 0.39 */
    req.seed = 99;
    int32_t first[5], second[5];
    assert_int_equal(smelt_engine_reset(engine), SMELT_OK);
    assert_int_equal(smelt_engine_generate(engine, &req, &g), SMELT_OK);
    memcpy(first, out, sizeof first);
    assert_int_equal(smelt_engine_reset(engine), SMELT_OK);
    assert_int_equal(smelt_engine_generate(engine, &req, &g), SMELT_OK);
    memcpy(second, out, sizeof second);
    assert_memory_equal(first, second, sizeof first);
    for (int i = 0; i < 5; i++)
        assert_true(first[i] >= 0 && first[i] < VOCAB);

    smelt_stats stats;
    assert_int_equal(smelt_engine_stats(engine, &stats), SMELT_OK);
    assert_true(stats.decode_tokens > 0);
    assert_true(stats.decode_tokens_per_second > 0);
    smelt_engine_destroy(engine);
}

/* A GEMM's residual (cuBLASLt's C with beta = 1) is added to the product and
 * the bias on the host as well: id 1 gives h = (0.5, 1, 3, 0.25),
 * h W^T + bias = (0.5, 5, -1.25, 12.375), + h = (1, 6, 1.75, 12.625). */
static void test_gemm_residual(void **state) {
    (void)state;
    toy_plan_options o = {.host_kernels = true, .weights_in_plan = true, .residual = true};
    smelt_plan *plan = open_toy_plan("residual.plan", &o);
    smelt_engine *engine = host_engine(plan);
    smelt_plan_close(plan);
    const int32_t id = 1, at = 0;
    float row[VOCAB];
    assert_int_equal(smelt_engine_forward(engine, &id, &at, 1, SMELT_LOGITS_LAST, row, VOCAB), SMELT_OK);
    const float expected[VOCAB] = {1.0f, 6.0f, 1.75f, 12.625f};
    assert_memory_equal(row, expected, sizeof expected);
    smelt_engine_destroy(engine);
}

/* A concatenated weight (passes/fuse.c: Q, K and V as one) binds by its
 * parts' names, each into its rows: the successor model's head bound as
 * row 0 and rows 1..3 generates what it does bound whole. */
static void test_bind_concatenated(void **state) {
    (void)state;
    toy_plan_options o = {.host_kernels = true, .weights_in_plan = false, .concat_head = true};
    smelt_plan *plan = open_toy_plan("concat.plan", &o);
    assert_true(smelt_plan_has_weight(plan, "toy.head.top"));
    assert_true(smelt_plan_has_weight(plan, "toy.head.rest"));
    assert_true(smelt_plan_has_weight(plan, "toy.head.top + toy.head.rest"));
    assert_false(smelt_plan_has_weight(plan, "toy.head.weight"));
    smelt_engine *engine = host_engine(plan);
    smelt_plan_close(plan);
    const float zeros[WIDTH] = {0};
    const int64_t vector[1] = {WIDTH}, top_shape[2] = {1, WIDTH}, rest_shape[2] = {VOCAB - 1, WIDTH};
    assert_int_equal(smelt_engine_bind_weight(engine, "toy.embed_bias", SMELT_DTYPE_F32, zeros, vector, 1),
                     SMELT_OK);
    assert_int_equal(smelt_engine_bind_weight(engine, "toy.head.bias", SMELT_DTYPE_F32, zeros, vector, 1),
                     SMELT_OK);
    float w[VOCAB][WIDTH] = {{0}};
    for (int j = 0; j < WIDTH; j++)
        w[(j + 1) % VOCAB][j] = 1.0f;
    assert_int_equal(smelt_engine_bind_weight(engine, "toy.head.rest", SMELT_DTYPE_F32, w[1], top_shape, 2),
                     SMELT_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(smelt_last_error(), "has shape [3, 4] in the plan but [1, 4] was given"));
    assert_int_equal(smelt_engine_bind_weight(engine, "toy.head.rest", SMELT_DTYPE_F32, w[1], rest_shape, 2),
                     SMELT_OK);
    const int32_t id = 1, at = 0;
    float row[VOCAB];
    assert_int_equal(smelt_engine_forward(engine, &id, &at, 1, SMELT_LOGITS_LAST, row, VOCAB),
                     SMELT_ERROR_MISSING_WEIGHT);
    assert_non_null(strstr(smelt_last_error(), "(in part) is not bound"));
    assert_int_equal(smelt_engine_bind_weight(engine, "toy.head.top", SMELT_DTYPE_F32, w[0], top_shape, 2),
                     SMELT_OK);
    int32_t prompt[1] = {1}, out[16];
    smelt_request req = smelt_request_default();
    req.prompt = prompt;
    req.prompt_length = 1;
    req.max_tokens = 4;
    req.output = out;
    req.output_capacity = 16;
    smelt_generation g;
    assert_int_equal(smelt_engine_generate(engine, &req, &g), SMELT_OK);
    const int32_t successors[4] = {2, 3, 0, 1};
    assert_int_equal(g.token_count, 4);
    assert_memory_equal(out, successors, sizeof successors);
    smelt_engine_destroy(engine);
}

/* A stacked weight binds whole, or part by part by the names its template
 * makes ("experts.{e}.w" -> "experts.0.w", "experts.1.w"). */
static void test_bind_stacked(void **state) {
    (void)state;
    toy_plan_options o = {.rich = true, .host_kernels = true, .weights_in_plan = true};
    smelt_plan *plan = open_toy_plan("rich.plan", &o);
    smelt_engine *engine = host_engine(plan);
    smelt_plan_close(plan);
    const int32_t id = 1, at = 0;
    float row[VOCAB];
    const float part[3] = {1, 2, 3};
    const int64_t part_shape[1] = {3}, whole_shape[2] = {2, 3};
    assert_int_equal(smelt_engine_bind_weight(engine, "experts.0.w", SMELT_DTYPE_F32, part, part_shape, 1),
                     SMELT_OK);
    assert_int_equal(smelt_engine_forward(engine, &id, &at, 1, SMELT_LOGITS_LAST, row, VOCAB),
                     SMELT_ERROR_MISSING_WEIGHT);
    assert_non_null(strstr(smelt_last_error(), "weight 'experts.{e}.w' (in part) is not bound (1 of 5"));
    assert_int_equal(smelt_engine_bind_weight(engine, "experts.2.w", SMELT_DTYPE_F32, part, part_shape, 1),
                     SMELT_ERROR_INVALID_ARGUMENT);
    assert_int_equal(smelt_engine_bind_weight(engine, "experts.01.w", SMELT_DTYPE_F32, part, part_shape, 1),
                     SMELT_ERROR_INVALID_ARGUMENT);
    assert_int_equal(smelt_engine_bind_weight(engine, "experts.1.w", SMELT_DTYPE_F32, part, whole_shape, 2),
                     SMELT_ERROR_INVALID_ARGUMENT);
    assert_int_equal(smelt_engine_bind_weight(engine, "experts.1.w", SMELT_DTYPE_F32, part, part_shape, 1),
                     SMELT_OK);
    assert_int_equal(smelt_engine_forward(engine, &id, &at, 1, SMELT_LOGITS_LAST, row, VOCAB), SMELT_OK);
    /* The rich program is the bf16 toy: id 1 gives h = (0.5, 1, 3, 0.25),
     * h2 = h W1 + b1 = (4.5, 4, 17.5, 1.25), logits = h2 W^T. */
    const float expected[VOCAB] = {4.5f, 21.5f, 7.75f, 13.625f};
    assert_memory_equal(row, expected, sizeof expected);
    const float whole[6] = {1, 2, 3, 4, 5, 6};
    assert_int_equal(
        smelt_engine_bind_weight(engine, "experts.{e}.w", SMELT_DTYPE_F32, whole, whole_shape, 2), SMELT_OK);
    smelt_engine_destroy(engine);
}

/* smelt_plan_has_weight answers for exactly the names bind_weight does not
 * refuse as unknown: whole names, and the parts a stacked template makes. */
static void test_plan_has_weight(void **state) {
    (void)state;
    toy_plan_options o = {.rich = true, .host_kernels = true, .weights_in_plan = true};
    smelt_plan *plan = open_toy_plan("rich.plan", &o);
    assert_true(smelt_plan_has_weight(plan, "toy.embed_bias"));
    assert_true(smelt_plan_has_weight(plan, "experts.{e}.w"));
    assert_true(smelt_plan_has_weight(plan, "experts.0.w"));
    assert_true(smelt_plan_has_weight(plan, "experts.1.w"));
    assert_false(smelt_plan_has_weight(plan, "experts.2.w")); /* dim 0 is 2 */
    assert_false(smelt_plan_has_weight(plan, "experts.01.w"));
    assert_false(smelt_plan_has_weight(plan, "toy.nothing"));
    assert_false(smelt_plan_has_weight(plan, ""));
    assert_false(smelt_plan_has_weight(plan, NULL));
    assert_false(smelt_plan_has_weight(NULL, "toy.embed_bias"));
    smelt_plan_close(plan);
}

/* ---- The executor on a recording device ------------------------------------------------------ */

/* A device that records what the executor asks of it, with graphs: while
 * capturing, launches and GEMMs go into the graph instead of running. */
typedef struct recorded_launch {
    uint32_t kernel;
    uint32_t grid_x;
    void *pointers[3];
    int32_t tokens;
} recorded_launch;

typedef struct recording_device {
    rt_device base;
    recorded_launch launches[64]; /* run directly, or replayed */
    int launch_count, gemm_count;
    int64_t last_gemm_m;
    const void *last_gemm_a, *last_gemm_c;
    bool capturing;
    int graph_launches, graph_gemms, captures, replays;
    recorded_launch graph[8];
} recording_device;

static smelt_status rec_alloc(rt_device *d, uint64_t bytes, void **out, rt_error *e) {
    (void)d, (void)e;
    *out = calloc(1, bytes);
    return SMELT_OK;
}
static void rec_free(rt_device *d, void *address) { (void)d, free(address); }
static smelt_status rec_copy(rt_device *d, void *dst, const void *src, uint64_t bytes, rt_error *e) {
    (void)d, (void)e;
    memmove(dst, src, bytes);
    return SMELT_OK;
}
static smelt_status rec_zero(rt_device *d, void *address, uint64_t bytes, rt_error *e) {
    (void)d, (void)e;
    memset(address, 0, bytes);
    return SMELT_OK;
}
static smelt_status rec_launch(rt_device *device, uint32_t kernel, const rt_launch_dims *dims, void **args,
                               rt_error *e) {
    (void)e;
    recording_device *d = (recording_device *)device;
    recorded_launch r = {kernel,
                         dims->grid[0],
                         {*(void **)args[0], *(void **)args[1], *(void **)args[2]},
                         *(int32_t *)args[3]};
    if (d->capturing)
        d->graph[d->graph_launches++] = r;
    else
        d->launches[d->launch_count++] = r;
    return SMELT_OK;
}
static smelt_status rec_gemm(rt_device *device, const rt_gemm_args *g, rt_error *e) {
    (void)e;
    recording_device *d = (recording_device *)device;
    if (d->capturing)
        d->graph_gemms++;
    else
        d->gemm_count++;
    d->last_gemm_m = g->m;
    d->last_gemm_a = g->a;
    d->last_gemm_c = g->c;
    return SMELT_OK;
}
static smelt_status rec_capture_begin(rt_device *device, rt_error *e) {
    (void)e;
    recording_device *d = (recording_device *)device;
    d->capturing = true;
    d->graph_launches = d->graph_gemms = 0;
    d->captures++;
    return SMELT_OK;
}
static smelt_status rec_capture_end(rt_device *device, rt_error *e) {
    (void)e;
    ((recording_device *)device)->capturing = false;
    return SMELT_OK;
}
static smelt_status rec_replay(rt_device *device, rt_error *e) {
    (void)e;
    recording_device *d = (recording_device *)device;
    for (int i = 0; i < d->graph_launches; i++)
        d->launches[d->launch_count++] = d->graph[i];
    d->gemm_count += d->graph_gemms;
    d->replays++;
    return SMELT_OK;
}

static const rt_device_ops recording_ops = {
    .kind = "recording",
    .alloc = rec_alloc,
    .free = rec_free,
    .copy_in = rec_copy,
    .copy_out = rec_copy,
    .zero = rec_zero,
    .launch = rec_launch,
    .gemm = rec_gemm,
    .capture_begin = rec_capture_begin,
    .capture_end = rec_capture_end,
    .replay = rec_replay,
};

/* A recording device with a GPU's figures: 1 TB/s, 100 TFLOP/s, 1 us a launch. */
static bool rec_figures(const rt_device *d, prog_device_figures *out) {
    (void)d;
    *out = (prog_device_figures){1e12, 100e12, 10e12, 1e-6};
    return true;
}

static const rt_device_ops recording_gpu_ops = {
    .kind = "recording",
    .alloc = rec_alloc,
    .free = rec_free,
    .copy_in = rec_copy,
    .copy_out = rec_copy,
    .zero = rec_zero,
    .launch = rec_launch,
    .gemm = rec_gemm,
    .figures = rec_figures,
};

/* The modeled sides of a GEMV group of a W-byte weight at T tokens: the
 * fused kernel reads W once per 4-token tile in one launch; the GEMM side
 * reads it once, in two launches (GEMM and epilogue), with flops on tensor
 * cores (plan/program.h, "Choices"). */
static prog_choice gemv_like_choice(double weight_bytes, double flops_per_token) {
    prog_choice c = {.min_tokens = 2, .max_tokens = MAX_TOKENS};
    for (int64_t t = c.min_tokens; t <= c.max_tokens; t++) {
        double tiles = (double)((t + 3) / 4);
        c.cost[0][t - c.min_tokens] = (prog_choice_cost){weight_bytes * tiles, flops_per_token * t, 1, false};
        c.cost[1][t - c.min_tokens] = (prog_choice_cost){weight_bytes, flops_per_token * t, 2, true};
    }
    return c;
}

/* The choice itself, on constructed shapes under the recording GPU's
 * figures: a large weight (8 MB: 8 us a read, the GEMV's second tile costs
 * more than the GEMM side's extra launch) goes to the GEMMs from T = 5; a
 * tiny one (8 KB: launches dominate) keeps the GEMV in its whole range;
 * work that is compute-bound on CUDA cores (1 GFLOP a token) goes to the
 * tensor cores at once. */
static void test_choice_sides(void **state) {
    (void)state;
    prog_device_figures gpu;
    rec_figures(NULL, &gpu);
    prog_choice large = gemv_like_choice(8e6, 0), tiny = gemv_like_choice(8e3, 0),
                compute = gemv_like_choice(8e3, 1e9);
    assert_int_equal(program_choice_side(&large, 4, &gpu), 0);
    assert_int_equal(program_choice_side(&large, 5, &gpu), 1);
    assert_int_equal(program_choice_threshold(&large, &gpu), 4);
    assert_true(fabs(program_choice_seconds(&large, 0, 5, &gpu) - 17e-6) < 1e-15); /* 2 tiles + 1 launch */
    assert_true(fabs(program_choice_seconds(&large, 1, 5, &gpu) - 10e-6) < 1e-15); /* 1 read + 2 launches */
    assert_int_equal(program_choice_threshold(&tiny, &gpu), MAX_TOKENS);
    assert_int_equal(program_choice_threshold(&compute, &gpu), 1); /* none: from min_tokens on, GEMMs */
    assert_int_equal(program_choice_side(&compute, 1, &gpu), 0);   /* below the range: the fused kernel */
    assert_int_equal(program_choice_side(&compute, MAX_TOKENS + 1, &gpu), 1);
}

/* The executor runs one side of a choice per step: the launch (side 0,
 * tokens 1..8) or the GEMM (side 1, tokens 2..) of a choice over 2..8 — by
 * the model on a device with figures, by the fixed rule without (the
 * host: the GEMM wherever it runs), by the option when one is given. */
static void test_executor_choices(void **state) {
    (void)state;
    toy_program t;
    toy_program_make(&t, false, true, 0);
    prog_choice choice = gemv_like_choice(8e6, 0);
    t.p.choices = &choice;
    t.p.choice_count = 1;
    t.instrs[0].choice = t.instrs[1].choice = 1;
    t.instrs[0].max_tokens = MAX_TOKENS;
    t.instrs[1].min_tokens = 2;
    t.instrs[1].side = 1;
    float weight_memory[3][16] = {{0}};
    void *weights[3] = {weight_memory[0], weight_memory[1], weight_memory[2]};
    float logits[MAX_TOKENS * VOCAB];
    const int32_t ids[MAX_TOKENS] = {0}, pos[MAX_TOKENS] = {0, 1, 2, 3, 4, 5, 6, 7};
    const rt_device_ops *devices[2] = {&recording_gpu_ops, &recording_ops};
    for (int d = 0; d < 2; d++)
        for (int forced = 0; forced < 2; forced++) {
            recording_device device = {.base.ops = devices[d]};
            rt_executor x;
            rt_error e = {0};
            assert_int_equal(rt_executor_init(&x, &t.p, &device.base, weights, false, &e), SMELT_OK);
            if (forced) rt_executor_choose(&x, 6);
            for (uint32_t tokens = 1; tokens <= MAX_TOKENS; tokens++) {
                int launches = device.launch_count, gemms = device.gemm_count;
                assert_int_equal(rt_executor_step(&x, ids, pos, tokens, PROG_ROWS_ALL, logits, NULL, &e),
                                 SMELT_OK);
                int64_t gemv_up_to = forced ? 6 : d == 0 ? 4 : 1;
                bool gemv = tokens == 1 || tokens <= gemv_up_to;
                assert_int_equal(device.launch_count - launches, gemv ? 1 : 0);
                assert_int_equal(device.gemm_count - gemms, gemv ? 0 : 1);
            }
            rt_executor_free(&x);
        }
}

static void test_executor_graphs(void **state) {
    (void)state;
    toy_program t;
    toy_program_make(&t, false, true, 0);
    recording_device device = {.base.ops = &recording_ops};
    float weight_memory[3][16] = {{0}};
    void *weights[3] = {weight_memory[0], weight_memory[1], weight_memory[2]};
    rt_executor x;
    rt_error e = {0};
    assert_int_equal(rt_executor_init(&x, &t.p, &device.base, weights, true, &e), SMELT_OK);
    assert_true(x.use_graphs);
    float logits[MAX_TOKENS * VOCAB];
    const int32_t ids[MAX_TOKENS] = {1, 2, 3, 0, 1, 2, 3, 0}, pos[MAX_TOKENS] = {0, 1, 2, 3, 4, 5, 6, 7};

    /* Prefill of 8: grid ceil(4 * 8 / 32) = 1, pointers resolved, T passed. */
    assert_int_equal(rt_executor_step(&x, ids, pos, 8, PROG_ROWS_ALL, logits, NULL, &e), SMELT_OK);
    assert_int_equal(device.launch_count, 1);
    assert_int_equal(device.gemm_count, 1);
    assert_int_equal(device.last_gemm_m, 8);
    recorded_launch *l = &device.launches[0];
    assert_int_equal(l->grid_x, 1);
    assert_ptr_equal(l->pointers[0], x.arena);
    assert_ptr_equal(l->pointers[1], weights[0]);
    assert_ptr_equal(l->pointers[2], (uint8_t *)x.arena + AT_H);
    assert_int_equal(l->tokens, 8);
    assert_memory_equal((uint8_t *)x.arena + AT_IDS, ids, sizeof ids);
    assert_memory_equal((uint8_t *)x.arena + AT_POS, pos, sizeof pos);
    assert_int_equal(x.launches_last_step, 2);

    /* Decode: the first step runs directly, the second is captured and
     * replayed, the third only replayed. */
    assert_int_equal(rt_executor_step(&x, ids, pos, 1, PROG_ROWS_LAST, logits, NULL, &e), SMELT_OK);
    assert_int_equal(device.captures, 0);
    assert_int_equal(device.launch_count, 2);
    assert_int_equal(rt_executor_step(&x, ids, pos, 1, PROG_ROWS_LAST, logits, NULL, &e), SMELT_OK);
    assert_int_equal(device.captures, 1);
    assert_int_equal(device.replays, 1);
    assert_int_equal(device.graph_launches, 1);
    assert_int_equal(device.graph_gemms, 1);
    assert_int_equal(device.graph[0].tokens, 1);
    assert_int_equal(rt_executor_step(&x, ids, pos, 1, PROG_ROWS_LAST, logits, NULL, &e), SMELT_OK);
    assert_int_equal(device.captures, 1);
    assert_int_equal(device.replays, 2);
    assert_int_equal(device.launch_count, 4);
    assert_int_equal(device.gemm_count, 4);
    assert_int_equal(x.launches_last_step, 2);
    assert_int_equal(x.graph_replays, 2);

    /* A prefill in between runs directly and leaves the graph alone; a moved
     * weight makes the next decode step capture again. */
    assert_int_equal(rt_executor_step(&x, ids, pos, 3, PROG_ROWS_ALL, logits, NULL, &e), SMELT_OK);
    assert_int_equal(device.last_gemm_m, 3);
    assert_int_equal(rt_executor_step(&x, ids, pos, 1, PROG_ROWS_LAST, logits, NULL, &e), SMELT_OK);
    assert_int_equal(device.captures, 1);
    rt_executor_invalidate_graph(&x);
    assert_int_equal(rt_executor_step(&x, ids, pos, 1, PROG_ROWS_LAST, logits, NULL, &e), SMELT_OK);
    assert_int_equal(device.captures, 2);

    /* Steps the program cannot take are refused before the device is used. */
    int launches = device.launch_count;
    assert_int_equal(rt_executor_step(&x, ids, pos, 9, PROG_ROWS_ALL, logits, NULL, &e),
                     SMELT_ERROR_INVALID_ARGUMENT);
    assert_int_equal(rt_executor_step(&x, ids, pos, 2, (prog_rows)3, logits, NULL, &e),
                     SMELT_ERROR_INVALID_ARGUMENT);
    int32_t token;
    assert_int_equal(rt_executor_step(&x, ids, pos, 2, PROG_ROWS_ALL, logits, &token, &e),
                     SMELT_ERROR_INVALID_ARGUMENT); /* the greedy token is the last row's */
    assert_int_equal(device.launch_count, launches);
    rt_executor_free(&x);
}

/* A step that wants the last row runs the wanted-rows instructions at one
 * token on the last rows: the launch's grid, token count and moved
 * pointers, the GEMM's one row of A and C; one that wants none skips them. */
static void test_executor_wanted_rows(void **state) {
    (void)state;
    toy_program t;
    toy_program_make(&t, false, true, 0);
    prog_launch *embed = &t.instrs[0].as.launch;
    t.instrs[0].wanted_rows = t.instrs[1].wanted_rows = true; /* as if its h fed the head alone */
    embed->args[0].row_bytes = 4;                             /* ids */
    embed->args[2].row_bytes = WIDTH * 4;                     /* h */
    embed->rule.grid[0] = (prog_affine){1, 0, 1};             /* a block per token: T blocks */
    recording_device device = {.base.ops = &recording_ops};
    float weight_memory[3][16] = {{0}};
    void *weights[3] = {weight_memory[0], weight_memory[1], weight_memory[2]};
    rt_executor x;
    rt_error e = {0};
    assert_int_equal(rt_executor_init(&x, &t.p, &device.base, weights, false, &e), SMELT_OK);
    float logits[MAX_TOKENS * VOCAB];
    const int32_t ids[MAX_TOKENS] = {1, 2, 3, 0, 1, 2, 3, 0}, pos[MAX_TOKENS] = {0, 1, 2, 3, 4, 5, 6, 7};
    uint8_t *arena = x.arena;

    assert_int_equal(rt_executor_step(&x, ids, pos, 5, PROG_ROWS_ALL, logits, NULL, &e), SMELT_OK);
    assert_int_equal(device.launches[0].grid_x, 5);
    assert_int_equal(device.launches[0].tokens, 5);
    assert_ptr_equal(device.launches[0].pointers[0], arena + AT_IDS);
    assert_ptr_equal(device.launches[0].pointers[2], arena + AT_H);
    /* Rows 0-3, then the last by itself (as a step wanting it alone computes it). */
    assert_int_equal(device.gemm_count, 2);
    assert_int_equal(device.last_gemm_m, 1);
    assert_ptr_equal(device.last_gemm_a, arena + AT_H + 4 * WIDTH * 4);
    assert_ptr_equal(device.last_gemm_c, arena + AT_LOGITS + 4 * VOCAB * 4);
    assert_int_equal(x.launches_last_step, 3);

    /* The last of 5 rows: one block at one token, 4 rows on. */
    memset(logits, 0, sizeof logits);
    for (int v = 0; v < VOCAB; v++)
        ((float *)(arena + AT_LOGITS))[4 * VOCAB + v] = (float)(v + 1); /* where row 4 lives */
    assert_int_equal(rt_executor_step(&x, ids, pos, 5, PROG_ROWS_LAST, logits, NULL, &e), SMELT_OK);
    assert_int_equal(device.launch_count, 2);
    assert_int_equal(device.launches[1].grid_x, 1);
    assert_int_equal(device.launches[1].tokens, 1);
    assert_ptr_equal(device.launches[1].pointers[0], arena + AT_IDS + 4 * 4);
    assert_ptr_equal(device.launches[1].pointers[1], weights[0]); /* not moved */
    assert_ptr_equal(device.launches[1].pointers[2], arena + AT_H + 4 * WIDTH * 4);
    assert_int_equal(device.gemm_count, 3);
    assert_int_equal(device.last_gemm_m, 1);
    assert_ptr_equal(device.last_gemm_a, arena + AT_H + 4 * WIDTH * 4);
    assert_ptr_equal(device.last_gemm_c, arena + AT_LOGITS + 4 * VOCAB * 4);
    const float last_row[VOCAB] = {1, 2, 3, 4}; /* row 4 of the logits alone is copied out */
    assert_memory_equal(logits, last_row, sizeof last_row);
    assert_int_equal(x.launches_last_step, 2);

    /* No rows: the head does not run, nothing is copied (logits may be NULL). */
    assert_int_equal(rt_executor_step(&x, ids, pos, 5, PROG_ROWS_NONE, NULL, NULL, &e), SMELT_OK);
    assert_int_equal(device.launch_count, 2);
    assert_int_equal(device.gemm_count, 3);
    assert_int_equal(x.launches_last_step, 0);
    rt_executor_free(&x);
}

/* ---- cuda without a driver, and "auto" ------------------------------------------------------- */

/* Drivers that are not there or are stubs: a clean NO_DEVICE on any machine. */
static void test_cuda_driver_overrides(void **state) {
    (void)state;
    rt_device *device = NULL;
    rt_error e = {0};
    const char *stub = "/usr/local/cuda/lib64/stubs/libcuda.so";
    if (access(stub, R_OK) == 0) { /* every symbol, but no GPU behind it */
        setenv("SMELT_CUDA_DRIVER", stub, 1);
        assert_int_equal(rt_device_cuda_create(0, &device, &e), SMELT_ERROR_NO_DEVICE);
        assert_non_null(strstr(e.message, "no usable CUDA GPU: cuInit failed"));
    }
    setenv("SMELT_CUDA_DRIVER", "/nonexistent/libcuda.so.1", 1);
    assert_int_equal(rt_device_cuda_create(0, &device, &e), SMELT_ERROR_NO_DEVICE);
    assert_non_null(strstr(e.message, "no CUDA driver found (/nonexistent/libcuda.so.1"));
    assert_null(device);
    unsetenv("SMELT_CUDA_DRIVER");
}

static bool driver_installed(void) {
    void *driver = dlopen("libcuda.so.1", RTLD_NOW | RTLD_LOCAL);
    if (driver) dlclose(driver);
    return driver != NULL;
}

static void test_cuda_without_driver(void **state) {
    (void)state;
    unsetenv("SMELT_CUDA_DRIVER");
    unsetenv("SMELT_CUBLASLT");
    if (driver_installed()) skip(); /* test_cuda_on_gpu covers such machines */
    rt_device *device = NULL;
    rt_error e = {0};
    assert_int_equal(rt_device_cuda_create(0, &device, &e), SMELT_ERROR_NO_DEVICE);
    assert_null(device);
    assert_non_null(strstr(e.message, "no CUDA driver found (libcuda.so.1"));

    /* Through the API: "cuda" fails cleanly, "auto" falls back to host. */
    toy_plan_options o = {.host_kernels = true, .weights_in_plan = true, .cuda_binaries = true};
    smelt_plan *plan = open_toy_plan("gpu.plan", &o);
    smelt_plan_info info;
    assert_int_equal(smelt_plan_get_info(plan, &info), SMELT_OK);
    assert_true(info.has_cuda_kernels);
    smelt_engine_options options = smelt_engine_options_default();
    options.device = "cuda";
    smelt_engine *engine = NULL;
    assert_int_equal(smelt_engine_create(plan, &options, &engine), SMELT_ERROR_NO_DEVICE);
    assert_null(engine);
    assert_non_null(strstr(smelt_last_error(), "no CUDA driver found"));
    options.device = "tpu";
    assert_int_equal(smelt_engine_create(plan, &options, &engine), SMELT_ERROR_INVALID_ARGUMENT);
    assert_non_null(strstr(smelt_last_error(), "unknown device 'tpu' (expected auto, host or cuda)"));
    assert_int_equal(smelt_engine_create(plan, NULL, &engine), SMELT_OK);
    assert_non_null(strstr(smelt_engine_device_name(engine), "host"));
    const int32_t ids[1] = {2}, pos[1] = {0};
    float row[VOCAB];
    assert_int_equal(smelt_engine_forward(engine, ids, pos, 1, SMELT_LOGITS_LAST, row, VOCAB), SMELT_OK);
    assert_true(row[0] == 0.5f && row[1] == 5.0f && row[2] == -1.25f && row[3] == 12.375f);
    smelt_engine_destroy(engine);

    /* A plan without host kernels cannot run on the host. */
    o.host_kernels = false;
    smelt_plan *gpu_only = open_toy_plan("gpu-only.plan", &o);
    assert_int_equal(smelt_engine_create(gpu_only, NULL, &engine), SMELT_ERROR_NO_DEVICE);
    options.device = "host";
    assert_int_equal(smelt_engine_create(gpu_only, &options, &engine), SMELT_ERROR_UNSUPPORTED);
    assert_non_null(
        strstr(smelt_last_error(), "the plan has no host kernels: compile it with --target host"));
    smelt_plan_close(gpu_only);
    smelt_plan_close(plan);
}

/* Where a GPU and driver are present: the same plans on it, through NVRTC's
 * PTX, cuBLASLt and CUDA graphs, give the host's logits (the toy's numbers
 * are exact in f32 and bf16). Skipped elsewhere. */
static void test_cuda_on_gpu(void **state) {
    (void)state;
    unsetenv("SMELT_CUDA_DRIVER");
    unsetenv("SMELT_CUBLASLT");
    rt_device *device = NULL;
    rt_error e = {0};
    if (rt_device_cuda_create(0, &device, &e) != SMELT_OK) skip();
    rt_device_destroy(device);
#ifndef SMELT_HAVE_NVRTC
    skip(); /* no PTX to run without NVRTC */
#endif
    const int32_t ids[3] = {2, 0, 3}, pos[3] = {0, 1, 2};
    const float expected[2][3 * VOCAB] = {
        {0.5f, 5.0f, -1.25f, 12.375f, 2.5f, 3.0f, 2.75f, 12.375f, 0.5f, 3.0f, -3.25f, 12.375f},
        {6.5f, 21.5f, 9.75f, 15.625f, 6.5f, 23.5f, 9.75f, 16.625f, 4.5f, 148.0f, 3.75f, 78.875f}};
    for (int bf16 = 0; bf16 < 2; bf16++) {
        toy_plan_options o = {
            .bf16 = bf16, .weights_in_plan = true, .cuda_binaries = true, .host_kernels = true};
        smelt_plan *plan = open_toy_plan(bf16 ? "gpu-bf16.plan" : "gpu-f32.plan", &o);
        smelt_engine *engine = NULL;
        assert_int_equal(smelt_engine_create(plan, NULL, &engine), SMELT_OK); /* auto picks the GPU */
        smelt_plan_close(plan);
        assert_non_null(strstr(smelt_engine_device_name(engine), "cuda:0"));
        float logits[3 * VOCAB];
        assert_int_equal(smelt_engine_forward(engine, ids, pos, 3, SMELT_LOGITS_ALL, logits, 3 * VOCAB),
                         SMELT_OK);
        assert_memory_equal(logits, expected[bf16], sizeof logits);
        for (int step = 0; step < 3; step++) { /* run, capture + replay, replay: the same row each time */
            const int32_t id = 2, at = 3 + step;
            float row[VOCAB] = {NAN, NAN, NAN, NAN};
            assert_int_equal(smelt_engine_forward(engine, &id, &at, 1, SMELT_LOGITS_LAST, row, VOCAB),
                             SMELT_OK);
            assert_memory_equal(row, expected[bf16], sizeof row);
        }
        smelt_stats stats;
        assert_int_equal(smelt_engine_stats(engine, &stats), SMELT_OK);
        assert_int_equal(stats.graph_replays, 2);
        smelt_engine_destroy(engine);
    }
}

/* ---- device_cuda.c end to end on a stand-in driver ------------------------------------------- */

static smelt_engine *cuda_engine(smelt_plan *plan) {
    smelt_engine_options options = smelt_engine_options_default();
    options.device = "cuda";
    smelt_engine *engine = NULL;
    smelt_status s = smelt_engine_create(plan, &options, &engine);
    if (s != SMELT_OK) fail_msg("cuda engine: %s: %s", smelt_status_name(s), smelt_last_error());
    return engine;
}

/* The cuda device on the fake: kernels found through the plan's PTX, the
 * arguments passed by cuLaunchKernel, the GEMMs through cuBLASLt's
 * column-major view, decode steps captured once and replayed: the logits
 * are the host's, bit for bit. */
static void test_cuda_on_fake_driver(void **state) {
    (void)state;
    char driver[256], kernels[256];
    fake_cuda_build(scratch_folder, driver, sizeof driver);
    scratch_path(kernels, sizeof kernels, "kernels.so");
    const cg_host_object *object = toy_host_object();
    scratch_write(kernels, object->bytes, object->size);
    setenv("SMELT_CUDA_DRIVER", driver, 1);
    setenv("SMELT_CUBLASLT", driver, 1);
    setenv("FAKE_CUDA_HOST_KERNELS", kernels, 1);
    void *fake = dlopen(driver, RTLD_NOW | RTLD_LOCAL);
    assert_non_null(fake);
    void (*counters)(int[4]) = (void (*)(int[4]))(uintptr_t)dlsym(fake, "fake_cuda_counters");
    void (*shutdown)(void) = (void (*)(void))(uintptr_t)dlsym(fake, "fake_cuda_shutdown");
    assert_non_null(counters);
    assert_non_null(shutdown);

    toy_plan_options o = {.host_kernels = false, .weights_in_plan = true, .cuda_binaries = true};
    smelt_plan *plan = open_toy_plan("cuda-f32.plan", &o);
    smelt_engine *engine = cuda_engine(plan);
    smelt_plan_close(plan);
    assert_string_equal(smelt_engine_device_name(engine), "cuda:0 Fake GPU (sm_90)");
    const int32_t ids[3] = {2, 0, 3}, pos[3] = {0, 1, 2};
    float logits[3 * VOCAB];
    assert_int_equal(smelt_engine_forward(engine, ids, pos, 3, SMELT_LOGITS_ALL, logits, 3 * VOCAB),
                     SMELT_OK);
    const float expected[3 * VOCAB] = {0.5f,  5.0f,    -1.25f, 12.375f, 2.5f,   3.0f,
                                       2.75f, 12.375f, 0.5f,   3.0f,    -3.25f, 12.375f};
    assert_memory_equal(logits, expected, sizeof expected);
    int seen[4];
    counters(seen);
    assert_int_equal(seen[0], 1); /* one launch, one matmul, both kernels' PTX loaded */
    assert_int_equal(seen[2], 1);
    assert_int_equal(seen[3], 2);

    /* Decode: run, then captured and replayed, then replayed. Ids 0, 1, 2
     * give the logits of rows 1, 0, 0 above (ids 1 and 2 agree). */
    const int expected_row[3] = {1, 0, 0};
    for (int step = 0; step < 3; step++) {
        const int32_t id = step, at = 3 + step;
        float row[VOCAB] = {NAN, NAN, NAN, NAN};
        assert_int_equal(smelt_engine_forward(engine, &id, &at, 1, SMELT_LOGITS_LAST, row, VOCAB), SMELT_OK);
        assert_memory_equal(row, &expected[expected_row[step] * VOCAB], sizeof row);
    }
    smelt_stats stats;
    assert_int_equal(smelt_engine_stats(engine, &stats), SMELT_OK);
    assert_int_equal(stats.graph_replays, 2);
    assert_int_equal(stats.launches_per_step, 2);
    counters(seen);
    assert_int_equal(seen[1], 2);
    assert_int_equal(seen[0], 4);
    smelt_engine_destroy(engine);

    /* bf16: two GEMMs, bf16 in and out, a bf16 bias. */
    o.bf16 = true;
    plan = open_toy_plan("cuda-bf16.plan", &o);
    engine = cuda_engine(plan);
    smelt_plan_close(plan);
    assert_int_equal(smelt_engine_forward(engine, ids, pos, 3, SMELT_LOGITS_ALL, logits, 3 * VOCAB),
                     SMELT_OK);
    const float expected_bf16[3 * VOCAB] = {6.5f,  21.5f,   9.75f, 15.625f, 6.5f,  23.5f,
                                            9.75f, 16.625f, 4.5f,  148.0f,  3.75f, 78.875f};
    assert_memory_equal(logits, expected_bf16, sizeof expected_bf16);
    smelt_engine_destroy(engine);

    /* Generation over graphs, weights bound at run time. */
    o = (toy_plan_options){.weights_in_plan = false, .cuda_binaries = true, .max_positions = 64};
    plan = open_toy_plan("cuda-unbound.plan", &o);
    engine = cuda_engine(plan);
    smelt_plan_close(plan);
    bind_successor_weights(engine);
    int32_t prompt[2] = {3, 0}, out[8];
    smelt_request req = smelt_request_default();
    req.prompt = prompt;
    req.prompt_length = 2;
    req.max_tokens = 8;
    req.output = out;
    req.output_capacity = 8;
    smelt_generation g;
    assert_int_equal(smelt_engine_generate(engine, &req, &g), SMELT_OK);
    const int32_t successors[8] = {1, 2, 3, 0, 1, 2, 3, 0};
    assert_int_equal(g.token_count, 8);
    assert_memory_equal(out, successors, sizeof successors);
    assert_int_equal(smelt_engine_stats(engine, &stats), SMELT_OK);
    assert_int_equal(stats.graph_replays, 6); /* 7 decode steps: 1 run, 6 replayed */
    smelt_engine_destroy(engine);

    /* Without cuBLASLt "cuda" cannot run GEMMs, and "auto" takes the host. */
    setenv("SMELT_CUBLASLT", "/nonexistent/libcublasLt.so", 1);
    o = (toy_plan_options){.weights_in_plan = true, .cuda_binaries = true, .host_kernels = true};
    plan = open_toy_plan("cuda-no-blas.plan", &o);
    smelt_engine_options options = smelt_engine_options_default();
    options.device = "cuda";
    assert_int_equal(smelt_engine_create(plan, &options, &engine), SMELT_ERROR_UNSUPPORTED);
    assert_non_null(strstr(smelt_last_error(), "cuBLASLt not found (/nonexistent/libcublasLt.so)"));
    assert_int_equal(smelt_engine_create(plan, NULL, &engine), SMELT_OK);
    assert_non_null(strstr(smelt_engine_device_name(engine), "host"));
    smelt_engine_destroy(engine);
    smelt_plan_close(plan);

    shutdown();
    dlclose(fake);
    unsetenv("SMELT_CUDA_DRIVER");
    unsetenv("SMELT_CUBLASLT");
    unsetenv("FAKE_CUDA_HOST_KERNELS");
}

/* The cuda device's scaled GEMMs on the stand-in driver (no GPU here: this
 * is all that runs that code): whether it runs them follows the compute
 * capability, cuBLASLt's version and its heuristic; prepare_gemm widens a
 * weight's f16 scales into an f32 buffer that stays put when they are
 * prepared again; the FP8 matmul gets cuBLASLt's types, ops, outer-vector
 * scale modes and pointers, the bias epilogue and the residual as C with
 * beta 1, and its numbers are the double-precision loop's. */
static void test_cuda_scaled_gemm_on_fake_driver(void **state) {
    (void)state;
    char driver[256];
    fake_cuda_build(scratch_folder, driver, sizeof driver);
    setenv("SMELT_CUDA_DRIVER", driver, 1);
    setenv("SMELT_CUBLASLT", driver, 1);
    void *fake = dlopen(driver, RTLD_NOW | RTLD_LOCAL);
    assert_non_null(fake);
    fake_cuda_last_matmul_fn last_matmul =
        (fake_cuda_last_matmul_fn)(uintptr_t)dlsym(fake, "fake_cuda_last_matmul");
    void (*shutdown)(void) = (void (*)(void))(uintptr_t)dlsym(fake, "fake_cuda_shutdown");
    assert_non_null(last_matmul);
    assert_non_null(shutdown);
    rt_device *d = NULL;
    rt_error e = {0};

    const struct {
        const char *arch, *version;
        bool no_fp8, runs;
    } cases[] = {
        {"90", "130100", false, true},  {"89", "120900", false, true},  {"86", "130100", false, false},
        {"90", "120804", false, false}, {"100", "130100", true, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        setenv("FAKE_CUDA_ARCH", cases[i].arch, 1);
        setenv("FAKE_CUBLASLT_VERSION", cases[i].version, 1);
        if (cases[i].no_fp8)
            setenv("FAKE_CUBLASLT_NO_FP8", "1", 1);
        else
            unsetenv("FAKE_CUBLASLT_NO_FP8");
        assert_int_equal(rt_device_cuda_create(0, &d, &e), SMELT_OK);
        if (d->ops->runs_scaled_gemm(d, SMELT_DTYPE_F8E4M3) != cases[i].runs)
            fail_msg("sm_%s, cuBLASLt %s%s: runs_scaled_gemm is not %d", cases[i].arch, cases[i].version,
                     cases[i].no_fp8 ? " without FP8 algorithms" : "", cases[i].runs);
        assert_false(d->ops->runs_scaled_gemm(d, SMELT_DTYPE_I8)); /* int8: the fallback kernels */
        rt_device_destroy(d);
    }
    unsetenv("FAKE_CUDA_ARCH");
    unsetenv("FAKE_CUBLASLT_VERSION");
    unsetenv("FAKE_CUBLASLT_NO_FP8");

    /* [3, 32] x [16, 32]^T E4M3 codes (multiples of 1/4: exact sums), bf16 out. */
    enum { M = 3, N = 16, KK = 32, SCALES_AT = N * KK };
    static const uint8_t codes[8] = {0x30, 0xb8, 0x3c, 0x40, 0xc4, 0x28, 0x48, 0xb4};
    uint8_t weight[SCALES_AT + 2 * N], a[M * KK];
    float weight_scales[N], token_scales[M] = {0.5f, 3.0f, 0.125f};
    uint16_t bias[N], residual[M * N];
    for (int i = 0; i < N * KK; i++)
        weight[i] = codes[(i * 5 + 3) % 8];
    for (int j = 0; j < N; j++) {
        weight_scales[j] = 0.25f * (float)(j + 1);
        uint16_t h = plan_f32_to_f16(weight_scales[j]);
        memcpy(weight + SCALES_AT + 2 * j, &h, 2);
        bias[j] = plan_f32_to_bf16((float)j - 4.0f);
    }
    for (int i = 0; i < M * KK; i++)
        a[i] = codes[(i * 7 + 1) % 8];
    for (int i = 0; i < M * N; i++)
        residual[i] = plan_f32_to_bf16(0.5f * (float)i);
    assert_int_equal(rt_device_cuda_create(0, &d, &e), SMELT_OK);
    assert_true(d->ops->runs_scaled_gemm(d, SMELT_DTYPE_F8E4M3));
    void *on_device[6]; /* weight, a, a_scale, bias, residual, c */
    const void *host[5] = {weight, a, token_scales, bias, residual};
    const uint64_t sizes[6] = {sizeof weight, sizeof a,        sizeof token_scales,
                               sizeof bias,   sizeof residual, M * N * 2};
    for (int i = 0; i < 6; i++) {
        assert_int_equal(d->ops->alloc(d, sizes[i], &on_device[i], &e), SMELT_OK);
        if (i < 5) assert_int_equal(d->ops->copy_in(d, on_device[i], host[i], sizes[i], &e), SMELT_OK);
    }
    rt_gemm_args g = {.m = M,
                      .n = N,
                      .k = KK,
                      .dtype_a = SMELT_DTYPE_F8E4M3,
                      .dtype_b = SMELT_DTYPE_F8E4M3,
                      .dtype_c = SMELT_DTYPE_BF16,
                      .dtype_bias = SMELT_DTYPE_BF16,
                      .b_transposed = true,
                      .has_bias = true,
                      .a = on_device[1],
                      .b = on_device[0],
                      .bias = on_device[3],
                      .residual = on_device[4],
                      .c = on_device[5],
                      .b_weight = 5,
                      .b_weight_offset = 0,
                      .has_scales = true,
                      .a_scale = on_device[2],
                      .b_scale = rt_address_at(on_device[0], SCALES_AT),
                      .dtype_b_scale = SMELT_DTYPE_F16,
                      .b_scale_offset = SCALES_AT};
    assert_int_equal(d->ops->gemm(d, &g, &e), SMELT_ERROR_DEVICE); /* its f16 scales have no f32 copy yet */
    assert_non_null(strstr(e.message, "the scaled product reading weight 5 was not prepared"));
    assert_int_equal(d->ops->prepare_gemm(d, &g, &e), SMELT_OK);
    assert_int_equal(d->ops->gemm(d, &g, &e), SMELT_OK);
    fake_cuda_matmul_info m;
    last_matmul(&m);
    assert_int_equal(m.type_a, 28); /* CUDA_R_8F_E4M3: the weight's codes as cuBLASLt's A */
    assert_int_equal(m.type_b, 28);
    assert_int_equal(m.type_c, 14); /* CUDA_R_16BF */
    assert_int_equal(m.type_d, 14);
    assert_int_equal(m.trans_a, 1); /* "TN" */
    assert_int_equal(m.trans_b, 0);
    assert_true(m.a_rows == KK && m.a_cols == N && m.a_ld == KK);
    assert_true(m.b_rows == KK && m.b_cols == M && m.b_ld == KK);
    assert_true(m.d_rows == N && m.d_cols == M && m.d_ld == N);
    assert_ptr_equal(m.a, g.b);
    assert_ptr_equal(m.b, g.a);
    assert_int_equal(m.a_scale_mode, 3); /* CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F */
    assert_int_equal(m.b_scale_mode, 3);
    assert_ptr_equal(m.b_scale, g.a_scale); /* the tokens' scales: cuBLASLt's N */
    assert_true(m.a_scale != g.b_scale);    /* the weight's: their f32 copy, cuBLASLt's M */
    assert_memory_equal(m.a_scale, weight_scales, sizeof weight_scales);
    assert_int_equal(m.epilogue, 4); /* CUBLASLT_EPILOGUE_BIAS */
    assert_ptr_equal(m.bias, g.bias);
    assert_int_equal(m.bias_type, 14);
    assert_true(m.alpha == 1.0f && m.beta == 1.0f);
    assert_ptr_equal(m.c, g.residual);
    assert_ptr_equal(m.d, g.c);
    uint16_t c[M * N];
    assert_int_equal(d->ops->copy_out(d, c, g.c, sizeof c, &e), SMELT_OK);
    for (int i = 0; i < M; i++)
        for (int j = 0; j < N; j++) {
            double sum = 0;
            for (int k = 0; k < KK; k++)
                sum += (double)plan_f8e4m3_to_f32(a[i * KK + k]) * plan_f8e4m3_to_f32(weight[j * KK + k]);
            double v = sum * weight_scales[j] * token_scales[i] + plan_bf16_to_f32(residual[i * N + j]) +
                       plan_bf16_to_f32(bias[j]);
            assert_int_equal(c[i * N + j], plan_f32_to_bf16((float)v)); /* every term exact */
        }
    /* The weight bound again with other scales: refilled in the same buffer. */
    const void *copy = m.a_scale;
    for (int j = 0; j < N; j++) {
        weight_scales[j] = 2.0f * weight_scales[j];
        uint16_t h = plan_f32_to_f16(weight_scales[j]);
        assert_int_equal(d->ops->copy_in(d, rt_address_at(on_device[0], SCALES_AT + 2 * j), &h, 2, &e),
                         SMELT_OK);
    }
    assert_int_equal(d->ops->prepare_gemm(d, &g, &e), SMELT_OK);
    assert_int_equal(d->ops->gemm(d, &g, &e), SMELT_OK);
    last_matmul(&m);
    assert_ptr_equal(m.a_scale, copy);
    assert_memory_equal(m.a_scale, weight_scales, sizeof weight_scales);
    /* f32 scales are used as they are. */
    rt_gemm_args f32_scales = g;
    f32_scales.b_scale = on_device[2], f32_scales.n = M, f32_scales.dtype_b_scale = SMELT_DTYPE_F32;
    f32_scales.b_scale_offset = 0, f32_scales.b_weight = 6, f32_scales.has_bias = false,
    f32_scales.residual = NULL;
    f32_scales.dtype_c = SMELT_DTYPE_F32; /* rows of 3 f32: 12 bytes, not a multiple of 16 */
    assert_int_equal(d->ops->prepare_gemm(d, &f32_scales, &e), SMELT_ERROR_UNSUPPORTED);
    assert_non_null(strstr(e.message, "rows of C of a multiple of 16 bytes"));
    f32_scales.n = 4, f32_scales.b_scale = on_device[3]; /* 4 f32 of the bias buffer stand in */
    assert_int_equal(d->ops->prepare_gemm(d, &f32_scales, &e), SMELT_OK);
    assert_int_equal(d->ops->gemm(d, &f32_scales, &e), SMELT_OK);
    last_matmul(&m);
    assert_ptr_equal(m.a_scale, f32_scales.b_scale);
    assert_int_equal(m.epilogue, 1);
    assert_true(m.beta == 0.0f);
    /* Shapes and codes cuBLASLt's FP8 GEMM does not take are refused, for the fallback kernels to run. */
    rt_gemm_args bad = g;
    bad.k = 8;
    assert_int_equal(d->ops->prepare_gemm(d, &bad, &e), SMELT_ERROR_UNSUPPORTED);
    assert_non_null(strstr(e.message, "needs K a multiple of 16"));
    bad = g;
    bad.dtype_a = bad.dtype_b = SMELT_DTYPE_I8;
    assert_int_equal(d->ops->prepare_gemm(d, &bad, &e), SMELT_ERROR_UNSUPPORTED);
    for (int i = 0; i < 6; i++)
        d->ops->free(d, on_device[i]);
    rt_device_destroy(d);
    shutdown();
    dlclose(fake);
    unsetenv("SMELT_CUDA_DRIVER");
    unsetenv("SMELT_CUBLASLT");
}

static void test_plan_errors(void **state) {
    (void)state;
    smelt_plan *plan = NULL;
    assert_int_equal(smelt_plan_open("/nonexistent/model.plan", &plan), SMELT_ERROR_IO);
    assert_null(plan);
    assert_true(strlen(smelt_last_error()) > 0);
    const char garbage[100] = "not a plan at all";
    assert_int_equal(smelt_plan_open_memory(garbage, sizeof garbage, &plan), SMELT_ERROR_BAD_PLAN);
    assert_non_null(strstr(smelt_last_error(), "not a smelt plan"));
    assert_string_equal(smelt_status_name(SMELT_ERROR_BAD_PLAN), "SMELT_ERROR_BAD_PLAN");
    assert_string_equal(smelt_status_name(SMELT_OK), "SMELT_OK");
    assert_string_equal(smelt_status_name((smelt_status)99), "SMELT_UNKNOWN_STATUS");

    /* A plan whose program names a kernel the table lacks is refused at open. */
    toy_program t;
    toy_program_make(&t, false, true, 0);
    t.instrs[0].as.launch.kernel = 5;
    uint8_t *bytes;
    size_t size;
    assert_true(program_encode(&t.p, &bytes, &size));
    plan_writer w;
    plan_writer_init(&w, "test");
    plan_writer_add_section(&w, PLAN_SECTION_PROGRAM, bytes, size);
    char path[256];
    scratch_path(path, sizeof path, "lying.plan");
    scratch_plan_write(&w, path, NULL);
    free(bytes);
    assert_int_equal(smelt_plan_open(path, &plan), SMELT_ERROR_BAD_PLAN);
    assert_non_null(strstr(smelt_last_error(), "instruction 0 launches kernel 5 but the plan has 0 kernels"));
}

/* The default costs (plan/program_cost.c), against values worked out by
 * hand: an activation read by its extent, a KV cache (10 rows of 100
 * bytes) read as C + T rows and written as T rows, the token argument
 * nothing; a GEMM [T, 5] x [3, 5]^T in bf16 with an f32 bias and output. */
static void test_default_costs(void **state) {
    (void)state;
    uint64_t state_bytes[1] = {1000}, state_rows[1] = {10};
    program p = {.max_tokens = 8, .state_count = 1, .state_bytes = state_bytes, .state_rows = state_rows};
    prog_launch l = {.arg_count = 4};
    l.args[0] = (prog_arg){.kind = PROG_ARG_POINTER, .ref = {PROG_BUFFER_ARENA, 0, 64}, .extent = {4, 8, 1}};
    l.args[1] =
        (prog_arg){.kind = PROG_ARG_POINTER, .ref = {PROG_BUFFER_STATE, 0, 0}, .extent = {0, 1000, 1}};
    l.args[2] = (prog_arg){
        .kind = PROG_ARG_POINTER, .ref = {PROG_BUFFER_STATE, 0, 0}, .extent = {0, 1000, 1}, .writes = true};
    l.args[3] = (prog_arg){.kind = PROG_ARG_TOKENS};
    prog_cost c = program_launch_cost(&p, &l);
    assert_true(prog_poly_eval(c.read, 3, 5) == 4 * 3 + 8 + 100 * (5 + 3));
    assert_true(prog_poly_eval(c.written, 3, 5) == 100 * 3);
    assert_true(prog_poly_eval(c.flops, 3, 5) == 0);
    l.args[1].ref.index = 7; /* no such state: counts nothing */
    assert_true(prog_poly_eval(program_launch_cost(&p, &l).read, 3, 5) == 4 * 3 + 8);

    prog_gemm g = {.m = {1, 0, 1},
                   .n = 3,
                   .k = 5,
                   .dtype_a = SMELT_DTYPE_BF16,
                   .dtype_b = SMELT_DTYPE_BF16,
                   .dtype_c = SMELT_DTYPE_F32,
                   .dtype_bias = SMELT_DTYPE_F32,
                   .has_bias = true};
    c = program_gemm_cost(&g);
    assert_true(prog_poly_eval(c.read, 7, 100) == 7 * 5 * 2 + 3 * 5 * 2 + 3 * 4);
    assert_true(prog_poly_eval(c.written, 7, 100) == 7 * 3 * 4);
    assert_true(prog_poly_eval(c.flops, 7, 100) == 7 * (2 * 3 * 5 + 3));
    assert_true(c.tensor_cores);
    g.dtype_a = SMELT_DTYPE_F32;
    assert_false(program_gemm_cost(&g).tensor_cores);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_program_round_trip),
        cmocka_unit_test(test_program_decode_refuses_truncation),
        cmocka_unit_test(test_program_decode_refuses_lies),
        cmocka_unit_test(test_program_decode_fuzz),
        cmocka_unit_test(test_print_escapes_kernel_and_weight_names),
        cmocka_unit_test(test_sampler),
        cmocka_unit_test(test_executor_graphs),
        cmocka_unit_test(test_choice_sides),
        cmocka_unit_test(test_executor_choices),
        cmocka_unit_test(test_executor_wanted_rows),
        cmocka_unit_test(test_host_forward_f32),
        cmocka_unit_test(test_host_forward_bf16),
        cmocka_unit_test(test_bind_and_generate),
        cmocka_unit_test(test_bind_stacked),
        cmocka_unit_test(test_bind_concatenated),
        cmocka_unit_test(test_gemm_residual),
        cmocka_unit_test(test_plan_has_weight),
        cmocka_unit_test(test_cuda_driver_overrides),
        cmocka_unit_test(test_cuda_without_driver),
        cmocka_unit_test(test_cuda_on_gpu),
        cmocka_unit_test(test_cuda_on_fake_driver),
        cmocka_unit_test(test_cuda_scaled_gemm_on_fake_driver),
        cmocka_unit_test(test_plan_errors),
        cmocka_unit_test(test_default_costs),
    };
    int failures = cmocka_run_group_tests(tests, scratch_folder_make, scratch_folder_remove);
    cg_host_object_free(&host_object);
    return failures;
}
