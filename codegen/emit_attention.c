/* emit_attention.c - the attention op as kernels over its KV cache.
 *
 * attention(q[T, Hq, D], k[T, Hkv, D], v[T, Hkv, Dv], pos[T]) -> [T, Hq, Dv]
 * with the semantics of reference/ref_ops_attention.c (the oracle):
 *
 *   1. kv_write: one block per token copies k and v of token t into the
 *      caches at position pos[t] and marks the position written. It runs to
 *      completion before 2, so every query of a step sees every key of it.
 *      It is a kernel of its own so that a fusion rule can move it into
 *      the QKV projection's epilogue and drop it here. Into an f8e4m3
 *      cache (kv_dtype) a warp per kv head quantizes the head's row with
 *      its own scale (max |x| / 448, plan/numeric.h), so this kernel always
 *      writes such a cache (no GEMV unit sees a whole row).
 *   2. the attention proper: query head h reads kv head h / (Hq / Hkv) (GQA,
 *      MQA). It sees the written positions p with p <= pos (causal; every
 *      written position when not causal) and p > pos - window when
 *      window > 0, in an online softmax (a running max and sum, the
 *      accumulator rescaled when the max grows). Scores are capped as
 *      softcap * tanh(score / softcap) when the op has a softcap (Gemma 2).
 *      Positions never written (a gap in a sequence) are skipped, as the
 *      reference skips them. Which kernel does it depends on the step's
 *      token count T, chosen at run time by grid rules that are empty for
 *      the other steps:
 *        - T <= ATTENTION_DECODE_MAX_TOKENS: split-KV flash decoding
 *          (emit_attention_decode.c), when the cache rows can be read 16
 *          bytes at a time;
 *        - longer steps over bf16 or f16 caches with head dims a multiple of 16:
 *          FlashAttention-2 on tensor cores (emit_attention_prefill.c);
 *        - everything else (f32 caches — mma wants 16-bit operands, and an
 *          f32 plan is the precise one, so it stays f32 end to end — and
 *          shapes the fast kernels do not take): the scalar tiled kernel
 *          below, one block per (token, query head), one warp per
 *          position's dot product.
 *
 * State (cg_group_lowering.state_bytes, zeroed when a sequence starts): the K
 * cache [max_seq, Hkv, D] in k's storage dtype (or f8e4m3), the V cache
 * [max_seq, Hkv, Dv] in v's, written flags int32[max_seq], with the decode
 * kernel its workspace, and with f8e4m3 caches the scales f32 [max_seq,
 * Hkv] of K and V rows (emit.h). A position outside [0, max_seq) is neither written nor
 * attended (the runtime checks positions before a step; the reference
 * reports them). Two tokens of one step at the same position race; a step's
 * positions are distinct.
 */
#include "emit_attention.h"

#include <math.h>
#include <string.h>

enum { ATTENTION_THREADS = 128, ATTENTION_TILE = 32, KV_WRITE_THREADS = 128 };

