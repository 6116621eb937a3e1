/* tests/test_comm.c: every collective on rank-dependent data with exact expected
 * results, at any world size: plain (world 1, "single" backend) or under mpirun ("mpi").
 * Small-integer sums are exact in fp32, so results are compared with ==. Under mpirun
 * the same checks also run on comms that stage every buffer through pinned memory
 * (STRATA_COMM_STAGE=1, the path device buffers take), with staging buffers small
 * enough to need many chunks; the main comm stages as the mpi backend does by default
 * (with several ranks), or as STRATA_COMM_STAGE=0/1 in the environment says. Then the
 * backend choice from a config, and the reuse of task records.
 *
 * STRATA_TEST_COMM_WATCHDOG=1 turns it into the watchdog check that tests/e2e_comm.sh
 * runs: rank 0 never joins a barrier and the other ranks must abort the job. */
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "core/device.h"
#include "io/config.h"
#include "shard/comm.h"
#include "shard/comm_nccl.h"
#include "tests/check.h"
#include "tests/gate.h"

static int my_rank = 0;

static strata_device *dev;
static int R, W; /* this rank, world size */

static float *falloc(size_t n) { return strata_alloc(dev, STRATA_MEM_DEVICE, (n ? n : 1) * sizeof(float)); }
static void ffree(float *p) { strata_free(dev, STRATA_MEM_DEVICE, p); }

/* Sum over ranks r of (r * 1000 + v) = 1000 * W(W-1)/2 + W * v. */
static float rank_sum(int v) { return 1000.0f * (float)(W * (W - 1) / 2) + (float)W * (float)v; }

static void test_allreduce(strata_comm *c, const char *label) {
    const size_t sizes[] = {0, 1, 7, 1000, (1u << 20) + 3}; /* the last is 4 MiB */
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        size_t n = sizes[s];
        float *buf = falloc(n);
        for (size_t i = 0; i < n; i++) buf[i] = (float)(R * 1000 + (int)(i % 997));
        int rc = strata_allreduce(c, buf, n);
        MUST(strata_stream_sync(dev, strata_comm_stream(c)));
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) bad += buf[i] != rank_sum((int)(i % 997));
        CHECK(rc == 0 && bad == 0, "%sall-reduce of %zu floats: %zu wrong", label, n, bad);
        ffree(buf);
    }
}

/* in[j] = rank * 1000 + j % 1013 over the full (n * W) input. */
static void fill_rs_input(float *in, size_t n_all) {
    for (size_t j = 0; j < n_all; j++) in[j] = (float)(R * 1000 + (int)(j % 1013));
}
static size_t count_rs_wrong(const float *out, size_t n) {
    size_t bad = 0;
    for (size_t i = 0; i < n; i++) bad += out[i] != rank_sum((int)(((size_t)R * n + i) % 1013));
    return bad;
}

static void test_reduce_scatter(strata_comm *c, const char *label) {
    const size_t sizes[] = {1, 13, 333, 5000, (1u << 20) + 5};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        size_t n = sizes[s], n_all = n * (size_t)W;
        float *in = falloc(n_all), *out = falloc(n);
        fill_rs_input(in, n_all);
        int rc = strata_reduce_scatter(c, out, in, n);
        MUST(strata_stream_sync(dev, strata_comm_stream(c)));
        size_t bad = count_rs_wrong(out, n), in_changed = 0;
        for (size_t j = 0; j < n_all; j++) in_changed += in[j] != (float)(R * 1000 + (int)(j % 1013));
        CHECK(rc == 0 && bad == 0 && in_changed == 0,
              "%sreduce-scatter %zu floats/rank: %zu wrong, input changed at %zu", label, n, bad,
              in_changed);

        /* out aliases this rank's block of in: the other blocks must stay as they were. */
        fill_rs_input(in, n_all);
        float *mine = in + (size_t)R * n;
        rc = strata_reduce_scatter(c, mine, in, n);
        MUST(strata_stream_sync(dev, strata_comm_stream(c)));
        bad = count_rs_wrong(mine, n);
        in_changed = 0;
        for (size_t j = 0; j < n_all; j++)
            if (j / n != (size_t)R) in_changed += in[j] != (float)(R * 1000 + (int)(j % 1013));
        CHECK(rc == 0 && bad == 0 && in_changed == 0,
              "%sreduce-scatter %zu floats/rank in place: %zu wrong, other blocks changed at %zu",
              label, n, bad, in_changed);
        ffree(in);
        ffree(out);
    }
}

