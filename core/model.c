/* core/model.c: GPT-2 forward and backward, unit by unit, through the kernel table.
 * Shapes: B batch, T time, C channels, NH heads, V vocabulary, Vp padded vocabulary. */
#include "core/model.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/kernels.h"
#include "core/profile.h"

/* Tensors of a block in flat-buffer order; the index names are used below. */
enum {
    LN1_W, LN1_B, QKV_W, QKV_B, ATTPROJ_W, ATTPROJ_B, LN2_W, LN2_B, FC_W, FC_B, FCPROJ_W, FCPROJ_B,
    BLOCK_TENSORS
};
enum { WTE, WPE };
enum { LNF_W, LNF_B };

static void add_tensor(strata_model *m, int u, const char *name, int ndim, int64_t d0, int64_t d1) {
    strata_unit *unit = &m->units[u];
    strata_param_tensor *t = &m->tensors[m->n_tensors];
    snprintf(t->name, sizeof t->name, "%s", name);
    t->unit = u;
    t->offset = unit->numel;
    t->ndim = ndim;
    t->shape[0] = d0;
    t->shape[1] = ndim > 1 ? d1 : 0;
    t->numel = (size_t)d0 * (ndim > 1 ? (size_t)d1 : 1);
    m->decay[m->n_tensors] = ndim == 2; /* weight decay on matrices only, never on biases/norms */
    if (unit->n_tensors == 0) unit->first_tensor = m->n_tensors;
    unit->n_tensors++;
    unit->numel += t->numel;
    m->n_tensors++;
}

void strata_model_init(strata_model *m, const strata_model_shape *shape) {
    memset(m, 0, sizeof *m);
    m->shape = *shape;
    int L = shape->n_layer, C = shape->n_embd;
    m->n_units = L + 2;
    m->units = strata_xcalloc(m->n_units, sizeof *m->units);
    int max_tensors = 2 + L * BLOCK_TENSORS + 2;
    m->tensors = strata_xcalloc(max_tensors, sizeof *m->tensors);
    m->decay = strata_xcalloc(max_tensors, 1);
    m->params = strata_xcalloc(m->n_units, sizeof *m->params);
    m->grads = strata_xcalloc(m->n_units, sizeof *m->grads);

    m->units[0] = (strata_unit){.kind = STRATA_UNIT_EMBED, .layer = -1};
    add_tensor(m, 0, "transformer.wte.weight", 2, shape->padded_vocab_size, C); /* rows >= V: padding */
    add_tensor(m, 0, "transformer.wpe.weight", 2, shape->max_seq_len, C);
    char name[STRATA_TENSOR_NAME_MAX];
    for (int l = 0; l < L; l++) {
        int u = 1 + l;
        m->units[u] = (strata_unit){.kind = STRATA_UNIT_BLOCK, .layer = l};
        static const struct { const char *suffix; int ndim, r, c; } spec[BLOCK_TENSORS] = {
            {"ln_1.weight", 1, 1, 0},      {"ln_1.bias", 1, 1, 0},
            {"attn.c_attn.weight", 2, 1, 3}, {"attn.c_attn.bias", 1, 3, 0},
            {"attn.c_proj.weight", 2, 1, 1}, {"attn.c_proj.bias", 1, 1, 0},
            {"ln_2.weight", 1, 1, 0},      {"ln_2.bias", 1, 1, 0},
            {"mlp.c_fc.weight", 2, 1, 4},  {"mlp.c_fc.bias", 1, 4, 0},
            {"mlp.c_proj.weight", 2, 4, 1}, {"mlp.c_proj.bias", 1, 1, 0},
        };
        for (int i = 0; i < BLOCK_TENSORS; i++) {
            snprintf(name, sizeof name, "transformer.h.%d.%s", l, spec[i].suffix);
            add_tensor(m, u, name, spec[i].ndim, (int64_t)spec[i].r * C, (int64_t)spec[i].c * C);
        }
    }
    int head = L + 1;
    m->units[head] = (strata_unit){.kind = STRATA_UNIT_HEAD, .layer = -1};
    add_tensor(m, head, "transformer.ln_f.weight", 1, C, 0);
    add_tensor(m, head, "transformer.ln_f.bias", 1, C, 0);
    m->unit_numel = strata_xcalloc(m->n_units, sizeof *m->unit_numel);
    for (int u = 0; u < m->n_units; u++) m->unit_numel[u] = m->units[u].numel;
}

