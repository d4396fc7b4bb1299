/* parser.y - the grammar of the smelt DSL; builds the AST of ast.h.
 *
 * Reentrant (api.pure) with locations. Every production below carries its
 * grammar in a comment; docs/language.md has the same grammar for readers.
 * The tokens come from fe_yylex() in lexer.l, which already folds newlines
 * into statement separators (NEWLINE) and caps bracket nesting.
 *
 * Memory: every node, name and string goes into the model's arena, so error
 * recovery never leaks. Lists grow by doubling in the arena while they are
 * parsed and then serve as the AST's arrays as they are.
 *
 * Errors: syntax errors read "expected '}' but found 'weight'" (see
 * yyreport_syntax_error). Recovery works per statement: a bad statement is
 * skipped up to the next separator, the next '{...}' block (so the body of a
 * `for` with a broken header is still checked) or the '}' that closes the
 * enclosing block, so every statement of a file gets looked at.
 *
 * Depth: the AST is walked recursively by the elaborator, so an expression
 * or statement tree deeper than FE_MAX_NESTING (long operator chains,
 * `- - - x`, `else if` chains) is refused with one error and the parse stops.
 * The grammar is left-recursive wherever input may be long, so the parser's
 * own stack stays small whatever the input.
 */
%require "3.6"
%define api.pure full
%define api.prefix {fe_yy}
%define api.token.prefix {TOK_}
%define api.location.type {fe_location}
%define parse.error custom
%define parse.lac full
%locations
%param {fe_parse_state *state}

%code requires {
#include "arena.h"
#include "ast.h"
#include "diag.h"

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A token's or a rule's place in the text: first_* where it starts,
 * last_* just past its end; lines and columns 1-based, columns in bytes. */
typedef struct fe_location {
    uint32_t first_line, first_column, last_line, last_column;
    size_t first_offset, last_offset;
} fe_location;

typedef struct fe_parse_state fe_parse_state;

/* A param's type: `list[string]` is a list of strings (item IR_PARAM_LIST
 * for a plain `list`, whose items may be of any scalar type). */
typedef struct fe_param_type {
    ir_param_type type, item;
} fe_param_type;

/* Semantic values: AST pieces with the depth of the tree they root. */
typedef struct fe_expr {
    ast_expr *node;
    uint32_t depth;
} fe_expr;

typedef struct fe_expr_list {
    ast_expr **items;
    uint32_t count, capacity, depth;
} fe_expr_list;

typedef struct fe_arg_list {
    ast_arg *items;
    uint32_t count, capacity, depth;
} fe_arg_list;

typedef struct fe_name_list {
    const char **names;
    smelt_loc *locs;
    uint32_t count, capacity;
} fe_name_list;

/* `- ! -` before an operand: a chain of unary nodes whose innermost operand
 * is filled in when the operand has been parsed. */
typedef struct fe_prefix_chain {
    ast_expr *outer, *inner;
    uint32_t count;
} fe_prefix_chain;

typedef struct fe_stmt {
    ast_stmt *node;
    uint32_t depth;
} fe_stmt;

typedef struct fe_stmt_list {
    ast_stmt **items;
    uint32_t count, capacity, depth;
} fe_stmt_list;

/* `if a {..} else if b {..}`: built left to right so that a long chain
 * does not grow the parser's stack; `tail` gets the next else branch. */
typedef struct fe_if_chain {
    ast_stmt *head, *tail;
    uint32_t length, depth;
} fe_if_chain;
}

%code provides {
/* Deepest nesting of brackets, braces, expressions and statements. */
enum { FE_MAX_NESTING = 256 };

/* Everything the lexer and the parser share for one parse (flex's yyextra). */
struct fe_parse_state {
    diag_engine *diag;
    int32_t file;        /* diag file id of the text */
    ast_model *model;    /* owns the arena that everything goes into */
    const char *text;    /* the source, for quoting tokens in messages */
    size_t length;
    void *scanner;       /* flex's yyscan_t */

    /* Raw scanner position (lexer.l). */
    uint32_t line, column;
    size_t offset;
    size_t bad_run_end;       /* end offset of the last bad byte reported, or 0 */
    fe_location string_start; /* the opening quote of the string being read */
    char *string_buffer;      /* its text so far, escapes resolved (malloc'ed) */
    char *scan_copy;          /* the text as the scanner reads it (malloc'ed; two NULs end it) */
    size_t string_length, string_capacity;

    /* Token stream shaping (fe_yylex). */
    uint32_t paren_depth; /* open ( and [: newlines inside are whitespace */
    uint32_t brace_depth; /* open { */
    bool has_buffered;    /* a token read behind a NEWLINE, returned next */
    int buffered_kind;
    FE_YYSTYPE buffered_value;
    fe_location buffered_loc;
    bool emitted_any;
    bool at_end; /* end of file was returned: it is returned from now on */
    int last_kind;
    fe_location last_loc;

    bool failed;  /* an error was reported */
    bool stopped; /* nesting limit or error limit reached: no more messages */
};

int fe_yylex(FE_YYSTYPE *value, fe_location *loc, fe_parse_state *state);
int fe_yyparse(fe_parse_state *state);

/* Creates the scanner over state->text (which must outlive it). */
bool fe_lexer_open(fe_parse_state *state);
void fe_lexer_close(fe_parse_state *state);

/* How a token kind reads in messages and token dumps: "'model'", "name". */
const char *fe_token_name(int kind);

static inline smelt_loc fe_loc(const fe_parse_state *st, fe_location l) {
    return (smelt_loc){st->file, l.first_line, l.first_column};
}

/* Reports an error of the text (and marks the parse failed). */
#define FE_ERROR(st, loc, ...) ((st)->failed = true, diag_error((st)->diag, (loc), __VA_ARGS__))
}

