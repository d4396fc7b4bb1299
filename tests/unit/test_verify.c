/* test_verify.c - ir_verify: one module per kind of violation, each checked
 * for its message; valid modules (with and without inferred types) pass. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "ir.h"
#include "quant.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct fixture {
    ir_module m;
    diag_engine d;
    FILE *log;
    char *log_text;
    size_t log_size;
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    ir_module_init(&f->m, "test");
    f->log = open_memstream(&f->log_text, &f->log_size);
    diag_init(&f->d, f->log);
    f->d.max_errors = 0;
    ir_add_symbol(&f->m, "tokens", 8192, SMELT_NO_LOC);
    *state = f;
    return 0;
}

static int teardown(void **state) {
    fixture *f = *state;
    diag_free(&f->d);
    fclose(f->log);
    free(f->log_text);
    ir_module_free(&f->m);
    free(f);
    return 0;
}

static const char *log_of(fixture *f) {
    fflush(f->log);
    return f->log_text ? f->log_text : "";
}

static ir_type type(smelt_dtype dtype, unsigned rank, const ir_dim *dims) {
    ir_type t = {.dtype = dtype, .rank = (uint8_t)rank};
    for (unsigned i = 0; i < rank && i < IR_MAX_DIMS; i++)
        t.dims[i] = dims[i];
    return t;
}
#define TYPE(dtype, ...)                                                                                     \
    type(SMELT_DTYPE_##dtype, sizeof((ir_dim[]){__VA_ARGS__}) / sizeof(ir_dim), (ir_dim[]){__VA_ARGS__})
#define C(n) ir_dim_const(n)
#define TOKENS ir_dim_symbol(0)

static uint32_t append(fixture *f, ir_op_kind kind, const ir_value_id *operands, uint32_t count) {
    uint32_t op = ir_append_op(&f->m, kind, operands, count, UINT32_MAX, SMELT_NO_LOC);
    ir_op_fill_defaults(&f->m, op);
    return op;
}

static ir_value_id result(fixture *f, uint32_t op) { return ir_op_result(&f->m, op, 0); }

static ir_value_id declare(fixture *f, ir_op_kind kind, const char *name, ir_type t) {
    uint32_t op = append(f, kind, NULL, 0);
    ir_op_set_string(&f->m, op, "name", name);
    f->m.values[result(f, op)].type = t;
    return result(f, op);
}

static uint32_t output(fixture *f, ir_value_id x, const char *name) {
    uint32_t op = append(f, IR_OP_OUTPUT, &x, 1);
    ir_op_set_string(&f->m, op, "name", name);
    return op;
}

/* A small valid module: x -> rms_norm -> matmul -> output. */
static void build_valid(fixture *f, bool typed) {
    ir_value_id x = declare(f, IR_OP_INPUT, "x", TYPE(F32, TOKENS, C(64)));
    ir_value_id ln = declare(f, IR_OP_WEIGHT, "ln", TYPE(F32, C(64)));
    ir_value_id w = declare(f, IR_OP_WEIGHT, "w", TYPE(F32, C(128), C(64)));
    uint32_t norm = append(f, IR_OP_RMS_NORM, (ir_value_id[]){x, ln}, 2);
    ir_op_set_float(&f->m, norm, "eps", 1e-5);
    uint32_t mm = append(f, IR_OP_MATMUL, (ir_value_id[]){result(f, norm), w}, 2);
    output(f, result(f, mm), "logits");
    if (typed) {
        f->m.values[result(f, norm)].type = TYPE(F32, TOKENS, C(64));
        f->m.values[result(f, mm)].type = TYPE(F32, TOKENS, C(128));
    }
}

static void expect_error(fixture *f, const char *message) {
    assert_false(ir_verify(&f->m, &f->d));
    if (!strstr(log_of(f), message)) fail_msg("expected '%s' in:\n%s", message, log_of(f));
}

/* ---- valid modules ---------------------------------------------------------- */

