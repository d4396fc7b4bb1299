/* test_json_model.c - the JSON model reader (frontend/json_model.c) and the
 * IR's JSON dump (ir/print_json.c).
 *
 * Reader: every statement and expression form lands in the right AST node,
 * locations follow "source"/"loc", and each kind of bad input gives its own
 * message (checked word for word through a memstream given to the diag
 * engine). Dump: a module built by hand prints the expected JSON, which
 * jansson and the reader both read back to the same facts.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "ast.h"
#include "ir_io.h"

#include <jansson.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

/* ---- running the reader -------------------------------------------------- */

typedef struct parsed {
    diag_engine d;
    FILE *out;
    char *messages; /* everything the diag engine printed */
    size_t messages_size;
    ast_model model;
    bool ok;
} parsed;

static parsed *parse_bytes(const char *text, size_t length) {
    parsed *p = calloc(1, sizeof *p);
    assert_non_null(p);
    p->out = open_memstream(&p->messages, &p->messages_size);
    assert_non_null(p->out);
    diag_init(&p->d, p->out);
    p->ok = fe_parse_json_text("t.json", text, length, &p->d, &p->model);
    fflush(p->out);
    return p;
}

static parsed *parse(const char *text) { return parse_bytes(text, strlen(text)); }

static void parsed_free(parsed *p) {
    ast_model_free(&p->model);
    diag_free(&p->d);
    fclose(p->out);
    free(p->messages);
    free(p);
}

static unsigned count_of(const char *haystack, const char *needle) {
    unsigned n = 0;
    for (const char *s = haystack; (s = strstr(s, needle)) != NULL; s += strlen(needle))
        n++;
    return n;
}

/* Asserts that `line` appears in the messages as a whole line. */
#define assert_message(p, line)                                                                              \
    do {                                                                                                     \
        char *wanted_ = malloc(strlen(line) + 3);                                                            \
        sprintf(wanted_, "%s\n", (line));                                                                    \
        bool found_ = strncmp((p)->messages, wanted_, strlen(wanted_)) == 0;                                 \
        sprintf(wanted_, "\n%s\n", (line));                                                                  \
        found_ = found_ || strstr((p)->messages, wanted_) != NULL;                                           \
        if (!found_) print_error("missing line:\n%s\nin messages:\n%s", (line), (p)->messages);              \
        free(wanted_);                                                                                       \
        assert_true(found_);                                                                                 \
    } while (0)

/* A document around a body: {"smelt": 1, "model": "m", "body": [BODY]}. */
static parsed *parse_body(const char *body) {
    size_t n = strlen(body) + 64;
    char *text = malloc(n);
    snprintf(text, n, "{\"smelt\": 1, \"model\": \"m\", \"body\": [%s]}", body);
    parsed *p = parse(text);
    free(text);
    return p;
}

/* The value expression of the only (let) statement of a body. */
static const ast_expr *let_value(parsed *p) {
    assert_true(p->ok);
    assert_int_equal(p->model.body.count, 1);
    assert_int_equal(p->model.body.items[0]->kind, AST_STMT_LET);
    return p->model.body.items[0]->as.let.value;
}

/* ---- statements ---------------------------------------------------------- */

static void test_every_statement_form(void **state) {
    (void)state;
    parsed *p = parse(
        "{\"smelt\": 1, \"model\": \"tiny\", \"body\": [\n"
        " {\"param\": \"hidden\", \"type\": \"int\", \"default\": 64},\n"
        " {\"param\": \"eps\", \"type\": \"float\"},\n"
        " {\"param\": \"kind\", \"type\": \"string\", \"default\": {\"str\": \"llama\"}},\n"
        " {\"param\": \"bias\", \"type\": \"bool\", \"default\": false},\n"
        " {\"dim\": \"tokens\", \"max\": 8192},\n"
        " {\"input\": \"ids\", \"dtype\": \"i32\", \"shape\": [\"tokens\"]},\n"
        " {\"weight\": \"embed\", \"shape\": [97, \"hidden\"], \"name\": \"model.embed_tokens.weight\"},\n"
        " {\"weight\": \"w1\", \"dtype\": \"bf16\", \"shape\": [4, 8, \"hidden\"],"
        "  \"name\": \"m.experts.{e}.w1.weight\", \"stacked\": \"e\"},\n"
        " {\"let\": \"h\", \"value\": {\"call\": \"embedding\", \"args\": [\"embed\", \"ids\"]}},\n"
        " {\"let\": [\"a\", \"b\"], \"value\": {\"call\": \"split\", \"args\": [\"h\"],"
        "  \"attrs\": {\"axis\": 1, \"sizes\": [32, 32]}}},\n"
        " {\"set\": \"h\", \"value\": \"a\"},\n"
        " {\"set\": [\"a\", \"b\"], \"value\": \"h\"},\n"
        " {\"for\": \"l\", \"from\": 0, \"to\": \"hidden\", \"body\": [{\"let\": \"x\", \"value\": "
        "\"h\"}]},\n"
        " {\"if\": \"bias\", \"then\": [{\"set\": \"h\", \"value\": \"a\"}],"
        "  \"else\": [{\"output\": \"o2\", \"value\": \"h\"}, {\"dim\": \"d2\", \"max\": 2}]},\n"
        " {\"if\": true, \"then\": []},\n"
        " {\"output\": \"logits\", \"value\": {\"call\": \"matmul\", \"args\": [\"h\", \"embed\"]}}\n"
        "]}");
    assert_true(p->ok);
    assert_int_equal(p->d.error_count, 0);
    assert_string_equal(p->model.name, "tiny");
    const ast_block *b = &p->model.body;
    assert_int_equal(b->count, 16);

    const ast_stmt *s = b->items[0];
    assert_int_equal(s->kind, AST_STMT_PARAM);
    assert_string_equal(s->as.param.name, "hidden");
    assert_int_equal(s->as.param.type, IR_PARAM_INT);
    assert_int_equal(s->as.param.default_value->kind, AST_EXPR_INT);
    assert_int_equal(s->as.param.default_value->as.i, 64);
    s = b->items[1];
    assert_int_equal(s->as.param.type, IR_PARAM_FLOAT);
    assert_null(s->as.param.default_value);
    s = b->items[2];
    assert_int_equal(s->as.param.type, IR_PARAM_STRING);
    assert_int_equal(s->as.param.default_value->kind, AST_EXPR_STRING);
    assert_string_equal(s->as.param.default_value->as.s, "llama");
    s = b->items[3];
    assert_int_equal(s->as.param.type, IR_PARAM_BOOL);
    assert_int_equal(s->as.param.default_value->kind, AST_EXPR_BOOL);
    assert_false(s->as.param.default_value->as.b);

    s = b->items[4];
    assert_int_equal(s->kind, AST_STMT_DIM);
    assert_string_equal(s->as.dim.name, "tokens");
    assert_int_equal(s->as.dim.bound->as.i, 8192);

    s = b->items[5];
    assert_int_equal(s->kind, AST_STMT_INPUT);
    assert_string_equal(s->as.input.name, "ids");
    assert_string_equal(s->as.input.type.dtype, "i32");
    assert_int_equal(s->as.input.type.rank, 1);
    assert_int_equal(s->as.input.type.dims[0]->kind, AST_EXPR_NAME);
    assert_string_equal(s->as.input.type.dims[0]->as.s, "tokens");

    s = b->items[6];
    assert_int_equal(s->kind, AST_STMT_WEIGHT);
    assert_string_equal(s->as.weight.name, "embed");
    assert_null(s->as.weight.type.dtype);
    assert_int_equal(s->as.weight.type.rank, 2);
    assert_int_equal(s->as.weight.type.dims[0]->as.i, 97);
    assert_string_equal(s->as.weight.type.dims[1]->as.s, "hidden");
    assert_string_equal(s->as.weight.hf_name, "model.embed_tokens.weight");
    assert_null(s->as.weight.stack_var);
    s = b->items[7];
    assert_string_equal(s->as.weight.type.dtype, "bf16");
    assert_int_equal(s->as.weight.type.rank, 3);
    assert_string_equal(s->as.weight.hf_name, "m.experts.{e}.w1.weight");
    assert_string_equal(s->as.weight.stack_var, "e");

    s = b->items[8];
    assert_int_equal(s->kind, AST_STMT_LET);
    assert_int_equal(s->as.let.name_count, 1);
    assert_string_equal(s->as.let.names[0], "h");
    assert_int_equal(s->as.let.value->kind, AST_EXPR_CALL);
    assert_string_equal(s->as.let.value->as.call.name, "embedding");
    s = b->items[9];
    assert_int_equal(s->as.let.name_count, 2);
    assert_string_equal(s->as.let.names[0], "a");
    assert_string_equal(s->as.let.names[1], "b");
    const ast_expr *split = s->as.let.value;
    assert_int_equal(split->as.call.arg_count, 3);
    assert_null(split->as.call.args[0].keyword);
    assert_string_equal(split->as.call.args[1].keyword, "axis");
    assert_string_equal(split->as.call.args[2].keyword, "sizes");
    assert_int_equal(split->as.call.args[2].value->kind, AST_EXPR_LIST);
    assert_int_equal(split->as.call.args[2].value->as.list.count, 2);

    s = b->items[10];
    assert_int_equal(s->kind, AST_STMT_ASSIGN);
    assert_int_equal(s->as.let.name_count, 1);
    assert_string_equal(s->as.let.names[0], "h");
    assert_string_equal(s->as.let.value->as.s, "a");
    s = b->items[11];
    assert_int_equal(s->kind, AST_STMT_ASSIGN);
    assert_int_equal(s->as.let.name_count, 2);

    s = b->items[12];
    assert_int_equal(s->kind, AST_STMT_FOR);
    assert_string_equal(s->as.loop.var, "l");
    assert_int_equal(s->as.loop.from->as.i, 0);
    assert_string_equal(s->as.loop.to->as.s, "hidden");
    assert_int_equal(s->as.loop.body.count, 1);
    assert_int_equal(s->as.loop.body.items[0]->kind, AST_STMT_LET);

    s = b->items[13];
    assert_int_equal(s->kind, AST_STMT_IF);
    assert_string_equal(s->as.branch.cond->as.s, "bias");
    assert_int_equal(s->as.branch.then_body.count, 1);
    assert_int_equal(s->as.branch.else_body.count, 2);
    assert_int_equal(s->as.branch.else_body.items[0]->kind, AST_STMT_OUTPUT);
    assert_int_equal(s->as.branch.else_body.items[1]->kind, AST_STMT_DIM);
    s = b->items[14];
    assert_true(s->as.branch.cond->as.b);
    assert_int_equal(s->as.branch.then_body.count, 0);
    assert_int_equal(s->as.branch.else_body.count, 0);

    s = b->items[15];
    assert_int_equal(s->kind, AST_STMT_OUTPUT);
    assert_string_equal(s->as.output.name, "logits");
    assert_string_equal(s->as.output.value->as.call.name, "matmul");
    parsed_free(p);
}

