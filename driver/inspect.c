/* inspect.c - `smelt inspect`: a plan printed for people (plan_print.h),
 * then its performance model: for each step kind asked for (a prefill of N
 * tokens, a decode step at context C), the launches per step and per
 * decoder layer, each kernel's modeled DRAM bytes and flops (the cost the
 * plan carries for every instruction: program.h, "The cost model"), their
 * totals, the bytes no implementation can avoid, and the time all of it
 * takes at the peaks of the GPUs below. With --json the model alone, as JSON.
 *
 * Time of one launch = max(bytes / DRAM bandwidth, flops / peak) + the cost
 * of a launch, summed over the step: a roofline per launch, which assumes
 * every kernel reaches its GPU's peak. It does not model occupancy (a grid of
 * 32 blocks on 132 SMs), latency-bound loops or caches (a re-read that hits
 * L2 is counted as DRAM traffic), so it bounds what a plan can do from
 * below; tests/gpu/run.sh measures what it does. Each kernel's blocks per
 * launch are printed beside it, which shows where occupancy will bite: the
 * largest grid of its launches at the step ("max blocks"; "blocks" in the
 * JSON), since one kernel may serve the decoder layers at T tokens and the
 * output head on the sampled row alone (a norm, say), and the layers'
 * launches are the ones that fill the GPU or not.
 *
 * Decoder layers: the plan does not name them, so they are counted from its
 * KV caches (state buffers indexed by position). The caches one instruction
 * touches belong to one attention op (its keys, values and written flags),
 * so joining caches touched by a common instruction gives one group per
 * attention op: the layers. Launches per layer is the stack's period at a
 * step: the instructions that run at its token count (prog_instr_runs), from
 * the first that touches layer 1's caches to the first that touches layer
 * L's, over L - 1 (from layer 1's first on, when there is one layer).
 *
 * A prefill step is modeled as generation runs it: wanting the last row's
 * logits alone, so the output head's instructions (wanted-rows ones,
 * plan/program.h) run at one token (their costs at T = 1) — `smelt eval`,
 * which wants every row, runs them at T.
 *
 * Unavoidable bytes of a step (what a perfect implementation still moves):
 * every weight read once, except an embedding table the ids index, of which
 * only the T rows gathered (unless a GEMM reads it whole, as a tied output
 * head does); the KV caches' C rows read once and the step's T new rows
 * written once; one row of logits (the sampled token's, f32) written once.
 * Unavoidable flops (the flop floor, at the tensor peak): the modeled flops,
 * the output head's for the sampled row alone — which is what the plan's
 * wanted-rows instructions do, so the two agree; a GPU's floor takes each
 * instruction's flops at the tensor peak it runs them at (a scaled GEMM's
 * at the FP8 rate where the GPU runs scaled GEMMs).
 */
#include "accuracy_gate.h"
#include "driver_internal.h"

#include "plan_print.h"
#include "plan_read.h"

#include <inttypes.h>
#include <jansson.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

/* ---- The GPUs ------------------------------------------------------------------- */

/* Peaks from the vendor's datasheets (dense, no sparsity):
 *   A100 SXM4 80GB: 2,039 GB/s HBM2e; 312 TFLOP/s BF16 tensor; 19.5 TFLOP/s
 *     FP32 (NVIDIA A100 Tensor Core GPU datasheet, 2021);
 *   H100 SXM5 80GB: 3.35 TB/s HBM3; 989 TFLOP/s BF16 tensor (1,979 with
 *     sparsity); 67 TFLOP/s FP32 (NVIDIA H100 Tensor Core GPU datasheet);
 *   H200 SXM 141GB: 4.8 TB/s HBM3e; 989 TFLOP/s BF16 tensor (1,979 with
 *     sparsity); 67 TFLOP/s FP32 (NVIDIA H200 Tensor Core GPU datasheet).
 * FP8 tensor: 1,979 TFLOP/s on H100 and H200 (3,958 with sparsity), the
 * rate of a scaled GEMM (plan/program.h), which they run on cuBLASLt; the
 * A100 (sm_80) has none and runs the scaled GEMMs' fallback kernels.
 * Flops on CUDA cores (a kernel without mma) count at the FP32 rate. */
typedef struct gpu_peaks {
    const char *name;        /* the JSON key */
    const char *description; /* for people */
    double dram_bytes_per_second, tensor_flops_per_second, cuda_core_flops_per_second;
    double scaled_gemm_flops_per_second; /* FP8 tensor; 0: runs no scaled GEMMs */
} gpu_peaks;

