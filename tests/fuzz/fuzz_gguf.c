/* fuzz_gguf.c - the GGUF reader on arbitrary bytes (it maps files, so each
 * input goes through a temporary file): the header checks, dequantization
 * of every tensor that fits in 1 MiB of f32, and the llama import (the
 * metadata as a config, the tensors as a checkpoint under Hugging Face
 * names, each read back through the q/k unpermutation). */
#include "fuzz.h"
#include "checkpoint.h"
#include "gguf.h"
#include "gguf_model.h"

#include <jansson.h>
#include <stdlib.h>
#include <unistd.h>

enum { FUZZ_MAX_VALUES = 1 << 18 };

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
    gguf_file f;
    if (gguf_file_open(path, &f, &d)) {
        for (uint32_t i = 0; i < f.tensor_count; i++) {
            const gguf_tensor *t = &f.tensors[i];
            if (t->element_count > FUZZ_MAX_VALUES) continue;
            float *values = malloc(t->element_count * sizeof *values + 4);
            if (values) gguf_tensor_read_f32(&f, t, values, 0, t->element_count, &d);
            free(values);
        }
        gguf_file_close(&f);
    }
    json_t *config = NULL;
    if (fe_gguf_config(path, &config, &d)) json_decref(config);
    st_checkpoint ck;
    if (st_checkpoint_open(path, &ck, &d)) {
        for (uint32_t i = 0; i < ck.tensor_count; i++) {
            const st_tensor *t = ck.tensors[i];
            uint64_t count = t->byte_size / st_dtype_size(t->dtype);
            if (count > FUZZ_MAX_VALUES) continue;
            float *values = malloc(count * sizeof *values + 4);
            if (values) st_tensor_read_f32(t, values, &d);
            free(values);
        }
        st_checkpoint_close(&ck);
    }
    diag_free(&d);
    unlink(path);
    return 0;
}
