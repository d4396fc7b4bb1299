/* test_quant_awq.c - the calibration statistics (quant/calib.c) against
 * hand-computed values, AWQ (quant/awq.c) and SmoothQuant (quant/smooth.c)
 * against round to nearest on inputs with outlier channels. */
#include "calib.h"
#include "calibrated.h"
#include "quant.h"
#include "quant_synthetic.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <cmocka.h>

static quant_tensor make(quant_format f, uint64_t rows, uint64_t cols) {
    quant_tensor t = {.format = f};
    assert_null(quant_layout_of(&f, rows, cols, &t.layout));
    t.data = calloc(1, t.layout.total);
    assert_non_null(t.data);
    return t;
}

static void test_stats_by_hand(void **state) {
    (void)state;
    /* x = [[1, -2, 0], [3, 1, -1]] in two calls: mean |x| = {2, 1.5, 0.5},
     * absmax {3, 2, 1}, XᵀX = [[10, 1, -3], [1, 5, -1], [-3, -1, 1]]. */
    float x[6] = {1, -2, 0, 3, 1, -1};
    quant_act_stats s;
    assert_true(quant_act_stats_init(&s, 3, true));
    quant_act_stats_add(&s, x, 1);
    quant_act_stats_add(&s, x + 3, 1);
    assert_int_equal(s.tokens, 2);
    float mean[3];
    quant_act_stats_mean_abs(&s, mean);
    const float want_mean[3] = {2, 1.5f, 0.5f}, want_max[3] = {3, 2, 1};
    const double want_xtx[9] = {10, 1, -3, 1, 5, -1, -3, -1, 1};
    for (int k = 0; k < 3; k++)
        assert_true(mean[k] == want_mean[k]), assert_true(s.absmax[k] == want_max[k]);
    for (int i = 0; i < 9; i++)
        assert_true(s.xtx[i] == want_xtx[i]);
    /* The output error through XᵀX is ||X (W - Ŵ)^T||^2: with Ŵ = W - e and
     * e = [1, 0, 1], X e = [1, 2] -> 5. */
    float w[3] = {0.5f, 0.25f, 2}, w_hat[3] = {-0.5f, 0.25f, 1};
    assert_true(quant_output_error_dense(w, w_hat, 1, 3, s.xtx) == 5.0);
    quant_act_stats_free(&s);
    assert_false(quant_act_stats_init(&s, 0, false));
}

enum { ROWS = 32, COLS = 256, TOKENS = 1024 };

typedef struct layer {
    float *w, *x, mean_abs[COLS];
    quant_act_stats stats;
} layer;

static layer make_layer(uint32_t seed) {
    layer l = {malloc(sizeof(float) * ROWS * COLS), malloc(sizeof(float) * TOKENS * COLS), {0}, {0}};
    assert_non_null(l.w), assert_non_null(l.x);
    synthetic_layer(l.w, ROWS, l.x, TOKENS, COLS, 16, 20.0f, seed);
    assert_true(quant_act_stats_init(&l.stats, COLS, true));
    quant_act_stats_add(&l.stats, l.x, TOKENS);
    quant_act_stats_mean_abs(&l.stats, l.mean_abs);
    return l;
}

static void layer_free(layer *l) {
    free(l->w), free(l->x);
    quant_act_stats_free(&l->stats);
}

