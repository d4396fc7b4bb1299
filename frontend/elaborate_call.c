/* elaborate_call.c - an op call `matmul(x, w, layout = "in_out")` becomes one
 * IR op. Positional arguments are operands (a number becomes a const op
 * placed just before the call's op); keyword arguments are attributes,
 * converted by the op's schema in ops.def. Every problem of a call is
 * reported before giving up on it. Result types are left unknown: the
 * infer-shapes pass computes them.
 */
#include "elaborate.h"

#include <jansson.h>
#include <math.h>

#include <stdio.h>
#include <string.h>

/* ---- "did you mean" ------------------------------------------------------ */

enum { SUGGEST_MAX_LENGTH = 32 };

/* Levenshtein distance of two short strings (both < SUGGEST_MAX_LENGTH). */
static unsigned edit_distance(const char *a, size_t la, const char *b, size_t lb) {
    unsigned row[SUGGEST_MAX_LENGTH + 1];
    for (size_t j = 0; j <= lb; j++)
        row[j] = (unsigned)j;
    for (size_t i = 1; i <= la; i++) {
        unsigned diagonal = row[0];
        row[0] = (unsigned)i;
        for (size_t j = 1; j <= lb; j++) {
            unsigned above = row[j];
            unsigned best = diagonal + (a[i - 1] != b[j - 1]);
            if (above + 1 < best) best = above + 1;
            if (row[j - 1] + 1 < best) best = row[j - 1] + 1;
            row[j] = best;
            diagonal = above;
        }
    }
    return row[lb];
}

/* Writes "; did you mean 'x'?" to `out` when an op or scalar function name
 * is a typo or two away from `name`, else "". */
static void suggest_name(const char *name, char *out, size_t size) {
    static const char *const scalar_functions[] = {"sqrt", "min", "max"};
    out[0] = '\0';
    size_t length = strnlen(name, SUGGEST_MAX_LENGTH);
    if (length >= SUGGEST_MAX_LENGTH) return;
    const char *best = NULL;
    unsigned best_distance = ~0u;
    for (unsigned i = 0; i < IR_OP_COUNT + 3; i++) {
        const char *candidate =
            i < IR_OP_COUNT ? ir_op_info_of((ir_op_kind)i)->name : scalar_functions[i - IR_OP_COUNT];
        size_t cl = strlen(candidate);
        unsigned allowed = cl <= 4 ? 1 : 2; /* short names: one typo at most */
        size_t gap = cl > length ? cl - length : length - cl;
        if (gap > allowed || cl >= SUGGEST_MAX_LENGTH) continue;
        unsigned distance = edit_distance(name, length, candidate, cl);
        if (distance > 0 && distance <= allowed && distance < best_distance) {
            best = candidate;
            best_distance = distance;
        }
    }
    if (best) snprintf(out, size, "; did you mean '%s'?", best);
}

/* ---- attributes ---------------------------------------------------------- */

static const char *attr_expectation(ir_attr_kind kind) {
    switch (kind) {
    case IR_ATTR_INT: return "an int";
    case IR_ATTR_FLOAT: return "a number";
    case IR_ATTR_BOOL: return "a bool";
    case IR_ATTR_STRING: return "a string";
    case IR_ATTR_INTS: return "a list of ints";
    case IR_ATTR_SHAPE: return "a list of ints and symbolic dims";
    default: return "a value";
    }
}

/* true when `s` is one of the '|'-separated `choices`. */
static bool is_choice(const char *s, const char *choices) {
    size_t n = strlen(s);
    for (const char *p = choices;;) {
        const char *bar = strchr(p, '|');
        size_t length = bar ? (size_t)(bar - p) : strlen(p);
        if (length == n && memcmp(p, s, n) == 0) return true;
        if (!bar) return false;
        p = bar + 1;
    }
}

