/* fake_cuda.c - a stand-in CUDA driver and cuBLASLt in one shared object, so
 * that test_runtime.c can run runtime/device/device_cuda.c end to end on a machine
 * without a GPU. test_runtime builds it with the host compiler at test time
 * and names it in $SMELT_CUDA_DRIVER and $SMELT_CUBLASLT.
 *
 * It exports the driver's versioned symbols (cuMemAlloc_v2, ...) with the
 * driver's ABI. Device memory is host memory. cuModuleLoadData accepts the
 * image (counting those that look like PTX) and cuModuleGetFunction finds
 * NAME__host_entry in the host kernel object named by
 * $FAKE_CUDA_HOST_KERNELS, which cuLaunchKernel runs on the host simulator
 * of the loading process (its sim_* symbols are exported). Stream capture
 * records launches and matmuls, parameter values copied as the real driver
 * copies them; a graph launch replays them.
 *
 * cublasLtMatmul computes D = alpha op(A) op(B) + beta C (+ bias per row of
 * D) from the layout descriptors exactly as cuBLASLt defines them
 * (column-major, rows x cols with a leading dimension, op applied after),
 * and refuses inconsistent dimensions: a wrong transpose or layout in the
 * runtime shows up as an error or a wrong number. E4M3 operands (FP8) are
 * taken only as cuBLASLt takes them, "TN" (A transposed, B not; else the
 * heuristic finds no algorithm), and outer-vector scales
 * (CUBLASLT_MATMUL_MATRIX_SCALE_OUTER_VEC_32F) multiply element (i, j) of
 * the product by a_scale[i] b_scale[j]. The last matmul's attributes are
 * kept for the test to read (fake_cuda.h).
 *
 * Knobs (environment): FAKE_CUDA_ARCH, the compute capability as 89 or 90
 * (default 90); FAKE_CUBLASLT_VERSION, what cublasLtGetVersion returns
 * (default 130100); FAKE_CUBLASLT_NO_FP8=1, a heuristic that finds no FP8
 * algorithm.
 */
#include "fake_cuda.h"
#include "host_sim.h"
#include "numeric.h"

#include <dlfcn.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

typedef int result;
typedef unsigned long long deviceptr;

enum { FAKE_OK = 0, FAKE_INVALID_VALUE = 1, FAKE_NOT_FOUND = 500, FAKE_LAUNCH_FAILED = 719, MAX_PARAMS = 32 };
enum { TYPE_F32 = 0, TYPE_BF16 = 14, TYPE_E4M3 = 28, SCALE_OUTER_VEC_32F = 3, OP_T = 1 };

static sim_pool *pool;
static void *host_kernels;
static int capturing;
static int counters[4]; /* launches run, graph launches, matmuls run, PTX modules loaded */

void fake_cuda_counters(int out[4]) { memcpy(out, counters, sizeof counters); }

/* ---- cuBLASLt descriptors ---------------------------------------------------- */

typedef struct fake_desc {
    int32_t trans_a, trans_b;
    uint32_t epilogue;
    const void *bias;
    int32_t bias_type;
    int32_t a_scale_mode, b_scale_mode;
    const void *a_scale, *b_scale;
} fake_desc;

typedef struct fake_layout {
    int type;
    uint64_t rows, cols;
    int64_t ld;
} fake_layout;

typedef struct fake_matmul {
    fake_desc desc;
    fake_layout a, b, c, d;
    float alpha, beta;
    const void *pa, *pb, *pc;
    void *pd;
} fake_matmul;

/* ---- Recorded work ----------------------------------------------------------- */

typedef struct fake_function {
    sim_kernel kernel;
    char name[256];
} fake_function;

typedef struct fake_call {
    int is_matmul;
    fake_function *f;
    unsigned grid[3], block[3], shared;
    uint64_t values[MAX_PARAMS]; /* copies of the parameters, 8 bytes each */
    int param_count;
    fake_matmul matmul;
} fake_call;

typedef struct fake_graph {
    fake_call *calls;
    int count;
} fake_graph;

static fake_graph *recording;

static void record(const fake_call *call) {
    fake_call *grown = realloc(recording->calls, (size_t)(recording->count + 1) * sizeof *grown);
    if (!grown) abort();
    recording->calls = grown;
    grown[recording->count++] = *call;
}

static fake_cuda_matmul_info last_matmul;

