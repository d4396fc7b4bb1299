/* program.c - the launch program's encoding (the plan's PROGRAM section) and
 * the decoder that validates it, so that the executor can trust it.
 *
 * Layout (little-endian; `ref` is {u8 buffer, u32 index, u64 offset}; a
 * string is {u64 length, bytes}; an affine rule is {i64 a, i64 b, i64 c}):
 *
 *   u32 format_version            PROGRAM_FORMAT_VERSION
 *   i64 max_tokens, u64 arena_bytes, u64 vocab
 *   ref input_ids, ref input_pos, ref logits
 *   i64 max_positions, i64 id_bound, u32 id_table (weight index; ~0: none)
 *   u8 has_greedy (the last instruction is the greedy one), ref greedy_token
 *   u32 eos_count, eos_count x i32 eos id
 *   u32 state_count,  state_count  x {u64 bytes, u64 rows}
 *   u32 weight_count, weight_count x {string name, u8 dtype, u8 flags (PROG_WEIGHT_*),
 *                                     u32 rank, rank x i64 dim, u64 bytes,
 *                                     u64 data_offset, u32 part_count,
 *                                     part_count x {string name, i64 rows},
 *                                     u8 quant kind, then when it is not 0:
 *                                     u8 method, u8 flags, u32 group}
 *   u32 instr_count,  instr_count  x {u8 op, u8 needs, u32 ir_op, i64 min_tokens, i64 max_tokens,
 *                                     u8 wanted_rows, u32 choice, u8 side, then
 *     LAUNCH: u32 kernel, 3 x affine grid, 3 x u32 block, u32 dynamic_shared,
 *             u32 arg_count, arg_count x {u8 kind, then POINTER: ref,
 *                                         affine extent, u8 writes, u64 row_bytes;
 *                                         INT: i64 value; TOKENS: nothing}
 *     GEMM:   affine m, i64 n, i64 k, u8 dtype_a, dtype_b, dtype_c,
 *             dtype_bias, u8 b_transposed, u8 has_bias, ref a, b, c, bias,
 *             u8 has_residual, ref residual, u8 has_scales, then when it is 1:
 *             u8 dtype_b_scale, ref a_scale, ref b_scale;
 *     then the cost: 3 x poly (read, written, flops), u8 tensor_cores}
 *   u32 choice_count, choice_count x {i64 min_tokens, i64 max_tokens, then for
 *                                     side 0 and 1, for T = min..max:
 *                                     {f64 bytes, f64 flops, u32 launches, u8 tensor_cores}}
 *   a poly: 5 x f64 {constant, per_token, per_context, per_token_context,
 *           per_token_squared}, each as the u64 of its IEEE-754 bits (an f64 likewise)
 *
 * Nothing may follow the last choice. A pointer's extent is the bytes
 * from its ref that the kernel may read or write at T tokens, as codegen
 * derived it from the parameter's type and storage dtype (a state buffer:
 * its whole size); `writes` says whether the kernel stores through it. A
 * state's rows are the positions of a KV cache (0: not indexed by position).
 * Version 3 added extents, writes, state rows and id_table; version 4 the
 * modeled cost of each instruction (program.h, "The cost model"); version 5
 * the EOS ids (at most PROG_MAX_EOS, each in [0, vocab), distinct); version
 * 6 the greedy instruction and its token; version 7 the token range of each
 * instruction (0 <= min_tokens <= max_tokens <= max_tokens of the program,
 * or max_tokens 0: no upper bound); version 8 the wanted-rows instructions
 * (program.h, "Wanted rows") and their pointers' row_bytes; version 9 the
 * parts of a concatenated weight (0, or 2 to PROG_MAX_WEIGHT_PARTS parts of
 * a weight that is not stacked, each of >= 1 rows, the rows summing to
 * dim 0) and a GEMM's residual (M x N of C's dtype, not overlapping C);
 * version 10 a weight's quantization (quant/quant.h's format; a quantized
 * weight is [N, K], not stacked nor concatenated); version 11 the choices
 * between a fused GEMV group's two lowerings (program.h, "Choices": each
 * instruction's choice, 0 or 1..choice_count, and side 0 or 1; each
 * choice's range within [1, max_tokens] and at most PROG_CHOICE_MAX_TOKENS
 * long, its costs finite, >= 0 and within the coefficient limit);
 * version 12 the interleaved int4 codes flag (PROG_QUANT_INTERLEAVED) and
 * quantized [E, N, K] stacks of experts (each expert an [N, K] matrix);
 * version 13 scaled GEMMs (prog_gemm.has_scales: A and B codes with a_scale
 * and b_scale) and each instruction's needs (prog_need: what its device
 * must, or must not, be able to do for it to run).
 * Version 14 the transposed flag of a weight (PROG_WEIGHT_TRANSPOSED: a
 * quantized matrix, neither stacked nor concatenated, quantized at binding
 * from its [K, N] tensor).
 *
 * What decoding checks (the executor relies on every item):
 *   - counts against the bytes left (no allocation a short section cannot
 *     back), enums, ranks <= 8, dims >= 0, bytes == product(shape) * size > 0;
 *   - weight and part names non-empty, without NUL, unique among all of
 *     them (binding is by name);
 *   - affine rules: c >= 1 and no int64 overflow for T in [1, max_tokens];
 *     grids <= 2^31 - 1 (x) and 65535 (y, z); blocks 1..1024 threads;
 *   - every reference: buffer kind and index exist; a kernel pointer's whole
 *     extent at max_tokens lies inside its buffer and a kernel writes only
 *     the arena or a state buffer; integer constants (PROG_ARG_INT, which
 *     codegen never makes) are refused; ids, positions and logits lie in the
 *     arena at max_tokens, and some instruction writes logits as max_tokens
 *     rows of vocab floats; each GEMM operand's whole extent (rows at
 *     max_tokens x columns x element size) lies inside its buffer, aligned to
 *     its element, and the GEMM writes only the arena or a state buffer;
 *   - bounds against what they size: id_bound >= 1 and at most the rows of
 *     the id_table weight (when there is one); max_positions in [1, rows] of
 *     every state indexed by position, whose bytes are a whole number of rows;
 *   - every cost coefficient finite, >= 0 and <= PROGRAM_COST_COEFFICIENT_LIMIT
 *     (no NaN, no negative cost, no overflow), the tensor-core flag 0 or 1;
 *   - a greedy instruction is the last one, a launch that writes the 4
 *     bytes of greedy_token (in the arena or a state buffer);
 *   - a wanted-rows instruction, run at one token on the last rows, stays
 *     inside what it may touch at T: a GEMM's rows are T (rule {1, 0, 1});
 *     a launch's grid is not empty at T = 1, and each pointer it moves (row_bytes
 *     > 0, into the arena) has an extent a T + b (c = 1, b >= 0) with
 *     row_bytes <= a, so its region at one token, (T - 1) row_bytes on, lies
 *     inside its region at T; only such instructions move pointers, and the
 *     greedy instruction is not one;
 *   - needs (program.h, "prog_need"): 0, 1 or 2; PROG_NEED_SCALED_GEMM on
 *     exactly the scaled GEMMs (each of them has it), PROG_NEED_NO_SCALED_GEMM
 *     on launches alone, neither on the greedy instruction; and every scaled
 *     GEMM has its fallback: a PROG_NEED_NO_SCALED_GEMM launch that writes
 *     through a pointer whose region holds the start of the GEMM's C, so a
 *     device that cannot run the GEMM still computes its output;
 *   - a scaled GEMM: A and B codes of one dtype (f8e4m3 or i8), B a weight
 *     stored [N, K] (b_transposed: cuBLASLt's FP8 GEMM takes only that
 *     layout), b_scale N values of dtype_b_scale (f16 or f32) in the same
 *     weight, a_scale M f32 values (at max_tokens), each whole inside its
 *     buffer and aligned to its element; C, bias and residual as in any GEMM.
 * program_check_plan adds what needs the rest of the plan: kernel indices,
 * launch rules equal to the kernel table's, and weight data offsets.
 */
#include "program.h"

#include "plan_read.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

enum {
    PROGRAM_MAX_TOKENS_LIMIT = 1 << 20, /* T bound a program may declare */
    PROGRAM_NAME_LIMIT = 4096,          /* bytes in a weight name */
    PROGRAM_MAX_THREADS = 1024,         /* per block, as on every CUDA GPU */
    PROGRAM_MAX_DYNAMIC_SHARED = 227 * 1024,
    /* The fewest bytes each element of a counted list takes, so that a count
     * can be checked against the bytes left before anything is allocated. */
    ENCODED_STATE_MIN = 16,
    ENCODED_WEIGHT_MIN = 8 + 1 + 1 + 4 + 8 + 8 + 4 + 1,
    ENCODED_COST = 3 * 5 * 8 + 1,
    ENCODED_INSTR_MIN = 1 + 1 + 4 + 16 + 1 + 4 + 1 + 4 + ENCODED_COST,
    ENCODED_CHOICE_MIN = 16 + 2 * (8 + 8 + 4 + 1),
};

