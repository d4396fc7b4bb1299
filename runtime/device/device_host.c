/* device_host.c - the host device: the plan's kernels on the host simulator,
 * its GEMMs on OpenBLAS, device memory = host memory.
 *
 * Kernels. The plan's HOST_KERNELS section is a shared object built from the
 * very kernel text NVRTC compiled (smelt_kernel.h's host half). It is loaded
 * from memory: written to an anonymous file (memfd_create) and dlopen()ed as
 * /proc/self/fd/N, so nothing touches the disk; where memfd or /proc is
 * missing, a temporary file that is unlinked once loaded. Each kernel's
 * entry is NAME__host_entry, run by sim_launch on every simulated thread.
 * The object resolves the simulator's smelt_sim_* symbols from the process,
 * which therefore exports them (smelt_runtime links with --export-dynamic).
 *
 * GEMMs. cblas_sgemm in f32, row-major. bf16 and f16 operands are widened
 * to f32: such a weight read as B once, when it is bound (an f32 shadow copy,
 * so the conversion is not paid per token); activations per call, into
 * scratch buffers kept between calls. A bf16 or f16 C is computed in f32 and
 * rounded to nearest even, as the GPU's epilogue does.
 *
 * Scaled GEMMs (W8A8: prog_gemm.has_scales) run here for f8e4m3 and i8
 * codes: A's and B's codes decoded to f32 (exact: an E4M3 value or an
 * integer of at most 127), multiplied by the same sgemm, then
 * C[i, j] = (sum * a_scale[i]) * b_scale[j] (+ bias[j]) (+ residual[i, j]),
 * in that order, the order of smelt's GEMV and dequantize-GEMM kernels, and
 * rounded to C's dtype. The codes are decoded per call (no shadow: a host
 * prefill is for tests), an f16 b_scale widened per call.
 *
 * Weights. map_host hands back the host pointer itself: weights in a mapped
 * plan are used in place, with no copy.
 */
#define _GNU_SOURCE /* memfd_create */

#include "device.h"
#include "host_sim.h"
#include "numeric.h"

#include <cblas.h> /* types and constants only: OpenBLAS itself is opened with dlopen */
#include <dlfcn.h>
#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/resource.h>
#include <unistd.h>

typedef struct host_device {
    rt_device base;
    sim_pool *pool;
    void *kernel_object; /* dlopen handle of the host kernels */
    sim_kernel *kernels; /* [kernel_count] */
    char **kernel_names; /* [kernel_count], owned */
    uint32_t kernel_count;
    float **weight_shadows; /* [shadow_count]: f32 copy of bf16/f16 GEMM weights, by weight index */
    uint32_t shadow_count;
    float *scratch[4]; /* A, B, C widened to f32; a scaled GEMM's b_scale */
    size_t scratch_floats[4];
    float e4m3[256]; /* every f8e4m3 code's value */
    char name[64];
} host_device;

enum { SCRATCH_A, SCRATCH_B, SCRATCH_C, SCRATCH_SCALE, SCRATCH_COUNT };

static host_device *as_host(rt_device *d) { return (host_device *)d; }

/* ---- Memory ------------------------------------------------------------------ */

static smelt_status host_alloc(rt_device *d, uint64_t bytes, void **out, rt_error *e) {
    (void)d;
    /* aligned_alloc wants a multiple of the alignment. */
    uint64_t rounded;
    if (__builtin_add_overflow(bytes, 63, &rounded) || rounded > SIZE_MAX)
        return rt_fail(e, SMELT_ERROR_OUT_OF_MEMORY, "cannot allocate %llu bytes", (unsigned long long)bytes);
    rounded &= ~(uint64_t)63;
    void *p = aligned_alloc(64, rounded ? (size_t)rounded : 64);
    if (!p)
        return rt_fail(e, SMELT_ERROR_OUT_OF_MEMORY, "out of host memory allocating %llu bytes",
                       (unsigned long long)bytes);
    memset(p, 0, rounded);
    *out = p;
    return SMELT_OK;
}

static void host_free(rt_device *d, void *address) {
    (void)d;
    free(address);
}

static smelt_status host_copy(rt_device *d, void *dst, const void *src, uint64_t bytes, rt_error *e) {
    (void)d, (void)e;
    memmove(dst, src, bytes);
    return SMELT_OK;
}

