/* emit_attention_prefill.c - FlashAttention-2 on tensor cores: the attention
 * of a step of many tokens over bf16 or f16 caches (emit_attention.h).
 *
 * One block of WARPS warps per (tile of ROWS query tokens, query head); each
 * warp owns 16 query rows. Per tile of KEYS cache positions:
 *
 *   S = Q K^T      mma.m16n8k16 (bf16 or f16 in: the activations' dtype, the
 *                  tiles' in shared memory; f32 accumulate): Q and K fragments
 *                  by ldmatrix.x4 from shared memory;
 *   online softmax on S in registers, a row's max and sum reduced over the
 *                  four lanes that hold it; masked positions are -inf;
 *   O += P V       P rounded to the tiles' dtype straight from S's accumulator
 *                  fragment (an m16n8 C fragment pair is an m16k16 A fragment),
 *                  V's B fragments read from shared memory.
 *
 * K and V tiles are double-buffered: the next tile's cp.async copies are in
 * flight while this one is computed. Over f8e4m3 caches (kv_dtype) a tile
 * is loaded 16 codes (16 bytes) at a time into registers and widened to
 * the tiles' dtype in shared memory — exact: every E4M3 value is a bf16 and
 * an f16 — with the rows' scales beside them; a key scale multiplies the
 * scores of its position, a value scale the softmax weight that P V takes,
 * so the mma computes on the codes and the cache is read once, at 1 byte an element
 * (these loads are not asynchronous: the widening needs the registers, so
 * the next tile's loads overlap this one's mma only across warps and
 * blocks). Whole tiles outside every row's visible range (the causal mask,
 * the sliding window) are never loaded, and
 * a warp skips the mma of a tile its 16 rows cannot see. Shared rows are
 * padded by 8 elements so that ldmatrix's eight row addresses fall in
 * different banks.
 *
 * Not done here (yet): the GROUP query heads of a kv head share K/V tiles
 * only through L2 (one block per query head); V's fragments are built from
 * 16-bit shared loads rather than ldmatrix.trans.
 */
#include "emit_attention.h"

enum {
    PREFILL_THREADS = 128, /* 4 warps */
    PREFILL_ROWS = 64,     /* query tokens per block: 16 per warp */
    PREFILL_KEYS = 32,     /* cache positions per tile */
    PREFILL_PAD = 8,       /* 16-bit elements after each shared row */
    PREFILL_MAX_DIM = 256, /* the output accumulator is Dv / 2 floats a thread */
};

/* The 16-bit dtype of the shared tiles and the mma's operands: the
 * activations' (bf16 or f16; f8e4m3 caches are widened to it, exactly). */
static bool tile_dtype(const attention_shape *s, smelt_dtype *out) {
    *out = s->input_dtype;
    return s->input_dtype == SMELT_DTYPE_BF16 || s->input_dtype == SMELT_DTYPE_F16;
}

bool attention_prefill_supported(const attention_shape *s) {
    /* f8e4m3 caches of bf16 or f16 activations (an f32 plan keeps its scalar kernel) */
    smelt_dtype tile;
    if (!tile_dtype(s, &tile)) return false;
    bool fp8 =
        s->key_dtype == SMELT_DTYPE_F8E4M3 && s->value_dtype == SMELT_DTYPE_F8E4M3 && s->value_dim % 16 == 0;
    bool half = s->key_dtype == tile && s->value_dtype == tile;
    return (half || fp8) && s->head_dim % 16 == 0 && s->value_dim % 8 == 0 &&
           s->head_dim <= PREFILL_MAX_DIM && s->value_dim <= PREFILL_MAX_DIM;
}

/* The dynamic shared memory: the Q tile and two stages of K and V tiles, in 16-bit elements. */
static uint32_t prefill_shared_bytes(const attention_shape *s) {
    int64_t q = PREFILL_ROWS * (s->head_dim + PREFILL_PAD);
    int64_t k = PREFILL_KEYS * (s->head_dim + PREFILL_PAD), v = PREFILL_KEYS * (s->value_dim + PREFILL_PAD);
    return (uint32_t)(2 * (q + 2 * (k + v)));
}