/* ---- expressions --------------------------------------------------------- */

static void test_scalar_expressions(void **state) {
    (void)state;
    parsed *p = parse_body("{\"let\": \"x\", \"value\": 9223372036854775807}");
    assert_int_equal(let_value(p)->kind, AST_EXPR_INT);
    assert_true(let_value(p)->as.i == INT64_MAX);
    parsed_free(p);

    p = parse_body("{\"let\": \"x\", \"value\": -42}");
    assert_true(let_value(p)->as.i == -42);
    parsed_free(p);

    p = parse_body("{\"let\": \"x\", \"value\": 1.5e+6}");
    assert_int_equal(let_value(p)->kind, AST_EXPR_FLOAT);
    assert_true(let_value(p)->as.f == 1.5e6);
    parsed_free(p);

    p = parse_body("{\"let\": \"x\", \"value\": 1e-5}");
    assert_int_equal(let_value(p)->kind, AST_EXPR_FLOAT);
    assert_true(let_value(p)->as.f == 1e-5);
    parsed_free(p);

    p = parse_body("{\"let\": \"x\", \"value\": 1.0}");
    assert_int_equal(let_value(p)->kind, AST_EXPR_FLOAT); /* 1.0 is a float, not the int 1 */
    parsed_free(p);

    p = parse_body("{\"let\": \"x\", \"value\": true}");
    assert_int_equal(let_value(p)->kind, AST_EXPR_BOOL);
    assert_true(let_value(p)->as.b);
    parsed_free(p);

    p = parse_body("{\"let\": \"x\", \"value\": {\"str\": \"a\\\"b\\\\c\\nd\\te\"}}");
    assert_int_equal(let_value(p)->kind, AST_EXPR_STRING);
    assert_string_equal(let_value(p)->as.s, "a\"b\\c\nd\te");
    parsed_free(p);

    p = parse_body("{\"let\": \"x\", \"value\": {\"str\": \"\"}}"); /* empty literal is fine */
    assert_string_equal(let_value(p)->as.s, "");
    parsed_free(p);

    p = parse_body("{\"let\": \"x\", \"value\": \"%5\"}"); /* the IR dump's names */
    assert_int_equal(let_value(p)->kind, AST_EXPR_NAME);
    assert_string_equal(let_value(p)->as.s, "%5");
    parsed_free(p);
}

static void test_operators(void **state) {
    (void)state;
    static const struct {
        const char *text;
        ast_operator op;
    } binary[] = {{"*", AST_OP_MUL}, {"/", AST_OP_DIV}, {"%", AST_OP_MOD}, {"+", AST_OP_ADD},
                  {"-", AST_OP_SUB}, {"<", AST_OP_LT},  {"<=", AST_OP_LE}, {">", AST_OP_GT},
                  {">=", AST_OP_GE}, {"==", AST_OP_EQ}, {"!=", AST_OP_NE}, {"&&", AST_OP_AND},
                  {"||", AST_OP_OR}};
    for (size_t i = 0; i < sizeof binary / sizeof binary[0]; i++) {
        char body[128];
        snprintf(body, sizeof body, "{\"let\": \"x\", \"value\": {\"op\": \"%s\", \"args\": [\"a\", 2]}}",
                 binary[i].text);
        parsed *p = parse_body(body);
        const ast_expr *e = let_value(p);
        assert_int_equal(e->kind, AST_EXPR_BINARY);
        assert_int_equal(e->as.binary.op, binary[i].op);
        assert_string_equal(e->as.binary.lhs->as.s, "a");
        assert_int_equal(e->as.binary.rhs->as.i, 2);
        parsed_free(p);
    }
    parsed *p = parse_body("{\"let\": \"x\", \"value\": {\"op\": \"-\", \"args\": [\"a\"]}}");
    assert_int_equal(let_value(p)->kind, AST_EXPR_UNARY);
    assert_int_equal(let_value(p)->as.unary.op, AST_OP_NEG);
    assert_string_equal(let_value(p)->as.unary.operand->as.s, "a");
    parsed_free(p);

    p = parse_body(
        "{\"let\": \"x\", \"value\": {\"op\": \"!\", \"args\": [{\"op\": \"<\", \"args\": [1, 2]}]}}");
    assert_int_equal(let_value(p)->kind, AST_EXPR_UNARY);
    assert_int_equal(let_value(p)->as.unary.op, AST_OP_NOT);
    assert_int_equal(let_value(p)->as.unary.operand->as.binary.op, AST_OP_LT);
    parsed_free(p);
}

