/* test_ir_text.c - the text IR printer and parser, and the Graphviz dump.
 *
 * Modules built by hand print to text written out here by hand; printing,
 * parsing and printing again gives the same bytes; hand-written text parses
 * into the expected module fields; every parse error comes with its message
 * at its line:col; hostile input (garbage, NUL bytes, megabyte names, deep
 * brackets, huge numbers) is refused cleanly.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "ir_io.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- helpers ---------------------------------------------------------------- */

typedef struct capture {
    FILE *stream;
    char *text;
    size_t length;
} capture;

static void capture_open(capture *c) {
    c->text = NULL;
    c->length = 0;
    c->stream = open_memstream(&c->text, &c->length);
    assert_non_null(c->stream);
}

/* Closes the stream; c->text stays valid until capture_free. */
static const char *capture_close(capture *c) {
    fclose(c->stream);
    c->stream = NULL;
    return c->text;
}

static void capture_free(capture *c) {
    if (c->stream) fclose(c->stream);
    free(c->text);
}

static char *print_module(const ir_module *m) {
    capture c;
    capture_open(&c);
    ir_print_text(m, c.stream);
    capture_close(&c);
    return c.text;
}

static char *print_dot(const ir_module *m) {
    capture c;
    capture_open(&c);
    ir_print_dot(m, c.stream);
    capture_close(&c);
    return c.text;
}

/* Parses `length` bytes as "t.ir"; the diagnostics land in *messages
 * (caller frees). */
static bool parse_bytes(const char *text, size_t length, ir_module *m, char **messages) {
    capture c;
    capture_open(&c);
    diag_engine d;
    diag_init(&d, c.stream);
    bool ok = ir_parse_text("t.ir", text, length, &d, m);
    diag_free(&d);
    capture_close(&c);
    *messages = c.text;
    return ok;
}

static bool parse(const char *text, ir_module *m, char **messages) {
    return parse_bytes(text, strlen(text), m, messages);
}

/* Text must parse without a message and print back as itself. */
static void assert_round_trip(const char *text) {
    ir_module m;
    char *messages;
    bool ok = parse(text, &m, &messages);
    if (!ok) print_message("unexpected errors:\n%s", messages);
    assert_true(ok);
    assert_string_equal(messages, "");
    char *printed = print_module(&m);
    assert_string_equal(printed, text);
    free(printed);
    free(messages);
    ir_module_free(&m);
}

/* Text must fail to parse with `message` among the diagnostics. */
static void assert_parse_error_bytes(const char *text, size_t length, const char *message) {
    ir_module m;
    char *messages;
    bool ok = parse_bytes(text, length, &m, &messages);
    if (ok || !strstr(messages, message)) print_message("expected: %s\ngot:\n%s", message, messages);
    assert_false(ok);
    assert_non_null(strstr(messages, message));
    free(messages);
    ir_module_free(&m); /* freed by the parser already; freeing twice is fine */
}

static void assert_parse_error(const char *text, const char *message) {
    assert_parse_error_bytes(text, strlen(text), message);
}

static unsigned count_errors(const char *messages) {
    unsigned n = 0;
    for (const char *p = messages; (p = strstr(p, ": error: ")) != NULL; p++)
        n++;
    return n;
}

static smelt_loc at(int32_t file, uint32_t line, uint32_t col) { return (smelt_loc){file, line, col}; }

static ir_type type_of(smelt_dtype dtype, unsigned rank, const ir_dim *dims) {
    ir_type t = {.dtype = dtype, .rank = (uint8_t)rank};
    for (unsigned i = 0; i < rank; i++)
        t.dims[i] = dims[i];
    return t;
}

/* ---- ir_format_float ------------------------------------------------------ */

static void check_float(double v, const char *expected) {
    char buffer[32];
    const char *text = ir_format_float(v, buffer, sizeof buffer);
    assert_ptr_equal(text, buffer);
    assert_string_equal(text, expected);
    if (!isnan(v)) {
        double back = strtod(text, NULL);
        assert_memory_equal(&back, &v, sizeof v); /* bit for bit, -0.0 included */
    }
}

static void test_format_float(void **state) {
    (void)state;
    check_float(0.1, "0.1");
    check_float(1e-05, "1e-05");
    check_float(10000.0, "10000.0"); /* plain decimals where they stay short */
    check_float(1.0 / 3.0, "0.3333333333333333");
    check_float(1.0, "1.0");
    check_float(0.0, "0.0");
    check_float(-0.0, "-0.0");
    check_float(-2.5, "-2.5");
    check_float(123456789.0, "123456789.0");
    check_float(0.125, "0.125");
    check_float(1e300, "1e+300");
    check_float(5e-324, "5e-324");
    check_float(0.1 + 0.2, "0.30000000000000004");
    check_float(INFINITY, "inf");
    check_float(-INFINITY, "-inf");
    check_float(NAN, "nan");
    /* Every finite double reads back exactly: a deterministic sweep of bit patterns. */
    uint64_t x = 0x9e3779b97f4a7c15u;
    for (int i = 0; i < 20000; i++) {
        x ^= x << 13, x ^= x >> 7, x ^= x << 17;
        double v;
        memcpy(&v, &x, sizeof v);
        if (!isfinite(v)) continue;
        char buffer[32];
        double back = strtod(ir_format_float(v, buffer, sizeof buffer), NULL);
        assert_memory_equal(&back, &v, sizeof v);
    }
    /* A small buffer is cut, never overrun. */
    char tiny[4];
    assert_string_equal(ir_format_float(1.0 / 3.0, tiny, sizeof tiny), "0.3");
}

/* ---- printing a hand-built module --------------------------------------------- */

/* The module behind `expected_tiny`. Value ids are not contiguous in print
 * order: a dead op sits in the middle and must not be numbered. */
