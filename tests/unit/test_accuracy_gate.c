/* test_accuracy_gate.c - the accuracy gate's W8A8 error (driver/accuracy_gate.h):
 * drv_gate_w8a8_error against a double loop over hand-made rows whose
 * activation codes are worked out by hand (int8 with SmoothQuant column
 * scales, E4M3 per token, E4M3 with a static scale); calibration's row
 * sample (quant/calib.h); and the gate on real models: under fp8 and int8
 * every W8A8 matmul (and every W8A8 stack of experts) is measured on the
 * sampled rows, with more error than its weights' alone, and a limit
 * between the two keeps a weight that the weights-only formula would have
 * quantized. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "accuracy_gate.h"
#include "pass.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define DEMO SMELT_SOURCE_DIR "/tests/fixtures/demo"
#define LLAMA SMELT_SOURCE_DIR "/tests/fixtures/llama"
#define MIXTRAL SMELT_SOURCE_DIR "/tests/fixtures/mixtral"
#define TINY_IDS SMELT_SOURCE_DIR "/tests/fixtures/quant/calib_tiny_ids.bin"

enum { N = 3, K = 4, T = 3 };

/* W[N][K], the checkpoint's values. */
static const float weights[N][K] = {
    {0.5f, -1.0f, 0.25f, 2.0f}, {1.5f, 0.1f, -0.7f, 0.3f}, {-0.2f, 0.9f, 0.4f, -1.1f}};

/* A quantized W in format f (one scale per output channel), with column
 * scales c when given. */
static quant_tensor quantized(quant_kind kind, const float *c) {
    quant_tensor t = {.format = {.kind = kind,
                                 .method = c ? QUANT_METHOD_SMOOTH : QUANT_METHOD_RTN,
                                 .group = K,
                                 .has_column_scale = c != NULL}};
    assert_null(quant_layout_of(&t.format, N, K, &t.layout));
    t.data = calloc(1, t.layout.total);
    assert_non_null(t.data);
    assert_null(quant_rtn(&weights[0][0], c, &t));
    return t;
}

/* The value of t's code (n, k) without any scale, from the layout's raw
 * code: an int8 integer, or an E4M3 byte decoded by its bits. */
static double weight_code(const quant_tensor *t, uint64_t n, uint64_t k) {
    unsigned code = quant_code(t, n, k);
    if (t->format.kind == QUANT_INT8) return (int8_t)code;
    int sign = code & 0x80 ? -1 : 1, exponent = (code >> 3) & 15, mantissa = code & 7;
    return sign * (exponent ? ldexp(1 + mantissa / 8.0, exponent - 7) : ldexp(mantissa / 8.0, -6));
}

/* By the double loop: sum over rows t and outputs n of (y - ŷ)^2 and of
 * y^2, y = x_t . w_n, ŷ = s_t s_w[n] sum_k code[t][k] wcode[n][k]. */
static void by_hand(const quant_tensor *w, const float x[T][K], const double codes[T][K],
                    const double scales[T], double *error, double *output) {
    *error = *output = 0;
    for (int t = 0; t < T; t++)
        for (int n = 0; n < N; n++) {
            double y = 0, q = 0;
            for (int k = 0; k < K; k++) {
                y += (double)x[t][k] * weights[n][k];
                q += codes[t][k] * weight_code(w, n, k);
            }
            q *= scales[t] * quant_scale(w, n, 0);
            *error += (y - q) * (y - q);
            *output += y * y;
        }
}

static void assert_sums(const quant_tensor *w, quant_kind act, float static_scale, const float x[T][K],
                        const double codes[T][K], const double scales[T]) {
    double error = 0, output = 0, want_error, want_output;
    assert_true(drv_gate_w8a8_error(&weights[0][0], w, act, static_scale, &x[0][0], T, &error, &output));
    by_hand(w, x, codes, scales, &want_error, &want_output);
    assert_true(want_error > 0);
    assert_true(fabs(error - want_error) <= 1e-12 * want_error);
    assert_true(fabs(output - want_output) <= 1e-12 * want_output);
}

/* int8 with SmoothQuant column scales c = (2, 0.5, 1, 4): a row becomes
 * codes of x * c / s, s = max |x * c| / 127, rint, clamped to 127. */
