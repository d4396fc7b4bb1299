/* npy.c - NumPy .npy writer, format version 1.0:
 *   "\x93NUMPY" 1 0, u16 header length, a Python dict literal padded with
 *   spaces and ended by '\n' so that the data starts at a multiple of 64,
 *   then the raw little-endian data. */
#include "npy.h"

#include <errno.h>
#include <stdio.h>
#include <string.h>

bool npy_write_f32(const char *path, const float *data, uint64_t rows, uint64_t cols, diag_engine *d) {
    char header[256];
    int n =
        snprintf(header, sizeof header, "{'descr': '<f4', 'fortran_order': False, 'shape': (%llu, %llu), }",
                 (unsigned long long)rows, (unsigned long long)cols);
    size_t preamble = 10; /* magic (6), version (2), header length (2) */
    size_t total = preamble + (size_t)n + 1;
    size_t padded = (total + 63) / 64 * 64;
    memset(header + n, ' ', padded - total);
    header[padded - preamble - 1] = '\n';
    uint16_t header_length = (uint16_t)(padded - preamble);

    FILE *f = fopen(path, "wb");
    if (!f) {
        diag_error(d, SMELT_NO_LOC, "cannot write '%s': %s", path, strerror(errno));
        return false;
    }
    unsigned char magic[10] = {0x93,
                               'N',
                               'U',
                               'M',
                               'P',
                               'Y',
                               1,
                               0,
                               (unsigned char)(header_length & 0xff),
                               (unsigned char)(header_length >> 8)};
    bool ok = fwrite(magic, 1, sizeof magic, f) == sizeof magic &&
              fwrite(header, 1, header_length, f) == header_length &&
              fwrite(data, sizeof(float), rows * cols, f) == rows * cols; /* x86-64/aarch64: little-endian */
    if (fclose(f) != 0) ok = false;
    if (!ok) diag_error(d, SMELT_NO_LOC, "cannot write '%s': %s", path, strerror(errno));
    return ok;
}
