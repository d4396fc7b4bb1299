/* weights.c - finding each weight op's tensor(s) in a checkpoint and checking
 * dtype and shape (rules: weights.h); reading a bound weight as f32.
 */
#include "weights.h"
#include "transpose.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum { FE_UNUSED_NAMES_SHOWN = 10 };

typedef struct fe_binder {
    const ir_module *m;
    const st_checkpoint *ck;
    diag_engine *d;
    fe_weight_binding *out;
    uint8_t *used; /* per checkpoint tensor */
} fe_binder;

char *fe_stacked_part_name(arena *a, const char *template, const char *var, uint64_t index) {
    size_t var_length = strlen(var), length = strlen(template), count = 0;
    for (const char *p = template; (p = strchr(p, '{')) != NULL; p++)
        if (strncmp(p + 1, var, var_length) == 0 && p[1 + var_length] == '}') count++;
    uint64_t capacity; /* each replacement adds at most 20 digits */
    if (size_mul_overflow(count, 20, &capacity) || size_add_overflow(capacity, length + 1, &capacity))
        SMELT_DIE("weight name of %zu bytes", length);
    char *out = arena_alloc(a, (size_t)capacity);
    size_t used = 0;
    for (const char *p = template; *p;) {
        if (p[0] == '{' && strncmp(p + 1, var, var_length) == 0 && p[1 + var_length] == '}') {
            used += (size_t)snprintf(out + used, 21, "%llu", (unsigned long long)index);
            p += var_length + 2;
        } else {
            out[used++] = *p++;
        }
    }
    out[used] = '\0';
    return out;
}

/* The tensor `name` of the checkpoint, checked against dtype and `shape`;
 * NULL after reporting. */
static const st_tensor *find_part(fe_binder *b, const ir_op *op, const char *name, const uint64_t *shape,
                                  uint32_t rank, bool *quantized) {
    *quantized = false;
    if (b->out->scheme.method != QCK_METHOD_NONE) {
        uint64_t rows, cols;
        qck_result r = qck_weight_shape(&b->out->scheme, b->ck, name, &rows, &cols, b->d);
        if (r == QCK_FAILED) return NULL;
        if (r == QCK_QUANTIZED) {
            uint32_t indices[QCK_MAX_TENSORS];
            uint32_t count = qck_weight_tensors(&b->out->scheme, b->ck, name, indices);
            for (uint32_t i = 0; i < count; i++)
                b->used[indices[i]] = 1;
            if (rank != 2 || shape[0] != rows || shape[1] != cols) {
                uint64_t found[2] = {rows, cols};
                char text[ST_SHAPE_TEXT_MAX], expected[ST_SHAPE_TEXT_MAX];
                diag_error(b->d, op->loc,
                           "weight '%.*s%s' is %s in the checkpoint (%s quantized) but the model expects %s",
                           DIAG_NAME(name), st_format_shape(found, 2, text, sizeof text),
                           qck_method_name(b->out->scheme.method),
                           st_format_shape(shape, rank, expected, sizeof expected));
                return NULL;
            }
            *quantized = true;
            return b->ck->tensors[indices[0]];
        }
    }
    uint32_t index = st_checkpoint_index(b->ck, name);
    if (index == UINT32_MAX) {
        diag_error(b->d, op->loc, "weight '%.*s%s' is not in the checkpoint", DIAG_NAME(name));
        return NULL;
    }
    b->used[index] = 1;
    const st_tensor *t = b->ck->tensors[index];
    bool ok = true;
    if (!st_dtype_is_float(t->dtype)) {
        diag_error(b->d, op->loc,
                   "weight '%.*s%s' has dtype %s in the checkpoint; weights must have a float dtype "
                   "(F32, F16, BF16, F8_E4M3 or F8_E5M2)",
                   DIAG_NAME(name), st_dtype_name(t->dtype));
        ok = false;
    }
    bool same_shape = t->rank == rank;
    for (uint32_t i = 0; same_shape && i < rank; i++)
        same_shape = t->shape[i] == shape[i];
    if (!same_shape) {
        char found[ST_SHAPE_TEXT_MAX], expected[ST_SHAPE_TEXT_MAX];
        diag_error(b->d, op->loc, "weight '%.*s%s' has shape %s in the checkpoint but the model expects %s",
                   DIAG_NAME(name), st_format_shape(t->shape, t->rank, found, sizeof found),
                   st_format_shape(shape, rank, expected, sizeof expected));
        ok = false;
    }
    return ok ? t : NULL;
}