static bool read_shape(cg_emit *e, attention_shape *s) {
    ir_value_id q = cg_operand(e, 0), k = cg_operand(e, 1), v = cg_operand(e, 2), pos = cg_operand(e, 3);
    cg_shape qs = cg_shape_of(e, q), ks = cg_shape_of(e, k), vs = cg_shape_of(e, v), ps = cg_shape_of(e, pos);
    bool floats = smelt_dtype_is_float(e->m->values[q].type.dtype) &&
                  smelt_dtype_is_float(e->m->values[k].type.dtype) &&
                  smelt_dtype_is_float(e->m->values[v].type.dtype);
    if (qs.rank != 3 || ks.rank != 3 || vs.rank != 3 || ps.rank != 1 || !floats ||
        smelt_dtype_is_float(e->m->values[pos].type.dtype)) {
        diag_error(e->d, e->ir->loc,
                   "attention: expected float q[T, Hq, D], k[T, Hkv, D], v[T, Hkv, Dv] and integer pos[T]");
        return false;
    }
    cg_shape out = cg_shape_of(e, cg_result(e, 0)),
             expected = {3, qs.token0, {qs.dims[0], qs.dims[1], vs.dims[2]}};
    bool rows_agree =
        ks.token0 == qs.token0 && vs.token0 == qs.token0 && ps.token0 == qs.token0 &&
        (qs.token0 || (ks.dims[0] == qs.dims[0] && vs.dims[0] == qs.dims[0] && ps.dims[0] == qs.dims[0]));
    if (!cg_expect(e, rows_agree && cg_same_shape(&out, &expected),
                   "q, k, v and pos with the same tokens and a result [T, Hq, Dv]"))
        return false;
    if (!cg_expect(e, qs.dims[2] <= 8192,
                   "a head dim of at most 8192 (the query is kept in shared memory); found %lld",
                   (long long)qs.dims[2]))
        return false;
    s->query_heads = qs.dims[1];
    s->kv_heads = ks.dims[1];
    s->head_dim = qs.dims[2];
    s->value_dim = vs.dims[2];
    s->max_seq = cg_attr_int(e, "max_seq", 0);
    s->window = cg_attr_int(e, "window", 0);
    s->softcap = cg_attr_float(e, "softcap", 0.0);
    s->causal = cg_attr_bool(e, "causal", true);
    s->scale = cg_attr_float(e, "scale", 1.0);
    s->tokens = cg_shape_count(&qs, 0, 1);
    s->input_dtype = cg_storage_dtype(e->m, k);
    s->scaled = strcmp(cg_attr_string(e, "kv_dtype", "auto"), "f8e4m3") == 0;
    s->key_dtype = s->scaled ? SMELT_DTYPE_F8E4M3 : s->input_dtype;
    s->value_dtype = s->scaled ? SMELT_DTYPE_F8E4M3 : cg_storage_dtype(e->m, v);
    if (s->kv_heads < 1 || s->query_heads % s->kv_heads != 0 || ks.dims[2] != s->head_dim ||
        vs.dims[1] != s->kv_heads) {
        diag_error(e->d, e->ir->loc,
                   "attention: expected Hq a multiple of Hkv and k, v with Hkv heads of D and Dv dims; found "
                   "Hq %lld, k heads %lld of %lld, v heads %lld",
                   (long long)s->query_heads, (long long)s->kv_heads, (long long)ks.dims[2],
                   (long long)vs.dims[1]);
        return false;
    }
    if (s->max_seq < 1 || s->max_seq > INT32_MAX / 2 || s->window < 0) {
        diag_error(e->d, e->ir->loc,
                   "attention: expected max_seq in [1, 2^30] and window >= 0; found %lld and %lld",
                   (long long)s->max_seq, (long long)s->window);
        return false;
    }
    return true;
}

/* Bytes of a cache of `dims` per position; false on overflow. */
static bool cache_bytes(int64_t max_seq, int64_t heads, int64_t dims, smelt_dtype t, uint64_t *out) {
    uint64_t per_position;
    return !size_mul_overflow((uint64_t)heads, (uint64_t)dims, &per_position) &&
           !size_mul_overflow(per_position, smelt_dtype_element_bytes(t), &per_position) &&
           !size_mul_overflow(per_position, (uint64_t)max_seq, out);
}

static const char *dims_part(cg_emit *e, const attention_shape *s) {
    if (s->value_dim == s->head_dim) return arena_printf(&e->scratch, "d%lld", (long long)s->head_dim);
    return arena_printf(&e->scratch, "d%lld_dv%lld", (long long)s->head_dim, (long long)s->value_dim);
}

/* The K and V rows of a token into f8e4m3 caches: a warp per kv head
 * takes the head's max |x|, stores the codes of x / scale and the scale. */
