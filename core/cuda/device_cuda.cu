/* core/cuda/device_cuda.cu: the CUDA backend of core/device.h.
 *
 * Memory: DEVICE is cudaMalloc, PINNED is cudaHostAlloc, HOST is plain malloc. Every
 * allocation is recorded in a pointer -> (bytes, kind) table so free() keeps the
 * counters exact and catches a free with the wrong kind. The cuBLASLt workspace and the
 * event slots below are fixed costs of the backend, made at open and not counted, so a
 * freshly opened device reports zero live bytes as the CPU backend does.
 *
 * Streams: a DEVICE stream is a non-blocking cudaStream_t (the compute stream is made at
 * open). A HOST stream is a worker thread running a FIFO of host functions, copies and
 * memsets (core/host_queue.h, as on the CPU backend); a copy or memset that touches
 * device memory is done by the worker on a private cudaStream_t it synchronises before
 * going on.
 *
 * Events work across both kinds through per-stream progress slots. Each stream owns one
 * 32-bit slot in pinned, device-mapped memory and hands out tickets 1, 2, 3, ... to the
 * records made on it; a record enqueues "slot = ticket", so a slot only grows and
 * "slot >= ticket" (compared cyclically, so wrap-around is harmless) says exactly
 * whether that record has been reached. An event remembers the (kind, slot, ticket) of
 * its newest record, which is the snapshot a later wait captures (as cudaStreamWaitEvent
 * captures the event's state when it is called; re-recording the event afterwards does
 * not change what an earlier wait waits for).
 *  - record on a DEVICE stream: cudaEventRecord, then cuStreamWriteValue32 of the ticket
 *    (the write carries a system-scope fence, so the host that sees it sees the work);
 *  - record on a HOST stream: a queued marker that stores the ticket and wakes waiters;
 *  - DEVICE stream waits on a DEVICE record: cudaStreamWaitEvent (native, cheapest);
 *  - DEVICE stream waits on a HOST record not yet reached: by default the calling
 *    thread waits for the record before it enqueues anything more. That cannot deadlock:
 *    a HOST record takes its ticket when enqueued and every wait captures records made
 *    before it, so a record depends only on work already enqueued, never on what the
 *    waiting thread would enqueue next. It costs the thread its lookahead, not the GPU
 *    its ordering. The first GPU runs that made devices wait on the GPU side instead
 *    (cuStreamWaitValue32, below) hung at ZeRO stage 2, the one path that used it, so
 *    that path is now opt-in (STRATA_CUDA_DEVICE_WAITS=1) until a GPU run proves it.
 *    With it: cuStreamWaitValue32(slot >= ticket), chosen over a cudaLaunchHostFunc that
 *    blocks until the ticket arrives: a blocked host function holds CUDA's callback
 *    thread (every stream's host functions wait behind it), costs a callback round trip
 *    even when the wait is short, and, tried on an H100 (driver 580), it left the
 *    enqueueing thread's next CUDA calls stuck behind it;
 *  - HOST stream (or event_sync/query on the host) waits on either: reads the slot
 *    (a condition variable for host markers, a polling loop with backoff for device
 *    writes, which raise no host signal).
 * Where the driver lacks stream memory operations (or STRATA_CUDA_MEMOPS=0 asks for it),
 * both are one-thread kernels: one stores the ticket, the other polls the slot through
 * the mapped pointer (sleeping between reads) and so holds one block's worth of one SM
 * while it waits, but never the CUDA API.
 * As with any wait enqueued on a GPU stream, a wait on a host record occupies its
 * hardware queue until satisfied; more CUDA streams than CUDA_DEVICE_MAX_CONNECTIONS
 * (default 8) can share a queue, so keep a process's streams within that number. */
#include <cuda.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/cuda/cuda_common.h"

extern "C" {
#include "core/host_queue.h"
}

#define SLOT_MAX 256   /* streams alive at once on one device */
#define SLOT_STRIDE 16 /* uint32 per slot: one 64-byte line each, no false sharing */

typedef CUresult (*wait_value_fn)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);
typedef CUresult (*write_value_fn)(CUstream, CUdeviceptr, cuuint32_t, unsigned int);

typedef enum task_type {
    TASK_MEMCPY,
    TASK_MEMSET,
    TASK_HOST_FN,
    TASK_MARK,        /* slot = ticket (an event record on this HOST stream) */
    TASK_WAIT_HOST,   /* until a HOST stream's slot reaches ticket */
    TASK_WAIT_DEVICE, /* until a DEVICE stream's slot reaches ticket */
} task_type;

typedef struct host_task {
    task_type type;
    void *dst;
    const void *src;
    size_t bytes;
    int value;
    void (*fn)(void *arg);
    void *arg;
    int slot;
    uint32_t ticket;
} host_task;

struct strata_stream {
    strata_device *d;
    char name[64];
    strata_stream_kind kind;
    int slot;
    pthread_mutex_t mu;   /* DEVICE: orders tickets with their writes */
    cudaStream_t cu;      /* DEVICE: the stream; HOST: the worker's private copy stream */
    strata_host_queue q;  /* HOST: the worker thread and its FIFO (core/host_queue.h) */

    strata_stream *next_in_device;
};

enum { REC_NONE = -1 };

struct strata_event {
    strata_device *d;
    cudaEvent_t cu;
    pthread_mutex_t mu;
    int kind; /* REC_NONE, or the strata_stream_kind of the newest record */
    int slot;
    uint32_t ticket;
};

typedef struct alloc_entry {
    uintptr_t key; /* 0: empty */
    size_t bytes;
    int kind;
} alloc_entry;

typedef struct cuda_device {
    int ordinal;
    pthread_mutex_t mu; /* the stream list, the slot table and the allocation table */
    strata_stream *streams;

    volatile uint32_t *slots; /* SLOT_MAX * SLOT_STRIDE, pinned and mapped */
    CUdeviceptr slots_dev;
    uint32_t issued[SLOT_MAX]; /* tickets handed out per slot; survives slot reuse */
    unsigned char slot_busy[SLOT_MAX];
    pthread_mutex_t host_mu; /* host markers publish under it and broadcast host_cv */
    pthread_cond_t host_cv;

    wait_value_fn wait_value;   /* NULL: no stream memory operations, use the fallbacks */
    write_value_fn write_value;
    int device_waits;           /* STRATA_CUDA_DEVICE_WAITS=1: GPU-side waits on host records */

    alloc_entry *allocs;
    size_t alloc_cap, alloc_count;

    strata_cuda_kstate *ks;
} cuda_device;

