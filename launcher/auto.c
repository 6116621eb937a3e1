/* launcher/auto.c: memory.auto measures the changes that fit and keeps the fastest. */
#include "launcher/auto.h"

#include <stdlib.h>
#include <string.h>

#include "core/arena.h"
#include "core/common.h"
#include "core/model.h"
#include "io/data.h"
#include "shard/engine.h"
#include "launcher/build.h"
#include "launcher/signals.h"

#define AUTO_DEFAULT_TRIALS 3
#define AUTO_TRIAL_STEPS 4 /* the first warms up (first touch, offload pipeline); the median of the rest counts */

/* As train's fatal: a rank that cannot go on ends the whole job, since the others may be
 * waiting for it in a collective. */
static _Noreturn void auto_fatal(const strata_auto *a, const char *what) {
    strata_log(STRATA_LOG_ERROR, "plan", "%s: %s", what, strata_error());
    if (a->world > 1) strata_mpi_abort(STRATA_EXIT_ERROR);
    exit(STRATA_EXIT_ERROR);
}

/* Whether any rank says bad: every rank must call it, at the same point. */
static int any_rank(strata_auto *a, int bad) {
    double v = bad ? 1.0 : 0.0;
    if (a->world > 1 && strata_allreduce_host_f64(a->comm, &v, 1)) auto_fatal(a, "memory.auto: agreeing on a trial");
    return v > 0;
}

/* Rank 0's n values on every rank: a sum to which only rank 0 contributes. */
static void from_rank0(strata_auto *a, double *v, int n) {
    if (a->world == 1) return;
    if (a->rank != 0) memset(v, 0, (size_t)n * sizeof *v);
    if (strata_allreduce_host_f64(a->comm, v, n)) auto_fatal(a, "memory.auto: sharing rank 0's candidates");
}

/* Rank 0's candidates on every rank, so that all ranks measure the same ones in lockstep
 * (the host memory each rank sees free, which the plan checks against, may differ). */
static int share_candidates(strata_auto *a, strata_auto_trial *tr, int n) {
    double count = n;
    from_rank0(a, &count, 1);
    n = (int)count;
    if (a->world == 1 || n <= 0) return n;
    enum { PER = 2 + STRATA_PLAN_MAX_SETS * 96 };
    double *v = strata_xcalloc((size_t)n * PER, sizeof *v);
    for (int i = 0; i < n && a->rank == 0; i++) {
        double *c = v + (size_t)i * PER;
        c[0] = tr[i].c.n_sets;
        c[1] = tr[i].c.cost;
        for (int k = 0; k < STRATA_PLAN_MAX_SETS * 96; k++) c[2 + k] = (unsigned char)tr[i].c.sets[k / 96][k % 96];
    }
    from_rank0(a, v, n * PER);
    for (int i = 0; i < n; i++) {
        const double *c = v + (size_t)i * PER;
        strata_plan_candidate *pc = &tr[i].c;
        pc->n_sets = (int)c[0];
        pc->cost = c[1];
        for (int k = 0; k < STRATA_PLAN_MAX_SETS * 96; k++) pc->sets[k / 96][k % 96] = (char)c[2 + k];
        size_t o = 0;
        pc->line[0] = 0;
        for (int k = 0; k < pc->n_sets && o < sizeof pc->line; k++)
            o += (size_t)snprintf(pc->line + o, sizeof pc->line - o, "%s--set %s", k ? " " : "", pc->sets[k]);
    }
    free(v);
    return n;
}

static int by_value(const void *a, const void *b) {
    double x = *(const double *)a, y = *(const double *)b;
    return (x > y) - (x < y);
}