/* bf16 collectives on small integers (every partial sum below 256, so exact in bf16):
 * rank r contributes 3r + j % 29 at element j. */
static uint16_t bf16_of(int v) { return strata_f32_to_bf16((float)v); } /* exact for small integers */
static int bf16_sum_at(size_t j) { return 3 * W * (W - 1) / 2 + W * (int)(j % 29); }

static void test_bf16(strata_comm *c, const char *label) {
    const size_t sizes[] = {1, 333, (1u << 20) + 5};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        size_t n = sizes[s], n_all = n * (size_t)W;
        uint16_t *buf = strata_alloc(dev, STRATA_MEM_DEVICE, n_all * 2), *out = strata_alloc(dev, STRATA_MEM_DEVICE, n * 2);
        for (size_t j = 0; j < n; j++) buf[j] = bf16_of(3 * R + (int)(j % 29));
        int rc = strata_allreduce_bf16(c, buf, n);
        MUST(strata_stream_sync(dev, strata_comm_stream(c)));
        size_t bad = 0;
        for (size_t j = 0; j < n; j++) bad += buf[j] != bf16_of(bf16_sum_at(j));
        CHECK(rc == 0 && bad == 0, "%sbf16 all-reduce of %zu values: %zu wrong", label, n, bad);
        for (int aliased = 0; aliased <= 1; aliased++) {
            for (size_t j = 0; j < n_all; j++) buf[j] = bf16_of(3 * R + (int)(j % 29));
            uint16_t *dst = aliased ? buf + (size_t)R * n : out;
            rc = strata_reduce_scatter_bf16(c, dst, buf, n);
            MUST(strata_stream_sync(dev, strata_comm_stream(c)));
            bad = 0;
            for (size_t i = 0; i < n; i++) bad += dst[i] != bf16_of(bf16_sum_at((size_t)R * n + i));
            size_t changed = 0;
            for (size_t j = 0; j < n_all; j++)
                if (!aliased || j / n != (size_t)R) changed += buf[j] != bf16_of(3 * R + (int)(j % 29));
            CHECK(rc == 0 && bad == 0 && changed == 0, "%sbf16 reduce-scatter %zu/rank%s: %zu wrong, %zu others changed",
                  label, n, aliased ? " in place" : "", bad, changed);
        }
        strata_free(dev, STRATA_MEM_DEVICE, buf);
        strata_free(dev, STRATA_MEM_DEVICE, out);
    }
    strata_comm_stats st0 = strata_comm_get_stats(c);
    uint16_t *b = strata_alloc(dev, STRATA_MEM_DEVICE, 1000 * 2 * (size_t)W);
    memset(b, 0, 1000 * 2 * (size_t)W);
    strata_reduce_scatter_bf16(c, b + (size_t)R * 1000, b, 1000);
    MUST(strata_stream_sync(dev, strata_comm_stream(c)));
    strata_comm_stats st1 = strata_comm_get_stats(c);
    uint64_t want = (uint64_t)(W - 1) * 2000; /* (N-1)/N of the full 2 x 1000 x N bytes */
    CHECK(st1.bytes[STRATA_COLL_REDUCE_SCATTER] - st0.bytes[STRATA_COLL_REDUCE_SCATTER] == want,
          "%sbf16 reduce-scatter counts 2 bytes per value (%llu)", label, (unsigned long long)want);
    strata_free(dev, STRATA_MEM_DEVICE, b);
}

static unsigned char ag_byte(int r, size_t j) { return (unsigned char)(r * 31 + j * 7 + (j >> 9)); }

