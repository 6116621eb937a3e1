/* tests/test_kernels.c: the CPU kernels (core/cpu/kernels_cpu.c) against double-precision
 * references written out plainly here.
 *
 * For every kernel with a backward: the fp32 forward is compared with the double
 * reference forward, and the fp32 backward with central finite differences of the
 * double reference of L = sum(out * R) for a fixed random R. Destinations are pre-filled
 * with nonzero values so (=) and (+=) semantics are checked too. The rest (AdamW,
 * sumsq, conversions, ...) are compared with exact or double oracles, and matmul,
 * attention and the Llama family's kernels are checked to be bitwise identical on 1 and 2
 * threads. Attention is grouped-query (NKV key/value heads shared by NH query heads), and
 * multi-head where NKV == NH; shapes too large for finite differences of every coordinate
 * take exact gradient formulas in double, themselves checked against finite differences on
 * small shapes. RMSNorm and the rotary positions are also held bit for bit to the fp32
 * recipes of transformers' LlamaRMSNorm and apply_rotary_pos_emb.
 * The matmul checks run three times: every product on the hand-written GEMM, every one
 * on BLIS (when the build has it), and as the automatic choice splits them; each time a
 * row's result must also not depend on how many rows the call has.
 * A matmul timing is printed for information only. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/common.h"
#include "core/kernels.h"
#include "core/model.h"
#include "tests/check.h"


static const strata_kernels *K = &strata_kernels_cpu;
#define S NULL /* the CPU kernels ignore their stream */

/* ---------------------------------------------------------------------------------- */
/* helpers                                                                               */

static uint64_t g_rng = 0x9e3779b97f4a7c15ull;
static double rnd(void) /* uniform [0, 1) */
{
    g_rng ^= g_rng << 13;
    g_rng ^= g_rng >> 7;
    g_rng ^= g_rng << 17;
    return (double)(g_rng >> 11) / 9007199254740992.0;
}

static float *randf(size_t n, double lo, double hi)
{
    float *x = malloc(n * sizeof(float) + 1);
    for (size_t i = 0; i < n; i++) x[i] = (float)(lo + (hi - lo) * rnd());
    return x;
}

static float *filled(size_t n, float v)
{
    float *x = malloc(n * sizeof(float) + 1);
    for (size_t i = 0; i < n; i++) x[i] = v;
    return x;
}

static float *copyf(const float *x, size_t n)
{
    float *y = malloc(n * sizeof(float) + 1);
    memcpy(y, x, n * sizeof(float));
    return y;
}

static double *to_f64(const float *x, size_t n)
{
    double *y = malloc(n * sizeof(double) + 1);
    for (size_t i = 0; i < n; i++) y[i] = x[i];
    return y;
}

static double *rand_f64(size_t n) /* values that are exact floats, in [-1, 1) */
{
    double *y = malloc(n * sizeof(double) + 1);
    for (size_t i = 0; i < n; i++) y[i] = (float)(2.0 * rnd() - 1.0);
    return y;
}

static float *f64_to_f32(const double *x, size_t n)
{
    float *y = malloc(n * sizeof(float) + 1);
    for (size_t i = 0; i < n; i++) y[i] = (float)x[i];
    return y;
}

static double dot(const double *a, const double *b, size_t n)
{
    double s = 0.0;
    for (size_t i = 0; i < n; i++) s += a[i] * b[i];
    return s;
}

/* max over i of |got - want| / (|want| + floor), floor = floor_frac * max |want| + 1e-30 */
static double max_rel_err(const float *got, const float *base, const double *want, size_t n,
                          double floor_frac)
{
    double mx = 0.0, err = 0.0;
    for (size_t i = 0; i < n; i++) mx = fabs(want[i]) > mx ? fabs(want[i]) : mx;
    double fl = floor_frac * mx + 1e-30;
    for (size_t i = 0; i < n; i++) {
        double g = (double)got[i] - (base ? (double)base[i] : 0.0);
        double e = fabs(g - want[i]) / (fabs(want[i]) + fl);
        if (!(e <= err)) err = e; /* NaN counts as the worst */
    }
    return err;
}

/* forward output against the double reference; tol grows with the length of the fp32
 * sums behind each element (about n * 2^-24 in the worst case) */
static void check_fwd_tol(const char *name, const float *got, const double *want, size_t n,
                          double tol)
{
    double e = max_rel_err(got, NULL, want, n, 1e-2);
    printf("%-44s max rel err %.2e\n", name, e);
    CHECK(e < tol, "%s: forward error %.3e vs the double reference (tolerance %.1e)", name, e, tol);
}

static void check_fwd(const char *name, const float *got, const double *want, size_t n)
{
    check_fwd_tol(name, got, want, n, 1e-5);
}

/* backward result (minus the pre-filled base for +=) against an oracle gradient:
 * finite differences of the double reference, or for large shapes the exact formula */
static void check_grad_vs(const char *name, const float *got, const float *base,
                          const double *want, size_t n, const char *oracle)
{
    double e = max_rel_err(got, base, want, n, 1e-2);
    printf("%-44s max rel err %.2e vs %s\n", name, e, oracle);
    CHECK(e < 1e-4, "%s: gradient error %.3e vs %s", name, e, oracle);
}

static void check_grad(const char *name, const float *got, const float *base, const double *fd,
                       size_t n)
{
    check_grad_vs(name, got, base, fd, n, "finite differences");
}

/* central differences of loss() with respect to x[0..n) */
#define FD_EPS 1e-6
typedef double (*loss_fn)(void *ctx);
static double *fd_grad(loss_fn loss, void *ctx, double *x, size_t n)
{
    double *g = malloc(n * sizeof(double) + 1);
    for (size_t i = 0; i < n; i++) {
        double v = x[i];
        x[i] = v + FD_EPS;
        double lp = loss(ctx);
        x[i] = v - FD_EPS;
        double lm = loss(ctx);
        x[i] = v;
        g[i] = (lp - lm) / (2.0 * FD_EPS);
    }
    return g;
}

static int bitwise_equal(const float *a, const float *b, size_t n)
{
    return memcmp(a, b, n * sizeof(float)) == 0;
}

/* ThreadSanitizer cannot see libgomp's (uninstrumented) barriers and reports every
 * parallel region as a race, so a TSan build runs the kernels on one thread. */
#if defined(__SANITIZE_THREAD__)
#define MULTI_THREAD_OK 0
#else
#define MULTI_THREAD_OK 1
#endif

static int g_threads0 = 1; /* OMP_NUM_THREADS as the test found it */

static void set_threads(int n)
{
#ifdef _OPENMP
    omp_set_num_threads(MULTI_THREAD_OK ? n : 1);
#else
    (void)n;
#endif
}

/* ---------------------------------------------------------------------------------- */
/* double references                                                                    */

/* Positions of packed documents (core/kernels.h): 0 at each row's first token and at each
 * of starts[] (indices into the B*T tokens), else one more than the token before. */
static void doc_positions(int32_t *pos, int B, int T, const int *starts, int n_starts)
{
    for (int i = 0; i < B * T; i++) {
        int start = i % T == 0;
        for (int k = 0; k < n_starts; k++) start |= starts[k] == i;
        pos[i] = start ? 0 : pos[i - 1] + 1;
    }
}

static double ref_gelu(double x)
{
    return 0.5 * x * (1.0 + tanh(sqrt(2.0 / M_PI) * (x + 0.044715 * x * x * x)));
}

static void ref_encoder(double *out, const int32_t *tok, const double *wte, const double *wpe,
                        int B, int T, int C)
{
    for (int b = 0; b < B; b++)
        for (int t = 0; t < T; t++)
            for (int c = 0; c < C; c++)
                out[((size_t)b * T + t) * C + c] =
                    wte[(size_t)tok[b * T + t] * C + c] + (wpe ? wpe[(size_t)t * C + c] : 0.0);
}

static void ref_layernorm(double *out, double *mean, double *rstd, const double *inp,
                          const double *w, const double *b, int N, int C)
{
    for (int n = 0; n < N; n++) {
        const double *x = inp + (size_t)n * C;
        double m = 0.0, v = 0.0;
        for (int c = 0; c < C; c++) m += x[c];
        m /= C;
        for (int c = 0; c < C; c++) v += (x[c] - m) * (x[c] - m);
        v /= C;
        double rs = 1.0 / sqrt(v + 1e-5);
        for (int c = 0; c < C; c++) out[(size_t)n * C + c] = (x[c] - m) * rs * w[c] + b[c];
        if (mean) mean[n] = m;
        if (rstd) rstd[n] = rs;
    }
}

static void ref_matmul(double *out, const double *inp, const double *w, const double *bias,
                       int M, int Kd, int N, int w_nk)
{
    for (int m = 0; m < M; m++)
        for (int n = 0; n < N; n++) {
            double s = bias ? bias[n] : 0.0;
            for (int k = 0; k < Kd; k++)
                s += inp[(size_t)m * Kd + k] * (w_nk ? w[(size_t)n * Kd + k] : w[(size_t)k * N + n]);
            out[(size_t)m * N + n] = s;
        }
}

/* Grouped-query causal attention: a qkv row holds q (NH heads), k (NKV), v (NKV); query head
 * h uses key/value head h / (NH/NKV). Each row's probabilities are formed once. */
static void ref_attention(double *out, double *lse, const double *qkv, int B, int T, int NH,
                          int NKV, int hs)
{
    int W = (NH + 2 * NKV) * hs, C = NH * hs, group = NH / NKV;
    double scale = 1.0 / sqrt((double)hs);
    double *p = malloc((size_t)T * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            const double *k0 = qkv + (size_t)b * T * W + (size_t)(NH + h / group) * hs;
            const double *v0 = k0 + (size_t)NKV * hs;
            for (int t = 0; t < T; t++) {
                const double *q = qkv + ((size_t)b * T + t) * W + (size_t)h * hs;
                double mx = -INFINITY;
                for (int u = 0; u <= t; u++) {
                    double s = 0.0;
                    for (int d = 0; d < hs; d++) s += q[d] * k0[(size_t)u * W + d];
                    p[u] = s * scale;
                    mx = p[u] > mx ? p[u] : mx;
                }
                double sum = 0.0;
                for (int u = 0; u <= t; u++) sum += p[u] = exp(p[u] - mx);
                double *o = out + ((size_t)b * T + t) * C + (size_t)h * hs;
                for (int d = 0; d < hs; d++) o[d] = 0.0;
                for (int u = 0; u <= t; u++)
                    for (int d = 0; d < hs; d++) o[d] += p[u] / sum * v0[(size_t)u * W + d];
                if (lse) lse[((size_t)b * NH + h) * T + t] = mx + log(sum);
            }
        }
    free(p);
}

/* dqkv (=) of L = sum(out * dout), by the exact formulas in double: with p the row's
 * probabilities and dp[u] = dout . v[u], ds = p * (dp - sum(p * dp)); dq = scale ds @ k,
 * dk += scale ds^T q, dv += p^T dout, the key/value gradients summed over the group */
