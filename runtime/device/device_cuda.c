/* device_cuda.c - the cuda device: the CUDA driver API and cuBLASLt, both
 * opened with dlopen when a device is created, never linked.
 *
 * So one smelt binary runs where there is no GPU or driver: there
 * dlopen("libcuda.so.1") fails and rt_device_cuda_create returns
 * SMELT_ERROR_NO_DEVICE with "no CUDA driver found", which lets "auto" pick
 * the host. This file does not include cuda.h or cublasLt.h (the runtime
 * builds without the toolkit): it declares the handful of types, constants
 * and function signatures it uses, copied from the CUDA 13 headers (the
 * driver ABI is stable: every function is resolved by its versioned symbol,
 * cuMemAlloc_v2 and so on, as cuda.h's #defines name them).
 *
 * Kernels: each kernel's cubin for the device's sm_XY is loaded with
 * cuModuleLoadData; without one, the newest PTX not above the device's
 * architecture is JIT-compiled by the driver. Launches go to one non-blocking
 * stream. Every driver call is checked, and a failure names the call, this
 * file's line and the CUDA error name.
 *
 * GEMMs: cuBLASLt with f32 accumulation (CUBLAS_COMPUTE_32F) for f32, bf16
 * and f16 operands (CUDA_R_16F). cuBLASLt is column-major; a row-major
 * C[M, N] is the column-major C^T[N, M] = op(B)^T A^T, so the call passes B
 * as cuBLASLt's A and A as its B (the usual transpose trick; see cuda_gemm).
 * Descriptors and the heuristic's algorithm are cached per shape.
 *
 * Scaled GEMMs (W8A8, prog_gemm.has_scales): cuBLASLt's FP8 GEMM with
 * outer-vector scales. With the same transpose trick, cuBLASLt's A is the
 * weight's E4M3 codes (op T: FP8 GEMMs take only the "TN" layout), its B
 * the activation's codes (op N), D of C's dtype; A_SCALE_MODE and
 * B_SCALE_MODE are CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F, so that
 * D[i, j] = a_scale[i] b_scale[j] sum_k A[k, i] B[k, j] in cuBLASLt's terms:
 * its A scale is the weight's per-channel scales (f32, its M = our N), its
 * B scale the activation's per-token ones (our M). Bias and residual as in
 * every GEMM. The device runs them (runs_scaled_gemm) on sm_89 and later
 * with a cuBLASLt of 12.9 or later (the first with outer-vector scales),
 * when a heuristic probe of a small such GEMM finds an algorithm; int8
 * codes never (their fallback kernels run). A weight's f16 scales are
 * copied once into an f32 buffer (prepare_gemm: copied out, widened,
 * copied into a buffer kept for that weight and offset, refilled in place
 * when the weight is bound again, so a captured graph's pointer stays good;
 * freed with the device). FP8 needs K a multiple of 16 and rows of C of a
 * multiple of 16 bytes: another shape is refused (SMELT_ERROR_UNSUPPORTED),
 * and the executor then runs the fallback kernels.
 *
 * Graphs: capture_begin/capture_end record a decode step's launches and
 * GEMMs on the stream (thread-local capture mode) into one CUDA graph;
 * replay launches it.
 */
#include "device.h"
#include "numeric.h"

#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ---- Driver API declarations (cuda.h, CUDA 13) ------------------------------ */

typedef int cu_result;
typedef int cu_device;
typedef unsigned long long cu_deviceptr;
typedef struct cu_context_opaque *cu_context;
typedef struct cu_module_opaque *cu_module;
typedef struct cu_function_opaque *cu_function;
typedef struct cu_stream_opaque *cu_stream;
typedef struct cu_graph_opaque *cu_graph;
typedef struct cu_graph_exec_opaque *cu_graph_exec;

enum {
    CU_SUCCESS = 0,
    CU_ERROR_OUT_OF_MEMORY = 2,
    CU_ERROR_NOT_INITIALIZED = 3,
    CU_ERROR_STUB_LIBRARY = 34,
    CU_ERROR_DEVICE_UNAVAILABLE = 46,
    CU_ERROR_NO_DEVICE = 100,
    CU_ERROR_SYSTEM_NOT_READY = 802,
    CU_ERROR_SYSTEM_DRIVER_MISMATCH = 803,
    CU_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE = 804,
    CU_DEVICE_ATTRIBUTE_CLOCK_RATE = 13, /* kHz */
    CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT = 16,
    CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE = 36,       /* kHz */
    CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH = 37, /* bits */
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR = 75,
    CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR = 76,
    CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES = 8,
    CU_STREAM_NON_BLOCKING = 1,
    CU_STREAM_CAPTURE_MODE_THREAD_LOCAL = 1,
    CUDA_STATIC_SHARED_LIMIT = 48 * 1024, /* above it, dynamic shared memory must be opted into */
};

/* X(member, symbol, return, parameters): every driver function we call. */
#define CUDA_DRIVER_FUNCTIONS(X)                                                                             \
    X(cuGetErrorName, "cuGetErrorName", cu_result, (cu_result error, const char **name))                     \
    X(cuInit, "cuInit", cu_result, (unsigned int flags))                                                     \
    X(cuDeviceGetCount, "cuDeviceGetCount", cu_result, (int *count))                                         \
    X(cuDeviceGet, "cuDeviceGet", cu_result, (cu_device * device, int ordinal))                              \
    X(cuDeviceGetName, "cuDeviceGetName", cu_result, (char *name, int length, cu_device device))             \
    X(cuDeviceGetAttribute, "cuDeviceGetAttribute", cu_result,                                               \
      (int *value, int attribute, cu_device device))                                                         \
    X(cuDevicePrimaryCtxRetain, "cuDevicePrimaryCtxRetain", cu_result, (cu_context * context, cu_device d))  \
    X(cuDevicePrimaryCtxRelease, "cuDevicePrimaryCtxRelease_v2", cu_result, (cu_device device))              \
    X(cuCtxSetCurrent, "cuCtxSetCurrent", cu_result, (cu_context context))                                   \
    X(cuStreamCreate, "cuStreamCreate", cu_result, (cu_stream * stream, unsigned int flags))                 \
    X(cuStreamDestroy, "cuStreamDestroy_v2", cu_result, (cu_stream stream))                                  \
    X(cuStreamSynchronize, "cuStreamSynchronize", cu_result, (cu_stream stream))                             \
    X(cuMemAlloc, "cuMemAlloc_v2", cu_result, (cu_deviceptr * address, size_t bytes))                        \
    X(cuMemFree, "cuMemFree_v2", cu_result, (cu_deviceptr address))                                          \
    X(cuMemcpyHtoDAsync, "cuMemcpyHtoDAsync_v2", cu_result,                                                  \
      (cu_deviceptr dst, const void *src, size_t bytes, cu_stream stream))                                   \
    X(cuMemcpyDtoHAsync, "cuMemcpyDtoHAsync_v2", cu_result,                                                  \
      (void *dst, cu_deviceptr src, size_t bytes, cu_stream stream))                                         \
    X(cuMemsetD8Async, "cuMemsetD8Async", cu_result,                                                         \
      (cu_deviceptr dst, unsigned char value, size_t count, cu_stream stream))                               \
    X(cuModuleLoadData, "cuModuleLoadData", cu_result, (cu_module * module, const void *image))              \
    X(cuModuleUnload, "cuModuleUnload", cu_result, (cu_module module))                                       \
    X(cuModuleGetFunction, "cuModuleGetFunction", cu_result,                                                 \
      (cu_function * function, cu_module module, const char *name))                                          \
    X(cuFuncSetAttribute, "cuFuncSetAttribute", cu_result, (cu_function function, int attribute, int value)) \
    X(cuLaunchKernel, "cuLaunchKernel", cu_result,                                                           \
      (cu_function f, unsigned int grid_x, unsigned int grid_y, unsigned int grid_z, unsigned int block_x,   \
       unsigned int block_y, unsigned int block_z, unsigned int shared_bytes, cu_stream stream,              \
       void **params, void **extra))                                                                         \
    X(cuStreamBeginCapture, "cuStreamBeginCapture_v2", cu_result, (cu_stream stream, int mode))              \
    X(cuStreamEndCapture, "cuStreamEndCapture", cu_result, (cu_stream stream, cu_graph * graph))             \
    X(cuGraphInstantiate, "cuGraphInstantiateWithFlags", cu_result,                                          \
      (cu_graph_exec * exec, cu_graph graph, unsigned long long flags))                                      \
    X(cuGraphLaunch, "cuGraphLaunch", cu_result, (cu_graph_exec exec, cu_stream stream))                     \
    X(cuGraphDestroy, "cuGraphDestroy", cu_result, (cu_graph graph))                                         \
    X(cuGraphExecDestroy, "cuGraphExecDestroy", cu_result, (cu_graph_exec exec))

