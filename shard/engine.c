/* shard/engine.c: ZeRO stages 0-3 over the collectives of shard/comm.h.
 * The stage decides where each of params / grads / optimizer state lives; the step is
 * one schedule of unit operations with the collectives the stage needs in between. */
#include "shard/engine.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/kernels.h"
#include "core/optim.h"

#define PAD_ALIGN 64 /* elements; shards start on 256-byte boundaries for fp32 */

/* One unit operation of a micro-step: forward or backward of unit u, reading the
 * parameters of gather number g (stage 3; -1: the embedding's own buffer or none). */
typedef struct unit_op {
    int backward;
    int unit;
    int gather;
} unit_op;

/* A gradient reduce-scattered on the collective stream, then added into the shard
 * accumulator by the same stream's worker (host task), so compute never waits for it. */
typedef struct accumulate_task {
    float *dst;
    const void *src;
    strata_dtype src_dtype; /* bf16 after a bf16 reduction (train.grad_reduce_dtype) */
    size_t n;
    int overwrite;
} accumulate_task;

struct strata_engine {
    const strata_config *cfg;
    strata_model *m;
    strata_device *dev;
    strata_comm *comm;
    int rank, world, stage, A, B, T, U;
    int overlap;
    strata_dtype dtype; /* the compute dtype of parameters and activations */
    size_t es;          /* its bytes per element */
    size_t *padded, *shard;
    size_t max_block_padded; /* largest non-embedding unit */

    void **params_full;  /* stages 0-2: full padded, compute dtype */
    void **params_shard; /* stage 3 */
    float **grads_full;  /* stages 0-1: full padded fp32 */
    float **grad_acc;    /* stages 2-3: fp32 shard accumulators */
    float **master, **mom1, **mom2; /* stage 0: full padded; stages 1-3: shard */

    float *grad_slot[2]; /* stages 2-3: a non-embedding unit's full gradient, double-buffered */
    float *embed_grad;   /* stages 2-3: the embedding's gradient (head and embed add to it) */
    accumulate_task slot_task[2], embed_task;
    int next_grad_slot;

    int n_slots;         /* stage 3: gather ring, prefetch_units + 1 */
    void **slot;
    void *embed_param;
    /* offload.params: nvme: pinned buffers the shards are read into before their gather
     * (one per gather slot, and the embedding's), and the reads' events */
    int params_nvme;
    void **pin_slot, *pin_embed;
    strata_event **ev_fetched, *ev_embed_fetched;
    strata_event **ev_gathered, **ev_slot_free;
    strata_event *ev_embed_gathered, *ev_embed_free;
    unit_op *ops;        /* schedule of one training micro-step */
    int n_ops;
    int *gather_unit;    /* gather number -> unit */
    int n_gathers, issued;

    strata_event *ev_compute, *ev_grad_slot_free[2], *ev_embed_grad_free;
    /* On a GPU the shard accumulation is a kernel on a device stream of its own (the
     * collective stream may be a host stream); on the CPU it is a host task. */
    strata_stream *acc_stream;
    strata_event *ev_reduced;
    float *loss_sum_host;
    double *norm_sum;          /* device: the rank's sum of squared gradients */
    int32_t *inputs, *targets; /* host (B,T) */
    strata_engine_memory mem;
    double comm_wait_ms, data_ms; /* of the current step */

    /* train.grad_reduce_dtype bf16 (with several ranks): a unit's fp32 gradient is rounded
     * into one of two bf16 buffers on the compute stream, reduced in bf16 (half the bytes),
     * and converted back (or accumulated) into its fp32 destination after the collective */
    int reduce_bf16;
    void *red_buf[2];
    strata_event *ev_red_free[2];
    accumulate_task red_task[2];
    int next_red;

    strata_arena *arena;
    size_t max_opt_n;
    strata_update_tier *off;     /* optimizer state off the device (core/update_tier.h), or NULL */
    strata_event **ev_update;    /* per unit: its offloaded update is done */
    /* per unit: its updated parameters are in place for forward (stages 1-2: after the
     * all-gather, on the collective stream; otherwise ev_update itself) */
    strata_event **ev_params_ready;
    /* stages 1-2: unit u's updated shard still has to be all-gathered; issued just before
     * the unit's next forward (or by finish_updates), not at the step's end, since a wait
     * for a host stream's record may hold the enqueueing thread (core/device_cuda.cu) */
    unsigned char *gather_pending;
    double offload_wait_ms;      /* of the current step */
};

/* ---- plan ---- */

static void reserve_kind(strata_engine *e, strata_arena *a, strata_mem_kind kind, strata_mem_category cat,
                         const char *what, int u, size_t bytes, void **dst) {
    char name[64];
    if (u >= 0) snprintf(name, sizeof name, "%s.%d", what, u);
    else snprintf(name, sizeof name, "%s", what);
    strata_arena_reserve(a, kind, cat, name, bytes, dst);
    size_t *slot = cat == STRATA_CAT_PARAMS ? &e->mem.params : cat == STRATA_CAT_GRADS ? &e->mem.grads
                 : cat == STRATA_CAT_OPTIMIZER ? &e->mem.optimizer : cat == STRATA_CAT_ACTIVATIONS ? &e->mem.activations
                 : &e->mem.buffers;
    *slot += bytes;
}
static void reserve(strata_engine *e, strata_arena *a, strata_mem_category cat, const char *what, int u,
                    size_t bytes, void **dst) {
    reserve_kind(e, a, STRATA_MEM_DEVICE, cat, what, u, bytes, dst);
}

static void build_schedule(strata_engine *e) {
    int L = e->m->shape.n_layer, head = L + 1;
    e->ops = strata_xcalloc(2 * e->U, sizeof *e->ops);
    e->gather_unit = strata_xcalloc(2 * e->U, sizeof *e->gather_unit);
    int g = 0;
    e->ops[e->n_ops++] = (unit_op){0, 0, -1};
    for (int u = 1; u <= head; u++) {
        e->gather_unit[g] = u;
        e->ops[e->n_ops++] = (unit_op){0, u, g++};
    }
    e->ops[e->n_ops++] = (unit_op){1, head, g - 1}; /* the head's backward follows its forward */
    for (int u = L; u >= 1; u--) {
        e->gather_unit[g] = u;
        e->ops[e->n_ops++] = (unit_op){1, u, g++};
    }
    e->ops[e->n_ops++] = (unit_op){1, 0, -1}; /* the embedding's backward reads no parameters */
    e->n_gathers = g;
}

