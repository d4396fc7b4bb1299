/* emit_layout.c - kernels for the layout family: transpose, concat, split
 * and slice. Data moves, never changes: elements of one dtype are copied as
 * raw bits; where storage dtypes differ (a bf16 value sliced into an f32
 * output) they are converted. Reshape needs no kernel (an alias, emit.c).
 *
 * One thread per element, 256 threads a block: per element of the result
 * for transpose, concat and slice, per element of the operand for split
 * (which writes all its results in one launch). Around the axis a value is
 * [outer, axis, inner]; the axis must be a constant dim, so `outer` is the
 * only count that may hold the token dim (reference/ref_ops_layout.c).
 */
#include "emit_internal.h"

enum { LAYOUT_THREADS = 256 };

static const ir_attr *ints_attr(const cg_emit *e, const char *name) {
    const ir_attr *a = ir_op_attr(e->m, e->op, name);
    return a && a->kind == IR_ATTR_INTS ? a : NULL;
}

/* The axis attribute resolved against `rank`, or -1 after an error; the axis
 * dim must not be the token dim. */
static int layout_axis(cg_emit *e, const cg_shape *s) {
    int64_t axis = cg_attr_int(e, "axis", 0);
    const char *op = ir_op_info_of(e->ir->kind)->name;
    if (axis < 0) axis += s->rank;
    if (axis < 0 || axis >= s->rank) {
        diag_error(e->d, e->ir->loc, "%s: axis %lld is outside the %u dims of its operand", op,
                   (long long)cg_attr_int(e, "axis", 0), s->rank);
        return -1;
    }
    if (axis == 0 && s->token0) {
        diag_error(e->d, e->ir->loc,
                   "codegen supports '%s' along a constant dim; found the token dim as axis 0", op);
        return -1;
    }
    return (int)axis;
}

/* Opens a one-thread-per-element kernel body with `i`, and declares the
 * coordinates around the axis: outer `o`, along the axis `a`, inner `in`
 * (none when the axis is the last dim). */
static void write_element_around_axis(cg_kernel_builder *b, cg_count elements, int64_t axis_length,
                                      int64_t inner) {
    cg_text *t = &b->text;
    cg_line(t, "long long elements = %s;", cg_count_text(b->e, elements));
    cg_line(t, "long long i = (long long)blockIdx.x * THREADS + threadIdx.x;");
    cg_line(t, "if (i >= elements)");
    cg_line(t, "    return;");
    if (inner == 1) {
        cg_line(t, "long long a = i %% %lld;", (long long)axis_length);
        cg_line(t, "long long o = i / %lld;", (long long)axis_length);
        return;
    }
    cg_line(t, "long long in = i %% %lld;", (long long)inner);
    cg_line(t, "long long a = i / %lld %% %lld;", (long long)inner, (long long)axis_length);
    cg_line(t, "long long o = i / %lld;", (long long)(inner * axis_length));
}

/* The element at (o, a + shift, in) of a value whose axis is `length` long:
 * "(o * length + a - start) * inner + in". */
static const char *element_at(cg_emit *e, int64_t length, int64_t shift, int64_t inner) {
    const char *along = shift == 0  ? "a"
                        : shift > 0 ? arena_printf(&e->scratch, "a + %lld", (long long)shift)
                                    : arena_printf(&e->scratch, "a - %lld", -(long long)shift);
    if (inner == 1) return arena_printf(&e->scratch, "o * %lld + %s", (long long)length, along);
    return arena_printf(&e->scratch, "(o * %lld + %s) * %lld + in", (long long)length, along,
                        (long long)inner);
}

static void open_layout_kernel(cg_kernel_builder *b, cg_count elements) {
    if (elements.per_token) cg_param_tokens(b);
    cg_kernel_launch(b, cg_count_blocks(elements, LAYOUT_THREADS), (prog_affine){0, 1, 1}, LAYOUT_THREADS);
    cg_kernel_open(b);
    cg_line(&b->text, "enum { THREADS = %d };", LAYOUT_THREADS);
    cg_blank(&b->text);
    cg_kernel_signature(b);
}

