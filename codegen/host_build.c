/* host_build.c - kernel sources -> the host simulator's shared object, via
 * the host C compiler in a temporary folder, cached on disk (see
 * host_build.h). */
#include "host_build.h"

#include "arena.h"
#include "diag.h"

#include <dirent.h>
#include <errno.h>
#include <limits.h>
#include <fcntl.h>
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

/* Runs argv (NULL-terminated, argv[0] looked up in PATH) with stdout and
 * stderr into one pipe; *output gets the first OUTPUT_KEEP bytes of it
 * (malloc'd, NUL-terminated) and *status the wait status. False with errno
 * when the program could not be started. */
static bool run_capture(const char *const *argv, char **output, int *status) {
    *output = NULL;
    char *text = allocate(OUTPUT_KEEP + 1);
    if (!text) {
        errno = ENOMEM;
        return false;
    }
    int fds[2];
    if (pipe(fds) != 0) {
        free(text);
        return false;
    }
    fcntl(fds[0], F_SETFD, FD_CLOEXEC);
    fcntl(fds[1], F_SETFD, FD_CLOEXEC);
    posix_spawn_file_actions_t actions;
    posix_spawn_file_actions_init(&actions);
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 1);
    posix_spawn_file_actions_adddup2(&actions, fds[1], 2);
    pid_t pid;
    int spawn_error = posix_spawnp(&pid, argv[0], &actions, NULL, (char *const *)argv, environ);
    posix_spawn_file_actions_destroy(&actions);
    close(fds[1]);
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

/* Writes the files, runs the compiler, reads the object back. */
static bool build_in(const char *folder, const cg_host_build_request *req, const compiler_command *compiler,
                     cg_host_object *out, char *error, size_t error_size) {
    size_t argument_count = compiler->count + COUNT_OF(fixed_flags) + 2 + COUNT_OF(sanitizer_flags) +
                            req->extra_flag_count + 2 + req->source_count + req->link_flag_count + 1;
    const char **argv = allocate(argument_count * sizeof *argv);
    char **owned = allocate((req->source_count + 4) * sizeof *owned); /* strings argv points to */
    if (!argv || !owned) {
        free(argv);
        free(owned);
        set_error(error, error_size, "host build: out of memory");
        return false;
    }
    size_t argc = 0, owned_count = 0;
    bool ok = true;

    for (size_t i = 0; i < req->header_count && ok; i++) {
        char *path = format("%s/%s", folder, req->headers[i].name);
        if (!path) {
            set_error(error, error_size, "host build: out of memory");
            ok = false;
            break;
        }
        ok = write_file(path, "", req->headers[i].text);
        if (!ok) set_error(error, error_size, "host build: cannot write '%s': %s", path, strerror(errno));
        free(path);
    }

    for (size_t i = 0; i < compiler->count; i++)
        argv[argc++] = compiler->words[i];
    for (size_t i = 0; i < COUNT_OF(fixed_flags); i++)
        argv[argc++] = fixed_flags[i];
    argv[argc++] = owned[owned_count++] = format("-I%s", folder);
    if (req->include_dir) argv[argc++] = owned[owned_count++] = format("-I%s", req->include_dir);
    if (req->sanitize_address)
        for (size_t i = 0; i < COUNT_OF(sanitizer_flags); i++)
            argv[argc++] = sanitizer_flags[i];
    for (size_t i = 0; i < req->extra_flag_count; i++)
        argv[argc++] = req->extra_flags[i];
    char *object_path = owned[owned_count++] = format("%s/kernels.so", folder);
    argv[argc++] = "-o";
    argv[argc++] = object_path;
    for (size_t i = 0; i < req->source_count && ok; i++) {
        char *path = owned[owned_count++] = format("%s/kernel_%04zu.c", folder, i);
        if (!path) break; /* reported below */
        char name[FILE_NAME_MAX + 8];
        line_name(req->sources[i].name, i, name, sizeof name);
        char prefix[FILE_NAME_MAX + 32];
        snprintf(prefix, sizeof prefix, "#line 1 \"%s\"\n", name);
        ok = write_file(path, prefix, req->sources[i].text);
        if (!ok) set_error(error, error_size, "host build: cannot write '%s': %s", path, strerror(errno));
        argv[argc++] = path;
    }
    for (size_t i = 0; i < req->link_flag_count; i++)
        argv[argc++] = req->link_flags[i];
    argv[argc] = NULL;
    for (size_t i = 0; i < owned_count && ok; i++)
        if (!owned[i]) {
            set_error(error, error_size, "host build: out of memory");
            ok = false;
        }

    if (ok) {
        char *output = NULL;
        int status = 0;
        if (!run_capture(argv, &output, &status)) {
            set_error(error, error_size, "host compiler '%.*s%s' could not be started: %s",
                      DIAG_NAME(compiler->words[0]), strerror(errno));
            ok = false;
        } else if (!(WIFEXITED(status) && WEXITSTATUS(status) == 0)) {
            char how[64];
            describe_status(status, how, sizeof how);
            set_error(error, error_size, "host compiler '%.*s%s' failed (%s) building %zu kernel%s%s",
                      DIAG_NAME(compiler->words[0]), how, req->source_count,
                      req->source_count == 1 ? "" : "s", output[0] ? ":\n" : "");
            append_lines(error, error_size, output, ERROR_OUTPUT_LINES);
            ok = false;
        } else if (!read_object(object_path, out)) {
            set_error(error, error_size, "host build: cannot read the compiler's output '%s': %s",
                      object_path, strerror(errno));
            ok = false;
        }
        free(output);
    }
    for (size_t i = 0; i < owned_count; i++)
        free(owned[i]);
    free(owned);
    free(argv);
    return ok;
}

