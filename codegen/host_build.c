/* host_build.c - kernel sources -> the host simulator's shared object, via
 * the host C compiler in a temporary folder, cached on disk (see
 * host_build.h). */
#define _GNU_SOURCE /* posix_spawn_file_actions_addchdir_np */
#include "host_build.h"

#include "compile_pool.h"

#include "arena.h"
#include "diag.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
#include <pthread.h>
#include <spawn.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

extern char **environ;

enum {
    MAX_COMPILER_WORDS = 16,
    OUTPUT_KEEP = 64 * 1024, /* compiler output kept for messages */
    ERROR_OUTPUT_LINES = 30, /* lines of it quoted in an error */
    HASH_CHUNK = 64 * 1024,  /* include files are hashed in pieces this big */
    FILE_NAME_MAX = 64,      /* kernel names in #line are cut to this */
};
#define OBJECT_MAX_BYTES ((uint64_t)1 << 30)

/* Beyond -O2, none of which changes a result: -fno-math-errno lets sqrtf be
 * one instruction, -fno-trapping-math lets the compiler ignore FP traps
 * nobody enables, -fno-plt and -fno-semantic-interposition call the
 * simulator and the object's own functions directly. */
static const char *const fixed_flags[] = {
    "-std=c11", "-O2",    "-fno-math-errno", "-fno-trapping-math", "-fno-plt", "-fno-semantic-interposition",
    "-fPIC",    "-shared"};
static const char *const sanitizer_flags[] = {"-fsanitize=address", "-fno-omit-frame-pointer"};
#define COUNT_OF(a) (sizeof(a) / sizeof((a)[0]))

