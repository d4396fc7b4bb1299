/* gguf_model.c - a GGUF model file as a config and a checkpoint (the rules,
 * key by key and tensor by tensor: gguf_model.h).
 *
 * Both directions start from the same table of an architecture's keys, so
 * that what the config binds and what the checkpoint needs (the head counts
 * of the q/k permutation) cannot disagree.
 */
#include "gguf_model.h"

#include <jansson.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- architectures -------------------------------------------------------- */

typedef struct gguf_architecture {
    const char *name;       /* general.architecture */
    const char *model_type; /* the config's model_type */
    bool permuted_qk;       /* convert_hf_to_gguf.py permutes q/k rows (its LlamaModel) */
} gguf_architecture;

static const gguf_architecture architectures[] = {
    {"llama", "llama", true},
    {"qwen2", "qwen2", false}, /* examples/llama.smelt gives model_type qwen2 its q/k/v biases */
};

/* How a key under "<architecture>." is treated. */
typedef enum key_rule {
    KEY_INT,            /* bound to an int config key */
    KEY_FLOAT,          /* bound to a float config key */
    KEY_HEAD_DIM_CHECK, /* an int that must equal head_dim */
    KEY_ZERO,           /* an int accepted only at 0 */
} key_rule;

typedef struct key_binding {
    const char *suffix;     /* after "<architecture>." */
    const char *config_key; /* NULL: checked, not bound */
    key_rule rule;
    bool required;
} key_binding;

/* The same keys under each architecture's prefix. */
static const key_binding architecture_keys[] = {
    {"embedding_length", "hidden_size", KEY_INT, true},
    {"block_count", "num_hidden_layers", KEY_INT, true},
    {"feed_forward_length", "intermediate_size", KEY_INT, true},
    {"attention.head_count", "num_attention_heads", KEY_INT, true},
    {"attention.head_count_kv", "num_key_value_heads", KEY_INT, false},
    {"attention.key_length", "head_dim", KEY_INT, false},
    {"attention.value_length", NULL, KEY_HEAD_DIM_CHECK, false},
    {"attention.layer_norm_rms_epsilon", "rms_norm_eps", KEY_FLOAT, false},
    {"rope.freq_base", "rope_theta", KEY_FLOAT, false},
    {"context_length", "max_position_embeddings", KEY_INT, false},
    {"vocab_size", NULL, KEY_INT, false}, /* checked against token_embd.weight */
    {"rope.dimension_count", NULL, KEY_HEAD_DIM_CHECK, false},
    {"expert_count", NULL, KEY_ZERO, false},
    {"expert_used_count", NULL, KEY_ZERO, false},
};

static const char rope_scaling_prefix[] = "rope.scaling.";

static const gguf_architecture *find_architecture(const gguf_file *f, smelt_loc loc, diag_engine *d) {
    const gguf_kv *kv = gguf_file_find_kv(f, "general.architecture");
    if (!kv || kv->type != GGUF_VALUE_STRING) {
        if (kv)
            diag_error(d, loc, "at byte %llu: general.architecture must be a string, found %s",
                       (unsigned long long)kv->offset, gguf_value_type_name(kv->type));
        else
            diag_error(d, loc,
                       "the GGUF file has no general.architecture: smelt cannot tell what model it holds");
        return NULL;
    }
    for (size_t i = 0; i < sizeof architectures / sizeof architectures[0]; i++)
        if (strcmp(kv->string, architectures[i].name) == 0) return &architectures[i];
    diag_error(d, loc,
               "at byte %llu: GGUF architecture '%.*s%s' is not supported; smelt imports 'llama' and 'qwen2'",
               (unsigned long long)kv->offset, DIAG_NAME(kv->string));
    return NULL;
}

/* The key "<architecture>.<suffix>", or NULL. */
static const gguf_kv *architecture_kv(const gguf_file *f, const gguf_architecture *a, const char *suffix) {
    char key[160];
    snprintf(key, sizeof key, "%s.%s", a->name, suffix);
    return gguf_file_find_kv(f, key);
}

