/* test_plan_file.c - the plan file container: writing, reading back, every
 * refusal of a damaged or hostile file, the kernel table encoding, and what
 * `smelt inspect` prints.
 *
 * Each test writes its plan into a fresh temporary folder. Damaged plans are
 * made from a good one in memory and opened with plan_open_bytes; header
 * damage that should reach a specific check is "resealed" (the header
 * checksum recomputed) so that the check itself, not the checksum, answers.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "plan_format.h"
#include "plan_print.h"
#include "plan_read.h"
#include "plan_scratch.h"
#include "plan_write.h"

#include <dirent.h>
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

static char plan_path[128];

/* A scratch folder per test, model.plan in it. */
static int setup(void **state) {
    scratch_folder_make(state);
    scratch_path(plan_path, sizeof plan_path, "model.plan");
    return 0;
}

static int teardown(void **state) { return scratch_folder_remove(state); }

static void assert_contains(const char *text, const char *needle) {
    if (!strstr(text, needle)) fail_msg("expected to find\n  %s\nin\n  %s", needle, text);
}

/* ---- A plan with every section kind -------------------------------------- */

static const char manifest_json[] =
    "{\"model\": \"llama-tiny\", \"targets\": [\"sm_90\", \"host\"], \"dims\": {\"tokens\": 4096}}\n";
static uint8_t host_kernels[100], program_filler[77], memory_plan[33], weight_table[50], tokenizer[20];
static uint8_t cubin_80[300], cubin_90[310], ptx_90[40];
enum { WEIGHT_BYTES = 10000, WEIGHT_CHUNK = 777 };

static uint8_t weight_byte(uint64_t i) { return (uint8_t)(i * 7 + 3); }

static void fill_pattern(uint8_t *p, size_t n, unsigned seed) {
    for (size_t i = 0; i < n; i++)
        p[i] = (uint8_t)(i * 31 + seed);
}

static const plan_kernel_resources rms_resources[2] = {
    {{"sm_80", 5}, 32, 1024, 0, 0, 0},
    {{"sm_90", 5}, 40, 2048, 16, 8, 4},
};

static plan_kernel_binary rms_binaries[3];
static plan_kernel test_kernels[2];

/* Two kernels: one with every field used, one with none of the lists. */
static void make_kernels(void) {
    fill_pattern(cubin_80, sizeof cubin_80, 1);
    fill_pattern(cubin_90, sizeof cubin_90, 2);
    memcpy(ptx_90, "// PTX\n.version 8.0\n.target sm_90\n.entry", 40);
    rms_binaries[0] =
        (plan_kernel_binary){plan_text_from("sm_80"), PLAN_BINARY_CUBIN, {cubin_80, sizeof cubin_80}};
    rms_binaries[1] =
        (plan_kernel_binary){plan_text_from("sm_90"), PLAN_BINARY_CUBIN, {cubin_90, sizeof cubin_90}};
    rms_binaries[2] =
        (plan_kernel_binary){plan_text_from("compute_90"), PLAN_BINARY_PTX, {ptx_90, sizeof ptx_90}};
    test_kernels[0] = (plan_kernel){
        .name = plan_text_from("rmsnorm_0"),
        .family = plan_text_from("rmsnorm"),
        .ops = plan_text_from("%5 = rms_norm(%3, %w0)\n%6 = mul(%5, %w1)"),
        .source =
            plan_text_from("#include \"smelt_kernel.h\"\nextern \"C\" __global__ void rmsnorm_0(void) {}\n"),
        .launch = {.grid = {{4, 0, 1}, {0, 1, 1}, {0, 1, 1}},
                   .block = {{0, 256, 1}, {0, 1, 1}, {0, 1, 1}},
                   .dynamic_shared_bytes = 0},
        .param_count = 2,
        .params = {{.kind = 0, .extent = {256, 0, 1}, .writes = 0},
                   {.kind = 1, .extent = {0, 0, 1}, .writes = 0}},
        .resource_count = 2,
        .resources = rms_resources,
        .binary_count = 3,
        .binaries = rms_binaries,
    };
    test_kernels[1] = (plan_kernel){
        .name = plan_text_from("silu_mul_1"),
        .family = plan_text_from("elementwise"),
        .ops = plan_text_from("%9 = silu(%7)"),
        .source = plan_text_from(""),
        .launch = {.grid = {{3, 5, 8}, {0, 2, 1}, {-1, 4096, 1}},
                   .block = {{0, 128, 1}, {0, 1, 1}, {0, 1, 1}},
                   .dynamic_shared_bytes = 4096},
    };
}

static bool stream_weights(void *context, plan_sink *sink) {
    uint64_t *calls = context;
    uint8_t chunk[WEIGHT_CHUNK];
    for (uint64_t done = 0; done < WEIGHT_BYTES;) {
        size_t n = WEIGHT_BYTES - done < WEIGHT_CHUNK ? (size_t)(WEIGHT_BYTES - done) : WEIGHT_CHUNK;
        for (size_t i = 0; i < n; i++)
            chunk[i] = weight_byte(done + i);
        if (!plan_sink_write(sink, chunk, n)) return false;
        done += n;
    }
    ++*calls;
    return true;
}

static uint64_t stream_calls;

/* Sections are added out of kind order on purpose: the file is in kind order. */
static void make_writer(plan_writer *w, const char *version) {
    make_kernels();
    fill_pattern(host_kernels, sizeof host_kernels, 3);
    fill_pattern(program_filler, sizeof program_filler, 4);
    fill_pattern(memory_plan, sizeof memory_plan, 5);
    fill_pattern(weight_table, sizeof weight_table, 6);
    fill_pattern(tokenizer, sizeof tokenizer, 7);
    plan_writer_init(w, version);
    plan_writer_add_section(w, PLAN_SECTION_TOKENIZER, tokenizer, sizeof tokenizer);
    plan_writer_add_stream(w, PLAN_SECTION_WEIGHT_DATA, stream_weights, &stream_calls);
    plan_writer_add_section(w, PLAN_SECTION_MANIFEST, manifest_json, strlen(manifest_json));
    plan_writer_add_kernels(w, test_kernels, 2);
    plan_writer_add_section(w, PLAN_SECTION_HOST_KERNELS, host_kernels, sizeof host_kernels);
    plan_writer_add_section(w, PLAN_SECTION_PROGRAM, program_filler, sizeof program_filler);
    plan_writer_add_section(w, PLAN_SECTION_MEMORY, memory_plan, sizeof memory_plan);
    plan_writer_add_section(w, PLAN_SECTION_WEIGHT_TABLE, weight_table, sizeof weight_table);
}

static void write_full_plan(const char *path, const char *version, plan_write_summary *summary) {
    plan_writer w;
    make_writer(&w, version);
    scratch_plan_write(&w, path, summary);
}

/* The good plan's bytes, written and read back. */
static uint8_t *good_plan(size_t *size) {
    write_full_plan(plan_path, "0.1.0", NULL);
    return scratch_read(plan_path, size);
}

/* Recomputes the header checksum after a test changed the header. */
static void reseal(uint8_t *bytes) {
    uint32_t count = plan_get_u32(bytes + PLAN_AT_SECTION_COUNT);
    if (count > PLAN_SECTION_KIND_COUNT) count = PLAN_SECTION_KIND_COUNT;
    size_t header_bytes = PLAN_HEADER_SIZE + (size_t)count * PLAN_DIRECTORY_ENTRY_SIZE;
    plan_put_u64(bytes + PLAN_AT_HEADER_CHECKSUM, 0);
    plan_put_u64(bytes + PLAN_AT_HEADER_CHECKSUM, XXH64(bytes, header_bytes, 0));
}

