/* emit_moe.c - the mixture-of-experts kernel (Mixtral's sparse MoE block).
 *
 * moe(x[T, D], router[E, D], gate[E, F, D], up[E, F, D], down[E, D, F]) -> [T, D]
 * as reference/ref_ops_attention.c: router logits x . router[e], a softmax
 * over the E experts, the top_k most probable (ties to the lower index, as
 * torch.topk), their probabilities divided by their sum when normalize, and
 * out = sum_k weight_k * down_e(silu(gate_e x) * up_e x).
 *
 * One block of 256 threads per token. The token's row is kept in shared
 * memory; warps compute the router logits (one expert per warp at a time,
 * shuffle-reduced dot products); thread 0 does the softmax and the top-k
 * selection; then for each chosen expert the hidden activations are computed
 * CHUNK at a time into shared memory (one row of gate and up per warp) and
 * folded into the down projection, whose D outputs the threads own.
 *
 * Speed: correct first. Each token block reads its top_k experts' weights
 * whole, so a prefill of T tokens moves T * top_k experts' bytes where a
 * grouped GEMM (tokens sorted by expert) would move each expert once; and
 * the down projection reads rows of F with a stride. Decode (T = 1) is
 * bandwidth-bound either way.
 */
#include "emit_internal.h"

enum { MOE_THREADS = 256, MOE_CHUNK = 256, MOE_SHARED_LIMIT = 48 * 1024 };

