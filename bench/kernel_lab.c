/* kernel_lab.c - every kernel family over a sweep of shapes: checked against
 * the reference on the host simulator, and timed on a GPU.
 *
 *   bench_kernel_lab [--quick] [--gpu] [--family NAME]
 *
 * Host half (always): each family's ops at each shape of its sweep are
 * emitted, compiled by NVRTC for sm_80/sm_90 (no spills), run on the host
 * simulator and compared with the reference backend's function for the op,
 * in f32 and bf16 storage: tests/unit/emit_harness.c, the harness of
 * test_emit, so the lab and the tests cannot disagree on what "right" is.
 * A family over quantized weights (its `quant`: a preset of the precision
 * pass) runs that preset with f32 and with bf16 activations instead. A
 * family with a `check` also checks the kernel's result against a truth of
 * its own (the reference's matmul of a few token rows; cos and sin computed
 * here), so that the same check can run on what the GPU computed.
 * --quick runs the first shape of each sweep alone (ctest runs that).
 *
 * GPU half (--gpu; skipped with a note where no CUDA driver opens): first the
 * peaks it compares against, measured here: device-to-device copy bandwidth
 * (cuMemcpyDtoDAsync, read + write bytes) and the bf16 tensor-core rate (a
 * loop of mma.sync m16n8k16 with f32 accumulation on every SM, "gemm_mma"),
 * the cost of an empty launch and of a graph node; then each family's
 * kernels at the GPU shapes of its sweep (those that serve the step's token
 * count, as the executor picks them), timed with CUDA events over repeated
 * launches, printing achieved GB/s and TFLOP/s (from the emitter's modeled
 * cost, cg_kernel.cost or the cost derived from the parameters plus
 * cg_kernel.flops) and their fraction of the measured peaks, and what the
 * family reports besides (the weights' GB/s of a GEMM, the bytes written of
 * a table). Data on the device is random floats and small integers (ids,
 * positions: as the case sets them), state zeroed: right for timing, not
 * for values; but a family with a `check` gets the harness's data (weights
 * quantized as on the host) at its first `gpu_checks` GPU shapes, and its
 * result there is checked as on the host.
 *
 * Adding a kernel family: one entry in `families` with a function that
 * declares the op in an emit_case at shape index s (and returns its op).
 * A quantized GEMM of another preset is one line, LAB_GEMM with the preset:
 * LAB_GEMM("gemm_w8a8_int8", "int8", 0, NULL) for W8A8 per token.
 */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <cmocka.h>

#include "../tests/unit/emit_harness.c"

/* ---- the families ------------------------------------------------------------------------ */

typedef struct lab_shape {
    int64_t a, b, c; /* family-specific dims */
    int64_t tokens;  /* T of the run */
    bool gpu_only;   /* too large for the simulator in a sweep */
} lab_shape;

typedef uint32_t (*lab_build)(emit_case *c, const lab_shape *s);

/* A quantizing preset of the precision pass (emit_harness.c's case fields). */
typedef struct lab_quant {
    const char *preset;    /* "int4-rtn", "int8", "fp8"; NULL: f32 and bf16 storage, no quantization */
    int64_t group_size;    /* int4's columns per group; 0: the preset's */
    const char *act_quant; /* "none": weight-only; NULL: the preset's (W8A8 per token for int8 and fp8) */
} lab_quant;

/* A check of op's result at T (`result`: its bytes in the storage dtype, as a
 * kernel wrote them, on the simulator or the GPU) against a truth the check
 * computes, with the family's tolerance where the check has no bound of its
 * own: the largest |got - want| / allowed, so above 1 is a failure. */
typedef double (*lab_check)(emit_case *c, uint32_t op, int64_t tokens, const void *result, double tolerance);

/* What a GPU timing line adds to GB/s and TFLOP/s of the modeled cost. */
typedef enum lab_report {
    LAB_REPORT_TOTAL,   /* nothing */
    LAB_REPORT_WEIGHTS, /* the weights' bytes read a second, and the kernels that ran */
    LAB_REPORT_WRITTEN, /* the bytes written a second */
} lab_report;

typedef struct lab_family {
    const char *name;
    lab_build build;
    double tolerance;
    lab_shape shapes[6];
    int shape_count;
    lab_quant quant;
    lab_check check; /* NULL: the reference's comparison alone */
    lab_report report;
    /* On the GPU, the first gpu_checks of the GPU shapes get the harness's
     * data and the check: quantizing a Llama weight here takes seconds, and
     * the timing of the others needs no true data. */
    int gpu_checks;
} lab_family;

