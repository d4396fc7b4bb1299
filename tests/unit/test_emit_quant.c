/* test_emit_quant.c - the GEMV kernel on quantized weights (int4 with zero
 * points in groups, int8 and E4M3 per output channel): compiled by NVRTC for
 * sm_80 and sm_90 (no spills) and run on the host simulator against the
 * reference on the same weights dequantized as quant_value defines, with
 * f32 activations so that the tolerance is f32's. Shapes on both of the
 * kernel's paths — K a multiple of the 128-bit load (32 int4 or 16 int8
 * codes) and K that is not (one code at a time) — with row counts and
 * groups per row that are odd (zero points straddling bytes), token counts
 * inside one tile and across two, the fused prologue and epilogues, a
 * quantized matmul alone (which serves every step: prefill included) and
 * column scales (AWQ's). The act-order group index is emitted but untested:
 * no quantizer here makes one yet (GPTQ's will). Under the fp8 W8A8 preset
 * the precision pass inserts a quantize before each matmul (its codes the
 * matmul's act_codes operands): a group holds it as fuse groups it
 * (group_of), and the W8A8 GEMM tests, of the kernel that codes x itself,
 * take the codes off (strip_act_codes). And the embedding kernel
 * on the int4 presets' int8 token-embedding table (one scale per row),
 * against hand-computed rows and against the reference. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "emit_harness.c"

typedef struct quant_case {
    const char *preset;
    int64_t group_size;
    const char *act_quant; /* int8, fp8: "none" weight-only (W8A16), NULL W8A8 per token */
} quant_case;

/* int8 W8A8 has SmoothQuant's column scales (random here: fill_operand) and
 * both W8A8 presets quantize each token's row of x in the kernel, as the
 * reference does (ir/ops.def, matmul act_quant). */
static const quant_case presets[] = {{"int4-rtn", 32, NULL}, {"int4-rtn", 128, NULL}, {"int8", 0, "none"},
                                     {"fp8", 0, "none"},     {"int8", 0, NULL},       {"fp8", 0, NULL}};

static emit_case *quant_case_new(const quant_case *q) {
    emit_case *c = case_new(q->preset);
    c->activations = "f32";
    c->group_size = q->group_size;
    c->act_quant = q->act_quant;
    return c;
}

/* Makes matmul `op` code its x itself again (W8A8 without act_codes, the
 * GEMM and GEMV of int8 and of FP8 weights with column scales): the
 * precision pass gives every fp8 W8A8 matmul whose weight has no column
 * scales the codes and scales of a quantize of x as its last two operands
 * (passes/precision_act_codes.c); a test of the kernels that code x takes
 * them off after case_infer. The quantize stays, unread. */
static void strip_act_codes(emit_case *c, uint32_t op) {
    ir_value_id codes, scales;
    assert_true(ir_matmul_act_codes(&c->m, op, &codes, &scales));
    c->m.ops[op].operand_count -= 2;
    assert_true(ir_op_set_bool(&c->m, op, "act_codes", false));
}

/* The op of value v now: the precision pass (case_infer) inserts a quantize
 * before each fp8 W8A8 matmul, which moves the ops after it; values keep
 * their ids, so an op is found again by its result. */
static uint32_t op_of(const emit_case *c, ir_value_id v) { return c->m.values[v].def_op; }

/* The group of the ops defining results[0..count) (after case_infer), with
 * the quantizes its act_codes matmuls read (the fp8 W8A8 preset's: the
 * precision pass inserts them), as fuse groups them (passes/fuse.c: a
 * quantize goes in the group of the matmuls that read it); in module order.
 * Returns the op count. */
static uint32_t group_of(const emit_case *c, const ir_value_id *results, uint32_t count, uint32_t *ops) {
    uint32_t n = 0;
    for (uint32_t i = 0; i < count; i++) {
        uint32_t op = op_of(c, results[i]);
        ops[n++] = op;
        ir_value_id codes, scales;
        if (c->m.ops[op].kind != IR_OP_MATMUL || !ir_matmul_act_codes(&c->m, op, &codes, &scales)) continue;
        bool seen = false;
        for (uint32_t k = 0; k < n; k++)
            seen |= ops[k] == op_of(c, codes);
        if (!seen) ops[n++] = op_of(c, codes);
    }
    for (uint32_t i = 1; i < n; i++) /* module order: insertion sort */
        for (uint32_t k = i; k > 0 && ops[k - 1] > ops[k]; k--) {
            uint32_t t = ops[k];
            ops[k] = ops[k - 1];
            ops[k - 1] = t;
        }
    return n;
}

/* rms_norm then Q (rope) and V (bias, an odd row count): one kernel. K = 96
 * (3 groups of 32 per row, the 128-bit path) and K = 40 (one group of 40,
 * one code at a time). */
