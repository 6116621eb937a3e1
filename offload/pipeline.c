/* offload/pipeline.c: the offload update tier: optimizer state in pinned memory or on
 * NVMe, updated by the CPU, behind core/update_tier.h's table.
 *
 * A unit's update is three stages on three HOST streams, so the gradient copy of the next
 * unit, the CPU AdamW of this one and the parameter copy of the previous one all run at
 * once:
 *
 *   in  (D2H)   gradient -> grad_stage[b]
 *   run (CPU)   [NVMe state prefetched] AdamW: grad_stage[b] -> state, param_stage[b]
 *   out (H2D)   param_stage[b] -> the unit's parameters; then the caller's `done` event
 *
 * b cycles over offload.buffer_count staging buffers per direction. A unit larger than a
 * buffer (offload.chunk_kb of fp32 gradient) goes through them in chunks of whole 4096-
 * element blocks (4 KiB of the narrowest array: the NVMe reads and writes stay aligned, an
 * 8-bit block's absmax stays whole), each chunk its own trip through the three stages, so
 * pinned staging is bounded by the chunk, not by the largest unit (a 14B model's embedding
 * is 778 M parameters). AdamW is element-wise, so the chunks change no bit. Every wait and
 * record is enqueued by the caller's thread in unit and chunk order, so a wait on ev_x[b]
 * always captures the record made for the chunk that used buffer b before.
 *
 * The state is stored as optim.state says (core/update_tier.h): the master and the two
 * moment arrays (fp32, bf16 or 8-bit codes) in pinned memory or in the unit's blocks of the
 * NVMe file, each rounded up to 4 KiB; with int8 state the blocks' absmax and the fp32
 * moments of small tensors, 0.2% and less of the bytes, always in pinned memory, so the
 * disk holds and moves 6 bytes a parameter instead of 12.
 *
 * The split (core/update_tier.h's strata_tier_stats): each stage's seconds are timed by
 * the thread that runs it, into counters only that thread writes (the copies between
 * two clock tasks on their own stream); bytes the caller enqueues are counted by the
 * caller. `stats` sums them after `sync`, so no counter is read while it is written. */
#include "offload/pipeline.h"

#include <pthread.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/optim.h"
#include "offload/cpu_adam.h"
#include "core/quant.h"
#include "offload/nvme.h"

#define NVME_ALIGN STRATA_NVME_ALIGN
/* chunks start on a multiple of this many elements: 4 KiB of 8-bit codes, two 8-bit blocks */
#define CHUNK_ALIGN ((size_t)4096)

/* offload-out's task when the parameters live on NVMe: write the staged update home;
 * param-in's task: read a unit's parameters for a gather. */
typedef struct param_io {
    struct offload_tier *o;
    int u, b;
    int task; /* a write: the chunk's task */
    void *dst;
} param_io;

/* A HOST stream's busy time around its copies: `start` and `stop` tasks bracket each
 * copy on the stream, so both run on its worker, in order. */
typedef struct stream_clock {
    double t0_ms;
    double busy_s;
} stream_clock;

typedef struct update_task {
    struct offload_tier *o;
    int u, b;
    size_t c0, n; /* the chunk: elements [c0, c0 + n) of unit u's range */
    void *param_host; /* offload.params: cpu: the unit's shard in pinned memory, written in place */
    const float *grad_host; /* offload.gradients: cpu: the chunk's gradient in pinned memory, read in place */
    param_io write;
    strata_adamw_segment seg[STRATA_ADAMW_MAX_SEGMENTS];
    int n_seg;
    strata_adamw_args args;
} update_task;

