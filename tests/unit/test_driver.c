/* test_driver.c - the driver library (driver.h) on tests/fixtures/llama:
 * a plan compiled here and opened on the host simulator, a model source
 * compiled in memory, and a plan without weights bound from the checkpoint
 * all step to the reference interpreter's logits; missing files, files that
 * are neither a plan nor a source, and a plan given to the ref backend are
 * refused with a message and no model. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "driver.h"
#include "plan_edit.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FIXTURE SMELT_SOURCE_DIR "/tests/fixtures/llama"
#define MODEL SMELT_SOURCE_DIR "/examples/llama.smelt"

enum { VOCAB = 97, STEP = 5 };
static const int32_t ids[STEP] = {12, 93, 25, 91, 78};
static const int32_t pos[STEP] = {0, 1, 2, 3, 4};

/* Diagnostics into memory, so that a test can read what was reported. */
typedef struct captured_diag {
    diag_engine d;
    char *text;
    size_t length;
    FILE *out;
} captured_diag;

static void capture_init(captured_diag *c) {
    c->text = NULL;
    c->out = open_memstream(&c->text, &c->length);
    assert_non_null(c->out);
    diag_init(&c->d, c->out);
}

static const char *capture_text(captured_diag *c) {
    fflush(c->out);
    return c->text ? c->text : "";
}

static void capture_free(captured_diag *c) {
    diag_free(&c->d);
    fclose(c->out);
    free(c->text);
}

static drv_model_options fixture_options(const char *model_path, drv_backend backend) {
    drv_model_options o = drv_model_options_default();
    o.model_path = model_path;
    o.backend = backend;
    o.source.config_path = FIXTURE "/config.json";
    o.weights_path = FIXTURE "/model.safetensors";
    return o;
}

/* Logits [STEP, VOCAB] of one prefill step of the fixture's prompt. */
static void step_fixture(const drv_model_options *o, float *logits) {
    captured_diag c;
    capture_init(&c);
    drv_model *model;
    bool opened = drv_model_open(o, &model, &c.d);
    if (!opened) fprintf(stderr, "%s", capture_text(&c));
    assert_true(opened);
    const drv_model_info *info = drv_model_get_info(model);
    assert_int_equal(info->vocab, VOCAB);
    assert_true(info->max_step_tokens == 0 || info->max_step_tokens >= STEP);
    assert_true(drv_model_step(model, ids, pos, STEP, DRV_ROWS_ALL, logits, &c.d));
    /* A reset sequence gives the same logits again. */
    float again[STEP * VOCAB];
    drv_model_reset(model);
    assert_true(drv_model_step(model, ids, pos, STEP, DRV_ROWS_ALL, again, &c.d));
    assert_memory_equal(logits, again, sizeof again);
    /* The last row alone (an engine runs its output head on that row only)
     * is the last row of all, bit for bit. */
    float last[VOCAB];
    drv_model_reset(model);
    assert_true(drv_model_step(model, ids, pos, STEP, DRV_ROWS_LAST, last, &c.d));
    assert_memory_equal(last, logits + (STEP - 1) * VOCAB, sizeof last);
    assert_int_equal(c.d.error_count, 0);
    drv_model_close(model);
    capture_free(&c);
}

/* Within 1e-4 of the reference's logit range, the fp32 bound of docs/design.md. */
static void assert_close_to(const float *got, const float *expected) {
    float lo = expected[0], hi = expected[0];
    for (int i = 0; i < STEP * VOCAB; i++) {
        lo = fminf(lo, expected[i]);
        hi = fmaxf(hi, expected[i]);
    }
    float bound = 1e-4f * (hi - lo);
    for (int i = 0; i < STEP * VOCAB; i++)
        if (fabsf(got[i] - expected[i]) > bound)
            fail_msg("logit %d: %g, the reference says %g (bound %g)", i, got[i], expected[i], bound);
}

static float reference[STEP * VOCAB];

static int reference_setup(void **state) {
    (void)state;
    drv_model_options o = fixture_options(MODEL, DRV_BACKEND_REF);
    step_fixture(&o, reference);
    return 0;
}

/* A temporary file name in TMPDIR; the file exists (empty). */
static void temporary_path(char *path, size_t size, const char *what) {
    const char *folder = getenv("TMPDIR");
    snprintf(path, size, "%s/smelt-test-driver-%s-XXXXXX", folder && *folder ? folder : "/tmp", what);
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    close(fd);
}

/* Compiles the fixture (f32, host kernels; weights inside unless
 * weights_path is NULL) into a new temporary plan at path. */
