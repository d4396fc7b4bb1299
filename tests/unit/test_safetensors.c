/* test_safetensors.c - the safetensors reader, writer, checkpoints and the
 * narrow-float conversions.
 *
 * Broken files are made here at test time (a header text and a data size),
 * each in a fresh temporary folder, and each must be refused with its own
 * message; diagnostics go to a memory stream.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "checkpoint.h"
#include "numeric.h"
#include "safetensors.h"

#include <dirent.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

static diag_engine diag;
static FILE *diag_stream;
static char *diag_buffer;
static size_t diag_size;
static char folder[64];

/* ---- fixtures ---------------------------------------------------------------- */

static void remove_tree(const char *path) {
    struct stat st;
    if (lstat(path, &st) != 0) return;
    if (S_ISDIR(st.st_mode)) {
        DIR *dir = opendir(path);
        if (dir) {
            struct dirent *e;
            while ((e = readdir(dir)) != NULL) {
                if (strcmp(e->d_name, ".") == 0 || strcmp(e->d_name, "..") == 0) continue;
                char child[512];
                snprintf(child, sizeof child, "%s/%s", path, e->d_name);
                remove_tree(child);
            }
            closedir(dir);
        }
        rmdir(path);
    } else {
        unlink(path);
    }
}

static int setup(void **state) {
    (void)state;
    diag_stream = open_memstream(&diag_buffer, &diag_size);
    diag_init(&diag, diag_stream);
    snprintf(folder, sizeof folder, "/tmp/smelt-test-st-XXXXXX");
    if (!mkdtemp(folder)) fail_msg("mkdtemp failed");
    return 0;
}

static int teardown(void **state) {
    (void)state;
    diag_free(&diag);
    fclose(diag_stream);
    free(diag_buffer);
    diag_buffer = NULL;
    remove_tree(folder);
    return 0;
}

static const char *diagnostics(void) {
    fflush(diag_stream);
    return diag_buffer ? diag_buffer : "";
}

static void expect_diag(const char *text) {
    if (!strstr(diagnostics(), text))
        fail_msg("expected in diagnostics: %s\n--- got:\n%s", text, diagnostics());
}

static unsigned occurrences_of(const char *text) {
    unsigned n = 0;
    for (const char *p = diagnostics(); (p = strstr(p, text)) != NULL; p++)
        n++;
    return n;
}

static const char *path_in(const char *name) {
    static char paths[4][256];
    static int next;
    char *p = paths[next++ % 4];
    snprintf(p, 256, "%s/%s", folder, name);
    return p;
}

static void write_bytes(const char *path, const void *bytes, size_t length) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(bytes, 1, length, f), length);
    fclose(f);
}

/* A safetensors file with the given header text (length as declared unless
 * declared_length is not UINT64_MAX) and `data_size` bytes of data. */
static void write_raw(const char *path, const char *header, uint64_t declared_length, size_t data_size) {
    size_t header_length = strlen(header);
    uint64_t length = declared_length != UINT64_MAX ? declared_length : header_length;
    size_t total = 8 + header_length + data_size;
    unsigned char *bytes = malloc(total);
    assert_non_null(bytes);
    for (int i = 0; i < 8; i++)
        bytes[i] = (unsigned char)(length >> (8 * i));
    memcpy(bytes + 8, header, header_length);
    for (size_t i = 0; i < data_size; i++)
        bytes[8 + header_length + i] = (unsigned char)i;
    write_bytes(path, bytes, total);
    free(bytes);
}

/* The header must be refused with `message` in the diagnostics. */
static void expect_refused(const char *header, size_t data_size, const char *message) {
    const char *path = path_in("model.safetensors");
    write_raw(path, header, UINT64_MAX, data_size);
    st_file f;
    assert_false(st_file_open(path, &f, &diag));
    assert_null(f.map);
    assert_int_equal(f.tensor_count, 0);
    expect_diag(message);
}

static unsigned count_files(const char *path) {
    DIR *dir = opendir(path);
    assert_non_null(dir);
    unsigned n = 0;
    struct dirent *e;
    while ((e = readdir(dir)) != NULL)
        n += e->d_name[0] != '.';
    closedir(dir);
    return n;
}

/* ---- narrow floats ----------------------------------------------------------------- */

static void test_widening_hand_values(void **state) {
    (void)state;
    assert_true(plan_bf16_to_f32(0x3f80) == 1.0f);
    assert_true(plan_bf16_to_f32(0xc000) == -2.0f);
    assert_true(plan_bf16_to_f32(0x4049) == 3.140625f);
    assert_true(plan_bf16_to_f32(0x0001) == 0x1p-133f); /* bf16 subnormals are f32 subnormals */
    assert_true(isinf(plan_bf16_to_f32(0xff80)) && plan_bf16_to_f32(0xff80) < 0);

    assert_true(plan_f16_to_f32(0x3c00) == 1.0f);
    assert_true(plan_f16_to_f32(0xc000) == -2.0f);
    assert_true(plan_f16_to_f32(0x3555) == 0.333251953125f);
    assert_true(plan_f16_to_f32(0x0001) == 0x1p-24f);
    assert_true(plan_f16_to_f32(0x03ff) == 1023 * 0x1p-24f);
    assert_true(plan_f16_to_f32(0x0400) == 0x1p-14f);
    assert_true(plan_f16_to_f32(0x7bff) == 65504.0f);
    assert_true(plan_f16_to_f32(0x8001) == -0x1p-24f);
    assert_true(isinf(plan_f16_to_f32(0x7c00)) && plan_f16_to_f32(0xfc00) < 0);
    assert_true(isnan(plan_f16_to_f32(0x7e00)) && isnan(plan_f16_to_f32(0x7c01)));
    assert_true(plan_f16_to_f32(0x8000) == 0.0f && signbit(plan_f16_to_f32(0x8000)));

    assert_true(plan_f8e4m3_to_f32(0x7e) == 448.0f);
    assert_true(plan_f8e4m3_to_f32(0xfe) == -448.0f);
    assert_true(plan_f8e4m3_to_f32(0x78) == 256.0f); /* top exponent holds numbers: no infinity */
    assert_true(isnan(plan_f8e4m3_to_f32(0x7f)) && isnan(plan_f8e4m3_to_f32(0xff)));
    assert_true(plan_f8e4m3_to_f32(0x38) == 1.0f);
    assert_true(plan_f8e4m3_to_f32(0xb8) == -1.0f);
    assert_true(plan_f8e4m3_to_f32(0x08) == 0x1p-6f);
    assert_true(plan_f8e4m3_to_f32(0x01) == 0x1p-9f);
    assert_true(plan_f8e4m3_to_f32(0x07) == 7 * 0x1p-9f);
    assert_true(plan_f8e4m3_to_f32(0x00) == 0.0f && signbit(plan_f8e4m3_to_f32(0x80)));

    assert_true(plan_f8e5m2_to_f32(0x7b) == 57344.0f);
    assert_true(plan_f8e5m2_to_f32(0x3c) == 1.0f);
    assert_true(plan_f8e5m2_to_f32(0x01) == 0x1p-16f);
    assert_true(plan_f8e5m2_to_f32(0x04) == 0x1p-14f);
    assert_true(isinf(plan_f8e5m2_to_f32(0x7c)) && plan_f8e5m2_to_f32(0xfc) < 0);
    assert_true(isnan(plan_f8e5m2_to_f32(0x7d)) && isnan(plan_f8e5m2_to_f32(0xff)));
}

