/* core/model_llama.c: the Llama family (Llama 2/3.x, Mistral, Qwen2/2.5, Qwen3) as units,
 * forward and backward through the kernel table.
 * Shapes: B batch, T time, C channels, NH query heads, NKV key/value heads, hd head size,
 * Q = (NH + 2 NKV) hd the fused q|k|v width, I the MLP's width, V vocabulary, Vp padded.
 *
 *   unit 0      model.embed_tokens.weight (Vp,C; rows V..Vp-1 stay zero)
 *   unit 1..L   block l = u-1, named model.layers.l.*, weights nn.Linear's (out, in):
 *                 input_layernorm.weight            (C)
 *                 self_attn.q_proj.weight           (NH hd, C)  \  adjacent: one (Q, C)
 *                 self_attn.k_proj.weight           (NKV hd, C)  > matrix, so one product
 *                 self_attn.v_proj.weight           (NKV hd, C) /  makes the q|k|v rows
 *                 self_attn.{q,k,v}_proj.bias       (NH hd), (NKV hd), (NKV hd)  [qkv_bias: one (Q)]
 *                 self_attn.q_norm.weight, k_norm.weight  (hd) each               [qk_norm]
 *                 self_attn.o_proj.weight           (C, NH hd)
 *                 post_attention_layernorm.weight   (C)
 *                 mlp.gate_proj.weight              (I, C)  \ adjacent: one (2I, C) matrix,
 *                 mlp.up_proj.weight                (I, C)  / the gate|up product SwiGLU reads
 *                 mlp.down_proj.weight              (C, I)
 *   unit L+1    model.norm.weight (C), and lm_head.weight (Vp,C) unless tied to the embedding
 *
 * A block: x -> RMSNorm -> q|k|v (+ bias) -> [per-head RMSNorm of q and k] -> RoPE on q and
 * k -> grouped-query attention -> o_proj -> + x -> RMSNorm -> gate|up -> SwiGLU -> down_proj
 * -> + (the residual after attention). RoPE's inverse frequencies are computed here, on the
 * host, once, in fp32 as transformers computes them, and uploaded at the first batch. */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/kernels.h"
#include "core/model.h"
#include "core/model_family.h"
#include "core/profile.h"

/* The most tensors a block has: norm, q, k, v, three biases, two q/k norms, o, norm,
 * gate, up, down. */
#define BLOCK_TENSORS_MAX 14

/* A block's parameters (or their gradients) by name, inside a unit buffer. */
typedef struct block_params {
    void *ln1;    /* (C) input_layernorm */
    void *qkv;    /* (Q, C) q_proj, k_proj, v_proj */
    void *qkv_b;  /* (Q), NULL without qkv_bias */
    void *q_norm; /* (hd), NULL without qk_norm */
    void *k_norm; /* (hd) */
    void *o;      /* (C, NH hd) o_proj */
    void *ln2;    /* (C) post_attention_layernorm */
    void *gu;     /* (2I, C) gate_proj, up_proj */
    void *down;   /* (C, I) down_proj */
} block_params;

/* Activations of one block (B,T,...). */
typedef struct block_acts {
    void *ln1;          /* (B,T,C) input_layernorm(x) */
    float *ln1_rstd;    /* (B,T) */
    void *qkv_raw;      /* (B,T,Q) the projection before the q/k norms [qk_norm] */
    float *q_rstd;      /* (B,T,NH) [qk_norm] */
    float *k_rstd;      /* (B,T,NKV) [qk_norm] */
    void *qkv;          /* (B,T,Q) q|k|v as the attention read them: normed, rotated */
    void *atty;         /* (B,T,NH hd) attention output before o_proj */
    float *att_lse;     /* (B,NH,T) */
    void *resid2;       /* (B,T,C) x + o_proj(atty) */
    void *ln2;          /* (B,T,C) */
    float *ln2_rstd;    /* (B,T) */
    void *gu;           /* (B,T,2I) gate|up; (R,2I) for the recomputed blocks' shared set */
} block_acts;