static const gpu_peaks gpus[] = {
    {"a100", "NVIDIA A100 SXM4 80GB", 2.039e12, 312e12, 19.5e12, 0},
    {"h100", "NVIDIA H100 SXM5 80GB", 3.35e12, 989e12, 67e12, 1979e12},
    {"h200", "NVIDIA H200 SXM 141GB", 4.8e12, 989e12, 67e12, 1979e12},
};
enum { GPU_COUNT = sizeof gpus / sizeof gpus[0], GPU_H200 = 2 };

/* The cost of one kernel launch or CUDA-graph node, about 1.3 us: a figure
 * to be measured by tests/gpu/run.sh (an empty launch and a graph node). */
static const double launch_seconds = 1.3e-6;

enum { DEFAULT_PREFILL_TOKENS = 512, DEFAULT_DECODE_CONTEXT = 1024, NAME_LIMIT = 160 };

/* ---- The model of one step ------------------------------------------------------- */

typedef struct step_kind {
    bool prefill;
    int64_t tokens, context; /* T, and C: positions already cached */
} step_kind;

typedef struct kernel_row {
    char name[NAME_LIMIT + 1]; /* a kernel's name, or "gemm N=.. K=.. ..." */
    uint32_t launches;
    double blocks; /* the largest grid of its launches at this step; 0 for a GEMM (cuBLASLt chooses) */
    double read, written, flops, seconds[GPU_COUNT];
} kernel_row;

typedef struct step_model {
    step_kind step;
    uint32_t launches;
    double read, written, flops, unavoidable;
    double unavoidable_flops;  /* the flops but the output head's beyond the sampled row */
    double launches_per_layer; /* the stack's period at this step; 0 without layers */
    double seconds[GPU_COUNT];
    double flop_floor[GPU_COUNT]; /* each instruction's flops at its tensor peak on the GPU */
    uint32_t row_count;
    kernel_row *rows; /* [row_count], by first launch */
} step_model;

/* What the whole plan says, whatever the step. */
typedef struct plan_facts {
    const program *p;
    const plan_kernel_table *kernels;
    uint32_t layers;
    /* The first instruction of the first and of the last layer: the stack's
     * period is the instructions that run between them / (layers - 1). */
    uint32_t first_layer_start, last_layer_start;
    uint64_t weight_bytes;
    bool weights_in_plan;
} plan_facts;

static bool state_is_cache(const program *p, prog_ref r) {
    return r.buffer == PROG_BUFFER_STATE && r.index < p->state_count && p->state_rows[r.index] > 0;
}

static uint32_t find_root(uint32_t *parent, uint32_t i) {
    while (parent[i] != i)
        i = parent[i] = parent[parent[i]];
    return i;
}

/* The refs instruction i names, into refs[] (at most PROG_MAX_ARGS). */
static uint32_t instr_refs(const prog_instr *in, prog_ref *refs) {
    if (in->op == PROG_OP_GEMM) {
        const prog_gemm *g = &in->as.gemm;
        refs[0] = g->a, refs[1] = g->b, refs[2] = g->c, refs[3] = g->bias;
        return g->has_bias ? 4 : 3;
    }
    uint32_t n = 0;
    for (uint32_t a = 0; a < in->as.launch.arg_count; a++)
        if (in->as.launch.args[a].kind == PROG_ARG_POINTER) refs[n++] = in->as.launch.args[a].ref;
    return n;
}

/* Layers and the launches per layer (the file's comment). False when out of memory. */
static bool count_layers(plan_facts *f) {
    const program *p = f->p;
    if (p->state_count == 0) return true;
    /* Per state: its root in the union-find, the first instruction that
     * touches it, and (for a root) its layer's first instruction. */
    uint32_t *scratch = malloc(3 * sizeof *scratch * p->state_count);
    if (!scratch) return false;
    uint32_t *parent = scratch, *first = scratch + p->state_count,
             *layer_first = scratch + 2 * p->state_count;
    for (uint32_t s = 0; s < p->state_count; s++)
        parent[s] = s, first[s] = layer_first[s] = UINT32_MAX;
    prog_ref refs[PROG_MAX_ARGS];
    for (uint32_t i = 0; i < p->instr_count; i++) {
        uint32_t n = instr_refs(&p->instrs[i], refs), joined = UINT32_MAX;
        for (uint32_t r = 0; r < n; r++) {
            if (!state_is_cache(p, refs[r])) continue;
            uint32_t root = find_root(parent, refs[r].index);
            if (joined == UINT32_MAX)
                joined = root;
            else if (root != joined)
                parent[root] = joined;
            if (first[refs[r].index] == UINT32_MAX) first[refs[r].index] = i;
        }
    }
    /* Each layer's first instruction: the earliest over its caches. */
    for (uint32_t s = 0; s < p->state_count; s++) {
        if (first[s] == UINT32_MAX) continue; /* untouched, or not a cache */
        uint32_t root = find_root(parent, s);
        if (first[s] < layer_first[root]) layer_first[root] = first[s];
    }
    uint32_t lowest = UINT32_MAX, highest = 0;
    for (uint32_t s = 0; s < p->state_count; s++) {
        if (layer_first[s] == UINT32_MAX) continue;
        f->layers++;
        if (layer_first[s] < lowest) lowest = layer_first[s];
        if (layer_first[s] > highest) highest = layer_first[s];
    }
    f->first_layer_start = lowest;
    f->last_layer_start = f->layers == 1 ? p->instr_count : highest;
    free(scratch);
    return true;
}

