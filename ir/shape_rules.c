/* shape_rules.c - the result type of every op from its operands' types and
 * its attributes (ir_infer_op_types, declared in ir.h).
 *
 * One static function per op, named infer_<op> after ops.def, dispatched by a
 * table generated from ops.def (so an op without a rule does not compile).
 * The operand conventions are the ones written at the top of ops.def.
 *
 * Dims compare with ir_dim_equal: a symbol equals only the same symbol, so
 * `tokens` never matches 8192 even when that is its bound. Rules accept any
 * module, however malformed: operand and result counts, operand ids, ranks
 * and attribute kinds are checked here again before they are used, and a
 * bad op is reported at its location as "<op>: <what is wrong>".
 */
#include "ir.h"
#include "quant.h"
#include "rope.h"

#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct rule_ctx {
    const ir_module *m;
    const ir_op *op;
    uint32_t op_index; /* op == &m->ops[op_index] */
    const ir_op_info *info;
    diag_engine *d;
    ir_attr default_attr;  /* an absent attribute's schema default */
    char default_text[32]; /* its text when it is a string */
} rule_ctx;

/* Texts for messages, in buffers that live until the end of the enclosing block. */
#define TYPE_TEXT(c, t) ir_format_type((c)->m, (t), (char[IR_TYPE_TEXT_MAX]){0}, IR_TYPE_TEXT_MAX)
#define DIM_TEXT(c, dim) ir_format_dim((c)->m, (dim), (char[DIAG_NAME_MAX + 32]){0}, DIAG_NAME_MAX + 32)

static const ir_type *operand(const rule_ctx *c, uint32_t i) {
    return &c->m->values[c->op->operands[i]].type;
}

/* Reports "<op>: <message>" at the op's location; returns false. */
static bool rule_fail(const rule_ctx *c, const char *fmt, ...) __attribute__((format(printf, 2, 3)));

static bool rule_fail(const rule_ctx *c, const char *fmt, ...) {
    char message[4096];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(message, sizeof message, fmt, ap);
    va_end(ap);
    diag_error(c->d, c->op->loc, "%s: %s", c->info->name, message);
    return false;
}

/* ---- attributes ----------------------------------------------------------- */

/* The attribute `name` of kind `kind`: the op's own, else the schema default
 * (held in c->default_attr), else NULL after reporting it missing. */
static const ir_attr *attr_of_kind(rule_ctx *c, const char *name, ir_attr_kind kind) {
    int slot = ir_attr_slot(c->op->kind, name);
    if (slot < 0)
        SMELT_DIE("shape rule of '%s' asks for attribute '%s' outside its schema", c->info->name, name);
    const ir_attr *a = &c->op->attrs[slot];
    const ir_attr_schema *s = &c->info->attrs[slot];
    if (a->kind == IR_ATTR_NONE) {
        if (!s->default_text) {
            rule_fail(c, "missing required attribute '%s'", name);
            return NULL;
        }
        ir_attr *def = &c->default_attr;
        memset(def, 0, sizeof *def);
        def->kind = s->kind;
        switch (s->kind) {
        case IR_ATTR_INT: def->as.i = strtoll(s->default_text, NULL, 10); break;
        case IR_ATTR_FLOAT: def->as.f = strtod(s->default_text, NULL); break;
        case IR_ATTR_BOOL: def->as.b = strcmp(s->default_text, "true") == 0; break;
        case IR_ATTR_FLOATS: break; /* [] */
        case IR_ATTR_STRING: {      /* "\"neox\"" -> neox */
            size_t n = strlen(s->default_text);
            n = n >= 2 ? n - 2 : 0;
            if (n >= sizeof c->default_text) n = sizeof c->default_text - 1;
            memcpy(c->default_text, s->default_text + 1, n);
            c->default_text[n] = '\0';
            def->as.s = c->default_text;
            break;
        }
        default: SMELT_DIE("attribute '%s' of kind %s has a default", name, ir_attr_kind_name(s->kind));
        }
        a = def;
    }
    if (a->kind != kind) {
        rule_fail(c, "attribute '%s' must be %s, found %s", name, ir_attr_kind_name(kind),
                  ir_attr_kind_name(a->kind));
        return NULL;
    }
    if ((kind == IR_ATTR_STRING && !a->as.s) ||
        (kind == IR_ATTR_INTS && a->as.ints.count && !a->as.ints.items) ||
        (kind == IR_ATTR_SHAPE && a->as.shape.count && !a->as.shape.items) ||
        (kind == IR_ATTR_FLOATS && a->as.floats.count && !a->as.floats.items)) {
        rule_fail(c, "attribute '%s' has no value", name);
        return NULL;
    }
    return a;
}

/* The helpers that return a value through `out` write it on every path (zero
 * when they fail), so no caller holds an uninitialised local and gcc -O2 can
 * see that none does (-Wmaybe-uninitialized). */
static bool rule_attr_int(rule_ctx *c, const char *name, int64_t *out) {
    const ir_attr *a = attr_of_kind(c, name, IR_ATTR_INT);
    *out = a ? a->as.i : 0;
    return a != NULL;
}

static bool rule_attr_float(rule_ctx *c, const char *name, double *out) {
    const ir_attr *a = attr_of_kind(c, name, IR_ATTR_FLOAT);
    *out = a ? a->as.f : 0.0;
    return a != NULL;
}

static bool rule_attr_bool(rule_ctx *c, const char *name, bool *out) {
    const ir_attr *a = attr_of_kind(c, name, IR_ATTR_BOOL);
    *out = a ? a->as.b : false;
    return a != NULL;
}