static void build_tiny(ir_module *m, diag_engine *d) {
    ir_module_init(m, "tiny");
    m->source_path = arena_strdup(&m->arena, "examples/tiny.smelt");
    m->source_file = diag_file_id(d, "examples/tiny.smelt");
    int32_t src = m->source_file, other = diag_file_id(d, "other.smelt");

    ir_add_param(m, "hidden_size", IR_PARAM_INT)->value.i = 64;
    ir_add_param(m, "rms_norm_eps", IR_PARAM_FLOAT)->value.f = 1e-5;
    ir_add_param(m, "attention_bias", IR_PARAM_BOOL)->value.b = false;
    ir_add_param(m, "model_type", IR_PARAM_STRING)->value.s = "l\"q\\\n\t\x01\x7f\xc3\xa9";
    ir_add_param(m, "min", IR_PARAM_INT)->value.i = INT64_MIN;
    int32_t tokens = ir_add_symbol(m, "tokens", 8192, at(src, 3, 3));
    ir_add_symbol(m, "my dim", 4, at(src, 4, 3));
    ir_dim T = ir_dim_symbol(tokens);

    uint32_t ids = ir_append_op(m, IR_OP_INPUT, NULL, 0, UINT32_MAX, at(src, 14, 3));
    ir_op_set_string(m, ids, "name", "ids");
    m->values[ir_op_result(m, ids, 0)].type = type_of(SMELT_DTYPE_I32, 1, (ir_dim[]){T});

    uint32_t embed = ir_append_op(m, IR_OP_WEIGHT, NULL, 0, UINT32_MAX, at(src, 16, 3));
    ir_op_set_string(m, embed, "name", "model.embed_tokens.weight");
    ir_op_fill_defaults(m, embed); /* stack = "" is the default: not printed */
    m->values[ir_op_result(m, embed, 0)].type =
        type_of(SMELT_DTYPE_F32, 2, (ir_dim[]){ir_dim_const(97), ir_dim_const(64)});

    ir_value_id operands[4] = {ir_op_result(m, embed, 0), ir_op_result(m, ids, 0)};
    uint32_t h = ir_append_op(m, IR_OP_EMBEDDING, operands, 2, UINT32_MAX, at(src, 17, 11));
    m->values[ir_op_result(m, h, 0)].type = type_of(SMELT_DTYPE_F32, 2, (ir_dim[]){T, ir_dim_const(64)});

    operands[0] = ir_op_result(m, h, 0);
    uint32_t dead = ir_append_op(m, IR_OP_SILU, operands, 1, UINT32_MAX, at(src, 18, 1));
    m->ops[dead].dead = true;

    uint32_t split = ir_append_op(m, IR_OP_SPLIT, operands, 1, 2, at(other, 20, 9));
    ir_op_set_int(m, split, "axis", 1);
    ir_op_set_attr(m, split, "sizes", &(ir_attr){.kind = IR_ATTR_INTS, .as.ints = {2, (int64_t[]){32, 32}}});
    for (uint32_t r = 0; r < 2; r++)
        m->values[ir_op_result(m, split, r)].type =
            type_of(SMELT_DTYPE_F32, 2, (ir_dim[]){T, ir_dim_const(32)});

    uint32_t w = ir_append_op(m, IR_OP_WEIGHT, NULL, 0, UINT32_MAX, SMELT_NO_LOC);
    ir_op_set_string(m, w, "name", "model.layers.{e}.w");
    ir_op_set_string(m, w, "stack", "e");
    m->values[ir_op_result(m, w, 0)].type =
        type_of(SMELT_DTYPE_BF16, 3, (ir_dim[]){ir_dim_const(4), ir_dim_const(32), ir_dim_const(32)});

    operands[0] = ir_op_result(m, split, 1);
    operands[1] = ir_op_result(m, w, 0);
    uint32_t mm = ir_append_op(m, IR_OP_MATMUL, operands, 2, UINT32_MAX, at(src, 21, 5));
    ir_op_fill_defaults(m, mm); /* layout = "out_in": not printed; type left unknown */

    operands[0] = ir_op_result(m, mm, 0);
    uint32_t shaped = ir_append_op(m, IR_OP_RESHAPE, operands, 1, UINT32_MAX, at(src, 22, 0));
    ir_op_set_attr(
        m, shaped, "shape",
        &(ir_attr){.kind = IR_ATTR_SHAPE,
                   .as.shape = {4, (ir_dim[]){T, ir_dim_symbol(1), ir_dim_const(8), ir_dim_const(1)}}});

    uint32_t scale = ir_append_op(m, IR_OP_CONST, NULL, 0, UINT32_MAX, at(src, 0, 0));
    ir_op_set_float(m, scale, "value", 0.125);
    m->values[ir_op_result(m, scale, 0)].type = type_of(SMELT_DTYPE_F32, 0, NULL);

    operands[0] = ir_op_result(m, shaped, 0);
    uint32_t sm = ir_append_op(m, IR_OP_SOFTMAX, operands, 1, UINT32_MAX, at(src, 23, 7));
    ir_op_fill_defaults(m, sm); /* axis = -1: not printed */

    operands[0] = ir_op_result(m, sm, 0);
    operands[1] = ir_op_result(m, ids, 0);
    uint32_t rope = ir_append_op(m, IR_OP_ROPE, operands, 2, UINT32_MAX, at(src, 24, 7));
    ir_op_set_float(m, rope, "theta", 10000.0);
    ir_op_set_string(m, rope, "style", "interleaved");
    ir_op_set_int(m, rope, "rotary_dim", 0);

    operands[0] = operands[1] = operands[2] = ir_op_result(m, rope, 0);
    operands[3] = ir_op_result(m, ids, 0);
    uint32_t attn = ir_append_op(m, IR_OP_ATTENTION, operands, 4, UINT32_MAX, at(src, 25, 7));
    ir_op_set_float(m, attn, "scale", 0.125);
    ir_op_set_bool(m, attn, "causal", false);
    ir_op_set_int(m, attn, "max_seq", 8192);
    ir_op_fill_defaults(m, attn); /* window = 0: not printed */

    operands[0] = ir_op_result(m, attn, 0);
    uint32_t tr = ir_append_op(m, IR_OP_TRANSPOSE, operands, 1, UINT32_MAX, at(src, 26, 7));
    ir_op_set_attr(m, tr, "perm", &(ir_attr){.kind = IR_ATTR_INTS, .as.ints = {3, (int64_t[]){1, 0, 2}}});

    operands[0] = ir_op_result(m, tr, 0);
    uint32_t out = ir_append_op(m, IR_OP_OUTPUT, operands, 1, UINT32_MAX, at(src, 40, 3));
    ir_op_set_string(m, out, "name", "logits");
}

