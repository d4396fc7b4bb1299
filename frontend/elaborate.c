/* elaborate.c - from a model's syntax tree to its IR module (fe_elaborate).
 *
 * One walk over the statements, in order: params are bound (--set, then
 * config.json, then the default expression), dims become module symbols,
 * inputs, weights and outputs become their ops, `for` loops are unrolled and
 * only the chosen branch of an `if` is elaborated; a `require` that fails is
 * an error at the value that broke it, and `ignore` patterns go to the
 * module. At the end every key of the config must have been asked for by a
 * param, or be known not to change the computation (config_keys.c). Expressions and op calls
 * are in elaborate_expr.c and elaborate_call.c; the environment and error
 * reporting in elaborate_env.c.
 *
 * Contract: the module gets every op with its operands, attributes (defaults
 * filled in) and location; result types are set only where a statement
 * declares them (input, weight, const) and are otherwise left unknown for the
 * infer-shapes pass. Every error is reported; elaboration goes on past an
 * error with poison values so that later, independent errors are found too.
 */
#include "elaborate.h"
#include "quant_checkpoint.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void elaborate_block(fe_elaborator *el, const ast_block *block, bool top_level);

static const char *origin_text(fe_binding_origin origin) {
    switch (origin) {
    case FE_ORIGIN_PARAM: return "a param";
    case FE_ORIGIN_DIM: return "a dim";
    case FE_ORIGIN_INPUT: return "an input";
    case FE_ORIGIN_WEIGHT: return "a weight";
    case FE_ORIGIN_LET: return "a let";
    case FE_ORIGIN_LOOP: return "a loop variable";
    case FE_ORIGIN_OUTPUT: return "an output";
    }
    return "a name";
}

/* A declaration (param, dim, input, output) needs a name not bound yet in `map`. */
static bool check_fresh_name(fe_elaborator *el, const fe_name_map *map, const char *what, const char *name,
                             smelt_loc loc) {
    const fe_binding_entry *b = fe_name_map_get(map, name);
    if (!b) return true;
    fe_error(el, loc, "%s '%.*s%s' is already defined", what, DIAG_NAME(name));
    fe_note(el, b->loc, "'%.*s%s' was defined here, as %s", DIAG_NAME(name), origin_text(b->origin));
    return false;
}

static void bind(fe_elaborator *el, const char *name, fe_value value, fe_binding_origin origin,
                 smelt_loc loc) {
    fe_name_map_bind(&el->names, name, value, origin, loc);
}

/* ---- param ------------------------------------------------------------- */

/* Evaluates a param's default expression and converts it to the param's type. */
static fe_binding eval_param_default(fe_elaborator *el, const ast_stmt *s, ir_param *p) {
    const ast_expr *e = s->as.param.default_value;
    fe_value v = fe_eval_expr(el, e);
    if (v.kind == FE_VALUE_ERROR) return FE_BINDING_INVALID;
    switch (p->type) {
    case IR_PARAM_INT:
        if (v.kind != FE_VALUE_INT) break;
        p->value.i = v.as.i;
        return FE_BINDING_FOUND;
    case IR_PARAM_FLOAT:
        if (v.kind != FE_VALUE_INT && v.kind != FE_VALUE_FLOAT) break;
        p->value.f = v.kind == FE_VALUE_INT ? (double)v.as.i : v.as.f;
        return FE_BINDING_FOUND;
    case IR_PARAM_BOOL:
        if (v.kind != FE_VALUE_BOOL) break;
        p->value.b = v.as.b;
        return FE_BINDING_FOUND;
    case IR_PARAM_STRING:
        if (v.kind != FE_VALUE_STRING) break;
        p->value.s = v.as.s;
        return FE_BINDING_FOUND;
    case IR_PARAM_OBJECT:
    case IR_PARAM_LIST: break; /* elaborate_object_param, elaborate_list_param */
    }
    fe_error(el, e->loc, "param '%.*s%s' is %s but its default is %s", DIAG_NAME(p->name),
             ir_param_type_name(p->type), fe_value_kind_text(v.kind));
    return FE_BINDING_INVALID;
}

static fe_value param_value(const ir_param *p) {
    switch (p->type) {
    case IR_PARAM_INT: return fe_int_value(p->value.i);
    case IR_PARAM_FLOAT: return fe_float_value(p->value.f);
    case IR_PARAM_BOOL: return fe_bool_value(p->value.b);
    case IR_PARAM_STRING: return (fe_value){.kind = FE_VALUE_STRING, .as.s = p->value.s};
    case IR_PARAM_OBJECT:
    case IR_PARAM_LIST: break;
    }
    SMELT_DIE("param type %d", (int)p->type);
}

/* An object param (`param rope_scaling: object = null`): the config's
 * object of that name, else its default — null or another object param. It
 * is not recorded among the module's params: an op call that takes it
 * (rope's `scaling`) spreads its members into attributes, which the IR
 * shows. */
