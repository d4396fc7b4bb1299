/* emit_harness.c - runs one IR op three ways for test_emit.c (which
 * #includes this file): its emitted kernels compiled by NVRTC for sm_80 and
 * sm_90, the same kernels built for the host and launched on the simulator,
 * and the reference backend's function for the op (the oracle). Then it
 * compares the simulator's results with the reference's.
 *
 *   emit_case *c = case_new("f32");
 *   ir_value_id x = case_input(c, "x", "f32[tokens, 64]");
 *   ir_value_id w = case_weight(c, "f32[64]");
 *   uint32_t op = case_op(c, IR_OP_RMS_NORM, (ir_value_id[]){x, w}, 2);
 *   ir_op_set_float(&c->m, op, "eps", 1e-5);
 *   case_infer(c);
 *   case_run(c, op, 3, F32_TOLERANCE);   // T = 3; random data for x and w
 *   case_free(c);
 *
 * Data: every float value gets random data (uniform in [-2, 2)) the first
 * time an op reads it at a given T, unless the test set it; integer values
 * (ids, positions) must be set. Where a value is stored as bf16 or f16 its
 * data is rounded to that dtype first, so the kernel and the reference read the same
 * numbers and the comparison measures the kernel alone.
 *
 * Tolerance (`|got - want| <= tolerance * max(|want|, floor)`): f32 storage
 * uses the caller's relative tolerance with a floor of a tenth of the
 * result's largest magnitude (float against the reference's double sums);
 * bf16 storage uses BF16_TOLERANCE = 1e-2 relative to the result's largest
 * magnitude (bf16 keeps 8 bits: one rounding of the result is 2^-9 relative,
 * a few roundings of intermediates stay well inside 1e-2 of the range);
 * f16 storage (case_new("f16"): bf16 with f16 activations) F16_TOLERANCE =
 * 1e-3 likewise: 4 times one rounding (f16 keeps 11 bits: 2^-12 relative),
 * and under one bf16 rounding (2^-9), so a value that lost its bits through
 * bf16 on the way fails.
 *
 * Quantizing presets (case_new("int4-rtn"), with c->activations "f32" to
 * compare at f32 tolerances): a quantized weight's random data is quantized
 * (quant_rtn) into the kernel's packed buffer and the reference reads its
 * dequantized values (quant_dequantize), so that the comparison measures
 * the kernel's dequantization and dot products alone.
 */
#include "emit.h"
#include "host_build.h"
#include "host_sim.h"
#include "ir_io.h"
#include "kernel_cache.h"
#include "nvrtc.h"
#include "numeric.h"
#include "pass.h"
#include "quant.h"
#include "ref_ops.h"

#include <dlfcn.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { TOKEN_BOUND = 64, CASE_MAX_VALUES = 256 };
#define F32_TOLERANCE 1e-5
#define F32_SEQUENCE_TOLERANCE 1e-4 /* attention, moe: longer float reductions */
#define BF16_TOLERANCE 1e-2
#define F16_TOLERANCE 1e-3

/* ---- process-wide: the simulator, the kernel header, NVRTC -------------------------- */

static sim_pool *harness_pool;
static char *harness_header_text; /* runtime/smelt_kernel.h */
static bool harness_have_nvrtc;
/* NVRTC's results, kept as `smelt compile` keeps them (codegen/kernel_cache.h:
 * keyed by source, headers, arch, options and NVRTC's version) in the
 * tests' cache folder ($SMELT_CACHE_DIR, tests/CMakeLists.txt), so that a
 * build's second run, or another build sharing the folder, compiles each
 * kernel once. A hit re-parses the resources from the stored ptxas log, so
 * the register and spill checks below hold either way. */
static cg_cache *harness_cache;

static char *read_file_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)size + 1);
    if (text && fread(text, 1, (size_t)size, f) != (size_t)size) {
        free(text);
        text = NULL;
    }
    if (text) text[size] = '\0';
    fclose(f);
    return text;
}

static int harness_setup(void **state) {
    (void)state;
    harness_pool = sim_pool_create(0);
    harness_cache = cg_cache_open(NULL);
    harness_header_text = read_file_text(SMELT_SOURCE_DIR "/runtime/smelt_kernel.h");
    int major = 0, minor = 0;
    harness_have_nvrtc =
        cg_nvrtc_version(&major, &minor) && cg_nvrtc_supports_arch(80) && cg_nvrtc_supports_arch(90);
    if (!harness_have_nvrtc)
        fprintf(stderr, "note: NVRTC is not available; kernels are not compiled for sm_80/sm_90\n");
    return harness_pool && harness_header_text ? 0 : -1;
}

static int harness_teardown(void **state) {
    (void)state;
    sim_pool_free(harness_pool);
    cg_cache_close(harness_cache);
    free(harness_header_text);
    return 0;
}

/* ---- bf16 and f16 as smelt_kernel.h rounds them (plan/numeric.h: the same bits) -------- */

static bool is_half(smelt_dtype t) { return t == SMELT_DTYPE_BF16 || t == SMELT_DTYPE_F16; }

static uint16_t to_half(smelt_dtype t, float f) {
    return t == SMELT_DTYPE_F16 ? plan_f32_to_f16(f) : plan_f32_to_bf16(f);
}

static float from_half(smelt_dtype t, uint16_t h) {
    return t == SMELT_DTYPE_F16 ? plan_f16_to_f32(h) : plan_bf16_to_f32(h);
}

/* ---- a module under test ------------------------------------------------------------------ */

typedef struct value_data {
    float *f;       /* float values: the truth both sides read */
    int32_t *i;     /* integer values */
    uint64_t count; /* elements at `tokens` */
    int64_t tokens; /* T the data is for; -1: none yet */
    void *buffer;   /* the kernel's copy, in the storage dtype */
} value_data;

typedef struct op_state {
    bool ready;
    void *buffers[CG_MAX_STATES];       /* the kernels' state, persisting across runs */
    sim_kernel entries[CG_MAX_KERNELS]; /* the host kernels, built on the first run */
    ref_kv_cache kv;                    /* the reference's */
} op_state;

