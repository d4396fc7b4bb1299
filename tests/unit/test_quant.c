/* test_quant.c - the packed layout of quantized weights (quant/quant.h):
 * section offsets, codes, scales and zero points of round-to-nearest
 * quantization, and dequantization, against values worked out by hand. */
#include "quant.h"
#include "quant_group.h"

#include <math.h>
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
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

static void test_layout_offsets(void **state) {
    (void)state;
    /* 3 x 64 int4, groups of 32, zero points, act-order, column scales:
     * codes 3*64/2 = 96 B at 0; scales 3*2*2 = 12 B at 96; zeros 6 nibbles
     * = 3 B at 112; group_index 64*4 = 256 B at 128; column_scale 256 B at
     * 384; total 640. */
    quant_format f = {QUANT_INT4, QUANT_METHOD_GPTQ, 32, true, true, true, false};
    quant_layout l;
    assert_null(quant_layout_of(&f, 3, 64, &l));
    assert_int_equal(l.groups, 2);
    assert_int_equal(l.codes, 0), assert_int_equal(l.codes_bytes, 96);
    assert_int_equal(l.scales, 96), assert_int_equal(l.scales_bytes, 12);
    assert_int_equal(l.zeros, 112), assert_int_equal(l.zeros_bytes, 3);
    assert_int_equal(l.group_index, 128), assert_int_equal(l.group_index_bytes, 256);
    assert_int_equal(l.column_scale, 384), assert_int_equal(l.column_scale_bytes, 256);
    assert_int_equal(l.total, 640);
    /* int8 per channel (group = cols): 2 x 5 codes = 10 B, scales 4 B at 16. */
    quant_format c = {QUANT_INT8, QUANT_METHOD_RTN, 5, false, false, false, false};
    assert_null(quant_layout_of(&c, 2, 5, &l));
    assert_int_equal(l.scales, 16), assert_int_equal(l.total, 20), assert_int_equal(l.zeros_bytes, 0);
}

static void test_layout_refusals(void **state) {
    (void)state;
    quant_layout l;
    quant_format f = {QUANT_INT4, QUANT_METHOD_RTN, 48, true, false, false, false};
    assert_non_null(quant_layout_of(&f, 4, 64, &l)); /* 48 does not divide 64 */
    f.group = 0;
    assert_non_null(quant_layout_of(&f, 4, 64, &l));
    quant_format z = {QUANT_INT8, QUANT_METHOD_RTN, 64, true, false, false, false};
    assert_non_null(quant_layout_of(&z, 4, 64, &l)); /* zero point on int8 */
    quant_format none = {QUANT_NONE, QUANT_METHOD_RTN, 64, false, false, false, false};
    assert_non_null(quant_layout_of(&none, 4, 64, &l));
    quant_format big = {QUANT_INT8, QUANT_METHOD_RTN, 1, false, false, false, false};
    assert_non_null(quant_layout_of(&big, UINT64_MAX / 2, 4, &l)); /* overflows */
}

static void test_int4_asymmetric(void **state) {
    (void)state;
    /* One group of 4: min -1, max 2 -> s = 3/15 = 0.2 (f16 0.199951171875),
     * z = round(1 / 0.19995) = 5; codes round(v / s) + 5: -1 -> 0, 0 -> 5,
     * 0.5 -> 7.5004 -> 8, 2 -> 15.0024 -> 15. */
    float w[4] = {-1.0f, 0.0f, 0.5f, 2.0f};
    quant_tensor t = make((quant_format){QUANT_INT4, QUANT_METHOD_RTN, 4, true, false, false, false}, 1, 4);
    assert_null(quant_rtn(w, NULL, &t));
    float s = 0.199951171875f;
    assert_true(quant_scale(&t, 0, 0) == s);
    assert_int_equal(quant_zero(&t, 0, 0), 5);
    unsigned want[4] = {0, 5, 8, 15};
    for (int k = 0; k < 4; k++)
        assert_int_equal(quant_code(&t, 0, (uint64_t)k), want[k]);
    /* The packed bytes: element 0 in the low nibble. */
    assert_int_equal(t.data[0], 0x50), assert_int_equal(t.data[1], 0xf8);
    assert_true(quant_value(&t, 0, 0) == -5 * s);
    assert_true(quant_value(&t, 0, 2) == 3 * s);
    assert_true(quant_value(&t, 0, 3) == 10 * s);
    free(t.data);
}

