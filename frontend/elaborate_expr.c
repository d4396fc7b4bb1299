/* elaborate_expr.c - evaluating expressions: literals, names, lists, the
 * arithmetic of params and loop variables, list indexing, and the scalar
 * functions sqrt, min, max and len. Op calls are handed to elaborate_call.c.
 *
 * Integers are 64-bit with every overflow an error (and C's truncating / and
 * %); a float anywhere makes the result a float; comparisons give bools.
 */
#include "elaborate.h"

#include <math.h>
#include <string.h>

const char *fe_dim_name(const fe_elaborator *el, const fe_value *v) {
    if (v->kind != FE_VALUE_DIM || v->as.dim < 0 || (uint32_t)v->as.dim >= el->module->symbol_count)
        return "?";
    return el->module->symbols[v->as.dim].name;
}

static bool is_number(const fe_value *v) { return v->kind == FE_VALUE_INT || v->kind == FE_VALUE_FLOAT; }
static double number_of(const fe_value *v) { return v->kind == FE_VALUE_INT ? (double)v->as.i : v->as.f; }

/* A symbolic dim has no value to compute with: say so, naming it. */
static bool refuse_dim(fe_elaborator *el, const fe_value *v, smelt_loc loc) {
    if (v->kind != FE_VALUE_DIM) return false;
    const char *name = fe_dim_name(el, v);
    fe_error(el, loc, "'%.*s%s' is a symbolic dim; use it only as a dim of a shape", DIAG_NAME(name));
    return true;
}

static fe_value eval_name(fe_elaborator *el, const ast_expr *e) {
    const fe_binding_entry *b = fe_name_map_get(&el->names, e->as.s);
    if (b) return b->value;
    if (!el->skipped_code) fe_error(el, e->loc, "'%.*s%s' is not defined", DIAG_NAME(e->as.s));
    return fe_error_value();
}

static fe_value eval_list(fe_elaborator *el, const ast_expr *e) {
    fe_value list = {.kind = FE_VALUE_LIST};
    list.as.list.count = e->as.list.count;
    list.as.list.items = arena_array(&el->scratch, e->as.list.count ? e->as.list.count : 1, sizeof(fe_value));
    bool poisoned = false;
    for (uint32_t i = 0; i < e->as.list.count; i++) {
        list.as.list.items[i] = fe_eval_expr(el, e->as.list.items[i]);
        if (list.as.list.items[i].kind == FE_VALUE_RESULTS) {
            fe_error(el, e->as.list.items[i]->loc,
                     "a list entry must be one value, found %u results of an op",
                     list.as.list.items[i].as.results.count);
            list.as.list.items[i] = fe_error_value();
        }
        if (list.as.list.items[i].kind == FE_VALUE_ERROR) poisoned = true;
    }
    return poisoned ? fe_error_value() : list;
}

/* ---- arithmetic ---------------------------------------------------------- */

static fe_value checked_float(fe_elaborator *el, const ast_expr *e, double r) {
    if (isfinite(r)) return fe_float_value(r);
    fe_error(el, e->loc, "'%s' gives a result too large for a float", ast_operator_text(e->as.binary.op));
    return fe_error_value();
}

static fe_value int_arithmetic(fe_elaborator *el, const ast_expr *e, int64_t a, int64_t b) {
    ast_operator op = e->as.binary.op;
    int64_t r = 0;
    bool overflow = false;
    switch (op) {
    case AST_OP_ADD: overflow = __builtin_add_overflow(a, b, &r); break;
    case AST_OP_SUB: overflow = __builtin_sub_overflow(a, b, &r); break;
    case AST_OP_MUL: overflow = __builtin_mul_overflow(a, b, &r); break;
    case AST_OP_DIV:
    case AST_OP_MOD:
        if (b == 0) {
            fe_error(el, e->loc, "'%s' by zero: %lld %s 0", ast_operator_text(op), (long long)a,
                     ast_operator_text(op));
            return fe_error_value();
        }
        if (a == INT64_MIN && b == -1) {
            if (op == AST_OP_MOD) return fe_int_value(0);
            overflow = true;
            break;
        }
        r = op == AST_OP_DIV ? a / b : a % b;
        break;
    default: SMELT_DIE("operator %d is not arithmetic", (int)op);
    }
    if (overflow) {
        fe_error(el, e->loc, "integer overflow: %lld %s %lld does not fit in 64 bits", (long long)a,
                 ast_operator_text(op), (long long)b);
        return fe_error_value();
    }
    return fe_int_value(r);
}

