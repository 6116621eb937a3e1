/* offload/pipeline.h: the offload update tier (core/update_tier.h): optimizer state away
 * from the device, updated by the CPU.
 *
 * With offload.optimizer: cpu the fp32 master weights and Adam moments of every unit's
 * range live in pinned host memory; with nvme they live in a per-rank O_DIRECT file
 * (offload/nvme.c) and pass through two pinned slots. Either way a unit's update is a
 * pipeline of three HOST streams, so copies in both directions overlap the CPU's work:
 *
 *   offload-in:  gradient shard device-to-host into a pinned staging buffer
 *   offload:     [nvme: the unit's state, prefetched while the previous unit updated]
 *                vectorised CPU AdamW (offload/cpu_adam.c, bitwise equal to the device
 *                kernel) -> updated parameters into a pinned staging buffer
 *                [nvme: state written back]
 *   offload-out: updated parameters host-to-device, then the caller's `done` event
 *
 * with offload.buffer_count staging buffers per direction. The caller meets it through
 * events: a unit's all-gather, or the next step's forward of that unit, follows its own
 * update while the CPU already updates the next unit. All pinned memory is reserved in
 * the arena up front (one registration); nothing grows during training. */
#ifndef STRATA_PIPELINE_H
#define STRATA_PIPELINE_H

#include "core/device.h"
#include "core/update_tier.h"
#include "io/config.h"

/* The tier cfg->offload.optimizer names, for the engine of this rank (dev may be NULL for
 * a plan only); NULL when it is none: the engine then updates on the device. The engine
 * it is handed to owns it. */
strata_update_tier *strata_offload_tier(const strata_config *cfg, strata_device *dev, int rank);
/* The threads the tier's CPU update runs on: offload.cpu_threads, or with 0 every core but
 * 2 when dev is a GPU, and 0 (OpenMP's default) otherwise. */
int strata_offload_cpu_threads(const strata_config *cfg, const strata_device *dev);

#endif
