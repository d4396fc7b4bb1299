/* fuzz_plan.c - the plan reader on arbitrary bytes: the container checks,
 * then the kernel table and the launch program of whatever passes them (and
 * the program against the kernel table), the runtime's whole gate (smelt_plan_open_memory), then the `smelt
 * inspect` printout.
 *
 * A random edit of a section would never get past its checksum, so each
 * input is read twice: as it is (the container checks themselves), then
 * repaired: section checksums, content hash, file size and header checksum
 * recomputed as plan/plan_write.c computes them, for whatever the header and
 * directory say. A plan edited by hand with its checksums recomputed is
 * exactly what the readers behind the checksums must survive.
 *
 * Under libFuzzer the mutator is structure-aware (LLVMFuzzerCustomMutator):
 * most of the time it mutates the bytes of one section of a valid plan
 * (PROGRAM and KERNELS above all) and lays the container out again, with
 * the section free to grow or shrink; otherwise it mutates the whole input
 * as libFuzzer would, and the repair above still applies. */
#include "fuzz.h"
#include "plan_format.h"
#include "plan_print.h"
#include "plan_read.h"
#include "program.h"
#include "smelt.h"

#include <stdlib.h>
#include <string.h>
#include <xxhash.h>

/* Rewrites, in place, every checksum of the plan in bytes[0..size) that its
 * header and directory allow: file size, section checksums (entries that
 * point outside the input are left alone), the content hash (when every
 * section is inside) and the header checksum. */
static void plan_repair(uint8_t *bytes, size_t size) {
    if (size < PLAN_HEADER_SIZE) return;
    uint32_t count = plan_get_u32(bytes + PLAN_AT_SECTION_COUNT);
    if (count > PLAN_SECTION_KIND_COUNT) return;
    size_t header_bytes = PLAN_HEADER_SIZE + (size_t)count * PLAN_DIRECTORY_ENTRY_SIZE;
    if (size < header_bytes) return;
    plan_put_u64(bytes + PLAN_AT_FILE_SIZE, size);
    XXH3_state_t *content = XXH3_createState();
    bool whole = content && XXH3_128bits_reset(content) == XXH_OK;
    for (uint32_t i = 0; i < count; i++) {
        uint8_t *entry = bytes + PLAN_HEADER_SIZE + (size_t)i * PLAN_DIRECTORY_ENTRY_SIZE;
        uint64_t offset = plan_get_u64(entry + PLAN_ENTRY_AT_OFFSET);
        uint64_t section_size = plan_get_u64(entry + PLAN_ENTRY_AT_SIZE);
        if (offset > size || section_size > size - offset) {
            whole = false;
            continue;
        }
        plan_put_u64(entry + PLAN_ENTRY_AT_CHECKSUM, XXH64(bytes + offset, (size_t)section_size, 0));
        if (!whole) continue;
        uint8_t framing[12];
        plan_put_u32(framing, plan_get_u32(entry + PLAN_ENTRY_AT_KIND));
        plan_put_u64(framing + 4, section_size);
        XXH3_128bits_update(content, bytes + offset, (size_t)section_size);
        XXH3_128bits_update(content, framing, sizeof framing);
    }
    if (whole) {
        XXH128_hash_t hash = XXH3_128bits_digest(content);
        plan_put_u64(bytes + PLAN_AT_CONTENT_HASH_LOW, hash.low64);
        plan_put_u64(bytes + PLAN_AT_CONTENT_HASH_HIGH, hash.high64);
    }
    XXH3_freeState(content);
    plan_put_u64(bytes + PLAN_AT_HEADER_CHECKSUM, 0);
    plan_put_u64(bytes + PLAN_AT_HEADER_CHECKSUM, XXH64(bytes, header_bytes, 0));
}

