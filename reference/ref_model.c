/* ref_model.c - the reference backend's model: checks a module once, loads
 * its weights, owns the KV caches, and runs steps (see reference.h).
 *
 * Create: ir_verify, then what the interpreter relies on beyond it: every
 * type known and made only of constants and the token symbol, the inputs
 * "ids" and "pos" and the output "logits", float data where ops compute,
 * constant weight and cache dims. Every problem is reported, then NULL.
 * Step: the live ops in program order. Weights and constants live as long
 * as the model; every other value is allocated when its op runs, at the
 * step's token count, and freed after its last use.
 */
#include "quant.h"
#include "reference.h"

#include "ref_ops.h"
#include "interface.h"

#include <stdlib.h>
#include <string.h>

struct ref_model {
    const ir_module *m;
    int32_t token_symbol; /* dim 0 of "ids": bound to n by each step */
    int64_t token_bound;
    uint32_t ids_op, pos_op, logits_op;  /* op indices */
    uint64_t vocab;                      /* last dim of logits */
    ref_attrs *attrs;                    /* [op_count] */
    ref_kv_cache *caches;                /* [op_count]; filled for attention ops */
    ref_tensor *tensors;                 /* [value_count] */
    quant_tensor *packed;                /* [value_count]: a quantized weight's packed layout (one
                                            matrix's; data: all its bytes, a stack's experts one after
                                            another; NULL for any other value), which W8A8 matmuls and
                                            moes compute on */
    bool *persistent;                    /* [value_count]: weights and constants */
    uint32_t *last_use;                  /* [value_count]: last live op reading it, UINT32_MAX: none */
    ref_matmul_observer observer;        /* NULL: none */
    ref_expert_observer expert_observer; /* NULL: none */
    void *observer_context;
};

enum { NO_OP = UINT32_MAX };

static const char *op_name(const ir_module *m, uint32_t op) { return ir_op_info_at(m, op)->name; }

/* The whole model file, for errors that belong to no op. */
static smelt_loc module_loc(const ir_module *m) {
    return m->source_file >= 0 ? (smelt_loc){m->source_file, 0, 0} : SMELT_NO_LOC;
}

/* ---- attributes: the op's own or its schema's default ------------------------------ */

/* ir_verify has checked that required attributes are there with their kind,
 * so an absent one has a default. */
static const ir_attr_schema *absent_attr_schema(const ir_module *m, uint32_t op, const char *name) {
    int slot = ir_attr_slot(m->ops[op].kind, name);
    if (slot < 0) SMELT_DIE("op '%s' has no attribute '%s' in its schema", op_name(m, op), name);
    const ir_attr_schema *s = &ir_op_info_at(m, op)->attrs[slot];
    if (!s->default_text)
        SMELT_DIE("verified op '%s' lacks its required attribute '%s'", op_name(m, op), name);
    return s;
}

static int64_t attr_int(const ir_module *m, uint32_t op, const char *name) {
    const ir_attr *a = ir_op_attr(m, op, name);
    return a ? a->as.i : strtoll(absent_attr_schema(m, op, name)->default_text, NULL, 10);
}

static double attr_float(const ir_module *m, uint32_t op, const char *name) {
    const ir_attr *a = ir_op_attr(m, op, name);
    return a ? a->as.f : strtod(absent_attr_schema(m, op, name)->default_text, NULL);
}

static bool attr_bool(const ir_module *m, uint32_t op, const char *name) {
    const ir_attr *a = ir_op_attr(m, op, name);
    return a ? a->as.b : strcmp(absent_attr_schema(m, op, name)->default_text, "true") == 0;
}

/* Is the STRING attribute `name` equal to `value`? Defaults are quoted text. */
static bool attr_string_is(const ir_module *m, uint32_t op, const char *name, const char *value) {
    const ir_attr *a = ir_op_attr(m, op, name);
    if (a) return strcmp(a->as.s, value) == 0;
    const char *text = absent_attr_schema(m, op, name)->default_text; /* "\"neox\"" */
    size_t n = strlen(value);
    return strlen(text) == n + 2 && memcmp(text + 1, value, n) == 0;
}

/* An axis attribute counted from the end when negative; the shape rule
 * has checked it is within the rank. */
static unsigned attr_axis(const ir_module *m, uint32_t op, unsigned rank) {
    int64_t axis = attr_int(m, op, "axis");
    return (unsigned)(axis < 0 ? axis + rank : axis);
}

