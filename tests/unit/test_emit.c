/* test_emit.c - the kernel emitters (codegen/emit.h), family by family: each
 * op's kernels are compiled by NVRTC for sm_80 and sm_90 (no errors, no
 * spills), built for the host and run on the simulator, and their results
 * checked against the reference backend's function for the op, with f32
 * and with bf16 storage (tolerances in emit_harness.c). Then what the
 * emitters promise besides numbers: names by specialisation, the storage
 * policy, the lowering of every op kind, and the errors. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "emit_harness.c"

#include <xxhash.h>

/* "f16": bf16 with f16 activations (--act f16; case_new). */
enum { PRECISION_COUNT = 3 };
static const char *const precisions[PRECISION_COUNT] = {"f32", "bf16", "f16"};

/* ---- elementwise ------------------------------------------------------------------------- */

/* add with a [D] weight (a trailing block), mul by a scalar const, add of two
 * operands broadcast against each other ([T, 1, 16] + [4, 1]), mul of equal shapes. */
static void test_add_mul_broadcasting(void **state) {
    (void)state;
    for (int p = 0; p < PRECISION_COUNT; p++) {
        emit_case *c = case_new(precisions[p]);
        ir_value_id x = case_input(c, "x", "f32[tokens, 4, 16]");
        ir_value_id w = case_weight(c, "f32[16]");
        uint32_t with_weight = case_op(c, IR_OP_ADD, (ir_value_id[]){x, w}, 2);
        uint32_t by_const = case_op(c, IR_OP_MUL, (ir_value_id[]){x, case_const(c, 0.5)}, 2);
        uint32_t const_first = case_op(c, IR_OP_ADD, (ir_value_id[]){case_const(c, -1.25), x}, 2);
        ir_value_id a = case_input(c, "a", "f32[tokens, 1, 16]");
        ir_value_id b = case_weight(c, "f32[4, 1]");
        uint32_t both = case_op(c, IR_OP_ADD, (ir_value_id[]){a, b}, 2);
        ir_value_id y = case_input(c, "y", "f32[tokens, 4, 16]");
        uint32_t same = case_op(c, IR_OP_MUL, (ir_value_id[]){x, y}, 2);
        case_infer(c);
        uint32_t ops[] = {with_weight, by_const, const_first, both, same};
        for (unsigned i = 0; i < 5; i++)
            case_run(c, ops[i], 3, F32_TOLERANCE);
        case_run(c, both, 1, F32_TOLERANCE);
        case_free(c);
    }
}

static void test_activations(void **state) {
    (void)state;
    for (int p = 0; p < PRECISION_COUNT; p++) {
        emit_case *c = case_new(precisions[p]);
        ir_value_id x = case_input(c, "x", "f32[tokens, 300]");
        uint32_t silu = case_op(c, IR_OP_SILU, &x, 1);
        uint32_t gelu_erf = case_op(c, IR_OP_GELU, &x, 1);
        uint32_t gelu_tanh = case_op(c, IR_OP_GELU, &x, 1);
        assert_true(ir_op_set_string(&c->m, gelu_tanh, "approximate", "tanh"));
        uint32_t tanh_op = case_op(c, IR_OP_TANH, &x, 1);
        uint32_t sigmoid = case_op(c, IR_OP_SIGMOID, &x, 1);
        case_infer(c);
        case_run(c, tanh_op, 3, F32_TOLERANCE);
        case_run(c, sigmoid, 3, F32_TOLERANCE);
        case_run(c, silu, 3, F32_TOLERANCE);
        case_run(c, gelu_erf, 3, F32_TOLERANCE);
        case_run(c, gelu_tanh, 3, F32_TOLERANCE);
        case_free(c);
    }
}

/* ---- norms ------------------------------------------------------------------------------ */

static void test_norms(void **state) {
    (void)state;
    for (int p = 0; p < PRECISION_COUNT; p++) {
        emit_case *c = case_new(precisions[p]);
        ir_value_id x = case_input(c, "x", "f32[tokens, 64]");
        uint32_t rms = case_op(c, IR_OP_RMS_NORM, (ir_value_id[]){x, case_weight(c, "f32[64]")}, 2);
        assert_true(ir_op_set_float(&c->m, rms, "eps", 1e-5));
        ir_value_id wide = case_input(c, "wide", "f32[tokens, 300]");
        uint32_t layer =
            case_op(c, IR_OP_LAYER_NORM,
                    (ir_value_id[]){wide, case_weight(c, "f32[300]"), case_weight(c, "f32[300]")}, 3);
        assert_true(ir_op_set_float(&c->m, layer, "eps", 1e-6));
        ir_value_id heads = case_input(c, "heads", "f32[tokens, 3, 20]");
        uint32_t no_bias = case_op(c, IR_OP_LAYER_NORM, (ir_value_id[]){heads, case_weight(c, "f32[20]")}, 2);
        assert_true(ir_op_set_float(&c->m, no_bias, "eps", 1e-5));
        uint32_t gemma = case_op(c, IR_OP_RMS_NORM, (ir_value_id[]){heads, case_weight(c, "f32[20]")}, 2);
        assert_true(ir_op_set_float(&c->m, gemma, "eps", 1e-6));
        assert_true(ir_op_set_float(&c->m, gemma, "offset", 1.0));
        case_infer(c);
        case_run(c, gemma, 3, F32_TOLERANCE);
        case_run(c, rms, 4, F32_TOLERANCE);
        case_run(c, layer, 4, F32_TOLERANCE);
        case_run(c, no_bias, 2, F32_TOLERANCE);
        case_free(c);
    }
}

/* ---- rope -------------------------------------------------------------------------------- */

static void test_rope(void **state) {
    (void)state;
    const int32_t positions[4] = {0, 7, 100, 3000};
    for (int p = 0; p < PRECISION_COUNT; p++) {
        emit_case *c = case_new(precisions[p]);
        ir_value_id x = case_input(c, "x", "f32[tokens, 3, 16]");
        uint32_t partial = case_op(c, IR_OP_ROPE, (ir_value_id[]){x, c->pos}, 2);
        assert_true(ir_op_set_float(&c->m, partial, "theta", 10000.0));
        assert_true(ir_op_set_int(&c->m, partial, "rotary_dim", 8));
        uint32_t interleaved = case_op(c, IR_OP_ROPE, (ir_value_id[]){x, c->pos}, 2);
        assert_true(ir_op_set_float(&c->m, interleaved, "theta", 500000.0));
        assert_true(ir_op_set_string(&c->m, interleaved, "style", "interleaved"));
        assert_true(ir_op_set_int(&c->m, interleaved, "rotary_dim", 12));
        uint32_t whole = case_op(c, IR_OP_ROPE, (ir_value_id[]){x, c->pos}, 2);
        assert_true(ir_op_set_float(&c->m, whole, "theta", 10000.0));
        case_infer(c);
        case_set_ints_data(c, c->pos, 4, positions, 4);
        case_run(c, partial, 4, F32_TOLERANCE);
        case_run(c, interleaved, 4, F32_TOLERANCE);
        case_run(c, whole, 4, F32_TOLERANCE);
        case_free(c);
    }
}

/* Scaled ropes of x [tokens, 3, 16] for test_rope_scaled and
 * test_rope_table: Llama 3's (original 64), yarn's (original 32) and
 * longrope's (half the dims rotated, original 8, four short and long
 * factors). */
static uint32_t rope_llama3(emit_case *c, ir_value_id x) {
    uint32_t op = case_op(c, IR_OP_ROPE, (ir_value_id[]){x, c->pos}, 2);
    assert_true(ir_op_set_float(&c->m, op, "theta", 500000.0));
    assert_true(ir_op_set_string(&c->m, op, "scaling", "llama3"));
    assert_true(ir_op_set_float(&c->m, op, "factor", 8.0));
    assert_true(ir_op_set_float(&c->m, op, "low_freq_factor", 1.0));
    assert_true(ir_op_set_float(&c->m, op, "high_freq_factor", 4.0));
    assert_true(ir_op_set_int(&c->m, op, "original_max_position_embeddings", 64));
    return op;
}

static uint32_t rope_yarn(emit_case *c, ir_value_id x) {
    uint32_t op = case_op(c, IR_OP_ROPE, (ir_value_id[]){x, c->pos}, 2);
    assert_true(ir_op_set_float(&c->m, op, "theta", 10000.0));
    assert_true(ir_op_set_string(&c->m, op, "scaling", "yarn"));
    assert_true(ir_op_set_float(&c->m, op, "factor", 4.0));
    assert_true(ir_op_set_int(&c->m, op, "original_max_position_embeddings", 32));
    return op;
}

static uint32_t rope_longrope(emit_case *c, ir_value_id x) {
    static double short_factor[4] = {1.0, 1.1, 1.3, 2.0}, long_factor[4] = {1.5, 3.0, 9.0, 40.0};
    uint32_t op = case_op(c, IR_OP_ROPE, (ir_value_id[]){x, c->pos}, 2);
    assert_true(ir_op_set_float(&c->m, op, "theta", 10000.0));
    assert_true(ir_op_set_float(&c->m, op, "partial_rotary_factor", 0.5));
    assert_true(ir_op_set_string(&c->m, op, "scaling", "longrope"));
    assert_true(ir_op_set_int(&c->m, op, "original_max_position_embeddings", 8));
    assert_true(ir_op_set_int(&c->m, op, "max_position_embeddings", 4096));
    ir_attr shorts = {.kind = IR_ATTR_FLOATS, .as.floats = {4, short_factor}};
    ir_attr longs = {.kind = IR_ATTR_FLOATS, .as.floats = {4, long_factor}};
    assert_true(ir_op_set_attr(&c->m, op, "short_factor", &shorts));
    assert_true(ir_op_set_attr(&c->m, op, "long_factor", &longs));
    return op;
}

