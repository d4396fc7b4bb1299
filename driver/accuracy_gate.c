/* accuracy_gate.c - each quantized weight's (and each stack of MoE
 * experts') output error on the calibration inputs, and the weights kept
 * unquantized for it (accuracy_gate.h has the contract). */
#include "accuracy_gate.h"

#include "calib.h"
#include "quant_group.h"
#include "ref_ops.h" /* ref_w8a8_row_codes, ref_w8a8_weight_code: the W8A8 matmul's coding */

#include <ctype.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The first dot-separated part of `name` made of digits alone, or -1. */
static int64_t layer_of(const char *name) {
    for (const char *part = name; *part;) {
        const char *end = strchr(part, '.');
        size_t n = end ? (size_t)(end - part) : strlen(part);
        size_t digits = 0;
        while (digits < n && isdigit((unsigned char)part[digits]))
            digits++;
        if (n > 0 && digits == n && n < 10) return strtoll(part, NULL, 10);
        if (!end) break;
        part = end + 1;
    }
    return -1;
}

/* `keep` (NULL: none) followed by every kept weight's name; NULL when out of
 * memory. A name with a comma or a '*' cannot be one pattern of the list
 * (ir_tensor_pattern_matches has no escapes): *bad names it. */
static char *keep_list(const char *keep, const drv_gate *g, const char **bad) {
    size_t size = (keep ? strlen(keep) : 0) + 1;
    for (uint32_t i = 0; i < g->weight_count; i++)
        if (g->weights[i].kept) size += strlen(g->weights[i].name) + 1;
    char *list = malloc(size), *p = list;
    if (!list) return NULL;
    *p = '\0';
    if (keep) p = stpcpy(p, keep);
    for (uint32_t i = 0; i < g->weight_count; i++) {
        if (!g->weights[i].kept) continue;
        if (strpbrk(g->weights[i].name, ",*")) *bad = g->weights[i].name;
        if (p != list) *p++ = ',';
        p = stpcpy(p, g->weights[i].name);
    }
    return list;
}

/* sqrt(error / output): a relative error from its squared sums; 0 when
 * the output is 0 (an input never seen), NaN when error is. */
static double relative(double error, double output) {
    return output > 0 ? sqrt(error / output) : isnan(error) ? NAN : 0.0;
}

bool drv_gate_w8a8_error(const float *w, const quant_tensor *t, quant_kind act, float static_scale,
                         const float *x, uint64_t count, double *error, double *output) {
    uint64_t rows = t->layout.rows, cols = t->layout.cols;
    float *codes = malloc((cols ? cols : 1) * sizeof *codes); /* [K]: one input row's codes */
    float *weight = rows && cols <= SIZE_MAX / sizeof(float) / rows
                        ? malloc(rows * cols * sizeof *weight)
                        : NULL; /* [N, K]: the weight's codes as values, decoded once */
    if (!codes || !weight) {
        free(codes);
        free(weight);
        return false;
    }
    for (uint64_t n = 0; n < rows; n++)
        for (uint64_t k = 0; k < cols; k++)
            weight[n * cols + k] = ref_w8a8_weight_code(act, t, n, k);
    for (uint64_t r = 0; r < count; r++) {
        const float *xr = x + r * cols; /* [K] */
        float scale = ref_w8a8_row_codes(act, xr, t, cols, static_scale, codes);
        for (uint64_t n = 0; n < rows; n++) {
            const float *wn = w + n * cols, *qn = weight + n * cols;
            double exact = 0.0, dot = 0.0;
            for (uint64_t k = 0; k < cols; k++) {
                exact += (double)xr[k] * wn[k];
                dot += (double)codes[k] * qn[k];
            }
            /* the reference's W8A8 product, before its rounding to f32 */
            double quantized = dot * ((double)scale * quant_scale(t, n, 0));
            *error += (exact - quantized) * (exact - quantized);
            *output += exact * exact;
        }
    }
    free(codes);
    free(weight);
    return true;
}

/* The activation quantization of the first live matmul that reads weight
 * value v (ops.def: act_quant, act_scale, act_scale_value), when it is
 * W8A8 with the weight's kind f: *act its codes' kind, *static_scale the
 * per-tensor scale (0: per token). */
