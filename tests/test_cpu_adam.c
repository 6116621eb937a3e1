/* tests/test_cpu_adam.c: the offloaded CPU AdamW is bitwise equal to the reference
 * kernel (strata_kernels_cpu.adamw, then its convert for bf16) on every ISA path, for
 * odd sizes, unaligned pointers, 1-3 threads and several steps with gradient scaling,
 * weight decay and inf/NaN gradients; bf16 rounding is checked against hand-worked bit
 * patterns. The same for bf16 moments (adamw_bf16) and 8-bit moments (adamw_q8: master,
 * codes and absmax, on ranges of quantized and fp32 segments), and the 8-bit path's code
 * table against core/quant.h's binary search around every midpoint and table key. Ends
 * with an informational throughput table. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif

#include "core/common.h"
#include "core/device.h"
#include "core/kernels.h"
#include "core/optim.h"
#include "core/quant.h"
#include "offload/cpu_adam.h"
#include "tests/check.h"


#if defined(__SANITIZE_ADDRESS__)
#define BENCH_N (1u << 20)
#else
#define BENCH_N (1u << 22)
#endif

static float f_from_bits(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* One optimizer state, padded so each array can start at an odd element offset. */
typedef struct state {
    float *master, *grad, *m, *v;
    void *out;
    size_t n;
} state;

#define PAD 8

static void state_alloc(state *s, size_t n) {
    s->n = n;
    s->master = strata_xcalloc(n + PAD, sizeof(float));
    s->grad = strata_xcalloc(n + PAD, sizeof(float));
    s->m = strata_xcalloc(n + PAD, sizeof(float));
    s->v = strata_xcalloc(n + PAD, sizeof(float));
    s->out = strata_xcalloc(n + PAD, sizeof(float));
}
static void state_free(state *s) {
    free(s->master);
    free(s->grad);
    free(s->m);
    free(s->v);
    free(s->out);
}

/* Random state at element offset `off` of each buffer; a few gradients are huge, inf
 * or NaN so those lanes (and bf16's NaN rule) are exercised too. */
static void state_fill(state *s, int off, uint64_t seed) {
    strata_rng r;
    strata_rng_seed(&r, seed);
    for (size_t i = 0; i < s->n; i++) {
        s->master[off + i] = (strata_rng_uniform(&r) - 0.5f) * 0.2f;
        s->grad[off + i] = (strata_rng_uniform(&r) - 0.5f) * 4.0f;
        s->m[off + i] = (strata_rng_uniform(&r) - 0.5f) * 0.01f;
        s->v[off + i] = strata_rng_uniform(&r) * 1e-4f;
    }
    if (s->n > 40) {
        s->grad[off + 3] = 1e30f; /* g*g overflows to inf */
        s->grad[off + 20] = INFINITY;
        s->grad[off + 37] = NAN;
        s->master[off + 38] = f_from_bits(0x3f808000u); /* a bf16 tie before the update */
    }
}

/* A fresh gradient for the next step, with the same special lanes. */
static void grads_refresh(float *g, size_t n, uint64_t seed) {
    strata_rng r;
    strata_rng_seed(&r, seed);
    for (size_t i = 0; i < n; i++) g[i] = (strata_rng_uniform(&r) - 0.5f) * 4.0f;
    if (n > 40) {
        g[3] = 1e30f;
        g[20] = INFINITY;
        g[37] = NAN;
    }
}

static strata_adamw_args step_args(int t) {
    strata_adamw_args a = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f,
                           .weight_decay = 0.1f, .grad_scale = 0.5f};
    a.bc1 = 1.0f - powf(a.beta1, (float)t);
    a.bc2 = 1.0f - powf(a.beta2, (float)t);
    return a;
}

typedef struct config {
    int threads;
    int misaligned;
    int out; /* 0 none, 1 f32, 2 bf16 */
} config;

static const char *out_name(int out) { return out == 0 ? "none" : out == 1 ? "f32" : "bf16"; }

