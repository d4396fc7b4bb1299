/* test_emit_act_codes.c - the kernels and the lowering of W8A8 activation
 * codes (ir/ops.def: quantize, matmul act_codes), on the host simulator and
 * through NVRTC for sm_80 and sm_90 (emit_harness.c):
 *
 *   - the quantize kernel (emit_quantize.c): its codes and scales bit for
 *     bit the reference's coding (ref_w8a8_row_codes, what the reference's
 *     W8A8 matmul quantizes x with), E4M3 and int8, per token and per
 *     tensor, bf16 and f32 x, rows of zeros, NaN, saturation, the 128-bit
 *     path and the one-element path, rows longer than the block;
 *   - a norm and the quantize of its output as one kernel (emit_norm.c) =
 *     the norm kernel and then the quantize kernel, bit for bit;
 *   - the dequantize-GEMM reading the quantize's codes (the fallback of the
 *     scaled GEMM) = the W8A8 dequantize-GEMM coding x itself, bit for bit
 *     (the same codes, the same sums), with a bias and a residual too;
 *   - the lowering of a norm + quantize + act_codes matmul + residual group:
 *     the fused GEMV for decode, and above it the norm + quantize kernel and
 *     the guarded pair (a scaled GEMM of the codes with the weight's codes
 *     and f16 scales at their offset, and the fallback launch), and of the
 *     group without its norm (o_proj's, down_proj's);
 *   - a GEMV group with a quantize: the fused kernel skips it (and refuses
 *     a group whose codes something outside it reads).
 * The oracle of the codes is the reference's own row coding (what its
 * quantize op codes with too). The precision pass (case_infer) inserts the
 * quantize of every fp8 W8A8 matmul and gives the matmul its codes
 * (passes/precision_act_codes.c); the tests find that quantize through the
 * matmul (ir_matmul_act_codes) and find ops again by their results (an
 * insertion moves the ops after it). */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "emit_harness.c"
#include "lower.h"

/* quantize(x) {dtype, act_scale}: its op, written by hand (the precision
 * pass keeps such a quantize and its results' dtypes under every preset). */
static uint32_t quantize_op(emit_case *c, ir_value_id x, bool int8, double static_scale) {
    uint32_t op = case_op(c, IR_OP_QUANTIZE, &x, 1);
    assert_true(ir_op_set_string(&c->m, op, "dtype", int8 ? "i8" : "f8e4m3"));
    if (static_scale > 0.0) {
        assert_true(ir_op_set_string(&c->m, op, "act_scale", "tensor"));
        assert_true(ir_op_set_float(&c->m, op, "act_scale_value", static_scale));
    }
    return op;
}

/* The op of value v now (values keep their ids when precision inserts or
 * removes an op; op indices after it move). */
static uint32_t op_of(const emit_case *c, ir_value_id v) { return c->m.values[v].def_op; }

/* The quantize whose codes act_codes matmul `op` reads. */
static uint32_t codes_quantize(const emit_case *c, uint32_t op) {
    ir_value_id codes, scales;
    assert_true(ir_matmul_act_codes(&c->m, op, &codes, &scales));
    assert_int_equal(op_of(c, scales), op_of(c, codes));
    assert_int_equal(c->m.ops[op_of(c, codes)].kind, IR_OP_QUANTIZE);
    return op_of(c, codes);
}

/* Makes matmul `op` code its x itself again (W8A8 without act_codes: the
 * GEMM of int8 and of FP8 weights with column scales): the precision pass
 * gives every fp8 W8A8 matmul whose weight has no column scales the codes
 * and scales of a quantize of x as its last two operands; the comparison
 * with the GEMM that codes x takes them off after case_infer. */
static void strip_act_codes(emit_case *c, uint32_t op) {
    codes_quantize(c, op);
    c->m.ops[op].operand_count -= 2;
    assert_true(ir_op_set_bool(&c->m, op, "act_codes", false));
}

/* Gives matmul `op` the codes and scales of quantize q (act_codes), after
 * case_infer: what precision does for fp8, for a coding it does not insert
 * (int8 W8A8 keeps coding x itself there: SmoothQuant's column scales). */
static void add_act_codes(emit_case *c, uint32_t op, uint32_t q) {
    ir_op *o = &c->m.ops[op];
    ir_value_id *operands = arena_array(&c->m.arena, o->operand_count + 2, sizeof *operands);
    memcpy(operands, o->operands, o->operand_count * sizeof *operands);
    operands[o->operand_count] = c->m.ops[q].results[0];
    operands[o->operand_count + 1] = c->m.ops[q].results[1];
    o->operands = operands;
    o->operand_count += 2;
    assert_true(ir_op_set_bool(&c->m, op, "act_codes", true));
}

/* Launches the kernels of `l` that serve T = tokens on the simulator
 * (compiled by NVRTC and for the host first), with the case's buffers. */