static void test_allgather(strata_comm *c, const char *label) {
    const size_t sizes[] = {1, 5, 4099, 3u * 1024 * 1024 + 1};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        size_t b = sizes[s], all = b * (size_t)W;
        unsigned char *in = strata_alloc(dev, STRATA_MEM_HOST, b);
        unsigned char *out = strata_alloc(dev, STRATA_MEM_DEVICE, all);
        for (size_t j = 0; j < b; j++) in[j] = ag_byte(R, j);
        memset(out, 0xEE, all);
        int rc = strata_allgather(c, out, in, b);
        MUST(strata_stream_sync(dev, strata_comm_stream(c)));
        size_t bad = 0;
        for (size_t j = 0; j < all; j++) bad += out[j] != ag_byte((int)(j / b), j % b);
        CHECK(rc == 0 && bad == 0, "%sall-gather %zu bytes/rank: %zu wrong", label, b, bad);

        /* in aliases this rank's block of out. */
        memset(out, 0xEE, all);
        for (size_t j = 0; j < b; j++) out[(size_t)R * b + j] = ag_byte(R, j);
        rc = strata_allgather(c, out, out + (size_t)R * b, b);
        MUST(strata_stream_sync(dev, strata_comm_stream(c)));
        bad = 0;
        for (size_t j = 0; j < all; j++) bad += out[j] != ag_byte((int)(j / b), j % b);
        CHECK(rc == 0 && bad == 0, "%sall-gather %zu bytes/rank in place: %zu wrong", label, b, bad);
        strata_free(dev, STRATA_MEM_HOST, in);
        strata_free(dev, STRATA_MEM_DEVICE, out);
    }
}

static void test_broadcast(strata_comm *c, const char *label) {
    const size_t sizes[] = {1, 100003, 5u * 1024 * 1024};
    const int roots[] = {W - 1, 0}; /* the first is non-zero whenever W > 1 */
    for (int ri = 0; ri < 2; ri++) {
        int root = roots[ri];
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
            size_t n = sizes[s];
            unsigned char *buf = strata_alloc(dev, STRATA_MEM_PINNED, n);
            for (size_t j = 0; j < n; j++) buf[j] = R == root ? (unsigned char)(j * 13 + 1) : (unsigned char)R;
            int rc = strata_broadcast(c, buf, n, root);
            MUST(strata_stream_sync(dev, strata_comm_stream(c)));
            size_t bad = 0;
            for (size_t j = 0; j < n; j++) bad += buf[j] != (unsigned char)(j * 13 + 1);
            CHECK(rc == 0 && bad == 0, "%sbroadcast %zu bytes from root %d: %zu wrong", label, n,
                  root, bad);
            strata_free(dev, STRATA_MEM_PINNED, buf);
        }
    }
    CHECK(strata_barrier(c) == 0 && strata_stream_sync(dev, strata_comm_stream(c)) == 0,
          "%sbarrier completes", label);
}

static void test_host_f64(strata_comm *c) {
    double v[3] = {R + 0.5, 1e10 * R, -(double)R};
    int rc = strata_allreduce_host_f64(c, v, 3);
    double s = (double)W * (W - 1) / 2;
    /* Returns with the result in place: no extra sync here. */
    CHECK(rc == 0 && v[0] == s + 0.5 * W && v[1] == 1e10 * s && v[2] == -s,
          "host f64 all-reduce: %.1f %.1f %.1f", v[0], v[1], v[2]);
}