/* The scaled variants (ir/rope.h): baked tables, the attention factor of
 * yarn and longrope, and longrope's choice of its long set when a step's
 * largest position passes original_max_position_embeddings (8 here): the
 * positions {0, 7, 100, 3000} take the long set, {0, 1, 2, 3} the short. */
static void test_rope_scaled(void **state) {
    (void)state;
    const int32_t far[4] = {0, 7, 100, 3000}, near[4] = {0, 1, 2, 3};
    for (int p = 0; p < PRECISION_COUNT; p++) {
        for (int step = 0; step < 2; step++) {
            emit_case *c = case_new(precisions[p]);
            ir_value_id x = case_input(c, "x", "f32[tokens, 3, 16]");
            uint32_t llama3 = rope_llama3(c, x), yarn = rope_yarn(c, x), longrope = rope_longrope(c, x);
            uint32_t linear = case_op(c, IR_OP_ROPE, (ir_value_id[]){x, c->pos}, 2);
            assert_true(ir_op_set_float(&c->m, linear, "theta", 10000.0));
            assert_true(ir_op_set_string(&c->m, linear, "scaling", "linear"));
            assert_true(ir_op_set_float(&c->m, linear, "factor", 4.0));
            case_infer(c);
            case_set_ints_data(c, c->pos, 4, step ? near : far, 4);
            case_run(c, llama3, 4, F32_TOLERANCE);
            case_run(c, yarn, 4, F32_TOLERANCE);
            case_run(c, longrope, 4, F32_TOLERANCE);
            case_run(c, linear, 4, F32_TOLERANCE);
            case_free(c);
        }
    }
}

/* Every attribute of `to`'s schema that `from` has, as fuse's
 * share_rope_tables copies them. */
static void copy_rope_attrs(emit_case *c, uint32_t from, uint32_t to) {
    const ir_op_info *info = ir_op_info_of(c->m.ops[to].kind);
    for (uint32_t a = 0; a < info->attr_count; a++) {
        const ir_attr *given = ir_op_attr(&c->m, from, info->attrs[a].name);
        if (given) assert_true(ir_op_set_attr(&c->m, to, info->attrs[a].name, given));
    }
}

/* The step's rope table (cos, sin per pair, computed once: emit_rope.c's
 * cg_emit_rope_table) against the reference for each variant, and a rope
 * reading it: against the reference, and bit for bit the rope that
 * computes its own angles (f32), so moving the angles into the table
 * changes no number. Positions that take longrope's long set and its short
 * one. */
static void test_rope_table(void **state) {
    (void)state;
    const int32_t far[4] = {0, 7, 100, 3000}, near[4] = {0, 1, 2, 3};
    for (int p = 0; p < 2; p++)
        for (int step = 0; step < 2; step++) {
            emit_case *c = case_new(precisions[p]);
            ir_value_id x = case_input(c, "x", "f32[tokens, 3, 16]");
            uint32_t ropes[4], n = 0;
            ropes[n++] = rope_llama3(c, x);
            uint32_t yarn = ropes[n++] = rope_yarn(c, x);
            assert_true(ir_op_set_string(&c->m, yarn, "style", "interleaved"));
            ropes[n++] = rope_longrope(c, x);
            uint32_t plain = ropes[n++] = case_op(c, IR_OP_ROPE, (ir_value_id[]){x, c->pos}, 2);
            assert_true(ir_op_set_float(&c->m, plain, "theta", 10000.0));
            assert_true(ir_op_set_int(&c->m, plain, "rotary_dim", 12));
            const int64_t rotary[4] = {16, 16, 8, 12};
            uint32_t tables[4], readers[4];
            for (uint32_t i = 0; i < n; i++) {
                tables[i] = case_op(c, IR_OP_ROPE_TABLE, &c->pos, 1);
                copy_rope_attrs(c, ropes[i], tables[i]);
                assert_true(ir_op_set_int(&c->m, tables[i], "rotary_dim", rotary[i]));
                readers[i] = case_op(c, IR_OP_ROPE, (ir_value_id[]){x, c->pos, case_result(c, tables[i])}, 3);
                copy_rope_attrs(c, ropes[i], readers[i]);
            }
            case_infer(c);
            case_set_ints_data(c, c->pos, 4, step ? near : far, 4);
            for (uint32_t i = 0; i < n; i++) {
                case_run(c, tables[i], 4, F32_TOLERANCE);
                ir_value_id table = case_result(c, tables[i]);
                /* the kernel's table is what the rope reads */
                case_set_floats(c, table, 4, c->values[table].buffer, c->values[table].count);
                case_run(c, readers[i], 4, F32_TOLERANCE);
                case_run(c, ropes[i], 4, F32_TOLERANCE);
                const value_data *a = &c->values[case_result(c, readers[i])];
                const value_data *b = &c->values[case_result(c, ropes[i])];
                if (strcmp(precisions[p], "f32") == 0)
                    assert_memory_equal(a->buffer, b->buffer, a->count * sizeof(float));
            }
            case_free(c);
        }
}

/* ---- softmax, argmax, embedding ----------------------------------------------------------- */

static void test_softmax(void **state) {
    (void)state;
    for (int p = 0; p < PRECISION_COUNT; p++) {
        emit_case *c = case_new(precisions[p]);
        ir_value_id rows = case_input(c, "rows", "f32[tokens, 50]");
        uint32_t last = case_op(c, IR_OP_SOFTMAX, &rows, 1);
        ir_value_id middle = case_input(c, "middle", "f32[tokens, 6, 5]");
        uint32_t strided = case_op(c, IR_OP_SOFTMAX, &middle, 1);
        assert_true(ir_op_set_int(&c->m, strided, "axis", 1));
        ir_value_id columns = case_input(c, "columns", "f32[tokens, 7]");
        uint32_t over_tokens = case_op(c, IR_OP_SOFTMAX, &columns, 1);
        assert_true(ir_op_set_int(&c->m, over_tokens, "axis", 0));
        case_infer(c);
        case_run(c, last, 3, F32_TOLERANCE);
        case_run(c, strided, 3, F32_TOLERANCE);
        case_run(c, over_tokens, 5, F32_TOLERANCE);
        case_free(c);
    }
}

static void test_argmax(void **state) {
    (void)state;
    for (int p = 0; p < PRECISION_COUNT; p++) {
        emit_case *c = case_new(precisions[p]);
        ir_value_id logits = case_input(c, "logits", "f32[tokens, 700]");
        uint32_t last = case_op(c, IR_OP_ARGMAX, &logits, 1);
        ir_value_id middle = case_input(c, "middle", "f32[tokens, 9, 3]");
        uint32_t strided = case_op(c, IR_OP_ARGMAX, &middle, 1);
        assert_true(ir_op_set_int(&c->m, strided, "axis", 1));
        case_infer(c);
        /* Ties: the first maximum wins, even when a later thread holds an equal one. */
        float data[3 * 700];
        for (int i = 0; i < 3 * 700; i++)
            data[i] = (float)((i * 37) % 101) / 16.0f;
        data[0 * 700 + 650] = 9.0f; /* row 0: the maximum at 650, once */
        data[1 * 700 + 5] = 9.0f;   /* row 1: at 5, 300 and 699 -> 5 */
        data[1 * 700 + 300] = 9.0f;
        data[1 * 700 + 699] = 9.0f;
        data[2 * 700 + 257] = 9.0f; /* row 2: at 257 and 513 (threads 1 of two loop rounds) -> 257 */
        data[2 * 700 + 513] = 9.0f;
        case_set_floats(c, logits, 3, data, 3 * 700);
        case_run(c, last, 3, F32_TOLERANCE);
        case_run(c, strided, 2, F32_TOLERANCE);
        case_free(c);
    }
}

static void test_embedding(void **state) {
    (void)state;
    const int32_t ids[5] = {3, 0, 36, 3, 17};
    for (int p = 0; p < PRECISION_COUNT; p++) {
        emit_case *c = case_new(precisions[p]);
        uint32_t op = case_op(c, IR_OP_EMBEDDING, (ir_value_id[]){case_weight(c, "f32[37, 24]"), c->ids}, 2);
        case_infer(c);
        case_set_ints_data(c, c->ids, 5, ids, 5);
        case_run(c, op, 5, F32_TOLERANCE);
        case_free(c);
    }
}

/* ---- attention ----------------------------------------------------------------------------- */

/* Prefill of T = 5 at positions 0..4, then a decode step of one token at
 * position 5 that reads the cache the prefill wrote (state persists). */
static void run_prefill_then_decode(emit_case *c, uint32_t op) {
    const int32_t prefill[5] = {0, 1, 2, 3, 4}, decode[1] = {5};
    case_set_ints_data(c, c->pos, 5, prefill, 5);
    case_run(c, op, 5, F32_SEQUENCE_TOLERANCE);
    case_set_ints_data(c, c->pos, 1, decode, 1);
    case_run(c, op, 1, F32_SEQUENCE_TOLERANCE);
}

static uint32_t attention_op(emit_case *c, const char *kv_type, const char *v_type, double scale,
                             int64_t window, bool causal) {
    ir_value_id q = case_input(c, "q", "f32[tokens, 4, 16]");
    ir_value_id k = case_input(c, "k", kv_type);
    ir_value_id v = case_input(c, "v", v_type);
    uint32_t op = case_op(c, IR_OP_ATTENTION, (ir_value_id[]){q, k, v, c->pos}, 4);
    assert_true(ir_op_set_float(&c->m, op, "scale", scale));
    assert_true(ir_op_set_int(&c->m, op, "max_seq", 40));
    assert_true(ir_op_set_int(&c->m, op, "window", window));
    assert_true(ir_op_set_bool(&c->m, op, "causal", causal));
    return op;
}

static void test_attention_gqa_prefill_then_decode(void **state) {
    (void)state;
    for (int p = 0; p < PRECISION_COUNT; p++) {
        emit_case *c = case_new(precisions[p]);
        uint32_t op = attention_op(c, "f32[tokens, 2, 16]", "f32[tokens, 2, 16]", 0.25, 0, true);
        case_infer(c);
        run_prefill_then_decode(c, op);
        case_free(c);
    }
}

