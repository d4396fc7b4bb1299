/* test_passes.c - the pass table, the driver, infer-shapes and canonicalize.
 *
 * Modules are built with the builder API; after a pass the test counts the
 * ops and checks which remain and what their types and attributes are. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "ir.h"
#include "pass.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

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

#define assert_log_has(f, message)                                                                           \
    do {                                                                                                     \
        if (!strstr(log_of(f), (message))) fail_msg("expected '%s' in:\n%s", (message), log_of(f));          \
    } while (0)

static ir_type type(smelt_dtype dtype, unsigned rank, const ir_dim *dims) {
    ir_type t = {.dtype = dtype, .rank = (uint8_t)rank};
    for (unsigned i = 0; i < rank; i++)
        t.dims[i] = dims[i];
    return t;
}
#define TYPE(dtype, ...)                                                                                     \
    type(SMELT_DTYPE_##dtype, sizeof((ir_dim[]){__VA_ARGS__}) / sizeof(ir_dim), (ir_dim[]){__VA_ARGS__})
#define SCALAR(dtype) type(SMELT_DTYPE_##dtype, 0, NULL)
#define C(n) ir_dim_const(n)
#define TOKENS ir_dim_symbol(0)

static uint32_t append(fixture *f, ir_op_kind kind, const ir_value_id *operands, uint32_t count) {
    return ir_append_op(&f->m, kind, operands, count, UINT32_MAX, SMELT_NO_LOC);
}

static ir_value_id result(fixture *f, uint32_t op) { return ir_op_result(&f->m, op, 0); }

static ir_value_id declare(fixture *f, ir_op_kind kind, const char *name, ir_type t) {
    uint32_t op = append(f, kind, NULL, 0);
    ir_op_set_string(&f->m, op, "name", name);
    f->m.values[result(f, op)].type = t;
    return result(f, op);
}

static ir_value_id constant(fixture *f, double value) {
    uint32_t op = append(f, IR_OP_CONST, NULL, 0);
    ir_op_set_float(&f->m, op, "value", value);
    f->m.values[result(f, op)].type = SCALAR(F32);
    return result(f, op);
}

/* An op whose result type is set now, as after infer-shapes. */
static ir_value_id typed(fixture *f, ir_op_kind kind, const ir_value_id *operands, uint32_t count,
                         ir_type t) {
    ir_value_id v = result(f, append(f, kind, operands, count));
    f->m.values[v].type = t;
    return v;
}

static ir_value_id unary(fixture *f, ir_op_kind kind, ir_value_id x) {
    return typed(f, kind, &x, 1, f->m.values[x].type);
}

static ir_value_id binary(fixture *f, ir_op_kind kind, ir_value_id a, ir_value_id b) {
    return typed(f, kind, (ir_value_id[]){a, b}, 2, f->m.values[a].type);
}

static uint32_t output(fixture *f, ir_value_id x, const char *name) {
    uint32_t op = append(f, IR_OP_OUTPUT, &x, 1);
    ir_op_set_string(&f->m, op, "name", name);
    return op;
}

static const ir_op *def(fixture *f, ir_value_id v) { return &f->m.ops[f->m.values[v].def_op]; }

/* The operand of output `name`. */
static ir_value_id output_value(fixture *f, const char *name) {
    for (uint32_t i = 0; i < f->m.op_count; i++)
        if (f->m.ops[i].kind == IR_OP_OUTPUT && strcmp(ir_op_string(&f->m, i, "name"), name) == 0)
            return f->m.ops[i].operands[0];
    fail_msg("no output '%s'", name);
    return IR_NO_VALUE;
}

static unsigned count_kind(fixture *f, ir_op_kind kind) {
    unsigned n = 0;
    for (uint32_t i = 0; i < f->m.op_count; i++)
        n += !f->m.ops[i].dead && f->m.ops[i].kind == kind;
    return n;
}

static const char *type_text(fixture *f, ir_value_id v) {
    static char text[IR_TYPE_TEXT_MAX];
    return ir_format_type(&f->m, &f->m.values[v].type, text, sizeof text);
}

static void canonicalize_ok(fixture *f) {
    assert_true(pass_canonicalize(&f->m, &f->d));
    assert_string_equal(log_of(f), "");
    assert_true(ir_verify(&f->m, &f->d));
}

/* ---- the pass table --------------------------------------------------------------- */