/* One trial: the run with candidate c built from nothing (model, arena, engine, as the real
 * run builds them), AUTO_TRIAL_STEPS optimizer steps on `data`, and everything released.
 * Returns this rank's median time of the steps after the first, or -1 with the reason in
 * why. Every rank calls it in lockstep. Failures that leave no rank inside a collective
 * (the allocation, a fault in a step, which the step's loss agreement already shares) skip
 * the trial; at world 1 so does any error, while with several ranks an error in
 * initialisation, a step or the last update ends the job, as it would in the run itself,
 * since the other ranks may be waiting in a collective for this one. */
static double trial_ms(strata_auto *a, const strata_plan_candidate *c, strata_loader *data, char *why, size_t why_len) {
    strata_config cfg = *a->cfg; /* the engine keeps a pointer to it: it outlives the engine here */
    int bad = 0, built = 0;
    double ms[AUTO_TRIAL_STEPS], median = -1;
    char fault[1024];
    strata_model m;
    strata_arena arena;
    strata_engine *e = NULL;
    why[0] = 0;
    for (int i = 0; i < c->n_sets && !bad; i++) bad = strata_config_set(&cfg, c->sets[i]) != 0;
    if (!bad) bad = strata_config_check(&cfg, "memory.auto") != 0;
    if (bad) snprintf(why, why_len, "%s", strata_error());
    if (!bad) {
        e = strata_build(&cfg, a->dev, a->comm, a->rank, a->world, &m, &arena);
        built = 1;
        if (strata_arena_commit(&arena)) {
            bad = 1;
            snprintf(why, why_len, "%s", strata_error());
        }
    }
    if (any_rank(a, bad)) {
        if (!why[0]) snprintf(why, why_len, "failed on another rank");
        bad = 1;
        goto done;
    }
    if (strata_engine_init_params(e, cfg.train.seed) || strata_fault_take(fault, sizeof fault) != STRATA_FAULT_NONE) {
        if (a->world > 1) auto_fatal(a, "memory.auto: initialising the parameters of a trial");
        snprintf(why, why_len, "initialising parameters: %s", strata_error());
        bad = 1;
        goto done;
    }
    /* Each step is timed whole: with offload it starts by waiting for the update the step
     * before deferred, so every timed step pays for one update, as in the run. */
    for (int s = 0; s < AUTO_TRIAL_STEPS && !bad; s++) {
        strata_step_result r;
        double t0 = strata_now_ms();
        strata_signals_step(s + 1); /* the watchdog's (launcher/watchdog.h) */
        strata_signals_doing(STRATA_DOING_TRIAL);
        if (strata_engine_step(e, data, s, &r)) {
            if (a->world > 1) auto_fatal(a, "memory.auto: a trial step");
            snprintf(why, why_len, "step %d: %s", s + 1, strata_error());
            bad = 1;
            break;
        }
        ms[s] = strata_now_ms() - t0;
        STRATA_DEBUG("plan", "memory.auto: %s: step %d %.1f ms", c->line, s + 1, ms[s]);
        if (r.nonfinite) { /* every rank saw it: the step's loss is agreed on */
            if (strata_fault_take(fault, sizeof fault) != STRATA_FAULT_NONE) snprintf(why, why_len, "step %d: %.200s", s + 1, fault);
            else snprintf(why, why_len, "step %d: loss not finite", s + 1);
            bad = 1;
        }
    }
    if (strata_engine_sync(e) && !bad) {
        if (a->world > 1) auto_fatal(a, "memory.auto: the last update of a trial");
        snprintf(why, why_len, "the last update: %s", strata_error());
        bad = 1;
    }
    strata_signals_doing(STRATA_DOING_START); /* the trial is over: start-up again, unwatched */
    if (!bad && strata_fault_take(fault, sizeof fault) != STRATA_FAULT_NONE) {
        snprintf(why, why_len, "%.200s", fault);
        bad = 1;
    }
    if (!bad) {
        double *timed = ms + 1;
        int k = AUTO_TRIAL_STEPS - 1;
        qsort(timed, (size_t)k, sizeof *timed, by_value);
        median = k % 2 ? timed[k / 2] : 0.5 * (timed[k / 2 - 1] + timed[k / 2]);
    }
done:
    if (built) strata_unbuild(e, &arena, &m);
    strata_fault_take(NULL, 0); /* nothing of a trial reaches the run */
    return bad ? -1 : median;
}