/* Runs 3 steps with the reference and with the ISA path, comparing every byte. */
static void compare_path(strata_cpu_isa isa, size_t n, config c) {
    state ref, got;
    state_alloc(&ref, n);
    state_alloc(&got, n);
    int ro = 0; /* the reference is aligned */
    int go = c.misaligned ? 1 : 0;
    state_fill(&ref, ro, 42 + n);
    state_fill(&got, go, 42 + n);
    /* distinct odd offsets per array in the misaligned case */
    float *gm = got.master + go, *gg = got.grad + (c.misaligned ? 3 : 0);
    float *gmm = got.m + (c.misaligned ? 2 : 0), *gv = got.v + (c.misaligned ? 5 : 0);
    if (c.misaligned) {
        memmove(gg, got.grad + go, n * sizeof(float));
        memmove(gmm, got.m + go, n * sizeof(float));
        memmove(gv, got.v + go, n * sizeof(float));
    }
    int ok = 1, rc = 0;
    strata_dtype odt = c.out == 2 ? STRATA_BF16 : STRATA_F32;
    void *gout = c.out == 0 ? NULL
                            : (c.out == 2 ? (void *)((uint16_t *)got.out + go)
                                          : (void *)((float *)got.out + go));
    uint16_t *ref_bf16 = strata_xcalloc(n + 1, sizeof(uint16_t));
    for (int t = 1; t <= 3; t++) {
        strata_adamw_args a = step_args(t);
        if (t > 1) {
            grads_refresh(ref.grad + ro, n, 1000 * t + n);
            grads_refresh(gg, n, 1000 * t + n);
        }
        strata_kernels_cpu.adamw(NULL, ref.master, c.out ? ref.out : NULL, ref.grad, ref.m, ref.v,
                                 n, &a);
        rc |= strata_cpu_adamw_ex(isa, c.threads, gm, gout, odt, gg, gmm, gv, n, &a);
        ok &= !memcmp(ref.master, gm, n * sizeof(float));
        ok &= !memcmp(ref.m, gmm, n * sizeof(float));
        ok &= !memcmp(ref.v, gv, n * sizeof(float));
        if (c.out == 1) ok &= !memcmp(ref.out, gout, n * sizeof(float));
        if (c.out == 2) {
            strata_kernels_cpu.convert(NULL, ref_bf16, STRATA_BF16, ref.master, STRATA_F32, n);
            ok &= !memcmp(ref_bf16, gout, n * sizeof(uint16_t));
        }
    }
    CHECK(rc == 0 && ok, "%-6s n=%-7zu threads=%d %-10s out=%-4s: 3 steps bitwise equal to the reference",
          strata_cpu_isa_name(isa), n, c.threads, c.misaligned ? "unaligned" : "aligned",
          out_name(c.out));
    free(ref_bf16);
    state_free(&ref);
    state_free(&got);
}

/* With lr 0 and zero state the master passes through unchanged, so the bf16 copy is
 * exactly the rounding of chosen bit patterns; the expected halves are worked by hand. */
static void test_bf16_rounding(strata_cpu_isa isa) {
    static const uint32_t in[] = {0x3f808000u, 0x3f818000u, 0x3f80ffffu, 0x3f807fffu,
                                  0x7f7fffffu, 0x7f7f8000u, 0xff7e8000u, 0x7f800001u,
                                  0xff812345u, 0x00000000u, 0x80000000u, 0x00008000u,
                                  0x00018000u, 0xbf808001u, 0x407fffffu, 0x3fc00000u};
    static const uint16_t want[] = {0x3f80, 0x3f82, 0x3f81, 0x3f80, 0x7f80, 0x7f80,
                                    0xff7e, 0x7fc0, 0xffc1, 0x0000, 0x8000, 0x0000,
                                    0x0002, 0xbf81, 0x4080, 0x3fc0};
    enum { K = 16, N = 3 * K + 5 }; /* vector bodies plus a scalar tail */
    float master[N], grad[N] = {0}, m[N] = {0}, v[N] = {0};
    uint16_t out[N];
    for (int i = 0; i < N; i++) master[i] = f_from_bits(in[i % K]);
    strata_adamw_args a = step_args(1);
    a.lr = 0.0f;
    a.weight_decay = 0.0f;
    int rc = strata_cpu_adamw_ex(isa, 1, master, out, STRATA_BF16, grad, m, v, N, &a);
    int ok = rc == 0;
    for (int i = 0; i < N; i++) {
        if (out[i] != want[i % K]) {
            if (ok) printf("     element %d: 0x%08x -> 0x%04x, want 0x%04x\n", i, in[i % K], out[i], want[i % K]);
            ok = 0;
        }
    }
    CHECK(ok, "%-6s bf16 output rounds to nearest-even, overflows to inf, quiets NaN (16 patterns)",
          strata_cpu_isa_name(isa));
}

