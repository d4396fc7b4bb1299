/* config_keys.c - no config key silently ignored.
 *
 * A Hugging Face config.json holds the model's hyperparameters beside
 * metadata, training settings and generation defaults. A key the spec binds
 * by a param is honoured; a key in the table below is known not to change
 * the logits, for the reason given beside it; every other key is refused,
 * since computing the model without it could give a wrong answer silently
 * (Llama 3.1's rope_scaling, Llama's mlp_bias). A key whose value the spec
 * cannot honour is refused by the spec itself: it binds the key as a param
 * and states what it implements with `require` (examples/llama.smelt:
 * `require hidden_act == "silu"`).
 *
 * "quantization_config" (a pre-quantized AWQ, GPTQ or FP8 checkpoint) is
 * bound by the checkpoint import (quant_checkpoint.h), whose own tables say
 * which of its members are read, harmless or refused.
 *
 * The table is the one place that says which keys are harmless; docs/json.md
 * ("Config keys") lists it for users. Add a key only with its reason.
 */
#include "config.h"

#include <jansson.h>
#include <string.h>

const char *const fe_config_quantization_object = "quantization_config";

/* When an entry holds: for any value, or only for one string value (also
 * when the value is a list of that string only). */
typedef enum harmless_when {
    HARMLESS_ALWAYS,
    HARMLESS_WHEN_STRING, /* the value is `string`, or a list of nothing but `string` */
    HARMLESS_WHEN_FALSE,  /* the value is false */
} harmless_when;

typedef struct harmless_key {
    const char *key; /* as shown: "rope_parameters.rope_type" for a nested member */
    harmless_when when;
    const char *string;
    const char *reason;
} harmless_key;

