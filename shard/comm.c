/* shard/comm.c: MPI start-up and the "single" and "mpi" collective backends.
 *
 * A collective call validates its buffers, counts itself, and enqueues on the comm
 * stream; it returns before any data moves. On the mpi backend the stream's worker
 * thread starts the non-blocking MPI call and polls MPI_Test until it completes or
 * comm.timeout_s passes, in which case the whole job is aborted with a message rather
 * than left hanging on a rank that died.
 *
 * MPI takes int counts, so a buffer of more than `chunk_elems` elements goes out in
 * pieces. A reduce-scatter or all-gather whose full buffer is too large for one call,
 * and a reduce-scatter whose output aliases its own block of the input (which
 * MPI_IN_PLACE cannot express: MPI's in-place result lands at the start of the buffer),
 * run as one reduce (or broadcast) per rank's block instead; that moves the same bytes
 * and leaves the rest of the input untouched. */
#include "shard/comm.h"

#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/common.h"

/* ---- process-wide MPI state ---- */

static int mpi_is_active = 0;
static int mpi_thread_level = MPI_THREAD_SINGLE;
/* Below MPI_THREAD_MULTIPLE, two comm streams must not call MPI at the same time. */
static pthread_mutex_t mpi_lock = PTHREAD_MUTEX_INITIALIZER;

static void mpi_enter(void) {
    if (mpi_thread_level < MPI_THREAD_MULTIPLE) pthread_mutex_lock(&mpi_lock);
}
static void mpi_leave(void) {
    if (mpi_thread_level < MPI_THREAD_MULTIPLE) pthread_mutex_unlock(&mpi_lock);
}

static const char *thread_level_name(int level) {
    switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    }
    return "an unknown MPI thread level";
}

static int launched_by_mpirun(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

int strata_mpi_init(int *argc, char ***argv, int *rank, int *world, int *local_rank) {
    *rank = 0;
    *world = 1;
    *local_rank = 0;
    if (!launched_by_mpirun()) return 0;

    int initialized = 0, provided = MPI_THREAD_SINGLE;
    MPI_Initialized(&initialized);
    if (initialized) {
        MPI_Query_thread(&provided);
    } else if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
        return strata_fail("MPI_Init_thread failed; check the mpirun command line and that "
                           "strata was built against the same MPI as that mpirun");
    }
    if (provided < MPI_THREAD_SERIALIZED) {
        if (!initialized) MPI_Finalize();
        return strata_fail("this MPI provides only %s; strata drives collectives from a worker "
                           "thread and needs at least MPI_THREAD_SERIALIZED (use an MPI built "
                           "with thread support)", thread_level_name(provided));
    }
    mpi_thread_level = provided;
    mpi_is_active = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, world);

    const char *lr = getenv("OMPI_COMM_WORLD_LOCAL_RANK");
    char *end = NULL;
    long v = lr ? strtol(lr, &end, 10) : -1;
    if (lr && end != lr && *end == 0 && v >= 0 && v < INT_MAX) {
        *local_rank = (int)v;
    } else {
        /* Not Open MPI: the ranks sharing this node's memory are this node's ranks. */
        MPI_Comm node;
        MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, *rank, MPI_INFO_NULL, &node);
        MPI_Comm_rank(node, local_rank);
        MPI_Comm_free(&node);
    }
    return 0;
}

void strata_mpi_finalize(void) {
    if (!mpi_is_active) return;
    mpi_is_active = 0;
    MPI_Finalize();
}

int strata_mpi_active(void) { return mpi_is_active; }

_Noreturn void strata_mpi_abort(int code) {
    fflush(stdout);
    fflush(stderr);
    if (mpi_is_active) MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}

/* ---- the comm object ---- */

typedef enum comm_elem { ELEM_F32, ELEM_F64, ELEM_BYTE } comm_elem;

static size_t elem_size(comm_elem e) { return e == ELEM_F32 ? 4 : e == ELEM_F64 ? 8 : 1; }
static MPI_Datatype elem_mpi(comm_elem e) {
    return e == ELEM_F32 ? MPI_FLOAT : e == ELEM_F64 ? MPI_DOUBLE : MPI_BYTE;
}

typedef struct comm_ops comm_ops;

struct strata_comm {
    float *scratch; /* reduce-scatter in place: the reduced block lands here first */
    size_t scratch_n;
    const comm_ops *ops;
    strata_device *d;
    strata_stream *stream;
    double timeout_s;
    int rank, world;
    size_t chunk_elems; /* the most elements one MPI call carries */

    MPI_Comm mpi;          /* mpi backend: a dup of MPI_COMM_WORLD */
    MPI_Request *requests; /* (world): one per rank for the per-block fallbacks */

