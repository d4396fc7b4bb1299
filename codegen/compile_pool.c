/* compile_pool.c - many NVRTC compiles (and other tasks) over a pthread
 * pool, identical jobs compiled once, the costliest first, results in job
 * order (see compile_pool.h).
 *
 * Jobs are grouped by their cache key (sorted, so a thousand jobs cost no
 * quadratic compare). Each group's first job is its representative. The
 * representatives and the caller's tasks are put in one list, costliest
 * first (at equal cost compiles before tasks, each in their own order: the
 * same inputs give the same order); workers take items from a shared counter, and when one finishes,
 * its whole group (or the one task) counts as done for the progress
 * callback, which runs on the calling thread. Afterwards every other job of
 * a group gets its own copy of the representative's result.
 */
#include "compile_pool.h"

#include "arena.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

enum {
    ERROR_BUFFER = 8192, /* one job's error message */
    MAX_THREADS = 256,
};

typedef struct keyed_job {
    cg_cache_key key;
    size_t job; /* index into the job list */
} keyed_job;

typedef struct unique_compile {
    size_t job;        /* the representative job */
    size_t group_size; /* jobs with the same key */
    cg_compile_result result;
} unique_compile;

/* One piece of work for a worker: a unique compile or a caller's task. */
typedef struct work_item {
    uint64_t cost;
    bool is_task;
    size_t index; /* into uniques, or the task's index */
} work_item;

typedef struct pool {
    const cg_compile_request *jobs;
    cg_cache *cache;
    const cg_cache_key *keys; /* per job */
    unique_compile *uniques;
    size_t unique_count;
    const cg_pool_tasks *tasks; /* NULL: none */
    work_item *items;           /* uniques and tasks, costliest first */
    size_t item_count;
    pthread_mutex_t lock; /* guards the fields below */
    pthread_cond_t progressed;
    size_t next_item; /* next one to take */
    size_t done;      /* jobs whose group has finished, and tasks run */
} pool;

/* The allocation helpers are always inlined, so that each call site is a
 * site of its own to the fault-injection sweep (tools/faultsweep.sh --cuda),
 * which fails the first allocation at each return address. */
#define ALWAYS_INLINE __attribute__((always_inline))

/* A job that could not allocate gets this as its error (not malloc'd:
 * cg_compile_results_free knows it). */
static char out_of_memory_message[] = "out of memory";

/* Out of memory is a status, never an abort: the workers have no arena
 * recovery point (arena.h), so this returns NULL and callers report it. A
 * size that overflows is out of memory too (no real count gets there). */
static inline ALWAYS_INLINE void *allocate(size_t count, size_t size) {
    uint64_t bytes;
    if (size_mul_overflow(count, size, &bytes) || bytes > SIZE_MAX) return NULL;
    return malloc(bytes ? (size_t)bytes : 1);
}

/* A copy of s (NULL for NULL); *ok is cleared when out of memory. */
static inline ALWAYS_INLINE char *copy_string(const char *s, bool *ok) {
    if (!s) return NULL;
    size_t n = strlen(s);
    char *p = allocate(n + 1, 1);
    if (!p) {
        *ok = false;
        return NULL;
    }
    memcpy(p, s, n + 1);
    return p;
}

static int compare_keyed(const void *a, const void *b) {
    const keyed_job *x = a, *y = b;
    int c = memcmp(x->key.bytes, y->key.bytes, sizeof x->key.bytes);
    if (c) return c;
    return x->job < y->job ? -1 : x->job > y->job;
}

static void compile_one(pool *p, unique_compile *u) {
    /* An unusable key means hashing this job ran out of memory; every job
     * with that key did (so grouping them together is right). */
    char *error = cg_cache_key_usable(&p->keys[u->job]) ? allocate(ERROR_BUFFER, 1) : NULL;
    if (!error) {
        u->result.ok = false;
        u->result.error = out_of_memory_message;
        return;
    }
    error[0] = '\0';
    u->result.ok =
        cg_compile_kernel_cached_with_key(p->cache, &p->jobs[u->job], &p->keys[u->job], &u->result.compiled,
                                          &u->result.from_cache, error, ERROR_BUFFER);
    if (u->result.ok) {
        free(error);
    } else {
        u->result.error = error;
    }
}

