/* test_plan_hostile.c - a real plan (tests/fixtures/llama compiled here for
 * the host) edited field by field in its PROGRAM section, with every
 * checksum and the content hash recomputed (plan_edit.h), as someone who
 * wants the runtime to write out of bounds would edit it: each edit is
 * refused when the plan is opened, with a message naming the instruction,
 * the kernel and the argument. And a pinned content hash: the right one is
 * accepted, any other refused before the plan's code is loaded. */
#include <setjmp.h>
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>

#include <cmocka.h>

#include "driver.h"
#include "plan_edit.h"
#include "plan_read.h"
#include "program.h"
#include "smelt.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define FIXTURE SMELT_SOURCE_DIR "/tests/fixtures/llama"
#define MODEL SMELT_SOURCE_DIR "/examples/llama.smelt"

static uint8_t *plan_bytes; /* the compiled plan */
static size_t plan_size;

static int setup(void **state) {
    (void)state;
    const char *folder = getenv("TMPDIR");
    char path[256];
    snprintf(path, sizeof path, "%s/smelt-test-hostile-XXXXXX", folder && *folder ? folder : "/tmp");
    int fd = mkstemp(path);
    if (fd < 0) return -1;
    close(fd);
    diag_engine d;
    diag_init(&d, stderr);
    drv_source_options source = {.config_path = FIXTURE "/config.json"};
    drv_compile_options o = {
        .precision = DRV_PRECISION_F32, .host = true, .weights_path = FIXTURE "/model.safetensors"};
    drv_compile_report report;
    bool ok = drv_compile(MODEL, &source, &o, path, &report, &d);
    diag_free(&d);
    FILE *f = ok ? fopen(path, "rb") : NULL;
    if (f) {
        fseek(f, 0, SEEK_END);
        plan_size = (size_t)ftell(f);
        fseek(f, 0, SEEK_SET);
        plan_bytes = malloc(plan_size);
        ok = plan_bytes && fread(plan_bytes, 1, plan_size, f) == plan_size;
        fclose(f);
    }
    unlink(path);
    return ok ? 0 : -1;
}

static int teardown(void **state) {
    (void)state;
    free(plan_bytes);
    return 0;
}

/* The plan's program, decoded. */
static void decode_program(const uint8_t *bytes, program *p) {
    uint8_t *entry = plan_edit_entry((uint8_t *)bytes, PLAN_SECTION_PROGRAM);
    assert_non_null(entry);
    char error[512];
    if (!program_decode(bytes + plan_get_u64(entry + PLAN_ENTRY_AT_OFFSET),
                        plan_get_u64(entry + PLAN_ENTRY_AT_SIZE), p, error, sizeof error))
        fail_msg("the compiled plan's program: %s", error);
}

typedef void (*program_edit)(program *p);

/* Opens a copy of the plan whose program `edit` changed (in place: the
 * encoding keeps its size), resealed; returns the status and copies the
 * message. */
static smelt_status open_edited(program_edit edit, char *message, size_t message_size) {
    uint8_t *bytes = malloc(plan_size);
    assert_non_null(bytes);
    memcpy(bytes, plan_bytes, plan_size);
    program p;
    decode_program(bytes, &p);
    edit(&p);
    uint8_t *encoded;
    size_t encoded_size;
    assert_true(program_encode(&p, &encoded, &encoded_size));
    program_free(&p);
    uint8_t *entry = plan_edit_entry(bytes, PLAN_SECTION_PROGRAM);
    assert_int_equal(encoded_size, plan_get_u64(entry + PLAN_ENTRY_AT_SIZE));
    memcpy(bytes + plan_get_u64(entry + PLAN_ENTRY_AT_OFFSET), encoded, encoded_size);
    free(encoded);
    plan_edit_reseal(bytes);
    smelt_plan *plan = NULL;
    smelt_status s = smelt_plan_open_memory(bytes, plan_size, &plan);
    snprintf(message, message_size, "%s", s == SMELT_OK ? "" : smelt_last_error());
    smelt_plan_close(plan);
    free(bytes);
    return s;
}