static void ref_attention_grad(double *dqkv, const double *dout, const double *qkv, int B, int T,
                               int NH, int NKV, int hs)
{
    int W = (NH + 2 * NKV) * hs, C = NH * hs, group = NH / NKV;
    double scale = 1.0 / sqrt((double)hs);
    double *p = malloc((size_t)T * sizeof(double)), *dp = malloc((size_t)T * sizeof(double));
    memset(dqkv, 0, (size_t)B * T * W * sizeof(double));
    for (int b = 0; b < B; b++)
        for (int h = 0; h < NH; h++) {
            size_t koff = (size_t)b * T * W + (size_t)(NH + h / group) * hs, voff = koff + (size_t)NKV * hs;
            for (int t = 0; t < T; t++) {
                size_t qoff = ((size_t)b * T + t) * W + (size_t)h * hs;
                const double *q = qkv + qoff, *d = dout + ((size_t)b * T + t) * C + (size_t)h * hs;
                double mx = -INFINITY, sum = 0.0, D = 0.0;
                for (int u = 0; u <= t; u++) {
                    double s = 0.0, e = 0.0;
                    for (int j = 0; j < hs; j++) {
                        s += q[j] * qkv[koff + (size_t)u * W + j];
                        e += d[j] * qkv[voff + (size_t)u * W + j];
                    }
                    p[u] = s * scale;
                    dp[u] = e;
                    mx = p[u] > mx ? p[u] : mx;
                }
                for (int u = 0; u <= t; u++) sum += p[u] = exp(p[u] - mx);
                for (int u = 0; u <= t; u++) D += (p[u] /= sum) * dp[u];
                for (int u = 0; u <= t; u++) {
                    double ds = p[u] * (dp[u] - D) * scale;
                    for (int j = 0; j < hs; j++) {
                        dqkv[qoff + j] += ds * qkv[koff + (size_t)u * W + j];
                        dqkv[koff + (size_t)u * W + j] += ds * q[j];
                        dqkv[voff + (size_t)u * W + j] += p[u] * d[j];
                    }
                }
            }
        }
    free(p), free(dp);
}

static void ref_crossentropy(double *losses, const double *logits, const int32_t *tgt, int N,
                             int V, int Vp)
{
    for (int n = 0; n < N; n++) {
        const double *x = logits + (size_t)n * Vp;
        if (tgt[n] < 0) {
            losses[n] = 0.0;
            continue;
        }
        double mx = -INFINITY, sum = 0.0;
        for (int i = 0; i < V; i++) mx = x[i] > mx ? x[i] : mx;
        for (int i = 0; i < V; i++) sum += exp(x[i] - mx);
        losses[n] = mx + log(sum) - x[tgt[n]];
    }
}

/* ---------------------------------------------------------------------------------- */
/* encoder                                                                              */

typedef struct enc_ctx {
    int B, T, C;
    const int32_t *tok;
    double *wte, *wpe, *out;
    const double *R;
} enc_ctx;

static double enc_loss(void *p)
{
    enc_ctx *c = p;
    ref_encoder(c->out, c->tok, c->wte, c->wpe, c->B, c->T, c->C);
    return dot(c->out, c->R, (size_t)c->B * c->T * c->C);
}

static void test_encoder(void)
{
    int B = 2, T = 5, C = 8, V = 11, maxT = T + 2;
    int32_t tok[10] = {3, 7, 3, 0, 10, 7, 7, 1, 3, 9}; /* repeats: the scatter must add up */
    size_t no = (size_t)B * T * C;
    float *wte = randf((size_t)V * C, -1, 1), *wpe = randf((size_t)maxT * C, -1, 1);
    float *out = filled(no, 99.0f);
    enc_ctx c = {B, T, C, tok, to_f64(wte, (size_t)V * C), to_f64(wpe, (size_t)maxT * C),
                 malloc(no * sizeof(double)), rand_f64(no)};
    K->encoder_forward(S, out, tok, NULL, wte, wpe, B, T, C);
    enc_loss(&c);
    check_fwd("encoder_forward", out, c.out, no);

    float *R = f64_to_f32(c.R, no);
    float *dwte0 = randf((size_t)V * C, -1, 1), *dwpe0 = randf((size_t)maxT * C, -1, 1);
    float *dwte = copyf(dwte0, (size_t)V * C), *dwpe = copyf(dwpe0, (size_t)maxT * C);
    int32_t order[10], count[12];
    strata_token_order(tok, 10, V, count, order);
    static const int32_t want[10] = {3, 7, 0, 2, 8, 1, 5, 6, 9, 4}; /* by token, ties by position */
    CHECK(!memcmp(order, want, sizeof want), "strata_token_order: positions by token, ties in position order");
    K->encoder_backward(S, dwte, dwpe, R, tok, order, NULL, NULL, B, T, C);
    double *g_wte = fd_grad(enc_loss, &c, c.wte, (size_t)V * C);
    double *g_wpe = fd_grad(enc_loss, &c, c.wpe, (size_t)maxT * C);
    check_grad("encoder_backward dwte (+=)", dwte, dwte0, g_wte, (size_t)V * C);
    check_grad("encoder_backward dwpe (+=, rows >= T kept)", dwpe, dwpe0, g_wpe, (size_t)maxT * C);
    free(wte), free(wpe), free(out), free(c.wte), free(c.wpe), free(c.out), free((void *)c.R);
    free(R), free(dwte0), free(dwpe0), free(dwte), free(dwpe), free(g_wte), free(g_wpe);
}

/* wpe NULL (the Llama family): out is the token's embedding row, bit for bit, and the
 * backward fills dwte alone */
static void test_encoder_no_positions(void)
{
    int B = 2, T = 5, C = 24, V = 11;
    int32_t tok[10] = {3, 7, 3, 0, 10, 7, 7, 1, 3, 9};
    size_t no = (size_t)B * T * C;
    float *wte = randf((size_t)V * C, -1, 1), *out = filled(no, 99.0f);
    enc_ctx c = {B, T, C, tok, to_f64(wte, (size_t)V * C), NULL, malloc(no * sizeof(double)), rand_f64(no)};
    K->encoder_forward(S, out, tok, NULL, wte, NULL, B, T, C);
    int same = 1;
    for (int i = 0; i < B * T; i++) same &= bitwise_equal(out + (size_t)i * C, wte + (size_t)tok[i] * C, (size_t)C);
    printf("%-44s %s\n", "encoder_forward wpe NULL: the wte rows", same ? "same bits" : "DIFFER");
    CHECK(same, "encoder_forward with wpe NULL differs from the embedding rows");

    float *R = f64_to_f32(c.R, no);
    float *dwte0 = randf((size_t)V * C, -1, 1), *dwte = copyf(dwte0, (size_t)V * C);
    int32_t order[10], count[12];
    strata_token_order(tok, 10, V, count, order);
    K->encoder_backward(S, dwte, NULL, R, tok, order, NULL, NULL, B, T, C);
    double *g_wte = fd_grad(enc_loss, &c, c.wte, (size_t)V * C);
    check_grad("encoder_backward dwte (+=), dwpe NULL", dwte, dwte0, g_wte, (size_t)V * C);
    free(wte), free(out), free(c.wte), free(c.out), free((void *)c.R), free(R), free(dwte0), free(dwte);
    free(g_wte);
}

/* Learned positions of packed documents: out = wte[tok] + wpe[pos] (the same fp32 add),
 * dwpe gathers each position's rows wherever they are, dwte is as without positions. */
static void test_encoder_documents(void)
{
    int B = 2, T = 6, C = 8, V = 11;
    int32_t tok[12] = {3, 7, 3, 0, 10, 7, 7, 1, 3, 9, 2, 2}, pos[12];
    const int starts[] = {2, 3, 9};
    doc_positions(pos, B, T, starts, 3);
    size_t no = (size_t)B * T * C;
    float *wte = randf((size_t)V * C, -1, 1), *wpe = randf((size_t)T * C, -1, 1), *out = filled(no, 99.0f);
    K->encoder_forward(S, out, tok, pos, wte, wpe, B, T, C);
    int same = 1;
    for (int i = 0; i < B * T; i++)
        for (int c = 0; c < C; c++)
            same &= out[(size_t)i * C + c] == wte[(size_t)tok[i] * C + c] + wpe[(size_t)pos[i] * C + c];
    printf("%-44s %s\n", "encoder_forward, packed documents' positions", same ? "same bits" : "DIFFER");
    CHECK(same, "encoder_forward with positions: not wte[tok] + wpe[pos]");
    float *dout = randf(no, -1, 1), *dwte = filled((size_t)V * C, 0.5f), *dwpe = filled((size_t)T * C, 0.25f);
    float *dwte_plain = filled((size_t)V * C, 0.5f), *dwpe_plain = filled((size_t)T * C, 0.25f);
    int32_t order[12], pos_order[12], count[12];
    strata_token_order(tok, 12, V, count, order);
    strata_token_order(pos, 12, T, count, pos_order);
    K->encoder_backward(S, dwte, dwpe, dout, tok, order, pos, pos_order, B, T, C);
    K->encoder_backward(S, dwte_plain, dwpe_plain, dout, tok, order, NULL, NULL, B, T, C);
    double *want = malloc((size_t)T * C * sizeof(double));
    for (size_t i = 0; i < (size_t)T * C; i++) want[i] = 0.25;
    for (int i = 0; i < B * T; i++)
        for (int c = 0; c < C; c++) want[(size_t)pos[i] * C + c] += dout[(size_t)i * C + c];
    check_fwd("encoder_backward dwpe (+=) by position", dwpe, want, (size_t)T * C);
    same = bitwise_equal(dwte, dwte_plain, (size_t)V * C);
    printf("%-44s %s\n", "  dwte as without positions", same ? "same bits" : "DIFFER");
    CHECK(same, "encoder_backward with positions changed dwte");
    free(wte), free(wpe), free(out), free(dout), free(dwte), free(dwpe), free(dwte_plain), free(dwpe_plain), free(want);
}

/* ---------------------------------------------------------------------------------- */
/* layernorm                                                                            */

typedef struct ln_ctx {
    int N, C;
    double *inp, *w, *b, *out;
    const double *R;
} ln_ctx;

static double ln_loss(void *p)
{
    ln_ctx *c = p;
    ref_layernorm(c->out, NULL, NULL, c->inp, c->w, c->b, c->N, c->C);
    return dot(c->out, c->R, (size_t)c->N * c->C);
}

static void test_layernorm(int N, int C)
{
    char name[96];
    size_t n = (size_t)N * C;
    float *inp = randf(n, -2, 2), *w = randf((size_t)C, 0.5, 1.5), *b = randf((size_t)C, -0.5, 0.5);
    for (size_t i = 0; i < n; i++) inp[i] += 3.0f; /* a nonzero mean */
    float *out = filled(n, 99.0f), *mean = filled((size_t)N, 99.0f), *rstd = filled((size_t)N, 99.0f);
    ln_ctx c = {N, C, to_f64(inp, n), to_f64(w, (size_t)C), to_f64(b, (size_t)C),
                malloc(n * sizeof(double)), rand_f64(n)};
    double *rmean = malloc((size_t)N * sizeof(double)), *rrstd = malloc((size_t)N * sizeof(double));
    K->layernorm_forward(S, out, mean, rstd, inp, w, b, N, C);
    ref_layernorm(c.out, rmean, rrstd, c.inp, c.w, c.b, N, C);
    snprintf(name, sizeof name, "layernorm_forward out (N=%d C=%d)", N, C);
    check_fwd(name, out, c.out, n);
    check_fwd("layernorm_forward mean", mean, rmean, (size_t)N);
    check_fwd("layernorm_forward rstd", rstd, rrstd, (size_t)N);

    float *R = f64_to_f32(c.R, n);
    float *dinp0 = randf(n, -1, 1), *dw0 = randf((size_t)C, -1, 1), *db0 = randf((size_t)C, -1, 1);
    float *dinp = copyf(dinp0, n), *dw = copyf(dw0, (size_t)C), *db = copyf(db0, (size_t)C);
    K->layernorm_backward(S, dinp, dw, db, R, inp, w, mean, rstd, N, C);
    double *g_inp = fd_grad(ln_loss, &c, c.inp, n);
    double *g_w = fd_grad(ln_loss, &c, c.w, (size_t)C);
    double *g_b = fd_grad(ln_loss, &c, c.b, (size_t)C);
    check_grad("layernorm_backward dinp (+=)", dinp, dinp0, g_inp, n);
    check_grad("layernorm_backward dw (+=)", dw, dw0, g_w, (size_t)C);
    check_grad("layernorm_backward db (+=)", db, db0, g_b, (size_t)C);
    free(inp), free(w), free(b), free(out), free(mean), free(rstd), free(c.inp), free(c.w);
    free(c.b), free(c.out), free((void *)c.R), free(rmean), free(rrstd), free(R), free(dinp0);
    free(dw0), free(db0), free(dinp), free(dw), free(db), free(g_inp), free(g_w), free(g_b);
}