%code {
#include <string.h>

/* Rule locations: from the first symbol's start to the last one's end; an
 * empty rule sits at the end of what came before it. */
#define YYLLOC_DEFAULT(Current, Rhs, N)                                                      \
    do {                                                                                     \
        if (N) {                                                                             \
            (Current).first_line = YYRHSLOC(Rhs, 1).first_line;                              \
            (Current).first_column = YYRHSLOC(Rhs, 1).first_column;                          \
            (Current).first_offset = YYRHSLOC(Rhs, 1).first_offset;                          \
            (Current).last_line = YYRHSLOC(Rhs, N).last_line;                                \
            (Current).last_column = YYRHSLOC(Rhs, N).last_column;                            \
            (Current).last_offset = YYRHSLOC(Rhs, N).last_offset;                            \
        } else {                                                                             \
            (Current).first_line = (Current).last_line = YYRHSLOC(Rhs, 0).last_line;         \
            (Current).first_column = (Current).last_column = YYRHSLOC(Rhs, 0).last_column;   \
            (Current).first_offset = (Current).last_offset = YYRHSLOC(Rhs, 0).last_offset;   \
        }                                                                                    \
    } while (0)

/* The nesting caps keep the stack far below this; it is only a backstop. */
#define YYMAXDEPTH 20000

static void fe_yyerror(fe_location *loc, fe_parse_state *state, const char *message);

static ast_expr *new_expr(fe_parse_state *st, ast_expr_kind kind, fe_location loc);
static fe_expr leaf(fe_parse_state *st, ast_expr_kind kind, fe_location loc);
static fe_expr binary(fe_parse_state *st, ast_operator op, fe_location loc, fe_expr lhs, fe_expr rhs);
static ast_stmt *new_stmt(fe_parse_state *st, ast_stmt_kind kind, fe_location loc);
static bool within_nesting(fe_parse_state *st, uint32_t depth, smelt_loc loc);
static void expr_append(fe_parse_state *st, fe_expr_list *list, fe_expr item);
static void arg_append(fe_parse_state *st, fe_arg_list *list, const char *keyword,
                       fe_expr value, smelt_loc loc);
static void name_append(fe_parse_state *st, fe_name_list *list, const char *name, smelt_loc loc);
static void stmt_append(fe_parse_state *st, fe_stmt_list *list, fe_stmt stmt);
static ast_block block_of(fe_stmt_list list);
static ast_type type_of(fe_parse_state *st, const char *dtype, fe_location dtype_loc,
                        fe_expr_list dims);

/* Leaves yyparse when a tree is too deep (the error is already reported). */
#define CHECK_DEPTH(depth, loc)                                                              \
    do {                                                                                     \
        if (!within_nesting(state, (depth), (loc))) YYABORT;                                 \
    } while (0)
#define MAX(a, b) ((a) > (b) ? (a) : (b))
}

%union {
    int64_t integer;
    double real;
    const char *text;
    fe_param_type param_type;
    ast_type type;
    fe_expr expr;
    fe_expr_list exprs;
    fe_arg_list args;
    fe_name_list names;
    fe_prefix_chain prefix;
    fe_stmt stmt;
    fe_stmt_list stmts;
    fe_if_chain chain;
}

/* Aliases are how tokens read in messages. */
%token MODEL "'model'" PARAM "'param'" DIM "'dim'" INPUT "'input'" WEIGHT "'weight'"
%token LET "'let'" FOR "'for'" IN "'in'" IF "'if'" ELSE "'else'" OUTPUT "'output'"
%token STACKED "'stacked'" TRUE "'true'" FALSE "'false'" REQUIRE "'require'" IGNORE "'ignore'"
%token TYPE_INT "'int'" TYPE_FLOAT "'float'" TYPE_BOOL "'bool'" TYPE_STRING "'string'"
%token TYPE_OBJECT "'object'" TYPE_LIST "'list'" NULL_VALUE "'null'"
%token DOTDOT "'..'" LE "'<='" GE "'>='" EQ "'=='" NE "'!='" AND "'&&'" OR "'||'"
%token NEWLINE "end of line"
%token <text> NAME "name"
%token <text> STRING "string"
%token <integer> INT "integer"
%token <real> FLOAT "float"

