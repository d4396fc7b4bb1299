/* test_nvrtc.c - the NVRTC wrapper, the ptxas resource-log parser and the
 * compile pool.
 *
 * NVRTC compiles to PTX and cubin without a GPU, so these run on any machine
 * with the CUDA toolkit; a build without NVRTC checks only its error and the
 * parser. Kernels include the real runtime/smelt_kernel.h. The parser is
 * also checked on ptxas logs captured from NVRTC 13.0 (sm_80, sm_90).
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "compile_pool.h"
#include "nvrtc.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

static char *kernel_header_text; /* runtime/smelt_kernel.h */
static cg_header kernel_header;

static char *read_text(const char *path) {
    FILE *f = fopen(path, "rb");
    if (!f) return NULL;
    fseek(f, 0, SEEK_END);
    long size = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *text = malloc((size_t)size + 1);
    size_t n = fread(text, 1, (size_t)size, f);
    fclose(f);
    text[n] = '\0';
    return text;
}

static int load_kernel_header(void **state) {
    (void)state;
    kernel_header_text = read_text(SMELT_SOURCE_DIR "/runtime/smelt_kernel.h");
    if (!kernel_header_text) return -1;
    kernel_header = (cg_header){"smelt_kernel.h", kernel_header_text};
    return 0;
}

static int free_kernel_header(void **state) {
    (void)state;
    free(kernel_header_text);
    return 0;
}

static double seconds_now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (double)t.tv_sec + (double)t.tv_nsec * 1e-9;
}

static const char scale_source[] = "#include \"smelt_kernel.h\"\n"
                                   "SMELT_KERNEL void scale_f32(float *y, const float *x, float a, int n) {\n"
                                   "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                                   "    if (i < n) y[i] = a * x[i];\n"
                                   "}\n";

/* 256 floats of static shared memory and one barrier. */
static const char reverse_source[] = "#include \"smelt_kernel.h\"\n"
                                     "SMELT_KERNEL void reverse_256(float *y, const float *x) {\n"
                                     "    __shared__ float tile[256];\n"
                                     "    tile[threadIdx.x] = x[blockIdx.x * 256 + threadIdx.x];\n"
                                     "    __syncthreads();\n"
                                     "    y[blockIdx.x * 256 + threadIdx.x] = tile[255 - threadIdx.x];\n"
                                     "}\n";

/* 32 live accumulators under a 24-register cap: ptxas must spill. */
static const char pressure_source[] =
    "#include \"smelt_kernel.h\"\n"
    "SMELT_KERNEL void pressure(float *y, const float *x, int n) {\n"
    "    float acc[32];\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < 32; j++) acc[j] = x[j * n + threadIdx.x];\n"
    "    for (int it = 0; it < n; it++) {\n"
    "#pragma unroll\n"
    "        for (int j = 0; j < 32; j++) acc[j] = acc[j] * acc[(j + 7) & 31] + x[it + j];\n"
    "    }\n"
    "    float s = 0.f;\n"
    "#pragma unroll\n"
    "    for (int j = 0; j < 32; j++) s += acc[j];\n"
    "    y[threadIdx.x] = s;\n"
    "}\n";

/* A local array indexed by data: it lives in the stack frame (512 floats). */
static const char local_array_source[] =
    "#include \"smelt_kernel.h\"\n"
    "SMELT_KERNEL void gather_local(float *y, const int *index, int n) {\n"
    "    float buffer[512];\n"
    "    for (int i = 0; i < 512; i++) buffer[i] = y[i * n];\n"
    "    y[threadIdx.x] = buffer[index[threadIdx.x]];\n"
    "}\n";

/* cg_compile_all, which must set up its pool: returns the count of failures. */
static size_t compile_all(const cg_compile_request *jobs, size_t count, unsigned threads, cg_cache *cache,
                          cg_compile_result *results, cg_progress_fn progress, void *user) {
    size_t failed = 0;
    char error[256];
    assert_true(
        cg_compile_all(jobs, count, threads, cache, results, progress, user, &failed, error, sizeof error));
    return failed;
}

static cg_compile_request request(const char *source, const char *name, int arch) {
    return (cg_compile_request){.source = source,
                                .kernel_name = name,
                                .headers = &kernel_header,
                                .header_count = 1,
                                .arch = arch,
                                .want_cubin = true,
                                .want_ptx = true};
}