static void launch_lowering(emit_case *c, const cg_group_lowering *l, int64_t tokens) {
    sim_kernel entries[CG_MAX_KERNELS];
    for (uint32_t k = 0; k < l->kernel_count; k++) {
        compile_for_gpus(&l->kernels[k]);
        dump_source(&l->kernels[k]);
    }
    build_for_host(c, l, entries);
    int token_argument = (int)tokens;
    for (uint32_t k = 0; k < l->kernel_count; k++) {
        const cg_kernel *kernel = &l->kernels[k];
        if (!kernel_serves(kernel, tokens)) continue;
        void *pointers[PROG_MAX_ARGS], *args[PROG_MAX_ARGS];
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
        if (sim_launch(harness_pool, &entries[k], grid, block, rule->dynamic_shared_bytes, args, error,
                       sizeof error) != SIM_OK)
            fail_msg("launch of %s: %s\n--- source ---\n%s", kernel->name, error, kernel->source);
    }
}

/* Emits group {ops} (outputs: every result of its ops) and runs it at T. */
static void run_ops(emit_case *c, const uint32_t *ops, uint32_t count, int64_t tokens, cg_group_lowering *l,
                    arena *a) {
    ir_value_id inputs[IR_MAX_OPERANDS], outputs[IR_MAX_OPERANDS];
    uint32_t input_count = 0, output_count = 0;
    for (uint32_t i = 0; i < count; i++) {
        const ir_op *o = &c->m.ops[ops[i]];
        for (uint32_t j = 0; j < o->operand_count; j++) {
            bool inside = false;
            for (uint32_t k = 0; k < count; k++)
                inside |= c->m.values[o->operands[j]].def_op == ops[k];
            if (!inside) inputs[input_count++] = o->operands[j];
        }
        for (uint32_t r = 0; r < o->result_count; r++)
            outputs[output_count++] = o->results[r];
    }
    cg_group g = {.op_count = count,
                  .ops = ops,
                  .input_count = input_count,
                  .inputs = inputs,
                  .output_count = output_count,
                  .outputs = outputs};
    if (!cg_emit_group(&c->m, &g, a, l, &c->d)) fail_msg("emit failed:\n%s", case_log(c));
    assert_int_equal(l->kind, CG_LOWER_KERNELS);
    for (uint32_t i = 0; i < input_count; i++) { /* a result of an op run before stays as it wrote it */
        ir_op_kind def = c->m.ops[c->m.values[inputs[i]].def_op].kind;
        bool declared = def == IR_OP_INPUT || def == IR_OP_WEIGHT || def == IR_OP_CONST;
        if (declared || !c->values[inputs[i]].buffer) fill_operand(c, inputs[i], tokens);
    }
    for (uint32_t i = 0; i < output_count; i++)
        prepare_result(c, outputs[i], tokens);
    launch_lowering(c, l, tokens);
}

/* The kernel's codes and scales of x (as stored: the case's floats, or the
 * buffer of a bf16 / f32 value `stored` when given) against the reference's
 * coding of each row, bit for bit. */
static void expect_reference_codes(emit_case *c, ir_value_id x, uint32_t quantize, int64_t tokens) {
    const ir_op *q = &c->m.ops[quantize];
    bool int8 = cg_storage_dtype(&c->m, q->results[0]) == SMELT_DTYPE_I8;
    double static_scale = strcmp(ir_op_string(&c->m, quantize, "act_scale"), "tensor") == 0
                              ? ir_op_float(&c->m, quantize, "act_scale_value")
                              : 0.0;
    const ir_type *t = &c->m.values[x].type;
    uint64_t k = (uint64_t)t->dims[t->rank - 1].size, dims[IR_MAX_DIMS];
    uint64_t rows = dims_at(c, x, tokens, dims) / k;
    smelt_dtype xd = cg_storage_dtype(&c->m, x);
    const uint8_t *codes = c->values[q->results[0]].buffer;
    const float *scales = c->values[q->results[1]].buffer;
    float *row = malloc(k * sizeof *row), *want = malloc(k * sizeof *want);
    quant_tensor no_column_scales = {0};
    for (uint64_t r = 0; r < rows; r++) {
        for (uint64_t i = 0; i < k; i++) /* x as stored, from the kernel's buffer */
            row[i] = is_half(xd) ? from_half(xd, ((const uint16_t *)c->values[x].buffer)[r * k + i])
                                 : ((const float *)c->values[x].buffer)[r * k + i];
        float scale = ref_w8a8_row_codes(int8 ? QUANT_INT8 : QUANT_FP8, row, &no_column_scales, k,
                                         (float)static_scale, want);
        if (memcmp(&scale, &scales[r], sizeof scale) != 0)
            fail_msg("row %llu: scale %.9g, the reference's %.9g", (unsigned long long)r, scales[r], scale);
        for (uint64_t i = 0; i < k; i++) {
            uint8_t expected = int8 ? (uint8_t)(int8_t)want[i] : plan_f32_to_f8e4m3(want[i]);
            if (codes[r * k + i] != expected)
                fail_msg("row %llu column %llu: x %.9g / s %.9g coded 0x%02x, the reference 0x%02x",
                         (unsigned long long)r, (unsigned long long)i, row[i], scale, codes[r * k + i],
                         expected);
        }
    }
    free(row);
    free(want);
}

/* x's rows: random, but row 1 zeros, row 2 one large value among small ones
 * (codes down to E4M3's subnormals and int8's zeros), row 3 times 1000 and
 * a NaN in row 4 (no maximum; its code NaN or 0). */