typedef struct emit_case {
    ir_module m;
    diag_engine d;
    FILE *log;
    char *log_text;
    size_t log_size;
    const char *precision;   /* the precision pass's preset: "f32", "bf16", "int4-rtn", ... */
    const char *activations; /* its activation storage; NULL: the preset's */
    int64_t group_size;      /* int4's; 0: the pass's default */
    const char *act_quant;   /* int8, fp8: "none" for weight-only; NULL: W8A8 per token */
    const char *kv_cache;    /* its KV cache choice (NULL: auto; "fp8": f8e4m3 with row scales) */
    ir_value_id ids, pos;
    uint64_t random;
    value_data values[CASE_MAX_VALUES];
    op_state states[CASE_MAX_VALUES]; /* by op index */
    void *objects[16];                /* dlopen handles of the host kernels built */
    uint32_t object_count;
    double worst_error; /* the largest |got - want| / allowed of the last run, in [0, 1] when it passed */
} emit_case;

static const char *case_log(emit_case *c) {
    fflush(c->log);
    return c->log_text ? c->log_text : "";
}

static ir_type type_from_text(emit_case *c, const char *text) {
    ir_type t = {0};
    const char *bracket = strchr(text, '[');
    assert_non_null(bracket);
    t.dtype = smelt_dtype_from_name(text, (size_t)(bracket - text));
    assert_int_not_equal(t.dtype, SMELT_DTYPE_UNKNOWN);
    for (const char *p = bracket + 1; *p != ']';) {
        while (*p == ' ' || *p == ',')
            p++;
        if (*p == ']') break;
        size_t n = strcspn(p, ", ]");
        char word[64];
        snprintf(word, sizeof word, "%.*s", (int)n, p);
        int32_t symbol = ir_find_symbol(&c->m, word);
        t.dims[t.rank++] = symbol >= 0 ? ir_dim_symbol(symbol) : ir_dim_const(strtoll(word, NULL, 10));
        p += n;
    }
    return t;
}

static uint32_t case_op(emit_case *c, ir_op_kind kind, const ir_value_id *operands, uint32_t count) {
    uint32_t op = ir_append_op(&c->m, kind, operands, count, UINT32_MAX, SMELT_NO_LOC);
    ir_op_fill_defaults(&c->m, op);
    return op;
}

static ir_value_id case_result(emit_case *c, uint32_t op) { return ir_op_result(&c->m, op, 0); }

static ir_value_id case_declare(emit_case *c, ir_op_kind kind, const char *name, const char *type) {
    uint32_t op = case_op(c, kind, NULL, 0);
    assert_true(ir_op_set_string(&c->m, op, "name", name));
    c->m.values[case_result(c, op)].type = type_from_text(c, type);
    return case_result(c, op);
}

static ir_value_id case_input(emit_case *c, const char *name, const char *type) {
    return case_declare(c, IR_OP_INPUT, name, type);
}

static ir_value_id case_weight(emit_case *c, const char *type) {
    char name[32];
    snprintf(name, sizeof name, "w%u", c->m.op_count);
    return case_declare(c, IR_OP_WEIGHT, name, type);
}

/* case_input and case_weight with the type printed from a format:
 * case_weightf(c, "f32[%lld, %lld]", n, k). */
static ir_value_id case_inputf(emit_case *c, const char *name, const char *format, ...)
    __attribute__((format(printf, 3, 4)));
static ir_value_id case_weightf(emit_case *c, const char *format, ...) __attribute__((format(printf, 2, 3)));

static ir_value_id case_declare_printed(emit_case *c, ir_op_kind kind, const char *name, const char *format,
                                        va_list args) {
    char type[128];
    int n = vsnprintf(type, sizeof type, format, args);
    assert_true(n > 0 && n < (int)sizeof type);
    return case_declare(c, kind, name, type);
}

static ir_value_id case_inputf(emit_case *c, const char *name, const char *format, ...) {
    va_list args;
    va_start(args, format);
    ir_value_id v = case_declare_printed(c, IR_OP_INPUT, name, format, args);
    va_end(args);
    return v;
}

static ir_value_id case_weightf(emit_case *c, const char *format, ...) {
    char name[32];
    snprintf(name, sizeof name, "w%u", c->m.op_count);
    va_list args;
    va_start(args, format);
    ir_value_id v = case_declare_printed(c, IR_OP_WEIGHT, name, format, args);
    va_end(args);
    return v;
}

static ir_value_id case_const(emit_case *c, double value) {
    uint32_t op = case_op(c, IR_OP_CONST, NULL, 0);
    assert_true(ir_op_set_float(&c->m, op, "value", value));
    c->m.values[case_result(c, op)].type = (ir_type){.dtype = SMELT_DTYPE_F32};
    return case_result(c, op);
}

static void case_output(emit_case *c, ir_value_id v, const char *name) {
    uint32_t op = case_op(c, IR_OP_OUTPUT, &v, 1);
    assert_true(ir_op_set_string(&c->m, op, "name", name));
}

static void case_set_ints(emit_case *c, uint32_t op, const char *name, const int64_t *items, uint32_t count) {
    assert_true(ir_op_set_attr(&c->m, op, name,
                               &(ir_attr){.kind = IR_ATTR_INTS, .as.ints = {count, (int64_t *)items}}));
}

/* A module with the token dim `tokens` and the inputs ids and pos. */
static emit_case *case_new(const char *precision) {
    emit_case *c = calloc(1, sizeof *c);
    assert_non_null(c);
    ir_module_init(&c->m, "emit_test");
    c->log = open_memstream(&c->log_text, &c->log_size);
    diag_init(&c->d, c->log);
    c->precision = precision;
    if (strcmp(precision, "f16") == 0) { /* no preset: bf16 with --act f16 */
        c->precision = "bf16";
        c->activations = "f16";
    }
    c->random = 0x9e3779b97f4a7c15ull;
    for (uint32_t i = 0; i < CASE_MAX_VALUES; i++)
        c->values[i].tokens = -1;
    ir_add_symbol(&c->m, "tokens", TOKEN_BOUND, SMELT_NO_LOC);
    c->ids = case_input(c, "ids", "i32[tokens]");
    c->pos = case_input(c, "pos", "i32[tokens]");
    return c;
}