static const char kv_quantize_body[] = "\
for (int head = warp; head < KV_HEADS; head += WARPS) {\n\
    long long from = token * KEY_ROW + head * HEAD_DIM, to = (long long)position * KEY_ROW + head * HEAD_DIM;\n\
    float absmax = 0.0f;\n\
    for (int i = lane; i < HEAD_DIM; i += 32) {\n\
        absmax = fmaxf(absmax, fabsf(LOAD_KEY(from + i)));\n\
    }\n\
    float scale = smelt_f8e4m3_row_scale(warp_max(absmax));\n\
    for (int i = lane; i < HEAD_DIM; i += 32) {\n\
        k_cache[to + i] = smelt_f32_to_f8e4m3(LOAD_KEY(from + i) / scale);\n\
    }\n\
    if (lane == 0) {\n\
        k_scales[(long long)position * KV_HEADS + head] = scale;\n\
    }\n\
}\n\
for (int head = warp; head < KV_HEADS; head += WARPS) {\n\
    long long from = token * VALUE_ROW + head * VALUE_DIM, to = (long long)position * VALUE_ROW + head * VALUE_DIM;\n\
    float absmax = 0.0f;\n\
    for (int i = lane; i < VALUE_DIM; i += 32) {\n\
        absmax = fmaxf(absmax, fabsf(LOAD_VALUE(from + i)));\n\
    }\n\
    float scale = smelt_f8e4m3_row_scale(warp_max(absmax));\n\
    for (int i = lane; i < VALUE_DIM; i += 32) {\n\
        v_cache[to + i] = smelt_f32_to_f8e4m3(LOAD_VALUE(from + i) / scale);\n\
    }\n\
    if (lane == 0) {\n\
        v_scales[(long long)position * KV_HEADS + head] = scale;\n\
    }\n\
}\n";

static void emit_kv_write(cg_emit *e, const attention_shape *s) {
    ir_value_id stored[2] = {cg_operand(e, 1), cg_operand(e, 2)};
    const char *name = arena_printf(&e->scratch, "kv_write_%s_kv%lld_%s_ctx%lld%s",
                                    cg_dtype_tag(e, stored, 2), (long long)s->kv_heads, dims_part(e, s),
                                    (long long)s->max_seq, s->scaled ? "_kvf8e4m3" : "");
    cg_kernel_builder b;
    cg_kernel_begin(&b, e, name,
                    s->scaled
                        ? "One block per token: quantizes its keys and values to the f8e4m3 KV cache at "
                          "position pos[t], a warp per kv head (codes of x / scale, the row's scale "
                          "max |x| / 448 beside them), and marks the position written."
                        : "One block per token: copies its keys and values into the KV cache at "
                          "position pos[t] and marks the position written.");
    uint32_t k = cg_param_value(&b, "k", cg_operand(e, 1), true);
    uint32_t v = cg_param_value(&b, "v", cg_operand(e, 2), true);
    cg_param_value(&b, "pos", cg_operand(e, 3), true);
    uint32_t k_cache = cg_param_state(&b, "k_cache", CG_STATE_KEYS, s->key_dtype);
    uint32_t v_cache = cg_param_state(&b, "v_cache", CG_STATE_VALUES, s->value_dtype);
    cg_param_state(&b, "written", CG_STATE_WRITTEN, SMELT_DTYPE_I32);
    if (s->scaled) {
        cg_param_state(&b, "k_scales", CG_STATE_KEY_SCALES, SMELT_DTYPE_F32);
        cg_param_state(&b, "v_scales", CG_STATE_VALUE_SCALES, SMELT_DTYPE_F32);
    }
    cg_kernel_launch(&b, cg_count_blocks(s->tokens, 1), (prog_affine){0, 1, 1}, KV_WRITE_THREADS);
    cg_kernel_open(&b);
    cg_text *t = &b.text;
    cg_line(t, "enum { KV_HEADS = %lld, HEAD_DIM = %lld, VALUE_DIM = %lld, MAX_SEQ = %lld, THREADS = %d };",
            (long long)s->kv_heads, (long long)s->head_dim, (long long)s->value_dim, (long long)s->max_seq,
            KV_WRITE_THREADS);
    cg_line(t, "enum { KEY_ROW = KV_HEADS * HEAD_DIM, VALUE_ROW = KV_HEADS * VALUE_DIM }; /* elements per "
               "position */");
    if (s->scaled) {
        cg_line(t, "enum { WARPS = THREADS / 32 };");
        cg_line(t, "#define LOAD_KEY(i) %s", cg_load(&b, k, "(i)"));
        cg_line(t, "#define LOAD_VALUE(i) %s", cg_load(&b, v, "(i)"));
        cg_blank(t);
        cg_write_warp_max(t);
    } else {
        cg_blank(t);
    }
    cg_kernel_signature(&b);
    cg_line(t, "long long token = blockIdx.x;");
    cg_line(t, "int position = pos[token];");
    cg_line(t, "if (position < 0 || position >= MAX_SEQ)");
    cg_line(t, "    return;");
    if (s->scaled) {
        cg_line(t, "int lane = threadIdx.x %% 32, warp = threadIdx.x / 32;");
        attention_write_template(t, kv_quantize_body);
        cg_line(t, "if (threadIdx.x == 0)");
        cg_line(t, "    written[position] = 1;");
        cg_kernel_end(&b);
        return;
    }
    cg_line(t, "for (int i = threadIdx.x; i < KEY_ROW; i += THREADS)");
    cg_line(t, "    %s", cg_copy(&b, k_cache, "(long long)position * KEY_ROW + i", k, "token * KEY_ROW + i"));
    cg_line(t, "for (int i = threadIdx.x; i < VALUE_ROW; i += THREADS)");
    cg_line(t, "    %s",
            cg_copy(&b, v_cache, "(long long)position * VALUE_ROW + i", v, "token * VALUE_ROW + i"));
    cg_line(t, "if (threadIdx.x == 0)");
    cg_line(t, "    written[position] = 1;");
    cg_kernel_end(&b);
}