static void set_rows(emit_case *c, ir_value_id x, int64_t tokens, int64_t k) {
    float *data = malloc((size_t)(tokens * k) * sizeof *data);
    for (int64_t t = 0; t < tokens; t++)
        for (int64_t i = 0; i < k; i++) {
            float v = next_uniform(c);
            data[t * k + i] = t == 1                 ? 0.0f
                              : t == 2               ? (i == 5 ? 300.0f : v * 0.01f)
                              : t == 3               ? v * 1000.0f
                              : t == 4 && i == k / 2 ? __builtin_nanf("")
                                                     : v;
        }
    case_set_floats(c, x, tokens, data, (uint64_t)(tokens * k));
    free(data);
}

static void test_quantize_kernel(void **state) {
    (void)state;
    const int64_t widths[3] = {64, 40, 4608}; /* 16 a thread; one element at a time; rows past 256 threads */
    for (int activations = 0; activations < 2; activations++)
        for (int int8 = 0; int8 < 2; int8++)
            for (int tensor = 0; tensor < 2; tensor++)
                for (int w = 0; w < 3; w++) {
                    emit_case *c = case_new("bf16");
                    c->activations = activations ? "bf16" : "f32";
                    ir_value_id x = case_inputf(c, "x", "f32[tokens, %lld]", (long long)widths[w]);
                    /* 0.002: most codes of [-2, 2) saturate (E4M3 at 448, int8 at 127) */
                    uint32_t q = quantize_op(c, x, int8, tensor ? 0.002 : 0.0);
                    case_infer(c);
                    arena a;
                    arena_init(&a);
                    cg_group_lowering l;
                    const int64_t token_counts[2] = {1, 7};
                    for (int t = 0; t < 2; t++) {
                        set_rows(c, x, token_counts[t], widths[w]);
                        run_ops(c, &q, 1, token_counts[t], &l, &a);
                        assert_int_equal(l.kernel_count, 1);
                        assert_non_null(strstr(l.kernels[0].name, tensor ? "_tensor" : "_token"));
                        assert_int_equal(l.kernels[0].rule.block[0], widths[w] == 40   ? 64
                                                                     : widths[w] == 64 ? 32
                                                                                       : 256);
                        expect_reference_codes(c, x, q, token_counts[t]);
                    }
                    arena_free(&a);
                    case_free(c);
                }
}

/* E4M3 codes at the edges, by hand, with a static scale of 1 (x / s = x). */
static void test_quantize_hand_values(void **state) {
    (void)state;
    /* 448 is the largest code 0x7e (2^8 x 1.75), 1000 saturates to it and -500 to 0xfe; 2^-7 is the
     * subnormal 4 x 2^-9 (0x04), 2^-9 the smallest (0x01), 2^-10 ties to even (0x00) and 3 x 2^-10
     * to 0x02; 17 = 2^4 x 1.0625 ties to even (16, 0x58), 18 is 0x59; -0 keeps its sign (0x80);
     * 1, -1, 2, 0.5 and 3.5 are 0x38, 0xb8, 0x40, 0x30 and 0x46 */
    const float x[16] = {448,   1000, -500, 0.0078125f, 0.001953125f, 0.0009765625f, 0.0029296875f, 17, 18, 0,
                         -0.0f, 1,    -1,   2,          0.5f,         3.5f};
    const uint8_t want[16] = {0x7e, 0x7e, 0xfe, 0x04, 0x01, 0x00, 0x02, 0x58,
                              0x59, 0x00, 0x80, 0x38, 0xb8, 0x40, 0x30, 0x46};
    emit_case *c = case_new("f32");
    ir_value_id xv = case_input(c, "x", "f32[tokens, 16]");
    uint32_t q = quantize_op(c, xv, false, 1.0);
    case_infer(c);
    case_set_floats(c, xv, 1, x, 16);
    arena a;
    arena_init(&a);
    cg_group_lowering l;
    run_ops(c, &q, 1, 1, &l, &a);
    const uint8_t *codes = c->values[c->m.ops[q].results[0]].buffer;
    for (int i = 0; i < 16; i++)
        if (codes[i] != want[i]) fail_msg("x %.9g: code 0x%02x, expected 0x%02x", x[i], codes[i], want[i]);
    assert_float_equal(((const float *)c->values[c->m.ops[q].results[1]].buffer)[0], 1.0f, 0.0f);
    expect_reference_codes(c, xv, q, 1);
    arena_free(&a);
    case_free(c);
}

/* rms_norm (and layer_norm with a bias) and the quantize of its output, one
 * kernel, against the norm kernel then the quantize kernel: the same bytes
 * of output, codes and scales, and codes that are the reference's coding of
 * the stored output. bf16 activations (the output rounded before coding),
 * per token and per tensor, E4M3 and int8, rows of 64 and of 320. */