static const char prefill_helpers[] = "\
/* Copies the K and V rows of positions [tile, tile + KEYS) of kv head\n\
 * kv_head into one stage (cp.async, 16 bytes a copy), and their written\n\
 * flags; rows past the cache are zeros. */\n\
SMELT_DEVICE void load_tile(tile_element *keys, tile_element *values, int *seen, const tile_element *k_cache,\n\
                            const tile_element *v_cache, const int *written, int tile, int kv_head)\n\
{\n\
    uint4 zero = {0u, 0u, 0u, 0u};\n\
    for (int i = threadIdx.x; i < KEYS * (HEAD_DIM / 8); i += THREADS) {\n\
        int row = i / (HEAD_DIM / 8), column = i % (HEAD_DIM / 8) * 8, p = tile + row;\n\
        tile_element *to = keys + row * K_STRIDE + column;\n\
        if (p < MAX_SEQ) {\n\
            smelt_cp_async_16(to, k_cache + ((long long)p * KV_HEADS + kv_head) * HEAD_DIM + column);\n\
        } else {\n\
            *(uint4 *)to = zero;\n\
        }\n\
    }\n\
    for (int i = threadIdx.x; i < KEYS * (VALUE_DIM / 8); i += THREADS) {\n\
        int row = i / (VALUE_DIM / 8), column = i % (VALUE_DIM / 8) * 8, p = tile + row;\n\
        tile_element *to = values + row * V_STRIDE + column;\n\
        if (p < MAX_SEQ) {\n\
            smelt_cp_async_16(to, v_cache + ((long long)p * KV_HEADS + kv_head) * VALUE_DIM + column);\n\
        } else {\n\
            *(uint4 *)to = zero;\n\
        }\n\
    }\n\
    for (int i = threadIdx.x; i < KEYS; i += THREADS) {\n\
        seen[i] = tile + i < MAX_SEQ ? written[tile + i] : 0;\n\
    }\n\
}\n\
\n";

static const char prefill_fp8_helpers[] = "\
/* Widens 16 f8e4m3 codes to the tiles' dtype (exactly) at `to`, 16-byte aligned in shared memory. */\n\
SMELT_DEVICE void store_codes(tile_element *to, uint4 chunk)\n\
{\n\
    float code[16];\n\
    smelt_unpack_f8e4m3x16(chunk, code);\n\
    uint32_t words[8];\n\
    for (int w = 0; w < 8; w++) {\n\
        words[w] = TILE_PAIR(TO_TILE_ELEMENT(code[2 * w]), TO_TILE_ELEMENT(code[2 * w + 1]));\n\
    }\n\
    uint4 low = {words[0], words[1], words[2], words[3]}, high = {words[4], words[5], words[6], words[7]};\n\
    *(uint4 *)to = low;\n\
    *(uint4 *)(to + 8) = high;\n\
}\n\
\n\
/* The K and V rows of positions [tile, tile + KEYS) of kv head kv_head\n\
 * into one stage: f8e4m3 codes read 16 a load (ld.global.v4), widened to\n\
 * the tiles' dtype, and the rows' scales and written flags; rows past the cache are\n\
 * zeros. */\n\
SMELT_DEVICE void load_tile(tile_element *keys, tile_element *values, int *seen, float *key_scale, float *value_scale,\n\
                            const smelt_f8e4m3 *k_cache, const smelt_f8e4m3 *v_cache, const int *written,\n\
                            const float *k_scales, const float *v_scales, int tile, int kv_head)\n\
{\n\
    uint4 zero = {0u, 0u, 0u, 0u};\n\
    for (int i = threadIdx.x; i < KEYS * (HEAD_DIM / 16); i += THREADS) {\n\
        int row = i / (HEAD_DIM / 16), column = i % (HEAD_DIM / 16) * 16, p = tile + row;\n\
        const uint4 *from = (const uint4 *)(k_cache + ((long long)p * KV_HEADS + kv_head) * HEAD_DIM + column);\n\
        store_codes(keys + row * K_STRIDE + column, p < MAX_SEQ ? *from : zero);\n\
    }\n\
    for (int i = threadIdx.x; i < KEYS * (VALUE_DIM / 16); i += THREADS) {\n\
        int row = i / (VALUE_DIM / 16), column = i % (VALUE_DIM / 16) * 16, p = tile + row;\n\
        const uint4 *from = (const uint4 *)(v_cache + ((long long)p * KV_HEADS + kv_head) * VALUE_DIM + column);\n\
        store_codes(values + row * V_STRIDE + column, p < MAX_SEQ ? *from : zero);\n\
    }\n\
    for (int i = threadIdx.x; i < KEYS; i += THREADS) {\n\
        int p = tile + i;\n\
        seen[i] = p < MAX_SEQ ? written[p] : 0;\n\
        key_scale[i] = p < MAX_SEQ ? k_scales[(long long)p * KV_HEADS + kv_head] : 0.0f;\n\
        value_scale[i] = p < MAX_SEQ ? v_scales[(long long)p * KV_HEADS + kv_head] : 0.0f;\n\
    }\n\
}\n\
\n";