typedef struct offload_tier {
    strata_update_tier tier; /* first, so offload_of() finds the rest from the engine's pointer */
    const strata_config *cfg;
    strata_arena *arena;
    strata_device *dev;
    int nvme;        /* offload.optimizer: nvme (some units' state is on NVMe, offload.nvme_ratio) */
    unsigned char *on_nvme; /* per unit: its state is on NVMe (else in pinned memory) */
    int params_nvme; /* 1: the units' compute-dtype parameters live on NVMe too (stage 3) */
    int params_host; /* 1: they live in pinned memory (offload.params: cpu): the update writes them there */
    int grads_host;  /* 1: the engine hands over gradients in pinned memory (offload.gradients: cpu): no copy in */
    int n_units, rank;
    size_t *n;
    size_t chunk;             /* elements a staging buffer holds: a multiple of CHUNK_ALIGN */
    size_t max_chunk;         /* the largest chunk any unit has: what the buffers are sized for */
    int *first_task;          /* per unit: its first chunk's index in tasks (chunks in order) */
    int n_tasks;
    size_t *n_small;          /* int8 state: fp32 moments per unit (packed small tensors) */
    strata_dtype param_dtype;
    size_t es;
    strata_optim_state state_type;
    size_t state_es[3];       /* bytes of a master, m, v element */
    void *(*state)[STRATA_STATE_KINDS]; /* per unit and kind: pinned memory (MASTER, M, V: units not on NVMe) */
    void *slot_state[2][3];   /* units on NVMe: two pinned slots per kind, of the largest chunk */
    size_t slot_bytes[3];
    size_t *file_off;         /* units on NVMe: offset of the master's block; m's and v's follow */
    size_t *param_off;        /* params on nvme: per unit, offset of its parameters */
    size_t *param_stride;     /* their bytes, 4096-aligned */
    size_t file_bytes;
    void *param_io;           /* params on nvme: a pinned, aligned slot for blocking I/O */
    strata_stream *param_in;  /* HOST: parameter reads for the gathers */
    param_io *fetch;          /* one per fetch tag */
    int n_fetch;
    int n_buf;                /* staging buffers per direction (offload.buffer_count) */
    int threads;              /* the update's OpenMP threads (offload.cpu_threads resolved); 0: OpenMP's default */
    uint64_t seq;             /* updates enqueued so far: buffer = seq % n_buf */
    float **grad_stage;       /* pinned: gradients on their way to the CPU update */
    void **param_stage;       /* pinned: updated parameters on their way to the device */
    strata_stream *in, *stream, *out; /* HOST: gradient copies, CPU updates, parameter copies */
    /* per buffer: gradient copied in; update done (its gradient read, its parameters
     * written); parameters copied out */
    strata_event **ev_grad_in, **ev_updated, **ev_param_free;
    strata_nvme_store *store;
    update_task *tasks;       /* one per chunk of every unit, in update order */
    int prefetched_task, prefetch_slot, next_slot;
    strata_nvme_ticket prefetch_ticket[3];
    /* the split's counters, each written by one thread only: the caller (bytes it
     * enqueues), the AdamW's worker, the param-in worker, the offload-out worker */
    strata_tier_stats by_caller, by_run, by_param_in, by_out;
    stream_clock clock_in, clock_out;
    pthread_mutex_t mu;
    char error[1024];
} offload_tier;

static offload_tier *offload_of(strata_update_tier *t) { return (offload_tier *)t; }
static const offload_tier *offload_of_const(const strata_update_tier *t) { return (const offload_tier *)t; }

static void reserve_pinned(strata_arena *a, strata_mem_category cat, const char *name, int u, size_t bytes, void **dst) {
    char full[64];
    if (u >= 0) snprintf(full, sizeof full, "%s.%d", name, u);
    else snprintf(full, sizeof full, "%s", name);
    strata_arena_reserve(a, STRATA_MEM_PINNED, cat, full, bytes, dst);
}

/* Elements of state array `kind` of unit u. */
static size_t kind_count(const offload_tier *o, int u, int kind) {
    if (kind < 3) return o->n[u];
    if (o->state_type != STRATA_OPTIM_STATE_INT8) return 0;
    if (kind == STRATA_STATE_M_ABSMAX || kind == STRATA_STATE_V_ABSMAX) return strata_q8_blocks(o->n[u]);
    return o->n_small[u];
}

/* Bytes of kind k (< 3) of unit u in the NVMe file: whole 4 KiB blocks. */
static size_t kind_stride(const offload_tier *o, int u, int k) {
    return strata_round_up(o->n[u] * o->state_es[k], NVME_ALIGN);
}

