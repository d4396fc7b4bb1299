/* test_lexer.c - the DSL's tokens as the parser sees them (lexer.l).
 *
 * Each test lexes a snippet with fe_dump_dsl_tokens, which writes one token a
 * line ("LINE:COL KIND VALUE"), and compares the dump and the diagnostics
 * with what was worked out by hand from the snippet.
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
#include <time.h>

typedef struct lexed {
    char *tokens;      /* the dump */
    char *diagnostics; /* everything the diag engine printed */
    unsigned errors;
    bool ok;
} lexed;

static lexed lex_bytes(const char *text, size_t length) {
    lexed r = {0};
    size_t tokens_size = 0, diag_size = 0;
    FILE *tokens = open_memstream(&r.tokens, &tokens_size);
    FILE *diagnostics = open_memstream(&r.diagnostics, &diag_size);
    assert_non_null(tokens);
    assert_non_null(diagnostics);
    diag_engine d;
    diag_init(&d, diagnostics);
    r.ok = fe_dump_dsl_tokens("t.smelt", text, length, &d, tokens);
    r.errors = d.error_count;
    diag_free(&d);
    fclose(tokens);
    fclose(diagnostics);
    return r;
}

static lexed lex(const char *text) { return lex_bytes(text, strlen(text)); }

static void lexed_free(lexed *r) {
    free(r->tokens);
    free(r->diagnostics);
}

/* Only the "path:line:col: error: message" lines of the diagnostics. */
static char *error_lines(const char *diagnostics) {
    size_t n = strlen(diagnostics);
    char *out = calloc(n + 1, 1);
    assert_non_null(out);
    const char *p = diagnostics;
    while (*p) {
        const char *eol = strchr(p, '\n');
        size_t len = eol ? (size_t)(eol - p) + 1 : strlen(p);
        if (strncmp(p, "t.smelt:", 8) == 0 || strncmp(p, "smelt:", 6) == 0) strncat(out, p, len);
        p += len;
    }
    return out;
}

static void expect_tokens(const char *source, const char *expected) {
    lexed r = lex(source);
    assert_string_equal(r.tokens, expected);
    assert_string_equal(r.diagnostics, "");
    assert_true(r.ok);
    lexed_free(&r);
}

static void expect_errors(const char *source, size_t length, const char *expected_errors) {
    lexed r = lex_bytes(source, length);
    char *errors = error_lines(r.diagnostics);
    assert_string_equal(errors, expected_errors);
    assert_false(r.ok);
    free(errors);
    lexed_free(&r);
}

static void test_keywords_and_names(void **state) {
    expect_tokens("model param dim input weight let for in if else output stacked true false "
                  "int float bool string modelx _a1 i32",
                  "1:1 'model'\n1:7 'param'\n1:13 'dim'\n1:17 'input'\n1:23 'weight'\n"
                  "1:30 'let'\n1:34 'for'\n1:38 'in'\n1:41 'if'\n1:44 'else'\n1:49 'output'\n"
                  "1:56 'stacked'\n1:64 'true'\n1:69 'false'\n1:75 'int'\n1:79 'float'\n"
                  "1:85 'bool'\n1:90 'string'\n1:97 name modelx\n1:104 name _a1\n1:108 name i32\n"
                  "1:111 end of file\n");
}

static void test_operators(void **state) {
    expect_tokens("a.. <= >= == != && || + - * / % < > = ! ( ) [ ] { } , : ;",
                  "1:1 name a\n1:2 '..'\n1:5 '<='\n1:8 '>='\n1:11 '=='\n1:14 '!='\n1:17 '&&'\n"
                  "1:20 '||'\n1:23 '+'\n1:25 '-'\n1:27 '*'\n1:29 '/'\n1:31 '%'\n1:33 '<'\n"
                  "1:35 '>'\n1:37 '='\n1:39 '!'\n1:41 '('\n1:43 ')'\n1:45 '['\n1:47 ']'\n"
                  "1:49 '{'\n1:51 '}'\n1:53 ','\n1:55 ':'\n1:57 ';'\n1:58 end of file\n");
}

static void test_numbers(void **state) {
    expect_tokens("0 42 9223372036854775807 007 1.5 1e-5 1.5e+6 2E3 0..n 1.5..3",
                  "1:1 integer 0\n1:3 integer 42\n1:6 integer 9223372036854775807\n"
                  "1:26 integer 7\n1:30 float 1.5\n1:34 float 1.0000000000000001e-05\n"
                  "1:39 float 1500000\n1:46 float 2000\n"
                  "1:50 integer 0\n1:51 '..'\n1:53 name n\n"
                  "1:55 float 1.5\n1:58 '..'\n1:60 integer 3\n1:61 end of file\n");
}