typedef struct cuda_driver_api {
#define CUDA_MEMBER(member, symbol, ret, params) ret(*member) params;
    CUDA_DRIVER_FUNCTIONS(CUDA_MEMBER)
#undef CUDA_MEMBER
} cuda_driver_api;

/* ---- cuBLASLt declarations (cublasLt.h, library_types.h, CUDA 13) ---------- */

typedef int cublas_status;
typedef struct cublaslt_context *cublaslt_handle;
typedef struct cublaslt_matmul_desc_opaque *cublaslt_matmul_desc;
typedef struct cublaslt_matrix_layout_opaque *cublaslt_matrix_layout;
typedef struct cublaslt_preference_opaque *cublaslt_preference;

typedef struct cublaslt_algo {
    uint64_t data[8];
} cublaslt_algo;

/* cublasLtMatmulHeuristicResult_t, field for field. */
typedef struct cublaslt_heuristic_result {
    cublaslt_algo algo;
    size_t workspace_size;
    cublas_status state;
    float waves_count;
    int reserved[4];
} cublaslt_heuristic_result;

enum {
    CUBLAS_STATUS_SUCCESS = 0,
    CUBLAS_OP_N = 0,
    CUBLAS_OP_T = 1,
    CUBLAS_COMPUTE_32F = 68,
    CUDA_R_32F = 0,
    CUDA_R_16F = 2,
    CUDA_R_16BF = 14,
    CUDA_R_8F_E4M3 = 28,
    CUBLASLT_MATMUL_DESC_A_SCALE_POINTER = 17,
    CUBLASLT_MATMUL_DESC_B_SCALE_POINTER = 18,
    CUBLASLT_MATMUL_DESC_A_SCALE_MODE = 31,
    CUBLASLT_MATMUL_DESC_B_SCALE_MODE = 32,
    CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F = 3,
    CUBLASLT_OUTER_VEC_VERSION = 120900, /* cublasLtGetVersion's major * 10000 + minor * 100 + patch */
    SCALED_GEMM_MIN_ARCH = 89,           /* FP8 tensor cores: Ada, Hopper and later */
    CUBLASLT_MATMUL_DESC_TRANSA = 3,
    CUBLASLT_MATMUL_DESC_TRANSB = 4,
    CUBLASLT_MATMUL_DESC_EPILOGUE = 7,
    CUBLASLT_MATMUL_DESC_BIAS_POINTER = 8,
    CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE = 26,
    CUBLASLT_EPILOGUE_DEFAULT = 1,
    CUBLASLT_EPILOGUE_BIAS = 4,
    CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES = 1,
    CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES = 5, /* then B, C, D: 6, 7, 8 */
};

#define CUBLASLT_FUNCTIONS(X)                                                                                \
    X(create, "cublasLtCreate", cublas_status, (cublaslt_handle * handle))                                   \
    X(destroy, "cublasLtDestroy", cublas_status, (cublaslt_handle handle))                                   \
    X(status_name, "cublasLtGetStatusName", const char *, (cublas_status status))                            \
    X(get_version, "cublasLtGetVersion", size_t, (void))                                                     \
    X(desc_create, "cublasLtMatmulDescCreate", cublas_status,                                                \
      (cublaslt_matmul_desc * desc, int compute_type, int scale_type))                                       \
    X(desc_destroy, "cublasLtMatmulDescDestroy", cublas_status, (cublaslt_matmul_desc desc))                 \
    X(desc_set, "cublasLtMatmulDescSetAttribute", cublas_status,                                             \
      (cublaslt_matmul_desc desc, int attribute, const void *value, size_t size))                            \
    X(layout_create, "cublasLtMatrixLayoutCreate", cublas_status,                                            \
      (cublaslt_matrix_layout * layout, int type, uint64_t rows, uint64_t columns, int64_t leading))         \
    X(layout_destroy, "cublasLtMatrixLayoutDestroy", cublas_status, (cublaslt_matrix_layout layout))         \
    X(preference_create, "cublasLtMatmulPreferenceCreate", cublas_status,                                    \
      (cublaslt_preference * preference))                                                                    \
    X(preference_destroy, "cublasLtMatmulPreferenceDestroy", cublas_status,                                  \
      (cublaslt_preference preference))                                                                      \
    X(preference_set, "cublasLtMatmulPreferenceSetAttribute", cublas_status,                                 \
      (cublaslt_preference preference, int attribute, const void *value, size_t size))                       \
    X(heuristic, "cublasLtMatmulAlgoGetHeuristic", cublas_status,                                            \
      (cublaslt_handle handle, cublaslt_matmul_desc desc, cublaslt_matrix_layout a,                          \
       cublaslt_matrix_layout b, cublaslt_matrix_layout c, cublaslt_matrix_layout d,                         \
       cublaslt_preference preference, int requested, cublaslt_heuristic_result *results, int *returned))    \
    X(matmul, "cublasLtMatmul", cublas_status,                                                               \
      (cublaslt_handle handle, cublaslt_matmul_desc desc, const void *alpha, const void *a,                  \
       cublaslt_matrix_layout a_layout, const void *b, cublaslt_matrix_layout b_layout, const void *beta,    \
       const void *c, cublaslt_matrix_layout c_layout, void *d, cublaslt_matrix_layout d_layout,             \
       const cublaslt_algo *algo, void *workspace, size_t workspace_size, cu_stream stream))

typedef struct cublaslt_api {
#define CUBLASLT_MEMBER(member, symbol, ret, params) ret(*member) params;
    CUBLASLT_FUNCTIONS(CUBLASLT_MEMBER)
#undef CUBLASLT_MEMBER
} cublaslt_api;

