/* checkpoint_bind.c - weights into an engine for a plan compiled without
 * them: a checkpoint's tensors by name, or noise for timing. A weight the
 * plan quantized is quantized here, into the plan's format, by the method
 * the plan names (drv_quantize_weight), and bound as packed bytes; a
 * quantized stack of MoE experts expert by expert (quant_stack_layout_of),
 * bound whole once every expert's tensor is read. */
#include "driver_internal.h"
#include "transpose.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* The plan's weight called `name` (not a stacked part), or NULL. */
static const prog_weight *plan_weight(const program *p, const char *name) {
    for (uint32_t i = 0; p && i < p->weight_count; i++)
        if (strcmp(p->weights[i].name, name) == 0) return &p->weights[i];
    return NULL;
}

/* values (w's [N, K] f32; the checkpoint's [K, N] when w is transposed)
 * quantized into w's format and bound as its packed bytes: the runtime
 * takes quantized weights already packed. */
static bool bind_quantized(smelt_engine *engine, const prog_weight *w, const float *values, diag_engine *d) {
    quant_format f = quant_format_from_program(&w->quant);
    quant_tensor q;
    uint64_t rows = (uint64_t)w->shape[0], columns = (uint64_t)w->shape[1];
    float *transposed = NULL; /* the tensor [K, N] of a transposed weight, as the plan's [N, K] */
    if (w->transposed) {
        transposed = malloc(rows * columns * sizeof *transposed + 1);
        if (!transposed) {
            diag_error(d, SMELT_NO_LOC, "out of memory transposing '%.*s%s'", DIAG_NAME(w->name));
            return false;
        }
        plan_transpose(transposed, values, columns, rows, sizeof *transposed);
        values = transposed;
    }
    bool quantized = drv_quantize_weight(w->name, values, rows, columns, &f, NULL, &q, d);
    free(transposed);
    if (!quantized) return false;
    smelt_status s = smelt_engine_bind_weight_bytes(engine, w->name, q.data, q.layout.total);
    free(q.data);
    if (s != SMELT_OK) diag_error(d, SMELT_NO_LOC, "%s", smelt_last_error());
    return s == SMELT_OK;
}

/* The checkpoint name of part e of stacked weight w: its template with e
 * in place of "{e}" (the runtime's rule, program_stacked_part). */
static void part_name(const prog_weight *w, int64_t e, char *out, size_t size) {
    const char *hole = strstr(w->name, "{e}");
    if (!hole) {
        snprintf(out, size, "%s", w->name);
        return;
    }
    snprintf(out, size, "%.*s%lld%s", (int)(hole - w->name), w->name, (long long)e, hole + 3);
}

/* Stacked quantized weight w [E, N, K] from its E parts in the checkpoint,
 * each quantized into its own matrix of the packed stack, then bound whole.
 * A missing part is left to the caller's report of missing weights. */
static bool bind_quantized_stack(smelt_engine *engine, const st_checkpoint *ck, const prog_weight *w,
                                 diag_engine *d) {
    smelt_loc loc = {ck->diag_file, 0, 0};
    quant_format f = quant_format_from_program(&w->quant);
    quant_layout layout;
    uint64_t stride, total, rows = (uint64_t)w->shape[1], cols = (uint64_t)w->shape[2];
    if (w->rank != 3 ||
        quant_stack_layout_of(&f, (uint64_t)w->shape[0], rows, cols, &layout, &stride, &total))
        return false; /* plan_open checked it */
    uint8_t *packed = calloc(total ? total : 1, 1);
    float *values = malloc(rows * cols * sizeof *values + 1);
    bool ok = packed && values, complete = true;
    if (!ok) diag_error(d, loc, "out of memory quantizing '%.*s%s'", DIAG_NAME(w->name));
    size_t name_size = strlen(w->name) + 24;
    char *name = malloc(name_size);
    ok = ok && name;
    for (int64_t e = 0; ok && complete && e < w->shape[0]; e++) {
        part_name(w, e, name, name_size);
        const st_tensor *t = st_checkpoint_find(ck, name);
        if (!t) {
            complete = false;
            break;
        }
        if (!st_dtype_is_float(t->dtype) || t->rank != 2 || t->shape[0] != rows || t->shape[1] != cols) {
            diag_error(d, loc, "tensor '%.*s%s' is not the float [%llu, %llu] expert the plan quantized",
                       DIAG_NAME(name), (unsigned long long)rows, (unsigned long long)cols);
            ok = false;
            break;
        }
        quant_tensor q;
        ok = st_tensor_read_f32(t, values, d) &&
             drv_quantize_weight(name, values, rows, cols, &f, NULL, &q, d);
        if (ok) memcpy(packed + (uint64_t)e * stride, q.data, q.layout.total);
        if (ok) free(q.data);
    }
    if (ok && complete) {
        smelt_status s = smelt_engine_bind_weight_bytes(engine, w->name, packed, total);
        if (s != SMELT_OK) diag_error(d, loc, "%s", smelt_last_error());
        ok = s == SMELT_OK;
    }
    free(name);
    free(values);
    free(packed);
    return ok;
}

