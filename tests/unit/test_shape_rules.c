/* test_shape_rules.c - ir_infer_op_types: one good and one bad case (at
 * least) per op, against result types and messages worked out by hand. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "ir.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- a module under construction, and what diagnostics it produced ---------- */

typedef struct fixture {
    ir_module m;
    diag_engine d;
    FILE *log;
    char *log_text;
    size_t log_size;
    char inferred[1024];
} fixture;

static int setup(void **state) {
    fixture *f = calloc(1, sizeof *f);
    ir_module_init(&f->m, "test");
    f->log = open_memstream(&f->log_text, &f->log_size);
    diag_init(&f->d, f->log);
    ir_add_symbol(&f->m, "tokens", 8192, SMELT_NO_LOC);
    ir_add_symbol(&f->m, "batch", 64, SMELT_NO_LOC);
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

/* "f32[tokens, 64]", "i32[]" or "?": dims are numbers or symbol names. */
static ir_type type_of_text(fixture *f, const char *text) {
    ir_type t = {0};
    if (strcmp(text, "?") == 0) return t;
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

/* An input or weight of the given type; returns its value. */
static ir_value_id declare(fixture *f, ir_op_kind kind, const char *type) {
    uint32_t op = append(f, kind, NULL, 0);
    ir_op_set_string(&f->m, op, "name", "x");
    f->m.values[ir_op_result(&f->m, op, 0)].type = type_of_text(f, type);
    return ir_op_result(&f->m, op, 0);
}

static ir_value_id input(fixture *f, const char *type) { return declare(f, IR_OP_INPUT, type); }

/* The inferred result types, ", "-separated, or "error". */
static const char *infer(fixture *f, uint32_t op) {
    ir_type out[8];
    assert_true(f->m.ops[op].result_count <= 8);
    if (!ir_infer_op_types(&f->m, op, out, &f->d)) return "error";
    f->inferred[0] = '\0';
    for (uint32_t r = 0; r < f->m.ops[op].result_count; r++) {
        char text[IR_TYPE_TEXT_MAX];
        if (r) strcat(f->inferred, ", ");
        strcat(f->inferred, ir_format_type(&f->m, &out[r], text, sizeof text));
    }
    return f->inferred;
}

static uint32_t op2(fixture *f, ir_op_kind kind, ir_value_id a, ir_value_id b) {
    return append(f, kind, (ir_value_id[]){a, b}, 2);
}

static void set_ints(fixture *f, uint32_t op, const char *name, const int64_t *items, uint32_t count) {
    assert_true(ir_op_set_attr(&f->m, op, name,
                               &(ir_attr){.kind = IR_ATTR_INTS, .as.ints = {count, (int64_t *)items}}));
}

static void set_shape(fixture *f, uint32_t op, const char *type_text) {
    ir_type t = type_of_text(f, type_text);
    assert_true(
        ir_op_set_attr(&f->m, op, "shape", &(ir_attr){.kind = IR_ATTR_SHAPE, .as.shape = {t.rank, t.dims}}));
}

#define assert_infers(f, op, expected) assert_string_equal(infer((f), (op)), (expected))
#define assert_fails_with(f, op, message)                                                                    \
    do {                                                                                                     \
        assert_string_equal(infer((f), (op)), "error");                                                      \
        if (!strstr(log_of(f), (message))) fail_msg("expected '%s' in:\n%s", (message), log_of(f));          \
    } while (0)

/* ---- declarations ------------------------------------------------------------- */

static void test_input(void **state) {
    fixture *f = *state;
    ir_value_id x = input(f, "i32[batch, tokens]");
    assert_infers(f, f->m.values[x].def_op, "i32[batch, tokens]");
    ir_value_id untyped = input(f, "?");
    assert_fails_with(f, f->m.values[untyped].def_op, "smelt: error: input: the declared type is missing");
}

static void test_weight(void **state) {
    fixture *f = *state;
    ir_value_id w = declare(f, IR_OP_WEIGHT, "bf16[97, 64]");
    assert_infers(f, f->m.values[w].def_op, "bf16[97, 64]");
    uint32_t bad = append(f, IR_OP_WEIGHT, &w, 1);
    assert_fails_with(f, bad, "weight: expected 0 operands, found 1");
}

static void test_const(void **state) {
    fixture *f = *state;
    ir_value_id c = declare(f, IR_OP_CONST, "f32[]");
    ir_op_set_float(&f->m, f->m.values[c].def_op, "value", 0.5);
    assert_infers(f, f->m.values[c].def_op, "f32[]");
    ir_value_id v = declare(f, IR_OP_CONST, "f32[4]");
    ir_op_set_float(&f->m, f->m.values[v].def_op, "value", 0.5);
    assert_fails_with(f, f->m.values[v].def_op, "const: a constant must be a scalar, found f32[4]");
    ir_value_id no_value = declare(f, IR_OP_CONST, "f32[]");
    assert_fails_with(f, f->m.values[no_value].def_op, "const: missing required attribute 'value'");
}

static void test_output(void **state) {
    fixture *f = *state;
    ir_value_id x = input(f, "f32[4]");
    assert_infers(f, append(f, IR_OP_OUTPUT, &x, 1), "");
    assert_fails_with(f, op2(f, IR_OP_OUTPUT, x, x), "output: expected 1 operand, found 2");
}

/* ---- compute ----------------------------------------------------------------------- */

static void test_embedding(void **state) {
    fixture *f = *state;
    ir_value_id table = declare(f, IR_OP_WEIGHT, "f32[97, 64]");
    assert_infers(f, op2(f, IR_OP_EMBEDDING, table, input(f, "i32[tokens]")), "f32[tokens, 64]");
    assert_infers(f, op2(f, IR_OP_EMBEDDING, table, input(f, "i64[batch, tokens]")),
                  "f32[batch, tokens, 64]");
    assert_fails_with(f, op2(f, IR_OP_EMBEDDING, table, input(f, "f32[tokens]")),
                      "embedding: ids must have an integer dtype (i32 or i64), found f32[tokens]");
    assert_fails_with(f, op2(f, IR_OP_EMBEDDING, input(f, "f32[97]"), input(f, "i32[tokens]")),
                      "embedding: table must have rank 2, found f32[97]");
}

static void test_matmul(void **state) {
    fixture *f = *state;
    ir_value_id x = input(f, "f32[tokens, 64]");
    assert_infers(f, op2(f, IR_OP_MATMUL, x, declare(f, IR_OP_WEIGHT, "f32[128, 64]")), "f32[tokens, 128]");
    uint32_t in_out = op2(f, IR_OP_MATMUL, x, declare(f, IR_OP_WEIGHT, "f32[64, 128]"));
    ir_op_set_string(&f->m, in_out, "layout", "in_out");
    assert_infers(f, in_out, "f32[tokens, 128]");
    ir_value_id w = declare(f, IR_OP_WEIGHT, "f32[128, 64]");
    uint32_t with_bias =
        append(f, IR_OP_MATMUL, (ir_value_id[]){x, w, declare(f, IR_OP_WEIGHT, "f32[128]")}, 3);
    assert_infers(f, with_bias, "f32[tokens, 128]");

    assert_fails_with(
        f, op2(f, IR_OP_MATMUL, x, declare(f, IR_OP_WEIGHT, "f32[128, 96]")),
        "matmul: inner dims differ: x is f32[tokens, 64] but w is f32[128, 96] (layout out_in)");
    assert_fails_with(f, op2(f, IR_OP_MATMUL, x, declare(f, IR_OP_WEIGHT, "bf16[128, 64]")),
                      "matmul: operand dtypes differ: x is f32 but w is bf16");
    uint32_t bad_bias =
        append(f, IR_OP_MATMUL, (ir_value_id[]){x, w, declare(f, IR_OP_WEIGHT, "f32[64]")}, 3);
    assert_fails_with(f, bad_bias, "matmul: bias must be [N] = f32[128], found f32[64]");
    uint32_t bad_layout = op2(f, IR_OP_MATMUL, x, w);
    ir_op_set_string(&f->m, bad_layout, "layout", "rows");
    assert_fails_with(f, bad_layout, "matmul: layout must be 'out_in' or 'in_out', found 'rows'");
}

static void test_add_broadcasts(void **state) {
    fixture *f = *state;
    ir_value_id x = input(f, "f32[tokens, 64]");
    assert_infers(f, op2(f, IR_OP_ADD, x, input(f, "f32[64]")), "f32[tokens, 64]");
    assert_infers(f, op2(f, IR_OP_ADD, input(f, "f32[1, 64]"), input(f, "f32[tokens, 1]")),
                  "f32[tokens, 64]");
    assert_infers(f, op2(f, IR_OP_ADD, input(f, "f32[]"), x), "f32[tokens, 64]");
    assert_fails_with(
        f, op2(f, IR_OP_ADD, x, input(f, "f32[32]")),
        "add: operands do not broadcast: a is f32[tokens, 64] but b is f32[32] (dims 64 and 32 differ)");
    assert_fails_with(f, op2(f, IR_OP_ADD, x, input(f, "bf16[tokens, 64]")),
                      "add: operand dtypes differ: a is f32 but b is bf16");
}

static void test_mul(void **state) {
    fixture *f = *state;
    ir_value_id x = input(f, "f32[batch, tokens, 64]");
    assert_infers(f, op2(f, IR_OP_MUL, x, input(f, "f32[tokens, 1]")), "f32[batch, tokens, 64]");
    /* a symbol equals only itself, never its bound */
    assert_fails_with(
        f, op2(f, IR_OP_MUL, input(f, "f32[tokens]"), input(f, "f32[8192]")),
        "mul: operands do not broadcast: a is f32[tokens] but b is f32[8192] (dims tokens and 8192 differ)");
}

static void test_rms_norm(void **state) {
    fixture *f = *state;
    ir_value_id x = input(f, "bf16[tokens, 64]");
    uint32_t good = op2(f, IR_OP_RMS_NORM, x, declare(f, IR_OP_WEIGHT, "bf16[64]"));
    ir_op_set_float(&f->m, good, "eps", 1e-5);
    assert_infers(f, good, "bf16[tokens, 64]");
    uint32_t short_weight = op2(f, IR_OP_RMS_NORM, x, declare(f, IR_OP_WEIGHT, "bf16[32]"));
    ir_op_set_float(&f->m, short_weight, "eps", 1e-5);
    assert_fails_with(f, short_weight, "rms_norm: w must be [D] = bf16[64], found bf16[32]");
    uint32_t f32_weight = op2(f, IR_OP_RMS_NORM, x, declare(f, IR_OP_WEIGHT, "f32[64]"));
    ir_op_set_float(&f->m, f32_weight, "eps", 1e-5);
    assert_fails_with(f, f32_weight, "rms_norm: operand dtypes differ: x is bf16 but w is f32");
    uint32_t no_eps = op2(f, IR_OP_RMS_NORM, x, declare(f, IR_OP_WEIGHT, "bf16[64]"));
    assert_fails_with(f, no_eps, "rms_norm: missing required attribute 'eps'");
}

static void test_layer_norm(void **state) {
    fixture *f = *state;
    ir_value_id x = input(f, "f32[tokens, 64]"), w = declare(f, IR_OP_WEIGHT, "f32[64]");
    uint32_t good =
        append(f, IR_OP_LAYER_NORM, (ir_value_id[]){x, w, declare(f, IR_OP_WEIGHT, "f32[64]")}, 3);
    ir_op_set_float(&f->m, good, "eps", 1e-5);
    assert_infers(f, good, "f32[tokens, 64]");
    uint32_t bad = append(f, IR_OP_LAYER_NORM, (ir_value_id[]){x, w, declare(f, IR_OP_WEIGHT, "f32[65]")}, 3);
    ir_op_set_float(&f->m, bad, "eps", 1e-5);
    assert_fails_with(f, bad, "layer_norm: b must be [D] = f32[64], found f32[65]");
    uint32_t negative = op2(f, IR_OP_LAYER_NORM, x, w);
    ir_op_set_float(&f->m, negative, "eps", -1);
    assert_fails_with(f, negative, "layer_norm: eps must be a finite number >= 0, found -1");
}

static uint32_t rope(fixture *f, const char *x, const char *pos, int64_t rotary_dim) {
    uint32_t op = op2(f, IR_OP_ROPE, input(f, x), input(f, pos));
    ir_op_set_float(&f->m, op, "theta", 10000);
    ir_op_set_int(&f->m, op, "rotary_dim", rotary_dim);
    return op;
}

static void test_rope(void **state) {
    fixture *f = *state;
    assert_infers(f, rope(f, "f32[tokens, 8, 64]", "i32[tokens]", 0), "f32[tokens, 8, 64]");
    assert_infers(f, rope(f, "f32[tokens, 8, 64]", "i64[tokens]", 32), "f32[tokens, 8, 64]");
    assert_fails_with(f, rope(f, "f32[tokens, 8, 64]", "i32[tokens]", 3),
                      "rope: rotary_dim must be 0 or even and at most the head dim 64, found 3");
    assert_fails_with(f, rope(f, "f32[tokens, 8, 64]", "i32[tokens]", 66),
                      "rope: rotary_dim must be 0 or even and at most the head dim 64, found 66");
    assert_fails_with(f, rope(f, "f32[tokens, 8, 63]", "i32[tokens]", 0),
                      "rope: the head dim of x must be even, found 63");
    assert_fails_with(f, rope(f, "f32[tokens, 8, 64]", "f32[tokens]", 0),
                      "rope: pos must have an integer dtype (i32 or i64), found f32[tokens]");
    assert_fails_with(f, rope(f, "f32[tokens, 8, 64]", "i32[batch]", 0),
                      "rope: pos must be [T] = i32[tokens], found i32[batch]");
    assert_fails_with(f, rope(f, "f32[tokens, 512]", "i32[tokens]", 0),
                      "rope: x must have rank 3, found f32[tokens, 512]");
}

static uint32_t attention(fixture *f, const char *q, const char *k, const char *v, double scale,
                          int64_t max_seq, int64_t window) {
    uint32_t op = append(f, IR_OP_ATTENTION,
                         (ir_value_id[]){input(f, q), input(f, k), input(f, v), input(f, "i32[tokens]")}, 4);
    ir_op_set_float(&f->m, op, "scale", scale);
    ir_op_set_int(&f->m, op, "max_seq", max_seq);
    ir_op_set_int(&f->m, op, "window", window);
    return op;
}

static void test_attention(void **state) {
    fixture *f = *state;
    const char *q = "f32[tokens, 8, 64]", *kv = "f32[tokens, 2, 64]";
    assert_infers(f, attention(f, q, kv, kv, 0.125, 4096, 0), "f32[tokens, 8, 64]");
    assert_infers(f, attention(f, q, kv, "f32[tokens, 2, 32]", 0.125, 4096, 128), "f32[tokens, 8, 32]");
    assert_fails_with(
        f, attention(f, "f32[tokens, 6, 64]", "f32[tokens, 4, 64]", "f32[tokens, 4, 64]", 0.125, 4096, 0),
        "attention: GQA needs the query heads to be a multiple of the kv heads: q has 6 heads but k has 4");
    assert_fails_with(f, attention(f, q, kv, "f32[tokens, 4, 64]", 0.125, 4096, 0),
                      "attention: k and v must have the same heads (dim 1): k is f32[tokens, 2, 64] but v is "
                      "f32[tokens, 4, 64]");
    assert_fails_with(
        f, attention(f, q, "f32[tokens, 2, 32]", "f32[tokens, 2, 32]", 0.125, 4096, 0),
        "attention: q and k head dims differ: q is f32[tokens, 8, 64] but k is f32[tokens, 2, 32]");
    assert_fails_with(f, attention(f, q, "f32[batch, 2, 64]", kv, 0.125, 4096, 0),
                      "attention: q, k and v must have the same tokens (dim 0)");
    assert_fails_with(f, attention(f, q, kv, kv, 0, 4096, 0), "attention: scale must be > 0, found 0");
    assert_fails_with(f, attention(f, q, kv, kv, 0.125, 0, 0), "attention: max_seq must be >= 1, found 0");
    assert_fails_with(f, attention(f, q, kv, kv, 0.125, 4096, -1),
                      "attention: window must be >= 0, found -1");
    assert_fails_with(
        f, attention(f, q, "f32[tokens, 0, 64]", "f32[tokens, 0, 64]", 0.125, 4096, 0),
        "GQA needs the query heads to be a multiple of the kv heads: q has 8 heads but k has 0");
}

static void test_softmax(void **state) {
    fixture *f = *state;
    ir_value_id x = input(f, "f32[tokens, 97]");
    assert_infers(f, append(f, IR_OP_SOFTMAX, &x, 1), "f32[tokens, 97]");
    uint32_t first = append(f, IR_OP_SOFTMAX, &x, 1);
    ir_op_set_int(&f->m, first, "axis", -2);
    assert_infers(f, first, "f32[tokens, 97]");
    uint32_t bad = append(f, IR_OP_SOFTMAX, &x, 1);
    ir_op_set_int(&f->m, bad, "axis", 2);
    assert_fails_with(f, bad, "softmax: axis 2 is out of range for rank 2 (expected -2..1)");
}

static void test_silu(void **state) {
    fixture *f = *state;
    ir_value_id x = input(f, "bf16[tokens, 256]"), ids = input(f, "i32[tokens]");
    assert_infers(f, append(f, IR_OP_SILU, &x, 1), "bf16[tokens, 256]");
    assert_fails_with(f, append(f, IR_OP_SILU, &ids, 1),
                      "silu: x must have a float dtype, found i32[tokens]");
}

static void test_gelu(void **state) {
    fixture *f = *state;
    ir_value_id x = input(f, "f16[tokens, 256]");
    assert_infers(f, append(f, IR_OP_GELU, &x, 1), "f16[tokens, 256]");
    assert_fails_with(f, op2(f, IR_OP_GELU, x, x), "gelu: expected 1 operand, found 2");
}

static uint32_t moe(fixture *f, const char *down, int64_t top_k) {
    ir_value_id operands[] = {input(f, "f32[tokens, 64]"), declare(f, IR_OP_WEIGHT, "f32[8, 64]"),
                              declare(f, IR_OP_WEIGHT, "f32[8, 224, 64]"),
                              declare(f, IR_OP_WEIGHT, "f32[8, 224, 64]"), declare(f, IR_OP_WEIGHT, down)};
    uint32_t op = append(f, IR_OP_MOE, operands, 5);
    ir_op_set_int(&f->m, op, "top_k", top_k);
    return op;
}

static void test_moe(void **state) {
    fixture *f = *state;
    assert_infers(f, moe(f, "f32[8, 64, 224]", 2), "f32[tokens, 64]");
    assert_infers(f, moe(f, "f32[8, 64, 224]", 8), "f32[tokens, 64]");
    assert_fails_with(f, moe(f, "f32[8, 64, 224]", 9),
                      "moe: top_k must be in [1, 8] (the number of experts), found 9");
    assert_fails_with(f, moe(f, "f32[8, 64, 224]", 0), "moe: top_k must be in [1, 8]");
    assert_fails_with(f, moe(f, "f32[8, 224, 64]", 2),
                      "moe: down must be [E, D, F] = f32[8, 64, 224], found f32[8, 224, 64]");
}

/* ---- layout ------------------------------------------------------------------------- */

static uint32_t reshape(fixture *f, const char *x, const char *shape) {
    ir_value_id v = input(f, x);
    uint32_t op = append(f, IR_OP_RESHAPE, &v, 1);
    set_shape(f, op, shape);
    return op;
}

static void test_reshape(void **state) {
    fixture *f = *state;
    assert_infers(f, reshape(f, "f32[tokens, 64]", "f32[tokens, 4, 16]"), "f32[tokens, 4, 16]");
    assert_infers(f, reshape(f, "f32[tokens, 64]", "f32[32, 2, tokens]"), "f32[32, 2, tokens]");
    assert_infers(f, reshape(f, "f32[batch, tokens, 64]", "f32[tokens, 64, batch]"),
                  "f32[tokens, 64, batch]");
    assert_fails_with(
        f, reshape(f, "f32[tokens, 64]", "f32[tokens, 60]"),
        "reshape: element counts differ: x is f32[tokens, 64] with 64 * tokens elements but the shape "
        "f32[tokens, 60] has 60 * tokens");
    assert_fails_with(
        f, reshape(f, "f32[tokens, 64]", "f32[batch, 64]"),
        "x is f32[tokens, 64] with 64 * tokens elements but the shape f32[batch, 64] has 64 * batch");
    assert_fails_with(f, reshape(f, "f32[64]", "f32[tokens, 64]"),
                      "with 64 elements but the shape f32[tokens, 64] has 64 * tokens");
    ir_value_id v = input(f, "f32[64]");
    uint32_t rank7 = append(f, IR_OP_RESHAPE, &v, 1);
    ir_dim dims[7] = {ir_dim_const(1), ir_dim_const(1), ir_dim_const(1), ir_dim_const(1),
                      ir_dim_const(1), ir_dim_const(1), ir_dim_const(64)};
    ir_op_set_attr(&f->m, rank7, "shape", &(ir_attr){.kind = IR_ATTR_SHAPE, .as.shape = {7, dims}});
    assert_fails_with(f, rank7, "reshape: the shape has 7 dims, more than 6");
}

static void test_transpose(void **state) {
    fixture *f = *state;
    ir_value_id x = input(f, "f32[tokens, 8, 64]");
    uint32_t good = append(f, IR_OP_TRANSPOSE, &x, 1);
    set_ints(f, good, "perm", (int64_t[]){1, 0, 2}, 3);
    assert_infers(f, good, "f32[8, tokens, 64]");
    uint32_t repeated = append(f, IR_OP_TRANSPOSE, &x, 1);
    set_ints(f, repeated, "perm", (int64_t[]){0, 0, 2}, 3);
    assert_fails_with(
        f, repeated, "transpose: perm [0, 0, 2] must list each of the 3 dims of x (f32[tokens, 8, 64]) once");
    uint32_t too_short = append(f, IR_OP_TRANSPOSE, &x, 1);
    set_ints(f, too_short, "perm", (int64_t[]){1, 0}, 2);
    assert_fails_with(f, too_short, "transpose: perm [1, 0] must list each of the 3 dims");
    uint32_t out_of_range = append(f, IR_OP_TRANSPOSE, &x, 1);
    set_ints(f, out_of_range, "perm", (int64_t[]){0, 1, 3}, 3);
    assert_fails_with(f, out_of_range, "transpose: perm [0, 1, 3] must list");
}

static void test_concat(void **state) {
    fixture *f = *state;
    ir_value_id a = input(f, "f32[tokens, 32]"), b = input(f, "f32[tokens, 16]");
    uint32_t good = append(f, IR_OP_CONCAT, (ir_value_id[]){a, b, a}, 3);
    ir_op_set_int(&f->m, good, "axis", -1);
    assert_infers(f, good, "f32[tokens, 80]");
    uint32_t symbolic = op2(f, IR_OP_CONCAT, a, b);
    ir_op_set_int(&f->m, symbolic, "axis", 0);
    assert_fails_with(
        f, symbolic,
        "concat: operand 0 has the symbol 'tokens' on axis 0; concat needs constant sizes on its axis");
    uint32_t mismatched = op2(f, IR_OP_CONCAT, a, input(f, "f32[batch, 16]"));
    ir_op_set_int(&f->m, mismatched, "axis", 1);
    assert_fails_with(f, mismatched,
                      "concat: operand 1 is f32[batch, 16] but operand 0 is f32[tokens, 32]; dims must match "
                      "except on axis 1");
    ir_value_id huge = input(f, "f32[9223372036854775807]");
    uint32_t overflow = op2(f, IR_OP_CONCAT, huge, huge);
    ir_op_set_int(&f->m, overflow, "axis", 0);
    assert_fails_with(f, overflow, "concat: the concatenated axis 0 does not fit in 63 bits");
}

static uint32_t split(fixture *f, const char *x, int64_t axis, const int64_t *sizes, uint32_t count,
                      uint32_t results) {
    ir_value_id v = input(f, x);
    uint32_t op = ir_append_op(&f->m, IR_OP_SPLIT, &v, 1, results, SMELT_NO_LOC);
    ir_op_set_int(&f->m, op, "axis", axis);
    set_ints(f, op, "sizes", sizes, count);
    return op;
}

static void test_split(void **state) {
    fixture *f = *state;
    assert_infers(f, split(f, "f32[tokens, 96]", 1, (int64_t[]){64, 16, 16}, 3, 3),
                  "f32[tokens, 64], f32[tokens, 16], f32[tokens, 16]");
    assert_fails_with(f, split(f, "f32[tokens, 96]", 1, (int64_t[]){64, 16}, 2, 2),
                      "split: sizes [64, 16] add up to 80 but axis 1 of x f32[tokens, 96] is 96");
    assert_fails_with(f, split(f, "f32[tokens, 96]", 1, (int64_t[]){96, 0}, 2, 2),
                      "split: sizes must be > 0, found 0 at index 1");
    assert_fails_with(f, split(f, "f32[tokens, 96]", 1, (int64_t[]){48, 48}, 2, 3),
                      "split: sizes [48, 48] gives 2 results, but the op has 3");
    assert_fails_with(f, split(f, "f32[tokens, 96]", 0, (int64_t[]){48, 48}, 2, 2),
                      "split: the split axis of x must be a constant, found the symbol 'tokens'");
}

static void test_slice(void **state) {
    fixture *f = *state;
    ir_value_id x = input(f, "f32[tokens, 96]");
    uint32_t good = append(f, IR_OP_SLICE, &x, 1);
    ir_op_set_int(&f->m, good, "axis", 1);
    ir_op_set_int(&f->m, good, "start", 32);
    ir_op_set_int(&f->m, good, "end", 96);
    assert_infers(f, good, "f32[tokens, 64]");
    uint32_t bad = append(f, IR_OP_SLICE, &x, 1);
    ir_op_set_int(&f->m, bad, "axis", 1);
    ir_op_set_int(&f->m, bad, "start", 32);
    ir_op_set_int(&f->m, bad, "end", 97);
    assert_fails_with(
        f, bad,
        "slice: start 32 and end 97 must satisfy 0 <= start < end <= 96 (axis 1 of x f32[tokens, 96])");
    uint32_t empty = append(f, IR_OP_SLICE, &x, 1);
    ir_op_set_int(&f->m, empty, "axis", 1);
    ir_op_set_int(&f->m, empty, "start", 5);
    ir_op_set_int(&f->m, empty, "end", 5);
    assert_fails_with(f, empty, "slice: start 5 and end 5 must satisfy");
}

static void test_argmax(void **state) {
    fixture *f = *state;
    ir_value_id x = input(f, "f32[batch, tokens, 97]");
    assert_infers(f, append(f, IR_OP_ARGMAX, &x, 1), "i32[batch, tokens]");
    uint32_t middle = append(f, IR_OP_ARGMAX, &x, 1);
    ir_op_set_int(&f->m, middle, "axis", 1);
    assert_infers(f, middle, "i32[batch, 97]");
    uint32_t bad = append(f, IR_OP_ARGMAX, &x, 1);
    ir_op_set_int(&f->m, bad, "axis", -4);
    assert_fails_with(f, bad, "argmax: axis -4 is out of range for rank 3 (expected -3..2)");
    ir_value_id scalar = input(f, "f32[]");
    assert_fails_with(f, append(f, IR_OP_ARGMAX, &scalar, 1), "argmax: axis -1 is out of range for a scalar");
}

/* ---- structure the rules check before anything else ------------------------------- */

static void test_malformed_ops_are_reported_not_crashed_on(void **state) {
    fixture *f = *state;
    ir_value_id x = input(f, "f32[4]");
    uint32_t missing = append(f, IR_OP_SILU, (ir_value_id[]){12345}, 1);
    assert_fails_with(f, missing, "silu: operand 0 refers to %12345, which does not exist");
    ir_value_id untyped = ir_op_result(&f->m, append(f, IR_OP_SILU, &x, 1), 0);
    assert_fails_with(f, append(f, IR_OP_SILU, &untyped, 1), "silu: operand 0 has no known type");
    uint32_t wrong_kind = append(f, IR_OP_SOFTMAX, &x, 1);
    f->m.ops[wrong_kind].attrs[0] = (ir_attr){.kind = IR_ATTR_FLOAT, .as.f = 1};
    assert_fails_with(f, wrong_kind, "softmax: attribute 'axis' must be int, found float");
    uint32_t no_results = ir_append_op(&f->m, IR_OP_SILU, &x, 1, 0, SMELT_NO_LOC);
    assert_fails_with(f, no_results, "silu: expected 1 result, found 0");
    /* every op kind with no operands and no attributes: an error, never a crash */
    for (int kind = 0; kind < IR_OP_COUNT; kind++) {
        uint32_t op = ir_append_op(&f->m, (ir_op_kind)kind, NULL, 0, 1, SMELT_NO_LOC);
        ir_type out[1];
        bool declares = ir_op_info_of((ir_op_kind)kind)->flags & IR_OPF_DECLARES_TYPE;
        if (!declares) assert_false(ir_infer_op_types(&f->m, op, out, &f->d));
    }
}

static void test_errors_carry_the_op_location(void **state) {
    fixture *f = *state;
    const char source[] = "line one\n  let y = silu(ids)\n";
    int32_t file = diag_add_source(&f->d, "model.smelt", source, sizeof source - 1);
    ir_value_id ids = input(f, "i32[tokens]");
    uint32_t op = ir_append_op(&f->m, IR_OP_SILU, &ids, 1, UINT32_MAX, (smelt_loc){file, 2, 11});
    assert_string_equal(infer(f, op), "error");
    assert_string_equal(log_of(f),
                        "model.smelt:2:11: error: silu: x must have a float dtype, found i32[tokens]\n"
                        "    2 |   let y = silu(ids)\n"
                        "      |           ^\n");
}

static void test_long_symbol_names_are_cut(void **state) {
    fixture *f = *state;
    char name[2000];
    memset(name, 'n', sizeof name - 1);
    name[sizeof name - 1] = '\0';
    int32_t symbol = ir_add_symbol(&f->m, name, 16, SMELT_NO_LOC);
    ir_value_id x = input(f, "f32[4]");
    f->m.values[x].type.dims[0] = ir_dim_symbol(symbol);
    ir_value_id w = declare(f, IR_OP_WEIGHT, "f32[8, 4]");
    assert_fails_with(f, op2(f, IR_OP_MATMUL, x, w), "...] but w is f32[8, 4]");
    assert_true(strlen(log_of(f)) < 300);
}

int main(void) {
    const struct CMUnitTest tests[] = {
#define T(name) cmocka_unit_test_setup_teardown(name, setup, teardown)
        T(test_input),
        T(test_weight),
        T(test_const),
        T(test_output),
        T(test_embedding),
        T(test_matmul),
        T(test_add_broadcasts),
        T(test_mul),
        T(test_rms_norm),
        T(test_layer_norm),
        T(test_rope),
        T(test_attention),
        T(test_softmax),
        T(test_silu),
        T(test_gelu),
        T(test_moe),
        T(test_reshape),
        T(test_transpose),
        T(test_concat),
        T(test_split),
        T(test_slice),
        T(test_argmax),
        T(test_malformed_ops_are_reported_not_crashed_on),
        T(test_errors_carry_the_op_location),
        T(test_long_symbol_names_are_cut),
#undef T
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