    pthread_mutex_t mu; /* guards stats and the span trace */
    strata_comm_stats stats;
    strata_comm_span *spans;
    int span_cap, span_n, tracing;
};

/* One enqueued collective, owned by the stream until its task frees it. */
typedef struct coll_task {
    strata_comm *c;
    strata_coll_kind kind;
    comm_elem elem;
    void *out;
    const void *in;
    size_t count; /* elements of `elem`: total (all-reduce, broadcast) or per rank */
    int root;
    int aliased; /* out is this rank's block of in (reduce-scatter, all-gather) */
    double start_ms;
} coll_task;

/* Each backend enqueues the data movement; validation and counting are shared. */
struct comm_ops {
    const char *name;
    int (*enqueue)(strata_comm *c, coll_task *t);
};

const char *strata_coll_name(strata_coll_kind k) {
    switch (k) {
    case STRATA_COLL_ALLREDUCE: return "all-reduce";
    case STRATA_COLL_REDUCE_SCATTER: return "reduce-scatter";
    case STRATA_COLL_ALLGATHER: return "all-gather";
    case STRATA_COLL_BROADCAST: return "broadcast";
    case STRATA_COLL_BARRIER: return "barrier";
    case STRATA_COLL_KINDS: break;
    }
    return "unknown collective";
}

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

/* ---- mpi backend: runs on the comm stream's worker ---- */

static _Noreturn void coll_abort(const coll_task *t, const char *why) {
    strata_log(STRATA_LOG_ERROR, "comm", "%s of %llu bytes %s: aborting the job",
               strata_coll_name(t->kind), (unsigned long long)task_full_bytes(t), why);
    mpi_enter();
    MPI_Abort(MPI_COMM_WORLD, 1);
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
            mpi_enter();
            int rc = MPI_Test(&req[i], &flag, MPI_STATUS_IGNORE);
            mpi_leave();
            check_mpi(t, rc, "MPI_Test");
            pending += !flag;
        }
        if (!pending) return;
        if (strata_now_ms() > deadline) {
            char why[160];
            snprintf(why, sizeof why, "did not complete within %g s; another rank probably failed",
                     t->c->timeout_s);
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
        mpi_enter();
        int rc = MPI_Iallreduce(MPI_IN_PLACE, (char *)t->out + off * es, n, elem_mpi(t->elem),
                                MPI_SUM, c->mpi, &c->requests[0]);
        mpi_leave();
        check_mpi(t, rc, "MPI_Iallreduce");
        wait_requests(t, c->requests, 1);
    }
}

static void run_reduce_scatter(coll_task *t) {
    strata_comm *c = t->c;
    const float *in = t->in;
    float *out = t->out;
    size_t n = t->count, W = (size_t)c->world;
    if (n * W <= c->chunk_elems) {
        /* In place, out is a block of in: reduce into scratch, then copy, so MPI never sees
         * overlapping buffers and the other blocks of in stay as they were. The scratch
         * grows to the largest unit once and is reused: steady-state steps allocate nothing. */
        float *dst = out;
        if (t->aliased) {
            if (c->scratch_n < n) {
                c->scratch = strata_xrealloc(c->scratch, n * sizeof(float));
                c->scratch_n = n;
            }
            dst = c->scratch;
        }
        mpi_enter();
        int rc = MPI_Ireduce_scatter_block(in, dst, (int)n, MPI_FLOAT, MPI_SUM, c->mpi, &c->requests[0]);
        mpi_leave();
        check_mpi(t, rc, "MPI_Ireduce_scatter_block");
        wait_requests(t, c->requests, 1);
        if (t->aliased) memcpy(out, dst, n * sizeof(float));
        return;
    }
    /* One reduce per block, rooted at the block's owner, chunk by chunk. */
    for (size_t off = 0; off < n; off += c->chunk_elems) {
        int cnt = (int)strata_min_size(c->chunk_elems, n - off);
        for (int r = 0; r < c->world; r++) {
            const void *send = in + (size_t)r * n + off;
            void *recv = NULL;
            if (r == c->rank) {
                recv = out + off;
                if (t->aliased) send = MPI_IN_PLACE;
            }
            mpi_enter();
            int rc = MPI_Ireduce(send, recv, cnt, MPI_FLOAT, MPI_SUM, r, c->mpi, &c->requests[r]);
            mpi_leave();
            check_mpi(t, rc, "MPI_Ireduce");
        }
        wait_requests(t, c->requests, c->world);
    }
}

