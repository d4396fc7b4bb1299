/* engine.c - an engine's life (smelt.h): create it on a device (auto, host
 * or cuda) for an opened plan (plan_open.c), run steps through the executor
 * (executor.h), generate with the sampler (sampler.h), keep statistics,
 * destroy it. Its weights are in weights.c.
 */
#include "device.h"
#include "engine_internal.h"
#include "error.h"
#include "executor.h"
#include "program.h"
#include "sampler.h"
#include "smelt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>

/* ---- Engines ------------------------------------------------------------------- */

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

/* The pinned content hash, checked before any of the plan's code is loaded. */
static smelt_status check_expected_hash(const smelt_plan *plan, const char *expected) {
    if (!expected || !*expected) return SMELT_OK;
    char actual[33];
    plan_content_hash_hex(&plan->file, actual);
    if (strlen(expected) == 32 && strncasecmp(expected, actual, 32) == 0) return SMELT_OK;
    return rt_last_error_set(
        SMELT_ERROR_BAD_PLAN,
        "the plan's content hash %s is not the expected %.*s%s: refusing to load its code", actual,
        RT_NAME(expected));
}

smelt_status smelt_engine_create(smelt_plan *plan, const smelt_engine_options *options, smelt_engine **out) {
    if (!out) return rt_last_error_set(SMELT_ERROR_INVALID_ARGUMENT, "smelt_engine_create: out is NULL");
    *out = NULL;
    if (!plan) return rt_last_error_set(SMELT_ERROR_INVALID_ARGUMENT, "smelt_engine_create: plan is NULL");
    smelt_engine_options defaults = smelt_engine_options_default();
    const smelt_engine_options *o = options ? options : &defaults;
    smelt_status hash = check_expected_hash(plan, o->expected_content_hash);
    if (hash != SMELT_OK) return hash;
    smelt_engine *engine = calloc(1, sizeof *engine);
    if (!engine) return rt_last_error_set(SMELT_ERROR_OUT_OF_MEMORY, "out of memory for an engine");
    rt_plan_retain(plan);
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
    if (s == SMELT_OK) s = rt_weights_bind_plan(engine, &e);
    if (s == SMELT_OK)
        s = rt_executor_init(&engine->executor, p, engine->device, engine->weight_addresses, o->cuda_graphs,
                             &e);
    if (s == SMELT_OK && o->gemv_max_tokens > 0) rt_executor_choose(&engine->executor, o->gemv_max_tokens);
    if (s != SMELT_OK) {
        smelt_engine_destroy(engine);
        return rt_last_error_publish(&e);
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
    rt_plan_release(engine->plan);
    free(engine);
}

const char *smelt_engine_device_name(const smelt_engine *engine) {
    if (!engine) return "";
    return engine->device->ops->name(engine->device);
}

/* ---- Steps ------------------------------------------------------------------------ */

/* Runs one step and keeps its statistics and the position. Without
 * greedy_token, logits receives the rows asked for and the engine keeps the
 * last row (unless none is asked for). With it (rows must be the last),
 * *greedy_token is the argmax of the last row: picked on the device when the
 * plan has a greedy kernel (then only that id is copied and the logits stay
 * there), else on the host from the copied row. */
static smelt_status run_step(smelt_engine *engine, const int32_t *ids, const int32_t *pos, uint32_t n,
                             prog_rows rows, float *logits, int32_t *greedy_token) {
    smelt_status s = rt_weights_prepare(engine);
    if (s != SMELT_OK) return s;
    rt_error e = {0};
    bool on_device = greedy_token && engine->program->has_greedy;
    double start = now_seconds();
    s = rt_executor_step(&engine->executor, ids, pos, n, rows, logits, on_device ? greedy_token : NULL, &e);
    double seconds = now_seconds() - start;
    if (s != SMELT_OK) {
        engine->last_logits_valid = engine->last_greedy_valid = false;
        return rt_last_error_publish(&e);
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
    int64_t largest = 0;
    for (uint32_t t = 0; t < n; t++)
        if (pos[t] > largest) largest = pos[t];
    engine->position = largest + 1;
    if (on_device) {
        engine->last_greedy = *greedy_token;
        engine->last_greedy_valid = true;
        engine->last_logits_valid = false;
        return SMELT_OK;
    }
    if (rows == PROG_ROWS_NONE) {
        engine->last_logits_valid = engine->last_greedy_valid = false;
        return SMELT_OK;
    }
    uint64_t vocab = engine->program->vocab, last = rows == PROG_ROWS_ALL ? n - 1 : 0;
    if (logits != engine->last_logits)
        memcpy(engine->last_logits, logits + last * vocab, vocab * sizeof(float));
    engine->last_logits_valid = true;
    engine->last_greedy_valid = false;
    if (greedy_token && rt_sampler_argmax(engine->last_logits, vocab, greedy_token, &e) != SMELT_OK)
        return rt_last_error_publish(&e);
    return SMELT_OK;
}

smelt_status smelt_engine_forward(smelt_engine *engine, const int32_t *ids, const int32_t *pos, uint32_t n,
                                  smelt_logits rows, float *logits, size_t capacity) {
    if (!engine || !ids || !pos || (!logits && rows != SMELT_LOGITS_NONE))
        return rt_last_error_set(SMELT_ERROR_INVALID_ARGUMENT, "smelt_engine_forward: a NULL argument");
    if (rows != SMELT_LOGITS_ALL && rows != SMELT_LOGITS_LAST && rows != SMELT_LOGITS_NONE)
        return rt_last_error_set(SMELT_ERROR_INVALID_ARGUMENT,
                                 "smelt_engine_forward: rows %d is not a smelt_logits", (int)rows);
    const program *p = engine->program;
    if (n < 1 || n > (uint64_t)p->max_tokens)
        return rt_last_error_set(SMELT_ERROR_INVALID_ARGUMENT, "a step of %u tokens is outside [1, %lld]", n,
                                 (long long)p->max_tokens);
    uint32_t returned = rows == SMELT_LOGITS_ALL ? n : rows == SMELT_LOGITS_LAST ? 1 : 0;
    if (capacity / p->vocab < returned)
        return rt_last_error_set(SMELT_ERROR_CAPACITY,
                                 "logits of %u tokens need %llu floats but the buffer holds %zu", returned,
                                 (unsigned long long)(returned * p->vocab), capacity);
    prog_rows wanted = rows == SMELT_LOGITS_ALL    ? PROG_ROWS_ALL
                       : rows == SMELT_LOGITS_LAST ? PROG_ROWS_LAST
                                                   : PROG_ROWS_NONE;
    return run_step(engine, ids, pos, n, wanted, logits, NULL);
}

smelt_status smelt_engine_forward_greedy(smelt_engine *engine, const int32_t *ids, const int32_t *pos,
                                         uint32_t n, int32_t *token) {
    if (!engine || !ids || !pos || !token)
        return rt_last_error_set(SMELT_ERROR_INVALID_ARGUMENT,
                                 "smelt_engine_forward_greedy: a NULL argument");
    const program *p = engine->program;
    if (n < 1 || n > (uint64_t)p->max_tokens)
        return rt_last_error_set(SMELT_ERROR_INVALID_ARGUMENT, "a step of %u tokens is outside [1, %lld]", n,
                                 (long long)p->max_tokens);
    return run_step(engine, ids, pos, n, PROG_ROWS_LAST, engine->last_logits, token);
}

smelt_status smelt_engine_reset(smelt_engine *engine) {
    if (!engine) return rt_last_error_set(SMELT_ERROR_INVALID_ARGUMENT, "smelt_engine_reset: engine is NULL");
    rt_error e = {0};
    if (rt_executor_reset(&engine->executor, &e) != SMELT_OK) return rt_last_error_publish(&e);
    engine->position = 0;
    engine->last_logits_valid = engine->last_greedy_valid = false;
    return SMELT_OK;
}

smelt_status smelt_engine_stats(const smelt_engine *engine, smelt_stats *out) {
    if (!engine || !out)
        return rt_last_error_set(SMELT_ERROR_INVALID_ARGUMENT, "smelt_engine_stats: engine or out is NULL");
    *out = engine->stats;
    out->prefill_tokens_per_second =
        out->prefill_seconds > 0 ? (double)out->prefill_tokens / out->prefill_seconds : 0;
    out->decode_tokens_per_second =
        out->decode_seconds > 0 ? (double)out->decode_tokens / out->decode_seconds : 0;
    return SMELT_OK;
}

/* ---- Generation --------------------------------------------------------------------- */

/* Feeds tokens at the engine's position in steps of at most max_tokens;
 * afterwards last_logits holds the logits of the last one, or, with
 * greedy_token, *greedy_token their argmax (run_step). */
static smelt_status feed(smelt_engine *engine, const int32_t *tokens, size_t count, int32_t *greedy_token) {
    const program *p = engine->program;
    int32_t positions[256];
    size_t done = 0;
    while (done < count) {
        size_t chunk = count - done;
        if (chunk > (size_t)p->max_tokens) chunk = (size_t)p->max_tokens;
        if (chunk > sizeof positions / sizeof positions[0]) chunk = sizeof positions / sizeof positions[0];
        for (size_t t = 0; t < chunk; t++)
            positions[t] = (int32_t)(engine->position + (int64_t)t);
        /* Only the last token's logits are wanted: the chunks before it run no head. */
        bool last_chunk = done + chunk == count;
        smelt_status s = run_step(engine, tokens + done, positions, (uint32_t)chunk,
                                  last_chunk ? PROG_ROWS_LAST : PROG_ROWS_NONE, engine->last_logits,
                                  last_chunk ? greedy_token : NULL);
        if (s != SMELT_OK) return s;
        done += chunk;
    }
    return SMELT_OK;
}

const char *smelt_finish_reason_name(smelt_finish_reason reason) {
    switch (reason) {
    case SMELT_FINISH_LENGTH: return "max-tokens";
    case SMELT_FINISH_STOP_TOKEN: return "stop-token";
    case SMELT_FINISH_CALLBACK: return "callback";
    case SMELT_FINISH_CONTEXT_FULL: return "length";
    case SMELT_FINISH_EOS: return "eos";
    }
    return "unknown";
}

static bool is_eos(const program *p, int32_t token) {
    for (uint32_t i = 0; i < p->eos_count; i++)
        if (p->eos[i] == token) return true;
    return false;
}

static bool is_stop_token(const smelt_request *r, int32_t token) {
    for (size_t i = 0; i < r->stop_token_count; i++)
        if (r->stop_tokens[i] == token) return true;
    return false;
}

static smelt_status check_request(const smelt_engine *engine, const smelt_request *r) {
    const program *p = engine->program;
    if (r->prompt_length && !r->prompt)
        return rt_last_error_set(SMELT_ERROR_INVALID_ARGUMENT, "the request's prompt is NULL");
    if (r->stop_token_count && !r->stop_tokens)
        return rt_last_error_set(SMELT_ERROR_INVALID_ARGUMENT, "the request's stop_tokens is NULL");
    if (r->output_capacity && !r->output)
        return rt_last_error_set(SMELT_ERROR_INVALID_ARGUMENT, "the request's output is NULL");
    bool greedy = !(r->temperature > 0.0f);
    if (r->prompt_length == 0 && !engine->last_logits_valid && !(greedy && engine->last_greedy_valid))
        return rt_last_error_set(
            SMELT_ERROR_INVALID_ARGUMENT,
            "an empty prompt needs a sequence to continue, but the engine has no logits to continue from");
    if (p->max_positions && (uint64_t)r->prompt_length > (uint64_t)(p->max_positions - engine->position))
        return rt_last_error_set(
            SMELT_ERROR_INVALID_ARGUMENT,
            "a prompt of %zu tokens at position %lld does not fit the plan's %lld positions",
            r->prompt_length, (long long)engine->position, (long long)p->max_positions);
    if (r->output && r->output_capacity < r->max_tokens)
        return rt_last_error_set(SMELT_ERROR_CAPACITY,
                                 "the output holds %zu tokens but up to %u may be generated",
                                 r->output_capacity, r->max_tokens);
    return SMELT_OK;
}

smelt_status smelt_engine_generate(smelt_engine *engine, const smelt_request *request,
                                   smelt_generation *result) {
    if (!engine || !request)
        return rt_last_error_set(SMELT_ERROR_INVALID_ARGUMENT, "smelt_engine_generate: a NULL argument");
    smelt_generation local;
    smelt_generation *g = result ? result : &local;
    memset(g, 0, sizeof *g);
    g->stop_token = -1;
    /* At temperature 0 the device picks each token (run_step): only its id
     * crosses to the host, never the logits. */
    bool greedy = !(request->temperature > 0.0f);
    int32_t next = engine->last_greedy;
    smelt_status s = check_request(engine, request);
    if (s == SMELT_OK && request->prompt_length > 0)
        s = feed(engine, request->prompt, request->prompt_length, greedy ? &next : NULL);
    if (s != SMELT_OK) return s;
    rt_sampler_seed(&engine->sampler, request->seed);
    rt_sampler_settings settings = {request->temperature, request->top_k, request->top_p};
    const program *p = engine->program;
    while (g->token_count < request->max_tokens) {
        int32_t token = next;
        rt_error e = {0};
        bool picked =
            greedy && (request->prompt_length > 0 || g->token_count > 0 || engine->last_greedy_valid);
        if (!picked &&
            rt_sampler_pick(&engine->sampler, engine->last_logits, &settings, &token, &e) != SMELT_OK)
            return rt_last_error_publish(&e);
        if (is_stop_token(request, token) || (!request->ignore_eos && is_eos(p, token))) {
            g->reason = is_stop_token(request, token) ? SMELT_FINISH_STOP_TOKEN : SMELT_FINISH_EOS;
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
        if ((s = feed(engine, &token, 1, greedy ? &next : NULL)) != SMELT_OK) return s;
    }
    g->reason = SMELT_FINISH_LENGTH;
    return SMELT_OK;
}
