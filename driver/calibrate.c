/* calibrate.c - the reference run over calibration ids, with an observer
 * on every matmul's input and on every moe expert's inputs, per expert over
 * the tokens routed to it (calibrate.h has the contract). */
#include "calibrate.h"

#include "driver_internal.h"
#include "reference.h"

#include "numeric.h"
#include "pass.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { NO_INPUT = UINT32_MAX };

static char *copy_string(const char *s);

/* What the observer needs: the record of each matmul op's input, and of
 * each moe op's experts' inputs. */
typedef struct observer_state {
    drv_calibration *calibration;
    uint32_t *input_of_op;   /* [op_count]: index into inputs for the first matmul reading each
                                input, NO_INPUT for every other op */
    uint32_t *experts_of_op; /* [op_count]: a moe op's first record (2 E of them: expert e's
                                gate/up input at + e, its down input at + E + e); NO_INPUT */
    uint64_t *expert_count;  /* [op_count]: E of a moe op */
} observer_state;

static void observe_expert(void *context, uint32_t op, uint32_t projection, uint64_t expert, const float *x,
                           uint64_t cols) {
    observer_state *s = context;
    uint32_t first = s->experts_of_op[op];
    if (first == NO_INPUT || expert >= s->expert_count[op] || projection > 1) return;
    quant_act_stats *stats = &s->calibration->inputs[first + projection * s->expert_count[op] + expert];
    if (stats->cols == cols) quant_act_stats_add(stats, x, 1);
}

const char *drv_expert_name(const ir_module *m, uint32_t op, uint64_t e, arena *a) {
    const char *name = ir_op_string(m, op, "name"), *stack = ir_op_string(m, op, "stack");
    if (stack[0] != '\0') return fe_stacked_part_name(a, name, stack, e);
    return arena_printf(a, "%s[%llu]", name, (unsigned long long)e);
}

/* Is op i a live moe whose gate, up and down are constant [E, N, K] weights? */
static bool calibrated_moe(const ir_module *m, uint32_t i, uint64_t *experts) {
    const ir_op *o = ir_op_at(m, i);
    if (o->dead || o->kind != IR_OP_MOE) return false;
    for (uint32_t k = 2; k < 5; k++) {
        const ir_type *t = &m->values[o->operands[k]].type;
        if (ir_op_at(m, m->values[o->operands[k]].def_op)->kind != IR_OP_WEIGHT || t->rank != 3 ||
            ir_dim_is_symbol(t->dims[0]) || ir_dim_is_symbol(t->dims[1]) || ir_dim_is_symbol(t->dims[2]))
            return false;
    }
    *experts = (uint64_t)m->values[o->operands[2]].type.dims[0].size;
    return *experts > 0 && *experts <= UINT32_MAX / 4;
}

/* Zeroed statistics of an input of `cols` features, as o asks: XᵀX, a
 * sample of its rows. */
static bool init_record(quant_act_stats *s, uint64_t cols, const drv_calib_options *o) {
    if (!quant_act_stats_init(s, cols, o->xtx)) return false;
    if (o->sample_rows == 0 || quant_act_stats_keep_sample(s, o->sample_rows)) return true;
    quant_act_stats_free(s);
    return false;
}

/* A moe op's records: expert e's gate/up input (D columns) and its down
 * input (F columns), weight entries naming each expert's gate, up and
 * down parts, and stack entries naming the gate, up and down stacks. */
static bool plan_expert_records(const ir_module *m, uint32_t i, uint64_t experts, drv_calibration *c,
                                observer_state *s, const drv_calib_options *options) {
    const ir_op *o = ir_op_at(m, i);
    uint64_t model_dim = (uint64_t)m->values[o->operands[2]].type.dims[2].size;
    uint64_t ffn = (uint64_t)m->values[o->operands[2]].type.dims[1].size;
    s->experts_of_op[i] = c->input_count;
    s->expert_count[i] = experts;
    arena names;
    arena_init(&names);
    bool ok = true;
    for (uint32_t projection = 0; ok && projection < 2; projection++)
        for (uint64_t e = 0; ok && e < experts; e++) {
            ok = init_record(&c->inputs[c->input_count], projection ? ffn : model_dim, options);
            if (!ok) break;
            uint32_t input = c->input_count++;
            for (uint32_t k = 2; ok && k < 5; k++) {
                if ((k == 4) != (projection == 1)) continue; /* gate and up read x, down the hidden row */
                drv_calib_weight *w = &c->weights[c->weight_count++];
                w->input = input;
                w->name = copy_string(drv_expert_name(m, m->values[o->operands[k]].def_op, e, &names));
                ok = w->name != NULL;
            }
        }
    arena_free(&names);
    for (uint32_t k = 2; ok && k < 5; k++) {
        drv_calib_stack *stack = &c->stacks[c->stack_count++];
        stack->first_input = s->experts_of_op[i] + (k == 4 ? (uint32_t)experts : 0);
        stack->experts = (uint32_t)experts;
        stack->name = copy_string(ir_op_string(m, m->values[o->operands[k]].def_op, "name"));
        ok = stack->name != NULL;
    }
    return ok;
}

