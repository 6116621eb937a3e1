/* core/cpu/device_cpu.c: the CPU backend of core/device.h.
 *
 * Memory of every kind is ordinary host memory, 64-byte aligned. The compute stream runs
 * each operation on the calling thread as it is enqueued (the kernels parallelise with
 * OpenMP themselves). Every other stream owns one worker thread that runs its queue in
 * FIFO order (core/host_queue.h), so two streams really do run concurrently and a
 * missing event wait is a real data race that ThreadSanitizer sees.
 *
 * An event is a pair of generation counters under a mutex: recording it on a stream
 * takes the next generation g at enqueue time and the marker completes g when the
 * stream reaches it; a wait captures the newest recorded generation at enqueue time and
 * blocks until that one has completed. Markers complete in order within a stream, so
 * "completed >= target" is exact for the usual one-stream-per-event use; if an event is
 * re-recorded on a second stream while an older record is still pending elsewhere, a
 * waiter may be released by the newer record, as the newest record is the one that
 * counts. */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <sys/mman.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/common.h"
#include "core/device.h"
#include "core/host_queue.h"
#include "core/kernels.h"

#define CPU_ALIGN 64
#define CPU_PINNED_ALIGN 4096
/* Every allocation carries a header of one alignment unit recording its size and kind,
 * so free() can keep the counters exact and catch a free with the wrong kind. */
#define CPU_MAGIC 0x53545241u /* "STRA" */

typedef struct cpu_alloc_header {
    size_t bytes;
    uint32_t magic;
    uint32_t kind;
} cpu_alloc_header;
_Static_assert(sizeof(cpu_alloc_header) <= CPU_ALIGN, "allocation header fits one alignment unit");

typedef enum cpu_task_type {
    TASK_MEMCPY,
    TASK_MEMSET,
    TASK_HOST_FN,
    TASK_RECORD,
    TASK_WAIT,
} cpu_task_type;

typedef struct cpu_task {
    cpu_task_type type;
    void *dst;
    const void *src;
    size_t bytes;
    int value;
    void (*fn)(void *arg);
    void *arg;
    strata_event *event;
    uint64_t generation;
} cpu_task;

struct strata_stream {
    strata_device *d;
    char name[64];
    strata_stream_kind kind;
    int is_inline;         /* the compute stream: no worker, runs on the caller */
    strata_host_queue q;   /* every other stream: its worker thread (core/host_queue.h) */

    strata_stream *next_in_device; /* the device's list, for sync_all */
};

struct strata_event {
    strata_device *d;
    pthread_mutex_t mu;
    pthread_cond_t cv;
    uint64_t recorded;  /* generations handed out by event_record */
    uint64_t completed; /* newest generation whose marker was reached */
    double completed_ms; /* when it was reached (strata_now_ms), for event_elapsed_ms */
    char recorded_on[64]; /* the stream of the newest record, for a long wait's report */
    int refs;           /* the owner plus each queued task naming this event */
};

typedef struct cpu_device {
    pthread_mutex_t streams_mu;
    strata_stream *streams; /* every stream, compute included */
} cpu_device;

/* ---- events ---- */

static void event_unref(strata_event *e) {
    pthread_mutex_lock(&e->mu);
    int left = --e->refs;
    pthread_mutex_unlock(&e->mu);
    if (left == 0) {
        pthread_cond_destroy(&e->cv);
        pthread_mutex_destroy(&e->mu);
        free(e);
    }
}

static void event_complete(strata_event *e, uint64_t generation) {
    pthread_mutex_lock(&e->mu);
    if (e->completed < generation) {
        e->completed = generation;
        e->completed_ms = strata_now_ms();
    }
    pthread_cond_broadcast(&e->cv);
    pthread_mutex_unlock(&e->mu);
}

/* A wait that has gone on for long (core/common.h, strata_long_wait): what this thread
 * waits for, and where every stream's queue stands. */