/* ---------------------------------------------------------------------------------- */
/* matmul                                                                               */

typedef struct mm_ctx {
    int M, K, N, w_nk, gelu;
    double *inp, *w, *bias, *out;
    const double *R;
} mm_ctx;

static double mm_loss(void *p)
{
    mm_ctx *c = p;
    size_t n = (size_t)c->M * c->N;
    ref_matmul(c->out, c->inp, c->w, c->bias, c->M, c->K, c->N, c->w_nk);
    if (c->gelu)
        for (size_t i = 0; i < n; i++) c->out[i] = ref_gelu(c->out[i]);
    return dot(c->out, c->R, n);
}

/* Forward and backward of one configuration against the references. With gelu the
 * objective is sum(gelu(inp @ W + bias) * R), whose backward is gelu_backward
 * followed by matmul_backward, as the model runs it. */
static void test_matmul(int M, int Kd, int N, int w_nk, int has_bias, int gelu)
{
    char tag[64], name[128];
    snprintf(tag, sizeof tag, "M=%d K=%d N=%d w_nk=%d%s%s", M, Kd, N, w_nk,
             has_bias ? " bias" : "", gelu ? " gelu" : "");
    size_t nin = (size_t)M * Kd, nw = (size_t)Kd * N, nout = (size_t)M * N;
    float *inp = randf(nin, -1, 1), *w = randf(nw, -1, 1);
    float *bias = has_bias ? randf((size_t)N, -1, 1) : NULL;
    float *out = filled(nout, 99.0f), *gout = gelu ? filled(nout, 99.0f) : NULL;
    mm_ctx c = {M, Kd, N, w_nk, 0, to_f64(inp, nin), to_f64(w, nw),
                bias ? to_f64(bias, (size_t)N) : NULL, malloc(nout * sizeof(double)),
                rand_f64(nout)};
    K->matmul_forward(S, out, gout, inp, w, bias, M, Kd, N, w_nk);
    mm_loss(&c);
    double tol = Kd > 64 ? 1e-5 * Kd / 64.0 : 1e-5;
    snprintf(name, sizeof name, "matmul_forward %s", tag);
    check_fwd_tol(name, out, c.out, nout, tol);
    if (gelu) {
        c.gelu = 1;
        mm_loss(&c);
        snprintf(name, sizeof name, "matmul_forward gelu_out %s", tag);
        check_fwd_tol(name, gout, c.out, nout, tol);
    }

    float *R = f64_to_f32(c.R, nout), *dout = R;
    if (gelu) { /* dpre = R * gelu'(pre), computed in place as the model does */
        dout = copyf(R, nout);
        K->gelu_backward(S, dout, out, dout, nout);
    }
    float *dinp = filled(nin, 99.0f);
    float *dw0 = randf(nw, -1, 1), *dw = copyf(dw0, nw);
    float *db0 = randf((size_t)N, -1, 1), *db = copyf(db0, (size_t)N);
    K->matmul_backward(S, dinp, dw, has_bias ? db : NULL, dout, inp, w, M, Kd, N, w_nk);

    int fd = nin + nw < 6000;
    double *g_inp = NULL, *g_w = NULL, *g_b = NULL;
    if (fd) {
        g_inp = fd_grad(mm_loss, &c, c.inp, nin);
        g_w = fd_grad(mm_loss, &c, c.w, nw);
        if (has_bias) g_b = fd_grad(mm_loss, &c, c.bias, (size_t)N);
    } else { /* large shapes: the exact gradient formulas in double instead */
        double *d = to_f64(dout, nout);
        g_inp = calloc(nin, sizeof(double));
        g_w = calloc(nw, sizeof(double));
        g_b = calloc((size_t)N, sizeof(double));
        for (int m = 0; m < M; m++)
            for (int n = 0; n < N; n++) {
                double dd = d[(size_t)m * N + n];
                g_b[n] += dd;
                for (int k = 0; k < Kd; k++) {
                    size_t wi = w_nk ? (size_t)n * Kd + k : (size_t)k * N + n;
                    g_inp[(size_t)m * Kd + k] += dd * c.w[wi];
                    g_w[wi] += dd * c.inp[(size_t)m * Kd + k];
                }
            }
        free(d);
    }
    const char *oracle = fd ? "finite differences" : "double formula";
    snprintf(name, sizeof name, "  dinp (=) %s", tag);
    check_grad_vs(name, dinp, NULL, g_inp, nin, oracle);
    snprintf(name, sizeof name, "  dw (+=) %s", tag);
    check_grad_vs(name, dw, dw0, g_w, nw, oracle);
    if (has_bias) {
        snprintf(name, sizeof name, "  dbias (+=) %s", tag);
        check_grad_vs(name, db, db0, g_b, (size_t)N, oracle);
    } else {
        CHECK(bitwise_equal(db, db0, (size_t)N), "%s: dbias touched though NULL was passed", tag);
    }

    /* dinp NULL skips the input gradient and leaves dw identical */
    float *dw2 = copyf(dw0, nw);
    K->matmul_backward(S, NULL, dw2, NULL, dout, inp, w, M, Kd, N, w_nk);
    CHECK(bitwise_equal(dw, dw2, nw), "%s: dw differs when dinp is NULL", tag);

    free(inp), free(w), free(bias), free(out), free(gout), free(c.inp), free(c.w), free(c.bias);
    free(c.out), free((void *)c.R), free(R), free(dinp), free(dw0), free(dw), free(db0), free(db);
    free(g_inp), free(g_w), free(g_b), free(dw2);
    if (gelu) free(dout);
}

/* ---------------------------------------------------------------------------------- */
/* attention                                                                            */

typedef struct attn_ctx {
    int B, T, NH, NKV, hs;
    double *qkv, *out;
    const double *R;
} attn_ctx;

static double attn_loss(void *p)
{
    attn_ctx *c = p;
    ref_attention(c->out, NULL, c->qkv, c->B, c->T, c->NH, c->NKV, c->hs);
    return dot(c->out, c->R, (size_t)c->B * c->T * c->NH * c->hs);
}

/* central differences of loss() at m coordinates of x spread over the q, k and v parts of
 * qkv rows (W wide, with NH, NKV heads of hs); idx receives the coordinates */
static double *fd_grad_qkv_sample(loss_fn loss, void *ctx, double *x, size_t rows, int NH, int NKV,
                                  int hs, size_t *idx, int m)
{
    size_t W = (size_t)(NH + 2 * NKV) * hs;
    double *g = malloc((size_t)m * sizeof(double));
    for (int i = 0; i < m; i++) {
        size_t row = (size_t)(rnd() * rows), part = (size_t)i % 3;
        size_t heads = part == 0 ? (size_t)NH : (size_t)NKV;
        size_t base = part == 0 ? 0 : part == 1 ? (size_t)NH * hs : (size_t)(NH + NKV) * hs;
        idx[i] = row * W + base + (size_t)(rnd() * heads) * hs + (size_t)(rnd() * hs);
        double v = x[idx[i]];
        x[idx[i]] = v + FD_EPS;
        double lp = loss(ctx);
        x[idx[i]] = v - FD_EPS;
        double lm = loss(ctx);
        x[idx[i]] = v;
        g[i] = (lp - lm) / (2.0 * FD_EPS);
    }
    return g;
}

/* Forward against the double reference (out and lse); the backward against the exact
 * gradient in double, and against finite differences: of every coordinate when fd_points
 * is 0 (the double gradient is then checked against them too, so it is an oracle the
 * larger shapes can trust), else of fd_points sampled ones. */
static void test_attention(int B, int T, int NH, int NKV, int hs, double amp, int fd_points)
{
    char tag[80], name[160];
    snprintf(tag, sizeof tag, "B=%d T=%d NH=%d NKV=%d hs=%d", B, T, NH, NKV, hs);
    int W = (NH + 2 * NKV) * hs, C = NH * hs;
    size_t nq = (size_t)B * T * W, no = (size_t)B * T * C, nl = (size_t)B * NH * T;
    float *qkv = randf(nq, -amp, amp), *out = filled(no, 99.0f), *lse = filled(nl, 99.0f);
    attn_ctx c = {B, T, NH, NKV, hs, to_f64(qkv, nq), malloc(no * sizeof(double)), rand_f64(no)};
    double *rlse = malloc(nl * sizeof(double));
    K->attention_forward(S, out, lse, qkv, NULL, B, T, NH, NKV, hs);
    ref_attention(c.out, rlse, c.qkv, B, T, NH, NKV, hs);
    snprintf(name, sizeof name, "attention_forward out %s", tag);
    check_fwd(name, out, c.out, no);
    snprintf(name, sizeof name, "attention_forward lse %s", tag);
    check_fwd(name, lse, rlse, nl);

    float *R = f64_to_f32(c.R, no), *dqkv = filled(nq, 99.0f);
    K->attention_backward(S, dqkv, R, qkv, out, lse, NULL, B, T, NH, NKV, hs);
    double *exact = malloc(nq * sizeof(double));
    ref_attention_grad(exact, c.R, c.qkv, B, T, NH, NKV, hs);
    snprintf(name, sizeof name, "attention_backward dqkv (=) %s", tag);
    check_grad_vs(name, dqkv, NULL, exact, nq, "double formula");
    if (fd_points == 0) {
        double *g = fd_grad(attn_loss, &c, c.qkv, nq);
        check_grad(name, dqkv, NULL, g, nq);
        float *exact_f = f64_to_f32(exact, nq);
        double e = max_rel_err(exact_f, NULL, g, nq, 1e-2);
        printf("%-44s max rel err %.2e vs finite differences\n", "  (the double formula itself)", e);
        CHECK(e < 1e-6, "%s: the double gradient formula is off by %.3e from finite differences", tag, e);
        free(g), free(exact_f);
    } else {
        size_t *idx = malloc((size_t)fd_points * sizeof(size_t));
        double *g = fd_grad_qkv_sample(attn_loss, &c, c.qkv, (size_t)B * T, NH, NKV, hs, idx, fd_points);
        float *got = malloc((size_t)fd_points * sizeof(float));
        for (int i = 0; i < fd_points; i++) got[i] = dqkv[idx[i]];
        /* the floor: a hundredth of the largest exact gradient, as the full checks use */
        double mx = 0.0, err = 0.0;
        for (size_t i = 0; i < nq; i++) mx = fabs(exact[i]) > mx ? fabs(exact[i]) : mx;
        for (int i = 0; i < fd_points; i++) {
            double e = fabs(got[i] - g[i]) / (fabs(g[i]) + 1e-2 * mx);
            if (!(e <= err)) err = e;
        }
        snprintf(name, sizeof name, "  %d sampled coordinates", fd_points);
        printf("%-44s max rel err %.2e vs finite differences\n", name, err);
        CHECK(err < 1e-4, "%s: gradient error %.3e vs finite differences at sampled coordinates", tag, err);
        free(idx), free(g), free(got);
    }
    free(qkv), free(out), free(lse), free(c.qkv), free(c.out), free((void *)c.R), free(rlse);
    free(R), free(dqkv), free(exact);
}

/* Grouped-query attention is multi-head attention whose key/value heads are repeated for
 * every query head of their group: the forward (out, lse) and dq are the same bits as that
 * multi-head call's (each query head's arithmetic is the same), and dk, dv are the sums over
 * the group of its per-head gradients (not bitwise: the grouped call adds the heads' terms
 * into one accumulator). */
