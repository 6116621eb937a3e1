/* core/model_gpt2.c: GPT-2 as units, forward and backward through the kernel table.
 * Shapes: B batch, T time, C channels, NH heads, V vocabulary, Vp padded vocabulary.
 *
 *   unit 0        embed: transformer.wte.weight (Vp,C; rows V..Vp-1 stay zero),
 *                        transformer.wpe.weight (maxT,C)
 *   unit 1..L     block l = u-1: ln_1 (w,b), attn.c_attn (w (C,3C), b), attn.c_proj (w (C,C), b),
 *                        ln_2 (w,b), mlp.c_fc (w (C,4C), b), mlp.c_proj (w (4C,C), b)
 *   unit L+1      head: transformer.ln_f (w,b); the LM head is tied to wte.
 * Weights use Hugging Face's Conv1D (in, out) layout. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/kernels.h"
#include "core/model.h"
#include "core/model_family.h"
#include "core/profile.h"

/* Tensors of a block in flat-buffer order; the index names are used below. */
enum {
    LN1_W, LN1_B, QKV_W, QKV_B, ATTPROJ_W, ATTPROJ_B, LN2_W, LN2_B, FC_W, FC_B, FCPROJ_W, FCPROJ_B,
    BLOCK_TENSORS
};
enum { WTE, WPE };
enum { LNF_W, LNF_B };

/* Activations of one block (B,T,...). */
typedef struct block_acts {
    void *ln1;      /* (B,T,C) */
    float *ln1_mean, *ln1_rstd; /* (B,T) */
    void *qkv;      /* (B,T,3C) */
    void *atty;     /* (B,T,C) attention output before c_proj */
    float *att_lse; /* (B,NH,T) */
    void *resid2;   /* (B,T,C) x + attn(ln1(x)) */
    void *ln2;      /* (B,T,C) */
    float *ln2_mean, *ln2_rstd;
    void *fch;      /* (B,T,4C) c_fc pre-activation; (R,4C) for the recomputed blocks' shared set */
} block_acts;

/* Everything GPT-2 keeps beside the residual streams and the logits (arena). */
typedef struct gpt2_acts {
    block_acts *h;        /* per block; blocks recomputed in backward share `recompute` */
    block_acts recompute;
    void *scratch_btc;    /* (B,T,C) c_proj outputs before the residual add */
    /* (R,4C) gelu(fch) of the block at hand, R = mlp_rows (B*T unless the MLP runs in
     * chunks): its forward writes it for c_proj, its backward rebuilds it from fch for
     * c_proj's weight gradient. One buffer for all blocks instead of one each: L-1 times
     * B T 4C elements less (4.6 GiB at 1.5B, B=8), for one element-wise pass per block in
     * the backward. */
    void *fch_gelu;
    void *lnf;            /* (B,T,C) */
    float *lnf_mean, *lnf_rstd;
    /* gradient buffers for backward */
    void *dbtc;           /* (B,T,C) */
    void *dqkv;           /* (B,T,3C) */
    void *dfch;           /* (R,4C) */
} gpt2_acts;

static void build(strata_model *m) {
    const strata_model_shape *shape = &m->shape;
    int L = shape->n_layer, C = shape->n_embd;
    strata_model_set_unit(m, 0, STRATA_UNIT_EMBED, -1);
    strata_model_add_tensor(m, 0, "transformer.wte.weight", 2, shape->padded_vocab_size, C, 1); /* rows >= V: padding */
    strata_model_add_tensor(m, 0, "transformer.wpe.weight", 2, shape->max_seq_len, C, 0);
    char name[STRATA_TENSOR_NAME_MAX];
    for (int l = 0; l < L; l++) {
        int u = 1 + l;
        strata_model_set_unit(m, u, STRATA_UNIT_BLOCK, l);
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
            strata_model_add_tensor(m, u, name, spec[i].ndim, (int64_t)spec[i].r * C, (int64_t)spec[i].c * C, 0);
        }
    }
    int head = L + 1;
    strata_model_set_unit(m, head, STRATA_UNIT_HEAD, -1);
    strata_model_add_tensor(m, head, "transformer.ln_f.weight", 1, C, 0, 0);
    strata_model_add_tensor(m, head, "transformer.ln_f.bias", 1, C, 0, 0);
}