static const char expected_tiny[] =
    "module tiny {\n"
    "  source \"examples/tiny.smelt\"\n"
    "  param hidden_size: int = 64\n"
    "  param rms_norm_eps: float = 1e-05\n"
    "  param attention_bias: bool = false\n"
    "  param model_type: string = \"l\\\"q\\\\\\n\\t\\x01\\x7f\xc3\xa9\"\n"
    "  param min: int = -9223372036854775808\n"
    "  dim tokens <= 8192\n"
    "  dim \"my dim\" <= 4\n"
    "  %0 = input() {name = \"ids\"} : i32[tokens] loc(14:3)\n"
    "  %1 = weight() {name = \"model.embed_tokens.weight\"} : f32[97, 64] loc(16:3)\n"
    "  %2 = embedding(%1, %0) : f32[tokens, 64] loc(17:11)\n"
    "  %3, %4 = split(%2) {axis = 1, sizes = [32, 32]} : f32[tokens, 32], f32[tokens, 32]\n"
    "  %5 = weight() {name = \"model.layers.{e}.w\", stack = \"e\"} : bf16[4, 32, 32]\n"
    "  %6 = matmul(%4, %5) : ? loc(21:5)\n"
    "  %7 = reshape(%6) {shape = [tokens, \"my dim\", 8, 1]} : ? loc(22:0)\n"
    "  %8 = const() {value = 0.125} : f32[]\n"
    "  %9 = softmax(%7) : ? loc(23:7)\n"
    "  %10 = rope(%9, %0) {theta = 10000.0, style = \"interleaved\"} : ? loc(24:7)\n"
    "  %11 = attention(%10, %10, %10, %0) {scale = 0.125, causal = false, max_seq = 8192} : ? loc(25:7)\n"
    "  %12 = transpose(%11) {perm = [1, 0, 2]} : ? loc(26:7)\n"
    "  output(%12) {name = \"logits\"} loc(40:3)\n"
    "}\n";

static void test_print_hand_built(void **state) {
    (void)state;
    diag_engine d;
    diag_init(&d, stderr);
    ir_module m;
    build_tiny(&m, &d);
    char *text = print_module(&m);
    assert_string_equal(text, expected_tiny);

    /* Print, parse, print: the same bytes, and the parsed module matches. */
    ir_module back;
    char *messages;
    assert_true(parse(text, &back, &messages));
    assert_string_equal(messages, "");
    char *again = print_module(&back);
    assert_string_equal(again, text);
    assert_int_equal(back.op_count, m.op_count - 1); /* the dead op is gone */
    assert_int_equal(back.value_count, 13);
    assert_string_equal(back.params[3].value.s, m.params[3].value.s);
    assert_true(back.params[4].value.i == INT64_MIN);
    assert_string_equal(back.symbols[1].name, "my dim");

    /* Compacting the original removes the dead op; the text does not change. */
    ir_module_compact(&m);
    char *compacted = print_module(&m);
    assert_string_equal(compacted, expected_tiny);

    free(compacted);
    free(again);
    free(messages);
    free(text);
    ir_module_free(&back);
    ir_module_free(&m);
    diag_free(&d);
}

static void test_print_no_source(void **state) {
    (void)state;
    ir_module m;
    ir_module_init(&m, "my model");
    /* A location in some file is not printed when the module has no source. */
    uint32_t x = ir_append_op(&m, IR_OP_INPUT, NULL, 0, UINT32_MAX, at(0, 3, 4));
    ir_op_set_string(&m, x, "name", "x");
    m.values[0].type = type_of(SMELT_DTYPE_F16, 0, NULL);
    ir_value_id v = ir_op_result(&m, x, 0);
    uint32_t o = ir_append_op(&m, IR_OP_OUTPUT, &v, 1, UINT32_MAX, at(0, 5, 1));
    ir_op_set_string(&m, o, "name", "y");
    char *text = print_module(&m);
    assert_string_equal(text, "module \"my model\" {\n"
                              "  %0 = input() {name = \"x\"} : f16[]\n"
                              "  output(%0) {name = \"y\"}\n"
                              "}\n");
    ir_module back;
    char *messages;
    assert_true(parse(text, &back, &messages));
    assert_string_equal(back.name, "my model");
    assert_null(back.source_path);
    assert_int_equal(back.source_file, -1);
    free(messages);
    free(text);
    ir_module_free(&back);
    ir_module_free(&m);

    ir_module empty;
    ir_module_init(&empty, "e");
    text = print_module(&empty);
    assert_string_equal(text, "module e {\n}\n");
    free(text);
    ir_module_free(&empty);
}

/* ---- parsing hand-written text ------------------------------------------------ */