static cuda_device *impl_of(strata_device *d) { return (cuda_device *)d->impl; }

/* ---- the calling thread's current GPU ---- */

/* cudaSetDevice is per thread; a cache keeps the hot paths (every kernel launch) from
 * paying for it. Nothing else in strata changes a thread's device behind this cache. */
static __thread int tls_current_ordinal = -1;

static int make_current(int ordinal) {
    if (tls_current_ordinal == ordinal) return 0;
    cudaError_t e = cudaSetDevice(ordinal);
    if (e != cudaSuccess)
        return strata_fail("cudaSetDevice(%d) failed: %s", ordinal, cudaGetErrorString(e));
    tls_current_ordinal = ordinal;
    return 0;
}

/* ---- slots ---- */

static inline volatile uint32_t *slot_ptr(cuda_device *cd, int slot) {
    return cd->slots + (size_t)slot * SLOT_STRIDE;
}

static inline int ticket_reached(uint32_t value, uint32_t ticket) {
    return (int32_t)(value - ticket) >= 0;
}

static inline uint32_t slot_load(cuda_device *cd, int slot) {
    return __atomic_load_n(slot_ptr(cd, slot), __ATOMIC_ACQUIRE);
}

static int slot_acquire(cuda_device *cd, const char *stream_name) {
    pthread_mutex_lock(&cd->mu);
    for (int i = 0; i < SLOT_MAX; i++) {
        if (!cd->slot_busy[i]) {
            cd->slot_busy[i] = 1;
            pthread_mutex_unlock(&cd->mu);
            return i;
        }
    }
    pthread_mutex_unlock(&cd->mu);
    return strata_fail("stream \"%s\": cuda:%d already has %d streams open; destroy unused "
                       "streams first",
                       stream_name, cd->ordinal, SLOT_MAX);
}

static void slot_release(cuda_device *cd, int slot) {
    pthread_mutex_lock(&cd->mu);
    cd->slot_busy[slot] = 0;
    pthread_mutex_unlock(&cd->mu);
}

/* Host side of a HOST-stream record: publish the ticket, wake every host waiter. */
static void slot_publish(cuda_device *cd, int slot, uint32_t ticket) {
    pthread_mutex_lock(&cd->host_mu);
    __atomic_store_n(slot_ptr(cd, slot), ticket, __ATOMIC_RELEASE);
    pthread_cond_broadcast(&cd->host_cv);
    pthread_mutex_unlock(&cd->host_mu);
}

/* A wait that has gone on for long (core/common.h, strata_long_wait): which stream's
 * record this thread waits for, and where every stream stands (its slot against the
 * tickets it has handed out). Reads the slots racily: a report, not a decision. */
static void report_long_wait(cuda_device *cd, int slot, uint32_t ticket, double waited) {
    char me[32], streams[1024], target[80] = "?";
    size_t n = 0;
    streams[0] = 0;
    pthread_mutex_lock(&cd->mu);
    for (strata_stream *s = cd->streams; s; s = s->next_in_device) {
        if (s->slot == slot) snprintf(target, sizeof target, "%s", s->name);
        if (n < sizeof streams - 1)
            n += snprintf(streams + n, sizeof streams - n, "%s\"%s\" (%s) at #%u of #%u", n ? ", " : "", s->name,
                          s->kind == STRATA_STREAM_DEVICE ? "device" : "host", slot_load(cd, s->slot),
                          __atomic_load_n(&cd->issued[s->slot], __ATOMIC_RELAXED));
    }
    pthread_mutex_unlock(&cd->mu);
    STRATA_WARN("device", "cuda:%d: thread \"%s\" has waited %.0f s for stream \"%s\" to reach its record #%u "
                "(it is at #%u); streams: %s", cd->ordinal, strata_thread_name(me, sizeof me), waited, target, ticket,
                slot_load(cd, slot), streams);
}

typedef struct slot_wait {
    cuda_device *cd;
    int slot;
    uint32_t ticket;
} slot_wait;

static int slot_reached(void *arg) {
    slot_wait *w = (slot_wait *)arg;
    return ticket_reached(slot_load(w->cd, w->slot), w->ticket);
}

static void slot_report(void *arg, double waited) {
    slot_wait *w = (slot_wait *)arg;
    report_long_wait(w->cd, w->slot, w->ticket, waited);
}

static void wait_host_slot(cuda_device *cd, int slot, uint32_t ticket) {
    pthread_mutex_lock(&cd->host_mu);
    slot_wait w = {cd, slot, ticket};
    strata_cond_wait_reporting(&cd->host_cv, &cd->host_mu, slot_reached, slot_report, &w);
    pthread_mutex_unlock(&cd->host_mu);
}

/* A device-written slot raises no host signal: spin briefly (most waits are short),
 * then sleep in growing steps up to 100 us so a long wait costs little CPU. */
static void wait_device_slot(cuda_device *cd, int slot, uint32_t ticket) {
    long sleep_ns = 2000;
    strata_long_wait w;
    int reports = 0;
    for (unsigned long spin = 0; !ticket_reached(slot_load(cd, slot), ticket); spin++) {
        if (spin < 200) {
            sched_yield();
            continue;
        }
        if (spin == 200 && (reports = strata_wait_reports_on())) strata_long_wait_begin(&w);
        struct timespec ts = {0, sleep_ns};
        nanosleep(&ts, NULL);
        if (sleep_ns < 100000) sleep_ns *= 2;
        double waited = reports && spin % 1024 == 0 ? strata_long_wait_check(&w) : 0;
        if (waited > 0) report_long_wait(cd, slot, ticket, waited);
    }
}

/* Fallback device-side write: one thread stores the ticket after the stream's earlier
 * work (kernel boundaries order it) with a system fence so the host sees that work. */
__global__ void slot_write_kernel(volatile uint32_t *slot, uint32_t ticket) {
    __threadfence_system();
    *slot = ticket;
    __threadfence_system();
}