static void compile_fixture(char *path, size_t size, const char *what, const char *weights_path) {
    temporary_path(path, size, what);
    assert_false(drv_is_plan_file(path)); /* empty */
    captured_diag c;
    capture_init(&c);
    drv_source_options source = {.config_path = FIXTURE "/config.json"};
    drv_compile_options o = {.precision = DRV_PRECISION_F32, .host = true, .weights_path = weights_path};
    drv_compile_report report;
    bool ok = drv_compile(MODEL, &source, &o, path, &report, &c.d);
    if (!ok) fail_msg("%s", capture_text(&c));
    assert_true(report.kernel_count > 0 && report.file_size > 0);
    assert_true(drv_is_plan_file(path));
    capture_free(&c);
}

/* On the host simulator, the last row's logits alone (the output head run
 * on that row only) are the last row of every row's, bit for bit: the step's
 * T picks the same kernels either way. Steps of 1 to 4 tokens run the fused
 * GEMV groups, longer ones the ops one by one; f32 and bf16 plans; the
 * greedy token picked on the device is that row's argmax. */
static void test_last_row_is_the_last_of_all(void **state) {
    (void)state;
    static const int32_t prompt[13] = {12, 93, 25, 91, 78, 3, 44, 60, 7, 81, 19, 2, 55};
    static const int32_t at[13] = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12};
    static const uint32_t steps[] = {1, 2, 3, 4, 5, 8, 13};
    for (int precision = 0; precision < 2; precision++) {
        drv_model_options o = fixture_options(MODEL, DRV_BACKEND_HOST);
        o.precision = precision ? DRV_PRECISION_BF16 : DRV_PRECISION_F32;
        captured_diag c;
        capture_init(&c);
        drv_model *model;
        bool opened = drv_model_open(&o, &model, &c.d);
        if (!opened) fail_msg("%s", capture_text(&c));
        for (size_t k = 0; k < sizeof steps / sizeof steps[0]; k++) {
            uint32_t n = steps[k];
            float all[13 * VOCAB], last[VOCAB];
            drv_model_reset(model);
            assert_true(drv_model_step(model, prompt, at, n, DRV_ROWS_ALL, all, &c.d));
            drv_model_reset(model);
            assert_true(drv_model_step(model, prompt, at, n, DRV_ROWS_LAST, last, &c.d));
            if (memcmp(last, all + (n - 1) * VOCAB, sizeof last) != 0)
                fail_msg("%s, %u tokens: the last row alone differs from the last of all",
                         precision ? "bf16" : "f32", n);
            int32_t token, best = 0;
            for (int v = 1; v < VOCAB; v++)
                if (last[v] > last[best]) best = v;
            drv_model_reset(model);
            assert_true(drv_model_step_greedy(model, prompt, at, n, &token, &c.d));
            assert_int_equal(token, best);
        }
        assert_int_equal(c.d.error_count, 0);
        drv_model_close(model);
        capture_free(&c);
    }
}

/* Steps of 1 to 8 tokens on the host with each side of every choice between
 * a fused group's lowerings (plan/program.h, "Choices"): the host's rule
 * (the GEMMs from 5 tokens on) and the GEMV kernels in every step
 * (gemv_max_tokens 16, over 4-token tiles above 4), each against the
 * reference within the f32 bound, every row. */
static void test_gemv_and_gemms_agree(void **state) {
    (void)state;
    static const int32_t prompt[8] = {12, 93, 25, 91, 78, 3, 44, 60};
    static const int32_t at[8] = {0, 1, 2, 3, 4, 5, 6, 7};
    char path[256];
    compile_fixture(path, sizeof path, "choices", FIXTURE "/model.safetensors");
    drv_model_options ref = fixture_options(MODEL, DRV_BACKEND_REF);
    drv_model_options sides[2] = {fixture_options(path, DRV_BACKEND_HOST),
                                  fixture_options(path, DRV_BACKEND_HOST)};
    sides[0].weights_path = sides[1].weights_path = NULL;
    sides[1].gemv_max_tokens = 16;
    captured_diag c;
    capture_init(&c);
    drv_model *want, *got[2];
    if (!drv_model_open(&ref, &want, &c.d) || !drv_model_open(&sides[0], &got[0], &c.d) ||
        !drv_model_open(&sides[1], &got[1], &c.d))
        fail_msg("%s", capture_text(&c));
    for (uint32_t n = 1; n <= 8; n++) {
        float expected[8 * VOCAB], logits[8 * VOCAB];
        drv_model_reset(want);
        assert_true(drv_model_step(want, prompt, at, n, DRV_ROWS_ALL, expected, &c.d));
        float lo = expected[0], hi = expected[0];
        for (uint32_t i = 0; i < n * VOCAB; i++) {
            lo = fminf(lo, expected[i]);
            hi = fmaxf(hi, expected[i]);
        }
        float first[8 * VOCAB];
        for (int side = 0; side < 2; side++) {
            drv_model_reset(got[side]);
            assert_true(drv_model_step(got[side], prompt, at, n, DRV_ROWS_ALL, side ? logits : first, &c.d));
            if (side == 0) memcpy(logits, first, sizeof first);
            /* below 5 tokens both run the GEMVs, bit for bit; above, other kernels (other sums) */
            if (side == 1 && (memcmp(logits, first, n * VOCAB * sizeof(float)) == 0) != (n <= 4))
                fail_msg("%u tokens: the two sides' logits are %s", n,
                         n <= 4 ? "not the same bits" : "the same bits");
            for (uint32_t i = 0; i < n * VOCAB; i++)
                if (fabsf(logits[i] - expected[i]) > 1e-4f * (hi - lo))
                    fail_msg("%s, %u tokens: logit %u is %g, the reference's %g", side ? "GEMV" : "GEMMs", n,
                             i, logits[i], expected[i]);
        }
    }
    assert_int_equal(c.d.error_count, 0);
    drv_model_close(want);
    drv_model_close(got[0]);
    drv_model_close(got[1]);
    capture_free(&c);
    unlink(path);
}