static bool have_nvrtc(void) {
#ifdef SMELT_HAVE_NVRTC
    return true;
#else
    return false;
#endif
}

/* ---- compiling ------------------------------------------------------------ */

static void check_small_kernel(int arch) {
    cg_compile_request req = request(scale_source, "scale_f32", arch);
    cg_compiled out;
    char error[4096];
    double start = seconds_now();
    bool ok = cg_compile_kernel(&req, &out, error, sizeof error);
    double elapsed = seconds_now() - start;
    if (!ok) fail_msg("%s", error);
    print_message("NVRTC sm_%d: scale_f32 compiled in %.1f ms\n", arch, elapsed * 1e3);
    assert_true(out.cubin_size > 4);
    assert_memory_equal(out.cubin,
                        "\x7f"
                        "ELF",
                        4);
    char target[32];
    snprintf(target, sizeof target, ".target sm_%d", arch);
    assert_non_null(out.ptx);
    assert_non_null(strstr(out.ptx, target));
    assert_non_null(strstr(out.ptx, ".entry scale_f32"));
    assert_int_equal(out.ptx_size, strlen(out.ptx));
    assert_int_equal(out.resources.kernel_count, 1);
    const cg_kernel_resources *k = cg_resource_find(&out.resources, "scale_f32");
    assert_non_null(k);
    assert_true(k->registers > 0 && k->registers <= 32);
    assert_int_equal(k->spill_store_bytes, 0);
    assert_int_equal(k->spill_load_bytes, 0);
    assert_int_equal(k->stack_frame_bytes, 0);
    assert_int_equal(k->shared_bytes, 0);
    cg_compiled_free(&out);
    assert_null(out.cubin);
}

static void test_compile_sm80(void **state) {
    (void)state;
    if (!have_nvrtc()) skip();
    check_small_kernel(80);
}

static void test_compile_sm90(void **state) {
    (void)state;
    if (!have_nvrtc()) skip();
    check_small_kernel(90);
}

static void test_ptx_only_targets_virtual_arch(void **state) {
    (void)state;
    if (!have_nvrtc()) skip();
    cg_compile_request req = request(scale_source, "scale_f32", 90);
    req.want_cubin = false;
    cg_fixed_options fixed;
    cg_nvrtc_fixed_options(&req, &fixed);
    assert_string_equal(fixed.options[0], "--gpu-architecture=compute_90");
    cg_compiled out;
    char error[4096];
    if (!cg_compile_kernel(&req, &out, error, sizeof error)) fail_msg("%s", error);
    assert_null(out.cubin);
    assert_int_equal(out.cubin_size, 0);
    assert_non_null(strstr(out.ptx, ".target sm_90"));
    /* no ptxas ran, so no resources */
    assert_int_equal(out.resources.kernel_count, 0);
    cg_compiled_free(&out);
}

static void test_fixed_options(void **state) {
    (void)state;
    cg_compile_request req = request(scale_source, "k", 80);
    req.line_info = true;
    cg_fixed_options fixed;
    cg_nvrtc_fixed_options(&req, &fixed);
    assert_int_equal(fixed.count, 6);
    assert_string_equal(fixed.options[0], "--gpu-architecture=sm_80");
    assert_string_equal(fixed.options[1], "-default-device");
    assert_string_equal(fixed.options[2], "--std=c++17");
    assert_string_equal(fixed.options[3], "--ptxas-options=-v");
    assert_string_equal(fixed.options[4], "-minimal");
    assert_string_equal(fixed.options[5], "-lineinfo");
    req.line_info = false;
    cg_nvrtc_fixed_options(&req, &fixed);
    assert_int_equal(fixed.count, 5);
}

static void test_shared_memory_and_barrier(void **state) {
    (void)state;
    if (!have_nvrtc()) skip();
    cg_compile_request req = request(reverse_source, "reverse_256", 80);
    cg_compiled out;
    char error[4096];
    if (!cg_compile_kernel(&req, &out, error, sizeof error)) fail_msg("%s", error);
    const cg_kernel_resources *k = cg_resource_find(&out.resources, "reverse_256");
    assert_non_null(k);
    assert_int_equal(k->shared_bytes, 256 * sizeof(float));
    assert_int_equal(k->barriers, 1);
    assert_true(k->constant_bytes > 0); /* sm_80 reports the parameter bank cmem[0] */
    cg_compiled_free(&out);
}

