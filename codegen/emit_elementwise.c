/* emit_elementwise.c - kernels for the elementwise family: add and mul with
 * numpy broadcasting, silu, gelu (erf and tanh forms), tanh and sigmoid.
 *
 * One thread per element of the result, 256 threads a block, grid
 * ceil(elements / 256). An operand reads its element in the cheapest way its
 * shape allows: the same index when it has the result's shape, index modulo
 * its size when it is a trailing block of the result (a [D] weight against
 * [T, D]), and otherwise through the result's coordinates with the
 * operand's strides (0 along broadcast dims). A const operand is baked into
 * the source as a literal. Arithmetic is float, as in the reference
 * (reference/ref_ops.c), whose formulas these are.
 */
#include "emit_internal.h"

#include <string.h>

enum { ELEMENTWISE_THREADS = 256 };

static bool require_float(cg_emit *e, ir_value_id v, const char *role, uint32_t index) {
    smelt_dtype t = e->m->values[v].type.dtype;
    if (smelt_dtype_is_float(t)) return true;
    diag_error(e->d, e->ir->loc, "codegen supports '%s' on float values only; found %s as %s %u",
               ir_op_info_of(e->ir->kind)->name, smelt_dtype_name(t), role, index);
    return false;
}

/* Opens the body of a one-thread-per-element kernel: `i` is the element of
 * the result, threads past the end return. */
static void write_element_index(cg_kernel_builder *b, cg_count elements) {
    cg_line(&b->text, "long long elements = %s;", cg_count_text(b->e, elements));
    cg_line(&b->text, "long long i = (long long)blockIdx.x * THREADS + threadIdx.x;");
    cg_line(&b->text, "if (i >= elements)");
    cg_line(&b->text, "    return;");
}

/* ---- add, mul ------------------------------------------------------------------------ */

typedef enum operand_access {
    ACCESS_CONST,    /* a literal */
    ACCESS_SAME,     /* the result's shape: element i */
    ACCESS_TRAILING, /* the result's trailing dims: element i % size */
    ACCESS_STRIDED,  /* through the result's coordinates */
} operand_access;

typedef struct broadcast_operand {
    ir_value_id value;
    operand_access access;
    const char *literal; /* ACCESS_CONST */
    cg_shape shape;
    int64_t strides[IR_MAX_DIMS]; /* along the result's dims; 0 where broadcast */
    uint32_t param;
} broadcast_operand;

/* Whether x broadcasts to out: trailing dims lined up, each equal or 1. */
static bool broadcasts_to(const cg_shape *x, const cg_shape *out) {
    if (x->rank > out->rank) return false;
    unsigned offset = out->rank - x->rank;
    for (unsigned j = 0; j < x->rank; j++) {
        bool x_token = j == 0 && x->token0, out_token = j + offset == 0 && out->token0;
        if (x_token != out_token && !(x->dims[j] == 1 && !x_token)) return false;
        if (!x_token && !out_token && x->dims[j] != 1 && x->dims[j] != out->dims[j + offset]) return false;
    }
    return true;
}

/* How operand x is read; false when it does not broadcast to the result. */
static bool classify(cg_emit *e, broadcast_operand *x, const cg_shape *out) {
    uint32_t constant = cg_const_op(e, x->value);
    if (constant != UINT32_MAX) {
        x->access = ACCESS_CONST;
        x->literal = cg_float_literal(e, cg_const_value(e, constant));
        return true;
    }
    x->shape = cg_shape_of(e, x->value);
    if (!broadcasts_to(&x->shape, out)) return false;
    if (cg_same_shape(&x->shape, out)) {
        x->access = ACCESS_SAME;
        return true;
    }
    /* Strides along the result's dims; numpy lines up trailing dims. A dim of
     * 1 against a longer one is broadcast: stride 0. */
    unsigned offset = out->rank - x->shape.rank;
    int64_t stride = 1;
    for (unsigned j = 0; j < out->rank; j++)
        x->strides[j] = 0;
    for (int j = (int)x->shape.rank - 1; j >= 0; j--) {
        unsigned jo = (unsigned)j + offset;
        bool out_token = jo == 0 && out->token0, x_token = j == 0 && x->shape.token0;
        bool broadcast = !x_token && x->shape.dims[j] == 1 && (out_token || out->dims[jo] != 1);
        x->strides[jo] = broadcast ? 0 : stride;
        if (!broadcast) stride *= x->shape.dims[j];
    }
    /* A trailing block: after x's leading 1s, its dims are the result's last
     * dims, so its element is i modulo its size. */
    bool trailing = !x->shape.token0;
    unsigned first = 0;
    while (first < x->shape.rank && x->shape.dims[first] == 1)
        first++;
    for (unsigned j = first; j < x->shape.rank && trailing; j++)
        trailing = x->shape.dims[j] == out->dims[j + offset] && !(j + offset == 0 && out->token0);
    x->access = trailing ? ACCESS_TRAILING : ACCESS_STRIDED;
    return true;
}