static void test_plan_compiled_here(void **state) {
    (void)state;
    char plan[4096];
    compile_fixture(plan, sizeof plan, "plan", FIXTURE "/model.safetensors");

    drv_model_options o = fixture_options(plan, DRV_BACKEND_HOST);
    o.weights_path = NULL; /* the plan holds them */
    float logits[STEP * VOCAB];
    step_fixture(&o, logits);
    assert_close_to(logits, reference);

    /* `smelt inspect` through the driver prints the plan. */
    captured_diag c;
    capture_init(&c);
    char *printed = NULL;
    size_t printed_length = 0;
    FILE *out = open_memstream(&printed, &printed_length);
    assert_true(drv_plan_print(plan, NULL, out, &c.d));
    fclose(out);
    assert_non_null(strstr(printed, "content hash"));
    free(printed);
    capture_free(&c);
    unlink(plan);
}

/* A plan without weights, bound from the checkpoint when opened: every
 * tensor the plan names, the others skipped (smelt_plan_has_weight). */
static void test_plan_bound_from_checkpoint(void **state) {
    (void)state;
    char plan[4096];
    compile_fixture(plan, sizeof plan, "unbound", NULL);
    drv_model_options o = fixture_options(plan, DRV_BACKEND_HOST);
    float logits[STEP * VOCAB];
    step_fixture(&o, logits);
    assert_close_to(logits, reference);
    unlink(plan);
}

static void test_source_with_weights(void **state) {
    (void)state;
    drv_model_options o = fixture_options(MODEL, DRV_BACKEND_HOST);
    o.byte_tokenizer = true;
    float logits[STEP * VOCAB];
    step_fixture(&o, logits);
    assert_close_to(logits, reference);
}

/* Each refusal: false, no model, one error that says what went wrong. */
static void assert_refused(const drv_model_options *o, const char *message) {
    captured_diag c;
    capture_init(&c);
    drv_model *model = (drv_model *)&c; /* overwritten with NULL */
    assert_false(drv_model_open(o, &model, &c.d));
    assert_null(model);
    assert_true(c.d.error_count > 0);
    const char *text = capture_text(&c);
    if (!strstr(text, message)) fail_msg("expected '%s' in: %s", message, text);
    capture_free(&c);
}

static void test_refusals(void **state) {
    (void)state;
    drv_model_options o = fixture_options(FIXTURE "/no-such-model.smelt", DRV_BACKEND_HOST);
    assert_false(drv_is_plan_file(o.model_path));
    assert_refused(&o, "no-such-model.smelt");

    /* Neither a plan nor a source: the checkpoint itself. */
    o.model_path = FIXTURE "/model.safetensors";
    assert_false(drv_is_plan_file(o.model_path));
    assert_refused(&o, "model.safetensors");

    /* A source needs weights. */
    o = fixture_options(MODEL, DRV_BACKEND_HOST);
    o.weights_path = NULL;
    assert_refused(&o, "running a model source needs --weights");

    /* A missing checkpoint. */
    o.weights_path = FIXTURE "/no-such-weights.safetensors";
    assert_refused(&o, "no-such-weights.safetensors");

    /* The ref backend interprets IR, not plans. */
    char plan[4096];
    compile_fixture(plan, sizeof plan, "ref", NULL);
    o = fixture_options(plan, DRV_BACKEND_REF);
    assert_refused(&o, "the ref backend interprets a model's IR");
    unlink(plan);

    drv_model_close(NULL);
}

