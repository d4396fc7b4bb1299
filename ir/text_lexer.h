/* text_lexer.h - tokens of the text IR (ir_io.h), for parse_text.c.
 *
 * The text IR is line-oriented: a newline ends a statement, so it is a
 * token of its own. `#` starts a comment that runs to the end of the line.
 * Tokens point into the source text (no copies); a STRING token keeps its
 * quotes and escapes, decoded on demand by ir_token_string().
 *
 * The lexer reports malformed tokens itself (unterminated string, bad
 * escape, stray byte, malformed number) and returns IR_TOKEN_ERROR for
 * them, after which the parser skips the rest of the line with the lexer
 * set `quiet` so that one bad line gives one error.
 */
#ifndef SMELT_TEXT_LEXER_H
#define SMELT_TEXT_LEXER_H

#include "arena.h"
#include "diag.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

typedef enum ir_token_kind {
    IR_TOKEN_EOF,
    IR_TOKEN_NEWLINE,
    IR_TOKEN_IDENT,      /* [A-Za-z_][A-Za-z0-9_]* */
    IR_TOKEN_VALUE,      /* %[A-Za-z0-9_.]+ (text includes the %) */
    IR_TOKEN_INT,        /* [0-9]+, no sign: the parser takes a preceding '-' */
    IR_TOKEN_FLOAT,      /* [0-9]+ ('.' [0-9]*)? ([eE][+-]?[0-9]+)? with '.' or exponent */
    IR_TOKEN_STRING,     /* "..." with \" \\ \n \t \xNN escapes */
    IR_TOKEN_LBRACE,     /* { */
    IR_TOKEN_RBRACE,     /* } */
    IR_TOKEN_LPAREN,     /* ( */
    IR_TOKEN_RPAREN,     /* ) */
    IR_TOKEN_LBRACKET,   /* [ */
    IR_TOKEN_RBRACKET,   /* ] */
    IR_TOKEN_COMMA,      /* , */
    IR_TOKEN_EQUAL,      /* = */
    IR_TOKEN_COLON,      /* : */
    IR_TOKEN_QUESTION,   /* ? */
    IR_TOKEN_MINUS,      /* - */
    IR_TOKEN_LESS_EQUAL, /* <= */
    IR_TOKEN_ERROR,      /* malformed; already reported unless the lexer was quiet */
} ir_token_kind;

typedef struct ir_token {
    ir_token_kind kind;
    const char *text; /* the token's bytes in the source, not NUL-terminated */
    size_t length;
    smelt_loc loc;
    uint64_t int_value; /* IR_TOKEN_INT: the magnitude, valid unless int_overflow */
    bool int_overflow;  /* IR_TOKEN_INT: more than 64 bits */
} ir_token;

typedef struct ir_lexer {
    const char *cursor, *end; /* remaining text */
    const char *line_start;   /* first byte of the current line, for columns */
    uint32_t line;
    int32_t file; /* diag file id of the text */
    diag_engine *diag;
    bool quiet;           /* report nothing (while the parser skips a bad line) */
    unsigned error_count; /* malformed tokens seen, reported or not */
} ir_lexer;

void ir_lexer_init(ir_lexer *lexer, const char *text, size_t length, int32_t file, diag_engine *diag);
ir_token ir_lexer_next(ir_lexer *lexer);

/* The value of a well-formed STRING token with escapes resolved, in `a`.
 * The lexer has already refused bad escapes and NUL bytes. */
char *ir_token_string(const ir_token *token, arena *a);
/* The token's text as a NUL-terminated copy in `a`. */
char *ir_token_text(const ir_token *token, arena *a);

/* printf arguments for "%.*s%s" that show at most DIAG_NAME_MAX bytes of a
 * token's text, then "..." (like DIAG_NAME for unterminated text). */
#define IR_TOKEN_NAME(t)                                                                                     \
    (int)((t)->length < DIAG_NAME_MAX ? (t)->length : DIAG_NAME_MAX), (t)->text,                             \
        ((t)->length > DIAG_NAME_MAX ? "..." : "")

#endif