void fake_cuda_last_matmul(fake_cuda_matmul_info *out) { *out = last_matmul; }

static int env_int(const char *name, int fallback) {
    const char *v = getenv(name);
    return v && *v ? atoi(v) : fallback;
}

static float load(int type, const void *base, uint64_t index) {
    if (type == TYPE_F32) return ((const float *)base)[index];
    if (type == TYPE_E4M3) return plan_f8e4m3_to_f32(((const uint8_t *)base)[index]);
    return plan_bf16_to_f32(((const uint16_t *)base)[index]);
}

static void store(int type, void *base, uint64_t index, float v) {
    if (type == TYPE_F32) {
        ((float *)base)[index] = v;
        return;
    }
    ((uint16_t *)base)[index] = plan_f32_to_bf16(v);
}

static result run_matmul(const fake_matmul *m) {
    /* op(A) is M x K, op(B) K x N, D M x N, all column-major. */
    uint64_t M = m->desc.trans_a ? m->a.cols : m->a.rows, K = m->desc.trans_a ? m->a.rows : m->a.cols;
    uint64_t KB = m->desc.trans_b ? m->b.cols : m->b.rows, N = m->desc.trans_b ? m->b.rows : m->b.cols;
    if (K != KB || m->d.rows != M || m->d.cols != N || m->c.rows != M || m->c.cols != N) {
        fprintf(stderr, "fake cuBLASLt: inconsistent dims: op(A) %llux%llu, op(B) %llux%llu, D %llux%llu\n",
                (unsigned long long)M, (unsigned long long)K, (unsigned long long)KB, (unsigned long long)N,
                (unsigned long long)m->d.rows, (unsigned long long)m->d.cols);
        return 7; /* CUBLAS_STATUS_INVALID_VALUE */
    }
    for (uint64_t i = 0; i < M; i++)
        for (uint64_t j = 0; j < N; j++) {
            double sum = 0;
            for (uint64_t k = 0; k < K; k++) {
                uint64_t ai = m->desc.trans_a ? k + i * (uint64_t)m->a.ld : i + k * (uint64_t)m->a.ld;
                uint64_t bi = m->desc.trans_b ? j + k * (uint64_t)m->b.ld : k + j * (uint64_t)m->b.ld;
                sum += (double)load(m->a.type, m->pa, ai) * load(m->b.type, m->pb, bi);
            }
            if (m->desc.a_scale_mode == SCALE_OUTER_VEC_32F) sum *= ((const float *)m->desc.a_scale)[i];
            if (m->desc.b_scale_mode == SCALE_OUTER_VEC_32F) sum *= ((const float *)m->desc.b_scale)[j];
            double v = m->alpha * sum;
            if (m->beta != 0.0f) v += m->beta * load(m->c.type, m->pc, i + j * (uint64_t)m->c.ld);
            if (m->desc.epilogue == 4) v += load(m->desc.bias_type, m->desc.bias, i);
            store(m->d.type, m->pd, i + j * (uint64_t)m->d.ld, (float)v);
        }
    counters[2]++;
    return FAKE_OK;
}

static result run_launch(fake_call *c) {
    char error[512];
    void *params[MAX_PARAMS + 1] = {0};
    for (int i = 0; i < c->param_count; i++)
        params[i] = &c->values[i];
    sim_status s = sim_launch(pool, &c->f->kernel, sim_dim3_make(c->grid[0], c->grid[1], c->grid[2]),
                              sim_dim3_make(c->block[0], c->block[1], c->block[2]), c->shared, params, error,
                              sizeof error);
    if (s != SIM_OK) {
        fprintf(stderr, "fake cuLaunchKernel: %s\n", error);
        return FAKE_LAUNCH_FAILED;
    }
    counters[0]++;
    return FAKE_OK;
}

/* ---- Driver API -------------------------------------------------------------- */