/* Fallback device-side wait on a host record: one thread polls the mapped slot. */
__global__ void slot_wait_kernel(const volatile uint32_t *slot, uint32_t ticket) {
    while ((int32_t)(*slot - ticket) < 0) __nanosleep(2000);
    __threadfence_system();
}

/* ---- the allocation table: open addressing with linear probing ---- */

static size_t alloc_hash(uintptr_t key, size_t cap) {
    uint64_t h = (uint64_t)key * 0x9E3779B97F4A7C15ull;
    return (size_t)(h >> 17) & (cap - 1);
}

static void alloc_insert_nolock(cuda_device *cd, uintptr_t key, size_t bytes, int kind) {
    if ((cd->alloc_count + 1) * 2 > cd->alloc_cap) {
        size_t cap = cd->alloc_cap ? cd->alloc_cap * 2 : 256;
        alloc_entry *old = cd->allocs;
        size_t old_cap = cd->alloc_cap;
        cd->allocs = (alloc_entry *)strata_xcalloc(cap, sizeof *cd->allocs);
        cd->alloc_cap = cap;
        cd->alloc_count = 0;
        for (size_t i = 0; i < old_cap; i++)
            if (old[i].key) alloc_insert_nolock(cd, old[i].key, old[i].bytes, old[i].kind);
        free(old);
    }
    size_t i = alloc_hash(key, cd->alloc_cap);
    while (cd->allocs[i].key) i = (i + 1) & (cd->alloc_cap - 1);
    cd->allocs[i].key = key;
    cd->allocs[i].bytes = bytes;
    cd->allocs[i].kind = kind;
    cd->alloc_count++;
}

/* Removes key; 0 and its entry when found, -1 when it is not a live allocation. */
static int alloc_remove_nolock(cuda_device *cd, uintptr_t key, alloc_entry *out) {
    if (!cd->alloc_cap) return -1;
    size_t mask = cd->alloc_cap - 1, i = alloc_hash(key, cd->alloc_cap);
    while (cd->allocs[i].key && cd->allocs[i].key != key) i = (i + 1) & mask;
    if (!cd->allocs[i].key) return -1;
    *out = cd->allocs[i];
    /* Backward-shift deletion keeps every probe chain unbroken without tombstones. */
    size_t hole = i;
    for (size_t j = (i + 1) & mask; cd->allocs[j].key; j = (j + 1) & mask) {
        size_t home = alloc_hash(cd->allocs[j].key, cd->alloc_cap);
        /* j's entry may move into the hole when its home is not cyclically in (hole, j] */
        int stays = hole <= j ? (home > hole && home <= j) : (home > hole || home <= j);
        if (!stays) {
            cd->allocs[hole] = cd->allocs[j];
            hole = j;
        }
    }
    cd->allocs[hole].key = 0;
    cd->alloc_count--;
    return 0;
}

/* ---- memory ---- */

static const char *kind_name(int kind) {
    switch (kind) {
    case STRATA_MEM_DEVICE: return "device";
    case STRATA_MEM_PINNED: return "pinned";
    case STRATA_MEM_HOST: return "host";
    }
    return "unknown";
}

static void *cuda_alloc(strata_device *d, strata_mem_kind kind, size_t bytes) {
    cuda_device *cd = impl_of(d);
    if ((int)kind < 0 || kind >= STRATA_MEM_KINDS) {
        strata_fail("cuda:%d alloc of %zu bytes: memory kind %d is not one of device, pinned, host",
                    cd->ordinal, bytes, (int)kind);
        return NULL;
    }
    if (make_current(cd->ordinal)) return NULL;
    size_t want = bytes ? bytes : 1; /* a zero-byte request still gets a unique pointer */
    void *p = NULL;
    cudaError_t e = cudaSuccess;
    const char *call = "";
    switch (kind) {
    case STRATA_MEM_DEVICE:
        call = "cudaMalloc";
        e = cudaMalloc(&p, want);
        break;
    case STRATA_MEM_PINNED:
        call = "cudaHostAlloc";
        e = cudaHostAlloc(&p, want, cudaHostAllocPortable);
        break;
    default:
        call = "posix_memalign";
        if (posix_memalign(&p, 64, strata_round_up(want, 64))) p = NULL;
        break;
    }
    if (e != cudaSuccess || !p) {
        char want_s[32], free_s[32], total_s[32];
        size_t fr = 0, tot = 0;
        (void)cudaGetLastError(); /* clear a non-sticky allocation error */
        cudaMemGetInfo(&fr, &tot);
        strata_fail("cuda:%d alloc of %s of %s memory failed: %s: %s (device free %s of %s)",
                    cd->ordinal, strata_fmt_bytes(want_s, sizeof want_s, (double)bytes),
                    kind_name(kind), call, e != cudaSuccess ? cudaGetErrorString(e) : "out of host memory",
                    strata_fmt_bytes(free_s, sizeof free_s, (double)fr),
                    strata_fmt_bytes(total_s, sizeof total_s, (double)tot));
        return NULL;
    }
    pthread_mutex_lock(&cd->mu);
    alloc_insert_nolock(cd, (uintptr_t)p, bytes, (int)kind);
    pthread_mutex_unlock(&cd->mu);
    strata_mem_count_alloc(d, kind, bytes);
    return p;
}

static void cuda_free(strata_device *d, strata_mem_kind kind, void *p) {
    if (!p) return;
    cuda_device *cd = impl_of(d);
    alloc_entry ent;
    pthread_mutex_lock(&cd->mu);
    int rc = alloc_remove_nolock(cd, (uintptr_t)p, &ent);
    if (rc == 0 && ent.kind != (int)kind) {
        alloc_insert_nolock(cd, ent.key, ent.bytes, ent.kind); /* leave it live; we abort */
        pthread_mutex_unlock(&cd->mu);
        strata_panic(__FILE__, __LINE__, "cuda:%d free of %p: allocated as %s memory, freed as %s",
                     cd->ordinal, p, kind_name(ent.kind), kind_name(kind));
    }
    pthread_mutex_unlock(&cd->mu);
    if (rc)
        strata_panic(__FILE__, __LINE__, "cuda:%d free of %p (%s): not a live allocation of this device",
                     cd->ordinal, p, kind_name(kind));
    if (make_current(cd->ordinal)) strata_panic(__FILE__, __LINE__, "%s", strata_error());
    switch (kind) {
    case STRATA_MEM_DEVICE: CUDA_CHECK(cudaFree(p)); break;
    case STRATA_MEM_PINNED: CUDA_CHECK(cudaFreeHost(p)); break;
    default: free(p); break;
    }
    strata_mem_count_free(d, kind, ent.bytes);
}