/* The row forms (a weight's scales widened at once): the hand values above,
 * element by element (the sign of zero too), n of them and no more. */
static void test_widening_rows(void **state) {
    (void)state;
    const uint16_t f16[5] = {0x3c00, 0xc000, 0x0001, 0x7bff, 0x8000};
    const float f16_values[5] = {1.0f, -2.0f, 0x1p-24f, 65504.0f, -0.0f};
    const uint16_t bf16[5] = {0x3f80, 0xc000, 0x0001, 0x4049, 0x8000};
    const float bf16_values[5] = {1.0f, -2.0f, 0x1p-133f, 3.140625f, -0.0f};
    float out[6] = {7, 7, 7, 7, 7, 7};
    plan_f16_row_to_f32(f16, out, 5);
    assert_memory_equal(out, f16_values, sizeof f16_values);
    assert_true(out[5] == 7.0f);
    plan_bf16_row_to_f32(bf16, out, 5);
    assert_memory_equal(out, bf16_values, sizeof bf16_values);
    assert_true(out[5] == 7.0f);
    plan_f16_row_to_f32(f16, out, 0);
    assert_memory_equal(out, bf16_values, sizeof bf16_values);
}

static void test_narrowing_rounds_to_nearest_even(void **state) {
    (void)state;
    assert_int_equal(plan_f32_to_bf16(1.0f), 0x3f80);
    assert_int_equal(plan_f32_to_bf16(plan_f32_from_bits(0x3f808000)), 0x3f80); /* tie, even stays */
    assert_int_equal(plan_f32_to_bf16(plan_f32_from_bits(0x3f818000)), 0x3f82); /* tie, odd rounds up */
    assert_int_equal(plan_f32_to_bf16(plan_f32_from_bits(0x3f808001)), 0x3f81); /* above the tie */
    assert_int_equal(plan_f32_to_bf16(plan_f32_from_bits(0x7f7fffff)), 0x7f80); /* FLT_MAX overflows */
    assert_int_equal(plan_f32_to_bf16(-0.0f), 0x8000);
    uint16_t nan16 = plan_f32_to_bf16(NAN);
    assert_true((nan16 & 0x7f80) == 0x7f80 && (nan16 & 0x7f));

    assert_int_equal(plan_f32_to_f16(1.0f), 0x3c00);
    assert_int_equal(plan_f32_to_f16(-2.0f), 0xc000);
    assert_int_equal(plan_f32_to_f16(65504.0f), 0x7bff);
    assert_int_equal(plan_f32_to_f16(65519.0f), 0x7bff);
    assert_int_equal(plan_f32_to_f16(65520.0f), 0x7c00); /* the tie above the largest rounds to inf */
    assert_int_equal(plan_f32_to_f16(1e10f), 0x7c00);
    assert_int_equal(plan_f32_to_f16(-INFINITY), 0xfc00);
    assert_int_equal(plan_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);     /* tie to even */
    assert_int_equal(plan_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02); /* tie to even, up */
    assert_int_equal(plan_f32_to_f16(0x1p-14f), 0x0400);
    assert_int_equal(plan_f32_to_f16(0x1p-24f), 0x0001);
    assert_int_equal(plan_f32_to_f16(0x1p-25f), 0x0000);        /* tie between 0 and the smallest: 0 */
    assert_int_equal(plan_f32_to_f16(1.5f * 0x1p-25f), 0x0001); /* above the tie */
    assert_int_equal(plan_f32_to_f16(3 * 0x1p-25f), 0x0002);    /* 1.5 steps: tie to even 2 */
    assert_int_equal(plan_f32_to_f16(plan_f32_from_bits(0x00000001)), 0x0000);
    assert_int_equal(plan_f32_to_f16(-0x1p-30f), 0x8000);
    assert_true((plan_f32_to_f16(NAN) & 0x7c00) == 0x7c00 && (plan_f32_to_f16(NAN) & 0x3ff));

    assert_int_equal(plan_f32_to_f8e4m3(448.0f), 0x7e);
    assert_int_equal(plan_f32_to_f8e4m3(464.0f), 0x7e);  /* tie between 448 and 480: even */
    assert_int_equal(plan_f32_to_f8e4m3(1000.0f), 0x7e); /* saturates: no infinity */
    assert_int_equal(plan_f32_to_f8e4m3(-INFINITY), 0xfe);
    assert_int_equal(plan_f32_to_f8e4m3(NAN), 0x7f);
    assert_int_equal(plan_f32_to_f8e4m3(1.0f), 0x38);
    assert_int_equal(plan_f32_to_f8e4m3(0x1p-10f), 0x00);
    assert_int_equal(plan_f32_to_f8e4m3(3 * 0x1p-10f), 0x02);

    assert_int_equal(plan_f32_to_f8e5m2(57344.0f), 0x7b);
    assert_int_equal(plan_f32_to_f8e5m2(61440.0f), 0x7c); /* tie above the largest, odd: inf */
    assert_int_equal(plan_f32_to_f8e5m2(1.0f), 0x3c);
    assert_int_equal(plan_f32_to_f8e5m2(-0x1p-16f), 0x81);
}

/* Every non-NaN pattern of each narrow format survives widening and
 * narrowing unchanged. */
static void test_round_trip_every_pattern(void **state) {
    (void)state;
    for (uint32_t h = 0; h <= 0xffff; h++) {
        float f16 = plan_f16_to_f32((uint16_t)h), bf16 = plan_bf16_to_f32((uint16_t)h);
        if (!isnan(f16) && plan_f32_to_f16(f16) != h)
            fail_msg("f16 0x%04x -> %a -> 0x%04x", h, f16, plan_f32_to_f16(f16));
        if (!isnan(bf16) && plan_f32_to_bf16(bf16) != h) fail_msg("bf16 0x%04x", h);
        if (h <= 0xff) {
            float e4 = plan_f8e4m3_to_f32((uint8_t)h), e5 = plan_f8e5m2_to_f32((uint8_t)h);
            if (!isnan(e4) && plan_f32_to_f8e4m3(e4) != h) fail_msg("e4m3 0x%02x", h);
            if (!isnan(e5) && plan_f32_to_f8e5m2(e5) != h) fail_msg("e5m2 0x%02x", h);
            /* e5m2 is the top byte of f16 */
            float wide = plan_f16_to_f32((uint16_t)(h << 8));
            assert_true((isnan(e5) && isnan(wide)) || memcmp(&e5, &wide, sizeof e5) == 0);
        }
    }
}

