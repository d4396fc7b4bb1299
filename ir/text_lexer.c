/* text_lexer.c - splits text IR into tokens (see text_lexer.h).
 *
 * Hand-written and loop-only: nothing here recurses or looks further ahead
 * than the token being read, so megabyte names and binary garbage cost one
 * pass over the bytes.
 */
#include "text_lexer.h"

#include <string.h>

void ir_lexer_init(ir_lexer *lexer, const char *text, size_t length, int32_t file, diag_engine *diag) {
    lexer->cursor = text;
    lexer->end = text + length;
    lexer->line_start = text;
    lexer->line = 1;
    lexer->file = file;
    lexer->diag = diag;
    lexer->quiet = false;
    lexer->error_count = 0;
}

static bool is_ident_start(unsigned char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
}
static bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
static bool is_ident_char(unsigned char c) { return is_ident_start(c) || is_digit(c); }
static bool is_value_char(unsigned char c) { return is_ident_char(c) || c == '.'; }
static bool is_hex_digit(unsigned char c) {
    return is_digit(c) || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
}
static unsigned hex_value(unsigned char c) {
    return is_digit(c) ? (unsigned)(c - '0') : (unsigned)((c | 0x20) - 'a' + 10);
}

/* Location of byte `p` on the current line. Columns saturate rather than
 * wrap on absurdly long lines. */
static smelt_loc loc_at(const ir_lexer *lexer, const char *p) {
    size_t col = (size_t)(p - lexer->line_start) + 1;
    return (smelt_loc){lexer->file, lexer->line, col > UINT32_MAX ? UINT32_MAX : (uint32_t)col};
}

static ir_token make_token(const ir_lexer *lexer, ir_token_kind kind, const char *start) {
    return (ir_token){
        .kind = kind, .text = start, .length = (size_t)(lexer->cursor - start), .loc = loc_at(lexer, start)};
}

#define LEX_ERROR(lexer, at, ...)                                                                            \
    do {                                                                                                     \
        (lexer)->error_count++;                                                                              \
        if (!(lexer)->quiet) diag_error((lexer)->diag, loc_at((lexer), (at)), __VA_ARGS__);                  \
    } while (0)

/* [0-9]+ ('.' [0-9]*)? ([eE][+-]?[0-9]+)?; a number running into letters
 * (12abc, 1e) is one malformed token rather than two confusing ones. */
static ir_token lex_number(ir_lexer *lexer, const char *start) {
    const char *p = start, *end = lexer->end;
    uint64_t magnitude = 0;
    bool overflow = false, is_float = false;
    for (; p < end && is_digit((unsigned char)*p); p++) {
        unsigned digit = (unsigned)(*p - '0');
        if (size_mul_overflow(magnitude, 10, &magnitude) || size_add_overflow(magnitude, digit, &magnitude))
            overflow = true;
    }
    if (p < end && *p == '.') {
        is_float = true;
        for (p++; p < end && is_digit((unsigned char)*p); p++) {
        }
    }
    if (p < end && (*p == 'e' || *p == 'E')) {
        const char *q = p + 1;
        if (q < end && (*q == '+' || *q == '-')) q++;
        if (q < end && is_digit((unsigned char)*q)) {
            is_float = true;
            for (p = q; p < end && is_digit((unsigned char)*p); p++) {
            }
        }
    }
    if (p < end && is_value_char((unsigned char)*p)) {
        while (p < end && is_value_char((unsigned char)*p))
            p++;
        lexer->cursor = p;
        ir_token bad = make_token(lexer, IR_TOKEN_ERROR, start);
        LEX_ERROR(lexer, start, "malformed number '%.*s%s'", IR_TOKEN_NAME(&bad));
        return bad;
    }
    lexer->cursor = p;
    ir_token t = make_token(lexer, is_float ? IR_TOKEN_FLOAT : IR_TOKEN_INT, start);
    t.int_value = magnitude;
    t.int_overflow = overflow;
    return t;
}

/* A string ends at its closing quote; a newline or the end of the text
 * before that leaves it unterminated. Escapes are checked here so that
 * ir_token_string can trust them. */
static ir_token lex_string(ir_lexer *lexer, const char *start) {
    const char *p = start + 1, *end = lexer->end;
    bool ok = true;
    while (p < end && *p != '"' && *p != '\n') {
        if (*p == '\0') {
            LEX_ERROR(lexer, p, "NUL byte in string");
            ok = false;
            p++;
        } else if (*p != '\\') {
            p++;
        } else if (p + 1 < end && (p[1] == '"' || p[1] == '\\' || p[1] == 'n' || p[1] == 't')) {
            p += 2;
        } else if (p + 3 < end && p[1] == 'x' && is_hex_digit((unsigned char)p[2]) &&
                   is_hex_digit((unsigned char)p[3])) {
            if (p[2] == '0' && p[3] == '0') {
                LEX_ERROR(lexer, p, "NUL byte in string ('\\x00')");
                ok = false;
            }
            p += 4;
        } else {
            unsigned char c = p + 1 < end ? (unsigned char)p[1] : ' ';
            if (c > 0x20 && c < 0x7f)
                LEX_ERROR(lexer, p, "unknown escape '\\%c' in string (expected \\\" \\\\ \\n \\t or \\xNN)",
                          c);
            else
                LEX_ERROR(lexer, p, "unknown escape in string (expected \\\" \\\\ \\n \\t or \\xNN)");
            ok = false;
            p++;
        }
    }
    if (p >= end || *p != '"') {
        LEX_ERROR(lexer, start, "unterminated string");
        lexer->cursor = p; /* stop at the newline: the next line still parses */
        return make_token(lexer, IR_TOKEN_ERROR, start);
    }
    lexer->cursor = p + 1;
    return make_token(lexer, ok ? IR_TOKEN_STRING : IR_TOKEN_ERROR, start);
}

