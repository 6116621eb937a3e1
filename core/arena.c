/* core/arena.c: one allocation per memory kind, sliced by the plan. */
#include "core/arena.h"

#include <stdlib.h>
#include <string.h>

#include "core/common.h"

#define ARENA_ALIGN 256
#define ARENA_PINNED_ALIGN 4096
static size_t kind_align(int kind) { return kind == STRATA_MEM_PINNED ? ARENA_PINNED_ALIGN : ARENA_ALIGN; }

static const char *category_names[STRATA_CAT_COUNT] = {"parameters", "gradients", "optimizer",
                                                       "activations", "buffers"};
const char *strata_mem_category_name(strata_mem_category c) {
    return c < STRATA_CAT_COUNT ? category_names[c] : "?";
}

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
    a->total[kind] += strata_round_up(bytes, kind_align(kind));
}

int strata_arena_commit(strata_arena *a) {
    STRATA_ASSERT(a->dev);
    static const char *kind_names[] = {"device", "pinned host", "host"};
    for (int k = 0; k < STRATA_MEM_KINDS; k++) {
        if (!a->total[k] || a->base[k]) continue;
        a->base[k] = a->source[k].alloc ? a->source[k].alloc(a->source[k].ctx, a->total[k])
                                        : strata_alloc(a->dev, k, a->total[k]);
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
    for (int k = 0; k < STRATA_MEM_KINDS; k++) {
        if (a->source[k].release) a->source[k].release(a->source[k].ctx);
        else if (a->base[k]) strata_free(a->dev, k, a->base[k]);
    }
    free(a->entries);
    memset(a, 0, sizeof *a);
}

size_t strata_arena_bytes(const strata_arena *a, int kind, int cat) {
    size_t sum = 0;
    for (int i = 0; i < a->n; i++) {
        const strata_arena_entry *e = &a->entries[i];
        /* counted as allocated: each slice rounded up to the arena's alignment */
        if ((kind < 0 || (int)e->kind == kind) && (cat < 0 || (int)e->cat == cat))
            sum += strata_round_up(e->bytes, kind_align(e->kind));
    }
    return sum;
}

void strata_arena_print(const strata_arena *a, FILE *f) {
    char b[4][32];
    fprintf(f, "  %-12s %14s %14s %14s\n", "memory", "device", "pinned host", "host");
    for (int c = 0; c < STRATA_CAT_COUNT; c++) {
        size_t d = strata_arena_bytes(a, STRATA_MEM_DEVICE, c);
        size_t p = strata_arena_bytes(a, STRATA_MEM_PINNED, c);
        size_t h = strata_arena_bytes(a, STRATA_MEM_HOST, c);
        if (!d && !p && !h) continue;
        fprintf(f, "  %-12s %14s %14s %14s\n", category_names[c],
                strata_fmt_bytes(b[0], 32, (double)d), strata_fmt_bytes(b[1], 32, (double)p),
                strata_fmt_bytes(b[2], 32, (double)h));
    }
    fprintf(f, "  %-12s %14s %14s %14s\n", "total",
            strata_fmt_bytes(b[0], 32, (double)strata_arena_bytes(a, STRATA_MEM_DEVICE, -1)),
            strata_fmt_bytes(b[1], 32, (double)strata_arena_bytes(a, STRATA_MEM_PINNED, -1)),
            strata_fmt_bytes(b[2], 32, (double)strata_arena_bytes(a, STRATA_MEM_HOST, -1)));
}
