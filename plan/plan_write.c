/* plan_write.c - the plan writer: sections in, one atomically written plan
 * file out (layout: plan/plan_format.h), and the kernel table encoder.
 *
 * The file is written front to back through one buffer: a zeroed header and
 * directory, then each section in kind order, padded to its alignment, then
 * the real header written over the zeros once every size, checksum and the
 * content hash is known. Streamed sections therefore need not know their
 * size in advance.
 */
#include "plan_write.h"

#include "plan_error.h"

#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <signal.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <xxhash.h>

/* A broken invariant of the compiler writing the plan (an unknown section
 * kind, a section added twice, a kernel without a name): print file:line and
 * abort (memory running out is a status: plan_writer.out_of_memory,
 * plan_buffer.failed, or an error from plan_write_file), as ir/'s smelt_die does. plan/ depends on
 * nothing of smelt's, so it cannot call smelt_die; the runtime never writes
 * plans, so this never runs inside the runtime. */
_Noreturn static void plan_write_die(const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
#define PLAN_WRITE_DIE(...) plan_write_die(__FILE__, __LINE__, __VA_ARGS__)

_Noreturn static void plan_write_die(const char *file, int line, const char *fmt, ...) {
    va_list ap;
    fprintf(stderr, "%s:%d: internal error: ", file, line);
    va_start(ap, fmt);
    vfprintf(stderr, fmt, ap);
    va_end(ap);
    fputc('\n', stderr);
    abort();
}

enum {
    PLAN_WRITE_BUFFER = 1 << 20, /* bytes buffered before a write(2) */
    PLAN_TEMP_ATTEMPTS = 100,    /* temporary names tried before giving up */
    PLAN_PRODUCER_MESSAGE = 512,
};

struct plan_sink {
    int fd;
    uint8_t *buffer; /* [PLAN_WRITE_BUFFER] */
    size_t buffered;
    uint64_t file_offset;  /* bytes of the file produced so far, buffered included */
    uint64_t section_size; /* bytes of the section being produced */
    XXH64_state_t *section_hash;
    XXH3_state_t *content_hash;
    int io_errno; /* nonzero once a write failed; every later write fails */
    bool producer_failed;
    char producer_message[PLAN_PRODUCER_MESSAGE];
};

/* ---- The writer ---------------------------------------------------------- */

void plan_writer_init(plan_writer *w, const char *smelt_version) {
    memset(w, 0, sizeof *w);
    size_t length = strnlen(smelt_version, PLAN_SMELT_VERSION_SIZE);
    memcpy(w->smelt_version, smelt_version, length);
}

void plan_writer_free(plan_writer *w) {
    for (int kind = 1; kind <= PLAN_SECTION_KIND_COUNT; kind++)
        free(w->sections[kind].bytes);
    memset(w, 0, sizeof *w);
}

static plan_writer_section *new_section(plan_writer *w, plan_section_kind kind) {
    if (!plan_section_kind_known((uint32_t)kind))
        PLAN_WRITE_DIE("plan writer: unknown section kind %d", (int)kind);
    plan_writer_section *s = &w->sections[kind];
    if (s->present)
        PLAN_WRITE_DIE("plan writer: section %s added twice", plan_section_kind_name((uint32_t)kind));
    s->present = true;
    return s;
}

void plan_writer_add_section(plan_writer *w, plan_section_kind kind, const void *bytes, uint64_t size) {
    plan_writer_section *s = new_section(w, kind);
    if (size > SIZE_MAX) PLAN_WRITE_DIE("plan writer: section of %" PRIu64 " bytes", size);
    if (size > 0) {
        s->bytes = malloc((size_t)size);
        if (!s->bytes) {
            w->out_of_memory = true;
            return;
        }
        memcpy(s->bytes, bytes, (size_t)size);
    }
    s->size = size;
}

void plan_writer_add_stream(plan_writer *w, plan_section_kind kind, plan_stream_fn stream, void *context) {
    plan_writer_section *s = new_section(w, kind);
    s->stream = stream;
    s->stream_context = context;
}

void plan_writer_add_kernels(plan_writer *w, const plan_kernel *kernels, uint32_t count) {
    plan_buffer encoded = {0};
    plan_kernels_encode(kernels, count, &encoded);
    plan_writer_section *s = new_section(w, PLAN_SECTION_KERNELS);
    if (encoded.failed) {
        plan_buffer_free(&encoded);
        w->out_of_memory = true;
        return;
    }
    s->bytes = encoded.data; /* ownership moves to the writer */
    s->size = encoded.size;
}

/* ---- The sink ------------------------------------------------------------ */

/* write(2) until done: retries short writes and interruptions. */
static bool write_all(int fd, const uint8_t *p, size_t size, int *error_out) {
    while (size > 0) {
        ssize_t n = write(fd, p, size);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            *error_out = n < 0 ? errno : EIO;
            return false;
        }
        p += n;
        size -= (size_t)n;
    }
    return true;
}