/* Everything the family keeps beside the residual streams and the logits (arena). */
typedef struct llama_acts {
    block_acts *h;      /* per block; blocks recomputed in backward share `recompute` */
    block_acts recompute;
    void *scratch_btc;  /* (B,T,C) o_proj and down_proj outputs before the residual add */
    /* (R,I) silu(gate) * up of the block at hand, R = mlp_rows (B*T unless the MLP runs
     * in chunks): its forward writes it for down_proj, its backward rebuilds it from gu
     * (the same kernel: the same bits) for down_proj's weight gradient. One buffer for all
     * blocks instead of one each: L-1 times B T I elements less without activation
     * checkpointing. */
    void *mlp;
    void *lnf;          /* (B,T,C) model.norm(resid[L]) */
    float *lnf_rstd;    /* (B,T) */
    float *inv_freq;    /* (hd/2) fp32: RoPE's inverse frequencies */
    float *inv_freq_host; /* the same on the host, computed at plan time */
    void *zeros_hd;     /* (hd) zeros [qk_norm]: see block_backward */
    float *rstd_scratch; /* (B,T,NH+NKV) [qk_norm] */
    /* gradient buffers for backward */
    void *dbtc;         /* (B,T,C) */
    void *datty;        /* (B,T,NH hd) */
    void *dqkv;         /* (B,T,Q) */
    void *dqkv_raw;     /* (B,T,Q) [qk_norm] */
    void *dgu;          /* (R,2I) */
    void *dmlp;         /* (R,I) */
} llama_acts;

/* Sizes every function below needs. */
typedef struct dims {
    int L, C, NH, NKV, hd, I, Q, A; /* A = NH hd, the attention's output width */
} dims;

static dims dims_of(const strata_model *m) {
    const strata_model_shape *s = &m->shape;
    dims d = {.L = s->n_layer, .C = s->n_embd, .NH = s->n_head, .I = s->intermediate_size};
    d.NKV = s->n_kv_head > 0 ? s->n_kv_head : s->n_head;
    d.hd = s->head_dim > 0 ? s->head_dim : s->n_embd / s->n_head;
    d.Q = (d.NH + 2 * d.NKV) * d.hd;
    d.A = d.NH * d.hd;
    return d;
}

static size_t qkv_width(const strata_model *m) { return (size_t)dims_of(m).Q; }

/* ---- tensors ---- */

static void add_block(strata_model *m, int u, int l, dims d) {
    char n[STRATA_TENSOR_NAME_MAX];
#define T1(suffix, n0) (snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix), strata_model_add_tensor(m, u, n, 1, n0, 0, 0))
#define T2(suffix, n0, n1) (snprintf(n, sizeof n, "model.layers.%d.%s", l, suffix), strata_model_add_tensor(m, u, n, 2, n0, n1, 0))
    T1("input_layernorm.weight", d.C);
    T2("self_attn.q_proj.weight", d.NH * d.hd, d.C);
    T2("self_attn.k_proj.weight", d.NKV * d.hd, d.C);
    T2("self_attn.v_proj.weight", d.NKV * d.hd, d.C);
    if (m->shape.qkv_bias) {
        T1("self_attn.q_proj.bias", d.NH * d.hd);
        T1("self_attn.k_proj.bias", d.NKV * d.hd);
        T1("self_attn.v_proj.bias", d.NKV * d.hd);
    }
    if (m->shape.qk_norm) {
        T1("self_attn.q_norm.weight", d.hd);
        T1("self_attn.k_norm.weight", d.hd);
    }
    T2("self_attn.o_proj.weight", d.C, d.A);
    T1("post_attention_layernorm.weight", d.C);
    T2("mlp.gate_proj.weight", d.I, d.C);
    T2("mlp.up_proj.weight", d.I, d.C);
    T2("mlp.down_proj.weight", d.C, d.I);
#undef T1
#undef T2
}

static void build(strata_model *m) {
    dims d = dims_of(m);
    int Vp = m->shape.padded_vocab_size;
    strata_model_set_unit(m, 0, STRATA_UNIT_EMBED, -1);
    strata_model_add_tensor(m, 0, "model.embed_tokens.weight", 2, Vp, d.C, 1); /* rows >= V: padding */
    for (int l = 0; l < d.L; l++) {
        strata_model_set_unit(m, 1 + l, STRATA_UNIT_BLOCK, l);
        add_block(m, 1 + l, l, d);
    }
    int head = d.L + 1;
    strata_model_set_unit(m, head, STRATA_UNIT_HEAD, -1);
    strata_model_add_tensor(m, head, "model.norm.weight", 1, d.C, 0, 0);
    if (!m->shape.tie_embeddings) strata_model_add_tensor(m, head, "lm_head.weight", 2, Vp, d.C, 1);
}

/* Block tensors by name, from a unit buffer of `es`-byte elements (the parameters in the
 * compute dtype, or the fp32 gradients). The tensors' order is add_block's. */