static void free_value(value_data *v) {
    free(v->f);
    free(v->i);
    free(v->buffer);
    v->f = NULL;
    v->i = NULL;
    v->buffer = NULL;
    v->tokens = -1;
}

static void case_free(emit_case *c) {
    for (uint32_t i = 0; i < CASE_MAX_VALUES; i++) {
        free_value(&c->values[i]);
        op_state *s = &c->states[i];
        for (int b = 0; b < CG_MAX_STATES; b++)
            free(s->buffers[b]);
        free(s->kv.keys);
        free(s->kv.values);
        free(s->kv.written);
        free(s->kv.scores);
        free(s->kv.mixed);
    }
    for (uint32_t i = 0; i < c->object_count; i++)
        dlclose(c->objects[i]);
    diag_free(&c->d);
    fclose(c->log);
    free(c->log_text);
    ir_module_free(&c->m);
    free(c);
}

static void case_infer(emit_case *c) {
    if (!pass_infer_shapes(&c->m, &c->d)) fail_msg("infer-shapes failed:\n%s", case_log(c));
    /* Storage dtypes are the precision pass's; it recomputes them all, so
     * running it again after more ops were added is right. */
    pass_options options = {.precision = c->precision,
                            .activations = c->activations,
                            .group_size = c->group_size,
                            .act_quant = c->act_quant,
                            .kv_cache = c->kv_cache};
    if (!pass_precision(&c->m, &options, &c->d)) fail_msg("precision failed:\n%s", case_log(c));
    assert_true(c->m.value_count <= CASE_MAX_VALUES);
}

/* moe(x[T, D], router[E, D], gate[E, F, D], up[E, F, D], down[E, D, F]):
 * E = experts, D = dim, F = ffn, gate and up of one shape. */
static uint32_t moe_op_dims(emit_case *c, int64_t experts, int64_t dim, int64_t ffn, int64_t top_k,
                            bool normalize) {
    long long e = experts, d = dim, f = ffn;
    ir_value_id x = case_inputf(c, "x", "f32[tokens, %lld]", d);
    ir_value_id router = case_weightf(c, "f32[%lld, %lld]", e, d);
    ir_value_id gate = case_weightf(c, "f32[%lld, %lld, %lld]", e, f, d);
    ir_value_id up = case_weightf(c, "f32[%lld, %lld, %lld]", e, f, d);
    ir_value_id down = case_weightf(c, "f32[%lld, %lld, %lld]", e, d, f);
    uint32_t op = case_op(c, IR_OP_MOE, (ir_value_id[]){x, router, gate, up, down}, 5);
    assert_true(ir_op_set_int(&c->m, op, "top_k", top_k));
    assert_true(ir_op_set_bool(&c->m, op, "normalize", normalize));
    return op;
}

/* ---- data ----------------------------------------------------------------------------- */

static uint64_t dims_at(const emit_case *c, ir_value_id v, int64_t tokens, uint64_t *dims) {
    const ir_type *t = &c->m.values[v].type;
    uint64_t count = 1;
    for (unsigned i = 0; i < t->rank; i++) {
        dims[i] = ir_dim_is_symbol(t->dims[i]) ? (uint64_t)tokens : (uint64_t)t->dims[i].size;
        count *= dims[i];
    }
    return count;
}

static float next_uniform(emit_case *c) { /* in [-2, 2), xorshift64* */
    c->random ^= c->random >> 12;
    c->random ^= c->random << 25;
    c->random ^= c->random >> 27;
    uint64_t bits = (c->random * 2685821657736338717ull) >> 40; /* 24 bits */
    return (float)bits / (float)(1u << 24) * 4.0f - 2.0f;
}

static value_data *prepare_value(emit_case *c, ir_value_id v, int64_t tokens) {
    value_data *d = &c->values[v];
    uint64_t dims[IR_MAX_DIMS];
    uint64_t count = dims_at(c, v, tokens, dims);
    if (d->tokens != tokens) {
        free_value(d);
        d->count = count;
        d->tokens = tokens;
    }
    return d;
}

/* Sets a float value's data at T (count must match). */
static void case_set_floats(emit_case *c, ir_value_id v, int64_t tokens, const float *data, uint64_t count) {
    value_data *d = prepare_value(c, v, tokens);
    assert_int_equal(d->count, count);
    free(d->f);
    d->f = malloc(count * sizeof *d->f);
    memcpy(d->f, data, count * sizeof *d->f);
}

static void case_set_ints_data(emit_case *c, ir_value_id v, int64_t tokens, const int32_t *data,
                               uint64_t count) {
    value_data *d = prepare_value(c, v, tokens);
    assert_int_equal(d->count, count);
    free(d->i);
    d->i = malloc(count * sizeof *d->i);
    memcpy(d->i, data, count * sizeof *d->i);
}

/* Inputs of moe op `op` at T = tokens whose router sends every token to
 * expert `chosen` of `experts` (over `dims` input features: positive x, a
 * router row of +0.125 for that expert and -0.125 for the others). */
static void case_route_to_one_expert(emit_case *c, uint32_t op, int64_t tokens, int64_t dims, int64_t experts,
                                     int64_t chosen) {
    float *x = malloc((size_t)(tokens * dims) * sizeof *x),
          *router = malloc((size_t)(experts * dims) * sizeof *x);
    assert_non_null(x), assert_non_null(router);
    for (int64_t i = 0; i < tokens * dims; i++)
        x[i] = 0.25f + (float)((i * 7) % 16) / 16.0f; /* positive */
    for (int64_t i = 0; i < experts * dims; i++)
        router[i] = i / dims == chosen ? 0.125f : -0.125f;
    case_set_floats(c, c->m.ops[op].operands[0], tokens, x, (uint64_t)(tokens * dims));
    /* at T: a value set at another token count is regenerated */
    case_set_floats(c, c->m.ops[op].operands[1], tokens, router, (uint64_t)(experts * dims));
    free(x);
    free(router);
}

/* The data of operand v at T: random floats unless set; rounded when
 * stored as bf16 or f16; the kernel's buffer in its storage dtype. */