strata_engine *strata_engine_create(const strata_config *cfg, strata_model *m, strata_arena *arena,
                                    strata_device *dev, strata_comm *comm, strata_update_tier *tier, int rank,
                                    int world) {
    strata_engine *e = strata_xcalloc(1, sizeof *e);
    e->off = tier;
    e->cfg = cfg;
    e->m = m;
    e->dev = dev;
    e->comm = comm;
    e->rank = rank;
    e->world = world;
    e->stage = cfg->zero.stage;
    e->A = cfg->train.grad_accum;
    e->B = cfg->train.micro_batch;
    e->T = strata_config_seq_len(cfg);
    e->U = m->n_units;
    e->overlap = cfg->zero.overlap_comm;
    /* a plan without a device uses the dtype the config would run with */
    int bf16 = cfg->device != STRATA_BACKEND_CPU && (cfg->train.dtype == STRATA_DTYPE_BF16 ||
                                                      (cfg->train.dtype == STRATA_DTYPE_AUTO && cfg->device == STRATA_BACKEND_CUDA));
    e->dtype = dev ? dev->compute_dtype : bf16 ? STRATA_BF16 : STRATA_F32;
    e->es = strata_dtype_size(e->dtype);
    e->padded = strata_xcalloc(e->U, sizeof *e->padded);
    e->shard = strata_xcalloc(e->U, sizeof *e->shard);
    for (int u = 0; u < e->U; u++) {
        e->padded[u] = strata_round_up(m->units[u].numel, (size_t)world * PAD_ALIGN);
        e->shard[u] = e->padded[u] / world;
        if (u > 0 && e->padded[u] > e->max_block_padded) e->max_block_padded = e->padded[u];
    }
    e->params_full = strata_xcalloc(e->U, sizeof(void *));
    e->params_shard = strata_xcalloc(e->U, sizeof(void *));
    e->grads_full = strata_xcalloc(e->U, sizeof(float *));
    e->grad_acc = strata_xcalloc(e->U, sizeof(float *));
    e->master = strata_xcalloc(e->U, sizeof(float *));
    e->mom1 = strata_xcalloc(e->U, sizeof(float *));
    e->mom2 = strata_xcalloc(e->U, sizeof(float *));

    for (int u = 0; u < e->U; u++) {
        size_t P = e->padded[u], S = e->shard[u];
        if (e->stage <= 2) reserve(e, arena, STRATA_CAT_PARAMS, "params", u, P * e->es, &e->params_full[u]);
        else if (cfg->offload.params == STRATA_OFFLOAD_NVME) /* in the offload file; counted as NVMe bytes */
            e->mem.params += S * e->es;
        else /* offload.params: cpu keeps the shards in pinned host memory; gathers read them there */
            reserve_kind(e, arena, cfg->offload.params == STRATA_OFFLOAD_CPU ? STRATA_MEM_PINNED : STRATA_MEM_DEVICE,
                         STRATA_CAT_PARAMS, "params_shard", u, S * e->es, &e->params_shard[u]);
        if (e->stage <= 1) reserve(e, arena, STRATA_CAT_GRADS, "grads", u, P * 4, (void **)&e->grads_full[u]);
        else reserve(e, arena, STRATA_CAT_GRADS, "grad_shard", u, S * 4, (void **)&e->grad_acc[u]);
        size_t n = e->stage == 0 ? P : S;
        if (tier) {
            e->mem.optimizer += 3 * n * 4; /* held by this rank, in the tier's memory */
            continue;
        }
        reserve(e, arena, STRATA_CAT_OPTIMIZER, "master", u, n * 4, (void **)&e->master[u]);
        reserve(e, arena, STRATA_CAT_OPTIMIZER, "adam_m", u, n * 4, (void **)&e->mom1[u]);
        reserve(e, arena, STRATA_CAT_OPTIMIZER, "adam_v", u, n * 4, (void **)&e->mom2[u]);
    }
    e->arena = arena;
    for (int u = 0; u < e->U; u++) {
        size_t n = e->stage == 0 ? e->padded[u] : e->shard[u];
        if (n > e->max_opt_n) e->max_opt_n = n;
    }
    if (tier) {
        size_t *n = strata_xcalloc(e->U, sizeof *n);
        for (int u = 0; u < e->U; u++) n[u] = e->stage == 0 ? e->padded[u] : e->shard[u];
        tier->ops->plan(tier, arena, e->U, n, e->dtype);
        free(n);
        e->ev_update = strata_xcalloc(e->U, sizeof *e->ev_update);
        e->ev_params_ready = strata_xcalloc(e->U, sizeof *e->ev_params_ready);
        e->gather_pending = strata_xcalloc(e->U, 1);
        for (int u = 0; u < e->U && dev; u++) {
            e->ev_update[u] = strata_event_create(dev);
            e->ev_params_ready[u] = e->stage == 1 || e->stage == 2 ? strata_event_create(dev) : e->ev_update[u];
        }
    }
    if (e->stage >= 2) {
        for (int k = 0; k < 2; k++)
            reserve(e, arena, STRATA_CAT_COMM, k ? "grad_slot.1" : "grad_slot.0", -1,
                    e->max_block_padded * 4, (void **)&e->grad_slot[k]);
        reserve(e, arena, STRATA_CAT_COMM, "embed_grad", -1, e->padded[0] * 4, (void **)&e->embed_grad);
    }
    reserve(e, arena, STRATA_CAT_WORKSPACE, "norm_sum", -1, sizeof(double), (void **)&e->norm_sum);
    e->reduce_bf16 = world > 1 && (cfg->train.grad_reduce_dtype == STRATA_DTYPE_BF16 ||
                                   (cfg->train.grad_reduce_dtype == STRATA_DTYPE_AUTO && e->dtype == STRATA_BF16));
    if (e->reduce_bf16) {
        size_t max_padded = 0;
        for (int u = 0; u < e->U; u++) max_padded = e->padded[u] > max_padded ? e->padded[u] : max_padded;
        for (int k = 0; k < 2; k++)
            reserve(e, arena, STRATA_CAT_COMM, "reduce_bf16", k, max_padded * 2, &e->red_buf[k]);
    }
    build_schedule(e);
    if (e->stage == 3) {
        e->n_slots = cfg->zero.prefetch_units + 1;
        e->slot = strata_xcalloc(e->n_slots, sizeof(void *));
        for (int k = 0; k < e->n_slots; k++)
            reserve(e, arena, STRATA_CAT_PREFETCH, "gather_slot", k, e->max_block_padded * e->es, &e->slot[k]);
        reserve(e, arena, STRATA_CAT_PREFETCH, "embed_params", -1, e->padded[0] * e->es, &e->embed_param);
        e->params_nvme = cfg->offload.params == STRATA_OFFLOAD_NVME;
        if (e->params_nvme) {
            size_t max_shard = 0;
            for (int u = 1; u < e->U; u++) max_shard = e->shard[u] > max_shard ? e->shard[u] : max_shard;
            e->pin_slot = strata_xcalloc(e->n_slots, sizeof(void *));
            for (int k = 0; k < e->n_slots; k++)
                reserve_kind(e, arena, STRATA_MEM_PINNED, STRATA_CAT_PREFETCH, "param_read", k,
                             strata_round_up(max_shard * e->es, 4096), &e->pin_slot[k]);
            reserve_kind(e, arena, STRATA_MEM_PINNED, STRATA_CAT_PREFETCH, "param_read_embed", -1,
                         strata_round_up(e->shard[0] * e->es, 4096), &e->pin_embed);
        }
    }
    size_t before = strata_arena_bytes(arena, -1, STRATA_CAT_ACTIVATIONS);
    strata_model_plan(m, arena, dev, e->dtype, e->B, e->T, cfg->train.activation_checkpointing);
    e->mem.activations = strata_arena_bytes(arena, -1, STRATA_CAT_ACTIVATIONS) - before;

    if (dev) {
        /* the accumulation after a reduction is a kernel where the host cannot touch
         * device memory: on a device stream of its own (the collective stream may be a
         * HOST stream); elsewhere a host task on the collective stream (land_reduced) */
        if (!dev->caps.host_memory && (e->stage >= 2 || e->reduce_bf16)) {
            e->acc_stream = strata_stream_create(dev, "accumulate", STRATA_STREAM_DEVICE);
            e->ev_reduced = strata_event_create(dev);
        }
        e->ev_compute = strata_event_create(dev);
        e->ev_grad_slot_free[0] = strata_event_create(dev);
        e->ev_grad_slot_free[1] = strata_event_create(dev);
        e->ev_embed_grad_free = strata_event_create(dev);
        e->ev_embed_gathered = strata_event_create(dev);
        for (int k = 0; k < 2 && e->reduce_bf16; k++) e->ev_red_free[k] = strata_event_create(dev);
        e->ev_embed_free = strata_event_create(dev);
        e->ev_gathered = strata_xcalloc(e->n_slots + 1, sizeof *e->ev_gathered);
        e->ev_slot_free = strata_xcalloc(e->n_slots + 1, sizeof *e->ev_slot_free);
        for (int k = 0; k < e->n_slots; k++) {
            e->ev_gathered[k] = strata_event_create(dev);
            e->ev_slot_free[k] = strata_event_create(dev);
        }
        if (e->params_nvme) {
            e->ev_fetched = strata_xcalloc(e->n_slots, sizeof *e->ev_fetched);
            for (int k = 0; k < e->n_slots; k++) e->ev_fetched[k] = strata_event_create(dev);
            e->ev_embed_fetched = strata_event_create(dev);
        }
    }
    e->loss_sum_host = strata_xcalloc(1, sizeof(float));
    e->inputs = strata_xcalloc((size_t)e->B * e->T, sizeof(int32_t));
    e->targets = strata_xcalloc((size_t)e->B * e->T, sizeof(int32_t));
    return e;
}