static void test_table_is_in_pipeline_order(void **state) {
    size_t count;
    const pass_info *passes = pass_table(&count);
    static const char *const order[] = {"infer-shapes", "canonicalize", "precision",  "fuse",
                                        "wanted-rows",  "schedule",     "plan-memory"};
    assert_int_equal(count, 7);
    for (size_t i = 0; i < count; i++)
        assert_string_equal(passes[i].name, order[i]);
    assert_ptr_equal(passes[2].run, pass_precision);
    assert_ptr_equal(pass_find("canonicalize"), &passes[1]);
    assert_null(pass_find("partition")); /* not listed until it exists */
    assert_null(pass_find("infer"));
}

static void test_parse_list(void **state) {
    fixture *f = *state;
    pass_list list;
    assert_true(pass_parse_list("canonicalize, infer-shapes,canonicalize", &list, &f->d));
    assert_int_equal(list.count, 3);
    assert_string_equal(list.items[0]->name, "canonicalize");
    assert_string_equal(list.items[1]->name, "infer-shapes");
    assert_string_equal(list.items[2]->name, "canonicalize");
    assert_string_equal(log_of(f), "");

    assert_false(pass_parse_list("infer-shapes,decompose,cse", &list, &f->d));
    assert_string_equal(log_of(f), "smelt: error: unknown pass 'decompose'; known passes: infer-shapes, "
                                   "canonicalize, precision, fuse, wanted-rows, schedule, plan-memory\n"
                                   "smelt: error: unknown pass 'cse'; known passes: infer-shapes, "
                                   "canonicalize, precision, fuse, wanted-rows, schedule, plan-memory\n");
    assert_false(pass_parse_list("infer-shapes,,canonicalize", &list, &f->d));
    assert_log_has(f,
                   "expected a pass name in the pass list 'infer-shapes,,canonicalize', found an empty one");
}

static void test_pipeline_until(void **state) {
    fixture *f = *state;
    pass_list list;
    assert_true(pass_pipeline_until("infer-shapes", &list, &f->d));
    assert_int_equal(list.count, 1);
    assert_string_equal(list.items[0]->name, "infer-shapes");
    assert_true(pass_pipeline_until("canonicalize", &list, &f->d));
    assert_int_equal(list.count, 2);
    assert_true(pass_pipeline_until("all", &list, &f->d));
    assert_int_equal(list.count, 7);
    assert_string_equal(list.items[1]->name, "canonicalize");
    assert_string_equal(list.items[4]->name, "wanted-rows");
    assert_string_equal(list.items[5]->name, "schedule");
    assert_string_equal(list.items[6]->name, "plan-memory");
    assert_true(pass_pipeline_until("fuse", &list, &f->d));
    assert_int_equal(list.count, 4);
    assert_false(pass_pipeline_until("partition", &list, &f->d));
    assert_log_has(f, "unknown pass 'partition'; known passes: infer-shapes, canonicalize, precision, fuse, "
                      "wanted-rows, schedule, plan-memory");
}

/* ---- infer-shapes ------------------------------------------------------------------ */

/* ids -> embedding -> rms_norm -> matmul -> output, result types unknown. */
static void build_untyped_model(fixture *f, int64_t w_inner) {
    ir_value_id ids = declare(f, IR_OP_INPUT, "ids", TYPE(I32, TOKENS));
    ir_value_id embed = declare(f, IR_OP_WEIGHT, "embed", TYPE(F32, C(97), C(64)));
    ir_value_id ln = declare(f, IR_OP_WEIGHT, "ln", TYPE(F32, C(64)));
    ir_value_id w = declare(f, IR_OP_WEIGHT, "w", TYPE(F32, C(97), C(w_inner)));
    ir_value_id h = result(f, append(f, IR_OP_EMBEDDING, (ir_value_id[]){embed, ids}, 2));
    uint32_t norm = append(f, IR_OP_RMS_NORM, (ir_value_id[]){h, ln}, 2);
    ir_op_set_float(&f->m, norm, "eps", 1e-5);
    uint32_t logits = append(f, IR_OP_MATMUL, (ir_value_id[]){result(f, norm), w}, 2);
    ir_value_id best = result(f, append(f, IR_OP_ARGMAX, (ir_value_id[]){result(f, logits)}, 1));
    output(f, result(f, logits), "logits");
    output(f, best, "next");
}