static void test_valid_module_passes(void **state) {
    fixture *f = *state;
    build_valid(f, true);
    assert_true(ir_verify(&f->m, &f->d));
    assert_string_equal(log_of(f), "");
}

static void test_unknown_result_types_are_allowed(void **state) {
    fixture *f = *state;
    build_valid(f, false);
    assert_true(ir_verify(&f->m, &f->d));
    assert_string_equal(log_of(f), "");
}

/* ---- operands and results -------------------------------------------------------- */

static void test_operand_that_does_not_exist(void **state) {
    fixture *f = *state;
    build_valid(f, false);
    f->m.ops[3].operands[1] = 999;
    expect_error(f, "smelt: error: rms_norm: operand 1 refers to a value that does not exist");
}

static void test_operand_used_before_its_definition(void **state) {
    fixture *f = *state;
    ir_value_id x = declare(f, IR_OP_INPUT, "x", TYPE(F32, C(4)));
    ir_value_id y = result(f, append(f, IR_OP_SILU, &x, 1));
    assert_int_equal(ir_insert_op(&f->m, 0, IR_OP_SILU, &y, 1, UINT32_MAX, SMELT_NO_LOC), 0);
    expect_error(f, "silu: operand 0 is used before its definition");
}

static void test_operand_of_a_removed_op(void **state) {
    fixture *f = *state;
    ir_value_id x = declare(f, IR_OP_INPUT, "x", TYPE(F32, C(4)));
    uint32_t removed = append(f, IR_OP_SILU, &x, 1);
    output(f, result(f, removed), "y");
    f->m.ops[removed].dead = true;
    expect_error(f, "output: operand 0 uses a value whose defining op was removed");
}

static void test_operand_counts(void **state) {
    fixture *f = *state;
    ir_value_id x = declare(f, IR_OP_INPUT, "x", TYPE(F32, C(4)));
    uint32_t out = append(f, IR_OP_OUTPUT, NULL, 0);
    ir_op_set_string(&f->m, out, "name", "y");
    append(f, IR_OP_MATMUL, (ir_value_id[]){x, x, x, x, x, x}, 6);
    expect_error(f, "output: expected 1 operand, found 0");
    assert_non_null(strstr(log_of(f), "matmul: expected 2 to 5 operands, found 6"));
}

static void test_result_counts(void **state) {
    fixture *f = *state;
    ir_value_id x = declare(f, IR_OP_INPUT, "x", TYPE(F32, C(12)));
    ir_append_op(&f->m, IR_OP_SILU, &x, 1, 2, SMELT_NO_LOC);
    uint32_t split = ir_append_op(&f->m, IR_OP_SPLIT, &x, 1, 2, SMELT_NO_LOC);
    ir_op_set_int(&f->m, split, "axis", 0);
    ir_op_set_attr(&f->m, split, "sizes",
                   &(ir_attr){.kind = IR_ATTR_INTS, .as.ints = {3, (int64_t[]){4, 4, 4}}});
    expect_error(f, "silu: expected 1 result, found 2");
    assert_non_null(strstr(log_of(f), "split: expected 3 results (one per entry of 'sizes'), found 2"));
}

static void test_result_defined_twice(void **state) {
    fixture *f = *state;
    ir_value_id x = declare(f, IR_OP_INPUT, "x", TYPE(F32, C(4)));
    uint32_t a = append(f, IR_OP_SILU, &x, 1);
    uint32_t b = append(f, IR_OP_SILU, &x, 1);
    f->m.ops[b].results[0] = result(f, a);
    expect_error(f, "silu: result 0 is a value defined twice");
}

static void test_invalid_op_kind(void **state) {
    fixture *f = *state;
    uint32_t op = append(f, IR_OP_INPUT, NULL, 0);
    f->m.ops[op].kind = (ir_op_kind)IR_OP_COUNT;
    expect_error(f, "op 0 has no valid kind");
}

/* ---- attributes --------------------------------------------------------------- */

static void test_missing_required_attribute(void **state) {
    fixture *f = *state;
    ir_value_id x = declare(f, IR_OP_INPUT, "x", TYPE(F32, C(4)));
    append(f, IR_OP_RMS_NORM, (ir_value_id[]){x, x}, 2);
    expect_error(f, "rms_norm: missing required attribute 'eps'");
}