void strata_engine_destroy(strata_engine *e) {
    if (!e) return;
    if (e->dev) {
        strata_device *d = e->dev;
        d->ops->sync_all(d);
        strata_event_destroy(d, e->ev_compute);
        strata_event_destroy(d, e->ev_reduced);
        strata_stream_destroy(d, e->acc_stream);
        strata_event_destroy(d, e->ev_grad_slot_free[0]);
        strata_event_destroy(d, e->ev_grad_slot_free[1]);
        strata_event_destroy(d, e->ev_embed_grad_free);
        strata_event_destroy(d, e->ev_embed_gathered);
        for (int k = 0; k < 2; k++) strata_event_destroy(d, e->ev_red_free[k]);
        strata_event_destroy(d, e->ev_embed_free);
        for (int k = 0; k < e->n_slots; k++) {
            strata_event_destroy(d, e->ev_gathered[k]);
            strata_event_destroy(d, e->ev_slot_free[k]);
            if (e->ev_fetched) strata_event_destroy(d, e->ev_fetched[k]);
        }
        strata_event_destroy(d, e->ev_embed_fetched);
        for (int u = 0; u < e->U && e->ev_update; u++) {
            if (e->ev_params_ready[u] != e->ev_update[u]) strata_event_destroy(d, e->ev_params_ready[u]);
            strata_event_destroy(d, e->ev_update[u]);
        }
    }
    if (e->off) e->off->ops->destroy(e->off);
    free(e->ev_update);
    free(e->ev_params_ready);
    free(e->gather_pending);
    free(e->ev_gathered);
    free(e->ev_fetched);
    free(e->pin_slot);
    free(e->ev_slot_free);
    free(e->padded);
    free(e->shard);
    free(e->params_full);
    free(e->params_shard);
    free(e->grads_full);
    free(e->grad_acc);
    free(e->master);
    free(e->mom1);
    free(e->mom2);
    free(e->slot);
    free(e->ops);
    free(e->gather_unit);
    free(e->loss_sum_host);
    free(e->inputs);
    free(e->targets);
    free(e);
}

strata_engine_memory strata_engine_get_memory(const strata_engine *e) { return e->mem; }
const size_t *strata_engine_padded(const strata_engine *e) { return e->padded; }

/* ---- small helpers ---- */

static strata_stream *comm_stream(strata_engine *e) { return strata_comm_stream(e->comm); }

/* Compute waiting for the collective stream: timed, so a step's metrics show how long
 * compute sat idle on communication. */
static void compute_wait(strata_engine *e, strata_event *ev) {
    double t0 = strata_now_ms();
    strata_stream_wait_event(e->dev, e->dev->compute, ev);
    e->comm_wait_ms += strata_now_ms() - t0;
}
static void comm_sync(strata_engine *e) {
    double t0 = strata_now_ms();
    strata_stream_sync(e->dev, comm_stream(e));
    if (e->acc_stream) strata_stream_sync(e->dev, e->acc_stream);
    e->comm_wait_ms += strata_now_ms() - t0;
}

/* Makes the collective stream wait for everything enqueued on compute so far. */
static void comm_after_compute(strata_engine *e) {
    strata_event_record(e->dev, e->ev_compute, e->dev->compute);
    strata_stream_wait_event(e->dev, comm_stream(e), e->ev_compute);
}

/* Without overlap, each collective completes before compute goes on (the baseline the
 * overlap benchmark compares against). */
static void maybe_serialize(strata_engine *e) {
    if (!e->overlap) comm_sync(e);
}