/* The constant dims of a weight's type into `shape`; symbols are errors. */
static bool weight_shape(fe_binder *b, const ir_op *op, const char *name, const ir_type *type,
                         uint64_t *shape) {
    bool ok = true;
    for (uint32_t i = 0; i < type->rank && i < IR_MAX_DIMS; i++) {
        ir_dim dim = type->dims[i];
        if (ir_dim_is_symbol(dim) || dim.size < 0) {
            char text[DIAG_NAME_MAX + 32];
            diag_error(b->d, op->loc, "weight '%.*s%s' has dim %u '%s'; weight dims must be constants",
                       DIAG_NAME(name), i, ir_format_dim(b->m, dim, text, sizeof text));
            ok = false;
            continue;
        }
        shape[i] = (uint64_t)dim.size;
    }
    return ok;
}

static void bind_weight(fe_binder *b, uint32_t op_index) {
    const ir_op *op = ir_op_at(b->m, op_index);
    const ir_attr *name_attr = ir_op_attr(b->m, op_index, "name");
    const ir_attr *stack_attr = ir_op_attr(b->m, op_index, "stack");
    if (!name_attr || name_attr->kind != IR_ATTR_STRING || op->result_count != 1) {
        diag_error(b->d, op->loc, "weight op %u needs a 'name' attribute and one result", op_index);
        return;
    }
    const char *name = name_attr->as.s;
    const char *stack = stack_attr && stack_attr->kind == IR_ATTR_STRING ? stack_attr->as.s : "";
    const ir_type *type = &ir_value_at(b->m, op->results[0])->type;
    uint64_t shape[IR_MAX_DIMS] = {0};
    if (type->rank > IR_MAX_DIMS) {
        diag_error(b->d, op->loc, "weight '%.*s%s' has %u dims; at most %d are supported", DIAG_NAME(name),
                   type->rank, IR_MAX_DIMS);
        return;
    }
    if (!weight_shape(b, op, name, type, shape)) return;
    uint64_t elements = 1;
    for (uint32_t i = 0; i < type->rank; i++)
        if (size_mul_overflow(elements, shape[i], &elements)) {
            diag_error(b->d, op->loc, "weight '%.*s%s' has more elements than fit in 64 bits",
                       DIAG_NAME(name));
            return;
        }

    fe_bound_weight *w = &b->out->weights[op_index];
    if (ir_op_bool(b->m, op_index, "transposed") && !*stack && type->rank == 2) {
        w->transposed = true; /* the checkpoint holds [K, N] */
        uint64_t rows = shape[0];
        shape[0] = shape[1];
        shape[1] = rows;
    }
    if (!*stack) {
        bool quantized;
        const st_tensor *t = find_part(b, op, name, shape, type->rank, &quantized);
        if (!t) return;
        if (quantized && w->transposed) {
            diag_error(b->d, op->loc,
                       "weight '%.*s%s' is read transposed (in_out) but the checkpoint holds it quantized",
                       DIAG_NAME(name));
            return;
        }
        w->parts = arena_array(&b->out->arena, 1, sizeof *w->parts);
        w->parts[0] = t;
        w->quantized = quantized;
        w->names = arena_array(&b->out->arena, 1, sizeof *w->names);
        w->names[0] = name;
        w->part_count = 1;
        w->element_count = elements;
        w->bound = true;
        return;
    }
    if (type->rank < 2) {
        diag_error(b->d, op->loc, "stacked weight '%.*s%s' needs at least 2 dims (dim 0 counts the parts)",
                   DIAG_NAME(name));
        return;
    }
    char *first_part = fe_stacked_part_name(&b->out->arena, name, stack, 0);
    bool has_stack_var = strcmp(first_part, name) != 0;
    if (!has_stack_var) {
        diag_error(b->d, op->loc, "the name of stacked weight '%.*s%s' must contain '{%.*s%s}'",
                   DIAG_NAME(name), DIAG_NAME(stack));
        return;
    }
    if (shape[0] > b->ck->tensor_count) {
        diag_error(b->d, op->loc,
                   "stacked weight '%.*s%s' has %llu parts but the checkpoint holds only %u tensor%s",
                   DIAG_NAME(name), (unsigned long long)shape[0], b->ck->tensor_count,
                   b->ck->tensor_count == 1 ? "" : "s");
        return;
    }
    uint32_t parts = (uint32_t)shape[0];
    w->parts = arena_array(&b->out->arena, parts ? parts : 1, sizeof *w->parts);
    w->names = arena_array(&b->out->arena, parts ? parts : 1, sizeof *w->names);
    bool ok = true;
    for (uint32_t i = 0; i < parts && !diag_should_stop(b->d); i++) {
        char *part_name = fe_stacked_part_name(&b->out->arena, name, stack, i);
        bool quantized;
        w->parts[i] = find_part(b, op, part_name, shape + 1, type->rank - 1u, &quantized);
        w->names[i] = part_name;
        ok &= w->parts[i] != NULL;
        if (w->parts[i] && i == 0) w->quantized = quantized;
        if (w->parts[i] && quantized != w->quantized) {
            diag_error(b->d, op->loc, "stacked weight '%.*s%s': part %u is %squantized, part 0 is %s",
                       DIAG_NAME(name), i, quantized ? "" : "not ", w->quantized ? "" : "not");
            ok = false;
        }
    }
    if (!ok || diag_should_stop(b->d)) return;
    w->part_count = parts;
    w->element_count = elements;
    w->bound = true;
}