static void offload_plan(strata_update_tier *t, strata_arena *a, int n_units, const size_t *n, const size_t *n_small,
                         strata_dtype param_dtype) {
    offload_tier *o = offload_of(t);
    const strata_config *cfg = o->cfg;
    o->arena = a;
    o->n_units = n_units;
    o->param_dtype = param_dtype;
    o->es = strata_dtype_size(param_dtype);
    o->state_type = cfg->optim.state;
    for (int k = 0; k < 3; k++) o->state_es[k] = strata_state_elem_bytes(o->state_type, k);
    o->n = strata_xcalloc(n_units, sizeof *o->n);
    o->n_small = strata_xcalloc(n_units, sizeof *o->n_small);
    o->state = strata_xcalloc(n_units, sizeof *o->state);
    o->file_off = strata_xcalloc(n_units, sizeof *o->file_off);
    o->param_off = strata_xcalloc(n_units, sizeof *o->param_off);
    o->param_stride = strata_xcalloc(n_units, sizeof *o->param_stride);
    /* offload.nvme_ratio: the first units' state in pinned memory (their updates need no
     * disk), the rest on NVMe; units of n = 0 stay on the device (offload.optimizer_ratio) */
    o->on_nvme = strata_xcalloc(n_units, 1);
    double nvme_ratio = cfg->offload.nvme_ratio;
    if (!(nvme_ratio > 0 && nvme_ratio <= 1)) nvme_ratio = 1; /* auto that no launcher resolved: all on NVMe */
    strata_split_units(n, n_units, o->nvme ? 1.0 - nvme_ratio : 1.0, o->on_nvme);
    size_t max_nvme_n = 0;
    static const char *kind_names[STRATA_STATE_KINDS] = {"offload.master",        "offload.adam_m",
                                                         "offload.adam_v",        "offload.adam_m_absmax",
                                                         "offload.adam_v_absmax", "offload.adam_m_small",
                                                         "offload.adam_v_small"};
    /* the chunk: offload.chunk_kb of fp32 gradient, whole CHUNK_ALIGN blocks, at least one */
    o->chunk = (size_t)cfg->offload.chunk_kb * 1024 / sizeof(float) / CHUNK_ALIGN * CHUNK_ALIGN;
    if (o->chunk < CHUNK_ALIGN) o->chunk = CHUNK_ALIGN;
    o->first_task = strata_xcalloc(n_units + 1, sizeof *o->first_task);
    for (int u = 0; u < n_units; u++) {
        o->first_task[u] = o->n_tasks;
        o->n_tasks += (int)((n[u] + o->chunk - 1) / o->chunk);
    }
    o->first_task[n_units] = o->n_tasks;
    o->tasks = strata_xcalloc(o->n_tasks ? o->n_tasks : 1, sizeof *o->tasks);
    for (int u = 0; u < n_units; u++)
        for (int i = o->first_task[u]; i < o->first_task[u + 1]; i++) {
            size_t c0 = (size_t)(i - o->first_task[u]) * o->chunk;
            o->tasks[i] = (update_task){.o = o, .u = u, .c0 = c0, .n = n[u] - c0 < o->chunk ? n[u] - c0 : o->chunk};
            if (o->tasks[i].n > o->max_chunk) o->max_chunk = o->tasks[i].n;
        }
    for (int u = 0; u < n_units; u++) {
        o->n[u] = n[u];
        o->n_small[u] = n[u] && n_small ? n_small[u] : 0;
        if (!n[u]) continue;
        if (o->on_nvme[u]) {
            if (n[u] > max_nvme_n) max_nvme_n = n[u];
            o->file_off[u] = o->file_bytes;
            for (int k = 0; k < 3; k++) o->file_bytes += kind_stride(o, u, k);
        } else {
            for (int k = 0; k < 3; k++)
                reserve_pinned(a, STRATA_CAT_OPTIMIZER, kind_names[k], u, n[u] * o->state_es[k], &o->state[u][k]);
        }
        /* int8: the absmax and the small tensors' fp32 moments stay in memory, on NVMe too */
        for (int k = 3; k < STRATA_STATE_KINDS; k++)
            if (kind_count(o, u, k))
                reserve_pinned(a, STRATA_CAT_OPTIMIZER, kind_names[k], u, kind_count(o, u, k) * sizeof(float),
                               &o->state[u][k]);
    }
    if (o->params_nvme) {
        for (int u = 0; u < n_units; u++) {
            o->param_stride[u] = strata_round_up(n[u] * o->es, NVME_ALIGN);
            o->param_off[u] = o->file_bytes;
            o->file_bytes += o->param_stride[u];
        }
        reserve_pinned(a, STRATA_CAT_STAGING, "offload.param_io", -1, strata_round_up(o->max_chunk * o->es, NVME_ALIGN),
                       &o->param_io);
        o->n_fetch = cfg->zero.prefetch_units + 3; /* the gather ring, the embedding and an untied head */
        o->fetch = strata_xcalloc(o->n_fetch, sizeof *o->fetch);
    }
    /* a slot holds a chunk's blocks, and two more: a blocking read of any range no longer
     * than a chunk, widened to whole blocks at both ends, fits too */
    size_t slot_n = max_nvme_n < o->chunk ? max_nvme_n : o->chunk;
    for (int k = 0; k < 3 && max_nvme_n; k++) o->slot_bytes[k] = strata_round_up(slot_n * o->state_es[k], NVME_ALIGN) + 2 * NVME_ALIGN;
    if (max_nvme_n)
        for (int s = 0; s < 2; s++)
            for (int k = 0; k < 3; k++)
                reserve_pinned(a, STRATA_CAT_STAGING, kind_names[k], s, o->slot_bytes[k], &o->slot_state[s][k]);
    for (int b = 0; b < o->n_buf; b++) {
        if (!o->grads_host) /* none when the gradients are in pinned memory already */
            reserve_pinned(a, STRATA_CAT_STAGING, "offload.grad_stage", b, o->max_chunk * sizeof(float),
                           (void **)&o->grad_stage[b]);
        /* rounded up so a parameter write to NVMe is whole 4 KiB blocks; none when the
         * update writes the parameters in place (offload.params: cpu) */
        if (!o->params_host)
            reserve_pinned(a, STRATA_CAT_STAGING, "offload.param_stage", b,
                           strata_round_up(o->max_chunk * o->es, NVME_ALIGN), &o->param_stage[b]);
    }
}

