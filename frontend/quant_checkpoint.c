/* quant_checkpoint.c - config.json's quantization_config as a qck_scheme
 * (every key read, known harmless, or refused by name), and each
 * pre-quantized weight's tensors unpacked into quant.h's layout, exactly
 * (the formats: quant_checkpoint.h). */
#include "quant_checkpoint.h"

#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "numeric.h"

static const char *const method_names[] = {"none", "awq", "gptq", "fp8"};

const char *qck_method_name(qck_method m) {
    return (unsigned)m < sizeof method_names / sizeof *method_names ? method_names[m] : "?";
}

/* ---- quantization_config ------------------------------------------------ */

/* A key a tool writes. `why` NULL: the importer reads it; else why its
 * value does not change the loaded weights. */
typedef struct qck_key {
    const char *name;
    const char *why;
} qck_key;

#define PROVENANCE "how the checkpoint was quantized; the tensors hold the result"
#define KERNEL "which kernels transformers runs; the weights are the same"
#define MODULES "which layers are quantized; each weight's own tensors say"

static const qck_key awq_keys[] = {
    {"quant_method", NULL},
    {"bits", NULL},
    {"group_size", NULL},
    {"zero_point", NULL},
    {"version", NULL},
    {"modules_to_not_convert", MODULES},
    {"backend", KERNEL},
    {"do_fuse", KERNEL},
    {"fuse_max_seq_len", KERNEL},
    {"modules_to_fuse", KERNEL},
    {"exllama_config", KERNEL},
    {NULL, NULL},
};

static const qck_key gptq_keys[] = {
    {"quant_method", NULL},
    {"bits", NULL},
    {"group_size", NULL},
    {"sym", NULL},
    {"desc_act", NULL},
    {"checkpoint_format", NULL},
    {"format", NULL},
    {"pack_dtype", NULL},
    {"dynamic", NULL},
    {"is_marlin_format", NULL},
    {"static_groups", PROVENANCE},
    {"damp_percent", PROVENANCE},
    {"damp_auto_increment", PROVENANCE},
    {"true_sequential", PROVENANCE},
    {"mse", PROVENANCE},
    {"dataset", PROVENANCE},
    {"tokenizer", PROVENANCE},
    {"model_seqlen", PROVENANCE},
    {"batch_size", PROVENANCE},
    {"pad_token_id", PROVENANCE},
    {"cache_block_outputs", PROVENANCE},
    {"max_input_length", PROVENANCE},
    {"model_name_or_path", PROVENANCE},
    {"model_file_base_name", PROVENANCE},
    {"meta", PROVENANCE},
    {"lm_head", MODULES},
    {"block_name_to_quantize", MODULES},
    {"module_name_preceding_first_block", MODULES},
    {"modules_in_block_to_quantize", MODULES},
    {"modules_to_not_convert", MODULES},
    {"use_cuda_fp16", KERNEL},
    {"use_exllama", KERNEL},
    {"exllama_config", KERNEL},
    {"backend", KERNEL},
    {NULL, NULL},
};

static const qck_key fp8_keys[] = {
    {"quant_method", NULL},      {"activation_scheme", NULL},         {"weight_block_size", NULL},
    {"ignored_layers", MODULES}, {"modules_to_not_convert", MODULES}, {NULL, NULL},
};

static const qck_key compressed_keys[] = {
    {"quant_method", NULL},
    {"format", NULL},
    {"config_groups", NULL},
    {"kv_cache_scheme", NULL},
    {"sparsity_config", NULL},
    {"transform_config", NULL},
    {"ignore", MODULES},
    {"quantization_status", PROVENANCE},
    {"global_compression_ratio", PROVENANCE},
    {"version", PROVENANCE},
    {"provider", PROVENANCE},
    {NULL, NULL},
};

/* compressed-tensors: one config group, and its weights / activations. */
static const qck_key group_keys[] = {
    {"targets", NULL}, {"weights", NULL}, {"input_activations", NULL}, {"output_activations", NULL},
    {"format", NULL},  {NULL, NULL},
};

static const qck_key args_keys[] = {
    {"num_bits", NULL},
    {"type", NULL},
    {"symmetric", NULL},
    {"strategy", NULL},
    {"dynamic", NULL},
    {"group_size", NULL},
    {"block_structure", NULL},
    {"actorder", NULL},
    {"observer", PROVENANCE},
    {"observer_kwargs", PROVENANCE},
    {"scale_dtype", NULL},
    {"zp_dtype", NULL},
    {NULL, NULL},
};

typedef struct qck_reader {
    const fe_config *c;
    const json_t *qc; /* quantization_config */
    diag_engine *d;
    bool ok;
} qck_reader;

/* At quantization_config's member `member`; at the object itself when
 * `member` is NULL or missing. */
static smelt_loc at(const qck_reader *r, const char *member) {
    if (member && !json_object_get(r->qc, member)) member = NULL;
    return fe_config_loc(r->c, fe_config_quantization_object, member);
}

#define QCK_ERROR(r, member, ...) (diag_error((r)->d, at((r), (member)), __VA_ARGS__), (r)->ok = false)

/* Refuses every member of `object` (shown as `path`) that `keys` lacks;
 * messages at top-level member `top` (or at the member itself when NULL). */
static void check_keys(qck_reader *r, const json_t *object, const char *path, const char *top,
                       const qck_key *keys) {
    const char *name;
    const json_t *value;
    json_object_foreach((json_t *)object, name, value) {
        bool known = false;
        for (const qck_key *k = keys; k->name && !known; k++)
            known = strcmp(k->name, name) == 0;
        if (!known)
            QCK_ERROR(r, top ? top : name,
                      "%s key '%.*s%s' is not understood by smelt's checkpoint import: ignoring it could "
                      "load other weights",
                      path, DIAG_NAME(name));
    }
}

static bool is_absent(const json_t *v) { return !v || json_is_null(v); }

