/* calibrate.c - the reference run over calibration ids, with an observer
 * on every matmul's input (calibrate.h has the contract). */
#include "calibrate.h"

#include "driver_internal.h"
#include "reference.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { NO_INPUT = UINT32_MAX };

/* What the observer needs: the record of each matmul op's input. */
typedef struct observer_state {
    drv_calibration *calibration;
    uint32_t *input_of_op; /* [op_count]: index into inputs for the first matmul reading each
                              input, NO_INPUT for every other op */
} observer_state;

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
 * and one weight entry per such matmul. False when memory runs out. */
static bool plan_records(const ir_module *m, drv_calibration *c, uint32_t *input_of_op, bool with_xtx) {
    uint32_t *input_of_value = malloc((m->value_count ? m->value_count : 1) * sizeof *input_of_value);
    c->inputs = calloc(m->op_count ? m->op_count : 1, sizeof *c->inputs);
    c->weights = calloc(m->op_count ? m->op_count : 1, sizeof *c->weights);
    bool ok = input_of_value && c->inputs && c->weights;
    for (uint32_t v = 0; ok && v < m->value_count; v++)
        input_of_value[v] = NO_INPUT;
    for (uint32_t i = 0; ok && i < m->op_count; i++) {
        const ir_op *o = ir_op_at(m, i);
        input_of_op[i] = NO_INPUT;
        if (o->dead || o->kind != IR_OP_MATMUL) continue;
        uint32_t weight_op = m->values[o->operands[1]].def_op;
        if (ir_op_at(m, weight_op)->kind != IR_OP_WEIGHT) continue;
        const ir_type *x = &m->values[o->operands[0]].type;
        uint64_t cols = x->rank ? (uint64_t)x->dims[x->rank - 1].size : 1;
        uint32_t *input = &input_of_value[o->operands[0]];
        if (*input == NO_INPUT) { /* the first matmul to read it gathers for all */
            if (!quant_act_stats_init(&c->inputs[c->input_count], cols, with_xtx)) {
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
        observer_state state = {out, malloc((m->op_count ? m->op_count : 1) * sizeof *state.input_of_op)};
        ok = state.input_of_op && plan_records(m, out, state.input_of_op, o->xtx);
        if (!ok)
            diag_error(d, SMELT_NO_LOC, "calibration: cannot allocate the statistics of the matmul inputs");
        if (ok) {
            ref_model_observe_matmuls(drv_model_ref(opened), observe, &state);
            ok = run_windows(opened, ids, count, context, o->progress, d);
        }
        free(state.input_of_op);
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

void drv_calibration_free(drv_calibration *c) {
    for (uint32_t i = 0; c->inputs && i < c->input_count; i++)
        quant_act_stats_free(&c->inputs[i]);
    for (uint32_t i = 0; c->weights && i < c->weight_count; i++)
        free(c->weights[i].name);
    free(c->inputs);
    free(c->weights);
    memset(c, 0, sizeof *c);
}

bool drv_calibrate_for_precision(const drv_model_options *model, drv_calibration *out, diag_engine *d) {
    memset(out, 0, sizeof *out);
    const char *preset = drv_precision_name(model->precision);
    bool gated = model->precision_options.max_layer_error > 0;
    if (gated && !drv_precision_needs_calibration(model->precision) && !model->precision_options.calib_path) {
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
    if (!drv_precision_needs_calibration(model->precision) && !gated) return true;
    if (!model->precision_options.calib_path) {
        diag_error(d, SMELT_NO_LOC, "--precision %s learns from calibration data: pass --calib IDS", preset);
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
    drv_calib_options c = {.ids_path = model->precision_options.calib_path, .xtx = true, .progress = true};
    return drv_calibrate(model, &c, out, d);
}