/* Printable ASCII alone, at most NAME_LIMIT bytes: a plan's text is untrusted. */
static void copy_name(char *dst, const char *src, uint64_t length) {
    uint64_t n = length < NAME_LIMIT ? length : NAME_LIMIT;
    for (uint64_t i = 0; i < n; i++)
        dst[i] = src[i] >= 0x20 && src[i] < 0x7f ? src[i] : '?';
    dst[n] = '\0';
}

static const char *dtype_text(uint8_t dtype) {
    return dtype == SMELT_DTYPE_F32      ? "f32"
           : dtype == SMELT_DTYPE_BF16   ? "bf16"
           : dtype == SMELT_DTYPE_F16    ? "f16"
           : dtype == SMELT_DTYPE_F8E4M3 ? "f8e4m3"
           : dtype == SMELT_DTYPE_I8     ? "i8"
                                         : "?";
}

static void instr_name(const plan_facts *f, const prog_instr *in, char *name) {
    if (in->op == PROG_OP_GEMM) {
        const prog_gemm *g = &in->as.gemm;
        snprintf(name, NAME_LIMIT + 1, "gemm N=%" PRId64 " K=%" PRId64 " %s x %s -> %s%s", g->n, g->k,
                 dtype_text(g->dtype_a), dtype_text(g->dtype_b), dtype_text(g->dtype_c),
                 g->has_bias ? " + bias" : "");
        return;
    }
    uint32_t k = in->as.launch.kernel;
    if (f->kernels && k < f->kernels->count)
        copy_name(name, f->kernels->kernels[k].name.data, f->kernels->kernels[k].name.length);
    else
        snprintf(name, NAME_LIMIT + 1, "kernel[%" PRIu32 "]", k);
}

/* Is instruction `in` a launch of an embedding kernel (a gather of rows)? */
static bool is_gather(const plan_facts *f, const prog_instr *in) {
    if (in->op == PROG_OP_GEMM || !f->kernels || in->as.launch.kernel >= f->kernels->count) return false;
    const plan_text *family = &f->kernels->kernels[in->as.launch.kernel].family;
    return family->length == 9 && memcmp(family->data, "embedding", 9) == 0;
}

static double unavoidable_bytes(const plan_facts *f, step_kind s) {
    const program *p = f->p;
    double bytes = 4.0 * (double)p->vocab; /* one row of f32 logits */
    for (uint32_t w = 0; w < p->weight_count; w++) {
        double whole = (double)p->weights[w].bytes;
        /* the table the ids index is read a row per token, unless another
         * instruction (a tied lm_head: a GEMM, a GEMV or dequantize-GEMM
         * launch over a quantized table) reads it whole */
        bool gathered = w == p->id_table && p->weights[w].rank >= 1 && p->weights[w].shape[0] > 0;
        for (uint32_t i = 0; i < p->instr_count && gathered; i++) {
            const prog_instr *in = &p->instrs[i];
            if (is_gather(f, in)) continue;
            prog_ref refs[PROG_MAX_ARGS];
            uint32_t n = instr_refs(in, refs);
            for (uint32_t r = 0; r < n; r++)
                if (refs[r].buffer == PROG_BUFFER_WEIGHT && refs[r].index == w) gathered = false;
        }
        double rows = whole / (double)(gathered ? p->weights[w].shape[0] : 1) * (double)s.tokens;
        bytes += gathered && rows < whole ? rows : whole;
    }
    for (uint32_t st = 0; st < p->state_count; st++)
        if (p->state_rows[st] > 0)
            bytes += (double)p->state_bytes[st] / (double)p->state_rows[st] * (double)(s.context + s.tokens);
    return bytes;
}

/* The GPU's figures as the choices between lowerings take them
 * (plan/program.h, "Choices"). */
static prog_device_figures figures_of(const gpu_peaks *g) {
    return (prog_device_figures){g->dram_bytes_per_second, g->tensor_flops_per_second,
                                 g->cuda_core_flops_per_second, launch_seconds};
}

/* Does instruction `in` run at a step of `tokens` tokens as far as its
 * choice goes? A step in a choice's range is modeled with the group's ops
 * one by one (the host's rule), on every GPU alike; print_choices shows up
 * to which T each GPU runs the fused kernel instead. */