static void offload_destroy(strata_update_tier *t) {
    offload_tier *o = offload_of(t);
    if (o->dev) {
        strata_stream *streams[4] = {o->in, o->stream, o->out, o->param_in};
        for (int i = 0; i < 4; i++)
            if (streams[i]) strata_stream_sync(o->dev, streams[i]);
        for (int i = 0; i < 4; i++) strata_stream_destroy(o->dev, streams[i]);
        strata_event **evs[3] = {o->ev_grad_in, o->ev_updated, o->ev_param_free};
        for (int k = 0; k < 3; k++)
            for (int b = 0; b < o->n_buf; b++) strata_event_destroy(o->dev, evs[k][b]);
    }
    free(o->ev_grad_in);
    free(o->ev_updated);
    free(o->ev_param_free);
    free(o->grad_stage);
    free(o->param_stage);
    strata_nvme_close(o->store);
    pthread_mutex_destroy(&o->mu);
    free(o->n);
    free(o->n_small);
    free(o->state);
    free(o->on_nvme);
    free(o->file_off);
    free(o->param_off);
    free(o->fetch);
    free(o->param_stride);
    free(o->tasks);
    free(o->first_task);
    free(o);
}

static size_t offload_nvme_bytes(const strata_update_tier *t) { return offload_of_const(t)->file_bytes; }
static size_t offload_nvme_param_bytes(const strata_update_tier *t) {
    const offload_tier *o = offload_of_const(t);
    size_t n = 0;
    for (int u = 0; u < o->n_units && o->params_nvme; u++) n += o->param_stride[u];
    return n;
}

static int offload_open(strata_update_tier *t) {
    offload_tier *o = offload_of(t);
    if (!o->file_bytes || o->store) return 0;
    /* the arena's pinned block holds every staging buffer: one registration covers them */
    void *pinned_base = o->arena->base[STRATA_MEM_PINNED];
    void *bufs[1] = {pinned_base};
    size_t sizes[1] = {o->arena->total[STRATA_MEM_PINNED]};
    o->store = strata_nvme_open(o->cfg->offload.nvme_path, o->rank, o->file_bytes, (size_t)o->cfg->offload.block_kb * 1024,
                                o->cfg->offload.queue_depth, bufs, sizes, pinned_base ? 1 : 0);
    if (!o->store) return strata_fail_wrap(o->nvme ? "offload.optimizer: nvme" : "offload.params: nvme");
    return 0;
}

static size_t state_offset(const offload_tier *o, int u, int kind) {
    size_t off = o->file_off[u];
    for (int k = 0; k < kind; k++) off += kind_stride(o, u, k);
    return off;
}

/* A prefetch still in flight into a slot a blocking call is about to reuse: wait for it. */
static int drain_prefetch(offload_tier *o) {
    int rc = 0;
    if (o->prefetched_task >= 0)
        for (int k = 0; k < 3; k++) rc |= strata_nvme_wait(o->store, o->prefetch_ticket[k]);
    o->prefetched_task = -1;
    return rc ? -1 : 0;
}

/* A blocking write of elements [lo, lo + n) of a unit's `total` elements of es bytes:
 * whole blocks of STRATA_TIER_IO_ALIGN elements (4096 for 1-byte codes: 4 KiB), or the
 * array's last piece (core/update_tier.h). */
static int check_io_range(const char *what, int u, size_t lo, size_t n, size_t total, size_t es) {
    size_t align = es >= 2 ? STRATA_TIER_IO_ALIGN : NVME_ALIGN / es;
    if (lo % align || lo + n > total || (n % align && lo + n != total))
        return strata_fail("offload: %s of unit %d: elements [%zu, %zu) of %zu are not whole %zu-element blocks", what,
                           u, lo, lo + n, total, align);
    return 0;
}

/* Elements [lo, lo + n) of a block of `stride` bytes at file offset `off` holding `total`
 * elements of es bytes, written from src through the pinned, aligned `slot`: O_DIRECT
 * writes whole 4 KiB blocks, so the last piece of the array is padded with zeros up to
 * the stride. lo is a multiple of STRATA_TIER_IO_ALIGN (check_io_range). */
static int write_block_range(offload_tier *o, size_t off, size_t stride, size_t total, size_t es, size_t lo, size_t n,
                             const void *src, void *slot) {
    size_t bytes = n * es, start = lo * es;
    size_t span = lo + n == total ? stride - start : bytes;
    memcpy(slot, src, bytes);
    memset((char *)slot + bytes, 0, span - bytes);
    return strata_nvme_write(o->store, off + start, slot, span);
}

static size_t kind_es(const offload_tier *o, int kind) { return kind < 3 ? o->state_es[kind] : sizeof(float); }

static int offload_read_state(strata_update_tier *t, int u, int kind, size_t lo, size_t n, void *dst) {
    offload_tier *o = offload_of(t);
    STRATA_ASSERT(kind >= 0 && kind < STRATA_STATE_KINDS);
    size_t es = kind_es(o, kind);
    if (lo + n > kind_count(o, u, kind))
        return strata_fail("offload: reading unit %d: elements [%zu, %zu) of %zu", u, lo, lo + n, kind_count(o, u, kind));
    if (!n) return 0;
    if (kind >= 3 || !o->on_nvme[u]) {
        memcpy(dst, (char *)o->state[u][kind] + lo * es, n * es);
        return 0;
    }
    /* through a pinned slot, a chunk at a time: O_DIRECT needs whole aligned blocks, the
     * caller's buffer is neither; a chunk's blocks, widened at both ends, fit the slot */
    if (drain_prefetch(o)) return -1;
    void *slot = o->slot_state[0][kind];
    for (size_t done = 0; done < n; done += o->chunk) {
        size_t p0 = lo + done, pn = n - done < o->chunk ? n - done : o->chunk;
        size_t first = p0 * es / NVME_ALIGN * NVME_ALIGN;
        size_t end = strata_round_up((p0 + pn) * es, NVME_ALIGN);
        if (strata_nvme_read(o->store, state_offset(o, u, kind) + first, slot, end - first)) return -1;
        memcpy((char *)dst + done * es, (char *)slot + (p0 * es - first), pn * es);
    }
    return 0;
}