static void test_gemv_quantized_norm_rope_bias(void **state) {
    (void)state;
    const int32_t positions[7] = {0, 5, 17, 300, 2, 9, 40};
    const int64_t widths[2] = {96, 40};
    for (size_t p = 0; p < sizeof presets / sizeof presets[0]; p++)
        for (int w = 0; w < 2; w++) {
            emit_case *c = quant_case_new(&presets[p]);
            ir_value_id h = case_inputf(c, "h", "f32[tokens, %lld]", (long long)widths[w]);
            ir_value_id g = case_weightf(c, "f32[%lld]", (long long)widths[w]);
            ir_value_id wq = case_weightf(c, "f32[32, %lld]", (long long)widths[w]);
            ir_value_id wv = case_weightf(c, "f32[13, %lld]", (long long)widths[w]),
                        bv = case_weight(c, "f32[13]");
            uint32_t ops[6], n = 0;
            ops[n++] = case_op(c, IR_OP_RMS_NORM, (ir_value_id[]){h, g}, 2);
            ir_op_set_float(&c->m, ops[0], "eps", 1e-5);
            ir_value_id x = case_result(c, ops[0]);
            uint32_t q = ops[n++] = case_op(c, IR_OP_MATMUL, (ir_value_id[]){x, wq}, 2);
            uint32_t v = ops[n++] = case_op(c, IR_OP_MATMUL, (ir_value_id[]){x, wv}, 2);
            uint32_t vb = ops[n++] = case_op(c, IR_OP_ADD, (ir_value_id[]){case_result(c, v), bv}, 2);
            ir_dim dims[3] = {ir_dim_symbol(ir_find_symbol(&c->m, "tokens")), ir_dim_const(2),
                              ir_dim_const(16)};
            uint32_t q3 = ops[n++] = case_op(c, IR_OP_RESHAPE, (ir_value_id[]){case_result(c, q)}, 1);
            assert_true(
                ir_op_set_attr(&c->m, q3, "shape", &(ir_attr){.kind = IR_ATTR_SHAPE, .as.shape = {3, dims}}));
            uint32_t qr = ops[n++] = case_op(c, IR_OP_ROPE, (ir_value_id[]){case_result(c, q3), c->pos}, 2);
            ir_op_set_float(&c->m, qr, "theta", 10000.0);
            ir_value_id made[6];
            for (uint32_t i = 0; i < n; i++)
                made[i] = case_result(c, ops[i]);
            const ir_value_id outputs[2] = {case_result(c, qr), case_result(c, vb)};
            case_infer(c);
            uint32_t group[8], count = group_of(c, made, n, group);
            quant_format f;
            if (!ir_weight_quant(&c->m, c->m.values[wq].def_op,
                                 &f)) { /* int4 groups of 32 do not divide 40 */
                assert_true(presets[p].group_size == 32 && widths[w] == 40);
                case_free(c);
                continue;
            }
            const int64_t token_counts[3] = {1, 4, 7};
            for (int t = 0; t < 3; t++) {
                case_set_ints_data(c, c->pos, token_counts[t], positions, (uint64_t)token_counts[t]);
                case_run_group(c, group, count, outputs, 2, token_counts[t], F32_TOLERANCE);
            }
            case_free(c);
        }
}

/* gate/up + SwiGLU with a residual o_proj before it (K = 64 and K = 48). */
static void test_gemv_quantized_residual_and_swiglu(void **state) {
    (void)state;
    for (size_t p = 0; p < sizeof presets / sizeof presets[0]; p++) {
        emit_case *c = quant_case_new(&presets[p]);
        ir_value_id a = case_input(c, "a", "f32[tokens, 64]"), h = case_input(c, "h", "f32[tokens, 48]");
        ir_value_id wo = case_weight(c, "f32[48, 64]");
        uint32_t o = case_op(c, IR_OP_MATMUL, (ir_value_id[]){a, wo}, 2);
        uint32_t residual = case_op(c, IR_OP_ADD, (ir_value_id[]){h, case_result(c, o)}, 2);
        ir_value_id wg = case_weight(c, "f32[40, 48]"), wu = case_weight(c, "f32[40, 48]");
        ir_value_id y = case_result(c, residual);
        uint32_t gate = case_op(c, IR_OP_MATMUL, (ir_value_id[]){y, wg}, 2);
        uint32_t up = case_op(c, IR_OP_MATMUL, (ir_value_id[]){y, wu}, 2);
        uint32_t silu = case_op(c, IR_OP_SILU, (ir_value_id[]){case_result(c, gate)}, 1);
        uint32_t mul = case_op(c, IR_OP_MUL, (ir_value_id[]){case_result(c, silu), case_result(c, up)}, 2);
        const ir_value_id first_made[2] = {case_result(c, o), case_result(c, residual)};
        const ir_value_id second_made[4] = {case_result(c, gate), case_result(c, up), case_result(c, silu),
                                            case_result(c, mul)};
        case_infer(c);
        uint32_t first[3], second[5];
        uint32_t first_count = group_of(c, first_made, 2, first),
                 second_count = group_of(c, second_made, 4, second);
        const ir_value_id first_out = first_made[1], second_out = second_made[3];
        for (int64_t t = 1; t <= 6; t += 5) {
            case_run_group(c, first, first_count, &first_out, 1, t, F32_TOLERANCE);
            case_run_group(c, second, second_count, &second_out, 1, t, F32_TOLERANCE);
        }
        case_free(c);
    }
}