static bool modeled_side(const program *p, const prog_instr *in, int64_t tokens) {
    if (in->choice == 0) return true;
    const prog_choice *c = &p->choices[in->choice - 1];
    return tokens < c->min_tokens || tokens > c->max_tokens || in->side == 1;
}

/* Does instruction `in` run on GPU g: a scaled GEMM where it runs them,
 * its fallback kernel where it does not (plan/program.h, prog_instr.needs)? */
static bool runs_on(const prog_instr *in, int g) {
    bool scaled = gpus[g].scaled_gemm_flops_per_second > 0;
    return in->needs == PROG_NEED_NONE || (in->needs == PROG_NEED_SCALED_GEMM) == scaled;
}

/* The tensor peak the flops of `in` run at on GPU g. */
static double tensor_peak(const prog_instr *in, int g) {
    bool scaled = in->op == PROG_OP_GEMM && in->as.gemm.has_scales;
    return scaled ? gpus[g].scaled_gemm_flops_per_second : gpus[g].tensor_flops_per_second;
}

/* A step as the H200 runs it: its rows, bytes and flops are the
 * instructions it runs (the scaled GEMMs, where a plan has them); each GPU's
 * time and flop floor are those of the instructions that GPU runs (the A100:
 * the fallback kernels in their place). */
static bool model_step(const plan_facts *f, step_kind s, step_model *out) {
    const program *p = f->p;
    memset(out, 0, sizeof *out);
    out->step = s;
    out->rows = calloc(p->instr_count ? p->instr_count : 1, sizeof *out->rows);
    if (!out->rows) return false;
    double c = (double)s.context;
    for (uint32_t i = 0; i < p->instr_count; i++) {
        const prog_instr *in = &p->instrs[i];
        if (!prog_instr_runs(in, s.tokens)) continue; /* made for other steps */
        if (!modeled_side(p, in, s.tokens)) continue; /* the other side of its choice */
        /* The output head on the sampled row alone (the file's comment). */
        int64_t tokens = prog_instr_tokens(in, s.tokens, PROG_ROWS_LAST);
        double t = (double)tokens;
        double read = prog_poly_eval(in->cost.read, t, c), written = prog_poly_eval(in->cost.written, t, c);
        double flops = prog_poly_eval(in->cost.flops, t, c);
        double seconds[GPU_COUNT] = {0};
        for (int g = 0; g < GPU_COUNT; g++) {
            if (!runs_on(in, g)) continue;
            double peak = in->cost.tensor_cores ? tensor_peak(in, g) : gpus[g].cuda_core_flops_per_second;
            double memory = (read + written) / gpus[g].dram_bytes_per_second, compute = flops / peak;
            seconds[g] = (memory > compute ? memory : compute) + launch_seconds;
            out->seconds[g] += seconds[g];
            out->flop_floor[g] += flops / tensor_peak(in, g);
        }
        if (!runs_on(in, GPU_H200)) continue; /* the A100's fallback: in its time alone */
        char name[NAME_LIMIT + 1];
        instr_name(f, in, name);
        kernel_row *row = NULL;
        for (uint32_t r = 0; r < out->row_count && !row; r++)
            if (strcmp(out->rows[r].name, name) == 0) row = &out->rows[r];
        if (!row) {
            row = &out->rows[out->row_count++];
            memcpy(row->name, name, sizeof name);
        }
        row->launches++;
        if (in->op == PROG_OP_LAUNCH) {
            double blocks = (double)prog_affine_eval(in->as.launch.rule.grid[0], tokens) *
                            (double)prog_affine_eval(in->as.launch.rule.grid[1], tokens) *
                            (double)prog_affine_eval(in->as.launch.rule.grid[2], tokens);
            if (blocks > row->blocks) row->blocks = blocks;
        }
        row->read += read;
        row->written += written;
        row->flops += flops;
        for (int g = 0; g < GPU_COUNT; g++)
            row->seconds[g] += seconds[g];
        out->launches++;
        out->read += read;
        out->written += written;
        out->flops += flops;
        out->unavoidable_flops += flops;
    }
    out->unavoidable = unavoidable_bytes(f, s);
    if (f->layers) { /* what runs at this step in the stack's period */
        uint32_t running = 0;
        for (uint32_t i = f->first_layer_start; i < f->last_layer_start && i < p->instr_count; i++)
            running += prog_instr_runs(&p->instrs[i], s.tokens) && modeled_side(p, &p->instrs[i], s.tokens) &&
                       runs_on(&p->instrs[i], GPU_H200);
        out->launches_per_layer = f->layers > 1 ? (double)running / (f->layers - 1) : running;
    }
    return true;
}

/* ---- Step kinds ------------------------------------------------------------------ */

