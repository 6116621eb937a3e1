/* offload/pinned.c: the pinned host pool of offload/pinned.h, a bump allocator over one
 * aligned device allocation. */
#include "offload/pinned.h"

#include <stdint.h>
#include <stdlib.h>

#include "core/common.h"

struct strata_pinned_pool {
    strata_device *d;
    void *raw;           /* what the device returned (freed on destroy) */
    unsigned char *base; /* raw rounded up to STRATA_PINNED_ALIGN */
    size_t budget, used;
    int n_bufs;
};

strata_pinned_pool *strata_pinned_create(strata_device *d, size_t budget_bytes) {
    if (budget_bytes == 0) {
        strata_fail("pinned pool: a budget of 0 bytes holds nothing (offload.pinned_budget_gb)");
        return NULL;
    }
    if (budget_bytes > SIZE_MAX - 2 * STRATA_PINNED_ALIGN) {
        strata_fail("pinned pool: a budget of %zu bytes overflows", budget_bytes);
        return NULL;
    }
    size_t budget = strata_round_up(budget_bytes, STRATA_PINNED_ALIGN);
    void *raw = NULL;
    void *base = strata_alloc_aligned(d, STRATA_MEM_PINNED, budget, STRATA_PINNED_ALIGN, &raw);
    if (!base) {
        char h[32];
        strata_fail_wrap("pinned pool: cannot allocate the budget of %zu bytes (%s)", budget,
                         strata_fmt_bytes(h, sizeof h, (double)budget));
        return NULL;
    }
    strata_pinned_pool *p = strata_xcalloc(1, sizeof *p);
    p->d = d;
    p->raw = raw;
    p->base = base;
    p->budget = budget;
    return p;
}

void strata_pinned_destroy(strata_pinned_pool *p) {
    if (!p) return;
    strata_free(p->d, STRATA_MEM_PINNED, p->raw);
    free(p);
}

void *strata_pinned_carve(strata_pinned_pool *p, const char *name, size_t bytes) {
    size_t start = p->used; /* always aligned */
    size_t left = p->budget - start;
    if (bytes > left) {
        char hb[32], hg[32];
        strata_fail("pinned pool: buffer '%s' of %zu bytes (%s) does not fit: %zu of the %zu-byte "
                    "budget (%s) are left, %zu used by %d buffer(s); raise "
                    "offload.pinned_budget_gb or shrink the staging buffers",
                    name, bytes, strata_fmt_bytes(hb, sizeof hb, (double)bytes), left,
                    p->budget, strata_fmt_bytes(hg, sizeof hg, (double)p->budget), p->used,
                    p->n_bufs);
        return NULL;
    }
    p->n_bufs++;
    /* the budget is page-rounded, so the rounded end never passes it */
    p->used = start + strata_round_up(bytes, STRATA_PINNED_ALIGN);
    return p->base + start;
}