static bool matmul_w8a8(const ir_module *m, ir_value_id v, const quant_format *f, quant_kind *act,
                        float *static_scale) {
    for (uint32_t i = 0; i < m->op_count; i++) {
        const ir_op *o = &m->ops[i];
        if (o->dead || o->kind != IR_OP_MATMUL || o->operand_count < 2 || o->operands[1] != v) continue;
        const char *kind = ir_op_string(m, i, "act_quant");
        *act = strcmp(kind, "i8") == 0 ? QUANT_INT8 : strcmp(kind, "f8e4m3") == 0 ? QUANT_FP8 : QUANT_NONE;
        *static_scale = strcmp(ir_op_string(m, i, "act_scale"), "tensor") == 0
                            ? (float)ir_op_float(m, i, "act_scale_value")
                            : 0.0f;
        return *act != QUANT_NONE && *act == f->kind;
    }
    return false;
}

/* The same for a stack of experts: the act_quant under which the first
 * live moe that reads stack value v multiplies it (gate_up_act_quant for
 * its gate and up, down_act_quant for its down), *static_scale that
 * input's static scale under act_scale tensor (0: per token). */
static bool moe_w8a8(const ir_module *m, ir_value_id v, const quant_format *f, quant_kind *act,
                     float *static_scale) {
    for (uint32_t i = 0; i < m->op_count; i++) {
        const ir_op *o = &m->ops[i];
        if (o->dead || o->kind != IR_OP_MOE || o->operand_count != 5) continue;
        for (uint32_t k = 2; k < 5; k++) {
            if (o->operands[k] != v) continue;
            const char *kind = ir_op_string(m, i, k == 4 ? "down_act_quant" : "gate_up_act_quant");
            *act = strcmp(kind, "i8") == 0       ? QUANT_INT8
                   : strcmp(kind, "f8e4m3") == 0 ? QUANT_FP8
                                                 : QUANT_NONE;
            *static_scale =
                strcmp(ir_op_string(m, i, "act_scale"), "tensor") == 0
                    ? (float)ir_op_float(m, i, k == 4 ? "down_act_scale_value" : "gate_up_act_scale_value")
                    : 0.0f;
            return *act != QUANT_NONE && *act == f->kind;
        }
    }
    return false;
}

/* Quantizes weight op `op` of format f and measures it into *out: through
 * XᵀX, and when its matmul is W8A8 and calibration kept a sample of its
 * input rows, on them with the activations quantized too. */
static bool measure(const ir_module *m, uint32_t op, const quant_format *f, drv_source_weights *w,
                    const drv_calibration *cal, double limit, drv_gate_weight *out, diag_engine *d) {
    const char *name = ir_op_string(m, op, "name");
    const ir_type *t = &m->values[m->ops[op].results[0]].type;
    uint64_t rows = (uint64_t)t->dims[0].size, cols = (uint64_t)t->dims[1].size;
    size_t length = strlen(name) + 1;
    *out = (drv_gate_weight){.name = malloc(length), .layer = layer_of(name), .format = *f};
    const quant_act_stats *s = drv_calibration_stats(cal, name);
    if (!s || !s->xtx || s->cols != cols) {
        diag_error(d, SMELT_NO_LOC,
                   "--max-layer-error: no calibration statistics of the input of weight '%.*s%s' (no "
                   "matmul the reference ran reads it)",
                   DIAG_NAME(name));
        return false;
    }
    float *values =
        rows && cols <= SIZE_MAX / sizeof(float) / rows ? malloc(rows * cols * sizeof *values) : NULL;
    if (!out->name || !values) {
        free(values);
        diag_error(d, SMELT_NO_LOC, "out of memory measuring weight '%.*s%s'", DIAG_NAME(name));
        return false;
    }
    memcpy(out->name, name, length);
    bool ok = drv_source_weights_read(w, op, values, rows * cols);
    if (!ok) diag_error(d, SMELT_NO_LOC, "cannot read weight '%.*s%s' to measure it", DIAG_NAME(name));
    ok = ok && drv_quantize_weight(name, values, rows, cols, f, s, &out->tensor, d);
    quant_kind act = QUANT_NONE;
    float static_scale = 0.0f;
    if (ok) {
        out->error = out->weight_error = quant_relative_output_error(values, &out->tensor, s->xtx);
        if (!isnan(out->error) && s->sample_rows &&
            matmul_w8a8(m, m->ops[op].results[0], f, &act, &static_scale)) {
            double error = 0.0, output = 0.0;
            if (!drv_gate_w8a8_error(values, &out->tensor, act, static_scale, s->sample, s->sample_rows,
                                     &error, &output))
                error = NAN; /* out of memory: reported below */
            out->error = relative(error, output);
            out->formula = DRV_GATE_W8A8;
            out->sample_rows = s->sample_rows;
        }
        if (isnan(out->error)) {
            diag_error(d, SMELT_NO_LOC, "the output error of weight '%.*s%s' is not a number%s",
                       DIAG_NAME(name), " (out of memory, or a NaN in the checkpoint or its statistics)");
            ok = false;
        }
        out->kept = out->error > limit;
        if (out->kept) {
            free(out->tensor.data);
            out->tensor.data = NULL;
        }
    }
    free(values);
    return ok;
}