/* The steps asked for, checked against the plan's bounds: a prefill of N
 * tokens needs N <= max_tokens (and N positions), a decode step at context C
 * needs C + 1 positions. The defaults shrink to fit a small plan. */
static bool plan_steps(const program *p, const drv_inspect_options *o, step_kind *steps, uint32_t *count,
                       diag_engine *d) {
    int64_t positions = p->max_positions > 0 ? p->max_positions : INT32_MAX;
    *count = 0;
    if (o->prefill_count == 0) {
        int64_t n = DEFAULT_PREFILL_TOKENS;
        if (n > p->max_tokens) n = p->max_tokens;
        if (n > positions) n = positions;
        steps[(*count)++] = (step_kind){true, n, 0};
    }
    for (uint32_t i = 0; i < o->prefill_count; i++) {
        int64_t n = o->prefill_tokens[i];
        if (n < 1 || n > p->max_tokens || n > positions) {
            diag_error(d, SMELT_NO_LOC,
                       "--prefill %lld: the plan runs steps of 1 to %lld tokens over %lld positions",
                       (long long)n, (long long)p->max_tokens, (long long)positions);
            return false;
        }
        steps[(*count)++] = (step_kind){true, n, 0};
    }
    if (o->decode_count == 0) {
        int64_t context = DEFAULT_DECODE_CONTEXT;
        if (context > positions - 1) context = positions - 1;
        steps[(*count)++] = (step_kind){false, 1, context};
    }
    for (uint32_t i = 0; i < o->decode_count; i++) {
        int64_t context = o->decode_contexts[i];
        if (context + 1 > positions) {
            diag_error(d, SMELT_NO_LOC,
                       "--decode-context %lld: the plan's KV caches hold %lld positions, so a decode step's "
                       "context is at most %lld",
                       (long long)context, (long long)positions, (long long)positions - 1);
            return false;
        }
        steps[(*count)++] = (step_kind){false, 1, context};
    }
    return true;
}

/* ---- Text ------------------------------------------------------------------------ */

static void print_seconds(FILE *out, double seconds) {
    if (seconds >= 1e-3)
        fprintf(out, "%.3f ms", seconds * 1e3);
    else
        fprintf(out, "%.1f us", seconds * 1e6);
}

static void print_step(FILE *out, const plan_facts *f, const step_model *m) {
    if (m->step.prefill)
        fprintf(out, "\n  prefill of %" PRId64 " tokens (context 0; the last row's logits):\n",
                m->step.tokens);
    else
        fprintf(out, "\n  decode step at context %" PRId64 " (1 token):\n", m->step.context);
    fprintf(out, "    launches:       %" PRIu32 " per step", m->launches);
    if (f->layers) fprintf(out, ", %.4g per decoder layer", m->launches_per_layer);
    double bytes = m->read + m->written;
    fprintf(out, "\n    DRAM bytes:     %.0f (%.0f read, %.0f written); unavoidable %.0f (modeled %.3fx)\n",
            bytes, m->read, m->written, m->unavoidable, m->unavoidable > 0 ? bytes / m->unavoidable : 0.0);
    fprintf(out, "    flops:          %.0f; unavoidable %.0f (the output head on the sampled row alone)\n",
            m->flops, m->unavoidable_flops);
    for (int g = 0; g < GPU_COUNT; g++) {
        double floor_bytes = m->unavoidable / gpus[g].dram_bytes_per_second;
        double floor_flops = m->flop_floor[g];
        fprintf(out, "    %s time:      ", gpus[g].name);
        print_seconds(out, m->seconds[g]);
        fprintf(out, " (unavoidable bytes ");
        print_seconds(out, floor_bytes);
        fprintf(out, ": %.3fx; flop floor ", floor_bytes > 0 ? m->seconds[g] / floor_bytes : 0.0);
        print_seconds(out, floor_flops);
        fprintf(out, ": %.3fx)\n", floor_flops > 0 ? m->seconds[g] / floor_flops : 0.0);
    }
    fprintf(out, "    %-56s %8s %10s %14s %14s %16s %12s\n", "kernel", "launches", "max blocks", "bytes read",
            "bytes written", "flops", "h200 time");
    for (uint32_t r = 0; r < m->row_count; r++) {
        const kernel_row *row = &m->rows[r];
        char blocks[24] = "-";
        if (row->blocks > 0) snprintf(blocks, sizeof blocks, "%.0f", row->blocks);
        fprintf(out, "    %-56s %8" PRIu32 " %10s %14.0f %14.0f %16.0f %9.1f us\n", row->name, row->launches,
                blocks, row->read, row->written, row->flops, row->seconds[GPU_H200] * 1e6);
    }
}

/* The first instruction of choice c (1-based): what names its group. */
static const prog_instr *first_of_choice(const program *p, uint32_t c) {
    for (uint32_t i = 0; i < p->instr_count; i++)
        if (p->instrs[i].choice == c) return &p->instrs[i];
    return NULL;
}