static void observe(void *context, uint32_t op, const float *x, uint64_t rows, uint64_t cols) {
    observer_state *s = context;
    uint32_t input = s->input_of_op[op];
    if (input == NO_INPUT) return;
    quant_act_stats *stats = &s->calibration->inputs[input];
    if (stats->cols == cols) quant_act_stats_add(stats, x, rows);
}

static char *copy_string(const char *s) {
    size_t n = strlen(s) + 1;
    char *copy = malloc(n);
    return copy ? memcpy(copy, s, n) : NULL;
}

/* One record per distinct input of a matmul whose operand 1 is a weight,
 * and one weight entry per such matmul; 2 E records, 3 E entries and 3
 * stacks per moe op of E experts. False when memory runs out. */
static bool plan_records(const ir_module *m, drv_calibration *c, observer_state *s,
                         const drv_calib_options *options) {
    uint32_t *input_of_op = s->input_of_op;
    uint64_t inputs = m->op_count ? m->op_count : 1, weights = inputs, stacks = 1, experts;
    for (uint32_t i = 0; i < m->op_count; i++)
        if (calibrated_moe(m, i, &experts)) inputs += 2 * experts, weights += 3 * experts, stacks += 3;
    uint32_t *input_of_value = malloc((m->value_count ? m->value_count : 1) * sizeof *input_of_value);
    c->inputs = inputs <= UINT32_MAX ? calloc(inputs, sizeof *c->inputs) : NULL;
    c->weights = weights <= UINT32_MAX ? calloc(weights, sizeof *c->weights) : NULL;
    c->stacks = stacks <= UINT32_MAX ? calloc(stacks, sizeof *c->stacks) : NULL;
    bool ok = input_of_value && c->inputs && c->weights && c->stacks;
    for (uint32_t v = 0; ok && v < m->value_count; v++)
        input_of_value[v] = NO_INPUT;
    for (uint32_t i = 0; ok && i < m->op_count; i++) {
        const ir_op *o = ir_op_at(m, i);
        input_of_op[i] = NO_INPUT;
        s->experts_of_op[i] = NO_INPUT;
        if (calibrated_moe(m, i, &experts)) {
            ok = plan_expert_records(m, i, experts, c, s, options);
            continue;
        }
        if (o->dead || o->kind != IR_OP_MATMUL) continue;
        uint32_t weight_op = m->values[o->operands[1]].def_op;
        if (ir_op_at(m, weight_op)->kind != IR_OP_WEIGHT) continue;
        const ir_type *x = &m->values[o->operands[0]].type;
        uint64_t cols = x->rank ? (uint64_t)x->dims[x->rank - 1].size : 1;
        uint32_t *input = &input_of_value[o->operands[0]];
        if (*input == NO_INPUT) { /* the first matmul to read it gathers for all */
            if (!init_record(&c->inputs[c->input_count], cols, options)) {
                ok = false;
                break;
            }
            *input = c->input_count++;
            input_of_op[i] = *input;
        }
        drv_calib_weight *w = &c->weights[c->weight_count++];
        w->input = *input;
        w->name = copy_string(ir_op_string(m, weight_op, "name"));
        ok = w->name != NULL;
    }
    free(input_of_value);
    return ok;
}