static void test_calls_and_lists(void **state) {
    (void)state;
    /* attributes become keyword arguments after the positional ones, in file order */
    parsed *p =
        parse_body("{\"let\": \"y\", \"value\": {\"call\": \"rope\", \"args\": [\"q\", \"pos\"],"
                   " \"attrs\": {\"theta\": 10000.0, \"style\": {\"str\": \"neox\"}, \"rotary_dim\": 0}}}");
    const ast_expr *e = let_value(p);
    assert_int_equal(e->kind, AST_EXPR_CALL);
    assert_string_equal(e->as.call.name, "rope");
    assert_int_equal(e->as.call.arg_count, 5);
    assert_null(e->as.call.args[0].keyword);
    assert_string_equal(e->as.call.args[0].value->as.s, "q");
    assert_null(e->as.call.args[1].keyword);
    assert_string_equal(e->as.call.args[2].keyword, "theta");
    assert_true(e->as.call.args[2].value->as.f == 10000.0);
    assert_string_equal(e->as.call.args[3].keyword, "style");
    assert_int_equal(e->as.call.args[3].value->kind, AST_EXPR_STRING);
    assert_string_equal(e->as.call.args[4].keyword, "rotary_dim");
    parsed_free(p);

    /* a call without args (const), calls nested in operators, nested lists */
    p = parse_body("{\"let\": \"c\", \"value\": {\"call\": \"const\", \"attrs\": {\"value\": 0.5}}}");
    e = let_value(p);
    assert_int_equal(e->as.call.arg_count, 1);
    assert_string_equal(e->as.call.args[0].keyword, "value");
    parsed_free(p);

    p = parse_body("{\"let\": \"s\", \"value\": {\"op\": \"/\", \"args\": [1.0, {\"call\": \"sqrt\", "
                   "\"args\": [\"d\"]}]}}");
    e = let_value(p);
    assert_int_equal(e->as.binary.op, AST_OP_DIV);
    assert_int_equal(e->as.binary.rhs->kind, AST_EXPR_CALL);
    assert_string_equal(e->as.binary.rhs->as.call.name, "sqrt");
    assert_int_equal(e->as.binary.rhs->as.call.arg_count, 1);
    parsed_free(p);

    p = parse_body("{\"let\": \"l\", \"value\": [1, [2, \"d\"], []]}");
    e = let_value(p);
    assert_int_equal(e->kind, AST_EXPR_LIST);
    assert_int_equal(e->as.list.count, 3);
    assert_int_equal(e->as.list.items[0]->as.i, 1);
    assert_int_equal(e->as.list.items[1]->kind, AST_EXPR_LIST);
    assert_string_equal(e->as.list.items[1]->as.list.items[1]->as.s, "d");
    assert_int_equal(e->as.list.items[2]->as.list.count, 0);
    parsed_free(p);
}

/* ---- locations ----------------------------------------------------------- */

static void assert_loc(smelt_loc loc, int32_t file, uint32_t line, uint32_t col) {
    assert_int_equal(loc.file, file);
    assert_int_equal(loc.line, line);
    assert_int_equal(loc.col, col);
}

static void test_locations_with_source(void **state) {
    (void)state;
    parsed *p = parse("{\"smelt\": 1, \"model\": \"m\", \"source\": \"examples/m.smelt\", \"body\": [\n"
                      " {\"let\": \"h\", \"loc\": [4, 5], \"value\": {\"call\": \"add\", \"args\": [\"a\","
                      "   {\"call\": \"silu\", \"args\": [\"b\"], \"loc\": [4, 17]}]}},\n"
                      " {\"dim\": \"t\", \"max\": 8},\n"
                      " {\"for\": \"l\", \"from\": 0, \"to\": 2, \"loc\": [7, 3], \"body\": [{\"let\": "
                      "\"x\", \"value\": \"h\"}]}\n"
                      "]}");
    assert_true(p->ok);
    int32_t source = diag_file_id(&p->d, "examples/m.smelt");
    int32_t json = diag_file_id(&p->d, "t.json");
    assert_int_not_equal(source, json);
    assert_string_equal(p->model.source_path, "examples/m.smelt");
    assert_int_equal(p->model.source_file, source);

    const ast_stmt *let = p->model.body.items[0];
    assert_loc(let->loc, source, 4, 5);
    assert_loc(let->as.let.name_locs[0], source, 4, 5);
    const ast_expr *add = let->as.let.value;
    assert_loc(add->loc, source, 4, 5); /* the call of a let takes the statement's loc */
    assert_loc(add->as.call.args[0].value->loc, source, 4, 5);
    const ast_expr *silu = add->as.call.args[1].value;
    assert_loc(silu->loc, source, 4, 17); /* its own */
    assert_loc(add->as.call.args[1].loc, source, 4, 17);
    assert_loc(silu->as.call.args[0].value->loc, source, 4, 17);

    assert_loc(p->model.body.items[1]->loc, json, 0, 0); /* no loc: the JSON file, line 0 */
    const ast_stmt *loop = p->model.body.items[2];
    assert_loc(loop->loc, source, 7, 3);
    assert_loc(loop->as.loop.body.items[0]->loc, source, 7, 3); /* inherited from the loop */
    parsed_free(p);
}

static void test_locations_without_source(void **state) {
    (void)state;
    parsed *p = parse_body("{\"output\": \"o\", \"value\": \"h\", \"loc\": [1, 40]}");
    assert_true(p->ok);
    int32_t json = diag_file_id(&p->d, "t.json");
    assert_string_equal(p->model.source_path, "t.json");
    assert_int_equal(p->model.source_file, json);
    assert_loc(p->model.body.items[0]->loc, json, 1, 40);
    parsed_free(p);
}

/* ---- structural errors --------------------------------------------------- */

static void test_unknown_key(void **state) {
    (void)state;
    parsed *p = parse_body("{\"let\": \"x\", \"value\": 1}, {\"let\": \"y\", \"valu\": 1}");
    assert_false(p->ok);
    assert_message(p, "t.json: error: /body/1: unknown key 'valu' in a 'let' statement "
                      "(expected 'let', 'value' or 'loc')");
    assert_message(p, "t.json: error: /body/1: missing key 'value' in a 'let' statement");
    assert_int_equal(p->d.error_count, 2);
    parsed_free(p);

    p = parse("{\"smelt\": 1, \"model\": \"m\", \"body\": [], \"extra\": 0}");
    assert_message(p, "t.json: error: top level: unknown key 'extra' in the document "
                      "(expected 'smelt', 'model', 'source' or 'body')");
    assert_int_equal(p->d.error_count, 1);
    parsed_free(p);

    p = parse_body("{\"let\": \"x\", \"value\": {\"call\": \"f\", \"arg\": [1]}}");
    assert_message(p, "t.json: error: /body/0/value: unknown key 'arg' in a call "
                      "(expected 'call', 'args', 'attrs' or 'loc')");
    parsed_free(p);
}

