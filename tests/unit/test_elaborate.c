/* test_elaborate.c - fe_elaborate: syntax trees built by hand become IR.
 *
 * Each test builds a model with the small builders below (the DSL it stands
 * for is in the test's comment), elaborates it and checks the ops, their
 * attributes and the diagnostics, which go to a memory stream. Statement
 * lines are given with AT(line) so that messages can be checked by location.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "frontend.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- the model being built, and the results ------------------------------ */

static ast_model model;
static diag_engine diag;
static ir_module module;
static FILE *diag_stream;
static char *diag_buffer;
static size_t diag_size;
static int32_t file_id;
static uint32_t line_now, col_now;
static ast_block *blocks[10001]; /* blocks[depth]: where statements go */
static int depth;

static int setup(void **state) {
    (void)state;
    ast_model_init(&model);
    model.name = "m";
    diag_stream = open_memstream(&diag_buffer, &diag_size);
    diag_init(&diag, diag_stream);
    file_id = diag_add_source(&diag, "test.smelt", "", 0);
    model.source_path = "test.smelt";
    model.source_file = file_id;
    blocks[0] = &model.body;
    depth = 0;
    line_now = 1;
    col_now = 1;
    memset(&module, 0, sizeof module);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    ir_module_free(&module);
    diag_free(&diag);
    fclose(diag_stream);
    free(diag_buffer);
    diag_buffer = NULL;
    ast_model_free(&model);
    return 0;
}

/* AT(n), builder(...): the statement and its expressions are on line n. */
#define AT(line) (line_now = (line), col_now = 2)

static void *node(size_t size) { return arena_alloc(&model.arena, size); }
static smelt_loc here(void) { return (smelt_loc){file_id, line_now, col_now++}; }

static ast_expr *expr(ast_expr_kind kind) {
    ast_expr *e = node(sizeof *e);
    e->kind = kind;
    e->loc = here();
    return e;
}
static ast_expr *I(int64_t v) {
    ast_expr *e = expr(AST_EXPR_INT);
    e->as.i = v;
    return e;
}
static ast_expr *F(double v) {
    ast_expr *e = expr(AST_EXPR_FLOAT);
    e->as.f = v;
    return e;
}
static ast_expr *B(bool v) {
    ast_expr *e = expr(AST_EXPR_BOOL);
    e->as.b = v;
    return e;
}
static ast_expr *S(const char *v) {
    ast_expr *e = expr(AST_EXPR_STRING);
    e->as.s = v;
    return e;
}
static ast_expr *N(const char *v) {
    ast_expr *e = expr(AST_EXPR_NAME);
    e->as.s = v;
    return e;
}
static ast_expr *BIN(ast_operator op, ast_expr *a, ast_expr *b) {
    ast_expr *e = expr(AST_EXPR_BINARY);
    e->as.binary.op = op;
    e->as.binary.lhs = a;
    e->as.binary.rhs = b;
    return e;
}
static ast_expr *UN(ast_operator op, ast_expr *a) {
    ast_expr *e = expr(AST_EXPR_UNARY);
    e->as.unary.op = op;
    e->as.unary.operand = a;
    return e;
}
static ast_expr *LIST(uint32_t n, ...) {
    ast_expr *e = expr(AST_EXPR_LIST);
    e->as.list.count = n;
    e->as.list.items = node((n ? n : 1) * sizeof(ast_expr *));
    va_list ap;
    va_start(ap, n);
    for (uint32_t i = 0; i < n; i++)
        e->as.list.items[i] = va_arg(ap, ast_expr *);
    va_end(ap);
    return e;
}
static ast_arg POS(ast_expr *e) { return (ast_arg){NULL, e, e->loc}; }
static ast_arg KW(const char *k, ast_expr *e) { return (ast_arg){k, e, e->loc}; }
/* CALL("matmul", 2, POS(N("x")), KW("layout", S("in_out"))) */
static ast_expr *CALL(const char *name, uint32_t n, ...) {
    ast_expr *e = expr(AST_EXPR_CALL);
    e->as.call.name = name;
    e->as.call.arg_count = n;
    e->as.call.args = node((n ? n : 1) * sizeof(ast_arg));
    va_list ap;
    va_start(ap, n);
    for (uint32_t i = 0; i < n; i++)
        e->as.call.args[i] = va_arg(ap, ast_arg);
    va_end(ap);
    return e;
}
static ast_expr *CALL1(const char *name, ast_expr *a) { return CALL(name, 1, POS(a)); }
static ast_expr *CALL2(const char *name, ast_expr *a, ast_expr *b) { return CALL(name, 2, POS(a), POS(b)); }

static ast_stmt *stmt(ast_stmt_kind kind) {
    ast_stmt *s = node(sizeof *s);
    s->kind = kind;
    s->loc = (smelt_loc){file_id, line_now, 1};
    ast_block *b = blocks[depth];
    ast_stmt **items = node((b->count + 1) * sizeof *items);
    if (b->count) memcpy(items, b->items, b->count * sizeof *items);
    items[b->count++] = s;
    b->items = items;
    return s;
}

static void param(const char *name, ir_param_type type, ast_expr *def) {
    ast_stmt *s = stmt(AST_STMT_PARAM);
    s->as.param.name = name;
    s->as.param.type = type;
    s->as.param.default_value = def;
}
static void dim(const char *name, ast_expr *bound) {
    ast_stmt *s = stmt(AST_STMT_DIM);
    s->as.dim.name = name;
    s->as.dim.bound = bound;
}
static ast_type type_of(const char *dtype, uint32_t rank, va_list ap) {
    ast_type t = {.dtype = dtype, .dtype_loc = here(), .rank = rank};
    t.dims = node((rank ? rank : 1) * sizeof(ast_expr *));
    for (uint32_t i = 0; i < rank; i++)
        t.dims[i] = va_arg(ap, ast_expr *);
    return t;
}
/* input(name, "i32", 2, N("tokens"), I(8)) */
static void input(const char *name, const char *dtype, uint32_t rank, ...) {
    va_list ap;
    va_start(ap, rank);
    ast_type t = type_of(dtype, rank, ap);
    va_end(ap);
    ast_stmt *s = stmt(AST_STMT_INPUT);
    s->as.input.name = name;
    s->as.input.type = t;
}
/* weight(name, dtype or NULL, "hf.{l}.name", stack var or NULL, rank, dims...) */
static void weight(const char *name, const char *dtype, const char *hf, const char *stack, uint32_t rank,
                   ...) {
    va_list ap;
    va_start(ap, rank);
    ast_type t = type_of(dtype, rank, ap);
    va_end(ap);
    smelt_loc hf_loc = here();
    ast_stmt *s = stmt(AST_STMT_WEIGHT);
    s->as.weight.name = name;
    s->as.weight.type = t;
    s->as.weight.hf_name = hf;
    s->as.weight.hf_name_loc = hf_loc;
    s->as.weight.stack_var = stack;
}
static void bind_names(ast_stmt_kind kind, uint32_t n, const char **names, ast_expr *value) {
    ast_stmt *s = stmt(kind);
    s->as.let.names = names;
    s->as.let.name_count = n;
    s->as.let.name_locs = node(n * sizeof(smelt_loc));
    for (uint32_t i = 0; i < n; i++)
        s->as.let.name_locs[i] = (smelt_loc){file_id, line_now, 5 + i};
    s->as.let.value = value;
}
static void let(const char *name, ast_expr *value) {
    const char **names = node(sizeof *names);
    names[0] = name;
    bind_names(AST_STMT_LET, 1, names, value);
}
static void assign(const char *name, ast_expr *value) {
    const char **names = node(sizeof *names);
    names[0] = name;
    bind_names(AST_STMT_ASSIGN, 1, names, value);
}
static void let3(const char *a, const char *b, const char *c, ast_expr *value) {
    const char **names = node(3 * sizeof *names);
    names[0] = a;
    names[1] = b;
    names[2] = c;
    bind_names(AST_STMT_LET, 3, names, value);
}
static void output(const char *name, ast_expr *value) {
    ast_stmt *s = stmt(AST_STMT_OUTPUT);
    s->as.output.name = name;
    s->as.output.value = value;
}
static void begin_for(const char *var, ast_expr *from, ast_expr *to) {
    ast_stmt *s = stmt(AST_STMT_FOR);
    s->as.loop.var = var;
    s->as.loop.from = from;
    s->as.loop.to = to;
    blocks[++depth] = &s->as.loop.body;
}
static ast_stmt *begin_if(ast_expr *cond) {
    ast_stmt *s = stmt(AST_STMT_IF);
    s->as.branch.cond = cond;
    blocks[++depth] = &s->as.branch.then_body;
    return s;
}
static void begin_else(ast_stmt *if_stmt) { blocks[depth] = &if_stmt->as.branch.else_body; }
static void end(void) { depth--; }