%type <stmts> block stmt_list
%type <stmt> stmt
%type <chain> if_chain
%type <param_type> param_type scalar_type
%type <type> type
%type <names> names
%type <expr> expr unary postfix primary
%type <prefix> prefix_ops
%type <exprs> exprs_opt exprs
%type <args> args_opt args

/* Loosest first; the usual C precedence. */
%left OR
%left AND
%left EQ NE
%left '<' LE '>' GE
%left '+' '-'
%left '*' '/' '%'

%start file

%%

/* file := model-decl { sep }
 * (newlines before the model never reach the parser) */
file
    : model_decl seps_opt
    ;

/* model-decl := "model" NAME block
 * A broken header is skipped up to the '{', and the body still checked. */
model_decl
    : MODEL NAME block {
        state->model->name = $2;
        state->model->loc = fe_loc(state, @1);
        state->model->body = block_of($3);
    }
    | error block
    ;

/* block := "{" { sep } [ stmt { sep { sep } stmt } ] { sep } "}"
 * A statement that fails to parse is skipped (bad_stmt). */
block
    : '{' stmt_list '}'            { $$ = $2; }
    | '{' stmt_list stmt '}'       { $$ = $2; stmt_append(state, &$$, $3); }
    | '{' stmt_list bad_stmt '}'   { $$ = $2; yyerrok; }
    ;

/* Statements so far, each ended by a separator. */
stmt_list
    : %empty                       { $$ = (fe_stmt_list){0}; }
    | stmt_list sep                { $$ = $1; }
    | stmt_list stmt sep           { $$ = $1; stmt_append(state, &$$, $2); }
    | stmt_list bad_stmt sep       { $$ = $1; yyerrok; }
    ;

/* Error recovery: the tokens of a broken statement up to a separator or
 * the '}' of its block; a '{' on the way opens a block that is parsed (and
 * checked) as usual, then dropped, with its `else` branches. Once the
 * statement is over (yyerrok), the next error is reported at once. */
bad_stmt
    : error
    | error block
    | bad_stmt ELSE block
    | bad_stmt ELSE IF expr block
    ;

/* sep := NEWLINE | ";" */
sep
    : NEWLINE
    | ';'
    ;

/* { sep } */
seps_opt
    : %empty
    | seps_opt sep
    ;