static void test_attribute_of_the_wrong_kind(void **state) {
    fixture *f = *state;
    ir_value_id x = declare(f, IR_OP_INPUT, "x", TYPE(F32, C(4)));
    uint32_t op = append(f, IR_OP_SOFTMAX, &x, 1);
    f->m.ops[op].attrs[0] = (ir_attr){.kind = IR_ATTR_STRING, .as.s = "last"};
    expect_error(f, "softmax: attribute 'axis' must be int, found string");
}

static void test_string_attribute_outside_its_choices(void **state) {
    fixture *f = *state;
    build_valid(f, true);
    assert_true(ir_op_set_string(&f->m, 4, "layout", "rows"));
    expect_error(f, "matmul: attribute 'layout' must be one of out_in|in_out, found 'rows'");
}

static void test_shape_attribute_with_a_bad_symbol(void **state) {
    fixture *f = *state;
    ir_value_id x = declare(f, IR_OP_INPUT, "x", TYPE(F32, C(4)));
    uint32_t op = append(f, IR_OP_RESHAPE, &x, 1);
    ir_op_set_attr(&f->m, op, "shape",
                   &(ir_attr){.kind = IR_ATTR_SHAPE, .as.shape = {1, (ir_dim[]){ir_dim_symbol(9)}}});
    expect_error(
        f, "reshape: attribute 'shape': dim 0 refers to symbol 9, which does not exist (the module has 1)");
}

/* ---- types ---------------------------------------------------------------------- */

static void test_declared_type_missing(void **state) {
    fixture *f = *state;
    declare(f, IR_OP_WEIGHT, "w", (ir_type){0});
    expect_error(f, "weight: the declared type is missing");
}

static void test_bad_dims(void **state) {
    fixture *f = *state;
    declare(f, IR_OP_INPUT, "a", TYPE(F32, ir_dim_symbol(7)));
    declare(f, IR_OP_INPUT, "b", TYPE(F32, C(4), C(-3)));
    ir_value_id c = declare(f, IR_OP_INPUT, "c", TYPE(F32, C(1)));
    f->m.values[c].type.rank = 7;
    expect_error(f, "input: result 0: dim 0 refers to symbol 7, which does not exist (the module has 1)");
    assert_non_null(strstr(log_of(f), "input: result 0: dim 1 is -3; constant dims must be >= 0"));
    assert_non_null(strstr(log_of(f), "input: result 0 has rank 7, more than 6"));
}

static void test_element_count_overflow(void **state) {
    fixture *f = *state;
    declare(f, IR_OP_WEIGHT, "w", TYPE(F32, C(4294967296), C(4294967296)));
    expect_error(f, "weight: f32[4294967296, 4294967296] has more than 2^64 elements");
}

static void test_element_count_counts_symbols_at_their_bounds(void **state) {
    fixture *f = *state;
    int32_t huge = ir_add_symbol(&f->m, "huge", INT64_C(1) << 62, SMELT_NO_LOC);
    declare(f, IR_OP_INPUT, "x", TYPE(I8, ir_dim_symbol(huge), C(2))); /* 2^63 elements, 2^63 bytes: fine */
    assert_true(ir_verify(&f->m, &f->d));
    declare(f, IR_OP_INPUT, "y", TYPE(I8, ir_dim_symbol(huge), C(4)));
    expect_error(f, "input: i8[huge, 4] has more than 2^64 elements");
}

static void test_byte_size_overflow(void **state) {
    fixture *f = *state;
    declare(f, IR_OP_WEIGHT, "ok", TYPE(F32, C(INT64_C(1) << 61)));   /* 2^63 bytes */
    declare(f, IR_OP_WEIGHT, "packed", TYPE(I4, C(INT64_MAX), C(2))); /* 2^64 - 2 nibbles: 2^63 - 1 bytes */
    assert_true(ir_verify(&f->m, &f->d));
    declare(f, IR_OP_WEIGHT, "w", TYPE(F32, C(INT64_C(1) << 62)));
    expect_error(f, "weight: f32[4611686018427387904] takes more than 2^64 bytes");
}

