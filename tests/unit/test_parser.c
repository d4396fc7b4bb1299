/* test_parser.c - the DSL parser (parser.y, dsl.c): the AST of every
 * statement kind, precedence, locations, error messages and recovery, and
 * hostile inputs (deep nesting, NUL bytes, missing files).
 *
 * Trees are compared as S-expressions written by print_expr/print_stmt
 * below, e.g. `let x = 1 + 2 * 3` is "(let x (+ 1 (* 2 3)))".
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "ast.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* ---- parsing a snippet, capturing diagnostics ------------------------------ */

typedef struct parsed {
    ast_model model;
    diag_engine diag;
    FILE *stream;
    char *output; /* what the diag engine printed */
    size_t output_size;
    bool ok;
} parsed;

static void parse_bytes(parsed *p, const char *text, size_t length) {
    p->output = NULL;
    p->stream = open_memstream(&p->output, &p->output_size);
    assert_non_null(p->stream);
    diag_init(&p->diag, p->stream);
    p->ok = fe_parse_dsl_text("t.smelt", text, length, &p->diag, &p->model);
    fflush(p->stream);
}

static void parse(parsed *p, const char *text) { parse_bytes(p, text, strlen(text)); }

static void parsed_free(parsed *p) {
    ast_model_free(&p->model);
    diag_free(&p->diag);
    fclose(p->stream);
    free(p->output);
}

/* The "t.smelt:L:C: error: ..." lines of the output (not the source lines
 * and carets). */
static char *error_lines(const char *output) {
    size_t n = strlen(output);
    char *out = calloc(n + 1, 1);
    assert_non_null(out);
    for (const char *p = output; *p;) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) + 1 : strlen(p);
        if (strncmp(p, "t.smelt:", 8) == 0 || strncmp(p, "smelt:", 6) == 0) strncat(out, p, len);
        p += len;
    }
    return out;
}

static void expect_errors(const char *source, const char *expected) {
    parsed p;
    parse(&p, source);
    char *errors = error_lines(p.output);
    assert_string_equal(errors, expected);
    assert_false(p.ok);
    free(errors);
    parsed_free(&p);
}

/* ---- printing trees ----------------------------------------------------------- */

static void print_expr(FILE *out, const ast_expr *e);

static void print_exprs(FILE *out, ast_expr *const *items, uint32_t count) {
    for (uint32_t i = 0; i < count; i++) {
        if (i) fputc(' ', out);
        print_expr(out, items[i]);
    }
}

static void print_expr(FILE *out, const ast_expr *e) {
    switch (e->kind) {
    case AST_EXPR_INT: fprintf(out, "%lld", (long long)e->as.i); break;
    case AST_EXPR_FLOAT: fprintf(out, "%gf", e->as.f); break;
    case AST_EXPR_BOOL: fputs(e->as.b ? "true" : "false", out); break;
    case AST_EXPR_STRING: fprintf(out, "\"%s\"", e->as.s); break;
    case AST_EXPR_NULL: fputs("null", out); break;
    case AST_EXPR_NAME: fputs(e->as.s, out); break;
    case AST_EXPR_UNARY:
        fprintf(out, "(%s ", ast_operator_text(e->as.unary.op));
        print_expr(out, e->as.unary.operand);
        fputc(')', out);
        break;
    case AST_EXPR_BINARY:
        fprintf(out, "(%s ", ast_operator_text(e->as.binary.op));
        print_expr(out, e->as.binary.lhs);
        fputc(' ', out);
        print_expr(out, e->as.binary.rhs);
        fputc(')', out);
        break;
    case AST_EXPR_CALL:
        fprintf(out, "%s(", e->as.call.name);
        for (uint32_t i = 0; i < e->as.call.arg_count; i++) {
            if (i) fputc(' ', out);
            if (e->as.call.args[i].keyword) fprintf(out, "%s=", e->as.call.args[i].keyword);
            print_expr(out, e->as.call.args[i].value);
        }
        fputc(')', out);
        break;
    case AST_EXPR_LIST:
        fputc('[', out);
        print_exprs(out, e->as.list.items, e->as.list.count);
        fputc(']', out);
        break;
    }
}

static const char *param_type_text(ir_param_type t) {
    switch (t) {
    case IR_PARAM_INT: return "int";
    case IR_PARAM_FLOAT: return "float";
    case IR_PARAM_BOOL: return "bool";
    case IR_PARAM_STRING: return "string";
    case IR_PARAM_OBJECT: return "object";
    case IR_PARAM_LIST: return "list";
    }
    return "?";
}

