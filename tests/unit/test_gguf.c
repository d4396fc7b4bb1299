/* test_gguf.c - the GGUF reader, its dequantization and the llama import.
 *
 * The truths: gguf-py's own gguf.quants.dequantize (quants_expected.safetensors,
 * written by tests/reference/make_gguf_fixtures.py beside quants.gguf), a few
 * blocks decoded by hand here, and the safetensors checkpoint the tiny llama
 * GGUF was converted from. Dequantization is compared bit for bit: smelt
 * performs gguf-py's f32 operations in gguf-py's order, each rounded on its
 * own (gguf_quants.c), so nothing but a wrong bit position can differ.
 * Broken files are built byte by byte here, each refused with its message
 * and byte offset.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "checkpoint.h"
#include "gguf.h"
#include "gguf_model.h"
#include "numeric.h"
#include "safetensors.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FIXTURES SMELT_SOURCE_DIR "/tests/fixtures"

static diag_engine diag;
static FILE *diag_stream;
static char *diag_buffer;
static size_t diag_size;
static char path[64];

static int setup(void **state) {
    (void)state;
    diag_stream = open_memstream(&diag_buffer, &diag_size);
    diag_init(&diag, diag_stream);
    snprintf(path, sizeof path, "/tmp/smelt-test-gguf-XXXXXX");
    int fd = mkstemp(path);
    if (fd < 0) fail_msg("mkstemp failed");
    close(fd);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    diag_free(&diag);
    fclose(diag_stream);
    free(diag_buffer);
    diag_buffer = NULL;
    unlink(path);
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

/* ---- building files ------------------------------------------------------------ */

typedef struct bytes {
    uint8_t data[8192];
    size_t n;
} bytes;

static void put(bytes *b, const void *p, size_t n) {
    assert_true(b->n + n <= sizeof b->data);
    memcpy(b->data + b->n, p, n);
    b->n += n;
}
static void put_u32(bytes *b, uint32_t v) { put(b, &v, 4); }
static void put_u64(bytes *b, uint64_t v) { put(b, &v, 8); }
static void put_string(bytes *b, const char *s) {
    put_u64(b, strlen(s));
    put(b, s, strlen(s));
}
static void header(bytes *b, uint32_t version, uint64_t tensors, uint64_t kvs) {
    put(b, "GGUF", 4);
    put_u32(b, version);
    put_u64(b, tensors);
    put_u64(b, kvs);
}
static void kv_u32(bytes *b, const char *key, uint32_t v) {
    put_string(b, key);
    put_u32(b, GGUF_VALUE_U32);
    put_u32(b, v);
}
static void kv_f32(bytes *b, const char *key, float v) {
    put_string(b, key);
    put_u32(b, GGUF_VALUE_F32);
    put(b, &v, 4);
}
static void kv_string(bytes *b, const char *key, const char *v) {
    put_string(b, key);
    put_u32(b, GGUF_VALUE_STRING);
    put_string(b, v);
}
/* A 2-dim tensor info: ne = {cols, rows}. */
static void tensor_2d(bytes *b, const char *name, uint64_t cols, uint64_t rows, uint32_t type,
                      uint64_t offset) {
    put_string(b, name);
    put_u32(b, 2);
    put_u64(b, cols);
    put_u64(b, rows);
    put_u32(b, type);
    put_u64(b, offset);
}
static void pad(bytes *b, size_t alignment) {
    while (b->n % alignment)
        b->data[b->n++] = 0;
}
static void data(bytes *b, size_t n) {
    for (size_t i = 0; i < n; i++)
        b->data[b->n++] = 0;
}

static void write_file(const bytes *b) {
    FILE *f = fopen(path, "wb");
    assert_non_null(f);
    assert_int_equal(fwrite(b->data, 1, b->n, f), b->n);
    fclose(f);
}

/* The file must be refused with `message` in the diagnostics. */
static void expect_refused(const bytes *b, const char *message) {
    write_file(b);
    gguf_file f;
    if (gguf_file_open(path, &f, &diag)) fail_msg("accepted a file that should fail with: %s", message);
    assert_null(f.map);
    expect_diag(message);
    gguf_file_close(&f);
    fclose(diag_stream);
    free(diag_buffer);
    diag_buffer = NULL;
    diag_free(&diag);
    diag_stream = open_memstream(&diag_buffer, &diag_size);
    diag_init(&diag, diag_stream);
}

