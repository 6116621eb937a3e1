/* core/profile.c: the kernel profile (core/profile.h): two banks of timed event pairs, read
 * a step late, summed into a fixed table of phase x group. */
#include "core/profile.h"

#include <stdlib.h>
#include <string.h>

#include "core/common.h"

static const char *const group_names[STRATA_PROF_GROUPS] = {
    "embedding", "layernorm", "rmsnorm", "matmul qkv", "rope", "attention", "matmul attn-proj", "residual",
    "matmul fc", "gelu", "swiglu", "matmul fc-proj", "classifier", "cross-entropy", "adamw", "collectives wait",
};
static const char *const phase_names[STRATA_PROF_PHASES] = {"forward", "backward", "recompute", "update"};

const char *strata_prof_group_name(int g) { return g >= 0 && g < STRATA_PROF_GROUPS ? group_names[g] : "?"; }
const char *strata_prof_phase_name(int ph) { return ph >= 0 && ph < STRATA_PROF_PHASES ? phase_names[ph] : "?"; }

static void bank_destroy(strata_device *d, strata_prof_bank *b) {
    strata_event_destroy(d, b->start);
    strata_event_destroy(d, b->end);
    for (int i = 0; b->ev && b->ev[i]; i++) strata_event_destroy(d, b->ev[i]);
    free(b->ev);
    free(b->phase);
    free(b->group);
}

strata_prof *strata_prof_create(strata_device *d, int cap) {
    STRATA_ASSERT(cap > 0);
    strata_prof *p = strata_xcalloc(1, sizeof *p);
    p->dev = d;
    p->cap = cap;
    p->cur = -1;
    for (int k = 0; k < 2; k++) {
        strata_prof_bank *b = &p->bank[k];
        b->ev = strata_xcalloc(2 * (size_t)cap + 1, sizeof *b->ev); /* NULL-terminated for destroy */
        b->phase = strata_xcalloc((size_t)cap, 1);
        b->group = strata_xcalloc((size_t)cap, 1);
        int ok = (b->start = strata_event_create_timed(d)) && (b->end = strata_event_create_timed(d));
        for (int i = 0; ok && i < 2 * cap; i++) ok = (b->ev[i] = strata_event_create_timed(d)) != NULL;
        if (!ok) {
            strata_fail_wrap("kernel profile: making %d timed events", 4 * cap + 4);
            strata_prof_destroy(p);
            return NULL;
        }
    }
    return p;
}

void strata_prof_destroy(strata_prof *p) {
    if (!p) return;
    for (int k = 0; k < 2; k++) bank_destroy(p->dev, &p->bank[k]);
    free(p);
}

/* Sums bank b (complete: its end event was passed) into the totals. */
static int read_bank(strata_prof *p, strata_prof_bank *b) {
    b->pending = 0;
    if (strata_event_sync(p->dev, b->end)) return -1;
    double span, ms[STRATA_PROF_PHASES][STRATA_PROF_GROUPS] = {{0}};
    uint64_t calls[STRATA_PROF_PHASES][STRATA_PROF_GROUPS] = {{0}};
    int rc = strata_event_elapsed_ms(p->dev, b->start, b->end, &span);
    for (int i = 0; i < b->used && !rc; i++) {
        double t;
        if ((rc = strata_event_elapsed_ms(p->dev, b->ev[2 * i], b->ev[2 * i + 1], &t))) break;
        ms[b->phase[i]][b->group[i]] += t;
        calls[b->phase[i]][b->group[i]]++;
    }
    if (rc) {
        p->read_errors++;
        return strata_fail_wrap("kernel profile: reading a step's events");
    }
    int first = p->steps == 0;
    p->steps++;
    p->untimed += b->untimed;
    p->step_ms += span;
    if (first) {
        p->first_step_ms = span;
        p->first_untimed = b->untimed;
    }
    for (int ph = 0; ph < STRATA_PROF_PHASES; ph++)
        for (int g = 0; g < STRATA_PROF_GROUPS; g++) {
            p->ms[ph][g] += ms[ph][g];
            p->calls[ph][g] += calls[ph][g];
            if (first) {
                p->first_ms[ph][g] = ms[ph][g];
                p->first_calls[ph][g] = calls[ph][g];
            }
        }
    return 0;
}

void strata_prof_step_begin(strata_prof *p) {
    strata_prof_bank *b = &p->bank[p->next];
    if (b->pending && read_bank(p, b)) /* a step whose collect was never reached */
        STRATA_WARN("prof", "%s", strata_error());
    p->cur = p->next;
    p->next ^= 1;
    p->phase = STRATA_PROF_FORWARD;
    b->used = b->untimed = 0;
    STRATA_IGNORE(strata_event_record(p->dev, b->start, p->dev->compute)); /* timing only */
}