static void test_norm_quantize_kernel(void **state) {
    (void)state;
    for (int layer = 0; layer < 2; layer++)
        for (int int8 = 0; int8 < 2; int8++)
            for (int tensor = 0; tensor < 2; tensor++)
                for (int wide = 0; wide < 2; wide++) {
                    int64_t width = wide ? 320 : 64, tokens = 5;
                    emit_case *c = case_new("bf16");
                    ir_value_id h = case_inputf(c, "h", "f32[tokens, %lld]", (long long)width);
                    ir_value_id g = case_weightf(c, "f32[%lld]", (long long)width);
                    ir_value_id bias = case_weightf(c, "f32[%lld]", (long long)width);
                    uint32_t norm = layer ? case_op(c, IR_OP_LAYER_NORM, (ir_value_id[]){h, g, bias}, 3)
                                          : case_op(c, IR_OP_RMS_NORM, (ir_value_id[]){h, g}, 2);
                    ir_op_set_float(&c->m, norm, "eps", 1e-5);
                    uint32_t q = quantize_op(c, case_result(c, norm), int8, tensor ? 0.01 : 0.0);
                    case_infer(c);
                    set_rows(c, h, tokens, width);
                    ir_value_id results[3] = {case_result(c, norm), c->m.ops[q].results[0],
                                              c->m.ops[q].results[1]};
                    uint64_t bytes[3] = {(uint64_t)(tokens * width) * 2, (uint64_t)(tokens * width),
                                         4 * (uint64_t)tokens};
                    arena a;
                    arena_init(&a);
                    cg_group_lowering fused, alone;
                    const uint32_t both[2] = {norm, q};
                    run_ops(c, both, 2, tokens, &fused, &a);
                    assert_int_equal(fused.kernel_count, 1);
                    assert_non_null(strstr(fused.kernels[0].name, tensor ? "_tensor0p01" : "_token"));
                    expect_reference_codes(c, results[0], q, tokens);
                    void *kept[3];
                    for (int r = 0; r < 3; r++) {
                        kept[r] = malloc(bytes[r]);
                        memcpy(kept[r], c->values[results[r]].buffer, bytes[r]);
                    }
                    run_ops(c, &norm, 1, tokens, &alone, &a);
                    run_ops(c, &q, 1, tokens, &alone, &a);
                    for (int r = 0; r < 3; r++) {
                        assert_memory_equal(kept[r], c->values[results[r]].buffer, bytes[r]);
                        free(kept[r]);
                    }
                    arena_free(&a);
                    case_free(c);
                }
}

/* ---- the dequantize-GEMM over the quantize's codes ------------------------------------- */

/* x [tokens, K] (+ a residual h [tokens, N]), an fp8 (or int8 without
 * column scales) weight [N, K] (+ bias), and two matmuls of them: `plain`
 * codes x itself (W8A8, today's), `coded` reads the codes and scales of
 * quantize `q` of x (act_codes); each followed by its adds when `adds`.
 * fp8: q is the quantize precision inserts for both (one per x); the plain
 * one's codes are taken off. int8: precision inserts none, q is written by
 * hand and given to the coded one after case_infer. */
typedef struct codes_case {
    emit_case *c;
    ir_value_id x, w;
    uint32_t q, plain[3], coded[3];
    uint32_t op_count; /* of plain and coded: the matmul and its adds */
} codes_case;

static codes_case codes_case_new(bool int8, int64_t n, int64_t k, bool bias, bool residual,
                                 double static_scale) {
    codes_case cc = {.c = case_new(int8 ? "int8" : "fp8")};
    emit_case *c = cc.c;
    c->activations = "bf16";
    cc.x = case_inputf(c, "x", "f32[tokens, %lld]", (long long)k);
    ir_value_id h = case_inputf(c, "h", "f32[tokens, %lld]", (long long)n);
    cc.w = case_weightf(c, "f32[%lld, %lld]", (long long)n, (long long)k);
    ir_value_id b = case_weightf(c, "f32[%lld]", (long long)n);
    ir_value_id hand_codes =
        int8 ? ir_op_result(&c->m, quantize_op(c, cc.x, true, static_scale), 0) : IR_NO_VALUE;
    ir_value_id plain[2], coded[2]; /* the ops' results: the ops move as precision inserts the quantize */
    plain[0] = case_result(c, case_op(c, IR_OP_MATMUL, (ir_value_id[]){cc.x, cc.w, b}, bias ? 3 : 2));
    coded[0] = case_result(c, case_op(c, IR_OP_MATMUL, (ir_value_id[]){cc.x, cc.w, b}, bias ? 3 : 2));
    cc.op_count = 1;
    if (residual) {
        plain[1] = case_result(c, case_op(c, IR_OP_ADD, (ir_value_id[]){h, plain[0]}, 2));
        coded[1] = case_result(c, case_op(c, IR_OP_ADD, (ir_value_id[]){h, coded[0]}, 2));
        cc.op_count = 2;
    }
    case_infer(c);
    for (uint32_t i = 0; i < cc.op_count; i++) {
        cc.plain[i] = op_of(c, plain[i]);
        cc.coded[i] = op_of(c, coded[i]);
    }
    if (int8) {
        cc.q = op_of(c, hand_codes);
        add_act_codes(c, cc.coded[0], cc.q);
    } else {
        cc.q = codes_quantize(c, cc.coded[0]);
        assert_int_equal(codes_quantize(c, cc.plain[0]), cc.q); /* one quantize per x */
        strip_act_codes(c, cc.plain[0]);
        if (static_scale > 0.0) { /* the matmuls' static scale below, the quantize's as well */
            assert_true(ir_op_set_string(&c->m, cc.q, "act_scale", "tensor"));
            assert_true(ir_op_set_float(&c->m, cc.q, "act_scale_value", static_scale));
        }
    }
    uint32_t weight = c->m.values[cc.w].def_op;
    quant_format f;
    assert_true(ir_weight_quant(&c->m, weight, &f));
    if (f.has_column_scale) { /* int8's SmoothQuant scales: act_codes takes none */
        f.has_column_scale = false;
        f.method = QUANT_METHOD_RTN;
        ir_weight_set_quant(&c->m, weight, &f);
    }
    for (int i = 0; i < 2; i++) {
        uint32_t op = i ? cc.coded[0] : cc.plain[0];
        assert_string_equal(ir_op_string(&c->m, op, "act_quant"), int8 ? "i8" : "f8e4m3");
        if (static_scale > 0.0) {
            assert_true(ir_op_set_string(&c->m, op, "act_scale", "tensor"));
            assert_true(ir_op_set_float(&c->m, op, "act_scale_value", static_scale));
        }
        assert_true(cg_dequant_gemm_fits(&c->m, op));
    }
    return cc;
}