/* The attributes op `op` runs with (ref_attrs says which op uses which). */
static ref_attrs read_attrs(const ir_module *m, uint32_t op) {
    const ir_op *o = &m->ops[op];
    ref_attrs a = {0};
    unsigned rank = o->operand_count ? m->values[o->operands[0]].type.rank : 0;
    switch (o->kind) {
    case IR_OP_CONST: a.value = (float)attr_float(m, op, "value"); break;
    case IR_OP_MATMUL:
        a.in_out = attr_string_is(m, op, "layout", "in_out");
        a.w8a8 = attr_string_is(m, op, "act_quant", "i8")       ? QUANT_INT8
                 : attr_string_is(m, op, "act_quant", "f8e4m3") ? QUANT_FP8
                                                                : QUANT_NONE;
        a.w8a8_scale =
            attr_string_is(m, op, "act_scale", "tensor") ? (float)attr_float(m, op, "act_scale_value") : 0.0f;
        a.bias = ir_matmul_bias(m, op) != IR_NO_VALUE;
        a.act_codes = ir_matmul_act_codes(m, op, &(ir_value_id){0}, &(ir_value_id){0});
        break;
    case IR_OP_QUANTIZE:
        a.w8a8 = attr_string_is(m, op, "dtype", "i8") ? QUANT_INT8 : QUANT_FP8;
        a.w8a8_scale =
            attr_string_is(m, op, "act_scale", "tensor") ? (float)attr_float(m, op, "act_scale_value") : 0.0f;
        break;
    case IR_OP_RMS_NORM:
        a.eps = attr_float(m, op, "eps");
        a.offset = attr_float(m, op, "offset");
        break;
    case IR_OP_LAYER_NORM: a.eps = attr_float(m, op, "eps"); break;
    case IR_OP_ROPE:
        a.rope = ir_rope_params_of(m, op, m->values[o->operands[0]].type.dims[2].size);
        a.interleaved = attr_string_is(m, op, "style", "interleaved");
        break;
    case IR_OP_ROPE_TABLE: a.rope = ir_rope_table_params_of(m, op); break;
    case IR_OP_ATTENTION:
        a.scale = attr_float(m, op, "scale");
        a.causal = attr_bool(m, op, "causal");
        a.window = attr_int(m, op, "window");
        a.softcap = attr_float(m, op, "softcap");
        a.kv_fp8 = attr_string_is(m, op, "kv_dtype", "f8e4m3");
        break;
    case IR_OP_GELU: a.gelu_tanh = attr_string_is(m, op, "approximate", "tanh"); break;
    case IR_OP_MOE:
        a.top_k = attr_int(m, op, "top_k");
        a.normalize = attr_bool(m, op, "normalize");
        a.gate_up_w8a8 = attr_string_is(m, op, "gate_up_act_quant", "i8")       ? QUANT_INT8
                         : attr_string_is(m, op, "gate_up_act_quant", "f8e4m3") ? QUANT_FP8
                                                                                : QUANT_NONE;
        a.down_w8a8 = attr_string_is(m, op, "down_act_quant", "i8")       ? QUANT_INT8
                      : attr_string_is(m, op, "down_act_quant", "f8e4m3") ? QUANT_FP8
                                                                          : QUANT_NONE;
        if (attr_string_is(m, op, "act_scale", "tensor")) {
            a.gate_up_w8a8_scale = (float)attr_float(m, op, "gate_up_act_scale_value");
            a.down_w8a8_scale = (float)attr_float(m, op, "down_act_scale_value");
        }
        break;
    case IR_OP_SOFTMAX:
    case IR_OP_CONCAT:
    case IR_OP_SPLIT:
    case IR_OP_ARGMAX: a.axis = attr_axis(m, op, rank); break;
    case IR_OP_SLICE:
        a.axis = attr_axis(m, op, rank);
        a.start = attr_int(m, op, "start");
        a.end = attr_int(m, op, "end");
        break;
    case IR_OP_TRANSPOSE: a.perm = ir_op_attr(m, op, "perm")->as.ints.items; break;
    default: break;
    }
    return a;
}

/* ---- checks at create time ------------------------------------------------------- */

static const char *value_type_text(const ir_module *m, ir_value_id v, char *buffer) {
    return ir_format_type(m, &m->values[v].type, buffer, IR_TYPE_TEXT_MAX);
}