static void test_awq_less_error_than_rtn(void **state) {
    (void)state;
    layer l = make_layer(3);
    for (int sym = 0; sym < 2; sym++)
        for (uint32_t group = 32; group <= 128; group *= 4) {
            quant_tensor rtn =
                make((quant_format){QUANT_INT4, QUANT_METHOD_RTN, group, sym == 0, false, false, false}, ROWS,
                     COLS);
            assert_null(quant_rtn(l.w, NULL, &rtn));
            double rtn_error = quant_output_error(l.w, &rtn, l.stats.xtx);
            double plain = 0;
            quant_tensor unclipped = {0};
            for (int clip = 0; clip < 2; clip++) {
                quant_format f = {QUANT_INT4, QUANT_METHOD_AWQ, group, sym == 0, false, true, false};
                quant_tensor t = make(f, ROWS, COLS);
                quant_awq_report report;
                assert_null(quant_awq(l.w, l.mean_abs, l.stats.xtx, &(quant_awq_options){.clip = clip == 1},
                                      &t, &report));
                double error = quant_output_error(l.w, &t, l.stats.xtx);
                printf("int4%s g%u%s: awq %.4g (alpha %.2f) vs rtn %.4g (%.1f%% less)\n",
                       sym ? " symmetric" : "", group, clip ? " +clip" : "", error, report.alpha, rtn_error,
                       100 * (1 - error / rtn_error));
                /* The report is what the stored tensor does. */
                assert_true(fabs(report.rtn_error - rtn_error) <= 1e-9 * rtn_error);
                assert_true(fabs(report.error - error) <= 1e-9 * error);
                assert_true(report.alpha > 0);
                assert_true(error < 0.7 * rtn_error);
                if (clip) {
                    assert_true(error <= plain);
                    /* The clip search lowers each row's whole error or keeps its range. */
                    for (uint64_t n = 0; n < ROWS; n++) {
                        double e[2];
                        for (int which = 0; which < 2; which++) {
                            const quant_tensor *q = which ? &unclipped : &t;
                            double sum = 0, d[COLS];
                            for (uint64_t k = 0; k < COLS; k++)
                                d[k] = (double)l.w[n * COLS + k] - quant_value(q, n, k);
                            for (uint64_t j = 0; j < COLS; j++)
                                for (uint64_t k = 0; k < COLS; k++)
                                    sum += d[j] * l.stats.xtx[j * COLS + k] * d[k];
                            e[which] = sum;
                        }
                        assert_true(e[0] <= e[1] * (1 + 1e-12));
                    }
                    free(unclipped.data);
                } else {
                    plain = error;
                    unclipped = t;
                    continue;
                }
                free(t.data);
            }
            free(rtn.data);
        }
    layer_free(&l);
}

/* The accuracy gate's measure through XᵀX against the explicit products
 * X W^T and X Ŵ^T of the inputs themselves. */
static void test_relative_output_error(void **state) {
    (void)state;
    layer l = make_layer(11);
    quant_tensor t =
        make((quant_format){QUANT_INT4, QUANT_METHOD_RTN, 32, true, false, false, false}, ROWS, COLS);
    assert_null(quant_rtn(l.w, NULL, &t));
    double error = 0, output = 0;
    for (uint64_t i = 0; i < TOKENS; i++)
        for (uint64_t n = 0; n < ROWS; n++) {
            double y = 0, y_hat = 0;
            for (uint64_t k = 0; k < COLS; k++) {
                y += (double)l.x[i * COLS + k] * l.w[n * COLS + k];
                y_hat += (double)l.x[i * COLS + k] * quant_value(&t, n, k);
            }
            error += (y - y_hat) * (y - y_hat), output += y * y;
        }
    double want = sqrt(error / output), got = quant_relative_output_error(l.w, &t, l.stats.xtx);
    printf("relative output error of int4 g32: %.6f (explicit %.6f)\n", got, want);
    assert_true(want > 0.01 && fabs(got - want) <= 1e-9 * want);
    /* An input never seen: no output, so no error either. */
    quant_act_stats none;
    assert_true(quant_act_stats_init(&none, COLS, true));
    assert_true(quant_relative_output_error(l.w, &t, none.xtx) == 0.0);
    quant_act_stats_free(&none);
    free(t.data);
    layer_free(&l);
}

/* With every channel equally active, every alpha gives s = 1 (normalised):
 * AWQ stores exactly round to nearest with column scales 1. */