/* bf16 and 8-bit moments: 3 steps of the ISA path against the reference kernels. The 8-bit
 * range is cut into segments as a unit is: quantized pieces with and without decay, fp32
 * pieces (left to the fp32 kernel, so untouched here) and a trailing stretch in none. */
static void compare_moments(strata_cpu_isa isa, size_t n, int threads, int out, int q8) {
    float *rw = strata_xcalloc(n + 1, 4), *gw = strata_xcalloc(n + 1, 4), *g = strata_xcalloc(n + 1, 4);
    float *rout = strata_xcalloc(n + 1, 4), *gout = strata_xcalloc(n + 1, 4);
    uint16_t *rm = strata_xcalloc(n + 1, 2), *rv = strata_xcalloc(n + 1, 2), *gm = strata_xcalloc(n + 1, 2),
             *gv = strata_xcalloc(n + 1, 2), *rb = strata_xcalloc(n + 1, 2);
    uint8_t *rc1 = strata_xcalloc(n + 1, 1), *rc2 = strata_xcalloc(n + 1, 1), *gc1 = strata_xcalloc(n + 1, 1),
            *gc2 = strata_xcalloc(n + 1, 1);
    size_t nb = strata_q8_blocks(n) + 1;
    float *ra1 = strata_xcalloc(nb, 4), *ra2 = strata_xcalloc(nb, 4), *ga1 = strata_xcalloc(nb, 4),
          *ga2 = strata_xcalloc(nb, 4);
    memset(rc1, STRATA_Q8_ZERO_SIGNED, n + 1);
    memset(gc1, STRATA_Q8_ZERO_SIGNED, n + 1);
    strata_adamw_segment seg[8];
    int n_seg = 0;
    size_t cut[] = {0, n / 7, n / 3, n / 3 + 300, n / 2, (n * 4) / 5, n - n / 10};
    for (int i = 0; i < 6; i++)
        if (cut[i + 1] > cut[i])
            seg[n_seg++] = (strata_adamw_segment){cut[i], cut[i + 1] - cut[i], i % 2, i != 2, 0};
    for (size_t i = 0; i < n; i++) rw[i] = gw[i] = strata_rand_normal(8, 0, i) * 0.05f;
    strata_dtype odt = out == 2 ? STRATA_BF16 : STRATA_F32;
    int ok = 1, rc = 0;
    for (int t = 1; t <= 3; t++) {
        for (size_t i = 0; i < n; i++) g[i] = strata_rand_normal(9, (uint64_t)t, i) * (i % 1009 == 0 ? 1e3f : 1.0f);
        if (n > 40) g[n / 2 + 3] = 0.0f;
        strata_adamw_args a = step_args(t);
        void *o = out ? gout : NULL;
        if (q8) {
            strata_kernels_cpu.adamw_q8(NULL, rw, out ? rout : NULL, g, rc1, rc2, ra1, ra2, n, seg, n_seg, &a);
            rc |= strata_cpu_adamw_q8_ex(isa, threads, gw, o, odt, g, gc1, gc2, ga1, ga2, n, seg, n_seg, &a);
            ok &= !memcmp(rc1, gc1, n) && !memcmp(rc2, gc2, n) && !memcmp(ra1, ga1, strata_q8_blocks(n) * 4) &&
                  !memcmp(ra2, ga2, strata_q8_blocks(n) * 4);
        } else {
            strata_kernels_cpu.adamw_bf16(NULL, rw, out ? rout : NULL, g, rm, rv, n, &a);
            rc |= strata_cpu_adamw_bf16_ex(isa, threads, gw, o, odt, g, gm, gv, n, &a);
            ok &= !memcmp(rm, gm, n * 2) && !memcmp(rv, gv, n * 2);
        }
        ok &= !memcmp(rw, gw, n * 4);
        if (out == 1) ok &= !memcmp(rout, gout, n * 4);
        if (out == 2) {
            strata_kernels_cpu.convert(NULL, rb, STRATA_BF16, rout, STRATA_F32, n);
            /* only the elements the update wrote (q8 leaves fp32 pieces and the tail alone) */
            for (int i = 0; i < (q8 ? n_seg : 1); i++) {
                size_t lo = q8 ? seg[i].lo : 0, len = q8 ? seg[i].n : n;
                if (!q8 || seg[i].quant) ok &= !memcmp(rb + lo, (uint16_t *)gout + lo, len * 2);
            }
        }
    }
    CHECK(rc == 0 && ok, "%-6s n=%-7zu threads=%d out=%-4s %s moments: 3 steps bitwise equal to the reference",
          strata_cpu_isa_name(isa), n, threads, out_name(out), q8 ? "8-bit" : "bf16");
    free(rw), free(gw), free(g), free(rout), free(gout), free(rm), free(rv), free(gm), free(gv), free(rb);
    free(rc1), free(rc2), free(gc1), free(gc2), free(ra1), free(ra2), free(ga1), free(ga2);
}