/* ---- transpose ------------------------------------------------------------------------- */

bool cg_emit_transpose(cg_emit *e) {
    ir_value_id x = cg_operand(e, 0), result = cg_result(e, 0);
    cg_shape xs = cg_shape_of(e, x), out = cg_shape_of(e, result);
    const ir_attr *perm = ints_attr(e, "perm");
    bool valid = perm && perm->as.ints.count == xs.rank && out.rank == xs.rank;
    unsigned seen = 0;
    for (unsigned i = 0; valid && i < xs.rank; i++) {
        int64_t p = perm->as.ints.items[i];
        valid = p >= 0 && p < xs.rank && !(seen & (1u << p));
        if (valid) seen |= 1u << p;
    }
    if (!valid) {
        diag_error(e->d, e->ir->loc, "transpose: expected perm to be a permutation of the %u dims", xs.rank);
        return false;
    }
    cg_shape expected = xs;
    for (unsigned j = 0; j < xs.rank; j++)
        expected.dims[j] = xs.dims[perm->as.ints.items[j]];
    expected.token0 = xs.token0 && perm->as.ints.items[0] == 0;
    if (!cg_expect(e, cg_same_shape(&expected, &out), "a result of x's dims permuted")) return false;
    int64_t strides[IR_MAX_DIMS], stride = 1; /* of x, row-major; all constant (T is dim 0) */
    for (int d = (int)xs.rank - 1; d >= 0; d--) {
        strides[d] = stride;
        stride *= xs.dims[d];
    }
    cg_text name;
    cg_text_init(&name);
    ir_value_id stored[2] = {x, result};
    cg_text_printf(&name, "transpose_%s_%s_p", cg_dtype_tag(e, stored, 2), cg_shape_tag(e, &xs));
    for (unsigned i = 0; i < xs.rank; i++)
        cg_text_printf(&name, "%lld", (long long)perm->as.ints.items[i]);
    const char *kernel_name = arena_strdup(&e->scratch, name.data);
    cg_text_free(&name);

    cg_kernel_builder b;
    cg_kernel_begin(&b, e, kernel_name,
                    "One thread per element of the result: result dim j is x dim perm[j], so the element at "
                    "coordinates c reads x at sum c[j] * stride_x[perm[j]].");
    uint32_t in = cg_param_value(&b, "x", x, true);
    uint32_t to = cg_param_value(&b, "out", result, false);
    cg_count elements = cg_shape_count(&out, 0, out.rank);
    open_layout_kernel(&b, elements);
    cg_text *t = &b.text;
    cg_line(t, "long long elements = %s;", cg_count_text(e, elements));
    cg_line(t, "long long i = (long long)blockIdx.x * THREADS + threadIdx.x;");
    cg_line(t, "if (i >= elements)");
    cg_line(t, "    return;");
    cg_line(t, "/* coordinates of element i in the result %s */", cg_shape_tag(e, &out));
    cg_write_coordinates(t, "i", &out, "c");
    cg_text from;
    cg_text_init(&from);
    for (unsigned j = 0; j < out.rank; j++)
        cg_text_printf(&from, "%sc%u * %lld", j ? " + " : "", j, (long long)strides[perm->as.ints.items[j]]);
    cg_line(t, "long long from = %s;", out.rank ? from.data : "0");
    cg_text_free(&from);
    cg_line(t, "%s", cg_copy(&b, to, "i", in, "from"));
    cg_kernel_end(&b);
    e->out->kind = CG_LOWER_KERNELS;
    return true;
}

/* ---- concat ---------------------------------------------------------------------------- */