static void print_type(FILE *out, const ast_type *t) {
    fprintf(out, "%s[", t->dtype ? t->dtype : "");
    print_exprs(out, t->dims, t->rank);
    fputc(']', out);
}

static void print_block(FILE *out, const ast_block *b);

static void print_stmt(FILE *out, const ast_stmt *s) {
    switch (s->kind) {
    case AST_STMT_PARAM:
        fprintf(out, "(param %s %s", s->as.param.name, param_type_text(s->as.param.type));
        if (s->as.param.type == IR_PARAM_LIST && s->as.param.item_type != IR_PARAM_LIST)
            fprintf(out, "[%s]", param_type_text(s->as.param.item_type));
        if (s->as.param.default_value) {
            fputc(' ', out);
            print_expr(out, s->as.param.default_value);
        }
        break;
    case AST_STMT_DIM:
        fprintf(out, "(dim %s ", s->as.dim.name);
        print_expr(out, s->as.dim.bound);
        break;
    case AST_STMT_INPUT:
        fprintf(out, "(input %s ", s->as.input.name);
        print_type(out, &s->as.input.type);
        break;
    case AST_STMT_WEIGHT:
        fprintf(out, "(weight %s ", s->as.weight.name);
        print_type(out, &s->as.weight.type);
        fprintf(out, " \"%s\"", s->as.weight.hf_name);
        if (s->as.weight.stack_var) fprintf(out, " stacked %s", s->as.weight.stack_var);
        break;
    case AST_STMT_LET:
    case AST_STMT_ASSIGN:
        fputs(s->kind == AST_STMT_LET ? "(let " : "(= ", out);
        for (uint32_t i = 0; i < s->as.let.name_count; i++)
            fprintf(out, "%s%s", i ? "," : "", s->as.let.names[i]);
        fputc(' ', out);
        print_expr(out, s->as.let.value);
        break;
    case AST_STMT_FOR:
        fprintf(out, "(for %s ", s->as.loop.var);
        print_expr(out, s->as.loop.from);
        fputc(' ', out);
        print_expr(out, s->as.loop.to);
        fputc(' ', out);
        print_block(out, &s->as.loop.body);
        break;
    case AST_STMT_IF:
        fputs("(if ", out);
        print_expr(out, s->as.branch.cond);
        fputc(' ', out);
        print_block(out, &s->as.branch.then_body);
        if (s->as.branch.else_body.count) {
            fputs(" else ", out);
            print_block(out, &s->as.branch.else_body);
        }
        break;
    case AST_STMT_OUTPUT:
        fprintf(out, "(output %s ", s->as.output.name);
        print_expr(out, s->as.output.value);
        break;
    case AST_STMT_REQUIRE:
        fputs("(require ", out);
        print_expr(out, s->as.require.cond);
        if (s->as.require.message) fprintf(out, " \"%s\"", s->as.require.message);
        break;
    case AST_STMT_IGNORE: fprintf(out, "(ignore \"%s\"", s->as.ignore.pattern); break;
    }
    fputc(')', out);
}

static void print_block(FILE *out, const ast_block *b) {
    fputc('{', out);
    for (uint32_t i = 0; i < b->count; i++) {
        if (i) fputc(' ', out);
        print_stmt(out, b->items[i]);
    }
    fputc('}', out);
}

/* The body of the model in `source`, printed; the parse must succeed. */
static char *body_of(const char *source) {
    parsed p;
    parse(&p, source);
    if (!p.ok) fprintf(stderr, "unexpected errors:\n%s", p.output);
    assert_true(p.ok);
    assert_string_equal(p.output, "");
    char *text = NULL;
    size_t size = 0;
    FILE *out = open_memstream(&text, &size);
    print_block(out, &p.model.body);
    fclose(out);
    parsed_free(&p);
    return text;
}

static void expect_body(const char *source, const char *expected) {
    char *body = body_of(source);
    assert_string_equal(body, expected);
    free(body);
}

/* A statement of a model body, printed: "model m {\n" STMT "\n}". */
static void expect_stmt(const char *stmt, const char *expected) {
    size_t n = strlen(stmt) + 32;
    char *source = malloc(n);
    snprintf(source, n, "model m {\n%s\n}\n", stmt);
    size_t m = strlen(expected) + 3;
    char *wrapped = malloc(m);
    snprintf(wrapped, m, "{%s}", expected);
    expect_body(source, wrapped);
    free(wrapped);
    free(source);
}

/* ---- statements -------------------------------------------------------------- */