/* Is `name` a part of a quantized stack of p (bound by bind_quantized_stack)? */
static bool in_quantized_stack(const program *p, const char *name) {
    for (uint32_t i = 0; p && i < p->weight_count; i++)
        if (p->weights[i].quant.kind != PROG_QUANT_NONE && program_stacked_part(&p->weights[i], name) >= 0)
            return true;
    return false;
}

static bool is_ignored(const char *name, const drv_ignored_tensors *ignored,
                       const drv_source_options *allowed) {
    for (uint32_t i = 0; i < ignored->count; i++)
        if (ir_tensor_pattern_matches(ignored->patterns[i], name)) return true;
    for (uint32_t i = 0; allowed && i < allowed->allowed_unused_tensor_count; i++)
        if (ir_tensor_pattern_matches(allowed->allowed_unused_tensors[i], name)) return true;
    return false;
}

bool drv_bind_checkpoint(const smelt_plan *plan, const program *p, smelt_engine *engine,
                         const char *weights_path, const drv_ignored_tensors *ignored,
                         const drv_source_options *allowed, diag_engine *d) {
    st_checkpoint ck;
    if (!st_checkpoint_open(weights_path, &ck, d)) return false;
    smelt_loc loc = {ck.diag_file, 0, 0}; /* every message names the checkpoint */
    bool ok = true;
    const char *first_unused = NULL;
    uint32_t unused = 0;
    for (uint32_t i = 0; i < ck.tensor_count && !diag_should_stop(d); i++) {
        const st_tensor *t = ck.tensors[i];
        /* A tensor the plan does not name is not used by the model: an
         * error, as at compile time, unless the model says it may be. */
        if (!smelt_plan_has_weight(plan, t->name)) {
            if (ignored && !is_ignored(t->name, ignored, allowed)) {
                if (!first_unused) first_unused = t->name;
                unused++;
            }
            continue;
        }
        if (in_quantized_stack(p, t->name)) continue; /* bound below, with its stack */
        if (!st_dtype_is_float(t->dtype)) {
            diag_error(
                d, loc,
                "tensor '%.*s%s' is %s, but the plan's weight of that name takes floating-point values; "
                "integer tensors are not converted",
                DIAG_NAME(t->name), st_dtype_name(t->dtype));
            ok = false;
            continue;
        }
        uint64_t count = t->byte_size / st_dtype_size(t->dtype);
        float *values = malloc(count * sizeof *values + 1);
        if (!values) {
            diag_error(d, loc, "out of memory converting '%.*s%s'", DIAG_NAME(t->name));
            ok = false;
            break;
        }
        if (!st_tensor_read_f32(t, values, d)) {
            free(values);
            ok = false;
            break;
        }
        int64_t shape[ST_MAX_RANK];
        for (uint32_t k = 0; k < t->rank; k++)
            shape[k] = (int64_t)t->shape[k];
        const prog_weight *w = plan_weight(p, t->name);
        /* a transposed weight's tensor is [K, N] for the plan's [N, K] */
        int64_t rows = w ? w->shape[w->transposed ? 1 : 0] : 0,
                columns = w ? w->shape[w->transposed ? 0 : 1] : 0;
        if (w && w->quant.kind != PROG_QUANT_NONE &&
            (t->rank != 2 || shape[0] != rows || shape[1] != columns)) {
            diag_error(d, loc, "tensor '%.*s%s' is not the [%lld, %lld] matrix the plan quantized",
                       DIAG_NAME(t->name), (long long)rows, (long long)columns);
            ok = false;
        } else if (w && w->quant.kind != PROG_QUANT_NONE) {
            ok = bind_quantized(engine, w, values, d) && ok;
        } else {
            smelt_status s =
                smelt_engine_bind_weight(engine, t->name, SMELT_DTYPE_F32, values, shape, t->rank);
            if (s != SMELT_OK) {
                diag_error(d, loc, "%s", smelt_last_error());
                ok = false;
            }
        }
        free(values);
    }
    if (unused) {
        char more[64] = "";
        if (unused > 1) snprintf(more, sizeof more, " (and %u more)", unused - 1);
        diag_error(d, loc, "tensor '%.*s%s'%s of the checkpoint is used by no weight of the plan",
                   DIAG_NAME(first_unused), more);
        diag_note(d, SMELT_NO_LOC,
                  "a model that leaves a tensor out does not compute what the checkpoint holds; pass "
                  "--allow-unused-tensor NAME if it is knowingly unused");
        ok = false;
    }
    for (uint32_t i = 0; ok && p && i < p->weight_count && !diag_should_stop(d); i++)
        if (p->weights[i].stacked && p->weights[i].quant.kind != PROG_QUANT_NONE &&
            p->weights[i].data_offset == UINT64_MAX)
            ok = bind_quantized_stack(engine, &ck, &p->weights[i], d) && ok;
    /* Weights the plan has no data for and the checkpoint does not hold:
     * named here, with the checkpoint, rather than at the first step. */
    const char *first_missing = NULL;
    char *missing_part = NULL; /* the name of a stacked weight's missing part */
    uint32_t missing = 0;
    for (uint32_t i = 0; p && i < p->weight_count; i++) {
        const prog_weight *w = &p->weights[i];
        if (w->data_offset != UINT64_MAX) continue;
        /* A concatenated weight (passes/fuse.c) is bound by its parts' names,
         * a stacked one by its parts' (the template with each e). */
        if (w->stacked && w->rank >= 1) {
            size_t size = strlen(w->name) + 24;
            char *name = malloc(size);
            for (int64_t e = 0; name && e < w->shape[0]; e++) {
                part_name(w, e, name, size);
                if (st_checkpoint_find(&ck, name)) continue;
                if (!first_missing) first_missing = missing_part = strdup(name);
                missing++;
            }
            free(name);
            continue;
        }
        for (uint32_t k = 0; k < (w->part_count ? w->part_count : 1); k++) {
            const char *name = w->part_count ? w->parts[k].name : w->name;
            if (st_checkpoint_find(&ck, name)) continue;
            if (!first_missing) first_missing = name;
            missing++;
        }
    }
    if (missing) {
        char more[96] = "";
        if (missing > 1)
            snprintf(more, sizeof more, ", nor are %u more of its %u weights (the wrong checkpoint?)",
                     missing - 1, p->weight_count);
        diag_error(d, loc, "the plan's weight '%.*s%s' is not in the checkpoint%s", DIAG_NAME(first_missing),
                   more);
        ok = false;
    }
    free(missing_part);
    st_checkpoint_close(&ck);
    return ok;
}

