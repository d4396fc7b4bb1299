/* test_reference.c - the fp32 reference backend (reference/reference.h):
 * every op on small modules built by hand, against values worked out by
 * hand (closed forms written out below), incremental decoding against a
 * full prefill, the example models end to end, and the errors on bad input. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "frontend.h"
#include "ir.h"
#include "numeric.h"
#include "pass.h"
#include "quant.h"
#include "ref_ops.h"
#include "reference.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- a module under construction, its weights, and its diagnostics -------------------- */

enum { MAX_WEIGHTS = 64, TOKEN_BOUND = 16 };

typedef struct fixture {
    ir_module m;
    diag_engine d;
    FILE *log;
    char *log_text;
    size_t log_size;
    ir_value_id ids, pos; /* the inputs, i32[tokens] */
    uint32_t weight_ops[MAX_WEIGHTS];
    const float *weight_data[MAX_WEIGHTS];
    uint32_t weight_count;
    bool reader_fails;     /* the weight reader answers false */
    const uint8_t *packed; /* a quantized weight's bytes (read_packed) */
    uint64_t packed_bytes;
    ref_model *r;
} fixture;

static fixture *fixture_new(void) {
    fixture *f = calloc(1, sizeof *f);
    assert_non_null(f);
    ir_module_init(&f->m, "test");
    f->log = open_memstream(&f->log_text, &f->log_size);
    diag_init(&f->d, f->log);
    ir_add_symbol(&f->m, "tokens", TOKEN_BOUND, SMELT_NO_LOC);
    return f;
}

static void fixture_free(fixture *f) {
    ref_model_free(f->r);
    diag_free(&f->d);
    fclose(f->log);
    free(f->log_text);
    ir_module_free(&f->m);
    free(f);
}

static const char *log_of(fixture *f) {
    fflush(f->log);
    return f->log_text ? f->log_text : "";
}

/* "f32[tokens, 4]", "i32[tokens]", "f32[]": dims are numbers or symbol names. */
static ir_type type_of_text(fixture *f, const char *text) {
    ir_type t = {0};
    const char *bracket = strchr(text, '[');
    assert_non_null(bracket);
    t.dtype = smelt_dtype_from_name(text, (size_t)(bracket - text));
    assert_int_not_equal(t.dtype, SMELT_DTYPE_UNKNOWN);
    for (const char *p = bracket + 1; *p != ']';) {
        while (*p == ' ' || *p == ',')
            p++;
        size_t n = strcspn(p, ", ]");
        char word[64];
        snprintf(word, sizeof word, "%.*s", (int)n, p);
        int32_t symbol = ir_find_symbol(&f->m, word);
        t.dims[t.rank++] = symbol >= 0 ? ir_dim_symbol(symbol) : ir_dim_const(strtoll(word, NULL, 10));
        p += n;
    }
    return t;
}

static uint32_t append(fixture *f, ir_op_kind kind, const ir_value_id *operands, uint32_t count) {
    uint32_t op = ir_append_op(&f->m, kind, operands, count, UINT32_MAX, SMELT_NO_LOC);
    ir_op_fill_defaults(&f->m, op);
    return op;
}

static ir_value_id result(fixture *f, uint32_t op) { return ir_op_result(&f->m, op, 0); }

static ir_value_id declare(fixture *f, ir_op_kind kind, const char *name, const char *type) {
    uint32_t op = append(f, kind, NULL, 0);
    assert_true(ir_op_set_string(&f->m, op, "name", name));
    f->m.values[result(f, op)].type = type_of_text(f, type);
    return result(f, op);
}

/* The inputs "ids" and "pos", i32[tokens]. */
static void declare_inputs(fixture *f) {
    f->ids = declare(f, IR_OP_INPUT, "ids", "i32[tokens]");
    f->pos = declare(f, IR_OP_INPUT, "pos", "i32[tokens]");
}

/* A weight whose data the reader hands out (data must outlive the create). */
static ir_value_id weight(fixture *f, const char *type, const float *data) {
    assert_true(f->weight_count < MAX_WEIGHTS);
    char name[32];
    snprintf(name, sizeof name, "w%u", f->weight_count);
    ir_value_id v = declare(f, IR_OP_WEIGHT, name, type);
    f->weight_ops[f->weight_count] = f->m.values[v].def_op;
    f->weight_data[f->weight_count++] = data;
    return v;
}

static bool read_weight(void *context, uint32_t op, float *dst, uint64_t count) {
    fixture *f = context;
    if (f->reader_fails) return false;
    for (uint32_t i = 0; i < f->weight_count; i++) {
        if (f->weight_ops[i] != op) continue;
        memcpy(dst, f->weight_data[i], count * sizeof *dst);
        return true;
    }
    return false;
}

static ir_value_id const_f32(fixture *f, double value) {
    uint32_t op = append(f, IR_OP_CONST, NULL, 0);
    assert_true(ir_op_set_float(&f->m, op, "value", value));
    f->m.values[result(f, op)].type = (ir_type){.dtype = SMELT_DTYPE_F32};
    return result(f, op);
}

static uint32_t op1(fixture *f, ir_op_kind kind, ir_value_id a) { return append(f, kind, &a, 1); }
static uint32_t op2(fixture *f, ir_op_kind kind, ir_value_id a, ir_value_id b) {
    return append(f, kind, (ir_value_id[]){a, b}, 2);
}

static void set_ints(fixture *f, uint32_t op, const char *name, const int64_t *items, uint32_t count) {
    assert_true(ir_op_set_attr(&f->m, op, name,
                               &(ir_attr){.kind = IR_ATTR_INTS, .as.ints = {count, (int64_t *)items}}));
}

/* reshape(x) to the shape written as a type: "f32[tokens, 2, 2]". */
static ir_value_id reshape(fixture *f, ir_value_id x, const char *shape) {
    uint32_t op = op1(f, IR_OP_RESHAPE, x);
    ir_type t = type_of_text(f, shape);
    assert_true(
        ir_op_set_attr(&f->m, op, "shape", &(ir_attr){.kind = IR_ATTR_SHAPE, .as.shape = {t.rank, t.dims}}));
    return result(f, op);
}

static ir_value_id embedding(fixture *f, ir_value_id table, ir_value_id ids) {
    return result(f, op2(f, IR_OP_EMBEDDING, table, ids));
}

static void output(fixture *f, ir_value_id x, const char *name) {
    uint32_t op = op1(f, IR_OP_OUTPUT, x);
    assert_true(ir_op_set_string(&f->m, op, "name", name));
}

/* Infers the shapes and creates the model; NULL (with the log) on errors. */
static ref_model *try_create(fixture *f) {
    if (!pass_infer_shapes(&f->m, &f->d)) return NULL;
    f->r = ref_model_create(&f->m, read_weight, f, &f->d);
    return f->r;
}

static void create(fixture *f) {
    if (!try_create(f)) fail_msg("create failed:\n%s", log_of(f));
}

/* One step of n tokens; the output lands in out (capacity floats). */
static void step(fixture *f, const int32_t *ids, const int32_t *pos, uint32_t n, float *out,
                 uint64_t capacity) {
    if (!ref_model_step(f->r, ids, pos, n, out, capacity, &f->d)) fail_msg("step failed:\n%s", log_of(f));
}

/* A step whose output has nothing to do with ids and pos: one token. */
static void step_once(fixture *f, float *out, uint64_t capacity) {
    step(f, (const int32_t[]){0}, (const int32_t[]){0}, 1, out, capacity);
}

static void assert_floats(const float *actual, const double *expected, size_t count, double tolerance) {
    for (size_t i = 0; i < count; i++)
        if (!(fabs(actual[i] - expected[i]) <= tolerance))
            fail_msg("element %zu: expected %.9g, found %.9g (tolerance %g)", i, expected[i],
                     (double)actual[i], tolerance);
}

static void assert_log_contains(fixture *f, const char *text) {
    if (!strstr(log_of(f), text)) fail_msg("expected '%s' in the diagnostics:\n%s", text, log_of(f));
}

/* ---- matmul, add, mul ---------------------------------------------------------------- */

static const float x23[] = {1, 2, 3, 4, 5, 6}; /* [[1, 2, 3], [4, 5, 6]] */

/* y = x @ w^T + b with w [N=2, K=3] = [[1, 0, -1], [0.5, 0.5, 0.5]], b = [10, 20]:
 * y[0] = [1*1 + 2*0 + 3*-1 + 10, (1+2+3)*0.5 + 20] = [8, 23]
 * y[1] = [4 - 6 + 10, (4+5+6)*0.5 + 20] = [8, 27.5] */
static void test_matmul_out_in_with_bias(void **state) {
    fixture *f = fixture_new();
    declare_inputs(f);
    static const float w[] = {1, 0, -1, 0.5f, 0.5f, 0.5f}, b[] = {10, 20};
    ir_value_id x = weight(f, "f32[2, 3]", x23);
    uint32_t mm =
        append(f, IR_OP_MATMUL, (ir_value_id[]){x, weight(f, "f32[2, 3]", w), weight(f, "f32[2]", b)}, 3);
    output(f, result(f, mm), "logits");
    create(f);
    assert_int_equal(ref_model_vocab(f->r), 2);
    float out[4];
    step_once(f, out, 4);
    assert_floats(out, (const double[]){8, 23, 8, 27.5}, 4, 1e-6);
    fixture_free(f);
}

/* The same product with w stored [K=3, N=2] (layout in_out). */
static void test_matmul_in_out_with_bias(void **state) {
    fixture *f = fixture_new();
    declare_inputs(f);
    static const float w[] = {1, 0.5f, 0, 0.5f, -1, 0.5f}, b[] = {10, 20};
    ir_value_id x = weight(f, "f32[2, 3]", x23);
    uint32_t mm =
        append(f, IR_OP_MATMUL, (ir_value_id[]){x, weight(f, "f32[3, 2]", w), weight(f, "f32[2]", b)}, 3);
    assert_true(ir_op_set_string(&f->m, mm, "layout", "in_out"));
    output(f, result(f, mm), "logits");
    create(f);
    float out[4];
    step_once(f, out, 4);
    assert_floats(out, (const double[]){8, 23, 8, 27.5}, 4, 1e-6);
    fixture_free(f);
}

