/* program_cost.c - the default cost of an instruction (program.h, "The cost
 * model"), derived from what the launch program already says about it.
 *
 * A launch: each pointer argument's extent (the bytes the kernel may touch
 * through it at T tokens, affine in T) counted once, as bytes written when
 * the kernel stores through it and as bytes read otherwise; so a weight is
 * read once and an activation of T rows costs its T rows. A state buffer
 * indexed by position (a KV cache: state_rows > 0) is counted by rows
 * instead of its whole size: a kernel that writes it writes the step's T
 * rows (the new keys and values), one that reads it reads the C + T rows
 * that are written once the step's own are (attention). This is exact for a
 * kernel that touches each byte of its arguments once, which is what most
 * kernels do; an emitter whose kernel reads less (an embedding gathers T
 * rows of its table) or more (a block per query head re-reading a KV head)
 * gives its own cost (cg_kernel.cost, codegen/emit.h).
 *
 * A GEMM: A, B and the bias read once, C written once, 2 M N K flops. A
 * scaled GEMM reads its codes (one byte an element) and both scale vectors
 * too, its flops on tensor cores (FP8 or int8 MMA). The figures have one
 * tensor-core peak, bf16's; an H100's or H200's FP8 peak is twice that, so
 * a scaled GEMM's modeled compute time is an upper bound.
 */
#include "program.h"

/* A coefficient as the decoder accepts it: finite, >= 0, within the limit. */
static double coefficient(double v) {
    if (!(v > 0.0)) return 0.0;
    return v > PROGRAM_COST_COEFFICIENT_LIMIT ? PROGRAM_COST_COEFFICIENT_LIMIT : v;
}

static prog_poly poly_checked(prog_poly f) {
    return (prog_poly){coefficient(f.constant), coefficient(f.per_token), coefficient(f.per_context),
                       coefficient(f.per_token_context), coefficient(f.per_token_squared)};
}

/* ceil((a T + b) / c) as a polynomial (without the ceiling) times `scale`. */
static prog_poly affine_poly(prog_affine f, double scale) {
    double c = f.c >= 1 ? (double)f.c : 1.0;
    return (prog_poly){.constant = (double)f.b / c * scale, .per_token = (double)f.a / c * scale};
}

prog_cost program_launch_cost(const program *p, const prog_launch *l) {
    prog_cost cost = {0};
    for (uint32_t i = 0; i < l->arg_count && i < PROG_MAX_ARGS; i++) {
        const prog_arg *arg = &l->args[i];
        if (arg->kind != PROG_ARG_POINTER) continue;
        prog_poly bytes = affine_poly(arg->extent, 1.0);
        if (arg->ref.buffer == PROG_BUFFER_STATE) {
            if (arg->ref.index >= p->state_count) continue;
            uint64_t rows = p->state_rows ? p->state_rows[arg->ref.index] : 0;
            if (rows > 0) {
                double row_bytes = (double)p->state_bytes[arg->ref.index] / (double)rows;
                bytes = arg->writes ? (prog_poly){.per_token = row_bytes}
                                    : (prog_poly){.per_token = row_bytes, .per_context = row_bytes};
            }
        }
        if (arg->writes)
            cost.written = prog_poly_sum(cost.written, bytes);
        else
            cost.read = prog_poly_sum(cost.read, bytes);
    }
    cost.read = poly_checked(cost.read);
    cost.written = poly_checked(cost.written);
    return cost;
}

prog_cost program_gemm_cost(const prog_gemm *g) {
    double n = (double)g->n, k = (double)g->k;
    prog_cost cost = {0};
    cost.read = affine_poly(g->m, k * (double)smelt_dtype_element_bytes(g->dtype_a));
    cost.read.constant += n * k * (double)smelt_dtype_element_bytes(g->dtype_b);
    if (g->has_bias) cost.read.constant += n * (double)smelt_dtype_element_bytes(g->dtype_bias);
    if (g->has_residual) /* M x N of C's dtype */
        cost.read =
            prog_poly_sum(cost.read, affine_poly(g->m, n * (double)smelt_dtype_element_bytes(g->dtype_c)));
    cost.written = affine_poly(g->m, n * (double)smelt_dtype_element_bytes(g->dtype_c));
    /* The residual's adds count no flops, as an add kernel's do not: its cost is the bytes. */
    cost.flops = affine_poly(g->m, 2.0 * n * k + (g->has_bias ? n : 0.0));
    if (g->has_scales) { /* a_scale f32[M], b_scale [N] */
        cost.read = prog_poly_sum(cost.read, affine_poly(g->m, 4.0));
        cost.read.constant += n * (double)smelt_dtype_element_bytes(g->dtype_b_scale);
    }
    cost.tensor_cores = (g->dtype_a == SMELT_DTYPE_BF16 && g->dtype_b == SMELT_DTYPE_BF16) ||
                        (g->dtype_a == SMELT_DTYPE_F16 && g->dtype_b == SMELT_DTYPE_F16) || g->has_scales;
    cost.read = poly_checked(cost.read);
    cost.written = poly_checked(cost.written);
    cost.flops = poly_checked(cost.flops);
    return cost;
}

/* ---- choices between two lowerings (program.h, "Choices") ----------------- */

double program_choice_seconds(const prog_choice *c, int side, int64_t tokens, const prog_device_figures *f) {
    const prog_choice_cost *cost = &c->cost[side ? 1 : 0][tokens - c->min_tokens];
    double peak = cost->tensor_cores ? f->tensor_flops_per_second : f->flops_per_second;
    double memory = cost->bytes / f->bytes_per_second, compute = cost->flops / peak;
    return (memory > compute ? memory : compute) + cost->launches * f->launch_seconds;
}

int program_choice_side(const prog_choice *c, int64_t tokens, const prog_device_figures *f) {
    if (tokens < c->min_tokens) return 0;
    if (tokens > c->max_tokens) return 1;
    return program_choice_seconds(c, 1, tokens, f) < program_choice_seconds(c, 0, tokens, f) ? 1 : 0;
}

int64_t program_choice_threshold(const prog_choice *c, const prog_device_figures *f) {
    int64_t t = c->min_tokens;
    while (t <= c->max_tokens && program_choice_side(c, t, f) == 0)
        t++;
    return t - 1;
}