/* ---- dequantization ------------------------------------------------------------ */

static void test_dequantize_matches_gguf_py(void **state) {
    (void)state;
    gguf_file f;
    st_file expected;
    assert_true(gguf_file_open(FIXTURES "/gguf/quants.gguf", &f, &diag));
    assert_true(st_file_open(FIXTURES "/gguf/quants_expected.safetensors", &expected, &diag));
    static const char *const names[] = {
        "f32",  "f16",  "bf16", "q8_0",           "q4_0",           "q4_1",
        "q4_k", "q5_k", "q6_k", "quantized_q8_0", "quantized_q4_1", "quantized_q4_0"};
    static const uint32_t types[] = {GGUF_TYPE_F32,  GGUF_TYPE_F16,  GGUF_TYPE_BF16, GGUF_TYPE_Q8_0,
                                     GGUF_TYPE_Q4_0, GGUF_TYPE_Q4_1, GGUF_TYPE_Q4_K, GGUF_TYPE_Q5_K,
                                     GGUF_TYPE_Q6_K, GGUF_TYPE_Q8_0, GGUF_TYPE_Q4_1, GGUF_TYPE_Q4_0};
    assert_int_equal(f.tensor_count, sizeof names / sizeof names[0]);
    for (size_t i = 0; i < sizeof names / sizeof names[0]; i++) {
        const gguf_tensor *t = gguf_file_find(&f, names[i]);
        const st_tensor *want = st_file_find(&expected, names[i]);
        assert_non_null(t);
        assert_non_null(want);
        assert_int_equal(t->type, types[i]);
        assert_int_equal(t->rank, 2);
        assert_int_equal(t->ne[0], 512);
        assert_int_equal(t->ne[1], 4);
        assert_int_equal(want->byte_size, t->element_count * 4);
        float *got = malloc(want->byte_size), *truth = malloc(want->byte_size);
        assert_true(gguf_tensor_read_f32(&f, t, got, 0, t->element_count, &diag));
        memcpy(truth, want->data, want->byte_size);
        for (uint64_t k = 0; k < t->element_count; k++) {
            uint32_t a, b;
            memcpy(&a, &got[k], 4);
            memcpy(&b, &truth[k], 4);
            if (a != b)
                fail_msg("%s[%llu]: smelt %.9g (0x%08x), gguf-py %.9g (0x%08x)", names[i],
                         (unsigned long long)k, got[k], a, truth[k], b);
        }
        /* a range from the middle: the third row of 512 */
        float *row = malloc(512 * sizeof *row);
        assert_true(gguf_tensor_read_f32(&f, t, row, 1024, 512, &diag));
        assert_memory_equal(row, truth + 1024, 512 * sizeof *row);
        free(row);
        free(got);
        free(truth);
    }
    st_file_close(&expected);
    gguf_file_close(&f);
}

static void put_f16(uint8_t *p, float x) {
    uint16_t h = plan_f32_to_f16(x);
    memcpy(p, &h, 2);
}