static const char hand_written[] = "# a hand-written module\n"
                                   "\n"
                                   "module hand {   # trailing comment\n"
                                   "  source \"model.smelt\"\n"
                                   "  param eps: float = 1e-6\n"
                                   "  param layers: int = -3\n"
                                   "  param flag: bool = true\n"
                                   "  param kind: string = \"a\\x41\\tb\"\n"
                                   "\n"
                                   "  dim tokens <= 8192\n"
                                   "  %ids = input() {name = \"ids\"} : i32[tokens]\n"
                                   "  %w.0 = weight() {name = \"w\"} : f32[16, 8]   # comment\n"
                                   "  %x = embedding(%w.0, %ids) loc(7:9)\n"
                                   "  %n = rms_norm(%x, %w.0) {eps = 1} : ?\n"
                                   "  %a, %b = split(%n) {sizes = [4, 4], axis = -1} : f32[tokens, 4], ?\n"
                                   "  %m = matmul(%a, %w.0)\n"
                                   "  output(%b) {name = \"out\"}\n"
                                   "}\n"
                                   "# done\n";

static const char hand_written_printed[] =
    "module hand {\n"
    "  source \"model.smelt\"\n"
    "  param eps: float = 1e-06\n"
    "  param layers: int = -3\n"
    "  param flag: bool = true\n"
    "  param kind: string = \"aA\\tb\"\n"
    "  dim tokens <= 8192\n"
    "  %0 = input() {name = \"ids\"} : i32[tokens]\n"
    "  %1 = weight() {name = \"w\"} : f32[16, 8]\n"
    "  %2 = embedding(%1, %0) : ? loc(7:9)\n"
    "  %3 = rms_norm(%2, %1) {eps = 1.0} : ?\n"
    "  %4, %5 = split(%3) {axis = -1, sizes = [4, 4]} : f32[tokens, 4], ?\n"
    "  %6 = matmul(%4, %1) : ?\n"
    "  output(%5) {name = \"out\"}\n"
    "}\n";

static void test_parse_fields(void **state) {
    (void)state;
    capture c;
    capture_open(&c);
    diag_engine d;
    diag_init(&d, c.stream);
    ir_module m;
    assert_true(ir_parse_text("hand.ir", hand_written, strlen(hand_written), &d, &m));
    int32_t ir_file = diag_file_id(&d, "hand.ir");

    assert_string_equal(m.name, "hand");
    assert_string_equal(m.source_path, "model.smelt");
    assert_int_equal(m.source_file, diag_file_id(&d, "model.smelt"));
    assert_int_not_equal(m.source_file, ir_file);

    assert_int_equal(m.param_count, 4);
    assert_string_equal(m.params[0].name, "eps");
    assert_int_equal(m.params[0].type, IR_PARAM_FLOAT);
    assert_true(m.params[0].value.f == 1e-6);
    assert_int_equal(m.params[1].type, IR_PARAM_INT);
    assert_true(m.params[1].value.i == -3);
    assert_int_equal(m.params[2].type, IR_PARAM_BOOL);
    assert_true(m.params[2].value.b);
    assert_int_equal(m.params[3].type, IR_PARAM_STRING);
    assert_string_equal(m.params[3].value.s, "aA\tb");

    assert_int_equal(m.symbol_count, 1);
    assert_string_equal(m.symbols[0].name, "tokens");
    assert_true(m.symbols[0].bound == 8192);

    assert_int_equal(m.op_count, 7);
    assert_int_equal(m.value_count, 7);
    static const ir_op_kind kinds[] = {IR_OP_INPUT, IR_OP_WEIGHT, IR_OP_EMBEDDING, IR_OP_RMS_NORM,
                                       IR_OP_SPLIT, IR_OP_MATMUL, IR_OP_OUTPUT};
    for (uint32_t i = 0; i < 7; i++)
        assert_int_equal(m.ops[i].kind, kinds[i]);

    /* embedding(%w.0, %ids): operands are the values of ops 1 and 0. */
    assert_int_equal(m.ops[2].operand_count, 2);
    assert_int_equal(m.ops[2].operands[0], ir_op_result(&m, 1, 0));
    assert_int_equal(m.ops[2].operands[1], ir_op_result(&m, 0, 0));
    assert_int_equal(m.ops[6].operands[0], ir_op_result(&m, 4, 1)); /* %b */
    assert_int_equal(m.values[ir_op_result(&m, 4, 1)].result_index, 1);

    /* Attributes: kinds converted, defaults filled in. */
    assert_string_equal(ir_op_string(&m, 0, "name"), "ids");
    assert_string_equal(ir_op_string(&m, 1, "stack"), "");
    assert_true(ir_op_float(&m, 3, "eps") == 1.0);
    assert_true(ir_op_int(&m, 4, "axis") == -1);
    const ir_attr *sizes = ir_op_attr(&m, 4, "sizes");
    assert_non_null(sizes);
    assert_int_equal(sizes->as.ints.count, 2);
    assert_true(sizes->as.ints.items[0] == 4 && sizes->as.ints.items[1] == 4);
    assert_string_equal(ir_op_string(&m, 5, "layout"), "out_in");

    /* Types: declared ones stored, `?` and missing ones unknown. */
    const ir_type *ids = &m.values[ir_op_result(&m, 0, 0)].type;
    assert_int_equal(ids->dtype, SMELT_DTYPE_I32);
    assert_int_equal(ids->rank, 1);
    assert_int_equal(ids->dims[0].symbol, 0);
    const ir_type *w = &m.values[ir_op_result(&m, 1, 0)].type;
    assert_int_equal(w->dtype, SMELT_DTYPE_F32);
    assert_int_equal(w->rank, 2);
    assert_true(w->dims[0].symbol < 0 && w->dims[0].size == 16 && w->dims[1].size == 8);
    assert_int_equal(m.values[ir_op_result(&m, 2, 0)].type.dtype, SMELT_DTYPE_UNKNOWN);
    assert_int_equal(m.values[ir_op_result(&m, 4, 0)].type.dtype, SMELT_DTYPE_F32);
    assert_int_equal(m.values[ir_op_result(&m, 4, 1)].type.dtype, SMELT_DTYPE_UNKNOWN);

    /* Locations: loc(...) is in the source; the rest is the op name in the .ir file. */
    assert_int_equal(m.ops[2].loc.file, m.source_file);
    assert_int_equal(m.ops[2].loc.line, 7);
    assert_int_equal(m.ops[2].loc.col, 9);
    assert_int_equal(m.ops[0].loc.file, ir_file);
    assert_int_equal(m.ops[0].loc.line, 11);
    assert_int_equal(m.ops[0].loc.col, 10);
    assert_int_equal(m.ops[6].loc.line, 17);
    assert_int_equal(m.ops[6].loc.col, 3);

    char *text = print_module(&m);
    assert_string_equal(text, hand_written_printed);
    free(text);
    ir_module_free(&m);
    diag_free(&d);
    assert_string_equal(capture_close(&c), "");
    capture_free(&c);

    assert_round_trip(hand_written_printed);
}