/* Runs the ids in windows of `context`, each from an empty cache. */
static bool run_windows(drv_model *model, const int32_t *ids, size_t count, unsigned context, bool progress,
                        diag_engine *d) {
    const drv_model_info *info = drv_model_get_info(model);
    float *logits = malloc((size_t)context * info->vocab * sizeof *logits);
    int32_t *positions = malloc((size_t)context * sizeof *positions);
    bool ok = logits && positions;
    if (!ok) diag_error(d, SMELT_NO_LOC, "calibration: out of memory for a window of %u ids", context);
    for (uint32_t i = 0; ok && i < context; i++)
        positions[i] = (int32_t)i;
    bool show = progress && isatty(STDERR_FILENO);
    for (size_t begin = 0; ok && begin < count; begin += context) {
        uint32_t n = (uint32_t)(count - begin < context ? count - begin : context);
        drv_model_reset(model);
        ok = drv_model_step(model, ids + begin, positions, n, DRV_ROWS_ALL, logits, d);
        if (show) fprintf(stderr, "\rsmelt: calibrate: %zu of %zu ids", begin + n, count);
    }
    if (show) fputc('\n', stderr);
    free(logits);
    free(positions);
    return ok;
}

bool drv_calibrate(const drv_model_options *model, const drv_calib_options *o, drv_calibration *out,
                   diag_engine *d) {
    memset(out, 0, sizeof *out);
    size_t count = 0;
    int32_t *ids = drv_token_ids_read(o->ids_path, &count, d);
    if (!ids) return false;
    if (o->max_ids && o->max_ids < count) count = o->max_ids;
    drv_model_options f32 = *model;
    f32.backend = DRV_BACKEND_REF;
    f32.precision = DRV_PRECISION_F32; /* statistics of the model as trained */
    f32.precision_options.max_layer_error = 0;
    f32.no_fuse = true; /* each matmul reads its own weight op (no concatenation), named as the plan's */
    drv_model *opened = NULL;
    bool ok = count > 0 && drv_model_open(&f32, &opened, d);
    if (count == 0) diag_error(d, SMELT_NO_LOC, "'%s' holds no ids to calibrate on", o->ids_path);
    unsigned context = o->context ? o->context : 256;
    if (ok) {
        const drv_model_info *info = drv_model_get_info(opened);
        if (info->max_positions && context > info->max_positions) context = (unsigned)info->max_positions;
        if (info->max_step_tokens && context > info->max_step_tokens)
            context = (unsigned)info->max_step_tokens;
        const ir_module *m = drv_model_module(opened);
        size_t ops = m->op_count ? m->op_count : 1;
        observer_state state = {out, malloc(ops * sizeof *state.input_of_op),
                                malloc(ops * sizeof *state.experts_of_op),
                                malloc(ops * sizeof *state.expert_count)};
        ok =
            state.input_of_op && state.experts_of_op && state.expert_count && plan_records(m, out, &state, o);
        if (!ok)
            diag_error(d, SMELT_NO_LOC, "calibration: cannot allocate the statistics of the matmul inputs");
        if (ok) {
            ref_model_observe_matmuls(drv_model_ref(opened), observe, &state);
            ref_model_observe_experts(drv_model_ref(opened), observe_expert);
            ok = run_windows(opened, ids, count, context, o->progress, d);
        }
        free(state.input_of_op);
        free(state.experts_of_op);
        free(state.expert_count);
    }
    out->ids = ok ? count : 0;
    drv_model_close(opened);
    free(ids);
    if (!ok) drv_calibration_free(out);
    return ok;
}

const quant_act_stats *drv_calibration_stats(const drv_calibration *c, const char *name) {
    for (uint32_t i = 0; i < c->weight_count; i++)
        if (strcmp(c->weights[i].name, name) == 0) return &c->inputs[c->weights[i].input];
    return NULL;
}

/* max |x| of input record s over every row and column gathered. */
static float input_absmax(const quant_act_stats *s) {
    float absmax = 0.0f;
    for (uint64_t k = 0; k < s->cols; k++)
        absmax = s->absmax[k] > absmax ? s->absmax[k] : absmax;
    return absmax;
}