static void test_output_names_are_unique(void **state) {
    fixture *f = *state;
    const char source[] = "output logits = x\noutput hidden = x\noutput logits = x\n";
    int32_t file = diag_add_source(&f->d, "m.smelt", source, sizeof source - 1);
    ir_value_id x = declare(f, IR_OP_INPUT, "x", TYPE(F32, C(4)));
    const char *names[] = {"logits", "hidden", "logits"};
    for (uint32_t i = 0; i < 3; i++)
        f->m.ops[output(f, x, names[i])].loc = (smelt_loc){file, i + 1, 8};
    expect_error(f, "m.smelt:3:8: error: output: output name 'logits' is used twice");
    assert_non_null(strstr(log_of(f), "m.smelt:1:8: note: the first output named 'logits' is here"));
    assert_int_equal(f->d.error_count, 1);
}

/* ---- the shape rules, run again --------------------------------------------------- */

static void test_result_type_must_match_the_inferred_one(void **state) {
    fixture *f = *state;
    build_valid(f, true);
    f->m.values[result(f, 4)].type = TYPE(F32, TOKENS, C(64));
    expect_error(f, "matmul: result type f32[tokens, 64] does not match the inferred f32[tokens, 128]");
}

static void test_shape_rule_errors_are_reported(void **state) {
    fixture *f = *state;
    build_valid(f, true);
    f->m.values[2].type = TYPE(F32, C(128), C(96)); /* w */
    expect_error(f, "matmul: inner dims differ: x is f32[tokens, 64] but w is f32[128, 96] (layout out_in)");
}

static void test_every_violation_is_reported(void **state) {
    fixture *f = *state;
    build_valid(f, true);
    assert_true(ir_op_set_string(&f->m, 4, "layout", "rows"));               /* 1 */
    f->m.ops[3].attrs[0].kind = IR_ATTR_NONE;                                /* 2: eps gone */
    output(f, result(f, 4), "logits");                                       /* 3 */
    declare(f, IR_OP_WEIGHT, "huge", TYPE(F32, C(INT64_MAX), C(INT64_MAX))); /* 4 */
    assert_false(ir_verify(&f->m, &f->d));
    assert_int_equal(f->d.error_count, 4);
}

/* ---- W8A8 experts (moe gate_up_act_quant / down_act_quant) ----------------------- */

/* moe over int8 expert stacks (one scale per output channel), typed; the moe op. */
static uint32_t build_int8_moe(fixture *f) {
    ir_value_id x = declare(f, IR_OP_INPUT, "x", TYPE(F32, TOKENS, C(64)));
    ir_value_id router = declare(f, IR_OP_WEIGHT, "router", TYPE(F32, C(4), C(64)));
    const char *names[3] = {"gate.{e}", "up.{e}", "down.{e}"};
    ir_value_id stacks[3];
    for (int i = 0; i < 3; i++) {
        int64_t rows = i == 2 ? 64 : 96, cols = i == 2 ? 96 : 64;
        stacks[i] = declare(f, IR_OP_WEIGHT, names[i], TYPE(I8, C(4), C(rows), C(cols)));
        ir_op_set_string(&f->m, f->m.values[stacks[i]].def_op, "stack", "e");
        quant_format q = {.kind = QUANT_INT8, .method = QUANT_METHOD_RTN, .group = (uint32_t)cols};
        ir_weight_set_quant(&f->m, f->m.values[stacks[i]].def_op, &q);
    }
    uint32_t moe = append(f, IR_OP_MOE, (ir_value_id[]){x, router, stacks[0], stacks[1], stacks[2]}, 5);
    ir_op_set_int(&f->m, moe, "top_k", 2);
    f->m.values[result(f, moe)].type = TYPE(F32, TOKENS, C(64));
    output(f, result(f, moe), "logits");
    return moe;
}