/* Where the compiler has _Float16 (gcc 12 on x86-64 and aarch64), its
 * conversions are an independent oracle: every f16 pattern widened, and a
 * million f32 patterns (random, biased towards the f16 range) narrowed. */
static void test_f16_matches_the_compiler(void **state) {
    (void)state;
#if defined(__FLT16_MAX__)
    for (uint32_t h = 0; h <= 0xffff; h++) {
        uint16_t bits = (uint16_t)h;
        _Float16 x;
        memcpy(&x, &bits, 2);
        float ours = plan_f16_to_f32(bits), theirs = (float)x;
        if (!(isnan(ours) && isnan(theirs)) && memcmp(&ours, &theirs, 4) != 0)
            fail_msg("widening f16 0x%04x", h);
    }
    uint64_t seed = 88172645463325252u;
    for (int i = 0; i < 1000000; i++) {
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        uint32_t bits = (uint32_t)seed;
        if (i % 2)
            bits = (bits & 0x81ffffffu) |
                   ((uint32_t)(0x30 + (seed >> 40) % 0x18) << 24); /* |x| near 2^-31..2^17 */
        float f = plan_f32_from_bits(bits);
        _Float16 x = (_Float16)f;
        uint16_t theirs;
        memcpy(&theirs, &x, 2);
        uint16_t ours = plan_f32_to_f16(f);
        if (isnan(f))
            assert_true((ours & 0x7c00) == 0x7c00 && (ours & 0x3ff));
        else if (ours != theirs)
            fail_msg("narrowing %a (0x%08x): ours 0x%04x, compiler 0x%04x", f, bits, ours, theirs);
    }
#else
    skip();
#endif
}

/* ---- writer and reader --------------------------------------------------------------- */

static void test_round_trip_through_a_file(void **state) {
    (void)state;
    float weight[6] = {1, -2, 3.5f, 0, 1e-3f, -7};
    uint16_t bf16[4] = {0x3f80, 0xc000, 0x4049, 0x0000};
    uint16_t f16[4] = {0x3c00, 0x0001, 0x7bff, 0xc000};
    int32_t ints[3] = {7, -1, 123456};
    uint8_t e4m3[2] = {0x7e, 0x38};
    int64_t scalar = -5;
    uint64_t shape_w[] = {2, 3}, shape_4[] = {4}, shape_22[] = {2, 2}, shape_3[] = {3}, shape_0[] = {0, 5},
             shape_2[] = {2};
    st_write_tensor tensors[] = {
        {"model.layers.0.weight", ST_DTYPE_F32, 2, shape_w, weight},
        {"norm", ST_DTYPE_BF16, 1, shape_4, bf16},
        {"half \"quoted\"\n", ST_DTYPE_F16, 2, shape_22, f16},
        {"ids", ST_DTYPE_I32, 1, shape_3, ints},
        {"empty", ST_DTYPE_U8, 2, shape_0, NULL},
        {"fp8", ST_DTYPE_F8_E4M3, 1, shape_2, e4m3},
        {"scalar", ST_DTYPE_I64, 0, NULL, &scalar},
    };
    const char *path = path_in("out.safetensors");
    assert_true(st_write_file(path, tensors, 7, "{\"format\": \"pt\", \"note\": \"caf\xc3\xa9\"}", &diag));
    assert_int_equal(count_files(folder), 1); /* no temporary file left */

    st_file f;
    assert_true(st_file_open(path, &f, &diag));
    assert_int_equal(diag.error_count, 0);
    assert_int_equal(f.tensor_count, 7);
    for (int i = 0; i < 7; i++) {
        const st_tensor *t = &f.tensors[i];
        assert_string_equal(t->name, tensors[i].name); /* header order kept */
        assert_ptr_equal(st_file_find(&f, tensors[i].name), t);
        assert_int_equal(t->dtype, tensors[i].dtype);
        assert_int_equal(t->rank, tensors[i].rank);
        uint64_t bytes = st_dtype_size(t->dtype);
        for (uint32_t k = 0; k < t->rank; k++) {
            assert_int_equal(t->shape[k], tensors[i].shape[k]);
            bytes *= t->shape[k];
        }
        assert_int_equal(t->byte_size, bytes);
        if (bytes) assert_memory_equal(t->data, tensors[i].data, bytes);
    }
    assert_null(st_file_find(&f, "missing"));
    assert_string_equal(st_file_metadata(&f, "format"), "pt");
    assert_string_equal(st_file_metadata(&f, "note"), "caf\xc3\xa9");
    assert_null(st_file_metadata(&f, "absent"));

    /* The header is padded with spaces to a multiple of 8 and starts with the metadata. */
    const unsigned char *bytes = f.map;
    uint64_t header_length = 0;
    for (int i = 7; i >= 0; i--)
        header_length = header_length << 8 | bytes[i];
    assert_int_equal(header_length % 8, 0);
    assert_memory_equal(bytes + 8, "{\"__metadata__\":{\"format\":\"pt\"", 30);

    float converted[4];
    const st_tensor *norm = st_file_find(&f, "norm");
    st_convert_to_f32(norm->dtype, norm->data, converted, 4);
    assert_true(converted[0] == 1.0f && converted[1] == -2.0f && converted[2] == 3.140625f &&
                converted[3] == 0);
    const st_tensor *half = st_file_find(&f, "half \"quoted\"\n");
    st_convert_to_f32(half->dtype, half->data, converted, 4);
    assert_true(converted[0] == 1.0f && converted[1] == 0x1p-24f && converted[2] == 65504.0f &&
                converted[3] == -2.0f);
    st_file_close(&f);
    assert_null(f.map);
}

/* The exact bytes of a small file, as the reference implementation writes it. */
static void test_writer_bytes(void **state) {
    (void)state;
    float data[2] = {1.0f, 2.0f};
    uint64_t shape[] = {2};
    st_write_tensor t = {"a", ST_DTYPE_F32, 1, shape, data};
    const char *path = path_in("a.safetensors");
    assert_true(st_write_file(path, &t, 1, NULL, &diag));
    const char header[] = "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}"; /* 54 bytes */
    unsigned char expected[8 + 56 + 8] = {56};
    memcpy(expected + 8, header, 54);
    memset(expected + 8 + 54, ' ', 2);
    memcpy(expected + 64, data, 8);
    FILE *fp = fopen(path, "rb");
    assert_non_null(fp);
    unsigned char got[sizeof expected + 1];
    assert_int_equal(fread(got, 1, sizeof got, fp), sizeof expected);
    fclose(fp);
    assert_memory_equal(got, expected, sizeof expected);
}

