/* fake_cuda.h - what tests/unit/fake_cuda.c tells a test about the last
 * cublasLtMatmul it was asked for (fake_cuda_last_matmul): the descriptor's
 * attributes, the layouts and the operands, as the runtime set them. */
#ifndef SMELT_FAKE_CUDA_H
#define SMELT_FAKE_CUDA_H

#include <stdint.h>

typedef struct fake_cuda_matmul_info {
    int32_t trans_a, trans_b; /* CUBLAS_OP_N 0, CUBLAS_OP_T 1 */
    uint32_t epilogue;        /* CUBLASLT_EPILOGUE_DEFAULT 1, _BIAS 4 */
    int32_t bias_type;        /* cudaDataType; -1: not set */
    const void *bias;
    int32_t a_scale_mode, b_scale_mode; /* cublasLtMatmulMatrixScale_t; -1: not set */
    const void *a_scale, *b_scale;      /* CUBLASLT_MATMUL_DESC_A/B_SCALE_POINTER */
    int type_a, type_b, type_c, type_d; /* the layouts' cudaDataType */
    uint64_t a_rows, a_cols, b_rows, b_cols, d_rows, d_cols;
    int64_t a_ld, b_ld, d_ld;
    float alpha, beta;
    const void *a, *b, *c;
    void *d;
} fake_cuda_matmul_info;

/* fake_cuda.c exports: void fake_cuda_last_matmul(fake_cuda_matmul_info *out). */
typedef void (*fake_cuda_last_matmul_fn)(fake_cuda_matmul_info *out);

#endif