/* ---- running and checking ------------------------------------------------ */

static bool elaborate_with(const fe_options *o) {
    bool ok = fe_elaborate(&model, o, &diag, &module);
    fflush(diag_stream);
    return ok;
}
static bool elaborate(void) { return elaborate_with(NULL); }

static const char *diagnostics(void) {
    fflush(diag_stream);
    return diag_buffer ? diag_buffer : "";
}

static void expect_diag(const char *text) {
    if (!strstr(diagnostics(), text))
        fail_msg("expected in diagnostics: %s\n--- got:\n%s", text, diagnostics());
}
static void expect_no_diag(const char *text) {
    if (strstr(diagnostics(), text))
        fail_msg("not expected in diagnostics: %s\n--- got:\n%s", text, diagnostics());
}

/* A diagnostic line "test.smelt:LINE:COL: SEVERITY: TEXT..." (any COL: the
 * columns of expressions built in one C call depend on argument order). */
static void expect_at(uint32_t line, const char *severity, const char *text) {
    char head[64], body[512];
    snprintf(head, sizeof head, "test.smelt:%u:", line);
    snprintf(body, sizeof body, ": %s: %s", severity, text);
    for (const char *p = diagnostics(); *p;) {
        const char *eol = strchr(p, '\n');
        size_t n = eol ? (size_t)(eol - p) : strlen(p);
        if (strncmp(p, head, strlen(head)) == 0) {
            const char *rest = strchr(p + strlen(head), ':');
            if (rest && (size_t)(rest - p) < n && strncmp(rest, body, strlen(body)) == 0) return;
        }
        p += n + (eol != NULL);
    }
    fail_msg("expected at line %u: %s: %s\n--- got:\n%s", line, severity, text, diagnostics());
}
static void expect_error(uint32_t line, const char *text) { expect_at(line, "error", text); }
static void expect_note(uint32_t line, const char *text) { expect_at(line, "note", text); }

static unsigned count_text(const char *text) {
    unsigned n = 0;
    for (const char *p = diagnostics(); (p = strstr(p, text)) != NULL; p++)
        n++;
    return n;
}

static unsigned count_ops(ir_op_kind kind) {
    unsigned n = 0;
    for (uint32_t i = 0; i < module.op_count; i++)
        n += module.ops[i].kind == kind;
    return n;
}

/* Index of the n-th (0-based) op of `kind`; fails the test when absent. */
static uint32_t nth_op(ir_op_kind kind, unsigned n) {
    for (uint32_t i = 0; i < module.op_count; i++)
        if (module.ops[i].kind == kind && n-- == 0) return i;
    fail_msg("no op %s number %u", ir_op_info_of(kind)->name, n);
    return 0;
}

static const ir_param *find_param(const char *name) {
    for (uint32_t i = 0; i < module.param_count; i++)
        if (strcmp(module.params[i].name, name) == 0) return &module.params[i];
    fail_msg("no param '%s'", name);
    return NULL;
}

static ir_value_id result_of(uint32_t op) { return ir_op_result(&module, op, 0); }
static const ir_type *type_of_value(ir_value_id v) { return &module.values[v].type; }

/* The op an output's operand comes from. */
static uint32_t output_source(const char *name) {
    for (uint32_t i = 0; i < module.op_count; i++)
        if (module.ops[i].kind == IR_OP_OUTPUT && strcmp(ir_op_string(&module, i, "name"), name) == 0)
            return module.values[module.ops[i].operands[0]].def_op;
    fail_msg("no output '%s'", name);
    return 0;
}

/* Common start: dim tokens <= 16; input x: f32[tokens, 8] */
static void declare_x(void) {
    AT(1), dim("tokens", I(16));
    AT(2), input("x", "f32", 2, N("tokens"), I(8));
}

/* ---- params -------------------------------------------------------------- */

/* param a: int = 6
 * param b: int = a * 7
 * param c: float = b / 4           # int division first: 10
 * param s: string = "llama"
 * param flag: bool = s == "qwen2" || !(c < 10.5) */
static void test_param_defaults(void **state) {
    (void)state;
    AT(1), param("a", IR_PARAM_INT, I(6));
    AT(2), param("b", IR_PARAM_INT, BIN(AST_OP_MUL, N("a"), I(7)));
    AT(3), param("c", IR_PARAM_FLOAT, BIN(AST_OP_DIV, N("b"), I(4)));
    AT(4), param("s", IR_PARAM_STRING, S("llama"));
    AT(5), param("flag", IR_PARAM_BOOL,
                 BIN(AST_OP_OR, BIN(AST_OP_EQ, N("s"), S("qwen2")),
                     UN(AST_OP_NOT, BIN(AST_OP_LT, N("c"), F(10.5)))));
    assert_true(elaborate());
    assert_int_equal(module.param_count, 5);
    assert_int_equal(find_param("b")->value.i, 42);
    assert_int_equal(find_param("c")->type, IR_PARAM_FLOAT);
    assert_true(find_param("c")->value.f == 10.0);
    assert_string_equal(find_param("s")->value.s, "llama");
    assert_false(find_param("flag")->value.b);
    assert_string_equal(module.name, "m");
    assert_string_equal(module.source_path, "test.smelt");
    assert_int_equal(module.source_file, file_id);
}

/* param n: int          (no default, no config)
 * param w: int = 2.5
 * param a: int = 1; param a: int = 2
 * for i in 0..1 { param inner: int = 1 } */
static void test_param_errors(void **state) {
    (void)state;
    AT(1), param("n", IR_PARAM_INT, NULL);
    AT(2), param("w", IR_PARAM_INT, F(2.5));
    AT(3), param("a", IR_PARAM_INT, I(1));
    AT(4), param("a", IR_PARAM_INT, I(2));
    AT(5), begin_for("i", I(0), I(1));
    AT(6), param("inner", IR_PARAM_INT, I(1));
    end();
    assert_false(elaborate());
    expect_diag("test.smelt:1:1: error: param 'n' has no value; give it in config.json or with --set n=...");
    expect_error(2, "param 'w' is int but its default is a float");
    expect_diag("test.smelt:4:1: error: param 'a' is already defined");
    expect_diag("test.smelt:3:1: note: 'a' was defined here, as a param\n");
    expect_diag("test.smelt:6:1: error: param 'inner' must be declared at the top level of the model");
    assert_int_equal(diag.error_count, 4);
    assert_int_equal(find_param("a")->value.i, 1); /* the first definition stands */
}

/* ---- loops and branches -------------------------------------------------- */

/* dim tokens <= 16; input x: f32[tokens, 8]
 * let l = 7
 * let h = x
 * for l in 0..3 {
 *   weight w: [8, 8] = "layers.{l}.w"
 *   h = matmul(h, w)
 * }
 * param after: int = l          # the loop variable's old binding is back
 * output y = h */