/* Finds the inputs and the output by name; reports any other input. */
static bool find_interface(ref_model *r, diag_engine *d) {
    const ir_module *m = r->m;
    bool ok = true;
    r->ids_op = r->pos_op = r->logits_op = NO_OP;
    for (uint32_t i = 0; i < m->op_count; i++) {
        const ir_op *o = &m->ops[i];
        if (o->dead || (o->kind != IR_OP_INPUT && o->kind != IR_OP_OUTPUT)) continue;
        const char *name = ir_op_string(m, i, "name");
        ir_role role = ir_op_role(m, i);
        if (o->kind == IR_OP_OUTPUT) {
            if (role == IR_ROLE_LOGITS) r->logits_op = i;
            continue;
        }
        uint32_t *slot = role == IR_ROLE_IDS ? &r->ids_op : role == IR_ROLE_POS ? &r->pos_op : NULL;
        if (!slot) {
            diag_error(d, o->loc,
                       "input '%.*s%s': the reference backend takes only the inputs 'ids' and 'pos'",
                       DIAG_NAME(name));
            ok = false;
        } else if (*slot != NO_OP) {
            diag_error(d, o->loc, "input '%s' is declared twice", name);
            ok = false;
        } else {
            *slot = i;
        }
    }
    const char *const needed[] = {ir_role_info_of(IR_ROLE_IDS)->summary,
                                  ir_role_info_of(IR_ROLE_POS)->summary,
                                  ir_role_info_of(IR_ROLE_LOGITS)->summary};
    const uint32_t found[] = {r->ids_op, r->pos_op, r->logits_op};
    for (unsigned i = 0; i < 3; i++) {
        if (found[i] != NO_OP) continue;
        diag_error(d, module_loc(m),
                   "module '%.*s%s' has no %s; the reference backend runs modules with the inputs 'ids' and "
                   "'pos' and the output 'logits'",
                   DIAG_NAME(m->name), needed[i]);
        ok = false;
    }
    return ok;
}

/* "ids" is an integer vector over a symbol, the token dim; false when not. */
static bool check_ids(ref_model *r, diag_engine *d) {
    const ir_module *m = r->m;
    ir_value_id ids = ir_op_result(m, r->ids_op, 0);
    const ir_type *t = &m->values[ids].type;
    if (t->rank != 1 || smelt_dtype_is_float(t->dtype) || !ir_dim_is_symbol(t->dims[0])) {
        diag_error(d, m->ops[r->ids_op].loc,
                   "input 'ids' must be an integer vector over the token dim (such as i32[tokens]), found %s",
                   value_type_text(m, ids, (char[IR_TYPE_TEXT_MAX]){0}));
        return false;
    }
    r->token_symbol = t->dims[0].symbol;
    r->token_bound = m->symbols[r->token_symbol].bound;
    return true;
}

/* "pos" is shaped like "ids", with integers. */
static bool check_pos(const ref_model *r, diag_engine *d) {
    const ir_module *m = r->m;
    ir_value_id ids = ir_op_result(m, r->ids_op, 0), pos = ir_op_result(m, r->pos_op, 0);
    const ir_type *t = &m->values[pos].type;
    if (t->rank == 1 && !smelt_dtype_is_float(t->dtype) &&
        ir_dim_equal(t->dims[0], m->values[ids].type.dims[0]))
        return true;
    diag_error(d, m->ops[r->pos_op].loc,
               "input 'pos' must be an integer vector shaped like 'ids' (%s), found %s",
               value_type_text(m, ids, (char[IR_TYPE_TEXT_MAX]){0}),
               value_type_text(m, pos, (char[IR_TYPE_TEXT_MAX]){0}));
    return false;
}

/* "logits" is float with a constant last dim, the vocabulary. */
static bool check_logits(ref_model *r, diag_engine *d) {
    const ir_module *m = r->m;
    ir_value_id logits = m->ops[r->logits_op].operands[0];
    const ir_type *t = &m->values[logits].type;
    if (t->dtype == SMELT_DTYPE_UNKNOWN) return false; /* reported with the op that makes it */
    if (!smelt_dtype_is_float(t->dtype) || (t->rank > 0 && ir_dim_is_symbol(t->dims[t->rank - 1]))) {
        diag_error(d, m->ops[r->logits_op].loc,
                   "output 'logits' must be float with a constant last dim, found %s",
                   value_type_text(m, logits, (char[IR_TYPE_TEXT_MAX]){0}));
        return false;
    }
    r->vocab = t->rank > 0 ? (uint64_t)t->dims[t->rank - 1].size : 1;
    return true;
}

/* Every dim of `t` is a constant or the token symbol. */
static bool check_dims(const ref_model *r, uint32_t op, const ir_dim *dims, unsigned rank, diag_engine *d) {
    const ir_module *m = r->m;
    for (unsigned i = 0; i < rank; i++) {
        if (!ir_dim_is_symbol(dims[i]) || dims[i].symbol == r->token_symbol) continue;
        const char *name = m->symbols[dims[i].symbol].name, *token = m->symbols[r->token_symbol].name;
        diag_error(
            d, m->ops[op].loc,
            "%s: the reference backend can only bind the token dim '%.*s%s', found the symbol '%.*s%s'",
            op_name(m, op), DIAG_NAME(token), DIAG_NAME(name));
        return false;
    }
    return true;
}

