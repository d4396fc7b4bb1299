/* emit_rope.c - the rotary position embedding kernel, neox and interleaved
 * pairing, over the first rotary_dim dims of each head, with the scaled
 * variants of ir/rope.h (linear, dynamic, llama3, yarn, longrope).
 *
 * rope(x[T, H, Dh], pos[T]): one block per token. The inverse frequencies
 * inv_freq[i] (1 / theta^(2i / r), or a variant's) are computed here, at
 * compile time, by ir/rope.c, in float32 exactly as the reference does (and
 * Hugging Face, whose rotary embeddings compute them on the CPU), and baked
 * into the source bit for bit: powf on a GPU is not correctly rounded, and an
 * ulp of inv_freq becomes an error of position * ulp in the angle. Each block
 * then computes cos and sin of (float)pos * inv_freq[i] once into shared
 * memory (times the variant's attention factor, for yarn and longrope),
 * rotates the pairs of every head — neox (Llama's rotate_half) pairs i with
 * i + r/2, interleaved (GPT-J) 2i with 2i + 1 — and copies the dims past the
 * rotated ones unchanged (reference/ref_ops_attention.c). longrope bakes its
 * short and long sets and each block picks one from the step's largest
 * position, as transformers picks per forward call.
 *
 * A rope that reads a rope_table (passes/fuse.c: one per step for all the
 * ropes of one set of frequencies) takes each pair's cos and sin from it
 * instead: the table kernel (cg_emit_rope_table, below) computes them once
 * per step, one block per token, exactly as the per-launch code does here —
 * (float)pos * inv_freq[i] in float32, cosf and sinf, times the attention
 * factor — and stores them as f32 [T, r/2, 2] (cos, sin) pairs.
 */
#include "emit_internal.h"

#include "ir_io.h"
#include "rope.h"

#include <math.h>
#include <string.h>
#include <xxhash.h>

enum { ROPE_MAX_THREADS = 256 };

static uint32_t threads_for(int64_t work) {
    if (work >= ROPE_MAX_THREADS) return ROPE_MAX_THREADS;
    return (uint32_t)((work + 31) / 32 * 32);
}

/* `static __device__ const float NAME[HALF] = {...};` */
static void emit_table(cg_emit *e, cg_text *t, const char *name, const float *values, uint32_t count) {
    cg_line(t, "static __device__ const float %s[HALF] = {", name);
    for (uint32_t i = 0; i < count; i++)
        cg_line(t, "%s%s", cg_float_literal(e, values[i]), i + 1 < count ? "," : "");
    cg_line(t, "};");
}

/* A digest of what a scaled variant bakes into the source (the tables, the
 * switch of longrope and the attention factor), for the kernel's name. */
static unsigned long long tables_digest(const ir_rope_tables *tables) {
    XXH64_hash_t h = XXH64(tables->inv_freq, tables->half * sizeof(float), 0);
    if (tables->long_inv_freq) h = XXH64(tables->long_inv_freq, tables->half * sizeof(float), h);
    h = XXH64(&tables->long_after, sizeof tables->long_after, h);
    return (unsigned long long)XXH64(&tables->attention_factor, sizeof tables->attention_factor, h);
}

/* The rotation of every pair of every head of the block's token by
 * cosines[i] and sines[i], and the dims past the rotary ones copied. */
static void emit_rotation(cg_kernel_builder *b, uint32_t in, uint32_t out, bool interleaved, int64_t passed) {
    cg_text *t = &b->text;
    cg_line(t, "for (int j = threadIdx.x; j < HEADS * HALF; j += THREADS) {");
    cg_line(t, "int head = j / HALF, i = j %% HALF;");
    if (interleaved)
        cg_line(t, "long long first = base + head * HEAD_DIM + 2 * i, second = first + 1;");
    else
        cg_line(t, "long long first = base + head * HEAD_DIM + i, second = first + HALF;");
    cg_line(t, "float a = %s;", cg_load(b, in, "first"));
    cg_line(t, "float b = %s;", cg_load(b, in, "second"));
    cg_line(t, "%s", cg_store(b, out, "first", "a * cosines[i] - b * sines[i]"));
    cg_line(t, "%s", cg_store(b, out, "second", "b * cosines[i] + a * sines[i]"));
    cg_line(t, "}");
    if (passed > 0) {
        cg_line(t, "/* dims [2 * HALF, HEAD_DIM) of each head are not rotated */");
        cg_line(t, "for (int j = threadIdx.x; j < HEADS * PASSED; j += THREADS) {");
        cg_line(t, "long long at = base + j / PASSED * HEAD_DIM + 2 * HALF + j %% PASSED;");
        cg_line(t, "%s", cg_copy(b, out, "at", in, "at"));
        cg_line(t, "}");
    }
}