void strata_prof_step_end(strata_prof *p, int ok) {
    if (p->cur < 0) return;
    strata_prof_bank *b = &p->bank[p->cur];
    STRATA_IGNORE(strata_event_record(p->dev, b->end, p->dev->compute)); /* timing only */
    b->pending = ok;
    p->cur = -1;
}

int strata_prof_collect(strata_prof *p) {
    int rc = 0;
    for (int k = 0; k < 2; k++)
        if (k != p->cur && p->bank[k].pending && read_bank(p, &p->bank[k])) rc = -1;
    return rc;
}

int strata_prof_flush(strata_prof *p) {
    STRATA_ASSERT(p->cur < 0);
    /* the older bank first, so the first step read is the run's first */
    int rc = 0;
    for (int i = 0; i < 2; i++) {
        strata_prof_bank *b = &p->bank[(p->next + i) % 2];
        if (b->pending && read_bank(p, b)) rc = -1;
    }
    return rc;
}

int strata_prof_begin_(strata_prof *p, strata_prof_group g) {
    if (p->cur < 0) return -1;
    strata_prof_bank *b = &p->bank[p->cur];
    if (b->used == p->cap) {
        b->untimed++;
        return -1;
    }
    int i = b->used++;
    b->phase[i] = (uint8_t)p->phase;
    b->group[i] = (uint8_t)g;
    STRATA_IGNORE(strata_event_record(p->dev, b->ev[2 * i], p->dev->compute)); /* timing only */
    return i;
}

void strata_prof_end_(strata_prof *p, int call) {
    STRATA_IGNORE(strata_event_record(p->dev, p->bank[p->cur].ev[2 * call + 1], p->dev->compute)); /* timing only */
}

int strata_prof_report_get(const strata_prof *p, strata_prof_report *r) {
    memset(r, 0, sizeof *r);
    if (p->steps == 0) return strata_fail("kernel profile: no step was profiled");
    r->warmup = p->steps >= 2;
    r->steps = p->steps - r->warmup;
    double n = r->steps;
    r->step_ms = (p->step_ms - (r->warmup ? p->first_step_ms : 0)) / n;
    for (int ph = 0; ph < STRATA_PROF_PHASES; ph++)
        for (int g = 0; g < STRATA_PROF_GROUPS; g++) {
            r->ms[ph][g] = (p->ms[ph][g] - (r->warmup ? p->first_ms[ph][g] : 0)) / n;
            r->calls[ph][g] = (double)(p->calls[ph][g] - (r->warmup ? p->first_calls[ph][g] : 0)) / n;
            r->timed_ms += r->ms[ph][g];
        }
    r->untimed = (p->untimed - (r->warmup ? p->first_untimed : 0)) / n;
    r->other_ms = r->step_ms - r->timed_ms;
    return 0;
}

static double share(double ms, double step) { return step > 0 ? 100.0 * ms / step : 0; }

void strata_prof_print(const strata_prof_report *r, const char *prefix, FILE *f) {
    fprintf(f, "%skernel profile: compute stream, mean of %d step%s%s\n", prefix, r->steps, r->steps == 1 ? "" : "s",
            r->warmup ? " (the first left out: warm-up)" : "");
    fprintf(f, "%s  %-10s %-18s %11s %11s %7s\n", prefix, "phase", "group", "calls/step", "ms/step", "share");
    for (int ph = 0; ph < STRATA_PROF_PHASES; ph++) {
        double calls = 0, ms = 0;
        for (int g = 0; g < STRATA_PROF_GROUPS; g++) {
            if (r->calls[ph][g] == 0) continue;
            fprintf(f, "%s  %-10s %-18s %11.6g %11.3f %6.1f%%\n", prefix, phase_names[ph], group_names[g],
                    r->calls[ph][g], r->ms[ph][g], share(r->ms[ph][g], r->step_ms));
            calls += r->calls[ph][g];
            ms += r->ms[ph][g];
        }
        if (calls > 0)
            fprintf(f, "%s  %-10s %-18s %11.6g %11.3f %6.1f%%\n", prefix, phase_names[ph], "(all)", calls, ms,
                    share(ms, r->step_ms));
    }
    fprintf(f, "%s  %-10s %-18s %11s %11.3f %6.1f%%\n", prefix, "step", "other", "", r->other_ms,
            share(r->other_ms, r->step_ms));
    fprintf(f, "%s  %-10s %-18s %11s %11.3f %6.1f%%\n", prefix, "step", "total", "", r->step_ms, 100.0);
    if (r->untimed)
        fprintf(f, "%s  (%g calls per step past the profile's capacity were not timed; their time is in other)\n", prefix,
                r->untimed);
}