/* Each choice between a fused GEMV group's lowerings (plan/program.h,
 * "Choices"): up to which T each GPU runs the GEMV; groups of one shape
 * (every layer's) print once, with their count. */
static void print_choices(FILE *out, const plan_facts *f) {
    const program *p = f->p;
    if (p->choice_count == 0) return;
    fprintf(out,
            "\nGEMV or GEMMs, chosen per step at run time (the fused kernel up to T on each GPU; the same "
            "model, the device's own figures on a GPU; the host: up to %lld):\n",
            (long long)p->choices[0].min_tokens - 1);
    fprintf(out, "    %-56s %6s %8s", "group (first instruction)", "groups", "T range");
    for (int g = 0; g < GPU_COUNT; g++)
        fprintf(out, " %6s", gpus[g].name);
    fprintf(out, "\n");
    bool *printed = calloc(p->choice_count, sizeof *printed);
    if (!printed) return;
    for (uint32_t c = 0; c < p->choice_count; c++) {
        if (printed[c]) continue;
        char name[NAME_LIMIT + 1];
        instr_name(f, first_of_choice(p, c + 1), name);
        uint32_t same = 0;
        for (uint32_t k = c; k < p->choice_count; k++) {
            char other[NAME_LIMIT + 1];
            instr_name(f, first_of_choice(p, k + 1), other);
            if (strcmp(name, other) != 0 || memcmp(&p->choices[k], &p->choices[c], sizeof p->choices[c]) != 0)
                continue;
            printed[k] = true;
            same++;
        }
        char range[32];
        snprintf(range, sizeof range, "%lld-%lld", (long long)p->choices[c].min_tokens,
                 (long long)p->choices[c].max_tokens);
        fprintf(out, "    %-56s %6" PRIu32 " %8s", name, same, range);
        for (int g = 0; g < GPU_COUNT; g++) {
            prog_device_figures figures = figures_of(&gpus[g]);
            fprintf(out, " %6lld", (long long)program_choice_threshold(&p->choices[c], &figures));
        }
        fprintf(out, "\n");
    }
    free(printed);
}

static void print_model(FILE *out, const plan_facts *f, const step_model *models, uint32_t count) {
    fprintf(out,
            "\nperformance model (per launch: max(bytes / bandwidth, flops / peak) + %.1f us; "
            "no occupancy or caches modeled):\n",
            launch_seconds * 1e6);
    for (int g = 0; g < GPU_COUNT; g++)
        fprintf(out, "  %s: %s, %.3f TB/s, %.0f TFLOP/s bf16 tensor, %.1f TFLOP/s f32\n", gpus[g].name,
                gpus[g].description, gpus[g].dram_bytes_per_second / 1e12,
                gpus[g].tensor_flops_per_second / 1e12, gpus[g].cuda_core_flops_per_second / 1e12);
    fprintf(out, "  weights: %" PRIu64 " bytes (%s); decoder layers: %" PRIu32 " (counted by KV cache)\n",
            f->weight_bytes, f->weights_in_plan ? "in the plan" : "bound at run time", f->layers);
    for (uint32_t i = 0; i < count; i++)
        print_step(out, f, &models[i]);
    print_choices(out, f);
}

/* ---- JSON ------------------------------------------------------------------------ */

static json_t *json_count(double v) { return v < 9e18 ? json_integer((json_int_t)llround(v)) : json_real(v); }

static json_t *by_gpu(const double *seconds) {
    json_t *o = json_object();
    for (int g = 0; g < GPU_COUNT; g++)
        json_object_set_new(o, gpus[g].name, json_real(seconds[g]));
    return o;
}