/* Without a bias, on tokens from an embedding: x rows are table rows. */
static void test_matmul_over_tokens(void **state) {
    fixture *f = fixture_new();
    declare_inputs(f);
    static const float table[] = {1, 2, 3, 4, 5, 6}, w[] = {1, 1, 1, 2, 0, 0}; /* [V=2, 3], [2, 3] */
    ir_value_id x = embedding(f, weight(f, "f32[2, 3]", table), f->ids);
    output(f, result(f, op2(f, IR_OP_MATMUL, x, weight(f, "f32[2, 3]", w))), "logits");
    create(f);
    float out[6];
    step(f, (const int32_t[]){1, 0, 1}, (const int32_t[]){0, 1, 2}, 3, out, 6);
    /* row 1 = [4, 5, 6] -> [15, 8]; row 0 = [1, 2, 3] -> [6, 2] */
    assert_floats(out, (const double[]){15, 8, 6, 2, 15, 8}, 6, 1e-6);
    fixture_free(f);
}

/* ---- W8A8: matmuls that quantize their input (ir/ops.def, act_quant) ------------------ */

static bool read_packed(void *context, uint32_t op, uint8_t *dst, uint64_t bytes) {
    (void)op;
    const fixture *f = context;
    if (bytes != f->packed_bytes) return false;
    memcpy(dst, f->packed, bytes);
    return true;
}

/* y = matmul(x [1, 3], w [2, 3]) with act_quant `kind` and act_scale `rule`
 * (at `scale` when "tensor"); w in quant.h's layout with one f16 scale per
 * row, 0.5 and 0.25, and the raw codes given: its two outputs. */
static void w8a8_matmul_run(quant_kind kind, const uint8_t codes[6], const char *rule, double scale,
                            bool through_quantize, const float x[3], float out[2]);

static void w8a8_matmul(quant_kind kind, const uint8_t codes[6], const char *rule, double scale,
                        const float x[3], float out[2]) {
    w8a8_matmul_run(kind, codes, rule, scale, false, x, out);
}

/* The same matmul with act_codes, reading the codes and scales of a
 * quantize of x (ops.def), as precision makes FP8 W8A8: its outputs. */
static void w8a8_matmul_through_quantize(quant_kind kind, const uint8_t codes[6], const char *rule,
                                         double scale, const float x[3], float out[2]) {
    w8a8_matmul_run(kind, codes, rule, scale, true, x, out);
}

static void w8a8_matmul_run(quant_kind kind, const uint8_t codes[6], const char *rule, double scale,
                            bool through_quantize, const float x[3], float out[2]) {
    fixture *f = fixture_new();
    declare_inputs(f);
    quant_format format = {.kind = kind, .method = QUANT_METHOD_RTN, .group = 3};
    quant_layout l;
    assert_null(quant_layout_of(&format, 2, 3, &l));
    uint8_t bytes[64] = {0};
    assert_true(l.total <= sizeof bytes);
    memcpy(bytes + l.codes, codes, 6);
    uint16_t half = plan_f32_to_f16(0.5f), quarter = plan_f32_to_f16(0.25f);
    memcpy(bytes + l.scales, &half, 2); /* little-endian, as the layout says */
    memcpy(bytes + l.scales + 2, &quarter, 2);
    f->packed = bytes;
    f->packed_bytes = l.total;
    ir_value_id xv = weight(f, "f32[1, 3]", x);
    ir_value_id wv = declare(f, IR_OP_WEIGHT, "w", kind == QUANT_INT8 ? "i8[2, 3]" : "f8e4m3[2, 3]");
    ir_weight_set_quant(&f->m, f->m.values[wv].def_op, &format);
    const char *dtype = kind == QUANT_INT8 ? "i8" : "f8e4m3";
    uint32_t mm;
    if (through_quantize) {
        uint32_t q = ir_append_op(&f->m, IR_OP_QUANTIZE, &xv, 1, 2, SMELT_NO_LOC);
        ir_op_fill_defaults(&f->m, q);
        assert_true(ir_op_set_string(&f->m, q, "dtype", dtype));
        assert_true(ir_op_set_string(&f->m, q, "act_scale", rule));
        assert_true(ir_op_set_float(&f->m, q, "act_scale_value", scale));
        mm = append(f, IR_OP_MATMUL,
                    (ir_value_id[]){xv, wv, ir_op_result(&f->m, q, 0), ir_op_result(&f->m, q, 1)}, 4);
        assert_true(ir_op_set_bool(&f->m, mm, "act_codes", true));
    } else {
        mm = op2(f, IR_OP_MATMUL, xv, wv);
    }
    assert_true(ir_op_set_string(&f->m, mm, "act_quant", dtype));
    assert_true(ir_op_set_string(&f->m, mm, "act_scale", rule));
    assert_true(ir_op_set_float(&f->m, mm, "act_scale_value", scale));
    output(f, result(f, mm), "logits");
    if (!pass_infer_shapes(&f->m, &f->d) || !ir_verify(&f->m, &f->d))
        fail_msg("infer-shapes or verify failed:\n%s", log_of(f));
    f->r = ref_model_create_packed(&f->m, read_weight, read_packed, f, &f->d);
    if (!f->r) fail_msg("create failed:\n%s", log_of(f));
    step_once(f, out, 2);
    fixture_free(f);
}

/* int8 per token: x = [1, -2.54, 0.513] has s = 2.54 / 127 = 0.02 and codes
 * [50, -127, rint(25.65) = 26]; w's codes [10, -20, 30] and [127, 0, -127]:
 *   y0 = (500 + 2540 + 780) * 0.02 * 0.5  = 3820 * 0.01  = 38.2
 *   y1 = (6350 + 0 - 3302) * 0.02 * 0.25 = 3048 * 0.005 = 15.24
 * (the weight-only product would be 38.095 and 15.46225). */
static void test_w8a8_int8_per_token(void **state) {
    (void)state;
    static const float x[3] = {1.0f, -2.54f, 0.513f};
    const uint8_t codes[6] = {10, (uint8_t)-20, 30, 127, 0, (uint8_t)-127};
    float out[2];
    w8a8_matmul(QUANT_INT8, codes, "token", 0.0, x, out);
    assert_floats(out, (const double[]){38.2, 15.24}, 2, 1e-4);
}

/* E4M3 per token: s = 2.54 / 448 and x / s = [176.38, -448, 90.48], whose
 * E4M3 values are 176 (steps of 16 in [128, 256)), -448 and 88 (steps of 8);
 * w's values [10, -20, 30] and [12, 0, -12]:
 *   y0 = (1760 + 8960 + 2640) * s * 0.5 = 13360 * s / 2 = 37.8732143
 *   y1 = (2112 + 0 - 1056) * s * 0.25   = 1056 * s / 4  = 1.49678571 */
static void test_w8a8_fp8_per_token(void **state) {
    (void)state;
    static const float x[3] = {1.0f, -2.54f, 0.513f};
    const float values[6] = {10, -20, 30, 12, 0, -12};
    uint8_t codes[6];
    for (int i = 0; i < 6; i++)
        codes[i] = plan_f32_to_f8e4m3(values[i]); /* each exactly representable */
    float out[2];
    w8a8_matmul(QUANT_FP8, codes, "token", 0.0, x, out);
    assert_floats(out, (const double[]){37.8732143, 1.49678571}, 2, 1e-5);
}

/* E4M3 at a static scale S = 0.0125: x / S = [80, -203.2, 41.04] becomes
 * [80, -208, 40] (steps of 16 and 4), whatever the row's own max:
 *   y0 = (800 + 4160 + 1200) * 0.0125 * 0.5 = 38.5
 *   y1 = (960 + 0 - 480) * 0.0125 * 0.25   = 1.5 */
static void test_w8a8_fp8_static_scale(void **state) {
    (void)state;
    static const float x[3] = {1.0f, -2.54f, 0.513f};
    const float values[6] = {10, -20, 30, 12, 0, -12};
    uint8_t codes[6];
    for (int i = 0; i < 6; i++)
        codes[i] = plan_f32_to_f8e4m3(values[i]);
    float out[2];
    w8a8_matmul(QUANT_FP8, codes, "tensor", 0.0125, x, out);
    assert_floats(out, (const double[]){38.5, 1.5}, 2, 1e-5);
}

/* A matmul through the codes of a quantize equals the matmul that quantizes
 * x itself (act_quant), bit for bit, and so the hand values above: one
 * function codes both (ref_quantize_row). */
static void test_w8a8_through_quantize_codes(void **state) {
    (void)state;
    static const float x[3] = {1.0f, -2.54f, 0.513f};
    const float values[6] = {10, -20, 30, 12, 0, -12};
    uint8_t fp8[6];
    for (int i = 0; i < 6; i++)
        fp8[i] = plan_f32_to_f8e4m3(values[i]);
    const uint8_t int8[6] = {10, (uint8_t)-20, 30, 127, 0, (uint8_t)-127};
    struct {
        quant_kind kind;
        const uint8_t *codes;
        const char *rule;
        double scale, expected[2];
    } cases[] = {
        {QUANT_INT8, int8, "token", 0.0, {38.2, 15.24}},
        {QUANT_FP8, fp8, "token", 0.0, {37.8732143, 1.49678571}},
        {QUANT_FP8, fp8, "tensor", 0.0125, {38.5, 1.5}},
    };
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        float own[2], through[2];
        w8a8_matmul(cases[c].kind, cases[c].codes, cases[c].rule, cases[c].scale, x, own);
        w8a8_matmul_through_quantize(cases[c].kind, cases[c].codes, cases[c].rule, cases[c].scale, x,
                                     through);
        assert_memory_equal(own, through, sizeof own);
        assert_floats(through, cases[c].expected, 2, 1e-4);
    }
}

