/* tests/test_comm_gpu.c: the collectives on GPU buffers, with the exact small-integer
 * oracles of test_comm.c; every buffer is filled and read back through copies.
 *  - plain (world 1): the single backend on its DEVICE stream, and the nccl backend with
 *    its own unique id and one rank (comm.backend nccl without mpirun);
 *  - under mpirun (bench/gpu-check.sh runs 2 ranks): the mpi backend staging device
 *    buffers through pinned memory in many chunks, then nccl when every rank has its
 *    own GPU, or else the clear refusal of comm.backend nccl (NCCL rejects two ranks on
 *    one GPU) and auto falling back to mpi.
 * Each backend also runs compute -> event -> collective -> event -> compute, and nccl an
 * all-reduce of more than INT_MAX floats when the GPU has room. Ranks share GPUs
 * round-robin when there are more ranks than GPUs (the device open wraps the local rank).
 * Skips (77) without CUDA or a GPU. */
#include <limits.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "core/device.h"
#include "io/config.h"
#include "shard/comm.h"
#include "tests/check.h"

static strata_device *G;
static int R, W;

/* Host <-> device through the compute stream, waited for. */
static void put(void *dev_dst, const void *host_src, size_t bytes) {
    MUST(strata_memcpy_async(G, G->compute, dev_dst, host_src, bytes));
    MUST(strata_stream_sync(G, G->compute));
}
static void get(void *host_dst, const void *dev_src, size_t bytes) {
    MUST(strata_memcpy_async(G, G->compute, host_dst, dev_src, bytes));
    MUST(strata_stream_sync(G, G->compute));
}
static void *dalloc(size_t bytes) { return strata_alloc(G, STRATA_MEM_DEVICE, bytes ? bytes : 1); }
static void dfree(void *p) { strata_free(G, STRATA_MEM_DEVICE, p); }

static float rank_sum(int v) { return 1000.0f * (float)(W * (W - 1) / 2) + (float)W * (float)v; }

static void test_allreduce(strata_comm *c, const char *label) {
    const size_t sizes[] = {1, 7, 1000, (1u << 20) + 3};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        size_t n = sizes[s];
        float *h = strata_xmalloc(n * sizeof *h), *d = dalloc(n * sizeof *h);
        for (size_t i = 0; i < n; i++) h[i] = (float)(R * 1000 + (int)(i % 997));
        put(d, h, n * sizeof *h);
        int rc = strata_allreduce(c, d, n);
        MUST(strata_stream_sync(G, strata_comm_stream(c)));
        get(h, d, n * sizeof *h);
        size_t bad = 0;
        for (size_t i = 0; i < n; i++) bad += h[i] != rank_sum((int)(i % 997));
        CHECK(rc == 0 && bad == 0, "%sall-reduce of %zu floats: %zu wrong", label, n, bad);
        free(h);
        dfree(d);
    }
}

static float rs_in(int r, size_t j) { return (float)(r * 1000 + (int)(j % 1013)); }

static void test_reduce_scatter(strata_comm *c, const char *label) {
    const size_t sizes[] = {1, 333, (1u << 20) + 5};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        size_t n = sizes[s], n_all = n * (size_t)W;
        float *h = strata_xmalloc(n_all * sizeof *h), *in = dalloc(n_all * sizeof *h), *out = dalloc(n * sizeof *h);
        for (int aliased = 0; aliased < 2; aliased++) {
            for (size_t j = 0; j < n_all; j++) h[j] = rs_in(R, j);
            put(in, h, n_all * sizeof *h);
            float *dst = aliased ? in + (size_t)R * n : out;
            int rc = strata_reduce_scatter(c, dst, in, n);
            MUST(strata_stream_sync(G, strata_comm_stream(c)));
            get(h, in, n_all * sizeof *h);
            size_t bad = 0, changed = 0;
            for (size_t j = 0; j < n_all; j++)
                if (!aliased || j / n != (size_t)R) changed += h[j] != rs_in(R, j);
            if (!aliased) get(h + (size_t)R * n, out, n * sizeof *h);
            for (size_t i = 0; i < n; i++) bad += h[(size_t)R * n + i] != rank_sum((int)(((size_t)R * n + i) % 1013));
            CHECK(rc == 0 && bad == 0 && changed == 0, "%sreduce-scatter %zu floats/rank%s: %zu wrong, input changed at %zu",
                  label, n, aliased ? " in place" : "", bad, changed);
        }
        free(h);
        dfree(in);
        dfree(out);
    }
}