/* Operand `index` of an op of this kind must hold float data. */
static bool operand_needs_float(ir_op_kind kind, uint32_t index) {
    switch (kind) {
    case IR_OP_EMBEDDING:
    case IR_OP_ROPE: return index == 0 || index == 2; /* x and the table */
    case IR_OP_ATTENTION: return index < 3;
    case IR_OP_MATMUL:
    case IR_OP_ADD:
    case IR_OP_MUL:
    case IR_OP_RMS_NORM:
    case IR_OP_LAYER_NORM:
    case IR_OP_SOFTMAX:
    case IR_OP_SILU:
    case IR_OP_GELU:
    case IR_OP_TANH:
    case IR_OP_SIGMOID:
    case IR_OP_QUANTIZE:
    case IR_OP_MOE: return true;
    default: return false; /* layout ops and argmax move or read either */
    }
}

/* A weight's data comes as floats (or packed codes that dequantize to
 * them) over constant dims. */
static bool check_weight(const ir_module *m, uint32_t op, diag_engine *d) {
    const ir_type *t = &m->values[ir_op_result(m, op, 0)].type;
    const char *name = ir_op_string(m, op, "name");
    char text[IR_TYPE_TEXT_MAX];
    bool constant = true;
    for (unsigned i = 0; i < t->rank; i++)
        constant = constant && !ir_dim_is_symbol(t->dims[i]);
    quant_format f;
    if (!(smelt_dtype_is_float(t->dtype) || ir_weight_quant(m, op, &f)) || !constant) {
        diag_error(d, m->ops[op].loc, "weight '%.*s%s' must be float with constant dims, found %s",
                   DIAG_NAME(name), value_type_text(m, ir_op_result(m, op, 0), text));
        return false;
    }
    return true;
}

/* The checks of one live op beyond ir_verify; reports each problem. */
static bool check_op(const ref_model *r, uint32_t op, diag_engine *d) {
    const ir_module *m = r->m;
    const ir_op *o = &m->ops[op];
    bool ok = true;
    char text[IR_TYPE_TEXT_MAX];
    for (uint32_t i = 0; i < o->result_count; i++) {
        const ir_type *t = &m->values[o->results[i]].type;
        uint64_t elements, bytes;
        if (t->dtype == SMELT_DTYPE_UNKNOWN) {
            diag_error(d, o->loc, "%s: result %u has no type; run infer-shapes before the reference backend",
                       op_name(m, op), i);
            ok = false;
        } else if (!check_dims(r, op, t->dims, t->rank, d)) {
            ok = false;
        } else if (!ir_type_max_elements(m, t, &elements) ||
                   size_mul_overflow(elements, sizeof(float), &bytes)) {
            diag_error(d, o->loc, "%s: result %s takes more than 2^64 bytes as float", op_name(m, op),
                       value_type_text(m, o->results[i], text));
            ok = false;
        }
    }
    for (uint32_t i = 0; i < o->operand_count; i++) {
        const ir_type *t = &m->values[o->operands[i]].type;
        quant_format f; /* a quantized weight's codes dequantize to floats (load_quantized) */
        uint32_t def = m->values[o->operands[i]].def_op; /* a quantize's codes are held as their values */
        if (t->dtype == SMELT_DTYPE_UNKNOWN || smelt_dtype_is_float(t->dtype) ||
            !operand_needs_float(o->kind, i) || ir_weight_quant(m, def, &f) ||
            m->ops[def].kind == IR_OP_QUANTIZE)
            continue;
        diag_error(d, o->loc, "%s: the reference backend computes only on float values, but operand %u is %s",
                   op_name(m, op), i, value_type_text(m, o->operands[i], text));
        ok = false;
    }
    if (o->kind == IR_OP_RESHAPE) {
        const ir_attr *shape = ir_op_attr(m, op, "shape");
        ok = ok && check_dims(r, op, shape->as.shape.items, shape->as.shape.count, d);
    }
    if (o->kind == IR_OP_WEIGHT && ok) ok = check_weight(m, op, d);
    if (o->kind == IR_OP_CONST && ok && !smelt_dtype_is_float(m->values[o->results[0]].type.dtype)) {
        diag_error(d, o->loc, "const: the reference backend holds constants as float, found %s",
                   value_type_text(m, o->results[0], text));
        ok = false;
    }
    if (o->kind == IR_OP_ATTENTION && ok) {
        const ir_type *k = &m->values[o->operands[1]].type, *v = &m->values[o->operands[2]].type;
        if (ir_dim_is_symbol(k->dims[1]) || ir_dim_is_symbol(k->dims[2]) || ir_dim_is_symbol(v->dims[2])) {
            diag_error(d, o->loc,
                       "attention: the KV cache needs constant heads and head dims, found k %s and v %s",
                       value_type_text(m, o->operands[1], text),
                       value_type_text(m, o->operands[2], (char[IR_TYPE_TEXT_MAX]){0}));
            ok = false;
        }
    }
    return ok;
}

