/* quant_lab.c - the quantization lab: calibrates a model on token ids,
 * quantizes each matmul weight with one method, and prints each weight's
 * output error against round to nearest; optionally writes the dequantized
 * weights as an f32 checkpoint, so that `smelt eval --weights` measures the
 * perplexity of exactly those values (what the reference's dequantized
 * matmul computes) before the precision pass can hold them.
 *
 *   bench_quant_lab --model examples/llama.smelt --config tests/fixtures/demo/config.json \
 *       --weights tests/fixtures/demo/model.safetensors --calib tests/fixtures/demo/calib_ids.bin \
 *       --method gptq --group 128 [--measure heldout.txt] [--keep lm_head] [-o dequantized.safetensors]
 *
 * Methods: rtn, awq, awq-clip, gptq, gptq-act (act-order), smooth (int8
 * per channel), int8 (rtn per channel). The error of a weight is
 * ||X W^T - X Ŵ^T||^2 over the calibration tokens (calib.h), or over the
 * --measure ids when given (statistics of other text: out of sample). */
#include "calib.h"
#include "calibrate.h"
#include "calibrated.h"
#include "ir.h"
#include "quant.h"
#include "safetensors.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef struct lab_options {
    drv_model_options model;
    const char *calib, *measure, *method, *keep, *out;
    unsigned group, context;
    bool symmetric;
} lab_options;

static int usage(void) {
    fputs("usage: bench_quant_lab --model M --config C --weights W --calib IDS --method "
          "rtn|awq|awq-clip|gptq|gptq-act|smooth|int8 [--group G] [--symmetric] [--context N] "
          "[--measure IDS] [--keep GLOB] [-o OUT.safetensors]\n",
          stderr);
    return 2;
}

static bool parse(int argc, char **argv, lab_options *o) {
    o->model = drv_model_options_default();
    o->group = 128;
    o->context = 256;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (strcmp(a, "--symmetric") == 0) {
            o->symmetric = true;
            continue;
        }
        if (!v) return false;
        i++;
        if (strcmp(a, "--model") == 0)
            o->model.model_path = v;
        else if (strcmp(a, "--config") == 0)
            o->model.source.config_path = v;
        else if (strcmp(a, "--weights") == 0)
            o->model.weights_path = v;
        else if (strcmp(a, "--calib") == 0)
            o->calib = v;
        else if (strcmp(a, "--measure") == 0)
            o->measure = v;
        else if (strcmp(a, "--method") == 0)
            o->method = v;
        else if (strcmp(a, "--keep") == 0)
            o->keep = v;
        else if (strcmp(a, "-o") == 0)
            o->out = v;
        else if (strcmp(a, "--group") == 0)
            o->group = (unsigned)atoi(v);
        else if (strcmp(a, "--context") == 0)
            o->context = (unsigned)atoi(v);
        else
            return false;
    }
    return o->model.model_path && o->model.weights_path && o->calib && o->method && o->group;
}

/* The format of a method for a weight of `cols` inputs. */
static quant_format format_of(const lab_options *o, uint64_t cols) {
    const char *m = o->method;
    if (strcmp(m, "smooth") == 0)
        return (quant_format){QUANT_INT8, QUANT_METHOD_SMOOTH, (uint32_t)cols, false, false, true, false};
    if (strcmp(m, "int8") == 0)
        return (quant_format){QUANT_INT8, QUANT_METHOD_RTN, (uint32_t)cols, false, false, false, false};
    bool awq = strncmp(m, "awq", 3) == 0, act = strcmp(m, "gptq-act") == 0;
    quant_method method = awq                          ? QUANT_METHOD_AWQ
                          : strncmp(m, "gptq", 4) == 0 ? QUANT_METHOD_GPTQ
                                                       : QUANT_METHOD_RTN;
    return (quant_format){QUANT_INT4, method, o->group, !o->symmetric, act, awq, false};
}