/* A member that must be an integer: false (reported) otherwise. */
static bool get_int(qck_reader *r, const json_t *o, const char *name, const char *path, const char *top,
                    int64_t *out) {
    const json_t *v = json_object_get(o, name);
    if (json_is_integer(v)) return *out = (int64_t)json_integer_value(v), true;
    if (json_is_real(v) && json_real_value(v) == floor(json_real_value(v)) && fabs(json_real_value(v)) < 1e15)
        return *out = (int64_t)json_real_value(v), true;
    QCK_ERROR(r, top ? top : name, "%s.%s must be an integer", path, name);
    return false;
}

/* An optional bool member: `fallback` when absent or null. */
static bool get_bool(qck_reader *r, const json_t *o, const char *name, const char *path, const char *top,
                     bool fallback) {
    const json_t *v = json_object_get(o, name);
    if (is_absent(v)) return fallback;
    if (json_is_boolean(v)) return json_is_true(v);
    QCK_ERROR(r, top ? top : name, "%s.%s must be true or false", path, name);
    return fallback;
}

/* An optional string member: `fallback` when absent or null. */
static const char *get_string(qck_reader *r, const json_t *o, const char *name, const char *path,
                              const char *top, const char *fallback) {
    const json_t *v = json_object_get(o, name);
    if (is_absent(v)) return fallback;
    if (json_is_string(v)) return json_string_value(v);
    QCK_ERROR(r, top ? top : name, "%s.%s must be a string", path, name);
    return fallback;
}

static bool string_is(const char *s, const char *want) { return s && strcasecmp(s, want) == 0; }

/* bits must be 4 (or 8 when `eight`: GPTQ); group_size a positive
 * divisor-to-be or -1 (per channel). */
static void read_int4_group(qck_reader *r, const json_t *qc, const char *path, bool eight, qck_scheme *s) {
    int64_t bits = 0, group = 0;
    if (get_int(r, qc, "bits", path, NULL, &bits) && bits != 4 && !(eight && bits == 8))
        QCK_ERROR(r, "bits", "%s.bits is %lld; smelt imports %s %s checkpoints only", path, (long long)bits,
                  eight ? "4- and 8-bit" : "4-bit", qck_method_name(s->method));
    if (get_int(r, qc, "group_size", path, NULL, &group) && group != -1 && (group <= 0 || group > UINT32_MAX))
        QCK_ERROR(r, "group_size",
                  "%s.group_size is %lld; expected a positive group size or -1 (per channel)", path,
                  (long long)group);
    s->format =
        (quant_format){.kind = bits == 8 ? QUANT_INT8 : QUANT_INT4, .method = QUANT_METHOD_CHECKPOINT};
    s->format.group = group > 0 && group <= UINT32_MAX ? (uint32_t)group : 0;
}

static void read_awq(qck_reader *r, const json_t *qc, qck_scheme *s) {
    const char *path = "quantization_config";
    check_keys(r, qc, path, NULL, awq_keys);
    read_int4_group(r, qc, path, false, s);
    if (!get_bool(r, qc, "zero_point", path, NULL, true))
        QCK_ERROR(r, "zero_point", "%s.zero_point is false: AWQ's GEMM layout has zero points", path);
    const char *version = get_string(r, qc, "version", path, NULL, "gemm");
    if (version && !string_is(version, "gemm"))
        QCK_ERROR(r, "version",
                  "%s.version is \"%.*s%s\"; smelt imports AWQ's GEMM layout (\"gemm\") only "
                  "(GEMV, GEMV_fast, Marlin and IPEX pack differently)",
                  path, DIAG_NAME(version));
    s->format.has_zero = true;
}

static void read_gptq(qck_reader *r, const json_t *qc, qck_scheme *s) {
    const char *path = "quantization_config";
    check_keys(r, qc, path, NULL, gptq_keys);
    read_int4_group(r, qc, path, true, s);
    bool sym = get_bool(r, qc, "sym", path, NULL, true);
    s->format.has_zero = !sym && s->format.kind == QUANT_INT4;
    if (!sym && s->format.kind == QUANT_INT8)
        QCK_ERROR(r, "sym",
                  "%s.sym is false: 8-bit GPTQ with zero points has no int8 layout (symmetric only)", path);
    s->format.has_group_index = get_bool(r, qc, "desc_act", path, NULL, false);
    const char *format = get_string(r, qc, "checkpoint_format", path, NULL, NULL);
    const char *member = "checkpoint_format";
    const char *alias = get_string(r, qc, "format", path, NULL, NULL);
    if (format && alias && strcmp(format, alias) != 0)
        QCK_ERROR(r, "format", "%s.format \"%.*s%s\" contradicts checkpoint_format", path, DIAG_NAME(alias));
    if (!format) format = alias, member = "format";
    if (!format) format = "gptq";
    if (strcmp(format, "gptq") == 0)
        s->zeros_minus_one = true;
    else if (strcmp(format, "gptq_v2") != 0)
        QCK_ERROR(r, member, "%s.%s is \"%.*s%s\"; smelt imports \"gptq\" (v1) and \"gptq_v2\" packings only",
                  path, member, DIAG_NAME(format));
    const char *pack = get_string(r, qc, "pack_dtype", path, NULL, "int32");
    if (pack && strcmp(pack, "int32") != 0)
        QCK_ERROR(r, "pack_dtype", "%s.pack_dtype is \"%.*s%s\"; GPTQ's layout packs int32 words", path,
                  DIAG_NAME(pack));
    if (get_bool(r, qc, "is_marlin_format", path, NULL, false))
        QCK_ERROR(r, "is_marlin_format",
                  "%s.is_marlin_format is true: Marlin's repacked layout is not imported", path);
    const json_t *dynamic = json_object_get(qc, "dynamic");
    if (!is_absent(dynamic) && !(json_is_object(dynamic) && json_object_size(dynamic) == 0))
        QCK_ERROR(
            r, "dynamic",
            "%s.dynamic overrides bits or group size per module; smelt imports one format per checkpoint",
            path);
}

