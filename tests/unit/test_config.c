/* test_config.c - binding params: config.json, --set, defaults, and their errors.
 *
 * Models are DSL text (fe_parse_dsl_text); configs are written to a fresh
 * temporary folder per test. Diagnostics go to a memory stream.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "config.h"
#include "frontend.h"
#include "ir_io.h"

#include <jansson.h>

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

static diag_engine diag;
static ir_module module;
static FILE *diag_stream;
static char *diag_buffer;
static size_t diag_size;
static char folder[64];
static char config_path[128];

static int setup(void **state) {
    (void)state;
    diag_stream = open_memstream(&diag_buffer, &diag_size);
    diag_init(&diag, diag_stream);
    memset(&module, 0, sizeof module);
    snprintf(folder, sizeof folder, "/tmp/smelt-test-config-XXXXXX");
    if (!mkdtemp(folder)) fail_msg("mkdtemp failed");
    snprintf(config_path, sizeof config_path, "%s/config.json", folder);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    ir_module_free(&module);
    diag_free(&diag);
    fclose(diag_stream);
    free(diag_buffer);
    diag_buffer = NULL;
    unlink(config_path);
    rmdir(folder);
    return 0;
}

static void write_config(const char *text) {
    FILE *f = fopen(config_path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static const char *diagnostics(void) {
    fflush(diag_stream);
    return diag_buffer ? diag_buffer : "";
}

static void expect_diag(const char *text) {
    if (!strstr(diagnostics(), text))
        fail_msg("expected in diagnostics: %s\n--- got:\n%s", text, diagnostics());
}

static bool elaborate(const char *dsl, const fe_options *o) {
    ast_model ast;
    ast_model_init(&ast);
    bool parsed = fe_parse_dsl_text("model.smelt", dsl, strlen(dsl), &diag, &ast);
    if (!parsed) fail_msg("the test model does not parse:\n%s", diagnostics());
    bool ok = fe_elaborate(&ast, o, &diag, &module);
    ast_model_free(&ast);
    fflush(diag_stream);
    return ok;
}

static const ir_param *find_param(const char *name) {
    for (uint32_t i = 0; i < module.param_count; i++)
        if (strcmp(module.params[i].name, name) == 0) return &module.params[i];
    fail_msg("no param '%s'", name);
    return NULL;
}

static bool has_param(const char *name) {
    for (uint32_t i = 0; i < module.param_count; i++)
        if (strcmp(module.params[i].name, name) == 0) return true;
    return false;
}

static const char model_text[] = "model m {\n"
                                 "  param hidden_size: int\n"
                                 "  param rms_norm_eps: float\n"
                                 "  param tie: bool = false\n"
                                 "  param model_type: string = \"llama\"\n"
                                 "  param bias: bool = model_type == \"qwen2\"\n"
                                 "  param rope_scaling: float = 2.5\n"
                                 "  param layers: int = 1\n"
                                 "  param head: int = hidden_size / 4\n"
                                 "}\n";

static const char config_text[] = "{\n"
                                  "  \"hidden_size\": 64,\n"
                                  "  \"rms_norm_eps\": 1e-05,\n"
                                  "  \"tie\": true,\n"
                                  "  \"model_type\": \"qwen2\",\n"
                                  "  \"extra\": [1, {\"a\": 2}],\n"
                                  "  \"rope_scaling\": null,\n"
                                  "  \"layers\": 4.0\n"
                                  "}\n";

/* Every param from the config, null counts as absent, an unknown key
 * allowed deliberately, defaults see the bound values of earlier params. */
static void test_config_binds_params(void **state) {
    (void)state;
    write_config(config_text);
    fe_options o = {.config_path = config_path, .allowed_keys = {"extra"}, .allowed_key_count = 1};
    assert_true(elaborate(model_text, &o));
    assert_int_equal(module.param_count, 8);
    assert_int_equal(find_param("hidden_size")->value.i, 64);
    assert_true(find_param("rms_norm_eps")->value.f == 1e-5);
    assert_true(find_param("tie")->value.b);
    assert_string_equal(find_param("model_type")->value.s, "qwen2");
    assert_true(find_param("bias")->value.b);
    assert_true(find_param("rope_scaling")->value.f == 2.5);
    assert_int_equal(find_param("layers")->value.i, 4); /* 4.0 is an int */
    assert_int_equal(find_param("head")->value.i, 16);
    assert_int_equal(diag.error_count, 0);
}

/* transformers 5 keeps rope_theta under "rope_parameters"; a top-level key
 * of the same name binds the param (and must agree, test_nested_keys). */
