/* test_calibrate.c - calibration (driver/calibrate.c) on tests/fixtures/llama:
 * mean |x|, max |x| and XᵀX of three matmul inputs against the same
 * statistics captured from Hugging Face transformers with forward pre-hooks
 * (tests/reference/make_calib_fixture.py); weights that share an input share
 * one record; bad ids files are refused with a message; a moe op's experts
 * get a record each, over the tokens routed to them, and their stacks one
 * static fp8 scale each over all of them. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "calibrate.h"
#include "pass.h"
#include "safetensors.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FIXTURE SMELT_SOURCE_DIR "/tests/fixtures/llama"
#define MODEL SMELT_SOURCE_DIR "/examples/llama.smelt"
#define QWEN2_MOE SMELT_SOURCE_DIR "/tests/fixtures/qwen2_moe"

static drv_model_options llama_options(void) {
    drv_model_options o = drv_model_options_default();
    o.model_path = MODEL;
    o.source.config_path = FIXTURE "/config.json";
    o.weights_path = FIXTURE "/model.safetensors";
    return o;
}

static void read_exact(FILE *f, void *dst, size_t bytes) { assert_int_equal(fread(dst, 1, bytes, f), bytes); }

static uint32_t read_u32(FILE *f) {
    uint8_t b[4];
    read_exact(f, b, 4);
    return (uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16 | (uint32_t)b[3] << 24;
}

/* max |a - b| <= 1e-4 * max |b|: the fp32 reference's bound against PyTorch. */
static void assert_close_f32(const float *b, const double *a_or_null, const float *a_f32, uint64_t n) {
    double scale = 0, worst = 0;
    for (uint64_t i = 0; i < n; i++)
        scale = fabs(b[i]) > scale ? fabs(b[i]) : scale;
    for (uint64_t i = 0; i < n; i++) {
        double a = a_or_null ? a_or_null[i] : a_f32[i];
        worst = fabs(a - b[i]) > worst ? fabs(a - b[i]) : worst;
    }
    assert_true(scale > 0);
    assert_true(worst <= 1e-4 * scale);
}

static void test_matches_transformers(void **state) {
    (void)state;
    FILE *f = fopen(SMELT_SOURCE_DIR "/tests/fixtures/quant/calib_llama.bin", "rb");
    assert_non_null(f);
    char magic[8];
    read_exact(f, magic, 8);
    assert_memory_equal(magic, "CALIBFX1", 8);
    uint32_t id_count = read_u32(f), context = read_u32(f), records = read_u32(f);
    char ids_path[] = "/tmp/smelt-calib-ids-XXXXXX";
    int fd = mkstemp(ids_path);
    assert_true(fd >= 0);
    FILE *ids = fdopen(fd, "w");
    for (uint32_t i = 0; i < id_count; i++)
        fprintf(ids, "%u%s", read_u32(f), i + 1 < id_count ? "," : "\n");
    fclose(ids);

    drv_model_options model = llama_options();
    drv_calib_options o = {.ids_path = ids_path, .context = context, .xtx = true};
    drv_calibration cal;
    diag_engine d;
    diag_init(&d, stderr);
    assert_true(drv_calibrate(&model, &o, &cal, &d));
    unlink(ids_path);
    assert_int_equal(cal.ids, id_count);
    /* per layer the q/k/v input, o's, gate/up's and down's; then lm_head's */
    assert_int_equal(cal.input_count, 2 * 4 + 1);
    assert_int_equal(cal.weight_count, 2 * 7 + 1);

    for (uint32_t r = 0; r < records; r++) {
        char name[256] = {0};
        uint32_t length = read_u32(f);
        assert_true(length < sizeof name);
        read_exact(f, name, length);
        uint32_t cols = read_u32(f), tokens = read_u32(f);
        float *mean = malloc(cols * sizeof *mean), *absmax = malloc(cols * sizeof *absmax);
        float *xtx = malloc((size_t)cols * cols * sizeof *xtx), *ours = malloc(cols * sizeof *ours);
        read_exact(f, mean, cols * sizeof *mean);
        read_exact(f, absmax, cols * sizeof *absmax);
        read_exact(f, xtx, (size_t)cols * cols * sizeof *xtx);
        const quant_act_stats *s = drv_calibration_stats(&cal, name);
        assert_non_null(s);
        assert_int_equal(s->cols, cols);
        assert_int_equal(s->tokens, tokens);
        quant_act_stats_mean_abs(s, ours);
        assert_close_f32(mean, NULL, ours, cols);
        assert_close_f32(absmax, NULL, s->absmax, cols);
        assert_close_f32(xtx, s->xtx, NULL, (uint64_t)cols * cols);
        free(mean), free(absmax), free(xtx), free(ours);
    }
    assert_int_equal(fgetc(f), EOF);
    fclose(f);

    /* Shared inputs share one record. */
    const quant_act_stats *q = drv_calibration_stats(&cal, "model.layers.0.self_attn.q_proj.weight");
    assert_ptr_equal(drv_calibration_stats(&cal, "model.layers.0.self_attn.k_proj.weight"), q);
    assert_ptr_equal(drv_calibration_stats(&cal, "model.layers.0.self_attn.v_proj.weight"), q);
    assert_ptr_equal(drv_calibration_stats(&cal, "model.layers.1.mlp.up_proj.weight"),
                     drv_calibration_stats(&cal, "model.layers.1.mlp.gate_proj.weight"));
    const quant_act_stats *down = drv_calibration_stats(&cal, "model.layers.1.mlp.down_proj.weight");
    assert_non_null(down);
    assert_int_equal(down->cols, 128);
    assert_null(drv_calibration_stats(&cal, "model.embed_tokens.weight")); /* no matmul reads it */
    drv_calibration_free(&cal);
    diag_free(&d);
}

