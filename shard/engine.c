/* shard/engine.c: ZeRO stages 0-3 over the collectives of shard/comm.h.
 * The stage decides where each of params / grads / optimizer state lives (stage_table
 * below, the table of engine.h as facts); the step is one schedule of unit operations
 * with the collectives those facts call for in between. */
#include "shard/engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "core/common.h"
#include "core/kernels.h"
#include "core/optim.h"
#include "core/quant.h"
#include "shard/acts_home.h"

#define PAD_ALIGN 64 /* elements; shards start on 256-byte boundaries for fp32 */
/* With 8-bit optimizer state units are padded to world x 2048 instead, so every rank's range
 * starts on a quantization block (core/quant.h): a block never straddles two ranks, and a
 * checkpoint's blocks mean the same at any world size. fp32 and bf16 state keep 64. */
/* The planned buffer that checkpoints, loads, initialisation and the publishing of
 * offloaded master weights go through, a chunk at a time: at most this large (smaller
 * when the largest optimizer range is), so saving a model of any size needs no memory
 * beyond the plan. */
#define IO_STAGING_MAX_BYTES ((size_t)64 << 20)

/* ---- what a stage means ---- */

/* How a unit's gradient leaves the rank after its backward. */
typedef enum reduce_kind {
    REDUCE_ALL_AT_LAST,     /* all-reduced in place after the last micro-step's backward */
    REDUCE_SCATTER_AT_LAST, /* reduce-scattered in place after the last micro-step's backward */
    REDUCE_SCATTER_EACH,    /* reduce-scattered after every micro-step's backward, from a
                               bucket into the fp32 shard accumulator */
} reduce_kind;

typedef struct stage_facts {
    int opt_sharded;    /* fp32 master weights and Adam moments: the rank's shard only */
    int grads_sharded;  /* gradients: shard accumulators (full gradients only in buckets) */
    int params_sharded; /* parameters: shards, gathered into a ring of slots before use */
    int gather_updates; /* full parameters, sharded optimizer: updated shards are all-gathered */
    reduce_kind reduce;
} stage_facts;

static const stage_facts stage_table[4] = {
    /*    opt grads params gather-updates reduce */
    [0] = {0, 0, 0, 0, REDUCE_ALL_AT_LAST},
    [1] = {1, 0, 0, 1, REDUCE_SCATTER_AT_LAST},
    [2] = {1, 1, 0, 1, REDUCE_SCATTER_EACH},
    [3] = {1, 1, 1, 0, REDUCE_SCATTER_EACH},
};

/* ---- the engine's parts, by concern ---- */

/* One unit operation of a micro-step: forward or backward of unit u, reading the
 * parameters of gather number g (params_sharded; -1: the embedding's own buffer or none). */
typedef struct unit_op {
    int backward;
    int unit;
    int gather;
} unit_op;

/* The schedule of one training micro-step: every forward, then every backward. */
typedef struct schedule {
    unit_op *ops;
    int n_ops;
    int *gather_unit; /* gather number -> unit (params_sharded) */
    int n_gathers;
} schedule;

/* A reduced gradient landed in its fp32 destination by the collective stream's worker
 * (a host task), so compute never waits for it. */
typedef struct accumulate_task {
    float *dst;
    const void *src;
    strata_dtype src_dtype; /* bf16 after a bf16 reduction (train.grad_reduce_dtype) */
    size_t n;
    int overwrite;
} accumulate_task;

/* Where a reduction lands (grads_sharded, or a bf16 reduction): on a device whose memory
 * the host cannot touch, a kernel on a device stream of its own (the collective stream may
 * be a HOST stream); elsewhere a host task on the collective stream, and stream is NULL. */
typedef struct landing {
    strata_stream *stream;
    strata_event *ev_reduced;
} landing;

/* grads_sharded: a non-embedding unit's full gradient goes into one of two buckets, so the
 * reduce-scatter of one overlaps the backward that fills the other; the embedding's (the
 * head's backward and its own add to it) has a bucket of its own for the micro-step. */
typedef struct grad_buckets {
    float *slot[2];
    strata_event *ev_slot_free[2];
    accumulate_task slot_task[2];
    int next;
    float *embed;
    strata_event *ev_embed_free;
    accumulate_task embed_task;
} grad_buckets;

/* train.grad_reduce_dtype bf16 (with several ranks): a unit's fp32 gradient is rounded into
 * one of two bf16 buffers on the compute stream, reduced in bf16 (half the bytes), and
 * converted back (or accumulated) into its fp32 destination after the collective. */
typedef struct bf16_reduction {
    int on;
    void *buf[2];
    strata_event *ev_free[2];
    accumulate_task task[2];
    int next;
} bf16_reduction;

/* params_sharded: units are all-gathered into a ring of slots, zero.prefetch_units ahead,
 * and released after use; the embedding (tied to the LM head) has a buffer of its own,
 * kept from its forward to the head's backward. An untied head reads no embedding, and the
 * embedding's backward reads no parameters, so its buffer is free once the embedding's
 * forward is done: the head is gathered there (head_in_embed), and the ring's slots are
 * sized for the blocks, not for a head as large as the vocabulary (a 14B model's: 778 M
 * parameters, 2.7 times a block). With offload.params: nvme each shard is first read into
 * a pinned buffer (one per slot, and the embedding's). */
typedef struct gather_ring {
    int n_slots; /* prefetch_units + 1 */
    void **slot;
    void *embed;
    int head_in_embed;
    strata_event **ev_gathered, **ev_free; /* per slot */
    strata_event *ev_embed_gathered, *ev_embed_free;
    int issued; /* gathers enqueued in this micro-step */
    int from_nvme;
    void **pin, *pin_embed;
    strata_event **ev_fetched, *ev_embed_fetched;
} gather_ring;

/* offload.gradients: cpu (one rank): the fp32 gradient of every unit the tier updates lives
 * in pinned host memory, and the device holds only the units in backward: a block's in one
 * of a ring of slots; the embedding's, which a tied head's backward starts and the
 * embedding's own backward ends, in a buffer of its own (an untied head's goes there
 * first: its backward is the first, the embedding's the last). After a unit's backward its
 * gradient is copied out on `out` (its sum of squares taken first, at the last
 * micro-step); at the step's next micro-step it is copied back in on `in`, a unit ahead,
 * and the backward adds to it in place: the sums and their order are those of a gradient
 * kept on the device, bit for bit. An 8B model's fp32 gradient is 30 GiB; the device
 * keeps a few blocks' of it. */
typedef struct host_grads {
    int on;
    float **host;             /* per unit the tier updates: pinned, padded[u] elements */
    int n_slots;              /* 2; 3 with grad_accum > 1 (one filling while one empties) */
    float **buf;              /* the n_slots slots, then the embedding's buffer [n_slots] */
    strata_event **ev_free;   /* per buffer: its copy out is done */
    strata_event **ev_filled; /* per buffer: its copy in is done */
    int *buf_of;              /* per unit: its buffer in this micro-step, -1 before its turn */
    unsigned char *readied;   /* per unit: its buffer zeroed or filled in this micro-step */
    int next;                 /* the slot handed out next */
    int head_in_embed;
    strata_stream *in, *out;  /* DEVICE streams */
    strata_event *ev_done;    /* on compute: a unit's backward (and sum of squares) is done */
    strata_event *ev_home;    /* on out: every copy out enqueued so far */
    uint64_t d2h_bytes, h2d_bytes; /* the current step's */
} host_grads;

/* The update tier (core/update_tier.h) and what ties its updates into the step. The
 * update of step s runs behind the forward of step s+1: each unit's forward waits only
 * for its own update. */
typedef struct offload_link {
    strata_update_tier *tier; /* NULL: the optimizer state is on the device */
    /* per unit: 1 when the tier holds its optimizer state; offload.optimizer_ratio below 1
     * keeps the first units' (in forward order) on the device, updated on the compute
     * stream, so the next forward starts on them while the tier works on the rest */
    unsigned char *held;
    strata_event **ev_update; /* per unit: its update is done */
    /* per unit: its updated parameters are in place for forward (gather_updates: after the
     * all-gather, on the collective stream; otherwise ev_update itself) */
    strata_event **ev_params_ready;
    /* gather_updates: unit u's updated shard still has to be all-gathered; issued just
     * before the unit's next forward (or by finish_updates), not at the step's end, since a
     * wait for a host stream's record may hold the enqueueing thread (core/cuda/device_cuda.cu) */
    unsigned char *gather_pending;
    double wait_ms; /* of the current step */
    /* the split: the tier's counters at the last step's update (taken after its sync),
     * and work since then that was no step's (eval's parameter reads) */
    strata_tier_stats seen, not_steps;
    int have_seen;
} offload_link;

/* The compute stream's busy time in a step (offload runs): timed events at the step's
 * start and end, and a pair around every place compute may stand waiting (a wait on
 * another stream, the host reading a batch or waiting for the tier): before the wait,
 * and after it once the next work is enqueued. busy = (end - start) - the pairs' time.
 * Events are recorded on compute only, so the device's own clock times them; they are
 * read after the step's one sync, so timing adds no sync. */
typedef struct compute_clock {
    int on;           /* timing the current step */
    int n_pairs, used;
    int untimed;      /* waits past n_pairs this step (their time is counted as busy) */
    strata_event *start, *end;
    strata_event **gap; /* 2 * n_pairs: [2i] before wait i, [2i+1] after it */
} compute_clock;

/* Test-only fault switches, read once when the engine is made: inject at optimizer step N
 * (counted from 1, as in the progress line; 0: never). */
typedef struct fault_switches {
    long long nan_step; /* STRATA_FAULT_NAN_STEP: this rank's loss is NaN */
    long long oom_step; /* STRATA_FAULT_OOM_STEP: a device out-of-memory is recorded */
    long long copy_step; /* STRATA_FAULT_COPY_STEP: the step's first device copy fails */
    long long hang_step; /* STRATA_FAULT_HANG_STEP: the step waits for a stream that never gets there */
} fault_switches;

struct strata_engine {
    const strata_config *cfg;
    strata_model *m;
    strata_device *dev;
    strata_comm *comm;
    strata_arena *arena;
    int rank, world, A, B, T, U;
    int overlap;        /* zero.overlap_comm */
    stage_facts z;      /* zero.stage */
    strata_dtype dtype; /* the compute dtype of parameters and activations */
    size_t es;          /* its bytes per element */

    /* The partition: unit u's flat buffer padded to padded[u] elements, rank r owning
     * [r * shard[u], (r + 1) * shard[u]). */
    size_t *padded, *shard;
    size_t max_block_padded; /* largest non-embedding unit */
    size_t max_opt_n;        /* largest optimizer range */

    /* Each unit's state where the stage keeps it (NULL where it keeps none). */
    void **params_full;             /* !params_sharded: full padded, compute dtype */
    void **params_shard;            /* params_sharded (NULL when the tier keeps them) */
    float **grads_full;             /* !grads_sharded: full padded fp32 */
    float **grad_acc;               /* grads_sharded: fp32 shard accumulators */
    /* The optimizer range, on the device (no tier), stored as optim.state says
     * (core/update_tier.h's STRATA_STATE_* arrays): the fp32 master; the moments fp32,
     * bf16 or 8-bit codes; with int8 each block's absmax and the small tensors' fp32
     * moments, packed (n_small[u] of them). */
    strata_optim_state state;
    float **master;
    void **mom1, **mom2;
    float **absmax1, **absmax2, **small1, **small2;
    size_t *n_small;

    schedule sched;
    landing land;
    grad_buckets bk;
    bf16_reduction red;
    gather_ring ring;
    host_grads hg;
    strata_acts_home *acts; /* offload.activations: cpu (NULL: every residual stream on the device) */
    offload_link off;
    compute_clock clock;
    fault_switches fault;
    strata_prof *prof; /* STRATA_PROFILE=kernels (strata_engine_profile_kernels), else NULL */
    strata_stop_query stop; /* strata_engine_set_stop; NULL: nothing asks the engine to stop */

    /* pinned (plan_io): the chunk every save, load, init and host-side publish moves
     * through; io_chunk elements, a multiple of 2 * strata_tier_io_align(state), so a chunk
     * and each of its halves (publish_params: fp32 in one, converted in the other) start on
     * the update tier's write boundaries */
    float *io_buf;
    size_t io_chunk;

    /* the step's own buffers and timings */
    strata_event *ev_compute;  /* "compute so far", for the collective stream to wait on */
    double *norm_part;         /* device: per unit, the rank's sum of its squared gradients */
    double *norm_host;         /* the same, read back; added in unit order */
    float *loss_sum_host;
    int32_t *inputs, *targets; /* host (B,T), in the arena */
    int32_t *positions;        /* host (B,T), in the arena: each input's position in its
                                  document, when the data marks documents (else NULL) */
    double comm_wait_ms, data_ms;
    uint64_t gather_h2d_bytes; /* of the current step (see strata_step_result) */
    strata_engine_memory mem;
};

/* ---- plan ---- */

static void reserve_kind(strata_engine *e, strata_mem_kind kind, strata_mem_category cat, const char *what, int u,
                         size_t bytes, void **dst) {
    char name[64];
    if (u >= 0) snprintf(name, sizeof name, "%s.%d", what, u);
    else snprintf(name, sizeof name, "%s", what);
    strata_arena_reserve(e->arena, kind, cat, name, bytes, dst);
    size_t *slot = cat == STRATA_CAT_PARAMS ? &e->mem.params : cat == STRATA_CAT_GRADS ? &e->mem.grads
                 : cat == STRATA_CAT_OPTIMIZER ? &e->mem.optimizer : cat == STRATA_CAT_ACTIVATIONS ? &e->mem.activations
                 : &e->mem.buffers;
    *slot += bytes;
}
static void reserve(strata_engine *e, strata_mem_category cat, const char *what, int u, size_t bytes, void **dst) {
    reserve_kind(e, STRATA_MEM_DEVICE, cat, what, u, bytes, dst);
}