static uint8_t *entry_of(uint8_t *bytes, uint32_t kind) {
    uint32_t count = plan_get_u32(bytes + PLAN_AT_SECTION_COUNT);
    for (uint32_t i = 0; i < count; i++) {
        uint8_t *entry = bytes + PLAN_HEADER_SIZE + i * PLAN_DIRECTORY_ENTRY_SIZE;
        if (plan_get_u32(entry + PLAN_ENTRY_AT_KIND) == kind) return entry;
    }
    fail_msg("no section of kind %u", kind);
    return NULL;
}

/* Opens bytes that must be refused, with a message containing `expected`. */
static void assert_refused(const uint8_t *bytes, size_t size, const char *expected) {
    plan_file plan;
    char error[512] = "";
    if (plan_open_bytes(bytes, size, "model.plan", &plan, error, sizeof error))
        fail_msg("a damaged plan was accepted (expected: %s)", expected);
    assert_contains(error, expected);
    assert_null(plan.bytes);
}

/* ---- Writing and reading back -------------------------------------------- */

static void test_round_trip_every_section(void **state) {
    (void)state;
    plan_write_summary summary;
    stream_calls = 0;
    write_full_plan(plan_path, "0.1.0", &summary);
    assert_int_equal(stream_calls, 1);

    plan_file plan;
    char error[512] = "";
    if (!plan_open(plan_path, &plan, error, sizeof error)) fail_msg("open failed: %s", error);
    assert_true(plan.mapped);
    assert_int_equal(plan.format_version, 2);
    assert_string_equal(plan.smelt_version, "0.1.0");
    assert_int_equal(plan.section_count, PLAN_SECTION_KIND_COUNT);
    assert_int_equal(plan.size, summary.file_size);
    assert_int_equal(plan.content_hash_low, summary.content_hash_low);
    assert_int_equal(plan.content_hash_high, summary.content_hash_high);

    struct {
        plan_section_kind kind;
        const void *bytes;
        size_t size;
    } expected[] = {
        {PLAN_SECTION_MANIFEST, manifest_json, strlen(manifest_json)},
        {PLAN_SECTION_HOST_KERNELS, host_kernels, sizeof host_kernels},
        {PLAN_SECTION_PROGRAM, program_filler, sizeof program_filler},
        {PLAN_SECTION_MEMORY, memory_plan, sizeof memory_plan},
        {PLAN_SECTION_WEIGHT_TABLE, weight_table, sizeof weight_table},
        {PLAN_SECTION_TOKENIZER, tokenizer, sizeof tokenizer},
    };
    for (size_t i = 0; i < sizeof expected / sizeof expected[0]; i++) {
        const uint8_t *data;
        uint64_t size;
        assert_true(plan_section(&plan, expected[i].kind, &data, &size));
        assert_int_equal(size, expected[i].size);
        assert_memory_equal(data, expected[i].bytes, expected[i].size);
    }
    const uint8_t *weights;
    uint64_t weight_size;
    assert_true(plan_section(&plan, PLAN_SECTION_WEIGHT_DATA, &weights, &weight_size));
    assert_int_equal(weight_size, WEIGHT_BYTES);
    for (uint64_t i = 0; i < WEIGHT_BYTES; i++)
        if (weights[i] != weight_byte(i)) fail_msg("weight byte %" PRIu64 " differs", i);

    /* Layout: kind order, aligned, weights on a page boundary. */
    for (uint32_t i = 0; i < plan.section_count; i++) {
        const plan_section_entry *e = &plan.sections[i];
        assert_int_equal(e->kind, i + 1);
        assert_int_equal(e->offset % (e->kind == PLAN_SECTION_WEIGHT_DATA ? 4096 : 64), 0);
        if (i > 0) assert_true(e->offset >= plan.sections[i - 1].offset + plan.sections[i - 1].size);
    }
    assert_int_equal((uintptr_t)weights % 4096, 0); /* usable in place from the mapping */
    plan_close(&plan);
    assert_null(plan.bytes);
    plan_close(&plan); /* harmless twice */
}

/* The bytes on disk follow the table in plan_format.h, computed here from
 * the documented definitions rather than through the reader. */
static void test_layout_matches_documentation(void **state) {
    (void)state;
    size_t size;
    uint8_t *bytes = good_plan(&size);
    assert_memory_equal(bytes, "SMELTPLN", 8);
    assert_int_equal(plan_get_u32(bytes + 8), 2);
    assert_int_equal(plan_get_u32(bytes + 12), 8);
    assert_memory_equal(bytes + 16, "0.1.0\0\0\0\0\0\0\0\0\0\0\0", 16);
    assert_int_equal(plan_get_u64(bytes + 32), size);

    XXH3_state_t *content = XXH3_createState();
    XXH3_128bits_reset(content);
    for (uint32_t i = 0; i < 8; i++) {
        const uint8_t *entry = bytes + 64 + 32 * i;
        uint64_t offset = plan_get_u64(entry + 8), length = plan_get_u64(entry + 16);
        assert_int_equal(plan_get_u32(entry), i + 1);
        assert_int_equal(plan_get_u32(entry + 4), 0);
        assert_int_equal(plan_get_u64(entry + 24), XXH64(bytes + offset, length, 0));
        uint8_t framing[12];
        plan_put_u32(framing, i + 1);
        plan_put_u64(framing + 4, length);
        XXH3_128bits_update(content, bytes + offset, length);
        XXH3_128bits_update(content, framing, 12);
    }
    XXH128_hash_t hash = XXH3_128bits_digest(content);
    XXH3_freeState(content);
    assert_int_equal(plan_get_u64(bytes + 40), hash.low64);
    assert_int_equal(plan_get_u64(bytes + 48), hash.high64);

    uint8_t header[64 + 8 * 32];
    memcpy(header, bytes, sizeof header);
    memset(header + 56, 0, 8);
    assert_int_equal(plan_get_u64(bytes + 56), XXH64(header, sizeof header, 0));
    free(bytes);
}

/* Equal inputs give equal files; the content hash ignores the smelt version. */
static void test_deterministic_and_hash_independent_of_version(void **state) {
    (void)state;
    char second[160], third[160];
    scratch_path(second, sizeof second, "second.plan");
    scratch_path(third, sizeof third, "third.plan");
    plan_write_summary a, b, c;
    write_full_plan(plan_path, "0.1.0", &a);
    write_full_plan(second, "0.1.0", &b);
    write_full_plan(third, "0.2.0-rc1", &c);
    size_t size_a, size_b, size_c;
    uint8_t *bytes_a = scratch_read(plan_path, &size_a), *bytes_b = scratch_read(second, &size_b),
            *bytes_c = scratch_read(third, &size_c);
    assert_int_equal(size_a, size_b);
    assert_memory_equal(bytes_a, bytes_b, size_a);
    assert_int_equal(a.content_hash_low, c.content_hash_low);
    assert_int_equal(a.content_hash_high, c.content_hash_high);
    assert_memory_not_equal(bytes_a, bytes_c, 64);
    free(bytes_a);
    free(bytes_b);
    free(bytes_c);
}

static void test_empty_plan_and_long_version(void **state) {
    (void)state;
    plan_writer w;
    plan_writer_init(&w, "0123456789abcdefXYZ"); /* cut to 16 bytes */
    scratch_plan_write(&w, plan_path, NULL);
    char error[512] = "";
    plan_file plan;
    if (!plan_open(plan_path, &plan, error, sizeof error)) fail_msg("%s", error);
    assert_int_equal(plan.section_count, 0);
    assert_int_equal(plan.size, 64);
    assert_string_equal(plan.smelt_version, "0123456789abcdef");
    const uint8_t *data;
    uint64_t size;
    assert_false(plan_section(&plan, PLAN_SECTION_MANIFEST, &data, &size));
    assert_null(data);
    assert_int_equal(size, 0);
    /* XXH3-128 of nothing */
    XXH128_hash_t empty = XXH3_128bits(NULL, 0);
    assert_int_equal(plan.content_hash_low, empty.low64);
    assert_int_equal(plan.content_hash_high, empty.high64);
    plan_close(&plan);
}