static bool emit_with_adds(const ir_module *m, const cg_group *g, arena *a, cg_group_lowering *out,
                           diag_engine *d) {
    return g->op_count == 1 ? cg_emit_group(m, g, a, out, d)
                            : cg_emit_dequant_gemm_epilogue(m, g->ops, g->op_count, a, out, d);
}

/* Runs ops (a matmul and its adds) as the lowering of a step of T > 4 does. */
static void run_matmul(codes_case *cc, const uint32_t *ops, int64_t tokens, cg_group_lowering *l, arena *a) {
    emit_case *c = cc->c;
    ir_value_id out = case_result(c, ops[cc->op_count - 1]);
    cg_group g = {.op_count = cc->op_count, .ops = ops, .output_count = 1, .outputs = &out};
    if (!emit_with_adds(&c->m, &g, a, l, &c->d)) fail_msg("emit failed:\n%s", case_log(c));
    const ir_op *matmul = &c->m.ops[ops[0]];
    for (uint32_t i = 0; i < matmul->operand_count; i++)
        if (c->m.ops[c->m.values[matmul->operands[i]].def_op].kind != IR_OP_QUANTIZE)
            fill_operand(c, matmul->operands[i], tokens);
    for (uint32_t i = 1; i < cc->op_count; i++)
        fill_operand(c, c->m.ops[ops[i]].operands[0], tokens);
    prepare_result(c, out, tokens);
    launch_lowering(c, l, tokens);
}

static void test_dequant_gemm_from_codes(void **state) {
    (void)state;
    typedef struct shape {
        bool int8;
        int64_t n, k;
        bool bias, residual;
        double static_scale;
    } shape;
    const shape shapes[] = {
        {false, 70, 256, false, false, 0.0}, {false, 64, 128, true, true, 0.0},
        {true, 96, 384, false, true, 0.0},   {false, 64, 128, false, false, 0.0025},
        {true, 130, 128, true, false, 0.01},
    };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const shape *s = &shapes[i];
        codes_case cc = codes_case_new(s->int8, s->n, s->k, s->bias, s->residual, s->static_scale);
        emit_case *c = cc.c;
        arena a;
        arena_init(&a);
        const int64_t token_counts[2] = {5, 64};
        for (int t = 0; t < 2; t++) {
            int64_t tokens = token_counts[t];
            set_rows(c, cc.x, tokens, s->k);
            /* no NaN: the sums would be NaN in both */
            c->values[cc.x].f[4 * s->k + s->k / 2] = 1.0f;
            cg_group_lowering plain, coded, quantize;
            run_matmul(&cc, cc.plain, tokens, &plain, &a);
            ir_value_id out_plain = case_result(c, cc.plain[cc.op_count - 1]),
                        out_coded = case_result(c, cc.coded[cc.op_count - 1]);
            run_ops(c, &cc.q, 1, tokens, &quantize, &a);
            expect_reference_codes(c, cc.x, cc.q, tokens);
            run_matmul(&cc, cc.coded, tokens, &coded, &a);
            /* the kernels: the GEMV for up to 4 tokens (every device), the GEMM over the codes above,
             * the fallback of the scaled GEMM there (a GEMM that cuBLASLt's FP8 GEMM takes: N and K
             * multiples of 16; N = 130 keeps the kernels alone) */
            bool scaled = s->n % 16 == 0 && s->k % 16 == 0;
            assert_int_equal(coded.scaled_gemm, scaled);
            assert_false(plain.scaled_gemm);
            const cg_kernel *gemm = &coded.kernels[coded.kernel_count - 1];
            assert_non_null(strstr(gemm->name, s->int8 ? "_ai8" : "_af8"));
            assert_non_null(strstr(gemm->name, "_codes"));
            assert_int_equal(gemm->fallback, scaled);
            assert_int_equal(gemm->min_tokens, IR_GEMV_MAX_TOKENS + 1);
            if (scaled) assert_int_equal(coded.scaled_gemm_min_tokens, IR_GEMV_MAX_TOKENS + 1);
            if (cc.op_count == 1) {
                assert_int_equal(coded.kernel_count, 2);
                assert_false(coded.kernels[0].fallback);
                assert_int_equal(coded.kernels[0].max_tokens, IR_GEMV_MAX_TOKENS);
            }
            uint64_t bytes = (uint64_t)(tokens * s->n) * 2; /* bf16 */
            assert_memory_equal(c->values[out_plain].buffer, c->values[out_coded].buffer, bytes);
        }
        arena_free(&a);
        case_free(c);
    }
}

/* An act_codes matmul whose weight has SmoothQuant's column scales (which
 * the codes do not carry) is refused at the op. */