static void test_counters(strata_comm *c) {
    strata_comm_reset_stats(c);
    strata_comm_stats z = strata_comm_get_stats(c);
    int zero = 1;
    for (int k = 0; k < STRATA_COLL_KINDS; k++) zero &= z.calls[k] == 0 && z.bytes[k] == 0;
    CHECK(zero, "reset clears every counter");

    const uint64_t N = (uint64_t)W;
    float *a = falloc(1000), *rs_in = falloc(300 * (size_t)W), *rs_out = falloc(300);
    unsigned char *ag = strata_alloc(dev, STRATA_MEM_HOST, 77 * (size_t)W);
    memset(a, 0, 1000 * sizeof(float));
    memset(rs_in, 0, 300 * (size_t)W * sizeof(float));
    memset(ag, 0, 77 * (size_t)W);
    double h[2] = {0, 0};
    strata_allreduce(c, a, 1000);
    strata_allreduce(c, a, 10);
    strata_reduce_scatter(c, rs_out, rs_in, 300);
    strata_allgather(c, ag, ag + (size_t)R * 77, 77);
    strata_broadcast(c, a, 64, 0);
    strata_barrier(c);
    strata_allreduce_host_f64(c, h, 2);
    MUST(strata_stream_sync(dev, strata_comm_stream(c)));
    strata_comm_stats st = strata_comm_get_stats(c);
    /* The header's ring formulas, S = full buffer bytes, rounded down. */
    uint64_t want_ar = 2 * (N - 1) * 4000 / N + 2 * (N - 1) * 40 / N + 2 * (N - 1) * 16 / N;
    uint64_t want_rs = (N - 1) * (300 * 4 * N) / N;
    uint64_t want_ag = (N - 1) * (77 * N) / N;
    uint64_t want_bc = N > 1 && R == 0 ? 64 : 0;
    CHECK(st.calls[STRATA_COLL_ALLREDUCE] == 3 && st.bytes[STRATA_COLL_ALLREDUCE] == want_ar,
          "all-reduce counted: %llu calls, %llu bytes (want 3, %llu)",
          (unsigned long long)st.calls[STRATA_COLL_ALLREDUCE],
          (unsigned long long)st.bytes[STRATA_COLL_ALLREDUCE], (unsigned long long)want_ar);
    CHECK(st.calls[STRATA_COLL_REDUCE_SCATTER] == 1 && st.bytes[STRATA_COLL_REDUCE_SCATTER] == want_rs,
          "reduce-scatter counted: %llu bytes (want %llu)",
          (unsigned long long)st.bytes[STRATA_COLL_REDUCE_SCATTER], (unsigned long long)want_rs);
    CHECK(st.calls[STRATA_COLL_ALLGATHER] == 1 && st.bytes[STRATA_COLL_ALLGATHER] == want_ag,
          "all-gather counted: %llu bytes (want %llu)",
          (unsigned long long)st.bytes[STRATA_COLL_ALLGATHER], (unsigned long long)want_ag);
    CHECK(st.calls[STRATA_COLL_BROADCAST] == 1 && st.bytes[STRATA_COLL_BROADCAST] == want_bc,
          "broadcast counted: %llu bytes (want %llu)",
          (unsigned long long)st.bytes[STRATA_COLL_BROADCAST], (unsigned long long)want_bc);
    CHECK(st.calls[STRATA_COLL_BARRIER] == 1 && st.bytes[STRATA_COLL_BARRIER] == 0,
          "barrier counted: 1 call, 0 bytes");
    if (W == 1)
        CHECK(want_ar == 0 && want_rs == 0 && want_ag == 0, "world 1 moves no bytes");
    ffree(a);
    ffree(rs_in);
    ffree(rs_out);
    strata_free(dev, STRATA_MEM_HOST, ag);
}

/* Compute-stream work between the collectives: a plain host task on the inline stream. */
typedef struct fill_job {
    float *buf;
    size_t n;
    int salt;
} fill_job;
static void fill_fn(void *arg) {
    fill_job *j = arg;
    for (size_t i = 0; i < j->n; i++) j->buf[i] = (float)(R * 1000 + (int)((i + (size_t)j->salt) % 500));
}