/* ---- Atomic writing ------------------------------------------------------ */

static size_t files_in_folder(void) {
    size_t count = 0;
    DIR *dir = opendir(scratch_folder);
    assert_non_null(dir);
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL)
        count += entry->d_name[0] != '.';
    closedir(dir);
    return count;
}

static bool failing_producer(void *context, plan_sink *sink) {
    (void)context;
    uint8_t some[1000] = {1};
    plan_sink_write(sink, some, sizeof some);
    plan_sink_fail(sink, "weight 'model.embed_tokens.weight' could not be converted");
    return false;
}

static void test_failed_write_leaves_old_plan(void **state) {
    (void)state;
    scratch_write(plan_path, (const uint8_t *)"old plan", 8);
    plan_writer w;
    plan_writer_init(&w, "0.1.0");
    plan_writer_add_section(&w, PLAN_SECTION_MANIFEST, "{}", 2);
    plan_writer_add_stream(&w, PLAN_SECTION_WEIGHT_DATA, failing_producer, NULL);
    char error[512] = "";
    assert_false(plan_write_file(&w, plan_path, NULL, error, sizeof error));
    assert_contains(error, "model.plan: cannot produce section WEIGHT_DATA: weight "
                           "'model.embed_tokens.weight' could not be converted");
    plan_writer_free(&w);
    size_t size;
    uint8_t *bytes = scratch_read(plan_path, &size);
    assert_int_equal(size, 8);
    assert_memory_equal(bytes, "old plan", 8);
    free(bytes);
    assert_int_equal(files_in_folder(), 1); /* no temporary file left */

    /* A good write replaces it, again leaving only the plan. */
    write_full_plan(plan_path, "0.1.0", NULL);
    assert_int_equal(files_in_folder(), 1);
    plan_file plan;
    assert_true(plan_open(plan_path, &plan, error, sizeof error));
    plan_close(&plan);
}

static void test_write_into_missing_folder(void **state) {
    (void)state;
    char path[200];
    scratch_path(path, sizeof path, "no/such/folder/model.plan");
    plan_writer w;
    plan_writer_init(&w, "0.1.0");
    char error[512] = "";
    assert_false(plan_write_file(&w, path, NULL, error, sizeof error));
    assert_contains(error, "cannot create a temporary file");
    assert_contains(error, "No such file or directory");
    plan_writer_free(&w);
}

/* Chunks smaller and larger than the writer's 1 MiB buffer, and empty ones. */
enum { BIG_WEIGHT_BYTES = 3 * 1024 * 1024 + 5 };

static bool stream_big_weights(void *context, plan_sink *sink) {
    (void)context;
    static const size_t chunks[] = {1, 0, 1536 * 1024, 4095, 1024 * 1024, 1};
    uint8_t *chunk = malloc(1536 * 1024);
    uint64_t done = 0;
    for (size_t c = 0; done < BIG_WEIGHT_BYTES; c = (c + 1) % (sizeof chunks / sizeof chunks[0])) {
        size_t n = chunks[c];
        if (n > BIG_WEIGHT_BYTES - done) n = (size_t)(BIG_WEIGHT_BYTES - done);
        for (size_t i = 0; i < n; i++)
            chunk[i] = weight_byte(done + i);
        if (!plan_sink_write(sink, chunk, n)) break;
        done += n;
    }
    free(chunk);
    return done == BIG_WEIGHT_BYTES;
}

static void test_streamed_section_larger_than_buffer(void **state) {
    (void)state;
    plan_writer w;
    plan_writer_init(&w, "0.1.0");
    plan_writer_add_section(&w, PLAN_SECTION_MANIFEST, "{}", 2);
    plan_writer_add_stream(&w, PLAN_SECTION_WEIGHT_DATA, stream_big_weights, NULL);
    plan_writer_add_section(&w, PLAN_SECTION_TOKENIZER, "tok", 3);
    plan_write_summary summary;
    scratch_plan_write(&w, plan_path, &summary);
    char error[512] = "";

    plan_file plan;
    if (!plan_open(plan_path, &plan, error, sizeof error)) fail_msg("%s", error);
    const uint8_t *weights;
    uint64_t size;
    assert_true(plan_section(&plan, PLAN_SECTION_WEIGHT_DATA, &weights, &size));
    assert_int_equal(size, BIG_WEIGHT_BYTES);
    for (uint64_t i = 0; i < size; i++)
        if (weights[i] != weight_byte(i)) fail_msg("weight byte %" PRIu64 " differs", i);
    assert_int_equal(plan.sections[1].checksum, XXH64(weights, size, 0));
    /* The tokenizer follows at the next 64-byte boundary. */
    assert_int_equal(plan.sections[2].offset, (4096 + BIG_WEIGHT_BYTES + 63) / 64 * 64);
    assert_int_equal(plan.size, plan.sections[2].offset + 3);
    assert_int_equal(summary.file_size, plan.size);
    plan_close(&plan);
}

/* A write that fails half way (here: the file size limit, as on a full
 * disk) leaves the old plan and no temporary file. */
static void test_io_error_leaves_old_plan(void **state) {
    (void)state;
    scratch_write(plan_path, (const uint8_t *)"old plan", 8);
    struct rlimit saved;
    assert_int_equal(getrlimit(RLIMIT_FSIZE, &saved), 0);
    void (*previous)(int) = signal(SIGXFSZ, SIG_IGN);
    struct rlimit small = {8192, saved.rlim_max};
    assert_int_equal(setrlimit(RLIMIT_FSIZE, &small), 0);
    plan_writer w;
    make_writer(&w, "0.1.0");
    char error[512] = "";
    bool ok = plan_write_file(&w, plan_path, NULL, error, sizeof error);
    setrlimit(RLIMIT_FSIZE, &saved);
    signal(SIGXFSZ, previous);
    plan_writer_free(&w);
    assert_false(ok);
    assert_contains(error, "model.plan: cannot write: File too large");
    size_t size;
    uint8_t *bytes = scratch_read(plan_path, &size);
    assert_int_equal(size, 8);
    assert_memory_equal(bytes, "old plan", 8);
    free(bytes);
    assert_int_equal(files_in_folder(), 1);
}

/* ---- Refusals ------------------------------------------------------------ */

static void test_flipped_bit_in_each_section(void **state) {
    (void)state;
    size_t size;
    uint8_t *bytes = good_plan(&size);
    for (uint32_t kind = 1; kind <= PLAN_SECTION_KIND_COUNT; kind++) {
        uint8_t *entry = entry_of(bytes, kind);
        uint64_t offset = plan_get_u64(entry + PLAN_ENTRY_AT_OFFSET);
        uint64_t length = plan_get_u64(entry + PLAN_ENTRY_AT_SIZE);
        uint64_t targets[3] = {offset, offset + length / 2, offset + length - 1};
        for (int t = 0; t < 3; t++) {
            bytes[targets[t]] ^= (uint8_t)(1u << t);
            char expected[160];
            snprintf(expected, sizeof expected,
                     "model.plan: section %s is corrupt (checksum mismatch): the file is damaged; "
                     "rebuild the plan",
                     plan_section_kind_name(kind));
            assert_refused(bytes, size, expected);
            bytes[targets[t]] ^= (uint8_t)(1u << t);
        }
    }
    plan_file plan;
    char error[512];
    assert_true(plan_open_bytes(bytes, size, NULL, &plan, error, sizeof error)); /* restored */
    free(bytes);
}