static void test_bad_ids(void **state) {
    (void)state;
    drv_model_options model = llama_options();
    drv_calib_options o = {.ids_path = SMELT_SOURCE_DIR "/tests/fixtures/no-such-ids.bin"};
    drv_calibration cal;
    char *text = NULL;
    size_t size = 0;
    FILE *log = open_memstream(&text, &size);
    diag_engine d;
    diag_init(&d, log);
    assert_false(drv_calibrate(&model, &o, &cal, &d));
    assert_int_equal(cal.input_count, 0);
    /* an id outside the vocabulary: the reference step refuses it */
    char ids_path[] = "/tmp/smelt-calib-ids-XXXXXX";
    int fd = mkstemp(ids_path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, "1,2,500", 7), 7);
    close(fd);
    o.ids_path = ids_path;
    assert_false(drv_calibrate(&model, &o, &cal, &d));
    unlink(ids_path);
    diag_free(&d);
    fclose(log);
    assert_non_null(strstr(text, "no-such-ids.bin"));
    assert_non_null(strstr(text, "500"));
    free(text);
}

/* *cal (with XᵀX, contexts of 32) of `model` on 96 pseudo-random ids below
 * 97 (an LCG from `seed`) in a temporary file; *d initialised for it. */
static void calibrate_on_random_ids(const drv_model_options *model, uint32_t seed, drv_calibration *cal,
                                    diag_engine *d) {
    char path[] = "/tmp/smelt-calib-ids-XXXXXX";
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    FILE *ids = fdopen(fd, "w");
    assert_non_null(ids);
    uint32_t x = seed;
    for (int i = 0; i < 96; i++) {
        x = x * 1664525u + 1013904223u;
        fprintf(ids, "%u ", (x >> 8) % 97);
    }
    fclose(ids);
    diag_init(d, stderr);
    assert_true(
        drv_calibrate(model, &(drv_calib_options){.ids_path = path, .context = 32, .xtx = true}, cal, d));
    unlink(path);
}

/* The output error on the calibration tokens (through s's XᵀX) of weight
 * `name`, w [rows][cols], quantized int4 in groups of 32 with zero points by
 * round to nearest, AWQ and GPTQ: error[0], [1], [2]. */
static void three_methods_errors(const char *name, const float *w, uint64_t rows, uint64_t cols,
                                 const drv_calibration *cal, const quant_act_stats *s, double error[3],
                                 diag_engine *d) {
    const quant_format formats[3] = {{QUANT_INT4, QUANT_METHOD_RTN, 32, true, false, false, false},
                                     {QUANT_INT4, QUANT_METHOD_AWQ, 32, true, false, true, false},
                                     {QUANT_INT4, QUANT_METHOD_GPTQ, 32, true, false, false, false}};
    for (int m = 0; m < 3; m++) {
        quant_tensor q = {.format = formats[m]};
        assert_null(quant_layout_of(&q.format, rows, cols, &q.layout));
        q.data = calloc(1, q.layout.total);
        assert_non_null(q.data);
        if (m == 0)
            assert_null(quant_rtn(w, NULL, &q));
        else
            assert_true(drv_quantize_calibrated(name, w, cal, &q, d));
        error[m] = quant_output_error(w, &q, s->xtx);
        free(q.data);
    }
}

/* The calibrated quantizers on the fixture's real statistics: for every
 * matmul weight, AWQ and GPTQ (int4, groups of 32) make less output error
 * on the calibration tokens than round to nearest. */