static unsigned char ag_byte(int r, size_t j) { return (unsigned char)(r * 31 + j * 7 + (j >> 9)); }

static void test_allgather(strata_comm *c, const char *label) {
    const size_t sizes[] = {1, 4099, 3u * 1024 * 1024 + 1};
    for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
        size_t b = sizes[s], all = b * (size_t)W;
        unsigned char *h = strata_xmalloc(all), *out = dalloc(all), *in = dalloc(b);
        for (int aliased = 0; aliased < 2; aliased++) {
            memset(h, 0xEE, all);
            for (size_t j = 0; j < b; j++) h[(size_t)R * b + j] = ag_byte(R, j);
            if (aliased) put(out, h, all);
            else put(in, h + (size_t)R * b, b);
            int rc = strata_allgather(c, out, aliased ? out + (size_t)R * b : in, b);
            MUST(strata_stream_sync(G, strata_comm_stream(c)));
            get(h, out, all);
            size_t bad = 0;
            for (size_t j = 0; j < all; j++) bad += h[j] != ag_byte((int)(j / b), j % b);
            CHECK(rc == 0 && bad == 0, "%sall-gather %zu bytes/rank%s: %zu wrong", label, b, aliased ? " in place" : "", bad);
        }
        free(h);
        dfree(out);
        dfree(in);
    }
}

static void test_broadcast(strata_comm *c, const char *label) {
    const size_t sizes[] = {1, 100003, 5u * 1024 * 1024};
    const int roots[] = {W - 1, 0};
    for (int ri = 0; ri < 2; ri++) {
        for (size_t s = 0; s < sizeof sizes / sizeof *sizes; s++) {
            size_t n = sizes[s];
            unsigned char *h = strata_xmalloc(n), *d = dalloc(n);
            for (size_t j = 0; j < n; j++) h[j] = R == roots[ri] ? (unsigned char)(j * 13 + 1) : (unsigned char)R;
            put(d, h, n);
            int rc = strata_broadcast(c, d, n, roots[ri]);
            MUST(strata_stream_sync(G, strata_comm_stream(c)));
            get(h, d, n);
            size_t bad = 0;
            for (size_t j = 0; j < n; j++) bad += h[j] != (unsigned char)(j * 13 + 1);
            CHECK(rc == 0 && bad == 0, "%sbroadcast %zu bytes from root %d: %zu wrong", label, n, roots[ri], bad);
            free(h);
            dfree(d);
        }
    }
    CHECK(strata_barrier(c) == 0 && strata_stream_sync(G, strata_comm_stream(c)) == 0, "%sbarrier completes", label);
    double v[2] = {R + 0.5, -(double)R};
    double s = (double)W * (W - 1) / 2;
    CHECK(strata_allreduce_host_f64(c, v, 2) == 0 && v[0] == s + 0.5 * W && v[1] == -s,
          "%shost f64 all-reduce: %.1f %.1f", label, v[0], v[1]);
}

/* The engine's pattern: compute writes, the comm stream waits on an event, reduces, and
 * compute waits on the comm's event before reading. Only the compute stream is synced. */