static void test_register_cap_makes_spills(void **state) {
    (void)state;
    if (!have_nvrtc()) skip();
    const char *cap[] = {"--maxrregcount=24"};
    cg_compile_request req = request(pressure_source, "pressure", 90);
    req.extra_options = cap;
    req.extra_option_count = 1;
    cg_compiled out;
    char error[4096];
    if (!cg_compile_kernel(&req, &out, error, sizeof error)) fail_msg("%s", error);
    const cg_kernel_resources *k = cg_resource_find(&out.resources, "pressure");
    assert_non_null(k);
    assert_int_equal(k->registers, 24);
    assert_true(k->spill_store_bytes > 0);
    assert_true(k->spill_load_bytes > 0);
    assert_true(k->stack_frame_bytes > 0);
    cg_compiled_free(&out);
}

static void test_dynamic_local_array_uses_stack(void **state) {
    (void)state;
    if (!have_nvrtc()) skip();
    cg_compile_request req = request(local_array_source, "gather_local", 80);
    cg_compiled out;
    char error[4096];
    if (!cg_compile_kernel(&req, &out, error, sizeof error)) fail_msg("%s", error);
    const cg_kernel_resources *k = cg_resource_find(&out.resources, "gather_local");
    assert_non_null(k);
    assert_int_equal(k->stack_frame_bytes, 512 * sizeof(float));
    cg_compiled_free(&out);
}

static void test_syntax_error_quotes_nvrtc_log(void **state) {
    (void)state;
    if (!have_nvrtc()) skip();
    const char *source = "#include \"smelt_kernel.h\"\n"
                         "SMELT_KERNEL void broken(float *y) {\n"
                         "    y[0] = undefined_thing + ;\n"
                         "}\n";
    cg_compile_request req = request(source, "broken_kernel", 90);
    cg_compiled out;
    char error[4096];
    assert_false(cg_compile_kernel(&req, &out, error, sizeof error));
    assert_null(out.cubin);
    assert_null(out.log);
    assert_non_null(strstr(error, "kernel 'broken_kernel'"));
    assert_non_null(strstr(error, "sm_90"));
    assert_non_null(strstr(error, "NVRTC_ERROR_COMPILATION"));
    /* NVRTC's own words, located in the kernel's file (line 3). */
    assert_non_null(strstr(error, "broken_kernel.cu(3): error: identifier \"undefined_thing\" is undefined"));
    assert_non_null(strstr(error, "expected an expression"));
}

static void test_error_fits_small_buffer(void **state) {
    (void)state;
    if (!have_nvrtc()) skip();
    cg_compile_request req = request("this is not C", "tiny", 90);
    req.header_count = 0;
    cg_compiled out;
    char error[24];
    assert_false(cg_compile_kernel(&req, &out, error, sizeof error));
    assert_int_equal(strlen(error), sizeof error - 1);
    assert_false(cg_compile_kernel(&req, &out, NULL, 0)); /* no buffer: still fails cleanly */
}

static void test_bad_requests(void **state) {
    (void)state;
    cg_compiled out;
    char error[512];
    cg_compile_request req = request(scale_source, "scale_f32", 7);
    assert_false(cg_compile_kernel(&req, &out, error, sizeof error));
    assert_string_equal(error, "kernel 'scale_f32': expected an architecture like 80 or 90, found 7");
    req = request(scale_source, "scale_f32", 90);
    req.want_cubin = req.want_ptx = false;
    assert_false(cg_compile_kernel(&req, &out, error, sizeof error));
    assert_string_equal(error, "kernel 'scale_f32': neither a cubin nor PTX was requested");
    req = request(NULL, NULL, 90);
    assert_false(cg_compile_kernel(&req, &out, error, sizeof error));
    assert_string_equal(error, "kernel '(unnamed)': no source text");
    /* a long kernel name is cut in the message */
    char *long_name = malloc(1 << 20);
    memset(long_name, 'k', (1 << 20) - 1);
    long_name[(1 << 20) - 1] = '\0';
    req = request(NULL, long_name, 90);
    assert_false(cg_compile_kernel(&req, &out, error, sizeof error));
    assert_true(strlen(error) < 120);
    assert_non_null(strstr(error, "kkk...': no source text"));
    free(long_name);
    if (!have_nvrtc()) return;
    req = request(scale_source, "scale_f32", 12); /* an arch number NVRTC 13 dropped */
    assert_false(cg_compile_kernel(&req, &out, error, sizeof error));
    assert_non_null(strstr(error, "cannot compile for sm_12 (it supports"));
    assert_non_null(strstr(error, "90"));
}