/* One error listing the checkpoint tensors no weight used and no `ignore`
 * pattern of the model covers: a tensor the model leaves out is a part of
 * the network it does not compute (Llama's o_proj bias was one). */
static void refuse_unused(fe_binder *b) {
    const st_checkpoint *ck = b->ck;
    uint32_t unused = 0, ignored = 0;
    for (uint32_t i = 0; i < ck->tensor_count; i++) {
        if (b->used[i]) continue;
        if (ir_tensor_is_ignored(b->m, ck->tensors[i]->name)) {
            b->used[i] = 2; /* ignored: not listed below */
            ignored++;
        } else {
            unused++;
        }
    }
    b->out->unused_count = unused + ignored;
    if (!unused) return;
    size_t capacity = 128 + FE_UNUSED_NAMES_SHOWN * (DIAG_NAME_MAX + 8), length = 0;
    char *names = arena_alloc(&b->out->arena, capacity);
    uint32_t shown = 0;
    for (uint32_t i = 0; i < ck->tensor_count && shown < FE_UNUSED_NAMES_SHOWN; i++) {
        if (b->used[i]) continue;
        const char *name = ck->tensors[i]->name;
        length += (size_t)snprintf(names + length, capacity - length, "%s'%.*s%s'", shown ? ", " : "",
                                   DIAG_NAME(name));
        shown++;
    }
    smelt_loc loc = {ck->diag_file, 0, 0};
    diag_error(b->d, loc, "%u %s of the checkpoint %s used by no weight of the model: %s%s", unused,
               unused == 1 ? "tensor" : "tensors", unused == 1 ? "is" : "are", names,
               unused > shown ? ", ..." : "");
    diag_note(b->d, SMELT_NO_LOC,
              "a model that leaves a tensor out does not compute what the checkpoint holds; if it is "
              "knowingly unused, say so in the spec (ignore \"NAME\", '*' for any name part) or pass "
              "--allow-unused-tensor NAME");
}

bool fe_bind_weights(const ir_module *m, const st_checkpoint *ck, diag_engine *d, fe_weight_binding *out) {
    return fe_bind_weights_quantized(m, ck, NULL, d, out);
}