/* Every byte of the file is covered: header, directory, padding, sections. */
static void test_flipped_bit_anywhere(void **state) {
    (void)state;
    size_t size;
    uint8_t *bytes = good_plan(&size);
    for (size_t i = 0; i < size; i++) {
        uint8_t bit = (uint8_t)(1u << (i % 8));
        bytes[i] ^= bit;
        plan_file plan;
        char error[512];
        if (plan_open_bytes(bytes, size, NULL, &plan, error, sizeof error))
            fail_msg("a flipped bit at byte %zu was not detected", i);
        bytes[i] ^= bit;
    }
    free(bytes);
}

static void test_truncated_at_every_length(void **state) {
    (void)state;
    size_t size;
    uint8_t *bytes = good_plan(&size);
    for (size_t length = 0; length < size; length++) {
        /* A fresh copy of exactly `length` bytes, so ASan sees any overread. */
        uint8_t *cut = malloc(length ? length : 1);
        memcpy(cut, bytes, length);
        plan_file plan;
        char error[512] = "";
        if (plan_open_bytes(cut, length, "model.plan", &plan, error, sizeof error))
            fail_msg("a plan cut to %zu of %zu bytes was accepted", length, size);
        if (length == 0)
            assert_string_equal(error, "model.plan: empty file: not a smelt plan");
        else {
            assert_contains(error, "model.plan: truncated");
            assert_contains(error, "the file is damaged; rebuild the plan");
        }
        free(cut);
    }
    /* And on disk, through plan_open, at a few lengths. */
    size_t lengths[] = {0, 1, 7, 12, 63, 64, 100, 319, 320, 1000, size / 2, size - 1};
    for (size_t i = 0; i < sizeof lengths / sizeof lengths[0]; i++) {
        scratch_write(plan_path, bytes, lengths[i]);
        plan_file plan;
        char error[512] = "";
        assert_false(plan_open(plan_path, &plan, error, sizeof error));
        assert_contains(error, lengths[i] == 0 ? "empty file: not a smelt plan" : "truncated");
        assert_false(plan.mapped);
    }
    free(bytes);
}

static void test_wrong_magic(void **state) {
    (void)state;
    size_t size;
    uint8_t *bytes = good_plan(&size);
    bytes[3] = 'X';
    assert_refused(bytes, size, "model.plan: not a smelt plan (it does not start with 'SMELTPLN')");
    assert_refused((const uint8_t *)"{\"json\": 1}", 11, "not a smelt plan");
    assert_refused((const uint8_t *)"SMX", 3, "not a smelt plan");
    free(bytes);
}

static void test_other_format_version(void **state) {
    (void)state;
    size_t size;
    uint8_t *bytes = good_plan(&size);
    plan_put_u32(bytes + PLAN_AT_FORMAT_VERSION, 3);
    assert_refused(bytes, size,
                   "model.plan: this plan has format version 3 but this smelt reads version 2: "
                   "rebuild the plan with `smelt compile`");
    /* The version is read before anything else of the header: a 12-byte
     * stub of a future plan still gets the rebuild advice. */
    assert_refused(bytes, 12, "format version 3 but this smelt reads version 2");
    plan_put_u32(bytes + PLAN_AT_FORMAT_VERSION, 0);
    assert_refused(bytes, size, "format version 0");
    free(bytes);
}

static void test_corrupt_header_without_reseal(void **state) {
    (void)state;
    size_t size;
    uint8_t *bytes = good_plan(&size);
    bytes[PLAN_AT_SMELT_VERSION] ^= 1;
    assert_refused(bytes, size, "model.plan: the header is corrupt (checksum mismatch): the file is damaged");
    bytes[PLAN_AT_SMELT_VERSION] ^= 1;
    plan_put_u32(bytes + PLAN_AT_SECTION_COUNT, 1000000);
    assert_refused(bytes, size, "the header is corrupt (it lists 1000000 sections; there are only 8 kinds)");
    free(bytes);
}

static void test_overlapping_sections(void **state) {
    (void)state;
    size_t size;
    uint8_t *bytes = good_plan(&size);
    uint8_t *manifest = entry_of(bytes, PLAN_SECTION_MANIFEST),
            *kernels = entry_of(bytes, PLAN_SECTION_KERNELS);
    /* KERNELS starts where MANIFEST does. */
    plan_put_u64(kernels + PLAN_ENTRY_AT_OFFSET, plan_get_u64(manifest + PLAN_ENTRY_AT_OFFSET));
    reseal(bytes);
    assert_refused(bytes, size, "model.plan: sections MANIFEST and KERNELS overlap: the file is damaged");
    free(bytes);

    /* MANIFEST grows into KERNELS by one byte. */
    bytes = good_plan(&size);
    manifest = entry_of(bytes, PLAN_SECTION_MANIFEST);
    kernels = entry_of(bytes, PLAN_SECTION_KERNELS);
    uint64_t gap =
        plan_get_u64(kernels + PLAN_ENTRY_AT_OFFSET) - plan_get_u64(manifest + PLAN_ENTRY_AT_OFFSET);
    plan_put_u64(manifest + PLAN_ENTRY_AT_SIZE, gap + 1);
    reseal(bytes);
    assert_refused(bytes, size, "sections MANIFEST and KERNELS overlap");

    /* A section inside the header and directory. */
    plan_put_u64(manifest + PLAN_ENTRY_AT_SIZE, strlen(manifest_json));
    plan_put_u64(manifest + PLAN_ENTRY_AT_OFFSET, 64);
    reseal(bytes);
    assert_refused(bytes, size, "section MANIFEST at offset 64 overlaps the header and directory");
    free(bytes);
}

static void test_directory_past_the_file(void **state) {
    (void)state;
    size_t size;
    uint8_t *bytes = good_plan(&size);
    uint8_t *tokenizer_entry = entry_of(bytes, PLAN_SECTION_TOKENIZER);
    uint64_t past = ((uint64_t)size + 64) / 64 * 64;
    plan_put_u64(tokenizer_entry + PLAN_ENTRY_AT_OFFSET, past);
    reseal(bytes);
    char expected[256];
    snprintf(expected, sizeof expected,
             "model.plan: section TOKENIZER (offset %" PRIu64
             ", 20 bytes) runs past the end of the file (%zu bytes)",
             past, size);
    assert_refused(bytes, size, expected);
    free(bytes);
}

static void test_huge_sizes_that_overflow(void **state) {
    (void)state;
    size_t size;
    uint8_t *bytes = good_plan(&size);
    uint8_t *weights = entry_of(bytes, PLAN_SECTION_WEIGHT_DATA);
    /* offset + size wraps around to a small number */
    plan_put_u64(weights + PLAN_ENTRY_AT_SIZE, UINT64_MAX - 100);
    reseal(bytes);
    assert_refused(bytes, size,
                   "section WEIGHT_DATA (offset 4096, 18446744073709551515 bytes) runs past the end");
    plan_put_u64(weights + PLAN_ENTRY_AT_SIZE, WEIGHT_BYTES);
    plan_put_u64(weights + PLAN_ENTRY_AT_OFFSET, UINT64_MAX - 4095); /* aligned, near the top */
    reseal(bytes);
    assert_refused(bytes, size, "runs past the end of the file");
    plan_put_u64(weights + PLAN_ENTRY_AT_OFFSET, 4096);
    plan_put_u64(bytes + PLAN_AT_FILE_SIZE, UINT64_MAX);
    reseal(bytes);
    assert_refused(bytes, size, "truncated (it has");
    free(bytes);
}