static bool pwrite_all(int fd, const uint8_t *p, size_t size, off_t offset, int *error_out) {
    while (size > 0) {
        ssize_t n = pwrite(fd, p, size, offset);
        if (n < 0 && errno == EINTR) continue;
        if (n <= 0) {
            *error_out = n < 0 ? errno : EIO;
            return false;
        }
        p += n;
        size -= (size_t)n;
        offset += n;
    }
    return true;
}

static bool sink_flush(plan_sink *s) {
    if (s->io_errno) return false;
    bool ok = write_all(s->fd, s->buffer, s->buffered, &s->io_errno);
    s->buffered = 0;
    return ok;
}

/* Appends bytes to the file without hashing them (padding, the header). */
static bool sink_raw(plan_sink *s, const uint8_t *bytes, size_t size) {
    if (s->io_errno) return false;
    if (size == 0) return true;
    s->file_offset += size;
    if (size > PLAN_WRITE_BUFFER - s->buffered) {
        if (!sink_flush(s)) return false;
        if (size >= PLAN_WRITE_BUFFER) return write_all(s->fd, bytes, size, &s->io_errno);
    }
    memcpy(s->buffer + s->buffered, bytes, size);
    s->buffered += size;
    return true;
}

static bool sink_zeros(plan_sink *s, uint64_t count) {
    static const uint8_t zeros[4096];
    while (count > 0) {
        size_t n = count < sizeof zeros ? (size_t)count : sizeof zeros;
        if (!sink_raw(s, zeros, n)) return false;
        count -= n;
    }
    return true;
}

bool plan_sink_write(plan_sink *s, const void *bytes, size_t size) {
    if (s->io_errno) return false;
    if (size == 0) return true;
    XXH64_update(s->section_hash, bytes, size);
    XXH3_128bits_update(s->content_hash, bytes, size);
    s->section_size += size;
    return sink_raw(s, bytes, size);
}

void plan_sink_fail(plan_sink *s, const char *fmt, ...) {
    s->producer_failed = true;
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(s->producer_message, sizeof s->producer_message, fmt, ap);
    va_end(ap);
}

/* ---- Writing the file ---------------------------------------------------- */

/* Creates "PATH.tmp-PID-N" beside the destination, so that rename() stays
 * within one file system. Mode 0666 less the umask, like any new file. */
static int create_temp(const char *path, char **temp_out) {
    size_t size = strlen(path) + 48;
    char *temp = malloc(size);
    *temp_out = NULL;
    if (!temp) {
        errno = ENOMEM;
        return -1;
    }
    for (unsigned attempt = 0; attempt < PLAN_TEMP_ATTEMPTS; attempt++) {
        snprintf(temp, size, "%s.tmp-%ld-%u", path, (long)getpid(), attempt);
        int fd = open(temp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd >= 0 || errno != EEXIST) {
            *temp_out = temp;
            return fd;
        }
    }
    *temp_out = temp;
    errno = EEXIST;
    return -1;
}

