/* core/model.c: what both model families share: the unit and tensor bookkeeping, the
 * residual streams, logits and losses, set_batch, the layout, the init of a unit's range;
 * everything family-specific goes through m->family (core/model_family.h).
 * Shapes: B batch, T time, C channels, V vocabulary, Vp padded vocabulary. */
#include "core/model.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/kernels.h"
#include "core/model_family.h"
#include "core/profile.h"

static const strata_model_family *family_of(int arch) {
    switch (arch) {
    case STRATA_ARCH_GPT2: return &strata_family_gpt2;
    case STRATA_ARCH_LLAMA: return &strata_family_llama;
    }
    strata_panic(__FILE__, __LINE__, "model arch %d is neither gpt2 nor llama", arch);
    return NULL;
}

/* ---- units and tensors ---- */

void strata_model_set_unit(strata_model *m, int u, int kind, int layer) {
    STRATA_ASSERT(u >= 0 && u < m->n_units);
    m->units[u] = (strata_unit){.kind = kind, .layer = layer};
}

/* Tensors a model of the family can have: the embedding's and the head's, at most
 * STRATA_FAMILY_UNIT_TENSORS each, and its blocks'. */
static int max_tensors(const strata_model *m) {
    return 2 * STRATA_FAMILY_UNIT_TENSORS + m->shape.n_layer * m->family->block_tensors;
}

void strata_model_add_tensor(strata_model *m, int u, const char *name, int ndim, int64_t d0, int64_t d1,
                             int vocab_rows) {
    STRATA_ASSERT(m->n_tensors < max_tensors(m));
    strata_unit *unit = &m->units[u];
    strata_param_tensor *t = &m->tensors[m->n_tensors];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->unit = u;
    t->offset = unit->numel;
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = ndim > 1 ? d1 : 0;
    t->numel = (size_t)d0 * (ndim > 1 ? (size_t)d1 : 1);
    m->decay[m->n_tensors] = ndim == 2; /* weight decay on matrices only, never on biases/norms */
    m->vocab_rows[m->n_tensors] = (unsigned char)vocab_rows;
    if (unit->n_tensors == 0) unit->first_tensor = m->n_tensors;
    unit->n_tensors++;
    unit->numel += t->numel;
    m->n_tensors++;
}

void strata_model_init(strata_model *m, const strata_model_shape *shape) {
    memset(m, 0, sizeof *m);
    m->shape = *shape;
    m->family = family_of(shape->arch);
    m->n_units = shape->n_layer + 2;
    m->units = strata_xcalloc(m->n_units, sizeof *m->units);
    m->params = strata_xcalloc(m->n_units, sizeof *m->params);
    m->grads = strata_xcalloc(m->n_units, sizeof *m->grads);
    m->tensors = strata_xcalloc(max_tensors(m), sizeof *m->tensors);
    m->decay = strata_xcalloc(max_tensors(m), 1);
    m->vocab_rows = strata_xcalloc(max_tensors(m), 1);
    m->family->build(m);
    m->unit_numel = strata_xcalloc(m->n_units, sizeof *m->unit_numel);
    for (int u = 0; u < m->n_units; u++) m->unit_numel[u] = m->units[u].numel;
}

const char *strata_model_family_name(const strata_model *m) { return m->family->name; }

void strata_model_free(strata_model *m) {
    if (m->family && m->family->free_acts) m->family->free_acts(m);
    free(m->units);
    free(m->unit_numel);
    free(m->tensors);
    free(m->decay);
    free(m->vocab_rows);
    free(m->params);
    free(m->grads);
    free(m->resid);
    free(m->kv);
    memset(m, 0, sizeof *m);
}

void *strata_model_tensor_ptr(const strata_model *m, void *base, int u, int i, size_t es) {
    return (char *)base + m->tensors[m->units[u].first_tensor + i].offset * es;
}

int64_t strata_model_real_rows(const strata_model *m, int ti) {
    return m->vocab_rows[ti] ? m->shape.vocab_size : m->tensors[ti].shape[0];
}

size_t strata_model_num_params(const strata_model *m) {
    size_t n = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const strata_param_tensor *t = &m->tensors[i];
        /* padded vocabulary rows are not parameters of the model, only of its layout */
        n += t->numel - (size_t)(t->shape[0] - strata_model_real_rows(m, i)) * (t->ndim > 1 ? (size_t)t->shape[1] : 1);
    }
    return n;
}