static void test_infer_shapes_fills_every_type(void **state) {
    fixture *f = *state;
    build_untyped_model(f, 64);
    assert_true(pass_infer_shapes(&f->m, &f->d));
    assert_string_equal(log_of(f), "");
    assert_string_equal(type_text(f, result(f, 4)), "f32[tokens, 64]"); /* embedding */
    assert_string_equal(type_text(f, result(f, 5)), "f32[tokens, 64]"); /* rms_norm */
    assert_string_equal(type_text(f, result(f, 6)), "f32[tokens, 97]"); /* matmul */
    assert_string_equal(type_text(f, result(f, 7)), "i32[tokens]");     /* argmax */
    assert_string_equal(type_text(f, result(f, 0)), "i32[tokens]");     /* declared, kept */
    assert_true(ir_verify(&f->m, &f->d));
}

static void test_infer_shapes_reports_each_root_cause_once(void **state) {
    fixture *f = *state;
    build_untyped_model(f, 32); /* w is [97, 32]: the matmul is wrong, argmax depends on it */
    ir_value_id x = declare(f, IR_OP_INPUT, "x", TYPE(F32, C(4)));
    ir_value_id y = declare(f, IR_OP_INPUT, "y", TYPE(F32, C(5)));
    result(f, append(f, IR_OP_ADD, (ir_value_id[]){x, y}, 2)); /* a second, independent error */
    assert_false(pass_infer_shapes(&f->m, &f->d));
    assert_int_equal(f->d.error_count, 2);
    assert_log_has(f, "matmul: inner dims differ: x is f32[tokens, 64] but w is f32[97, 32] (layout out_in)");
    assert_log_has(f, "add: operands do not broadcast");
    assert_string_equal(type_text(f, result(f, 5)), "f32[tokens, 64]"); /* before the error: inferred */
    assert_string_equal(type_text(f, result(f, 7)), "?");               /* after it: skipped */
}

static void test_infer_shapes_keeps_agreeing_types_and_refuses_others(void **state) {
    fixture *f = *state;
    ir_value_id x = declare(f, IR_OP_INPUT, "x", TYPE(F32, TOKENS, C(8)));
    ir_value_id agreeing = typed(f, IR_OP_SILU, &x, 1, TYPE(F32, TOKENS, C(8)));
    typed(f, IR_OP_SILU, &agreeing, 1, TYPE(F32, TOKENS, C(9)));
    assert_false(pass_infer_shapes(&f->m, &f->d));
    assert_string_equal(log_of(f), "smelt: error: silu: op result declared as f32[tokens, 9] but inferred "
                                   "f32[tokens, 8]\n");
}

/* ---- canonicalize: folding and identities --------------------------------------- */

static void test_canonicalize_needs_types(void **state) {
    fixture *f = *state;
    build_untyped_model(f, 64);
    assert_false(pass_canonicalize(&f->m, &f->d));
    assert_string_equal(log_of(f),
                        "smelt: error: canonicalize needs inferred types; run infer-shapes first\n");
    assert_int_equal(f->m.op_count, 10); /* untouched */
}

static void test_folds_constant_arithmetic(void **state) {
    fixture *f = *state;
    /* (2 + 3) * 4 + 0.5, as param arithmetic left by elaboration */
    ir_value_id sum = binary(f, IR_OP_ADD, constant(f, 2), constant(f, 3));
    ir_value_id product = binary(f, IR_OP_MUL, sum, constant(f, 4));
    ir_value_id total = binary(f, IR_OP_ADD, product, constant(f, 0.5));
    output(f, total, "scale");
    assert_int_equal(f->m.op_count, 8);
    canonicalize_ok(f);
    assert_int_equal(f->m.op_count, 2); /* const 20.5 and the output */
    ir_value_id folded = output_value(f, "scale");
    assert_int_equal(def(f, folded)->kind, IR_OP_CONST);
    assert_true(ir_op_float(&f->m, f->m.values[folded].def_op, "value") == 20.5);
    assert_string_equal(type_text(f, folded), "f32[]");
}

