/* offload/bench_io.c: the transfer table of offload/bench_io.h. */
#include <stdio.h>
#include <string.h>

#include <omp.h>

#include "core/common.h"
#include "offload/bench_io.h"
#include "offload/nvme.h"
#include "offload/pinned.h"

#define BENCH_REPS 3

static void row(FILE *out, const char *name, size_t bytes, double ms) {
    fprintf(out, "  %-58s %8.2f GB/s  %9.2f ms\n", name, (double)bytes / (ms * 1e6), ms);
}

/* Best of BENCH_REPS copies of bytes from src to dst on stream s, in ms; -1 on failure. */
static double time_copy(strata_device *d, strata_stream *s, void *dst, const void *src,
                        size_t bytes) {
    double best = -1;
    for (int r = 0; r < BENCH_REPS; r++) {
        double t0 = strata_now_ms();
        if (strata_memcpy_async(d, s, dst, src, bytes) != 0 || strata_stream_sync(d, s) != 0)
            return -1;
        double ms = strata_now_ms() - t0;
        if (best < 0 || ms < best) best = ms;
    }
    return best;
}

/* Best write and read of `total` bytes from buf through a store in dir (removed after),
 * in ms; its description into label. 0, or -1 + error. */
static int time_nvme(const char *dir, int rank, size_t block_bytes, int queue_depth, void *buf, size_t total,
                     double *write_ms, double *read_ms, char *label, size_t label_len) {
    size_t reg_size = total;
    void *reg = buf;
    strata_nvme_store *st =
        strata_nvme_open(dir, rank, total, block_bytes, queue_depth, &reg, &reg_size, 1);
    if (!st) return -1;
    char hb[32];
    snprintf(label, label_len, "(%s, %s, qd %d, %s blocks)",
             strata_nvme_is_direct(st) ? "O_DIRECT" : "buffered",
             strata_nvme_uses_uring(st) ? "io_uring" : "pread/pwrite", queue_depth,
             strata_fmt_bytes(hb, sizeof hb, (double)block_bytes));
    int rc = 0;
    double best_w = -1, best_r = -1;
    /* the first write turns the preallocated extents into written ones; not timed */
    if (strata_nvme_write(st, 0, buf, total) != 0) rc = -1;
    for (int r = 0; r < BENCH_REPS && rc == 0; r++) {
        double t0 = strata_now_ms();
        if (strata_nvme_write(st, 0, buf, total) != 0) rc = -1;
        double ms = strata_now_ms() - t0;
        if (best_w < 0 || ms < best_w) best_w = ms;
    }
    for (int r = 0; r < BENCH_REPS && rc == 0; r++) {
        double t0 = strata_now_ms();
        if (strata_nvme_read(st, 0, buf, total) != 0) rc = -1;
        double ms = strata_now_ms() - t0;
        if (best_r < 0 || ms < best_r) best_r = ms;
    }
    *write_ms = best_w;
    *read_ms = best_r;
    if (rc == 0) {
        size_t o = strlen(label);
        snprintf(label + o, label_len - o, " (file %s)", strata_nvme_path(st));
    }
    strata_nvme_close(st); /* keeps this thread's error from the failed request */
    return rc;
}

static int bench_nvme(FILE *out, const char *dir, size_t block_bytes, int queue_depth,
                      void *buf, size_t total) {
    char label[4096 + 200], name[4096 + 240];
    double best_w, best_r;
    if (time_nvme(dir, 0, block_bytes, queue_depth, buf, total, &best_w, &best_r, label, sizeof label))
        return strata_fail_wrap("bench io");
    char *file = strstr(label, " (file ");
    if (file) *file = 0;
    snprintf(name, sizeof name, "nvme write %s", label);
    row(out, name, total, best_w);
    snprintf(name, sizeof name, "nvme read %s", label);
    row(out, name, total, best_r);
    if (file) fprintf(out, "  (nvme %s\n", file + 2);
    return 0;
}

/* Best of BENCH_REPS passes of a += s * b over n floats (reads 8, writes 4 bytes each),
 * on every OpenMP thread, in ms. */
static double time_host_pass(float *a, const float *b, size_t n) {
    double best = -1;
    for (int r = 0; r < BENCH_REPS; r++) {
        double t0 = strata_now_ms();
#pragma omp parallel for schedule(static)
        for (size_t i = 0; i < n; i++) a[i] += 0.5f * b[i];
        double ms = strata_now_ms() - t0;
        if (best < 0 || ms < best) best = ms;
    }
    return best;
}

