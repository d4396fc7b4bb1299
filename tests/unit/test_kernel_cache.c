/* test_kernel_cache.c - the on-disk kernel cache and the host-kernel build.
 *
 * Each test gets a fresh cache folder under /tmp. Entries are damaged by
 * hand (a flipped byte, a cut file, another key's file) to check that they
 * are never trusted. NVRTC tests skip in a build without it; the host build
 * uses the system C compiler and dlopen()s what it made.
 */
#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <setjmp.h>
#include <cmocka.h>

#include "compile_pool.h"
#include "host_build.h"
#include "kernel_cache.h"

#include <dlfcn.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static char folder[64];
static cg_cache *cache;
static char *kernel_header_text;
static cg_header kernel_header;

static bool have_nvrtc(void) {
#ifdef SMELT_HAVE_NVRTC
    return true;
#else
    return false;
#endif
}

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

/* rm -r for the test folders (plain files and folders only). */
static void remove_tree(const char *path) {
    char command[256];
    snprintf(command, sizeof command, "rm -rf '%s'", path);
    if (system(command) != 0) print_error("could not remove %s\n", path);
}

/* Environment variables tests change; teardown puts them back even when
 * a failed assertion jumped out of the test. */
static const char *const saved_names[] = {"SMELT_CACHE_DIR", "XDG_CACHE_HOME", "HOME", "SMELT_HOST_CC",
                                          "TMPDIR"};
enum { SAVED_COUNT = sizeof saved_names / sizeof saved_names[0] };
static char *saved_values[SAVED_COUNT];

static int setup(void **state) {
    (void)state;
    for (int i = 0; i < SAVED_COUNT; i++)
        saved_values[i] = getenv(saved_names[i]) ? strdup(getenv(saved_names[i])) : NULL;
    snprintf(folder, sizeof folder, "/tmp/smelt-test-cache-XXXXXX");
    if (!mkdtemp(folder)) return -1;
    cache = cg_cache_open(folder);
    return 0;
}

