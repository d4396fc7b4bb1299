/* test_emit_moe_quant.c - the MoE kernels (codegen/emit_moe.c) on quantized
 * experts: each expert of the [E, N, K] gate, up and down stacks an [N, K]
 * matrix in quant/quant.h's packed layout (int4 with zero points in groups,
 * int8 and E4M3 per output channel), compiled by NVRTC for sm_80 and sm_90
 * and run on the host simulator against the reference on the same experts
 * dequantized as quant_value defines, with f32 activations so that the
 * tolerance is the f32 moe kernels' own. Both paths of the grouped GEMMs —
 * K a multiple of the 128-bit load of codes, and K that is not (one code at
 * a time) — with balanced routing, with every token routed to one expert
 * (the others idle, five tiles of tokens for that one) and with more slots
 * than one gather window. int8 and fp8 are W8A8 (passes/precision.c): the
 * moe quantizes x for gate and up and the hidden rows for down per row, as
 * the reference does (ops.def, gate_up_act_quant / down_act_quant), int8
 * against SmoothQuant's column scales (random here: fill_operand); their
 * weight-only variants (--act-quant none) read the codes dequantized.
 * fp8 with static scales (act_scale tensor: one scale for x, another for
 * the hidden rows, every expert's) codes with them as constants. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "emit_harness.c"

typedef struct quant_case {
    const char *preset;
    int64_t group_size;
    const char *act_quant; /* int8, fp8: NULL W8A8 per token, "none" weight-only (W8A16) */
} quant_case;

static const quant_case presets[] = {{"int4-rtn", 32, NULL}, {"int4-rtn", 128, NULL}, {"int8", 0, NULL},
                                     {"fp8", 0, NULL},       {"int8", 0, "none"},     {"fp8", 0, "none"}};
enum { PRESET_COUNT = sizeof presets / sizeof presets[0] };

/* moe(x[T, D], router[E, D], gate[E, F, D], up[E, F, D], down[E, D, F]) under preset q. */
static uint32_t quant_moe(emit_case **out, const quant_case *q, int64_t experts, int64_t dim, int64_t ffn,
                          int64_t top_k, bool normalize, const char *activations) {
    emit_case *c = case_new(q->preset);
    c->activations = activations;
    c->group_size = q->group_size;
    c->act_quant = q->act_quant;
    uint32_t op = moe_op_dims(c, experts, dim, ffn, top_k, normalize);
    case_infer(c);
    *out = c;
    return op;
}

/* The moe's activation quantization is the preset's: W8A8 int8 and fp8
 * quantize both inputs (i8, f8e4m3) per token, every other case none. */
static void assert_act_quant(emit_case *c, uint32_t op, const quant_case *q) {
    bool w8a8 = !q->act_quant && (strcmp(q->preset, "int8") == 0 || strcmp(q->preset, "fp8") == 0);
    const char *kind = !w8a8 ? "none" : strcmp(q->preset, "int8") == 0 ? "i8" : "f8e4m3";
    assert_string_equal(ir_op_string(&c->m, op, "gate_up_act_quant"), kind);
    assert_string_equal(ir_op_string(&c->m, op, "down_act_quant"), kind);
    assert_string_equal(ir_op_string(&c->m, op, "act_scale"), w8a8 ? "token" : "none");
    quant_format f;
    assert_true(ir_weight_quant(&c->m, c->m.values[c->m.ops[op].operands[2]].def_op, &f));
    assert_int_equal(f.has_column_scale, w8a8 && strcmp(q->preset, "int8") == 0); /* SmoothQuant's */
}

/* Which of operands 2..4 of op (gate, up, down) are quantized: bits 0..2. */
static unsigned experts_quantized(emit_case *c, uint32_t op) {
    quant_format f;
    unsigned quantized = 0;
    for (uint32_t i = 2; i < 5; i++)
        if (ir_weight_quant(&c->m, c->m.values[c->m.ops[op].operands[i]].def_op, &f))
            quantized |= 1u << (i - 2);
    return quantized;
}

/* D = 64, F = 96: every K a multiple of 32 int4 and 16 int8 codes, the
 * 128-bit path; top 2 of 4 at decode, in a tile, across two tiles. */
static void test_moe_quantized_vector_path(void **state) {
    (void)state;
    for (int p = 0; p < PRESET_COUNT; p++) {
        emit_case *c;
        uint32_t op = quant_moe(&c, &presets[p], 4, 64, 96, 2, true, "f32");
        assert_int_equal(experts_quantized(c, op), 7);
        assert_act_quant(c, op, &presets[p]);
        const int64_t token_counts[3] = {1, 5, 13};
        for (int t = 0; t < 3; t++)
            case_run(c, op, token_counts[t], F32_SEQUENCE_TOLERANCE);
        case_free(c);
    }
}

/* D = 40, F = 24: no multiple of 16 codes, one code at a time. int4 in
 * groups of 32 does not divide D = 40: gate and up stay f32 (as a matmul
 * weight would) while down (F = 24 columns, one group per row) is int4 —
 * each grouped GEMM reads its own experts' storage. */