static void report_long_wait(strata_device *d, const char *what, double waited) {
    cpu_device *cd = d->impl;
    char me[32], streams[1024];
    size_t n = 0;
    streams[0] = 0;
    pthread_mutex_lock(&cd->streams_mu);
    for (strata_stream *s = cd->streams; s && n < sizeof streams - 1; s = s->next_in_device) {
        if (s->is_inline) {
            n += snprintf(streams + n, sizeof streams - n, "%s\"%s\" (runs on its caller)", n ? ", " : "", s->name);
            continue;
        }
        uint64_t done, running, queued;
        strata_host_queue_progress(&s->q, &done, &running, &queued);
        n += snprintf(streams + n, sizeof streams - n, "%s\"%s\" %llu tasks done, %llu running, %llu queued",
                      n ? ", " : "", s->name, (unsigned long long)done, (unsigned long long)running,
                      (unsigned long long)queued);
    }
    pthread_mutex_unlock(&cd->streams_mu);
    STRATA_WARN("device", "thread \"%s\" has waited %.0f s for %s; streams: %s", strata_thread_name(me, sizeof me),
                waited, what, streams);
}

typedef struct event_wait {
    strata_event *e;
    uint64_t target;
} event_wait;

static int event_reached(void *arg) {
    event_wait *w = arg;
    return w->e->completed >= w->target;
}

static void event_report(void *arg, double waited) {
    event_wait *w = arg;
    char what[160];
    pthread_mutex_lock(&w->e->mu);
    snprintf(what, sizeof what, "the record of an event on stream \"%s\" (record %llu, reached %llu)",
             w->e->recorded_on, (unsigned long long)w->target, (unsigned long long)w->e->completed);
    pthread_mutex_unlock(&w->e->mu);
    report_long_wait(w->e->d, what, waited);
}

static void event_wait_generation(strata_event *e, uint64_t target) {
    pthread_mutex_lock(&e->mu);
    event_wait w = {e, target};
    strata_cond_wait_reporting(&e->cv, &e->mu, event_reached, event_report, &w);
    pthread_mutex_unlock(&e->mu);
}

/* ---- running tasks ---- */

static void task_run(const cpu_task *t) {
    switch (t->type) {
    case TASK_MEMCPY:
        if (t->bytes && t->dst != t->src) memmove(t->dst, t->src, t->bytes);
        break;
    case TASK_MEMSET:
        if (t->bytes) memset(t->dst, t->value, t->bytes);
        break;
    case TASK_HOST_FN:
        t->fn(t->arg);
        break;
    case TASK_RECORD:
        event_complete(t->event, t->generation);
        event_unref(t->event);
        break;
    case TASK_WAIT:
        event_wait_generation(t->event, t->generation);
        event_unref(t->event);
        break;
    }
}

static void queue_run(void *owner, void *task) { task_run(task); }

/* Runs the task now on the compute stream, queues it on a worker stream. */
static int stream_submit(strata_stream *s, cpu_task *t) {
    if (s->is_inline) {
        task_run(t);
        return 0;
    }
    return strata_host_queue_push(&s->q, t, NULL);
}

/* ---- memory ---- */

/* Large buffers (activations, weights, gradients, optimizer state) ask for transparent
 * huge pages, which Debian's default (madvise) gives only on request: the matrix products
 * stream them, and with 4 KiB pages a training step of the Llama bench spent about 1% more
 * (bench/bench_cpu_llama.sh). Only the whole 2 MiB pages inside the buffer are advised, so
 * its neighbours on the heap keep their pages; a kernel without THP ignores the advice. */
#define HUGE_PAGE ((uintptr_t)2 << 20)

static void advise_huge_pages(unsigned char *p, size_t bytes) {
#ifdef MADV_HUGEPAGE
    if (bytes < 2 * HUGE_PAGE) return;
    uintptr_t lo = ((uintptr_t)p + HUGE_PAGE - 1) & ~(HUGE_PAGE - 1);
    uintptr_t hi = ((uintptr_t)p + bytes) & ~(HUGE_PAGE - 1);
    if (hi > lo) (void)madvise((void *)lo, hi - lo, MADV_HUGEPAGE);
#else
    (void)p, (void)bytes;
#endif
}

