/* launcher/offload_report.c: the offload split of a run's steps and its floor
 * (launcher/offload_report.h). */
#include "launcher/offload_report.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "shard/mpi.h"

/* The bandwidths the floor divides by, measured once on the committed arena's memory
 * before anything is in it (so nothing is allocated outside the plan), 64 MiB at most
 * (well under a second): pinned <-> device copies, a host streaming pass, and the disk
 * when offload uses NVMe. Every rank measures at once (after a barrier), so ranks that
 * share a bus, memory or disk see their share. STRATA_OFFLOAD_FLOOR=off skips it (a
 * debugger, or a disk too slow to spare the 64 MiB); the split is still printed. */
int strata_offload_measure_floor(strata_offload_split *s, const strata_config *cfg, strata_device *dev,
                                 const strata_arena *arena, int rank, int world) {
    const char *env = getenv("STRATA_OFFLOAD_FLOOR");
    if (cfg->offload.optimizer == STRATA_OFFLOAD_NONE || (env && !strcmp(env, "off"))) return 0;
    size_t bytes = (size_t)64 << 20;
    for (int k = STRATA_MEM_DEVICE; k <= STRATA_MEM_PINNED; k++)
        if (arena->total[k] < bytes) bytes = arena->total[k];
    int nvme = cfg->offload.optimizer == STRATA_OFFLOAD_NVME || cfg->offload.params == STRATA_OFFLOAD_NVME;
    int32_t me = 0, *all = strata_xcalloc((size_t)world, sizeof *all);
    int agreed = strata_mpi_allgather(&me, all, sizeof me) == 0;
    free(all);
    if (!agreed) return -1;
    if (strata_measure_floor_bandwidth(dev, arena->base[STRATA_MEM_PINNED], arena->base[STRATA_MEM_DEVICE], bytes,
                                       nvme ? cfg->offload.nvme_path : NULL, rank, (size_t)cfg->offload.block_kb * 1024,
                                       cfg->offload.queue_depth, &s->floor_bw))
        STRATA_WARN("offload", "the floor will not be reported: %s", strata_error());
    return 0;
}

void strata_offload_split_add(strata_offload_split *s, const strata_step_result *r, double ms) {
    if (!r->have_split) return;
    double x[5] = {ms, r->compute_ms, r->offload_wait_ms, r->comm_wait_ms, r->data_ms};
    for (int i = 0; i < 5; i++) s->ms[i] += x[i];
    strata_tier_stats_add(&s->tier, &r->tier, 1);
    s->gather_bytes += (double)r->gather_h2d_bytes;
    s->steps++;
}

/* What each rank sends rank 0: per-step means, then the floor's terms (ms). */
enum { SPLIT_STEP, SPLIT_COMPUTE, SPLIT_WAIT_TIER, SPLIT_WAIT_COMM, SPLIT_WAIT_DATA, SPLIT_D2H, SPLIT_ADAMW,
       SPLIT_STATE_WAIT, SPLIT_STATE_WRITE, SPLIT_H2D, SPLIT_PARAM_WRITE, SPLIT_PARAM_READ, SPLIT_D2H_B, SPLIT_H2D_B,
       SPLIT_ADAMW_N, SPLIT_ADAMW_B, SPLIT_READ_B, SPLIT_WRITE_B, SPLIT_GATHER_B, FLOOR_COMPUTE, FLOOR_PCIE, FLOOR_HOST, FLOOR_DISK,
       SPLIT_N };

static double gbps_ms(double bytes, double gbps) { return gbps > 0 ? bytes / (gbps * 1e6) : 0; }

/* This rank's figures into v: the means per step of the split, and the floor's terms: the
 * largest of compute, PCIe bytes over the pinned bandwidth (each direction on its own: the
 * link is full duplex), the AdamW's bytes over host memory bandwidth and disk bytes over
 * the disk's read and write bandwidth. */