static void run_allgather(coll_task *t) {
    strata_comm *c = t->c;
    char *out = t->out;
    size_t b = t->count, W = (size_t)c->world;
    if (b * W <= c->chunk_elems) {
        mpi_enter();
        int rc = MPI_Iallgather(t->aliased ? MPI_IN_PLACE : t->in, (int)b, MPI_BYTE, out, (int)b,
                                MPI_BYTE, c->mpi, &c->requests[0]);
        mpi_leave();
        check_mpi(t, rc, "MPI_Iallgather");
        wait_requests(t, c->requests, 1);
        return;
    }
    /* Each rank broadcasts its own block into place, chunk by chunk. */
    if (!t->aliased) memcpy(out + (size_t)c->rank * b, t->in, b);
    for (size_t off = 0; off < b; off += c->chunk_elems) {
        int cnt = (int)strata_min_size(c->chunk_elems, b - off);
        for (int r = 0; r < c->world; r++) {
            mpi_enter();
            int rc = MPI_Ibcast(out + (size_t)r * b + off, cnt, MPI_BYTE, r, c->mpi, &c->requests[r]);
            mpi_leave();
            check_mpi(t, rc, "MPI_Ibcast");
        }
        wait_requests(t, c->requests, c->world);
    }
}

static void run_broadcast(coll_task *t) {
    strata_comm *c = t->c;
    for (size_t off = 0; off < t->count; off += c->chunk_elems) {
        int cnt = (int)strata_min_size(c->chunk_elems, t->count - off);
        mpi_enter();
        int rc = MPI_Ibcast((char *)t->out + off, cnt, MPI_BYTE, t->root, c->mpi, &c->requests[0]);
        mpi_leave();
        check_mpi(t, rc, "MPI_Ibcast");
        wait_requests(t, c->requests, 1);
    }
}

static void run_barrier(coll_task *t) {
    mpi_enter();
    int rc = MPI_Ibarrier(t->c->mpi, &t->c->requests[0]);
    mpi_leave();
    check_mpi(t, rc, "MPI_Ibarrier");
    wait_requests(t, t->c->requests, 1);
}

static void mpi_task(void *arg) {
    coll_task *t = arg;
    t->start_ms = strata_now_ms();
    switch (t->kind) {
    case STRATA_COLL_ALLREDUCE: run_allreduce(t); break;
    case STRATA_COLL_REDUCE_SCATTER: run_reduce_scatter(t); break;
    case STRATA_COLL_ALLGATHER: run_allgather(t); break;
    case STRATA_COLL_BROADCAST: run_broadcast(t); break;
    case STRATA_COLL_BARRIER: run_barrier(t); break;
    case STRATA_COLL_KINDS: break;
    }
    span_add(t->c, t->kind, t->start_ms, strata_now_ms());
    free(t);
}

static int mpi_enqueue(strata_comm *c, coll_task *t) {
    if (strata_host_task(c->d, c->stream, mpi_task, t)) {
        free(t);
        return -1;
    }
    return 0;
}

static const comm_ops mpi_ops = {"mpi", mpi_enqueue};

/* ---- single backend: world 1, collectives are copies or nothing ---- */

static void single_span_begin(void *arg) { ((coll_task *)arg)->start_ms = strata_now_ms(); }
static void single_span_end(void *arg) {
    coll_task *t = arg;
    span_add(t->c, t->kind, t->start_ms, strata_now_ms());
    free(t);
}

static int single_enqueue(strata_comm *c, coll_task *t) {
    /* The copy goes through the device table so it also works on device memory. */
    int traced = tracing_on(c);
    if (traced && strata_host_task(c->d, c->stream, single_span_begin, t)) {
        free(t);
        return -1;
    }
    int rc = 0;
    if (!t->aliased && (t->kind == STRATA_COLL_REDUCE_SCATTER || t->kind == STRATA_COLL_ALLGATHER))
        rc = strata_memcpy_async(c->d, c->stream, t->out, t->in, t->count * elem_size(t->elem));
    if (traced) {
        /* Always enqueued once begin was, so the task is freed exactly once. */
        if (strata_host_task(c->d, c->stream, single_span_end, t)) rc = -1;
    } else {
        free(t);
    }
    return rc;
}

static const comm_ops single_ops = {"single", single_enqueue};

/* ---- open / close ---- */