static uint32_t build_elementwise(emit_case *c, const lab_shape *s) {
    char type[64];
    snprintf(type, sizeof type, "f32[tokens, %lld]", (long long)s->a);
    ir_value_id x = case_input(c, "x", type), y = case_input(c, "y", type);
    return case_op(c, IR_OP_ADD, (ir_value_id[]){x, y}, 2);
}

static uint32_t build_norm(emit_case *c, const lab_shape *s) {
    char type[64], weight[64];
    snprintf(type, sizeof type, "f32[tokens, %lld]", (long long)s->a);
    snprintf(weight, sizeof weight, "f32[%lld]", (long long)s->a);
    uint32_t op =
        case_op(c, IR_OP_RMS_NORM, (ir_value_id[]){case_input(c, "x", type), case_weight(c, weight)}, 2);
    assert_true(ir_op_set_float(&c->m, op, "eps", 1e-5));
    return op;
}

static uint32_t build_rope(emit_case *c, const lab_shape *s) {
    char type[64];
    snprintf(type, sizeof type, "f32[tokens, %lld, %lld]", (long long)s->a, (long long)s->b);
    uint32_t op = case_op(c, IR_OP_ROPE, (ir_value_id[]){case_input(c, "x", type), c->pos}, 2);
    assert_true(ir_op_set_float(&c->m, op, "theta", 500000.0));
    return op;
}

static uint32_t build_softmax(emit_case *c, const lab_shape *s) {
    char type[64];
    snprintf(type, sizeof type, "f32[tokens, %lld]", (long long)s->a);
    ir_value_id x = case_input(c, "x", type);
    return case_op(c, IR_OP_SOFTMAX, &x, 1);
}

static uint32_t build_embedding(emit_case *c, const lab_shape *s) {
    char type[64];
    snprintf(type, sizeof type, "f32[%lld, %lld]", (long long)s->a, (long long)s->b);
    return case_op(c, IR_OP_EMBEDDING, (ir_value_id[]){case_weight(c, type), c->ids}, 2);
}

/* a query heads, b kv heads, c head dim; max_seq 64 */
static uint32_t build_attention(emit_case *c, const lab_shape *s) {
    char q[64], kv[64];
    snprintf(q, sizeof q, "f32[tokens, %lld, %lld]", (long long)s->a, (long long)s->c);
    snprintf(kv, sizeof kv, "f32[tokens, %lld, %lld]", (long long)s->b, (long long)s->c);
    ir_value_id k = case_input(c, "k", kv), v = case_input(c, "v", kv);
    uint32_t op = case_op(c, IR_OP_ATTENTION, (ir_value_id[]){case_input(c, "q", q), k, v, c->pos}, 4);
    assert_true(ir_op_set_float(&c->m, op, "scale", 1.0 / sqrt((double)s->c)));
    assert_true(ir_op_set_int(&c->m, op, "max_seq", TOKEN_BOUND));
    assert_true(ir_op_set_bool(&c->m, op, "causal", true));
    return op;
}

/* a experts, b model dim, c ffn dim; top-2 */
static uint32_t build_moe(emit_case *c, const lab_shape *s) {
    char x[64], router[64], gate[64], down[64];
    snprintf(x, sizeof x, "f32[tokens, %lld]", (long long)s->b);
    snprintf(router, sizeof router, "f32[%lld, %lld]", (long long)s->a, (long long)s->b);
    snprintf(gate, sizeof gate, "f32[%lld, %lld, %lld]", (long long)s->a, (long long)s->c, (long long)s->b);
    snprintf(down, sizeof down, "f32[%lld, %lld, %lld]", (long long)s->a, (long long)s->b, (long long)s->c);
    uint32_t op = case_op(c, IR_OP_MOE,
                          (ir_value_id[]){case_input(c, "x", x), case_weight(c, router), case_weight(c, gate),
                                          case_weight(c, gate), case_weight(c, down)},
                          5);
    assert_true(ir_op_set_int(&c->m, op, "top_k", 2));
    return op;
}

static uint32_t build_argmax(emit_case *c, const lab_shape *s) {
    char type[64];
    snprintf(type, sizeof type, "f32[tokens, %lld]", (long long)s->a);
    ir_value_id x = case_input(c, "x", type);
    return case_op(c, IR_OP_ARGMAX, &x, 1);
}