static void test_writer_refuses_bad_tensors(void **state) {
    (void)state;
    float data[2] = {0};
    uint64_t shape[] = {2}, huge[] = {1ull << 32, 1ull << 32, 4}, deep[9] = {1, 1, 1, 1, 1, 1, 1, 1, 1};
    st_write_tensor twice[] = {{"a", ST_DTYPE_F32, 1, shape, data},
                               {"b", ST_DTYPE_F32, 1, shape, data},
                               {"a", ST_DTYPE_F32, 1, shape, data}};
    const char *path = path_in("bad.safetensors");
    assert_false(st_write_file(path, twice, 3, NULL, &diag));
    expect_diag("bad.safetensors: error: tensor 'a' is given more than once");

    st_write_tensor bad[] = {{"overflow", ST_DTYPE_F32, 3, huge, data},
                             {"deep", ST_DTYPE_F32, 9, deep, data},
                             {"no data", ST_DTYPE_F32, 1, shape, NULL},
                             {"bad \xff name", ST_DTYPE_F32, 1, shape, data}};
    assert_false(st_write_file(path, bad, 4, NULL, &diag));
    expect_diag("tensor 'overflow': the byte size overflows 64 bits");
    expect_diag("tensor 'deep': rank 9; expected a shape of at most 8 dims");
    expect_diag("tensor 'no data': 8 bytes of data expected, found none");
    expect_diag("tensor 3: the name is not valid UTF-8");

    assert_false(st_write_file(path, twice, 1, "{\"a\": 1}", &diag));
    expect_diag("metadata must be a JSON object of strings; 'a' is not a string");
    assert_false(st_write_file(path, twice, 1, "[", &diag));
    expect_diag("metadata is not valid JSON");
    assert_int_equal(count_files(folder), 0);

    assert_false(st_write_file(path_in("no-such-folder/x.safetensors"), twice, 1, NULL, &diag));
    expect_diag("cannot create a temporary file beside the output");
}

/* An existing file is replaced whole. */
static void test_writer_replaces_atomically(void **state) {
    (void)state;
    const char *path = path_in("m.safetensors");
    write_bytes(path, "old", 3);
    uint8_t data[3] = {1, 2, 3};
    uint64_t shape[] = {3};
    st_write_tensor t = {"x", ST_DTYPE_U8, 1, shape, data};
    assert_true(st_write_file(path, &t, 1, NULL, &diag));
    st_file f;
    assert_true(st_file_open(path, &f, &diag));
    assert_memory_equal(st_file_find(&f, "x")->data, data, 3);
    st_file_close(&f);
    assert_int_equal(count_files(folder), 1);
}

/* ---- broken files: each refused with its own message ---------------------------------- */

static void test_refuses_truncated_files(void **state) {
    (void)state;
    const char *path = path_in("model.safetensors");
    st_file f;
    write_bytes(path, "\x10\0\0\0", 4);
    assert_false(st_file_open(path, &f, &diag));
    expect_diag(
        "model.safetensors: error: file is 4 bytes; a safetensors file starts with an 8-byte header length");
    write_bytes(path, "", 0);
    assert_false(st_file_open(path, &f, &diag));
    expect_diag("file is 0 bytes");

    /* The header is cut: 100 bytes declared, 50 present. */
    write_raw(path, "{\"a\": {\"dtype\": \"F32\", \"shape\": [2], \"data_offsets\": [0, 8]}}", 100, 0);
    assert_false(st_file_open(path, &f, &diag));
    expect_diag("header length 100 runs past the end of the file: only 61 bytes follow the 8-byte length");

    write_raw(path, "{}", 1ull << 40, 0);
    assert_false(st_file_open(path, &f, &diag));
    expect_diag("header length 1099511627776 is over the limit of 104857600 bytes");

    assert_false(st_file_open(path_in("absent.safetensors"), &f, &diag));
    expect_diag("absent.safetensors: error: cannot open the file: No such file or directory");
    assert_false(st_file_open(folder, &f, &diag));
    expect_diag("expected a safetensors file, found a folder");
    assert_int_equal(diag.error_count, 6);
}

static void test_refuses_overlap(void **state) {
    (void)state;
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[4,12]}}",
                   12, "tensor 'b': data_offsets [4, 12] overlap tensor 'a' at [0, 8]");
    assert_int_equal(diag.error_count, 1);
}

static void test_refuses_gap(void **state) {
    (void)state;
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[12,20]}}",
                   20, "bytes [8, 12) of the data section belong to no tensor (a gap before tensor 'b')");
    assert_int_equal(diag.error_count, 1);
}

static void test_refuses_trailing_bytes(void **state) {
    (void)state;
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]}}", 12,
                   "the last 4 bytes of the data section (from byte 8) belong to no tensor");
    assert_int_equal(diag.error_count, 1);
}

static void test_refuses_offsets_past_the_end(void **state) {
    (void)state;
    expect_refused(
        "{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
        "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]}}",
        10, "tensor 'b': data_offsets [8, 16] run past the end of the data section, which holds 10 bytes");
    assert_int_equal(diag.error_count, 1); /* one truncation, one message */
}

/* A file cut short in its data: the first tensor cut off is named, the
 * others counted, in one message (there used to be one per tensor, up to
 * the error limit). */
static void test_truncated_data_is_one_error(void **state) {
    (void)state;
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[0,8]},"
                   "\"b\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[8,16]},"
                   "\"c\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[16,24]},"
                   "\"d\":{\"dtype\":\"F32\",\"shape\":[2],\"data_offsets\":[24,32]}}",
                   10,
                   "tensor 'b': data_offsets [8, 16] run past the end of the data section, which holds 10 "
                   "bytes; so do 2 more tensors after it (a truncated file? its tensors need 32 bytes)\n");
    assert_int_equal(diag.error_count, 1);
}

static void test_refuses_size_mismatch(void **state) {
    (void)state;
    expect_refused(
        "{\"model.layers.0.mlp.up_proj.weight\":"
        "{\"dtype\":\"F32\",\"shape\":[4,8],\"data_offsets\":[0,96]}}",
        96,
        "model.safetensors: error: tensor 'model.layers.0.mlp.up_proj.weight': data_offsets [0, 96] "
        "hold 96 bytes but F32[4, 8] needs 128\n");
}