ir_token ir_lexer_next(ir_lexer *lexer) {
    const char *p = lexer->cursor, *end = lexer->end;
    while (p < end && (*p == ' ' || *p == '\t' || *p == '\r' || *p == '\f' || *p == '\v'))
        p++;
    if (p < end && *p == '#') { /* a comment runs up to the newline, which stays a token */
        const char *nl = memchr(p, '\n', (size_t)(end - p));
        p = nl ? nl : end;
    }
    lexer->cursor = p;
    if (p >= end) return make_token(lexer, IR_TOKEN_EOF, p);

    const char *start = p;
    unsigned char c = (unsigned char)*p;
    if (c == '\n') {
        ir_token t = (ir_token){.kind = IR_TOKEN_NEWLINE, .text = p, .length = 1, .loc = loc_at(lexer, p)};
        lexer->cursor = p + 1;
        lexer->line_start = p + 1;
        if (lexer->line < UINT32_MAX) lexer->line++;
        return t;
    }
    if (is_ident_start(c)) {
        while (p < end && is_ident_char((unsigned char)*p))
            p++;
        lexer->cursor = p;
        return make_token(lexer, IR_TOKEN_IDENT, start);
    }
    if (is_digit(c)) return lex_number(lexer, start);
    if (c == '"') return lex_string(lexer, start);
    if (c == '%') {
        for (p++; p < end && is_value_char((unsigned char)*p); p++) {
        }
        lexer->cursor = p;
        if (p == start + 1) {
            LEX_ERROR(lexer, start, "expected a value name after '%%'");
            return make_token(lexer, IR_TOKEN_ERROR, start);
        }
        return make_token(lexer, IR_TOKEN_VALUE, start);
    }
    if (c == '<' && p + 1 < end && p[1] == '=') {
        lexer->cursor = p + 2;
        return make_token(lexer, IR_TOKEN_LESS_EQUAL, start);
    }
    static const struct {
        char c;
        ir_token_kind kind;
    } punctuation[] = {
        {'{', IR_TOKEN_LBRACE},   {'}', IR_TOKEN_RBRACE},   {'(', IR_TOKEN_LPAREN}, {')', IR_TOKEN_RPAREN},
        {'[', IR_TOKEN_LBRACKET}, {']', IR_TOKEN_RBRACKET}, {',', IR_TOKEN_COMMA},  {'=', IR_TOKEN_EQUAL},
        {':', IR_TOKEN_COLON},    {'?', IR_TOKEN_QUESTION}, {'-', IR_TOKEN_MINUS},
    };
    lexer->cursor = p + 1;
    for (size_t i = 0; i < sizeof punctuation / sizeof punctuation[0]; i++)
        if (punctuation[i].c == (char)c) return make_token(lexer, punctuation[i].kind, start);
    if (c > 0x20 && c < 0x7f)
        LEX_ERROR(lexer, start, "unexpected character '%c'", c);
    else
        LEX_ERROR(lexer, start, "unexpected byte 0x%02x", c);
    return make_token(lexer, IR_TOKEN_ERROR, start);
}

char *ir_token_string(const ir_token *token, arena *a) {
    /* The decoded text is never longer than the quoted one. */
    size_t length = token->length >= 2 ? token->length - 2 : 0;
    char *out = arena_alloc(a, length + 1), *o = out;
    const char *p = token->text + 1, *end = p + length;
    while (p < end) {
        if (*p != '\\' || p + 1 >= end) {
            *o++ = *p++;
            continue;
        }
        switch (p[1]) {
        case 'n':
            *o++ = '\n';
            p += 2;
            break;
        case 't':
            *o++ = '\t';
            p += 2;
            break;
        case 'x':
            if (p + 3 < end && is_hex_digit((unsigned char)p[2]) && is_hex_digit((unsigned char)p[3])) {
                *o++ = (char)(hex_value((unsigned char)p[2]) * 16 + hex_value((unsigned char)p[3]));
                p += 4;
            } else {
                *o++ = *p++;
            }
            break;
        default:
            *o++ = p[1];
            p += 2;
            break; /* \" and \\ */
        }
    }
    *o = '\0';
    return out;
}

char *ir_token_text(const ir_token *token, arena *a) { return arena_strndup(a, token->text, token->length); }