static void test_int8_smooth_by_hand(void **state) {
    (void)state;
    static const float c[K] = {2.0f, 0.5f, 1.0f, 4.0f};
    quant_tensor w = quantized(QUANT_INT8, c);
    static const float x[T][K] = {{10.0f, -3.0f, 0.7f, 1.0f}, {0.02f, 0.4f, -0.3f, 0.01f}, {0, 0, 0, 0}};
    /* x * c = (20, -1.5, 0.7, 4): s = 20 / 127, codes rint(127, -9.525, 4.445, 25.4);
     * (0.04, 0.2, -0.3, 0.04): s = 0.3 / 127, rint(16.93, 84.67, -127, 16.93);
     * a row of zeros: s = 1, codes 0 */
    static const double codes[T][K] = {{127, -10, 4, 25}, {17, 85, -127, 17}, {0, 0, 0, 0}};
    const double scales[T] = {20.0f / 127.0f, 0.3f / 127.0f, 1.0};
    assert_sums(&w, QUANT_INT8, 0.0f, x, codes, scales);
    free(w.data);
}

/* E4M3 per token: s = max |x| / 448, codes x / s rounded to E4M3 (steps of
 * 8 in [64, 128), 16 in [128, 256), 32 in [256, 448]). */
static void test_fp8_token_by_hand(void **state) {
    (void)state;
    quant_tensor w = quantized(QUANT_FP8, NULL);
    static const float x[T][K] = {{2.0f, 1.0f, -0.5f, 0.3f}, {0.1f, -0.25f, 0.2f, 0.05f}, {0, 0, 0, 0}};
    /* x / s = (448, 224, -112, 67.2) -> 67.2 to 64;
     * (179.2, -448, 358.4, 89.6) -> 176, 352, 88 */
    static const double codes[T][K] = {{448, 224, -112, 64}, {176, -448, 352, 88}, {0, 0, 0, 0}};
    const double scales[T] = {2.0f / 448.0f, 0.25f / 448.0f, 1.0};
    assert_sums(&w, QUANT_FP8, 0.0f, x, codes, scales);
    free(w.data);
}

/* E4M3 with a static scale 0.008 for every row (act_scale tensor): x / s,
 * saturating to 448. */
static void test_fp8_static_by_hand(void **state) {
    (void)state;
    quant_tensor w = quantized(QUANT_FP8, NULL);
    static const float x[T][K] = {{2.0f, 1.0f, -0.5f, 0.3f}, {5.0f, -0.09f, 0.0f, 1.7f}, {0, 0, 0, 0}};
    /* x / s = (250, 125, -62.5, 37.5) -> 256, 128, -64, 36 (steps of 4 in [32, 64));
     * (625, -11.25, 0, 212.5) -> 448 (saturated), -11 (steps of 1 in [8, 16)), 0, 208 */
    static const double codes[T][K] = {{256, 128, -64, 36}, {448, -11, 0, 208}, {0, 0, 0, 0}};
    const double scales[T] = {0.008f, 0.008f, 0.008f};
    assert_sums(&w, QUANT_FP8, 0.008f, x, codes, scales);
    free(w.data);
}

/* The row sample: every row while it has room, in order; then a uniform
 * sample without replacement of all rows seen, the same one each time. */