static void read_fp8_config(qck_reader *r, const json_t *qc, qck_scheme *s) {
    const char *path = "quantization_config";
    check_keys(r, qc, path, NULL, fp8_keys);
    const char *scheme = get_string(r, qc, "activation_scheme", path, NULL, "dynamic");
    if (string_is(scheme, "static"))
        s->fp8_static_input = true;
    else if (scheme && !string_is(scheme, "dynamic"))
        QCK_ERROR(r, "activation_scheme",
                  "%s.activation_scheme is \"%.*s%s\"; expected \"static\" or \"dynamic\"", path,
                  DIAG_NAME(scheme));
    if (!is_absent(json_object_get(qc, "weight_block_size")))
        QCK_ERROR(
            r, "weight_block_size",
            "%s.weight_block_size: block-wise FP8 scales (weight_scale_inv) are not imported; smelt reads "
            "per-tensor and per-channel scales",
            path);
}

/* compressed-tensors' QuantizationArgs of weights (`weights` true) or input
 * activations: refused unless FP8 as smelt imports it. */
static void read_args(qck_reader *r, const json_t *a, const char *path, bool weights, qck_scheme *s) {
    const char *top = "config_groups";
    if (!json_is_object(a)) {
        QCK_ERROR(r, top, "%s must be an object", path);
        return;
    }
    check_keys(r, a, path, top, args_keys);
    int64_t bits = 0;
    if (get_int(r, a, "num_bits", path, top, &bits) && bits != 8)
        QCK_ERROR(r, top, "%s.num_bits is %lld; smelt imports FP8 (8-bit float) compressed-tensors only",
                  path, (long long)bits);
    const char *type = get_string(r, a, "type", path, top, "int");
    if (!string_is(type, "float"))
        QCK_ERROR(r, top, "%s.type is \"%.*s%s\"; smelt imports \"float\" (FP8) compressed-tensors only",
                  path, DIAG_NAME(type ? type : "?"));
    if (!get_bool(r, a, "symmetric", path, top, true))
        QCK_ERROR(r, top, "%s.symmetric is false: FP8 scales have no zero point", path);
    static const char *const must_be_null[] = {"group_size", "block_structure", "scale_dtype", "zp_dtype"};
    for (size_t i = 0; i < sizeof must_be_null / sizeof *must_be_null; i++)
        if (!is_absent(json_object_get(a, must_be_null[i])))
            QCK_ERROR(r, top, "%s.%s is set; smelt imports per-tensor and per-channel FP8 scales only", path,
                      must_be_null[i]);
    const json_t *actorder = json_object_get(a, "actorder");
    if (!is_absent(actorder) && !json_is_false(actorder))
        QCK_ERROR(r, top, "%s.actorder is set; FP8 has no activation order", path);
    const char *strategy = get_string(r, a, "strategy", path, top, "tensor");
    bool dynamic = get_bool(r, a, "dynamic", path, top, false);
    if (weights) {
        if (dynamic)
            QCK_ERROR(r, top, "%s.dynamic is true; a checkpoint's weights are quantized statically", path);
        if (string_is(strategy, "channel"))
            s->fp8_per_channel = true;
        else if (!string_is(strategy, "tensor"))
            QCK_ERROR(r, top,
                      "%s.strategy is \"%.*s%s\"; smelt imports \"tensor\" and \"channel\" weight scales",
                      path, DIAG_NAME(strategy ? strategy : "?"));
    } else if (string_is(strategy, "tensor") && !dynamic) {
        s->fp8_static_input = true;
    } else if (!(string_is(strategy, "token") && dynamic) && !(string_is(strategy, "tensor") && dynamic)) {
        QCK_ERROR(r, top,
                  "%s: strategy \"%.*s%s\" with dynamic %s; smelt imports static per-tensor or dynamic input "
                  "activation scales",
                  path, DIAG_NAME(strategy ? strategy : "?"), dynamic ? "true" : "false");
    }
}

static void read_compressed(qck_reader *r, const json_t *qc, qck_scheme *s) {
    const char *path = "quantization_config";
    check_keys(r, qc, path, NULL, compressed_keys);
    const char *format = get_string(r, qc, "format", path, NULL, NULL);
    if (!string_is(format, "float-quantized") && !string_is(format, "naive-quantized"))
        QCK_ERROR(
            r, "format",
            "%s.format is \"%.*s%s\"; smelt imports compressed-tensors' \"float-quantized\" FP8 weights only",
            path, DIAG_NAME(format ? format : "?"));
    static const char *const must_be_null[] = {"kv_cache_scheme", "transform_config"};
    for (size_t i = 0; i < 2; i++)
        if (!is_absent(json_object_get(qc, must_be_null[i])))
            QCK_ERROR(r, must_be_null[i], "%s.%s is set; smelt does not import it", path, must_be_null[i]);
    const json_t *sparsity = json_object_get(qc, "sparsity_config");
    if (!is_absent(sparsity) && !(json_is_object(sparsity) && json_object_size(sparsity) == 0))
        QCK_ERROR(r, "sparsity_config",
                  "%s.sparsity_config is set; sparse compressed-tensors are not imported", path);
    const json_t *groups = json_object_get(qc, "config_groups");
    if (!json_is_object(groups) || json_object_size(groups) != 1) {
        QCK_ERROR(r, "config_groups",
                  "%s.config_groups must hold exactly one group (one scheme for every Linear)", path);
        return;
    }
    const char *group_name;
    const json_t *group;
    json_object_foreach((json_t *)groups, group_name, group) {
        char where[160];
        snprintf(where, sizeof where, "%s.config_groups.%.64s", path, group_name);
        if (!json_is_object(group)) {
            QCK_ERROR(r, "config_groups", "%s must be an object", where);
            continue;
        }
        check_keys(r, group, where, "config_groups", group_keys);
        const json_t *targets = json_object_get(group, "targets");
        if (!(json_is_array(targets) && json_array_size(targets) == 1 &&
              json_is_string(json_array_get(targets, 0)) &&
              strcmp(json_string_value(json_array_get(targets, 0)), "Linear") == 0))
            QCK_ERROR(r, "config_groups", "%s.targets must be [\"Linear\"]", where);
        const char *format_member = get_string(r, group, "format", where, "config_groups", NULL);
        if (format_member && !string_is(format_member, "float-quantized"))
            QCK_ERROR(r, "config_groups", "%s.format is \"%.*s%s\"; expected \"float-quantized\"", where,
                      DIAG_NAME(format_member));
        char sub[200];
        snprintf(sub, sizeof sub, "%s.weights", where);
        read_args(r, json_object_get(group, "weights"), sub, true, s);
        const json_t *input = json_object_get(group, "input_activations");
        snprintf(sub, sizeof sub, "%s.input_activations", where);
        if (!is_absent(input)) read_args(r, input, sub, false, s);
        if (!is_absent(json_object_get(group, "output_activations")))
            QCK_ERROR(r, "config_groups", "%s.output_activations is set; smelt does not quantize outputs",
                      where);
    }
}