static double flops_per_token(const strata_model *m, int T) {
    double L = m->shape.n_layer, C = m->shape.n_embd, V = m->shape.vocab_size;
    double n_matmul = L * 12.0 * C * C + V * C;
    return 6.0 * n_matmul + 12.0 * L * C * T;
}

/* per block: the forward's 9 calls (2 of them a chunk of the MLP's), the backward's 9 (4 a
 * chunk's), a recompute's 7 (1 a chunk's), and 7 more for each further chunk; the
 * embedding's forward and backward, the head's 3 + 2 */
static int timed_calls(const strata_model *m) {
    int BT = m->B * m->T, chunks = (BT + m->mlp_rows - 1) / m->mlp_rows;
    return (25 + 7 * (chunks - 1)) * m->shape.n_layer + 11;
}

/* ---- memory plan ---- */

/* fch_rows: rows of c_fc's output the block keeps (B*T, or a chunk's for the recomputed
 * blocks' shared set when the MLP runs in chunks: their backward rebuilds it a chunk at a
 * time) */
static void plan_block_acts(strata_arena *a, block_acts *x, const char *who, size_t BT, size_t C, size_t NH,
                            size_t es, size_t fch_rows) {
    char n[64];
#define R(field, bytes) (snprintf(n, sizeof n, "%s.%s", who, #field), strata_model_reserve(a, n, bytes, (void **)&x->field))
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
    R(fch, fch_rows * 4 * C * es);
#undef R
}

/* Recomputed blocks share one set of activation buffers, rebuilt in their backward. */
static block_acts *acts_of(strata_model *m, int l) {
    gpt2_acts *x = m->acts;
    return strata_model_block_recomputed(m, l) ? &x->recompute : &x->h[l];
}

static void plan(strata_model *m, strata_arena *a, size_t es, size_t mlp_chunk_bytes) {
    int L = m->shape.n_layer;
    size_t C = m->shape.n_embd, NH = m->shape.n_head;
    size_t BT = (size_t)m->B * m->T;
    gpt2_acts *x = strata_xcalloc(1, sizeof *x);
    m->acts = x;
    x->h = strata_xcalloc(L, sizeof *x->h);
    /* the MLP's rows at a time: its widest activation is c_fc's 4C */
    size_t R = (size_t)(m->mlp_rows = strata_model_chunk_rows(mlp_chunk_bytes, 4 * C * es, BT));
    char n[64];
    int any_recomputed = 0;
    for (int l = 0; l < L; l++) {
        if (strata_model_block_recomputed(m, l)) {
            any_recomputed = 1;
            continue;
        }
        snprintf(n, sizeof n, "h.%d", l);
        plan_block_acts(a, &x->h[l], n, BT, C, NH, es, BT);
    }
    if (any_recomputed) plan_block_acts(a, &x->recompute, "recompute", BT, C, NH, es, R);
    /* Buffers whose lives never overlap share memory: dqkv (a block's backward, from
     * attention's gradient to q|k|v's), scratch_btc (a block's forward: c_proj's outputs,
     * spent by the residual adds; in a recomputed block's backward, before its gradients) and
     * lnf (from the head's forward to its backward), 3 (B,T,C) buffers rather than 5. dbtc
     * meets each of dqkv and lnf in one call, so it keeps its own. */
    strata_model_reserve(a, "dqkv", BT * 3 * C * es, &x->dqkv);
    strata_arena_share(a, "scratch_btc", BT * C * es, &x->scratch_btc);
    strata_arena_share(a, "lnf", BT * C * es, &x->lnf);
    strata_model_reserve(a, "fch_gelu", R * 4 * C * es, &x->fch_gelu);
    strata_model_reserve(a, "lnf_mean", BT * 4, (void **)&x->lnf_mean);
    strata_model_reserve(a, "lnf_rstd", BT * 4, (void **)&x->lnf_rstd);
    strata_model_reserve(a, "dbtc", BT * C * es, &x->dbtc);
    strata_model_reserve(a, "dfch", R * 4 * C * es, &x->dfch);
}

static void free_acts(strata_model *m) {
    gpt2_acts *x = m->acts;
    if (x) free(x->h);
    free(x);
    m->acts = NULL;
}

/* ---- initialisation ---- */

