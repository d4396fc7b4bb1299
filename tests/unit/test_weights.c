/* test_weights.c - binding IR weight ops to checkpoint tensors and reading
 * them as f32.
 *
 * Checkpoints are written with st_write_file into a fresh temporary folder;
 * modules are built op by op (or elaborated from DSL text for the end-to-end
 * case). Diagnostics go to a memory stream.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "frontend.h"
#include "numeric.h"
#include "weights.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static diag_engine diag;
static FILE *diag_stream;
static char *diag_buffer;
static size_t diag_size;
static char folder[64];
static char checkpoint_path[128];
static ir_module module;
static st_checkpoint checkpoint;
static fe_weight_binding binding;

static int setup(void **state) {
    (void)state;
    diag_stream = open_memstream(&diag_buffer, &diag_size);
    diag_init(&diag, diag_stream);
    snprintf(folder, sizeof folder, "/tmp/smelt-test-weights-XXXXXX");
    if (!mkdtemp(folder)) fail_msg("mkdtemp failed");
    snprintf(checkpoint_path, sizeof checkpoint_path, "%s/model.safetensors", folder);
    ir_module_init(&module, "m");
    memset(&checkpoint, 0, sizeof checkpoint);
    memset(&binding, 0, sizeof binding);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    fe_weight_binding_free(&binding);
    st_checkpoint_close(&checkpoint);
    ir_module_free(&module);
    diag_free(&diag);
    fclose(diag_stream);
    free(diag_buffer);
    diag_buffer = NULL;
    unlink(checkpoint_path);
    rmdir(folder);
    return 0;
}

static const char *diagnostics(void) {
    fflush(diag_stream);
    return diag_buffer ? diag_buffer : "";
}

static void expect_diag(const char *text) {
    if (!strstr(diagnostics(), text))
        fail_msg("expected in diagnostics: %s\n--- got:\n%s", text, diagnostics());
}

static unsigned occurrences(const char *text) {
    unsigned n = 0;
    for (const char *p = diagnostics(); (p = strstr(p, text)) != NULL; p++)
        n++;
    return n;
}

static void write_checkpoint(const st_write_tensor *tensors, size_t count) {
    assert_true(st_write_file(checkpoint_path, tensors, count, NULL, &diag));
    assert_true(st_checkpoint_open(checkpoint_path, &checkpoint, &diag));
}

/* Appends `weight() {name, stack}` of type dtype[dims...] at line `line`. */
static uint32_t add_weight(const char *name, const char *stack, smelt_dtype dtype, uint8_t rank,
                           const int64_t *dims, uint32_t line) {
    int32_t file = diag_file_id(&diag, "model.smelt");
    uint32_t op = ir_append_op(&module, IR_OP_WEIGHT, NULL, 0, UINT32_MAX, (smelt_loc){file, line, 0});
    assert_true(ir_op_set_string(&module, op, "name", name));
    if (stack) assert_true(ir_op_set_string(&module, op, "stack", stack));
    ir_op_fill_defaults(&module, op);
    ir_type t = {.dtype = dtype, .rank = rank};
    for (uint8_t i = 0; i < rank; i++)
        t.dims[i] = ir_dim_const(dims[i]);
    module.values[ir_op_result(&module, op, 0)].type = t;
    return op;
}

/* ---- binding that works -------------------------------------------------------------- */