static void test_moe_act_quant_over_int8_experts_passes(void **state) {
    fixture *f = *state;
    uint32_t moe = build_int8_moe(f);
    ir_op_set_string(&f->m, moe, "gate_up_act_quant", "i8");
    ir_op_set_string(&f->m, moe, "down_act_quant", "i8");
    ir_op_set_string(&f->m, moe, "act_scale", "token");
    if (!ir_verify(&f->m, &f->d)) fail_msg("%s", log_of(f));
}

static void test_moe_act_quant_of_another_kind(void **state) {
    fixture *f = *state;
    uint32_t moe = build_int8_moe(f);
    ir_op_set_string(&f->m, moe, "down_act_quant", "f8e4m3");
    ir_op_set_string(&f->m, moe, "act_scale", "token");
    expect_error(f, "moe: down_act_quant = \"f8e4m3\" needs fp8 experts in operand 4, found int8");
}

static void test_moe_act_quant_without_its_scale_rule(void **state) {
    fixture *f = *state;
    uint32_t moe = build_int8_moe(f);
    ir_op_set_string(&f->m, moe, "gate_up_act_quant", "i8");
    expect_error(f, "moe: a moe's quantized activations need act_scale \"token\"");
}

static void test_moe_act_scale_without_act_quant(void **state) {
    fixture *f = *state;
    uint32_t moe = build_int8_moe(f);
    ir_op_set_string(&f->m, moe, "act_scale", "token");
    expect_error(f, "moe: act_scale without gate_up_act_quant or down_act_quant");
}

/* ---- quantize and act_codes matmuls (ops.def) ----------------------------------- */

typedef struct codes_case {
    ir_value_id x, w, codes, scales;
    uint32_t quantize, matmul;
} codes_case;

/* %c, %s = quantize(%x) {dtype = "f8e4m3"}; matmul(%x, %w, %c, %s) {act_quant
 * = "f8e4m3", act_scale = "token", act_codes = true} over an E4M3 weight with
 * one scale per output channel (quantized with `format`'s tweaks), typed. */
static codes_case build_codes_case(fixture *f, quant_format format) {
    codes_case c;
    c.x = declare(f, IR_OP_INPUT, "x", TYPE(F32, TOKENS, C(64)));
    c.w = declare(f, IR_OP_WEIGHT, "w", TYPE(F8E4M3, C(16), C(64)));
    if (!format.kind) format.kind = QUANT_FP8;
    if (!format.group) format.group = 64;
    format.method = format.has_column_scale ? QUANT_METHOD_SMOOTH : QUANT_METHOD_RTN;
    ir_weight_set_quant(&f->m, f->m.values[c.w].def_op, &format);
    if (format.kind == QUANT_INT8) f->m.values[c.w].type.dtype = SMELT_DTYPE_I8;
    c.quantize = append(f, IR_OP_QUANTIZE, &c.x, 1);
    ir_op_set_string(&f->m, c.quantize, "dtype", "f8e4m3");
    c.codes = ir_op_result(&f->m, c.quantize, 0);
    c.scales = ir_op_result(&f->m, c.quantize, 1);
    f->m.values[c.codes].type = TYPE(F8E4M3, TOKENS, C(64));
    f->m.values[c.scales].type = TYPE(F32, TOKENS);
    c.matmul = append(f, IR_OP_MATMUL, (ir_value_id[]){c.x, c.w, c.codes, c.scales}, 4);
    ir_op_set_string(&f->m, c.matmul, "act_quant", "f8e4m3");
    ir_op_set_string(&f->m, c.matmul, "act_scale", "token");
    ir_op_set_bool(&f->m, c.matmul, "act_codes", true);
    f->m.values[result(f, c.matmul)].type = TYPE(F32, TOKENS, C(16));
    output(f, result(f, c.matmul), "logits");
    return c;
}

static void test_act_codes_matmul_passes(void **state) {
    fixture *f = *state;
    build_codes_case(f, (quant_format){0});
    if (!ir_verify(&f->m, &f->d)) fail_msg("%s", log_of(f));
}