bool program_dtype_stored(uint8_t dtype) {
    return dtype == SMELT_DTYPE_F32 || dtype == SMELT_DTYPE_BF16 || dtype == SMELT_DTYPE_F16 ||
           dtype == SMELT_DTYPE_I32;
}

/* ---- Encoding ------------------------------------------------------------ */

typedef struct byte_writer {
    uint8_t *data;
    size_t size, capacity;
    bool failed; /* out of memory */
} byte_writer;

static uint8_t *writer_reserve(byte_writer *w, size_t n) {
    if (w->failed) return NULL;
    if (w->capacity - w->size < n) {
        size_t capacity = w->capacity ? w->capacity : 256;
        while (capacity - w->size < n) {
            if (capacity > SIZE_MAX / 2) {
                w->failed = true;
                return NULL;
            }
            capacity *= 2;
        }
        uint8_t *grown = realloc(w->data, capacity);
        if (!grown) {
            w->failed = true;
            return NULL;
        }
        w->data = grown;
        w->capacity = capacity;
    }
    uint8_t *at = w->data + w->size;
    w->size += n;
    return at;
}

static void put_u8(byte_writer *w, uint8_t v) {
    uint8_t *p = writer_reserve(w, 1);
    if (p) *p = v;
}
static void put_u32(byte_writer *w, uint32_t v) {
    uint8_t *p = writer_reserve(w, 4);
    if (p) plan_put_u32(p, v);
}
static void put_u64(byte_writer *w, uint64_t v) {
    uint8_t *p = writer_reserve(w, 8);
    if (p) plan_put_u64(p, v);
}
static void put_i64(byte_writer *w, int64_t v) { put_u64(w, (uint64_t)v); }

static void put_string(byte_writer *w, const char *s) {
    size_t n = s ? strlen(s) : 0;
    put_u64(w, n);
    uint8_t *p = writer_reserve(w, n);
    if (p && n) memcpy(p, s, n);
}

static void put_ref(byte_writer *w, prog_ref r) {
    put_u8(w, r.buffer);
    put_u32(w, r.index);
    put_u64(w, r.offset);
}

static void put_affine(byte_writer *w, prog_affine f) {
    put_i64(w, f.a);
    put_i64(w, f.b);
    put_i64(w, f.c);
}

static void put_launch(byte_writer *w, const prog_launch *l) {
    put_u32(w, l->kernel);
    for (int d = 0; d < 3; d++)
        put_affine(w, l->rule.grid[d]);
    for (int d = 0; d < 3; d++)
        put_u32(w, l->rule.block[d]);
    put_u32(w, l->rule.dynamic_shared_bytes);
    put_u32(w, l->arg_count);
    for (uint32_t i = 0; i < l->arg_count && i < PROG_MAX_ARGS; i++) {
        const prog_arg *arg = &l->args[i];
        put_u8(w, arg->kind);
        if (arg->kind == PROG_ARG_POINTER) {
            put_ref(w, arg->ref);
            put_affine(w, arg->extent);
            put_u8(w, arg->writes);
            put_u64(w, arg->row_bytes);
        }
        if (arg->kind == PROG_ARG_INT) put_i64(w, arg->value);
    }
}

static void put_gemm(byte_writer *w, const prog_gemm *g) {
    put_affine(w, g->m);
    put_i64(w, g->n);
    put_i64(w, g->k);
    put_u8(w, g->dtype_a);
    put_u8(w, g->dtype_b);
    put_u8(w, g->dtype_c);
    put_u8(w, g->dtype_bias);
    put_u8(w, g->b_transposed);
    put_u8(w, g->has_bias);
    put_ref(w, g->a);
    put_ref(w, g->b);
    put_ref(w, g->c);
    put_ref(w, g->bias);
    put_u8(w, g->has_residual);
    put_ref(w, g->residual);
    put_u8(w, g->has_scales);
    if (g->has_scales) {
        put_u8(w, g->dtype_b_scale);
        put_ref(w, g->a_scale);
        put_ref(w, g->b_scale);
    }
}

static void put_f64(byte_writer *w, double v) {
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    put_u64(w, bits);
}

static void put_poly(byte_writer *w, prog_poly f) {
    put_f64(w, f.constant);
    put_f64(w, f.per_token);
    put_f64(w, f.per_context);
    put_f64(w, f.per_token_context);
    put_f64(w, f.per_token_squared);
}

static void put_cost(byte_writer *w, const prog_cost *cost) {
    put_poly(w, cost->read);
    put_poly(w, cost->written);
    put_poly(w, cost->flops);
    put_u8(w, cost->tensor_cores);
}

bool program_encode(const program *p, uint8_t **bytes, size_t *size) {
    byte_writer w = {0};
    put_u32(&w, p->format_version);
    put_i64(&w, p->max_tokens);
    put_u64(&w, p->arena_bytes);
    put_u64(&w, p->vocab);
    put_ref(&w, p->input_ids);
    put_ref(&w, p->input_pos);
    put_ref(&w, p->logits);
    put_i64(&w, p->max_positions);
    put_i64(&w, p->id_bound);
    put_u32(&w, p->id_table);
    put_u8(&w, p->has_greedy);
    put_ref(&w, p->greedy_token);
    put_u32(&w, p->eos_count);
    for (uint32_t i = 0; i < p->eos_count && i < PROG_MAX_EOS; i++)
        put_u32(&w, (uint32_t)p->eos[i]);
    put_u32(&w, p->state_count);
    for (uint32_t i = 0; i < p->state_count; i++) {
        put_u64(&w, p->state_bytes[i]);
        put_u64(&w, p->state_rows ? p->state_rows[i] : 0);
    }
    put_u32(&w, p->weight_count);
    for (uint32_t i = 0; i < p->weight_count; i++) {
        const prog_weight *wt = &p->weights[i];
        put_string(&w, wt->name);
        put_u8(&w, wt->dtype);
        put_u8(&w, (uint8_t)((wt->stacked ? PROG_WEIGHT_STACKED : 0) |
                             (wt->transposed ? PROG_WEIGHT_TRANSPOSED : 0)));
        put_u32(&w, wt->rank);
        for (uint32_t d = 0; d < wt->rank && d < 8; d++)
            put_i64(&w, wt->shape[d]);
        put_u64(&w, wt->bytes);
        put_u64(&w, wt->data_offset);
        put_u32(&w, wt->part_count);
        for (uint32_t k = 0; k < wt->part_count; k++) {
            put_string(&w, wt->parts[k].name);
            put_i64(&w, wt->parts[k].rows);
        }
        put_u8(&w, wt->quant.kind);
        if (wt->quant.kind != PROG_QUANT_NONE) {
            put_u8(&w, wt->quant.method);
            put_u8(&w, wt->quant.flags);
            put_u32(&w, wt->quant.group);
        }
    }
    put_u32(&w, p->instr_count);
    for (uint32_t i = 0; i < p->instr_count; i++) {
        const prog_instr *in = &p->instrs[i];
        put_u8(&w, in->op);
        put_u8(&w, in->needs);
        put_u32(&w, in->ir_op);
        put_i64(&w, in->min_tokens);
        put_i64(&w, in->max_tokens);
        put_u8(&w, in->wanted_rows);
        put_u32(&w, in->choice);
        put_u8(&w, in->side);
        if (in->op == PROG_OP_LAUNCH)
            put_launch(&w, &in->as.launch);
        else
            put_gemm(&w, &in->as.gemm);
        put_cost(&w, &in->cost);
    }
    put_u32(&w, p->choice_count);
    for (uint32_t i = 0; i < p->choice_count; i++) {
        const prog_choice *c = &p->choices[i];
        put_i64(&w, c->min_tokens);
        put_i64(&w, c->max_tokens);
        for (int side = 0; side < 2; side++)
            for (int64_t t = c->min_tokens; t <= c->max_tokens && t - c->min_tokens < PROG_CHOICE_MAX_TOKENS;
                 t++) {
                const prog_choice_cost *cost = &c->cost[side][t - c->min_tokens];
                put_f64(&w, cost->bytes);
                put_f64(&w, cost->flops);
                put_u32(&w, cost->launches);
                put_u8(&w, cost->tensor_cores);
            }
    }
    if (w.failed) {
        free(w.data);
        *bytes = NULL;
        *size = 0;
        return false;
    }
    *bytes = w.data;
    *size = w.size;
    return true;
}

/* ---- Decoding ------------------------------------------------------------ */

typedef struct decoder {
    plan_cursor cursor;
    program *out;
    char *error;
    size_t error_size;
    bool failed; /* an error has been written */
} decoder;

__attribute__((format(printf, 2, 3))) static bool fail(decoder *d, const char *fmt, ...) {
    if (d->failed) return false; /* keep the first, most specific message */
    d->failed = true;
    if (d->error_size == 0) return false;
    int n = snprintf(d->error, d->error_size, "program: ");
    if (n < 0 || (size_t)n >= d->error_size) return false;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(d->error + n, d->error_size - (size_t)n, fmt, ap);
    va_end(ap);
    return false;
}