static void accumulate_run(void *arg) {
    accumulate_task *t = arg;
    if (t->overwrite) strata_kernels_cpu.convert(NULL, t->dst, STRATA_F32, t->src, t->src_dtype, t->n);
    else strata_kernels_cpu.accumulate_f32(NULL, t->dst, t->src, t->src_dtype, t->n);
}

/* After a collective enqueued on the collective stream: dst (fp32, n) = or += src (of
 * src_dtype), off the compute stream (a kernel on the accumulate stream on a GPU, a host
 * task on the collective stream's worker on the CPU); `done` is recorded after it. */
static int land_reduced(strata_engine *e, float *dst, const void *src, strata_dtype src_dtype, size_t n, int overwrite,
                        accumulate_task *task, strata_event *done) {
    if (e->acc_stream) {
        strata_event_record(e->dev, e->ev_reduced, comm_stream(e));
        strata_stream_wait_event(e->dev, e->acc_stream, e->ev_reduced);
        if (overwrite) e->dev->k->convert(e->acc_stream, dst, STRATA_F32, src, src_dtype, n);
        else e->dev->k->accumulate_f32(e->acc_stream, dst, src, src_dtype, n);
        strata_event_record(e->dev, done, e->acc_stream);
        return 0;
    }
    *task = (accumulate_task){dst, src, src_dtype, n, overwrite};
    if (strata_host_task(e->dev, comm_stream(e), accumulate_run, task)) return -1;
    strata_event_record(e->dev, done, comm_stream(e));
    return 0;
}

/* train.grad_reduce_dtype bf16: unit u's fp32 gradient `full` (padded elements) reduced in
 * bf16, the result landed in dst: all-reduce (all == 1: every element, into dst = full) or
 * reduce-scatter (this rank's block, into dst, overwritten or accumulated). The fp32
 * gradient is free once converted, so `full_free` is recorded on compute right then. */
static int reduce_unit_bf16(strata_engine *e, int u, const float *full, int all, float *dst, int overwrite,
                            strata_event *full_free) {
    strata_device *d = e->dev;
    int k = e->next_red;
    e->next_red ^= 1;
    size_t P = e->padded[u], S = e->shard[u];
    compute_wait(e, e->ev_red_free[k]);
    d->k->convert(d->compute, e->red_buf[k], STRATA_BF16, full, STRATA_F32, P);
    if (full_free) strata_event_record(d, full_free, d->compute);
    comm_after_compute(e);
    const uint16_t *mine = (const uint16_t *)e->red_buf[k] + (all ? 0 : (size_t)e->rank * S);
    int rc = all ? strata_allreduce_bf16(e->comm, e->red_buf[k], P)
                 : strata_reduce_scatter_bf16(e->comm, (void *)mine, e->red_buf[k], S);
    if (rc || land_reduced(e, dst, mine, STRATA_BF16, all ? P : S, overwrite, &e->red_task[k], e->ev_red_free[k]))
        return -1;
    maybe_serialize(e);
    return 0;
}

/* Reduce-scatters unit u's full gradient `full` in place and adds this rank's block into
 * the shard accumulator, all on the collective stream; `done` is recorded after. */
static int reduce_unit_grad(strata_engine *e, int u, float *full, accumulate_task *task, int first_micro,
                            strata_event *done) {
    if (e->reduce_bf16) return reduce_unit_bf16(e, u, full, 0, e->grad_acc[u], first_micro, done);
    comm_after_compute(e);
    float *mine = full + (size_t)e->rank * e->shard[u];
    if (strata_reduce_scatter(e->comm, mine, full, e->shard[u])) return -1;
    if (land_reduced(e, e->grad_acc[u], mine, STRATA_F32, e->shard[u], first_micro, task, done)) return -1;
    maybe_serialize(e);
    return 0;
}

static int offload_ready(strata_engine *e) { return e->off ? e->off->ops->open(e->off) : 0; }

/* The offloaded update of the last step runs behind the next step's forward (each unit's
 * forward waits for its own update); whatever reads the optimizer state or the
 * parameters from the host side (eval, checkpoints, sampling) waits for all of it here,
 * and an error any update hit surfaces here. */
static int gather_updated(strata_engine *e, int u);

static int finish_updates(strata_engine *e) {
    if (!e->off || !e->dev) return 0;
    double t0 = strata_now_ms();
    int rc = 0;
    for (int u = 0; u < e->U && !rc; u++) rc = gather_updated(e, u);
    if (e->off->ops->sync(e->off)) rc = -1;
    comm_sync(e);
    e->offload_wait_ms += strata_now_ms() - t0;
    return rc;
}

/* Compute waiting for unit u's offloaded update (and its all-gather), timed apart from
 * waits on collectives. */
static void wait_params_ready(strata_engine *e, int u) {
    double t0 = strata_now_ms();
    strata_stream_wait_event(e->dev, e->dev->compute, e->ev_params_ready[u]);
    e->offload_wait_ms += strata_now_ms() - t0;
}

/* Element range of unit u this rank's optimizer state covers. */
static size_t opt_lo(const strata_engine *e, int u) { return e->stage == 0 ? 0 : (size_t)e->rank * e->shard[u]; }
static size_t opt_n(const strata_engine *e, int u) { return e->stage == 0 ? e->padded[u] : e->shard[u]; }

/* Where this rank's optimizer range of unit u puts its parameters (compute dtype). */
static void *param_dest(strata_engine *e, int u) {
    if (e->stage == 0) return e->params_full[u];
    if (e->stage <= 2) return (char *)e->params_full[u] + (size_t)e->rank * e->shard[u] * e->es;
    return e->params_shard[u]; /* NULL when the shards live on NVMe */
}

/* Publishes the master weights as the compute-dtype parameters forward reads: convert
 * this rank's part, then (stages 1-2) all-gather the full buffers. */