static smelt_status host_zero(rt_device *d, void *address, uint64_t bytes, rt_error *e) {
    (void)d, (void)e;
    memset(address, 0, bytes);
    return SMELT_OK;
}

static smelt_status host_sync(rt_device *d, rt_error *e) {
    (void)d, (void)e;
    return SMELT_OK; /* every launch and GEMM is synchronous */
}

static void *host_map(rt_device *d, const void *host, uint64_t bytes) {
    (void)d, (void)bytes;
    return (void *)host;
}

/* ---- Kernels ------------------------------------------------------------------- */

static bool write_all(int fd, const uint8_t *bytes, uint64_t size) {
    while (size > 0) {
        size_t chunk = size > (1u << 30) ? (1u << 30) : (size_t)size;
        ssize_t n = write(fd, bytes, chunk);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) return false;
        bytes += n;
        size -= (uint64_t)n;
    }
    return true;
}

/* dlopen()s the shared object held in memory: through memfd_create and
 * /proc/self/fd when the system has them, else through a temporary file. */
static smelt_status open_object(host_device *d, const uint8_t *bytes, uint64_t size, rt_error *e) {
    char path[4096];
    const char *memfd_problem = "memfd_create is not available";
    int fd = memfd_create("smelt-host-kernels", MFD_CLOEXEC);
    if (fd >= 0) {
        snprintf(path, sizeof path, "/proc/self/fd/%d", fd);
        if (write_all(fd, bytes, size)) d->kernel_object = dlopen(path, RTLD_NOW | RTLD_LOCAL);
        close(fd);
        if (d->kernel_object) return SMELT_OK;
        memfd_problem = dlerror();
        if (!memfd_problem) memfd_problem = "the in-memory object could not be loaded";
    }
    const char *folder = getenv("TMPDIR");
    if (!folder || !*folder) folder = "/tmp";
    snprintf(path, sizeof path, "%s/smelt-host-kernels-XXXXXX.so", folder);
    fd = mkstemps(path, 3);
    if (fd < 0)
        return rt_fail(e, SMELT_ERROR_IO, "cannot load the host kernels: %s, and no temporary file in %s: %s",
                       memfd_problem, folder, strerror(errno));
    bool written = write_all(fd, bytes, size);
    close(fd);
    if (written) d->kernel_object = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    unlink(path);
    if (!d->kernel_object) {
        const char *why = written ? dlerror() : "the temporary file could not be written";
        return rt_fail(e, SMELT_ERROR_BAD_PLAN, "the plan's host kernels cannot be loaded: %s",
                       why ? why : "unknown dlopen error");
    }
    return SMELT_OK;
}

static void unload_kernels(host_device *d) {
    for (uint32_t i = 0; d->kernel_names && i < d->kernel_count; i++)
        free(d->kernel_names[i]);
    free(d->kernel_names);
    free(d->kernels);
    if (d->kernel_object) dlclose(d->kernel_object);
    d->kernel_names = NULL;
    d->kernels = NULL;
    d->kernel_object = NULL;
    d->kernel_count = 0;
}

static smelt_status host_load_kernels(rt_device *device, const rt_kernel_set *set, rt_error *e) {
    host_device *d = as_host(device);
    unload_kernels(d);
    if (set->count == 0) return SMELT_OK;
    if (!set->host_object || set->host_object_size == 0)
        return rt_fail(e, SMELT_ERROR_UNSUPPORTED,
                       "the plan has no host kernels: compile it with --target host to run it on the CPU");
    smelt_status s = open_object(d, set->host_object, set->host_object_size, e);
    if (s != SMELT_OK) return s;
    d->kernels = calloc(set->count, sizeof *d->kernels);
    d->kernel_names = calloc(set->count, sizeof *d->kernel_names);
    if (!d->kernels || !d->kernel_names) {
        unload_kernels(d);
        return rt_fail(e, SMELT_ERROR_OUT_OF_MEMORY, "out of memory for %u kernels", set->count);
    }
    d->kernel_count = set->count;
    static const char suffix[] = "__host_entry";
    for (uint32_t i = 0; i < set->count; i++) {
        plan_text name = set->kernels[i].name;
        char *symbol = malloc(name.length + sizeof suffix);
        if (!symbol) {
            unload_kernels(d);
            return rt_fail(e, SMELT_ERROR_OUT_OF_MEMORY, "out of memory for kernel names");
        }
        memcpy(symbol, name.data, name.length);
        memcpy(symbol + name.length, suffix, sizeof suffix);
        d->kernel_names[i] = symbol;
        void *entry = dlsym(d->kernel_object, symbol);
        symbol[name.length] = '\0'; /* keep the kernel's own name for messages */
        if (!entry || memchr(name.data, 0, name.length)) {
            s = rt_fail(e, SMELT_ERROR_BAD_PLAN,
                        "the plan's host kernels lack '%.*s%s__host_entry' (kernel %u)", RT_NAME(symbol), i);
            unload_kernels(d);
            return s;
        }
        d->kernels[i].name = symbol;
        *(void **)&d->kernels[i].host_entry = entry;
    }
    return SMELT_OK;
}

