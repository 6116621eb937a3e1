/* bench/bench_llama_cpu.c: the CPU kernels the Llama family adds (RMSNorm, rotary positions,
 * SwiGLU) at one decoder layer's shapes, beside what they replace in GPT-2 (LayerNorm, GELU
 * on as many elements) and beside the layer's matrix products and attention, so a slow
 * element-wise kernel shows as a share of the layer it sits in.
 *   build/bench/bench_llama_cpu [B T C NH NKV I]   (default 4 256 512 8 2 1536: the issue's
 *                                                   8-layer model's layer, GQA 4:1)
 * Prints a markdown table: milliseconds per call (the best of repeated calls over about
 * 0.2 s, in each of three rounds over the table), the bytes each call must move over that
 * time (GB/s), and the share of one layer's forward and backward (every kernel the layer
 * calls, as often as the model calls it). Threads: OMP_NUM_THREADS. */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/common.h"
#include "core/kernels.h"

static const strata_kernels *K = &strata_kernels_cpu;
#define S NULL

static float *randf(size_t n, float lo, float hi)
{
    float *x = malloc(n * sizeof(float));
    uint64_t s = 0x9e3779b97f4a7c15ull ^ n;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = lo + (hi - lo) * (float)((double)(s >> 40) / (double)(1ull << 24));
    }
    return x;
}

/* the shapes and every buffer one layer's kernels touch */
typedef struct layer {
    int B, T, C, NH, NKV, hs, I, W, N;
    float *x, *xn, *w, *rstd, *mean, *lnb, *qkv, *wqkv, *bqkv, *att, *lse, *wo, *y, *wgu, *gu, *h, *wd;
    float *d, *dqkv, *dqkv2, *dgu, *dw, *db, *dx, *datt, *dh;
    float *inv_freq;
} layer;

typedef void (*call_fn)(layer *L);

#define ROUNDS 3

static double time_ms(call_fn f, layer *L)
{
    double best = 1e30, spent = 0.0;
    f(L); /* warm-up: scratch and the rotary table are made here */
    for (int rep = 0; rep < 200 && (rep < 3 || spent < 200.0); rep++) {
        double t0 = strata_now_ms();
        f(L);
        double dt = strata_now_ms() - t0;
        spent += dt;
        best = dt < best ? dt : best;
    }
    return best;
}

/* ---- the calls: one kernel each, as the model would make it ---- */

static void rms_fwd(layer *L) { K->rmsnorm_forward(S, L->xn, L->rstd, L->x, L->w, L->N, 1, L->C, L->C, 1e-5f); }
static void rms_bwd(layer *L) { K->rmsnorm_backward(S, L->dx, L->dw, L->d, L->x, L->w, L->rstd, L->N, 1, L->C, L->C); }
static void ln_fwd(layer *L) { K->layernorm_forward(S, L->xn, L->mean, L->rstd, L->x, L->w, L->lnb, L->N, L->C); }
static void ln_bwd(layer *L)
{
    K->layernorm_backward(S, L->dx, L->dw, L->db, L->d, L->x, L->w, L->mean, L->rstd, L->N, L->C);
}
static void qnorm_fwd(layer *L) /* Qwen3's per-head q norm inside the qkv rows */
{
    K->rmsnorm_forward(S, L->qkv, L->rstd, L->qkv, L->w, L->N, L->NH, L->hs, L->W, 1e-6f);
}
static void qnorm_bwd(layer *L)
{
    K->rmsnorm_backward(S, L->dqkv2, L->dw, L->dqkv, L->qkv, L->w, L->rstd, L->N, L->NH, L->hs, L->W);
}
static void rope_fwd(layer *L) /* q, then k */
{
    K->rope_forward(S, L->qkv, L->inv_freq, NULL, L->B, L->T, L->NH, L->hs, L->W);
    K->rope_forward(S, L->qkv + (size_t)L->NH * L->hs, L->inv_freq, NULL, L->B, L->T, L->NKV, L->hs, L->W);
}
static void rope_bwd(layer *L) /* q and k together: they sit side by side */
{
    K->rope_backward(S, L->dqkv, L->inv_freq, NULL, L->B, L->T, L->NH + L->NKV, L->hs, L->W);
}
static void swiglu_fwd(layer *L) { K->swiglu_forward(S, L->h, L->gu, L->N, L->I); }
static void swiglu_bwd(layer *L) { K->swiglu_backward(S, L->dgu, L->dh, L->gu, L->N, L->I); }
static void gelu_fwd(layer *L) { K->gelu_forward(S, L->h, L->gu, (size_t)L->N * L->I); }
static void gelu_bwd(layer *L) { K->gelu_backward(S, L->dgu, L->gu, L->dh, (size_t)L->N * L->I); }
static void resid(layer *L) { K->residual_forward(S, L->y, L->x, L->xn, (size_t)L->N * L->C); }
static void add_ip(layer *L) { K->add_inplace(S, L->dx, L->d, (size_t)L->N * L->C); }
static void mm_qkv_fwd(layer *L) { K->matmul_forward(S, L->qkv, NULL, L->xn, L->wqkv, L->bqkv, L->N, L->C, L->W, 1); }
static void mm_qkv_bwd(layer *L)
{
    K->matmul_backward(S, L->dx, L->dw, NULL, L->dqkv, L->xn, L->wqkv, L->N, L->C, L->W, 1);
}
static void mm_o_fwd(layer *L) { K->matmul_forward(S, L->y, NULL, L->att, L->wo, NULL, L->N, L->C, L->C, 1); }
static void mm_o_bwd(layer *L) { K->matmul_backward(S, L->datt, L->dw, NULL, L->d, L->att, L->wo, L->N, L->C, L->C, 1); }
static void mm_gu_fwd(layer *L) { K->matmul_forward(S, L->gu, NULL, L->xn, L->wgu, NULL, L->N, L->C, 2 * L->I, 1); }
static void mm_gu_bwd(layer *L)
{
    K->matmul_backward(S, L->dx, L->dw, NULL, L->dgu, L->xn, L->wgu, L->N, L->C, 2 * L->I, 1);
}
static void mm_down_fwd(layer *L) { K->matmul_forward(S, L->y, NULL, L->h, L->wd, NULL, L->N, L->I, L->C, 1); }
static void mm_down_bwd(layer *L) { K->matmul_backward(S, L->dh, L->dw, NULL, L->d, L->h, L->wd, L->N, L->I, L->C, 1); }
static void attn_fwd(layer *L) { K->attention_forward(S, L->att, L->lse, L->qkv, NULL, L->B, L->T, L->NH, L->NKV, L->hs); }
static void attn_bwd(layer *L)
{
    K->attention_backward(S, L->dqkv, L->datt, L->qkv, L->att, L->lse, NULL, L->B, L->T, L->NH, L->NKV, L->hs);
}