static void test_wrong_types(void **state) {
    (void)state;
    parsed *p = parse_body("{\"let\": \"x\", \"value\": {\"call\": \"f\", \"args\": [null, 1]}},"
                           "{\"dim\": 3, \"max\": 1},"
                           "{\"input\": \"i\", \"dtype\": \"i32\", \"shape\": \"tokens\"},"
                           "{\"for\": \"l\", \"from\": 0, \"to\": 1, \"body\": {}},"
                           "{\"let\": [], \"value\": 1},"
                           "{\"let\": \"x\", \"value\": {\"call\": \"f\", \"attrs\": [1]}},"
                           "{\"param\": \"p\", \"type\": 7}");
    assert_false(p->ok);
    assert_message(p, "t.json: error: /body/0/value/args/0: expected an expression, found null");
    assert_message(p,
                   "t.json: error: /body/1/dim: expected a dim name (a non-empty string), found an integer");
    assert_message(p, "t.json: error: /body/2/shape: expected a shape (an array), found a string");
    assert_message(p,
                   "t.json: error: /body/3/body: expected a block (an array of statements), found an object");
    assert_message(
        p, "t.json: error: /body/4/let: expected a name or a non-empty array of names, found an array");
    assert_message(p,
                   "t.json: error: /body/5/value/attrs: expected the attributes (an object), found an array");
    assert_message(p, "t.json: error: /body/6/type: expected a param type (\"int\", \"float\", \"bool\", "
                      "\"string\", \"object\" or \"list\"), found an integer");
    assert_int_equal(p->d.error_count, 7);
    parsed_free(p);

    p = parse("[1, 2]");
    assert_message(p, "t.json: error: top level: expected an object with the keys 'smelt', 'model' and "
                      "'body', found an array");
    parsed_free(p);

    p = parse("{\"smelt\": 1, \"model\": \"m\", \"body\": [7]}");
    assert_message(p, "t.json: error: /body/0: expected a statement (an object), found an integer");
    parsed_free(p);
}

static void test_bad_values(void **state) {
    (void)state;
    parsed *p = parse_body("{\"input\": \"i\", \"dtype\": \"i33\", \"shape\": []},"
                           "{\"param\": \"p\", \"type\": \"double\"},"
                           "{\"dim\": \"d\", \"max\": 1, \"loc\": [0, 1]},"
                           "{\"let\": \"x\", \"value\": {\"op\": \"+\", \"args\": [1]}},"
                           "{\"let\": \"x\", \"value\": {\"op\": \"**\", \"args\": [1, 2]}},"
                           "{\"let\": \"x\", \"value\": {\"call\": \"f\", \"op\": \"+\"}},"
                           "{\"let\": \"x\", \"output\": \"y\", \"value\": 1},"
                           "{\"let\": \"\", \"value\": 1},"
                           "{\"let\": \"x\", \"value\": {\"op\": \"-\", \"args\": [1, 2, 3]}},"
                           "{\"loc\": [1, 1]},"
                           "{\"let\": \"x\", \"value\": {\"call\": \"f\", \"attrs\": {\"a/b~c\": null}}},"
                           "{\"output\": \"o\", \"value\": \"h\", \"loc\": [1]}");
    assert_false(p->ok);
    assert_message(p, "t.json: error: /body/0/dtype: unknown dtype 'i33' (expected one of f32, f16, bf16, "
                      "f8e4m3, f8e5m2, i8, i4, i32, i64)");
    assert_message(p,
                   "t.json: error: /body/1/type: unknown param type 'double' (expected \"int\", \"float\", "
                   "\"bool\", \"string\", \"object\", \"list\" or \"list[T]\" with T a scalar type)");
    assert_message(p, "t.json: error: /body/2/loc: expected a location [line, column] with line >= 1 and "
                      "column >= 0, found [0, 1]");
    assert_message(p, "t.json: error: /body/3/value/args: operator '+' takes 2 operands, found 1");
    assert_message(p, "t.json: error: /body/4/value/op: unknown operator '**' (expected one of - ! * / % + < "
                      "<= > >= == != && || [])");
    assert_message(p, "t.json: error: /body/5/value: an expression has both 'op' and 'call'; expected "
                      "exactly one of 'str', 'op' or 'call'");
    assert_message(p, "t.json: error: /body/6: a statement has both 'let' and 'output' keys; expected "
                      "exactly one statement kind");
    assert_message(p, "t.json: error: /body/7/let: expected a name, found an empty string");
    assert_message(p, "t.json: error: /body/8/value/args: operator '-' takes 1 or 2 operands, found 3");
    assert_message(p, "t.json: error: /body/9: expected a statement: an object with one of the keys 'param', "
                      "'dim', 'input', 'weight', 'let', 'set', 'for', 'if', 'output', 'require' or 'ignore'");
    assert_message(p, "t.json: error: /body/10/value/attrs/a~1b~0c: expected an expression, found null");
    assert_message(p, "t.json: error: /body/11/loc: expected a location [line, column] (two integers), found "
                      "an array");
    assert_int_equal(p->d.error_count, 12);
    parsed_free(p);
}

static void test_missing_keys(void **state) {
    (void)state;
    parsed *p = parse("{\"smelt\": 1}");
    assert_false(p->ok);
    assert_message(p, "t.json: error: top level: missing key 'model' in the document");
    assert_message(p, "t.json: error: top level: missing key 'body' in the document");
    assert_int_equal(p->d.error_count, 2);
    parsed_free(p);

    p = parse("{\"model\": \"m\", \"body\": []}");
    assert_message(p,
                   "t.json: error: top level: missing key 'smelt' in the document (the format version, 1)");
    assert_int_equal(p->d.error_count, 1);
    parsed_free(p);

    p = parse_body("{\"dim\": \"t\"}, {\"weight\": \"w\", \"shape\": []}, {\"if\": true}");
    assert_message(p, "t.json: error: /body/0: missing key 'max' in a 'dim' statement");
    assert_message(p, "t.json: error: /body/1: missing key 'name' in a 'weight' statement");
    assert_message(p, "t.json: error: /body/2: missing key 'then' in an 'if' statement");
    assert_int_equal(p->d.error_count, 3);
    parsed_free(p);
}

static void test_bad_version(void **state) {
    (void)state;
    /* another version's keys mean other things: only the version is reported */
    parsed *p = parse("{\"smelt\": 2, \"model\": \"m\", \"body\": [{\"bogus\": 1}], \"x\": 1}");
    assert_false(p->ok);
    assert_message(p, "t.json: error: /smelt: unsupported format version 2 (expected 1)");
    parsed_free(p);

    p = parse("{\"smelt\": \"1\", \"model\": \"m\", \"body\": []}");
    assert_false(p->ok);
    assert_message(p, "t.json: error: /smelt: expected the format version (an integer), found a string");
    assert_int_equal(p->d.error_count, 1);
    parsed_free(p);
}

static void test_several_errors_all_reported(void **state) {
    (void)state;
    parsed *p =
        parse("{\"smelt\": 1, \"model\": 5, \"source\": \"\", \"body\": [\n"
              " {\"let\": \"x\", \"value\": 1, \"lok\": [1, 1]},\n"
              " {\"for\": \"l\", \"from\": 0, \"to\": 2, \"body\": [{\"dim\": \"d\", \"max\": null}]},\n"
              " {\"output\": \"o\"}\n"
              "]}");
    assert_false(p->ok);
    assert_message(p, "t.json: error: /source: expected a file path, found an empty string");
    assert_message(p, "t.json: error: /model: expected a model name (a non-empty string), found an integer");
    assert_message(
        p,
        "t.json: error: /body/0: unknown key 'lok' in a 'let' statement (expected 'let', 'value' or 'loc')");
    assert_message(p, "t.json: error: /body/1/body/0/max: expected an expression, found null");
    assert_message(p, "t.json: error: /body/2: missing key 'value' in an 'output' statement");
    assert_int_equal(p->d.error_count, 5);
    parsed_free(p);

    /* 30 bad statements: the diag engine stops itself after 20 */
    char body[30 * 16 + 1] = "";
    for (int i = 0; i < 30; i++)
        strcat(body, i ? ",{\"dim\": 1}" : "{\"dim\": 1}");
    p = parse_body(body);
    assert_false(p->ok);
    assert_int_equal(p->d.error_count, 20);
    assert_int_equal(count_of(p->messages, "too many errors"), 1);
    parsed_free(p);
}