/* The 8-bit path's table against the binary search: around every midpoint and every key
 * boundary of the table (2^-24 .. 1, both signs), at the ends, and on random values. */
static void test_q8_table(void) {
    size_t tried = 0, wrong = 0;
    for (int s = 0; s < 2; s++) {
        const strata_q8_map *q = s ? strata_q8_signed() : strata_q8_unsigned();
        for (int k = 0; k < 255; k++)
            for (int d = -16; d <= 16; d++) {
                uint32_t u;
                memcpy(&u, &q->mid[k], 4);
                float x = f_from_bits(u + (uint32_t)d);
                wrong += strata_cpu_q8_code(s, x) != strata_q8_code(q, x);
                tried++;
            }
        for (uint32_t key = 0x6600; key <= 0x8000; key++) /* the table's keys: sign and top 16 magnitude bits */
            for (int sign = 0; sign < 2; sign++)
                for (int d = -2; d <= 2; d++) {
                    float x = f_from_bits(((key << 15) + (uint32_t)d) | (sign ? 0x80000000u : 0));
                    wrong += strata_cpu_q8_code(s, x) != strata_q8_code(q, x);
                    tried++;
                }
        strata_rng r;
        strata_rng_seed(&r, 3 + (uint64_t)s);
        for (int i = 0; i < 2000000; i++) {
            float x = (strata_rng_uniform(&r) * 2.0f - 1.0f) * powf(2.0f, -26.0f * strata_rng_uniform(&r));
            wrong += strata_cpu_q8_code(s, x) != strata_q8_code(q, x);
            tried++;
        }
        float special[] = {0.0f, -0.0f, 1.0f, -1.0f, f_from_bits(1), f_from_bits(0x80000001u), NAN, INFINITY, -INFINITY};
        for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) {
            wrong += strata_cpu_q8_code(s, special[i]) != strata_q8_code(q, special[i]);
            tried++;
        }
    }
    CHECK(wrong == 0, "8-bit code table = core/quant.h's binary search on %zu values (%zu differ)", tried, wrong);
}

