/* emit_embedding.c - the embedding kernel: row ids[t] of table[V, D] for
 * every id.
 *
 * One block per id, a multiple of 32 threads up to 256 striding over the D
 * elements of the row; same-dtype rows are copied as raw bits. An id outside
 * [0, V) gives a row of zeros rather than a read out of bounds: the runtime
 * checks the ids of a step before it launches anything (the reference
 * reports them, reference/ref_ops.c).
 */
#include "emit_internal.h"

enum { EMBEDDING_MAX_THREADS = 256 };

bool cg_emit_embedding(cg_emit *e) {
    ir_value_id table = cg_operand(e, 0), ids = cg_operand(e, 1), result = cg_result(e, 0);
    cg_shape table_shape = cg_shape_of(e, table), ids_shape = cg_shape_of(e, ids);
    if (table_shape.rank != 2 || table_shape.token0 || smelt_dtype_is_float(e->m->values[ids].type.dtype) ||
        !smelt_dtype_is_float(e->m->values[table].type.dtype)) {
        diag_error(e->d, e->ir->loc, "embedding: expected a float table [V, D] and integer ids");
        return false;
    }
    int64_t vocab = table_shape.dims[0], width = table_shape.dims[1];
    cg_shape expected = ids_shape, out_shape = cg_shape_of(e, result); /* [..., D] */
    expected.dims[expected.rank++] = width;
    if (!cg_expect(e, ids_shape.rank < IR_MAX_DIMS && cg_same_shape(&expected, &out_shape),
                   "a result of shape [..., %lld]", (long long)width))
        return false;
    cg_count rows = cg_shape_count(&ids_shape, 0, ids_shape.rank);
    uint32_t threads =
        width >= EMBEDDING_MAX_THREADS ? EMBEDDING_MAX_THREADS : (uint32_t)((width + 31) / 32 * 32);

    ir_value_id stored[2] = {table, result};
    const char *name = arena_printf(&e->scratch, "embedding_%s_v%lld_d%lld", cg_dtype_tag(e, stored, 2),
                                    (long long)vocab, (long long)width);
    cg_kernel_builder b;
    cg_kernel_begin(
        &b, e, name,
        "One block per id: out[t] = table[ids[t]]; an id outside the table gives zeros (the runtime "
        "checks ids before a step).");
    uint32_t table_param = cg_param_value(&b, "table", table, true);
    cg_param_value(&b, "ids", ids, true);
    uint32_t out = cg_param_value(&b, "out", result, false);
    cg_kernel_launch(&b, cg_count_blocks(rows, 1), (prog_affine){0, 1, 1}, threads);
    cg_kernel_open(&b);
    cg_text *t = &b.text;
    cg_line(t, "enum { VOCAB = %lld, WIDTH = %lld, THREADS = %u };", (long long)vocab, (long long)width,
            threads);
    cg_blank(t);
    cg_kernel_signature(&b);
    cg_line(t, "long long row = blockIdx.x;");
    cg_line(t, "int id = ids[row];");
    cg_line(t, "if (id < 0 || id >= VOCAB) {");
    cg_line(t, "for (int i = threadIdx.x; i < WIDTH; i += THREADS)");
    cg_line(t, "    %s", cg_store(&b, out, "row * WIDTH + i", "0.0f"));
    cg_line(t, "return;");
    cg_line(t, "}");
    cg_line(t, "for (int i = threadIdx.x; i < WIDTH; i += THREADS)");
    cg_line(t, "    %s", cg_copy(&b, out, "row * WIDTH + i", table_param, "(long long)id * WIDTH + i"));
    cg_kernel_end(&b);
    /* Modeled cost (emit.h): the rows gathered, not the whole table the
     * kernel may touch. */
    double ids_row = (double)smelt_dtype_element_bytes(cg_storage_dtype(e->m, ids));
    double table_row = (double)width * (double)smelt_dtype_element_bytes(cg_storage_dtype(e->m, table));
    double out_row = (double)width * (double)smelt_dtype_element_bytes(cg_storage_dtype(e->m, result));
    prog_poly ids_poly = {.constant = (double)rows.constant, .per_token = (double)rows.per_token};
    prog_cost *cost = arena_alloc(e->a, sizeof *cost);
    cost->read = prog_poly_scaled(ids_poly, table_row + ids_row);
    cost->written = prog_poly_scaled(ids_poly, out_row);
    e->out->kernels[e->out->kernel_count - 1].cost = cost;
    e->out->kind = CG_LOWER_KERNELS;
    return true;
}