/* ---- syntax errors and hostile input ------------------------------------- */

static void test_syntax_error_line_col(void **state) {
    (void)state;
    parsed *p = parse("{\n  \"smelt\": 1,\n  \"model\": x\n}");
    assert_false(p->ok);
    assert_message(p, "t.json:3:12: error: invalid JSON: invalid token near 'x'");
    assert_message(p, "    3 |   \"model\": x");
    assert_int_equal(p->d.error_count, 1);
    parsed_free(p);

    /* trailing garbage is refused */
    p = parse("{\"smelt\": 1, \"model\": \"m\", \"body\": []} x");
    assert_message(p, "t.json:1:40: error: invalid JSON: end of file expected near 'x'");
    parsed_free(p);

    /* integers past int64 are an overflow error, not a wrapped value */
    p = parse_body("{\"let\": \"x\", \"value\": 9223372036854775808}");
    assert_false(p->ok);
    assert_non_null(strstr(p->messages, "error: invalid JSON: too big integer"));
    parsed_free(p);

    /* columns count bytes: the é before the error is two bytes */
    p = parse("{\"smelt\": \"\xc3\xa9\", x}");
    assert_message(p, "t.json:1:17: error: invalid JSON: string or '}' expected near 'x'");
    parsed_free(p);
}

static void test_duplicate_key(void **state) {
    (void)state;
    parsed *p = parse("{\n  \"smelt\": 1,\n  \"smelt\": 1,\n  \"model\": \"m\", \"body\": []\n}");
    assert_false(p->ok);
    assert_message(p, "t.json:3:9: error: invalid JSON: duplicate object key near '\"smelt\"'");
    assert_int_equal(p->d.error_count, 1);
    parsed_free(p);

    p = parse_body("{\"let\": \"x\", \"value\": {\"call\": \"f\", \"attrs\": {\"a\": 1, \"a\": 2}}}");
    assert_false(p->ok);
    assert_non_null(strstr(p->messages, "duplicate"));
    parsed_free(p);
}

static void test_empty_and_garbage(void **state) {
    (void)state;
    static const char *const blanks[] = {"", " \n\t\r\n"};
    for (size_t i = 0; i < 2; i++) {
        parsed *p = parse(blanks[i]);
        assert_false(p->ok);
        assert_message(p, "t.json: error: empty input: expected a JSON object with the keys 'smelt', "
                          "'model' and 'body'");
        assert_int_equal(p->d.error_count, 1);
        parsed_free(p);
    }
    static const char garbage[] = "\x00\xff\xfe\x01\x7f garbage \x1b[31m";
    parsed *p = parse_bytes(garbage, sizeof garbage - 1);
    assert_false(p->ok);
    assert_int_equal(p->d.error_count, 1);
    assert_non_null(strstr(p->messages, "t.json:1:1: error: invalid JSON: "));
    /* the message line holds no raw control bytes (the escape sequence is shown as '?') */
    const char *line_end = strchr(p->messages, '\n');
    for (const char *c = p->messages; c < line_end; c++)
        assert_true((unsigned char)*c >= 0x20);
    parsed_free(p);

    p = parse("\"just a string\"");
    assert_message(p, "t.json: error: top level: expected an object with the keys 'smelt', 'model' and "
                      "'body', found a string");
    parsed_free(p);
}

/* `depth` nested copies of open ... close around `middle`. */
static char *nest(const char *prefix, const char *open, const char *middle, const char *close,
                  const char *suffix, size_t depth) {
    size_t n = strlen(prefix) + depth * (strlen(open) + strlen(close)) + strlen(middle) + strlen(suffix) + 1;
    char *text = malloc(n), *end = text;
    end += sprintf(end, "%s", prefix);
    for (size_t i = 0; i < depth; i++)
        end += sprintf(end, "%s", open);
    end += sprintf(end, "%s", middle);
    for (size_t i = 0; i < depth; i++)
        end += sprintf(end, "%s", close);
    sprintf(end, "%s", suffix);
    return text;
}

static void test_deep_nesting(void **state) {
    (void)state;
    /* deeper than jansson's own cap (2048): its clean syntax error */
    char *text = nest("", "[", "", "]", "", 10000);
    parsed *p = parse(text);
    assert_false(p->ok);
    assert_int_equal(p->d.error_count, 1);
    assert_non_null(strstr(p->messages, "invalid JSON: maximum parsing depth reached"));
    parsed_free(p);
    free(text);

    /* valid JSON, but expressions deeper than 256: one error, not one per level */
    text = nest("{\"smelt\": 1, \"model\": \"m\", \"body\": [{\"let\": \"x\", \"value\": ", "[", "1", "]",
                "}]}", 300);
    p = parse(text);
    assert_false(p->ok);
    assert_int_equal(p->d.error_count, 1);
    assert_non_null(strstr(p->messages, ": nesting deeper than 256 levels of statements and expressions\n"));
    parsed_free(p);
    free(text);

    /* 255 levels of list are fine */
    text = nest("{\"smelt\": 1, \"model\": \"m\", \"body\": [{\"let\": \"x\", \"value\": ", "[", "1", "]",
                "}]}", 250);
    p = parse(text);
    assert_true(p->ok);
    parsed_free(p);
    free(text);

    /* statements nested 300 deep through if blocks */
    text = nest("{\"smelt\": 1, \"model\": \"m\", \"body\": [", "{\"if\": true, \"then\": [", "", "]}", "]}",
                300);
    p = parse(text);
    assert_false(p->ok);
    assert_int_equal(p->d.error_count, 1);
    assert_non_null(strstr(p->messages, "nesting deeper than 256 levels"));
    parsed_free(p);
    free(text);

    /* operators and calls nested 1000 deep (jansson depth 2000) */
    text = nest("{\"smelt\": 1, \"model\": \"m\", \"body\": [{\"let\": \"x\", \"value\": ",
                "{\"op\": \"-\", \"args\": [", "1", "]}", "}]}", 1000);
    p = parse(text);
    assert_false(p->ok);
    assert_int_equal(p->d.error_count, 1);
    parsed_free(p);
    free(text);
}

static void test_huge_names(void **state) {
    (void)state;
    enum { MEGABYTE = 1024 * 1024 };
    char *name = malloc(MEGABYTE + 1);
    memset(name, 'k', MEGABYTE);
    name[MEGABYTE] = '\0';
    char *text = malloc(2 * MEGABYTE + 256);

    /* a 1 MB unknown key: the message cuts it */
    sprintf(text, "{\"smelt\": 1, \"model\": \"m\", \"body\": [{\"let\": \"x\", \"value\": 1, \"%s\": 0}]}",
            name);
    parsed *p = parse(text);
    assert_false(p->ok);
    assert_int_equal(p->d.error_count, 1);
    assert_true(strlen(p->messages) < 400);
    assert_non_null(strstr(p->messages, "unknown key 'kkkk"));
    assert_non_null(strstr(p->messages, "kkk...' in a 'let' statement"));
    parsed_free(p);

    /* a 1 MB attribute key with a bad value: the JSON pointer cuts it too */
    sprintf(text,
            "{\"smelt\": 1, \"model\": \"m\", \"body\": [{\"let\": \"x\", \"value\": "
            "{\"call\": \"f\", \"attrs\": {\"%s\": null}}}]}",
            name);
    p = parse(text);
    assert_int_equal(p->d.error_count, 1);
    assert_true(strlen(p->messages) < 400);
    parsed_free(p);

    /* a 1 MB name is a name: kept whole (the elaborator judges it) */
    sprintf(text, "{\"smelt\": 1, \"model\": \"m\", \"body\": [{\"let\": \"%s\", \"value\": 1}]}", name);
    p = parse(text);
    assert_true(p->ok);
    assert_int_equal(strlen(p->model.body.items[0]->as.let.names[0]), MEGABYTE);
    parsed_free(p);

    /* names with control characters are shown with '?' */
    p = parse_body("{\"let\": \"x\", \"value\": 1, \"a\\nb\\u001b\": 0}");
    assert_message(p, "t.json: error: /body/0: unknown key 'a?b?' in a 'let' statement "
                      "(expected 'let', 'value' or 'loc')");
    parsed_free(p);
    free(text);
    free(name);
}