static void *worker(void *arg) {
    pool *p = arg;
    for (;;) {
        pthread_mutex_lock(&p->lock);
        size_t index = p->next_item < p->item_count ? p->next_item++ : SIZE_MAX;
        pthread_mutex_unlock(&p->lock);
        if (index == SIZE_MAX) return NULL;
        const work_item *item = &p->items[index];
        size_t finished = 1;
        if (item->is_task) {
            p->tasks->run(p->tasks->context, item->index);
        } else {
            unique_compile *u = &p->uniques[item->index];
            compile_one(p, u);
            finished = u->group_size;
        }
        pthread_mutex_lock(&p->lock);
        p->done += finished;
        pthread_cond_signal(&p->progressed);
        pthread_mutex_unlock(&p->lock);
    }
}

/* Per source byte and fixed, in microseconds: fitted to NVRTC 13.0 on the
 * generated kernels of Llama-3-8B (a 1 KB elementwise kernel ~40 ms, the
 * 13 KB prefill attention ~700 ms per arch). */
enum { NVRTC_FIXED_COST = 30000, NVRTC_COST_PER_BYTE = 50 };

uint64_t cg_compile_cost_estimate(const cg_compile_request *req) {
    uint64_t bytes = req->source ? strlen(req->source) : 0;
    return NVRTC_FIXED_COST + NVRTC_COST_PER_BYTE * bytes;
}

static int compare_items(const void *a, const void *b) {
    const work_item *x = a, *y = b;
    if (x->cost != y->cost) return x->cost > y->cost ? -1 : 1;
    if (x->is_task != y->is_task) return x->is_task ? 1 : -1;
    return x->index < y->index ? -1 : x->index > y->index;
}

/* The work list, costliest first; false when out of memory. */
static bool order_work(pool *p) {
    size_t task_count = p->tasks ? p->tasks->count : 0;
    p->item_count = p->unique_count + task_count;
    p->items = allocate(p->item_count, sizeof *p->items);
    if (!p->items) return false;
    for (size_t i = 0; i < p->unique_count; i++)
        p->items[i] = (work_item){cg_compile_cost_estimate(&p->jobs[p->uniques[i].job]), false, i};
    for (size_t i = 0; i < task_count; i++)
        p->items[p->unique_count + i] = (work_item){p->tasks->cost(p->tasks->context, i), true, i};
    qsort(p->items, p->item_count, sizeof *p->items, compare_items);
    return true;
}

/* A deep copy of a successful compile (resources re-parsed from the log);
 * false (and *to empty) when out of memory. */
static bool copy_compiled(const cg_compiled *from, cg_compiled *to) {
    memset(to, 0, sizeof *to);
    bool ok = true;
    if (from->cubin) {
        to->cubin = allocate(from->cubin_size, 1);
        ok = to->cubin != NULL;
        if (ok) {
            memcpy(to->cubin, from->cubin, from->cubin_size);
            to->cubin_size = from->cubin_size;
        }
    }
    to->ptx = copy_string(from->ptx, &ok);
    to->ptx_size = from->ptx_size;
    to->log = copy_string(from->log, &ok);
    ok = ok && cg_parse_ptxas_log(to->log, &to->resources);
    if (!ok) cg_compiled_free(to);
    return ok;
}

static unsigned worker_count(unsigned threads, size_t item_count) {
    if (threads == 0) {
        long online = sysconf(_SC_NPROCESSORS_ONLN);
        threads = online > 0 ? (unsigned)online : 1;
    }
    if (threads > MAX_THREADS) threads = MAX_THREADS;
    if (threads > item_count) threads = (unsigned)item_count;
    return threads;
}

/* Groups jobs by key: fills p->keys and p->uniques; group_of[job] = unique
 * index. False when out of memory (p->uniques is then NULL). */
static bool group_jobs(pool *p, size_t count, cg_cache_key *keys, size_t *group_of) {
    keyed_job *sorted = allocate(count, sizeof *sorted);
    p->uniques = allocate(count, sizeof *p->uniques);
    if (!sorted || !p->uniques) {
        free(sorted);
        free(p->uniques);
        p->uniques = NULL;
        return false;
    }
    for (size_t i = 0; i < count; i++) {
        keys[i] = cg_kernel_cache_key(&p->jobs[i]);
        sorted[i] = (keyed_job){keys[i], i};
    }
    qsort(sorted, count, sizeof *sorted, compare_keyed);
    p->unique_count = 0;
    for (size_t i = 0; i < count; i++) {
        bool same =
            i > 0 && memcmp(sorted[i].key.bytes, sorted[i - 1].key.bytes, sizeof sorted[i].key.bytes) == 0;
        if (!same) {
            unique_compile *u = &p->uniques[p->unique_count++];
            memset(u, 0, sizeof *u);
            u->job = sorted[i].job; /* the lowest index of its group: sort ties by index */
        }
        p->uniques[p->unique_count - 1].group_size++;
        group_of[sorted[i].job] = p->unique_count - 1;
    }
    free(sorted);
    return true;
}