static void test_loop_unrolls(void **state) {
    (void)state;
    declare_x();
    AT(3), let("l", I(7));
    AT(4), let("h", N("x"));
    AT(5), begin_for("l", I(0), I(3));
    AT(6), weight("w", NULL, "layers.{l}.w", NULL, 2, I(8), I(8));
    AT(7), assign("h", CALL2("matmul", N("h"), N("w")));
    end();
    AT(9), param("after", IR_PARAM_INT, N("l"));
    AT(10), output("y", N("h"));
    assert_true(elaborate());
    assert_int_equal(module.op_count, 1 + 3 * 2 + 1);
    assert_int_equal(count_ops(IR_OP_WEIGHT), 3);
    assert_int_equal(count_ops(IR_OP_MATMUL), 3);
    const char *names[] = {"layers.0.w", "layers.1.w", "layers.2.w"};
    ir_value_id previous = result_of(nth_op(IR_OP_INPUT, 0));
    for (unsigned i = 0; i < 3; i++) {
        uint32_t w = nth_op(IR_OP_WEIGHT, i), mm = nth_op(IR_OP_MATMUL, i);
        assert_string_equal(ir_op_string(&module, w, "name"), names[i]);
        assert_int_equal(type_of_value(result_of(w))->dtype, SMELT_DTYPE_F32);
        assert_int_equal(module.ops[mm].operands[0], previous); /* h chains through the layers */
        assert_int_equal(module.ops[mm].operands[1], result_of(w));
        assert_int_equal(module.ops[mm].loc.line, 7);
        assert_string_equal(ir_op_string(&module, mm, "layout"), "out_in"); /* default filled in */
        assert_int_equal(type_of_value(result_of(mm))->dtype, SMELT_DTYPE_UNKNOWN);
        previous = result_of(mm);
    }
    assert_int_equal(output_source("y"), nth_op(IR_OP_MATMUL, 2));
    assert_int_equal(find_param("after")->value.i, 7);
    /* The input's declared type: f32[tokens, 8]. */
    const ir_type *t = type_of_value(result_of(nth_op(IR_OP_INPUT, 0)));
    assert_int_equal(t->dtype, SMELT_DTYPE_F32);
    assert_int_equal(t->rank, 2);
    assert_true(ir_dim_is_symbol(t->dims[0]));
    assert_string_equal(module.symbols[t->dims[0].symbol].name, "tokens");
    assert_int_equal(module.symbols[t->dims[0].symbol].bound, 16);
    assert_int_equal(t->dims[1].size, 8);
}

/* for i in 5..2 {...} runs zero times; after the loop `i` is unbound again. */
static void test_empty_loop_and_unbound_variable(void **state) {
    (void)state;
    declare_x();
    AT(3), begin_for("i", I(2), I(2));
    AT(4), output("never", N("x"));
    end();
    AT(5), begin_for("j", I(0), I(2));
    end();
    AT(6), let("k", N("j"));
    assert_false(elaborate());
    assert_int_equal(count_ops(IR_OP_OUTPUT), 0);
    expect_error(6, "'j' is not defined");
    assert_int_equal(diag.error_count, 1);
}

/* for i in 5..2 { ... }: a range that ends before it begins (a negative
 * count such as num_hidden_layers = -1) is an error, not an empty loop. */
static void test_loop_range_ending_before_it_begins(void **state) {
    (void)state;
    declare_x();
    AT(3), begin_for("i", I(5), I(2));
    AT(4), output("never", N("x"));
    end();
    assert_false(elaborate());
    assert_int_equal(count_ops(IR_OP_OUTPUT), 0);
    expect_error(3, "the for loop's range 5..2 ends before it begins");
    assert_int_equal(diag.error_count, 1);
}

/* param use_bias: bool = true; param mode: int = 2
 * if use_bias { let y = add(x, x) } else { let y = mul(x, x) }
 * if mode == 1 { output a = x } else if mode == 2 { output b = x } else { output c = x } */
static void test_if_picks_branches(void **state) {
    (void)state;
    declare_x();
    AT(3), param("use_bias", IR_PARAM_BOOL, B(true));
    AT(4), param("mode", IR_PARAM_INT, I(2));
    AT(5);
    ast_stmt *first = begin_if(N("use_bias"));
    AT(6), let("y", CALL2("add", N("x"), N("x")));
    begin_else(first);
    AT(7), let("y", CALL2("mul", N("x"), N("x")));
    end();
    AT(8);
    ast_stmt *second = begin_if(BIN(AST_OP_EQ, N("mode"), I(1)));
    AT(9), output("a", N("x"));
    begin_else(second);
    AT(10);
    ast_stmt *third = begin_if(BIN(AST_OP_EQ, N("mode"), I(2)));
    AT(11), output("b", N("x"));
    begin_else(third);
    AT(12), output("c", N("x"));
    end();
    end();
    AT(13), output("y", N("y"));
    assert_true(elaborate());
    assert_int_equal(count_ops(IR_OP_ADD), 1);
    assert_int_equal(count_ops(IR_OP_MUL), 0);
    assert_int_equal(count_ops(IR_OP_OUTPUT), 2);
    assert_string_equal(ir_op_string(&module, nth_op(IR_OP_OUTPUT, 0), "name"), "b");
    assert_int_equal(output_source("y"), nth_op(IR_OP_ADD, 0));
}

/* if 1 { ... }: the condition must be a bool; names bound in the skipped
 * branch are then poison, not a cascade of "not defined" errors. */
static void test_if_condition_must_be_bool(void **state) {
    (void)state;
    declare_x();
    AT(3);
    begin_if(I(1));
    AT(4), let("z", N("x"));
    end();
    AT(5), output("z", N("z"));
    assert_false(elaborate());
    expect_error(3, "the condition of 'if' must be a bool, found an int");
    assert_int_equal(diag.error_count, 1);
}

/* for i in 0..2000000 {}; for i in 0..2.5 {} */
static void test_loop_errors(void **state) {
    (void)state;
    AT(1), begin_for("i", I(0), I(2000000));
    end();
    AT(2), begin_for("i", I(0), F(2.5));
    end();
    AT(3), begin_for("i", I(INT64_MIN), I(INT64_MAX));
    end();
    assert_false(elaborate());
    expect_diag("test.smelt:1:1: error: the loop runs 2000000 times; at most 1000000 iterations are allowed");
    expect_diag("test.smelt:2:1: error: the range of a for loop must be two ints, found an int and a float");
    expect_diag("test.smelt:3:1: error: the loop runs 18446744073709551615 times");
}

/* ---- weights ------------------------------------------------------------- */

/* param n: int = 3
 * for l in 0..2 {
 *   weight w1: bf16[4, 8, 16] = "model.layers.{l}.experts.{e}.w1.weight" stacked e
 *   weight n_{n}: [2] = "x.{n}.{l}"
 * } */
static void test_weight_templates(void **state) {
    (void)state;
    AT(1), param("n", IR_PARAM_INT, I(3));
    AT(2), begin_for("l", I(0), I(2));
    AT(3), weight("w1", "bf16", "model.layers.{l}.experts.{e}.w1.weight", "e", 3, I(4), I(8), I(16));
    AT(4), weight("w2", NULL, "x.{n}.{l}", NULL, 1, I(2));
    end();
    assert_true(elaborate());
    assert_int_equal(count_ops(IR_OP_WEIGHT), 4);
    uint32_t w = nth_op(IR_OP_WEIGHT, 2);
    assert_string_equal(ir_op_string(&module, w, "name"), "model.layers.1.experts.{e}.w1.weight");
    assert_string_equal(ir_op_string(&module, w, "stack"), "e");
    const ir_type *t = type_of_value(result_of(w));
    assert_int_equal(t->dtype, SMELT_DTYPE_BF16);
    assert_int_equal(t->rank, 3);
    assert_int_equal(t->dims[0].size, 4);
    assert_int_equal(t->dims[2].size, 16);
    uint32_t plain = nth_op(IR_OP_WEIGHT, 3);
    assert_string_equal(ir_op_string(&module, plain, "name"), "x.3.1");
    assert_string_equal(ir_op_string(&module, plain, "stack"), ""); /* the default */
    assert_int_equal(module.ops[plain].loc.line, 4);
}