static void *cpu_alloc(strata_device *d, strata_mem_kind kind, size_t bytes) {
    if (kind < 0 || kind >= STRATA_MEM_KINDS) {
        strata_fail("cpu alloc of %zu bytes: memory kind %d is not one of device, pinned, host",
                    bytes, (int)kind);
        return NULL;
    }
    if (bytes > (size_t)-1 - 2 * CPU_ALIGN) {
        strata_fail("cpu alloc of %zu bytes: the size overflows", bytes);
        return NULL;
    }
    /* pinned memory is page-aligned, as cudaHostAlloc's is (O_DIRECT I/O needs it) */
    size_t align = kind == STRATA_MEM_PINNED ? CPU_PINNED_ALIGN : CPU_ALIGN;
    size_t body = strata_round_up(bytes ? bytes : 1, align);
    unsigned char *base = aligned_alloc(align, body + align);
    if (!base) {
        char want[32];
        strata_fail("cpu alloc of %s (kind %d) failed: out of host memory",
                    strata_fmt_bytes(want, sizeof want, (double)bytes), (int)kind);
        return NULL;
    }
    advise_huge_pages(base + align, body);
    cpu_alloc_header *h = (cpu_alloc_header *)base;
    h->bytes = bytes;
    h->magic = CPU_MAGIC;
    h->kind = (uint32_t)kind;
    strata_mem_count_alloc(d, kind, bytes);
    return base + align;
}

static void cpu_free(strata_device *d, strata_mem_kind kind, void *p) {
    if (!p) return;
    unsigned char *base = (unsigned char *)p - (kind == STRATA_MEM_PINNED ? CPU_PINNED_ALIGN : CPU_ALIGN);
    cpu_alloc_header *h = (cpu_alloc_header *)base;
    if (h->magic != CPU_MAGIC)
        strata_panic(__FILE__, __LINE__, "cpu free of %p: not a live allocation of this device", p);
    if (h->kind != (uint32_t)kind)
        strata_panic(__FILE__, __LINE__, "cpu free of %p: allocated as kind %u, freed as kind %d",
                     p, h->kind, (int)kind);
    strata_mem_count_free(d, kind, h->bytes);
    h->magic = 0; /* a second free of the same pointer panics instead of corrupting */
    free(base);
}

/* ---- streams ---- */

static strata_stream *stream_new(strata_device *d, const char *name, strata_stream_kind kind,
                                 int is_inline) {
    strata_stream *s = strata_xcalloc(1, sizeof *s);
    s->d = d;
    snprintf(s->name, sizeof s->name, "%s", name ? name : "unnamed");
    s->kind = kind;
    s->is_inline = is_inline;
    if (!is_inline && strata_host_queue_start(&s->q, s->name, sizeof(cpu_task), queue_run, s)) {
        free(s);
        return NULL;
    }
    cpu_device *cd = d->impl;
    pthread_mutex_lock(&cd->streams_mu);
    s->next_in_device = cd->streams;
    cd->streams = s;
    pthread_mutex_unlock(&cd->streams_mu);
    return s;
}

static strata_stream *cpu_stream_create(strata_device *d, const char *name, strata_stream_kind kind) {
    if (kind != STRATA_STREAM_DEVICE && kind != STRATA_STREAM_HOST) {
        strata_fail("stream \"%s\": kind %d is neither device nor host", name ? name : "unnamed",
                    (int)kind);
        return NULL;
    }
    return stream_new(d, name, kind, 0);
}

static int cpu_stream_sync(strata_stream *s) {
    if (!s) return strata_fail("stream sync: stream is NULL");
    if (!s->is_inline) strata_host_queue_sync(&s->q);
    return 0;
}

static void cpu_stream_destroy(strata_stream *s) {
    cpu_device *cd = s->d->impl;
    pthread_mutex_lock(&cd->streams_mu);
    for (strata_stream **p = &cd->streams; *p; p = &(*p)->next_in_device) {
        if (*p == s) {
            *p = s->next_in_device;
            break;
        }
    }
    pthread_mutex_unlock(&cd->streams_mu);
    if (!s->is_inline) strata_host_queue_stop(&s->q); /* drains what is queued first */
    free(s);
}

static int cpu_memcpy_async(strata_stream *s, void *dst, const void *src, size_t bytes) {
    if (!s) return strata_fail("memcpy of %zu bytes: stream is NULL", bytes);
    if (bytes && (!dst || !src))
        return strata_fail("memcpy of %zu bytes on stream \"%s\": NULL %s", bytes, s->name,
                           dst ? "source" : "destination");
    cpu_task t = {.type = TASK_MEMCPY, .dst = dst, .src = src, .bytes = bytes};
    return stream_submit(s, &t);
}

static int cpu_memset_async(strata_stream *s, void *dst, int value, size_t bytes) {
    if (!s) return strata_fail("memset of %zu bytes: stream is NULL", bytes);
    if (bytes && !dst)
        return strata_fail("memset of %zu bytes on stream \"%s\": NULL destination", bytes, s->name);
    cpu_task t = {.type = TASK_MEMSET, .dst = dst, .value = value, .bytes = bytes};
    return stream_submit(s, &t);
}