static void elaborate_object_param(fe_elaborator *el, const ast_stmt *s) {
    const char *name = s->as.param.name;
    ir_param p = {.name = name, .type = IR_PARAM_OBJECT};
    fe_value value = {.kind = FE_VALUE_NULL};
    fe_binding found = fe_setting_lookup(el->options, &p, &el->scratch, el->diag);
    if (found == FE_BINDING_ABSENT && el->config.broken) found = FE_BINDING_INVALID;
    if (found == FE_BINDING_ABSENT) {
        const struct json_t *json = NULL;
        found = fe_config_lookup_object(&el->config, name, &json, el->diag);
        if (found == FE_BINDING_FOUND) value = (fe_value){.kind = FE_VALUE_OBJECT, .as.object = {json, name}};
    }
    if (found == FE_BINDING_ABSENT && s->as.param.default_value) {
        fe_value v = fe_eval_expr(el, s->as.param.default_value);
        if (v.kind == FE_VALUE_NULL || v.kind == FE_VALUE_OBJECT) {
            value = v;
            found = FE_BINDING_FOUND;
        } else {
            if (v.kind != FE_VALUE_ERROR)
                fe_error(el, s->as.param.default_value->loc,
                         "param '%.*s%s' is an object but its default is %s; use null or an object param",
                         DIAG_NAME(name), fe_value_kind_text(v.kind));
            found = FE_BINDING_INVALID;
        }
    }
    if (found == FE_BINDING_ABSENT) found = FE_BINDING_FOUND; /* null */
    if (found != FE_BINDING_FOUND) {
        el->failed = true;
        value = fe_error_value();
    }
    bind(el, name, value, FE_ORIGIN_PARAM, s->loc);
}

/* "strings", "ints", ...: a list param's items, for messages. */
static const char *item_type_text(ir_param_type item) {
    switch (item) {
    case IR_PARAM_INT: return "ints";
    case IR_PARAM_FLOAT: return "floats";
    case IR_PARAM_BOOL: return "bools";
    case IR_PARAM_STRING: return "strings";
    default: return "ints, floats, bools or strings";
    }
}

/* A value of a list param's item type `item`, or false. */
static bool convert_item(const fe_value *v, ir_param_type item, fe_value *out) {
    bool any = item == IR_PARAM_LIST;
    switch (v->kind) {
    case FE_VALUE_INT:
        if (!any && item != IR_PARAM_INT && item != IR_PARAM_FLOAT) return false;
        *out = item == IR_PARAM_FLOAT ? fe_float_value((double)v->as.i) : *v;
        return true;
    case FE_VALUE_FLOAT: *out = *v; return any || item == IR_PARAM_FLOAT;
    case FE_VALUE_BOOL: *out = *v; return any || item == IR_PARAM_BOOL;
    case FE_VALUE_STRING: *out = *v; return any || item == IR_PARAM_STRING;
    default: return false;
    }
}

/* The items of a config.json list as values of the param's item type;
 * each item of another type is an error at that item. */
static bool list_from_config(fe_elaborator *el, const ast_stmt *s, const struct json_t *json, fe_value *out) {
    const char *name = s->as.param.name;
    ir_param_type item = s->as.param.item_type;
    size_t count = json_array_size(json);
    if (count > UINT32_MAX / 2) count = UINT32_MAX / 2; /* no config holds that many; fails below */
    if (!fe_spend_work(el, s->loc, count)) return false;
    fe_value *items = arena_array(&el->scratch, count ? count : 1, sizeof *items);
    bool ok = true;
    for (size_t i = 0; i < count; i++) {
        const json_t *j = json_array_get(json, i);
        fe_value v = fe_error_value();
        if (json_is_integer(j)) {
            v = fe_int_value((int64_t)json_integer_value(j));
        } else if (json_is_real(j)) {
            double r = json_real_value(j);
            v = fe_float_value(r);
            /* 3.0 is an int item as it is an int param */
            if (item == IR_PARAM_INT && r == floor(r) && r >= -9.2e18 && r <= 9.2e18)
                v = fe_int_value((int64_t)r);
        } else if (json_is_boolean(j)) {
            v = fe_bool_value(json_is_true(j));
        } else if (json_is_string(j)) {
            v = (fe_value){.kind = FE_VALUE_STRING,
                           .as.s = arena_strndup(&el->scratch, json_string_value(j), json_string_length(j))};
        }
        if (!convert_item(&v, item, &items[i])) {
            const char *found = json_is_null(j)     ? "null"
                                : json_is_object(j) ? "an object"
                                : json_is_array(j)  ? "a list"
                                                    : fe_value_kind_text(v.kind);
            fe_error(el, fe_config_item_loc(&el->config, name, i),
                     "item %zu of config key '%.*s%s' is %s, but param '%.*s%s' is a list of %s", i,
                     DIAG_NAME(name), found, DIAG_NAME(name), item_type_text(item));
            fe_note(el, s->loc, "the param is declared here");
            ok = false;
        }
    }
    *out = (fe_value){.kind = FE_VALUE_LIST, .as.list = {items, (uint32_t)count}};
    return ok;
}

/* A list param (`param layer_types: list[string] = null`): the config's
 * list of that name, else its default — null, or a list of the item type.
 * Like an object param it is not recorded among the module's params; the
 * model's expressions read it (`layer_types[l]`, `len(layer_types)`). */