static bool rule_attr_string(rule_ctx *c, const char *name, const char **out) {
    const ir_attr *a = attr_of_kind(c, name, IR_ATTR_STRING);
    *out = a ? a->as.s : NULL;
    return a != NULL;
}

static const ir_attr *rule_attr_list(rule_ctx *c, const char *name, ir_attr_kind kind) {
    return attr_of_kind(c, name, kind);
}

/* ---- checks shared by the rules ---------------------------------------------- */

static bool rule_same_dtype(const rule_ctx *c, const char *a_name, const ir_type *a, const char *b_name,
                            const ir_type *b) {
    if (a->dtype == b->dtype) return true;
    /* Storage dtypes (after `precision`) may differ among floats: arithmetic is f32. */
    if (c->m->precision && smelt_dtype_is_float(a->dtype) && smelt_dtype_is_float(b->dtype)) return true;
    return rule_fail(c, "operand dtypes differ: %s is %s but %s is %s", a_name, smelt_dtype_name(a->dtype),
                     b_name, smelt_dtype_name(b->dtype));
}

static bool rule_integer(const rule_ctx *c, const char *name, const ir_type *t) {
    if (t->dtype == SMELT_DTYPE_I32 || t->dtype == SMELT_DTYPE_I64) return true;
    return rule_fail(c, "%s must have an integer dtype (i32 or i64), found %s", name, TYPE_TEXT(c, t));
}

static bool rule_rank(const rule_ctx *c, const char *name, const ir_type *t, unsigned rank) {
    if (t->rank == rank) return true;
    return rule_fail(c, "%s must have rank %u, found %s", name, rank, TYPE_TEXT(c, t));
}

static bool rule_min_rank(const rule_ctx *c, const char *name, const ir_type *t, unsigned rank) {
    if (t->rank >= rank) return true;
    return rule_fail(c, "%s must have rank %u or more, found %s", name, rank, TYPE_TEXT(c, t));
}

static bool rule_axis(const rule_ctx *c, int64_t axis, unsigned rank, unsigned *out) {
    *out = 0;
    if (rank == 0) return rule_fail(c, "axis %lld is out of range for a scalar", (long long)axis);
    if (axis < -(int64_t)rank || axis >= (int64_t)rank)
        return rule_fail(c, "axis %lld is out of range for rank %u (expected %d..%u)", (long long)axis, rank,
                         -(int)rank, rank - 1);
    *out = (unsigned)(axis < 0 ? axis + rank : axis);
    return true;
}

static bool rule_constant_dim(const rule_ctx *c, const char *what, ir_dim d, int64_t *out) {
    if (!ir_dim_is_symbol(d)) {
        *out = d.size;
        return true;
    }
    *out = 0;
    return rule_fail(c, "%s must be a constant, found the symbol '%s'", what, DIM_TEXT(c, d));
}

/* `t` must have exactly the dims `expected` (rank `rank`). */
static bool rule_expect_dims(const rule_ctx *c, const char *name, const ir_type *t, const char *pattern,
                             const ir_dim *expected, unsigned rank) {
    bool same = t->rank == rank;
    for (unsigned i = 0; same && i < rank; i++)
        same = ir_dim_equal(t->dims[i], expected[i]);
    if (same) return true;
    ir_type want = {.dtype = t->dtype, .rank = (uint8_t)rank};
    memcpy(want.dims, expected, rank * sizeof *expected);
    return rule_fail(c, "%s must be %s = %s, found %s", name, pattern, TYPE_TEXT(c, &want), TYPE_TEXT(c, t));
}

/* ---- dispatch -------------------------------------------------------------- */

static bool rule_float(const rule_ctx *c, const char *name, const ir_type *t) {
    if (smelt_dtype_is_float(t->dtype)) return true;
    return rule_fail(c, "%s must have a float dtype, found %s", name, TYPE_TEXT(c, t));
}

/* "[0, 2, 1]" for an INTS attribute, cut after a few items. */
static const char *ints_text(const ir_attr *a, char *buffer, size_t size) {
    size_t used = 0;
    buffer[0] = '\0';
    for (uint32_t i = 0; i <= a->as.ints.count && used < size; i++) {
        int n;
        if (i == a->as.ints.count)
            n = snprintf(buffer + used, size - used, "]");
        else if (i == 16)
            n = snprintf(buffer + used, size - used, ", ...]");
        else
            n = snprintf(buffer + used, size - used, "%s%lld", i ? ", " : "[",
                         (long long)a->as.ints.items[i]);
        if (n < 0) break;
        used += (size_t)n;
        if (i == 16) break;
    }
    if (a->as.ints.count == 0) snprintf(buffer, size, "[]");
    return buffer;
}
#define INTS_TEXT(a) ints_text((a), (char[256]){0}, 256)

/* ---- declarations: input, weight, const, output -------------------------- */

/* The type written on the op (its result's current type). */
static bool declared_type(rule_ctx *c, ir_type *out) {
    const ir_type *t = &c->m->values[c->op->results[0]].type;
    if (t->dtype == SMELT_DTYPE_UNKNOWN) return rule_fail(c, "the declared type is missing");
    *out = *t;
    return true;
}

static bool infer_input(rule_ctx *c, ir_type *out) { return declared_type(c, out); }

static bool infer_weight(rule_ctx *c, ir_type *out) { return declared_type(c, out); }