static void test_weight_errors(void **state) {
    (void)state;
    AT(1), param("s", IR_PARAM_STRING, S("text"));
    AT(2), weight("a", NULL, "layers.{l}.w", NULL, 1, I(2));
    AT(3), weight("b", NULL, "layers.{s}.w", NULL, 1, I(2));
    AT(4), weight("c", NULL, "layers.{oops", NULL, 1, I(2));
    AT(5), weight("d", NULL, "experts.w", "e", 2, I(2), I(2));
    AT(6), weight("e", NULL, "experts.{e}.w", "e", 1, I(2));
    AT(7), weight("f", "i32", "f", NULL, 1, I(2));
    AT(8), weight("g", "f33", "g", NULL, 1, I(2));
    AT(9), weight("h", NULL, "h{}", NULL, 1, I(-1));
    AT(10), weight("i", NULL, "i", NULL, 7, I(1), I(1), I(1), I(1), I(1), I(1), I(1));
    assert_false(elaborate());
    expect_error(2, "unknown name '{l}' in the weight name; expected a loop variable or an int param");
    expect_error(3, "'{s}' in the weight name needs an int, but 's' is a string");
    expect_error(4, "unterminated '{' in the weight name");
    expect_error(5, "the name of stacked weight 'd' must contain '{e}'");
    expect_diag("test.smelt:6:1: error: stacked weight 'e' needs at least 2 dims (dim 0 counts the stacked "
                "tensors), found 1");
    expect_error(7, "weight 'f' has dtype i32; weights must have a float dtype");
    expect_error(8, "unknown dtype 'f33'; the dtypes are f32, f16, bf16, f8e4m3, f8e5m2, i8, i4, i32, i64\n");
    expect_error(9, "dim 1 of weight 'h' is -1; dims must be >= 0");
    expect_error(9, "empty '{}' in the weight name");
    expect_diag("test.smelt:10:1: error: weight 'i' has 7 dims; at most 6 are allowed");
    assert_int_equal(diag.error_count, 10);
    assert_int_equal(count_ops(IR_OP_WEIGHT), 0);
}

/* ---- inputs and dims ----------------------------------------------------- */

static void test_input_and_dim_errors(void **state) {
    (void)state;
    AT(1), dim("tokens", I(0));
    AT(2), dim("batch", F(2.0));
    AT(3), dim("seq", I(64));
    AT(4), input("a", NULL, 1, I(2));
    AT(5), input("b", "i33", 1, I(2));
    AT(6), input("c", "i32", 1, S("x"));
    AT(7), input("seq", "i32", 1, I(2));
    AT(8), param("p", IR_PARAM_INT, BIN(AST_OP_MUL, N("seq"), I(2)));
    AT(9), input("d", "i64", 2, N("seq"), I(0));
    assert_false(elaborate());
    expect_error(1, "the bound of dim 'tokens' is 0; it must be >= 1");
    expect_error(2, "the bound of dim 'batch' must be an int, found a float");
    expect_diag("test.smelt:4:1: error: input 'a' needs a dtype, as in 'input ids: i32[tokens]'");
    expect_error(5, "unknown dtype 'i33'");
    expect_error(6, "dim 1 of input 'c' must be an int or a symbolic dim, found a string");
    expect_diag("test.smelt:7:1: error: input 'seq' is already defined");
    expect_diag("test.smelt:3:1: note: 'seq' was defined here, as a dim\n");
    expect_error(8, "'seq' is a symbolic dim; use it only as a dim of a shape");
    assert_int_equal(diag.error_count, 7);
    /* The good input is still built. */
    assert_int_equal(count_ops(IR_OP_INPUT), 1);
    const ir_type *t = type_of_value(result_of(nth_op(IR_OP_INPUT, 0)));
    assert_int_equal(t->dtype, SMELT_DTYPE_I64);
    assert_int_equal(t->dims[1].size, 0);
    assert_int_equal(module.symbol_count, 1);
}

/* ---- calls --------------------------------------------------------------- */

/* let q, k, v = split(x, axis = 1, sizes = [2, 3, 3])
 * output k = k */
static void test_split_binds_several_results(void **state) {
    (void)state;
    declare_x();
    AT(3), let3("q", "k", "v",
                CALL("split", 3, POS(N("x")), KW("axis", I(1)), KW("sizes", LIST(3, I(2), I(3), I(3)))));
    AT(4), output("k", N("k"));
    AT(5), output("v", N("v"));
    assert_true(elaborate());
    uint32_t split = nth_op(IR_OP_SPLIT, 0);
    assert_int_equal(module.ops[split].result_count, 3);
    const ir_attr *sizes = ir_op_attr(&module, split, "sizes");
    assert_non_null(sizes);
    assert_int_equal(sizes->kind, IR_ATTR_INTS);
    assert_int_equal(sizes->as.ints.count, 3);
    assert_int_equal(sizes->as.ints.items[1], 3);
    assert_int_equal(module.ops[nth_op(IR_OP_OUTPUT, 0)].operands[0], ir_op_result(&module, split, 1));
    assert_int_equal(module.ops[nth_op(IR_OP_OUTPUT, 1)].operands[0], ir_op_result(&module, split, 2));
}

static void test_split_result_count_errors(void **state) {
    (void)state;
    declare_x();
    AT(3), let("one", CALL("split", 3, POS(N("x")), KW("axis", I(1)), KW("sizes", LIST(2, I(4), I(4)))));
    AT(4), let3("a", "b", "c",
                CALL("split", 3, POS(N("x")), KW("axis", I(1)), KW("sizes", LIST(2, I(4), I(4)))));
    AT(5), let3("d", "e", "f", N("x"));
    AT(6), let("g", CALL("split", 3, POS(N("x")), KW("axis", I(1)), KW("sizes", LIST(0))));
    AT(7), output("o", N("a")); /* poison: no further error */
    assert_false(elaborate());
    expect_error(3, "the value has 2 results; bind each to a name, as in 'let a, b = split(...)'");
    expect_error(4, "3 names are bound but the value has 2 results");
    expect_error(5, "3 names are bound but the value is a single value (a tensor)");
    expect_error(6, "split: attribute 'sizes' has 0 entries; it needs 1 to 256");
    assert_int_equal(diag.error_count, 4);
}

/* let y = mul(x, 0.5); let z = add(2, y); let c = const(value = 3) */
static void test_scalar_operands_become_consts(void **state) {
    (void)state;
    declare_x();
    AT(3), let("y", CALL2("mul", N("x"), F(0.5)));
    AT(4), let("z", CALL2("add", I(2), N("y")));
    AT(5), let("c", CALL("const", 1, KW("value", I(3))));
    AT(6), output("z", N("z"));
    AT(7), output("c", N("c"));
    assert_true(elaborate());
    /* input, const 0.5, mul, const 2, add, const 3, output, output */
    assert_int_equal(module.op_count, 8);
    ir_op_kind kinds[] = {IR_OP_INPUT, IR_OP_CONST, IR_OP_MUL,    IR_OP_CONST,
                          IR_OP_ADD,   IR_OP_CONST, IR_OP_OUTPUT, IR_OP_OUTPUT};
    for (unsigned i = 0; i < 8; i++)
        assert_int_equal(module.ops[i].kind, kinds[i]);
    assert_true(ir_op_float(&module, 1, "value") == 0.5);
    assert_true(ir_op_float(&module, 3, "value") == 2.0);
    assert_true(ir_op_float(&module, 5, "value") == 3.0);
    for (unsigned i = 1; i <= 5; i += 2) {
        const ir_type *t = type_of_value(result_of(i));
        assert_int_equal(t->dtype, SMELT_DTYPE_F32);
        assert_int_equal(t->rank, 0);
    }
    assert_int_equal(module.ops[2].operands[1], result_of(1));
    assert_int_equal(module.ops[4].operands[0], result_of(3));
    assert_int_equal(module.ops[1].loc.line, 3);                /* the const is located at its argument */
    assert_true(module.ops[1].loc.col < module.ops[2].loc.col); /* the argument's column, not the call's */
}