/* The index expression of operand x for result element i. */
static const char *operand_index(cg_emit *e, const broadcast_operand *x, const cg_shape *out) {
    if (x->access == ACCESS_SAME) return "i";
    if (x->access == ACCESS_TRAILING) {
        cg_count size = cg_shape_count(&x->shape, 0, x->shape.rank);
        return size.constant == 1 ? "0" : arena_printf(&e->scratch, "i %% %lld", (long long)size.constant);
    }
    cg_text index;
    cg_text_init(&index);
    for (unsigned j = 0; j < out->rank; j++) {
        if (x->strides[j] == 0) continue;
        if (index.length) cg_text_printf(&index, " + ");
        if (x->strides[j] == 1)
            cg_text_printf(&index, "c%u", j);
        else
            cg_text_printf(&index, "c%u * %lld", j, (long long)x->strides[j]);
    }
    const char *result = arena_strdup(&e->scratch, index.length ? index.data : "0");
    cg_text_free(&index);
    return result;
}

static const char *operand_name_part(cg_emit *e, const broadcast_operand *x) {
    if (x->access == ACCESS_CONST) {
        uint32_t constant = cg_const_op(e, x->value);
        return arena_printf(&e->scratch, "c%s", cg_float_name(e, cg_const_value(e, constant)));
    }
    return cg_shape_tag(e, &x->shape);
}

bool cg_emit_add_mul(cg_emit *e) {
    bool is_add = e->ir->kind == IR_OP_ADD;
    const char *op_name = is_add ? "add" : "mul";
    ir_value_id result = cg_result(e, 0);
    if (!require_float(e, cg_operand(e, 0), "operand", 0) ||
        !require_float(e, cg_operand(e, 1), "operand", 1) || !require_float(e, result, "result", 0))
        return false;
    cg_shape out = cg_shape_of(e, result);
    broadcast_operand operands[2] = {{.value = cg_operand(e, 0)}, {.value = cg_operand(e, 1)}};
    for (int i = 0; i < 2; i++)
        if (!cg_expect(e, classify(e, &operands[i], &out), "operand %d to broadcast to the result", i))
            return false;

    ir_value_id stored[3];
    uint32_t stored_count = 0;
    for (int i = 0; i < 2; i++)
        if (operands[i].access != ACCESS_CONST) stored[stored_count++] = operands[i].value;
    stored[stored_count++] = result;
    const char *name =
        arena_printf(&e->scratch, "%s_%s_%s_%s", op_name, cg_dtype_tag(e, stored, stored_count),
                     operand_name_part(e, &operands[0]), operand_name_part(e, &operands[1]));

    cg_kernel_builder b;
    cg_kernel_begin(&b, e, name,
                    "One thread per element of the result; operands broadcast as numpy does (trailing dims "
                    "line up, dims of 1 repeat), constants baked in.");
    const char *names[2] = {"a", "b"};
    for (int i = 0; i < 2; i++)
        if (operands[i].access != ACCESS_CONST)
            operands[i].param = cg_param_value(&b, names[i], operands[i].value, true);
    uint32_t out_param = cg_param_value(&b, "out", result, false);
    cg_count elements = cg_shape_count(&out, 0, out.rank);
    if (elements.per_token) cg_param_tokens(&b);
    cg_kernel_launch(&b, cg_count_blocks(elements, ELEMENTWISE_THREADS), (prog_affine){0, 1, 1},
                     ELEMENTWISE_THREADS);
    cg_kernel_open(&b);
    cg_line(&b.text, "enum { THREADS = %d };", ELEMENTWISE_THREADS);
    cg_blank(&b.text);
    cg_kernel_signature(&b);
    write_element_index(&b, elements);
    bool strided = operands[0].access == ACCESS_STRIDED || operands[1].access == ACCESS_STRIDED;
    if (strided) {
        cg_line(&b.text, "/* coordinates of element i in the result %s */", cg_shape_tag(e, &out));
        cg_write_coordinates(&b.text, "i", &out, "c");
    }
    const char *values[2];
    for (int i = 0; i < 2; i++)
        values[i] = operands[i].access == ACCESS_CONST
                        ? operands[i].literal
                        : cg_load(&b, operands[i].param, operand_index(e, &operands[i], &out));
    cg_line(&b.text, "float x = %s;", values[0]);
    cg_line(&b.text, "float y = %s;", values[1]);
    cg_line(&b.text, "%s", cg_store(&b, out_param, "i", is_add ? "x + y" : "x * y"));
    cg_kernel_end(&b);
    e->out->kind = CG_LOWER_KERNELS;
    return true;
}