static void test_directory_rules(void **state) {
    (void)state;
    size_t size;
    uint8_t *bytes = good_plan(&size);
    uint8_t *program_entry = entry_of(bytes, PLAN_SECTION_PROGRAM);

    plan_put_u32(program_entry + PLAN_ENTRY_AT_KIND, PLAN_SECTION_MEMORY);
    reseal(bytes);
    assert_refused(bytes, size, "section MEMORY appears twice");

    plan_put_u32(program_entry + PLAN_ENTRY_AT_KIND, 9);
    reseal(bytes);
    assert_refused(bytes, size, "has a section of unknown kind 9: rebuild the plan with `smelt compile`");
    plan_put_u32(program_entry + PLAN_ENTRY_AT_KIND, 0);
    reseal(bytes);
    assert_refused(bytes, size, "unknown kind 0");
    plan_put_u32(program_entry + PLAN_ENTRY_AT_KIND, PLAN_SECTION_PROGRAM);

    plan_put_u32(program_entry + PLAN_ENTRY_AT_FLAGS, 4);
    reseal(bytes);
    assert_refused(bytes, size, "section PROGRAM has unknown flags 0x4");
    plan_put_u32(program_entry + PLAN_ENTRY_AT_FLAGS, 0);

    uint64_t offset = plan_get_u64(program_entry + PLAN_ENTRY_AT_OFFSET);
    plan_put_u64(program_entry + PLAN_ENTRY_AT_OFFSET, offset + 8);
    reseal(bytes);
    assert_refused(bytes, size, "is not aligned to 64 bytes");
    plan_put_u64(program_entry + PLAN_ENTRY_AT_OFFSET, offset);

    uint8_t *weights = entry_of(bytes, PLAN_SECTION_WEIGHT_DATA);
    plan_put_u64(weights + PLAN_ENTRY_AT_OFFSET, 4096 - 64); /* 64-aligned is not enough */
    reseal(bytes);
    assert_refused(bytes, size, "section WEIGHT_DATA at offset 4032 is not aligned to 4096 bytes");
    plan_put_u64(weights + PLAN_ENTRY_AT_OFFSET, 4096);
    reseal(bytes);

    plan_file plan;
    char error[512];
    assert_true(plan_open_bytes(bytes, size, NULL, &plan, error, sizeof error)); /* all restored */
    free(bytes);
}

static void test_padding_trailing_bytes_and_content_hash(void **state) {
    (void)state;
    size_t size;
    uint8_t *bytes = good_plan(&size);
    uint8_t *weights = entry_of(bytes, PLAN_SECTION_WEIGHT_DATA);
    uint64_t weight_offset = plan_get_u64(weights + PLAN_ENTRY_AT_OFFSET);
    bytes[weight_offset - 1] = 0xff; /* the padding before the weights */
    assert_refused(bytes, size, "the padding before section WEIGHT_DATA is not zero");
    bytes[weight_offset - 1] = 0;

    /* Bytes after the end the header gives. */
    uint8_t *longer = calloc(1, size + 10);
    memcpy(longer, bytes, size);
    assert_refused(longer, size + 10, "has 10 bytes after the end its header gives");
    /* ...and a header that says so, with garbage there. */
    plan_put_u64(longer + PLAN_AT_FILE_SIZE, size + 10);
    longer[size + 5] = 1;
    reseal(longer);
    assert_refused(longer, size + 10, "the padding after the last section is not zero");
    free(longer);

    /* Sections intact but the pinned hash is not theirs. */
    plan_put_u64(bytes + PLAN_AT_CONTENT_HASH_LOW, plan_get_u64(bytes + PLAN_AT_CONTENT_HASH_LOW) ^ 1);
    reseal(bytes);
    assert_refused(bytes, size, "the content hash does not match the sections: the file is damaged");
    free(bytes);
}

static void test_open_errors(void **state) {
    (void)state;
    plan_file plan;
    char error[512] = "";
    char path[200];
    scratch_path(path, sizeof path, "missing.plan");
    assert_false(plan_open(path, &plan, error, sizeof error));
    assert_contains(error, "missing.plan: cannot open: No such file or directory");
    assert_false(plan_open(scratch_folder, &plan, error, sizeof error));
    assert_contains(error, "not a regular file");
    /* A FIFO without a writer must not hang the reader. */
    scratch_path(path, sizeof path, "fifo.plan");
    assert_int_equal(mkfifo(path, 0600), 0);
    assert_false(plan_open(path, &plan, error, sizeof error));
    assert_contains(error, "not a regular file");
    /* A tiny error buffer is filled safely; no buffer at all is fine too. */
    char tiny[8];
    assert_false(plan_open(scratch_folder, &plan, tiny, sizeof tiny));
    assert_int_equal(strlen(tiny), 7);
    assert_false(plan_open(scratch_folder, &plan, NULL, 0));
}

/* Random damage to the header and directory, resealed so that it reaches
 * the structural checks: never a crash, and anything accepted is sound. */
static void test_container_fuzz(void **state) {
    (void)state;
    size_t size;
    uint8_t *good = good_plan(&size);
    uint8_t *bytes = malloc(size);
    uint64_t random = 0x9e3779b97f4a7c15u;
    unsigned accepted = 0;
    for (int round = 0; round < 20000; round++) {
        memcpy(bytes, good, size);
        int edits = 1 + (int)(random % 3);
        for (int e = 0; e < edits; e++) {
            random ^= random << 13, random ^= random >> 7, random ^= random << 17;
            size_t at = PLAN_AT_SECTION_COUNT + (size_t)(random % (PLAN_HEADER_SIZE + 8 * 32 - 12));
            if (at >= PLAN_AT_HEADER_CHECKSUM && at < PLAN_HEADER_SIZE) continue;
            uint64_t value = random >> 16;
            if (random & 1) /* a whole 8-byte field set to something extreme */
                plan_put_u64(bytes + (at & ~(size_t)7),
                             (random & 2) ? UINT64_MAX - (value & 0xffff) : value & 0xffff);
            else
                bytes[at] ^= (uint8_t)value;
        }
        reseal(bytes);
        plan_file plan;
        char error[512];
        if (!plan_open_bytes(bytes, size, NULL, &plan, error, sizeof error)) {
            assert_true(strlen(error) > 0);
            continue;
        }
        accepted++;
        for (uint32_t i = 0; i < plan.section_count; i++)
            assert_true(plan.sections[i].offset + plan.sections[i].size <= size);
    }
    (void)accepted;
    free(bytes);
    free(good);
}

/* ---- The kernel table ---------------------------------------------------- */

static void assert_text(plan_text text, const char *expected) {
    assert_int_equal(text.length, strlen(expected));
    assert_memory_equal(text.data, expected, text.length);
}

static plan_buffer encoded_kernels(void) {
    make_kernels();
    plan_buffer buffer = {0};
    plan_kernels_encode(test_kernels, 2, &buffer);
    return buffer;
}