static void elaborate_list_param(fe_elaborator *el, const ast_stmt *s) {
    const char *name = s->as.param.name;
    ir_param p = {.name = name, .type = IR_PARAM_LIST};
    fe_value value = {.kind = FE_VALUE_NULL};
    fe_binding found = fe_setting_lookup(el->options, &p, &el->scratch, el->diag);
    if (found == FE_BINDING_ABSENT && el->config.broken) found = FE_BINDING_INVALID;
    if (found == FE_BINDING_ABSENT) {
        const struct json_t *json = NULL;
        found = fe_config_lookup_list(&el->config, name, &json, el->diag);
        if (found == FE_BINDING_FOUND && !list_from_config(el, s, json, &value)) found = FE_BINDING_INVALID;
    }
    const ast_expr *e = s->as.param.default_value;
    if (found == FE_BINDING_ABSENT && e) {
        fe_value v = fe_eval_expr(el, e);
        found = FE_BINDING_INVALID;
        if (v.kind == FE_VALUE_NULL) {
            found = FE_BINDING_FOUND;
        } else if (v.kind == FE_VALUE_LIST) {
            found = FE_BINDING_FOUND;
            for (uint32_t i = 0; i < v.as.list.count; i++) {
                if (convert_item(&v.as.list.items[i], s->as.param.item_type, &v.as.list.items[i])) continue;
                fe_error(el, e->loc, "item %u of the default of param '%.*s%s' is %s; it is a list of %s", i,
                         DIAG_NAME(name), fe_value_kind_text(v.as.list.items[i].kind),
                         item_type_text(s->as.param.item_type));
                found = FE_BINDING_INVALID;
                break;
            }
            value = v;
        } else if (v.kind != FE_VALUE_ERROR) {
            fe_error(el, e->loc, "param '%.*s%s' is a list but its default is %s; use null or a list",
                     DIAG_NAME(name), fe_value_kind_text(v.kind));
        }
    }
    if (found == FE_BINDING_ABSENT) found = FE_BINDING_FOUND; /* null */
    if (found != FE_BINDING_FOUND) {
        el->failed = true;
        value = fe_error_value();
    }
    bind(el, name, value, FE_ORIGIN_PARAM, s->loc);
}

static void elaborate_param(fe_elaborator *el, const ast_stmt *s, bool top_level) {
    const char *name = s->as.param.name;
    if (!top_level) {
        fe_error(el, s->loc,
                 "param '%.*s%s' must be declared at the top level of the model, not inside for or if",
                 DIAG_NAME(name));
        if (!fe_name_map_get(&el->names, name)) bind(el, name, fe_error_value(), FE_ORIGIN_PARAM, s->loc);
        return;
    }
    if (!check_fresh_name(el, &el->names, "param", name, s->loc)) return;
    if (s->as.param.type == IR_PARAM_OBJECT) {
        elaborate_object_param(el, s);
        return;
    }
    if (s->as.param.type == IR_PARAM_LIST) {
        elaborate_list_param(el, s);
        return;
    }

    ir_param p = {.name = name, .type = s->as.param.type};
    fe_binding found = fe_setting_lookup(el->options, &p, &el->scratch, el->diag);
    if (found == FE_BINDING_ABSENT && el->config.broken)
        found = FE_BINDING_INVALID; /* the config might have bound it: stay silent */
    if (found == FE_BINDING_ABSENT) found = fe_config_lookup(&el->config, &p, &el->scratch, el->diag);
    if (found == FE_BINDING_ABSENT && s->as.param.default_value) found = eval_param_default(el, s, &p);
    if (found == FE_BINDING_ABSENT) {
        fe_error(el, s->loc, "param '%.*s%s' has no value; give it in config.json or with --set %.*s%s=...",
                 DIAG_NAME(name), DIAG_NAME(name));
        found = FE_BINDING_INVALID;
    }
    if (found != FE_BINDING_FOUND) {
        el->failed = true;
        bind(el, name, fe_error_value(), FE_ORIGIN_PARAM, s->loc);
        return;
    }
    ir_param *recorded = ir_add_param(el->module, name, p.type);
    recorded->value = p.value;
    if (p.type == IR_PARAM_STRING) recorded->value.s = arena_strdup(&el->module->arena, p.value.s);
    bind(el, name, param_value(&p), FE_ORIGIN_PARAM, s->loc);
}

/* ---- dim, input, weight ---------------------------------------------------- */

static void elaborate_dim(fe_elaborator *el, const ast_stmt *s) {
    const char *name = s->as.dim.name;
    if (!check_fresh_name(el, &el->names, "dim", name, s->loc)) return;
    fe_value bound = fe_eval_expr(el, s->as.dim.bound);
    fe_value value = fe_error_value();
    if (bound.kind == FE_VALUE_INT && bound.as.i >= 1) {
        value =
            (fe_value){.kind = FE_VALUE_DIM, .as.dim = ir_add_symbol(el->module, name, bound.as.i, s->loc)};
    } else if (bound.kind == FE_VALUE_INT) {
        fe_error(el, s->as.dim.bound->loc, "the bound of dim '%.*s%s' is %lld; it must be >= 1",
                 DIAG_NAME(name), (long long)bound.as.i);
    } else if (bound.kind != FE_VALUE_ERROR) {
        fe_error(el, s->as.dim.bound->loc, "the bound of dim '%.*s%s' must be an int, found %s",
                 DIAG_NAME(name), fe_value_kind_text(bound.kind));
    }
    bind(el, name, value, FE_ORIGIN_DIM, s->loc);
}

