/* plan_open.c - smelt_plan_open and friends (smelt.h): a plan is opened
 * once: the file is mapped and checked (plan/plan_read.c), the launch
 * program decoded and validated against the rest of the plan
 * (plan/program.c), the kernel table decoded as views into the mapping.
 * Engines hold a reference to their plan, whose mapped weights the host
 * device uses in place.
 */
#include "engine_internal.h"
#include "error.h"
#include "plan_read.h"
#include "program.h"
#include "quant.h"
#include "smelt.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

void rt_plan_release(smelt_plan *plan) {
    if (!plan || __atomic_sub_fetch(&plan->references, 1, __ATOMIC_ACQ_REL) != 0) return;
    program_free(&plan->program);
    if (plan->kernels.kernels) plan_kernel_table_free(&plan->kernels);
    plan_close(&plan->file);
    free(plan);
}

/* Decodes what the runtime needs from a checked plan file. */
static smelt_status plan_load(smelt_plan *plan, const char *name) {
    char error[RT_ERROR_MESSAGE_SIZE];
    const uint8_t *data;
    uint64_t size;
    if (!plan_section(&plan->file, PLAN_SECTION_PROGRAM, &data, &size))
        return rt_last_error_set(SMELT_ERROR_BAD_PLAN,
                                 "%s: the plan has no PROGRAM section: it cannot be run; rebuild it with "
                                 "`smelt compile`",
                                 name);
    if (!program_decode(data, size, &plan->program, error, sizeof error))
        return rt_last_error_set(SMELT_ERROR_BAD_PLAN, "%s: %s", name, error);
    if (plan_section(&plan->file, PLAN_SECTION_KERNELS, &data, &size) &&
        !plan_kernel_table_decode(data, size, &plan->kernels, error, sizeof error))
        return rt_last_error_set(SMELT_ERROR_BAD_PLAN, "%s: %s", name, error);
    if (plan_section(&plan->file, PLAN_SECTION_HOST_KERNELS, &data, &size) && size > 0) {
        plan->host_object = data;
        plan->host_object_size = size;
    }
    if (plan_section(&plan->file, PLAN_SECTION_WEIGHT_DATA, &data, &size)) {
        plan->weight_data = data;
        plan->weight_data_size = size;
    }
    if (!program_check_plan(&plan->program, plan->kernels.kernels, plan->kernels.count,
                            plan->weight_data_size, error, sizeof error))
        return rt_last_error_set(SMELT_ERROR_BAD_PLAN, "%s: %s", name, error);
    /* A quantized weight's bytes are its whole packed layout: what its
     * kernels read at the offsets quant_layout_of gives (for a stack of
     * experts [E, N, K], quant_stack_layout_of's E matrices). */
    for (uint32_t i = 0; i < plan->program.weight_count; i++) {
        const prog_weight *w = &plan->program.weights[i];
        if (w->quant.kind == PROG_QUANT_NONE) continue;
        quant_format f = quant_format_from_program(&w->quant);
        quant_layout l;
        uint64_t matrices = w->rank == 3 ? (uint64_t)w->shape[0] : 1, stride, total = 0;
        const char *why = quant_stack_layout_of(&f, matrices, (uint64_t)w->shape[w->rank - 2],
                                                (uint64_t)w->shape[w->rank - 1], &l, &stride, &total);
        if (why || total != w->bytes)
            return rt_last_error_set(
                SMELT_ERROR_BAD_PLAN,
                "%s: quantized weight '%.*s%s' has %llu bytes but its format makes %llu%s%s", name,
                RT_NAME(w->name), (unsigned long long)w->bytes, (unsigned long long)total, why ? ": " : "",
                why ? why : "");
    }
    /* A scaled GEMM reading a quantized weight reads its codes and its
     * per-channel f16 scales (one group a row, no column scales: program.h),
     * where quant_layout_of puts them. */
    for (uint32_t i = 0; i < plan->program.instr_count; i++) {
        const prog_instr *in = &plan->program.instrs[i];
        if (in->op != PROG_OP_GEMM || !in->as.gemm.has_scales) continue;
        const prog_gemm *g = &in->as.gemm;
        const prog_weight *w = &plan->program.weights[g->b.index]; /* B is a weight (program_decode) */
        if (w->quant.kind == PROG_QUANT_NONE) continue;
        quant_format f = quant_format_from_program(&w->quant);
        quant_layout l = {0};
        bool same = w->rank == 2 && !w->stacked && !f.has_column_scale && !f.has_group_index &&
                    !f.interleaved && f.group == (uint64_t)w->shape[1] && w->shape[0] == g->n &&
                    w->shape[1] == g->k &&
                    !quant_layout_of(&f, (uint64_t)w->shape[0], (uint64_t)w->shape[1], &l) &&
                    g->b.offset == l.codes && g->b_scale.offset == l.scales &&
                    g->dtype_b_scale == SMELT_DTYPE_F16 && g->dtype_b == w->dtype;
        if (!same)
            return rt_last_error_set(SMELT_ERROR_BAD_PLAN,
                                     "%s: instruction %u, a scaled gemm, does not read quantized weight "
                                     "'%.*s%s' as [%lld, %lld] codes with one f16 scale per row",
                                     name, i, RT_NAME(w->name), (long long)g->n, (long long)g->k);
    }
    for (uint32_t i = 0; i < plan->kernels.count; i++)
        if (plan->kernels.kernels[i].binary_count > 0) plan->has_cuda_kernels = true;
    return SMELT_OK;
}