/* ---- weights, constants, caches ---------------------------------------------------- */

/* Elements of t with the token symbol (its only symbol, checked at create)
 * bound to `tokens`; no overflow, as it fits at the symbol's bound. */
static uint64_t element_count(const ir_type *t, uint64_t tokens) {
    uint64_t n = 1;
    for (unsigned i = 0; i < t->rank; i++)
        n *= ir_dim_is_symbol(t->dims[i]) ? tokens : (uint64_t)t->dims[i].size;
    return n;
}

/* Shapes `tensor` as type t with the token symbol bound to `tokens` and
 * allocates its data (never NULL, so empty tensors need no special case).
 * False after reporting at the op's location when memory runs out. */
static bool tensor_alloc(ref_tensor *tensor, const ir_type *t, uint64_t tokens, const char *what,
                         smelt_loc loc, diag_engine *d) {
    memset(tensor, 0, sizeof *tensor);
    tensor->elem = smelt_dtype_is_float(t->dtype) ? REF_F32 : REF_I32;
    tensor->rank = t->rank;
    for (unsigned i = 0; i < t->rank; i++)
        tensor->dims[i] = ir_dim_is_symbol(t->dims[i]) ? tokens : (uint64_t)t->dims[i].size;
    tensor->count = element_count(t, tokens);
    void *data = malloc(tensor->count ? tensor->count * sizeof(float) : sizeof(float));
    if (!data) {
        diag_error(d, loc, "%s: cannot allocate %llu bytes", what,
                   (unsigned long long)tensor->count * sizeof(float));
        return false;
    }
    if (tensor->elem == REF_F32)
        tensor->f = data;
    else
        tensor->i = data;
    return true;
}

static void tensor_free(ref_tensor *tensor) {
    free(tensor->f);
    free(tensor->i);
    tensor->f = NULL;
    tensor->i = NULL;
}

/* Quantized weight op `op` into t->f: its packed bytes, dequantized; a
 * stacked [E, N, K] weight (MoE experts) matrix by matrix. The packed
 * bytes are kept in *q (W8A8 matmuls and moes compute on their codes). */
static bool load_quantized(const ir_module *m, uint32_t op, const quant_format *f, ref_tensor *t,
                           quant_tensor *q, ref_packed_weight_reader read_packed, void *context,
                           diag_engine *d) {
    const ir_op *o = &m->ops[op];
    const char *name = ir_op_string(m, op, "name");
    uint64_t matrices = t->rank == 3 ? t->dims[0] : 1, stride, total;
    *q = (quant_tensor){.format = *f};
    if (quant_stack_layout_of(f, matrices, t->dims[t->rank - 2], t->dims[t->rank - 1], &q->layout, &stride,
                              &total) != NULL)
        return false; /* the verifier's */
    uint8_t *bytes = malloc(total ? total : 1);
    bool ok = bytes && read_packed && read_packed(context, op, bytes, total);
    for (uint64_t e = 0; ok && e < matrices; e++) {
        quant_tensor one = *q;
        one.data = bytes + e * stride;
        quant_dequantize(&one, t->f + e * q->layout.rows * q->layout.cols);
    }
    if (!ok)
        diag_error(d, o->loc, "weight '%.*s%s': its %s data (%llu bytes) could not be read", DIAG_NAME(name),
                   quant_kind_name(f->kind), (unsigned long long)total);
    if (ok) /* a stack's bytes too: W8A8 experts compute on their codes */
        q->data = bytes;
    else
        free(bytes);
    return ok;
}

/* Reads every live weight once and sets every constant. */
static bool load_weights(ref_model *r, ref_weight_reader read_weight, ref_packed_weight_reader read_packed,
                         void *context, diag_engine *d) {
    const ir_module *m = r->m;
    bool ok = true;
    for (uint32_t i = 0; i < m->op_count && !diag_should_stop(d); i++) {
        const ir_op *o = &m->ops[i];
        if (o->dead || (o->kind != IR_OP_WEIGHT && o->kind != IR_OP_CONST)) continue;
        ir_value_id v = o->results[0];
        ref_tensor *t = &r->tensors[v];
        const char *name = o->kind == IR_OP_WEIGHT ? ir_op_string(m, i, "name") : "const";
        quant_format f;
        bool quantized = ir_weight_quant(m, i, &f);
        ir_type type = m->values[v].type;
        if (quantized) type.dtype = SMELT_DTYPE_F32; /* its dequantized values */
        if (!tensor_alloc(t, &type, 0, name, o->loc, d)) {
            ok = false;
            continue;
        }
        r->persistent[v] = true;
        if (o->kind == IR_OP_CONST) {
            t->f[0] = r->attrs[i].value;
        } else if (quantized) {
            if (!load_quantized(m, i, &f, t, &r->packed[v], read_packed, context, d)) ok = false;
        } else if (!read_weight(context, i, t->f, t->count)) {
            diag_error(d, o->loc, "weight '%.*s%s': its data (%llu floats) could not be read",
                       DIAG_NAME(name), (unsigned long long)t->count);
            ok = false;
        }
    }
    return ok;
}