static void expect_refused(program_edit edit, const char *expected) {
    char message[1024];
    smelt_status s = open_edited(edit, message, sizeof message);
    if (s == SMELT_OK) fail_msg("an edited plan was accepted (expected: %s)", expected);
    assert_int_equal(s, SMELT_ERROR_BAD_PLAN);
    if (!strstr(message, expected)) fail_msg("expected '%s' in: %s", expected, message);
}

/* ---- where to edit ------------------------------------------------------------ */

/* The first launch and its first argument of `buffer` that writes (or not). */
static prog_arg *find_arg(program *p, int buffer, bool writes, uint32_t *instr) {
    for (uint32_t i = 0; i < p->instr_count; i++) {
        if (p->instrs[i].op != PROG_OP_LAUNCH) continue;
        prog_launch *l = &p->instrs[i].as.launch;
        for (uint32_t a = 0; a < l->arg_count; a++)
            if (l->args[a].kind == PROG_ARG_POINTER && l->args[a].ref.buffer == buffer &&
                l->args[a].writes == writes) {
                if (instr) *instr = i;
                return &l->args[a];
            }
    }
    fail_msg("no launch argument of buffer %d (writes %d)", buffer, writes);
    return NULL;
}

static prog_launch *first_launch(program *p) {
    for (uint32_t i = 0; i < p->instr_count; i++)
        if (p->instrs[i].op == PROG_OP_LAUNCH) return &p->instrs[i].as.launch;
    fail_msg("no launch");
    return NULL;
}

/* ---- the edits ---------------------------------------------------------------- */

static void shrink_arena(program *p) { p->arena_bytes /= 2; }
static void pointer_at_arena_end(program *p) {
    find_arg(p, PROG_BUFFER_ARENA, true, NULL)->ref.offset = p->arena_bytes - 4;
}
static void grid_of_a_million(program *p) { first_launch(p)->rule.grid[0] = (prog_affine){0, 1000000, 1}; }
static void block_doubled(program *p) { first_launch(p)->rule.block[0] *= 2; }
static void kv_state_of_64_bytes(program *p) {
    for (uint32_t i = 0; i < p->state_count; i++)
        if (p->state_rows[i]) {
            p->state_bytes[i] = 64;
            p->state_rows[i] = 1;
            p->max_positions = 1;
        }
}
static void output_into_weights(program *p) {
    prog_arg *out = find_arg(p, PROG_BUFFER_ARENA, true, NULL);
    out->ref = (prog_ref){PROG_BUFFER_WEIGHT, 0, 0};
}
static void weight_shape_grown(program *p) { p->weights[1].shape[0] += 1; }
static void weight_shape_and_bytes_shrunk(program *p) {
    prog_weight *w = &p->weights[p->id_table == 1 ? 2 : 1];
    w->bytes = w->bytes / (uint64_t)w->shape[0] * (uint64_t)(w->shape[0] / 2);
    w->shape[0] /= 2;
}
static void weight_offset_past_data(program *p) { p->weights[1].data_offset += 1u << 30; }
static void vocab_grown(program *p) { p->vocab += 1; }
static void vocab_shrunk(program *p) { p->vocab -= 1; }
static void id_bound_grown(program *p) { p->id_bound += 1; }
static void positions_grown(program *p) { p->max_positions += 1; }
static void kernel_index_changed(program *p) { first_launch(p)->kernel = 1; }