bool cg_emit_concat(cg_emit *e) {
    ir_value_id result = cg_result(e, 0);
    cg_shape out = cg_shape_of(e, result);
    int axis = layout_axis(e, &out);
    if (axis < 0) return false;
    uint32_t count = e->ir->operand_count;
    if (count > PROG_MAX_ARGS - 2) {
        diag_error(e->d, e->ir->loc, "codegen supports 'concat' of at most %d operands; found %u",
                   PROG_MAX_ARGS - 2, count);
        return false;
    }
    int64_t inner = cg_shape_count(&out, (unsigned)axis + 1, out.rank).constant, total = 0;
    for (uint32_t i = 0; i < count; i++) {
        cg_shape s = cg_shape_of(e, cg_operand(e, i));
        if (!cg_expect(e, cg_same_shape_except(&s, &out, axis),
                       "operand %u to have the result's dims but for the axis", i))
            return false;
        total += s.dims[axis];
    }
    if (total != out.dims[axis]) {
        diag_error(e->d, e->ir->loc, "concat: the operands' axis dims add up to %lld, the result's is %lld",
                   (long long)total, (long long)out.dims[axis]);
        return false;
    }

    ir_value_id stored[PROG_MAX_ARGS];
    for (uint32_t i = 0; i < count; i++)
        stored[i] = cg_operand(e, i);
    stored[count] = result;
    cg_text name;
    cg_text_init(&name);
    cg_text_printf(&name, "concat_%s_a%d", cg_dtype_tag(e, stored, count + 1), axis);
    for (uint32_t i = 0; i < count; i++) {
        cg_shape s = cg_shape_of(e, cg_operand(e, i));
        cg_text_printf(&name, "_%s", cg_shape_tag(e, &s));
    }
    const char *kernel_name = arena_strdup(&e->scratch, name.data);
    cg_text_free(&name);

    cg_kernel_builder b;
    cg_kernel_begin(&b, e, kernel_name,
                    "One thread per element of the result: along the axis, the operands one after another.");
    uint32_t params[PROG_MAX_ARGS];
    for (uint32_t i = 0; i < count; i++)
        params[i] = cg_param_value(&b, arena_printf(&e->scratch, "x%u", i), cg_operand(e, i), true);
    uint32_t to = cg_param_value(&b, "out", result, false);
    cg_count elements = cg_shape_count(&out, 0, out.rank);
    open_layout_kernel(&b, elements);
    write_element_around_axis(&b, elements, out.dims[axis], inner);
    cg_text *t = &b.text;
    int64_t start = 0;
    for (uint32_t i = 0; i < count; i++) {
        cg_shape s = cg_shape_of(e, cg_operand(e, i));
        int64_t length = s.dims[axis];
        const char *from = element_at(e, length, -start, inner);
        if (i + 1 < count)
            cg_line(t, "%sif (a < %lld)", i ? "else " : "", (long long)(start + length));
        else if (i > 0)
            cg_line(t, "else");
        cg_line(t, "%s%s", count > 1 ? "    " : "", cg_copy(&b, to, "i", params[i], from));
        start += length;
    }
    cg_kernel_end(&b);
    e->out->kind = CG_LOWER_KERNELS;
    return true;
}

/* ---- split ----------------------------------------------------------------------------- */