static void test_kernel_table_round_trip(void **state) {
    (void)state;
    plan_buffer buffer = encoded_kernels();
    plan_kernel_table table;
    char error[512] = "";
    if (!plan_kernel_table_decode(buffer.data, buffer.size, &table, error, sizeof error))
        fail_msg("%s", error);
    assert_int_equal(table.count, 2);
    for (uint32_t i = 0; i < 2; i++) {
        const plan_kernel *got = &table.kernels[i], *want = &test_kernels[i];
        assert_text(got->name, want->name.data);
        assert_text(got->family, want->family.data);
        assert_text(got->ops, want->ops.data);
        assert_text(got->source, want->source.data);
        assert_memory_equal(&got->launch, &want->launch, sizeof got->launch);
        assert_int_equal(got->param_count, want->param_count);
        for (uint32_t p = 0; p < got->param_count; p++) {
            assert_int_equal(got->params[p].kind, want->params[p].kind);
            assert_memory_equal(&got->params[p].extent, &want->params[p].extent,
                                sizeof got->params[p].extent);
            assert_int_equal(got->params[p].writes, want->params[p].writes);
        }
        assert_int_equal(got->resource_count, want->resource_count);
        assert_int_equal(got->binary_count, want->binary_count);
        for (uint32_t r = 0; r < got->resource_count; r++) {
            assert_text(got->resources[r].arch, want->resources[r].arch.data);
            assert_int_equal(got->resources[r].registers, want->resources[r].registers);
            assert_int_equal(got->resources[r].shared_bytes, want->resources[r].shared_bytes);
            assert_int_equal(got->resources[r].stack_bytes, want->resources[r].stack_bytes);
            assert_int_equal(got->resources[r].spill_store_bytes, want->resources[r].spill_store_bytes);
            assert_int_equal(got->resources[r].spill_load_bytes, want->resources[r].spill_load_bytes);
        }
        for (uint32_t b = 0; b < got->binary_count; b++) {
            assert_text(got->binaries[b].arch, want->binaries[b].arch.data);
            assert_int_equal(got->binaries[b].kind, want->binaries[b].kind);
            assert_int_equal(got->binaries[b].bytes.size, want->binaries[b].bytes.size);
            assert_memory_equal(got->binaries[b].bytes.data, want->binaries[b].bytes.data,
                                got->binaries[b].bytes.size);
            /* a view into the section, not a copy */
            assert_true(got->binaries[b].bytes.data > buffer.data &&
                        got->binaries[b].bytes.data < buffer.data + buffer.size);
        }
    }
    assert_true(table.kernels[0].name.data > (const char *)buffer.data);
    plan_kernel_table_free(&table);

    /* The encoding itself, by hand: count, then the first name. */
    assert_int_equal(plan_get_u32(buffer.data), 2);
    assert_int_equal(plan_get_u64(buffer.data + 4), 9);
    assert_memory_equal(buffer.data + 12, "rmsnorm_0", 9);

    /* An empty table. */
    plan_buffer empty = {0};
    plan_kernels_encode(NULL, 0, &empty);
    assert_int_equal(empty.size, 4);
    assert_true(plan_kernel_table_decode(empty.data, empty.size, &table, error, sizeof error));
    assert_int_equal(table.count, 0);
    plan_kernel_table_free(&table);
    plan_buffer_free(&empty);
    plan_buffer_free(&buffer);
}

static void assert_decode_refused(const uint8_t *data, size_t size, const char *expected) {
    plan_kernel_table table;
    char error[512] = "";
    if (plan_kernel_table_decode(data, size, &table, error, sizeof error))
        fail_msg("a bad kernel table was accepted (expected: %s)", expected);
    assert_contains(error, expected);
    assert_null(table.kernels);
}

static void test_kernel_table_truncated(void **state) {
    (void)state;
    plan_buffer buffer = encoded_kernels();
    for (size_t length = 0; length < buffer.size; length++) {
        uint8_t *cut = malloc(length ? length : 1);
        memcpy(cut, buffer.data, length);
        plan_kernel_table table;
        char error[512] = "";
        if (plan_kernel_table_decode(cut, length, &table, error, sizeof error))
            fail_msg("a kernel table cut to %zu of %zu bytes was accepted", length, buffer.size);
        assert_true(strncmp(error, "kernel table: ", 14) == 0);
        free(cut);
    }
    assert_decode_refused(buffer.data, 3, "kernel table: the kernel count is cut off");
    plan_buffer_free(&buffer);
}

static void test_kernel_table_lying_fields(void **state) {
    (void)state;
    plan_buffer buffer = encoded_kernels();
    uint8_t *copy = malloc(buffer.size + 1);

    memcpy(copy, buffer.data, buffer.size);
    plan_put_u32(copy, 5000000);
    char expected[128];
    snprintf(expected, sizeof expected, "kernel table: 5000000 kernels cannot fit in %zu bytes",
             buffer.size - 4);
    assert_decode_refused(copy, buffer.size, expected);

    memcpy(copy, buffer.data, buffer.size);
    plan_put_u64(copy + 4, UINT64_MAX); /* the first name's length */
    assert_decode_refused(copy, buffer.size,
                          "kernel table: kernel 0: name claims 18446744073709551615 bytes but only");

    memcpy(copy, buffer.data, buffer.size);
    plan_put_u64(copy + 4, 0);
    assert_decode_refused(copy, buffer.size, "kernel 0: has an empty name");

    /* grid.x's divisor of kernel 0: after count, 4 strings, a and b. */
    size_t strings = 4 + 8 + 9 + 8 + 7 + 8 + test_kernels[0].ops.length + 8 + test_kernels[0].source.length;
    assert_int_equal(plan_get_u64(buffer.data + strings + 16), 1);
    memcpy(copy, buffer.data, buffer.size);
    plan_put_u64(copy + strings + 16, 0);
    assert_decode_refused(copy, buffer.size, "kernel 0: grid.x divides by 0 (it must divide by 1 or more)");
    plan_put_u64(copy + strings + 16, (uint64_t)-5);
    assert_decode_refused(copy, buffer.size, "divides by -5");

    /* The parameters of kernel 0: a count, then {u32 kind, affine, u32 writes} each. */
    size_t params_at = strings + 6 * 24 + 8;
    assert_int_equal(plan_get_u32(buffer.data + params_at), 2);
    memcpy(copy, buffer.data, buffer.size);
    plan_put_u32(copy + params_at, 33);
    assert_decode_refused(copy, buffer.size, "kernel 0: declares 33 parameters (at most 32)");
    memcpy(copy, buffer.data, buffer.size);
    plan_put_u32(copy + params_at + 4, 2);
    assert_decode_refused(copy, buffer.size,
                          "kernel 0: parameter 0 has kind 2 and access 0 (expected 0 or 1 each)");
    memcpy(copy, buffer.data, buffer.size);
    plan_put_u64(copy + params_at + 4 + 4 + 16, 0);
    assert_decode_refused(copy, buffer.size, "kernel 0: parameter extent divides by 0");

    /* resource count of kernel 0 */
    size_t resources_at = params_at + 4 + 2 * (4 + 24 + 4);
    assert_int_equal(plan_get_u32(buffer.data + resources_at), 2);
    memcpy(copy, buffer.data, buffer.size);
    plan_put_u32(copy + resources_at, 0xffffffffu);
    assert_decode_refused(copy, buffer.size, "kernel 0: resource count is 4294967295 but only");

    /* The first binary's kind: after 2 resources (arch "sm_80"/"sm_90"). */
    size_t binaries_at = resources_at + 4 + 2 * (8 + 5 + 4 + 4 * 8);
    assert_int_equal(plan_get_u32(buffer.data + binaries_at), 3);
    memcpy(copy, buffer.data, buffer.size);
    plan_put_u32(copy + binaries_at + 4 + 8 + 5, 7);
    assert_decode_refused(copy, buffer.size, "kernel 0: binary for 'sm_80' has unknown kind 7");

    memcpy(copy, buffer.data, buffer.size);
    copy[buffer.size] = 0;
    assert_decode_refused(copy, buffer.size + 1, "kernel table: 1 unexpected bytes after the last kernel");

    free(copy);
    plan_buffer_free(&buffer);
}

/* Random mutations: decode and print either refuse cleanly or give views
 * that lie inside the section (ASan checks every byte touched). */