static void test_number_errors(void **state) {
    const char *source = "let a = 9223372036854775808\n"
                         "let b = 1e999 + 1e-400 + 1e-320\n"
                         "let c = 2x + 1.5f\n";
    expect_errors(source, strlen(source),
                  "t.smelt:1:9: error: integer literal '9223372036854775808' does not fit in 64 bits "
                  "(the largest is 9223372036854775807)\n"
                  "t.smelt:2:9: error: float literal '1e999' is out of range\n"
                  "t.smelt:2:17: error: float literal '1e-400' is out of range\n"
                  "t.smelt:3:9: error: malformed number '2x'\n"
                  "t.smelt:3:14: error: malformed number '1.5f'\n");
    /* The subnormal 1e-320 is representable and no error; the token stream
     * goes on after each bad literal. */
    lexed r = lex("9223372036854775808 x");
    assert_string_equal(r.tokens, "1:1 integer 0\n1:21 name x\n1:22 end of file\n");
    lexed_free(&r);
}

static void test_strings_and_escapes(void **state) {
    /* Escapes come back re-escaped by the dump; the value is checked byte
     * by byte in test_parser.c. */
    expect_tokens("\"a\\\"b\\\\c\\nd\\te\" \"\" \"h\xc3\xa9\" x",
                  "1:1 string \"a\\\"b\\\\c\\nd\\te\"\n1:17 string \"\"\n"
                  "1:20 string \"h\xc3\xa9\"\n1:26 name x\n1:27 end of file\n");
}

static void test_string_errors(void **state) {
    const char *source = "let a = \"x\\qy\"\n"
                         "let b = \"open\n"
                         "let c = \"tail\\\n"
                         "let d = \"eof";
    expect_errors(source, strlen(source),
                  "t.smelt:1:11: error: unknown escape sequence '\\q' in string "
                  "(expected \\\", \\\\, \\n or \\t)\n"
                  "t.smelt:2:14: error: unterminated string: expected '\"' but found end of line "
                  "(strings cannot span lines)\n"
                  "t.smelt:3:15: error: unterminated string: expected '\"' but found end of line "
                  "(strings cannot span lines)\n"
                  "t.smelt:4:13: error: unterminated string: expected '\"' but found end of file\n");
    /* An unterminated string still becomes a token and the newline after
     * it still ends the statement. */
    lexed r = lex("\"open\nx");
    assert_string_equal(r.tokens, "1:1 string \"open\"\n1:6 end of line\n2:1 name x\n2:2 end of file\n");
    lexed_free(&r);
}

static void test_columns_count_bytes(void **state) {
    /* A tab is one byte; "é" is two; columns restart after each newline,
     * also after a comment and after a CRLF line end. */
    expect_tokens("\tlet\tx = \"\xc3\xa9\" # caf\xc3\xa9\n"
                  "  y\r\n"
                  "z",
                  "1:2 'let'\n1:6 name x\n1:8 '='\n1:10 string \"\xc3\xa9\"\n1:22 end of line\n"
                  "2:3 name y\n2:5 end of line\n3:1 name z\n3:2 end of file\n");
}

static void test_newlines(void **state) {
    /* Leading, repeated and trailing newlines; none inside brackets; none
     * before '{' or between '}' and 'else'; none after an operator. */
    expect_tokens("\n\n# c\na\n\n\nb(1,\n2)[\n]\nif c\n{\n}\nelse {}\nd = e +\nf\n\n",
                  "4:1 name a\n4:2 end of line\n7:1 name b\n7:2 '('\n7:3 integer 1\n7:4 ','\n"
                  "8:1 integer 2\n8:2 ')'\n8:3 '['\n9:1 ']'\n9:2 end of line\n10:1 'if'\n"
                  "10:4 name c\n11:1 '{'\n12:1 '}'\n13:1 'else'\n13:6 '{'\n13:7 '}'\n"
                  "13:8 end of line\n14:1 name d\n14:3 '='\n14:5 name e\n14:7 '+'\n15:1 name f\n"
                  "15:2 end of file\n");
}

static void test_newline_before_statement_keyword(void **state) {
    /* A statement keyword always starts a new statement: the newline before
     * it is kept even after an operator or inside an unclosed bracket, so
     * that the parser can report the broken line and go on. */
    expect_tokens("a = (b +\nlet c\nd = [1,\n}",
                  "1:1 name a\n1:3 '='\n1:5 '('\n1:6 name b\n1:8 '+'\n1:9 end of line\n"
                  "2:1 'let'\n2:5 name c\n2:6 end of line\n3:1 name d\n3:3 '='\n3:5 '['\n"
                  "3:6 integer 1\n3:7 ','\n4:1 '}'\n4:2 end of file\n");
}

static void test_comments(void **state) {
    expect_tokens("# only a comment", "1:1 end of file\n");
    expect_tokens("", "1:1 end of file\n");
    /* Anything goes in a comment, NUL and non-ASCII bytes included. */
    static const char source[] = "a # \x00\xff\xfe caf\xc3\xa9 ( [\nb";
    lexed r = lex_bytes(source, sizeof source - 1);
    assert_string_equal(r.tokens, "1:1 name a\n1:18 end of line\n2:1 name b\n2:2 end of file\n");
    assert_string_equal(r.diagnostics, "");
    assert_true(r.ok);
    lexed_free(&r);
}

