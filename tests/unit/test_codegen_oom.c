/* test_codegen_oom.c - out of memory in the CUDA compile path is a status.
 *
 * This program is linked with --wrap=malloc,--wrap=realloc (tests/
 * CMakeLists.txt), so every malloc and realloc of the code linked into it
 * (codegen/nvrtc.c and codegen/compile_pool.c among it) goes through
 * __wrap_malloc below, which fails the n-th one once armed. Each test fails
 * allocation 1, 2, ... in turn until a run sees no failure, and requires a
 * clean status every time; under ASan (leak checking on) nothing may leak.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "compile_pool.h"
#include "nvrtc.h"

#include <stdlib.h>
#include <string.h>

void *__real_malloc(size_t size);
void *__real_realloc(void *old, size_t size);

static long countdown; /* 0: disarmed; else the allocation that fails */
static bool injected;

static bool fail_now(void) {
    if (countdown == 0 || --countdown != 0) return false;
    injected = true;
    return true;
}

void *__wrap_malloc(size_t size) { return fail_now() ? NULL : __real_malloc(size); }
void *__wrap_realloc(void *old, size_t size) { return fail_now() ? NULL : __real_realloc(old, size); }

static void arm(long n) {
    countdown = n;
    injected = false;
}

static void disarm(void) { countdown = 0; }

static const char two_kernels[] =
    "ptxas info    : 0 bytes gmem\n"
    "ptxas info    : Compiling entry function 'two' for 'sm_80'\n"
    "ptxas info    : Used 14 registers, used 1 barriers, 256 bytes smem, 360 bytes cmem[0]\n"
    "ptxas info    : Compiling entry function 'spill' for 'sm_80'\n"
    "ptxas info    : Used 40 registers, 1024 bytes smem, 372 bytes cmem[0]\n";

static void test_parse_out_of_memory(void **state) {
    (void)state;
    long n = 1;
    for (;; n++) {
        cg_resource_report r;
        arm(n);
        bool ok = cg_parse_ptxas_log(two_kernels, &r);
        disarm();
        if (!injected) {
            assert_true(ok);
            assert_int_equal(r.kernel_count, 2);
            cg_resource_report_free(&r);
            break;
        }
        assert_false(ok);
        assert_int_equal(r.kernel_count, 0);
        assert_null(r.kernels);
        cg_resource_report_free(&r);
    }
    assert_true(n > 4); /* two names, two array growths */
}

/* Jobs that fail without NVRTC compiling anything (sm_12 exists nowhere),
 * each twice: the pool's setup, per-job error buffers and the copies of
 * deduplicated errors all allocate. */
static void test_pool_out_of_memory(void **state) {
    (void)state;
    cg_nvrtc_supports_arch(80); /* reads NVRTC's arch list (once per process) unarmed */
    static const cg_header header = {"h.h", "\n"};
    cg_compile_request jobs[4];
    for (int i = 0; i < 4; i++)
        jobs[i] = (cg_compile_request){.source = i % 2 ? "void a(void) {}\n" : "void b(void) {}\n",
                                       .kernel_name = i % 2 ? "a" : "b",
                                       .headers = &header,
                                       .header_count = 1,
                                       .arch = 12,
                                       .want_cubin = true};
    long n = 1;
    size_t setup_failures = 0, job_failures = 0;
    for (;; n++) {
        cg_compile_result results[4];
        size_t failed = 99;
        char error[64] = "";
        arm(n);
        bool set_up = cg_compile_all(jobs, 4, 2, NULL, results, NULL, NULL, &failed, error, sizeof error);
        disarm();
        if (!set_up) {
            assert_true(injected);
            assert_string_equal(error, "out of memory");
            for (int i = 0; i < 4; i++) {
                assert_false(results[i].ok);
                assert_null(results[i].error);
            }
            setup_failures++;
        } else {
            assert_int_equal(failed, 4);
            size_t out_of_memory = 0;
            for (int i = 0; i < 4; i++) {
                assert_false(results[i].ok);
                assert_non_null(results[i].error);
                out_of_memory += strstr(results[i].error, "out of memory") != NULL;
                if (!strstr(results[i].error, "out of memory"))
                    assert_non_null(strstr(results[i].error, "sm_12"));
            }
            assert_int_equal(out_of_memory > 0, injected);
            job_failures += out_of_memory > 0;
        }
        cg_compile_results_free(results, 4);
        if (!injected) break;
    }
    assert_true(setup_failures >= 5); /* keys, groups, sorted, uniques, workers */
    assert_true(job_failures >= 2);   /* two error buffers (the copies too, with NVRTC) */
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test(test_parse_out_of_memory),
        cmocka_unit_test(test_pool_out_of_memory),
    };
    return cmocka_run_group_tests(tests, NULL, NULL);
}