static fe_value float_arithmetic(fe_elaborator *el, const ast_expr *e, double a, double b) {
    ast_operator op = e->as.binary.op;
    switch (op) {
    case AST_OP_ADD: return checked_float(el, e, a + b);
    case AST_OP_SUB: return checked_float(el, e, a - b);
    case AST_OP_MUL: return checked_float(el, e, a * b);
    case AST_OP_DIV:
    case AST_OP_MOD:
        if (b == 0) {
            fe_error(el, e->loc, "'%s' by zero: %g %s 0", ast_operator_text(op), a, ast_operator_text(op));
            return fe_error_value();
        }
        return checked_float(el, e, op == AST_OP_DIV ? a / b : fmod(a, b));
    default: SMELT_DIE("operator %d is not arithmetic", (int)op);
    }
}

static bool compare_numbers(ast_operator op, const fe_value *x, const fe_value *y) {
    if (x->kind == FE_VALUE_INT && y->kind == FE_VALUE_INT) {
        int64_t a = x->as.i, b = y->as.i;
        switch (op) {
        case AST_OP_EQ: return a == b;
        case AST_OP_NE: return a != b;
        case AST_OP_LT: return a < b;
        case AST_OP_LE: return a <= b;
        case AST_OP_GT: return a > b;
        case AST_OP_GE: return a >= b;
        default: break;
        }
    } else {
        double a = number_of(x), b = number_of(y);
        switch (op) {
        case AST_OP_EQ: return a == b;
        case AST_OP_NE: return a != b;
        case AST_OP_LT: return a < b;
        case AST_OP_LE: return a <= b;
        case AST_OP_GT: return a > b;
        case AST_OP_GE: return a >= b;
        default: break;
        }
    }
    SMELT_DIE("operator %d is no comparison", (int)op);
}

static fe_value type_error(fe_elaborator *el, const ast_expr *e, const char *needs, const fe_value *x,
                           const fe_value *y) {
    const char *hint = x->kind == FE_VALUE_TENSOR || y->kind == FE_VALUE_TENSOR
                           ? " (tensors are combined with ops such as add(a, b) and mul(a, b))"
                           : "";
    fe_error(el, e->loc, "'%s' needs %s, found %s and %s%s", ast_operator_text(e->as.binary.op), needs,
             fe_value_kind_text(x->kind), fe_value_kind_text(y->kind), hint);
    return fe_error_value();
}

/* list[i]: item i of a list, 0 <= i < len(list); an index out of range is
 * an error at the index. */
static fe_value eval_index(fe_elaborator *el, const ast_expr *e, const fe_value *list,
                           const fe_value *index) {
    if (list->kind != FE_VALUE_LIST) {
        const char *hint =
            list->kind == FE_VALUE_NULL ? " (a list param not given is null: test 'x != null')" : "";
        fe_error(el, e->as.binary.lhs->loc, "'[]' needs a list, found %s%s", fe_value_kind_text(list->kind),
                 hint);
        return fe_error_value();
    }
    if (index->kind != FE_VALUE_INT) {
        fe_error(el, e->as.binary.rhs->loc, "a list index must be an int, found %s",
                 fe_value_kind_text(index->kind));
        return fe_error_value();
    }
    if (index->as.i < 0 || (uint64_t)index->as.i >= list->as.list.count) {
        fe_error(el, e->as.binary.rhs->loc, "index %lld is out of range: the list has %u item%s",
                 (long long)index->as.i, list->as.list.count, list->as.list.count == 1 ? "" : "s");
        return fe_error_value();
    }
    return list->as.list.items[index->as.i];
}

/* x == null, x != null: whether an object or list param was given. */
static bool is_nullable(const fe_value *v) {
    return v->kind == FE_VALUE_NULL || v->kind == FE_VALUE_OBJECT || v->kind == FE_VALUE_LIST;
}