void strata_model_free(strata_model *m) {
    free(m->units);
    free(m->unit_numel);
    free(m->tensors);
    free(m->decay);
    free(m->params);
    free(m->grads);
    free(m->resid);
    free(m->acts);
    memset(m, 0, sizeof *m);
}

size_t strata_model_num_params(const strata_model *m) {
    size_t n = 0;
    for (int u = 0; u < m->n_units; u++) n += m->units[u].numel;
    /* padded vocabulary rows are not parameters of the model, only of its layout */
    return n - (size_t)(m->shape.padded_vocab_size - m->shape.vocab_size) * m->shape.n_embd;
}

double strata_model_flops_per_token(const strata_model *m, int T) {
    double L = m->shape.n_layer, C = m->shape.n_embd, V = m->shape.vocab_size;
    double n_matmul = L * 12.0 * C * C + V * C;
    return 6.0 * n_matmul + 12.0 * L * C * T;
}

strata_param_layout strata_model_layout(const strata_model *m, const size_t *unit_padded) {
    return (strata_param_layout){.n_units = m->n_units, .unit_numel = m->unit_numel, .unit_padded = unit_padded,
                                .n_tensors = m->n_tensors, .tensors = m->tensors};
}

/* ---- memory plan ---- */

static void reserve(strata_arena *a, const char *name, size_t bytes, void **dst) {
    strata_arena_reserve(a, STRATA_MEM_DEVICE, STRATA_CAT_ACTIVATIONS, name, bytes, dst);
}

static void plan_block_acts(strata_arena *a, strata_block_acts *x, const char *who, size_t BT,
                            size_t C, size_t NH, size_t es) {
    char n[64];
#define R(field, bytes) (snprintf(n, sizeof n, "%s.%s", who, #field), reserve(a, n, bytes, (void **)&x->field))
    R(ln1, BT * C * es);
    R(ln1_mean, BT * 4);
    R(ln1_rstd, BT * 4);
    R(qkv, BT * 3 * C * es);
    R(atty, BT * C * es);
    R(att_lse, BT * NH * 4);
    R(resid2, BT * C * es);
    R(ln2, BT * C * es);
    R(ln2_mean, BT * 4);
    R(ln2_rstd, BT * 4);
    R(fch, BT * 4 * C * es);
    R(fch_gelu, BT * 4 * C * es);
#undef R
}

static int block_recomputed(const strata_model *m, int l) {
    return m->ckpt_every > 0 && l % m->ckpt_every == 0;
}
/* Recomputed blocks share one set of activation buffers, rebuilt in their backward. */
static strata_block_acts *acts_of(strata_model *m, int l) {
    return block_recomputed(m, l) ? &m->recompute : &m->acts[l];
}

void strata_model_plan(strata_model *m, strata_arena *a, strata_device *dev, strata_dtype dtype, int B,
                       int T, int ckpt_every) {
    STRATA_ASSERT(!dev || dev->compute_dtype == dtype);
    m->dev = dev;
    m->B = m->cur_B = B;
    m->T = m->cur_T = T;
    m->ckpt_every = ckpt_every;
    int L = m->shape.n_layer;
    size_t C = m->shape.n_embd, NH = m->shape.n_head, Vp = m->shape.padded_vocab_size;
    size_t BT = (size_t)B * T;
    size_t es = strata_dtype_size(dtype);
    m->resid = strata_xcalloc(L + 1, sizeof *m->resid);
    m->acts = strata_xcalloc(L, sizeof *m->acts);
    char n[64];
    for (int l = 0; l <= L; l++) {
        snprintf(n, sizeof n, "resid.%d", l);
        reserve(a, n, BT * C * es, &m->resid[l]);
    }
    int any_recomputed = 0;
    for (int l = 0; l < L; l++) {
        if (block_recomputed(m, l)) {
            any_recomputed = 1;
            continue;
        }
        snprintf(n, sizeof n, "h.%d", l);
        plan_block_acts(a, &m->acts[l], n, BT, C, NH, es);
    }
    if (any_recomputed) plan_block_acts(a, &m->recompute, "recompute", BT, C, NH, es);
    reserve(a, "scratch_btc", BT * C * es, &m->scratch_btc);
    reserve(a, "lnf", BT * C * es, &m->lnf);
    reserve(a, "lnf_mean", BT * 4, (void **)&m->lnf_mean);
    reserve(a, "lnf_rstd", BT * 4, (void **)&m->lnf_rstd);
    reserve(a, "logits", BT * Vp * es, &m->logits);
    reserve(a, "losses", BT * 4, (void **)&m->losses);
    reserve(a, "loss_sum", 4, (void **)&m->loss_sum);
    reserve(a, "dresid", BT * C * es, &m->dresid);
    reserve(a, "dbtc", BT * C * es, &m->dbtc);
    reserve(a, "dbtc2", BT * C * es, &m->dbtc2);
    reserve(a, "dqkv", BT * 3 * C * es, &m->dqkv);
    reserve(a, "dfch", BT * 4 * C * es, &m->dfch);
    reserve(a, "inputs", BT * 4, (void **)&m->inputs);
    reserve(a, "targets", BT * 4, (void **)&m->targets);
}

