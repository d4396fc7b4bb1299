/* failmalloc.c - LD_PRELOAD shim that fails chosen allocations of smelt's own code.
 *
 * It interposes malloc, calloc, realloc, posix_memalign, aligned_alloc,
 * memalign, strdup, strndup and open_memstream, and forwards each call to the
 * next definition (libc's, or ASan's when smelt is built with sanitizers:
 * preload this library first and set ASAN_OPTIONS=verify_asan_link_order=0).
 *
 * "Own code" is decided by the caller's return address: it must lie in an
 * executable segment of the main program, or of a loaded object whose path
 * contains one of the comma-separated words in FAILMALLOC_OWN (for shared
 * builds, e.g. "libsmelt"). Allocations made by libc, the loader, jansson's
 * own internals, OpenBLAS or NVRTC are never counted or failed. A call site
 * is the return address, written as an offset into its object so that it is
 * the same in every run despite ASLR.
 *
 * Environment:
 *   FAILMALLOC_EXE=PATH   act only in the process running that program
 *                         (others, such as `timeout` in front, are left alone).
 *   FAILMALLOC_LIST=FILE  counting pass: at exit, write one line per distinct
 *                         call site, in the order first seen: "OFFSET COUNT"
 *                         (OFFSET in hex, into the object holding the site).
 *   FAILMALLOC_SITE=HEX   fail the first allocation made at that site.
 *   FAILMALLOC_NTH=N      fail the N-th (1-based) allocation of own code.
 *   FAILMALLOC_REPORT=FILE  when an allocation is failed, append
 *                         "failed OFFSET" to FILE (so a driver knows the
 *                         failure was injected).
 * The shim removes LD_PRELOAD from the environment, so that programs smelt
 * spawns (the host C compiler) run unharmed.
 * Only one allocation is ever failed per run: the question a sweep asks is
 * whether each single failure is handled.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <link.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum { MAX_RANGES = 64, MAX_SITES = 8192 };

typedef struct range {
    uintptr_t lo, hi, base;
} range;

static range ranges[MAX_RANGES];
static int range_count;
static int ready; /* set once the constructor has found the ranges */

static void *(*next_malloc)(size_t);
static void *(*next_calloc)(size_t, size_t);
static void *(*next_realloc)(void *, size_t);
static int (*next_posix_memalign)(void **, size_t, size_t);
static void *(*next_aligned_alloc)(size_t, size_t);
static void *(*next_memalign)(size_t, size_t);
static FILE *(*next_open_memstream)(char **, size_t *);

/* dlsym may allocate before next_calloc is known: serve it from here. */
static _Alignas(16) unsigned char bootstrap[4096];
static size_t bootstrap_used;
static int resolving;

static const char *list_path, *report_path;
static uintptr_t fail_site;
static int fail_site_set;
static long fail_nth;
static atomic_long own_count;
static atomic_int failed_once;

static pthread_mutex_t sites_lock = PTHREAD_MUTEX_INITIALIZER;
static uintptr_t site_address[MAX_SITES];
static long site_hits[MAX_SITES];
static int site_count;

static void resolve(void) {
    if (next_malloc || resolving) return;
    resolving = 1;
    next_calloc = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "calloc");
    next_malloc = (void *(*)(size_t))dlsym(RTLD_NEXT, "malloc");
    next_realloc = (void *(*)(void *, size_t))dlsym(RTLD_NEXT, "realloc");
    next_posix_memalign = (int (*)(void **, size_t, size_t))dlsym(RTLD_NEXT, "posix_memalign");
    next_aligned_alloc = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "aligned_alloc");
    next_memalign = (void *(*)(size_t, size_t))dlsym(RTLD_NEXT, "memalign");
    next_open_memstream = (FILE * (*)(char **, size_t *)) dlsym(RTLD_NEXT, "open_memstream");
    resolving = 0;
}

static const char *own_words;

static int is_own_object(const char *name, int first) {
    if (first) return 1; /* the main program */
    if (!own_words || !name || !*name) return 0;
    const char *w = own_words;
    while (*w) {
        const char *end = strchr(w, ',');
        size_t n = end ? (size_t)(end - w) : strlen(w);
        if (n) {
            for (const char *p = name; *p; p++)
                if (strncmp(p, w, n) == 0) return 1;
        }
        if (!end) break;
        w = end + 1;
    }
    return 0;
}

static int collect(struct dl_phdr_info *info, size_t size, void *data) {
    (void)size;
    int *index = data;
    int first = (*index)++ == 0;
    if (!is_own_object(info->dlpi_name, first)) return 0;
    for (int i = 0; i < info->dlpi_phnum && range_count < MAX_RANGES; i++) {
        const ElfW(Phdr) *ph = &info->dlpi_phdr[i];
        if (ph->p_type != PT_LOAD || !(ph->p_flags & PF_X)) continue;
        range *r = &ranges[range_count++];
        r->base = info->dlpi_addr;
        r->lo = info->dlpi_addr + ph->p_vaddr;
        r->hi = r->lo + ph->p_memsz;
    }
    return 0;
}

static const range *own_range(uintptr_t address) {
    for (int i = 0; i < range_count; i++)
        if (address >= ranges[i].lo && address < ranges[i].hi) return &ranges[i];
    return NULL;
}

static void report(uintptr_t offset) {
    if (!report_path) return;
    int fd = open(report_path, O_WRONLY | O_CREAT | O_APPEND, 0644);
    if (fd < 0) return;
    char line[64];
    int n = snprintf(line, sizeof line, "failed %lx\n", (unsigned long)offset);
    if (n > 0 && write(fd, line, (size_t)n) < 0) {
    }
    close(fd);
}