/* Attributes of each kind, converted by the op's schema. */
static void test_attribute_conversion(void **state) {
    (void)state;
    declare_x();
    AT(3), weight("w", NULL, "w", NULL, 1, I(8));
    AT(4), let("a", CALL("rms_norm", 3, POS(N("x")), POS(N("w")), KW("eps", I(1))));
    AT(5), let("b", CALL("reshape", 2, POS(N("a")), KW("shape", LIST(3, N("tokens"), I(4), I(2)))));
    AT(6), let("c", CALL("transpose", 2, POS(N("b")), KW("perm", LIST(3, I(1), I(0), I(2)))));
    AT(7), let("d", CALL("attention", 7, POS(N("c")), POS(N("c")), POS(N("c")), POS(N("x")),
                         KW("scale", F(0.25)), KW("causal", B(false)), KW("max_seq", I(128))));
    AT(8), let("e", CALL("matmul", 3, POS(N("x")), POS(N("w")), KW("layout", S("in_out"))));
    AT(9), let("f", CALL("rope", 3, POS(N("c")), POS(N("x")), KW("theta", F(10000.0))));
    assert_true(elaborate());
    uint32_t norm = nth_op(IR_OP_RMS_NORM, 0);
    assert_int_equal(ir_op_attr(&module, norm, "eps")->kind, IR_ATTR_FLOAT);
    assert_true(ir_op_float(&module, norm, "eps") == 1.0);
    const ir_attr *shape = ir_op_attr(&module, nth_op(IR_OP_RESHAPE, 0), "shape");
    assert_int_equal(shape->kind, IR_ATTR_SHAPE);
    assert_int_equal(shape->as.shape.count, 3);
    assert_true(ir_dim_is_symbol(shape->as.shape.items[0]));
    assert_int_equal(shape->as.shape.items[0].symbol, 0);
    assert_int_equal(shape->as.shape.items[2].size, 2);
    const ir_attr *perm = ir_op_attr(&module, nth_op(IR_OP_TRANSPOSE, 0), "perm");
    assert_int_equal(perm->as.ints.count, 3);
    assert_int_equal(perm->as.ints.items[0], 1);
    uint32_t att = nth_op(IR_OP_ATTENTION, 0);
    assert_false(ir_op_bool(&module, att, "causal"));
    assert_int_equal(ir_op_int(&module, att, "max_seq"), 128);
    assert_int_equal(ir_op_int(&module, att, "window"), 0);
    assert_string_equal(ir_op_string(&module, nth_op(IR_OP_MATMUL, 0), "layout"), "in_out");
    uint32_t rope = nth_op(IR_OP_ROPE, 0);
    assert_string_equal(ir_op_string(&module, rope, "style"), "neox");
    assert_int_equal(ir_op_int(&module, rope, "rotary_dim"), 0);
    assert_int_equal(module.ops[att].operand_count, 4);
}

static void test_attribute_errors(void **state) {
    (void)state;
    declare_x();
    AT(3), let("a", CALL("rms_norm", 3, POS(N("x")), POS(N("x")), KW("epsilon", F(1e-5))));
    AT(4), let("b", CALL("silu", 2, POS(N("x")), KW("beta", F(1.0))));
    AT(5), let("c", CALL("rms_norm", 3, POS(N("x")), POS(N("x")), KW("eps", S("small"))));
    AT(6), let("d", CALL("matmul", 3, POS(N("x")), POS(N("x")), KW("layout", S("rows"))));
    AT(7), let("e", CALL("transpose", 2, POS(N("x")), KW("perm", LIST(2, I(1), F(0.0)))));
    AT(8), let("f", CALL("reshape", 2, POS(N("x")), KW("shape", LIST(2, I(-1), I(8)))));
    AT(9), let("g", CALL("reshape", 2, POS(N("x")),
                         KW("shape", LIST(7, I(1), I(1), I(1), I(1), I(1), I(1), I(1)))));
    AT(10), let("h", CALL("softmax", 3, POS(N("x")), KW("axis", I(0)), KW("axis", I(1))));
    AT(11), let("i", CALL("rms_norm", 2, POS(N("x")), POS(N("x"))));
    AT(12), let("j", CALL("softmax", 2, POS(N("x")), KW("axis", B(true))));
    AT(13), let("k", CALL("gelu", 2, POS(N("x")), KW("approximate", I(1))));
    AT(14), let("l", CALL("reshape", 2, POS(N("x")), KW("shape", I(3))));
    AT(15), let("m", CALL("transpose", 2, POS(N("x")), KW("perm", LIST(1, N("tokens")))));
    assert_false(elaborate());
    expect_error(3, "rms_norm has no attribute 'epsilon'; its attributes are eps, offset\n");
    expect_error(4, "silu takes no attributes, found 'beta'");
    expect_error(5, "rms_norm: attribute 'eps' must be a number, found a string");
    expect_error(6, "matmul: attribute 'layout' must be one of out_in|in_out, found 'rows'");
    expect_error(7, "transpose: attribute 'perm' entry 2 must be an int, found a float");
    expect_error(8, "reshape: attribute 'shape' entry 1 is -1; dims must be >= 0");
    expect_error(9, "reshape: attribute 'shape' has 7 dims; a shape has at most 6");
    expect_error(10, "softmax: attribute 'axis' is given twice");
    expect_note(10, "'axis' was first given here");
    expect_error(11, "rms_norm: missing attribute 'eps'");
    expect_error(12, "softmax: attribute 'axis' must be an int, found a bool");
    expect_error(13, "gelu: attribute 'approximate' must be a string, found an int");
    expect_error(14, "reshape: attribute 'shape' must be a list of ints and symbolic dims, found an int");
    expect_error(15, "transpose: attribute 'perm' entry 1 must be an int, found a symbolic dim");
    expect_error(3, "rms_norm: missing attribute 'eps'"); /* 'epsilon' is no 'eps' */
    assert_int_equal(diag.error_count, 14);
    assert_int_equal(module.op_count, 1); /* only the input: no broken op is built */
}

static void test_call_errors(void **state) {
    (void)state;
    declare_x();
    AT(3), let("a", CALL2("matmull", N("x"), N("x")));
    AT(4), let("b", CALL1("add", N("x")));
    AT(5), let("c", CALL2("silu", N("x"), N("x")));
    AT(6), let("d", CALL2("add", N("x"), S("one")));
    AT(7), let("e", CALL("weight", 0));
    AT(8), let("f", CALL("frobnicate", 1, POS(N("x"))));
    AT(9), let("g", CALL2("add", N("x"), B(true)));
    AT(10), let("h", CALL2("add", N("x"), N("tokens")));
    AT(11), let("i", CALL2("sqrt", N("x"), I(1)));
    AT(12), let("j", CALL2("min", I(1), S("2")));
    assert_false(elaborate());
    expect_error(3, "unknown op 'matmull'; did you mean 'matmul'?");
    expect_error(4, "add takes 2 operands, found 1");
    expect_error(5, "silu takes 1 operand, found 2");
    expect_error(6, "add: operand 2 must be a tensor or a number, found a string");
    expect_error(7, "'weight' cannot be called; declare weights with 'weight NAME: [dims] = \"hf.name\"'");
    expect_error(8, "unknown op 'frobnicate'\n");
    expect_error(9, "add: operand 2 must be a tensor or a number, found a bool");
    expect_error(10, "'tokens' is a symbolic dim; use it only as a dim of a shape");
    expect_error(11, "sqrt needs numbers, found a tensor");
    expect_error(11, "sqrt takes 1 argument, found 2");
    expect_error(12, "min needs numbers, found a string");
    assert_int_equal(diag.error_count, 11);
}

