/* engine_internal.h - what the files behind smelt.h share: the plan object
 * (plan_open.c), the engine (engine.c) and its weights (weights.c). Not part
 * of the public API. */
#ifndef SMELT_RT_ENGINE_INTERNAL_H
#define SMELT_RT_ENGINE_INTERNAL_H

#include <stdbool.h>
#include <stdint.h>

#include "device.h"
#include "error.h"
#include "executor.h"
#include "plan_read.h"
#include "program.h"
#include "sampler.h"
#include "smelt.h"

/* ---- Plans (plan_open.c) ------------------------------------------------- */

/* An opened plan: the mapped, checked file and what was decoded from it. */
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

/* Takes a reference (an engine holds one while it lives). */
static inline void rt_plan_retain(smelt_plan *plan) {
    __atomic_add_fetch(&plan->references, 1, __ATOMIC_ACQ_REL);
}

/* Drops a reference; the last one unmaps the plan. NULL is ignored. */
void rt_plan_release(smelt_plan *plan);

/* ---- Engines (engine.c) and their weights (weights.c) -------------------- */

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
    int32_t last_greedy;    /* the argmax of those logits, when a step picked it on the device */
    bool last_greedy_valid; /* (then last_logits is not valid: they never left the device) */
    int64_t position;       /* tokens in the current sequence */
    smelt_stats stats;
};

/* Puts the plan's own weights on the device: in place where the device can
 * use host memory, else copied. */
smelt_status rt_weights_bind_plan(smelt_engine *engine, rt_error *e);

/* Before a step: every weight bound, the device told about changes. Sets
 * the thread's last error on failure. */
smelt_status rt_weights_prepare(smelt_engine *engine);

#endif
