/* offload/pinned.h: the pinned host pool. One STRATA_MEM_PINNED allocation of the
 * whole budget (plus one page, to align a backend's pointer that is not page-aligned) is
 * made from a device at creation and carved into named buffers; it never
 * grows, so the pinned footprint is fixed and known before the first step (the memory
 * plan sizes the budget).
 *
 * Every buffer starts on a STRATA_PINNED_ALIGN boundary and its size is rounded up to
 * one, so any buffer can be handed to O_DIRECT I/O (offload/nvme.h) and registered
 * with io_uring. A carve that does not fit fails with an error naming the buffer, the
 * request and the budget; nothing is allocated after creation.
 *
 * Carving is a stack: strata_pinned_mark() / strata_pinned_release() hand back every
 * buffer carved after a mark (for phases that reuse staging space), which is what makes
 * peak differ from used. Buffers are not freed one by one.
 *
 * Not thread-safe: carve during set-up from one thread; the memory itself may of course
 * be used from any thread. */
#ifndef STRATA_PINNED_H
#define STRATA_PINNED_H

#include <stddef.h>
#include <stdio.h>

#include "core/device.h"

#define STRATA_PINNED_ALIGN 4096

typedef struct strata_pinned_pool strata_pinned_pool;

/* Allocates the pool: budget_bytes (rounded up to STRATA_PINNED_ALIGN) of pinned memory
 * from d. NULL + error when budget_bytes is 0 or the device cannot provide it. */
strata_pinned_pool *strata_pinned_create(strata_device *d, size_t budget_bytes);
/* Returns the pool's memory to the device; every carved pointer dies with it. */
void strata_pinned_destroy(strata_pinned_pool *p);

/* A buffer of `bytes` named `name` (for messages and strata_pinned_print); NULL + error
 * "pinned pool: buffer '<name>' of N bytes does not fit: ..." when the budget is spent. */
void *strata_pinned_carve(strata_pinned_pool *p, const char *name, size_t bytes);
/* The start of a carved buffer by name, or NULL. */
void *strata_pinned_find(const strata_pinned_pool *p, const char *name);

/* The base of the whole pool and its budget: register this range with io_uring once
 * (offload/nvme.h) and every carved buffer is a registered buffer. */
void *strata_pinned_base(const strata_pinned_pool *p);
size_t strata_pinned_budget(const strata_pinned_pool *p);
size_t strata_pinned_used(const strata_pinned_pool *p); /* bytes carved now, with padding */
size_t strata_pinned_peak(const strata_pinned_pool *p); /* most ever carved at once */
int strata_pinned_count(const strata_pinned_pool *p);   /* buffers carved now */

/* Stack discipline: release() drops every buffer carved since the matching mark(). */
size_t strata_pinned_mark(const strata_pinned_pool *p);
void strata_pinned_release(strata_pinned_pool *p, size_t mark);

/* One line per buffer (name, offset, bytes) and the used/peak/budget totals. */
void strata_pinned_print(const strata_pinned_pool *p, FILE *out);

#endif