/* ---- HOST stream workers ---- */

static int is_host_memory(const void *p) {
    cudaPointerAttributes a;
    if (cudaPointerGetAttributes(&a, p) != cudaSuccess) {
        (void)cudaGetLastError();
        return 1; /* unknown to CUDA: ordinary host memory */
    }
    return a.type == cudaMemoryTypeUnregistered || a.type == cudaMemoryTypeHost;
}

static void task_run(strata_stream *s, const host_task *t) {
    cuda_device *cd = impl_of(s->d);
    switch (t->type) {
    case TASK_MEMCPY:
        if (!t->bytes || t->dst == t->src) break;
        if (is_host_memory(t->dst) && is_host_memory(t->src)) {
            memmove(t->dst, t->src, t->bytes);
        } else {
            CUDA_CHECK(cudaMemcpyAsync(t->dst, t->src, t->bytes, cudaMemcpyDefault, s->cu));
            CUDA_CHECK(cudaStreamSynchronize(s->cu));
        }
        break;
    case TASK_MEMSET:
        if (!t->bytes) break;
        if (is_host_memory(t->dst)) {
            memset(t->dst, t->value, t->bytes);
        } else {
            CUDA_CHECK(cudaMemsetAsync(t->dst, t->value, t->bytes, s->cu));
            CUDA_CHECK(cudaStreamSynchronize(s->cu));
        }
        break;
    case TASK_HOST_FN: t->fn(t->arg); break;
    case TASK_MARK: slot_publish(cd, t->slot, t->ticket); break;
    case TASK_WAIT_HOST: wait_host_slot(cd, t->slot, t->ticket); break;
    case TASK_WAIT_DEVICE: wait_device_slot(cd, t->slot, t->ticket); break;
    }
}

static void queue_run(void *owner, void *task) {
    strata_stream *s = (strata_stream *)owner;
    if (make_current(impl_of(s->d)->ordinal)) strata_panic(__FILE__, __LINE__, "%s", strata_error());
    task_run(s, (const host_task *)task);
}

/* A MARK takes its ticket under the queue's lock, so tickets enter the FIFO in order and
 * the slot only grows. */
static void stamp_mark(void *owner, void *task) {
    strata_stream *s = (strata_stream *)owner;
    host_task *t = (host_task *)task;
    if (t->type != TASK_MARK) return;
    t->slot = s->slot;
    t->ticket = ++impl_of(s->d)->issued[s->slot];
}

static int host_submit(strata_stream *s, host_task *t) { return strata_host_queue_push(&s->q, t, stamp_mark); }

/* ---- streams ---- */

static void stream_free(strata_stream *s) {
    pthread_mutex_destroy(&s->mu);
    free(s);
}

static strata_stream *stream_new(strata_device *d, const char *name, strata_stream_kind kind) {
    cuda_device *cd = impl_of(d);
    if (kind != STRATA_STREAM_DEVICE && kind != STRATA_STREAM_HOST) {
        strata_fail("stream \"%s\": kind %d is neither device nor host", name ? name : "unnamed", (int)kind);
        return NULL;
    }
    if (make_current(cd->ordinal)) return NULL;
    strata_stream *s = (strata_stream *)strata_xcalloc(1, sizeof *s);
    s->d = d;
    snprintf(s->name, sizeof s->name, "%s", name ? name : "unnamed");
    s->kind = kind;
    pthread_mutex_init(&s->mu, NULL);
    s->slot = slot_acquire(cd, s->name);
    if (s->slot < 0) {
        stream_free(s);
        return NULL;
    }
    cudaError_t e = cudaStreamCreateWithFlags(&s->cu, cudaStreamNonBlocking);
    if (e != cudaSuccess) {
        strata_fail("stream \"%s\" on cuda:%d: cudaStreamCreateWithFlags failed: %s", s->name,
                    cd->ordinal, cudaGetErrorString(e));
        slot_release(cd, s->slot);
        stream_free(s);
        return NULL;
    }
    if (kind == STRATA_STREAM_HOST && strata_host_queue_start(&s->q, s->name, sizeof(host_task), queue_run, s)) {
        cudaStreamDestroy(s->cu);
        slot_release(cd, s->slot);
        stream_free(s);
        return NULL;
    }
    pthread_mutex_lock(&cd->mu);
    s->next_in_device = cd->streams;
    cd->streams = s;
    pthread_mutex_unlock(&cd->mu);
    return s;
}

static strata_stream *cuda_stream_create(strata_device *d, const char *name, strata_stream_kind kind) {
    return stream_new(d, name, kind);
}

static int cuda_stream_sync(strata_stream *s) {
    if (!s) return strata_fail("stream sync: stream is NULL");
    if (s->kind == STRATA_STREAM_DEVICE) {
        if (make_current(impl_of(s->d)->ordinal)) return -1;
        cudaError_t e = cudaStreamSynchronize(s->cu);
        if (e != cudaSuccess)
            return strata_fail("stream \"%s\": cudaStreamSynchronize failed: %s", s->name,
                               cudaGetErrorString(e));
        return 0;
    }
    strata_host_queue_sync(&s->q);
    return 0;
}

static void cuda_stream_destroy(strata_stream *s) {
    cuda_device *cd = impl_of(s->d);
    pthread_mutex_lock(&cd->mu);
    for (strata_stream **p = &cd->streams; *p; p = &(*p)->next_in_device) {
        if (*p == s) {
            *p = s->next_in_device;
            break;
        }
    }
    pthread_mutex_unlock(&cd->mu);
    if (s->kind == STRATA_STREAM_HOST) strata_host_queue_stop(&s->q); /* drains its queue first */
    /* The slot is reused by a later stream only once every write to it has landed. */
    if (make_current(cd->ordinal) == 0) {
        cudaError_t e = cudaStreamSynchronize(s->cu);
        if (e == cudaSuccess) e = cudaStreamDestroy(s->cu);
        if (e != cudaSuccess)
            STRATA_WARN("device", "stream \"%s\" on cuda:%d: destroy failed: %s", s->name,
                        cd->ordinal, cudaGetErrorString(e));
    }
    slot_release(cd, s->slot);
    stream_free(s);
}