/* A failed read means the section ended too soon. */
static bool truncated(decoder *d, const char *what) {
    return fail(d, "truncated while reading %s (at byte %llu of %llu)", what,
                (unsigned long long)d->cursor.failed_at,
                (unsigned long long)(d->cursor.end - d->cursor.start));
}

static bool get_u8(decoder *d, uint8_t *out) {
    const uint8_t *p;
    if (!plan_cursor_bytes(&d->cursor, 1, &p)) return false;
    *out = *p;
    return true;
}

static bool get_ref(decoder *d, prog_ref *r) {
    bool ok = get_u8(d, &r->buffer);
    ok = ok && plan_cursor_u32(&d->cursor, &r->index);
    return ok && plan_cursor_u64(&d->cursor, &r->offset);
}

static bool get_affine(decoder *d, prog_affine *f) {
    bool ok = plan_cursor_i64(&d->cursor, &f->a);
    ok = ok && plan_cursor_i64(&d->cursor, &f->b);
    return ok && plan_cursor_i64(&d->cursor, &f->c);
}

/* A count of elements that take at least `element_min` bytes each. */
static bool get_count(decoder *d, uint32_t *count, uint64_t element_min, const char *what) {
    if (!plan_cursor_u32(&d->cursor, count)) return truncated(d, what);
    if (*count > plan_cursor_left(&d->cursor) / element_min)
        return fail(d, "%s count %u does not fit in the %llu bytes left", what, *count,
                    (unsigned long long)plan_cursor_left(&d->cursor));
    return true;
}

int64_t program_affine_max(prog_affine f, int64_t max_tokens) {
    if (f.c < 1 || max_tokens < 1) return -1;
    int64_t best = 0;
    int64_t ends[2] = {1, max_tokens};
    for (int i = 0; i < 2; i++) {
        int64_t n;
        if (__builtin_mul_overflow(f.a, ends[i], &n) || __builtin_add_overflow(n, f.b, &n)) return -1;
        if (n <= 0) continue;
        if (__builtin_add_overflow(n, f.c - 1, &n)) return -1;
        if (n / f.c > best) best = n / f.c;
    }
    return best;
}

/* The size in bytes of the buffer a reference names. */
static bool buffer_size(const program *p, prog_ref r, uint64_t *size) {
    switch (r.buffer) {
    case PROG_BUFFER_ARENA:
        if (r.index != 0) return false;
        *size = p->arena_bytes;
        return true;
    case PROG_BUFFER_WEIGHT:
        if (r.index >= p->weight_count) return false;
        *size = p->weights[r.index].bytes;
        return true;
    case PROG_BUFFER_STATE:
        if (r.index >= p->state_count) return false;
        *size = p->state_bytes[r.index];
        return true;
    }
    return false;
}

static const char *buffer_name(uint8_t buffer) {
    switch (buffer) {
    case PROG_BUFFER_ARENA: return "arena";
    case PROG_BUFFER_WEIGHT: return "weight";
    case PROG_BUFFER_STATE: return "state";
    }
    return "unknown buffer";
}

/* Checks that `extent` bytes at r lie inside r's buffer and that r.offset is
 * a multiple of `alignment`. `what` names the reference for the message. */
static bool check_region(decoder *d, prog_ref r, uint64_t extent, uint64_t alignment, const char *what) {
    uint64_t size, end;
    if (!buffer_size(d->out, r, &size))
        return fail(d, "%s names %s %u, which does not exist", what, buffer_name(r.buffer), r.index);
    if (__builtin_add_overflow(r.offset, extent, &end) || end > size)
        return fail(d, "%s needs %llu bytes at %s %u offset %llu but that buffer has %llu bytes", what,
                    (unsigned long long)extent, buffer_name(r.buffer), r.index, (unsigned long long)r.offset,
                    (unsigned long long)size);
    if (alignment > 1 && r.offset % alignment != 0)
        return fail(d, "%s at %s offset %llu is not aligned to %llu bytes", what, buffer_name(r.buffer),
                    (unsigned long long)r.offset, (unsigned long long)alignment);
    return true;
}

/* rows x columns x element bytes, overflow-checked. */
static bool extent_of(uint64_t rows, uint64_t columns, uint64_t element, uint64_t *out) {
    return !__builtin_mul_overflow(rows, columns, out) && !__builtin_mul_overflow(*out, element, out);
}

static bool decode_header(decoder *d) {
    program *p = d->out;
    plan_cursor *c = &d->cursor;
    uint8_t has_greedy;
    if (!plan_cursor_u32(c, &p->format_version)) return truncated(d, "the format version");
    if (p->format_version != PROGRAM_FORMAT_VERSION)
        return fail(d,
                    "format version %u is not the version %u this smelt reads: rebuild the plan "
                    "with `smelt compile`",
                    p->format_version, (unsigned)PROGRAM_FORMAT_VERSION);
    bool ok = plan_cursor_i64(c, &p->max_tokens) && plan_cursor_u64(c, &p->arena_bytes) &&
              plan_cursor_u64(c, &p->vocab) && get_ref(d, &p->input_ids) && get_ref(d, &p->input_pos) &&
              get_ref(d, &p->logits) && plan_cursor_i64(c, &p->max_positions) &&
              plan_cursor_i64(c, &p->id_bound) && plan_cursor_u32(c, &p->id_table) &&
              get_u8(d, &has_greedy) && get_ref(d, &p->greedy_token);
    if (!ok) return truncated(d, "the header");
    if (has_greedy > 1) return fail(d, "has_greedy is %u (expected 0 or 1)", has_greedy);
    p->has_greedy = has_greedy;
    if (p->max_tokens < 1 || p->max_tokens > PROGRAM_MAX_TOKENS_LIMIT)
        return fail(d, "max_tokens %lld is outside [1, %d]", (long long)p->max_tokens,
                    PROGRAM_MAX_TOKENS_LIMIT);
    if (p->vocab < 1 || p->vocab > INT32_MAX)
        return fail(d, "vocab %llu is outside [1, %d]", (unsigned long long)p->vocab, INT32_MAX);
    if (p->max_positions < 0 || p->max_positions > INT32_MAX)
        return fail(d, "max_positions %lld is outside [0, %d]", (long long)p->max_positions, INT32_MAX);
    if (p->id_bound < 0 || p->id_bound > INT32_MAX)
        return fail(d, "id_bound %lld is outside [0, %d]", (long long)p->id_bound, INT32_MAX);
    if (!plan_cursor_u32(c, &p->eos_count)) return truncated(d, "the EOS count");
    if (p->eos_count > PROG_MAX_EOS)
        return fail(d, "%u EOS ids; at most %d are allowed", p->eos_count, PROG_MAX_EOS);
    for (uint32_t i = 0; i < p->eos_count; i++) {
        uint32_t id;
        if (!plan_cursor_u32(c, &id)) return truncated(d, "the EOS ids");
        if ((uint64_t)id >= p->vocab)
            return fail(d, "EOS id %u lies outside the vocabulary [0, %llu)", id,
                        (unsigned long long)p->vocab);
        for (uint32_t k = 0; k < i; k++)
            if (p->eos[k] == (int32_t)id) return fail(d, "EOS id %u is listed twice", id);
        p->eos[i] = (int32_t)id;
    }
    return true;
}

/* The runtime writes ids and positions and reads logits itself: they must be
 * arena regions big enough at max_tokens. */
static bool check_io(decoder *d) {
    const program *p = d->out;
    uint64_t tokens = (uint64_t)p->max_tokens, logits_bytes;
    const struct {
        prog_ref ref;
        const char *what;
    } io[3] = {{p->input_ids, "input_ids"}, {p->input_pos, "input_pos"}, {p->logits, "logits"}};
    for (int i = 0; i < 3; i++)
        if (io[i].ref.buffer != PROG_BUFFER_ARENA)
            return fail(d, "%s must be in the arena, not in a %s buffer", io[i].what,
                        buffer_name(io[i].ref.buffer));
    if (!extent_of(tokens, p->vocab, 4, &logits_bytes))
        return fail(d, "logits of max_tokens x vocab overflow");
    return check_region(d, p->input_ids, tokens * 4, 4, "input_ids") &&
           check_region(d, p->input_pos, tokens * 4, 4, "input_pos") &&
           check_region(d, p->logits, logits_bytes, 4, "logits");
}

static bool decode_states(decoder *d) {
    program *p = d->out;
    if (!get_count(d, &p->state_count, ENCODED_STATE_MIN, "state")) return false;
    if (p->state_count == 0) return true;
    p->state_bytes = calloc(p->state_count, sizeof *p->state_bytes);
    p->state_rows = calloc(p->state_count, sizeof *p->state_rows);
    if (!p->state_bytes || !p->state_rows) return fail(d, "out of memory for %u state sizes", p->state_count);
    for (uint32_t i = 0; i < p->state_count; i++)
        if (!plan_cursor_u64(&d->cursor, &p->state_bytes[i]) ||
            !plan_cursor_u64(&d->cursor, &p->state_rows[i]))
            return truncated(d, "state sizes");
    return true;
}