const char *attention_kernel_name(cg_emit *e, const attention_shape *s, const char *prefix) {
    ir_value_id stored[4] = {cg_operand(e, 0), cg_operand(e, 1), cg_operand(e, 2), cg_result(e, 0)};
    cg_text name;
    cg_text_init(&name);
    cg_text_printf(&name, "%s_%s_h%lld_kv%lld_%s_ctx%lld", prefix, cg_dtype_tag(e, stored, 4),
                   (long long)s->query_heads, (long long)s->kv_heads, dims_part(e, s), (long long)s->max_seq);
    if (s->scaled) cg_text_printf(&name, "_kvf8e4m3");
    if (s->window > 0) cg_text_printf(&name, "_win%lld", (long long)s->window);
    if (!s->causal) cg_text_printf(&name, "_noncausal");
    if (s->softcap > 0) cg_text_printf(&name, "_softcap%s", cg_float_name(e, s->softcap));
    /* The usual scale 1/sqrt(D) is implied; any other is part of the name. */
    if ((float)s->scale != (float)(1.0 / sqrt((double)s->head_dim)))
        cg_text_printf(&name, "_scale%s", cg_float_name(e, s->scale));
    const char *kernel_name = arena_strdup(&e->scratch, name.data);
    cg_text_free(&name);
    return kernel_name;
}

void attention_define_scoring(cg_emit *e, cg_text *t, const attention_shape *s) {
    cg_line(t, "#define SCALE %s", cg_float_literal(e, s->scale));
    if (s->softcap > 0) {
        cg_line(t, "#define SOFTCAP %s", cg_float_literal(e, s->softcap));
        cg_line(t, "#define CAPPED(score) (SOFTCAP * tanhf((score) / SOFTCAP))");
    } else {
        cg_line(t, "#define CAPPED(score) (score) /* no soft-capping */");
    }
}

void attention_scale_params(cg_kernel_builder *b, const attention_shape *s) {
    if (!s->scaled) return;
    uint32_t keys = cg_param_state(b, "k_scales", CG_STATE_KEY_SCALES, SMELT_DTYPE_F32);
    uint32_t values = cg_param_state(b, "v_scales", CG_STATE_VALUE_SCALES, SMELT_DTYPE_F32);
    b->params[keys].is_const = b->params[values].is_const = true; /* read here */
}

void attention_define_scales(cg_text *t, const attention_shape *s) {
    if (!s->scaled) return;
    cg_line(t, "#define KEY_SCALE(p) k_scales[(long long)(p) * KV_HEADS + kv_head] /* f8e4m3 rows */");
    cg_line(t, "#define VALUE_SCALE(p) v_scales[(long long)(p) * KV_HEADS + kv_head]");
}

prog_affine attention_decode_steps(void) {
    /* ceil((D + 1 - T) / (D + 1)): 1 for T in [1, D], 0 above */
    return (prog_affine){-1, ATTENTION_DECODE_MAX_TOKENS + 1, ATTENTION_DECODE_MAX_TOKENS + 1};
}

prog_affine attention_prefill_steps(void) {
    /* ceil((T - D) / 2^30): 0 for T <= D, 1 above (T is far below 2^30) */
    return (prog_affine){1, -ATTENTION_DECODE_MAX_TOKENS, (int64_t)1 << 30};
}

