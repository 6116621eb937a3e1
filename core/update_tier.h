/* core/update_tier.h: the optimizer's update tier, the interface through which the ZeRO
 * engine (shard/engine.c) drives an optimizer whose state does not live on the device.
 *
 * The engine is handed a tier when it is created, or none. With none, the fp32 master
 * weights and Adam moments of the rank's optimizer ranges live in device memory and the
 * device's AdamW kernel updates them on the compute stream. A tier keeps that state
 * elsewhere and updates it off the compute stream; offload/pipeline.c is the one there
 * is (pinned host memory or an NVMe file, updated by the CPU), and the launcher builds it
 * from the config (strata_offload_tier) so that shard/ never sees offload/.
 *
 * The engine meets a tier's work only through events, as it meets the collectives:
 * `update` starts after an event and records `done` when the unit's new parameters are in
 * place. Every call comes from the engine's thread, in unit order. */
#ifndef STRATA_UPDATE_TIER_H
#define STRATA_UPDATE_TIER_H

#include <stddef.h>
#include <stdint.h>

#include "core/arena.h"
#include "core/device.h"
#include "core/kernels.h"
#include "core/optim.h"

/* The arrays of an optimizer range of n elements, by how optim.state stores the moments:
 *   MASTER   n fp32, always
 *   M, V     n fp32 (fp32 state), n bf16 (bf16), or n 8-bit codes (int8: the signed map for
 *            M, the unsigned one for V; core/quant.h)
 *   M_ABSMAX, V_ABSMAX  int8: one fp32 per 2048-element block, ceil(n / 2048)
 *   M_SMALL, V_SMALL    int8: the fp32 moments of the range's pieces of tensors under 4096
 *            elements, packed (n_small of them; strata_adamw_segment.small says where)
 * The first three in checkpoint order. */
enum {
    STRATA_STATE_MASTER = 0,
    STRATA_STATE_M = 1,
    STRATA_STATE_V = 2,
    STRATA_STATE_M_ABSMAX = 3,
    STRATA_STATE_V_ABSMAX = 4,
    STRATA_STATE_M_SMALL = 5,
    STRATA_STATE_V_SMALL = 6,
    STRATA_STATE_KINDS = 7
};

/* Bytes of one element of state array `kind` under `state`. */
static inline size_t strata_state_elem_bytes(strata_optim_state state, int kind) {
    if (kind == STRATA_STATE_M || kind == STRATA_STATE_V) return strata_optim_moment_bytes(state);
    return 4;
}

typedef struct strata_update_tier strata_update_tier;

/* Blocking writes of state and parameters start on a multiple of this many elements: 4 KiB
 * of 2-byte parameters or bf16 moments, and so of fp32 state too. 8-bit codes need twice
 * as many (strata_tier_io_align). */
#define STRATA_TIER_IO_ALIGN ((size_t)2048)

/* The element multiple blocking writes start on for state stored as `state` says: 4 KiB of
 * its narrowest array. */
static inline size_t strata_tier_io_align(strata_optim_state state) {
    return state == STRATA_OPTIM_STATE_INT8 ? 2 * STRATA_TIER_IO_ALIGN : STRATA_TIER_IO_ALIGN;
}

/* What a tier's update work cost since the tier was made, by stage: seconds its HOST
 * streams were busy and the bytes they moved. Cumulative, so the difference of two
 * snapshots taken after `sync` is exactly the work in between. Blocking calls from the
 * engine's thread (read_state, write_state, write_params: initialisation and checkpoints)
 * are not counted: they are not a step's work. */
/* The fields, for code that adds or subtracts snapshots field by field. */
#define STRATA_TIER_SECONDS(X) X(d2h_s) X(adamw_s) X(state_wait_s) X(state_write_s) X(h2d_s) X(param_write_s) X(param_read_s)
#define STRATA_TIER_COUNTS(X) X(d2h_bytes) X(h2d_bytes) X(adamw_elements) X(adamw_bytes) X(disk_read_bytes) X(disk_write_bytes)

typedef struct strata_tier_stats {
    double d2h_s;         /* gradients device -> pinned staging */
    double adamw_s;       /* the CPU AdamW itself, waits below excluded */
    double state_wait_s;  /* the AdamW's thread waiting for NVMe state reads (prefetched) */
    double state_write_s; /* the AdamW's thread writing updated NVMe state */
    double h2d_s;         /* updated parameters pinned -> device */
    double param_write_s; /* updated parameter shards to NVMe (offload.params: nvme) */
    double param_read_s;  /* parameter shards read from NVMe for the gathers */
    uint64_t d2h_bytes, h2d_bytes;
    uint64_t adamw_elements;
    uint64_t adamw_bytes; /* host memory the AdamW streams: 28 + param bytes per element with
                           * fp32 moments, 20 + with bf16, 16 + with 8-bit codes */
    uint64_t disk_read_bytes, disk_write_bytes; /* state and parameter shards, 4 KiB-rounded */
} strata_tier_stats;

