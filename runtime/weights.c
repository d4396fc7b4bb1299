/* weights.c - an engine's weights: the plan's own, put on the device when
 * the engine is created, and those bound by the caller
 * (smelt_engine_bind_weight), converted to the plan's storage dtype; a
 * stacked weight (experts) may be bound part by part, and a concatenated one
 * (Q, K and V as one weight, passes/fuse.c) is bound by its parts' names. Before every step all
 * must be bound and the device is told which changed.
 */
#include "engine_internal.h"
#include "error.h"
#include "numeric.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static bool weight_complete(const smelt_engine *engine) {
    for (uint32_t i = 0; i < engine->program->weight_count; i++)
        if (engine->weights[i].state != WEIGHT_COMPLETE) return false;
    return true;
}

smelt_status rt_weights_bind_plan(smelt_engine *engine, rt_error *e) {
    const program *p = engine->program;
    rt_device *d = engine->device;
    for (uint32_t i = 0; i < p->weight_count; i++) {
        const prog_weight *w = &p->weights[i];
        engine_weight *ew = &engine->weights[i];
        if (w->data_offset == UINT64_MAX) continue;
        const uint8_t *data = engine->plan->weight_data + w->data_offset;
        ew->address = w->bytes && d->ops->map_host ? d->ops->map_host(d, data, w->bytes) : NULL;
        if (!ew->address && w->bytes) {
            smelt_status s = d->ops->alloc(d, w->bytes, &ew->address, e);
            if (s == SMELT_OK) ew->owned = true;
            if (s == SMELT_OK) s = d->ops->copy_in(d, ew->address, data, w->bytes, e);
            if (s != SMELT_OK) return s;
        }
        ew->state = WEIGHT_COMPLETE;
        ew->dirty = true;
    }
    return SMELT_OK;
}

/* Part k of concatenated weight w when `name` is that part's; -1 otherwise. */
static int64_t concat_part(const prog_weight *w, const char *name) {
    for (uint32_t k = 0; k < w->part_count; k++)
        if (strcmp(w->parts[k].name, name) == 0) return k;
    return -1;
}

/* Part of w that `name` binds: a stacked part or a concatenated one; -1: none. */
static int64_t weight_part(const prog_weight *w, const char *name) {
    return w->stacked ? program_stacked_part(w, name) : concat_part(w, name);
}

bool smelt_plan_has_weight(const smelt_plan *plan, const char *name) {
    if (!plan || !name) return false;
    const program *p = &plan->program;
    for (uint32_t i = 0; i < p->weight_count; i++)
        if (strcmp(p->weights[i].name, name) == 0 || weight_part(&p->weights[i], name) >= 0) return true;
    return false;
}

/* data (count elements of `from`) converted to the storage dtype, into dst. */
static void convert(void *dst, smelt_dtype to, const void *src, smelt_dtype from, uint64_t count) {
    for (uint64_t i = 0; i < count; i++) {
        float v;
        switch (from) {
        case SMELT_DTYPE_F32: memcpy(&v, (const uint8_t *)src + 4 * i, 4); break;
        case SMELT_DTYPE_BF16: v = plan_bf16_to_f32(((const uint16_t *)src)[i]); break;
        default: v = plan_f16_to_f32(((const uint16_t *)src)[i]); break;
        }
        if (to == SMELT_DTYPE_F32)
            memcpy((uint8_t *)dst + 4 * i, &v, 4);
        else if (to ==
                 SMELT_DTYPE_F16) /* above 65504 an f16 plan's weight is infinite (docs/quantization.md) */
            ((uint16_t *)dst)[i] = plan_f32_to_f16(v);
        else
            ((uint16_t *)dst)[i] = plan_f32_to_bf16(v);
    }
}

/* Makes the weight's device buffer the engine's own, keeping what it held. */
static smelt_status own_weight(smelt_engine *engine, uint32_t index, rt_error *e) {
    engine_weight *ew = &engine->weights[index];
    const prog_weight *w = &engine->program->weights[index];
    rt_device *d = engine->device;
    if (ew->owned) return SMELT_OK;
    void *address;
    smelt_status s = d->ops->alloc(d, w->bytes, &address, e);
    if (s != SMELT_OK) return s;
    if (ew->address && (s = d->ops->copy_in(d, address, engine->plan->weight_data + w->data_offset, w->bytes,
                                            e)) != SMELT_OK) {
        d->ops->free(d, address);
        return s;
    }
    ew->address = address;
    ew->owned = true;
    engine->weight_addresses[index] = address;
    rt_executor_invalidate_graph(&engine->executor); /* launches captured the old address */
    return SMELT_OK;
}

