/* test_dtype.c - the one dtype table (plan/smelt_dtype.h): names round-trip,
 * sizes in bits, and the packed byte count of sub-byte dtypes, against
 * values written out by hand. */
#include "smelt_dtype.h"

#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include <cmocka.h>

static void test_names_round_trip(void **state) {
    (void)state;
    static const char *const names[] = {"f32", "f16", "bf16", "f8e4m3", "f8e5m2", "i8", "i4", "i32", "i64"};
    assert_int_equal(SMELT_DTYPE_COUNT - 1, sizeof names / sizeof names[0]);
    for (int t = 1; t < SMELT_DTYPE_COUNT; t++) {
        assert_string_equal(smelt_dtype_name((smelt_dtype)t), names[t - 1]);
        assert_int_equal(smelt_dtype_from_name(names[t - 1], strlen(names[t - 1])), t);
    }
    assert_int_equal(smelt_dtype_from_name("f3", 2), SMELT_DTYPE_UNKNOWN);
    assert_int_equal(smelt_dtype_from_name("f32x", 4), SMELT_DTYPE_UNKNOWN);
    assert_string_equal(smelt_dtype_name(SMELT_DTYPE_UNKNOWN), "?");
    assert_string_equal(smelt_dtype_name((smelt_dtype)200), "?");
}

static void test_sizes(void **state) {
    (void)state;
    assert_int_equal(smelt_dtype_bits(SMELT_DTYPE_F32), 32);
    assert_int_equal(smelt_dtype_bits(SMELT_DTYPE_BF16), 16);
    assert_int_equal(smelt_dtype_bits(SMELT_DTYPE_F8E4M3), 8);
    assert_int_equal(smelt_dtype_bits(SMELT_DTYPE_I4), 4);
    assert_int_equal(smelt_dtype_bits(SMELT_DTYPE_I64), 64);
    assert_int_equal(smelt_dtype_bits(SMELT_DTYPE_UNKNOWN), 0);
    assert_int_equal(smelt_dtype_element_bytes(SMELT_DTYPE_BF16), 2);
    assert_int_equal(smelt_dtype_element_bytes(SMELT_DTYPE_I4), 0);
    assert_true(smelt_dtype_is_float(SMELT_DTYPE_F8E5M2));
    assert_false(smelt_dtype_is_float(SMELT_DTYPE_I8));
    assert_false(smelt_dtype_is_float(SMELT_DTYPE_UNKNOWN));
}

static void test_storage_bytes(void **state) {
    (void)state;
    uint64_t bytes = 0;
    assert_true(smelt_dtype_storage_bytes(SMELT_DTYPE_I4, 7, &bytes)); /* 28 bits: 4 bytes */
    assert_int_equal(bytes, 4);
    assert_true(smelt_dtype_storage_bytes(SMELT_DTYPE_I4, 8, &bytes));
    assert_int_equal(bytes, 4);
    assert_true(smelt_dtype_storage_bytes(SMELT_DTYPE_I4, 0, &bytes));
    assert_int_equal(bytes, 0);
    assert_true(smelt_dtype_storage_bytes(SMELT_DTYPE_BF16, 4096, &bytes));
    assert_int_equal(bytes, 8192);
    assert_true(smelt_dtype_storage_bytes(SMELT_DTYPE_I64, 3, &bytes));
    assert_int_equal(bytes, 24);
    assert_false(smelt_dtype_storage_bytes(SMELT_DTYPE_F32, UINT64_MAX / 16, &bytes));
    assert_false(smelt_dtype_storage_bytes(SMELT_DTYPE_UNKNOWN, 1, &bytes));
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_round_trip),
        cmocka_unit_test(test_sizes),
        cmocka_unit_test(test_storage_bytes),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
