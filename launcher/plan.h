/* launcher/plan.h: the memory plan per tier, the check against the machine, and the
 * cheapest change that makes a run fit (issue: know before step 1 whether a run fits).
 *
 * The numbers come from building the engine's arena without allocating it, so they are
 * exactly what `strata train` would allocate. */
#ifndef STRATA_PLAN_H
#define STRATA_PLAN_H

#include <stddef.h>
#include <stdio.h>

#include "core/arena.h"
#include "core/config.h"
#include "core/device.h"

enum { STRATA_TIER_DEVICE = 0, STRATA_TIER_PINNED, STRATA_TIER_HOST, STRATA_TIER_NVME, STRATA_TIERS };

typedef struct strata_plan {
    int world, stage;
    size_t bytes[STRATA_TIERS][STRATA_CAT_COUNT];
    size_t need[STRATA_TIERS];
    size_t capacity[STRATA_TIERS]; /* 0 = unknown / not used */
    int cpu_backend;               /* device memory is host memory: one budget for both */
    int fits;
    char nvme_error[1100];         /* nvme_path unusable (missing, not a directory) */
    char why[1200];                /* which tier is over, by how much */
} strata_plan;

/* Fills p->bytes/need from an arena that an engine was planned into. */
void strata_plan_from_arena(strata_plan *p, const strata_arena *a, int world, int stage);
void strata_plan_add_nvme(strata_plan *p, size_t bytes);
/* Plans cfg at world size `world` without a device (no allocation). */
void strata_plan_compute(strata_plan *p, const strata_config *cfg, int world);
/* Capacities from memory.gpu_gb/host_gb/nvme_gb, else queried (dev may be NULL), and the
 * verdict in p->fits / p->why. */
void strata_plan_check(strata_plan *p, const strata_config *cfg, strata_device *dev);
void strata_plan_print(const strata_plan *p, FILE *f);

/* The cheapest change (by estimated extra step time) that fits, keeping the global batch:
 * writes the --set line into `sets_line` and the overrides into sets[] (up to max_sets
 * strings of 96 chars). Returns the number of overrides, 0 when cfg already fits, -1 when
 * nothing tried fits. `cost` gets the estimated fraction of step time added. */
int strata_plan_suggest(const strata_config *cfg, int world, strata_device *dev, char sets[][96],
                        int max_sets, char *sets_line, size_t line_len, double *cost);

#endif