/* A quantized matmul alone: the GEMV kernel at every token count (a
 * prefill of 9 tokens: three tiles), odd N, K = 256 and K = 24. */
static void test_quantized_matmul_alone(void **state) {
    (void)state;
    const int64_t widths[2] = {256, 24};
    for (size_t p = 0; p < sizeof presets / sizeof presets[0]; p++)
        for (int w = 0; w < 2; w++) {
            emit_case *c = quant_case_new(&presets[p]);
            ir_value_id x = case_inputf(c, "x", "f32[tokens, %lld]", (long long)widths[w]);
            ir_value_id wt = case_weightf(c, "f32[21, %lld]", (long long)widths[w]);
            const ir_value_id out = case_result(c, case_op(c, IR_OP_MATMUL, (ir_value_id[]){x, wt}, 2));
            case_infer(c);
            quant_format f;
            if (!ir_weight_quant(&c->m, c->m.values[wt].def_op,
                                 &f)) { /* int4 groups of 32 do not divide 24 */
                assert_true(presets[p].group_size == 32 && widths[w] == 24);
                case_free(c);
                continue;
            }
            uint32_t ops[2], count = group_of(c, &out, 1, ops); /* fp8 W8A8: {quantize, matmul} */
            for (int64_t t = 1; t <= 9; t += 4)
                case_run_group(c, ops, count, &out, 1, t, F32_TOLERANCE);
            case_free(c);
        }
}

/* Column scales (AWQ's and SmoothQuant's c[k], quant/quant.h): the kernel
 * multiplies each dequantized weight by its column's scale; the 128-bit
 * path (K = 64) and the one-code path (K = 20), in a fused norm + matmul. */
static void test_gemv_quantized_column_scales(void **state) {
    (void)state;
    const int64_t widths[2] = {64, 20};
    for (int w = 0; w < 2; w++) {
        emit_case *c = quant_case_new(&presets[1]); /* int4, groups of up to 128 */
        ir_value_id h = case_inputf(c, "h", "f32[tokens, %lld]", (long long)widths[w]);
        ir_value_id g = case_weightf(c, "f32[%lld]", (long long)widths[w]);
        ir_value_id wt = case_weightf(c, "f32[11, %lld]", (long long)widths[w]);
        uint32_t norm = case_op(c, IR_OP_RMS_NORM, (ir_value_id[]){h, g}, 2);
        ir_op_set_float(&c->m, norm, "eps", 1e-5);
        uint32_t op = case_op(c, IR_OP_MATMUL, (ir_value_id[]){case_result(c, norm), wt}, 2);
        case_infer(c);
        uint32_t weight = c->m.values[wt].def_op;
        quant_format f;
        assert_true(ir_weight_quant(&c->m, weight, &f));
        f.has_column_scale = true;
        f.method = QUANT_METHOD_AWQ;
        ir_weight_set_quant(&c->m, weight, &f);
        assert_true(ir_verify(&c->m, &c->d));
        const uint32_t ops[2] = {norm, op};
        const ir_value_id out = case_result(c, op);
        for (int64_t t = 1; t <= 5; t += 4)
            case_run_group(c, ops, 2, &out, 1, t, F32_TOLERANCE);
        case_free(c);
    }
}

/* With f16 activations (--act f16): the fused norm + quantized matmul and
 * the matmul alone read f16 inputs and store f16 results, within the f16
 * storage tolerance (emit_harness.c), for every format, on both load paths
 * (K = 64, K = 24: int4 groups of 32 do not divide 24, so that weight stays
 * f16 and runs the plain f16 GEMV). */
static void test_gemv_quantized_f16_activations(void **state) {
    (void)state;
    const int64_t widths[2] = {64, 24};
    for (size_t p = 0; p < sizeof presets / sizeof presets[0]; p++)
        for (int w = 0; w < 2; w++) {
            emit_case *c = quant_case_new(&presets[p]);
            c->activations = "f16";
            ir_value_id h = case_inputf(c, "h", "f32[tokens, %lld]", (long long)widths[w]);
            ir_value_id g = case_weightf(c, "f32[%lld]", (long long)widths[w]);
            ir_value_id wt = case_weightf(c, "f32[19, %lld]", (long long)widths[w]);
            ir_value_id alone = case_weightf(c, "f32[19, %lld]", (long long)widths[w]);
            uint32_t norm = case_op(c, IR_OP_RMS_NORM, (ir_value_id[]){h, g}, 2);
            ir_op_set_float(&c->m, norm, "eps", 1e-5);
            uint32_t op = case_op(c, IR_OP_MATMUL, (ir_value_id[]){case_result(c, norm), wt}, 2);
            uint32_t single = case_op(c, IR_OP_MATMUL, (ir_value_id[]){h, alone}, 2);
            const ir_value_id made[2] = {case_result(c, norm), case_result(c, op)};
            const ir_value_id out = made[1], single_out = case_result(c, single);
            case_infer(c);
            assert_int_equal(cg_storage_dtype(&c->m, h), SMELT_DTYPE_F16);
            assert_int_equal(cg_storage_dtype(&c->m, out), SMELT_DTYPE_F16);
            assert_int_equal(cg_storage_dtype(&c->m, g), SMELT_DTYPE_F16);
            quant_format f;
            bool quantized = ir_weight_quant(&c->m, c->m.values[wt].def_op, &f);
            assert_true(quantized || (presets[p].group_size == 32 && widths[w] == 24));
            uint32_t ops[3], singles[2];
            uint32_t count = group_of(c, made, 2, ops), single_count = group_of(c, &single_out, 1, singles);
            for (int64_t t = 1; t <= 9; t += 4) {
                case_run_group(c, ops, count, &out, 1, t, F32_TOLERANCE);
                case_run_group(c, singles, single_count, &single_out, 1, t, F32_TOLERANCE);
            }
            case_free(c);
        }
}