static void test_names_and_tokenizer(void **state) {
    (void)state;
    drv_precision p;
    assert_true(drv_precision_from_name("bf16", &p) && p == DRV_PRECISION_BF16);
    assert_true(drv_precision_from_name("f32", &p) && p == DRV_PRECISION_F32);
    assert_true(drv_precision_from_name("int4-rtn", &p) && p == DRV_PRECISION_INT4_RTN);
    assert_true(drv_precision_from_name("fp8", &p) && p == DRV_PRECISION_FP8);
    assert_string_equal(drv_precision_name(DRV_PRECISION_INT8), "int8");
    assert_false(drv_precision_from_name("int4", &p));
    drv_backend b;
    assert_true(drv_backend_from_name("ref", &b) && b == DRV_BACKEND_REF);
    assert_true(drv_backend_from_name("cuda", &b) && b == DRV_BACKEND_CUDA);
    assert_false(drv_backend_from_name("tpu", &b));

    drv_source_options s = {0};
    for (int i = 0; i < DRV_MAX_SETTINGS; i++)
        assert_true(drv_source_options_set(&s, "n", "1"));
    assert_false(drv_source_options_set(&s, "n", "1"));

    drv_tokenizer t = {true, 1, 2};
    int32_t out[4];
    assert_int_equal(drv_tokenizer_encode(&t, "hi\xff", 3, out), 4);
    assert_int_equal(out[0], 1);
    assert_int_equal(out[1], 'h');
    assert_int_equal(out[3], 255);
    t.bos = -1;
    assert_int_equal(drv_tokenizer_encode(&t, "hi", 2, out), 2);
    assert_int_equal(drv_tokenizer_byte(&t, 'A'), 'A');
    assert_int_equal(drv_tokenizer_byte(&t, 256), -1);
    assert_int_equal(drv_tokenizer_byte(&t, -1), -1);
}

/* A plan's byte tokenizer must cover its vocabulary wherever it comes from:
 * one edited to claim fewer special ids than the vocabulary holds (the
 * demo's 258 ids: bytes, BOS 256, EOS 257) is refused when opened, as
 * --tokenizer bytes refuses it when compiling. */
static void test_plan_tokenizer_must_fit(void **state) {
    (void)state;
    char path[512];
    temporary_path(path, sizeof path, "tokenizer");
    captured_diag c;
    capture_init(&c);
    drv_source_options source = {.config_path = SMELT_SOURCE_DIR "/tests/fixtures/demo/config.json"};
    drv_compile_options o = {.precision = DRV_PRECISION_F32,
                             .host = true,
                             .byte_tokenizer = true,
                             .weights_path = SMELT_SOURCE_DIR "/tests/fixtures/demo/model.safetensors"};
    if (!drv_compile(MODEL, &source, &o, path, NULL, &c.d)) fail_msg("%s", capture_text(&c));

    FILE *f = fopen(path, "rb");
    assert_non_null(f);
    fseek(f, 0, SEEK_END);
    size_t size = (size_t)ftell(f);
    rewind(f);
    uint8_t *bytes = malloc(size);
    assert_int_equal(fread(bytes, 1, size, f), size);
    fclose(f);
    uint8_t *entry = plan_edit_entry(bytes, PLAN_SECTION_TOKENIZER);
    assert_non_null(entry);
    char *json = (char *)bytes + plan_get_u64(entry + PLAN_ENTRY_AT_OFFSET);
    size_t json_size = plan_get_u64(entry + PLAN_ENTRY_AT_SIZE);
    char *bos = NULL;
    for (size_t i = 0; i + 9 <= json_size && !bos; i++)
        if (memcmp(json + i, "\"bos\":256", 9) == 0) bos = json + i;
    assert_non_null(bos);
    memcpy(bos, "\"bos\":  1", 9);
    plan_edit_reseal(bytes);
    f = fopen(path, "wb");
    assert_int_equal(fwrite(bytes, 1, size, f), size);
    fclose(f);
    free(bytes);

    drv_model_options m = drv_model_options_default();
    m.model_path = path;
    m.backend = DRV_BACKEND_HOST;
    drv_model *model;
    assert_false(drv_model_open(&m, &model, &c.d));
    assert_null(model);
    assert_non_null(strstr(capture_text(&c),
                           "the plan's byte tokenizer covers ids 0..255 and BOS/EOS, 257 ids, "
                           "but this model's vocabulary has 258"));
    unlink(path);
    capture_free(&c);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_names_and_tokenizer),
        cmocka_unit_test(test_plan_compiled_here),
        cmocka_unit_test(test_last_row_is_the_last_of_all),
        cmocka_unit_test(test_gemv_and_gemms_agree),
        cmocka_unit_test(test_plan_bound_from_checkpoint),
        cmocka_unit_test(test_source_with_weights),
        cmocka_unit_test(test_refusals),
        cmocka_unit_test(test_plan_tokenizer_must_fit),
    };
    return cmocka_run_group_tests(tests, reference_setup, NULL);
}