static void test_attention_sliding_window(void **state) {
    (void)state;
    for (int p = 0; p < PRECISION_COUNT; p++) {
        emit_case *c = case_new(precisions[p]);
        uint32_t op = attention_op(c, "f32[tokens, 2, 16]", "f32[tokens, 2, 16]", 0.3, 3, true);
        case_infer(c);
        run_prefill_then_decode(c, op);
        case_free(c);
    }
}

/* Gemma 2: scores soft-capped at 0.5 (below the largest raw scores, so the
 * cap changes the result), with a window. */
static void test_attention_softcap(void **state) {
    (void)state;
    for (int p = 0; p < PRECISION_COUNT; p++) {
        emit_case *c = case_new(precisions[p]);
        uint32_t op = attention_op(c, "f32[tokens, 2, 16]", "f32[tokens, 2, 16]", 0.25, 5, true);
        assert_true(ir_op_set_float(&c->m, op, "softcap", 0.5));
        case_infer(c);
        run_prefill_then_decode(c, op);
        case_free(c);
    }
}

/* MQA (one kv head), value dim 8 != 16, not causal: every written position. */
static void test_attention_mqa_noncausal(void **state) {
    (void)state;
    emit_case *c = case_new("f32");
    uint32_t op = attention_op(c, "f32[tokens, 1, 16]", "f32[tokens, 1, 8]", 0.25, 0, false);
    case_infer(c);
    run_prefill_then_decode(c, op);
    case_free(c);
}

/* A sequence with a gap: positions never written are skipped, as the
 * reference skips them; 70 positions in tiles of 32. */
static void test_attention_skips_unwritten_positions(void **state) {
    (void)state;
    emit_case *c = case_new("f32");
    ir_value_id q = case_input(c, "q", "f32[tokens, 2, 8]");
    ir_value_id k = case_input(c, "k", "f32[tokens, 2, 8]");
    ir_value_id v = case_input(c, "v", "f32[tokens, 2, 8]");
    uint32_t op = case_op(c, IR_OP_ATTENTION, (ir_value_id[]){q, k, v, c->pos}, 4);
    assert_true(ir_op_set_float(&c->m, op, "scale", 0.35));
    assert_true(ir_op_set_int(&c->m, op, "max_seq", 80));
    case_infer(c);
    int32_t first[40], second[3] = {60, 61, 75};
    for (int i = 0; i < 40; i++)
        first[i] = i;
    case_set_ints_data(c, c->pos, 40, first, 40);
    case_run(c, op, 40, F32_SEQUENCE_TOLERANCE);
    case_set_ints_data(c, c->pos, 3, second, 3);
    case_run(c, op, 3, F32_SEQUENCE_TOLERANCE);
    case_free(c);
}

/* An attention op of Hq query heads over Hkv kv heads of D dims. */
static uint32_t attention_shaped_op(emit_case *c, int64_t query_heads, int64_t kv_heads, int64_t dims,
                                    int64_t max_seq, int64_t window) {
    char q_type[64], kv_type[64];
    snprintf(q_type, sizeof q_type, "f32[tokens, %lld, %lld]", (long long)query_heads, (long long)dims);
    snprintf(kv_type, sizeof kv_type, "f32[tokens, %lld, %lld]", (long long)kv_heads, (long long)dims);
    ir_value_id q = case_input(c, "q", q_type);
    ir_value_id k = case_input(c, "k", kv_type);
    ir_value_id v = case_input(c, "v", kv_type);
    uint32_t op = case_op(c, IR_OP_ATTENTION, (ir_value_id[]){q, k, v, c->pos}, 4);
    assert_true(ir_op_set_float(&c->m, op, "scale", 1.0 / sqrt((double)dims)));
    assert_true(ir_op_set_int(&c->m, op, "max_seq", max_seq));
    assert_true(ir_op_set_int(&c->m, op, "window", window));
    return op;
}

/* Steps of the given token counts at consecutive positions from 0, each
 * checked against the reference (which keeps its own cache). Steps of at
 * most 4 tokens run the split-KV decode kernel, longer ones the prefill
 * kernel (FlashAttention-2 over bf16 caches, the scalar kernel over f32). */
static void run_attention_steps(emit_case *c, uint32_t op, const int64_t *steps, int count) {
    int32_t positions[1100];
    int32_t next = 0;
    for (int i = 0; i < count; i++) {
        assert_true(steps[i] <= 1100);
        for (int64_t t = 0; t < steps[i]; t++)
            positions[t] = next++;
        case_set_ints_data(c, c->pos, steps[i], positions, (uint64_t)steps[i]);
        case_run(c, op, steps[i], F32_SEQUENCE_TOLERANCE);
    }
}

/* The head dims of the models we target, GQA 4, in both storages: a
 * prefill of 17 tokens (a tile and a partial one), decode steps of one and
 * of two tokens, then a prefill that continues the sequence. */
static void test_attention_head_dims(void **state) {
    (void)state;
    static const int64_t dims[] = {64, 80, 96, 128, 256};
    static const int64_t steps[] = {17, 1, 2, 21};
    for (int p = 0; p < PRECISION_COUNT; p++)
        for (unsigned d = 0; d < sizeof dims / sizeof dims[0]; d++) {
            emit_case *c = case_new(precisions[p]);
            uint32_t op = attention_shaped_op(c, 4, 1, dims[d], 64, 0);
            case_infer(c);
            run_attention_steps(c, op, steps, 4);
            case_free(c);
        }
}

/* Ragged prompt lengths around the tile sizes (16 rows a warp, 32
 * positions a tile, 64 rows a block) at GQA ratios 1, 4 and 8, then decode
 * steps over the many splits of a long context. */
static void test_attention_ragged_lengths(void **state) {
    (void)state;
    static const int64_t lengths[] = {1, 15, 16, 17, 127};
    static const int64_t ratios[][2] = {{4, 4}, {4, 1}, {8, 1}};
    for (int p = 0; p < PRECISION_COUNT; p++)
        for (unsigned r = 0; r < 3; r++)
            for (unsigned l = 0; l < sizeof lengths / sizeof lengths[0]; l++) {
                emit_case *c = case_new(precisions[p]);
                uint32_t op = attention_shaped_op(c, ratios[r][0], ratios[r][1], 64, 160, 0);
                case_infer(c);
                int64_t steps[3] = {lengths[l], 1, 3};
                run_attention_steps(c, op, steps, 3);
                case_free(c);
            }
}

/* f8e4m3 KV caches (--kv-cache fp8): the kernels read codes and scales
 * that kv_write stored, the reference rounds each row the same way, so the
 * comparison is the one of the cache's own dtype (the quantization is the
 * same arithmetic on both sides). Ragged lengths at GQA 1, 4 and 8 (the
 * prefill kernel's tiles, then decode splits), head dims 64 to 256, and a
 * value dim of 8 whose rows are too short for 16-byte loads (the scalar
 * kernel in every step). */
static void test_attention_fp8_cache_ragged_lengths(void **state) {
    (void)state;
    static const int64_t lengths[] = {1, 17, 127};
    static const int64_t ratios[][2] = {{4, 4}, {4, 1}, {8, 1}};
    for (int p = 0; p < PRECISION_COUNT; p++)
        for (unsigned r = 0; r < 3; r++)
            for (unsigned l = 0; l < sizeof lengths / sizeof lengths[0]; l++) {
                emit_case *c = case_new(precisions[p]);
                c->kv_cache = "fp8";
                uint32_t op = attention_shaped_op(c, ratios[r][0], ratios[r][1], 64, 160, 0);
                case_infer(c);
                assert_string_equal(ir_op_string(&c->m, op, "kv_dtype"), "f8e4m3");
                int64_t steps[3] = {lengths[l], 1, 3};
                run_attention_steps(c, op, steps, 3);
                case_free(c);
            }
}

static void test_attention_fp8_cache_head_dims(void **state) {
    (void)state;
    static const int64_t dims[] = {64, 80, 128, 256};
    static const int64_t steps[] = {17, 1, 2, 21};
    for (int p = 0; p < PRECISION_COUNT; p++)
        for (unsigned d = 0; d < sizeof dims / sizeof dims[0]; d++) {
            emit_case *c = case_new(precisions[p]);
            c->kv_cache = "fp8";
            uint32_t op = attention_shaped_op(c, 4, 1, dims[d], 64, 0);
            case_infer(c);
            run_attention_steps(c, op, steps, 4);
            case_free(c);
        }
    emit_case *c = case_new("f32");
    c->kv_cache = "fp8";
    uint32_t op = attention_op(c, "f32[tokens, 1, 16]", "f32[tokens, 1, 8]", 0.25, 0, false);
    case_infer(c);
    run_prefill_then_decode(c, op);
    case_free(c);
}

/* 1000 positions: a prefill of 1000 tokens in 64-row blocks, then decode
 * with the positions split over 32 blocks and merged by the last one;
 * with a sliding window of 100, whole tiles outside it are skipped. */
static void test_attention_long_context(void **state) {
    (void)state;
    static const int64_t windows[] = {0, 100};
    static const int64_t steps[] = {1000, 1, 2};
    for (int w = 0; w < 2; w++) {
        emit_case *c = case_new("bf16");
        uint32_t op = attention_shaped_op(c, 8, 1, 64, 1100, windows[w]);
        case_infer(c);
        run_attention_steps(c, op, steps, 3);
        case_free(c);
    }
    emit_case *c = case_new("f32");
    uint32_t op = attention_shaped_op(c, 4, 1, 80, 1100, 37);
    case_infer(c);
    run_attention_steps(c, op, steps, 3);
    case_free(c);
}