static void test_model(void **state) {
    parsed p;
    parse(&p, "# a model\n\nmodel llama {\n}\n\n");
    assert_true(p.ok);
    assert_string_equal(p.model.name, "llama");
    assert_int_equal(p.model.loc.line, 3);
    assert_int_equal(p.model.loc.col, 1);
    assert_int_equal(p.model.body.count, 0);
    assert_string_equal(p.model.source_path, "t.smelt");
    assert_string_equal(diag_file_path(&p.diag, p.model.source_file), "t.smelt");
    parsed_free(&p);
    expect_body("model m {}", "{}");
    expect_body("model m { }", "{}");
    expect_body("model m {;;\n\n;}", "{}");
}

static void test_param(void **state) {
    expect_stmt("param hidden_size: int = 4096", "(param hidden_size int 4096)");
    expect_stmt("param rms_norm_eps: float", "(param rms_norm_eps float)");
    expect_stmt("param model_type: string = \"llama\"", "(param model_type string \"llama\")");
    expect_stmt("param attention_bias: bool = model_type == \"qwen2\"",
                "(param attention_bias bool (== model_type \"qwen2\"))");
    expect_stmt("param kv: int = num_attention_heads", "(param kv int num_attention_heads)");
    expect_stmt("param rope_scaling: object = null", "(param rope_scaling object null)");
    expect_stmt("param layer_types: list = null", "(param layer_types list null)");
    expect_stmt("param layer_types: list[string] = null", "(param layer_types list[string] null)");
    expect_stmt("param mlp_only_layers: list[int] = []", "(param mlp_only_layers list[int] [])");
    expect_stmt("param f: list[float]", "(param f list[float])");
    expect_stmt("param b: list[bool] = [true]", "(param b list[bool] [true])");
}

/* x[i] binds tighter than any operator, after a call or another index. */
static void test_index(void **state) {
    expect_stmt("let x = layer_types[l]", "(let x ([] layer_types l))");
    expect_stmt("let x = a[i][j + 1]", "(let x ([] ([] a i) (+ j 1)))");
    expect_stmt("let x = -a[0] * 2", "(let x (* (- ([] a 0)) 2))");
    expect_stmt("let x = !flags[l] && b", "(let x (&& (! ([] flags l)) b))");
    expect_stmt("let x = [1, 2][0]", "(let x ([] [1 2] 0))");
    expect_stmt("let x = f(a)[1]", "(let x ([] f(a) 1))");
    expect_stmt("require len(t) == n", "(require (== len(t) n))");
    expect_stmt("let x = t[\n  l]", "(let x ([] t l))");
    /* A newline ends the statement before a '[' on the next line: no index. */
    expect_errors("model m {\n  let x = a\n  [1]\n}",
                  "t.smelt:3:3: error: expected statement or '}' but found '['\n");
}

static void test_dim_input_output(void **state) {
    expect_stmt("dim tokens <= 8192", "(dim tokens 8192)");
    expect_stmt("dim seq <= 2 * max_len", "(dim seq (* 2 max_len))");
    expect_stmt("input ids: i32[tokens]", "(input ids i32[tokens])");
    expect_stmt("input x: f32[tokens, hidden_size / 2,]", "(input x f32[tokens (/ hidden_size 2)])");
    expect_stmt("input s: i64[]", "(input s i64[])");
    expect_stmt("output logits = matmul(h, embed)", "(output logits matmul(h embed))");
}

static void test_weight(void **state) {
    expect_stmt("weight embed: [vocab_size, hidden_size] = \"model.embed_tokens.weight\"",
                "(weight embed [vocab_size hidden_size] \"model.embed_tokens.weight\")");
    expect_stmt("weight ln: bf16[hidden_size] = \"model.layers.{l}.input_layernorm.weight\"",
                "(weight ln bf16[hidden_size] \"model.layers.{l}.input_layernorm.weight\")");
    expect_stmt("weight w1: [n, f, d] =\n  \"m.experts.{e}.w1.weight\" stacked e",
                "(weight w1 [n f d] \"m.experts.{e}.w1.weight\" stacked e)");
}

static void test_require_and_ignore(void **state) {
    expect_stmt("require hidden_act == \"silu\"", "(require (== hidden_act \"silu\"))");
    expect_stmt("require !mlp_bias, \"no MLP biases\"", "(require (! mlp_bias) \"no MLP biases\")");
    expect_stmt("ignore \"model.layers.*.rotary_emb.inv_freq\"",
                "(ignore \"model.layers.*.rotary_emb.inv_freq\")");
}

