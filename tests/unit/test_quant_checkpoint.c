/* test_quant_checkpoint.c - pre-quantized AWQ, GPTQ and FP8 checkpoints
 * (frontend/quant_checkpoint.h).
 *
 * The good checkpoints are tests/fixtures/quant/<name>/, written by
 * tests/reference/make_quant_checkpoints.py in each tool's published
 * packing with the tool's own dequantization beside them
 * (dequantized.safetensors): every element of every unpacked weight must
 * equal it bit for bit. The broken ones are made here, each in a fresh
 * temporary folder, and each must be refused with its own message.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "checkpoint.h"
#include "config.h"
#include "numeric.h"
#include "quant_checkpoint.h"
#include "safetensors.h"
#include "weights.h"

#include <jansson.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static diag_engine diag;
static FILE *diag_stream;
static char *diag_buffer;
static size_t diag_size;
static char folder[64];

static int setup(void **state) {
    (void)state;
    diag_stream = open_memstream(&diag_buffer, &diag_size);
    diag_init(&diag, diag_stream);
    diag.max_errors = 0; /* every refusal's message, however many */
    snprintf(folder, sizeof folder, "/tmp/smelt-test-qck-XXXXXX");
    if (!mkdtemp(folder)) fail_msg("mkdtemp failed");
    return 0;
}

static const char *path_in(const char *name) {
    static char paths[4][256];
    static int next;
    char *p = paths[next++ % 4];
    snprintf(p, 256, "%s/%s", folder, name);
    return p;
}