/* The KV cache of attention op `op`: max_seq x kv heads x head dims. */
static bool cache_alloc(ref_model *r, uint32_t op, diag_engine *d) {
    const ir_module *m = r->m;
    const ir_op *o = &m->ops[op];
    const ir_type *k = &m->values[o->operands[1]].type, *v = &m->values[o->operands[2]].type;
    ref_kv_cache *c = &r->caches[op];
    c->max_seq = (uint64_t)attr_int(m, op, "max_seq");
    c->kv_heads = (uint64_t)k->dims[1].size;
    c->head_dim = (uint64_t)k->dims[2].size;
    c->value_dim = (uint64_t)v->dims[2].size;
    uint64_t key_floats, value_floats, key_bytes, value_bytes, scores_bytes, total_bytes;
    if (size_mul_overflow(c->max_seq, c->kv_heads * c->head_dim, &key_floats) ||
        size_mul_overflow(c->max_seq, c->kv_heads * c->value_dim, &value_floats) ||
        size_mul_overflow(key_floats, sizeof(float), &key_bytes) ||
        size_mul_overflow(value_floats, sizeof(float), &value_bytes) ||
        size_mul_overflow(c->max_seq, sizeof(double), &scores_bytes) ||
        size_add_overflow(key_bytes, value_bytes, &total_bytes)) {
        diag_error(d, o->loc, "attention: a KV cache of max_seq %llu positions does not fit in memory",
                   (unsigned long long)c->max_seq);
        return false;
    }
    c->keys = calloc(key_floats ? key_floats : 1, sizeof(float));
    c->values = calloc(value_floats ? value_floats : 1, sizeof(float));
    c->written = calloc(c->max_seq, sizeof(bool));
    c->scores = calloc(c->max_seq, sizeof(double));
    c->mixed = calloc(c->value_dim ? c->value_dim : 1, sizeof(double));
    if (!c->keys || !c->values || !c->written || !c->scores || !c->mixed) {
        diag_error(d, o->loc, "attention: cannot allocate a KV cache of %llu bytes (max_seq %llu)",
                   (unsigned long long)total_bytes, (unsigned long long)c->max_seq);
        return false;
    }
    return true;
}

static void cache_free(ref_kv_cache *c) {
    free(c->keys);
    free(c->values);
    free(c->written);
    free(c->scores);
    free(c->mixed);
}

/* ---- create, reset, free ------------------------------------------------------------ */

ref_model *ref_model_create(const ir_module *m, ref_weight_reader read_weight, void *context,
                            diag_engine *d) {
    return ref_model_create_packed(m, read_weight, NULL, context, d);
}

ref_model *ref_model_create_packed(const ir_module *m, ref_weight_reader read_weight,
                                   ref_packed_weight_reader read_packed, void *context, diag_engine *d) {
    if (!ir_verify(m, d)) return NULL;
    ref_model *r = calloc(1, sizeof *r);
    if (!r) {
        diag_error(d, SMELT_NO_LOC, "out of memory");
        return NULL;
    }
    r->m = m;
    uint32_t ops = m->op_count ? m->op_count : 1, values = m->value_count ? m->value_count : 1;
    r->attrs = calloc(ops, sizeof *r->attrs);
    r->caches = calloc(ops, sizeof *r->caches);
    r->tensors = calloc(values, sizeof *r->tensors);
    r->packed = calloc(values, sizeof *r->packed);
    r->persistent = calloc(values, sizeof *r->persistent);
    r->last_use = malloc(values * sizeof *r->last_use);
    if (!r->attrs || !r->caches || !r->tensors || !r->packed || !r->persistent || !r->last_use) {
        free(r->attrs);
        free(r->caches);
        free(r->tensors);
        free(r->packed);
        free(r->persistent);
        free(r->last_use);
        free(r);
        diag_error(d, SMELT_NO_LOC, "out of memory");
        return NULL;
    }
    memset(r->last_use, 0xff, values * sizeof *r->last_use); /* UINT32_MAX: unused */

    /* Every check first, reporting every problem; the op checks need the token symbol. */
    bool ok = find_interface(r, d);
    if (r->ids_op != NO_OP && check_ids(r, d)) {
        for (uint32_t i = 0; i < m->op_count && !diag_should_stop(d); i++)
            if (!m->ops[i].dead && !check_op(r, i, d)) ok = false;
        if (r->pos_op != NO_OP && !check_pos(r, d)) ok = false;
        if (r->logits_op != NO_OP && !check_logits(r, d)) ok = false;
    } else {
        ok = false;
    }
    for (uint32_t i = 0; ok && i < m->op_count && !diag_should_stop(d); i++) {
        const ir_op *o = &m->ops[i];
        if (o->dead) continue;
        r->attrs[i] = read_attrs(m, i);
        for (uint32_t j = 0; j < o->operand_count; j++)
            r->last_use[o->operands[j]] = i;
        if (o->kind == IR_OP_ATTENTION && !cache_alloc(r, i, d)) ok = false;
    }
    if (ok && !load_weights(r, read_weight, read_packed, context, d)) ok = false;
    if (!ok) {
        ref_model_free(r);
        return NULL;
    }
    return r;
}