result cuGetErrorName(result error, const char **name) {
    *name = error == FAKE_LAUNCH_FAILED ? "CUDA_ERROR_LAUNCH_FAILED" : "CUDA_ERROR_FAKE";
    return FAKE_OK;
}
result cuInit(unsigned flags) {
    (void)flags;
    if (!pool) pool = sim_pool_create(2);
    return pool ? FAKE_OK : 999;
}
result cuDriverGetVersion(int *version) {
    *version = 13000;
    return FAKE_OK;
}
result cuDeviceGetCount(int *count) {
    *count = 1;
    return FAKE_OK;
}
result cuDeviceGet(int *device, int ordinal) {
    *device = ordinal;
    return ordinal == 0 ? FAKE_OK : 101;
}
result cuDeviceGetName(char *name, int length, int device) {
    (void)device;
    snprintf(name, (size_t)length, "Fake GPU");
    return FAKE_OK;
}
result cuDeviceGetAttribute(int *value, int attribute, int device) {
    (void)device;
    int arch = env_int("FAKE_CUDA_ARCH", 90); /* sm_90 unless told */
    *value = attribute == 75 ? arch / 10 : attribute == 76 ? arch % 10 : 0;
    return FAKE_OK;
}
static int context_object;
result cuDevicePrimaryCtxRetain(void **context, int device) {
    (void)device;
    *context = &context_object;
    return FAKE_OK;
}
result cuDevicePrimaryCtxRelease_v2(int device) {
    (void)device;
    return FAKE_OK;
}
result cuCtxSetCurrent(void *context) { return context == &context_object ? FAKE_OK : 201; }
static int stream_object;
result cuStreamCreate(void **stream, unsigned flags) {
    (void)flags;
    *stream = &stream_object;
    return FAKE_OK;
}
result cuStreamDestroy_v2(void *stream) {
    (void)stream;
    return FAKE_OK;
}
result cuStreamSynchronize(void *stream) {
    (void)stream;
    return FAKE_OK;
}
result cuMemAlloc_v2(deviceptr *address, size_t bytes) {
    void *p = calloc(1, bytes ? bytes : 1);
    *address = (deviceptr)(uintptr_t)p;
    return p ? FAKE_OK : 2;
}
result cuMemFree_v2(deviceptr address) {
    free((void *)(uintptr_t)address);
    return FAKE_OK;
}
result cuMemcpyHtoDAsync_v2(deviceptr dst, const void *src, size_t bytes, void *stream) {
    (void)stream;
    if (capturing) return 900; /* the runtime copies outside captures */
    memcpy((void *)(uintptr_t)dst, src, bytes);
    return FAKE_OK;
}
result cuMemcpyDtoHAsync_v2(void *dst, deviceptr src, size_t bytes, void *stream) {
    (void)stream;
    if (capturing) return 900;
    memcpy(dst, (const void *)(uintptr_t)src, bytes);
    return FAKE_OK;
}
result cuMemsetD8Async(deviceptr dst, unsigned char value, size_t count, void *stream) {
    (void)stream;
    memset((void *)(uintptr_t)dst, value, count);
    return FAKE_OK;
}
static int module_object;
result cuModuleLoadData(void **module, const void *image) {
    if (!host_kernels) {
        const char *path = getenv("FAKE_CUDA_HOST_KERNELS");
        host_kernels = path ? dlopen(path, RTLD_NOW | RTLD_LOCAL) : NULL;
        if (!host_kernels) return 218; /* CUDA_ERROR_INVALID_PTX */
    }
    if (strstr(image, ".entry") || strstr(image, "no NVRTC")) counters[3]++;
    *module = &module_object;
    return FAKE_OK;
}
result cuModuleUnload(void *module) {
    (void)module;
    return FAKE_OK;
}
static fake_function *functions[64]; /* every one handed out, freed by fake_cuda_shutdown */
static int function_count;