static void test_refuses_size_overflow(void **state) {
    (void)state;
    expect_refused("{\"a\":{\"dtype\":\"BF16\",\"shape\":[4294967296,4294967296],\"data_offsets\":[0,0]}}", 0,
                   "tensor 'a': the byte size of BF16[4294967296, 4294967296] overflows 64 bits");
}

static void test_refuses_dtypes(void **state) {
    (void)state;
    expect_refused("{\"a\":{\"dtype\":\"F33\",\"shape\":[2],\"data_offsets\":[0,8]}}", 8,
                   "tensor 'a': unknown dtype 'F33'; expected one of F32, F16");
    expect_refused("{\"a\":{\"dtype\":\"F64\",\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
                   "tensor 'a': dtype F64 is not supported; smelt reads F32");
    expect_refused("{\"a\":{\"dtype\":7,\"shape\":[1],\"data_offsets\":[0,8]}}", 8,
                   "tensor 'a': 'dtype' must be a string such as \"F32\", found an integer");
}

static void test_refuses_duplicate_keys(void **state) {
    (void)state;
    expect_refused("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]},"
                   "\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[1,2]}}",
                   2, "header is not valid JSON: duplicate object key");
}

static void test_refuses_bad_utf8(void **state) {
    (void)state;
    expect_refused("{\"\xff\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}", 1,
                   "model.safetensors: error: header is not valid UTF-8\n");
    expect_refused("{\"\xc0\xaf\":{}}", 0, "header is not valid UTF-8");     /* overlong '/' */
    expect_refused("{\"\xed\xa0\x80\":{}}", 0, "header is not valid UTF-8"); /* a surrogate */
    expect_refused("{\"\xe2\x82\":{}}", 0, "header is not valid UTF-8");     /* cut sequence */
    assert_int_equal(diag.error_count, 4);
    assert_false(st_utf8_valid("\xf4\x90\x80\x80", 4)); /* above U+10FFFF */
    assert_false(st_utf8_valid("\x80", 1));             /* a continuation byte first */
    assert_true(st_utf8_valid("\xf4\x8f\xbf\xbf", 4));  /* U+10FFFF */
    assert_true(st_utf8_valid("a\0b", 3));              /* NUL is UTF-8 (JSON refuses it) */
    /* Real UTF-8 names are fine. */
    const char *path = path_in("ok.safetensors");
    write_raw(path,
              "{\"caf\xc3\xa9 \xf0\x9f\x98\x80\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1]}}",
              UINT64_MAX, 1);
    st_file f;
    assert_true(st_file_open(path, &f, &diag));
    assert_non_null(st_file_find(&f, "caf\xc3\xa9 \xf0\x9f\x98\x80"));
    st_file_close(&f);
}

static void test_refuses_bad_json(void **state) {
    (void)state;
    expect_refused("[1, 2]", 0, "header is a list; expected a JSON object of tensors");
    expect_refused("{\"a\": ", 0, "header is not valid JSON: ");
    expect_refused("{\"a\":{\"dtype\":\"U8\",\"shape\":[99999999999999999999],\"data_offsets\":[0,1]}}", 1,
                   "header is not valid JSON: too big integer");
    expect_refused("{\"a\": \"tensor\"}", 0,
                   "tensor 'a': expected an object with dtype, shape and data_offsets, found a string");
    expect_refused("{\"__metadata__\": {\"format\": 1}}", 0,
                   "'__metadata__' must be an object of strings; 'format' holds an integer");
    expect_refused("{\"__metadata__\": [\"pt\"]}", 0,
                   "'__metadata__' must be an object of strings, found a list");
}

static void test_refuses_bad_offsets(void **state) {
    (void)state;
    expect_refused("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[-1,0]}}", 1,
                   "tensor 'a': data_offsets[0] is -1; expected a non-negative integer");
    expect_refused("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1.0]}}", 1,
                   "tensor 'a': data_offsets[1] is 1.0; expected a non-negative integer");
    expect_refused("{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0]}}", 1,
                   "tensor 'a': 'data_offsets' must be a list [begin, end] of two non-negative integers, "
                   "found a list of another length");
    expect_refused("{\"a\":{\"dtype\":\"U8\",\"shape\":[0],\"data_offsets\":[1,0]}}", 1,
                   "tensor 'a': data_offsets [1, 0] end before they begin");
    expect_refused("{\"a\":{\"dtype\":\"U8\",\"shape\":[-2],\"data_offsets\":[0,0]}}", 0,
                   "tensor 'a': shape[0] is -2; expected a non-negative integer");
    expect_refused("{\"a\":{\"dtype\":\"U8\",\"shape\":[1,1,1,1,1,1,1,1,1],\"data_offsets\":[0,1]}}", 1,
                   "tensor 'a': shape has 9 dims; at most 8 are supported");
    expect_refused("{\"a\":{\"dtype\":\"U8\",\"shape\":\"1\",\"data_offsets\":[0,1]}}", 1,
                   "tensor 'a': 'shape' must be a list of non-negative integers, found a string");
}

static void test_refuses_missing_and_extra_fields(void **state) {
    (void)state;
    expect_refused("{\"a\":{\"dtype\":\"U8\",\"data_offsets\":[0,1]}}", 1,
                   "tensor 'a': missing field 'shape'");
    expect_refused("{\"a\":{\"shape\":[1],\"data_offsets\":[0,1]}}", 1, "tensor 'a': missing field 'dtype'");
    expect_refused("{\"a\":{\"dtype\":\"U8\",\"shape\":[1]}}", 1, "tensor 'a': missing field 'data_offsets'");
    expect_refused(
        "{\"a\":{\"dtype\":\"U8\",\"shape\":[1],\"data_offsets\":[0,1],\"strides\":[1]}}", 1,
        "tensor 'a': unexpected field 'strides'; an entry holds only dtype, shape and data_offsets");
}

/* Every problem of a header is reported, not only the first. */
static void test_reports_every_problem(void **state) {
    (void)state;
    expect_refused("{\"a\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]},"
                   "\"b\":{\"dtype\":\"Q4\",\"shape\":[2],\"data_offsets\":[8,16]},"
                   "\"c\":{\"dtype\":\"U8\",\"shape\":[2]}}",
                   16, "tensor 'a': data_offsets [0, 8] hold 8 bytes but F32[3] needs 12");
    expect_diag("tensor 'b': unknown dtype 'Q4'");
    expect_diag("tensor 'c': missing field 'data_offsets'");
    assert_int_equal(diag.error_count, 3);
}