/* Blocks decoded by hand, for the bit positions of each layout. */
static void test_dequantize_hand_blocks(void **state) {
    (void)state;
    float y[256];
    uint8_t q8[34] = {0};
    put_f16(q8, 2.0f);
    q8[2] = (uint8_t)-3; /* element 0 */
    q8[33] = 127;        /* element 31 */
    gguf_dequantize(GGUF_TYPE_Q8_0, q8, y, 32);
    assert_true(y[0] == -6.0f && y[1] == 0.0f && y[31] == 254.0f);

    uint8_t q4[18] = {0};
    put_f16(q4, 0.5f);
    q4[2] = 0x21; /* element 0: 1, element 16: 2 */
    q4[17] = 0xf8;
    gguf_dequantize(GGUF_TYPE_Q4_0, q4, y, 32);
    assert_true(y[0] == -3.5f && y[16] == -3.0f && y[15] == 0.0f && y[31] == 3.5f && y[1] == -4.0f);

    uint8_t q41[20] = {0};
    put_f16(q41, 0.25f);
    put_f16(q41 + 2, -1.0f);
    q41[4] = 0xf0; /* element 0: 0, element 16: 15 */
    gguf_dequantize(GGUF_TYPE_Q4_1, q41, y, 32);
    assert_true(y[0] == -1.0f && y[16] == 2.75f);

    /* Q4_K: sub-block 0 scale 2 min 3; sub-block 5 scale 0x25 (low nibble
     * of byte 9, top bits of byte 1), min 0x13 (high nibble of byte 9, top
     * bits of byte 5) */
    uint8_t q4k[144] = {0};
    put_f16(q4k, 1.0f);
    put_f16(q4k + 2, 0.5f);
    uint8_t *scales = q4k + 4;
    scales[0] = 2;
    scales[4] = 3;
    scales[1] = 0x80;        /* bits 4..5 of sub-block 5's scale: 2 */
    scales[5] = 0x40;        /* bits 4..5 of its min: 1 */
    scales[9] = 0x35;        /* its low bits: scale 5, min 3 */
    q4k[16] = 0x07;          /* sub-block 0, element 0: 7 */
    q4k[16 + 64 + 3] = 0x90; /* sub-block 5 (high nibbles of bytes 64..95), element 3: 9 */
    gguf_dequantize(GGUF_TYPE_Q4_K, q4k, y, 256);
    assert_true(y[0] == 2.0f * 7 - 1.5f);
    assert_true(y[1] == -1.5f);
    assert_true(y[5 * 32 + 3] == 37.0f * 9 - 0.5f * 19);

    /* Q5_K: as Q4_K, plus bit s of qh[l] as bit 4 of element l of sub-block s */
    uint8_t q5k[176] = {0};
    memcpy(q5k, q4k, 16);
    q5k[16 + 3] = 1 << 5; /* qh[3]: sub-block 5, element 3 */
    q5k[48 + 64 + 3] = 0x90;
    gguf_dequantize(GGUF_TYPE_Q5_K, q5k, y, 256);
    assert_true(y[5 * 32 + 3] == 37.0f * (9 + 16) - 0.5f * 19);
    assert_true(y[3] == 2.0f * 0 - 1.5f);

    /* Q6_K: element 128 + 32 * 3 + 1 (half 1, k 3): low bits in the high
     * nibble of ql[64 + 32 + 1], high bits at bit 6 of qh[32 + 1]; scale 14 */
    uint8_t q6k[210] = {0};
    put_f16(q6k + 208, 0.5f);
    q6k[64 + 32 + 1] = 0xa0;  /* low 4 bits: 10 */
    q6k[128 + 32 + 1] = 0x80; /* high 2 bits: 2 */
    q6k[192 + (128 + 96 + 1) / 16] = (uint8_t)-4;
    gguf_dequantize(GGUF_TYPE_Q6_K, q6k, y, 256);
    assert_true(y[128 + 96 + 1] == (0.5f * -4) * (float)(10 + 32 - 32));
    assert_true(y[0] == 0.0f * -32); /* scale 0 */
}

/* ---- metadata ------------------------------------------------------------------ */

static void test_metadata_values(void **state) {
    (void)state;
    gguf_file f;
    assert_true(gguf_file_open(FIXTURES "/gguf/quants.gguf", &f, &diag));
    assert_int_equal(f.version, 3);
    assert_int_equal(f.alignment, 32);
    int64_t i;
    double x;
    const gguf_kv *kv = gguf_file_find_kv(&f, "test.u32");
    assert_true(kv && kv->type == GGUF_VALUE_U32 && gguf_kv_int(kv, &i) && i == 7);
    kv = gguf_file_find_kv(&f, "test.f32");
    assert_true(kv && gguf_kv_float(kv, &x) && x == 0.25);
    kv = gguf_file_find_kv(&f, "test.string");
    assert_true(kv && kv->type == GGUF_VALUE_STRING);
    assert_string_equal(kv->string, "tensors of every type");
    kv = gguf_file_find_kv(&f, "test.strings");
    assert_true(kv && kv->type == GGUF_VALUE_ARRAY && kv->element_type == GGUF_VALUE_STRING &&
                kv->count == 3);
    assert_string_equal(kv->strings[1], "bc");
    assert_int_equal(kv->string_lengths[2], 0);
    kv = gguf_file_find_kv(&f, "test.ints");
    assert_true(kv && kv->count == 3 && gguf_kv_array_int(kv, 1, &i) && i == -2);
    assert_false(gguf_kv_array_int(kv, 3, &i));
    kv = gguf_file_find_kv(&f, "test.bool");
    assert_true(kv && kv->type == GGUF_VALUE_BOOL && kv->scalar.u == 1);
    kv = gguf_file_find_kv(&f, "general.architecture");
    assert_string_equal(kv->string, "test");
    assert_null(gguf_file_find_kv(&f, "test.absent"));
    gguf_file_close(&f);
}