static void test_int4_symmetric_groups(void **state) {
    (void)state;
    /* Two groups of 2: {0.7, -0.35} -> s = 0.7/7 (f16 0.0999755859375),
     * codes 7.0017 -> 7 + 8 = 15 and -3.5009 -> -4 + 8 = 4; {0, 0} -> s = 1
     * (a group of zeros), codes 8. */
    float w[4] = {0.7f, -0.35f, 0.0f, 0.0f};
    quant_tensor t = make((quant_format){QUANT_INT4, QUANT_METHOD_RTN, 2, false, false, false, false}, 1, 4);
    assert_null(quant_rtn(w, NULL, &t));
    assert_true(quant_scale(&t, 0, 0) == 0.0999755859375f);
    assert_true(quant_scale(&t, 0, 1) == 1.0f);
    assert_int_equal(quant_zero(&t, 0, 0), 8);
    assert_int_equal(quant_code(&t, 0, 0), 15), assert_int_equal(quant_code(&t, 0, 1), 4);
    assert_int_equal(quant_code(&t, 0, 2), 8), assert_int_equal(quant_code(&t, 0, 3), 8);
    assert_true(quant_value(&t, 0, 1) == -4 * 0.0999755859375f);
    assert_true(quant_value(&t, 0, 3) == 0.0f);
    free(t.data);
}

static void test_int8_and_fp8_per_channel(void **state) {
    (void)state;
    /* int8: row {1.27, -0.5}: s = 0.01 (f16 0.010002136...), codes 127, -50. */
    float w[4] = {1.27f, -0.5f, 0.0f, 4.48f};
    quant_tensor t = make((quant_format){QUANT_INT8, QUANT_METHOD_RTN, 2, false, false, false, false}, 2, 2);
    assert_null(quant_rtn(w, NULL, &t));
    assert_int_equal((int8_t)quant_code(&t, 0, 0), 127);
    assert_int_equal((int8_t)quant_code(&t, 0, 1), -50);
    assert_true(fabsf(quant_value(&t, 0, 1) + 0.5f) < 0.5f * 0.01f);
    /* fp8: row {0, 4.48}: s = 0.01 (f16), 4.48 / s = 447.9 -> E4M3 448 (0x7e). */
    quant_tensor e = make((quant_format){QUANT_FP8, QUANT_METHOD_RTN, 2, false, false, false, false}, 2, 2);
    assert_null(quant_rtn(w, NULL, &e));
    assert_int_equal(quant_code(&e, 1, 1), 0x7e);
    assert_int_equal(quant_code(&e, 1, 0), 0);
    assert_true(fabsf(quant_value(&e, 1, 1) - 4.48f) < 4.48f / 16);
    free(t.data), free(e.data);
}

static void test_column_scales(void **state) {
    (void)state;
    /* c = {0.5, 2}: the codes quantize w / c = {2, 0.5} (int8, s = 2/127),
     * and the values multiply c back: 2 * 0.5 = 1 and ~0.5 * 2 = 1. */
    float w[2] = {1.0f, 1.0f}, c[2] = {0.5f, 2.0f};
    quant_tensor t = make((quant_format){QUANT_INT8, QUANT_METHOD_AWQ, 2, false, false, true, false}, 1, 2);
    assert_null(quant_rtn(w, c, &t));
    assert_true(quant_column_scale(&t, 1) == 2.0f);
    assert_int_equal((int8_t)quant_code(&t, 0, 0), 127);
    assert_int_equal((int8_t)quant_code(&t, 0, 1), 32); /* 0.5 * 127 / 2 = 31.75 -> 32 */
    assert_true(fabsf(quant_value(&t, 0, 0) - 1.0f) < 1e-3f);
    assert_true(fabsf(quant_value(&t, 0, 1) - 1.0f) < 2 * 2.0f / 127);
    assert_non_null(quant_rtn(w, NULL, &t)); /* the format wants column scales */
    float bad[2] = {1.0f, 0.0f};
    assert_non_null(quant_rtn(w, bad, &t));
    free(t.data);
}