/* Every ISA's block quantizer (SIMD lanes and scalar tail) against core/quant.h's codes of
 * x / absmax, on the values above: every midpoint and 16 floats each side, every key
 * boundary, the extremes, NaN and infinities, tiny positives (never code 0), with absmax 1
 * and 3 (so the division rounds), at lengths that leave tails of every size. */
static void test_q8_quantize_isas(void) {
    enum { MAX = 80000 };
    float *x = strata_xcalloc(MAX, 4);
    uint8_t *got = strata_xcalloc(MAX, 1);
    strata_cpu_isa isas[] = {STRATA_ISA_SCALAR, STRATA_ISA_AVX2, STRATA_ISA_AVX512};
    for (int s = 0; s < 2; s++) {
        const strata_q8_map *q = s ? strata_q8_signed() : strata_q8_unsigned();
        size_t n = 0;
        for (int k = 0; k < 255; k++)
            for (int d = -16; d <= 16; d++) {
                uint32_t u;
                memcpy(&u, &q->mid[k], 4);
                x[n++] = f_from_bits(u + (uint32_t)d);
            }
        for (uint32_t key = 0x6600; key <= 0x8000; key += 5)
            for (int sign = 0; sign < 2; sign++) x[n++] = f_from_bits((key << 15) | (sign ? 0x80000000u : 0));
        float special[] = {0.0f, -0.0f, 1.0f, -1.0f, f_from_bits(1), f_from_bits(0x80000001u), NAN, INFINITY, -INFINITY,
                           1e-30f, -1e-30f, FLT_MIN, 3.0f, -3.0f};
        for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) x[n++] = special[i];
        for (int k = 0; k < 3; k++) {
            if (!strata_cpu_isa_supported(isas[k])) continue;
            for (int amx = 0; amx < 2; amx++) {
                float absmax = amx ? 3.0f : 1.0f;
                size_t wrong = 0, tried = 0;
                for (size_t len = n - 17; len <= n; len++) { /* every tail length */
                    memset(got, 0xAA, len);
                    MUST(strata_cpu_q8_quantize_ex(isas[k], s, x, len, absmax, got));
                    for (size_t i = 0; i < len; i++, tried++) wrong += got[i] != strata_q8_code(q, x[i] / absmax);
                }
                CHECK(wrong == 0, "%-6s %s codes of x / %g = core/quant.h's on %zu values (%zu differ)",
                      strata_cpu_isa_name(isas[k]), s ? "signed" : "unsigned", absmax, tried, wrong);
            }
        }
    }
    free(x);
    free(got);
}

static double bench_one(strata_cpu_isa isa, int threads, int reference, state *s) {
    strata_adamw_args a = step_args(5);
    double best = 1e30;
    for (int rep = 0; rep < 4; rep++) {
        double t0 = strata_now_ms();
        if (reference)
            strata_kernels_cpu.adamw(NULL, s->master, s->out, s->grad, s->m, s->v, s->n, &a);
        else
            strata_cpu_adamw_ex(isa, threads, s->master, s->out, STRATA_BF16, s->grad, s->m,
                                s->v, s->n, &a);
        double dt = strata_now_ms() - t0;
        if (dt < best) best = dt;
    }
    return best;
}

static void bench(void) {
    state s;
    state_alloc(&s, BENCH_N);
    state_fill(&s, 0, 7);
    int nt = 1;
#ifdef _OPENMP
    nt = omp_get_max_threads();
#endif
    strata_cpu_isa best = strata_cpu_isa_auto();
    /* per element: read master, grad, m, v; write master, m, v and a bf16 copy */
    const double bytes = 30.0 * (double)s.n;
    struct {
        const char *name;
        strata_cpu_isa isa;
        int threads, reference;
    } rows[] = {{"scalar loop, 1 thread", STRATA_ISA_SCALAR, 1, 0},
                {"vectorised, 1 thread", best, 1, 0},
                {"vectorised, all threads", best, nt, 0},
                {"reference kernel (f32 out)", STRATA_ISA_AUTO, 0, 1}};
    printf("info throughput, n=%zu, %d OpenMP threads, auto ISA %s (informational):\n", s.n, nt,
           strata_cpu_isa_name(best));
    for (size_t r = 0; r < sizeof rows / sizeof rows[0]; r++) {
        double ms = bench_one(rows[r].isa, rows[r].threads, rows[r].reference, &s);
        printf("info   %-28s %8.2f ms  %7.2f GB/s  %8.1f Melem/s\n", rows[r].name, ms,
               bytes / (ms * 1e6), (double)s.n / (ms * 1e3));
    }
    state_free(&s);
}