/* What NVRTC makes of the attention kernels of a Llama-3-8B layer (Hq 32,
 * Hkv 8, D 128, bf16) for sm_90: no spills; the prefill kernel on tensor
 * cores (mma.sync m16n8k16 bf16 with f32 accumulation, ldmatrix, cp.async);
 * the decode kernel reading K and V with 128-bit global loads. Over f8e4m3
 * caches (test_attention_fp8_ptx_for_sm90) the decode kernel keeps its
 * 128-bit loads (16 codes each) and the prefill kernel its mma and
 * ldmatrix, loading the tiles with 128-bit loads in place of cp.async.
 * With f16 activations (test_attention_f16_ptx_for_sm90) the mma is f16's. */
static void check_attention_ptx_for_sm90(const char *precision, const char *kv_cache) {
    if (!harness_have_nvrtc) skip();
    emit_case *c = case_new(precision);
    c->kv_cache = kv_cache;
    uint32_t op = attention_shaped_op(c, 32, 8, 128, 8192, 0);
    case_infer(c);
    arena a;
    arena_init(&a);
    cg_group_lowering l;
    assert_true(case_emit(c, op, &a, &l));
    assert_int_equal(l.kernel_count, 3);
    for (uint32_t k = 1; k < l.kernel_count; k++) {
        cg_compiled compiled;
        compile_ptx_for_sm90(&l.kernels[k], &compiled);
        if (k == 1) { /* decode */
            assert_true(strstr(compiled.ptx, "ld.global.v4.u32") ||
                        strstr(compiled.ptx, "ld.global.nc.v4.u32"));
            assert_null(strstr(compiled.ptx, "mma.sync"));
        } else { /* prefill */
            assert_non_null(
                strstr(compiled.ptx, strcmp(precision, "f16") == 0
                                         ? "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32"
                                         : "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32"));
            assert_non_null(strstr(compiled.ptx, "ldmatrix.sync.aligned.m8n8.x4.shared.b16"));
            if (kv_cache) {
                assert_true(strstr(compiled.ptx, "ld.global.v4.u32") ||
                            strstr(compiled.ptx, "ld.global.nc.v4.u32"));
            } else {
                assert_non_null(strstr(compiled.ptx, "cp.async.cg.shared.global"));
                assert_non_null(strstr(compiled.ptx, "cp.async.wait_group 1"));
            }
        }
        cg_compiled_free(&compiled);
    }
    arena_free(&a);
    case_free(c);
}

static void test_attention_ptx_for_sm90(void **state) {
    (void)state;
    check_attention_ptx_for_sm90("bf16", NULL);
}

static void test_attention_fp8_ptx_for_sm90(void **state) {
    (void)state;
    check_attention_ptx_for_sm90("bf16", "fp8");
}

static void test_attention_f16_ptx_for_sm90(void **state) {
    (void)state;
    check_attention_ptx_for_sm90("f16", NULL);
    check_attention_ptx_for_sm90("f16", "fp8");
}

/* ---- moe ---------------------------------------------------------------------------------- */

static uint32_t moe_op(emit_case *c, int64_t experts, int64_t ffn, int64_t top_k, bool normalize) {
    return moe_op_dims(c, experts, 32, ffn, top_k, normalize);
}

static void test_moe_top2_of_4(void **state) {
    (void)state;
    for (int p = 0; p < PRECISION_COUNT; p++) {
        emit_case *c = case_new(precisions[p]);
        uint32_t op = moe_op(c, 4, 48, 2, true);
        case_infer(c);
        case_run(c, op, 5, F32_SEQUENCE_TOLERANCE);
        case_free(c);
    }
}

/* F = 300 spans two chunks of hidden units; top-1 without renormalising. */
static void test_moe_chunks_and_no_normalize(void **state) {
    (void)state;
    emit_case *c = case_new("f32");
    uint32_t op = moe_op(c, 3, 300, 1, false);
    case_infer(c);
    case_run(c, op, 3, F32_SEQUENCE_TOLERANCE);
    case_free(c);
}

/* Two experts with the same router row tie; torch.topk takes the lower index. */
static void test_moe_ties_go_to_the_lower_expert(void **state) {
    (void)state;
    emit_case *c = case_new("f32");
    uint32_t op = moe_op(c, 3, 16, 1, false);
    case_infer(c);
    float x[32], router[3 * 32];
    for (int i = 0; i < 32; i++) {
        x[i] = 0.5f;
        router[i] = router[2 * 32 + i] = 1.0f; /* experts 0 and 2: logit 16 each */
        router[32 + i] = -1.0f;
    }
    case_set_floats(c, c->m.ops[op].operands[0], 1, x, 32);
    case_set_floats(c, c->m.ops[op].operands[1], 1, router, 3 * 32);
    case_run(c, op, 1, F32_SEQUENCE_TOLERANCE);
    case_free(c);
}

/* Unbalanced routing: every one of 40 tokens (5 tiles of 8) goes to expert
 * 1, so experts 0, 2 and 3 have no tokens; F = 44 is no multiple of the
 * 8-element vector (the scalar path of the down projection). */
static void test_moe_every_token_to_one_expert(void **state) {
    (void)state;
    enum { T = 40, D = 32, E = 4 };
    for (int p = 0; p < PRECISION_COUNT; p++) {
        emit_case *c = case_new(precisions[p]);
        uint32_t op = moe_op_dims(c, E, D, 44, 1, false);
        case_infer(c);
        case_route_to_one_expert(c, op, T, D, E, 1);
        case_run(c, op, T, F32_SEQUENCE_TOLERANCE);
        case_free(c);
    }
}

/* Every expert chosen by every token: 40 x 8 = 320 slots, more than one
 * window of 256 in the grouped GEMMs' gather; D = F = 64 take the 128-bit
 * paths throughout. */
static void test_moe_slots_span_windows(void **state) {
    (void)state;
    for (int p = 0; p < PRECISION_COUNT; p++) {
        emit_case *c = case_new(precisions[p]);
        uint32_t op = moe_op_dims(c, 8, 64, 64, 8, true);
        case_infer(c);
        case_run(c, op, 40, F32_SEQUENCE_TOLERANCE);
        case_run(c, op, 1, F32_SEQUENCE_TOLERANCE); /* then a decode step on the same state */
        case_free(c);
    }
}

/* D = 36 is no multiple of 8: the router and gate/up take the scalar path. */
static void test_moe_model_dim_not_a_vector_multiple(void **state) {
    (void)state;
    for (int p = 0; p < PRECISION_COUNT; p++) {
        emit_case *c = case_new(precisions[p]);
        uint32_t op = moe_op_dims(c, 4, 36, 24, 2, true);
        case_infer(c);
        case_run(c, op, 3, F32_SEQUENCE_TOLERANCE);
        case_free(c);
    }
}

/* The grouped GEMMs stream weights with 128-bit loads: their sm_90 PTX has
 * vector global loads (ld.global...v4). */
static void test_moe_ptx_has_128_bit_loads(void **state) {
    (void)state;
    if (!harness_have_nvrtc) {
        skip();
        return;
    }
    emit_case *c = case_new("bf16");
    uint32_t op = moe_op_dims(c, 8, 64, 64, 2, true);
    case_infer(c);
    arena strings;
    arena_init(&strings);
    cg_group_lowering l;
    assert_true(case_emit(c, op, &strings, &l));
    assert_int_equal(l.kernel_count, 4);
    cg_header header = {"smelt_kernel.h", harness_header_text};
    for (uint32_t k = 0; k < 3; k++) {
        cg_compile_request request = {.source = l.kernels[k].source,
                                      .kernel_name = l.kernels[k].name,
                                      .headers = &header,
                                      .header_count = 1,
                                      .arch = 90,
                                      .want_ptx = true};
        cg_compiled compiled;
        char error[4096];
        if (!cg_compile_kernel(&request, &compiled, error, sizeof error)) fail_msg("%s", error);
        bool vector_load = false;
        for (const char *at = strstr(compiled.ptx, "ld.global"); at && !vector_load;
             at = strstr(at + 1, "ld.global")) {
            size_t length = strcspn(at, " \t\n"); /* the instruction with its modifiers */
            for (size_t i = 0; i + 3 <= length && !vector_load; i++)
                vector_load = strncmp(at + i, ".v4", 3) == 0;
        }
        if (!vector_load) fail_msg("%s: no 128-bit global load in the PTX", l.kernels[k].name);
        cg_compiled_free(&compiled);
    }
    arena_free(&strings);
    case_free(c);
}

/* ---- layout -------------------------------------------------------------------------------- */

static void test_transpose(void **state) {
    (void)state;
    for (int p = 0; p < PRECISION_COUNT; p++) {
        emit_case *c = case_new(precisions[p]);
        ir_value_id x = case_input(c, "x", "f32[tokens, 3, 5, 2]");
        uint32_t inner = case_op(c, IR_OP_TRANSPOSE, &x, 1);
        case_set_ints(c, inner, "perm", (const int64_t[]){0, 2, 3, 1}, 4);
        ir_value_id w = case_weight(c, "f32[4, 6]");
        uint32_t matrix = case_op(c, IR_OP_TRANSPOSE, &w, 1);
        case_set_ints(c, matrix, "perm", (const int64_t[]){1, 0}, 2);
        case_infer(c);
        case_run(c, inner, 3, F32_TOLERANCE);
        case_run(c, matrix, 1, F32_TOLERANCE);
        case_free(c);
    }
}