/* A long tensor name is cut in messages. */
static void test_long_names_are_cut(void **state) {
    (void)state;
    size_t length = 1 << 20;
    char *header = malloc(length + 128);
    assert_non_null(header);
    strcpy(header, "{\"");
    memset(header + 2, 'x', length);
    strcpy(header + 2 + length, "\":{\"dtype\":\"F32\",\"shape\":[3],\"data_offsets\":[0,8]}}");
    expect_refused(
        header, 8,
        "tensor 'xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx...': data_offsets");
    free(header);
    assert_true(strlen(diagnostics()) < 400);
}

/* Deep nesting is refused by the JSON parser's depth cap, not by our stack. */
static void test_refuses_deep_nesting(void **state) {
    (void)state;
    size_t depth = 10000;
    char *header = malloc(2 * depth + 16);
    assert_non_null(header);
    strcpy(header, "{\"a\":");
    size_t n = strlen(header);
    for (size_t i = 0; i < depth; i++)
        header[n++] = '[';
    for (size_t i = 0; i < depth; i++)
        header[n++] = ']';
    strcpy(header + n, "}");
    expect_refused(header, 0, "header is not valid JSON: maximum parsing depth reached");
    free(header);
}

/* The diag engine stops after 20 errors and so does the reader. */
static void test_stops_after_many_errors(void **state) {
    (void)state;
    char *header = malloc(100 * 64 + 16);
    assert_non_null(header);
    size_t n = (size_t)sprintf(header, "{");
    for (int i = 0; i < 100; i++)
        n += (size_t)sprintf(header + n, "%s\"t%d\":{\"dtype\":\"X\"}", i ? "," : "", i);
    strcpy(header + n, "}");
    expect_refused(header, 0, "too many errors (20); stopping");
    free(header);
    assert_int_equal(diag.error_count, 20);
    assert_int_equal(occurrences_of("too many errors"), 1);
}

/* Random damage to a valid file is refused or accepted, never a crash (the
 * sanitizer build checks the "never"). Deterministic: a fixed xorshift seed. */
static void test_damaged_files_never_crash(void **state) {
    (void)state;
    float a[6] = {1, 2, 3, 4, 5, 6};
    uint16_t b[3] = {1, 2, 3};
    uint64_t shape_a[] = {2, 3}, shape_b[] = {3};
    st_write_tensor tensors[] = {{"a", ST_DTYPE_F32, 2, shape_a, a}, {"b", ST_DTYPE_BF16, 1, shape_b, b}};
    const char *good = path_in("good.safetensors");
    assert_true(st_write_file(good, tensors, 2, "{\"format\":\"pt\"}", &diag));
    FILE *fp = fopen(good, "rb");
    assert_non_null(fp);
    unsigned char original[512];
    size_t size = fread(original, 1, sizeof original, fp);
    fclose(fp);
    assert_true(size > 64 && size < sizeof original);

    diag.max_errors = 0; /* count everything */
    const char *path = path_in("damaged.safetensors");
    uint64_t seed = 0x9e3779b97f4a7c15u;
    unsigned accepted = 0;
    for (int round = 0; round < 3000; round++) {
        unsigned char bytes[512];
        memcpy(bytes, original, size);
        size_t length = size;
        seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
        int damage = (int)(seed % 4);
        for (int k = 0; k <= damage; k++) {
            seed ^= seed << 13, seed ^= seed >> 7, seed ^= seed << 17;
            size_t at = (size_t)(seed >> 8) % size;
            const char specials[] = "{}[]\",:0-9e\\\xff\x80 ";
            bytes[at] = (seed & 1) ? (unsigned char)(seed >> 32)
                                   : (unsigned char)specials[(seed >> 40) % (sizeof specials - 1)];
        }
        if (round % 5 == 0) length = (size_t)(seed >> 20) % size; /* truncation */
        write_bytes(path, bytes, length);
        st_file f;
        unsigned errors = diag.error_count;
        if (st_file_open(path, &f, &diag)) {
            accepted++;
            assert_int_equal(diag.error_count, errors);
            for (uint32_t i = 0; i < f.tensor_count; i++)
                assert_ptr_equal(st_file_find(&f, f.tensors[i].name), &f.tensors[i]);
            st_file_close(&f);
        } else {
            assert_true(diag.error_count > errors);
            assert_null(f.map);
        }
    }
    assert_true(accepted < 3000);
}

static void test_accepts_empty_and_zero_size(void **state) {
    (void)state;
    const char *path = path_in("empty.safetensors");
    write_raw(path, "{}      ", UINT64_MAX, 0);
    st_file f;
    assert_true(st_file_open(path, &f, &diag));
    assert_int_equal(f.tensor_count, 0);
    assert_null(st_file_find(&f, "a"));
    st_file_close(&f);
    write_raw(path,
              "{\"z1\":{\"dtype\":\"F32\",\"shape\":[0],\"data_offsets\":[0,0]},"
              "\"a\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]},"
              "\"z2\":{\"dtype\":\"I64\",\"shape\":[3,0],\"data_offsets\":[2,2]}}",
              UINT64_MAX, 2);
    assert_true(st_file_open(path, &f, &diag));
    assert_int_equal(f.tensor_count, 3);
    assert_int_equal(st_file_find(&f, "z2")->byte_size, 0);
    st_file_close(&f);
    assert_int_equal(diag.error_count, 0);
}

/* ---- checkpoints ------------------------------------------------------------------------ */

/* Writes a shard holding U8 tensors named in `names` (NULL-terminated), each
 * of one byte equal to its position + `first`. */
static void write_shard(const char *path, const char *const *names, uint8_t first) {
    static uint8_t bytes[16];
    static const uint64_t one[] = {1};
    st_write_tensor tensors[16];
    size_t n = 0;
    for (; names[n]; n++) {
        bytes[n] = (uint8_t)(first + n);
        tensors[n] = (st_write_tensor){names[n], ST_DTYPE_U8, 1, one, &bytes[n]};
    }
    assert_true(st_write_file(path, tensors, n, NULL, &diag));
}

static uint8_t value_of(const st_checkpoint *ck, const char *name) {
    const st_tensor *t = st_checkpoint_find(ck, name);
    if (!t) fail_msg("no tensor '%s'", name);
    return *(const uint8_t *)t->data;
}

static void test_checkpoint_single_file_and_folder(void **state) {
    (void)state;
    write_shard(path_in("model.safetensors"), (const char *const[]){"a", "b", NULL}, 10);
    write_shard(path_in("other.safetensors"), (const char *const[]){"c", NULL}, 20);
    st_checkpoint ck;
    assert_true(st_checkpoint_open(path_in("other.safetensors"), &ck, &diag));
    assert_int_equal(ck.tensor_count, 1);
    assert_int_equal(value_of(&ck, "c"), 20);
    st_checkpoint_close(&ck);
    /* A folder with model.safetensors is that file, whatever else is there. */
    assert_true(st_checkpoint_open(folder, &ck, &diag));
    assert_int_equal(ck.shard_count, 1);
    assert_int_equal(ck.tensor_count, 2);
    assert_int_equal(value_of(&ck, "b"), 11);
    assert_null(st_checkpoint_find(&ck, "c"));
    st_checkpoint_close(&ck);
    assert_int_equal(diag.error_count, 0);
}