static strata_init_rule init_rule(const strata_model *m, int ti) {
    const char *name = m->tensors[ti].name;
    size_t len = strlen(name);
    int is_bias = len > 5 && !strcmp(name + len - 5, ".bias");
    int is_ln = strstr(name, ".ln_") != NULL;
    int is_proj = strstr(name, "c_proj.weight") != NULL;
    float std = m->shape.init_std;
    /* GPT-2 scales the residual projections by 1/sqrt(2 L): each block adds two of them. */
    float proj_std = std / sqrtf(2.0f * m->shape.n_layer);
    if (is_ln) return (strata_init_rule){.value = is_bias ? 0.0f : 1.0f};
    if (is_bias) return (strata_init_rule){.value = 0.0f};
    return (strata_init_rule){.std = is_proj ? proj_std : std};
}

/* ---- forward and backward ---- */

#define P(u, i) strata_model_tensor_ptr(m, m->params[u], u, i, es)
#define G(u, i) ((float *)strata_model_tensor_ptr(m, m->grads[u], u, i, sizeof(float)))

/* Where rows [r0, ...) of block l's c_fc output live: its own (B,T,4C) buffer, or, for a
 * recomputed block, the shared buffer from its start (a chunk's rows when the MLP runs in
 * chunks; the backward rebuilds each chunk before its use). */
static void *fch_at(const strata_model *m, const block_acts *a, int l, int r0, size_t es) {
    return (char *)a->fch + (strata_model_block_recomputed(m, l) ? 0 : (size_t)r0 * 4 * m->shape.n_embd * es);
}

static size_t qkv_width(const strata_model *m) { return 3 * (size_t)m->shape.n_embd; }

/* The block up to its MLP: x -> LayerNorm -> attention -> + x = resid2 -> LayerNorm = ln2. */
static void block_forward_to_mlp(strata_model *m, int u) {
    const strata_kernels *k = m->dev->k;
    strata_stream *s = m->dev->compute;
    size_t es = strata_dtype_size(m->dev->compute_dtype);
    gpt2_acts *g = m->acts;
    int l = m->units[u].layer;
    int B = m->cur_B, T = m->cur_T, C = m->shape.n_embd, NH = m->shape.n_head, BT = B * T;
    block_acts *a = acts_of(m, l);
    void *x = strata_model_resid(m, l);
    TIMED(LAYERNORM, k->layernorm_forward(s, a->ln1, a->ln1_mean, a->ln1_rstd, x, P(u, LN1_W), P(u, LN1_B), BT, C));
    /* decoding (strata_model_extend, B 1): the T new rows' q|k|v go after the cache's kv_len,
     * and attention runs over all kv_len + T of them (its output's last T rows are the new
     * ones'); else the batch's own buffer */
    int ext = m->extending, att_T = ext ? m->kv_len + T : T;
    void *qkv_all = ext ? m->kv[l] : a->qkv, *qkv = (char *)qkv_all + (ext ? (size_t)m->kv_len * 3 * C * es : 0);
    TIMED(MATMUL_QKV, k->matmul_forward(s, qkv, NULL, a->ln1, P(u, QKV_W), P(u, QKV_B), BT, C, 3 * C, STRATA_W_KN)); /* (B,T,3C) */
    TIMED(ATTENTION, k->attention_forward(s, a->atty, a->att_lse, qkv_all, ext ? NULL : m->cur_pos, B, att_T, NH, NH,
                                          C / NH)); /* (B,T,C) */
    void *atty = (char *)a->atty + (size_t)(att_T - T) * C * es; /* the new rows' */
    TIMED(MATMUL_ATTPROJ, k->matmul_forward(s, g->scratch_btc, NULL, atty, P(u, ATTPROJ_W), P(u, ATTPROJ_B), BT, C, C, STRATA_W_KN));
    TIMED(RESIDUAL, k->residual_forward(s, a->resid2, x, g->scratch_btc, (size_t)BT * C));
    TIMED(LAYERNORM, k->layernorm_forward(s, a->ln2, a->ln2_mean, a->ln2_rstd, a->resid2, P(u, LN2_W), P(u, LN2_B), BT, C));
}

/* c_fc's rows [r0, r0 + n) with its fused bias + GELU epilogue: fch and fch_gelu. */
static void fc_forward(strata_model *m, int u, void *fch, int r0, int n) {
    size_t es = strata_dtype_size(m->dev->compute_dtype);
    gpt2_acts *g = m->acts;
    int C = m->shape.n_embd;
    const void *ln2 = (char *)acts_of(m, m->units[u].layer)->ln2 + (size_t)r0 * C * es;
    TIMED(MATMUL_FC, m->dev->k->matmul_forward(m->dev->compute, fch, g->fch_gelu, ln2, P(u, FC_W), P(u, FC_B), n, C,
                                                4 * C, STRATA_W_KN)); /* (n,4C) */
}