static void test_concat_split_slice(void **state) {
    (void)state;
    for (int p = 0; p < PRECISION_COUNT; p++) {
        emit_case *c = case_new(precisions[p]);
        ir_value_id a = case_input(c, "a", "f32[tokens, 3, 2]");
        ir_value_id b = case_input(c, "b", "f32[tokens, 5, 2]");
        ir_value_id d = case_input(c, "d", "f32[tokens, 1, 2]");
        uint32_t concat = case_op(c, IR_OP_CONCAT, (ir_value_id[]){a, b, d}, 3);
        assert_true(ir_op_set_int(&c->m, concat, "axis", 1));
        ir_value_id x = case_input(c, "x", "f32[tokens, 10]");
        uint32_t split = ir_append_op(&c->m, IR_OP_SPLIT, &x, 1, 3, SMELT_NO_LOC);
        ir_op_fill_defaults(&c->m, split);
        assert_true(ir_op_set_int(&c->m, split, "axis", -1));
        case_set_ints(c, split, "sizes", (const int64_t[]){3, 3, 4}, 3);
        ir_value_id y = case_input(c, "y", "f32[tokens, 4, 9]");
        uint32_t slice = case_op(c, IR_OP_SLICE, &y, 1);
        assert_true(ir_op_set_int(&c->m, slice, "axis", 2));
        assert_true(ir_op_set_int(&c->m, slice, "start", 2));
        assert_true(ir_op_set_int(&c->m, slice, "end", 7));
        /* Integer data moves too. */
        ir_value_id left = case_input(c, "left", "i32[tokens, 3]"),
                    right = case_input(c, "right", "i32[tokens, 2]");
        uint32_t ints = case_op(c, IR_OP_CONCAT, (ir_value_id[]){left, right}, 2);
        assert_true(ir_op_set_int(&c->m, ints, "axis", 1));
        case_infer(c);
        case_run(c, concat, 4, F32_TOLERANCE);
        case_run(c, split, 4, F32_TOLERANCE);
        case_run(c, slice, 4, F32_TOLERANCE);
        case_set_ints_data(c, left, 2, (const int32_t[]){1, 2, 3, 4, 5, 6}, 6);
        case_set_ints_data(c, right, 2, (const int32_t[]){-7, 8, 9, -10}, 4);
        case_run(c, ints, 2, F32_TOLERANCE);
        case_free(c);
    }
}

/* ---- names, storage, lowering kinds, errors ------------------------------------------------ */

/* Kernel k is named `specialisation` + '_' + 8 hex digits, the low 32 bits of
 * the XXH64 of its source as it reads with the specialisation alone in
 * place of the name (recomputed here), and its source spells that name in
 * its comment, signature and host entry. */
static void assert_kernel_named(const cg_kernel *k, const char *specialisation) {
    size_t base = strlen(specialisation);
    assert_int_equal(strlen(k->name), base + 9);
    assert_memory_equal(k->name, specialisation, base);
    assert_int_equal(k->name[base], '_');
    /* The source with every full name put back to the specialisation. */
    size_t length = strlen(k->source);
    char *plain = malloc(length + 1);
    assert_non_null(plain);
    size_t to = 0, names = 0;
    for (const char *p = k->source; *p;) {
        if (strncmp(p, k->name, base + 9) == 0) {
            memcpy(plain + to, specialisation, base);
            to += base;
            p += base + 9;
            names++;
        } else {
            plain[to++] = *p++;
        }
    }
    plain[to] = '\0';
    assert_int_equal(names, 4); /* comment, signature, host entry and the call in it */
    char want[16];
    snprintf(want, sizeof want, "%08x", (unsigned)(XXH64(plain, to, 0) & 0xffffffffu));
    free(plain);
    assert_string_equal(k->name + base + 1, want);
}

/* Norms of one width and eps over other rows (Qwen3's q_norm/k_norm over
 * [tokens, heads, D] beside the model's [tokens, D] norms) are other kernels:
 * their sources differ, so their names must. Each runs right. */
static void test_norms_over_other_rows_are_other_kernels(void **state) {
    (void)state;
    emit_case *c = case_new("f32");
    ir_value_id rows[3] = {case_input(c, "x", "f32[tokens, 32]"), case_input(c, "q", "f32[tokens, 8, 32]"),
                           case_input(c, "k", "f32[4, 32]")};
    uint32_t rms[3], layer[3];
    for (int i = 0; i < 3; i++) {
        rms[i] = case_op(c, IR_OP_RMS_NORM, (ir_value_id[]){rows[i], case_weight(c, "f32[32]")}, 2);
        assert_true(ir_op_set_float(&c->m, rms[i], "eps", 1e-6));
        layer[i] = case_op(c, IR_OP_LAYER_NORM, (ir_value_id[]){rows[i], case_weight(c, "f32[32]")}, 2);
        assert_true(ir_op_set_float(&c->m, layer[i], "eps", 1e-6));
    }
    case_infer(c);
    arena a;
    arena_init(&a);
    static const char *const rms_names[3] = {"rms_norm_f32_d32_eps1em06", "rms_norm_f32_d32_eps1em06_rowstx8",
                                             "rms_norm_f32_d32_eps1em06_rows4"};
    static const char *const layer_names[3] = {"layer_norm_f32_d32_eps1em06",
                                               "layer_norm_f32_d32_eps1em06_rowstx8",
                                               "layer_norm_f32_d32_eps1em06_rows4"};
    for (int i = 0; i < 3; i++) {
        cg_group_lowering l;
        assert_true(case_emit(c, rms[i], &a, &l));
        assert_kernel_named(&l.kernels[0], rms_names[i]);
        assert_true(case_emit(c, layer[i], &a, &l));
        assert_kernel_named(&l.kernels[0], layer_names[i]);
    }
    arena_free(&a);
    case_run(c, rms[1], 3, F32_TOLERANCE);
    case_run(c, rms[2], 1, F32_TOLERANCE);
    case_run(c, layer[1], 2, F32_TOLERANCE);
    case_free(c);
}

/* Two identical layers give one name and byte-identical sources; their ops
 * texts differ. Another eps is another kernel. */
static void test_kernels_are_named_by_specialisation(void **state) {
    (void)state;
    emit_case *c = case_new("bf16");
    ir_value_id x = case_input(c, "x", "f32[tokens, 64]");
    uint32_t first = case_op(c, IR_OP_RMS_NORM, (ir_value_id[]){x, case_weight(c, "f32[64]")}, 2);
    assert_true(ir_op_set_float(&c->m, first, "eps", 1e-5));
    uint32_t second =
        case_op(c, IR_OP_RMS_NORM, (ir_value_id[]){case_result(c, first), case_weight(c, "f32[64]")}, 2);
    assert_true(ir_op_set_float(&c->m, second, "eps", 1e-5));
    uint32_t other = case_op(c, IR_OP_RMS_NORM, (ir_value_id[]){x, case_weight(c, "f32[64]")}, 2);
    assert_true(ir_op_set_float(&c->m, other, "eps", 1e-6));
    case_infer(c);
    arena a;
    arena_init(&a);
    cg_group_lowering l1, l2, l3;
    assert_true(case_emit(c, first, &a, &l1));
    assert_true(case_emit(c, second, &a, &l2));
    assert_true(case_emit(c, other, &a, &l3));
    assert_kernel_named(&l1.kernels[0], "rms_norm_bf16_d64_eps1em05");
    assert_string_equal(l1.kernels[0].name, l2.kernels[0].name);
    assert_string_equal(l1.kernels[0].source, l2.kernels[0].source);
    assert_string_equal(l1.kernels[0].family, "norm");
    assert_string_not_equal(l1.kernels[0].ops_text, l2.kernels[0].ops_text);
    assert_non_null(strstr(l1.kernels[0].ops_text, "= rms_norm(%2, %3) {eps = 1e-05} : bf16[tokens, 64]"));
    assert_kernel_named(&l3.kernels[0], "rms_norm_bf16_d64_eps1em06");
    /* The source names the op's signature and says how it is launched. */
    assert_non_null(strstr(l1.kernels[0].source,
                           "rms_norm(bf16[tokens, 64], bf16[64]) {eps = 1e-05} : bf16[tokens, 64]"));
    char spelled[128];
    snprintf(spelled, sizeof spelled, "SMELT_KERNEL void %s(", l1.kernels[0].name);
    assert_non_null(strstr(l1.kernels[0].source, spelled));
    snprintf(spelled, sizeof spelled, "SMELT_HOST_ENTRY(%s)", l1.kernels[0].name);
    assert_non_null(strstr(l1.kernels[0].source, spelled));
    /* params x, weight, out, tokens; one block per token, 64 threads */
    assert_int_equal(l1.kernels[0].param_count, 4);
    assert_int_equal(l1.kernels[0].params[0].value, x);
    assert_int_equal(l1.kernels[0].params[2].value, case_result(c, first));
    assert_int_equal(l1.kernels[0].params[3].kind, CG_PARAM_TOKENS);
    /* What each pointer may touch: x and out are T rows of 64 bf16, the
     * weight 64 bf16; only out is written. */
    assert_int_equal(l1.kernels[0].params[0].extent.a, 64 * 2);
    assert_int_equal(l1.kernels[0].params[0].extent.b, 0);
    assert_int_equal(l1.kernels[0].params[1].extent.a, 0);
    assert_int_equal(l1.kernels[0].params[1].extent.b, 64 * 2);
    assert_false(l1.kernels[0].params[0].writes);
    assert_false(l1.kernels[0].params[1].writes);
    assert_true(l1.kernels[0].params[2].writes);
    /* Blocks past the rule at this T do nothing: the bound is `tokens`, not gridDim. */
    assert_non_null(
        strstr(l1.kernels[0].source, "    if ((long long)blockIdx.x >= tokens)\n        return;"));
    assert_int_equal(l1.kernels[0].rule.grid[0].a, 1);
    assert_int_equal(l1.kernels[0].rule.grid[0].b, 0);
    assert_int_equal(l1.kernels[0].rule.block[0], 64);
    arena_free(&a);
    case_free(c);
}

/* bf16: every float value bf16 except what an output consumes, also through
 * a reshape; integers i32; f32 precision: all floats f32. */