static void test_bad_characters(void **state) {
    static const char source[] = "a @ b\n"
                                 "c \xff\xfe\x01 d\n"
                                 "e \x00\x00\x00 f\n"
                                 "caf\xc3\xa9 & | . \\";
    expect_errors(source, sizeof source - 1,
                  "t.smelt:1:3: error: unexpected character '@'\n"
                  "t.smelt:2:3: error: unexpected character '\\xff'\n"
                  "t.smelt:3:3: error: unexpected character '\\x00'\n"
                  "t.smelt:4:4: error: unexpected character '\\xc3'\n"
                  "t.smelt:4:7: error: unexpected character '&'\n"
                  "t.smelt:4:9: error: unexpected character '|'\n"
                  "t.smelt:4:11: error: unexpected character '.'\n"
                  "t.smelt:4:13: error: unexpected character '\\x5c'\n");
    /* The bad bytes are skipped: the tokens around them survive. End of
     * file is placed just past the last token. */
    lexed r = lex_bytes(source, sizeof source - 1);
    assert_string_equal(r.tokens, "1:1 name a\n1:5 name b\n1:6 end of line\n2:1 name c\n2:7 name d\n"
                                  "2:8 end of line\n3:1 name e\n3:7 name f\n3:8 end of line\n"
                                  "4:1 name caf\n4:4 end of file\n");
    lexed_free(&r);
}

static void test_nul_in_string(void **state) {
    static const char source[] = "\"a\x00"
                                 "b\" x";
    lexed r = lex_bytes(source, sizeof source - 1);
    char *errors = error_lines(r.diagnostics);
    assert_string_equal(errors, "t.smelt:1:3: error: unexpected character '\\x00' in string\n");
    assert_string_equal(r.tokens, "1:1 string \"ab\"\n1:7 name x\n1:8 end of file\n");
    free(errors);
    lexed_free(&r);
}

static void test_nesting_limit(void **state) {
    /* 256 open brackets are fine; the 257th is one error and the end of
     * the token stream. */
    char source[600];
    memset(source, '(', 256);
    source[256] = '\0';
    lexed r = lex(source);
    assert_true(r.ok);
    assert_int_equal(r.errors, 0);
    lexed_free(&r);

    memset(source, '[', 300);
    source[300] = '\0';
    r = lex(source);
    char *errors = error_lines(r.diagnostics);
    assert_string_equal(errors, "t.smelt:1:257: error: nesting deeper than 256 levels\n");
    assert_false(r.ok);
    /* 256 tokens, then end of file located right after the last one. */
    assert_non_null(strstr(r.tokens, "1:256 '['\n1:257 end of file\n"));
    free(errors);
    lexed_free(&r);
}

static void test_binary_garbage(void **state) {
    /* 1 MiB of pseudo-random bytes: errors (the engine stops after 20), no
     * crash, and linear time even with long runs of NULs. */
    size_t n = 1u << 20;
    char *garbage = malloc(n);
    assert_non_null(garbage);
    uint32_t x = 7;
    for (size_t i = 0; i < n; i++) {
        x = x * 1103515245u + 12345u;
        garbage[i] = (char)(x >> 24);
    }
    memset(garbage + n / 2, 0, n / 4);
    clock_t start = clock();
    lexed r = lex_bytes(garbage, n);
    double seconds = (double)(clock() - start) / CLOCKS_PER_SEC;
    assert_false(r.ok);
    assert_int_equal(r.errors, 20);
    assert_non_null(strstr(r.diagnostics, "too many errors"));
    assert_true(seconds < 10.0);
    lexed_free(&r);

    /* A quarter MiB of NULs alone: one error for the whole run. */
    memset(garbage, 0, n);
    start = clock();
    r = lex_bytes(garbage, n / 4);
    seconds = (double)(clock() - start) / CLOCKS_PER_SEC;
    assert_int_equal(r.errors, 1);
    assert_true(seconds < 10.0);
    lexed_free(&r);
    free(garbage);
}

static void test_long_identifier(void **state) {
    /* A 1 MB name is one token; messages about it are cut to 64 bytes. */
    size_t n = 1u << 20;
    char *source = malloc(n + 8);
    assert_non_null(source);
    memset(source, 'a', n);
    memcpy(source + n, " @", 3);
    lexed r = lex(source);
    assert_int_equal(r.errors, 1);
    assert_non_null(strstr(r.tokens, "\n1:1048577 end of file\n"));
    assert_int_equal(strncmp(r.tokens, "1:1 name aaaa", 13), 0);
    lexed_free(&r);
    free(source);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_keywords_and_names),
        cmocka_unit_test(test_operators),
        cmocka_unit_test(test_numbers),
        cmocka_unit_test(test_number_errors),
        cmocka_unit_test(test_strings_and_escapes),
        cmocka_unit_test(test_string_errors),
        cmocka_unit_test(test_columns_count_bytes),
        cmocka_unit_test(test_newlines),
        cmocka_unit_test(test_newline_before_statement_keyword),
        cmocka_unit_test(test_comments),
        cmocka_unit_test(test_bad_characters),
        cmocka_unit_test(test_nul_in_string),
        cmocka_unit_test(test_nesting_limit),
        cmocka_unit_test(test_binary_garbage),
        cmocka_unit_test(test_long_identifier),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
