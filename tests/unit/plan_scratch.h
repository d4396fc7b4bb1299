/* plan_scratch.h - what the tests that write plans share: a scratch folder
 * (cmocka fixtures that make it and remove it with what a test left in it),
 * whole files read and written, a plan written from a plan_writer, a toy
 * plan of a hand-made program, and a plan's `smelt inspect` text. Include
 * it after cmocka.h. Every helper fails the test on an error of its own. */
#ifndef SMELT_TEST_PLAN_SCRATCH_H
#define SMELT_TEST_PLAN_SCRATCH_H

#include "plan_print.h"
#include "plan_read.h"
#include "plan_write.h"
#include "program.h"

#include <dirent.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* The folder scratch_folder_make made: /tmp/smelt-test-XXXXXX. */
static char scratch_folder[64];

/* A cmocka setup (of a group or of one test). */
static inline int scratch_folder_make(void **state) {
    (void)state;
    snprintf(scratch_folder, sizeof scratch_folder, "/tmp/smelt-test-XXXXXX");
    if (!mkdtemp(scratch_folder)) fail_msg("mkdtemp: cannot make %s", scratch_folder);
    return 0;
}

/* A cmocka teardown: every file in the folder, then the folder. */
static inline int scratch_folder_remove(void **state) {
    (void)state;
    DIR *dir = opendir(scratch_folder);
    if (dir) {
        struct dirent *entry;
        while ((entry = readdir(dir)) != NULL) {
            if (strcmp(entry->d_name, ".") == 0 || strcmp(entry->d_name, "..") == 0) continue;
            char path[512];
            snprintf(path, sizeof path, "%s/%s", scratch_folder, entry->d_name);
            unlink(path);
        }
        closedir(dir);
    }
    rmdir(scratch_folder);
    return 0;
}

/* The path of `name` in the scratch folder. */
static inline void scratch_path(char *path, size_t size, const char *name) {
    snprintf(path, size, "%s/%s", scratch_folder, name);
}

/* The whole file, with a '\0' after its bytes (so text reads as a string);
 * *size its length when size is not NULL. The caller frees it. */
static inline uint8_t *scratch_read(const char *path, size_t *size) {
    FILE *f = fopen(path, "rb");
    if (!f) fail_msg("cannot open %s", path);
    fseek(f, 0, SEEK_END);
    long length = ftell(f);
    fseek(f, 0, SEEK_SET);
    uint8_t *bytes = malloc((size_t)length + 1);
    assert_non_null(bytes);
    assert_int_equal(fread(bytes, 1, (size_t)length, f), (size_t)length);
    fclose(f);
    bytes[length] = '\0';
    if (size) *size = (size_t)length;
    return bytes;
}

static inline void scratch_write(const char *path, const void *bytes, size_t size) {
    FILE *f = fopen(path, "wb");
    if (!f) fail_msg("cannot create %s", path);
    assert_int_equal(fwrite(bytes, 1, size, f), size);
    assert_int_equal(fclose(f), 0);
}

/* Writes w's plan to path (summary: may be NULL) and frees w. */
static inline void scratch_plan_write(plan_writer *w, const char *path, plan_write_summary *summary) {
    char error[1024] = "";
    if (!plan_write_file(w, path, summary, error, sizeof error)) fail_msg("plan write: %s", error);
    plan_writer_free(w);
}

/* A kernel-table entry of a hand-written kernel `index` of p (family "toy"):
 * its name, IR ops and source, a grid of `grid_x` by 1 by 1 blocks of 32
 * threads, and the parameters p's launches of it pass. */
static inline void scratch_toy_kernel(plan_kernel *k, const program *p, uint32_t index, const char *name,
                                      const char *ops, const char *source, plan_affine grid_x) {
    memset(k, 0, sizeof *k);
    k->name = plan_text_from(name);
    k->family = plan_text_from("toy");
    k->ops = plan_text_from(ops);
    k->source = plan_text_from(source);
    k->launch.grid[0] = grid_x;
    k->launch.grid[1] = k->launch.grid[2] = (plan_affine){0, 1, 1};
    k->launch.block[0] = (plan_affine){0, 32, 1};
    k->launch.block[1] = k->launch.block[2] = (plan_affine){0, 1, 1};
    program_declare_params(p, index, k);
}

/* The sections of a toy plan; a NULL host object or weight data leaves
 * its section out. */
typedef struct scratch_toy_plan {
    const program *program;
    const plan_kernel *kernels;
    uint32_t kernel_count;
    const void *host_kernels; /* the kernels' host object */
    size_t host_kernels_size;
    const void *weight_data;
    size_t weight_data_size;
} scratch_toy_plan;

/* Writes a plan of a toy manifest and the sections of t to path. */
static inline void scratch_toy_plan_write(const char *path, const scratch_toy_plan *t) {
    uint8_t *program_bytes;
    size_t program_size;
    assert_true(program_encode(t->program, &program_bytes, &program_size));
    plan_writer w;
    plan_writer_init(&w, "test");
    plan_writer_add_section(&w, PLAN_SECTION_MANIFEST, "{\"model\": \"toy\"}", 16);
    plan_writer_add_kernels(&w, t->kernels, t->kernel_count);
    if (t->host_kernels)
        plan_writer_add_section(&w, PLAN_SECTION_HOST_KERNELS, t->host_kernels, t->host_kernels_size);
    plan_writer_add_section(&w, PLAN_SECTION_PROGRAM, program_bytes, program_size);
    if (t->weight_data)
        plan_writer_add_section(&w, PLAN_SECTION_WEIGHT_DATA, t->weight_data, t->weight_data_size);
    scratch_plan_write(&w, path, NULL);
    free(program_bytes);
}

/* What `smelt inspect` prints of plan (the caller frees it); fails the test
 * unless plan_print answers expect_ok, and leaves its message in error. */
static inline char *scratch_plan_print(const plan_file *plan, plan_print_options options, bool expect_ok,
                                       char *error, size_t error_size) {
    char *text = NULL;
    size_t length = 0;
    FILE *out = open_memstream(&text, &length);
    assert_non_null(out);
    bool ok = plan_print(out, plan, &options, error, error_size);
    fclose(out);
    if (ok != expect_ok) fail_msg("plan_print returned %d (error: %s)\n%s", ok, error, text);
    return text;
}

#endif