/* W8A8 on the warp-shared path: enough rows (2304 units, more than 132 SMs
 * x 16) that a unit takes LANES lanes, whose activation absmax and integer
 * (int8) or f32 (E4M3) sums reduce across them by shuffles; with a norm
 * prologue (its sum of squares reduced alike), at 1 and 6 tokens. */
static void test_w8a8_warp_lanes(void **state) {
    (void)state;
    for (size_t p = 4; p < sizeof presets / sizeof presets[0]; p++) {
        emit_case *c = quant_case_new(&presets[p]);
        ir_value_id h = case_input(c, "h", "f32[tokens, 64]");
        ir_value_id g = case_weight(c, "f32[64]"), wt = case_weight(c, "f32[2304, 64]");
        uint32_t norm = case_op(c, IR_OP_RMS_NORM, (ir_value_id[]){h, g}, 2);
        ir_op_set_float(&c->m, norm, "eps", 1e-5);
        uint32_t op = case_op(c, IR_OP_MATMUL, (ir_value_id[]){case_result(c, norm), wt}, 2);
        const ir_value_id made[2] = {case_result(c, norm), case_result(c, op)}, out = made[1];
        case_infer(c);
        assert_string_not_equal(ir_op_string(&c->m, op_of(c, out), "act_quant"), "none");
        uint32_t ops[3], count = group_of(c, made, 2, ops);
        for (int64_t t = 1; t <= 6; t += 5)
            case_run_group(c, ops, count, &out, 1, t, F32_TOLERANCE);
        case_free(c);
    }
}

/* ---- the tensor-core dequantize-GEMM (emit_dequant_gemm.c) ------------------------------ */

/* x[tokens, K] times an [N, K] weight (+ a bias[N]): the op into *op, the
 * weight's value returned, the case's types inferred. */
static ir_value_id matmul_alone(emit_case *c, int64_t n, int64_t k, bool bias, uint32_t *op) {
    ir_value_id x = case_inputf(c, "x", "f32[tokens, %lld]", (long long)k);
    ir_value_id wt = case_weightf(c, "f32[%lld, %lld]", (long long)n, (long long)k);
    ir_value_id b = bias ? case_weightf(c, "f32[%lld]", (long long)n) : IR_NO_VALUE;
    ir_value_id out = case_result(c, case_op(c, IR_OP_MATMUL, (ir_value_id[]){x, wt, b}, bias ? 3 : 2));
    case_infer(c);
    *op = op_of(c, out); /* after the quantize precision inserts before an fp8 W8A8 one */
    return wt;
}

/* A quantized matmul alone whose int4 codes are interleaved (K a multiple
 * of 128): the GEMV for steps of up to 4 tokens, the dequantize-GEMM above. */
static emit_case *dequant_case_of(const char *preset, const char *activations, int64_t group, int64_t n,
                                  int64_t k, bool bias, bool zero, bool column_scale, uint32_t *op) {
    emit_case *c = case_new(preset);
    c->activations = activations;
    c->group_size = group;
    if (strcmp(preset, "int4-rtn") != 0) c->act_quant = "none"; /* int8, fp8 weight-only (W8A8: w8a8_case) */
    ir_value_id wt = matmul_alone(c, n, k, bias, op);
    uint32_t weight = c->m.values[wt].def_op;
    quant_format f;
    assert_true(ir_weight_quant(&c->m, weight, &f));
    assert_true(f.interleaved == (f.kind == QUANT_INT4)); /* precision chose layout mma_k16 for int4 */
    assert_int_equal(f.group, (uint32_t)(f.kind == QUANT_INT4 ? group : k));
    f.has_zero = zero && f.kind == QUANT_INT4;
    if (column_scale) f.has_column_scale = true, f.method = QUANT_METHOD_AWQ;
    ir_weight_set_quant(&c->m, weight, &f);
    assert_true(ir_verify(&c->m, &c->d));
    return c;
}

static emit_case *dequant_case(const char *activations, int64_t group, int64_t n, int64_t k, bool bias,
                               bool zero, bool column_scale, uint32_t *op) {
    return dequant_case_of("int4-rtn", activations, group, n, k, bias, zero, column_scale, op);
}