/* sqrt, min, max on params */
static void test_scalar_functions(void **state) {
    (void)state;
    AT(1), param("a", IR_PARAM_FLOAT, CALL1("sqrt", I(16)));
    AT(2), param("b", IR_PARAM_INT, CALL2("min", I(3), I(5)));
    AT(3), param("c", IR_PARAM_FLOAT, CALL2("max", I(2), F(2.5)));
    AT(4), param("d", IR_PARAM_INT, CALL2("max", I(-2), I(-7)));
    AT(5), param("e", IR_PARAM_FLOAT, BIN(AST_OP_DIV, F(1.0), CALL1("sqrt", I(64))));
    AT(6), param("f", IR_PARAM_INT, CALL2("max", I(2), F(2.5))); /* a float now */
    AT(7), param("g", IR_PARAM_FLOAT, CALL1("sqrt", I(-4)));
    assert_false(elaborate());
    assert_true(find_param("a")->value.f == 4.0);
    assert_int_equal(find_param("b")->value.i, 3);
    assert_true(find_param("c")->value.f == 2.5);
    assert_int_equal(find_param("d")->value.i, -2);
    assert_true(find_param("e")->value.f == 0.125);
    expect_error(6, "param 'f' is int but its default is a float");
    expect_error(7, "sqrt of the negative number -4");
    assert_int_equal(diag.error_count, 2);
}

/* ---- arithmetic ---------------------------------------------------------- */

static void test_integer_arithmetic(void **state) {
    (void)state;
    AT(1), param("div", IR_PARAM_INT, BIN(AST_OP_DIV, I(-7), I(2)));
    AT(2), param("mod", IR_PARAM_INT, BIN(AST_OP_MOD, I(-7), I(2)));
    AT(3), param("prec", IR_PARAM_INT, BIN(AST_OP_SUB, I(10), BIN(AST_OP_MUL, I(2), I(3))));
    AT(4), param("mixed", IR_PARAM_FLOAT, BIN(AST_OP_ADD, I(1), F(0.5)));
    AT(5), param("fmod", IR_PARAM_FLOAT, BIN(AST_OP_MOD, F(7.5), I(2)));
    AT(6), param("neg", IR_PARAM_INT, UN(AST_OP_NEG, I(INT64_MAX)));
    AT(7), param("cmp", IR_PARAM_BOOL,
                 BIN(AST_OP_AND, BIN(AST_OP_LE, I(2), F(2.0)), BIN(AST_OP_NE, B(true), B(false))));
    AT(8), param("min_mod", IR_PARAM_INT, BIN(AST_OP_MOD, I(INT64_MIN), I(-1)));
    assert_true(elaborate());
    assert_int_equal(find_param("div")->value.i, -3);
    assert_int_equal(find_param("mod")->value.i, -1);
    assert_int_equal(find_param("prec")->value.i, 4);
    assert_true(find_param("mixed")->value.f == 1.5);
    assert_true(find_param("fmod")->value.f == 1.5);
    assert_int_equal(find_param("neg")->value.i, -INT64_MAX);
    assert_true(find_param("cmp")->value.b);
    assert_int_equal(find_param("min_mod")->value.i, 0);
}

static void test_arithmetic_errors(void **state) {
    (void)state;
    AT(1), param("a", IR_PARAM_INT, BIN(AST_OP_ADD, I(INT64_MAX), I(1)));
    AT(2), param("b", IR_PARAM_INT, BIN(AST_OP_MUL, I(4294967296), I(4294967296)));
    AT(3), param("c", IR_PARAM_INT, BIN(AST_OP_DIV, I(7), I(0)));
    AT(4), param("d", IR_PARAM_INT, BIN(AST_OP_MOD, I(7), I(0)));
    AT(5), param("e", IR_PARAM_INT, BIN(AST_OP_DIV, I(INT64_MIN), I(-1)));
    AT(6), param("f", IR_PARAM_INT, UN(AST_OP_NEG, I(INT64_MIN)));
    AT(7), param("g", IR_PARAM_FLOAT, BIN(AST_OP_DIV, F(1.0), F(0.0)));
    AT(8), param("h", IR_PARAM_FLOAT, BIN(AST_OP_MUL, F(1e300), F(1e300)));
    AT(9), param("i", IR_PARAM_INT, BIN(AST_OP_SUB, I(INT64_MIN), I(1)));
    AT(10), param("j", IR_PARAM_BOOL, BIN(AST_OP_AND, I(1), B(true)));
    AT(11), param("k", IR_PARAM_BOOL, BIN(AST_OP_EQ, S("a"), I(1)));
    AT(12), param("l", IR_PARAM_BOOL, UN(AST_OP_NOT, I(1)));
    AT(13), param("m", IR_PARAM_INT, UN(AST_OP_NEG, S("s")));
    AT(14), param("n", IR_PARAM_BOOL, BIN(AST_OP_LT, S("a"), S("b")));
    AT(15), param("o", IR_PARAM_INT, BIN(AST_OP_ADD, N("a"), I(1))); /* poison: no second error */
    assert_false(elaborate());
    expect_error(1, "integer overflow: 9223372036854775807 + 1 does not fit in 64 bits");
    expect_error(2, "integer overflow: 4294967296 * 4294967296 does not fit in 64 bits");
    expect_error(3, "'/' by zero: 7 / 0");
    expect_error(4, "'%' by zero: 7 % 0");
    expect_error(5, "integer overflow: -9223372036854775808 / -1 does not fit in 64 bits");
    expect_error(6, "integer overflow: -(-9223372036854775808) does not fit in 64 bits");
    expect_error(7, "'/' by zero: 1 / 0");
    expect_error(8, "'*' gives a result too large for a float");
    expect_error(9, "integer overflow: -9223372036854775808 - 1 does not fit in 64 bits");
    expect_error(10, "'&&' needs two bools, found an int and a bool");
    expect_error(11, "'==' needs two numbers, two strings or two bools, found a string and an int");
    expect_error(12, "'!' needs a bool, found an int");
    expect_error(13, "'-' needs a number, found a string");
    expect_error(14, "'<' needs two numbers, found a string and a string");
    assert_int_equal(diag.error_count, 14);
}

/* Tensors are combined with ops, not operators: the message says so. */
static void test_tensor_arithmetic_is_refused(void **state) {
    (void)state;
    declare_x();
    AT(3), let("y", BIN(AST_OP_ADD, N("x"), N("x")));
    assert_false(elaborate());
    expect_error(3, "'+' needs two numbers, found a tensor and a tensor (tensors are combined with "
                    "ops such as add(a, b) and mul(a, b))");
}

/* ---- let, assignment, output --------------------------------------------- */

static void test_let_assign_output(void **state) {
    (void)state;
    declare_x();
    AT(3), assign("y", N("x"));
    AT(4), let("scale", BIN(AST_OP_DIV, F(1.0), CALL1("sqrt", I(4))));
    AT(5), let("shape", LIST(2, N("tokens"), I(8)));
    AT(6), let("z", CALL("reshape", 2, POS(N("x")), KW("shape", N("shape"))));
    AT(7), let("w", CALL2("mul", N("z"), N("scale")));
    AT(8), output("out", N("w"));
    AT(9), output("out", N("x"));
    AT(10), output("n", N("scale"));
    AT(11), output("undefined", N("nothing"));
    assert_false(elaborate());
    expect_error(3, "'y' is not defined; use let");
    expect_diag("test.smelt:9:1: error: output 'out' is already defined");
    expect_diag("test.smelt:8:1: note: 'out' was defined here, as an output\n");
    expect_error(10, "output 'n' must be a tensor, found a float");
    expect_error(11, "'nothing' is not defined");
    assert_int_equal(diag.error_count, 4);
    assert_int_equal(count_ops(IR_OP_OUTPUT), 1);
    uint32_t mul = output_source("out");
    assert_int_equal(module.ops[mul].kind, IR_OP_MUL);
    uint32_t c = module.values[module.ops[mul].operands[1]].def_op;
    assert_int_equal(module.ops[c].kind, IR_OP_CONST);
    assert_true(ir_op_float(&module, c, "value") == 0.5);
    const ir_attr *shape = ir_op_attr(&module, nth_op(IR_OP_RESHAPE, 0), "shape");
    assert_int_equal(shape->as.shape.count, 2);
    assert_int_equal(shape->as.shape.items[1].size, 8);
}

/* ---- many errors, guards ------------------------------------------------- */

/* Independent errors are all reported; poison stops cascades; an error in a
 * loop body is reported once, not once per iteration. */