typedef struct row {
    const char *name;
    call_fn f;
    int in_layer;  /* calls per layer step (forward and backward) of the Llama layer */
    double bytes;  /* what the call must read and write at least */
    double ms;
} row;

int main(int argc, char **argv)
{
    layer L = {.B = 4, .T = 256, .C = 512, .NH = 8, .NKV = 2, .I = 1536};
    if (argc == 7) {
        L.B = atoi(argv[1]), L.T = atoi(argv[2]), L.C = atoi(argv[3]);
        L.NH = atoi(argv[4]), L.NKV = atoi(argv[5]), L.I = atoi(argv[6]);
    } else if (argc != 1) {
        fprintf(stderr, "usage: %s [B T C NH NKV I]\n", argv[0]);
        return 2;
    }
    if (L.B < 1 || L.T < 1 || L.NH < 1 || L.NKV < 1 || L.NH % L.NKV || L.C % L.NH || L.I < 1 ||
        (L.C / L.NH) % 2) {
        fprintf(stderr, "bench_llama_cpu: need NH a multiple of NKV and C / NH even\n");
        return 2;
    }
    L.hs = L.C / L.NH, L.W = (L.NH + 2 * L.NKV) * L.hs, L.N = L.B * L.T;
    size_t N = (size_t)L.N, C = (size_t)L.C, W = (size_t)L.W, I = (size_t)L.I;
    size_t wmax = C * (2 * I > W ? 2 * I : W);
    L.x = randf(N * C, -2, 2), L.xn = randf(N * C, -2, 2), L.y = randf(N * C, -1, 1);
    L.w = randf(wmax, 0.5f, 1.5f), L.lnb = randf(C, -0.1f, 0.1f);
    L.rstd = randf(N * L.NH, 1, 1), L.mean = randf(N, 0, 0);
    L.qkv = randf(N * W, -1, 1), L.wqkv = randf(W * C, -0.05f, 0.05f), L.bqkv = randf(W, -0.1f, 0.1f);
    L.att = randf(N * C, -1, 1), L.lse = randf(N * L.NH, 0, 0), L.wo = randf(C * C, -0.05f, 0.05f);
    L.wgu = randf(2 * I * C, -0.05f, 0.05f), L.gu = randf(N * 2 * I, -4, 4), L.h = randf(N * I, -1, 1);
    L.wd = randf(C * I, -0.05f, 0.05f);
    L.d = randf(N * C, -1, 1), L.dqkv = randf(N * W, -1, 1), L.dqkv2 = randf(N * W, 0, 0), L.dgu = randf(N * 2 * I, -1, 1);
    L.dw = randf(wmax, 0, 0), L.db = randf(C, 0, 0), L.dx = randf(N * C, 0, 0), L.datt = randf(N * C, -1, 1);
    L.dh = randf(N * I, -1, 1);
    L.inv_freq = malloc((size_t)L.hs / 2 * sizeof(float));
    for (int i = 0; i < L.hs / 2; i++) L.inv_freq[i] = 1.0f / powf(10000.0f, (float)(2 * i) / (float)L.hs);
    attn_fwd(&L); /* a real lse for the backward */

    double f4 = 4.0; /* bytes per float */
    double nc = (double)N * C, nq = (double)N * (L.NH + L.NKV) * L.hs, ni = (double)N * I;
    row rows[] = {
        {"rmsnorm_forward (N,C)", rms_fwd, 2, f4 * 2 * nc, 0},
        {"rmsnorm_backward (N,C)", rms_bwd, 2, f4 * 4 * nc, 0},
        {"  layernorm_forward (N,C)", ln_fwd, 0, f4 * 2 * nc, 0},
        {"  layernorm_backward (N,C)", ln_bwd, 0, f4 * 4 * nc, 0},
        {"rmsnorm_forward per-head q (Qwen3)", qnorm_fwd, 0, f4 * 2 * N * C, 0},
        {"rmsnorm_backward per-head q (Qwen3)", qnorm_bwd, 0, f4 * 4 * N * C, 0},
        {"rope_forward q, k", rope_fwd, 1, f4 * 2 * nq, 0},
        {"rope_backward q, k", rope_bwd, 1, f4 * 2 * nq, 0},
        {"swiglu_forward (N,I)", swiglu_fwd, 1, f4 * 3 * ni, 0},
        {"swiglu_backward (N,I)", swiglu_bwd, 1, f4 * 5 * ni, 0},
        {"  gelu_forward (N*I)", gelu_fwd, 0, f4 * 2 * ni, 0},
        {"  gelu_backward (N*I)", gelu_bwd, 0, f4 * 3 * ni, 0},
        {"residual_forward (N,C)", resid, 2, f4 * 3 * nc, 0},
        {"add_inplace (N,C)", add_ip, 2, f4 * 3 * nc, 0},
        {"matmul qkv fwd (bias)", mm_qkv_fwd, 1, 0, 0},
        {"matmul qkv bwd", mm_qkv_bwd, 1, 0, 0},
        {"matmul o fwd", mm_o_fwd, 1, 0, 0},
        {"matmul o bwd", mm_o_bwd, 1, 0, 0},
        {"matmul gate|up fwd", mm_gu_fwd, 1, 0, 0},
        {"matmul gate|up bwd", mm_gu_bwd, 1, 0, 0},
        {"matmul down fwd", mm_down_fwd, 1, 0, 0},
        {"matmul down bwd", mm_down_bwd, 1, 0, 0},
        {"attention_forward (GQA)", attn_fwd, 1, 0, 0},
        {"attention_backward (GQA)", attn_bwd, 1, 0, 0},
    };
    int nrows = (int)(sizeof rows / sizeof rows[0]);
    /* rounds over the whole table, the best of each row kept, so that a stall of the machine
     * during one row's window (a shared or virtual machine) does not decide it */
    for (int round = 0; round < ROUNDS; round++)
        for (int r = 0; r < nrows; r++) {
            double ms = time_ms(rows[r].f, &L);
            rows[r].ms = round == 0 || ms < rows[r].ms ? ms : rows[r].ms;
        }
    double layer_ms = 0.0, llama_ms = 0.0;
    for (int r = 0; r < nrows; r++) {
        layer_ms += rows[r].in_layer * rows[r].ms;
        if (rows[r].f == rms_fwd || rows[r].f == rms_bwd || rows[r].f == rope_fwd || rows[r].f == rope_bwd ||
            rows[r].f == swiglu_fwd || rows[r].f == swiglu_bwd)
            llama_ms += rows[r].in_layer * rows[r].ms;
    }
    int nt = 1;
#ifdef _OPENMP
    nt = omp_get_max_threads();
#endif
    printf("Llama layer on the CPU: B=%d T=%d C=%d NH=%d NKV=%d hs=%d I=%d, %d threads "
           "(indented rows: GPT-2's kernels on the same elements, for comparison)\n\n",
           L.B, L.T, L.C, L.NH, L.NKV, L.hs, L.I, nt);
    printf("| kernel | ms | GB/s | calls per layer step | share of the layer step |\n");
    printf("|---|---:|---:|---:|---:|\n");
    for (int r = 0; r < nrows; r++) {
        printf("| %s | %.3f |", rows[r].name, rows[r].ms);
        if (rows[r].bytes > 0) printf(" %.1f |", rows[r].bytes / (rows[r].ms * 1e6));
        else printf(" - |");
        if (rows[r].in_layer) printf(" %d | %.1f%% |\n", rows[r].in_layer, 100.0 * rows[r].in_layer * rows[r].ms / layer_ms);
        else printf(" - | - |\n");
    }
    printf("\none layer step (forward + backward, the rows with calls): %.2f ms; RMSNorm, RoPE and SwiGLU: "
           "%.2f ms (%.1f%%)\n", layer_ms, llama_ms, 100.0 * llama_ms / layer_ms);
    float *bufs[] = {L.x, L.xn, L.w, L.rstd, L.mean, L.lnb, L.qkv, L.wqkv, L.bqkv, L.att, L.lse, L.wo, L.y,
                     L.wgu, L.gu, L.h, L.wd, L.d, L.dqkv, L.dqkv2, L.dgu, L.dw, L.db, L.dx, L.datt, L.dh,
                     L.inv_freq};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) free(bufs[i]);
    return 0;
}
