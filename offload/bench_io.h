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

/* 0, or -1 + error (allocation, stream or store failure); rows already printed stay. */
int strata_bench_io(FILE *out, strata_device *d, const char *nvme_dir, size_t block_bytes,
                    int queue_depth, size_t total_bytes);

#endif