static int publish_params(strata_engine *e) {
    const strata_kernels *k = e->dev->k;
    if (e->off) {
        /* the master weights are in host memory or on NVMe: convert on the host, copy over */
        size_t max_n = 0;
        for (int u = 0; u < e->U; u++) max_n = opt_n(e, u) > max_n ? opt_n(e, u) : max_n;
        float *host = strata_xmalloc(max_n * sizeof(float));
        void *conv = strata_xmalloc(max_n * e->es);
        int rc = 0;
        for (int u = 0; u < e->U && !rc; u++) {
            size_t n = opt_n(e, u);
            rc = e->off->ops->read_state(e->off, u, STRATA_STATE_MASTER, host);
            if (rc) break;
            strata_kernels_cpu.convert(NULL, conv, e->dtype, host, STRATA_F32, n);
            if (e->params_nvme) {
                rc = e->off->ops->write_params(e->off, u, conv);
                continue;
            }
            strata_memcpy_async(e->dev, e->dev->compute, param_dest(e, u), conv, n * e->es);
            strata_stream_sync(e->dev, e->dev->compute);
            if (e->stage >= 1 && e->stage <= 2) {
                comm_after_compute(e);
                if (strata_allgather(e->comm, e->params_full[u], param_dest(e, u), e->shard[u] * e->es)) rc = -1;
            }
        }
        strata_stream_sync(e->dev, comm_stream(e));
        free(host);
        free(conv);
        return rc;
    }
    for (int u = 0; u < e->U; u++) {
        size_t S = e->shard[u];
        if (e->stage == 0) {
            k->convert(e->dev->compute, e->params_full[u], e->dev->compute_dtype, e->master[u], STRATA_F32, e->padded[u]);
        } else if (e->stage <= 2) {
            void *mine = (char *)e->params_full[u] + (size_t)e->rank * S * e->es;
            k->convert(e->dev->compute, mine, e->dev->compute_dtype, e->master[u], STRATA_F32, S);
            comm_after_compute(e);
            if (strata_allgather(e->comm, e->params_full[u], mine, S * e->es)) return -1;
        } else {
            k->convert(e->dev->compute, e->params_shard[u], e->dev->compute_dtype, e->master[u], STRATA_F32, S);
        }
    }
    strata_stream_sync(e->dev, comm_stream(e));
    return 0;
}


int strata_engine_init_params(strata_engine *e, uint64_t seed) {
    size_t max_n = 0;
    for (int u = 0; u < e->U; u++) max_n = opt_n(e, u) > max_n ? opt_n(e, u) : max_n;
    float *host = strata_xmalloc(max_n * sizeof(float));
    if (offload_ready(e)) {
        free(host);
        return -1;
    }
    for (int u = 0; u < e->U; u++) {
        size_t lo = opt_lo(e, u), n = opt_n(e, u);
        strata_model_init_params(e->m, u, seed, lo, lo + n, host);
        if (e->off) {
            int rc = e->off->ops->write_state(e->off, u, STRATA_STATE_MASTER, host);
            memset(host, 0, n * sizeof(float));
            if (!rc) rc = e->off->ops->write_state(e->off, u, STRATA_STATE_M, host);
            if (!rc) rc = e->off->ops->write_state(e->off, u, STRATA_STATE_V, host);
            if (rc) {
                free(host);
                return -1;
            }
            continue;
        }
        strata_memcpy_async(e->dev, e->dev->compute, e->master[u], host, n * 4);
        strata_memset_async(e->dev, e->dev->compute, e->mom1[u], 0, n * 4);
        strata_memset_async(e->dev, e->dev->compute, e->mom2[u], 0, n * 4);
        strata_stream_sync(e->dev, e->dev->compute); /* host buffer is reused next unit */
    }
    free(host);
    return publish_params(e);
}

/* ---- offload ---- */



/* Stages 1-2: the all-gather of unit u's updated shard, once its update is done. */
static int gather_updated(strata_engine *e, int u) {
    if (!e->gather_pending || !e->gather_pending[u]) return 0;
    e->gather_pending[u] = 0;
    strata_stream_wait_event(e->dev, comm_stream(e), e->ev_update[u]);
    if (strata_allgather(e->comm, e->params_full[u], param_dest(e, u), e->shard[u] * e->es)) return -1;
    return strata_event_record(e->dev, e->ev_params_ready[u], comm_stream(e));
}

/* ---- stage 3 gathers ---- */

/* Stage 3: all-gathers unit u's shard into dst on the collective stream once dst's last
 * reader is done (dst_free) and so is the unit's offloaded update, then records gathered.
 * With offload.params: nvme the shard is first read from the offload file into the pinned
 * buffer `pin` (named by `tag`) on the param stream; pin is free once its last gather,
 * `gathered`'s previous record, is done. */
static int gather_shard(strata_engine *e, int u, void *dst, strata_event *dst_free, void *pin, int tag,
                        strata_event *fetched, strata_event *gathered) {
    strata_device *d = e->dev;
    strata_stream_wait_event(d, comm_stream(e), dst_free);
    const void *shard = e->params_shard[u];
    if (e->params_nvme) {
        strata_stream *ps = e->off->ops->param_stream(e->off);
        strata_stream_wait_event(d, ps, e->ev_update[u]);
        strata_stream_wait_event(d, ps, gathered);
        if (e->off->ops->fetch_params(e->off, u, pin, tag)) return -1;
        strata_event_record(d, fetched, ps);
        strata_stream_wait_event(d, comm_stream(e), fetched);
        shard = pin;
    } else if (e->off) {
        strata_stream_wait_event(d, comm_stream(e), e->ev_update[u]);
    }
    if (strata_allgather(e->comm, dst, shard, e->shard[u] * e->es)) return -1;
    return strata_event_record(d, gathered, comm_stream(e));
}

static int issue_gathers(strata_engine *e, int upto) {
    if (upto >= e->n_gathers) upto = e->n_gathers - 1;
    while (e->issued <= upto) {
        int g = e->issued++, s = g % e->n_slots, u = e->gather_unit[g];
        if (gather_shard(e, u, e->slot[s], e->ev_slot_free[s], e->pin_slot ? e->pin_slot[s] : NULL, s,
                         e->ev_fetched ? e->ev_fetched[s] : NULL, e->ev_gathered[s]))
            return -1;
    }
    return 0;
}

static int gather_embed(strata_engine *e) {
    if (gather_shard(e, 0, e->embed_param, e->ev_embed_free, e->pin_embed, e->n_slots, e->ev_embed_fetched,
                     e->ev_embed_gathered))
        return -1;
    compute_wait(e, e->ev_embed_gathered);
    e->m->params[0] = e->embed_param;
    return 0;
}

/* Points m->params[u] at unit u's parameters for op `op`, gathering ahead under stage 3. */
static int params_for(strata_engine *e, const unit_op *op, const unit_op *prev) {
    if (e->stage < 3) {
        if (e->off && !op->backward) {
            double t0 = strata_now_ms();
            int rc = gather_updated(e, op->unit);
            e->offload_wait_ms += strata_now_ms() - t0;
            if (rc) return -1;
            wait_params_ready(e, op->unit);
        }
        e->m->params[op->unit] = e->params_full[op->unit];
        return 0;
    }
    if (prev && prev->gather >= 0 && prev->gather != op->gather) /* release the previous slot */
        strata_event_record(e->dev, e->ev_slot_free[prev->gather % e->n_slots], e->dev->compute);
    if (op->gather < 0) return 0;
    if (issue_gathers(e, op->gather + e->cfg->zero.prefetch_units)) return -1;
    int s = op->gather % e->n_slots;
    compute_wait(e, e->ev_gathered[s]);
    e->m->params[op->unit] = e->slot[s];
    return 0;
}

