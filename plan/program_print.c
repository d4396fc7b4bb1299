/* program_print.c - `smelt inspect` printers of the launch program (with
 * the weight table it holds) and of the memory plan. */
#include "plan_print.h"
#include "program.h"

#include <inttypes.h>
#include <string.h>

static const char *dtype_name(uint8_t dtype) {
    switch (dtype) {
    case SMELT_DTYPE_F32: return "f32";
    case SMELT_DTYPE_BF16: return "bf16";
    case SMELT_DTYPE_F16: return "f16";
    case SMELT_DTYPE_I32: return "i32";
    case SMELT_DTYPE_I4: return "i4";
    case SMELT_DTYPE_I8: return "i8";
    case SMELT_DTYPE_F8E4M3: return "f8e4m3";
    default: return "?";
    }
}

static void print_ref(FILE *out, prog_ref r) {
    switch (r.buffer) {
    case PROG_BUFFER_ARENA: fprintf(out, "arena+%" PRIu64, r.offset); break;
    case PROG_BUFFER_WEIGHT: fprintf(out, "weight[%" PRIu32 "]", r.index); break;
    case PROG_BUFFER_STATE: fprintf(out, "state[%" PRIu32 "]", r.index); break;
    default: fprintf(out, "?"); break;
    }
    if (r.buffer != PROG_BUFFER_ARENA && r.offset) fprintf(out, "+%" PRIu64, r.offset);
}

static void print_affine(FILE *out, prog_affine f) {
    char text[96];
    plan_affine_format((plan_affine){f.a, f.b, f.c}, text, sizeof text);
    fputs(text, out);
}

/* "256 T + 16384", "132 T C + 66 T^2 + 33 T", "0": a cost polynomial. */
static void print_poly(FILE *out, prog_poly f) {
    const struct {
        double coefficient;
        const char *term;
    } terms[5] = {{f.per_token_context, " T C"},
                  {f.per_token_squared, " T^2"},
                  {f.per_context, " C"},
                  {f.per_token, " T"},
                  {f.constant, ""}};
    bool any = false;
    for (int i = 0; i < 5; i++) {
        if (terms[i].coefficient == 0) continue;
        fprintf(out, "%s%.10g%s", any ? " + " : "", terms[i].coefficient, terms[i].term);
        any = true;
    }
    if (!any) fputc('0', out);
}

static void print_cost(FILE *out, const prog_cost *cost) {
    fputs("\n          cost: reads ", out);
    print_poly(out, cost->read);
    fputs(" B, writes ", out);
    print_poly(out, cost->written);
    fputs(" B, ", out);
    print_poly(out, cost->flops);
    fprintf(out, " flops%s", cost->tensor_cores ? " on tensor cores" : "");
}

static void print_weights(FILE *out, const program *p) {
    uint64_t in_plan = 0, total = 0;
    for (uint32_t i = 0; i < p->weight_count; i++) {
        total += p->weights[i].bytes;
        if (p->weights[i].data_offset != UINT64_MAX) in_plan += p->weights[i].bytes;
    }
    fprintf(out, "  weights: %" PRIu32 " tensors, %" PRIu64 " bytes (%s)\n", p->weight_count, total,
            in_plan == total && total ? "in the plan"
            : in_plan                 ? "partly in the plan"
                                      : "bound at run time");
    for (uint32_t i = 0; i < p->weight_count; i++) {
        const prog_weight *w = &p->weights[i];
        fprintf(out, "    [%" PRIu32 "] ", i);
        plan_print_escaped(out, w->name, strlen(w->name), false);
        fprintf(out, " %s[", dtype_name(w->dtype));
        for (uint32_t d = 0; d < w->rank; d++)
            fprintf(out, "%s%" PRId64, d ? ", " : "", w->shape[d]);
        fprintf(out, "]%s", w->stacked ? " stacked" : w->transposed ? " transposed (bound from [K, N])" : "");
        if (w->quant.kind != PROG_QUANT_NONE) {
            static const char *const kinds[] = {"none", "int4", "int8", "fp8"};
            fprintf(out, " %s group %" PRIu32 "%s%s%s%s", kinds[w->quant.kind], w->quant.group,
                    w->quant.flags & PROG_QUANT_ZERO ? " zero" : "",
                    w->quant.flags & PROG_QUANT_GROUP_INDEX ? " act-order" : "",
                    w->quant.flags & PROG_QUANT_COLUMN_SCALE ? " column-scales" : "",
                    w->quant.flags & PROG_QUANT_INTERLEAVED ? " mma_k16" : "");
        }
        fprintf(out, " %" PRIu64 " bytes", w->bytes);
        if (w->part_count) fprintf(out, " concatenated from %" PRIu32 " tensors", w->part_count);
        if (w->data_offset != UINT64_MAX) fprintf(out, " at %" PRIu64, w->data_offset);
        fputc('\n', out);
    }
}