static void test_binds_and_reads_plain_weights(void **state) {
    (void)state;
    float embed[6] = {1, 2, 3, 4, 5, 6};
    uint16_t norm[4] = {0x3f80, 0xc000, 0x3e80, 0x0000}; /* bf16: 1, -2, 0.25, 0 */
    uint8_t fp8[2] = {0x7e, 0xb8};                       /* e4m3: 448, -1 */
    uint64_t shape_embed[] = {2, 3}, shape_norm[] = {4}, shape_fp8[] = {2};
    st_write_tensor tensors[] = {
        {"model.embed_tokens.weight", ST_DTYPE_F32, 2, shape_embed, embed},
        {"model.norm.weight", ST_DTYPE_BF16, 1, shape_norm, norm},
        {"scale", ST_DTYPE_F8_E4M3, 1, shape_fp8, fp8},
    };
    write_checkpoint(tensors, 3);
    uint32_t w_embed =
        add_weight("model.embed_tokens.weight", NULL, SMELT_DTYPE_F32, 2, (int64_t[]){2, 3}, 1);
    uint32_t w_norm = add_weight("model.norm.weight", NULL, SMELT_DTYPE_BF16, 1, (int64_t[]){4}, 2);
    uint32_t w_tied = add_weight("model.embed_tokens.weight", NULL, SMELT_DTYPE_F32, 2, (int64_t[]){2, 3}, 3);
    uint32_t w_fp8 = add_weight("scale", NULL, SMELT_DTYPE_F32, 1, (int64_t[]){2}, 4);
    assert_true(fe_bind_weights(&module, &checkpoint, &diag, &binding));
    assert_int_equal(diag.error_count + diag.warning_count, 0);

    const fe_bound_weight *w = fe_weight_binding_get(&binding, w_embed);
    assert_non_null(w);
    assert_int_equal(w->part_count, 1);
    assert_int_equal(w->element_count, 6);
    assert_ptr_equal(w->parts[0], st_checkpoint_find(&checkpoint, "model.embed_tokens.weight"));
    float got[6];
    assert_true(fe_weight_read_f32(&binding, w_embed, got, 6));
    assert_memory_equal(got, embed, sizeof embed);
    assert_true(fe_weight_read_f32(&binding, w_tied, got, 6)); /* one tensor, two weights */
    assert_memory_equal(got, embed, sizeof embed);
    assert_true(fe_weight_read_f32(&binding, w_norm, got, 4));
    assert_true(got[0] == 1.0f && got[1] == -2.0f && got[2] == 0.25f && got[3] == 0.0f);
    assert_true(fe_weight_read_f32(&binding, w_fp8, got, 2));
    assert_true(got[0] == 448.0f && got[1] == -1.0f);

    /* Wrong element count or an op that is no weight: nothing is written. */
    got[0] = 42;
    assert_false(fe_weight_read_f32(&binding, w_embed, got, 5));
    assert_false(fe_weight_read_f32(&binding, 1000, got, 6));
    assert_true(got[0] == 42);
}

/* A checkpoint shortened after it was opened (another process rewriting
 * it): reading a weight is an error naming the tensor, not SIGBUS from the
 * mapping. 32 KiB per tensor, so that the data lies on pages past the new end. */
static void test_truncated_after_open_is_an_error(void **state) {
    (void)state;
    enum { N = 8192 };
    static float values[N];
    static uint16_t halves[N];
    uint64_t shape[] = {N};
    st_write_tensor tensors[] = {
        {"a", ST_DTYPE_F32, 1, shape, values},
        {"b", ST_DTYPE_BF16, 1, shape, halves},
    };
    write_checkpoint(tensors, 2);
    uint32_t wa = add_weight("a", NULL, SMELT_DTYPE_F32, 1, (int64_t[]){N}, 1);
    uint32_t wb = add_weight("b", NULL, SMELT_DTYPE_F32, 1, (int64_t[]){N}, 2);
    assert_true(fe_bind_weights(&module, &checkpoint, &diag, &binding));
    assert_int_equal(truncate(checkpoint_path, 0), 0);
    static float got[N];
    assert_false(fe_weight_read_f32(&binding, wa, got, N));
    expect_diag("model.safetensors: error: tensor 'a': the file ends at byte");
    expect_diag("it was truncated after it was opened\n");
    assert_false(fe_weight_read_f32(&binding, wb, got, N));
    expect_diag("model.safetensors: error: tensor 'b': the file ends at byte");
}

/* Every "{e}" of the template is replaced; "{ex}" names another variable
 * and stays as it is. */
static void test_stack_variable_replaced_everywhere(void **state) {
    (void)state;
    float data[2][2] = {{1, 2}, {3, 4}};
    uint64_t shape[] = {2};
    st_write_tensor tensors[] = {
        {"x.1.y.1.{ex}", ST_DTYPE_F32, 1, shape, data[1]},
        {"x.0.y.0.{ex}", ST_DTYPE_F32, 1, shape, data[0]},
    };
    write_checkpoint(tensors, 2);
    uint32_t op = add_weight("x.{e}.y.{e}.{ex}", "e", SMELT_DTYPE_F32, 2, (int64_t[]){2, 2}, 1);
    assert_true(fe_bind_weights(&module, &checkpoint, &diag, &binding));
    float got[4];
    assert_true(fe_weight_read_f32(&binding, op, got, 4));
    assert_true(got[0] == 1 && got[1] == 2 && got[2] == 3 && got[3] == 4);
    assert_int_equal(diag.error_count + diag.warning_count, 0);
}