/* ---- initialisation ---- */

void strata_model_init_params(const strata_model *m, int u, uint64_t seed, size_t lo, size_t hi,
                              float *dst) {
    const strata_unit *unit = &m->units[u];
    float std = m->shape.init_std;
    /* GPT-2 scales the residual projections by 1/sqrt(2 L): each block adds two of them. */
    float proj_std = std / sqrtf(2.0f * m->shape.n_layer);
    for (int i = 0; i < unit->n_tensors; i++) {
        int ti = unit->first_tensor + i;
        const strata_param_tensor *t = &m->tensors[ti];
        size_t a = t->offset > lo ? t->offset : lo;
        size_t b = t->offset + t->numel < hi ? t->offset + t->numel : hi;
        if (a >= b) continue;
        const char *name = t->name;
        size_t len = strlen(name);
        int is_bias = len > 5 && !strcmp(name + len - 5, ".bias");
        int is_ln = strstr(name, ".ln_") != NULL;
        int is_proj = strstr(name, "c_proj.weight") != NULL;
        /* element-indexed, so threads change nothing but the time (a 7B model draws 7e9) */
#pragma omp parallel for schedule(static) if (b - a > 65536)
        for (size_t e = a; e < b; e++) {
            size_t k = e - t->offset; /* index inside the tensor: the RNG counter */
            float v;
            if (is_ln) v = is_bias ? 0.0f : 1.0f;
            else if (is_bias) v = 0.0f;
            else if (ti == 0 && k / m->shape.n_embd >= (size_t)m->shape.vocab_size) v = 0.0f;
            else v = (is_proj ? proj_std : std) * strata_rand_normal(seed, (uint64_t)ti, k);
            dst[e - lo] = v;
        }
    }
    for (size_t e = unit->numel > lo ? unit->numel : lo; e < hi; e++) dst[e - lo] = 0.0f; /* padding */
}

/* ---- forward and backward ---- */

static void *tensor_ptr(strata_model *m, void *base, int u, int i, size_t es) {
    return (char *)base + m->tensors[m->units[u].first_tensor + i].offset * es;
}
#define P(u, i) tensor_ptr(m, m->params[u], u, i, es)
#define G(u, i) ((float *)tensor_ptr(m, m->grads[u], u, i, sizeof(float)))
/* Kernel call(s) timed as one call of group g when the step is profiled (core/profile.h;
 * m->prof is NULL otherwise, and this is the call alone). */
