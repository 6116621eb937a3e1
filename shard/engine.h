/* shard/engine.h: the ZeRO engine. It owns parameters, gradients and optimizer state,
 * partitioned across ranks by zero.stage, and schedules the model's units:
 *
 *   stage 0  every rank holds everything; gradients all-reduced (last micro-step)
 *   stage 1  fp32 master + Adam moments only for the rank's shard; gradients
 *            reduce-scattered at the last micro-step; updated shards all-gathered
 *   stage 2  gradients partitioned too: each unit's gradient is reduce-scattered as soon
 *            as its backward is done (every micro-step), into an fp32 shard accumulator,
 *            on the collective stream while the backward of earlier units runs
 *   stage 3  parameters partitioned too: a unit is all-gathered into a ring slot before
 *            its forward and its backward, zero.prefetch_units ahead, released after use.
 *            The embedding (tied to the LM head) is gathered once per micro-step into a
 *            buffer of its own and kept until the head's backward has used it.
 *
 * Partition: unit u's flat buffer is padded to a multiple of world * 64 elements (world *
 * 2048 with int8 optimizer state: every rank's range starts on a quantization block); rank
 * r owns elements [r*S, (r+1)*S), S = padded / world. Checkpoints store exactly those
 * standard shards, which is what lets any world size and stage read any other's. */
#ifndef STRATA_ENGINE_H
#define STRATA_ENGINE_H

#include <stdint.h>

#include "core/arena.h"
#include "core/model.h"
#include "core/profile.h"
#include "core/update_tier.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "io/data.h"
#include "shard/comm.h"

typedef struct strata_engine strata_engine;

/* Bytes held per rank, by what they are (the ZeRO paper's accounting, plus buffers). */
typedef struct strata_engine_memory {
    size_t params, grads, optimizer, activations, buffers;
} strata_engine_memory;

typedef struct strata_step_result {
    double loss;       /* mean over the step's learned targets, every rank's */
    uint64_t learned_tokens; /* those targets (B*T*world*A without a loss mask) */
    double grad_norm;  /* global L2 norm before clipping */
    double lr;
    int nonfinite;     /* loss or gradient norm was NaN/inf on some rank: nothing was updated */
    double backward_start_ms, backward_end_ms; /* last micro-step's backward, strata_now_ms */
    double comm_wait_ms; /* compute (or the host) blocked waiting for collectives */
    double data_ms;      /* reading batches */
    double offload_wait_ms; /* waiting for the offloaded optimizer update */
    /* The split of an offload run (an update tier), from its second step on
     * (have_split): compute_ms is the time the compute stream was busy, from device
     * timing events, with every stretch it stood waiting (collectives, the tier, data)
     * taken out; compute_untimed counts waits past the timer's events, left in as busy.
     * tier is the tier's work since the last step's snapshot: the previous step's update
     * (it runs behind this step's forward) and this step's parameter reads. */
    int have_split;
    double compute_ms;
    int compute_untimed;
    strata_tier_stats tier;
    /* stage 3 with the parameter shards off the device (offload.params): the shard bytes
     * this step's gathers read from host memory, which cross PCIe to the device */
    uint64_t gather_h2d_bytes;
} strata_step_result;

/* Plans everything (model activations included) into `arena` for world size `world`;
 * dev and comm may be NULL for a plan that will only be printed (`strata plan`). `tier`
 * keeps and updates the optimizer state off the device (core/update_tier.h; the launcher
 * builds it from offload/), or is NULL: the state then lives on the device. The engine
 * owns the tier from here on. */
strata_engine *strata_engine_create(const strata_config *cfg, strata_model *m, strata_arena *arena,
                                    strata_device *dev, strata_comm *comm, strata_update_tier *tier, int rank,
                                    int world);
void strata_engine_destroy(strata_engine *e);
strata_engine_memory strata_engine_get_memory(const strata_engine *e);
const size_t *strata_engine_padded(const strata_engine *e);
/* Bytes this rank keeps on NVMe (offload.optimizer: nvme), for the memory plan. */
size_t strata_engine_nvme_bytes(const strata_engine *e);
/* Of those, the stage-3 parameter shards (offload.params: nvme). */
size_t strata_engine_nvme_param_bytes(const strata_engine *e);