static void test_events(strata_comm *c, const char *label) {
    enum { N = 300000, ROUNDS = 3 };
    strata_stream *cs = strata_comm_stream(c);
    strata_event *ready = strata_event_create(G), *done = strata_event_create(G);
    float *h = strata_xmalloc(N * sizeof *h), *d = dalloc(N * sizeof *h);
    size_t bad = 0;
    for (int k = 0; k < ROUNDS; k++) {
        for (size_t i = 0; i < N; i++) h[i] = (float)(R * 1000 + (int)((i + (size_t)k) % 500));
        MUST(strata_memcpy_async(G, G->compute, d, h, N * sizeof *h));
        MUST(strata_event_record(G, ready, G->compute));
        MUST(strata_stream_wait_event(G, cs, ready));
        strata_allreduce(c, d, N);
        MUST(strata_event_record(G, done, cs));
        MUST(strata_stream_wait_event(G, G->compute, done));
        MUST(strata_memcpy_async(G, G->compute, h, d, N * sizeof *h));
        MUST(strata_stream_sync(G, G->compute));
        for (size_t i = 0; i < N; i++) bad += h[i] != rank_sum((int)((i + (size_t)k) % 500));
    }
    CHECK(bad == 0, "%s%d rounds of compute -> event -> all-reduce -> event -> compute: %zu wrong", label, ROUNDS, bad);
    MUST(strata_stream_sync(G, cs));
    free(h);
    dfree(d);
    strata_event_destroy(G, ready);
    strata_event_destroy(G, done);
}

/* NCCL counts are size_t: 2^31 + 3 floats (8 GiB) in one call, checked at samples on
 * both sides of INT_MAX. Every float is the same byte pattern v, so the sum is W v. */
static void test_large(strata_comm *c, const char *label) {
    size_t n = ((size_t)1 << 31) + 3, bytes = n * sizeof(float), free_b = 0, total_b = 0;
    if (G->ops->mem_info(G, &free_b, &total_b) || free_b < bytes + ((size_t)4 << 30)) {
        printf("%sskip: the all-reduce of 2^31 + 3 floats needs 12 GiB free\n", check_prefix);
        return;
    }
    unsigned char *d = dalloc(bytes);
    MUST(strata_memset_async(G, G->compute, d, 0x3F, bytes));
    MUST(strata_stream_sync(G, G->compute));
    float v;
    memset(&v, 0x3F, sizeof v);
    int rc = strata_allreduce(c, (float *)d, n);
    MUST(strata_stream_sync(G, strata_comm_stream(c)));
    const size_t at[] = {0, 1, (size_t)INT_MAX - 1, (size_t)INT_MAX, (size_t)INT_MAX + 1, n - 1};
    float first = 0.0f;
    size_t bad = 0;
    for (size_t i = 0; i < sizeof at / sizeof *at; i++) {
        float x;
        get(&x, d + at[i] * sizeof(float), sizeof x);
        if (i == 0) first = x;
        bad += x != first;
    }
    float want = (float)W * v, err = first > want ? first - want : want - first;
    CHECK(rc == 0 && bad == 0 && err <= 1e-6f * want, "%sall-reduce of %zu floats (past INT_MAX): %g, want %g, %zu differ",
          label, n, first, want, bad);
    dfree(d);
}

static void run_all(strata_comm *c, const char *label) {
    test_allreduce(c, label);
    test_reduce_scatter(c, label);
    test_allgather(c, label);
    test_broadcast(c, label);
    test_events(c, label);
}

/* A config with comm.backend set, opened with STRATA_COMM_STAGE_BYTES set for the
 * open only (NULL leaves it unset). */
static strata_comm *open_backend(const char *backend, const char *stage_bytes) {
    strata_config cfg;
    strata_config_defaults(&cfg);
    char set[64];
    snprintf(set, sizeof set, "comm.backend=%s", backend);
    if (strata_config_set(&cfg, set)) return NULL;
    cfg.comm.timeout_s = 120;
    if (stage_bytes) setenv("STRATA_COMM_STAGE_BYTES", stage_bytes, 1);
    strata_comm *c = strata_comm_open_config(G, &cfg);
    if (stage_bytes) unsetenv("STRATA_COMM_STAGE_BYTES");
    return c;
}

#ifdef STRATA_HAVE_NCCL
#define HAVE_NCCL 1
#else
#define HAVE_NCCL 0
#endif