/* "f32, f16, ..., i64" for messages. */
#define X(e, name, bits, is_float) name ", "
static const char dtype_list[] = SMELT_DTYPES(X);
#undef X

/* The dims of a declared type (ints >= 0 or symbolic dims) into out->dims.
 * false on an error, reported unless it is poison from earlier. */
static bool eval_dims(fe_elaborator *el, const ast_stmt *s, const char *what, const char *name,
                      const ast_type *type, ir_type *out) {
    if (type->rank > IR_MAX_DIMS) {
        fe_error(el, s->loc, "%s '%.*s%s' has %u dims; at most %d are allowed", what, DIAG_NAME(name),
                 type->rank, IR_MAX_DIMS);
        return false;
    }
    bool ok = true;
    out->rank = (uint8_t)type->rank;
    for (uint32_t i = 0; i < type->rank; i++) {
        const ast_expr *e = type->dims[i];
        fe_value v = fe_eval_expr(el, e);
        if (v.kind == FE_VALUE_INT && v.as.i >= 0) {
            out->dims[i] = ir_dim_const(v.as.i);
        } else if (v.kind == FE_VALUE_DIM) {
            out->dims[i] = ir_dim_symbol(v.as.dim);
        } else if (v.kind == FE_VALUE_INT) {
            fe_error(el, e->loc, "dim %u of %s '%.*s%s' is %lld; dims must be >= 0", i + 1, what,
                     DIAG_NAME(name), (long long)v.as.i);
            ok = false;
        } else {
            if (v.kind != FE_VALUE_ERROR)
                fe_error(el, e->loc, "dim %u of %s '%.*s%s' must be an int or a symbolic dim, found %s",
                         i + 1, what, DIAG_NAME(name), fe_value_kind_text(v.kind));
            ok = false;
        }
    }
    return ok;
}

/* The dtype named in a declared type; SMELT_DTYPE_UNKNOWN after an error. */
static smelt_dtype eval_dtype(fe_elaborator *el, const ast_type *type) {
    smelt_dtype dtype = smelt_dtype_from_name(type->dtype, strlen(type->dtype));
    if (dtype == SMELT_DTYPE_UNKNOWN)
        fe_error(el, type->dtype_loc, "unknown dtype '%.*s%s'; the dtypes are %.*s", DIAG_NAME(type->dtype),
                 (int)sizeof dtype_list - 3, dtype_list);
    return dtype;
}

static void elaborate_input(fe_elaborator *el, const ast_stmt *s) {
    const char *name = s->as.input.name;
    if (!check_fresh_name(el, &el->names, "input", name, s->loc)) return;
    const ast_type *type = &s->as.input.type;
    ir_type t = {0};
    bool ok = true;
    if (!type->dtype) {
        fe_error(el, s->loc, "input '%.*s%s' needs a dtype, as in 'input ids: i32[tokens]'", DIAG_NAME(name));
        ok = false;
    } else if ((t.dtype = eval_dtype(el, type)) == SMELT_DTYPE_UNKNOWN) {
        ok = false;
    }
    ok &= eval_dims(el, s, "input", name, type, &t);
    fe_value value = fe_error_value();
    if (ok && fe_room_for_op(el, s->loc)) {
        ir_module *m = el->module;
        uint32_t op = ir_append_op(m, IR_OP_INPUT, NULL, 0, UINT32_MAX, s->loc);
        ir_op_set_string(m, op, "name", name);
        ir_value_id id = ir_op_result(m, op, 0);
        m->values[id].type = t;
        value = (fe_value){.kind = FE_VALUE_TENSOR, .as.tensor = id};
    }
    bind(el, name, value, FE_ORIGIN_INPUT, s->loc);
}

/* The Hugging Face name of a weight: each {x} of the template replaced by the
 * decimal value of int x, except {e} of `stacked e`, which stays. NULL after
 * an error (reported unless poison). In the scratch arena. */
static char *expand_weight_name(fe_elaborator *el, const ast_stmt *s, bool *has_stack_var) {
    const char *template = s->as.weight.hf_name, *stack_var = s->as.weight.stack_var;
    smelt_loc loc = s->as.weight.hf_name_loc;
    size_t length = strlen(template);
    if (!fe_spend_work(el, loc, fe_text_work(length))) return NULL;
    /* Each {x} of >= 3 bytes becomes at most 20 digits and a sign. */
    uint64_t capacity;
    if (size_mul_overflow(length, 8, &capacity) || size_add_overflow(capacity, 32, &capacity))
        SMELT_DIE("weight name of %zu bytes", length);
    char *out = arena_alloc(&el->scratch, (size_t)capacity);
    size_t used = 0;
    *has_stack_var = false;
    for (const char *p = template; *p;) {
        if (*p != '{') {
            out[used++] = *p++;
            continue;
        }
        const char *close = strchr(p + 1, '}');
        if (!close) {
            fe_error(el, loc,
                     "unterminated '{' in the weight name; write {name} with a loop variable or int param");
            return NULL;
        }
        const char *var = p + 1;
        size_t var_length = (size_t)(close - var);
        int shown = var_length > DIAG_NAME_MAX ? DIAG_NAME_MAX : (int)var_length;
        const char *cut = var_length > DIAG_NAME_MAX ? "..." : "";
        const fe_binding_entry *b = fe_name_map_get_bytes(&el->names, var, var_length);
        if (var_length == 0) {
            fe_error(el, loc,
                     "empty '{}' in the weight name; write {name} with a loop variable or int param");
        } else if (stack_var && strlen(stack_var) == var_length && memcmp(stack_var, var, var_length) == 0) {
            memcpy(out + used, p, var_length + 2); /* {e} stays for the stacked dim */
            used += var_length + 2;
            *has_stack_var = true;
            p = close + 1;
            continue;
        } else if (b && b->value.kind == FE_VALUE_INT) {
            used += (size_t)snprintf(out + used, 24, "%lld", (long long)b->value.as.i);
            p = close + 1;
            continue;
        } else if (!b) {
            if (!el->skipped_code)
                fe_error(
                    el, loc,
                    "unknown name '{%.*s%s}' in the weight name; expected a loop variable or an int param",
                    shown, var, cut);
        } else if (b->value.kind != FE_VALUE_ERROR) {
            fe_error(el, loc, "'{%.*s%s}' in the weight name needs an int, but '%.*s%s' is %s", shown, var,
                     cut, shown, var, cut, fe_value_kind_text(b->value.kind));
        }
        return NULL;
    }
    out[used] = '\0';
    return out;
}