static int check_copy_args(strata_stream *s, const char *what, const void *dst, const void *src,
                           size_t bytes) {
    if (!s) return strata_fail("%s of %zu bytes: stream is NULL", what, bytes);
    if (bytes && (!dst || (!strcmp(what, "memcpy") && !src)))
        return strata_fail("%s of %zu bytes on stream \"%s\": NULL %s", what, bytes, s->name,
                           dst ? "source" : "destination");
    return 0;
}

static int cuda_memcpy_async(strata_stream *s, void *dst, const void *src, size_t bytes) {
    if (check_copy_args(s, "memcpy", dst, src, bytes)) return -1;
    if (s->kind == STRATA_STREAM_HOST) {
        host_task t = {};
        t.type = TASK_MEMCPY;
        t.dst = dst;
        t.src = src;
        t.bytes = bytes;
        return host_submit(s, &t);
    }
    if (!bytes || dst == src) return 0;
    if (make_current(impl_of(s->d)->ordinal)) return -1;
    cudaError_t e = cudaMemcpyAsync(dst, src, bytes, cudaMemcpyDefault, s->cu);
    if (e != cudaSuccess)
        return strata_fail("stream \"%s\": cudaMemcpyAsync of %zu bytes %p -> %p failed: %s",
                           s->name, bytes, src, dst, cudaGetErrorString(e));
    return 0;
}

static int cuda_memset_async(strata_stream *s, void *dst, int value, size_t bytes) {
    if (check_copy_args(s, "memset", dst, NULL, bytes)) return -1;
    if (s->kind == STRATA_STREAM_HOST) {
        host_task t = {};
        t.type = TASK_MEMSET;
        t.dst = dst;
        t.value = value;
        t.bytes = bytes;
        return host_submit(s, &t);
    }
    if (!bytes) return 0;
    if (make_current(impl_of(s->d)->ordinal)) return -1;
    cudaError_t e = cudaMemsetAsync(dst, value, bytes, s->cu);
    if (e != cudaSuccess)
        return strata_fail("stream \"%s\": cudaMemsetAsync of %zu bytes at %p failed: %s "
                           "(a DEVICE stream can set device and pinned memory only)",
                           s->name, bytes, dst, cudaGetErrorString(e));
    return 0;
}

/* On a DEVICE stream fn runs on CUDA's callback thread: it must not call CUDA nor wait
 * for anything enqueued after it (see the note on host functions at the top). */
static int cuda_host_task(strata_stream *s, void (*fn)(void *arg), void *arg) {
    if (!s) return strata_fail("host task: stream is NULL");
    if (!fn) return strata_fail("host task on stream \"%s\": function is NULL", s->name);
    if (s->kind == STRATA_STREAM_HOST) {
        host_task t = {};
        t.type = TASK_HOST_FN;
        t.fn = fn;
        t.arg = arg;
        return host_submit(s, &t);
    }
    if (make_current(impl_of(s->d)->ordinal)) return -1;
    cudaError_t e = cudaLaunchHostFunc(s->cu, fn, arg);
    if (e != cudaSuccess)
        return strata_fail("stream \"%s\": cudaLaunchHostFunc failed: %s", s->name, cudaGetErrorString(e));
    return 0;
}

/* ---- events ---- */

static strata_event *cuda_event_create(strata_device *d) {
    cuda_device *cd = impl_of(d);
    if (make_current(cd->ordinal)) return NULL;
    strata_event *e = (strata_event *)strata_xcalloc(1, sizeof *e);
    e->d = d;
    e->kind = REC_NONE;
    cudaError_t err = cudaEventCreateWithFlags(&e->cu, cudaEventDisableTiming);
    if (err != cudaSuccess) {
        strata_fail("cuda:%d: cudaEventCreateWithFlags failed: %s", cd->ordinal, cudaGetErrorString(err));
        free(e);
        return NULL;
    }
    pthread_mutex_init(&e->mu, NULL);
    return e;
}

/* Queued waits and markers name slots, not the event, so the event may go at once; a
 * pending cudaEventRecord is released by CUDA when it completes. */
static void cuda_event_destroy(strata_event *e) {
    if (make_current(impl_of(e->d)->ordinal) == 0) {
        cudaError_t err = cudaEventDestroy(e->cu);
        if (err != cudaSuccess)
            STRATA_WARN("device", "cudaEventDestroy failed: %s", cudaGetErrorString(err));
    }
    pthread_mutex_destroy(&e->mu);
    free(e);
}

static int cuda_event_record(strata_event *e, strata_stream *s) {
    if (!e || !s) return strata_fail("event record: %s is NULL", e ? "stream" : "event");
    cuda_device *cd = impl_of(s->d);
    if (s->kind == STRATA_STREAM_HOST) {
        /* The event lock is held across the enqueue so that concurrent records of one
         * event leave it naming the one queued last. */
        pthread_mutex_lock(&e->mu);
        host_task t = {};
        t.type = TASK_MARK;
        int rc = host_submit(s, &t);
        if (rc == 0) {
            e->kind = STRATA_STREAM_HOST;
            e->slot = t.slot;
            e->ticket = t.ticket;
        }
        pthread_mutex_unlock(&e->mu);
        return rc;
    }
    if (make_current(cd->ordinal)) return -1;
    pthread_mutex_lock(&e->mu);
    pthread_mutex_lock(&s->mu);
    uint32_t ticket = cd->issued[s->slot] + 1;
    cudaError_t err = cudaEventRecord(e->cu, s->cu);
    const char *call = "cudaEventRecord";
    if (err == cudaSuccess) {
        CUdeviceptr addr = cd->slots_dev + (CUdeviceptr)s->slot * SLOT_STRIDE * sizeof(uint32_t);
        if (cd->write_value) {
            call = "cuStreamWriteValue32";
            CUresult r = cd->write_value((CUstream)s->cu, addr, ticket, CU_STREAM_WRITE_VALUE_DEFAULT);
            if (r != CUDA_SUCCESS) err = cudaErrorUnknown;
        } else {
            call = "slot_write_kernel";
            slot_write_kernel<<<1, 1, 0, s->cu>>>((volatile uint32_t *)addr, ticket);
            err = cudaGetLastError();
        }
    }
    if (err == cudaSuccess) {
        cd->issued[s->slot] = ticket;
        e->kind = STRATA_STREAM_DEVICE;
        e->slot = s->slot;
        e->ticket = ticket;
    }
    pthread_mutex_unlock(&s->mu);
    pthread_mutex_unlock(&e->mu);
    if (err != cudaSuccess)
        return strata_fail("event record on stream \"%s\": %s failed: %s", s->name, call,
                           cudaGetErrorString(err));
    return 0;
}