static void test_ordering_with_events(strata_comm *c) {
    enum { N = 200000, ROUNDS = 4 };
    strata_stream *cs = strata_comm_stream(c);
    strata_event *grads_ready = strata_event_create(dev), *comm_done = strata_event_create(dev);
    float *g[ROUNDS], *shard = falloc(N), *other = falloc(N);
    fill_job jobs[ROUNDS];
    strata_comm_trace(c, 64);
    for (int k = 0; k < ROUNDS; k++) {
        g[k] = falloc(N * (size_t)W);
        /* compute produces round k's gradients, then the comm stream reduces them while
         * compute goes on with the next round. */
        jobs[k] = (fill_job){g[k], N * (size_t)W, k * 7};
        MUST(strata_host_task(dev, dev->compute, fill_fn, &jobs[k]));
        MUST(strata_event_record(dev, grads_ready, dev->compute));
        MUST(strata_stream_wait_event(dev, cs, grads_ready));
        strata_allreduce(c, g[k], N);                              /* first block in place */
        strata_reduce_scatter(c, g[k] + (size_t)R * N, g[k], N);   /* whole buffer, aliased */
    }
    fill_job unrelated = {other, N, 3};
    MUST(strata_host_task(dev, dev->compute, fill_fn, &unrelated)); /* overlaps the collectives */
    MUST(strata_event_record(dev, comm_done, cs));
    MUST(strata_stream_wait_event(dev, dev->compute, comm_done)); /* joins: blocks this thread */
    MUST(strata_memcpy_async(dev, dev->compute, shard, g[ROUNDS - 1] + (size_t)R * N, N * sizeof(float)));

    size_t bad = 0;
    for (int k = 0; k < ROUNDS; k++) {
        /* Block R after both collectives: for R == 0 the all-reduced values were summed
         * again by the reduce-scatter (W times the all-reduce); otherwise plain sums. */
        const float *blk = g[k] + (size_t)R * N;
        for (size_t i = 0; i < N; i++) {
            int v = (int)(((size_t)R * N + i + (size_t)k * 7) % 500);
            float want = R == 0 ? (float)W * rank_sum(v) : rank_sum(v);
            bad += blk[i] != want;
        }
    }
    CHECK(bad == 0, "%d rounds of compute -> event -> all-reduce -> reduce-scatter: %zu wrong",
          ROUNDS, bad);
    CHECK(memcmp(shard, g[ROUNDS - 1] + (size_t)R * N, N * sizeof(float)) == 0,
          "the compute stream's copy after the join saw the final shard");

    strata_comm_trace(c, 0);
    const strata_comm_span *sp = NULL;
    int ns = strata_comm_spans(c, &sp);
    int ordered = ns == 2 * ROUNDS;
    for (int i = 0; i < ns && ordered; i++) {
        ordered = sp[i].kind == (i % 2 ? STRATA_COLL_REDUCE_SCATTER : STRATA_COLL_ALLREDUCE) &&
                  sp[i].end_ms >= sp[i].start_ms && (i == 0 || sp[i].start_ms >= sp[i - 1].end_ms);
    }
    CHECK(ordered, "trace has %d spans in enqueue order, none overlapping the previous", ns);
    strata_allreduce(c, other, 10);
    MUST(strata_stream_sync(dev, cs));
    CHECK(strata_comm_spans(c, &sp) == ns, "nothing is recorded after the trace stops");

    for (int k = 0; k < ROUNDS; k++) ffree(g[k]);
    ffree(shard);
    ffree(other);
    strata_event_destroy(dev, grads_ready);
    strata_event_destroy(dev, comm_done);
}

static void test_errors(strata_comm *c, strata_stream *s) {
    CHECK(strata_broadcast(c, NULL, 0, W) != 0 && strstr(strata_error(), "root"),
          "broadcast from a rank outside the world fails: %s", strata_error());
    float *in = falloc(8 * (size_t)W);
    int bad_alias = strata_reduce_scatter(c, in + 1, in, 8);
    CHECK(bad_alias != 0 && strstr(strata_error(), "overlaps"),
          "reduce-scatter with a partly overlapping out fails: %s", strata_error());
    ffree(in);
    CHECK(strata_comm_open(dev, s, 0) == NULL && strstr(strata_error(), "timeout_s"),
          "timeout 0 is refused: %s", strata_error());
    CHECK(strata_comm_open(dev, NULL, 10) == NULL, "a NULL stream is refused: %s", strata_error());
}

/* Records of queued collectives are reused: rounds of DEPTH + 1 queued collectives make
 * DEPTH + 1 records once (the single backend none: it needs them only to trace). */