static void elaborate_weight(fe_elaborator *el, const ast_stmt *s) {
    const char *name = s->as.weight.name;
    const ast_type *type = &s->as.weight.type;
    ir_type t = {.dtype = SMELT_DTYPE_F32};
    bool ok = true;
    if (type->dtype) {
        t.dtype = eval_dtype(el, type);
        if (t.dtype != SMELT_DTYPE_UNKNOWN && !smelt_dtype_is_float(t.dtype)) {
            fe_error(el, type->dtype_loc,
                     "weight '%.*s%s' has dtype %s; weights must have a float dtype "
                     "(f32, f16, bf16, f8e4m3 or f8e5m2)",
                     DIAG_NAME(name), smelt_dtype_name(t.dtype));
            t.dtype = SMELT_DTYPE_UNKNOWN;
        }
        ok = t.dtype != SMELT_DTYPE_UNKNOWN;
    }
    ok &= eval_dims(el, s, "weight", name, type, &t);
    bool has_stack_var = false;
    char *hf_name = expand_weight_name(el, s, &has_stack_var);
    ok &= hf_name != NULL;
    const char *stack_var = s->as.weight.stack_var;
    if (stack_var && type->rank < 2) {
        fe_error(el, s->loc,
                 "stacked weight '%.*s%s' needs at least 2 dims (dim 0 counts the stacked tensors), "
                 "found %u",
                 DIAG_NAME(name), type->rank);
        ok = false;
    }
    if (stack_var && hf_name && !has_stack_var) {
        fe_error(el, s->as.weight.hf_name_loc, "the name of stacked weight '%.*s%s' must contain '{%.*s%s}'",
                 DIAG_NAME(name), DIAG_NAME(stack_var));
        ok = false;
    }
    fe_value value = fe_error_value();
    if (ok && fe_room_for_op(el, s->loc)) {
        ir_module *m = el->module;
        uint32_t op = ir_append_op(m, IR_OP_WEIGHT, NULL, 0, UINT32_MAX, s->loc);
        ir_op_set_string(m, op, "name", hf_name);
        if (stack_var) ir_op_set_string(m, op, "stack", stack_var);
        ir_op_fill_defaults(m, op);
        ir_value_id id = ir_op_result(m, op, 0);
        m->values[id].type = t;
        value = (fe_value){.kind = FE_VALUE_TENSOR, .as.tensor = id};
    }
    bind(el, name, value, FE_ORIGIN_WEIGHT, s->loc);
}

/* ---- let, assignment, output ------------------------------------------------ */

static void elaborate_let(fe_elaborator *el, const ast_stmt *s) {
    uint32_t count = s->as.let.name_count;
    const char *const *names = s->as.let.names;
    bool assign = s->kind == AST_STMT_ASSIGN;
    for (uint32_t i = 0; i < count; i++) {
        if (!fe_spend_work(el, s->as.let.name_locs[i], fe_text_work(strlen(names[i])))) return;
        if (assign && !fe_name_map_get(&el->names, names[i]) && !el->skipped_code)
            fe_error(el, s->as.let.name_locs[i], "'%.*s%s' is not defined; use let", DIAG_NAME(names[i]));
    }
    fe_value v = fe_eval_expr(el, s->as.let.value);
    smelt_loc value_loc = s->as.let.value->loc;
    bool several = v.kind == FE_VALUE_RESULTS;
    uint32_t given = several ? v.as.results.count : 1;
    if (v.kind != FE_VALUE_ERROR && given != count) {
        if (several && count == 1)
            fe_error(el, value_loc,
                     "the value has %u results; bind each to a name, as in 'let a, b = split(...)'", given);
        else if (several)
            fe_error(el, value_loc, "%u names are bound but the value has %u results", count, given);
        else
            fe_error(el, value_loc, "%u names are bound but the value is a single value (%s)", count,
                     fe_value_kind_text(v.kind));
        v = fe_error_value();
    }
    for (uint32_t i = 0; i < count; i++) {
        fe_value item = v;
        if (several && v.kind == FE_VALUE_RESULTS)
            item = (fe_value){.kind = FE_VALUE_TENSOR,
                              .as.tensor = ir_op_result(el->module, v.as.results.op, i)};
        bind(el, names[i], item, FE_ORIGIN_LET, s->as.let.name_locs[i]);
    }
}