bool fe_bind_weights_quantized(const ir_module *m, const st_checkpoint *ck, const qck_scheme *scheme,
                               diag_engine *d, fe_weight_binding *out) {
    memset(out, 0, sizeof *out);
    if (scheme) out->scheme = *scheme;
    arena_init(&out->arena);
    arena_recovery recovery;
    if (arena_recovery_enter(&recovery, setjmp(recovery.where))) {
        diag_error(d, SMELT_NO_LOC, "out of memory binding the weights");
        return false; /* fe_weight_binding_free frees what was bound */
    }
    out->module = m;
    out->checkpoint = ck;
    out->diag = d;
    out->op_count = m->op_count;
    out->weights = arena_array(&out->arena, m->op_count ? m->op_count : 1, sizeof *out->weights);
    fe_binder b = {.m = m, .ck = ck, .d = d, .out = out};
    b.used = arena_array(&out->arena, ck->tensor_count ? ck->tensor_count : 1, 1);
    unsigned errors_before = d->error_count;
    bool ok = true;
    for (uint32_t i = 0; i < m->op_count && !diag_should_stop(d); i++) {
        const ir_op *op = ir_op_at(m, i);
        if (op->dead || op->kind != IR_OP_WEIGHT) continue;
        bind_weight(&b, i);
        ok &= out->weights[i].bound;
    }
    refuse_unused(&b);
    arena_recovery_leave(&recovery);
    return ok && d->error_count == errors_before && !diag_should_stop(d);
}

void fe_weight_binding_free(fe_weight_binding *b) {
    arena_free(&b->arena);
    memset(b, 0, sizeof *b);
}

const fe_bound_weight *fe_weight_binding_get(const fe_weight_binding *b, uint32_t op) {
    if (!b->weights || op >= b->op_count || !b->weights[op].bound) return NULL;
    return &b->weights[op];
}

/* A pre-quantized weight's parts, unpacked and dequantized exactly. */
static bool read_quantized(const fe_weight_binding *b, const fe_bound_weight *w, float *dst,
                           uint64_t per_part) {
    for (uint32_t i = 0; i < w->part_count; i++) {
        qck_weight q;
        if (qck_read_weight(&b->scheme, b->checkpoint, w->names[i], &q, b->diag) != QCK_QUANTIZED)
            return false;
        bool fits = q.tensor.layout.rows * q.tensor.layout.cols == per_part;
        if (fits) quant_dequantize(&q.tensor, dst + (uint64_t)i * per_part);
        qck_weight_free(&q);
        if (!fits) return false;
    }
    return true;
}

/* A transposed weight's tensor [K, N] read into dst as [N, K]. */
static bool read_transposed(const fe_weight_binding *b, const fe_bound_weight *w, float *dst) {
    const st_tensor *t = w->parts[0];
    float *tensor = malloc(w->element_count * sizeof *tensor + 1);
    bool ok = tensor && st_tensor_read_f32(t, tensor, b->diag);
    if (ok) plan_transpose(dst, tensor, t->shape[0], t->shape[1], sizeof *dst);
    free(tensor);
    return ok;
}

bool fe_weight_read_f32(const fe_weight_binding *b, uint32_t op, float *dst, uint64_t count) {
    const fe_bound_weight *w = fe_weight_binding_get(b, op);
    if (!w || count != w->element_count) return false;
    uint64_t per_part = w->part_count ? count / w->part_count : 0;
    if (w->quantized) return read_quantized(b, w, dst, per_part);
    for (uint32_t i = 0; i < w->part_count; i++)
        if (w->parts[i]->byte_size / st_dtype_size(w->parts[i]->dtype) != per_part) return false;
    if (w->transposed) return read_transposed(b, w, dst);
    for (uint32_t i = 0; i < w->part_count; i++)
        if (!st_tensor_read_f32(w->parts[i], dst + (uint64_t)i * per_part, b->diag)) return false;
    return true;
}

bool fe_weight_read_packed(const fe_weight_binding *b, uint32_t op, quant_format *format, uint8_t *dst,
                           uint64_t bytes) {
    const fe_bound_weight *w = fe_weight_binding_get(b, op);
    if (!w || !w->quantized || w->part_count != 1) return false;
    qck_weight q;
    if (qck_read_weight(&b->scheme, b->checkpoint, w->names[0], &q, b->diag) != QCK_QUANTIZED) return false;
    bool ok = !dst || q.tensor.layout.total == bytes;
    if (ok) *format = q.tensor.format;
    if (ok && dst) memcpy(dst, q.tensor.data, bytes);
    qck_weight_free(&q);
    return ok;
}