static void test_storage_policy(void **state) {
    (void)state;
    emit_case *c = case_new("bf16");
    ir_value_id x = case_input(c, "x", "f32[tokens, 8]");
    ir_value_id hidden = case_result(c, case_op(c, IR_OP_SILU, &x, 1));
    ir_value_id logits = case_result(c, case_op(c, IR_OP_SILU, &hidden, 1));
    uint32_t reshape = case_op(c, IR_OP_RESHAPE, &logits, 1);
    ir_type shape = type_from_text(c, "f32[tokens, 2, 4]");
    assert_true(ir_op_set_attr(&c->m, reshape, "shape",
                               &(ir_attr){.kind = IR_ATTR_SHAPE, .as.shape = {shape.rank, shape.dims}}));
    case_output(c, case_result(c, reshape), "logits");
    case_infer(c);
    assert_int_equal(cg_storage_dtype(&c->m, hidden), SMELT_DTYPE_BF16);
    assert_int_equal(cg_storage_dtype(&c->m, x), SMELT_DTYPE_BF16);
    assert_int_equal(cg_storage_dtype(&c->m, logits), SMELT_DTYPE_F32);
    assert_int_equal(cg_storage_dtype(&c->m, case_result(c, reshape)), SMELT_DTYPE_F32);
    assert_int_equal(cg_storage_dtype(&c->m, c->ids), SMELT_DTYPE_I32);
    assert_true(pass_precision(&c->m, &(pass_options){.precision = "f32"}, &c->d));
    assert_int_equal(cg_storage_dtype(&c->m, hidden), SMELT_DTYPE_F32);
    assert_true(pass_precision(&c->m, &(pass_options){.precision = "bf16"}, &c->d));
    /* A kernel reading bf16 and writing f32 says so in its name, and runs. */
    arena a;
    arena_init(&a);
    cg_group_lowering l;
    assert_true(case_emit(c, c->m.values[logits].def_op, &a, &l));
    assert_kernel_named(&l.kernels[0], "silu_bf16_f32_t8");
    assert_true(case_emit(c, reshape, &a, &l));
    assert_int_equal(l.kind, CG_LOWER_ALIAS);
    arena_free(&a);
    case_run(c, c->m.values[logits].def_op, 3, F32_TOLERANCE);
    case_free(c);
}

static void test_lowering_kinds_and_attention_state(void **state) {
    (void)state;
    emit_case *c = case_new("bf16");
    ir_value_id x = case_input(c, "x", "f32[tokens, 16]");
    uint32_t matmul = case_op(c, IR_OP_MATMUL, (ir_value_id[]){x, case_weight(c, "f32[8, 16]")}, 2);
    uint32_t attention = attention_op(c, "f32[tokens, 2, 16]", "f32[tokens, 2, 16]", 0.25, 0, true);
    case_output(c, case_result(c, matmul), "logits");
    case_infer(c);
    arena a;
    arena_init(&a);
    cg_group_lowering l;
    assert_true(case_emit(c, c->m.values[x].def_op, &a, &l));
    assert_int_equal(l.kind, CG_LOWER_NONE);
    assert_true(case_emit(c, matmul, &a, &l));
    assert_int_equal(l.kind, CG_LOWER_GEMM);
    assert_int_equal(l.kernel_count, 0);
    assert_true(case_emit(c, c->m.op_count - 1, &a, &l)); /* the output */
    assert_int_equal(l.kind, CG_LOWER_NONE);
    assert_true(case_emit(c, attention, &a, &l));
    assert_int_equal(l.kind, CG_LOWER_KERNELS);
    /* kv_write, then split-KV decode for steps of <= 4 tokens, FlashAttention-2 for longer ones */
    assert_int_equal(l.kernel_count, 3);
    assert_kernel_named(&l.kernels[0], "kv_write_bf16_kv2_d16_ctx40");
    /* scale 1/sqrt(16) implied; 264 target blocks / 2 kv heads, at most 40 / 32 rounded up splits */
    assert_kernel_named(&l.kernels[1], "attention_decode_bf16_h4_kv2_d16_ctx40_s2");
    assert_kernel_named(&l.kernels[2], "attention_prefill_bf16_h4_kv2_d16_ctx40");
    assert_int_equal(l.state_count, 5);
    assert_int_equal(l.state_bytes[CG_STATE_KEYS], 40 * 2 * 16 * 2); /* bf16 */
    assert_int_equal(l.state_bytes[CG_STATE_VALUES], 40 * 2 * 16 * 2);
    assert_int_equal(l.state_bytes[CG_STATE_WRITTEN], 40 * 4);
    /* [4 tokens, 2 kv heads, 2 splits, 2 heads * (16 + 2)] f32, and a counter per (token, kv head) */
    assert_int_equal(l.state_bytes[CG_STATE_PARTIALS], 4 * 2 * 2 * 2 * 18 * 4);
    assert_int_equal(l.state_bytes[CG_STATE_COUNTERS], 4 * 2 * 4);
    for (int i = 0; i < CG_MAX_STATES; i++)
        assert_int_equal(l.state_rows[i], i <= CG_STATE_WRITTEN ? 40 : 0); /* max_seq positions; workspace */
    /* decode: grid (splits * Hkv, T, T <= 4), parameters q, pos, caches, flags, workspace, out, T */
    const cg_kernel *decode = &l.kernels[1], *prefill = &l.kernels[2];
    assert_int_equal(decode->rule.grid[0].b, 4);
    for (int64_t t = 1; t <= 8; t++) {
        assert_int_equal(prog_affine_eval(decode->rule.grid[2], t), t <= 4);
        assert_int_equal(prog_affine_eval(prefill->rule.grid[2], t), t > 4);
    }
    assert_int_equal(decode->param_count, 9);
    assert_int_equal(decode->params[8].kind, CG_PARAM_TOKENS);
    assert_false(decode->params[2].writes); /* attention reads the caches */
    assert_true(decode->params[5].writes);  /* the partials */
    assert_true(decode->params[6].writes);  /* the counters */
    assert_int_equal(decode->params[6].state, CG_STATE_COUNTERS);
    assert_true(decode->params[7].writes); /* out */
    /* prefill: grid (ceil(T / 64), Hq, T > 4), dynamic shared memory for Q and two K/V stages */
    assert_int_equal(prefill->rule.grid[0].c, 64);
    assert_int_equal(prefill->rule.grid[1].b, 4);
    assert_int_equal(prefill->rule.dynamic_shared_bytes, 2 * (64 * 24 + 2 * (32 * 24 + 32 * 24)));
    assert_int_equal(prefill->param_count, 7);
    assert_int_equal(prefill->params[2].kind, CG_PARAM_STATE);
    assert_int_equal(prefill->params[2].state, CG_STATE_KEYS);
    assert_non_null(strstr(prefill->source, "if ((long long)blockIdx.y >= 4)"));
    assert_non_null(strstr(prefill->source, "smelt_mma_m16n8k16_bf16_f32("));
    arena_free(&a);
    case_free(c);
}

static void assert_emit_fails(emit_case *c, uint32_t op, const char *message) {
    arena a;
    arena_init(&a);
    cg_group_lowering l;
    assert_false(case_emit(c, op, &a, &l));
    assert_int_equal(l.kernel_count, 0);
    if (!strstr(case_log(c), message)) fail_msg("expected '%s' in:\n%s", message, case_log(c));
    arena_free(&a);
}

/* Only the token dim, only as dim 0, is dynamic. */
static void test_token_dim_errors(void **state) {
    (void)state;
    emit_case *c = case_new("f32");
    ir_add_symbol(&c->m, "batch", 8, SMELT_NO_LOC);
    ir_value_id other = case_input(c, "other", "f32[batch, 4]");
    uint32_t silu = case_op(c, IR_OP_SILU, &other, 1);
    ir_value_id x = case_input(c, "x", "f32[tokens, 4]");
    uint32_t transpose = case_op(c, IR_OP_TRANSPOSE, &x, 1);
    case_set_ints(c, transpose, "perm", (const int64_t[]){1, 0}, 2);
    case_infer(c);
    assert_emit_fails(
        c, silu,
        "error: codegen supports the token dim only as dim 0 of a value; found 'batch' as dim 0 "
        "of operand 0 of 'silu'");
    assert_emit_fails(c, transpose, "found 'tokens' as dim 1 of result 0 of 'transpose'");
    case_free(c);
}

/* A name of a megabyte is cut in the message; nothing breaks. */
static void test_long_symbol_name_is_cut(void **state) {
    (void)state;
    emit_case *c = case_new("f32");
    size_t length = 1 << 20;
    char *name = malloc(length + 1);
    memset(name, 'n', length);
    name[length] = '\0';
    ir_add_symbol(&c->m, name, 8, SMELT_NO_LOC);
    ir_value_id v = case_input(c, "v", "f32[tokens, 2]");
    c->m.values[v].type.dims[1] = ir_dim_symbol(1);
    uint32_t op = case_op(c, IR_OP_SILU, &v, 1);
    case_infer(c);
    assert_emit_fails(c, op, "nnnn...' as dim 1 of operand 0");
    assert_true(strlen(case_log(c)) < 1000);
    free(name);
    case_free(c);
}

static void test_bad_attributes_are_errors(void **state) {
    (void)state;
    emit_case *c = case_new("f32");
    ir_value_id x = case_input(c, "x", "f32[tokens, 2, 8]");
    uint32_t rope = case_op(c, IR_OP_ROPE, (ir_value_id[]){x, c->pos}, 2);
    assert_true(ir_op_set_float(&c->m, rope, "theta", 10000.0));
    uint32_t moe = moe_op(c, 4, 16, 2, true);
    case_infer(c);
    assert_true(ir_op_set_int(&c->m, rope, "rotary_dim", 9));
    assert_emit_fails(c, rope, "rope: expected rotary_dim in [2, 8] (the head dim); found 9");
    assert_true(ir_op_set_int(&c->m, moe, "top_k", 5));
    assert_emit_fails(c, moe, "moe: top_k 5 must be in [1, 4] (the number of experts)");
    case_free(c);
}

