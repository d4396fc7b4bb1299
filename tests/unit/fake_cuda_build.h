/* fake_cuda_build.h - for tests that run runtime/device/device_cuda.c on the
 * stand-in driver: builds tests/unit/fake_cuda.c into a shared object that
 * plays libcuda.so.1 and libcublasLt.so (name it in $SMELT_CUDA_DRIVER and
 * $SMELT_CUBLASLT). Include it after cmocka.h. */
#ifndef SMELT_TEST_FAKE_CUDA_BUILD_H
#define SMELT_TEST_FAKE_CUDA_BUILD_H

#include "host_build.h"
#include "plan_scratch.h"

#include <stdio.h>
#include <stdlib.h>

/* Builds the stand-in into `folder`/fake_cuda.so and puts that path in `path`. */
static inline void fake_cuda_build(const char *folder, char *path, size_t path_size) {
    char *source = (char *)scratch_read(SMELT_SOURCE_DIR "/tests/unit/fake_cuda.c", NULL);
    cg_host_source sources[1] = {{"fake_cuda", source}};
    const char *const includes[] = {"-I" SMELT_SOURCE_DIR "/plan",        /* numeric.h */
                                    "-I" SMELT_SOURCE_DIR "/tests/unit"}; /* fake_cuda.h */
    cg_host_build_request req = {.sources = sources,
                                 .source_count = 1,
                                 .include_dir = SMELT_SOURCE_DIR "/runtime/sim", /* host_sim.h */
                                 .extra_flags = includes,
                                 .extra_flag_count = 2,
                                 .sanitize_address = cg_host_build_process_is_sanitized()};
    cg_host_object object;
    char error[2048];
    if (!cg_host_build(&req, NULL, &object, error, sizeof error)) fail_msg("fake driver build: %s", error);
    free(source);
    snprintf(path, path_size, "%s/fake_cuda.so", folder);
    scratch_write(path, object.bytes, object.size);
    cg_host_object_free(&object);
}

#endif