/* Element range of unit u this rank's optimizer state covers. */
static size_t opt_lo(const strata_engine *e, int u) { return e->z.opt_sharded ? (size_t)e->rank * e->shard[u] : 0; }
static size_t opt_n(const strata_engine *e, int u) { return e->z.opt_sharded ? e->shard[u] : e->padded[u]; }

/* Whether the update tier holds unit u's optimizer state (else the device does). */
static int in_tier(const strata_engine *e, int u) { return e->off.tier && e->off.held[u]; }

/* Unit u's state array `kind` on the device (no tier). */
static void *dev_state(const strata_engine *e, int u, int kind) {
    switch (kind) {
    case STRATA_STATE_MASTER: return e->master[u];
    case STRATA_STATE_M: return e->mom1[u];
    case STRATA_STATE_V: return e->mom2[u];
    case STRATA_STATE_M_ABSMAX: return e->absmax1[u];
    case STRATA_STATE_V_ABSMAX: return e->absmax2[u];
    case STRATA_STATE_M_SMALL: return e->small1[u];
    default: return e->small2[u];
    }
}

/* Elements [lo, lo + n) of unit u's state array `kind` into the host buffer dst, from the
 * tier or the device; and back (the tier's write alignment applies: the callers move whole
 * chunks). Blocking: the buffer is reused next. */
static int state_get(strata_engine *e, int u, int kind, size_t lo, size_t n, void *dst) {
    if (!n) return 0;
    if (in_tier(e, u)) return e->off.tier->ops->read_state(e->off.tier, u, kind, lo, n, dst);
    size_t es = strata_state_elem_bytes(e->state, kind);
    STRATA_TRY(strata_memcpy_async(e->dev, e->dev->compute, dst, (char *)dev_state(e, u, kind) + lo * es, n * es));
    STRATA_TRY(strata_stream_sync(e->dev, e->dev->compute));
    return 0;
}
static int state_put(strata_engine *e, int u, int kind, size_t lo, size_t n, const void *src) {
    if (!n) return 0;
    if (in_tier(e, u)) return e->off.tier->ops->write_state(e->off.tier, u, kind, lo, n, src);
    size_t es = strata_state_elem_bytes(e->state, kind);
    STRATA_TRY(strata_memcpy_async(e->dev, e->dev->compute, (char *)dev_state(e, u, kind) + lo * es, src, n * es));
    STRATA_TRY(strata_stream_sync(e->dev, e->dev->compute));
    return 0;
}

/* Elements of state array `kind` of unit u's range. */
static size_t state_count(const strata_engine *e, int u, int kind) {
    if (kind <= STRATA_STATE_V) return opt_n(e, u);
    if (e->state != STRATA_OPTIM_STATE_INT8) return 0;
    if (kind == STRATA_STATE_M_ABSMAX || kind == STRATA_STATE_V_ABSMAX) return strata_q8_blocks(opt_n(e, u));
    return e->n_small[u];
}

/* offload.optimizer_ratio: the device keeps the first units' state, the tier the rest. */
static void split_optimizer(strata_engine *e) {
    double ratio = e->cfg->offload.optimizer_ratio;
    if (!(ratio > 0 && ratio <= 1)) ratio = 1; /* auto that no launcher resolved: all offloaded */
    size_t *n = strata_xcalloc(e->U, sizeof *n);
    for (int u = 0; u < e->U; u++) n[u] = opt_n(e, u);
    e->off.held = strata_xcalloc(e->U, 1);
    strata_split_units(n, e->U, 1.0 - ratio, e->off.held);
    free(n);
}

/* Phase 1: the facts of the stage, the dtype, the partition, the fault switches. */
static void set_up(strata_engine *e) {
    const strata_config *cfg = e->cfg;
    STRATA_ASSERT(cfg->zero.stage >= 0 && cfg->zero.stage <= 3); /* the config checked it */
    e->z = stage_table[cfg->zero.stage];
    /* one rank: a gradient shard is the whole gradient, so stages 2-3 keep it as stages
     * 0-1 do, accumulated in place by the backward, and skip the buckets that would only
     * copy it there (two blocks' and the embedding's fp32 gradient: 8.7 GiB of a 14B
     * model's device memory). The same sums as stage 0, in the same order. */
    if (e->world == 1 && e->z.grads_sharded) {
        e->z.grads_sharded = 0;
        e->z.reduce = REDUCE_SCATTER_AT_LAST;
    }
    e->A = cfg->train.grad_accum;
    e->B = cfg->train.micro_batch;
    e->T = strata_config_seq_len(cfg);
    e->U = e->m->n_units;
    e->overlap = cfg->zero.overlap_comm;
    /* a plan without a device uses the dtype the config would run with */
    int bf16 = cfg->device != STRATA_BACKEND_CPU &&
               (cfg->train.dtype == STRATA_DTYPE_BF16 ||
                (cfg->train.dtype == STRATA_DTYPE_AUTO && cfg->device == STRATA_BACKEND_CUDA));
    e->dtype = e->dev ? e->dev->compute_dtype : bf16 ? STRATA_BF16 : STRATA_F32;
    e->es = strata_dtype_size(e->dtype);
    e->padded = strata_xcalloc(e->U, sizeof *e->padded);
    e->shard = strata_xcalloc(e->U, sizeof *e->shard);
    e->state = cfg->optim.state;
    size_t align = e->state == STRATA_OPTIM_STATE_INT8 ? STRATA_Q8_BLOCK : PAD_ALIGN;
    for (int u = 0; u < e->U; u++) {
        e->padded[u] = strata_round_up(e->m->units[u].numel, (size_t)e->world * align);
        e->shard[u] = e->padded[u] / e->world;
        if (u > 0 && e->padded[u] > e->max_block_padded) e->max_block_padded = e->padded[u];
    }
    e->n_small = strata_xcalloc(e->U, sizeof *e->n_small);
    for (int u = 0; u < e->U; u++) {
        if (opt_n(e, u) > e->max_opt_n) e->max_opt_n = opt_n(e, u);
        e->n_small[u] = strata_adamw_small_count(e->m, u, opt_lo(e, u), opt_n(e, u), e->state);
    }
    const char *nan = getenv("STRATA_FAULT_NAN_STEP"), *oom = getenv("STRATA_FAULT_OOM_STEP"),
               *copy = getenv("STRATA_FAULT_COPY_STEP"), *hang = getenv("STRATA_FAULT_HANG_STEP");
    e->fault.nan_step = nan ? atoll(nan) : 0;
    e->fault.oom_step = oom ? atoll(oom) : 0;
    e->fault.copy_step = copy ? atoll(copy) : 0;
    e->fault.hang_step = hang ? atoll(hang) : 0;
}

/* Phase 2: each unit's parameters, gradients and optimizer state where the stage keeps
 * them; the update tier plans the optimizer state it holds. */
static void plan_state(strata_engine *e) {
    const strata_config *cfg = e->cfg;
    e->params_full = strata_xcalloc(e->U, sizeof(void *));
    e->params_shard = strata_xcalloc(e->U, sizeof(void *));
    e->grads_full = strata_xcalloc(e->U, sizeof(float *));
    e->grad_acc = strata_xcalloc(e->U, sizeof(float *));
    e->master = strata_xcalloc(e->U, sizeof(float *));
    e->mom1 = strata_xcalloc(e->U, sizeof(void *));
    e->mom2 = strata_xcalloc(e->U, sizeof(void *));
    e->absmax1 = strata_xcalloc(e->U, sizeof(float *));
    e->absmax2 = strata_xcalloc(e->U, sizeof(float *));
    e->small1 = strata_xcalloc(e->U, sizeof(float *));
    e->small2 = strata_xcalloc(e->U, sizeof(float *));
    size_t mb = strata_optim_moment_bytes(e->state);
    if (e->off.tier) split_optimizer(e);
    /* the caller checked the world (strata_config_check_world) */
    STRATA_ASSERT(cfg->offload.gradients == STRATA_OFFLOAD_NONE || e->world == 1);
    e->hg.on = cfg->offload.gradients == STRATA_OFFLOAD_CPU && e->off.tier;
    e->hg.host = strata_xcalloc(e->U, sizeof(float *));
    for (int u = 0; u < e->U; u++) {
        size_t P = e->padded[u], S = e->shard[u], n = opt_n(e, u);
        if (!e->z.params_sharded) reserve(e, STRATA_CAT_PARAMS, "params", u, P * e->es, &e->params_full[u]);
        else if (cfg->offload.params == STRATA_OFFLOAD_NVME) /* in the tier's file; counted as NVMe bytes */
            e->mem.params += S * e->es;
        else /* offload.params: cpu keeps the shards in pinned host memory; gathers read them there */
            reserve_kind(e, cfg->offload.params == STRATA_OFFLOAD_CPU ? STRATA_MEM_PINNED : STRATA_MEM_DEVICE,
                         STRATA_CAT_PARAMS, "params_shard", u, S * e->es, &e->params_shard[u]);
        if (e->hg.on && in_tier(e, u))
            reserve_kind(e, STRATA_MEM_PINNED, STRATA_CAT_GRADS, "grads_host", u, P * 4, (void **)&e->hg.host[u]);
        else if (!e->z.grads_sharded) reserve(e, STRATA_CAT_GRADS, "grads", u, P * 4, (void **)&e->grads_full[u]);
        else reserve(e, STRATA_CAT_GRADS, "grad_shard", u, S * 4, (void **)&e->grad_acc[u]);
        size_t nb = e->state == STRATA_OPTIM_STATE_INT8 ? strata_q8_blocks(n) : 0, ns = e->n_small[u];
        if (in_tier(e, u)) { /* held by this rank, in the tier's memory */
            e->mem.optimizer += n * 4 + 2 * n * mb + 2 * (nb + ns) * 4;
            continue;
        }
        reserve(e, STRATA_CAT_OPTIMIZER, "master", u, n * 4, (void **)&e->master[u]);
        reserve(e, STRATA_CAT_OPTIMIZER, "adam_m", u, n * mb, &e->mom1[u]);
        reserve(e, STRATA_CAT_OPTIMIZER, "adam_v", u, n * mb, &e->mom2[u]);
        if (nb) {
            reserve(e, STRATA_CAT_OPTIMIZER, "adam_m_absmax", u, nb * 4, (void **)&e->absmax1[u]);
            reserve(e, STRATA_CAT_OPTIMIZER, "adam_v_absmax", u, nb * 4, (void **)&e->absmax2[u]);
        }
        if (ns) {
            reserve(e, STRATA_CAT_OPTIMIZER, "adam_m_small", u, ns * 4, (void **)&e->small1[u]);
            reserve(e, STRATA_CAT_OPTIMIZER, "adam_v_small", u, ns * 4, (void **)&e->small2[u]);
        }
    }
    if (e->off.tier) {
        size_t *n = strata_xcalloc(e->U, sizeof *n);
        for (int u = 0; u < e->U; u++) n[u] = in_tier(e, u) ? opt_n(e, u) : 0; /* 0: not the tier's */
        e->off.tier->ops->plan(e->off.tier, e->arena, e->U, n, e->state == STRATA_OPTIM_STATE_INT8 ? e->n_small : NULL,
                               e->dtype);
        free(n);
        e->off.ev_update = strata_xcalloc(e->U, sizeof *e->off.ev_update);
        e->off.ev_params_ready = strata_xcalloc(e->U, sizeof *e->off.ev_params_ready);
        e->off.gather_pending = strata_xcalloc(e->U, 1);
    }
}

/* Phase 2b (offload.gradients: cpu): the device's buffers for the gradients of units in
 * backward (host_grads above). */
static void plan_grad_buffers(strata_engine *e) {
    host_grads *h = &e->hg;
    const int head = e->U - 1;
    if (!h->on) return;
    h->buf_of = strata_xcalloc(e->U, sizeof *h->buf_of);
    h->readied = strata_xcalloc(e->U, 1);
    h->head_in_embed = !e->m->shape.tie_embeddings && in_tier(e, 0) && in_tier(e, head);
    size_t slot_n = 0, embed_n = in_tier(e, 0) ? e->padded[0] : 0;
    for (int u = 1; u < e->U; u++) {
        if (!in_tier(e, u)) continue;
        if (u == head && h->head_in_embed) embed_n = e->padded[u] > embed_n ? e->padded[u] : embed_n;
        else slot_n = e->padded[u] > slot_n ? e->padded[u] : slot_n;
    }
    h->n_slots = e->A > 1 ? 3 : 2;
    h->buf = strata_xcalloc((size_t)h->n_slots + 1, sizeof *h->buf);
    for (int k = 0; k < h->n_slots && slot_n; k++)
        reserve(e, STRATA_CAT_GRADS, "grad_slot", k, slot_n * 4, (void **)&h->buf[k]);
    if (embed_n) reserve(e, STRATA_CAT_GRADS, "embed_grad", -1, embed_n * 4, (void **)&h->buf[h->n_slots]);
}

/* Phase 3: what the reductions need: the gradient buckets, the norm's workspace, the
 * bf16 buffers. */
static void plan_reduction(strata_engine *e) {
    const strata_config *cfg = e->cfg;
    if (e->z.grads_sharded) {
        for (int k = 0; k < 2; k++)
            reserve(e, STRATA_CAT_COMM, k ? "grad_slot.1" : "grad_slot.0", -1, e->max_block_padded * 4,
                    (void **)&e->bk.slot[k]);
        reserve(e, STRATA_CAT_COMM, "embed_grad", -1, e->padded[0] * 4, (void **)&e->bk.embed);
    }
    reserve(e, STRATA_CAT_WORKSPACE, "norm_part", -1, (size_t)e->U * sizeof(double), (void **)&e->norm_part);
    e->red.on = e->world > 1 && (cfg->train.grad_reduce_dtype == STRATA_DTYPE_BF16 ||
                                 (cfg->train.grad_reduce_dtype == STRATA_DTYPE_AUTO && e->dtype == STRATA_BF16));
    if (e->red.on) {
        size_t max_padded = 0;
        for (int u = 0; u < e->U; u++) max_padded = e->padded[u] > max_padded ? e->padded[u] : max_padded;
        for (int k = 0; k < 2; k++) reserve(e, STRATA_CAT_COMM, "reduce_bf16", k, max_padded * 2, &e->red.buf[k]);
    }
}

