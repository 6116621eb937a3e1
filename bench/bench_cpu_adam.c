/* bench/bench_cpu_adam.c: CPU AdamW throughput, the offload path's update: the reference
 * kernel (core/cpu/kernels_cpu.c), the plain scalar loop, and the vectorised, threaded
 * offload/cpu_adam.c. Prints a markdown table; bench/torch_adamw.py measures PyTorch's.
 *   bench_cpu_adam [n_params (default 16777216)] */
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>

#include "core/common.h"
#include "core/kernels.h"
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
    int max_threads = omp_get_max_threads();
    /* bytes per element: read w, g, m, v; write w, m, v */
    double bytes = 28.0 * (double)n;
    printf("| AdamW over %zu fp32 parameters | threads | ms | Gparam/s | GB/s |\n|---|---|---|---|---|\n", n);
    double ms = time_ms(3, run_reference, &r);
    printf("| reference kernel (core/cpu/kernels_cpu.c) | %d | %.1f | %.2f | %.1f |\n", max_threads, ms, n / ms / 1e6, bytes / ms / 1e6);
    struct { strata_cpu_isa isa; int threads; const char *name; } rows[] = {
        {STRATA_ISA_SCALAR, 1, "plain scalar loop"},
        {STRATA_ISA_AUTO, 1, "offload/cpu_adam.c, widest ISA"},
        {STRATA_ISA_AUTO, max_threads, "offload/cpu_adam.c, widest ISA"},
    };
    for (size_t i = 0; i < sizeof rows / sizeof rows[0]; i++) {
        if (i == 2 && max_threads == 1) break;
        r.isa = rows[i].isa;
        r.threads = rows[i].threads;
        ms = time_ms(3, run_offload, &r);
        printf("| %s (%s) | %d | %.1f | %.2f | %.1f |\n", rows[i].name,
               strata_cpu_isa_name(rows[i].isa == STRATA_ISA_AUTO ? strata_cpu_isa_auto() : rows[i].isa), rows[i].threads,
               ms, n / ms / 1e6, bytes / ms / 1e6);
    }
    for (int b = 0; b < 4; b++) free(*bufs[b]);
    return 0;
}