static void test_integer_constants_fold_only_when_exact(void **state) {
    fixture *f = *state;
    ir_value_id big = constant(f, 65536);
    f->m.values[big].type = SCALAR(I32);
    ir_value_id square = typed(f, IR_OP_MUL, (ir_value_id[]){big, big}, 2, SCALAR(I32)); /* 2^32: no i32 */
    ir_value_id two = constant(f, 2);
    f->m.values[two].type = SCALAR(I32);
    ir_value_id four = typed(f, IR_OP_ADD, (ir_value_id[]){two, two}, 2, SCALAR(I32));
    output(f, square, "square");
    output(f, four, "four");
    canonicalize_ok(f);
    assert_int_equal(def(f, output_value(f, "square"))->kind, IR_OP_MUL);
    assert_int_equal(def(f, output_value(f, "four"))->kind, IR_OP_CONST);
}

static void test_neutral_operands_are_dropped(void **state) {
    fixture *f = *state;
    ir_value_id x = declare(f, IR_OP_INPUT, "x", TYPE(F32, TOKENS, C(8)));
    ir_value_id times_one = binary(f, IR_OP_MUL, x, constant(f, 1.0));
    ir_value_id plus_zero =
        typed(f, IR_OP_ADD, (ir_value_id[]){constant(f, 0.0), times_one}, 2, TYPE(F32, TOKENS, C(8)));
    ir_value_id times_two = binary(f, IR_OP_MUL, plus_zero, constant(f, 2.0));
    output(f, plus_zero, "same");
    output(f, times_two, "double");
    canonicalize_ok(f);
    assert_int_equal(output_value(f, "same"), x);
    const ir_op *doubled = def(f, output_value(f, "double"));
    assert_int_equal(doubled->kind, IR_OP_MUL);
    assert_int_equal(doubled->operands[0], x);
    assert_int_equal(count_kind(f, IR_OP_CONST), 1); /* only the 2.0 is still used */
    assert_int_equal(count_kind(f, IR_OP_ADD), 0);
    assert_int_equal(f->m.op_count, 5); /* x, 2.0, mul, two outputs */
}

static ir_value_id reshape(fixture *f, ir_value_id x, ir_type to) {
    ir_value_id v = typed(f, IR_OP_RESHAPE, &x, 1, to);
    ir_op_set_attr(&f->m, f->m.values[v].def_op, "shape",
                   &(ir_attr){.kind = IR_ATTR_SHAPE, .as.shape = {to.rank, to.dims}});
    return v;
}

static void test_reshapes(void **state) {
    fixture *f = *state;
    ir_value_id x = declare(f, IR_OP_INPUT, "x", TYPE(F32, TOKENS, C(64)));
    ir_value_id same = reshape(f, x, TYPE(F32, TOKENS, C(64)));
    ir_value_id heads = reshape(f, x, TYPE(F32, TOKENS, C(4), C(16)));
    ir_value_id pairs = reshape(f, heads, TYPE(F32, TOKENS, C(2), C(32)));
    ir_value_id back = reshape(f, reshape(f, x, TYPE(F32, C(64), TOKENS)), TYPE(F32, TOKENS, C(64)));
    output(f, same, "same");
    output(f, pairs, "pairs");
    output(f, back, "back");
    canonicalize_ok(f);
    assert_int_equal(output_value(f, "same"), x);
    assert_int_equal(output_value(f, "back"), x);
    const ir_op *r = def(f, output_value(f, "pairs"));
    assert_int_equal(r->kind, IR_OP_RESHAPE);
    assert_int_equal(r->operands[0], x); /* reshape(reshape(x)) -> reshape(x) */
    assert_int_equal(count_kind(f, IR_OP_RESHAPE), 1);
    assert_int_equal(f->m.op_count, 5);
}

static ir_value_id transpose(fixture *f, ir_value_id x, int64_t p0, int64_t p1, int64_t p2) {
    const ir_type *t = &f->m.values[x].type;
    int64_t perm[] = {p0, p1, p2};
    ir_value_id v = typed(f, IR_OP_TRANSPOSE, &x, 1, TYPE(F32, t->dims[p0], t->dims[p1], t->dims[p2]));
    ir_op_set_attr(&f->m, f->m.values[v].def_op, "perm",
                   &(ir_attr){.kind = IR_ATTR_INTS, .as.ints = {3, perm}});
    return v;
}