static void elaborate_output(fe_elaborator *el, const ast_stmt *s) {
    const char *name = s->as.output.name;
    bool fresh = check_fresh_name(el, &el->outputs, "output", name, s->loc);
    if (fresh) fe_name_map_bind(&el->outputs, name, fe_error_value(), FE_ORIGIN_OUTPUT, s->loc);
    fe_value v = fe_eval_expr(el, s->as.output.value);
    if (!fresh || v.kind == FE_VALUE_ERROR) return;
    if (v.kind != FE_VALUE_TENSOR) {
        fe_error(el, s->as.output.value->loc, "output '%.*s%s' must be a tensor, found %s", DIAG_NAME(name),
                 fe_value_kind_text(v.kind));
        return;
    }
    if (!fe_room_for_op(el, s->loc)) return;
    uint32_t op = ir_append_op(el->module, IR_OP_OUTPUT, &v.as.tensor, 1, UINT32_MAX, s->loc);
    ir_op_set_string(el->module, op, "name", name);
}

/* ---- require, ignore ------------------------------------------------------ */

/* The first param the expression reads, preferring one bound by the config
 * or a --set (the value a user can change), or NULL. */
static const char *blamed_param(const fe_elaborator *el, const ast_expr *e, bool *from_input) {
    if (!e) return NULL;
    const char *found = NULL, *inner = NULL;
    bool inner_input = false;
    switch (e->kind) {
    case AST_EXPR_NAME: {
        const fe_binding_entry *b = fe_name_map_get(&el->names, e->as.s);
        if (!b || b->origin != FE_ORIGIN_PARAM) return NULL;
        smelt_loc unused;
        *from_input =
            fe_options_find(el->options, e->as.s) >= 0 || fe_config_value_loc(&el->config, e->as.s, &unused);
        return e->as.s;
    }
    case AST_EXPR_UNARY: return blamed_param(el, e->as.unary.operand, from_input);
    case AST_EXPR_BINARY:
        found = blamed_param(el, e->as.binary.lhs, from_input);
        if (found && *from_input) return found;
        inner = blamed_param(el, e->as.binary.rhs, &inner_input);
        if (inner && (inner_input || !found)) {
            *from_input = inner_input;
            return inner;
        }
        return found;
    case AST_EXPR_CALL:
        for (uint32_t i = 0; i < e->as.call.arg_count; i++) {
            inner = blamed_param(el, e->as.call.args[i].value, &inner_input);
            if (inner && (inner_input || !found)) {
                found = inner;
                *from_input = inner_input;
                if (inner_input) break;
            }
        }
        return found;
    default: return NULL;
    }
}

/* The value of a param as written in a message: 4096, 1e-05, true, "silu". */
static void param_value_text(const fe_value *v, char *text, size_t size) {
    switch (v->kind) {
    case FE_VALUE_INT: snprintf(text, size, "%lld", (long long)v->as.i); break;
    case FE_VALUE_FLOAT: snprintf(text, size, "%g", v->as.f); break;
    case FE_VALUE_BOOL: snprintf(text, size, "%s", v->as.b ? "true" : "false"); break;
    case FE_VALUE_STRING: snprintf(text, size, "\"%.*s%s\"", DIAG_NAME(v->as.s)); break;
    case FE_VALUE_LIST: snprintf(text, size, "a list of %u", v->as.list.count); break;
    default: snprintf(text, size, "%s", fe_value_kind_text(v->kind));
    }
}

/* The first `name[i]` of the expression with i an int in range (the item a
 * require on a list param reads), or -1. Evaluating an index again is
 * harmless: it was evaluated already, without error. */
static int64_t blamed_item(fe_elaborator *el, const ast_expr *e, const char *name) {
    if (!e) return -1;
    int64_t found = -1;
    switch (e->kind) {
    case AST_EXPR_UNARY: return blamed_item(el, e->as.unary.operand, name);
    case AST_EXPR_BINARY:
        if (e->as.binary.op == AST_OP_INDEX && e->as.binary.lhs->kind == AST_EXPR_NAME &&
            strcmp(e->as.binary.lhs->as.s, name) == 0) {
            const fe_binding_entry *b = fe_name_map_get(&el->names, name);
            fe_value i = fe_eval_expr(el, e->as.binary.rhs);
            if (b && b->value.kind == FE_VALUE_LIST && i.kind == FE_VALUE_INT && i.as.i >= 0 &&
                (uint64_t)i.as.i < b->value.as.list.count)
                return i.as.i;
        }
        found = blamed_item(el, e->as.binary.lhs, name);
        return found >= 0 ? found : blamed_item(el, e->as.binary.rhs, name);
    case AST_EXPR_CALL:
        for (uint32_t k = 0; k < e->as.call.arg_count && found < 0; k++)
            found = blamed_item(el, e->as.call.args[k].value, name);
        return found;
    default: return -1;
    }
}

/* `require COND [, "message"]`: a value of the params the model does not
 * implement is refused where it came from (the config's line, or the
 * --set), with the requirement as a note. */
