/* ast.c - lifetime of an ast_model and the text of its operators (ast.h). */
#include "ast.h"

#include <string.h>

void ast_model_init(ast_model *model) {
    memset(model, 0, sizeof *model);
    arena_init(&model->arena);
    model->loc = SMELT_NO_LOC;
    model->source_file = -1;
}

void ast_model_free(ast_model *model) {
    arena_free(&model->arena);
    memset(model, 0, sizeof *model);
    model->loc = SMELT_NO_LOC;
    model->source_file = -1;
}

const char *ast_operator_text(ast_operator op) {
    switch (op) {
    case AST_OP_NEG: return "-";
    case AST_OP_NOT: return "!";
    case AST_OP_ADD: return "+";
    case AST_OP_SUB: return "-";
    case AST_OP_MUL: return "*";
    case AST_OP_DIV: return "/";
    case AST_OP_MOD: return "%";
    case AST_OP_EQ: return "==";
    case AST_OP_NE: return "!=";
    case AST_OP_LT: return "<";
    case AST_OP_LE: return "<=";
    case AST_OP_GT: return ">";
    case AST_OP_GE: return ">=";
    case AST_OP_AND: return "&&";
    case AST_OP_OR: return "||";
    case AST_OP_INDEX: return "[]";
    }
    SMELT_DIE("bad ast operator %d", (int)op);
}