/* A transposed weight [N, K] (a Conv1D weight precision made out_in) binds
 * the checkpoint's [K, N] tensor and reads its transpose; the [N, K] shape
 * itself is refused, with both shapes named. */
static void test_transposed_weight_reads_its_transpose(void **state) {
    (void)state;
    float data[2][3] = {{1, 2, 3}, {4, 5, 6}}; /* [K = 2, N = 3] */
    uint64_t shape[] = {2, 3};
    st_write_tensor tensors[] = {{"h.0.attn.c_attn.weight", ST_DTYPE_F32, 2, shape, data}};
    write_checkpoint(tensors, 1);
    uint32_t op = add_weight("h.0.attn.c_attn.weight", "", SMELT_DTYPE_F32, 2, (int64_t[]){3, 2}, 1);
    ir_op_set_bool(&module, op, "transposed", true);
    assert_true(fe_bind_weights(&module, &checkpoint, &diag, &binding));
    float got[6];
    assert_true(fe_weight_read_f32(&binding, op, got, 6));
    const float expected[6] = {1, 4, 2, 5, 3, 6}; /* [N = 3, K = 2] */
    for (int i = 0; i < 6; i++)
        assert_true(got[i] == expected[i]);
    assert_int_equal(diag.error_count + diag.warning_count, 0);
    fe_weight_binding_free(&binding);
    ir_op_set_bool(&module, op, "transposed", false); /* [3, 2] against the tensor's [2, 3] */
    assert_false(fe_bind_weights(&module, &checkpoint, &diag, &binding));
    assert_int_equal(diag.error_count, 1);
}

/* Part i of a stacked weight is the tensor named with {e} = i; the parts
 * lie one after the other in the result, whatever the checkpoint's order. */
static void test_stacked_parts_in_order(void **state) {
    (void)state;
    uint16_t parts[3][4];
    for (int e = 0; e < 3; e++)
        for (int i = 0; i < 4; i++)
            parts[e][i] = plan_f32_to_f16((float)(10 * e + i));
    uint64_t shape[] = {2, 2};
    st_write_tensor tensors[] = {
        {"model.experts.2.w1.weight", ST_DTYPE_F16, 2, shape, parts[2]},
        {"model.experts.0.w1.weight", ST_DTYPE_F16, 2, shape, parts[0]},
        {"model.experts.1.w1.weight", ST_DTYPE_F16, 2, shape, parts[1]},
    };
    write_checkpoint(tensors, 3);
    uint32_t op =
        add_weight("model.experts.{e}.w1.weight", "e", SMELT_DTYPE_BF16, 3, (int64_t[]){3, 2, 2}, 1);
    assert_true(fe_bind_weights(&module, &checkpoint, &diag, &binding));
    assert_int_equal(diag.error_count + diag.warning_count, 0);
    const fe_bound_weight *w = fe_weight_binding_get(&binding, op);
    assert_non_null(w);
    assert_int_equal(w->part_count, 3);
    assert_int_equal(w->element_count, 12);
    assert_string_equal(w->parts[0]->name, "model.experts.0.w1.weight");
    assert_string_equal(w->parts[2]->name, "model.experts.2.w1.weight");
    float got[12];
    assert_true(fe_weight_read_f32(&binding, op, got, 12));
    for (int e = 0; e < 3; e++)
        for (int i = 0; i < 4; i++)
            assert_true(got[4 * e + i] == (float)(10 * e + i));
}

/* ---- binding errors: every one reported ----------------------------------------------- */

