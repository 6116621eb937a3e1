/* offload/pipeline.h: optimizer state away from the device, updated by the CPU.
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

#include <stddef.h>

#include "core/arena.h"
#include "core/config.h"
#include "core/device.h"
#include "core/kernels.h"

enum { STRATA_STATE_MASTER = 0, STRATA_STATE_M = 1, STRATA_STATE_V = 2 };

/* A piece of a unit's range [lo, lo+n) (relative to the range start) with its own decay. */
typedef struct strata_offload_segment {
    size_t lo, n;
    int decay;
} strata_offload_segment;

typedef struct strata_offload strata_offload;

/* Plans the state of n_units ranges of n[u] fp32 elements at the tier cfg->offload.optimizer
 * names, reserving pinned memory in `a` (dev may be NULL for a plan only). */
strata_offload *strata_offload_create(const strata_config *cfg, strata_device *dev, strata_arena *a, int n_units,
                                      const size_t *n, strata_dtype param_dtype, int rank);
void strata_offload_destroy(strata_offload *o);
/* Bytes of the NVMe file (0 unless offload.optimizer or offload.params is nvme). */
size_t strata_offload_nvme_bytes(const strata_offload *o);
size_t strata_offload_nvme_param_bytes(const strata_offload *o); /* of them, parameters */
/* After the arena is committed: opens the NVMe store (registering the arena's pinned block). */
int strata_offload_open(strata_offload *o, void *pinned_base, size_t pinned_bytes);

/* Host access to a unit's state, for initialisation and checkpoints (blocking). */
int strata_offload_read_state(strata_offload *o, int u, int kind, float *dst);
int strata_offload_write_state(strata_offload *o, int u, int kind, const float *src);

/* Enqueues unit u's update on the offload stream, after `after` (an event recorded where
 * the gradient was finished; may be NULL). grad: n[u] fp32 in device memory; param_out:
 * n[u] elements of the compute dtype in device memory (ignored, may be NULL, when the
 * parameters live on NVMe). `done` is recorded after the parameters are written. Segments carry the weight-decay split. */
int strata_offload_update(strata_offload *o, int u, const float *grad, void *param_out,
                          const strata_offload_segment *seg, int n_seg, const strata_adamw_args *args,
                          strata_event *after, strata_event *done);
/* offload.params: nvme (zero stage 3): each unit's compute-dtype parameter shard lives in
 * the same per-rank file. The update writes it there instead of to the device; gathers
 * read it into a pinned buffer first, on the param stream (a HOST stream: the caller
 * enqueues its waits there, then the read, then records its own event). dst must be
 * 4096-aligned with room for unit u's shard rounded up to 4 KiB; tag (0 .. prefetch_units+1)
 * names the caller's buffer, so reads into different buffers may be queued at once. */
int strata_offload_write_params(strata_offload *o, int u, const void *src); /* blocking */
strata_stream *strata_offload_param_stream(const strata_offload *o);
int strata_offload_fetch_params(strata_offload *o, int u, void *dst, int tag);

/* Waits for every enqueued update; returns the first error any of them hit. */
int strata_offload_sync(strata_offload *o);

#endif