static void test_attention_gqa_is_repeated_mha(int B, int T, int NH, int NKV, int hs)
{
    char name[128];
    int W = (NH + 2 * NKV) * hs, Wm = 3 * NH * hs, C = NH * hs, group = NH / NKV;
    size_t rows = (size_t)B * T, no = rows * C, nl = (size_t)B * NH * T;
    float *qkv = randf(rows * W, -1.5, 1.5), *mha = malloc(rows * Wm * sizeof(float));
    for (size_t r = 0; r < rows; r++) {
        const float *src = qkv + r * W;
        float *dst = mha + r * Wm;
        memcpy(dst, src, (size_t)C * sizeof(float));
        for (int h = 0; h < NH; h++) {
            memcpy(dst + C + (size_t)h * hs, src + C + (size_t)(h / group) * hs, (size_t)hs * sizeof(float));
            memcpy(dst + 2 * C + (size_t)h * hs, src + C + (size_t)(NKV + h / group) * hs,
                   (size_t)hs * sizeof(float));
        }
    }
    float *o1 = filled(no, 9.0f), *o2 = filled(no, 8.0f), *l1 = filled(nl, 9.0f), *l2 = filled(nl, 8.0f);
    float *d = randf(no, -1, 1), *g1 = filled(rows * W, 9.0f), *g2 = filled(rows * Wm, 8.0f);
    K->attention_forward(S, o1, l1, qkv, NULL, B, T, NH, NKV, hs);
    K->attention_forward(S, o2, l2, mha, NULL, B, T, NH, NH, hs);
    K->attention_backward(S, g1, d, qkv, o1, l1, NULL, B, T, NH, NKV, hs);
    K->attention_backward(S, g2, d, mha, o2, l2, NULL, B, T, NH, NH, hs);
    int fwd = bitwise_equal(o1, o2, no) && bitwise_equal(l1, l2, nl), dq = 1;
    double *kv_want = calloc(rows * 2 * NKV * hs, sizeof(double));
    float *kv_got = malloc(rows * 2 * NKV * hs * sizeof(float));
    for (size_t r = 0; r < rows; r++) {
        dq &= bitwise_equal(g1 + r * W, g2 + r * Wm, (size_t)C);
        memcpy(kv_got + r * 2 * NKV * hs, g1 + r * W + C, (size_t)2 * NKV * hs * sizeof(float));
        for (int h = 0; h < NH; h++)
            for (int j = 0; j < hs; j++) {
                kv_want[r * 2 * NKV * hs + (size_t)(h / group) * hs + j] += g2[r * Wm + C + (size_t)h * hs + j];
                kv_want[r * 2 * NKV * hs + (size_t)(NKV + h / group) * hs + j] +=
                    g2[r * Wm + 2 * C + (size_t)h * hs + j];
            }
    }
    snprintf(name, sizeof name, "GQA NH=%d NKV=%d hs=%d T=%d as repeated MHA", NH, NKV, hs, T);
    printf("%-44s out, lse %s; dq %s\n", name, fwd ? "same bits" : "DIFFER", dq ? "same bits" : "DIFFER");
    CHECK(fwd, "%s: the forward differs from multi-head attention on repeated k, v", name);
    CHECK(dq, "%s: dq differs from multi-head attention's on repeated k, v", name);
    snprintf(name, sizeof name, "  dk, dv vs the group's per-head sums");
    double e = max_rel_err(kv_got, NULL, kv_want, rows * 2 * NKV * hs, 1e-2);
    printf("%-44s max rel err %.2e\n", name, e);
    CHECK(e < 1e-4, "GQA dk, dv differ by %.3e from the sums of the repeated heads' gradients", e);
    free(qkv), free(mha), free(o1), free(o2), free(l1), free(l2), free(d), free(g1), free(g2);
    free(kv_want), free(kv_got);
}

/* Attention over packed documents is each document's attention alone: out, lse and dqkv of
 * a document's rows against a call on those rows by themselves (not bitwise: the key
 * blocks fall elsewhere, so fp32 sums associate differently); and positions that make each
 * row one document are the plain causal call, bit for bit. */
static void test_attention_documents(int B, int T, int NH, int NKV, int hs, const int *starts, int n_starts)
{
    char tag[96], name[160];
    snprintf(tag, sizeof tag, "B=%d T=%d NH=%d NKV=%d hs=%d, %d starts", B, T, NH, NKV, hs, n_starts);
    int W = (NH + 2 * NKV) * hs, C = NH * hs;
    size_t rows = (size_t)B * T, nq = rows * W, no = rows * C, nl = (size_t)B * NH * T;
    float *qkv = randf(nq, -1.5, 1.5), *dout = randf(no, -1, 1);
    float *out = filled(no, 99.0f), *lse = filled(nl, 99.0f), *dqkv = filled(nq, 99.0f);
    int32_t *pos = malloc(rows * sizeof(int32_t));
    doc_positions(pos, B, T, starts, n_starts);
    K->attention_forward(S, out, lse, qkv, pos, B, T, NH, NKV, hs);
    K->attention_backward(S, dqkv, dout, qkv, out, lse, pos, B, T, NH, NKV, hs);
    double *w_out = malloc(no * sizeof(double)), *w_lse = malloc(nl * sizeof(double)),
           *w_dqkv = malloc(nq * sizeof(double));
    float *ao = malloc(no * sizeof(float)), *al = malloc(nl * sizeof(float)), *ag = malloc(nq * sizeof(float));
    int docs = 0;
    for (int b = 0; b < B; b++)
        for (int s0 = 0; s0 < T;) {
            int e = s0 + 1;
            while (e < T && pos[(size_t)b * T + e] != 0) e++;
            size_t r0 = (size_t)b * T + s0;
            int len = e - s0;
            K->attention_forward(S, ao, al, qkv + r0 * W, NULL, 1, len, NH, NKV, hs);
            K->attention_backward(S, ag, dout + r0 * C, qkv + r0 * W, ao, al, NULL, 1, len, NH, NKV, hs);
            for (size_t i = 0; i < (size_t)len * C; i++) w_out[r0 * C + i] = ao[i];
            for (size_t i = 0; i < (size_t)len * W; i++) w_dqkv[r0 * W + i] = ag[i];
            for (int h = 0; h < NH; h++)
                for (int t = 0; t < len; t++) w_lse[((size_t)b * NH + h) * T + s0 + t] = al[(size_t)h * len + t];
            docs++;
            s0 = e;
        }
    double eo = max_rel_err(out, NULL, w_out, no, 1e-2), el = max_rel_err(lse, NULL, w_lse, nl, 1e-2);
    double eg = max_rel_err(dqkv, NULL, w_dqkv, nq, 1e-2);
    snprintf(name, sizeof name, "attention, %d documents packed", docs);
    printf("%-44s out %.1e, lse %.1e, dqkv %.1e vs each alone (%s)\n", name, eo, el, eg, tag);
    CHECK(eo < 1e-5 && el < 1e-5 && eg < 1e-4, "%s: packed documents differ from each alone: out %.3e, lse %.3e, "
          "dqkv %.3e", tag, eo, el, eg);

    /* every row one document: the positions 0 .. T-1, and the causal call's bits */
    doc_positions(pos, B, T, NULL, 0);
    float *o2 = filled(no, 9.0f), *l2 = filled(nl, 9.0f), *g2 = filled(nq, 9.0f);
    float *o3 = filled(no, 8.0f), *l3 = filled(nl, 8.0f), *g3 = filled(nq, 8.0f);
    K->attention_forward(S, o2, l2, qkv, pos, B, T, NH, NKV, hs);
    K->attention_backward(S, g2, dout, qkv, o2, l2, pos, B, T, NH, NKV, hs);
    K->attention_forward(S, o3, l3, qkv, NULL, B, T, NH, NKV, hs);
    K->attention_backward(S, g3, dout, qkv, o3, l3, NULL, B, T, NH, NKV, hs);
    int same = bitwise_equal(o2, o3, no) && bitwise_equal(l2, l3, nl) && bitwise_equal(g2, g3, nq);
    printf("%-44s %s\n", "  one document a row: positions vs none", same ? "same bits" : "DIFFER");
    CHECK(same, "%s: positions 0 .. T-1 differ from the plain causal call", tag);
    free(qkv), free(dout), free(out), free(lse), free(dqkv), free(pos), free(w_out), free(w_lse), free(w_dqkv);
    free(ao), free(al), free(ag), free(o2), free(l2), free(g2), free(o3), free(l3), free(g3);
}

/* ---------------------------------------------------------------------------------- */
/* gelu, residual                                                                       */

typedef struct gelu_ctx {
    size_t n;
    double *x;
    const double *R;
} gelu_ctx;

static double gelu_loss(void *p)
{
    gelu_ctx *c = p;
    double s = 0.0;
    for (size_t i = 0; i < c->n; i++) s += ref_gelu(c->x[i]) * c->R[i];
    return s;
}

static void test_gelu(void)
{
    size_t n = 203;
    float *x = randf(n, -4, 4);
    const float special[] = {0.0f, -0.0f, 1e-6f, -1e-6f, 8.0f, -8.0f, 12.0f, -12.0f};
    memcpy(x, special, sizeof special);
    float *out = filled(n, 99.0f);
    gelu_ctx c = {n, to_f64(x, n), rand_f64(n)};
    double *want = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) want[i] = ref_gelu(c.x[i]);
    K->gelu_forward(S, out, x, n);
    check_fwd("gelu_forward", out, want, n);

    float *R = f64_to_f32(c.R, n), *din = filled(n, 99.0f);
    K->gelu_backward(S, din, x, R, n);
    double *g = fd_grad(gelu_loss, &c, c.x, n);
    check_grad("gelu_backward dinp (=)", din, NULL, g, n);
    float *alias = copyf(R, n);
    K->gelu_backward(S, alias, x, alias, n);
    CHECK(bitwise_equal(alias, din, n), "gelu_backward with dinp == dout differs");
    printf("%-44s %s\n", "gelu_backward in place (dinp == dout)", bitwise_equal(alias, din, n) ? "ok" : "FAIL");
    free(x), free(out), free(c.x), free((void *)c.R), free(want), free(R), free(din), free(g);
    free(alias);
}

static void test_residual(void)
{
    size_t n = 1000;
    float *a = randf(n, -1, 1), *b = randf(n, -1, 1), *out = filled(n, 99.0f);
    K->residual_forward(S, out, a, b, n);
    int ok = 1;
    for (size_t i = 0; i < n; i++) ok &= out[i] == a[i] + b[i];
    CHECK(ok, "residual_forward differs from a + b");
    float *a2 = copyf(a, n);
    K->residual_forward(S, a2, a2, b, n); /* out aliases a */
    CHECK(bitwise_equal(a2, out, n), "residual_forward with out == a differs");
    /* the residual's backward routes the gradient to both branches: dst += src */
    float *dst = copyf(a, n);
    K->add_inplace(S, dst, b, n);
    CHECK(bitwise_equal(dst, out, n), "add_inplace differs from dst + src");
    printf("%-44s %s\n", "residual_forward / add_inplace (exact)", ok ? "ok" : "FAIL");
    free(a), free(b), free(out), free(a2), free(dst);
}

/* ---------------------------------------------------------------------------------- */
/* crossentropy                                                                         */

typedef struct ce_ctx {
    int N, V, Vp;
    double *logits, *losses, dloss;
    const int32_t *tgt;
} ce_ctx;

static double ce_loss(void *p)
{
    ce_ctx *c = p;
    ref_crossentropy(c->losses, c->logits, c->tgt, c->N, c->V, c->Vp);
    double s = 0.0;
    for (int n = 0; n < c->N; n++) s += c->losses[n];
    return c->dloss * s;
}

