/* tests/test_pinned.c: the pinned pool is one device allocation carved into
 * 4096-aligned, packed, non-overlapping buffers; over-budget carves fail with a message
 * naming the buffer, the request and the budget and change nothing; the budget can be
 * filled exactly; the device's pinned counters prove nothing is allocated after creation
 * and destroy returns the one allocation. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/device.h"
#include "offload/pinned.h"
#include "tests/check.h"

#define A STRATA_PINNED_ALIGN

static int aligned(const void *p) { return ((uintptr_t)p % A) == 0; }

int main(void) {
    strata_device *d = strata_device_open("cpu", 0);
    if (!d) {
        printf("FAIL cannot open the cpu device: %s\n", strata_error());
        return 1;
    }
    strata_mem_counters before = d->mem[STRATA_MEM_PINNED];

    const size_t budget_req = 64 * A + 100; /* rounds up to 65 pages */
    const size_t budget = 65 * A;
    strata_pinned_pool *p = strata_pinned_create(d, budget_req);
    CHECK(p != NULL, "pool of %zu bytes created", budget_req);
    if (!p) return 1;
    strata_mem_counters made = d->mem[STRATA_MEM_PINNED];
    CHECK(made.n_alloc == before.n_alloc + 1, "creation made exactly one pinned allocation");
    CHECK(made.live_bytes - before.live_bytes == budget,
          "that allocation is the budget rounded up to whole pages: the backend's pinned memory is "
          "page-aligned (%zu bytes)", made.live_bytes - before.live_bytes);

    unsigned char *a = strata_pinned_carve(p, "grad-stage-0", 1000);
    unsigned char *b = strata_pinned_carve(p, "grad-stage-1", 3 * A);
    unsigned char *c = strata_pinned_carve(p, "tiny", 1);
    CHECK(a && b && c, "three buffers carved");
    CHECK(aligned(a) && aligned(b) && aligned(c), "each buffer starts on a %d boundary", A);
    CHECK(b == a + A && c == b + 3 * A,
          "buffers are packed in order with page-rounded sizes (offsets 0, %d, %d)", A, 4 * A);
    memset(a, 0xa1, 1000);
    memset(b, 0xb2, 3 * A);
    memset(c, 0xc3, 1);
    CHECK(a[999] == 0xa1 && b[0] == 0xb2 && b[3 * A - 1] == 0xb2 && c[0] == 0xc3,
          "writes to one buffer do not touch its neighbours");

    /* over budget: 5 pages are used, 60 left */
    size_t left = budget - 5 * A;
    void *huge = strata_pinned_carve(p, "optimizer-state", left + 1);
    const char *e = strata_error();
    char want_req[32], want_budget[32];
    snprintf(want_req, sizeof want_req, "%zu bytes", left + 1);
    snprintf(want_budget, sizeof want_budget, "%zu-byte budget", budget);
    CHECK(huge == NULL && strstr(e, "'optimizer-state'") && strstr(e, want_req) &&
              strstr(e, want_budget) && strstr(e, "offload.pinned_budget_gb"),
          "over-budget carve fails naming buffer, request and budget: %s", e);

    /* the failed carve changed nothing: exactly what was left still fits, then nothing */
    unsigned char *rest = strata_pinned_carve(p, "rest", left);
    void *one = strata_pinned_carve(p, "one-more", 1);
    CHECK(rest == c + A && !one, "the budget can be filled exactly (%zu bytes), then nothing more fits", left);
    if (rest) memset(rest, 0x5a, left); /* ASan would flag a carve past the allocation */

    strata_mem_counters after = d->mem[STRATA_MEM_PINNED];
    CHECK(after.n_alloc == made.n_alloc && after.live_bytes == made.live_bytes &&
              after.peak_bytes == made.peak_bytes,
          "no pinned allocation after creation (n_alloc %llu, live %zu)",
          (unsigned long long)after.n_alloc, after.live_bytes);

    strata_pinned_destroy(p);
    strata_mem_counters gone = d->mem[STRATA_MEM_PINNED];
    CHECK(gone.live_bytes == before.live_bytes && gone.n_free == before.n_free + 1,
          "destroy returns the one allocation");

    strata_pinned_pool *zero = strata_pinned_create(d, 0);
    CHECK(zero == NULL && strstr(strata_error(), "budget of 0 bytes"),
          "a zero budget is refused: %s", strata_error());

    strata_device_close(d);
    printf("%s: %d failure(s)\n", failures ? "FAILED" : "PASSED", failures);
    return failures ? 1 : 0;
}