static void test_every_error_reported_once(void **state) {
    (void)state;
    declare_x();
    AT(3), let("a", N("undefined_name"));
    AT(4), let("b", CALL2("add", N("a"), N("a"))); /* poison: silent */
    AT(5), output("b", N("b"));                    /* poison: silent */
    AT(6), begin_for("i", I(0), I(5));
    AT(7), let("c", CALL2("matmul", N("x"), S("w"))); /* once, not 5 times */
    end();
    AT(8), param("p", IR_PARAM_INT, BIN(AST_OP_DIV, I(1), I(0)));
    AT(9), let("d", CALL("softmax", 2, POS(N("x")), KW("axes", I(1))));
    AT(10), output("ok", CALL1("silu", N("x")));
    assert_false(elaborate());
    assert_int_equal(diag.error_count, 4);
    expect_error(3, "'undefined_name' is not defined");
    assert_int_equal(count_text("matmul: operand 2 must be a tensor"), 1);
    expect_error(8, "'/' by zero");
    expect_error(9, "softmax has no attribute 'axes'; its attributes are axis");
    expect_no_diag("add:");
    expect_no_diag("output 'b'");
    assert_int_equal(count_ops(IR_OP_SILU), 1); /* good code is still elaborated */
}

/* The diag engine gives up after 20 errors; elaboration stops with it. */
static void test_stops_after_too_many_errors(void **state) {
    (void)state;
    for (uint32_t i = 0; i < 30; i++) {
        static const char *names[30];
        static char buffers[30][8];
        snprintf(buffers[i], sizeof buffers[i], "u%u", i);
        names[i] = buffers[i];
        AT(i + 1), let(names[i], N(names[i]));
    }
    assert_false(elaborate());
    assert_int_equal(diag.error_count, 20);
    expect_diag("smelt: error: too many errors (20); stopping");
}

/* 10,000 nested unary minus signs: a clean error, no stack overflow. */
static void test_deep_nesting(void **state) {
    (void)state;
    AT(1);
    ast_expr *e = I(1);
    for (int i = 0; i < 10000; i++)
        e = UN(AST_OP_NEG, e);
    param("p", IR_PARAM_INT, e);
    /* and 10,000 nested ifs */
    for (int i = 0; i < 10000; i++)
        AT(2), begin_if(B(true));
    AT(3), let("q", I(1));
    for (int i = 0; i < 10000; i++)
        end();
    assert_false(elaborate());
    expect_error(1, "blocks and expressions are nested more than 1000 levels deep");
    assert_int_equal(diag.error_count, 1); /* elaboration stops at the first */
}

static void test_deep_blocks(void **state) {
    (void)state;
    for (int i = 0; i < 10000; i++)
        AT(2), begin_if(B(true));
    AT(3), let("q", I(1));
    for (int i = 0; i < 10000; i++)
        end();
    assert_false(elaborate());
    expect_error(2, "blocks and expressions are nested more than 1000 levels deep");
    assert_int_equal(diag.error_count, 1);
}

/* A 1 MB name is cut in messages. */
static void test_huge_name(void **state) {
    (void)state;
    size_t n = 1 << 20;
    char *name = node(n + 1);
    memset(name, 'a', n);
    AT(1), let("x", N(name));
    AT(2), weight("w", NULL,
                  "layers.{aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa}",
                  NULL, 1, I(1));
    assert_false(elaborate());
    char expected[128];
    snprintf(expected, sizeof expected, "test.smelt:1:2: error: '%.*s...' is not defined\n", DIAG_NAME_MAX,
             name);
    expect_diag(expected);
    expect_diag("error: unknown name '{aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa...}' "
                "in the weight name");
    assert_true(diag_size < 1000);
}

/* ---- from DSL text --------------------------------------------------------- */

/* Parses `text` as test.smelt into the model and elaborates it. */
static bool elaborate_dsl(const char *text, const fe_options *o) {
    ast_model_free(&model);
    ir_module_free(&module); /* a test may elaborate several models */
    if (!fe_parse_dsl_text("dsl.smelt", text, strlen(text), &diag, &model))
        fail_msg("the test model does not parse:\n%s", diagnostics());
    return elaborate_with(o);
}

static const char tiny_model[] =
    "model tiny {\n"
    "  param hidden_size: int = 8\n"
    "  param heads: int = 2\n"
    "  param head_dim: int = hidden_size / heads\n"
    "  param layers: int = 2\n"
    "  param experts: int = 4\n"
    "  param model_type: string = \"qwen2\"\n"
    "  param attention_bias: bool = model_type == \"qwen2\"\n"
    "  param eps: float = 1e-5\n"
    "  dim tokens <= 64\n"
    "  input ids: i32[tokens]\n"
    "  input pos: i32[tokens]\n"
    "  weight embed: [16, hidden_size] = \"model.embed_tokens.weight\"\n"
    "  let h = embedding(embed, ids)\n"
    "  let scale = 1.0 / sqrt(head_dim)   # a scalar let\n"
    "  for l in 0..layers {\n"
    "    weight ln: bf16[hidden_size] = \"model.layers.{l}.input_layernorm.weight\"\n"
    "    weight wqkv: [3 * hidden_size, hidden_size] = \"model.layers.{l}.qkv.weight\"\n"
    "    let x = rms_norm(h, ln, eps = eps)\n"
    "    let qkv = matmul(x, wqkv)\n"
    "    if attention_bias {\n"
    "      weight b: [3 * hidden_size] = \"model.layers.{l}.qkv.bias\"\n"
    "      qkv = add(qkv, b)\n"
    "    } else if layers > 2 {\n"
    "      qkv = mul(qkv, 2)\n"
    "    } else {\n"
    "      qkv = mul(qkv, 0.5)\n"
    "    }\n"
    "    let q, k, v = split(qkv, axis = 1, sizes = [hidden_size, hidden_size, hidden_size])\n"
    "    q = rope(reshape(q, shape = [tokens, heads, head_dim]), pos, theta = 10000.0)\n"
    "    k = rope(reshape(k, shape = [tokens, heads, head_dim]), pos, theta = 10000.0)\n"
    "    v = reshape(v, shape = [tokens, heads, head_dim])\n"
    "    let a = attention(q, k, v, pos, scale = scale, max_seq = 64)\n"
    "    h = add(h, reshape(a, shape = [tokens, hidden_size]))\n"
    "    weight router: [experts, hidden_size] = \"model.layers.{l}.router.weight\"\n"
    "    weight w1: [experts, 16, hidden_size] = \"model.layers.{l}.experts.{e}.w1.weight\" stacked e\n"
    "    weight w3: [experts, 16, hidden_size] = \"model.layers.{l}.experts.{e}.w3.weight\" stacked e\n"
    "    weight w2: [experts, hidden_size, 16] = \"model.layers.{l}.experts.{e}.w2.weight\" stacked e\n"
    "    h = add(h, moe(h, router, w1, w3, w2, top_k = 2))\n"
    "  }\n"
    "  output logits = matmul(h, embed)\n"
    "}\n";

/* The whole language at once: 4 ops before the loop, 21 per layer (with the
 * QKV bias branch), 2 after it. */
static void test_dsl_model(void **state) {
    (void)state;
    assert_true(elaborate_dsl(tiny_model, NULL));
    assert_int_equal(module.op_count, 4 + 2 * 21 + 2);
    assert_string_equal(module.name, "tiny");
    assert_string_equal(module.source_path, "dsl.smelt");
    assert_int_equal(count_ops(IR_OP_SPLIT), 2);
    assert_int_equal(count_ops(IR_OP_MOE), 2);
    assert_int_equal(count_ops(IR_OP_CONST), 0);
    assert_int_equal(find_param("head_dim")->value.i, 4);
    assert_true(find_param("attention_bias")->value.b);
    assert_true(ir_op_float(&module, nth_op(IR_OP_ATTENTION, 1), "scale") == 0.5);
    uint32_t w1 = nth_op(IR_OP_WEIGHT, 1 + 7 + 4); /* embed, 7 per layer, then ln wqkv b router */
    assert_string_equal(ir_op_string(&module, w1, "name"), "model.layers.1.experts.{e}.w1.weight");
    assert_string_equal(ir_op_string(&module, w1, "stack"), "e");
    assert_int_equal(type_of_value(result_of(nth_op(IR_OP_WEIGHT, 1)))->dtype, SMELT_DTYPE_BF16);
    assert_int_equal(type_of_value(result_of(nth_op(IR_OP_WEIGHT, 2)))->dims[0].size, 24);
    uint32_t split = nth_op(IR_OP_SPLIT, 0);
    assert_int_equal(module.ops[split].result_count, 3);
    /* v (result 2 of the split) feeds the third reshape of the layer */
    assert_int_equal(module.ops[nth_op(IR_OP_RESHAPE, 2)].operands[0], ir_op_result(&module, split, 2));
    assert_int_equal(ir_op_int(&module, nth_op(IR_OP_MOE, 0), "top_k"), 2);
    assert_true(ir_op_bool(&module, nth_op(IR_OP_MOE, 0), "normalize"));
    assert_int_equal(module.ops[nth_op(IR_OP_MATMUL, 0)].loc.line, 20);
}