/* Phase 3b: the staging buffer of checkpoint and parameter I/O. Everything that moves
 * optimizer state between the host and wherever it lives, outside a step, goes through
 * it in chunks, so no save, load or init allocates in proportion to the model. */
static void plan_io(strata_engine *e) {
    const size_t align = 2 * strata_tier_io_align(e->state);
    size_t most = strata_round_up(e->max_opt_n, align); /* no chunk need be longer than a range */
    size_t cap = IO_STAGING_MAX_BYTES / sizeof(float) / align * align;
    /* test-only: a smaller cap, so small models cross chunk boundaries (read once, here) */
    const char *test_cap = getenv("STRATA_TEST_IO_CHUNK");
    if (test_cap && atoll(test_cap) > 0) cap = strata_round_up((size_t)atoll(test_cap), align);
    e->io_chunk = most < cap ? most : cap;
    reserve_kind(e, STRATA_MEM_PINNED, STRATA_CAT_CHECKPOINT, "checkpoint_io", -1, e->io_chunk * sizeof(float),
                 (void **)&e->io_buf);
}

/* Phase 4: the micro-step's schedule: the embedding, the blocks, the head forward; the
 * head, the blocks in reverse, the embedding backward. Under params_sharded each
 * operation but the embedding's reads one gather, numbered in schedule order. */
static void build_schedule(strata_engine *e) {
    schedule *s = &e->sched;
    int L = e->m->shape.n_layer, head = L + 1;
    s->ops = strata_xcalloc(2 * e->U, sizeof *s->ops);
    s->gather_unit = strata_xcalloc(2 * e->U, sizeof *s->gather_unit);
    int g = 0;
    s->ops[s->n_ops++] = (unit_op){0, 0, -1};
    for (int u = 1; u <= head; u++) {
        s->gather_unit[g] = u;
        s->ops[s->n_ops++] = (unit_op){0, u, g++};
    }
    s->ops[s->n_ops++] = (unit_op){1, head, g - 1}; /* the head's backward follows its forward */
    for (int u = L; u >= 1; u--) {
        s->gather_unit[g] = u;
        s->ops[s->n_ops++] = (unit_op){1, u, g++};
    }
    s->ops[s->n_ops++] = (unit_op){1, 0, -1}; /* the embedding's backward reads no parameters */
    s->n_gathers = g;
}

/* Phase 5 (params_sharded): the gather ring, and the pinned buffers shards are read into
 * when the tier keeps them on NVMe. */
static void plan_ring(strata_engine *e) {
    const strata_config *cfg = e->cfg;
    gather_ring *r = &e->ring;
    const int head = e->U - 1;
    r->head_in_embed = !e->m->shape.tie_embeddings;
    /* the ring holds the blocks (and a tied head, its final norm alone); the embedding's
     * buffer the embedding and an untied head */
    size_t slot_n = 0, slot_shard = 0, embed_n = e->padded[0], embed_shard = e->shard[0];
    for (int u = 1; u < e->U; u++) {
        if (u == head && r->head_in_embed) {
            embed_n = e->padded[u] > embed_n ? e->padded[u] : embed_n;
            embed_shard = e->shard[u] > embed_shard ? e->shard[u] : embed_shard;
            continue;
        }
        slot_n = e->padded[u] > slot_n ? e->padded[u] : slot_n;
        slot_shard = e->shard[u] > slot_shard ? e->shard[u] : slot_shard;
    }
    r->n_slots = cfg->zero.prefetch_units + 1;
    r->slot = strata_xcalloc(r->n_slots, sizeof(void *));
    for (int k = 0; k < r->n_slots; k++) reserve(e, STRATA_CAT_PREFETCH, "gather_slot", k, slot_n * e->es, &r->slot[k]);
    reserve(e, STRATA_CAT_PREFETCH, "embed_params", -1, embed_n * e->es, &r->embed);
    r->from_nvme = cfg->offload.params == STRATA_OFFLOAD_NVME;
    if (!r->from_nvme) return;
    r->pin = strata_xcalloc(r->n_slots, sizeof(void *));
    for (int k = 0; k < r->n_slots; k++)
        reserve_kind(e, STRATA_MEM_PINNED, STRATA_CAT_PREFETCH, "param_read", k,
                     strata_round_up(slot_shard * e->es, 4096), &r->pin[k]);
    reserve_kind(e, STRATA_MEM_PINNED, STRATA_CAT_PREFETCH, "param_read_embed", -1,
                 strata_round_up(embed_shard * e->es, 4096), &r->pin_embed);
}

/* Phase 6 (with a device): the streams and events each part meets the others through. */
static void make_events(strata_engine *e) {
    strata_device *dev = e->dev;
    if (!dev->caps.host_memory && (e->z.grads_sharded || e->red.on)) {
        e->land.stream = strata_stream_create(dev, "accumulate", STRATA_STREAM_DEVICE);
        e->land.ev_reduced = strata_event_create(dev);
    }
    e->ev_compute = strata_event_create(dev);
    if (e->z.grads_sharded) {
        for (int k = 0; k < 2; k++) e->bk.ev_slot_free[k] = strata_event_create(dev);
        e->bk.ev_embed_free = strata_event_create(dev);
    }
    for (int k = 0; k < 2 && e->red.on; k++) e->red.ev_free[k] = strata_event_create(dev);
    gather_ring *r = &e->ring;
    if (e->z.params_sharded) {
        r->ev_gathered = strata_xcalloc(r->n_slots, sizeof *r->ev_gathered);
        r->ev_free = strata_xcalloc(r->n_slots, sizeof *r->ev_free);
        for (int k = 0; k < r->n_slots; k++) {
            r->ev_gathered[k] = strata_event_create(dev);
            r->ev_free[k] = strata_event_create(dev);
        }
        r->ev_embed_gathered = strata_event_create(dev);
        r->ev_embed_free = strata_event_create(dev);
        if (r->from_nvme) {
            r->ev_fetched = strata_xcalloc(r->n_slots, sizeof *r->ev_fetched);
            for (int k = 0; k < r->n_slots; k++) r->ev_fetched[k] = strata_event_create(dev);
            r->ev_embed_fetched = strata_event_create(dev);
        }
    }
    for (int u = 0; u < e->U && e->off.tier; u++) {
        e->off.ev_update[u] = strata_event_create(dev);
        e->off.ev_params_ready[u] = e->z.gather_updates ? strata_event_create(dev) : e->off.ev_update[u];
    }
    host_grads *h = &e->hg;
    if (h->on) {
        h->in = strata_stream_create(dev, "grads-in", STRATA_STREAM_DEVICE);
        h->out = strata_stream_create(dev, "grads-out", STRATA_STREAM_DEVICE);
        h->ev_free = strata_xcalloc((size_t)h->n_slots + 1, sizeof *h->ev_free);
        h->ev_filled = strata_xcalloc((size_t)h->n_slots + 1, sizeof *h->ev_filled);
        for (int k = 0; k <= h->n_slots; k++) {
            h->ev_free[k] = strata_event_create(dev);
            h->ev_filled[k] = strata_event_create(dev);
        }
        h->ev_done = strata_event_create(dev);
        h->ev_home = strata_event_create(dev);
    }
    if (e->acts) strata_acts_home_open(e->acts, dev);
    if (e->off.tier) { /* the split's clock: a pair for each wait a micro-step can make (see run_micro_step) */
        compute_clock *c = &e->clock;
        c->n_pairs = e->A * (4 + 6 * e->sched.n_ops) + 8;
        c->start = strata_event_create_timed(dev);
        c->end = strata_event_create_timed(dev);
        c->gap = strata_xcalloc(2 * (size_t)c->n_pairs, sizeof *c->gap);
        for (int i = 0; i < 2 * c->n_pairs; i++) c->gap[i] = strata_event_create_timed(dev);
    }
}

strata_engine *strata_engine_create(const strata_config *cfg, strata_model *m, strata_arena *arena,
                                    strata_device *dev, strata_comm *comm, strata_update_tier *tier, int rank,
                                    int world) {
    strata_engine *e = strata_xcalloc(1, sizeof *e);
    e->cfg = cfg;
    e->m = m;
    e->dev = dev;
    e->comm = comm;
    e->arena = arena;
    e->off.tier = tier;
    e->rank = rank;
    e->world = world;
    set_up(e);
    plan_state(e);
    plan_grad_buffers(e);
    plan_reduction(e);
    plan_io(e);
    build_schedule(e);
    if (e->z.params_sharded) plan_ring(e);
    size_t before = strata_arena_bytes(arena, -1, STRATA_CAT_ACTIVATIONS);
    int acts_home = cfg->offload.activations != STRATA_OFFLOAD_NONE;
    int documents = cfg->data.document_mask &&
                    (strata_shards_mark_documents(cfg->data.train) || strata_shards_mark_documents(cfg->data.val));
    strata_model_plan_opts mo = {.ckpt_every = cfg->train.activation_checkpointing,
                                 .logits_chunk_bytes = (size_t)cfg->train.logits_chunk_mb << 20,
                                 .mlp_chunk_bytes = (size_t)cfg->train.mlp_chunk_mb << 20,
                                 .resid_slots = acts_home ? STRATA_ACTS_HOME_SLOTS : 0,
                                 .documents = documents};
    strata_model_plan(m, arena, dev, e->dtype, e->B, e->T, &mo);
    if (acts_home) e->acts = strata_acts_home_plan(m, arena, e->es);
    e->mem.activations = strata_arena_bytes(arena, -1, STRATA_CAT_ACTIVATIONS) - before;
    if (dev) make_events(e);
    e->loss_sum_host = strata_xcalloc(1, sizeof(float));
    e->norm_host = strata_xcalloc(e->U, sizeof(double));
    /* the host side of a micro-batch (B,T): part of the plan, allocated at commit, so a
     * batch too large for the machine is a verdict, never an abort */
    size_t batch_bytes = (size_t)e->B * e->T * sizeof(int32_t);
    strata_arena_reserve(arena, STRATA_MEM_HOST, STRATA_CAT_ACTIVATIONS, "batch.inputs", batch_bytes, (void **)&e->inputs);
    strata_arena_reserve(arena, STRATA_MEM_HOST, STRATA_CAT_ACTIVATIONS, "batch.targets", batch_bytes, (void **)&e->targets);
    if (documents)
        strata_arena_reserve(arena, STRATA_MEM_HOST, STRATA_CAT_ACTIVATIONS, "batch.positions", batch_bytes,
                             (void **)&e->positions);
    return e;
}

static void destroy_events(strata_engine *e) {
    strata_device *d = e->dev;
    strata_event_destroy(d, e->land.ev_reduced);
    strata_stream_destroy(d, e->land.stream);
    strata_event_destroy(d, e->ev_compute);
    for (int k = 0; k < 2; k++) {
        strata_event_destroy(d, e->bk.ev_slot_free[k]);
        strata_event_destroy(d, e->red.ev_free[k]);
    }
    strata_event_destroy(d, e->bk.ev_embed_free);
    gather_ring *r = &e->ring;
    for (int k = 0; k < r->n_slots && r->ev_gathered; k++) {
        strata_event_destroy(d, r->ev_gathered[k]);
        strata_event_destroy(d, r->ev_free[k]);
        if (r->ev_fetched) strata_event_destroy(d, r->ev_fetched[k]);
    }
    strata_event_destroy(d, r->ev_embed_gathered);
    strata_event_destroy(d, r->ev_embed_free);
    strata_event_destroy(d, r->ev_embed_fetched);
    for (int u = 0; u < e->U && e->off.ev_update; u++) {
        if (e->off.ev_params_ready[u] != e->off.ev_update[u]) strata_event_destroy(d, e->off.ev_params_ready[u]);
        strata_event_destroy(d, e->off.ev_update[u]);
    }
    host_grads *h = &e->hg;
    for (int k = 0; h->ev_free && k <= h->n_slots; k++) {
        strata_event_destroy(d, h->ev_free[k]);
        strata_event_destroy(d, h->ev_filled[k]);
    }
    strata_event_destroy(d, h->ev_done);
    strata_event_destroy(d, h->ev_home);
    strata_stream_destroy(d, h->in);
    strata_stream_destroy(d, h->out);
    compute_clock *c = &e->clock;
    strata_event_destroy(d, c->start);
    strata_event_destroy(d, c->end);
    for (int i = 0; i < 2 * c->n_pairs && c->gap; i++) strata_event_destroy(d, c->gap[i]);
    free(c->gap);
}

void strata_engine_destroy(strata_engine *e) {
    if (!e) return;
    if (e->dev) {
        STRATA_IGNORE(e->dev->ops->sync_all(e->dev)); /* tearing down goes on */
        destroy_events(e);
    }
    strata_prof_destroy(e->prof);
    strata_acts_home_free(e->acts);
    if (e->off.tier) e->off.tier->ops->destroy(e->off.tier);
    free(e->off.ev_update);
    free(e->off.held);
    free(e->off.ev_params_ready);
    free(e->off.gather_pending);
    free(e->ring.slot);
    free(e->ring.pin);
    free(e->ring.ev_gathered);
    free(e->ring.ev_free);
    free(e->ring.ev_fetched);
    free(e->sched.ops);
    free(e->sched.gather_unit);
    free(e->padded);
    free(e->shard);
    free(e->params_full);
    free(e->params_shard);
    free(e->grads_full);
    free(e->grad_acc);
    free(e->master);
    free(e->mom1);
    free(e->mom2);
    free(e->absmax1);
    free(e->absmax2);
    free(e->small1);
    free(e->small2);
    free(e->n_small);
    free(e->loss_sum_host);
    free(e->norm_host);
    free(e->hg.host);
    free(e->hg.buf);
    free(e->hg.buf_of);
    free(e->hg.readied);
    free(e->hg.ev_free);
    free(e->hg.ev_filled);
    free(e);
}