static void test_round_trip_text(void **state) {
    (void)state;
    assert_round_trip("module m {\n}\n");
    assert_round_trip("module m {\n"
                      "  param big: int = 9223372036854775807\n"
                      "  param tiny: float = 5e-324\n"
                      "  param inf: float = -inf\n"
                      "  param nan: float = nan\n"
                      "  param s: string = \"\"\n"
                      "  dim \"\" <= 1\n"
                      "  dim f32 <= 9223372036854775807\n"
                      "  %0 = const() {value = -0.0} : f8e4m3[]\n"
                      "  %1 = const() {value = inf} : i4[f32, \"\", 0]\n"
                      "  %2 = concat(%0, %1, %0) {axis = 0} : ?\n"
                      "  %3 = gelu(%2) {approximate = \"tanh\"} : ?\n"
                      "  %4 = moe(%3, %3, %3, %3, %3) {top_k = 2, normalize = false} : ?\n"
                      "  %5 = reshape(%4) {shape = []} : ?\n"
                      "  %6 = transpose(%5) {perm = []} : ?\n"
                      "  %7 = slice(%6) {axis = 0, start = -9223372036854775808, end = 1} : ?\n"
                      "  %8 = argmax(%7) {axis = 2} : i64[]\n"
                      "  %9 = layer_norm(%8, %8, %8) {eps = 0.1} : ?\n"
                      "  %10 = mul(%9, %9) : ?\n"
                      "  %11 = add(%10, %9) : ?\n"
                      "  output(%11) {name = \"\\x1b[0m\"}\n"
                      "}\n");
}

/* ---- parse errors ------------------------------------------------------------- */

#define HEAD "module m {\n  dim tokens <= 8\n  %x = input() {name = \"x\"} : f32[tokens]\n"

