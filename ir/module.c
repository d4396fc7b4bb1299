/* module.c - building and editing an IR module (see ir.h). */
#include "ir.h"

#include <stdlib.h>
#include <string.h>

void ir_module_init(ir_module *m, const char *name) {
    memset(m, 0, sizeof *m);
    arena_init(&m->arena);
    m->name = name ? arena_strdup(&m->arena, name) : "model"; /* a name needs a recovery point */
    m->source_file = -1;
}

void ir_module_free(ir_module *m) {
    arena_free(&m->arena);
    memset(m, 0, sizeof *m);
}

/* Grows an arena-held array to hold one more element. */
#define GROW(m, array, count, capacity)                                                                      \
    do {                                                                                                     \
        if ((count) == (capacity)) {                                                                         \
            uint32_t grown = (capacity) ? (capacity)*2 : 16;                                                 \
            (array) = arena_grow(&(m)->arena, (array), (count), grown, sizeof *(array));                     \
            (capacity) = grown;                                                                              \
        }                                                                                                    \
    } while (0)

ir_param *ir_add_param(ir_module *m, const char *name, ir_param_type type) {
    GROW(m, m->params, m->param_count, m->param_capacity);
    ir_param *p = &m->params[m->param_count++];
    p->name = arena_strdup(&m->arena, name);
    p->type = type;
    return p;
}

int32_t ir_add_symbol(ir_module *m, const char *name, int64_t bound, smelt_loc loc) {
    GROW(m, m->symbols, m->symbol_count, m->symbol_capacity);
    ir_symbol *s = &m->symbols[m->symbol_count];
    s->name = arena_strdup(&m->arena, name);
    s->bound = bound;
    s->loc = loc;
    return (int32_t)m->symbol_count++;
}

void ir_add_ignored_tensor(ir_module *m, const char *pattern) {
    for (uint32_t i = 0; i < m->ignored_tensor_count; i++)
        if (strcmp(m->ignored_tensors[i], pattern) == 0) return;
    GROW(m, m->ignored_tensors, m->ignored_tensor_count, m->ignored_tensor_capacity);
    m->ignored_tensors[m->ignored_tensor_count++] = arena_strdup(&m->arena, pattern);
}

/* Iterative, with one backtrack point (the last '*'), as for shell globs:
 * with '*' the only wildcard a later '*' can always take over from an
 * earlier one, so the match never recurses; it takes at most
 * strlen(pattern) * strlen(name) steps. */
bool ir_tensor_pattern_matches(const char *pattern, const char *name) {
    const char *star = NULL, *resume = NULL;
    while (*name) {
        if (*pattern == '*') {
            star = pattern++;
            resume = name;
        } else if (*pattern == *name) {
            pattern++;
            name++;
        } else if (star) {
            pattern = star + 1;
            name = ++resume;
        } else {
            return false;
        }
    }
    while (*pattern == '*')
        pattern++;
    return *pattern == '\0';
}

bool ir_tensor_is_ignored(const ir_module *m, const char *name) {
    for (uint32_t i = 0; i < m->ignored_tensor_count; i++)
        if (ir_tensor_pattern_matches(m->ignored_tensors[i], name)) return true;
    return false;
}

int32_t ir_find_symbol(const ir_module *m, const char *name) {
    for (uint32_t i = 0; i < m->symbol_count; i++)
        if (strcmp(m->symbols[i].name, name) == 0) return (int32_t)i;
    return -1;
}

const ir_op_info *ir_op_info_at(const ir_module *m, uint32_t op) { return ir_op_info_of(m->ops[op].kind); }

static ir_value_id new_value(ir_module *m, uint32_t def_op, uint32_t result_index) {
    GROW(m, m->values, m->value_count, m->value_capacity);
    ir_value *v = &m->values[m->value_count];
    memset(v, 0, sizeof *v);
    v->def_op = def_op;
    v->result_index = result_index;
    return m->value_count++;
}