static void fill_operand(emit_case *c, ir_value_id v, int64_t tokens) {
    value_data *d = prepare_value(c, v, tokens);
    uint32_t constant = c->m.values[v].def_op;
    quant_format format;
    bool quantized = ir_weight_quant(&c->m, constant, &format);
    bool is_float = smelt_dtype_is_float(c->m.values[v].type.dtype) || quantized;
    if (c->m.ops[constant].kind == IR_OP_CONST) {
        if (!d->f) d->f = malloc(d->count * sizeof *d->f);
        for (uint64_t i = 0; i < d->count; i++)
            d->f[i] = (float)ir_op_float(&c->m, constant, "value");
        return;
    }
    if (is_float && !d->f) {
        d->f = malloc(d->count * sizeof *d->f);
        for (uint64_t i = 0; i < d->count; i++)
            d->f[i] = next_uniform(c);
    }
    if (quantized) { /* packed for the kernel, dequantized for the reference; once */
        if (d->buffer) return;
        const ir_type *t = &c->m.values[v].type; /* [N, K], or MoE experts [E, N, K] */
        quant_tensor q = {.format = format};
        uint64_t matrices = t->rank == 3 ? (uint64_t)t->dims[0].size : 1, stride, total;
        assert_null(quant_stack_layout_of(&format, matrices, (uint64_t)t->dims[t->rank - 2].size,
                                          (uint64_t)t->dims[t->rank - 1].size, &q.layout, &stride, &total));
        d->buffer = calloc(total, 1);
        float *columns = format.has_column_scale ? malloc(q.layout.cols * sizeof *columns) : NULL;
        for (uint64_t k = 0; columns && k < q.layout.cols; k++) /* AWQ-like scales in [0.5, 1.5) */
            columns[k] = 1.0f + next_uniform(c) / 4.0f;
        for (uint64_t e = 0; e < matrices; e++) {
            float *matrix = d->f + e * q.layout.rows * q.layout.cols;
            q.data = (uint8_t *)d->buffer + e * stride;
            assert_null(quant_rtn(matrix, columns, &q));
            quant_dequantize(&q, matrix);
        }
        free(columns);
        return;
    }
    if (!is_float && !d->i) fail_msg("integer value %u has no data at T = %lld", v, (long long)tokens);
    smelt_dtype storage = cg_storage_dtype(&c->m, v);
    free(d->buffer);
    d->buffer = malloc(d->count * smelt_dtype_element_bytes(storage));
    if (is_half(storage)) {
        uint16_t *b = d->buffer;
        for (uint64_t i = 0; i < d->count; i++) {
            b[i] = to_half(storage, d->f[i]);
            d->f[i] = from_half(storage, b[i]);
        }
    } else {
        memcpy(d->buffer, is_float ? (void *)d->f : (void *)d->i, d->count * 4);
    }
}

/* A result's buffer, filled with a pattern (NaN, -1) that shows unwritten elements. */
static void prepare_result(emit_case *c, ir_value_id v, int64_t tokens) {
    value_data *d = prepare_value(c, v, tokens);
    free(d->buffer);
    smelt_dtype storage = cg_storage_dtype(&c->m, v);
    d->buffer = malloc(d->count * smelt_dtype_element_bytes(storage));
    memset(d->buffer, 0xff, d->count * smelt_dtype_element_bytes(storage));
}

/* ---- compiling ------------------------------------------------------------------------ */

/* Whether kernel `name` was compiled for the GPUs already in this process:
 * a kernel's name carries everything its source depends on, so the cases
 * that differ only in data compile it once. */
static bool already_compiled(const char *name) {
    static char *names[512];
    static unsigned count;
    for (unsigned i = 0; i < count; i++)
        if (strcmp(names[i], name) == 0) return true;
    if (count < sizeof names / sizeof names[0]) names[count++] = strdup(name);
    return false;
}

/* NVRTC for sm_80 and sm_90: no errors and no spills; prints the registers. */
static void compile_for_gpus(const cg_kernel *k) {
    if (!harness_have_nvrtc || already_compiled(k->name)) return;
    cg_header header = {"smelt_kernel.h", harness_header_text};
    int archs[2] = {80, 90};
    for (int a = 0; a < 2; a++) {
        cg_compile_request request = {.source = k->source,
                                      .kernel_name = k->name,
                                      .headers = &header,
                                      .header_count = 1,
                                      .arch = archs[a],
                                      .want_cubin = true};
        cg_compiled compiled;
        char error[4096];
        if (!cg_compile_kernel_cached(harness_cache, &request, &compiled, NULL, error, sizeof error))
            fail_msg("NVRTC sm_%d: %s\n--- source ---\n%s", archs[a], error, k->source);
        const cg_kernel_resources *r = cg_resource_find(&compiled.resources, k->name);
        assert_non_null(r);
        printf("  sm_%d %-48s %3u registers, %u bytes shared, %u spill stores, %u spill loads\n", archs[a],
               k->name, r->registers, r->shared_bytes, r->spill_store_bytes, r->spill_load_bytes);
        assert_int_equal(r->spill_store_bytes, 0);
        assert_int_equal(r->spill_load_bytes, 0);
        assert_non_null(compiled.cubin);
        cg_compiled_free(&compiled);
    }
}

/* With SMELT_TEST_DUMP_KERNELS=folder, `text` into folder/NAME.ENDING. */
static void dump_text(const char *name, const char *ending, const char *text) {
    const char *folder = getenv("SMELT_TEST_DUMP_KERNELS");
    if (!folder || !*folder) return;
    char path[1024];
    snprintf(path, sizeof path, "%s/%s.%s", folder, name, ending);
    FILE *f = fopen(path, "w");
    if (!f) return;
    fputs(text, f);
    fclose(f);
}

/* Kernel k's sm_90 PTX from NVRTC, in compiled->ptx (the caller frees
 * *compiled): no errors and no spills; prints the registers, and with
 * SMELT_TEST_DUMP_KERNELS=folder writes the PTX there as NAME.ptx, beside
 * the sources dump_source writes. For the tests that read the PTX. */