static block_params block_tensors(const strata_model *m, void *base, int u, size_t es) {
    block_params p = {0};
    int i = 0;
#define NEXT() strata_model_tensor_ptr(m, base, u, i++, es)
    p.ln1 = NEXT();
    p.qkv = NEXT();
    i += 2; /* k_proj, v_proj follow q_proj */
    if (m->shape.qkv_bias) {
        p.qkv_b = NEXT();
        i += 2;
    }
    if (m->shape.qk_norm) {
        p.q_norm = NEXT();
        p.k_norm = NEXT();
    }
    p.o = NEXT();
    p.ln2 = NEXT();
    p.gu = NEXT();
    i++; /* up_proj follows gate_proj */
    p.down = NEXT();
#undef NEXT
    STRATA_ASSERT(i == m->units[u].n_tensors);
    return p;
}

/* The head's LM weight (Vp, C) inside unit buffers of `es`-byte elements: lm_head in the
 * head's own, or the token embedding in unit 0's when tied. */
/* the head's weight: the embedding read as (Vp, C), or lm_head's own nn.Linear weight */
static int head_layout(const strata_model *m) { return m->shape.tie_embeddings ? STRATA_W_NK_TIED : STRATA_W_NK; }

static void *head_weight(const strata_model *m, void *head_base, void *embed_base, size_t es) {
    if (m->shape.tie_embeddings) return strata_model_tensor_ptr(m, embed_base, 0, 0, es);
    return strata_model_tensor_ptr(m, head_base, m->shape.n_layer + 1, 1, es);
}

static double flops_per_token(const strata_model *m, int T) {
    dims d = dims_of(m);
    double V = m->shape.vocab_size;
    double per_block = (double)d.C * d.Q + (double)d.A * d.C + 3.0 * d.C * d.I;
    double n_matmul = d.L * per_block + V * d.C;
    return 6.0 * n_matmul + 12.0 * d.L * (double)d.A * T;
}

/* per block at most (qk_norm): the forward's 12 timed calls (3 of them a chunk of the
 * MLP's), the backward's 11 (4 a chunk's), a recompute's 9 (1 a chunk's), and 8 more for
 * each further chunk; the embedding's forward and backward, the head's 3 + 2 */
static int timed_calls(const strata_model *m) {
    int BT = m->B * m->T, chunks = (BT + m->mlp_rows - 1) / m->mlp_rows;
    return (32 + 8 * (chunks - 1)) * m->shape.n_layer + 7;
}

/* ---- RoPE's inverse frequencies ---- */

/* inv_freq (hd/2) in fp32 step by step as transformers (5.x modeling_rope_utils) computes
 * it with torch on the CPU:
 *   default: 1.0 / (theta ** (arange(0, hd, 2).float() / hd))
 *   llama3 (_compute_llama3_parameters): wavelen = 2 pi / inv_freq; wavelengths above
 *     original_context / low_freq_factor divided by factor, those between that and
 *     original_context / high_freq_factor smoothed between the two.
 * Python's numbers enter torch's float32 ops as float32 (a / t is t.reciprocal() * a). The
 * one known difference: torch raises theta to the power with its vectorised pow in blocks
 * of 32 frequencies (head size >= 64 on AVX-512), which is within 1 ulp of powf but not
 * always equal to it. */
void strata_model_rope_inv_freq(const strata_model_shape *s, float *inv_freq) {
    int hd = s->head_dim > 0 ? s->head_dim : s->n_embd / s->n_head;
    float base = (float)s->rope_theta, dim = (float)hd;
    for (int i = 0; i < hd / 2; i++) {
        float e = (float)(2 * i) / dim;
        inv_freq[i] = 1.0f / powf(base, e);
    }
    if (s->rope_type != STRATA_ROPE_LLAMA3) return;
    float factor = (float)s->rope_factor, lf = (float)s->rope_low_freq_factor;
    float old = (float)s->rope_original_context;
    float low_wavelen = (float)(s->rope_original_context / s->rope_low_freq_factor);
    float high_wavelen = (float)(s->rope_original_context / s->rope_high_freq_factor);
    float span = (float)(s->rope_high_freq_factor - s->rope_low_freq_factor);
    float two_pi = (float)(2.0 * 3.141592653589793);
    for (int i = 0; i < hd / 2; i++) {
        float f = inv_freq[i];
        float wavelen = (1.0f / f) * two_pi;
        float scaled = wavelen > low_wavelen ? f / factor : f;
        float smooth = ((1.0f / wavelen) * old - lf) / span;
        float smoothed = (1.0f - smooth) * scaled / factor + smooth * scaled;
        int medium = !(wavelen < high_wavelen) && !(wavelen > low_wavelen);
        inv_freq[i] = medium ? smoothed : scaled;
    }
}

