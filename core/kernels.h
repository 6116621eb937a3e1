/* core/kernels.h: the math a step of either model family needs (GPT-2; the Llama family:
 * RMSNorm, rotary positions, SwiGLU, grouped-query attention), as a table each backend fills in.
 * core/cpu/kernels_cpu.c is the fp32 OpenMP reference (the oracle); core/cuda/kernels_cuda.cu
 * computes in bf16 with fp32 accumulation. The model calls only through this table.
 *
 * Conventions, for every kernel:
 *  - `s` is the stream to run on; the CPU backend runs on the calling thread.
 *  - "act" tensors (activations, their gradients) and parameters are in the device's
 *    compute dtype (fp32 on the CPU, bf16 on CUDA) and passed as void*.
 *  - weight gradients (dw, db, dwte, ...) are always fp32 and ACCUMULATED (+=), so
 *    micro-batches add up and the tied embedding gets both of its contributions.
 *  - LayerNorm statistics, attention log-sum-exp and losses are fp32.
 *  - Shapes are given as (rows, cols), row-major; B batch, T time, C channels,
 *    NH query heads, NKV key/value heads, hs the head size (C/NH for GPT-2), V
 *    vocabulary, Vp padded vocabulary (V <= Vp), I the SwiGLU MLP's width.
 *  - "dinp (+=)" accumulates into dinp; "dinp (=)" overwrites it. */
#ifndef STRATA_KERNELS_H
#define STRATA_KERNELS_H

#include <stddef.h>
#include <stdint.h>

#include "core/device.h"

/* How a product's weight W is laid out (matmul_forward/backward's w_nk). Both (N,K) kinds
 * compute the same product; they are told apart so a backend can pick the product kernel
 * that is faster for each (the CPU backend's measured choice, core/cpu/kernels_cpu.c). */
enum {
    STRATA_W_KN = 0,      /* (K,N): Hugging Face's Conv1D (GPT-2's linear layers) */
    STRATA_W_NK_TIED = 1, /* (N,K): the embedding (Vp,C) read as a tied LM head */
    STRATA_W_NK = 2,      /* (N,K): an nn.Linear weight (out, in): the Llama family's
                           * projections and its untied head */
};

struct strata_adamw_segment; /* core/optim.h */

/* AdamW hyperparameters for one update; bias corrections are precomputed by the caller
 * (bc1 = 1 - beta1^t, bc2 = 1 - beta2^t) so every backend does identical arithmetic. */
typedef struct strata_adamw_args {
    float lr;
    float beta1, beta2, eps;
    float weight_decay; /* 0 for tensors that are not decayed */
    float bc1, bc2;
    float grad_scale; /* multiplies the gradient first (clipping and averaging) */
} strata_adamw_args;

struct strata_kernels {
    /* out (B,T,C) = wte[tok[b,t]] (V,C) + wpe[p] (maxT,C), p the token's position: t, or
     * pos[b,t] when pos (B,T, device) is given (packed documents, each from position 0:
     * see attention_forward); wpe NULL: no learned positions (the Llama family rotates q
     * and k instead) */
    void (*encoder_forward)(strata_stream *s, void *out, const int32_t *tok, const int32_t *pos, const void *wte,
                            const void *wpe, int B, int T, int C);
    /* dwte (V,C) += scatter of dout; dwpe (maxT,C) += sum of the dout rows at each position
     * (skipped when dwpe is NULL): over b at position t, or with pos over the (b,t) whose
     * pos is p. order (B*T) lists the positions sorted by token, ties in position order
     * (strata_token_order), and pos_order likewise by pos (with pos only): every element of
     * dwte and dwpe gets its rows added in position order, the same sums on every run and
     * backend. */
    void (*encoder_backward)(strata_stream *s, float *dwte, float *dwpe, const void *dout, const int32_t *tok,
                             const int32_t *order, const int32_t *pos, const int32_t *pos_order, int B, int T,
                             int C);

    /* out (N,C) = (inp - mean) * rstd * w + b; mean, rstd (N) saved for backward; eps 1e-5 */
    void (*layernorm_forward)(strata_stream *s, void *out, float *mean, float *rstd,
                              const void *inp, const void *w, const void *b, int N, int C);
    /* dinp (N,C) (+=), dw (C) (+=), db (C) (+=) */
    void (*layernorm_backward)(strata_stream *s, void *dinp, float *dw, float *db,
                               const void *dout, const void *inp, const void *w,
                               const float *mean, const float *rstd, int N, int C);