static void elaborate_require(fe_elaborator *el, const ast_stmt *s) {
    fe_value cond = fe_eval_expr(el, s->as.require.cond);
    if (cond.kind == FE_VALUE_ERROR) return;
    if (cond.kind != FE_VALUE_BOOL) {
        fe_error(el, s->as.require.cond->loc, "a require needs a bool condition, found %s",
                 fe_value_kind_text(cond.kind));
        return;
    }
    if (cond.as.b) return;
    /* ": message", cut at a few lines' worth (a message may be any length). */
    char message[256] = "";
    if (s->as.require.message) snprintf(message, sizeof message, ": %s", s->as.require.message);
    const char *spec = el->model->source_path ? el->model->source_path : "the model";
    bool from_input = false;
    const char *name = blamed_param(el, s->as.require.cond, &from_input);
    char value[96] = "";
    if (name) param_value_text(&fe_name_map_get(&el->names, name)->value, value, sizeof value);
    smelt_loc at;
    if (name && from_input && fe_options_find(el->options, name) >= 0) {
        fe_error(el, SMELT_NO_LOC, "--set %.*s%s=%s: %s does not support it%s", DIAG_NAME(name), value, spec,
                 message);
    } else if (name && from_input && fe_config_value_loc(&el->config, name, &at)) {
        int64_t item = blamed_item(el, s->as.require.cond, name);
        if (item >= 0) {
            /* A list param's item: the item, where the config gives it. */
            const fe_value *v = &fe_name_map_get(&el->names, name)->value.as.list.items[item];
            param_value_text(v, value, sizeof value);
            fe_error(el, fe_config_item_loc(&el->config, name, (size_t)item),
                     "item %lld of '%.*s%s' is %s, which %s does not support%s", (long long)item,
                     DIAG_NAME(name), value, spec, message);
        } else {
            fe_error(el, at, "'%.*s%s' is %s, which %s does not support%s", DIAG_NAME(name), value, spec,
                     message);
        }
    } else {
        char blame[160] = "";
        if (name) snprintf(blame, sizeof blame, " ('%.*s%s' is %s)", DIAG_NAME(name), value);
        fe_error(el, s->loc, "the model's requirement is not met%s%s", blame, message);
        el->failed = true;
        return;
    }
    fe_note(el, s->loc, "required here");
    el->failed = true;
}

/* `ignore "glob"`: checkpoint tensors that weight binding may leave unused. */
static void elaborate_ignore(fe_elaborator *el, const ast_stmt *s) {
    const char *pattern = s->as.ignore.pattern;
    if (!pattern[0]) {
        fe_error(el, s->as.ignore.pattern_loc, "an ignore pattern must not be empty");
        return;
    }
    ir_add_ignored_tensor(el->module, pattern);
}

/* ---- for, if ------------------------------------------------------------ */

static void elaborate_for(fe_elaborator *el, const ast_stmt *s) {
    const char *var = s->as.loop.var;
    fe_value from = fe_eval_expr(el, s->as.loop.from);
    fe_value to = fe_eval_expr(el, s->as.loop.to);
    if (from.kind == FE_VALUE_ERROR || to.kind == FE_VALUE_ERROR) {
        el->skipped_code = true;
        return;
    }
    if (from.kind != FE_VALUE_INT || to.kind != FE_VALUE_INT) {
        fe_error(el, s->loc, "the range of a for loop must be two ints, found %s and %s",
                 fe_value_kind_text(from.kind), fe_value_kind_text(to.kind));
        el->skipped_code = true;
        return;
    }
    /* A range that ends before it begins (`0..num_hidden_layers` with -1)
     * would run no times and silently build a model without its layers. */
    if (to.as.i < from.as.i) {
        fe_error(el, s->as.loop.to->loc, "the for loop's range %lld..%lld ends before it begins",
                 (long long)from.as.i, (long long)to.as.i);
        el->skipped_code = true;
        return;
    }
    /* to > from: the difference fits in uint64 even when int64 would overflow. */
    uint64_t iterations = to.as.i > from.as.i ? (uint64_t)to.as.i - (uint64_t)from.as.i : 0;
    if (iterations > FE_MAX_LOOP_ITERATIONS) {
        fe_error(el, s->loc, "the loop runs %llu times; at most %d iterations are allowed",
                 (unsigned long long)iterations, FE_MAX_LOOP_ITERATIONS);
        el->skipped_code = true;
        return;
    }
    const fe_binding_entry *shadowed = fe_name_map_get(&el->names, var);
    fe_binding_entry saved = shadowed ? *shadowed : (fe_binding_entry){0};
    for (int64_t i = from.as.i; i < to.as.i && !el->stopped; i++) {
        if (!fe_spend_work(el, s->loc, fe_text_work(strlen(var)))) break;
        bind(el, var, fe_int_value(i), FE_ORIGIN_LOOP, s->loc);
        elaborate_block(el, &s->as.loop.body, false);
    }
    if (saved.name)
        bind(el, var, saved.value, saved.origin, saved.loc);
    else
        fe_name_map_unbind(&el->names, var);
}