/* After precision a float dtype may stand for another (ir_type_matches):
 * the codes' and scales' dtypes are the quantize rule's own checks. */
static void test_quantize_codes_of_another_dtype(void **state) {
    fixture *f = *state;
    codes_case c = build_codes_case(f, (quant_format){0});
    f->m.precision = "bf16";
    f->m.values[c.codes].type.dtype = SMELT_DTYPE_BF16;
    expect_error(f, "quantize: the codes (result 0) of dtype \"f8e4m3\" are f8e4m3, found bf16[tokens, 64]");
}

static void test_quantize_scales_not_f32(void **state) {
    fixture *f = *state;
    codes_case c = build_codes_case(f, (quant_format){0});
    f->m.precision = "bf16";
    f->m.values[c.scales].type.dtype = SMELT_DTYPE_BF16;
    expect_error(f, "quantize: the scales (result 1) are f32, one per row of x, found bf16[tokens]");
}

static void test_quantize_tensor_scale_needs_a_value(void **state) {
    fixture *f = *state;
    codes_case c = build_codes_case(f, (quant_format){0});
    ir_op_set_string(&f->m, c.quantize, "act_scale", "tensor");
    expect_error(f, "quantize: act_scale \"tensor\" needs act_scale_value > 0 (the static scale), found 0");
}

static void test_quantize_token_scale_has_no_value(void **state) {
    fixture *f = *state;
    codes_case c = build_codes_case(f, (quant_format){0});
    ir_op_set_float(&f->m, c.quantize, "act_scale_value", 0.5);
    expect_error(f, "quantize: act_scale \"token\" is computed at run time: act_scale_value must be 0");
}

static void test_act_codes_from_two_quantizes(void **state) {
    fixture *f = *state;
    codes_case c = build_codes_case(f, (quant_format){0});
    /* a second quantize of x, before the matmul, gives the scales */
    uint32_t other = ir_insert_op(&f->m, c.matmul, IR_OP_QUANTIZE, &c.x, 1, 2, SMELT_NO_LOC);
    ir_op_fill_defaults(&f->m, other);
    ir_op_set_string(&f->m, other, "dtype", "f8e4m3");
    f->m.values[ir_op_result(&f->m, other, 0)].type = TYPE(F8E4M3, TOKENS, C(64));
    f->m.values[ir_op_result(&f->m, other, 1)].type = TYPE(F32, TOKENS);
    f->m.ops[c.matmul + 1].operands[3] = ir_op_result(&f->m, other, 1);
    expect_error(f,
                 "matmul: act_codes: operands 2 and 3 must be the codes and the scales (results 0 and 1) of "
                 "one quantize op");
}

static void test_act_codes_of_another_value(void **state) {
    fixture *f = *state;
    codes_case c = build_codes_case(f, (quant_format){0});
    /* the quantize reads y, another [tokens, 64] input */
    uint32_t y = ir_insert_op(&f->m, c.quantize, IR_OP_INPUT, NULL, 0, 1, SMELT_NO_LOC);
    ir_op_fill_defaults(&f->m, y);
    ir_op_set_string(&f->m, y, "name", "y");
    f->m.values[ir_op_result(&f->m, y, 0)].type = TYPE(F32, TOKENS, C(64));
    f->m.ops[c.quantize + 1].operands[0] = ir_op_result(&f->m, y, 0);
    expect_error(f, "matmul: act_codes: the quantize op reads another value than the matmul's x (operand 0)");
}

static void test_act_codes_quantized_otherwise(void **state) {
    fixture *f = *state;
    codes_case c = build_codes_case(f, (quant_format){0});
    ir_op_set_string(&f->m, c.quantize, "act_scale", "tensor");
    ir_op_set_float(&f->m, c.quantize, "act_scale_value", 0.25);
    expect_error(
        f, "matmul: act_codes: the quantize op (dtype \"f8e4m3\", act_scale \"tensor\", act_scale_value "
           "0.25) does not quantize as the matmul does (act_quant \"f8e4m3\", act_scale \"token\", "
           "act_scale_value 0)");
}

