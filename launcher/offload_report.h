/* launcher/offload_report.h: where an offload run's step goes, and how far it is from the
 * floor the machine allows. At the start every rank measures the bandwidths the floor
 * divides by; each step with a whole split adds to the run's sums; at the end rank 0
 * prints the split per step (the largest over ranks) and the step as a multiple of the
 * floor. A run without optimizer offload reports nothing. */
#ifndef STRATA_OFFLOAD_REPORT_H
#define STRATA_OFFLOAD_REPORT_H

#include "core/arena.h"
#include "core/device.h"
#include "core/update_tier.h"
#include "io/config.h"
#include "shard/engine.h"
#include "offload/bench_io.h"

/* A run's offload figures: the floor's bandwidths, and sums over the steps that have a
 * split. Zero is the start. */
typedef struct strata_offload_split {
    strata_floor_bandwidth floor_bw; /* copy_bytes 0: not measured */
    int steps;
    double ms[5];        /* step, compute busy, waits on the tier, on collectives, on data */
    double gather_bytes; /* stage-3 gathers' shard bytes read from host memory */
    strata_tier_stats tier;
} strata_offload_split;

/* The floor's bandwidths, measured on the committed arena's memory before anything is in
 * it; every rank calls it at once. A measurement that fails (or STRATA_OFFLOAD_FLOOR=off)
 * leaves the floor unmeasured, with a warning. 0, or -1 with the error set when the ranks
 * could not agree to start. */
int strata_offload_measure_floor(strata_offload_split *s, const strata_config *cfg, strata_device *dev,
                                 const strata_arena *arena, int rank, int world);
/* One step's split into the sums (steps whose tier figures are not whole are left out). */
void strata_offload_split_add(strata_offload_split *s, const strata_step_result *r, double ms);
/* At the end of an offload run, every rank: rank 0 prints the split and the floor. 0, or
 * -1 with the error set when the ranks' figures could not be gathered. */
int strata_offload_split_report(const strata_offload_split *s, const strata_config *cfg, int rank, int world);

#endif