static void test_dequant_gemm_codes_refused(void **state) {
    (void)state;
    codes_case cc = codes_case_new(true, 64, 128, false, false, 0.0);
    emit_case *c = cc.c;
    uint32_t weight = c->m.values[cc.w].def_op;
    quant_format f;
    assert_true(ir_weight_quant(&c->m, weight, &f));
    f.has_column_scale = true;
    f.method = QUANT_METHOD_SMOOTH;
    ir_weight_set_quant(&c->m, weight, &f);
    arena a;
    arena_init(&a);
    cg_group_lowering l;
    assert_false(cg_emit_op(&c->m, cc.coded[0], &a, &l, &c->d));
    assert_non_null(strstr(case_log(c), "act_codes over the weight's kind of codes, without column scales"));
    arena_free(&a);
    case_free(c);
}

/* What NVRTC makes of the fallback GEMM of Llama-3-8B's fp8 projections (K
 * and N 4096): no spills on sm_80 and sm_90; A and B both from shared byte
 * rows (no ldmatrix, no coding), and of the quantize kernel over K 4096:
 * 128-bit loads and stores, and on sm_90 the hardware E4M3 conversion. */
static void test_codes_kernels_ptx(void **state) {
    (void)state;
    if (!harness_have_nvrtc) skip();
    codes_case cc = codes_case_new(false, 4096, 4096, false, false, 0.0);
    emit_case *c = cc.c;
    arena a;
    arena_init(&a);
    cg_group_lowering l, q;
    assert_true(cg_emit_op(&c->m, cc.coded[0], &a, &l, &c->d));
    assert_true(cg_emit_op(&c->m, cc.q, &a, &q, &c->d));
    const cg_kernel *kernels[2] = {&l.kernels[l.kernel_count - 1], &q.kernels[0]};
    for (int i = 0; i < 2; i++) {
        compile_for_gpus(kernels[i]);
        cg_compiled compiled;
        compile_ptx_for_sm90(kernels[i], &compiled);
        if (i == 0) {
            assert_non_null(strstr(compiled.ptx, "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"));
            assert_null(strstr(compiled.ptx, "ldmatrix"));
            assert_non_null(strstr(compiled.ptx, "cp.async.cg.shared.global"));
        } else {
            assert_non_null(strstr(compiled.ptx, "cvt.rn.satfinite.e4m3x2.f32"));
            assert_non_null(strstr(compiled.ptx, "ld.global.v4.u32"));
            assert_non_null(strstr(compiled.ptx, "st.global.v4.u32"));
        }
        size_t lines = 0;
        for (const char *p = compiled.ptx; *p; p++)
            lines += *p == '\n';
        printf("  sm_90 PTX of %s: %zu lines\n", kernels[i]->name, lines);
        cg_compiled_free(&compiled);
    }
    arena_free(&a);
    case_free(c);
}

/* ---- the lowering ---------------------------------------------------------------------- */

/* A module of one GEMV group as precision and fuse make it for an fp8
 * matmul: h -> rms_norm -> quantize -> matmul act_codes -> + r (a QKV-like
 * group with its norm), or without the norm (o_proj's and down_proj's:
 * quantize, matmul and the residual add), then the logits' norm. ops: the
 * norm (IR_NONE without), the quantize (precision's), the matmul and the
 * add; fuse puts them in one group (the test checks it). */
static void lower_act_codes_module(emit_case *c, bool with_norm, uint32_t *ops, cg_lowered *l) {
    ir_value_id h = case_input(c, "h", "f32[tokens, 256]"), r = case_input(c, "r", "f32[tokens, 256]");
    ir_value_id g = case_weight(c, "f32[256]"), w = case_weight(c, "f32[256, 256]");
    ir_value_id g2 = case_weight(c, "f32[256]");
    ops[0] = IR_NONE;
    ir_value_id x = h;
    if (with_norm) {
        ops[0] = case_op(c, IR_OP_RMS_NORM, (ir_value_id[]){h, g}, 2);
        ir_op_set_float(&c->m, ops[0], "eps", 1e-5);
        x = case_result(c, ops[0]);
    }
    ir_value_id y = case_result(c, case_op(c, IR_OP_MATMUL, (ir_value_id[]){x, w}, 2));
    ir_value_id sum = case_result(c, case_op(c, IR_OP_ADD, (ir_value_id[]){r, y}, 2));
    uint32_t last = case_op(c, IR_OP_RMS_NORM, (ir_value_id[]){sum, g2}, 2);
    ir_op_set_float(&c->m, last, "eps", 1e-5);
    case_output(c, case_result(c, last), "logits");
    case_infer(c);
    ops[2] = op_of(c, y); /* the ops after the quantize precision inserted before the matmul moved */
    ops[1] = codes_quantize(c, ops[2]);
    ops[3] = op_of(c, sum);
    assert_int_equal(c->m.ops[ops[1]].operands[0], x);
    pass_driver_options o = {.pass = {.precision = "fp8", .activations = "bf16"}};
    pass_list list;
    assert_true(pass_parse_list("fuse", &list, &c->d));
    if (!pass_run_list(&c->m, list.items, list.count, &o, &c->d)) fail_msg("fuse:\n%s", case_log(c));
    for (int i = with_norm ? 1 : 2; i < 4; i++) /* fuse's group: the norm (or the quantize) and the rest */
        assert_int_equal(c->m.ops[ops[i]].group, c->m.ops[ops[with_norm ? 0 : 1]].group);
    assert_true(pass_parse_list("schedule,plan-memory", &list, &c->d));
    if (!pass_run_list(&c->m, list.items, list.count, &o, &c->d)) fail_msg("passes:\n%s", case_log(c));
    if (!cg_lower_module(&c->m, l, &c->d)) fail_msg("lowering:\n%s", case_log(c));
}