/* A split model (llama-gguf-split) holds its tensors in several files. */
static bool check_not_split(const gguf_file *f, smelt_loc loc, diag_engine *d) {
    const gguf_kv *kv = gguf_file_find_kv(f, "split.count");
    int64_t parts;
    if (!kv || (gguf_kv_int(kv, &parts) && parts <= 1)) return true;
    char text[96];
    diag_error(
        d, loc,
        "at byte %llu: split.count is %s: the model is split over several GGUF files, which smelt does not "
        "read; merge them first (llama-gguf-split --merge)",
        (unsigned long long)kv->offset, gguf_kv_text(kv, text, sizeof text));
    return false;
}

/* ---- the config --------------------------------------------------------------- */

typedef struct config_builder {
    const gguf_file *f;
    const gguf_architecture *arch;
    smelt_loc loc;
    diag_engine *d;
    json_t *root;
    bool ok;
    bool out_of_memory;
    int64_t head_dim; /* from key_length, or hidden_size / heads; 0 while unknown */
} config_builder;

static void set_value(config_builder *b, const char *key, json_t *value) {
    if (!value || json_object_set_new(b->root, key, value) != 0) b->out_of_memory = true;
}

/* "at byte N: GGUF key 'K' (TYPE VALUE) <problem><detail>" */
static void key_error(config_builder *b, const gguf_kv *kv, const char *problem, const char *detail) {
    char text[96];
    diag_error(b->d, b->loc, "at byte %llu: GGUF key '%.*s%s' (%s %s) %s%s", (unsigned long long)kv->offset,
               DIAG_NAME(kv->key), gguf_value_type_name(kv->type), gguf_kv_text(kv, text, sizeof text),
               problem, detail ? detail : "");
    b->ok = false;
}

/* A key's value as an integer; reports any other type. */
static bool kv_int(config_builder *b, const gguf_kv *kv, int64_t *out) {
    if (gguf_kv_int(kv, out) && kv->type != GGUF_VALUE_BOOL) return true;
    key_error(b, kv, "must be an integer", NULL);
    return false;
}

static void bind_key(config_builder *b, const key_binding *k, const gguf_kv *kv) {
    int64_t i = 0;
    double x = 0;
    switch (k->rule) {
    case KEY_INT:
        if (!kv_int(b, kv, &i)) return;
        if (i < 0) {
            key_error(b, kv, "must not be negative", NULL);
            return;
        }
        if (k->config_key) set_value(b, k->config_key, json_integer(i));
        if (k->config_key && strcmp(k->config_key, "head_dim") == 0) b->head_dim = i;
        return;
    case KEY_FLOAT:
        if (!gguf_kv_float(kv, &x) || kv->type == GGUF_VALUE_BOOL) {
            key_error(b, kv, "must be a number", NULL);
            return;
        }
        set_value(b, k->config_key, json_real(x));
        return;
    case KEY_ZERO:
        if (kv_int(b, kv, &i) && i != 0)
            key_error(b, kv, "is not supported: ",
                      "smelt imports dense models only (a mixture of experts has its own spec)");
        return;
    case KEY_HEAD_DIM_CHECK: return; /* after head_dim is known */
    }
}

/* head_dim: <arch>.attention.key_length, else hidden_size / heads (what
 * llama.cpp and examples/llama.smelt assume). */
static void derive_head_dim(config_builder *b) {
    if (b->head_dim) return;
    json_t *hidden = json_object_get(b->root, "hidden_size"),
           *heads = json_object_get(b->root, "num_attention_heads");
    if (json_is_integer(hidden) && json_is_integer(heads) && json_integer_value(heads) > 0)
        b->head_dim = json_integer_value(hidden) / json_integer_value(heads);
}

static void check_head_dim_keys(config_builder *b) {
    for (size_t i = 0; i < sizeof architecture_keys / sizeof architecture_keys[0]; i++) {
        const key_binding *k = &architecture_keys[i];
        const gguf_kv *kv = architecture_kv(b->f, b->arch, k->suffix);
        if (k->rule != KEY_HEAD_DIM_CHECK || !kv) continue;
        int64_t v;
        if (!kv_int(b, kv, &v)) continue;
        if (v != b->head_dim) {
            char detail[160];
            snprintf(detail, sizeof detail,
                     "the head dim %lld: examples/llama.smelt rotates and attends over whole heads",
                     (long long)b->head_dim);
            key_error(b, kv, "differs from ", detail);
        }
    }
}