double strata_model_flops_per_token(const strata_model *m, int T) { return m->family->flops_per_token(m, T); }

int strata_model_timed_calls(const strata_model *m) { return m->family->timed_calls(m); }

strata_param_layout strata_model_layout(const strata_model *m, const size_t *unit_padded) {
    return (strata_param_layout){.n_units = m->n_units, .unit_numel = m->unit_numel, .unit_padded = unit_padded,
                                .n_tensors = m->n_tensors, .tensors = m->tensors};
}

/* ---- memory plan ---- */

void strata_model_reserve(strata_arena *a, const char *name, size_t bytes, void **dst) {
    strata_arena_reserve(a, STRATA_MEM_DEVICE, STRATA_CAT_ACTIVATIONS, name, bytes, dst);
}

int strata_model_block_recomputed(const strata_model *m, int l) {
    return m->ckpt_every > 0 && l % m->ckpt_every == 0;
}

int strata_model_chunk_rows(size_t chunk_bytes, size_t row_bytes, size_t n) {
    size_t rows = chunk_bytes ? chunk_bytes / row_bytes : n;
    return (int)(rows < 1 ? 1 : rows < n ? rows : n);
}

void strata_model_plan(strata_model *m, strata_arena *a, strata_device *dev, strata_dtype dtype, int B,
                       int T, const strata_model_plan_opts *o) {
    STRATA_ASSERT(!dev || dev->compute_dtype == dtype);
    m->dev = dev;
    m->B = m->cur_B = B;
    m->T = m->cur_T = T;
    m->ckpt_every = o->ckpt_every;
    m->constants_ready = 0;
    int L = m->shape.n_layer;
    size_t C = m->shape.n_embd, Vp = m->shape.padded_vocab_size;
    size_t BT = (size_t)B * T;
    size_t es = strata_dtype_size(dtype);
    m->resid_slots = o->resid_slots > 0 && o->resid_slots < L + 1 ? o->resid_slots : L + 1;
    m->resid = strata_xcalloc(m->resid_slots, sizeof *m->resid);
    char n[64];
    for (int l = 0; l < m->resid_slots; l++) {
        snprintf(n, sizeof n, "resid.%d", l);
        strata_model_reserve(a, n, BT * C * es, &m->resid[l]);
    }
    m->family->plan(m, a, es, o->mlp_chunk_bytes);
    m->head_rows = strata_model_chunk_rows(o->logits_chunk_bytes, Vp * es, BT);
    strata_model_reserve(a, "logits", (size_t)m->head_rows * Vp * es, &m->logits);
    strata_model_reserve(a, "losses", BT * 4, (void **)&m->losses);
    strata_model_reserve(a, "loss_sum", 4, (void **)&m->loss_sum);
    strata_model_reserve(a, "dresid", BT * C * es, &m->dresid);
    strata_model_reserve(a, "inputs", BT * 4, (void **)&m->inputs);
    strata_model_reserve(a, "targets", BT * 4, (void **)&m->targets);
    strata_model_reserve(a, "inputs.order", BT * 4, (void **)&m->order);
    strata_arena_reserve(a, STRATA_MEM_HOST, STRATA_CAT_ACTIVATIONS, "inputs.order (host)", BT * 4,
                         (void **)&m->order_host);
    strata_arena_reserve(a, STRATA_MEM_HOST, STRATA_CAT_ACTIVATIONS, "token counts (host)",
                         ((size_t)m->shape.vocab_size + 1) * 4, (void **)&m->token_counts);
    m->pos = m->pos_order = m->pos_order_host = m->pos_counts = NULL;
    m->cur_pos = NULL;
    free(m->kv);
    m->kv = NULL;
    m->kv_len = m->extending = 0;
    if (o->kv_cache) {
        STRATA_ASSERT(B == 1);
        m->kv = strata_xcalloc((size_t)L, sizeof *m->kv);
        size_t row = m->family->qkv_width(m) * es;
        for (int l = 0; l < L; l++) {
            snprintf(n, sizeof n, "kv.%d", l);
            strata_model_reserve(a, n, (size_t)T * row, &m->kv[l]);
        }
        strata_model_reserve(a, "kv.positions", (size_t)T * 4, (void **)&m->kv_pos);
        strata_arena_reserve(a, STRATA_MEM_HOST, STRATA_CAT_ACTIVATIONS, "kv.positions (host)", (size_t)T * 4,
                             (void **)&m->kv_pos_host);
        strata_arena_reserve(a, STRATA_MEM_HOST, STRATA_CAT_ACTIVATIONS, "kv.tokens (host)", (size_t)T * 4,
                             (void **)&m->kv_ids);
    }
    if (o->documents) {
        strata_model_reserve(a, "inputs.pos", BT * 4, (void **)&m->pos);
        if (m->family->learned_positions) {
            strata_model_reserve(a, "inputs.pos_order", BT * 4, (void **)&m->pos_order);
            strata_arena_reserve(a, STRATA_MEM_HOST, STRATA_CAT_ACTIVATIONS, "inputs.pos_order (host)", BT * 4,
                                 (void **)&m->pos_order_host);
            strata_arena_reserve(a, STRATA_MEM_HOST, STRATA_CAT_ACTIVATIONS, "position counts (host)",
                                 ((size_t)T + 1) * 4, (void **)&m->pos_counts);
        }
    }
}