/* ---- files --------------------------------------------------------------- */

static void test_files(void **state) {
    (void)state;
    char dir[] = "/tmp/smelt-json-XXXXXX";
    assert_non_null(mkdtemp(dir));
    char path[128];
    char *messages = NULL;
    size_t size = 0;
    FILE *out = open_memstream(&messages, &size);
    diag_engine d;
    diag_init(&d, out);
    ast_model model;

    snprintf(path, sizeof path, "%s/ok.json", dir);
    FILE *f = fopen(path, "w");
    fputs(
        "{\"smelt\": 1, \"model\": \"file\",\n \"body\": [{\"dim\": \"t\", \"max\": 4, \"loc\": [2, 3]}]}\n",
        f);
    fclose(f);
    assert_true(fe_parse_json(path, &d, &model));
    assert_string_equal(model.name, "file");
    assert_string_equal(model.source_path, path);
    assert_int_equal(model.body.items[0]->loc.file, diag_file_id(&d, path));
    ast_model_free(&model);

    /* a syntax error in a file shows the line from disk under the message */
    f = fopen(path, "w");
    fputs("{\"smelt\": 1,\n \"model\": ]}\n", f);
    fclose(f);
    char wanted[256];
    assert_false(fe_parse_json(path, &d, &model));
    ast_model_free(&model);
    fflush(out);
    snprintf(wanted, sizeof wanted,
             "%s:2:11: error: invalid JSON: unexpected token near ']'\n    2 |  \"model\": ]}\n", path);
    assert_non_null(strstr(messages, wanted));

    snprintf(path, sizeof path, "%s/missing.json", dir);
    assert_false(fe_parse_json(path, &d, &model));
    ast_model_free(&model);
    fflush(out);
    snprintf(wanted, sizeof wanted, "%s: error: cannot open the file: No such file or directory\n", path);
    assert_non_null(strstr(messages, wanted));

    assert_false(fe_parse_json(dir, &d, &model)); /* a directory */
    ast_model_free(&model);
    fflush(out);
    snprintf(wanted, sizeof wanted, "%s: error: cannot read the file: Is a directory\n", dir);
    assert_non_null(strstr(messages, wanted));

    /* over 64 MiB is refused before reading (a sparse file costs no disk) */
    snprintf(path, sizeof path, "%s/big.json", dir);
    f = fopen(path, "w");
    assert_int_equal(ftruncate(fileno(f), 65 * 1024 * 1024), 0);
    fclose(f);
    assert_false(fe_parse_json(path, &d, &model));
    ast_model_free(&model);
    fflush(out);
    snprintf(wanted, sizeof wanted,
             "%s: error: file too large: 68157440 bytes, the limit for a JSON model is 64 MiB\n", path);
    assert_non_null(strstr(messages, wanted));
    unlink(path);

    snprintf(path, sizeof path, "%s/ok.json", dir);
    unlink(path);
    rmdir(dir);
    assert_int_equal(d.error_count, 4);
    diag_free(&d);
    fclose(out);
    free(messages);
}

/* ---- ir_print_json ------------------------------------------------------- */

static void set_type(ir_module *m, uint32_t op, smelt_dtype dtype, uint8_t rank, const ir_dim *dims) {
    ir_type *t = &m->values[ir_op_result(m, op, 0)].type;
    t->dtype = dtype;
    t->rank = rank;
    for (uint8_t i = 0; i < rank; i++)
        t->dims[i] = dims[i];
}

/* A small module exercising every kind of statement and attribute:
 *   %0 = input ids: i32[tokens]             %5 = const 1/3
 *   %1 = weight embed: f32[97, 64]          %6 = matmul(%3, %1)            (layout default)
 *   %2 = weight w1: bf16[4, 8, 64] stacked  %7 = matmul(%3, %1) in_out
 *   %3, %4 = split(%2...)                   %8 = reshape(%6) [tokens, 4, 16]
 *   (a dead op)                             %9 = transpose(%8) [1, 0, 2]
 *   %10 = gelu(%9) tanh                     %11 = rope(%10, ids) theta 1e4
 *   output logits = %7                      %12 = embedding(%1, ids) (loc elsewhere)
 */