/* quantize(x [rows, 4]) by ref_run_op: its codes (held as the values they
 * stand for) and one scale per row. */
static void run_quantize(quant_kind kind, float static_scale, const float *x, uint64_t rows, float *codes,
                         float *scales) {
    ref_tensor in = {.elem = REF_F32, .rank = 2, .dims = {rows, 4}, .count = rows * 4, .f = (float *)x};
    ref_tensor out[2] = {{.elem = REF_F32, .rank = 2, .dims = {rows, 4}, .count = rows * 4, .f = codes},
                         {.elem = REF_F32, .rank = 1, .dims = {rows}, .count = rows, .f = scales}};
    const ref_tensor *operands[1] = {&in};
    ref_attrs attrs = {.w8a8 = kind, .w8a8_scale = static_scale};
    ref_call call = {.in = operands, .in_count = 1, .out = out, .out_count = 2, .attrs = &attrs};
    assert_true(ref_run_op(IR_OP_QUANTIZE, &call));
}

/* E4M3 per token, by hand: a row of zeros has scale 1 (codes 0); a row
 * whose max is 448 has scale 1 and keeps its representable values; between
 * 16 and 32 E4M3 steps by 2, so 17 and 19 are ties, rounded to the even
 * mantissa: 16 (1.000b x 2^4) and 20 (1.010b x 2^4), -17 to -16; a row of
 * max 896 has scale 2, its halves rounded alike. */
static void test_quantize_e4m3_per_token(void **state) {
    (void)state;
    const float x[16] = {0, 0, 0, 0, 448, -1, 0.5f, 2, 448, 17, 19, -17, 896, 34, 38, 1};
    float codes[16], scales[4];
    run_quantize(QUANT_FP8, 0.0f, x, 4, codes, scales);
    assert_floats(scales, (const double[]){1, 1, 1, 2}, 4, 0);
    assert_floats(codes, (const double[]){0, 0, 0, 0, 448, -1, 0.5, 2, 448, 16, 20, -16, 448, 16, 20, 0.5},
                  16, 0);
}

/* E4M3 at a static scale 0.5: x / 0.5 = [600, -2000, 2, 0.6] saturates to
 * +-448 and 0.6 rounds to 0.625 (steps of 1/16 in [0.5, 1)). */
static void test_quantize_e4m3_static_scale_saturates(void **state) {
    (void)state;
    const float x[4] = {300, -1000, 1, 0.3f};
    float codes[4], scales[1];
    run_quantize(QUANT_FP8, 0.5f, x, 1, codes, scales);
    assert_floats(scales, (const double[]){0.5}, 1, 0);
    assert_floats(codes, (const double[]){448, -448, 2, 0.625}, 4, 0);
}

/* int8: a row of zeros has scale 1; a row of max 127 has scale 1 and its
 * halves round to even (2.5 -> 2, 3.5 -> 4, -0.5 -> -0); at a static scale
 * 2, x / 2 = [150, -200, 2.5, 1.5] saturates to +-127 and rounds to 2, 2.
 * The codes are the integers. */
static void test_quantize_int8(void **state) {
    (void)state;
    const float x[8] = {0, 0, 0, 0, 127, 2.5f, 3.5f, -0.5f};
    float codes[8], scales[2];
    run_quantize(QUANT_INT8, 0.0f, x, 2, codes, scales);
    assert_floats(scales, (const double[]){1, 1}, 2, 0);
    assert_floats(codes, (const double[]){0, 0, 0, 0, 127, 2, 4, 0}, 8, 0);
    const float y[4] = {300, -400, 5, 3};
    run_quantize(QUANT_INT8, 2.0f, y, 1, codes, scales);
    assert_floats(scales, (const double[]){2}, 1, 0);
    assert_floats(codes, (const double[]){127, -127, 2, 2}, 4, 0);
}

/* ---- the int4 presets' token-embedding table: int8, one scale per row ----------------- */

/* embedding(table [3, 4], ids) with the table in quant.h's layout, int8
 * codes and one f16 scale per row (0.5, 0.25, 2): each gathered row is its
 * codes times its scale, by hand:
 *   row 0: [10, -20, 30, 127] * 0.5    = [5, -10, 15, 63.5]
 *   row 1: [0, 1, -1, -127] * 0.25     = [0, 0.25, -0.25, -31.75]
 *   row 2: [64, 64, -64, 2] * 2        = [128, 128, -128, 4] */
static void test_embedding_int8_table(void **state) {
    (void)state;
    fixture *f = fixture_new();
    declare_inputs(f);
    quant_format format = {.kind = QUANT_INT8, .method = QUANT_METHOD_RTN, .group = 4};
    quant_layout l;
    assert_null(quant_layout_of(&format, 3, 4, &l));
    uint8_t bytes[64] = {0};
    assert_true(l.total <= sizeof bytes);
    const int8_t codes[12] = {10, -20, 30, 127, 0, 1, -1, -127, 64, 64, -64, 2};
    memcpy(bytes + l.codes, codes, sizeof codes);
    const float scales[3] = {0.5f, 0.25f, 2.0f};
    for (int r = 0; r < 3; r++) {
        uint16_t half = plan_f32_to_f16(scales[r]);
        memcpy(bytes + l.scales + 2 * r, &half, 2); /* little-endian, as the layout says */
    }
    f->packed = bytes;
    f->packed_bytes = l.total;
    ir_value_id table = declare(f, IR_OP_WEIGHT, "model.embed_tokens.weight", "i8[3, 4]");
    ir_weight_set_quant(&f->m, f->m.values[table].def_op, &format);
    output(f, embedding(f, table, f->ids), "logits");
    if (!pass_infer_shapes(&f->m, &f->d)) fail_msg("infer-shapes failed:\n%s", log_of(f));
    f->r = ref_model_create_packed(&f->m, read_weight, read_packed, f, &f->d);
    if (!f->r) fail_msg("create failed:\n%s", log_of(f));
    float out[16];
    step(f, (const int32_t[]){2, 0, 1, 2}, (const int32_t[]){0, 1, 2, 3}, 4, out, 16);
    assert_floats(
        out, (const double[]){128, 128, -128, 4, 5, -10, 15, 63.5, 0, 0.25, -0.25, -31.75, 128, 128, -128, 4},
        16, 0.0);
    fixture_free(f);
}

/* a[2, 3] + b[3]: b added to each row. */
static void test_add_broadcasts_a_row(void **state) {
    fixture *f = fixture_new();
    declare_inputs(f);
    static const float b[] = {10, 20, 30};
    output(f, result(f, op2(f, IR_OP_ADD, weight(f, "f32[2, 3]", x23), weight(f, "f32[3]", b))), "logits");
    create(f);
    float out[6];
    step_once(f, out, 6);
    assert_floats(out, (const double[]){11, 22, 33, 14, 25, 36}, 6, 0);
    fixture_free(f);
}

/* a[2, 3] * c[2, 1]: row i scaled by c[i]. */
static void test_mul_broadcasts_a_column(void **state) {
    fixture *f = fixture_new();
    declare_inputs(f);
    static const float c[] = {2, 3};
    output(f, result(f, op2(f, IR_OP_MUL, weight(f, "f32[2, 3]", x23), weight(f, "f32[2, 1]", c))), "logits");
    create(f);
    float out[6];
    step_once(f, out, 6);
    assert_floats(out, (const double[]){2, 4, 6, 12, 15, 18}, 6, 0);
    fixture_free(f);
}

/* a[3] + b[2, 1]: both sides stretch, giving [2, 3]. */
static void test_add_broadcasts_both_sides(void **state) {
    fixture *f = fixture_new();
    declare_inputs(f);
    static const float a[] = {1, 2, 3}, b[] = {10, 20};
    output(f, result(f, op2(f, IR_OP_ADD, weight(f, "f32[3]", a), weight(f, "f32[2, 1]", b))), "logits");
    create(f);
    float out[6];
    step_once(f, out, 6);
    assert_floats(out, (const double[]){11, 12, 13, 21, 22, 23}, 6, 0);
    fixture_free(f);
}

/* A scalar constant, then a scalar times a matrix the other way round. */
static void test_scalar_constant_broadcasts(void **state) {
    fixture *f = fixture_new();
    declare_inputs(f);
    ir_value_id sum = result(f, op2(f, IR_OP_ADD, weight(f, "f32[2, 3]", x23), const_f32(f, 0.5)));
    output(f, result(f, op2(f, IR_OP_MUL, const_f32(f, -2.0), sum)), "logits");
    create(f);
    float out[6];
    step_once(f, out, 6);
    assert_floats(out, (const double[]){-3, -5, -7, -9, -11, -13}, 6, 0);
    fixture_free(f);
}

/* ---- norms --------------------------------------------------------------------------- */

/* x = [1, 2, 3, 4]: mean(x^2) = 30 / 4 = 7.5. */
static void test_rms_norm(void **state) {
    fixture *f = fixture_new();
    declare_inputs(f);
    static const float x[] = {1, 2, 3, 4, -1, 1, -1, 1}, w[] = {1, 1, 2, 0.5f};
    uint32_t norm = op2(f, IR_OP_RMS_NORM, weight(f, "f32[2, 4]", x), weight(f, "f32[4]", w));
    assert_true(ir_op_set_float(&f->m, norm, "eps", 1e-5));
    output(f, result(f, norm), "logits");
    create(f);
    float out[8];
    step_once(f, out, 8);
    double s = 1.0 / sqrt(7.5 + 1e-5), t = 1.0 / sqrt(1.0 + 1e-5); /* second row: mean(x^2) = 1 */
    assert_floats(out, (const double[]){1 * s, 2 * s, 3 * s * 2, 4 * s * 0.5, -t, t, -t * 2, t * 0.5}, 8,
                  1e-6);
    fixture_free(f);
}

