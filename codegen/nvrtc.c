/* nvrtc.c - NVRTC compiles one kernel's CUDA C to cubin/PTX; ptxas's -v log
 * becomes per-kernel resource usage (see nvrtc.h).
 *
 * The ptxas log this parses looks like (CUDA 13, sm_80):
 *
 *   ptxas info    : 256 bytes gmem, 64 bytes cmem[3]
 *   ptxas info    : Compiling entry function 'spill' for 'sm_80'
 *   ptxas info    : Function properties for spill
 *   ptxas         .     2048 bytes stack frame, 0 bytes spill stores, 0 bytes spill loads
 *   ptxas info    : Used 40 registers, used 1 barriers, 2048 bytes cumulative stack size,
 *                   1024 bytes smem, 372 bytes cmem[0]      (one line in the real log)
 *
 * Zero-valued smem/cmem items are left out by ptxas, and a non-inlined
 * device function gets its own "Function properties" block, which belongs
 * to no kernel and is skipped.
 */
#include "nvrtc.h"

#include "arena.h"
#include "diag.h"

#include <limits.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#ifdef SMELT_HAVE_NVRTC
/* The toolkit's header by full path: "nvrtc.h" here is our own. */
#include SMELT_NVRTC_HEADER
#include <dlfcn.h>
#include <pthread.h>
#endif

enum {
    ARCH_MIN = 10, /* sm_10 .. sm_999: anything else is not an arch number */
    ARCH_MAX = 999,
    ERROR_LOG_LINES = 24,     /* lines of NVRTC's log quoted in a compile error */
    MAX_EXTRA_OPTIONS = 1024, /* a sanity bound, far above any real use */
};

