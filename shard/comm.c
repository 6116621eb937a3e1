/* shard/comm.c: the choice of backend, and the "single" and "mpi" collective backends (the "nccl" one's NCCL half is shard/comm_nccl.cu).
 *
 * A collective call validates its buffers, counts itself, and enqueues on the comm
 * stream; it returns before any data moves. On the mpi backend the stream's worker
 * thread starts the non-blocking MPI call and polls MPI_Test until it completes or
 * comm.timeout_s passes, in which case the whole job is aborted with a message rather
 * than left hanging on a rank that died.
 *
 * MPI takes int counts, so a buffer of more than `chunk_elems` elements goes out in
 * pieces. A reduce-scatter or all-gather whose full buffer is too large for one call
 * runs as one reduce (or broadcast) per rank's block instead; that moves the same bytes
 * and leaves the rest of the input untouched. A reduce-scatter whose output aliases its
 * own block of the input (which MPI_IN_PLACE cannot express: MPI's in-place result
 * lands at the start of the buffer) reduces into a scratch block, or in the per-block
 * form roots its own block's reduce in place.
 *
 * On device memory (which this MPI cannot read), and between several ranks on host
 * memory, the worker stages every piece through a pinned buffer allocated at open; see
 * "staged" below and setup_stage. */
#include "shard/comm.h"

#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/common.h"
#include "shard/comm_nccl.h"
#include "shard/peers.h"

/* MPI has no bf16 sum: made with the first mpi comm (below); MPI_Finalize releases it. */
static MPI_Op bf16_sum_op = MPI_OP_NULL;

/* One MPI call on a collective's behalf (t): under the thread-level lock, and a failure
 * aborts the job naming the call and the collective (check_mpi, below). */