static const char prefill_visible_range[] = "\
/* The positions query token `token` sees: [*first, *last] (empty past the step). */\n\
SMELT_DEVICE void visible_range(const int *pos, long long token, int rows, int *first, int *last)\n\
{\n\
    *first = 0x7fffffff;\n\
    *last = -1;\n\
    if (token < rows) {\n\
        int at = pos[token];\n\
        *last = smelt_min_i32(CAUSAL ? at : MAX_SEQ - 1, MAX_SEQ - 1);\n\
        *first = WINDOW > 0 && at + 1 > WINDOW ? at + 1 - WINDOW : 0;\n\
    }\n\
}\n\
\n";

/* The kernel's body. Its holes ($times_key_scale, $times_value_scale) apply
 * an f8e4m3 cache's row scales; they are empty for the other caches. */
static const char prefill_body[] = "\
SMELT_DYNAMIC_SHARED(tile_element, shared);\n\
tile_element *query = shared;                         /* [ROWS][Q_STRIDE] */\n\
tile_element *keys = query + ROWS * Q_STRIDE;         /* [2][KEYS][K_STRIDE] */\n\
tile_element *values = keys + 2 * KEYS * K_STRIDE;    /* [2][KEYS][V_STRIDE] */\n\
__shared__ int seen[2][KEYS];                         /* the tiles' written flags */\n\
__shared__ int block_range[2];                        /* the positions any row sees */\n\
long long row0 = (long long)blockIdx.x * ROWS;\n\
int head = blockIdx.y, kv_head = head / GROUP;\n\
int lane = threadIdx.x % 32, warp = threadIdx.x / 32;\n\
int group_id = lane / 4, thread_in_group = lane % 4; /* the mma fragment coordinates */\n\
\n\
for (int i = threadIdx.x; i < ROWS * HEAD_DIM; i += THREADS) {\n\
    int row = i / HEAD_DIM, d = i % HEAD_DIM;\n\
    float x = row0 + row < STEP_ROWS ? LOAD_QUERY(((row0 + row) * QUERY_HEADS + head) * HEAD_DIM + d) : 0.0f;\n\
    query[row * Q_STRIDE + d] = TO_TILE_ELEMENT(x);\n\
}\n\
/* This thread's two rows (group_id and group_id + 8 of its warp's 16) and\n\
 * what they see; the warp's and the block's union of that. */\n\
int row_first[2], row_last[2];\n\
for (int half = 0; half < 2; half++) {\n\
    visible_range(pos, row0 + warp * 16 + group_id + half * 8, STEP_ROWS, &row_first[half], &row_last[half]);\n\
}\n\
int warp_first = smelt_min_i32(row_first[0], row_first[1]), warp_last = smelt_max_i32(row_last[0], row_last[1]);\n\
for (int offset = 4; offset < 32; offset *= 2) {\n\
    warp_first = smelt_min_i32(warp_first, smelt_shfl_xor_i32(0xffffffffu, warp_first, offset));\n\
    warp_last = smelt_max_i32(warp_last, smelt_shfl_xor_i32(0xffffffffu, warp_last, offset));\n\
}\n\
if (threadIdx.x == 0) {\n\
    block_range[0] = -0x7fffffff; /* minus the first position */\n\
    block_range[1] = -1;\n\
}\n\
__syncthreads();\n\
if (lane == 0) {\n\
    smelt_atomic_max_i32(&block_range[0], -warp_first);\n\
    smelt_atomic_max_i32(&block_range[1], warp_last);\n\
}\n\
__syncthreads();\n\
int block_first = -block_range[0], block_last = block_range[1];\n\
int first_tile = block_last >= block_first ? block_first / KEYS * KEYS : 0;\n\
int last_position = block_last >= block_first ? block_last : -1;\n\
\n\
float row_max[2] = {NEGATIVE_INFINITY, NEGATIVE_INFINITY}, row_sum[2] = {0.0f, 0.0f};\n\
float output[VALUE_TILES][4];\n\
for (int n = 0; n < VALUE_TILES; n++) {\n\
    for (int i = 0; i < 4; i++) {\n\
        output[n][i] = 0.0f;\n\
    }\n\
}\n\
if (first_tile <= last_position) {\n\
    LOAD_TILE(0, first_tile);\n\
}\n\
smelt_cp_async_commit();\n\
int stage = 0;\n\
for (int tile = first_tile; tile <= last_position; tile += KEYS) {\n\
    if (tile + KEYS <= last_position) {\n\
        LOAD_TILE(stage ^ 1, tile + KEYS);\n\
    }\n\
    smelt_cp_async_commit();\n\
    smelt_cp_async_wait_group(1); /* this tile's copies are done; the next tile's may be in flight */\n\
    __syncthreads();\n\
    const tile_element *tile_keys = keys + stage * KEYS * K_STRIDE, *tile_values = values + stage * KEYS * V_STRIDE;\n\
    if (tile <= warp_last && tile + KEYS - 1 >= warp_first) {\n\
        /* S = Q K^T: 16 rows x KEYS positions, HEAD_DIM / 16 mma steps */\n\
        float scores[SCORE_TILES][4];\n\
        for (int n = 0; n < SCORE_TILES; n++) {\n\
            for (int i = 0; i < 4; i++) {\n\
                scores[n][i] = 0.0f;\n\
            }\n\
        }\n\
        int matrix = lane / 8, matrix_row = lane % 8; /* the row this lane addresses for ldmatrix */\n\
        for (int k = 0; k < HEAD_DIM / 16; k++) {\n\
            uint32_t a[4], b[4];\n\
            smelt_ldmatrix_x4(a, query + (warp * 16 + (matrix & 1) * 8 + matrix_row) * Q_STRIDE + k * 16 +\n\
                                     (matrix >> 1) * 8);\n\
            for (int n = 0; n < SCORE_TILES; n += 2) {\n\
                smelt_ldmatrix_x4(b, tile_keys + ((n + (matrix >> 1)) * 8 + matrix_row) * K_STRIDE + k * 16 +\n\
                                         (matrix & 1) * 8);\n\
                uint32_t low[2] = {b[0], b[1]}, high[2] = {b[2], b[3]};\n\
                TILE_MMA(scores[n], a, low, scores[n]);\n\
                TILE_MMA(scores[n + 1], a, high, scores[n + 1]);\n\
            }\n\
        }\n\
        /* scale and mask; element i of scores[n] is row group_id + (i / 2) * 8,\n\
         * position tile + n * 8 + 2 * thread_in_group + i % 2 */\n\
        float tile_max[2] = {NEGATIVE_INFINITY, NEGATIVE_INFINITY};\n\
        for (int n = 0; n < SCORE_TILES; n++) {\n\
            for (int i = 0; i < 4; i++) {\n\
                int column = n * 8 + 2 * thread_in_group + i % 2, p = tile + column, half = i / 2;\n\
                int visible = p >= row_first[half] && p <= row_last[half] && seen[stage][column];\n\
                scores[n][i] = visible ? CAPPED(scores[n][i]$times_key_scale * SCALE) : NEGATIVE_INFINITY;\n\
                tile_max[half] = fmaxf(tile_max[half], scores[n][i]);\n\
            }\n\
        }\n\
        float correction[2];\n\
        for (int half = 0; half < 2; half++) {\n\
            tile_max[half] = fmaxf(tile_max[half], smelt_shfl_xor_f32(0xffffffffu, tile_max[half], 1));\n\
            tile_max[half] = fmaxf(tile_max[half], smelt_shfl_xor_f32(0xffffffffu, tile_max[half], 2));\n\
            float new_max = fmaxf(row_max[half], tile_max[half]);\n\
            /* 0 for the first tile a row sees; 1 while it sees none */\n\
            correction[half] = new_max > NEGATIVE_INFINITY ? expf(row_max[half] - new_max) : 1.0f;\n\
            row_max[half] = new_max;\n\
            row_sum[half] *= correction[half];\n\
        }\n\
        for (int n = 0; n < SCORE_TILES; n++) {\n\
            for (int i = 0; i < 4; i++) {\n\
                int half = i / 2;\n\
                float weight = scores[n][i] > NEGATIVE_INFINITY ? expf(scores[n][i] - row_max[half]) : 0.0f;\n\
                row_sum[half] += weight;\n\
                scores[n][i] = weight$times_value_scale; /* P for P V */\n\
            }\n\
        }\n\
        for (int n = 0; n < VALUE_TILES; n++) {\n\
            for (int i = 0; i < 4; i++) {\n\
                output[n][i] *= correction[i / 2];\n\
            }\n\
        }\n\
        /* O += P V: KEYS / 16 mma steps; P's A fragment is two score tiles */\n\
        for (int k = 0; k < KEYS / 16; k++) {\n\
            uint32_t a[4];\n\
            a[0] = TILE_PAIR(TO_TILE_ELEMENT(scores[2 * k][0]), TO_TILE_ELEMENT(scores[2 * k][1]));\n\
            a[1] = TILE_PAIR(TO_TILE_ELEMENT(scores[2 * k][2]), TO_TILE_ELEMENT(scores[2 * k][3]));\n\
            a[2] = TILE_PAIR(TO_TILE_ELEMENT(scores[2 * k + 1][0]), TO_TILE_ELEMENT(scores[2 * k + 1][1]));\n\
            a[3] = TILE_PAIR(TO_TILE_ELEMENT(scores[2 * k + 1][2]), TO_TILE_ELEMENT(scores[2 * k + 1][3]));\n\
            const tile_element *v = tile_values + (k * 16 + 2 * thread_in_group) * V_STRIDE + group_id;\n\
            for (int n = 0; n < VALUE_TILES; n++) {\n\
                uint32_t b[2];\n\
                b[0] = TILE_PAIR(v[n * 8], v[V_STRIDE + n * 8]);\n\
                b[1] = TILE_PAIR(v[8 * V_STRIDE + n * 8], v[9 * V_STRIDE + n * 8]);\n\
                TILE_MMA(output[n], a, b, output[n]);\n\
            }\n\
        }\n\
    }\n\
    __syncthreads(); /* the next iteration's copies overwrite this stage */\n\
    stage ^= 1;\n\
}\n\
smelt_cp_async_wait_all();\n\
\n\
/* a row's sum over its four lanes, then O / sum (0 for a row that saw nothing) */\n\
for (int half = 0; half < 2; half++) {\n\
    row_sum[half] += smelt_shfl_xor_f32(0xffffffffu, row_sum[half], 1);\n\
    row_sum[half] += smelt_shfl_xor_f32(0xffffffffu, row_sum[half], 2);\n\
}\n\
for (int half = 0; half < 2; half++) {\n\
    long long token = row0 + warp * 16 + group_id + half * 8;\n\
    if (token < STEP_ROWS) {\n\
        for (int n = 0; n < VALUE_TILES; n++) {\n\
            for (int i = 0; i < 2; i++) {\n\
                float x = row_sum[half] > 0.0f ? output[n][half * 2 + i] / row_sum[half] : 0.0f;\n\
                STORE_OUTPUT((token * QUERY_HEADS + head) * VALUE_DIM + n * 8 + 2 * thread_in_group + i, x);\n\
            }\n\
        }\n\
    }\n\
}\n";