bool drv_calibration_act_scales(const drv_calibration *c, pass_act_scale **out, uint32_t *count,
                                diag_engine *d) {
    *out = NULL;
    *count = 0;
    uint32_t total = c->weight_count + c->stack_count; /* both below 2^32 / 3 (plan_records) */
    if (total == 0) return true;
    pass_act_scale *scales = calloc(total, sizeof *scales);
    if (!scales) {
        diag_error(d, SMELT_NO_LOC, "calibration: out of memory for %u activation scales", total);
        return false;
    }
    for (uint32_t i = 0; i < c->weight_count; i++)
        scales[i] =
            (pass_act_scale){.weight = c->weights[i].name,
                             .scale = plan_f8e4m3_row_scale(input_absmax(&c->inputs[c->weights[i].input]))};
    for (uint32_t i = 0; i < c->stack_count;
         i++) { /* one scale for all the experts (an unreached one adds 0) */
        const drv_calib_stack *stack = &c->stacks[i];
        float absmax = 0.0f;
        for (uint32_t e = 0; e < stack->experts; e++) {
            float expert = input_absmax(&c->inputs[stack->first_input + e]);
            absmax = expert > absmax ? expert : absmax;
        }
        scales[c->weight_count + i] =
            (pass_act_scale){.weight = stack->name, .scale = plan_f8e4m3_row_scale(absmax)};
    }
    *out = scales;
    *count = total;
    return true;
}

void drv_calibration_free(drv_calibration *c) {
    for (uint32_t i = 0; c->inputs && i < c->input_count; i++)
        quant_act_stats_free(&c->inputs[i]);
    for (uint32_t i = 0; c->weights && i < c->weight_count; i++)
        free(c->weights[i].name);
    for (uint32_t i = 0; c->stacks && i < c->stack_count; i++)
        free(c->stacks[i].name);
    free(c->inputs);
    free(c->weights);
    free(c->stacks);
    memset(c, 0, sizeof *c);
}

bool drv_calibrate_for_precision(const drv_model_options *model, drv_calibration *out, diag_engine *d) {
    memset(out, 0, sizeof *out);
    const char *preset = drv_precision_name(model->precision);
    bool smooth = model->precision == DRV_PRECISION_INT8,
         static_scales = model->precision == DRV_PRECISION_FP8;
    bool gated = model->precision_options.max_layer_error > 0;
    bool needs = drv_precision_needs_calibration(model->precision, &model->precision_options);
    if (gated && !needs && !model->precision_options.calib_path) {
        diag_error(d, SMELT_NO_LOC,
                   "--max-layer-error measures each quantized weight's output error on calibration data: "
                   "pass --calib IDS");
        diag_note(d, SMELT_NO_LOC,
                  "IDS holds token ids as `smelt eval --ids` reads them (for the demo model: "
                  "tests/fixtures/demo/calib_ids.bin, a slice of its training text)");
        return false;
    }
    if (gated && (model->precision == DRV_PRECISION_F32 || model->precision == DRV_PRECISION_BF16)) {
        diag_error(d, SMELT_NO_LOC,
                   "--max-layer-error gates quantized weights; --precision %s quantizes none", preset);
        return false;
    }
    if (gated && !model->weights_path) {
        diag_error(
            d, SMELT_NO_LOC,
            "--max-layer-error measures the quantized weights as they are compiled: it needs --weights");
        return false;
    }
    if (!needs && !gated) return true;
    if (!model->precision_options.calib_path) {
        diag_error(d, SMELT_NO_LOC, "--precision %s learns from calibration data: pass --calib IDS%s", preset,
                   smooth ? " (SmoothQuant's migration), or --act-quant none for weight-only int8" : "");
        diag_note(d, SMELT_NO_LOC,
                  "IDS holds token ids as `smelt eval --ids` reads them (for the demo model: "
                  "tests/fixtures/demo/calib_ids.bin, a slice of its training text)");
        return false;
    }
    if (!model->weights_path) {
        diag_error(d, SMELT_NO_LOC,
                   "--precision %s quantizes the weights as they are compiled: it needs --weights", preset);
        return false;
    }
    const char *act_quant = model->precision_options.act_quant;
    bool w8a8 = (model->precision == DRV_PRECISION_INT8 || model->precision == DRV_PRECISION_FP8) &&
                !(act_quant && strcmp(act_quant, "none") == 0);
    drv_calib_options c = {.ids_path = model->precision_options.calib_path,
                           .xtx = gated || (!smooth && !static_scales), /* the gate measures through X^T X */
                           /* and W8A8 matmuls on their input rows (accuracy_gate.h) */
                           .sample_rows = gated && w8a8 ? DRV_CALIB_SAMPLE_ROWS : 0,
                           .progress = true};
    return drv_calibrate(model, &c, out, d);
}
