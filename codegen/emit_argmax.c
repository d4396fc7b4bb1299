/* emit_argmax.c - the argmax kernel: the index (i32) of the first maximum
 * along one axis, the axis removed.
 *
 * The operand is seen as [outer, length, inner] around the axis; one block
 * per (outer, inner) row. Each thread scans its elements in increasing index
 * order keeping the first largest, then the block reduces (value, index)
 * pairs, a larger value or an equal value at a lower index winning, through
 * warp shuffles and shared memory: the first maximum, as the reference
 * (reference/ref_ops.c) and torch.argmax give. Rows holding NaN have no
 * defined answer. Float operands compare as float, integer ones as int.
 */
#include "emit_internal.h"

enum { ARGMAX_MAX_THREADS = 256 };

/* Writes the warp- and block-level (value, index) reduction helpers for
 * values of C type `type` shuffled with smelt_shfl_xor_<suffix>. */
static void write_pair_reduction(cg_text *t, const char *type, const char *suffix) {
    cg_line(t, "/* Whether (value, index) beats (best, best_index): larger, or equal and earlier. */");
    cg_line(t, "SMELT_DEVICE int beats(%s value, int index, %s best, int best_index)", type, type);
    cg_line(t, "{");
    cg_line(t, "return value > best || (value == best && index < best_index);");
    cg_line(t, "}");
    cg_blank(t);
    cg_line(t, "/* The winning pair of a warp, in every lane. */");
    cg_line(t, "SMELT_DEVICE void warp_argmax(%s *value, int *index)", type);
    cg_line(t, "{");
    cg_line(t, "for (int offset = 16; offset > 0; offset /= 2) {");
    cg_line(t, "%s other = smelt_shfl_xor_%s(0xffffffffu, *value, offset);", type, suffix);
    cg_line(t, "int other_index = smelt_shfl_xor_i32(0xffffffffu, *index, offset);");
    cg_line(t, "if (beats(other, other_index, *value, *index)) {");
    cg_line(t, "*value = other;");
    cg_line(t, "*index = other_index;");
    cg_line(t, "}");
    cg_line(t, "}");
    cg_line(t, "}");
    cg_blank(t);
}

/* After each thread's own best (best, best_index): the warps' bests, then
 * the block's, which lane 0 of warp 0 stores with `store` (a statement). */
static void write_block_result(cg_text *t, const char *store) {
    cg_line(t, "warp_argmax(&best, &best_index);");
    cg_line(t, "if (lane == 0) {");
    cg_line(t, "warp_best[warp] = best;");
    cg_line(t, "warp_best_index[warp] = best_index;");
    cg_line(t, "}");
    cg_line(t, "__syncthreads();");
    cg_line(t, "if (warp == 0) {");
    cg_line(t, "best = lane < WARPS ? warp_best[lane] : warp_best[0];");
    cg_line(t, "best_index = lane < WARPS ? warp_best_index[lane] : warp_best_index[0];");
    cg_line(t, "warp_argmax(&best, &best_index);");
    cg_line(t, "if (lane == 0)");
    cg_line(t, "    %s", store);
    cg_line(t, "}");
}

bool cg_emit_argmax(cg_emit *e) {
    ir_value_id x = cg_operand(e, 0), result = cg_result(e, 0);
    cg_shape shape = cg_shape_of(e, x);
    int64_t axis = cg_attr_int(e, "axis", -1);
    if (axis < 0) axis += shape.rank;
    if (shape.rank == 0 || axis < 0 || axis >= shape.rank) {
        diag_error(e->d, e->ir->loc, "argmax: axis %lld is outside the %u dims of its operand",
                   (long long)cg_attr_int(e, "axis", -1), shape.rank);
        return false;
    }
    if (smelt_dtype_is_float(e->m->values[result].type.dtype)) {
        diag_error(e->d, e->ir->loc, "argmax: expected an integer result; found %s",
                   smelt_dtype_name(e->m->values[result].type.dtype));
        return false;
    }
    cg_shape expected = shape, out_shape = cg_shape_of(e, result); /* the operand without the axis */
    expected.rank--;
    for (unsigned i = (unsigned)axis; i < expected.rank; i++)
        expected.dims[i] = shape.dims[i + 1];
    expected.token0 = shape.token0 && axis != 0;
    if (!cg_expect(e, cg_same_shape(&expected, &out_shape),
                   "a result of the operand's shape without the axis"))
        return false;
    unsigned a = (unsigned)axis;
    cg_count outer = cg_shape_count(&shape, 0, a), length = cg_shape_count(&shape, a, a + 1);
    cg_count inner = cg_shape_count(&shape, a + 1, shape.rank);
    cg_count rows = {outer.per_token * inner.constant, outer.constant * inner.constant};
    uint32_t threads = ARGMAX_MAX_THREADS;
    if (!length.per_token && length.constant < ARGMAX_MAX_THREADS)
        threads = (uint32_t)((length.constant + 31) / 32 * 32);
    bool is_float = smelt_dtype_is_float(e->m->values[x].type.dtype);
    const char *type = is_float ? "float" : "int";

    ir_value_id stored[1] = {x};
    const char *name =
        arena_printf(&e->scratch, "argmax_%s_l%s_i%lld", is_float ? cg_dtype_tag(e, stored, 1) : "i32",
                     length.per_token ? "t" : arena_printf(&e->scratch, "%lld", (long long)length.constant),
                     (long long)inner.constant);
    cg_kernel_builder b;
    cg_kernel_begin(
        &b, e, name,
        "One block per row of `length` elements at stride INNER: the index of the first maximum.");
    uint32_t in = cg_param_value(&b, "x", x, true);
    uint32_t out = cg_param_value(&b, "out", result, false);
    if (length.per_token) cg_param_tokens(&b);
    cg_kernel_launch(&b, cg_count_blocks(rows, 1), (prog_affine){0, 1, 1}, threads);
    cg_kernel_open(&b);
    cg_text *t = &b.text;
    cg_line(t, "enum { INNER = %lld, THREADS = %u, WARPS = THREADS / 32 };", (long long)inner.constant,
            threads);
    cg_blank(t);
    write_pair_reduction(t, type, is_float ? "f32" : "i32");
    cg_kernel_signature(&b);
    cg_line(t, "__shared__ %s warp_best[32];", type);
    cg_line(t, "__shared__ int warp_best_index[32];");
    cg_line(t, "long long length = %s;", cg_count_text(e, length));
    cg_line(t, "long long row = blockIdx.x;");
    cg_line(t, "long long base = row / INNER * length * INNER + row %% INNER; /* element 0 of the row */");
    cg_line(t, "int lane = threadIdx.x %% 32, warp = threadIdx.x / 32;");
    cg_line(t, "/* This thread's first largest element; a thread without elements loses to any. */");
    cg_line(t, "%s best = %s;", type, is_float ? CG_NEGATIVE_INFINITY : "-2147483647 - 1");
    cg_line(t, "int best_index = 0x7fffffff;");
    cg_line(t, "for (long long i = threadIdx.x; i < length; i += THREADS) {");
    cg_line(t, "%s value = %s;", type, cg_load(&b, in, "base + i * INNER"));
    cg_line(t, "if (beats(value, (int)i, best, best_index)) {");
    cg_line(t, "best = value;");
    cg_line(t, "best_index = (int)i;");
    cg_line(t, "}");
    cg_line(t, "}");
    write_block_result(t, cg_store(&b, out, "row", "best_index"));
    cg_kernel_end(&b);
    e->out->kind = CG_LOWER_KERNELS;
    return true;
}

