/* shard/comm_nccl.cu: the NCCL half of the "nccl" collective backend (see comm.h and
 * comm_nccl.h). Each collective is one plain NCCL call (no groups) on the comm's DEVICE
 * stream, bracketed by two CUDA events: "start" completes when everything before the
 * collective on the stream has run, "end" when the collective has.
 *
 * Watchdog. A NCCL kernel whose peer died spins forever, and a host waiting on the stream
 * would wait with it. A thread per communicator follows the bracketed collectives in
 * order: it stamps a collective's start when its start event completes and its end when
 * the end event does (those stamps are the trace's spans), polls ncclCommGetAsyncError
 * while anything is in flight, and when a started collective is older than timeout_s or
 * NCCL reports an error it aborts the communicator (so the kernels exit) and ends the
 * job. The clock starts at "started", not at enqueue, so a collective queued behind long
 * compute is not counted as late. The ring of brackets is fixed (WATCH_SLOTS); an
 * enqueue that finds it full waits for the oldest collective to finish. */
#include <nccl.h>
#include <pthread.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "core/cuda/cuda_common.h"

extern "C" {
#include "shard/comm_nccl.h"
#include "shard/mpi.h"
#include "shard/peers.h"
}

#define WATCH_SLOTS 256

typedef struct watch_entry {
    cudaEvent_t start, end;
    strata_coll_kind kind;
    uint64_t bytes;
} watch_entry;

struct strata_nccl {
    ncclComm_t comm;
    strata_stream *stream;
    int ordinal, rank, world;
    double timeout_s;
    float *one; /* the barrier's all-reduce of one float */
    strata_nccl_done_fn done;
    void *ctx;

    pthread_mutex_t enq_mu; /* one enqueue at a time: stream order is ring order */
    pthread_mutex_t mu;     /* the ring */
    pthread_cond_t cv;      /* work for the watcher, room for the enqueuer */
    watch_entry ring[WATCH_SLOTS];
    size_t head, count;
    int stop;
    pthread_t watcher;
};

static int nccl_fail(const strata_nccl *n, ncclResult_t r, const char *call) {
    const char *last = n && n->comm ? ncclGetLastError(n->comm) : "";
    return strata_fail("nccl: %s failed: %s%s%s", call, ncclGetErrorString(r), last && *last ? ": " : "",
                       last ? last : "");
}