/* The newest record as (kind, slot, ticket); returns 0 when it has been reached or
 * there was none, so the caller need not wait. */
static int event_snapshot(strata_event *e, int *kind, int *slot, uint32_t *ticket) {
    pthread_mutex_lock(&e->mu);
    *kind = e->kind;
    *slot = e->slot;
    *ticket = e->ticket;
    pthread_mutex_unlock(&e->mu);
    if (*kind == REC_NONE) return 0;
    return !ticket_reached(slot_load(impl_of(e->d), *slot), *ticket);
}

static int cuda_stream_wait_event(strata_stream *s, strata_event *e) {
    if (!e || !s) return strata_fail("stream wait: %s is NULL", e ? "stream" : "event");
    cuda_device *cd = impl_of(s->d);
    int kind, slot;
    uint32_t ticket;
    if (!event_snapshot(e, &kind, &slot, &ticket)) return 0;
    if (s->kind == STRATA_STREAM_HOST) {
        host_task t = {};
        t.type = kind == STRATA_STREAM_HOST ? TASK_WAIT_HOST : TASK_WAIT_DEVICE;
        t.slot = slot;
        t.ticket = ticket;
        return host_submit(s, &t);
    }
    if (kind == STRATA_STREAM_HOST && !cd->device_waits) {
        wait_host_slot(cd, slot, ticket); /* see the top of the file */
        return 0;
    }
    if (make_current(cd->ordinal)) return -1;
    if (kind == STRATA_STREAM_DEVICE) {
        /* The cudaEvent may have been re-recorded since the snapshot; waiting for the
         * newer record is what CUDA itself would do for a wait issued now. */
        cudaError_t err = cudaStreamWaitEvent(s->cu, e->cu, 0);
        if (err != cudaSuccess)
            return strata_fail("stream \"%s\": cudaStreamWaitEvent failed: %s", s->name,
                               cudaGetErrorString(err));
        return 0;
    }
    if (cd->wait_value) {
        CUdeviceptr addr = cd->slots_dev + (CUdeviceptr)slot * SLOT_STRIDE * sizeof(uint32_t);
        CUresult r = cd->wait_value((CUstream)s->cu, addr, ticket, CU_STREAM_WAIT_VALUE_GEQ);
        if (r != CUDA_SUCCESS)
            return strata_fail("stream \"%s\": cuStreamWaitValue32 on a host record failed (CUresult %d)",
                               s->name, (int)r);
        return 0;
    }
    CUdeviceptr addr = cd->slots_dev + (CUdeviceptr)slot * SLOT_STRIDE * sizeof(uint32_t);
    slot_wait_kernel<<<1, 1, 0, s->cu>>>((const volatile uint32_t *)addr, ticket);
    cudaError_t err = cudaGetLastError();
    if (err != cudaSuccess)
        return strata_fail("stream \"%s\": slot_wait_kernel for a host-record wait failed to launch: %s",
                           s->name, cudaGetErrorString(err));
    return 0;
}

static int cuda_event_sync(strata_event *e) {
    if (!e) return strata_fail("event sync: event is NULL");
    int kind, slot;
    uint32_t ticket;
    if (!event_snapshot(e, &kind, &slot, &ticket)) return 0;
    if (kind == STRATA_STREAM_HOST) wait_host_slot(impl_of(e->d), slot, ticket);
    else wait_device_slot(impl_of(e->d), slot, ticket);
    return 0;
}

/* A timed event is a plain one whose cudaEvent keeps timestamps. */
static strata_event *cuda_event_create_timed(strata_device *d) {
    strata_event *e = cuda_event_create(d);
    if (!e) return NULL;
    cudaEvent_t timed;
    cudaError_t err = cudaEventCreateWithFlags(&timed, cudaEventDefault);
    if (err != cudaSuccess) {
        strata_fail("cuda:%d: cudaEventCreateWithFlags (timed) failed: %s", impl_of(d)->ordinal, cudaGetErrorString(err));
        cuda_event_destroy(e);
        return NULL;
    }
    cudaEventDestroy(e->cu);
    e->cu = timed;
    return e;
}

/* Both records must be on DEVICE streams: a HOST stream's record is a marker, which
 * the GPU's clock never sees. */
static int cuda_event_elapsed_ms(strata_event *a, strata_event *b, double *ms) {
    if (!a || !b) return strata_fail("event elapsed: event is NULL");
    int ka, kb, slot;
    uint32_t ticket;
    int pending = event_snapshot(a, &ka, &slot, &ticket) | event_snapshot(b, &kb, &slot, &ticket);
    if (ka != STRATA_STREAM_DEVICE || kb != STRATA_STREAM_DEVICE)
        return strata_fail("event elapsed: both events must be recorded on DEVICE streams");
    if (pending) return strata_fail("event elapsed: an event is still pending");
    if (make_current(impl_of(a->d)->ordinal)) return -1;
    float f = 0;
    cudaError_t err = cudaEventElapsedTime(&f, a->cu, b->cu);
    if (err != cudaSuccess) return strata_fail("cudaEventElapsedTime failed: %s", cudaGetErrorString(err));
    *ms = f;
    return 0;
}

static int cuda_event_query(strata_event *e) {
    if (!e) return strata_fail("event query: event is NULL");
    int kind, slot;
    uint32_t ticket;
    return !event_snapshot(e, &kind, &slot, &ticket);
}

/* ---- device ---- */

static int cuda_mem_info(strata_device *d, size_t *free_bytes, size_t *total_bytes) {
    if (make_current(d->ordinal)) return -1;
    size_t fr = 0, tot = 0;
    CUDA_TRY(cudaMemGetInfo(&fr, &tot));
    if (free_bytes) *free_bytes = fr;
    if (total_bytes) *total_bytes = tot;
    return 0;
}

