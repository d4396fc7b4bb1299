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
 * --quick runs the first shape of each sweep alone (ctest runs that).
 *
 * GPU half (--gpu; skipped with a note where no CUDA driver opens): first the
 * peaks it compares against, measured here: device-to-device copy bandwidth
 * (cuMemcpyDtoDAsync, read + write bytes) and the bf16 tensor-core rate (a
 * loop of mma.sync m16n8k16 with f32 accumulation on every SM, "gemm_mma"),
 * the cost of an empty launch and of a graph node; then each family's
 * kernels at the GPU shapes of its sweep, timed with CUDA events over
 * repeated launches, printing achieved GB/s and TFLOP/s (from the
 * emitter's modeled cost, cg_kernel.cost) and their fraction of the
 * measured peaks. Data on the device is random floats and small integers
 * (ids, positions, < 16), state zeroed: right for timing, not for values.
 *
 * Adding a kernel family: one entry in `families` with a function that
 * declares the op in an emit_case at shape index s (and returns its op).
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

typedef struct lab_family {
    const char *name;
    lab_build build;
    double tolerance;
    lab_shape shapes[6];
    int shape_count;
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

/* Positions for rope and attention: 0..T-1 (a prefill from the start). */
static void set_positions(emit_case *c, int64_t tokens) {
    int32_t positions[TOKEN_BOUND];
    for (int64_t i = 0; i < tokens; i++)
        positions[i] = (int32_t)i;
    case_set_ints_data(c, c->pos, tokens, positions, (uint64_t)tokens);
}

static void set_ids(emit_case *c, int64_t tokens, int64_t vocab) {
    int32_t ids[TOKEN_BOUND];
    for (int64_t i = 0; i < tokens; i++)
        ids[i] = (int32_t)((i * 7919) % vocab);
    case_set_ints_data(c, c->ids, tokens, ids, (uint64_t)tokens);
}

static const lab_family families[] = {
    {"elementwise",
     build_elementwise,
     F32_TOLERANCE,
     {{64, 0, 0, 3, false}, {1000, 0, 0, 5, false}, {4096, 0, 0, 1, true}, {4096, 0, 0, 64, true}},
     4},
    {"norm",
     build_norm,
     F32_TOLERANCE,
     {{64, 0, 0, 3, false}, {4096, 0, 0, 2, false}, {4096, 0, 0, 1, true}, {4096, 0, 0, 64, true}},
     4},
    {"rope",
     build_rope,
     F32_TOLERANCE,
     {{2, 16, 0, 4, false}, {32, 128, 0, 1, true}, {32, 128, 0, 64, true}},
     3},
    {"softmax", build_softmax, F32_TOLERANCE, {{50, 0, 0, 3, false}, {32000, 0, 0, 1, true}}, 2},
    {"embedding",
     build_embedding,
     F32_TOLERANCE,
     {{37, 24, 0, 5, false}, {128256, 4096, 0, 1, true}, {128256, 4096, 0, 64, true}},
     3},
    {"attention",
     build_attention,
     F32_SEQUENCE_TOLERANCE,
     {{4, 2, 16, 5, false}, {8, 2, 64, 17, false}, {32, 8, 128, 1, true}, {32, 8, 128, 64, true}},
     4},
    {"moe",
     build_moe,
     F32_SEQUENCE_TOLERANCE,
     {{4, 32, 48, 5, false}, {8, 64, 96, 40, false}, {8, 4096, 14336, 1, true}, {8, 4096, 14336, 64, true}},
     4},
    {"argmax", build_argmax, F32_TOLERANCE, {{700, 0, 0, 3, false}, {128256, 0, 0, 1, true}}, 2},
};
enum { FAMILY_COUNT = sizeof families / sizeof families[0] };

static bool lab_quick, lab_gpu;
static const char *lab_only;

static emit_case *lab_case(const lab_family *f, const lab_shape *s, const char *precision, uint32_t *op) {
    emit_case *c = case_new(precision);
    *op = f->build(c, s);
    case_infer(c);
    set_positions(c, s->tokens);
    if (f->build == build_embedding) set_ids(c, s->tokens, s->a);
    return c;
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
            printf("  host %-12s %-5s shape (%lld, %lld, %lld) T=%lld: within %.0f%% of the tolerance\n",
                   f->name, precisions[p], (long long)s->a, (long long)s->b, (long long)s->c,
                   (long long)s->tokens, c->worst_error * 100.0);
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
