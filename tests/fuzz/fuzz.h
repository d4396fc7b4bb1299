/* fuzz.h - what smelt's fuzz harnesses share. Each harness defines
 * LLVMFuzzerTestOneInput for one parser of untrusted input. Built with
 * clang -fsanitize=fuzzer (cmake -DSMELT_FUZZ=ON) they are libFuzzer targets;
 * otherwise they link driver.c, which replays the files of a corpus folder,
 * and ctest runs every corpus that way (under ASan+UBSan in the sanitizer
 * build). */
#ifndef SMELT_FUZZ_H
#define SMELT_FUZZ_H

#include "diag.h"

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

/* A diag engine that prints nowhere: errors are the expected outcome. */
static inline FILE *fuzz_null_stream(void) {
    static FILE *null_stream;
    if (!null_stream) null_stream = fopen("/dev/null", "w");
    return null_stream;
}

#endif
