/* device.h - what the runtime needs from a device, as a small table of
 * functions (like a ggml backend). Errors are rt_error (error.h).
 *
 * Two devices implement it: host (device_host.c: the plan's host kernels on
 * the simulator, GEMMs on OpenBLAS) and cuda (device_cuda.c: the CUDA driver
 * API and cuBLASLt, both opened with dlopen). The executor (executor.c) runs
 * a program through this table and knows nothing else of either.
 *
 * Addresses. A device address is a `void *`: a host pointer on the host, a
 * CUdeviceptr on CUDA. The runtime never dereferences one; it only adds byte
 * offsets (rt_address_at) and hands them to the device. Every allocation is
 * zeroed.
 *
 * Kernel arguments. launch() gets `void **args`, args[i] pointing at the i-th
 * argument's value: a device address (8 bytes) or an int (4 bytes), which is
 * both what cuLaunchKernel wants and what a host entry of smelt_kernel.h
 * unpacks. A NULL follows the last argument.
 */
#ifndef SMELT_RT_DEVICE_H
#define SMELT_RT_DEVICE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <string.h>

#include "error.h"
#include "plan_format.h"
#include "program.h"
#include "smelt.h"

static inline void *rt_address_at(void *base, uint64_t offset) {
    return (void *)((uintptr_t)base + (uintptr_t)offset);
}

/* ---- The table ------------------------------------------------------------- */

typedef struct rt_device rt_device;

/* The kernels of a plan as a device loads them. */
typedef struct rt_kernel_set {
    const plan_kernel *kernels; /* [count]: names, sources, cubins, PTX */
    uint32_t count;
    const uint8_t *host_object; /* the HOST_KERNELS shared object, or NULL */
    uint64_t host_object_size;
    bool gemms; /* the program runs GEMMs: get them ready now (a missing BLAS fails here) */
} rt_kernel_set;

typedef struct rt_launch_dims {
    uint32_t grid[3];  /* blocks, each >= 1 */
    uint32_t block[3]; /* threads per block */
    uint32_t dynamic_shared_bytes;
} rt_launch_dims;

enum { RT_NOT_A_WEIGHT = UINT32_MAX };

/* Row-major C[m, n] = A[m, k] . op(B) (+ bias[n]), f32 accumulation; see
 * prog_gemm. Addresses are device addresses. */
typedef struct rt_gemm_args {
    int64_t m, n, k;
    smelt_dtype dtype_a, dtype_b, dtype_c, dtype_bias;
    bool b_transposed; /* B is [n, k] (C = A B^T); else [k, n] */
    bool has_bias;
    const void *a, *b, *bias;
    const void *residual; /* NULL, or [m, n] of dtype_c added to the product (beta = 1) */
    void *c;
    /* When B lies in a weight: its index and B's byte offset inside it, so a
     * device may use a copy it prepared (the host's f32 shadow of bf16). */
    uint32_t b_weight;
    uint64_t b_weight_offset;
    /* A scaled GEMM (prog_gemm.has_scales): A and B are codes (f8e4m3 or i8),
     * a_scale f32[m], b_scale [n] of dtype_b_scale (f16 or f32) at byte
     * offset b_scale_offset of weight b_weight; C[i, j] = a_scale[i]
     * b_scale[j] sum_k A[i, k] B[j, k] (+ bias) (+ residual). */
    bool has_scales;
    const void *a_scale, *b_scale;
    smelt_dtype dtype_b_scale;
    uint64_t b_scale_offset;
} rt_gemm_args;

