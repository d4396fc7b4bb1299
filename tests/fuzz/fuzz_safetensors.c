/* fuzz_safetensors.c - the safetensors reader on arbitrary bytes (it maps
 * files, so each input goes through a temporary file). */
#include "fuzz.h"
#include "safetensors.h"

#include <stdlib.h>
#include <unistd.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    char path[] = "/tmp/smelt-fuzz-XXXXXX";
    int fd = mkstemp(path);
    if (fd < 0) return 0;
    size_t written = 0;
    while (written < size) {
        ssize_t n = write(fd, data + written, size - written);
        if (n <= 0) break;
        written += (size_t)n;
    }
    close(fd);
    diag_engine d;
    diag_init(&d, fuzz_null_stream());
    st_file f;
    if (st_file_open(path, &f, &d)) {
        for (uint32_t i = 0; i < f.tensor_count; i++) {
            const st_tensor *t = &f.tensors[i];
            if (st_dtype_is_float(t->dtype) && t->byte_size <= (1u << 20)) {
                float *values = malloc(t->byte_size * 4 + 4);
                uint64_t count = t->byte_size / (st_dtype_size(t->dtype) ? st_dtype_size(t->dtype) : 1);
                st_convert_to_f32(t->dtype, t->data, values, count);
                free(values);
            }
        }
        st_file_close(&f);
    }
    diag_free(&d);
    unlink(path);
    return 0;
}