static smelt_status host_launch(rt_device *device, uint32_t kernel, const rt_launch_dims *dims, void **args,
                                rt_error *e) {
    host_device *d = as_host(device);
    if (kernel >= d->kernel_count)
        return rt_fail(e, SMELT_ERROR_BAD_PLAN, "kernel %u is not loaded (%u kernels)", kernel,
                       d->kernel_count);
    char message[RT_ERROR_MESSAGE_SIZE];
    sim_status s =
        sim_launch(d->pool, &d->kernels[kernel], sim_dim3_make(dims->grid[0], dims->grid[1], dims->grid[2]),
                   sim_dim3_make(dims->block[0], dims->block[1], dims->block[2]), dims->dynamic_shared_bytes,
                   args, message, sizeof message);
    if (s == SIM_OK) return SMELT_OK;
    smelt_status status = s == SIM_ERROR_OUT_OF_MEMORY    ? SMELT_ERROR_OUT_OF_MEMORY
                          : s == SIM_ERROR_INVALID_LAUNCH ? SMELT_ERROR_BAD_PLAN
                                                          : SMELT_ERROR_DEVICE;
    return rt_fail(e, status, "%s: %s", sim_status_name(s), message);
}

/* ---- GEMM --------------------------------------------------------------------- */

static float *scratch(host_device *d, int which, uint64_t floats) {
    if (floats <= d->scratch_floats[which]) return d->scratch[which];
    if (floats > SIZE_MAX / sizeof(float)) return NULL;
    float *grown = realloc(d->scratch[which], (size_t)floats * sizeof(float));
    if (!grown) return NULL;
    d->scratch[which] = grown;
    d->scratch_floats[which] = (size_t)floats;
    return grown;
}

/* A 16-bit float dtype (bf16, f16): what the GEMM widens to f32 and narrows back. */
static bool is_half(smelt_dtype dtype) { return dtype == SMELT_DTYPE_BF16 || dtype == SMELT_DTYPE_F16; }

static float half_to_f32(smelt_dtype dtype, uint16_t h) {
    return dtype == SMELT_DTYPE_F16 ? plan_f16_to_f32(h) : plan_bf16_to_f32(h);
}

/* Element i of a bias or residual (f32, bf16 or f16) as f32. */
static float element_f32(const void *data, smelt_dtype dtype, uint64_t i) {
    return dtype == SMELT_DTYPE_F32 ? ((const float *)data)[i]
                                    : half_to_f32(dtype, ((const uint16_t *)data)[i]);
}

static void widen_half(float *dst, const uint16_t *src, smelt_dtype dtype, uint64_t count) {
    if (dtype == SMELT_DTYPE_F16)
        plan_f16_row_to_f32(src, dst, count);
    else
        plan_bf16_row_to_f32(src, dst, count);
}

/* The operand as f32: itself, the weight's shadow, or widened into scratch. */
static const float *operand_f32(host_device *d, const void *data, smelt_dtype dtype, uint64_t count,
                                int which) {
    if (dtype == SMELT_DTYPE_F32) return data;
    float *f = scratch(d, which, count);
    if (f) widen_half(f, data, dtype, count);
    return f;
}

/* OpenBLAS, opened when the first GEMM needs it, never linked: commands and
 * plans without host GEMMs (smelt inspect, a CUDA run) never load it and its
 * threads. Once per process, and never closed: OpenBLAS starts worker
 * threads when it loads and does not survive being unloaded and loaded
 * again. SMELT_OPENBLAS names another library with cblas_sgemm. */