/* The first launch with pointers into two different buffers: swap them. */
static void swap_arguments(program *p) {
    for (uint32_t i = 0; i < p->instr_count; i++) {
        if (p->instrs[i].op != PROG_OP_LAUNCH) continue;
        prog_launch *l = &p->instrs[i].as.launch;
        for (uint32_t a = 0; a + 1 < l->arg_count; a++)
            if (l->args[a].kind == PROG_ARG_POINTER && l->args[a + 1].kind == PROG_ARG_POINTER &&
                l->args[a].ref.buffer != l->args[a + 1].ref.buffer) {
                prog_ref r = l->args[a].ref;
                l->args[a].ref = l->args[a + 1].ref;
                l->args[a + 1].ref = r;
                return;
            }
    }
    fail_msg("no launch to swap arguments of");
}

/* The whole argument (ref, extent, access) moved: the kernel's extents are
 * the same for every launch of it, so a launch unlike the others is refused. */
/* The program lying about what its kernels touch: every extent into the
 * arena made 4 bytes, which any pointer fits (as it would for a program
 * rewritten together with a smaller arena); the kernels' code still touches
 * what it did, and the kernel table, beside that code, says so. */
static void extents_rewritten_with_the_arena(program *p) {
    for (uint32_t i = 0; i < p->instr_count; i++) {
        /* (a wanted-rows launch's moved pointers would be refused sooner) */
        if (p->instrs[i].op != PROG_OP_LAUNCH || p->instrs[i].wanted_rows) continue;
        prog_launch *l = &p->instrs[i].as.launch;
        for (uint32_t a = 0; a < l->arg_count; a++)
            if (l->args[a].kind == PROG_ARG_POINTER && l->args[a].ref.buffer == PROG_BUFFER_ARENA)
                l->args[a].extent = (prog_affine){0, 4, 1};
    }
}

static void swap_whole_arguments(program *p) {
    for (uint32_t i = 0; i < p->instr_count; i++) {
        if (p->instrs[i].op != PROG_OP_LAUNCH) continue;
        prog_launch *l = &p->instrs[i].as.launch;
        if (l->arg_count < 2 || l->args[0].kind != PROG_ARG_POINTER || l->args[1].kind != PROG_ARG_POINTER ||
            l->args[0].writes != l->args[1].writes)
            continue;
        /* only a kernel launched more than once */
        uint32_t launches = 0;
        for (uint32_t j = 0; j < p->instr_count; j++)
            launches += p->instrs[j].op == PROG_OP_LAUNCH && p->instrs[j].as.launch.kernel == l->kernel;
        if (launches < 2 ||
            (l->args[0].extent.a == l->args[1].extent.a && l->args[0].extent.b == l->args[1].extent.b))
            continue;
        prog_arg x = l->args[0];
        l->args[0] = l->args[1];
        l->args[1] = x;
        return;
    }
    fail_msg("no launch to swap whole arguments of");
}

/* Costs: coefficients that are negative, NaN or past the limit. */
static void read_cost_negative(program *p) { p->instrs[0].cost.read.constant = -1.0; }
static void flops_not_a_number(program *p) { p->instrs[2].cost.flops.per_token = NAN; }
static void written_cost_huge(program *p) { p->instrs[1].cost.written.per_token_context = 1e300; }

static void no_edit(program *p) { (void)p; }

/* The compiled plan, and the plan resealed without an edit, open. */
static void test_the_compiled_plan_opens(void **state) {
    (void)state;
    smelt_plan *plan = NULL;
    assert_int_equal(smelt_plan_open_memory(plan_bytes, plan_size, &plan), SMELT_OK);
    smelt_plan_close(plan);
    char message[1024];
    if (open_edited(no_edit, message, sizeof message) != SMELT_OK) fail_msg("%s", message);
}

static void test_edited_buffers_are_refused(void **state) {
    (void)state;
    expect_refused(shrink_arena, "but that buffer has");
    expect_refused(pointer_at_arena_end, "(kernel ");
    expect_refused(pointer_at_arena_end, "but that buffer has");
    expect_refused(kv_state_of_64_bytes, "but that buffer has 64 bytes");
    expect_refused(output_into_weights, "the kernel writes weight 0");
    expect_refused(swap_arguments, "needs");
}