bool cg_compile_all_with_tasks(const cg_compile_request *jobs, size_t count, const cg_pool_tasks *tasks,
                               unsigned threads, cg_cache *cache, cg_compile_result *results,
                               cg_progress_fn progress, void *progress_user, size_t *failed_out, char *error,
                               size_t error_size) {
    *failed_out = 0;
    size_t total = count + (tasks ? tasks->count : 0); /* no overflow: both are in memory */
    if (total == 0) return true;
    if (count) memset(results, 0, count * sizeof *results);
    cg_cache_key *keys = allocate(count, sizeof *keys);
    size_t *group_of = allocate(count, sizeof *group_of);
    pool p = {.jobs = jobs, .cache = cache, .keys = keys, .tasks = tasks && tasks->count ? tasks : NULL};
    pthread_t *workers = NULL;
    unsigned wanted = 0;
    bool set_up = keys && group_of && group_jobs(&p, count, keys, group_of) && order_work(&p);
    if (set_up) {
        wanted = worker_count(threads, p.item_count);
        workers = allocate(wanted, sizeof *workers);
        set_up = workers != NULL;
    }
    if (!set_up) {
        free(p.items);
        free(p.uniques);
        free(group_of);
        free(keys);
        if (error && error_size) snprintf(error, error_size, "out of memory");
        return false;
    }
    pthread_mutex_init(&p.lock, NULL);
    pthread_cond_init(&p.progressed, NULL);

    unsigned started = 0;
    while (started < wanted && pthread_create(&workers[started], NULL, worker, &p) == 0)
        started++;
    if (started == 0) worker(&p); /* no threads to be had: compile here, in order */

    /* Report progress from this thread until every job is done. */
    size_t reported = 0;
    pthread_mutex_lock(&p.lock);
    while (reported < total) {
        while (p.done == reported)
            pthread_cond_wait(&p.progressed, &p.lock);
        reported = p.done;
        pthread_mutex_unlock(&p.lock);
        if (progress) progress(reported, total, progress_user);
        pthread_mutex_lock(&p.lock);
    }
    pthread_mutex_unlock(&p.lock);
    for (unsigned i = 0; i < started; i++)
        pthread_join(workers[i], NULL);
    free(workers);

    /* Hand results out in job order: copies first, then the original. */
    size_t failed = 0;
    for (size_t i = 0; i < count; i++) {
        unique_compile *u = &p.uniques[group_of[i]];
        if (u->job == i) continue;
        cg_compile_result *r = &results[i];
        r->ok = u->result.ok;
        r->from_cache = u->result.from_cache;
        r->deduplicated = true;
        bool copied = true;
        if (r->ok)
            copied = copy_compiled(&u->result.compiled, &r->compiled);
        else if (u->result.error != out_of_memory_message)
            r->error = copy_string(u->result.error, &copied);
        if (!copied || u->result.error == out_of_memory_message) {
            r->ok = false;
            r->error = out_of_memory_message;
        }
    }
    for (size_t i = 0; i < p.unique_count; i++)
        results[p.uniques[i].job] = p.uniques[i].result;
    for (size_t i = 0; i < count; i++)
        failed += !results[i].ok;

    pthread_cond_destroy(&p.progressed);
    pthread_mutex_destroy(&p.lock);
    free(p.items);
    free(p.uniques);
    free(group_of);
    free(keys);
    *failed_out = failed;
    return true;
}

bool cg_compile_all(const cg_compile_request *jobs, size_t count, unsigned threads, cg_cache *cache,
                    cg_compile_result *results, cg_progress_fn progress, void *progress_user, size_t *failed,
                    char *error, size_t error_size) {
    return cg_compile_all_with_tasks(jobs, count, NULL, threads, cache, results, progress, progress_user,
                                     failed, error, error_size);
}

void cg_compile_results_free(cg_compile_result *results, size_t count) {
    for (size_t i = 0; i < count; i++) {
        cg_compiled_free(&results[i].compiled);
        if (results[i].error != out_of_memory_message) free(results[i].error);
        memset(&results[i], 0, sizeof results[i]);
    }
}