int main(int argc, char **argv) {
    alarm(600); /* a hang must fail, not stall the GPU check */
    int local = 0;
    if (strata_mpi_init(&argc, &argv, &R, &W, &local)) {
        fprintf(stderr, "mpi init: %s\n", strata_error());
        return 1;
    }
    snprintf(check_prefix, sizeof check_prefix, "[rank %d] ", R);
    check_quiet = R != 0;
    strata_log_init(R, W);
    if (!strata_cuda_available()) {
        if (R == 0) printf("skip: no GPU (or built without CUDA)\n");
        strata_mpi_finalize();
        return 77;
    }
    G = strata_device_open("cuda", local);
    if (!G) G = strata_device_open("cuda", 0); /* GPU `local` would not open: try GPU 0 */
    if (!G) {
        fprintf(stderr, "[rank %d] device: %s\n", R, strata_error());
        strata_mpi_abort(1);
    }
    if (R == 0) printf("%s, world %d, NCCL %s\n", G->description, W, HAVE_NCCL ? "built in" : "not built");

    if (!strata_mpi_active()) {
        strata_comm *c = open_backend("auto", NULL);
        CHECK(c && !strcmp(strata_comm_backend_name(c), "single"), "world 1 auto opens single: %s",
              c ? strata_comm_backend_name(c) : strata_error());
        if (c) run_all(c, "single ");
        strata_comm_close(c);

        c = open_backend("nccl", NULL);
        if (HAVE_NCCL) {
            CHECK(c && !strcmp(strata_comm_backend_name(c), "nccl") && strata_comm_world(c) == 1,
                  "comm.backend nccl without mpirun opens nccl at world 1: %s", c ? "yes" : strata_error());
            if (c) {
                run_all(c, "nccl ");
                test_large(c, "nccl ");
            }
        } else {
            CHECK(c == NULL && strstr(strata_error(), "built without NCCL"), "nccl refused without NCCL: %s",
                  strata_error());
        }
        strata_comm_close(c);
    } else {
        /* 1000000 bytes of staging: every large buffer takes several chunks */
        strata_comm *c = open_backend("mpi", "1000000");
        CHECK(c && !strcmp(strata_comm_backend_name(c), "mpi") && strata_comm_pinned_bytes(c) == 1000000,
              "comm.backend mpi on the GPU stages through 1000000 pinned bytes: %s", c ? "yes" : strata_error());
        if (c) run_all(c, "staged mpi ");
        strata_comm_close(c);

        c = open_backend("auto", NULL);
        const char *picked = c ? strata_comm_backend_name(c) : strata_error();
        int shared = c && !strcmp(picked, "mpi");
        CHECK(c && !strcmp(picked, HAVE_NCCL && !shared ? "nccl" : "mpi"), "auto under mpirun picks %s%s", picked,
              shared ? " (ranks share a GPU)" : "");
        strata_comm_close(c);

        c = open_backend("nccl", NULL);
        if (HAVE_NCCL && !shared) {
            CHECK(c && !strcmp(strata_comm_backend_name(c), "nccl"), "comm.backend nccl opens: %s",
                  c ? "yes" : strata_error());
            if (c) {
                run_all(c, "nccl ");
                test_large(c, "nccl ");
            }
        } else {
            CHECK(c == NULL && strstr(strata_error(), "comm.backend is nccl"), "comm.backend nccl is refused: %s",
                  strata_error());
        }
        strata_comm_close(c);
    }

    /* Every rank returns the same verdict (comm.backend mpi is "single" at world 1). */
    double total = failures;
    strata_config cfg;
    strata_config_defaults(&cfg);
    strata_config_set(&cfg, "comm.backend=mpi");
    strata_comm *agree = strata_comm_open_config(G, &cfg);
    if (agree) strata_allreduce_host_f64(agree, &total, 1);
    strata_comm_close(agree);
    strata_device_close(G);
    strata_mpi_finalize();
    if (R == 0)
        printf("%s: %d failure%s on rank 0, %.0f on all %d ranks\n", total ? "FAILED" : "passed", failures,
               failures == 1 ? "" : "s", total, W);
    return total ? 1 : 0;
}