static int offload_write_state(strata_update_tier *t, int u, int kind, size_t lo, size_t n, const void *src) {
    offload_tier *o = offload_of(t);
    STRATA_ASSERT(kind >= 0 && kind < STRATA_STATE_KINDS);
    size_t es = kind_es(o, kind);
    if (kind >= 3) { /* always in memory: any range */
        if (lo + n > kind_count(o, u, kind))
            return strata_fail("offload: writing unit %d: elements [%zu, %zu) of %zu", u, lo, lo + n,
                               kind_count(o, u, kind));
        if (n) memcpy((char *)o->state[u][kind] + lo * es, src, n * es);
        return 0;
    }
    if (check_io_range("writing state", u, lo, n, o->n[u], es)) return -1;
    if (!o->on_nvme[u]) {
        memcpy((char *)o->state[u][kind] + lo * es, src, n * es);
        return 0;
    }
    if (drain_prefetch(o)) return -1; /* its slot is reused, and its unit may be the one written */
    for (size_t done = 0; done < n; done += o->chunk) /* a chunk at a time, through the slot */
        if (write_block_range(o, state_offset(o, u, kind), kind_stride(o, u, kind), o->n[u], es, lo + done,
                              n - done < o->chunk ? n - done : o->chunk, (const char *)src + done * es,
                              o->slot_state[0][kind]))
            return -1;
    return 0;
}

static int offload_write_params(strata_update_tier *t, int u, size_t lo, size_t n, const void *src) {
    offload_tier *o = offload_of(t);
    STRATA_ASSERT(o->params_nvme);
    if (check_io_range("writing parameters", u, lo, n, o->n[u], o->es)) return -1;
    for (size_t done = 0; done < n; done += o->chunk) /* a chunk at a time, through param_io */
        if (write_block_range(o, o->param_off[u], o->param_stride[u], o->n[u], o->es, lo + done,
                              n - done < o->chunk ? n - done : o->chunk, (const char *)src + done * o->es, o->param_io))
            return -1;
    return 0;
}

static strata_stream *offload_param_stream(strata_update_tier *t) { return offload_of(t)->param_in; }

static void record_error(offload_tier *o, const char *what);

static void param_read_run(void *arg) {
    param_io *r = arg;
    offload_tier *o = r->o;
    double t0 = strata_now_ms();
    if (strata_nvme_read(o->store, o->param_off[r->u], r->dst, o->param_stride[r->u])) {
        record_error(o, "offload: reading parameters");
        return;
    }
    o->by_param_in.param_read_s += (strata_now_ms() - t0) / 1e3;
    o->by_param_in.disk_read_bytes += o->param_stride[r->u];
}

static int offload_fetch_params(strata_update_tier *t, int u, void *dst, int tag) {
    offload_tier *o = offload_of(t);
    STRATA_ASSERT(o->params_nvme && tag >= 0 && tag < o->n_fetch);
    o->fetch[tag] = (param_io){o, u, 0, 0, dst};
    return strata_host_task(o->dev, o->param_in, param_read_run, &o->fetch[tag]);
}

static void record_error(offload_tier *o, const char *what) {
    pthread_mutex_lock(&o->mu);
    if (!o->error[0]) snprintf(o->error, sizeof o->error, "%s: %s", what, strata_error());
    pthread_mutex_unlock(&o->mu);
}

/* Bytes of a chunk's piece of an array of stride bytes holding `total` elements of es
 * bytes on NVMe: whole 4 KiB blocks (c0 es is one's start); the last chunk runs to the
 * stride, whose padding its staging buffer holds too. */
static size_t chunk_span(const update_task *t, size_t total, size_t stride, size_t es) {
    return t->c0 + t->n == total ? stride - t->c0 * es : t->n * es;
}

static void param_write_run(void *arg) {
    param_io *w = arg;
    offload_tier *o = w->o;
    const update_task *t = &o->tasks[w->task];
    size_t span = chunk_span(t, o->n[t->u], o->param_stride[t->u], o->es);
    double t0 = strata_now_ms();
    if (strata_nvme_write(o->store, o->param_off[t->u] + t->c0 * o->es, o->param_stage[w->b], span)) {
        record_error(o, "offload: writing parameters");
        return;
    }
    o->by_out.param_write_s += (strata_now_ms() - t0) / 1e3;
    o->by_out.disk_write_bytes += span;
}