static void set_error(char *error, size_t error_size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_error(char *error, size_t error_size, const char *fmt, ...) {
    if (!error || error_size == 0) return;
    va_list args;
    va_start(args, fmt);
    vsnprintf(error, error_size, fmt, args);
    va_end(args);
}

/* The allocation helpers are always inlined, so that each call site is a
 * site of its own to the fault-injection sweep (tools/faultsweep.sh --cuda),
 * which fails the first allocation at each return address. */
#define ALWAYS_INLINE __attribute__((always_inline))

/* Out of memory is a status here, never an abort: compiles run on the
 * compile pool's worker threads, which have no arena recovery point (see
 * arena.h), so these return NULL and every caller reports "out of memory". */
static inline ALWAYS_INLINE void *allocate(size_t size) { return malloc(size ? size : 1); }

static inline ALWAYS_INLINE char *copy_text(const char *s, size_t n) {
    char *p = allocate(n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

/* ---- options ---------------------------------------------------------- */

void cg_nvrtc_fixed_options(const cg_compile_request *req, cg_fixed_options *out) {
    memset(out, 0, sizeof *out);
    /* PTX alone targets the virtual architecture, which any later GPU can
     * JIT; a cubin needs the real one (and NVRTC then gives the PTX too). */
    snprintf(out->arch_option, sizeof out->arch_option, "--gpu-architecture=%s_%d",
             req->want_cubin ? "sm" : "compute", req->arch);
    out->options[out->count++] = out->arch_option;
    /* Kernels are written without __device__ on helpers (C-compatible). */
    out->options[out->count++] = "-default-device";
    /* NVRTC's default dialect today, spelled out so that a toolkit that
     * changes its default cannot silently change our kernels. */
    out->options[out->count++] = "--std=c++17";
    /* ptxas prints registers, shared memory, stack and spills per kernel. */
    out->options[out->count++] = "--ptxas-options=-v";
    /* NVRTC's headers without textures, the device runtime API and device
     * launches, none of which a kernel uses: less to parse per compile. */
    out->options[out->count++] = "-minimal";
    if (req->line_info) out->options[out->count++] = "-lineinfo";
}

/* ---- the ptxas log parser ------------------------------------------------ */

static uint32_t saturating_add(uint32_t a, uint32_t b) { return a > UINT32_MAX - b ? UINT32_MAX : a + b; }

/* The number that starts `s` (after blanks); *end is set past it. */
static bool read_number(const char *s, const char **end, uint32_t *value) {
    while (*s == ' ' || *s == '\t')
        s++;
    if (*s < '0' || *s > '9') return false;
    uint64_t v = 0;
    while (*s >= '0' && *s <= '9') {
        if (v <= UINT32_MAX) v = v * 10 + (uint64_t)(*s - '0');
        s++;
    }
    *value = v > UINT32_MAX ? UINT32_MAX : (uint32_t)v;
    *end = s;
    return true;
}

static bool starts_with(const char *s, const char *prefix) { return strncmp(s, prefix, strlen(prefix)) == 0; }

/* Where one "N unit" item of a ptxas line goes. */
typedef struct resource_sink {
    cg_kernel_resources *kernel; /* NULL for the module-level line */
    cg_resource_report *report;
} resource_sink;

/* Applies one comma-separated item ("Used 40 registers", "1024 bytes smem",
 * "372 bytes cmem[0]", "0 bytes spill stores", ...) of the line [s, end). */
static void apply_item(const char *s, const char *end, resource_sink sink) {
    while (s < end && (*s == ' ' || *s == '\t'))
        s++;
    if (starts_with(s, "Used "))
        s += 5;
    else if (starts_with(s, "used "))
        s += 5;
    uint32_t value;
    const char *unit;
    if (!read_number(s, &unit, &value) || unit >= end) return;
    while (unit < end && *unit == ' ')
        unit++;
    size_t length = (size_t)(end - unit);
#define UNIT_IS(text) (length >= sizeof(text) - 1 && strncmp(unit, text, sizeof(text) - 1) == 0)
    cg_kernel_resources *k = sink.kernel;
    if (UNIT_IS("bytes cmem[")) {
        if (k)
            k->constant_bytes = saturating_add(k->constant_bytes, value);
        else
            sink.report->module_constant_bytes = saturating_add(sink.report->module_constant_bytes, value);
    } else if (UNIT_IS("bytes gmem")) {
        sink.report->global_bytes = saturating_add(sink.report->global_bytes, value);
    } else if (!k) {
        return;
    } else if (UNIT_IS("registers")) {
        k->registers = value;
    } else if (UNIT_IS("barriers")) {
        k->barriers = value;
    } else if (UNIT_IS("bytes smem")) {
        k->shared_bytes = value;
    } else if (UNIT_IS("bytes stack frame")) {
        k->stack_frame_bytes = value;
    } else if (UNIT_IS("bytes spill stores")) {
        k->spill_store_bytes = value;
    } else if (UNIT_IS("bytes spill loads")) {
        k->spill_load_bytes = value;
    }
#undef UNIT_IS
}

static void apply_items(const char *s, const char *end, resource_sink sink) {
    while (s < end) {
        const char *comma = memchr(s, ',', (size_t)(end - s));
        const char *item_end = comma ? comma : end;
        apply_item(s, item_end, sink);
        s = comma ? comma + 1 : end;
    }
}

/* The text between the first pair of single quotes after `marker` in the
 * line [s, end), or NULL. */
static const char *quoted_after(const char *s, const char *end, const char *marker, size_t *length) {
    size_t marker_length = strlen(marker);
    for (const char *p = s; p + marker_length <= end; p++) {
        if (memcmp(p, marker, marker_length) != 0) continue;
        const char *open = p + marker_length;
        if (open >= end || *open != '\'') return NULL;
        const char *close = memchr(open + 1, '\'', (size_t)(end - open - 1));
        if (!close) return NULL;
        *length = (size_t)(close - open - 1);
        return open + 1;
    }
    return NULL;
}

static const char *find_in_line(const char *s, const char *end, const char *needle) {
    size_t n = strlen(needle);
    for (const char *p = s; p + n <= end; p++)
        if (memcmp(p, needle, n) == 0) return p;
    return NULL;
}

/* The kernel named [name, name + length), added if new; NULL when out of
 * memory (the report stays well-formed: every counted kernel has a name). */
static cg_kernel_resources *add_kernel(cg_resource_report *r, const char *name, size_t length) {
    for (size_t i = 0; i < r->kernel_count; i++)
        if (strlen(r->kernels[i].name) == length && memcmp(r->kernels[i].name, name, length) == 0)
            return &r->kernels[i];
    /* No overflow: one kernel per line of a log that is in memory. */
    size_t count = r->kernel_count + 1;
    char *copy = copy_text(name, length);
    if (!copy) return NULL;
    cg_kernel_resources *grown = realloc(r->kernels, count * sizeof *grown);
    if (!grown) {
        free(copy);
        return NULL;
    }
    r->kernels = grown;
    cg_kernel_resources *k = &r->kernels[r->kernel_count++];
    memset(k, 0, sizeof *k);
    k->name = copy;
    return k;
}

bool cg_parse_ptxas_log(const char *log, cg_resource_report *out) {
    memset(out, 0, sizeof *out);
    if (!log) return true;
    size_t current = SIZE_MAX;           /* kernel being compiled (an index: the array moves) */
    bool properties_are_current = false; /* the next stack-frame line is that kernel's */
    for (const char *line = log; *line;) {
        const char *end = strchr(line, '\n');
        if (!end) end = line + strlen(line);
        const char *next = *end ? end + 1 : end;
        bool from_ptxas = starts_with(line, "ptxas"); /* not NVRTC's own warnings or blank lines */
        /* "ptxas info    : <items>" and "ptxas         .     <items>" */
        const char *body = from_ptxas ? memchr(line, ':', (size_t)(end - line)) : NULL;
        const char *dot = from_ptxas ? memchr(line, '.', (size_t)(end - line)) : NULL;
        size_t name_length;
        const char *name;
        if (!from_ptxas) {
            /* skipped */
        } else if ((name = quoted_after(line, end, "Compiling entry function ", &name_length))) {
            cg_kernel_resources *k = add_kernel(out, name, name_length);
            if (!k) {
                cg_resource_report_free(out);
                return false;
            }
            current = (size_t)(k - out->kernels);
            properties_are_current = false;
        } else if ((name = find_in_line(line, end, "Function properties for "))) {
            name += strlen("Function properties for ");
            size_t length = (size_t)(end - name);
            while (length && (name[length - 1] == ' ' || name[length - 1] == '\r'))
                length--;
            properties_are_current = current != SIZE_MAX && strlen(out->kernels[current].name) == length &&
                                     memcmp(out->kernels[current].name, name, length) == 0;
        } else if (find_in_line(line, end, "bytes stack frame")) {
            if (properties_are_current && dot)
                apply_items(dot + 1, end, (resource_sink){&out->kernels[current], out});
            properties_are_current = false;
        } else if (body && find_in_line(line, end, "Used ")) {
            if (current != SIZE_MAX) apply_items(body + 1, end, (resource_sink){&out->kernels[current], out});
        } else if (body && find_in_line(line, end, "bytes gmem")) {
            apply_items(body + 1, end, (resource_sink){NULL, out});
        }
        line = next;
    }
    return true;
}

void cg_resource_report_free(cg_resource_report *r) {
    for (size_t i = 0; i < r->kernel_count; i++)
        free(r->kernels[i].name);
    free(r->kernels);
    memset(r, 0, sizeof *r);
}

const cg_kernel_resources *cg_resource_find(const cg_resource_report *r, const char *name) {
    for (size_t i = 0; i < r->kernel_count; i++)
        if (strcmp(r->kernels[i].name, name) == 0) return &r->kernels[i];
    return NULL;
}

void cg_compiled_free(cg_compiled *c) {
    free(c->cubin);
    free(c->ptx);
    free(c->log);
    cg_resource_report_free(&c->resources);
    memset(c, 0, sizeof *c);
}

/* ---- compiling --------------------------------------------------------- */

static const char *kernel_label(const cg_compile_request *req) {
    return req->kernel_name && req->kernel_name[0] ? req->kernel_name : "(unnamed)";
}

/* Checks what the caller hands us before NVRTC sees it. */
static bool check_request(const cg_compile_request *req, char *error, size_t error_size) {
    const char *label = kernel_label(req);
    if (!req->source) {
        set_error(error, error_size, "kernel '%.*s%s': no source text", DIAG_NAME(label));
        return false;
    }
    if (!req->want_cubin && !req->want_ptx) {
        set_error(error, error_size, "kernel '%.*s%s': neither a cubin nor PTX was requested",
                  DIAG_NAME(label));
        return false;
    }
    if (req->arch < ARCH_MIN || req->arch > ARCH_MAX) {
        set_error(error, error_size, "kernel '%.*s%s': expected an architecture like 80 or 90, found %d",
                  DIAG_NAME(label), req->arch);
        return false;
    }
    if (req->header_count > INT_MAX || (req->header_count && !req->headers)) {
        set_error(error, error_size, "kernel '%.*s%s': bad header list", DIAG_NAME(label));
        return false;
    }
    for (size_t i = 0; i < req->header_count; i++) {
        if (!req->headers[i].name || !req->headers[i].text) {
            set_error(error, error_size, "kernel '%.*s%s': header %zu has no name or no text",
                      DIAG_NAME(label), i);
            return false;
        }
    }
    if (req->extra_option_count > MAX_EXTRA_OPTIONS || (req->extra_option_count && !req->extra_options)) {
        set_error(error, error_size, "kernel '%.*s%s': expected at most %d extra options, found %zu",
                  DIAG_NAME(label), MAX_EXTRA_OPTIONS, req->extra_option_count);
        return false;
    }
    for (size_t i = 0; i < req->extra_option_count; i++) {
        if (!req->extra_options[i]) {
            set_error(error, error_size, "kernel '%.*s%s': extra option %zu is missing", DIAG_NAME(label), i);
            return false;
        }
    }
    return true;
}

#ifdef SMELT_HAVE_NVRTC

/* NVRTC is opened with dlopen the first time a CUDA target needs it, never
 * linked: commands that compile no CUDA (smelt inspect, ir, opt, run, a host
 * compile) never load it. The toolkit's header gives the types; the calls
 * below go through this table (the names are macros for its members).
 * SMELT_NVRTC names another library. Once per process, never closed. */
#define NVRTC_FUNCTIONS(X)                                                                                   \
    X(nvrtcVersion)                                                                                          \
    X(nvrtcGetNumSupportedArchs)                                                                             \
    X(nvrtcGetSupportedArchs)                                                                                \
    X(nvrtcGetErrorString)                                                                                   \
    X(nvrtcCreateProgram)                                                                                    \
    X(nvrtcCompileProgram)                                                                                   \
    X(nvrtcGetProgramLogSize)                                                                                \
    X(nvrtcGetProgramLog)                                                                                    \
    X(nvrtcGetCUBINSize)                                                                                     \
    X(nvrtcGetCUBIN)                                                                                         \
    X(nvrtcGetPTXSize)                                                                                       \
    X(nvrtcGetPTX)                                                                                           \
    X(nvrtcDestroyProgram)

static struct {
    pthread_once_t once;
    bool ready;    /* every function resolved */
    char why[256]; /* else: what went wrong */
#define NVRTC_MEMBER(name) __typeof__(&name) name;
    NVRTC_FUNCTIONS(NVRTC_MEMBER)
#undef NVRTC_MEMBER
} nvrtc = {.once = PTHREAD_ONCE_INIT};

static void open_nvrtc(void) {
    const char *override = getenv("SMELT_NVRTC");
    const char *names[] = {SMELT_NVRTC_LIBRARY, "libnvrtc.so"};
    const char *tried = override && *override ? override : names[0];
    void *library = NULL;
    if (override && *override)
        library = dlopen(override, RTLD_NOW | RTLD_LOCAL);
    else
        for (size_t i = 0; i < sizeof names / sizeof names[0] && !library; i++)
            library = dlopen(names[i], RTLD_NOW | RTLD_LOCAL);
    if (!library) {
        const char *why = dlerror();
        snprintf(nvrtc.why, sizeof nvrtc.why, "cannot load NVRTC (%s: %s)", tried, why ? why : "not found");
        return;
    }
#define NVRTC_RESOLVE(name)                                                                                  \
    *(void **)&nvrtc.name = dlsym(library, #name);                                                           \
    if (!nvrtc.name) {                                                                                       \
        snprintf(nvrtc.why, sizeof nvrtc.why, "NVRTC %s lacks %s: it is too old for this smelt", tried,      \
                 #name);                                                                                     \
        return;                                                                                              \
    }
    NVRTC_FUNCTIONS(NVRTC_RESOLVE)
#undef NVRTC_RESOLVE
    nvrtc.ready = true;
}

static bool nvrtc_loaded(void) {
    pthread_once(&nvrtc.once, open_nvrtc);
    return nvrtc.ready;
}

/* From here on the NVRTC names are the table's functions. */
#define nvrtcVersion nvrtc.nvrtcVersion
#define nvrtcGetNumSupportedArchs nvrtc.nvrtcGetNumSupportedArchs
#define nvrtcGetSupportedArchs nvrtc.nvrtcGetSupportedArchs
#define nvrtcGetErrorString nvrtc.nvrtcGetErrorString
#define nvrtcCreateProgram nvrtc.nvrtcCreateProgram
#define nvrtcCompileProgram nvrtc.nvrtcCompileProgram
#define nvrtcGetProgramLogSize nvrtc.nvrtcGetProgramLogSize
#define nvrtcGetProgramLog nvrtc.nvrtcGetProgramLog
#define nvrtcGetCUBINSize nvrtc.nvrtcGetCUBINSize
#define nvrtcGetCUBIN nvrtc.nvrtcGetCUBIN
#define nvrtcGetPTXSize nvrtc.nvrtcGetPTXSize
#define nvrtcGetPTX nvrtc.nvrtcGetPTX
#define nvrtcDestroyProgram nvrtc.nvrtcDestroyProgram

bool cg_nvrtc_version(int *major, int *minor) {
    int a = 0, b = 0;
    bool ok = nvrtc_loaded() && nvrtcVersion(&a, &b) == NVRTC_SUCCESS;
    if (major) *major = ok ? a : 0;
    if (minor) *minor = ok ? b : 0;
    return ok;
}

static struct {
    pthread_once_t once;
    int archs[64];
    int count;
    bool out_of_memory; /* the list could not be read: every compile says so */
} supported = {PTHREAD_ONCE_INIT, {0}, 0, false};

static void load_supported_archs(void) {
    int count = 0;
    if (!nvrtc_loaded() || nvrtcGetNumSupportedArchs(&count) != NVRTC_SUCCESS || count <= 0) return;
    int *archs = allocate((size_t)count * sizeof *archs);
    if (!archs) {
        supported.out_of_memory = true;
        return;
    }
    if (nvrtcGetSupportedArchs(archs) == NVRTC_SUCCESS) {
        int kept = count < 64 ? count : 64;
        memcpy(supported.archs, archs, (size_t)kept * sizeof *archs);
        supported.count = kept;
    }
    free(archs);
}

bool cg_nvrtc_supports_arch(int arch) {
    pthread_once(&supported.once, load_supported_archs);
    for (int i = 0; i < supported.count; i++)
        if (supported.archs[i] == arch) return true;
    return false;
}

/* "sm_75 sm_80 ..." for the unsupported-arch message. */
static void describe_supported_archs(char *buffer, size_t size) {
    pthread_once(&supported.once, load_supported_archs);
    size_t used = 0;
    buffer[0] = '\0';
    for (int i = 0; i < supported.count && used < size; i++) {
        int n = snprintf(buffer + used, size - used, "%s%d", i ? ", " : "", supported.archs[i]);
        if (n < 0) break;
        used += (size_t)n;
    }
}

/* Writes "kernel 'x': ...:\n" then the first ERROR_LOG_LINES lines of log. */
static void set_compile_error(char *error, size_t error_size, const cg_compile_request *req,
                              nvrtcResult result, const char *log) {
    const char *label = kernel_label(req);
    set_error(error, error_size, "kernel '%.*s%s': NVRTC could not compile it for %s_%d (%s)%s",
              DIAG_NAME(label), req->want_cubin ? "sm" : "compute", req->arch, nvrtcGetErrorString(result),
              log && log[0] ? ":\n" : "");
    if (!error || !log) return;
    size_t used = strlen(error);
    const char *p = log;
    for (int line = 0; line < ERROR_LOG_LINES && *p && used + 1 < error_size; line++) {
        const char *end = strchr(p, '\n');
        size_t length = end ? (size_t)(end - p + 1) : strlen(p);
        size_t room = error_size - 1 - used;
        size_t n = length < room ? length : room;
        memcpy(error + used, p, n);
        used += n;
        p += length;
    }
    while (used > 0 && error[used - 1] == '\n')
        used--;
    error[used] = '\0';
}

/* The program log, as a malloc'd string ("" when NVRTC has none); NULL
 * when out of memory. */
static char *program_log(nvrtcProgram program) {
    size_t size = 0;
    if (nvrtcGetProgramLogSize(program, &size) != NVRTC_SUCCESS || size == 0) return copy_text("", 0);
    char *log = size < SIZE_MAX ? allocate(size + 1) : NULL;
    if (!log) return NULL;
    if (nvrtcGetProgramLog(program, log) != NVRTC_SUCCESS) log[0] = '\0';
    log[size] = '\0';
    return log;
}

bool cg_compile_kernel(const cg_compile_request *req, cg_compiled *out, char *error, size_t error_size) {
    memset(out, 0, sizeof *out);
    if (!check_request(req, error, error_size)) return false;
    const char *label = kernel_label(req);
    if (!nvrtc_loaded()) {
        set_error(error, error_size,
                  "kernel '%.*s%s': %s; compiling for a CUDA target needs NVRTC: install the CUDA "
                  "toolkit or add its lib folder to LD_LIBRARY_PATH",
                  DIAG_NAME(label), nvrtc.why);
        return false;
    }
    if (!cg_nvrtc_supports_arch(req->arch)) {
        if (supported.out_of_memory) {
            set_error(error, error_size, "kernel '%.*s%s': out of memory", DIAG_NAME(label));
            return false;
        }
        char archs[256];
        describe_supported_archs(archs, sizeof archs);
        int major = 0, minor = 0;
        cg_nvrtc_version(&major, &minor);
        set_error(error, error_size, "kernel '%.*s%s': NVRTC %d.%d cannot compile for sm_%d (it supports %s)",
                  DIAG_NAME(label), major, minor, req->arch, archs);
        return false;
    }

    /* NVRTC takes the header lists as parallel arrays. */
    size_t header_count = req->header_count;
    const char **header_texts = allocate(header_count * sizeof *header_texts);
    const char **header_names = allocate(header_count * sizeof *header_names);
    if (!header_texts || !header_names) {
        free(header_texts);
        free(header_names);
        set_error(error, error_size, "kernel '%.*s%s': out of memory", DIAG_NAME(label));
        return false;
    }
    for (size_t i = 0; i < header_count; i++) {
        header_texts[i] = req->headers[i].text;
        header_names[i] = req->headers[i].name;
    }
    /* The program name shows in NVRTC's messages ("rmsnorm_0.cu(12): error"). */
    char program_name[DIAG_NAME_MAX + 8];
    snprintf(program_name, sizeof program_name, "%.*s.cu", (int)diag_name_length(label), label);

    nvrtcProgram program;
    nvrtcResult result = nvrtcCreateProgram(&program, req->source, program_name, (int)header_count,
                                            header_texts, header_names);
    free(header_texts);
    free(header_names);
    if (result != NVRTC_SUCCESS) {
        set_compile_error(error, error_size, req, result, NULL);
        return false;
    }

    cg_fixed_options fixed;
    cg_nvrtc_fixed_options(req, &fixed);
    size_t option_count = fixed.count + req->extra_option_count;
    const char **options = allocate(option_count * sizeof *options);
    if (!options) {
        nvrtcDestroyProgram(&program);
        set_error(error, error_size, "kernel '%.*s%s': out of memory", DIAG_NAME(label));
        return false;
    }
    memcpy(options, fixed.options, fixed.count * sizeof *options);
    for (size_t i = 0; i < req->extra_option_count; i++)
        options[fixed.count + i] = req->extra_options[i];
    result = nvrtcCompileProgram(program, (int)option_count, options);
    free(options);

    char *log = program_log(program);
    if (!log) {
        nvrtcDestroyProgram(&program);
        set_error(error, error_size, "kernel '%.*s%s': out of memory", DIAG_NAME(label));
        return false;
    }
    if (result != NVRTC_SUCCESS) {
        set_compile_error(error, error_size, req, result, log);
        free(log);
        nvrtcDestroyProgram(&program);
        return false;
    }
    out->log = log;

    bool ok = true, out_of_memory = false;
    if (req->want_cubin) {
        size_t size = 0;
        ok = nvrtcGetCUBINSize(program, &size) == NVRTC_SUCCESS && size > 0;
        if (ok) {
            out->cubin = allocate(size);
            out_of_memory = !out->cubin;
            ok = !out_of_memory;
        }
        if (ok) {
            out->cubin_size = size;
            ok = nvrtcGetCUBIN(program, (char *)out->cubin) == NVRTC_SUCCESS;
        }
    }
    if (ok && req->want_ptx) {
        size_t size = 0; /* counts the terminating NUL */
        ok = nvrtcGetPTXSize(program, &size) == NVRTC_SUCCESS && size > 1;
        if (ok) {
            out->ptx = allocate(size);
            out_of_memory = !out->ptx;
            ok = !out_of_memory;
        }
        if (ok) {
            ok = nvrtcGetPTX(program, out->ptx) == NVRTC_SUCCESS;
            out->ptx[size - 1] = '\0';
            out->ptx_size = strlen(out->ptx);
        }
    }
    nvrtcDestroyProgram(&program);
    if (out_of_memory || (ok && !cg_parse_ptxas_log(out->log, &out->resources))) {
        set_error(error, error_size, "kernel '%.*s%s': out of memory", DIAG_NAME(label));
        cg_compiled_free(out);
        return false;
    }
    if (!ok) {
        set_error(error, error_size, "kernel '%.*s%s': NVRTC compiled it but returned no %s",
                  DIAG_NAME(label), req->want_cubin && !out->cubin_size ? "cubin" : "PTX");
        cg_compiled_free(out);
        return false;
    }
    return true;
}

#else /* !SMELT_HAVE_NVRTC */

bool cg_nvrtc_version(int *major, int *minor) {
    if (major) *major = 0;
    if (minor) *minor = 0;
    return false;
}

bool cg_nvrtc_supports_arch(int arch) {
    (void)arch;
    return false;
}

bool cg_compile_kernel(const cg_compile_request *req, cg_compiled *out, char *error, size_t error_size) {
    memset(out, 0, sizeof *out);
    if (!check_request(req, error, error_size)) return false;
    const char *label = kernel_label(req);
    set_error(error, error_size,
              "kernel '%.*s%s': smelt was built without NVRTC (no CUDA toolkit found), so it cannot compile "
              "for sm_%d",
              DIAG_NAME(label), req->arch);
    return false;
}

#endif