/* --set takes the other branches of the if chain. */
static void test_dsl_branches_with_settings(void **state) {
    (void)state;
    fe_options o = {0};
    fe_options_set(&o, "model_type", "llama");
    fe_options_set(&o, "layers", "3");
    assert_true(elaborate_dsl(tiny_model, &o));
    assert_int_equal(module.op_count, 4 + 3 * 21 + 2);
    assert_int_equal(count_ops(IR_OP_CONST), 3);
    assert_true(ir_op_float(&module, nth_op(IR_OP_CONST, 0), "value") == 2.0);
    assert_int_equal(module.ops[nth_op(IR_OP_CONST, 0) + 1].kind, IR_OP_MUL);
}

/* List params: bound from config.json (else their default), read by
 * index and len; `x == null` tells whether one was given, and && and ||
 * stop at a side that decides, so the list is read only when there is one. */
static const char list_model[] =
    "model lists {\n"
    "  param n: int = 3\n"
    "  param layer_types: list[string] = null\n"
    "  param sizes: list[float] = [1, 2.5]\n"
    "  param any: list = []\n"
    "  require layer_types == null || len(layer_types) == n\n"
    "  dim tokens <= 4\n"
    "  input x: f32[tokens]\n"
    "  let h = x\n"
    "  for l in 0..n {\n"
    "    let w = sizes[0]\n"
    "    if layer_types != null && layer_types[l] == \"sliding_attention\" { w = sizes[1] + len(any) }\n"
    "    h = mul(h, w)\n"
    "  }\n"
    "  output y = h\n"
    "}\n";

static char list_config[] = "/tmp/smelt-test-lists-XXXXXX";

static void write_list_config(const char *text) {
    int fd = mkstemp(list_config);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fputs(text, f);
    fclose(f);
}

/* The value of the const multiplied in by layer l. */
static double layer_factor(uint32_t l) { return ir_op_float(&module, nth_op(IR_OP_CONST, l), "value"); }

static void test_dsl_list_params(void **state) {
    (void)state;
    assert_true(elaborate_dsl(list_model, NULL)); /* no list: the default rule */
    assert_int_equal(count_ops(IR_OP_CONST), 3);
    for (uint32_t l = 0; l < 3; l++)
        assert_true(layer_factor(l) == 1.0);
    for (uint32_t i = 0; i < module.param_count; i++) /* like object params, not among the module's */
        assert_string_not_equal(module.params[i].name, "layer_types");

    write_list_config("{\"layer_types\": [\"full_attention\", \"sliding_attention\", \"full_attention\"],"
                      " \"any\": [1, \"a\", true, 2.5]}");
    fe_options o = {.config_path = list_config};
    assert_true(elaborate_dsl(list_model, &o));
    assert_true(layer_factor(0) == 1.0);
    assert_true(layer_factor(1) == 2.5 + 4);
    assert_true(layer_factor(2) == 1.0);
    remove(list_config);

    /* The list is one short: the require refuses it at the config's list. */
    memcpy(list_config + strlen(list_config) - 6, "XXXXXX", 6);
    write_list_config("{\"layer_types\": [\"full_attention\", \"full_attention\"]}");
    assert_false(elaborate_dsl(list_model, &o));
    expect_diag("error: 'layer_types' is a list of 2, which dsl.smelt does not support\n");
    remove(list_config);
    memcpy(list_config + strlen(list_config) - 6, "XXXXXX", 6);
}

static void test_list_errors(void **state) {
    (void)state;
    assert_false(elaborate_dsl("model m {\n"
                               "  param t: list[int] = [1, 2]\n"
                               "  let a = t[2]\n"
                               "  let b = t[0] + len(t) + 1\n"
                               "  let c = b[0]\n"
                               "}\n",
                               NULL));
    expect_diag("dsl.smelt:3:13: error: index 2 is out of range: the list has 2 items\n");
    expect_diag("dsl.smelt:5:11: error: '[]' needs a list, found an int\n");
    assert_int_equal(diag.error_count, 2);
    fe_options o = {0};
    fe_options_set(&o, "t", "[1]");
    assert_false(elaborate_dsl("model m {\n  param t: list = null\n}\n", &o));
    expect_diag("error: --set t=...: 't' is a list param; give it in config.json\n");
}

/* Diagnostics show the source line and a caret under the offending expr. */
static void test_dsl_diagnostics(void **state) {
    (void)state;
    const char *text = "model m {\n"
                       "  dim tokens <= 8\n"
                       "  input x: f32[tokens, 4]\n"
                       "  let y = matmull(x, x)\n"
                       "  let z = add(x, tokens * 2)\n"
                       "  for i in 0..3 {\n"
                       "    weight w: [4] = \"w.{j}\"\n"
                       "  }\n"
                       "}\n";
    assert_false(elaborate_dsl(text, NULL));
    expect_diag("dsl.smelt:4:11: error: unknown op 'matmull'; did you mean 'matmul'?\n"
                "    4 |   let y = matmull(x, x)\n"
                "      |           ^\n");
    expect_diag("dsl.smelt:5:18: error: 'tokens' is a symbolic dim; use it only as a dim of a shape\n");
    expect_diag("dsl.smelt:7:21: error: unknown name '{j}' in the weight name");
    assert_int_equal(diag.error_count, 3); /* the loop body's error once, not 3 times */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_param_defaults, setup, teardown),
        cmocka_unit_test_setup_teardown(test_param_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_loop_unrolls, setup, teardown),
        cmocka_unit_test_setup_teardown(test_empty_loop_and_unbound_variable, setup, teardown),
        cmocka_unit_test_setup_teardown(test_loop_range_ending_before_it_begins, setup, teardown),
        cmocka_unit_test_setup_teardown(test_if_picks_branches, setup, teardown),
        cmocka_unit_test_setup_teardown(test_if_condition_must_be_bool, setup, teardown),
        cmocka_unit_test_setup_teardown(test_loop_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_weight_templates, setup, teardown),
        cmocka_unit_test_setup_teardown(test_weight_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_input_and_dim_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_split_binds_several_results, setup, teardown),
        cmocka_unit_test_setup_teardown(test_split_result_count_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scalar_operands_become_consts, setup, teardown),
        cmocka_unit_test_setup_teardown(test_attribute_conversion, setup, teardown),
        cmocka_unit_test_setup_teardown(test_attribute_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_call_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_scalar_functions, setup, teardown),
        cmocka_unit_test_setup_teardown(test_integer_arithmetic, setup, teardown),
        cmocka_unit_test_setup_teardown(test_arithmetic_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_tensor_arithmetic_is_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_let_assign_output, setup, teardown),
        cmocka_unit_test_setup_teardown(test_every_error_reported_once, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stops_after_too_many_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_deep_nesting, setup, teardown),
        cmocka_unit_test_setup_teardown(test_deep_blocks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_huge_name, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dsl_model, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dsl_branches_with_settings, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dsl_diagnostics, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dsl_list_params, setup, teardown),
        cmocka_unit_test_setup_teardown(test_list_errors, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