static void build_module(ir_module *m, bool with_source) {
    ir_module_init(m, "tiny");
    if (with_source) {
        m->source_path = "tiny.smelt";
        m->source_file = 0;
    }
    ir_add_param(m, "hidden_size", IR_PARAM_INT)->value.i = 64;
    ir_add_param(m, "rms_norm_eps", IR_PARAM_FLOAT)->value.f = 1e-5;
    ir_add_param(m, "model_type", IR_PARAM_STRING)->value.s = "llama \"3\"";
    ir_add_param(m, "attention_bias", IR_PARAM_BOOL)->value.b = true;
    int32_t tokens = ir_add_symbol(m, "tokens", 8192, (smelt_loc){0, 3, 3});
    smelt_loc here = {0, 14, 3};

    uint32_t ids = ir_append_op(m, IR_OP_INPUT, NULL, 0, UINT32_MAX, here);
    ir_op_set_string(m, ids, "name", "ids");
    set_type(m, ids, SMELT_DTYPE_I32, 1, (ir_dim[]){ir_dim_symbol(tokens)});
    ir_value_id ids_v = ir_op_result(m, ids, 0);

    uint32_t embed = ir_append_op(m, IR_OP_WEIGHT, NULL, 0, UINT32_MAX, (smelt_loc){0, 16, 3});
    ir_op_set_string(m, embed, "name", "model.embed_tokens.weight");
    ir_op_fill_defaults(m, embed); /* stack = "": not written */
    set_type(m, embed, SMELT_DTYPE_F32, 2, (ir_dim[]){ir_dim_const(97), ir_dim_const(64)});
    ir_value_id embed_v = ir_op_result(m, embed, 0);

    uint32_t w1 = ir_append_op(m, IR_OP_WEIGHT, NULL, 0, UINT32_MAX, (smelt_loc){0, 17, 0});
    ir_op_set_string(m, w1, "name", "m.experts.{e}.w1.weight");
    ir_op_set_string(m, w1, "stack", "e");
    set_type(m, w1, SMELT_DTYPE_BF16, 3, (ir_dim[]){ir_dim_const(4), ir_dim_const(8), ir_dim_const(64)});

    uint32_t split =
        ir_append_op(m, IR_OP_SPLIT, (ir_value_id[]){ir_op_result(m, w1, 0)}, 1, 2, SMELT_NO_LOC);
    ir_op_set_int(m, split, "axis", 1);
    ir_op_set_attr(m, split, "sizes", &(ir_attr){.kind = IR_ATTR_INTS, .as.ints = {2, (int64_t[]){32, 32}}});

    uint32_t dead = ir_append_op(m, IR_OP_SILU, (ir_value_id[]){embed_v}, 1, UINT32_MAX, SMELT_NO_LOC);
    m->ops[dead].dead = true;

    uint32_t third = ir_append_op(m, IR_OP_CONST, NULL, 0, UINT32_MAX, SMELT_NO_LOC);
    ir_op_set_float(m, third, "value", 1.0 / 3.0);

    ir_value_id x = ir_op_result(m, split, 0);
    uint32_t mm =
        ir_append_op(m, IR_OP_MATMUL, (ir_value_id[]){x, embed_v}, 2, UINT32_MAX, (smelt_loc){0, 20, 11});
    ir_op_fill_defaults(m, mm);
    uint32_t mm2 = ir_append_op(m, IR_OP_MATMUL, (ir_value_id[]){x, embed_v}, 2, UINT32_MAX, SMELT_NO_LOC);
    ir_op_set_string(m, mm2, "layout", "in_out");

    uint32_t reshape =
        ir_append_op(m, IR_OP_RESHAPE, (ir_value_id[]){ir_op_result(m, mm, 0)}, 1, UINT32_MAX, SMELT_NO_LOC);
    ir_op_set_attr(
        m, reshape, "shape",
        &(ir_attr){.kind = IR_ATTR_SHAPE,
                   .as.shape = {3, (ir_dim[]){ir_dim_symbol(tokens), ir_dim_const(4), ir_dim_const(16)}}});
    uint32_t transpose = ir_append_op(m, IR_OP_TRANSPOSE, (ir_value_id[]){ir_op_result(m, reshape, 0)}, 1,
                                      UINT32_MAX, SMELT_NO_LOC);
    ir_op_set_attr(m, transpose, "perm",
                   &(ir_attr){.kind = IR_ATTR_INTS, .as.ints = {3, (int64_t[]){1, 0, 2}}});
    uint32_t gelu = ir_append_op(m, IR_OP_GELU, (ir_value_id[]){ir_op_result(m, transpose, 0)}, 1, UINT32_MAX,
                                 SMELT_NO_LOC);
    ir_op_set_string(m, gelu, "approximate", "tanh");
    uint32_t rope = ir_append_op(m, IR_OP_ROPE, (ir_value_id[]){ir_op_result(m, gelu, 0), ids_v}, 2,
                                 UINT32_MAX, SMELT_NO_LOC);
    ir_op_set_float(m, rope, "theta", 10000.0);
    ir_op_fill_defaults(m, rope);
    ir_op_set_int(m, rope, "rotary_dim", 32); /* not the default 0: written */

    uint32_t out = ir_append_op(m, IR_OP_OUTPUT, (ir_value_id[]){ir_op_result(m, mm2, 0)}, 1, UINT32_MAX,
                                (smelt_loc){0, 40, 3});
    ir_op_set_string(m, out, "name", "logits");
    ir_append_op(m, IR_OP_EMBEDDING, (ir_value_id[]){embed_v, ids_v}, 2, UINT32_MAX, (smelt_loc){3, 9, 9});
}

static char *print_json(const ir_module *m) {
    char *text = NULL;
    size_t size = 0;
    FILE *out = open_memstream(&text, &size);
    ir_print_json(m, out);
    fclose(out);
    return text;
}

static void test_print_json_text(void **state) {
    (void)state;
    ir_module m;
    build_module(&m, true);
    char *text = print_json(&m);
    static const char *const expected =
        "{\n"
        "  \"smelt\": 1,\n"
        "  \"model\": \"tiny\",\n"
        "  \"source\": \"tiny.smelt\",\n"
        "  \"body\": [\n"
        "    {\"param\": \"hidden_size\", \"type\": \"int\", \"default\": 64},\n"
        "    {\"param\": \"rms_norm_eps\", \"type\": \"float\", \"default\": 1e-05},\n"
        "    {\"param\": \"model_type\", \"type\": \"string\", \"default\": {\"str\": \"llama "
        "\\\"3\\\"\"}},\n"
        "    {\"param\": \"attention_bias\", \"type\": \"bool\", \"default\": true},\n"
        "    {\"dim\": \"tokens\", \"max\": 8192},\n"
        "    {\"input\": \"ids\", \"dtype\": \"i32\", \"shape\": [\"tokens\"], \"loc\": [14, 3]},\n"
        "    {\"weight\": \"%1\", \"dtype\": \"f32\", \"shape\": [97, 64], \"name\": "
        "\"model.embed_tokens.weight\", "
        "\"loc\": [16, 3]},\n"
        "    {\"weight\": \"%2\", \"dtype\": \"bf16\", \"shape\": [4, 8, 64], \"name\": "
        "\"m.experts.{e}.w1.weight\", "
        "\"stacked\": \"e\", \"loc\": [17, 0]},\n"
        "    {\"let\": [\"%3\", \"%4\"], \"value\": {\"call\": \"split\", \"args\": [\"%2\"], \"attrs\": "
        "{\"axis\": 1, "
        "\"sizes\": [32, 32]}}},\n"
        "    {\"let\": \"%5\", \"value\": {\"call\": \"const\", \"attrs\": {\"value\": "
        "0.3333333333333333}}},\n"
        "    {\"let\": \"%6\", \"value\": {\"call\": \"matmul\", \"args\": [\"%3\", \"%1\"], \"loc\": [20, "
        "11]}},\n"
        "    {\"let\": \"%7\", \"value\": {\"call\": \"matmul\", \"args\": [\"%3\", \"%1\"], \"attrs\": "
        "{\"layout\": "
        "{\"str\": \"in_out\"}}}},\n"
        "    {\"let\": \"%8\", \"value\": {\"call\": \"reshape\", \"args\": [\"%6\"], \"attrs\": {\"shape\": "
        "[\"tokens\", 4, 16]}}},\n"
        "    {\"let\": \"%9\", \"value\": {\"call\": \"transpose\", \"args\": [\"%8\"], \"attrs\": "
        "{\"perm\": [1, 0, 2]}}},\n"
        "    {\"let\": \"%10\", \"value\": {\"call\": \"gelu\", \"args\": [\"%9\"], \"attrs\": "
        "{\"approximate\": "
        "{\"str\": \"tanh\"}}}},\n"
        "    {\"let\": \"%11\", \"value\": {\"call\": \"rope\", \"args\": [\"%10\", \"ids\"], \"attrs\": "
        "{\"theta\": "
        "10000.0, \"rotary_dim\": 32}}},\n"
        "    {\"output\": \"logits\", \"value\": \"%7\", \"loc\": [40, 3]},\n"
        "    {\"let\": \"%12\", \"value\": {\"call\": \"embedding\", \"args\": [\"%1\", \"ids\"]}}\n"
        "  ]\n"
        "}\n";
    if (strcmp(text, expected) != 0) fprintf(stderr, "got:\n%s", text);
    assert_string_equal(text, expected);
    free(text);
    ir_module_free(&m);
}