static void test_parse_errors(void **state) {
    (void)state;
    assert_parse_error("", "t.ir:1:1: error: expected 'module', found end of input");
    assert_parse_error("\n\n  modul m {\n}\n", "t.ir:3:3: error: expected 'module', found 'modul'");
    assert_parse_error(HEAD "  %y = matmull(%x, %x)\n}\n", "t.ir:4:8: error: unknown op 'matmull'\n");
    assert_parse_error(HEAD "  %y = softmax(%x) {axes = 1}\n}\n",
                       "t.ir:4:21: error: unknown attribute 'axes' for op 'softmax'\n");
    assert_parse_error(HEAD "  %y = rms_norm(%x, %x) {eps = \"small\"}\n}\n",
                       "t.ir:4:32: error: attribute 'eps' of 'rms_norm' expects a float, found a string\n");
    assert_parse_error(HEAD "  %y = softmax(%x) {axis = 1.5}\n}\n",
                       "t.ir:4:28: error: attribute 'axis' of 'softmax' expects an int, found a float\n");
    assert_parse_error(HEAD "  %y = softmax(%x) {axis = -1.5}\n}\n",
                       "t.ir:4:29: error: attribute 'axis' of 'softmax' expects an int, found a float\n");
    assert_parse_error(
        HEAD "  %y = transpose(%x) {perm = 1}\n}\n",
        "t.ir:4:30: error: attribute 'perm' of 'transpose' expects a list of ints, found an int\n");
    assert_parse_error(HEAD "  %y = attention(%x, %x, %x, %x) {causal = 1}\n}\n",
                       "t.ir:4:44: error: attribute 'causal' of 'attention' expects a bool, found an int\n");
    assert_parse_error(HEAD "  %y = softmax(%x) {axis = 1, axis = 2}\n}\n",
                       "t.ir:4:31: error: duplicate attribute 'axis'\n");
    assert_parse_error(HEAD "  %y = add(%x, %z)\n}\n", "t.ir:4:16: error: use of undefined value '%z'\n");
    assert_parse_error(HEAD "  %y = add(%y, %x)\n}\n", "t.ir:4:12: error: use of undefined value '%y'\n");
    assert_parse_error(HEAD "  %x = silu(%x)\n}\n", "t.ir:4:3: error: redefinition of '%x'\n");
    assert_parse_error(HEAD "  %x = silu(%x)\n}\n", "t.ir:3:3: note: '%x' was first defined here\n");
    assert_parse_error(HEAD "  %a, %a = split(%x) {axis = 0, sizes = [1, 1]}\n}\n",
                       "t.ir:4:7: error: redefinition of '%a'\n");
    assert_parse_error(HEAD "  %y = silu(%x) : f32[tokens, seq]\n}\n",
                       "t.ir:4:31: error: use of undeclared dim 'seq'\n");
    assert_parse_error(HEAD "  %y = reshape(%x) {shape = [seq]}\n}\n",
                       "t.ir:4:30: error: use of undeclared dim 'seq'\n");
    assert_parse_error(HEAD "  %y = silu(%x) : f33[tokens]\n}\n", "t.ir:4:19: error: unknown dtype 'f33'\n");
    assert_parse_error(HEAD "  %y = silu(%x) : f32[tokens\n}\n",
                       "t.ir:4:29: error: expected ',' or ']', found end of line\n");
    assert_parse_error(HEAD "  %y = silu(%x) : f32(tokens)\n}\n",
                       "t.ir:4:22: error: expected '[', found '('\n");
    assert_parse_error(HEAD "  %y = silu(%x) : [4]\n}\n", "t.ir:4:19: error: expected a type, found '['\n");
    assert_parse_error(HEAD "  %y = silu(%x) : f32[-1]\n}\n",
                       "t.ir:4:23: error: expected a dim size or name, found '-'\n");
    assert_parse_error(HEAD "  %y = silu(%x) : f32[1, 2, 3, 4, 5, 6, 7]\n}\n",
                       "t.ir:4:41: error: a type has at most 6 dims\n");
    assert_parse_error("module m {\n  %x = input() {name = \"x\"}\n}\n",
                       "t.ir:2:8: error: op 'input' needs a declared type (': dtype[dims]')\n");
    assert_parse_error("module m {\n  %x = weight() {name = \"x\"} : ?\n}\n",
                       "t.ir:2:32: error: op 'weight' needs a known type, found '?'\n");
    assert_parse_error(HEAD "  %y, %z = silu(%x)\n}\n",
                       "t.ir:4:12: error: expected 1 result for 'silu', found 2\n");
    assert_parse_error(HEAD "  silu(%x)\n}\n", "t.ir:4:3: error: expected 1 result for 'silu', found 0\n");
    assert_parse_error(HEAD "  %y = output(%x) {name = \"y\"}\n}\n",
                       "t.ir:4:8: error: expected 0 results for 'output', found 1\n");
    assert_parse_error(HEAD "  %a, %b = split(%x) {axis = 0, sizes = [1, 1, 2]}\n}\n",
                       "t.ir:4:12: error: expected 3 results for 'split', found 2\n");
    assert_parse_error(HEAD "  %y = silu(%x) : ?, ?\n}\n",
                       "t.ir:4:17: error: expected 1 type for the results of 'silu', found 2\n");
    assert_parse_error(HEAD "  %y = softmax(%x) {axis = 9223372036854775808}\n}\n",
                       "t.ir:4:28: error: integer '9223372036854775808' does not fit in 64 bits\n");
    assert_parse_error(HEAD "  %y = softmax(%x) {axis = -99999999999999999999999}\n}\n",
                       "t.ir:4:28: error: integer '-99999999999999999999999' does not fit in 64 bits\n");
    assert_parse_error("module m {\n  param p: float = 1e999\n}\n",
                       "t.ir:2:20: error: float '1e999' is out of range\n");
    assert_parse_error("module m {\n  dim d <= 0\n}\n",
                       "t.ir:2:12: error: expected a dim bound >= 1, found 0\n");
    assert_parse_error("module m {\n  dim d <= 2\n  dim d <= 3\n}\n",
                       "t.ir:3:7: error: redefinition of dim 'd'\n");
    assert_parse_error("module m {\n  param p: int = 1\n  param p: int = 2\n}\n",
                       "t.ir:3:9: error: redefinition of param 'p'\n");
    assert_parse_error(
        "module m {\n  param p: double = 1\n}\n",
        "t.ir:2:12: error: expected a param type (int, float, bool or string), found 'double'\n");
    assert_parse_error("module m {\n  param p: string = \"abc\n}\n",
                       "t.ir:2:21: error: unterminated string\n");
    assert_parse_error("module m {\n  param p: string = \"a\\qc\"\n}\n",
                       "t.ir:2:23: error: unknown escape '\\q' in string");
    assert_parse_error("module m {\n  param p: string = \"abc", "t.ir:2:21: error: unterminated string\n");
    assert_parse_error(HEAD "  %y = silu(%x) loc(3:4)\n}\n",
                       "t.ir:4:17: error: 'loc(...)' needs a 'source' line before it\n");
    assert_parse_error("module m {\n  source \"a\"\n  source \"b\"\n}\n",
                       "t.ir:3:3: error: duplicate 'source' line\n");
    assert_parse_error(HEAD "  %y = silu(%x) @\n}\n", "t.ir:4:17: error: unexpected character '@'\n");
    assert_parse_error(HEAD "  %y = silu(%x) 12ab\n}\n", "t.ir:4:17: error: malformed number '12ab'\n");
    assert_parse_error(HEAD "  %y = silu(%x) extra\n}\n",
                       "t.ir:4:17: error: expected end of line, found 'extra'\n");
    assert_parse_error(HEAD "  % = silu(%x)\n}\n", "t.ir:4:3: error: expected a value name after '%'\n");
    assert_parse_error(HEAD, "t.ir:4:1: error: expected '}' at the end of module 'm', found end of input\n");
    assert_parse_error("module m {\n}\nmodule n {\n}\n",
                       "t.ir:3:1: error: expected end of input after the module's '}', found 'module'\n");
    assert_parse_error("module m {\n  { }\n}\n", "t.ir:2:3: error: expected 'param', 'dim', 'source', "
                                                 "'ignore', 'precision', 'arena' or an op, found '{'\n");
}

/* Every bad line is reported, each once, and a line's failure does not
 * cascade into uses of the values it defines. */