/* ---- the llama import ------------------------------------------------------------ */

/* Every tensor of the safetensors checkpoint, under its own name and shape,
 * bit for bit: names mapped and (llama) the q/k permutation undone. */
static void check_checkpoint_equals_safetensors(const char *gguf_path, const char *safetensors_path) {
    st_checkpoint gguf_ck, st_ck;
    assert_true(st_checkpoint_open(gguf_path, &gguf_ck, &diag));
    assert_true(st_checkpoint_open(safetensors_path, &st_ck, &diag));
    assert_int_equal(gguf_ck.tensor_count, st_ck.tensor_count);
    for (uint32_t i = 0; i < st_ck.tensor_count; i++) {
        const st_tensor *want = st_ck.tensors[i];
        const st_tensor *got = st_checkpoint_find(&gguf_ck, want->name);
        if (!got) fail_msg("'%s' is not in the GGUF checkpoint", want->name);
        assert_int_equal(got->rank, want->rank);
        for (uint32_t k = 0; k < want->rank; k++)
            assert_int_equal(got->shape[k], want->shape[k]);
        assert_int_equal(got->byte_size, want->byte_size);
        float *a = malloc(want->byte_size), *b = malloc(want->byte_size);
        assert_true(st_tensor_read_f32(got, a, &diag));
        assert_true(st_tensor_read_f32(want, b, &diag));
        if (memcmp(a, b, want->byte_size) != 0) fail_msg("'%s' differs", want->name);
        free(a);
        free(b);
    }
    st_checkpoint_close(&st_ck);
    st_checkpoint_close(&gguf_ck);
}

static void test_llama_checkpoint_equals_safetensors(void **state) {
    (void)state;
    check_checkpoint_equals_safetensors(FIXTURES "/gguf/llama.gguf", FIXTURES "/llama/model.safetensors");
}

/* qwen2: biases, tied embeddings, rows as stored. */
static void test_qwen2_checkpoint_equals_safetensors(void **state) {
    (void)state;
    check_checkpoint_equals_safetensors(FIXTURES "/gguf/qwen2.gguf", FIXTURES "/qwen2/model.safetensors");
    json_t *config;
    assert_true(fe_gguf_config(FIXTURES "/gguf/qwen2.gguf", &config, &diag));
    assert_string_equal(json_string_value(json_object_get(config, "model_type")), "qwen2");
    assert_true(json_is_true(json_object_get(config, "tie_word_embeddings")));
    assert_true(json_real_value(json_object_get(config, "rope_theta")) == 1e6);
    json_decref(config);
}

/* The metadata stands for the fixture's config.json. */
static void test_llama_config(void **state) {
    (void)state;
    json_t *config;
    assert_true(fe_gguf_config(FIXTURES "/gguf/llama.gguf", &config, &diag));
    json_t *truth = json_load_file(FIXTURES "/llama/config.json", 0, NULL);
    assert_non_null(truth);
    static const char *const ints[] = {
        "hidden_size",         "num_hidden_layers",   "intermediate_size",
        "num_attention_heads", "num_key_value_heads", "vocab_size",
        "bos_token_id",        "eos_token_id",        "max_position_embeddings"};
    for (size_t i = 0; i < sizeof ints / sizeof ints[0]; i++) {
        json_t *v = json_object_get(config, ints[i]);
        if (!json_is_integer(v)) fail_msg("%s is missing", ints[i]);
        assert_int_equal(json_integer_value(v), json_integer_value(json_object_get(truth, ints[i])));
    }
    assert_true(json_real_value(json_object_get(config, "rms_norm_eps")) == (double)(float)1e-5);
    assert_true(json_real_value(json_object_get(config, "rope_theta")) == 10000.0);
    assert_string_equal(json_string_value(json_object_get(config, "model_type")), "llama");
    assert_true(json_is_false(json_object_get(config, "tie_word_embeddings")));
    json_decref(truth);
    json_decref(config);
}