static void test_rtn_error_bound(void **state) {
    (void)state;
    /* Every rounding is within half a step: |w - value| <= s / 2 (+ f16
     * rounding of nothing: the codes are chosen for the stored scale). */
    enum { ROWS = 7, COLS = 256 };
    float *w = malloc(sizeof(float) * ROWS * COLS);
    assert_non_null(w);
    uint32_t x = 12345;
    for (int i = 0; i < ROWS * COLS; i++) {
        x = x * 1664525u + 1013904223u;
        w[i] = ((float)(x >> 8) / 16777216.0f - 0.5f) * (1.0f + (float)(i % 5));
    }
    for (int sym = 0; sym < 2; sym++) {
        quant_tensor t =
            make((quant_format){QUANT_INT4, QUANT_METHOD_RTN, 64, sym == 0, false, false, false}, ROWS, COLS);
        assert_null(quant_rtn(w, NULL, &t));
        for (uint64_t n = 0; n < ROWS; n++)
            for (uint64_t k = 0; k < COLS; k++) {
                float s = quant_scale(&t, n, k / 64);
                assert_true(fabsf(w[n * COLS + k] - quant_value(&t, n, k)) <= s * 0.5f * 1.001f + 1e-7f);
            }
        free(t.data);
    }
    free(w);
}

static void test_names(void **state) {
    (void)state;
    quant_kind k;
    quant_method m;
    assert_true(quant_kind_from_name("int4", &k)), assert_int_equal(k, QUANT_INT4);
    assert_false(quant_kind_from_name("int3", &k));
    assert_true(quant_method_from_name("gptq", &m)), assert_int_equal(m, QUANT_METHOD_GPTQ);
    assert_string_equal(quant_method_name(QUANT_METHOD_CHECKPOINT), "checkpoint");
    assert_int_equal(quant_code_dtype(QUANT_FP8), SMELT_DTYPE_F8E4M3);
}

/* Equal: every one of the seven fields; the same storage: all but the
 * method. Each field changed alone, from one format. */
static void test_format_comparisons(void **state) {
    (void)state;
    const quant_format base = {.kind = QUANT_INT4, .method = QUANT_METHOD_AWQ, .group = 64, .has_zero = true};
    quant_format changed[7];
    for (int i = 0; i < 7; i++)
        changed[i] = base;
    changed[0].kind = QUANT_INT8;
    changed[1].group = 128;
    changed[2].has_zero = false;
    changed[3].has_group_index = true;
    changed[4].has_column_scale = true;
    changed[5].interleaved = true;
    changed[6].method = QUANT_METHOD_RTN;
    quant_format copy = base;
    assert_true(quant_format_equal(&base, &copy));
    assert_true(quant_format_same_storage(&base, &copy));
    for (int i = 0; i < 6; i++) {
        assert_false(quant_format_equal(&base, &changed[i]));
        assert_false(quant_format_equal(&changed[i], &base));
        assert_false(quant_format_same_storage(&base, &changed[i]));
    }
    assert_false(quant_format_equal(&base, &changed[6]));
    assert_true(quant_format_same_storage(&base, &changed[6])); /* the method does not change the bytes */
}

/* The interleaved int4 codes (layout mma_k16): where a column's code sits,
 * worked out by hand from quant.h's description; the B-fragment property
 * the dequantize-GEMM relies on; the same values as row-major codes. */
static void test_interleaved_positions(void **state) {
    (void)state;
    quant_format f = {QUANT_INT4, QUANT_METHOD_RTN, 32, true, false, false, true};
    /* column -> (step, lane, element): 0 -> (0, 0, 0) nibble 0; 1 -> element 1, nibble 4;
     * 2 -> lane 1, element 0: nibble 32; 8 -> element 2, nibble 1; 9 -> element 3, nibble 5;
     * 16 -> step 1, element 4: nibble 2; 32 -> step 2, element 8: word 1, nibble 8; 40 ->
     * element 10: nibble 9; 127 -> step 7, lane 3, element 31: 96 + 24 + 7; 128 -> the second
     * block: 128; row 1 starts at 256. */
    const uint64_t columns[] = {0, 1, 2, 8, 9, 16, 32, 40, 127, 128};
    const uint64_t positions[] = {0, 4, 32, 1, 5, 2, 8, 9, 127, 128};
    for (int i = 0; i < 10; i++)
        assert_int_equal(quant_code_position(&f, 256, 0, columns[i]), positions[i]);
    assert_int_equal(quant_code_position(&f, 256, 1, 0), 256);
    /* a permutation of each row */
    unsigned char seen[256] = {0};
    for (uint64_t k = 0; k < 256; k++)
        seen[quant_code_position(&f, 256, 0, k)]++;
    for (int i = 0; i < 256; i++)
        assert_int_equal(seen[i], 1);
    assert_false(quant_can_interleave(
        &(quant_format){QUANT_INT4, QUANT_METHOD_RTN, 32, true, false, false, true}, 96));
    assert_false(quant_can_interleave(
        &(quant_format){QUANT_INT4, QUANT_METHOD_GPTQ, 32, true, true, false, true}, 128));
    assert_false(quant_can_interleave(
        &(quant_format){QUANT_INT8, QUANT_METHOD_RTN, 128, false, false, false, true}, 128));
}