static void test_crossentropy(void)
{
    int N = 10, V = 11, Vp = 16;
    int32_t tgt[10] = {3, -1, 0, 10, 5, -100, 7, 7, 2, 9}; /* two ignored rows */
    size_t nl = (size_t)N * Vp;
    float *logits = randf(nl, -3, 3);
    for (int i = 0; i < Vp; i++) logits[2 * Vp + i] += 1000.0f; /* stability: a large offset */
    for (int n = 0; n < N; n++)
        for (int i = V; i < Vp; i++) logits[(size_t)n * Vp + i] = 1e30f; /* padding is never read */
    float dloss = 0.37f;
    float *losses = filled((size_t)N, 99.0f), *dl = filled(nl, 99.0f);
    ce_ctx c = {N, V, Vp, to_f64(logits, nl), malloc((size_t)N * sizeof(double)), dloss, tgt};
    K->crossentropy(S, losses, dl, logits, tgt, N, V, Vp, dloss);
    ce_loss(&c);
    check_fwd("crossentropy losses (ignored rows 0)", losses, c.losses, (size_t)N);
    double *g = fd_grad(ce_loss, &c, c.logits, nl);
    for (int n = 0; n < N; n++) /* the padded columns get exactly 0 by contract */
        for (int i = V; i < Vp; i++) g[(size_t)n * Vp + i] = 0.0;
    check_grad("crossentropy dlogits", dl, NULL, g, nl);
    int zero = 1;
    for (int n = 0; n < N; n++)
        for (int i = 0; i < Vp; i++)
            if ((i >= V || tgt[n] < 0) && dl[(size_t)n * Vp + i] != 0.0f) zero = 0;
    CHECK(zero, "crossentropy: padded columns or ignored rows have a nonzero gradient");
    CHECK(losses[1] == 0.0f && losses[5] == 0.0f, "crossentropy: ignored rows have a nonzero loss");
    printf("%-44s %s\n", "crossentropy zero grad in padding/ignored", zero ? "ok" : "FAIL");

    /* dlogits aliasing logits, and no dlogits at all, give the same numbers */
    float *inplace = copyf(logits, nl), *losses2 = filled((size_t)N, 99.0f), *losses3 = filled((size_t)N, 98.0f);
    K->crossentropy(S, losses2, inplace, inplace, tgt, N, V, Vp, dloss);
    K->crossentropy(S, losses3, NULL, logits, tgt, N, V, Vp, dloss);
    int same = bitwise_equal(inplace, dl, nl) && bitwise_equal(losses2, losses, (size_t)N) &&
               bitwise_equal(losses3, losses, (size_t)N);
    CHECK(same, "crossentropy: in-place or loss-only results differ");
    printf("%-44s %s\n", "crossentropy in place / loss only", same ? "ok" : "FAIL");
    free(logits), free(losses), free(dl), free(c.logits), free(c.losses), free(g), free(inplace);
    free(losses2), free(losses3);
}

static void test_loss_accumulate(void)
{
    int n = 37;
    float *l = randf((size_t)n, 0, 10), acc = 2.5f;
    double want = 2.5;
    double sum = 0.0;
    for (int i = 0; i < n; i++) sum += l[i];
    want += 0.125 * sum;
    K->loss_accumulate(S, &acc, l, n, 0.125f);
    double e = fabs(acc - want) / want;
    printf("%-44s rel err %.2e\n", "loss_accumulate (+=)", e);
    CHECK(e < 1e-6, "loss_accumulate: %.9g vs %.9g", acc, want);
    free(l);
}

/* ---------------------------------------------------------------------------------- */
/* AdamW, sumsq, conversions                                                            */

/* the documented order, one element at a time, in plain float */
static void adamw_scalar(float *master, float *m, float *v, float grad,
                         const strata_adamw_args *a)
{
    float g = grad * a->grad_scale;
    *m = a->beta1 * *m + (1.0f - a->beta1) * g;
    *v = a->beta2 * *v + (1.0f - a->beta2) * g * g;
    float mhat = *m / a->bc1;
    float vhat = *v / a->bc2;
    *master -= a->lr * (mhat / (sqrtf(vhat) + a->eps) + a->weight_decay * *master);
}

static void test_adamw(void)
{
    size_t n = 40000; /* large enough to run in parallel */
    float *master = randf(n, -1, 1), *m = filled(n, 0.0f), *v = filled(n, 0.0f);
    float *pout = filled(n, 99.0f);
    float *sm = copyf(master, n), *sv = filled(n, 0.0f), *smm = filled(n, 0.0f);
    double *dmaster = to_f64(master, n), *dm = calloc(n, sizeof(double)), *dv = calloc(n, sizeof(double));
    int bit_ok = 1;
    double err = 0.0;
    for (int step = 1; step <= 3; step++) {
        float *grad = randf(n, -2, 2);
        strata_adamw_args a = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                               .weight_decay = step == 2 ? 0.0f : 0.1f,
                               .bc1 = 1.0f - powf(0.9f, (float)step),
                               .bc2 = 1.0f - powf(0.95f, (float)step), .grad_scale = 0.5f};
        K->adamw(S, master, step == 3 ? NULL : pout, grad, m, v, n, &a);
        for (size_t i = 0; i < n; i++) {
            adamw_scalar(&sm[i], &smm[i], &sv[i], grad[i], &a);
            double g = (double)grad[i] * a.grad_scale;
            dm[i] = 0.9 * dm[i] + 0.1 * g;
            dv[i] = 0.95 * dv[i] + 0.05 * g * g;
            double mh = dm[i] / (1.0 - pow(0.9, step)), vh = dv[i] / (1.0 - pow(0.95, step));
            dmaster[i] -= 1e-3 * (mh / (sqrt(vh) + 1e-8) + a.weight_decay * dmaster[i]);
        }
        bit_ok &= bitwise_equal(master, sm, n) && bitwise_equal(m, smm, n) && bitwise_equal(v, sv, n);
        if (step < 3) bit_ok &= bitwise_equal(pout, master, n);
        free(grad);
    }
    for (size_t i = 0; i < n; i++) {
        double e = fabs(master[i] - dmaster[i]) / (fabs(dmaster[i]) + 1e-3);
        err = e > err ? e : err;
    }
    printf("%-44s bitwise %s, rel err vs double %.2e\n", "adamw (3 steps)", bit_ok ? "ok" : "FAIL", err);
    CHECK(bit_ok, "adamw differs bitwise from the documented float order");
    CHECK(err < 1e-5, "adamw: error %.3e vs the double reference", err);
    free(master), free(m), free(v), free(pout), free(sm), free(sv), free(smm), free(dmaster);
    free(dm), free(dv);
}

static void test_sumsq(void)
{
    size_t n = 1000003;
    float *x = randf(n, -1, 1);
    double want = 1.5;
    for (size_t i = 0; i < n; i++) want += (double)x[i] * x[i];
    double got1 = 1.5, got2 = 1.5;
    set_threads(1);
    K->sumsq(S, &got1, x, n);
    set_threads(2);
    K->sumsq(S, &got2, x, n);
    set_threads(g_threads0);
    double e = fabs(got2 - want) / want;
    printf("%-44s rel err %.2e, 1 vs 2 threads %s\n", "sumsq (+=)", e, got1 == got2 ? "equal" : "DIFFER");
    CHECK(e < 1e-12, "sumsq: %.17g vs %.17g", got2, want);
    CHECK(got1 == got2, "sumsq depends on the thread count");
    double small = 0.0;
    K->sumsq(S, &small, x, 3);
    CHECK(small == (double)x[0] * x[0] + (double)x[1] * x[1] + (double)x[2] * x[2], "sumsq n=3");
    free(x);
}

static uint16_t bf16_bits(float f, int *ok)
{
    uint16_t h = 0;
    K->convert(S, &h, STRATA_BF16, &f, STRATA_F32, 1);
    (void)ok;
    return h;
}

static float from_bits(uint32_t u)
{
    float f;
    memcpy(&f, &u, 4);
    return f;
}

static void test_convert(void)
{
    /* (f32 bits, expected bf16 bits): exact, ties to even (down and up), above/below
     * the tie, negative, overflow to inf, inf, NaN stays NaN */
    const uint32_t in[] = {0x3f800000u, 0x3f808000u, 0x3f818000u, 0x3f808001u, 0x3f807fffu,
                           0xbf808001u, 0x7f7fffffu, 0x7f800000u, 0xff800000u, 0x00000000u};
    const uint16_t want[] = {0x3f80, 0x3f80, 0x3f82, 0x3f81, 0x3f80,
                             0xbf81, 0x7f80, 0x7f80, 0xff80, 0x0000};
    int ok = 1;
    for (size_t i = 0; i < sizeof in / sizeof in[0]; i++) {
        uint16_t h = bf16_bits(from_bits(in[i]), &ok);
        CHECK(h == want[i], "convert f32 0x%08x -> bf16 0x%04x, expected 0x%04x", in[i], h, want[i]);
        ok &= h == want[i];
    }
    uint16_t hn = bf16_bits(from_bits(0x7fc00001u), &ok);
    CHECK((hn & 0x7f80) == 0x7f80 && (hn & 0x7f) != 0, "convert: NaN became 0x%04x", hn);

    /* bulk: RNE against an integer oracle, back to f32 exactly, f32 -> f32 copy */
    size_t n = 50000;
    float *x = randf(n, -100, 100), *back = filled(n, 99.0f), *same = filled(n, 99.0f);
    uint16_t *h = malloc(n * sizeof(uint16_t));
    K->convert(S, h, STRATA_BF16, x, STRATA_F32, n);
    K->convert(S, back, STRATA_F32, h, STRATA_BF16, n);
    K->convert(S, same, STRATA_F32, x, STRATA_F32, n);
    int bulk = bitwise_equal(same, x, n);
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        uint32_t lo = u & 0xffffu, hi = u >> 16;
        uint32_t r = hi + (lo > 0x8000u || (lo == 0x8000u && (hi & 1u)));
        uint32_t b;
        memcpy(&b, &back[i], 4);
        if (h[i] != (uint16_t)r || b != ((uint32_t)h[i] << 16)) bulk = 0;
    }
    CHECK(bulk, "convert: bulk bf16 rounding or round trip differs from the oracle");

    /* accumulate_f32 from fp32 and from bf16 sources */
    float *dst = randf(n, -1, 1), *dst2 = copyf(dst, n), *want_f = malloc(n * sizeof(float));
    for (size_t i = 0; i < n; i++) want_f[i] = dst[i] + back[i];
    K->accumulate_f32(S, dst, h, STRATA_BF16, n);
    K->accumulate_f32(S, dst2, back, STRATA_F32, n);
    int acc = bitwise_equal(dst, want_f, n) && bitwise_equal(dst2, want_f, n);
    CHECK(acc, "accumulate_f32 differs from dst + src");

    /* scale_f32 */
    float *sc = copyf(x, n);
    K->scale_f32(S, sc, 0.3f, n);
    int sc_ok = 1;
    for (size_t i = 0; i < n; i++) sc_ok &= sc[i] == x[i] * 0.3f;
    CHECK(sc_ok, "scale_f32 differs from x * scale");
    printf("%-44s %s\n", "convert f32<->bf16 (RNE), copy", ok && bulk ? "ok" : "FAIL");
    printf("%-44s %s\n", "accumulate_f32 (f32, bf16), scale_f32", acc && sc_ok ? "ok" : "FAIL");
    free(x), free(back), free(same), free(h), free(dst), free(dst2), free(want_f), free(sc);
}

/* ---------------------------------------------------------------------------------- */
/* what the Llama family adds: RMSNorm, rotary positions, SwiGLU                        */

/* vector (n, h) of N x heads at n * ld + h * C; elements between the vectors are not part
 * of the output (ref leaves them as it finds them) */