/* A minimal llama GGUF with `extra` metadata appended (its kv count
 * included) and one 2-dim tensor, token_embd.weight. */
static void llama_file(bytes *b, uint32_t extra_kvs, void (*extra)(bytes *)) {
    header(b, 3, 1, 6 + extra_kvs);
    kv_string(b, "general.architecture", "llama");
    kv_u32(b, "llama.embedding_length", 32);
    kv_u32(b, "llama.block_count", 1);
    kv_u32(b, "llama.feed_forward_length", 64);
    kv_u32(b, "llama.attention.head_count", 2);
    kv_f32(b, "llama.attention.layer_norm_rms_epsilon", 1e-5f);
    if (extra) extra(b);
    tensor_2d(b, "token_embd.weight", 32, 10, GGUF_TYPE_F32, 0);
    pad(b, 32);
    data(b, 32 * 10 * 4);
}

static void config_refused(uint32_t extra_kvs, void (*extra)(bytes *), const char *message) {
    bytes b = {.n = 0};
    llama_file(&b, extra_kvs, extra);
    write_file(&b);
    json_t *config = NULL;
    assert_false(fe_gguf_config(path, &config, &diag));
    assert_null(config);
    expect_diag(message);
    /* the tensors are refused too: a plan compiled from another config must
     * not bind them */
    fclose(diag_stream);
    free(diag_buffer);
    diag_buffer = NULL;
    diag_free(&diag);
    diag_stream = open_memstream(&diag_buffer, &diag_size);
    diag_init(&diag, diag_stream);
    st_checkpoint ck;
    assert_false(st_checkpoint_open(path, &ck, &diag));
    expect_diag(message);
    st_checkpoint_close(&ck);
}

static void sliding_window(bytes *b) { kv_u32(b, "llama.attention.sliding_window", 4096); }
static void rope_linear(bytes *b) {
    kv_string(b, "llama.rope.scaling.type", "linear");
    kv_f32(b, "llama.rope.scaling.factor", 4.0f);
}
static void rope_none(bytes *b) {
    kv_string(b, "llama.rope.scaling.type", "none");
    kv_f32(b, "llama.rope.scaling.factor", 4.0f);
}
static void rope_factor_alone(bytes *b) { kv_f32(b, "llama.rope.scaling.factor", 8.0f); }
static void experts(bytes *b) { kv_u32(b, "llama.expert_count", 8); }
static void partial_rotary(bytes *b) { kv_u32(b, "llama.rope.dimension_count", 8); }
static void split(bytes *b) {
    put_string(b, "split.count");
    put_u32(b, GGUF_VALUE_U16);
    uint16_t two = 2;
    put(b, &two, 2);
}
static void head_count_float(bytes *b) { kv_f32(b, "llama.attention.head_count_kv", 2.0f); }

static void test_llama_config_refusals(void **state) {
    (void)state;
    bytes b = {.n = 0};
    llama_file(&b, 0, NULL);
    write_file(&b);
    json_t *config;
    assert_true(fe_gguf_config(path, &config, &diag));
    assert_true(json_is_true(json_object_get(config, "tie_word_embeddings"))); /* no output.weight */
    assert_int_equal(json_integer_value(json_object_get(config, "vocab_size")), 10);
    json_decref(config);
    config_refused(
        1, sliding_window,
        "GGUF key 'llama.attention.sliding_window' (u32 4096) is not one smelt understands for this "
        "architecture; it may change the computation, so the file is refused");
    config_refused(2, rope_linear, "GGUF key 'llama.rope.scaling.type' (string 'linear') is not supported");
    config_refused(1, rope_factor_alone, "GGUF key 'llama.rope.scaling.factor' (f32 8) is not supported");
    config_refused(1, experts, "GGUF key 'llama.expert_count' (u32 8) is not supported");
    config_refused(1, partial_rotary,
                   "GGUF key 'llama.rope.dimension_count' (u32 8) differs from the head dim 16");
    config_refused(1, split, "split.count is 2: the model is split over several GGUF files");
    config_refused(1, head_count_float,
                   "GGUF key 'llama.attention.head_count_kv' (f32 2) must be an integer");
    /* the neutral rope scaling is accepted */
    b.n = 0;
    llama_file(&b, 2, rope_none);
    write_file(&b);
    assert_true(fe_gguf_config(path, &config, &diag));
    json_decref(config);
}