/* Does a live matmul read value v as its weight? */
static bool read_by_matmul(const ir_module *m, ir_value_id v) {
    for (uint32_t i = 0; i < m->op_count; i++)
        if (!m->ops[i].dead && m->ops[i].kind == IR_OP_MATMUL && m->ops[i].operand_count >= 2 &&
            m->ops[i].operands[1] == v)
            return true;
    return false;
}

/* Quantizes stack op `op` of MoE experts [E, N, K] of format f expert by
 * expert, each with the statistics of the tokens routed to it, and measures
 * the stack into *out: sqrt(sum_e ||X_e (W_e - Ŵ_e)^T||^2 / sum_e ||X_e
 * W_e^T||^2), the relative output error of the stack over every (token,
 * chosen expert) pair of the calibration inputs; an expert no token reached
 * adds nothing. When the moe multiplies the stack W8A8 and calibration kept
 * a sample of each expert's input rows, the error is the W8A8 one on the
 * samples, each expert's sums weighted by its tokens / its sample's rows
 * (so that each stands for all the pairs it was drawn from). The quantized
 * experts are not kept (out->tensor.data stays NULL): the plan writer
 * quantizes the stack again (driver/quantize.c). */
static bool measure_stack(const ir_module *m, uint32_t op, const quant_format *f, drv_source_weights *w,
                          const drv_calibration *cal, double limit, drv_gate_weight *out, diag_engine *d) {
    const char *name = ir_op_string(m, op, "name");
    const ir_type *t = &m->values[m->ops[op].results[0]].type;
    uint64_t experts = (uint64_t)t->dims[0].size, rows = (uint64_t)t->dims[1].size,
             cols = (uint64_t)t->dims[2].size, count = 0;
    size_t length = strlen(name) + 1;
    *out = (drv_gate_weight){.name = malloc(length), .layer = layer_of(name), .format = *f};
    bool sized = rows && cols && !__builtin_mul_overflow(experts, rows * cols, &count) &&
                 count <= SIZE_MAX / sizeof(float);
    float *values = sized ? malloc(count * sizeof *values) : NULL;
    double *row = malloc((cols ? cols : 1) * sizeof *row);
    if (!out->name || !values || !row) {
        free(values);
        free(row);
        diag_error(d, SMELT_NO_LOC, "out of memory measuring weight '%.*s%s'", DIAG_NAME(name));
        return false;
    }
    memcpy(out->name, name, length);
    bool ok = drv_source_weights_read(w, op, values, count);
    if (!ok) diag_error(d, SMELT_NO_LOC, "cannot read weight '%.*s%s' to measure it", DIAG_NAME(name));
    double error = 0.0, output = 0.0, w8a8_error = 0.0, w8a8_output = 0.0;
    quant_kind act = QUANT_NONE;
    float static_scale = 0.0f;
    bool w8a8 = moe_w8a8(m, m->ops[op].results[0], f, &act, &static_scale);
    uint64_t sampled = 0;
    arena names;
    arena_init(&names);
    for (uint64_t e = 0; ok && e < experts; e++) {
        const char *expert = drv_expert_name(m, op, e, &names);
        const quant_act_stats *s = drv_calibration_stats(cal, expert);
        if (!s || !s->xtx || s->cols != cols) {
            diag_error(d, SMELT_NO_LOC,
                       "--max-layer-error: no calibration statistics of the input of expert '%.*s%s' (no moe "
                       "the reference ran reads it)",
                       DIAG_NAME(expert));
            ok = false;
            break;
        }
        if (s->tokens == 0) continue; /* no input: no output to be wrong */
        const float *matrix = values + e * rows * cols;
        quant_tensor q;
        ok = drv_quantize_weight(expert, matrix, rows, cols, f, s, &q, d);
        if (!ok) break;
        error += quant_output_error(matrix, &q, s->xtx);
        for (uint64_t n = 0; n < rows; n++) {
            for (uint64_t k = 0; k < cols; k++)
                row[k] = matrix[n * cols + k];
            output += quant_quadratic_form(row, s->xtx, cols, cols);
        }
        w8a8 = w8a8 && s->sample_rows > 0; /* else the stack is measured through XᵀX alone */
        if (w8a8) {
            double sample_error = 0.0, sample_output = 0.0,
                   weight = (double)s->tokens / (double)s->sample_rows;
            if (!drv_gate_w8a8_error(matrix, &q, act, static_scale, s->sample, s->sample_rows, &sample_error,
                                     &sample_output))
                sample_error = NAN; /* out of memory: reported below */
            w8a8_error += weight * sample_error;
            w8a8_output += weight * sample_output;
            sampled += s->sample_rows;
        }
        free(q.data);
    }
    arena_free(&names);
    free(values);
    free(row);
    if (ok) {
        out->error = out->weight_error = relative(error, output);
        if (w8a8 && sampled > 0 && !isnan(out->error)) {
            out->error = relative(w8a8_error, w8a8_output);
            out->formula = DRV_GATE_W8A8;
            out->sample_rows = sampled;
        }
        if (isnan(out->error)) {
            diag_error(d, SMELT_NO_LOC, "the output error of weight '%.*s%s' is not a number%s",
                       DIAG_NAME(name), " (out of memory, or a NaN in the checkpoint or its statistics)");
            ok = false;
        }
        out->kept = out->error > limit;
    }
    return ok;
}