/* a output rows N, b columns K: x[T, K] times an [N, K] weight quantized by the family's preset
 * (emit_dequant_gemm.c above the GEMV's token counts, emit_gemv.c up to them) */
static uint32_t build_gemm(emit_case *c, const lab_shape *s) {
    char x[64], w[64];
    snprintf(x, sizeof x, "f32[tokens, %lld]", (long long)s->b);
    snprintf(w, sizeof w, "f32[%lld, %lld]", (long long)s->a, (long long)s->b);
    return case_op(c, IR_OP_MATMUL, (ir_value_id[]){case_input(c, "x", x), case_weight(c, w)}, 2);
}

/* a rotary dims, c the step's first position; theta 500000 (Llama 3's), no scaling */
static uint32_t build_rope_table(emit_case *c, const lab_shape *s) {
    uint32_t op = case_op(c, IR_OP_ROPE_TABLE, &c->pos, 1);
    assert_true(ir_op_set_float(&c->m, op, "theta", 500000.0));
    assert_true(ir_op_set_int(&c->m, op, "rotary_dim", s->a));
    return op;
}

/* Positions for rope and attention: first..first + T - 1 (a prefill from
 * the start when first is 0). */
static void set_positions(emit_case *c, int64_t tokens, int64_t first) {
    int32_t *positions = malloc((size_t)tokens * sizeof *positions);
    assert_non_null(positions);
    for (int64_t i = 0; i < tokens; i++)
        positions[i] = (int32_t)(first + i);
    case_set_ints_data(c, c->pos, tokens, positions, (uint64_t)tokens);
    free(positions);
}

static void set_ids(emit_case *c, int64_t tokens, int64_t vocab) {
    int32_t *ids = malloc((size_t)tokens * sizeof *ids);
    assert_non_null(ids);
    for (int64_t i = 0; i < tokens; i++)
        ids[i] = (int32_t)((i * 7919) % vocab);
    case_set_ints_data(c, c->ids, tokens, ids, (uint64_t)tokens);
    free(ids);
}

/* ---- the checks -------------------------------------------------------------------------- */

/* Element i of a result stored as `storage` (f32, bf16 or f16). */
static double result_at(smelt_dtype storage, const void *result, uint64_t i) {
    return is_half(storage) ? from_half(storage, ((const uint16_t *)result)[i]) : ((const float *)result)[i];
}

/* The token rows a GEMM check recomputes: the first, two inside, the last
 * (the last M tile, partial when T is not a multiple of 64); distinct, in
 * order. Returns how many. */
static uint64_t checked_rows(int64_t tokens, uint64_t rows[4]) {
    const int64_t picks[4] = {0, tokens / 3, 2 * tokens / 3, tokens - 1};
    uint64_t count = 0;
    for (int i = 0; i < 4; i++)
        if (count == 0 || (uint64_t)picks[i] != rows[count - 1]) rows[count++] = (uint64_t)picks[i];
    return count;
}

/* A matmul's result at a few token rows against the reference's matmul of
 * those rows alone (ref_run_op, as emit_harness.c's run_reference calls it:
 * the weight dequantized as quant_value defines, or its codes for W8A8),
 * allowed what compare_result allows: f32 storage the family's relative
 * tolerance with a floor of a tenth of the checked rows' largest magnitude,
 * bf16 1e-2 of that largest. A few rows, so that at Llama's shapes the
 * reference's double sums take a second, not minutes. */