static void test_config_rope_parameters(void **state) {
    (void)state;
    write_config(
        "{\"hidden_size\": 64, \"rms_norm_eps\": 1e-6, \"layers\": 3,\n"
        " \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 500000.0, \"layers\": 3}}\n");
    fe_options o = {.config_path = config_path};
    assert_true(elaborate("model m {\n  param hidden_size: int\n  param rms_norm_eps: float\n"
                          "  param layers: int\n  param rope_theta: float = 10000.0\n}\n",
                          &o));
    assert_true(find_param("rope_theta")->value.f == 500000.0);
    assert_int_equal(find_param("layers")->value.i, 3);
}

/* --set beats the config, the config beats the default, the last --set of
 * a name wins, and a default computed from a --set value sees it. */
static void test_set_overrides(void **state) {
    (void)state;
    write_config(config_text);
    fe_options o = {.config_path = config_path, .allowed_keys = {"extra"}, .allowed_key_count = 1};
    assert_true(fe_options_set(&o, "hidden_size", "100"));
    assert_true(fe_options_set(&o, "hidden_size", "128"));
    assert_true(fe_options_set(&o, "tie", "false"));
    assert_true(fe_options_set(&o, "model_type", "mistral"));
    assert_true(fe_options_set(&o, "rms_norm_eps", "-2.5e-3"));
    assert_true(fe_options_set(&o, "layers", "-3"));
    assert_true(elaborate(model_text, &o));
    assert_int_equal(find_param("hidden_size")->value.i, 128);
    assert_int_equal(find_param("head")->value.i, 32);
    assert_false(find_param("tie")->value.b);
    assert_string_equal(find_param("model_type")->value.s, "mistral");
    assert_false(find_param("bias")->value.b);
    assert_true(find_param("rms_norm_eps")->value.f == -2.5e-3);
    assert_int_equal(find_param("layers")->value.i, -3);
}

/* Without a config, the params with no default are errors that name them. */
/* A key no param binds is refused where it is, naming it and the spec,
 * unless it is harmless (metadata, dropout, token ids), null, or allowed. */
static void test_unbound_key_refused(void **state) {
    (void)state;
    write_config("{\n  \"hidden_size\": 64,\n  \"mlp_bias\": true,\n  \"rope_scaling\": {\"factor\": 8.0},\n"
                 "  \"sliding_window\": null,\n  \"transformers_version\": \"4.40.0\",\n"
                 "  \"attention_dropout\": 0.1,\n  \"eos_token_id\": [1, 2]\n}\n");
    fe_options o = {.config_path = config_path};
    assert_false(elaborate("model m {\n  param hidden_size: int\n}\n", &o));
    assert_int_equal(diag.error_count, 2);
    expect_diag("config.json:3:15: error: config key 'mlp_bias' (true) is bound by no param of model.smelt "
                "and is not known to be harmless");
    expect_diag("config.json:4:19: error: config key 'rope_scaling' (an object) is bound by no param");
    expect_diag("--allow-config-key mlp_bias");
}

/* --allow-config-key lets a key through by its name. */
static void test_allowed_key(void **state) {
    (void)state;
    write_config("{\"hidden_size\": 64, \"mlp_bias\": false}\n");
    fe_options o = {.config_path = config_path, .allowed_keys = {"mlp_bias"}, .allowed_key_count = 1};
    assert_true(elaborate("model m {\n  param hidden_size: int\n}\n", &o));
    assert_int_equal(diag.error_count, 0);
}

/* A nested rope_parameters member is a key of its own: rope_type "default"
 * is what the rope op computes, any other type needs a param. */
static void test_nested_keys(void **state) {
    (void)state;
    write_config(
        "{\"hidden_size\": 64, \"rope_parameters\": {\"rope_type\": \"default\", \"rope_theta\": 1e4}}\n");
    fe_options o = {.config_path = config_path};
    assert_true(elaborate("model m {\n  param hidden_size: int\n  param rope_theta: float\n}\n", &o));
    ir_module_free(&module);
    write_config("{\"hidden_size\": 64, \"rope_parameters\": {\"rope_type\": \"llama3\", \"factor\": 8.0,\n"
                 " \"rope_theta\": 1e4}}\n");
    assert_false(elaborate("model m {\n  param hidden_size: int\n  param rope_theta: float\n}\n", &o));
    expect_diag("config key 'rope_parameters.rope_type' (\"llama3\") is bound by no param");
    expect_diag("config key 'rope_parameters.factor' (8) is bound by no param");
    assert_int_equal(diag.error_count, 2);
    ir_module_free(&module);

    /* Both layouts at once must agree (the top-level key binds the param). */
    write_config("{\"hidden_size\": 64, \"rope_theta\": 1e4, \"rope_parameters\": {\"rope_theta\": 5e5}}\n");
    assert_false(elaborate("model m {\n  param hidden_size: int\n  param rope_theta: float\n}\n", &o));
    expect_diag("config.json:1:74: error: config key 'rope_parameters.rope_theta' differs from the top-level "
                "'rope_theta', which param 'rope_theta' of model.smelt binds");
    ir_module_free(&module);
    write_config(
        "{\"hidden_size\": 64, \"rope_theta\": 1e4, \"rope_parameters\": {\"rope_theta\": 10000}}\n");
    assert_true(elaborate("model m {\n  param hidden_size: int\n  param rope_theta: float\n}\n", &o));
}