static void split_figures(const strata_offload_split *sp, double v[SPLIT_N]) {
    double n = sp->steps > 0 ? sp->steps : 1;
    const strata_tier_stats *s = &sp->tier;
    const strata_floor_bandwidth *bw = &sp->floor_bw;
    for (int i = 0; i < 5; i++) v[i] = sp->ms[i] / n;
    double sec[] = {s->d2h_s, s->adamw_s, s->state_wait_s, s->state_write_s, s->h2d_s, s->param_write_s, s->param_read_s};
    for (int i = 0; i < 7; i++) v[SPLIT_D2H + i] = sec[i] * 1e3 / n;
    double cnt[] = {(double)s->d2h_bytes, (double)s->h2d_bytes, (double)s->adamw_elements, (double)s->adamw_bytes,
                    (double)s->disk_read_bytes, (double)s->disk_write_bytes};
    for (int i = 0; i < 6; i++) v[SPLIT_D2H_B + i] = cnt[i] / n;
    v[SPLIT_GATHER_B] = sp->gather_bytes / n;
    v[FLOOR_COMPUTE] = v[SPLIT_COMPUTE];
    v[FLOOR_PCIE] = fmax(gbps_ms(v[SPLIT_D2H_B], bw->d2h), gbps_ms(v[SPLIT_H2D_B] + v[SPLIT_GATHER_B], bw->h2d));
    v[FLOOR_HOST] = gbps_ms(v[SPLIT_ADAMW_B], bw->host);
    v[FLOOR_DISK] = gbps_ms(v[SPLIT_READ_B], bw->disk_read) + gbps_ms(v[SPLIT_WRITE_B], bw->disk_write);
}

/* Every rank: v becomes the largest of every rank's figures (the slowest rank sets the
 * step), *min_steps the fewest steps any rank summed. 0, or -1 with the error set. */
static int largest_over_ranks(double v[SPLIT_N], int32_t steps, int world, int32_t *min_steps) {
    double *all = strata_xcalloc((size_t)world * SPLIT_N, sizeof *all);
    int32_t *all_steps = strata_xcalloc((size_t)world, sizeof *all_steps);
    int rc = strata_mpi_allgather(v, all, SPLIT_N * sizeof *v) || strata_mpi_allgather(&steps, all_steps, sizeof steps)
                 ? -1 : 0;
    *min_steps = steps;
    for (int r = 0; r < world && !rc; r++) {
        for (int i = 0; i < SPLIT_N; i++) v[i] = fmax(v[i], all[r * SPLIT_N + i]);
        if (all_steps[r] < *min_steps) *min_steps = all_steps[r];
    }
    free(all);
    free(all_steps);
    return rc;
}

/* Rank 0: the split per step, one line per part of the step. */
static void print_split(const double v[SPLIT_N], int32_t steps, const strata_config *cfg, int world) {
    char b[6][32];
    STRATA_INFO("offload", "split per step (mean of %d steps, the largest over %d rank%s):", steps, world,
                world > 1 ? "s" : "");
    STRATA_INFO("offload", "  compute busy %.2f ms | waits: on the tier %.2f ms, collectives %.2f ms, data %.2f ms",
                v[SPLIT_COMPUTE], v[SPLIT_WAIT_TIER], v[SPLIT_WAIT_COMM], v[SPLIT_WAIT_DATA]);
    char gathers[80] = "";
    if (v[SPLIT_GATHER_B] > 0)
        snprintf(gathers, sizeof gathers, " (+ %s of stage-3 gathers from host memory)",
                 strata_fmt_bytes(b[5], 32, v[SPLIT_GATHER_B]));
    /* gradients in pinned memory are the engine's copies, on device streams, in the backward:
     * bytes, no time of the tier's */
    int home = cfg->offload.gradients == STRATA_OFFLOAD_CPU;
    char d2h[64];
    if (home) snprintf(d2h, sizeof d2h, "%s, copied out in the backward", strata_fmt_bytes(b[0], 32, v[SPLIT_D2H_B]));
    else snprintf(d2h, sizeof d2h, "%.2f ms, %s", v[SPLIT_D2H], strata_fmt_bytes(b[0], 32, v[SPLIT_D2H_B]));
    STRATA_INFO("offload", "  D2H gradients %s | H2D parameters%s %.2f ms, %s%s", d2h,
                home && cfg->train.grad_accum > 1 ? " (and gradients copied back in to accumulate)" : "", v[SPLIT_H2D],
                strata_fmt_bytes(b[1], 32, v[SPLIT_H2D_B]), gathers);
    char kept[96] = "";
    if (cfg->offload.optimizer_ratio < 1)
        snprintf(kept, sizeof kept, "; the device updates the rest (offload.optimizer_ratio %g)",
                 cfg->offload.optimizer_ratio);
    STRATA_INFO("offload", "  CPU AdamW %.2f ms, %.0f parameters, %s of host memory traffic%s",
                v[SPLIT_ADAMW], v[SPLIT_ADAMW_N], strata_fmt_bytes(b[2], 32, v[SPLIT_ADAMW_B]), kept);
    STRATA_INFO("offload", "  disk read %s (AdamW waiting for state %.2f ms, parameter reads %.2f ms) | write %s "
                "(state %.2f ms, parameters %.2f ms)", strata_fmt_bytes(b[3], 32, v[SPLIT_READ_B]), v[SPLIT_STATE_WAIT],
                v[SPLIT_PARAM_READ], strata_fmt_bytes(b[4], 32, v[SPLIT_WRITE_B]), v[SPLIT_STATE_WRITE],
                v[SPLIT_PARAM_WRITE]);
}

