/* ast.h - the syntax tree of a model description.
 *
 * Both frontends produce it: the DSL parser (lexer.l, parser.y, dsl.c) and
 * the JSON reader (json_model.c). elaborate.c turns it into an ir_module,
 * evaluating params, unrolling loops and choosing `if` branches. All nodes
 * live in the model's arena.
 *
 * The language (docs/language.md has the full grammar):
 *
 *   model llama {
 *     param hidden_size: int = 4096           # int, float, bool, string, object or list
 *     param layer_types: list[string] = null  # layer_types[l], len(layer_types)
 *     param head_dim: int = hidden_size / num_attention_heads
 *     dim tokens <= 8192                      # symbolic dim with upper bound
 *     input ids: i32[tokens]
 *     weight embed: [vocab_size, hidden_size] = "model.embed_tokens.weight"
 *     let h = embedding(embed, ids)
 *     for l in 0..num_hidden_layers {
 *       weight ln: [hidden_size] = "model.layers.{l}.input_layernorm.weight"
 *       let x = rms_norm(h, ln, eps = rms_norm_eps)
 *       if attention_bias { ... } else { ... }
 *       h = add(h, x)                         # assignment to an existing name
 *     }
 *     weight w1: [n_experts, f, d] = "m.experts.{e}.w1.weight" stacked e
 *     let q, k, v = split(qkv, axis = 1, sizes = [d, d, d])
 *     require hidden_act == "silu", "only SwiGLU is implemented"
 *     ignore "model.layers.*.self_attn.rotary_emb.inv_freq"
 *     output logits = matmul(h, embed)
 *   }
 */
#ifndef SMELT_AST_H
#define SMELT_AST_H

#include "arena.h"
#include "diag.h"
#include "ir.h"

#include <stdbool.h>
#include <stdint.h>

typedef enum ast_expr_kind {
    AST_EXPR_INT,
    AST_EXPR_FLOAT,
    AST_EXPR_BOOL,
    AST_EXPR_STRING, /* string literal */
    AST_EXPR_NULL,   /* null: an object param's "none" */
    AST_EXPR_NAME,   /* reference to a param, loop variable, tensor or dim */
    AST_EXPR_UNARY,  /* -x, !x */
    AST_EXPR_BINARY, /* + - * / % == != < <= > >= && || and a[i] */
    AST_EXPR_CALL,   /* op call (matmul(...)) or scalar function (sqrt, min, max) */
    AST_EXPR_LIST,   /* [a, b, c] */
} ast_expr_kind;

typedef enum ast_operator {
    AST_OP_NEG,
    AST_OP_NOT,
    AST_OP_ADD,
    AST_OP_SUB,
    AST_OP_MUL,
    AST_OP_DIV,
    AST_OP_MOD,
    AST_OP_EQ,
    AST_OP_NE,
    AST_OP_LT,
    AST_OP_LE,
    AST_OP_GT,
    AST_OP_GE,
    AST_OP_AND,
    AST_OP_OR,
    AST_OP_INDEX, /* a[i]: item i of a list (a binary node, lhs the list) */
} ast_operator;

/* Text of an operator as written in the DSL ("-", "!", "+", "==", "&&", ...). */
const char *ast_operator_text(ast_operator op);

typedef struct ast_expr ast_expr;

typedef struct ast_arg {
    const char *keyword; /* NULL for a positional argument */
    ast_expr *value;
    smelt_loc loc;
} ast_arg;

struct ast_expr {
    ast_expr_kind kind;
    smelt_loc loc;
    union {
        int64_t i;
        double f;
        bool b;
        const char *s; /* STRING literal (escapes resolved) or NAME */
        struct {
            ast_operator op;
            ast_expr *operand;
        } unary;
        struct {
            ast_operator op;
            ast_expr *lhs, *rhs;
        } binary;
        struct {
            const char *name;
            ast_arg *args;
            uint32_t arg_count;
        } call;
        struct {
            ast_expr **items;
            uint32_t count;
        } list;
    } as;
};

/* `i32[tokens, hidden]`; dtype NULL when omitted (weights default to f32). */
typedef struct ast_type {
    const char *dtype;
    smelt_loc dtype_loc;
    ast_expr **dims;
    uint32_t rank;
} ast_type;