/* ---- the step ---- */

static int load_micro_batch(strata_engine *e, strata_loader *L, uint64_t first) {
    double t0 = strata_now_ms();
    int rc = strata_loader_read(L, first, e->B, e->inputs, e->targets);
    e->data_ms += strata_now_ms() - t0;
    if (rc) return -1;
    strata_model_set_batch(e->m, e->inputs, e->targets);
    return 0;
}

/* Gradient destination for unit u's backward in this micro-step (stages 2-3 hand out a
 * zeroed slot once the collective stream is done with its previous contents). */
static void grads_for(strata_engine *e, int u, int micro) {
    strata_model *m = e->m;
    if (e->stage <= 1) {
        m->grads[u] = e->grads_full[u];
        return;
    }
    if (u == 0) return; /* the embedding's buffer was set up at the micro-step's start */
    int k = e->next_grad_slot;
    compute_wait(e, e->ev_grad_slot_free[k]);
    strata_memset_async(e->dev, e->dev->compute, e->grad_slot[k], 0, e->padded[u] * 4);
    m->grads[u] = e->grad_slot[k];
}

static int after_backward(strata_engine *e, int u, int micro) {
    int last = micro == e->A - 1;
    if (e->stage == 0) {
        if (!last) return 0;
        if (e->reduce_bf16) return reduce_unit_bf16(e, u, e->grads_full[u], 1, e->grads_full[u], 1, NULL);
        comm_after_compute(e);
        if (strata_allreduce(e->comm, e->grads_full[u], e->padded[u])) return -1;
        maybe_serialize(e);
        return 0;
    }
    if (e->stage == 1) {
        if (!last) return 0;
        float *mine = e->grads_full[u] + (size_t)e->rank * e->shard[u];
        if (e->reduce_bf16) return reduce_unit_bf16(e, u, e->grads_full[u], 0, mine, 1, NULL);
        comm_after_compute(e);
        if (strata_reduce_scatter(e->comm, mine, e->grads_full[u], e->shard[u])) return -1;
        maybe_serialize(e);
        return 0;
    }
    if (u == 0) return reduce_unit_grad(e, 0, e->embed_grad, &e->embed_task, micro == 0, e->ev_embed_grad_free);
    int k = e->next_grad_slot;
    e->next_grad_slot ^= 1;
    return reduce_unit_grad(e, u, e->grad_slot[k], &e->slot_task[k], micro == 0, e->ev_grad_slot_free[k]);
}

static float *opt_grad(strata_engine *e, int u) {
    if (e->stage == 0) return e->grads_full[u];
    if (e->stage == 1) return e->grads_full[u] + (size_t)e->rank * e->shard[u];
    return e->grad_acc[u];
}

/* Stages 0-1 zero a unit's gradient just before its first backward of the step rather
 * than at the step's start: the previous step's offloaded update may still be reading
 * it. The head's backward is the first to add to the (tied) embedding's gradient. */
static void zero_grads_before_backward(strata_engine *e, int u) {
    int head = e->U - 1;
    if (u == 0) return;
    strata_memset_async(e->dev, e->dev->compute, e->grads_full[u], 0, e->padded[u] * 4);
    if (u == head) strata_memset_async(e->dev, e->dev->compute, e->grads_full[0], 0, e->padded[0] * 4);
}

static int run_micro_step(strata_engine *e, strata_loader *L, int64_t step, int micro, float dloss,
                          float loss_scale, strata_step_result *r) {
    strata_model *m = e->m;
    strata_device *d = e->dev;
    if (load_micro_batch(e, L, strata_batch_seq(step, micro, e->rank, 0, e->world, e->A, e->B))) return -1;
    if (e->stage <= 1) /* the head's backward adds to the embedding's gradient: set it up front */
        for (int u = 0; u < e->U; u++) m->grads[u] = e->grads_full[u];
    if (e->stage >= 2) {
        compute_wait(e, e->ev_embed_grad_free);
        strata_memset_async(d, d->compute, e->embed_grad, 0, e->padded[0] * 4);
        m->grads[0] = e->embed_grad;
    }
    if (e->stage == 3) {
        e->issued = 0;
        if (gather_embed(e)) return -1;
    }
    const unit_op *prev = NULL;
    for (int i = 0; i < e->n_ops; i++) {
        const unit_op *op = &e->ops[i];
        if (op->backward && !prev->backward) r->backward_start_ms = strata_now_ms();
        if (params_for(e, op, prev)) return -1;
        if (!op->backward) {
            strata_model_forward_unit(m, op->unit, 1, dloss, loss_scale);
        } else {
            if (e->stage <= 1 && micro == 0) zero_grads_before_backward(e, op->unit);
            grads_for(e, op->unit, micro);
            strata_model_backward_unit(m, op->unit);
            if (after_backward(e, op->unit, micro)) return -1;
        }
        prev = op;
    }
    r->backward_end_ms = strata_now_ms();
    if (e->stage == 3) strata_event_record(d, e->ev_embed_free, d->compute);
    return 0;
}

/* AdamW over elements [lo, lo+n) of unit u, split at tensor boundaries so weight decay
 * applies to matrices only. */
static void adamw_unit(strata_engine *e, int u, size_t lo, size_t n, void *param_out, const strata_adamw_args *base) {
    const strata_kernels *k = e->dev->k;
    float *w = e->master[u], *g = opt_grad(e, u), *m1 = e->mom1[u], *m2 = e->mom2[u];
    strata_adamw_segment seg[STRATA_ADAMW_MAX_SEGMENTS];
    int n_seg = strata_adamw_segments(e->m, u, lo, n, seg);
    for (int i = 0; i < n_seg; i++) {
        strata_adamw_args a = *base;
        if (!seg[i].decay) a.weight_decay = 0.0f;
        size_t off = seg[i].lo;
        void *out = param_out ? (char *)param_out + off * e->es : NULL;
        k->adamw(e->dev->compute, w + off, out, g + off, m1 + off, m2 + off, seg[i].n, &a);
    }
}

/* A device fault recorded in the micro-steps (out of memory: a kernel or copy that did not
 * run, core/common.h) spoils this step. It poisons the step's loss, so the step-end
 * agreement finds it not finite on every rank and every rank skips the update, as for a
 * NaN: the state stays the last completed step's, and the caller, finding the fault
 * (strata_fault_take), may checkpoint it. STRATA_FAULT_OOM_STEP=N injects such a fault at
 * optimizer step N (counted from 1, as in the progress line). */