static void test_print_json_parses_back(void **state) {
    (void)state;
    ir_module m;
    build_module(&m, true);
    char *text = print_json(&m);

    /* jansson: the numbers come back exactly and with the right JSON types */
    json_error_t error;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &error);
    assert_non_null(root);
    assert_int_equal(json_integer_value(json_object_get(root, "smelt")), 1);
    json_t *body = json_object_get(root, "body");
    assert_int_equal(json_array_size(body), 18);
    json_t *eps = json_object_get(json_array_get(body, 1), "default");
    assert_true(json_is_real(eps));
    assert_true(json_real_value(eps) == 1e-5);
    json_t *third =
        json_object_get(json_object_get(json_object_get(json_array_get(body, 9), "value"), "attrs"), "value");
    assert_true(json_is_real(third));
    assert_true(json_real_value(third) == 1.0 / 3.0);
    json_t *theta = json_object_get(
        json_object_get(json_object_get(json_array_get(body, 15), "value"), "attrs"), "theta");
    assert_true(json_is_real(theta)); /* 10000.0: a real, not the integer 10000 */
    json_decref(root);

    /* the reader: the same program, located in the source file */
    parsed *p = parse(text);
    assert_true(p->ok);
    assert_string_equal(p->model.name, "tiny");
    assert_string_equal(p->model.source_path, "tiny.smelt");
    int32_t source = diag_file_id(&p->d, "tiny.smelt");
    const ast_block *b = &p->model.body;
    assert_int_equal(b->count, 18);
    assert_int_equal(b->items[0]->kind, AST_STMT_PARAM);
    assert_int_equal(b->items[2]->as.param.default_value->kind, AST_EXPR_STRING);
    assert_string_equal(b->items[2]->as.param.default_value->as.s, "llama \"3\"");
    assert_int_equal(b->items[4]->kind, AST_STMT_DIM);
    assert_int_equal(b->items[5]->kind, AST_STMT_INPUT);
    assert_loc(b->items[5]->loc, source, 14, 3);
    assert_int_equal(b->items[7]->kind, AST_STMT_WEIGHT);
    assert_string_equal(b->items[7]->as.weight.name, "%2");
    assert_string_equal(b->items[7]->as.weight.stack_var, "e");
    const ast_stmt *split = b->items[8];
    assert_int_equal(split->as.let.name_count, 2);
    assert_string_equal(split->as.let.names[1], "%4");
    const ast_expr *mm = b->items[10]->as.let.value;
    assert_string_equal(mm->as.call.name, "matmul");
    assert_loc(mm->loc, source, 20, 11);
    const ast_expr *reshape = b->items[12]->as.let.value;
    assert_string_equal(reshape->as.call.args[1].keyword, "shape");
    assert_string_equal(reshape->as.call.args[1].value->as.list.items[0]->as.s, "tokens");
    assert_int_equal(b->items[16]->kind, AST_STMT_OUTPUT);
    assert_string_equal(b->items[16]->as.output.value->as.s, "%7");
    assert_loc(b->items[16]->loc, source, 40, 3);
    parsed_free(p);
    free(text);
    ir_module_free(&m);
}

static void test_print_json_without_source(void **state) {
    (void)state;
    ir_module m;
    build_module(&m, false);
    char *text = print_json(&m);
    assert_null(strstr(text, "\"source\""));
    assert_null(strstr(text, "\"loc\"")); /* op locations name no known file */
    parsed *p = parse(text);
    assert_true(p->ok);
    parsed_free(p);
    free(text);
    ir_module_free(&m);

    ir_module_init(&m, "empty");
    text = print_json(&m);
    assert_string_equal(text, "{\n  \"smelt\": 1,\n  \"model\": \"empty\",\n  \"body\": []\n}\n");
    p = parse(text);
    assert_true(p->ok);
    assert_int_equal(p->model.body.count, 0);
    parsed_free(p);
    free(text);
    ir_module_free(&m);
}

static void test_print_json_strings_and_floats(void **state) {
    (void)state;
    ir_module m;
    ir_module_init(&m, "q\"uote");
    /* quote, backslash, newline, a control byte, valid UTF-8 and a stray byte */
    const char *hf_name = "a\"b\\c\nd\x01\xc3\xa9\xff";
    uint32_t w = ir_append_op(&m, IR_OP_WEIGHT, NULL, 0, UINT32_MAX, SMELT_NO_LOC);
    ir_op_set_string(&m, w, "name", hf_name);
    m.values[ir_op_result(&m, w, 0)].type = (ir_type){.dtype = SMELT_DTYPE_F32};
    static const double values[] = {0.1, -0.0, 1e300, 5e-324, INFINITY, -INFINITY, NAN, 2.0};
    for (size_t i = 0; i < sizeof values / sizeof values[0]; i++) {
        uint32_t c = ir_append_op(&m, IR_OP_CONST, NULL, 0, UINT32_MAX, SMELT_NO_LOC);
        ir_op_set_float(&m, c, "value", values[i]);
    }
    char *text = print_json(&m);
    json_error_t error;
    json_t *root = json_loads(text, JSON_REJECT_DUPLICATES, &error);
    if (!root) print_error("%s at %d:%d in\n%s", error.text, error.line, error.column, text);
    assert_non_null(root);
    assert_string_equal(json_string_value(json_object_get(root, "model")), "q\"uote");
    json_t *body = json_object_get(root, "body");
    assert_string_equal(json_string_value(json_object_get(json_array_get(body, 0), "name")),
                        "a\"b\\c\nd\x01\xc3\xa9\xef\xbf\xbd"); /* the stray byte became U+FFFD */
    for (size_t i = 0; i < 4; i++) {
        json_t *v = json_object_get(
            json_object_get(json_object_get(json_array_get(body, 1 + i), "value"), "attrs"), "value");
        assert_true(json_is_real(v));
        assert_memory_equal(&(double){json_real_value(v)}, &values[i], sizeof(double)); /* bit for bit */
    }
    json_t *last =
        json_object_get(json_object_get(json_object_get(json_array_get(body, 8), "value"), "attrs"), "value");
    assert_true(json_is_real(last) && json_real_value(last) == 2.0);
    json_decref(root);
    /* infinities and NaN are written as expressions, which the reader accepts */
    assert_non_null(strstr(text, "{\"value\": {\"op\": \"/\", \"args\": [1.0, 0.0]}}"));
    assert_non_null(
        strstr(text, "{\"value\": {\"op\": \"-\", \"args\": [{\"op\": \"/\", \"args\": [1.0, 0.0]}]}}"));
    assert_non_null(strstr(text, "{\"value\": {\"op\": \"/\", \"args\": [0.0, 0.0]}}"));
    parsed *p = parse(text);
    assert_true(p->ok);
    const ast_expr *inf = p->model.body.items[5]->as.let.value->as.call.args[0].value;
    assert_int_equal(inf->kind, AST_EXPR_BINARY);
    assert_int_equal(inf->as.binary.op, AST_OP_DIV);
    parsed_free(p);
    free(text);
    ir_module_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_every_statement_form),
        cmocka_unit_test(test_scalar_expressions),
        cmocka_unit_test(test_operators),
        cmocka_unit_test(test_calls_and_lists),
        cmocka_unit_test(test_locations_with_source),
        cmocka_unit_test(test_locations_without_source),
        cmocka_unit_test(test_unknown_key),
        cmocka_unit_test(test_wrong_types),
        cmocka_unit_test(test_bad_values),
        cmocka_unit_test(test_missing_keys),
        cmocka_unit_test(test_bad_version),
        cmocka_unit_test(test_several_errors_all_reported),
        cmocka_unit_test(test_syntax_error_line_col),
        cmocka_unit_test(test_duplicate_key),
        cmocka_unit_test(test_empty_and_garbage),
        cmocka_unit_test(test_deep_nesting),
        cmocka_unit_test(test_huge_names),
        cmocka_unit_test(test_files),
        cmocka_unit_test(test_print_json_text),
        cmocka_unit_test(test_print_json_parses_back),
        cmocka_unit_test(test_print_json_without_source),
        cmocka_unit_test(test_print_json_strings_and_floats),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