#define COMM_MPI(t, fn, ...)                                                               \
    do {                                                                                   \
        strata_mpi_enter();                                                                \
        int comm_mpi_rc_ = fn(__VA_ARGS__);                                                \
        strata_mpi_leave();                                                                \
        check_mpi((t), comm_mpi_rc_, #fn);                                                 \
    } while (0)

/* ---- the comm object ---- */

typedef enum comm_elem { ELEM_F32, ELEM_F64, ELEM_BYTE, ELEM_BF16 } comm_elem;

static size_t elem_size(comm_elem e) { return e == ELEM_F32 ? 4 : e == ELEM_F64 ? 8 : e == ELEM_BF16 ? 2 : 1; }

/* MPI has no bf16: it travels as 16-bit words and sums through a user op that adds in
 * fp32 and rounds back to bf16 (to nearest even), as NCCL's bf16 sum does. */
static void bf16_sum(void *in, void *inout, int *len, MPI_Datatype *type) {
    (void)type;
    const uint16_t *a = in;
    uint16_t *b = inout;
    for (int i = 0; i < *len; i++) b[i] = strata_f32_to_bf16(strata_bf16_to_f32(a[i]) + strata_bf16_to_f32(b[i]));
}
static MPI_Op elem_sum(comm_elem e) { return e == ELEM_BF16 ? bf16_sum_op : MPI_SUM; }
static MPI_Datatype elem_mpi(comm_elem e) {
    return e == ELEM_F32 ? MPI_FLOAT : e == ELEM_F64 ? MPI_DOUBLE : e == ELEM_BF16 ? MPI_UINT16_T : MPI_BYTE;
}

typedef struct comm_ops comm_ops;

/* One collective. submit() fills one on its stack; a backend that needs it after the
 * call returns (the mpi worker, the single backend's trace) copies it into a record from
 * the comm's free list, which its last task gives back. */
typedef struct coll_task {
    strata_comm *c;
    strata_coll_kind kind;
    comm_elem elem;
    void *out;
    const void *in;
    size_t count; /* elements of `elem`: total (all-reduce, broadcast) or per rank */
    int root;
    int aliased; /* out is this rank's block of in (reduce-scatter, all-gather) */
    int host;    /* the buffer is host memory (the f64 agreement): never staged */
    double start_ms;
    struct coll_task *next_free;
} coll_task;

struct strata_comm {
    const comm_ops *ops;
    strata_device *d;
    strata_stream *stream;
    int owns_stream; /* opened by strata_comm_open_config / _local: destroyed at close */
    double timeout_s;
    int rank, world;
    size_t chunk_elems; /* the most elements one MPI call carries */

    MPI_Comm mpi;          /* mpi backend and nccl's host agreement: a dup of MPI_COMM_WORLD */
    MPI_Request *requests; /* (world): one per rank for the per-block fallbacks */
    char *scratch;         /* reduce-scatter in place: the reduced block lands here first */
    size_t scratch_n;      /* bytes */

    /* mpi backend on buffers MPI cannot read (device memory): everything goes through
     * `stage`, pinned, copied on stage_stream by the comm stream's worker. */
    unsigned char *stage;
    size_t stage_bytes;
    strata_stream *stage_stream;

    struct strata_nccl *nccl; /* nccl backend (shard/comm_nccl.cu) */

    pthread_mutex_t mu; /* guards stats, the span trace and the task free list */
    strata_comm_stats stats;
    strata_comm_span *spans;
    int span_cap, span_n, tracing;
    coll_task *free_tasks;
    int n_tasks; /* records made so far; all on the free list when the stream is idle */
};

/* A backend: what it can do, which opening reads instead of its name, and how it moves
 * data (validation and counting are shared). */
struct comm_ops {
    const char *name;
    /* talks MPI: opening duplicates MPI_COMM_WORLD when MPI is active */
    int uses_mpi;
    /* its collectives are device work (copies, NCCL kernels): where the device's memory is
     * not the host's they run on a DEVICE stream, so other streams meet them through the
     * device's own events; the mpi backend's worker is always a HOST stream */
    int device_stream;
    /* the rest of opening, after the shared part (NULL: nothing) */
    int (*setup)(strata_comm *c);
    int (*enqueue)(strata_comm *c, const coll_task *req);
};

/* The full buffer size S of the header's accounting. */
static uint64_t task_full_bytes(const coll_task *t) {
    uint64_t per = (uint64_t)t->count * elem_size(t->elem);
    if (t->kind == STRATA_COLL_REDUCE_SCATTER || t->kind == STRATA_COLL_ALLGATHER)
        return per * (uint64_t)t->c->world;
    return per;
}

static void span_add(strata_comm *c, strata_coll_kind kind, double start_ms, double end_ms) {
    pthread_mutex_lock(&c->mu);
    if (c->tracing && c->span_n < c->span_cap)
        c->spans[c->span_n++] = (strata_comm_span){kind, start_ms, end_ms};
    pthread_mutex_unlock(&c->mu);
}

static int tracing_on(strata_comm *c) {
    pthread_mutex_lock(&c->mu);
    int on = c->tracing;
    pthread_mutex_unlock(&c->mu);
    return on;
}

/* A record for a collective that outlives its call: reused, so once the deepest queue
 * of a run has been seen, steps allocate nothing. */
static coll_task *task_get(strata_comm *c, const coll_task *req) {
    pthread_mutex_lock(&c->mu);
    coll_task *t = c->free_tasks;
    if (t) c->free_tasks = t->next_free;
    else c->n_tasks++;
    pthread_mutex_unlock(&c->mu);
    if (!t) t = strata_xmalloc(sizeof *t);
    *t = *req;
    return t;
}

static void task_put(strata_comm *c, coll_task *t) {
    pthread_mutex_lock(&c->mu);
    t->next_free = c->free_tasks;
    c->free_tasks = t;
    pthread_mutex_unlock(&c->mu);
}

/* ---- mpi backend: runs on the comm stream's worker ---- */

static _Noreturn void coll_abort(const coll_task *t, const char *why) {
    size_t n = strlen(why);
    int sentences = n > 0 && why[n - 1] == '.'; /* a report of lost ranks ends in a sentence of its own */
    strata_log(STRATA_LOG_ERROR, "comm", "%s of %llu bytes %s%s", strata_coll_name(t->kind),
               (unsigned long long)task_full_bytes(t), why, sentences ? " Aborting the job." : ": aborting the job");
    strata_mpi_enter();
    if (strata_mpi_active()) MPI_Abort(MPI_COMM_WORLD, 1);
    exit(1);
}

static void check_mpi(const coll_task *t, int rc, const char *call) {
    if (rc == MPI_SUCCESS) return;
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    char why[MPI_MAX_ERROR_STRING + 64];
    snprintf(why, sizeof why, "failed in %s: %s", call, msg);
    coll_abort(t, why);
}

/* How long a timed-out collective asks after the other ranks: long enough for a connect
 * across a slow network, short against the timeout itself. */
static int peers_wait_ms(double timeout_s) {
    double ms = timeout_s * 250;
    return ms < 500 ? 500 : ms > 3000 ? 3000 : (int)ms;
}

/* Polls until every request is done. Spinning briefly keeps small collectives fast;
 * after that a 20 us sleep leaves the core to compute threads. */
static void wait_requests(const coll_task *t, MPI_Request *req, int n) {
    const double deadline = t->start_ms + t->c->timeout_s * 1e3;
    const struct timespec nap = {0, 20000};
    for (long spins = 0;; spins++) {
        int pending = 0;
        for (int i = 0; i < n; i++) {
            if (req[i] == MPI_REQUEST_NULL) continue;
            int flag = 0;
            COMM_MPI(t, MPI_Test, &req[i], &flag, MPI_STATUS_IGNORE);
            pending += !flag;
        }
        if (!pending) return;
        if (strata_now_ms() > deadline) {
            /* who is gone, by host, if a probe can tell (shard/peers.h), and the launcher's note */
            static char why[4096];
            size_t o = (size_t)snprintf(why, sizeof why, "did not complete within %g s", t->c->timeout_s);
            if (strata_peers_world() > 1) strata_peers_explain(why, &o, sizeof why, peers_wait_ms(t->c->timeout_s));
            else strata_peers_puts(why, &o, sizeof why, "; another rank probably failed");
            coll_abort(t, why);
        }
        if (spins > 64) nanosleep(&nap, NULL);
    }
}

static void run_allreduce(coll_task *t) {
    strata_comm *c = t->c;
    size_t es = elem_size(t->elem);
    for (size_t off = 0; off < t->count; off += c->chunk_elems) {
        int n = (int)strata_min_size(c->chunk_elems, t->count - off);
        COMM_MPI(t, MPI_Iallreduce, MPI_IN_PLACE, (char *)t->out + off * es, n, elem_mpi(t->elem), elem_sum(t->elem),
                 c->mpi, &c->requests[0]);
        wait_requests(t, c->requests, 1);
    }
}

static void run_reduce_scatter(coll_task *t) {
    strata_comm *c = t->c;
    const char *in = t->in;
    char *out = t->out;
    size_t n = t->count, W = (size_t)c->world, es = elem_size(t->elem);
    MPI_Datatype type = elem_mpi(t->elem);
    if (n * W <= c->chunk_elems) {
        /* In place, out is a block of in: reduce into scratch, then copy, so MPI never sees
         * overlapping buffers and the other blocks of in stay as they were. The scratch
         * grows to the largest unit once and is reused: steady-state steps allocate nothing. */
        char *dst = out;
        if (t->aliased) {
            if (c->scratch_n < n * es) {
                c->scratch = strata_xrealloc(c->scratch, n * es);
                c->scratch_n = n * es;
            }
            dst = c->scratch;
        }
        COMM_MPI(t, MPI_Ireduce_scatter_block, in, dst, (int)n, type, elem_sum(t->elem), c->mpi, &c->requests[0]);
        wait_requests(t, c->requests, 1);
        if (t->aliased) memcpy(out, dst, n * es);
        return;
    }
    /* One reduce per block, rooted at the block's owner, chunk by chunk. */
    for (size_t off = 0; off < n; off += c->chunk_elems) {
        int cnt = (int)strata_min_size(c->chunk_elems, n - off);
        for (int r = 0; r < c->world; r++) {
            const void *send = in + ((size_t)r * n + off) * es;
            void *recv = NULL;
            if (r == c->rank) {
                recv = out + off * es;
                if (t->aliased) send = MPI_IN_PLACE;
            }
            COMM_MPI(t, MPI_Ireduce, send, recv, cnt, type, elem_sum(t->elem), r, c->mpi, &c->requests[r]);
        }
        wait_requests(t, c->requests, c->world);
    }
}

static void run_allgather(coll_task *t) {
    strata_comm *c = t->c;
    char *out = t->out;
    size_t b = t->count, W = (size_t)c->world;
    if (b * W <= c->chunk_elems) {
        COMM_MPI(t, MPI_Iallgather, t->aliased ? MPI_IN_PLACE : t->in, (int)b, MPI_BYTE, out, (int)b, MPI_BYTE,
                 c->mpi, &c->requests[0]);
        wait_requests(t, c->requests, 1);
        return;
    }
    /* Each rank broadcasts its own block into place, chunk by chunk. */
    if (!t->aliased) memcpy(out + (size_t)c->rank * b, t->in, b);
    for (size_t off = 0; off < b; off += c->chunk_elems) {
        int cnt = (int)strata_min_size(c->chunk_elems, b - off);
        for (int r = 0; r < c->world; r++) {
            COMM_MPI(t, MPI_Ibcast, out + (size_t)r * b + off, cnt, MPI_BYTE, r, c->mpi, &c->requests[r]);
        }
        wait_requests(t, c->requests, c->world);
    }
}

static void run_broadcast(coll_task *t) {
    strata_comm *c = t->c;
    for (size_t off = 0; off < t->count; off += c->chunk_elems) {
        int cnt = (int)strata_min_size(c->chunk_elems, t->count - off);
        COMM_MPI(t, MPI_Ibcast, (char *)t->out + off, cnt, MPI_BYTE, t->root, c->mpi, &c->requests[0]);
        wait_requests(t, c->requests, 1);
    }
}

static void run_barrier(coll_task *t) {
    COMM_MPI(t, MPI_Ibarrier, t->c->mpi, &t->c->requests[0]);
    wait_requests(t, t->c->requests, 1);
}

/* ---- mpi backend, staged: MPI sees only the pinned staging buffer ----
 *
 * Each piece is copied in (on stage_stream, waited for), reduced or exchanged in place in
 * the staging buffer, and copied out. A reduce-scatter stages the same slice of every
 * rank's block (W copies per chunk) and receives into the space after them; an
 * all-gather stages this rank's slice at its place and copies the W slices out. Reads
 * of a chunk finish before its writes, and a chunk writes only what later chunks do not
 * read, so the aliased forms need no scratch. */

static void stage_copy(const coll_task *t, void *dst, const void *src, size_t bytes) {
    strata_comm *c = t->c;
    if (strata_memcpy_async(c->d, c->stage_stream, dst, src, bytes) == 0) return;
    char why[600];
    snprintf(why, sizeof why, "failed to stage %zu bytes through pinned memory: %s", bytes, strata_error());
    coll_abort(t, why);
}

static void stage_wait(const coll_task *t) {
    strata_comm *c = t->c;
    if (strata_stream_sync(c->d, c->stage_stream) == 0) return;
    char why[600];
    snprintf(why, sizeof why, "failed waiting for its staging copies: %s", strata_error());
    coll_abort(t, why);
}

static void staged_allreduce(coll_task *t) {
    strata_comm *c = t->c;
    size_t es = elem_size(t->elem), k = strata_min_size(c->chunk_elems, c->stage_bytes / es);
    char *buf = t->out;
    for (size_t off = 0; off < t->count; off += k) {
        size_t n = strata_min_size(k, t->count - off);
        stage_copy(t, c->stage, buf + off * es, n * es);
        stage_wait(t);
        COMM_MPI(t, MPI_Iallreduce, MPI_IN_PLACE, c->stage, (int)n, elem_mpi(t->elem), elem_sum(t->elem), c->mpi,
                 &c->requests[0]);
        wait_requests(t, c->requests, 1);
        stage_copy(t, buf + off * es, c->stage, n * es);
        stage_wait(t);
    }
}

/* Per-rank elements of one staged chunk: `slots` of them fit the staging buffer, and
 * the W of one MPI call stay within chunk_elems (at least one, whatever the limit). */
static size_t stage_chunk(const strata_comm *c, size_t elem, size_t slots) {
    size_t k = strata_min_size(c->stage_bytes / (elem * slots), c->chunk_elems / (size_t)c->world);
    return k ? k : 1;
}

static void staged_reduce_scatter(coll_task *t) {
    strata_comm *c = t->c;
    const char *in = t->in;
    char *out = t->out;
    size_t es = elem_size(t->elem);
    size_t n = t->count, W = (size_t)c->world, k = stage_chunk(c, es, W + 1);
    for (size_t off = 0; off < n; off += k) {
        size_t m = strata_min_size(k, n - off);
        char *st_in = (char *)c->stage, *st_out = st_in + W * m * es; /* (W, m) then (m) */
        for (size_t r = 0; r < W; r++) stage_copy(t, st_in + r * m * es, in + (r * n + off) * es, m * es);
        stage_wait(t);
        COMM_MPI(t, MPI_Ireduce_scatter_block, st_in, st_out, (int)m, elem_mpi(t->elem), elem_sum(t->elem), c->mpi,
                 &c->requests[0]);
        wait_requests(t, c->requests, 1);
        stage_copy(t, out + off * es, st_out, m * es);
        stage_wait(t);
    }
}

static void staged_allgather(coll_task *t) {
    strata_comm *c = t->c;
    char *out = t->out;
    const char *in = t->in;
    size_t b = t->count, W = (size_t)c->world, R = (size_t)c->rank, k = stage_chunk(c, 1, W);
    for (size_t off = 0; off < b; off += k) {
        size_t m = strata_min_size(k, b - off);
        stage_copy(t, c->stage + R * m, in + off, m);
        stage_wait(t);
        COMM_MPI(t, MPI_Iallgather, MPI_IN_PLACE, (int)m, MPI_BYTE, c->stage, (int)m, MPI_BYTE, c->mpi,
                 &c->requests[0]);
        wait_requests(t, c->requests, 1);
        for (size_t r = 0; r < W; r++)
            if (r != R || !t->aliased) stage_copy(t, out + r * b + off, c->stage + r * m, m);
        stage_wait(t);
    }
}

static void staged_broadcast(coll_task *t) {
    strata_comm *c = t->c;
    char *buf = t->out;
    int is_root = t->root == c->rank;
    size_t k = strata_min_size(c->chunk_elems, c->stage_bytes);
    for (size_t off = 0; off < t->count; off += k) {
        size_t m = strata_min_size(k, t->count - off);
        if (is_root) {
            stage_copy(t, c->stage, buf + off, m);
            stage_wait(t);
        }
        COMM_MPI(t, MPI_Ibcast, c->stage, (int)m, MPI_BYTE, t->root, c->mpi, &c->requests[0]);
        wait_requests(t, c->requests, 1);
        if (!is_root) {
            stage_copy(t, buf + off, c->stage, m);
            stage_wait(t);
        }
    }
}

static void mpi_task(void *arg) {
    coll_task *t = arg;
    strata_comm *c = t->c;
    int staged = c->stage && !t->host;
    t->start_ms = strata_now_ms();
    switch (t->kind) {
    case STRATA_COLL_ALLREDUCE: staged ? staged_allreduce(t) : run_allreduce(t); break;
    case STRATA_COLL_REDUCE_SCATTER: staged ? staged_reduce_scatter(t) : run_reduce_scatter(t); break;
    case STRATA_COLL_ALLGATHER: staged ? staged_allgather(t) : run_allgather(t); break;
    case STRATA_COLL_BROADCAST: staged ? staged_broadcast(t) : run_broadcast(t); break;
    case STRATA_COLL_BARRIER: run_barrier(t); break;
    case STRATA_COLL_KINDS: break;
    }
    span_add(c, t->kind, t->start_ms, strata_now_ms());
    task_put(c, t);
}

static int mpi_enqueue(strata_comm *c, const coll_task *req) {
    coll_task *t = task_get(c, req);
    if (strata_host_task(c->d, c->stream, mpi_task, t)) {
        task_put(c, t);
        return -1;
    }
    return 0;
}

/* ---- single backend: world 1, collectives are copies or nothing ---- */

static void single_span_begin(void *arg) { ((coll_task *)arg)->start_ms = strata_now_ms(); }
static void single_span_end(void *arg) {
    coll_task *t = arg;
    span_add(t->c, t->kind, t->start_ms, strata_now_ms());
    task_put(t->c, t);
}

static int single_enqueue(strata_comm *c, const coll_task *req) {
    /* The copy goes through the device table so it also works on device memory. */
    int copy = !req->aliased && (req->kind == STRATA_COLL_REDUCE_SCATTER || req->kind == STRATA_COLL_ALLGATHER);
    if (!tracing_on(c))
        return copy ? strata_memcpy_async(c->d, c->stream, req->out, req->in, req->count * elem_size(req->elem)) : 0;
    coll_task *t = task_get(c, req);
    if (strata_host_task(c->d, c->stream, single_span_begin, t)) {
        task_put(c, t);
        return -1;
    }
    int rc = copy ? strata_memcpy_async(c->d, c->stream, t->out, t->in, t->count * elem_size(t->elem)) : 0;
    /* Always enqueued once begin was, so the record goes back exactly once. */
    if (strata_host_task(c->d, c->stream, single_span_end, t)) rc = -1;
    return rc;
}

/* ---- nccl backend: collectives on the calling thread, into the DEVICE stream ----
 * shard/comm_nccl.cu speaks NCCL; in a build without NCCL, shard/comm_nccl_stub.c says so. */

static void nccl_done(void *ctx, strata_coll_kind kind, double start_ms, double end_ms) {
    span_add(ctx, kind, start_ms, end_ms);
}

static int nccl_enqueue(strata_comm *c, const coll_task *req) {
    if (!req->host)
        return strata_nccl_enqueue(c->nccl, req->kind, req->out, req->in, req->count, req->elem == ELEM_BF16,
                                   req->root, task_full_bytes(req));
    /* The f64 agreement is small and on host memory: MPI on this thread, after the
     * stream, as the other backends order it. */
    if (strata_stream_sync(c->d, c->stream)) return -1;
    coll_task t = *req;
    t.start_ms = strata_now_ms();
    if (c->mpi != MPI_COMM_NULL) run_allreduce(&t);
    span_add(c, t.kind, t.start_ms, strata_now_ms());
    return 0;
}

/* Rank 0 (or the only rank) makes the id; MPI carries it to the others with a flag
 * saying it was made, so a failure there fails every rank instead of hanging them. */
static int nccl_setup(strata_comm *c) {
    unsigned char id[1 + STRATA_NCCL_ID_BYTES] = {0};
    if (c->rank == 0) id[0] = strata_nccl_unique_id(id + 1) == 0;
    if (c->mpi != MPI_COMM_NULL) {
        strata_mpi_enter();
        int rc = MPI_Bcast(id, (int)sizeof id, MPI_BYTE, 0, c->mpi);
        strata_mpi_leave();
        if (rc != MPI_SUCCESS) return strata_fail("comm.backend nccl: broadcasting the NCCL unique id failed");
    }
    if (!id[0]) {
        if (c->rank == 0) return strata_fail_wrap("comm.backend nccl: making the NCCL unique id");
        return strata_fail("comm.backend nccl: rank 0 could not make the NCCL unique id (see its message)");
    }
    c->nccl = strata_nccl_open(c->stream, c->d->ordinal, id + 1, c->rank, c->world, c->timeout_s, nccl_done, c);
    return c->nccl ? 0 : -1;
}

/* Two ranks on one GPU (NCCL refuses them): sets *a < *b and the GPU's name, the same
 * answer on every rank; returns 0 when every rank has its own GPU. Collective. */
static int shared_gpu(strata_device *d, int *a, int *b, char *which, size_t n) {
    enum { KEY = 192 };
    char key[KEY] = "", bus[64] = "";
    if (strata_nccl_gpu_bus_id(d->ordinal, bus, (int)sizeof bus))
        snprintf(bus, sizeof bus, "cuda:%d", d->ordinal);
    char host[128] = "";
    gethostname(host, sizeof host - 1);
    snprintf(key, sizeof key, "%s/%s", host, bus);
    int world = 1;
    MPI_Comm_size(MPI_COMM_WORLD, &world);
    char *all = strata_xcalloc((size_t)world, KEY);
    strata_mpi_enter();
    int rc = MPI_Allgather(key, KEY, MPI_CHAR, all, KEY, MPI_CHAR, MPI_COMM_WORLD);
    strata_mpi_leave();
    int found = 0;
    for (int i = 0; i < world && !found && rc == MPI_SUCCESS; i++)
        for (int j = i + 1; j < world && !found; j++)
            if (!strncmp(all + (size_t)i * KEY, all + (size_t)j * KEY, KEY)) {
                *a = i;
                *b = j;
                snprintf(which, n, "%s", all + (size_t)i * KEY);
                found = 1;
            }
    free(all);
    return found;
}

/* ---- open / close ---- */

static int env_size(const char *name, long long lo, long long hi, size_t *out) {
    const char *env = getenv(name);
    if (!env) return 0;
    char *end = NULL;
    long long v = strtoll(env, &end, 10);
    if (end == env || *end || v < lo || v > hi)
        return strata_fail("%s=\"%s\": expected an integer in [%lld, %lld]", name, env, lo, hi);
    *out = (size_t)v;
    return 0;
}

/* Frees what a comm holds, however far its open got. The stream must be idle. */
static void comm_destroy(strata_comm *c) {
    strata_nccl_close(c->nccl);
    if (c->mpi != MPI_COMM_NULL) {
        strata_mpi_enter();
        MPI_Comm_free(&c->mpi);
        strata_mpi_leave();
    }
    if (c->stage_stream) strata_stream_destroy(c->d, c->stage_stream);
    if (c->stage) strata_free(c->d, STRATA_MEM_PINNED, c->stage);
    if (c->owns_stream) strata_stream_destroy(c->d, c->stream);
    for (coll_task *t = c->free_tasks, *next; t; t = next) {
        next = t->next_free;
        free(t);
    }
    free(c->scratch);
    free(c->requests);
    free(c->spans);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

static int setup_mpi(strata_comm *c) {
    strata_mpi_enter();
    int rc = MPI_Comm_dup(MPI_COMM_WORLD, &c->mpi);
    if (rc == MPI_SUCCESS && bf16_sum_op == MPI_OP_NULL) rc = MPI_Op_create(bf16_sum, 1, &bf16_sum_op);
    if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(c->mpi, MPI_ERRORS_RETURN);
    if (rc == MPI_SUCCESS) MPI_Comm_rank(c->mpi, &c->rank);
    if (rc == MPI_SUCCESS) MPI_Comm_size(c->mpi, &c->world);
    strata_mpi_leave();
    if (rc != MPI_SUCCESS) {
        char msg[MPI_MAX_ERROR_STRING] = "";
        int len = 0;
        MPI_Error_string(rc, msg, &len);
        return strata_fail("comm open: duplicating MPI_COMM_WORLD failed: %s", msg);
    }
    c->requests = strata_xmalloc((size_t)c->world * sizeof *c->requests);
    for (int r = 0; r < c->world; r++) c->requests[r] = MPI_REQUEST_NULL;
    return 0;
}

/* Staging is on wherever MPI may be handed memory it cannot read (device memory that is
 * not host memory), and between several ranks on host memory too: handed a whole unit,
 * MPI's collectives allocate temporaries as large as the message (Open MPI 4.1 on host
 * buffers: an all-reduce a copy of it on every rank, a reduce-scatter up to W+1 blocks
 * on the rank that roots it, plus our scratch block; docs/benchmarks.md measures it),
 * memory no plan counts; staged, MPI sees pieces of the staging buffer, which the plan
 * counts (strata_comm_pinned_bytes). STRATA_COMM_STAGE=1 stages always, =0 never (an MPI
 * that reads device memory itself; host buffers read directly). */
#define COMM_STAGE_BYTES ((size_t)16 << 20)
static int setup_stage(strata_comm *c) {
    int on = !c->d->caps.host_memory || c->world > 1;
    const char *env = getenv("STRATA_COMM_STAGE");
    if (env) {
        if (strcmp(env, "0") && strcmp(env, "1"))
            return strata_fail("STRATA_COMM_STAGE=\"%s\": expected 0 or 1", env);
        on = env[0] == '1';
    }
    size_t bytes = COMM_STAGE_BYTES;
    if (env_size("STRATA_COMM_STAGE_BYTES", 8LL * (c->world + 1), 1LL << 30, &bytes)) return -1;
    if (!on) return 0;
    c->stage_stream = strata_stream_create(c->d, "comm-stage", STRATA_STREAM_DEVICE);
    if (!c->stage_stream) return strata_fail_wrap("comm open: the staging stream");
    c->stage = strata_alloc(c->d, STRATA_MEM_PINNED, bytes);
    if (!c->stage) return strata_fail_wrap("comm open: %zu bytes of pinned staging memory", bytes);
    c->stage_bytes = bytes;
    return 0;
}

static const comm_ops single_ops = {"single", 0, 1, NULL, single_enqueue};
static const comm_ops mpi_ops = {"mpi", 1, 0, setup_stage, mpi_enqueue};
static const comm_ops nccl_ops = {"nccl", 1, 1, nccl_setup, nccl_enqueue};

static strata_comm *comm_open(strata_device *d, strata_stream *stream, double timeout_s, const comm_ops *ops,
                              int owns_stream) {
    if (!d || !stream) {
        strata_fail("comm open: the %s is NULL", d ? "stream" : "device");
        return NULL;
    }
    strata_comm *c = strata_xcalloc(1, sizeof *c);
    c->ops = ops;
    c->d = d;
    c->stream = stream;
    c->owns_stream = owns_stream;
    c->timeout_s = timeout_s;
    c->rank = 0;
    c->world = 1;
    c->mpi = MPI_COMM_NULL;
    pthread_mutex_init(&c->mu, NULL);
    /* Well below INT_MAX. STRATA_COMM_CHUNK_ELEMS lowers it so tests reach the chunked
     * paths with small buffers. */
    c->chunk_elems = (size_t)1 << 30;
    int rc = 0;
    if (!(timeout_s > 0))
        rc = strata_fail("comm.timeout_s is %g: it must be a positive number of seconds", timeout_s);
    if (!rc) rc = env_size("STRATA_COMM_CHUNK_ELEMS", 1, 1LL << 30, &c->chunk_elems);
    if (!rc && strata_mpi_active() && ops->uses_mpi) rc = setup_mpi(c);
    if (!rc && ops->setup) rc = ops->setup(c);
    if (rc) {
        comm_destroy(c);
        return NULL;
    }
    STRATA_DEBUG("comm", "opened backend %s: rank %d of %d, timeout %g s, %zu bytes of pinned staging",
                 c->ops->name, c->rank, c->world, timeout_s, c->stage_bytes);
    return c;
}

strata_comm *strata_comm_open(strata_device *d, strata_stream *stream, double timeout_s) {
    return comm_open(d, stream, timeout_s, strata_mpi_active() ? &mpi_ops : &single_ops, 0);
}
strata_comm *strata_comm_open_single(strata_device *d, strata_stream *stream) {
    return comm_open(d, stream, 60.0, &single_ops, 0);
}

/* The config's comm.backend, resolved for this device and launch (see comm.h). */
static int choose_backend(strata_device *d, const strata_config *cfg, const comm_ops **out) {
    *out = strata_mpi_active() ? &mpi_ops : &single_ops;
    int a = 0, b = 0;
    char gpu[192];
    if (cfg->comm.backend == STRATA_COMM_NCCL) {
        if (!d->caps.gpu)
            return strata_fail("comm.backend is nccl but the device is %s: NCCL moves GPU buffers only; "
                               "use comm.backend: mpi (or auto)", d->ops->name);
        if (!strata_nccl_available())
            return strata_fail("comm.backend is nccl but this strata was built without NCCL (CMake found no "
                               "libnccl: configure with -DNCCL_LIB=<path to libnccl.so> -DNCCL_INCLUDE_DIR=<dir "
                               "of nccl.h>); or use comm.backend: mpi (or auto)");
        if (strata_mpi_active() && shared_gpu(d, &a, &b, gpu, sizeof gpu))
            return strata_fail("comm.backend is nccl but ranks %d and %d share the GPU %s, which NCCL refuses "
                               "('Duplicate GPU detected'); use comm.backend: mpi (or auto), or one rank per GPU",
                               a, b, gpu);
        *out = &nccl_ops;
        return 0;
    }
    if (!strata_mpi_active() || cfg->comm.backend != STRATA_COMM_AUTO || !d->caps.gpu) return 0;
    if (!strata_nccl_available()) {
        if (strata_log_rank() == 0)
            STRATA_WARN("comm", "comm.backend auto: built without NCCL; using mpi with device buffers staged "
                        "through pinned memory");
        return 0;
    }
    if (!shared_gpu(d, &a, &b, gpu, sizeof gpu)) {
        *out = &nccl_ops;
        return 0;
    }
    if (strata_log_rank() == 0)
        STRATA_INFO("comm", "comm.backend auto: ranks %d and %d share the GPU %s, which NCCL refuses; "
                    "using mpi with device buffers staged through pinned memory", a, b, gpu);
    return 0;
}

/* A comm on a collective stream of its own, of the kind its backend's work needs. */
static strata_comm *open_owned(strata_device *d, const comm_ops *ops, double timeout_s) {
    int device_stream = ops->device_stream && !d->caps.host_memory;
    strata_stream *s = strata_stream_create(d, "comm", device_stream ? STRATA_STREAM_DEVICE : STRATA_STREAM_HOST);
    if (!s) {
        strata_fail_wrap("comm open: the collective stream");
        return NULL;
    }
    return comm_open(d, s, timeout_s, ops, 1);
}

strata_comm *strata_comm_open_config(strata_device *d, const strata_config *cfg) {
    if (!d || !cfg) {
        strata_fail("comm open: the %s is NULL", d ? "config" : "device");
        return NULL;
    }
    const comm_ops *ops;
    if (choose_backend(d, cfg, &ops)) return NULL;
    return open_owned(d, ops, cfg->comm.timeout_s);
}

strata_comm *strata_comm_open_local(strata_device *d) {
    if (!d) {
        strata_fail("comm open: the device is NULL");
        return NULL;
    }
    return open_owned(d, &single_ops, 60.0);
}

void strata_comm_close(strata_comm *c) {
    if (!c) return;
    STRATA_IGNORE(strata_stream_sync(c->d, c->stream)); /* queued tasks still point at c; closing goes on */
    comm_destroy(c);
}

int strata_comm_rank(const strata_comm *c) { return c->rank; }
int strata_comm_world(const strata_comm *c) { return c->world; }
const char *strata_comm_backend_name(const strata_comm *c) { return c->ops->name; }
strata_stream *strata_comm_stream(const strata_comm *c) { return c->stream; }
size_t strata_comm_pinned_bytes(const strata_comm *c) { return c->stage_bytes; }

size_t strata_comm_planned_pinned_bytes(const strata_config *cfg, int world, int gpu) {
    if (world <= 1 || cfg->comm.backend == STRATA_COMM_NCCL) return 0;
    /* comm.backend auto on GPUs is NCCL where built with it (unless ranks share a GPU,
     * which only opening finds) */
    if (gpu && cfg->comm.backend == STRATA_COMM_AUTO && strata_nccl_available()) return 0;
    const char *env = getenv("STRATA_COMM_STAGE");
    if (env && !strcmp(env, "0")) return 0;
    size_t bytes = COMM_STAGE_BYTES;
    if (env_size("STRATA_COMM_STAGE_BYTES", 8LL * (world + 1), 1LL << 30, &bytes)) bytes = COMM_STAGE_BYTES;
    return bytes;
}

int strata_comm_task_records(const strata_comm *c) {
    strata_comm *m = (strata_comm *)c; /* the lock is not part of the logical state */
    pthread_mutex_lock(&m->mu);
    int n = c->n_tasks;
    pthread_mutex_unlock(&m->mu);
    return n;
}

/* ---- the collectives: validate, count, enqueue ---- */

static void count_call(strata_comm *c, strata_coll_kind kind, uint64_t bytes) {
    pthread_mutex_lock(&c->mu);
    c->stats.calls[kind]++;
    c->stats.bytes[kind] += bytes;
    pthread_mutex_unlock(&c->mu);
}

/* Ring-algorithm bytes one rank sends (see comm.h), rounded down. */
static uint64_t ring_bytes(const coll_task *t) {
    uint64_t S = task_full_bytes(t), N = (uint64_t)t->c->world;
    switch (t->kind) {
    case STRATA_COLL_ALLREDUCE: return 2 * (N - 1) * S / N;
    case STRATA_COLL_REDUCE_SCATTER:
    case STRATA_COLL_ALLGATHER: return (N - 1) * S / N;
    case STRATA_COLL_BROADCAST: return N > 1 && t->root == t->c->rank ? S : 0;
    default: return 0;
    }
}

static int submit(strata_comm *c, strata_coll_kind kind, comm_elem elem, void *out,
                  const void *in, size_t count, int root, int aliased) {
    coll_task req = {.c = c, .kind = kind, .elem = elem, .out = out, .in = in, .count = count,
                     .root = root, .aliased = aliased, .host = elem == ELEM_F64};
    count_call(c, kind, ring_bytes(&req));
    return c->ops->enqueue(c, &req);
}

/* 1 when [a, a+an) and [b, b+bn) share a byte. */
static int overlaps(const void *a, size_t an, const void *b, size_t bn) {
    uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;
    return an && bn && x < y + bn && y < x + an;
}

static int total_fits(const strata_comm *c, size_t per_rank, size_t elem, const char *what) {
    if (per_rank > SIZE_MAX / elem / (size_t)c->world)
        return strata_fail("%s of %zu elements per rank x %d ranks: the size overflows", what,
                           per_rank, c->world);
    return 0;
}

/* The element's name in messages: "floats" or "bf16 values". */
static const char *elem_noun(comm_elem e) { return e == ELEM_BF16 ? "bf16 values" : "floats"; }

static int allreduce_elem(strata_comm *c, comm_elem e, void *buf, size_t n) {
    if (n && !buf) return strata_fail("all-reduce of %zu %s: buffer is NULL", n, elem_noun(e));
    return submit(c, STRATA_COLL_ALLREDUCE, e, buf, buf, n, 0, 1);
}

static int reduce_scatter_elem(strata_comm *c, comm_elem e, void *out, const void *in, size_t n_per_rank) {
    size_t es = elem_size(e);
    if (total_fits(c, n_per_rank, es, "reduce-scatter")) return -1;
    if (n_per_rank && (!out || !in))
        return strata_fail("reduce-scatter of %zu %s per rank: %s is NULL", n_per_rank, elem_noun(e),
                           out ? "in" : "out");
    size_t n_all = n_per_rank * (size_t)c->world;
    int aliased = n_per_rank && (const char *)out == (const char *)in + (size_t)c->rank * n_per_rank * es;
    if (!aliased && overlaps(out, n_per_rank * es, in, n_all * es))
        return strata_fail("reduce-scatter of %zu %s per rank on rank %d: out overlaps in "
                           "without being in + rank * n_per_rank",
                           n_per_rank, elem_noun(e), c->rank);
    return submit(c, STRATA_COLL_REDUCE_SCATTER, e, out, in, n_per_rank, 0, aliased);
}

int strata_allreduce(strata_comm *c, float *buf, size_t n) { return allreduce_elem(c, ELEM_F32, buf, n); }
int strata_reduce_scatter(strata_comm *c, float *out, const float *in, size_t n_per_rank) {
    return reduce_scatter_elem(c, ELEM_F32, out, in, n_per_rank);
}
int strata_allreduce_bf16(strata_comm *c, void *buf, size_t n) { return allreduce_elem(c, ELEM_BF16, buf, n); }
int strata_reduce_scatter_bf16(strata_comm *c, void *out, const void *in, size_t n_per_rank) {
    return reduce_scatter_elem(c, ELEM_BF16, out, in, n_per_rank);
}

int strata_allgather(strata_comm *c, void *out, const void *in, size_t bytes_per_rank) {
    if (total_fits(c, bytes_per_rank, 1, "all-gather")) return -1;
    if (bytes_per_rank && (!out || !in))
        return strata_fail("all-gather of %zu bytes per rank: %s is NULL", bytes_per_rank,
                           out ? "in" : "out");
    size_t all = bytes_per_rank * (size_t)c->world;
    int aliased = bytes_per_rank && in == (const char *)out + (size_t)c->rank * bytes_per_rank;
    if (!aliased && overlaps(out, all, in, bytes_per_rank))
        return strata_fail("all-gather of %zu bytes per rank on rank %d: in overlaps out "
                           "without being out + rank * bytes_per_rank",
                           bytes_per_rank, c->rank);
    return submit(c, STRATA_COLL_ALLGATHER, ELEM_BYTE, out, in, bytes_per_rank, 0, aliased);
}

int strata_broadcast(strata_comm *c, void *buf, size_t bytes, int root) {
    if (root < 0 || root >= c->world)
        return strata_fail("broadcast of %zu bytes: root %d is not a rank (world %d)", bytes, root,
                           c->world);
    if (bytes && !buf) return strata_fail("broadcast of %zu bytes: buffer is NULL", bytes);
    return submit(c, STRATA_COLL_BROADCAST, ELEM_BYTE, buf, buf, bytes, root, 1);
}

int strata_barrier(strata_comm *c) {
    return submit(c, STRATA_COLL_BARRIER, ELEM_BYTE, NULL, NULL, 0, 0, 1);
}

int strata_allreduce_host_f64(strata_comm *c, double *buf, int n) {
    if (n < 0 || (n && !buf))
        return strata_fail("host all-reduce of %d doubles: %s", n, n < 0 ? "negative count" : "buffer is NULL");
    if (submit(c, STRATA_COLL_ALLREDUCE, ELEM_F64, buf, buf, (size_t)n, 0, 1)) return -1;
    return strata_stream_sync(c->d, c->stream);
}

/* ---- counters and trace ---- */

strata_comm_stats strata_comm_get_stats(const strata_comm *c) {
    strata_comm *m = (strata_comm *)c; /* the lock is not part of the logical state */
    pthread_mutex_lock(&m->mu);
    strata_comm_stats s = c->stats;
    pthread_mutex_unlock(&m->mu);
    return s;
}

void strata_comm_reset_stats(strata_comm *c) {
    pthread_mutex_lock(&c->mu);
    memset(&c->stats, 0, sizeof c->stats);
    pthread_mutex_unlock(&c->mu);
}

/* capacity > 0 starts a fresh trace; 0 stops recording but keeps what was recorded. */
void strata_comm_trace(strata_comm *c, int capacity) {
    pthread_mutex_lock(&c->mu);
    if (capacity > 0) {
        free(c->spans);
        c->spans = strata_xcalloc((size_t)capacity, sizeof *c->spans);
        c->span_cap = capacity;
        c->span_n = 0;
        c->tracing = 1;
    } else {
        c->tracing = 0;
    }
    pthread_mutex_unlock(&c->mu);
}

int strata_comm_spans(const strata_comm *c, const strata_comm_span **spans) {
    strata_comm *m = (strata_comm *)c;
    pthread_mutex_lock(&m->mu);
    int n = c->span_n;
    if (spans) *spans = c->spans;
    pthread_mutex_unlock(&m->mu);
    return n;
}