/* Converts list `v` to an INTS or SHAPE attribute; reports bad entries. */
static bool convert_list(fe_elaborator *el, arena *temp, const char *op, const ir_attr_schema *s,
                         const ast_arg *arg, const fe_value *v, ir_attr *out) {
    uint32_t count = v->as.list.count;
    bool shape = s->kind == IR_ATTR_SHAPE;
    if (shape && count > IR_MAX_DIMS) {
        fe_error(el, arg->loc, "%s: attribute '%s' has %u dims; a shape has at most %d", op, s->name, count,
                 IR_MAX_DIMS);
        return false;
    }
    int64_t *ints = shape ? NULL : arena_array(temp, count ? count : 1, sizeof *ints);
    ir_dim *dims = shape ? arena_array(temp, count ? count : 1, sizeof *dims) : NULL;
    bool ok = true;
    for (uint32_t i = 0; i < count; i++) {
        const fe_value *item = &v->as.list.items[i];
        if (item->kind == FE_VALUE_INT && (!shape || item->as.i >= 0)) {
            if (shape)
                dims[i] = ir_dim_const(item->as.i);
            else
                ints[i] = item->as.i;
        } else if (item->kind == FE_VALUE_DIM && shape) {
            dims[i] = ir_dim_symbol(item->as.dim);
        } else if (item->kind == FE_VALUE_INT) {
            fe_error(el, arg->loc, "%s: attribute '%s' entry %u is %lld; dims must be >= 0", op, s->name,
                     i + 1, (long long)item->as.i);
            ok = false;
        } else {
            fe_error(el, arg->loc, "%s: attribute '%s' entry %u must be %s, found %s", op, s->name, i + 1,
                     shape ? "an int or a symbolic dim" : "an int", fe_value_kind_text(item->kind));
            ok = false;
        }
    }
    if (!ok) return false;
    out->kind = s->kind;
    if (shape) {
        out->as.shape.count = count;
        out->as.shape.items = dims;
    } else {
        out->as.ints.count = count;
        out->as.ints.items = ints;
    }
    return true;
}

/* Converts value `v` of keyword argument `arg` to attribute kind s->kind;
 * lists go to `temp`. */
static bool convert_attr(fe_elaborator *el, arena *temp, const char *op, const ir_attr_schema *s,
                         const ast_arg *arg, const fe_value *v, ir_attr *out) {
    out->kind = s->kind;
    switch (s->kind) {
    case IR_ATTR_INT:
        if (v->kind != FE_VALUE_INT) break;
        out->as.i = v->as.i;
        return true;
    case IR_ATTR_FLOAT:
        if (v->kind == FE_VALUE_INT)
            out->as.f = (double)v->as.i;
        else if (v->kind == FE_VALUE_FLOAT)
            out->as.f = v->as.f;
        else
            break;
        return true;
    case IR_ATTR_BOOL:
        if (v->kind != FE_VALUE_BOOL) break;
        out->as.b = v->as.b;
        return true;
    case IR_ATTR_STRING:
        if (v->kind != FE_VALUE_STRING) break;
        if (s->choices && !is_choice(v->as.s, s->choices)) {
            fe_error(el, arg->loc, "%s: attribute '%s' must be one of %s, found '%.*s%s'", op, s->name,
                     s->choices, DIAG_NAME(v->as.s));
            return false;
        }
        out->as.s = v->as.s;
        return true;
    case IR_ATTR_INTS:
    case IR_ATTR_SHAPE:
        if (v->kind != FE_VALUE_LIST) break;
        return convert_list(el, temp, op, s, arg, v, out);
    case IR_ATTR_FLOATS: {
        if (v->kind != FE_VALUE_LIST) break;
        uint32_t count = v->as.list.count;
        double *items = arena_array(temp, count ? count : 1, sizeof *items);
        for (uint32_t i = 0; i < count; i++) {
            const fe_value *item = &v->as.list.items[i];
            if (item->kind != FE_VALUE_INT && item->kind != FE_VALUE_FLOAT) {
                fe_error(el, arg->loc, "%s: attribute '%s' entry %u must be a number, found %s", op, s->name,
                         i + 1, fe_value_kind_text(item->kind));
                return false;
            }
            items[i] = item->kind == FE_VALUE_INT ? (double)item->as.i : item->as.f;
        }
        out->as.floats.count = count;
        out->as.floats.items = items;
        return true;
    }
    default: SMELT_DIE("attribute '%s' of kind %d", s->name, (int)s->kind);
    }
    out->kind = IR_ATTR_NONE;
    fe_error(el, arg->loc, "%s: attribute '%s' must be %s, found %s", op, s->name, attr_expectation(s->kind),
             fe_value_kind_text(v->kind));
    return false;
}