static void test_let_and_assign(void **state) {
    expect_stmt("let h = embedding(embed, ids)", "(let h embedding(embed ids))");
    expect_stmt("let q, k, v = split(qkv, axis = 1, sizes = [d, d, d])",
                "(let q,k,v split(qkv axis=1 sizes=[d d d]))");
    expect_stmt("h = add(h, x)", "(= h add(h x))");
    expect_stmt("a, b = f()", "(= a,b f())");
    expect_stmt("let scale = 1.0 / sqrt(head_dim)", "(let scale (/ 1f sqrt(head_dim)))");
    expect_stmt("let s = \"a\\\"b\\\\c\\nd\\te\"", "(let s \"a\"b\\c\nd\te\")");
    expect_stmt("let l = [[1, 2], [], [true, false, 1.5]]", "(let l [[1 2] [] [true false 1.5f]])");
    /* Calls nest, take keyword arguments and a trailing comma, and may span lines. */
    expect_stmt("let q = reshape(matmul(x, wq), shape = [tokens,\n  num_heads, head_dim],)",
                "(let q reshape(matmul(x wq) shape=[tokens num_heads head_dim]))");
}

static void test_for(void **state) {
    expect_stmt("for l in 0..num_hidden_layers {\n  let x = l\n  h = add(h, x)\n}",
                "(for l 0 num_hidden_layers {(let x l) (= h add(h x))})");
    expect_stmt("for i in a + 1..2 * b { }", "(for i (+ a 1) (* 2 b) {})");
    expect_stmt("for i in 0..n\n{\n}", "(for i 0 n {})");
}

static void test_if(void **state) {
    expect_stmt("if attention_bias { q = add(q, bq) }", "(if attention_bias {(= q add(q bq))})");
    expect_stmt("if a { x = 1 } else { x = 2 }", "(if a {(= x 1)} else {(= x 2)})");
    expect_stmt("if a { x = 1 } else if b > 2 { x = 2 } else { x = 3 }",
                "(if a {(= x 1)} else {(if (> b 2) {(= x 2)} else {(= x 3)})})");
    expect_stmt("if a {\n  x = 1\n}\nelse if b {\n}\nelse {\n  x = 3\n}",
                "(if a {(= x 1)} else {(if b {} else {(= x 3)})})");
    expect_stmt("if a { if b { if c { x = 1 } } }", "(if a {(if b {(if c {(= x 1)})})})");
}

static void test_separators(void **state) {
    expect_body("model m { let a = 1; let b = 2\n\n\n  let c = 3; }", "{(let a 1) (let b 2) (let c 3)}");
    expect_body("model m {\n  let a = 1 +\n    2\n  let b = f(1,\n 2\n )\n}\n",
                "{(let a (+ 1 2)) (let b f(1 2))}");
}

/* ---- expressions ------------------------------------------------------------- */

static void test_precedence(void **state) {
    expect_stmt("let x = 1 + 2 * 3", "(let x (+ 1 (* 2 3)))");
    expect_stmt("let x = (1 + 2) * 3", "(let x (* (+ 1 2) 3))");
    expect_stmt("let x = 1 - 2 - 3", "(let x (- (- 1 2) 3))");
    expect_stmt("let x = 8 / 4 / 2 % 3", "(let x (% (/ (/ 8 4) 2) 3))");
    expect_stmt("let x = a || b && c == d < e + f * g", "(let x (|| a (&& b (== c (< d (+ e (* f g)))))))");
    expect_stmt("let x = a * b + c < d == e && f || g", "(let x (|| (&& (== (< (+ (* a b) c) d) e) f) g))");
    expect_stmt("let x = a != b >= c <= d > e", "(let x (!= a (> (<= (>= b c) d) e)))");
    expect_stmt("let x = -a * -b", "(let x (* (- a) (- b)))");
    expect_stmt("let x = - - !a", "(let x (- (- (! a))))");
    expect_stmt("let x = !a == b", "(let x (== (! a) b))");
    expect_stmt("let x = a - -1", "(let x (- a (- 1)))");
    expect_stmt("let x = -f(a) * (b)", "(let x (* (- f(a)) b))");
}

static void test_literals(void **state) {
    parsed p;
    parse(&p, "model m {\n let a = 9223372036854775807\n let b = 1e-5\n let c = \"\"\n}");
    assert_true(p.ok);
    ast_stmt **s = p.model.body.items;
    assert_int_equal(s[0]->as.let.value->kind, AST_EXPR_INT);
    assert_true(s[0]->as.let.value->as.i == INT64_MAX);
    assert_int_equal(s[1]->as.let.value->kind, AST_EXPR_FLOAT);
    assert_true(s[1]->as.let.value->as.f == 1e-5);
    assert_int_equal(s[2]->as.let.value->kind, AST_EXPR_STRING);
    assert_string_equal(s[2]->as.let.value->as.s, "");
    parsed_free(&p);
}