/* ---- memory plan ---- */

/* gu_rows: rows of gate|up the block keeps (B*T, or a chunk's for the recomputed blocks'
 * shared set when the MLP runs in chunks: their backward rebuilds it a chunk at a time) */
static void plan_block_acts(strata_model *m, strata_arena *a, block_acts *x, const char *who, size_t es,
                            size_t gu_rows) {
    dims d = dims_of(m);
    size_t BT = (size_t)m->B * m->T;
    char n[64];
#define R(field, bytes) (snprintf(n, sizeof n, "%s.%s", who, #field), strata_model_reserve(a, n, bytes, (void **)&x->field))
    R(ln1, BT * d.C * es);
    R(ln1_rstd, BT * 4);
    if (m->shape.qk_norm) {
        R(qkv_raw, BT * d.Q * es);
        R(q_rstd, BT * d.NH * 4);
        R(k_rstd, BT * d.NKV * 4);
    }
    R(qkv, BT * d.Q * es);
    R(atty, BT * d.A * es);
    R(att_lse, BT * d.NH * 4);
    R(resid2, BT * d.C * es);
    R(ln2, BT * d.C * es);
    R(ln2_rstd, BT * 4);
    R(gu, gu_rows * 2 * d.I * es);
#undef R
}

static block_acts *acts_of(strata_model *m, int l) {
    llama_acts *x = m->acts;
    return strata_model_block_recomputed(m, l) ? &x->recompute : &x->h[l];
}

static void plan(strata_model *m, strata_arena *a, size_t es, size_t mlp_chunk_bytes) {
    dims d = dims_of(m);
    size_t BT = (size_t)m->B * m->T;
    llama_acts *x = strata_xcalloc(1, sizeof *x);
    m->acts = x;
    x->h = strata_xcalloc(d.L, sizeof *x->h);
    x->inv_freq_host = strata_xmalloc((size_t)(d.hd / 2) * sizeof(float));
    strata_model_rope_inv_freq(&m->shape, x->inv_freq_host);
    /* the MLP's rows at a time: its widest activation is gate|up's 2I */
    size_t R = (size_t)(m->mlp_rows = strata_model_chunk_rows(mlp_chunk_bytes, 2 * (size_t)d.I * es, BT));
    char n[64];
    int any_recomputed = 0;
    for (int l = 0; l < d.L; l++) {
        if (strata_model_block_recomputed(m, l)) {
            any_recomputed = 1;
            continue;
        }
        snprintf(n, sizeof n, "layers.%d", l);
        plan_block_acts(m, a, &x->h[l], n, es, BT);
    }
    if (any_recomputed) plan_block_acts(m, a, &x->recompute, "recompute", es, R);
    /* Buffers whose lives never overlap share memory. One holds scratch_btc (a block's
     * forward: o_proj's and down_proj's outputs, spent by the residual adds; in a recomputed
     * block's backward, before its gradients), dbtc (a block's backward: the gradient into
     * ln2, then the one into ln1, each spent by its norm's backward; the head's gradient
     * into lnf) and datty (o_proj's gradient, made after dbtc's first is spent and spent by
     * attention's backward before dbtc's second); the other lnf (from the head's forward to
     * its backward) and dqkv (a block's backward, from attention's to q|k|v's). At Llama 3
     * 8B's width that is 2.5 (B,T,C) buffers rather than 5.5. */
    size_t C = d.C, A = d.A, Q = d.Q;
    strata_model_reserve(a, "scratch_btc", BT * (C > A ? C : A) * es, &x->scratch_btc);
    strata_arena_share(a, "dbtc", BT * C * es, &x->dbtc);
    strata_arena_share(a, "datty", BT * A * es, &x->datty);
    strata_model_reserve(a, "lnf", BT * (C > Q ? C : Q) * es, &x->lnf);
    strata_arena_share(a, "dqkv", BT * Q * es, &x->dqkv);
    /* and silu(gate)*up (spent by down_proj's weight gradient) with gate|up's gradient,
     * made after it */
    strata_model_reserve(a, "dgu", R * 2 * d.I * es, &x->dgu);
    strata_arena_share(a, "mlp", R * d.I * es, &x->mlp);
    strata_model_reserve(a, "lnf_rstd", BT * 4, (void **)&x->lnf_rstd);
    strata_model_reserve(a, "rope_inv_freq", (size_t)(d.hd / 2) * 4, (void **)&x->inv_freq);
    if (m->shape.qk_norm) {
        strata_model_reserve(a, "zeros_hd", (size_t)d.hd * es, &x->zeros_hd);
        strata_model_reserve(a, "rstd_scratch", BT * (size_t)(d.NH + d.NKV) * 4, (void **)&x->rstd_scratch);
        strata_model_reserve(a, "dqkv_raw", BT * d.Q * es, &x->dqkv_raw);
    }
    strata_model_reserve(a, "dmlp", R * d.I * es, &x->dmlp);
}