uint32_t ir_insert_op(ir_module *m, uint32_t before, ir_op_kind kind, const ir_value_id *operands,
                      uint32_t operand_count, uint32_t result_count, smelt_loc loc) {
    const ir_op_info *info = ir_op_info_of(kind);
    if (before > m->op_count) SMELT_DIE("insert position %u past %u ops", before, m->op_count);
    if (result_count == UINT32_MAX) result_count = info->results < 0 ? 0 : (uint32_t)info->results;
    if (operand_count > IR_MAX_OPERANDS || result_count > IR_MAX_RESULTS)
        SMELT_DIE("op with %u operands and %u results", operand_count, result_count);
    GROW(m, m->ops, m->op_count, m->op_capacity);
    if (before < m->op_count) {
        memmove(&m->ops[before + 1], &m->ops[before], (m->op_count - before) * sizeof *m->ops);
        for (uint32_t i = 0; i < m->value_count; i++)
            if (m->values[i].def_op >= before) m->values[i].def_op++;
    }
    m->op_count++;
    ir_op *op = &m->ops[before];
    memset(op, 0, sizeof *op);
    op->group = IR_NONE;
    op->step = IR_NONE;
    op->kind = kind;
    op->loc = loc;
    op->operand_count = operand_count;
    op->operands = arena_array(&m->arena, operand_count ? operand_count : 1, sizeof(ir_value_id));
    if (operand_count) memcpy(op->operands, operands, operand_count * sizeof(ir_value_id));
    op->attrs = arena_array(&m->arena, info->attr_count ? info->attr_count : 1, sizeof(ir_attr));
    op->result_count = result_count;
    op->results = arena_array(&m->arena, result_count ? result_count : 1, sizeof(ir_value_id));
    for (uint32_t i = 0; i < result_count; i++)
        op->results[i] = new_value(m, before, i);
    return before;
}

uint32_t ir_append_op(ir_module *m, ir_op_kind kind, const ir_value_id *operands, uint32_t operand_count,
                      uint32_t result_count, smelt_loc loc) {
    return ir_insert_op(m, m->op_count, kind, operands, operand_count, result_count, loc);
}

const ir_attr *ir_op_attr(const ir_module *m, uint32_t op, const char *name) {
    int slot = ir_attr_slot(m->ops[op].kind, name);
    if (slot < 0 || m->ops[op].attrs[slot].kind == IR_ATTR_NONE) return NULL;
    return &m->ops[op].attrs[slot];
}

/* Copies the variable parts of an attribute into the module's arena. */
static ir_attr copy_attr(ir_module *m, const ir_attr *a) {
    ir_attr c = *a;
    switch (a->kind) {
    case IR_ATTR_STRING: c.as.s = arena_strdup(&m->arena, a->as.s); break;
    case IR_ATTR_INTS:
        c.as.ints.items = arena_grow(&m->arena, a->as.ints.items, a->as.ints.count,
                                     a->as.ints.count ? a->as.ints.count : 1, sizeof(int64_t));
        break;
    case IR_ATTR_SHAPE:
        c.as.shape.items = arena_grow(&m->arena, a->as.shape.items, a->as.shape.count,
                                      a->as.shape.count ? a->as.shape.count : 1, sizeof(ir_dim));
        break;
    case IR_ATTR_FLOATS:
        c.as.floats.items = arena_grow(&m->arena, a->as.floats.items, a->as.floats.count,
                                       a->as.floats.count ? a->as.floats.count : 1, sizeof(double));
        break;
    default: break;
    }
    return c;
}

bool ir_op_set_attr(ir_module *m, uint32_t op, const char *name, const ir_attr *value) {
    int slot = ir_attr_slot(m->ops[op].kind, name);
    if (slot < 0) return false;
    if (ir_op_info_at(m, op)->attrs[slot].kind != value->kind) return false;
    m->ops[op].attrs[slot] = copy_attr(m, value);
    return true;
}

bool ir_op_set_int(ir_module *m, uint32_t op, const char *name, int64_t v) {
    return ir_op_set_attr(m, op, name, &(ir_attr){.kind = IR_ATTR_INT, .as.i = v});
}
bool ir_op_set_float(ir_module *m, uint32_t op, const char *name, double v) {
    return ir_op_set_attr(m, op, name, &(ir_attr){.kind = IR_ATTR_FLOAT, .as.f = v});
}
bool ir_op_set_bool(ir_module *m, uint32_t op, const char *name, bool v) {
    return ir_op_set_attr(m, op, name, &(ir_attr){.kind = IR_ATTR_BOOL, .as.b = v});
}
bool ir_op_set_string(ir_module *m, uint32_t op, const char *name, const char *v) {
    return ir_op_set_attr(m, op, name, &(ir_attr){.kind = IR_ATTR_STRING, .as.s = v});
}

static const ir_attr *required_attr(const ir_module *m, uint32_t op, const char *name, ir_attr_kind kind) {
    const ir_attr *a = ir_op_attr(m, op, name);
    if (!a || a->kind != kind)
        SMELT_DIE("op %u (%s) has no %s attribute '%s'", op, ir_op_info_at(m, op)->name,
                  ir_attr_kind_name(kind), name);
    return a;
}
int64_t ir_op_int(const ir_module *m, uint32_t op, const char *name) {
    return required_attr(m, op, name, IR_ATTR_INT)->as.i;
}
double ir_op_float(const ir_module *m, uint32_t op, const char *name) {
    return required_attr(m, op, name, IR_ATTR_FLOAT)->as.f;
}
bool ir_op_bool(const ir_module *m, uint32_t op, const char *name) {
    return required_attr(m, op, name, IR_ATTR_BOOL)->as.b;
}
const char *ir_op_string(const ir_module *m, uint32_t op, const char *name) {
    return required_attr(m, op, name, IR_ATTR_STRING)->as.s;
}