bool cg_host_build(const cg_host_build_request *req, cg_cache *cache, cg_host_object *out, char *error,
                   size_t error_size) {
    memset(out, 0, sizeof *out);
    if (!check_request(req, error, error_size)) return false;
    compiler_command compiler;
    if (!split_compiler(req, &compiler, error, error_size)) return false;

    /* The compiler's identity is part of the key: a new gcc, a new object. */
    const char *version_argv[MAX_COMPILER_WORDS + 2];
    memcpy(version_argv, compiler.words, compiler.count * sizeof *version_argv);
    version_argv[compiler.count] = "--version";
    version_argv[compiler.count + 1] = NULL;
    char *version = NULL;
    int status = 0;
    if (!run_capture(version_argv, &version, &status)) {
        set_error(error, error_size, "host compiler '%.*s%s' could not be started: %s",
                  DIAG_NAME(compiler.words[0]), strerror(errno));
        free(compiler.text);
        return false;
    }
    cg_cache_key key = host_key(req, &compiler, version);
    free(version);

    bool ok = false;
    cg_cache_entry entry;
    if (cache && cg_cache_load(cache, &key, CG_CACHE_HOST_OBJECT, &entry)) {
        if (entry.blob_count == 1 && entry.blobs[0].size > 0) {
            out->size = entry.blobs[0].size;
            out->bytes = allocate(out->size);
            if (out->bytes) { /* else built again */
                memcpy(out->bytes, entry.blobs[0].data, out->size);
                out->from_cache = true;
                ok = true;
            }
        }
        cg_cache_entry_free(&entry);
    }
    if (!ok) {
        const char *tmp = getenv("TMPDIR");
        char *folder = format("%s/smelt-host-XXXXXX", tmp && tmp[0] ? tmp : "/tmp");
        if (!folder) {
            set_error(error, error_size, "host build: out of memory");
        } else if (!mkdtemp(folder)) {
            set_error(error, error_size, "host build: cannot make a temporary folder '%s': %s", folder,
                      strerror(errno));
        } else {
            ok = build_in(folder, req, &compiler, out, error, error_size);
            remove_folder(folder);
        }
        free(folder);
        if (ok && cache) {
            cg_cache_blob blob = {out->bytes, out->size};
            cg_cache_store(cache, &key, CG_CACHE_HOST_OBJECT, &blob, 1);
        }
    }
    free(compiler.text);
    return ok;
}