/* Gemma's RMSNorm: offset 1 scales by (1 + w); the rows of test_rms_norm. */
static void test_rms_norm_offset(void **state) {
    fixture *f = fixture_new();
    declare_inputs(f);
    static const float x[] = {1, 2, 3, 4, -1, 1, -1, 1}, w[] = {0, 1, -0.5f, 0.5f};
    uint32_t norm = op2(f, IR_OP_RMS_NORM, weight(f, "f32[2, 4]", x), weight(f, "f32[4]", w));
    assert_true(ir_op_set_float(&f->m, norm, "eps", 1e-5));
    assert_true(ir_op_set_float(&f->m, norm, "offset", 1.0));
    output(f, result(f, norm), "logits");
    create(f);
    float out[8];
    step_once(f, out, 8);
    double s = 1.0 / sqrt(7.5 + 1e-5), t = 1.0 / sqrt(1.0 + 1e-5);
    assert_floats(out,
                  (const double[]){1 * s, 2 * s * 2, 3 * s * 0.5, 4 * s * 1.5, -t, t * 2, -t * 0.5, t * 1.5},
                  8, 1e-6);
    fixture_free(f);
}

/* x = [1, 2, 3, 4]: mean 2.5, biased variance (2.25 + 0.25 + 0.25 + 2.25) / 4 = 1.25. */
static void test_layer_norm(void **state) {
    fixture *f = fixture_new();
    declare_inputs(f);
    static const float x[] = {1, 2, 3, 4}, w[] = {1, 2, 1, 1}, b[] = {0, 0, 1, -1};
    uint32_t norm =
        append(f, IR_OP_LAYER_NORM,
               (ir_value_id[]){weight(f, "f32[1, 4]", x), weight(f, "f32[4]", w), weight(f, "f32[4]", b)}, 3);
    assert_true(ir_op_set_float(&f->m, norm, "eps", 1e-5));
    output(f, result(f, norm), "logits");
    create(f);
    float out[4];
    step_once(f, out, 4);
    double s = 1.0 / sqrt(1.25 + 1e-5);
    assert_floats(out, (const double[]){-1.5 * s, -0.5 * s * 2, 0.5 * s + 1, 1.5 * s - 1}, 4, 1e-6);
    fixture_free(f);
}

/* Without a bias: w only. */
static void test_layer_norm_without_bias(void **state) {
    fixture *f = fixture_new();
    declare_inputs(f);
    static const float x[] = {2, 4}, w[] = {3, 3};
    uint32_t norm = op2(f, IR_OP_LAYER_NORM, weight(f, "f32[2]", x), weight(f, "f32[2]", w));
    assert_true(ir_op_set_float(&f->m, norm, "eps", 0.0));
    output(f, result(f, norm), "logits");
    create(f);
    float out[2];
    step_once(f, out, 2);
    assert_floats(out, (const double[]){-3, 3}, 2, 1e-6); /* mean 3, variance 1 */
    fixture_free(f);
}

/* ---- rope -------------------------------------------------------------------------------- */

/* cos and sin of the two angles of a 4-dim head at position 1 with theta
 * 10000: inv_freq = [1, 10000^(-1/2)] = [1, 0.01]. */
static const double cos1 = 0.5403023058681398, sin1 = 0.8414709848078965;
static const double cos001 = 0.9999500004166653, sin001 = 0.009999833334166664;

/* rope of x = [1, 2, 3, 4] (one head) for tokens at positions 0 and 1. */
static void run_rope(const char *style, int64_t rotary_dim, float *out) {
    fixture *f = fixture_new();
    declare_inputs(f);
    static const float table[] = {1, 2, 3, 4};
    ir_value_id x = reshape(f, embedding(f, weight(f, "f32[1, 4]", table), f->ids), "f32[tokens, 1, 4]");
    uint32_t rope = op2(f, IR_OP_ROPE, x, f->pos);
    assert_true(ir_op_set_float(&f->m, rope, "theta", 10000.0));
    assert_true(ir_op_set_string(&f->m, rope, "style", style));
    assert_true(ir_op_set_int(&f->m, rope, "rotary_dim", rotary_dim));
    output(f, result(f, rope), "logits");
    create(f);
    step(f, (const int32_t[]){0, 0}, (const int32_t[]){0, 1}, 2, out, 8);
    fixture_free(f);
}

/* neox pairs (x[i], x[i + 2]). */
static void test_rope_neox(void **state) {
    float out[8];
    run_rope("neox", 0, out);
    assert_floats(out, (const double[]){1, 2, 3, 4}, 4, 0); /* position 0: the identity */
    assert_floats(out + 4,
                  (const double[]){1 * cos1 - 3 * sin1, 2 * cos001 - 4 * sin001, 3 * cos1 + 1 * sin1,
                                   4 * cos001 + 2 * sin001},
                  4, 1e-6);
}

/* interleaved (GPT-J) pairs (x[2i], x[2i + 1]). */
static void test_rope_interleaved(void **state) {
    float out[8];
    run_rope("interleaved", 0, out);
    assert_floats(out, (const double[]){1, 2, 3, 4}, 4, 0);
    assert_floats(out + 4,
                  (const double[]){1 * cos1 - 2 * sin1, 2 * cos1 + 1 * sin1, 3 * cos001 - 4 * sin001,
                                   4 * cos001 + 3 * sin001},
                  4, 1e-6);
}

/* rotary_dim 2: inv_freq = [1], the pair (x[0], x[1]); dims 2 and 3 pass. */
static void test_rope_partial_rotary_dim(void **state) {
    float out[8];
    run_rope("neox", 2, out);
    assert_floats(out + 4, (const double[]){1 * cos1 - 2 * sin1, 2 * cos1 + 1 * sin1, 3, 4}, 4, 1e-6);
}

/* ---- attention --------------------------------------------------------------------------- */

/* softmax over two scores, weighting two values. */
static double mix2(double s0, double s1, double v0, double v1) {
    return (exp(s0) * v0 + exp(s1) * v1) / (exp(s0) + exp(s1));
}

static double mix3(double s0, double s1, double s2, double v0, double v1, double v2) {
    return (exp(s0) * v0 + exp(s1) * v1 + exp(s2) * v2) / (exp(s0) + exp(s1) + exp(s2));
}

/* attention over q, k, v made by embedding ids in three tables shaped
 * [V, Hq * D], [V, Hkv * D], [V, Hkv * Dv]. */
typedef struct attention_case {
    const char *q_table, *kv_table, *v_table; /* weight types */
    const char *q_shape, *k_shape, *v_shape;  /* reshape targets */
    const float *q, *k, *v;
    double scale;
    int64_t max_seq, window;
    bool causal;
} attention_case;

static fixture *attention_model(const attention_case *c) {
    fixture *f = fixture_new();
    declare_inputs(f);
    ir_value_id q = reshape(f, embedding(f, weight(f, c->q_table, c->q), f->ids), c->q_shape);
    ir_value_id k = reshape(f, embedding(f, weight(f, c->kv_table, c->k), f->ids), c->k_shape);
    ir_value_id v = reshape(f, embedding(f, weight(f, c->v_table, c->v), f->ids), c->v_shape);
    uint32_t a = append(f, IR_OP_ATTENTION, (ir_value_id[]){q, k, v, f->pos}, 4);
    assert_true(ir_op_set_float(&f->m, a, "scale", c->scale));
    assert_true(ir_op_set_int(&f->m, a, "max_seq", c->max_seq));
    assert_true(ir_op_set_int(&f->m, a, "window", c->window));
    assert_true(ir_op_set_bool(&f->m, a, "causal", c->causal));
    output(f, result(f, a), "logits");
    create(f);
    return f;
}

/* One head, D = 2: token 0 sees only itself; token 1 scores
 * 0.5 * q1.k0 = 0.5 and 0.5 * q1.k1 = 0. */
static void test_attention_one_head(void **state) {
    static const float q[] = {3, 3, 1, 0}, k[] = {1, 0, 0, 1}, v[] = {1, 2, 3, -1};
    attention_case c = {"f32[2, 2]",
                        "f32[2, 2]",
                        "f32[2, 2]",
                        "f32[tokens, 1, 2]",
                        "f32[tokens, 1, 2]",
                        "f32[tokens, 1, 2]",
                        q,
                        k,
                        v,
                        0.5,
                        8,
                        0,
                        true};
    fixture *f = attention_model(&c);
    float out[4];
    step(f, (const int32_t[]){0, 1}, (const int32_t[]){0, 1}, 2, out, 4);
    assert_floats(out, (const double[]){1, 2, mix2(0.5, 0, 1, 3), mix2(0.5, 0, 2, -1)}, 4, 1e-6);
    fixture_free(f);
}

/* GQA: 4 query heads over 2 kv heads, D = Dv = 1; heads 0, 1 read kv head 0
 * and heads 2, 3 read kv head 1. Token 1 (row 1 of each table):
 * head h scores q1[h] * k0[h / 2] and q1[h] * k1[h / 2]. */