static void test_task_reuse(strata_comm *c, const char *label) {
    enum { DEPTH = 24 };
    float *b = falloc(1000);
    memset(b, 0, 1000 * sizeof(float));
    int counts[3], before = strata_comm_task_records(c);
    for (int round = 0; round < 3; round++) {
        gate g = GATE_INIT;
        MUST(strata_host_task(dev, strata_comm_stream(c), gate_wait, &g));
        for (int i = 0; i < DEPTH; i++) strata_allreduce(c, b, 1000);
        strata_broadcast(c, b, 400, 0);
        gate_open(&g);
        MUST(strata_stream_sync(dev, strata_comm_stream(c)));
        counts[round] = strata_comm_task_records(c);
    }
    int want = strcmp(strata_comm_backend_name(c), "single") ? DEPTH + 1 : before;
    if (want < before) want = before;
    CHECK(counts[0] == want && counts[1] == want && counts[2] == want,
          "%stask records after 3 rounds of %d queued collectives: %d %d %d (want %d each)", label, DEPTH + 1,
          counts[0], counts[1], counts[2], want);
    size_t bad = 0;
    for (int i = 0; i < 1000; i++) bad += b[i] != 0.0f;
    CHECK(bad == 0, "%sall-reduces of zeros stay zero: %zu wrong", label, bad);
    ffree(b);
}

/* Sets (value) or unsets (NULL) an environment variable, returning its old value. */
static char *swap_env(const char *name, const char *value) {
    const char *old = getenv(name);
    char *saved = old ? strata_xstrdup(old) : NULL, *v = value ? strata_xstrdup(value) : NULL;
    if (v) setenv(name, v, 1); /* value may be the string being replaced */
    else unsetenv(name);
    free(v);
    return saved;
}
static void restore_env(const char *name, char *saved) {
    if (saved) setenv(name, saved, 1);
    else unsetenv(name);
    free(saved);
}

/* A comm opened with STRATA_COMM_CHUNK_ELEMS / STRATA_COMM_STAGE / _STAGE_BYTES set to
 * the given values (NULL: unset) for the open only. */
static strata_comm *open_with(strata_stream *s, const char *chunk, const char *stage, const char *stage_bytes) {
    char *c0 = swap_env("STRATA_COMM_CHUNK_ELEMS", chunk);
    char *s0 = swap_env("STRATA_COMM_STAGE", stage);
    char *b0 = swap_env("STRATA_COMM_STAGE_BYTES", stage_bytes);
    strata_comm *c = strata_comm_open(dev, s, 60.0);
    restore_env("STRATA_COMM_CHUNK_ELEMS", c0);
    restore_env("STRATA_COMM_STAGE", s0);
    restore_env("STRATA_COMM_STAGE_BYTES", b0);
    return c;
}

static void test_stage_env_errors(strata_stream *s) {
    strata_comm *c = open_with(s, NULL, "2", NULL);
    CHECK(c == NULL && strstr(strata_error(), "STRATA_COMM_STAGE=\"2\""), "STRATA_COMM_STAGE=2 is refused: %s",
          strata_error());
    c = open_with(s, NULL, "1", "10");
    CHECK(c == NULL && strstr(strata_error(), "STRATA_COMM_STAGE_BYTES"),
          "a staging buffer of 10 bytes is refused: %s", strata_error());
    c = open_with(s, NULL, "0", NULL);
    CHECK(c != NULL && strata_comm_pinned_bytes(c) == 0, "STRATA_COMM_STAGE=0 holds no pinned memory");
    strata_comm_close(c);
}