/* The harmless table: each entry's condition. */
static void test_harmless_table(void **state) {
    (void)state;
    json_t *full = json_pack("[s, s]", "full_attention", "full_attention");
    json_t *mixed = json_pack("[s, s]", "full_attention", "sliding_attention");
    json_t *one = json_integer(1);
    assert_non_null(fe_config_key_harmless("layer_types", full));
    assert_null(fe_config_key_harmless("layer_types", mixed));
    assert_non_null(fe_config_key_harmless("use_cache", one));
    assert_null(fe_config_key_harmless("mlp_bias", one));
    assert_null(fe_config_key_harmless("rope_scaling", one));
    assert_non_null(fe_config_key_harmless("rope_interleaved", json_false()));
    assert_null(fe_config_key_harmless("rope_interleaved", json_true()));
    json_decref(full);
    json_decref(mixed);
    json_decref(one);
}

/* `require`: a value the spec does not implement is refused at the config
 * line that gave it, with the requirement as a note; from a --set, naming
 * the --set; from a default, at the require. */
static void test_require(void **state) {
    (void)state;
    static const char spec[] = "model m {\n  param hidden_act: string = \"silu\"\n"
                               "  require hidden_act == \"silu\", \"only silu\"\n}\n";
    write_config("{\n  \"hidden_act\": \"gelu\"\n}\n");
    fe_options o = {.config_path = config_path};
    assert_false(elaborate(spec, &o));
    expect_diag(
        "config.json:2:17: error: 'hidden_act' is \"gelu\", which model.smelt does not support: only silu");
    expect_diag("model.smelt:3:3: note: required here");
    ir_module_free(&module);
    fe_options set = {0};
    assert_true(fe_options_set(&set, "hidden_act", "relu"));
    assert_false(elaborate(spec, &set));
    expect_diag("error: --set hidden_act=\"relu\": model.smelt does not support it: only silu");
    ir_module_free(&module);
    fe_options none = {0};
    assert_true(elaborate(spec, &none));
    ir_module_free(&module);
    assert_false(elaborate("model m {\n  param n: int = 3\n  require n % 2 == 0\n}\n", &none));
    expect_diag("model.smelt:3:3: error: the model's requirement is not met ('n' is 3)");
    ir_module_free(&module);
    assert_false(elaborate("model m {\n  require 1\n}\n", &none));
    expect_diag("model.smelt:2:11: error: a require needs a bool condition, found an int");
}

static void test_missing_params(void **state) {
    (void)state;
    fe_options o = {0};
    assert_true(fe_options_set(&o, "hidden_size", "8"));
    assert_false(elaborate(model_text, &o));
    expect_diag("model.smelt:3:3: error: param 'rms_norm_eps' has no value; give it in config.json or with "
                "--set rms_norm_eps=...\n");
    assert_int_equal(diag.error_count, 1);
    assert_int_equal(find_param("head")->value.i, 2);
    assert_false(has_param("rms_norm_eps"));
}

/* Values of the wrong JSON type, each reported at the config file. */
static void test_config_type_mismatch(void **state) {
    (void)state;
    write_config("{\"hidden_size\": \"64\", \"rms_norm_eps\": \"small\", \"tie\": 1,\n"
                 " \"model_type\": 7, \"layers\": 2.5, \"head\": 1e300, \"rope_scaling\": [1]}\n");
    fe_options o = {.config_path = config_path};
    assert_false(elaborate(model_text, &o));
    /* Each at the line and column of the offending value. */
    expect_diag("config.json:1:17: error: param 'hidden_size' is int but the config gives a string\n");
    expect_diag("config.json:1:39: error: param 'rms_norm_eps' is float but the config gives a string\n");
    expect_diag("config.json:1:55: error: param 'tie' is bool but the config gives an int\n");
    expect_diag("config.json:2:16: error: param 'model_type' is string but the config gives an int\n");
    expect_diag("config.json:2:65: error: param 'rope_scaling' is float but the config gives a list\n");
    expect_diag("config.json:2:29: error: param 'layers' is int but the config gives the float 2.5\n");
    expect_diag("config.json:2:42: error: param 'head' is int but the config gives the float 1e+300\n");
    assert_int_equal(diag.error_count, 7); /* no cascade from the invalid values */
    assert_int_equal(module.param_count, 0);
}