static const char *quantize(const lab_options *o, const float *w, const quant_act_stats *s, quant_tensor *t) {
    const char *m = o->method;
    float *mean = malloc(s->cols * sizeof *mean);
    quant_act_stats_mean_abs(s, mean);
    const char *problem;
    if (strncmp(m, "awq", 3) == 0)
        problem =
            quant_awq(w, mean, s->xtx, &(quant_awq_options){.clip = strcmp(m, "awq-clip") == 0}, t, NULL);
    else if (strncmp(m, "gptq", 4) == 0)
        problem = quant_gptq(w, s->xtx, &(quant_gptq_options){.act_order = t->format.has_group_index}, t);
    else if (strcmp(m, "smooth") == 0)
        problem = quant_smooth(w, s->absmax, 0.5f, t);
    else if (strcmp(m, "rtn") == 0 || strcmp(m, "int8") == 0)
        problem = quant_rtn(w, NULL, t);
    else
        problem = "unknown method";
    free(mean);
    return problem;
}

int main(int argc, char **argv) {
    lab_options o = {0};
    if (!parse(argc, argv, &o)) return usage();
    diag_engine d;
    diag_init(&d, stderr);
    drv_calibration cal, measure;
    drv_calib_options c = {.ids_path = o.calib, .context = o.context, .xtx = true, .progress = true};
    if (!drv_calibrate(&o.model, &c, &cal, &d)) return 1;
    c.ids_path = o.measure;
    if (o.measure && !drv_calibrate(&o.model, &c, &measure, &d)) return 1;
    st_file f;
    if (!st_file_open(o.model.weights_path, &f, &d)) return 1;
    st_write_tensor *out = calloc(f.tensor_count, sizeof *out);
    float **data = calloc(f.tensor_count, sizeof *data);
    double total_rtn = 0, total = 0;
    printf("%-44s %11s %12s %12s %7s\n", "weight", "shape", "rtn error", "error", "ratio");
    for (uint32_t i = 0; i < f.tensor_count; i++) {
        const st_tensor *t = &f.tensors[i];
        uint64_t count = t->byte_size / st_dtype_size(t->dtype);
        data[i] = malloc(count * sizeof(float));
        if (!st_tensor_read_f32(t, data[i], &d)) return 1;
        out[i] = (st_write_tensor){t->name, ST_DTYPE_F32, t->rank, t->shape, data[i]};
        const quant_act_stats *s = drv_calibration_stats(&cal, t->name);
        const quant_act_stats *judge = o.measure ? drv_calibration_stats(&measure, t->name) : s;
        if (!s || t->rank != 2 || t->shape[1] != s->cols ||
            (o.keep && ir_tensor_pattern_matches(o.keep, t->name)))
            continue;
        uint64_t rows = t->shape[0], cols = t->shape[1];
        quant_format qf = format_of(&o, cols), rf = qf;
        rf.method = QUANT_METHOD_RTN, rf.has_column_scale = rf.has_group_index = false;
        quant_tensor q = {.format = qf}, r = {.format = rf};
        if (quant_layout_of(&qf, rows, cols, &q.layout) || quant_layout_of(&rf, rows, cols, &r.layout))
            continue;
        q.data = calloc(1, q.layout.total), r.data = calloc(1, r.layout.total);
        const char *problem = quantize(&o, data[i], s, &q);
        if (problem) {
            fprintf(stderr, "%s: %s\n", t->name, problem);
            return 1;
        }
        quant_rtn(data[i], NULL, &r);
        double e_rtn = quant_output_error(data[i], &r, judge->xtx),
               e = quant_output_error(data[i], &q, judge->xtx);
        total_rtn += e_rtn, total += e;
        char shape[32];
        snprintf(shape, sizeof shape, "%llux%llu", (unsigned long long)rows, (unsigned long long)cols);
        printf("%-44s %11s %12.5g %12.5g %7.3f\n", t->name, shape, e_rtn, e, e / e_rtn);
        quant_dequantize(&q, data[i]);
        free(q.data), free(r.data);
    }
    printf("%-44s %11s %12.5g %12.5g %7.3f\n", "total", "", total_rtn, total, total / total_rtn);
    bool ok = !o.out || st_write_file(o.out, out, f.tensor_count, "{\"format\": \"pt\"}", &d);
    for (uint32_t i = 0; i < f.tensor_count; i++)
        free(data[i]);
    free(data), free(out);
    st_file_close(&f);
    drv_calibration_free(&cal);
    if (o.measure) drv_calibration_free(&measure);
    diag_free(&d);
    return ok ? 0 : 1;
}