/* ---- The device ------------------------------------------------------------- */

enum {
    GEMM_CACHE_SIZE = 64,
    GEMM_WORKSPACE_BYTES = 32 << 20, /* what cuBLASLt's heuristics may use */
};

/* One GEMM shape's descriptors and algorithm. The heuristic assumes 256-byte
 * aligned operands unless told otherwise, and arena offsets are often less
 * aligned, so the alignments are part of the shape. */
typedef struct gemm_plan {
    bool used;
    int64_t m, n, k;
    smelt_dtype dtype_a, dtype_c, dtype_bias;
    bool b_transposed, has_bias, has_scales;
    uint32_t alignment[4]; /* bytes: cuBLASLt's A (our B), B (our A), C, D */
    cublaslt_matmul_desc desc;
    cublaslt_matrix_layout layout_a, layout_b, layout_c; /* cuBLASLt's A (our B), B (our A), C = D */
    cublaslt_algo algo;
} gemm_plan;

/* The f32 copy of the f16 scales at byte `offset` of weight `weight`. */
typedef struct scale_copy {
    uint32_t weight;
    uint64_t offset;
    int64_t n;
    cu_deviceptr f32; /* [n] */
} scale_copy;

typedef struct cuda_device {
    rt_device base;
    void *driver_library;
    cuda_driver_api api;
    cu_device device;
    cu_context context;
    bool context_retained;
    cu_stream stream;
    int arch; /* 90 for sm_90 */
    char name[160];
    prog_device_figures figures; /* from the device's attributes (device_figures); bandwidth 0: none */

    cu_module *modules;     /* [kernel_count] */
    cu_function *functions; /* [kernel_count] */
    uint32_t kernel_count;

    void *cublaslt_library;
    bool lt_ready; /* library, handle, preference and workspace all set up */
    cublaslt_api lt;
    cublaslt_handle lt_handle;
    cublaslt_preference lt_preference;
    cu_deviceptr workspace;
    gemm_plan gemm_plans[GEMM_CACHE_SIZE];
    uint32_t gemm_next_victim;
    int scaled_fp8;           /* runs FP8 scaled GEMMs: -1 not asked yet, 0 no, 1 yes */
    scale_copy *scale_copies; /* [scale_copy_count]: f32 copies of weights' f16 scales */
    uint32_t scale_copy_count;

    cu_graph graph;
    cu_graph_exec graph_exec;
} cuda_device;

static const char *file_base(const char *path) {
    const char *slash = strrchr(path, '/');
    return slash ? slash + 1 : path;
}

static smelt_status cuda_check(const cuda_device *d, cu_result r, const char *call, const char *file,
                               int line, rt_error *e) {
    if (r == CU_SUCCESS) return SMELT_OK;
    const char *name = NULL;
    if (d->api.cuGetErrorName) d->api.cuGetErrorName(r, &name);
    smelt_status status = r == CU_ERROR_OUT_OF_MEMORY ? SMELT_ERROR_OUT_OF_MEMORY : SMELT_ERROR_DEVICE;
    return rt_fail(e, status, "%s:%d: %s failed: %s (%d)", file_base(file), line, call,
                   name ? name : "CUDA_ERROR_UNKNOWN", r);
}