/* A --set of no param, and --set text that does not convert. */
static void test_set_errors(void **state) {
    (void)state;
    fe_options o = {0};
    assert_true(fe_options_set(&o, "nope", "1"));
    assert_true(fe_options_set(&o, "hidden_size", "abc"));
    assert_true(fe_options_set(&o, "rms_norm_eps", "nan"));
    assert_true(fe_options_set(&o, "tie", "yes"));
    assert_true(fe_options_set(&o, "layers", "99999999999999999999"));
    assert_true(fe_options_set(&o, "rope_scaling", "1e999"));
    assert_true(fe_options_set(&o, "head", " 12"));
    assert_false(elaborate(model_text, &o));
    expect_diag("smelt: error: --set: the model has no param 'nope'\n");
    expect_diag("smelt: error: --set hidden_size=abc: 'hidden_size' is an int param; "
                "expected a decimal integer that fits in 64 bits\n");
    expect_diag(
        "smelt: error: --set rms_norm_eps=nan: 'rms_norm_eps' is a float param; expected a finite number\n");
    expect_diag("smelt: error: --set tie=yes: 'tie' is a bool param; expected true or false\n");
    expect_diag("smelt: error: --set layers=99999999999999999999: 'layers' is an int param");
    expect_diag("smelt: error: --set rope_scaling=1e999: 'rope_scaling' is a float param");
    expect_diag("smelt: error: --set head= 12: 'head' is an int param");
    assert_int_equal(diag.error_count, 7);
}

/* A 1 MB --set value is cut in the message. */
static void test_set_long_value(void **state) {
    (void)state;
    size_t n = 1 << 20;
    char *value = malloc(n + 1);
    memset(value, '7', n);
    value[0] = 'x';
    value[n] = '\0';
    fe_options o = {0};
    assert_true(fe_options_set(&o, "hidden_size", value));
    assert_true(fe_options_set(&o, "rms_norm_eps", "1"));
    assert_false(elaborate(model_text, &o));
    expect_diag("--set hidden_size=x777777777777777777777777777777777777777777777777777777777777777...: "
                "'hidden_size' is an int param");
    assert_true(diag_size < 1000);
    free(value);
}

static void test_config_syntax_error(void **state) {
    (void)state;
    write_config("{\n  \"hidden_size\": 1,\n  \"b\": }\n");
    fe_options o = {.config_path = config_path};
    assert_false(elaborate(model_text, &o));
    char expected[256];
    snprintf(expected, sizeof expected,
             "%s:3:8: error: config is not valid JSON: unexpected token near '}'\n"
             "    3 |   \"b\": }\n      |        ^\n",
             config_path);
    expect_diag(expected);
    /* The config might have bound the params: no "has no value" cascade. */
    assert_int_equal(diag.error_count, 1);
}

static void test_config_duplicate_key(void **state) {
    (void)state;
    write_config("{\"hidden_size\": 1, \"hidden_size\": 2}");
    fe_options o = {.config_path = config_path};
    assert_false(elaborate(model_text, &o));
    expect_diag("config.json:1:");
    expect_diag(": error: config is not valid JSON: duplicate object key");
    assert_int_equal(diag.error_count, 1);
}

static void test_config_unreadable(void **state) {
    (void)state;
    fe_options o = {.config_path = "/nonexistent/config.json"};
    assert_true(fe_options_set(&o, "hidden_size", "8"));
    assert_false(elaborate(model_text, &o));
    expect_diag("/nonexistent/config.json: error: cannot read the config: No such file or directory\n");
    assert_int_equal(diag.error_count, 1);
    /* The --set still binds. */
    assert_int_equal(find_param("hidden_size")->value.i, 8);
}

static void test_config_not_an_object(void **state) {
    (void)state;
    write_config("[1, 2]");
    fe_options o = {.config_path = config_path};
    assert_false(elaborate(model_text, &o));
    expect_diag("config.json: error: the config must be a JSON object of settings, found a list\n");
    assert_int_equal(diag.error_count, 1);
}