/* ---- silu, gelu, tanh, sigmoid ------------------------------------------------------------------------ */

/* What activation op `op` computes of v: its name in kernel names, its
 * formula, a summary. */
typedef struct activation {
    const char *kind, *formula, *summary;
} activation;

static activation activation_of(cg_emit *e, uint32_t op) {
    const ir_module *m = e->m;
    const char *kind, *formula, *summary;
    ir_op_kind k = m->ops[op].kind;
    const ir_attr *approximate = ir_op_attr(m, op, "approximate");
    if (k == IR_OP_SILU) {
        kind = "silu";
        formula = "v / (1.0f + expf(-v))";
        summary = "One thread per element: silu(v) = v * sigmoid(v).";
    } else if (k == IR_OP_TANH) {
        kind = "tanh";
        formula = "tanhf(v)";
        summary = "One thread per element: tanh(v).";
    } else if (k == IR_OP_SIGMOID) {
        kind = "sigmoid";
        formula = "1.0f / (1.0f + expf(-v))";
        summary = "One thread per element: sigmoid(v) = 1 / (1 + exp(-v)).";
    } else if (approximate && approximate->kind == IR_ATTR_STRING && strcmp(approximate->as.s, "tanh") == 0) {
        kind = "gelu_tanh";
        formula = "0.5f * v * (1.0f + tanhf(SQRT_2_OVER_PI * (v + 0.044715f * v * v * v)))";
        summary = "One thread per element: gelu with the tanh approximation (GPT-2's gelu_new).";
    } else {
        kind = "gelu_erf";
        formula = "0.5f * v * (1.0f + erff(v * SQRT_HALF))";
        summary = "One thread per element: gelu(v) = v * Phi(v), with erf.";
    }
    (void)e;
    return (activation){kind, formula, summary};
}

/* The constants an activation's formula names. */
static void write_activation_constants(cg_text *t, const char *kind) {
    if (strcmp(kind, "gelu_tanh") == 0)
        cg_line(t, "#define SQRT_2_OVER_PI 0.797884560802865f /* sqrt(2 / pi) */");
    if (strcmp(kind, "gelu_erf") == 0) cg_line(t, "#define SQRT_HALF 0.707106781186548f /* 1 / sqrt(2) */");
}

bool cg_emit_activation(cg_emit *e) {
    ir_value_id x = cg_operand(e, 0), result = cg_result(e, 0);
    if (!require_float(e, x, "operand", 0) || !require_float(e, result, "result", 0)) return false;
    activation act = activation_of(e, e->op);
    const char *kind = act.kind, *formula = act.formula, *summary = act.summary;
    cg_shape shape = cg_shape_of(e, result), operand = cg_shape_of(e, x);
    if (!cg_expect(e, cg_same_shape(&shape, &operand), "the result to have the operand's shape"))
        return false;
    cg_count elements = cg_shape_count(&shape, 0, shape.rank);
    ir_value_id stored[2] = {x, result};
    const char *name =
        arena_printf(&e->scratch, "%s_%s_%s", kind, cg_dtype_tag(e, stored, 2), cg_count_tag(e, elements));

    cg_kernel_builder b;
    cg_kernel_begin(&b, e, name, summary);
    uint32_t in = cg_param_value(&b, "x", x, true);
    uint32_t out = cg_param_value(&b, "out", result, false);
    if (elements.per_token) cg_param_tokens(&b);
    cg_kernel_launch(&b, cg_count_blocks(elements, ELEMENTWISE_THREADS), (prog_affine){0, 1, 1},
                     ELEMENTWISE_THREADS);
    cg_kernel_open(&b);
    cg_line(&b.text, "enum { THREADS = %d };", ELEMENTWISE_THREADS);
    write_activation_constants(&b.text, kind);
    cg_blank(&b.text);
    cg_kernel_signature(&b);
    write_element_index(&b, elements);
    cg_line(&b.text, "float v = %s;", cg_load(&b, in, "i"));
    cg_line(&b.text, "%s", cg_store(&b, out, "i", formula));
    cg_kernel_end(&b);
    e->out->kind = CG_LOWER_KERNELS;
    return true;
}