/* Measures every candidate on every rank; a trial's time is the slowest rank's, and a
 * trial that failed anywhere is skipped everywhere. */
static void run_trials(strata_auto *a, strata_auto_trial *tr, int n) {
    const strata_config *cfg = a->cfg;
    strata_loader data; /* a loader of its own: the run's reads start from scratch */
    char why[256] = "";
    int bad = strata_loader_open(&data, cfg->data.train, strata_config_seq_len(cfg), cfg->model.vocab_size,
                                 cfg->data.shuffle, cfg->train.seed) != 0;
    if (bad) snprintf(why, sizeof why, "opening data.train: %s", strata_error());
    if (any_rank(a, bad)) {
        for (int i = 0; i < n; i++) {
            tr[i].ms = -1;
            snprintf(tr[i].skipped, sizeof tr[i].skipped, "%s", why[0] ? why : "data.train failed on another rank");
        }
        if (!bad) strata_loader_close(&data);
        return;
    }
    double *v = strata_xcalloc((size_t)a->world + 1, sizeof *v);
    for (int i = 0; i < n; i++) {
        double ms = trial_ms(a, &tr[i].c, &data, why, sizeof why);
        if (ms < 0 && a->rank != 0) STRATA_WARN("plan", "memory.auto: trial of %s failed here: %s", tr[i].c.line, why);
        memset(v, 0, ((size_t)a->world + 1) * sizeof *v);
        v[a->rank] = ms < 0 ? 0 : ms;
        v[a->world] = ms < 0;
        if (a->world > 1 && strata_allreduce_host_f64(a->comm, v, a->world + 1)) auto_fatal(a, "memory.auto: sharing trial times");
        tr[i].ms = -1;
        tr[i].skipped[0] = 0;
        if (v[a->world] > 0) {
            snprintf(tr[i].skipped, sizeof tr[i].skipped, "%s", ms < 0 ? why : "failed on another rank");
            continue;
        }
        for (int r = 0; r < a->world; r++)
            if (v[r] > tr[i].ms) tr[i].ms = v[r];
    }
    free(v);
    strata_loader_close(&data);
    /* the run's peak counts start here: the trials' arenas are released */
    for (int k = 0; k < STRATA_MEM_KINDS; k++) a->dev->mem[k].peak_bytes = a->dev->mem[k].live_bytes;
}

/* The change memory.auto applies, said in the log: of the changes that fit, the cheapest
 * few by estimate (STRATA_AUTO_TRIALS, default 3; 0 or 1 takes the cheapest estimate unmeasured)
 * are each trained for a few steps, and the fastest measured wins. NULL when rank 0 found
 * none (its plan differs from this rank's), leaving the caller's own suggestion. */