static int upload_constants(strata_model *m) {
    llama_acts *x = m->acts;
    dims d = dims_of(m);
    STRATA_TRY(strata_memcpy_async(m->dev, m->dev->compute, x->inv_freq, x->inv_freq_host, (size_t)(d.hd / 2) * 4));
    if (x->zeros_hd)
        STRATA_TRY(strata_memset_async(m->dev, m->dev->compute, x->zeros_hd, 0,
                                       (size_t)d.hd * strata_dtype_size(m->dev->compute_dtype)));
    return 0;
}

static void free_acts(strata_model *m) {
    llama_acts *x = m->acts;
    if (x) {
        free(x->h);
        free(x->inv_freq_host);
    }
    free(x);
    m->acts = NULL;
}

/* ---- initialisation ---- */

/* transformers' LlamaPreTrainedModel._init_weights: every matrix and the embedding
 * normal(0, initializer_range), biases 0, norm weights 1. */
static strata_init_rule init_rule(const strata_model *m, int ti) {
    const strata_param_tensor *t = &m->tensors[ti];
    size_t len = strlen(t->name);
    if (t->ndim == 2) return (strata_init_rule){.std = m->shape.init_std};
    if (len > 5 && !strcmp(t->name + len - 5, ".bias")) return (strata_init_rule){.value = 0.0f};
    return (strata_init_rule){.value = 1.0f}; /* the norms' weights */
}

/* ---- forward and backward ---- */

/* Where rows [r0, ...) of block l's gate|up product live: its own (B,T,2I) buffer, or,
 * for a recomputed block, the shared buffer from its start (a chunk's rows when the MLP
 * runs in chunks; the backward rebuilds each chunk before its use). */
static void *gu_at(const strata_model *m, const block_acts *a, int l, int r0, size_t es) {
    size_t I = (size_t)m->shape.intermediate_size;
    return (char *)a->gu + (strata_model_block_recomputed(m, l) ? 0 : (size_t)r0 * 2 * I * es);
}