static void test_edited_launches_are_refused(void **state) {
    (void)state;
    expect_refused(grid_of_a_million,
                   "with a grid, block or shared memory that is not the kernel table's launch rule");
    expect_refused(block_doubled, "is not the kernel table's launch rule");
    expect_refused(kernel_index_changed, "kernel 1");
    expect_refused(swap_whole_arguments, "is not what the kernel table declares for it");
    expect_refused(extents_rewritten_with_the_arena, "is not what the kernel table declares for it");
}

static void test_edited_weights_and_bounds_are_refused(void **state) {
    (void)state;
    expect_refused(weight_shape_grown, "but its shape and dtype make");
    expect_refused(weight_shape_and_bytes_shrunk, "bytes at weight ");
    expect_refused(weight_offset_past_data, "lies outside the");
    expect_refused(vocab_grown, "rows of vocab (98) floats");
    expect_refused(vocab_shrunk, "rows of vocab (96) floats");
    expect_refused(id_bound_grown, "id_bound 98 disagrees with the 97 rows of the embedding table");
    expect_refused(positions_grown, "max_positions 129 disagrees with state");
}

/* The cost of an instruction is data the decoder checks like the rest: a
 * negative, NaN or overflowing coefficient, or a tensor-core flag that is
 * not 0 or 1 (the last byte of the section: the last instruction's), is
 * refused. */
static void test_edited_costs_are_refused(void **state) {
    (void)state;
    expect_refused(read_cost_negative,
                   "instruction 0: the constant term of its modeled bytes read is -1 (expected 0 .. 1e+18)");
    expect_refused(flops_not_a_number, "instruction 2: the per-token term of its modeled flops is nan");
    expect_refused(written_cost_huge,
                   "instruction 1: the per-token-context term of its modeled bytes written");
    uint8_t *bytes = malloc(plan_size);
    assert_non_null(bytes);
    memcpy(bytes, plan_bytes, plan_size);
    uint8_t *entry = plan_edit_entry(bytes, PLAN_SECTION_PROGRAM);
    uint64_t end = plan_get_u64(entry + PLAN_ENTRY_AT_OFFSET) + plan_get_u64(entry + PLAN_ENTRY_AT_SIZE);
    /* The last instruction's tensor-core flag: its last byte, before the
     * choices (u32 count; each 2 i64 and 2 x (max - min + 1) x {f64, f64,
     * u32, u8}: program.c) */
    program p;
    decode_program(plan_bytes, &p);
    assert_true(p.choice_count > 0);
    uint64_t choices = 4;
    for (uint32_t c = 0; c < p.choice_count; c++)
        choices += 16 + 2 * (uint64_t)(p.choices[c].max_tokens - p.choices[c].min_tokens + 1) * 21;
    program_free(&p);
    bytes[end - choices - 1] = 2;
    plan_edit_reseal(bytes);
    smelt_plan *plan = NULL;
    assert_int_equal(smelt_plan_open_memory(bytes, plan_size, &plan), SMELT_ERROR_BAD_PLAN);
    if (!strstr(smelt_last_error(), "its cost's tensor-core flag is 2")) fail_msg("%s", smelt_last_error());
    /* and the last choice's */
    memcpy(bytes, plan_bytes, plan_size);
    bytes[end - 1] = 2;
    plan_edit_reseal(bytes);
    assert_int_equal(smelt_plan_open_memory(bytes, plan_size, &plan), SMELT_ERROR_BAD_PLAN);
    if (!strstr(smelt_last_error(), "a tensor-core flag of 2")) fail_msg("%s", smelt_last_error());
    free(bytes);
}

/* What the compiled fixture (f32; hidden 64, 4 query heads and 2 KV heads
 * of 16 dims, 128 positions, vocab 97) carries, worked out by hand: */