static void test_quantize_calibrated(void **state) {
    (void)state;
    drv_model_options model = llama_options();
    drv_calibration cal;
    diag_engine d;
    calibrate_on_random_ids(&model, 99, &cal, &d);
    st_file f;
    assert_true(st_file_open(FIXTURE "/model.safetensors", &f, &d));
    unsigned quantized = 0;
    for (uint32_t i = 0; i < f.tensor_count; i++) {
        const st_tensor *t = &f.tensors[i];
        const quant_act_stats *s = drv_calibration_stats(&cal, t->name);
        if (!s) continue;
        uint64_t rows = t->shape[0], cols = t->shape[1];
        float *w = malloc(rows * cols * sizeof *w);
        assert_true(st_tensor_read_f32(t, w, &d));
        double error[3];
        three_methods_errors(t->name, w, rows, cols, &cal, s, error, &d);
        printf("%-40s rtn %.4g  awq %.4g (%.0f%%)  gptq %.4g (%.0f%%)\n", t->name, error[0], error[1],
               100 * (1 - error[1] / error[0]), error[2], 100 * (1 - error[2] / error[0]));
        assert_true(error[1] < error[0]);
        assert_true(error[2] < error[0]);
        quantized++;
        free(w);
    }
    assert_int_equal(quantized, 2 * 7 + 1);
    /* A weight calibration never saw, a method that learns nothing, no calibration. */
    float w[64 * 64] = {0};
    quant_tensor q = {.format = {QUANT_INT4, QUANT_METHOD_GPTQ, 32, true, false, false, false}};
    assert_null(quant_layout_of(&q.format, 64, 64, &q.layout));
    q.data = calloc(1, q.layout.total);
    char *text = NULL;
    size_t size = 0;
    FILE *log = open_memstream(&text, &size);
    diag_engine quiet;
    diag_init(&quiet, log);
    assert_false(drv_quantize_calibrated("model.embed_tokens.weight", w, &cal, &q, &quiet));
    assert_false(drv_quantize_calibrated("model.layers.0.self_attn.q_proj.weight", w, NULL, &q, &quiet));
    q.format.method = QUANT_METHOD_RTN;
    assert_false(drv_quantize_calibrated("model.layers.0.self_attn.q_proj.weight", w, &cal, &q, &quiet));
    diag_free(&quiet);
    fclose(log);
    assert_non_null(
        strstr(text, "cannot quantize weight 'model.embed_tokens.weight' (gptq): it needs calibration"));
    free(text);
    free(q.data);
    st_file_close(&f);
    drv_calibration_free(&cal);
    diag_free(&d);
}

/* The experts of a moe op, calibrated on the tokens routed to each
 * (qwen2_moe: 4 experts, top 2, in layer 1 beside a shared expert whose
 * matmuls read the same input): over the experts, the records of the
 * gate/up input (one per expert, gate and up sharing it) add up to top_k
 * times the shared expert's, each token having gone to top_k experts; and
 * each expert's AWQ and GPTQ (int4, groups of 32) make less output error on
 * its own tokens than round to nearest. fp8's static scales (--act-quant
 * tensor) give each stack one, under its name template: gate's and up's
 * the max |x| of every token that reached the moe / 448 — the shared
 * expert's, which reads the same x — and down's the max over the experts
 * of their hidden rows' max |h| / 448. */