stmt
    /* param-stmt := "param" NAME ":" param-type [ "=" expr ] */
    : PARAM NAME ':' param_type {
        ast_stmt *s = new_stmt(state, AST_STMT_PARAM, @1);
        s->as.param.name = $2;
        s->as.param.type = $4.type;
        s->as.param.item_type = $4.item;
        $$ = (fe_stmt){s, 1};
    }
    | PARAM NAME ':' param_type '=' expr {
        ast_stmt *s = new_stmt(state, AST_STMT_PARAM, @1);
        s->as.param.name = $2;
        s->as.param.type = $4.type;
        s->as.param.item_type = $4.item;
        s->as.param.default_value = $6.node;
        $$ = (fe_stmt){s, 1};
    }
    /* dim-stmt := "dim" NAME "<=" expr */
    | DIM NAME LE expr {
        ast_stmt *s = new_stmt(state, AST_STMT_DIM, @1);
        s->as.dim.name = $2;
        s->as.dim.bound = $4.node;
        $$ = (fe_stmt){s, 1};
    }
    /* input-stmt := "input" NAME ":" type */
    | INPUT NAME ':' type {
        ast_stmt *s = new_stmt(state, AST_STMT_INPUT, @1);
        s->as.input.name = $2;
        s->as.input.type = $4;
        $$ = (fe_stmt){s, 1};
    }
    /* weight-stmt := "weight" NAME ":" type "=" STRING [ "stacked" NAME ] */
    | WEIGHT NAME ':' type '=' STRING {
        ast_stmt *s = new_stmt(state, AST_STMT_WEIGHT, @1);
        s->as.weight.name = $2;
        s->as.weight.type = $4;
        s->as.weight.hf_name = $6;
        s->as.weight.hf_name_loc = fe_loc(state, @6);
        $$ = (fe_stmt){s, 1};
    }
    | WEIGHT NAME ':' type '=' STRING STACKED NAME {
        ast_stmt *s = new_stmt(state, AST_STMT_WEIGHT, @1);
        s->as.weight.name = $2;
        s->as.weight.type = $4;
        s->as.weight.hf_name = $6;
        s->as.weight.hf_name_loc = fe_loc(state, @6);
        s->as.weight.stack_var = $8;
        $$ = (fe_stmt){s, 1};
    }
    /* let-stmt := "let" names "=" expr */
    | LET names '=' expr {
        ast_stmt *s = new_stmt(state, AST_STMT_LET, @1);
        s->as.let.names = $2.names;
        s->as.let.name_locs = $2.locs;
        s->as.let.name_count = $2.count;
        s->as.let.value = $4.node;
        $$ = (fe_stmt){s, 1};
    }
    /* assign-stmt := names "=" expr */
    | names '=' expr {
        ast_stmt *s = new_stmt(state, AST_STMT_ASSIGN, @1);
        s->as.let.names = $1.names;
        s->as.let.name_locs = $1.locs;
        s->as.let.name_count = $1.count;
        s->as.let.value = $3.node;
        $$ = (fe_stmt){s, 1};
    }
    /* for-stmt := "for" NAME "in" expr ".." expr block */
    | FOR NAME IN expr DOTDOT expr block {
        ast_stmt *s = new_stmt(state, AST_STMT_FOR, @1);
        s->as.loop.var = $2;
        s->as.loop.from = $4.node;
        s->as.loop.to = $6.node;
        s->as.loop.body = block_of($7);
        $$ = (fe_stmt){s, $7.depth + 1};
        CHECK_DEPTH($$.depth, fe_loc(state, @1));
    }
    /* if-stmt := "if" expr block { "else" "if" expr block } [ "else" block ] */
    | if_chain {
        $$ = (fe_stmt){$1.head, $1.depth};
    }
    | if_chain ELSE block {
        $1.tail->as.branch.else_body = block_of($3);
        $1.depth = MAX($1.depth, $1.length + $3.depth);
        $$ = (fe_stmt){$1.head, $1.depth};
        CHECK_DEPTH($$.depth, fe_loc(state, @2));
    }
    /* output-stmt := "output" NAME "=" expr */
    | OUTPUT NAME '=' expr {
        ast_stmt *s = new_stmt(state, AST_STMT_OUTPUT, @1);
        s->as.output.name = $2;
        s->as.output.value = $4.node;
        $$ = (fe_stmt){s, 1};
    }
    /* require-stmt := "require" expr [ "," STRING ] */
    | REQUIRE expr {
        ast_stmt *s = new_stmt(state, AST_STMT_REQUIRE, @1);
        s->as.require.cond = $2.node;
        $$ = (fe_stmt){s, 1};
    }
    | REQUIRE expr ',' STRING {
        ast_stmt *s = new_stmt(state, AST_STMT_REQUIRE, @1);
        s->as.require.cond = $2.node;
        s->as.require.message = $4;
        $$ = (fe_stmt){s, 1};
    }
    /* ignore-stmt := "ignore" STRING */
    | IGNORE STRING {
        ast_stmt *s = new_stmt(state, AST_STMT_IGNORE, @1);
        s->as.ignore.pattern = $2;
        s->as.ignore.pattern_loc = fe_loc(state, @2);
        $$ = (fe_stmt){s, 1};
    }
    ;

/* The `if` and `else if` parts of an if-stmt. An `else if` is an `if`
 * statement alone in the else branch of the one before it. */
if_chain
    : IF expr block {
        ast_stmt *s = new_stmt(state, AST_STMT_IF, @1);
        s->as.branch.cond = $2.node;
        s->as.branch.then_body = block_of($3);
        $$ = (fe_if_chain){s, s, 1, $3.depth + 1};
        CHECK_DEPTH($$.depth, fe_loc(state, @1));
    }
    | if_chain ELSE IF expr block {
        ast_stmt *s = new_stmt(state, AST_STMT_IF, @3);
        s->as.branch.cond = $4.node;
        s->as.branch.then_body = block_of($5);
        ast_stmt **items = arena_array(&state->model->arena, 1, sizeof *items);
        items[0] = s;
        $1.tail->as.branch.else_body = (ast_block){items, 1};
        $$ = $1;
        $$.tail = s;
        $$.length++;
        $$.depth = MAX($$.depth, $$.length + $5.depth);
        CHECK_DEPTH($$.depth, fe_loc(state, @3));
    }
    ;

/* param-type := scalar-type | "object" | "list" [ "[" scalar-type "]" ] */
param_type
    : scalar_type                        { $$ = $1; }
    | TYPE_OBJECT                        { $$ = (fe_param_type){IR_PARAM_OBJECT, IR_PARAM_OBJECT}; }
    | TYPE_LIST                          { $$ = (fe_param_type){IR_PARAM_LIST, IR_PARAM_LIST}; }
    | TYPE_LIST '[' scalar_type ']'      { $$ = (fe_param_type){IR_PARAM_LIST, $3.type}; }
    ;

