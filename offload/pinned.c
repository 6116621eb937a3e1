/* offload/pinned.c: the pinned host pool of offload/pinned.h, a bump allocator over one
 * device allocation with a table of names for messages. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "offload/pinned.h"

#define PINNED_NAME_MAX 64

typedef struct pinned_buf {
    char name[PINNED_NAME_MAX];
    size_t offset, bytes; /* bytes as requested; the next buffer starts aligned after it */
} pinned_buf;

struct strata_pinned_pool {
    strata_device *d;
    void *raw;            /* what the device returned (freed on destroy) */
    unsigned char *base;  /* raw rounded up to STRATA_PINNED_ALIGN */
    size_t budget, used, peak;
    pinned_buf *bufs;     /* host bookkeeping, not pinned memory */
    int n_bufs, cap_bufs;
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
    /* Both backends return page-aligned pinned memory (cudaHostAlloc, and the CPU
     * backend's pinned kind), so the pool is exactly the budget; a backend that aligns
     * less gets one page of slack instead. */
    void *raw = strata_alloc(d, STRATA_MEM_PINNED, budget);
    if (raw && ((uintptr_t)raw & (STRATA_PINNED_ALIGN - 1))) {
        strata_free(d, STRATA_MEM_PINNED, raw);
        raw = strata_alloc(d, STRATA_MEM_PINNED, budget + STRATA_PINNED_ALIGN);
    }
    if (!raw) {
        char h[32];
        strata_fail_wrap("pinned pool: cannot allocate the budget of %zu bytes (%s)", budget,
                         strata_fmt_bytes(h, sizeof h, (double)budget));
        return NULL;
    }
    strata_pinned_pool *p = strata_xcalloc(1, sizeof *p);
    p->d = d;
    p->raw = raw;
    p->base = (unsigned char *)(((uintptr_t)raw + STRATA_PINNED_ALIGN - 1) &
                                ~(uintptr_t)(STRATA_PINNED_ALIGN - 1));
    p->budget = budget;
    return p;
}

void strata_pinned_destroy(strata_pinned_pool *p) {
    if (!p) return;
    strata_free(p->d, STRATA_MEM_PINNED, p->raw);
    free(p->bufs);
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
    if (p->n_bufs == p->cap_bufs) {
        p->cap_bufs = p->cap_bufs ? 2 * p->cap_bufs : 16;
        p->bufs = strata_xrealloc(p->bufs, (size_t)p->cap_bufs * sizeof *p->bufs);
    }
    pinned_buf *b = &p->bufs[p->n_bufs++];
    snprintf(b->name, sizeof b->name, "%s", name);
    b->offset = start;
    b->bytes = bytes;
    /* the budget is page-rounded, so the rounded end never passes it */
    p->used = start + strata_round_up(bytes, STRATA_PINNED_ALIGN);
    if (p->used > p->peak) p->peak = p->used;
    return p->base + start;
}

void *strata_pinned_find(const strata_pinned_pool *p, const char *name) {
    for (int i = p->n_bufs - 1; i >= 0; i--)
        if (!strcmp(p->bufs[i].name, name)) return p->base + p->bufs[i].offset;
    return NULL;
}

void *strata_pinned_base(const strata_pinned_pool *p) { return p->base; }
size_t strata_pinned_budget(const strata_pinned_pool *p) { return p->budget; }
size_t strata_pinned_used(const strata_pinned_pool *p) { return p->used; }
size_t strata_pinned_peak(const strata_pinned_pool *p) { return p->peak; }
int strata_pinned_count(const strata_pinned_pool *p) { return p->n_bufs; }

/* The mark encodes the buffer count; the used bytes follow from the table. */
size_t strata_pinned_mark(const strata_pinned_pool *p) { return (size_t)p->n_bufs; }

void strata_pinned_release(strata_pinned_pool *p, size_t mark) {
    STRATA_ASSERT(mark <= (size_t)p->n_bufs);
    p->n_bufs = (int)mark;
    p->used = mark ? p->bufs[mark - 1].offset + strata_round_up(p->bufs[mark - 1].bytes,
                                                               STRATA_PINNED_ALIGN)
                   : 0;
}

void strata_pinned_print(const strata_pinned_pool *p, FILE *out) {
    char h[32];
    for (int i = 0; i < p->n_bufs; i++)
        fprintf(out, "  pinned %-24s offset %12zu  %12zu bytes (%s)\n", p->bufs[i].name,
                p->bufs[i].offset, p->bufs[i].bytes,
                strata_fmt_bytes(h, sizeof h, (double)p->bufs[i].bytes));
    char hu[32], hp[32], hb[32];
    fprintf(out, "  pinned pool: %s used, %s peak, %s budget, %d buffer(s)\n",
            strata_fmt_bytes(hu, sizeof hu, (double)p->used),
            strata_fmt_bytes(hp, sizeof hp, (double)p->peak),
            strata_fmt_bytes(hb, sizeof hb, (double)p->budget), p->n_bufs);
}