static bool valid_dtype(smelt_dtype t) {
    return t == SMELT_DTYPE_F32 || t == SMELT_DTYPE_BF16 || t == SMELT_DTYPE_F16;
}

smelt_status smelt_engine_bind_weight(smelt_engine *engine, const char *name, smelt_dtype dtype,
                                      const void *data, const int64_t *shape, uint32_t rank) {
    if (!engine || !name || !data || (rank && !shape))
        return rt_last_error_set(SMELT_ERROR_INVALID_ARGUMENT, "smelt_engine_bind_weight: a NULL argument");
    if (!valid_dtype(dtype))
        return rt_last_error_set(SMELT_ERROR_INVALID_ARGUMENT, "smelt_engine_bind_weight: unknown dtype %d",
                                 dtype);
    const program *p = engine->program;
    uint32_t index = UINT32_MAX;
    int64_t part = -1;
    for (uint32_t i = 0; i < p->weight_count && index == UINT32_MAX; i++) {
        if (strcmp(p->weights[i].name, name) == 0)
            index = i;
        else if ((part = weight_part(&p->weights[i], name)) >= 0)
            index = i;
    }
    if (index == UINT32_MAX)
        return rt_last_error_set(SMELT_ERROR_INVALID_ARGUMENT, "the plan has no weight '%.*s%s'",
                                 RT_NAME(name));
    const prog_weight *w = &p->weights[index];
    engine_weight *ew = &engine->weights[index];
    /* A stacked part is the stacked tensor without its dim 0; a concatenated
     * one has its own rows of dim 0. */
    bool concatenated = part >= 0 && w->part_count > 0;
    uint32_t skip = part >= 0 && !concatenated ? 1 : 0;
    int64_t part_shape[8];
    memcpy(part_shape, w->shape, sizeof part_shape);
    if (concatenated) part_shape[0] = w->parts[part].rows;
    bool same = rank + skip == w->rank;
    for (uint32_t k = 0; same && k < rank; k++)
        same = shape[k] == part_shape[k + skip];
    if (!same) {
        char expected[160] = "", got[160] = "";
        for (uint32_t k = skip; k < w->rank; k++)
            snprintf(expected + strlen(expected), sizeof expected - strlen(expected), "%s%lld",
                     k > skip ? ", " : "", (long long)part_shape[k]);
        for (uint32_t k = 0; k < rank && k < 8; k++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", k ? ", " : "",
                     (long long)shape[k]);
        return rt_last_error_set(SMELT_ERROR_INVALID_ARGUMENT,
                                 "weight '%.*s%s' has shape [%s] in the plan but [%s%s] was given",
                                 RT_NAME(name), expected, got, rank > 8 ? ", ..." : "");
    }
    if (w->dtype == SMELT_DTYPE_I32)
        return rt_last_error_set(SMELT_ERROR_UNSUPPORTED,
                                 "weight '%.*s%s' is stored as i32 and cannot be bound from floats",
                                 RT_NAME(name));
    if (w->quant.kind != PROG_QUANT_NONE)
        return rt_last_error_set(SMELT_ERROR_UNSUPPORTED,
                                 "weight '%.*s%s' is quantized in the plan: bind its packed bytes "
                                 "(smelt_engine_bind_weight_bytes; the driver quantizes checkpoints)",
                                 RT_NAME(name));
    /* Where the part goes: the bytes of a row of dim 0 times its rows and the rows before it. */
    uint64_t row_bytes = w->shape[0] > 0 ? w->bytes / (uint64_t)w->shape[0] : 0, offset = 0;
    uint64_t part_bytes = part < 0       ? w->bytes
                          : concatenated ? (uint64_t)w->parts[part].rows * row_bytes
                                         : row_bytes;
    if (concatenated)
        for (int64_t k = 0; k < part; k++)
            offset += (uint64_t)w->parts[k].rows * row_bytes;
    else if (part >= 0)
        offset = (uint64_t)part * part_bytes;
    uint64_t count = part_bytes / smelt_dtype_element_bytes(w->dtype);
    rt_error e = {0};
    smelt_status s = own_weight(engine, index, &e);
    if (s != SMELT_OK) return rt_last_error_publish(&e);
    void *converted = part_bytes ? malloc(part_bytes) : NULL;
    if (part_bytes && !converted)
        return rt_last_error_set(SMELT_ERROR_OUT_OF_MEMORY, "out of memory converting '%.*s%s'",
                                 RT_NAME(name));
    convert(converted, (smelt_dtype)w->dtype, data, dtype, count);
    if (part_bytes)
        s = engine->device->ops->copy_in(engine->device, rt_address_at(ew->address, offset), converted,
                                         part_bytes, &e);
    free(converted);
    if (s != SMELT_OK) return rt_last_error_publish(&e);
    ew->dirty = true;
    engine->last_logits_valid = false;
    if (part < 0 || ew->state == WEIGHT_COMPLETE) {
        ew->state = WEIGHT_COMPLETE;
        return SMELT_OK;
    }
    int64_t parts = concatenated ? (int64_t)w->part_count : w->shape[0];
    if (!ew->parts_bound && !(ew->parts_bound = calloc((size_t)parts, 1)))
        return rt_last_error_set(SMELT_ERROR_OUT_OF_MEMORY, "out of memory tracking the parts of '%.*s%s'",
                                 RT_NAME(name));
    ew->parts_bound[part] = 1;
    ew->state = WEIGHT_COMPLETE;
    for (int64_t i = 0; i < parts; i++)
        if (!ew->parts_bound[i]) ew->state = WEIGHT_PARTIAL;
    if (ew->state == WEIGHT_COMPLETE) {
        free(ew->parts_bound);
        ew->parts_bound = NULL;
    }
    return SMELT_OK;
}