/* The frequencies of `params`, baked into the source: INVERSE_FREQUENCY
 * (and longrope's LONG_INVERSE_FREQUENCY with the context that switches to
 * it), ATTENTION_FACTOR when cos and sin are scaled. */
static void emit_frequencies(cg_emit *e, cg_text *t, const ir_rope_params *params,
                             const ir_rope_tables *tables) {
    char theta_text[48];
    ir_format_float(params->theta, theta_text, sizeof theta_text);
    if (params->scaling == IR_ROPE_DEFAULT || params->scaling == IR_ROPE_DYNAMIC)
        cg_line(t,
                "/* inv_freq[i] = 1 / theta^(2i / %lld) with theta = %s, in float32 as Hugging Face computes "
                "it%s. */",
                (long long)params->rotary_dim, theta_text,
                params->scaling == IR_ROPE_DYNAMIC
                    ? " (dynamic NTK scaling leaves them so below max_position_embeddings)"
                    : "");
    else
        cg_line(t,
                "/* inv_freq[i]: theta = %s over %lld dims, scaled as Hugging Face's rope_type '%s' does, in "
                "float32. */",
                theta_text, (long long)params->rotary_dim, ir_rope_scaling_name(params->scaling));
    emit_table(e, t, "INVERSE_FREQUENCY", tables->inv_freq, tables->half);
    if (tables->long_inv_freq) {
        cg_line(
            t,
            "/* longrope's long set, for a step whose largest position + 1 passes the original context. */");
        emit_table(e, t, "LONG_INVERSE_FREQUENCY", tables->long_inv_freq, tables->half);
        cg_line(t, "enum { ORIGINAL_MAX_POSITIONS = %lld };", (long long)tables->long_after);
    }
    if (tables->attention_factor != 1.0f) {
        cg_line(t, "/* cos and sin are scaled by the attention factor of rope_type '%s'. */",
                ir_rope_scaling_name(params->scaling));
        cg_line(t, "static __device__ const float ATTENTION_FACTOR = %s;",
                cg_float_literal(e, tables->attention_factor));
    }
    cg_blank(t);
}

/* In the kernel: the block's token's position, and cosines[i], sines[i] of
 * its angles (float)pos[token] * inv_freq[i] (the kernel's parameter pos), in f32 — longrope's
 * set chosen by the step's largest position. */
static void emit_angles(cg_kernel_builder *b, const ir_rope_tables *tables) {
    cg_text *t = &b->text;
    bool scaled_angles = tables->attention_factor != 1.0f;
    cg_line(t, "float position = (float)pos[token];");
    const char *table = "INVERSE_FREQUENCY";
    if (tables->long_inv_freq) {
        cg_line(t, "/* the step's largest position picks the set, as transformers picks per call */");
        cg_line(t, "__shared__ int largest_position;");
        cg_line(t, "if (threadIdx.x == 0) largest_position = pos[0];");
        cg_line(t, "__syncthreads();");
        cg_line(t, "for (int j = threadIdx.x; j < tokens; j += THREADS) "
                   "smelt_atomic_max_i32(&largest_position, pos[j]);");
        cg_line(t, "__syncthreads();");
        cg_line(t, "const float *inverse_frequency =");
        cg_line(t, "    largest_position + 1 > ORIGINAL_MAX_POSITIONS ? LONG_INVERSE_FREQUENCY : "
                   "INVERSE_FREQUENCY;");
        table = "inverse_frequency";
    }
    cg_line(t, "for (int i = threadIdx.x; i < HALF; i += THREADS) {");
    cg_line(t, "float angle = position * %s[i];", table);
    cg_line(t, scaled_angles ? "cosines[i] = cosf(angle) * ATTENTION_FACTOR;" : "cosines[i] = cosf(angle);");
    cg_line(t, scaled_angles ? "sines[i] = sinf(angle) * ATTENTION_FACTOR;" : "sines[i] = sinf(angle);");
    cg_line(t, "}");
}

/* The checked parameters of rope-family op e->op over `head_dim`, and their
 * tables (in the scratch arena: an out-of-memory unwind frees them). */