bool qck_scheme_of_config(const fe_config *c, qck_scheme *out, diag_engine *d) {
    memset(out, 0, sizeof *out);
    const json_t *qc = c->root ? json_object_get(c->root, "quantization_config") : NULL;
    if (is_absent(qc)) return true;
    qck_reader r = {c, qc, d, true};
    if (!json_is_object(qc)) {
        QCK_ERROR(&r, NULL, "quantization_config must be an object");
        return false;
    }
    const char *method = get_string(&r, qc, "quant_method", "quantization_config", NULL, NULL);
    if (!method) {
        if (r.ok) QCK_ERROR(&r, NULL, "quantization_config has no quant_method");
        return false;
    }
    if (string_is(method, "awq")) {
        out->method = QCK_METHOD_AWQ;
        read_awq(&r, qc, out);
    } else if (string_is(method, "gptq")) {
        out->method = QCK_METHOD_GPTQ;
        read_gptq(&r, qc, out);
    } else if (string_is(method, "fp8") || string_is(method, "compressed-tensors")) {
        out->method = QCK_METHOD_FP8;
        if (string_is(method, "fp8"))
            read_fp8_config(&r, qc, out);
        else
            read_compressed(&r, qc, out);
        out->format = (quant_format){.kind = QUANT_FP8, .method = QUANT_METHOD_CHECKPOINT};
        out->format.has_column_scale = !out->fp8_per_channel;
    } else {
        QCK_ERROR(
            &r, "quant_method",
            "quantization_config.quant_method is \"%.*s%s\"; smelt imports \"awq\", \"gptq\", \"fp8\" and "
            "\"compressed-tensors\" (FP8) checkpoints",
            DIAG_NAME(method));
    }
    if (!r.ok) memset(out, 0, sizeof *out);
    return r.ok;
}

bool qck_scheme_of_file(const char *path, qck_scheme *out, diag_engine *d) {
    memset(out, 0, sizeof *out);
    if (!path) return true;
    fe_config c;
    bool ok = fe_config_open(&c, path, d) && qck_scheme_of_config(&c, out, d);
    fe_config_close(&c);
    return ok;
}

/* ---- tensors ------------------------------------------------------------- */

typedef struct qck_read {
    const st_checkpoint *ck;
    diag_engine *d;
    const char *weight; /* the weight's name, for messages */
    bool check_only;    /* stop after the dtype and shape checks (qck_weight_shape) */
    uint64_t rows, cols;
} qck_read;

static smelt_loc file_of(const st_tensor *t) { return (smelt_loc){t->diag_file, 0, 0}; }

/* `base` + `suffix` into buffer; false when it does not fit. */
static bool join(char *buffer, size_t size, const char *base, size_t base_length, const char *suffix) {
    int n = snprintf(buffer, size, "%.*s%s", (int)base_length, base, suffix);
    return n >= 0 && (size_t)n < size;
}

/* The tensor `base``suffix`, or NULL. */
static const st_tensor *find(const st_checkpoint *ck, const char *base, size_t base_length,
                             const char *suffix, uint32_t *index) {
    char name[1024];
    if (!join(name, sizeof name, base, base_length, suffix)) return NULL;
    uint32_t i = st_checkpoint_index(ck, name);
    if (index) *index = i;
    return i == UINT32_MAX ? NULL : ck->tensors[i];
}

/* t has dtype `dtype` (or any float one when `any_float`) and shape
 * [dims[0], dims[1]] (rank 2) or [dims[0]] (rank 1). */
static bool check_tensor(qck_read *r, const st_tensor *t, st_dtype dtype, uint32_t rank,
                         const uint64_t *dims) {
    bool ok = true;
    if (t->gguf) {
        diag_error(r->d, file_of(t),
                   "tensor '%.*s%s' of weight '%.*s%s' is in a GGUF file; pre-quantized "
                   "AWQ, GPTQ and FP8 tensors are read from safetensors",
                   DIAG_NAME(t->name), DIAG_NAME(r->weight));
        return false;
    }
    if (t->dtype != dtype) {
        diag_error(r->d, file_of(t), "tensor '%.*s%s' has dtype %s; expected %s", DIAG_NAME(t->name),
                   st_dtype_name(t->dtype), st_dtype_name(dtype));
        ok = false;
    }
    bool same = t->rank == rank;
    for (uint32_t i = 0; same && i < rank; i++)
        same = t->shape[i] == dims[i];
    if (!same) {
        char found[ST_SHAPE_TEXT_MAX], expected[ST_SHAPE_TEXT_MAX];
        diag_error(r->d, file_of(t), "tensor '%.*s%s' has shape %s; weight '%.*s%s' needs %s",
                   DIAG_NAME(t->name), st_format_shape(t->shape, t->rank, found, sizeof found),
                   DIAG_NAME(r->weight), st_format_shape(dims, rank, expected, sizeof expected));
        ok = false;
    }
    return ok;
}