/* Rank 0: the floor (its largest term), the bandwidths it came from, and the step as a
 * multiple of it. */
static void print_floor(const double v[SPLIT_N], const strata_floor_bandwidth *bw) {
    if (bw->copy_bytes == 0) {
        STRATA_INFO("offload", "floor: not measured (STRATA_OFFLOAD_FLOOR=off, or the measurement failed)");
        return;
    }
    static const char *term_name[4] = {"compute", "PCIe", "host memory (AdamW)", "disk"};
    int worst = 0;
    for (int i = 1; i < 4; i++)
        if (v[FLOOR_COMPUTE + i] > v[FLOOR_COMPUTE + worst]) worst = i;
    double floor_ms = v[FLOOR_COMPUTE + worst];
    STRATA_INFO("offload", "  bandwidths (rank 0): pinned H2D %.2f GB/s, D2H %.2f GB/s, host memory %.2f GB/s%s",
                bw->h2d, bw->d2h, bw->host, bw->disk_bytes ? "" : ", disk not used");
    if (bw->disk_bytes)
        STRATA_INFO("offload", "  disk (rank 0): read %.2f GB/s, write %.2f GB/s", bw->disk_read, bw->disk_write);
    STRATA_INFO("offload", "floor %.2f ms, set by %s (compute %.2f, PCIe %.2f, host memory %.2f, disk %.2f ms)",
                floor_ms, term_name[worst], v[FLOOR_COMPUTE], v[FLOOR_PCIE], v[FLOOR_HOST], v[FLOOR_DISK]);
    STRATA_INFO("offload", "step %.2f ms = %.2fx the floor", v[SPLIT_STEP], floor_ms > 0 ? v[SPLIT_STEP] / floor_ms : 0);
}

/* At the end of an offload run, every rank: the step's split (means over the steps that
 * have one, the largest over ranks, as the slowest rank sets the step), the floor, and
 * the step as a multiple of it. */
int strata_offload_split_report(const strata_offload_split *s, const strata_config *cfg, int rank, int world) {
    if (cfg->offload.optimizer == STRATA_OFFLOAD_NONE) return 0;
    double v[SPLIT_N] = {0};
    int32_t min_steps = 0;
    split_figures(s, v);
    if (largest_over_ranks(v, s->steps, world, &min_steps)) return -1;
    if (rank != 0) return 0;
    if (min_steps <= 0) {
        STRATA_INFO("offload", "split: no step with a whole split (the first step's update runs behind the second)");
        return 0;
    }
    print_split(v, min_steps, cfg, world);
    print_floor(v, &s->floor_bw);
    return 0;
}
