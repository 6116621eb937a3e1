/* bench/bench_gemm.c: the CPU backend's matrix products on a GPT-2 model's shapes, the
 * hand-written kernel against the BLAS, per product and direction. This is the table
 * behind the automatic choice in core/cpu/kernels_cpu.c (STRATA_CPU_GEMM=auto): run it on
 * another CPU to see whether that choice holds there.
 *   build/bench/bench_gemm [B*T C Vp]...     (default: the four shapes of bench/bench_cpu.sh)
 *   build/bench/bench_gemm llama B*T C QKV I Vp   (a Llama-family layer: (out, in) weights)
 * Prints a markdown table of GFLOP/s (best of several runs) for the hand-written kernel
 * (strata), the BLAS (blas) and the automatic choice (auto), per direction. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/common.h"
#include "core/kernels.h"

static const strata_kernels *K = &strata_kernels_cpu;

static float *randf(size_t n)
{
    float *x = malloc(n * sizeof(float));
    uint64_t s = 0x9e3779b97f4a7c15ull ^ n;
    for (size_t i = 0; i < n; i++) {
        s = s * 6364136223846793005ull + 1442695040888963407ull;
        x[i] = (float)((double)(s >> 40) / (double)(1ull << 24) - 0.5);
    }
    return x;
}

enum { FWD, DINP, DW };

/* one direction of one product, best of repeated runs over about 0.2 s, in ms */
static double time_ms(int dir, int M, int Kd, int N, int w_nk, float *inp, float *w, float *bias,
                      float *out, float *dinp, float *dw)
{
    double best = 1e30, spent = 0;
    for (int rep = 0; rep < 40 && (rep < 3 || spent < 200.0); rep++) {
        double t0 = strata_now_ms();
        if (dir == FWD) K->matmul_forward(NULL, out, NULL, inp, w, bias, M, Kd, N, w_nk);
        else K->matmul_backward(NULL, dir == DINP ? dinp : NULL, dw, NULL, out, inp, w, M, Kd, N, w_nk);
        double dt = strata_now_ms() - t0;
        spent += dt;
        best = dt < best ? dt : best;
    }
    return best;
}

/* the dinp product alone: the backward with it, less the backward without it */
static double product_ms(int dir, int M, int Kd, int N, int w_nk, float *inp, float *w, float *bias,
                         float *out, float *dinp, float *dw)
{
    double t = time_ms(dir, M, Kd, N, w_nk, inp, w, bias, out, dinp, dw);
    if (dir == DINP) t -= time_ms(DW, M, Kd, N, w_nk, inp, w, bias, out, dinp, dw);
    return t > 1e-6 ? t : 1e-6;
}

typedef struct product {
    const char *name;
    int K, N, w_nk;
} product;

static void run_products(int BT, const product *prods, size_t n_prods);

/* GPT-2's layer: Conv1D (in, out) weights, the tied head (N, K) */
static void shape(int BT, int C, int Vp)
{
    const product prods[] = {
        {"qkv", C, 3 * C, 0}, {"attn proj", C, C, 0}, {"fc", C, 4 * C, 0}, {"mlp proj", 4 * C, C, 0},
        {"head", C, Vp, 1},
    };
    run_products(BT, prods, sizeof prods / sizeof prods[0]);
}

/* a Llama-family layer: every weight (out, in); q|k|v and gate|up fused */
static void shape_llama(int BT, int C, int QKV, int I, int Vp)
{
    const product prods[] = {
        {"q|k|v", C, QKV, STRATA_W_NK}, {"o_proj", C, C, STRATA_W_NK}, {"gate|up", C, 2 * I, STRATA_W_NK},
        {"down", I, C, STRATA_W_NK}, {"lm_head", C, Vp, STRATA_W_NK},
    };
    run_products(BT, prods, sizeof prods / sizeof prods[0]);
}

static void run_products(int BT, const product *prods, size_t n_prods)
{
    for (size_t p = 0; p < n_prods; p++) {
        int M = BT, Kd = prods[p].K, N = prods[p].N, w_nk = prods[p].w_nk;
        float *inp = randf((size_t)M * Kd), *w = randf((size_t)Kd * N), *bias = randf((size_t)N);
        float *out = randf((size_t)M * N), *dinp = randf((size_t)M * Kd), *dw = randf((size_t)Kd * N);
        double gf = 2.0 * M * Kd * (double)N / 1e6;
        printf("| %s | %d x %d x %d |", prods[p].name, M, Kd, N);
        for (int dir = FWD; dir <= DW; dir++) {
            double ms[3];
            for (int impl = 0; impl < 3; impl++) {
                if (impl == 2 && !strata_cpu_gemm_has_blas()) {
                    ms[impl] = 0;
                    continue;
                }
                strata_cpu_gemm_select(impl);
                ms[impl] = product_ms(dir, M, Kd, N, w_nk, inp, w, bias, out, dinp, dw);
            }
            if (ms[2] == 0) printf(" %.0f | - | %.0f |", gf / ms[1], gf / ms[0]);
            else printf(" %.0f | %.0f | %.0f |", gf / ms[1], gf / ms[2], gf / ms[0]);
        }
        printf("\n");
        free(inp), free(w), free(bias), free(out), free(dinp), free(dw);
    }
    strata_cpu_gemm_select(-1);
}

int main(int argc, char **argv)
{
    int nt = 1;
#ifdef _OPENMP
    nt = omp_get_max_threads();
#endif
    printf("CPU matrix products, GFLOP/s, %d threads (forward with bias; dinp = dout @ W^T; "
           "dW += inp^T @ dout)\n\n", nt);
    printf("| product | M x K x N | fwd strata | fwd blas | fwd auto | dinp strata | dinp blas | dinp auto "
           "| dW strata | dW blas | dW auto |\n|---|---|---|---|---|---|---|---|---|---|---|\n");
    if (argc == 7 && !strcmp(argv[1], "llama")) {
        shape_llama(atoi(argv[2]), atoi(argv[3]), atoi(argv[4]), atoi(argv[5]), atoi(argv[6]));
        return 0;
    }
    if (argc > 1) {
        if ((argc - 1) % 3) {
            fprintf(stderr, "usage: %s [B*T C Vp]... | llama B*T C QKV I Vp\n", argv[0]);
            return 2;
        }
        for (int i = 1; i + 2 < argc; i += 3) shape(atoi(argv[i]), atoi(argv[i + 1]), atoi(argv[i + 2]));
        return 0;
    }
    shape(12 * 64, 128, 256);
    shape(16 * 64, 256, 256);
    shape(8 * 256, 384, 256);
    shape(4 * 64, 768, 50304);
    return 0;
}