static bool same_ref(prog_ref a, prog_ref b) {
    return a.buffer == b.buffer && a.index == b.index && a.offset == b.offset;
}

static prog_ref ref_of(emit_case *c, ir_value_id v) {
    const ir_buffer *b = &c->m.values[v].buffer;
    return b->kind == IR_BUFFER_WEIGHT ? (prog_ref){PROG_BUFFER_WEIGHT, (uint32_t)b->offset, 0}
                                       : (prog_ref){PROG_BUFFER_ARENA, 0, b->offset};
}

/* Whether launch l reads (or, with writes, writes) value v's buffer. */
static bool launch_touches(emit_case *c, const prog_launch *l, ir_value_id v, bool writes) {
    for (uint32_t a = 0; a < l->arg_count; a++)
        if (l->args[a].kind == PROG_ARG_POINTER && same_ref(l->args[a].ref, ref_of(c, v)) &&
            l->args[a].writes == writes)
            return true;
    return false;
}

/* The lowering of such a group: the fused GEMV for steps of up to 4
 * tokens; above, the norm + quantize kernel (or the quantize kernel alone),
 * then the guarded pair: a scaled GEMM of the codes (A, with the scales per
 * row) and the weight's codes (B, with its f16 scales at their offset inside
 * the weight) into the residual add's result, for devices that run it, and
 * the dequantize-GEMM over the codes with the residual in its epilogue for
 * those that do not; the choice between the sides counts the GEMM alone. */
static void check_act_codes_lowering(emit_case *c, bool with_norm, const uint32_t *ops, const cg_lowered *l) {
    const ir_module *m = &c->m;
    const ir_op *q = &m->ops[ops[1]], *matmul = &m->ops[ops[2]], *add = &m->ops[ops[3]];
    ir_value_id x = matmul->operands[0], codes = q->results[0], scales = q->results[1];
    const program *p = &l->program;
    const char *producer_name =
        with_norm ? "rms_norm_bf16_d256_eps1em05_f8e4m3_token_" : "quantize_bf16_f8e4m3_k256_token_";
    uint32_t fused = UINT32_MAX, producer = UINT32_MAX, gemm = UINT32_MAX, fallback = UINT32_MAX;
    for (uint32_t i = 0; i < p->instr_count; i++) {
        const prog_instr *in = &p->instrs[i];
        const char *name = in->op == PROG_OP_LAUNCH ? l->kernels[in->as.launch.kernel].name : "";
        if (strstr(name, "gemv_")) fused = i;
        if (strstr(name, producer_name)) producer = i;
        if (in->op == PROG_OP_GEMM && in->as.gemm.has_scales) gemm = i;
        if (strstr(name, "dequant_gemm_f8e4m3_f8e4m3_bf16_n256_k256_g256_af8_codes_residual_")) fallback = i;
        /* no add of its own above the fused range: both take the residual */
        assert_null(strstr(name, "add_"));
    }
    assert_int_not_equal(fused, UINT32_MAX);
    assert_int_not_equal(producer, UINT32_MAX);
    assert_int_not_equal(gemm, UINT32_MAX);
    assert_int_not_equal(fallback, UINT32_MAX);
    assert_true(producer < gemm && gemm < fallback);
    /* the fused kernel for decode, on every device (it codes x itself) */
    assert_int_equal(p->instrs[fused].needs, PROG_NEED_NONE);
    assert_true(prog_instr_runs(&p->instrs[fused], 1));
    assert_false(launch_touches(c, &p->instrs[fused].as.launch, codes, true));
    /* the codes' producer, on every device above the fused range */
    const prog_launch *made = &p->instrs[producer].as.launch;
    assert_int_equal(p->instrs[producer].needs, PROG_NEED_NONE);
    assert_int_equal(p->instrs[producer].min_tokens, IR_GEMV_MAX_TOKENS + 1);
    assert_true(launch_touches(c, made, codes, true) && launch_touches(c, made, scales, true));
    assert_true(with_norm ? launch_touches(c, made, x, true) : launch_touches(c, made, x, false));
    /* the scaled GEMM */
    const prog_instr *gi = &p->instrs[gemm];
    const prog_gemm *sg = &gi->as.gemm;
    assert_int_equal(gi->needs, PROG_NEED_SCALED_GEMM);
    assert_int_equal(gi->min_tokens, IR_GEMV_MAX_TOKENS + 1);
    assert_int_equal(gi->ir_op, ops[2]);
    assert_int_equal(sg->dtype_a, SMELT_DTYPE_F8E4M3);
    assert_int_equal(sg->dtype_b, SMELT_DTYPE_F8E4M3);
    assert_int_equal(sg->dtype_b_scale, SMELT_DTYPE_F16);
    assert_int_equal(sg->dtype_c, SMELT_DTYPE_BF16);
    assert_true(sg->b_transposed && !sg->has_bias && sg->has_residual);
    assert_int_equal(sg->n, 256);
    assert_int_equal(sg->k, 256);
    assert_int_equal(sg->m.a, 1);
    assert_true(same_ref(sg->a, ref_of(c, codes)));
    assert_true(same_ref(sg->a_scale, ref_of(c, scales)));
    assert_true(same_ref(sg->b, ref_of(c, matmul->operands[1])));
    quant_format f;
    quant_layout layout;
    assert_true(ir_weight_quant(m, m->values[matmul->operands[1]].def_op, &f));
    assert_null(quant_layout_of(&f, 256, 256, &layout));
    assert_int_equal(layout.scales, 256 * 256); /* the codes first, then the f16 scales */
    prog_ref scales_ref = ref_of(c, matmul->operands[1]);
    scales_ref.offset += layout.scales;
    assert_true(same_ref(sg->b_scale, scales_ref));
    assert_true(same_ref(sg->residual, ref_of(c, add->operands[0])));
    assert_true(same_ref(sg->c, ref_of(c, add->results[0])));
    /* its fallback: the same output from the codes (not x), where the device runs no scaled GEMM */
    const prog_instr *fi = &p->instrs[fallback];
    assert_int_equal(fi->needs, PROG_NEED_NO_SCALED_GEMM);
    assert_int_equal(fi->min_tokens, IR_GEMV_MAX_TOKENS + 1);
    assert_true(launch_touches(c, &fi->as.launch, add->results[0], true));
    assert_true(launch_touches(c, &fi->as.launch, codes, false) &&
                launch_touches(c, &fi->as.launch, scales, false));
    assert_false(launch_touches(c, &fi->as.launch, x, false));
    /* the choice of 5 tokens on: side 1 is the producer and the GEMM, not the fallback */
    assert_int_equal(p->choice_count, 1);
    const prog_choice *choice = &p->choices[0];
    assert_int_equal(choice->min_tokens, IR_GEMV_MAX_TOKENS + 1);
    assert_int_equal(gi->choice, 1);
    assert_int_equal(fi->choice, 1);
    assert_int_equal(gi->side, 1);
    assert_int_equal(fi->side, 1);
    assert_int_equal(choice->cost[1][0].launches, 2);
    assert_int_equal(choice->cost[0][0].launches, 1);
}