/* const() {value}: a declared scalar. */
static bool infer_const(rule_ctx *c, ir_type *out) {
    double value;
    if (!rule_attr_float(c, "value", &value) || !declared_type(c, out)) return false;
    if (out->rank != 0) return rule_fail(c, "a constant must be a scalar, found %s", TYPE_TEXT(c, out));
    return true;
}

/* output(x): no result to infer. */
static bool infer_output(rule_ctx *c, ir_type *out) { return true; }

/* ---- compute ----------------------------------------------------------------- */

/* embedding(table[V, D], ids[...]) -> [..., D]; a quantized table's codes
 * (int8, one scale per row: the verifier's rule) dequantize to floats. */
static bool infer_embedding(rule_ctx *c, ir_type *out) {
    const ir_type *table = operand(c, 0), *ids = operand(c, 1);
    if (!rule_rank(c, "table", table, 2) || !rule_integer(c, "ids", ids)) return false;
    if (ids->rank >= IR_MAX_DIMS)
        return rule_fail(c, "ids %s would give a result of rank %u, more than %d", TYPE_TEXT(c, ids),
                         ids->rank + 1, IR_MAX_DIMS);
    quant_format quantized;
    bool codes = ir_weight_quant(c->m, c->m->values[c->op->operands[0]].def_op, &quantized);
    *out = *ids;
    out->dtype = codes ? SMELT_DTYPE_F32 : table->dtype;
    out->dims[out->rank++] = table->dims[1];
    return true;
}

/* matmul(x[..., K], w, bias[N]?) -> [..., N]; w is [N, K] (out_in) or [K, N] (in_out). */
static bool infer_matmul(rule_ctx *c, ir_type *out) {
    const ir_type *x = operand(c, 0), *w = operand(c, 1);
    const char *layout;
    if (!rule_attr_string(c, "layout", &layout)) return false;
    bool in_out = strcmp(layout, "in_out") == 0;
    if (!in_out && strcmp(layout, "out_in") != 0)
        return rule_fail(c, "layout must be 'out_in' or 'in_out', found '%.*s%s'", DIAG_NAME(layout));
    /* A quantized weight holds codes (i4, i8, f8e4m3) that dequantize to floats. */
    quant_format quantized;
    bool codes = ir_weight_quant(c->m, c->m->values[c->op->operands[1]].def_op, &quantized);
    if (!rule_min_rank(c, "x", x, 1) || !rule_rank(c, "w", w, 2) ||
        (!codes && !rule_same_dtype(c, "x", x, "w", w)))
        return false;
    ir_dim inner = w->dims[in_out ? 0 : 1], columns = w->dims[in_out ? 1 : 0];
    if (!ir_dim_equal(x->dims[x->rank - 1], inner))
        return rule_fail(c, "inner dims differ: x is %s but w is %s (layout %s)", TYPE_TEXT(c, x),
                         TYPE_TEXT(c, w), layout);
    ir_value_id code_value, scale_value;
    if (ir_matmul_act_codes(c->m, c->op_index, &code_value, &scale_value)) {
        /* the codes and scales of x (ops.def): x's shape, one scale per row */
        const ir_type *q = &c->m->values[code_value].type, *s = &c->m->values[scale_value].type;
        ir_type rows = *x;
        rows.rank--;
        if (q->rank != x->rank || s->rank != rows.rank || s->dtype != SMELT_DTYPE_F32 ||
            (q->dtype != SMELT_DTYPE_F8E4M3 && q->dtype != SMELT_DTYPE_I8))
            return rule_fail(c, "act_codes: the codes %s and scales %s are not those of x %s",
                             TYPE_TEXT(c, q), TYPE_TEXT(c, s), TYPE_TEXT(c, x));
        for (unsigned i = 0; i < x->rank; i++)
            if (!ir_dim_equal(q->dims[i], x->dims[i]) ||
                (i < rows.rank && !ir_dim_equal(s->dims[i], x->dims[i])))
                return rule_fail(c, "act_codes: the codes %s and scales %s are not those of x %s",
                                 TYPE_TEXT(c, q), TYPE_TEXT(c, s), TYPE_TEXT(c, x));
    } else if (c->op->operand_count > 3) {
        return rule_fail(c, "a matmul of %u operands needs act_codes (its last two: codes and scales)",
                         c->op->operand_count);
    }
    if (ir_matmul_bias(c->m, c->op_index) != IR_NO_VALUE) {
        const ir_type *bias = operand(c, 2);
        if (!rule_same_dtype(c, "x", x, "bias", bias) ||
            !rule_expect_dims(c, "bias", bias, "[N]", &columns, 1))
            return false;
    }
    *out = *x;
    out->dims[x->rank - 1] = columns;
    return true;
}

static bool is_one(ir_dim d) { return !ir_dim_is_symbol(d) && d.size == 1; }

/* add(a, b), mul(a, b): numpy broadcasting; trailing dims align and a
 * constant 1 (or a missing leading dim) stretches to the other side. */
static bool broadcast(rule_ctx *c, ir_type *out) {
    const ir_type *a = operand(c, 0), *b = operand(c, 1);
    if (!rule_same_dtype(c, "a", a, "b", b)) return false;
    unsigned rank = a->rank > b->rank ? a->rank : b->rank;
    out->dtype = a->dtype;
    out->rank = (uint8_t)rank;
    for (unsigned from_end = 1; from_end <= rank; from_end++) {
        ir_dim da = from_end <= a->rank ? a->dims[a->rank - from_end] : ir_dim_const(1);
        ir_dim db = from_end <= b->rank ? b->dims[b->rank - from_end] : ir_dim_const(1);
        ir_dim result;
        if (ir_dim_equal(da, db) || is_one(db))
            result = da;
        else if (is_one(da))
            result = db;
        else
            return rule_fail(c, "operands do not broadcast: a is %s but b is %s (dims %s and %s differ)",
                             TYPE_TEXT(c, a), TYPE_TEXT(c, b), DIM_TEXT(c, da), DIM_TEXT(c, db));
        out->dims[rank - from_end] = result;
    }
    return true;
}

