/* launcher/infer.c: a model's weights on a device for inference (launcher/infer.h). */
#include "launcher/infer.h"

#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/kernels.h"
#include "io/pretrained.h"
#include "launcher/build.h"

/* Room left on a GPU beyond the plan: cuBLAS's and the kernels' first-launch allocations. */
#define INFER_GPU_MARGIN_BYTES ((size_t)256 << 20)
/* Elements read and rounded at a time while loading (host staging outside the plan: 24 MB). */
#define INFER_LOAD_CHUNK ((size_t)4 << 20)

static size_t unit_bytes(const strata_infer *inf, int u) {
    return inf->m.unit_numel[u] * strata_dtype_size(inf->dev->compute_dtype);
}

/* Streamed unit i (0 = the first) is unit first + i: the streamed blocks are the last ones. */
static int first_streamed(const strata_infer *inf) { return inf->m.n_units - 1 - inf->n_streamed; }

/* The next streamed unit's copy into its slot, once the forward that read the slot before
 * is done. */
static int issue_copy(strata_infer *inf) {
    if (inf->next >= inf->n_streamed) return 0;
    strata_device *d = inf->dev;
    int k = inf->next % 2, u = first_streamed(inf) + inf->next++;
    STRATA_TRY(strata_stream_wait_event(d, inf->copy, inf->read[k]));
    STRATA_TRY(strata_memcpy_async(d, inf->copy, inf->slot[k], inf->host[u], unit_bytes(inf, u)));
    return strata_event_record(d, inf->copied[k], inf->copy);
}

/* m->before_unit: the embedding starts a forward (the first streamed unit's copy begins
 * beside the resident units' forward); a streamed unit's forward waits for its copy, and
 * the slot the unit before it read is refilled with the unit after it. */
static int stream_unit(void *ctx, strata_model *m, int u) {
    strata_infer *inf = ctx;
    strata_device *d = inf->dev;
    if (u == 0) { /* every read of the slots so far is enqueued before this mark */
        inf->next = 0;
        for (int k = 0; k < 2; k++) STRATA_TRY(strata_event_record(d, inf->read[k], d->compute));
        return issue_copy(inf);
    }
    if (!inf->streamed[u]) return 0;
    int i = u - first_streamed(inf);
    STRATA_TRY(strata_event_record(d, inf->read[(i + 1) % 2], d->compute)); /* unit i-1's forward read it */
    STRATA_TRY(issue_copy(inf));
    STRATA_TRY(strata_stream_wait_event(d, d->compute, inf->copied[i % 2]));
    m->params[u] = inf->slot[i % 2];
    return 0;
}

/* How many of the L blocks to stream from host memory, given `fixed` device bytes the rest
 * needs (activations, embedding, head) and `block` bytes a block; -1 + error when even
 * streaming every block does not fit. */
static int blocks_to_stream(const strata_infer *inf, strata_weights_home home, size_t fixed, size_t block) {
    int L = inf->m.shape.n_layer;
    if (home == STRATA_WEIGHTS_HOST) return L;
    if (!inf->dev->caps.gpu) return 0; /* the CPU backend's device memory is host memory */
    size_t free_b = 0, total = 0;
    if (inf->dev->ops->mem_info(inf->dev, &free_b, &total)) return home == STRATA_WEIGHTS_DEVICE ? 0 : L;
    size_t have = free_b > INFER_GPU_MARGIN_BYTES ? free_b - INFER_GPU_MARGIN_BYTES : 0;
    if (fixed + (size_t)L * block <= have) return 0;
    char a[32], b[32], c[32];
    strata_fmt_bytes(a, sizeof a, (double)(fixed + (size_t)L * block));
    strata_fmt_bytes(b, sizeof b, (double)free_b);
    if (home == STRATA_WEIGHTS_DEVICE) {
        strata_fail("the weights and activations need %s of the GPU, which has %s free: --weights auto keeps "
                    "there the blocks that fit and copies the others in from host memory for every forward", a, b);
        return -1;
    }
    if (fixed + 2 * block > have) { /* two slots at the least */
        strata_fmt_bytes(c, sizeof c, (double)(fixed + 2 * block));
        strata_fail("even with every block in host memory, the embedding, the head, two blocks and the "
                    "activations need %s of the GPU, which has %s free", c, b);
        return -1;
    }
    int resident = (int)((have - fixed - 2 * block) / block);
    return resident >= L ? 0 : L - resident;
}

/* Unit u's weights from the source's fp32 values, rounded to the compute dtype a chunk at a
 * time as the training engine rounds them, into its pinned copy or its device buffer. */
