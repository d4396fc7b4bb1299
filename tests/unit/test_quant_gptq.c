/* test_quant_gptq.c - GPTQ (quant/gptq.c): agreement with an independent
 * numpy implementation (tests/reference/make_gptq_fixture.py, the paper's
 * algorithm without the lazy batch), less output error than round-to-
 * nearest on inputs with outlier channels, and act-order's group_index. */
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

/* ---- the numpy fixture ------------------------------------------------------------- */

typedef struct fixture {
    uint32_t rows, cols, group, act_order, block, has_zero;
    double damp;
    float *w, *scales;
    double *h;
    uint8_t *codes, *zeros;
    uint32_t *g_idx;
} fixture;

static void read_exact(FILE *f, void *dst, size_t bytes) { assert_int_equal(fread(dst, 1, bytes, f), bytes); }

static fixture load_fixture(const char *name) {
    char path[1024];
    snprintf(path, sizeof path, "%s/tests/fixtures/quant/%s", SMELT_SOURCE_DIR, name);
    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    char magic[8];
    read_exact(f, magic, 8);
    assert_memory_equal(magic, "GPTQFIX1", 8);
    fixture x;
    uint32_t header[6];
    read_exact(f, header, sizeof header); /* little-endian, as this machine */
    x.rows = header[0], x.cols = header[1], x.group = header[2];
    x.act_order = header[3], x.block = header[4], x.has_zero = header[5];
    read_exact(f, &x.damp, sizeof x.damp);
    uint32_t rc = x.rows * x.cols, groups = x.cols / x.group;
    x.w = malloc(rc * sizeof *x.w), x.h = malloc((size_t)x.cols * x.cols * sizeof *x.h);
    x.codes = malloc(rc), x.scales = malloc(x.rows * groups * sizeof *x.scales),
    x.zeros = malloc(x.rows * groups);
    x.g_idx = malloc(x.cols * sizeof *x.g_idx);
    read_exact(f, x.w, rc * sizeof *x.w);
    read_exact(f, x.h, (size_t)x.cols * x.cols * sizeof *x.h);
    read_exact(f, x.codes, rc);
    read_exact(f, x.scales, x.rows * groups * sizeof *x.scales);
    read_exact(f, x.zeros, x.rows * groups);
    read_exact(f, x.g_idx, x.cols * sizeof *x.g_idx);
    assert_int_equal(fgetc(f), EOF);
    fclose(f);
    return x;
}

static void fixture_free(fixture *x) {
    free(x->w), free(x->h), free(x->codes), free(x->scales), free(x->zeros), free(x->g_idx);
}

static void check_against_fixture(const char *name) {
    fixture x = load_fixture(name);
    quant_format f = {QUANT_INT4, QUANT_METHOD_GPTQ, x.group, x.has_zero, x.act_order != 0, false, false};
    quant_tensor t = make(f, x.rows, x.cols);
    quant_gptq_options o = {.damp = x.damp, .block = x.block, .act_order = x.act_order != 0};
    assert_null(quant_gptq(x.w, x.h, &o, &t));
    uint32_t groups = x.cols / x.group;
    for (uint32_t n = 0; n < x.rows; n++) {
        for (uint32_t g = 0; g < groups; g++) {
            assert_true(quant_scale(&t, n, g) == x.scales[n * groups + g]);
            assert_int_equal(quant_zero(&t, n, g), x.zeros[n * groups + g]);
        }
        for (uint32_t k = 0; k < x.cols; k++)
            assert_int_equal(quant_code(&t, n, k), x.codes[n * x.cols + k]);
    }
    for (uint32_t k = 0; k < x.cols; k++)
        assert_int_equal(quant_group_of(&t, k), x.act_order ? x.g_idx[k] : k / x.group);
    free(t.data);
    fixture_free(&x);
}

static void test_matches_numpy(void **state) {
    (void)state;
    check_against_fixture("gptq_g16.bin");
}

static void test_matches_numpy_act_order(void **state) {
    (void)state;
    check_against_fixture("gptq_g16_act_order.bin");
}

/* ---- against round to nearest ---------------------------------------------------- */

enum { ROWS = 32, COLS = 256, TOKENS = 1024 };

typedef struct layer {
    float *w, *x;
    quant_act_stats stats;
} layer;

static layer make_layer(uint32_t seed) {
    layer l = {malloc(sizeof(float) * ROWS * COLS), malloc(sizeof(float) * TOKENS * COLS), {0}};
    assert_non_null(l.w), assert_non_null(l.x);
    synthetic_layer(l.w, ROWS, l.x, TOKENS, COLS, 16, 20.0f, seed);
    assert_true(quant_act_stats_init(&l.stats, COLS, true));
    quant_act_stats_add(&l.stats, l.x, TOKENS);
    return l;
}

static void layer_free(layer *l) {
    free(l->w), free(l->x);
    quant_act_stats_free(&l->stats);
}