static int cuda_sync_all(strata_device *d) {
    cuda_device *cd = impl_of(d);
    /* A snapshot, so a host task may create streams without deadlock; streams are
     * destroyed only by their owner, never during sync_all. */
    pthread_mutex_lock(&cd->mu);
    size_t n = 0;
    for (strata_stream *s = cd->streams; s; s = s->next_in_device) n++;
    strata_stream **list = (strata_stream **)strata_xmalloc((n ? n : 1) * sizeof *list);
    n = 0;
    for (strata_stream *s = cd->streams; s; s = s->next_in_device) list[n++] = s;
    pthread_mutex_unlock(&cd->mu);
    int rc = 0;
    for (size_t i = 0; i < n; i++)
        if (cuda_stream_sync(list[i])) rc = -1;
    free(list);
    return rc;
}

static void cuda_destroy(strata_device *d) {
    cuda_device *cd = impl_of(d);
    if (cuda_sync_all(d)) STRATA_WARN("device", "cuda:%d close: %s", cd->ordinal, strata_error());
    for (;;) {
        pthread_mutex_lock(&cd->mu);
        strata_stream *s = cd->streams;
        pthread_mutex_unlock(&cd->mu);
        if (!s) break;
        if (s != d->compute)
            STRATA_WARN("device", "cuda:%d closed with stream \"%s\" still open", cd->ordinal, s->name);
        cuda_stream_destroy(s);
    }
    for (int k = 0; k < STRATA_MEM_KINDS; k++) {
        if (d->mem[k].live_bytes)
            STRATA_WARN("device", "cuda:%d closed with %zu bytes of %s memory still allocated",
                        cd->ordinal, d->mem[k].live_bytes, kind_name(k));
    }
    if (make_current(cd->ordinal) == 0) {
        strata_cuda_kstate_destroy(cd->ks);
        cudaFreeHost((void *)cd->slots);
    }
    free(cd->allocs);
    pthread_cond_destroy(&cd->host_cv);
    pthread_mutex_destroy(&cd->host_mu);
    pthread_mutex_destroy(&cd->mu);
    free(cd);
    free(d);
}

static const char *cuda_stream_name(const strata_stream *s) { return s->name; }

static const strata_device_ops cuda_ops = {
    "cuda",
    cuda_destroy,
    cuda_alloc,
    cuda_free,
    cuda_stream_create,
    cuda_stream_destroy,
    cuda_stream_sync,
    cuda_memcpy_async,
    cuda_memset_async,
    cuda_host_task,
    cuda_event_create,
    cuda_event_destroy,
    cuda_event_record,
    cuda_stream_wait_event,
    cuda_event_sync,
    cuda_event_query,
    cuda_event_create_timed,
    cuda_event_elapsed_ms,
    cuda_mem_info,
    cuda_sync_all,
    cuda_stream_name,
};

/* cuStreamWaitValue32/WriteValue32 through the runtime's driver entry points, so the
 * library needs no link against libcuda. NULL pointers select the fallbacks. */
static void load_memops(cuda_device *cd) {
    const char *dw = getenv("STRATA_CUDA_DEVICE_WAITS");
    cd->device_waits = dw && !strcmp(dw, "1");
    const char *env = getenv("STRATA_CUDA_MEMOPS");
    if (env && !strcmp(env, "0")) return;
    void *wait = NULL, *write = NULL;
    cudaDriverEntryPointQueryResult q1 = cudaDriverEntryPointSymbolNotFound, q2 = q1;
    cudaError_t e1 = cudaGetDriverEntryPointByVersion("cuStreamWaitValue32", &wait, 12000,
                                                      cudaEnableDefault, &q1);
    cudaError_t e2 = cudaGetDriverEntryPointByVersion("cuStreamWriteValue32", &write, 12000,
                                                      cudaEnableDefault, &q2);
    if (e1 != cudaSuccess || e2 != cudaSuccess || q1 != cudaDriverEntryPointSuccess ||
        q2 != cudaDriverEntryPointSuccess || !wait || !write) {
        (void)cudaGetLastError();
        STRATA_INFO("device", "cuda:%d: stream memory operations unavailable; host-record waits "
                              "use one-thread polling kernels", cd->ordinal);
        return;
    }
    cd->wait_value = (wait_value_fn)wait;
    cd->write_value = (write_value_fn)write;
}

extern "C" int strata_cuda_available(void) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError(); /* no driver or no device: not an error for the caller */
        return 0;
    }
    return n > 0;
}

/* The GPU to open: `ordinal` (a local rank past the node's GPUs shares them round-robin,
 * which only the mpi backend allows; NCCL refuses it), made current, with compute
 * capability 8.0 or newer for the bf16 kernels. -1 + error otherwise. */
static int choose_gpu(int ordinal, cudaDeviceProp *prop) {
    int n = 0;
    cudaError_t e = cudaGetDeviceCount(&n);
    if (e != cudaSuccess) {
        (void)cudaGetLastError();
        return strata_fail("cuda device %d: no usable CUDA driver or GPU (cudaGetDeviceCount: %s)", ordinal,
                           cudaGetErrorString(e));
    }
    if (ordinal < 0 || n < 1) return strata_fail("cuda device %d: this machine has %d GPU%s", ordinal, n, n == 1 ? "" : "s");
    if (ordinal >= n) {
        STRATA_WARN("device", "local rank %d of a node with %d GPU%s: using cuda:%d, shared with other ranks",
                    ordinal, n, n == 1 ? "" : "s", ordinal % n);
        ordinal %= n;
    }
    if (make_current(ordinal)) return -1;
    e = cudaGetDeviceProperties(prop, ordinal);
    if (e != cudaSuccess)
        return strata_fail("cuda device %d: cudaGetDeviceProperties failed: %s", ordinal, cudaGetErrorString(e));
    if (prop->major < 8)
        return strata_fail("cuda device %d (%s) has compute capability %d.%d; the bf16 kernels need 8.0 "
                           "(A100) or newer", ordinal, prop->name, prop->major, prop->minor);
    return ordinal;
}

/* The event slots: progress counters in mapped pinned memory that GPU streams and host
 * workers both read (see the top of this file). */