/* Whether weight op `op` is measured: quantized here (not imported
 * quantized: no floats to compare with), and a matrix a matmul reads as
 * its weight (the int8 token-embedding table of the int4 presets is
 * gathered, not multiplied, so the output error is not its measure; a
 * table tied to the lm_head is measured as the lm_head), or an [E, N, K]
 * stack of MoE experts (measure_stack). */
static bool gated(const ir_module *m, uint32_t op, quant_format *f) {
    unsigned rank = m->values[m->ops[op].results[0]].type.rank;
    return !m->ops[op].dead && m->ops[op].kind == IR_OP_WEIGHT && ir_weight_quant(m, op, f) &&
           f->method != QUANT_METHOD_CHECKPOINT &&
           ((rank == 2 && read_by_matmul(m, m->ops[op].results[0])) || rank == 3);
}

/* The gate's entry for weight value v, or NULL. */
static drv_gate_weight *entry_of(const ir_module *m, drv_gate *g, ir_value_id v) {
    const char *name = ir_op_string(m, m->values[v].def_op, "name");
    for (uint32_t i = 0; i < g->weight_count; i++)
        if (strcmp(g->weights[i].name, name) == 0) return &g->weights[i];
    return NULL;
}

/* One kernel reads a moe's gate and up stacks, so they share one format
 * (codegen/emit_moe.c): when either is over the limit both are kept. */
static void keep_gate_and_up_together(const ir_module *m, drv_gate *g) {
    for (uint32_t i = 0; i < m->op_count; i++) {
        const ir_op *o = &m->ops[i];
        if (o->dead || o->kind != IR_OP_MOE || o->operand_count != 5) continue;
        drv_gate_weight *gate = entry_of(m, g, o->operands[2]), *up = entry_of(m, g, o->operands[3]);
        if (!gate || !up || gate->kept == up->kept) continue;
        gate->kept = up->kept = true;
    }
}