/* The kernels of such a matmul: the GEMV up to 4 tokens, the GEMM from 5. */
static void check_dequant_lowering(emit_case *c, uint32_t op) {
    arena a;
    arena_init(&a);
    cg_group_lowering l;
    assert_true(case_emit(c, op, &a, &l));
    assert_int_equal(l.kernel_count, 2);
    assert_non_null(strstr(l.kernels[0].name, "gemv_"));
    assert_int_equal(l.kernels[0].max_tokens, IR_GEMV_MAX_TOKENS);
    assert_non_null(strstr(l.kernels[1].name, "dequant_gemm_"));
    assert_int_equal(l.kernels[1].min_tokens, IR_GEMV_MAX_TOKENS + 1);
    assert_true(l.kernels[1].tensor_cores);
    arena_free(&a);
}

/* Against the reference on the same weights dequantized as quant_value
 * defines: f32 activations (A split in two bf16 parts: f32's tolerance) and
 * bf16 ones (A by ldmatrix); token counts inside one 64-row tile, across
 * two and three and not a multiple of it; N a multiple of the 64-row tile
 * and not; one k-block and three; groups of 32, 64 and 128 columns; with
 * and without zero points, column scales and a bias. */
static void test_dequant_gemm(void **state) {
    (void)state;
    typedef struct shape {
        const char *activations;
        int64_t group, n, k;
        bool bias, zero, column_scale;
    } shape;
    const shape shapes[] = {
        {"f32", 128, 64, 128, false, true, false},  {"f32", 32, 96, 384, true, true, false},
        {"f32", 64, 70, 256, false, false, false},  {"f32", 128, 48, 256, false, true, true},
        {"bf16", 128, 64, 128, false, true, false}, {"bf16", 32, 130, 256, true, true, false},
        {"bf16", 64, 64, 384, false, false, true},
    };
    /* 3: the GEMV; 5: the GEMM on a part of one tile; 70 and 130: two and three tiles, the last partial */
    const int64_t token_counts[] = {3, 70, 5, 130};
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const shape *s = &shapes[i];
        uint32_t op;
        emit_case *c =
            dequant_case(s->activations, s->group, s->n, s->k, s->bias, s->zero, s->column_scale, &op);
        check_dequant_lowering(c, op);
        double tolerance = strcmp(s->activations, "f32") == 0 ? F32_TOLERANCE : BF16_TOLERANCE;
        const ir_value_id out = case_result(c, op);
        for (size_t t = 0; t < (i < 2 ? 4u : 2u); t++) /* the simulator is slow: all four for two shapes */
            case_run_group(c, &op, 1, &out, 1, token_counts[t], tolerance);
        case_free(c);
    }
}

/* The adds after a quantized matmul in a fused group, which the steps
 * above 4 tokens run op by op: the dequantize-GEMM takes a residual (o and
 * down) and a bias before it (Qwen2's q/k/v bias is an add) in its
 * epilogue (cg_emit_dequant_gemm_epilogue, as codegen/lower.c hands them
 * over), one kernel writing the last add's result. */
static bool emit_with_adds(const ir_module *m, const cg_group *g, arena *a, cg_group_lowering *out,
                           diag_engine *d) {
    return cg_emit_dequant_gemm_epilogue(m, g->ops, g->op_count, a, out, d);
}

static void test_dequant_gemm_epilogue(void **state) {
    (void)state;
    for (int act = 0; act < 2; act++)
        for (int with_bias = 0; with_bias < 2; with_bias++) {
            emit_case *c = case_new("int4-rtn");
            c->activations = act ? "bf16" : "f32";
            c->group_size = 64;
            ir_value_id x = case_input(c, "x", "f32[tokens, 256]");
            ir_value_id h = case_input(c, "h", "f32[tokens, 80]");
            ir_value_id wt = case_weight(c, "f32[80, 256]"), bias = case_weight(c, "f32[80]");
            uint32_t ops[3], n = 0;
            ops[n++] = case_op(c, IR_OP_MATMUL, (ir_value_id[]){x, wt}, 2);
            ir_value_id y = case_result(c, ops[0]);
            if (with_bias) {
                ops[n++] = case_op(c, IR_OP_ADD, (ir_value_id[]){y, bias}, 2);
                y = case_result(c, ops[1]);
            }
            ops[n++] = case_op(c, IR_OP_ADD, (ir_value_id[]){h, y}, 2); /* residual first, as Llama adds it */
            case_infer(c);
            assert_true(cg_dequant_gemm_fits(&c->m, ops[0]));
            arena a;
            arena_init(&a);
            cg_group_lowering l;
            assert_true(cg_emit_dequant_gemm_epilogue(&c->m, ops, n, &a, &l, &c->d));
            assert_int_equal(l.kernel_count, 1);
            assert_non_null(strstr(l.kernels[0].name, with_bias ? "_bias_residual_" : "_residual_"));
            arena_free(&a);
            const ir_value_id out = case_result(c, ops[n - 1]);
            const int64_t token_counts[2] = {5, 70};
            for (int t = 0; t < 2; t++)
                case_run_group_emitted(c, ops, n, &out, 1, token_counts[t],
                                       act ? BF16_TOLERANCE : F32_TOLERANCE, emit_with_adds);
            case_free(c);
        }
}

/* int8 and E4M3 weights (one scale per output channel; SmoothQuant-like
 * column scales on one) in the same kernel over row-major byte codes. */