static void test_headers_and_extra_options(void **state) {
    (void)state;
    if (!have_nvrtc()) skip();
    const char *source = "#include \"smelt_kernel.h\"\n"
                         "#include \"sizes.h\"\n"
                         "SMELT_KERNEL void fill(float *y) { y[threadIdx.x] = WIDTH * FACTOR; }\n";
    cg_header headers[] = {kernel_header, {"sizes.h", "#define WIDTH 64\n"}};
    const char *options[] = {"-DFACTOR=3"};
    cg_compile_request req = {.source = source,
                              .kernel_name = "fill",
                              .headers = headers,
                              .header_count = 2,
                              .arch = 90,
                              .want_ptx = true,
                              .extra_options = options,
                              .extra_option_count = 1};
    cg_compiled out;
    char error[4096];
    if (!cg_compile_kernel(&req, &out, error, sizeof error)) fail_msg("%s", error);
    /* 64 * 3 = 192.0f, stored as its bit pattern 0x43400000 = 1128267776 */
    assert_non_null(strstr(out.ptx, "1128267776"));
    cg_compiled_free(&out);
    req.extra_option_count = 0; /* FACTOR undefined now */
    assert_false(cg_compile_kernel(&req, &out, error, sizeof error));
    assert_non_null(strstr(error, "identifier \"FACTOR\" is undefined"));
}

static void test_version(void **state) {
    (void)state;
    int major = -1, minor = -1;
    bool ok = cg_nvrtc_version(&major, &minor);
    assert_int_equal(ok, have_nvrtc());
    if (ok)
        assert_true(major >= 12);
    else
        assert_int_equal(major, 0);
    assert_int_equal(cg_nvrtc_supports_arch(90), have_nvrtc());
    assert_false(cg_nvrtc_supports_arch(12));
}

static void test_without_nvrtc_error(void **state) {
    (void)state;
    if (have_nvrtc()) skip();
    cg_compile_request req = request(scale_source, "scale_f32", 90);
    cg_compiled out;
    char error[512];
    assert_false(cg_compile_kernel(&req, &out, error, sizeof error));
    assert_non_null(strstr(error, "built without NVRTC"));
}

/* ---- the ptxas log parser on captured logs ------------------------------- */

/* NVRTC 13.0, sm_80: two kernels, one with a 2 KiB stack array. */
static const char log_sm80_two_kernels[] =
    "ptxas info    : 0 bytes gmem\n"
    "ptxas info    : Compiling entry function 'two' for 'sm_80'\n"
    "ptxas info    : Function properties for two\n"
    "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
    "ptxas info    : Used 14 registers, used 1 barriers, 256 bytes smem, 360 bytes cmem[0]\n"
    "ptxas info    : Compile time = 4.069 ms\n"
    "ptxas info    : Compiling entry function 'spill' for 'sm_80'\n"
    "ptxas info    : Function properties for spill\n"
    "ptxas         .     2048 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
    "ptxas info    : Used 40 registers, used 1 barriers, 2048 bytes cumulative stack size, 1024 bytes smem, "
    "372 bytes cmem[0]\n"
    "ptxas info    : Compile time = 37.210 ms\n";