const strata_plan_candidate *strata_auto_choose(strata_auto *a, const strata_plan *plan) {
    int want = AUTO_DEFAULT_TRIALS;
    const char *env = getenv("STRATA_AUTO_TRIALS");
    if (env && *env) {
        char *end = NULL;
        long v = strtol(env, &end, 10);
        if (*end || v < 0 || v > STRATA_AUTO_MAX_TRIALS) {
            if (a->rank == 0)
                STRATA_WARN("plan", "STRATA_AUTO_TRIALS=\"%s\" is not a number of trials from 0 to %d; measuring %d",
                            env, STRATA_AUTO_MAX_TRIALS, AUTO_DEFAULT_TRIALS);
        } else {
            want = (int)v;
        }
    }
    if (want < 1) want = 1;
    strata_auto_trial *tr = a->trials;
    int n = 0;
    if (a->rank == 0) {
        strata_plan_candidate c[STRATA_AUTO_MAX_TRIALS];
        n = strata_plan_candidates(a->cfg, a->world, a->dev, c, want);
        for (int i = 0; i < n; i++) tr[i].c = c[i];
    }
    n = share_candidates(a, tr, n);
    if (n <= 0) return NULL;
    if (n == 1) {
        a->basis = want < 2 ? "cheapest estimate, not measured (STRATA_AUTO_TRIALS below 2)" : "the only change that fits";
        if (a->rank == 0)
            STRATA_INFO("plan", "memory.auto: %s; chose %s (%s, about +%.0f%% step time)", plan->why, tr[0].c.line,
                        a->basis, tr[0].c.cost * 100);
        return &tr[0].c;
    }
    a->n_trials = n;
    double t0 = strata_now_ms();
    run_trials(a, tr, n);
    int best = -1;
    for (int i = 0; i < n; i++)
        if (tr[i].ms >= 0 && (best < 0 || tr[i].ms < tr[best].ms)) best = i;
    if (a->rank == 0) {
        STRATA_INFO("plan", "memory.auto: measured the %d cheapest changes that fit by estimate, %d steps each "
                    "(%.1f s in all):", n, AUTO_TRIAL_STEPS, (strata_now_ms() - t0) / 1e3);
        STRATA_INFO("plan", "  %9s %10s  %s", "estimate", "ms/step", "change");
        for (int i = 0; i < n; i++) {
            char est[16];
            snprintf(est, sizeof est, "+%.0f%%", tr[i].c.cost * 100);
            if (tr[i].ms >= 0) STRATA_INFO("plan", "  %9s %10.1f  %s", est, tr[i].ms, tr[i].c.line);
            else STRATA_INFO("plan", "  %9s %10s  %s (%s)", est, "skipped", tr[i].c.line, tr[i].skipped);
        }
    }
    if (best < 0) {
        a->basis = "cheapest estimate, no trial ran";
        if (a->rank == 0)
            STRATA_WARN("plan", "memory.auto: no trial could run (reasons above); chose %s (cheapest estimate, about "
                        "+%.0f%% step time)", tr[0].c.line, tr[0].c.cost * 100);
        return &tr[0].c;
    }
    a->basis = "measured fastest";
    if (a->rank == 0)
        STRATA_INFO("plan", "memory.auto: %s; chose %s (measured fastest: %.1f ms/step; estimated +%.0f%%)", plan->why,
                    tr[best].c.line, tr[best].ms, tr[best].c.cost * 100);
    return &tr[best].c;
}

/* s as a JSON string. */
static void json_string(FILE *f, const char *s) {
    fputc('"', f);
    for (; *s; s++) {
        unsigned char ch = (unsigned char)*s;
        if (ch == '"' || ch == '\\') fprintf(f, "\\%c", ch);
        else if (ch < 0x20) fprintf(f, "\\u%04x", ch);
        else fputc(ch, f);
    }
    fputc('"', f);
}

/* memory.auto's choice, its basis, and what each trial measured, for the first metrics row. */
void strata_auto_write_metrics(const strata_auto *a, const char *change, FILE *f) {
    fprintf(f, ", \"memory_auto\": ");
    json_string(f, change);
    fprintf(f, ", \"memory_auto_basis\": ");
    json_string(f, a->basis ? a->basis : "");
    fprintf(f, ", \"memory_auto_trials\": [");
    for (int i = 0; i < a->n_trials; i++) {
        const strata_auto_trial *tr = &a->trials[i];
        fprintf(f, "%s{\"change\": ", i ? ", " : "");
        json_string(f, tr->c.line);
        fprintf(f, ", \"estimated_cost\": %.4f, ", tr->c.cost);
        if (tr->ms >= 0) fprintf(f, "\"ms_per_step\": %.3f}", tr->ms);
        else {
            fprintf(f, "\"ms_per_step\": null, \"skipped\": ");
            json_string(f, tr->skipped);
            fputc('}', f);
        }
    }
    fputc(']', f);
}

