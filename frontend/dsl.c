/* dsl.c - entry points of the DSL frontend: read a .smelt file, register it
 * with the diag engine (so that errors show the line and a caret), and run
 * the lexer (lexer.l) and parser (parser.y) over it into an ast_model.
 */
#include "ast.h"
#include "parser.h"

#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Larger model descriptions are refused; real ones are a few kilobytes. */
#define FE_DSL_MAX_BYTES ((size_t)64 * 1024 * 1024)

static void report_too_large(diag_engine *d, const char *path) {
    diag_error(d, SMELT_NO_LOC, "'%.*s%s' is larger than 64 MiB, the limit for a model description",
               DIAG_NAME(path));
}

/* Reads all of `path` into a malloc'ed buffer; reports and returns false on
 * failure or when the file is larger than FE_DSL_MAX_BYTES. */
static bool read_file(const char *path, diag_engine *d, char **text, size_t *length) {
    FILE *in = fopen(path, "rb");
    if (!in) {
        diag_error(d, SMELT_NO_LOC, "cannot read '%.*s%s': %s", DIAG_NAME(path), strerror(errno));
        return false;
    }
    /* Reads at most one byte more than the limit, to tell that it is over. */
    size_t capacity = 64 * 1024, used = 0;
    char *buffer = malloc(capacity);
    if (!buffer) {
        fclose(in);
        diag_error(d, SMELT_NO_LOC, "out of memory reading '%.*s%s'", DIAG_NAME(path));
        return false;
    }
    bool ok = true;
    for (;;) {
        if (used == capacity) {
            if (capacity > FE_DSL_MAX_BYTES) {
                report_too_large(d, path);
                ok = false;
                break;
            }
            capacity = capacity * 2 > FE_DSL_MAX_BYTES ? FE_DSL_MAX_BYTES + 1 : capacity * 2;
            char *grown = realloc(buffer, capacity);
            if (!grown) {
                diag_error(d, SMELT_NO_LOC, "out of memory reading '%.*s%s'", DIAG_NAME(path));
                ok = false;
                break;
            }
            buffer = grown;
        }
        size_t n = fread(buffer + used, 1, capacity - used, in);
        used += n;
        if (n == 0) {
            if (ferror(in)) {
                diag_error(d, SMELT_NO_LOC, "cannot read '%.*s%s': %s", DIAG_NAME(path), strerror(errno));
                ok = false;
            }
            break;
        }
    }
    fclose(in);
    if (!ok) {
        free(buffer);
        return false;
    }
    *text = buffer;
    *length = used;
    return true;
}

/* Sets up one parse over `text`, already registered as diag file `file`. */
static void state_init(fe_parse_state *st, diag_engine *d, int32_t file, ast_model *model, const char *text,
                       size_t length) {
    memset(st, 0, sizeof *st);
    st->diag = d;
    st->file = file;
    st->model = model;
    st->text = text;
    st->length = length;
}

bool fe_parse_dsl_text(const char *path, const char *text, size_t length, diag_engine *d, ast_model *out) {
    ast_model_init(out);
    if (length > FE_DSL_MAX_BYTES) {
        report_too_large(d, path);
        return false;
    }
    int32_t file = diag_add_source(d, path, text, length);
    if (file < 0) { /* out of memory: without it, locations would be lost */
        diag_error(d, SMELT_NO_LOC, "out of memory");
        return false;
    }
    fe_parse_state st;
    state_init(&st, d, file, out, text, length);
    arena_recovery recovery;
    if (arena_recovery_enter(&recovery, setjmp(recovery.where))) {
        fe_lexer_close(&st);
        diag_error(d, SMELT_NO_LOC, "out of memory");
        return false;
    }
    out->source_path = arena_strdup(&out->arena, path);
    out->source_file = file;
    if (!fe_lexer_open(&st)) arena_out_of_memory();
    int status = fe_yyparse(&st);
    fe_lexer_close(&st);
    arena_recovery_leave(&recovery);
    /* A parse that failed without a message can only follow a stopped diag
     * engine; it is a failure all the same. */
    return status == 0 && !st.failed && !st.stopped;
}

bool fe_parse_dsl(const char *path, diag_engine *d, ast_model *out) {
    ast_model_init(out);
    char *text;
    size_t length;
    if (!read_file(path, d, &text, &length)) return false;
    bool ok = fe_parse_dsl_text(path, text, length, d, out);
    free(text);
    return ok;
}

/* Writes a token's value the way the DSL spells it (strings re-escaped). */
static void print_value(FILE *out, int kind, const FE_YYSTYPE *value) {
    switch (kind) {
    case TOK_NAME: fprintf(out, " %s", value->text); break;
    case TOK_INT: fprintf(out, " %" PRId64, value->integer); break;
    case TOK_FLOAT: fprintf(out, " %.17g", value->real); break;
    case TOK_STRING:
        fputs(" \"", out);
        for (const char *p = value->text; *p; p++) {
            switch (*p) {
            case '"': fputs("\\\"", out); break;
            case '\\': fputs("\\\\", out); break;
            case '\n': fputs("\\n", out); break;
            case '\t': fputs("\\t", out); break;
            default: fputc(*p, out); break;
            }
        }
        fputc('"', out);
        break;
    default: break;
    }
}

bool fe_dump_dsl_tokens(const char *path, const char *text, size_t length, diag_engine *d, FILE *out) {
    if (length > FE_DSL_MAX_BYTES) {
        report_too_large(d, path);
        return false;
    }
    ast_model scratch; /* holds the names and strings of the tokens */
    ast_model_init(&scratch);
    int32_t file = diag_add_source(d, path, text, length);
    if (file < 0) { /* out of memory: without it, locations would be lost */
        diag_error(d, SMELT_NO_LOC, "out of memory");
        return false;
    }
    fe_parse_state st;
    state_init(&st, d, file, &scratch, text, length);
    arena_recovery recovery;
    if (arena_recovery_enter(&recovery, setjmp(recovery.where))) {
        fe_lexer_close(&st);
        ast_model_free(&scratch);
        diag_error(d, SMELT_NO_LOC, "out of memory");
        return false;
    }
    if (!fe_lexer_open(&st)) arena_out_of_memory();
    FE_YYSTYPE value;
    fe_location loc;
    int kind;
    do {
        memset(&value, 0, sizeof value);
        kind = fe_yylex(&value, &loc, &st);
        fprintf(out, "%" PRIu32 ":%" PRIu32 " %s", loc.first_line, loc.first_column, fe_token_name(kind));
        print_value(out, kind, &value);
        fputc('\n', out);
    } while (kind != TOK_YYEOF);
    fe_lexer_close(&st);
    arena_recovery_leave(&recovery);
    ast_model_free(&scratch);
    return !st.failed && !st.stopped;
}