/* ---- initialisation ---- */

void strata_model_init_params(const strata_model *m, int u, uint64_t seed, size_t lo, size_t hi,
                              float *dst) {
    const strata_unit *unit = &m->units[u];
    for (int i = 0; i < unit->n_tensors; i++) {
        int ti = unit->first_tensor + i;
        const strata_param_tensor *t = &m->tensors[ti];
        size_t a = t->offset > lo ? t->offset : lo;
        size_t b = t->offset + t->numel < hi ? t->offset + t->numel : hi;
        if (a >= b) continue;
        strata_init_rule r = m->family->init_rule(m, ti);
        size_t cols = t->ndim > 1 ? (size_t)t->shape[1] : 1;
        size_t real = (size_t)strata_model_real_rows(m, ti) * cols; /* elements before the padding rows */
        /* element-indexed, so threads change nothing but the time (a 7B model draws 7e9) */
#pragma omp parallel for schedule(static) if (b - a > 65536)
        for (size_t e = a; e < b; e++) {
            size_t k = e - t->offset; /* index inside the tensor: the RNG counter */
            float v;
            if (k >= real) v = 0.0f;
            else if (r.std > 0.0f) v = r.std * strata_rand_normal(seed, (uint64_t)ti, k);
            else v = r.value;
            dst[e - lo] = v;
        }
    }
    for (size_t e = unit->numel > lo ? unit->numel : lo; e < hi; e++) dst[e - lo] = 0.0f; /* padding */
}

/* ---- forward and backward ---- */

void strata_token_order(const int32_t *tok, size_t n, int V, int32_t *count, int32_t *order) {
    memset(count, 0, ((size_t)V + 1) * sizeof *count);
    for (size_t i = 0; i < n; i++) count[tok[i] + 1]++;
    for (int v = 0; v < V; v++) count[v + 1] += count[v]; /* count[v]: where token v's run starts */
    for (size_t i = 0; i < n; i++) order[count[tok[i]]++] = (int32_t)i;
}

/* Checks a batch's positions and uploads them when some row holds more than one document;
 * m->cur_pos says which. */
static int set_positions(strata_model *m, const int32_t *positions) {
    int T = m->cur_T;
    size_t n = (size_t)m->cur_B * T;
    m->cur_pos = NULL;
    if (!positions) return 0;
    if (!m->pos)
        return strata_fail("the batch has document positions, but the model's plan reserved no room for them "
                           "(strata_model_plan_opts.documents)");
    int packed = 0;
    for (size_t i = 0; i < n; i++) {
        int32_t p = positions[i], before = i % (size_t)T ? positions[i - 1] : -1;
        if (p != 0 && p != before + 1)
            return strata_fail("position %d at row %zu, position %zu of the batch does not follow %d: a document "
                               "starts at 0 and counts up by one",
                               p, i / (size_t)T, i % (size_t)T, before);
        if (p != (int32_t)(i % (size_t)T)) packed = 1;
    }
    if (!packed) return 0; /* every row one document: the kernels' plain causal path, bit for bit */
    size_t bytes = n * sizeof(int32_t);
    STRATA_TRY(strata_memcpy_async(m->dev, m->dev->compute, m->pos, positions, bytes)); /* as the inputs are */
    if (m->pos_order) {
        strata_token_order(positions, n, T, m->pos_counts, m->pos_order_host);
        STRATA_TRY(strata_memcpy_async(m->dev, m->dev->compute, m->pos_order, m->pos_order_host, bytes));
    }
    m->cur_pos = m->pos;
    return 0;
}