static double check_gemm(emit_case *c, uint32_t op, int64_t tokens, const void *result, double tolerance) {
    const ir_op *o = &c->m.ops[op];
    ir_value_id x = o->operands[0], y = o->results[0];
    uint64_t rows[4], row_count = checked_rows(tokens, rows);
    ref_tensor operands[IR_MAX_OPERANDS];
    const ref_tensor *in[IR_MAX_OPERANDS];
    for (uint32_t i = 0; i < o->operand_count; i++) {
        operands[i] = tensor_of(c, o->operands[i], tokens);
        in[i] = &operands[i];
    }
    /* x: the checked rows alone */
    uint64_t k = operands[0].dims[1], n = c->m.values[y].type.dims[1].size;
    float *x_rows = malloc(row_count * k * sizeof *x_rows);
    assert_non_null(x_rows);
    for (uint64_t r = 0; r < row_count; r++)
        memcpy(x_rows + r * k, c->values[x].f + rows[r] * k, k * sizeof *x_rows);
    operands[0].dims[0] = row_count;
    operands[0].count = row_count * k;
    operands[0].f = x_rows;
    ref_tensor want = {.rank = 2, .dims = {row_count, n}, .count = row_count * n, .elem = REF_F32};
    want.f = calloc(want.count, sizeof *want.f);
    assert_non_null(want.f);
    ref_attrs attrs = read_attrs(c, op);
    quant_tensor codes = {0};
    if (ir_weight_quant(&c->m, c->m.values[o->operands[1]].def_op, &codes.format)) {
        assert_null(quant_layout_of(&codes.format, n, k, &codes.layout));
        codes.data = c->values[o->operands[1]].buffer;
    }
    ref_call call = {.in = in,
                     .in_count = o->operand_count,
                     .out = &want,
                     .out_count = 1,
                     .attrs = &attrs,
                     .weight_codes = codes.data ? &codes : NULL,
                     .loc = o->loc,
                     .d = &c->d};
    if (!ref_run_op(IR_OP_MATMUL, &call)) fail_msg("the reference failed:\n%s", case_log(c));
    smelt_dtype storage = cg_storage_dtype(&c->m, y);
    double largest = 0.0, worst = 0.0;
    for (uint64_t i = 0; i < want.count; i++)
        largest = fmax(largest, fabs(want.f[i]));
    if (largest == 0.0) largest = 1.0;
    double floor = is_half(storage) ? largest : 0.1 * largest;
    double relative = storage == SMELT_DTYPE_BF16  ? BF16_TOLERANCE
                      : storage == SMELT_DTYPE_F16 ? F16_TOLERANCE
                                                   : tolerance;
    for (uint64_t r = 0; r < row_count; r++)
        for (uint64_t j = 0; j < n; j++) {
            double expected = want.f[r * n + j], got = result_at(storage, result, rows[r] * n + j);
            double ratio = fabs(got - expected) / (relative * fmax(fabs(expected), floor));
            if (!(ratio <= worst)) {
                if (!(ratio <= 1.0) && worst <= 1.0)
                    printf("\n  check: row %llu column %llu: expected %.9g, found %.9g\n",
                           (unsigned long long)rows[r], (unsigned long long)j, expected, got);
                worst = isnan(ratio) ? INFINITY : ratio;
            }
        }
    free(x_rows);
    free(want.f);
    return worst;
}

/* CUDA's cosf and sinf are within 2 ulps of the true value (CUDA C++
 * Programming Guide, the single-precision functions' table); an ulp of a
 * value in [-1, 1] is at most 2^-24: the table may differ from the host's by
 * 2 ulps from each side, 2^-22. The host simulator's are the C library's. */
#define LAB_TRIG_TOLERANCE 0x1p-22

/* A rope table [T, r/2, 2] against cosf and sinf of (float)pos * inv_freq[i]
 * computed here, inv_freq[i] = 1 / theta^(2i / r) in float32 as Hugging
 * Face computes it: what the kernel must store for the default scaling. */
static double check_rope_table(emit_case *c, uint32_t op, int64_t tokens, const void *result,
                               double tolerance) {
    (void)tolerance; /* its own bound: LAB_TRIG_TOLERANCE */
    float theta = (float)ir_op_float(&c->m, op, "theta");
    int64_t rotary = ir_op_int(&c->m, op, "rotary_dim"), half = rotary / 2;
    const int32_t *positions = c->values[c->pos].i;
    const float *table = result;
    double worst = 0.0;
    for (int64_t t = 0; t < tokens; t++)
        for (int64_t i = 0; i < half; i++) {
            float inverse_frequency = 1.0f / powf(theta, (float)(2 * i) / (float)rotary);
            float angle = (float)positions[t] * inverse_frequency;
            float want[2] = {cosf(angle), sinf(angle)};
            for (int part = 0; part < 2; part++) {
                float got = table[(t * half + i) * 2 + part];
                double ratio = fabs((double)got - (double)want[part]) / LAB_TRIG_TOLERANCE;
                if (!(ratio <= worst)) {
                    if (!(ratio <= 1.0) && worst <= 1.0)
                        printf("\n  check: position %d pair %lld %s: expected %.9g, found %.9g\n",
                               positions[t], (long long)i, part ? "sin" : "cos", want[part], got);
                    worst = isnan(ratio) ? INFINITY : ratio;
                }
            }
        }
    return worst;
}