/* CU_CALL(d, cuMemAlloc, (&address, bytes), e): call, check, name it. */
#define CU_CALL(d, function, arguments, e)                                                                   \
    cuda_check((d), (d)->api.function arguments, #function, __FILE__, __LINE__, (e))

static smelt_status cublas_check(const cuda_device *d, cublas_status s, const char *call, const char *file,
                                 int line, rt_error *e) {
    if (s == CUBLAS_STATUS_SUCCESS) return SMELT_OK;
    const char *name = d->lt.status_name ? d->lt.status_name(s) : NULL;
    return rt_fail(e, SMELT_ERROR_DEVICE, "%s:%d: %s failed: %s (%d)", file_base(file), line, call,
                   name ? name : "CUBLAS_STATUS_UNKNOWN", s);
}

#define LT_CALL(d, function, arguments, e)                                                                   \
    cublas_check((d), (d)->lt.function arguments, "cuBLASLt " #function, __FILE__, __LINE__, (e))

static cuda_device *as_cuda(rt_device *d) { return (cuda_device *)d; }

/* The device's context, made current on the calling thread: an engine may
 * move between threads (one at a time), and the driver's current context is
 * per thread. Every entry point that starts a step or touches memory calls it;
 * launches and GEMMs follow such a call on the same thread. */
static cuda_device *current(rt_device *device) {
    cuda_device *d = (cuda_device *)device;
    d->api.cuCtxSetCurrent(d->context);
    return d;
}
static cu_deviceptr as_deviceptr(const void *address) { return (cu_deviceptr)(uintptr_t)address; }

/* ---- Memory ------------------------------------------------------------------ */

static smelt_status cuda_alloc(rt_device *device, uint64_t bytes, void **out, rt_error *e) {
    cuda_device *d = current(device);
    cu_deviceptr address = 0;
    smelt_status s = CU_CALL(d, cuMemAlloc, (&address, bytes), e);
    if (s != SMELT_OK) return s;
    s = CU_CALL(d, cuMemsetD8Async, (address, 0, bytes, d->stream), e);
    if (s != SMELT_OK) {
        d->api.cuMemFree(address);
        return s;
    }
    *out = (void *)(uintptr_t)address;
    return SMELT_OK;
}

static void cuda_free(rt_device *device, void *address) {
    cuda_device *d = current(device);
    if (!address) return;
    d->api.cuStreamSynchronize(d->stream); /* the memory may still be in use by queued work */
    d->api.cuMemFree(as_deviceptr(address));
}

static smelt_status cuda_copy_in(rt_device *device, void *dst, const void *src, uint64_t bytes, rt_error *e) {
    cuda_device *d = current(device);
    /* From pageable memory the call returns once src has been staged, so the
     * caller may reuse src at once. */
    return CU_CALL(d, cuMemcpyHtoDAsync, (as_deviceptr(dst), src, bytes, d->stream), e);
}

static smelt_status cuda_copy_out(rt_device *device, void *dst, const void *src, uint64_t bytes,
                                  rt_error *e) {
    cuda_device *d = current(device);
    smelt_status s = CU_CALL(d, cuMemcpyDtoHAsync, (dst, as_deviceptr(src), bytes, d->stream), e);
    if (s != SMELT_OK) return s;
    return CU_CALL(d, cuStreamSynchronize, (d->stream), e);
}

static smelt_status cuda_zero(rt_device *device, void *address, uint64_t bytes, rt_error *e) {
    cuda_device *d = current(device);
    return CU_CALL(d, cuMemsetD8Async, (as_deviceptr(address), 0, bytes, d->stream), e);
}

static smelt_status cuda_sync(rt_device *device, rt_error *e) {
    cuda_device *d = current(device);
    return CU_CALL(d, cuStreamSynchronize, (d->stream), e);
}

/* ---- Kernels ------------------------------------------------------------------- */

/* "sm_90", "compute_90", "sm_90a" -> 90; -1 when it is none of those. */
static int arch_number(plan_text arch) {
    const char *s = arch.data;
    uint64_t n = arch.length, at;
    if (n > 3 && memcmp(s, "sm_", 3) == 0)
        at = 3;
    else if (n > 8 && memcmp(s, "compute_", 8) == 0)
        at = 8;
    else
        return -1;
    int value = 0;
    uint64_t digits = 0;
    while (at < n && s[at] >= '0' && s[at] <= '9' && digits < 4) {
        value = value * 10 + (s[at++] - '0');
        digits++;
    }
    if (digits == 0) return -1;
    if (at < n && !(at + 1 == n && (s[at] == 'a' || s[at] == 'f'))) return -1;
    return value;
}

/* The kernel's cubin for exactly this arch (sm_90 or sm_90a on an sm_90
 * GPU), else the newest PTX at or below it, which the driver JIT-compiles. */
static const plan_kernel_binary *choose_binary(const plan_kernel *k, int device_arch) {
    const plan_kernel_binary *ptx = NULL;
    int ptx_arch = -1;
    for (uint32_t i = 0; i < k->binary_count; i++) {
        const plan_kernel_binary *b = &k->binaries[i];
        int arch = arch_number(b->arch);
        if (b->kind == PLAN_BINARY_CUBIN && arch == device_arch) return b;
        /* "compute_90a" PTX uses features of sm_90 alone. */
        bool arch_specific = arch >= 0 && b->arch.data[b->arch.length - 1] >= 'a';
        if (arch_specific && arch != device_arch) continue;
        if (b->kind == PLAN_BINARY_PTX && arch >= 0 && arch <= device_arch && arch > ptx_arch) {
            ptx = b;
            ptx_arch = arch;
        }
    }
    return ptx;
}

static smelt_status load_one_kernel(cuda_device *d, uint32_t index, const plan_kernel *k, rt_error *e) {
    const plan_kernel_binary *binary = choose_binary(k, d->arch);
    int name_length = (int)(k->name.length > 64 ? 64 : k->name.length);
    if (!binary)
        return rt_fail(e, SMELT_ERROR_UNSUPPORTED,
                       "kernel '%.*s' has no cubin for sm_%d and no PTX for an architecture at or below it: "
                       "compile the plan with --target sm_%d",
                       name_length, k->name.data, d->arch, d->arch);
    /* The driver wants PTX NUL-terminated and the name as a C string. */
    char *name = malloc(k->name.length + 1);
    uint8_t *image = NULL;
    if (binary->kind == PLAN_BINARY_PTX) image = malloc(binary->bytes.size + 1);
    if (!name || (binary->kind == PLAN_BINARY_PTX && !image)) {
        free(name);
        free(image);
        return rt_fail(e, SMELT_ERROR_OUT_OF_MEMORY, "out of memory loading kernel '%.*s'", name_length,
                       k->name.data);
    }
    memcpy(name, k->name.data, k->name.length);
    name[k->name.length] = '\0';
    if (image) {
        memcpy(image, binary->bytes.data, binary->bytes.size);
        image[binary->bytes.size] = 0;
    }
    smelt_status s =
        CU_CALL(d, cuModuleLoadData, (&d->modules[index], image ? image : binary->bytes.data), e);
    if (s == SMELT_OK)
        s = CU_CALL(d, cuModuleGetFunction, (&d->functions[index], d->modules[index], name), e);
    if (s == SMELT_OK && k->launch.dynamic_shared_bytes > CUDA_STATIC_SHARED_LIMIT)
        s = CU_CALL(d, cuFuncSetAttribute,
                    (d->functions[index], CU_FUNC_ATTRIBUTE_MAX_DYNAMIC_SHARED_SIZE_BYTES,
                     (int)k->launch.dynamic_shared_bytes),
                    e);
    if (s != SMELT_OK && e) {
        char reason[RT_ERROR_MESSAGE_SIZE];
        memcpy(reason, e->message, sizeof reason);
        rt_fail(e, s, "loading kernel '%.*s' (%s for %.*s): %s", name_length, k->name.data,
                plan_binary_kind_name(binary->kind), (int)binary->arch.length, binary->arch.data, reason);
    }
    free(name);
    free(image);
    return s;
}

static void unload_kernels(cuda_device *d) {
    for (uint32_t i = 0; i < d->kernel_count; i++)
        if (d->modules[i]) d->api.cuModuleUnload(d->modules[i]);
    free(d->modules);
    free(d->functions);
    d->modules = NULL;
    d->functions = NULL;
    d->kernel_count = 0;
}

static smelt_status load_cublaslt(cuda_device *d, rt_error *e);

static smelt_status cuda_load_kernels(rt_device *device, const rt_kernel_set *set, rt_error *e) {
    cuda_device *d = current(device);
    unload_kernels(d);
    if (set->gemms) {
        smelt_status s = load_cublaslt(d, e);
        if (s != SMELT_OK) return s;
    }
    if (set->count == 0) return SMELT_OK;
    d->modules = calloc(set->count, sizeof *d->modules);
    d->functions = calloc(set->count, sizeof *d->functions);
    if (!d->modules || !d->functions) {
        unload_kernels(d);
        return rt_fail(e, SMELT_ERROR_OUT_OF_MEMORY, "out of memory for %u kernels", set->count);
    }
    d->kernel_count = set->count;
    for (uint32_t i = 0; i < set->count; i++) {
        smelt_status s = load_one_kernel(d, i, &set->kernels[i], e);
        if (s != SMELT_OK) {
            unload_kernels(d);
            return s;
        }
    }
    return SMELT_OK;
}

static smelt_status cuda_launch(rt_device *device, uint32_t kernel, const rt_launch_dims *dims, void **args,
                                rt_error *e) {
    cuda_device *d = as_cuda(device);
    if (kernel >= d->kernel_count)
        return rt_fail(e, SMELT_ERROR_BAD_PLAN, "kernel %u is not loaded (%u kernels)", kernel,
                       d->kernel_count);
    return CU_CALL(d, cuLaunchKernel,
                   (d->functions[kernel], dims->grid[0], dims->grid[1], dims->grid[2], dims->block[0],
                    dims->block[1], dims->block[2], dims->dynamic_shared_bytes, d->stream, args, NULL),
                   e);
}

/* ---- GEMM through cuBLASLt ----------------------------------------------------- */

static smelt_status load_cublaslt(cuda_device *d, rt_error *e) {
    if (d->lt_ready) return SMELT_OK;
    if (d->cublaslt_library) /* an earlier attempt failed part way */
        return rt_fail(e, SMELT_ERROR_UNSUPPORTED, "cuBLASLt could not be set up (see the first error)");
    const char *override = getenv("SMELT_CUBLASLT");
    const char *names[] = {"libcublasLt.so.13", "libcublasLt.so.12", "libcublasLt.so"};
    if (override && *override) d->cublaslt_library = dlopen(override, RTLD_NOW | RTLD_LOCAL);
    for (size_t i = 0; i < sizeof names / sizeof names[0] && !d->cublaslt_library && !(override && *override);
         i++)
        d->cublaslt_library = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!d->cublaslt_library)
        return rt_fail(
            e, SMELT_ERROR_UNSUPPORTED,
            "cuBLASLt not found (%s): the plan's matrix products need it; install the CUDA toolkit's "
            "cuBLAS or add its folder to LD_LIBRARY_PATH",
            override && *override ? override : "libcublasLt.so.13");
#define CUBLASLT_RESOLVE(member, symbol, ret, params)                                                        \
    *(void **)&d->lt.member = dlsym(d->cublaslt_library, symbol);                                            \
    if (!d->lt.member)                                                                                       \
        return rt_fail(e, SMELT_ERROR_UNSUPPORTED, "cuBLASLt lacks %s: it is too old for this smelt", symbol);
    CUBLASLT_FUNCTIONS(CUBLASLT_RESOLVE)
#undef CUBLASLT_RESOLVE
    smelt_status s = LT_CALL(d, create, (&d->lt_handle), e);
    if (s == SMELT_OK) s = LT_CALL(d, preference_create, (&d->lt_preference), e);
    uint64_t workspace = GEMM_WORKSPACE_BYTES;
    if (s == SMELT_OK)
        s = LT_CALL(
            d, preference_set,
            (d->lt_preference, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &workspace, sizeof workspace), e);
    if (s == SMELT_OK) s = CU_CALL(d, cuMemAlloc, (&d->workspace, GEMM_WORKSPACE_BYTES), e);
    d->lt_ready = s == SMELT_OK;
    return s;
}

static void gemm_plan_release(cuda_device *d, gemm_plan *p) {
    if (!p->used) return;
    if (p->layout_a) d->lt.layout_destroy(p->layout_a);
    if (p->layout_b) d->lt.layout_destroy(p->layout_b);
    if (p->layout_c) d->lt.layout_destroy(p->layout_c);
    if (p->desc) d->lt.desc_destroy(p->desc);
    memset(p, 0, sizeof *p);
}

static int cuda_type(smelt_dtype t) {
    return t == SMELT_DTYPE_BF16     ? CUDA_R_16BF
           : t == SMELT_DTYPE_F16    ? CUDA_R_16F
           : t == SMELT_DTYPE_F8E4M3 ? CUDA_R_8F_E4M3
                                     : CUDA_R_32F;
}

/* The largest power of two up to 256 that divides the address. */
static uint32_t alignment_of(const void *address) {
    uintptr_t a = (uintptr_t)address | 256u;
    return (uint32_t)(a & -a);
}

static void gemm_alignments(const rt_gemm_args *g, uint32_t out[4]) {
    out[0] = alignment_of(g->b);
    out[1] = alignment_of(g->a);
    out[2] = alignment_of(g->residual ? g->residual : g->c); /* C: the residual read, when there is one */
    out[3] = alignment_of(g->c);                             /* D: the output */
}

/* The outer-vector scale modes of a scaled GEMM (the file's comment). */
static smelt_status set_scale_modes(cuda_device *d, cublaslt_matmul_desc desc, rt_error *e) {
    int32_t mode = CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F;
    smelt_status s = LT_CALL(d, desc_set, (desc, CUBLASLT_MATMUL_DESC_A_SCALE_MODE, &mode, sizeof mode), e);
    if (s == SMELT_OK)
        s = LT_CALL(d, desc_set, (desc, CUBLASLT_MATMUL_DESC_B_SCALE_MODE, &mode, sizeof mode), e);
    return s;
}

/* Descriptors and algorithm for one shape, column-major view:
 * D^T[n, m] = op(B)^T [n, k] x A^T [k, m]. Our B is cuBLASLt's A: stored
 * [n, k] row-major (b_transposed) it is column-major k x n with ld k, used
 * transposed; stored [k, n] it is column-major n x k with ld n, used as is.
 * Our A [m, k] row-major is column-major k x m with ld k. A scaled GEMM's B
 * is always [n, k] (program_decode), so its FP8 product is "TN". */
static smelt_status gemm_plan_make(cuda_device *d, const rt_gemm_args *g, gemm_plan *p, rt_error *e) {
    memset(p, 0, sizeof *p);
    p->used = true;
    p->m = g->m, p->n = g->n, p->k = g->k;
    p->dtype_a = g->dtype_a, p->dtype_c = g->dtype_c, p->dtype_bias = g->dtype_bias;
    p->b_transposed = g->b_transposed, p->has_bias = g->has_bias, p->has_scales = g->has_scales;
    gemm_alignments(g, p->alignment);
    int32_t trans_a = g->b_transposed ? CUBLAS_OP_T : CUBLAS_OP_N, trans_b = CUBLAS_OP_N;
    uint32_t epilogue = g->has_bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT;
    int32_t bias_type = cuda_type(g->dtype_bias);
    smelt_status s = LT_CALL(d, desc_create, (&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F), e);
    if (s == SMELT_OK)
        s = LT_CALL(d, desc_set, (p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &trans_a, sizeof trans_a), e);
    if (s == SMELT_OK)
        s = LT_CALL(d, desc_set, (p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &trans_b, sizeof trans_b), e);
    if (s == SMELT_OK)
        s = LT_CALL(d, desc_set, (p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epilogue, sizeof epilogue), e);
    if (s == SMELT_OK && g->has_bias)
        s = LT_CALL(d, desc_set, (p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bias_type, sizeof bias_type),
                    e);
    if (s == SMELT_OK && g->has_scales) s = set_scale_modes(d, p->desc, e);
    uint64_t m = (uint64_t)g->m, n = (uint64_t)g->n, k = (uint64_t)g->k;
    if (s == SMELT_OK)
        s = g->b_transposed
                ? LT_CALL(d, layout_create, (&p->layout_a, cuda_type(g->dtype_b), k, n, (int64_t)k), e)
                : LT_CALL(d, layout_create, (&p->layout_a, cuda_type(g->dtype_b), n, k, (int64_t)n), e);
    if (s == SMELT_OK)
        s = LT_CALL(d, layout_create, (&p->layout_b, cuda_type(g->dtype_a), k, m, (int64_t)k), e);
    if (s == SMELT_OK)
        s = LT_CALL(d, layout_create, (&p->layout_c, cuda_type(g->dtype_c), n, m, (int64_t)n), e);
    for (int i = 0; i < 4 && s == SMELT_OK; i++)
        s = LT_CALL(d, preference_set,
                    (d->lt_preference, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES + i, &p->alignment[i],
                     sizeof p->alignment[i]),
                    e);
    cublaslt_heuristic_result result;
    int found = 0;
    if (s == SMELT_OK)
        s = LT_CALL(d, heuristic,
                    (d->lt_handle, p->desc, p->layout_a, p->layout_b, p->layout_c, p->layout_c,
                     d->lt_preference, 1, &result, &found),
                    e);
    if (s == SMELT_OK && found < 1)
        s = rt_fail(e, SMELT_ERROR_UNSUPPORTED,
                    "cuBLASLt has no algorithm for a %lld x %lld x %lld %sproduct of %s x %s -> %s",
                    (long long)g->m, (long long)g->n, (long long)g->k, g->has_scales ? "scaled " : "",
                    smelt_dtype_name(g->dtype_a), smelt_dtype_name(g->dtype_b), smelt_dtype_name(g->dtype_c));
    if (s != SMELT_OK) {
        gemm_plan_release(d, p);
        return s;
    }
    p->algo = result.algo;
    return SMELT_OK;
}

static gemm_plan *gemm_plan_find(cuda_device *d, const rt_gemm_args *g) {
    uint32_t alignment[4];
    gemm_alignments(g, alignment);
    for (int i = 0; i < GEMM_CACHE_SIZE; i++) {
        gemm_plan *p = &d->gemm_plans[i];
        if (p->used && p->m == g->m && p->n == g->n && p->k == g->k && p->dtype_a == g->dtype_a &&
            p->dtype_c == g->dtype_c && p->b_transposed == g->b_transposed && p->has_bias == g->has_bias &&
            p->has_scales == g->has_scales && (!g->has_bias || p->dtype_bias == g->dtype_bias) &&
            memcmp(p->alignment, alignment, sizeof alignment) == 0)
            return p;
    }
    return NULL;
}

/* The cached plan of g's shape, made when there is none. */
static smelt_status gemm_plan_get(cuda_device *d, const rt_gemm_args *g, gemm_plan **out, rt_error *e) {
    gemm_plan *p = gemm_plan_find(d, g);
    if (!p) {
        p = &d->gemm_plans[d->gemm_next_victim];
        d->gemm_next_victim = (d->gemm_next_victim + 1) % GEMM_CACHE_SIZE;
        gemm_plan_release(d, p);
        smelt_status s = gemm_plan_make(d, g, p, e);
        if (s != SMELT_OK) return s;
    }
    *out = p;
    return SMELT_OK;
}

/* ---- Scaled GEMMs (FP8, outer-vector scales) ------------------------------------- */

/* Does cuBLASLt find an algorithm for a small FP8 GEMM with outer-vector
 * scales (64 x 64 x 64, bf16 out)? The heuristic reads no memory, so the
 * operands' addresses are stand-ins (256-byte aligned). */
static bool probe_scaled_fp8(cuda_device *d) {
    void *aligned = (void *)(uintptr_t)256;
    rt_gemm_args g = {.m = 64,
                      .n = 64,
                      .k = 64,
                      .dtype_a = SMELT_DTYPE_F8E4M3,
                      .dtype_b = SMELT_DTYPE_F8E4M3,
                      .dtype_c = SMELT_DTYPE_BF16,
                      .dtype_bias = SMELT_DTYPE_BF16,
                      .b_transposed = true,
                      .a = aligned,
                      .b = aligned,
                      .c = aligned,
                      .has_scales = true};
    gemm_plan p;
    rt_error ignored = {0};
    if (gemm_plan_make(d, &g, &p, &ignored) != SMELT_OK) return false;
    gemm_plan_release(d, &p);
    return true;
}

static bool cuda_runs_scaled_gemm(rt_device *device, smelt_dtype dtype) {
    cuda_device *d = current(device);
    if (dtype != SMELT_DTYPE_F8E4M3) return false; /* int8 scaled GEMMs: the fallback kernels */
    if (d->scaled_fp8 < 0) {
        rt_error ignored = {0};
        d->scaled_fp8 = d->arch >= SCALED_GEMM_MIN_ARCH && load_cublaslt(d, &ignored) == SMELT_OK &&
                        d->lt.get_version() >= CUBLASLT_OUTER_VEC_VERSION && probe_scaled_fp8(d);
    }
    return d->scaled_fp8 == 1;
}

static scale_copy *scale_copy_find(cuda_device *d, uint32_t weight, uint64_t offset) {
    for (uint32_t i = 0; i < d->scale_copy_count; i++)
        if (d->scale_copies[i].weight == weight && d->scale_copies[i].offset == offset)
            return &d->scale_copies[i];
    return NULL;
}

/* What cuBLASLt's FP8 GEMM needs of a shape (cublasLt.h): K a multiple of
 * 16 (the leading dimensions of A and B are K bytes) and C's and D's rows
 * a multiple of 16 bytes. */
static smelt_status check_scaled_shape(const rt_gemm_args *g, rt_error *e) {
    if (g->dtype_a != SMELT_DTYPE_F8E4M3 || g->dtype_b != SMELT_DTYPE_F8E4M3 || !g->b_transposed)
        return rt_fail(e, SMELT_ERROR_UNSUPPORTED,
                       "cuBLASLt runs scaled products of f8e4m3 [M, K] x [N, K] only");
    if (g->k % 16 != 0 || ((uint64_t)g->n * smelt_dtype_element_bytes(g->dtype_c)) % 16 != 0)
        return rt_fail(
            e, SMELT_ERROR_UNSUPPORTED,
            "cuBLASLt's FP8 product needs K a multiple of 16 and rows of C of a multiple of 16 bytes "
            "(K = %lld, N = %lld of %s)",
            (long long)g->k, (long long)g->n, smelt_dtype_name(g->dtype_c));
    return SMELT_OK;
}

/* The f32 copy of g's f16 weight scales, refilled from the weight as it is
 * now (made on the first call). */
static smelt_status fill_scale_copy(cuda_device *d, const rt_gemm_args *g, rt_error *e) {
    scale_copy *copy = scale_copy_find(d, g->b_weight, g->b_scale_offset);
    if (copy && copy->n != g->n)
        return rt_fail(e, SMELT_ERROR_BAD_PLAN, "weight %u's scales at %llu are read as %lld and %lld values",
                       g->b_weight, (unsigned long long)g->b_scale_offset, (long long)copy->n,
                       (long long)g->n);
    uint64_t n = (uint64_t)g->n;
    uint16_t *halves = malloc(n * sizeof *halves);
    float *floats = malloc(n * sizeof *floats);
    smelt_status s = halves && floats ? SMELT_OK
                                      : rt_fail(e, SMELT_ERROR_OUT_OF_MEMORY,
                                                "out of memory widening %lld scales", (long long)g->n);
    if (s == SMELT_OK) s = cuda_copy_out(&d->base, halves, g->b_scale, n * sizeof *halves, e);
    if (s == SMELT_OK) plan_f16_row_to_f32(halves, floats, n);
    if (s == SMELT_OK && !copy) {
        scale_copy *grown = realloc(d->scale_copies, (d->scale_copy_count + 1) * sizeof *grown);
        if (!grown)
            s = rt_fail(e, SMELT_ERROR_OUT_OF_MEMORY, "out of memory for the f32 copies of weight scales");
        else {
            d->scale_copies = grown;
            copy = &grown[d->scale_copy_count];
            *copy = (scale_copy){g->b_weight, g->b_scale_offset, g->n, 0};
            s = CU_CALL(d, cuMemAlloc, (&copy->f32, n * sizeof *floats), e);
            if (s == SMELT_OK) d->scale_copy_count++;
        }
    }
    if (s == SMELT_OK)
        s = CU_CALL(d, cuMemcpyHtoDAsync, (copy->f32, floats, n * sizeof *floats, d->stream), e);
    if (s == SMELT_OK) s = CU_CALL(d, cuStreamSynchronize, (d->stream), e); /* floats is freed below */
    free(halves);
    free(floats);
    return s;
}

/* The f32 scales of the weight cuBLASLt reads (its A scale). */
static smelt_status weight_scales_f32(cuda_device *d, const rt_gemm_args *g, const void **out, rt_error *e) {
    if (g->dtype_b_scale == SMELT_DTYPE_F32) {
        *out = g->b_scale;
        return SMELT_OK;
    }
    scale_copy *copy = scale_copy_find(d, g->b_weight, g->b_scale_offset);
    if (!copy || copy->n != g->n)
        return rt_fail(
            e, SMELT_ERROR_DEVICE,
            "the scaled product reading weight %u was not prepared (prepare_gemm): its f16 scales have "
            "no f32 copy",
            g->b_weight);
    *out = (const void *)(uintptr_t)copy->f32;
    return SMELT_OK;
}

static smelt_status cuda_prepare_gemm(rt_device *device, const rt_gemm_args *g, rt_error *e) {
    cuda_device *d = current(device);
    if (!g->has_scales) return SMELT_OK;
    smelt_status s = check_scaled_shape(g, e);
    if (s == SMELT_OK) s = load_cublaslt(d, e);
    if (s == SMELT_OK && g->dtype_b_scale != SMELT_DTYPE_F32) {
        if (g->b_weight == RT_NOT_A_WEIGHT || g->dtype_b_scale != SMELT_DTYPE_F16)
            return rt_fail(e, SMELT_ERROR_UNSUPPORTED,
                           "a scaled product's b_scale must be a weight's f16 or f32");
        s = fill_scale_copy(d, g, e);
    }
    gemm_plan *plan;
    if (s == SMELT_OK) s = gemm_plan_get(d, g, &plan, e); /* warm: the heuristic runs outside any capture */
    return s;
}

static smelt_status cuda_gemm(rt_device *device, const rt_gemm_args *g, rt_error *e) {
    cuda_device *d = as_cuda(device);
    if (g->dtype_a != g->dtype_b)
        return rt_fail(e, SMELT_ERROR_UNSUPPORTED,
                       "cuBLASLt products need A and B of one dtype (got %s and %s)",
                       smelt_dtype_name(g->dtype_a), smelt_dtype_name(g->dtype_b));
    smelt_status s = load_cublaslt(d, e);
    if (s != SMELT_OK) return s;
    const void *weight_scales = NULL;
    if (g->has_scales && ((s = check_scaled_shape(g, e)) != SMELT_OK ||
                          (s = weight_scales_f32(d, g, &weight_scales, e)) != SMELT_OK))
        return s;
    gemm_plan *p;
    if ((s = gemm_plan_get(d, g, &p, e)) != SMELT_OK) return s;
    if (g->has_bias) {
        const void *bias = g->bias;
        if ((s = LT_CALL(d, desc_set, (p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &bias, sizeof bias), e)) !=
            SMELT_OK)
            return s;
    }
    if (g->has_scales) { /* cuBLASLt's A is our B: its scales are the weight's, its B's the tokens' */
        const void *token_scales = g->a_scale;
        if ((s = LT_CALL(
                 d, desc_set,
                 (p->desc, CUBLASLT_MATMUL_DESC_A_SCALE_POINTER, &weight_scales, sizeof weight_scales), e)) !=
                SMELT_OK ||
            (s = LT_CALL(d, desc_set,
                         (p->desc, CUBLASLT_MATMUL_DESC_B_SCALE_POINTER, &token_scales, sizeof token_scales),
                         e)) != SMELT_OK)
            return s;
    }
    /* D = A B (+ bias) + beta C: C is the residual (beta 1), or D itself unread (beta 0). */
    const float alpha = 1.0f, beta = g->residual ? 1.0f : 0.0f;
    const void *c = g->residual ? g->residual : g->c;
    return LT_CALL(d, matmul,
                   (d->lt_handle, p->desc, &alpha, g->b, p->layout_a, g->a, p->layout_b, &beta, c,
                    p->layout_c, g->c, p->layout_c, &p->algo, (void *)(uintptr_t)d->workspace,
                    GEMM_WORKSPACE_BYTES, d->stream),
                   e);
}

/* ---- Graphs --------------------------------------------------------------------- */

static void drop_graph(cuda_device *d) {
    if (d->graph_exec) d->api.cuGraphExecDestroy(d->graph_exec);
    if (d->graph) d->api.cuGraphDestroy(d->graph);
    d->graph_exec = NULL;
    d->graph = NULL;
}

static smelt_status cuda_capture_begin(rt_device *device, rt_error *e) {
    cuda_device *d = current(device);
    drop_graph(d);
    return CU_CALL(d, cuStreamBeginCapture, (d->stream, CU_STREAM_CAPTURE_MODE_THREAD_LOCAL), e);
}

static smelt_status cuda_capture_end(rt_device *device, rt_error *e) {
    cuda_device *d = as_cuda(device);
    /* Always end the capture, even after a failed launch, so the stream is
     * usable again. */
    smelt_status s = CU_CALL(d, cuStreamEndCapture, (d->stream, &d->graph), e);
    if (s == SMELT_OK) s = CU_CALL(d, cuGraphInstantiate, (&d->graph_exec, d->graph, 0), e);
    if (s != SMELT_OK) drop_graph(d);
    return s;
}

static smelt_status cuda_replay(rt_device *device, rt_error *e) {
    cuda_device *d = as_cuda(device);
    if (!d->graph_exec) return rt_fail(e, SMELT_ERROR_DEVICE, "no captured graph to replay");
    return CU_CALL(d, cuGraphLaunch, (d->graph_exec, d->stream), e);
}

/* ---- Life cycle ----------------------------------------------------------------- */

static const char *cuda_name(const rt_device *device) { return ((const cuda_device *)device)->name; }

static void cuda_destroy(rt_device *device) {
    cuda_device *d = current(device);
    if (d->stream) d->api.cuStreamSynchronize(d->stream);
    drop_graph(d);
    if (d->cublaslt_library) {
        for (int i = 0; i < GEMM_CACHE_SIZE; i++)
            gemm_plan_release(d, &d->gemm_plans[i]);
        if (d->lt_preference && d->lt.preference_destroy) d->lt.preference_destroy(d->lt_preference);
        if (d->lt_handle && d->lt.destroy) d->lt.destroy(d->lt_handle);
        dlclose(d->cublaslt_library);
    }
    if (d->workspace) d->api.cuMemFree(d->workspace);
    for (uint32_t i = 0; i < d->scale_copy_count; i++)
        d->api.cuMemFree(d->scale_copies[i].f32);
    free(d->scale_copies);
    unload_kernels(d);
    if (d->stream) d->api.cuStreamDestroy(d->stream);
    if (d->context_retained) d->api.cuDevicePrimaryCtxRelease(d->device);
    if (d->driver_library) dlclose(d->driver_library);
    free(d);
}

static bool cuda_figures(const rt_device *device, prog_device_figures *out) {
    const cuda_device *d = (const cuda_device *)device;
    *out = d->figures;
    return d->figures.bytes_per_second > 0;
}

/* The roofline figures of the GPU from its attributes: DRAM bandwidth =
 * 2 (double data rate) x memory clock x bus width; dense bf16 tensor-core
 * flops per SM and clock 2048 on sm_8x and 4096 on sm_90 and later (A100:
 * 312 TFLOP/s, H100 SXM: 989), f32 CUDA-core flops 128 on sm_80, 256 after;
 * a launch (graph node) 1.3 us, as measured elsewhere (tests/gpu/run.sh
 * measures it). Boost clocks make these peaks, which kernels approach but
 * do not reach: the choice compares two sides by one yardstick. */
static void device_figures(cuda_device *d) {
    int sms = 0, clock_khz = 0, memory_khz = 0, bus_bits = 0;
    if (d->api.cuDeviceGetAttribute(&sms, CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT, d->device) != 0 ||
        d->api.cuDeviceGetAttribute(&clock_khz, CU_DEVICE_ATTRIBUTE_CLOCK_RATE, d->device) != 0 ||
        d->api.cuDeviceGetAttribute(&memory_khz, CU_DEVICE_ATTRIBUTE_MEMORY_CLOCK_RATE, d->device) != 0 ||
        d->api.cuDeviceGetAttribute(&bus_bits, CU_DEVICE_ATTRIBUTE_GLOBAL_MEMORY_BUS_WIDTH, d->device) != 0 ||
        sms <= 0 || clock_khz <= 0 || memory_khz <= 0 || bus_bits <= 0)
        return; /* no figures: the executor's fixed rule */
    double clock = clock_khz * 1e3;
    d->figures.bytes_per_second = 2.0 * memory_khz * 1e3 * (bus_bits / 8.0);
    d->figures.tensor_flops_per_second = sms * clock * (d->arch >= 90 ? 4096.0 : 2048.0);
    d->figures.flops_per_second = sms * clock * (d->arch > 80 ? 256.0 : 128.0);
    d->figures.launch_seconds = 1.3e-6;
}

static const rt_device_ops cuda_ops = {
    .kind = "cuda",
    .alloc = cuda_alloc,
    .free = cuda_free,
    .copy_in = cuda_copy_in,
    .copy_out = cuda_copy_out,
    .zero = cuda_zero,
    .load_kernels = cuda_load_kernels,
    .launch = cuda_launch,
    .gemm = cuda_gemm,
    .sync = cuda_sync,
    .name = cuda_name,
    .destroy = cuda_destroy,
    .map_host = NULL,     /* weights are copied to the GPU */
    .weight_bound = NULL, /* cuBLASLt reads bf16 directly */
    .capture_begin = cuda_capture_begin,
    .capture_end = cuda_capture_end,
    .replay = cuda_replay,
    .figures = cuda_figures,
    .runs_scaled_gemm = cuda_runs_scaled_gemm,
    .prepare_gemm = cuda_prepare_gemm,
};

/* Opens the driver library and resolves every function; NO_DEVICE when it
 * is not there. */
static smelt_status open_driver(cuda_device *d, rt_error *e) {
    const char *override = getenv("SMELT_CUDA_DRIVER");
    const char *library = override && *override ? override : "libcuda.so.1";
    d->driver_library = dlopen(library, RTLD_NOW | RTLD_LOCAL);
    if (!d->driver_library) {
        const char *why = dlerror();
        return rt_fail(e, SMELT_ERROR_NO_DEVICE, "no CUDA driver found (%s: %s)", library,
                       why ? why : "not found");
    }
#define CUDA_RESOLVE(member, symbol, ret, params)                                                            \
    *(void **)&d->api.member = dlsym(d->driver_library, symbol);                                             \
    if (!d->api.member)                                                                                      \
        return rt_fail(e, SMELT_ERROR_NO_DEVICE,                                                             \
                       "the CUDA driver %s lacks %s: it is too old for this smelt", library, symbol);
    CUDA_DRIVER_FUNCTIONS(CUDA_RESOLVE)
#undef CUDA_RESOLVE
    return SMELT_OK;
}

/* cuInit's answers that mean "no GPU to use here", as opposed to a fault. */
static bool means_no_gpu(cu_result r) {
    return r == CU_ERROR_STUB_LIBRARY || r == CU_ERROR_NO_DEVICE || r == CU_ERROR_DEVICE_UNAVAILABLE ||
           r == CU_ERROR_NOT_INITIALIZED || r == CU_ERROR_SYSTEM_NOT_READY ||
           r == CU_ERROR_SYSTEM_DRIVER_MISMATCH || r == CU_ERROR_COMPAT_NOT_SUPPORTED_ON_DEVICE;
}

/* Initialises the driver and picks the device; NO_DEVICE when there is no
 * usable GPU (a stub library, no device, a driver that does not match its
 * kernel module, a GPU held by another process in exclusive mode). */
static smelt_status open_device(cuda_device *d, int ordinal, rt_error *e) {
    cu_result r = d->api.cuInit(0);
    if (means_no_gpu(r)) {
        const char *name = NULL;
        d->api.cuGetErrorName(r, &name);
        return rt_fail(e, SMELT_ERROR_NO_DEVICE, "no usable CUDA GPU: cuInit failed: %s (%d)",
                       name ? name : "CUDA_ERROR_UNKNOWN", r);
    }
    smelt_status s = cuda_check(d, r, "cuInit", __FILE__, __LINE__, e);
    if (s != SMELT_OK) return s;
    int count = 0;
    if ((s = CU_CALL(d, cuDeviceGetCount, (&count), e)) != SMELT_OK) return s;
    if (ordinal < 0 || ordinal >= count)
        return rt_fail(e, SMELT_ERROR_NO_DEVICE, "there is no CUDA device %d (this machine has %d)", ordinal,
                       count);
    int major = 0, minor = 0;
    char gpu[128] = "";
    if ((s = CU_CALL(d, cuDeviceGet, (&d->device, ordinal), e)) != SMELT_OK ||
        (s = CU_CALL(d, cuDeviceGetName, (gpu, (int)sizeof gpu - 1, d->device), e)) != SMELT_OK ||
        (s = CU_CALL(d, cuDeviceGetAttribute,
                     (&major, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR, d->device), e)) != SMELT_OK ||
        (s = CU_CALL(d, cuDeviceGetAttribute,
                     (&minor, CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR, d->device), e)) != SMELT_OK)
        return s;
    d->arch = major * 10 + minor;
    snprintf(d->name, sizeof d->name, "cuda:%d %s (sm_%d)", ordinal, gpu, d->arch);
    device_figures(d);
    if ((s = CU_CALL(d, cuDevicePrimaryCtxRetain, (&d->context, d->device), e)) != SMELT_OK) return s;
    d->context_retained = true;
    if ((s = CU_CALL(d, cuCtxSetCurrent, (d->context), e)) != SMELT_OK) return s;
    return CU_CALL(d, cuStreamCreate, (&d->stream, CU_STREAM_NON_BLOCKING), e);
}

smelt_status rt_device_cuda_create(int ordinal, rt_device **out, rt_error *e) {
    *out = NULL;
    cuda_device *d = calloc(1, sizeof *d);
    if (!d) return rt_fail(e, SMELT_ERROR_OUT_OF_MEMORY, "out of memory for a CUDA device");
    d->base.ops = &cuda_ops;
    d->scaled_fp8 = -1;
    smelt_status s = open_driver(d, e);
    if (s == SMELT_OK) s = open_device(d, ordinal, e);
    if (s != SMELT_OK) {
        /* Only what was opened is closed: the api table may be partial. */
        if (d->context_retained) d->api.cuDevicePrimaryCtxRelease(d->device);
        if (d->driver_library) dlclose(d->driver_library);
        free(d);
        return s;
    }
    *out = &d->base;
    return SMELT_OK;
}