/* ---- chains (passes/fuse.c, fuse_elementwise_chains) ------------------------------------------------------
 */

/* A group of elementwise ops, each but the last read only by a later one of
 * the group, every result of the last one's type: one thread per element
 * computes the chain in registers (v0, v1, ... for the ops' results, in the
 * order of the group), reading each operand from outside the group as
 * add/mul read theirs (broadcast, constants baked in), and stores what is
 * read outside (only the last result: fuse merges values with one reader).
 * An inner result that broadcasts into the last (a [T, 1] gate) is computed
 * at every element it reaches, from its operands' broadcast elements. One launch, each outside operand read
 * once, one result written, instead of a launch and a round trip through memory per op. */
enum { CHAIN_MAX_OPS = 16, CHAIN_MAX_OPERANDS = 2 * CHAIN_MAX_OPS };

bool cg_emit_elementwise_chain(cg_emit *e, const cg_group *g) {
    const ir_module *m = e->m;
    if (g->op_count > CHAIN_MAX_OPS) {
        diag_error(e->d, e->ir->loc, "codegen cannot emit an elementwise chain of %u ops (at most %d)",
                   g->op_count, CHAIN_MAX_OPS);
        return false;
    }
    ir_value_id last = m->ops[g->ops[g->op_count - 1]].results[0];
    cg_shape out = cg_shape_of(e, last);
    broadcast_operand operands[CHAIN_MAX_OPERANDS];
    uint32_t operand_count = 0;
    for (uint32_t i = 0; i < g->op_count; i++) {
        const ir_op *op = &m->ops[g->ops[i]];
        cg_shape shape = cg_shape_of(e, op->results[0]);
        if (!require_float(e, op->results[0], "result", 0) ||
            !cg_expect(e, broadcasts_to(&shape, &out),
                       "every result of an elementwise chain to broadcast to its last"))
            return false;
        for (uint32_t j = 0; j < op->operand_count; j++) {
            ir_value_id v = op->operands[j];
            bool inner = false, seen = false;
            for (uint32_t k = 0; k < i && !inner; k++)
                inner = m->ops[g->ops[k]].results[0] == v;
            for (uint32_t k = 0; k < operand_count && !seen; k++)
                seen = operands[k].value == v;
            if (inner || seen) continue;
            if (!require_float(e, v, "operand", j)) return false;
            operands[operand_count] = (broadcast_operand){.value = v};
            if (!cg_expect(e, classify(e, &operands[operand_count], &out),
                           "operand %u to broadcast to the result", j))
                return false;
            operand_count++;
        }
    }
    ir_value_id stored[CHAIN_MAX_OPERANDS + 1];
    uint32_t stored_count = 0;
    for (uint32_t k = 0; k < operand_count; k++)
        if (operands[k].access != ACCESS_CONST) stored[stored_count++] = operands[k].value;
    stored[stored_count++] = last;
    cg_text name;
    cg_text_init(&name);
    cg_text_printf(&name, "chain_%s", cg_dtype_tag(e, stored, stored_count));
    for (uint32_t i = 0; i < g->op_count; i++) {
        ir_op_kind k = m->ops[g->ops[i]].kind;
        cg_text_printf(&name, "_%s",
                       k == IR_OP_ADD   ? "add"
                       : k == IR_OP_MUL ? "mul"
                                        : activation_of(e, g->ops[i]).kind);
    }
    cg_text_printf(&name, "_%s", cg_shape_tag(e, &out));
    const char *kernel_name = arena_strdup(&e->scratch, name.data);
    cg_text_free(&name);

    cg_kernel_builder b;
    cg_kernel_begin(
        &b, e, kernel_name,
        "One thread per element: the chain of elementwise ops in registers, operands from outside "
        "broadcast as numpy does, constants baked in, what is read outside stored.");
    b.k->family = "elementwise";
    for (uint32_t k = 0; k < operand_count; k++)
        if (operands[k].access != ACCESS_CONST)
            operands[k].param =
                cg_param_value(&b, arena_printf(&e->scratch, "in%u", k), operands[k].value, true);
    uint32_t out_params[CHAIN_MAX_OPS];
    for (uint32_t i = 0; i < g->op_count; i++) {
        ir_value_id r = m->ops[g->ops[i]].results[0];
        bool outside = false;
        for (uint32_t k = 0; k < g->output_count && !outside; k++)
            outside = g->outputs[k] == r;
        cg_shape shape = cg_shape_of(e, r);
        if (outside &&
            !cg_expect(e, cg_same_shape(&shape, &out), "a chain's stored results to have its last's shape"))
            return false;
        out_params[i] =
            outside ? cg_param_value(&b, arena_printf(&e->scratch, "out%u", i), r, false) : UINT32_MAX;
    }
    cg_count elements = cg_shape_count(&out, 0, out.rank);
    if (elements.per_token) cg_param_tokens(&b);
    cg_kernel_launch(&b, cg_count_blocks(elements, ELEMENTWISE_THREADS), (prog_affine){0, 1, 1},
                     ELEMENTWISE_THREADS);
    cg_kernel_open(&b);
    cg_line(&b.text, "enum { THREADS = %d };", ELEMENTWISE_THREADS);
    bool defined_tanh = false, defined_erf = false;
    for (uint32_t i = 0; i < g->op_count; i++) {
        const char *kind = m->ops[g->ops[i]].kind == IR_OP_GELU ? activation_of(e, g->ops[i]).kind : "";
        if ((strcmp(kind, "gelu_tanh") == 0 && !defined_tanh) ||
            (strcmp(kind, "gelu_erf") == 0 && !defined_erf))
            write_activation_constants(&b.text, kind);
        defined_tanh |= strcmp(kind, "gelu_tanh") == 0;
        defined_erf |= strcmp(kind, "gelu_erf") == 0;
    }
    cg_blank(&b.text);
    cg_kernel_signature(&b);
    write_element_index(&b, elements);
    bool strided = false;
    for (uint32_t k = 0; k < operand_count; k++)
        strided |= operands[k].access == ACCESS_STRIDED;
    if (strided) {
        cg_line(&b.text, "/* coordinates of element i in the result %s */", cg_shape_tag(e, &out));
        cg_write_coordinates(&b.text, "i", &out, "c");
        for (unsigned j = 0; j < out.rank; j++) { /* a coordinate no operand reads */
            bool read = false;
            for (uint32_t k = 0; k < operand_count && !read; k++)
                read = operands[k].access == ACCESS_STRIDED && operands[k].strides[j] != 0;
            if (!read) cg_line(&b.text, "(void)c%u;", j);
        }
    }
    for (uint32_t i = 0; i < g->op_count; i++) {
        const ir_op *op = &m->ops[g->ops[i]];
        const char *args[2] = {"0.0f", "0.0f"};
        for (uint32_t j = 0; j < op->operand_count && j < 2; j++) {
            ir_value_id v = op->operands[j];
            for (uint32_t k = 0; k < i; k++)
                if (m->ops[g->ops[k]].results[0] == v) args[j] = arena_printf(&e->scratch, "v%u", k);
            for (uint32_t k = 0; k < operand_count; k++)
                if (operands[k].value == v)
                    args[j] = operands[k].access == ACCESS_CONST
                                  ? operands[k].literal
                                  : cg_load(&b, operands[k].param, operand_index(e, &operands[k], &out));
        }
        if (op->kind == IR_OP_ADD || op->kind == IR_OP_MUL) {
            cg_line(&b.text, "float v%u = %s %s %s; /* %s */", i, args[0], op->kind == IR_OP_ADD ? "+" : "*",
                    args[1], op->kind == IR_OP_ADD ? "add" : "mul");
        } else {
            activation act = activation_of(e, g->ops[i]);
            cg_line(&b.text, "float v%u; /* %s */", i, act.kind);
            cg_line(&b.text, "{");
            cg_line(&b.text, "float v = %s;", args[0]);
            cg_line(&b.text, "v%u = %s;", i, act.formula);
            cg_line(&b.text, "}");
        }
        if (out_params[i] != UINT32_MAX)
            cg_line(&b.text, "%s", cg_store(&b, out_params[i], "i", arena_printf(&e->scratch, "v%u", i)));
    }
    cg_kernel_end(&b);
    e->out->kind = CG_LOWER_KERNELS;
    return true;
}