static void test_interleaved_fragments(void **state) {
    (void)state;
    /* codes q[n][k] = (k + n) % 16, interleaved: lane c's 16 bytes of block b,
     * word s / 2 shifted by (s % 2) * 8, masked by 0x000f000f, is the pair of
     * columns 16 s + 2 c and + 1 (low first); shifted 4 more, + 8 and + 9. */
    quant_tensor t =
        make((quant_format){QUANT_INT4, QUANT_METHOD_RTN, 128, true, false, false, true}, 2, 256);
    for (uint64_t n = 0; n < 2; n++)
        for (uint64_t k = 0; k < 256; k++)
            quant_store_code(&t, n, k, (unsigned)((k + n) % 16));
    for (uint64_t n = 0; n < 2; n++)
        for (uint64_t b = 0; b < 2; b++)
            for (unsigned c = 0; c < 4; c++)
                for (unsigned s = 0; s < 8; s++) {
                    const uint8_t *chunk = t.data + n * 128 + b * 64 + c * 16 + s / 2 * 4;
                    uint32_t word = (uint32_t)chunk[0] | (uint32_t)chunk[1] << 8 | (uint32_t)chunk[2] << 16 |
                                    (uint32_t)chunk[3] << 24;
                    uint32_t first = (word >> (s % 2 * 8)) & 0x000f000fu,
                             second = (word >> (s % 2 * 8 + 4)) & 0x000f000fu;
                    uint64_t k = b * 128 + 16 * s + 2 * c;
                    assert_int_equal(first & 15u, (k + n) % 16);
                    assert_int_equal(first >> 16, (k + 1 + n) % 16);
                    assert_int_equal(second & 15u, (k + 8 + n) % 16);
                    assert_int_equal(second >> 16, (k + 9 + n) % 16);
                }
    free(t.data);
}

static void test_interleaved_same_values(void **state) {
    (void)state;
    enum { ROWS = 3, COLS = 256 };
    float w[ROWS * COLS];
    uint32_t x = 7;
    for (int i = 0; i < ROWS * COLS; i++) {
        x = x * 1664525u + 1013904223u;
        w[i] = (float)(x >> 8) / 16777216.0f - 0.5f;
    }
    quant_tensor rows =
        make((quant_format){QUANT_INT4, QUANT_METHOD_RTN, 64, true, false, false, false}, ROWS, COLS);
    quant_tensor mma =
        make((quant_format){QUANT_INT4, QUANT_METHOD_RTN, 64, true, false, false, true}, ROWS, COLS);
    assert_null(quant_rtn(w, NULL, &rows));
    assert_null(quant_rtn(w, NULL, &mma));
    assert_int_equal(rows.layout.total, mma.layout.total);
    assert_memory_not_equal(rows.data, mma.data, rows.layout.codes_bytes);
    for (uint64_t n = 0; n < ROWS; n++)
        for (uint64_t k = 0; k < COLS; k++)
            assert_true(quant_value(&rows, n, k) == quant_value(&mma, n, k));
    /* reordering row-major codes in place gives the interleaved bytes, and back */
    uint8_t *copy = malloc(rows.layout.total);
    memcpy(copy, rows.data, rows.layout.total);
    assert_null(quant_set_interleaved(&rows, true));
    assert_memory_equal(rows.data, mma.data, rows.layout.total);
    assert_null(quant_set_interleaved(&rows, false));
    assert_memory_equal(rows.data, copy, rows.layout.total);
    free(copy);
    quant_layout l;
    quant_format odd = {QUANT_INT4, QUANT_METHOD_RTN, 32, true, false, false, true};
    assert_non_null(quant_layout_of(&odd, 2, 96, &l)); /* 96 columns cannot be interleaved */
    free(rows.data);
    free(mma.data);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_layout_offsets),
        cmocka_unit_test(test_layout_refusals),
        cmocka_unit_test(test_interleaved_positions),
        cmocka_unit_test(test_interleaved_fragments),
        cmocka_unit_test(test_interleaved_same_values),
        cmocka_unit_test(test_int4_asymmetric),
        cmocka_unit_test(test_int4_symmetric_groups),
        cmocka_unit_test(test_int8_and_fp8_per_channel),
        cmocka_unit_test(test_column_scales),
        cmocka_unit_test(test_rtn_error_bound),
        cmocka_unit_test(test_names),
        cmocka_unit_test(test_format_comparisons), /* quant_format_equal, quant_format_same_storage */
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
