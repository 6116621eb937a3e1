/* core/arena.h: the memory plan, which is also the allocation.
 *
 * Every component reserves what it needs (memory kind, category, name, bytes, and where
 * to store the pointer). The plan can be printed and checked against the machine before
 * anything is allocated (`strata plan`); commit then makes ONE allocation per memory kind
 * and hands out aligned slices, so a training step never allocates and the printed plan
 * is exactly what lives in memory. */
#ifndef STRATA_ARENA_H
#define STRATA_ARENA_H

#include <stddef.h>

#include "core/device.h"

typedef enum strata_mem_category {
    STRATA_CAT_PARAMS = 0,   /* parameters forward and backward read */
    STRATA_CAT_GRADS,        /* gradient accumulators */
    STRATA_CAT_OPTIMIZER,    /* fp32 master weights and Adam moments */
    STRATA_CAT_ACTIVATIONS,  /* activations kept for backward, and their gradients */
    STRATA_CAT_COMM,         /* communication buckets: gradients on their way to a reduction */
    STRATA_CAT_PREFETCH,     /* gathered parameters ahead of use (stage 3), and their reads */
    STRATA_CAT_STAGING,      /* pinned staging of offloaded updates and NVMe I/O */
    STRATA_CAT_WORKSPACE,    /* small scratch (norm sums) */
    STRATA_CAT_CHECKPOINT,   /* checkpoint and parameter I/O off the step (save, load, init), in bounded chunks */
    STRATA_CAT_COUNT,
} strata_mem_category;

typedef struct strata_arena_entry {
    char name[64];
    strata_mem_kind kind;
    strata_mem_category cat;
    size_t bytes;
    size_t offset;
    void **dst;
    int shared; /* strata_arena_share's: another dst for the slice before it */
} strata_arena_entry;

typedef struct strata_arena {
    strata_device *dev; /* NULL for a plan that is never committed */
    strata_arena_entry *entries;
    int n, cap;
    size_t total[STRATA_MEM_KINDS];
    void *base[STRATA_MEM_KINDS]; /* each kind's block, aligned as its slices are */
    void *raw[STRATA_MEM_KINDS];  /* what the device returned, for strata_free */
} strata_arena;

void strata_arena_init(strata_arena *a, strata_device *dev);
/* Reserves bytes (rounded up to 256-byte alignment, 4096 for pinned memory so O_DIRECT
 * I/O can use any slice); *dst is set at commit. dst may be NULL for planning-only entries. */
void strata_arena_reserve(strata_arena *a, strata_mem_kind kind, strata_mem_category cat,
                          const char *name, size_t bytes, void **dst);
/* Another dst for the slice reserved last (not counting shares), of bytes at most its
 * size: buffers whose lives never overlap share memory, which the plan counts once (the
 * share itself holds 0 bytes). */
void strata_arena_share(strata_arena *a, const char *name, size_t bytes, void **dst);
/* Allocates one block per memory kind and fills every dst. The pinned block starts on a
 * 4096-byte boundary, so the whole of it can be registered for O_DIRECT I/O. 0, or -1
 * naming the kind and size that could not be allocated. */
int strata_arena_commit(strata_arena *a);
void strata_arena_release(strata_arena *a);
size_t strata_arena_bytes(const strata_arena *a, int kind /* -1 all */, int cat /* -1 all */);
/* The same, of the entries whose name starts with prefix. */
size_t strata_arena_bytes_named(const strata_arena *a, int kind, int cat, const char *prefix);

#endif