/* scalar-type := "int" | "float" | "bool" | "string" */
scalar_type
    : TYPE_INT     { $$ = (fe_param_type){IR_PARAM_INT, IR_PARAM_INT}; }
    | TYPE_FLOAT   { $$ = (fe_param_type){IR_PARAM_FLOAT, IR_PARAM_FLOAT}; }
    | TYPE_BOOL    { $$ = (fe_param_type){IR_PARAM_BOOL, IR_PARAM_BOOL}; }
    | TYPE_STRING  { $$ = (fe_param_type){IR_PARAM_STRING, IR_PARAM_STRING}; }
    ;

/* type := [ NAME ] "[" [ expr { "," expr } [ "," ] ] "]"
 * NAME is the dtype (f32, bf16, i32, ...), checked by the elaborator. */
type
    : '[' exprs_opt ']'          { $$ = type_of(state, NULL, @1, $2); }
    | NAME '[' exprs_opt ']'     { $$ = type_of(state, $1, @1, $3); }
    ;

/* names := NAME { "," NAME } */
names
    : NAME                       { $$ = (fe_name_list){0}; name_append(state, &$$, $1, fe_loc(state, @1)); }
    | names ',' NAME             { $$ = $1; name_append(state, &$$, $3, fe_loc(state, @3)); }
    ;

/* expr := unary | expr binary-op expr
 * binary-op, loosest first: "||"; "&&"; "==" "!="; "<" "<=" ">" ">=";
 * "+" "-"; "*" "/" "%". All associate to the left. A binary node is
 * located at its operator. */
expr
    : unary                      { $$ = $1; }
    | expr OR expr               { $$ = binary(state, AST_OP_OR, @2, $1, $3); CHECK_DEPTH($$.depth, $$.node->loc); }
    | expr AND expr              { $$ = binary(state, AST_OP_AND, @2, $1, $3); CHECK_DEPTH($$.depth, $$.node->loc); }
    | expr EQ expr               { $$ = binary(state, AST_OP_EQ, @2, $1, $3); CHECK_DEPTH($$.depth, $$.node->loc); }
    | expr NE expr               { $$ = binary(state, AST_OP_NE, @2, $1, $3); CHECK_DEPTH($$.depth, $$.node->loc); }
    | expr '<' expr              { $$ = binary(state, AST_OP_LT, @2, $1, $3); CHECK_DEPTH($$.depth, $$.node->loc); }
    | expr LE expr               { $$ = binary(state, AST_OP_LE, @2, $1, $3); CHECK_DEPTH($$.depth, $$.node->loc); }
    | expr '>' expr              { $$ = binary(state, AST_OP_GT, @2, $1, $3); CHECK_DEPTH($$.depth, $$.node->loc); }
    | expr GE expr               { $$ = binary(state, AST_OP_GE, @2, $1, $3); CHECK_DEPTH($$.depth, $$.node->loc); }
    | expr '+' expr              { $$ = binary(state, AST_OP_ADD, @2, $1, $3); CHECK_DEPTH($$.depth, $$.node->loc); }
    | expr '-' expr              { $$ = binary(state, AST_OP_SUB, @2, $1, $3); CHECK_DEPTH($$.depth, $$.node->loc); }
    | expr '*' expr              { $$ = binary(state, AST_OP_MUL, @2, $1, $3); CHECK_DEPTH($$.depth, $$.node->loc); }
    | expr '/' expr              { $$ = binary(state, AST_OP_DIV, @2, $1, $3); CHECK_DEPTH($$.depth, $$.node->loc); }
    | expr '%' expr              { $$ = binary(state, AST_OP_MOD, @2, $1, $3); CHECK_DEPTH($$.depth, $$.node->loc); }
    ;

/* unary := { "-" | "!" } postfix */
unary
    : postfix                    { $$ = $1; }
    | prefix_ops postfix {
        $1.inner->as.unary.operand = $2.node;
        $$ = (fe_expr){$1.outer, $1.count + $2.depth};
        CHECK_DEPTH($$.depth, $1.outer->loc);
    }
    ;

/* The prefix operators of a unary, kept as a list (not nested rules) so
 * that `- - - ... x` does not grow the parser's stack. */