/* The backend and its stream come from the config, the device and the launch. */
static void test_open_config(void) {
    strata_config cfg;
    strata_config_defaults(&cfg);
    const char *want = strata_mpi_active() ? "mpi" : "single";
    strata_comm *c = strata_comm_open_config(dev, &cfg);
    CHECK(c && !strcmp(strata_comm_backend_name(c), want) && strata_comm_world(c) == W && strata_comm_rank(c) == R,
          "comm.backend auto on the cpu opens %s at world %d", c ? strata_comm_backend_name(c) : strata_error(), W);
    if (c) {
        float *b = falloc(100);
        for (int i = 0; i < 100; i++) b[i] = (float)(R * 1000 + i);
        int rc = strata_allreduce(c, b, 100);
        MUST(strata_stream_sync(dev, strata_comm_stream(c)));
        size_t bad = 0;
        for (int i = 0; i < 100; i++) bad += b[i] != rank_sum(i);
        CHECK(rc == 0 && bad == 0, "an all-reduce on the comm's own stream: %zu wrong", bad);
        ffree(b);
        strata_comm_close(c); /* destroys its stream too */
    }
    CHECK(strata_config_set(&cfg, "comm.backend=mpi") == 0, "comm.backend=mpi is a valid setting");
    c = strata_comm_open_config(dev, &cfg);
    CHECK(c && !strcmp(strata_comm_backend_name(c), want), "comm.backend mpi opens %s",
          c ? strata_comm_backend_name(c) : strata_error());
    strata_comm_close(c);

    CHECK(strata_config_set(&cfg, "comm.backend=nccl") == 0, "comm.backend=nccl is a valid setting");
    c = strata_comm_open_config(dev, &cfg);
    CHECK(c == NULL && strstr(strata_error(), "comm.backend is nccl") && strstr(strata_error(), "cpu"),
          "comm.backend nccl on the cpu is refused: %s", strata_error());

    c = strata_comm_open_local(dev);
    CHECK(c && !strcmp(strata_comm_backend_name(c), "single") && strata_comm_world(c) == 1 &&
              strata_comm_pinned_bytes(c) == 0,
          "a local comm is a world of one even under mpirun");
    strata_comm_close(c);
    CHECK(strata_comm_open_config(NULL, &cfg) == NULL && strata_comm_open_config(dev, NULL) == NULL,
          "a NULL device or config is refused: %s", strata_error());
}

/* A build without NCCL links the stub backend half: it says so, and refuses to open. */
static void test_nccl_stub(void) {
#ifndef STRATA_HAVE_NCCL
    CHECK(!strata_nccl_available(), "the stub says NCCL is not available");
    unsigned char id[STRATA_NCCL_ID_BYTES];
    strata_nccl *n = strata_nccl_open(NULL, 0, id, 0, 1, 1.0, NULL, NULL);
    CHECK(!n && strstr(strata_error(), "built without NCCL") && strata_nccl_unique_id(id) != 0,
          "its functions fail saying why: %s", strata_error());
    strata_nccl_close(NULL);
#else
    CHECK(strata_nccl_available(), "a build with NCCL says so");
#endif
}

static int run_watchdog(strata_comm *c) {
    if (R == 0) {
        /* Never joins: the others' barrier must time out and end the job, this rank too. */
        sleep(30);
        printf("[rank 0] FAIL the job was not aborted within 30 s\n");
        return 1;
    }
    strata_barrier(c);
    MUST(strata_stream_sync(dev, strata_comm_stream(c)));
    printf("[rank %d] FAIL the barrier completed without rank 0\n", R);
    return 1;
}