static strata_comm *comm_open(strata_device *d, strata_stream *stream, double timeout_s, int single) {
    if (!d || !stream) {
        strata_fail("comm open: the %s is NULL", d ? "stream" : "device");
        return NULL;
    }
    if (!(timeout_s > 0)) {
        strata_fail("comm.timeout_s is %g: it must be a positive number of seconds", timeout_s);
        return NULL;
    }
    strata_comm *c = strata_xcalloc(1, sizeof *c);
    c->d = d;
    c->stream = stream;
    c->timeout_s = timeout_s;
    c->rank = 0;
    c->world = 1;
    c->mpi = MPI_COMM_NULL;
    /* Well below INT_MAX. STRATA_COMM_CHUNK_ELEMS lowers it so tests reach the chunked
     * paths with small buffers. */
    c->chunk_elems = (size_t)1 << 30;
    const char *env = getenv("STRATA_COMM_CHUNK_ELEMS");
    if (env) {
        char *end = NULL;
        long long v = strtoll(env, &end, 10);
        if (end == env || *end || v < 1 || v > (1LL << 30)) {
            strata_fail("STRATA_COMM_CHUNK_ELEMS=\"%s\": expected an integer in [1, %lld]", env,
                        1LL << 30);
            free(c);
            return NULL;
        }
        c->chunk_elems = (size_t)v;
    }
    pthread_mutex_init(&c->mu, NULL);

    if (mpi_is_active && !single) {
        c->ops = &mpi_ops;
        mpi_enter();
        int rc = MPI_Comm_dup(MPI_COMM_WORLD, &c->mpi);
        if (rc == MPI_SUCCESS) rc = MPI_Comm_set_errhandler(c->mpi, MPI_ERRORS_RETURN);
        if (rc == MPI_SUCCESS) MPI_Comm_rank(c->mpi, &c->rank);
        if (rc == MPI_SUCCESS) MPI_Comm_size(c->mpi, &c->world);
        mpi_leave();
        if (rc != MPI_SUCCESS) {
            char msg[MPI_MAX_ERROR_STRING] = "";
            int len = 0;
            MPI_Error_string(rc, msg, &len);
            strata_fail("comm open: duplicating MPI_COMM_WORLD failed: %s", msg);
            pthread_mutex_destroy(&c->mu);
            free(c);
            return NULL;
        }
        c->requests = strata_xmalloc((size_t)c->world * sizeof *c->requests);
        for (int r = 0; r < c->world; r++) c->requests[r] = MPI_REQUEST_NULL;
    } else {
        c->ops = &single_ops;
    }
    STRATA_DEBUG("comm", "opened backend %s: rank %d of %d, timeout %g s", c->ops->name, c->rank,
                 c->world, timeout_s);
    return c;
}

strata_comm *strata_comm_open(strata_device *d, strata_stream *stream, double timeout_s) {
    return comm_open(d, stream, timeout_s, 0);
}
strata_comm *strata_comm_open_single(strata_device *d, strata_stream *stream) {
    return comm_open(d, stream, 60.0, 1);
}

void strata_comm_close(strata_comm *c) {
    if (!c) return;
    free(c->scratch);
    strata_stream_sync(c->d, c->stream); /* queued tasks still point at c */
    if (c->mpi != MPI_COMM_NULL) {
        mpi_enter();
        MPI_Comm_free(&c->mpi);
        mpi_leave();
    }
    free(c->requests);
    free(c->spans);
    pthread_mutex_destroy(&c->mu);
    free(c);
}

int strata_comm_rank(const strata_comm *c) { return c->rank; }
int strata_comm_world(const strata_comm *c) { return c->world; }
const char *strata_comm_backend_name(const strata_comm *c) { return c->ops->name; }
strata_stream *strata_comm_stream(const strata_comm *c) { return c->stream; }

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
    coll_task *t = strata_xmalloc(sizeof *t);
    *t = (coll_task){.c = c, .kind = kind, .elem = elem, .out = out, .in = in, .count = count,
                     .root = root, .aliased = aliased};
    count_call(c, kind, ring_bytes(t));
    return c->ops->enqueue(c, t);
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

int strata_allreduce(strata_comm *c, float *buf, size_t n) {
    if (n && !buf) return strata_fail("all-reduce of %zu floats: buffer is NULL", n);
    return submit(c, STRATA_COLL_ALLREDUCE, ELEM_F32, buf, buf, n, 0, 1);
}

int strata_reduce_scatter(strata_comm *c, float *out, const float *in, size_t n_per_rank) {
    if (total_fits(c, n_per_rank, sizeof(float), "reduce-scatter")) return -1;
    if (n_per_rank && (!out || !in))
        return strata_fail("reduce-scatter of %zu floats per rank: %s is NULL", n_per_rank,
                           out ? "in" : "out");
    size_t n_all = n_per_rank * (size_t)c->world;
    int aliased = n_per_rank && out == in + (size_t)c->rank * n_per_rank;
    if (!aliased && overlaps(out, n_per_rank * sizeof(float), in, n_all * sizeof(float)))
        return strata_fail("reduce-scatter of %zu floats per rank on rank %d: out overlaps in "
                           "without being in + rank * n_per_rank",
                           n_per_rank, c->rank);
    return submit(c, STRATA_COLL_REDUCE_SCATTER, ELEM_F32, out, in, n_per_rank, 0, aliased);
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