typedef __typeof__(&cblas_sgemm) sgemm_fn;
static struct {
    pthread_once_t once;
    sgemm_fn sgemm; /* NULL when the library or the symbol is missing */
    char why[256];  /* then: what went wrong */
} blas = {.once = PTHREAD_ONCE_INIT};

static void open_blas(void) {
    const char *override = getenv("SMELT_OPENBLAS");
    const char *names[] = {"libopenblas.so.0", "libopenblas.so"};
    void *library = NULL;
    const char *tried = override && *override ? override : names[0];
    if (override && *override)
        library = dlopen(override, RTLD_NOW | RTLD_LOCAL);
    else
        for (size_t i = 0; i < sizeof names / sizeof names[0] && !library; i++)
            library = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!library) {
        const char *error = dlerror();
        snprintf(blas.why, sizeof blas.why, "cannot load OpenBLAS (%s: %s)", tried,
                 error ? error : "not found");
        return;
    }
    *(void **)&blas.sgemm = dlsym(library, "cblas_sgemm");
    if (!blas.sgemm) snprintf(blas.why, sizeof blas.why, "%s lacks cblas_sgemm", tried);
}

/* Under an address-space limit (ulimit -v) OpenBLAS is not used: when one of
 * its mappings fails it retries forever instead of failing, and its shutdown
 * at exit then waits for that thread. The host device multiplies with
 * plain_sgemm there instead: slower, but it fails only where malloc does. */
static bool address_space_limited(void) {
    struct rlimit limit;
    return getrlimit(RLIMIT_AS, &limit) == 0 && limit.rlim_cur != RLIM_INFINITY;
}

/* C[m x n] = A[m x k] B + beta C, row-major; B is [k x n], or [n x k] when
 * transposed. Sums in double, like the reference interpreter. */
static void plain_sgemm(int m, int n, int k, const float *a, const float *b, bool b_transposed, float beta,
                        float *c) {
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            double sum = 0.0;
            for (int p = 0; p < k; p++)
                sum += (double)a[(size_t)i * k + p] *
                       (b_transposed ? b[(size_t)j * k + p] : b[(size_t)p * n + j]);
            float *out = &c[(size_t)i * n + j];
            *out = (float)sum + (beta != 0.0f ? beta * *out : 0.0f);
        }
}

static smelt_status load_blas(rt_error *e) {
    pthread_once(&blas.once, open_blas);
    if (blas.sgemm) return SMELT_OK;
    return rt_fail(e, SMELT_ERROR_UNSUPPORTED,
                   "%s: the plan's matrix products on the host need it; install OpenBLAS (Debian: "
                   "libopenblas0) or add its folder to LD_LIBRARY_PATH",
                   blas.why);
}

static bool host_runs_scaled_gemm(rt_device *device, smelt_dtype dtype) {
    (void)device;
    return dtype == SMELT_DTYPE_F8E4M3 || dtype == SMELT_DTYPE_I8;
}

/* count codes (f8e4m3 or i8) as f32 into scratch `which`; NULL when out of memory. */
static const float *codes_f32(host_device *d, const void *codes, smelt_dtype dtype, uint64_t count,
                              int which) {
    float *f = scratch(d, which, count);
    if (!f) return NULL;
    const uint8_t *bytes = codes;
    for (uint64_t i = 0; i < count; i++)
        f[i] = dtype == SMELT_DTYPE_I8 ? (float)(int8_t)bytes[i] : d->e4m3[bytes[i]];
    return f;
}