static void elaborate_if(fe_elaborator *el, const ast_stmt *s) {
    fe_value cond = fe_eval_expr(el, s->as.branch.cond);
    if (cond.kind != FE_VALUE_BOOL) {
        if (cond.kind != FE_VALUE_ERROR)
            fe_error(el, s->as.branch.cond->loc, "the condition of 'if' must be a bool, found %s",
                     fe_value_kind_text(cond.kind));
        el->skipped_code = true;
        return;
    }
    elaborate_block(el, cond.as.b ? &s->as.branch.then_body : &s->as.branch.else_body, false);
}

/* ---- statements ---------------------------------------------------------- */

static void elaborate_stmt(fe_elaborator *el, const ast_stmt *s, bool top_level) {
    switch (s->kind) {
    case AST_STMT_PARAM: elaborate_param(el, s, top_level); break;
    case AST_STMT_DIM: elaborate_dim(el, s); break;
    case AST_STMT_INPUT: elaborate_input(el, s); break;
    case AST_STMT_WEIGHT: elaborate_weight(el, s); break;
    case AST_STMT_LET:
    case AST_STMT_ASSIGN: elaborate_let(el, s); break;
    case AST_STMT_FOR: elaborate_for(el, s); break;
    case AST_STMT_IF: elaborate_if(el, s); break;
    case AST_STMT_OUTPUT: elaborate_output(el, s); break;
    case AST_STMT_REQUIRE: elaborate_require(el, s); break;
    case AST_STMT_IGNORE: elaborate_ignore(el, s); break;
    default: SMELT_DIE("statement kind %d", (int)s->kind);
    }
}

static void elaborate_block(fe_elaborator *el, const ast_block *block, bool top_level) {
    if (!fe_enter(el, block->count ? block->items[0]->loc : el->model->loc)) return;
    for (uint32_t i = 0; i < block->count && !el->stopped; i++) {
        const ast_stmt *s = block->items[i];
        if (!fe_spend_work(el, s->loc, 1)) break;
        elaborate_stmt(el, s, top_level);
    }
    el->depth--;
}

/* Every --set must name a param declared at the top level of the model. */
static void check_settings(fe_elaborator *el) {
    const fe_options *o = el->options;
    if (!o) return;
    for (uint32_t i = 0; i < o->setting_count; i++) {
        const char *name = o->settings[i].name;
        bool found = false;
        for (uint32_t j = 0; j < el->model->body.count && !found; j++) {
            const ast_stmt *s = el->model->body.items[j];
            found = s->kind == AST_STMT_PARAM && strcmp(s->as.param.name, name) == 0;
        }
        if (!found) fe_error(el, SMELT_NO_LOC, "--set: the model has no param '%.*s%s'", DIAG_NAME(name));
    }
}

/* Every key of the config is bound by a param, harmless, or allowed. */
static void check_config_keys(fe_elaborator *el) {
    if (!el->config.root) return;
    const ast_block *body = &el->model->body;
    const char **params = arena_alloc(&el->scratch, (body->count + 1) * sizeof *params);
    uint32_t param_count = 0;
    for (uint32_t i = 0; i < body->count; i++)
        if (body->items[i]->kind == AST_STMT_PARAM) params[param_count++] = body->items[i]->as.param.name;
    fe_config_key *keys;
    uint32_t key_count = fe_config_keys(&el->config, &el->scratch, &keys);
    const fe_options *o = el->options;
    fe_config_key_check check = {
        .spec_path = el->model->source_path,
        .params = params,
        .param_count = param_count,
        .allowed = o ? o->allowed_keys : NULL,
        .allowed_count = o ? o->allowed_key_count : 0,
    };
    if (!fe_check_config_keys(keys, key_count, &check, el->diag)) el->failed = true;
    /* quantization_config: every member understood or refused by name. */
    qck_scheme scheme;
    if (!qck_scheme_of_config(&el->config, &scheme, el->diag)) el->failed = true;
}

bool fe_elaborate(const ast_model *model, const fe_options *o, diag_engine *d, ir_module *out) {
    ir_module_init(out, NULL);
    arena_recovery start;
    if (arena_recovery_enter(&start, setjmp(start.where))) {
        diag_error(d, SMELT_NO_LOC, "out of memory");
        return false;
    }
    if (model->name) out->name = arena_strdup(&out->arena, model->name);
    if (model->source_path) out->source_path = arena_strdup(&out->arena, model->source_path);
    out->source_file = model->source_file;
    arena_recovery_leave(&start);

    fe_elaborator el = {.model = model, .options = o, .diag = d, .module = out};
    arena_init(&el.scratch);
    unsigned errors_before = d->error_count;
    arena_recovery recovery;
    volatile bool ok = false; /* set after the recovery point, read after a jump */
    if (arena_recovery_enter(&recovery, setjmp(recovery.where))) {
        diag_error(d, SMELT_NO_LOC, "out of memory");
    } else {
        check_settings(&el);
        fe_config_open(&el.config, o ? o->config_path : NULL, d);
        elaborate_block(&el, &model->body, true);
        if (!el.stopped) check_config_keys(&el);
        for (uint32_t i = 0; o && i < o->allowed_unused_tensor_count; i++)
            ir_add_ignored_tensor(out, o->allowed_unused_tensors[i]);
        ok = !el.failed && !el.config.broken && d->error_count == errors_before;
        arena_recovery_leave(&recovery);
    }
    fe_config_close(&el.config);
    fe_name_map_free(&el.names);
    fe_name_map_free(&el.outputs);
    arena_free(&el.scratch);
    return ok;
}