static void poison_on_fault(strata_engine *e, int64_t step) {
    const char *oom = getenv("STRATA_FAULT_OOM_STEP");
    if (oom && atoll(oom) == step + 1)
        strata_fault_record(1, "cudaMalloc of %zu bytes (unit 0's gradient) failed: out of memory "
                               "(injected by STRATA_FAULT_OOM_STEP=%s)", e->padded[0] * 4, oom);
    if (strata_fault_peek(NULL, 0)) /* all bits set: a NaN */
        strata_memset_async(e->dev, e->dev->compute, e->m->loss_sum, 0xff, sizeof(float));
}

int strata_engine_step(strata_engine *e, strata_loader *L, int64_t step, strata_step_result *r) {
    strata_device *d = e->dev;
    memset(r, 0, sizeof *r);
    e->comm_wait_ms = e->data_ms = e->offload_wait_ms = 0;
    strata_model *m = e->m;
    size_t BT = (size_t)e->B * e->T;
    /* each token's weight in the step's mean loss over all ranks and micro-steps */
    float dloss = 1.0f / (float)(BT * (size_t)e->world * (size_t)e->A);
    float loss_scale = 1.0f / (float)(BT * (size_t)e->A);
    strata_memset_async(d, d->compute, m->loss_sum, 0, sizeof(float));
    for (int micro = 0; micro < e->A; micro++)
        if (run_micro_step(e, L, step, micro, dloss, loss_scale, r)) return -1;
    comm_sync(e);
    poison_on_fault(e, step);

    /* global gradient norm: each rank sums squares over the elements it owns */
    double sums[2] = {0.0, 0.0};
    strata_memset_async(d, d->compute, e->norm_sum, 0, sizeof(double));
    for (int u = 0; u < e->U; u++) {
        size_t lo = (size_t)e->rank * e->shard[u], n = e->shard[u];
        const float *g = e->stage == 0 ? e->grads_full[u] + lo : opt_grad(e, u);
        d->k->sumsq(d->compute, e->norm_sum, g, n);
    }
    strata_memcpy_async(d, d->compute, &sums[0], e->norm_sum, sizeof(double));
    strata_memcpy_async(d, d->compute, e->loss_sum_host, m->loss_sum, sizeof(float));
    strata_stream_sync(d, d->compute);
    sums[1] = *e->loss_sum_host;
    /* Fault injection for tests of the NaN path: STRATA_FAULT_NAN_STEP=N poisons step N's
     * loss on this rank (optimizer steps count from 1, as in the progress line). */
    const char *fault = getenv("STRATA_FAULT_NAN_STEP");
    if (fault && atoll(fault) == step + 1) sums[1] = NAN;
    if (strata_allreduce_host_f64(e->comm, sums, 2)) return -1;
    r->grad_norm = sqrt(sums[0]);
    r->loss = sums[1] / e->world;
    r->lr = strata_lr_at(e->cfg, step);
    r->offload_wait_ms = e->offload_wait_ms;
    if (!isfinite(r->grad_norm) || !isfinite(r->loss)) {
        r->nonfinite = 1; /* every rank saw the same sums, so every rank skips the update */
        return 0;
    }
    float clip = (float)e->cfg->optim.grad_clip;
    float scale = clip > 0 && r->grad_norm > clip ? (float)(clip / (r->grad_norm + 1e-6)) : 1.0f;
    strata_adamw_args args = strata_adamw_args_at(e->cfg, step, scale);
    if (e->off) {
        /* every gradient is final (the collective stream was synced): the CPU updates unit
         * by unit, in forward order, and once this returns the next step's forward follows
         * unit by unit, each unit's all-gather (stages 1-2) issued just before it */
        /* the previous step's updates finished behind this step's forward (so this costs no
         * wait); their errors surface here, and their task records are free to refill */
        if (e->off->ops->sync(e->off)) return -1;
        strata_event_record(d, e->ev_compute, d->compute);
        strata_adamw_segment seg[STRATA_ADAMW_MAX_SEGMENTS];
        for (int u = 0; u < e->U; u++) {
            int n_seg = strata_adamw_segments(e->m, u, opt_lo(e, u), opt_n(e, u), seg);
            if (e->off->ops->update(e->off, u, opt_grad(e, u), param_dest(e, u), seg, n_seg, &args, e->ev_compute,
                                    e->ev_update[u]))
                return -1;
            if (e->stage >= 1 && e->stage <= 2) e->gather_pending[u] = 1;
        }
        r->offload_wait_ms = e->offload_wait_ms;
        r->comm_wait_ms = e->comm_wait_ms;
        r->data_ms = e->data_ms;
        return 0;
    }
    for (int u = 0; u < e->U; u++) {
        size_t S = e->shard[u];
        if (e->stage == 0) {
            adamw_unit(e, u, 0, e->padded[u], e->params_full[u], &args);
        } else if (e->stage <= 2) {
            void *mine = (char *)e->params_full[u] + (size_t)e->rank * S * e->es;
            adamw_unit(e, u, (size_t)e->rank * S, S, mine, &args);
            comm_after_compute(e);
            if (strata_allgather(e->comm, e->params_full[u], mine, S * e->es)) return -1;
        } else {
            adamw_unit(e, u, (size_t)e->rank * S, S, e->params_shard[u], &args);
        }
    }
    comm_sync(e);
    r->comm_wait_ms = e->comm_wait_ms;
    r->data_ms = e->data_ms;
    return 0;
}

int strata_engine_sync(strata_engine *e) { return finish_updates(e); }

int strata_engine_eval(strata_engine *e, strata_loader *L, int n_batches, double *loss) {
    if (finish_updates(e)) return -1;
    strata_device *d = e->dev;
    strata_model *m = e->m;
    size_t BT = (size_t)e->B * e->T;
    strata_memset_async(d, d->compute, m->loss_sum, 0, sizeof(float));
    for (int b = 0; b < n_batches; b++) {
        uint64_t first = ((uint64_t)b * e->world + e->rank) * e->B;
        if (load_micro_batch(e, L, first)) return -1;
        if (e->stage == 3) {
            e->issued = 0;
            if (gather_embed(e)) return -1;
        }
        const unit_op *prev = NULL;
        for (int i = 0; i < e->n_ops && !e->ops[i].backward; i++) {
            if (params_for(e, &e->ops[i], prev)) return -1;
            strata_model_forward_unit(m, e->ops[i].unit, 0, 0.0f, 1.0f / (float)(BT * n_batches));
            prev = &e->ops[i];
        }
        if (e->stage == 3) {
            /* release the last slot and the embedding; skip the gathers the backward would use */
            strata_event_record(d, e->ev_slot_free[prev->gather % e->n_slots], d->compute);
            strata_event_record(d, e->ev_embed_free, d->compute);
            strata_stream_sync(d, comm_stream(e));
            for (int k = 0; k < e->n_slots; k++) strata_event_record(d, e->ev_slot_free[k], d->compute);
        }
    }
    strata_stream_sync(d, comm_stream(e));
    strata_memcpy_async(d, d->compute, e->loss_sum_host, m->loss_sum, sizeof(float));
    strata_stream_sync(d, d->compute);
    double sum = *e->loss_sum_host;
    if (strata_allreduce_host_f64(e->comm, &sum, 1)) return -1;
    *loss = sum / e->world;
    return 0;
}