static const harmless_key harmless_keys[] = {
    /* What the checkpoint is and where it came from. */
    {"_name_or_path", HARMLESS_ALWAYS, NULL, "where the checkpoint was loaded from"},
    {"architectures", HARMLESS_ALWAYS, NULL, "the transformers class; the spec given is the architecture"},
    {"model_type", HARMLESS_ALWAYS, NULL,
     "the architecture's name; a spec that computes differently by it binds it as a param"},
    {"transformers_version", HARMLESS_ALWAYS, NULL, "the library version that wrote the file"},
    {"torch_dtype", HARMLESS_ALWAYS, NULL, "the checkpoint's storage dtype; --precision decides smelt's"},
    {"dtype", HARMLESS_ALWAYS, NULL, "transformers 5's name of torch_dtype"},
    {"tokenizer_class", HARMLESS_ALWAYS, NULL, "the tokenizer, not the network"},
    {"is_llama_config", HARMLESS_ALWAYS, NULL, "nanotron's marker (SmolLM2), read by no model code"},
    {"transformers.js_config", HARMLESS_ALWAYS, NULL, "settings of transformers.js's ONNX export"},
    /* Training only: initialisation, dropout (off at inference), auxiliary
     * losses and noise applied in training mode only. */
    {"initializer_range", HARMLESS_ALWAYS, NULL, "initialisation of training"},
    {"attention_dropout", HARMLESS_ALWAYS, NULL, "dropout is off at inference"},
    {"hidden_dropout", HARMLESS_ALWAYS, NULL, "dropout is off at inference"},
    {"attn_pdrop", HARMLESS_ALWAYS, NULL, "dropout is off at inference"},
    {"embd_pdrop", HARMLESS_ALWAYS, NULL, "dropout is off at inference"},
    {"resid_pdrop", HARMLESS_ALWAYS, NULL, "dropout is off at inference"},
    {"summary_first_dropout", HARMLESS_ALWAYS, NULL, "dropout is off at inference"},
    {"output_router_logits", HARMLESS_ALWAYS, NULL, "returns router logits for the auxiliary training loss"},
    {"router_aux_loss_coef", HARMLESS_ALWAYS, NULL, "weight of an auxiliary training loss"},
    {"router_jitter_noise", HARMLESS_ALWAYS, NULL, "noise on the router's input in training mode only"},
    /* How transformers runs or returns the model, not what it computes. */
    {"use_cache", HARMLESS_ALWAYS, NULL, "whether transformers keeps a KV cache; smelt always does"},
    {"cache_implementation", HARMLESS_ALWAYS, NULL,
     "the KV-cache class transformers' generate() uses (\"hybrid\": Gemma's sliding-window layers keep "
     "only their window); the logits are the same"},
    {"output_attentions", HARMLESS_ALWAYS, NULL, "returns attention weights besides the logits"},
    {"output_hidden_states", HARMLESS_ALWAYS, NULL, "returns hidden states besides the logits"},
    {"return_dict", HARMLESS_ALWAYS, NULL, "the Python type of transformers' outputs"},
    {"pretraining_tp", HARMLESS_ALWAYS, NULL,
     "Llama splits its matrix products into this many slices and adds them: the same product"},
    {"reorder_and_upcast_attn", HARMLESS_ALWAYS, NULL,
     "GPT-2 computes attention scores in f32 instead of f16; smelt's arithmetic is f32 always"},
    {"n_ctx", HARMLESS_ALWAYS, NULL, "GPT-2's old copy of n_positions, read by no model code"},
    /* Token ids: generation handling (EOS stops it), not the network. */
    {"bos_token_id", HARMLESS_ALWAYS, NULL, "the tokenizer's BOS id (--tokenizer bytes adds it)"},
    {"eos_token_id", HARMLESS_ALWAYS, NULL, "where generation stops; smelt reads it (docs/json.md)"},
    {"pad_token_id", HARMLESS_ALWAYS, NULL, "padding of batches; a sequence here is never padded"},
    /* Heads and pipelines other than the causal LM. */
    {"summary_type", HARMLESS_ALWAYS, NULL, "the sequence-summary head of GPT2DoubleHeadsModel"},
    {"summary_use_proj", HARMLESS_ALWAYS, NULL, "the sequence-summary head of GPT2DoubleHeadsModel"},
    {"summary_activation", HARMLESS_ALWAYS, NULL, "the sequence-summary head of GPT2DoubleHeadsModel"},
    {"summary_proj_to_labels", HARMLESS_ALWAYS, NULL, "the sequence-summary head of GPT2DoubleHeadsModel"},
    {"task_specific_params", HARMLESS_ALWAYS, NULL, "defaults of transformers' pipelines"},
    /* Values that mean what a spec computes when it does not bind the key. */
    {"rope_parameters.rope_type", HARMLESS_WHEN_STRING, "default",
     "plain rotary positions, what the rope op computes without scaling"},
    {"rope_interleaved", HARMLESS_WHEN_FALSE, NULL,
     "nanotron's rope layout (SmolLM2): false is rotate-half, what the rope op computes"},
    {"layer_types", HARMLESS_WHEN_STRING, "full_attention",
     "every layer attends to every position before it (a spec's sliding window binds its own keys)"},
};

static bool is_only_string(const json_t *value, const char *string) {
    if (json_is_string(value)) return strcmp(json_string_value(value), string) == 0;
    if (!json_is_array(value) || json_array_size(value) == 0) return false;
    size_t i;
    const json_t *item;
    json_array_foreach(value, i, item) {
        if (!json_is_string(item) || strcmp(json_string_value(item), string) != 0) return false;
    }
    return true;
}

const char *fe_config_key_harmless(const char *key, const json_t *value) {
    for (size_t i = 0; i < sizeof harmless_keys / sizeof harmless_keys[0]; i++) {
        const harmless_key *h = &harmless_keys[i];
        if (strcmp(h->key, key) != 0) continue;
        if (h->when == HARMLESS_ALWAYS || (h->when == HARMLESS_WHEN_FALSE && json_is_false(value)) ||
            (h->when == HARMLESS_WHEN_STRING && is_only_string(value, h->string)))
            return h->reason;
    }
    return NULL;
}

