/* emit_attention_decode.c - split-KV flash decoding: the attention of a step
 * of at most ATTENTION_DECODE_MAX_TOKENS tokens (emit_attention.h).
 *
 * A decode step has one query per sequence: one block per (token, query
 * head) would be 32 blocks on an H100's 132 SMs, each streaming the whole
 * context alone. Here the positions a query sees are split into SPLITS
 * chunks, and a block takes one (split, kv head, token):
 *
 *   - the GROUP query heads that share the kv head are all in the block, so
 *     each key and value row is read once per group, not once per head;
 *   - rows are read 16 bytes at a time (uint4: 8 bf16 or f16, 4 f32 or 16 f8e4m3
 *     codes — the PTX has ld.global.v4), each thread scoring one position of a tile of
 *     THREADS positions for every head of the group, then (value chunk,
 *     key lane) threads folding the tile's values into an online softmax;
 *   - each split ends with its unnormalised output, max and sum per head in
 *     the partials workspace; the last block of a (token, kv head) to
 *     finish (an atomic counter, set back to 0 by that block) merges the
 *     splits, so a layer's decode attention is one launch.
 *
 * An f8e4m3 cache (kv_dtype) is read as codes widened in registers; a
 * position's key scale multiplies its score and its value scale its softmax
 * weight (KEY_SCALE, VALUE_SCALE: emit_attention.h), never each element.
 *
 * The split of a context is chosen per step from the positions themselves:
 * a short context uses fewer splits (chunks of at least 32 positions) and
 * the blocks without a chunk only count themselves done.
 */
#include "emit_attention.h"

enum {
    DECODE_THREADS = 128,
    /* Blocks to aim for at batch 1: two per SM of an H100 / H200 (132 SMs). */
    DECODE_TARGET_BLOCKS = 2 * 132,
    DECODE_MIN_CHUNK = 32,         /* positions: a split below this is not worth its merge */
    DECODE_MAX_SHARED = 44 * 1024, /* static shared bytes, below CUDA's 48 KiB */
};

/* The splits of an op: enough blocks to fill the target at batch 1, no more
 * than the cache has chunks of DECODE_MIN_CHUNK positions. */
static int64_t decode_splits(const attention_shape *s) {
    int64_t splits = (DECODE_TARGET_BLOCKS + s->kv_heads - 1) / s->kv_heads;
    int64_t most = (s->max_seq + DECODE_MIN_CHUNK - 1) / DECODE_MIN_CHUNK;
    if (splits > most) splits = most;
    return splits < 1 ? 1 : splits;
}

static int64_t vector_elements(smelt_dtype t) { return 16 / (int64_t)smelt_dtype_element_bytes(t); }

/* The kernel's static shared memory: query[GROUP][D], weights[GROUP][TILE]
 * and merged[KEY_LANES][GROUP * Dv] floats. */
static int64_t decode_shared_bytes(const attention_shape *s) {
    int64_t group = s->query_heads / s->kv_heads;
    int64_t value_chunks = s->value_dim / vector_elements(s->value_dtype);
    int64_t key_lanes = value_chunks > 0 ? DECODE_THREADS / value_chunks : 0;
    return 4 * group * (s->head_dim + DECODE_THREADS + key_lanes * s->value_dim);
}

bool attention_decode_supported(const attention_shape *s) {
    int64_t group = s->query_heads / s->kv_heads;
    /* Rows read as uint4, every value chunk owned by a thread, and the
     * group's query, scores and merged output in static shared memory. */
    bool keys = s->key_dtype == SMELT_DTYPE_BF16 || s->key_dtype == SMELT_DTYPE_F16 ||
                s->key_dtype == SMELT_DTYPE_F32 || s->key_dtype == SMELT_DTYPE_F8E4M3;
    bool values = s->value_dtype == SMELT_DTYPE_BF16 || s->value_dtype == SMELT_DTYPE_F16 ||
                  s->value_dtype == SMELT_DTYPE_F32 || s->value_dtype == SMELT_DTYPE_F8E4M3;
    return keys && values && attention_rows_vectorizable(s->head_dim, s->key_dtype) &&
           attention_rows_vectorizable(s->value_dim, s->value_dtype) &&
           s->value_dim / vector_elements(s->value_dtype) <= DECODE_THREADS && group <= 16 &&
           decode_shared_bytes(s) <= DECODE_MAX_SHARED;
}

