/* launcher/auto.h: what `memory.auto: true` applies when a run does not fit. Of the changes
 * that fit (launcher/plan.h), the cheapest few by estimate (STRATA_AUTO_TRIALS, default 3;
 * 0 or 1 takes the cheapest estimate unmeasured) are each built from nothing and trained for
 * a few steps, everything released after; the fastest measured wins. With several ranks
 * every rank measures rank 0's candidates in lockstep and a trial's time is the slowest
 * rank's, so all ranks choose the same change. */
#ifndef STRATA_AUTO_H
#define STRATA_AUTO_H

#include <stdio.h>

#include "core/device.h"
#include "io/config.h"
#include "shard/comm.h"
#include "launcher/plan.h"

#define STRATA_AUTO_MAX_TRIALS 8

typedef struct strata_auto_trial {
    strata_plan_candidate c;
    double ms;         /* median step time after the first, on the slowest rank; < 0: not measured */
    char skipped[256]; /* why it was not measured */
} strata_auto_trial;

typedef struct strata_auto {
    const strata_config *cfg; /* the run's config, before the change */
    strata_device *dev;
    strata_comm *comm;
    int rank, world;
    strata_auto_trial trials[STRATA_AUTO_MAX_TRIALS];
    int n_trials;      /* measured (0 when nothing was measured) */
    const char *basis; /* why the choice: measured fastest, the only change that fits, ... */
} strata_auto;

/* The change to apply, said in the log; NULL when rank 0 found none (its plan differs from
 * this rank's), leaving the caller's own suggestion. A failure with several ranks ends the
 * job, as in the run itself. */
const strata_plan_candidate *strata_auto_choose(strata_auto *a, const strata_plan *plan);
/* `, "memory_auto": ..., "memory_auto_basis": ..., "memory_auto_trials": [...]` for the
 * first metrics row. */
void strata_auto_write_metrics(const strata_auto *a, const char *change, FILE *f);

#endif