/* Whether the allocation made from `caller` is to fail; counts it. */
static int should_fail(void *caller) {
    if (!ready) return 0;
    const range *r = own_range((uintptr_t)caller);
    if (!r) return 0;
    uintptr_t offset = (uintptr_t)caller - r->base;
    long n = atomic_fetch_add(&own_count, 1) + 1;
    int first_at_site = 0;
    if (list_path || fail_site_set) {
        pthread_mutex_lock(&sites_lock);
        int i = 0;
        while (i < site_count && site_address[i] != offset)
            i++;
        if (i == site_count && site_count < MAX_SITES) {
            site_address[site_count] = offset;
            site_hits[site_count] = 0;
            site_count++;
        }
        if (i < site_count) first_at_site = site_hits[i]++ == 0;
        pthread_mutex_unlock(&sites_lock);
    }
    int fail = (fail_nth > 0 && n == fail_nth) || (fail_site_set && offset == fail_site && first_at_site);
    if (!fail || atomic_exchange(&failed_once, 1)) return 0;
    report(offset);
    return 1;
}

/* Whether this process is the one to act in: the program FAILMALLOC_EXE
 * names, when set (so that `timeout` or `env` in front of smelt is left
 * alone and passes the shim on). */
static int is_target_program(void) {
    const char *want = getenv("FAILMALLOC_EXE");
    if (!want || !*want) return 1;
    char self[4096], target[4096];
    ssize_t n = readlink("/proc/self/exe", self, sizeof self - 1);
    if (n <= 0) return 0;
    self[n] = '\0';
    if (!realpath(want, target)) return 0;
    return strcmp(self, target) == 0;
}

__attribute__((constructor)) static void failmalloc_init(void) {
    resolve();
    if (!is_target_program()) return;
    own_words = getenv("FAILMALLOC_OWN");
    list_path = getenv("FAILMALLOC_LIST");
    report_path = getenv("FAILMALLOC_REPORT");
    const char *site = getenv("FAILMALLOC_SITE");
    if (site && *site) {
        fail_site = (uintptr_t)strtoull(site, NULL, 16);
        fail_site_set = 1;
    }
    const char *nth = getenv("FAILMALLOC_NTH");
    if (nth && *nth) fail_nth = strtol(nth, NULL, 10);
    /* Children of smelt (the host compiler codegen spawns) run without it. */
    unsetenv("LD_PRELOAD");
    int index = 0;
    dl_iterate_phdr(collect, &index);
    ready = 1;
}

__attribute__((destructor)) static void failmalloc_fini(void) {
    if (!ready || !list_path) return;
    int fd = open(list_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return;
    pthread_mutex_lock(&sites_lock);
    for (int i = 0; i < site_count; i++) {
        char line[64];
        int n = snprintf(line, sizeof line, "%lx %ld\n", (unsigned long)site_address[i], site_hits[i]);
        if (n > 0 && write(fd, line, (size_t)n) < 0) break;
    }
    pthread_mutex_unlock(&sites_lock);
    close(fd);
}

#define CALLER __builtin_extract_return_addr(__builtin_return_address(0))

void *malloc(size_t size) {
    resolve();
    if (should_fail(CALLER)) {
        errno = ENOMEM;
        return NULL;
    }
    return next_malloc(size);
}

void *calloc(size_t count, size_t size) {
    if (!next_calloc) {
        /* dlsym's own allocations while resolving: zeroed static memory */
        size_t bytes = (count * size + 15) & ~(size_t)15;
        if (bytes > sizeof bootstrap - bootstrap_used) return NULL;
        void *p = bootstrap + bootstrap_used;
        bootstrap_used += bytes;
        return p;
    }
    if (should_fail(CALLER)) {
        errno = ENOMEM;
        return NULL;
    }
    return next_calloc(count, size);
}

void *realloc(void *old, size_t size) {
    resolve();
    if (should_fail(CALLER)) {
        errno = ENOMEM;
        return NULL;
    }
    return next_realloc(old, size);
}

int posix_memalign(void **out, size_t alignment, size_t size) {
    resolve();
    if (should_fail(CALLER)) return ENOMEM;
    return next_posix_memalign(out, alignment, size);
}

void *aligned_alloc(size_t alignment, size_t size) {
    resolve();
    if (should_fail(CALLER)) {
        errno = ENOMEM;
        return NULL;
    }
    return next_aligned_alloc(alignment, size);
}

void *memalign(size_t alignment, size_t size) {
    resolve();
    if (should_fail(CALLER)) {
        errno = ENOMEM;
        return NULL;
    }
    return next_memalign(alignment, size);
}

static char *copy(const char *s, size_t n) {
    char *p = next_malloc(n + 1);
    if (!p) return NULL;
    memcpy(p, s, n);
    p[n] = '\0';
    return p;
}

char *strdup(const char *s) {
    resolve();
    if (should_fail(CALLER)) {
        errno = ENOMEM;
        return NULL;
    }
    return copy(s, strlen(s));
}

char *strndup(const char *s, size_t n) {
    resolve();
    if (should_fail(CALLER)) {
        errno = ENOMEM;
        return NULL;
    }
    return copy(s, strnlen(s, n));
}

FILE *open_memstream(char **buffer, size_t *size) {
    resolve();
    if (should_fail(CALLER)) {
        errno = ENOMEM;
        return NULL;
    }
    return next_open_memstream(buffer, size);
}
