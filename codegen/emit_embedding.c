/* emit_embedding.c - the embedding kernel: row ids[t] of table[V, D] for
 * every id.
 *
 * One block per id, a multiple of 32 threads up to 256 striding over the D
 * elements of the row; same-dtype rows are copied as raw bits. An id outside
 * [0, V) gives a row of zeros rather than a read out of bounds: the runtime
 * checks the ids of a step before it launches anything (the reference
 * reports them, reference/ref_ops.c).
 *
 * A quantized table (the token embedding under the int4 presets,
 * passes/precision.c) is int8 codes with one f16 scale per row, in
 * quant/quant.h's packed layout: the block reads its row's scale once and
 * writes code * scale for each element, in f32 as quant_value defines, so
 * a step reads D + 2 bytes per id instead of the float row. The verifier
 * admits no other quantized table.
 */
#include "emit_internal.h"

#include "quant.h"

enum { EMBEDDING_MAX_THREADS = 256 };

/* The int8 format with one scale per row that a quantized table has (the
 * verifier's rule), into *out; false when the table is not quantized. */
static bool quantized_table(cg_emit *e, ir_value_id table, int64_t vocab, int64_t width, quant_layout *out) {
    quant_format f;
    if (!ir_weight_quant(e->m, e->m->values[table].def_op, &f)) return false;
    if (f.kind != QUANT_INT8 || f.group != (uint64_t)width || f.has_zero || f.has_group_index ||
        f.has_column_scale || f.interleaved || quant_layout_of(&f, (uint64_t)vocab, (uint64_t)width, out))
        SMELT_DIE("embedding table %u: a quantized format the verifier refuses", table);
    return true;
}

bool cg_emit_embedding(cg_emit *e) {
    ir_value_id table = cg_operand(e, 0), ids = cg_operand(e, 1), result = cg_result(e, 0);
    cg_shape table_shape = cg_shape_of(e, table), ids_shape = cg_shape_of(e, ids);
    if (table_shape.rank != 2 || table_shape.token0 || smelt_dtype_is_float(e->m->values[ids].type.dtype) ||
        !(smelt_dtype_is_float(e->m->values[table].type.dtype) || cg_is_quantized(e->m, table))) {
        diag_error(e->d, e->ir->loc, "embedding: expected a float or int8 table [V, D] and integer ids");
        return false;
    }
    int64_t vocab = table_shape.dims[0], width = table_shape.dims[1];
    cg_shape expected = ids_shape, out_shape = cg_shape_of(e, result); /* [..., D] */
    expected.dims[expected.rank++] = width;
    if (!cg_expect(e, ids_shape.rank < IR_MAX_DIMS && cg_same_shape(&expected, &out_shape),
                   "a result of shape [..., %lld]", (long long)width))
        return false;
    quant_layout packed;
    bool quantized = quantized_table(e, table, vocab, width, &packed);
    cg_count rows = cg_shape_count(&ids_shape, 0, ids_shape.rank);
    uint32_t threads =
        width >= EMBEDDING_MAX_THREADS ? EMBEDDING_MAX_THREADS : (uint32_t)((width + 31) / 32 * 32);

    ir_value_id stored[2] = {table, result};
    const char *name = arena_printf(&e->scratch, "embedding_%s_v%lld_d%lld", cg_dtype_tag(e, stored, 2),
                                    (long long)vocab, (long long)width);
    cg_kernel_builder b;
    cg_kernel_begin(&b, e, name,
                    quantized
                        ? "One block per id: out[t] = table[ids[t]], the int8 codes of the row times its "
                          "f16 scale; an id outside the table gives zeros (the runtime checks ids before "
                          "a step)."
                        : "One block per id: out[t] = table[ids[t]]; an id outside the table gives zeros "
                          "(the runtime checks ids before a step).");
    uint32_t table_param = cg_param_value(&b, "table", table, true);
    cg_param_value(&b, "ids", ids, true);
    uint32_t out = cg_param_value(&b, "out", result, false);
    cg_kernel_launch(&b, cg_count_blocks(rows, 1), (prog_affine){0, 1, 1}, threads);
    cg_kernel_open(&b);
    cg_text *t = &b.text;
    cg_line(t, "enum { VOCAB = %lld, WIDTH = %lld, THREADS = %u };", (long long)vocab, (long long)width,
            threads);
    if (quantized)
        cg_line(t, "#define SCALES_AT %lluLL /* byte offset of the f16 scale of each row (quant/quant.h) */",
                (unsigned long long)packed.scales);
    cg_blank(t);
    cg_kernel_signature(&b);
    cg_line(t, "long long row = blockIdx.x;");
    cg_line(t, "int id = ids[row];");
    cg_line(t, "if (id < 0 || id >= VOCAB) {");
    cg_line(t, "for (int i = threadIdx.x; i < WIDTH; i += THREADS)");
    cg_line(t, "    %s", cg_store(&b, out, "row * WIDTH + i", "0.0f"));
    cg_line(t, "return;");
    cg_line(t, "}");
    if (quantized) {
        cg_line(
            t,
            "const int8_t *codes = (const int8_t *)(table + (long long)id * WIDTH); /* the row's codes */");
        cg_line(t, "float scale = smelt_f16_to_f32(((const uint16_t *)(table + SCALES_AT))[id]);");
        cg_line(t, "for (int i = threadIdx.x; i < WIDTH; i += THREADS)");
        cg_line(t, "    %s", cg_store(&b, out, "row * WIDTH + i", "(float)codes[i] * scale"));
    } else {
        cg_line(t, "for (int i = threadIdx.x; i < WIDTH; i += THREADS)");
        cg_line(t, "    %s", cg_copy(&b, out, "row * WIDTH + i", table_param, "(long long)id * WIDTH + i"));
    }
    cg_kernel_end(&b);
    /* Modeled cost (emit.h): the rows gathered, not the whole table the
     * kernel may touch; a quantized row is its codes and its scale. */
    double ids_row = (double)smelt_dtype_element_bytes(cg_storage_dtype(e->m, ids));
    double table_row = quantized
                           ? (double)width + 2.0
                           : (double)width * (double)smelt_dtype_element_bytes(cg_storage_dtype(e->m, table));
    double out_row = (double)width * (double)smelt_dtype_element_bytes(cg_storage_dtype(e->m, result));
    prog_poly ids_poly = {.constant = (double)rows.constant, .per_token = (double)rows.per_token};
    prog_cost *cost = arena_alloc(e->a, sizeof *cost);
    cost->read = prog_poly_scaled(ids_poly, table_row + ids_row);
    cost->written = prog_poly_scaled(ids_poly, out_row);
    e->out->kernels[e->out->kernel_count - 1].cost = cost;
    e->out->kind = CG_LOWER_KERNELS;
    return true;
}