uint64_t attention_decode_partial_bytes(const attention_shape *s) {
    /* [MAX_TOKENS, Hkv, SPLITS, GROUP * (Dv + 2)] f32: bounded by read_shape */
    uint64_t group = (uint64_t)(s->query_heads / s->kv_heads);
    return (uint64_t)ATTENTION_DECODE_MAX_TOKENS * (uint64_t)s->kv_heads * (uint64_t)decode_splits(s) *
           group * ((uint64_t)s->value_dim + 2) * 4;
}

uint64_t attention_decode_counter_bytes(const attention_shape *s) {
    return (uint64_t)ATTENTION_DECODE_MAX_TOKENS * (uint64_t)s->kv_heads * 4;
}

/* The kernel's body. Its holes ($times_key_scale, $value_scale,
 * $times_value_scale) apply an f8e4m3 cache's row scales; they are empty
 * for the other caches. */
static const char decode_body[] = "\
__shared__ float query[GROUP][HEAD_DIM];\n\
__shared__ float weights[GROUP][TILE]; /* a tile's scores, then their softmax weights */\n\
__shared__ float warp_partial[GROUP][WARPS];\n\
__shared__ float merged[KEY_LANES][GROUP * VALUE_DIM];\n\
__shared__ int is_last;\n\
int split = blockIdx.x % SPLITS, kv_head = blockIdx.x / SPLITS;\n\
long long token = blockIdx.y;\n\
int lane = threadIdx.x % 32, warp = threadIdx.x / 32;\n\
int value_chunk = threadIdx.x % VALUE_CHUNKS, key_lane = threadIdx.x / VALUE_CHUNKS;\n\
\n\
/* the positions this query sees, [first, last], and this split's share, [begin, end) */\n\
int at = pos[token];\n\
int last = CAUSAL ? at : MAX_SEQ - 1;\n\
if (last > MAX_SEQ - 1) {\n\
    last = MAX_SEQ - 1;\n\
}\n\
int first = 0;\n\
if (WINDOW > 0 && at + 1 > WINDOW) {\n\
    first = at + 1 - WINDOW;\n\
}\n\
int length = last >= first ? last - first + 1 : 0;\n\
int chunk = (length + SPLITS - 1) / SPLITS;\n\
chunk = (chunk + MIN_CHUNK - 1) / MIN_CHUNK * MIN_CHUNK;\n\
int begin = first + split * chunk;\n\
int end = smelt_min_i32(begin + chunk, last + 1);\n\
/* the splits with positions: 0 .. used - 1; the same in every block of the\n\
 * (token, kv head), so a split past them is empty in all its threads */\n\
int used = chunk > 0 ? (length + chunk - 1) / chunk : 0;\n\
long long group_row = (token * QUERY_HEADS + kv_head * GROUP) * VALUE_DIM;\n\
if (SPLITS == 1 && used == 0) {\n\
    for (int i = threadIdx.x; i < GROUP * VALUE_DIM; i += THREADS) {\n\
        STORE_OUTPUT(group_row + i, 0.0f); /* no position to attend */\n\
    }\n\
    return;\n\
}\n\
/* An empty split writes no partial (the merge reads the used ones only)\n\
 * and only counts itself done: one barrier, no reduction. */\n\
if (split < used) {\n\
    for (int i = threadIdx.x; i < GROUP * HEAD_DIM; i += THREADS) {\n\
        query[i / HEAD_DIM][i % HEAD_DIM] = LOAD_QUERY((token * QUERY_HEADS + kv_head * GROUP) * HEAD_DIM + i);\n\
    }\n\
    __syncthreads();\n\
\n\
    /* The online softmax: the running max is the same in every thread; each\n\
     * thread sums the weights of its own positions (merged at the end). */\n\
    float running_max[GROUP], running_sum[GROUP], accumulator[GROUP][VALUE_VEC];\n\
    for (int h = 0; h < GROUP; h++) {\n\
        running_max[h] = NEGATIVE_INFINITY;\n\
        running_sum[h] = 0.0f;\n\
        for (int e = 0; e < VALUE_VEC; e++) {\n\
            accumulator[h][e] = 0.0f;\n\
        }\n\
    }\n\
    for (int tile = begin; tile < end; tile += TILE) {\n\
        /* 1. thread j scores position tile + j for every head of the group */\n\
        int p = tile + threadIdx.x;\n\
        float score[GROUP];\n\
        for (int h = 0; h < GROUP; h++) {\n\
            score[h] = NEGATIVE_INFINITY;\n\
        }\n\
        if (p < end && written[p]) {\n\
            const uint4 *row = (const uint4 *)(k_cache + ((long long)p * KV_HEADS + kv_head) * HEAD_DIM);\n\
            float dot[GROUP];\n\
            for (int h = 0; h < GROUP; h++) {\n\
                dot[h] = 0.0f;\n\
            }\n\
            for (int c = 0; c < HEAD_DIM / KEY_VEC; c++) {\n\
                float key[KEY_VEC];\n\
                UNPACK_KEYS(row[c], key);\n\
                for (int h = 0; h < GROUP; h++) {\n\
                    for (int e = 0; e < KEY_VEC; e++) {\n\
                        dot[h] += query[h][c * KEY_VEC + e] * key[e];\n\
                    }\n\
                }\n\
            }\n\
            for (int h = 0; h < GROUP; h++) {\n\
                score[h] = CAPPED(dot[h]$times_key_scale * SCALE);\n\
            }\n\
        }\n\
        /* 2. the tile's max per head, and each position's weight (a warp\n\
         *    wholly past the split's end has only -inf scores: no shuffles) */\n\
        int warp_sees = tile + warp * 32 < end;\n\
        for (int h = 0; h < GROUP; h++) {\n\
            float most = NEGATIVE_INFINITY;\n\
            if (warp_sees) {\n\
                most = warp_max(score[h]);\n\
            }\n\
            if (lane == 0) {\n\
                warp_partial[h][warp] = most;\n\
            }\n\
        }\n\
        __syncthreads();\n\
        float correction[GROUP];\n\
        for (int h = 0; h < GROUP; h++) {\n\
            float new_max = running_max[h];\n\
            for (int w = 0; w < WARPS; w++) {\n\
                new_max = fmaxf(new_max, warp_partial[h][w]);\n\
            }\n\
            /* 0 for the first tile that sees a position; 1 while none is seen */\n\
            correction[h] = new_max > NEGATIVE_INFINITY ? expf(running_max[h] - new_max) : 1.0f;\n\
            float weight = score[h] > NEGATIVE_INFINITY ? expf(score[h] - new_max) : 0.0f;\n\
            weights[h][threadIdx.x] = weight;\n\
            running_sum[h] = running_sum[h] * correction[h] + weight;\n\
            running_max[h] = new_max;\n\
        }\n\
        __syncthreads();\n\
        /* 3. thread (key lane, value chunk) folds the values of positions\n\
         *    key_lane, key_lane + KEY_LANES, ... of the tile */\n\
        if (key_lane < KEY_LANES) {\n\
            for (int h = 0; h < GROUP; h++) {\n\
                for (int e = 0; e < VALUE_VEC; e++) {\n\
                    accumulator[h][e] *= correction[h];\n\
                }\n\
            }\n\
            for (int j = key_lane; j < TILE && tile + j < end; j += KEY_LANES) {\n\
                const uint4 *row =\n\
                    (const uint4 *)(v_cache + ((long long)(tile + j) * KV_HEADS + kv_head) * VALUE_DIM);\n\
                float value[VALUE_VEC];\n\
                UNPACK_VALUES(row[value_chunk], value);\n\
                $value_scale\n\
                for (int h = 0; h < GROUP; h++) {\n\
                    float weight = weights[h][j]$times_value_scale;\n\
                    for (int e = 0; e < VALUE_VEC; e++) {\n\
                        accumulator[h][e] += weight * value[e];\n\
                    }\n\
                }\n\
            }\n\
        }\n\
        __syncthreads(); /* weights is rewritten by the next tile */\n\
    }\n\
\n\
    /* 4. this split's result: the key lanes' accumulators and the threads' sums merged */\n\
    if (key_lane < KEY_LANES) {\n\
        for (int h = 0; h < GROUP; h++) {\n\
            for (int e = 0; e < VALUE_VEC; e++) {\n\
                merged[key_lane][h * VALUE_DIM + value_chunk * VALUE_VEC + e] = accumulator[h][e];\n\
            }\n\
        }\n\
    }\n\
    /* a warp that saw no position of any tile summed only zeros */\n\
    int warp_saw = begin + warp * 32 < end;\n\
    for (int h = 0; h < GROUP; h++) {\n\
        float sum = 0.0f;\n\
        if (warp_saw) {\n\
            sum = warp_sum(running_sum[h]);\n\
        }\n\
        if (lane == 0) {\n\
            warp_partial[h][warp] = sum;\n\
        }\n\
    }\n\
    __syncthreads();\n\
    if (SPLITS == 1) {\n\
        for (int i = threadIdx.x; i < GROUP * VALUE_DIM; i += THREADS) {\n\
            float sum = 0.0f, value = 0.0f;\n\
            for (int w = 0; w < WARPS; w++) {\n\
                sum += warp_partial[i / VALUE_DIM][w];\n\
            }\n\
            for (int k = 0; k < KEY_LANES; k++) {\n\
                value += merged[k][i];\n\
            }\n\
            STORE_OUTPUT(group_row + i, sum > 0.0f ? value / sum : 0.0f);\n\
        }\n\
        return;\n\
    }\n\
    float *partial = partials + ((token * KV_HEADS + kv_head) * SPLITS + split) * PARTIAL;\n\
    for (int i = threadIdx.x; i < GROUP * VALUE_DIM; i += THREADS) {\n\
        float value = 0.0f;\n\
        for (int k = 0; k < KEY_LANES; k++) {\n\
            value += merged[k][i];\n\
        }\n\
        partial[i] = value;\n\
    }\n\
    if (threadIdx.x == 0) {\n\
        for (int h = 0; h < GROUP; h++) {\n\
            float sum = 0.0f;\n\
            for (int w = 0; w < WARPS; w++) {\n\
                sum += warp_partial[h][w];\n\
            }\n\
            partial[GROUP * VALUE_DIM + h] = running_max[h];\n\
            partial[GROUP * VALUE_DIM + GROUP + h] = sum;\n\
        }\n\
    }\n\
\n\
    __threadfence(); /* this split's partial is visible before it counts itself done */\n\
    __syncthreads();\n\
}\n\
\n\
/* 5. the last split of this (token, kv head) to finish, empty or not, merges\n\
 *    the used ones (every split counts itself, so SPLITS counts are the end) */\n\
if (threadIdx.x == 0) {\n\
    int done = smelt_atomic_add_i32(&counters[token * KV_HEADS + kv_head], 1);\n\
    is_last = done == SPLITS - 1;\n\
}\n\
__syncthreads();\n\
if (!is_last) {\n\
    return;\n\
}\n\
__threadfence();\n\
/* written by other blocks in this launch: read past the L1 */\n\
const volatile float *all = partials + (token * KV_HEADS + kv_head) * SPLITS * PARTIAL;\n\
for (int i = threadIdx.x; i < GROUP * VALUE_DIM; i += THREADS) {\n\
    int h = i / VALUE_DIM;\n\
    float most = NEGATIVE_INFINITY;\n\
    for (int s = 0; s < used; s++) {\n\
        if (all[s * PARTIAL + GROUP * VALUE_DIM + GROUP + h] > 0.0f) {\n\
            most = fmaxf(most, all[s * PARTIAL + GROUP * VALUE_DIM + h]);\n\
        }\n\
    }\n\
    float sum = 0.0f, value = 0.0f;\n\
    for (int s = 0; s < used; s++) {\n\
        float split_sum = all[s * PARTIAL + GROUP * VALUE_DIM + GROUP + h];\n\
        if (split_sum > 0.0f) {\n\
            float rescale = expf(all[s * PARTIAL + GROUP * VALUE_DIM + h] - most);\n\
            sum += split_sum * rescale;\n\
            value += all[s * PARTIAL + i] * rescale;\n\
        }\n\
    }\n\
    STORE_OUTPUT(group_row + i, sum > 0.0f ? value / sum : 0.0f);\n\
}\n\
if (threadIdx.x == 0) {\n\
    counters[token * KV_HEADS + kv_head] = 0; /* ready for the next step */\n\
}\n";