bool drv_gate_run(const char *model_path, const drv_source_options *source, const drv_lowering *l,
                  const drv_calibration *cal, drv_gate *out, diag_engine *d) {
    memset(out, 0, sizeof *out);
    out->max_error = l->precision_options.max_layer_error;
    out->calibration_ids = cal->ids;
    ir_module m = {0};
    drv_source_weights weights = {0};
    bool ok = drv_source_parse(model_path, source, &m, d) &&
              drv_source_passes(source->config_path, l, "precision", NULL, &m, d);
    bool opened = ok;
    ok = ok && drv_source_weights_open(&weights, l->weights_path, source->config_path, &m, d);
    uint32_t total = 0;
    quant_format f;
    for (uint32_t i = 0; ok && i < m.op_count; i++)
        total += gated(&m, i, &f);
    out->weights = ok ? calloc(total ? total : 1, sizeof *out->weights) : NULL;
    if (ok && !out->weights) {
        diag_error(d, SMELT_NO_LOC, "out of memory for the accuracy gate's %u weights", total);
        ok = false;
    }
    bool show = isatty(STDERR_FILENO);
    for (uint32_t i = 0; ok && i < m.op_count; i++) {
        if (!gated(&m, i, &f)) continue;
        ok = m.values[m.ops[i].results[0]].type.rank == 3
                 ? measure_stack(&m, i, &f, &weights, cal, out->max_error, &out->weights[out->weight_count++],
                                 d)
                 : measure(&m, i, &f, &weights, cal, out->max_error, &out->weights[out->weight_count++], d);
        if (show) fprintf(stderr, "\rsmelt: accuracy gate: %u of %u weights", out->weight_count, total);
    }
    if (show && total) fputc('\n', stderr);
    if (ok) keep_gate_and_up_together(&m, out);
    for (uint32_t i = 0; ok && i < out->weight_count; i++)
        if (out->weights[i].kept) { /* stored unquantized: its codes are not needed */
            free(out->weights[i].tensor.data);
            out->weights[i].tensor.data = NULL;
        }
    const char *bad = NULL;
    if (ok && !(out->keep = keep_list(l->precision_options.keep, out, &bad))) {
        diag_error(d, SMELT_NO_LOC, "out of memory for the accuracy gate's kept weights");
        ok = false;
    }
    if (ok && bad) {
        diag_error(d, SMELT_NO_LOC,
                   "--max-layer-error: weight '%.*s%s' has a ',' or a '*' in its name, so --keep "
                   "cannot name it",
                   DIAG_NAME(bad));
        ok = false;
    }
    if (opened) drv_source_weights_close(&weights);
    ir_module_free(&m);
    if (!ok) drv_gate_free(out);
    return ok;
}

const quant_tensor *drv_gate_quantized(const drv_gate *g, const char *name, const quant_format *f) {
    for (uint32_t i = 0; g && i < g->weight_count; i++) {
        const drv_gate_weight *w = &g->weights[i];
        if (strcmp(w->name, name) != 0) continue;
        return quant_format_equal(&w->format, f) && w->tensor.data ? &w->tensor : NULL;
    }
    return NULL;
}

void drv_gate_free(drv_gate *g) {
    for (uint32_t i = 0; g->weights && i < g->weight_count; i++) {
        free(g->weights[i].name);
        free(g->weights[i].tensor.data);
    }
    free(g->weights);
    free(g->keep);
    memset(g, 0, sizeof *g);
}

/* ---- The table ------------------------------------------------------------------- */

enum { NAME_MAX_PRINTED = 161 }; /* a weight's name in the table: 160 bytes at most */

static const char error_definition[] =
    "relative output error ||X W^T - X Wq^T||_F / ||X W^T||_F on the calibration inputs";
static const char w8a8_definition[] =
    "relative output error ||X W^T - Q(X) Wq^T||_F / ||X W^T||_F on a sample of the calibration inputs' "
    "rows, Q the matmul's activation quantization";

