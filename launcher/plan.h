/* launcher/plan.h: the memory plan per tier, the check against the machine, and the
 * changes that make a run fit, cheapest estimate first (issue: know before step 1 whether a
 * run fits).
 *
 * The numbers come from building the engine's arena without allocating it, so they are
 * exactly what `strata train` would allocate. */
#ifndef STRATA_PLAN_H
#define STRATA_PLAN_H

#include <stddef.h>
#include <stdio.h>

#include "core/arena.h"
#include "core/device.h"
#include "core/model.h"
#include "io/config.h"

enum { STRATA_TIER_DEVICE = 0, STRATA_TIER_PINNED, STRATA_TIER_HOST, STRATA_TIER_NVME, STRATA_TIERS };

/* The device memory a CUDA run uses outside Strata's arena, its "runtime" row. With a GPU
 * at hand it is measured just before the arena is allocated: total - free - Strata's live
 * allocations, which is the CUDA context, the cuBLASLt workspace (core/cuda/kernels_cuda.cu),
 * NCCL's buffers and any other process on the GPU, everything nvidia-smi counts; to that
 * the plan adds an allowance for the kernel modules CUDA loads lazily at each kernel's
 * first launch (Strata's own and cuBLASLt's), which no measurement before step 1 sees.
 * Without a GPU (`strata plan --gpu-gb N` for a cuda config) the context is estimated. The
 * CPU backend has no runtime row: its plan is exact. */
/* lazily loaded kernel modules: on the H200 (2026-11-27, driver 580, CUDA 13.0) every
 * kernel of a training step added 1.2 MiB to what was in use at open */
#define STRATA_PLAN_MODULE_ALLOWANCE_BYTES ((size_t)8 << 20)
#define STRATA_PLAN_CONTEXT_ESTIMATE_BYTES ((size_t)512 << 20)  /* about a CUDA 12/13 context on an H100 */
#define STRATA_PLAN_WORKSPACE_BYTES ((size_t)32 << 20)          /* the cuBLASLt workspace */

typedef struct strata_plan {
    int world, stage;
    strata_optim_state optim_state; /* how the moments are stored (optim.state) */
    size_t n_params;                /* the model's parameters (0: unknown, no bytes-a-parameter line) */
    int grads_home;                 /* offload.gradients: cpu at one rank, the optimizer offloaded */
    int head_rows, rows;            /* the head's rows of logits held at once, of the micro-batch's */
    int mlp_rows;                   /* the rows the blocks' MLPs take at a time */
    int resid_slots, resid_streams; /* residual streams on the device, of the model's */
    size_t acts_resid, acts_logits; /* of the device's activations: the residual streams', the logits' */
    size_t bytes[STRATA_TIERS][STRATA_CAT_COUNT];
    size_t need[STRATA_TIERS];
    size_t capacity[STRATA_TIERS]; /* 0 = unknown / not used */
    /* need[STRATA_TIER_DEVICE] is the arena alone; the fit check adds the runtime */
    size_t runtime_bytes;          /* device memory outside the arena, allowance included (0: none) */
    size_t runtime_held;           /* of it, held when measured (or estimated) */
    int runtime_estimated;         /* no GPU here: runtime_held is the context estimate + workspace */
    int cpu_backend;               /* device memory is host memory: one budget for both */
    int fits;
    int device_over, host_over, nvme_over; /* each tier's own verdict (host: pinned + host) */
    char nvme_error[1100];         /* nvme_path unusable (missing, not a directory) */
    char why[1200];                /* which tier is over, by how much */
} strata_plan;

