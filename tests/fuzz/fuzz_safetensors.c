/* fuzz_safetensors.c - the safetensors reader on arbitrary bytes (it maps
 * files, so each input goes through a temporary file). */
#include "checkpoint.h"
#include "fuzz.h"
#include "quant_checkpoint.h"
#include "safetensors.h"

#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Every Linear the file may hold ("P.qweight", "P.weight") read under each
 * pre-quantized scheme (quant_checkpoint.h): refused or unpacked, never a
 * crash. */
static void read_quantized(const char *path, const st_file *f, diag_engine *d) {
    static const qck_scheme schemes[] = {
        {QCK_METHOD_AWQ,
         {QUANT_INT4, QUANT_METHOD_CHECKPOINT, 32, true, false, false, false},
         false,
         false,
         false},
        {QCK_METHOD_GPTQ,
         {QUANT_INT4, QUANT_METHOD_CHECKPOINT, 16, true, true, false, false},
         true,
         false,
         false},
        {QCK_METHOD_GPTQ,
         {QUANT_INT4, QUANT_METHOD_CHECKPOINT, 0, false, false, false, false},
         false,
         false,
         false},
        {QCK_METHOD_GPTQ,
         {QUANT_INT8, QUANT_METHOD_CHECKPOINT, 32, false, false, false, false},
         true,
         false,
         false},
        {QCK_METHOD_FP8,
         {QUANT_FP8, QUANT_METHOD_CHECKPOINT, 0, false, false, true, false},
         false,
         false,
         true},
        {QCK_METHOD_FP8,
         {QUANT_FP8, QUANT_METHOD_CHECKPOINT, 0, false, false, false, false},
         false,
         true,
         false},
    };
    st_checkpoint ck;
    if (!st_checkpoint_open(path, &ck, d)) return;
    for (uint32_t i = 0; i < f->tensor_count && i < 16; i++) {
        const char *name = f->tensors[i].name;
        const char *dot = strrchr(name, '.');
        if (!dot || strlen(name) > 900) continue;
        char weight[1024];
        snprintf(weight, sizeof weight, "%.*s.weight", (int)(dot - name), name);
        for (size_t s = 0; s < sizeof schemes / sizeof *schemes; s++) {
            qck_weight w;
            if (qck_read_weight(&schemes[s], &ck, weight, &w, d) == QCK_QUANTIZED) qck_weight_free(&w);
        }
    }
    st_checkpoint_close(&ck);
}

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
        read_quantized(path, &f, &d);
        st_file_close(&f);
    }
    diag_free(&d);
    unlink(path);
    return 0;
}
