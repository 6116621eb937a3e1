/* offload/bench_io.h: `strata bench io`, the transfer rates the offload tiers depend on.
 *
 * Prints one table row per path, best of a few repetitions, in GB/s (1e9 bytes/s):
 *   pinned H2D / D2H     memcpy_async on a device stream between pinned and device memory
 *   pageable H2D / D2H   the same from plain host memory (what pinning buys)
 *   nvme write / read    one request of total_bytes through offload/nvme.h (O_DIRECT and
 *                        io_uring unless the store fell back), block_bytes per I/O and
 *                        queue_depth in flight, into a registered pinned buffer
 * On the CPU backend the copies are memcpy. The NVMe rows are skipped when nvme_dir is
 * NULL. The write row is the second pass, after one pass that turns the preallocated
 * extents into written ones (training rewrites the same file). */
#ifndef STRATA_BENCH_IO_H
#define STRATA_BENCH_IO_H

#include <stddef.h>
#include <stdio.h>

#include "core/device.h"

/* Bandwidths in GB/s, for the offload floor (launcher/train.c); 0: not measured. */
typedef struct strata_floor_bandwidth {
    double h2d, d2h;             /* pinned <-> device, as the pinned rows */
    double host;                 /* host memory: a streaming a += s * b over all OpenMP threads */
    double disk_read, disk_write; /* as the nvme rows, at offload.block_kb and queue_depth */
    size_t copy_bytes, host_bytes, disk_bytes; /* what each was measured on */
} strata_floor_bandwidth;

/* The floor's bandwidths, measured on the caller's memory, which is scratch here: pinned
 * (page-aligned) and device blocks, `bytes` of each used (rounded down to 4 KiB; the host
 * pass takes the pinned block's two halves). The disk is measured only when nvme_dir is
 * set, through a store of `bytes` that is removed again. Best of a few passes each, so
 * about 20 passes over `bytes` in all. The memory is left zeroed. 0, or -1 + error. */
int strata_measure_floor_bandwidth(strata_device *d, void *pinned, void *device, size_t bytes, const char *nvme_dir,
                                   int rank, size_t block_bytes, int queue_depth, strata_floor_bandwidth *bw);

/* 0, or -1 + error (allocation, stream or store failure); rows already printed stay. */
int strata_bench_io(FILE *out, strata_device *d, const char *nvme_dir, size_t block_bytes,
                    int queue_depth, size_t total_bytes);

#endif