static int cpu_host_task(strata_stream *s, void (*fn)(void *arg), void *arg) {
    if (!s) return strata_fail("host task: stream is NULL");
    if (!fn) return strata_fail("host task on stream \"%s\": function is NULL", s->name);
    cpu_task t = {.type = TASK_HOST_FN, .fn = fn, .arg = arg};
    return stream_submit(s, &t);
}

/* ---- events ---- */

static strata_event *cpu_event_create(strata_device *d) {
    strata_event *e = strata_xcalloc(1, sizeof *e);
    e->d = d;
    e->refs = 1;
    pthread_mutex_init(&e->mu, NULL);
    pthread_cond_init(&e->cv, NULL);
    return e;
}

/* Tasks still queued keep the event alive; the last of them frees it, as CUDA lets an
 * event be destroyed while its record is pending. */
static void cpu_event_destroy(strata_event *e) { event_unref(e); }

static int cpu_event_record(strata_event *e, strata_stream *s) {
    if (!e || !s) return strata_fail("event record: %s is NULL", e ? "stream" : "event");
    pthread_mutex_lock(&e->mu);
    uint64_t g = ++e->recorded;
    e->refs++;
    snprintf(e->recorded_on, sizeof e->recorded_on, "%s", s->name);
    pthread_mutex_unlock(&e->mu);
    cpu_task t = {.type = TASK_RECORD, .event = e, .generation = g};
    if (stream_submit(s, &t)) {
        /* Nothing will ever complete g: complete it here so waiters do not hang. */
        event_complete(e, g);
        event_unref(e);
        return -1;
    }
    return 0;
}

static int cpu_stream_wait_event(strata_stream *s, strata_event *e) {
    if (!e || !s) return strata_fail("stream wait: %s is NULL", e ? "stream" : "event");
    pthread_mutex_lock(&e->mu);
    uint64_t target = e->recorded;
    int done = e->completed >= target; /* also true for a never-recorded event */
    if (!done) e->refs++;
    pthread_mutex_unlock(&e->mu);
    if (done) return 0;
    cpu_task t = {.type = TASK_WAIT, .event = e, .generation = target};
    if (stream_submit(s, &t)) {
        event_unref(e);
        return -1;
    }
    return 0;
}

static int cpu_event_sync(strata_event *e) {
    if (!e) return strata_fail("event sync: event is NULL");
    pthread_mutex_lock(&e->mu);
    uint64_t target = e->recorded;
    pthread_mutex_unlock(&e->mu);
    event_wait_generation(e, target);
    return 0;
}

/* Every event keeps its time here: a clock read per record costs next to nothing. */
static strata_event *cpu_event_create_timed(strata_device *d) { return cpu_event_create(d); }

static int cpu_event_elapsed_ms(strata_event *a, strata_event *b, double *ms) {
    if (!a || !b) return strata_fail("event elapsed: event is NULL");
    double t[2];
    strata_event *ev[2] = {a, b};
    for (int i = 0; i < 2; i++) {
        pthread_mutex_lock(&ev[i]->mu);
        int ready = ev[i]->recorded > 0 && ev[i]->completed >= ev[i]->recorded;
        t[i] = ev[i]->completed_ms;
        pthread_mutex_unlock(&ev[i]->mu);
        if (!ready) return strata_fail("event elapsed: the %s event %s", i ? "second" : "first",
                                       ev[i]->recorded ? "is still pending" : "was never recorded");
    }
    *ms = t[1] - t[0];
    return 0;
}

static int cpu_event_query(strata_event *e) {
    if (!e) return strata_fail("event query: event is NULL");
    pthread_mutex_lock(&e->mu);
    int complete = e->completed >= e->recorded;
    pthread_mutex_unlock(&e->mu);
    return complete;
}

/* ---- device ---- */

/* Free host memory: MemAvailable counts reclaimable page cache, which is what a large
 * allocation can really get; sysconf's free pages are the fallback. */