static void clock_start(void *arg) { ((stream_clock *)arg)->t0_ms = strata_now_ms(); }
static void clock_stop(void *arg) {
    stream_clock *c = arg;
    c->busy_s += (strata_now_ms() - c->t0_ms) / 1e3;
}

/* Task i's chunk of state, read into `slot` in the background. */
static int prefetch(offload_tier *o, int i, int slot) {
    const update_task *t = &o->tasks[i];
    for (int k = 0; k < 3; k++)
        if (strata_nvme_read_async(o->store, state_offset(o, t->u, k) + t->c0 * o->state_es[k], o->slot_state[slot][k],
                                   chunk_span(t, o->n[t->u], kind_stride(o, t->u, k), o->state_es[k]),
                                   &o->prefetch_ticket[k]))
            return -1;
    o->prefetched_task = i;
    o->prefetch_slot = slot;
    return 0;
}

/* The first task after i whose unit's state is on NVMe (n_tasks: none). */
static int next_on_nvme(const offload_tier *o, int i) {
    int next = i + 1;
    while (next < o->n_tasks && !o->on_nvme[o->tasks[next].u]) next++;
    return next;
}

static void update_run(void *arg) {
    update_task *t = arg;
    offload_tier *o = t->o;
#ifdef _OPENMP
    if (o->threads > 0) omp_set_num_threads(o->threads); /* this stream's thread: its parallel regions */
#endif
    const int u = t->u, i = (int)(t - o->tasks);
    const size_t c0 = t->c0;
    /* the chunk's state: its elements of MASTER, M, V; its blocks' absmax (c0 starts a
     * block); the small tensors' packed fp32 moments whole (the segments say where) */
    void *state[STRATA_STATE_KINDS];
    for (int k = 0; k < STRATA_STATE_KINDS; k++) state[k] = o->state[u][k];
    for (int k = 0; k < 3 && state[k]; k++) state[k] = (char *)state[k] + c0 * o->state_es[k];
    for (int k = STRATA_STATE_M_ABSMAX; k <= STRATA_STATE_V_ABSMAX; k++)
        if (state[k]) state[k] = (float *)state[k] + c0 / STRATA_Q8_BLOCK;
    int slot = 0;
    strata_tier_stats *st = &o->by_run;
    double t0 = strata_now_ms();
    if (o->on_nvme[u]) {
        if (o->prefetched_task != i) { /* not prefetched (first chunk of a step): read now */
            slot = o->next_slot;
            if (prefetch(o, i, slot)) { record_error(o, "offload: reading optimizer state"); return; }
        }
        slot = o->prefetch_slot;
        for (int k = 0; k < 3; k++)
            if (strata_nvme_wait(o->store, o->prefetch_ticket[k])) { record_error(o, "offload: reading optimizer state"); return; }
        for (int k = 0; k < 3; k++) st->disk_read_bytes += chunk_span(t, o->n[u], kind_stride(o, u, k), o->state_es[k]);
        o->prefetched_task = -1;
        for (int k = 0; k < 3; k++) state[k] = o->slot_state[slot][k];
        /* the next chunk's state streams in while this one updates */
        int next = next_on_nvme(o, i);
        if (next < o->n_tasks && prefetch(o, next, slot ^ 1)) { record_error(o, "offload: prefetching optimizer state"); return; }
        o->next_slot = slot ^ 1;
        double t1 = strata_now_ms();
        st->state_wait_s += (t1 - t0) / 1e3;
        t0 = t1;
    } else {
        /* the disk starts on the first chunk it holds while the pinned ones update */
        int next = next_on_nvme(o, i);
        if (o->prefetched_task < 0 && next < o->n_tasks && prefetch(o, next, o->next_slot)) {
            record_error(o, "offload: prefetching optimizer state");
            return;
        }
    }
    const float *grad = t->grad_host ? t->grad_host : o->grad_stage[t->b];
    float *master = state[STRATA_STATE_MASTER];
    char *param = t->param_host ? (char *)t->param_host + c0 * o->es : o->param_stage[t->b];
    /* reads grad, master, m, v; writes those three and the param */
    size_t moment_bytes = 4 * o->state_es[STRATA_STATE_M];
    for (int j = 0; j < t->n_seg; j++) {
        const strata_adamw_segment *s = &t->seg[j];
        strata_adamw_args a = t->args;
        if (!s->decay) a.weight_decay = 0.0f;
        st->adamw_elements += s->n;
        if (o->state_type == STRATA_OPTIM_STATE_BF16) {
            strata_cpu_adamw_bf16(master + s->lo, param + s->lo * o->es, o->param_dtype, grad + s->lo,
                                  (uint16_t *)state[STRATA_STATE_M] + s->lo, (uint16_t *)state[STRATA_STATE_V] + s->lo,
                                  s->n, &a);
        } else if (o->state_type == STRATA_OPTIM_STATE_INT8 && s->quant) {
            /* below, with the whole chunk's blocks */
        } else if (o->state_type == STRATA_OPTIM_STATE_INT8) { /* a small tensor's fp32 moments, packed */
            strata_cpu_adamw(master + s->lo, param + s->lo * o->es, o->param_dtype, grad + s->lo,
                             (float *)state[STRATA_STATE_M_SMALL] + s->small,
                             (float *)state[STRATA_STATE_V_SMALL] + s->small, s->n, &a);
            st->adamw_bytes += s->n * (28 + o->es);
            continue;
        } else {
            strata_cpu_adamw(master + s->lo, param + s->lo * o->es, o->param_dtype, grad + s->lo,
                             (float *)state[STRATA_STATE_M] + s->lo, (float *)state[STRATA_STATE_V] + s->lo, s->n, &a);
        }
        st->adamw_bytes += s->n * (12 + moment_bytes + o->es);
    }
    if (o->state_type == STRATA_OPTIM_STATE_INT8)
        strata_cpu_adamw_q8(master, param, o->param_dtype, grad, state[STRATA_STATE_M], state[STRATA_STATE_V],
                            state[STRATA_STATE_M_ABSMAX], state[STRATA_STATE_V_ABSMAX], t->n, t->seg, t->n_seg,
                            &t->args);
    double t1 = strata_now_ms();
    st->adamw_s += (t1 - t0) / 1e3;
    if (o->on_nvme[u]) {
        for (int k = 0; k < 3; k++) {
            size_t span = chunk_span(t, o->n[u], kind_stride(o, u, k), o->state_es[k]);
            if (strata_nvme_write(o->store, state_offset(o, u, k) + c0 * o->state_es[k], state[k], span)) {
                record_error(o, "offload: writing optimizer state");
                return;
            }
            st->disk_write_bytes += span;
        }
        st->state_write_s += (strata_now_ms() - t1) / 1e3;
    }
}