/* After strata_arena_commit: initial parameters from the seed (a pure function of the
 * element index, so every world size and stage starts from identical weights). */
int strata_engine_init_params(strata_engine *e, uint64_t seed);

/* Where initial parameters come from: fills elements [lo, hi) of unit u's flat fp32
 * buffer (padding included) into dst, or fails with strata_fail. */
typedef int (*strata_param_source)(void *ctx, const strata_model *m, int u, size_t lo, size_t hi, float *dst);
/* After strata_arena_commit: each rank asks `source` for exactly its own range of every
 * unit (its shard from stage 1 on), so no rank holds more than one unit's range at a time;
 * the values go where the rank's optimizer state lives (device, pinned host or NVMe), Adam
 * moments start at zero. Collective: a failure on any rank fails every rank. */
int strata_engine_init_from(strata_engine *e, strata_param_source source, void *ctx);

/* One optimizer step: grad_accum micro-batches of this rank's slice of the global batch,
 * reductions, clipping, AdamW, gathers. */
int strata_engine_step(strata_engine *e, strata_loader *train, int64_t step, strata_step_result *r);

/* STRATA_PROFILE=kernels: from the next step on, every step's kernel groups are timed on
 * the compute stream (core/profile.h); makes all the profiler's events now. 0, or -1 + error. */
int strata_engine_profile_kernels(strata_engine *e);
/* At the end of a run (after strata_engine_sync): waits for the last step's events and
 * gives the means per step. 0, or -1 + error (not enabled, or no step profiled). */
int strata_engine_kernel_profile(strata_engine *e, strata_prof_report *r);

/* Waits for the last step's offloaded optimizer update, which otherwise runs behind the
 * next step's forward; returns the error it hit, if any. Eval, checkpoints and sampling
 * call it themselves; a run calls it once after its last step. */
int strata_engine_sync(strata_engine *e);

/* Asks whether this rank was asked to stop (in `strata train`, by SIGINT or SIGTERM); the
 * engine's long loops call it where every rank passes in lockstep and end early when any
 * rank says yes. The engine cannot see the launcher, so the launcher hands it over. */
typedef int (*strata_stop_query)(void);
/* NULL (the default): nothing stops the engine's loops early. */
void strata_engine_set_stop(strata_engine *e, strata_stop_query stop);

/* What strata_engine_eval returns when a stop ended it: not an error, and no loss. */
#define STRATA_ENGINE_STOPPED 1

/* Mean validation loss over n_batches global batches (every rank evaluates its slice).
 * Before each batch the ranks agree on the stop query (one small all-reduce at world > 1),
 * so a stop asked of any rank ends every rank's pass at the same batch, within one batch's
 * forward: STRATA_ENGINE_STOPPED, *loss untouched. 0, STRATA_ENGINE_STOPPED, or -1 + error. */
int strata_engine_eval(strata_engine *e, strata_loader *val, int n_batches, double *loss);

/* Checkpoint I/O of this rank's standard shards (collective: every rank calls them). */
int strata_engine_save(strata_engine *e, const char *run_dir, const strata_ckpt_meta *meta,
                       char *final_dir, size_t final_len);
int strata_engine_load(strata_engine *e, strata_ckpt *ck);

/* Makes every unit's full parameters resident in m->params (gathering under stage 3) for
 * sampling; returns an error when the plan has no room for that (stage 3 gathers into
 * slots, so sampling under stage 3 is done from a checkpoint by `strata sample`). */
int strata_engine_params_resident(strata_engine *e);

/* Elements [lo, lo + n) of array `kind` (core/update_tier.h's STRATA_STATE_*, as optim.state
 * stores it) of this rank's optimizer range of unit u, into dst, from wherever it lives;
 * *count, when not NULL, gets the array's length. Waits for pending updates first. Tests
 * compare the state of two runs with it. */
int strata_engine_read_state(strata_engine *e, int u, int kind, size_t lo, size_t n, void *dst, size_t *count);

/* This rank's standard shard of unit u's fp32 master weights: elements [*lo, *lo + *n) of
 * the padded flat buffer, in device memory (host-readable on the CPU backend; tests use it). */
const float *strata_engine_master_shard(const strata_engine *e, int u, size_t *lo, size_t *n);

#endif