smelt_status smelt_engine_bind_weight_bytes(smelt_engine *engine, const char *name, const void *data,
                                            uint64_t bytes) {
    if (!engine || !name || !data)
        return rt_last_error_set(SMELT_ERROR_INVALID_ARGUMENT,
                                 "smelt_engine_bind_weight_bytes: a NULL argument");
    const program *p = engine->program;
    uint32_t index = UINT32_MAX;
    for (uint32_t i = 0; i < p->weight_count && index == UINT32_MAX; i++)
        if (strcmp(p->weights[i].name, name) == 0) index = i;
    if (index == UINT32_MAX)
        return rt_last_error_set(SMELT_ERROR_INVALID_ARGUMENT, "the plan has no weight '%.*s%s'",
                                 RT_NAME(name));
    const prog_weight *w = &p->weights[index];
    if (bytes != w->bytes)
        return rt_last_error_set(SMELT_ERROR_INVALID_ARGUMENT,
                                 "weight '%.*s%s' takes %llu bytes in the plan but %llu were given",
                                 RT_NAME(name), (unsigned long long)w->bytes, (unsigned long long)bytes);
    rt_error e = {0};
    smelt_status s = own_weight(engine, index, &e);
    if (s == SMELT_OK)
        s = engine->device->ops->copy_in(engine->device, engine->weights[index].address, data, bytes, &e);
    if (s != SMELT_OK) return rt_last_error_publish(&e);
    engine_weight *ew = &engine->weights[index];
    free(ew->parts_bound);
    ew->parts_bound = NULL;
    ew->dirty = true;
    ew->state = WEIGHT_COMPLETE;
    engine->last_logits_valid = false;
    return SMELT_OK;
}

smelt_status rt_weights_prepare(smelt_engine *engine) {
    const program *p = engine->program;
    if (!weight_complete(engine)) {
        uint32_t missing = 0, first = 0;
        for (uint32_t i = 0; i < p->weight_count; i++)
            if (engine->weights[i].state != WEIGHT_COMPLETE && missing++ == 0) first = i;
        return rt_last_error_set(
            SMELT_ERROR_MISSING_WEIGHT,
            "weight '%.*s%s'%s is not bound (%u of %u weights are missing): the plan holds no data for it; "
            "bind it with smelt_engine_bind_weight or compile the plan with --weights",
            RT_NAME(p->weights[first].name),
            engine->weights[first].state == WEIGHT_PARTIAL ? " (in part)" : "", missing, p->weight_count);
    }
    rt_device *d = engine->device;
    for (uint32_t i = 0; i < p->weight_count; i++)
        engine->weight_addresses[i] = engine->weights[i].address;
    /* Then the device hears of each changed weight, and gets the scaled
     * GEMMs that read it ready (executor.h), before the step (and any
     * capture) that uses them. */
    for (uint32_t i = 0; i < p->weight_count; i++) {
        engine_weight *ew = &engine->weights[i];
        if (!ew->dirty) continue;
        rt_error e = {0};
        smelt_status s = SMELT_OK;
        if (d->ops->weight_bound)
            s = d->ops->weight_bound(d, i, ew->address, p->weights[i].bytes, (smelt_dtype)p->weights[i].dtype,
                                     ew->gemm_operand, &e);
        if (s == SMELT_OK && ew->gemm_operand) s = rt_executor_prepare_gemms(&engine->executor, i, &e);
        if (s != SMELT_OK) return rt_last_error_publish(&e);
        ew->dirty = false;
    }
    return SMELT_OK;
}