static void compile_ptx_for_sm90(const cg_kernel *k, cg_compiled *compiled) {
    cg_header header = {"smelt_kernel.h", harness_header_text};
    cg_compile_request request = {.source = k->source,
                                  .kernel_name = k->name,
                                  .headers = &header,
                                  .header_count = 1,
                                  .arch = 90,
                                  .want_cubin = true,
                                  .want_ptx = true};
    char error[4096];
    if (!cg_compile_kernel_cached(harness_cache, &request, compiled, NULL, error, sizeof error))
        fail_msg("NVRTC: %s", error);
    const cg_kernel_resources *r = cg_resource_find(&compiled->resources, k->name);
    assert_non_null(r);
    printf("  sm_90 %s: %u registers, %u spill bytes\n", k->name, r->registers,
           r->spill_store_bytes + r->spill_load_bytes);
    assert_int_equal(r->spill_store_bytes + r->spill_load_bytes, 0);
    assert_non_null(compiled->ptx);
    dump_text(k->name, "ptx", compiled->ptx);
}

/* With SMELT_TEST_DUMP_KERNELS=folder, each kernel's source is written
 * there as NAME.cu, for reading what the emitters make. */
static void dump_source(const cg_kernel *k) { dump_text(k->name, "cu", k->source); }

/* Builds the kernels for the host (as warning-free C11), loads the object
 * and returns each kernel's entry. */
static void build_for_host(emit_case *c, const cg_group_lowering *l, sim_kernel *entries) {
    cg_host_source sources[CG_MAX_KERNELS];
    for (uint32_t i = 0; i < l->kernel_count; i++)
        sources[i] = (cg_host_source){l->kernels[i].name, l->kernels[i].source};
    static const char *const strict[] = {"-Wall", "-Wextra", "-Werror", "-Wno-unused-parameter"};
    cg_host_build_request request = {.sources = sources,
                                     .source_count = l->kernel_count,
                                     .include_dir = SMELT_SOURCE_DIR "/runtime",
                                     .sanitize_address = cg_host_build_process_is_sanitized(),
                                     .extra_flags = strict,
                                     .extra_flag_count = 4,
                                     .link_flags = (const char *const[]){"-lm"},
                                     .link_flag_count = 1};
    cg_host_object object;
    char error[8192];
    if (!cg_host_build(&request, NULL, &object, error, sizeof error))
        fail_msg("host build: %s\n--- source ---\n%s", error, l->kernels[0].source);
    char path[] = "/tmp/smelt-test-emit-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, object.bytes, object.size), (ssize_t)object.size);
    close(fd);
    cg_host_object_free(&object);
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    unlink(path);
    if (!handle) fail_msg("dlopen: %s", dlerror());
    assert_true(c->object_count < 16);
    c->objects[c->object_count++] = handle;
    for (uint32_t i = 0; i < l->kernel_count; i++) {
        char symbol[512];
        snprintf(symbol, sizeof symbol, "%s__host_entry", l->kernels[i].name);
        entries[i].name = l->kernels[i].name;
        *(void **)&entries[i].host_entry = dlsym(handle, symbol);
        if (!entries[i].host_entry) fail_msg("no %s in the host object", symbol);
    }
}

/* ---- the reference ---------------------------------------------------------------------- */

static ref_attrs read_attrs(emit_case *c, uint32_t op) {
    const ir_module *m = &c->m;
    const ir_op *o = &m->ops[op];
    ref_attrs a = {0};
    unsigned rank = o->operand_count ? m->values[o->operands[0]].type.rank : 0;
    switch (o->kind) {
    case IR_OP_MATMUL: /* W8A8: the input quantized as well (ir/ops.def) */
        a.w8a8 = strcmp(ir_op_string(m, op, "act_quant"), "i8") == 0       ? QUANT_INT8
                 : strcmp(ir_op_string(m, op, "act_quant"), "f8e4m3") == 0 ? QUANT_FP8
                                                                           : QUANT_NONE;
        a.w8a8_scale = strcmp(ir_op_string(m, op, "act_scale"), "tensor") == 0
                           ? (float)ir_op_float(m, op, "act_scale_value")
                           : 0.0f;
        a.bias = ir_matmul_bias(m, op) != IR_NO_VALUE;
        a.act_codes = ir_matmul_act_codes(m, op, &(ir_value_id){0}, &(ir_value_id){0});
        break;
    case IR_OP_QUANTIZE: /* the codes, held as the values they stand for (ref_op_quantize) */
        a.w8a8 = strcmp(ir_op_string(m, op, "dtype"), "i8") == 0 ? QUANT_INT8 : QUANT_FP8;
        a.w8a8_scale = strcmp(ir_op_string(m, op, "act_scale"), "tensor") == 0
                           ? (float)ir_op_float(m, op, "act_scale_value")
                           : 0.0f;
        break;
    case IR_OP_RMS_NORM:
        a.eps = ir_op_float(m, op, "eps");
        a.offset = ir_op_float(m, op, "offset");
        break;
    case IR_OP_LAYER_NORM: a.eps = ir_op_float(m, op, "eps"); break;
    case IR_OP_ROPE:
        a.rope = ir_rope_params_of(m, op, m->values[o->operands[0]].type.dims[2].size);
        a.interleaved = strcmp(ir_op_string(m, op, "style"), "interleaved") == 0;
        break;
    case IR_OP_ROPE_TABLE: a.rope = ir_rope_table_params_of(m, op); break;
    case IR_OP_ATTENTION:
        a.scale = ir_op_float(m, op, "scale");
        a.causal = ir_op_bool(m, op, "causal");
        a.window = ir_op_int(m, op, "window");
        a.softcap = ir_op_float(m, op, "softcap");
        a.kv_fp8 = strcmp(ir_op_string(m, op, "kv_dtype"), "f8e4m3") == 0;
        break;
    case IR_OP_GELU: a.gelu_tanh = strcmp(ir_op_string(m, op, "approximate"), "tanh") == 0; break;
    case IR_OP_MOE: {
        a.top_k = ir_op_int(m, op, "top_k");
        a.normalize = ir_op_bool(m, op, "normalize");
        const char *gate_up = ir_op_string(m, op, "gate_up_act_quant"),
                   *down = ir_op_string(m, op, "down_act_quant");
        a.gate_up_w8a8 = strcmp(gate_up, "i8") == 0       ? QUANT_INT8
                         : strcmp(gate_up, "f8e4m3") == 0 ? QUANT_FP8
                                                          : QUANT_NONE;
        a.down_w8a8 = strcmp(down, "i8") == 0       ? QUANT_INT8
                      : strcmp(down, "f8e4m3") == 0 ? QUANT_FP8
                                                    : QUANT_NONE;
        if (strcmp(ir_op_string(m, op, "act_scale"), "tensor") == 0) {
            a.gate_up_w8a8_scale = (float)ir_op_float(m, op, "gate_up_act_scale_value");
            a.down_w8a8_scale = (float)ir_op_float(m, op, "down_act_scale_value");
        }
        break;
    }
    case IR_OP_SOFTMAX:
    case IR_OP_CONCAT:
    case IR_OP_SPLIT:
    case IR_OP_ARGMAX:
    case IR_OP_SLICE: {
        int64_t axis = ir_op_int(m, op, "axis");
        a.axis = (unsigned)(axis < 0 ? axis + rank : axis);
        if (o->kind == IR_OP_SLICE) {
            a.start = ir_op_int(m, op, "start");
            a.end = ir_op_int(m, op, "end");
        }
        break;
    }
    case IR_OP_TRANSPOSE: a.perm = ir_op_attr(m, op, "perm")->as.ints.items; break;
    default: break;
    }
    return a;
}