result cuModuleGetFunction(void **function, void *module, const char *name) {
    (void)module;
    if (function_count == 64) return 2;
    fake_function *f = calloc(1, sizeof *f);
    snprintf(f->name, sizeof f->name, "%s__host_entry", name);
    *(void **)&f->kernel.host_entry = dlsym(host_kernels, f->name);
    if (!f->kernel.host_entry) {
        free(f);
        return FAKE_NOT_FOUND;
    }
    snprintf(f->name, sizeof f->name, "%s", name);
    f->kernel.name = f->name;
    functions[function_count++] = f;
    *function = f;
    return FAKE_OK;
}
result cuFuncSetAttribute(void *function, int attribute, int value) {
    (void)function, (void)attribute, (void)value;
    return FAKE_OK;
}
result cuLaunchKernel(void *function, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by,
                      unsigned bz, unsigned shared, void *stream, void **params, void **extra) {
    (void)stream, (void)extra;
    fake_call c = {.f = function, .grid = {gx, gy, gz}, .block = {bx, by, bz}, .shared = shared};
    while (c.param_count < MAX_PARAMS && params[c.param_count]) {
        memcpy(&c.values[c.param_count], params[c.param_count], sizeof c.values[0]);
        c.param_count++;
    }
    if (capturing) {
        record(&c);
        return FAKE_OK;
    }
    return run_launch(&c);
}
result cuStreamBeginCapture_v2(void *stream, int mode) {
    (void)stream, (void)mode;
    recording = calloc(1, sizeof *recording);
    capturing = 1;
    return FAKE_OK;
}
result cuStreamEndCapture(void *stream, void **graph) {
    (void)stream;
    capturing = 0;
    *graph = recording;
    recording = NULL;
    return FAKE_OK;
}
result cuGraphInstantiateWithFlags(void **exec, void *graph, unsigned long long flags) {
    (void)flags;
    *exec = graph;
    return FAKE_OK;
}
result cuGraphLaunch(void *exec, void *stream) {
    (void)stream;
    fake_graph *g = exec;
    for (int i = 0; i < g->count; i++) {
        result r = g->calls[i].is_matmul ? run_matmul(&g->calls[i].matmul) : run_launch(&g->calls[i]);
        if (r != FAKE_OK) return r;
    }
    counters[1]++;
    return FAKE_OK;
}
result cuGraphDestroy(void *graph) {
    fake_graph *g = graph;
    free(g->calls);
    free(g);
    return FAKE_OK;
}
result cuGraphExecDestroy(void *exec) {
    (void)exec;
    return FAKE_OK;
} /* the exec is the graph */

/* ---- cuBLASLt ------------------------------------------------------------------ */

int cublasLtCreate(void **handle) {
    *handle = &context_object;
    return 0;
}
int cublasLtDestroy(void *handle) {
    (void)handle;
    return 0;
}
size_t cublasLtGetVersion(void) { return (size_t)env_int("FAKE_CUBLASLT_VERSION", 130100); }
const char *cublasLtGetStatusName(int status) {
    return status == 7 ? "CUBLAS_STATUS_INVALID_VALUE" : "CUBLAS_FAKE";
}
int cublasLtMatmulDescCreate(fake_desc **desc, int compute_type, int scale_type) {
    if (compute_type != 68 || scale_type != TYPE_F32) return 7; /* f32 accumulation, f32 scale */
    *desc = calloc(1, sizeof **desc);
    (*desc)->epilogue = 1;
    (*desc)->bias_type = -1;
    (*desc)->a_scale_mode = (*desc)->b_scale_mode = -1;
    return 0;
}
int cublasLtMatmulDescDestroy(fake_desc *desc) {
    free(desc);
    return 0;
}
int cublasLtMatmulDescSetAttribute(fake_desc *desc, int attribute, const void *value, size_t size) {
    switch (attribute) {
    case 3: memcpy(&desc->trans_a, value, size); break;
    case 4: memcpy(&desc->trans_b, value, size); break;
    case 7: memcpy(&desc->epilogue, value, size); break;
    case 8: memcpy(&desc->bias, value, size); break;
    case 17: memcpy(&desc->a_scale, value, size); break;
    case 18: memcpy(&desc->b_scale, value, size); break;
    case 26: memcpy(&desc->bias_type, value, size); break;
    case 31: memcpy(&desc->a_scale_mode, value, size); break;
    case 32: memcpy(&desc->b_scale_mode, value, size); break;
    default: return 7;
    }
    return 0;
}
int cublasLtMatrixLayoutCreate(fake_layout **layout, int type, uint64_t rows, uint64_t cols, int64_t ld) {
    if ((type != TYPE_F32 && type != TYPE_BF16 && type != TYPE_E4M3) || ld < (int64_t)rows) return 7;
    *layout = calloc(1, sizeof **layout);
    **layout = (fake_layout){type, rows, cols, ld};
    return 0;
}
int cublasLtMatrixLayoutDestroy(fake_layout *layout) {
    free(layout);
    return 0;
}
/* The minimum alignments promised for A, B, C, D (cuBLASLt's default: 256). */
typedef struct fake_preference {
    uint32_t alignment[4];
} fake_preference;