/* ---- greedy decoding --------------------------------------------------------------- */

enum { GREEDY_MAX_THREADS = 1024 };

/* The plan's greedy kernel (cg_emit_greedy): one block scans the last row of
 * the logits, f32 [T, vocab], and writes the index of its first maximum to
 * token[0]. A NaN never wins; a row of NaN only leaves 0x7fffffff, which the
 * runtime reports. */
bool cg_emit_greedy_argmax(cg_emit *e) {
    ir_value_id logits = cg_operand(e, 0);
    cg_shape shape = cg_shape_of(e, logits);
    if (shape.rank != 2 || !shape.token0 || cg_storage_dtype(e->m, logits) != SMELT_DTYPE_F32) {
        diag_error(e->d, e->ir->loc, "greedy decoding: expected logits f32[tokens, vocab]");
        return false;
    }
    int64_t vocab = shape.dims[1];
    uint32_t threads = vocab < GREEDY_MAX_THREADS ? (uint32_t)((vocab + 31) / 32 * 32) : GREEDY_MAX_THREADS;
    cg_kernel_builder b;
    cg_kernel_begin(&b, e, arena_printf(&e->scratch, "greedy_argmax_f32_v%lld", (long long)vocab),
                    "One block: the index of the first maximum of the last row of the logits, the token "
                    "greedy decoding picks, so that only it crosses to the host.");
    b.k->family = "argmax"; /* the op is the logits' output; the kernel is an argmax */
    uint32_t in = cg_param_value(&b, "logits", logits, true);
    cg_param_state(&b, "token", 0, SMELT_DTYPE_I32);
    cg_param_tokens(&b);
    cg_kernel_launch(&b, (prog_affine){0, 1, 1}, (prog_affine){0, 1, 1}, threads);
    cg_kernel_open(&b);
    cg_text *t = &b.text;
    cg_line(t, "enum { VOCAB = %lld, THREADS = %u, WARPS = THREADS / 32 };", (long long)vocab, threads);
    cg_blank(t);
    write_pair_reduction(t, "float", "f32");
    cg_kernel_signature(&b);
    cg_line(t, "__shared__ float warp_best[32];");
    cg_line(t, "__shared__ int warp_best_index[32];");
    cg_line(t, "long long base = (long long)(tokens - 1) * VOCAB; /* the last row: the next token's */");
    cg_line(t, "int lane = threadIdx.x %% 32, warp = threadIdx.x / 32;");
    cg_line(t, "float best = %s;", CG_NEGATIVE_INFINITY);
    cg_line(t, "int best_index = 0x7fffffff;");
    cg_line(t, "for (int i = threadIdx.x; i < VOCAB; i += THREADS) {");
    cg_line(t, "float value = %s;", cg_load(&b, in, "base + i"));
    cg_line(t, "if (beats(value, i, best, best_index)) {");
    cg_line(t, "best = value;");
    cg_line(t, "best_index = i;");
    cg_line(t, "}");
    cg_line(t, "}");
    write_block_result(t, "token[0] = best_index;");
    cg_kernel_end(&b);
    /* It reads the last row alone (not the T rows its argument spans) and writes the token. */
    prog_cost *cost = arena_alloc(e->a, sizeof *cost);
    *cost = (prog_cost){.read = {.constant = (double)vocab * 4}, .written = {.constant = 4}};
    e->out->kernels[e->out->kernel_count - 1].cost = cost;
    e->out->kind = CG_LOWER_KERNELS;
    e->out->state_count = 1;
    e->out->state_bytes[0] = 4;
    e->out->state_rows[0] = 0;
    return true;
}