static void test_unknown_architecture(void **state) {
    (void)state;
    bytes b = {.n = 0};
    header(&b, 3, 0, 1);
    kv_string(&b, "general.architecture", "gpt2");
    write_file(&b);
    json_t *config;
    assert_false(fe_gguf_config(path, &config, &diag));
    expect_diag("at byte 24: GGUF architecture 'gpt2' is not supported; smelt imports 'llama'");
    st_checkpoint ck;
    assert_false(st_checkpoint_open(path, &ck, &diag));
    st_checkpoint_close(&ck);
}

/* ---- broken files ----------------------------------------------------------------- */

static void one_tensor(bytes *b, uint32_t type, uint64_t cols, uint64_t offset, size_t data_bytes) {
    header(b, 3, 1, 0);
    tensor_2d(b, "w", cols, 2, type, offset);
    pad(b, 32);
    data(b, data_bytes);
}

static void test_refused_files(void **state) {
    (void)state;
    bytes b = {.n = 0};
    put(&b, "GGUF", 4);
    put_u32(&b, 3);
    expect_refused(&b, "a GGUF file starts with a 24-byte header");

    b.n = 0;
    header(&b, 3, 0, 0);
    memcpy(b.data, "GGML", 4);
    expect_refused(&b, "at byte 0: not a GGUF file");

    b.n = 0;
    header(&b, 1, 0, 0);
    expect_refused(&b, "at byte 4: GGUF version 1; smelt reads versions 2 and 3 (version 1 is obsolete");
    b.n = 0;
    header(&b, 4, 0, 0);
    expect_refused(&b, "at byte 4: GGUF version 4");

    b.n = 0;
    header(&b, 3, UINT64_MAX, 0);
    expect_refused(&b,
                   "at byte 8: the tensor count 18446744073709551615 is more than the 0 bytes left can hold");
    b.n = 0;
    header(&b, 3, 0, (uint64_t)1 << 40);
    data(&b, 16);
    expect_refused(&b, "at byte 16: the metadata count 1099511627776 is more than the 16 bytes left");

    b.n = 0; /* a key longer than the file */
    header(&b, 3, 0, 1);
    put_u64(&b, (uint64_t)1 << 62);
    put(&b, "key", 3);
    data(&b, 10);
    expect_refused(&b, "at byte 24: a metadata key is 4611686018427387904 bytes long, but only 13 bytes");

    b.n = 0;
    header(&b, 3, 0, 1);
    put_string(&b, "k");
    put_u32(&b, 13);
    put_u32(&b, 0);
    expect_refused(&b, "at byte 33: metadata 'k' has unknown value type 13");

    b.n = 0;
    header(&b, 3, 0, 1);
    put_string(&b, "k");
    put_u32(&b, GGUF_VALUE_BOOL);
    b.data[b.n++] = 2;
    expect_refused(&b, "at byte 37: metadata 'k' is a bool of value 2 (must be 0 or 1)");

    b.n = 0;
    header(&b, 3, 0, 1);
    put_string(&b, "k");
    put_u32(&b, GGUF_VALUE_ARRAY);
    put_u32(&b, GGUF_VALUE_ARRAY);
    put_u64(&b, 1);
    expect_refused(&b, "metadata 'k' is an array of arrays, which smelt does not read");

    b.n = 0;
    header(&b, 3, 0, 1);
    put_string(&b, "k");
    put_u32(&b, GGUF_VALUE_ARRAY);
    put_u32(&b, GGUF_VALUE_STRING);
    put_u64(&b, (uint64_t)1 << 60);
    data(&b, 64);
    expect_refused(&b,
                   "at byte 41: metadata 'k' claims 1152921504606846976 elements of string, more than the 64 "
                   "bytes left can hold");

    b.n = 0;
    header(&b, 3, 0, 2);
    kv_u32(&b, "k", 1);
    kv_u32(&b, "k", 2);
    expect_refused(&b, "at byte 41: metadata key 'k' appears twice");

    b.n = 0;
    header(&b, 3, 0, 1);
    put_u64(&b, 2);
    put(&b, "\xc3\x28", 2);
    put_u32(&b, GGUF_VALUE_U8);
    b.data[b.n++] = 0;
    expect_refused(&b, "at byte 24: a metadata key is not valid UTF-8 text");

    b.n = 0;
    header(&b, 3, 0, 1);
    kv_u32(&b, "general.alignment", 48);
    expect_refused(&b, "general.alignment must be a u32 power of two, found u32 48");

    b.n = 0;
    header(&b, 3, 1, 0);
    put_string(&b, "w");
    put_u32(&b, 5);
    data(&b, 64);
    expect_refused(&b, "at byte 33: tensor 'w' has 5 dims; GGUF tensors have 1 to 4");

    b.n = 0;
    one_tensor(&b, 10, 256, 0, 168);
    expect_refused(&b, "tensor 'w' has type Q2_K (10), which smelt does not read");
    b.n = 0;
    one_tensor(&b, 99, 256, 0, 168);
    expect_refused(&b, "tensor 'w' has type unknown (99)");

    b.n = 0;
    one_tensor(&b, GGUF_TYPE_Q8_0, 40, 0, 34 * 4);
    expect_refused(&b, "tensor 'w' of type Q8_0 has rows of 40 values, not a multiple of its block of 32");

    b.n = 0;
    one_tensor(&b, GGUF_TYPE_F32, 8, 4, 64 + 4);
    expect_refused(&b, "at byte 24: tensor 'w' has data offset 4, not a multiple of the alignment 32");

    b.n = 0;
    one_tensor(&b, GGUF_TYPE_F32, 8, 0, 63);
    expect_refused(&b, "at byte 24: tensor 'w' (64 bytes at data offset 0) ends past the end of the file");

    b.n = 0;
    one_tensor(&b, GGUF_TYPE_F32, 8, UINT64_MAX - 31, 64);
    expect_refused(&b, "ends past the end of the file");

    b.n = 0; /* elements overflow: 2^40 * 2^40 */
    header(&b, 3, 1, 0);
    tensor_2d(&b, "w", (uint64_t)1 << 40, (uint64_t)1 << 40, GGUF_TYPE_F32, 0);
    expect_refused(&b, "tensor 'w' has more elements than fit in 63 bits");

    b.n = 0;
    header(&b, 3, 2, 0);
    tensor_2d(&b, "a", 16, 2, GGUF_TYPE_F32, 0);
    tensor_2d(&b, "b", 16, 2, GGUF_TYPE_F32, 96); /* a takes [0, 128) */
    pad(&b, 32);
    data(&b, 256);
    expect_refused(&b, "tensor 'b' (data bytes [96, 224)) overlaps tensor 'a' (data bytes [0, 128))");

    b.n = 0;
    header(&b, 3, 2, 0);
    tensor_2d(&b, "a", 8, 2, GGUF_TYPE_F32, 0);
    tensor_2d(&b, "a", 8, 2, GGUF_TYPE_F32, 64);
    pad(&b, 32);
    data(&b, 128);
    expect_refused(&b, "tensor 'a' appears twice");

    b.n = 0;
    header(&b, 3, 1, 0);
    tensor_2d(&b, "a_name_of_sixty_four_bytes_is_one_byte_more_than_ggml_allows_it_", 8, 2, GGUF_TYPE_F32, 0);
    pad(&b, 32);
    data(&b, 64);
    expect_refused(&b, "is 64 bytes; GGUF allows at most 63");

    b.n = 0; /* tensor infos cut short */
    header(&b, 3, 1, 0);
    put_string(&b, "w");
    put_u32(&b, 4);
    put_u64(&b, 8);
    put_u64(&b, 8);
    put_u64(&b, 8);
    data(&b, 2);
    expect_refused(&b, "at byte 61: the file ends (at byte 63) inside a tensor's dims, which needs 8 bytes");
}

