/* tests/test_device.c: the CPU backend keeps CUDA's stream and event semantics:
 * FIFO order per stream, cross-stream ordering only through events, exact memory
 * counters, and no lost work at sync or destroy. Hangs turn into failures via alarm(). */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/arena.h"
#include "core/common.h"
#include "core/device.h"
#include "core/host_queue.h"
#include "tests/capture.h"
#include "tests/check.h"
#include "tests/gate.h"

static void gate_destroy(gate *g) {
    pthread_cond_destroy(&g->cv);
    pthread_mutex_destroy(&g->mu);
}

static void count_fn(void *arg) { (*(int *)arg)++; }

static void test_open_and_dtypes(void) {
    CHECK(strata_dtype_size(STRATA_F32) == 4 && strata_dtype_size(STRATA_BF16) == 2,
          "dtype sizes f32=4 bf16=2");
    CHECK(!strcmp(strata_dtype_name(STRATA_F32), "f32") && !strcmp(strata_dtype_name(STRATA_BF16), "bf16"),
          "dtype names");

    strata_device *d = strata_device_open("cpu", 0);
    CHECK(d && !strcmp(d->ops->name, "cpu") && !strncmp(d->description, "cpu (", 5) &&
              d->compute && d->compute_dtype == STRATA_F32 && d->k && d->caps.host_memory && !d->caps.gpu,
          "open cpu: %s, its memory the host's, not a GPU", d ? d->description : strata_error());
    strata_device_close(d);

    strata_device *bad = strata_device_open("tpu", 0);
    CHECK(!bad && strstr(strata_error(), "\"tpu\""), "unknown backend fails naming it: %s",
          strata_error());

    if (!strata_cuda_available()) {
        strata_device *c = strata_device_open("cuda", 0);
        CHECK(!c, "cuda without a usable GPU fails: %s", strata_error());
#ifndef STRATA_HAVE_CUDA
        CHECK(strstr(strata_error(), "built without CUDA") != NULL,
              "the message says this build has no CUDA");
#endif
        strata_device *a = strata_device_open("auto", 0);
        CHECK(a && !strcmp(a->ops->name, "cpu"), "auto falls back to cpu without a GPU");
        strata_device_close(a);
    }
}