static void test_kernel_table_fuzz(void **state) {
    (void)state;
    plan_buffer buffer = encoded_kernels();
    uint8_t *copy = malloc(buffer.size);
    uint64_t random = 0x2545f4914f6cdd1du;
    FILE *sink = fopen("/dev/null", "w");
    assert_non_null(sink);
    unsigned accepted = 0;
    for (int round = 0; round < 30000; round++) {
        memcpy(copy, buffer.data, buffer.size);
        int edits = 1 + (int)(random % 4);
        for (int e = 0; e < edits; e++) {
            random ^= random << 13, random ^= random >> 7, random ^= random << 17;
            size_t at = (size_t)(random % buffer.size);
            if ((random & 3) == 0 && at + 8 <= buffer.size)
                plan_put_u64(copy + at,
                             (random & 4) ? UINT64_MAX - ((random >> 8) & 0xff) : (random >> 8) & 0xff);
            else
                copy[at] ^= (uint8_t)(random >> 24);
        }
        size_t length = (random & 0x10) ? buffer.size - (size_t)((random >> 32) % 16) : buffer.size;
        plan_kernel_table table;
        char error[512];
        if (!plan_kernel_table_decode(copy, length, &table, error, sizeof error)) continue;
        accepted++;
        for (uint32_t k = 0; k < table.count; k++) {
            const plan_kernel *kernel = &table.kernels[k];
            assert_true((const uint8_t *)kernel->source.data + kernel->source.length <= copy + length);
            for (uint32_t b = 0; b < kernel->binary_count; b++)
                assert_true(kernel->binaries[b].bytes.data + kernel->binaries[b].bytes.size <= copy + length);
        }
        plan_kernel_table_free(&table);
        plan_print_options options = {.kernel_source = true};
        assert_true(plan_print_kernels(sink, NULL, copy, length, &options, error, sizeof error));
    }
    assert_true(accepted > 0); /* some mutations (inside text) keep it valid */
    fclose(sink);
    free(copy);
    plan_buffer_free(&buffer);
}

static void test_affine_rules(void **state) {
    (void)state;
    int64_t v;
    assert_true(plan_affine_eval((plan_affine){4, 0, 1}, 7, &v));
    assert_int_equal(v, 28);
    assert_true(plan_affine_eval((plan_affine){3, 5, 8}, 7, &v)); /* ceil(26 / 8) */
    assert_int_equal(v, 4);
    assert_true(plan_affine_eval((plan_affine){3, 5, 8}, 9, &v)); /* ceil(32 / 8) */
    assert_int_equal(v, 4);
    assert_true(plan_affine_eval((plan_affine){0, 256, 1}, 1000, &v));
    assert_int_equal(v, 256);
    assert_true(plan_affine_eval((plan_affine){1, -1, 1}, 1, &v));
    assert_int_equal(v, 0);
    assert_false(plan_affine_eval((plan_affine){1, -2, 1}, 1, &v));        /* negative */
    assert_false(plan_affine_eval((plan_affine){1, 0, 0}, 1, &v));         /* c < 1 */
    assert_false(plan_affine_eval((plan_affine){INT64_MAX, 0, 1}, 2, &v)); /* a * T overflows */
    assert_false(plan_affine_eval((plan_affine){1, INT64_MAX, 1}, 1, &v)); /* + b overflows */
    assert_true(plan_affine_eval((plan_affine){1, 0, INT64_MAX}, INT64_MAX, &v));
    assert_int_equal(v, 1);

    char text[128];
    plan_affine_format((plan_affine){4, 0, 1}, text, sizeof text);
    assert_string_equal(text, "ceil(T * 4 / 1)");
    plan_affine_format((plan_affine){0, 256, 1}, text, sizeof text);
    assert_string_equal(text, "256");
    plan_affine_format((plan_affine){0, 9, 4}, text, sizeof text);
    assert_string_equal(text, "3");
    plan_affine_format((plan_affine){3, 5, 8}, text, sizeof text);
    assert_string_equal(text, "ceil((T * 3 + 5) / 8)");
    plan_affine_format((plan_affine){1, INT64_MIN, 2}, text, sizeof text);
    assert_string_equal(text, "ceil((T * 1 - 9223372036854775808) / 2)");
    plan_affine_format((plan_affine){0, -3, 1}, text, sizeof text);
    assert_string_equal(text, "ceil(-3 / 1)");
}

/* ---- Printing ------------------------------------------------------------ */

static void test_print_plan(void **state) {
    (void)state;
    plan_write_summary summary;
    write_full_plan(plan_path, "0.1.0", &summary);
    plan_file plan;
    char error[512] = "";
    assert_true(plan_open(plan_path, &plan, error, sizeof error));
    /* The PROGRAM section here is filler bytes, not an encoded program: its
     * printer (program_print.c) refuses it and says so; the rest prints. */
    char *text = scratch_plan_print(&plan, (plan_print_options){0}, false, error, sizeof error);
    assert_true(error[0] != '\0');

    char line[256];
    snprintf(line, sizeof line, "content hash:  xxh3-128:%016" PRIx64 "%016" PRIx64 "\n",
             summary.content_hash_high, summary.content_hash_low);
    assert_contains(text, line);
    assert_contains(text, "plan format:   2\nsmelt version: 0.1.0\n");
    snprintf(line, sizeof line, "file size:     %" PRIu64 " bytes\nsections:      8\n", summary.file_size);
    assert_contains(text, line);
    snprintf(line, sizeof line, "  %-14s %14" PRIu64 " %14" PRIu64 "  %016" PRIx64 "\n", "WEIGHT_DATA",
             plan.sections[6].offset, (uint64_t)WEIGHT_BYTES, plan.sections[6].checksum);
    assert_contains(text, line);
    assert_contains(text, manifest_json);
    assert_contains(text, "  2 kernels\n  kernel 0: rmsnorm_0\n    family:    rmsnorm\n");
    assert_contains(text, "    ops:       %5 = rms_norm(%3, %w0)\n               %6 = mul(%5, %w1)\n");
    assert_contains(text, "    launch:    grid = (ceil(T * 4 / 1), 1, 1), block = (256, 1, 1), shared = 0\n");
    assert_contains(
        text,
        "    resources: sm_80: 32 registers, 1024 B shared, 0 B stack, spills: 0 B stored, 0 B loaded\n"
        "               sm_90: 40 registers, 2048 B shared, 16 B stack, spills: 8 B stored, 4 B loaded\n");
    assert_contains(text, "    binaries:  sm_80 cubin, 300 bytes\n               sm_90 cubin, 310 bytes\n"
                          "               compute_90 ptx, 40 bytes\n");
    assert_contains(text, "    source:    2 lines, 72 bytes\n");
    assert_contains(text, "launch:    grid = (ceil((T * 3 + 5) / 8), 2, ceil((T * -1 + 4096) / 1)), "
                          "block = (128, 1, 1), shared = 4096\n");
    assert_contains(text,
                    "    resources: none reported\n    binaries:  none\n    source:    0 lines, 0 bytes\n");
    assert_contains(text, "\nlaunch program (PROGRAM, 77 bytes):\n");
    assert_contains(text, "\nweight data (WEIGHT_DATA, 10000 bytes):\n");
    assert_true(strstr(text, "__global__") == NULL); /* no source unless asked */
    free(text);

    text = scratch_plan_print(&plan, (plan_print_options){.kernel_source = true}, false, error, sizeof error);
    assert_contains(
        text,
        "    ---\n#include \"smelt_kernel.h\"\nextern \"C\" __global__ void rmsnorm_0(void) {}\n    ---\n");
    free(text);
    plan_close(&plan);
}

/* Checksums intact, contents malformed: the rest still prints, the error
 * says what is wrong, and control bytes from the plan are escaped. */