json_t *drv_gate_to_json(const drv_gate *g) {
    json_t *root = json_object(), *weights = json_array(), *layers = json_array();
    uint32_t kept = 0;
    for (uint32_t i = 0; i < g->weight_count; i++) {
        const drv_gate_weight *w = &g->weights[i];
        json_t *row = json_object();
        json_object_set_new(row, "name", json_string(w->name));
        json_object_set_new(row, "layer", w->layer >= 0 ? json_integer(w->layer) : json_null());
        json_object_set_new(row, "quant", json_string(quant_kind_name(w->format.kind)));
        json_object_set_new(row, "method", json_string(quant_method_name(w->format.method)));
        json_object_set_new(row, "group", json_integer(w->format.group));
        json_object_set_new(row, "error", json_real(w->error));
        bool w8a8 = w->formula == DRV_GATE_W8A8;
        json_object_set_new(row, "formula", json_string(w8a8 ? "w8a8" : "xtx"));
        json_object_set_new(row, "weight_error", json_real(w->weight_error));
        if (w8a8) json_object_set_new(row, "sample_rows", json_integer((json_int_t)w->sample_rows));
        json_object_set_new(row, "kept", json_boolean(w->kept));
        json_array_append_new(weights, row);
        kept += w->kept;
        if (w->layer < 0) continue;
        /* its decoder layer's summary, the layers in the order they first appear */
        json_t *layer = NULL;
        for (size_t j = 0; j < json_array_size(layers) && !layer; j++)
            if (json_integer_value(json_object_get(json_array_get(layers, j), "layer")) == w->layer)
                layer = json_array_get(layers, j);
        if (!layer) {
            layer = json_object();
            json_object_set_new(layer, "layer", json_integer(w->layer));
            json_object_set_new(layer, "weights", json_integer(0));
            json_object_set_new(layer, "max_error", json_real(-1));
            json_object_set_new(layer, "worst", json_string(""));
            json_object_set_new(layer, "kept", json_integer(0));
            json_array_append_new(layers, layer);
        }
        json_object_set_new(layer, "weights",
                            json_integer(json_integer_value(json_object_get(layer, "weights")) + 1));
        json_object_set_new(layer, "kept",
                            json_integer(json_integer_value(json_object_get(layer, "kept")) + w->kept));
        if (w->error > json_real_value(json_object_get(layer, "max_error"))) {
            json_object_set_new(layer, "max_error", json_real(w->error));
            json_object_set_new(layer, "worst", json_string(w->name));
        }
    }
    json_object_set_new(root, "max_layer_error", json_real(g->max_error));
    json_object_set_new(root, "calibration_ids", json_integer((json_int_t)g->calibration_ids));
    json_object_set_new(root, "error", json_string(error_definition));
    json_object_set_new(root, "w8a8_error", json_string(w8a8_definition));
    json_object_set_new(root, "kept", json_integer(kept));
    json_object_set_new(root, "weights", weights);
    json_object_set_new(root, "layers", layers);
    return root;
}

/* text from a plan (untrusted) with every control byte as '?', at most size - 1 bytes */
static const char *printable(const char *text, char *buffer, size_t size) {
    size_t n = 0;
    for (; text[n] && n + 1 < size; n++)
        buffer[n] = (unsigned char)text[n] < 0x20 || text[n] == 0x7f ? '?' : text[n];
    buffer[n] = '\0';
    return buffer;
}

static bool is_count(const json_t *v) { return json_is_integer(v) && json_integer_value(v) >= 0; }

/* Is row w measured by the W8A8 formula? Its "formula" is "w8a8" (absent
 * in a plan from before it: "xtx"). */
static bool is_w8a8(const json_t *w) {
    const char *formula = json_string_value(json_object_get(w, "formula"));
    return formula && strcmp(formula, "w8a8") == 0;
}

/* Are row w's optional fields, where present, what drv_gate_to_json writes? */
static bool formula_fields_valid(const json_t *w) {
    const json_t *formula = json_object_get(w, "formula"), *weight_error = json_object_get(w, "weight_error"),
                 *rows = json_object_get(w, "sample_rows");
    if (formula && !(json_is_string(formula) && (strcmp(json_string_value(formula), "xtx") == 0 ||
                                                 strcmp(json_string_value(formula), "w8a8") == 0)))
        return false;
    if (weight_error && !json_is_number(weight_error)) return false;
    if (rows && !is_count(rows)) return false;
    return !is_w8a8(w) || (weight_error && rows); /* a W8A8 row says how much is the weights' */
}