static fe_value eval_binary(fe_elaborator *el, const ast_expr *e) {
    fe_value x = fe_eval_expr(el, e->as.binary.lhs);
    /* && and || stop at a left side that decides, as in C, so that
     * `layer_types == null || len(layer_types) == n` reads a list only when
     * there is one. */
    if (x.kind == FE_VALUE_BOOL &&
        ((e->as.binary.op == AST_OP_AND && !x.as.b) || (e->as.binary.op == AST_OP_OR && x.as.b)))
        return x;
    fe_value y = fe_eval_expr(el, e->as.binary.rhs);
    if (x.kind == FE_VALUE_ERROR || y.kind == FE_VALUE_ERROR) return fe_error_value();
    bool refused = refuse_dim(el, &x, e->as.binary.lhs->loc);
    refused |= refuse_dim(el, &y, e->as.binary.rhs->loc);
    if (refused) return fe_error_value();

    ast_operator op = e->as.binary.op;
    switch (op) {
    case AST_OP_INDEX: return eval_index(el, e, &x, &y);
    case AST_OP_ADD:
    case AST_OP_SUB:
    case AST_OP_MUL:
    case AST_OP_DIV:
    case AST_OP_MOD:
        if (!is_number(&x) || !is_number(&y)) return type_error(el, e, "two numbers", &x, &y);
        if (x.kind == FE_VALUE_INT && y.kind == FE_VALUE_INT) return int_arithmetic(el, e, x.as.i, y.as.i);
        return float_arithmetic(el, e, number_of(&x), number_of(&y));
    case AST_OP_EQ:
    case AST_OP_NE:
        if (x.kind == FE_VALUE_STRING && y.kind == FE_VALUE_STRING)
            return fe_bool_value((strcmp(x.as.s, y.as.s) == 0) == (op == AST_OP_EQ));
        if (x.kind == FE_VALUE_BOOL && y.kind == FE_VALUE_BOOL)
            return fe_bool_value((x.as.b == y.as.b) == (op == AST_OP_EQ));
        if (is_number(&x) && is_number(&y)) return fe_bool_value(compare_numbers(op, &x, &y));
        if ((x.kind == FE_VALUE_NULL || y.kind == FE_VALUE_NULL) && is_nullable(&x) && is_nullable(&y))
            return fe_bool_value((x.kind == y.kind) == (op == AST_OP_EQ));
        if (is_nullable(&x) || is_nullable(&y))
            return type_error(el, e, "null and a list or an object (whether one was given)", &x, &y);
        return type_error(el, e, "two numbers, two strings or two bools", &x, &y);
    case AST_OP_LT:
    case AST_OP_LE:
    case AST_OP_GT:
    case AST_OP_GE:
        if (!is_number(&x) || !is_number(&y)) return type_error(el, e, "two numbers", &x, &y);
        return fe_bool_value(compare_numbers(op, &x, &y));
    case AST_OP_AND:
    case AST_OP_OR:
        if (x.kind != FE_VALUE_BOOL || y.kind != FE_VALUE_BOOL) return type_error(el, e, "two bools", &x, &y);
        return fe_bool_value(op == AST_OP_AND ? x.as.b && y.as.b : x.as.b || y.as.b);
    default: SMELT_DIE("binary expression with operator %d", (int)op);
    }
}

static fe_value eval_unary(fe_elaborator *el, const ast_expr *e) {
    fe_value x = fe_eval_expr(el, e->as.unary.operand);
    if (x.kind == FE_VALUE_ERROR) return x;
    if (refuse_dim(el, &x, e->as.unary.operand->loc)) return fe_error_value();
    if (e->as.unary.op == AST_OP_NEG) {
        if (x.kind == FE_VALUE_FLOAT) return fe_float_value(-x.as.f);
        if (x.kind == FE_VALUE_INT) {
            if (x.as.i != INT64_MIN) return fe_int_value(-x.as.i);
            fe_error(el, e->loc, "integer overflow: -(%lld) does not fit in 64 bits", (long long)x.as.i);
            return fe_error_value();
        }
        fe_error(el, e->loc, "'-' needs a number, found %s", fe_value_kind_text(x.kind));
        return fe_error_value();
    }
    if (e->as.unary.op == AST_OP_NOT) {
        if (x.kind == FE_VALUE_BOOL) return fe_bool_value(!x.as.b);
        fe_error(el, e->loc, "'!' needs a bool, found %s", fe_value_kind_text(x.kind));
        return fe_error_value();
    }
    SMELT_DIE("unary expression with operator %d", (int)e->as.unary.op);
}

/* ---- scalar functions ---------------------------------------------------- */

/* sqrt(x), min(a, b) and max(a, b) work on numbers, not tensors; len(x)
 * on a list. */
static bool is_scalar_function(const char *name) {
    return strcmp(name, "sqrt") == 0 || strcmp(name, "min") == 0 || strcmp(name, "max") == 0 ||
           strcmp(name, "len") == 0;
}