void ref_model_reset(ref_model *r) {
    for (uint32_t i = 0; i < r->m->op_count; i++) {
        ref_kv_cache *c = &r->caches[i];
        if (!c->written) continue;
        memset(c->keys, 0, c->max_seq * c->kv_heads * c->head_dim * sizeof(float));
        memset(c->values, 0, c->max_seq * c->kv_heads * c->value_dim * sizeof(float));
        memset(c->written, 0, c->max_seq * sizeof(bool));
        c->end = 0;
    }
}

void ref_model_free(ref_model *r) {
    if (!r) return;
    for (uint32_t i = 0; r->caches && i < r->m->op_count; i++)
        cache_free(&r->caches[i]);
    for (uint32_t v = 0; r->tensors && v < r->m->value_count; v++)
        tensor_free(&r->tensors[v]);
    for (uint32_t v = 0; r->packed && v < r->m->value_count; v++)
        free(r->packed[v].data);
    free(r->attrs);
    free(r->caches);
    free(r->tensors);
    free(r->packed);
    free(r->persistent);
    free(r->last_use);
    free(r);
}

uint64_t ref_model_vocab(const ref_model *r) { return r->vocab; }

void ref_model_observe_experts(ref_model *r, ref_expert_observer observer) { r->expert_observer = observer; }

void ref_model_observe_matmuls(ref_model *r, ref_matmul_observer observer, void *context) {
    r->observer = observer;
    r->observer_context = context;
}

uint64_t ref_model_output_count(const ref_model *r, uint32_t n) {
    if (n > r->token_bound) return 0;
    const ir_module *m = r->m;
    return element_count(&m->values[m->ops[r->logits_op].operands[0]].type, n);
}

/* ---- the step ----------------------------------------------------------------------- */

/* Frees the step's values that op `op` was the last to read, and its results
 * that nothing reads. */
static void release_after(ref_model *r, uint32_t op) {
    const ir_op *o = &r->m->ops[op];
    for (uint32_t i = 0; i < o->operand_count; i++) {
        ir_value_id v = o->operands[i];
        if (r->last_use[v] == op && !r->persistent[v]) tensor_free(&r->tensors[v]);
    }
    for (uint32_t i = 0; i < o->result_count; i++) {
        ir_value_id v = o->results[i];
        if (r->last_use[v] == NO_OP && !r->persistent[v]) tensor_free(&r->tensors[v]);
    }
}

/* The tensor of input op `op` for this step: a copy of ids or pos. */
static bool bind_input(ref_model *r, uint32_t op, const int32_t *data, uint32_t n, diag_engine *d) {
    ir_value_id v = ir_op_result(r->m, op, 0);
    ref_tensor *t = &r->tensors[v];
    if (!tensor_alloc(t, &r->m->values[v].type, n, ir_op_string(r->m, op, "name"), r->m->ops[op].loc, d))
        return false;
    memcpy(t->i, data, (size_t)n * sizeof *data);
    return true;
}