static void test_reports_every_binding_error(void **state) {
    (void)state;
    float data[32] = {0};
    int32_t ints[4] = {0};
    uint64_t shape_48[] = {4, 8}, shape_4[] = {4}, shape_2x2[] = {2, 2}, shape_3x2[] = {3, 2};
    st_write_tensor tensors[] = {
        {"model.layers.0.mlp.up_proj.weight", ST_DTYPE_F32, 2, shape_48, data},
        {"ids", ST_DTYPE_I32, 1, shape_4, ints},
        {"e.0.w", ST_DTYPE_F32, 2, shape_2x2, data},
        {"e.1.w", ST_DTYPE_F32, 2, shape_3x2, data},
        {"good", ST_DTYPE_F32, 1, shape_4, data},
    };
    write_checkpoint(tensors, 5);
    add_weight("model.layers.0.mlp.up_proj.weight", NULL, SMELT_DTYPE_F32, 2, (int64_t[]){8, 4}, 1);
    add_weight("model.layers.0.mlp.down_proj.weight", NULL, SMELT_DTYPE_F32, 2, (int64_t[]){4, 8}, 2);
    add_weight("ids", NULL, SMELT_DTYPE_F32, 1, (int64_t[]){4}, 3);
    add_weight("e.{e}.w", "e", SMELT_DTYPE_F32, 3, (int64_t[]){3, 2, 2},
               4); /* 1 has the wrong shape, 2 is missing */
    uint32_t good = add_weight("good", NULL, SMELT_DTYPE_F32, 1, (int64_t[]){4}, 5);
    assert_false(fe_bind_weights(&module, &checkpoint, &diag, &binding));
    expect_diag("model.smelt:1: error: weight 'model.layers.0.mlp.up_proj.weight' has shape [4, 8] in the "
                "checkpoint but the model expects [8, 4]\n");
    expect_diag(
        "model.smelt:2: error: weight 'model.layers.0.mlp.down_proj.weight' is not in the checkpoint\n");
    expect_diag(
        "model.smelt:3: error: weight 'ids' has dtype I32 in the checkpoint; weights must have a float "
        "dtype (F32, F16, BF16, F8_E4M3 or F8_E5M2)\n");
    expect_diag("model.smelt:4: error: weight 'e.1.w' has shape [3, 2] in the checkpoint but the model "
                "expects [2, 2]\n");
    expect_diag("model.smelt:4: error: weight 'e.2.w' is not in the checkpoint\n");
    assert_int_equal(diag.error_count, 5);
    assert_int_equal(diag.warning_count, 0); /* every tensor was asked for */
    /* What could be bound still is. */
    assert_non_null(fe_weight_binding_get(&binding, good));
    assert_null(fe_weight_binding_get(&binding, 0));
    assert_null(fe_weight_binding_get(&binding, 3));
}

static void test_refuses_symbolic_and_malformed_weights(void **state) {
    (void)state;
    float data[4] = {0};
    uint64_t shape_4[] = {4};
    st_write_tensor tensors[] = {{"w", ST_DTYPE_F32, 1, shape_4, data}};
    write_checkpoint(tensors, 1);
    int32_t tokens = ir_add_symbol(&module, "tokens", 16, SMELT_NO_LOC);
    uint32_t op = add_weight("w", NULL, SMELT_DTYPE_F32, 1, (int64_t[]){4}, 1);
    module.values[ir_op_result(&module, op, 0)].type.dims[0] = ir_dim_symbol(tokens);
    add_weight("x.{e}", "e", SMELT_DTYPE_F32, 1, (int64_t[]){4}, 2);
    add_weight("x.w", "e", SMELT_DTYPE_F32, 2, (int64_t[]){1, 4}, 3);
    add_weight("x.{e}", "e", SMELT_DTYPE_F32, 2, (int64_t[]){1000000000, 4}, 4);
    assert_false(fe_bind_weights(&module, &checkpoint, &diag, &binding));
    expect_diag("model.smelt:1: error: weight 'w' has dim 0 'tokens'; weight dims must be constants");
    expect_diag(
        "model.smelt:2: error: stacked weight 'x.{e}' needs at least 2 dims (dim 0 counts the parts)");
    expect_diag("model.smelt:3: error: the name of stacked weight 'x.w' must contain '{e}'");
    expect_diag("model.smelt:4: error: stacked weight 'x.{e}' has 1000000000 parts but the checkpoint holds "
                "only 1 tensor\n");
    assert_int_equal(diag.error_count, 5); /* and the unused tensor 'w' */
}