static bool infer_add(rule_ctx *c, ir_type *out) { return broadcast(c, out); }

static bool infer_mul(rule_ctx *c, ir_type *out) { return broadcast(c, out); }

/* A norm's weight or bias: [D] where D is the last dim of x, same dtype. */
static bool norm_parameter(rule_ctx *c, const char *name, const ir_type *x, const ir_type *p) {
    ir_dim last = x->dims[x->rank - 1];
    return rule_same_dtype(c, "x", x, name, p) && rule_expect_dims(c, name, p, "[D]", &last, 1);
}

/* rms_norm(x[..., D], w[D]) and layer_norm(x[..., D], w[D], b[D]?) -> x */
static bool norm(rule_ctx *c, ir_type *out) {
    const ir_type *x = operand(c, 0);
    double eps;
    if (!rule_attr_float(c, "eps", &eps) || !rule_min_rank(c, "x", x, 1)) return false;
    if (!(eps >= 0 && isfinite(eps))) return rule_fail(c, "eps must be a finite number >= 0, found %g", eps);
    if (c->op->kind == IR_OP_RMS_NORM) {
        double offset;
        if (!rule_attr_float(c, "offset", &offset)) return false;
        if (!isfinite(offset)) return rule_fail(c, "offset must be a finite number, found %g", offset);
    }
    if (!norm_parameter(c, "w", x, operand(c, 1))) return false;
    if (c->op->operand_count == 3 && !norm_parameter(c, "b", x, operand(c, 2))) return false;
    *out = *x;
    return true;
}

static bool infer_rms_norm(rule_ctx *c, ir_type *out) { return norm(c, out); }

static bool infer_layer_norm(rule_ctx *c, ir_type *out) { return norm(c, out); }

/* rope(x[T, H, Dh], pos[T]) -> x; the rotated dims and the scaling
 * parameters are checked by ir/rope.c, which computes the frequencies. */
static bool infer_rope(rule_ctx *c, ir_type *out) {
    const ir_type *x = operand(c, 0), *pos = operand(c, 1);
    double theta;
    int64_t rotary_dim, head_dim;
    if (!rule_attr_float(c, "theta", &theta) || !rule_attr_int(c, "rotary_dim", &rotary_dim)) return false;
    if (!rule_rank(c, "x", x, 3) || !rule_rank(c, "pos", pos, 1) || !rule_integer(c, "pos", pos) ||
        !rule_expect_dims(c, "pos", pos, "[T]", &x->dims[0], 1) ||
        !rule_constant_dim(c, "the head dim of x", x->dims[2], &head_dim))
        return false;
    if (head_dim % 2) return rule_fail(c, "the head dim of x must be even, found %lld", (long long)head_dim);
    if (rotary_dim < 0 || rotary_dim % 2 || rotary_dim > head_dim)
        return rule_fail(c, "rotary_dim must be 0 or even and at most the head dim %lld, found %lld",
                         (long long)head_dim, (long long)rotary_dim);
    char why[256];
    ir_rope_params params = ir_rope_params_of(c->m, c->op_index, head_dim);
    if (!ir_rope_params_check(&params, head_dim, why, sizeof why)) return rule_fail(c, "%s", why);
    if (c->op->operand_count == 3) { /* the table of these positions and frequencies */
        const ir_type *table = operand(c, 2);
        uint32_t def = c->m->values[c->op->operands[2]].def_op;
        ir_dim dims[3] = {x->dims[0], ir_dim_const(params.rotary_dim / 2), ir_dim_const(2)};
        if (c->m->ops[def].kind != IR_OP_ROPE_TABLE || c->m->ops[def].operands[0] != c->op->operands[1])
            return rule_fail(c, "table must be a rope_table of the rope's positions");
        if (table->dtype != SMELT_DTYPE_F32)
            return rule_fail(c, "table must be stored as f32, found %s", TYPE_TEXT(c, table));
        if (!rule_expect_dims(c, "table", table, "[T, r / 2, 2]", dims, 3)) return false;
        ir_rope_params given = ir_rope_table_params_of(c->m, def);
        if (!ir_rope_params_equal(&params, &given))
            return rule_fail(c, "table must have the rope's frequencies (every scaling attribute equal)");
    }
    *out = *x;
    return true;
}

/* rope_table(pos[T]) -> f32[T, rotary_dim / 2, 2]: (cos, sin) per pair. */
static bool infer_rope_table(rule_ctx *c, ir_type *out) {
    const ir_type *pos = operand(c, 0);
    double theta;
    int64_t rotary_dim;
    if (!rule_attr_float(c, "theta", &theta) || !rule_attr_int(c, "rotary_dim", &rotary_dim)) return false;
    if (!rule_rank(c, "pos", pos, 1) || !rule_integer(c, "pos", pos)) return false;
    if (rotary_dim < 2 || rotary_dim % 2)
        return rule_fail(c, "rotary_dim (the rotated dims) must be even and >= 2, found %lld",
                         (long long)rotary_dim);
    char why[256];
    ir_rope_params params = ir_rope_table_params_of(c->m, c->op_index);
    if (!ir_rope_params_check(&params, rotary_dim, why, sizeof why)) return rule_fail(c, "%s", why);
    *out = (ir_type){.dtype = SMELT_DTYPE_F32, .rank = 3};
    out->dims[0] = pos->dims[0];
    out->dims[1] = ir_dim_const(params.rotary_dim / 2);
    out->dims[2] = ir_dim_const(2);
    return true;
}