#define NCCL_TRY(n, call)                                                     \
    do {                                                                      \
        ncclResult_t nccl_r_ = (call);                                        \
        if (nccl_r_ != ncclSuccess) return nccl_fail((n), nccl_r_, #call);    \
    } while (0)

extern "C" int strata_nccl_available(void) { return 1; }

extern "C" int strata_nccl_unique_id(unsigned char id[STRATA_NCCL_ID_BYTES]) {
    static_assert(sizeof(ncclUniqueId) == STRATA_NCCL_ID_BYTES, "NCCL's unique id is 128 bytes");
    ncclUniqueId uid;
    NCCL_TRY((strata_nccl *)NULL, ncclGetUniqueId(&uid));
    memcpy(id, &uid, sizeof uid);
    return 0;
}

extern "C" int strata_nccl_gpu_bus_id(int ordinal, char *buf, int n) {
    cudaError_t e = cudaDeviceGetPCIBusId(buf, n, ordinal);
    if (e == cudaSuccess) return 0;
    (void)cudaGetLastError(); /* the caller carries on; a stale error would fail the next launch check */
    return strata_fail("cuda:%d: cudaDeviceGetPCIBusId failed: %s", ordinal, cudaGetErrorString(e));
}

/* ---- the watchdog ---- */

static _Noreturn void watch_abort(strata_nccl *n, const watch_entry *e, const char *why) {
    /* who is gone, by host, if a probe can tell (shard/peers.h), and the launcher's note */
    static char lost[4096];
    size_t o = 0;
    lost[0] = 0;
    if (strata_peers_world() > 1) strata_peers_explain(lost, &o, sizeof lost, 2000);
    strata_log(STRATA_LOG_ERROR, "comm", "nccl %s of %llu bytes %s%s%s", strata_coll_name(e->kind),
               (unsigned long long)e->bytes, why, lost, o ? " Aborting the job." : ": aborting the job");
    ncclCommAbort(n->comm); /* makes the spinning kernels return, so the process can exit */
    strata_mpi_abort(1);
}

/* cudaSuccess 1, cudaErrorNotReady 0; anything else is fatal. */
static int event_done(strata_nccl *n, const watch_entry *e, cudaEvent_t ev) {
    cudaError_t q = cudaEventQuery(ev);
    if (q == cudaSuccess) return 1;
    if (q == cudaErrorNotReady) return 0;
    char why[256];
    snprintf(why, sizeof why, "failed on the GPU: %s", cudaGetErrorString(q));
    watch_abort(n, e, why);
}

static void *watch_run(void *arg) {
    strata_nccl *n = (strata_nccl *)arg;
    if (cudaSetDevice(n->ordinal) != cudaSuccess)
        strata_panic(__FILE__, __LINE__, "nccl watchdog: cudaSetDevice(%d) failed", n->ordinal);
    const struct timespec nap = {0, 200000};
    double started_ms = 0; /* when the head's start event was seen complete; 0 before */
    pthread_mutex_lock(&n->mu);
    for (;;) {
        while (n->count == 0 && !n->stop) pthread_cond_wait(&n->cv, &n->mu);
        if (n->count == 0) break; /* stop requested, nothing in flight */
        watch_entry e = n->ring[n->head];
        pthread_mutex_unlock(&n->mu);

        if (started_ms == 0 && event_done(n, &e, e.start)) started_ms = strata_now_ms();
        if (started_ms != 0 && event_done(n, &e, e.end)) {
            if (n->done) n->done(n->ctx, e.kind, started_ms, strata_now_ms());
            started_ms = 0;
            pthread_mutex_lock(&n->mu);
            n->head = (n->head + 1) % WATCH_SLOTS;
            n->count--;
            pthread_cond_broadcast(&n->cv);
            continue;
        }
        ncclResult_t async = ncclSuccess;
        ncclCommGetAsyncError(n->comm, &async);
        if (async != ncclSuccess && async != ncclInProgress) {
            char why[512];
            const char *last = ncclGetLastError(n->comm);
            snprintf(why, sizeof why, "failed: %s%s%s", ncclGetErrorString(async), last && *last ? ": " : "",
                     last ? last : "");
            watch_abort(n, &e, why);
        }
        if (started_ms != 0 && strata_now_ms() - started_ms > n->timeout_s * 1e3) {
            char why[160];
            snprintf(why, sizeof why, "did not complete within %g s; another rank probably failed", n->timeout_s);
            watch_abort(n, &e, why);
        }
        nanosleep(&nap, NULL);
        pthread_mutex_lock(&n->mu);
    }
    pthread_mutex_unlock(&n->mu);
    return NULL;
}

/* ---- open / close ---- */

static void free_parts(strata_nccl *n, int events) {
    for (int i = 0; i < events; i++) {
        cudaEventDestroy(n->ring[i].start);
        cudaEventDestroy(n->ring[i].end);
    }
    if (n->one) cudaFree(n->one);
    pthread_cond_destroy(&n->cv);
    pthread_mutex_destroy(&n->mu);
    pthread_mutex_destroy(&n->enq_mu);
    free(n);
}

extern "C" strata_nccl *strata_nccl_open(strata_stream *stream, int ordinal, const unsigned char id[STRATA_NCCL_ID_BYTES],
                                         int rank, int world, double timeout_s, strata_nccl_done_fn done, void *ctx) {
    (void)strata_cuda_stream_handle(stream); /* a DEVICE stream; its GPU is now current */
    strata_nccl *n = (strata_nccl *)strata_xcalloc(1, sizeof *n);
    n->stream = stream;
    n->ordinal = ordinal;
    n->rank = rank;
    n->world = world;
    n->timeout_s = timeout_s;
    n->done = done;
    n->ctx = ctx;
    pthread_mutex_init(&n->enq_mu, NULL);
    pthread_mutex_init(&n->mu, NULL);
    pthread_cond_init(&n->cv, NULL);

    int events = 0;
    for (; events < WATCH_SLOTS; events++) {
        watch_entry *e = &n->ring[events];
        if (cudaEventCreateWithFlags(&e->start, cudaEventDisableTiming) != cudaSuccess) break;
        if (cudaEventCreateWithFlags(&e->end, cudaEventDisableTiming) != cudaSuccess) {
            cudaEventDestroy(e->start);
            break;
        }
    }
    cudaError_t ce = events == WATCH_SLOTS ? cudaMalloc((void **)&n->one, sizeof(float)) : cudaGetLastError();
    if (ce != cudaSuccess) {
        (void)cudaGetLastError();
        strata_fail("nccl on cuda:%d: creating its events and barrier buffer failed: %s", ordinal,
                    cudaGetErrorString(ce));
        free_parts(n, events);
        return NULL;
    }
    ncclUniqueId uid;
    memcpy(&uid, id, sizeof uid);
    ncclResult_t r = ncclCommInitRank(&n->comm, world, uid, rank);
    if (r != ncclSuccess) {
        strata_fail("comm.backend nccl: ncclCommInitRank (rank %d of %d on cuda:%d) failed: %s%s", rank, world,
                    ordinal, ncclGetErrorString(r),
                    r == ncclInvalidUsage ? " (NCCL refuses two ranks on one GPU: use comm.backend: mpi)" : "");
        n->comm = NULL;
        free_parts(n, events);
        return NULL;
    }
    int rc = pthread_create(&n->watcher, NULL, watch_run, n);
    if (rc) {
        strata_fail("nccl: cannot start the watchdog thread: %s", strerror(rc));
        ncclCommDestroy(n->comm);
        free_parts(n, events);
        return NULL;
    }
    pthread_setname_np(n->watcher, "nccl-watch");
    return n;
}

extern "C" void strata_nccl_close(strata_nccl *n) {
    if (!n) return;
    pthread_mutex_lock(&n->mu);
    n->stop = 1;
    pthread_cond_broadcast(&n->cv);
    pthread_mutex_unlock(&n->mu);
    pthread_join(n->watcher, NULL);
    /* Back to the thread's device afterwards: device_cuda.cu caches it per thread. */
    int prev = -1, ordinal = n->ordinal;
    if (cudaGetDevice(&prev) != cudaSuccess) prev = -1;
    if (cudaSetDevice(ordinal) == cudaSuccess) {
        ncclResult_t r = ncclCommDestroy(n->comm);
        if (r != ncclSuccess) STRATA_WARN("comm", "ncclCommDestroy failed: %s", ncclGetErrorString(r));
    }
    free_parts(n, WATCH_SLOTS);
    if (prev >= 0 && prev != ordinal) cudaSetDevice(prev);
}

/* ---- collectives ---- */

static ncclResult_t nccl_call(strata_nccl *n, strata_coll_kind kind, void *out, const void *in, size_t count,
                              int bf16, int root, cudaStream_t cu) {
    ncclDataType_t sum_type = bf16 ? ncclBfloat16 : ncclFloat32;
    switch (kind) {
    case STRATA_COLL_ALLREDUCE: return ncclAllReduce(out, out, count, sum_type, ncclSum, n->comm, cu);
    /* in place when out == in + rank * count, which NCCL handles */
    case STRATA_COLL_REDUCE_SCATTER: return ncclReduceScatter(in, out, count, sum_type, ncclSum, n->comm, cu);
    /* in place when in == out + rank * count */
    case STRATA_COLL_ALLGATHER: return ncclAllGather(in, out, count, ncclInt8, n->comm, cu);
    case STRATA_COLL_BROADCAST: return ncclBroadcast(out, out, count, ncclInt8, root, n->comm, cu);
    case STRATA_COLL_BARRIER: return ncclAllReduce(n->one, n->one, 1, ncclFloat32, ncclSum, n->comm, cu);
    case STRATA_COLL_KINDS: break;
    }
    return ncclInvalidArgument;
}

extern "C" int strata_nccl_enqueue(strata_nccl *n, strata_coll_kind kind, void *out, const void *in, size_t count,
                                   int bf16, int root, uint64_t full_bytes) {
    if (count == 0 && kind != STRATA_COLL_BARRIER) return 0; /* every rank skips it alike */
    cudaStream_t cu = strata_cuda_stream_handle(n->stream);
    pthread_mutex_lock(&n->enq_mu);
    pthread_mutex_lock(&n->mu);
    while (n->count == WATCH_SLOTS) pthread_cond_wait(&n->cv, &n->mu);
    watch_entry *e = &n->ring[(n->head + n->count) % WATCH_SLOTS]; /* free until published */
    pthread_mutex_unlock(&n->mu);

    int rc = 0;
    cudaError_t ce = cudaEventRecord(e->start, cu);
    ncclResult_t r = ce == cudaSuccess ? nccl_call(n, kind, out, in, count, bf16, root, cu) : ncclSuccess;
    if (ce == cudaSuccess && r == ncclSuccess) ce = cudaEventRecord(e->end, cu);
    if (ce != cudaSuccess) {
        rc = strata_fail("nccl %s of %llu bytes: cudaEventRecord failed: %s", strata_coll_name(kind),
                         (unsigned long long)full_bytes, cudaGetErrorString(ce));
    } else if (r != ncclSuccess) {
        nccl_fail(n, r, strata_coll_name(kind));
        rc = strata_fail_wrap("nccl %s of %llu bytes", strata_coll_name(kind), (unsigned long long)full_bytes);
    } else {
        pthread_mutex_lock(&n->mu);
        e->kind = kind;
        e->bytes = full_bytes;
        n->count++;
        pthread_cond_broadcast(&n->cv);
        pthread_mutex_unlock(&n->mu);
    }
    pthread_mutex_unlock(&n->enq_mu);
    return rc;
}