/* Fills p->bytes/need from an arena that an engine was planned into. */
void strata_plan_from_arena(strata_plan *p, const strata_arena *a, int world, int stage);
/* The state type and parameter count, for the optimizer's bytes a parameter. */
void strata_plan_set_model(strata_plan *p, const strata_config *cfg, const strata_model *m);
/* NVMe bytes in all, of which param_bytes are stage-3 parameter shards (offload.params). */
void strata_plan_add_nvme(strata_plan *p, size_t bytes, size_t param_bytes);
/* Pinned buffers made outside the arena (the collectives' staging buffer). */
void strata_plan_add_pinned_buffers(strata_plan *p, size_t bytes);
/* Plans cfg at world size `world` without a device (no allocation). */
void strata_plan_compute(strata_plan *p, const strata_config *cfg, int world);
/* Capacities from memory.gpu_gb/host_gb/nvme_gb, else queried (dev may be NULL; a CUDA
 * device's capacity is its total memory), the device runtime row (above), and the verdict
 * in p->fits / p->why. Call it before the arena is allocated. */
void strata_plan_check(strata_plan *p, const strata_config *cfg, strata_device *dev);
/* The paths the plan depends on, before it is computed: offload.nvme_path, when NVMe
 * offload is asked for (or memory.auto may choose it), must be an existing directory. A
 * missing path or a regular file there is a config error (exit 2), not "does not fit".
 * 0, or -1 with the error naming the key and the path. */
int strata_plan_check_paths(const strata_config *cfg);
void strata_plan_print(const strata_plan *p, FILE *f);
/* The device memory the plan predicts a run holds at its peak, as nvidia-smi counts it on
 * CUDA (the arena plus the runtime row) and as the allocator counts it on the CPU. */
size_t strata_plan_device_total(const strata_plan *p);

/* The cheapest change (by estimated extra step time) that fits, keeping the global batch:
 * writes the --set line into `sets_line` and the overrides into sets[] (up to max_sets
 * strings of 96 chars). Returns the number of overrides, 0 when cfg already fits, -1 when
 * nothing tried fits. `cost` gets the estimated fraction of step time added. The changes
 * tried keep the optimizer's numerics, unless cfg's memory.allow_int8_state lets 8-bit
 * optimizer state (optim.state=int8) be among them. */
int strata_plan_suggest(const strata_config *cfg, int world, strata_device *dev, char sets[][96],
                        int max_sets, char *sets_line, size_t line_len, double *cost);

/* Whether a change (n --set overrides) changes the optimizer's numerics: 8-bit state. */
int strata_plan_changes_numerics(char sets[][96], int n);

/* The ratios set to auto become numbers, in steps of 0.01: offload.optimizer_ratio the
 * smallest share whose plan leaves the device 2% of its capacity free (the optimizer state
 * the device cannot hold is offloaded, the rest stays; 1 when the device's size is unknown,
 * as with no GPU and no memory.gpu_gb, when even all of it offloaded leaves no such room,
 * or when nothing can stay, offload.params set); then offload.nvme_ratio (optimizer: nvme)
 * the smallest share on NVMe that leaves host memory 10% free (1 when even all of it on
 * NVMe does not). Numbers are left as they are. */
void strata_plan_resolve_auto(strata_config *cfg, int world, strata_device *dev);

/* A config that offloads all of its optimizer state (ratio 1, parameters on the device)
 * while the device has room for part of it: writes a one-line hint naming
 * optimizer_ratio: auto and what it would keep, returns 1; else 0 and an empty line. */
int strata_plan_auto_hint(const strata_config *cfg, int world, strata_device *dev, char *line, size_t len);

/* One change that fits, as strata_plan_suggest writes it. */
#define STRATA_PLAN_MAX_SETS 9
typedef struct strata_plan_candidate {
    char sets[STRATA_PLAN_MAX_SETS][96]; /* the --set overrides, n_sets of them */
    int n_sets;
    char line[800];                      /* "--set a=b --set c=d" */
    double cost;                         /* estimated fraction of step time added */
} strata_plan_candidate;

/* Up to max changes that fit, cheapest estimate first (the first is strata_plan_suggest's),
 * for memory.auto to measure. A change that adds to a cheaper one already listed (more
 * recomputation, halvings, stage or offload on top of it) only adds work, so it is left
 * out. Returns how many, 0 when cfg already fits, -1 when nothing tried fits. */
int strata_plan_candidates(const strata_config *cfg, int world, strata_device *dev, strata_plan_candidate *out,
                           int max);

#endif