/* ---- the table ---------------------------------------------------------------------------- */

/* The prefill GEMMs of Llama-3-8B (T = 512): q/o (N = K = 4096), gate/up
 * (N 14336, K 4096), down (N 4096, K 14336); on the host, a step of 70
 * tokens (two M tiles, the second partial) over two k-blocks, and the
 * smallest step the GEMM serves (5 tokens) over three, N past its tiles. */
#define LAB_PREFILL_GEMMS                                                                                    \
    {{96, 256, 0, 70, false},                                                                                \
     {130, 384, 0, 5, false},                                                                                \
     {4096, 4096, 0, 512, true},                                                                             \
     {14336, 4096, 0, 512, true},                                                                            \
     {4096, 14336, 0, 512, true}},                                                                           \
        5

/* A family of the quantized matmul at the prefill GEMMs' shapes with preset
 * {preset, group_size, act_quant} (lab_quant), checked by check_gemm (on
 * the GPU at q/o's shape). */
#define LAB_GEMM(name, preset, group_size, act_quant)                                                        \
    {                                                                                                        \
        name, build_gemm, F32_TOLERANCE, LAB_PREFILL_GEMMS, {preset, group_size, act_quant}, check_gemm,     \
            LAB_REPORT_WEIGHTS, 1                                                                            \
    }

static const lab_family families[] = {
    {"elementwise",
     build_elementwise,
     F32_TOLERANCE,
     {{64, 0, 0, 3, false}, {1000, 0, 0, 5, false}, {4096, 0, 0, 1, true}, {4096, 0, 0, 64, true}},
     4,
     .report = LAB_REPORT_TOTAL},
    {"norm",
     build_norm,
     F32_TOLERANCE,
     {{64, 0, 0, 3, false}, {4096, 0, 0, 2, false}, {4096, 0, 0, 1, true}, {4096, 0, 0, 64, true}},
     4,
     .report = LAB_REPORT_TOTAL},
    {"rope",
     build_rope,
     F32_TOLERANCE,
     {{2, 16, 0, 4, false}, {32, 128, 0, 1, true}, {32, 128, 0, 64, true}},
     3,
     .report = LAB_REPORT_TOTAL},
    {"softmax",
     build_softmax,
     F32_TOLERANCE,
     {{50, 0, 0, 3, false}, {32000, 0, 0, 1, true}},
     2,
     .report = LAB_REPORT_TOTAL},
    {"embedding",
     build_embedding,
     F32_TOLERANCE,
     {{37, 24, 0, 5, false}, {128256, 4096, 0, 1, true}, {128256, 4096, 0, 64, true}},
     3,
     .report = LAB_REPORT_TOTAL},
    {"attention",
     build_attention,
     F32_SEQUENCE_TOLERANCE,
     {{4, 2, 16, 5, false}, {8, 2, 64, 17, false}, {32, 8, 128, 1, true}, {32, 8, 128, 64, true}},
     4,
     .report = LAB_REPORT_TOTAL},
    {"moe",
     build_moe,
     F32_SEQUENCE_TOLERANCE,
     {{4, 32, 48, 5, false}, {8, 64, 96, 40, false}, {8, 4096, 14336, 1, true}, {8, 4096, 14336, 64, true}},
     4,
     .report = LAB_REPORT_TOTAL},
    {"argmax",
     build_argmax,
     F32_TOLERANCE,
     {{700, 0, 0, 3, false}, {128256, 0, 0, 1, true}},
     2,
     .report = LAB_REPORT_TOTAL},
    {"rope_table",
     build_rope_table,
     F32_TOLERANCE,
     {{64, 0, 0, 5, false}, {128, 0, 8000, 17, false}, {128, 0, 0, 512, true}, {128, 0, 7680, 512, true}},
     4,
     .check = check_rope_table,
     .report = LAB_REPORT_WRITTEN,
     .gpu_checks = 2},
    /* the tensor-core dequantize-GEMM: int4 interleaved (mma_k16) in groups of 128, int8 and E4M3
     * weight-only (a scale per output row, row-major codes) */
    LAB_GEMM("gemm_int4", "int4-rtn", 128, NULL),
    LAB_GEMM("gemm_int8", "int8", 0, "none"),
    LAB_GEMM("gemm_fp8", "fp8", 0, "none"),
};
enum { FAMILY_COUNT = sizeof families / sizeof families[0] };