prefix_ops
    : '-'                        { ast_expr *e = new_expr(state, AST_EXPR_UNARY, @1); e->as.unary.op = AST_OP_NEG; $$ = (fe_prefix_chain){e, e, 1}; }
    | '!'                        { ast_expr *e = new_expr(state, AST_EXPR_UNARY, @1); e->as.unary.op = AST_OP_NOT; $$ = (fe_prefix_chain){e, e, 1}; }
    | prefix_ops '-' {
        ast_expr *e = new_expr(state, AST_EXPR_UNARY, @2);
        e->as.unary.op = AST_OP_NEG;
        $1.inner->as.unary.operand = e;
        $$ = (fe_prefix_chain){$1.outer, e, $1.count + 1};
        CHECK_DEPTH($$.count, fe_loc(state, @2));
    }
    | prefix_ops '!' {
        ast_expr *e = new_expr(state, AST_EXPR_UNARY, @2);
        e->as.unary.op = AST_OP_NOT;
        $1.inner->as.unary.operand = e;
        $$ = (fe_prefix_chain){$1.outer, e, $1.count + 1};
        CHECK_DEPTH($$.count, fe_loc(state, @2));
    }
    ;

/* postfix := primary { "[" expr "]" }
 * An index node is located at its '['. */
postfix
    : primary                    { $$ = $1; }
    | postfix '[' expr ']'       { $$ = binary(state, AST_OP_INDEX, @2, $1, $3); CHECK_DEPTH($$.depth, $$.node->loc); }
    ;

/* primary := INT | FLOAT | STRING | "true" | "false" | "null" | NAME
 *          | NAME "(" [ arg { "," arg } [ "," ] ] ")"
 *          | "(" expr ")"
 *          | "[" [ expr { "," expr } [ "," ] ] "]" */
primary
    : INT                        { $$ = leaf(state, AST_EXPR_INT, @1); $$.node->as.i = $1; }
    | FLOAT                      { $$ = leaf(state, AST_EXPR_FLOAT, @1); $$.node->as.f = $1; }
    | STRING                     { $$ = leaf(state, AST_EXPR_STRING, @1); $$.node->as.s = $1; }
    | TRUE                       { $$ = leaf(state, AST_EXPR_BOOL, @1); $$.node->as.b = true; }
    | FALSE                      { $$ = leaf(state, AST_EXPR_BOOL, @1); $$.node->as.b = false; }
    | NULL_VALUE                 { $$ = leaf(state, AST_EXPR_NULL, @1); }
    | NAME                       { $$ = leaf(state, AST_EXPR_NAME, @1); $$.node->as.s = $1; }
    | NAME '(' args_opt ')' {
        ast_expr *e = new_expr(state, AST_EXPR_CALL, @1);
        e->as.call.name = $1;
        e->as.call.args = $3.items;
        e->as.call.arg_count = $3.count;
        $$ = (fe_expr){e, $3.depth + 1};
        CHECK_DEPTH($$.depth, e->loc);
    }
    | '(' expr ')'               { $$ = $2; }
    | '[' exprs_opt ']' {
        ast_expr *e = new_expr(state, AST_EXPR_LIST, @1);
        e->as.list.items = $2.items;
        e->as.list.count = $2.count;
        $$ = (fe_expr){e, $2.depth + 1};
        CHECK_DEPTH($$.depth, e->loc);
    }
    ;

/* Items of a list or dims of a type; a trailing comma is allowed. */
exprs_opt
    : %empty                     { $$ = (fe_expr_list){0}; }
    | exprs                      { $$ = $1; }
    | exprs ','                  { $$ = $1; }
    ;

/* expr { "," expr } */
exprs
    : expr                       { $$ = (fe_expr_list){0}; expr_append(state, &$$, $1); }
    | exprs ',' expr             { $$ = $1; expr_append(state, &$$, $3); }
    ;

/* arg := expr | NAME "=" expr
 * An argument is located at its keyword, or at its value's first token. */
args_opt
    : %empty                     { $$ = (fe_arg_list){0}; }
    | args                       { $$ = $1; }
    | args ','                   { $$ = $1; }
    ;

/* arg { "," arg } */
args
    : expr                       { $$ = (fe_arg_list){0}; arg_append(state, &$$, NULL, $1, fe_loc(state, @1)); }
    | NAME '=' expr              { $$ = (fe_arg_list){0}; arg_append(state, &$$, $1, $3, fe_loc(state, @1)); }
    | args ',' expr              { $$ = $1; arg_append(state, &$$, NULL, $3, fe_loc(state, @3)); }
    | args ',' NAME '=' expr     { $$ = $1; arg_append(state, &$$, $3, $5, fe_loc(state, @3)); }
    ;

%%

/* ---- building the tree ----------------------------------------------------- */

static ast_expr *new_expr(fe_parse_state *st, ast_expr_kind kind, fe_location loc) {
    ast_expr *e = arena_alloc(&st->model->arena, sizeof *e);
    e->kind = kind;
    e->loc = fe_loc(st, loc);
    return e;
}

static fe_expr leaf(fe_parse_state *st, ast_expr_kind kind, fe_location loc) {
    return (fe_expr){new_expr(st, kind, loc), 1};
}