    /* out (M,N) = inp (M,K) @ W + bias (N), W laid out as w_nk says (STRATA_W_*, below):
     * (K,N) for GPT-2's Conv1D weights, (N,K) for the tied head reading the embedding and
     * for the Llama family's nn.Linear (out, in) weights. bias may be NULL. gelu_out, when not NULL, also receives gelu(out) (M,N): the
     * fused bias+GELU epilogue of the MLP's first layer (out keeps the pre-activation
     * that GELU's backward needs). */
    void (*matmul_forward)(strata_stream *s, void *out, void *gelu_out, const void *inp,
                           const void *w, const void *bias, int M, int K, int N, int w_nk);
    /* dinp (M,K) (=) = dout @ W^T (skipped when dinp is NULL); dw (+=) = inp^T @ dout in
     * W's layout; dbias (N) (+=) = column sums of dout (skipped when NULL). */
    void (*matmul_backward)(strata_stream *s, void *dinp, float *dw, float *dbias,
                            const void *dout, const void *inp, const void *w, int M, int K,
                            int N, int w_nk);

    /* Causal self-attention with NH query heads and NKV key/value heads (NH a multiple of
     * NKV: grouped-query attention; NKV == NH is multi-head, GPT-2's), each of hs. A qkv row
     * (B,T,(NH+2NKV)hs) holds q (NH heads), then k (NKV), then v (NKV), as GPT-2's c_attn
     * and the Llama family's fused q|k|v projection write them; query head h attends with
     * key/value head h / (NH/NKV). out (B,T,NH*hs) = softmax(q k^T / sqrt(hs)) v per head;
     * lse (B,NH,T) saves each row's log-sum-exp of the scaled scores so the backward never
     * needs a stored T x T matrix.
     * pos (B,T, device), when given, holds each token's position in its document: a row is
     * packed documents, pos[b,t] 0 at a document's first token and pos[b,t-1] + 1 after it,
     * and query t attends to keys t - pos[b,t] .. t only, its own document's (NULL: one
     * document a row, keys 0 .. t). */
    void (*attention_forward)(strata_stream *s, void *out, float *lse, const void *qkv, const int32_t *pos, int B,
                              int T, int NH, int NKV, int hs);
    /* dqkv (B,T,(NH+2NKV)hs) (=) from dout (B,T,NH*hs), given the forward's qkv, out, lse and
     * pos; a key/value head's gradient sums over the query heads that share it. */
    void (*attention_backward)(strata_stream *s, void *dqkv, const void *dout, const void *qkv, const void *out,
                               const float *lse, const int32_t *pos, int B, int T, int NH, int NKV, int hs);

    /* GELU, tanh approximation: out = 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3))) */
    void (*gelu_forward)(strata_stream *s, void *out, const void *inp, size_t n);
    /* dinp (=) = dout * gelu'(inp) */
    void (*gelu_backward)(strata_stream *s, void *dinp, const void *inp, const void *dout,
                          size_t n);

    /* out = a + b (residual connection; out may alias a) */
    void (*residual_forward)(strata_stream *s, void *out, const void *a, const void *b,
                             size_t n);
    /* dst += src (the residual stream's gradient collects both branches) */
    void (*add_inplace)(strata_stream *s, void *dst, const void *src, size_t n);

    /* Softmax cross-entropy over the first V of Vp logits per row. losses (N) = -log p[target];
     * rows whose target is negative are ignored (loss 0, gradient 0).
     * When dlogits is not NULL it receives (softmax - onehot) * dloss, and 0 in the padded
     * columns V..Vp-1; dlogits may alias logits (the step overwrites logits in place). */
    void (*crossentropy)(strata_stream *s, float *losses, void *dlogits, const void *logits,
                         const int32_t *targets, int N, int V, int Vp, float dloss);
    /* *acc += scale * sum(losses[0..n)) on the device (the step reads one scalar at the end) */
    void (*loss_accumulate)(strata_stream *s, float *acc, const float *losses, int n, float scale);

    /* One AdamW update of n elements. master, m, v are fp32; grad is fp32. When param_out
     * is not NULL it receives the updated master in the compute dtype (the copy forward
     * reads). Element-wise, in this exact order, so backends agree:
     *   g = grad * grad_scale
     *   m = beta1 * m + (1 - beta1) * g
     *   v = beta2 * v + (1 - beta2) * g * g
     *   mhat = m / bc1;  vhat = v / bc2
     *   master -= lr * (mhat / (sqrtf(vhat) + eps) + weight_decay * master) */
    void (*adamw)(strata_stream *s, float *master, void *param_out, const float *grad, float *m,
                  float *v, size_t n, const strata_adamw_args *a);
    /* The same update with the moments stored as bf16 (optim.state: bf16): m and v are read
     * widened to fp32 (exact), updated as above, and written back rounded to nearest even
     * (strata_f32_to_bf16); the master update uses the fp32 m and v before rounding. */
    void (*adamw_bf16)(strata_stream *s, float *master, void *param_out, const float *grad, uint16_t *m,
                       uint16_t *v, size_t n, const strata_adamw_args *a);
    /* The same update with 8-bit moments (optim.state: int8; core/quant.h), over elements
     * [0, n) of a range that starts on a STRATA_Q8_BLOCK boundary: m1 and m2 are the codes of
     * m (signed map) and v (unsigned map), absmax1 and absmax2 each block's absmax, ceil(n /
     * 2048) of them. Only the segments with `quant` set are touched (seg[i].lo relative to the
     * range; their weight decay a->weight_decay where seg[i].decay, else 0); block by block:
     *   m, v = map[code] * absmax (the block's old absmax);  the AdamW step above, in fp32;
     *   absmax = max |m| (max v) over the block's quantized elements;  code = nearest(m / absmax)
     * The segments without `quant` (fp32 moments) are the adamw kernel's, on their packed
     * arrays; together they update the whole range. */
    void (*adamw_q8)(strata_stream *s, float *master, void *param_out, const float *grad, uint8_t *m1,
                     uint8_t *m2, float *absmax1, float *absmax2, size_t n, const struct strata_adamw_segment *seg,
                     int n_seg, const strata_adamw_args *a);