static smelt_status plan_finish_open(smelt_plan *plan, const char *name, smelt_plan **out) {
    smelt_status s = plan_load(plan, name);
    if (s != SMELT_OK) {
        rt_plan_release(plan);
        return s;
    }
    *out = plan;
    return SMELT_OK;
}

smelt_status smelt_plan_open(const char *path, smelt_plan **out) {
    if (!out) return rt_last_error_set(SMELT_ERROR_INVALID_ARGUMENT, "smelt_plan_open: out is NULL");
    *out = NULL;
    if (!path) return rt_last_error_set(SMELT_ERROR_INVALID_ARGUMENT, "smelt_plan_open: path is NULL");
    smelt_plan *plan = calloc(1, sizeof *plan);
    if (!plan) return rt_last_error_set(SMELT_ERROR_OUT_OF_MEMORY, "out of memory opening %s", path);
    plan->references = 1;
    char error[RT_ERROR_MESSAGE_SIZE];
    if (!plan_open(path, &plan->file, error, sizeof error)) {
        free(plan);
        FILE *probe = fopen(path, "rb"); /* tell a missing file from a bad one */
        if (!probe) return rt_last_error_set(SMELT_ERROR_IO, "%s", error);
        fclose(probe);
        return rt_last_error_set(SMELT_ERROR_BAD_PLAN, "%s", error);
    }
    return plan_finish_open(plan, path, out);
}

smelt_status smelt_plan_open_memory(const void *bytes, size_t size, smelt_plan **out) {
    if (!out) return rt_last_error_set(SMELT_ERROR_INVALID_ARGUMENT, "smelt_plan_open_memory: out is NULL");
    *out = NULL;
    if (!bytes && size)
        return rt_last_error_set(SMELT_ERROR_INVALID_ARGUMENT, "smelt_plan_open_memory: bytes is NULL");
    smelt_plan *plan = calloc(1, sizeof *plan);
    if (!plan) return rt_last_error_set(SMELT_ERROR_OUT_OF_MEMORY, "out of memory opening a plan");
    plan->references = 1;
    char error[RT_ERROR_MESSAGE_SIZE];
    if (!plan_open_bytes(bytes, size, "plan", &plan->file, error, sizeof error)) {
        free(plan);
        return rt_last_error_set(SMELT_ERROR_BAD_PLAN, "%s", error);
    }
    return plan_finish_open(plan, "plan", out);
}

void smelt_plan_close(smelt_plan *plan) { rt_plan_release(plan); }

smelt_status smelt_plan_get_info(const smelt_plan *plan, smelt_plan_info *out) {
    if (!plan || !out)
        return rt_last_error_set(SMELT_ERROR_INVALID_ARGUMENT, "smelt_plan_get_info: plan or out is NULL");
    const program *p = &plan->program;
    memset(out, 0, sizeof *out);
    out->vocab = p->vocab;
    out->max_tokens = p->max_tokens;
    out->max_positions = p->max_positions;
    out->eos_token_count = p->eos_count;
    for (uint32_t i = 0; i < p->eos_count; i++)
        out->eos_tokens[i] = p->eos[i];
    out->kernel_count = plan->kernels.count;
    out->weight_count = p->weight_count;
    for (uint32_t i = 0; i < p->weight_count; i++)
        if (p->weights[i].data_offset == UINT64_MAX) out->unbound_weight_count++;
    out->has_host_kernels = plan->host_object != NULL;
    out->has_cuda_kernels = plan->has_cuda_kernels;
    plan_content_hash_hex(&plan->file, out->content_hash);
    return SMELT_OK;
}