/* A storage dtype without kernels (f8 today) is refused at the op, never
 * sized or loaded as if it were another. */
static void test_dtype_without_kernels_is_refused(void **state) {
    (void)state;
    emit_case *c = case_new("bf16");
    ir_value_id x = case_input(c, "x", "f32[tokens, 8]");
    uint32_t silu = case_op(c, IR_OP_SILU, &x, 1);
    case_infer(c);
    c->m.values[x].type.dtype = SMELT_DTYPE_F8E4M3; /* as a future precision policy would */
    c->m.values[case_result(c, silu)].type.dtype = SMELT_DTYPE_F8E4M3;
    assert_emit_fails(
        c, silu,
        "error: codegen has no kernels for f8e4m3 values yet (operand 0 of 'silu'); kernels exist "
        "for f32, bf16, f16 and i32");
    case_free(c);
}

/* A group of several ops (a fusion rule's) without an emitter for it is an
 * error at its first op, not one kernel per op behind the IR's back. */
static void test_group_without_emitter_is_refused(void **state) {
    (void)state;
    emit_case *c = case_new("f32");
    ir_value_id x = case_input(c, "x", "f32[tokens, 8]");
    uint32_t first = case_op(c, IR_OP_SILU, &x, 1);
    ir_value_id y = case_result(c, first);
    uint32_t second = case_op(c, IR_OP_SOFTMAX, &y, 1); /* no chain: softmax is not elementwise */
    case_infer(c);
    const uint32_t ops[] = {first, second};
    ir_value_id z = case_result(c, second);
    cg_group g = {
        .id = 0, .op_count = 2, .ops = ops, .input_count = 1, .inputs = &x, .output_count = 1, .outputs = &z};
    arena a;
    arena_init(&a);
    cg_group_lowering l;
    assert_false(cg_emit_group(&c->m, &g, &a, &l, &c->d));
    assert_non_null(strstr(case_log(c),
                           "codegen has no emitter for a kernel group of 2 ops (group 0 starts with "
                           "'silu'): the fusion rule that made it needs one"));
    arena_free(&a);
    case_free(c);
}

/* ---- the fused GEMV (passes/fuse.c's groups, codegen/emit_gemv.c) ----------------------- */

static uint32_t reshape_op(emit_case *c, ir_value_id x, int64_t heads, int64_t head_dim) {
    uint32_t op = case_op(c, IR_OP_RESHAPE, &x, 1);
    ir_dim dims[3] = {ir_dim_symbol(ir_find_symbol(&c->m, "tokens")), ir_dim_const(heads),
                      ir_dim_const(head_dim)};
    ir_attr shape = {.kind = IR_ATTR_SHAPE, .as.shape = {3, dims}};
    assert_true(ir_op_set_attr(&c->m, op, "shape", &shape));
    return op;
}

/* norm + Q (neox rope over part of each head), K (interleaved rope), V (a
 * bias): one kernel, against the reference run op by op, at token counts
 * inside one tile of TOKEN_TILE tokens and across two. K = 40 and K = 20:
 * the vector path, and the element-at-a-time path of a K that is no
 * multiple of 8; and K = 40 again with each rope reading the step's rope
 * table (what fuse makes), the table computed by its kernel. */
static void test_gemv_norm_qkv_rope(void **state) {
    (void)state;
    const int32_t positions[7] = {0, 5, 17, 300, 2, 9, 4000};
    const int64_t widths[3] = {40, 20, 40};
    for (int p = 0; p < PRECISION_COUNT; p++)
        for (int w = 0; w < 3; w++) {
            bool tables = w == 2;
            emit_case *c = case_new(precisions[p]);
            ir_value_id h = case_inputf(c, "h", "f32[tokens, %lld]", (long long)widths[w]);
            ir_value_id g = case_weightf(c, "f32[%lld]", (long long)widths[w]);
            ir_value_id wq = case_weightf(c, "f32[32, %lld]", (long long)widths[w]);
            ir_value_id wk = case_weightf(c, "f32[32, %lld]", (long long)widths[w]);
            ir_value_id wv = case_weightf(c, "f32[24, %lld]", (long long)widths[w]),
                        bv = case_weight(c, "f32[24]");
            uint32_t ops[11], n = 0;
            ops[n++] = case_op(c, IR_OP_RMS_NORM, (ir_value_id[]){h, g}, 2);
            ir_op_set_float(&c->m, ops[0], "eps", 1e-5);
            ir_value_id x = case_result(c, ops[0]);
            uint32_t q = ops[n++] = case_op(c, IR_OP_MATMUL, (ir_value_id[]){x, wq}, 2);
            uint32_t k = ops[n++] = case_op(c, IR_OP_MATMUL, (ir_value_id[]){x, wk}, 2);
            uint32_t v = ops[n++] = case_op(c, IR_OP_MATMUL, (ir_value_id[]){x, wv}, 2);
            uint32_t vb = ops[n++] = case_op(c, IR_OP_ADD, (ir_value_id[]){case_result(c, v), bv}, 2);
            uint32_t q_table = case_op(c, IR_OP_ROPE_TABLE, &c->pos, 1);
            ir_op_set_float(&c->m, q_table, "theta", 10000.0);
            ir_op_set_int(&c->m, q_table, "rotary_dim", 12);
            uint32_t k_table = case_op(c, IR_OP_ROPE_TABLE, &c->pos, 1);
            ir_op_set_float(&c->m, k_table, "theta", 500000.0);
            ir_op_set_int(&c->m, k_table, "rotary_dim", 8);
            uint32_t q3 = ops[n++] = reshape_op(c, case_result(c, q), 2, 16);
            uint32_t qr = ops[n++] =
                case_op(c, IR_OP_ROPE, (ir_value_id[]){case_result(c, q3), c->pos, case_result(c, q_table)},
                        tables ? 3 : 2);
            ir_op_set_float(&c->m, qr, "theta", 10000.0);
            ir_op_set_int(&c->m, qr, "rotary_dim", 12);
            uint32_t k3 = ops[n++] = reshape_op(c, case_result(c, k), 4, 8);
            uint32_t kr = ops[n++] =
                case_op(c, IR_OP_ROPE, (ir_value_id[]){case_result(c, k3), c->pos, case_result(c, k_table)},
                        tables ? 3 : 2);
            ir_op_set_float(&c->m, kr, "theta", 500000.0);
            ir_op_set_string(&c->m, kr, "style", "interleaved");
            case_infer(c);
            const ir_value_id outputs[3] = {case_result(c, qr), case_result(c, kr), case_result(c, vb)};
            const int64_t token_counts[3] = {1, 4, 7};
            for (int t = 0; t < 3; t++) {
                case_set_ints_data(c, c->pos, token_counts[t], positions, (uint64_t)token_counts[t]);
                for (int r = 0; r < 2 && tables; r++) { /* the tables the ropes read: their kernels' */
                    uint32_t table = r ? k_table : q_table;
                    ir_value_id angles = case_result(c, table);
                    case_run(c, table, token_counts[t], F32_TOLERANCE);
                    case_set_floats(c, angles, token_counts[t], c->values[angles].buffer,
                                    c->values[angles].count);
                }
                case_run_group(c, ops, n, outputs, 3, token_counts[t], F32_TOLERANCE);
            }
            case_free(c);
        }
}

/* o_proj + residual, and gate/up + SwiGLU (gate and up with biases). */
static void test_gemv_residual_and_swiglu(void **state) {
    (void)state;
    for (int p = 0; p < PRECISION_COUNT; p++) {
        emit_case *c = case_new(precisions[p]);
        ir_value_id a = case_input(c, "a", "f32[tokens, 48]"), h = case_input(c, "h", "f32[tokens, 16]");
        ir_value_id wo = case_weight(c, "f32[16, 48]");
        uint32_t o = case_op(c, IR_OP_MATMUL, (ir_value_id[]){a, wo}, 2);
        uint32_t residual = case_op(c, IR_OP_ADD, (ir_value_id[]){h, case_result(c, o)}, 2);
        ir_value_id wg = case_weight(c, "f32[40, 16]"), wu = case_weight(c, "f32[40, 16]");
        ir_value_id bg = case_weight(c, "f32[40]"), bu = case_weight(c, "f32[40]");
        ir_value_id y = case_result(c, residual);
        uint32_t gate = case_op(c, IR_OP_MATMUL, (ir_value_id[]){y, wg, bg}, 3);
        uint32_t up = case_op(c, IR_OP_MATMUL, (ir_value_id[]){y, wu}, 2);
        uint32_t up_bias = case_op(c, IR_OP_ADD, (ir_value_id[]){case_result(c, up), bu}, 2);
        uint32_t silu = case_op(c, IR_OP_SILU, (ir_value_id[]){case_result(c, gate)}, 1);
        uint32_t mul =
            case_op(c, IR_OP_MUL, (ir_value_id[]){case_result(c, silu), case_result(c, up_bias)}, 2);
        case_infer(c);
        const uint32_t first[2] = {o, residual}, second[5] = {gate, up, up_bias, silu, mul};
        const ir_value_id first_out = case_result(c, residual), second_out = case_result(c, mul);
        for (int64_t t = 1; t <= 6; t += 5) {
            case_run_group(c, first, 2, &first_out, 1, t, F32_TOLERANCE);
            case_run_group(c, second, 5, &second_out, 1, t, F32_TOLERANCE);
        }
        case_free(c);
    }
}

/* Groups with the units to fill an H200 (2,200 rows: at least 132 blocks of
 * 2 warps of 4-lane units, as Llama-3-8B's) take 4 lanes a unit and reduce
 * with shuffles; the small ones above take one lane a unit and none
 * (emit_gemv.c, gemv_shape). o_proj + residual and gate/up + SwiGLU. */