/* Tensors no weight uses are listed in one error: the count, ten names, "...". */
static void test_refuses_unused_tensors_once(void **state) {
    (void)state;
    float value = 1;
    uint64_t shape_1[] = {1};
    st_write_tensor tensors[13];
    char names[13][16];
    for (int i = 0; i < 13; i++) {
        snprintf(names[i], sizeof names[i], "t%02d", i);
        tensors[i] = (st_write_tensor){names[i], ST_DTYPE_F32, 1, shape_1, &value};
    }
    write_checkpoint(tensors, 13);
    add_weight("t05", NULL, SMELT_DTYPE_F32, 1, (int64_t[]){1}, 1);
    assert_false(fe_bind_weights(&module, &checkpoint, &diag, &binding));
    assert_int_equal(diag.error_count, 1);
    assert_int_equal(binding.unused_count, 12);
    expect_diag(
        "model.safetensors: error: 12 tensors of the checkpoint are used by no weight of the model: 't00', "
        "'t01', 't02', 't03', 't04', 't06', 't07', 't08', 't09', 't10', ...\n");
    expect_diag("--allow-unused-tensor NAME");
    assert_int_equal(occurrences("'t11'"), 0);
    fe_weight_binding_free(&binding);

    /* A dead op uses nothing; one unused tensor reads in the singular. */
    for (int i = 0; i < 13; i++)
        if (i != 5) add_weight(names[i], NULL, SMELT_DTYPE_F32, 1, (int64_t[]){1}, 2);
    module.ops[0].dead = true;
    assert_false(fe_bind_weights(&module, &checkpoint, &diag, &binding));
    expect_diag("error: 1 tensor of the checkpoint is used by no weight of the model: 't05'\n");
    fe_weight_binding_free(&binding);

    /* An ignore pattern covers it: bound, with nothing to say. */
    unsigned errors = diag.error_count;
    ir_add_ignored_tensor(&module, "t*5");
    assert_true(fe_bind_weights(&module, &checkpoint, &diag, &binding));
    assert_int_equal(diag.error_count, errors);
    assert_int_equal(binding.unused_count, 1);
}

/* '*' is any run of characters, '.' included; everything else is itself:
 * the one semantics of `ignore`, --allow-unused-tensor and --keep (which
 * fnmatch matched before, with '?', '[...]' and a backslash as its own). */
static void test_tensor_patterns(void **state) {
    (void)state;
    assert_true(ir_tensor_pattern_matches("lm_head.weight", "lm_head.weight"));
    assert_false(ir_tensor_pattern_matches("lm_head.weight", "lm_head.weights"));
    assert_false(ir_tensor_pattern_matches("lm_head.weight", "lm_head.weigh"));
    const char *rotary = "model.layers.*.self_attn.rotary_emb.inv_freq";
    assert_true(ir_tensor_pattern_matches(rotary, "model.layers.0.self_attn.rotary_emb.inv_freq"));
    assert_true(ir_tensor_pattern_matches(rotary, "model.layers.31.self_attn.rotary_emb.inv_freq"));
    assert_true(ir_tensor_pattern_matches(rotary, "model.layers.0.mlp.self_attn.rotary_emb.inv_freq"));
    assert_false(ir_tensor_pattern_matches(rotary, "model.layers.0.self_attn.q_proj.weight"));
    assert_true(ir_tensor_pattern_matches("*.bias", "x.bias"));
    assert_true(ir_tensor_pattern_matches("*.bias", "a.x.bias"));
    assert_false(ir_tensor_pattern_matches("*.bias", "bias"));
    assert_true(ir_tensor_pattern_matches("*.*.bias", "a.x.bias"));
    assert_false(ir_tensor_pattern_matches("*.*.bias", "x.bias"));
    assert_true(ir_tensor_pattern_matches("a*b*c", "axxbyybc"));
    assert_false(ir_tensor_pattern_matches("a*b*c", "axxbyybcd"));
    assert_true(ir_tensor_pattern_matches("*", ""));
    assert_true(ir_tensor_pattern_matches("*", "a.b"));
    /* --keep's examples, across the layers' dots */
    assert_true(ir_tensor_pattern_matches("*.down_proj", "model.layers.0.mlp.down_proj"));
    assert_false(ir_tensor_pattern_matches("*.down_proj", "model.layers.0.mlp.down_proj.weight"));
    assert_true(
        ir_tensor_pattern_matches("*.experts.*", "model.layers.1.block_sparse_moe.experts.{e}.w1.weight"));
    assert_false(ir_tensor_pattern_matches("*.experts.*", "model.layers.1.block_sparse_moe.gate.weight"));
    /* the backtrack past an early partial match: "*.a.b" in "x.a.a.b" */
    assert_true(ir_tensor_pattern_matches("*.a.b", "x.a.a.b"));
    /* fnmatch's other wildcards and its escape are characters like any other */
    assert_false(ir_tensor_pattern_matches("lm_hea?", "lm_head"));
    assert_true(ir_tensor_pattern_matches("lm_hea?", "lm_hea?"));
    assert_false(ir_tensor_pattern_matches("[lm]_head", "l_head"));
    assert_false(ir_tensor_pattern_matches("lm\\_head", "lm_head"));
}

/* ---- end to end: DSL -> IR -> binding ------------------------------------------------------ */