static int cpu_mem_info(strata_device *d, size_t *free_bytes, size_t *total_bytes) {
    long page = sysconf(_SC_PAGESIZE);
    long total_pages = sysconf(_SC_PHYS_PAGES);
    if (page <= 0 || total_pages <= 0) return strata_fail("cpu mem_info: sysconf cannot tell the RAM size");
    size_t total = (size_t)page * (size_t)total_pages, avail = 0;
    int found = 0;
    FILE *f = fopen("/proc/meminfo", "r");
    if (f) {
        char line[256];
        unsigned long long kib;
        while (fgets(line, sizeof line, f)) {
            if (sscanf(line, "MemAvailable: %llu kB", &kib) == 1) {
                avail = (size_t)kib * 1024;
                found = 1;
                break;
            }
        }
        fclose(f);
    }
    if (!found) {
        long avail_pages = sysconf(_SC_AVPHYS_PAGES);
        avail = avail_pages > 0 ? (size_t)page * (size_t)avail_pages : 0;
    }
    if (free_bytes) *free_bytes = avail < total ? avail : total;
    if (total_bytes) *total_bytes = total;
    return 0;
}

static int cpu_sync_all(strata_device *d) {
    cpu_device *cd = d->impl;
    /* Snapshot the list so a worker's host task may create streams without deadlock;
     * streams are destroyed only by their owner, never during sync_all. */
    pthread_mutex_lock(&cd->streams_mu);
    size_t n = 0;
    for (strata_stream *s = cd->streams; s; s = s->next_in_device) n++;
    strata_stream **list = strata_xmalloc((n ? n : 1) * sizeof *list);
    n = 0;
    for (strata_stream *s = cd->streams; s; s = s->next_in_device) list[n++] = s;
    pthread_mutex_unlock(&cd->streams_mu);
    for (size_t i = 0; i < n; i++) cpu_stream_sync(list[i]);
    free(list);
    return 0;
}

static void cpu_destroy(strata_device *d) {
    cpu_device *cd = d->impl;
    STRATA_IGNORE(cpu_sync_all(d)); /* closing goes on: the streams are torn down below */
    for (;;) {
        pthread_mutex_lock(&cd->streams_mu);
        strata_stream *s = cd->streams;
        pthread_mutex_unlock(&cd->streams_mu);
        if (!s) break;
        if (s != d->compute)
            STRATA_WARN("device", "cpu device closed with stream \"%s\" still open", s->name);
        cpu_stream_destroy(s);
    }
    for (int k = 0; k < STRATA_MEM_KINDS; k++) {
        if (d->mem[k].live_bytes)
            STRATA_WARN("device", "cpu device closed with %zu bytes of kind %d still allocated",
                        d->mem[k].live_bytes, k);
    }
    pthread_mutex_destroy(&cd->streams_mu);
    free(cd);
    free(d);
}

static const char *cpu_stream_name(const strata_stream *s) { return s->name; }

static const strata_device_ops cpu_ops = {
    .name = "cpu",
    .destroy = cpu_destroy,
    .alloc = cpu_alloc,
    .free = cpu_free,
    .stream_create = cpu_stream_create,
    .stream_destroy = cpu_stream_destroy,
    .stream_sync = cpu_stream_sync,
    .memcpy_async = cpu_memcpy_async,
    .memset_async = cpu_memset_async,
    .host_task = cpu_host_task,
    .event_create = cpu_event_create,
    .event_destroy = cpu_event_destroy,
    .event_record = cpu_event_record,
    .stream_wait_event = cpu_stream_wait_event,
    .event_sync = cpu_event_sync,
    .event_query = cpu_event_query,
    .event_create_timed = cpu_event_create_timed,
    .event_elapsed_ms = cpu_event_elapsed_ms,
    .mem_info = cpu_mem_info,
    .sync_all = cpu_sync_all,
    .stream_name = cpu_stream_name,
};

strata_device *strata_device_cpu_open(void) {
    strata_device *d = strata_xcalloc(1, sizeof *d);
    cpu_device *cd = strata_xcalloc(1, sizeof *cd);
    pthread_mutex_init(&cd->streams_mu, NULL);
    d->ops = &cpu_ops;
    d->impl = cd;
    d->k = &strata_kernels_cpu;
    d->caps = (strata_device_caps){.host_memory = 1, .gpu = 0};
    d->compute_dtype = STRATA_F32;
    d->ordinal = 0;
#ifdef _OPENMP
    int threads = omp_get_max_threads();
#else
    int threads = (int)sysconf(_SC_NPROCESSORS_ONLN);
#endif
    snprintf(d->description, sizeof d->description, "cpu (%d thread%s)", threads,
             threads == 1 ? "" : "s");
    d->compute = stream_new(d, "compute", STRATA_STREAM_DEVICE, 1);
    return d;
}