/* rope.scaling.*: accepted only when rope.scaling.type is "none". */
static void check_rope_scaling(config_builder *b) {
    const gguf_kv *type = architecture_kv(b->f, b->arch, "rope.scaling.type");
    bool none = type && type->type == GGUF_VALUE_STRING && strcmp(type->string, "none") == 0;
    size_t prefix = strlen(b->arch->name) + 1;
    for (uint32_t i = 0; i < b->f->kv_count; i++) {
        const gguf_kv *kv = &b->f->kvs[i];
        if (strncmp(kv->key, b->arch->name, prefix - 1) != 0 || kv->key[prefix - 1] != '.') continue;
        if (strncmp(kv->key + prefix, rope_scaling_prefix, sizeof rope_scaling_prefix - 1) != 0) continue;
        if (none) continue;
        if (kv == type)
            key_error(b, kv, "is not supported: ", "smelt imports models without rope scaling");
        else if (!type)
            key_error(b, kv, "is not supported: ",
                      "rope scaling changes the positions' frequencies, and smelt imports models without it");
    }
}

/* Every key under "<architecture>." must be one of the table's or a
 * rope.scaling key (checked above). */
static void refuse_unknown_keys(config_builder *b) {
    size_t prefix = strlen(b->arch->name) + 1;
    for (uint32_t i = 0; i < b->f->kv_count; i++) {
        const gguf_kv *kv = &b->f->kvs[i];
        if (strncmp(kv->key, b->arch->name, prefix - 1) != 0 || kv->key[prefix - 1] != '.') continue;
        const char *suffix = kv->key + prefix;
        if (strncmp(suffix, rope_scaling_prefix, sizeof rope_scaling_prefix - 1) == 0) continue;
        bool known = false;
        for (size_t k = 0; k < sizeof architecture_keys / sizeof architecture_keys[0] && !known; k++)
            known = strcmp(suffix, architecture_keys[k].suffix) == 0;
        if (!known)
            key_error(b, kv, "is not one smelt understands for this architecture; ",
                      "it may change the computation, so the file is refused");
    }
}

/* vocab_size from token_embd.weight; tie_word_embeddings from output.weight. */
static void bind_tensor_facts(config_builder *b) {
    const gguf_tensor *embed = gguf_file_find(b->f, "token_embd.weight");
    if (!embed || embed->rank != 2) {
        diag_error(b->d, b->loc, "the GGUF file has no 2-dim token_embd.weight, the token embedding");
        b->ok = false;
        return;
    }
    uint64_t vocab = embed->ne[1];
    set_value(b, "vocab_size", json_integer((json_int_t)vocab));
    const gguf_kv *declared = architecture_kv(b->f, b->arch, "vocab_size");
    int64_t v;
    if (declared && kv_int(b, declared, &v) && (uint64_t)v != vocab) {
        char detail[96];
        snprintf(detail, sizeof detail, "the %llu rows of token_embd.weight", (unsigned long long)vocab);
        key_error(b, declared, "differs from ", detail);
    }
    set_value(b, "tie_word_embeddings", json_boolean(gguf_file_find(b->f, "output.weight") == NULL));
    if (gguf_file_find(b->f, "rope_freqs.weight")) {
        diag_error(b->d, b->loc,
                   "at byte %llu: tensor 'rope_freqs.weight' scales the rotary frequencies (Llama 3.1 rope "
                   "scaling), which smelt does not import",
                   (unsigned long long)gguf_file_find(b->f, "rope_freqs.weight")->info_offset);
        b->ok = false;
    }
}

static void bind_token_ids(config_builder *b) {
    static const char *const keys[][2] = {
        {"tokenizer.ggml.bos_token_id", "bos_token_id"},
        {"tokenizer.ggml.eos_token_id", "eos_token_id"},
    };
    for (size_t i = 0; i < 2; i++) {
        const gguf_kv *kv = gguf_file_find_kv(b->f, keys[i][0]);
        int64_t id;
        if (kv && kv_int(b, kv, &id)) set_value(b, keys[i][1], json_integer(id));
    }
}