static void test_transposes(void **state) {
    fixture *f = *state;
    ir_value_id x = declare(f, IR_OP_INPUT, "x", TYPE(F32, TOKENS, C(8), C(64)));
    output(f, transpose(f, x, 0, 1, 2), "identity");
    output(f, transpose(f, transpose(f, x, 1, 2, 0), 0, 2, 1), "composed");
    output(f, transpose(f, transpose(f, x, 1, 2, 0), 2, 0, 1), "inverse");
    canonicalize_ok(f);
    assert_int_equal(output_value(f, "identity"), x);
    assert_int_equal(output_value(f, "inverse"), x);
    ir_value_id composed = output_value(f, "composed");
    const ir_op *t = def(f, composed);
    assert_int_equal(t->kind, IR_OP_TRANSPOSE);
    assert_int_equal(t->operands[0], x);
    const ir_attr *perm = ir_op_attr(&f->m, f->m.values[composed].def_op, "perm");
    assert_int_equal(perm->as.ints.count, 3);
    /* [1, 2, 0] then [0, 2, 1]: dims (8, 64, tokens) then (8, tokens, 64) = x dims [1, 0, 2] */
    assert_int_equal(perm->as.ints.items[0], 1);
    assert_int_equal(perm->as.ints.items[1], 0);
    assert_int_equal(perm->as.ints.items[2], 2);
    assert_string_equal(type_text(f, composed), "f32[8, tokens, 64]");
    assert_int_equal(count_kind(f, IR_OP_TRANSPOSE), 1);
}

/* ---- canonicalize: CSE and DCE ---------------------------------------------------- */

static void test_cse_merges_equal_pure_ops(void **state) {
    fixture *f = *state;
    ir_value_id x = declare(f, IR_OP_INPUT, "x", TYPE(F32, TOKENS, C(64)));
    ir_value_id w = declare(f, IR_OP_WEIGHT, "w", TYPE(F32, C(64), C(64)));
    ir_value_id a = unary(f, IR_OP_SILU, x), b = unary(f, IR_OP_SILU, x);
    ir_value_id sum = binary(f, IR_OP_ADD, a, b);
    ir_value_id m1 = binary(f, IR_OP_MATMUL, sum, w), m2 = binary(f, IR_OP_MATMUL, sum, w);
    ir_value_id m3 = binary(f, IR_OP_MATMUL, sum, w);
    ir_op_set_string(&f->m, f->m.values[m3].def_op, "layout", "in_out"); /* other attribute: kept apart */
    ir_value_id g1 = unary(f, IR_OP_GELU, x), g2 = unary(f, IR_OP_GELU, x);
    ir_op_set_string(&f->m, f->m.values[g2].def_op, "approximate", "none"); /* = the default: merged */
    output(f, binary(f, IR_OP_MUL, m1, m2), "mm");
    output(f, m3, "transposed");
    output(f, binary(f, IR_OP_ADD, g1, g2), "gelu");
    assert_int_equal(f->m.op_count, 15);
    canonicalize_ok(f);
    assert_int_equal(count_kind(f, IR_OP_SILU), 1);
    assert_int_equal(count_kind(f, IR_OP_MATMUL), 2);
    assert_int_equal(count_kind(f, IR_OP_GELU), 1);
    const ir_op *add = def(f, sum);
    assert_int_equal(add->operands[0], a);
    assert_int_equal(add->operands[1], a);
    const ir_op *mul = def(f, output_value(f, "mm"));
    assert_int_equal(mul->operands[0], m1);
    assert_int_equal(mul->operands[1], m1);
    assert_int_equal(f->m.op_count, 12);
}

static void test_cse_keeps_apart_what_differs(void **state) {
    fixture *f = *state;
    ir_value_id zero = constant(f, 0.0), minus_zero = constant(f, -0.0), again = constant(f, 0.0);
    ir_value_id x = declare(f, IR_OP_INPUT, "x", TYPE(F32, C(4)));
    ir_value_id wide = typed(f, IR_OP_SILU, &x, 1, TYPE(F32, C(4)));
    output(f, zero, "a");
    output(f, minus_zero, "b");
    output(f, again, "c");
    output(f, wide, "d");
    /* two attention ops with the same operands each own a KV cache: never merged */
    ir_value_id q = declare(f, IR_OP_INPUT, "q", TYPE(F32, TOKENS, C(2), C(8)));
    ir_value_id pos = declare(f, IR_OP_INPUT, "pos", TYPE(I32, TOKENS));
    for (int i = 0; i < 2; i++) {
        uint32_t op = append(f, IR_OP_ATTENTION, (ir_value_id[]){q, q, q, pos}, 4);
        ir_op_set_float(&f->m, op, "scale", 0.25);
        ir_op_set_int(&f->m, op, "max_seq", 128);
        f->m.values[result(f, op)].type = TYPE(F32, TOKENS, C(2), C(8));
        output(f, result(f, op), i ? "attn1" : "attn0");
    }
    canonicalize_ok(f);
    assert_int_equal(output_value(f, "c"), zero);
    assert_int_not_equal(output_value(f, "b"), zero);
    assert_int_equal(count_kind(f, IR_OP_CONST), 2);
    assert_int_equal(count_kind(f, IR_OP_ATTENTION), 2);
}