/* Allocates the results of compute op `op` and runs it. */
static bool run_compute(ref_model *r, uint32_t op, uint32_t n, diag_engine *d) {
    const ir_module *m = r->m;
    const ir_op *o = &m->ops[op];
    const ref_tensor *operands[IR_MAX_OPERANDS];
    for (uint32_t i = 0; i < o->operand_count; i++)
        operands[i] = &r->tensors[o->operands[i]];
    /* The op fills an array of results; they are then kept by value id. */
    ref_tensor *results = calloc(o->result_count ? o->result_count : 1, sizeof *results);
    if (!results) {
        diag_error(d, o->loc, "%s: out of memory", op_name(m, op));
        return false;
    }
    if (r->observer && o->kind == IR_OP_MATMUL) {
        const ref_tensor *x = operands[0];
        uint64_t cols = x->rank ? x->dims[x->rank - 1] : 1;
        r->observer(r->observer_context, op, x->f, cols ? x->count / cols : 0, cols);
    }
    bool ok = true;
    for (uint32_t i = 0; ok && i < o->result_count; i++) {
        ir_type held = m->values[o->results[i]].type;
        if (o->kind == IR_OP_QUANTIZE) held.dtype = SMELT_DTYPE_F32; /* codes as the values they stand for */
        ok = tensor_alloc(&results[i], &held, n, op_name(m, op), o->loc, d);
    }
    if (ok) {
        ref_call call = {.in = operands,
                         .in_count = o->operand_count,
                         .out = results,
                         .out_count = o->result_count,
                         .attrs = &r->attrs[op],
                         .kv = &r->caches[op],
                         .weight_codes = o->kind == IR_OP_MATMUL && o->operand_count > 1
                                             ? &r->packed[o->operands[1]]
                                             : NULL,
                         .loc = o->loc,
                         .d = d,
                         .op = op,
                         .expert_observer = r->expert_observer,
                         .observer_context = r->observer_context};
        for (uint32_t k = 0; o->kind == IR_OP_MOE && k < 3 && o->operand_count == 5; k++) {
            const quant_tensor *q = &r->packed[o->operands[2 + k]];
            const ir_type *t = &m->values[o->operands[2 + k]].type;
            quant_layout layout;
            uint64_t total;
            if (!q->data || t->rank != 3 ||
                quant_stack_layout_of(&q->format, (uint64_t)t->dims[0].size, (uint64_t)t->dims[1].size,
                                      (uint64_t)t->dims[2].size, &layout, &call.expert_stride[k], &total))
                continue;
            call.expert_codes[k] = q;
        }
        ok = ref_run_op(o->kind, &call);
    }
    for (uint32_t i = 0; i < o->result_count; i++) { /* on failure, freed with the step */
        tensor_free(&r->tensors[o->results[i]]);
        r->tensors[o->results[i]] = results[i];
    }
    free(results);
    return ok;
}

/* The step's arguments: a token count within the bound, data to read, room
 * for the logits. */
static bool check_step(const ref_model *r, const int32_t *ids, const int32_t *pos, uint32_t n,
                       const float *logits, uint64_t logits_capacity, diag_engine *d) {
    const ir_module *m = r->m;
    smelt_loc at = m->ops[r->ids_op].loc;
    const char *token = m->symbols[r->token_symbol].name;
    if (n == 0 || n > r->token_bound) {
        diag_error(d, at, "a step takes 1 to %lld tokens (the bound of '%.*s%s'), found %u",
                   (long long)r->token_bound, DIAG_NAME(token), n);
        return false;
    }
    if (!ids || !pos || !logits) {
        const char *missing = !ids ? "ids" : !pos ? "pos" : "logits";
        diag_error(d, at, "a step needs ids, positions and a logits buffer, found a NULL %s", missing);
        return false;
    }
    uint64_t needed = ref_model_output_count(r, n);
    if (logits_capacity < needed) {
        diag_error(d, m->ops[r->logits_op].loc,
                   "output 'logits' of %u tokens needs %llu floats, but the buffer holds %llu", n,
                   (unsigned long long)needed, (unsigned long long)logits_capacity);
        return false;
    }
    return true;
}

bool ref_model_step(ref_model *r, const int32_t *ids, const int32_t *pos, uint32_t n, float *logits,
                    uint64_t logits_capacity, diag_engine *d) {
    if (!check_step(r, ids, pos, n, logits, logits_capacity, d)) return false;
    const ir_module *m = r->m;
    bool ok = true;
    for (uint32_t i = 0; ok && i < m->op_count; i++) {
        const ir_op *o = &m->ops[i];
        if (o->dead) continue;
        switch (o->kind) {
        case IR_OP_INPUT: ok = bind_input(r, i, i == r->ids_op ? ids : pos, n, d); break;
        case IR_OP_WEIGHT:
        case IR_OP_CONST: break; /* loaded at create time */
        case IR_OP_OUTPUT:
            if (i == r->logits_op) {
                const ref_tensor *t = &r->tensors[o->operands[0]];
                memcpy(logits, t->f, t->count * sizeof(float));
            }
            break;
        default: ok = run_compute(r, i, n, d); break;
        }
        release_after(r, i);
    }
    for (uint32_t v = 0; v < m->value_count; v++) /* whatever a failed step left */
        if (!r->persistent[v]) tensor_free(&r->tensors[v]);
    return ok;
}