/* len(list): its number of items. */
static fe_value eval_len(fe_elaborator *el, const ast_expr *e) {
    if (e->as.call.arg_count != 1 || e->as.call.args[0].keyword) {
        fe_error(el, e->loc, "len takes 1 positional argument, found %u argument%s", e->as.call.arg_count,
                 e->as.call.arg_count == 1 ? " (with a keyword)" : "s");
        return fe_error_value();
    }
    const ast_expr *arg = e->as.call.args[0].value;
    fe_value v = fe_eval_expr(el, arg);
    if (v.kind == FE_VALUE_ERROR) return v;
    if (v.kind != FE_VALUE_LIST) {
        fe_error(el, arg->loc, "len needs a list, found %s%s", fe_value_kind_text(v.kind),
                 v.kind == FE_VALUE_NULL ? " (a list param not given is null: test 'x != null')" : "");
        return fe_error_value();
    }
    return fe_int_value(v.as.list.count);
}

static fe_value eval_scalar_call(fe_elaborator *el, const ast_expr *e) {
    const char *name = e->as.call.name;
    if (strcmp(name, "len") == 0) return eval_len(el, e);
    uint32_t wanted = strcmp(name, "sqrt") == 0 ? 1 : 2;
    fe_value args[2];
    bool bad = false;
    uint32_t positional = 0;
    for (uint32_t i = 0; i < e->as.call.arg_count; i++) {
        const ast_arg *arg = &e->as.call.args[i];
        fe_value v = fe_eval_expr(el, arg->value);
        if (arg->keyword) {
            fe_error(el, arg->loc, "%s takes no keyword arguments, found '%.*s%s'", name,
                     DIAG_NAME(arg->keyword));
            bad = true;
            continue;
        }
        if (v.kind == FE_VALUE_ERROR) {
            bad = true;
        } else if (refuse_dim(el, &v, arg->value->loc)) {
            bad = true;
        } else if (!is_number(&v)) {
            fe_error(el, arg->value->loc, "%s needs numbers, found %s%s", name, fe_value_kind_text(v.kind),
                     v.kind == FE_VALUE_TENSOR ? " (it works on params and loop variables, not tensors)"
                                               : "");
            bad = true;
        }
        if (positional < wanted) args[positional] = v;
        positional++;
    }
    if (positional != wanted) {
        fe_error(el, e->loc, "%s takes %u argument%s, found %u", name, wanted, wanted == 1 ? "" : "s",
                 positional);
        return fe_error_value();
    }
    if (bad) return fe_error_value();
    if (wanted == 1) {
        double x = number_of(&args[0]);
        if (x < 0) {
            fe_error(el, e->loc, "sqrt of the negative number %g", x);
            return fe_error_value();
        }
        return fe_float_value(sqrt(x));
    }
    bool take_first = strcmp(name, "min") == 0 ? !compare_numbers(AST_OP_GT, &args[0], &args[1])
                                               : !compare_numbers(AST_OP_LT, &args[0], &args[1]);
    fe_value chosen = take_first ? args[0] : args[1];
    if (args[0].kind == FE_VALUE_INT && args[1].kind == FE_VALUE_INT) return chosen;
    return fe_float_value(number_of(&chosen));
}

/* ---- dispatch ------------------------------------------------------------ */

fe_value fe_eval_expr(fe_elaborator *el, const ast_expr *e) {
    uint64_t units =
        e->kind == AST_EXPR_NAME || e->kind == AST_EXPR_STRING ? fe_text_work(strlen(e->as.s)) : 1;
    if (!fe_spend_work(el, e->loc, units)) return fe_error_value();
    if (!fe_enter(el, e->loc)) return fe_error_value();
    fe_value v = fe_error_value();
    switch (e->kind) {
    case AST_EXPR_INT: v = fe_int_value(e->as.i); break;
    case AST_EXPR_FLOAT: v = fe_float_value(e->as.f); break;
    case AST_EXPR_BOOL: v = fe_bool_value(e->as.b); break;
    case AST_EXPR_NULL: v = (fe_value){.kind = FE_VALUE_NULL}; break;
    case AST_EXPR_STRING: v = (fe_value){.kind = FE_VALUE_STRING, .as.s = e->as.s}; break;
    case AST_EXPR_NAME: v = eval_name(el, e); break;
    case AST_EXPR_UNARY: v = eval_unary(el, e); break;
    case AST_EXPR_BINARY: v = eval_binary(el, e); break;
    case AST_EXPR_LIST: v = eval_list(el, e); break;
    case AST_EXPR_CALL:
        v = is_scalar_function(e->as.call.name) ? eval_scalar_call(el, e) : fe_eval_op_call(el, e);
        break;
    }
    el->depth--;
    return v;
}