/* NVRTC 13.0, sm_90, --maxrregcount=16: a warning line and real spills. */
static const char log_sm90_spills[] =
    "ptxas warning : For profile sm_90 adjusting per thread register count of 16 to lower bound of 24\n"
    "ptxas info    : Overriding maximum register limit 256 for 'pressure' with  24 of maxrregcount option\n"
    "ptxas info    : 0 bytes gmem\n"
    "ptxas info    : Compiling entry function 'pressure' for 'sm_90'\n"
    "ptxas info    : Function properties for pressure\n"
    "ptxas         .     176 bytes stack frame, 616 bytes spill stores, 672 bytes spill loads\n"
    "ptxas info    : Used 24 registers, used 0 barriers, 176 bytes cumulative stack size\n"
    "ptxas info    : Compile time = 36.827 ms\n";

/* NVRTC 13.0, sm_80: __device__ and __constant__ variables (module banks). */
static const char log_sm80_module_memory[] =
    "ptxas info    : 256 bytes gmem, 64 bytes cmem[3], 8 bytes cmem[4]\n"
    "ptxas info    : Compiling entry function 'g' for 'sm_80'\n"
    "ptxas info    : Function properties for g\n"
    "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
    "ptxas info    : Used 10 registers, used 0 barriers, 360 bytes cmem[0]\n"
    "ptxas info    : Compile time = 2.217 ms\n";

/* NVRTC 13.0, sm_90: a __noinline__ device function gets its own block
 * after the kernel's; it must not overwrite the kernel's numbers. */
static const char log_sm90_device_function[] =
    "ptxas info    : 0 bytes gmem\n"
    "ptxas info    : Compiling entry function 'uses_helper' for 'sm_90'\n"
    "ptxas info    : Function properties for uses_helper\n"
    "ptxas         .     256 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n"
    "ptxas info    : Used 32 registers, used 0 barriers, 256 bytes cumulative stack size\n"
    "ptxas info    : Compile time = 12.204 ms\n"
    "ptxas info    : Function properties for _Z6helperPKfi\n"
    "ptxas         .     0 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads\n";

static void test_parse_two_kernels(void **state) {
    (void)state;
    cg_resource_report r;
    assert_true(cg_parse_ptxas_log(log_sm80_two_kernels, &r));
    assert_int_equal(r.kernel_count, 2);
    assert_string_equal(r.kernels[0].name, "two");
    assert_string_equal(r.kernels[1].name, "spill");
    const cg_kernel_resources *two = &r.kernels[0], *spill = &r.kernels[1];
    assert_int_equal(two->registers, 14);
    assert_int_equal(two->barriers, 1);
    assert_int_equal(two->shared_bytes, 256);
    assert_int_equal(two->constant_bytes, 360);
    assert_int_equal(two->stack_frame_bytes, 0);
    assert_int_equal(spill->registers, 40);
    assert_int_equal(spill->shared_bytes, 1024);
    assert_int_equal(spill->stack_frame_bytes, 2048);
    assert_int_equal(spill->spill_store_bytes, 0);
    assert_int_equal(spill->constant_bytes, 372);
    assert_int_equal(r.global_bytes, 0);
    cg_resource_report_free(&r);
}

static void test_parse_spills(void **state) {
    (void)state;
    cg_resource_report r;
    assert_true(cg_parse_ptxas_log(log_sm90_spills, &r));
    assert_int_equal(r.kernel_count, 1);
    const cg_kernel_resources *k = cg_resource_find(&r, "pressure");
    assert_non_null(k);
    assert_int_equal(k->registers, 24);
    assert_int_equal(k->barriers, 0);
    assert_int_equal(k->stack_frame_bytes, 176);
    assert_int_equal(k->spill_store_bytes, 616);
    assert_int_equal(k->spill_load_bytes, 672);
    assert_int_equal(k->shared_bytes, 0);
    assert_int_equal(k->constant_bytes, 0);
    cg_resource_report_free(&r);
}

static void test_parse_module_memory(void **state) {
    (void)state;
    cg_resource_report r;
    assert_true(cg_parse_ptxas_log(log_sm80_module_memory, &r));
    assert_int_equal(r.global_bytes, 256);
    assert_int_equal(r.module_constant_bytes, 72);
    assert_int_equal(r.kernel_count, 1);
    assert_int_equal(r.kernels[0].registers, 10);
    assert_int_equal(r.kernels[0].constant_bytes, 360);
    cg_resource_report_free(&r);
}

