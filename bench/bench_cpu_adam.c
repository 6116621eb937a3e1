/* bench/bench_cpu_adam.c: CPU AdamW throughput, the offload path's update: the reference
 * kernel (core/cpu/kernels_cpu.c), the plain scalar loop, and the vectorised, threaded
 * offload/cpu_adam.c, with fp32, bf16 and 8-bit moments (optim.state). Prints a markdown
 * table; bench/torch_adamw.py measures PyTorch's.
 *   bench_cpu_adam [n_params (default 16777216)] */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/common.h"
#include "core/kernels.h"
#include "core/optim.h"
#include "core/quant.h"
#include "offload/cpu_adam.h"

static double time_ms(int reps, void (*fn)(void *), void *arg) {
    fn(arg); /* warm the pages */
    double best = 1e30;
    for (int r = 0; r < reps; r++) {
        double t0 = strata_now_ms();
        fn(arg);
        double t = strata_now_ms() - t0;
        if (t < best) best = t;
    }
    return best;
}

typedef struct run {
    float *w, *g, *m, *v;
    uint16_t *hm, *hv;       /* bf16 moments */
    uint8_t *c1, *c2;        /* 8-bit codes */
    float *a1, *a2;          /* their absmax */
    strata_adamw_segment seg; /* the whole range: one quantized, decayed tensor */
    size_t n;
    strata_adamw_args a;
    strata_cpu_isa isa;
    int threads;
} run;

static void run_reference(void *p) {
    run *r = p;
    strata_kernels_cpu.adamw(NULL, r->w, NULL, r->g, r->m, r->v, r->n, &r->a);
}
static void run_offload(void *p) {
    run *r = p;
    strata_cpu_adamw_ex(r->isa, r->threads, r->w, NULL, STRATA_F32, r->g, r->m, r->v, r->n, &r->a);
}
static void run_reference_bf16(void *p) {
    run *r = p;
    strata_kernels_cpu.adamw_bf16(NULL, r->w, NULL, r->g, r->hm, r->hv, r->n, &r->a);
}
static void run_offload_bf16(void *p) {
    run *r = p;
    strata_cpu_adamw_bf16_ex(r->isa, r->threads, r->w, NULL, STRATA_F32, r->g, r->hm, r->hv, r->n, &r->a);
}
static void run_reference_q8(void *p) {
    run *r = p;
    strata_kernels_cpu.adamw_q8(NULL, r->w, NULL, r->g, r->c1, r->c2, r->a1, r->a2, r->n, &r->seg, 1, &r->a);
}
static void run_offload_q8(void *p) {
    run *r = p;
    strata_cpu_adamw_q8_ex(r->isa, r->threads, r->w, NULL, STRATA_F32, r->g, r->c1, r->c2, r->a1, r->a2, r->n, &r->seg,
                           1, &r->a);
}

int main(int argc, char **argv) {
    size_t n = argc > 1 ? strtoull(argv[1], NULL, 10) : (size_t)1 << 24;
    run r = {.n = n, .a = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                           .bc1 = 0.1f, .bc2 = 0.05f, .grad_scale = 1.0f}};
    float **bufs[4] = {&r.w, &r.g, &r.m, &r.v};
    for (int b = 0; b < 4; b++) {
        *bufs[b] = strata_xmalloc(n * sizeof(float));
        for (size_t i = 0; i < n; i++) (*bufs[b])[i] = 0.01f * strata_rand_normal(7, b, i);
    }
    for (size_t i = 0; i < n; i++) r.v[i] = r.v[i] * r.v[i];
    /* the same moments as bf16 and as 8-bit codes */
    size_t nb = strata_q8_blocks(n);
    r.hm = strata_xmalloc(n * 2), r.hv = strata_xmalloc(n * 2), r.c1 = strata_xmalloc(n), r.c2 = strata_xmalloc(n);
    r.a1 = strata_xmalloc(nb * 4), r.a2 = strata_xmalloc(nb * 4);
    for (size_t i = 0; i < n; i++) r.hm[i] = strata_f32_to_bf16(r.m[i]), r.hv[i] = strata_f32_to_bf16(r.v[i]);
    for (size_t b = 0; b < nb; b++) {
        size_t b0 = b * STRATA_Q8_BLOCK, len = n - b0 < STRATA_Q8_BLOCK ? n - b0 : STRATA_Q8_BLOCK;
        r.a1[b] = strata_q8_absmax(r.m + b0, len);
        r.a2[b] = strata_q8_absmax(r.v + b0, len);
        strata_q8_quantize(strata_q8_signed(), r.m + b0, len, r.a1[b], r.c1 + b0);
        strata_q8_quantize(strata_q8_unsigned(), r.v + b0, len, r.a2[b], r.c2 + b0);
    }
    r.seg = (strata_adamw_segment){0, n, 1, 1, 0};
    int max_threads = omp_get_max_threads();
    /* bytes per element: read w, g, m, v; write w, m, v (m and v 4, 2 or 1 bytes; absmax aside) */
    static const struct {
        const char *state;
        double bytes;
        void (*reference)(void *), (*offload)(void *);
    } states[] = {{"fp32", 28.0, run_reference, run_offload},
                  {"bf16", 20.0, run_reference_bf16, run_offload_bf16},
                  {"int8", 16.0, run_reference_q8, run_offload_q8}};
    printf("| AdamW over %zu parameters | moments | threads | ms | Gparam/s | GB/s |\n|---|---|---|---|---|---|\n", n);
    for (int st = 0; st < 3; st++) {
        double bytes = states[st].bytes * (double)n;
        double ms = time_ms(3, states[st].reference, &r);
        printf("| reference kernel (core/cpu/kernels_cpu.c) | %s | %d | %.1f | %.2f | %.1f |\n", states[st].state,
               max_threads, ms, n / ms / 1e6, bytes / ms / 1e6);
        struct { strata_cpu_isa isa; int threads; const char *name; } rows[] = {
            {STRATA_ISA_SCALAR, 1, "plain scalar loop"},
            {STRATA_ISA_AUTO, 1, "offload/cpu_adam.c, widest ISA"},
            {STRATA_ISA_AUTO, max_threads, "offload/cpu_adam.c, widest ISA"},
        };
        for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
            if (i == 2 && max_threads == 1) break;
            r.isa = rows[i].isa;
            r.threads = rows[i].threads;
            ms = time_ms(3, states[st].offload, &r);
            printf("| %s (%s) | %s | %d | %.1f | %.2f | %.1f |\n", rows[i].name,
                   strata_cpu_isa_name(rows[i].isa == STRATA_ISA_AUTO ? strata_cpu_isa_auto() : rows[i].isa),
                   states[st].state, rows[i].threads, ms, n / ms / 1e6, bytes / ms / 1e6);
        }
    }
    for (int b = 0; b < 4; b++) free(*bufs[b]);
    free(r.hm), free(r.hv), free(r.c1), free(r.c2), free(r.a1), free(r.a2);
    return 0;
}