static void test_awq_uniform_activations_is_rtn(void **state) {
    (void)state;
    layer l = make_layer(5);
    float ones[COLS];
    for (int k = 0; k < COLS; k++)
        ones[k] = 1.0f;
    quant_format f = {QUANT_INT4, QUANT_METHOD_AWQ, 64, true, false, true, false};
    quant_tensor a = make(f, ROWS, COLS), r = make(f, ROWS, COLS);
    float same[COLS];
    for (int k = 0; k < COLS; k++)
        same[k] = 0.75f;
    assert_null(quant_awq(l.w, same, l.stats.xtx, NULL, &a, NULL));
    assert_null(quant_rtn(l.w, ones, &r));
    assert_memory_equal(a.data, r.data, a.layout.total);
    /* Refusals: no column scales in the format; a negative mean. */
    quant_tensor n =
        make((quant_format){QUANT_INT4, QUANT_METHOD_AWQ, 64, true, false, false, false}, ROWS, COLS);
    assert_non_null(quant_awq(l.w, same, l.stats.xtx, NULL, &n, NULL));
    same[7] = -1;
    assert_non_null(quant_awq(l.w, same, l.stats.xtx, NULL, &a, NULL));
    free(a.data), free(r.data), free(n.data);
    layer_free(&l);
}

static void test_smooth_scales_by_hand(void **state) {
    (void)state;
    /* max|x| = {4, 1, 0}, column max|w| = {1, 4, 2}: s = sqrt(4 / 1) = 2,
     * sqrt(1 / 4) = 0.5, and 1 for the dead channel; c = 1/s. */
    float w[6] = {1, -4, 2, 0.5f, 1, 1}, absmax[3] = {4, 1, 0}, c[3];
    quant_smooth_scales(w, 2, 3, absmax, 0.5f, c);
    assert_true(c[0] == 0.5f), assert_true(c[1] == 2.0f), assert_true(c[2] == 1.0f);
}

/* W8A8 as the kernel will run it: x[k] * c[k] quantized per token to int8
 * (absmax / 127), times the int8 weight. */
static double w8a8_error(const layer *l, const quant_tensor *t) {
    double total = 0;
    float xs[COLS];
    for (uint64_t i = 0; i < TOKENS; i++) {
        const float *x = l->x + i * COLS;
        float amax = 0;
        for (uint64_t k = 0; k < COLS; k++) {
            xs[k] = x[k] * quant_column_scale(t, k);
            amax = fabsf(xs[k]) > amax ? fabsf(xs[k]) : amax;
        }
        float s = amax / 127;
        for (uint64_t k = 0; k < COLS; k++)
            xs[k] = s > 0 ? nearbyintf(xs[k] / s) * s : 0;
        for (uint64_t n = 0; n < ROWS; n++) {
            double exact = 0, quantized = 0;
            for (uint64_t k = 0; k < COLS; k++) {
                exact += (double)x[k] * l->w[n * COLS + k];
                /* the stored weight without its column scale: the kernel's int8 operand */
                quantized += (double)xs[k] * (quant_value(t, n, k) / quant_column_scale(t, k));
            }
            total += (exact - quantized) * (exact - quantized);
        }
    }
    return total;
}

static void test_smooth_w8a8_less_error(void **state) {
    (void)state;
    layer l = make_layer(9);
    quant_tensor plain =
        make((quant_format){QUANT_INT8, QUANT_METHOD_RTN, COLS, false, false, false, false}, ROWS, COLS);
    quant_tensor smooth =
        make((quant_format){QUANT_INT8, QUANT_METHOD_SMOOTH, COLS, false, false, true, false}, ROWS, COLS);
    assert_null(quant_rtn(l.w, NULL, &plain));
    assert_null(quant_smooth(l.w, l.stats.absmax, 0.5f, &smooth));
    double e_plain = w8a8_error(&l, &plain), e_smooth = w8a8_error(&l, &smooth);
    printf("w8a8: smooth %.4g vs plain %.4g (%.1f%% less)\n", e_smooth, e_plain,
           100 * (1 - e_smooth / e_plain));
    assert_true(e_smooth < 0.5 * e_plain);
    free(plain.data), free(smooth.data);
    layer_free(&l);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_stats_by_hand),
        cmocka_unit_test(test_awq_less_error_than_rtn),
        cmocka_unit_test(test_awq_uniform_activations_is_rtn),
        cmocka_unit_test(test_smooth_scales_by_hand),
        cmocka_unit_test(test_smooth_w8a8_less_error),
        cmocka_unit_test(test_relative_output_error),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