typedef struct ast_stmt ast_stmt;

typedef struct ast_block {
    ast_stmt **items;
    uint32_t count;
} ast_block;

typedef enum ast_stmt_kind {
    AST_STMT_PARAM,   /* param NAME: TYPE [= expr] */
    AST_STMT_DIM,     /* dim NAME <= expr */
    AST_STMT_INPUT,   /* input NAME: dtype[dims] */
    AST_STMT_WEIGHT,  /* weight NAME: [dtype][dims] = "hf.{l}.name" [stacked VAR] */
    AST_STMT_LET,     /* let a[, b...] = expr */
    AST_STMT_ASSIGN,  /* a[, b...] = expr   (names must exist) */
    AST_STMT_FOR,     /* for VAR in expr..expr { body } */
    AST_STMT_IF,      /* if expr { then } [else { else } | else if ...] */
    AST_STMT_OUTPUT,  /* output NAME = expr */
    AST_STMT_REQUIRE, /* require expr [, "message"]   (a condition the bound params must meet) */
    AST_STMT_IGNORE,  /* ignore "glob"   (checkpoint tensors the model knowingly does not use) */
} ast_stmt_kind;

struct ast_stmt {
    ast_stmt_kind kind;
    smelt_loc loc; /* of the statement's keyword (or first name) */
    union {
        struct {
            const char *name;
            ir_param_type type;
            /* A list param's items: IR_PARAM_INT, FLOAT, BOOL or STRING
             * (`list[string]`), or IR_PARAM_LIST for any of them (`list`). */
            ir_param_type item_type;
            ast_expr *default_value; /* NULL: must come from --config or --set */
        } param;
        struct {
            const char *name;
            ast_expr *bound;
        } dim;
        struct {
            const char *name;
            ast_type type;
        } input;
        struct {
            const char *name; /* the variable */
            ast_type type;
            const char *hf_name; /* template: {var} is replaced by a loop variable's value */
            smelt_loc hf_name_loc;
            const char *stack_var; /* NULL, or the template variable dim 0 indexes */
        } weight;
        struct {
            const char **names;
            smelt_loc *name_locs;
            uint32_t name_count;
            ast_expr *value;
        } let; /* LET and ASSIGN */
        struct {
            const char *var;
            ast_expr *from, *to; /* half-open: from <= var < to */
            ast_block body;
        } loop;
        struct {
            ast_expr *cond;
            ast_block then_body, else_body; /* else_body.count == 0 when absent */
        } branch;
        struct {
            const char *name;
            ast_expr *value;
        } output;
        struct {
            ast_expr *cond;
            const char *message; /* NULL: none */
        } require;
        struct {
            const char *pattern; /* '*' stands for any run of characters without a '.' */
            smelt_loc pattern_loc;
        } ignore;
    } as;
};

typedef struct ast_model {
    arena arena;
    const char *name;
    smelt_loc loc;
    /* The file that locations refer to (for a JSON dump of a DSL model: the
     * DSL file named by its "source" field). */
    const char *source_path;
    int32_t source_file; /* diag file id of source_path */
    ast_block body;
} ast_model;

void ast_model_init(ast_model *model);
void ast_model_free(ast_model *model);

/* Parsers: read `path`, report every error to `d`, return false on any error
 * (the model may then be partly filled and must still be freed). */
bool fe_parse_dsl(const char *path, diag_engine *d, ast_model *out);
/* The same from text in memory; `path` is used for diagnostics. */
bool fe_parse_dsl_text(const char *path, const char *text, size_t length, diag_engine *d, ast_model *out);
/* Debugging aid (and the lexer's tests): writes the DSL token stream of
 * `text` to `out`, one token a line as the parser sees it ("2:3 name x",
 * "2:5 '='", "2:7 integer 42", "2:9 end of line"), up to "end of file".
 * Reports lexical errors to `d`; false on any. */
bool fe_dump_dsl_tokens(const char *path, const char *text, size_t length, diag_engine *d, FILE *out);
bool fe_parse_json(const char *path, diag_engine *d, ast_model *out);
bool fe_parse_json_text(const char *path, const char *text, size_t length, diag_engine *d, ast_model *out);

#endif