/* Uniform noise in [-0.05, 0.05) from a xorshift generator: enough to time
 * a plan, meaningless as a model. */
bool drv_bind_random_weights(smelt_engine *engine, const program *p, unsigned seed, diag_engine *d) {
    uint64_t state = 0x9e3779b97f4a7c15ull ^ seed;
    bool ok = true;
    for (uint32_t i = 0; i < p->weight_count && ok; i++) {
        const prog_weight *w = &p->weights[i];
        bool quantized = w->quant.kind != PROG_QUANT_NONE;
        uint64_t count = quantized ? (uint64_t)w->shape[0] * (uint64_t)w->shape[1]
                                   : w->bytes / smelt_dtype_element_bytes(w->dtype);
        float *values = malloc(count * sizeof *values + 1);
        if (!values) {
            diag_error(d, SMELT_NO_LOC, "out of memory making weight '%.*s%s'", DIAG_NAME(w->name));
            return false;
        }
        for (uint64_t k = 0; k < count; k++) {
            state ^= state << 13, state ^= state >> 7, state ^= state << 17;
            values[k] = (float)((double)(state >> 11) / 9007199254740992.0 - 0.5) * 0.1f;
        }
        if (quantized) {
            ok = bind_quantized(engine, w, values, d);
        } else {
            ok = smelt_engine_bind_weight(engine, w->name, SMELT_DTYPE_F32, values, w->shape, w->rank) ==
                 SMELT_OK;
            if (!ok) diag_error(d, SMELT_NO_LOC, "%s", smelt_last_error());
        }
        free(values);
    }
    return ok;
}