static bool frequencies_of(cg_emit *e, int64_t head_dim, ir_rope_params *params, ir_rope_tables *tables) {
    *params = ir_rope_params_of(e->m, e->op, head_dim);
    char why[256];
    if (!ir_rope_params_check(params, head_dim, why, sizeof why)) {
        diag_error(e->d, e->ir->loc, "%s: %s", ir_op_info_at(e->m, e->op)->name, why);
        return false;
    }
    ir_rope_tables_compute(params, arena_array(&e->scratch, ir_rope_tables_floats(params), sizeof(float)),
                           tables);
    return true;
}

/* The name's suffix for the frequencies a kernel bakes in: theta, and a
 * scaled variant's name and digest. */
static const char *frequencies_tag(cg_emit *e, const ir_rope_params *params, const ir_rope_tables *tables) {
    const char *tag = arena_printf(&e->scratch, "theta%s", cg_float_name(e, params->theta));
    if (params->scaling == IR_ROPE_DEFAULT) return tag;
    return arena_printf(&e->scratch, "%s_%s_%016llx", tag, ir_rope_scaling_name(params->scaling),
                        tables_digest(tables));
}

bool cg_emit_rope(cg_emit *e) {
    ir_value_id x = cg_operand(e, 0), pos = cg_operand(e, 1), result = cg_result(e, 0);
    bool reads_table = e->m->ops[e->op].operand_count == 3;
    cg_shape shape = cg_shape_of(e, x);
    if (shape.rank != 3 || !smelt_dtype_is_float(e->m->values[x].type.dtype) ||
        smelt_dtype_is_float(e->m->values[pos].type.dtype)) {
        diag_error(e->d, e->ir->loc, "rope: expected a float x[T, H, Dh] and integer positions");
        return false;
    }
    cg_shape positions = cg_shape_of(e, pos), out_shape = cg_shape_of(e, result);
    bool positions_fit = positions.rank == 1 && positions.token0 == shape.token0 &&
                         (shape.token0 || positions.dims[0] == shape.dims[0]);
    if (!cg_expect(e, positions_fit && cg_same_shape(&shape, &out_shape), "pos[T] and a result of x's shape"))
        return false;
    int64_t heads = shape.dims[1], head_dim = shape.dims[2];
    int64_t given_rotary = cg_attr_int(e, "rotary_dim", 0);
    if (given_rotary != 0 && (given_rotary < 2 || given_rotary > head_dim)) {
        diag_error(e->d, e->ir->loc, "rope: expected rotary_dim in [2, %lld] (the head dim); found %lld",
                   (long long)head_dim, (long long)given_rotary);
        return false;
    }
    ir_rope_params params;
    ir_rope_tables tables;
    if (!frequencies_of(e, head_dim, &params, &tables)) return false;
    if (reads_table &&
        !cg_expect(e, cg_storage_dtype(e->m, cg_operand(e, 2)) == SMELT_DTYPE_F32, "an f32 rope table"))
        return false;
    int64_t rotary = params.rotary_dim;
    int64_t half = rotary / 2, rotated = 2 * half, passed = head_dim - rotated;
    bool interleaved = strcmp(cg_attr_string(e, "style", "neox"), "interleaved") == 0;

    ir_value_id stored[2] = {x, result};
    const char *name =
        arena_printf(&e->scratch, "rope_%s_%s_h%lld_d%lld_r%lld_%s", interleaved ? "interleaved" : "neox",
                     cg_dtype_tag(e, stored, 2), (long long)heads, (long long)head_dim, (long long)rotary,
                     reads_table ? "table" : frequencies_tag(e, &params, &tables));
    const char *pairing = interleaved ? "the pairs (2i, 2i + 1) of every head (GPT-J)"
                                      : "the pairs (i, i + r/2) of every head (neox, Llama's rotate_half)";
    const char *angles =
        reads_table ? "the step's cos and sin of pair i (its rope table)" : "the angle pos * inv_freq[i]";
    uint32_t threads = threads_for(heads * half);
    cg_kernel_builder b;
    cg_kernel_begin(
        &b, e, name,
        arena_printf(&e->scratch,
                     "One block per token: rotates %s by %s; dims past the rotary ones pass through.",
                     pairing, angles));
    uint32_t in = cg_param_value(&b, "x", x, true);
    uint32_t table = reads_table ? cg_param_value(&b, "table", cg_operand(e, 2), true) : UINT32_MAX;
    if (!reads_table) cg_param_value(&b, "pos", pos, true);
    uint32_t out = cg_param_value(&b, "out", result, false);
    if (!reads_table && tables.long_inv_freq) cg_param_tokens(&b);
    cg_kernel_launch(&b, cg_count_blocks(cg_shape_count(&shape, 0, 1), 1), (prog_affine){0, 1, 1}, threads);
    cg_kernel_open(&b);
    cg_text *t = &b.text;
    cg_line(t, "enum { HEADS = %lld, HEAD_DIM = %lld, HALF = %lld, PASSED = %lld, THREADS = %u };",
            (long long)heads, (long long)head_dim, (long long)half, (long long)passed, threads);
    cg_blank(t);
    if (!reads_table) emit_frequencies(e, t, &params, &tables);
    cg_kernel_signature(&b);
    cg_line(t, "__shared__ float cosines[HALF];");
    cg_line(t, "__shared__ float sines[HALF];");
    cg_line(t, "long long token = blockIdx.x;");
    cg_line(t, "long long base = token * HEADS * HEAD_DIM; /* x[token, 0, 0] */");
    if (reads_table) {
        cg_line(t, "for (int i = threadIdx.x; i < HALF; i += THREADS) {");
        cg_line(t, "cosines[i] = %s;", cg_load(&b, table, "(token * HALF + i) * 2"));
        cg_line(t, "sines[i] = %s;", cg_load(&b, table, "(token * HALF + i) * 2 + 1"));
        cg_line(t, "}");
    } else {
        emit_angles(&b, &tables);
    }
    cg_line(t, "__syncthreads();");
    emit_rotation(&b, in, out, interleaved, passed);
    cg_kernel_end(&b);
    e->out->kind = CG_LOWER_KERNELS;
    return true;
}