strata_engine_memory strata_engine_get_memory(const strata_engine *e) { return e->mem; }
const size_t *strata_engine_padded(const strata_engine *e) { return e->padded; }

/* ---- small helpers ---- */

static strata_stream *comm_stream(strata_engine *e) { return strata_comm_stream(e->comm); }

/* ---- the compute clock (compute_clock above) ---- */

/* Before a place compute may stand waiting: the pair's index, or -1 when not timing. */
static int stall_begin(strata_engine *e) {
    compute_clock *c = &e->clock;
    if (!c->on) return -1;
    if (c->used == c->n_pairs) {
        c->untimed++;
        return -1;
    }
    STRATA_IGNORE(strata_event_record(e->dev, c->gap[2 * c->used], e->dev->compute)); /* timing only */
    return c->used++;
}

static void stall_end(strata_engine *e, int i) {
    if (i >= 0) STRATA_IGNORE(strata_event_record(e->dev, e->clock.gap[2 * i + 1], e->dev->compute)); /* timing only */
}

static void clock_start(strata_engine *e) {
    compute_clock *c = &e->clock;
    if (!c->n_pairs) return;
    c->on = 1;
    c->used = c->untimed = 0;
    STRATA_IGNORE(strata_event_record(e->dev, c->start, e->dev->compute)); /* timing only */
}

static void clock_stop(strata_engine *e) {
    if (!e->clock.on) return;
    STRATA_IGNORE(strata_event_record(e->dev, e->clock.end, e->dev->compute)); /* timing only */
    e->clock.on = 0;
}

/* After the compute stream's sync: the step's busy ms (0 when not timed or not readable). */
static double clock_busy_ms(strata_engine *e, int *untimed) {
    compute_clock *c = &e->clock;
    *untimed = c->untimed;
    double span = 0, gap = 0;
    if (!c->n_pairs || strata_event_elapsed_ms(e->dev, c->start, c->end, &span)) return 0;
    for (int i = 0; i < c->used; i++) {
        double ms;
        if (strata_event_elapsed_ms(e->dev, c->gap[2 * i], c->gap[2 * i + 1], &ms)) return 0;
        gap += ms;
    }
    return span - gap;
}

/* Compute waiting for the collective stream: timed, so a step's metrics show how long
 * compute sat idle on communication. */

/* Compute waiting for `ev`, recorded on `what`, the host's time added to *waited. */
static int compute_wait_on(strata_engine *e, strata_event *ev, double *waited, const char *what) {
    int stall = stall_begin(e), call = strata_prof_begin(e->m->prof, STRATA_PROF_COMM_WAIT);
    double t0 = strata_now_ms();
    int rc = strata_stream_wait_event(e->dev, e->dev->compute, ev);
    *waited += strata_now_ms() - t0;
    strata_prof_end(e->m->prof, call);
    stall_end(e, stall);
    if (rc) return strata_fail_wrap("compute waiting for %s", what);
    return 0;
}
static int compute_wait(strata_engine *e, strata_event *ev) {
    return compute_wait_on(e, ev, &e->comm_wait_ms, "the collective stream");
}
static int comm_sync(strata_engine *e) {
    int call = strata_prof_begin(e->m->prof, STRATA_PROF_COMM_WAIT);
    double t0 = strata_now_ms();
    int rc = strata_stream_sync(e->dev, comm_stream(e));
    if (!rc && e->land.stream) rc = strata_stream_sync(e->dev, e->land.stream);
    e->comm_wait_ms += strata_now_ms() - t0;
    strata_prof_end(e->m->prof, call);
    if (rc) return strata_fail_wrap("waiting for the collective stream");
    return 0;
}

/* Makes the collective stream wait for everything enqueued on compute so far. */
static int comm_after_compute(strata_engine *e) {
    STRATA_TRY(strata_event_record(e->dev, e->ev_compute, e->dev->compute));
    STRATA_TRY(strata_stream_wait_event(e->dev, comm_stream(e), e->ev_compute));
    return 0;
}

/* Without overlap, each collective completes before compute goes on (the baseline the
 * overlap benchmark compares against). */
static int maybe_serialize(strata_engine *e) { return e->overlap ? 0 : comm_sync(e); }

/* Where this rank's optimizer range of unit u puts its parameters (compute dtype). */
static void *param_dest(strata_engine *e, int u) {
    if (e->z.params_sharded) return e->params_shard[u]; /* NULL when the tier keeps the shards */
    return (char *)e->params_full[u] + opt_lo(e, u) * e->es;
}

/* Whether unit u's gradient lives in host memory between backward passes (host_grads). */
static int grads_home(const strata_engine *e, int u) { return e->hg.on && in_tier(e, u); }

/* The reduced gradient of this rank's optimizer range of unit u. */
static float *opt_grad(strata_engine *e, int u) {
    if (grads_home(e, u)) return e->hg.host[u] + opt_lo(e, u);
    return e->z.grads_sharded ? e->grad_acc[u] : e->grads_full[u] + opt_lo(e, u);
}

/* ---- reductions ---- */

static void accumulate_run(void *arg) {
    accumulate_task *t = arg;
    if (t->overwrite) strata_kernels_cpu.convert(NULL, t->dst, STRATA_F32, t->src, t->src_dtype, t->n);
    else strata_kernels_cpu.accumulate_f32(NULL, t->dst, t->src, t->src_dtype, t->n);
}

/* After a collective enqueued on the collective stream: dst (fp32, n) = or += src (of
 * src_dtype), off the compute stream (see `landing`); `done` is recorded after it. */
static int land_reduced(strata_engine *e, float *dst, const void *src, strata_dtype src_dtype, size_t n, int overwrite,
                        accumulate_task *task, strata_event *done) {
    if (e->land.stream) {
        STRATA_TRY(strata_event_record(e->dev, e->land.ev_reduced, comm_stream(e)));
        STRATA_TRY(strata_stream_wait_event(e->dev, e->land.stream, e->land.ev_reduced));
        if (overwrite) e->dev->k->convert(e->land.stream, dst, STRATA_F32, src, src_dtype, n);
        else e->dev->k->accumulate_f32(e->land.stream, dst, src, src_dtype, n);
        STRATA_TRY(strata_event_record(e->dev, done, e->land.stream));
        return 0;
    }
    *task = (accumulate_task){dst, src, src_dtype, n, overwrite};
    STRATA_TRY(strata_host_task(e->dev, comm_stream(e), accumulate_run, task));
    STRATA_TRY(strata_event_record(e->dev, done, comm_stream(e)));
    return 0;
}

/* train.grad_reduce_dtype bf16: unit u's fp32 gradient `full` (padded elements) reduced in
 * bf16, the result landed in dst: all-reduce (all == 1: every element, into dst = full) or
 * reduce-scatter (this rank's block, into dst, overwritten or accumulated). The fp32
 * gradient is free once converted, so `full_free` is recorded on compute right then. */
static int reduce_unit_bf16(strata_engine *e, int u, const float *full, int all, float *dst, int overwrite,
                            strata_event *full_free) {
    strata_device *d = e->dev;
    bf16_reduction *red = &e->red;
    int k = red->next;
    red->next ^= 1;
    size_t P = e->padded[u], S = e->shard[u];
    if (compute_wait(e, red->ev_free[k])) return -1;
    d->k->convert(d->compute, red->buf[k], STRATA_BF16, full, STRATA_F32, P);
    if (full_free) STRATA_TRY(strata_event_record(d, full_free, d->compute));
    if (comm_after_compute(e)) return -1;
    const uint16_t *mine = (const uint16_t *)red->buf[k] + (all ? 0 : (size_t)e->rank * S);
    int rc = all ? strata_allreduce_bf16(e->comm, red->buf[k], P)
                 : strata_reduce_scatter_bf16(e->comm, (void *)mine, red->buf[k], S);
    if (rc || land_reduced(e, dst, mine, STRATA_BF16, all ? P : S, overwrite, &red->task[k], red->ev_free[k]))
        return -1;
    return maybe_serialize(e);
}

/* REDUCE_SCATTER_EACH: reduce-scatters unit u's full gradient in bucket `full` in place
 * and adds this rank's block into the shard accumulator (overwrites it at the first
 * micro-step), all on the collective stream; `done` is recorded after. */
static int reduce_unit_grad(strata_engine *e, int u, float *full, accumulate_task *task, int first_micro,
                            strata_event *done) {
    if (e->red.on) return reduce_unit_bf16(e, u, full, 0, e->grad_acc[u], first_micro, done);
    if (comm_after_compute(e)) return -1;
    float *mine = full + (size_t)e->rank * e->shard[u];
    if (strata_reduce_scatter(e->comm, mine, full, e->shard[u])) return -1;
    if (land_reduced(e, e->grad_acc[u], mine, STRATA_F32, e->shard[u], first_micro, task, done)) return -1;
    return maybe_serialize(e);
}

/* ---- gradients in host memory (host_grads) ---- */

/* Unit u's device buffer in this micro-step, handed out at its first use: the embedding's
 * for the embedding and an untied head, else the next slot of the ring. At a micro-step
 * after the first, the gradient so far is copied in on `in` once the buffer's last copy
 * out is done (the micro-step's start made `in` wait for the last micro-step's copies). */
static int grad_buffer(strata_engine *e, int u, int micro) {
    host_grads *h = &e->hg;
    if (h->buf_of[u] >= 0) return h->buf_of[u];
    int b = u == 0 || (u == e->U - 1 && h->head_in_embed) ? h->n_slots : h->next++ % h->n_slots;
    h->buf_of[u] = b;
    if (micro > 0) {
        size_t bytes = e->padded[u] * sizeof(float);
        if (strata_stream_wait_event(e->dev, h->in, h->ev_free[b]) ||
            strata_memcpy_async(e->dev, h->in, h->buf[b], h->host[u], bytes) ||
            strata_event_record(e->dev, h->ev_filled[b], h->in))
            return -1;
        h->h2d_bytes += bytes;
    }
    return b;
}

/* Unit u's buffer ready for the backward to add to, once a micro-step (a tied model's
 * embedding is readied for the head's backward and added to again by its own): zeroed at
 * the first micro-step (once its last copy out is done), else filled; m->grads[u] points
 * at it. */
static int ready_home_grad(strata_engine *e, int u, int micro) {
    host_grads *h = &e->hg;
    int b = grad_buffer(e, u, micro);
    if (b < 0) return -1;
    e->m->grads[u] = h->buf[b];
    if (h->readied[u]) return 0;
    h->readied[u] = 1;
    /* a wait on the gradient copies is the offload's, not the collectives' */
    if (compute_wait_on(e, micro == 0 ? h->ev_free[b] : h->ev_filled[b], &e->off.wait_ms, "a gradient copy"))
        return -1;
    if (micro == 0) STRATA_TRY(strata_memset_async(e->dev, e->dev->compute, h->buf[b], 0, e->padded[u] * sizeof(float)));
    return 0;
}

/* The gradient buffers of unit u's backward: its own, and at the head of a tied model the
 * embedding's, which the head's backward adds to first. At a later micro-step the next
 * unit's gradient starts coming in while this backward runs. */
static int home_grads_for(strata_engine *e, int u, int micro) {
    const int head = e->U - 1;
    if (!grads_home(e, u)) e->m->grads[u] = e->grads_full[u];
    else if (ready_home_grad(e, u, micro)) return -1;
    if (u == head && e->m->shape.tie_embeddings && grads_home(e, 0) && ready_home_grad(e, 0, micro)) return -1;
    int next = u == head ? head - 1 : u - 1; /* the backward goes head, blocks down, embedding */
    if (micro > 0 && next >= 0 && grads_home(e, next) && grad_buffer(e, next, micro) < 0) return -1;
    return 0;
}

/* After unit u's backward: at the last micro-step its sum of squares (from the buffer,
 * as the step's end takes the others'), then the copy out, after which the buffer is free. */
static int send_home(strata_engine *e, int u, int micro) {
    host_grads *h = &e->hg;
    strata_device *d = e->dev;
    int b = h->buf_of[u];
    size_t bytes = e->padded[u] * sizeof(float);
    if (micro == e->A - 1) d->k->sumsq(d->compute, e->norm_part + u, h->buf[b], e->padded[u]);
    STRATA_TRY(strata_event_record(d, h->ev_done, d->compute));
    STRATA_TRY(strata_stream_wait_event(d, h->out, h->ev_done));
    STRATA_TRY(strata_memcpy_async(d, h->out, h->host[u], h->buf[b], bytes));
    STRATA_TRY(strata_event_record(d, h->ev_free[b], h->out));
    h->d2h_bytes += bytes;
    return 0;
}

/* A micro-step's start: no unit has its buffer yet; after the first, the copies in wait
 * for the last micro-step's copies out, and the head's gradient (with a tied embedding's,
 * which the head's backward adds to) comes in behind the forward rather than before the
 * first backward. */
static int host_grads_begin(strata_engine *e, int micro) {
    host_grads *h = &e->hg;
    const int head = e->U - 1;
    for (int u = 0; u < e->U; u++) h->buf_of[u] = -1, h->readied[u] = 0;
    if (micro == 0) return 0;
    STRATA_TRY(strata_stream_wait_event(e->dev, h->in, h->ev_home));
    if (grads_home(e, head) && grad_buffer(e, head, micro) < 0) return -1;
    if (e->m->shape.tie_embeddings && grads_home(e, 0) && grad_buffer(e, 0, micro) < 0) return -1;
    return 0;
}

/* Unit u's gradient leaves the rank after its backward of micro-step `micro`, as the
 * stage's reduce kind says (or, kept in host memory, goes there). */