/* The block up to its MLP: x -> RMSNorm -> attention -> + x = resid2 -> RMSNorm = ln2. */
static void block_forward_to_mlp(strata_model *m, int u) {
    const strata_kernels *k = m->dev->k;
    strata_stream *s = m->dev->compute;
    strata_dtype dt = m->dev->compute_dtype;
    size_t es = strata_dtype_size(dt);
    llama_acts *g = m->acts;
    dims d = dims_of(m);
    int l = m->units[u].layer;
    int B = m->cur_B, T = m->cur_T, BT = B * T;
    float eps = m->shape.rms_norm_eps;
    block_params p = block_tensors(m, m->params[u], u, es);
    block_acts *a = acts_of(m, l);
    void *x = strata_model_resid(m, l);
    size_t k_at = (size_t)d.NH * d.hd * es; /* k's heads start there in a q|k|v row */
    /* decoding (strata_model_extend, B 1): the T new rows' q|k|v go after the cache's kv_len,
     * turned by their own positions, and attention runs over all kv_len + T of them (its
     * output's last T rows are the new ones'); else the batch's own buffer */
    int ext = m->extending, att_T = ext ? m->kv_len + T : T;
    void *qkv_all = ext ? m->kv[l] : a->qkv, *qkv = (char *)qkv_all + (ext ? (size_t)m->kv_len * d.Q * es : 0);
    const int32_t *rope_pos = ext ? m->kv_pos : m->cur_pos, *att_pos = ext ? NULL : m->cur_pos;
    TIMED(RMSNORM, k->rmsnorm_forward(s, a->ln1, a->ln1_rstd, x, p.ln1, BT, 1, d.C, d.C, eps)); /* (B,T,C) */
    if (!m->shape.qk_norm) {
        TIMED(MATMUL_QKV, k->matmul_forward(s, qkv, NULL, a->ln1, p.qkv, p.qkv_b, BT, d.C, d.Q, STRATA_W_NK)); /* (B,T,Q) */
    } else {
        /* Qwen3: q and k normed per head (the raw projection kept for the backward), v as is */
        TIMED(MATMUL_QKV, k->matmul_forward(s, a->qkv_raw, NULL, a->ln1, p.qkv, p.qkv_b, BT, d.C, d.Q, STRATA_W_NK));
        TIMED(RMSNORM, k->convert(s, qkv, dt, a->qkv_raw, dt, (size_t)BT * d.Q),
              k->rmsnorm_forward(s, qkv, a->q_rstd, a->qkv_raw, p.q_norm, BT, d.NH, d.hd, d.Q, eps),
              k->rmsnorm_forward(s, (char *)qkv + k_at, a->k_rstd, (char *)a->qkv_raw + k_at, p.k_norm, BT, d.NKV,
                                 d.hd, d.Q, eps));
    }
    TIMED(ROPE, k->rope_forward(s, qkv, g->inv_freq, rope_pos, B, T, d.NH, d.hd, d.Q),
          k->rope_forward(s, (char *)qkv + k_at, g->inv_freq, rope_pos, B, T, d.NKV, d.hd, d.Q));
    TIMED(ATTENTION, k->attention_forward(s, a->atty, a->att_lse, qkv_all, att_pos, B, att_T, d.NH, d.NKV, d.hd)); /* (B,T,NH hd) */
    void *atty = (char *)a->atty + (size_t)(att_T - T) * d.A * es; /* the new rows' */
    TIMED(MATMUL_ATTPROJ, k->matmul_forward(s, g->scratch_btc, NULL, atty, p.o, NULL, BT, d.A, d.C, STRATA_W_NK)); /* (B,T,C) */
    TIMED(RESIDUAL, k->residual_forward(s, a->resid2, x, g->scratch_btc, (size_t)BT * d.C));
    TIMED(RMSNORM, k->rmsnorm_forward(s, a->ln2, a->ln2_rstd, a->resid2, p.ln2, BT, 1, d.C, d.C, eps));
}

/* The whole block; the MLP m->mlp_rows rows at a time (all of them unless
 * train.mlp_chunk_mb says otherwise: each row's output is its own). */
static void block_forward(strata_model *m, int u) {
    const strata_kernels *k = m->dev->k;
    strata_stream *s = m->dev->compute;
    size_t es = strata_dtype_size(m->dev->compute_dtype);
    llama_acts *g = m->acts;
    dims d = dims_of(m);
    int l = m->units[u].layer;
    int BT = m->cur_B * m->cur_T;
    block_params p = block_tensors(m, m->params[u], u, es);
    block_acts *a = acts_of(m, l);
    block_forward_to_mlp(m, u);
    for (int r0 = 0; r0 < BT; r0 += m->mlp_rows) {
        int n = BT - r0 < m->mlp_rows ? BT - r0 : m->mlp_rows;
        size_t c_at = (size_t)r0 * d.C * es;
        void *gu = gu_at(m, a, l, r0, es);
        TIMED(MATMUL_FC, k->matmul_forward(s, gu, NULL, (char *)a->ln2 + c_at, p.gu, NULL, n, d.C, 2 * d.I, STRATA_W_NK)); /* (n,2I) */
        TIMED(SWIGLU, k->swiglu_forward(s, g->mlp, gu, n, d.I));                                   /* (n,I) */
        TIMED(MATMUL_FCPROJ, k->matmul_forward(s, (char *)g->scratch_btc + c_at, NULL, g->mlp, p.down, NULL, n, d.I, d.C,
                                               STRATA_W_NK)); /* (n,C) */
    }
    TIMED(RESIDUAL, k->residual_forward(s, strata_model_resid(m, l + 1), a->resid2, g->scratch_btc, (size_t)BT * d.C));
}