static void test_lowering_act_codes(void **state) {
    (void)state;
    for (int with_norm = 1; with_norm >= 0; with_norm--) {
        emit_case *c = case_new("fp8");
        c->activations = "bf16";
        uint32_t ops[4];
        cg_lowered l;
        lower_act_codes_module(c, with_norm, ops, &l);
        check_act_codes_lowering(c, with_norm, ops, &l);
        cg_lowered_free(&l);
        case_free(c);
    }
}

/* A quantize whose codes a reader outside the GEMV group needs is refused
 * by the fused kernel (which codes x in registers and writes no codes). */
static void test_gemv_group_refuses_quantize_output(void **state) {
    (void)state;
    emit_case *c = case_new("fp8");
    c->activations = "bf16";
    ir_value_id x = case_input(c, "x", "f32[tokens, 128]"), w = case_weight(c, "f32[64, 128]");
    ir_value_id y = case_result(c, case_op(c, IR_OP_MATMUL, (ir_value_id[]){x, w}, 2));
    case_infer(c);
    uint32_t matmul = op_of(c, y), q = codes_quantize(c, matmul); /* precision's */
    ir_value_id codes = ir_op_result(&c->m, q, 0);
    const uint32_t ops[2] = {q, matmul};
    const ir_value_id outputs[2] = {y, codes};
    cg_group g = {.op_count = 2,
                  .ops = ops,
                  .input_count = 2,
                  .inputs = (ir_value_id[]){x, w},
                  .output_count = 2,
                  .outputs = outputs};
    arena a;
    arena_init(&a);
    cg_group_lowering l;
    assert_false(cg_emit_group(&c->m, &g, &a, &l, &c->d));
    assert_non_null(strstr(case_log(c), "a quantize whose codes or scales a reader outside the group needs"));
    g.output_count = 1; /* the codes read inside alone: the fused GEMV */
    assert_true(cg_emit_group(&c->m, &g, &a, &l, &c->d));
    assert_int_equal(l.kernel_count, 1);
    assert_non_null(strstr(l.kernels[0].name, "gemv_bf16_f8e4m3_bf16_k128_g128_af8_"));
    assert_int_equal(l.fused_max_tokens, IR_GEMV_MAX_TOKENS);
    assert_false(l.scaled_gemm);
    arena_free(&a);
    case_free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_quantize_kernel),
        cmocka_unit_test(test_quantize_hand_values),
        cmocka_unit_test(test_norm_quantize_kernel),
        cmocka_unit_test(test_dequant_gemm_from_codes),
        cmocka_unit_test(test_dequant_gemm_codes_refused),
        cmocka_unit_test(test_codes_kernels_ptx),
        cmocka_unit_test(test_lowering_act_codes),
        cmocka_unit_test(test_gemv_group_refuses_quantize_output),
    };
    const char *filter = getenv("SMELT_TEST_FILTER"); /* as test_emit's: SMELT_TEST_FILTER=test_lowering* */
    if (filter && *filter) cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, harness_setup, harness_teardown);
}
