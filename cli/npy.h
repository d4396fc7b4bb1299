/* npy.h - writing NumPy .npy files (format 1.0): `--dump-logits`. */
#ifndef SMELT_CLI_NPY_H
#define SMELT_CLI_NPY_H

#include "diag.h"

#include <stdbool.h>
#include <stdint.h>

/* Writes a little-endian float32 array of shape [rows, cols], C order. */
bool npy_write_f32(const char *path, const float *data, uint64_t rows, uint64_t cols, diag_engine *d);

#endif