static bool build_config(config_builder *b) {
    if (!check_not_split(b->f, b->loc, b->d)) return false;
    set_value(b, "model_type", json_string(b->arch->model_type));
    for (size_t i = 0; i < sizeof architecture_keys / sizeof architecture_keys[0]; i++) {
        const key_binding *k = &architecture_keys[i];
        const gguf_kv *kv = architecture_kv(b->f, b->arch, k->suffix);
        if (kv) {
            bind_key(b, k, kv);
        } else if (k->required) {
            diag_error(b->d, b->loc, "the GGUF file has no %s.%s, which smelt needs (%s)", b->arch->name,
                       k->suffix, k->config_key);
            b->ok = false;
        }
    }
    derive_head_dim(b);
    check_head_dim_keys(b);
    check_rope_scaling(b);
    refuse_unknown_keys(b);
    bind_tensor_facts(b);
    bind_token_ids(b);
    if (b->out_of_memory) {
        diag_error(b->d, b->loc, "out of memory building the config of the GGUF file");
        b->ok = false;
    }
    return b->ok;
}

/* The config of an opened file into *root (NULL: checked, then dropped). */
static bool file_config(const gguf_file *f, json_t **root, diag_engine *d) {
    smelt_loc loc = {f->diag_file, 0, 0};
    config_builder b = {.f = f, .loc = loc, .d = d, .ok = true};
    b.arch = find_architecture(f, loc, d);
    b.root = b.arch ? json_object() : NULL;
    if (b.arch && !b.root) diag_error(d, loc, "out of memory building the config of the GGUF file");
    bool ok = b.root && build_config(&b);
    if (ok && root)
        *root = b.root;
    else if (b.root)
        json_decref(b.root);
    return ok;
}

bool fe_gguf_config(const char *path, json_t **root, diag_engine *d) {
    *root = NULL;
    gguf_file f;
    if (!gguf_file_open(path, &f, d)) return false;
    bool ok = file_config(&f, root, d);
    gguf_file_close(&f);
    return ok;
}

/* ---- the checkpoint --------------------------------------------------------- */

typedef struct tensor_rule {
    const char *gguf; /* after "blk.N." for a layer's tensor */
    const char *hf;   /* after "model.layers.N." */
    char permuted;    /* 'q' or 'k': rows permuted over that many heads; 0: none */
} tensor_rule;

static const tensor_rule model_tensors[] = {
    {"token_embd.weight", "model.embed_tokens.weight", 0},
    {"output_norm.weight", "model.norm.weight", 0},
    {"output.weight", "lm_head.weight", 0},
};

static const tensor_rule layer_tensors[] = {
    {"attn_norm.weight", "input_layernorm.weight", 0},
    {"attn_q.weight", "self_attn.q_proj.weight", 'q'},
    {"attn_q.bias", "self_attn.q_proj.bias", 'q'},
    {"attn_k.weight", "self_attn.k_proj.weight", 'k'},
    {"attn_k.bias", "self_attn.k_proj.bias", 'k'},
    {"attn_v.weight", "self_attn.v_proj.weight", 0},
    {"attn_v.bias", "self_attn.v_proj.bias", 0},
    {"attn_output.weight", "self_attn.o_proj.weight", 0},
    {"attn_output.bias", "self_attn.o_proj.bias", 0},
    {"ffn_norm.weight", "post_attention_layernorm.weight", 0},
    {"ffn_gate.weight", "mlp.gate_proj.weight", 0},
    {"ffn_gate.bias", "mlp.gate_proj.bias", 0},
    {"ffn_up.weight", "mlp.up_proj.weight", 0},
    {"ffn_up.bias", "mlp.up_proj.bias", 0},
    {"ffn_down.weight", "mlp.down_proj.weight", 0},
    {"ffn_down.bias", "mlp.down_proj.bias", 0},
};

/* The Hugging Face name of GGUF tensor `name` into *hf (arena a) and its
 * permutation; false when no rule names it. */