static bool matmul_has_codes(const ir_module *m, uint32_t op) {
    const ir_attr *a = ir_op_attr(m, op, "act_codes");
    return a && a->kind == IR_ATTR_BOOL && a->as.b;
}

ir_value_id ir_matmul_bias(const ir_module *m, uint32_t op) {
    const ir_op *o = &m->ops[op];
    uint32_t plain = o->operand_count - (matmul_has_codes(m, op) ? 2 : 0);
    return o->kind == IR_OP_MATMUL && plain == 3 ? o->operands[2] : IR_NO_VALUE;
}

bool ir_matmul_act_codes(const ir_module *m, uint32_t op, ir_value_id *codes, ir_value_id *scales) {
    const ir_op *o = &m->ops[op];
    bool has = o->kind == IR_OP_MATMUL && matmul_has_codes(m, op) && o->operand_count >= 4;
    *codes = has ? o->operands[o->operand_count - 2] : IR_NO_VALUE;
    *scales = has ? o->operands[o->operand_count - 1] : IR_NO_VALUE;
    return has;
}

/* Defaults in ops.def are C-literal text: 0, -1, true, "neox"; a float
 * list's only default is the empty list, [] (items stay NULL). */
static ir_attr parse_default(const ir_attr_schema *s) {
    ir_attr a = {.kind = s->kind};
    const char *t = s->default_text;
    switch (s->kind) {
    case IR_ATTR_INT: a.as.i = strtoll(t, NULL, 10); break;
    case IR_ATTR_FLOAT: a.as.f = strtod(t, NULL); break;
    case IR_ATTR_BOOL: a.as.b = strcmp(t, "true") == 0; break;
    case IR_ATTR_STRING: a.as.s = t; break; /* quotes stripped by the caller */
    case IR_ATTR_FLOATS:
        if (strcmp(t, "[]") != 0) SMELT_DIE("attribute '%s': a float list's default must be []", s->name);
        break;
    default:
        SMELT_DIE("attribute '%s' of kind %s cannot have a default", s->name, ir_attr_kind_name(s->kind));
    }
    return a;
}

void ir_op_fill_defaults(ir_module *m, uint32_t op) {
    const ir_op_info *info = ir_op_info_at(m, op);
    for (uint32_t i = 0; i < info->attr_count; i++) {
        const ir_attr_schema *s = &info->attrs[i];
        if (m->ops[op].attrs[i].kind != IR_ATTR_NONE || !s->default_text) continue;
        ir_attr a = parse_default(s);
        if (s->kind == IR_ATTR_STRING) { /* strip the quotes of "neox" */
            size_t n = strlen(s->default_text);
            a.as.s = arena_strndup(&m->arena, s->default_text + 1, n >= 2 ? n - 2 : 0);
        }
        m->ops[op].attrs[i] = a;
    }
}

void ir_replace_uses(ir_module *m, ir_value_id from, ir_value_id to) {
    for (uint32_t i = 0; i < m->op_count; i++) {
        ir_op *op = &m->ops[i];
        for (uint32_t j = 0; j < op->operand_count; j++)
            if (op->operands[j] == from) op->operands[j] = to;
    }
}

void ir_module_compact(ir_module *m) {
    uint32_t kept = 0;
    for (uint32_t i = 0; i < m->op_count; i++) {
        if (m->ops[i].dead) continue;
        if (kept != i) m->ops[kept] = m->ops[i];
        for (uint32_t r = 0; r < m->ops[kept].result_count; r++)
            m->values[m->ops[kept].results[r]].def_op = kept;
        kept++;
    }
    m->op_count = kept;
}

uint32_t *ir_use_counts(const ir_module *m) {
    uint32_t *counts = calloc(m->value_count ? m->value_count : 1, sizeof *counts);
    if (!counts) arena_out_of_memory();
    for (uint32_t i = 0; i < m->op_count; i++) {
        const ir_op *op = &m->ops[i];
        if (op->dead) continue;
        for (uint32_t j = 0; j < op->operand_count; j++)
            if (op->operands[j] < m->value_count) counts[op->operands[j]]++;
    }
    return counts;
}