static int after_backward(strata_engine *e, int u, int micro) {
    if (grads_home(e, u)) return send_home(e, u, micro);
    int last = micro == e->A - 1;
    switch (e->z.reduce) {
    case REDUCE_ALL_AT_LAST:
        if (!last) return 0;
        if (e->red.on) return reduce_unit_bf16(e, u, e->grads_full[u], 1, e->grads_full[u], 1, NULL);
        if (comm_after_compute(e) || strata_allreduce(e->comm, e->grads_full[u], e->padded[u])) return -1;
        return maybe_serialize(e);
    case REDUCE_SCATTER_AT_LAST: {
        if (!last) return 0;
        float *mine = e->grads_full[u] + (size_t)e->rank * e->shard[u];
        if (e->red.on) return reduce_unit_bf16(e, u, e->grads_full[u], 0, mine, 1, NULL);
        if (comm_after_compute(e) || strata_reduce_scatter(e->comm, mine, e->grads_full[u], e->shard[u])) return -1;
        return maybe_serialize(e);
    }
    case REDUCE_SCATTER_EACH:
        break;
    }
    grad_buckets *bk = &e->bk;
    if (u == 0) return reduce_unit_grad(e, 0, bk->embed, &bk->embed_task, micro == 0, bk->ev_embed_free);
    int k = bk->next;
    bk->next ^= 1;
    return reduce_unit_grad(e, u, bk->slot[k], &bk->slot_task[k], micro == 0, bk->ev_slot_free[k]);
}

/* ---- the update tier ---- */

static int tier_open(strata_engine *e) { return e->off.tier ? e->off.tier->ops->open(e->off.tier) : 0; }

/* gather_updates: the all-gather of unit u's updated shard, once its update is done. */
static int gather_updated(strata_engine *e, int u) {
    if (!e->off.gather_pending || !e->off.gather_pending[u]) return 0;
    e->off.gather_pending[u] = 0;
    STRATA_TRY(strata_stream_wait_event(e->dev, comm_stream(e), e->off.ev_update[u]));
    if (strata_allgather(e->comm, e->params_full[u], param_dest(e, u), e->shard[u] * e->es)) return -1;
    STRATA_TRY(strata_event_record(e->dev, e->off.ev_params_ready[u], comm_stream(e)));
    return 0;
}

/* The tier's update of the last step runs behind the next step's forward (each unit's
 * forward waits for its own update); whatever reads the optimizer state or the
 * parameters from the host side (eval, checkpoints, sampling) waits for all of it here,
 * and an error any update hit surfaces here. */
static int finish_updates(strata_engine *e) {
    if (!e->off.tier || !e->dev) return 0;
    double t0 = strata_now_ms();
    int rc = 0;
    for (int u = 0; u < e->U && !rc; u++) rc = gather_updated(e, u);
    if (e->off.tier->ops->sync(e->off.tier)) rc = -1;
    if (comm_sync(e)) rc = -1;
    e->off.wait_ms += strata_now_ms() - t0;
    return rc;
}

/* Compute waiting for unit u's update (and its all-gather), timed apart from waits on
 * collectives. */
static int wait_params_ready(strata_engine *e, int u) {
    double t0 = strata_now_ms();
    int rc = strata_stream_wait_event(e->dev, e->dev->compute, e->off.ev_params_ready[u]);
    e->off.wait_ms += strata_now_ms() - t0;
    if (rc) return strata_fail_wrap("compute waiting for unit %d's updated parameters", u);
    return 0;
}

/* ---- parameters ---- */

/* Unit u's master weights in the tier's memory, converted on the host a chunk at a time
 * (the staging buffer's first half holds fp32, its second the compute dtype) and copied
 * to where forward reads them, or written back to the tier (offload.params: nvme). */
static int publish_from_tier(strata_engine *e, int u) {
    strata_update_tier *tier = e->off.tier;
    size_t half = e->io_chunk / 2, n = opt_n(e, u);
    float *host = e->io_buf;
    void *conv = e->io_buf + half;
    for (size_t c = 0; c < n; c += half) {
        size_t len = n - c < half ? n - c : half;
        if (tier->ops->read_state(tier, u, STRATA_STATE_MASTER, c, len, host)) return -1;
        strata_kernels_cpu.convert(NULL, conv, e->dtype, host, STRATA_F32, len);
        if (e->ring.from_nvme) {
            if (tier->ops->write_params(tier, u, c, len, conv)) return -1;
            continue;
        }
        STRATA_TRY(strata_memcpy_async(e->dev, e->dev->compute, (char *)param_dest(e, u) + c * e->es, conv, len * e->es));
        STRATA_TRY(strata_stream_sync(e->dev, e->dev->compute)); /* the buffer is reused next chunk */
    }
    return 0;
}

/* Publishes the master weights as the compute-dtype parameters forward reads: convert
 * this rank's part, then (gather_updates) all-gather the full buffers. */
static int publish_params(strata_engine *e) {
    for (int u = 0; u < e->U; u++) {
        if (!in_tier(e, u))
            e->dev->k->convert(e->dev->compute, param_dest(e, u), e->dtype, e->master[u], STRATA_F32, opt_n(e, u));
        else if (publish_from_tier(e, u))
            return -1;
        if (e->z.gather_updates &&
            (comm_after_compute(e) || strata_allgather(e->comm, e->params_full[u], param_dest(e, u), e->shard[u] * e->es)))
            return -1;
    }
    STRATA_TRY(strata_stream_sync(e->dev, comm_stream(e)));
    return 0;
}

/* The seeded random init as a parameter source. */
static int seeded_init(void *ctx, const strata_model *m, int u, size_t lo, size_t hi, float *dst) {
    strata_model_init_params(m, u, *(const uint64_t *)ctx, lo, hi, dst);
    return 0;
}

int strata_engine_init_params(strata_engine *e, uint64_t seed) { return strata_engine_init_from(e, seeded_init, &seed); }

/* The byte every element of moment array `kind` starts as: 0, but the signed map's code of
 * zero for int8's first moment. */
static int zero_byte(const strata_engine *e, int kind) {
    return e->state == STRATA_OPTIM_STATE_INT8 && kind == STRATA_STATE_M ? STRATA_Q8_ZERO_SIGNED : 0;
}

/* int8 state: the absmax and packed fp32 moments of unit u's range (in the tier's memory)
 * zeroed a chunk at a time. */
static int zero_small_state(strata_engine *e, int u) {
    memset(e->io_buf, 0, e->io_chunk * sizeof(float));
    for (int k = STRATA_STATE_M_ABSMAX; k < STRATA_STATE_KINDS; k++)
        for (size_t c = 0, n = state_count(e, u, k); c < n; c += e->io_chunk)
            if (state_put(e, u, k, c, n - c < e->io_chunk ? n - c : e->io_chunk, e->io_buf)) return -1;
    return 0;
}

/* Unit u's initial state from `source`, a chunk at a time through the staging buffer:
 * the master weights as the source gives them, Adam's moments zero. */
static int init_unit(strata_engine *e, int u, strata_param_source source, void *ctx) {
    strata_update_tier *tier = e->off.tier;
    size_t lo = opt_lo(e, u), n = opt_n(e, u), mb = strata_optim_moment_bytes(e->state);
    float *host = e->io_buf;
    if (!in_tier(e, u)) {
        STRATA_TRY(strata_memset_async(e->dev, e->dev->compute, e->mom1[u], zero_byte(e, STRATA_STATE_M), n * mb));
        STRATA_TRY(strata_memset_async(e->dev, e->dev->compute, e->mom2[u], 0, n * mb));
        for (int k = STRATA_STATE_M_ABSMAX; k < STRATA_STATE_KINDS; k++)
            if (state_count(e, u, k))
                STRATA_TRY(strata_memset_async(e->dev, e->dev->compute, dev_state(e, u, k), 0, state_count(e, u, k) * 4));
    } else if (e->state == STRATA_OPTIM_STATE_INT8 && zero_small_state(e, u)) {
        return -1;
    }
    for (size_t c = 0; c < n; c += e->io_chunk) {
        size_t len = n - c < e->io_chunk ? n - c : e->io_chunk;
        if (source(ctx, e->m, u, lo + c, lo + c + len, host)) return -1; /* its message names the source */
        if (in_tier(e, u)) {
            if (tier->ops->write_state(tier, u, STRATA_STATE_MASTER, c, len, host)) return -1;
            for (int k = STRATA_STATE_M; k <= STRATA_STATE_V; k++) {
                memset(host, zero_byte(e, k), len * mb);
                if (tier->ops->write_state(tier, u, k, c, len, host)) return -1;
            }
            continue;
        }
        STRATA_TRY(strata_memcpy_async(e->dev, e->dev->compute, e->master[u] + c, host, len * 4));
        STRATA_TRY(strata_stream_sync(e->dev, e->dev->compute)); /* the buffer is reused next chunk */
    }
    return 0;
}

int strata_engine_init_from(strata_engine *e, strata_param_source source, void *ctx) {
    int rc = tier_open(e);
    for (int u = 0; u < e->U && !rc; u++) rc = init_unit(e, u, source, ctx);
    /* a source may fail on one rank only (its shard's file): every rank stops together */
    double failed = rc != 0;
    char err[1024];
    snprintf(err, sizeof err, "%s", rc ? strata_error() : "");
    if (strata_allreduce_host_f64(e->comm, &failed, 1)) return -1;
    if (failed) return strata_fail("%s", rc ? err : "another rank could not initialise its parameters");
    return publish_params(e);
}

/* ---- the gather ring (params_sharded) ---- */

/* All-gathers unit u's shard into dst on the collective stream once dst's last reader is
 * done (dst_free) and so is the unit's update by the tier, then records gathered. When
 * the tier keeps the shards on NVMe, the shard is first read into the pinned buffer `pin`
 * (named by `tag`) on the tier's param stream; pin is free once its last gather,
 * `gathered`'s previous record, is done. */
static int gather_shard(strata_engine *e, int u, void *dst, strata_event *dst_free, void *pin, int tag,
                        strata_event *fetched, strata_event *gathered) {
    strata_device *d = e->dev;
    strata_update_tier *tier = e->off.tier;
    STRATA_TRY(strata_stream_wait_event(d, comm_stream(e), dst_free));
    const void *shard = e->params_shard[u];
    if (e->ring.from_nvme) {
        strata_stream *ps = tier->ops->param_stream(tier);
        STRATA_TRY(strata_stream_wait_event(d, ps, e->off.ev_update[u]));
        STRATA_TRY(strata_stream_wait_event(d, ps, gathered));
        if (tier->ops->fetch_params(tier, u, pin, tag)) return -1;
        STRATA_TRY(strata_event_record(d, fetched, ps));
        STRATA_TRY(strata_stream_wait_event(d, comm_stream(e), fetched));
        shard = pin;
    } else if (tier) {
        STRATA_TRY(strata_stream_wait_event(d, comm_stream(e), e->off.ev_update[u]));
    }
    if (strata_allgather(e->comm, dst, shard, e->shard[u] * e->es)) return -1;
    if (e->cfg->offload.params != STRATA_OFFLOAD_NONE) e->gather_h2d_bytes += e->shard[u] * e->es; /* from host memory */
    STRATA_TRY(strata_event_record(d, gathered, comm_stream(e)));
    return 0;
}

/* Gather g goes to the embedding's buffer (an untied head), not to a ring slot. */
static int gather_in_embed(const strata_engine *e, int g) {
    return e->ring.head_in_embed && e->sched.gather_unit[g] == e->U - 1;
}

/* Enqueues the micro-step's gathers up to gather number `upto`. */
static int issue_gathers(strata_engine *e, int upto) {
    gather_ring *r = &e->ring;
    if (upto >= e->sched.n_gathers) upto = e->sched.n_gathers - 1;
    while (r->issued <= upto) {
        int g = r->issued++, s = g % r->n_slots, u = e->sched.gather_unit[g];
        int rc = gather_in_embed(e, g)
                     /* once the embedding's forward has read the buffer (embed_released) */
                     ? gather_shard(e, u, r->embed, r->ev_embed_free, r->pin_embed, r->n_slots + 1, r->ev_embed_fetched,
                                    r->ev_embed_gathered)
                     : gather_shard(e, u, r->slot[s], r->ev_free[s], r->pin ? r->pin[s] : NULL, s,
                                    r->ev_fetched ? r->ev_fetched[s] : NULL, r->ev_gathered[s]);
        if (rc) return -1;
    }
    return 0;
}

/* After unit u's forward: with an untied head, the embedding's buffer is free for it once
 * the embedding's forward is done (its backward reads no parameters). */
static int embed_released(strata_engine *e, const unit_op *op) {
    if (!e->z.params_sharded || !e->ring.head_in_embed || op->backward || op->unit != 0) return 0;
    STRATA_TRY(strata_event_record(e->dev, e->ring.ev_embed_free, e->dev->compute));
    return 0;
}

/* The micro-step's first gather: the embedding's, into its own buffer. */
static int gather_embed(strata_engine *e) {
    gather_ring *r = &e->ring;
    r->issued = 0;
    if (gather_shard(e, 0, r->embed, r->ev_embed_free, r->pin_embed, r->n_slots, r->ev_embed_fetched,
                     r->ev_embed_gathered))
        return -1;
    if (compute_wait(e, r->ev_embed_gathered)) return -1;
    e->m->params[0] = r->embed;
    return 0;
}

/* Points m->params[u] at unit u's parameters for op `op`: the full buffer once its update
 * is in place, or (params_sharded) its slot of the ring, gathering ahead. */
static int params_for(strata_engine *e, const unit_op *op, const unit_op *prev) {
    if (!e->z.params_sharded) {
        if (e->off.tier && !op->backward) {
            int stall = stall_begin(e);
            double t0 = strata_now_ms();
            int rc = gather_updated(e, op->unit);
            e->off.wait_ms += strata_now_ms() - t0;
            if (!rc) rc = wait_params_ready(e, op->unit);
            stall_end(e, stall);
            if (rc) return -1;
        }
        e->m->params[op->unit] = e->params_full[op->unit];
        return 0;
    }
    gather_ring *r = &e->ring;
    /* release the previous slot (the embedding's buffer is released at the micro-step's end) */
    if (prev && prev->gather >= 0 && prev->gather != op->gather && !gather_in_embed(e, prev->gather))
        STRATA_TRY(strata_event_record(e->dev, r->ev_free[prev->gather % r->n_slots], e->dev->compute));
    if (op->gather < 0) return 0;
    if (issue_gathers(e, op->gather + e->cfg->zero.prefetch_units)) return -1;
    if (gather_in_embed(e, op->gather)) {
        if (compute_wait(e, r->ev_embed_gathered)) return -1;
        e->m->params[op->unit] = r->embed;
        return 0;
    }
    int s = op->gather % r->n_slots;
    if (compute_wait(e, r->ev_gathered[s])) return -1;
    e->m->params[op->unit] = r->slot[s];
    return 0;
}