/* Grouped-query attention: every kv head serves Hq / Hkv query heads. */
static bool heads_group(ir_dim query_heads, ir_dim kv_heads) {
    if (ir_dim_is_symbol(query_heads) || ir_dim_is_symbol(kv_heads))
        return ir_dim_equal(query_heads, kv_heads);
    return kv_heads.size > 0 && query_heads.size % kv_heads.size == 0;
}

/* attention(q[T, Hq, Dh], k[T, Hkv, Dh], v[T, Hkv, Dv], pos[T]) -> [T, Hq, Dv] */
static bool infer_attention(rule_ctx *c, ir_type *out) {
    const ir_type *q = operand(c, 0), *k = operand(c, 1), *v = operand(c, 2), *pos = operand(c, 3);
    double scale, softcap;
    int64_t max_seq, window, written_upto;
    bool causal;
    const char *kv_dtype, *kv_scale;
    if (!rule_attr_float(c, "scale", &scale) || !rule_attr_bool(c, "causal", &causal) ||
        !rule_attr_int(c, "max_seq", &max_seq) || !rule_attr_int(c, "window", &window) ||
        !rule_attr_float(c, "softcap", &softcap) || !rule_attr_int(c, "cache_written_upto", &written_upto) ||
        !rule_attr_string(c, "kv_dtype", &kv_dtype) || !rule_attr_string(c, "kv_scale", &kv_scale))
        return false;
    if (!rule_rank(c, "q", q, 3) || !rule_rank(c, "k", k, 3) || !rule_rank(c, "v", v, 3) ||
        !rule_rank(c, "pos", pos, 1) || !rule_integer(c, "pos", pos) || !rule_same_dtype(c, "q", q, "k", k) ||
        !rule_same_dtype(c, "q", q, "v", v))
        return false;
    if (!ir_dim_equal(k->dims[0], q->dims[0]) || !ir_dim_equal(v->dims[0], q->dims[0]))
        return rule_fail(c, "q, k and v must have the same tokens (dim 0): q is %s, k is %s, v is %s",
                         TYPE_TEXT(c, q), TYPE_TEXT(c, k), TYPE_TEXT(c, v));
    if (!rule_expect_dims(c, "pos", pos, "[T]", &q->dims[0], 1)) return false;
    if (!ir_dim_equal(k->dims[1], v->dims[1]))
        return rule_fail(c, "k and v must have the same heads (dim 1): k is %s but v is %s", TYPE_TEXT(c, k),
                         TYPE_TEXT(c, v));
    if (!heads_group(q->dims[1], k->dims[1]))
        return rule_fail(
            c, "GQA needs the query heads to be a multiple of the kv heads: q has %s heads but k has %s",
            DIM_TEXT(c, q->dims[1]), DIM_TEXT(c, k->dims[1]));
    if (!ir_dim_equal(q->dims[2], k->dims[2]))
        return rule_fail(c, "q and k head dims differ: q is %s but k is %s", TYPE_TEXT(c, q),
                         TYPE_TEXT(c, k));
    if (!(scale > 0 && isfinite(scale))) return rule_fail(c, "scale must be > 0, found %g", scale);
    if (max_seq < 1) return rule_fail(c, "max_seq must be >= 1, found %lld", (long long)max_seq);
    if (window < 0) return rule_fail(c, "window must be >= 0, found %lld", (long long)window);
    if (!(softcap >= 0 && isfinite(softcap)))
        return rule_fail(c, "softcap must be 0 (none) or a finite number > 0, found %g", softcap);
    /* An E4M3 cache needs its scales; a row's scale is its whole head's
     * max |x|, which a GEMV epilogue (one row element per unit) never has. */
    bool fp8 = strcmp(kv_dtype, "f8e4m3") == 0, scaled = strcmp(kv_scale, "per_token_head") == 0;
    if (fp8 != scaled)
        return rule_fail(c, "kv_dtype \"%s\" needs kv_scale \"%s\", found \"%s\"", kv_dtype,
                         fp8 ? "per_token_head" : "none", kv_scale);
    if (fp8 && written_upto != 0)
        return rule_fail(c,
                         "an f8e4m3 KV cache is written by the attention op itself (its scale per row needs "
                         "the whole head); found cache_written_upto = %lld",
                         (long long)written_upto);
    *out = *q;
    out->dims[2] = v->dims[2];
    return true;
}

/* softmax(x) -> x along axis */
static bool infer_softmax(rule_ctx *c, ir_type *out) {
    const ir_type *x = operand(c, 0);
    int64_t axis;
    unsigned normalized;
    if (!rule_attr_int(c, "axis", &axis) || !rule_float(c, "x", x) ||
        !rule_axis(c, axis, x->rank, &normalized))
        return false;
    *out = *x;
    return true;
}

/* silu(x), gelu(x), tanh(x), sigmoid(x) -> x */
static bool activation(rule_ctx *c, ir_type *out) {
    if (!rule_float(c, "x", operand(c, 0))) return false;
    *out = *operand(c, 0);
    return true;
}