#define TIMED(g, ...)                                                   \
    do {                                                                \
        int prof_call_ = strata_prof_begin(m->prof, STRATA_PROF_##g);   \
        __VA_ARGS__;                                                    \
        strata_prof_end(m->prof, prof_call_);                           \
    } while (0)

int strata_model_set_batch(strata_model *m, const int32_t *inputs, const int32_t *targets) {
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
    size_t bytes = n * sizeof(int32_t);
    STRATA_TRY(strata_memcpy_async(m->dev, m->dev->compute, m->inputs, inputs, bytes));
    if (targets) STRATA_TRY(strata_memcpy_async(m->dev, m->dev->compute, m->targets, targets, bytes));
    return 0;
}

static void block_forward(strata_model *m, int u) {
    const strata_kernels *k = m->dev->k;
    strata_stream *s = m->dev->compute;
    size_t es = strata_dtype_size(m->dev->compute_dtype);
    int l = m->units[u].layer;
    int B = m->cur_B, T = m->cur_T, C = m->shape.n_embd, NH = m->shape.n_head, BT = B * T;
    strata_block_acts *a = acts_of(m, l);
    void *x = m->resid[l];
    TIMED(LAYERNORM, k->layernorm_forward(s, a->ln1, a->ln1_mean, a->ln1_rstd, x, P(u, LN1_W), P(u, LN1_B), BT, C));
    TIMED(MATMUL_QKV, k->matmul_forward(s, a->qkv, NULL, a->ln1, P(u, QKV_W), P(u, QKV_B), BT, C, 3 * C, 0)); /* (B,T,3C) */
    TIMED(ATTENTION, k->attention_forward(s, a->atty, a->att_lse, a->qkv, B, T, NH, NH, C / NH));         /* (B,T,C) */
    TIMED(MATMUL_ATTPROJ, k->matmul_forward(s, m->scratch_btc, NULL, a->atty, P(u, ATTPROJ_W), P(u, ATTPROJ_B), BT, C, C, 0));
    TIMED(RESIDUAL, k->residual_forward(s, a->resid2, x, m->scratch_btc, (size_t)BT * C));
    TIMED(LAYERNORM, k->layernorm_forward(s, a->ln2, a->ln2_mean, a->ln2_rstd, a->resid2, P(u, LN2_W), P(u, LN2_B), BT, C));
    TIMED(MATMUL_FC, k->matmul_forward(s, a->fch, a->fch_gelu, a->ln2, P(u, FC_W), P(u, FC_B), BT, C, 4 * C, 0)); /* (B,T,4C) */
    TIMED(MATMUL_FCPROJ, k->matmul_forward(s, m->scratch_btc, NULL, a->fch_gelu, P(u, FCPROJ_W), P(u, FCPROJ_B), BT, 4 * C, C, 0));
    TIMED(RESIDUAL, k->residual_forward(s, m->resid[l + 1], a->resid2, m->scratch_btc, (size_t)BT * C));
}

void strata_model_forward_unit(strata_model *m, int u, int train, float dloss, float loss_scale) {
    const strata_kernels *k = m->dev->k;
    strata_stream *s = m->dev->compute;
    size_t es = strata_dtype_size(m->dev->compute_dtype);
    int B = m->cur_B, T = m->cur_T, C = m->shape.n_embd, BT = B * T;
    int L = m->shape.n_layer, V = m->shape.vocab_size, Vp = m->shape.padded_vocab_size;
    switch (m->units[u].kind) {
    case STRATA_UNIT_EMBED:
        TIMED(EMBEDDING, k->encoder_forward(s, m->resid[0], m->inputs, P(0, WTE), P(0, WPE), B, T, C)); /* (B,T,C) */
        break;
    case STRATA_UNIT_BLOCK:
        block_forward(m, u);
        break;
    case STRATA_UNIT_HEAD:
        TIMED(LAYERNORM, k->layernorm_forward(s, m->lnf, m->lnf_mean, m->lnf_rstd, m->resid[L], P(u, LNF_W), P(u, LNF_B), BT, C));
        TIMED(CLASSIFIER, k->matmul_forward(s, m->logits, NULL, m->lnf, P(0, WTE), NULL, BT, C, Vp, 1)); /* (B,T,Vp) */
        if (loss_scale != 0.0f || train) {
            /* (B,T) losses; in training the logits become dlogits in place */
            TIMED(CROSSENTROPY, k->crossentropy(s, m->losses, train ? m->logits : NULL, m->logits, m->targets, BT, V, Vp, dloss),
                  k->loss_accumulate(s, m->loss_sum, m->losses, BT, loss_scale));
        }
        break;
    }
}

static void block_backward(strata_model *m, int u) {
    const strata_kernels *k = m->dev->k;
    strata_stream *s = m->dev->compute;
    size_t es = strata_dtype_size(m->dev->compute_dtype);
    int l = m->units[u].layer;
    int B = m->cur_B, T = m->cur_T, C = m->shape.n_embd, NH = m->shape.n_head, BT = B * T;
    if (block_recomputed(m, l)) { /* activation checkpointing: rebuild acts */
        strata_prof_set_phase(m->prof, STRATA_PROF_RECOMPUTE);
        block_forward(m, u);
        strata_prof_set_phase(m->prof, STRATA_PROF_BACKWARD);
    }
    strata_block_acts *a = acts_of(m, l);
    /* m->dresid holds dL/d resid[l+1] and leaves holding dL/d resid[l]. */
    TIMED(MATMUL_FCPROJ, k->matmul_backward(s, m->dfch, G(u, FCPROJ_W), G(u, FCPROJ_B), m->dresid, a->fch_gelu, P(u, FCPROJ_W), BT, 4 * C, C, 0));
    TIMED(GELU, k->gelu_backward(s, m->dfch, a->fch, m->dfch, (size_t)BT * 4 * C));
    TIMED(MATMUL_FC, k->matmul_backward(s, m->dbtc, G(u, FC_W), G(u, FC_B), m->dfch, a->ln2, P(u, FC_W), BT, C, 4 * C, 0));
    TIMED(LAYERNORM, k->layernorm_backward(s, m->dresid, G(u, LN2_W), G(u, LN2_B), m->dbtc, a->resid2, P(u, LN2_W), a->ln2_mean, a->ln2_rstd, BT, C));
    TIMED(MATMUL_ATTPROJ, k->matmul_backward(s, m->dbtc, G(u, ATTPROJ_W), G(u, ATTPROJ_B), m->dresid, a->atty, P(u, ATTPROJ_W), BT, C, C, 0));
    TIMED(ATTENTION, k->attention_backward(s, m->dqkv, m->dbtc, a->qkv, a->atty, a->att_lse, B, T, NH, NH, C / NH));
    TIMED(MATMUL_QKV, k->matmul_backward(s, m->dbtc, G(u, QKV_W), G(u, QKV_B), m->dqkv, a->ln1, P(u, QKV_W), BT, C, 3 * C, 0));
    TIMED(LAYERNORM, k->layernorm_backward(s, m->dresid, G(u, LN1_W), G(u, LN1_B), m->dbtc, m->resid[l], P(u, LN1_W), a->ln1_mean, a->ln1_rstd, BT, C));
}

int strata_model_backward_unit(strata_model *m, int u) {
    const strata_kernels *k = m->dev->k;
    strata_stream *s = m->dev->compute;
    size_t es = strata_dtype_size(m->dev->compute_dtype);
    int B = m->cur_B, T = m->cur_T, C = m->shape.n_embd, BT = B * T;
    int L = m->shape.n_layer, Vp = m->shape.padded_vocab_size;
    switch (m->units[u].kind) {
    case STRATA_UNIT_HEAD:
        /* tied head: dwte (Vp,C) += dlogits^T lnf; dlnf = dlogits wte */
        TIMED(CLASSIFIER, k->matmul_backward(s, m->dbtc, G(0, WTE), NULL, m->logits, m->lnf, P(0, WTE), BT, C, Vp, 1));
        STRATA_TRY(strata_memset_async(m->dev, s, m->dresid, 0, (size_t)BT * C * es));
        TIMED(LAYERNORM, k->layernorm_backward(s, m->dresid, G(u, LNF_W), G(u, LNF_B), m->dbtc, m->resid[L], P(u, LNF_W), m->lnf_mean, m->lnf_rstd, BT, C));
        break;
    case STRATA_UNIT_BLOCK:
        block_backward(m, u);
        break;
    case STRATA_UNIT_EMBED:
        TIMED(EMBEDDING, k->encoder_backward(s, G(0, WTE), G(0, WPE), m->dresid, m->inputs, B, T, C));
        break;
    }
    return 0;
}

int strata_model_forward_logits(strata_model *m, const int32_t *tokens, int B, int T) {
    STRATA_ASSERT(B <= m->B && T <= m->T);
    m->cur_B = B;
    m->cur_T = T;
    int rc = strata_model_set_batch(m, tokens, NULL);
    for (int u = 0; u < m->n_units && !rc; u++) strata_model_forward_unit(m, u, 0, 0.0f, 0.0f);
    m->cur_B = m->B;
    m->cur_T = m->T;
    return rc;
}