static void test_attention_grouped_query_heads(void **state) {
    static const float q[] = {1, 1, 1, 1, /* token 1: */ 1, 2, -1, 0.5f};
    static const float k[] = {1, 2, /* token 1: */ -1, 1};
    static const float v[] = {10, 20, /* token 1: */ 30, 40};
    attention_case c = {"f32[2, 4]",
                        "f32[2, 2]",
                        "f32[2, 2]",
                        "f32[tokens, 4, 1]",
                        "f32[tokens, 2, 1]",
                        "f32[tokens, 2, 1]",
                        q,
                        k,
                        v,
                        1.0,
                        8,
                        0,
                        true};
    fixture *f = attention_model(&c);
    float out[8];
    step(f, (const int32_t[]){0, 1}, (const int32_t[]){0, 1}, 2, out, 8);
    assert_floats(out, (const double[]){10, 10, 20, 20}, 4, 1e-6); /* token 0: its own values */
    assert_floats(out + 4,
                  (const double[]){mix2(1 * 1, 1 * -1, 10, 30), mix2(2 * 1, 2 * -1, 10, 30),
                                   mix2(-1 * 2, -1 * 1, 20, 40), mix2(0.5 * 2, 0.5 * 1, 20, 40)},
                  4, 1e-5);
    fixture_free(f);
}

/* window 2: the token at position 2 sees positions 1 and 2, not 0. */
static void test_attention_sliding_window(void **state) {
    static const float q[] = {1, 1, 1}, k[] = {5, 1, 2}, v[] = {100, 10, 20};
    attention_case c = {"f32[3, 1]",
                        "f32[3, 1]",
                        "f32[3, 1]",
                        "f32[tokens, 1, 1]",
                        "f32[tokens, 1, 1]",
                        "f32[tokens, 1, 1]",
                        q,
                        k,
                        v,
                        1.0,
                        8,
                        2,
                        true};
    fixture *f = attention_model(&c);
    float out[3];
    step(f, (const int32_t[]){0, 1, 2}, (const int32_t[]){0, 1, 2}, 3, out, 3);
    assert_floats(out, (const double[]){100, mix2(5, 1, 100, 10), mix2(1, 2, 10, 20)}, 3, 1e-4);
    /* The same window across steps: decode position 3 sees 2 and 3. */
    step(f, (const int32_t[]){0}, (const int32_t[]){3}, 1, out, 1);
    assert_floats(out, (const double[]){mix2(2, 5, 20, 100)}, 1, 1e-4);
    fixture_free(f);
}

/* Gemma 2's soft-capping, on test_attention_one_head: token 1's scores 0.5
 * and 0 become 0.4 tanh(0.5 / 0.4) and 0 before the softmax. */
static void test_attention_softcap(void **state) {
    static const float q[] = {3, 3, 1, 0}, k[] = {1, 0, 0, 1}, v[] = {1, 2, 3, -1};
    attention_case c = {"f32[2, 2]",
                        "f32[2, 2]",
                        "f32[2, 2]",
                        "f32[tokens, 1, 2]",
                        "f32[tokens, 1, 2]",
                        "f32[tokens, 1, 2]",
                        q,
                        k,
                        v,
                        0.5,
                        8,
                        0,
                        true};
    fixture *f = fixture_new();
    declare_inputs(f);
    ir_value_id qv = reshape(f, embedding(f, weight(f, c.q_table, c.q), f->ids), c.q_shape);
    ir_value_id kv = reshape(f, embedding(f, weight(f, c.kv_table, c.k), f->ids), c.k_shape);
    ir_value_id vv = reshape(f, embedding(f, weight(f, c.v_table, c.v), f->ids), c.v_shape);
    uint32_t a = append(f, IR_OP_ATTENTION, (ir_value_id[]){qv, kv, vv, f->pos}, 4);
    assert_true(ir_op_set_float(&f->m, a, "scale", c.scale));
    assert_true(ir_op_set_int(&f->m, a, "max_seq", c.max_seq));
    assert_true(ir_op_set_float(&f->m, a, "softcap", 0.4));
    output(f, result(f, a), "logits");
    create(f);
    float out[4];
    step(f, (const int32_t[]){0, 1}, (const int32_t[]){0, 1}, 2, out, 4);
    double capped = 0.4 * tanh(0.5 / 0.4);
    assert_floats(out, (const double[]){1, 2, mix2(capped, 0, 1, 3), mix2(capped, 0, 2, -1)}, 4, 1e-6);
    fixture_free(f);
}

/* Not causal: every written position, later ones of the step included. */
static void test_attention_not_causal(void **state) {
    static const float q[] = {1, 1, 1}, k[] = {0, 1, 2}, v[] = {1, 2, 3};
    attention_case c = {"f32[3, 1]",
                        "f32[3, 1]",
                        "f32[3, 1]",
                        "f32[tokens, 1, 1]",
                        "f32[tokens, 1, 1]",
                        "f32[tokens, 1, 1]",
                        q,
                        k,
                        v,
                        1.0,
                        8,
                        0,
                        false};
    fixture *f = attention_model(&c);
    float out[3];
    step(f, (const int32_t[]){0, 1, 2}, (const int32_t[]){0, 1, 2}, 3, out, 3);
    double all = mix3(0, 1, 2, 1, 2, 3);
    assert_floats(out, (const double[]){all, all, all}, 3, 1e-5);
    fixture_free(f);
}

/* Reset forgets the cache: decoding position 1 then sees only itself. */
static void test_attention_reset(void **state) {
    static const float q[] = {1, 1}, k[] = {3, 1}, v[] = {7, 9};
    attention_case c = {"f32[2, 1]",
                        "f32[2, 1]",
                        "f32[2, 1]",
                        "f32[tokens, 1, 1]",
                        "f32[tokens, 1, 1]",
                        "f32[tokens, 1, 1]",
                        q,
                        k,
                        v,
                        1.0,
                        8,
                        0,
                        true};
    fixture *f = attention_model(&c);
    float out[2];
    step(f, (const int32_t[]){0, 1}, (const int32_t[]){0, 1}, 2, out, 2);
    assert_floats(out + 1, (const double[]){mix2(3, 1, 7, 9)}, 1, 1e-5);
    ref_model_reset(f->r);
    step(f, (const int32_t[]){1}, (const int32_t[]){1}, 1, out, 1);
    assert_floats(out, (const double[]){9}, 1, 1e-6);
    fixture_free(f);
}

/* ---- incremental decoding on a small attention model ------------------------------ */

enum { TOY_VOCAB = 11, TOY_DIM = 8, TOY_HEADS = 2, TOY_HEAD_DIM = 4 };

/* Deterministic numbers in [-1, 1). */
static void fill_random(float *x, size_t n, uint32_t seed) {
    uint32_t s = seed * 2654435761u + 1;
    for (size_t i = 0; i < n; i++) {
        s = s * 1664525u + 1013904223u;
        x[i] = (float)((s >> 8) / (double)(1u << 24) * 2.0 - 1.0);
    }
}

/* embed -> rms_norm -> q (2 heads), k, v (1 kv head) -> rope -> attention
 * -> o -> + residual -> lm head: logits [tokens, TOY_VOCAB]. */
static fixture *toy_model(float *weights) {
    fixture *f = fixture_new();
    declare_inputs(f);
    float *embed = weights, *norm = embed + TOY_VOCAB * TOY_DIM, *wq = norm + TOY_DIM;
    float *wk = wq + TOY_DIM * TOY_DIM, *wv = wk + TOY_HEAD_DIM * TOY_DIM, *wo = wv + TOY_HEAD_DIM * TOY_DIM;
    float *head = wo + TOY_DIM * TOY_DIM;
    ir_value_id h = embedding(f, weight(f, "f32[11, 8]", embed), f->ids);
    uint32_t n = op2(f, IR_OP_RMS_NORM, h, weight(f, "f32[8]", norm));
    assert_true(ir_op_set_float(&f->m, n, "eps", 1e-6));
    ir_value_id x = result(f, n);
    ir_value_id q =
        reshape(f, result(f, op2(f, IR_OP_MATMUL, x, weight(f, "f32[8, 8]", wq))), "f32[tokens, 2, 4]");
    ir_value_id k =
        reshape(f, result(f, op2(f, IR_OP_MATMUL, x, weight(f, "f32[4, 8]", wk))), "f32[tokens, 1, 4]");
    ir_value_id v =
        reshape(f, result(f, op2(f, IR_OP_MATMUL, x, weight(f, "f32[4, 8]", wv))), "f32[tokens, 1, 4]");
    uint32_t rq = op2(f, IR_OP_ROPE, q, f->pos), rk = op2(f, IR_OP_ROPE, k, f->pos);
    assert_true(ir_op_set_float(&f->m, rq, "theta", 10000.0));
    assert_true(ir_op_set_float(&f->m, rk, "theta", 10000.0));
    uint32_t a = append(f, IR_OP_ATTENTION, (ir_value_id[]){result(f, rq), result(f, rk), v, f->pos}, 4);
    assert_true(ir_op_set_float(&f->m, a, "scale", 0.5));
    assert_true(ir_op_set_int(&f->m, a, "max_seq", 8));
    ir_value_id o = result(
        f, op2(f, IR_OP_MATMUL, reshape(f, result(f, a), "f32[tokens, 8]"), weight(f, "f32[8, 8]", wo)));
    ir_value_id sum = result(f, op2(f, IR_OP_ADD, h, o));
    output(f, result(f, op2(f, IR_OP_MATMUL, sum, weight(f, "f32[11, 8]", head))), "logits");
    create(f);
    return f;
}

enum { TOY_WEIGHTS = TOY_VOCAB * TOY_DIM * 2 + TOY_DIM + 2 * TOY_DIM * TOY_DIM + 2 * TOY_HEAD_DIM * TOY_DIM };