static int alloc_event_slots(cuda_device *cd) {
    void *slots = NULL, *slots_dev = NULL;
    size_t slot_bytes = (size_t)SLOT_MAX * SLOT_STRIDE * sizeof(uint32_t);
    cudaError_t e = cudaHostAlloc(&slots, slot_bytes, cudaHostAllocMapped | cudaHostAllocPortable);
    if (e == cudaSuccess) {
        memset(slots, 0, slot_bytes);
        e = cudaHostGetDevicePointer(&slots_dev, slots, 0);
    }
    if (e != cudaSuccess) {
        if (slots) cudaFreeHost(slots);
        return strata_fail("cuda device %d: event slots (cudaHostAlloc/cudaHostGetDevicePointer of %zu "
                           "bytes) failed: %s", cd->ordinal, slot_bytes, cudaGetErrorString(e));
    }
    cd->slots = (volatile uint32_t *)slots;
    cd->slots_dev = (CUdeviceptr)(uintptr_t)slots_dev;
    return 0;
}

/* What the context cost and what the backend's own setup added (cuBLASLt handle and
 * workspace, event slots): the memory plan measures both again, with anything else on the
 * GPU, as its device "runtime" row (launcher/plan.c); this says which is which. */
static void report_setup_memory(int ordinal, size_t ctx_free, size_t ctx_total) {
    size_t fr = ctx_free, tot = ctx_total;
    if (cudaMemGetInfo(&fr, &tot) != cudaSuccess) (void)cudaGetLastError();
    char b1[32], b2[32];
    STRATA_DEBUG("device", "cuda:%d: %s in use once the context existed (this context and any other "
                 "process), %s more after kernel setup (cuBLASLt workspace, event slots)", ordinal,
                 strata_fmt_bytes(b1, sizeof b1, (double)(ctx_total - ctx_free)),
                 strata_fmt_bytes(b2, sizeof b2, (double)ctx_free - (double)fr));
}

extern "C" strata_device *strata_device_cuda_open(int ordinal) {
    cudaDeviceProp prop;
    if ((ordinal = choose_gpu(ordinal, &prop)) < 0) return NULL;

    strata_device *d = (strata_device *)strata_xcalloc(1, sizeof *d);
    cuda_device *cd = (cuda_device *)strata_xcalloc(1, sizeof *cd);
    cd->ordinal = ordinal;
    pthread_mutex_init(&cd->mu, NULL);
    pthread_mutex_init(&cd->host_mu, NULL);
    pthread_cond_init(&cd->host_cv, NULL);
    d->ops = &cuda_ops;
    d->impl = cd;
    d->k = &strata_kernels_cuda;
    d->caps.host_memory = 0;
    d->caps.gpu = 1;
    d->compute_dtype = STRATA_BF16;
    d->ordinal = ordinal;
    snprintf(d->description, sizeof d->description, "cuda:%d %.80s (%.1f GiB)", ordinal, prop.name,
             (double)prop.totalGlobalMem / (1024.0 * 1024.0 * 1024.0));

    size_t ctx_free = 0, ctx_total = 0; /* before the backend's own setup */
    if (cudaMemGetInfo(&ctx_free, &ctx_total) != cudaSuccess) (void)cudaGetLastError();
    if (alloc_event_slots(cd)) goto fail;
    load_memops(cd);
    if (strata_cuda_kstate_create(ordinal, &cd->ks)) {
        char why[512];
        snprintf(why, sizeof why, "%s", strata_error());
        strata_fail("cuda device %d: kernel setup: %s", ordinal, why);
        cudaFreeHost((void *)cd->slots);
        goto fail;
    }
    d->compute = stream_new(d, "compute", STRATA_STREAM_DEVICE);
    if (!d->compute) {
        strata_cuda_kstate_destroy(cd->ks);
        cudaFreeHost((void *)cd->slots);
        goto fail;
    }
    report_setup_memory(ordinal, ctx_free, ctx_total);
    return d;
fail:
    pthread_cond_destroy(&cd->host_cv);
    pthread_mutex_destroy(&cd->host_mu);
    pthread_mutex_destroy(&cd->mu);
    free(cd);
    free(d);
    return NULL;
}

/* ---- accessors for core/cuda/kernels_cuda.cu ---- */

cudaStream_t strata_cuda_stream_handle(strata_stream *s) {
    if (!s) strata_panic(__FILE__, __LINE__, "cuda kernel launched with a NULL stream");
    if (s->kind != STRATA_STREAM_DEVICE)
        strata_panic(__FILE__, __LINE__, "cuda kernel launched on HOST stream \"%s\": kernels run "
                     "on DEVICE streams only", s->name);
    if (make_current(impl_of(s->d)->ordinal)) strata_panic(__FILE__, __LINE__, "%s", strata_error());
    return s->cu;
}

strata_cuda_kstate *strata_cuda_kstate_of(strata_stream *s) { return impl_of(s->d)->ks; }

int strata_cuda_is_compute(strata_stream *s) { return s == s->d->compute; }

/* ---- device faults (CUDA_CHECK, core/cuda/cuda_common.h) ---- */

void strata_cuda_record_oom(const char *file, int line, const char *call, size_t bytes, const char *why) {
    size_t fr = 0, tot = 0;
    int dev = -1;
    if (cudaGetDevice(&dev) != cudaSuccess || cudaMemGetInfo(&fr, &tot) != cudaSuccess) {
        (void)cudaGetLastError();
        fr = tot = 0;
    }
    char need[64] = "", fs[32], ts[32];
    if (bytes) snprintf(need, sizeof need, "needed %zu bytes; ", bytes);
    strata_fault_record(1, "%s at %s:%d failed: %s (%sdevice cuda:%d free %s of %s then)", call, file, line, why,
                        need, dev, strata_fmt_bytes(fs, sizeof fs, (double)fr),
                        strata_fmt_bytes(ts, sizeof ts, (double)tot));
}

void strata_cuda_fault(const char *file, int line, const char *call, cudaError_t err, size_t bytes) {
    if (err != cudaErrorMemoryAllocation)
        strata_panic(file, line, "%s failed: %s (%s)", call, cudaGetErrorString(err), cudaGetErrorName(err));
    (void)cudaGetLastError(); /* not sticky: clear it, so the next launch's check does not see it */
    strata_cuda_record_oom(file, line, call, bytes, cudaGetErrorString(err));
}