/* A valid file of every dim count and an empty one are read. */
static void test_accepted_files(void **state) {
    (void)state;
    bytes b = {.n = 0};
    header(&b, 2, 0, 0);
    write_file(&b);
    gguf_file f;
    assert_true(gguf_file_open(path, &f, &diag));
    assert_int_equal(f.version, 2);
    gguf_file_close(&f);

    b.n = 0;
    header(&b, 3, 1, 1);
    kv_u32(&b, "general.alignment", 64);
    put_string(&b, "w");
    put_u32(&b, 4);
    put_u64(&b, 32);
    put_u64(&b, 1);
    put_u64(&b, 2);
    put_u64(&b, 1);
    put_u32(&b, GGUF_TYPE_Q4_0);
    put_u64(&b, 0);
    pad(&b, 64);
    size_t at = b.n;
    data(&b, 36);
    put_f16(b.data + at, 1.0f);
    b.data[at + 2] = 0x9a; /* element 0: 10 - 8, element 16: 9 - 8 */
    write_file(&b);
    assert_true(gguf_file_open(path, &f, &diag));
    assert_int_equal(f.alignment, 64);
    assert_int_equal(f.data_offset % 64, 0);
    const gguf_tensor *t = gguf_file_find(&f, "w");
    assert_int_equal(t->element_count, 64);
    assert_int_equal(t->byte_size, 36);
    float y[64];
    assert_true(gguf_tensor_read_f32(&f, t, y, 0, 64, &diag));
    assert_true(y[0] == 2.0f && y[16] == 1.0f && y[1] == -8.0f);
    gguf_file_close(&f);
}