static void test_row_sample(void **state) {
    (void)state;
    quant_act_stats s, again;
    assert_true(quant_act_stats_init(&s, 2, false));
    assert_true(quant_act_stats_keep_sample(&s, 200));
    for (int i = 0; i < 150; i++) {
        float row[2] = {(float)i, -(float)i};
        quant_act_stats_add(&s, row, 1);
    }
    assert_int_equal(s.sample_rows, 150);
    for (int i = 0; i < 150; i++)
        assert_true(s.sample[2 * i] == (float)i && s.sample[2 * i + 1] == -(float)i);
    float *rows = malloc(9850 * 2 * sizeof *rows);
    assert_non_null(rows);
    for (int i = 150; i < 10000; i++)
        rows[2 * (i - 150)] = (float)i, rows[2 * (i - 150) + 1] = -(float)i;
    quant_act_stats_add(&s, rows, 9850);
    assert_int_equal(s.sample_rows, 200);
    assert_int_equal(s.tokens, 10000);
    bool seen[10000] = {false};
    double mean = 0;
    for (int i = 0; i < 200; i++) {
        float v = s.sample[2 * i];
        assert_true(v >= 0 && v < 10000 && v == floorf(v) && s.sample[2 * i + 1] == -v);
        assert_false(seen[(int)v]); /* without replacement */
        seen[(int)v] = true;
        mean += v / 200;
    }
    /* uniform over the 10000 rows: mean 4999.5, standard deviation ~204 (a fixed seed: no flakes) */
    assert_true(fabs(mean - 4999.5) < 1000);
    assert_true(quant_act_stats_init(&again, 2, false));
    assert_true(quant_act_stats_keep_sample(&again, 200));
    for (int i = 0; i < 150; i++) {
        float row[2] = {(float)i, -(float)i};
        quant_act_stats_add(&again, row, 1);
    }
    quant_act_stats_add(&again, rows, 9850);
    assert_memory_equal(s.sample, again.sample, 200 * 2 * sizeof(float));
    assert_false(quant_act_stats_keep_sample(&again, 10)); /* rows were added */
    free(rows);
    quant_act_stats_free(&s);
    quant_act_stats_free(&again);
}

/* The table of a plan's "accuracy_gate" (untrusted): a W8A8 row prints its
 * sample and X^T X number; a row from a plan written before the W8A8
 * formula (no "formula") prints as X^T X; a bad formula, or a W8A8 row
 * without its X^T X number, is refused. */
static void test_table_rows(void **state) {
    (void)state;
    static const char head[] =
        "{\"max_layer_error\": 0.05, \"calibration_ids\": 8, \"layers\": [], \"weights\": [{"
        "\"name\": \"w\", \"layer\": null, \"quant\": \"fp8\", \"method\": \"rtn\", "
        "\"group\": 4, \"error\": 0.03, \"kept\": false";
    const struct {
        const char *fields, *printed; /* NULL: refused */
    } cases[] = {
        {", \"formula\": \"w8a8\", \"weight_error\": 0.02, \"sample_rows\": 8",
         "W8A8, 8 rows (X^T X 0.02000)"},
        {"", "quantized  X^T X"},
        {", \"formula\": \"xtx\", \"weight_error\": 0.03", "quantized  X^T X"},
        {", \"formula\": \"w4a4\", \"weight_error\": 0.03", NULL},
        {", \"formula\": \"w8a8\", \"sample_rows\": 8", NULL},
        {", \"formula\": 1", NULL},
        {", \"formula\": \"w8a8\", \"weight_error\": 0.02, \"sample_rows\": -1", NULL},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
        char text[1024], printed[4096] = "";
        snprintf(text, sizeof text, "%s%s}]}", head, cases[i].fields);
        json_t *gate = json_loads(text, 0, NULL);
        assert_non_null(gate);
        FILE *out = fmemopen(printed, sizeof printed - 1, "w");
        assert_non_null(out);
        bool ok = drv_gate_print_table(gate, out);
        fclose(out);
        json_decref(gate);
        assert_int_equal(ok, cases[i].printed != NULL);
        if (cases[i].printed && !strstr(printed, cases[i].printed))
            fail_msg("case %zu: '%s' not in\n%s", i, cases[i].printed, printed);
    }
}

/* A model to gate, calibrated on `ids` (the first max_ids; 0: all) with
 * XᵀX and a sample of DRV_CALIB_SAMPLE_ROWS rows of each input. With
 * first_layers, only its first layers (`--set num_hidden_layers=...`; the
 * later layers' tensors knowingly unused): the gate's work grows with every
 * weight it measures, and what is asserted of each weight does not need
 * more of them. */
typedef struct gated_model {
    const char *model, *config, *weights, *ids;
    unsigned max_ids;
    const char *first_layers;                    /* NULL: every layer */
    const char *unused_layers[DRV_MAX_SETTINGS]; /* with first_layers: the later ones' tensors */
    uint32_t gated_weights;                      /* the weights the gate measures under fp8 and int8 */
} gated_model;