/* ---- rope's scaling object ------------------------------------------------
 *
 * rope(x, pos, theta = rope_theta, scaling = rope_scaling): an object param
 * bound from config.json (Hugging Face's rope_scaling, or transformers 5's
 * rope_parameters) given for `scaling` spreads its members into the op's
 * attributes, which are named after them: rope_type (or the older `type`)
 * gives `scaling`, rope_theta gives `theta`, and factor, low_freq_factor, ...
 * give the attributes of those names. An attribute the call names itself
 * wins over the member. A member smelt's rope does not take, or a rope_type
 * it does not implement, is an error at the member in config.json: a
 * scaling left out would be a silent wrong answer. */

static const struct {
    const char *member; /* as config.json spells it */
    const char *attr;   /* rope's attribute */
} rope_members[] = {
    {"rope_type", "scaling"},
    {"type", "scaling"},
    {"rope_theta", "theta"},
    {"partial_rotary_factor", "partial_rotary_factor"},
    {"factor", "factor"},
    {"low_freq_factor", "low_freq_factor"},
    {"high_freq_factor", "high_freq_factor"},
    {"original_max_position_embeddings", "original_max_position_embeddings"},
    {"attention_factor", "attention_factor"},
    {"beta_fast", "beta_fast"},
    {"beta_slow", "beta_slow"},
    {"mscale", "mscale"},
    {"mscale_all_dim", "mscale_all_dim"},
    {"truncate", "truncate"},
    {"short_factor", "short_factor"},
    {"long_factor", "long_factor"},
};

/* Converts member `value` (at `loc`) to attribute `s`; reports what does not fit. */
static bool convert_member(fe_elaborator *el, arena *temp, const char *key, const char *member,
                           const ir_attr_schema *s, const json_t *value, smelt_loc loc, ir_attr *out) {
    out->kind = s->kind;
    switch (s->kind) {
    case IR_ATTR_STRING:
        if (!json_is_string(value)) break;
        out->as.s = arena_strndup(temp, json_string_value(value), json_string_length(value));
        if (s->choices && !is_choice(out->as.s, s->choices)) {
            fe_error(el, loc,
                     "%.*s%s: %s '%.*s%s' is not a RoPE variant smelt implements; it implements "
                     "default, linear, dynamic, llama3, yarn and longrope",
                     DIAG_NAME(key), member, DIAG_NAME(out->as.s));
            return false;
        }
        return true;
    case IR_ATTR_FLOAT:
        if (!json_is_number(value)) break;
        out->as.f = json_number_value(value);
        return true;
    case IR_ATTR_INT:
        if (json_is_integer(value)) {
            out->as.i = (int64_t)json_integer_value(value);
            return true;
        }
        if (json_is_real(value) && json_real_value(value) == floor(json_real_value(value)) &&
            fabs(json_real_value(value)) < 9007199254740992.0) {
            out->as.i = (int64_t)json_real_value(value);
            return true;
        }
        break;
    case IR_ATTR_BOOL:
        if (!json_is_boolean(value)) break;
        out->as.b = json_is_true(value);
        return true;
    case IR_ATTR_FLOATS: {
        if (!json_is_array(value)) break;
        size_t count = json_array_size(value);
        if (count > UINT32_MAX) break;
        double *items = arena_array(temp, count ? count : 1, sizeof *items);
        for (size_t i = 0; i < count; i++) {
            const json_t *item = json_array_get(value, i);
            if (!json_is_number(item)) {
                fe_error(el, loc, "%.*s%s: entry %zu of '%s' must be a number", DIAG_NAME(key), i + 1,
                         member);
                return false;
            }
            items[i] = json_number_value(item);
        }
        out->as.floats.count = (uint32_t)count;
        out->as.floats.items = items;
        return true;
    }
    default: break;
    }
    out->kind = IR_ATTR_NONE;
    fe_error(el, loc, "%.*s%s: '%s' must be %s", DIAG_NAME(key), member, attr_expectation(s->kind));
    return false;
}