static void test_the_compiled_plan_carries_costs(void **state) {
    (void)state;
    program p;
    decode_program(plan_bytes, &p);
    /* 0: the step's rope table reads the T positions and writes the (cos, sin) of 8 pairs per token */
    assert_true(p.instrs[0].op == PROG_OP_LAUNCH);
    assert_true(prog_poly_eval(p.instrs[0].cost.read, 8, 100) == 8 * 4);
    assert_true(prog_poly_eval(p.instrs[0].cost.written, 8, 100) == 8 * 8 * 2 * 4);
    /* 1: the embedding gathers T rows of 64 f32 (+ the 4-byte id), not its 97 x 64 table */
    assert_true(p.instrs[1].op == PROG_OP_LAUNCH);
    assert_true(prog_poly_eval(p.instrs[1].cost.read, 1, 0) == 64 * 4 + 4);
    assert_true(prog_poly_eval(p.instrs[1].cost.read, 8, 100) == 8 * (64 * 4 + 4));
    assert_true(prog_poly_eval(p.instrs[1].cost.written, 8, 100) == 8 * 64 * 4);
    /* q/k/v on the unfused path (steps of more than 4 tokens), one GEMM [T, 64] x [128, 64]^T over
     * the weights concatenated at compile time: A and B read, C written, 2 M N K flops, f32 on
     * CUDA cores; o_proj's GEMM [T, 64] x [64, 64]^T reads the residual [T, 64] as well. */
    const prog_instr *qkv = NULL, *o = NULL;
    for (uint32_t i = 0; i < p.instr_count; i++) {
        const prog_instr *in = &p.instrs[i];
        if (in->op != PROG_OP_GEMM || in->as.gemm.k != 64) continue;
        if (!qkv && in->as.gemm.n == 128) qkv = in;
        if (!o && in->as.gemm.n == 64 && in->as.gemm.has_residual) o = in;
    }
    assert_non_null(qkv);
    assert_true(prog_poly_eval(qkv->cost.read, 8, 0) == (8 * 64 + 128 * 64) * 4);
    assert_true(prog_poly_eval(qkv->cost.written, 8, 0) == 8 * 128 * 4);
    assert_true(prog_poly_eval(qkv->cost.flops, 8, 0) == 2.0 * 8 * 128 * 64);
    assert_false(qkv->cost.tensor_cores);
    assert_non_null(o);
    assert_true(prog_poly_eval(o->cost.read, 8, 0) == (8 * 64 + 64 * 64 + 8 * 64) * 4);
    assert_true(prog_poly_eval(o->cost.written, 8, 0) == 8 * 64 * 4);
    assert_true(prog_poly_eval(o->cost.flops, 8, 0) == 2.0 * 8 * 64 * 64);
    /* The q/k/v GEMM's epilogue launch (derived; it runs in steps of more than 4 tokens, the
     * fused QKV GEMV writes the caches in smaller ones, so there is no kv_write): the GEMM's
     * 128 f32 columns, the 4-byte pos and the rope table's 8 (cos, sin) pairs read per token; q, k and v (64
     * + 32 + 32 floats) and the caches' new rows (128 + 128 bytes) and written flag (4) written. Causal
     * attention over T C + T (T + 1) / 2 positions, 2 (16 + 16) flops per head and position, each of 4 query
     * heads reading its 16-float q row and pos and writing its output row:
     *  - the split-KV decode kernel after it reads each of the C + T cached rows once per kv
     *    head (2 x 128 bytes) and its written flag once;
     *  - the scalar kernel after that (f32 prefill) reads a key and a value row and the flag for
     *    every query head and position attended. */
    for (uint32_t i = 0; i + 2 < p.instr_count; i++) {
        const prog_instr *kv = &p.instrs[i], *decode = &p.instrs[i + 1], *attend = &p.instrs[i + 2];
        bool writes_state = false;
        for (uint32_t a = 0; kv->op == PROG_OP_LAUNCH && a < kv->as.launch.arg_count; a++)
            writes_state |=
                kv->as.launch.args[a].ref.buffer == PROG_BUFFER_STATE && kv->as.launch.args[a].writes;
        if (!writes_state || kv->min_tokens == 0) continue;
        assert_int_equal(kv->min_tokens, 5);
        assert_true(prog_poly_eval(kv->cost.read, 3, 50) == 3 * (128 * 4 + 4 + 8 * 2 * 4));
        assert_true(prog_poly_eval(kv->cost.written, 3, 50) == 3 * ((64 + 32 + 32) * 4 + 128 + 128 + 4));
        double positions = 3 * 50 + 3 * 4 / 2;
        assert_true(prog_poly_eval(decode->cost.read, 3, 50) ==
                    4 * 3 * (16 * 4 + 4) + (50 + 3) * (2 * 128 + 4));
        assert_true(prog_poly_eval(decode->cost.written, 3, 50) == 4 * 3 * 16 * 4);
        assert_true(prog_poly_eval(decode->cost.flops, 3, 50) == 4 * positions * 2 * (16 + 16));
        assert_true(prog_poly_eval(attend->cost.read, 3, 50) ==
                    4 * (3 * (16 * 4 + 4) + positions * (2 * 16 * 4 + 4)));
        assert_true(prog_poly_eval(attend->cost.written, 3, 50) == 4 * 3 * 16 * 4);
        assert_true(prog_poly_eval(attend->cost.flops, 3, 50) == 4 * positions * 2 * (16 + 16));
        program_free(&p);
        return;
    }
    fail_msg("no launch writing the KV cache in steps of more than 4 tokens in the compiled fixture");
}