/* Positions index every state that has rows (the KV caches): max_positions
 * must lie in [1, rows] of each, and each is a whole number of rows. */
static bool check_positions(decoder *d) {
    const program *p = d->out;
    for (uint32_t i = 0; i < p->state_count; i++) {
        uint64_t rows = p->state_rows[i];
        if (rows == 0) continue;
        if (p->state_bytes[i] % rows != 0)
            return fail(d, "state %u of %llu bytes is not a whole number of its %llu rows", i,
                        (unsigned long long)p->state_bytes[i], (unsigned long long)rows);
        if (p->max_positions < 1 || (uint64_t)p->max_positions > rows)
            return fail(d, "max_positions %lld disagrees with state %u, which holds %llu positions",
                        (long long)p->max_positions, i, (unsigned long long)rows);
    }
    return true;
}

/* The ids index the rows of the embedding table (id_table): id_bound must
 * lie in [1, rows]. */
static bool check_id_bound(decoder *d) {
    const program *p = d->out;
    if (p->id_table == UINT32_MAX) return true;
    if (p->id_table >= p->weight_count)
        return fail(d, "id_table names weight %u, which does not exist", p->id_table);
    const prog_weight *w = &p->weights[p->id_table];
    if (w->rank < 1 || p->id_bound < 1 || p->id_bound > w->shape[0])
        return fail(d,
                    "id_bound %lld disagrees with the %lld rows of the embedding table '%.*s%s' (weight %u)",
                    (long long)p->id_bound, (long long)(w->rank ? w->shape[0] : 0),
                    (int)(strlen(w->name) > 64 ? 64 : strlen(w->name)), w->name,
                    strlen(w->name) > 64 ? "..." : "", p->id_table);
    return true;
}

/* The rest of a quantized weight: its format agrees with its dtype and
 * shape, and its bytes hold at least the codes (the exact size of the
 * packed layout is quant_layout_of's, which the runtime checks: plan/
 * depends on nothing). */
static bool decode_weight_quant(decoder *d, prog_weight *w, uint64_t elements, int name_length,
                                const char *ellipsis) {
    static const uint8_t code_dtype[] = {0, SMELT_DTYPE_I4, SMELT_DTYPE_I8, SMELT_DTYPE_F8E4M3};
    const char *name = w->name;
    if (!get_u8(d, &w->quant.method) || !get_u8(d, &w->quant.flags) ||
        !plan_cursor_u32(&d->cursor, &w->quant.group))
        return truncated(d, "a weight's quantization");
    if (w->quant.kind > PROG_QUANT_FP8 || w->dtype != code_dtype[w->quant.kind])
        return fail(d, "weight '%.*s%s' has quantization %u with codes of dtype %u", name_length, name,
                    ellipsis, w->quant.kind, w->dtype);
    if (w->quant.flags > 15 || ((w->quant.flags & PROG_QUANT_ZERO) && w->quant.kind != PROG_QUANT_INT4) ||
        ((w->quant.flags & PROG_QUANT_INTERLEAVED) &&
         (w->quant.kind != PROG_QUANT_INT4 || (w->quant.flags & PROG_QUANT_GROUP_INDEX) || w->rank != 2 ||
          w->shape[1] % 128 != 0)))
        return fail(d, "weight '%.*s%s' has quantization flags %u", name_length, name, ellipsis,
                    w->quant.flags);
    /* [N, K], or a stack of experts [E, N, K] (each expert an [N, K] matrix) */
    if ((w->rank != 2 && w->rank != 3) || (w->stacked && w->rank != 3) || w->quant.group == 0 ||
        w->shape[w->rank - 1] % w->quant.group != 0)
        return fail(d,
                    "quantized weight '%.*s%s' is not [N, K] with groups that divide K (nor [E, N, K] "
                    "experts of them)",
                    name_length, name, ellipsis);
    uint64_t codes = w->quant.kind == PROG_QUANT_INT4 ? elements / 2 + elements % 2 : elements;
    if (w->bytes < codes || elements == 0)
        return fail(d, "quantized weight '%.*s%s' has %llu bytes, fewer than its codes", name_length, name,
                    ellipsis, (unsigned long long)w->bytes);
    return true;
}

/* A weight's or a part's name, copied into *out. */
static bool decode_name(decoder *d, uint32_t i, const char **out) {
    plan_text name;
    if (!plan_cursor_text(&d->cursor, &name)) return truncated(d, "a weight name");
    if (name.length == 0 || name.length > PROGRAM_NAME_LIMIT || memchr(name.data, 0, name.length))
        return fail(d, "weight %u has an empty, NUL-holding or over-long (%llu bytes) name", i,
                    (unsigned long long)name.length);
    char *copy = malloc(name.length + 1);
    if (!copy) return fail(d, "out of memory for a weight name");
    memcpy(copy, name.data, name.length);
    copy[name.length] = '\0';
    *out = copy;
    return true;
}

/* The parts of a concatenated weight, after its data offset. */
static bool decode_parts(decoder *d, uint32_t i, prog_weight *w) {
    plan_cursor *c = &d->cursor;
    int name_length = (int)(strlen(w->name) > 64 ? 64 : strlen(w->name));
    const char *ellipsis = strlen(w->name) > 64 ? "..." : "";
    if (!plan_cursor_u32(c, &w->part_count)) return truncated(d, "a weight");
    if (w->part_count == 0) return true;
    if (w->part_count < 2 || w->part_count > PROG_MAX_WEIGHT_PARTS || w->stacked || w->rank < 1)
        return fail(d, "weight '%.*s%s' has %u parts (a concatenation has 2 to %d, and is not stacked)",
                    name_length, w->name, ellipsis, w->part_count, PROG_MAX_WEIGHT_PARTS);
    w->parts = calloc(w->part_count, sizeof *w->parts);
    if (!w->parts) return fail(d, "out of memory for the parts of a weight");
    int64_t rows = 0;
    for (uint32_t k = 0; k < w->part_count; k++) {
        if (!decode_name(d, i, &w->parts[k].name)) return false;
        if (!plan_cursor_i64(c, &w->parts[k].rows)) return truncated(d, "a weight part");
        if (w->parts[k].rows < 1 || __builtin_add_overflow(rows, w->parts[k].rows, &rows))
            return fail(d, "weight '%.*s%s' has a part of %lld rows", name_length, w->name, ellipsis,
                        (long long)w->parts[k].rows);
    }
    if (rows != w->shape[0])
        return fail(d, "the parts of weight '%.*s%s' have %lld rows, but it has %lld", name_length, w->name,
                    ellipsis, (long long)rows, (long long)w->shape[0]);
    return true;
}

static bool decode_weight(decoder *d, uint32_t i, prog_weight *w) {
    plan_cursor *c = &d->cursor;
    uint8_t flags;
    if (!decode_name(d, i, &w->name)) return false;
    const char *copy = w->name;
    if (!get_u8(d, &w->dtype) || !get_u8(d, &flags) || !plan_cursor_u32(c, &w->rank))
        return truncated(d, "a weight");
    int name_length = (int)(strlen(copy) > 64 ? 64 : strlen(copy));
    const char *ellipsis = strlen(copy) > 64 ? "..." : "";
    if (!program_dtype_stored(w->dtype) && w->dtype != SMELT_DTYPE_I4 && w->dtype != SMELT_DTYPE_I8 &&
        w->dtype != SMELT_DTYPE_F8E4M3)
        return fail(
            d, "weight '%.*s%s' has dtype %u (expected f32, bf16, f16, i32 or a quantized weight's codes)",
            name_length, copy, ellipsis, w->dtype);
    if (flags & ~(PROG_WEIGHT_STACKED | PROG_WEIGHT_TRANSPOSED))
        return fail(d, "weight '%.*s%s' has layout flags %u", name_length, copy, ellipsis, flags);
    w->stacked = flags & PROG_WEIGHT_STACKED;
    w->transposed = flags & PROG_WEIGHT_TRANSPOSED;
    if (w->transposed && (w->stacked || w->rank != 2))
        return fail(d, "transposed weight '%.*s%s' is not a matrix (rank 2, not stacked)", name_length, copy,
                    ellipsis);
    if (w->rank > 8)
        return fail(d, "weight '%.*s%s' has rank %u (at most 8)", name_length, copy, ellipsis, w->rank);
    uint64_t elements = 1;
    for (uint32_t k = 0; k < w->rank; k++) {
        if (!plan_cursor_i64(c, &w->shape[k])) return truncated(d, "a weight shape");
        if (w->shape[k] < 0 || __builtin_mul_overflow(elements, (uint64_t)w->shape[k], &elements))
            return fail(d, "weight '%.*s%s' has a negative or overflowing shape", name_length, copy,
                        ellipsis);
    }
    if (!plan_cursor_u64(c, &w->bytes) || !plan_cursor_u64(c, &w->data_offset))
        return truncated(d, "a weight");
    if (!decode_parts(d, i, w)) return false;
    if (!get_u8(d, &w->quant.kind)) return truncated(d, "a weight");
    if (w->transposed && (w->part_count || w->quant.kind == PROG_QUANT_NONE))
        return fail(d, "transposed weight '%.*s%s' is concatenated or not quantized", name_length, copy,
                    ellipsis);
    if (w->quant.kind != PROG_QUANT_NONE) {
        if (w->part_count)
            return fail(d, "weight '%.*s%s' is both concatenated and quantized", name_length, copy, ellipsis);
        return decode_weight_quant(d, w, elements, name_length, ellipsis);
    }
    uint64_t expected;
    if (!program_dtype_stored(w->dtype))
        return fail(d, "weight '%.*s%s' has the codes' dtype %u but is not quantized", name_length, copy,
                    ellipsis, w->dtype);
    if (__builtin_mul_overflow(elements, smelt_dtype_element_bytes(w->dtype), &expected) ||
        expected != w->bytes)
        return fail(d, "weight '%.*s%s' says it has %llu bytes but its shape and dtype make %llu",
                    name_length, copy, ellipsis, (unsigned long long)w->bytes, (unsigned long long)expected);
    if (w->bytes == 0) return fail(d, "weight '%.*s%s' has no elements", name_length, copy, ellipsis);
    if (w->stacked && (w->rank < 1 || !strstr(copy, "{e}")))
        return fail(d, "stacked weight '%.*s%s' needs rank >= 1 and \"{e}\" in its name", name_length, copy,
                    ellipsis);
    return true;
}