static int load_unit(strata_infer *inf, strata_param_source source, void *ctx, int u, float *f32, void *conv) {
    strata_device *d = inf->dev;
    size_t es = strata_dtype_size(d->compute_dtype), n = inf->m.unit_numel[u];
    for (size_t c = 0; c < n; c += INFER_LOAD_CHUNK) {
        size_t len = n - c < INFER_LOAD_CHUNK ? n - c : INFER_LOAD_CHUNK;
        if (source(ctx, &inf->m, u, c, c + len, f32)) return -1;
        if (inf->host[u]) {
            strata_kernels_cpu.convert(NULL, (char *)inf->host[u] + c * es, d->compute_dtype, f32, STRATA_F32, len);
            continue;
        }
        strata_kernels_cpu.convert(NULL, conv, d->compute_dtype, f32, STRATA_F32, len);
        STRATA_TRY(strata_memcpy_async(d, d->compute, (char *)inf->m.params[u] + c * es, conv, len * es));
        STRATA_TRY(strata_stream_sync(d, d->compute)); /* conv is reused next chunk */
    }
    return 0;
}

/* A checkpoint's master weights as a parameter source (ctx: the strata_ckpt). */
static int ckpt_source(void *ctx, const strata_model *m, int u, size_t lo, size_t hi, float *dst) {
    (void)m;
    return strata_ckpt_read_range(ctx, u, STRATA_CKPT_PARAM, lo, hi, dst);
}

/* The plan: the activations, then the weights where they fit (the streamed blocks' slots
 * with them); committed. */
static int plan(strata_infer *inf, const strata_config *cfg, const strata_infer_batch *batch,
                strata_weights_home home) {
    strata_model *m = &inf->m;
    strata_device *d = inf->dev;
    int L = m->shape.n_layer, U = m->n_units;
    /* every block's activations shared (each forward only, as a recomputed block's), and two
     * residual streams (a block reads one and writes the next) */
    strata_model_plan_opts o = {.ckpt_every = 1,
                                .logits_chunk_bytes = batch->logits_chunk_bytes,
                                .mlp_chunk_bytes = (size_t)cfg->train.mlp_chunk_mb << 20,
                                .resid_slots = 2,
                                .documents = batch->documents,
                                .kv_cache = batch->kv_cache};
    strata_model_plan(m, &inf->arena, d, d->compute_dtype, batch->B, batch->T, &o);
    inf->activation_bytes = strata_arena_bytes(&inf->arena, STRATA_MEM_DEVICE, -1);
    size_t block = 0; /* a slot: the largest block, as the arena rounds it */
    for (int u = 1; u <= L; u++)
        if (unit_bytes(inf, u) > block) block = unit_bytes(inf, u);
    block = strata_round_up(block, 256);
    size_t fixed = inf->activation_bytes + strata_round_up(unit_bytes(inf, 0), 256) +
                   strata_round_up(unit_bytes(inf, U - 1), 256);
    int n = blocks_to_stream(inf, home, fixed, block);
    if (n < 0) return -1;
    inf->n_streamed = n;
    char name[64];
    for (int u = 0; u < U; u++) {
        inf->streamed[u] = u >= first_streamed(inf) && u < U - 1;
        snprintf(name, sizeof name, "weights.%d", u);
        if (inf->streamed[u]) {
            strata_arena_reserve(&inf->arena, STRATA_MEM_PINNED, STRATA_CAT_PARAMS, name, unit_bytes(inf, u), &inf->host[u]);
            inf->host_weight_bytes += unit_bytes(inf, u);
        } else {
            strata_arena_reserve(&inf->arena, STRATA_MEM_DEVICE, STRATA_CAT_PARAMS, name, unit_bytes(inf, u), &m->params[u]);
            inf->device_weight_bytes += unit_bytes(inf, u);
        }
    }
    if (n)
        for (int k = 0; k < 2; k++) {
            snprintf(name, sizeof name, "weights.slot%d", k);
            strata_arena_reserve(&inf->arena, STRATA_MEM_DEVICE, STRATA_CAT_PREFETCH, name, block, &inf->slot[k]);
        }
    return strata_arena_commit(&inf->arena);
}