void emit_attention_prefill(cg_emit *e, const attention_shape *s, prog_affine steps) {
    smelt_dtype tile;
    if (!tile_dtype(s, &tile)) SMELT_DIE("attention prefill over %s tiles", smelt_dtype_name(tile));
    const char *tile_name = cg_dtype_name(tile);
    const char *summary = arena_printf(
        &e->scratch,
        "FlashAttention-2 on tensor cores: one block per (64 query tokens, query head), 16 rows a warp; "
        "S = Q K^T and O += P V by mma.m16n8k16 %s with f32 accumulation, an online softmax in "
        "registers, K/V tiles of 32 positions double-buffered by cp.async, tiles no row sees skipped. %s",
        tile_name,
        steps.a == 0 ? "It serves every step."
                     : arena_printf(&e->scratch,
                                    "It serves steps of more than %d tokens (grid z is 0 for the others).",
                                    ATTENTION_DECODE_MAX_TOKENS));
    cg_kernel_builder b;
    cg_kernel_begin(&b, e, attention_kernel_name(e, s, "attention_prefill"), summary);
    uint32_t q = cg_param_value(&b, "q", cg_operand(e, 0), true);
    cg_param_value(&b, "pos", cg_operand(e, 3), true);
    uint32_t k_cache = cg_param_state(&b, "k_cache", CG_STATE_KEYS, s->key_dtype);
    uint32_t v_cache = cg_param_state(&b, "v_cache", CG_STATE_VALUES, s->value_dtype);
    uint32_t written = cg_param_state(&b, "written", CG_STATE_WRITTEN, SMELT_DTYPE_I32);
    uint32_t out = cg_param_value(&b, "out", cg_result(e, 0), false);
    attention_scale_params(&b, s);
    b.params[k_cache].is_const = b.params[v_cache].is_const = b.params[written].is_const = true;
    cg_kernel_launch(&b, cg_count_blocks(s->tokens, PREFILL_ROWS), (prog_affine){0, s->query_heads, 1},
                     PREFILL_THREADS);
    b.k->rule.grid[2] = steps;
    b.k->rule.dynamic_shared_bytes = prefill_shared_bytes(s);
    cg_kernel_open(&b);
    cg_text *t = &b.text;
    cg_line(t, "enum { QUERY_HEADS = %lld, KV_HEADS = %lld, GROUP = QUERY_HEADS / KV_HEADS };",
            (long long)s->query_heads, (long long)s->kv_heads);
    cg_line(t, "enum { HEAD_DIM = %lld, VALUE_DIM = %lld, MAX_SEQ = %lld, WINDOW = %lld, CAUSAL = %d };",
            (long long)s->head_dim, (long long)s->value_dim, (long long)s->max_seq, (long long)s->window,
            s->causal ? 1 : 0);
    cg_line(
        t,
        "enum { THREADS = %d, ROWS = %d, KEYS = %d }; /* ROWS query tokens a block, KEYS positions a tile */",
        PREFILL_THREADS, PREFILL_ROWS, PREFILL_KEYS);
    cg_line(
        t,
        "enum { Q_STRIDE = HEAD_DIM + %d, K_STRIDE = HEAD_DIM + %d, V_STRIDE = VALUE_DIM + %d }; /* padded "
        "shared rows */",
        PREFILL_PAD, PREFILL_PAD, PREFILL_PAD);
    cg_line(t, "enum { SCORE_TILES = KEYS / 8, VALUE_TILES = VALUE_DIM / 8 }; /* m16n8 accumulator tiles */");
    cg_line(t, "typedef %s tile_element; /* the tiles' dtype: the mma's %s inputs */", cg_dtype_ctype(tile),
            tile_name);
    cg_line(t, "#define TO_TILE_ELEMENT(x) smelt_f32_to_%s(x)", tile_name);
    cg_line(t, "#define TILE_PAIR(low, high) smelt_%sx2_pack(low, high)", tile_name);
    cg_line(t, "#define TILE_MMA(d, a, b, c) smelt_mma_m16n8k16_%s_f32(d, a, b, c)", tile_name);
    attention_define_scoring(e, t, s);
    cg_line(t, "#define NEGATIVE_INFINITY %s", CG_NEGATIVE_INFINITY);
    cg_line(t, "#define STEP_ROWS (%s) /* query tokens in this step */", cg_count_text(e, s->tokens));
    cg_line(t, "#define LOAD_QUERY(i) %s", cg_load(&b, q, "(i)"));
    cg_line(t, "#define STORE_OUTPUT(i, value) %s",
            attention_without_semicolon(e, cg_store(&b, out, "(i)", "(value)")));
    const char *stage_arguments =
        "keys + (stage) * KEYS * K_STRIDE, values + (stage) * KEYS * V_STRIDE, seen[stage]";
    if (s->scaled) {
        cg_line(t,
                "#define LOAD_TILE(stage, at) load_tile(%s, key_scale[stage], value_scale[stage], "
                "k_cache, v_cache, written, k_scales, v_scales, (at), kv_head)",
                stage_arguments);
        cg_line(t, "#define KEY_SCALE(stage, column) key_scale[stage][column] /* the codes' row scales */");
        cg_line(t, "#define VALUE_SCALE(stage, column) value_scale[stage][column]");
    } else {
        cg_line(t, "#define LOAD_TILE(stage, at) load_tile(%s, k_cache, v_cache, written, (at), kv_head)",
                stage_arguments);
    }
    cg_blank(t);
    attention_write_template(t, s->scaled ? prefill_fp8_helpers : prefill_helpers);
    attention_write_template(t, prefill_visible_range);
    cg_kernel_signature(&b);
    if (s->scaled)
        cg_line(t, "__shared__ float key_scale[2][KEYS], value_scale[2][KEYS]; /* the tiles' row scales */");
    /* the rows' scales of an f8e4m3 cache; nothing for the others */
    attention_hole holes[] = {
        {"times_key_scale", s->scaled ? " * KEY_SCALE(stage, column)" : ""},
        {"times_value_scale", s->scaled ? " * VALUE_SCALE(stage, n * 8 + 2 * thread_in_group + i % 2)" : ""},
    };
    attention_write_filled_template(t, prefill_body, holes, sizeof holes / sizeof holes[0]);
    cg_kernel_end(&b);
}