static void test_every_error_reported(void **state) {
    (void)state;
    ir_module m;
    char *messages;
    assert_false(parse(HEAD "  %a = bogus(%x)\n"           /* line 4: unknown op */
                            "  %b = silu(%a)\n"            /* %a poisoned: no error */
                            "  %c = softmax(%x) {q = 1}\n" /* unknown attribute */
                            "  %d = silu(%nope)\n"         /* line 7 */
                            "  %e = silu(%x) : f32[zz]\n"  /* line 8 */
                            "  param p: int = x\n"         /* line 9 */
                            "}\n",
                       &m, &messages));
    assert_int_equal(count_errors(messages), 5);
    assert_non_null(strstr(messages, "t.ir:4:8: error: unknown op 'bogus'"));
    assert_non_null(strstr(messages, "t.ir:6:21: error: unknown attribute 'q' for op 'softmax'"));
    assert_non_null(strstr(messages, "t.ir:7:13: error: use of undefined value '%nope'"));
    assert_non_null(strstr(messages, "t.ir:8:23: error: use of undeclared dim 'zz'"));
    assert_non_null(strstr(messages, "t.ir:9:18: error: expected an int, found 'x'"));
    free(messages);

    /* 30 bad lines: the diag engine stops after 20 errors. */
    char text[4096] = "module m {\n";
    for (int i = 0; i < 30; i++)
        strcat(text, "  nope()\n");
    strcat(text, "}\n");
    assert_false(parse(text, &m, &messages));
    assert_int_equal(count_errors(messages), 21); /* 20 and "too many errors" */
    assert_non_null(strstr(messages, "too many errors"));
    free(messages);
}

/* ---- hostile input ------------------------------------------------------------- */

static char *repeat(const char *head, char c, size_t n, const char *tail, size_t *length) {
    size_t h = strlen(head), t = strlen(tail);
    char *s = malloc(h + n + t + 1);
    assert_non_null(s);
    memcpy(s, head, h);
    memset(s + h, c, n);
    memcpy(s + h + n, tail, t + 1);
    if (length) *length = h + n + t;
    return s;
}

static void test_hostile_input(void **state) {
    (void)state;
    enum { MEGABYTE = 1 << 20 };
    char *text;

    /* 1 MB names: messages cut them to DIAG_NAME_MAX bytes. */
    text = repeat("module m {\n  %y = ", 'a', MEGABYTE, "()\n}\n", NULL);
    char expected[200];
    snprintf(expected, sizeof expected, "t.ir:2:8: error: unknown op '%.*s...'\n", (int)DIAG_NAME_MAX,
             text + 18);
    assert_parse_error(text, expected);
    free(text);

    text = repeat(HEAD "  %y = silu(%x) : f32[", 'b', MEGABYTE, "]\n}\n", NULL);
    assert_parse_error(text, "t.ir:4:23: error: use of undeclared dim "
                             "'bbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbbb...'\n");
    free(text);

    /* A 1 MB value name and a 1 MB dim name are fine when they are defined. */
    size_t length;
    char *name = repeat("", 'v', MEGABYTE, "", NULL);
    size_t size = 4 * MEGABYTE + 200;
    text = malloc(size);
    snprintf(text, size,
             "module m {\n  dim %s <= 3\n  %%%s = input() {name = \"x\"} : f32[%s]\n  output(%%%s) {name = "
             "\"y\"}\n}\n",
             name, name, name, name);
    ir_module m;
    char *messages;
    assert_true(parse(text, &m, &messages));
    assert_int_equal(m.symbol_count, 1);
    assert_int_equal(strlen(m.symbols[0].name), MEGABYTE);
    free(messages);
    free(text);
    text = print_module(&m);
    assert_int_equal(strncmp(text, "module m {\n  dim vvvv", 20), 0);
    assert_non_null(strstr(text, " <= 3\n  %0 = input() {name = \"x\"} : f32[vvvv"));
    assert_non_null(strstr(text, "]\n  output(%0) {name = \"y\"}\n}\n"));
    assert_round_trip(text);
    free(text);
    free(name);
    ir_module_free(&m);

    /* 10,000-deep brackets and parentheses: nothing recurses, one error each. */
    text = repeat(HEAD "  %y = transpose(%x) {perm = ", '[', 10000, "\n}\n", &length);
    assert_parse_error(text, "t.ir:4:31: error: expected an int, found '['\n");
    free(text);
    text = repeat(HEAD "  %y = silu(%x) : f32", '[', 10000, "\n}\n", NULL);
    assert_parse_error(text, "t.ir:4:23: error: expected a dim size or name, found '['\n");
    free(text);
    text = repeat(HEAD "  %y = silu", '(', 10000, "\n}\n", NULL);
    assert_parse_error(text, "t.ir:4:13: error: expected a value, found '('\n");
    free(text);
    text = repeat("module m {\n", '{', 10000, "\n}\n", NULL);
    assert_parse_error(text, "t.ir:2:1: error: expected 'param', 'dim', 'source', 'ignore', 'precision', "
                             "'arena' or an op, found '{'\n");
    free(text);

    /* A 1 MB string value is fine. */
    text = repeat("module m {\n  param s: string = \"", 's', MEGABYTE, "\"\n}\n", NULL);
    assert_true(parse(text, &m, &messages));
    assert_int_equal(strlen(m.params[0].value.s), MEGABYTE);
    free(messages);
    ir_module_free(&m);
    free(text);

    /* A 1 MB number. */
    text = repeat("module m {\n  param p: int = ", '9', MEGABYTE, "\n}\n", NULL);
    snprintf(expected, sizeof expected, "t.ir:2:18: error: integer '%.*s...' does not fit in 64 bits\n",
             (int)DIAG_NAME_MAX, text + 28);
    assert_parse_error(text, expected);
    free(text);

    /* More operands than an op can have. */
    capture c;
    capture_open(&c);
    fputs(HEAD "  %y = concat(%x", c.stream);
    for (int i = 0; i < IR_MAX_OPERANDS; i++)
        fputs(", %x", c.stream);
    fputs(") {axis = 0}\n}\n", c.stream);
    capture_close(&c);
    /* operand 257 starts at column 15 + 256 * 4 */
    snprintf(expected, sizeof expected, "t.ir:4:%d: error: an op has at most 256 operands\n", 15 + 256 * 4);
    assert_parse_error(c.text, expected);
    capture_free(&c);

    /* NUL bytes, inside and outside strings. */
    static const char nul_in_string[] = "module m {\n  param p: string = \"a\0b\"\n}\n";
    assert_parse_error_bytes(nul_in_string, sizeof nul_in_string - 1,
                             "t.ir:2:23: error: NUL byte in string\n");
    static const char escaped_nul[] = "module m {\n  param p: string = \"a\\x00b\"\n}\n";
    assert_parse_error(escaped_nul, "t.ir:2:23: error: NUL byte in string ('\\x00')\n");
    static const char nul_line[] = "module m {\n\0\n}\n";
    assert_parse_error_bytes(nul_line, sizeof nul_line - 1, "t.ir:2:1: error: unexpected byte 0x00\n");
    static const char nul_first[] = "\0module m {\n}\n";
    assert_parse_error_bytes(nul_first, sizeof nul_first - 1, "t.ir:1:1: error: unexpected byte 0x00\n");

    /* Binary garbage, deterministic: refused, never a crash. */
    enum { GARBAGE = 65536 };
    char *garbage = malloc(GARBAGE);
    uint32_t x = 7;
    for (size_t i = 0; i < GARBAGE; i++) {
        x = x * 1103515245u + 12345u;
        garbage[i] = (char)(x >> 16);
    }
    assert_false(parse_bytes(garbage, GARBAGE, &m, &messages));
    assert_true(count_errors(messages) >= 1);
    free(messages);
    /* Garbage inside a module: refused line by line. */
    memcpy(garbage, "module m {\n", 11);
    assert_false(parse_bytes(garbage, GARBAGE, &m, &messages));
    assert_true(count_errors(messages) >= 2);
    free(messages);
    free(garbage);
}