int strata_infer_open(strata_infer *inf, const strata_config *cfg, const strata_infer_batch *batch,
                      strata_weights_home home) {
    memset(inf, 0, sizeof *inf);
    strata_model_shape shape = strata_config_model_shape(cfg);
    strata_model_init(&inf->m, &shape);
    inf->dev = strata_device_open(strata_backend_name(cfg), 0);
    if (!inf->dev) {
        strata_model_free(&inf->m);
        return -1;
    }
    strata_arena_init(&inf->arena, inf->dev);
    inf->streamed = strata_xcalloc((size_t)inf->m.n_units, 1);
    inf->host = strata_xcalloc((size_t)inf->m.n_units, sizeof *inf->host);
    if (plan(inf, cfg, batch, home)) {
        char err[1024];
        snprintf(err, sizeof err, "%s", strata_error());
        strata_infer_close(inf);
        return strata_fail("%s", err);
    }
    return 0;
}

int strata_infer_load(strata_infer *inf, strata_param_source source, void *ctx) {
    strata_model *m = &inf->m;
    size_t chunk = 0;
    for (int u = 0; u < m->n_units; u++)
        if (m->unit_numel[u] > chunk) chunk = m->unit_numel[u];
    if (chunk > INFER_LOAD_CHUNK) chunk = INFER_LOAD_CHUNK;
    float *f32 = strata_xmalloc(chunk * sizeof(float));
    void *conv = strata_xmalloc(chunk * strata_dtype_size(inf->dev->compute_dtype));
    int rc = 0;
    for (int u = 0; u < m->n_units && !rc; u++) rc = load_unit(inf, source, ctx, u, f32, conv);
    free(f32);
    free(conv);
    if (rc || !inf->n_streamed || inf->copy) return rc;
    inf->copy = strata_stream_create(inf->dev, "weights", STRATA_STREAM_DEVICE);
    for (int k = 0; k < 2; k++) {
        inf->copied[k] = strata_event_create(inf->dev);
        inf->read[k] = strata_event_create(inf->dev);
    }
    m->before_unit = stream_unit;
    m->before_unit_ctx = inf;
    return 0;
}

int strata_infer_open_weights(strata_infer *inf, const strata_config *cfg, strata_ckpt *ck,
                              const strata_infer_batch *batch, strata_weights_home home) {
    if (strata_infer_open(inf, cfg, batch, home)) return -1;
    int rc = -1;
    if (ck) {
        strata_param_layout layout = strata_model_layout(&inf->m, inf->m.unit_numel);
        rc = strata_ckpt_check_layout(ck, &layout) || strata_infer_load(inf, ckpt_source, ck) ? -1 : 0;
    } else {
        strata_pretrained *pt = strata_pretrained_open(cfg->model.init_from, &inf->m);
        rc = pt ? strata_infer_load(inf, strata_pretrained_read, pt) : -1;
        if (!rc) snprintf(inf->from, sizeof inf->from, "%s: %s", cfg->model.init_from, strata_pretrained_describe(pt));
        strata_pretrained_close(pt);
    }
    if (!rc) return 0;
    char err[1024];
    snprintf(err, sizeof err, "%s", strata_error());
    strata_infer_close(inf);
    return strata_fail("%s", err);
}

void strata_infer_close(strata_infer *inf) {
    if (inf->dev) {
        (void)inf->dev->ops->sync_all(inf->dev); /* closing: nothing in flight may outlive the memory */
        strata_stream_destroy(inf->dev, inf->copy);
        for (int k = 0; k < 2; k++) {
            strata_event_destroy(inf->dev, inf->copied[k]);
            strata_event_destroy(inf->dev, inf->read[k]);
        }
        strata_arena_release(&inf->arena);
    }
    strata_model_free(&inf->m);
    free(inf->streamed);
    free(inf->host);
    if (inf->dev) strata_device_close(inf->dev);
    memset(inf, 0, sizeof *inf);
}

void strata_infer_describe(const strata_infer *inf, char *buf, size_t len) {
    char w[32], a[32], h[32];
    strata_fmt_bytes(w, sizeof w, (double)inf->device_weight_bytes);
    strata_fmt_bytes(a, sizeof a, (double)inf->activation_bytes);
    int n = snprintf(buf, len, "weights %s in %s on %s, activations %s for up to %d tokens%s", w,
                     strata_dtype_name(inf->dev->compute_dtype), inf->dev->caps.gpu ? "the GPU" : "the CPU", a, inf->m.T,
                     inf->m.kv ? " (their keys and values cached)" : "");
    if (inf->n_streamed && n > 0 && (size_t)n < len) {
        strata_fmt_bytes(h, sizeof h, (double)inf->host_weight_bytes);
        n += snprintf(buf + n, len - (size_t)n, "; %d of the %d blocks (%s) in pinned host memory, copied in for every "
                      "forward", inf->n_streamed, inf->m.shape.n_layer, h);
    }
    if (inf->from[0] && n > 0 && (size_t)n < len) snprintf(buf + n, len - (size_t)n, "; read from %s", inf->from);
}
