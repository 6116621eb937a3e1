/* bench/bench_attention.c: causal attention on the GPU, the CUDA-core kernels against the
 * tensor-core ones (STRATA_ATTENTION=tc), forward and backward, at GPT-2 shapes (head
 * size 64, NKV = NH) and grouped-query ones of the Llama family (NKV < NH: Llama 3 8B's
 * 32 query heads over 8 key/value heads of 128, Qwen2.5-0.5B's 14 over 2 of 64). Prints a
 * Markdown table of milliseconds and TFLOP/s per call, counting 4 B NH T^2 hs / 2 FLOPs
 * for the causal forward (two products over half the square, per query head) and 2.5
 * times that for the backward, and how far the tensor-core results are from the
 * CUDA-core ones (largest absolute difference over out and dqkv).
 *
 *   bench_attention [iterations]    (default 20 timed calls after 3 warm-up calls)
 *
 * Exits 77 when built without CUDA or when no GPU answers. */
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/device.h"
#include "core/kernels.h"

#ifdef STRATA_HAVE_CUDA

typedef struct shape {
    const char *name;
    int B, T, NH, NKV, hs;
} shape;

static strata_device *G;

static void die(const char *what) {
    fprintf(stderr, "bench_attention: %s: %s\n", what, strata_error());
    exit(1);
}

static void *dalloc(size_t bytes) {
    void *p = strata_alloc(G, STRATA_MEM_DEVICE, bytes);
    if (!p) die("device alloc");
    return p;
}

static void gsync(void) {
    if (strata_stream_sync(G, G->compute)) die("compute stream sync");
}

/* n bf16 values ~ N(0, scale^2) (a sum of four uniforms), uploaded */
static void *up_random_bf16(size_t n, float scale, uint64_t seed) {
    uint16_t *h = strata_xmalloc(n * 2);
    uint64_t s = seed;
    for (size_t i = 0; i < n; i++) {
        float v = 0.0f;
        for (int k = 0; k < 4; k++) {
            s ^= s << 13, s ^= s >> 7, s ^= s << 17;
            v += (float)((s >> 40) * (1.0 / 16777216.0)) * 2.0f - 1.0f;
        }
        v *= 0.866f * scale;
        uint32_t u;
        memcpy(&u, &v, 4);
        h[i] = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    }
    void *d = dalloc(n * 2);
    if (strata_memcpy_async(G, G->compute, d, h, n * 2)) die("upload");
    gsync();
    free(h);
    return d;
}

static float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

/* largest |a - b| over two device bf16 tensors of n elements */
static double max_abs_diff(const void *a, const void *b, size_t n) {
    uint16_t *x = strata_xmalloc(n * 2), *y = strata_xmalloc(n * 2);
    if (strata_memcpy_async(G, G->compute, x, a, n * 2) || strata_memcpy_async(G, G->compute, y, b, n * 2))
        die("copy to the host");
    gsync();
    double worst = 0.0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)bf16_to_f32(x[i]) - (double)bf16_to_f32(y[i]));
        if (!(d <= worst)) worst = d; /* NaN sticks */
    }
    free(x), free(y);
    return worst;
}