/* Every one-byte change of a valid text either parses into a module that
 * prints stably, or is refused; none crashes. */
static void test_mutations(void **state) {
    (void)state;
    size_t n = strlen(expected_tiny);
    char *text = malloc(n + 1);
    static const char replacements[] = {'\0', '\n', '"', '%', '[', ']',  '{',
                                        '}',  '-',  '9', 'x', ',', '\\', '?'};
    unsigned parsed = 0, refused = 0;
    for (size_t i = 0; i < n; i++) {
        for (size_t r = 0; r < sizeof replacements; r++) {
            memcpy(text, expected_tiny, n + 1);
            if (text[i] == replacements[r]) continue;
            text[i] = replacements[r];
            ir_module m;
            char *messages;
            if (parse_bytes(text, n, &m, &messages)) {
                char *once = print_module(&m);
                ir_module again;
                char *messages2;
                assert_true(parse(once, &again, &messages2));
                char *twice = print_module(&again);
                assert_string_equal(once, twice);
                free(once);
                free(twice);
                free(messages2);
                ir_module_free(&again);
                ir_module_free(&m);
                parsed++;
            } else {
                assert_true(count_errors(messages) >= 1);
                refused++;
            }
            free(messages);
        }
    }
    assert_true(parsed > 0);
    assert_true(refused > 0);
    free(text);
}

/* ---- Graphviz ------------------------------------------------------------------ */

static void test_dot(void **state) {
    (void)state;
    ir_module m;
    char *messages;
    assert_true(parse("module tiny {\n"
                      "  dim tokens <= 8\n"
                      "  %0 = input() {name = \"ids\"} : i32[tokens]\n"
                      "  %1 = weight() {name = \"a\\\"b\\\\c\"} : f32[10, 4]\n"
                      "  %2 = embedding(%1, %0) : f32[tokens, 4]\n"
                      "  %3, %4 = split(%2) {axis = 1, sizes = [2, 2]} : f32[tokens, 2], f32[tokens, 2]\n"
                      "  %5 = const() {value = 0.5} : f32[]\n"
                      "  %6 = mul(%4, %5) : ?\n"
                      "  output(%6) {name = \"y\"}\n"
                      "}\n",
                      &m, &messages));
    m.ops[5].dead = true; /* the mul: its node and edges go, the output's edge too */
    char *dot = print_dot(&m);
    assert_string_equal(dot, "digraph tiny {\n"
                             "  node [fontname=\"monospace\"];\n"
                             "  n0 [label=\"%0 = input\\nids\\ni32[tokens]\", shape=box];\n"
                             "  n1 [label=\"%1 = weight\\na\\\"b\\\\c\\nf32[10, 4]\", shape=box];\n"
                             "  n2 [label=\"%2 = embedding\\nf32[tokens, 4]\"];\n"
                             "  n1 -> n2;\n"
                             "  n0 -> n2;\n"
                             "  n3 [label=\"%3, %4 = split\\nf32[tokens, 2], f32[tokens, 2]\"];\n"
                             "  n2 -> n3;\n"
                             "  n4 [label=\"%5 = const\\n0.5\\nf32[]\"];\n"
                             "  n6 [label=\"output\\ny\", shape=doubleoctagon];\n"
                             "}\n");
    free(dot);
    m.ops[5].dead = false;
    dot = print_dot(&m);
    assert_non_null(strstr(dot, "  n5 [label=\"%6 = mul\\n?\"];\n  n3 -> n5 [label=\"1\"];\n  n4 -> n5;\n"));
    assert_non_null(strstr(dot, "  n5 -> n6;\n}\n"));
    free(dot);
    free(messages);
    ir_module_free(&m);

    ir_module_init(&m, "graph");
    dot = print_dot(&m);
    assert_string_equal(dot, "digraph \"graph\" {\n  node [fontname=\"monospace\"];\n}\n");
    free(dot);
    ir_module_free(&m);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_format_float),
        cmocka_unit_test(test_print_hand_built),
        cmocka_unit_test(test_print_no_source),
        cmocka_unit_test(test_parse_fields),
        cmocka_unit_test(test_round_trip_text),
        cmocka_unit_test(test_parse_errors),
        cmocka_unit_test(test_every_error_reported),
        cmocka_unit_test(test_hostile_input),
        cmocka_unit_test(test_mutations),
        cmocka_unit_test(test_dot),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