static void test_operator_text(void **state) {
    static const struct {
        ast_operator op;
        const char *text;
    } table[] = {
        {AST_OP_NEG, "-"}, {AST_OP_NOT, "!"}, {AST_OP_ADD, "+"}, {AST_OP_SUB, "-"},  {AST_OP_MUL, "*"},
        {AST_OP_DIV, "/"}, {AST_OP_MOD, "%"}, {AST_OP_EQ, "=="}, {AST_OP_NE, "!="},  {AST_OP_LT, "<"},
        {AST_OP_LE, "<="}, {AST_OP_GT, ">"},  {AST_OP_GE, ">="}, {AST_OP_AND, "&&"}, {AST_OP_OR, "||"},
    };
    for (size_t i = 0; i < sizeof table / sizeof table[0]; i++)
        assert_string_equal(ast_operator_text(table[i].op), table[i].text);
}

/* ---- locations ---------------------------------------------------------------- */

#define ASSERT_LOC(loc, l, c)                                                                                \
    do {                                                                                                     \
        assert_int_equal((loc).line, (l));                                                                   \
        assert_int_equal((loc).col, (c));                                                                    \
    } while (0)

static void test_locations(void **state) {
    parsed p;
    parse(&p, "model m {\n"                                  /* 1 */
              "  param a: int = 1 + 2 * 3\n"                 /* 2 */
              "\tweight w: bf16[4] = \"x.{l}\" stacked l\n"  /* 3 */
              "  let q,  k = split(x, axis = 1)\n"           /* 4 */
              "  h = -x\n"                                   /* 5 */
              "  for l in 0..2 { if c { } else if d { } }\n" /* 6 */
              "  input i: [n]\n"                             /* 7 */
              "}\n");
    assert_true(p.ok);
    ast_stmt **s = p.model.body.items;
    assert_int_equal(p.model.body.count, 6);
    int32_t file = p.model.source_file;

    /* param: the statement at its keyword, a binary node at its operator */
    ASSERT_LOC(s[0]->loc, 2, 3);
    assert_int_equal(s[0]->loc.file, file);
    const ast_expr *sum = s[0]->as.param.default_value;
    ASSERT_LOC(sum->loc, 2, 20);
    ASSERT_LOC(sum->as.binary.lhs->loc, 2, 18);
    ASSERT_LOC(sum->as.binary.rhs->loc, 2, 24);
    ASSERT_LOC(sum->as.binary.rhs->as.binary.rhs->loc, 2, 26);
    assert_int_equal(sum->loc.file, file);

    /* weight: after a tab (one byte); the dtype and the string */
    ASSERT_LOC(s[1]->loc, 3, 2);
    ASSERT_LOC(s[1]->as.weight.type.dtype_loc, 3, 12);
    ASSERT_LOC(s[1]->as.weight.type.dims[0]->loc, 3, 17);
    ASSERT_LOC(s[1]->as.weight.hf_name_loc, 3, 22);

    /* let: each name; a call at its name; an argument at its keyword or value */
    ASSERT_LOC(s[2]->loc, 4, 3);
    ASSERT_LOC(s[2]->as.let.name_locs[0], 4, 7);
    ASSERT_LOC(s[2]->as.let.name_locs[1], 4, 11);
    const ast_expr *call = s[2]->as.let.value;
    ASSERT_LOC(call->loc, 4, 15);
    ASSERT_LOC(call->as.call.args[0].loc, 4, 21);
    ASSERT_LOC(call->as.call.args[1].loc, 4, 24);
    ASSERT_LOC(call->as.call.args[1].value->loc, 4, 31);

    /* assignment: at its first name; a unary at its operator */
    ASSERT_LOC(s[3]->loc, 5, 3);
    ASSERT_LOC(s[3]->as.let.name_locs[0], 5, 3);
    ASSERT_LOC(s[3]->as.let.value->loc, 5, 7);
    ASSERT_LOC(s[3]->as.let.value->as.unary.operand->loc, 5, 8);

    /* for, if, and the `if` of an `else if` */
    ASSERT_LOC(s[4]->loc, 6, 3);
    ASSERT_LOC(s[4]->as.loop.to->loc, 6, 15);
    const ast_stmt *branch = s[4]->as.loop.body.items[0];
    ASSERT_LOC(branch->loc, 6, 19);
    ASSERT_LOC(branch->as.branch.else_body.items[0]->loc, 6, 33);

    /* a type without dtype is located at its '[' */
    ASSERT_LOC(s[5]->as.input.type.dtype_loc, 7, 12);
    assert_null(s[5]->as.input.type.dtype);
    parsed_free(&p);
}

