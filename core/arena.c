/* core/arena.c: one allocation per memory kind, sliced by the plan. */
#include "core/arena.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"

#define ARENA_ALIGN 256
#define ARENA_PINNED_ALIGN 4096
static size_t kind_align(int kind) { return kind == STRATA_MEM_PINNED ? ARENA_PINNED_ALIGN : ARENA_ALIGN; }

void strata_arena_init(strata_arena *a, strata_device *dev) {
    memset(a, 0, sizeof *a);
    a->dev = dev;
}

void strata_arena_reserve(strata_arena *a, strata_mem_kind kind, strata_mem_category cat,
                          const char *name, size_t bytes, void **dst) {
    STRATA_ASSERT(kind < STRATA_MEM_KINDS && cat < STRATA_CAT_COUNT);
    STRATA_ASSERT(!a->base[kind]); /* reserving after commit would break "plan == allocation" */
    if (a->n == a->cap) {
        a->cap = a->cap ? 2 * a->cap : 64;
        a->entries = strata_xrealloc(a->entries, a->cap * sizeof *a->entries);
    }
    strata_arena_entry *e = &a->entries[a->n++];
    snprintf(e->name, sizeof e->name, "%s", name);
    e->kind = kind;
    e->cat = cat;
    e->bytes = bytes;
    e->offset = a->total[kind];
    e->dst = dst;
    e->shared = 0;
    a->total[kind] += strata_round_up(bytes, kind_align(kind));
}

void strata_arena_share(strata_arena *a, const char *name, size_t bytes, void **dst) {
    int i = a->n - 1;
    while (i >= 0 && a->entries[i].shared) i--;
    STRATA_ASSERT(i >= 0 && bytes <= a->entries[i].bytes);
    strata_arena_entry owner = a->entries[i];
    strata_arena_reserve(a, owner.kind, owner.cat, name, 0, dst);
    a->entries[a->n - 1].offset = owner.offset;
    a->entries[a->n - 1].shared = 1;
}

int strata_arena_commit(strata_arena *a) {
    STRATA_ASSERT(a->dev);
    static const char *kind_names[] = {"device", "pinned host", "host"};
    for (int k = 0; k < STRATA_MEM_KINDS; k++) {
        if (!a->total[k] || a->base[k]) continue;
        /* the pinned block is registered whole for O_DIRECT I/O (offload/nvme.h): page-aligned */
        size_t align = k == STRATA_MEM_PINNED ? ARENA_PINNED_ALIGN : 1;
        a->base[k] = strata_alloc_aligned(a->dev, k, a->total[k], align, &a->raw[k]);
        if (!a->base[k]) {
            char buf[32];
            return strata_fail("could not allocate the %s arena of %s: %s", kind_names[k],
                               strata_fmt_bytes(buf, sizeof buf, (double)a->total[k]), strata_error());
        }
    }
    for (int i = 0; i < a->n; i++) {
        strata_arena_entry *e = &a->entries[i];
        if (e->dst) *e->dst = (char *)a->base[e->kind] + e->offset;
    }
    return 0;
}

void strata_arena_release(strata_arena *a) {
    for (int k = 0; k < STRATA_MEM_KINDS; k++)
        if (a->raw[k]) strata_free(a->dev, k, a->raw[k]);
    free(a->entries);
    memset(a, 0, sizeof *a);
}

size_t strata_arena_bytes_named(const strata_arena *a, int kind, int cat, const char *prefix) {
    size_t sum = 0, n = prefix ? strlen(prefix) : 0;
    for (int i = 0; i < a->n; i++) {
        const strata_arena_entry *e = &a->entries[i];
        /* counted as allocated: each slice rounded up to the arena's alignment */
        if ((kind < 0 || (int)e->kind == kind) && (cat < 0 || (int)e->cat == cat) && !strncmp(e->name, prefix ? prefix : "", n))
            sum += strata_round_up(e->bytes, kind_align(e->kind));
    }
    return sum;
}

size_t strata_arena_bytes(const strata_arena *a, int kind, int cat) { return strata_arena_bytes_named(a, kind, cat, NULL); }