/* A scaled GEMM (the file's comment): A [m, k] and B [n, k] codes. */
static smelt_status host_scaled_gemm(host_device *d, const rt_gemm_args *g, bool plain, rt_error *e) {
    int m = (int)g->m, n = (int)g->n, k = (int)g->k;
    uint64_t mk = (uint64_t)m * (uint64_t)k, nk = (uint64_t)n * (uint64_t)k, mn = (uint64_t)m * (uint64_t)n;
    if (!host_runs_scaled_gemm(&d->base, g->dtype_a) || g->dtype_b != g->dtype_a || !g->b_transposed)
        return rt_fail(e, SMELT_ERROR_UNSUPPORTED, "no scaled product of %s x %s%s on the host",
                       smelt_dtype_name(g->dtype_a), smelt_dtype_name(g->dtype_b),
                       g->b_transposed ? "^T" : "");
    const float *a = codes_f32(d, g->a, g->dtype_a, mk, SCRATCH_A);
    const float *b = codes_f32(d, g->b, g->dtype_b, nk, SCRATCH_B);
    const float *b_scale = operand_f32(d, g->b_scale, g->dtype_b_scale, (uint64_t)n, SCRATCH_SCALE);
    float *c = g->dtype_c == SMELT_DTYPE_F32 ? g->c : scratch(d, SCRATCH_C, mn);
    if (!a || !b || !b_scale || !c)
        return rt_fail(e, SMELT_ERROR_OUT_OF_MEMORY,
                       "out of memory decoding a %d x %d x %d scaled product to f32", m, n, k);
    if (plain)
        plain_sgemm(m, n, k, a, b, true, 0.0f, c);
    else
        blas.sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, m, n, k, 1.0f, a, k, b, k, 0.0f, c, n);
    const float *a_scale = g->a_scale;
    for (int i = 0; i < m; i++)
        for (int j = 0; j < n; j++) {
            uint64_t at = (uint64_t)i * (uint64_t)n + (uint64_t)j;
            float v = (c[at] * a_scale[i]) * b_scale[j];
            if (g->has_bias) v += element_f32(g->bias, g->dtype_bias, (uint64_t)j);
            if (g->residual) v += element_f32(g->residual, g->dtype_c, at);
            c[at] = v;
        }
    if (is_half(g->dtype_c)) {
        uint16_t *out = g->c;
        for (uint64_t i = 0; i < mn; i++)
            out[i] = g->dtype_c == SMELT_DTYPE_F16 ? plan_f32_to_f16(c[i]) : plan_f32_to_bf16(c[i]);
    }
    return SMELT_OK;
}

static smelt_status host_gemm(rt_device *device, const rt_gemm_args *g, rt_error *e) {
    host_device *d = as_host(device);
    bool plain = address_space_limited();
    smelt_status loaded = plain ? SMELT_OK : load_blas(e);
    if (loaded != SMELT_OK) return loaded;
    if (g->m > INT_MAX || g->n > INT_MAX || g->k > INT_MAX)
        return rt_fail(e, SMELT_ERROR_UNSUPPORTED, "a %lld x %lld x %lld product exceeds BLAS's int dims",
                       (long long)g->m, (long long)g->n, (long long)g->k);
    if (g->has_scales) return host_scaled_gemm(d, g, plain, e);
    int m = (int)g->m, n = (int)g->n, k = (int)g->k;
    uint64_t mk = (uint64_t)m * (uint64_t)k, nk = (uint64_t)n * (uint64_t)k, mn = (uint64_t)m * (uint64_t)n;
    const float *a = operand_f32(d, g->a, g->dtype_a, mk, SCRATCH_A);
    const float *b;
    if (is_half(g->dtype_b) && g->b_weight < d->shadow_count && d->weight_shadows[g->b_weight])
        b = d->weight_shadows[g->b_weight] + g->b_weight_offset / 2;
    else
        b = operand_f32(d, g->b, g->dtype_b, nk, SCRATCH_B);
    float *c = g->dtype_c == SMELT_DTYPE_F32 ? g->c : scratch(d, SCRATCH_C, mn);
    if (!a || !b || !c)
        return rt_fail(e, SMELT_ERROR_OUT_OF_MEMORY, "out of memory widening a %d x %d x %d product to f32",
                       m, n, k);
    float beta = 0.0f;
    if (g->has_bias) { /* C starts as the bias in every row; the product adds to it */
        for (int j = 0; j < n; j++)
            c[j] = element_f32(g->bias, g->dtype_bias, (uint64_t)j);
        for (int i = 1; i < m; i++)
            memcpy(c + (size_t)i * n, c, (size_t)n * sizeof *c);
        beta = 1.0f;
    }
    if (g->residual) { /* and the residual (of C's dtype), as cuBLASLt's C with beta = 1 */
        for (uint64_t i = 0; i < mn; i++) {
            float r = element_f32(g->residual, g->dtype_c, i);
            c[i] = beta != 0.0f ? c[i] + r : r;
        }
        beta = 1.0f;
    }
    if (plain)
        plain_sgemm(m, n, k, a, b, g->b_transposed, beta, c);
    else
        blas.sgemm(CblasRowMajor, CblasNoTrans, g->b_transposed ? CblasTrans : CblasNoTrans, m, n, k, 1.0f, a,
                   k, b, g->b_transposed ? k : n, beta, c, n);
    if (is_half(g->dtype_c)) {
        uint16_t *out = g->c;
        for (uint64_t i = 0; i < mn; i++)
            out[i] = g->dtype_c == SMELT_DTYPE_F16 ? plan_f32_to_f16(c[i]) : plan_f32_to_bf16(c[i]);
    }
    return SMELT_OK;
}