static void forward(strata_model *m, int u, int train, float dloss, float loss_scale) {
    const strata_kernels *k = m->dev->k;
    strata_stream *s = m->dev->compute;
    size_t es = strata_dtype_size(m->dev->compute_dtype);
    llama_acts *g = m->acts;
    dims d = dims_of(m);
    int B = m->cur_B, T = m->cur_T, BT = B * T;
    switch (m->units[u].kind) {
    case STRATA_UNIT_EMBED:
        TIMED(EMBEDDING, k->encoder_forward(s, strata_model_resid(m, 0), m->inputs, NULL, m->params[0], NULL, B, T, d.C)); /* (B,T,C) */
        break;
    case STRATA_UNIT_BLOCK:
        block_forward(m, u);
        break;
    case STRATA_UNIT_HEAD: {
        void *norm = strata_model_tensor_ptr(m, m->params[u], u, 0, es);
        void *w = head_weight(m, m->params[u], m->params[0], es); /* (Vp, C) */
        TIMED(RMSNORM, k->rmsnorm_forward(s, g->lnf, g->lnf_rstd, strata_model_resid(m, d.L), norm, BT, 1, d.C, d.C,
                                          m->shape.rms_norm_eps));
        strata_model_head_forward(m, g->lnf, w, head_layout(m), d.C, train, dloss, loss_scale); /* (B,T,Vp) */
        break;
    }
    }
}

static void block_backward(strata_model *m, int u) {
    const strata_kernels *k = m->dev->k;
    strata_stream *s = m->dev->compute;
    size_t es = strata_dtype_size(m->dev->compute_dtype);
    llama_acts *g = m->acts;
    dims d = dims_of(m);
    int l = m->units[u].layer;
    int B = m->cur_B, T = m->cur_T, BT = B * T;
    block_params p = block_tensors(m, m->params[u], u, es);
    block_params gr = block_tensors(m, m->grads[u], u, sizeof(float));
    block_acts *a = acts_of(m, l);
    int recomputed = strata_model_block_recomputed(m, l);
    if (recomputed) { /* activation checkpointing: rebuild the activations up to the MLP */
        strata_prof_set_phase(m->prof, STRATA_PROF_RECOMPUTE);
        block_forward_to_mlp(m, u);
        strata_prof_set_phase(m->prof, STRATA_PROF_BACKWARD);
    }
    size_t k_at = (size_t)d.NH * d.hd * es;
    /* m->dresid holds dL/d resid[l+1] and leaves holding dL/d resid[l]. The MLP's backward
     * runs m->mlp_rows rows at a time: a recomputed block's gate|up rebuilt for them, then
     * silu(gate)*up rebuilt from it (the forward's kernel: the same bits) for down_proj's
     * weight gradient; the weight gradients sum their rows chunk by chunk. */
    for (int r0 = 0; r0 < BT; r0 += m->mlp_rows) {
        int n = BT - r0 < m->mlp_rows ? BT - r0 : m->mlp_rows;
        size_t c_at = (size_t)r0 * d.C * es;
        void *gu = gu_at(m, a, l, r0, es);
        if (recomputed) {
            strata_prof_set_phase(m->prof, STRATA_PROF_RECOMPUTE);
            TIMED(MATMUL_FC, k->matmul_forward(s, gu, NULL, (char *)a->ln2 + c_at, p.gu, NULL, n, d.C, 2 * d.I, STRATA_W_NK));
            strata_prof_set_phase(m->prof, STRATA_PROF_BACKWARD);
        }
        TIMED(SWIGLU, k->swiglu_forward(s, g->mlp, gu, n, d.I));
        TIMED(MATMUL_FCPROJ, k->matmul_backward(s, g->dmlp, gr.down, NULL, (char *)m->dresid + c_at, g->mlp, p.down, n, d.I,
                                                d.C, STRATA_W_NK));
        TIMED(SWIGLU, k->swiglu_backward(s, g->dgu, g->dmlp, gu, n, d.I));
        TIMED(MATMUL_FC, k->matmul_backward(s, (char *)g->dbtc + c_at, gr.gu, NULL, g->dgu, (char *)a->ln2 + c_at, p.gu, n,
                                            d.C, 2 * d.I, STRATA_W_NK));
    }
    TIMED(RMSNORM, k->rmsnorm_backward(s, m->dresid, gr.ln2, g->dbtc, a->resid2, p.ln2, a->ln2_rstd, BT, 1, d.C, d.C));
    TIMED(MATMUL_ATTPROJ, k->matmul_backward(s, g->datty, gr.o, NULL, m->dresid, a->atty, p.o, BT, d.A, d.C, STRATA_W_NK));
    TIMED(ATTENTION, k->attention_backward(s, g->dqkv, g->datty, a->qkv, a->atty, a->att_lse, m->cur_pos, B, T, d.NH, d.NKV, d.hd));
    TIMED(ROPE, k->rope_backward(s, g->dqkv, g->inv_freq, m->cur_pos, B, T, d.NH, d.hd, d.Q),
          k->rope_backward(s, (char *)g->dqkv + k_at, g->inv_freq, m->cur_pos, B, T, d.NKV, d.hd, d.Q));
    void *dqkv = g->dqkv; /* (B,T,Q): the gradient of the projection's output */
    if (m->shape.qk_norm) {
        /* dqkv_raw = [dq through q's norm | dk through k's norm | dv]. The norms' backward
         * accumulates into a strided half of each row, so that half is cleared first: an
         * RMSNorm with weight 0 writes exact zeros there (there is no strided memset), and
         * dv comes along with the copy. */
        TIMED(RMSNORM, k->convert(s, g->dqkv_raw, m->dev->compute_dtype, g->dqkv, m->dev->compute_dtype, (size_t)BT * d.Q),
              k->rmsnorm_forward(s, g->dqkv_raw, g->rstd_scratch, g->dqkv, g->zeros_hd, BT, d.NH + d.NKV, d.hd, d.Q, 1.0f),
              k->rmsnorm_backward(s, g->dqkv_raw, gr.q_norm, g->dqkv, a->qkv_raw, p.q_norm, a->q_rstd, BT, d.NH, d.hd, d.Q),
              k->rmsnorm_backward(s, (char *)g->dqkv_raw + k_at, gr.k_norm, (char *)g->dqkv + k_at,
                                  (char *)a->qkv_raw + k_at, p.k_norm, a->k_rstd, BT, d.NKV, d.hd, d.Q));
        dqkv = g->dqkv_raw;
    }
    TIMED(MATMUL_QKV, k->matmul_backward(s, g->dbtc, gr.qkv, gr.qkv_b, dqkv, a->ln1, p.qkv, BT, d.C, d.Q, STRATA_W_NK));
    TIMED(RMSNORM, k->rmsnorm_backward(s, m->dresid, gr.ln1, g->dbtc, strata_model_resid(m, l), p.ln1, a->ln1_rstd, BT, 1, d.C, d.C));
}