bool cg_emit_split(cg_emit *e) {
    ir_value_id x = cg_operand(e, 0);
    cg_shape xs = cg_shape_of(e, x);
    int axis = layout_axis(e, &xs);
    if (axis < 0) return false;
    const ir_attr *sizes = ints_attr(e, "sizes");
    uint32_t count = e->ir->result_count;
    int64_t total = 0;
    bool valid = sizes && sizes->as.ints.count == count && count >= 1;
    for (uint32_t i = 0; valid && i < count; i++) {
        cg_shape s = cg_shape_of(e, cg_result(e, i));
        valid = sizes->as.ints.items[i] >= 1 && cg_same_shape_except(&s, &xs, axis) &&
                s.dims[axis] == sizes->as.ints.items[i];
        total += valid ? sizes->as.ints.items[i] : 0;
    }
    if (!valid || total != xs.dims[axis]) {
        diag_error(e->d, e->ir->loc, "split: expected sizes of at least 1, one per result, adding up to %lld",
                   (long long)xs.dims[axis]);
        return false;
    }
    if (count > PROG_MAX_ARGS - 2) {
        diag_error(e->d, e->ir->loc, "codegen supports 'split' into at most %d results; found %u",
                   PROG_MAX_ARGS - 2, count);
        return false;
    }
    int64_t inner = cg_shape_count(&xs, (unsigned)axis + 1, xs.rank).constant;

    ir_value_id stored[PROG_MAX_ARGS];
    stored[0] = x;
    for (uint32_t i = 0; i < count; i++)
        stored[i + 1] = cg_result(e, i);
    cg_text name;
    cg_text_init(&name);
    cg_text_printf(&name, "split_%s_a%d_%s_s", cg_dtype_tag(e, stored, count + 1), axis,
                   cg_shape_tag(e, &xs));
    for (uint32_t i = 0; i < count; i++)
        cg_text_printf(&name, "%s%lld", i ? "x" : "", (long long)sizes->as.ints.items[i]);
    const char *kernel_name = arena_strdup(&e->scratch, name.data);
    cg_text_free(&name);

    cg_kernel_builder b;
    cg_kernel_begin(
        &b, e, kernel_name,
        "One thread per element of x: along the axis, the results one after another, all written by "
        "one launch.");
    uint32_t from = cg_param_value(&b, "x", x, true);
    uint32_t params[PROG_MAX_ARGS];
    for (uint32_t i = 0; i < count; i++)
        params[i] = cg_param_value(&b, arena_printf(&e->scratch, "out%u", i), cg_result(e, i), false);
    cg_count elements = cg_shape_count(&xs, 0, xs.rank);
    open_layout_kernel(&b, elements);
    write_element_around_axis(&b, elements, xs.dims[axis], inner);
    cg_text *t = &b.text;
    int64_t start = 0;
    for (uint32_t i = 0; i < count; i++) {
        int64_t length = sizes->as.ints.items[i];
        const char *to = element_at(e, length, -start, inner);
        if (i + 1 < count)
            cg_line(t, "%sif (a < %lld)", i ? "else " : "", (long long)(start + length));
        else if (i > 0)
            cg_line(t, "else");
        cg_line(t, "%s%s", count > 1 ? "    " : "", cg_copy(&b, params[i], to, from, "i"));
        start += length;
    }
    cg_kernel_end(&b);
    e->out->kind = CG_LOWER_KERNELS;
    return true;
}

/* ---- slice ----------------------------------------------------------------------------- */

bool cg_emit_slice(cg_emit *e) {
    ir_value_id x = cg_operand(e, 0), result = cg_result(e, 0);
    cg_shape xs = cg_shape_of(e, x), out = cg_shape_of(e, result);
    int axis = layout_axis(e, &xs);
    if (axis < 0) return false;
    int64_t start = cg_attr_int(e, "start", 0), end = cg_attr_int(e, "end", 0);
    if (start < 0 || end <= start || end > xs.dims[axis] || !cg_same_shape_except(&out, &xs, axis) ||
        out.dims[axis] != end - start) {
        diag_error(e->d, e->ir->loc, "slice: expected 0 <= start < end <= %lld; found [%lld, %lld)",
                   (long long)xs.dims[axis], (long long)start, (long long)end);
        return false;
    }
    int64_t inner = cg_shape_count(&xs, (unsigned)axis + 1, xs.rank).constant;
    ir_value_id stored[2] = {x, result};
    const char *name = arena_printf(&e->scratch, "slice_%s_a%d_%s_%lldto%lld", cg_dtype_tag(e, stored, 2),
                                    axis, cg_shape_tag(e, &xs), (long long)start, (long long)end);
    cg_kernel_builder b;
    cg_kernel_begin(&b, e, name, "One thread per element of the result: indices [start, end) of the axis.");
    uint32_t from = cg_param_value(&b, "x", x, true);
    uint32_t to = cg_param_value(&b, "out", result, false);
    cg_count elements = cg_shape_count(&out, 0, out.rank);
    open_layout_kernel(&b, elements);
    write_element_around_axis(&b, elements, end - start, inner);
    cg_line(&b.text, "%s", cg_copy(&b, to, "i", from, element_at(e, xs.dims[axis], start, inner)));
    cg_kernel_end(&b);
    e->out->kind = CG_LOWER_KERNELS;
    return true;
}