/* Every reader of plans, on one input. */
static void read_plan(const uint8_t *data, size_t size) {
    plan_file plan;
    char error[512];
    if (!plan_open_bytes(data, size, "fuzz.plan", &plan, error, sizeof error)) return;
    const uint8_t *section;
    uint64_t section_size;
    plan_kernel_table table = {0};
    bool have_table = plan_section(&plan, PLAN_SECTION_KERNELS, &section, &section_size) &&
                      plan_kernel_table_decode(section, section_size, &table, error, sizeof error);
    if (plan_section(&plan, PLAN_SECTION_PROGRAM, &section, &section_size)) {
        program p;
        if (program_decode(section, section_size, &p, error, sizeof error)) {
            /* and against the rest of the plan, as the runtime checks it */
            uint64_t weight_data_size = 0;
            const uint8_t *weights;
            plan_section(&plan, PLAN_SECTION_WEIGHT_DATA, &weights, &weight_data_size);
            if (have_table)
                program_check_plan(&p, table.kernels, table.count, weight_data_size, error, sizeof error);
            program_free(&p);
        }
    }
    if (have_table) plan_kernel_table_free(&table);
    plan_print_options options = {.kernel_source = true};
    plan_print(fuzz_null_stream(), &plan, &options, error, sizeof error);
    plan_close(&plan);

    smelt_plan *opened;
    if (smelt_plan_open_memory(data, size, &opened) == SMELT_OK) {
        smelt_plan_info info;
        smelt_plan_get_info(opened, &info);
        smelt_plan_has_weight(opened, "model.embed_tokens.weight");
        smelt_plan_close(opened);
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    read_plan(data, size);
    uint8_t *repaired = malloc(size ? size : 1);
    if (!repaired) return 0;
    memcpy(repaired, data, size);
    plan_repair(repaired, size);
    if (memcmp(repaired, data, size) != 0) read_plan(repaired, size);
    free(repaired);
    return 0;
}

#ifdef SMELT_FUZZ_LIBFUZZER
size_t LLVMFuzzerMutate(uint8_t *data, size_t size, size_t max_size);

typedef struct fuzz_section {
    uint32_t kind;
    const uint8_t *data;
    uint64_t size;
} fuzz_section;

/* The sections of a plan whose header and directory are sound enough to lay
 * out again; false otherwise. */
static bool split_plan(const uint8_t *data, size_t size, fuzz_section *sections, uint32_t *count) {
    if (size < PLAN_HEADER_SIZE || memcmp(data, PLAN_MAGIC, PLAN_MAGIC_SIZE) != 0) return false;
    *count = plan_get_u32(data + PLAN_AT_SECTION_COUNT);
    if (*count == 0 || *count > PLAN_SECTION_KIND_COUNT) return false;
    if (size < PLAN_HEADER_SIZE + (size_t)*count * PLAN_DIRECTORY_ENTRY_SIZE) return false;
    for (uint32_t i = 0; i < *count; i++) {
        const uint8_t *entry = data + PLAN_HEADER_SIZE + (size_t)i * PLAN_DIRECTORY_ENTRY_SIZE;
        uint64_t offset = plan_get_u64(entry + PLAN_ENTRY_AT_OFFSET);
        sections[i].kind = plan_get_u32(entry + PLAN_ENTRY_AT_KIND);
        sections[i].size = plan_get_u64(entry + PLAN_ENTRY_AT_SIZE);
        if (offset > size || sections[i].size > size - offset) return false;
        sections[i].data = data + offset;
    }
    return true;
}

/* Lays the sections out after the header and directory as the writer does
 * (each at its kind's alignment, zero padding between) into out, then
 * repairs the checksums. Returns the plan's size, or 0 when it would not fit
 * in capacity bytes. */
static size_t join_plan(const uint8_t *header, const fuzz_section *sections, uint32_t count, uint8_t *out,
                        size_t capacity) {
    size_t at = PLAN_HEADER_SIZE + (size_t)count * PLAN_DIRECTORY_ENTRY_SIZE;
    if (at > capacity) return 0;
    memset(out, 0, at);
    memcpy(out, header, PLAN_HEADER_SIZE);
    for (uint32_t i = 0; i < count; i++) {
        uint64_t alignment = plan_section_alignment(sections[i].kind);
        size_t padding = (size_t)((alignment - at % alignment) % alignment);
        if (padding > capacity - at || sections[i].size > capacity - at - padding) return 0;
        memset(out + at, 0, padding);
        at += padding;
        memcpy(out + at, sections[i].data, (size_t)sections[i].size);
        uint8_t *entry = out + PLAN_HEADER_SIZE + (size_t)i * PLAN_DIRECTORY_ENTRY_SIZE;
        plan_put_u32(entry + PLAN_ENTRY_AT_KIND, sections[i].kind);
        plan_put_u64(entry + PLAN_ENTRY_AT_OFFSET, at);
        plan_put_u64(entry + PLAN_ENTRY_AT_SIZE, sections[i].size);
        at += (size_t)sections[i].size;
    }
    plan_repair(out, at);
    return at;
}

/* Which section to mutate: PROGRAM half the time, KERNELS a quarter, any
 * other but WEIGHT_DATA (plain numbers) the rest; -1 when there is none. */
static int pick_section(const fuzz_section *sections, uint32_t count, unsigned int seed) {
    uint32_t wanted = seed % 4 < 2 ? PLAN_SECTION_PROGRAM : seed % 4 == 2 ? PLAN_SECTION_KERNELS : 0;
    int any = -1, others = 0;
    for (uint32_t i = 0; i < count; i++) {
        if (sections[i].kind == wanted) return (int)i;
        if (sections[i].kind == PLAN_SECTION_WEIGHT_DATA) continue;
        if (any < 0 || (seed >> 8) % (unsigned)++others == 0) any = (int)i;
    }
    return any;
}

size_t LLVMFuzzerCustomMutator(uint8_t *data, size_t size, size_t max_size, unsigned int seed) {
    fuzz_section sections[PLAN_SECTION_KIND_COUNT];
    uint32_t count;
    int chosen = -1;
    if ((seed >> 16) % 8 != 0 && split_plan(data, size, sections, &count))
        chosen = pick_section(sections, count, seed);
    if (chosen < 0) return LLVMFuzzerMutate(data, size, max_size);

    /* The chosen section may grow into whatever room max_size leaves. */
    fuzz_section *s = &sections[chosen];
    size_t room = max_size > size ? max_size - size : 0;
    size_t capacity = (size_t)s->size + (room < 65536 ? room : 65536) + 1;
    uint8_t *mutated = malloc(capacity);
    uint8_t *out = malloc(max_size);
    size_t result = 0;
    if (mutated && out) {
        memcpy(mutated, s->data, (size_t)s->size);
        size_t mutated_size = s->size;
        if (mutated_size == 0) mutated[mutated_size++] = (uint8_t)seed;
        s->data = mutated;
        s->size = LLVMFuzzerMutate(mutated, mutated_size, capacity);
        result = join_plan(data, sections, count, out, max_size);
        if (result) memcpy(data, out, result);
    }
    free(mutated);
    free(out);
    return result ? result : LLVMFuzzerMutate(data, size, max_size);
}
#endif