/* Equal JSON values, numbers by value (10000 and 1e4 are the same). */
static bool same_value(const json_t *a, const json_t *b) {
    if (json_is_number(a) && json_is_number(b)) return json_number_value(a) == json_number_value(b);
    return json_equal(a, b);
}

static bool name_in(const char *name, const char *const *names, uint32_t count) {
    for (uint32_t i = 0; i < count; i++)
        if (strcmp(names[i], name) == 0) return true;
    return false;
}

bool fe_check_config_keys(const fe_config_key *keys, uint32_t count, const fe_config_key_check *check,
                          diag_engine *d) {
    bool ok = true;
    bool nested_bound = name_in(fe_config_nested_object, check->params, check->param_count);
    const char *spec = check->spec_path ? check->spec_path : "the model";
    for (uint32_t i = 0; i < count; i++) {
        const fe_config_key *k = &keys[i];
        bool nested = strcmp(k->name, k->shown) != 0;
        if (!k->value || json_is_null(k->value)) continue;
        if (nested && nested_bound) continue; /* the spec binds the whole object */
        /* Read by the checkpoint import (qck_scheme_of_config, which the
         * elaborator runs): it refuses every member it does not understand. */
        if (!nested && strcmp(k->name, fe_config_quantization_object) == 0) continue;
        /* The nested object itself: its members are checked one by one. */
        if (!nested && strcmp(k->name, fe_config_nested_object) == 0 && json_is_object(k->value)) continue;
        if (name_in(k->name, check->params, check->param_count)) {
            /* A member the top-level key of the same name shadows must agree
             * with it: the param takes the top-level value. */
            for (uint32_t j = 0; nested && j < count; j++) {
                const fe_config_key *top = &keys[j];
                if (strcmp(top->name, top->shown) != 0 || strcmp(top->name, k->name) != 0) continue;
                if (!top->value || json_is_null(top->value) || same_value(top->value, k->value)) continue;
                diag_error(d, k->loc,
                           "config key '%.*s%s' differs from the top-level '%.*s%s', which param '%.*s%s' "
                           "of %s binds: the config contradicts itself",
                           DIAG_NAME(k->shown), DIAG_NAME(top->name), DIAG_NAME(k->name), spec);
                ok = false;
            }
            continue;
        }
        if (fe_config_key_harmless(k->shown, k->value)) continue;
        if (name_in(k->shown, check->allowed, check->allowed_count) ||
            name_in(k->name, check->allowed, check->allowed_count))
            continue;
        char value[64] = "";
        if (json_is_string(k->value))
            snprintf(value, sizeof value, "\"%.40s\"", json_string_value(k->value));
        else if (json_is_true(k->value) || json_is_false(k->value))
            snprintf(value, sizeof value, "%s", json_is_true(k->value) ? "true" : "false");
        else if (json_is_integer(k->value))
            snprintf(value, sizeof value, "%lld", (long long)json_integer_value(k->value));
        else if (json_is_real(k->value))
            snprintf(value, sizeof value, "%g", json_real_value(k->value));
        else
            snprintf(value, sizeof value, "%s", json_is_object(k->value) ? "an object" : "a list");
        diag_error(d, k->loc,
                   "config key '%.*s%s' (%s) is bound by no param of %s and is not known to be "
                   "harmless: ignoring it could compute another model",
                   DIAG_NAME(k->shown), value, spec);
        diag_note(
            d, SMELT_NO_LOC,
            "declare a param '%.*s%s' in the spec (with a require for the values it implements), or pass "
            "--allow-config-key %.*s%s if it does not change the computation",
            DIAG_NAME(k->name), DIAG_NAME(k->shown));
        ok = false;
    }
    return ok;
}