static void test_checkpoint_folder_of_shards(void **state) {
    (void)state;
    write_shard(path_in("b-00002.safetensors"), (const char *const[]){"x", "y", NULL}, 1);
    write_shard(path_in("a-00001.safetensors"), (const char *const[]){"w", NULL}, 5);
    write_bytes(path_in("README.md"), "hi", 2);
    st_checkpoint ck;
    assert_true(st_checkpoint_open(folder, &ck, &diag));
    assert_int_equal(ck.shard_count, 2);
    assert_int_equal(ck.tensor_count, 3);
    assert_string_equal(ck.tensors[0]->name, "w"); /* shards in name order */
    assert_int_equal(value_of(&ck, "w"), 5);
    assert_int_equal(value_of(&ck, "y"), 2);
    assert_int_equal(st_checkpoint_index(&ck, "x"), 1);
    assert_int_equal(st_checkpoint_index(&ck, "nope"), UINT32_MAX);
    st_checkpoint_close(&ck);

    /* The same name in two shards is an error. */
    write_shard(path_in("c-00003.safetensors"), (const char *const[]){"y", NULL}, 9);
    assert_false(st_checkpoint_open(folder, &ck, &diag));
    expect_diag("tensor 'y' is in two shards: '");
    expect_diag("b-00002.safetensors' and '");
    assert_int_equal(ck.shard_count, 0);
}

static void test_checkpoint_empty_folder(void **state) {
    (void)state;
    st_checkpoint ck;
    assert_false(st_checkpoint_open(folder, &ck, &diag));
    expect_diag("the folder holds no model.safetensors.index.json, no model.safetensors and no other "
                "*.safetensors file");
    assert_false(st_checkpoint_open(path_in("nothing"), &ck, &diag));
    expect_diag("cannot open the checkpoint: No such file or directory");
}

static void write_text(const char *path, const char *text) { write_bytes(path, text, strlen(text)); }

static void test_checkpoint_index(void **state) {
    (void)state;
    mkdir(path_in("sub"), 0755);
    write_shard(path_in("model-00001-of-00002.safetensors"), (const char *const[]){"a", "b", NULL}, 1);
    write_shard(path_in("sub/model-00002-of-00002.safetensors"), (const char *const[]){"c", "d", NULL}, 3);
    write_text(
        path_in("model.safetensors.index.json"),
        "{\"metadata\": {\"total_size\": 4}, \"weight_map\": {"
        "\"a\": \"model-00001-of-00002.safetensors\", \"c\": \"sub/model-00002-of-00002.safetensors\","
        "\"b\": \"./model-00001-of-00002.safetensors\", \"d\": \"sub/model-00002-of-00002.safetensors\"}}");
    st_checkpoint ck;
    assert_true(st_checkpoint_open(path_in("model.safetensors.index.json"), &ck, &diag));
    assert_int_equal(ck.shard_count, 2); /* each shard once, even under two spellings */
    assert_int_equal(ck.tensor_count, 4);
    assert_int_equal(value_of(&ck, "a"), 1);
    assert_int_equal(value_of(&ck, "b"), 2);
    assert_int_equal(value_of(&ck, "c"), 3);
    assert_int_equal(value_of(&ck, "d"), 4);
    st_checkpoint_close(&ck);
    /* The folder finds its index. */
    assert_true(st_checkpoint_open(folder, &ck, &diag));
    assert_int_equal(ck.tensor_count, 4);
    st_checkpoint_close(&ck);
    assert_int_equal(diag.error_count, 0);
}

static void test_checkpoint_index_mismatch(void **state) {
    (void)state;
    write_shard(path_in("s1.safetensors"), (const char *const[]){"a", "extra", NULL}, 1);
    write_shard(path_in("s2.safetensors"), (const char *const[]){"b", NULL}, 1);
    write_text(path_in("index.json"), "{\"weight_map\": {\"a\": \"s1.safetensors\", \"b\": "
                                      "\"s1.safetensors\", \"z\": \"s2.safetensors\"}}");
    st_checkpoint ck;
    assert_false(st_checkpoint_open(path_in("index.json"), &ck, &diag));
    expect_diag("index.json: error: the index lists tensor 'b' in shard '");
    expect_diag("s1.safetensors', which does not hold it");
    expect_diag("the index lists tensor 'z' in shard '");
    expect_diag("s1.safetensors' holds tensor 'extra', which the index does not list");
    expect_diag("s2.safetensors' holds tensor 'b', which the index lists in shard 's1.safetensors'");
    assert_int_equal(diag.error_count, 4);
}

static void test_checkpoint_index_refuses_escapes(void **state) {
    (void)state;
    mkdir(path_in("model"), 0755);
    write_shard(path_in("outside.safetensors"), (const char *const[]){"c", NULL}, 1);
    write_shard(path_in("model/in.safetensors"), (const char *const[]){"a", NULL}, 1);
    assert_int_equal(symlink("../outside.safetensors", path_in("model/link.safetensors")), 0);
    /* A sibling folder whose name starts with the index folder's name. */
    mkdir(path_in("model2"), 0755);
    write_shard(path_in("model2/near.safetensors"), (const char *const[]){"j", NULL}, 1);
    /* A folder on the way that is a symbolic link out of the index's folder
     * (only the last component may be a link). */
    assert_int_equal(symlink("../model2", path_in("model/sub")), 0);
    write_text(path_in("model/model.safetensors.index.json"),
               "{\"weight_map\": {\"a\": \"in.safetensors\", \"b\": \"../outside.safetensors\","
               "\"c\": \"/etc/passwd\", \"d\": \"link.safetensors\", \"e\": \"in.safetensors/../../x\","
               "\"f\": \"missing.safetensors\", \"g\": \"\", \"h\": 3, \"i\": \"/etc/passwd\","
               "\"j\": \"sub/near.safetensors\", \"k\": \"sub/..\"}}");
    st_checkpoint ck;
    assert_false(st_checkpoint_open(path_in("model"), &ck, &diag));
    expect_diag("shard '../outside.safetensors' (of tensor 'b') leaves the index's folder through '..'");
    expect_diag("shard '/etc/passwd' (of tensor 'c') is an absolute path");
    expect_diag("shard 'in.safetensors/../../x' (of tensor 'e') leaves the index's folder through '..'");
    expect_diag("cannot open shard 'missing.safetensors' (of tensor 'f'): No such file or directory");
    expect_diag("shard '' (of tensor 'g') is empty");
    expect_diag("tensor 'h' maps to no string");
    expect_diag("shard 'sub/near.safetensors' (of tensor 'j') lies in '");
    expect_diag("model2', outside the index's folder");
    expect_diag("shard 'sub/..' (of tensor 'k') names the index's folder itself, not a file");
    /* 'link.safetensors', a link as the last component, is allowed */
    assert_int_equal(occurrences_of("'link.safetensors'"), 0);
    assert_int_equal(diag.error_count, 8); /* '/etc/passwd' reported once */
    assert_int_equal(ck.shard_count, 0);
}