/* ---- a pinned hash ------------------------------------------------------------ */

static smelt_status create_with_hash(const char *hash) {
    smelt_plan *plan = NULL;
    assert_int_equal(smelt_plan_open_memory(plan_bytes, plan_size, &plan), SMELT_OK);
    smelt_engine_options o = smelt_engine_options_default();
    o.device = "host";
    o.host_threads = 1;
    o.expected_content_hash = hash;
    smelt_engine *engine = NULL;
    smelt_status s = smelt_engine_create(plan, &o, &engine);
    smelt_engine_destroy(engine);
    smelt_plan_close(plan);
    return s;
}

static void test_expected_hash(void **state) {
    (void)state;
    smelt_plan *plan = NULL;
    assert_int_equal(smelt_plan_open_memory(plan_bytes, plan_size, &plan), SMELT_OK);
    smelt_plan_info info;
    assert_int_equal(smelt_plan_get_info(plan, &info), SMELT_OK);
    smelt_plan_close(plan);
    assert_int_equal(create_with_hash(info.content_hash), SMELT_OK);
    assert_int_equal(create_with_hash(NULL), SMELT_OK);
    char upper[33];
    for (int i = 0; i < 33; i++)
        upper[i] =
            (char)(info.content_hash[i] >= 'a' && info.content_hash[i] <= 'f' ? info.content_hash[i] - 32
                                                                              : info.content_hash[i]);
    assert_int_equal(create_with_hash(upper), SMELT_OK);
    char other[33];
    memcpy(other, info.content_hash, 33);
    other[0] = other[0] == '0' ? '1' : '0';
    assert_int_equal(create_with_hash(other), SMELT_ERROR_BAD_PLAN);
    if (!strstr(smelt_last_error(), "refusing to load its code")) fail_msg("%s", smelt_last_error());
    assert_int_equal(create_with_hash("abc"), SMELT_ERROR_BAD_PLAN);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_the_compiled_plan_opens),
        cmocka_unit_test(test_edited_buffers_are_refused),
        cmocka_unit_test(test_edited_launches_are_refused),
        cmocka_unit_test(test_edited_weights_and_bounds_are_refused),
        cmocka_unit_test(test_edited_costs_are_refused),
        cmocka_unit_test(test_the_compiled_plan_carries_costs),
        cmocka_unit_test(test_expected_hash),
    };
    return cmocka_run_group_tests(tests, setup, teardown);
}