static bool infer_silu(rule_ctx *c, ir_type *out) { return activation(c, out); }

static bool infer_gelu(rule_ctx *c, ir_type *out) { return activation(c, out); }

static bool infer_tanh(rule_ctx *c, ir_type *out) { return activation(c, out); }

static bool infer_sigmoid(rule_ctx *c, ir_type *out) { return activation(c, out); }

/* moe(x[T, D], router[E, D], gate[E, F, D], up[E, F, D], down[E, D, F]) -> [T, D] */
static bool infer_moe(rule_ctx *c, ir_type *out) {
    static const char *const names[] = {"x", "router", "gate", "up", "down"};
    const ir_type *x = operand(c, 0), *router = operand(c, 1), *gate = operand(c, 2);
    int64_t top_k;
    bool normalize;
    if (!rule_attr_int(c, "top_k", &top_k) || !rule_attr_bool(c, "normalize", &normalize)) return false;
    if (!rule_rank(c, "x", x, 2) || !rule_rank(c, "router", router, 2) || !rule_rank(c, "gate", gate, 3))
        return false;
    /* Quantized experts hold codes (i4, i8, f8e4m3) that dequantize to floats. */
    quant_format quantized;
    for (unsigned i = 1; i < 5; i++)
        if (!(i >= 2 && ir_weight_quant(c->m, c->m->values[c->op->operands[i]].def_op, &quantized)) &&
            !rule_same_dtype(c, "x", x, names[i], operand(c, i)))
            return false;
    ir_dim model_dim = x->dims[1], experts = router->dims[0], ffn = gate->dims[1];
    if (!rule_expect_dims(c, "router", router, "[E, D]", (ir_dim[]){experts, model_dim}, 2) ||
        !rule_expect_dims(c, "gate", gate, "[E, F, D]", (ir_dim[]){experts, ffn, model_dim}, 3) ||
        !rule_expect_dims(c, "up", operand(c, 3), "[E, F, D]", (ir_dim[]){experts, ffn, model_dim}, 3) ||
        !rule_expect_dims(c, "down", operand(c, 4), "[E, D, F]", (ir_dim[]){experts, model_dim, ffn}, 3))
        return false;
    if (top_k < 1 || (!ir_dim_is_symbol(experts) && top_k > experts.size))
        return rule_fail(c, "top_k must be in [1, %s] (the number of experts), found %lld",
                         DIM_TEXT(c, experts), (long long)top_k);
    *out = *x;
    return true;
}

/* ---- layout ------------------------------------------------------------------ */

/* An element count that may involve symbols: constant * product(symbols). */
typedef struct element_count {
    uint64_t constant;
    int32_t symbols[IR_MAX_DIMS]; /* sorted */
    unsigned symbol_count;
} element_count;

/* False when the constant part overflows 64 bits. */
static bool count_elements(const ir_dim *dims, unsigned rank, element_count *out) {
    out->constant = 1;
    out->symbol_count = 0;
    for (unsigned i = 0; i < rank; i++) {
        if (ir_dim_is_symbol(dims[i])) {
            unsigned at = out->symbol_count++;
            while (at > 0 && out->symbols[at - 1] > dims[i].symbol) { /* insertion sort */
                out->symbols[at] = out->symbols[at - 1];
                at--;
            }
            out->symbols[at] = dims[i].symbol;
        } else if (dims[i].size < 0 ||
                   size_mul_overflow(out->constant, (uint64_t)dims[i].size, &out->constant)) {
            return false;
        }
    }
    return true;
}

static bool same_count(const element_count *a, const element_count *b) {
    if (a->constant == 0 && b->constant == 0) return true;
    if (a->constant != b->constant || a->symbol_count != b->symbol_count) return false;
    for (unsigned i = 0; i < a->symbol_count; i++)
        if (a->symbols[i] != b->symbols[i]) return false;
    return true;
}

/* "64 * tokens" */
static const char *count_text(const rule_ctx *c, const element_count *n, char *buffer, size_t size) {
    size_t used = 0;
    int w = n->constant != 1 || n->symbol_count == 0
                ? snprintf(buffer, size, "%llu", (unsigned long long)n->constant)
                : snprintf(buffer, size, "%s", "");
    used = w > 0 && (size_t)w < size ? (size_t)w : 0;
    for (unsigned i = 0; i < n->symbol_count && used < size; i++) {
        w = snprintf(buffer + used, size - used, "%s%s", used ? " * " : "",
                     DIM_TEXT(c, ir_dim_symbol(n->symbols[i])));
        if (w < 0) break;
        used += (size_t)w;
    }
    return buffer;
}
#define COUNT_TEXT(c, n) count_text((c), (n), (char[IR_TYPE_TEXT_MAX]){0}, IR_TYPE_TEXT_MAX)