int cublasLtMatmulPreferenceCreate(fake_preference **preference) {
    *preference = malloc(sizeof **preference);
    for (int i = 0; i < 4; i++)
        (*preference)->alignment[i] = 256;
    return 0;
}
int cublasLtMatmulPreferenceDestroy(fake_preference *preference) {
    free(preference);
    return 0;
}
int cublasLtMatmulPreferenceSetAttribute(fake_preference *preference, int attribute, const void *value,
                                         size_t size) {
    if (attribute == 1) return 0; /* workspace */
    if (attribute < 5 || attribute > 8 || size != 4) return 7;
    memcpy(&preference->alignment[attribute - 5], value, 4);
    return 0;
}
/* One algorithm, as cublasLtMatmulHeuristicResult_t lays it out (96 bytes);
 * the algorithm remembers the alignments it was chosen for. */
int cublasLtMatmulAlgoGetHeuristic(void *handle, fake_desc *desc, fake_layout *a, fake_layout *b,
                                   fake_layout *c, fake_layout *d, fake_preference *preference, int requested,
                                   uint64_t *results, int *returned) {
    (void)handle, (void)c, (void)d;
    if (requested < 1) return 7;
    memset(results, 0, 96);
    bool fp8 = a->type == TYPE_E4M3 || b->type == TYPE_E4M3;
    if (fp8 && (getenv("FAKE_CUBLASLT_NO_FP8") || desc->trans_a != OP_T || desc->trans_b == OP_T)) {
        *returned = 0; /* FP8 is "TN" only */
        return 0;
    }
    for (int i = 0; i < 4; i++)
        results[i] = preference->alignment[i];
    *returned = 1;
    return 0;
}
int cublasLtMatmul(void *handle, fake_desc *desc, const float *alpha, const void *a, fake_layout *a_layout,
                   const void *b, fake_layout *b_layout, const float *beta, const void *c,
                   fake_layout *c_layout, void *d, fake_layout *d_layout, const uint64_t *algo,
                   void *workspace, size_t workspace_size, void *stream) {
    (void)handle, (void)workspace, (void)workspace_size, (void)stream;
    /* An algorithm chosen for better-aligned operands faults on a GPU. */
    const void *operands[4] = {a, b, c, d};
    for (int i = 0; i < 4; i++)
        if ((uintptr_t)operands[i] % algo[i] != 0) {
            fprintf(stderr, "fake cuBLASLt: operand %d at %p is not %llu-byte aligned\n", i, operands[i],
                    (unsigned long long)algo[i]);
            return 14; /* CUBLAS_STATUS_EXECUTION_FAILED */
        }
    fake_call call = {.is_matmul = 1};
    call.matmul = (fake_matmul){*desc, *a_layout, *b_layout, *c_layout, *d_layout, *alpha, *beta, a, b, c, d};
    last_matmul = (fake_cuda_matmul_info){
        .trans_a = desc->trans_a,
        .trans_b = desc->trans_b,
        .epilogue = desc->epilogue,
        .bias_type = desc->bias_type,
        .bias = desc->bias,
        .a_scale_mode = desc->a_scale_mode,
        .b_scale_mode = desc->b_scale_mode,
        .a_scale = desc->a_scale,
        .b_scale = desc->b_scale,
        .type_a = a_layout->type,
        .type_b = b_layout->type,
        .type_c = c_layout->type,
        .type_d = d_layout->type,
        .a_rows = a_layout->rows,
        .a_cols = a_layout->cols,
        .b_rows = b_layout->rows,
        .b_cols = b_layout->cols,
        .d_rows = d_layout->rows,
        .d_cols = d_layout->cols,
        .a_ld = a_layout->ld,
        .b_ld = b_layout->ld,
        .d_ld = d_layout->ld,
        .alpha = *alpha,
        .beta = *beta,
        .a = a,
        .b = b,
        .c = c,
        .d = d,
    };
    if (capturing) {
        record(&call);
        return 0;
    }
    return run_matmul(&call.matmul);
}

/* What the test calls before it unloads the fake: frees what the driver
 * would own (the simulator pool, functions, the kernel object). */
void fake_cuda_shutdown(void) {
    for (int i = 0; i < function_count; i++)
        free(functions[i]);
    function_count = 0;
    if (host_kernels) dlclose(host_kernels);
    host_kernels = NULL;
    if (pool) sim_pool_free(pool);
    pool = NULL;
    memset(counters, 0, sizeof counters);
}