static drv_source_options source_of(const gated_model *g) {
    drv_source_options source = {.config_path = g->config};
    if (g->first_layers) assert_true(drv_source_options_set(&source, "num_hidden_layers", g->first_layers));
    for (int i = 0; g->unused_layers[i]; i++)
        assert_true(drv_source_options_allow_unused_tensor(&source, g->unused_layers[i]));
    return source;
}

static bool calibrate(const gated_model *g, drv_calibration *cal, diag_engine *d) {
    drv_model_options o = drv_model_options_default();
    o.model_path = g->model;
    o.source = source_of(g);
    o.weights_path = g->weights;
    drv_calib_options c = {
        .ids_path = g->ids, .max_ids = g->max_ids, .xtx = true, .sample_rows = DRV_CALIB_SAMPLE_ROWS};
    return drv_calibrate(&o, &c, cal, d);
}

static void run_gate(const gated_model *g, drv_precision p, const char *act_quant, double limit,
                     const drv_calibration *cal, drv_gate *gate, diag_engine *d) {
    drv_source_options source = source_of(g);
    drv_lowering l = {.precision = p,
                      .precision_options = {.act_quant = act_quant, .max_layer_error = limit},
                      .weights_path = g->weights};
    pass_act_scale *scales = NULL;
    assert_true(drv_calibration_act_scales(cal, &scales, &l.act_scale_count, d));
    l.act_scales = scales;
    assert_true(drv_gate_run(g->model, &source, &l, cal, gate, d));
    free(scales);
}

/* Every weight of g under p is W8A8, measured on the sample, with more
 * error than its weights' alone (the activations' rounding adds to it).
 * With `between`: a limit between the two numbers of the weight where they
 * differ most keeps it (the weights-only formula would have quantized it),
 * and keeps exactly the weights whose W8A8 error is over it (a second run
 * of the gate: its XᵀX forms are what a Debug build spends its time on). */
static void check_w8a8_gate(const gated_model *g, drv_precision p, const char *act_quant,
                            const drv_calibration *cal, bool between_limit) {
    diag_engine d;
    diag_init(&d, stderr);
    drv_gate gate;
    run_gate(g, p, act_quant, 1.0, cal, &gate, &d);
    assert_int_equal(gate.weight_count, g->gated_weights);
    uint32_t widest = 0;
    for (uint32_t i = 0; i < gate.weight_count; i++) {
        const drv_gate_weight *w = &gate.weights[i];
        assert_int_equal(w->formula, DRV_GATE_W8A8);
        assert_true(w->sample_rows > 0);
        assert_true(w->weight_error > 0);
        if (!(w->error > w->weight_error))
            fail_msg("%s: W8A8 error %g is not above the weights' %g", w->name, w->error, w->weight_error);
        assert_false(w->kept);
        if (w->error / w->weight_error > gate.weights[widest].error / gate.weights[widest].weight_error)
            widest = i;
    }
    if (!between_limit) {
        drv_gate_free(&gate);
        diag_free(&d);
        return;
    }
    double limit = (gate.weights[widest].error + gate.weights[widest].weight_error) / 2;
    drv_gate between;
    run_gate(g, p, act_quant, limit, cal, &between, &d);
    assert_int_equal(between.weight_count, gate.weight_count);
    assert_true(between.weights[widest].kept);
    assert_true(between.weights[widest].weight_error <= limit); /* today's formula: quantized */
    for (uint32_t i = 0; i < between.weight_count; i++) {
        assert_string_equal(between.weights[i].name, gate.weights[i].name);
        assert_true(between.weights[i].error == gate.weights[i].error); /* the same calibration, the same */
        if (strstr(between.weights[i].name, "experts") == NULL)         /* a moe keeps gate and up together */
            assert_int_equal(between.weights[i].kept, gate.weights[i].error > limit);
    }
    drv_gate_free(&between);
    drv_gate_free(&gate);
    diag_free(&d);
}

/* The demo model (trained weights) cut to its first layer (its seven
 * weights; the gate on all four layers took most of this test's time in a
 * Debug build), on the first 512 of its calibration ids (two windows), of
 * which the gate measures a sample of 256 rows; one calibration (f32,
 * whatever the preset) serves the three presets. */