static void test_alloc_counters(strata_device *d) {
    strata_mem_counters before = d->mem[STRATA_MEM_DEVICE];
    void *a = strata_alloc(d, STRATA_MEM_DEVICE, 1000);
    void *b = strata_alloc(d, STRATA_MEM_DEVICE, 3000);
    void *p = strata_alloc(d, STRATA_MEM_PINNED, 100);
    void *h = strata_alloc(d, STRATA_MEM_HOST, 7);
    CHECK(a && b && p && h, "four allocations succeed");
    CHECK(((uintptr_t)a | (uintptr_t)b | (uintptr_t)p | (uintptr_t)h) % 64 == 0,
          "every allocation is 64-byte aligned");
    memset(a, 1, 1000);
    memset(b, 2, 3000);
    memset(p, 3, 100);
    memset(h, 4, 7);
    strata_mem_counters m = d->mem[STRATA_MEM_DEVICE];
    CHECK(m.live_bytes == before.live_bytes + 4000 && m.peak_bytes >= 4000 &&
              m.n_alloc == before.n_alloc + 2,
          "device live %zu peak %zu allocs %llu", m.live_bytes, m.peak_bytes,
          (unsigned long long)m.n_alloc);
    CHECK(d->mem[STRATA_MEM_PINNED].live_bytes == 100 && d->mem[STRATA_MEM_PINNED].n_alloc == 1,
          "pinned counted apart: live %zu", d->mem[STRATA_MEM_PINNED].live_bytes);
    CHECK(d->mem[STRATA_MEM_HOST].live_bytes == 7 && d->mem[STRATA_MEM_HOST].n_alloc == 1,
          "host counted apart: live %zu", d->mem[STRATA_MEM_HOST].live_bytes);
    strata_free(d, STRATA_MEM_DEVICE, b);
    void *c = strata_alloc(d, STRATA_MEM_DEVICE, 500);
    m = d->mem[STRATA_MEM_DEVICE];
    CHECK(m.live_bytes == 1500 && m.peak_bytes == 4000 && m.n_free == 1 && m.n_alloc == 3,
          "after free+alloc: live %zu peak %zu (peak keeps the high-water mark)", m.live_bytes,
          m.peak_bytes);
    strata_free(d, STRATA_MEM_DEVICE, a);
    strata_free(d, STRATA_MEM_DEVICE, c);
    strata_free(d, STRATA_MEM_PINNED, p);
    strata_free(d, STRATA_MEM_HOST, h);
    strata_free(d, STRATA_MEM_HOST, NULL);
    int all_zero = 1;
    for (int k = 0; k < STRATA_MEM_KINDS; k++) all_zero &= d->mem[k].live_bytes == 0;
    CHECK(all_zero && d->mem[STRATA_MEM_DEVICE].n_free == 3, "everything freed: live 0 for every kind");

    void *z = strata_alloc(d, STRATA_MEM_HOST, 0);
    CHECK(z != NULL && d->mem[STRATA_MEM_HOST].live_bytes == 0, "zero-byte alloc gives a pointer, counts 0 bytes");
    strata_free(d, STRATA_MEM_HOST, z);

    void *huge = strata_alloc(d, STRATA_MEM_DEVICE, (size_t)-1);
    CHECK(!huge && strstr(strata_error(), "bytes"), "impossible size fails: %s", strata_error());
    void *badkind = strata_alloc(d, (strata_mem_kind)7, 16);
    CHECK(!badkind && strstr(strata_error(), "kind 7"), "bad kind fails: %s", strata_error());

    size_t fr = 0, tot = 0;
    int rc = d->ops->mem_info(d, &fr, &tot);
    CHECK(rc == 0 && tot > 0 && fr <= tot, "mem_info free %zu <= total %zu", fr, tot);
}

typedef struct order_log {
    int seen[2048];
    int n;
} order_log;
typedef struct order_item {
    order_log *log;
    int id;
} order_item;
static void log_append(void *arg) {
    order_item *it = arg;
    it->log->seen[it->log->n++] = it->id;
}

/* An aligned allocation takes the backend's block when it is aligned already and one
 * alignment more otherwise; the arena's pinned block is page-aligned either way. */