/* The whole block; the MLP m->mlp_rows rows at a time (all of them unless
 * train.mlp_chunk_mb says otherwise: each row's output is its own). */
static void block_forward(strata_model *m, int u) {
    const strata_kernels *k = m->dev->k;
    strata_stream *s = m->dev->compute;
    size_t es = strata_dtype_size(m->dev->compute_dtype);
    gpt2_acts *g = m->acts;
    int l = m->units[u].layer;
    int C = m->shape.n_embd, BT = m->cur_B * m->cur_T;
    block_acts *a = acts_of(m, l);
    block_forward_to_mlp(m, u);
    for (int r0 = 0; r0 < BT; r0 += m->mlp_rows) {
        int n = BT - r0 < m->mlp_rows ? BT - r0 : m->mlp_rows;
        fc_forward(m, u, fch_at(m, a, l, r0, es), r0, n);
        TIMED(MATMUL_FCPROJ, k->matmul_forward(s, (char *)g->scratch_btc + (size_t)r0 * C * es, NULL, g->fch_gelu,
                                               P(u, FCPROJ_W), P(u, FCPROJ_B), n, 4 * C, C, STRATA_W_KN));
    }
    TIMED(RESIDUAL, k->residual_forward(s, strata_model_resid(m, l + 1), a->resid2, g->scratch_btc, (size_t)BT * C));
}

static void forward(strata_model *m, int u, int train, float dloss, float loss_scale) {
    const strata_kernels *k = m->dev->k;
    strata_stream *s = m->dev->compute;
    size_t es = strata_dtype_size(m->dev->compute_dtype);
    gpt2_acts *g = m->acts;
    int B = m->cur_B, T = m->cur_T, C = m->shape.n_embd, BT = B * T;
    int L = m->shape.n_layer;
    switch (m->units[u].kind) {
    case STRATA_UNIT_EMBED:
        TIMED(EMBEDDING, k->encoder_forward(s, strata_model_resid(m, 0), m->inputs, m->extending ? m->kv_pos : m->cur_pos,
                                            P(0, WTE), P(0, WPE), B, T, C)); /* (B,T,C); decoding: from position kv_len */
        break;
    case STRATA_UNIT_BLOCK:
        block_forward(m, u);
        break;
    case STRATA_UNIT_HEAD:
        TIMED(LAYERNORM, k->layernorm_forward(s, g->lnf, g->lnf_mean, g->lnf_rstd, strata_model_resid(m, L), P(u, LNF_W), P(u, LNF_B), BT, C));
        strata_model_head_forward(m, g->lnf, P(0, WTE), STRATA_W_NK_TIED, C, train, dloss, loss_scale); /* (B,T,Vp) */
        break;
    }
}