typedef struct rt_device_ops {
    const char *kind; /* "host", "cuda" */

    /* Zeroed device memory of `bytes` (> 0). */
    smelt_status (*alloc)(rt_device *d, uint64_t bytes, void **out, rt_error *e);
    void (*free)(rt_device *d, void *address); /* NULL is harmless */
    smelt_status (*copy_in)(rt_device *d, void *dst, const void *host_src, uint64_t bytes, rt_error *e);
    /* Waits for the work before it: host_dst holds the bytes on return. */
    smelt_status (*copy_out)(rt_device *d, void *host_dst, const void *src, uint64_t bytes, rt_error *e);
    smelt_status (*zero)(rt_device *d, void *address, uint64_t bytes, rt_error *e);

    /* Makes kernels [0, count) of the set launchable by index. */
    smelt_status (*load_kernels)(rt_device *d, const rt_kernel_set *set, rt_error *e);
    smelt_status (*launch)(rt_device *d, uint32_t kernel, const rt_launch_dims *dims, void **args,
                           rt_error *e);
    smelt_status (*gemm)(rt_device *d, const rt_gemm_args *g, rt_error *e);
    smelt_status (*sync)(rt_device *d, rt_error *e);

    /* The device's name for messages: "host (2 workers)", "cuda:0 NVIDIA H100". */
    const char *(*name)(const rt_device *d);
    void (*destroy)(rt_device *d);

    /* ---- Optional members (NULL when the device has none) ---- */

    /* A device address for host memory that stays valid and unchanged while
     * the device lives, without a copy (the host: the pointer itself); NULL
     * when the device cannot use host memory in place. */
    void *(*map_host)(rt_device *d, const void *host, uint64_t bytes);
    /* Weight `index` now lives at `address` (bytes of `dtype`); `gemm_operand`
     * when a GEMM reads it as B. Called again when a weight is rebound. */
    smelt_status (*weight_bound)(rt_device *d, uint32_t index, const void *address, uint64_t bytes,
                                 smelt_dtype dtype, bool gemm_operand, rt_error *e);
    /* Records the launches and GEMMs that follow (not running them) until
     * capture_end, which keeps them as one graph; replay runs that graph. */
    smelt_status (*capture_begin)(rt_device *d, rt_error *e);
    smelt_status (*capture_end)(rt_device *d, rt_error *e);
    smelt_status (*replay)(rt_device *d, rt_error *e);
    /* The device's DRAM bandwidth, peaks and launch cost, for the choices
     * between a GEMV group's lowerings (plan/program.h, "Choices"); false,
     * or no member, when it has none to give (the host: the executor's fixed
     * rule). */
    bool (*figures)(const rt_device *d, prog_device_figures *out);
    /* Whether the device runs scaled GEMMs of A and B codes of `dtype`
     * (prog_gemm.has_scales; f8e4m3 or i8): asked once per plan, which then
     * runs its PROG_NEED_SCALED_GEMM instructions or their
     * PROG_NEED_NO_SCALED_GEMM kernels; no member: it does not. */
    bool (*runs_scaled_gemm)(rt_device *d, smelt_dtype dtype);
    /* Called for every scaled GEMM of a plan after its weights are bound
     * (again after a rebind), before any capture: the device may make what
     * the GEMM needs ready (an f32 copy of f16 weight scales, a cuBLASLt
     * plan). NULL: nothing to make. */
    smelt_status (*prepare_gemm)(rt_device *d, const rt_gemm_args *g, rt_error *e);
} rt_device_ops;

/* Every device struct starts with this. */
struct rt_device {
    const rt_device_ops *ops;
};

/* The host device: `workers` simulator threads (0: one per core). */
smelt_status rt_device_host_create(unsigned workers, rt_device **out, rt_error *e);

/* The CUDA device of ordinal `ordinal`. SMELT_ERROR_NO_DEVICE when there is no
 * driver (libcuda.so.1 cannot be opened), no GPU, or no such ordinal. The
 * libraries may be named by path in $SMELT_CUDA_DRIVER (else libcuda.so.1)
 * and $SMELT_CUBLASLT (else libcublasLt.so.13, .12, .so). */
smelt_status rt_device_cuda_create(int ordinal, rt_device **out, rt_error *e);

static inline void rt_device_destroy(rt_device *d) {
    if (d) d->ops->destroy(d);
}

#endif