static void test_act_codes_of_another_dtype(void **state) {
    fixture *f = *state;
    codes_case c = build_codes_case(f, (quant_format){0});
    ir_op_set_string(&f->m, c.quantize, "dtype", "i8");
    f->m.values[c.codes].type.dtype = SMELT_DTYPE_I8;
    expect_error(f,
                 "matmul: act_codes: the quantize op (dtype \"i8\", act_scale \"token\", act_scale_value 0) "
                 "does not quantize as the matmul does (act_quant \"f8e4m3\"");
}

static void test_act_codes_over_a_weight_of_another_kind(void **state) {
    fixture *f = *state;
    build_codes_case(f, (quant_format){.kind = QUANT_INT8});
    expect_error(f, "matmul: act_quant = \"f8e4m3\" needs an fp8 weight, found int8");
}

static void test_act_codes_over_grouped_weight_scales(void **state) {
    fixture *f = *state;
    build_codes_case(f, (quant_format){.group = 32});
    expect_error(f, "matmul: act_quant needs one weight scale per output channel (group = K");
}

static void test_act_codes_over_column_scales(void **state) {
    fixture *f = *state;
    build_codes_case(f, (quant_format){.has_column_scale = true});
    expect_error(f, "matmul: act_codes needs a weight without column scales");
}

static void test_act_codes_without_act_quant(void **state) {
    fixture *f = *state;
    codes_case c = build_codes_case(f, (quant_format){0});
    ir_op_set_string(&f->m, c.matmul, "act_quant", "none");
    ir_op_set_string(&f->m, c.matmul, "act_scale", "none");
    expect_error(f, "matmul: act_codes without act_quant: there are no codes of x to read");
}

static void test_act_codes_without_the_codes(void **state) {
    fixture *f = *state;
    codes_case c = build_codes_case(f, (quant_format){0});
    f->m.ops[c.matmul].operand_count = 2;
    expect_error(
        f, "matmul: act_codes needs the codes and scales of x as its last two operands, found 2 operands");
}

int main(void) {
    const struct CMUnitTest tests[] = {
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
        T(test_valid_module_passes),
        T(test_unknown_result_types_are_allowed),
        T(test_operand_that_does_not_exist),
        T(test_operand_used_before_its_definition),
        T(test_operand_of_a_removed_op),
        T(test_operand_counts),
        T(test_result_counts),
        T(test_result_defined_twice),
        T(test_invalid_op_kind),
        T(test_missing_required_attribute),
        T(test_attribute_of_the_wrong_kind),
        T(test_string_attribute_outside_its_choices),
        T(test_shape_attribute_with_a_bad_symbol),
        T(test_declared_type_missing),
        T(test_bad_dims),
        T(test_element_count_overflow),
        T(test_element_count_counts_symbols_at_their_bounds),
        T(test_byte_size_overflow),
        T(test_output_names_are_unique),
        T(test_result_type_must_match_the_inferred_one),
        T(test_shape_rule_errors_are_reported),
        T(test_every_violation_is_reported),
        T(test_moe_act_quant_over_int8_experts_passes),
        T(test_moe_act_quant_of_another_kind),
        T(test_moe_act_quant_without_its_scale_rule),
        T(test_moe_act_scale_without_act_quant),
        T(test_act_codes_matmul_passes),
        T(test_quantize_codes_of_another_dtype),
        T(test_quantize_scales_not_f32),
        T(test_quantize_tensor_scale_needs_a_value),
        T(test_quantize_token_scale_has_no_value),
        T(test_act_codes_from_two_quantizes),
        T(test_act_codes_of_another_value),
        T(test_act_codes_quantized_otherwise),
        T(test_act_codes_of_another_dtype),
        T(test_act_codes_over_a_weight_of_another_kind),
        T(test_act_codes_over_grouped_weight_scales),
        T(test_act_codes_over_column_scales),
        T(test_act_codes_without_act_quant),
        T(test_act_codes_without_the_codes),
#undef T
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