static void test_less_error_than_rtn(void **state) {
    (void)state;
    layer l = make_layer(7);
    for (int sym = 0; sym < 2; sym++)
        for (uint32_t group = 32; group <= 128; group *= 4) {
            quant_format rf = {QUANT_INT4, QUANT_METHOD_RTN, group, sym == 0, false, false, false};
            quant_tensor rtn = make(rf, ROWS, COLS);
            assert_null(quant_rtn(l.w, NULL, &rtn));
            double rtn_error = quant_output_error(l.w, &rtn, l.stats.xtx);
            for (int act = 0; act < 2; act++) {
                quant_format gf = {QUANT_INT4, QUANT_METHOD_GPTQ, group, sym == 0, act == 1, false, false};
                quant_tensor t = make(gf, ROWS, COLS);
                quant_gptq_options o = {.block = 64, .act_order = act == 1};
                assert_null(quant_gptq(l.w, l.stats.xtx, &o, &t));
                double error = quant_output_error(l.w, &t, l.stats.xtx);
                printf("int4%s g%u%s: gptq %.4g vs rtn %.4g (%.1f%% less)\n", sym ? " symmetric" : "", group,
                       act ? " act-order" : "", error, rtn_error, 100 * (1 - error / rtn_error));
                assert_true(error < 0.5 * rtn_error); /* measured: 71% to 77% less */
                free(t.data);
            }
            free(rtn.data);
        }
    /* int8 per channel too. */
    quant_tensor rtn =
        make((quant_format){QUANT_INT8, QUANT_METHOD_RTN, COLS, false, false, false, false}, ROWS, COLS);
    quant_tensor t =
        make((quant_format){QUANT_INT8, QUANT_METHOD_GPTQ, COLS, false, false, false, false}, ROWS, COLS);
    assert_null(quant_rtn(l.w, NULL, &rtn));
    assert_null(quant_gptq(l.w, l.stats.xtx, NULL, &t));
    assert_true(quant_output_error(l.w, &t, l.stats.xtx) < quant_output_error(l.w, &rtn, l.stats.xtx));
    free(rtn.data), free(t.data);
    layer_free(&l);
}

/* The lazy batch changes the order of arithmetic, not the codes. */
static void test_block_size_does_not_matter(void **state) {
    (void)state;
    layer l = make_layer(11);
    quant_format f = {QUANT_INT4, QUANT_METHOD_GPTQ, 32, true, false, false, false};
    quant_tensor a = make(f, ROWS, COLS), b = make(f, ROWS, COLS), c = make(f, ROWS, COLS);
    assert_null(quant_gptq(l.w, l.stats.xtx, &(quant_gptq_options){.block = 256}, &a));
    assert_null(quant_gptq(l.w, l.stats.xtx, &(quant_gptq_options){.block = 32}, &b));
    assert_null(quant_gptq(l.w, l.stats.xtx, &(quant_gptq_options){.block = 20}, &c)); /* -> 16 */
    uint64_t mismatched = 0;
    for (uint64_t n = 0; n < ROWS; n++)
        for (uint64_t k = 0; k < COLS; k++)
            mismatched +=
                quant_code(&a, n, k) != quant_code(&b, n, k) || quant_code(&a, n, k) != quant_code(&c, n, k);
    assert_int_equal(mismatched, 0);
    free(a.data), free(b.data), free(c.data);
    layer_free(&l);
}

/* Act-order: every group has `group` columns, groups go by descending
 * diag(H), and dequantization through group_index is what the error used. */
static void test_act_order_group_index(void **state) {
    (void)state;
    layer l = make_layer(13);
    enum { GROUP = 64 };
    quant_tensor t =
        make((quant_format){QUANT_INT4, QUANT_METHOD_GPTQ, GROUP, true, true, false, false}, ROWS, COLS);
    assert_null(quant_gptq(l.w, l.stats.xtx, &(quant_gptq_options){.act_order = true}, &t));
    unsigned members[COLS / GROUP] = {0};
    double least[COLS / GROUP], most[COLS / GROUP];
    for (unsigned g = 0; g < COLS / GROUP; g++)
        least[g] = INFINITY, most[g] = -INFINITY;
    for (uint64_t k = 0; k < COLS; k++) {
        uint64_t g = quant_group_of(&t, k);
        assert_true(g < COLS / GROUP);
        members[g]++;
        double d = l.stats.xtx[k * COLS + k];
        least[g] = d < least[g] ? d : least[g], most[g] = d > most[g] ? d : most[g];
    }
    for (unsigned g = 0; g < COLS / GROUP; g++) {
        assert_int_equal(members[g], GROUP);
        if (g > 0) assert_true(most[g] <= least[g - 1]);
    }
    /* The outlier channels (3, 19, ...: the largest diag) are all in group 0. */
    for (uint64_t k = 3; k < COLS; k += 16)
        assert_int_equal(quant_group_of(&t, k), 0);
    free(t.data);
    layer_free(&l);
}

static void test_refusals(void **state) {
    (void)state;
    float w[4] = {1, 2, 3, 4};
    double h[4] = {1, 2, 2, 1}; /* eigenvalues 3 and -1 */
    quant_tensor t = make((quant_format){QUANT_INT4, QUANT_METHOD_GPTQ, 2, true, false, false, false}, 2, 2);
    assert_non_null(quant_gptq(w, h, NULL, &t));
    double good[4] = {2, 1, 1, 2};
    assert_non_null(quant_gptq(w, good, &(quant_gptq_options){.act_order = true}, &t)); /* no group_index */
    assert_null(quant_gptq(w, good, NULL, &t));
    quant_tensor c = make((quant_format){QUANT_INT4, QUANT_METHOD_GPTQ, 2, true, false, true, false}, 2, 2);
    assert_non_null(quant_gptq(w, good, NULL, &c)); /* column scales */
    double nan_h[4] = {NAN, 0, 0, 1};
    assert_non_null(quant_gptq(w, nan_h, NULL, &t));
    free(t.data), free(c.data);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_matches_numpy),         cmocka_unit_test(test_matches_numpy_act_order),
        cmocka_unit_test(test_less_error_than_rtn),   cmocka_unit_test(test_block_size_does_not_matter),
        cmocka_unit_test(test_act_order_group_index), cmocka_unit_test(test_refusals),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