/* The bytes of t (checked) in a malloc'd buffer (+1 so 0 bytes is fine). */
static uint8_t *read_bytes(qck_read *r, const st_tensor *t) {
    uint8_t *bytes = malloc(t->byte_size + 1);
    if (!bytes) {
        diag_error(r->d, file_of(t), "out of memory reading tensor '%.*s%s'", DIAG_NAME(t->name));
        return NULL;
    }
    if (!st_read_file_bytes(t->fd, t->diag_file, t->name, bytes, t->byte_size, t->file_offset, r->d)) {
        free(bytes);
        return NULL;
    }
    return bytes;
}

static uint32_t word_at(const uint8_t *p, uint64_t i) {
    p += 4 * i;
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static void set_nibble(uint8_t *bytes, uint64_t i, unsigned v) {
    uint8_t shift = (uint8_t)(i % 2 * 4);
    bytes[i / 2] = (uint8_t)((bytes[i / 2] & ~(15u << shift)) | ((v & 15u) << shift));
}

static void store_u32(uint8_t *p, uint32_t v) {
    for (int i = 0; i < 4; i++)
        p[i] = (uint8_t)(v >> (8 * i));
}

/* Allocates out->tensor for format f, rows x cols; false after reporting. */
static bool make_tensor(qck_read *r, const st_tensor *t, quant_format f, uint64_t rows, uint64_t cols,
                        qck_weight *out) {
    memset(out, 0, sizeof *out);
    out->tensor.format = f;
    const char *why = quant_layout_of(&f, rows, cols, &out->tensor.layout);
    if (why) {
        diag_error(r->d, file_of(t), "weight '%.*s%s' (%llu x %llu, group %u): %s", DIAG_NAME(r->weight),
                   (unsigned long long)rows, (unsigned long long)cols, f.group, why);
        return false;
    }
    out->tensor.data = calloc(1, out->tensor.layout.total + 1);
    if (!out->tensor.data) {
        diag_error(r->d, file_of(t), "out of memory unpacking weight '%.*s%s'", DIAG_NAME(r->weight));
        return false;
    }
    return true;
}

/* The nibble order of a word of 8 output columns: AWQ stores column 8j + c
 * in nibble awq_nibble[c] (its pack order is [0, 2, 4, 6, 1, 3, 5, 7]). */
static const unsigned awq_nibble[8] = {0, 4, 1, 5, 2, 6, 3, 7};

/* Copies the f16 scales [groups][out] (checkpoint order) into the layout's
 * [out][groups]; false (reported) on a non-finite scale. */
static bool copy_scales(qck_read *r, const st_tensor *t, const uint8_t *scales, quant_tensor *q) {
    const quant_layout *l = &q->layout;
    for (uint64_t g = 0; g < l->groups; g++)
        for (uint64_t n = 0; n < l->rows; n++) {
            const uint8_t *p = scales + 2 * (g * l->rows + n);
            if (!isfinite(plan_f16_to_f32((uint16_t)(p[0] | p[1] << 8)))) {
                diag_error(r->d, file_of(t), "tensor '%.*s%s' has a scale that is not finite at [%llu, %llu]",
                           DIAG_NAME(t->name), (unsigned long long)g, (unsigned long long)n);
                return false;
            }
            uint8_t *dst = q->data + l->scales + 2 * (n * l->groups + g);
            dst[0] = p[0], dst[1] = p[1];
        }
    return true;
}

/* AWQ and GPTQ: the four tensors of Linear `base`. */
static qck_result read_int4_weight(const qck_scheme *s, qck_read *r, const char *base, size_t base_length,
                                   qck_weight *out) {
    const st_checkpoint *ck = r->ck;
    const st_tensor *qweight = find(ck, base, base_length, ".qweight", NULL);
    const st_tensor *qzeros = find(ck, base, base_length, ".qzeros", NULL);
    const st_tensor *scales = find(ck, base, base_length, ".scales", NULL);
    const st_tensor *g_idx = find(ck, base, base_length, ".g_idx", NULL);
    const st_tensor *plain = find(ck, base, base_length, ".weight", NULL);
    if (!qweight && !qzeros && !scales && !g_idx) return QCK_NOT_QUANTIZED;
    const st_tensor *any = qweight ? qweight : qzeros ? qzeros : scales ? scales : g_idx;
    if (!qweight || !qzeros || !scales) {
        diag_error(r->d, file_of(any), "weight '%.*s%s' is partly quantized: the checkpoint lacks its %s",
                   DIAG_NAME(r->weight),
                   !qweight  ? "qweight"
                   : !qzeros ? "qzeros"
                             : "scales");
        return QCK_FAILED;
    }
    if (plain) {
        diag_error(r->d, file_of(plain), "weight '%.*s%s' is both a float tensor and quantized (%.*s%s)",
                   DIAG_NAME(r->weight), DIAG_NAME(qweight->name));
        return QCK_FAILED;
    }
    bool awq = s->method == QCK_METHOD_AWQ;
    /* Codes of `bits` bits, `per` to an I32 word (8 int4 or 4 int8). */
    unsigned bits = s->format.kind == QUANT_INT8 ? 8 : 4, per = 32 / bits, mask = (1u << bits) - 1;
    if (qweight->rank != 2 || qweight->dtype != ST_DTYPE_I32) {
        char shape[ST_SHAPE_TEXT_MAX];
        diag_error(r->d, file_of(qweight), "tensor '%.*s%s' is %s %s; %s's qweight is an I32 matrix",
                   DIAG_NAME(qweight->name), st_dtype_name(qweight->dtype),
                   st_format_shape(qweight->shape, qweight->rank, shape, sizeof shape), awq ? "AWQ" : "GPTQ");
        return QCK_FAILED;
    }
    /* AWQ: [in, out/8]; GPTQ: [in/per, out]. */
    uint64_t in = qweight->shape[0], out_features = qweight->shape[1];
    uint64_t *packed = awq ? &out_features : &in;
    if (*packed > UINT64_MAX / 8 / 4) {
        diag_error(r->d, file_of(qweight), "tensor '%.*s%s' is too large", DIAG_NAME(qweight->name));
        return QCK_FAILED;
    }
    *packed *= per;
    if (!g_idx && s->format.has_group_index) {
        diag_error(r->d, file_of(qweight),
                   "weight '%.*s%s' has no g_idx, which desc_act (act-order) requires", DIAG_NAME(r->weight));
        return QCK_FAILED;
    }
    if (g_idx && awq) {
        diag_error(r->d, file_of(g_idx), "tensor '%.*s%s': AWQ checkpoints have no g_idx",
                   DIAG_NAME(g_idx->name));
        return QCK_FAILED;
    }
    if (in == 0 || out_features == 0) {
        diag_error(r->d, file_of(qweight), "tensor '%.*s%s' holds no weights (%llu inputs, %llu outputs)",
                   DIAG_NAME(qweight->name), (unsigned long long)in, (unsigned long long)out_features);
        return QCK_FAILED;
    }
    quant_format f = s->format;
    if (f.group == 0) f.group = in > UINT32_MAX ? 0 : (uint32_t)in;
    if (f.group == 0 || in % f.group != 0 || out_features % per != 0) {
        diag_error(
            r->d, file_of(qweight),
            "weight '%.*s%s' has %llu input and %llu output features; the group size %u must divide the "
            "inputs and %u the outputs",
            DIAG_NAME(r->weight), (unsigned long long)in, (unsigned long long)out_features, f.group, per);
        return QCK_FAILED;
    }
    uint64_t groups = in / f.group;
    uint64_t zeros_dims[2] = {groups, out_features / per}, scales_dims[2] = {groups, out_features};
    uint64_t g_dims[1] = {in};
    bool ok = check_tensor(r, qweight, ST_DTYPE_I32, 2, qweight->shape) &
              check_tensor(r, qzeros, ST_DTYPE_I32, 2, zeros_dims) &
              check_tensor(r, scales, ST_DTYPE_F16, 2, scales_dims);
    if (g_idx) ok &= check_tensor(r, g_idx, ST_DTYPE_I32, 1, g_dims);
    if (!ok) return QCK_FAILED;
    r->rows = out_features, r->cols = in;
    if (r->check_only) return QCK_QUANTIZED;

    uint8_t *w = read_bytes(r, qweight), *z = read_bytes(r, qzeros), *sc = read_bytes(r, scales);
    uint8_t *gi = g_idx ? read_bytes(r, g_idx) : NULL;
    if (!w || !z || !sc || (g_idx && !gi) || !make_tensor(r, qweight, f, out_features, in, out)) goto fail;
    quant_tensor *q = &out->tensor;
    const quant_layout *l = &q->layout;
    /* int8 (8-bit GPTQ, symmetric): the code q - 128 as a signed byte. */
    for (uint64_t k = 0; k < in; k++)
        for (uint64_t n = 0; n < out_features; n++) {
            unsigned code = awq ? word_at(w, k * (out_features / 8) + n / 8) >> (4 * awq_nibble[n % 8])
                                : word_at(w, k / per * out_features + n) >> (bits * (k % per));
            if (bits == 4)
                set_nibble(q->data + l->codes, n * in + k, code & mask);
            else
                q->data[l->codes + n * in + k] = (uint8_t)((code & mask) - 128u);
        }
    for (uint64_t g = 0; g < groups; g++)
        for (uint64_t n = 0; n < out_features; n++) {
            unsigned shift = bits * (awq ? awq_nibble[n % 8] : (unsigned)(n % per));
            unsigned zero =
                (word_at(z, g * (out_features / per) + n / per) >> shift & mask) + s->zeros_minus_one;
            unsigned symmetric = bits == 4 ? 8 : 128;
            if (bits == 4 && zero > 15) {
                diag_error(
                    r->d, file_of(qzeros),
                    "tensor '%.*s%s' holds zero point 16 at [%llu, %llu] (a v1 zero of 0 stored as -1, "
                    "GPTQ's known overflow); it does not fit 4 bits",
                    DIAG_NAME(qzeros->name), (unsigned long long)g, (unsigned long long)n);
                goto fail;
            }
            if (f.has_zero) {
                set_nibble(q->data + l->zeros, n * groups + g, zero);
            } else if (zero != symmetric) {
                diag_error(
                    r->d, file_of(qzeros),
                    "tensor '%.*s%s' holds zero point %u at [%llu, %llu], but sym is true (every zero %u)",
                    DIAG_NAME(qzeros->name), zero, (unsigned long long)g, (unsigned long long)n, symmetric);
                goto fail;
            }
        }
    if (!copy_scales(r, scales, sc, q)) goto fail;
    for (uint64_t k = 0; gi && k < in; k++) {
        uint32_t group = word_at(gi, k);
        if (group >= groups) {
            diag_error(r->d, file_of(g_idx), "tensor '%.*s%s' gives column %llu group %d; it has %llu groups",
                       DIAG_NAME(g_idx->name), (unsigned long long)k, (int32_t)group,
                       (unsigned long long)groups);
            goto fail;
        }
        if (f.has_group_index) {
            store_u32(q->data + l->group_index + 4 * k, group);
        } else if (group != k / f.group) {
            diag_error(r->d, file_of(g_idx),
                       "tensor '%.*s%s' gives column %llu group %u, not %llu, but desc_act is false "
                       "(contiguous groups)",
                       DIAG_NAME(g_idx->name), (unsigned long long)k, group,
                       (unsigned long long)(k / f.group));
            goto fail;
        }
    }
    free(w), free(z), free(sc), free(gi);
    return QCK_QUANTIZED;
fail:
    free(w), free(z), free(sc), free(gi);
    qck_weight_free(out);
    return QCK_FAILED;
}

/* A scale tensor's values as f32 into dst (count values, checked). */
static bool scale_values(qck_read *r, const st_tensor *t, float *dst, uint64_t count) {
    if (t->gguf || (t->dtype != ST_DTYPE_F32 && t->dtype != ST_DTYPE_BF16 && t->dtype != ST_DTYPE_F16)) {
        diag_error(r->d, file_of(t), "tensor '%.*s%s' has dtype %s; scales are F32, BF16 or F16",
                   DIAG_NAME(t->name), st_dtype_name(t->dtype));
        return false;
    }
    if (t->byte_size / st_dtype_size(t->dtype) != count) { /* scale_shape checked it */
        diag_error(r->d, file_of(t), "tensor '%.*s%s' does not hold %llu scales", DIAG_NAME(t->name),
                   (unsigned long long)count);
        return false;
    }
    if (!st_tensor_read_f32(t, dst, r->d)) return false;
    for (uint64_t i = 0; i < count; i++)
        if (!(dst[i] > 0) || !isfinite(dst[i])) {
            diag_error(r->d, file_of(t),
                       "tensor '%.*s%s' holds %g at %llu; a scale must be positive and finite",
                       DIAG_NAME(t->name), (double)dst[i], (unsigned long long)i);
            return false;
        }
    return true;
}

/* A per-tensor scale's shape: [] or [1]; a per-channel one's: [out, 1] or [out]. */
static bool scale_shape(qck_read *r, const st_tensor *t, bool per_channel, uint64_t out_features) {
    bool ok = per_channel ? (t->rank == 2 && t->shape[0] == out_features && t->shape[1] == 1) ||
                                (t->rank == 1 && t->shape[0] == out_features)
                          : t->rank == 0 || (t->rank == 1 && t->shape[0] == 1);
    if (!ok) {
        char shape[ST_SHAPE_TEXT_MAX];
        diag_error(r->d, file_of(t), "tensor '%.*s%s' has shape %s; expected %s", DIAG_NAME(t->name),
                   st_format_shape(t->shape, t->rank, shape, sizeof shape),
                   per_channel ? "one scale per output channel ([out, 1] or [out])"
                               : "one scale ([] or [1])");
    }
    return ok;
}

static qck_result read_fp8_weight(const qck_scheme *s, qck_read *r, const char *base, size_t base_length,
                                  qck_weight *out) {
    const st_checkpoint *ck = r->ck;
    const st_tensor *weight = find(ck, base, base_length, ".weight", NULL);
    const st_tensor *scale = find(ck, base, base_length, ".weight_scale", NULL);
    const st_tensor *input = find(ck, base, base_length, ".input_scale", NULL);
    bool fp8 = weight && weight->dtype == ST_DTYPE_F8_E4M3;
    if (!fp8 && !scale && !input) return QCK_NOT_QUANTIZED;
    const st_tensor *any = weight ? weight : scale ? scale : input;
    if (!fp8) {
        diag_error(r->d, file_of(any), "weight '%.*s%s' has %s but %s", DIAG_NAME(r->weight),
                   scale ? "a weight_scale" : "an input_scale",
                   weight ? "is not F8_E4M3" : "is not in the checkpoint");
        return QCK_FAILED;
    }
    if (!scale) {
        diag_error(r->d, file_of(weight), "weight '%.*s%s' is F8_E4M3 without its weight_scale tensor",
                   DIAG_NAME(r->weight));
        return QCK_FAILED;
    }
    if (!input != !s->fp8_static_input) {
        diag_error(r->d, file_of(weight), "weight '%.*s%s' %s an input_scale, but the activations are %s",
                   DIAG_NAME(r->weight), input ? "has" : "lacks", s->fp8_static_input ? "static" : "dynamic");
        return QCK_FAILED;
    }
    if (weight->rank != 2 || weight->gguf) {
        char shape[ST_SHAPE_TEXT_MAX];
        diag_error(r->d, file_of(weight), "tensor '%.*s%s' has shape %s; an FP8 weight is [out, in]",
                   DIAG_NAME(weight->name),
                   st_format_shape(weight->shape, weight->rank, shape, sizeof shape));
        return QCK_FAILED;
    }
    uint64_t rows = weight->shape[0], cols = weight->shape[1];
    if (rows == 0 || cols == 0) {
        diag_error(r->d, file_of(weight), "tensor '%.*s%s' holds no weights (shape [%llu, %llu])",
                   DIAG_NAME(weight->name), (unsigned long long)rows, (unsigned long long)cols);
        return QCK_FAILED;
    }
    if (!scale_shape(r, scale, s->fp8_per_channel, rows) || (input && !scale_shape(r, input, false, 1)))
        return QCK_FAILED;
    r->rows = rows, r->cols = cols;
    if (r->check_only) return QCK_QUANTIZED;
    quant_format f = s->format;
    f.group = cols > UINT32_MAX ? 0 : (uint32_t)cols;
    float *scales = malloc((s->fp8_per_channel ? rows : 1) * sizeof *scales + 1);
    uint8_t *codes = NULL;
    if (!scales) {
        diag_error(r->d, file_of(scale), "out of memory reading '%.*s%s'", DIAG_NAME(scale->name));
        return QCK_FAILED;
    }
    if (!scale_values(r, scale, scales, s->fp8_per_channel ? rows : 1)) goto fail;
    if (input && !scale_values(r, input, &out->input_scale, 1)) goto fail;
    float input_scale = input ? out->input_scale : 0;
    if (!(codes = read_bytes(r, weight)) || !make_tensor(r, weight, f, rows, cols, out)) goto fail;
    out->has_input_scale = input != NULL, out->input_scale = input_scale;
    quant_tensor *q = &out->tensor;
    for (uint64_t i = 0; i < rows * cols; i++)
        if ((codes[i] & 0x7f) == 0x7f) {
            diag_error(r->d, file_of(weight), "tensor '%.*s%s' holds NaN at [%llu, %llu]",
                       DIAG_NAME(weight->name), (unsigned long long)(i / cols),
                       (unsigned long long)(i % cols));
            goto fail;
        }
    memcpy(q->data + q->layout.codes, codes, rows * cols);
    for (uint64_t n = 0; n < rows; n++) {
        float want = s->fp8_per_channel ? scales[n] : 1.0f;
        uint16_t h = plan_f32_to_f16(want);
        if (plan_f16_to_f32(h) != want) {
            diag_error(r->d, file_of(scale),
                       "tensor '%.*s%s' holds scale %.9g for row %llu, which f16 (smelt's scale type) cannot "
                       "hold exactly; it would change the weights",
                       DIAG_NAME(scale->name), (double)want, (unsigned long long)n);
            goto fail;
        }
        uint8_t *dst = q->data + q->layout.scales + 2 * n;
        dst[0] = (uint8_t)h, dst[1] = (uint8_t)(h >> 8);
    }
    for (uint64_t k = 0; f.has_column_scale && k < cols; k++)
        store_u32(q->data + q->layout.column_scale + 4 * k, plan_f32_to_bits(scales[0]));
    free(scales), free(codes);
    return QCK_QUANTIZED;
fail:
    free(scales), free(codes);
    qck_weight_free(out);
    return QCK_FAILED;
}

/* The Linear's name: weight_name without ".weight"; false when it has none. */
static bool linear_of(const char *weight_name, size_t *base_length) {
    size_t n = strlen(weight_name), suffix = strlen(".weight");
    if (n <= suffix || strcmp(weight_name + n - suffix, ".weight") != 0) return false;
    *base_length = n - suffix;
    return true;
}

static qck_result read_weight(const qck_scheme *s, qck_read *r, qck_weight *out) {
    size_t base_length;
    if (s->method == QCK_METHOD_NONE || !linear_of(r->weight, &base_length)) return QCK_NOT_QUANTIZED;
    if (s->method == QCK_METHOD_FP8) return read_fp8_weight(s, r, r->weight, base_length, out);
    return read_int4_weight(s, r, r->weight, base_length, out);
}

qck_result qck_read_weight(const qck_scheme *s, const st_checkpoint *ck, const char *weight_name,
                           qck_weight *out, diag_engine *d) {
    memset(out, 0, sizeof *out);
    qck_read r = {.ck = ck, .d = d, .weight = weight_name};
    return read_weight(s, &r, out);
}

qck_result qck_weight_shape(const qck_scheme *s, const st_checkpoint *ck, const char *weight_name,
                            uint64_t *rows, uint64_t *cols, diag_engine *d) {
    qck_read r = {.ck = ck, .d = d, .weight = weight_name, .check_only = true};
    qck_weight unused;
    memset(&unused, 0, sizeof unused);
    qck_result result = read_weight(s, &r, &unused);
    *rows = r.rows, *cols = r.cols;
    return result;
}

uint32_t qck_weight_tensors(const qck_scheme *s, const st_checkpoint *ck, const char *weight_name,
                            uint32_t indices[QCK_MAX_TENSORS]) {
    static const char *const int4_suffixes[] = {".qweight", ".qzeros", ".scales", ".g_idx"};
    static const char *const fp8_suffixes[] = {".weight", ".weight_scale", ".input_scale"};
    uint32_t count = 0;
    size_t base_length;
    if (s->method != QCK_METHOD_NONE && linear_of(weight_name, &base_length)) {
        bool fp8 = s->method == QCK_METHOD_FP8;
        const char *const *suffixes = fp8 ? fp8_suffixes : int4_suffixes;
        for (uint32_t i = 0; i < (fp8 ? 3u : 4u); i++) {
            uint32_t index;
            if (find(ck, weight_name, base_length, suffixes[i], &index)) indices[count++] = index;
        }
    }
    if (count == 0) {
        uint32_t index = st_checkpoint_index(ck, weight_name);
        if (index != UINT32_MAX) indices[count++] = index;
    }
    return count;
}

qck_result qck_weight_format(const qck_scheme *s, const st_checkpoint *ck, const char *weight_name,
                             quant_format *out, uint64_t *rows, uint64_t *cols, diag_engine *d) {
    memset(out, 0, sizeof *out);
    qck_result r = qck_weight_shape(s, ck, weight_name, rows, cols, d);
    if (r != QCK_QUANTIZED) return r;
    *out = s->format;
    if (out->group == 0) out->group = *cols <= UINT32_MAX ? (uint32_t)*cols : 0;
    return r;
}

bool qck_module_formats(const ir_module *m, const qck_scheme *s, const st_checkpoint *ck,
                        quant_format *formats, diag_engine *d) {
    bool ok = true;
    for (uint32_t op = 0; op < m->op_count; op++) {
        memset(&formats[op], 0, sizeof formats[op]);
        const ir_op *o = ir_op_at(m, op);
        if (o->dead || o->kind != IR_OP_WEIGHT || s->method == QCK_METHOD_NONE) continue;
        const ir_attr *name = ir_op_attr(m, op, "name"), *stack = ir_op_attr(m, op, "stack");
        if (!name || name->kind != IR_ATTR_STRING) continue; /* the binder reports it */
        /* Stacked parts (MoE experts): one matrix per weight in the layout,
         * so they stay float and bind dequantized, exactly. */
        if (stack && stack->kind == IR_ATTR_STRING && stack->as.s[0]) continue;
        uint64_t rows, cols;
        qck_result r = qck_weight_format(s, ck, name->as.s, &formats[op], &rows, &cols, d);
        ok &= r != QCK_FAILED;
    }
    return ok;
}

void qck_weight_free(qck_weight *w) {
    free(w->tensor.data);
    memset(w, 0, sizeof *w);
}