/* acc += x (sign > 0) or acc -= x, every field. */
static inline void strata_tier_stats_add(strata_tier_stats *acc, const strata_tier_stats *x, int sign) {
#define STRATA_TIER_ADD_(f) acc->f = sign > 0 ? acc->f + x->f : acc->f - x->f;
    STRATA_TIER_SECONDS(STRATA_TIER_ADD_)
    STRATA_TIER_COUNTS(STRATA_TIER_ADD_)
#undef STRATA_TIER_ADD_
}

typedef struct strata_update_tier_ops {
    /* Plans n_units optimizer ranges of n[u] elements each (the engine's ranges: whole
     * units at stage 0, the rank's shards above; 0 for a unit whose state stays on the
     * device, offload.optimizer_ratio, which the tier is never asked about), stored as
     * optim.state says (with int8 state n_small[u] elements of fp32 moments each, else
     * n_small is NULL), and the tier's staging into `a`; updated parameters are written in
     * param_dtype. Once, before the arena is committed. */
    void (*plan)(strata_update_tier *t, strata_arena *a, int n_units, const size_t *n, const size_t *n_small,
                 strata_dtype param_dtype);
    /* After the arena is committed: opens what needs the memory (the NVMe store, which
     * registers the arena's pinned block). Idempotent. */
    int (*open)(strata_update_tier *t);
    void (*destroy)(strata_update_tier *t);

    /* Blocking host access to elements [lo, lo + n) of unit u's state array `kind`
     * (STRATA_STATE_*, elements of strata_state_elem_bytes), for initialisation, checkpoints
     * and publishing parameters, which go through a bounded buffer a chunk at a time. A
     * write of MASTER, M or V starts on a multiple of strata_tier_io_align elements and is
     * a multiple of it long or ends at the array's end (the state may live in an O_DIRECT
     * file); the other kinds (always in memory) and reads may be any range. */
    int (*read_state)(strata_update_tier *t, int u, int kind, size_t lo, size_t n, void *dst);
    int (*write_state)(strata_update_tier *t, int u, int kind, size_t lo, size_t n, const void *src);

    /* Enqueues unit u's AdamW step after `after` (recorded where the gradient was
     * finished; may be NULL). grad: n[u] fp32 in device memory (in pinned host memory with
     * offload.gradients: cpu, where the update reads it in place); param_out: n[u] elements
     * of param_dtype in device memory (NULL when the tier keeps the parameters itself).
     * The segments split the range by weight decay (and, with int8 state, by how each
     * piece's moments are stored). `done` is recorded once the new parameters are written. */
    int (*update)(strata_update_tier *t, int u, const float *grad, void *param_out, const strata_adamw_segment *seg,
                  int n_seg, const strata_adamw_args *args, strata_event *after, strata_event *done);
    /* Waits for every enqueued update; returns the first error any of them hit. */
    int (*sync)(strata_update_tier *t);

    /* Stage 3 with the parameter shards kept by the tier (offload.params: nvme): elements
     * [lo, lo + n) of unit u's compute-dtype shard are written (blocking; lo and n as for
     * write_state), or the whole shard is read into `dst` on the tier's param stream, a
     * HOST stream on which the caller enqueues its waits before the read and its record
     * after it. dst must be 4096-aligned with room for the shard rounded up to 4 KiB;
     * `tag` (0 .. zero.prefetch_units + 2) names the caller's read, so reads into
     * different buffers may be queued at once (the embedding and an untied head share a
     * buffer, one after the other, under two tags). */
    int (*write_params)(strata_update_tier *t, int u, size_t lo, size_t n, const void *src);
    strata_stream *(*param_stream)(strata_update_tier *t);
    int (*fetch_params)(strata_update_tier *t, int u, void *dst, int tag);

    /* Bytes the tier keeps on NVMe, and of them the parameter shards', for the plan. */
    size_t (*nvme_bytes)(const strata_update_tier *t);
    size_t (*nvme_param_bytes)(const strata_update_tier *t);

    /* The work so far (see strata_tier_stats); call it only after `sync`, when no stream
     * is writing the counters. */
    void (*stats)(const strata_update_tier *t, strata_tier_stats *out);
} strata_update_tier_ops;

/* A tier's own struct starts with this one, so its functions find themselves from it. */
struct strata_update_tier {
    const strata_update_tier_ops *ops;
};

#endif