static void test_aligned_alloc(strata_device *d) {
    strata_mem_counters before = d->mem[STRATA_MEM_PINNED];
    void *raw = NULL;
    void *p = strata_alloc_aligned(d, STRATA_MEM_PINNED, 8192, 4096, &raw);
    strata_mem_counters got = d->mem[STRATA_MEM_PINNED];
    CHECK(p && p == raw && got.live_bytes - before.live_bytes == 8192 && got.n_alloc == before.n_alloc + 1,
          "pinned memory is page-aligned already: one allocation of exactly the request");
    strata_free(d, STRATA_MEM_PINNED, raw);

    /* device memory is 64-aligned on the CPU: 1 MiB alignment takes the slack block */
    const size_t big = (size_t)1 << 20;
    before = d->mem[STRATA_MEM_DEVICE];
    void *q = strata_alloc_aligned(d, STRATA_MEM_DEVICE, 1000, big, &raw);
    got = d->mem[STRATA_MEM_DEVICE];
    size_t live = got.live_bytes - before.live_bytes;
    CHECK(q && (uintptr_t)q % big == 0 && (char *)q >= (char *)raw && (char *)q + 1000 <= (char *)raw + live &&
              (live == 1000 || live == 1000 + big),
          "a 1 MiB-aligned block inside what was allocated (%zu bytes live)", live);
    if (q) memset(q, 7, 1000); /* ASan: the aligned range lies inside the allocation */
    strata_free(d, STRATA_MEM_DEVICE, raw);
    CHECK(d->mem[STRATA_MEM_DEVICE].live_bytes == before.live_bytes, "freeing raw returns it all");

    size_t pinned_live = d->mem[STRATA_MEM_PINNED].live_bytes;
    strata_arena a;
    strata_arena_init(&a, d);
    void *x = NULL, *y = NULL;
    strata_arena_reserve(&a, STRATA_MEM_PINNED, STRATA_CAT_STAGING, "x", 100, &x);
    strata_arena_reserve(&a, STRATA_MEM_PINNED, STRATA_CAT_STAGING, "y", 5000, &y);
    /* counted by kind, category and name, as allocated (a pinned slice rounds up to a page) */
    CHECK(strata_arena_bytes(&a, STRATA_MEM_PINNED, STRATA_CAT_STAGING) == 3 * 4096 &&
              strata_arena_bytes_named(&a, STRATA_MEM_PINNED, STRATA_CAT_STAGING, "y") == 2 * 4096 &&
              strata_arena_bytes_named(&a, STRATA_MEM_PINNED, -1, "x") == 4096 &&
              strata_arena_bytes_named(&a, STRATA_MEM_DEVICE, -1, "x") == 0 &&
              strata_arena_bytes_named(&a, -1, -1, "z") == 0,
          "the arena's bytes by kind, category and name prefix");
    CHECK(strata_arena_commit(&a) == 0 && x == a.base[STRATA_MEM_PINNED] && (uintptr_t)x % 4096 == 0 &&
              (char *)y == (char *)x + 4096 && a.total[STRATA_MEM_PINNED] == 3 * 4096,
          "the arena's pinned block is page-aligned and its slices page-rounded");
    strata_arena_release(&a);
    CHECK(d->mem[STRATA_MEM_PINNED].live_bytes == pinned_live, "releasing the arena returns its pinned block");
}

/* The queue behind both backends' worker streams, used directly: a task held at a gate
 * keeps 500 more waiting (the ring grows past its 64 slots), the stamp numbers each task
 * under the queue's lock as CUDA's event markers take their tickets, and they run in
 * that order; sync returns only when all have run; stop runs what is still queued. */
typedef struct queue_task {
    gate *g;    /* the first task waits here */
    int ticket; /* set by the stamp */
} queue_task;
typedef struct queue_owner {
    int issued; /* tickets handed out */
    int ran[600], n_ran;
} queue_owner;
static void queue_run(void *owner, void *task) {
    queue_owner *o = owner;
    queue_task *t = task;
    if (t->g) gate_wait(t->g);
    o->ran[o->n_ran++] = t->ticket;
}
static void queue_stamp(void *owner, void *task) { ((queue_task *)task)->ticket = ++((queue_owner *)owner)->issued; }

static void test_host_queue(void) {
    static queue_owner o;
    strata_host_queue q;
    CHECK(strata_host_queue_start(&q, "queue-test", sizeof(queue_task), queue_run, &o) == 0, "a queue starts");
    gate g = GATE_INIT;
    queue_task first = {&g, 0};
    strata_host_queue_push(&q, &first, queue_stamp);
    int stamped = first.ticket == 1;
    for (int i = 0; i < 500; i++) {
        queue_task t = {NULL, 0};
        strata_host_queue_push(&q, &t, queue_stamp);
        stamped &= t.ticket == i + 2; /* the caller sees its stamp */
    }
    pthread_mutex_lock(&q.mu);
    size_t cap = q.cap, queued = q.count;
    pthread_mutex_unlock(&q.mu);
    CHECK(stamped && cap >= 512 && queued >= 500, "501 stamped tasks queued behind a gate: the ring grew to %zu", cap);
    gate_open(&g);
    strata_host_queue_sync(&q);
    int in_order = o.n_ran == 501;
    for (int i = 0; i < o.n_ran && in_order; i++) in_order = o.ran[i] == i + 1;
    CHECK(in_order, "sync returned after all of them ran, in ticket order (%d ran)", o.n_ran);
    for (int i = 0; i < 10; i++) {
        queue_task t = {NULL, 0};
        strata_host_queue_push(&q, &t, queue_stamp);
    }
    strata_host_queue_stop(&q);
    CHECK(o.n_ran == 511 && o.ran[510] == 511, "stop let the last 10 run before the worker ended (%d ran)", o.n_ran);
}