bool cg_emit_moe(cg_emit *e) {
    ir_value_id x = cg_operand(e, 0), result = cg_result(e, 0);
    cg_shape xs = cg_shape_of(e, x), router = cg_shape_of(e, cg_operand(e, 1));
    cg_shape gate = cg_shape_of(e, cg_operand(e, 2)), up = cg_shape_of(e, cg_operand(e, 3));
    cg_shape down = cg_shape_of(e, cg_operand(e, 4));
    bool floats = true;
    for (uint32_t i = 0; i < 5; i++)
        floats &= smelt_dtype_is_float(e->m->values[cg_operand(e, i)].type.dtype);
    if (!floats || xs.rank != 2 || router.rank != 2 || gate.rank != 3 || up.rank != 3 || down.rank != 3) {
        diag_error(e->d, e->ir->loc,
                   "moe: expected float x[T, D], router[E, D], gate[E, F, D], up[E, F, D] and down[E, D, F]");
        return false;
    }
    int64_t model_dim = xs.dims[1], experts = router.dims[0], ffn = gate.dims[1];
    bool consistent = router.dims[1] == model_dim && gate.dims[0] == experts && gate.dims[2] == model_dim &&
                      up.dims[0] == experts && up.dims[1] == ffn && up.dims[2] == model_dim &&
                      down.dims[0] == experts && down.dims[1] == model_dim && down.dims[2] == ffn &&
                      !router.token0 && !gate.token0 && !up.token0 && !down.token0;
    if (!consistent) {
        diag_error(e->d, e->ir->loc,
                   "moe: the expert weights do not agree on E = %lld, D = %lld and F = %lld",
                   (long long)experts, (long long)model_dim, (long long)ffn);
        return false;
    }
    cg_shape out_shape = cg_shape_of(e, result);
    if (!cg_expect(e, cg_same_shape(&xs, &out_shape), "a result of x's shape")) return false;
    int64_t top_k = cg_attr_int(e, "top_k", 0);
    bool normalize = cg_attr_bool(e, "normalize", true);
    if (top_k < 1 || top_k > experts) {
        diag_error(e->d, e->ir->loc, "moe: top_k %lld must be in [1, %lld] (the number of experts)",
                   (long long)top_k, (long long)experts);
        return false;
    }
    uint64_t shared_bytes = (uint64_t)(model_dim + experts + 2 * top_k + MOE_CHUNK) * 4u;
    if (model_dim > MOE_SHARED_LIMIT || shared_bytes > MOE_SHARED_LIMIT) {
        diag_error(e->d, e->ir->loc,
                   "moe: codegen keeps a token's row and the router's %lld probabilities in 48 KiB of shared "
                   "memory; D = %lld needs %llu bytes",
                   (long long)experts, (long long)model_dim, (unsigned long long)shared_bytes);
        return false;
    }

    ir_value_id stored[6] = {x,     cg_operand(e, 1), cg_operand(e, 2), cg_operand(e, 3), cg_operand(e, 4),
                             result};
    const char *name = arena_printf(&e->scratch, "moe_%s_e%lld_k%lld_d%lld_f%lld%s",
                                    cg_dtype_tag(e, stored, 6), (long long)experts, (long long)top_k,
                                    (long long)model_dim, (long long)ffn, normalize ? "" : "_nonorm");
    cg_kernel_builder b;
    cg_kernel_begin(&b, e, name,
                    "One block per token: router softmax, top-k experts (renormalised when normalize), then "
                    "the sum of weight * down(silu(gate x) * up x) over them, CHUNK hidden units at a time.");
    uint32_t p_x = cg_param_value(&b, "x", x, true);
    uint32_t p_router = cg_param_value(&b, "router", cg_operand(e, 1), true);
    uint32_t p_gate = cg_param_value(&b, "gate", cg_operand(e, 2), true);
    uint32_t p_up = cg_param_value(&b, "up", cg_operand(e, 3), true);
    uint32_t p_down = cg_param_value(&b, "down", cg_operand(e, 4), true);
    uint32_t p_out = cg_param_value(&b, "out", result, false);
    cg_kernel_launch(&b, cg_count_blocks(cg_shape_count(&xs, 0, 1), 1), (prog_affine){0, 1, 1}, MOE_THREADS);
    cg_kernel_open(&b);
    cg_text *t = &b.text;
    cg_line(t, "enum { MODEL_DIM = %lld, FFN_DIM = %lld, EXPERTS = %lld, TOP_K = %lld, NORMALIZE = %d };",
            (long long)model_dim, (long long)ffn, (long long)experts, (long long)top_k, normalize ? 1 : 0);
    cg_line(t, "enum { THREADS = %d, WARPS = THREADS / 32, CHUNK = %d };", MOE_THREADS, MOE_CHUNK);
    cg_line(t,
            "enum { DIMS_PER_THREAD = (MODEL_DIM + THREADS - 1) / THREADS }; /* outputs each thread owns */");
    cg_blank(t);
    cg_write_warp_sum(t);
    cg_kernel_signature(&b);
    cg_line(t, "__shared__ float input[MODEL_DIM];        /* x[token] */");
    cg_line(t, "__shared__ float probabilities[EXPERTS];  /* router softmax */");
    cg_line(t, "__shared__ int chosen[TOP_K];             /* experts, most probable first */");
    cg_line(t, "__shared__ float chosen_weight[TOP_K];");
    cg_line(t,
            "__shared__ float hidden[CHUNK];           /* silu(gate x) * up x for one chunk of FFN_DIM */");
    cg_line(t, "long long token = blockIdx.x;");
    cg_line(t, "int lane = threadIdx.x %% 32, warp = threadIdx.x / 32;");
    cg_line(t, "for (int i = threadIdx.x; i < MODEL_DIM; i += THREADS)");
    cg_line(t, "    input[i] = %s;", cg_load(&b, p_x, "token * MODEL_DIM + i"));
    cg_line(t, "__syncthreads();");
    cg_blank(t);
    cg_line(t, "/* router logits, one expert per warp at a time */");
    cg_line(t, "for (int expert = warp; expert < EXPERTS; expert += WARPS) {");
    cg_line(t, "float dot = 0.0f;");
    cg_line(t, "for (int i = lane; i < MODEL_DIM; i += 32)");
    cg_line(t, "    dot += input[i] * %s;", cg_load(&b, p_router, "(long long)expert * MODEL_DIM + i"));
    cg_line(t, "dot = warp_sum(dot);");
    cg_line(t, "if (lane == 0)");
    cg_line(t, "    probabilities[expert] = dot;");
    cg_line(t, "}");
    cg_line(t, "__syncthreads();");
    cg_blank(t);
    cg_line(t, "/* softmax and top-k, by one thread (E is small) */");
    cg_line(t, "if (threadIdx.x == 0) {");
    cg_line(t, "float max = probabilities[0], total = 0.0f, chosen_total = 0.0f;");
    cg_line(t, "for (int expert = 1; expert < EXPERTS; expert++)");
    cg_line(t, "    max = fmaxf(max, probabilities[expert]);");
    cg_line(t, "for (int expert = 0; expert < EXPERTS; expert++) {");
    cg_line(t, "probabilities[expert] = expf(probabilities[expert] - max);");
    cg_line(t, "total += probabilities[expert];");
    cg_line(t, "}");
    cg_line(t, "for (int expert = 0; expert < EXPERTS; expert++)");
    cg_line(t, "    probabilities[expert] /= total;");
    cg_line(t, "for (int k = 0; k < TOP_K; k++) {");
    cg_line(t, "int best = -1;");
    cg_line(t, "for (int expert = 0; expert < EXPERTS; expert++) {");
    cg_line(t, "int taken = 0;");
    cg_line(t, "for (int j = 0; j < k; j++)");
    cg_line(t, "    taken |= chosen[j] == expert;");
    cg_line(t, "if (!taken && (best < 0 || probabilities[expert] > probabilities[best]))");
    cg_line(t, "    best = expert;");
    cg_line(t, "}");
    cg_line(t, "chosen[k] = best;");
    cg_line(t, "chosen_total += probabilities[best];");
    cg_line(t, "}");
    cg_line(t, "for (int k = 0; k < TOP_K; k++)");
    cg_line(t, "    chosen_weight[k] = probabilities[chosen[k]] / (NORMALIZE ? chosen_total : 1.0f);");
    cg_line(t, "}");
    cg_line(t, "__syncthreads();");
    cg_blank(t);
    cg_line(t, "float accumulator[DIMS_PER_THREAD];");
    cg_line(t, "for (int j = 0; j < DIMS_PER_THREAD; j++)");
    cg_line(t, "    accumulator[j] = 0.0f;");
    cg_line(t, "for (int k = 0; k < TOP_K; k++) {");
    cg_line(t, "long long expert = chosen[k];");
    cg_line(t, "float weight = chosen_weight[k];");
    cg_line(t, "for (int chunk = 0; chunk < FFN_DIM; chunk += CHUNK) {");
    cg_line(t, "/* hidden units [chunk, chunk + CHUNK): one row of gate and up per warp */");
    cg_line(t, "for (int j = warp; j < CHUNK && chunk + j < FFN_DIM; j += WARPS) {");
    cg_line(t, "long long row = (expert * FFN_DIM + chunk + j) * MODEL_DIM;");
    cg_line(t, "float g = 0.0f, u = 0.0f;");
    cg_line(t, "for (int i = lane; i < MODEL_DIM; i += 32) {");
    cg_line(t, "g += input[i] * %s;", cg_load(&b, p_gate, "row + i"));
    cg_line(t, "u += input[i] * %s;", cg_load(&b, p_up, "row + i"));
    cg_line(t, "}");
    cg_line(t, "g = warp_sum(g);");
    cg_line(t, "u = warp_sum(u);");
    cg_line(t, "if (lane == 0)");
    cg_line(t, "    hidden[j] = g / (1.0f + expf(-g)) * u;");
    cg_line(t, "}");
    cg_line(t, "__syncthreads();");
    cg_line(t, "/* down projection of the chunk into the outputs this thread owns */");
    cg_line(t, "int width = FFN_DIM - chunk < CHUNK ? FFN_DIM - chunk : CHUNK;");
    cg_line(t, "for (int j = 0; j < DIMS_PER_THREAD; j++) {");
    cg_line(t, "int d = threadIdx.x + j * THREADS;");
    cg_line(t, "if (d >= MODEL_DIM)");
    cg_line(t, "    break;");
    cg_line(t, "long long row = (expert * MODEL_DIM + d) * FFN_DIM + chunk;");
    cg_line(t, "float sum = 0.0f;");
    cg_line(t, "for (int f = 0; f < width; f++)");
    cg_line(t, "    sum += %s * hidden[f];", cg_load(&b, p_down, "row + f"));
    cg_line(t, "accumulator[j] += weight * sum;");
    cg_line(t, "}");
    cg_line(t, "__syncthreads(); /* hidden is rewritten by the next chunk */");
    cg_line(t, "}");
    cg_line(t, "}");
    cg_line(t, "for (int j = 0; j < DIMS_PER_THREAD; j++) {");
    cg_line(t, "int d = threadIdx.x + j * THREADS;");
    cg_line(t, "if (d < MODEL_DIM)");
    cg_line(t, "    %s", cg_store(&b, p_out, "token * MODEL_DIM + d", "accumulator[j]"));
    cg_line(t, "}");
    cg_kernel_end(&b);
    /* Modeled cost (emit.h): each token's block reads its row, the whole
     * router and its top_k experts' gate, up and down matrices, and writes
     * its row; flops 2 E D for the router and 6 F D per chosen expert. */
    double element[6];
    for (uint32_t i = 0; i < 5; i++)
        element[i] = (double)smelt_dtype_element_bytes(cg_storage_dtype(e->m, cg_operand(e, i)));
    element[5] = (double)smelt_dtype_element_bytes(cg_storage_dtype(e->m, result));
    double d = (double)model_dim, f = (double)ffn, k = (double)top_k, expert_count = (double)experts;
    double read =
        d * element[0] + expert_count * d * element[1] + k * f * d * (element[2] + element[3] + element[4]);
    double written = d * element[5], flops = 2 * expert_count * d + k * 6 * f * d;
    cg_count tokens = cg_shape_count(&xs, 0, 1);
    prog_poly token_poly = {.constant = (double)tokens.constant, .per_token = (double)tokens.per_token};
    prog_cost *cost = arena_alloc(e->a, sizeof *cost);
    cost->read = prog_poly_scaled(token_poly, read);
    cost->written = prog_poly_scaled(token_poly, written);
    cost->flops = prog_poly_scaled(token_poly, flops);
    e->out->kernels[e->out->kernel_count - 1].cost = cost;
    e->out->kind = CG_LOWER_KERNELS;
    return true;
}