static const gated_model demo = {
    .model = SMELT_SOURCE_DIR "/examples/llama.smelt",
    .config = DEMO "/config.json",
    .weights = DEMO "/model.safetensors",
    .ids = DEMO "/calib_ids.bin",
    .max_ids = 512,
    .first_layers = "1",
    .unused_layers = {"model.layers.1.*", "model.layers.2.*", "model.layers.3.*"},
    .gated_weights = 8}; /* q, k, v, o, gate, up, down and the head */
static drv_calibration demo_calibration;

static int calibrate_demo(void **state) {
    (void)state;
    diag_engine d;
    diag_init(&d, stderr);
    bool ok = calibrate(&demo, &demo_calibration, &d);
    diag_free(&d);
    return ok ? 0 : -1;
}

static int free_demo(void **state) {
    (void)state;
    drv_calibration_free(&demo_calibration);
    return 0;
}

/* E4M3 per token rounds the activations about as much as the weights (the
 * W8A8 error about sqrt(2) times the weights'). */
static void test_demo_fp8(void **state) {
    (void)state;
    check_w8a8_gate(&demo, DRV_PRECISION_FP8, NULL, &demo_calibration, true);
}

/* E4M3 with static per-tensor scales (calibration's max |x| / 448). */
static void test_demo_fp8_static(void **state) {
    (void)state;
    check_w8a8_gate(&demo, DRV_PRECISION_FP8, "tensor", &demo_calibration, false);
}

/* int8 per token after SmoothQuant's migration. */
static void test_demo_int8(void **state) {
    (void)state;
    check_w8a8_gate(&demo, DRV_PRECISION_INT8, NULL, &demo_calibration, false);
}

/* MoE experts (the Mixtral fixture, random weights): the stacks are W8A8
 * too, measured on each expert's sampled (token, chosen expert) rows. */
static void test_mixtral_fp8_experts(void **state) {
    (void)state;
    const gated_model mixtral = {.model = SMELT_SOURCE_DIR "/examples/mixtral.smelt",
                                 .config = MIXTRAL "/config.json",
                                 .weights = MIXTRAL "/model.safetensors",
                                 .ids = TINY_IDS,
                                 .gated_weights = 15}; /* two layers' q, k, v, o and three stacks; the head */
    diag_engine d;
    diag_init(&d, stderr);
    drv_calibration cal;
    assert_true(calibrate(&mixtral, &cal, &d));
    check_w8a8_gate(&mixtral, DRV_PRECISION_FP8, NULL, &cal, true);
    drv_calibration_free(&cal);
    diag_free(&d);
}

/* Weight-only presets keep the XᵀX formula: int8 --act-quant none, even
 * with a sample at hand. */
static void test_weight_only_keeps_xtx(void **state) {
    (void)state;
    const gated_model llama = {.model = SMELT_SOURCE_DIR "/examples/llama.smelt",
                               .config = LLAMA "/config.json",
                               .weights = LLAMA "/model.safetensors",
                               .ids = TINY_IDS};
    diag_engine d;
    diag_init(&d, stderr);
    drv_calibration cal;
    assert_true(calibrate(&llama, &cal, &d));
    drv_gate gate;
    run_gate(&llama, DRV_PRECISION_INT8, "none", 1.0, &cal, &gate, &d);
    assert_true(gate.weight_count > 0);
    for (uint32_t i = 0; i < gate.weight_count; i++) {
        assert_int_equal(gate.weights[i].formula, DRV_GATE_XTX);
        assert_true(gate.weights[i].error == gate.weights[i].weight_error);
    }
    drv_gate_free(&gate);
    drv_calibration_free(&cal);
    diag_free(&d);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_int8_smooth_by_hand), cmocka_unit_test(test_fp8_token_by_hand),
        cmocka_unit_test(test_fp8_static_by_hand),  cmocka_unit_test(test_row_sample),
        cmocka_unit_test(test_table_rows),          cmocka_unit_test(test_weight_only_keeps_xtx),
        cmocka_unit_test(test_mixtral_fp8_experts),
    };
    const struct CMUnitTest on_demo[] = {
        cmocka_unit_test(test_demo_fp8),
        cmocka_unit_test(test_demo_fp8_static),
        cmocka_unit_test(test_demo_int8),
    };
    int failed = cmocka_run_group_tests(tests, NULL, NULL);
    return failed + cmocka_run_group_tests_name("demo", on_demo, calibrate_demo, free_demo);
}