    /* *out += sum of x[i]^2 (fp32 x; accumulated in double), the same sum on every run */
    void (*sumsq)(strata_stream *s, double *out, const float *x, size_t n);
    /* dst (fp32) += src (compute dtype when src_dtype says so) */
    void (*accumulate_f32)(strata_stream *s, float *dst, const void *src, strata_dtype src_dtype,
                           size_t n);
    /* dtype conversions (identical memcpy when the dtypes agree) */
    void (*convert)(strata_stream *s, void *dst, strata_dtype dst_dtype, const void *src,
                    strata_dtype src_dtype, size_t n);
    /* x *= scale (fp32) */
    void (*scale_f32)(strata_stream *s, float *x, float scale, size_t n);

    /* ---- what the Llama family adds ---- */

    /* RMSNorm over vectors of C, `heads` of them side by side at the start of each of N
     * rows that lie ld elements apart (heads 1, ld C: a plain (N,C) tensor; heads NH, C hs,
     * ld the qkv row: the per-head q or k norm of Qwen3). out (same layout as inp) =
     * inp * rstd * w, rstd = 1 / sqrt(mean(inp^2) + eps) (fp32, N*heads, saved for the
     * backward); w (C) is shared by every head. */
    void (*rmsnorm_forward)(strata_stream *s, void *out, float *rstd, const void *inp, const void *w,
                            int N, int heads, int C, int ld, float eps);
    /* dinp (+=, inp's layout), dw (C) (+=), from dout (out's layout) */
    void (*rmsnorm_backward)(strata_stream *s, void *dinp, float *dw, const void *dout, const void *inp,
                             const void *w, const float *rstd, int N, int heads, int C, int ld);

    /* Rotary positions, in place, in Hugging Face's rotate_half layout: `heads` heads of hs
     * at the start of each (B,T) row, rows ld elements apart; in every head, element i < hs/2
     * and element i + hs/2 turn by the angle t * inv_freq[i] (fp32: (float)t times the fp32
     * inverse frequency, its cosine and sine in fp32, as transformers computes them), t the
     * row's position. inv_freq (hs/2, fp32, device memory) carries the base and any llama3
     * scaling. The backward turns the gradient by -angle (the rotation's transpose). With
     * pos (B,T, device; attention_forward's), t is the row's position in its document, or
     * (decoding, strata_model_extend) past T: the position of a row added after others. */
    void (*rope_forward)(strata_stream *s, void *x, const float *inv_freq, const int32_t *pos, int B, int T,
                         int heads, int hs, int ld);
    void (*rope_backward)(strata_stream *s, void *dx, const float *inv_freq, const int32_t *pos, int B, int T,
                          int heads, int hs, int ld);

    /* SwiGLU: out (N,I) = silu(gu[:, :I]) * gu[:, I:], gu (N,2I) the fused gate|up product;
     * silu(x) = x / (1 + exp(-x)) */
    void (*swiglu_forward)(strata_stream *s, void *out, const void *gu, int N, int I);
    /* dgu (N,2I) (=) from dout (N,I) and the forward's gu */
    void (*swiglu_backward)(strata_stream *s, void *dgu, const void *dout, const void *gu, int N, int I);
};

extern const strata_kernels strata_kernels_cpu;

/* The CPU backend's matrix products: 0 chosen by shape (the default: STRATA_CPU_GEMM=auto),
 * 1 all on the hand-written kernel (strata), 2 all through the BLAS (blas; the hand-written
 * kernel where the build has none), -1 back to what STRATA_CPU_GEMM says, for every later
 * call in the process. Returns the choice in effect before. Tests and benchmarks use it to
 * compare the two in one process. */
int strata_cpu_gemm_select(int impl);
/* 1 when this build links a BLAS for the CPU backend (CMake -DSTRATA_BLAS=blis|openblas) */
int strata_cpu_gemm_has_blas(void);

#ifdef STRATA_HAVE_CUDA
/* The CUDA backend's attention kernels for every later call in the process: 0 the CUDA-core
 * ones (the default), 1 the tensor-core ones (STRATA_ATTENTION=tc), -1 back to what
 * STRATA_ATTENTION says. Returns the choice in effect before. Tests and benchmarks use it
 * to compare the two in one process. */
int strata_cuda_attention_select(int impl);
#endif

#endif