static bool lab_quick, lab_gpu;
static const char *lab_only;

/* The case of family f at shape s: `precision` is the storage preset ("f32",
 * "bf16"), or for a quantized family the activations of its preset. */
static emit_case *lab_case(const lab_family *f, const lab_shape *s, const char *precision, uint32_t *op) {
    emit_case *c = case_new(f->quant.preset ? f->quant.preset : precision);
    if (f->quant.preset) {
        c->activations = precision;
        c->group_size = f->quant.group_size;
        c->act_quant = f->quant.act_quant;
    }
    *op = f->build(c, s);
    case_infer(c);
    set_positions(c, s->tokens, f->build == build_rope_table ? s->c : 0);
    if (f->build == build_embedding) set_ids(c, s->tokens, s->a);
    return c;
}

/* The names of op's kernels that run in a step of `tokens` tokens (as the
 * executor picks them: kernel_serves), comma-separated into `names`. */
static void lab_kernels_serving(emit_case *c, uint32_t op, int64_t tokens, char *names, size_t size) {
    arena strings;
    arena_init(&strings);
    cg_group_lowering l;
    if (!case_emit(c, op, &strings, &l)) fail_msg("emit failed:\n%s", case_log(c));
    size_t used = 0;
    names[0] = '\0';
    for (uint32_t k = 0; k < l.kernel_count && used < size; k++)
        if (kernel_serves(&l.kernels[k], tokens))
            used += (size_t)snprintf(names + used, size - used, "%s%s", used ? ", " : "", l.kernels[k].name);
    arena_free(&strings);
}

/* The host half of one family. */
static void lab_host(void **state) {
    const lab_family *f = *state;
    static const char *const precisions[2] = {"f32", "bf16"};
    for (int i = 0; i < f->shape_count; i++) {
        const lab_shape *s = &f->shapes[i];
        if (s->gpu_only || (lab_quick && i > 0)) continue;
        for (int p = 0; p < 2; p++) {
            uint32_t op;
            emit_case *c = lab_case(f, s, precisions[p], &op);
            case_run(c, op, s->tokens, f->tolerance);
            printf("  host %-12s %-5s shape (%lld, %lld, %lld) T=%lld: within %.0f%% of the tolerance",
                   f->name, precisions[p], (long long)s->a, (long long)s->b, (long long)s->c,
                   (long long)s->tokens, c->worst_error * 100.0);
            if (f->check) {
                double worst = f->check(c, op, s->tokens, c->values[case_result(c, op)].buffer, f->tolerance);
                if (!(worst <= 1.0)) fail_msg("%s: the check failed (%.3g of its tolerance)", f->name, worst);
                printf("; checked: within %.0f%%", worst * 100.0);
            }
            if (f->report == LAB_REPORT_WEIGHTS) {
                char names[512];
                lab_kernels_serving(c, op, s->tokens, names, sizeof names);
                printf(" [%s]", names);
            }
            printf("\n");
            case_free(c);
        }
    }
}

#include "kernel_lab_gpu.c"

int main(int argc, char **argv) {
    for (int i = 1; i < argc; i++) {
        if (strcmp(argv[i], "--quick") == 0)
            lab_quick = true;
        else if (strcmp(argv[i], "--gpu") == 0)
            lab_gpu = true;
        else if (strcmp(argv[i], "--family") == 0 && i + 1 < argc)
            lab_only = argv[++i];
        else {
            fprintf(stderr, "usage: bench_kernel_lab [--quick] [--gpu] [--family NAME]\n");
            return 2;
        }
    }
    struct CMUnitTest tests[FAMILY_COUNT + 1];
    size_t count = 0;
    for (size_t i = 0; i < FAMILY_COUNT; i++) {
        if (lab_only && strcmp(lab_only, families[i].name) != 0) continue;
        tests[count++] = (struct CMUnitTest){families[i].name, lab_host, NULL, NULL, (void *)&families[i]};
    }
    if (lab_gpu) tests[count++] = (struct CMUnitTest){"gpu", lab_gpu_run, NULL, NULL, NULL};
    if (count == 0) {
        fprintf(stderr, "bench_kernel_lab: no family '%s'\n", lab_only ? lab_only : "");
        return 2;
    }
    return _cmocka_run_group_tests("kernel_lab", tests, count, harness_setup, harness_teardown);
}