static void test_options_set_limit(void **state) {
    (void)state;
    fe_options o = {0};
    for (int i = 0; i < FE_MAX_SETTINGS; i++)
        assert_true(fe_options_set(&o, "a", "1"));
    assert_false(fe_options_set(&o, "a", "1"));
    assert_int_equal(o.setting_count, FE_MAX_SETTINGS);
}

/* fe_load_model: a .smelt file is parsed as DSL and elaborated. */
static void test_load_model(void **state) {
    (void)state;
    char path[160];
    snprintf(path, sizeof path, "%s/model.smelt", folder);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("model tiny {\n"
          "  param hidden_size: int\n"
          "  param layers: int = 3\n"
          "  dim tokens <= 32\n"
          "  input x: f32[tokens, hidden_size]\n"
          "  let h = x\n"
          "  for l in 0..layers {\n"
          "    weight w: [hidden_size, hidden_size] = \"layers.{l}.w\"\n"
          "    h = add(h, matmul(h, w))\n"
          "  }\n"
          "  output y = h\n"
          "}\n",
          f);
    fclose(f);
    write_config("{\"hidden_size\": 16}");
    fe_options o = {.config_path = config_path};
    bool ok = fe_load_model(path, &o, &diag, &module);
    fflush(diag_stream);
    unlink(path);
    if (!ok) fail_msg("%s", diagnostics());
    assert_string_equal(module.name, "tiny");
    assert_int_equal(module.op_count, 1 + 3 * 3 + 1); /* input, 3 x (weight, matmul, add), output */
    assert_int_equal(find_param("hidden_size")->value.i, 16);
    assert_non_null(module.source_path);
    assert_string_equal(module.source_path, path);

    /* A ".json" path goes to the JSON reader: the module's JSON dump loads
     * back to the same ops and params. */
    char json_path[160];
    snprintf(json_path, sizeof json_path, "%s/model.json", folder);
    f = fopen(json_path, "w");
    assert_non_null(f);
    ir_print_json(&module, f);
    fclose(f);
    ir_module again;
    ok = fe_load_model(json_path, NULL, &diag, &again);
    fflush(diag_stream);
    unlink(json_path);
    if (!ok) fail_msg("%s", diagnostics());
    assert_int_equal(again.op_count, module.op_count);
    for (uint32_t i = 0; i < module.op_count; i++)
        assert_int_equal(again.ops[i].kind, module.ops[i].kind);
    assert_int_equal(again.param_count, 2);
    assert_int_equal(again.params[0].value.i, 16);
    ir_module_free(&again);
}

/* fe_load_model: a parse error stops before elaboration; the module is
 * still initialised, so that freeing it is always right. */
static void test_load_model_parse_error(void **state) {
    (void)state;
    char path[160];
    snprintf(path, sizeof path, "%s/model.smelt", folder);
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs("model broken {\n  param p: int = \n}\n", f);
    fclose(f);
    bool ok = fe_load_model(path, NULL, &diag, &module);
    fflush(diag_stream);
    unlink(path);
    assert_false(ok);
    assert_true(diag.error_count >= 1);
    assert_int_equal(module.op_count, 0);
    expect_diag("model.smelt:");
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_config_binds_params, setup, teardown),
        cmocka_unit_test_setup_teardown(test_config_rope_parameters, setup, teardown),
        cmocka_unit_test_setup_teardown(test_set_overrides, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unbound_key_refused, setup, teardown),
        cmocka_unit_test_setup_teardown(test_allowed_key, setup, teardown),
        cmocka_unit_test_setup_teardown(test_nested_keys, setup, teardown),
        cmocka_unit_test_setup_teardown(test_harmless_table, setup, teardown),
        cmocka_unit_test_setup_teardown(test_require, setup, teardown),
        cmocka_unit_test_setup_teardown(test_missing_params, setup, teardown),
        cmocka_unit_test_setup_teardown(test_config_type_mismatch, setup, teardown),
        cmocka_unit_test_setup_teardown(test_set_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_set_long_value, setup, teardown),
        cmocka_unit_test_setup_teardown(test_config_syntax_error, setup, teardown),
        cmocka_unit_test_setup_teardown(test_config_duplicate_key, setup, teardown),
        cmocka_unit_test_setup_teardown(test_config_unreadable, setup, teardown),
        cmocka_unit_test_setup_teardown(test_config_not_an_object, setup, teardown),
        cmocka_unit_test_setup_teardown(test_options_set_limit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_model, setup, teardown),
        cmocka_unit_test_setup_teardown(test_load_model_parse_error, setup, teardown),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