/* fsync of the folder holding path, so the rename itself is durable. File
 * systems that cannot sync a folder (EINVAL) are accepted. */
static bool sync_folder(const char *path, int *error_out) {
    const char *slash = strrchr(path, '/');
    char *folder = slash ? strndup(path, slash == path ? 1 : (size_t)(slash - path)) : strdup(".");
    if (!folder) {
        *error_out = ENOMEM;
        return false;
    }
    int fd = open(folder, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    free(folder);
    if (fd < 0) {
        *error_out = errno;
        return false;
    }
    bool ok = fsync(fd) == 0 || errno == EINVAL;
    if (!ok) *error_out = errno;
    close(fd);
    return ok;
}

/* Streams every section into the sink, filling the directory entries. */
static bool write_sections(const plan_writer *w, plan_sink *s, uint8_t *directory, const char *path,
                           char *error, size_t error_size) {
    uint32_t index = 0;
    for (uint32_t kind = 1; kind <= PLAN_SECTION_KIND_COUNT; kind++) {
        const plan_writer_section *section = &w->sections[kind];
        if (!section->present) continue;
        uint64_t alignment = plan_section_alignment(kind);
        uint64_t padding = (alignment - s->file_offset % alignment) % alignment;
        if (!sink_zeros(s, padding)) break;
        uint64_t offset = s->file_offset;
        XXH64_reset(s->section_hash, 0);
        s->section_size = 0;
        bool produced = section->stream ? section->stream(section->stream_context, s)
                                        : plan_sink_write(s, section->bytes, (size_t)section->size);
        if (s->io_errno) break;
        if (!produced || s->producer_failed)
            return plan_error(error, error_size, path, "cannot produce section %s: %s",
                              plan_section_kind_name(kind),
                              s->producer_failed ? s->producer_message : "its producer failed");
        uint8_t framing[12];
        plan_put_u32(framing, kind);
        plan_put_u64(framing + 4, s->section_size);
        XXH3_128bits_update(s->content_hash, framing, sizeof framing);

        uint8_t *entry = directory + (size_t)index++ * PLAN_DIRECTORY_ENTRY_SIZE;
        plan_put_u32(entry + PLAN_ENTRY_AT_KIND, kind);
        plan_put_u32(entry + PLAN_ENTRY_AT_FLAGS, 0);
        plan_put_u64(entry + PLAN_ENTRY_AT_OFFSET, offset);
        plan_put_u64(entry + PLAN_ENTRY_AT_SIZE, s->section_size);
        plan_put_u64(entry + PLAN_ENTRY_AT_CHECKSUM, XXH64_digest(s->section_hash));
    }
    if (s->io_errno || !sink_flush(s))
        return plan_error(error, error_size, path, "cannot write: %s", strerror(s->io_errno));
    return true;
}

/* Writes the plan into the open temporary file fd; does not close it. */
static bool write_plan(const plan_writer *w, int fd, uint32_t section_count, plan_write_summary *summary,
                       const char *path, char *error, size_t error_size) {
    uint8_t header[PLAN_HEADER_SIZE + PLAN_SECTION_KIND_COUNT * PLAN_DIRECTORY_ENTRY_SIZE] = {0};
    size_t header_bytes = PLAN_HEADER_SIZE + (size_t)section_count * PLAN_DIRECTORY_ENTRY_SIZE;
    plan_sink sink = {.fd = fd};
    sink.buffer = malloc(PLAN_WRITE_BUFFER);
    sink.section_hash = XXH64_createState();
    sink.content_hash = XXH3_createState();
    if (!sink.buffer || !sink.section_hash || !sink.content_hash) {
        free(sink.buffer);
        XXH64_freeState(sink.section_hash);
        XXH3_freeState(sink.content_hash);
        return plan_error(error, error_size, path, "out of memory");
    }
    XXH3_128bits_reset(sink.content_hash);

    bool ok = sink_zeros(&sink, header_bytes) &&
              write_sections(w, &sink, header + PLAN_HEADER_SIZE, path, error, error_size);
    if (ok) {
        XXH128_hash_t hash = XXH3_128bits_digest(sink.content_hash);
        memcpy(header + PLAN_AT_MAGIC, PLAN_MAGIC, PLAN_MAGIC_SIZE);
        plan_put_u32(header + PLAN_AT_FORMAT_VERSION, PLAN_FORMAT_VERSION);
        plan_put_u32(header + PLAN_AT_SECTION_COUNT, section_count);
        memcpy(header + PLAN_AT_SMELT_VERSION, w->smelt_version, PLAN_SMELT_VERSION_SIZE);
        plan_put_u64(header + PLAN_AT_FILE_SIZE, sink.file_offset);
        plan_put_u64(header + PLAN_AT_CONTENT_HASH_LOW, hash.low64);
        plan_put_u64(header + PLAN_AT_CONTENT_HASH_HIGH, hash.high64);
        plan_put_u64(header + PLAN_AT_HEADER_CHECKSUM, XXH64(header, header_bytes, 0));
        int io_error = 0;
        ok = pwrite_all(fd, header, header_bytes, 0, &io_error);
        if (!ok) plan_error(error, error_size, path, "cannot write: %s", strerror(io_error));
        if (ok && summary) *summary = (plan_write_summary){sink.file_offset, hash.low64, hash.high64};
    } else if (sink.io_errno) {
        plan_error(error, error_size, path, "cannot write: %s", strerror(sink.io_errno));
    }
    free(sink.buffer);
    XXH64_freeState(sink.section_hash);
    XXH3_freeState(sink.content_hash);
    return ok;
}

/* ---- Interruption ---------------------------------------------------------
 *
 * SIGINT or SIGTERM while a plan is being written would leave the temporary
 * file behind (up to the plan's full size). While plan_write_file runs, a
 * handler unlinks it and then re-raises the signal under the disposition it
 * had before, so the process still ends (or its own handler still runs) as
 * it would have. Only async-signal-safe calls run in the handler: the path
 * sits in a static buffer, and one plan at a time is guarded (a second
 * concurrent writer, or a path too long for the buffer, is written without
 * the guard). A signal ignored before stays ignored. */

enum { PLAN_GUARD_PATH_MAX = 4096 };
static const int guarded_signals[] = {SIGINT, SIGTERM};
#define GUARDED_SIGNAL_COUNT (sizeof guarded_signals / sizeof guarded_signals[0])

static atomic_flag guard_taken = ATOMIC_FLAG_INIT;
static volatile sig_atomic_t guard_armed;
static char guard_path[PLAN_GUARD_PATH_MAX];
static struct sigaction guard_previous[GUARDED_SIGNAL_COUNT];
static bool guard_installed[GUARDED_SIGNAL_COUNT];

static void guard_handler(int signal_number) {
    int saved = errno;
    if (guard_armed) unlink(guard_path);
    guard_armed = 0;
    for (size_t i = 0; i < GUARDED_SIGNAL_COUNT; i++)
        if (guarded_signals[i] == signal_number) sigaction(signal_number, &guard_previous[i], NULL);
    errno = saved;
    raise(signal_number); /* delivered under the previous disposition once this returns */
}

/* Arms the guard for `temp`; false (nothing armed) when another writer holds it. */
static bool guard_arm(const char *temp) {
    if (strlen(temp) >= sizeof guard_path || atomic_flag_test_and_set(&guard_taken)) return false;
    memcpy(guard_path, temp, strlen(temp) + 1);
    guard_armed = 1;
    for (size_t i = 0; i < GUARDED_SIGNAL_COUNT; i++) {
        guard_installed[i] = false;
        if (sigaction(guarded_signals[i], NULL, &guard_previous[i]) != 0) continue;
        if (!(guard_previous[i].sa_flags & SA_SIGINFO) && guard_previous[i].sa_handler == SIG_IGN) continue;
        struct sigaction action = {0};
        action.sa_handler = guard_handler;
        sigemptyset(&action.sa_mask);
        for (size_t k = 0; k < GUARDED_SIGNAL_COUNT; k++)
            sigaddset(&action.sa_mask, guarded_signals[k]);
        guard_installed[i] = sigaction(guarded_signals[i], &action, NULL) == 0;
    }
    return true;
}

/* After the rename (or the unlink after a failure): the previous handlers
 * return. */
static void guard_disarm(void) {
    guard_armed = 0;
    for (size_t i = 0; i < GUARDED_SIGNAL_COUNT; i++)
        if (guard_installed[i]) sigaction(guarded_signals[i], &guard_previous[i], NULL);
    atomic_flag_clear(&guard_taken);
}

/* Test hook: SMELT_PLAN_WRITE_TEST_PAUSE=SECONDS waits that long once the
 * temporary is written, so that a test can interrupt the write
 * (tests/cli/compile_interrupted.test). */
static void test_pause(void) {
    const char *text = getenv("SMELT_PLAN_WRITE_TEST_PAUSE");
    unsigned seconds = text ? (unsigned)strtoul(text, NULL, 10) : 0;
    if (seconds > 0) sleep(seconds);
}

bool plan_write_file(const plan_writer *w, const char *path, plan_write_summary *summary, char *error,
                     size_t error_size) {
    uint32_t section_count = 0;
    for (int kind = 1; kind <= PLAN_SECTION_KIND_COUNT; kind++)
        section_count += w->sections[kind].present;

    if (w->out_of_memory) return plan_error(error, error_size, path, "out of memory");
    char *temp = NULL;
    /* SIGINT and SIGTERM wait (blocked) from before the temporary exists
     * until the guard that removes it is armed: one that came in between
     * would leave the temporary behind. */
    sigset_t guarded_set, previous_set;
    sigemptyset(&guarded_set);
    for (size_t i = 0; i < GUARDED_SIGNAL_COUNT; i++)
        sigaddset(&guarded_set, guarded_signals[i]);
    pthread_sigmask(SIG_BLOCK, &guarded_set, &previous_set);
    int fd = create_temp(path, &temp);
    if (fd < 0) {
        int saved = errno;
        pthread_sigmask(SIG_SETMASK, &previous_set, NULL);
        plan_error(error, error_size, path, "cannot create a temporary file '%s': %s", temp ? temp : "",
                   strerror(saved));
        free(temp);
        return false;
    }
    bool guarded = guard_arm(temp);
    pthread_sigmask(SIG_SETMASK, &previous_set, NULL); /* a signal that waited is handled now */
    bool ok = write_plan(w, fd, section_count, summary, path, error, error_size);
    if (ok && fsync(fd) != 0) ok = plan_error(error, error_size, path, "cannot sync: %s", strerror(errno));
    if (close(fd) != 0 && ok) ok = plan_error(error, error_size, path, "cannot write: %s", strerror(errno));
    if (ok) test_pause();
    if (ok && rename(temp, path) != 0)
        ok = plan_error(error, error_size, path, "cannot rename '%s' to it: %s", temp, strerror(errno));
    if (!ok) unlink(temp);
    /* Only now: a signal after the rename unlinks a name that no longer
     * exists, which is harmless; one before it must remove the temporary. */
    if (guarded) guard_disarm();
    free(temp);
    int io_error = 0;
    if (ok && !sync_folder(path, &io_error))
        ok = plan_error(error, error_size, path, "cannot sync its folder: %s", strerror(io_error));
    return ok;
}

/* ---- Kernel table encoding ---------------------------------------------- */

void plan_buffer_free(plan_buffer *b) {
    free(b->data);
    memset(b, 0, sizeof *b);
}

static void buffer_put(plan_buffer *b, const void *bytes, uint64_t size) {
    if (b->failed) return;
    uint64_t needed;
    if (__builtin_add_overflow(b->size, size, &needed) || needed > SIZE_MAX)
        PLAN_WRITE_DIE("plan buffer: size overflow");
    if (needed > b->capacity) {
        size_t capacity = b->capacity ? b->capacity : 4096;
        while (capacity < needed) {
            if (capacity > SIZE_MAX / 2) {
                capacity = (size_t)needed;
                break;
            }
            capacity *= 2;
        }
        uint8_t *grown = realloc(b->data, capacity);
        if (!grown) {
            b->failed = true;
            return;
        }
        b->data = grown;
        b->capacity = capacity;
    }
    if (size > 0) memcpy(b->data + b->size, bytes, (size_t)size);
    b->size = (size_t)needed;
}

static void put_u32(plan_buffer *b, uint32_t v) {
    uint8_t bytes[4];
    plan_put_u32(bytes, v);
    buffer_put(b, bytes, sizeof bytes);
}

static void put_u64(plan_buffer *b, uint64_t v) {
    uint8_t bytes[8];
    plan_put_u64(bytes, v);
    buffer_put(b, bytes, sizeof bytes);
}

static void put_i64(plan_buffer *b, int64_t v) {
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    put_u64(b, bits);
}

static void put_text(plan_buffer *b, plan_text text) {
    put_u64(b, text.length);
    buffer_put(b, text.data, text.length);
}

static void put_affine(plan_buffer *b, plan_affine rule, const plan_kernel *k) {
    if (rule.c < 1)
        PLAN_WRITE_DIE("kernel '%.*s': launch rule divides by %" PRId64,
                       (int)(k->name.length < 64 ? k->name.length : 64), k->name.data, rule.c);
    put_i64(b, rule.a);
    put_i64(b, rule.b);
    put_i64(b, rule.c);
}

void plan_kernels_encode(const plan_kernel *kernels, uint32_t count, plan_buffer *out) {
    put_u32(out, count);
    for (uint32_t i = 0; i < count; i++) {
        const plan_kernel *k = &kernels[i];
        if (k->name.length == 0) PLAN_WRITE_DIE("kernel %" PRIu32 " has no name", i);
        put_text(out, k->name);
        put_text(out, k->family);
        put_text(out, k->ops);
        put_text(out, k->source);
        for (int d = 0; d < 3; d++)
            put_affine(out, k->launch.grid[d], k);
        for (int d = 0; d < 3; d++)
            put_affine(out, k->launch.block[d], k);
        put_u64(out, k->launch.dynamic_shared_bytes);
        if (k->param_count > PLAN_MAX_KERNEL_PARAMS)
            PLAN_WRITE_DIE("kernel %" PRIu32 " has %" PRIu32 " parameters", i, k->param_count);
        put_u32(out, k->param_count);
        for (uint32_t p = 0; p < k->param_count; p++) {
            put_u32(out, k->params[p].kind);
            put_affine(out, k->params[p].extent, k);
            put_u32(out, k->params[p].writes);
        }
        put_u32(out, k->resource_count);
        for (uint32_t r = 0; r < k->resource_count; r++) {
            const plan_kernel_resources *res = &k->resources[r];
            put_text(out, res->arch);
            put_u32(out, res->registers);
            put_u64(out, res->shared_bytes);
            put_u64(out, res->stack_bytes);
            put_u64(out, res->spill_store_bytes);
            put_u64(out, res->spill_load_bytes);
        }
        put_u32(out, k->binary_count);
        for (uint32_t j = 0; j < k->binary_count; j++) {
            const plan_kernel_binary *bin = &k->binaries[j];
            if (bin->kind != PLAN_BINARY_CUBIN && bin->kind != PLAN_BINARY_PTX)
                PLAN_WRITE_DIE("kernel %" PRIu32 ": unknown binary kind %" PRIu32, i, bin->kind);
            put_text(out, bin->arch);
            put_u32(out, bin->kind);
            put_u64(out, bin->bytes.size);
            buffer_put(out, bin->bytes.data, bin->bytes.size);
        }
    }
}