static void test_dequant_gemm_bytes(void **state) {
    (void)state;
    const char *const byte_presets[2] = {"int8", "fp8"};
    for (int p = 0; p < 2; p++)
        for (int shape = 0; shape < 3; shape++) {
            uint32_t op;
            const char *activations = shape == 1 ? "bf16" : "f32";
            emit_case *c = dequant_case_of(byte_presets[p], activations, 0, shape == 0 ? 70 : 64,
                                           shape == 0 ? 256 : 128, shape == 1, false, shape == 2, &op);
            check_dequant_lowering(c, op);
            double tolerance = shape == 1 ? BF16_TOLERANCE : F32_TOLERANCE;
            const ir_value_id out = case_result(c, op);
            const int64_t token_counts[2] = {3, 70};
            for (int t = 0; t < 2; t++)
                case_run_group(c, &op, 1, &out, 1, token_counts[t], tolerance);
            case_free(c);
        }
}

/* A W8A8 matmul (act_quant, ir/ops.def) of `preset`'s codes (int8 with
 * SmoothQuant's column scales, or E4M3), per token, or per tensor at
 * static_scale when it is > 0 (set on the op as precision sets a
 * calibrated one). */
static emit_case *w8a8_case(const char *preset, const char *activations, int64_t n, int64_t k, bool bias,
                            double static_scale, uint32_t *op) {
    emit_case *c = case_new(preset);
    c->activations = activations;
    ir_value_id wt = matmul_alone(c, n, k, bias, op);
    /* the kernels that code x themselves: fp8's matmul reads a quantize's codes since precision inserts
     * one (test_emit_act_codes.c tests that path against this one, bit for bit) */
    if (strcmp(preset, "fp8") == 0) strip_act_codes(c, *op);
    assert_string_equal(ir_op_string(&c->m, *op, "act_quant"), strcmp(preset, "int8") == 0 ? "i8" : "f8e4m3");
    assert_string_equal(ir_op_string(&c->m, *op, "act_scale"), "token");
    quant_format f;
    assert_true(ir_weight_quant(&c->m, c->m.values[wt].def_op, &f));
    assert_true(f.has_column_scale == (strcmp(preset, "int8") == 0)); /* SmoothQuant's */
    if (static_scale > 0.0) {
        assert_true(ir_op_set_string(&c->m, *op, "act_scale", "tensor"));
        assert_true(ir_op_set_float(&c->m, *op, "act_scale_value", static_scale));
    }
    assert_true(ir_verify(&c->m, &c->d));
    assert_true(cg_dequant_gemm_fits(&c->m, *op));
    return c;
}

/* W8A8 matmuls run the dequantize-GEMM above 4 tokens (the activations'
 * codes on the tensor cores) and match the reference's
 * matmul_quantized_activations: int8 (column scales) and E4M3, per token
 * and per tensor (a static scale small enough that E4M3 codes saturate at
 * 448 and int8 ones clamp at 127), f32 and bf16 activations, 70 tokens
 * (two tiles, the second partial) with a row of zeros in each tile (scale
 * 1, codes 0: the bias alone), N a multiple of the tile and not, one
 * k-block and three. */
static void test_dequant_gemm_w8a8(void **state) {
    (void)state;
    typedef struct shape {
        const char *preset, *activations;
        int64_t n, k;
        bool bias;
        double static_scale;
        const char *tag; /* in the GEMM's name */
    } shape;
    const shape shapes[] = {
        {"int8", "f32", 70, 256, true, 0.0, "_ai8_bias"}, {"int8", "bf16", 64, 128, false, 0.0, "_ai8_"},
        {"fp8", "f32", 96, 384, false, 0.0, "_af8_"},     {"fp8", "bf16", 130, 128, true, 0.0, "_af8_bias"},
        {"fp8", "f32", 64, 128, false, 0.0025, "_af8s_"}, {"fp8", "bf16", 70, 128, true, 0.02, "_af8s_bias"},
        {"int8", "f32", 64, 128, true, 0.01, "_ai8s_"},
    };
    enum { TOKENS = 70 };
    for (size_t i = 0; i < sizeof shapes / sizeof shapes[0]; i++) {
        const shape *s = &shapes[i];
        uint32_t op;
        emit_case *c = w8a8_case(s->preset, s->activations, s->n, s->k, s->bias, s->static_scale, &op);
        check_dequant_lowering(c, op);
        arena a;
        arena_init(&a);
        cg_group_lowering l;
        assert_true(case_emit(c, op, &a, &l));
        assert_non_null(strstr(l.kernels[1].name, s->tag));
        arena_free(&a);
        /* rows 3 and 66 zeros, the rest in [-2, 2) */
        ir_value_id x = c->m.ops[op].operands[0];
        float *data = malloc(TOKENS * (size_t)s->k * sizeof *data);
        for (int64_t j = 0; j < TOKENS * s->k; j++)
            data[j] = j / s->k == 3 || j / s->k == 66 ? 0.0f : next_uniform(c);
        case_set_floats(c, x, TOKENS, data, (uint64_t)(TOKENS * s->k));
        free(data);
        double tolerance = strcmp(s->activations, "f32") == 0 ? F32_TOLERANCE : BF16_TOLERANCE;
        const ir_value_id out = case_result(c, op);
        case_run_group(c, &op, 1, &out, 1, TOKENS, tolerance);
        if (i == 0) case_run_group(c, &op, 1, &out, 1, 5, tolerance); /* a part of one tile */
        case_free(c);
    }
}