void attention_write_template(cg_text *t, const char *text) {
    attention_write_filled_template(t, text, NULL, 0);
}

static bool is_hole_letter(char c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_'; }

void attention_write_filled_template(cg_text *t, const char *text, const attention_hole *holes,
                                     int hole_count) {
    cg_text line;
    cg_text_init(&line);
    while (*text) {
        const char *end = strchr(text, '\n');
        if (!end) end = text + strlen(text);
        const char *at = text;
        while (at < end && *at == ' ')
            at++;
        bool filled = false; /* the line had a hole */
        line.length = 0;
        while (at < end) {
            const char *dollar = memchr(at, '$', (size_t)(end - at));
            if (!dollar) dollar = end;
            if (dollar > at) cg_text_printf(&line, "%.*s", (int)(dollar - at), at);
            if (dollar == end) break;
            const char *name = dollar + 1, *name_end = name;
            while (name_end < end && is_hole_letter(*name_end))
                name_end++;
            int i = 0;
            while (i < hole_count && (strncmp(holes[i].name, name, (size_t)(name_end - name)) != 0 ||
                                      holes[i].name[name_end - name] != '\0'))
                i++;
            if (i == hole_count)
                SMELT_DIE("a template hole without its text: $%.*s", (int)(name_end - name), name);
            cg_text_printf(&line, "%s", holes[i].text);
            filled = true;
            at = name_end;
        }
        if (line.length > 0)
            cg_line(t, "%s", line.data);
        else if (!filled)
            cg_blank(t);
        text = *end ? end + 1 : end;
    }
    cg_text_free(&line);
}

const char *attention_without_semicolon(cg_emit *e, const char *statement) {
    size_t n = strlen(statement);
    return arena_printf(&e->scratch, "%.*s", (int)(n && statement[n - 1] == ';' ? n - 1 : n), statement);
}

bool attention_rows_vectorizable(int64_t dims, smelt_dtype t) {
    return (dims * (int64_t)smelt_dtype_element_bytes(t)) % 16 == 0;
}

/* The scalar kernel; `steps` is the grid rule of the steps it serves. */
static void emit_attend(cg_emit *e, const attention_shape *s, prog_affine steps) {
    ir_value_id q = cg_operand(e, 0), result = cg_result(e, 0);
    const char *kernel_name = attention_kernel_name(e, s, "attention");
    cg_kernel_builder b;
    cg_kernel_begin(
        &b, e, kernel_name,
        "One block per (token, query head): an online softmax over the written cache positions the "
        "query sees, in tiles of TILE positions, one warp per position's dot product.");
    uint32_t q_param = cg_param_value(&b, "q", q, true);
    cg_param_value(&b, "pos", cg_operand(e, 3), true);
    uint32_t k_cache = cg_param_state(&b, "k_cache", CG_STATE_KEYS, s->key_dtype);
    uint32_t v_cache = cg_param_state(&b, "v_cache", CG_STATE_VALUES, s->value_dtype);
    uint32_t written = cg_param_state(&b, "written", CG_STATE_WRITTEN, SMELT_DTYPE_I32);
    uint32_t out = cg_param_value(&b, "out", result, false);
    attention_scale_params(&b, s);
    b.params[k_cache].is_const = b.params[v_cache].is_const = b.params[written].is_const =
        true; /* read here */
    cg_kernel_launch(&b, cg_count_blocks(s->tokens, 1), (prog_affine){0, s->query_heads, 1},
                     ATTENTION_THREADS);
    b.k->rule.grid[2] = steps;
    cg_kernel_open(&b);
    cg_text *t = &b.text;
    cg_line(t, "enum { QUERY_HEADS = %lld, KV_HEADS = %lld, GROUP = QUERY_HEADS / KV_HEADS };",
            (long long)s->query_heads, (long long)s->kv_heads);
    cg_line(t, "enum { HEAD_DIM = %lld, VALUE_DIM = %lld, MAX_SEQ = %lld, WINDOW = %lld, CAUSAL = %d };",
            (long long)s->head_dim, (long long)s->value_dim, (long long)s->max_seq, (long long)s->window,
            s->causal ? 1 : 0);
    cg_line(t, "enum { THREADS = %d, WARPS = THREADS / 32, TILE = %d };", ATTENTION_THREADS, ATTENTION_TILE);
    cg_line(t, "enum { VALUES_PER_THREAD = (VALUE_DIM + THREADS - 1) / THREADS }; /* value dims each thread "
               "owns */");
    cg_line(t, "#define SCALE %s", cg_float_literal(e, s->scale));
    if (s->softcap > 0)
        cg_line(t, "#define SOFTCAP %s /* scores become SOFTCAP * tanh(score / SOFTCAP) */",
                cg_float_literal(e, s->softcap));
    if (s->scaled) attention_define_scales(t, s);
    cg_blank(t);
    cg_write_warp_sum(t);
    cg_kernel_signature(&b);
    cg_line(t, "__shared__ float query[HEAD_DIM];");
    cg_line(t, "__shared__ float scores[TILE];");
    cg_line(t, "long long token = blockIdx.x;");
    cg_line(t, "int head = blockIdx.y, kv_head = head / GROUP;");
    cg_line(t, "int lane = threadIdx.x %% 32, warp = threadIdx.x / 32;");
    cg_line(t, "int at = pos[token];");
    cg_line(t, "/* the positions this query sees: [first, last], written ones only */");
    cg_line(t, "int last = CAUSAL ? at : MAX_SEQ - 1;");
    cg_line(t, "if (last > MAX_SEQ - 1)");
    cg_line(t, "    last = MAX_SEQ - 1;");
    cg_line(t, "int first = 0;");
    cg_line(t, "if (WINDOW > 0 && at + 1 > WINDOW)");
    cg_line(t, "    first = at + 1 - WINDOW;");
    cg_line(t, "for (int i = threadIdx.x; i < HEAD_DIM; i += THREADS)");
    cg_line(t, "    query[i] = %s;", cg_load(&b, q_param, "(token * QUERY_HEADS + head) * HEAD_DIM + i"));
    cg_line(t, "__syncthreads();");
    cg_blank(t);
    cg_line(t, "float running_max = %s, running_sum = 0.0f;", CG_NEGATIVE_INFINITY);
    cg_line(t, "float accumulator[VALUES_PER_THREAD];");
    cg_line(t, "for (int j = 0; j < VALUES_PER_THREAD; j++)");
    cg_line(t, "    accumulator[j] = 0.0f;");
    cg_line(t, "for (int tile = first; tile <= last; tile += TILE) {");
    cg_line(t, "/* scores of the tile's positions; warp w takes positions w, w + WARPS, ... */");
    cg_line(t, "for (int j = warp; j < TILE; j += WARPS) {");
    cg_line(t, "int p = tile + j;");
    cg_line(t, "float score = %s;", CG_NEGATIVE_INFINITY);
    cg_line(t, "if (p <= last && written[p]) {");
    cg_line(t, "long long row = ((long long)p * KV_HEADS + kv_head) * HEAD_DIM;");
    cg_line(t, "float dot = 0.0f;");
    cg_line(t, "for (int i = lane; i < HEAD_DIM; i += 32)");
    cg_line(t, "    dot += query[i] * %s;", cg_load(&b, k_cache, "row + i"));
    cg_line(t,
            s->scaled ? "score = warp_sum(dot) * KEY_SCALE(p) * SCALE;" : "score = warp_sum(dot) * SCALE;");
    if (s->softcap > 0) cg_line(t, "score = SOFTCAP * tanhf(score / SOFTCAP);");
    cg_line(t, "}");
    cg_line(t, "if (lane == 0)");
    cg_line(t, "    scores[j] = score;");
    cg_line(t, "}");
    cg_line(t, "__syncthreads();");
    cg_blank(t);
    cg_line(t, "/* fold the tile into the online softmax (every thread, the same numbers) */");
    cg_line(t, "float tile_max = %s;", CG_NEGATIVE_INFINITY);
    cg_line(t, "for (int j = 0; j < TILE; j++)");
    cg_line(t, "    tile_max = fmaxf(tile_max, scores[j]);");
    cg_line(t, "if (tile_max > %s) {", CG_NEGATIVE_INFINITY);
    cg_line(t, "float new_max = fmaxf(running_max, tile_max);");
    cg_line(t, "float correction = expf(running_max - new_max); /* 0 for the first tile seen */");
    cg_line(t, "running_sum *= correction;");
    cg_line(t, "for (int j = 0; j < VALUES_PER_THREAD; j++)");
    cg_line(t, "    accumulator[j] *= correction;");
    cg_line(t, "for (int j = 0; j < TILE; j++) {");
    cg_line(t, "if (!(scores[j] > %s))", CG_NEGATIVE_INFINITY);
    cg_line(t, "    continue;");
    cg_line(t, "float weight = expf(scores[j] - new_max);");
    cg_line(t, "long long row = ((long long)(tile + j) * KV_HEADS + kv_head) * VALUE_DIM;");
    cg_line(t, "running_sum += weight;");
    if (s->scaled) cg_line(t, "weight *= VALUE_SCALE(tile + j); /* the values are codes of the row */");
    cg_line(t, "for (int v = 0; v < VALUES_PER_THREAD; v++) {");
    cg_line(t, "int d = threadIdx.x + v * THREADS;");
    cg_line(t, "if (d < VALUE_DIM)");
    cg_line(t, "    accumulator[v] += weight * %s;", cg_load(&b, v_cache, "row + d"));
    cg_line(t, "}");
    cg_line(t, "}");
    cg_line(t, "running_max = new_max;");
    cg_line(t, "}");
    cg_line(t, "__syncthreads(); /* scores is rewritten by the next tile */");
    cg_line(t, "}");
    cg_blank(t);
    cg_line(t, "/* running_sum >= 1 (the query's own position) unless the position was out of range */");
    cg_line(t, "for (int v = 0; v < VALUES_PER_THREAD; v++) {");
    cg_line(t, "int d = threadIdx.x + v * THREADS;");
    cg_line(t, "if (d < VALUE_DIM)");
    cg_line(t, "    %s",
            cg_store(&b, out, "(token * QUERY_HEADS + head) * VALUE_DIM + d",
                     "running_sum > 0.0f ? accumulator[v] / running_sum : 0.0f"));
    cg_line(t, "}");
    cg_kernel_end(&b);
}

/* The modeled cost of an attention kernel (plan/program.h, "The cost
 * model"). Positions attended: T*C + T(T+1)/2 under the causal mask (each
 * query sees the cached positions and those of its step up to its own),
 * R (C + R) for R query rows otherwise, scanning all max_seq written
 * flags; a window only shortens this, which the model ignores (an upper
 * bound). Flops 2 (D + Dv) per query head and position.
 * Keys and values: the scalar kernel (per_group false) reads a kv row for
 * every query head and position it attends; the split-KV decode and the
 * FlashAttention-2 kernels read each cached row once per kv head (the
 * decode kernel by construction, the prefill one through L2, where the
 * blocks of a GQA group and of neighbouring query tiles share the tiles). */
static const prog_cost *attention_cost(cg_emit *e, const attention_shape *s, bool per_group,
                                       bool tensor_cores) {
    double a = (double)s->tokens.per_token, b = (double)s->tokens.constant;
    double heads = (double)s->query_heads, d = (double)s->head_dim, dv = (double)s->value_dim;
    prog_poly attended = s->causal ? (prog_poly){.constant = (b * b + b) / 2,
                                                 .per_token = a * b + a / 2,
                                                 .per_context = b,
                                                 .per_token_context = a,
                                                 .per_token_squared = a * a / 2}
                                   : (prog_poly){.constant = b * b,
                                                 .per_token = 2 * a * b,
                                                 .per_context = b,
                                                 .per_token_context = a,
                                                 .per_token_squared = a * a};
    prog_poly scanned =
        s->causal ? attended : (prog_poly){.constant = b * s->max_seq, .per_token = a * s->max_seq};
    /* rows of the cache a step touches: C + T (causal), max_seq otherwise */
    prog_poly cached = s->causal ? (prog_poly){.constant = b, .per_token = a, .per_context = 1}
                                 : (prog_poly){.constant = (double)s->max_seq};
    double kv_row = d * smelt_dtype_element_bytes(s->key_dtype) +
                    dv * smelt_dtype_element_bytes(s->value_dtype) + (s->scaled ? 2 * 4 : 0); /* + scales */
    double flag = smelt_dtype_element_bytes(SMELT_DTYPE_I32);
    double q_row = heads * (d * smelt_dtype_element_bytes(cg_storage_dtype(e->m, cg_operand(e, 0))) +
                            smelt_dtype_element_bytes(cg_storage_dtype(e->m, cg_operand(e, 3))));
    double out_row = heads * dv * smelt_dtype_element_bytes(cg_storage_dtype(e->m, cg_result(e, 0)));
    prog_poly rows = {.constant = b, .per_token = a};
    prog_poly kv = per_group ? prog_poly_sum(prog_poly_scaled(cached, (double)s->kv_heads * kv_row),
                                             prog_poly_scaled(cached, flag))
                             : prog_poly_sum(prog_poly_scaled(attended, heads * kv_row),
                                             prog_poly_scaled(scanned, heads * flag));
    prog_cost *cost = arena_alloc(e->a, sizeof *cost);
    cost->read = prog_poly_sum(kv, prog_poly_scaled(rows, q_row));
    cost->written = prog_poly_scaled(rows, out_row);
    cost->flops = prog_poly_scaled(attended, heads * 2 * (d + dv));
    cost->tensor_cores = tensor_cores;
    return cost;
}

bool cg_emit_attention(cg_emit *e) {
    attention_shape s;
    if (!read_shape(e, &s)) return false;
    uint64_t bytes[CG_MAX_STATES];
    if (!cache_bytes(s.max_seq, s.kv_heads, s.head_dim, s.key_dtype, &bytes[CG_STATE_KEYS]) ||
        !cache_bytes(s.max_seq, s.kv_heads, s.value_dim, s.value_dtype, &bytes[CG_STATE_VALUES]) ||
        !cache_bytes(s.max_seq, 1, 1, SMELT_DTYPE_I32, &bytes[CG_STATE_WRITTEN]) ||
        !cache_bytes(s.max_seq, s.kv_heads, 1, SMELT_DTYPE_F32, &bytes[CG_STATE_KEY_SCALES]) ||
        !cache_bytes(s.max_seq, s.kv_heads, 1, SMELT_DTYPE_F32, &bytes[CG_STATE_VALUE_SCALES])) {
        diag_error(e->d, e->ir->loc, "attention: the KV cache of max_seq %lld positions is too large",
                   (long long)s.max_seq);
        return false;
    }
    bool decode = attention_decode_supported(&s), prefill = attention_prefill_supported(&s);
    bytes[CG_STATE_PARTIALS] = decode ? attention_decode_partial_bytes(&s) : 0;
    bytes[CG_STATE_COUNTERS] = decode ? attention_decode_counter_bytes(&s) : 0;
    e->out->kind = CG_LOWER_KERNELS;
    e->out->state_count = s.scaled ? CG_MAX_STATES : decode ? CG_STATE_COUNTERS + 1 : CG_STATE_WRITTEN + 1;
    for (uint32_t i = 0; i < e->out->state_count; i++) {
        bool by_position = i <= CG_STATE_WRITTEN || i >= CG_STATE_KEY_SCALES;
        e->out->state_bytes[i] = bytes[i];
        e->out->state_rows[i] = by_position ? (uint64_t)s.max_seq : 0;
    }
    /* A GEMV epilogue writes the cache in steps of at most cache_written_upto
     * tokens (passes/fuse.c); kv_write runs only in larger ones. */
    int64_t written_upto = cg_attr_int(e, "cache_written_upto", 0);
    if (written_upto == 0 || written_upto < e->m->planned_tokens) {
        emit_kv_write(e, &s);
        e->out->kernels[e->out->kernel_count - 1].min_tokens = written_upto > 0 ? written_upto + 1 : 0;
    }
    /* Every step runs exactly one of the attention kernels below. */
    prog_affine every_step = {0, 1, 1};
    if (decode) {
        emit_attention_decode(e, &s);
        e->out->kernels[e->out->kernel_count - 1].cost = attention_cost(e, &s, true, false);
    }
    prog_affine longer_steps = decode ? attention_prefill_steps() : every_step;
    if (prefill) {
        emit_attention_prefill(e, &s, longer_steps);
        e->out->kernels[e->out->kernel_count - 1].cost = attention_cost(e, &s, true, true);
    } else {
        emit_attend(e, &s, longer_steps);
        e->out->kernels[e->out->kernel_count - 1].cost = attention_cost(e, &s, false, false);
    }
    return true;
}