/* ---- errors ------------------------------------------------------------------- */

static void test_empty_file(void **state) {
    expect_errors("", "t.smelt:1:1: error: expected 'model' but found end of file\n");
    expect_errors("# nothing\n\n# here\n", "t.smelt:1:1: error: expected 'model' but found end of file\n");
    expect_errors("\n\n  \n", "t.smelt:1:1: error: expected 'model' but found end of file\n");
    /* The caret is printed under the (empty) first line. */
    parsed p;
    parse(&p, "");
    assert_string_equal(p.output, "t.smelt:1:1: error: expected 'model' but found end of file\n"
                                  "    1 | \n"
                                  "      | ^\n");
    parsed_free(&p);
}

static void test_every_error_reported(void **state) {
    expect_errors("model m {\n"
                  "  param a int = 1\n" /* 2: missing ':' */
                  "  let = 3\n"         /* 3: missing name */
                  "  dim t <=\n"        /* 4: missing bound */
                  "  let ok = 1\n"
                  "  output y = f(1,\n" /* 6: unclosed call */
                  "  for l 0..n {\n"    /* 7: missing 'in'; the body is still checked */
                  "    let x = 1 2\n"   /* 8: two values */
                  "  }\n"
                  "  weight w: [2] = \"w\" stacked\n"       /* 10: missing name */
                  "  if x { let y = } else { let z = ) }\n" /* 11: two errors on one line */
                  "}\n"
                  "model n {}\n", /* 13: a second model */
                  "t.smelt:2:11: error: expected ':' but found 'int'\n"
                  "t.smelt:3:7: error: expected name but found '='\n"
                  "t.smelt:4:11: error: expected expression but found end of line\n"
                  "t.smelt:6:18: error: expected expression or ')' but found end of line\n"
                  "t.smelt:7:9: error: expected 'in' but found integer '0'\n"
                  "t.smelt:8:15: error: expected end of line or '}' but found integer '2'\n"
                  "t.smelt:10:30: error: expected name but found end of line\n"
                  "t.smelt:11:18: error: expected expression but found '}'\n"
                  "t.smelt:11:35: error: expected expression but found ')'\n"
                  "t.smelt:13:1: error: expected end of file but found 'model': a file holds one model\n");
}

static void test_error_messages(void **state) {
    expect_errors("model m {\n  weight w: [2] = \"w\"\n  weight\n}",
                  "t.smelt:3:9: error: expected name but found end of line\n");
    expect_errors("model m {\n  let x = 1\n", /* unclosed model */
                  "t.smelt:2:12: error: expected '}' but found end of file\n");
    expect_errors(
        "model m {\n  param p: i32\n}",
        "t.smelt:2:12: error: expected 'int', 'float', 'bool', 'string', 'object' or 'list' but found name "
        "'i32'\n");
    expect_errors("model m {\n  param p: list[object]\n}",
                  "t.smelt:2:17: error: expected 'int', 'float', 'bool' or 'string' but found 'object'\n");
    expect_errors("model m {\n  let x = a[1\n}", "t.smelt:2:14: error: expected ']' but found end of line\n");
    expect_errors("model m {\n  let x = a[]\n}", "t.smelt:2:13: error: expected expression but found ']'\n");
    expect_errors("model m {\n  (a) = 1\n}", "t.smelt:2:3: error: expected statement or '}' but found '('\n");
    expect_errors("model m {\n  for i in 0 {}\n}", "t.smelt:2:14: error: expected '..' but found '{'\n");
    /* A broken model header: the body is still checked. A line that ends
     * in '=' goes on to the next one, which here is the model's '}'. */
    expect_errors("model {\n  let x = \n}", "t.smelt:1:7: error: expected name but found '{'\n"
                                            "t.smelt:3:1: error: expected expression but found '}'\n");
    expect_errors("model m {\n  let x = [1, 2\n  let y = 3\n}",
                  "t.smelt:2:16: error: expected ',' or ']' but found end of line\n");
    /* A long name in a message is cut to 64 bytes. */
    char source[512];
    snprintf(source, sizeof source, "model m {\n  let x = 1 %0100d\n}", 0);
    parsed p;
    parse(&p, source);
    char *errors = error_lines(p.output);
    assert_string_equal(errors, "t.smelt:2:13: error: expected end of line or '}' but found integer "
                                "'0000000000000000000000000000000000000000000000000000000000000000...'\n");
    free(errors);
    parsed_free(&p);
}