/* ---- checkpoints ---- */

/* Host copies of this rank's standard shards (the optimizer state may live on a GPU). */
static float *copy_standard_shards(strata_engine *e, const float *(*ptrs)[STRATA_CKPT_KINDS]) {
    size_t total = 0;
    for (int u = 0; u < e->U; u++) total += 3 * e->shard[u];
    float *host = strata_xmalloc(total * sizeof(float));
    float *p = host;
    float *tmp = e->off ? strata_xmalloc(e->max_opt_n * sizeof(float)) : NULL;
    for (int u = 0; u < e->U; u++) {
        size_t lo = e->stage == 0 ? (size_t)e->rank * e->shard[u] : 0, S = e->shard[u];
        if (e->off) { /* state in pinned memory or on NVMe: read it, keep the standard shard */
            for (int k = 0; k < 3; k++) {
                if (e->off->ops->read_state(e->off, u, k, tmp)) {
                    free(tmp);
                    free(host);
                    return NULL;
                }
                memcpy(p, tmp + lo, S * 4);
                ptrs[u][k] = p;
                p += S;
            }
            continue;
        }
        float *src[3] = {e->master[u] + lo, e->mom1[u] + lo, e->mom2[u] + lo};
        for (int k = 0; k < 3; k++) {
            strata_memcpy_async(e->dev, e->dev->compute, p, src[k], S * 4);
            ptrs[u][k] = p;
            p += S;
        }
    }
    strata_stream_sync(e->dev, e->dev->compute);
    free(tmp);
    return host;
}

int strata_engine_save(strata_engine *e, const char *run_dir, const strata_ckpt_meta *meta,
                       char *final_dir, size_t final_len) {
    char tmp[STRATA_PATH_MAX];
    int64_t step = meta->step;
    double failed = 0;
    if (strata_ckpt_tmp_dir(tmp, sizeof tmp, run_dir, step) || strata_ckpt_make_dir(tmp)) failed = 1;
    if (!failed && finish_updates(e)) failed = 1;
    const float *(*ptrs)[STRATA_CKPT_KINDS] = strata_xcalloc(e->U, sizeof *ptrs);
    float *host = NULL;
    strata_ckpt_layout layout = strata_model_layout(e->m, e->padded);
    if (!failed) {
        host = copy_standard_shards(e, ptrs);
        if (!host) failed = 1;
    }
    if (!failed) {
        if (strata_ckpt_write_rank(tmp, &layout, e->rank, e->world, (const float *const(*)[STRATA_CKPT_KINDS])ptrs))
            failed = 1;
    }
    char err[1024] = "";
    if (failed) snprintf(err, sizeof err, "%s", strata_error());
    free(host);
    free(ptrs);
    /* every rank's files are on disk (or someone failed) before rank 0 commits */
    if (strata_allreduce_host_f64(e->comm, &failed, 1)) return -1;
    if (failed) return strata_fail("checkpoint of step %lld not written: %s", (long long)step,
                                   err[0] ? err : "another rank failed to write its shard");
    double commit_failed = 0;
    if (e->rank == 0 && strata_ckpt_commit(run_dir, tmp, &layout, meta, e->cfg->run.keep, final_dir, final_len)) {
        commit_failed = 1;
        snprintf(err, sizeof err, "%s", strata_error());
    }
    if (strata_allreduce_host_f64(e->comm, &commit_failed, 1)) return -1;
    if (commit_failed) return strata_fail("checkpoint of step %lld not committed: %s", (long long)step,
                                          err[0] ? err : "rank 0 failed to commit it");
    return 0;
}

int strata_engine_load(strata_engine *e, strata_ckpt *ck) {
    strata_ckpt_layout layout = strata_model_layout(e->m, e->padded);
    if (strata_ckpt_check_layout(ck, &layout)) return -1;
    if (offload_ready(e) || finish_updates(e)) return -1;
    size_t max_n = 0;
    for (int u = 0; u < e->U; u++) max_n = opt_n(e, u) > max_n ? opt_n(e, u) : max_n;
    float *host = strata_xmalloc(max_n * sizeof(float));
    int rc = 0;
    for (int u = 0; u < e->U && !rc; u++) {
        size_t lo = opt_lo(e, u), n = opt_n(e, u);
        float *dst[3] = {e->master[u], e->mom1[u], e->mom2[u]};
        for (int k = 0; k < 3 && !rc; k++) {
            rc = strata_ckpt_read_range(ck, u, k, lo, lo + n, host);
            if (rc) break;
            if (e->off) {
                rc = e->off->ops->write_state(e->off, u, k, host);
                continue;
            }
            strata_memcpy_async(e->dev, e->dev->compute, dst[k], host, n * 4);
            strata_stream_sync(e->dev, e->dev->compute);
        }
    }
    free(host);
    /* every rank must agree it loaded before anyone trains */
    double failed = rc != 0;
    char err[1024];
    snprintf(err, sizeof err, "%s", rc ? strata_error() : "");
    if (strata_allreduce_host_f64(e->comm, &failed, 1)) return -1;
    if (failed) return strata_fail("%s", rc ? err : "another rank could not read the checkpoint");
    return publish_params(e);
}

int strata_engine_params_resident(strata_engine *e) {
    if (e->stage == 3) return strata_fail("zero.stage 3 keeps no full copy of the parameters");
    if (finish_updates(e)) return -1;
    for (int u = 0; u < e->U; u++) e->m->params[u] = e->params_full[u];
    return 0;
}

const float *strata_engine_master_shard(const strata_engine *e, int u, size_t *lo, size_t *n) {
    *lo = (size_t)e->rank * e->shard[u];
    *n = e->shard[u];
    return e->stage == 0 ? e->master[u] + *lo : e->master[u];
}

size_t strata_engine_nvme_bytes(const strata_engine *e) { return e->off ? e->off->ops->nvme_bytes(e->off) : 0; }
size_t strata_engine_nvme_param_bytes(const strata_engine *e) {
    return e->off ? e->off->ops->nvme_param_bytes(e->off) : 0;
}