/* Spreads `object` into the attributes the call did not name. */
static bool spread_rope_object(fe_elaborator *el, arena *temp, const ir_op_info *info, const fe_value *object,
                               ir_attr *attrs, const ast_arg **attr_args) {
    const char *key = object->as.object.key;
    const char *member;
    json_t *value;
    bool ok = true;
    json_object_foreach((json_t *)object->as.object.json, member, value) {
        smelt_loc loc = fe_config_loc(&el->config, key, member);
        const char *attr = NULL;
        for (size_t i = 0; i < sizeof rope_members / sizeof rope_members[0] && !attr; i++)
            if (strcmp(member, rope_members[i].member) == 0) attr = rope_members[i].attr;
        if (!attr) {
            fe_error(el, loc,
                     "%.*s%s: smelt's rope does not take '%.*s%s'; it takes rope_type, rope_theta, "
                     "partial_rotary_factor, factor, low_freq_factor, high_freq_factor, "
                     "original_max_position_embeddings, attention_factor, beta_fast, beta_slow, mscale, "
                     "mscale_all_dim, truncate, short_factor and long_factor",
                     DIAG_NAME(key), DIAG_NAME(member));
            ok = false;
            continue;
        }
        int slot = ir_attr_slot(info->kind, attr);
        if (slot < 0) SMELT_DIE("rope has no attribute '%s'", attr);
        if (json_is_null(value) || attr_args[slot]) continue; /* absent, or named by the call */
        ok &= convert_member(el, temp, key, member, &info->attrs[slot], value, loc, &attrs[slot]);
    }
    return ok;
}

/* "eps, theta" for messages about unknown attributes. */
static const char *attr_names(arena *temp, const ir_op_info *info) {
    size_t total = 1;
    for (uint32_t i = 0; i < info->attr_count; i++)
        total += strlen(info->attrs[i].name) + 2;
    char *text = arena_alloc(temp, total);
    for (uint32_t i = 0; i < info->attr_count; i++) {
        if (i) strcat(text, ", ");
        strcat(text, info->attrs[i].name);
    }
    return text;
}

/* ---- operands ------------------------------------------------------------ */

static void report_operand_count(fe_elaborator *el, const ir_op_info *info, const ast_expr *call,
                                 uint32_t found) {
    int most = info->max_operands < 0 ? IR_MAX_OPERANDS : info->max_operands;
    if (info->min_operands == most)
        fe_error(el, call->loc, "%s takes %d operand%s, found %u", info->name, most, most == 1 ? "" : "s",
                 found);
    else
        fe_error(el, call->loc, "%s takes %d to %d operands, found %u", info->name, info->min_operands, most,
                 found);
}

/* Checks that operand `v` is a tensor or a number. */
static bool check_operand(fe_elaborator *el, const ir_op_info *info, const ast_arg *arg, uint32_t index,
                          const fe_value *v) {
    switch (v->kind) {
    case FE_VALUE_TENSOR:
    case FE_VALUE_INT:
    case FE_VALUE_FLOAT:
    case FE_VALUE_ERROR: return true;
    case FE_VALUE_RESULTS:
        fe_error(el, arg->loc,
                 "%s: operand %u holds the %u results of an op; bind them first with let a, b, ... = ",
                 info->name, index + 1, v->as.results.count);
        return false;
    case FE_VALUE_DIM:
        fe_error(el, arg->loc, "'%.*s%s' is a symbolic dim; use it only as a dim of a shape",
                 DIAG_NAME(fe_dim_name(el, v)));
        return false;
    default:
        fe_error(el, arg->loc, "%s: operand %u must be a tensor or a number, found %s", info->name, index + 1,
                 fe_value_kind_text(v->kind));
        return false;
    }
}