static void test_dce_removes_unused_ops_but_keeps_inputs(void **state) {
    fixture *f = *state;
    ir_value_id x = declare(f, IR_OP_INPUT, "x", TYPE(F32, C(4)));
    declare(f, IR_OP_INPUT, "unused_input", TYPE(F32, C(4)));
    ir_value_id unused_weight = declare(f, IR_OP_WEIGHT, "unused_weight", TYPE(F32, C(4)));
    ir_value_id chain = unary(f, IR_OP_SILU, unary(f, IR_OP_GELU, binary(f, IR_OP_ADD, x, unused_weight)));
    (void)chain; /* a dead chain of three ops */
    ir_value_id kept = unary(f, IR_OP_SILU, x);
    output(f, kept, "y");
    assert_int_equal(f->m.op_count, 8);
    canonicalize_ok(f);
    assert_int_equal(f->m.op_count, 4);
    assert_int_equal(f->m.ops[0].kind, IR_OP_INPUT);
    assert_int_equal(f->m.ops[1].kind, IR_OP_INPUT);
    assert_string_equal(ir_op_string(&f->m, 1, "name"), "unused_input");
    assert_int_equal(f->m.ops[2].kind, IR_OP_SILU);
    assert_int_equal(f->m.ops[3].kind, IR_OP_OUTPUT);
    assert_int_equal(output_value(f, "y"), kept);
    assert_int_equal(f->m.values[kept].def_op, 2); /* renumbered by compaction */
}

/* 4,000 layers of duplicated work: CSE must hash, not compare all pairs. */
static void test_cse_scales_linearly(void **state) {
    fixture *f = *state;
    ir_value_id h = declare(f, IR_OP_INPUT, "x", TYPE(F32, TOKENS, C(64)));
    for (int layer = 0; layer < 4000; layer++) {
        ir_value_id a = unary(f, IR_OP_SILU, h), b = unary(f, IR_OP_SILU, h);
        h = binary(f, IR_OP_ADD, a, b);
    }
    output(f, h, "y");
    assert_int_equal(f->m.op_count, 12002);
    clock_t start = clock();
    canonicalize_ok(f);
    double seconds = (double)(clock() - start) / CLOCKS_PER_SEC;
    assert_int_equal(f->m.op_count, 8002);
    assert_true(seconds < 2.0);
}

/* ---- the driver --------------------------------------------------------------------- */

static char *run_printing(fixture *f, const char *passes, const char *print_after, bool *ok) {
    pass_list list;
    assert_true(pass_parse_list(passes, &list, &f->d));
    char *text = NULL;
    size_t size = 0;
    FILE *out = open_memstream(&text, &size);
    pass_driver_options o = {.print_after = print_after, .print_out = out};
    *ok = pass_run_list(&f->m, list.items, list.count, &o, &f->d);
    fclose(out);
    return text;
}

static void test_driver_prints_after_every_pass(void **state) {
    fixture *f = *state;
    build_untyped_model(f, 64);
    bool ok;
    char *text = run_printing(f, "infer-shapes,canonicalize", "all", &ok);
    assert_true(ok);
    const char *first = strstr(text, "# -----// IR Dump After infer-shapes //----- #\nmodule test {\n");
    const char *second = strstr(text, "# -----// IR Dump After canonicalize //----- #\nmodule test {\n");
    assert_ptr_equal(first, text);
    assert_non_null(second);
    assert_non_null(strstr(first, "f32[tokens, 97]"));
    free(text);
}