static ref_tensor tensor_of(emit_case *c, ir_value_id v, int64_t tokens) {
    ref_tensor t = {0};
    t.rank = c->m.values[v].type.rank;
    t.count = dims_at(c, v, tokens, t.dims);
    quant_format f; /* a quantized weight: its dequantized values */
    bool quantized = ir_weight_quant(&c->m, c->m.values[v].def_op, &f);
    t.elem = smelt_dtype_is_float(c->m.values[v].type.dtype) || quantized ? REF_F32 : REF_I32;
    t.f = t.elem == REF_F32 ? c->values[v].f : NULL;
    t.i = t.elem == REF_I32 ? c->values[v].i : NULL;
    return t;
}

/* The reference's KV cache for an attention op, made on its first run. */
static void prepare_kv(emit_case *c, uint32_t op, op_state *s) {
    const ir_module *m = &c->m;
    const ir_type *k = &m->values[m->ops[op].operands[1]].type, *v = &m->values[m->ops[op].operands[2]].type;
    ref_kv_cache *kv = &s->kv;
    kv->max_seq = (uint64_t)ir_op_int(m, op, "max_seq");
    kv->kv_heads = (uint64_t)k->dims[1].size;
    kv->head_dim = (uint64_t)k->dims[2].size;
    kv->value_dim = (uint64_t)v->dims[2].size;
    kv->keys = calloc(kv->max_seq * kv->kv_heads * kv->head_dim, sizeof(float));
    kv->values = calloc(kv->max_seq * kv->kv_heads * kv->value_dim, sizeof(float));
    kv->written = calloc(kv->max_seq, sizeof(bool));
    kv->scores = calloc(kv->max_seq, sizeof(double));
    kv->mixed = calloc(kv->value_dim, sizeof(double));
}

static void run_reference(emit_case *c, uint32_t op, int64_t tokens, ref_tensor *results) {
    const ir_op *o = &c->m.ops[op];
    ref_tensor operands[IR_MAX_OPERANDS];
    const ref_tensor *in[IR_MAX_OPERANDS];
    for (uint32_t i = 0; i < o->operand_count; i++) {
        operands[i] = tensor_of(c, o->operands[i], tokens);
        in[i] = &operands[i];
    }
    for (uint32_t r = 0; r < o->result_count; r++) {
        results[r] = tensor_of(c, o->results[r], tokens);
        results[r].f = results[r].elem == REF_F32 ? calloc(results[r].count + 1, sizeof(float)) : NULL;
        results[r].i = results[r].elem == REF_I32 ? calloc(results[r].count + 1, sizeof(int32_t)) : NULL;
    }
    ref_attrs attrs = read_attrs(c, op);
    quant_tensor codes = {0}; /* a W8A8 matmul computes on its weight's packed codes */
    if (o->kind == IR_OP_MATMUL &&
        ir_weight_quant(&c->m, c->m.values[o->operands[1]].def_op, &codes.format)) {
        const ir_type *w = &c->m.values[o->operands[1]].type;
        assert_null(quant_layout_of(&codes.format, (uint64_t)w->dims[0].size, (uint64_t)w->dims[1].size,
                                    &codes.layout));
        codes.data = c->values[o->operands[1]].buffer;
    }
    quant_tensor experts[3] = {0}; /* a W8A8 moe computes on its experts' packed codes */
    uint64_t expert_stride[3] = {0};
    for (uint32_t k = 0; o->kind == IR_OP_MOE && k < 3; k++) {
        const ir_type *w = &c->m.values[o->operands[2 + k]].type;
        uint64_t total;
        if (!ir_weight_quant(&c->m, c->m.values[o->operands[2 + k]].def_op, &experts[k].format)) continue;
        assert_null(quant_stack_layout_of(&experts[k].format, (uint64_t)w->dims[0].size,
                                          (uint64_t)w->dims[1].size, (uint64_t)w->dims[2].size,
                                          &experts[k].layout, &expert_stride[k], &total));
        experts[k].data = c->values[o->operands[2 + k]].buffer;
    }
    ref_call call = {.in = in,
                     .in_count = o->operand_count,
                     .out = results,
                     .out_count = o->result_count,
                     .attrs = &attrs,
                     .kv = &c->states[op].kv,
                     .weight_codes = codes.data ? &codes : NULL,
                     .expert_codes = {experts[0].data ? &experts[0] : NULL,
                                      experts[1].data ? &experts[1] : NULL,
                                      experts[2].data ? &experts[2] : NULL},
                     .expert_stride = {expert_stride[0], expert_stride[1], expert_stride[2]},
                     .loc = o->loc,
                     .d = &c->d};
    if (!ref_run_op(o->kind, &call)) fail_msg("the reference failed:\n%s", case_log(c));
}