bool drv_gate_print_table(const json_t *gate, FILE *out) {
    const json_t *limit = json_object_get(gate, "max_layer_error"),
                 *ids = json_object_get(gate, "calibration_ids"), *weights = json_object_get(gate, "weights"),
                 *layers = json_object_get(gate, "layers");
    if (!json_is_number(limit) || !is_count(ids) || !json_is_array(weights) || !json_is_array(layers))
        return false;
    for (size_t i = 0; i < json_array_size(weights); i++) {
        const json_t *w = json_array_get(weights, i), *layer = json_object_get(w, "layer");
        if (!json_is_string(json_object_get(w, "name")) || !(json_is_null(layer) || is_count(layer)) ||
            !json_is_string(json_object_get(w, "quant")) || !json_is_string(json_object_get(w, "method")) ||
            !is_count(json_object_get(w, "group")) || !json_is_number(json_object_get(w, "error")) ||
            !json_is_boolean(json_object_get(w, "kept")) || !formula_fields_valid(w))
            return false;
    }
    for (size_t i = 0; i < json_array_size(layers); i++) {
        const json_t *l = json_array_get(layers, i);
        if (!is_count(json_object_get(l, "layer")) || !is_count(json_object_get(l, "weights")) ||
            !json_is_number(json_object_get(l, "max_error")) ||
            !json_is_string(json_object_get(l, "worst")) || !is_count(json_object_get(l, "kept")))
            return false;
    }
    size_t w8a8 = 0;
    for (size_t i = 0; i < json_array_size(weights); i++)
        w8a8 += is_w8a8(json_array_get(weights, i));
    fprintf(out,
            "accuracy gate: relative output error on the calibration inputs (%lld ids); kept unquantized "
            "over %g\n",
            (long long)json_integer_value(ids), json_number_value(limit));
    if (w8a8 < json_array_size(weights))
        fprintf(out,
                "  X^T X: ||X W^T - X Wq^T||_F / ||X W^T||_F over every token (the weight's error alone)\n");
    if (w8a8)
        fprintf(
            out,
            "  W8A8:  ||X W^T - Q(X) Wq^T||_F / ||X W^T||_F on sampled input rows, Q the matmul's activation "
            "quantization\n");
    fprintf(out, "  %5s  %-48s %-16s %9s  %-9s  %s\n", "layer", "weight", "format", "error", "decision",
            "measured");
    size_t kept = 0;
    for (size_t i = 0; i < json_array_size(weights); i++) {
        const json_t *w = json_array_get(weights, i), *layer = json_object_get(w, "layer");
        char index[24] = "-", format[48];
        if (!json_is_null(layer)) snprintf(index, sizeof index, "%lld", (long long)json_integer_value(layer));
        char quant[16], method[16], name[NAME_MAX_PRINTED];
        snprintf(format, sizeof format, "%s g%lld %s",
                 printable(json_string_value(json_object_get(w, "quant")), quant, sizeof quant),
                 (long long)json_integer_value(json_object_get(w, "group")),
                 printable(json_string_value(json_object_get(w, "method")), method, sizeof method));
        bool is_kept = json_is_true(json_object_get(w, "kept"));
        kept += is_kept;
        char measured[96] = "X^T X";
        if (is_w8a8(w))
            snprintf(measured, sizeof measured, "W8A8, %lld rows (X^T X %.5f)",
                     (long long)json_integer_value(json_object_get(w, "sample_rows")),
                     json_number_value(json_object_get(w, "weight_error")));
        fprintf(out, "  %5s  %-48s %-16s %9.5f  %-9s  %s\n", index,
                printable(json_string_value(json_object_get(w, "name")), name, sizeof name), format,
                json_number_value(json_object_get(w, "error")), is_kept ? "kept" : "quantized", measured);
    }
    fprintf(out, "  %5s  %7s  %9s  %-48s %s\n", "layer", "weights", "max error", "worst weight", "kept");
    for (size_t i = 0; i < json_array_size(layers); i++) {
        const json_t *l = json_array_get(layers, i);
        char worst[NAME_MAX_PRINTED];
        fprintf(out, "  %5lld  %7lld  %9.5f  %-48s %lld\n",
                (long long)json_integer_value(json_object_get(l, "layer")),
                (long long)json_integer_value(json_object_get(l, "weights")),
                json_number_value(json_object_get(l, "max_error")),
                printable(json_string_value(json_object_get(l, "worst")), worst, sizeof worst),
                (long long)json_integer_value(json_object_get(l, "kept")));
    }
    fprintf(out, "  kept unquantized: %zu of %zu weights\n", kept, json_array_size(weights));
    return true;
}

void drv_gate_print(const drv_gate *g, FILE *out) {
    json_t *table = drv_gate_to_json(g);
    if (table) drv_gate_print_table(table, out);
    json_decref(table);
}