static json_t *step_json(const plan_facts *f, const step_model *m) {
    json_t *o = json_object();
    json_object_set_new(o, "kind", json_string(m->step.prefill ? "prefill" : "decode"));
    json_object_set_new(o, "tokens", json_integer(m->step.tokens));
    json_object_set_new(o, "context", json_integer(m->step.context));
    json_object_set_new(o, "launches_per_step", json_integer(m->launches));
    json_object_set_new(o, "layers", json_integer(f->layers));
    json_t *per_layer = !f->layers ? json_null()
                        : m->launches_per_layer == floor(m->launches_per_layer)
                            ? json_integer((json_int_t)m->launches_per_layer)
                            : json_real(m->launches_per_layer);
    json_object_set_new(o, "launches_per_layer", per_layer);
    json_object_set_new(o, "modeled_dram_bytes", json_count(m->read + m->written));
    json_object_set_new(o, "modeled_read_bytes", json_count(m->read));
    json_object_set_new(o, "modeled_written_bytes", json_count(m->written));
    json_object_set_new(o, "unavoidable_dram_bytes", json_count(m->unavoidable));
    json_object_set_new(o, "flops", json_count(m->flops));
    json_object_set_new(o, "unavoidable_flops", json_count(m->unavoidable_flops));
    json_object_set_new(o, "modeled_seconds", by_gpu(m->seconds));
    double floor_bytes[GPU_COUNT], floor_flops[GPU_COUNT];
    for (int g = 0; g < GPU_COUNT; g++) {
        floor_bytes[g] = m->unavoidable / gpus[g].dram_bytes_per_second;
        floor_flops[g] = m->flop_floor[g];
    }
    json_object_set_new(o, "unavoidable_seconds", by_gpu(floor_bytes));
    json_object_set_new(o, "flop_floor_seconds", by_gpu(floor_flops));
    json_t *rows = json_array();
    for (uint32_t r = 0; r < m->row_count; r++) {
        const kernel_row *row = &m->rows[r];
        json_t *k = json_object();
        json_object_set_new(k, "name", json_string(row->name));
        json_object_set_new(k, "launches", json_integer(row->launches));
        json_object_set_new(k, "blocks", row->blocks > 0 ? json_count(row->blocks) : json_null());
        json_object_set_new(k, "read_bytes", json_count(row->read));
        json_object_set_new(k, "written_bytes", json_count(row->written));
        json_object_set_new(k, "flops", json_count(row->flops));
        json_object_set_new(k, "modeled_seconds", by_gpu(row->seconds));
        json_array_append_new(rows, k);
    }
    json_object_set_new(o, "kernels", rows);
    return o;
}

/* The manifest's "accuracy_gate" object (accuracy_gate.h; a new reference),
 * or NULL when the plan was compiled without the gate. */
static json_t *accuracy_gate_of(const plan_file *plan) {
    const uint8_t *data;
    uint64_t size;
    if (!plan_section(plan, PLAN_SECTION_MANIFEST, &data, &size)) return NULL;
    json_t *manifest = json_loadb((const char *)data, size, 0, NULL);
    json_t *gate = json_incref(json_object_get(manifest, "accuracy_gate"));
    json_decref(manifest);
    return gate;
}

static bool print_json(FILE *out, const plan_file *plan, const plan_facts *f, const step_model *models,
                       uint32_t count) {
    char hash[33];
    plan_content_hash_hex(plan, hash);
    json_t *root = json_object(), *list = json_array(), *peaks = json_array();
    json_object_set_new(root, "content_hash", json_string(hash));
    json_object_set_new(root, "weight_bytes", json_integer((json_int_t)f->weight_bytes));
    json_object_set_new(root, "weights_in_plan", json_boolean(f->weights_in_plan));
    json_object_set_new(root, "max_step_tokens", json_integer(f->p->max_tokens));
    json_object_set_new(root, "max_positions", json_integer(f->p->max_positions));
    json_object_set_new(root, "layers", json_integer(f->layers));
    json_object_set_new(root, "launch_seconds", json_real(launch_seconds));
    for (int g = 0; g < GPU_COUNT; g++) {
        json_t *gpu = json_object();
        json_object_set_new(gpu, "name", json_string(gpus[g].name));
        json_object_set_new(gpu, "description", json_string(gpus[g].description));
        json_object_set_new(gpu, "dram_bytes_per_second", json_real(gpus[g].dram_bytes_per_second));
        json_object_set_new(gpu, "tensor_flops_per_second", json_real(gpus[g].tensor_flops_per_second));
        json_object_set_new(gpu, "cuda_core_flops_per_second", json_real(gpus[g].cuda_core_flops_per_second));
        json_array_append_new(peaks, gpu);
    }
    json_object_set_new(root, "gpus", peaks);
    json_t *choices = json_array();
    for (uint32_t c = 0; c < f->p->choice_count; c++) {
        json_t *choice = json_object(), *up_to = json_object();
        char name[NAME_LIMIT + 1];
        instr_name(f, first_of_choice(f->p, c + 1), name);
        json_object_set_new(choice, "group", json_string(name));
        json_object_set_new(choice, "min_tokens", json_integer(f->p->choices[c].min_tokens));
        json_object_set_new(choice, "max_tokens", json_integer(f->p->choices[c].max_tokens));
        for (int g = 0; g < GPU_COUNT; g++) {
            prog_device_figures figures = figures_of(&gpus[g]);
            json_object_set_new(up_to, gpus[g].name,
                                json_integer(program_choice_threshold(&f->p->choices[c], &figures)));
        }
        json_object_set_new(choice, "gemv_up_to_tokens", up_to);
        json_array_append_new(choices, choice);
    }
    json_object_set_new(root, "gemv_choices", choices);
    for (uint32_t i = 0; i < count; i++)
        json_array_append_new(list, step_json(f, &models[i]));
    json_object_set_new(root, "steps", list);
    json_t *gate = accuracy_gate_of(plan);
    if (gate) json_object_set_new(root, "accuracy_gate", gate);
    bool ok = json_dumpf(root, out, JSON_INDENT(2) | JSON_REAL_PRECISION(9)) == 0;
    fputc('\n', out);
    json_decref(root);
    return ok;
}