static void test_fifo_order(strata_device *d) {
    strata_stream *s = strata_stream_create(d, "fifo", STRATA_STREAM_HOST);
    static order_log log;
    static order_item items[1000];
    log.n = 0;
    for (int i = 0; i < 1000; i++) {
        items[i] = (order_item){&log, i};
        MUST(strata_host_task(d, s, log_append, &items[i]));
    }
    MUST(strata_stream_sync(d, s));
    int in_order = log.n == 1000;
    for (int i = 0; i < log.n && in_order; i++) in_order = log.seen[i] == i;
    CHECK(in_order, "1000 host tasks ran in enqueue order (%d ran)", log.n);

    /* Copies and memsets keep their place in the queue too: each copy must see exactly
     * the memset before it, never one enqueued later. */
    unsigned char *src = strata_alloc(d, STRATA_MEM_PINNED, 64);
    unsigned char *dst = strata_alloc(d, STRATA_MEM_HOST, 64 * 8);
    for (int v = 0; v < 8; v++) {
        MUST(strata_memset_async(d, s, src, v + 1, 64));
        MUST(strata_memcpy_async(d, s, dst + 64 * v, src, 64));
    }
    MUST(strata_stream_sync(d, s));
    int ok = 1;
    for (int v = 0; v < 8; v++)
        for (int i = 0; i < 64; i++) ok &= dst[64 * v + i] == v + 1;
    CHECK(ok, "memset/memcpy interleaving keeps FIFO order (8 rounds)");
    strata_free(d, STRATA_MEM_PINNED, src);
    strata_free(d, STRATA_MEM_HOST, dst);
    strata_stream_destroy(d, s);
}

typedef struct slow_fill {
    float *buf;
    int n;
    float base;
} slow_fill;
static void slow_fill_fn(void *arg) {
    slow_fill *f = arg;
    usleep(20000); /* widens the window a missing wait would race through */
    for (int i = 0; i < f->n; i++) f->buf[i] = f->base + (float)i;
}
typedef struct sum_task {
    const float *buf;
    int n;
    double sum;
} sum_task;
static void sum_fn(void *arg) {
    sum_task *t = arg;
    t->sum = 0;
    for (int i = 0; i < t->n; i++) t->sum += t->buf[i];
}

static void test_cross_stream_event(strata_device *d) {
    enum { N = 4096 };
    strata_stream *prod = strata_stream_create(d, "producer", STRATA_STREAM_HOST);
    strata_stream *cons = strata_stream_create(d, "consumer", STRATA_STREAM_DEVICE);
    strata_event *e = strata_event_create(d);
    float *buf = strata_alloc(d, STRATA_MEM_DEVICE, N * sizeof(float));
    float *copy = strata_alloc(d, STRATA_MEM_HOST, N * sizeof(float));
    memset(buf, 0, N * sizeof(float));
    slow_fill f = {buf, N, 5.0f};
    sum_task st = {buf, N, 0};
    MUST(strata_host_task(d, prod, slow_fill_fn, &f));
    MUST(strata_event_record(d, e, prod));
    MUST(strata_stream_wait_event(d, cons, e));
    MUST(strata_host_task(d, cons, sum_fn, &st));
    MUST(strata_memcpy_async(d, cons, copy, buf, N * sizeof(float)));
    MUST(strata_stream_sync(d, cons));
    double want = 5.0 * N + (double)N * (N - 1) / 2;
    CHECK(st.sum == want, "consumer waited on the producer's event: sum %.0f == %.0f", st.sum, want);
    CHECK(copy[0] == 5.0f && copy[N - 1] == 5.0f + (N - 1), "consumer's copy saw the produced data");

    /* The same event recorded again: the wait captures the newer generation. */
    slow_fill f2 = {buf, N, 100.0f};
    MUST(strata_host_task(d, prod, slow_fill_fn, &f2));
    MUST(strata_event_record(d, e, prod));
    MUST(strata_stream_wait_event(d, cons, e));
    MUST(strata_host_task(d, cons, sum_fn, &st));
    MUST(strata_stream_sync(d, cons));
    want = 100.0 * N + (double)N * (N - 1) / 2;
    CHECK(st.sum == want, "re-recorded event: consumer saw the second fill, sum %.0f", st.sum);

    strata_free(d, STRATA_MEM_DEVICE, buf);
    strata_free(d, STRATA_MEM_HOST, copy);
    strata_event_destroy(d, e);
    strata_stream_destroy(d, prod);
    strata_stream_destroy(d, cons);
}

