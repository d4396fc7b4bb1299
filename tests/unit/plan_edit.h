/* plan_edit.h - for tests that edit a plan as a hostile user would: after
 * changing bytes inside sections, plan_edit_reseal recomputes every
 * section's checksum, the content hash and the header checksum, so that the
 * plan reader's integrity checks pass and what follows them is tested. */
#ifndef SMELT_TEST_PLAN_EDIT_H
#define SMELT_TEST_PLAN_EDIT_H

#include "plan_format.h"

#include <stddef.h>
#include <stdint.h>
#include <xxhash.h>

/* The directory entry of section `kind`, or NULL. */
static inline uint8_t *plan_edit_entry(uint8_t *bytes, uint32_t kind) {
    uint32_t count = plan_get_u32(bytes + PLAN_AT_SECTION_COUNT);
    for (uint32_t i = 0; i < count && i < PLAN_SECTION_KIND_COUNT; i++) {
        uint8_t *entry = bytes + PLAN_HEADER_SIZE + (size_t)i * PLAN_DIRECTORY_ENTRY_SIZE;
        if (plan_get_u32(entry + PLAN_ENTRY_AT_KIND) == kind) return entry;
    }
    return NULL;
}

/* Section checksums, content hash (sections in directory order, each
 * followed by its kind and size, as plan_write.c hashes them), header
 * checksum (header and directory with the checksum field zero). */
static inline void plan_edit_reseal(uint8_t *bytes) {
    uint32_t count = plan_get_u32(bytes + PLAN_AT_SECTION_COUNT);
    if (count > PLAN_SECTION_KIND_COUNT) count = PLAN_SECTION_KIND_COUNT;
    XXH3_state_t *content = XXH3_createState();
    XXH3_128bits_reset(content);
    for (uint32_t i = 0; i < count; i++) {
        uint8_t *entry = bytes + PLAN_HEADER_SIZE + (size_t)i * PLAN_DIRECTORY_ENTRY_SIZE;
        uint32_t kind = plan_get_u32(entry + PLAN_ENTRY_AT_KIND);
        uint64_t offset = plan_get_u64(entry + PLAN_ENTRY_AT_OFFSET),
                 size = plan_get_u64(entry + PLAN_ENTRY_AT_SIZE);
        plan_put_u64(entry + PLAN_ENTRY_AT_CHECKSUM, XXH64(bytes + offset, size, 0));
        XXH3_128bits_update(content, bytes + offset, size);
        uint8_t framing[12];
        plan_put_u32(framing, kind);
        plan_put_u64(framing + 4, size);
        XXH3_128bits_update(content, framing, sizeof framing);
    }
    XXH128_hash_t hash = XXH3_128bits_digest(content);
    XXH3_freeState(content);
    plan_put_u64(bytes + PLAN_AT_CONTENT_HASH_LOW, hash.low64);
    plan_put_u64(bytes + PLAN_AT_CONTENT_HASH_HIGH, hash.high64);
    size_t header_bytes = PLAN_HEADER_SIZE + (size_t)count * PLAN_DIRECTORY_ENTRY_SIZE;
    plan_put_u64(bytes + PLAN_AT_HEADER_CHECKSUM, 0);
    plan_put_u64(bytes + PLAN_AT_HEADER_CHECKSUM, XXH64(bytes, header_bytes, 0));
}

#endif