/* A number operand becomes a scalar f32 const op, located at the argument. */
static ir_value_id make_const(fe_elaborator *el, const fe_value *v, smelt_loc loc) {
    ir_module *m = el->module;
    uint32_t op = ir_append_op(m, IR_OP_CONST, NULL, 0, UINT32_MAX, loc);
    double value = v->kind == FE_VALUE_INT ? (double)v->as.i : v->as.f;
    if (!ir_op_set_float(m, op, "value", value)) SMELT_DIE("const has no float attribute 'value'");
    ir_value_id id = ir_op_result(m, op, 0);
    m->values[id].type = (ir_type){.dtype = SMELT_DTYPE_F32, .rank = 0};
    return id;
}

/* ---- the call ------------------------------------------------------------ */

static fe_value unknown_op(fe_elaborator *el, const ast_expr *call) {
    const char *name = call->as.call.name;
    char hint[96];
    suggest_name(name, hint, sizeof hint);
    fe_error(el, call->loc, "unknown op '%.*s%s'%s", DIAG_NAME(name), hint);
    for (uint32_t i = 0; i < call->as.call.arg_count; i++)
        fe_eval_expr(el, call->as.call.args[i].value);
    return fe_error_value();
}

/* The op of `call`; `temp` holds the call's working memory. */
static fe_value build_op(fe_elaborator *el, const ast_expr *call, const ir_op_info *info, arena *temp) {
    uint32_t arg_count = call->as.call.arg_count;
    fe_value *values = arena_array(temp, arg_count ? arg_count : 1, sizeof *values);
    ir_attr *attrs = arena_array(temp, info->attr_count ? info->attr_count : 1, sizeof *attrs);
    const ast_arg **attr_args = arena_array(temp, info->attr_count ? info->attr_count : 1, sizeof *attr_args);
    bool poisoned = false, bad = false;
    const fe_value *scaling_object = NULL; /* rope's `scaling = <object param>` */
    uint32_t operand_count = 0;
    for (uint32_t i = 0; i < arg_count; i++) {
        values[i] = fe_eval_expr(el, call->as.call.args[i].value);
        if (values[i].kind == FE_VALUE_ERROR) poisoned = true;
        if (!call->as.call.args[i].keyword) operand_count++;
        if (el->stopped) return fe_error_value();
    }

    if (operand_count < (uint32_t)info->min_operands ||
        (info->max_operands >= 0 && operand_count > (uint32_t)info->max_operands) ||
        operand_count > IR_MAX_OPERANDS) {
        report_operand_count(el, info, call, operand_count);
        bad = true;
    }
    for (uint32_t i = 0, index = 0; i < arg_count; i++) {
        const ast_arg *arg = &call->as.call.args[i];
        if (!arg->keyword) {
            bad |= !check_operand(el, info, arg, index++, &values[i]);
            continue;
        }
        int slot = ir_attr_slot(info->kind, arg->keyword);
        if (slot < 0) {
            if (info->attr_count == 0)
                fe_error(el, arg->loc, "%s takes no attributes, found '%.*s%s'", info->name,
                         DIAG_NAME(arg->keyword));
            else
                fe_error(el, arg->loc, "%s has no attribute '%.*s%s'; its attributes are %s", info->name,
                         DIAG_NAME(arg->keyword), attr_names(temp, info));
            bad = true;
        } else if (attr_args[slot]) {
            fe_error(el, arg->loc, "%s: attribute '%s' is given twice", info->name, info->attrs[slot].name);
            fe_note(el, attr_args[slot]->loc, "'%s' was first given here", info->attrs[slot].name);
            bad = true;
        } else if (info->kind == IR_OP_ROPE && strcmp(arg->keyword, "scaling") == 0 &&
                   (values[i].kind == FE_VALUE_OBJECT || values[i].kind == FE_VALUE_NULL)) {
            if (scaling_object) {
                fe_error(el, arg->loc, "%s: attribute 'scaling' is given twice", info->name);
                bad = true;
            }
            scaling_object = &values[i]; /* spread below, after the attributes the call names */
        } else {
            attr_args[slot] = arg;
            if (values[i].kind != FE_VALUE_ERROR)
                bad |= !convert_attr(el, temp, info->name, &info->attrs[slot], arg, &values[i], &attrs[slot]);
        }
    }
    if (scaling_object && scaling_object->kind == FE_VALUE_OBJECT)
        bad |= !spread_rope_object(el, temp, info, scaling_object, attrs, attr_args);
    for (uint32_t slot = 0; slot < info->attr_count; slot++) {
        if (!attr_args[slot] && attrs[slot].kind == IR_ATTR_NONE && !info->attrs[slot].default_text) {
            fe_error(el, call->loc, "%s: missing attribute '%s'", info->name, info->attrs[slot].name);
            bad = true;
        }
    }

    uint32_t result_count = UINT32_MAX;
    if (info->results < 0 && !bad && !poisoned) { /* split: one result per entry of `sizes` */
        int slot = ir_attr_slot(info->kind, "sizes");
        if (slot < 0 || attrs[slot].kind != IR_ATTR_INTS)
            SMELT_DIE("op '%s' has no int-list 'sizes'", info->name);
        result_count = attrs[slot].as.ints.count;
        if (result_count == 0 || result_count > IR_MAX_RESULTS) {
            fe_error(el, attr_args[slot]->loc, "%s: attribute 'sizes' has %u entries; it needs 1 to %d",
                     info->name, result_count, IR_MAX_RESULTS);
            bad = true;
        }
    }
    if (bad || poisoned) return fe_error_value();

    ir_value_id *operands = arena_array(temp, operand_count ? operand_count : 1, sizeof *operands);
    for (uint32_t i = 0, index = 0; i < arg_count; i++) {
        if (call->as.call.args[i].keyword) continue;
        if (!fe_room_for_op(el, call->loc)) return fe_error_value();
        operands[index++] = values[i].kind == FE_VALUE_TENSOR
                                ? values[i].as.tensor
                                : make_const(el, &values[i], call->as.call.args[i].value->loc);
    }
    if (!fe_room_for_op(el, call->loc)) return fe_error_value();
    ir_module *m = el->module;
    uint32_t op = ir_append_op(m, info->kind, operands, operand_count, result_count, call->loc);
    for (uint32_t slot = 0; slot < info->attr_count; slot++) {
        if (attrs[slot].kind == IR_ATTR_NONE) continue;
        if (!ir_op_set_attr(m, op, info->attrs[slot].name, &attrs[slot]))
            SMELT_DIE("op '%s' refused its attribute '%s'", info->name, info->attrs[slot].name);
    }
    ir_op_fill_defaults(m, op);
    if (info->kind == IR_OP_CONST)
        m->values[ir_op_result(m, op, 0)].type = (ir_type){.dtype = SMELT_DTYPE_F32};

    const ir_op *built = ir_op_at(m, op);
    if (built->result_count == 1) return (fe_value){.kind = FE_VALUE_TENSOR, .as.tensor = built->results[0]};
    return (fe_value){.kind = FE_VALUE_RESULTS, .as.results = {op, built->result_count}};
}

fe_value fe_eval_op_call(fe_elaborator *el, const ast_expr *call) {
    const ir_op_info *info = ir_op_info_by_name(call->as.call.name);
    if (!info) return unknown_op(el, call);
    if (info->kind == IR_OP_INPUT || info->kind == IR_OP_WEIGHT || info->kind == IR_OP_OUTPUT) {
        static const char *const statements[] = {
            [IR_OP_INPUT] = "declare inputs with 'input NAME: dtype[dims]'",
            [IR_OP_WEIGHT] = "declare weights with 'weight NAME: [dims] = \"hf.name\"'",
            [IR_OP_OUTPUT] = "mark outputs with 'output NAME = value'",
        };
        fe_error(el, call->loc, "'%s' cannot be called; %s", info->name, statements[info->kind]);
        return fe_error_value();
    }

    arena temp; /* freed here: a model may make millions of calls */
    arena_init(&temp);
    arena_recovery recovery;
    if (arena_recovery_enter(&recovery, setjmp(recovery.where))) {
        arena_free(&temp);
        arena_out_of_memory();
    }
    fe_value v = build_op(el, call, info, &temp);
    arena_recovery_leave(&recovery);
    arena_free(&temp);
    return v;
}