static void test_event_query_and_unrecorded(strata_device *d) {
    strata_stream *s = strata_stream_create(d, "gated", STRATA_STREAM_HOST);
    strata_event *e = strata_event_create(d);
    CHECK(strata_event_query(d, e) == 1, "a never-recorded event queries complete");
    CHECK(strata_event_sync(d, e) == 0, "event_sync on a never-recorded event returns at once");
    CHECK(strata_stream_wait_event(d, d->compute, e) == 0,
          "the compute stream waiting on a never-recorded event returns at once");
    /* The unrecorded wait must not block the worker: a later task still runs. */
    int ran = 0;
    MUST(strata_stream_wait_event(d, s, e));
    MUST(strata_host_task(d, s, count_fn, &ran));
    MUST(strata_stream_sync(d, s));
    CHECK(ran == 1, "a worker stream waiting on a never-recorded event keeps going");

    gate g;
    gate_init(&g);
    MUST(strata_host_task(d, s, gate_wait, &g));
    MUST(strata_event_record(d, e, s));
    CHECK(strata_event_query(d, e) == 0, "event recorded behind a closed gate queries pending");
    gate_open(&g);
    MUST(strata_event_sync(d, e));
    CHECK(strata_event_query(d, e) == 1, "after the gate opens and event_sync, it queries complete");
    gate_destroy(&g);

    /* Destroying an event whose record is still queued is allowed, as in CUDA. */
    strata_event *e2 = strata_event_create(d);
    gate_init(&g);
    MUST(strata_host_task(d, s, gate_wait, &g));
    MUST(strata_event_record(d, e2, s));
    strata_event_destroy(d, e2);
    MUST(strata_host_task(d, s, count_fn, &ran));
    gate_open(&g);
    MUST(strata_stream_sync(d, s));
    CHECK(ran == 2, "event destroyed with its record pending: stream still drains");
    gate_destroy(&g);

    strata_event_destroy(d, e);
    strata_stream_destroy(d, s);
}

typedef struct delayed_store {
    int *slot;
    int value;
} delayed_store;
static void delayed_store_fn(void *arg) {
    delayed_store *ds = arg;
    usleep(20000);
    *ds->slot = ds->value;
}

