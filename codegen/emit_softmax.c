/* emit_softmax.c - the softmax kernel: exp(x - max) / sum along one axis.
 *
 * The value is seen as [outer, length, inner] around the axis; one block per
 * (outer, inner) row of `length` elements at stride `inner`, a multiple of
 * 32 threads up to 256. Three passes over the row: the max, the sum of
 * exp(x - max), then the results (reference/ref_ops.c: the max subtracted
 * first). The axis may be the token dim (dim 0 of a [tokens, ...] value):
 * the length is then the token count.
 */
#include "emit_internal.h"

enum { SOFTMAX_MAX_THREADS = 256 };

bool cg_emit_softmax(cg_emit *e) {
    ir_value_id x = cg_operand(e, 0), result = cg_result(e, 0);
    if (!smelt_dtype_is_float(e->m->values[x].type.dtype)) {
        diag_error(e->d, e->ir->loc, "codegen supports 'softmax' on float values only; found %s",
                   smelt_dtype_name(e->m->values[x].type.dtype));
        return false;
    }
    cg_shape shape = cg_shape_of(e, x);
    int64_t axis = cg_attr_int(e, "axis", -1);
    if (axis < 0) axis += shape.rank;
    if (shape.rank == 0 || axis < 0 || axis >= shape.rank) {
        diag_error(e->d, e->ir->loc, "softmax: axis %lld is outside the %u dims of its operand",
                   (long long)cg_attr_int(e, "axis", -1), shape.rank);
        return false;
    }
    cg_shape out_shape = cg_shape_of(e, result);
    if (!cg_expect(e, cg_same_shape(&shape, &out_shape), "a result of the operand's shape")) return false;
    unsigned a = (unsigned)axis;
    cg_count outer = cg_shape_count(&shape, 0, a), length = cg_shape_count(&shape, a, a + 1);
    cg_count inner = cg_shape_count(&shape, a + 1, shape.rank);
    cg_count rows = {outer.per_token * inner.constant, outer.constant * inner.constant};
    uint32_t threads = SOFTMAX_MAX_THREADS;
    if (!length.per_token && length.constant < SOFTMAX_MAX_THREADS)
        threads = (uint32_t)((length.constant + 31) / 32 * 32);

    ir_value_id stored[2] = {x, result};
    const char *name =
        arena_printf(&e->scratch, "softmax_%s_l%s_i%lld", cg_dtype_tag(e, stored, 2),
                     length.per_token ? "t" : arena_printf(&e->scratch, "%lld", (long long)length.constant),
                     (long long)inner.constant);
    cg_kernel_builder b;
    cg_kernel_begin(
        &b, e, name,
        "One block per row of `length` elements at stride INNER: the max, the sum of exp(x - max), "
        "then exp(x - max) / sum.");
    uint32_t in = cg_param_value(&b, "x", x, true);
    uint32_t out = cg_param_value(&b, "out", result, false);
    if (length.per_token) cg_param_tokens(&b);
    cg_kernel_launch(&b, cg_count_blocks(rows, 1), (prog_affine){0, 1, 1}, threads);
    cg_kernel_open(&b);
    cg_text *t = &b.text;
    cg_line(t, "enum { INNER = %lld, THREADS = %u };", (long long)inner.constant, threads);
    cg_blank(t);
    cg_write_block_reductions(t, true);
    cg_kernel_signature(&b);
    cg_line(t, "__shared__ float scratch[32];");
    cg_line(t, "long long length = %s;", cg_count_text(e, length));
    cg_line(t, "long long row = blockIdx.x;");
    cg_line(t, "long long base = row / INNER * length * INNER + row %% INNER; /* element 0 of the row */");
    cg_line(t, "float max = %s;", CG_NEGATIVE_INFINITY);
    cg_line(t, "for (long long i = threadIdx.x; i < length; i += THREADS)");
    cg_line(t, "    max = fmaxf(max, %s);", cg_load(&b, in, "base + i * INNER"));
    cg_line(t, "max = block_max(max, scratch);");
    cg_line(t, "float sum = 0.0f;");
    cg_line(t, "for (long long i = threadIdx.x; i < length; i += THREADS)");
    cg_line(t, "    sum += expf(%s - max);", cg_load(&b, in, "base + i * INNER"));
    cg_line(t, "sum = block_sum(sum, scratch);");
    cg_line(t, "for (long long i = threadIdx.x; i < length; i += THREADS)");
    cg_line(t, "    %s",
            cg_store(&b, out, "base + i * INNER",
                     arena_printf(&e->scratch, "expf(%s - max) / sum", cg_load(&b, in, "base + i * INNER"))));
    cg_kernel_end(&b);
    e->out->kind = CG_LOWER_KERNELS;
    return true;
}