int strata_model_set_batch(strata_model *m, const int32_t *inputs, const int32_t *targets,
                           const int32_t *positions) {
    /* every token that reaches the embedding (and every target the loss indexes) passes
     * here, on any backend: an id outside the table would read past it */
    int V = m->shape.vocab_size, T = m->cur_T;
    size_t n = (size_t)m->cur_B * T;
    for (size_t i = 0; i < n; i++) {
        if (inputs[i] < 0 || inputs[i] >= V)
            return strata_fail("token id %d at row %zu, position %zu of the batch is outside the vocabulary [0, %d)",
                               inputs[i], i / (size_t)T, i % (size_t)T, V);
        if (targets && targets[i] >= V) /* negative targets are ignored by the loss */
            return strata_fail("target id %d at row %zu, position %zu of the batch is outside the vocabulary [0, %d)",
                               targets[i], i / (size_t)T, i % (size_t)T, V);
    }
    STRATA_TRY(set_positions(m, positions));
    if (!m->constants_ready && m->family->upload_constants) {
        STRATA_TRY(m->family->upload_constants(m));
        m->constants_ready = 1;
    }
    size_t bytes = n * sizeof(int32_t);
    STRATA_TRY(strata_memcpy_async(m->dev, m->dev->compute, m->inputs, inputs, bytes));
    strata_token_order(inputs, n, V, m->token_counts, m->order_host);
    STRATA_TRY(strata_memcpy_async(m->dev, m->dev->compute, m->order, m->order_host, bytes));
    if (targets) STRATA_TRY(strata_memcpy_async(m->dev, m->dev->compute, m->targets, targets, bytes));
    return 0;
}

/* Rows [r0, r0 + n) of the head: their logits into m->logits, their losses, and (dlogits)
 * the logits turned into dlogits in place. */
static void head_chunk(strata_model *m, const void *x, const void *w, int layout, int C, int r0, int n, int dlogits,
                       float dloss) {
    const strata_kernels *k = m->dev->k;
    strata_stream *s = m->dev->compute;
    size_t es = strata_dtype_size(m->dev->compute_dtype);
    int V = m->shape.vocab_size, Vp = m->shape.padded_vocab_size;
    k->matmul_forward(s, m->logits, NULL, (const char *)x + (size_t)r0 * C * es, w, NULL, n, C, Vp, layout);
    k->crossentropy(s, m->losses + r0, dlogits ? m->logits : NULL, m->logits, m->targets + r0, n, V, Vp, dloss);
}

/* A chunked head's evaluation (every row scored) or sampling (only the last head_rows rows'
 * logits, the ones a sample reads); returns the first row computed. */
static int head_chunks_eval(strata_model *m, const void *x, const void *w, int layout, int C, int scored) {
    size_t es = strata_dtype_size(m->dev->compute_dtype);
    int BT = m->cur_B * m->cur_T, Vp = m->shape.padded_vocab_size;
    if (!scored) {
        int r0 = BT - m->head_rows;
        m->dev->k->matmul_forward(m->dev->compute, m->logits, NULL, (const char *)x + (size_t)r0 * C * es, w, NULL,
                                  m->head_rows, C, Vp, layout);
        return r0;
    }
    for (int r = 0; r < BT; r += m->head_rows)
        head_chunk(m, x, w, layout, C, r, BT - r < m->head_rows ? BT - r : m->head_rows, 0, 0.0f);
    return 0;
}

/* A chunked head's training: each chunk's logits, loss and dlogits, then its share of dx
 * and dw (dw's sum over the rows runs chunk by chunk). */
static void head_chunks_train(strata_model *m, const void *x, const void *w, int layout, int C, void *dx, float *dw) {
    size_t es = strata_dtype_size(m->dev->compute_dtype);
    int BT = m->cur_B * m->cur_T, Vp = m->shape.padded_vocab_size;
    for (int r = 0; r < BT; r += m->head_rows) {
        int n = BT - r < m->head_rows ? BT - r : m->head_rows;
        size_t off = (size_t)r * C * es;
        head_chunk(m, x, w, layout, C, r, n, 1, m->head_dloss);
        m->dev->k->matmul_backward(m->dev->compute, (char *)dx + off, dw, NULL, m->logits, (const char *)x + off, w, n,
                                   C, Vp, layout);
    }
}