static void test_parse_skips_device_function(void **state) {
    (void)state;
    cg_resource_report r;
    assert_true(cg_parse_ptxas_log(log_sm90_device_function, &r));
    assert_int_equal(r.kernel_count, 1);
    assert_int_equal(r.kernels[0].registers, 32);
    assert_int_equal(r.kernels[0].stack_frame_bytes, 256);
    assert_null(cg_resource_find(&r, "_Z6helperPKfi"));
    cg_resource_report_free(&r);
}

static void test_parse_odd_input(void **state) {
    (void)state;
    cg_resource_report r;
    assert_true(cg_parse_ptxas_log(NULL, &r));
    assert_int_equal(r.kernel_count, 0);
    assert_true(cg_parse_ptxas_log("", &r));
    assert_int_equal(r.kernel_count, 0);
    cg_parse_ptxas_log(
        "k.cu(1): warning: something\nptxas\nptxas info : Used\nptxas info    : Used x registers\n", &r);
    assert_int_equal(r.kernel_count, 0);
    cg_resource_report_free(&r);
    /* numbers too big saturate; no trailing newline; an unterminated quote */
    cg_parse_ptxas_log("ptxas info    : Compiling entry function 'k' for 'sm_90'\n"
                       "ptxas info    : Compiling entry function 'unterminated\n"
                       "ptxas info    : Used 99999999999999999999 registers, 5 bytes smem",
                       &r);
    assert_int_equal(r.kernel_count, 1);
    assert_int_equal(r.kernels[0].registers, UINT32_MAX);
    assert_int_equal(r.kernels[0].shared_bytes, 5);
    cg_resource_report_free(&r);
    /* the real log of a real compile agrees with what we parsed above */
    if (!have_nvrtc()) return;
    cg_compile_request req = request(local_array_source, "gather_local", 90);
    cg_compiled out;
    char error[4096];
    if (!cg_compile_kernel(&req, &out, error, sizeof error)) fail_msg("%s", error);
    assert_non_null(strstr(out.log, "Compiling entry function 'gather_local' for 'sm_90'"));
    assert_non_null(strstr(out.log, "2048 bytes stack frame"));
    cg_compiled_free(&out);
}

/* ---- the pool ------------------------------------------------------------ */

typedef struct progress_record {
    size_t calls, last_done, last_total;
    bool increasing;
} progress_record;

static void record_progress(size_t done, size_t total, void *user) {
    progress_record *p = user;
    if (p->calls > 0 && done <= p->last_done) p->increasing = false;
    p->calls++;
    p->last_done = done;
    p->last_total = total;
}

static const char second_source[] = "#include \"smelt_kernel.h\"\n"
                                    "SMELT_KERNEL void add_one(float *y) { y[threadIdx.x] += 1.0f; }\n";

static void test_pool_dedupes_and_keeps_order(void **state) {
    (void)state;
    if (!have_nvrtc()) skip();
    /* 8 jobs, 4 distinct (2 sources x 2 archs), interleaved. */
    struct {
        const char *source, *name;
        int arch;
    } plan[8] = {{scale_source, "scale_f32", 80}, {second_source, "add_one", 90},
                 {scale_source, "scale_f32", 80}, {scale_source, "scale_f32", 90},
                 {second_source, "add_one", 80},  {second_source, "add_one", 90},
                 {scale_source, "scale_f32", 90}, {second_source, "add_one", 80}};
    cg_compile_request jobs[8];
    for (int i = 0; i < 8; i++)
        jobs[i] = request(plan[i].source, plan[i].name, plan[i].arch);
    cg_compile_result results[8];
    progress_record progress = {.increasing = true};
    size_t failed = compile_all(jobs, 8, 2, NULL, results, record_progress, &progress);
    assert_int_equal(failed, 0);
    size_t deduplicated = 0;
    for (int i = 0; i < 8; i++) {
        assert_true(results[i].ok);
        assert_null(results[i].error);
        assert_false(results[i].from_cache);
        deduplicated += results[i].deduplicated;
        char target[32];
        snprintf(target, sizeof target, ".target sm_%d", plan[i].arch);
        assert_non_null(strstr(results[i].compiled.ptx, target));
        assert_non_null(cg_resource_find(&results[i].compiled.resources, plan[i].name));
        assert_memory_equal(results[i].compiled.cubin,
                            "\x7f"
                            "ELF",
                            4);
    }
    assert_int_equal(deduplicated, 4);
    /* the first of each group is the one compiled; later ones are copies */
    assert_false(results[0].deduplicated);
    assert_true(results[2].deduplicated);
    assert_int_equal(results[2].compiled.cubin_size, results[0].compiled.cubin_size);
    assert_memory_equal(results[2].compiled.cubin, results[0].compiled.cubin, results[0].compiled.cubin_size);
    assert_true(results[2].compiled.cubin != results[0].compiled.cubin);
    assert_true(progress.calls >= 1 && progress.calls <= 4);
    assert_true(progress.increasing);
    assert_int_equal(progress.last_done, 8);
    assert_int_equal(progress.last_total, 8);
    cg_compile_results_free(results, 8);
}