static int teardown(void **state) {
    (void)state;
    diag_free(&diag);
    fclose(diag_stream);
    free(diag_buffer);
    diag_buffer = NULL;
    unlink(path_in("config.json"));
    unlink(path_in("model.safetensors"));
    rmdir(folder);
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

/* ---- the fixtures: unpacked values equal the tools' dequantization ------- */

static const char *fixture(const char *name, const char *file) {
    static char path[512];
    snprintf(path, sizeof path, "%s/tests/fixtures/quant/%s/%s", SMELT_SOURCE_DIR, name, file);
    return path;
}

/* Opens fixture `name`'s config as a scheme and checks every weight of its
 * dequantized.safetensors against the unpacked one; returns how many. */
static unsigned check_fixture(const char *name, qck_scheme *scheme, qck_weight *last) {
    fe_config config;
    assert_true(fe_config_open(&config, fixture(name, "config.json"), &diag));
    assert_true(qck_scheme_of_config(&config, scheme, &diag));
    fe_config_close(&config);
    st_checkpoint ck;
    st_file truth;
    assert_true(st_checkpoint_open(fixture(name, "model.safetensors"), &ck, &diag));
    assert_true(st_file_open(fixture(name, "dequantized.safetensors"), &truth, &diag));
    assert_true(truth.tensor_count >= 2);
    for (uint32_t i = 0; i < truth.tensor_count; i++) {
        const st_tensor *t = &truth.tensors[i];
        qck_weight w;
        if (qck_read_weight(scheme, &ck, t->name, &w, &diag) != QCK_QUANTIZED)
            fail_msg("%s: %s not quantized:\n%s", name, t->name, diagnostics());
        assert_int_equal(t->rank, 2);
        assert_int_equal(w.tensor.layout.rows, t->shape[0]);
        assert_int_equal(w.tensor.layout.cols, t->shape[1]);
        assert_int_equal(w.tensor.format.method, QUANT_METHOD_CHECKPOINT);
        float *want = malloc(t->byte_size);
        assert_non_null(want);
        memcpy(want, t->data, t->byte_size);
        for (uint64_t n = 0; n < t->shape[0]; n++)
            for (uint64_t k = 0; k < t->shape[1]; k++) {
                float got = quant_value(&w.tensor, n, k), expected = want[n * t->shape[1] + k];
                if (plan_f32_to_bits(got) != plan_f32_to_bits(expected))
                    fail_msg("%s: %s[%llu][%llu] is %.9g, the tool's dequantization %.9g", name, t->name,
                             (unsigned long long)n, (unsigned long long)k, (double)got, (double)expected);
            }
        free(want);
        /* The set of tensors it reads: all of the Linear's quantized ones. */
        uint32_t indices[QCK_MAX_TENSORS];
        assert_true(qck_weight_tensors(scheme, &ck, t->name, indices) >= 2);
        if (i + 1 == truth.tensor_count)
            *last = w;
        else
            qck_weight_free(&w);
    }
    /* A Linear the fixture does not quantize is a plain tensor. */
    qck_weight plain;
    assert_int_equal(qck_read_weight(scheme, &ck, "model.layers.0.self_attn.q_proj.weight", &plain, &diag),
                     QCK_NOT_QUANTIZED);
    unsigned count = truth.tensor_count;
    st_file_close(&truth);
    st_checkpoint_close(&ck);
    assert_int_equal(diag.error_count, 0);
    return count;
}

static void test_awq(void **state) {
    (void)state;
    qck_scheme s;
    qck_weight w;
    assert_int_equal(check_fixture("awq", &s, &w), 2);
    assert_int_equal(s.method, QCK_METHOD_AWQ);
    quant_format f = w.tensor.format;
    assert_int_equal(f.kind, QUANT_INT4), assert_int_equal(f.group, 32);
    assert_true(f.has_zero), assert_false(f.has_group_index), assert_false(f.has_column_scale);
    qck_weight_free(&w);
}

static void test_gptq_symmetric(void **state) {
    (void)state;
    qck_scheme s;
    qck_weight w;
    assert_int_equal(check_fixture("gptq", &s, &w), 2);
    assert_int_equal(s.method, QCK_METHOD_GPTQ);
    assert_true(s.zeros_minus_one);
    /* sym: every zero is 8, quant.h's symmetric int4 without a zeros section. */
    assert_false(w.tensor.format.has_zero), assert_false(w.tensor.format.has_group_index);
    assert_int_equal(w.tensor.layout.zeros_bytes, 0);
    assert_int_equal(quant_zero(&w.tensor, 3, 1), 8);
    qck_weight_free(&w);
}

static void test_gptq_act_order(void **state) {
    (void)state;
    qck_scheme s;
    qck_weight w;
    assert_int_equal(check_fixture("gptq-actorder", &s, &w), 2);
    assert_true(w.tensor.format.has_zero), assert_true(w.tensor.format.has_group_index);
    assert_int_equal(w.tensor.format.group, 16);
    /* The g_idx is not the trivial k / 16 somewhere. */
    bool permuted = false;
    for (uint64_t k = 0; k < w.tensor.layout.cols; k++)
        permuted |= quant_group_of(&w.tensor, k) != k / 16;
    assert_true(permuted);
    qck_weight_free(&w);
}

static void test_gptq_v2(void **state) {
    (void)state;
    qck_scheme s;
    qck_weight w;
    assert_int_equal(check_fixture("gptq-v2", &s, &w), 2);
    assert_false(s.zeros_minus_one);
    assert_true(w.tensor.format.has_zero);
    qck_weight_free(&w);
}

static void test_gptq_int8(void **state) {
    (void)state;
    qck_scheme s;
    qck_weight w;
    assert_int_equal(check_fixture("gptq-int8", &s, &w), 2);
    /* 8-bit sym: q - 128 as quant.h's int8 code, no zero points. */
    assert_int_equal(w.tensor.format.kind, QUANT_INT8);
    assert_false(w.tensor.format.has_zero);
    assert_int_equal(w.tensor.format.group, 32);
    qck_weight_free(&w);
}

static void test_fp8_per_tensor(void **state) {
    (void)state;
    qck_scheme s;
    qck_weight w;
    assert_int_equal(check_fixture("fp8-tensor", &s, &w), 2);
    assert_int_equal(s.method, QCK_METHOD_FP8);
    assert_false(s.fp8_per_channel), assert_true(s.fp8_static_input);
    assert_int_equal(w.tensor.format.kind, QUANT_FP8);
    assert_true(w.tensor.format.has_column_scale);
    assert_int_equal(w.tensor.format.group, 64);
    /* The input scale as the checkpoint holds it. */
    st_checkpoint ck;
    assert_true(st_checkpoint_open(fixture("fp8-tensor", "model.safetensors"), &ck, &diag));
    const st_tensor *input = st_checkpoint_find(&ck, "model.layers.0.self_attn.v_proj.input_scale");
    assert_non_null(input);
    float want;
    memcpy(&want, input->data, 4);
    assert_true(w.has_input_scale);
    assert_true(w.input_scale == want);
    st_checkpoint_close(&ck);
    qck_weight_free(&w);
}

static void test_fp8_per_channel(void **state) {
    (void)state;
    qck_scheme s;
    qck_weight w;
    assert_int_equal(check_fixture("fp8-channel", &s, &w), 2);
    assert_true(s.fp8_per_channel), assert_false(s.fp8_static_input);
    assert_false(w.tensor.format.has_column_scale), assert_false(w.has_input_scale);
    qck_weight_free(&w);
}

/* ---- broken configs --------------------------------------------------------- */

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

/* The scheme of a config whose quantization_config is `qc`. */
static bool scheme_of(const char *qc, qck_scheme *s) {
    char text[2048];
    snprintf(text, sizeof text, "{\"hidden_size\": 64,\n \"quantization_config\": %s}\n", qc);
    write_text(path_in("config.json"), text);
    fe_config config;
    assert_true(fe_config_open(&config, path_in("config.json"), &diag));
    bool ok = qck_scheme_of_config(&config, s, &diag);
    fe_config_close(&config);
    return ok;
}

static void refused_config(const char *qc, const char *message) {
    qck_scheme s;
    if (scheme_of(qc, &s)) fail_msg("accepted: %s", qc);
    expect_diag(message);
}

static void test_configs_refused(void **state) {
    (void)state;
    refused_config("{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 32, \"zero_point\": true, "
                   "\"version\": \"gemm\", \"w_scale\": 2}",
                   "quantization_config key 'w_scale' is not understood by smelt's checkpoint import");
    refused_config("{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 32, \"zero_point\": true, "
                   "\"version\": \"gemv\"}",
                   "quantization_config.version is \"gemv\"; smelt imports AWQ's GEMM layout");
    refused_config("{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 32, \"zero_point\": false}",
                   "zero_point is false");
    refused_config("{\"quant_method\": \"gptq\", \"bits\": 3, \"group_size\": 128}",
                   "quantization_config.bits is 3; smelt imports 4- and 8-bit gptq checkpoints only");
    refused_config("{\"quant_method\": \"awq\", \"bits\": 8, \"group_size\": 128}",
                   "quantization_config.bits is 8; smelt imports 4-bit awq checkpoints only");
    refused_config("{\"quant_method\": \"gptq\", \"bits\": 8, \"group_size\": 128, \"sym\": false}",
                   "quantization_config.sym is false: 8-bit GPTQ with zero points has no int8 layout");
    refused_config("{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 0}",
                   "quantization_config.group_size is 0");
    refused_config(
        "{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, \"checkpoint_format\": \"marlin\"}",
        "quantization_config.checkpoint_format is \"marlin\"");
    refused_config("{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, "
                   "\"dynamic\": {\"-:.*down.*\": {}}}",
                   "quantization_config.dynamic overrides bits or group size");
    refused_config(
        "{\"quant_method\": \"fp8\", \"activation_scheme\": \"static\", \"weight_block_size\": [128, 128]}",
        "block-wise FP8 scales");
    refused_config(
        "{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 128, \"is_marlin_format\": true}",
        "is_marlin_format is true");
    refused_config("{\"quant_method\": \"bitsandbytes\"}", "quant_method is \"bitsandbytes\"");
    refused_config("{\"bits\": 4}", "quantization_config has no quant_method");
    refused_config(
        "{\"quant_method\": \"compressed-tensors\", \"format\": \"float-quantized\", "
        "\"config_groups\": {\"group_0\": {\"targets\": [\"Linear\"], \"weights\": {\"num_bits\": 8, "
        "\"type\": \"float\", \"strategy\": \"group\", \"group_size\": 128}}}}",
        "config_groups.group_0.weights.strategy is \"group\"");
    refused_config(
        "{\"quant_method\": \"compressed-tensors\", \"format\": \"float-quantized\", "
        "\"config_groups\": {\"group_0\": {\"targets\": [\"Linear\"], \"weights\": {\"num_bits\": 8, "
        "\"type\": \"float\", \"strategy\": \"channel\", \"new_knob\": 1}}}}",
        "quantization_config.config_groups.group_0.weights key 'new_knob' is not understood");
    refused_config(
        "{\"quant_method\": \"compressed-tensors\", \"format\": \"pack-quantized\", "
        "\"config_groups\": {\"group_0\": {\"targets\": [\"Linear\"], \"weights\": {\"num_bits\": 4, "
        "\"type\": \"int\", \"strategy\": \"group\"}}}}",
        "format is \"pack-quantized\"");
    refused_config(
        "{\"quant_method\": \"compressed-tensors\", \"format\": \"float-quantized\", "
        "\"kv_cache_scheme\": {\"num_bits\": 8}, \"config_groups\": {\"group_0\": {\"targets\": "
        "[\"Linear\"], \"weights\": {\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"tensor\"}}}}",
        "quantization_config.kv_cache_scheme is set");
    /* Each message is at the key in config.json. */
    expect_diag("config.json:2:");
}

static void test_no_quantization(void **state) {
    (void)state;
    qck_scheme s;
    write_text(path_in("config.json"), "{\"hidden_size\": 64, \"quantization_config\": null}");
    fe_config config;
    assert_true(fe_config_open(&config, path_in("config.json"), &diag));
    assert_true(qck_scheme_of_config(&config, &s, &diag));
    fe_config_close(&config);
    assert_int_equal(s.method, QCK_METHOD_NONE);
    /* The config check leaves quantization_config to the import. */
    fe_config_key key = {"quantization_config", "quantization_config", NULL, SMELT_NO_LOC};
    json_t *object = json_object();
    key.value = object;
    fe_config_key_check check = {0};
    assert_true(fe_check_config_keys(&key, 1, &check, &diag));
    json_decref(object);
}

/* ---- broken tensors --------------------------------------------------------- */

/* AWQ over 8 outputs x 32 inputs in groups of 16, or GPTQ of the same. */
enum { OUT = 8, IN = 32, GROUP = 16, GROUPS = IN / GROUP };

typedef struct tensors {
    int32_t qweight[IN * OUT / 8];
    int32_t qzeros[GROUPS * OUT / 8];
    uint16_t scales[GROUPS * OUT];
    int32_t g_idx[IN];
} tensors;

static void fill(tensors *t, unsigned zero_nibble) {
    for (unsigned i = 0; i < IN * OUT / 8; i++)
        t->qweight[i] = (int32_t)(0x76543210u + i);
    for (unsigned i = 0; i < GROUPS * OUT / 8; i++)
        t->qzeros[i] = (int32_t)(zero_nibble * 0x11111111u);
    for (unsigned i = 0; i < GROUPS * OUT; i++)
        t->scales[i] = plan_f32_to_f16(0.01f * (float)(i + 1));
    for (unsigned k = 0; k < IN; k++)
        t->g_idx[k] = (int32_t)(k / GROUP);
}

/* Writes model.safetensors with the Linear "m.p"'s tensors; a NULL shape
 * leaves one out. */
typedef struct part {
    const char *name;
    st_dtype dtype;
    uint32_t rank;
    uint64_t shape[2];
    const void *data;
} part;

static void write_parts(const part *parts, size_t count) {
    st_write_tensor w[8];
    size_t n = 0;
    for (size_t i = 0; i < count; i++) {
        if (!parts[i].name) continue;
        w[n++] =
            (st_write_tensor){parts[i].name, parts[i].dtype, parts[i].rank, parts[i].shape, parts[i].data};
    }
    assert_true(st_write_file(path_in("model.safetensors"), w, n, NULL, &diag));
}

/* Reads weight m.p.weight under the scheme of `qc` from the parts; it must
 * fail with `message`. */
static void refused_weight(const char *qc, const part *parts, size_t count, const char *message) {
    qck_scheme s;
    if (!scheme_of(qc, &s)) fail_msg("config refused: %s\n%s", qc, diagnostics());
    write_parts(parts, count);
    st_checkpoint ck;
    assert_true(st_checkpoint_open(path_in("model.safetensors"), &ck, &diag));
    qck_weight w;
    qck_result r = qck_read_weight(&s, &ck, "m.p.weight", &w, &diag);
    st_checkpoint_close(&ck);
    if (r != QCK_FAILED) fail_msg("accepted (%d), expected: %s\n%s", (int)r, message, diagnostics());
    assert_null(w.tensor.data);
    expect_diag(message);
}

static const char *const awq_config = "{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 16, "
                                      "\"zero_point\": true, \"version\": \"gemm\"}";
static const char *const gptq_config = "{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 16, "
                                       "\"sym\": false, \"desc_act\": false}";

static void test_int4_tensors_refused(void **state) {
    (void)state;
    tensors t;
    fill(&t, 3);
    part awq[] = {
        {"m.p.qweight", ST_DTYPE_I32, 2, {IN, OUT / 8}, t.qweight},
        {"m.p.qzeros", ST_DTYPE_I32, 2, {GROUPS, OUT / 8}, t.qzeros},
        {"m.p.scales", ST_DTYPE_F16, 2, {GROUPS, OUT}, t.scales},
    };
    /* The good one first: it loads. */
    qck_scheme s;
    assert_true(scheme_of(awq_config, &s));
    write_parts(awq, 3);
    st_checkpoint ck;
    assert_true(st_checkpoint_open(path_in("model.safetensors"), &ck, &diag));
    qck_weight w;
    assert_int_equal(qck_read_weight(&s, &ck, "m.p.weight", &w, &diag), QCK_QUANTIZED);
    /* Word 0 of row 0 is 0x76543210: column c sits in nibble [0,4,1,5,2,6,3,7][c]. */
    unsigned want[8] = {0, 4, 1, 5, 2, 6, 3, 7};
    for (unsigned c = 0; c < 8; c++)
        assert_int_equal(quant_code(&w.tensor, c, 0), want[c]);
    assert_int_equal(quant_zero(&w.tensor, 5, 1), 3);
    qck_weight_free(&w);
    st_checkpoint_close(&ck);

    part bad[3];
    memcpy(bad, awq, sizeof bad);
    bad[1].shape[0] = 3;
    refused_weight(awq_config, bad, 3,
                   "tensor 'm.p.qzeros' has shape [3, 1]; weight 'm.p.weight' needs [2, 1]");
    memcpy(bad, awq, sizeof bad);
    bad[2].dtype = ST_DTYPE_BF16;
    refused_weight(awq_config, bad, 3, "tensor 'm.p.scales' has dtype BF16; expected F16");
    memcpy(bad, awq, sizeof bad);
    bad[2].name = NULL;
    refused_weight(awq_config, bad, 3,
                   "weight 'm.p.weight' is partly quantized: the checkpoint lacks its scales");
    memcpy(bad, awq, sizeof bad);
    bad[0].dtype = ST_DTYPE_F32;
    refused_weight(awq_config, bad, 3, "tensor 'm.p.qweight' is F32 [32, 1]; AWQ's qweight is an I32 matrix");
    uint16_t inf_scales[GROUPS * OUT];
    memcpy(inf_scales, t.scales, sizeof inf_scales);
    inf_scales[5] = 0x7c00;
    memcpy(bad, awq, sizeof bad);
    bad[2].data = inf_scales;
    refused_weight(awq_config, bad, 3, "tensor 'm.p.scales' has a scale that is not finite at [0, 5]");
    /* A group that does not divide the inputs. */
    refused_weight("{\"quant_method\": \"awq\", \"bits\": 4, \"group_size\": 24, \"zero_point\": true}", awq,
                   3, "the group size 24 must divide the inputs");
    /* No weights at all: refused before any loop over their rows. */
    part empty[] = {
        {"m.p.qweight", ST_DTYPE_I32, 2, {1u << 30, 0}, NULL},
        {"m.p.qzeros", ST_DTYPE_I32, 2, {GROUPS, 0}, NULL},
        {"m.p.scales", ST_DTYPE_F16, 2, {GROUPS, 0}, NULL},
    };
    refused_weight(awq_config, empty, 3,
                   "tensor 'm.p.qweight' holds no weights (1073741824 inputs, 0 outputs)");
    float plain[OUT * IN] = {0};
    part both[4];
    memcpy(both, awq, sizeof awq);
    both[3] = (part){"m.p.weight", ST_DTYPE_F32, 2, {OUT, IN}, plain};
    refused_weight(awq_config, both, 4, "weight 'm.p.weight' is both a float tensor and quantized");

    part gptq[] = {
        {"m.p.qweight", ST_DTYPE_I32, 2, {IN / 8, OUT}, t.qweight},
        {"m.p.qzeros", ST_DTYPE_I32, 2, {GROUPS, OUT / 8}, t.qzeros},
        {"m.p.scales", ST_DTYPE_F16, 2, {GROUPS, OUT}, t.scales},
        {"m.p.g_idx", ST_DTYPE_I32, 1, {IN}, t.g_idx},
    };
    part gbad[4];
    tensors u = t;
    u.g_idx[7] = 2;
    memcpy(gbad, gptq, sizeof gbad);
    gbad[3].data = u.g_idx;
    refused_weight(gptq_config, gbad, 4, "tensor 'm.p.g_idx' gives column 7 group 2; it has 2 groups");
    u.g_idx[7] = 1;
    refused_weight(gptq_config, gbad, 4, "gives column 7 group 1, not 0, but desc_act is false");
    u.g_idx[7] = -1;
    refused_weight(gptq_config, gbad, 4, "gives column 7 group -1");
    /* desc_act without g_idx. */
    refused_weight("{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 16, \"sym\": false, "
                   "\"desc_act\": true}",
                   gptq, 3, "weight 'm.p.weight' has no g_idx, which desc_act (act-order) requires");
    /* v1: stored 15 is zero 16. */
    tensors v = t;
    fill(&v, 15);
    memcpy(gbad, gptq, sizeof gbad);
    gbad[1].data = v.qzeros;
    refused_weight(gptq_config, gbad, 4, "tensor 'm.p.qzeros' holds zero point 16 at [0, 0]");
    /* sym: every zero 8 (stored 7 in v1); 3 + 1 is not. */
    refused_weight("{\"quant_method\": \"gptq\", \"bits\": 4, \"group_size\": 16, \"sym\": true}", gptq, 4,
                   "tensor 'm.p.qzeros' holds zero point 4 at [0, 0], but sym is true");
    /* GPTQ's packing has no room for a qweight of AWQ's shape. */
    refused_weight(gptq_config, awq, 3, "weight 'm.p.weight' has 256 input and 1 output features");
}

static void test_fp8_tensors_refused(void **state) {
    (void)state;
    uint8_t codes[OUT * IN];
    for (unsigned i = 0; i < OUT * IN; i++)
        codes[i] = (uint8_t)(i % 0x70);
    float channel[OUT], one = 0.0125f, input = 0.5f;
    for (unsigned n = 0; n < OUT; n++)
        channel[n] = 0.25f * (float)(n + 1);
    const char *per_tensor = "{\"quant_method\": \"fp8\", \"activation_scheme\": \"static\"}";
    const char *per_channel = "{\"quant_method\": \"compressed-tensors\", \"format\": \"float-quantized\", "
                              "\"config_groups\": {\"group_0\": {\"targets\": [\"Linear\"], \"weights\": "
                              "{\"num_bits\": 8, \"type\": \"float\", \"strategy\": \"channel\"}}}}";
    part fp8[] = {
        {"m.p.weight", ST_DTYPE_F8_E4M3, 2, {OUT, IN}, codes},
        {"m.p.weight_scale", ST_DTYPE_F32, 0, {0, 0}, &one},
        {"m.p.input_scale", ST_DTYPE_F32, 1, {1, 0}, &input},
    };
    part bad[3];
    memcpy(bad, fp8, sizeof bad);
    bad[2].name = NULL;
    refused_weight(per_tensor, bad, 3,
                   "weight 'm.p.weight' lacks an input_scale, but the activations are static");
    memcpy(bad, fp8, sizeof bad);
    bad[1].name = NULL;
    refused_weight(per_tensor, bad, 3, "weight 'm.p.weight' is F8_E4M3 without its weight_scale tensor");
    memcpy(bad, fp8, sizeof bad);
    bad[1] = (part){"m.p.weight_scale", ST_DTYPE_F32, 2, {OUT, 1}, channel};
    refused_weight(per_tensor, bad, 3,
                   "tensor 'm.p.weight_scale' has shape [8, 1]; expected one scale ([] or [1])");
    float negative = -1.0f;
    memcpy(bad, fp8, sizeof bad);
    bad[1].data = &negative;
    refused_weight(per_tensor, bad, 3, "tensor 'm.p.weight_scale' holds -1 at 0; a scale must be positive");
    uint8_t nan_codes[OUT * IN];
    memcpy(nan_codes, codes, sizeof codes);
    nan_codes[IN + 3] = 0xff;
    memcpy(bad, fp8, sizeof bad);
    bad[0].data = nan_codes;
    refused_weight(per_tensor, bad, 3, "tensor 'm.p.weight' holds NaN at [1, 3]");
    part empty[] = {
        {"m.p.weight", ST_DTYPE_F8_E4M3, 2, {0, 1u << 30}, NULL},
        {"m.p.weight_scale", ST_DTYPE_F32, 0, {0, 0}, &one},
        {"m.p.input_scale", ST_DTYPE_F32, 1, {1, 0}, &input},
    };
    refused_weight(per_tensor, empty, 3, "tensor 'm.p.weight' holds no weights (shape [0, 1073741824])");
    /* Per channel: f32 scales must be ones f16 holds exactly. */
    part channel_parts[] = {
        {"m.p.weight", ST_DTYPE_F8_E4M3, 2, {OUT, IN}, codes},
        {"m.p.weight_scale", ST_DTYPE_F32, 2, {OUT, 1}, channel},
    };
    channel[2] = 0.1f;
    refused_weight(
        per_channel, channel_parts, 2,
        "tensor 'm.p.weight_scale' holds scale 0.100000001 for row 2, which f16 (smelt's scale type) "
        "cannot hold exactly");
    channel[2] = 0.75f;
    part with_input[] = {channel_parts[0], channel_parts[1], fp8[2]};
    refused_weight(per_channel, with_input, 3, "has an input_scale, but the activations are dynamic");
    /* The good per-channel one loads, with channel[n] as row n's scale. */
    qck_scheme s;
    assert_true(scheme_of(per_channel, &s));
    write_parts(channel_parts, 2);
    st_checkpoint ck;
    assert_true(st_checkpoint_open(path_in("model.safetensors"), &ck, &diag));
    qck_weight w;
    assert_int_equal(qck_read_weight(&s, &ck, "m.p.weight", &w, &diag), QCK_QUANTIZED);
    for (unsigned n = 0; n < OUT; n++)
        assert_true(quant_value(&w.tensor, n, 5) == plan_f8e4m3_to_f32(codes[n * IN + 5]) * channel[n]);
    qck_weight_free(&w);
    st_checkpoint_close(&ck);
    /* A float weight with a weight_scale is no FP8 weight. */
    float plain[OUT * IN] = {0};
    part mixed[] = {
        {"m.p.weight", ST_DTYPE_F32, 2, {OUT, IN}, plain},
        {"m.p.weight_scale", ST_DTYPE_F32, 0, {0, 0}, &one},
        {"m.p.input_scale", ST_DTYPE_F32, 1, {1, 0}, &input},
    };
    refused_weight(per_tensor, mixed, 3, "weight 'm.p.weight' has a weight_scale but is not F8_E4M3");
}

/* ---- binding weight ops to a pre-quantized checkpoint ----------------- */

static uint32_t add_weight(ir_module *m, const char *name, int64_t rows, int64_t cols) {
    int32_t file = diag_file_id(&diag, "model.smelt");
    uint32_t op = ir_append_op(m, IR_OP_WEIGHT, NULL, 0, UINT32_MAX, (smelt_loc){file, 7, 0});
    assert_true(ir_op_set_string(m, op, "name", name));
    ir_op_fill_defaults(m, op);
    m->values[ir_op_result(m, op, 0)].type =
        (ir_type){.dtype = SMELT_DTYPE_F32, .rank = 2, .dims = {ir_dim_const(rows), ir_dim_const(cols)}};
    return op;
}

static void test_binding(void **state) {
    (void)state;
    static const char *const names[] = {"model.layers.0.self_attn.k_proj.weight",
                                        "model.layers.0.self_attn.v_proj.weight"};
    qck_scheme s;
    assert_true(qck_scheme_of_file(fixture("gptq-actorder", "config.json"), &s, &diag));
    st_checkpoint ck;
    st_file truth;
    assert_true(st_checkpoint_open(fixture("gptq-actorder", "model.safetensors"), &ck, &diag));
    assert_true(st_file_open(fixture("gptq-actorder", "dequantized.safetensors"), &truth, &diag));
    ir_module m;
    ir_module_init(&m, "m");
    uint32_t ops[2] = {add_weight(&m, names[0], 32, 64), add_weight(&m, names[1], 32, 64)};
    fe_weight_binding b;
    assert_true(fe_bind_weights_quantized(&m, &ck, &s, &diag, &b));
    assert_int_equal(b.unused_count, 0); /* qweight, qzeros, scales and g_idx all used */
    for (int i = 0; i < 2; i++) {
        const fe_bound_weight *w = fe_weight_binding_get(&b, ops[i]);
        assert_non_null(w);
        assert_true(w->quantized);
        /* Read as f32: the tool's dequantization, bit for bit. */
        float got[32 * 64];
        assert_true(fe_weight_read_f32(&b, ops[i], got, 32 * 64));
        assert_memory_equal(got, st_file_find(&truth, names[i])->data, sizeof got);
        /* Read packed: qck_read_weight's bytes, in the format qck_weight_format gives. */
        quant_format f, want;
        uint64_t rows, cols;
        assert_int_equal(qck_weight_format(&s, &ck, names[i], &want, &rows, &cols, &diag), QCK_QUANTIZED);
        assert_int_equal(rows, 32), assert_int_equal(cols, 64);
        qck_weight q;
        assert_int_equal(qck_read_weight(&s, &ck, names[i], &q, &diag), QCK_QUANTIZED);
        assert_true(quant_format_equal(&q.tensor.format, &want));
        uint8_t *bytes = malloc(q.tensor.layout.total);
        assert_non_null(bytes);
        assert_false(fe_weight_read_packed(&b, ops[i], &f, bytes, q.tensor.layout.total - 1));
        assert_true(fe_weight_read_packed(&b, ops[i], &f, bytes, q.tensor.layout.total));
        assert_true(quant_format_equal(&f, &want));
        assert_memory_equal(bytes, q.tensor.data, q.tensor.layout.total);
        free(bytes);
        qck_weight_free(&q);
    }
    fe_weight_binding_free(&b);
    assert_int_equal(diag.error_count, 0);

    /* Each weight op's format, for the precision pass: both quantized. */
    uint32_t plain = add_weight(&m, "model.layers.0.self_attn.q_proj.weight", 64, 64);
    quant_format formats[3];
    assert_true(qck_module_formats(&m, &s, &ck, formats, &diag));
    for (int i = 0; i < 2; i++) {
        assert_int_equal(formats[ops[i]].kind, QUANT_INT4);
        assert_int_equal(formats[ops[i]].method, QUANT_METHOD_CHECKPOINT);
        assert_true(formats[ops[i]].has_group_index);
    }
    assert_int_equal(formats[plain].kind, QUANT_NONE); /* not in this checkpoint: the binder says so */
    m.ops[plain].dead = true;

    /* The op's shape is checked against the unpacked weight's. */
    m.values[ir_op_result(&m, ops[1], 0)].type.dims[1] = ir_dim_const(32);
    assert_false(fe_bind_weights_quantized(&m, &ck, &s, &diag, &b));
    expect_diag("model.smelt:7: error: weight 'model.layers.0.self_attn.v_proj.weight' is [32, 64] in the "
                "checkpoint (gptq quantized) but the model expects [32, 32]");
    fe_weight_binding_free(&b);
    /* Without the scheme the quantized tensors bind to nothing. */
    m.values[ir_op_result(&m, ops[1], 0)].type.dims[1] = ir_dim_const(64);
    assert_false(fe_bind_weights(&m, &ck, &diag, &b));
    expect_diag("weight 'model.layers.0.self_attn.k_proj.weight' is not in the checkpoint");
    fe_weight_binding_free(&b);
    ir_module_free(&m);
    st_file_close(&truth);
    st_checkpoint_close(&ck);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_awq, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gptq_symmetric, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gptq_act_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gptq_v2, setup, teardown),
        cmocka_unit_test_setup_teardown(test_gptq_int8, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fp8_per_tensor, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fp8_per_channel, setup, teardown),
        cmocka_unit_test_setup_teardown(test_configs_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_no_quantization, setup, teardown),
        cmocka_unit_test_setup_teardown(test_int4_tensors_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_fp8_tensors_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_binding, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