void strata_model_head_forward(strata_model *m, const void *x, const void *w, int layout, int C, int train,
                               float dloss, float loss_scale) {
    const strata_kernels *k = m->dev->k;
    strata_stream *s = m->dev->compute;
    int BT = m->cur_B * m->cur_T, V = m->shape.vocab_size, Vp = m->shape.padded_vocab_size;
    int scored = loss_scale != 0.0f || train;
    if (m->head_rows >= BT) { /* every row's logits at once */
        TIMED(CLASSIFIER, k->matmul_forward(s, m->logits, NULL, x, w, NULL, BT, C, Vp, layout)); /* (B,T,Vp) */
        /* (B,T) losses; in training the logits become dlogits in place */
        if (scored)
            TIMED(CROSSENTROPY, k->crossentropy(s, m->losses, train ? m->logits : NULL, m->logits, m->targets, BT, V, Vp, dloss),
                  k->loss_accumulate(s, m->loss_sum, m->losses, BT, loss_scale));
        return;
    }
    if (train) { /* the backward runs each chunk's forward, loss and backward together */
        m->head_dloss = dloss;
        m->head_loss_scale = loss_scale;
        return;
    }
    TIMED(CLASSIFIER, m->logits_first = head_chunks_eval(m, x, w, layout, C, scored));
    if (scored) TIMED(CROSSENTROPY, k->loss_accumulate(s, m->loss_sum, m->losses, BT, loss_scale));
}

void strata_model_head_backward(strata_model *m, const void *x, const void *w, int layout, int C, void *dx, float *dw) {
    const strata_kernels *k = m->dev->k;
    strata_stream *s = m->dev->compute;
    int BT = m->cur_B * m->cur_T, Vp = m->shape.padded_vocab_size;
    if (m->head_rows >= BT) { /* dw (Vp,C) += dlogits^T x; dx = dlogits w */
        TIMED(CLASSIFIER, k->matmul_backward(s, dx, dw, NULL, m->logits, x, w, BT, C, Vp, layout));
        return;
    }
    TIMED(CLASSIFIER, head_chunks_train(m, x, w, layout, C, dx, dw));
    TIMED(CROSSENTROPY, k->loss_accumulate(s, m->loss_sum, m->losses, BT, m->head_loss_scale));
}

void strata_model_forward_unit(strata_model *m, int u, int train, float dloss, float loss_scale) {
    m->family->forward(m, u, train, dloss, loss_scale);
}

int strata_model_backward_unit(strata_model *m, int u) { return m->family->backward(m, u); }

/* Every unit's forward, each unit's parameters made ready by m->before_unit when set. */
static int forward_units(strata_model *m, float loss_scale) {
    for (int u = 0; u < m->n_units; u++) {
        if (m->before_unit && m->before_unit(m->before_unit_ctx, m, u)) return -1;
        strata_model_forward_unit(m, u, 0, 0.0f, loss_scale);
    }
    return 0;
}

int strata_model_forward_scored(strata_model *m, float loss_scale) { return forward_units(m, loss_scale); }

int strata_model_extend(strata_model *m, const int32_t *tokens, int n) {
    STRATA_ASSERT(m->kv && n >= 1 && m->kv_len + n <= m->T);
    m->cur_B = 1;
    m->cur_T = n;
    m->logits_first = 0;
    int rc = strata_model_set_batch(m, tokens, NULL, NULL);
    for (int i = 0; i < n; i++) m->kv_pos_host[i] = m->kv_len + i;
    if (!rc) rc = strata_memcpy_async(m->dev, m->dev->compute, m->kv_pos, m->kv_pos_host, (size_t)n * 4);
    m->extending = 1;
    if (!rc) rc = forward_units(m, 0.0f);
    m->extending = 0;
    if (!rc) {
        memcpy(m->kv_ids + m->kv_len, tokens, (size_t)n * sizeof *tokens);
        m->kv_len += n;
    }
    m->cur_B = m->B;
    m->cur_T = m->T;
    return rc;
}

int strata_model_forward_logits(strata_model *m, const int32_t *tokens, int B, int T) {
    STRATA_ASSERT(B <= m->B && T <= m->T);
    m->cur_B = B;
    m->cur_T = T;
    m->logits_first = 0;
    int rc = strata_model_set_batch(m, tokens, NULL, NULL);
    if (!rc) rc = forward_units(m, 0.0f);
    m->cur_B = m->B;
    m->cur_T = m->T;
    return rc;
}