/* Prefill of 3 tokens then 1 decoded == prefill of the 4, last row. */
static void test_incremental_decoding_matches_prefill(void **state) {
    float *weights = malloc(TOY_WEIGHTS * sizeof *weights);
    fill_random(weights, TOY_WEIGHTS, 7);
    fixture *f = toy_model(weights);
    const int32_t ids[] = {3, 1, 4, 1}, pos[] = {0, 1, 2, 3};
    float full[4 * TOY_VOCAB], part[3 * TOY_VOCAB], last[TOY_VOCAB];
    step(f, ids, pos, 4, full, 4 * TOY_VOCAB);
    ref_model_reset(f->r);
    step(f, ids, pos, 3, part, 3 * TOY_VOCAB);
    step(f, ids + 3, pos + 3, 1, last, TOY_VOCAB);
    double expected[4 * TOY_VOCAB];
    for (int i = 0; i < 4 * TOY_VOCAB; i++)
        expected[i] = full[i];
    assert_floats(last, expected + 3 * TOY_VOCAB, TOY_VOCAB, 1e-6);
    assert_floats(part, expected, 3 * TOY_VOCAB, 1e-6); /* causal: earlier rows do not see later tokens */
    /* Not a trivial model: rows differ and are not all equal to zero. */
    assert_true(fabs(full[0] - full[3 * TOY_VOCAB]) > 1e-3);
    fixture_free(f);
    free(weights);
}

/* ---- moe ----------------------------------------------------------------------------------- */

/* x = [1, 0]; router logits [1, 2, 0] (3 experts); F = 1:
 * expert e: h_e = silu(gate_e . x) * (up_e . x); out += weight_e * down_e h_e. */
static fixture *moe_model(const float *router, int64_t top_k, bool normalize) {
    static const float x[] = {1, 0};
    static const float gate[] = {1, 0, 2, 0, 5, 5};     /* [3, 1, 2] */
    static const float up[] = {1, 0, 0.5f, 0, 1, 1};    /* [3, 1, 2] */
    static const float down[] = {1, 0, 0, 1, 100, 100}; /* [3, 2, 1] */
    fixture *f = fixture_new();
    declare_inputs(f);
    ir_value_id operands[] = {weight(f, "f32[1, 2]", x), weight(f, "f32[3, 2]", router),
                              weight(f, "f32[3, 1, 2]", gate), weight(f, "f32[3, 1, 2]", up),
                              weight(f, "f32[3, 2, 1]", down)};
    uint32_t moe = append(f, IR_OP_MOE, operands, 5);
    assert_true(ir_op_set_int(&f->m, moe, "top_k", top_k));
    assert_true(ir_op_set_bool(&f->m, moe, "normalize", normalize));
    output(f, result(f, moe), "logits");
    create(f);
    return f;
}

static double silu(double x) { return x / (1 + exp(-x)); }

/* Top 2 of probabilities softmax([1, 2, 0]): experts 1 and 0, renormalised
 * to e^2 / (e^2 + e) and e / (e^2 + e). */
static void test_moe_top2_renormalised(void **state) {
    static const float router[] = {1, 0, 2, 0, 0, 0};
    fixture *f = moe_model(router, 2, true);
    float out[2];
    step_once(f, out, 2);
    double e = exp(1.0), e2 = exp(2.0);
    double w0 = e / (e2 + e), w1 = e2 / (e2 + e);
    assert_floats(out, (const double[]){w0 * silu(1) * 1, w1 * silu(2) * 0.5}, 2, 1e-6);
    fixture_free(f);
}

/* normalize = false: the plain softmax probabilities e^l / (e + e^2 + 1). */
static void test_moe_top2_unnormalised(void **state) {
    static const float router[] = {1, 0, 2, 0, 0, 0};
    fixture *f = moe_model(router, 2, false);
    float out[2];
    step_once(f, out, 2);
    double total = exp(1.0) + exp(2.0) + 1;
    assert_floats(out, (const double[]){exp(1.0) / total * silu(1), exp(2.0) / total * silu(2) * 0.5}, 2,
                  1e-6);
    fixture_free(f);
}

/* Equal router logits: the lower indices 0 and 1 win, not expert 2 (whose
 * down projection of 100 would show). */
static void test_moe_ties_pick_lower_index(void **state) {
    static const float router[] = {0, 0, 0, 0, 0, 0};
    fixture *f = moe_model(router, 2, true);
    float out[2];
    step_once(f, out, 2);
    assert_floats(out, (const double[]){0.5 * silu(1), 0.5 * silu(2) * 0.5}, 2, 1e-6);
    fixture_free(f);
}

/* ---- activations, softmax, argmax -------------------------------------------------------- */

static float run_gelu(const char *approximate, float x) {
    fixture *f = fixture_new();
    declare_inputs(f);
    static float data[1];
    data[0] = x;
    uint32_t g = op1(f, IR_OP_GELU, weight(f, "f32[1]", data));
    assert_true(ir_op_set_string(&f->m, g, "approximate", approximate));
    output(f, result(f, g), "logits");
    create(f);
    float out;
    step_once(f, &out, 1);
    fixture_free(f);
    return out;
}

static void test_gelu_both_kinds(void **state) {
    assert_floats((const float[]){run_gelu("none", 1)}, (const double[]){0.841345}, 1, 1e-6);
    assert_floats((const float[]){run_gelu("tanh", 1)}, (const double[]){0.841192}, 1, 1e-6);
    assert_floats((const float[]){run_gelu("none", -1)}, (const double[]){-0.158655}, 1, 1e-6);
}

static void test_silu(void **state) {
    fixture *f = fixture_new();
    declare_inputs(f);
    static const float x[] = {0, 1, -2};
    output(f, result(f, op1(f, IR_OP_SILU, weight(f, "f32[3]", x))), "logits");
    create(f);
    float out[3];
    step_once(f, out, 3);
    assert_floats(out, (const double[]){0, 1 / (1 + exp(-1.0)), -2 / (1 + exp(2.0))}, 3, 1e-7);
    fixture_free(f);
}

static void test_tanh_and_sigmoid(void **state) {
    static const float x[] = {0, 1, -2};
    float out[3];
    for (int kind = 0; kind < 2; kind++) {
        fixture *f = fixture_new();
        declare_inputs(f);
        output(f, result(f, op1(f, kind ? IR_OP_SIGMOID : IR_OP_TANH, weight(f, "f32[3]", x))), "logits");
        create(f);
        step_once(f, out, 3);
        if (kind)
            assert_floats(out, (const double[]){0.5, 0.7310585786, 0.1192029220}, 3, 1e-7);
        else
            assert_floats(out, (const double[]){0, 0.7615941560, -0.9640275801}, 3, 1e-7);
        fixture_free(f);
    }
}

/* softmax along axis 0 of [[0, 1], [ln 3, 1]]: columns [1/4, 3/4] and [1/2, 1/2]. */
static void test_softmax_axis_0(void **state) {
    fixture *f = fixture_new();
    declare_inputs(f);
    static float x[] = {0, 1, 0, 1};
    x[2] = (float)log(3.0);
    uint32_t s = op1(f, IR_OP_SOFTMAX, weight(f, "f32[2, 2]", x));
    assert_true(ir_op_set_int(&f->m, s, "axis", 0));
    output(f, result(f, s), "logits");
    create(f);
    float out[4];
    step_once(f, out, 4);
    assert_floats(out, (const double[]){0.25, 0.5, 0.75, 0.5}, 4, 1e-6);
    fixture_free(f);
}

/* argmax gives i32 indices; an embedding of the table [[0], [1], [2]] turns
 * them back into floats for the output. */
static void run_argmax(int64_t axis, float *out, uint64_t count) {
    fixture *f = fixture_new();
    declare_inputs(f);
    static const float x[] = {1, 5, 5, 7, 0, 7}; /* [[1, 5, 5], [7, 0, 7]] */
    static const float table[] = {0, 1, 2};
    uint32_t a = op1(f, IR_OP_ARGMAX, weight(f, "f32[2, 3]", x));
    assert_true(ir_op_set_int(&f->m, a, "axis", axis));
    output(f, embedding(f, weight(f, "f32[3, 1]", table), result(f, a)), "logits");
    create(f);
    step_once(f, out, count);
    fixture_free(f);
}

static void test_argmax_first_maximum(void **state) {
    float out[3];
    run_argmax(-1, out, 2);
    assert_floats(out, (const double[]){1, 0}, 2, 0); /* ties: the first */
    run_argmax(0, out, 3);
    assert_floats(out, (const double[]){1, 0, 1}, 3, 0);
}

/* ---- layout ---------------------------------------------------------------------------------- */

static const float iota23[] = {0, 1, 2, 3, 4, 5}; /* [[0, 1, 2], [3, 4, 5]] */

static void test_transpose_2d(void **state) {
    fixture *f = fixture_new();
    declare_inputs(f);
    uint32_t t = op1(f, IR_OP_TRANSPOSE, weight(f, "f32[2, 3]", iota23));
    set_ints(f, t, "perm", (const int64_t[]){1, 0}, 2);
    output(f, result(f, t), "logits");
    create(f);
    float out[6];
    step_once(f, out, 6);
    assert_floats(out, (const double[]){0, 3, 1, 4, 2, 5}, 6, 0);
    fixture_free(f);
}

/* [2, 3, 4] with perm [2, 0, 1]: y[i][j][k] = x[j][k][i] = 12 j + 4 k + i. */
static void test_transpose_3d(void **state) {
    fixture *f = fixture_new();
    declare_inputs(f);
    float x[24];
    for (int i = 0; i < 24; i++)
        x[i] = (float)i;
    uint32_t t = op1(f, IR_OP_TRANSPOSE, weight(f, "f32[2, 3, 4]", x));
    set_ints(f, t, "perm", (const int64_t[]){2, 0, 1}, 3);
    output(f, result(f, t), "logits");
    create(f);
    float out[24];
    step_once(f, out, 24);
    double expected[24];
    for (int i = 0; i < 4; i++)
        for (int j = 0; j < 2; j++)
            for (int k = 0; k < 3; k++)
                expected[(i * 2 + j) * 3 + k] = 12 * j + 4 * k + i;
    assert_floats(out, expected, 24, 0);
    fixture_free(f);
}