/* ---- comparing -------------------------------------------------------------------------- */

static void compare_result(emit_case *c, ir_value_id v, const ref_tensor *want, double tolerance,
                           const char *source) {
    value_data *d = &c->values[v];
    smelt_dtype storage = cg_storage_dtype(&c->m, v);
    if (want->elem == REF_I32) {
        const int32_t *got = d->buffer;
        for (uint64_t i = 0; i < want->count; i++)
            if (got[i] != want->i[i])
                fail_msg("element %llu: expected %d, found %d\n--- source ---\n%s", (unsigned long long)i,
                         want->i[i], got[i], source);
        return;
    }
    double largest = 0.0;
    for (uint64_t i = 0; i < want->count; i++)
        largest = fmax(largest, fabs(want->f[i]));
    if (largest == 0.0) largest = 1.0;
    double floor = is_half(storage) ? largest : 0.1 * largest;
    double allowed_relative = storage == SMELT_DTYPE_BF16  ? BF16_TOLERANCE
                              : storage == SMELT_DTYPE_F16 ? F16_TOLERANCE
                                                           : tolerance;
    for (uint64_t i = 0; i < want->count; i++) {
        double got = is_half(storage) ? from_half(storage, ((const uint16_t *)d->buffer)[i])
                                      : ((const float *)d->buffer)[i];
        double allowed = allowed_relative * fmax(fabs(want->f[i]), floor);
        double error = fabs(got - want->f[i]);
        if (!(error <= allowed))
            fail_msg("value %u element %llu: expected %.9g, found %.9g (allowed %.3g, %s storage)\n--- "
                     "source ---\n%s",
                     v, (unsigned long long)i, want->f[i], got, allowed, smelt_dtype_name(storage), source);
        c->worst_error = fmax(c->worst_error, error / allowed);
    }
}

/* ---- running an op ----------------------------------------------------------------------- */

/* Does kernel k run in a step of `tokens` tokens (its token range, as the
 * program guards its launch: codegen/lower.c)? */
static bool kernel_serves(const cg_kernel *k, int64_t tokens) {
    return tokens >= k->min_tokens && (k->max_tokens == 0 || tokens <= k->max_tokens);
}

/* Emits op `op`, compiles its kernels for sm_80, sm_90 and the host, runs
 * them on the simulator at T = tokens and checks every result against the
 * reference. State (KV caches) persists across calls for the same op. */
static void case_run(emit_case *c, uint32_t op, int64_t tokens, double tolerance) {
    arena strings;
    arena_init(&strings);
    cg_group_lowering l;
    if (!cg_emit_op(&c->m, op, &strings, &l, &c->d)) fail_msg("emit failed:\n%s", case_log(c));
    assert_int_equal(l.kind, CG_LOWER_KERNELS);
    assert_true(l.kernel_count >= 1);
    const ir_op *o = &c->m.ops[op];
    for (uint32_t i = 0; i < o->operand_count; i++)
        fill_operand(c, o->operands[i], tokens);
    for (uint32_t r = 0; r < o->result_count; r++)
        prepare_result(c, o->results[r], tokens);

    op_state *s = &c->states[op];
    bool first_run = !s->ready; /* a later run of the op has the same kernels */
    if (!s->ready) {
        for (uint32_t i = 0; i < l.state_count; i++)
            s->buffers[i] = calloc(1, l.state_bytes[i]);
        if (o->kind == IR_OP_ATTENTION) prepare_kv(c, op, s);
        s->ready = true;
    }

    for (uint32_t k = 0; k < l.kernel_count; k++) {
        if (first_run) compile_for_gpus(&l.kernels[k]);
        dump_source(&l.kernels[k]);
    }
    if (first_run) build_for_host(c, &l, s->entries);
    sim_kernel *entries = s->entries;
    for (uint32_t k = 0; k < l.kernel_count; k++)
        entries[k].name = l.kernels[k].name; /* this run's strings; the same names */
    int token_argument = (int)tokens;
    for (uint32_t k = 0; k < l.kernel_count; k++) {
        const cg_kernel *kernel = &l.kernels[k];
        if (!kernel_serves(kernel, tokens)) continue; /* the executor skips it at this T */
        void *pointers[PROG_MAX_ARGS];
        void *args[PROG_MAX_ARGS];
        for (uint32_t p = 0; p < kernel->param_count; p++) {
            const cg_param *param = &kernel->params[p];
            if (param->kind == CG_PARAM_TOKENS) {
                args[p] = &token_argument;
                continue;
            }
            pointers[p] =
                param->kind == CG_PARAM_STATE ? s->buffers[param->state] : c->values[param->value].buffer;
            assert_non_null(pointers[p]);
            args[p] = &pointers[p];
        }
        const prog_launch_rule *rule = &kernel->rule;
        sim_dim3 grid = sim_dim3_make((unsigned)prog_affine_eval(rule->grid[0], tokens),
                                      (unsigned)prog_affine_eval(rule->grid[1], tokens),
                                      (unsigned)prog_affine_eval(rule->grid[2], tokens));
        if (grid.x == 0 || grid.y == 0 || grid.z == 0)
            continue; /* no work at this T, as the executor skips it */
        sim_dim3 block = sim_dim3_make(rule->block[0], rule->block[1], rule->block[2]);
        char error[1024];
        sim_status status = sim_launch(harness_pool, &entries[k], grid, block, rule->dynamic_shared_bytes,
                                       args, error, sizeof error);
        if (status != SIM_OK)
            fail_msg("launch of %s: %s\n--- source ---\n%s", kernel->name, error, kernel->source);
    }

    ref_tensor want[IR_MAX_RESULTS];
    run_reference(c, op, tokens, want);
    c->worst_error = 0.0;
    for (uint32_t r = 0; r < o->result_count; r++) {
        compare_result(c, o->results[r], &want[r], tolerance, l.kernels[l.kernel_count - 1].source);
        free(want[r].f);
        free(want[r].i);
    }
    arena_free(&strings);
}