static void test_compute_waits_for_worker(strata_device *d) {
    strata_stream *w = strata_stream_create(d, "worker", STRATA_STREAM_DEVICE);
    strata_event *e = strata_event_create(d);
    int *x = strata_alloc(d, STRATA_MEM_DEVICE, sizeof(int));
    int *y = strata_alloc(d, STRATA_MEM_DEVICE, sizeof(int));
    *x = 0;
    delayed_store ds = {x, 42};
    MUST(strata_host_task(d, w, delayed_store_fn, &ds));
    MUST(strata_event_record(d, e, w));
    MUST(strata_stream_wait_event(d, d->compute, e)); /* blocks this thread: compute is inline */
    MUST(strata_memcpy_async(d, d->compute, y, x, sizeof(int)));
    CHECK(*y == 42, "compute stream waited for the worker's event: copied %d", *y);

    /* And the other way: a worker waits for work done on the compute stream. */
    MUST(strata_memset_async(d, d->compute, x, 0x11, sizeof(int)));
    MUST(strata_event_record(d, e, d->compute));
    CHECK(strata_event_query(d, e) == 1, "a record on the compute stream completes at once");
    MUST(strata_stream_wait_event(d, w, e));
    MUST(strata_memcpy_async(d, w, y, x, sizeof(int)));
    MUST(strata_stream_sync(d, w));
    CHECK(*y == 0x11111111, "worker copy after waiting on compute sees 0x%x", *y);
    strata_free(d, STRATA_MEM_DEVICE, x);
    strata_free(d, STRATA_MEM_DEVICE, y);
    strata_event_destroy(d, e);
    strata_stream_destroy(d, w);
}

/* Runs one stuck-for-a-while scenario with stderr captured: a worker stream waits for an
 * event recorded behind a gate on another stream, the test's thread syncs that event, and
 * then syncs a stream whose queue is held by a second gate. Returns what was printed. */
static char *stuck_for_a_while(strata_device *d, unsigned hold_ms) {
    capture c;
    CHECK(capture_begin(&c) == 0, "capture stderr");

    strata_stream *blocker = strata_stream_create(d, "blocker", STRATA_STREAM_HOST);
    strata_stream *waiter = strata_stream_create(d, "waiter", STRATA_STREAM_HOST);
    strata_event *e = strata_event_create(d);
    gate g1, g2;
    gate_init(&g1);
    gate_init(&g2);
    MUST(strata_host_task(d, blocker, gate_wait, &g1));
    MUST(strata_event_record(d, e, blocker));
    MUST(strata_stream_wait_event(d, waiter, e)); /* its worker thread waits */
    gate_timer t;
    gate_open_after(&t, &g1, hold_ms);
    MUST(strata_event_sync(d, e)); /* this thread waits */
    gate_timer_join(&t);
    MUST(strata_stream_sync(d, waiter));
    MUST(strata_host_task(d, blocker, gate_wait, &g2));
    gate_open_after(&t, &g2, hold_ms);
    MUST(strata_stream_sync(d, blocker)); /* a queue that does not drain */
    gate_timer_join(&t);
    strata_event_destroy(d, e);
    strata_stream_destroy(d, waiter);
    strata_stream_destroy(d, blocker);
    gate_destroy(&g1);
    gate_destroy(&g2);
    return capture_end(&c);
}

/* A wait that goes on says what it waits for (STRATA_WAIT_REPORT_S): the thread, the
 * stream whose record it needs, and where every stream's queue stands; the wait itself
 * goes on and ends normally. Off, nothing is said. */
static void test_long_wait_reports(strata_device *d) {
    strata_set_wait_report_s(1);
    char *text = stuck_for_a_while(d, 1600);
    CHECK(strstr(text, "thread \"st:waiter\" has waited 1 s for the record of an event on stream \"blocker\" "
                       "(record 1, reached 0); streams: ") != NULL,
          "a worker stream's wait reports itself after 1 s:\n%s", text);
    CHECK(strstr(text, "thread \"test_device\" has waited 1 s for the record of an event on stream \"blocker\"") != NULL,
          "the test thread's event sync reports itself");
    CHECK(strstr(text, "\"blocker\" 0 tasks done, 1 running, 1 queued") != NULL && strstr(text, "\"compute\" (runs on its caller)"),
          "the report lists every stream's queue");
    CHECK(strstr(text, "thread \"test_device\" has waited 1 s for stream \"blocker\" to finish its queue: 2 of 3 tasks "
                       "done, 1 running, 0 queued") != NULL,
          "a stream sync that does not drain reports itself");
    free(text);
    strata_set_wait_report_s(0);
    text = stuck_for_a_while(d, 1200);
    CHECK(strstr(text, "has waited") == NULL, "with reports off nothing is said: '%s'", text);
    free(text);
    strata_set_wait_report_s(300);
}