/* ---- The command ----------------------------------------------------------------- */

typedef struct inspection {
    program p;
    plan_kernel_table kernels;
    plan_facts facts;
    step_kind *steps;
    step_model *models;
    uint32_t count, modeled;
    bool program_read; /* the program decoded (what fails after it is the steps asked for) */
} inspection;

static void inspection_free(inspection *in) {
    for (uint32_t i = 0; i < in->modeled; i++)
        free(in->models[i].rows);
    free(in->models);
    free(in->steps);
    plan_kernel_table_free(&in->kernels);
    program_free(&in->p);
}

/* The model of every step asked for; false (reported) when the plan has no
 * program or cannot run such a step. */
static bool inspection_build(inspection *in, const plan_file *plan, const drv_inspect_options *o,
                             diag_engine *d) {
    memset(in, 0, sizeof *in);
    const uint8_t *data;
    uint64_t size;
    char error[1024] = "the plan has no launch program";
    if (!plan_section(plan, PLAN_SECTION_PROGRAM, &data, &size) ||
        !program_decode(data, size, &in->p, error, sizeof error)) {
        diag_error(d, SMELT_NO_LOC, "%s", error);
        return false;
    }
    in->program_read = true;
    bool have_kernels = plan_section(plan, PLAN_SECTION_KERNELS, &data, &size) &&
                        plan_kernel_table_decode(data, size, &in->kernels, error, sizeof error);
    plan_facts *f = &in->facts;
    *f = (plan_facts){.p = &in->p,
                      .kernels = have_kernels ? &in->kernels : NULL,
                      .weights_in_plan = in->p.weight_count > 0};
    for (uint32_t w = 0; w < in->p.weight_count; w++) {
        f->weight_bytes += in->p.weights[w].bytes;
        f->weights_in_plan = f->weights_in_plan && in->p.weights[w].data_offset != UINT64_MAX;
    }
    uint32_t capacity = (o->prefill_count ? o->prefill_count : 1) + (o->decode_count ? o->decode_count : 1);
    in->steps = calloc(capacity, sizeof *in->steps);
    in->models = calloc(capacity, sizeof *in->models);
    if (!in->steps || !in->models || !count_layers(f)) {
        diag_error(d, SMELT_NO_LOC, "out of memory while modeling the plan");
        return false;
    }
    if (!plan_steps(&in->p, o, in->steps, &in->count, d)) return false;
    for (; in->modeled < in->count; in->modeled++)
        if (!model_step(f, in->steps[in->modeled], &in->models[in->modeled])) {
            diag_error(d, SMELT_NO_LOC, "out of memory while modeling the plan");
            return false;
        }
    return true;
}

bool drv_plan_print(const char *plan_path, const drv_inspect_options *o, FILE *out, diag_engine *d) {
    static const drv_inspect_options defaults = {0};
    if (!o) o = &defaults;
    plan_file plan;
    char error[1024];
    if (!plan_open(plan_path, &plan, error, sizeof error)) {
        diag_error(d, SMELT_NO_LOC, "%s", error);
        return false;
    }
    /* The plan itself prints even when its program cannot be modeled (that
     * is what one inspects a damaged plan for); a step it cannot run is
     * refused before anything prints. */
    inspection in;
    bool modeled = inspection_build(&in, &plan, o, d), ok = true;
    bool bad_step = !modeled && in.program_read;
    if (!o->json && !bad_step) {
        plan_print_options options = {.kernel_source = o->kernel_source};
        ok = plan_print(out, &plan, &options, error, sizeof error);
        if (!ok) diag_error(d, SMELT_NO_LOC, "%s", error);
        json_t *gate = ok ? accuracy_gate_of(&plan) : NULL;
        if (gate && !drv_gate_print_table(gate, out))
            diag_warning(d, SMELT_NO_LOC,
                         "the manifest's accuracy_gate is malformed; not printed as a table");
        json_decref(gate);
    }
    if (modeled && ok && o->json) ok = print_json(out, &plan, &in.facts, in.models, in.count);
    if (modeled && ok && !o->json) print_model(out, &in.facts, in.models, in.count);
    ok = ok && modeled;
    if (ferror(out) && ok) {
        diag_error(d, SMELT_NO_LOC, "cannot write the output");
        ok = false;
    }
    inspection_free(&in);
    plan_close(&plan);
    return ok;
}