int main(int argc, char **argv) {
    alarm(120); /* a hang must fail, not stall CI */
    int local = 0;
    if (strata_mpi_init(&argc, &argv, &R, &W, &local)) {
        fprintf(stderr, "mpi init: %s\n", strata_error());
        return 1;
    }
    my_rank = R;
    /* every rank checks; rank 0 prints its passes, any rank its failures */
    snprintf(check_prefix, sizeof check_prefix, "[rank %d] ", R);
    check_quiet = R != 0;
    strata_log_init(R, W);
    dev = strata_device_open("cpu", 0);
    strata_stream *s = dev ? strata_stream_create(dev, "comm", STRATA_STREAM_HOST) : NULL;
    if (!s) {
        fprintf(stderr, "device: %s\n", strata_error());
        strata_mpi_abort(1);
    }
    int watchdog = getenv("STRATA_TEST_COMM_WATCHDOG") != NULL;
    strata_comm *c = strata_comm_open(dev, s, watchdog ? 1.0 : 60.0);
    if (!c) {
        fprintf(stderr, "comm open: %s\n", strata_error());
        strata_mpi_abort(1);
    }
    if (watchdog) strata_mpi_abort(run_watchdog(c));

    CHECK(strata_comm_rank(c) == R && strata_comm_world(c) == W, "comm is rank %d of %d", R, W);
    const char *want_backend = strata_mpi_active() ? "mpi" : "single";
    CHECK(!strcmp(strata_comm_backend_name(c), want_backend), "backend is %s",
          strata_comm_backend_name(c));
    CHECK(local >= 0 && local < W, "local rank %d", local);
    const char *stage_env = getenv("STRATA_COMM_STAGE");
    /* staged by default between several ranks (setup_stage in shard/comm.c) */
    int staged = strata_mpi_active() && (stage_env ? !strcmp(stage_env, "1") : W > 1);
    CHECK((strata_comm_pinned_bytes(c) > 0) == staged, "the main comm %s (%zu pinned bytes)",
          staged ? "stages through pinned memory" : "reads buffers directly", strata_comm_pinned_bytes(c));

    const char *main_label = staged ? "staged " : "";
    test_allreduce(c, main_label);
    test_reduce_scatter(c, main_label);
    test_bf16(c, main_label);
    test_allgather(c, main_label);
    test_broadcast(c, main_label);
    test_host_f64(c);
    test_counters(c);
    test_ordering_with_events(c);
    test_task_reuse(c, main_label);
    test_errors(c, s);
    test_open_config();
    test_nccl_stub();

    /* A second comm whose MPI calls carry at most 100000 elements: the chunked and
     * per-block paths (with a remainder chunk), on the same data and oracles. */
    strata_comm *small = open_with(s, "100000", stage_env, getenv("STRATA_COMM_STAGE_BYTES"));
    CHECK(small != NULL, "comm with 100000-element chunks opens");
    if (small) {
        const char *label = staged ? "staged chunked " : "chunked ";
        test_allreduce(small, label);
        test_reduce_scatter(small, label);
        test_bf16(small, label);
        test_allgather(small, label);
        test_broadcast(small, label);
        strata_comm_close(small);
    }

    if (strata_mpi_active()) {
        /* Staged through 1 MiB (4-5 MiB buffers take several chunks), then through an odd
         * 300001 bytes with 100000-element MPI calls (remainder chunks everywhere). */
        strata_comm *st = open_with(s, NULL, "1", "1048576");
        CHECK(st && strata_comm_pinned_bytes(st) == 1048576, "a staged comm holds its 1 MiB of pinned memory");
        if (st) {
            test_allreduce(st, "staged ");
            test_reduce_scatter(st, "staged ");
            test_bf16(st, "staged ");
            test_allgather(st, "staged ");
            test_broadcast(st, "staged ");
            test_host_f64(st);
            test_counters(st);
            test_ordering_with_events(st);
            test_task_reuse(st, "staged ");
            strata_comm_close(st);
        }
        st = open_with(s, "100000", "1", "300001");
        CHECK(st && strata_comm_pinned_bytes(st) == 300001, "a staged comm with 300001 bytes and 100000-element calls opens");
        if (st) {
            test_allreduce(st, "staged small ");
            test_reduce_scatter(st, "staged small ");
            test_bf16(st, "staged small ");
            test_allgather(st, "staged small ");
            test_broadcast(st, "staged small ");
            strata_comm_close(st);
        }
        test_stage_env_errors(s);
    }

    /* Every rank returns the same verdict. */
    double total_failures = failures;
    strata_allreduce_host_f64(c, &total_failures, 1);
    strata_comm_close(c);
    strata_stream_destroy(dev, s);
    strata_device_close(dev);
    strata_mpi_finalize();
    if (R == 0)
        printf("%s: %d failure%s on rank 0, %.0f on all %d ranks\n", total_failures ? "FAILED" : "passed",
               failures, failures == 1 ? "" : "s", total_failures, W);
    return total_failures ? 1 : 0;
}