static void ref_rmsnorm(double *out, double *rstd, const double *inp, const double *w, int N,
                        int heads, int C, int ld, double eps)
{
    for (int n = 0; n < N; n++)
        for (int h = 0; h < heads; h++) {
            size_t off = (size_t)n * ld + (size_t)h * C;
            const double *x = inp + off;
            double ms = 0.0;
            for (int c = 0; c < C; c++) ms += x[c] * x[c];
            double rs = 1.0 / sqrt(ms / C + eps);
            for (int c = 0; c < C; c++) out[off + c] = x[c] * rs * w[c];
            if (rstd) rstd[(size_t)n * heads + h] = rs;
        }
}

typedef struct rms_ctx {
    int N, heads, C, ld;
    double eps;
    double *inp, *w, *out;
    const double *R;
} rms_ctx;

static double rms_loss(void *p)
{
    rms_ctx *c = p;
    size_t n = (size_t)c->N * c->ld;
    memset(c->out, 0, n * sizeof(double)); /* the gaps between vectors contribute nothing */
    ref_rmsnorm(c->out, NULL, c->inp, c->w, c->N, c->heads, c->C, c->ld, c->eps);
    return dot(c->out, c->R, n);
}

/* Forward and backward of one layout. ld > heads * C leaves gaps in every row (as the
 * per-head q and k norms of Qwen3 see a qkv row), which neither direction may touch. Shapes
 * too large for finite differences take the exact formulas in double. */
static void test_rmsnorm(int N, int heads, int C, int ld, float eps)
{
    char tag[80], name[160];
    snprintf(tag, sizeof tag, "N=%d heads=%d C=%d ld=%d", N, heads, C, ld);
    size_t n = (size_t)N * ld, nv = (size_t)N * heads;
    float *inp = randf(n, -2, 2), *w = randf((size_t)C, 0.5, 1.5);
    for (size_t i = 0; i < n; i++) inp[i] += 0.5f; /* a nonzero mean, which RMSNorm keeps */
    float *out = filled(n, 99.0f), *rstd = filled(nv, 99.0f);
    rms_ctx c = {N, heads, C, ld, (double)eps, to_f64(inp, n), to_f64(w, (size_t)C),
                 malloc(n * sizeof(double)), rand_f64(n)};
    double *want = malloc(n * sizeof(double)), *rrstd = malloc(nv * sizeof(double));
    for (size_t i = 0; i < n; i++) want[i] = 99.0; /* gaps keep what out held */
    K->rmsnorm_forward(S, out, rstd, inp, w, N, heads, C, ld, eps);
    ref_rmsnorm(want, rrstd, c.inp, c.w, N, heads, C, ld, c.eps);
    snprintf(name, sizeof name, "rmsnorm_forward out %s", tag);
    check_fwd(name, out, want, n);
    check_fwd("rmsnorm_forward rstd", rstd, rrstd, nv);
    /* transformers' LlamaRMSNorm in fp32: rsqrt of the fp32 mean of squares plus eps, then
     * weight * (x * rstd); the mean here is the double mean rounded once */
    int recipe = 1;
    for (size_t v = 0; v < nv; v++) {
        const double *x = c.inp + (v / heads) * ld + (v % heads) * C;
        double ms = 0.0;
        for (int k = 0; k < C; k++) ms += x[k] * x[k];
        float rs = 1.0f / sqrtf((float)(ms / C) + eps);
        recipe &= rstd[v] == rs;
        for (int k = 0; k < C; k++) recipe &= out[(v / heads) * ld + (v % heads) * C + k] == w[k] * ((float)x[k] * rs);
    }
    printf("%-44s %s\n", "  fp32 recipe of LlamaRMSNorm", recipe ? "same bits" : "DIFFER");
    CHECK(recipe, "%s: rstd or out is not 1/sqrtf(mean + eps) and w * (x * rstd) in fp32", tag);
    float *inplace = copyf(inp, n), *rstd2 = filled(nv, 99.0f);
    for (int r = 0; r < N; r++) /* the gaps hold what out held, so whole rows compare */
        for (int k = heads * C; k < ld; k++) inplace[(size_t)r * ld + k] = 99.0f;
    K->rmsnorm_forward(S, inplace, rstd2, inplace, w, N, heads, C, ld, eps);
    int same = bitwise_equal(inplace, out, n) && bitwise_equal(rstd2, rstd, nv);
    CHECK(same, "%s: rmsnorm_forward in place (out == inp) differs", tag);
    free(inplace), free(rstd2);

    float *R = f64_to_f32(c.R, n);
    float *dinp0 = randf(n, -1, 1), *dw0 = randf((size_t)C, -1, 1);
    float *dinp = copyf(dinp0, n), *dw = copyf(dw0, (size_t)C);
    K->rmsnorm_backward(S, dinp, dw, R, inp, w, rstd, N, heads, C, ld);
    double *g_inp, *g_w;
    int fd = n + (size_t)C < 4000;
    if (fd) {
        g_inp = fd_grad(rms_loss, &c, c.inp, n);
        g_w = fd_grad(rms_loss, &c, c.w, (size_t)C);
    } else {
        g_inp = calloc(n, sizeof(double));
        g_w = calloc((size_t)C, sizeof(double));
        for (size_t v = 0; v < nv; v++) {
            size_t off = (v / heads) * ld + (v % heads) * C;
            const double *x = c.inp + off, *d = c.R + off;
            double rs = rrstd[v], s = 0.0;
            for (int k = 0; k < C; k++) s += c.w[k] * d[k] * x[k];
            for (int k = 0; k < C; k++) {
                g_inp[off + k] = rs * c.w[k] * d[k] - x[k] * rs * rs * rs * s / C;
                g_w[k] += d[k] * x[k] * rs;
            }
        }
    }
    const char *oracle = fd ? "finite differences" : "double formula";
    snprintf(name, sizeof name, "rmsnorm_backward dinp (+=) %s", tag);
    check_grad_vs(name, dinp, dinp0, g_inp, n, oracle);
    check_grad_vs("rmsnorm_backward dw (+=)", dw, dw0, g_w, (size_t)C, oracle);
    free(inp), free(w), free(out), free(rstd), free(c.inp), free(c.w), free(c.out), free((void *)c.R);
    free(want), free(rrstd), free(R), free(dinp0), free(dw0), free(dinp), free(dw), free(g_inp), free(g_w);
}

/* inv_freq as transformers computes it in fp32: 1 / base^(2i / hs) */
static float *rope_inv_freq(int hs, float base)
{
    float *f = malloc((size_t)(hs / 2) * sizeof(float));
    for (int i = 0; i < hs / 2; i++) f[i] = 1.0f / powf(base, (float)(2 * i) / (float)hs);
    return f;
}

/* x rotated in double by dir * angle, the angle being the fp32 product (float)t * inv_freq[i]
 * (the kernel's contract); elements outside the heads are left alone */
static void ref_rope(double *x, const float *inv_freq, int B, int T, int heads, int hs, int ld, int dir)
{
    int half = hs / 2;
    for (int r = 0; r < B * T; r++)
        for (int h = 0; h < heads; h++) {
            double *a = x + (size_t)r * ld + (size_t)h * hs, *b = a + half;
            for (int i = 0; i < half; i++) {
                double ang = (double)((float)(r % T) * inv_freq[i]), cs = cos(ang), sn = sin(ang) * dir;
                double x1 = a[i], x2 = b[i];
                a[i] = x1 * cs - x2 * sn;
                b[i] = x2 * cs + x1 * sn;
            }
        }
}

typedef struct rope_ctx {
    int B, T, heads, hs, ld;
    const float *inv_freq;
    double *x, *y;
    const double *R;
} rope_ctx;

static double rope_loss(void *p)
{
    rope_ctx *c = p;
    size_t n = (size_t)c->B * c->T * c->ld;
    memcpy(c->y, c->x, n * sizeof(double));
    ref_rope(c->y, c->inv_freq, c->B, c->T, c->heads, c->hs, c->ld, 1);
    return dot(c->y, c->R, n);
}

/* The forward against the double rotation and, bit for bit, against transformers' fp32
 * formula (q * cos + rotate_half(q) * sin with cosf, sinf of the fp32 angle); forward then
 * backward gives the input back (a rotation's transpose is its inverse); the backward against
 * finite differences (small shapes) or the exact transpose in double. Elements past the heads
 * (the rest of a qkv row) stay as they are in both directions. */
static void test_rope(int B, int T, int heads, int hs, int ld, float base)
{
    char tag[96], name[160];
    snprintf(tag, sizeof tag, "B=%d T=%d heads=%d hs=%d ld=%d", B, T, heads, hs, ld);
    int half = hs / 2;
    size_t n = (size_t)B * T * ld;
    float *inv = rope_inv_freq(hs, base), *x0 = randf(n, -2, 2), *x = copyf(x0, n);
    rope_ctx c = {B, T, heads, hs, ld, inv, to_f64(x0, n), malloc(n * sizeof(double)), rand_f64(n)};
    double *want = to_f64(x0, n);
    K->rope_forward(S, x, inv, NULL, B, T, heads, hs, ld);
    ref_rope(want, inv, B, T, heads, hs, ld, 1);
    snprintf(name, sizeof name, "rope_forward %s", tag);
    check_fwd(name, x, want, n);
    int exact = 1;
    for (int r = 0; r < B * T; r++) {
        for (int h = 0; h < heads; h++)
            for (int i = 0; i < half; i++) {
                size_t a = (size_t)r * ld + (size_t)h * hs + i;
                float ang = (float)(r % T) * inv[i], cs = cosf(ang), sn = sinf(ang);
                float q1 = x0[a], q2 = x0[a + half];
                exact &= x[a] == q1 * cs + (-q2) * sn && x[a + half] == q2 * cs + q1 * sn;
            }
        exact &= bitwise_equal(x + (size_t)r * ld + (size_t)heads * hs, x0 + (size_t)r * ld + (size_t)heads * hs,
                               (size_t)(ld - heads * hs));
    }
    printf("%-44s %s\n", "  fp32 formula of apply_rotary_pos_emb", exact ? "same bits" : "DIFFER");
    CHECK(exact, "%s: not q * cos + rotate_half(q) * sin in fp32, or the rest of the row moved", tag);

    float *back = copyf(x, n);
    K->rope_backward(S, back, inv, NULL, B, T, heads, hs, ld);
    double *x0d = to_f64(x0, n);
    /* each turn rounds every element to a few ulps of the row's size, not of its own */
    double e = max_rel_err(back, NULL, x0d, n, 1.0);
    printf("%-44s max err %.2e of max |x|\n", "  forward then backward: the input", e);
    CHECK(e < 1e-6, "%s: backward(forward(x)) is %.3e of max |x| from x", tag, e);

    float *dx = f64_to_f32(c.R, n);
    K->rope_backward(S, dx, inv, NULL, B, T, heads, hs, ld);
    int fd = n < 4000;
    double *g;
    if (fd) {
        g = fd_grad(rope_loss, &c, c.x, n);
    } else {
        g = malloc(n * sizeof(double));
        memcpy(g, c.R, n * sizeof(double));
        ref_rope(g, inv, B, T, heads, hs, ld, -1);
    }
    snprintf(name, sizeof name, "rope_backward %s", tag);
    check_grad_vs(name, dx, NULL, g, n, fd ? "finite differences" : "the transpose in double");
    free(inv), free(x0), free(x), free(c.x), free(c.y), free((void *)c.R), free(want), free(back), free(x0d);
    free(dx), free(g);
}

/* Rotary positions of packed documents: a row turns by its position in its document, the
 * same fp32 formula as test_rope's with that position, and the backward undoes it. */