static void test_lexical_errors_do_not_stop_parsing(void **state) {
    /* A NUL byte is reported where it is and the rest of the file is still
     * parsed: the text is not cut at the NUL. */
    static const char source[] = "model m {\n let a = 1\n\x00\n let b = \"x\x00y\" @\n}\n";
    parsed p;
    parse_bytes(&p, source, sizeof source - 1);
    char *errors = error_lines(p.output);
    assert_string_equal(errors, "t.smelt:3:1: error: unexpected character '\\x00'\n"
                                "t.smelt:4:12: error: unexpected character '\\x00' in string\n"
                                "t.smelt:4:16: error: unexpected character '@'\n");
    assert_false(p.ok);
    assert_int_equal(p.model.body.count, 2);
    assert_string_equal(p.model.body.items[1]->as.let.value->as.s, "xy");
    free(errors);
    parsed_free(&p);
}

/* ---- hostile inputs ------------------------------------------------------------ */

/* "model m {\n" HEAD OPEN*count MIDDLE CLOSE*count "\n}\n" */
static char *nested(const char *head, const char *open, int count, const char *middle, const char *close) {
    size_t n = 32 + strlen(head) + strlen(middle) + (size_t)count * (strlen(open) + strlen(close));
    char *s = malloc(n);
    assert_non_null(s);
    size_t used = (size_t)snprintf(s, n, "model m {\n%s", head);
    for (int i = 0; i < count; i++)
        used += (size_t)snprintf(s + used, n - used, "%s", open);
    used += (size_t)snprintf(s + used, n - used, "%s", middle);
    for (int i = 0; i < count; i++)
        used += (size_t)snprintf(s + used, n - used, "%s", close);
    snprintf(s + used, n - used, "\n}\n");
    return s;
}

static void expect_one_nesting_error(char *source, const char *where) {
    parsed p;
    parse(&p, source);
    char *errors = error_lines(p.output);
    char expected[128];
    snprintf(expected, sizeof expected, "t.smelt:%s: error: nesting deeper than 256 levels\n", where);
    assert_string_equal(errors, expected);
    assert_false(p.ok);
    free(errors);
    parsed_free(&p);
    free(source);
}

static void test_deep_nesting(void **state) {
    /* 10,000 levels of each kind of nesting: one error, no crash, no stack
     * overflow. "  let x = " is 10 bytes; the model's '{' is level 1, so the
     * 256th bracket (column 10 + 256) is level 257. */
    expect_one_nesting_error(nested("  let x = ", "(", 10000, "1", ")"), "2:266");
    expect_one_nesting_error(nested("  let x = ", "[", 10000, "", "]"), "2:266");
    expect_one_nesting_error(nested("  let x = ", "f(", 10000, "", ")"), "2:522");
    /* Each "if true {" is 9 bytes: the 256th '{' is at column 9 * 256. */
    expect_one_nesting_error(nested("", "if true {", 10000, "", "}"), "2:2304");
    expect_one_nesting_error(nested("", "for i in 0..1 {", 10000, "", "}"), "2:3840");
    /* Trees that are deep without brackets: 257 prefix operators (the 257th
     * '-' at column 10 + 257), a sum whose 256th '+' (column 10 + 2 * 256)
     * makes it 257 deep, and an else-if chain whose 256th `else if` (its
     * `if` at column 9 + 13 * 255 + 7) makes it 257 deep. */
    expect_one_nesting_error(nested("  let x = ", "-", 10000, "1", ""), "2:267");
    expect_one_nesting_error(nested("  let x = 1", "+1", 10000, "", ""), "2:522");
    expect_one_nesting_error(nested("  if a {}", " else if b {}", 10000, "", ""), "2:3331");
}

static void test_nesting_within_limit(void **state) {
    /* Exactly 256 levels of each kind are accepted. */
    char *cases[] = {
        nested("  let x = ", "(", 255, "1", ")"), nested("  let x = ", "[", 255, "", "]"),
        nested("", "if true {", 255, "", "}"),    nested("  let x = ", "-", 255, "1", ""),
        nested("  let x = 1", "+1", 255, "", ""), nested("  if a {}", " else if b {}", 255, "", ""),
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        parsed p;
        parse(&p, cases[i]);
        assert_string_equal(p.output, "");
        assert_true(p.ok);
        assert_int_equal(p.model.body.count, 1);
        parsed_free(&p);
        free(cases[i]);
    }
    /* Parentheses make no node. */
    char *source = nested("  let x = ", "(", 255, "1", ")");
    expect_body(source, "{(let x 1)}");
    free(source);
}