int main(int argc, char **argv) {
    int iters = argc > 1 ? atoi(argv[1]) : 20;
    if (iters < 1) iters = 1;
    if (!strata_cuda_available()) {
        printf("skip: no CUDA GPU answers on this machine\n");
        return 77;
    }
    G = strata_device_open("cuda", 0);
    if (!G) die("open cuda:0");
    const strata_kernels *k = G->k;
    static const shape shapes[] = {
        {"GPT-2 124M", 16, 1024, 12, 12, 64},
        {"GPT-2 1.5B", 8, 1024, 25, 25, 64},
        {"Llama 3 8B (GQA)", 2, 2048, 32, 8, 128},
        {"Qwen2.5-0.5B (GQA)", 8, 1024, 14, 2, 64},
    };
    enum { N_SHAPES = sizeof shapes / sizeof shapes[0] };
    static const char *impl_name[2] = {"cuda cores", "tensor cores"};

    printf("%s, %d timed calls each\n\n", G->description, iters);
    printf("| shape | B | T | NH | NKV | hs | kernels | fwd ms | fwd TFLOP/s | bwd ms | bwd TFLOP/s |\n");
    printf("|---|---|---|---|---|---|---|---|---|---|---|\n");
    double diffs[N_SHAPES][2];
    for (size_t si = 0; si < N_SHAPES; si++) {
        const shape *sh = &shapes[si];
        int B = sh->B, T = sh->T, NH = sh->NH, NKV = sh->NKV, hs = sh->hs;
        size_t n3 = (size_t)B * T * (NH + 2 * NKV) * hs, n1 = (size_t)B * T * NH * hs, nl = (size_t)B * NH * T;
        void *qkv = up_random_bf16(n3, 1.0f, 0x1234567ull + si), *dout = up_random_bf16(n1, 1.0f, 0x89abcdefull + si);
        void *out[2], *dqkv[2];
        float *lse[2];
        double fwd_flop = 4.0 * B * NH * (double)T * T * hs / 2.0, bwd_flop = 2.5 * fwd_flop;
        for (int impl = 0; impl < 2; impl++) {
            strata_cuda_attention_select(impl);
            out[impl] = dalloc(n1 * 2), dqkv[impl] = dalloc(n3 * 2), lse[impl] = dalloc(nl * 4);
            for (int w = 0; w < 3; w++) {
                k->attention_forward(G->compute, out[impl], lse[impl], qkv, NULL, B, T, NH, NKV, hs);
                k->attention_backward(G->compute, dqkv[impl], dout, qkv, out[impl], lse[impl], NULL, B, T, NH, NKV, hs);
            }
            gsync();
            double t0 = strata_now_ms();
            for (int i = 0; i < iters; i++)
                k->attention_forward(G->compute, out[impl], lse[impl], qkv, NULL, B, T, NH, NKV, hs);
            gsync();
            double t1 = strata_now_ms();
            for (int i = 0; i < iters; i++)
                k->attention_backward(G->compute, dqkv[impl], dout, qkv, out[impl], lse[impl], NULL, B, T, NH, NKV, hs);
            gsync();
            double t2 = strata_now_ms();
            double fms = (t1 - t0) / iters, bms = (t2 - t1) / iters;
            printf("| %s | %d | %d | %d | %d | %d | %s | %.3f | %.1f | %.3f | %.1f |\n", sh->name, B, T, NH, NKV, hs,
                   impl_name[impl], fms, fwd_flop / (fms * 1e9), bms, bwd_flop / (bms * 1e9));
            fflush(stdout);
        }
        diffs[si][0] = max_abs_diff(out[1], out[0], n1);
        diffs[si][1] = max_abs_diff(dqkv[1], dqkv[0], n3);
        for (int impl = 0; impl < 2; impl++) {
            strata_free(G, STRATA_MEM_DEVICE, out[impl]);
            strata_free(G, STRATA_MEM_DEVICE, dqkv[impl]);
            strata_free(G, STRATA_MEM_DEVICE, lse[impl]);
        }
        strata_free(G, STRATA_MEM_DEVICE, qkv);
        strata_free(G, STRATA_MEM_DEVICE, dout);
    }
    printf("\n| shape | max abs diff out (tc vs cuda cores) | max abs diff dqkv |\n|---|---|---|\n");
    for (size_t si = 0; si < N_SHAPES; si++)
        printf("| %s | %.3g | %.3g |\n", shapes[si].name, diffs[si][0], diffs[si][1]);
    strata_cuda_attention_select(-1);
    strata_device_close(G);
    return 0;
}

#else /* !STRATA_HAVE_CUDA */

int main(void) {
    printf("skip: this strata was built without CUDA\n");
    return 77;
}

#endif