static void test_experts_calibrated(void **state) {
    (void)state;
    drv_model_options model = drv_model_options_default();
    model.model_path = SMELT_SOURCE_DIR "/examples/qwen2_moe.smelt";
    model.source.config_path = QWEN2_MOE "/config.json";
    model.weights_path = QWEN2_MOE "/model.safetensors";
    drv_calibration cal;
    diag_engine d;
    calibrate_on_random_ids(&model, 7, &cal, &d);
    const quant_act_stats *shared =
        drv_calibration_stats(&cal, "model.layers.1.mlp.shared_expert.gate_proj.weight");
    assert_non_null(shared);
    uint64_t cols = shared->cols, tokens = 0;
    double *abs_sum = calloc(cols, sizeof *abs_sum), *xtx = calloc(cols * cols, sizeof *xtx);
    char name[128];
    for (int e = 0; e < 4; e++) {
        snprintf(name, sizeof name, "model.layers.1.mlp.experts.%d.gate_proj.weight", e);
        const quant_act_stats *s = drv_calibration_stats(&cal, name);
        assert_non_null(s);
        assert_int_equal(s->cols, cols);
        snprintf(name, sizeof name, "model.layers.1.mlp.experts.%d.up_proj.weight", e);
        assert_ptr_equal(drv_calibration_stats(&cal, name), s);
        snprintf(name, sizeof name, "model.layers.1.mlp.experts.%d.down_proj.weight", e);
        const quant_act_stats *down = drv_calibration_stats(&cal, name);
        assert_non_null(down);
        assert_ptr_not_equal(down, s);
        assert_int_equal(down->tokens, s->tokens);
        assert_true(s->tokens > 0 && s->tokens < shared->tokens);
        tokens += s->tokens;
        for (uint64_t k = 0; k < cols; k++)
            abs_sum[k] += s->abs_sum[k];
        for (uint64_t k = 0; k < cols * cols; k++)
            xtx[k] += s->xtx[k];
    }
    assert_int_equal(tokens, 2 * shared->tokens);

    pass_act_scale *scales;
    uint32_t scale_count;
    assert_true(drv_calibration_act_scales(&cal, &scales, &scale_count, &d));
    float want[4] = {0}; /* the shared gate_proj's, the stacks' of gate, up and down */
    bool found[4] = {false};
    static const char *const scale_names[4] = {"model.layers.1.mlp.shared_expert.gate_proj.weight",
                                               "model.layers.1.mlp.experts.{e}.gate_proj.weight",
                                               "model.layers.1.mlp.experts.{e}.up_proj.weight",
                                               "model.layers.1.mlp.experts.{e}.down_proj.weight"};
    for (uint32_t i = 0; i < scale_count; i++)
        for (int n = 0; n < 4; n++)
            if (strcmp(scales[i].weight, scale_names[n]) == 0) {
                assert_false(found[n]);
                found[n] = true;
                want[n] = scales[i].scale;
            }
    assert_true(found[0] && found[1] && found[2] && found[3]);
    assert_true(want[0] > 0.0f);
    assert_true(want[1] == want[0] && want[2] == want[0]);
    float down_absmax = 0.0f;
    for (int e = 0; e < 4; e++) {
        snprintf(name, sizeof name, "model.layers.1.mlp.experts.%d.down_proj.weight", e);
        const quant_act_stats *s = drv_calibration_stats(&cal, name);
        for (uint64_t k = 0; k < s->cols; k++)
            down_absmax = fmaxf(down_absmax, s->absmax[k]);
    }
    assert_true(down_absmax > 0.0f);
    assert_true(want[3] == down_absmax / 448.0f);
    assert_true(want[3] != want[0]);
    free(scales);
    double scale = 0;
    for (uint64_t k = 0; k < cols * cols; k++)
        scale = fmax(scale, fabs(shared->xtx[k]));
    for (uint64_t k = 0; k < cols; k++)
        assert_true(fabs(abs_sum[k] - 2 * shared->abs_sum[k]) <= 1e-9 * 2 * shared->abs_sum[k]);
    for (uint64_t k = 0; k < cols * cols; k++)
        assert_true(fabs(xtx[k] - 2 * shared->xtx[k]) <= 1e-9 * 2 * scale);
    free(abs_sum);
    free(xtx);

    st_file f;
    assert_true(st_file_open(QWEN2_MOE "/model.safetensors", &f, &d));
    static const char *const projections[3] = {"gate_proj", "up_proj", "down_proj"};
    for (int e = 0; e < 4; e++)
        for (int p = 0; p < 3; p++) {
            snprintf(name, sizeof name, "model.layers.1.mlp.experts.%d.%s.weight", e, projections[p]);
            const st_tensor *t = NULL;
            for (uint32_t i = 0; i < f.tensor_count && !t; i++)
                if (strcmp(f.tensors[i].name, name) == 0) t = &f.tensors[i];
            assert_non_null(t);
            const quant_act_stats *s = drv_calibration_stats(&cal, name);
            uint64_t rows = t->shape[0], width = t->shape[1];
            float *w = malloc(rows * width * sizeof *w);
            assert_true(st_tensor_read_f32(t, w, &d));
            double error[3];
            three_methods_errors(name, w, rows, width, &cal, s, error, &d);
            printf("%-44s %3llu tokens: rtn %.4g  awq %.4g  gptq %.4g\n", name, (unsigned long long)s->tokens,
                   error[0], error[1], error[2]);
            assert_true(error[1] < error[0]);
            assert_true(error[2] < error[0]);
            free(w);
        }
    st_file_close(&f);
    drv_calibration_free(&cal);
    diag_free(&d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_transformers),
        cmocka_unit_test(test_bad_ids),
        cmocka_unit_test(test_quantize_calibrated),
        cmocka_unit_test(test_experts_calibrated),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