/* ---- the step ---- */

static int load_micro_batch(strata_engine *e, strata_loader *L, uint64_t first) {
    int stall = stall_begin(e);
    double t0 = strata_now_ms();
    int rc = strata_loader_read(L, first, e->B, e->inputs, e->targets, e->positions);
    e->data_ms += strata_now_ms() - t0;
    stall_end(e, stall);
    if (rc) return -1;
    if (strata_model_set_batch(e->m, e->inputs, e->targets, e->positions))
        return strata_fail_wrap("micro-batch of sequences %llu..%llu of data", (unsigned long long)first,
                                (unsigned long long)first + (unsigned long long)e->B - 1);
    return 0;
}

/* Gradient destination for unit u's backward in this micro-step (grads_sharded hands out
 * a zeroed bucket once the collective stream is done with its previous contents). */
static int grads_for(strata_engine *e, int u, int micro) {
    strata_model *m = e->m;
    if (!e->z.grads_sharded) {
        if (e->hg.on) return home_grads_for(e, u, micro);
        m->grads[u] = e->grads_full[u];
        return 0;
    }
    if (u == 0) return 0; /* the embedding's bucket was set up at the micro-step's start */
    int k = e->bk.next;
    if (compute_wait(e, e->bk.ev_slot_free[k])) return -1;
    STRATA_TRY(strata_memset_async(e->dev, e->dev->compute, e->bk.slot[k], 0, e->padded[u] * 4));
    m->grads[u] = e->bk.slot[k];
    return 0;
}

/* Full gradients are zeroed just before each unit's first backward of the step rather
 * than at the step's start: the previous step's update by the tier may still be reading
 * them. The head's backward is the first to add to the (tied) embedding's gradient. */
static int zero_grads_before_backward(strata_engine *e, int u) {
    int head = e->U - 1;
    if (u == 0) return 0;
    if (!grads_home(e, u)) /* a gradient kept in host memory is zeroed in its buffer (ready_home_grad) */
        STRATA_TRY(strata_memset_async(e->dev, e->dev->compute, e->grads_full[u], 0, e->padded[u] * 4));
    if (u == head && !grads_home(e, 0))
        STRATA_TRY(strata_memset_async(e->dev, e->dev->compute, e->grads_full[0], 0, e->padded[0] * 4));
    return 0;
}

/* offload.activations: unit u's residual stream waits for its buffer's copy out before
 * the forward writes it, and for its copy in before the backward reads it (a wait on
 * those copies is the offload's, as the gradients' are). */
static int acts_before_forward(strata_engine *e, int u) {
    strata_event *ev = e->acts ? strata_acts_home_before_forward(e->acts, u) : NULL;
    return ev ? compute_wait_on(e, ev, &e->off.wait_ms, "a residual stream's copy to host memory") : 0;
}
static int acts_before_backward(strata_engine *e, int u) {
    strata_event *ev = NULL;
    if (e->acts && strata_acts_home_before_backward(e->acts, u, &ev)) return -1;
    return ev ? compute_wait_on(e, ev, &e->off.wait_ms, "a residual stream's copy from host memory") : 0;
}

static int run_micro_step(strata_engine *e, strata_loader *L, int64_t step, int micro, float dloss,
                          float loss_scale, strata_step_result *r) {
    strata_model *m = e->m;
    strata_device *d = e->dev;
    if (load_micro_batch(e, L, strata_batch_seq(step, micro, e->rank, 0, e->world, e->A, e->B))) return -1;
    if (!e->z.grads_sharded) { /* the head's backward adds to the embedding's gradient: set it up front */
        for (int u = 0; u < e->U; u++) m->grads[u] = e->grads_full[u];
    } else {
        if (compute_wait(e, e->bk.ev_embed_free)) return -1;
        STRATA_TRY(strata_memset_async(d, d->compute, e->bk.embed, 0, e->padded[0] * 4));
        m->grads[0] = e->bk.embed;
    }
    if (e->z.params_sharded && gather_embed(e)) return -1;
    if (e->hg.on && host_grads_begin(e, micro)) return -1;
    const unit_op *prev = NULL;
    for (int i = 0; i < e->sched.n_ops; i++) {
        const unit_op *op = &e->sched.ops[i];
        if (op->backward && !prev->backward) r->backward_start_ms = strata_now_ms();
        strata_prof_set_phase(m->prof, op->backward ? STRATA_PROF_BACKWARD : STRATA_PROF_FORWARD);
        if (params_for(e, op, prev)) return -1;
        if (!op->backward) {
            if (acts_before_forward(e, op->unit)) return -1;
            strata_model_forward_unit(m, op->unit, 1, dloss, loss_scale);
            if (e->acts && strata_acts_home_after_forward(e->acts, op->unit)) return -1;
            if (embed_released(e, op)) return -1;
        } else {
            if (!e->z.grads_sharded && micro == 0 && zero_grads_before_backward(e, op->unit)) return -1;
            if (grads_for(e, op->unit, micro)) return -1;
            if (acts_before_backward(e, op->unit)) return -1;
            if (strata_model_backward_unit(m, op->unit)) return -1;
            if (after_backward(e, op->unit, micro)) return -1;
        }
        prev = op;
    }
    r->backward_end_ms = strata_now_ms();
    if (e->z.params_sharded) STRATA_TRY(strata_event_record(d, e->ring.ev_embed_free, d->compute));
    if (e->hg.on) STRATA_TRY(strata_event_record(d, e->hg.ev_home, e->hg.out));
    return 0;
}

/* AdamW on the device over this rank's optimizer range of unit u, split at tensor
 * boundaries so weight decay applies to matrices only; with bf16 moments the bf16 kernel;
 * with int8 the fp32 kernel on the small tensors' packed moments, then the 8-bit kernel
 * over the range's blocks for the rest. */
static void adamw_unit(strata_engine *e, int u, const strata_adamw_args *base) {
    const strata_kernels *k = e->dev->k;
    float *w = e->master[u], *g = opt_grad(e, u);
    char *param_out = param_dest(e, u);
    strata_adamw_segment seg[STRATA_ADAMW_MAX_SEGMENTS];
    int n_seg = strata_adamw_segments_for(e->m, u, opt_lo(e, u), opt_n(e, u), e->state, seg);
    for (int i = 0; i < n_seg; i++) {
        if (seg[i].quant) continue; /* the 8-bit kernel's, below */
        strata_adamw_args a = *base;
        if (!seg[i].decay) a.weight_decay = 0.0f;
        size_t off = seg[i].lo;
        int call = strata_prof_begin(e->m->prof, STRATA_PROF_ADAMW);
        if (e->state == STRATA_OPTIM_STATE_BF16)
            k->adamw_bf16(e->dev->compute, w + off, param_out + off * e->es, g + off, (uint16_t *)e->mom1[u] + off,
                          (uint16_t *)e->mom2[u] + off, seg[i].n, &a);
        else if (e->state == STRATA_OPTIM_STATE_INT8)
            k->adamw(e->dev->compute, w + off, param_out + off * e->es, g + off, e->small1[u] + seg[i].small,
                     e->small2[u] + seg[i].small, seg[i].n, &a);
        else
            k->adamw(e->dev->compute, w + off, param_out + off * e->es, g + off, (float *)e->mom1[u] + off,
                     (float *)e->mom2[u] + off, seg[i].n, &a);
        strata_prof_end(e->m->prof, call);
    }
    if (e->state == STRATA_OPTIM_STATE_INT8) {
        int call = strata_prof_begin(e->m->prof, STRATA_PROF_ADAMW);
        k->adamw_q8(e->dev->compute, w, param_out, g, e->mom1[u], e->mom2[u], e->absmax1[u], e->absmax2[u], opt_n(e, u),
                    seg, n_seg, base);
        strata_prof_end(e->m->prof, call);
    }
}

/* The update tier's step: every gradient is final (the collective stream was synced);
 * the tier updates unit by unit, in forward order, and once this returns the next step's
 * forward follows unit by unit (gather_updates: each unit's all-gather issued just before
 * it). The previous step's updates finished behind this step's forward (so the sync costs
 * no wait); their errors surface here, and their task records are free to refill. */
static int update_by_tier(strata_engine *e, const strata_adamw_args *args, strata_step_result *r) {
    strata_update_tier *tier = e->off.tier;
    if (tier->ops->sync(tier)) return -1;
    strata_tier_stats now;
    tier->ops->stats(tier, &now);
    if (e->off.have_seen) { /* the last step's update, this step's reads: now - seen - not_steps */
        r->tier = now;
        strata_tier_stats_add(&r->tier, &e->off.seen, -1);
        strata_tier_stats_add(&r->tier, &e->off.not_steps, -1);
        /* gradients in host memory crossed PCIe in the backward, not in the tier, and the
         * residual streams in host memory around the forward and backward */
        uint64_t acts_d2h, acts_h2d;
        strata_acts_home_take_bytes(e->acts, &acts_d2h, &acts_h2d);
        r->tier.d2h_bytes += e->hg.d2h_bytes + acts_d2h;
        r->tier.h2d_bytes += e->hg.h2d_bytes + acts_h2d;
        r->have_split = 1;
    }
    e->off.seen = now;
    e->off.have_seen = 1;
    memset(&e->off.not_steps, 0, sizeof e->off.not_steps);
    STRATA_TRY(strata_event_record(e->dev, e->ev_compute, e->dev->compute));
    strata_adamw_segment seg[STRATA_ADAMW_MAX_SEGMENTS];
    for (int u = 0; u < e->U; u++) {
        if (!in_tier(e, u)) { /* the device holds this unit's state: its update runs on compute */
            adamw_unit(e, u, args);
            STRATA_TRY(strata_event_record(e->dev, e->off.ev_update[u], e->dev->compute));
        } else {
            int n_seg = strata_adamw_segments_for(e->m, u, opt_lo(e, u), opt_n(e, u), e->state, seg);
            /* a gradient in host memory is final once the last copy out is done */
            strata_event *after = grads_home(e, u) ? e->hg.ev_home : e->ev_compute;
            if (tier->ops->update(tier, u, opt_grad(e, u), param_dest(e, u), seg, n_seg, args, after,
                                  e->off.ev_update[u]))
                return -1;
        }
        if (e->z.gather_updates) e->off.gather_pending[u] = 1;
    }
    return 0;
}

/* The device's step: AdamW on the compute stream, then (gather_updates) the updated
 * shards all-gathered, unit by unit. */
static int update_on_device(strata_engine *e, const strata_adamw_args *args) {
    for (int u = 0; u < e->U; u++) {
        adamw_unit(e, u, args);
        if (e->z.gather_updates &&
            (comm_after_compute(e) || strata_allgather(e->comm, e->params_full[u], param_dest(e, u), e->shard[u] * e->es)))
            return -1;
    }
    if (comm_sync(e)) return -1;
    /* Stage 3: the next gathers (the next step's, an eval's) read the shards this update
     * writes on the compute stream, and the slot events they wait for were recorded before
     * it, so the collective stream waits for the update itself. The suspect for 4 ranks
     * sharing the H200 parting from stage 2 by step 3 (2026-11-27), when the GPU's
     * time-slicing between them can delay an update past the next step's first gather. */
    return e->z.params_sharded ? comm_after_compute(e) : 0;
}

/* A device fault recorded in the micro-steps (out of memory: a kernel or copy that did not
 * run, core/common.h) spoils this step. It poisons the step's loss, so the step-end
 * agreement finds it not finite on every rank and every rank skips the update, as for a
 * NaN: the state stays the last completed step's, and the caller, finding the fault
 * (strata_fault_take), may checkpoint it. STRATA_FAULT_OOM_STEP injects such a fault. */
static int poison_on_fault(strata_engine *e, int64_t step) {
    if (e->fault.oom_step == step + 1)
        strata_fault_record(1, "cudaMalloc of %zu bytes (unit 0's gradient) failed: out of memory "
                               "(injected by STRATA_FAULT_OOM_STEP=%lld)", e->padded[0] * 4, e->fault.oom_step);
    if (strata_fault_peek(NULL, 0)) /* all bits set: a NaN */
        STRATA_TRY(strata_memset_async(e->dev, e->dev->compute, e->m->loss_sum, 0xff, sizeof(float)));
    return 0;
}

/* The learned targets of the whole global batch of step `step` (every rank, every
 * micro-step): this rank counts its own micro-batches' masks, one small all-reduce sums
 * them, before any backward. Data without a mask learns every target, and no rank asks. */
static int count_learned(strata_engine *e, strata_loader *L, int64_t step, uint64_t *learned) {
    *learned = (uint64_t)e->B * e->T * (uint64_t)e->world * (uint64_t)e->A;
    if (!L->has_mask) return 0;
    double t0 = strata_now_ms(); /* before the step's compute clock starts */
    uint64_t mine = 0;
    int rc = 0;
    for (int micro = 0; micro < e->A && !rc; micro++) {
        uint64_t n = 0;
        rc = strata_loader_count_learned(L, strata_batch_seq(step, micro, e->rank, 0, e->world, e->A, e->B), e->B, &n);
        mine += n;
    }
    e->data_ms += strata_now_ms() - t0;
    if (rc) return -1;
    double all = (double)mine; /* exact: a count below 2^53 */
    if (e->world > 1 && strata_allreduce_host_f64(e->comm, &all, 1)) return -1;
    *learned = (uint64_t)all;
    return 0;
}

/* STRATA_FAULT_HANG_STEP's task: it never ends, as a kernel that never ends would not. */
static void hang_forever(void *arg) {
    (void)arg;
    for (;;) {
        struct timespec nap = {1, 0};
        nanosleep(&nap, NULL);
    }
}