/* reshape(x) {shape}: same element count, decided symbolically. */
static bool infer_reshape(rule_ctx *c, ir_type *out) {
    const ir_type *x = operand(c, 0);
    const ir_attr *shape = rule_attr_list(c, "shape", IR_ATTR_SHAPE);
    if (!shape) return false;
    if (shape->as.shape.count > IR_MAX_DIMS)
        return rule_fail(c, "the shape has %u dims, more than %d", shape->as.shape.count, IR_MAX_DIMS);
    out->dtype = x->dtype;
    out->rank = (uint8_t)shape->as.shape.count;
    for (unsigned i = 0; i < out->rank; i++) {
        ir_dim d = shape->as.shape.items[i];
        if (ir_dim_is_symbol(d) && (uint32_t)d.symbol >= c->m->symbol_count)
            return rule_fail(c, "shape dim %u refers to symbol %d, which does not exist", i, (int)d.symbol);
        if (!ir_dim_is_symbol(d) && d.size < 0)
            return rule_fail(c, "shape dim %u is %lld; dims must be >= 0", i, (long long)d.size);
        out->dims[i] = d;
    }
    element_count from, to;
    if (!count_elements(x->dims, x->rank, &from))
        return rule_fail(c, "x %s has more than 2^64 elements", TYPE_TEXT(c, x));
    if (!count_elements(out->dims, out->rank, &to))
        return rule_fail(c, "the shape %s has more than 2^64 elements", TYPE_TEXT(c, out));
    if (!same_count(&from, &to))
        return rule_fail(c, "element counts differ: x is %s with %s elements but the shape %s has %s",
                         TYPE_TEXT(c, x), COUNT_TEXT(c, &from), TYPE_TEXT(c, out), COUNT_TEXT(c, &to));
    return true;
}

/* transpose(x) {perm}: result dim i is x dim perm[i]. */
static bool infer_transpose(rule_ctx *c, ir_type *out) {
    const ir_type *x = operand(c, 0);
    const ir_attr *perm = rule_attr_list(c, "perm", IR_ATTR_INTS);
    if (!perm) return false;
    bool seen[IR_MAX_DIMS] = {false};
    bool permutation = perm->as.ints.count == x->rank;
    for (uint32_t i = 0; permutation && i < perm->as.ints.count; i++) {
        int64_t p = perm->as.ints.items[i];
        permutation = p >= 0 && p < x->rank && !seen[p];
        if (permutation) seen[p] = true;
    }
    if (!permutation)
        return rule_fail(c, "perm %s must list each of the %u dims of x (%s) once", INTS_TEXT(perm), x->rank,
                         TYPE_TEXT(c, x));
    *out = *x;
    for (unsigned i = 0; i < x->rank; i++)
        out->dims[i] = x->dims[perm->as.ints.items[i]];
    return true;
}

/* concat(xs...) {axis}: equal dims except on axis, whose constant sizes add. */
static bool infer_concat(rule_ctx *c, ir_type *out) {
    const ir_type *first = operand(c, 0);
    int64_t axis_attr;
    unsigned axis;
    if (!rule_attr_int(c, "axis", &axis_attr) || !rule_axis(c, axis_attr, first->rank, &axis)) return false;
    uint64_t total = 0;
    for (uint32_t i = 0; i < c->op->operand_count; i++) {
        const ir_type *t = operand(c, i);
        if (t->dtype != first->dtype)
            return rule_fail(c, "operand dtypes differ: operand 0 is %s but operand %u is %s",
                             smelt_dtype_name(first->dtype), i, smelt_dtype_name(t->dtype));
        bool same = t->rank == first->rank;
        for (unsigned d = 0; same && d < t->rank; d++)
            same = d == axis || ir_dim_equal(t->dims[d], first->dims[d]);
        if (!same)
            return rule_fail(c, "operand %u is %s but operand 0 is %s; dims must match except on axis %u", i,
                             TYPE_TEXT(c, t), TYPE_TEXT(c, first), axis);
        ir_dim d = t->dims[axis];
        if (ir_dim_is_symbol(d))
            return rule_fail(
                c, "operand %u has the symbol '%s' on axis %u; concat needs constant sizes on its axis", i,
                DIM_TEXT(c, d), axis);
        if (d.size < 0 || size_add_overflow(total, (uint64_t)d.size, &total) || total > INT64_MAX)
            return rule_fail(c, "the concatenated axis %u does not fit in 63 bits", axis);
    }
    *out = *first;
    out->dims[axis] = ir_dim_const((int64_t)total);
    return true;
}

/* split(x) {axis, sizes}: one result per size; the sizes add up to the axis. */
static bool infer_split(rule_ctx *c, ir_type *out) {
    const ir_type *x = operand(c, 0);
    int64_t axis_attr, dim;
    unsigned axis;
    const ir_attr *sizes = rule_attr_list(c, "sizes", IR_ATTR_INTS);
    if (!sizes || !rule_attr_int(c, "axis", &axis_attr) || !rule_axis(c, axis_attr, x->rank, &axis))
        return false;
    uint32_t n = sizes->as.ints.count;
    if (n == 0) return rule_fail(c, "sizes must not be empty");
    if (c->op->result_count != n)
        return rule_fail(c, "sizes %s gives %u results, but the op has %u", INTS_TEXT(sizes), n,
                         c->op->result_count);
    if (!rule_constant_dim(c, "the split axis of x", x->dims[axis], &dim)) return false;
    uint64_t total = 0;
    for (uint32_t i = 0; i < n; i++) {
        int64_t size = sizes->as.ints.items[i];
        if (size <= 0) return rule_fail(c, "sizes must be > 0, found %lld at index %u", (long long)size, i);
        if (size_add_overflow(total, (uint64_t)size, &total))
            return rule_fail(c, "sizes %s overflow 64 bits", INTS_TEXT(sizes));
    }
    if (total != (uint64_t)dim)
        return rule_fail(c, "sizes %s add up to %llu but axis %u of x %s is %lld", INTS_TEXT(sizes),
                         (unsigned long long)total, axis, TYPE_TEXT(c, x), (long long)dim);
    for (uint32_t i = 0; i < n; i++) {
        out[i] = *x;
        out[i].dims[axis] = ir_dim_const(sizes->as.ints.items[i]);
    }
    return true;
}