static void test_pool_collects_every_error(void **state) {
    (void)state;
    if (!have_nvrtc()) skip();
    const char *bad_a = "#include \"smelt_kernel.h\"\nSMELT_KERNEL void bad_a(float *y) { y[0] = nope_a; }\n";
    const char *bad_b = "#include \"smelt_kernel.h\"\nSMELT_KERNEL void bad_b(float *y) { y[0] = nope_b; }\n";
    cg_compile_request jobs[5] = {request(bad_a, "bad_a", 90), request(scale_source, "scale_f32", 90),
                                  request(bad_b, "bad_b", 80), request(bad_a, "bad_a", 90),
                                  request(scale_source, "scale_f32", 12)};
    cg_compile_result results[5];
    size_t failed = compile_all(jobs, 5, 0, NULL, results, NULL, NULL);
    assert_int_equal(failed, 4);
    assert_false(results[0].ok);
    assert_non_null(strstr(results[0].error, "identifier \"nope_a\" is undefined"));
    assert_true(results[1].ok);
    assert_false(results[2].ok);
    assert_non_null(strstr(results[2].error, "identifier \"nope_b\" is undefined"));
    assert_false(results[3].ok);
    assert_true(results[3].deduplicated);
    assert_string_equal(results[3].error, results[0].error);
    assert_false(results[4].ok);
    assert_non_null(strstr(results[4].error, "sm_12"));
    cg_compile_results_free(results, 5);
    assert_int_equal(compile_all(jobs, 0, 2, NULL, results, NULL, NULL), 0);
}

/* ---- tasks on the pool ------------------------------------------------------ */

typedef struct task_log {
    pthread_mutex_t lock;
    const uint64_t *costs;
    size_t runs[64];  /* how often each task ran */
    size_t order[64]; /* task indices in the order they started */
    size_t started;
} task_log;

static uint64_t task_cost(void *context, size_t index) { return ((task_log *)context)->costs[index]; }

static void task_run(void *context, size_t index) {
    task_log *log = context;
    pthread_mutex_lock(&log->lock);
    log->runs[index]++;
    log->order[log->started++] = index;
    pthread_mutex_unlock(&log->lock);
}

static size_t run_tasks(const cg_compile_request *jobs, size_t count, cg_pool_tasks *tasks, unsigned threads,
                        cg_compile_result *results, progress_record *progress) {
    size_t failed = SIZE_MAX;
    char error[256];
    assert_true(cg_compile_all_with_tasks(jobs, count, tasks, threads, NULL, results, record_progress,
                                          progress, &failed, error, sizeof error));
    return failed;
}