static int compare_names(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

/* Binding is by name, so names (of weights and of parts) must be unique:
 * sort pointers, compare neighbours (n log n, whatever the count). */
static bool check_unique_names(decoder *d) {
    program *p = d->out;
    uint64_t count = p->weight_count;
    for (uint32_t i = 0; i < p->weight_count; i++)
        count += p->weights[i].part_count;
    if (count < 2) return true;
    const char **sorted = malloc(count * sizeof *sorted);
    if (!sorted) return fail(d, "out of memory checking weight names");
    uint64_t n = 0;
    for (uint32_t i = 0; i < p->weight_count; i++) {
        sorted[n++] = p->weights[i].name;
        for (uint32_t k = 0; k < p->weights[i].part_count; k++)
            sorted[n++] = p->weights[i].parts[k].name;
    }
    qsort(sorted, count, sizeof *sorted, compare_names);
    for (uint64_t i = 1; i < count; i++)
        if (strcmp(sorted[i - 1], sorted[i]) == 0) {
            const char *name = sorted[i];
            free(sorted);
            return fail(d, "weight '%.*s%s' appears twice", (int)(strlen(name) > 64 ? 64 : strlen(name)),
                        name, strlen(name) > 64 ? "..." : "");
        }
    free(sorted);
    return true;
}

static bool decode_weights(decoder *d) {
    program *p = d->out;
    if (!get_count(d, &p->weight_count, ENCODED_WEIGHT_MIN, "weight")) return false;
    if (p->weight_count == 0) return true;
    p->weights = calloc(p->weight_count, sizeof *p->weights);
    if (!p->weights) return fail(d, "out of memory for %u weights", p->weight_count);
    for (uint32_t i = 0; i < p->weight_count; i++)
        if (!decode_weight(d, i, &p->weights[i])) return false;
    return check_unique_names(d);
}

static bool check_rule(decoder *d, uint32_t i, const prog_launch_rule *rule) {
    static const int64_t grid_limit[3] = {INT32_MAX, 65535, 65535};
    uint64_t threads = 1;
    for (int k = 0; k < 3; k++) {
        int64_t most = program_affine_max(rule->grid[k], d->out->max_tokens);
        if (most < 0 || most > grid_limit[k])
            return fail(
                d,
                "instruction %u: grid dim %d rule ceil((%lld * T + %lld) / %lld) is invalid or exceeds "
                "%lld for T <= %lld",
                i, k, (long long)rule->grid[k].a, (long long)rule->grid[k].b, (long long)rule->grid[k].c,
                (long long)grid_limit[k], (long long)d->out->max_tokens);
        if (rule->block[k] < 1 || rule->block[k] > PROGRAM_MAX_THREADS)
            return fail(d, "instruction %u: block dim %d is %u (expected 1..%d)", i, k, rule->block[k],
                        PROGRAM_MAX_THREADS);
        threads *= rule->block[k];
    }
    if (threads > PROGRAM_MAX_THREADS)
        return fail(d, "instruction %u: a block of %llu threads exceeds %d", i, (unsigned long long)threads,
                    PROGRAM_MAX_THREADS);
    if (rule->dynamic_shared_bytes > PROGRAM_MAX_DYNAMIC_SHARED)
        return fail(d, "instruction %u: %u bytes of dynamic shared memory exceed %d", i,
                    rule->dynamic_shared_bytes, PROGRAM_MAX_DYNAMIC_SHARED);
    return true;
}

/* A wanted-rows launch at one token on its operands' last rows touches
 * nothing it may not touch at T (the file's comment). */
static bool check_wanted_launch(decoder *d, uint32_t i, bool wanted_rows, const prog_launch *l) {
    for (uint32_t a = 0; a < l->arg_count; a++) {
        const prog_arg *arg = &l->args[a];
        if (arg->kind != PROG_ARG_POINTER || arg->row_bytes == 0) continue;
        if (!wanted_rows)
            return fail(d, "instruction %u argument %u has row_bytes %llu but runs on every row", i, a,
                        (unsigned long long)arg->row_bytes);
        if (arg->ref.buffer != PROG_BUFFER_ARENA || arg->extent.c != 1 || arg->extent.b < 0 ||
            arg->row_bytes > (uint64_t)arg->extent.a)
            return fail(
                d,
                "instruction %u argument %u: a pointer moved by %llu bytes a row must be into the arena "
                "with an extent of at least that many bytes a token",
                i, a, (unsigned long long)arg->row_bytes);
    }
    for (int k = 0; wanted_rows && k < 3; k++)
        if (prog_affine_eval(l->rule.grid[k], 1) <= 0)
            return fail(d, "instruction %u runs on the wanted rows but its grid is empty at one token", i);
    return true;
}

static bool decode_launch(decoder *d, uint32_t i, prog_launch *l) {
    plan_cursor *c = &d->cursor;
    bool ok = plan_cursor_u32(c, &l->kernel);
    for (int k = 0; k < 3 && ok; k++)
        ok = get_affine(d, &l->rule.grid[k]);
    for (int k = 0; k < 3 && ok; k++)
        ok = plan_cursor_u32(c, &l->rule.block[k]);
    ok = ok && plan_cursor_u32(c, &l->rule.dynamic_shared_bytes) && plan_cursor_u32(c, &l->arg_count);
    if (!ok) return truncated(d, "a launch");
    if (!check_rule(d, i, &l->rule)) return false;
    if (l->arg_count > PROG_MAX_ARGS)
        return fail(d, "instruction %u: %u arguments (at most %d)", i, l->arg_count, PROG_MAX_ARGS);
    for (uint32_t a = 0; a < l->arg_count; a++) {
        prog_arg *arg = &l->args[a];
        if (!get_u8(d, &arg->kind)) return truncated(d, "a launch argument");
        char what[96];
        snprintf(what, sizeof what, "instruction %u (kernel %u) argument %u", i, l->kernel, a);
        switch (arg->kind) {
        case PROG_ARG_POINTER: {
            uint8_t writes;
            if (!get_ref(d, &arg->ref) || !get_affine(d, &arg->extent) || !get_u8(d, &writes) ||
                !plan_cursor_u64(c, &arg->row_bytes))
                return truncated(d, "a launch argument");
            if (writes > 1) return fail(d, "%s has a writes flag of %u", what, writes);
            arg->writes = writes;
            int64_t extent = program_affine_max(arg->extent, d->out->max_tokens);
            if (extent < 1)
                return fail(
                    d, "%s: extent rule ceil((%lld * T + %lld) / %lld) is invalid or empty for T <= %lld",
                    what, (long long)arg->extent.a, (long long)arg->extent.b, (long long)arg->extent.c,
                    (long long)d->out->max_tokens);
            if (arg->writes && arg->ref.buffer == PROG_BUFFER_WEIGHT)
                return fail(d, "%s: the kernel writes weight %u", what, arg->ref.index);
            /* Everything the kernel may touch through it, at the token bound. */
            if (!check_region(d, arg->ref, (uint64_t)extent, 1, what)) return false;
            break;
        }
        case PROG_ARG_TOKENS: break;
        case PROG_ARG_INT:
            /* Codegen passes no integer constants (they are baked into the
             * source): one here can only be an edit, and nothing bounds it. */
            return fail(d, "%s is an integer constant, which no kernel takes", what);
        default: return fail(d, "%s has unknown kind %u", what, arg->kind);
        }
    }
    return true;
}

/* A GEMM operand of rows x columns elements of dtype, whole inside its buffer. */
static bool check_operand(decoder *d, uint32_t i, const char *operand, prog_ref r, uint64_t rows,
                          uint64_t columns, uint8_t dtype) {
    char what[64];
    snprintf(what, sizeof what, "instruction %u gemm operand %s", i, operand);
    uint64_t extent, element = smelt_dtype_element_bytes(dtype);
    if (!extent_of(rows, columns, element, &extent))
        return fail(d, "%s of %llu x %llu elements overflows", what, (unsigned long long)rows,
                    (unsigned long long)columns);
    return check_region(d, r, extent, element, what);
}

static bool is_code_dtype(uint8_t dtype) { return dtype == SMELT_DTYPE_F8E4M3 || dtype == SMELT_DTYPE_I8; }

/* A scaled GEMM's own operands (program.h): codes, B an [N, K] weight with
 * its scales beside it, a_scale M f32 values. */
static bool check_scales(decoder *d, uint32_t i, const prog_gemm *g, uint64_t rows) {
    if (!is_code_dtype(g->dtype_a) || g->dtype_b != g->dtype_a)
        return fail(d,
                    "instruction %u: a scaled gemm multiplies codes of one dtype (f8e4m3 or i8), not %s x %s",
                    i, smelt_dtype_name((smelt_dtype)g->dtype_a), smelt_dtype_name((smelt_dtype)g->dtype_b));
    if (g->dtype_b_scale != SMELT_DTYPE_F16 && g->dtype_b_scale != SMELT_DTYPE_F32)
        return fail(d, "instruction %u: a scaled gemm's b_scale has dtype %u (expected f16 or f32)", i,
                    g->dtype_b_scale);
    if (!g->b_transposed)
        return fail(d, "instruction %u: a scaled gemm's B must be stored [N, K] (b_transposed)", i);
    if (g->b.buffer != PROG_BUFFER_WEIGHT || g->b_scale.buffer != PROG_BUFFER_WEIGHT ||
        g->b_scale.index != g->b.index)
        return fail(d, "instruction %u: a scaled gemm's B and b_scale must lie in one weight", i);
    return check_operand(d, i, "a_scale", g->a_scale, rows, 1, SMELT_DTYPE_F32) &&
           check_operand(d, i, "b_scale", g->b_scale, 1, (uint64_t)g->n, g->dtype_b_scale);
}

static bool check_gemm(decoder *d, uint32_t i, const prog_gemm *g) {
    int64_t m = program_affine_max(g->m, d->out->max_tokens);
    if (m < 0 || m > INT32_MAX)
        return fail(
            d, "instruction %u: gemm rows rule ceil((%lld * T + %lld) / %lld) is invalid for T <= %lld", i,
            (long long)g->m.a, (long long)g->m.b, (long long)g->m.c, (long long)d->out->max_tokens);
    if (g->n < 1 || g->n > INT32_MAX || g->k < 1 || g->k > INT32_MAX)
        return fail(d, "instruction %u: gemm n = %lld, k = %lld (expected 1..%d)", i, (long long)g->n,
                    (long long)g->k, INT32_MAX);
    const uint8_t dtypes[4] = {g->dtype_a, g->dtype_b, g->dtype_c, g->dtype_bias};
    for (int k = g->has_scales ? 2 : 0; k < (g->has_bias ? 4 : 3); k++) /* a scaled gemm's A and B: codes */
        if (dtypes[k] != SMELT_DTYPE_F32 && dtypes[k] != SMELT_DTYPE_BF16 && dtypes[k] != SMELT_DTYPE_F16)
            return fail(d, "instruction %u: gemm operand %c has dtype %u (expected f32, bf16 or f16)", i,
                        "abcd"[k], dtypes[k]);
    if (g->c.buffer == PROG_BUFFER_WEIGHT) return fail(d, "instruction %u: gemm writes a weight", i);
    uint64_t rows = (uint64_t)m, n = (uint64_t)g->n, k = (uint64_t)g->k;
    if (g->has_residual && g->residual.buffer == g->c.buffer && g->residual.index == g->c.index) {
        uint64_t bytes = rows * n * smelt_dtype_element_bytes(g->dtype_c); /* check_operand bounds it below */
        bool apart = g->residual.offset >= g->c.offset + bytes || g->c.offset >= g->residual.offset + bytes;
        if (!apart && rows > 0) return fail(d, "instruction %u: gemm residual overlaps its output", i);
    }
    return (!g->has_scales || check_scales(d, i, g, rows)) &&
           check_operand(d, i, "A", g->a, rows, k, g->dtype_a) &&
           check_operand(d, i, "B", g->b, n, k, g->dtype_b) &&
           check_operand(d, i, "C", g->c, rows, n, g->dtype_c) &&
           (!g->has_bias || check_operand(d, i, "bias", g->bias, 1, n, g->dtype_bias)) &&
           (!g->has_residual || check_operand(d, i, "residual", g->residual, rows, n, g->dtype_c));
}

static bool decode_gemm(decoder *d, uint32_t i, prog_gemm *g) {
    plan_cursor *c = &d->cursor;
    uint8_t transposed, has_bias, has_residual, has_scales;
    bool ok = get_affine(d, &g->m) && plan_cursor_i64(c, &g->n) && plan_cursor_i64(c, &g->k) &&
              get_u8(d, &g->dtype_a) && get_u8(d, &g->dtype_b) && get_u8(d, &g->dtype_c) &&
              get_u8(d, &g->dtype_bias) && get_u8(d, &transposed) && get_u8(d, &has_bias) &&
              get_ref(d, &g->a) && get_ref(d, &g->b) && get_ref(d, &g->c) && get_ref(d, &g->bias) &&
              get_u8(d, &has_residual) && get_ref(d, &g->residual) && get_u8(d, &has_scales);
    if (ok && has_scales == 1)
        ok = get_u8(d, &g->dtype_b_scale) && get_ref(d, &g->a_scale) && get_ref(d, &g->b_scale);
    if (!ok) return truncated(d, "a gemm");
    if (transposed > 1 || has_bias > 1 || has_residual > 1 || has_scales > 1)
        return fail(d, "instruction %u: gemm flags must be 0 or 1", i);
    g->b_transposed = transposed;
    g->has_bias = has_bias;
    g->has_residual = has_residual;
    g->has_scales = has_scales;
    return check_gemm(d, i, g);
}

static bool get_poly(decoder *d, uint32_t i, const char *what, prog_poly *f) {
    double *terms[5] = {&f->constant, &f->per_token, &f->per_context, &f->per_token_context,
                        &f->per_token_squared};
    static const char *const names[5] = {"constant", "per-token", "per-context", "per-token-context",
                                         "per-token-squared"};
    for (int t = 0; t < 5; t++) {
        uint64_t bits;
        if (!plan_cursor_u64(&d->cursor, &bits)) return truncated(d, "a cost");
        memcpy(terms[t], &bits, sizeof bits);
        /* !(x >= 0) also catches NaN */
        if (!(*terms[t] >= 0.0) || *terms[t] > PROGRAM_COST_COEFFICIENT_LIMIT)
            return fail(d, "instruction %u: the %s term of its modeled %s is %g (expected 0 .. %g)", i,
                        names[t], what, *terms[t], PROGRAM_COST_COEFFICIENT_LIMIT);
    }
    return true;
}

static bool decode_cost(decoder *d, uint32_t i, prog_cost *cost) {
    uint8_t tensor;
    if (!get_poly(d, i, "bytes read", &cost->read) || !get_poly(d, i, "bytes written", &cost->written) ||
        !get_poly(d, i, "flops", &cost->flops))
        return false;
    if (!get_u8(d, &tensor)) return truncated(d, "a cost");
    if (tensor > 1) return fail(d, "instruction %u: its cost's tensor-core flag is %u", i, tensor);
    cost->tensor_cores = tensor;
    return true;
}

/* An instruction's needs (program.h, prog_need): the scaled GEMMs, and only
 * they, need a device that runs them; launches alone stand in for them. */
static bool check_needs(decoder *d, uint32_t i, const prog_instr *in) {
    bool scaled = in->op == PROG_OP_GEMM && in->as.gemm.has_scales;
    if (in->needs > PROG_NEED_NO_SCALED_GEMM)
        return fail(d, "instruction %u has needs %u (expected 0, 1 or 2)", i, in->needs);
    if (scaled != (in->needs == PROG_NEED_SCALED_GEMM))
        return fail(d,
                    scaled ? "instruction %u is a scaled gemm without needs %u (scaled-gemm)"
                           : "instruction %u has needs %u (scaled-gemm) but is no scaled gemm",
                    i, (unsigned)PROG_NEED_SCALED_GEMM);
    if (in->needs == PROG_NEED_NO_SCALED_GEMM && in->op != PROG_OP_LAUNCH)
        return fail(d, "instruction %u has needs %u (no-scaled-gemm) but is no launch", i, in->needs);
    return true;
}

/* Does launch l write through a pointer whose region (at max_tokens) holds
 * the start of r? */
static bool launch_writes_at(const program *p, const prog_launch *l, prog_ref r) {
    for (uint32_t a = 0; a < l->arg_count; a++) {
        const prog_arg *arg = &l->args[a];
        if (arg->kind != PROG_ARG_POINTER || !arg->writes || arg->ref.buffer != r.buffer ||
            arg->ref.index != r.index || arg->ref.offset > r.offset)
            continue;
        if (r.offset - arg->ref.offset < (uint64_t)program_affine_max(arg->extent, p->max_tokens))
            return true;
    }
    return false;
}

/* Every scaled GEMM has a fallback: a launch guarded by
 * PROG_NEED_NO_SCALED_GEMM that writes its output, so that the program
 * computes it on every device. */
static bool check_fallbacks(decoder *d) {
    const program *p = d->out;
    for (uint32_t i = 0; i < p->instr_count; i++) {
        const prog_instr *in = &p->instrs[i];
        if (in->needs != PROG_NEED_SCALED_GEMM) continue;
        bool found = false;
        for (uint32_t k = 0; k < p->instr_count && !found; k++)
            found = p->instrs[k].needs == PROG_NEED_NO_SCALED_GEMM &&
                    launch_writes_at(p, &p->instrs[k].as.launch, in->as.gemm.c);
        if (!found)
            return fail(d,
                        "instruction %u, a scaled gemm, has no fallback: no launch of needs %u "
                        "(no-scaled-gemm) writes its output",
                        i, (unsigned)PROG_NEED_NO_SCALED_GEMM);
    }
    if (p->has_greedy && p->instr_count > 0 && p->instrs[p->instr_count - 1].needs != PROG_NEED_NONE)
        return fail(d, "the greedy instruction has needs %u (expected none)",
                    p->instrs[p->instr_count - 1].needs);
    return true;
}

static bool decode_instrs(decoder *d) {
    program *p = d->out;
    if (!get_count(d, &p->instr_count, ENCODED_INSTR_MIN, "instruction")) return false;
    if (p->instr_count == 0) return true;
    p->instrs = calloc(p->instr_count, sizeof *p->instrs);
    if (!p->instrs) return fail(d, "out of memory for %u instructions", p->instr_count);
    for (uint32_t i = 0; i < p->instr_count; i++) {
        prog_instr *in = &p->instrs[i];
        uint8_t wanted_rows;
        if (!get_u8(d, &in->op) || !get_u8(d, &in->needs) || !plan_cursor_u32(&d->cursor, &in->ir_op) ||
            !plan_cursor_i64(&d->cursor, &in->min_tokens) || !plan_cursor_i64(&d->cursor, &in->max_tokens) ||
            !get_u8(d, &wanted_rows) || !plan_cursor_u32(&d->cursor, &in->choice) || !get_u8(d, &in->side))
            return truncated(d, "an instruction");
        if (wanted_rows > 1) return fail(d, "instruction %u has a wanted-rows flag of %u", i, wanted_rows);
        if (in->side > 1)
            return fail(d, "instruction %u is of side %u of its choice (expected 0 or 1)", i, in->side);
        in->wanted_rows = wanted_rows;
        if (in->min_tokens < 0 || in->max_tokens < 0 || in->min_tokens > p->max_tokens ||
            in->max_tokens > p->max_tokens || (in->max_tokens != 0 && in->min_tokens > in->max_tokens))
            return fail(
                d,
                "instruction %u runs for T in [%lld, %lld] (expected 0 <= min <= max <= %lld, or max 0: "
                "no upper bound)",
                i, (long long)in->min_tokens, (long long)in->max_tokens, (long long)p->max_tokens);
        bool ok;
        switch (in->op) {
        case PROG_OP_LAUNCH:
            ok = decode_launch(d, i, &in->as.launch) &&
                 check_wanted_launch(d, i, in->wanted_rows, &in->as.launch);
            break;
        case PROG_OP_GEMM:
            ok = decode_gemm(d, i, &in->as.gemm);
            if (ok && in->wanted_rows &&
                !(in->as.gemm.m.a == 1 && in->as.gemm.m.b == 0 && in->as.gemm.m.c == 1))
                ok = fail(
                    d,
                    "instruction %u: a gemm on the wanted rows has rows rule ceil((%lld * T + %lld) / %lld), "
                    "not T",
                    i, (long long)in->as.gemm.m.a, (long long)in->as.gemm.m.b, (long long)in->as.gemm.m.c);
            break;
        default: return fail(d, "instruction %u has unknown op %u", i, in->op);
        }
        if (!ok || !check_needs(d, i, in) || !decode_cost(d, i, &in->cost)) return false;
    }
    return true;
}

static bool same_ref(prog_ref a, prog_ref b) {
    return a.buffer == b.buffer && a.index == b.index && a.offset == b.offset;
}

/* vocab sizes the logits the runtime reads: some instruction must write
 * exactly max_tokens rows of vocab floats there. */
static bool check_logits_written(decoder *d) {
    const program *p = d->out;
    uint64_t expected = (uint64_t)p->max_tokens * p->vocab * 4; /* check_io bounded it */
    for (uint32_t i = 0; i < p->instr_count; i++) {
        const prog_instr *in = &p->instrs[i];
        if (in->op == PROG_OP_GEMM) {
            const prog_gemm *g = &in->as.gemm;
            uint64_t rows = (uint64_t)program_affine_max(g->m, p->max_tokens);
            if (same_ref(g->c, p->logits) && g->dtype_c == SMELT_DTYPE_F32 && (uint64_t)g->n == p->vocab &&
                rows == (uint64_t)p->max_tokens)
                return true;
            continue;
        }
        const prog_launch *l = &in->as.launch;
        for (uint32_t a = 0; a < l->arg_count; a++) {
            const prog_arg *arg = &l->args[a];
            if (arg->kind == PROG_ARG_POINTER && arg->writes && same_ref(arg->ref, p->logits) &&
                (uint64_t)program_affine_max(arg->extent, p->max_tokens) == expected)
                return true;
        }
    }
    return fail(d, "no instruction writes the logits as max_tokens (%lld) rows of vocab (%llu) floats",
                (long long)p->max_tokens, (unsigned long long)p->vocab);
}

/* The greedy instruction, when there is one: the last, a launch, writing the
 * whole int32 at greedy_token. */
static bool check_greedy(decoder *d) {
    const program *p = d->out;
    if (!p->has_greedy) return true;
    if (p->instr_count == 0) return fail(d, "a greedy instruction in a program without instructions");
    if (p->greedy_token.buffer == PROG_BUFFER_WEIGHT) return fail(d, "greedy_token is in a weight");
    if (!check_region(d, p->greedy_token, 4, 4, "greedy_token")) return false;
    const prog_instr *in = &p->instrs[p->instr_count - 1];
    if (in->op != PROG_OP_LAUNCH) return fail(d, "the greedy instruction is not a launch");
    if (in->wanted_rows) return fail(d, "the greedy instruction runs on the wanted rows");
    const prog_launch *l = &in->as.launch;
    for (uint32_t a = 0; a < l->arg_count; a++) {
        const prog_arg *arg = &l->args[a];
        if (arg->kind == PROG_ARG_POINTER && arg->writes && arg->ref.buffer == p->greedy_token.buffer &&
            arg->ref.index == p->greedy_token.index && arg->ref.offset <= p->greedy_token.offset &&
            (uint64_t)program_affine_max(arg->extent, p->max_tokens) >= 4 &&
            p->greedy_token.offset - arg->ref.offset <=
                (uint64_t)program_affine_max(arg->extent, p->max_tokens) - 4)
            return true;
    }
    return fail(d, "the greedy instruction does not write greedy_token");
}

static bool get_cost_figure(decoder *d, uint32_t i, const char *what, double *out) {
    uint64_t bits;
    if (!plan_cursor_u64(&d->cursor, &bits)) return truncated(d, "a choice");
    memcpy(out, &bits, sizeof bits);
    if (!(*out >= 0.0) || *out > PROGRAM_COST_COEFFICIENT_LIMIT)
        return fail(d, "choice %u: its modeled %s is %g (expected 0 .. %g)", i, what, *out,
                    PROGRAM_COST_COEFFICIENT_LIMIT);
    return true;
}

/* The choices, and every instruction's choice index against them. */
static bool decode_choices(decoder *d) {
    program *p = d->out;
    if (!get_count(d, &p->choice_count, ENCODED_CHOICE_MIN, "choice")) return false;
    if (p->choice_count) {
        p->choices = calloc(p->choice_count, sizeof *p->choices);
        if (!p->choices) return fail(d, "out of memory for %u choices", p->choice_count);
    }
    for (uint32_t i = 0; i < p->choice_count; i++) {
        prog_choice *c = &p->choices[i];
        if (!plan_cursor_i64(&d->cursor, &c->min_tokens) || !plan_cursor_i64(&d->cursor, &c->max_tokens))
            return truncated(d, "a choice");
        if (c->min_tokens < 1 || c->max_tokens < c->min_tokens || c->max_tokens > p->max_tokens ||
            c->max_tokens - c->min_tokens >= PROG_CHOICE_MAX_TOKENS)
            return fail(d,
                        "choice %u is for T in [%lld, %lld] (expected 1 <= min <= max <= %lld, at most %d)",
                        i, (long long)c->min_tokens, (long long)c->max_tokens, (long long)p->max_tokens,
                        PROG_CHOICE_MAX_TOKENS);
        for (int side = 0; side < 2; side++)
            for (int64_t t = c->min_tokens; t <= c->max_tokens; t++) {
                prog_choice_cost *cost = &c->cost[side][t - c->min_tokens];
                uint8_t tensor;
                if (!get_cost_figure(d, i, "bytes", &cost->bytes) ||
                    !get_cost_figure(d, i, "flops", &cost->flops))
                    return false;
                if (!plan_cursor_u32(&d->cursor, &cost->launches) || !get_u8(d, &tensor))
                    return truncated(d, "a choice");
                if (tensor > 1) return fail(d, "choice %u: a tensor-core flag of %u", i, tensor);
                cost->tensor_cores = tensor;
            }
    }
    for (uint32_t i = 0; i < p->instr_count; i++)
        if (p->instrs[i].choice > p->choice_count)
            return fail(d, "instruction %u is of choice %u, but the program has %u", i, p->instrs[i].choice,
                        p->choice_count);
    return true;
}

bool program_decode(const uint8_t *bytes, size_t size, program *out, char *error, size_t error_size) {
    memset(out, 0, sizeof *out);
    decoder d = {.out = out, .error = error, .error_size = error_size};
    if (error_size) error[0] = '\0';
    plan_cursor_init(&d.cursor, bytes, size);
    bool ok = decode_header(&d) && decode_states(&d) && check_positions(&d) && check_io(&d) &&
              decode_weights(&d) && check_id_bound(&d) && decode_instrs(&d) && check_fallbacks(&d) &&
              check_logits_written(&d) && check_greedy(&d) && decode_choices(&d);
    if (ok && plan_cursor_left(&d.cursor) != 0)
        ok = fail(&d, "%llu unexpected bytes after the last choice",
                  (unsigned long long)plan_cursor_left(&d.cursor));
    if (!ok) {
        if (!d.failed) fail(&d, "malformed");
        program_free(out);
    }
    return ok;
}

static bool same_affine(prog_affine a, plan_affine b) { return a.a == b.a && a.b == b.b && a.c == b.c; }

/* The launch rule of instruction i equals the kernel table's rule for its
 * kernel: the kernel is generated to be safe for that rule alone. */
static bool check_rule_matches(const prog_launch *l, const plan_kernel *k, uint32_t i, char *error,
                               size_t error_size) {
    bool same = l->rule.dynamic_shared_bytes == k->launch.dynamic_shared_bytes;
    for (int d = 0; d < 3; d++)
        same = same && same_affine(l->rule.grid[d], k->launch.grid[d]) &&
               same_affine((prog_affine){0, l->rule.block[d], 1}, k->launch.block[d]);
    if (same) return true;
    snprintf(error, error_size,
             "program: instruction %u launches kernel %u '%.*s%s' with a grid, block or shared memory that "
             "is not the kernel table's launch rule for it",
             i, l->kernel, (int)(k->name.length > 64 ? 64 : k->name.length), k->name.data,
             k->name.length > 64 ? "..." : "");
    return false;
}

/* Every launch of a kernel passes what the kernel table declares for it:
 * the same arguments, each of the declared kind, extent and access. Those
 * are facts of the kernel's code, stored beside it; the launch program
 * cannot widen them. */
static bool check_declared_arguments(const prog_launch *l, const plan_kernel *k, uint32_t i, char *error,
                                     size_t error_size) {
    if (l->arg_count != k->param_count) {
        snprintf(error, error_size,
                 "program: instruction %u launches kernel %u '%.*s%s' with %u arguments, but it declares %u",
                 i, l->kernel, (int)(k->name.length > 64 ? 64 : k->name.length), k->name.data,
                 k->name.length > 64 ? "..." : "", l->arg_count, k->param_count);
        return false;
    }
    for (uint32_t a = 0; a < l->arg_count; a++) {
        const prog_arg *x = &l->args[a];
        const plan_kernel_param *declared = &k->params[a];
        bool same = x->kind == declared->kind &&
                    (x->kind != PROG_ARG_POINTER ||
                     ((uint32_t)x->writes == declared->writes && same_affine(x->extent, declared->extent)));
        if (same) continue;
        snprintf(
            error, error_size,
            "program: instruction %u (kernel %u '%.*s%s') argument %u is not what the kernel table declares "
            "for it (kind, extent or access differ)",
            i, l->kernel, (int)(k->name.length > 64 ? 64 : k->name.length), k->name.data,
            k->name.length > 64 ? "..." : "", a);
        return false;
    }
    return true;
}

void program_declare_params(const program *p, uint32_t kernel, plan_kernel *out) {
    out->param_count = 0;
    for (uint32_t i = 0; i < p->instr_count; i++) {
        const prog_instr *in = &p->instrs[i];
        if (in->op != PROG_OP_LAUNCH || in->as.launch.kernel != kernel) continue;
        const prog_launch *l = &in->as.launch;
        out->param_count = l->arg_count;
        for (uint32_t a = 0; a < l->arg_count; a++) {
            const prog_arg *arg = &l->args[a];
            bool pointer = arg->kind == PROG_ARG_POINTER;
            out->params[a] = (plan_kernel_param){
                .kind = arg->kind,
                .extent = pointer ? (plan_affine){arg->extent.a, arg->extent.b, arg->extent.c}
                                  : (plan_affine){0, 0, 1},
                .writes = pointer && arg->writes,
            };
        }
        return;
    }
}

bool program_check_plan(const program *p, const plan_kernel *kernels, uint32_t kernel_count,
                        uint64_t weight_data_size, char *error, size_t error_size) {
    bool ok = true;
    for (uint32_t i = 0; i < p->instr_count && ok; i++) {
        const prog_instr *in = &p->instrs[i];
        if (in->op != PROG_OP_LAUNCH) continue;
        const prog_launch *l = &in->as.launch;
        if (l->kernel >= kernel_count) {
            snprintf(error, error_size,
                     "program: instruction %u launches kernel %u but the plan has %u kernels", i, l->kernel,
                     kernel_count);
            ok = false;
        } else {
            ok = check_rule_matches(l, &kernels[l->kernel], i, error, error_size) &&
                 check_declared_arguments(l, &kernels[l->kernel], i, error, error_size);
        }
    }
    if (!ok) return false;
    for (uint32_t i = 0; i < p->weight_count; i++) {
        const prog_weight *w = &p->weights[i];
        uint64_t end;
        /* A quantized weight's sections are 16-byte aligned from its start (QUANT_ALIGN). */
        uint64_t alignment = w->quant.kind != PROG_QUANT_NONE ? 16 : smelt_dtype_element_bytes(w->dtype);
        if (w->data_offset == UINT64_MAX) continue; /* bound at run time */
        if (__builtin_add_overflow(w->data_offset, w->bytes, &end) || end > weight_data_size ||
            w->data_offset % alignment != 0) {
            snprintf(error, error_size,
                     "program: weight '%.*s%s' (%llu bytes at offset %llu) lies outside the %llu bytes of "
                     "weight data or is misaligned",
                     (int)(strlen(w->name) > 64 ? 64 : strlen(w->name)), w->name,
                     strlen(w->name) > 64 ? "..." : "", (unsigned long long)w->bytes,
                     (unsigned long long)w->data_offset, (unsigned long long)weight_data_size);
            return false;
        }
    }
    return true;
}

void program_free(program *p) {
    for (uint32_t i = 0; p->weights && i < p->weight_count; i++) {
        free((char *)p->weights[i].name);
        for (uint32_t k = 0; p->weights[i].parts && k < p->weights[i].part_count; k++)
            free((char *)p->weights[i].parts[k].name);
        free(p->weights[i].parts);
    }
    free(p->weights);
    free(p->state_bytes);
    free(p->state_rows);
    free(p->instrs);
    free(p->choices);
    memset(p, 0, sizeof *p);
}

int64_t program_stacked_part(const prog_weight *w, const char *name) {
    const char *hole = strstr(w->name, "{e}");
    if (!w->stacked || !hole) return -1;
    size_t prefix = (size_t)(hole - w->name), suffix = strlen(hole + 3), length = strlen(name);
    if (length <= prefix + suffix || strncmp(name, w->name, prefix) != 0 ||
        strcmp(name + length - suffix, hole + 3) != 0)
        return -1;
    const char *digits = name + prefix;
    size_t count = length - prefix - suffix;
    if (count > 9 || (digits[0] == '0' && count > 1)) return -1;
    int64_t value = 0;
    for (size_t i = 0; i < count; i++) {
        if (digits[i] < '0' || digits[i] > '9') return -1;
        value = value * 10 + (digits[i] - '0');
    }
    return value < w->shape[0] ? value : -1;
}