/* The segments of [c0, c0 + n) of a range cut into them: clipped, relative to c0 (a small
 * tensor's packed index moved by what was cut from its front); returns how many. */
static int clip_segments(const strata_adamw_segment *seg, int n_seg, size_t c0, size_t n, strata_adamw_segment *out) {
    int k = 0;
    for (int j = 0; j < n_seg; j++) {
        size_t lo = seg[j].lo > c0 ? seg[j].lo : c0, hi = seg[j].lo + seg[j].n < c0 + n ? seg[j].lo + seg[j].n : c0 + n;
        if (lo >= hi) continue;
        out[k] = seg[j];
        out[k].lo = lo - c0;
        out[k].n = hi - lo;
        out[k].small = seg[j].small + (lo - seg[j].lo);
        k++;
    }
    return k;
}

static int offload_update(strata_update_tier *tier, int u, const float *grad, void *param_out,
                          const strata_adamw_segment *seg, int n_seg, const strata_adamw_args *args,
                          strata_event *after, strata_event *done) {
    offload_tier *o = offload_of(tier);
    STRATA_ASSERT(n_seg <= STRATA_ADAMW_MAX_SEGMENTS);
    strata_device *d = o->dev;
    /* in: once the gradient is final (later chunks follow the first on the same stream);
     * a gradient in pinned memory is read there, once final, by the update itself */
    int rc = after ? strata_stream_wait_event(d, o->grads_host ? o->stream : o->in, after) : 0;
    for (int i = o->first_task[u]; i < o->first_task[u + 1] && !rc; i++) {
        update_task *t = &o->tasks[i];
        const size_t c0 = t->c0, n = t->n;
        t->n_seg = clip_segments(seg, n_seg, c0, n, t->seg);
        t->args = *args;
        t->param_host = o->params_host ? param_out : NULL; /* before the task that reads it is queued */
        int b = t->b = (int)(o->seq++ % (uint64_t)o->n_buf);
        t->grad_host = o->grads_host ? grad + c0 : NULL;
        if (!o->grads_host) {
            /* in: once the update that last read this buffer is done */
            rc = rc || strata_stream_wait_event(d, o->in, o->ev_updated[b]);
            rc = rc || strata_host_task(d, o->in, clock_start, &o->clock_in);
            rc = rc || strata_memcpy_async(d, o->in, o->grad_stage[b], grad + c0, n * sizeof(float));
            rc = rc || strata_host_task(d, o->in, clock_stop, &o->clock_in);
            rc = rc || strata_event_record(d, o->ev_grad_in[b], o->in);
            o->by_caller.d2h_bytes += n * sizeof(float);
            /* run: once the gradient is in */
            rc = rc || strata_stream_wait_event(d, o->stream, o->ev_grad_in[b]);
        }
        /* run: once the parameters this buffer held last have left */
        rc = rc || strata_stream_wait_event(d, o->stream, o->ev_param_free[b]);
        rc = rc || strata_host_task(d, o->stream, update_run, t);
        rc = rc || strata_event_record(d, o->ev_updated[b], o->stream);
        /* out: the updated parameters to where the device reads them */
        rc = rc || strata_stream_wait_event(d, o->out, o->ev_updated[b]);
        if (o->params_nvme) {
            t->write = (param_io){o, u, b, i, NULL};
            rc = rc || strata_host_task(d, o->out, param_write_run, &t->write);
        } else if (o->params_host) {
            /* written in place by the update: nothing crosses PCIe; the gathers read them */
        } else {
            rc = rc || strata_host_task(d, o->out, clock_start, &o->clock_out);
            rc = rc || strata_memcpy_async(d, o->out, (char *)param_out + c0 * o->es, o->param_stage[b], n * o->es);
            rc = rc || strata_host_task(d, o->out, clock_stop, &o->clock_out);
            o->by_caller.h2d_bytes += n * o->es;
        }
        rc = rc || strata_event_record(d, o->ev_param_free[b], o->out);
    }
    if (!rc && done) rc = strata_event_record(d, done, o->out);
    return rc ? -1 : 0;
}