static smelt_status host_weight_bound(rt_device *device, uint32_t index, const void *address, uint64_t bytes,
                                      smelt_dtype dtype, bool gemm_operand, rt_error *e) {
    host_device *d = as_host(device);
    if (index >= d->shadow_count) {
        if (!(is_half(dtype) && gemm_operand)) return SMELT_OK; /* never had a shadow */
        uint32_t count = index + 1;
        float **grown = realloc(d->weight_shadows, count * sizeof *grown);
        if (!grown) return rt_fail(e, SMELT_ERROR_OUT_OF_MEMORY, "out of memory for weight shadows");
        memset(grown + d->shadow_count, 0, (count - d->shadow_count) * sizeof *grown);
        d->weight_shadows = grown;
        d->shadow_count = count;
    }
    free(d->weight_shadows[index]);
    d->weight_shadows[index] = NULL;
    if (!(is_half(dtype) && gemm_operand)) return SMELT_OK;
    uint64_t count = bytes / 2;
    float *shadow = count <= SIZE_MAX / sizeof(float) ? malloc((size_t)count * sizeof(float)) : NULL;
    if (!shadow)
        return rt_fail(e, SMELT_ERROR_OUT_OF_MEMORY,
                       "out of memory for the f32 copy of a %llu-byte %s weight", (unsigned long long)bytes,
                       smelt_dtype_name(dtype));
    widen_half(shadow, address, dtype, count);
    d->weight_shadows[index] = shadow;
    return SMELT_OK;
}

/* ---- Life cycle ----------------------------------------------------------------- */

static const char *host_name(const rt_device *device) { return ((const host_device *)device)->name; }

static void host_destroy(rt_device *device) {
    host_device *d = as_host(device);
    unload_kernels(d);
    for (uint32_t i = 0; i < d->shadow_count; i++)
        free(d->weight_shadows[i]);
    free(d->weight_shadows);
    for (int i = 0; i < SCRATCH_COUNT; i++)
        free(d->scratch[i]);
    if (d->pool) sim_pool_free(d->pool);
    free(d);
}

static const rt_device_ops host_ops = {
    .kind = "host",
    .alloc = host_alloc,
    .free = host_free,
    .copy_in = host_copy,
    .copy_out = host_copy,
    .zero = host_zero,
    .load_kernels = host_load_kernels,
    .launch = host_launch,
    .gemm = host_gemm,
    .sync = host_sync,
    .name = host_name,
    .destroy = host_destroy,
    .map_host = host_map,
    .weight_bound = host_weight_bound,
    .capture_begin = NULL, /* launches are synchronous calls: nothing to gain from graphs */
    .capture_end = NULL,
    .replay = NULL,
    .runs_scaled_gemm = host_runs_scaled_gemm,
    .prepare_gemm = NULL, /* an f16 b_scale is widened per call */
};

smelt_status rt_device_host_create(unsigned workers, rt_device **out, rt_error *e) {
    *out = NULL;
    host_device *d = calloc(1, sizeof *d);
    if (!d) return rt_fail(e, SMELT_ERROR_OUT_OF_MEMORY, "out of memory for the host device");
    d->base.ops = &host_ops;
    for (int code = 0; code < 256; code++)
        d->e4m3[code] = plan_f8e4m3_to_f32((uint8_t)code);
    d->pool = sim_pool_create(workers);
    if (!d->pool) {
        free(d);
        return rt_fail(e, SMELT_ERROR_OUT_OF_MEMORY, "cannot start the host simulator's worker threads");
    }
    unsigned count = sim_pool_worker_count(d->pool);
    snprintf(d->name, sizeof d->name, "host (%u simulator worker%s)", count, count == 1 ? "" : "s");
    *out = &d->base;
    return SMELT_OK;
}