/* Act-order and K not a multiple of 128 keep the row-major codes and the
 * GEMV at every step; so does a plan of at most 4 tokens a step. */
static void test_dequant_gemm_refused(void **state) {
    (void)state;
    emit_case *c = case_new("int4-rtn");
    c->activations = "f32";
    ir_value_id x = case_input(c, "x", "f32[tokens, 96]");
    ir_value_id wt = case_weight(c, "f32[16, 96]");
    uint32_t op = case_op(c, IR_OP_MATMUL, (ir_value_id[]){x, wt}, 2);
    case_infer(c);
    quant_format f;
    assert_true(ir_weight_quant(&c->m, c->m.values[wt].def_op, &f));
    assert_false(f.interleaved);
    arena a;
    arena_init(&a);
    cg_group_lowering l;
    assert_true(case_emit(c, op, &a, &l));
    assert_int_equal(l.kernel_count, 1);
    assert_int_equal(l.kernels[0].max_tokens, 0);
    arena_free(&a);
    case_free(c);
}

/* What NVRTC makes of the dequantize-GEMM of Llama-3-8B's down projection
 * (K 14336, N 4096, groups of 128, bf16): no spills on sm_90, mma.sync and
 * ldmatrix and cp.async in its PTX. */
static void test_dequant_gemm_ptx_for_sm90(void **state) {
    (void)state;
    if (!harness_have_nvrtc) skip();
    uint32_t op;
    emit_case *c = dequant_case("bf16", 128, 4096, 14336, false, true, false, &op);
    arena a;
    arena_init(&a);
    cg_group_lowering l;
    assert_true(case_emit(c, op, &a, &l));
    assert_int_equal(l.kernel_count, 2);
    cg_compiled compiled;
    compile_ptx_for_sm90(&l.kernels[1], &compiled);
    assert_non_null(strstr(compiled.ptx, "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"));
    assert_non_null(strstr(compiled.ptx, "ldmatrix.sync.aligned.m8n8.x4.shared.b16"));
    assert_non_null(strstr(compiled.ptx, "cp.async.cg.shared.global"));
    assert_non_null(strstr(compiled.ptx, "cp.async.wait_group 1"));
    cg_compiled_free(&compiled);
    arena_free(&a);
    case_free(c);
}

/* What NVRTC makes of the W8A8 GEMM of Llama-3-8B's fp8 projections (K
 * and N 4096, bf16 activations, per token): no spills on sm_80 and sm_90,
 * and A by ldmatrix from the tile of codes each block writes once per
 * k-block (not coded by each warp from its fragments). */
static void test_dequant_gemm_w8a8_ptx(void **state) {
    (void)state;
    if (!harness_have_nvrtc) skip();
    uint32_t op;
    emit_case *c = w8a8_case("fp8", "bf16", 4096, 4096, false, 0.0, &op);
    arena a;
    arena_init(&a);
    cg_group_lowering l;
    assert_true(case_emit(c, op, &a, &l));
    assert_int_equal(l.kernel_count, 2);
    compile_for_gpus(&l.kernels[1]);
    cg_compiled compiled;
    compile_ptx_for_sm90(&l.kernels[1], &compiled);
    assert_non_null(strstr(compiled.ptx, "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"));
    assert_non_null(strstr(compiled.ptx, "ldmatrix.sync.aligned.m8n8.x4.shared.b16"));
    cg_compiled_free(&compiled);
    arena_free(&a);
    case_free(c);
}

/* ---- the token-embedding table of the int4 presets: int8, one scale a row ---------------- */

/* A table of 4 rows of 8, hand-picked so that every scale is exact: the
 * rows' max |w| of 127, 63.5, 0 and 254 give s = max / 127 = 1, 0.5, 1 (a
 * row of zeros) and 2; and what each element dequantizes to, rint(w / s) * s
 * (3.4 -> 3, 1.3 / 0.5 = 2.6 -> 3 -> 1.5, 10.6 / 0.5 = 21.2 -> 21 -> 10.5,
 * 0.9 / 2 = 0.45 -> 0, -3.2 / 2 = -1.6 -> -2 -> -4, ...). */
static const float embedding_table[4][8] = {
    {127, -127, 0, 1, -2, 50, 3.4f, -0.6f},
    {-63.5f, 63.5f, 1.3f, -1.3f, 0.2f, 10.6f, -0.2f, 31},
    {0, 0, 0, 0, 0, 0, 0, 0},
    {254, -254, 6.6f, -100.9f, 1.1f, 0.9f, 200.2f, -3.2f},
};
static const float embedding_scales[4] = {1, 0.5f, 1, 2};
static const float embedding_rows[4][8] = {
    {127, -127, 0, 1, -2, 50, 3, -1},
    {-63.5f, 63.5f, 1.5f, -1.5f, 0, 10.5f, 0, 31},
    {0, 0, 0, 0, 0, 0, 0, 0},
    {254, -254, 6, -100, 2, 0, 200, -4},
};