static int teardown(void **state) {
    (void)state;
    for (int i = 0; i < SAVED_COUNT; i++) {
        if (saved_values[i])
            setenv(saved_names[i], saved_values[i], 1);
        else
            unsetenv(saved_names[i]);
        free(saved_values[i]);
        saved_values[i] = NULL;
    }
    cg_cache_close(cache);
    cache = NULL;
    remove_tree(folder);
    return 0;
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

static void entry_file(const cg_cache_key *key, char *path, size_t size) {
    char hex[33];
    cg_cache_key_hex(key, hex);
    snprintf(path, size, "%s/%s", folder, hex);
}

static cg_cache_key key_of(const char *text) {
    cg_cache_hasher *h = cg_cache_hasher_begin(CG_CACHE_HOST_OBJECT);
    cg_cache_hash_string(h, text);
    return cg_cache_hasher_finish(h);
}

static const char scale_source[] = "#include \"smelt_kernel.h\"\n"
                                   "SMELT_KERNEL void scale_f32(float *y, const float *x, float a, int n) {\n"
                                   "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                                   "    if (i < n) y[i] = a * x[i];\n"
                                   "}\n";

/* cg_compile_all, which must set up its pool: returns the count of failures. */
static size_t compile_all(const cg_compile_request *jobs, size_t count, unsigned threads,
                          cg_cache *kernel_cache, cg_compile_result *results, cg_progress_fn progress,
                          void *user) {
    size_t failed = 0;
    char error[256];
    assert_true(cg_compile_all(jobs, count, threads, kernel_cache, results, progress, user, &failed, error,
                               sizeof error));
    return failed;
}

static cg_compile_request request(const char *source, int arch) {
    return (cg_compile_request){.source = source,
                                .kernel_name = "scale_f32",
                                .headers = &kernel_header,
                                .header_count = 1,
                                .arch = arch,
                                .want_cubin = true,
                                .want_ptx = true};
}

/* ---- keys and the folder ------------------------------------------------- */

static void test_key_fields_are_length_delimited(void **state) {
    (void)state;
    cg_cache_hasher *h = cg_cache_hasher_begin(CG_CACHE_KERNEL);
    cg_cache_hash_string(h, "ab");
    cg_cache_hash_string(h, "c");
    cg_cache_key a = cg_cache_hasher_finish(h);
    h = cg_cache_hasher_begin(CG_CACHE_KERNEL);
    cg_cache_hash_string(h, "a");
    cg_cache_hash_string(h, "bc");
    cg_cache_key b = cg_cache_hasher_finish(h);
    assert_memory_not_equal(a.bytes, b.bytes, 16);
    cg_cache_key empty = key_of(""), null = key_of(NULL);
    assert_memory_not_equal(empty.bytes, null.bytes, 16);
    /* the kind is part of the key */
    h = cg_cache_hasher_begin(CG_CACHE_KERNEL);
    cg_cache_hash_string(h, "x");
    cg_cache_key kernel_x = cg_cache_hasher_finish(h);
    cg_cache_key host_x = key_of("x");
    assert_memory_not_equal(kernel_x.bytes, host_x.bytes, 16);
    assert_memory_equal(key_of("x").bytes, host_x.bytes, 16);
    char hex[33];
    cg_cache_key_hex(&host_x, hex);
    assert_int_equal(strlen(hex), 32);
    assert_int_equal(strspn(hex, "0123456789abcdef"), 32);
}

static void test_kernel_key_covers_every_input(void **state) {
    (void)state;
    cg_compile_request base = request(scale_source, 90);
    cg_cache_key k0 = cg_kernel_cache_key(&base);
    assert_memory_equal(cg_kernel_cache_key(&base).bytes, k0.bytes, 16);

    cg_compile_request r = base;
    r.kernel_name = "another_name"; /* names only matter with -lineinfo */
    assert_memory_equal(cg_kernel_cache_key(&r).bytes, k0.bytes, 16);
    r.line_info = true;
    assert_memory_not_equal(cg_kernel_cache_key(&r).bytes, k0.bytes, 16);

    r = base;
    r.arch = 80;
    assert_memory_not_equal(cg_kernel_cache_key(&r).bytes, k0.bytes, 16);
    r = base;
    r.want_ptx = false;
    assert_memory_not_equal(cg_kernel_cache_key(&r).bytes, k0.bytes, 16);
    r = base;
    const char *option[] = {"-DX=1"};
    r.extra_options = option;
    r.extra_option_count = 1;
    assert_memory_not_equal(cg_kernel_cache_key(&r).bytes, k0.bytes, 16);
    r = base;
    r.source = "#include \"smelt_kernel.h\"\n// changed\n";
    assert_memory_not_equal(cg_kernel_cache_key(&r).bytes, k0.bytes, 16);
    r = base;
    cg_header changed = {"smelt_kernel.h", "#define SMELT_KERNEL extern \"C\" __global__\n"};
    r.headers = &changed;
    assert_memory_not_equal(cg_kernel_cache_key(&r).bytes, k0.bytes, 16);
    cg_header renamed = {"other.h", kernel_header.text};
    r.headers = &renamed;
    assert_memory_not_equal(cg_kernel_cache_key(&r).bytes, k0.bytes, 16);
}

static void test_default_folder_order(void **state) {
    (void)state;
    char out[256];
    setenv("SMELT_CACHE_DIR", "/explicit/cache", 1);
    setenv("XDG_CACHE_HOME", "/xdg", 1);
    setenv("HOME", "/home/someone", 1);
    assert_true(cg_cache_default_folder(out, sizeof out));
    assert_string_equal(out, "/explicit/cache");
    unsetenv("SMELT_CACHE_DIR");
    assert_true(cg_cache_default_folder(out, sizeof out));
    assert_string_equal(out, "/xdg/smelt");
    setenv("XDG_CACHE_HOME", "relative/ignored", 1);
    assert_true(cg_cache_default_folder(out, sizeof out));
    assert_string_equal(out, "/home/someone/.cache/smelt");
    unsetenv("XDG_CACHE_HOME");
    assert_true(cg_cache_default_folder(out, sizeof out));
    assert_string_equal(out, "/home/someone/.cache/smelt");
    char tiny[8];
    assert_false(cg_cache_default_folder(tiny, sizeof tiny));
    unsetenv("HOME");
    assert_false(cg_cache_default_folder(out, sizeof out));
    /* without any folder the cache keeps nothing, and says so */
    cg_cache *homeless = cg_cache_open(NULL);
    assert_string_equal(cg_cache_folder(homeless), "");
    assert_non_null(cg_cache_warning(homeless));
    assert_non_null(strstr(cg_cache_warning(homeless), "no folder"));
    cg_cache_blob blob = {"x", 1};
    cg_cache_key key = key_of("x");
    assert_false(cg_cache_store(homeless, &key, CG_CACHE_HOST_OBJECT, &blob, 1));
    cg_cache_entry entry;
    assert_false(cg_cache_load(homeless, &key, CG_CACHE_HOST_OBJECT, &entry));
    cg_cache_close(homeless);
}

static void test_folder_created_on_first_store_with_mode_0700(void **state) {
    (void)state;
    char nested[128];
    snprintf(nested, sizeof nested, "%s/a/b/smelt", folder);
    setenv("SMELT_CACHE_DIR", nested, 1);
    cg_cache *c = cg_cache_open(NULL);
    assert_string_equal(cg_cache_folder(c), nested);
    struct stat st;
    assert_int_not_equal(stat(nested, &st), 0); /* nothing made yet */
    cg_cache_key key = key_of("first");
    cg_cache_blob blob = {"payload", 7};
    assert_true(cg_cache_store(c, &key, CG_CACHE_HOST_OBJECT, &blob, 1));
    assert_int_equal(stat(nested, &st), 0);
    assert_true(S_ISDIR(st.st_mode));
    assert_int_equal(st.st_mode & 0777, 0700);
    assert_null(cg_cache_warning(c));
    cg_cache_close(c);
}

/* ---- entries ------------------------------------------------------------- */

static void test_blobs_round_trip(void **state) {
    (void)state;
    cg_cache_key key = key_of("round trip");
    uint8_t binary[300];
    for (int i = 0; i < 300; i++)
        binary[i] = (uint8_t)(i * 7);
    cg_cache_blob blobs[3] = {{binary, sizeof binary}, {NULL, 0}, {"text", 4}};
    cg_cache_entry entry;
    assert_false(cg_cache_load(cache, &key, CG_CACHE_HOST_OBJECT, &entry));
    assert_true(cg_cache_store(cache, &key, CG_CACHE_HOST_OBJECT, blobs, 3));
    assert_true(cg_cache_load(cache, &key, CG_CACHE_HOST_OBJECT, &entry));
    assert_int_equal(entry.blob_count, 3);
    assert_int_equal(entry.blobs[0].size, 300);
    assert_memory_equal(entry.blobs[0].data, binary, 300);
    assert_int_equal(entry.blobs[1].size, 0);
    assert_int_equal(entry.blobs[2].size, 4);
    assert_memory_equal(entry.blobs[2].data, "text", 4);
    cg_cache_entry_free(&entry);
    /* the same key under another kind is not this entry */
    assert_false(cg_cache_load(cache, &key, CG_CACHE_KERNEL, &entry));
    cg_cache_stats s = cg_cache_get_stats(cache);
    assert_int_equal(s.hits, 1);
    assert_int_equal(s.misses, 2);
    assert_int_equal(s.stores, 1);
    assert_int_equal(s.rejected_entries, 1);
    /* the file is named by the key and holds header + payload exactly */
    char path[128];
    entry_file(&key, path, sizeof path);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    assert_int_equal(st.st_size, 56 + 3 * 8 + 300 + 0 + 4);
    /* no temporary files are left behind */
    char command[256];
    snprintf(command, sizeof command, "test $(ls -A '%s' | wc -l) -eq 1", folder);
    assert_int_equal(system(command), 0);
}

/* Damages the entry of `key` with `damage`, then checks it is rejected and
 * that a new store replaces it. */
static void check_damaged_entry_rejected(const char *name, void (*damage)(const char *path)) {
    cg_cache_key key = key_of(name);
    cg_cache_blob blob = {"0123456789abcdef", 16};
    assert_true(cg_cache_store(cache, &key, CG_CACHE_HOST_OBJECT, &blob, 1));
    char path[128];
    entry_file(&key, path, sizeof path);
    damage(path);
    cg_cache_stats before = cg_cache_get_stats(cache);
    cg_cache_entry entry;
    assert_false(cg_cache_load(cache, &key, CG_CACHE_HOST_OBJECT, &entry));
    assert_null(entry.payload);
    cg_cache_stats after = cg_cache_get_stats(cache);
    assert_int_equal(after.rejected_entries, before.rejected_entries + 1);
    assert_int_equal(after.misses, before.misses + 1);
    assert_true(cg_cache_store(cache, &key, CG_CACHE_HOST_OBJECT, &blob, 1));
    assert_true(cg_cache_load(cache, &key, CG_CACHE_HOST_OBJECT, &entry));
    assert_memory_equal(entry.blobs[0].data, "0123456789abcdef", 16);
    cg_cache_entry_free(&entry);
}

static void flip_byte_at(const char *path, long offset) {
    FILE *f = fopen(path, "r+b");
    assert_non_null(f);
    fseek(f, offset, SEEK_SET);
    int c = fgetc(f);
    fseek(f, offset, SEEK_SET);
    fputc(c ^ 0x40, f);
    fclose(f);
}
static void flip_payload_byte(const char *path) { flip_byte_at(path, 56 + 8 + 5); }
static void flip_magic_byte(const char *path) { flip_byte_at(path, 0); }
static void flip_blob_size_byte(const char *path) { flip_byte_at(path, 56); }
static void flip_key_byte(const char *path) { flip_byte_at(path, 20); }
static void cut_in_half(const char *path) { assert_int_equal(truncate(path, 40), 0); }
static void cut_last_byte(const char *path) {
    struct stat st;
    stat(path, &st);
    assert_int_equal(truncate(path, st.st_size - 1), 0);
}
static void make_empty(const char *path) { assert_int_equal(truncate(path, 0), 0); }
static void append_garbage(const char *path) {
    FILE *f = fopen(path, "ab");
    fputs("extra", f);
    fclose(f);
}
/* Another key's well-formed entry under this key's name. */
static void replace_with_other_entry(const char *path) {
    cg_cache_key other = key_of("some other entry");
    cg_cache_blob blob = {"0123456789abcdef", 16};
    assert_true(cg_cache_store(cache, &other, CG_CACHE_HOST_OBJECT, &blob, 1));
    char other_path[128];
    entry_file(&other, other_path, sizeof other_path);
    assert_int_equal(rename(other_path, path), 0);
}

static void test_damaged_entries_are_rejected_and_replaced(void **state) {
    (void)state;
    check_damaged_entry_rejected("payload", flip_payload_byte);
    check_damaged_entry_rejected("magic", flip_magic_byte);
    check_damaged_entry_rejected("blob size", flip_blob_size_byte);
    check_damaged_entry_rejected("key", flip_key_byte);
    check_damaged_entry_rejected("half", cut_in_half);
    check_damaged_entry_rejected("last byte", cut_last_byte);
    check_damaged_entry_rejected("empty", make_empty);
    check_damaged_entry_rejected("longer", append_garbage);
    check_damaged_entry_rejected("other key", replace_with_other_entry);
    cg_cache_key key = key_of("folder");
    char path[128];
    entry_file(&key, path, sizeof path);
    assert_int_equal(mkdir(path, 0700), 0); /* a folder where an entry should be */
    cg_cache_entry entry;
    assert_false(cg_cache_load(cache, &key, CG_CACHE_HOST_OBJECT, &entry));
}

static void test_unwritable_folder_is_a_warning(void **state) {
    (void)state;
    /* a folder below a plain file cannot be made, even by root */
    char file[128], below[160];
    snprintf(file, sizeof file, "%s/plain-file", folder);
    FILE *f = fopen(file, "w");
    fclose(f);
    snprintf(below, sizeof below, "%s/cache", file);
    cg_cache *c = cg_cache_open(below);
    assert_null(cg_cache_warning(c));
    cg_cache_key key = key_of("x");
    cg_cache_blob blob = {"x", 1};
    assert_false(cg_cache_store(c, &key, CG_CACHE_HOST_OBJECT, &blob, 1));
    const char *warning = cg_cache_warning(c);
    assert_non_null(warning);
    assert_non_null(strstr(warning, "cannot be created"));
    assert_non_null(strstr(warning, "Not a directory"));
    char first[1024];
    snprintf(first, sizeof first, "%s", warning);
    assert_false(cg_cache_store(c, &key, CG_CACHE_HOST_OBJECT, &blob, 1));
    assert_string_equal(cg_cache_warning(c), first); /* said once */
    cg_cache_stats s = cg_cache_get_stats(c);
    assert_int_equal(s.store_failures, 2);
    assert_int_equal(s.stores, 0);
    if (have_nvrtc()) {
        cg_compile_request req = request(scale_source, 90);
        cg_compiled out;
        bool from_cache = true;
        char error[4096];
        if (!cg_compile_kernel_cached(c, &req, &out, &from_cache, error, sizeof error)) fail_msg("%s", error);
        assert_false(from_cache);
        assert_memory_equal(out.cubin,
                            "\x7f"
                            "ELF",
                            4);
        cg_compiled_free(&out);
    }
    cg_cache_close(c);

    /* a read-only folder (root writes anyway, so only as another user) */
    if (geteuid() == 0) return;
    char read_only[128];
    snprintf(read_only, sizeof read_only, "%s/read-only", folder);
    assert_int_equal(mkdir(read_only, 0500), 0);
    c = cg_cache_open(read_only);
    assert_false(cg_cache_store(c, &key, CG_CACHE_HOST_OBJECT, &blob, 1));
    assert_non_null(strstr(cg_cache_warning(c), "not writable"));
    cg_cache_close(c);
    chmod(read_only, 0700);
}

/* ---- kernels through the cache ------------------------------------------- */

static void test_second_compile_is_a_hit(void **state) {
    (void)state;
    if (!have_nvrtc()) skip();
    cg_compile_request req = request(scale_source, 90);
    cg_compiled cold, warm;
    bool from_cache = true;
    char error[4096];
    double start = seconds_now();
    if (!cg_compile_kernel_cached(cache, &req, &cold, &from_cache, error, sizeof error))
        fail_msg("%s", error);
    double cold_seconds = seconds_now() - start;
    assert_false(from_cache);
    start = seconds_now();
    if (!cg_compile_kernel_cached(cache, &req, &warm, &from_cache, error, sizeof error))
        fail_msg("%s", error);
    double warm_seconds = seconds_now() - start;
    assert_true(from_cache);
    print_message("sm_90 scale_f32: compile and store %.2f ms, cache hit %.3f ms\n", cold_seconds * 1e3,
                  warm_seconds * 1e3);
    assert_int_equal(warm.cubin_size, cold.cubin_size);
    assert_memory_equal(warm.cubin, cold.cubin, cold.cubin_size);
    assert_string_equal(warm.ptx, cold.ptx);
    assert_int_equal(warm.ptx_size, cold.ptx_size);
    assert_string_equal(warm.log, cold.log);
    assert_int_equal(warm.resources.kernel_count, 1);
    assert_int_equal(warm.resources.kernels[0].registers, cold.resources.kernels[0].registers);
    assert_true(warm.resources.kernels[0].registers > 0);
    cg_cache_stats s = cg_cache_get_stats(cache);
    assert_int_equal(s.hits, 1);
    assert_int_equal(s.misses, 1);
    assert_int_equal(s.stores, 1);
    cg_compiled_free(&cold);
    cg_compiled_free(&warm);

    /* a changed option, source or arch is a miss */
    const char *option[] = {"-DUNUSED=1"};
    cg_compile_request changed = req;
    changed.extra_options = option;
    changed.extra_option_count = 1;
    assert_true(cg_compile_kernel_cached(cache, &changed, &warm, &from_cache, error, sizeof error));
    assert_false(from_cache);
    cg_compiled_free(&warm);
    changed = request("#include \"smelt_kernel.h\"\n"
                      "SMELT_KERNEL void scale_f32(float *y, const float *x, float a, int n) {\n"
                      "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                      "    if (i < n) y[i] = a * x[i] + 1.0f;\n"
                      "}\n",
                      90);
    assert_true(cg_compile_kernel_cached(cache, &changed, &warm, &from_cache, error, sizeof error));
    assert_false(from_cache);
    cg_compiled_free(&warm);
    changed = request(scale_source, 80);
    assert_true(cg_compile_kernel_cached(cache, &changed, &warm, &from_cache, error, sizeof error));
    assert_false(from_cache);
    cg_compiled_free(&warm);
    s = cg_cache_get_stats(cache);
    assert_int_equal(s.hits, 1);
    assert_int_equal(s.misses, 4);
    /* a failed compile is not cached */
    changed = request("#include \"smelt_kernel.h\"\nbroken(", 90);
    assert_false(cg_compile_kernel_cached(cache, &changed, &warm, &from_cache, error, sizeof error));
    assert_int_equal(cg_cache_get_stats(cache).stores, 4);
}

static void test_corrupt_kernel_entry_is_recompiled(void **state) {
    (void)state;
    if (!have_nvrtc()) skip();
    cg_compile_request req = request(scale_source, 80);
    cg_compiled first, again;
    bool from_cache;
    char error[4096];
    if (!cg_compile_kernel_cached(cache, &req, &first, &from_cache, error, sizeof error))
        fail_msg("%s", error);
    cg_cache_key key = cg_kernel_cache_key(&req);
    char path[128];
    entry_file(&key, path, sizeof path);
    struct stat st;
    assert_int_equal(stat(path, &st), 0);
    flip_byte_at(path, st.st_size / 2); /* somewhere in the cubin */
    if (!cg_compile_kernel_cached(cache, &req, &again, &from_cache, error, sizeof error))
        fail_msg("%s", error);
    assert_false(from_cache);
    assert_memory_equal(again.cubin, first.cubin, first.cubin_size);
    cg_compiled_free(&again);
    assert_int_equal(truncate(path, st.st_size - 100), 0);
    if (!cg_compile_kernel_cached(cache, &req, &again, &from_cache, error, sizeof error))
        fail_msg("%s", error);
    assert_false(from_cache);
    cg_compiled_free(&again);
    /* rewritten whole: now a hit with the same bytes */
    if (!cg_compile_kernel_cached(cache, &req, &again, &from_cache, error, sizeof error))
        fail_msg("%s", error);
    assert_true(from_cache);
    assert_int_equal(again.cubin_size, first.cubin_size);
    assert_memory_equal(again.cubin, first.cubin, first.cubin_size);
    assert_int_equal(cg_cache_get_stats(cache).rejected_entries, 2);
    cg_compiled_free(&again);

    /* a well-formed entry that lacks the cubin the request wants */
    cg_cache_blob no_cubin[3] = {{NULL, 0}, {".version 9.0", 12}, {"", 0}};
    assert_true(cg_cache_store(cache, &key, CG_CACHE_KERNEL, no_cubin, 3));
    if (!cg_compile_kernel_cached(cache, &req, &again, &from_cache, error, sizeof error))
        fail_msg("%s", error);
    assert_false(from_cache);
    assert_memory_equal(again.cubin, first.cubin, first.cubin_size);
    assert_int_equal(cg_cache_get_stats(cache).rejected_entries, 3);
    cg_compiled_free(&again);
    cg_compiled_free(&first);
}

static const char add_one_source[] = "#include \"smelt_kernel.h\"\n"
                                     "SMELT_KERNEL void add_one(float *y) { y[threadIdx.x] += 1.0f; }\n";

static void test_pool_through_cache(void **state) {
    (void)state;
    if (!have_nvrtc()) skip();
    const char *sources[8] = {scale_source,   add_one_source, scale_source, scale_source,
                              add_one_source, add_one_source, scale_source, add_one_source};
    int archs[8] = {80, 90, 80, 90, 80, 90, 90, 80};
    cg_compile_request jobs[8];
    for (int i = 0; i < 8; i++)
        jobs[i] = request(sources[i], archs[i]);
    cg_compile_result first[8], second[8];
    assert_int_equal(compile_all(jobs, 8, 2, cache, first, NULL, NULL), 0);
    cg_cache_stats s = cg_cache_get_stats(cache);
    assert_int_equal(s.misses, 4); /* 4 distinct jobs, each looked up once */
    assert_int_equal(s.stores, 4);
    assert_int_equal(s.hits, 0);
    assert_int_equal(compile_all(jobs, 8, 2, cache, second, NULL, NULL), 0);
    s = cg_cache_get_stats(cache);
    assert_int_equal(s.hits, 4);
    for (int i = 0; i < 8; i++) {
        assert_true(second[i].from_cache);
        assert_int_equal(second[i].compiled.cubin_size, first[i].compiled.cubin_size);
        assert_memory_equal(second[i].compiled.cubin, first[i].compiled.cubin, first[i].compiled.cubin_size);
    }
    cg_compile_results_free(first, 8);
    cg_compile_results_free(second, 8);
}

/* ---- the host build ------------------------------------------------------ */

/* Writes bytes to a file, dlopen()s it and calls `symbol` (int (*)(int)). */
static int call_from_object(const cg_host_object *object, const char *symbol, int argument) {
    char path[128];
    snprintf(path, sizeof path, "%s/loaded-XXXXXX", folder);
    int fd = mkstemp(path);
    assert_true(fd >= 0);
    assert_int_equal(write(fd, object->bytes, object->size), (ssize_t)object->size);
    close(fd);
    void *handle = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    if (!handle) fail_msg("dlopen: %s", dlerror());
    int (*function)(int);
    *(void **)&function = dlsym(handle, symbol);
    assert_non_null(function);
    int result = function(argument);
    dlclose(handle);
    unlink(path);
    return result;
}

static const cg_host_source trivial_kernels[] = {
    {"answer", "#include \"answer.h\"\nint answer(int x) { return ANSWER + x; }\n"},
    {"twice", "int twice(int x) { return 2 * x; }\n"},
};
static const cg_header answer_header = {"answer.h", "#define ANSWER 40\n"};

static cg_host_build_request trivial_request(void) {
    return (cg_host_build_request){.sources = trivial_kernels,
                                   .source_count = 2,
                                   .headers = &answer_header,
                                   .header_count = 1,
                                   .sanitize_address = cg_host_build_process_is_sanitized()};
}

static void test_host_build_loads_and_runs(void **state) {
    (void)state;
    cg_host_build_request req = trivial_request();
    cg_host_object object;
    char error[4096];
    double start = seconds_now();
    if (!cg_host_build(&req, cache, &object, error, sizeof error)) fail_msg("%s", error);
    double cold = seconds_now() - start;
    assert_false(object.from_cache);
    assert_memory_equal(object.bytes,
                        "\x7f"
                        "ELF",
                        4);
    assert_int_equal(call_from_object(&object, "answer", 2), 42);
    assert_int_equal(call_from_object(&object, "twice", 21), 42);

    start = seconds_now();
    cg_host_object again;
    if (!cg_host_build(&req, cache, &again, error, sizeof error)) fail_msg("%s", error);
    double warm = seconds_now() - start;
    print_message("host build of 2 kernels: %.1f ms, cache hit %.1f ms\n", cold * 1e3, warm * 1e3);
    assert_true(again.from_cache);
    assert_int_equal(again.size, object.size);
    assert_memory_equal(again.bytes, object.bytes, object.size);
    cg_host_object_free(&again);

    /* another flag or header is another object */
    const char *flags[] = {"-DUNUSED"};
    req.extra_flags = flags;
    req.extra_flag_count = 1;
    if (!cg_host_build(&req, cache, &again, error, sizeof error)) fail_msg("%s", error);
    assert_false(again.from_cache);
    cg_host_object_free(&again);
    cg_header other = {"answer.h", "#define ANSWER 0\n"};
    req = trivial_request();
    req.headers = &other;
    if (!cg_host_build(&req, cache, &again, error, sizeof error)) fail_msg("%s", error);
    assert_false(again.from_cache);
    assert_int_equal(call_from_object(&again, "answer", 2), 2);
    cg_host_object_free(&again);
    cg_host_object_free(&object);

    /* no temporary folder is left behind (TMPDIR points into the test folder) */
    char tmp[128];
    snprintf(tmp, sizeof tmp, "%s/tmp", folder);
    mkdir(tmp, 0700);
    setenv("TMPDIR", tmp, 1);
    req = trivial_request();
    if (!cg_host_build(&req, NULL, &again, error, sizeof error)) fail_msg("%s", error);
    cg_host_object_free(&again);
    assert_int_equal(rmdir(tmp), 0); /* empty */
}

static void write_header(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    assert_non_null(f);
    fputs(text, f);
    fclose(f);
}

static void test_host_build_keys_on_include_dir(void **state) {
    (void)state;
    char include[128], header[160];
    snprintf(include, sizeof include, "%s/include", folder);
    snprintf(header, sizeof header, "%s/value.h", include);
    assert_int_equal(mkdir(include, 0700), 0);
    write_header(header, "#define VALUE 1\n");
    cg_host_source source = {"value", "#include \"value.h\"\nint value(int x) { return VALUE + x; }\n"};
    cg_host_build_request req = {.sources = &source,
                                 .source_count = 1,
                                 .include_dir = include,
                                 .sanitize_address = cg_host_build_process_is_sanitized()};
    cg_host_object object;
    char error[4096];
    if (!cg_host_build(&req, cache, &object, error, sizeof error)) fail_msg("%s", error);
    assert_int_equal(call_from_object(&object, "value", 0), 1);
    cg_host_object_free(&object);
    if (!cg_host_build(&req, cache, &object, error, sizeof error)) fail_msg("%s", error);
    assert_true(object.from_cache);
    cg_host_object_free(&object);
    write_header(header, "#define VALUE 2\n"); /* the header changed: a new object */
    if (!cg_host_build(&req, cache, &object, error, sizeof error)) fail_msg("%s", error);
    assert_false(object.from_cache);
    assert_int_equal(call_from_object(&object, "value", 0), 2);
    cg_host_object_free(&object);
}

static void test_host_build_errors(void **state) {
    (void)state;
    cg_host_source broken[] = {{"fine", "int fine(int x) { return x; }\n"},
                               {"broken_kernel", "int broken(int x) {\n    return x +;\n}\n"}};
    cg_host_build_request req = {.sources = broken, .source_count = 2};
    cg_host_object object;
    char error[4096];
    assert_false(cg_host_build(&req, cache, &object, error, sizeof error));
    assert_null(object.bytes);
    /* each kernel is compiled on its own: the message names the one that failed */
    assert_non_null(
        strstr(error, "host compiler 'cc' failed (exit status 1) building kernel 'broken_kernel':"));
    /* the compiler's message names the kernel and the line in its source */
    assert_non_null(strstr(error, "broken_kernel.c:2:"));
    assert_non_null(strstr(error, "error"));
    assert_null(strstr(error, "fine.c"));
    assert_int_equal(cg_cache_get_stats(cache).stores, 0);

    /* Two broken kernels: the first is quoted, the other counted. */
    cg_host_source two_broken[] = {{"fine", "int fine(int x) { return x; }\n"},
                                   {"first_broken", "int a(void) { return ; }}\n"},
                                   {"second_broken", "int b(int x) { return x +; }\n"}};
    req = (cg_host_build_request){.sources = two_broken, .source_count = 3};
    assert_false(cg_host_build(&req, cache, &object, error, sizeof error));
    assert_non_null(strstr(error, "building kernel 'first_broken' (and 1 more of 3):"));
    assert_non_null(strstr(error, "first_broken.c:1:"));

    /* Each compiles, the link does not: two kernels define one symbol. */
    cg_host_source clash[] = {{"left", "int twin(void) { return 1; }\n"},
                              {"right", "int twin(void) { return 2; }\n"}};
    req = (cg_host_build_request){.sources = clash, .source_count = 2};
    assert_false(cg_host_build(&req, cache, &object, error, sizeof error));
    assert_non_null(strstr(error, "host compiler 'cc' failed (exit status 1) linking 2 kernels:"));
    assert_non_null(strstr(error, "twin"));

    /* a failed build leaves no temporary folder behind either */
    char tmp[128];
    snprintf(tmp, sizeof tmp, "%s/tmp-failed", folder);
    assert_int_equal(mkdir(tmp, 0700), 0);
    setenv("TMPDIR", tmp, 1);
    req = (cg_host_build_request){.sources = two_broken, .source_count = 3};
    assert_false(cg_host_build(&req, NULL, &object, error, sizeof error));
    req = (cg_host_build_request){.sources = clash, .source_count = 2};
    assert_false(cg_host_build(&req, NULL, &object, error, sizeof error));
    unsetenv("TMPDIR");
    assert_int_equal(rmdir(tmp), 0); /* empty */

    /* A name longer than 64 keeps its head and its hash in the message. */
    cg_host_source long_name[] = {
        {"attention_bf16_h4_kv2_d16_ctx128_win4_softcap2_scale0p20412414523193154_51247a3c",
         "int broken(int x) {\n    return x +;\n}\n"}};
    req = (cg_host_build_request){.sources = long_name, .source_count = 1};
    assert_false(cg_host_build(&req, cache, &object, error, sizeof error));
    assert_non_null(strstr(error, "attention_bf16_h4_kv2_d16_ctx128_win4_softcap2_scale0.._51247a3c.c:2:"));

    req = trivial_request();
    req.compiler = "/nonexistent/bin/cc";
    assert_false(cg_host_build(&req, cache, &object, error, sizeof error));
    assert_string_equal(
        error, "host compiler '/nonexistent/bin/cc' could not be started: No such file or directory");
    req.compiler = "   ";
    assert_false(cg_host_build(&req, cache, &object, error, sizeof error));
    assert_string_equal(error, "host compiler command is blank");
    req.compiler = NULL;
    setenv("SMELT_HOST_CC", "/nonexistent/bin/gcc", 1);
    assert_false(cg_host_build(&req, cache, &object, error, sizeof error));
    assert_non_null(strstr(error, "'/nonexistent/bin/gcc'"));
    /* $SMELT_HOST_CC may carry flags */
    setenv("SMELT_HOST_CC", "cc -DANSWER_OFFSET=5", 1);
    cg_host_source offset = {"offset", "int answer(int x) { return x + ANSWER_OFFSET; }\n"};
    req = (cg_host_build_request){
        .sources = &offset, .source_count = 1, .sanitize_address = cg_host_build_process_is_sanitized()};
    if (!cg_host_build(&req, NULL, &object, error, sizeof error)) fail_msg("%s", error);
    assert_int_equal(call_from_object(&object, "answer", 37), 42);
    cg_host_object_free(&object);
    unsetenv("SMELT_HOST_CC");

    cg_header bad_header = {"../escape.h", "x"};
    req = trivial_request();
    req.headers = &bad_header;
    assert_false(cg_host_build(&req, cache, &object, error, sizeof error));
    assert_string_equal(error, "host build: expected a plain file name for header 0, found '../escape.h'");
    req = trivial_request();
    req.source_count = 0;
    assert_false(cg_host_build(&req, cache, &object, error, sizeof error));
    assert_string_equal(error, "host build: expected at least one kernel source, found none");
}

/* A real kernel against the host half of runtime/smelt_kernel.h. It needs
 * the simulator's symbols to load, so only its build is checked here. */
static void test_host_build_with_kernel_header(void **state) {
    (void)state;
    cg_host_source kernel = {"scale_f32",
                             "#include \"smelt_kernel.h\"\n"
                             "SMELT_KERNEL void scale_f32(float *y, const float *x, float a, int n) {\n"
                             "    int i = blockIdx.x * blockDim.x + threadIdx.x;\n"
                             "    if (i < n) y[i] = a * x[i];\n"
                             "}\n"
                             "SMELT_HOST_ENTRY(scale_f32) {\n"
                             "    scale_f32(SMELT_ARG(float *, 0), SMELT_ARG(const float *, 1),\n"
                             "              SMELT_ARG(float, 2), SMELT_ARG(int, 3));\n"
                             "}\n"};
    const char *link[] = {"-lm"};
    cg_host_build_request req = {.sources = &kernel,
                                 .source_count = 1,
                                 .include_dir = SMELT_SOURCE_DIR "/runtime",
                                 .link_flags = link,
                                 .link_flag_count = 1};
    cg_host_object object;
    char error[4096];
    if (!cg_host_build(&req, cache, &object, error, sizeof error)) fail_msg("%s", error);
    assert_memory_equal(object.bytes,
                        "\x7f"
                        "ELF",
                        4);
    static const char entry[] = "scale_f32__host_entry";
    bool found = false;
    for (size_t i = 0; i + sizeof entry <= object.size && !found; i++)
        found = memcmp(object.bytes + i, entry, sizeof entry) == 0;
    assert_true(found);
    cg_host_object_free(&object);
}

int main(void) {
    const struct CMUnitTest tests[] = {
        cmocka_unit_test_setup_teardown(test_key_fields_are_length_delimited, setup, teardown),
        cmocka_unit_test_setup_teardown(test_kernel_key_covers_every_input, setup, teardown),
        cmocka_unit_test_setup_teardown(test_default_folder_order, setup, teardown),
        cmocka_unit_test_setup_teardown(test_folder_created_on_first_store_with_mode_0700, setup, teardown),
        cmocka_unit_test_setup_teardown(test_blobs_round_trip, setup, teardown),
        cmocka_unit_test_setup_teardown(test_damaged_entries_are_rejected_and_replaced, setup, teardown),
        cmocka_unit_test_setup_teardown(test_unwritable_folder_is_a_warning, setup, teardown),
        cmocka_unit_test_setup_teardown(test_second_compile_is_a_hit, setup, teardown),
        cmocka_unit_test_setup_teardown(test_corrupt_kernel_entry_is_recompiled, setup, teardown),
        cmocka_unit_test_setup_teardown(test_pool_through_cache, setup, teardown),
        cmocka_unit_test_setup_teardown(test_host_build_loads_and_runs, setup, teardown),
        cmocka_unit_test_setup_teardown(test_host_build_keys_on_include_dir, setup, teardown),
        cmocka_unit_test_setup_teardown(test_host_build_errors, setup, teardown),
        cmocka_unit_test_setup_teardown(test_host_build_with_kernel_header, setup, teardown),
    };
    return cmocka_run_group_tests(tests, load_kernel_header, free_kernel_header);
}