static bool hf_name(arena *a, const char *name, const char **hf, char *permuted) {
    for (size_t i = 0; i < sizeof model_tensors / sizeof model_tensors[0]; i++)
        if (strcmp(name, model_tensors[i].gguf) == 0) {
            *hf = model_tensors[i].hf;
            *permuted = model_tensors[i].permuted;
            return true;
        }
    if (strncmp(name, "blk.", 4) != 0) return false;
    const char *p = name + 4;
    unsigned long long layer = 0;
    size_t digits = 0;
    while (p[digits] >= '0' && p[digits] <= '9' && digits < 9)
        layer = layer * 10 + (unsigned)(p[digits++] - '0');
    if (digits == 0 || p[digits] != '.' || (digits > 1 && p[0] == '0')) return false;
    const char *rest = p + digits + 1;
    for (size_t i = 0; i < sizeof layer_tensors / sizeof layer_tensors[0]; i++)
        if (strcmp(rest, layer_tensors[i].gguf) == 0) {
            *hf = arena_printf(a, "model.layers.%llu.%s", layer, layer_tensors[i].hf);
            *permuted = layer_tensors[i].permuted;
            return true;
        }
    return false;
}

/* A head count of the permutation: a positive integer key. */
static bool head_count(const gguf_file *f, const gguf_architecture *a, const char *suffix, uint64_t fallback,
                       uint64_t *out, smelt_loc loc, diag_engine *d) {
    const gguf_kv *kv = architecture_kv(f, a, suffix);
    int64_t v;
    if (!kv) {
        *out = fallback;
        return fallback > 0;
    }
    if (!gguf_kv_int(kv, &v) || v <= 0) {
        char text[96];
        diag_error(d, loc, "at byte %llu: %s.%s must be a positive integer, found %s %s",
                   (unsigned long long)kv->offset, a->name, suffix, gguf_value_type_name(kv->type),
                   gguf_kv_text(kv, text, sizeof text));
        return false;
    }
    *out = (uint64_t)v;
    return true;
}

/* Rows of t as the permutation sees them: dim 0 of its Hugging Face shape. */
static uint64_t tensor_rows(const gguf_tensor *t) {
    return t->rank == 1 ? t->ne[0] : t->element_count / t->ne[0];
}

static bool add_tensor(st_checkpoint *ck, const gguf_file *f, const gguf_tensor *t, const char *name,
                       uint32_t heads, smelt_loc loc, diag_engine *d) {
    if (st_checkpoint_index(ck, name) != UINT32_MAX) {
        diag_error(d, loc,
                   "at byte %llu: tensor '%.*s%s' names the same weight as another tensor of the file",
                   (unsigned long long)t->info_offset, DIAG_NAME(t->name));
        return false;
    }
    if (heads) {
        uint64_t rows = tensor_rows(t);
        if (rows % (2 * (uint64_t)heads) != 0) {
            diag_error(
                d, loc,
                "at byte %llu: tensor '%.*s%s' has %llu rows, which do not split into %u heads of an even "
                "number of rows",
                (unsigned long long)t->info_offset, DIAG_NAME(t->name), (unsigned long long)rows, heads);
            return false;
        }
    }
    fe_gguf_view *view = arena_alloc(&ck->arena, sizeof *view);
    *view = (fe_gguf_view){.file = f, .tensor = t, .permute_heads = heads};
    st_tensor *s = arena_alloc(&ck->arena, sizeof *s);
    s->name = name;
    s->dtype = t->type == GGUF_TYPE_F16    ? ST_DTYPE_F16
               : t->type == GGUF_TYPE_BF16 ? ST_DTYPE_BF16
                                           : ST_DTYPE_F32;
    s->rank = t->rank;
    for (uint32_t i = 0; i < t->rank; i++)
        s->shape[i] = t->ne[t->rank - 1 - i];
    s->byte_size =
        t->element_count * st_dtype_size(s->dtype); /* < 2^63 * 4 / 4: fits, elements < 2^61 below */
    s->offset = t->offset;
    s->file_offset = t->file_offset;
    s->fd = f->fd;
    s->diag_file = f->diag_file;
    s->gguf = view;
    uint32_t i = ck->tensor_count++;
    ck->tensors[i] = s;
    uint32_t slot = (uint32_t)st_name_hash(name) & (ck->slot_count - 1);
    while (ck->slots[slot])
        slot = (slot + 1) & (ck->slot_count - 1);
    ck->slots[slot] = i + 1;
    return true;
}

