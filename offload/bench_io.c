/* offload/bench_io.c: the transfer table of offload/bench_io.h. */
#include <stdio.h>
#include <string.h>

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

static int bench_nvme(FILE *out, const char *dir, size_t block_bytes, int queue_depth,
                      void *buf, size_t total) {
    size_t reg_size = total;
    void *reg = buf;
    strata_nvme_store *st =
        strata_nvme_open(dir, 0, total, block_bytes, queue_depth, &reg, &reg_size, 1);
    if (!st) return strata_fail_wrap("bench io");
    char label[160], hb[32];
    snprintf(label, sizeof label, "(%s, %s, qd %d, %s blocks)",
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
    if (rc == 0) {
        char name[200];
        snprintf(name, sizeof name, "nvme write %s", label);
        row(out, name, total, best_w);
        snprintf(name, sizeof name, "nvme read %s", label);
        row(out, name, total, best_r);
        fprintf(out, "  (nvme file %s)\n", strata_nvme_path(st));
    }
    strata_nvme_close(st); /* keeps this thread's error from the failed request */
    return rc == 0 ? 0 : strata_fail_wrap("bench io");
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
