/* tests/test_pinned.c: the pinned pool is one device allocation carved into named,
 * 4096-aligned, non-overlapping buffers; over-budget carves fail with a message naming
 * the buffer, the request and the budget; mark/release drive used vs peak; the device's
 * pinned counters prove nothing is allocated after creation. */
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
    strata_pinned_pool *p = strata_pinned_create(d, budget_req);
    CHECK(p != NULL, "pool of %zu bytes created", budget_req);
    if (!p) return 1;
    strata_mem_counters made = d->mem[STRATA_MEM_PINNED];
    CHECK(strata_pinned_budget(p) == 65 * A, "budget rounded up to whole pages: %zu",
          strata_pinned_budget(p));
    CHECK(made.n_alloc == before.n_alloc + 1, "creation made exactly one pinned allocation");
    CHECK(made.live_bytes - before.live_bytes == 65 * A,
          "that allocation is exactly the budget: the backend's pinned memory is page-aligned (%zu bytes)",
          made.live_bytes - before.live_bytes);
    CHECK(aligned(strata_pinned_base(p)), "pool base is %d-aligned", A);

    unsigned char *a = strata_pinned_carve(p, "grad-stage-0", 1000);
    unsigned char *b = strata_pinned_carve(p, "grad-stage-1", 3 * A);
    unsigned char *c = strata_pinned_carve(p, "tiny", 1);
    CHECK(a && b && c, "three buffers carved");
    CHECK(aligned(a) && aligned(b) && aligned(c), "each buffer starts on a %d boundary", A);
    CHECK(a == strata_pinned_base(p) && b == a + A && c == b + 3 * A,
          "buffers are packed in order with page-rounded sizes (offsets 0, %d, %d)", A, 4 * A);
    CHECK(strata_pinned_used(p) == 5 * A && strata_pinned_count(p) == 3,
          "used %zu bytes over %d buffers", strata_pinned_used(p), strata_pinned_count(p));
    memset(a, 0xa1, 1000);
    memset(b, 0xb2, 3 * A);
    memset(c, 0xc3, 1);
    CHECK(a[999] == 0xa1 && b[0] == 0xb2 && b[3 * A - 1] == 0xb2 && c[0] == 0xc3,
          "writes to one buffer do not touch its neighbours");
    CHECK(strata_pinned_find(p, "grad-stage-1") == b && strata_pinned_find(p, "nope") == NULL,
          "buffers are found by name");

    /* over budget */
    size_t left = strata_pinned_budget(p) - strata_pinned_used(p);
    void *huge = strata_pinned_carve(p, "optimizer-state", left + 1);
    const char *e = strata_error();
    char want_req[32], want_budget[32];
    snprintf(want_req, sizeof want_req, "%zu bytes", left + 1);
    snprintf(want_budget, sizeof want_budget, "%zu-byte budget", strata_pinned_budget(p));
    CHECK(huge == NULL && strstr(e, "'optimizer-state'") && strstr(e, want_req) &&
              strstr(e, want_budget) && strstr(e, "offload.pinned_budget_gb"),
          "over-budget carve fails naming buffer, request and budget: %s", e);
    CHECK(strata_pinned_used(p) == 5 * A && strata_pinned_count(p) == 3,
          "a failed carve changes nothing");

    /* mark / release: peak stays at the high-water mark */
    size_t mark = strata_pinned_mark(p);
    void *x = strata_pinned_carve(p, "phase-x", 10 * A);
    void *y = strata_pinned_carve(p, "phase-y", 20 * A + 5);
    CHECK(x && y && strata_pinned_used(p) == 36 * A, "phase buffers carved, used %zu",
          strata_pinned_used(p));
    strata_pinned_release(p, mark);
    CHECK(strata_pinned_used(p) == 5 * A && strata_pinned_peak(p) == 36 * A &&
              strata_pinned_count(p) == 3 && strata_pinned_find(p, "phase-x") == NULL,
          "release drops the phase: used %zu, peak %zu", strata_pinned_used(p),
          strata_pinned_peak(p));
    void *z = strata_pinned_carve(p, "phase-z", A);
    CHECK(z == x, "space released is reused by the next carve");

    /* filling to the exact budget works; one more byte does not */
    left = strata_pinned_budget(p) - strata_pinned_used(p);
    void *rest = strata_pinned_carve(p, "rest", left);
    void *one = strata_pinned_carve(p, "one-more", 1);
    CHECK(rest && !one && strata_pinned_used(p) == strata_pinned_budget(p),
          "the budget can be filled exactly (%zu bytes), then nothing more fits", left);
    memset(rest, 0x5a, left); /* ASan would flag a carve past the allocation */

    strata_mem_counters after = d->mem[STRATA_MEM_PINNED];
    CHECK(after.n_alloc == made.n_alloc && after.live_bytes == made.live_bytes &&
              after.peak_bytes == made.peak_bytes,
          "no pinned allocation after creation (n_alloc %llu, live %zu)",
          (unsigned long long)after.n_alloc, after.live_bytes);

    char *text = NULL;
    size_t text_len = 0;
    FILE *mem = open_memstream(&text, &text_len);
    strata_pinned_print(p, mem);
    fclose(mem);
    CHECK(strstr(text, "grad-stage-0") && strstr(text, "rest") && strstr(text, "budget"),
          "print lists the buffers and totals");
    free(text);

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