static int step_once(strata_engine *e, strata_loader *L, int64_t step, strata_step_result *r) {
    strata_device *d = e->dev;
    memset(r, 0, sizeof *r);
    e->comm_wait_ms = e->data_ms = e->off.wait_ms = 0;
    e->gather_h2d_bytes = 0;
    strata_model *m = e->m;
    size_t BT = (size_t)e->B * e->T;
    /* The step's loss is the mean over the learned targets of the global batch, so each
     * learned target weighs 1/learned in the gradient, whichever rank and micro-step holds
     * it (a masked one, -1, weighs nothing); without a mask, 1/(B*T*world*A). The losses
     * summed on the device keep the unmasked scale, and the mean is corrected after. */
    uint64_t all = (uint64_t)BT * (uint64_t)e->world * (uint64_t)e->A;
    if (count_learned(e, L, step, &r->learned_tokens)) return -1;
    float dloss = r->learned_tokens ? 1.0f / (float)r->learned_tokens : 0.0f;
    float loss_scale = 1.0f / (float)(BT * (size_t)e->A);
    clock_start(e);
    e->hg.d2h_bytes = e->hg.h2d_bytes = 0;
    uint64_t discard[2];
    strata_acts_home_take_bytes(e->acts, &discard[0], &discard[1]); /* this step's copies are counted from here */
    /* each unit's sum of squares has a place of its own: a gradient kept in host memory has
     * its sum taken when its last backward is done (send_home) */
    STRATA_TRY(strata_memset_async(d, d->compute, e->norm_part, 0, (size_t)e->U * sizeof(double)));
    if (e->fault.copy_step == step + 1) {
        char why[64];
        snprintf(why, sizeof why, "STRATA_FAULT_COPY_STEP=%lld", e->fault.copy_step);
        strata_device_arm_copy_fault(d, why);
    }
    STRATA_TRY(strata_memset_async(d, d->compute, m->loss_sum, 0, sizeof(float)));
    if (e->fault.hang_step == step + 1) { /* a stream that never gets there, and the step waits for it */
        STRATA_TRY(strata_host_task(d, comm_stream(e), hang_forever, NULL));
        if (comm_sync(e)) return -1;
    }
    for (int micro = 0; micro < e->A; micro++)
        if (run_micro_step(e, L, step, micro, dloss, loss_scale, r)) return -1;
    strata_prof_set_phase(m->prof, STRATA_PROF_UPDATE);
    if (comm_sync(e) || poison_on_fault(e, step)) return -1;

    /* global gradient norm: each rank sums squares over the elements it owns, a sum per
     * unit, added in unit order (the same double additions as one running sum) */
    double sums[2] = {0.0, 0.0};
    for (int u = 0; u < e->U; u++) {
        if (grads_home(e, u)) continue;
        const float *g = e->z.grads_sharded ? e->grad_acc[u] : e->grads_full[u] + (size_t)e->rank * e->shard[u];
        d->k->sumsq(d->compute, e->norm_part + u, g, e->shard[u]);
    }
    STRATA_TRY(strata_memcpy_async(d, d->compute, e->norm_host, e->norm_part, (size_t)e->U * sizeof(double)));
    STRATA_TRY(strata_memcpy_async(d, d->compute, e->loss_sum_host, m->loss_sum, sizeof(float)));
    clock_stop(e);
    STRATA_TRY(strata_stream_sync(d, d->compute));
    for (int u = 0; u < e->U; u++) sums[0] += e->norm_host[u];
    r->compute_ms = clock_busy_ms(e, &r->compute_untimed);
    if (m->prof && strata_prof_collect(m->prof)) STRATA_WARN("prof", "%s", strata_error()); /* the last step's */
    sums[1] = *e->loss_sum_host;
    if (e->fault.nan_step == step + 1) sums[1] = NAN; /* STRATA_FAULT_NAN_STEP: this rank's loss */
    if (strata_allreduce_host_f64(e->comm, sums, 2)) return -1;
    r->grad_norm = sqrt(sums[0]);
    r->loss = sums[1] / e->world;
    if (r->learned_tokens != all) /* a global batch with nothing to learn has loss 0 */
        r->loss = r->learned_tokens ? r->loss * ((double)all / (double)r->learned_tokens) : 0.0;
    r->lr = strata_lr_at(&e->cfg->optim, e->cfg->train.steps, step);
    r->offload_wait_ms = e->off.wait_ms;
    r->gather_h2d_bytes = e->gather_h2d_bytes; /* every gather of the step is issued by now */
    if (!isfinite(r->grad_norm) || !isfinite(r->loss)) {
        r->nonfinite = 1; /* every rank saw the same sums, so every rank skips the update */
        return 0;
    }
    float clip = (float)e->cfg->optim.grad_clip;
    float scale = clip > 0 && r->grad_norm > clip ? (float)(clip / (r->grad_norm + 1e-6)) : 1.0f;
    strata_adamw_args args = strata_adamw_args_at(&e->cfg->optim, e->cfg->train.steps, step, scale);
    if (e->off.tier ? update_by_tier(e, &args, r) : update_on_device(e, &args)) return -1;
    r->offload_wait_ms = e->off.wait_ms;
    r->comm_wait_ms = e->comm_wait_ms;
    r->data_ms = e->data_ms;
    return 0;
}

/* A profiled step (STRATA_PROFILE=kernels) is the same step with the model's and the
 * engine's timed calls recorded into the profiler's bank for it. */
int strata_engine_step(strata_engine *e, strata_loader *L, int64_t step, strata_step_result *r) {
    int rc;
    if (!e->prof) {
        rc = step_once(e, L, step, r);
    } else {
        strata_prof_step_begin(e->prof);
        e->m->prof = e->prof;
        rc = step_once(e, L, step, r);
        e->m->prof = NULL;
        strata_prof_step_end(e->prof, rc == 0);
    }
    if (rc) return strata_fail_wrap("step %lld", (long long)step + 1);
    return 0;
}

int strata_engine_profile_kernels(strata_engine *e) {
    STRATA_ASSERT(e->dev && !e->prof);
    /* timed calls a step can make: per micro-step the model's forward and backward
     * (strata_model_timed_calls) and up to 6 waits per unit op; then the update's AdamW
     * segments (at most a unit's tensors) and waits */
    int cap = e->A * (strata_model_timed_calls(e->m) + 6 * e->sched.n_ops) + 8;
    for (int u = 0; u < e->U; u++) cap += e->m->units[u].n_tensors + 2; /* and int8's block kernel */
    e->prof = strata_prof_create(e->dev, cap);
    return e->prof ? 0 : -1;
}

int strata_engine_kernel_profile(strata_engine *e, strata_prof_report *r) {
    if (!e->prof) return strata_fail("kernel profile: not enabled (STRATA_PROFILE=kernels)");
    if (strata_prof_flush(e->prof)) return -1;
    return strata_prof_report_get(e->prof, r);
}

int strata_engine_sync(strata_engine *e) { return finish_updates(e); }

void strata_engine_set_stop(strata_engine *e, strata_stop_query stop) { e->stop = stop; }

/* Whether any rank was asked to stop: every rank asks at the same point of the same loop,
 * so all of them get the same answer and leave together (one all-reduce of a double at
 * world > 1, after which the collective stream is idle again). 1 stop, 0 go on, -1 error. */
static int stop_agreed(strata_engine *e) {
    if (!e->stop) return 0;
    double stop = e->stop() ? 1.0 : 0.0;
    if (e->world > 1 && strata_allreduce_host_f64(e->comm, &stop, 1)) return -1;
    return stop > 0;
}

int strata_engine_eval(strata_engine *e, strata_loader *L, int n_batches, double *loss) {
    if (finish_updates(e)) return -1;
    strata_tier_stats before = {0}, after;
    if (e->off.tier) e->off.tier->ops->stats(e->off.tier, &before);
    strata_device *d = e->dev;
    strata_model *m = e->m;
    gather_ring *r = &e->ring;
    size_t BT = (size_t)e->B * e->T;
    STRATA_TRY(strata_memset_async(d, d->compute, m->loss_sum, 0, sizeof(float)));
    int stopped = 0;
    uint64_t learned = 0; /* this rank's learned targets over the pass */
    for (int b = 0; b < n_batches; b++) {
        /* between batches the ring is released and the collective stream idle: a stop
         * leaves nothing half done */
        if ((stopped = stop_agreed(e)) != 0) break;
        uint64_t first = ((uint64_t)b * e->world + e->rank) * e->B, n = 0;
        if (strata_loader_count_learned(L, first, e->B, &n)) return -1;
        learned += n;
        if (load_micro_batch(e, L, first)) return -1;
        if (e->z.params_sharded && gather_embed(e)) return -1;
        const unit_op *prev = NULL;
        for (int i = 0; i < e->sched.n_ops && !e->sched.ops[i].backward; i++) {
            if (params_for(e, &e->sched.ops[i], prev)) return -1;
            strata_model_forward_unit(m, e->sched.ops[i].unit, 0, 0.0f, 1.0f / (float)(BT * n_batches));
            if (embed_released(e, &e->sched.ops[i])) return -1;
            prev = &e->sched.ops[i];
        }
        if (e->z.params_sharded) {
            /* release the last slot and the embedding; skip the gathers the backward would use */
            STRATA_TRY(strata_event_record(d, r->ev_free[prev->gather % r->n_slots], d->compute));
            STRATA_TRY(strata_event_record(d, r->ev_embed_free, d->compute));
            STRATA_TRY(strata_stream_sync(d, comm_stream(e)));
            for (int k = 0; k < r->n_slots; k++) STRATA_TRY(strata_event_record(d, r->ev_free[k], d->compute));
        }
    }
    if (stopped < 0) return -1;
    STRATA_TRY(strata_stream_sync(d, comm_stream(e)));
    if (e->off.tier) { /* eval's parameter reads are no step's work: kept out of the next step's split */
        if (e->off.tier->ops->sync(e->off.tier)) return -1;
        e->off.tier->ops->stats(e->off.tier, &after);
        strata_tier_stats_add(&after, &before, -1);
        strata_tier_stats_add(&e->off.not_steps, &after, 1);
    }
    if (stopped) { /* every rank agreed: none waits in the loss's all-reduce below */
        STRATA_TRY(strata_stream_sync(d, d->compute));
        return STRATA_ENGINE_STOPPED;
    }
    STRATA_TRY(strata_memcpy_async(d, d->compute, e->loss_sum_host, m->loss_sum, sizeof(float)));
    STRATA_TRY(strata_stream_sync(d, d->compute));
    /* the same rule as a step's: the mean over the learned targets of every rank */
    double sums[2] = {*e->loss_sum_host, (double)learned};
    if (strata_allreduce_host_f64(e->comm, sums, L->has_mask ? 2 : 1)) return -1;
    uint64_t all = (uint64_t)BT * (uint64_t)n_batches * (uint64_t)e->world;
    *loss = strata_loss_over_learned(sums[0] / e->world, (uint64_t)sums[1], all, L->has_mask);
    return 0;
}

/* ---- checkpoints ---- */

/* Elements [lo, lo + n) of state array `kind` of unit u (range-relative) into the writer
 * as checkpoint kind ck_kind, a chunk at a time through the staging buffer. */
static int put_state(strata_engine *e, strata_ckpt_writer *w, int u, int ck_kind, int kind, size_t lo, size_t n) {
    for (size_t c = 0; c < n; c += e->io_chunk) {
        size_t len = n - c < e->io_chunk ? n - c : e->io_chunk;
        if (state_get(e, u, kind, lo + c, len, e->io_buf) || strata_ckpt_writer_put(w, u, ck_kind, e->io_buf, len))
            return -1;
    }
    return 0;
}

/* This rank's standard shards into the writer, unit by unit and kind by kind, a chunk at a
 * time through the staging buffer from wherever the state lives (the device, or the
 * tier's pinned memory or NVMe file), as it is stored: with int8, each tensor's piece of m
 * and v from its codes or (small tensors) its packed fp32 moments, then the blocks' absmax. */
static int write_shards(strata_engine *e, strata_ckpt_writer *w, const strata_param_layout *L) {
    for (int u = 0; u < e->U; u++) {
        size_t a, b, lo = opt_lo(e, u); /* the standard shard's real elements; where the range starts */
        strata_ckpt_rank_range(L, u, e->rank, e->world, &a, &b);
        if (a == b) continue;
        if (put_state(e, w, u, STRATA_CKPT_PARAM, STRATA_STATE_MASTER, a - lo, b - a)) return -1;
        if (e->state != STRATA_OPTIM_STATE_INT8) {
            for (int k = STRATA_STATE_M; k <= STRATA_STATE_V; k++)
                if (put_state(e, w, u, k, k, a - lo, b - a)) return -1;
            continue;
        }
        strata_adamw_segment seg[STRATA_ADAMW_MAX_SEGMENTS];
        int n_seg = strata_adamw_segments_for(e->m, u, lo, opt_n(e, u), e->state, seg);
        for (int k = STRATA_STATE_M; k <= STRATA_STATE_V; k++)
            for (int i = 0; i < n_seg; i++) {
                size_t pa = lo + seg[i].lo > a ? lo + seg[i].lo : a, pb = lo + seg[i].lo + seg[i].n;
                if (pb > b) pb = b;
                if (pa >= pb) continue;
                int rc = seg[i].quant ? put_state(e, w, u, k, k, pa - lo, pb - pa)
                                      : put_state(e, w, u, k, k == STRATA_STATE_M ? STRATA_STATE_M_SMALL : STRATA_STATE_V_SMALL,
                                                  seg[i].small + (pa - lo - seg[i].lo), pb - pa);
                if (rc) return -1;
            }
        size_t blo = (a - lo) / STRATA_Q8_BLOCK, bhi = strata_q8_blocks(b - lo);
        if (put_state(e, w, u, STRATA_CKPT_M_ABSMAX, STRATA_STATE_M_ABSMAX, blo, bhi - blo) ||
            put_state(e, w, u, STRATA_CKPT_V_ABSMAX, STRATA_STATE_V_ABSMAX, blo, bhi - blo))
            return -1;
    }
    return 0;
}