static void block_backward(strata_model *m, int u) {
    const strata_kernels *k = m->dev->k;
    strata_stream *s = m->dev->compute;
    size_t es = strata_dtype_size(m->dev->compute_dtype);
    gpt2_acts *g = m->acts;
    int l = m->units[u].layer;
    int B = m->cur_B, T = m->cur_T, C = m->shape.n_embd, NH = m->shape.n_head, BT = B * T;
    int recomputed = strata_model_block_recomputed(m, l);
    if (recomputed) { /* activation checkpointing: rebuild the activations up to the MLP */
        strata_prof_set_phase(m->prof, STRATA_PROF_RECOMPUTE);
        block_forward_to_mlp(m, u);
        strata_prof_set_phase(m->prof, STRATA_PROF_BACKWARD);
    }
    block_acts *a = acts_of(m, l);
    /* m->dresid holds dL/d resid[l+1] and leaves holding dL/d resid[l]. The MLP's backward
     * runs m->mlp_rows rows at a time: a recomputed block's c_fc rebuilt for them, then
     * gelu(fch) rebuilt from it even where that just wrote it, so every block's c_proj
     * gradient reads the same kernel's output (on CUDA the forward's fused epilogue rounds
     * differently); the weight and bias gradients sum their rows chunk by chunk. */
    for (int r0 = 0; r0 < BT; r0 += m->mlp_rows) {
        int n = BT - r0 < m->mlp_rows ? BT - r0 : m->mlp_rows;
        size_t c_at = (size_t)r0 * C * es;
        void *fch = fch_at(m, a, l, r0, es);
        if (recomputed) {
            strata_prof_set_phase(m->prof, STRATA_PROF_RECOMPUTE);
            fc_forward(m, u, fch, r0, n);
            strata_prof_set_phase(m->prof, STRATA_PROF_BACKWARD);
        }
        TIMED(GELU, k->gelu_forward(s, g->fch_gelu, fch, (size_t)n * 4 * C));
        TIMED(MATMUL_FCPROJ, k->matmul_backward(s, g->dfch, G(u, FCPROJ_W), G(u, FCPROJ_B), (char *)m->dresid + c_at,
                                                g->fch_gelu, P(u, FCPROJ_W), n, 4 * C, C, STRATA_W_KN));
        TIMED(GELU, k->gelu_backward(s, g->dfch, fch, g->dfch, (size_t)n * 4 * C));
        TIMED(MATMUL_FC, k->matmul_backward(s, (char *)g->dbtc + c_at, G(u, FC_W), G(u, FC_B), g->dfch,
                                            (char *)a->ln2 + c_at, P(u, FC_W), n, C, 4 * C, STRATA_W_KN));
    }
    TIMED(LAYERNORM, k->layernorm_backward(s, m->dresid, G(u, LN2_W), G(u, LN2_B), g->dbtc, a->resid2, P(u, LN2_W), a->ln2_mean, a->ln2_rstd, BT, C));
    TIMED(MATMUL_ATTPROJ, k->matmul_backward(s, g->dbtc, G(u, ATTPROJ_W), G(u, ATTPROJ_B), m->dresid, a->atty, P(u, ATTPROJ_W), BT, C, C, STRATA_W_KN));
    TIMED(ATTENTION, k->attention_backward(s, g->dqkv, g->dbtc, a->qkv, a->atty, a->att_lse, m->cur_pos, B, T, NH, NH, C / NH));
    TIMED(MATMUL_QKV, k->matmul_backward(s, g->dbtc, G(u, QKV_W), G(u, QKV_B), g->dqkv, a->ln1, P(u, QKV_W), BT, C, 3 * C, STRATA_W_KN));
    TIMED(LAYERNORM, k->layernorm_backward(s, m->dresid, G(u, LN1_W), G(u, LN1_B), g->dbtc, strata_model_resid(m, l), P(u, LN1_W), a->ln1_mean, a->ln1_rstd, BT, C));
}

static int backward(strata_model *m, int u) {
    const strata_kernels *k = m->dev->k;
    strata_stream *s = m->dev->compute;
    size_t es = strata_dtype_size(m->dev->compute_dtype);
    gpt2_acts *g = m->acts;
    int B = m->cur_B, T = m->cur_T, C = m->shape.n_embd, BT = B * T;
    int L = m->shape.n_layer;
    switch (m->units[u].kind) {
    case STRATA_UNIT_HEAD:
        /* tied head: dwte (Vp,C) += dlogits^T lnf; dlnf = dlogits wte */
        strata_model_head_backward(m, g->lnf, P(0, WTE), STRATA_W_NK_TIED, C, g->dbtc, G(0, WTE));
        STRATA_TRY(strata_memset_async(m->dev, s, m->dresid, 0, (size_t)BT * C * es));
        TIMED(LAYERNORM, k->layernorm_backward(s, m->dresid, G(u, LNF_W), G(u, LNF_B), g->dbtc, strata_model_resid(m, L), P(u, LNF_W), g->lnf_mean, g->lnf_rstd, BT, C));
        break;
    case STRATA_UNIT_BLOCK:
        block_backward(m, u);
        break;
    case STRATA_UNIT_EMBED:
        TIMED(EMBEDDING, k->encoder_backward(s, G(0, WTE), G(0, WPE), m->dresid, m->inputs, m->order, m->cur_pos, m->pos_order, B, T, C));
        break;
    }
    return 0;
}

const strata_model_family strata_family_gpt2 = {
    .name = "gpt2",
    .learned_positions = 1,
    .block_tensors = BLOCK_TENSORS,
    .build = build,
    .plan = plan,
    .upload_constants = NULL,
    .forward = forward,
    .backward = backward,
    .init_rule = init_rule,
    .flops_per_token = flops_per_token,
    .timed_calls = timed_calls,
    .free_acts = free_acts,
    .qkv_width = qkv_width,
};