static void test_moe_quantized_scalar_path(void **state) {
    (void)state;
    for (int p = 0; p < PRESET_COUNT; p++) {
        emit_case *c;
        uint32_t op = quant_moe(&c, &presets[p], 3, 40, 24, 2, false, "f32");
        assert_int_equal(experts_quantized(c, op), presets[p].group_size == 32 ? 4 : 7);
        case_run(c, op, 3, F32_SEQUENCE_TOLERANCE);
        case_free(c);
    }
}

/* Unbalanced routing: every one of 40 tokens (5 tiles of 8) goes to expert
 * 1; experts 0, 2 and 3 have no tokens and their blocks leave at once. */
static void test_moe_quantized_every_token_to_one_expert(void **state) {
    (void)state;
    enum { T = 40, D = 64, E = 4 };
    for (int p = 0; p < PRESET_COUNT; p++) {
        emit_case *c;
        uint32_t op = quant_moe(&c, &presets[p], E, D, 32, 1, false, "f32");
        assert_int_equal(experts_quantized(c, op), 7);
        case_route_to_one_expert(c, op, T, D, E, 1);
        case_run(c, op, T, F32_SEQUENCE_TOLERANCE);
        case_free(c);
    }
}

/* Every one of 8 experts chosen by each of 40 tokens: 320 slots, more than
 * one gather window of 256; then a decode step on the same state. */
static void test_moe_quantized_slots_span_windows(void **state) {
    (void)state;
    for (int p = 0; p < PRESET_COUNT; p += 2) { /* int4 in groups of 32, int8 W8A8, int8 W8A16 */
        emit_case *c;
        uint32_t op = quant_moe(&c, &presets[p], 8, 64, 64, 8, true, "f32");
        assert_int_equal(experts_quantized(c, op), 7);
        case_run(c, op, 40, F32_SEQUENCE_TOLERANCE);
        case_run(c, op, 1, F32_SEQUENCE_TOLERANCE);
        case_free(c);
    }
}

/* The presets as deployed, with bf16 activations (x, the hidden and partial
 * rows and the result in bf16; the router in f32): the 128-bit loads of bf16
 * x rows beside the codes, at bf16's tolerance. */
static void test_moe_quantized_bf16_activations(void **state) {
    (void)state;
    for (int p = 0; p < PRESET_COUNT; p++) {
        emit_case *c;
        uint32_t op = quant_moe(&c, &presets[p], 4, 64, 96, 2, true, NULL);
        assert_int_equal(experts_quantized(c, op), 7);
        assert_act_quant(c, op, &presets[p]);
        assert_int_equal(c->m.values[c->m.ops[op].operands[0]].type.dtype, SMELT_DTYPE_BF16);
        assert_int_equal(c->m.values[c->m.ops[op].operands[1]].type.dtype, SMELT_DTYPE_F32);
        case_run(c, op, 1, F32_SEQUENCE_TOLERANCE);
        case_run(c, op, 9, F32_SEQUENCE_TOLERANCE);
        case_free(c);
    }
}

/* fp8 W8A8 with static per-tensor scales (ops.def, moe act_scale tensor),
 * set on the op as precision sets calibrated ones: x's 1/256 (x is uniform
 * in [-2, 2): codes of |x| > 1.75 saturate at 448) and the hidden rows' 1/2
 * (rows of silu(g) * u, g and u sums of D products of uniform [-2, 2)
 * values: their largest codes saturate too), far enough apart that a
 * kernel using one for the other, or each row's own absmax, misses the
 * reference's codes. The 128-bit path and the
 * one-code path, f32 and bf16 activations, decode and prefill steps. */
static void test_moe_fp8_static_scales(void **state) {
    (void)state;
    static const quant_case fp8 = {"fp8", 0, NULL};
    static const struct {
        int64_t dim, ffn;
        const char *activations;
    } shapes[] = {{64, 96, "f32"}, {40, 24, "f32"}, {64, 96, NULL}};
    for (int i = 0; i < 3; i++) {
        emit_case *c;
        uint32_t op = quant_moe(&c, &fp8, 4, shapes[i].dim, shapes[i].ffn, 2, true, shapes[i].activations);
        assert_int_equal(experts_quantized(c, op), 7);
        assert_act_quant(c, op, &fp8);
        assert_true(ir_op_set_string(&c->m, op, "act_scale", "tensor"));
        assert_true(ir_op_set_float(&c->m, op, "gate_up_act_scale_value", 1.0 / 256));
        assert_true(ir_op_set_float(&c->m, op, "down_act_scale_value", 0.5));
        assert_true(ir_verify(&c->m, &c->d));
        const int64_t token_counts[3] = {1, 5, 13};
        for (int t = 0; t < 3; t++)
            case_run(c, op, token_counts[t], F32_SEQUENCE_TOLERANCE);
        case_free(c);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_moe_quantized_vector_path),
        cmocka_unit_test(test_moe_quantized_scalar_path),
        cmocka_unit_test(test_moe_quantized_every_token_to_one_expert),
        cmocka_unit_test(test_moe_quantized_slots_span_windows),
        cmocka_unit_test(test_moe_quantized_bf16_activations),
        cmocka_unit_test(test_moe_fp8_static_scales),
    };
    return cmocka_run_group_tests(tests, harness_setup, harness_teardown);
}