static int backward(strata_model *m, int u) {
    const strata_kernels *k = m->dev->k;
    strata_stream *s = m->dev->compute;
    size_t es = strata_dtype_size(m->dev->compute_dtype);
    llama_acts *g = m->acts;
    dims d = dims_of(m);
    int B = m->cur_B, T = m->cur_T, BT = B * T;
    switch (m->units[u].kind) {
    case STRATA_UNIT_HEAD: {
        void *norm = strata_model_tensor_ptr(m, m->params[u], u, 0, es);
        float *dnorm = strata_model_tensor_ptr(m, m->grads[u], u, 0, sizeof(float));
        void *w = head_weight(m, m->params[u], m->params[0], es);
        float *dw = head_weight(m, m->grads[u], m->grads[0], sizeof(float));
        /* dw (Vp,C) += dlogits^T lnf; dlnf = dlogits w */
        strata_model_head_backward(m, g->lnf, w, head_layout(m), d.C, g->dbtc, dw);
        STRATA_TRY(strata_memset_async(m->dev, s, m->dresid, 0, (size_t)BT * d.C * es));
        TIMED(RMSNORM, k->rmsnorm_backward(s, m->dresid, dnorm, g->dbtc, strata_model_resid(m, d.L), norm, g->lnf_rstd, BT, 1, d.C, d.C));
        break;
    }
    case STRATA_UNIT_BLOCK:
        block_backward(m, u);
        break;
    case STRATA_UNIT_EMBED:
        TIMED(EMBEDDING, k->encoder_backward(s, m->grads[0], NULL, m->dresid, m->inputs, m->order, NULL, NULL, B, T, d.C)); /* (Vp,C) */
        break;
    }
    return 0;
}

const strata_model_family strata_family_llama = {
    .name = "llama",
    .block_tensors = BLOCK_TENSORS_MAX,
    .build = build,
    .plan = plan,
    .upload_constants = upload_constants,
    .forward = forward,
    .backward = backward,
    .init_rule = init_rule,
    .flops_per_token = flops_per_token,
    .timed_calls = timed_calls,
    .free_acts = free_acts,
    .qkv_width = qkv_width,
};