int strata_measure_floor_bandwidth(strata_device *d, void *pinned, void *device, size_t bytes, const char *nvme_dir,
                                   int rank, size_t block_bytes, int queue_depth, strata_floor_bandwidth *bw) {
    memset(bw, 0, sizeof *bw);
    bytes = bytes / STRATA_NVME_ALIGN * STRATA_NVME_ALIGN;
    if (bytes < 2 * STRATA_NVME_ALIGN) return 0; /* nothing to measure on */
    strata_stream *s = strata_stream_create(d, "floor", STRATA_STREAM_DEVICE);
    if (!s) return strata_fail_wrap("measuring the floor's bandwidths");
    memset(pinned, 0, bytes); /* every page touched before the clock starts */
    int rc = strata_memset_async(d, s, device, 0, bytes) || strata_stream_sync(d, s) ? -1 : 0;
    double h2d = rc ? -1 : time_copy(d, s, device, pinned, bytes);
    double d2h = h2d < 0 ? -1 : time_copy(d, s, pinned, device, bytes);
    if (d2h < 0) rc = -1;
    if (!rc) {
        bw->copy_bytes = bytes;
        bw->h2d = (double)bytes / (h2d * 1e6);
        bw->d2h = (double)bytes / (d2h * 1e6);
        size_t n = bytes / 2 / sizeof(float);
        bw->host_bytes = 3 * n * sizeof(float);
        bw->host = (double)bw->host_bytes / (time_host_pass(pinned, (float *)pinned + n, n) * 1e6);
    }
    if (!rc && nvme_dir) {
        double w_ms, r_ms;
        char label[4096 + 200];
        rc = time_nvme(nvme_dir, rank, block_bytes, queue_depth, pinned, bytes, &w_ms, &r_ms, label, sizeof label);
        if (!rc) {
            bw->disk_bytes = bytes;
            bw->disk_write = (double)bytes / (w_ms * 1e6);
            bw->disk_read = (double)bytes / (r_ms * 1e6);
        }
    }
    memset(pinned, 0, bytes);
    if (strata_memset_async(d, s, device, 0, bytes) || strata_stream_sync(d, s)) rc = -1;
    strata_stream_destroy(d, s);
    return rc ? strata_fail_wrap("measuring the floor's bandwidths") : 0;
}

int strata_bench_io(FILE *out, strata_device *d, const char *nvme_dir, size_t block_bytes,
                    int queue_depth, size_t total_bytes) {
    size_t total = strata_round_up(total_bytes ? total_bytes : 1, STRATA_PINNED_ALIGN);
    strata_pinned_pool *pool = strata_pinned_create(d, total);
    if (!pool) return strata_fail_wrap("bench io");
    void *pinned = strata_pinned_carve(pool, "bench-io", total);
    void *host = strata_alloc(d, STRATA_MEM_HOST, total);
    void *dev = strata_alloc(d, STRATA_MEM_DEVICE, total);
    strata_stream *s = strata_stream_create(d, "bench-io", STRATA_STREAM_DEVICE);
    int rc = 0;
    if (!pinned || !host || !dev || !s) {
        rc = strata_fail_wrap("bench io: cannot set up %zu-byte buffers", total);
        goto done;
    }
    /* touch every page first, so no row pays for page faults */
    memset(pinned, 0x3c, total);
    memset(host, 0x3c, total);
    if (strata_memset_async(d, s, dev, 0, total) != 0 || strata_stream_sync(d, s) != 0) {
        rc = strata_fail_wrap("bench io");
        goto done;
    }

    char ht[32];
    fprintf(out, "io bench on %s (%s): %s per transfer, best of %d\n", d->ops->name,
            d->description, strata_fmt_bytes(ht, sizeof ht, (double)total), BENCH_REPS);
    struct {
        const char *name;
        void *dst;
        const void *src;
    } copies[] = {{"pinned H2D (memcpy_async, device stream)", dev, pinned},
                  {"pinned D2H (memcpy_async, device stream)", pinned, dev},
                  {"pageable H2D (memcpy_async, device stream)", dev, host},
                  {"pageable D2H (memcpy_async, device stream)", host, dev}};
    for (size_t i = 0; i < sizeof copies / sizeof copies[0]; i++) {
        double ms = time_copy(d, s, copies[i].dst, copies[i].src, total);
        if (ms < 0) {
            rc = strata_fail_wrap("bench io: %s", copies[i].name);
            goto done;
        }
        row(out, copies[i].name, total, ms);
    }
    if (nvme_dir) rc = bench_nvme(out, nvme_dir, block_bytes, queue_depth, pinned, total);
    else fprintf(out, "  (nvme rows skipped: no directory given)\n");

done:
    strata_stream_destroy(d, s);
    if (dev) strata_free(d, STRATA_MEM_DEVICE, dev);
    if (host) strata_free(d, STRATA_MEM_HOST, host);
    strata_pinned_destroy(pool);
    return rc;
}