static void test_driver_prints_after_the_named_pass(void **state) {
    fixture *f = *state;
    build_untyped_model(f, 64);
    bool ok;
    char *text = run_printing(f, "infer-shapes,canonicalize", "canonicalize", &ok);
    assert_true(ok);
    assert_null(strstr(text, "After infer-shapes"));
    assert_ptr_equal(strstr(text, "# -----// IR Dump After canonicalize //----- #\n"), text);
    free(text);
    text = run_printing(f, "canonicalize", NULL, &ok);
    assert_true(ok);
    assert_string_equal(text, "");
    free(text);
}

static void test_driver_refuses_an_unknown_print_after(void **state) {
    fixture *f = *state;
    build_untyped_model(f, 64);
    bool ok;
    char *text = run_printing(f, "infer-shapes", "kv-paging", &ok);
    assert_false(ok);
    assert_log_has(f, "cannot print the IR after unknown pass 'kv-paging'; known passes: infer-shapes, "
                      "canonicalize, precision, fuse, wanted-rows, schedule, plan-memory");
    free(text);
}

static unsigned later_pass_runs;

static bool breaking_pass(ir_module *m, const pass_options *o, diag_engine *d) {
    m->ops[5].attrs[0].kind = IR_ATTR_NONE; /* the rms_norm loses its eps */
    return true;
}

static bool failing_pass(ir_module *m, const pass_options *o, diag_engine *d) { return false; }

static bool counting_pass(ir_module *m, const pass_options *o, diag_engine *d) {
    later_pass_runs++;
    return true;
}

static void test_driver_names_the_pass_that_broke_the_module(void **state) {
    fixture *f = *state;
    build_untyped_model(f, 64);
    const pass_info breaking = {"breaking", "breaks the module", breaking_pass};
    const pass_info counting = {"counting", "counts its runs", counting_pass};
    const pass_info *passes[] = {pass_find("infer-shapes"), &breaking, &counting};
    later_pass_runs = 0;
    assert_false(pass_run_list(&f->m, passes, 3, NULL, &f->d));
    assert_string_equal(log_of(f), "smelt: error: after pass 'breaking': the module does not verify\n"
                                   "smelt: error: rms_norm: missing required attribute 'eps'\n");
    assert_int_equal(later_pass_runs, 0);
}

static void test_driver_stops_at_a_failing_pass(void **state) {
    fixture *f = *state;
    build_untyped_model(f, 64);
    const pass_info failing = {"failing", "fails quietly", failing_pass};
    const pass_info counting = {"counting", "counts its runs", counting_pass};
    const pass_info *passes[] = {&counting, &failing, &counting};
    later_pass_runs = 0;
    assert_false(pass_run_list(&f->m, passes, 3, NULL, &f->d));
    assert_int_equal(later_pass_runs, 1);
    assert_string_equal(log_of(f), "smelt: error: pass 'failing' failed\n");
}

static void test_driver_verifies_its_input(void **state) {
    fixture *f = *state;
    build_untyped_model(f, 64);
    f->m.ops[6].operands[0] = 4242;
    const pass_info counting = {"counting", "counts its runs", counting_pass};
    const pass_info *passes[] = {&counting};
    later_pass_runs = 0;
    assert_false(pass_run_list(&f->m, passes, 1, NULL, &f->d));
    assert_int_equal(later_pass_runs, 0);
    assert_string_equal(log_of(f), "smelt: error: matmul: operand 0 refers to a value that does not exist\n");
}

int main(void) {
    const struct CMUnitTest tests[] = {
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
        T(test_table_is_in_pipeline_order),
        T(test_parse_list),
        T(test_pipeline_until),
        T(test_infer_shapes_fills_every_type),
        T(test_infer_shapes_reports_each_root_cause_once),
        T(test_infer_shapes_keeps_agreeing_types_and_refuses_others),
        T(test_canonicalize_needs_types),
        T(test_folds_constant_arithmetic),
        T(test_integer_constants_fold_only_when_exact),
        T(test_neutral_operands_are_dropped),
        T(test_reshapes),
        T(test_transposes),
        T(test_cse_merges_equal_pure_ops),
        T(test_cse_keeps_apart_what_differs),
        T(test_dce_removes_unused_ops_but_keeps_inputs),
        T(test_cse_scales_linearly),
        T(test_driver_prints_after_every_pass),
        T(test_driver_prints_after_the_named_pass),
        T(test_driver_refuses_an_unknown_print_after),
        T(test_driver_names_the_pass_that_broke_the_module),
        T(test_driver_stops_at_a_failing_pass),
        T(test_driver_verifies_its_input),
#undef T
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
