/* nvrtc.h - the one wrapper around NVRTC: CUDA C text in, cubin/PTX out.
 *
 * Every generated kernel goes through cg_compile_kernel(). It builds the
 * option list (architecture, -default-device, C++17, ptxas verbosity), hands
 * the program's headers to NVRTC by name, and returns the cubin and/or PTX,
 * the program log and the resources ptxas reports for each kernel
 * (registers, static shared memory, stack, spills, constant banks), which
 * `smelt inspect` prints and the plan stores.
 *
 *   cg_compile_request req = {.source = text, .kernel_name = "rmsnorm_0",
 *                             .headers = &kernel_header, .header_count = 1,
 *                             .arch = 90, .want_cubin = true};
 *   cg_compiled out;
 *   if (!cg_compile_kernel(&req, &out, error, sizeof error)) ... report error ...
 *   ... out.cubin, out.cubin_size, out.kernels[0].registers ...
 *   cg_compiled_free(&out);
 *
 * Without the CUDA toolkit at build time (SMELT_HAVE_NVRTC undefined) every
 * function returns a "built without NVRTC" error. All functions are safe to
 * call from several threads at once (NVRTC allows concurrent compiles of
 * distinct programs).
 */
#ifndef SMELT_CG_NVRTC_H
#define SMELT_CG_NVRTC_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

/* A header the kernel may #include, given by name and text. */
typedef struct cg_header {
    const char *name; /* as written in #include "...", e.g. "smelt_kernel.h" */
    const char *text;
} cg_header;

typedef struct cg_compile_request {
    const char *source;      /* CUDA C text (C-compatible subset), NUL-terminated */
    const char *kernel_name; /* for messages and the NVRTC program name; may be NULL */
    const cg_header *headers;
    size_t header_count;
    int arch;                         /* compute capability as one number: 80 = sm_80, 90 = sm_90 */
    bool want_cubin;                  /* machine code for sm_<arch> */
    bool want_ptx;                    /* PTX; alone it compiles for the virtual compute_<arch> */
    bool line_info;                   /* -lineinfo (source lines in profilers); off by default */
    const char *const *extra_options; /* appended after the fixed options */
    size_t extra_option_count;
} cg_compile_request;

/* What ptxas reports for one __global__ function. */
typedef struct cg_kernel_resources {
    char *name;                 /* the entry function's (extern "C") name */
    uint32_t registers;         /* per thread */
    uint32_t barriers;          /* named barriers used */
    uint32_t shared_bytes;      /* static __shared__ bytes per block */
    uint32_t stack_frame_bytes; /* per thread local memory frame */
    uint32_t spill_store_bytes;
    uint32_t spill_load_bytes;
    uint32_t constant_bytes; /* sum of the cmem[N] banks on the kernel's "Used" line */
} cg_kernel_resources;

/* The ptxas report of a whole program. */
typedef struct cg_resource_report {
    cg_kernel_resources *kernels; /* in the order ptxas compiled them */
    size_t kernel_count;
    uint32_t global_bytes;          /* __device__ variables ("N bytes gmem") */
    uint32_t module_constant_bytes; /* __constant__ variables (module-level cmem banks) */
} cg_resource_report;

/* The result of one compile; owns all its memory (free with cg_compiled_free). */
typedef struct cg_compiled {
    uint8_t *cubin; /* NULL unless want_cubin */
    size_t cubin_size;
    char *ptx;       /* NUL-terminated; NULL unless want_ptx */
    size_t ptx_size; /* without the NUL */
    char *log;       /* NVRTC's program log, NUL-terminated (may be "") */
    cg_resource_report resources;
} cg_compiled;

/* Compiles req->source. On success fills *out and returns true; on failure
 * returns false with a message in error (naming the kernel and holding the
 * first lines of NVRTC's log, or saying "out of memory") and *out zeroed. */
bool cg_compile_kernel(const cg_compile_request *req, cg_compiled *out, char *error, size_t error_size);
void cg_compiled_free(cg_compiled *c);

/* The NVRTC library's version; false (and 0.0) when built without NVRTC. */
bool cg_nvrtc_version(int *major, int *minor);
/* Whether NVRTC can compile for sm_<arch>; false without NVRTC. */
bool cg_nvrtc_supports_arch(int arch);

/* The options NVRTC gets before req->extra_options, in order:
 * --gpu-architecture=sm_XY (compute_XY when only PTX is wanted),
 * -default-device, --std=c++17, --ptxas-options=-v, -minimal, and -lineinfo
 * on request. The disk cache keys entries on exactly these. `options` points
 * into the struct itself (arch_option), so use it where it was filled. */
typedef struct cg_fixed_options {
    const char *options[8];
    size_t count;
    char arch_option[48];
} cg_fixed_options;
void cg_nvrtc_fixed_options(const cg_compile_request *req, cg_fixed_options *out);

/* Parses a ptxas -v log ("ptxas info : Used 10 registers, ..."). Lines that
 * are not understood are skipped; a log without ptxas lines gives an empty
 * report. Returns false when out of memory (then *out is empty). */
bool cg_parse_ptxas_log(const char *log, cg_resource_report *out);
void cg_resource_report_free(cg_resource_report *r);
/* The report's entry for a kernel name, or NULL. */
const cg_kernel_resources *cg_resource_find(const cg_resource_report *r, const char *name);

#endif