static int offload_sync(strata_update_tier *t) {
    offload_tier *o = offload_of(t);
    /* every stream is drained even when one fails: nothing may still run on return */
    int sync_failed = 0;
    strata_stream *streams[4] = {o->param_in, o->in, o->stream, o->out};
    for (int i = 0; i < 4; i++)
        if (streams[i] && strata_stream_sync(o->dev, streams[i])) sync_failed = 1;
    pthread_mutex_lock(&o->mu);
    int failed = o->error[0] != 0 || sync_failed;
    if (o->error[0]) strata_fail("%s", o->error);
    else if (sync_failed) strata_fail_wrap("offload: waiting for the tier's streams");
    o->error[0] = 0;
    pthread_mutex_unlock(&o->mu);
    return failed ? -1 : 0;
}

static void offload_stats(const strata_update_tier *t, strata_tier_stats *out) {
    const offload_tier *o = offload_of_const(t);
    const strata_tier_stats *parts[4] = {&o->by_caller, &o->by_run, &o->by_param_in, &o->by_out};
    strata_tier_stats s = {0};
    for (int i = 0; i < 4; i++) strata_tier_stats_add(&s, parts[i], 1);
    s.d2h_s = o->clock_in.busy_s;
    s.h2d_s = o->clock_out.busy_s;
    *out = s;
}

static const strata_update_tier_ops offload_ops = {
    .plan = offload_plan,
    .open = offload_open,
    .destroy = offload_destroy,
    .read_state = offload_read_state,
    .write_state = offload_write_state,
    .update = offload_update,
    .sync = offload_sync,
    .write_params = offload_write_params,
    .param_stream = offload_param_stream,
    .fetch_params = offload_fetch_params,
    .nvme_bytes = offload_nvme_bytes,
    .nvme_param_bytes = offload_nvme_param_bytes,
    .stats = offload_stats,
};

int strata_offload_cpu_threads(const strata_config *cfg, const strata_device *dev) {
    if (cfg->offload.cpu_threads > 0) return cfg->offload.cpu_threads;
    int cores = 1;
#ifdef _OPENMP
    cores = omp_get_num_procs();
#endif
    /* the update is bound by memory bandwidth, which a few cores fewer still saturate; the
     * thread launching the GPU's kernels, and the copy streams, must not wait for a core */
    return dev && dev->caps.gpu ? (cores > 3 ? cores - 2 : 1) : 0;
}

strata_update_tier *strata_offload_tier(const strata_config *cfg, strata_device *dev, int rank) {
    if (cfg->offload.optimizer == STRATA_OFFLOAD_NONE) return NULL;
    offload_tier *o = strata_xcalloc(1, sizeof *o);
    o->tier.ops = &offload_ops;
    o->cfg = cfg;
    o->dev = dev;
    o->nvme = cfg->offload.optimizer == STRATA_OFFLOAD_NVME;
    o->params_nvme = cfg->offload.params == STRATA_OFFLOAD_NVME;
    o->params_host = cfg->offload.params == STRATA_OFFLOAD_CPU;
    o->grads_host = cfg->offload.gradients == STRATA_OFFLOAD_CPU;
    o->rank = rank;
    o->prefetched_task = -1;
    pthread_mutex_init(&o->mu, NULL);
    o->n_buf = cfg->offload.buffer_count;
    o->threads = strata_offload_cpu_threads(cfg, dev);
    o->grad_stage = strata_xcalloc(o->n_buf, sizeof *o->grad_stage);
    o->param_stage = strata_xcalloc(o->n_buf, sizeof *o->param_stage);
    strata_event ***evs[3] = {&o->ev_grad_in, &o->ev_updated, &o->ev_param_free};
    for (int k = 0; k < 3; k++) *evs[k] = strata_xcalloc(o->n_buf, sizeof(strata_event *));
    if (dev) {
        o->in = strata_stream_create(dev, "offload-in", STRATA_STREAM_HOST);
        o->stream = strata_stream_create(dev, "offload", STRATA_STREAM_HOST);
        o->out = strata_stream_create(dev, "offload-out", STRATA_STREAM_HOST);
        if (o->params_nvme) o->param_in = strata_stream_create(dev, "param-in", STRATA_STREAM_HOST);
        for (int k = 0; k < 3; k++)
            for (int b = 0; b < o->n_buf; b++) (*evs[k])[b] = strata_event_create(dev);
    }
    return &o->tier;
}