static fe_expr binary(fe_parse_state *st, ast_operator op, fe_location loc, fe_expr lhs, fe_expr rhs) {
    ast_expr *e = new_expr(st, AST_EXPR_BINARY, loc);
    e->as.binary.op = op;
    e->as.binary.lhs = lhs.node;
    e->as.binary.rhs = rhs.node;
    return (fe_expr){e, MAX(lhs.depth, rhs.depth) + 1};
}

static ast_stmt *new_stmt(fe_parse_state *st, ast_stmt_kind kind, fe_location loc) {
    ast_stmt *s = arena_alloc(&st->model->arena, sizeof *s);
    s->kind = kind;
    s->loc = fe_loc(st, loc);
    return s;
}

static bool within_nesting(fe_parse_state *st, uint32_t depth, smelt_loc loc) {
    if (depth <= FE_MAX_NESTING) return true;
    if (!st->stopped) FE_ERROR(st, loc, "nesting deeper than %d levels", FE_MAX_NESTING);
    st->stopped = true;
    return false;
}

/* Room for one more element in an arena array that doubles as it grows. */
static void *reserve(fe_parse_state *st, void *items, uint32_t count, uint32_t *capacity,
                     size_t elem_size) {
    if (count < *capacity) return items;
    if (*capacity > UINT32_MAX / 2) SMELT_DIE("list of %u items", count);
    uint32_t grown = *capacity ? *capacity * 2 : 4;
    *capacity = grown;
    return arena_grow(&st->model->arena, items, count, grown, elem_size);
}

static void expr_append(fe_parse_state *st, fe_expr_list *list, fe_expr item) {
    list->items = reserve(st, list->items, list->count, &list->capacity, sizeof *list->items);
    list->items[list->count++] = item.node;
    list->depth = MAX(list->depth, item.depth);
}

static void arg_append(fe_parse_state *st, fe_arg_list *list, const char *keyword,
                       fe_expr value, smelt_loc loc) {
    list->items = reserve(st, list->items, list->count, &list->capacity, sizeof *list->items);
    list->items[list->count++] = (ast_arg){keyword, value.node, loc};
    list->depth = MAX(list->depth, value.depth);
}

static void name_append(fe_parse_state *st, fe_name_list *list, const char *name, smelt_loc loc) {
    uint32_t capacity = list->capacity; /* names and locs grow together */
    list->names = reserve(st, list->names, list->count, &capacity, sizeof *list->names);
    list->locs = reserve(st, list->locs, list->count, &list->capacity, sizeof *list->locs);
    list->names[list->count] = name;
    list->locs[list->count++] = loc;
}

static void stmt_append(fe_parse_state *st, fe_stmt_list *list, fe_stmt stmt) {
    list->items = reserve(st, list->items, list->count, &list->capacity, sizeof *list->items);
    list->items[list->count++] = stmt.node;
    list->depth = MAX(list->depth, stmt.depth);
}

static ast_block block_of(fe_stmt_list list) { return (ast_block){list.items, list.count}; }

static ast_type type_of(fe_parse_state *st, const char *dtype, fe_location dtype_loc,
                        fe_expr_list dims) {
    return (ast_type){dtype, fe_loc(st, dtype_loc), dims.items, dims.count};
}


/* ---- syntax errors --------------------------------------------------------- */

const char *fe_token_name(int kind) { return yysymbol_name(YYTRANSLATE(kind)); }

static bool starts_expression(yysymbol_kind_t s) {
    switch (s) {
    case YYSYMBOL_INT: case YYSYMBOL_FLOAT: case YYSYMBOL_STRING: case YYSYMBOL_TRUE:
    case YYSYMBOL_FALSE: case YYSYMBOL_NULL_VALUE: case YYSYMBOL_NAME:
        return true;
    default:
        return s == YYTRANSLATE('(') || s == YYTRANSLATE('[') || s == YYTRANSLATE('-') ||
               s == YYTRANSLATE('!');
    }
}

static bool starts_statement(yysymbol_kind_t s) {
    switch (s) {
    case YYSYMBOL_PARAM: case YYSYMBOL_DIM: case YYSYMBOL_INPUT: case YYSYMBOL_WEIGHT:
    case YYSYMBOL_LET: case YYSYMBOL_FOR: case YYSYMBOL_IF: case YYSYMBOL_OUTPUT:
    case YYSYMBOL_REQUIRE: case YYSYMBOL_IGNORE: case YYSYMBOL_NAME:
        return true;
    default:
        return false;
    }
}

static bool is_binary_operator(yysymbol_kind_t s) {
    switch (s) {
    case YYSYMBOL_OR: case YYSYMBOL_AND: case YYSYMBOL_EQ: case YYSYMBOL_NE: case YYSYMBOL_LE:
    case YYSYMBOL_GE:
        return true;
    default:
        return s == YYTRANSLATE('<') || s == YYTRANSLATE('>') || s == YYTRANSLATE('+') ||
               s == YYTRANSLATE('-') || s == YYTRANSLATE('*') || s == YYTRANSLATE('/') ||
               s == YYTRANSLATE('%');
    }
}