static void test_rope_documents(void)
{
    int B = 2, T = 70, heads = 3, hs = 64, ld = 3 * 64 + 8, half = hs / 2;
    const int starts[] = {5, 6, 40, 70 + 33};
    size_t n = (size_t)B * T * ld;
    int32_t pos[2 * 70];
    doc_positions(pos, B, T, starts, 4);
    float *inv = rope_inv_freq(hs, 500000.0f), *x0 = randf(n, -2, 2), *x = copyf(x0, n);
    K->rope_forward(S, x, inv, pos, B, T, heads, hs, ld);
    int exact = 1;
    for (int r = 0; r < B * T; r++)
        for (int h = 0; h < heads; h++)
            for (int i = 0; i < half; i++) {
                size_t a = (size_t)r * ld + (size_t)h * hs + i;
                float ang = (float)pos[r] * inv[i], cs = cosf(ang), sn = sinf(ang);
                float q1 = x0[a], q2 = x0[a + half];
                exact &= x[a] == q1 * cs + (-q2) * sn && x[a + half] == q2 * cs + q1 * sn;
            }
    printf("%-44s %s\n", "rope_forward, packed documents' positions", exact ? "same bits" : "DIFFER");
    CHECK(exact, "rope_forward with positions: not the formula at each row's position in its document");
    K->rope_backward(S, x, inv, pos, B, T, heads, hs, ld);
    double *x0d = to_f64(x0, n);
    double e = max_rel_err(x, NULL, x0d, n, 1.0);
    printf("%-44s max err %.2e of max |x|\n", "  forward then backward: the input", e);
    CHECK(e < 1e-6, "rope with positions: backward(forward(x)) is %.3e of max |x| from x", e);
    free(inv), free(x0), free(x), free(x0d);
}

/* The cosines and sines are kept between calls: a call with other inv_freq values at the same
 * address, fewer positions, more positions, or another head size must not use stale ones. */
static void test_rope_table_changes(void)
{
    int hs = 64, heads = 2, ld = 160, Tmax = 40;
    size_t n = (size_t)Tmax * ld;
    float *inv = rope_inv_freq(hs, 10000.0f), *alt = rope_inv_freq(hs, 500000.0f);
    float *inv128 = rope_inv_freq(128, 10000.0f);
    struct { const float *f; int T, hs, heads; } calls[] = {
        {inv, 7, hs, heads}, {alt, 5, hs, heads}, {inv, Tmax, hs, heads}, {inv128, 9, 128, 1}, {inv, 3, hs, heads},
    };
    float *freq = malloc((size_t)64 * sizeof(float)); /* one address, its values changing */
    int ok = 1;
    for (size_t k = 0; k < sizeof calls / sizeof calls[0]; k++) {
        memcpy(freq, calls[k].f, (size_t)(calls[k].hs / 2) * sizeof(float));
        float *x0 = randf(n, -1, 1), *x = copyf(x0, n);
        double *want = to_f64(x0, n);
        K->rope_forward(S, x, freq, NULL, 1, calls[k].T, calls[k].heads, calls[k].hs, ld);
        ref_rope(want, freq, 1, calls[k].T, calls[k].heads, calls[k].hs, ld, 1);
        ok &= max_rel_err(x, NULL, want, n, 1e-2) < 1e-5;
        free(x0), free(x), free(want);
    }
    printf("%-44s %s\n", "rope: inv_freq, T and hs changing between calls", ok ? "ok" : "FAIL");
    CHECK(ok, "rope used cosines and sines of an earlier call's inv_freq, T or hs");
    free(inv), free(alt), free(inv128), free(freq);
}

static double ref_silu(double x)
{
    return x / (1.0 + exp(-x));
}

typedef struct swiglu_ctx {
    int N, I;
    double *gu;
    const double *R;
} swiglu_ctx;

static double swiglu_loss(void *p)
{
    swiglu_ctx *c = p;
    double s = 0.0;
    for (int n = 0; n < c->N; n++)
        for (int j = 0; j < c->I; j++) {
            const double *g = c->gu + (size_t)n * 2 * c->I;
            s += ref_silu(g[j]) * g[c->I + j] * c->R[(size_t)n * c->I + j];
        }
    return s;
}

/* Forward and backward, the gate holding values where exp(-x) overflows fp32 (|x| > 88) or
 * is far below its smallest normal, in a row's first lanes and its last; dgu (=) may alias
 * gu. Large shapes take the exact derivative in double. */
static void test_swiglu(int N, int I)
{
    char tag[64], name[128];
    snprintf(tag, sizeof tag, "N=%d I=%d", N, I);
    size_t ni = (size_t)N * I, ng = 2 * ni;
    float *gu = randf(ng, -6, 6);
    const float special[] = {0.0f, -0.0f, 1e-6f, -1e-6f, 20.0f, -20.0f, 50.0f, -50.0f,
                             87.5f, -87.5f, 88.5f, -88.5f, 100.0f, -100.0f, 1000.0f, -3e4f};
    int ns = (int)(sizeof special / sizeof special[0]);
    for (int n = 0; n < N; n++)
        for (int k = 0; k < ns && k < I; k++) {
            gu[(size_t)n * 2 * I + (size_t)(k * 7 + n) % I] = special[k];
            gu[(size_t)n * 2 * I + (size_t)I - 1 - (size_t)k % I] = special[(k + n) % ns];
        }
    float *out = filled(ni, 99.0f);
    swiglu_ctx c = {N, I, to_f64(gu, ng), rand_f64(ni)};
    double *want = malloc(ni * sizeof(double));
    for (int n = 0; n < N; n++)
        for (int j = 0; j < I; j++)
            want[(size_t)n * I + j] = ref_silu(c.gu[(size_t)n * 2 * I + j]) * c.gu[(size_t)n * 2 * I + I + j];
    K->swiglu_forward(S, out, gu, N, I);
    snprintf(name, sizeof name, "swiglu_forward %s", tag);
    check_fwd(name, out, want, ni);

    float *R = f64_to_f32(c.R, ni), *dgu = filled(ng, 99.0f);
    K->swiglu_backward(S, dgu, R, gu, N, I);
    int fd = ng < 4000;
    double *g;
    if (fd) {
        g = fd_grad(swiglu_loss, &c, c.gu, ng);
    } else {
        g = malloc(ng * sizeof(double));
        for (int n = 0; n < N; n++)
            for (int j = 0; j < I; j++) {
                double x = c.gu[(size_t)n * 2 * I + j], u = c.gu[(size_t)n * 2 * I + I + j];
                double sg = 1.0 / (1.0 + exp(-x)), d = c.R[(size_t)n * I + j];
                g[(size_t)n * 2 * I + j] = d * u * sg * (1.0 + x * (1.0 - sg));
                g[(size_t)n * 2 * I + I + j] = d * x * sg;
            }
    }
    snprintf(name, sizeof name, "swiglu_backward dgu (=) %s", tag);
    check_grad_vs(name, dgu, NULL, g, ng, fd ? "finite differences" : "double formula");
    int finite = 1;
    for (size_t i = 0; i < ni; i++) finite &= isfinite(out[i]);
    for (size_t i = 0; i < ng; i++) finite &= isfinite(dgu[i]);
    CHECK(finite, "%s: swiglu gave a non-finite value for a finite input", tag);
    float *alias = copyf(gu, ng);
    K->swiglu_backward(S, alias, R, alias, N, I);
    int same = bitwise_equal(alias, dgu, ng);
    printf("%-44s %s\n", "  finite at |x| up to 3e4; in place (dgu == gu)", finite && same ? "ok" : "FAIL");
    CHECK(same, "%s: swiglu_backward with dgu == gu differs", tag);
    free(gu), free(out), free(c.gu), free((void *)c.R), free(want), free(R), free(dgu), free(g), free(alias);
}

/* the new kernels at sizes that split across threads: 1, 2 and 2 threads give the same bits */
static void test_llama_determinism(void)
{
    int N = 96, C = 512, I = 1376, T = 48, NH = 8, NKV = 2, hs = 64, W = (NH + 2 * NKV) * hs;
    float *x = randf((size_t)N * C, -2, 2), *w = randf((size_t)C, 0.5, 1.5), *d = randf((size_t)N * C, -1, 1);
    float *qkv = randf((size_t)N * W, -1, 1), *inv = rope_inv_freq(hs, 10000.0f);
    float *gu = randf((size_t)N * 2 * I, -5, 5), *dsw = randf((size_t)N * I, -1, 1);
    float *qk = randf((size_t)N * W, -1, 1), *qd = randf((size_t)N * W, -1, 1);
    float *r[3][9];
    for (int run = 0; run < 3; run++) {
        set_threads(run == 0 ? 1 : 2);
        float **o = r[run];
        o[0] = filled((size_t)N * C, 0.0f), o[1] = filled((size_t)N, 0.0f);
        o[2] = filled((size_t)N * C, 0.5f), o[3] = filled((size_t)C, 0.25f);
        K->rmsnorm_forward(S, o[0], o[1], x, w, N, 1, C, C, 1e-5f);
        K->rmsnorm_backward(S, o[2], o[3], d, x, w, o[1], N, 1, C, C);
        o[4] = copyf(qkv, (size_t)N * W), o[5] = filled((size_t)N * NH, 0.0f);
        K->rmsnorm_forward(S, o[4], o[5], qkv, w, N, NH, hs, W, 1e-6f); /* per-head q norm */
        K->rmsnorm_backward(S, o[4], o[3], qd, qkv, w, o[5], N, NH, hs, W);
        o[6] = copyf(qk, (size_t)N * W);
        K->rope_forward(S, o[6], inv, NULL, N / T, T, NH, hs, W);
        K->rope_forward(S, o[6] + NH * hs, inv, NULL, N / T, T, NKV, hs, W);
        K->rope_backward(S, o[6], inv, NULL, N / T, T, NH + NKV, hs, W);
        o[7] = filled((size_t)N * I, 0.0f), o[8] = filled((size_t)N * 2 * I, 0.0f);
        K->swiglu_forward(S, o[7], gu, N, I);
        K->swiglu_backward(S, o[8], dsw, gu, N, I);
    }
    size_t sizes[9] = {(size_t)N * C, (size_t)N, (size_t)N * C, (size_t)C, (size_t)N * W, (size_t)N * NH,
                       (size_t)N * W, (size_t)N * I, (size_t)N * 2 * I};
    int same = 1;
    for (int run = 1; run < 3; run++)
        for (int k = 0; k < 9; k++) same &= bitwise_equal(r[0][k], r[run][k], sizes[k]);
    printf("%-44s %s\n", "rmsnorm/rope/swiglu bitwise, 1 vs 2 threads", same ? "ok" : "FAIL");
    CHECK(same, "rmsnorm, rope or swiglu depends on the thread count");
    set_threads(g_threads0);
    for (int run = 0; run < 3; run++)
        for (int k = 0; k < 9; k++) free(r[run][k]);
    free(x), free(w), free(d), free(qkv), free(inv), free(gu), free(dsw), free(qk), free(qd);
}

/* ---------------------------------------------------------------------------------- */
/* determinism across thread counts                                                     */

/* matmul forward (bias + GELU) and backward at 1, 2, 2 threads: bitwise the same. And a
 * row's forward output and input gradient do not depend on how many rows the call has
 * (the first 40 alone give the same bits), so a sequence's activations are the same in
 * any batch: ZeRO world sizes, evaluation and training agree exactly on them. */