/* rope_table(pos[T]) -> f32[T, r/2, 2]: one block per token computes the
 * (cos, sin) of each pair as cg_emit_rope does per launch, and stores them
 * for every rope of the step that reads the table. */
bool cg_emit_rope_table(cg_emit *e) {
    ir_value_id pos = cg_operand(e, 0), result = cg_result(e, 0);
    cg_shape positions = cg_shape_of(e, pos), out_shape = cg_shape_of(e, result);
    if (positions.rank != 1 || smelt_dtype_is_float(e->m->values[pos].type.dtype) || out_shape.rank != 3 ||
        cg_storage_dtype(e->m, result) != SMELT_DTYPE_F32) {
        diag_error(e->d, e->ir->loc, "rope_table: expected integer positions pos[T] and an f32 table");
        return false;
    }
    ir_rope_params params;
    ir_rope_tables tables;
    if (!frequencies_of(e, cg_attr_int(e, "rotary_dim", 0), &params, &tables)) return false;
    int64_t half = params.rotary_dim / 2;
    if (!cg_expect(e, out_shape.dims[1] == half && out_shape.dims[2] == 2, "a table of [T, r / 2, 2]"))
        return false;
    uint32_t threads = threads_for(half);
    cg_kernel_builder b;
    cg_kernel_begin(&b, e,
                    arena_printf(&e->scratch, "rope_table_r%lld_%s", (long long)params.rotary_dim,
                                 frequencies_tag(e, &params, &tables)),
                    "One block per token: the cos and sin of the angle pos * inv_freq[i] of every rotated "
                    "pair i, once per step for every rope that reads them.");
    cg_param_value(&b, "pos", pos, true);
    uint32_t out = cg_param_value(&b, "table", result, false);
    if (tables.long_inv_freq) cg_param_tokens(&b);
    cg_kernel_launch(&b, cg_count_blocks(cg_shape_count(&positions, 0, 1), 1), (prog_affine){0, 1, 1},
                     threads);
    cg_kernel_open(&b);
    cg_text *t = &b.text;
    cg_line(t, "enum { HALF = %lld, THREADS = %u }; /* table is [tokens, HALF, 2]: (cos, sin) */",
            (long long)half, threads);
    cg_blank(t);
    emit_frequencies(e, t, &params, &tables);
    cg_kernel_signature(&b);
    cg_line(t, "__shared__ float cosines[HALF];");
    cg_line(t, "__shared__ float sines[HALF];");
    cg_line(t, "long long token = blockIdx.x;");
    emit_angles(&b, &tables);
    cg_line(t, "for (int i = threadIdx.x; i < HALF; i += THREADS) {");
    cg_line(t, "%s", cg_store(&b, out, "(token * HALF + i) * 2", "cosines[i]"));
    cg_line(t, "%s", cg_store(&b, out, "(token * HALF + i) * 2 + 1", "sines[i]"));
    cg_line(t, "}");
    cg_kernel_end(&b);
    e->out->kind = CG_LOWER_KERNELS;
    return true;
}