/* "smelt_unpack_bf16x8", "smelt_unpack_f16x8", "smelt_unpack_f32x4" or
 * "smelt_unpack_f8e4m3x16": a uint4 as floats (f8e4m3: the codes). */
static const char *unpacker(smelt_dtype t) {
    if (t == SMELT_DTYPE_F8E4M3) return "smelt_unpack_f8e4m3x16";
    if (t == SMELT_DTYPE_F16) return "smelt_unpack_f16x8";
    return t == SMELT_DTYPE_BF16 ? "smelt_unpack_bf16x8" : "smelt_unpack_f32x4";
}

void emit_attention_decode(cg_emit *e, const attention_shape *s) {
    int64_t splits = decode_splits(s);
    const char *name = attention_kernel_name(e, s, "attention_decode");
    cg_kernel_builder b;
    const char *summary = arena_printf(
        &e->scratch,
        "Split-KV flash decoding: one block per (split of the positions, kv head, token) with the query "
        "heads of the kv head's group, 16-byte loads of K and V, an online softmax per split, and the "
        "last split to finish merging them. A step of more than %d tokens launches no block (grid z is "
        "0): the prefill kernel takes it.",
        ATTENTION_DECODE_MAX_TOKENS);
    cg_kernel_begin(&b, e, arena_printf(&e->scratch, "%s_s%lld", name, (long long)splits), summary);
    uint32_t q = cg_param_value(&b, "q", cg_operand(e, 0), true);
    cg_param_value(&b, "pos", cg_operand(e, 3), true);
    uint32_t k_cache = cg_param_state(&b, "k_cache", CG_STATE_KEYS, s->key_dtype);
    uint32_t v_cache = cg_param_state(&b, "v_cache", CG_STATE_VALUES, s->value_dtype);
    uint32_t written = cg_param_state(&b, "written", CG_STATE_WRITTEN, SMELT_DTYPE_I32);
    cg_param_state(&b, "partials", CG_STATE_PARTIALS, SMELT_DTYPE_F32);
    cg_param_state(&b, "counters", CG_STATE_COUNTERS, SMELT_DTYPE_I32);
    uint32_t out = cg_param_value(&b, "out", cg_result(e, 0), false);
    attention_scale_params(&b, s);
    b.params[k_cache].is_const = b.params[v_cache].is_const = b.params[written].is_const = true;
    cg_kernel_launch(&b, (prog_affine){0, splits * s->kv_heads, 1}, cg_count_blocks(s->tokens, 1),
                     DECODE_THREADS);
    b.k->rule.grid[2] = attention_decode_steps();
    cg_kernel_open(&b);
    cg_text *t = &b.text;
    cg_line(t, "enum { QUERY_HEADS = %lld, KV_HEADS = %lld, GROUP = QUERY_HEADS / KV_HEADS };",
            (long long)s->query_heads, (long long)s->kv_heads);
    cg_line(t, "enum { HEAD_DIM = %lld, VALUE_DIM = %lld, MAX_SEQ = %lld, WINDOW = %lld, CAUSAL = %d };",
            (long long)s->head_dim, (long long)s->value_dim, (long long)s->max_seq, (long long)s->window,
            s->causal ? 1 : 0);
    cg_line(t, "enum { THREADS = %d, WARPS = THREADS / 32, TILE = THREADS, SPLITS = %lld, MIN_CHUNK = %d };",
            DECODE_THREADS, (long long)splits, DECODE_MIN_CHUNK);
    cg_line(t, "enum { KEY_VEC = %lld, VALUE_VEC = %lld }; /* elements per 16-byte load */",
            (long long)vector_elements(s->key_dtype), (long long)vector_elements(s->value_dtype));
    cg_line(t, "enum { VALUE_CHUNKS = VALUE_DIM / VALUE_VEC, KEY_LANES = THREADS / VALUE_CHUNKS };");
    cg_line(t,
            "enum { PARTIAL = GROUP * (VALUE_DIM + 2) }; /* floats per split: output, max, sum per head */");
    attention_define_scoring(e, t, s);
    cg_line(t, "#define NEGATIVE_INFINITY %s", CG_NEGATIVE_INFINITY);
    cg_line(t, "#define LOAD_QUERY(i) %s", cg_load(&b, q, "(i)"));
    cg_line(t, "#define STORE_OUTPUT(i, value) %s",
            attention_without_semicolon(e, cg_store(&b, out, "(i)", "(value)")));
    cg_line(t, "#define UNPACK_KEYS(chunk, key) %s((chunk), (key))", unpacker(s->key_dtype));
    cg_line(t, "#define UNPACK_VALUES(chunk, value) %s((chunk), (value))", unpacker(s->value_dtype));
    attention_define_scales(t, s);
    cg_blank(t);
    cg_write_warp_sum(t);
    cg_write_warp_max(t);
    cg_kernel_signature(&b);
    /* the rows' scales of an f8e4m3 cache; nothing for the others */
    attention_hole holes[] = {
        {"times_key_scale", s->scaled ? " * KEY_SCALE(p)" : ""},
        {"value_scale", s->scaled ? "float value_scale = VALUE_SCALE(tile + j);" : ""},
        {"times_value_scale", s->scaled ? " * value_scale" : ""},
    };
    attention_write_filled_template(t, decode_body, holes, sizeof holes / sizeof holes[0]);
    cg_kernel_end(&b);
}