bool ir_type_equal(const ir_type *a, const ir_type *b) {
    if (a->dtype != b->dtype || a->rank != b->rank) return false;
    for (unsigned i = 0; i < a->rank; i++)
        if (!ir_dim_equal(a->dims[i], b->dims[i])) return false;
    return true;
}

bool ir_type_matches(const ir_module *m, const ir_type *actual, const ir_type *inferred) {
    if (ir_type_equal(actual, inferred)) return true;
    if (!m->precision || !smelt_dtype_is_float(actual->dtype) || !smelt_dtype_is_float(inferred->dtype))
        return false;
    ir_type same = *actual;
    same.dtype = inferred->dtype;
    return ir_type_equal(&same, inferred);
}

bool ir_type_bytes(const ir_module *m, const ir_type *t, int32_t token_symbol, int64_t tokens,
                   uint64_t *out) {
    uint64_t elements = 1;
    for (unsigned i = 0; i < t->rank; i++) {
        ir_dim d = t->dims[i];
        int64_t size = !ir_dim_is_symbol(d)                   ? d.size
                       : d.symbol == token_symbol             ? tokens
                       : (uint32_t)d.symbol < m->symbol_count ? m->symbols[d.symbol].bound
                                                              : -1;
        if (size < 0 || size_mul_overflow(elements, (uint64_t)size, &elements)) return false;
    }
    return smelt_dtype_storage_bytes(t->dtype, elements, out);
}

bool ir_op_is_weight_concat(const ir_module *m, uint32_t op) {
    const ir_op *o = &m->ops[op];
    if (o->dead || o->kind != IR_OP_CONCAT || o->operand_count < 2) return false;
    const ir_attr *axis = ir_op_attr(m, op, "axis");
    if (!axis || axis->kind != IR_ATTR_INT || axis->as.i != 0) return false;
    for (uint32_t j = 0; j < o->operand_count; j++)
        if (m->ops[m->values[o->operands[j]].def_op].kind != IR_OP_WEIGHT) return false;
    return true;
}

bool ir_op_launches(const ir_module *m, uint32_t op) {
    const ir_op *o = &m->ops[op];
    if (o->dead || (unsigned)o->kind >= IR_OP_COUNT) return false;
    const ir_op_info *info = ir_op_info_of(o->kind);
    return strcmp(info->family, "decl") != 0 && !(info->flags & IR_OPF_VIEW) &&
           !ir_op_is_weight_concat(m, op);
}

bool *ir_weight_table_ops(const ir_module *m) {
    bool *entry = calloc(m->op_count ? m->op_count : 1, sizeof *entry);
    bool *other_reader = calloc(m->op_count ? m->op_count : 1, sizeof *other_reader);
    bool *in_concat = calloc(m->op_count ? m->op_count : 1, sizeof *in_concat);
    if (!entry || !other_reader || !in_concat) {
        free(entry);
        free(other_reader);
        free(in_concat);
        return NULL;
    }
    for (uint32_t i = 0; i < m->op_count; i++) {
        const ir_op *o = &m->ops[i];
        if (o->dead) continue;
        bool concat = ir_op_is_weight_concat(m, i);
        entry[i] = concat;
        for (uint32_t j = 0; j < o->operand_count; j++) {
            uint32_t def = m->values[o->operands[j]].def_op;
            if (concat)
                in_concat[def] = true;
            else
                other_reader[def] = true;
        }
    }
    for (uint32_t i = 0; i < m->op_count; i++)
        if (!m->ops[i].dead && m->ops[i].kind == IR_OP_WEIGHT) entry[i] = other_reader[i] || !in_concat[i];
    free(other_reader);
    free(in_concat);
    return entry;
}

ir_value_id *ir_view_roots(const ir_module *m) {
    ir_value_id *root = malloc((m->value_count ? m->value_count : 1) * sizeof *root);
    if (!root) return NULL;
    for (ir_value_id v = 0; v < m->value_count; v++)
        root[v] = v;
    for (uint32_t i = 0; i < m->op_count; i++) { /* operands are defined before their users */
        const ir_op *op = &m->ops[i];
        if (!op->dead && (ir_op_info_of(op->kind)->flags & IR_OPF_VIEW) && op->operand_count >= 1)
            root[op->results[0]] = root[op->operands[0]];
    }
    return root;
}

bool ir_type_max_elements(const ir_module *m, const ir_type *t, uint64_t *out) {
    uint64_t n = 1;
    for (unsigned i = 0; i < t->rank; i++) {
        ir_dim d = t->dims[i];
        int64_t size =
            d.symbol >= 0 && (uint32_t)d.symbol < m->symbol_count ? m->symbols[d.symbol].bound : d.size;
        if (size < 0 || size_mul_overflow(n, (uint64_t)size, &n)) return false;
    }
    *out = n;
    return true;
}