/* Emits the kernel group of the ops listed (program order; a view among
 * them, such as a reshape, is no member of the group but runs in the
 * reference), compiles and runs its kernels at T = tokens, and checks the
 * outputs listed (what readers outside the group see) against the
 * reference run op by op. Inputs of the group get data as case_run's. */
typedef bool (*case_group_emitter)(const ir_module *m, const cg_group *g, arena *a, cg_group_lowering *out,
                                   diag_engine *d);

static void case_run_group_emitted(emit_case *c, const uint32_t *ops, uint32_t count,
                                   const ir_value_id *outputs, uint32_t output_count, int64_t tokens,
                                   double tolerance, case_group_emitter emit);

static void case_run_group(emit_case *c, const uint32_t *ops, uint32_t count, const ir_value_id *outputs,
                           uint32_t output_count, int64_t tokens, double tolerance) {
    case_run_group_emitted(c, ops, count, outputs, output_count, tokens, tolerance, cg_emit_group);
}

/* case_run_group with the group's kernels from `emit` (an entry of emit.h
 * other than cg_emit_group). */
static void case_run_group_emitted(emit_case *c, const uint32_t *ops, uint32_t count,
                                   const ir_value_id *outputs, uint32_t output_count, int64_t tokens,
                                   double tolerance, case_group_emitter emit) {
    const ir_module *m = &c->m;
    uint32_t members[IR_MAX_OPERANDS], member_count = 0;
    ir_value_id inputs[IR_MAX_OPERANDS];
    uint32_t input_count = 0;
    for (uint32_t i = 0; i < count; i++) {
        const ir_op *o = &m->ops[ops[i]];
        if (!(ir_op_info_of(o->kind)->flags & IR_OPF_VIEW)) members[member_count++] = ops[i];
        for (uint32_t j = 0; j < o->operand_count; j++) {
            bool inside = false, seen = false;
            for (uint32_t k = 0; k < count; k++)
                inside |= m->values[o->operands[j]].def_op == ops[k];
            for (uint32_t k = 0; k < input_count; k++)
                seen |= inputs[k] == o->operands[j];
            if (!inside && !seen) inputs[input_count++] = o->operands[j];
        }
    }
    cg_group g = {.id = 0,
                  .op_count = member_count,
                  .ops = members,
                  .input_count = input_count,
                  .inputs = inputs,
                  .output_count = output_count,
                  .outputs = outputs};
    arena strings;
    arena_init(&strings);
    cg_group_lowering l;
    if (!emit(m, &g, &strings, &l, &c->d)) fail_msg("emit failed:\n%s", case_log(c));
    assert_int_equal(l.kind, CG_LOWER_KERNELS);
    for (uint32_t i = 0; i < input_count; i++)
        fill_operand(c, inputs[i], tokens);
    for (uint32_t i = 0; i < member_count; i++)
        for (uint32_t r = 0; r < m->ops[members[i]].result_count; r++)
            prepare_result(c, m->ops[members[i]].results[r], tokens);
    for (uint32_t k = 0; k < l.kernel_count; k++) {
        compile_for_gpus(&l.kernels[k]);
        dump_source(&l.kernels[k]);
    }
    sim_kernel entries[CG_MAX_KERNELS];
    build_for_host(c, &l, entries);
    int token_argument = (int)tokens;
    for (uint32_t k = 0; k < l.kernel_count; k++) {
        const cg_kernel *kernel = &l.kernels[k];
        if (!kernel_serves(kernel, tokens)) continue; /* the executor skips it at this T */
        void *pointers[PROG_MAX_ARGS];
        void *args[PROG_MAX_ARGS];
        for (uint32_t p = 0; p < kernel->param_count; p++) {
            const cg_param *param = &kernel->params[p];
            if (param->kind == CG_PARAM_TOKENS) {
                args[p] = &token_argument;
                continue;
            }
            assert_int_equal(param->kind, CG_PARAM_VALUE);
            pointers[p] = c->values[param->value].buffer;
            assert_non_null(pointers[p]);
            args[p] = &pointers[p];
        }
        const prog_launch_rule *rule = &kernel->rule;
        sim_dim3 grid = sim_dim3_make((unsigned)prog_affine_eval(rule->grid[0], tokens),
                                      (unsigned)prog_affine_eval(rule->grid[1], tokens),
                                      (unsigned)prog_affine_eval(rule->grid[2], tokens));
        sim_dim3 block = sim_dim3_make(rule->block[0], rule->block[1], rule->block[2]);
        char error[1024];
        sim_status status = sim_launch(harness_pool, &entries[k], grid, block, rule->dynamic_shared_bytes,
                                       args, error, sizeof error);
        if (status != SIM_OK)
            fail_msg("launch of %s: %s\n--- source ---\n%s", kernel->name, error, kernel->source);
    }
    /* The reference, op by op: each result becomes the data its readers see. */
    for (uint32_t i = 0; i < count; i++) {
        const ir_op *o = &m->ops[ops[i]];
        if (ir_op_info_of(o->kind)->flags & IR_OPF_VIEW) {
            value_data *result = prepare_value(c, o->results[0], tokens);
            free(result->f);
            const value_data *from = &c->values[o->operands[0]];
            result->f = malloc(from->count * sizeof *result->f);
            memcpy(result->f, from->f, from->count * sizeof *result->f);
            continue;
        }
        ref_tensor want[IR_MAX_RESULTS];
        run_reference(c, ops[i], tokens, want);
        for (uint32_t r = 0; r < o->result_count; r++) { /* every result: a quantize's codes and scales */
            value_data *result = prepare_value(c, o->results[r], tokens);
            free(result->f);
            result->f = want[r].f;
        }
    }
    c->worst_error = 0.0;
    for (uint32_t i = 0; i < output_count; i++) {
        ref_tensor want = tensor_of(c, outputs[i], tokens);
        compare_result(c, outputs[i], &want, tolerance, l.kernels[0].source);
    }
    arena_free(&strings);
}

/* Emits op `op` alone (no compiling) into `l`; strings in `a`. */
static bool case_emit(emit_case *c, uint32_t op, arena *a, cg_group_lowering *l) {
    return cg_emit_op(&c->m, op, a, l, &c->d);
}