static void test_missing_file(void **state) {
    parsed p;
    p.stream = open_memstream(&p.output, &p.output_size);
    diag_init(&p.diag, p.stream);
    p.ok = fe_parse_dsl("/nonexistent/dir/model.smelt", &p.diag, &p.model);
    fflush(p.stream);
    assert_false(p.ok);
    assert_string_equal(
        p.output, "smelt: error: cannot read '/nonexistent/dir/model.smelt': No such file or directory\n");
    parsed_free(&p);

    p.stream = open_memstream(&p.output, &p.output_size);
    diag_init(&p.diag, p.stream);
    p.ok = fe_parse_dsl(SMELT_SOURCE_DIR "/docs", &p.diag, &p.model);
    fflush(p.stream);
    assert_false(p.ok);
    assert_non_null(strstr(p.output, "/docs': Is a directory\n"));
    parsed_free(&p);
}

static void test_parse_file(void **state) {
    char path[] = "/tmp/smelt_test_parser_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *f = fdopen(fd, "w");
    fputs("model m {\n  let x = 1 +\n}\n", f);
    fclose(f);
    parsed p;
    p.stream = open_memstream(&p.output, &p.output_size);
    diag_init(&p.diag, p.stream);
    p.ok = fe_parse_dsl(path, &p.diag, &p.model);
    fflush(p.stream);
    remove(path);
    assert_false(p.ok);
    assert_string_equal(p.model.source_path, path);
    /* The error carries the path and shows the source line and caret. */
    char expected[256];
    snprintf(expected, sizeof expected,
             "%s:3:1: error: expected expression but found '}'\n"
             "    3 | }\n"
             "      | ^\n",
             path);
    assert_string_equal(p.output, expected);
    parsed_free(&p);
}

static void test_size_limit(void **state) {
    /* 64 MiB is the most a model description may have: one byte more is
     * refused, from memory and from a file (a sparse one: no disk used). */
    size_t limit = (size_t)64 * 1024 * 1024;
    char *text = calloc(limit + 1, 1);
    assert_non_null(text);
    parsed p;
    parse_bytes(&p, text, limit + 1);
    assert_false(p.ok);
    assert_string_equal(p.output,
                        "smelt: error: 't.smelt' is larger than 64 MiB, the limit for a model description\n");
    parsed_free(&p);
    free(text);

    char path[] = "/tmp/smelt_test_parser_XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(ftruncate(fd, (off_t)limit + 1), 0);
    close(fd);
    p.stream = open_memstream(&p.output, &p.output_size);
    diag_init(&p.diag, p.stream);
    p.ok = fe_parse_dsl(path, &p.diag, &p.model);
    fflush(p.stream);
    remove(path);
    assert_false(p.ok);
    assert_non_null(strstr(p.output, "' is larger than 64 MiB, the limit for a model description\n"));
    parsed_free(&p);
}

static void test_examples_parse(void **state) {
    static const char *const examples[] = {"llama", "mixtral", "gpt2"};
    for (size_t i = 0; i < sizeof examples / sizeof examples[0]; i++) {
        char path[512];
        snprintf(path, sizeof path, "%s/examples/%s.smelt", SMELT_SOURCE_DIR, examples[i]);
        FILE *f = fopen(path, "r");
        if (!f) continue; /* not every checkout has every example */
        fclose(f);
        parsed p;
        p.stream = open_memstream(&p.output, &p.output_size);
        diag_init(&p.diag, p.stream);
        p.ok = fe_parse_dsl(path, &p.diag, &p.model);
        fflush(p.stream);
        assert_string_equal(p.output, "");
        assert_true(p.ok);
        assert_string_equal(p.model.name, examples[i]);
        assert_true(p.model.body.count > 5);
        parsed_free(&p);
    }
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_model),
        cmocka_unit_test(test_param),
        cmocka_unit_test(test_index),
        cmocka_unit_test(test_dim_input_output),
        cmocka_unit_test(test_weight),
        cmocka_unit_test(test_require_and_ignore),
        cmocka_unit_test(test_let_and_assign),
        cmocka_unit_test(test_for),
        cmocka_unit_test(test_if),
        cmocka_unit_test(test_separators),
        cmocka_unit_test(test_precedence),
        cmocka_unit_test(test_literals),
        cmocka_unit_test(test_operator_text),
        cmocka_unit_test(test_locations),
        cmocka_unit_test(test_empty_file),
        cmocka_unit_test(test_every_error_reported),
        cmocka_unit_test(test_error_messages),
        cmocka_unit_test(test_lexical_errors_do_not_stop_parsing),
        cmocka_unit_test(test_deep_nesting),
        cmocka_unit_test(test_nesting_within_limit),
        cmocka_unit_test(test_missing_file),
        cmocka_unit_test(test_parse_file),
        cmocka_unit_test(test_size_limit),
        cmocka_unit_test(test_examples_parse),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