static void test_print_malformed_kernels(void **state) {
    (void)state;
    static const char evil_manifest[] = "{\"evil\": \"\x1b]0;x\x07\"}";
    plan_writer w;
    plan_writer_init(&w, "0.1.0\x1b[31m");
    plan_writer_add_section(&w, PLAN_SECTION_MANIFEST, evil_manifest, strlen(evil_manifest));
    plan_writer_add_section(&w, PLAN_SECTION_KERNELS, "\x01\0\0\0\x05", 5);
    plan_writer_add_section(&w, PLAN_SECTION_MEMORY, "mem", 3);
    scratch_plan_write(&w, plan_path, NULL);
    char error[512] = "";
    plan_file plan;
    assert_true(plan_open(plan_path, &plan, error, sizeof error));
    char *text = scratch_plan_print(&plan, (plan_print_options){0}, false, error, sizeof error);
    assert_string_equal(error, "kernel table: 1 kernels cannot fit in 1 bytes");
    assert_contains(text, "  cannot be read: kernel table: 1 kernels cannot fit in 1 bytes\n");
    assert_contains(text, "\nmemory plan (MEMORY, 3 bytes):\n");
    assert_contains(text, "smelt version: 0.1.0\\x1b[31m\n");
    assert_contains(text, "{\"evil\": \"\\x1b]0;x\\x07\"}\n");
    assert_true(strchr(text, 0x1b) == NULL);
    free(text);
    plan_close(&plan);
}

/* ---- Dependency direction: who may include whom ---------------------------- */

/* Whether a file named `name` lies in `tree` (a folder of the source tree)
 * or, when `recursive`, in any tree below it. */
static bool header_in(const char *tree, const char *name, bool recursive) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s/%s", SMELT_SOURCE_DIR, tree, name);
    if (access(path, F_OK) == 0) return true;
    if (!recursive) return false;
    snprintf(path, sizeof path, "%s/%s", SMELT_SOURCE_DIR, tree);
    DIR *dir = opendir(path);
    if (!dir) return false;
    bool found = false;
    struct dirent *entry;
    while (!found && (entry = readdir(dir)) != NULL) {
        if (entry->d_name[0] == '.') continue;
        char sub[1024];
        snprintf(sub, sizeof sub, "%s/%s", tree, entry->d_name);
        char full[1400];
        snprintf(full, sizeof full, "%s/%s", SMELT_SOURCE_DIR, sub);
        struct stat st;
        if (stat(full, &st) == 0 && S_ISDIR(st.st_mode)) found = header_in(sub, name, true);
    }
    closedir(dir);
    return found;
}

typedef bool include_rule(const char *name);

/* Calls `allowed` on every `#include "..."` of every .c and .h file under
 * `tree` (recursively) and fails on the first it refuses. Returns the
 * number of files read. */
static unsigned check_includes(const char *tree, include_rule *allowed, const char *why) {
    char path[1024];
    snprintf(path, sizeof path, "%s/%s", SMELT_SOURCE_DIR, tree);
    DIR *dir = opendir(path);
    assert_non_null(dir);
    unsigned files = 0;
    struct dirent *entry;
    while ((entry = readdir(dir)) != NULL) {
        if (entry->d_name[0] == '.') continue;
        char relative[1024], full[1400];
        snprintf(relative, sizeof relative, "%s/%s", tree, entry->d_name);
        snprintf(full, sizeof full, "%s/%s", SMELT_SOURCE_DIR, relative);
        struct stat st;
        if (stat(full, &st) != 0) continue;
        if (S_ISDIR(st.st_mode)) {
            files += check_includes(relative, allowed, why);
            continue;
        }
        size_t n = strlen(entry->d_name);
        if (n < 3 || (strcmp(entry->d_name + n - 2, ".c") != 0 && strcmp(entry->d_name + n - 2, ".h") != 0))
            continue;
        FILE *f = fopen(full, "r");
        if (!f) continue;
        files++;
        char line[1024];
        while (fgets(line, sizeof line, f)) {
            char name[256];
            if (sscanf(line, " #include \"%255[^\"]\"", name) != 1) continue;
            if (strchr(name, '/') || !allowed(name)) fail_msg("%s includes \"%s\": %s", relative, name, why);
        }
        fclose(f);
    }
    closedir(dir);
    return files;
}

/* quant/ depends on plan/ alone: the plan opener checks quantized weights' layouts with it. */
static bool runtime_or_plan_header(const char *name) {
    return header_in("runtime", name, true) || header_in("plan", name, false) ||
           header_in("quant", name, false);
}

static bool plan_header(const char *name) { return header_in("plan", name, false); }

/* smelt_kernel.h is not linked: codegen embeds its text in every kernel. */
static bool not_runtime_header(const char *name) {
    return strcmp(name, "smelt_kernel.h") == 0 || !header_in("runtime", name, true);
}

/* The runtime reads plans on machines without the compiler: nothing under
 * runtime/ may include a header that is not in runtime/, plan/ or quant/
 * (or the system). */
static void test_runtime_includes_only_runtime(void **state) {
    (void)state;
    unsigned files = check_includes("runtime", runtime_or_plan_header, "not a runtime or plan header");
    assert_true(files >= 10); /* smelt.h, engine.c, the devices, the simulator at least */
}

/* plan/ depends on nothing: codegen writes plans through it and the runtime
 * reads them through it, so it includes only its own headers (and the
 * system's). */
static void test_plan_includes_only_plan(void **state) {
    (void)state;
    unsigned files = check_includes("plan", plan_header, "not a plan header");
    assert_true(files >= 10); /* plan_format.h, plan_read.[ch], plan_write.[ch], program.[ch] at least */
}

/* codegen does not link the runtime: it reaches the plan format and the
 * launch program through plan/. */
static void test_codegen_includes_no_runtime_header(void **state) {
    (void)state;
    unsigned files = check_includes("codegen", not_runtime_header, "a runtime header (use plan/)");
    assert_true(files >= 10);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_round_trip_every_section, setup, teardown),
        cmocka_unit_test_setup_teardown(test_layout_matches_documentation, setup, teardown),
        cmocka_unit_test_setup_teardown(test_deterministic_and_hash_independent_of_version, setup, teardown),
        cmocka_unit_test_setup_teardown(test_empty_plan_and_long_version, setup, teardown),
        cmocka_unit_test_setup_teardown(test_failed_write_leaves_old_plan, setup, teardown),
        cmocka_unit_test_setup_teardown(test_write_into_missing_folder, setup, teardown),
        cmocka_unit_test_setup_teardown(test_streamed_section_larger_than_buffer, setup, teardown),
        cmocka_unit_test_setup_teardown(test_io_error_leaves_old_plan, setup, teardown),
        cmocka_unit_test_setup_teardown(test_flipped_bit_in_each_section, setup, teardown),
        cmocka_unit_test_setup_teardown(test_flipped_bit_anywhere, setup, teardown),
        cmocka_unit_test_setup_teardown(test_truncated_at_every_length, setup, teardown),
        cmocka_unit_test_setup_teardown(test_wrong_magic, setup, teardown),
        cmocka_unit_test_setup_teardown(test_other_format_version, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_header_without_reseal, setup, teardown),
        cmocka_unit_test_setup_teardown(test_overlapping_sections, setup, teardown),
        cmocka_unit_test_setup_teardown(test_directory_past_the_file, setup, teardown),
        cmocka_unit_test_setup_teardown(test_huge_sizes_that_overflow, setup, teardown),
        cmocka_unit_test_setup_teardown(test_directory_rules, setup, teardown),
        cmocka_unit_test_setup_teardown(test_padding_trailing_bytes_and_content_hash, setup, teardown),
        cmocka_unit_test_setup_teardown(test_open_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_container_fuzz, setup, teardown),
        cmocka_unit_test(test_kernel_table_round_trip),
        cmocka_unit_test(test_kernel_table_truncated),
        cmocka_unit_test(test_kernel_table_lying_fields),
        cmocka_unit_test(test_kernel_table_fuzz),
        cmocka_unit_test(test_affine_rules),
        cmocka_unit_test_setup_teardown(test_print_plan, setup, teardown),
        cmocka_unit_test_setup_teardown(test_print_malformed_kernels, setup, teardown),
        cmocka_unit_test(test_runtime_includes_only_runtime),
        cmocka_unit_test(test_plan_includes_only_plan),
        cmocka_unit_test(test_codegen_includes_no_runtime_header),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