/* A Hugging Face hub cache: the snapshot's index and shards are symbolic
 * links into ../../blobs. The index, its folder and a single shard all open
 * it alike; a shard name with a '..' that stays inside is normalised. */
static void test_checkpoint_hub_cache_snapshot(void **state) {
    (void)state;
    mkdir(path_in("blobs"), 0755);
    mkdir(path_in("snapshots"), 0755);
    mkdir(path_in("snapshots/abc"), 0755);
    mkdir(path_in("snapshots/abc/sub"), 0755);
    write_shard(path_in("blobs/1111"), (const char *const[]){"a", NULL}, 10);
    write_shard(path_in("blobs/2222"), (const char *const[]){"b", NULL}, 20);
    write_text(path_in("blobs/3333"), "{\"weight_map\": {\"a\": \"model-00001-of-00002.safetensors\", "
                                      "\"b\": \"sub/../model-00002-of-00002.safetensors\"}}");
    assert_int_equal(symlink("../../blobs/1111", path_in("snapshots/abc/model-00001-of-00002.safetensors")),
                     0);
    assert_int_equal(symlink("../../blobs/2222", path_in("snapshots/abc/model-00002-of-00002.safetensors")),
                     0);
    assert_int_equal(symlink("../../blobs/3333", path_in("snapshots/abc/model.safetensors.index.json")), 0);
    const char *forms[] = {path_in("snapshots/abc/model.safetensors.index.json"), path_in("snapshots/abc")};
    for (size_t i = 0; i < 2; i++) {
        st_checkpoint ck;
        if (!st_checkpoint_open(forms[i], &ck, &diag)) fail_msg("%s:\n%s", forms[i], diagnostics());
        assert_int_equal(ck.shard_count, 2);
        assert_int_equal(value_of(&ck, "a"), 10);
        assert_int_equal(value_of(&ck, "b"), 20);
        st_checkpoint_close(&ck);
    }
    st_checkpoint ck;
    assert_true(st_checkpoint_open(path_in("snapshots/abc/model-00002-of-00002.safetensors"), &ck, &diag));
    assert_int_equal(value_of(&ck, "b"), 20);
    st_checkpoint_close(&ck);
    assert_int_equal(diag.error_count, 0);
}

static void test_checkpoint_index_bad_json(void **state) {
    (void)state;
    st_checkpoint ck;
    write_text(path_in("a.json"), "{\n  \"weight_map\": {\"a\": }\n}\n");
    assert_false(st_checkpoint_open(path_in("a.json"), &ck, &diag));
    expect_diag("a.json:2:");
    expect_diag("error: the index is not valid JSON");
    write_text(path_in("b.json"), "{\"metadata\": {}}");
    assert_false(st_checkpoint_open(path_in("b.json"), &ck, &diag));
    expect_diag("b.json: error: the index must be a JSON object whose \"weight_map\" maps tensor names to "
                "shard files, found no \"weight_map\"");
    write_text(path_in("c.json"), "{\"weight_map\": {}}");
    assert_false(st_checkpoint_open(path_in("c.json"), &ck, &diag));
    expect_diag("found an empty \"weight_map\"");
}

/* A broken shard is reported with its own path and the checkpoint refused. */
static void test_checkpoint_broken_shard(void **state) {
    (void)state;
    write_shard(path_in("a.safetensors"), (const char *const[]){"a", NULL}, 1);
    write_raw(path_in("b.safetensors"), "{\"b\":{\"dtype\":\"U8\",\"shape\":[2],\"data_offsets\":[0,2]}}",
              UINT64_MAX, 3);
    st_checkpoint ck;
    assert_false(st_checkpoint_open(folder, &ck, &diag));
    expect_diag(
        "b.safetensors: error: the last 1 byte of the data section (from byte 2) belongs to no tensor");
    assert_int_equal(diag.error_count, 1);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_widening_hand_values),
        cmocka_unit_test(test_widening_rows),
        cmocka_unit_test(test_narrowing_rounds_to_nearest_even),
        cmocka_unit_test(test_round_trip_every_pattern),
        cmocka_unit_test(test_f16_matches_the_compiler),
        cmocka_unit_test_setup_teardown(test_round_trip_through_a_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_writer_bytes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_writer_refuses_bad_tensors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_writer_replaces_atomically, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refuses_truncated_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refuses_overlap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refuses_gap, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refuses_trailing_bytes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refuses_offsets_past_the_end, setup, teardown),
        cmocka_unit_test_setup_teardown(test_truncated_data_is_one_error, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refuses_size_mismatch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refuses_size_overflow, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refuses_dtypes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refuses_duplicate_keys, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refuses_bad_utf8, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refuses_bad_json, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refuses_bad_offsets, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refuses_missing_and_extra_fields, setup, teardown),
        cmocka_unit_test_setup_teardown(test_reports_every_problem, setup, teardown),
        cmocka_unit_test_setup_teardown(test_long_names_are_cut, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refuses_deep_nesting, setup, teardown),
        cmocka_unit_test_setup_teardown(test_stops_after_many_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_damaged_files_never_crash, setup, teardown),
        cmocka_unit_test_setup_teardown(test_accepts_empty_and_zero_size, setup, teardown),
        cmocka_unit_test_setup_teardown(test_checkpoint_single_file_and_folder, setup, teardown),
        cmocka_unit_test_setup_teardown(test_checkpoint_folder_of_shards, setup, teardown),
        cmocka_unit_test_setup_teardown(test_checkpoint_empty_folder, setup, teardown),
        cmocka_unit_test_setup_teardown(test_checkpoint_index, setup, teardown),
        cmocka_unit_test_setup_teardown(test_checkpoint_index_mismatch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_checkpoint_index_refuses_escapes, setup, teardown),
        cmocka_unit_test_setup_teardown(test_checkpoint_hub_cache_snapshot, setup, teardown),
        cmocka_unit_test_setup_teardown(test_checkpoint_index_bad_json, setup, teardown),
        cmocka_unit_test_setup_teardown(test_checkpoint_broken_shard, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