/* split along 1 into [1, 2], then concat the parts swapped: [[1, 2, 0], [4, 5, 3]]. */
static void test_split_then_concat(void **state) {
    fixture *f = fixture_new();
    declare_inputs(f);
    ir_value_id x = weight(f, "f32[2, 3]", iota23);
    uint32_t s = ir_append_op(&f->m, IR_OP_SPLIT, &x, 1, 2, SMELT_NO_LOC);
    assert_true(ir_op_set_int(&f->m, s, "axis", 1));
    set_ints(f, s, "sizes", (const int64_t[]){1, 2}, 2);
    uint32_t c = op2(f, IR_OP_CONCAT, ir_op_result(&f->m, s, 1), ir_op_result(&f->m, s, 0));
    assert_true(ir_op_set_int(&f->m, c, "axis", -1));
    output(f, result(f, c), "logits");
    create(f);
    float out[6];
    step_once(f, out, 6);
    assert_floats(out, (const double[]){1, 2, 0, 4, 5, 3}, 6, 0);
    fixture_free(f);
}

/* Three operands along axis 0: [2, 3] + [1, 3] + [2, 3] -> [5, 3]. */
static void test_concat_three_along_axis_0(void **state) {
    fixture *f = fixture_new();
    declare_inputs(f);
    static const float middle[] = {9, 9, 9};
    ir_value_id parts[] = {weight(f, "f32[2, 3]", iota23), weight(f, "f32[1, 3]", middle),
                           weight(f, "f32[2, 3]", x23)};
    uint32_t c = append(f, IR_OP_CONCAT, parts, 3);
    assert_true(ir_op_set_int(&f->m, c, "axis", 0));
    output(f, result(f, c), "logits");
    create(f);
    float out[15];
    step_once(f, out, 15);
    assert_floats(out, (const double[]){0, 1, 2, 3, 4, 5, 9, 9, 9, 1, 2, 3, 4, 5, 6}, 15, 0);
    fixture_free(f);
}

static void run_slice(int64_t axis, int64_t start, int64_t end, float *out, uint64_t count) {
    fixture *f = fixture_new();
    declare_inputs(f);
    uint32_t s = op1(f, IR_OP_SLICE, weight(f, "f32[2, 3]", iota23));
    assert_true(ir_op_set_int(&f->m, s, "axis", axis));
    assert_true(ir_op_set_int(&f->m, s, "start", start));
    assert_true(ir_op_set_int(&f->m, s, "end", end));
    output(f, result(f, s), "logits");
    create(f);
    step_once(f, out, count);
    fixture_free(f);
}

static void test_slice(void **state) {
    float out[4];
    run_slice(1, 1, 3, out, 4);
    assert_floats(out, (const double[]){1, 2, 4, 5}, 4, 0);
    run_slice(0, 1, 2, out, 3);
    assert_floats(out, (const double[]){3, 4, 5}, 3, 0);
}

/* reshape keeps the row-major data; the token dim is bound per step. */
static void test_reshape(void **state) {
    fixture *f = fixture_new();
    declare_inputs(f);
    ir_value_id x = embedding(f, weight(f, "f32[2, 3]", iota23), f->ids); /* [tokens, 3] */
    ir_value_id y = reshape(f, reshape(f, x, "f32[3, tokens]"), "f32[tokens, 3, 1]");
    output(f, y, "logits");
    create(f);
    assert_int_equal(ref_model_output_count(f->r, 2), 6);
    float out[6];
    step(f, (const int32_t[]){1, 0}, (const int32_t[]){0, 1}, 2, out, 6);
    assert_floats(out, (const double[]){3, 4, 5, 0, 1, 2}, 6, 0);
    fixture_free(f);
}

/* ---- the example models end to end ------------------------------------------------------------ */

/* Random weights for every weight op, the same numbers per op index. */
static bool read_random_weight(void *context, uint32_t op, float *dst, uint64_t count) {
    fill_random(dst, count, op + 1);
    for (uint64_t i = 0; i < count; i++)
        dst[i] *= 0.2f;
    return true;
}

/* Loads an example with a tiny config, runs a prefill of 5 tokens, and a
 * prefill of 4 plus one decoded token: the last rows agree. */
static void run_example(const char *model, const char *config) {
    char model_path[512], config_path[512];
    snprintf(model_path, sizeof model_path, "%s/examples/%s", SMELT_SOURCE_DIR, model);
    snprintf(config_path, sizeof config_path, "%s/examples/configs/%s", SMELT_SOURCE_DIR, config);
    fixture *f = fixture_new();
    ir_module_free(&f->m);
    fe_options options = {.config_path = config_path};
    if (!fe_load_model(model_path, &options, &f->d, &f->m) || !pass_infer_shapes(&f->m, &f->d))
        fail_msg("%s did not load:\n%s", model, log_of(f));
    clock_t start = clock();
    f->r = ref_model_create(&f->m, read_random_weight, NULL, &f->d);
    if (!f->r) fail_msg("%s: create failed:\n%s", model, log_of(f));
    uint64_t vocab = ref_model_vocab(f->r);
    float *full = malloc(5 * vocab * sizeof *full), *part = malloc(5 * vocab * sizeof *part);
    const int32_t ids[] = {1, 7, 3, 9, 2}, pos[] = {0, 1, 2, 3, 4};
    step(f, ids, pos, 5, full, 5 * vocab);
    ref_model_reset(f->r);
    step(f, ids, pos, 4, part, 5 * vocab);
    step(f, ids + 4, pos + 4, 1, part + 4 * vocab, vocab);
    double seconds = (double)(clock() - start) / CLOCKS_PER_SEC;
    double low = INFINITY, high = -INFINITY, worst = 0;
    for (uint64_t i = 0; i < 5 * vocab; i++) {
        assert_true(isfinite(full[i]));
        low = fmin(low, full[i]);
        high = fmax(high, full[i]);
        if (i >= 4 * vocab) worst = fmax(worst, fabs(full[i] - part[i]));
    }
    assert_true(high - low > 1e-3); /* the logits are not constant */
    if (worst > 1e-5 * (high - low)) fail_msg("%s: decode differs from prefill by %g", model, worst);
    printf("# %s: vocab %llu, create + 3 steps in %.1f ms, decode vs prefill %.2g\n", model,
           (unsigned long long)vocab, seconds * 1e3, worst);
    free(full);
    free(part);
    fixture_free(f);
}

static void test_example_llama(void **state) { run_example("llama.smelt", "llama-tiny.json"); }
static void test_example_gpt2(void **state) { run_example("gpt2.smelt", "gpt2-tiny.json"); }
static void test_example_mixtral(void **state) { run_example("mixtral.smelt", "mixtral-tiny.json"); }
static void test_example_qwen3(void **state) { run_example("qwen3.smelt", "qwen3-tiny.json"); }
static void test_example_qwen3_moe(void **state) { run_example("qwen3_moe.smelt", "qwen3-moe-tiny.json"); }
static void test_example_qwen2_moe(void **state) { run_example("qwen2_moe.smelt", "qwen2-moe-tiny.json"); }
static void test_example_olmo2(void **state) { run_example("olmo2.smelt", "olmo2-tiny.json"); }
static void test_example_gemma2(void **state) { run_example("gemma2.smelt", "gemma2-tiny.json"); }
static void test_example_gemma3(void **state) { run_example("gemma3.smelt", "gemma3-tiny.json"); }

/* ---- errors -------------------------------------------------------------------------------------- */

static void test_position_beyond_max_seq(void **state) {
    static const float q[] = {1, 1}, k[] = {1, 1}, v[] = {1, 1};
    attention_case c = {"f32[2, 1]",
                        "f32[2, 1]",
                        "f32[2, 1]",
                        "f32[tokens, 1, 1]",
                        "f32[tokens, 1, 1]",
                        "f32[tokens, 1, 1]",
                        q,
                        k,
                        v,
                        1.0,
                        4,
                        0,
                        true};
    fixture *f = attention_model(&c);
    float out[2];
    assert_false(ref_model_step(f->r, (const int32_t[]){0, 1}, (const int32_t[]){3, 4}, 2, out, 2, &f->d));
    assert_log_contains(
        f, "attention: position 4 of token 1 is outside the KV cache, expected 0 to 3 (max_seq 4)");
    assert_false(ref_model_step(f->r, (const int32_t[]){0}, (const int32_t[]){-1}, 1, out, 1, &f->d));
    assert_log_contains(f, "position -1 of token 0");
    /* The model is still usable. */
    ref_model_reset(f->r);
    step(f, (const int32_t[]){0}, (const int32_t[]){3}, 1, out, 1);
    assert_floats(out, (const double[]){1}, 1, 1e-6);
    fixture_free(f);
}

static void test_id_outside_the_embedding_table(void **state) {
    fixture *f = fixture_new();
    declare_inputs(f);
    output(f, embedding(f, weight(f, "f32[2, 3]", iota23), f->ids), "logits");
    create(f);
    float out[6];
    assert_false(ref_model_step(f->r, (const int32_t[]){0, 2}, (const int32_t[]){0, 1}, 2, out, 6, &f->d));
    assert_log_contains(f,
                        "embedding: token id 2 (index 1 of the ids) is outside the table, which has 2 rows");
    assert_false(ref_model_step(f->r, (const int32_t[]){-5}, (const int32_t[]){0}, 1, out, 6, &f->d));
    assert_log_contains(f, "token id -5 (index 0 of the ids)");
    fixture_free(f);
}

static void test_missing_ids_input(void **state) {
    fixture *f = fixture_new();
    f->pos = declare(f, IR_OP_INPUT, "pos", "i32[tokens]");
    output(f, result(f, op1(f, IR_OP_SILU, weight(f, "f32[3]", iota23))), "logits");
    assert_null(try_create(f));
    assert_log_contains(f, "module 'test' has no input 'ids'");
    fixture_free(f);
}