/* slice(x) {axis, start, end}: [start, end) of a constant axis. */
static bool infer_slice(rule_ctx *c, ir_type *out) {
    const ir_type *x = operand(c, 0);
    int64_t axis_attr, start, end, dim;
    unsigned axis;
    if (!rule_attr_int(c, "axis", &axis_attr) || !rule_attr_int(c, "start", &start) ||
        !rule_attr_int(c, "end", &end) || !rule_axis(c, axis_attr, x->rank, &axis) ||
        !rule_constant_dim(c, "the sliced axis of x", x->dims[axis], &dim))
        return false;
    if (!(0 <= start && start < end && end <= dim))
        return rule_fail(c, "start %lld and end %lld must satisfy 0 <= start < end <= %lld (axis %u of x %s)",
                         (long long)start, (long long)end, (long long)dim, axis, TYPE_TEXT(c, x));
    *out = *x;
    out->dims[axis] = ir_dim_const(end - start);
    return true;
}

/* argmax(x) {axis} -> i32 with the axis removed */
static bool infer_argmax(rule_ctx *c, ir_type *out) {
    const ir_type *x = operand(c, 0);
    int64_t axis_attr;
    unsigned axis;
    if (!rule_attr_int(c, "axis", &axis_attr) || !rule_axis(c, axis_attr, x->rank, &axis)) return false;
    out->dtype = SMELT_DTYPE_I32;
    out->rank = 0;
    for (unsigned i = 0; i < x->rank; i++)
        if (i != axis) out->dims[out->rank++] = x->dims[i];
    return true;
}

/* quantize(x[..., K]) {dtype} -> codes of dtype [..., K], scales f32[...] */
static bool infer_quantize(rule_ctx *c, ir_type *out) {
    const ir_type *x = operand(c, 0);
    const char *dtype;
    if (!rule_attr_string(c, "dtype", &dtype) || !rule_min_rank(c, "x", x, 1)) return false;
    if (!smelt_dtype_is_float(x->dtype))
        return rule_fail(c, "x must be a float tensor, found %s", TYPE_TEXT(c, x));
    out[0] = *x;
    out[0].dtype = strcmp(dtype, "i8") == 0 ? SMELT_DTYPE_I8 : SMELT_DTYPE_F8E4M3;
    out[1] = *x;
    out[1].rank--;
    out[1].dtype = SMELT_DTYPE_F32;
    return true;
}

typedef bool (*shape_rule)(rule_ctx *c, ir_type *out);

#define OP(e, name, mn, mx, nres, flags, family, attrs) [IR_OP_##e] = infer_##name,
static const shape_rule rules[] = {
#include "ops.def"
};
#undef OP
_Static_assert(sizeof rules / sizeof rules[0] == IR_OP_COUNT, "every op in ops.def needs a shape rule");

/* Counts, ids and ranks the rules rely on; reports the first that is wrong. */
static bool check_structure(rule_ctx *c) {
    const ir_op *op = c->op;
    const ir_op_info *info = c->info;
    unsigned max = info->max_operands < 0 ? IR_MAX_OPERANDS : (unsigned)info->max_operands;
    if (op->operand_count < (unsigned)info->min_operands || op->operand_count > max) {
        if ((unsigned)info->min_operands == max)
            return rule_fail(c, "expected %u operand%s, found %u", max, max == 1 ? "" : "s",
                             op->operand_count);
        return rule_fail(c, "expected %d to %u operands, found %u", info->min_operands, max,
                         op->operand_count);
    }
    if (info->results >= 0 && op->result_count != (unsigned)info->results)
        return rule_fail(c, "expected %d result%s, found %u", info->results, info->results == 1 ? "" : "s",
                         op->result_count);
    for (uint32_t i = 0; i < op->operand_count; i++) {
        ir_value_id id = op->operands[i];
        if (id >= c->m->value_count)
            return rule_fail(c, "operand %u refers to %%%u, which does not exist", i, id);
        const ir_type *t = &c->m->values[id].type;
        if (t->dtype == SMELT_DTYPE_UNKNOWN || t->dtype >= SMELT_DTYPE_COUNT)
            return rule_fail(c, "operand %u has no known type", i);
        if (t->rank > IR_MAX_DIMS)
            return rule_fail(c, "operand %u has rank %u, more than %d", i, t->rank, IR_MAX_DIMS);
    }
    for (uint32_t i = 0; i < op->result_count; i++)
        if (op->results[i] >= c->m->value_count)
            return rule_fail(c, "result %u refers to %%%u, which does not exist", i, op->results[i]);
    return true;
}

bool ir_infer_op_types(const ir_module *m, uint32_t op, ir_type *out, diag_engine *d) {
    if (op >= m->op_count) SMELT_DIE("op index %u past %u ops", op, m->op_count);
    const ir_op *o = &m->ops[op];
    if ((unsigned)o->kind >= IR_OP_COUNT) {
        diag_error(d, o->loc, "op %u has no valid kind (%d)", op, (int)o->kind);
        return false;
    }
    rule_ctx c = {.m = m, .op = o, .op_index = op, .info = ir_op_info_of(o->kind), .d = d};
    if (!check_structure(&c)) return false;
    for (uint32_t i = 0; i < o->result_count; i++)
        memset(&out[i], 0, sizeof out[i]);
    return rules[o->kind](&c, out);
}