static const char model_text[] = "model tiny {\n"
                                 "  dim tokens <= 16\n"
                                 "  input ids: i32[tokens]\n"
                                 "  weight embed: [5, 4] = \"model.embed_tokens.weight\"\n"
                                 "  let h = embedding(embed, ids)\n"
                                 "  for l in 0..2 {\n"
                                 "    weight ln: bf16[4] = \"model.layers.{l}.norm.weight\"\n"
                                 "    h = rms_norm(h, ln, eps = 0.00001)\n"
                                 "  }\n"
                                 "  weight w1: [2, 3, 4] = \"model.experts.{e}.w1.weight\" stacked e\n"
                                 "  ignore \"lm_head.weight\"\n"
                                 "  output out = h\n"
                                 "}\n";

static void test_binds_an_elaborated_model(void **state) {
    (void)state;
    float embed[20], norm[4] = {1, 1, 1, 1}, expert[2][12];
    for (int i = 0; i < 20; i++)
        embed[i] = (float)i;
    for (int e = 0; e < 2; e++)
        for (int i = 0; i < 12; i++)
            expert[e][i] = (float)(100 * e + i);
    uint64_t shape_embed[] = {5, 4}, shape_norm[] = {4}, shape_expert[] = {3, 4};
    st_write_tensor tensors[] = {
        {"model.embed_tokens.weight", ST_DTYPE_F32, 2, shape_embed, embed},
        {"model.layers.0.norm.weight", ST_DTYPE_F32, 1, shape_norm, norm},
        {"model.layers.1.norm.weight", ST_DTYPE_F32, 1, shape_norm, norm},
        {"model.experts.0.w1.weight", ST_DTYPE_F32, 2, shape_expert, expert[0]},
        {"model.experts.1.w1.weight", ST_DTYPE_F32, 2, shape_expert, expert[1]},
        {"lm_head.weight", ST_DTYPE_F32, 2, shape_embed, embed},
    };
    write_checkpoint(tensors, 6);
    ir_module_free(&module);
    ast_model ast;
    ast_model_init(&ast);
    bool parsed = fe_parse_dsl_text("tiny.smelt", model_text, strlen(model_text), &diag, &ast);
    if (!parsed) fail_msg("the test model does not parse:\n%s", diagnostics());
    bool elaborated = fe_elaborate(&ast, NULL, &diag, &module);
    ast_model_free(&ast);
    if (!elaborated) fail_msg("the test model does not elaborate:\n%s", diagnostics());

    assert_true(fe_bind_weights(&module, &checkpoint, &diag, &binding));
    assert_int_equal(diag.error_count, 0);
    assert_int_equal(diag.warning_count, 0); /* lm_head.weight: ignored by the model */
    assert_int_equal(binding.unused_count, 1);
    unsigned weights = 0;
    for (uint32_t op = 0; op < module.op_count; op++) {
        if (module.ops[op].kind != IR_OP_WEIGHT) continue;
        weights++;
        const fe_bound_weight *w = fe_weight_binding_get(&binding, op);
        assert_non_null(w);
        if (strcmp(ir_op_string(&module, op, "name"), "model.experts.{e}.w1.weight") == 0) {
            float got[24];
            assert_int_equal(w->part_count, 2);
            assert_true(fe_weight_read_f32(&binding, op, got, 24));
            for (int i = 0; i < 24; i++)
                assert_true(got[i] == (float)(100 * (i / 12) + i % 12));
        }
    }
    assert_int_equal(weights, 4);

    /* A wrong shape is reported at the weight's line in the DSL. */
    fe_weight_binding_free(&binding);
    module.values[module.ops[1].results[0]].type.dims[1] = ir_dim_const(8);
    assert_int_equal(module.ops[1].kind, IR_OP_WEIGHT);
    assert_false(fe_bind_weights(&module, &checkpoint, &diag, &binding));
    expect_diag(
        "tiny.smelt:4:3: error: weight 'model.embed_tokens.weight' has shape [5, 4] in the checkpoint but "
        "the model expects [5, 8]\n");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_binds_and_reads_plain_weights, setup, teardown),
        cmocka_unit_test_setup_teardown(test_truncated_after_open_is_an_error, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stack_variable_replaced_everywhere, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stacked_parts_in_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_transposed_weight_reads_its_transpose, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reports_every_binding_error, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refuses_symbolic_and_malformed_weights, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refuses_unused_tensors_once, setup, teardown),
        cmocka_unit_test(test_tensor_patterns),
        cmocka_unit_test_setup_teardown(test_binds_an_elaborated_model, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