static void test_missing_logits_and_extra_input(void **state) {
    fixture *f = fixture_new();
    declare_inputs(f);
    declare(f, IR_OP_INPUT, "mask", "i32[tokens]");
    output(f, weight(f, "f32[3]", iota23), "hidden");
    assert_null(try_create(f));
    assert_log_contains(f, "input 'mask': the reference backend takes only the inputs 'ids' and 'pos'");
    assert_log_contains(f, "has no output 'logits'");
    fixture_free(f);
}

static void test_other_symbol_is_refused(void **state) {
    fixture *f = fixture_new();
    ir_add_symbol(&f->m, "batch", 4, SMELT_NO_LOC);
    declare_inputs(f);
    output(f, result(f, op1(f, IR_OP_SILU, weight(f, "f32[batch, 2]", iota23))), "logits");
    assert_null(try_create(f));
    assert_log_contains(
        f, "weight: the reference backend can only bind the token dim 'tokens', found the symbol 'batch'");
    assert_log_contains(f, "silu: the reference backend can only bind the token dim");
    fixture_free(f);
}

static void test_step_arguments_are_checked(void **state) {
    fixture *f = fixture_new();
    declare_inputs(f);
    output(f, embedding(f, weight(f, "f32[2, 3]", iota23), f->ids), "logits");
    create(f);
    int32_t ids[TOKEN_BOUND + 1] = {0}, pos[TOKEN_BOUND + 1] = {0};
    float out[3 * (TOKEN_BOUND + 1)];
    assert_false(ref_model_step(f->r, ids, pos, TOKEN_BOUND + 1, out, sizeof out / sizeof *out, &f->d));
    assert_log_contains(f, "a step takes 1 to 16 tokens (the bound of 'tokens'), found 17");
    assert_false(ref_model_step(f->r, ids, pos, 0, out, 3, &f->d));
    assert_log_contains(f, "found 0");
    assert_false(ref_model_step(f->r, ids, pos, 2, out, 5, &f->d));
    assert_log_contains(f, "output 'logits' of 2 tokens needs 6 floats, but the buffer holds 5");
    assert_int_equal(ref_model_output_count(f->r, TOKEN_BOUND + 1), 0);
    fixture_free(f);
}

static void test_weight_reader_failure(void **state) {
    fixture *f = fixture_new();
    declare_inputs(f);
    output(f, embedding(f, weight(f, "f32[2, 3]", iota23), f->ids), "logits");
    f->reader_fails = true;
    assert_null(try_create(f));
    assert_log_contains(f, "weight 'w0': its data (6 floats) could not be read");
    fixture_free(f);
}

static void test_untyped_module_is_refused(void **state) {
    fixture *f = fixture_new();
    declare_inputs(f);
    output(f, result(f, op1(f, IR_OP_SILU, weight(f, "f32[3]", iota23))), "logits");
    f->r = ref_model_create(&f->m, read_weight, f, &f->d); /* infer-shapes not run */
    assert_null(f->r);
    assert_log_contains(f, "silu: result 0 has no type; run infer-shapes");
    fixture_free(f);
}

/* A KV cache too large to exist is an error, not a crash. */
static void test_huge_max_seq_is_an_error(void **state) {
    static const float q[] = {1}, k[] = {1}, v[] = {1};
    fixture *f = fixture_new();
    declare_inputs(f);
    ir_value_id qv = reshape(f, embedding(f, weight(f, "f32[1, 1]", q), f->ids), "f32[tokens, 1, 1]");
    ir_value_id kv = reshape(f, embedding(f, weight(f, "f32[1, 1]", k), f->ids), "f32[tokens, 1, 1]");
    ir_value_id vv = reshape(f, embedding(f, weight(f, "f32[1, 1]", v), f->ids), "f32[tokens, 1, 1]");
    uint32_t a = append(f, IR_OP_ATTENTION, (ir_value_id[]){qv, kv, vv, f->pos}, 4);
    assert_true(ir_op_set_float(&f->m, a, "scale", 1.0));
    assert_true(ir_op_set_int(&f->m, a, "max_seq", INT64_MAX));
    output(f, result(f, a), "logits");
    assert_null(try_create(f));
    assert_log_contains(
        f, "attention: a KV cache of max_seq 9223372036854775807 positions does not fit in memory");
    fixture_free(f);
}

/* Integer values reach only ops that take them (layout ops, argmax, the
 * ids and positions of embedding, rope and attention). */
static void test_integer_data_in_a_float_op(void **state) {
    fixture *f = fixture_new();
    declare_inputs(f);
    output(f, result(f, op2(f, IR_OP_ADD, f->ids, f->pos)), "logits");
    assert_null(try_create(f));
    assert_log_contains(
        f, "add: the reference backend computes only on float values, but operand 0 is i32[tokens]");
    assert_log_contains(f, "output 'logits' must be float with a constant last dim, found i32[tokens]");
    fixture_free(f);
}

/* i64 ids and positions are read from the same int32 arrays. */
static void test_i64_inputs(void **state) {
    fixture *f = fixture_new();
    f->ids = declare(f, IR_OP_INPUT, "ids", "i64[tokens]");
    f->pos = declare(f, IR_OP_INPUT, "pos", "i64[tokens]");
    output(f, embedding(f, weight(f, "f32[2, 3]", iota23), f->ids), "logits");
    create(f);
    float out[3];
    step(f, (const int32_t[]){1}, (const int32_t[]){0}, 1, out, 3);
    assert_floats(out, (const double[]){3, 4, 5}, 3, 0);
    fixture_free(f);
}

static void test_null_step_arguments(void **state) {
    fixture *f = fixture_new();
    declare_inputs(f);
    output(f, embedding(f, weight(f, "f32[2, 3]", iota23), f->ids), "logits");
    create(f);
    float out[3];
    assert_false(ref_model_step(f->r, NULL, (const int32_t[]){0}, 1, out, 3, &f->d));
    assert_log_contains(f, "a step needs ids, positions and a logits buffer, found a NULL ids");
    assert_false(ref_model_step(f->r, (const int32_t[]){0}, (const int32_t[]){0}, 1, NULL, 3, &f->d));
    assert_log_contains(f, "found a NULL logits");
    fixture_free(f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matmul_out_in_with_bias),
        cmocka_unit_test(test_matmul_in_out_with_bias),
        cmocka_unit_test(test_matmul_over_tokens),
        cmocka_unit_test(test_w8a8_int8_per_token),
        cmocka_unit_test(test_w8a8_fp8_per_token),
        cmocka_unit_test(test_w8a8_fp8_static_scale),
        cmocka_unit_test(test_w8a8_through_quantize_codes),
        cmocka_unit_test(test_quantize_e4m3_per_token),
        cmocka_unit_test(test_quantize_e4m3_static_scale_saturates),
        cmocka_unit_test(test_quantize_int8),
        cmocka_unit_test(test_embedding_int8_table),
        cmocka_unit_test(test_add_broadcasts_a_row),
        cmocka_unit_test(test_mul_broadcasts_a_column),
        cmocka_unit_test(test_add_broadcasts_both_sides),
        cmocka_unit_test(test_scalar_constant_broadcasts),
        cmocka_unit_test(test_rms_norm),
        cmocka_unit_test(test_rms_norm_offset),
        cmocka_unit_test(test_attention_softcap),
        cmocka_unit_test(test_tanh_and_sigmoid),
        cmocka_unit_test(test_layer_norm),
        cmocka_unit_test(test_layer_norm_without_bias),
        cmocka_unit_test(test_rope_neox),
        cmocka_unit_test(test_rope_interleaved),
        cmocka_unit_test(test_rope_partial_rotary_dim),
        cmocka_unit_test(test_attention_one_head),
        cmocka_unit_test(test_attention_grouped_query_heads),
        cmocka_unit_test(test_attention_sliding_window),
        cmocka_unit_test(test_attention_not_causal),
        cmocka_unit_test(test_attention_reset),
        cmocka_unit_test(test_incremental_decoding_matches_prefill),
        cmocka_unit_test(test_moe_top2_renormalised),
        cmocka_unit_test(test_moe_top2_unnormalised),
        cmocka_unit_test(test_moe_ties_pick_lower_index),
        cmocka_unit_test(test_gelu_both_kinds),
        cmocka_unit_test(test_silu),
        cmocka_unit_test(test_softmax_axis_0),
        cmocka_unit_test(test_argmax_first_maximum),
        cmocka_unit_test(test_transpose_2d),
        cmocka_unit_test(test_transpose_3d),
        cmocka_unit_test(test_split_then_concat),
        cmocka_unit_test(test_concat_three_along_axis_0),
        cmocka_unit_test(test_slice),
        cmocka_unit_test(test_reshape),
        cmocka_unit_test(test_example_llama),
        cmocka_unit_test(test_example_gpt2),
        cmocka_unit_test(test_example_mixtral),
        cmocka_unit_test(test_example_qwen3),
        cmocka_unit_test(test_example_qwen3_moe),
        cmocka_unit_test(test_example_qwen2_moe),
        cmocka_unit_test(test_example_olmo2),
        cmocka_unit_test(test_example_gemma2),
        cmocka_unit_test(test_example_gemma3),
        cmocka_unit_test(test_position_beyond_max_seq),
        cmocka_unit_test(test_id_outside_the_embedding_table),
        cmocka_unit_test(test_missing_ids_input),
        cmocka_unit_test(test_missing_logits_and_extra_input),
        cmocka_unit_test(test_other_symbol_is_refused),
        cmocka_unit_test(test_step_arguments_are_checked),
        cmocka_unit_test(test_weight_reader_failure),
        cmocka_unit_test(test_untyped_module_is_refused),
        cmocka_unit_test(test_huge_max_seq_is_an_error),
        cmocka_unit_test(test_integer_data_in_a_float_op),
        cmocka_unit_test(test_i64_inputs),
        cmocka_unit_test(test_null_step_arguments),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