static void set_error(char *error, size_t error_size, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
static void set_error(char *error, size_t error_size, const char *fmt, ...) {
    if (!error || error_size == 0) return;
    va_list args;
    va_start(args, fmt);
    vsnprintf(error, error_size, fmt, args);
    va_end(args);
}

/* Appends up to `lines` lines of text to error (after what is there). */
static void append_lines(char *error, size_t error_size, const char *text, int lines) {
    if (!error || error_size == 0 || !text) return;
    size_t used = strlen(error);
    for (int line = 0; line < lines && *text && used + 1 < error_size; line++) {
        const char *end = strchr(text, '\n');
        size_t length = end ? (size_t)(end - text + 1) : strlen(text);
        size_t n = length < error_size - 1 - used ? length : error_size - 1 - used;
        memcpy(error + used, text, n);
        used += n;
        text += length;
    }
    while (used > 0 && error[used - 1] == '\n')
        used--;
    error[used] = '\0';
}

/* NULL when out of memory; each caller fails its build (or, for the cache
 * key, makes a key no entry matches). */
static void *allocate(size_t size) { return malloc(size ? size : 1); }

static char *format(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
static char *format(const char *fmt, ...) {
    va_list args;
    va_start(args, fmt);
    int n = vsnprintf(NULL, 0, fmt, args);
    va_end(args);
    if (n < 0) SMELT_DIE("bad format '%s'", fmt);
    char *s = allocate((size_t)n + 1);
    if (!s) return NULL;
    va_start(args, fmt);
    vsnprintf(s, (size_t)n + 1, fmt, args);
    va_end(args);
    return s;
}

bool cg_host_build_process_is_sanitized(void) {
#if defined(__SANITIZE_ADDRESS__)
    return true;
#elif defined(__has_feature)
#if __has_feature(address_sanitizer)
    return true;
#else
    return false;
#endif
#else
    return false;
#endif
}

void cg_host_object_free(cg_host_object *object) {
    free(object->bytes);
    memset(object, 0, sizeof *object);
}

/* ---- the compiler command ------------------------------------------------ */

typedef struct compiler_command {
    char *text; /* owned copy, cut into words in place */
    const char *words[MAX_COMPILER_WORDS];
    size_t count;
} compiler_command;

static bool split_compiler(const cg_host_build_request *req, compiler_command *c, char *error,
                           size_t error_size) {
    const char *from = req->compiler;
    if (!from || !from[0]) from = getenv("SMELT_HOST_CC");
    if (!from || !from[0]) from = "cc";
    size_t length = strlen(from);
    c->text = allocate(length + 1);
    if (!c->text) {
        set_error(error, error_size, "host build: out of memory");
        return false;
    }
    memcpy(c->text, from, length + 1);
    c->count = 0;
    for (char *p = c->text; *p;) {
        while (*p == ' ' || *p == '\t')
            *p++ = '\0';
        if (!*p) break;
        if (c->count == MAX_COMPILER_WORDS) {
            set_error(error, error_size, "host compiler command '%.*s%s' has more than %d words",
                      DIAG_NAME(from), MAX_COMPILER_WORDS);
            free(c->text);
            return false;
        }
        c->words[c->count++] = p;
        while (*p && *p != ' ' && *p != '\t')
            p++;
    }
    if (c->count == 0) {
        set_error(error, error_size, "host compiler command is blank");
        free(c->text);
        return false;
    }
    return true;
}

/* Runs argv (NULL-terminated, argv[0] looked up in PATH; in folder cwd unless NULL) with stdout and
 * stderr into one pipe; *output gets the first OUTPUT_KEEP bytes of it
 * (malloc'd, NUL-terminated) and *status the wait status. False with errno
 * when the program could not be started. */
/* Compilers are started from several threads at once (the compile pool):
 * from pipe() until the write end is closed here, no other thread may
 * spawn, or its child would inherit the write end before FD_CLOEXEC is set
 * and keep this pipe open (our read would wait for that child to exit). */
static pthread_mutex_t spawn_lock = PTHREAD_MUTEX_INITIALIZER;

static bool run_capture(const char *const *argv, const char *cwd, char **output, int *status) {
    *output = NULL;
    char *text = allocate(OUTPUT_KEEP + 1);
    if (!text) {
        errno = ENOMEM;
        return false;
    }
    int fds[2];
    pthread_mutex_lock(&spawn_lock);
    if (pipe(fds) != 0) {
        int saved = errno;
        pthread_mutex_unlock(&spawn_lock);
        free(text);
        errno = saved;
        return false;
    }
    fcntl(fds[0], F_SETFD, FD_CLOEXEC);
    fcntl(fds[1], F_SETFD, FD_CLOEXEC);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
    if (cwd) posix_spawn_file_actions_addchdir_np(&actions, cwd);
    pid_t pid;
    int spawn_error = posix_spawnp(&pid, argv[0], &actions, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&actions);
    close(fds[1]);
    pthread_mutex_unlock(&spawn_lock);
    if (spawn_error != 0) {
        close(fds[0]);
        free(text);
        errno = spawn_error;
        return false;
    }
    size_t kept = 0;
    char drain[4096];
    for (;;) {
        char *into = kept < OUTPUT_KEEP ? text + kept : drain;
        size_t room = kept < OUTPUT_KEEP ? OUTPUT_KEEP - kept : sizeof drain;
        ssize_t n = read(fds[0], into, room);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        if (into == text + kept) kept += (size_t)n;
    }
    close(fds[0]);
    text[kept] = '\0';
    while (waitpid(pid, status, 0) < 0) {
        if (errno != EINTR) {
            *status = -1;
            break;
        }
    }
    *output = text;
    return true;
}

static void describe_status(int status, char *out, size_t size) {
    if (status == -1)
        snprintf(out, size, "its status was lost");
    else if (WIFEXITED(status))
        snprintf(out, size, "exit status %d", WEXITSTATUS(status));
    else if (WIFSIGNALED(status))
        snprintf(out, size, "killed by signal %d", WTERMSIG(status));
    else
        snprintf(out, size, "wait status %d", status);
}

/* ---- the cache key ------------------------------------------------------- */

static int compare_names(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

static bool ends_with_h(const char *name) {
    size_t n = strlen(name);
    return n > 2 && strcmp(name + n - 2, ".h") == 0;
}

/* Feeds the name and contents of every *.h file in `folder` (sorted). */
static void hash_include_dir(cg_cache_hasher *h, const char *folder) {
    cg_cache_hash_string(h, folder ? "include_dir" : NULL);
    if (!folder) return;
    DIR *dir = opendir(folder);
    if (!dir) {
        cg_cache_hash_string(h, "(unreadable)");
        return;
    }
    size_t count = 0, capacity = 16;
    char **names = allocate(capacity * sizeof *names);
    bool out_of_memory = !names;
    struct dirent *entry;
    while (!out_of_memory && (entry = readdir(dir))) {
        if (!ends_with_h(entry->d_name)) continue;
        if (count == capacity) {
            capacity *= 2;
            char **grown = realloc(names, capacity * sizeof *grown);
            if (!grown) {
                out_of_memory = true;
                break;
            }
            names = grown;
        }
        names[count] = format("%s", entry->d_name);
        if (!names[count])
            out_of_memory = true;
        else
            count++;
    }
    closedir(dir);
    char *buffer = out_of_memory ? NULL : allocate(HASH_CHUNK);
    if (!buffer) {
        /* Out of memory: the key is made unlike any other (the address of
         * the hasher and the clock), so no cache entry can match it. */
        cg_cache_hash_string(h, "(out of memory)");
        cg_cache_hash_u64(h, (uint64_t)(uintptr_t)h ^ (uint64_t)clock());
        for (size_t i = 0; i < count; i++)
            free(names[i]);
        free(names);
        return;
    }
    qsort(names, count, sizeof *names, compare_names);
    cg_cache_hash_u64(h, count);
    for (size_t i = 0; i < count; i++) {
        char path[PATH_MAX];
        snprintf(path, sizeof path, "%s/%s", folder, names[i]);
        FILE *f = fopen(path, "rb");
        cg_cache_hash_string(h, names[i]);
        cg_cache_hash_u64(h, f != NULL);
        /* in fixed chunks, each fed with its length: the same file always
         * gives the same sequence */
        size_t n;
        while (f && (n = fread(buffer, 1, HASH_CHUNK, f)) > 0)
            cg_cache_hash_bytes(h, buffer, n);
        cg_cache_hash_u64(h, UINT64_MAX); /* end of file */
        if (f) fclose(f);
        free(names[i]);
    }
    free(buffer);
    free(names);
}

static cg_cache_key host_key(const cg_host_build_request *req, const compiler_command *compiler,
                             const char *compiler_version) {
    cg_cache_hasher *h = cg_cache_hasher_begin(CG_CACHE_HOST_OBJECT);
    cg_cache_hash_u64(h, compiler->count);
    for (size_t i = 0; i < compiler->count; i++)
        cg_cache_hash_string(h, compiler->words[i]);
    cg_cache_hash_string(h, compiler_version);
    cg_cache_hash_u64(h, COUNT_OF(fixed_flags));
    for (size_t i = 0; i < COUNT_OF(fixed_flags); i++)
        cg_cache_hash_string(h, fixed_flags[i]);
    cg_cache_hash_u64(h, req->sanitize_address);
    cg_cache_hash_u64(h, req->extra_flag_count);
    for (size_t i = 0; i < req->extra_flag_count; i++)
        cg_cache_hash_string(h, req->extra_flags[i]);
    cg_cache_hash_u64(h, req->link_flag_count);
    for (size_t i = 0; i < req->link_flag_count; i++)
        cg_cache_hash_string(h, req->link_flags[i]);
    hash_include_dir(h, req->include_dir);
    cg_cache_hash_u64(h, req->header_count);
    for (size_t i = 0; i < req->header_count; i++) {
        cg_cache_hash_string(h, req->headers[i].name);
        cg_cache_hash_string(h, req->headers[i].text);
    }
    cg_cache_hash_u64(h, req->source_count);
    for (size_t i = 0; i < req->source_count; i++) {
        cg_cache_hash_string(h, req->sources[i].name);
        cg_cache_hash_string(h, req->sources[i].text);
    }
    return cg_cache_hasher_finish(h);
}

/* ---- the build ---------------------------------------------------------- */

static bool check_request(const cg_host_build_request *req, char *error, size_t error_size) {
    if (req->source_count == 0 || !req->sources) {
        set_error(error, error_size, "host build: expected at least one kernel source, found none");
        return false;
    }
    for (size_t i = 0; i < req->source_count; i++) {
        if (!req->sources[i].text) {
            set_error(error, error_size, "host build: kernel source %zu has no text", i);
            return false;
        }
    }
    if (req->header_count && !req->headers) {
        set_error(error, error_size, "host build: bad header list");
        return false;
    }
    for (size_t i = 0; i < req->header_count; i++) {
        const char *name = req->headers[i].name;
        if (!name || !req->headers[i].text || !name[0] || strchr(name, '/') || strcmp(name, ".") == 0 ||
            strcmp(name, "..") == 0) {
            set_error(error, error_size,
                      "host build: expected a plain file name for header %zu, found '%.*s%s'", i,
                      DIAG_NAME(name ? name : "(null)"));
            return false;
        }
    }
    for (size_t i = 0; i < req->extra_flag_count; i++)
        if (!req->extra_flags || !req->extra_flags[i]) {
            set_error(error, error_size, "host build: extra flag %zu is missing", i);
            return false;
        }
    for (size_t i = 0; i < req->link_flag_count; i++)
        if (!req->link_flags || !req->link_flags[i]) {
            set_error(error, error_size, "host build: link flag %zu is missing", i);
            return false;
        }
    return true;
}

static bool write_file(const char *path, const char *prefix, const char *text) {
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    bool ok = fputs(prefix, f) >= 0 && fwrite(text, 1, strlen(text), f) == strlen(text);
    ok = fclose(f) == 0 && ok;
    return ok;
}

/* A name usable inside #line "...": [A-Za-z0-9_.-], at most FILE_NAME_MAX.
 * A longer name keeps its head and its last LINE_NAME_TAIL characters (a
 * kernel name ends in the hash of its source, which tells kernels apart). */
enum { LINE_NAME_TAIL = 9 };
static void line_name(const char *name, size_t index, char *out, size_t size) {
    if (!name || !name[0]) {
        snprintf(out, size, "kernel_%04zu.c", index);
        return;
    }
    size_t length = strlen(name), n = 0;
    for (size_t i = 0; i < length && n < FILE_NAME_MAX && n + 3 < size; i++) {
        if (length > FILE_NAME_MAX && i == FILE_NAME_MAX - LINE_NAME_TAIL - 2) {
            out[n++] = '.'; /* ".." marks the cut */
            out[n++] = '.';
            i = length - LINE_NAME_TAIL;
        }
        char c = name[i];
        bool plain = (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' ||
                     c == '.' || c == '-';
        out[n++] = plain ? c : '_';
    }
    snprintf(out + n, size - n, ".c");
}

static bool read_object(const char *path, cg_host_object *out) {
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return false;
    struct stat st;
    if (fstat(fd, &st) != 0 || !S_ISREG(st.st_mode) || st.st_size <= 0 ||
        (uint64_t)st.st_size > OBJECT_MAX_BYTES) {
        close(fd);
        errno = EFBIG;
        return false;
    }
    size_t size = (size_t)st.st_size, done = 0;
    uint8_t *bytes = allocate(size);
    if (!bytes) {
        close(fd);
        errno = ENOMEM;
        return false;
    }
    while (done < size) {
        ssize_t n = read(fd, bytes + done, size - done);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) break;
        done += (size_t)n;
    }
    close(fd);
    if (done != size) {
        free(bytes);
        errno = EIO;
        return false;
    }
    out->bytes = bytes;
    out->size = size;
    return true;
}

/* Removes the plain files in `folder`, then the folder. */
static void remove_folder(const char *folder) {
    DIR *dir = opendir(folder);
    if (dir) {
        struct dirent *entry;
        while ((entry = readdir(dir))) {
            if (strcmp(entry->d_name, ".") == 0 || strcmp(entry->d_name, "..") == 0) continue;
            char path[PATH_MAX];
            snprintf(path, sizeof path, "%s/%s", folder, entry->d_name);
            unlink(path);
        }
        closedir(dir);
    }
    rmdir(folder);
}

/* ---- the build in steps ------------------------------------------------------ */

/* One kernel's compile to an object file in the build's folder. */
typedef struct host_unit {
    char *source_path; /* <folder>/kernel_NNNN.c */
    char *object_path; /* <folder>/kernel_NNNN.o */
    bool ran;          /* the compiler was started and waited for */
    int status;        /* its wait status */
    char *output;      /* what it printed (malloc'd), or NULL */
    int start_errno;   /* !ran: why it could not be started (ENOMEM: out of memory) */
} host_unit;

struct cg_host_builder {
    cg_host_build_request req; /* a copy; what it points to is the caller's */
    cg_cache *cache;
    compiler_command compiler;
    cg_cache_key key;
    char *folder; /* the temporary folder; NULL on a cache hit */
    host_unit *units;
    size_t unit_count;
    cg_host_object cached; /* a hit's object */
};

/* A fixed part (the driver, cc1 and the assembler starting, the header
 * parsed) and a part per source byte, in microseconds: gcc 12 -O2 on the
 * Llama-3-8B kernels (a 1 KB kernel ~40 ms, the 13 KB attention ~200 ms). */
enum { HOST_CC_FIXED_COST = 30000, HOST_CC_COST_PER_BYTE = 12 };

/* The compiler words, the fixed flags, and the flags every step shares. */
static size_t common_arguments(const cg_host_builder *b, const char **argv) {
    size_t argc = 0;
    for (size_t i = 0; i < b->compiler.count; i++)
        argv[argc++] = b->compiler.words[i];
    for (size_t i = 0; i < COUNT_OF(fixed_flags); i++)
        argv[argc++] = fixed_flags[i];
    if (b->req.sanitize_address)
        for (size_t i = 0; i < COUNT_OF(sanitizer_flags); i++)
            argv[argc++] = sanitizer_flags[i];
    for (size_t i = 0; i < b->req.extra_flag_count; i++)
        argv[argc++] = b->req.extra_flags[i];
    return argc;
}

static size_t common_argument_count(const cg_host_builder *b) {
    return b->compiler.count + COUNT_OF(fixed_flags) + COUNT_OF(sanitizer_flags) + b->req.extra_flag_count;
}

/* Writes the headers and every source (each after a #line naming its
 * kernel) into b->folder and names each unit's files. */
static bool write_sources(cg_host_builder *b, char *error, size_t error_size) {
    for (size_t i = 0; i < b->req.header_count; i++) {
        char *path = format("%s/%s", b->folder, b->req.headers[i].name);
        if (!path) {
            set_error(error, error_size, "host build: out of memory");
            return false;
        }
        bool ok = write_file(path, "", b->req.headers[i].text);
        if (!ok) set_error(error, error_size, "host build: cannot write '%s': %s", path, strerror(errno));
        free(path);
        if (!ok) return false;
    }
    for (size_t i = 0; i < b->unit_count; i++) {
        host_unit *u = &b->units[i];
        u->source_path = format("%s/kernel_%04zu.c", b->folder, i);
        u->object_path = format("%s/kernel_%04zu.o", b->folder, i);
        if (!u->source_path || !u->object_path) {
            set_error(error, error_size, "host build: out of memory");
            return false;
        }
        char name[FILE_NAME_MAX + 8];
        line_name(b->req.sources[i].name, i, name, sizeof name);
        char prefix[FILE_NAME_MAX + 32];
        snprintf(prefix, sizeof prefix, "#line 1 \"%s\"\n", name);
        if (!write_file(u->source_path, prefix, b->req.sources[i].text)) {
            set_error(error, error_size, "host build: cannot write '%s': %s", u->source_path,
                      strerror(errno));
            return false;
        }
    }
    return true;
}

static void free_build(cg_host_builder *b) {
    if (b->folder) remove_folder(b->folder);
    free(b->folder);
    for (size_t i = 0; i < b->unit_count && b->units; i++) {
        free(b->units[i].source_path);
        free(b->units[i].object_path);
        free(b->units[i].output);
    }
    free(b->units);
    cg_host_object_free(&b->cached);
    free(b->compiler.text);
    free(b);
}

bool cg_host_build_begin(const cg_host_build_request *req, cg_cache *cache, cg_host_builder **out,
                         char *error, size_t error_size) {
    *out = NULL;
    if (!check_request(req, error, error_size)) return false;
    cg_host_builder *b = allocate(sizeof *b);
    if (!b) {
        set_error(error, error_size, "host build: out of memory");
        return false;
    }
    memset(b, 0, sizeof *b);
    b->req = *req;
    b->cache = cache;
    if (!split_compiler(req, &b->compiler, error, error_size)) {
        free(b);
        return false;
    }

    /* The compiler's identity is part of the key: a new gcc, a new object. */
    const char *version_argv[MAX_COMPILER_WORDS + 2];
    memcpy(version_argv, b->compiler.words, b->compiler.count * sizeof *version_argv);
    version_argv[b->compiler.count] = "--version";
    version_argv[b->compiler.count + 1] = NULL;
    char *version = NULL;
    int status = 0;
    if (!run_capture(version_argv, NULL, &version, &status)) {
        set_error(error, error_size, "host compiler '%.*s%s' could not be started: %s",
                  DIAG_NAME(b->compiler.words[0]), strerror(errno));
        free_build(b);
        return false;
    }
    b->key = host_key(req, &b->compiler, version);
    free(version);

    cg_cache_entry entry;
    if (cache && cg_cache_load(cache, &b->key, CG_CACHE_HOST_OBJECT, &entry)) {
        if (entry.blob_count == 1 && entry.blobs[0].size > 0) {
            b->cached.bytes = allocate(entry.blobs[0].size);
            if (b->cached.bytes) { /* else built again */
                memcpy(b->cached.bytes, entry.blobs[0].data, entry.blobs[0].size);
                b->cached.size = entry.blobs[0].size;
                b->cached.from_cache = true;
            }
        }
        cg_cache_entry_free(&entry);
        if (b->cached.bytes) {
            *out = b;
            return true;
        }
    }

    const char *tmp = getenv("TMPDIR");
    char *folder = format("%s/smelt-host-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
    b->units = allocate(req->source_count * sizeof *b->units);
    if (!folder || !b->units) {
        free(folder);
        set_error(error, error_size, "host build: out of memory");
        free_build(b);
        return false;
    }
    memset(b->units, 0, req->source_count * sizeof *b->units);
    b->unit_count = req->source_count;
    if (!mkdtemp(folder)) {
        set_error(error, error_size, "host build: cannot make a temporary folder '%s': %s", folder,
                  strerror(errno));
        free(folder);
        free_build(b);
        return false;
    }
    b->folder = folder;
    if (!write_sources(b, error, error_size)) {
        free_build(b);
        return false;
    }
    *out = b;
    return true;
}

size_t cg_host_build_unit_count(const cg_host_builder *b) { return b->folder ? b->unit_count : 0; }

uint64_t cg_host_build_unit_cost(const cg_host_builder *b, size_t unit) {
    return HOST_CC_FIXED_COST + HOST_CC_COST_PER_BYTE * (uint64_t)strlen(b->req.sources[unit].text);
}

void cg_host_build_run_unit(cg_host_builder *b, size_t unit) {
    host_unit *u = &b->units[unit];
    /* compiler, flags, -c, -I x2, -o OBJECT, SOURCE, NULL */
    const char **argv = allocate((common_argument_count(b) + 8) * sizeof *argv);
    /* Run in the build's folder on the source's own name: an object embeds
     * its source's path (ASan's global descriptors do), and the folder's is
     * random, so a host object is the same bytes whichever build made it. */
    char *local_include = format("-I.");
    char *include = b->req.include_dir ? format("-I%s", b->req.include_dir) : NULL;
    if (!argv || !local_include || (b->req.include_dir && !include)) {
        u->start_errno = ENOMEM;
    } else {
        size_t argc = common_arguments(b, argv);
        argv[argc++] = "-c";
        argv[argc++] = local_include;
        if (include) argv[argc++] = include;
        argv[argc++] = "-o";
        argv[argc++] = u->object_path;
        argv[argc++] = strrchr(u->source_path, '/') + 1;
        argv[argc] = NULL;
        u->ran = run_capture(argv, b->folder, &u->output, &u->status);
        if (!u->ran) u->start_errno = errno;
    }
    free(include);
    free(local_include);
    free(argv);
}

static bool unit_failed(const host_unit *u) {
    return !u->ran || !(WIFEXITED(u->status) && WEXITSTATUS(u->status) == 0);
}

/* The message of the first unit that failed, and how many others did. */
static void describe_failed_units(const cg_host_builder *b, char *error, size_t error_size) {
    size_t failed = 0, first = 0;
    for (size_t i = 0; i < b->unit_count; i++)
        if (unit_failed(&b->units[i]) && failed++ == 0) first = i;
    const host_unit *u = &b->units[first];
    const char *compiler = b->compiler.words[0];
    if (!u->ran && u->start_errno == ENOMEM) {
        set_error(error, error_size, "host build: out of memory");
        return;
    }
    if (!u->ran) {
        set_error(error, error_size, "host compiler '%.*s%s' could not be started: %s", DIAG_NAME(compiler),
                  strerror(u->start_errno));
        return;
    }
    char how[64], name[FILE_NAME_MAX + 8];
    describe_status(u->status, how, sizeof how);
    line_name(b->req.sources[first].name, first, name, sizeof name);
    name[strlen(name) - 2] = '\0'; /* without ".c" */
    char others[64] = "";
    if (failed > 1) snprintf(others, sizeof others, " (and %zu more of %zu)", failed - 1, b->unit_count);
    set_error(error, error_size, "host compiler '%.*s%s' failed (%s) building kernel '%s'%s%s",
              DIAG_NAME(compiler), how, name, others, u->output && u->output[0] ? ":\n" : "");
    append_lines(error, error_size, u->output, ERROR_OUTPUT_LINES);
}

/* Links the units' objects into <folder>/kernels.so and reads it back. */
static bool link_units(const cg_host_builder *b, cg_host_object *out, char *error, size_t error_size) {
    size_t argument_count = common_argument_count(b) + 2 + b->unit_count + b->req.link_flag_count + 1;
    const char **argv = allocate(argument_count * sizeof *argv);
    char *object_path = format("%s/kernels.so", b->folder);
    if (!argv || !object_path) {
        free(argv);
        free(object_path);
        set_error(error, error_size, "host build: out of memory");
        return false;
    }
    size_t argc = common_arguments(b, argv);
    argv[argc++] = "-o";
    argv[argc++] = object_path;
    for (size_t i = 0; i < b->unit_count; i++)
        argv[argc++] = b->units[i].object_path;
    for (size_t i = 0; i < b->req.link_flag_count; i++)
        argv[argc++] = b->req.link_flags[i];
    argv[argc] = NULL;

    const char *compiler = b->compiler.words[0];
    char *output = NULL;
    int status = 0;
    bool ok = false;
    if (!run_capture(argv, NULL, &output, &status)) {
        set_error(error, error_size, "host compiler '%.*s%s' could not be started: %s", DIAG_NAME(compiler),
                  strerror(errno));
    } else if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
        char how[64];
        describe_status(status, how, sizeof how);
        set_error(error, error_size, "host compiler '%.*s%s' failed (%s) linking %zu kernel%s%s",
                  DIAG_NAME(compiler), how, b->unit_count, b->unit_count == 1 ? "" : "s",
                  output[0] ? ":\n" : "");
        append_lines(error, error_size, output, ERROR_OUTPUT_LINES);
    } else if (!read_object(object_path, out)) {
        set_error(error, error_size, "host build: cannot read the compiler's output '%s': %s", object_path,
                  strerror(errno));
    } else {
        ok = true;
    }
    free(output);
    free(object_path);
    free(argv);
    return ok;
}

bool cg_host_build_finish(cg_host_builder *b, cg_host_object *out, char *error, size_t error_size) {
    memset(out, 0, sizeof *out);
    bool ok = true;
    if (b->cached.bytes) {
        *out = b->cached;
        memset(&b->cached, 0, sizeof b->cached);
    } else {
        for (size_t i = 0; i < b->unit_count && ok; i++)
            ok = !unit_failed(&b->units[i]);
        if (!ok)
            describe_failed_units(b, error, error_size);
        else
            ok = link_units(b, out, error, error_size);
        if (ok && b->cache) {
            cg_cache_blob blob = {out->bytes, out->size};
            cg_cache_store(b->cache, &b->key, CG_CACHE_HOST_OBJECT, &blob, 1);
        }
    }
    free_build(b);
    return ok;
}

void cg_host_build_cancel(cg_host_builder *b) {
    if (b) free_build(b);
}

/* ---- the build in one call ------------------------------------------------------ */

static uint64_t unit_cost(void *context, size_t unit) { return cg_host_build_unit_cost(context, unit); }
static void run_unit(void *context, size_t unit) { cg_host_build_run_unit(context, unit); }

bool cg_host_build(const cg_host_build_request *req, cg_cache *cache, cg_host_object *out, char *error,
                   size_t error_size) {
    memset(out, 0, sizeof *out);
    cg_host_builder *b;
    if (!cg_host_build_begin(req, cache, &b, error, error_size)) return false;
    cg_pool_tasks tasks = {cg_host_build_unit_count(b), b, unit_cost, run_unit};
    size_t failed;
    if (!cg_compile_all_with_tasks(NULL, 0, &tasks, 0, NULL, NULL, NULL, NULL, &failed, NULL, 0)) {
        cg_host_build_cancel(b);
        set_error(error, error_size, "host build: out of memory");
        return false;
    }
    return cg_host_build_finish(b, out, error, error_size);
}