bool fe_gguf_checkpoint_open(st_checkpoint *ck, const char *path, diag_engine *d) {
    gguf_file *f = arena_alloc(&ck->arena, sizeof *f);
    if (!gguf_file_open(path, f, d)) return false;
    ck->gguf = f;
    smelt_loc loc = {f->diag_file, 0, 0};
    /* The metadata is checked even when the params come from elsewhere (a
     * plan, a config.json): weights of a model with rope scaling, say, are
     * refused, not bound to a model without it. */
    if (!file_config(f, NULL, d)) return false;
    const gguf_architecture *arch = find_architecture(f, loc, d);
    if (!arch) return false;
    uint64_t q_heads = 0, k_heads = 0;
    if (arch->permuted_qk && (!head_count(f, arch, "attention.head_count", 0, &q_heads, loc, d) ||
                              !head_count(f, arch, "attention.head_count_kv", q_heads, &k_heads, loc, d))) {
        if (!q_heads) diag_error(d, loc, "the GGUF file has no %s.attention.head_count", arch->name);
        return false;
    }
    if (q_heads > UINT32_MAX || k_heads > UINT32_MAX) {
        diag_error(d, loc, "the GGUF file's head counts (%llu, %llu) are out of range",
                   (unsigned long long)q_heads, (unsigned long long)k_heads);
        return false;
    }
    uint32_t slots = 8;
    while (slots < 2 * f->tensor_count)
        slots *= 2;
    ck->slots = arena_array(&ck->arena, slots, sizeof *ck->slots);
    ck->slot_count = slots;
    ck->tensors = arena_array(&ck->arena, f->tensor_count ? f->tensor_count : 1, sizeof *ck->tensors);
    ck->tensor_shard =
        arena_array(&ck->arena, f->tensor_count ? f->tensor_count : 1, sizeof *ck->tensor_shard);
    bool ok = true;
    for (uint32_t i = 0; i < f->tensor_count && !diag_should_stop(d); i++) {
        const gguf_tensor *t = &f->tensors[i];
        if (t->element_count > ((uint64_t)1 << 61)) {
            diag_error(d, loc, "at byte %llu: tensor '%.*s%s' has too many elements",
                       (unsigned long long)t->info_offset, DIAG_NAME(t->name));
            ok = false;
            continue;
        }
        const char *name = t->name;
        char permuted = 0;
        if (!hf_name(&ck->arena, t->name, &name, &permuted)) name = t->name;
        uint32_t heads = permuted == 'q' && arch->permuted_qk   ? (uint32_t)q_heads
                         : permuted == 'k' && arch->permuted_qk ? (uint32_t)k_heads
                                                                : 0;
        ok &= add_tensor(ck, f, t, name, heads, loc, d);
    }
    return ok && !diag_should_stop(d);
}

void fe_gguf_checkpoint_close(st_checkpoint *ck) {
    gguf_file_close(ck->gguf);
    ck->gguf = NULL;
}

bool fe_gguf_view_read_f32(const fe_gguf_view *v, float *dst, diag_engine *d) {
    const gguf_tensor *t = v->tensor;
    if (!v->permute_heads) return gguf_tensor_read_f32(v->file, t, dst, 0, t->element_count, d);
    float *stored = malloc((size_t)t->element_count * sizeof *stored + 1);
    if (!stored) {
        smelt_loc loc = {v->file->diag_file, 0, 0};
        diag_error(d, loc, "out of memory reading tensor '%.*s%s'", DIAG_NAME(t->name));
        return false;
    }
    bool ok = gguf_tensor_read_f32(v->file, t, stored, 0, t->element_count, d);
    if (ok) {
        /* stored row h*D + 2j + i is Hugging Face row h*D + i*(D/2) + j */
        uint64_t rows = tensor_rows(t), row_length = t->element_count / (rows ? rows : 1);
        uint64_t head_rows = rows / v->permute_heads, half = head_rows / 2;
        for (uint64_t g = 0; g < rows; g++) {
            uint64_t head = g / head_rows, r = g % head_rows;
            uint64_t hf = head * head_rows + (r % 2) * half + r / 2;
            memcpy(dst + hf * row_length, stored + g * row_length, (size_t)row_length * sizeof *dst);
        }
    }
    free(stored);
    return ok;
}