/* One worker takes the costliest first; equal costs keep their order. */
static void test_pool_runs_tasks_costliest_first(void **state) {
    (void)state;
    static const uint64_t costs[6] = {10, 500, 40, 500, 0, 90};
    task_log log = {.lock = PTHREAD_MUTEX_INITIALIZER, .costs = costs};
    cg_pool_tasks tasks = {6, &log, task_cost, task_run};
    progress_record progress = {.increasing = true};
    assert_int_equal(run_tasks(NULL, 0, &tasks, 1, NULL, &progress), 0);
    static const size_t expected[6] = {1, 3, 5, 2, 0, 4};
    assert_int_equal(log.started, 6);
    for (size_t i = 0; i < 6; i++) {
        assert_int_equal(log.runs[i], 1);
        assert_int_equal(log.order[i], expected[i]);
    }
    assert_true(progress.increasing);
    assert_int_equal(progress.last_done, 6);
    assert_int_equal(progress.last_total, 6);

    /* many workers: each task still runs exactly once */
    static uint64_t many[64];
    for (size_t i = 0; i < 64; i++)
        many[i] = (i * 37) % 11;
    task_log wide = {.lock = PTHREAD_MUTEX_INITIALIZER, .costs = many};
    tasks = (cg_pool_tasks){64, &wide, task_cost, task_run};
    progress = (progress_record){.increasing = true};
    assert_int_equal(run_tasks(NULL, 0, &tasks, 8, NULL, &progress), 0);
    for (size_t i = 0; i < 64; i++)
        assert_int_equal(wide.runs[i], 1);
    assert_int_equal(progress.last_done, 64);
}

/* The estimate orders a long kernel before a short one. */
static void test_compile_cost_grows_with_source(void **state) {
    (void)state;
    cg_compile_request small = request(second_source, "add_one", 90), large = request(scale_source, "s", 90);
    assert_true(cg_compile_cost_estimate(&large) > cg_compile_cost_estimate(&small));
    cg_compile_request none = {0};
    assert_true(cg_compile_cost_estimate(&none) > 0);
}

/* Compiles and tasks on one pool: every compile's result in job order,
 * every task once, progress over both. */
static void test_pool_mixes_compiles_and_tasks(void **state) {
    (void)state;
    if (!have_nvrtc()) skip();
    cg_compile_request jobs[3] = {request(scale_source, "scale_f32", 80),
                                  request(second_source, "add_one", 90),
                                  request(scale_source, "scale_f32", 80)};
    static const uint64_t costs[4] = {1, 1000000000, 2, 3};
    task_log log = {.lock = PTHREAD_MUTEX_INITIALIZER, .costs = costs};
    cg_pool_tasks tasks = {4, &log, task_cost, task_run};
    cg_compile_result results[3];
    progress_record progress = {.increasing = true};
    assert_int_equal(run_tasks(jobs, 3, &tasks, 2, results, &progress), 0);
    assert_true(results[0].ok && results[1].ok && results[2].ok);
    assert_true(results[2].deduplicated);
    assert_non_null(cg_resource_find(&results[1].compiled.resources, "add_one"));
    assert_non_null(strstr(results[1].compiled.ptx, ".target sm_90"));
    for (size_t i = 0; i < 4; i++)
        assert_int_equal(log.runs[i], 1);
    assert_int_equal(log.order[0], 1); /* costlier than any compile: taken first */
    assert_int_equal(progress.last_done, 7);
    assert_int_equal(progress.last_total, 7);
    cg_compile_results_free(results, 3);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_compile_sm80),
        cmocka_unit_test(test_compile_sm90),
        cmocka_unit_test(test_ptx_only_targets_virtual_arch),
        cmocka_unit_test(test_fixed_options),
        cmocka_unit_test(test_shared_memory_and_barrier),
        cmocka_unit_test(test_register_cap_makes_spills),
        cmocka_unit_test(test_dynamic_local_array_uses_stack),
        cmocka_unit_test(test_syntax_error_quotes_nvrtc_log),
        cmocka_unit_test(test_error_fits_small_buffer),
        cmocka_unit_test(test_bad_requests),
        cmocka_unit_test(test_headers_and_extra_options),
        cmocka_unit_test(test_version),
        cmocka_unit_test(test_without_nvrtc_error),
        cmocka_unit_test(test_parse_two_kernels),
        cmocka_unit_test(test_parse_spills),
        cmocka_unit_test(test_parse_module_memory),
        cmocka_unit_test(test_parse_skips_device_function),
        cmocka_unit_test(test_parse_odd_input),
        cmocka_unit_test(test_pool_dedupes_and_keeps_order),
        cmocka_unit_test(test_pool_collects_every_error),
        cmocka_unit_test(test_pool_runs_tasks_costliest_first),
        cmocka_unit_test(test_compile_cost_grows_with_source),
        cmocka_unit_test(test_pool_mixes_compiles_and_tasks),
    };
    return cmocka_run_group_tests(tests, load_kernel_header, free_kernel_header);
}