bool plan_print_program(FILE *out, const plan_file *plan, const uint8_t *data, uint64_t size,
                        const plan_print_options *options, char *error, size_t error_size) {
    (void)options;
    program p;
    if (!program_decode(data, size, &p, error, error_size)) return false;
    plan_kernel_table kernels = {0};
    const uint8_t *kernel_data;
    uint64_t kernel_size;
    char ignored[256];
    bool have_names = plan_section(plan, PLAN_SECTION_KERNELS, &kernel_data, &kernel_size) &&
                      plan_kernel_table_decode(kernel_data, kernel_size, &kernels, ignored, sizeof ignored);
    /* Instructions guarded by a token range run in some steps only: counted
     * for a decode token (T = 1) and a prefill chunk of the bound; a scaled
     * GEMM and its fallback kernel (prog_need) as on a device that runs
     * scaled GEMMs. */
    uint32_t launches[2] = {0, 0}, gemms[2] = {0, 0}, scaled = 0;
    for (uint32_t i = 0; i < p.instr_count; i++) {
        if (p.instrs[i].needs == PROG_NEED_SCALED_GEMM) scaled++;
        for (int k = 0; k < 2; k++) {
            if (!prog_instr_runs(&p.instrs[i], k == 0 ? 1 : p.max_tokens) ||
                !prog_instr_needs_met(&p.instrs[i], true))
                continue;
            if (p.instrs[i].op == PROG_OP_GEMM)
                gemms[k]++;
            else
                launches[k]++;
        }
    }
    fprintf(out, "  tokens per step: at most %" PRId64 "; vocab %" PRIu64 "\n", p.max_tokens, p.vocab);
    fprintf(out,
            "  per step (prefill chunk or decode token): %" PRIu32 " kernel launches + %" PRIu32 " GEMMs\n",
            launches[0], gemms[0]);
    if (launches[1] != launches[0] || gemms[1] != gemms[0])
        fprintf(out, "  per step of %" PRId64 " tokens: %" PRIu32 " kernel launches + %" PRIu32 " GEMMs\n",
                p.max_tokens, launches[1], gemms[1]);
    if (scaled)
        fprintf(out,
                "  scaled GEMMs: %" PRIu32
                " (where the device runs none, their fallback kernels run instead)\n",
                scaled);
    fprintf(out, "  memory: arena %" PRIu64 " bytes; %" PRIu32 " state buffers", p.arena_bytes,
            p.state_count);
    uint64_t state_total = 0;
    for (uint32_t i = 0; i < p.state_count; i++)
        state_total += p.state_bytes[i];
    fprintf(out, " (%" PRIu64 " bytes: KV caches)\n", state_total);
    fprintf(out, "  inputs: ids at ");
    print_ref(out, p.input_ids);
    fprintf(out, ", pos at ");
    print_ref(out, p.input_pos);
    fprintf(out, "; output: logits at ");
    print_ref(out, p.logits);
    fputc('\n', out);
    fprintf(out, "  generation stops at EOS ids:");
    for (uint32_t i = 0; i < p.eos_count; i++)
        fprintf(out, "%s %" PRId32, i ? "," : "", p.eos[i]);
    fputs(p.eos_count ? "\n" : " none (the config names none)\n", out);
    print_weights(out, &p);
    fprintf(out, "  instructions (cost: modeled DRAM bytes and flops at T tokens, context C):\n");
    for (uint32_t i = 0; i < p.instr_count; i++) {
        const prog_instr *instr = &p.instrs[i];
        fprintf(out, "    %4" PRIu32 "  ", i);
        if (instr->op == PROG_OP_GEMM) {
            const prog_gemm *g = &instr->as.gemm;
            fprintf(out, "gemm M=");
            print_affine(out, g->m);
            fprintf(out, " N=%" PRId64 " K=%" PRId64 " %s x %s%s -> %s: ", g->n, g->k, dtype_name(g->dtype_a),
                    dtype_name(g->dtype_b), g->b_transposed ? "^T" : "", dtype_name(g->dtype_c));
            print_ref(out, g->a);
            if (g->has_scales) {
                fputs(" * scales ", out);
                print_ref(out, g->a_scale);
            }
            fprintf(out, " x ");
            print_ref(out, g->b);
            if (g->has_scales) {
                fputs(" * scales ", out);
                print_ref(out, g->b_scale);
                fprintf(out, " (%s)", dtype_name(g->dtype_b_scale));
            }
            if (g->has_bias) {
                fprintf(out, " + ");
                print_ref(out, g->bias);
            }
            if (g->has_residual) {
                fprintf(out, " + residual ");
                print_ref(out, g->residual);
            }
            fprintf(out, " -> ");
            print_ref(out, g->c);
        } else {
            const prog_launch *l = &instr->as.launch;
            const plan_kernel *k =
                have_names && l->kernel < kernels.count ? &kernels.kernels[l->kernel] : NULL;
            if (k) {
                fputs("launch ", out);
                plan_print_escaped(out, k->name.data, k->name.length, false);
                fputs("(", out);
            } else
                fprintf(out, "launch kernel[%" PRIu32 "](", l->kernel);
            for (uint32_t a = 0; a < l->arg_count; a++) {
                if (a) fputs(", ", out);
                const prog_arg *arg = &l->args[a];
                if (arg->kind == PROG_ARG_TOKENS)
                    fputs("T", out);
                else if (arg->kind == PROG_ARG_INT)
                    fprintf(out, "%" PRId64, arg->value);
                else
                    print_ref(out, arg->ref);
            }
            fprintf(out, ") grid (");
            for (int axis = 0; axis < 3; axis++) {
                if (axis) fputs(", ", out);
                print_affine(out, l->rule.grid[axis]);
            }
            fprintf(out, ") block (%" PRIu32 ", %" PRIu32 ", %" PRIu32 ")", l->rule.block[0],
                    l->rule.block[1], l->rule.block[2]);
            if (l->rule.dynamic_shared_bytes) fprintf(out, " shared %" PRIu32, l->rule.dynamic_shared_bytes);
        }
        /* What the device must (not) run (program.h, prog_need). */
        if (instr->needs == PROG_NEED_SCALED_GEMM) fputs(" [needs scaled GEMMs]", out);
        if (instr->needs == PROG_NEED_NO_SCALED_GEMM) fputs(" [fallback: where no scaled GEMMs run]", out);
        /* The output head (program.h, "Wanted rows"). */
        if (instr->wanted_rows) fputs(" on the wanted rows", out);
        /* A side of a choice between two lowerings (program.h, "Choices"). */
        if (instr->choice)
            fprintf(out, " [choice %" PRIu32 ": %s]", instr->choice,
                    instr->side ? "the ops one by one" : "the fused kernel");
        print_cost(out, &instr->cost);
        fputc('\n', out);
    }
    plan_kernel_table_free(&kernels);
    program_free(&p);
    return true;
}

bool plan_print_memory(FILE *out, const plan_file *plan, const uint8_t *data, uint64_t size,
                       const plan_print_options *options, char *error, size_t error_size) {
    (void)plan;
    (void)options;
    (void)error;
    (void)error_size;
    /* A text table written by smelt compile; control bytes are not expected
     * but are shown as '?' so a damaged plan cannot drive the terminal. */
    fputs("  ", out);
    for (uint64_t i = 0; i < size; i++) {
        unsigned char c = data[i];
        fputc(c == '\n' || (c >= 0x20 && c != 0x7f) ? c : '?', out);
        if (c == '\n' && i + 1 < size) fputs("  ", out);
    }
    if (size && data[size - 1] != '\n') fputc('\n', out);
    return true;
}
