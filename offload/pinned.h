/* offload/pinned.h: the pinned host pool. One STRATA_MEM_PINNED allocation of the whole
 * budget is made from a device at creation and carved into named buffers; it never grows,
 * so the pinned footprint is fixed and known before the first use.
 *
 * Every buffer starts on a STRATA_PINNED_ALIGN boundary and its size is rounded up to
 * one, so any buffer can be handed to O_DIRECT I/O (offload/nvme.h). A carve that does
 * not fit fails with an error naming the buffer, the request and the budget; nothing is
 * allocated after creation. Buffers are not freed one by one: they die with the pool.
 * Training's pinned memory is the arena's block (core/arena.h); the pool serves tools
 * that need pinned buffers outside a plan (`strata bench io`).
 *
 * Not thread-safe: carve from one thread; the memory itself may of course be used from
 * any thread. */
#ifndef STRATA_PINNED_H
#define STRATA_PINNED_H

#include <stddef.h>

#include "core/device.h"

#define STRATA_PINNED_ALIGN 4096

typedef struct strata_pinned_pool strata_pinned_pool;

/* Allocates the pool: budget_bytes (rounded up to STRATA_PINNED_ALIGN) of pinned memory
 * from d. NULL + error when budget_bytes is 0 or the device cannot provide it. */
strata_pinned_pool *strata_pinned_create(strata_device *d, size_t budget_bytes);
/* Returns the pool's memory to the device; every carved pointer dies with it. */
void strata_pinned_destroy(strata_pinned_pool *p);

/* A buffer of `bytes` named `name` (for the message); NULL + error
 * "pinned pool: buffer '<name>' of N bytes does not fit: ..." when the budget is spent. */
void *strata_pinned_carve(strata_pinned_pool *p, const char *name, size_t bytes);

#endif