static bool is_separator(yysymbol_kind_t s) {
    return s == YYSYMBOL_NEWLINE || s == YYTRANSLATE(';');
}

/* "name 'x'", "integer '42'", "'weight'", "end of line": the token found
 * where something else was expected, quoted from the source. */
static void describe_found(const fe_parse_state *st, yysymbol_kind_t s, fe_location loc,
                           char *buffer, size_t size) {
    const char *what = yysymbol_name(s);
    bool quote_source = s == YYSYMBOL_NAME || s == YYSYMBOL_INT || s == YYSYMBOL_FLOAT ||
                        s == YYSYMBOL_STRING;
    if (!quote_source || loc.last_offset > st->length || loc.first_offset >= loc.last_offset) {
        snprintf(buffer, size, "%s", what);
        return;
    }
    size_t length = loc.last_offset - loc.first_offset;
    const char *text = st->text + loc.first_offset;
    int shown = (int)(length > DIAG_NAME_MAX ? DIAG_NAME_MAX : length);
    if (s == YYSYMBOL_STRING)
        snprintf(buffer, size, "%s %.*s%s", what, shown, text, length > DIAG_NAME_MAX ? "..." : "");
    else
        snprintf(buffer, size, "%s '%.*s%s'", what, shown, text, length > DIAG_NAME_MAX ? "..." : "");
}

/* "expected A, B or C but found X". Token classes are named as a whole
 * ("statement", "expression"); binary operators and an index's '[', which
 * could always continue an expression, are left out. */
static int yyreport_syntax_error(const yypcontext_t *ctx, fe_parse_state *state) {
    if (state->stopped) return 0;
    yysymbol_kind_t expected[YYNTOKENS];
    int count = yypcontext_expected_tokens(ctx, expected, YYNTOKENS);
    if (count < 0) count = 0;
    bool statement = false, expression = false, separator = false, end = false, after_expr = false;
    for (int i = 0; i < count; i++) {
        after_expr |= is_binary_operator(expected[i]);
        statement |= expected[i] == YYSYMBOL_PARAM;
        expression |= expected[i] == YYSYMBOL_INT;
        separator |= is_separator(expected[i]);
        end |= expected[i] == YYSYMBOL_YYEOF;
    }
    if (end && yypcontext_token(ctx) == YYSYMBOL_MODEL) {
        FE_ERROR(state, fe_loc(state, *yypcontext_location(ctx)),
                 "expected end of file but found 'model': a file holds one model");
        return 0;
    }
    const char *names[YYNTOKENS + 3];
    int n = 0;
    if (statement) names[n++] = "statement";
    if (expression) names[n++] = "expression";
    /* At the end of the file the line has ended anyway. */
    bool at_end_of_file = yypcontext_token(ctx) == YYSYMBOL_YYEOF;
    if (separator && !statement && !end && !at_end_of_file) names[n++] = "end of line";
    for (int i = 0; i < count; i++) {
        yysymbol_kind_t s = expected[i];
        if ((statement && starts_statement(s)) || (expression && starts_expression(s)) ||
            is_separator(s) || is_binary_operator(s))
            continue;
        /* After an expression '[' (an index) could continue it, like an operator. */
        if (after_expr && s == YYTRANSLATE('[')) continue;
        names[n++] = yysymbol_name(s);
    }
    char found[3 * DIAG_NAME_MAX];
    fe_location loc = *yypcontext_location(ctx);
    describe_found(state, yypcontext_token(ctx), loc, found, sizeof found);
    smelt_loc at = fe_loc(state, loc);
    if (n == 0 || n > 6) {
        FE_ERROR(state, at, "unexpected %s", found);
        return 0;
    }
    char list[512];
    size_t used = 0;
    list[0] = '\0';
    for (int i = 0; i < n; i++) {
        const char *join = i == 0 ? "" : i == n - 1 ? " or " : ", ";
        int w = snprintf(list + used, sizeof list - used, "%s%s", join, names[i]);
        if (w < 0 || (size_t)w >= sizeof list - used) break;
        used += (size_t)w;
    }
    FE_ERROR(state, at, "expected %s but found %s", list, found);
    return 0;
}

/* Bison's own errors: only "memory exhausted" (its stack), which the
 * nesting caps should make impossible; reported as what it means. */
static void fe_yyerror(fe_location *loc, fe_parse_state *state, const char *message) {
    if (state->stopped) return;
    if (strstr(message, "exhausted"))
        FE_ERROR(state, fe_loc(state, *loc), "nesting deeper than %d levels", FE_MAX_NESTING);
    else
        FE_ERROR(state, fe_loc(state, *loc), "%s", message);
    state->stopped = true;
}