static void test_matmul_determinism(int M, int Kd, int N)
{
    float *inp = randf((size_t)M * Kd, -1, 1), *w = randf((size_t)Kd * N, -1, 1);
    float *dout = randf((size_t)M * N, -1, 1), *bias = randf((size_t)N, -1, 1);
    int same = 1, same_f = 1, rows_f = 1, rows_b = 1, m0 = 40;
    for (int w_nk = 0; w_nk < 2; w_nk++) {
        float *o[3], *g[3];
        for (int run = 0; run < 3; run++) {
            set_threads(run == 0 ? 1 : 2);
            o[run] = filled((size_t)M * N, 9.0f);
            g[run] = filled((size_t)M * N, 9.0f);
            K->matmul_forward(S, o[run], g[run], inp, w, bias, M, Kd, N, w_nk);
        }
        for (int run = 1; run < 3; run++)
            same_f &= bitwise_equal(o[0], o[run], (size_t)M * N) && bitwise_equal(g[0], g[run], (size_t)M * N);
        K->matmul_forward(S, o[1], g[1], inp, w, bias, m0, Kd, N, w_nk);
        rows_f &= bitwise_equal(o[0], o[1], (size_t)m0 * N) && bitwise_equal(g[0], g[1], (size_t)m0 * N);
        float *di = filled((size_t)M * Kd, 0.0f), *di0 = filled((size_t)m0 * Kd, 0.0f);
        float *dw = filled((size_t)Kd * N, 0.0f);
        K->matmul_backward(S, di, dw, NULL, dout, inp, w, M, Kd, N, w_nk);
        K->matmul_backward(S, di0, dw, NULL, dout, inp, w, m0, Kd, N, w_nk);
        rows_b &= bitwise_equal(di, di0, (size_t)m0 * Kd);
        free(di), free(di0), free(dw);
        for (int run = 0; run < 3; run++) free(o[run]), free(g[run]);
    }
    for (int w_nk = 0; w_nk < 2; w_nk++) {
        float *r[3][3];
        for (int run = 0; run < 3; run++) {
            set_threads(run == 0 ? 1 : 2);
            r[run][0] = filled((size_t)M * Kd, 0.0f);
            r[run][1] = filled((size_t)Kd * N, 0.5f);
            r[run][2] = filled((size_t)N, 0.25f);
            K->matmul_backward(S, r[run][0], r[run][1], r[run][2], dout, inp, w, M, Kd, N, w_nk);
        }
        for (int run = 1; run < 3; run++)
            same &= bitwise_equal(r[0][0], r[run][0], (size_t)M * Kd) &&
                    bitwise_equal(r[0][1], r[run][1], (size_t)Kd * N) &&
                    bitwise_equal(r[0][2], r[run][2], (size_t)N);
        for (int run = 0; run < 3; run++)
            for (int j = 0; j < 3; j++) free(r[run][j]);
    }
    char name[96];
    snprintf(name, sizeof name, "matmul %dx%dx%d bitwise, 1 vs 2 threads", M, Kd, N);
    printf("%-44s %s\n", name, same && same_f ? "ok" : "FAIL");
    CHECK(same_f, "matmul_forward %dx%dx%d depends on the thread count", M, Kd, N);
    CHECK(same, "matmul_backward %dx%dx%d depends on the thread count", M, Kd, N);
    snprintf(name, sizeof name, "matmul %dx%dx%d: %d rows alone, same bits", M, Kd, N, m0);
    printf("%-44s %s\n", name, rows_f && rows_b ? "ok" : "FAIL");
    CHECK(rows_f, "matmul_forward %dx%dx%d: the first %d rows differ when computed alone", M, Kd, N, m0);
    CHECK(rows_b, "matmul_backward %dx%dx%d: dinp's first %d rows differ when computed alone", M, Kd, N, m0);
    set_threads(g_threads0);
    free(inp), free(w), free(dout), free(bias);
}

static void test_attention_determinism(int NH, int NKV, int hs)
{
    int B = 2, T = 80, C = NH * hs, W = (NH + 2 * NKV) * hs;
    size_t nq = (size_t)B * T * W, no = (size_t)B * T * C;
    float *qkv = randf(nq, -1, 1), *out = filled(no, 0.0f), *lse = filled((size_t)B * NH * T, 0.0f);
    float *d = randf(no, -1, 1), *dq[3];
    int same_a = 1;
    for (int run = 0; run < 3; run++) {
        set_threads(run == 0 ? 1 : 2);
        float *o = filled(no, 0.0f);
        K->attention_forward(S, o, lse, qkv, NULL, B, T, NH, NKV, hs);
        if (run == 0) memcpy(out, o, no * sizeof(float));
        same_a &= bitwise_equal(o, out, no);
        dq[run] = filled(nq, 7.0f);
        K->attention_backward(S, dq[run], d, qkv, out, lse, NULL, B, T, NH, NKV, hs);
        free(o);
    }
    same_a &= bitwise_equal(dq[0], dq[1], nq) && bitwise_equal(dq[0], dq[2], nq);
    char name[96];
    snprintf(name, sizeof name, "attention NH=%d NKV=%d bitwise, 1 vs 2 threads", NH, NKV);
    printf("%-44s %s\n", name, same_a ? "ok" : "FAIL");
    CHECK(same_a, "attention NH=%d NKV=%d depends on the thread count", NH, NKV);
    set_threads(g_threads0);
    free(qkv), free(out), free(lse), free(d);
    for (int run = 0; run < 3; run++) free(dq[run]);
}

/* ---------------------------------------------------------------------------------- */
/* timing (informational, never asserted)                                               */

/* returns the best time in ms, or -1 when skipped because the estimate (from est_ms)
 * says this build (a sanitizer or debug build) would take too long */
static double time_matmul(int M, int Kd, int N, double est_ms)
{
    if (est_ms > 1500.0) {
        printf("timing matmul_forward M=%d K=%d N=%d: skipped, this build is slow\n", M, Kd, N);
        return -1.0;
    }
    float *inp = randf((size_t)M * Kd, -1, 1), *w = randf((size_t)Kd * N, -1, 1);
    float *bias = randf((size_t)N, -1, 1), *out = filled((size_t)M * N, 0.0f);
    double best = 1e30;
    for (int rep = 0; rep < 3; rep++) {
        double t0 = strata_now_ms();
        K->matmul_forward(S, out, NULL, inp, w, bias, M, Kd, N, 0);
        double dt = strata_now_ms() - t0;
        best = dt < best ? dt : best;
    }
    int nt = 1;
#ifdef _OPENMP
    nt = omp_get_max_threads();
#endif
    printf("timing matmul_forward M=%d K=%d N=%d: %.2f ms, %.1f GFLOP/s (%d threads)\n", M, Kd, N,
           best, 2.0 * M * Kd * (double)N / (best * 1e6), nt);
    free(inp), free(w), free(bias), free(out);
    return best;
}

int main(void)
{
    check_quiet = 1; /* thousands of element checks: print failures only */
#ifdef _OPENMP
    g_threads0 = omp_get_max_threads();
#endif
    if (!MULTI_THREAD_OK) {
        set_threads(1);
        printf("ThreadSanitizer build: kernels run on one thread, 1-vs-2-thread checks compare 1 with 1\n");
    }
    test_encoder();
    test_encoder_no_positions();
    test_encoder_documents();
    test_layernorm(10, 8);
    test_layernorm(3, 37);
    /* every matrix product on the hand-written kernel, then on the BLAS (when built with
     * one), then as the automatic choice splits them: each against the same oracles */
    const char *gemm_names[] = {"auto", "strata (hand-written)", "blas"};
    int gemm_impls[] = {1, 2, 0};
    for (int gi = 0; gi < 3; gi++) {
        int impl = gemm_impls[gi];
        if (impl == 2 && !strata_cpu_gemm_has_blas()) {
            printf("-- matrix products: no BLAS in this build (-DSTRATA_BLAS=none)\n");
            continue;
        }
        strata_cpu_gemm_select(impl);
        printf("-- matrix products: %s\n", gemm_names[impl]);
        for (int w_nk = 0; w_nk < 2; w_nk++)
            for (int bias = 0; bias < 2; bias++) test_matmul(10, 8, 16, w_nk, bias, 0);
        test_matmul(10, 8, 16, 0, 1, 1); /* fused bias + GELU */
        test_matmul(19, 13, 37, 0, 1, 1); /* partial micro-tiles */
        test_matmul(19, 13, 37, 1, 0, 0);
        test_matmul(70, 300, 150, 0, 1, 1); /* crosses the K slice and column block */
        test_matmul(70, 300, 150, 1, 0, 0);
        test_matmul(300, 96, 600, 0, 1, 1); /* auto: BLAS forward, BLAS dinp, hand dW */
        test_matmul(300, 600, 128, 1, 0, 0); /* auto: head-like, BLAS forward */
        /* the Llama family's projections: (out, in) weights, q/k/v with a bias */
        test_matmul(19, 13, 37, 1, 1, 0);
        test_matmul(70, 64, 96, 1, 1, 0);
        test_matmul(300, 96, 600, 1, 1, 0);
        test_matmul_determinism(200, 192, 300);
        test_matmul_determinism(520, 300, 700); /* large enough to split across threads */
    }
    strata_cpu_gemm_select(-1);
    /* multi-head (GPT-2), then grouped-query: every coordinate by finite differences on
     * small shapes, sampled ones at the Llama family's head sizes (T not a multiple of the
     * 64-query block among them) */
    test_attention(2, 5, 2, 2, 4, 1.0, 0);
    test_attention(1, 70, 2, 2, 4, 2.0, 0); /* crosses the query block */
    test_attention(2, 5, 8, 2, 4, 1.0, 0);
    test_attention(1, 9, 8, 1, 8, 1.5, 0);
    test_attention(1, 70, 4, 2, 4, 2.0, 0);
    test_attention(2, 200, 8, 2, 64, 1.0, 24);
    test_attention(1, 70, 8, 1, 64, 1.0, 24);
    test_attention(1, 130, 8, 2, 128, 0.7, 24);
    test_attention(1, 256, 8, 1, 128, 0.7, 12);
    {
        /* documents mid-block, at a block's edge (64), one token long, a row without any */
        const int starts[] = {3, 40, 63, 64, 65, 129, 150 + 1, 150 + 90};
        test_attention_documents(3, 150, 4, 2, 16, starts, 8);
        test_attention_documents(2, 150, 8, 1, 64, starts + 4, 4);
    }
    test_attention_gqa_is_repeated_mha(2, 70, 8, 2, 64);
    test_attention_gqa_is_repeated_mha(1, 130, 8, 1, 128);
    /* what the Llama family adds */
    test_rmsnorm(10, 1, 8, 8, 1e-5f);
    test_rmsnorm(3, 1, 37, 37, 1e-6f);
    test_rmsnorm(5, 4, 16, 4 * 16 + 24, 1e-6f); /* per-head norms inside wider rows */
    test_rmsnorm(64, 1, 512, 512, 1e-5f);       /* large enough to split across threads */
    test_rmsnorm(97, 8, 64, 12 * 64, 1e-6f);    /* Qwen3's q norm over a qkv row */
    test_rope(1, 5, 2, 64, 2 * 64 + 40, 10000.0f);
    test_rope(3, 3, 1, 128, 128 + 64, 1000000.0f); /* 9 rows */
    test_rope(2, 301, 8, 64, 12 * 64, 10000.0f);   /* q of a qkv row, positions past 256 */
    test_rope(3, 77, 2, 128, 12 * 128, 500000.0f);
    test_rope_table_changes();
    test_rope_documents();
    test_swiglu(5, 37);
    test_swiglu(3, 16);
    test_swiglu(64, 1000);
    test_gelu();
    test_residual();
    test_crossentropy();
    test_loss_accumulate();
    test_adamw();
    test_sumsq();
    test_convert();
    test_attention_determinism(4, 4, 16);
    test_attention_determinism(8, 2, 64);
    test_llama_determinism();
    double small_ms = time_matmul(16 * 128, 128, 512, 0.0);
    time_matmul(2048, 768, 3072, small_ms * (768.0 * 3072) / (128.0 * 512));
    if (failures) {
        printf("%d check(s) failed\n", failures);
        return 1;
    }
    printf("all kernel checks passed\n");
    return 0;
}