static void test_gemv_wide_groups(void **state) {
    (void)state;
    for (int p = 0; p < PRECISION_COUNT; p++) {
        emit_case *c = case_new(precisions[p]);
        ir_value_id a = case_input(c, "a", "f32[tokens, 48]"), h = case_input(c, "h", "f32[tokens, 2200]");
        ir_value_id x = case_input(c, "x", "f32[tokens, 16]");
        ir_value_id wo = case_weight(c, "f32[2200, 48]");
        uint32_t o = case_op(c, IR_OP_MATMUL, (ir_value_id[]){a, wo}, 2);
        uint32_t residual = case_op(c, IR_OP_ADD, (ir_value_id[]){h, case_result(c, o)}, 2);
        ir_value_id wg = case_weight(c, "f32[2200, 16]"), wu = case_weight(c, "f32[2200, 16]");
        uint32_t gate = case_op(c, IR_OP_MATMUL, (ir_value_id[]){x, wg}, 2);
        uint32_t up = case_op(c, IR_OP_MATMUL, (ir_value_id[]){x, wu}, 2);
        uint32_t silu = case_op(c, IR_OP_SILU, (ir_value_id[]){case_result(c, gate)}, 1);
        uint32_t mul = case_op(c, IR_OP_MUL, (ir_value_id[]){case_result(c, silu), case_result(c, up)}, 2);
        case_infer(c);
        const uint32_t first[2] = {o, residual}, second[4] = {gate, up, silu, mul};
        const ir_value_id first_out = case_result(c, residual), second_out = case_result(c, mul);
        for (int64_t t = 1; t <= 6; t += 5) {
            case_run_group(c, first, 2, &first_out, 1, t, F32_TOLERANCE);
            case_run_group(c, second, 4, &second_out, 1, t, F32_TOLERANCE);
        }
        case_free(c);
    }
}

/* The residual norm: add and the norm of its sum in one kernel, which
 * writes both (RMSNorm; LayerNorm with and without a bias). */
static void test_residual_norm(void **state) {
    (void)state;
    for (int p = 0; p < PRECISION_COUNT; p++)
        for (int kind = 0; kind < 3; kind++) {
            emit_case *c = case_new(precisions[p]);
            ir_value_id a = case_input(c, "a", "f32[tokens, 300]"),
                        b = case_input(c, "b", "f32[tokens, 300]");
            ir_value_id w = case_weight(c, "f32[300]"), bias = case_weight(c, "f32[300]");
            uint32_t add = case_op(c, IR_OP_ADD, (ir_value_id[]){a, b}, 2);
            ir_value_id operands[3] = {case_result(c, add), w, bias};
            uint32_t norm =
                case_op(c, kind == 0 ? IR_OP_RMS_NORM : IR_OP_LAYER_NORM, operands, kind == 2 ? 3 : 2);
            ir_op_set_float(&c->m, norm, "eps", 1e-5);
            case_infer(c);
            const uint32_t ops[2] = {add, norm};
            const ir_value_id outputs[2] = {case_result(c, add), case_result(c, norm)};
            case_run_group(c, ops, 2, outputs, 2, 3, F32_TOLERANCE);
            case_free(c);
        }
}

/* An elementwise chain as one kernel (passes/fuse.c, fuse_elementwise_chains):
 * a bias add, gelu (both forms), a constant scale, tanh; and a [T, 1] gate
 * through sigmoid into a mul with a [T, 3, 5] value and a [3, 1] operand
 * read through the result's coordinates (strided), then silu: against the
 * reference, f32 and bf16, on a token count that is no multiple of a block. */
static void test_elementwise_chain(void **state) {
    (void)state;
    for (int p = 0; p < PRECISION_COUNT; p++)
        for (int form = 0; form < 2; form++) {
            emit_case *c = case_new(precisions[p]);
            ir_value_id x = case_input(c, "x", "f32[tokens, 300]"), bias = case_weight(c, "f32[300]");
            uint32_t add = case_op(c, IR_OP_ADD, (ir_value_id[]){x, bias}, 2);
            ir_value_id sum = case_result(c, add);
            uint32_t gelu = case_op(c, IR_OP_GELU, &sum, 1);
            ir_op_set_string(&c->m, gelu, "approximate", form ? "tanh" : "none");
            uint32_t scale =
                case_op(c, IR_OP_MUL, (ir_value_id[]){case_result(c, gelu), case_const(c, 0.25)}, 2);
            ir_value_id scaled = case_result(c, scale);
            uint32_t tanh = case_op(c, IR_OP_TANH, &scaled, 1);
            case_infer(c);
            const uint32_t ops[4] = {add, gelu, scale, tanh};
            const ir_value_id out = case_result(c, tanh);
            case_run_group(c, ops, 4, &out, 1, 37, p ? BF16_TOLERANCE : F32_TOLERANCE);
            case_free(c);
        }
    for (int p = 0; p < PRECISION_COUNT; p++) {
        emit_case *c = case_new(precisions[p]);
        ir_value_id g = case_input(c, "g", "f32[tokens, 1, 1]"), h = case_input(c, "h", "f32[tokens, 3, 5]");
        ir_value_id column = case_weight(c, "f32[3, 1]");
        uint32_t sigmoid = case_op(c, IR_OP_SIGMOID, &g, 1);
        uint32_t gate = case_op(c, IR_OP_MUL, (ir_value_id[]){case_result(c, sigmoid), h}, 2);
        uint32_t shift = case_op(c, IR_OP_ADD, (ir_value_id[]){column, case_result(c, gate)}, 2);
        ir_value_id shifted = case_result(c, shift);
        uint32_t silu = case_op(c, IR_OP_SILU, &shifted, 1);
        case_infer(c);
        const uint32_t ops[4] = {sigmoid, gate, shift, silu};
        const ir_value_id out = case_result(c, silu);
        case_run_group(c, ops, 4, &out, 1, 5, p ? BF16_TOLERANCE : F32_TOLERANCE);
        case_free(c);
    }
}

/* Rows that int indices cannot hold, and grids a GPU cannot launch, are
 * errors at compile time, not faults at run time. */
static void test_sizes_beyond_kernel_limits(void **state) {
    (void)state;
    emit_case *c = case_new("f32");
    ir_value_id wide = case_input(c, "wide", "f32[tokens, 70000, 40000]");
    uint32_t too_wide = case_op(c, IR_OP_SILU, &wide, 1);
    ir_value_id x = case_input(c, "x", "f32[tokens, 1024]");
    uint32_t many_blocks = case_op(c, IR_OP_SILU, &x, 1);
    case_infer(c);
    assert_emit_fails(c, too_wide,
                      "codegen expects fewer than 2^31 elements per token (or per value without "
                      "tokens); operand 0 of 'silu' has 2800000000");
    c->m.symbols[0].bound = (int64_t)1 << 30;
    assert_emit_fails(c, many_blocks,
                      "'silu' would launch 4294967296 blocks along x at the token bound 1073741824");
    case_free(c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_add_mul_broadcasting),
        cmocka_unit_test(test_activations),
        cmocka_unit_test(test_norms),
        cmocka_unit_test(test_rope),
        cmocka_unit_test(test_rope_scaled),
        cmocka_unit_test(test_rope_table),
        cmocka_unit_test(test_softmax),
        cmocka_unit_test(test_argmax),
        cmocka_unit_test(test_embedding),
        cmocka_unit_test(test_attention_gqa_prefill_then_decode),
        cmocka_unit_test(test_attention_softcap),
        cmocka_unit_test(test_attention_sliding_window),
        cmocka_unit_test(test_attention_mqa_noncausal),
        cmocka_unit_test(test_attention_skips_unwritten_positions),
        cmocka_unit_test(test_attention_fp8_cache_ragged_lengths),
        cmocka_unit_test(test_attention_fp8_cache_head_dims),
        cmocka_unit_test(test_attention_fp8_ptx_for_sm90),
        cmocka_unit_test(test_attention_f16_ptx_for_sm90),
        cmocka_unit_test(test_attention_head_dims),
        cmocka_unit_test(test_attention_ragged_lengths),
        cmocka_unit_test(test_attention_long_context),
        cmocka_unit_test(test_attention_ptx_for_sm90),
        cmocka_unit_test(test_moe_top2_of_4),
        cmocka_unit_test(test_moe_chunks_and_no_normalize),
        cmocka_unit_test(test_moe_ties_go_to_the_lower_expert),
        cmocka_unit_test(test_moe_every_token_to_one_expert),
        cmocka_unit_test(test_moe_slots_span_windows),
        cmocka_unit_test(test_moe_model_dim_not_a_vector_multiple),
        cmocka_unit_test(test_moe_ptx_has_128_bit_loads),
        cmocka_unit_test(test_transpose),
        cmocka_unit_test(test_concat_split_slice),
        cmocka_unit_test(test_kernels_are_named_by_specialisation),
        cmocka_unit_test(test_storage_policy),
        cmocka_unit_test(test_lowering_kinds_and_attention_state),
        cmocka_unit_test(test_token_dim_errors),
        cmocka_unit_test(test_long_symbol_name_is_cut),
        cmocka_unit_test(test_bad_attributes_are_errors),
        cmocka_unit_test(test_sizes_beyond_kernel_limits),
        cmocka_unit_test(test_dtype_without_kernels_is_refused),
        cmocka_unit_test(test_norms_over_other_rows_are_other_kernels),
        cmocka_unit_test(test_group_without_emitter_is_refused),
        cmocka_unit_test(test_gemv_norm_qkv_rope),
        cmocka_unit_test(test_gemv_residual_and_swiglu),
        cmocka_unit_test(test_gemv_wide_groups),
        cmocka_unit_test(test_residual_norm),
        cmocka_unit_test(test_elementwise_chain),
    };
    /* SMELT_TEST_FILTER=pattern runs only the matching tests (cmocka's glob). */
    const char *filter = getenv("SMELT_TEST_FILTER");
    if (filter && *filter) cmocka_set_test_filter(filter);
    return cmocka_run_group_tests(tests, harness_setup, harness_teardown);
}