int main(void) {
    static const size_t sizes[] = {0, 1, 15, 17, 1000003};
    static const config configs[] = {{1, 0, 1}, {2, 1, 2}, {3, 1, 0}, {2, 0, 2}};
    strata_cpu_isa isas[] = {STRATA_ISA_SCALAR, STRATA_ISA_AVX2, STRATA_ISA_AVX512};
    printf("auto ISA on this machine: %s\n", strata_cpu_isa_name(strata_cpu_isa_auto()));
    for (int k = 0; k < 3; k++) {
        if (!strata_cpu_isa_supported(isas[k])) {
            printf("skip %s: not supported by this CPU\n", strata_cpu_isa_name(isas[k]));
            continue;
        }
        for (size_t si = 0; si < sizeof sizes / sizeof sizes[0]; si++)
            for (size_t ci = 0; ci < sizeof configs / sizeof configs[0]; ci++)
                compare_path(isas[k], sizes[si], configs[ci]);
        test_bf16_rounding(isas[k]);
        static const size_t msizes[] = {1, 17, 2048, 2049, 5000, 100003};
        for (size_t si = 0; si < sizeof msizes / sizeof msizes[0]; si++)
            for (int q8 = 0; q8 <= 1; q8++) {
                compare_moments(isas[k], msizes[si], 1, (int)(si % 3), q8);
                compare_moments(isas[k], msizes[si], 3, (int)((si + 1) % 3), q8);
            }
    }
    test_q8_table();
    test_q8_quantize_isas();
    /* the public entry point (auto path, default threads) on a size with a tail */
    {
        state ref, got;
        size_t n = 100003;
        state_alloc(&ref, n);
        state_alloc(&got, n);
        state_fill(&ref, 0, 9);
        state_fill(&got, 0, 9);
        strata_adamw_args a = step_args(1);
        strata_kernels_cpu.adamw(NULL, ref.master, ref.out, ref.grad, ref.m, ref.v, n, &a);
        strata_cpu_adamw(got.master, got.out, STRATA_F32, got.grad, got.m, got.v, n, &a);
        CHECK(!memcmp(ref.master, got.master, n * 4) && !memcmp(ref.out, got.out, n * 4) &&
                  !memcmp(ref.m, got.m, n * 4) && !memcmp(ref.v, got.v, n * 4),
              "strata_cpu_adamw (auto ISA, default threads) n=%zu equals the reference", n);
        /* param_out aliasing master in fp32 is allowed */
        strata_kernels_cpu.adamw(NULL, ref.master, NULL, ref.grad, ref.m, ref.v, n, &a);
        strata_cpu_adamw(got.master, got.master, STRATA_F32, got.grad, got.m, got.v, n, &a);
        CHECK(!memcmp(ref.master, got.master, n * 4), "param_out == master (f32) is allowed");
        state_free(&ref);
        state_free(&got);
    }
    if (!strata_cpu_isa_supported(STRATA_ISA_AVX512)) {
        float x = 0;
        strata_adamw_args a = step_args(1);
        int rc = strata_cpu_adamw_ex(STRATA_ISA_AVX512, 1, &x, NULL, STRATA_F32, &x, &x, &x, 1, &a);
        CHECK(rc != 0 && strstr(strata_error(), "avx512"),
              "forcing an unsupported ISA fails with: %s", strata_error());
    }
    bench();
    printf("%s: %d failure(s)\n", failures ? "FAILED" : "PASSED", failures);
    return failures ? 1 : 0;
}