static void test_stream_sync_and_destroy(strata_device *d) {
    strata_stream *s = strata_stream_create(d, "sync", STRATA_STREAM_HOST);
    int count = 0;
    gate g;
    gate_init(&g);
    MUST(strata_host_task(d, s, gate_wait, &g));
    for (int i = 0; i < 500; i++) strata_host_task(d, s, count_fn, &count);
    gate_open(&g);
    MUST(strata_stream_sync(d, s));
    CHECK(count == 500, "stream_sync waited for all 500 queued tasks (ran %d)", count);
    gate_destroy(&g);

    int c2 = 0;
    strata_stream *a = strata_stream_create(d, "all-a", STRATA_STREAM_HOST);
    strata_stream *b = strata_stream_create(d, "all-b", STRATA_STREAM_DEVICE);
    slow_fill f = {NULL, 0, 0};
    MUST(strata_host_task(d, a, slow_fill_fn, &f));
    for (int i = 0; i < 200; i++) strata_host_task(d, a, count_fn, &count);
    MUST(strata_host_task(d, b, slow_fill_fn, &f));
    for (int i = 0; i < 300; i++) strata_host_task(d, b, count_fn, &c2);
    d->ops->sync_all(d);
    CHECK(count == 700 && c2 == 300, "sync_all drained every stream (%d, %d)", count, c2);
    strata_stream_destroy(d, a);
    strata_stream_destroy(d, b);

    /* Destroy with work still queued behind a slow task: it drains first. */
    count = 0;
    MUST(strata_host_task(d, s, slow_fill_fn, &f));
    for (int i = 0; i < 1000; i++) strata_host_task(d, s, count_fn, &count);
    strata_stream_destroy(d, s);
    CHECK(count == 1000, "stream_destroy ran the %d pending tasks before returning", count);
}

/* Stress: K streams in a ring; each writes its own slots in order and, every STEP
 * tasks, records an event the next stream waits on, then reads the slot the previous
 * stream wrote just before that record. The reads are plain loads, so only the event
 * orders them: a broken event is both a wrong value and a ThreadSanitizer report. */
enum { K = 8, TASKS = 1250, STEP = 25 };
typedef struct stress_ctx {
    int slots[K][TASKS];
    int bad;
} stress_ctx;
typedef struct stress_item {
    stress_ctx *ctx;
    int stream, index;      /* write slots[stream][index] */
    int check_stream;       /* -1, or read slots[check_stream][check_index] */
    int check_index;
} stress_item;
static void stress_fn(void *arg) {
    stress_item *it = arg;
    stress_ctx *c = it->ctx;
    if (it->index > 0 && c->slots[it->stream][it->index - 1] != it->index) c->bad++;
    c->slots[it->stream][it->index] = it->index + 1;
    if (it->check_stream >= 0 &&
        c->slots[it->check_stream][it->check_index] != it->check_index + 1)
        c->bad++;
}

/* Timed events (the offload split's compute clock): elapsed time between two completed
 * records is their order on the clock; a pending or never-recorded event is an error,
 * never a wait. */