/* Many tensors, their data in reverse order: opened in linear-ish time
 * (name tables hashed, offsets sorted), not quadratic - 100,000 tensors
 * would take minutes of name comparisons otherwise. */
static void test_many_tensors(void **state) {
    (void)state;
    enum { COUNT = 100000 };
    FILE *out = fopen(path, "wb");
    assert_non_null(out);
    uint32_t version = 3;
    uint64_t tensors = COUNT, kvs = 0;
    fwrite("GGUF", 1, 4, out);
    fwrite(&version, 4, 1, out);
    fwrite(&tensors, 8, 1, out);
    fwrite(&kvs, 8, 1, out);
    uint64_t header = 24;
    for (uint32_t i = 0; i < COUNT; i++) {
        char name[16];
        uint64_t length = (uint64_t)snprintf(name, sizeof name, "t%u", i), ne = 8;
        uint32_t rank = 1, type = GGUF_TYPE_F32;
        uint64_t offset = (uint64_t)(COUNT - 1 - i) * 32;
        fwrite(&length, 8, 1, out);
        fwrite(name, 1, length, out);
        fwrite(&rank, 4, 1, out);
        fwrite(&ne, 8, 1, out);
        fwrite(&type, 4, 1, out);
        fwrite(&offset, 8, 1, out);
        header += 8 + length + 4 + 8 + 4 + 8;
    }
    for (uint64_t pad = (32 - header % 32) % 32 + (uint64_t)COUNT * 32; pad > 0; pad--)
        fputc(0, out);
    fclose(out);
    gguf_file f;
    assert_true(gguf_file_open(path, &f, &diag));
    assert_int_equal(f.tensor_count, COUNT);
    const gguf_tensor *t = gguf_file_find(&f, "t99999");
    assert_non_null(t);
    assert_int_equal(t->offset, 0);
    gguf_file_close(&f);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_dequantize_matches_gguf_py, setup, teardown),
        cmocka_unit_test_setup_teardown(test_dequantize_hand_blocks, setup, teardown),
        cmocka_unit_test_setup_teardown(test_metadata_values, setup, teardown),
        cmocka_unit_test_setup_teardown(test_llama_checkpoint_equals_safetensors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_qwen2_checkpoint_equals_safetensors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_llama_config, setup, teardown),
        cmocka_unit_test_setup_teardown(test_llama_config_refusals, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unknown_architecture, setup, teardown),
        cmocka_unit_test_setup_teardown(test_refused_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_accepted_files, setup, teardown),
        cmocka_unit_test_setup_teardown(test_many_tensors, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