/* Under each int4 preset the table is int8 with one f16 scale per row; its
 * packed bytes are the codes above and those scales; the kernel's rows are
 * exactly the hand-computed ones (and the reference's, on quant_dequantize's
 * values); its modeled cost is D codes and a scale per id. */
static void test_embedding_int8_table(void **state) {
    (void)state;
    const char *const int4_presets[3] = {"int4-rtn", "int4-awq", "int4-gptq"};
    const int32_t ids[5] = {3, 0, 1, 2, 3};
    for (int p = 0; p < 3; p++) {
        emit_case *c = case_new(int4_presets[p]);
        c->activations = "f32";
        ir_value_id table = case_weight(c, "f32[4, 8]");
        uint32_t op = case_op(c, IR_OP_EMBEDDING, (ir_value_id[]){table, c->ids}, 2);
        case_infer(c);
        quant_format f;
        assert_true(ir_weight_quant(&c->m, c->m.values[table].def_op, &f));
        assert_int_equal(f.kind, QUANT_INT8);
        assert_int_equal(f.method, QUANT_METHOD_RTN);
        assert_int_equal(f.group, 8);
        assert_false(f.has_zero || f.has_group_index || f.has_column_scale || f.interleaved);
        case_set_floats(c, table, 5, &embedding_table[0][0], 32);
        case_set_ints_data(c, c->ids, 5, ids, 5);
        case_run(c, op, 5, F32_TOLERANCE);

        quant_layout l;
        assert_null(quant_layout_of(&f, 4, 8, &l));
        const uint8_t *packed = c->values[table].buffer;
        for (int r = 0; r < 4; r++) {
            uint16_t scale;
            memcpy(&scale, packed + l.scales + 2 * r, 2);
            assert_int_equal(scale, plan_f32_to_f16(embedding_scales[r]));
            for (int k = 0; k < 8; k++)
                assert_int_equal((int8_t)packed[r * 8 + k],
                                 (int)(embedding_rows[r][k] / embedding_scales[r]));
        }
        const float *out = c->values[case_result(c, op)].buffer;
        for (int t = 0; t < 5; t++)
            for (int k = 0; k < 8; k++)
                assert_float_equal(out[t * 8 + k], embedding_rows[ids[t]][k], 0.0f);

        arena a;
        arena_init(&a);
        cg_group_lowering lowering;
        assert_true(case_emit(c, op, &a, &lowering));
        assert_non_null(strstr(lowering.kernels[0].name, "embedding_i8_f32_v4_d8"));
        const prog_cost *cost = lowering.kernels[0].cost;
        assert_non_null(cost);
        assert_float_equal(cost->read.per_token, 8 + 2 + 4, 0.0); /* codes, scale, id */
        assert_float_equal(cost->written.per_token, 8 * 4, 0.0);
        arena_free(&a);
        case_free(c);
    }
}

/* Random tables against the reference: D = 300 (threads stride past 256),
 * bf16 and f32 activations, ids repeated and at both ends. */
static void test_embedding_int8_table_wide(void **state) {
    (void)state;
    const int32_t ids[6] = {36, 0, 17, 36, 5, 1};
    for (int bf16 = 0; bf16 < 2; bf16++) {
        emit_case *c = case_new("int4-rtn");
        c->activations = bf16 ? "bf16" : "f32";
        c->group_size = 32;
        ir_value_id table = case_weight(c, "f32[37, 300]");
        uint32_t op = case_op(c, IR_OP_EMBEDDING, (ir_value_id[]){table, c->ids}, 2);
        case_infer(c);
        quant_format f;
        assert_true(ir_weight_quant(&c->m, c->m.values[table].def_op, &f));
        assert_int_equal(f.group, 300); /* one scale per row whatever the int4 group size */
        for (int64_t t = 1; t <= 6; t += 5) {
            case_set_ints_data(c, c->ids, t, ids, (uint64_t)t);
            case_run(c, op, t, bf16 ? BF16_TOLERANCE : F32_TOLERANCE);
        }
        case_free(c);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_gemv_quantized_norm_rope_bias),
        cmocka_unit_test(test_gemv_quantized_residual_and_swiglu),
        cmocka_unit_test(test_quantized_matmul_alone),
        cmocka_unit_test(test_gemv_quantized_column_scales),
        cmocka_unit_test(test_gemv_quantized_f16_activations),
        cmocka_unit_test(test_w8a8_warp_lanes),
        cmocka_unit_test(test_dequant_gemm),
        cmocka_unit_test(test_dequant_gemm_bytes),
        cmocka_unit_test(test_dequant_gemm_epilogue),
        cmocka_unit_test(test_dequant_gemm_refused),
        cmocka_unit_test(test_dequant_gemm_w8a8),
        cmocka_unit_test(test_dequant_gemm_ptx_for_sm90),
        cmocka_unit_test(test_dequant_gemm_w8a8_ptx),
        cmocka_unit_test(test_embedding_int8_table),
        cmocka_unit_test(test_embedding_int8_table_wide),
    };
    return cmocka_run_group_tests(tests, harness_setup, harness_teardown);
}