static void test_event_elapsed(strata_device *d) {
    strata_event *a = strata_event_create_timed(d), *b = strata_event_create_timed(d);
    double ms = -1;
    CHECK(strata_event_elapsed_ms(d, a, b, &ms) != 0 && ms == -1, "elapsed between never-recorded events fails");
    MUST(strata_event_record(d, a, d->compute));
    double t0 = strata_now_ms();
    volatile double x = 0;
    for (int i = 0; i < 200000; i++) x += i * 0.5; /* work between the two records */
    double host_ms = strata_now_ms() - t0;
    MUST(strata_event_record(d, b, d->compute));
    CHECK(strata_event_elapsed_ms(d, a, b, &ms) == 0 && ms >= host_ms && ms >= 0,
          "elapsed a -> b on the compute stream covers the work between them (%.4f ms >= %.4f ms)", ms, host_ms);
    double back = 1;
    CHECK(strata_event_elapsed_ms(d, b, a, &back) == 0 && back == -ms, "elapsed b -> a is its negative");
    strata_stream *s = strata_stream_create(d, "gated", STRATA_STREAM_HOST);
    gate g;
    gate_init(&g);
    MUST(strata_host_task(d, s, gate_wait, &g));
    MUST(strata_event_record(d, b, s));
    CHECK(strata_event_elapsed_ms(d, a, b, &ms) != 0, "elapsed to an event still pending fails at once");
    gate_open(&g);
    MUST(strata_stream_sync(d, s));
    CHECK(strata_event_elapsed_ms(d, a, b, &ms) == 0 && ms >= 0, "once reached it is read (%.4f ms)", ms);
    gate_destroy(&g);
    strata_stream_destroy(d, s);
    strata_event_destroy(d, a);
    strata_event_destroy(d, b);
}

static void test_stress(strata_device *d) {
    static stress_ctx ctx;
    static stress_item items[K][TASKS];
    memset(&ctx, 0, sizeof ctx);
    strata_stream *s[K];
    strata_event *ev[K][TASKS / STEP];
    char name[32];
    for (int k = 0; k < K; k++) {
        snprintf(name, sizeof name, "stress-%d", k);
        s[k] = strata_stream_create(d, name, k % 2 ? STRATA_STREAM_HOST : STRATA_STREAM_DEVICE);
        for (int j = 0; j < TASKS / STEP; j++) ev[k][j] = strata_event_create(d);
    }
    /* Enqueue round-robin so the streams' progress interleaves. */
    for (int i = 0; i < TASKS; i++) {
        for (int k = 0; k < K; k++) {
            int prev = (k + K - 1) % K;
            int after_wait = i % STEP == STEP - 1 && i >= STEP;
            if (after_wait) strata_stream_wait_event(d, s[k], ev[prev][i / STEP - 1]);
            items[k][i] = (stress_item){&ctx, k, i, after_wait ? prev : -1,
                                        after_wait ? (i / STEP) * STEP - 1 : 0};
            MUST(strata_host_task(d, s[k], stress_fn, &items[k][i]));
            if (i % STEP == STEP - 1) strata_event_record(d, ev[k][i / STEP], s[k]);
        }
    }
    d->ops->sync_all(d);
    int complete = 1;
    for (int k = 0; k < K; k++)
        for (int i = 0; i < TASKS; i++) complete &= ctx.slots[k][i] == i + 1;
    CHECK(complete && ctx.bad == 0, "%d streams x %d tasks with %d cross-stream waits: %d violations",
          K, TASKS, K * (TASKS / STEP - 1), ctx.bad);
    for (int k = 0; k < K; k++) {
        for (int j = 0; j < TASKS / STEP; j++) strata_event_destroy(d, ev[k][j]);
        strata_stream_destroy(d, s[k]);
    }
}

int main(void) {
    alarm(60); /* a lost wake-up must fail the test, not hang CI */
    strata_log_init(0, 1);
    test_open_and_dtypes();
    strata_device *d = strata_device_open("cpu", 0);
    if (!d) {
        fprintf(stderr, "cannot open the cpu device: %s\n", strata_error());
        return 1;
    }
    test_alloc_counters(d);
    test_aligned_alloc(d);
    test_host_queue();
    test_fifo_order(d);
    test_cross_stream_event(d);
    test_event_query_and_unrecorded(d);
    test_compute_waits_for_worker(d);
    test_stream_sync_and_destroy(d);
    test_long_wait_reports(d);
    test_event_elapsed(d);
    test_stress(d);
    strata_device_close(d);
    printf("%s: %d failure%s\n", failures ? "FAILED" : "passed", failures, failures == 1 ? "" : "s");
    return failures ? 1 : 0;
}