/* This rank's files of the checkpoint in tmp. */
static int save_rank(strata_engine *e, const char *tmp) {
    strata_param_layout layout = strata_model_layout(e->m, e->padded);
    strata_ckpt_writer *w = strata_ckpt_writer_open_state(tmp, &layout, e->rank, e->world, e->state);
    if (!w) return -1;
    if (write_shards(e, w, &layout)) {
        strata_ckpt_writer_abort(w);
        return -1;
    }
    return strata_ckpt_writer_close(w);
}

int strata_engine_save(strata_engine *e, const char *run_dir, const strata_ckpt_meta *meta,
                       char *final_dir, size_t final_len) {
    char tmp[STRATA_PATH_MAX];
    int64_t step = meta->step;
    double failed = 0;
    if (strata_ckpt_tmp_dir(tmp, sizeof tmp, run_dir, step)) failed = 1;
    if (!failed && finish_updates(e)) failed = 1;
    if (!failed && save_rank(e, tmp)) failed = 1;
    char err[1024] = "";
    if (failed) snprintf(err, sizeof err, "%s", strata_error());
    /* every rank's files are on disk (or someone failed) before rank 0 commits */
    if (strata_allreduce_host_f64(e->comm, &failed, 1)) return -1;
    if (failed) return strata_fail("checkpoint of step %lld not written: %s", (long long)step,
                                   err[0] ? err : "another rank failed to write its shard");
    strata_param_layout layout = strata_model_layout(e->m, e->padded);
    strata_ckpt_meta stored = *meta;
    stored.state = e->state; /* the moments as this engine stores them */
    double commit_failed = 0;
    if (e->rank == 0 && strata_ckpt_commit(run_dir, tmp, &layout, &stored, e->cfg->run.keep, strata_config_keeps_best(e->cfg),
                                             final_dir, final_len)) {
        commit_failed = 1;
        snprintf(err, sizeof err, "%s", strata_error());
    }
    if (strata_allreduce_host_f64(e->comm, &commit_failed, 1)) return -1;
    if (commit_failed) return strata_fail("checkpoint of step %lld not committed: %s", (long long)step,
                                          err[0] ? err : "rank 0 failed to commit it");
    return 0;
}

/* The 8-bit state of one block of moment `kind` (M or V) from its fp32 values x[0, bn)
 * (elements [bl, bl + bn) of unit u's range): the small tensors' pieces go to their packed
 * fp32 array, the rest become codes (the others the zero code) with the block's absmax over
 * them, as the update would store them. */
static int quantize_block(strata_engine *e, int u, int kind, const strata_adamw_segment *seg, int n_seg, size_t bl,
                          size_t bn, const float *x, uint8_t *code, float *absmax) {
    const strata_q8_map *q = kind == STRATA_STATE_M ? strata_q8_signed() : strata_q8_unsigned();
    memset(code, zero_byte(e, kind), bn);
    float amax = 0;
    for (int pass = 0; pass < 2; pass++) /* the absmax first, then the codes with it */
        for (int i = 0; i < n_seg; i++) {
            size_t pa = seg[i].lo > bl ? seg[i].lo : bl, pb = seg[i].lo + seg[i].n < bl + bn ? seg[i].lo + seg[i].n : bl + bn;
            if (pa >= pb) continue;
            if (!seg[i].quant) {
                if (pass == 0 && state_put(e, u, kind == STRATA_STATE_M ? STRATA_STATE_M_SMALL : STRATA_STATE_V_SMALL,
                                           seg[i].small + (pa - seg[i].lo), pb - pa, x + (pa - bl)))
                    return -1;
            } else if (pass == 0) {
                float y = strata_q8_absmax(x + (pa - bl), pb - pa);
                amax = y > amax ? y : amax;
            } else {
                strata_q8_quantize(q, x + (pa - bl), pb - pa, amax, code + (pa - bl));
            }
        }
    *absmax = amax;
    return 0;
}

/* Moment `kind` of unit u's range from a checkpoint that stores it otherwise (another
 * optim.state), through its fp32 values (strata_ckpt_read_range dequantizes and widens),
 * a chunk at a time: as they are (fp32), rounded to bf16, or quantized block by block
 * (int8: codes in the buffer's first bytes, the chunk's absmax after them). */
static int convert_moment(strata_engine *e, strata_ckpt *ck, int u, int kind) {
    size_t lo = opt_lo(e, u), n = opt_n(e, u);
    float *host = e->io_buf;
    strata_adamw_segment seg[STRATA_ADAMW_MAX_SEGMENTS];
    int n_seg = strata_adamw_segments_for(e->m, u, lo, n, e->state, seg);
    for (size_t c = 0; c < n; c += e->io_chunk) {
        size_t len = n - c < e->io_chunk ? n - c : e->io_chunk;
        if (e->state != STRATA_OPTIM_STATE_INT8) {
            if (strata_ckpt_read_range(ck, u, kind, lo + c, lo + c + len, host)) return -1;
            if (e->state == STRATA_OPTIM_STATE_BF16) /* in place, front to back: element i's 2 bytes never pass i's 4 */
                for (size_t i = 0; i < len; i++) ((uint16_t *)host)[i] = strata_f32_to_bf16(host[i]);
            if (state_put(e, u, kind, c, len, host)) return -1;
            continue;
        }
        uint8_t *code = (uint8_t *)host;
        float *absmax = host + e->io_chunk / 4, x[STRATA_Q8_BLOCK]; /* after the chunk's codes */
        for (size_t bl = c; bl < c + len; bl += STRATA_Q8_BLOCK) {
            size_t bn = c + len - bl < STRATA_Q8_BLOCK ? c + len - bl : STRATA_Q8_BLOCK;
            if (strata_ckpt_read_range(ck, u, kind, lo + bl, lo + bl + bn, x) ||
                quantize_block(e, u, kind, seg, n_seg, bl, bn, x, code + (bl - c), &absmax[(bl - c) / STRATA_Q8_BLOCK]))
                return -1;
        }
        if (state_put(e, u, kind, c, len, code) ||
            state_put(e, u, kind == STRATA_STATE_M ? STRATA_STATE_M_ABSMAX : STRATA_STATE_V_ABSMAX, c / STRATA_Q8_BLOCK,
                      strata_q8_blocks(len), absmax))
            return -1;
    }
    return 0;
}

/* Moment `kind` of unit u's range from a checkpoint of the same optim.state, as stored:
 * bf16 as it is; int8 codes tensor piece by piece (the padding the zero code), the small
 * tensors' fp32 values to their packed array, and the blocks' absmax (0 past the
 * checkpoint's blocks: padding). */
static int load_moment_raw(strata_engine *e, strata_ckpt *ck, int u, int kind) {
    size_t lo = opt_lo(e, u), n = opt_n(e, u), numel = e->m->units[u].numel;
    size_t mb = strata_optim_moment_bytes(e->state);
    float *host = e->io_buf;
    strata_adamw_segment seg[STRATA_ADAMW_MAX_SEGMENTS];
    int n_seg = strata_adamw_segments_for(e->m, u, lo, n, e->state, seg);
    for (size_t c = 0; c < n; c += e->io_chunk) {
        size_t len = n - c < e->io_chunk ? n - c : e->io_chunk;
        memset(host, zero_byte(e, kind), len * mb);
        for (int i = 0; i < n_seg; i++) { /* the quantized pieces (bf16: every piece) */
            size_t pa = seg[i].lo > c ? seg[i].lo : c, pb = seg[i].lo + seg[i].n < c + len ? seg[i].lo + seg[i].n : c + len;
            size_t real = numel > lo ? numel - lo : 0; /* range-relative: past it, padding */
            if (pb > real) pb = real;
            if (pa >= pb || (e->state == STRATA_OPTIM_STATE_INT8 && !seg[i].quant)) continue;
            if (strata_ckpt_read_raw(ck, u, kind, lo + pa, lo + pb, (char *)host + (pa - c) * mb)) return -1;
        }
        if (state_put(e, u, kind, c, len, host)) return -1;
    }
    if (e->state != STRATA_OPTIM_STATE_INT8) return 0;
    for (int i = 0; i < n_seg; i++) { /* the small tensors' fp32 moments: within the real elements */
        if (seg[i].quant) continue;
        for (size_t c = 0; c < seg[i].n; c += e->io_chunk) {
            size_t len = seg[i].n - c < e->io_chunk ? seg[i].n - c : e->io_chunk;
            if (strata_ckpt_read_range(ck, u, kind, lo + seg[i].lo + c, lo + seg[i].lo + c + len, host) ||
                state_put(e, u, kind == STRATA_STATE_M ? STRATA_STATE_M_SMALL : STRATA_STATE_V_SMALL, seg[i].small + c, len,
                          host))
                return -1;
        }
    }
    int ck_kind = kind == STRATA_STATE_M ? STRATA_CKPT_M_ABSMAX : STRATA_CKPT_V_ABSMAX;
    size_t nb = strata_q8_blocks(n), b0 = lo / STRATA_Q8_BLOCK, stored = strata_q8_blocks(numel);
    for (size_t c = 0; c < nb; c += e->io_chunk) {
        size_t len = nb - c < e->io_chunk ? nb - c : e->io_chunk;
        size_t have = b0 + c >= stored ? 0 : stored - (b0 + c) < len ? stored - (b0 + c) : len;
        memset(host, 0, len * sizeof(float));
        if (have && strata_ckpt_read_raw(ck, u, ck_kind, b0 + c, b0 + c + have, host)) return -1;
        if (state_put(e, u, kind + (STRATA_STATE_M_ABSMAX - STRATA_STATE_M), c, len, host)) return -1;
    }
    return 0;
}

/* Unit u's optimizer range from the checkpoint, a chunk at a time through the staging
 * buffer, to wherever the state lives: the master weights, then the moments as stored
 * when the checkpoint's optim.state is this run's, else converted. */
static int load_unit(strata_engine *e, strata_ckpt *ck, int u) {
    size_t lo = opt_lo(e, u), n = opt_n(e, u);
    float *host = e->io_buf;
    strata_optim_state saved = strata_ckpt_get_meta(ck)->state;
    int kinds = e->state == STRATA_OPTIM_STATE_FP32 && saved == STRATA_OPTIM_STATE_FP32 ? 3 : 1;
    for (int k = 0; k < kinds; k++) /* fp32 state from fp32: every kind as it always was */
        for (size_t c = 0; c < n; c += e->io_chunk) {
            size_t len = n - c < e->io_chunk ? n - c : e->io_chunk;
            if (strata_ckpt_read_range(ck, u, k, lo + c, lo + c + len, host) || state_put(e, u, k, c, len, host))
                return -1;
        }
    if (kinds == 3) return 0;
    for (int k = STRATA_STATE_M; k <= STRATA_STATE_V; k++)
        if (saved == e->state ? load_moment_raw(e, ck, u, k) : convert_moment(e, ck, u, k)) return -1;
    return 0;
}

int strata_engine_load(strata_engine *e, strata_ckpt *ck) {
    strata_param_layout layout = strata_model_layout(e->m, e->padded);
    if (strata_ckpt_check_layout(ck, &layout)) return -1;
    strata_optim_state saved = strata_ckpt_get_meta(ck)->state;
    if (saved != e->state && e->rank == 0)
        STRATA_INFO("ckpt", "the checkpoint's optimizer state is %s, this run's optim.state is %s: Adam's moments are %s "
                    "on load (the master weights are fp32 in both)", strata_optim_state_name(saved),
                    strata_optim_state_name(e->state),
                    e->state == STRATA_OPTIM_STATE_INT8 ? "quantized to 8 bits"
                    : e->state == STRATA_OPTIM_STATE_BF16 ? (saved == STRATA_OPTIM_STATE_INT8 ? "dequantized and rounded to bf16" : "rounded to bf16")
                    : saved == STRATA_OPTIM_STATE_INT8 ? "dequantized to fp32" : "widened to fp32");
    if (tier_open(e) || finish_updates(e)) return -1;
    int rc = 0;
    for (int u = 0; u < e->U && !rc; u++) rc = load_unit(e, ck, u);
    /* every rank must agree it loaded before anyone trains */
    double failed = rc != 0;
    char err[1024];
    snprintf(err, sizeof err, "%s", rc ? strata_error() : "");
    if (strata_allreduce_host_f64(e->comm, &failed, 1)) return -1;
    if (failed) return strata_fail("%s", rc ? err : "another rank could not read the checkpoint");
    return publish_params(e);
}

int strata_engine_params_resident(strata_engine *e) {
    if (e->z.params_sharded) return strata_fail("zero.stage 3 keeps no full copy of the parameters");
    if (finish_updates(e)) return -1;
    for (int u = 0; u < e->U; u++) e->m->params[u] = e->params_full[u];
    return 0;
}

int strata_engine_read_state(strata_engine *e, int u, int kind, size_t lo, size_t n, void *dst, size_t *count) {
    if (u < 0 || u >= e->U || kind < 0 || kind >= STRATA_STATE_KINDS || lo + n > state_count(e, u, kind))
        return strata_fail("engine: no elements [%zu, %zu) of state array %d of unit %d", lo, lo + n, kind, u);
    if (count) *count = state_count(e, u, kind);
    if (finish_updates(e)) return -1;
    return state_get(e, u, kind, lo, n, dst);
}

const float *strata_engine_master_shard(const strata_engine *e, int u, size_t *lo, size_t *n) {
    *lo = (size_t)e->rank * e->shard[u];
    *n = e->shard[u];
    return e->z.opt_sharded ? e->master[u] : e->master[u] + *lo;
}

size_t strata_engine_nvme_bytes(const strata_engine *e) {
    return e->off.tier ? e->off.tier->ops->nvme_bytes(e->off.tier) : 0;
}
size_t strata_engine_nvme_param_bytes(const strata_engine *e) {
    return e->off.tier ? e->off.tier->ops->nvme_param_bytes(e->off.tier) : 0;
}
