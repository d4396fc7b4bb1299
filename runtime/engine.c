/* engine.c - the public API of smelt.h: plans, engines, weight binding,
 * steps, generation and statistics, over a device (device.h), the executor
 * (executor.h) and the sampler (sampler.h).
 *
 * A plan is opened once: the file is mapped and checked (plan_read.c), the
 * launch program decoded and validated against the rest of the plan
 * (program.c), the kernel table decoded as views into the mapping. Engines
 * hold a reference to their plan, whose mapped weights the host device uses
 * in place.
 */
#include "device.h"
#include "executor.h"
#include "plan_read.h"
#include "program.h"
#include "sampler.h"
#include "smelt.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

/* ---- Errors ------------------------------------------------------------------- */

static _Thread_local char last_error[RT_ERROR_MESSAGE_SIZE];

smelt_status rt_fail(rt_error *e, smelt_status status, const char *fmt, ...) {
    if (!e) return status;
    e->status = status;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(e->message, sizeof e->message, fmt, ap);
    va_end(ap);
    return status;
}

__attribute__((format(printf, 2, 3))) static smelt_status fail(smelt_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

/* Publishes an internal error as the thread's last error. */
static smelt_status fail_with(const rt_error *e) {
    snprintf(last_error, sizeof last_error, "%s", e->message);
    return e->status;
}

const char *smelt_last_error(void) { return last_error; }

const char *smelt_status_name(smelt_status status) {
    switch (status) {
    case SMELT_OK: return "SMELT_OK";
    case SMELT_ERROR_INVALID_ARGUMENT: return "SMELT_ERROR_INVALID_ARGUMENT";
    case SMELT_ERROR_IO: return "SMELT_ERROR_IO";
    case SMELT_ERROR_BAD_PLAN: return "SMELT_ERROR_BAD_PLAN";
    case SMELT_ERROR_NO_DEVICE: return "SMELT_ERROR_NO_DEVICE";
    case SMELT_ERROR_UNSUPPORTED: return "SMELT_ERROR_UNSUPPORTED";
    case SMELT_ERROR_OUT_OF_MEMORY: return "SMELT_ERROR_OUT_OF_MEMORY";
    case SMELT_ERROR_DEVICE: return "SMELT_ERROR_DEVICE";
    case SMELT_ERROR_MISSING_WEIGHT: return "SMELT_ERROR_MISSING_WEIGHT";
    case SMELT_ERROR_CAPACITY: return "SMELT_ERROR_CAPACITY";
    }
    return "SMELT_UNKNOWN_STATUS";
}

/* ---- Plans --------------------------------------------------------------------- */

struct smelt_plan {
    int references; /* the caller's + one per engine; atomic */
    plan_file file;
    program program;
    plan_kernel_table kernels; /* views into file */
    const uint8_t *host_object;
    uint64_t host_object_size;
    const uint8_t *weight_data; /* the WEIGHT_DATA section, or NULL */
    uint64_t weight_data_size;
    bool has_cuda_kernels;
};

static void plan_release(smelt_plan *plan) {
    if (!plan || __atomic_sub_fetch(&plan->references, 1, __ATOMIC_ACQ_REL) != 0) return;
    program_free(&plan->program);
    if (plan->kernels.kernels) plan_kernel_table_free(&plan->kernels);
    plan_close(&plan->file);
    free(plan);
}

/* Decodes what the runtime needs from a checked plan file. */
static smelt_status plan_load(smelt_plan *plan, const char *name) {
    char error[RT_ERROR_MESSAGE_SIZE];
    const uint8_t *data;
    uint64_t size;
    if (!plan_section(&plan->file, PLAN_SECTION_PROGRAM, &data, &size))
        return fail(SMELT_ERROR_BAD_PLAN,
                    "%s: the plan has no PROGRAM section: it cannot be run; rebuild it with "
                    "`smelt compile`",
                    name);
    if (!program_decode(data, size, &plan->program, error, sizeof error))
        return fail(SMELT_ERROR_BAD_PLAN, "%s: %s", name, error);
    if (plan_section(&plan->file, PLAN_SECTION_KERNELS, &data, &size) &&
        !plan_kernel_table_decode(data, size, &plan->kernels, error, sizeof error))
        return fail(SMELT_ERROR_BAD_PLAN, "%s: %s", name, error);
    if (plan_section(&plan->file, PLAN_SECTION_HOST_KERNELS, &data, &size) && size > 0) {
        plan->host_object = data;
        plan->host_object_size = size;
    }
    if (plan_section(&plan->file, PLAN_SECTION_WEIGHT_DATA, &data, &size)) {
        plan->weight_data = data;
        plan->weight_data_size = size;
    }
    if (!program_check_plan(&plan->program, plan->kernels.count, plan->weight_data_size, error, sizeof error))
        return fail(SMELT_ERROR_BAD_PLAN, "%s: %s", name, error);
    for (uint32_t i = 0; i < plan->kernels.count; i++)
        if (plan->kernels.kernels[i].binary_count > 0) plan->has_cuda_kernels = true;
    return SMELT_OK;
}

static smelt_status plan_finish_open(smelt_plan *plan, const char *name, smelt_plan **out) {
    smelt_status s = plan_load(plan, name);
    if (s != SMELT_OK) {
        plan_release(plan);
        return s;
    }
    *out = plan;
    return SMELT_OK;
}

smelt_status smelt_plan_open(const char *path, smelt_plan **out) {
    if (!out) return fail(SMELT_ERROR_INVALID_ARGUMENT, "smelt_plan_open: out is NULL");
    *out = NULL;
    if (!path) return fail(SMELT_ERROR_INVALID_ARGUMENT, "smelt_plan_open: path is NULL");
    smelt_plan *plan = calloc(1, sizeof *plan);
    if (!plan) return fail(SMELT_ERROR_OUT_OF_MEMORY, "out of memory opening %s", path);
    plan->references = 1;
    char error[RT_ERROR_MESSAGE_SIZE];
    if (!plan_open(path, &plan->file, error, sizeof error)) {
        free(plan);
        FILE *probe = fopen(path, "rb"); /* tell a missing file from a bad one */
        if (!probe) return fail(SMELT_ERROR_IO, "%s", error);
        fclose(probe);
        return fail(SMELT_ERROR_BAD_PLAN, "%s", error);
    }
    return plan_finish_open(plan, path, out);
}

smelt_status smelt_plan_open_memory(const void *bytes, size_t size, smelt_plan **out) {
    if (!out) return fail(SMELT_ERROR_INVALID_ARGUMENT, "smelt_plan_open_memory: out is NULL");
    *out = NULL;
    if (!bytes && size) return fail(SMELT_ERROR_INVALID_ARGUMENT, "smelt_plan_open_memory: bytes is NULL");
    smelt_plan *plan = calloc(1, sizeof *plan);
    if (!plan) return fail(SMELT_ERROR_OUT_OF_MEMORY, "out of memory opening a plan");
    plan->references = 1;
    char error[RT_ERROR_MESSAGE_SIZE];
    if (!plan_open_bytes(bytes, size, "plan", &plan->file, error, sizeof error)) {
        free(plan);
        return fail(SMELT_ERROR_BAD_PLAN, "%s", error);
    }
    return plan_finish_open(plan, "plan", out);
}

void smelt_plan_close(smelt_plan *plan) { plan_release(plan); }

smelt_status smelt_plan_get_info(const smelt_plan *plan, smelt_plan_info *out) {
    if (!plan || !out) return fail(SMELT_ERROR_INVALID_ARGUMENT, "smelt_plan_get_info: plan or out is NULL");
    const program *p = &plan->program;
    memset(out, 0, sizeof *out);
    out->vocab = p->vocab;
    out->max_tokens = p->max_tokens;
    out->max_positions = p->max_positions;
    out->kernel_count = plan->kernels.count;
    out->weight_count = p->weight_count;
    for (uint32_t i = 0; i < p->weight_count; i++)
        if (p->weights[i].data_offset == UINT64_MAX) out->unbound_weight_count++;
    out->has_host_kernels = plan->host_object != NULL;
    out->has_cuda_kernels = plan->has_cuda_kernels;
    plan_content_hash_hex(&plan->file, out->content_hash);
    return SMELT_OK;
}

/* ---- Engines ------------------------------------------------------------------- */

typedef enum weight_state {
    WEIGHT_UNBOUND = 0,
    WEIGHT_PARTIAL, /* a stacked weight with some parts bound */
    WEIGHT_COMPLETE,
} weight_state;

typedef struct engine_weight {
    void *address;        /* device address, NULL while unbound */
    bool owned;           /* allocated by the engine (else mapped from the plan) */
    bool dirty;           /* the device has not been told (weight_bound) */
    bool gemm_operand;    /* a GEMM reads it as B */
    uint8_t state;        /* weight_state */
    uint8_t *parts_bound; /* stacked: one flag per part, while PARTIAL */
} engine_weight;

struct smelt_engine {
    smelt_plan *plan;
    const program *program;
    rt_device *device;
    rt_executor executor;
    engine_weight *weights;  /* [weight_count] */
    void **weight_addresses; /* [weight_count], what the executor reads */
    rt_sampler sampler;
    float *last_logits; /* [vocab]: the last token fed */
    bool last_logits_valid;
    int64_t position; /* tokens in the current sequence */
    smelt_stats stats;
};

static double now_seconds(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

/* Creates the device of `kind` and loads the plan's kernels on it. */
static smelt_status open_device(smelt_plan *plan, const char *kind, const smelt_engine_options *o,
                                rt_device **out, rt_error *e) {
    smelt_status s = strcmp(kind, "cuda") == 0 ? rt_device_cuda_create(o->cuda_device, out, e)
                                               : rt_device_host_create(o->host_threads, out, e);
    if (s != SMELT_OK) return s;
    rt_kernel_set set = {plan->kernels.kernels, plan->kernels.count, plan->host_object,
                         plan->host_object_size, false};
    for (uint32_t i = 0; i < plan->program.instr_count; i++)
        if (plan->program.instrs[i].op == PROG_OP_GEMM) set.gemms = true;
    s = (*out)->ops->load_kernels(*out, &set, e);
    if (s != SMELT_OK) {
        rt_device_destroy(*out);
        *out = NULL;
    }
    return s;
}

/* "auto": cuda when the plan has GPU code and a GPU is here, else host. */
static smelt_status choose_device(smelt_plan *plan, const smelt_engine_options *o, rt_device **out,
                                  rt_error *e) {
    const char *kind = o->device && *o->device ? o->device : "auto";
    if (strcmp(kind, "host") == 0 || strcmp(kind, "cuda") == 0) return open_device(plan, kind, o, out, e);
    if (strcmp(kind, "auto") != 0)
        return rt_fail(e, SMELT_ERROR_INVALID_ARGUMENT,
                       "unknown device '%.*s%s' (expected auto, host or cuda)", RT_NAME(kind));
    bool gpu_possible = plan->has_cuda_kernels || plan->kernels.count == 0;
    if (gpu_possible) {
        smelt_status s = open_device(plan, "cuda", o, out, e);
        bool host_possible = plan->host_object != NULL || plan->kernels.count == 0;
        if (s == SMELT_OK || !host_possible || (s != SMELT_ERROR_NO_DEVICE && s != SMELT_ERROR_UNSUPPORTED))
            return s;
    }
    return open_device(plan, "host", o, out, e);
}

static bool weight_complete(const smelt_engine *engine) {
    for (uint32_t i = 0; i < engine->program->weight_count; i++)
        if (engine->weights[i].state != WEIGHT_COMPLETE) return false;
    return true;
}

/* Puts the plan's own weights on the device: in place where the device can
 * use host memory, else copied. */
static smelt_status bind_plan_weights(smelt_engine *engine, rt_error *e) {
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

smelt_status smelt_engine_create(smelt_plan *plan, const smelt_engine_options *options, smelt_engine **out) {
    if (!out) return fail(SMELT_ERROR_INVALID_ARGUMENT, "smelt_engine_create: out is NULL");
    *out = NULL;
    if (!plan) return fail(SMELT_ERROR_INVALID_ARGUMENT, "smelt_engine_create: plan is NULL");
    smelt_engine_options defaults = smelt_engine_options_default();
    const smelt_engine_options *o = options ? options : &defaults;
    smelt_engine *engine = calloc(1, sizeof *engine);
    if (!engine) return fail(SMELT_ERROR_OUT_OF_MEMORY, "out of memory for an engine");
    __atomic_add_fetch(&plan->references, 1, __ATOMIC_ACQ_REL);
    engine->plan = plan;
    engine->program = &plan->program;
    const program *p = engine->program;
    rt_error e = {0};
    smelt_status s = choose_device(plan, o, &engine->device, &e);
    if (s == SMELT_OK) {
        engine->weights = calloc(p->weight_count ? p->weight_count : 1, sizeof *engine->weights);
        engine->weight_addresses =
            calloc(p->weight_count ? p->weight_count : 1, sizeof *engine->weight_addresses);
        engine->last_logits = malloc(p->vocab * sizeof *engine->last_logits);
        if (!engine->weights || !engine->weight_addresses || !engine->last_logits)
            s = rt_fail(&e, SMELT_ERROR_OUT_OF_MEMORY, "out of memory for an engine");
    }
    if (s == SMELT_OK) {
        for (uint32_t i = 0; i < p->instr_count; i++)
            if (p->instrs[i].op == PROG_OP_GEMM && p->instrs[i].as.gemm.b.buffer == PROG_BUFFER_WEIGHT)
                engine->weights[p->instrs[i].as.gemm.b.index].gemm_operand = true;
        s = rt_sampler_init(&engine->sampler, p->vocab, &e);
    }
    if (s == SMELT_OK) s = bind_plan_weights(engine, &e);
    if (s == SMELT_OK)
        s = rt_executor_init(&engine->executor, p, engine->device, engine->weight_addresses, o->cuda_graphs,
                             &e);
    if (s != SMELT_OK) {
        smelt_engine_destroy(engine);
        return fail_with(&e);
    }
    *out = engine;
    return SMELT_OK;
}

void smelt_engine_destroy(smelt_engine *engine) {
    if (!engine) return;
    rt_executor_free(&engine->executor);
    for (uint32_t i = 0; engine->weights && i < engine->program->weight_count; i++) {
        if (engine->weights[i].owned) engine->device->ops->free(engine->device, engine->weights[i].address);
        free(engine->weights[i].parts_bound);
    }
    rt_sampler_free(&engine->sampler);
    rt_device_destroy(engine->device);
    free(engine->weights);
    free(engine->weight_addresses);
    free(engine->last_logits);
    plan_release(engine->plan);
    free(engine);
}

const char *smelt_engine_device_name(const smelt_engine *engine) {
    if (!engine) return "";
    return engine->device->ops->name(engine->device);
}

/* ---- Weight binding -------------------------------------------------------------- */

/* Part e of stacked weight w when `name` is w's template with a decimal in
 * place of "{e}"; -1 otherwise. */
static int64_t stacked_part(const prog_weight *w, const char *name) {
    const char *hole = strstr(w->name, "{e}");
    if (!w->stacked || !hole) return -1;
    size_t prefix = (size_t)(hole - w->name), suffix = strlen(hole + 3), length = strlen(name);
    if (length <= prefix + suffix || strncmp(name, w->name, prefix) != 0 ||
        strcmp(name + length - suffix, hole + 3) != 0)
        return -1;
    const char *digits = name + prefix;
    size_t count = length - prefix - suffix;
    if (count > 9 || (digits[0] == '0' && count > 1)) return -1;
    int64_t value = 0;
    for (size_t i = 0; i < count; i++) {
        if (digits[i] < '0' || digits[i] > '9') return -1;
        value = value * 10 + (digits[i] - '0');
    }
    return value < w->shape[0] ? value : -1;
}

bool smelt_plan_has_weight(const smelt_plan *plan, const char *name) {
    if (!plan || !name) return false;
    const program *p = &plan->program;
    for (uint32_t i = 0; i < p->weight_count; i++)
        if (strcmp(p->weights[i].name, name) == 0 || stacked_part(&p->weights[i], name) >= 0) return true;
    return false;
}

/* data (count elements of `from`) converted to the storage dtype, into dst. */
static void convert(void *dst, smelt_dtype to, const void *src, smelt_dtype from, uint64_t count) {
    for (uint64_t i = 0; i < count; i++) {
        float v;
        switch (from) {
        case SMELT_DTYPE_F32: memcpy(&v, (const uint8_t *)src + 4 * i, 4); break;
        case SMELT_DTYPE_BF16: v = rt_bf16_to_f32(((const uint16_t *)src)[i]); break;
        default: v = rt_f16_to_f32(((const uint16_t *)src)[i]); break;
        }
        if (to == SMELT_DTYPE_F32)
            memcpy((uint8_t *)dst + 4 * i, &v, 4);
        else
            ((uint16_t *)dst)[i] = rt_f32_to_bf16(v);
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
        return fail(SMELT_ERROR_INVALID_ARGUMENT, "smelt_engine_bind_weight: a NULL argument");
    if (!valid_dtype(dtype))
        return fail(SMELT_ERROR_INVALID_ARGUMENT, "smelt_engine_bind_weight: unknown dtype %d", dtype);
    const program *p = engine->program;
    uint32_t index = UINT32_MAX;
    int64_t part = -1;
    for (uint32_t i = 0; i < p->weight_count && index == UINT32_MAX; i++) {
        if (strcmp(p->weights[i].name, name) == 0)
            index = i;
        else if ((part = stacked_part(&p->weights[i], name)) >= 0)
            index = i;
    }
    if (index == UINT32_MAX)
        return fail(SMELT_ERROR_INVALID_ARGUMENT, "the plan has no weight '%.*s%s'", RT_NAME(name));
    const prog_weight *w = &p->weights[index];
    engine_weight *ew = &engine->weights[index];
    /* A part is the stacked tensor without its dim 0. */
    uint32_t skip = part >= 0 ? 1 : 0;
    bool same = rank + skip == w->rank;
    for (uint32_t k = 0; same && k < rank; k++)
        same = shape[k] == w->shape[k + skip];
    if (!same) {
        char expected[160] = "", got[160] = "";
        for (uint32_t k = skip; k < w->rank; k++)
            snprintf(expected + strlen(expected), sizeof expected - strlen(expected), "%s%lld",
                     k > skip ? ", " : "", (long long)w->shape[k]);
        for (uint32_t k = 0; k < rank && k < 8; k++)
            snprintf(got + strlen(got), sizeof got - strlen(got), "%s%lld", k ? ", " : "",
                     (long long)shape[k]);
        return fail(SMELT_ERROR_INVALID_ARGUMENT,
                    "weight '%.*s%s' has shape [%s] in the plan but [%s%s] was given", RT_NAME(name),
                    expected, got, rank > 8 ? ", ..." : "");
    }
    if (w->dtype == SMELT_DTYPE_I32)
        return fail(SMELT_ERROR_UNSUPPORTED,
                    "weight '%.*s%s' is stored as i32 and cannot be bound from floats", RT_NAME(name));
    uint64_t part_bytes = part >= 0 ? w->bytes / (uint64_t)w->shape[0] : w->bytes;
    uint64_t count = part_bytes / smelt_dtype_element_bytes(w->dtype);
    rt_error e = {0};
    smelt_status s = own_weight(engine, index, &e);
    if (s != SMELT_OK) return fail_with(&e);
    void *converted = part_bytes ? malloc(part_bytes) : NULL;
    if (part_bytes && !converted)
        return fail(SMELT_ERROR_OUT_OF_MEMORY, "out of memory converting '%.*s%s'", RT_NAME(name));
    convert(converted, (smelt_dtype)w->dtype, data, dtype, count);
    uint64_t offset = part >= 0 ? (uint64_t)part * part_bytes : 0;
    if (part_bytes)
        s = engine->device->ops->copy_in(engine->device, rt_address_at(ew->address, offset), converted,
                                         part_bytes, &e);
    free(converted);
    if (s != SMELT_OK) return fail_with(&e);
    ew->dirty = true;
    engine->last_logits_valid = false;
    if (part < 0 || ew->state == WEIGHT_COMPLETE) {
        ew->state = WEIGHT_COMPLETE;
        return SMELT_OK;
    }
    if (!ew->parts_bound && !(ew->parts_bound = calloc((size_t)w->shape[0], 1)))
        return fail(SMELT_ERROR_OUT_OF_MEMORY, "out of memory tracking the parts of '%.*s%s'", RT_NAME(name));
    ew->parts_bound[part] = 1;
    ew->state = WEIGHT_COMPLETE;
    for (int64_t i = 0; i < w->shape[0]; i++)
        if (!ew->parts_bound[i]) ew->state = WEIGHT_PARTIAL;
    if (ew->state == WEIGHT_COMPLETE) {
        free(ew->parts_bound);
        ew->parts_bound = NULL;
    }
    return SMELT_OK;
}

/* Before a step: every weight bound, the device told about changes. */
static smelt_status prepare_weights(smelt_engine *engine) {
    const program *p = engine->program;
    if (!weight_complete(engine)) {
        uint32_t missing = 0, first = 0;
        for (uint32_t i = 0; i < p->weight_count; i++)
            if (engine->weights[i].state != WEIGHT_COMPLETE && missing++ == 0) first = i;
        return fail(
            SMELT_ERROR_MISSING_WEIGHT,
            "weight '%.*s%s'%s is not bound (%u of %u weights are missing): the plan holds no data for it; "
            "bind it with smelt_engine_bind_weight or compile the plan with --weights",
            RT_NAME(p->weights[first].name),
            engine->weights[first].state == WEIGHT_PARTIAL ? " (in part)" : "", missing, p->weight_count);
    }
    rt_device *d = engine->device;
    for (uint32_t i = 0; i < p->weight_count; i++) {
        engine_weight *ew = &engine->weights[i];
        engine->weight_addresses[i] = ew->address;
        if (!ew->dirty) continue;
        if (d->ops->weight_bound) {
            rt_error e = {0};
            smelt_status s = d->ops->weight_bound(d, i, ew->address, p->weights[i].bytes,
                                                  (smelt_dtype)p->weights[i].dtype, ew->gemm_operand, &e);
            if (s != SMELT_OK) return fail_with(&e);
        }
        ew->dirty = false;
    }
    return SMELT_OK;
}

/* ---- Steps ------------------------------------------------------------------------ */

/* Runs one step and keeps its statistics, the position and the last row of
 * logits. logits receives rows [first_row, n). */
static smelt_status run_step(smelt_engine *engine, const int32_t *ids, const int32_t *pos, uint32_t n,
                             uint32_t first_row, float *logits) {
    smelt_status s = prepare_weights(engine);
    if (s != SMELT_OK) return s;
    rt_error e = {0};
    double start = now_seconds();
    s = rt_executor_step(&engine->executor, ids, pos, n, first_row, logits, &e);
    double seconds = now_seconds() - start;
    if (s != SMELT_OK) {
        engine->last_logits_valid = false;
        return fail_with(&e);
    }
    smelt_stats *st = &engine->stats;
    if (n == 1) {
        st->decode_tokens++;
        st->decode_seconds += seconds;
    } else {
        st->prefill_tokens += n;
        st->prefill_seconds += seconds;
    }
    st->steps++;
    st->launches_per_step = engine->executor.launches_last_step;
    st->graph_replays = engine->executor.graph_replays;
    int64_t last = 0;
    for (uint32_t t = 0; t < n; t++)
        if (pos[t] > last) last = pos[t];
    engine->position = last + 1;
    uint64_t vocab = engine->program->vocab;
    if (logits != engine->last_logits)
        memcpy(engine->last_logits, logits + (uint64_t)(n - 1 - first_row) * vocab, vocab * sizeof(float));
    engine->last_logits_valid = true;
    return SMELT_OK;
}

smelt_status smelt_engine_forward(smelt_engine *engine, const int32_t *ids, const int32_t *pos, uint32_t n,
                                  float *logits, size_t capacity) {
    if (!engine || !ids || !pos || !logits)
        return fail(SMELT_ERROR_INVALID_ARGUMENT, "smelt_engine_forward: a NULL argument");
    const program *p = engine->program;
    if (n < 1 || n > (uint64_t)p->max_tokens)
        return fail(SMELT_ERROR_INVALID_ARGUMENT, "a step of %u tokens is outside [1, %lld]", n,
                    (long long)p->max_tokens);
    if (capacity / p->vocab < n)
        return fail(SMELT_ERROR_CAPACITY, "logits of %u tokens need %llu floats but the buffer holds %zu", n,
                    (unsigned long long)(n * p->vocab), capacity);
    return run_step(engine, ids, pos, n, 0, logits);
}

smelt_status smelt_engine_reset(smelt_engine *engine) {
    if (!engine) return fail(SMELT_ERROR_INVALID_ARGUMENT, "smelt_engine_reset: engine is NULL");
    rt_error e = {0};
    if (rt_executor_reset(&engine->executor, &e) != SMELT_OK) return fail_with(&e);
    engine->position = 0;
    engine->last_logits_valid = false;
    return SMELT_OK;
}

smelt_status smelt_engine_stats(const smelt_engine *engine, smelt_stats *out) {
    if (!engine || !out)
        return fail(SMELT_ERROR_INVALID_ARGUMENT, "smelt_engine_stats: engine or out is NULL");
    *out = engine->stats;
    out->prefill_tokens_per_second =
        out->prefill_seconds > 0 ? (double)out->prefill_tokens / out->prefill_seconds : 0;
    out->decode_tokens_per_second =
        out->decode_seconds > 0 ? (double)out->decode_tokens / out->decode_seconds : 0;
    return SMELT_OK;
}

/* ---- Generation --------------------------------------------------------------------- */

/* Feeds tokens at the engine's position in steps of at most max_tokens;
 * afterwards last_logits holds the logits of the last one. */
static smelt_status feed(smelt_engine *engine, const int32_t *tokens, size_t count) {
    const program *p = engine->program;
    int32_t positions[256];
    size_t done = 0;
    while (done < count) {
        size_t chunk = count - done;
        if (chunk > (size_t)p->max_tokens) chunk = (size_t)p->max_tokens;
        if (chunk > sizeof positions / sizeof positions[0]) chunk = sizeof positions / sizeof positions[0];
        for (size_t t = 0; t < chunk; t++)
            positions[t] = (int32_t)(engine->position + (int64_t)t);
        smelt_status s = run_step(engine, tokens + done, positions, (uint32_t)chunk, (uint32_t)chunk - 1,
                                  engine->last_logits);
        if (s != SMELT_OK) return s;
        done += chunk;
    }
    return SMELT_OK;
}

static bool is_stop_token(const smelt_request *r, int32_t token) {
    for (size_t i = 0; i < r->stop_token_count; i++)
        if (r->stop_tokens[i] == token) return true;
    return false;
}

static smelt_status check_request(const smelt_engine *engine, const smelt_request *r) {
    const program *p = engine->program;
    if (r->prompt_length && !r->prompt)
        return fail(SMELT_ERROR_INVALID_ARGUMENT, "the request's prompt is NULL");
    if (r->stop_token_count && !r->stop_tokens)
        return fail(SMELT_ERROR_INVALID_ARGUMENT, "the request's stop_tokens is NULL");
    if (r->output_capacity && !r->output)
        return fail(SMELT_ERROR_INVALID_ARGUMENT, "the request's output is NULL");
    if (r->prompt_length == 0 && !engine->last_logits_valid)
        return fail(
            SMELT_ERROR_INVALID_ARGUMENT,
            "an empty prompt needs a sequence to continue, but the engine has no logits to continue from");
    if (p->max_positions && (uint64_t)r->prompt_length > (uint64_t)(p->max_positions - engine->position))
        return fail(SMELT_ERROR_INVALID_ARGUMENT,
                    "a prompt of %zu tokens at position %lld does not fit the plan's %lld positions",
                    r->prompt_length, (long long)engine->position, (long long)p->max_positions);
    if (r->output && r->output_capacity < r->max_tokens)
        return fail(SMELT_ERROR_CAPACITY, "the output holds %zu tokens but up to %u may be generated",
                    r->output_capacity, r->max_tokens);
    return SMELT_OK;
}

smelt_status smelt_engine_generate(smelt_engine *engine, const smelt_request *request,
                                   smelt_generation *result) {
    if (!engine || !request)
        return fail(SMELT_ERROR_INVALID_ARGUMENT, "smelt_engine_generate: a NULL argument");
    smelt_generation local;
    smelt_generation *g = result ? result : &local;
    memset(g, 0, sizeof *g);
    g->stop_token = -1;
    smelt_status s = check_request(engine, request);
    if (s == SMELT_OK) s = feed(engine, request->prompt, request->prompt_length);
    if (s != SMELT_OK) return s;
    rt_sampler_seed(&engine->sampler, request->seed);
    rt_sampler_settings settings = {request->temperature, request->top_k, request->top_p};
    const program *p = engine->program;
    while (g->token_count < request->max_tokens) {
        int32_t token;
        rt_error e = {0};
        if (rt_sampler_pick(&engine->sampler, engine->last_logits, &settings, &token, &e) != SMELT_OK)
            return fail_with(&e);
        if (is_stop_token(request, token)) {
            g->reason = SMELT_FINISH_STOP_TOKEN;
            g->stop_token = token;
            return SMELT_OK;
        }
        if (request->output) request->output[g->token_count] = token;
        g->token_count++;
        if (request->on_token && !request->on_token(token, request->user)) {
            g->reason = SMELT_FINISH_CALLBACK;
            return SMELT_OK;
        }
        if (g->token_count == request->max_tokens) break;
        if (p->max_positions && engine->position >= p->max_positions) {
            g->reason = SMELT_FINISH_CONTEXT_FULL;
            return SMELT_OK;
        }
        if ((s = feed(engine, &token, 1)) != SMELT_OK) return s;
    }
    g->reason = SMELT_FINISH_LENGTH;
    return SMELT_OK;
}
