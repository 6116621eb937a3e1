/* tests/test_quant.c: the 8-bit block-wise quantization of core/quant.h and the CPU oracle's
 * AdamW with bf16 and 8-bit moments (core/cpu/kernels_cpu.c).
 *  - the maps: 256 distinct sorted fp32 values each, the counts per exponent the paper's
 *    construction gives, 0 and 1 in both, the signed map's zero at code 127;
 *  - "nearest": the binary search equals a plain scan for the nearest value (ties to the
 *    lower code) on random values, on every midpoint and the floats around it, on zeros,
 *    denormals and both ends;
 *  - block quantization: codes within half a step of the value, absmax the block's largest
 *    magnitude, exact for the map's own values; all-zero blocks give zero codes;
 *  - AdamW with bf16 moments equals the fp32 step with m, v rounded to bf16 around it;
 *  - AdamW with 8-bit moments leaves the fp32-moment segments and the elements outside every
 *    segment alone, and tracks the fp32 step within the quantization's error.
 * With --dump DIR it also writes its inputs and Strata's outputs (random and adversarial
 * blocks, three 8-bit AdamW steps) for tests/q8_reference.py, the NumPy reference written
 * from the paper, which tests/e2e_q8_reference.sh runs: every code and absmax must match. */
#include <float.h>
#include <math.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/kernels.h"
#include "core/optim.h"
#include "core/quant.h"
#include "tests/check.h"

static const strata_kernels *K = &strata_kernels_cpu;

static float f_of(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}
static uint32_t u_of(float f) {
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

/* ---- the dump for the NumPy reference: named arrays, one file per case ---- */

static FILE *dump_open(const char *dir, const char *name) {
    if (!dir) return NULL;
    char path[512];
    snprintf(path, sizeof path, "%s/%s.bin", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) {
        printf("FAIL cannot write %s\n", path);
        exit(1);
    }
    return f;
}

/* [u32 name length][name][u32 kind: 0 f32, 1 u8, 2 u64][u64 count][data] */
static void dump_array(FILE *f, const char *name, int kind, const void *data, size_t count) {
    if (!f) return;
    uint32_t len = (uint32_t)strlen(name), k = (uint32_t)kind;
    uint64_t c = count;
    size_t es = kind == 0 ? 4 : kind == 1 ? 1 : 8;
    if (fwrite(&len, 4, 1, f) != 1 || fwrite(name, 1, len, f) != len || fwrite(&k, 4, 1, f) != 1 ||
        fwrite(&c, 8, 1, f) != 1 || (count && fwrite(data, es, count, f) != count)) {
        printf("FAIL writing the dump\n");
        exit(1);
    }
}

static void dump_close(FILE *f) {
    if (f && fclose(f)) {
        printf("FAIL closing the dump\n");
        exit(1);
    }
}

/* ---- the maps ---- */

static void test_maps(void) {
    const strata_q8_map *qs = strata_q8_signed(), *qu = strata_q8_unsigned();
    int sorted = 1;
    for (int k = 0; k < 255; k++) sorted &= qs->value[k] < qs->value[k + 1] && qu->value[k] < qu->value[k + 1];
    CHECK(sorted, "both maps hold 256 distinct values in ascending order");
    CHECK(qs->value[STRATA_Q8_ZERO_SIGNED] == 0.0f && qu->value[STRATA_Q8_ZERO_UNSIGNED] == 0.0f &&
              qs->value[255] == 1.0f && qu->value[255] == 1.0f,
          "0 is code %d (signed) and %d (unsigned); 1 is code 255 in both", STRATA_Q8_ZERO_SIGNED,
          STRATA_Q8_ZERO_UNSIGNED);
    /* per exponent 10^(j-6): 2^j values a sign (signed), 2^(j+1) (unsigned), all in
     * [0.1, 1) x 10^(j-6) */
    int counts_ok = 1;
    for (int j = 0; j < 7; j++) {
        double lo = pow(10.0, j - 6) * 0.1, hi = pow(10.0, j - 6);
        int ns = 0, nu = 0, nneg = 0;
        for (int k = 0; k < 256; k++) {
            ns += qs->value[k] > lo && qs->value[k] < hi;
            nneg += -qs->value[k] > lo && -qs->value[k] < hi;
            nu += qu->value[k] > lo && qu->value[k] < hi;
        }
        counts_ok &= ns == 1 << j && nneg == 1 << j && nu == 2 << j;
    }
    CHECK(counts_ok, "the exponent 10^(j-6) holds 2^j values of each sign (signed) and 2^(j+1) (unsigned), j = 0..6");
    CHECK(fabsf(qs->value[0] + 0.99296875f) < 1e-6f, "the signed map's most negative value is %.8f (not -1)",
          qs->value[0]);
    int mids_ok = 1;
    for (int k = 0; k < 255; k++)
        mids_ok &= qs->mid[k] == (qs->value[k] + qs->value[k + 1]) * 0.5f &&
                   qu->mid[k] == (qu->value[k] + qu->value[k + 1]) * 0.5f;
    CHECK(mids_ok, "mid[k] is the fp32 midpoint of codes k and k+1");
}

/* The documented rule, written the slow way: the nearest value, a value on a midpoint going
 * to the lower code (NaN to code 0), a positive value never to code 0. */
static unsigned nearest_scan(const strata_q8_map *q, float x) {
    if (x != x) return 0;
    unsigned c = 0;
    for (unsigned k = 0; k < 255; k++)
        if (q->mid[k] < x) c = k + 1;
    if (c == 0 && x > 0) c = 1;
    return c;
}

static void test_nearest(void) {
    const strata_q8_map *maps[2] = {strata_q8_signed(), strata_q8_unsigned()};
    size_t tried = 0, wrong = 0;
    strata_rng r;
    strata_rng_seed(&r, 7);
    for (int s = 0; s < 2; s++) {
        const strata_q8_map *q = maps[s];
        for (int i = 0; i < 200000; i++) {
            float x = (strata_rng_uniform(&r) * 2.0f - 1.0f) * powf(10.0f, -7.0f * strata_rng_uniform(&r));
            wrong += strata_q8_code(q, x) != nearest_scan(q, x);
            tried++;
        }
        for (int k = 0; k < 255; k++) /* every midpoint and 4 floats on each side */
            for (int d = -4; d <= 4; d++) {
                float x = f_of(u_of(q->mid[k]) + (uint32_t)d);
                wrong += strata_q8_code(q, x) != nearest_scan(q, x);
                tried++;
            }
        float special[] = {0.0f, -0.0f, 1.0f, -1.0f, FLT_MIN, -FLT_MIN, f_of(1), f_of(0x80000001u), 1e-30f, -1e-30f,
                           NAN};
        for (size_t i = 0; i < sizeof special / sizeof special[0]; i++) {
            wrong += strata_q8_code(q, special[i]) != nearest_scan(q, special[i]);
            tried++;
        }
        /* the tie rule itself: a value exactly on a midpoint takes the lower code */
        int ties = 1;
        for (int k = 0; k < 255; k++) /* (the unsigned map's first midpoint is positive: code 1) */
            ties &= strata_q8_code(q, q->mid[k]) == (k == 0 && q->mid[0] > 0 ? 1 : k);
        CHECK(ties, "%s map: a value exactly on the midpoint of codes k and k+1 gets code k",
              s ? "unsigned" : "signed");
        int own = 1;
        for (int k = 0; k < 256; k++) own &= strata_q8_code(q, q->value[k]) == k;
        CHECK(own, "%s map: every map value quantizes to its own code", s ? "unsigned" : "signed");
        /* a tiny positive value: the second moment's never comes back as 0, the first's may */
        float tiny[] = {f_of(1), FLT_MIN, 1e-30f, 1e-8f};
        int kept = 1;
        for (size_t i = 0; i < sizeof tiny / sizeof tiny[0]; i++)
            kept &= s ? q->value[strata_q8_code(q, tiny[i])] > 0 : strata_q8_code(q, tiny[i]) == STRATA_Q8_ZERO_SIGNED;
        CHECK(kept, "%s map: a positive value below the smallest step %s", s ? "unsigned" : "signed",
              s ? "gets the smallest positive code, not 0" : "gets the zero code (nearest)");
    }
    CHECK(strata_q8_code(strata_q8_unsigned(), strata_q8_unsigned()->mid[0]) == 1 &&
              strata_q8_code(strata_q8_unsigned(), 0.0f) == 0 && strata_q8_code(strata_q8_unsigned(), -0.0f) == 0,
          "unsigned map: a positive value at or below the first midpoint gets code 1, zero code 0");
    CHECK(wrong == 0, "binary search = the nearest value by a plain scan (ties low) on %zu values (%zu differ)", tried,
          wrong);
}

/* ---- blocks ---- */

/* Quantizes n values in blocks of 2048 with Strata's functions, checks the bounds, and dumps
 * the case. */
static void quant_case(const char *dir, const char *name, const float *x, size_t n, int is_signed) {
    const strata_q8_map *q = is_signed ? strata_q8_signed() : strata_q8_unsigned();
    size_t nb = strata_q8_blocks(n);
    float *absmax = strata_xcalloc(nb, sizeof(float)), *back = strata_xcalloc(n, sizeof(float));
    uint8_t *code = strata_xcalloc(n, 1);
    int absmax_ok = 1, bound_ok = 1;
    for (size_t b = 0; b < nb; b++) {
        size_t b0 = b * STRATA_Q8_BLOCK, len = n - b0 < STRATA_Q8_BLOCK ? n - b0 : STRATA_Q8_BLOCK;
        absmax[b] = strata_q8_absmax(x + b0, len);
        float want = 0;
        for (size_t i = 0; i < len; i++) want = fabsf(x[b0 + i]) > want ? fabsf(x[b0 + i]) : want;
        absmax_ok &= absmax[b] == want;
        strata_q8_quantize(q, x + b0, len, absmax[b], code + b0);
        strata_q8_dequantize(q, code + b0, len, absmax[b], back + b0);
        for (size_t i = 0; i < len; i++) {
            /* within half the larger gap next to its code (times the absmax), give or take the
             * rounding of the fp32 midpoint and of the division */
            unsigned c = code[b0 + i];
            float gap = 0;
            if (c > 0) gap = q->value[c] - q->value[c - 1];
            if (c < 255 && q->value[c + 1] - q->value[c] > gap) gap = q->value[c + 1] - q->value[c];
            double err = fabs((double)back[b0 + i] - x[b0 + i]);
            if (!is_signed && c == 1 && x[b0 + i] < q->mid[0] * absmax[b]) /* rounded up from below mid[0]: */
                bound_ok &= back[b0 + i] >= x[b0 + i] && err <= q->value[1] * (double)absmax[b] * (1 + 2.4e-7) + 1e-45;
            else if (!(err <= 0.5 * gap * absmax[b] + 2.4e-7 * fabs((double)x[b0 + i]) + 1e-45) &&
                     !(x[b0 + i] < -0.99296875f * absmax[b]))
                bound_ok = 0;
        }
    }
    CHECK(absmax_ok, "%s: absmax is each block's largest magnitude", name);
    CHECK(bound_ok, "%s: each value comes back within half a step of the map around it", name);
    FILE *f = dump_open(dir, name);
    uint64_t sg = (uint64_t)is_signed;
    dump_array(f, "signed", 2, &sg, 1);
    dump_array(f, "x", 0, x, n);
    dump_array(f, "absmax", 0, absmax, nb);
    dump_array(f, "code", 1, code, n);
    dump_array(f, "back", 0, back, n);
    dump_close(f);
    free(absmax);
    free(back);
    free(code);
}

static void test_blocks(const char *dir) {
    size_t n = 3 * STRATA_Q8_BLOCK + 517; /* three blocks and a partial one */
    float *x = strata_xcalloc(n, sizeof(float));
    strata_rng r;
    strata_rng_seed(&r, 11);
    for (int s = 0; s < 2; s++) {
        const char *sfx = s ? "signed" : "unsigned";
        char name[64];
        /* Adam-like: normal values, each block at its own scale */
        for (size_t i = 0; i < n; i++) {
            float v = strata_rand_normal(3, (uint64_t)s, i) * powf(10.0f, -(float)(i / STRATA_Q8_BLOCK) * 2.0f);
            x[i] = s ? v : v * v;
        }
        snprintf(name, sizeof name, "random_%s", sfx);
        quant_case(dir, name, x, n, s);
        memset(x, 0, n * sizeof(float));
        snprintf(name, sizeof name, "zeros_%s", sfx);
        quant_case(dir, name, x, n, s);
        for (size_t i = 0; i < n; i++) x[i] = (strata_rng_uniform(&r) - (s ? 0.5f : 0.0f)) * 1e-3f;
        x[5] = s ? -1e30f : 1e30f; /* one huge outlier: the rest of its block rounds to 0 (signed) or
                                    * to the smallest positive step (unsigned: never 0) */
        x[STRATA_Q8_BLOCK + 7] = 3.0e38f;
        snprintf(name, sizeof name, "outlier_%s", sfx);
        quant_case(dir, name, x, n, s);
        for (size_t i = 0; i < n; i++) /* denormals, and a block whose absmax is one */
            x[i] = f_of((uint32_t)(strata_hash64(i) % 0x7fffffu) | (s && (i & 1) ? 0x80000000u : 0u));
        for (size_t i = 2 * STRATA_Q8_BLOCK; i < 3 * STRATA_Q8_BLOCK; i++) x[i] = x[i] * 1e30f;
        snprintf(name, sizeof name, "denormal_%s", sfx);
        quant_case(dir, name, x, n, s);
        for (size_t i = 0; i < n; i++) /* the extremes without NaN: FLT_MAX, FLT_MIN, -0 */
            x[i] = (i % 5 == 0 ? FLT_MAX : i % 5 == 1 ? FLT_MIN : i % 5 == 2 ? -0.0f : i % 5 == 3 ? 1.0f : 2.5e-38f) *
                   (s && (i & 2) ? -1.0f : 1.0f);
        snprintf(name, sizeof name, "extreme_%s", sfx);
        quant_case(dir, name, x, n, s);
        /* ties: absmax 1 and every midpoint exactly, so each value sits on a boundary */
        const strata_q8_map *q = s ? strata_q8_signed() : strata_q8_unsigned();
        for (size_t i = 0; i < n; i++) x[i] = i % 256 == 255 ? 1.0f : q->mid[i % 256];
        snprintf(name, sizeof name, "ties_%s", sfx);
        quant_case(dir, name, x, n, s);
    }
    free(x);
}

/* ---- AdamW with bf16 and 8-bit moments ---- */

static strata_adamw_args args_at(int t) {
    strata_adamw_args a = {.lr = 1e-3f, .beta1 = 0.9f, .beta2 = 0.95f, .eps = 1e-8f, .weight_decay = 0.1f,
                           .grad_scale = 0.5f};
    a.bc1 = 1.0f - powf(a.beta1, (float)t);
    a.bc2 = 1.0f - powf(a.beta2, (float)t);
    return a;
}

static void test_adamw_bf16(void) {
    size_t n = 10007;
    float *w = strata_xcalloc(n, 4), *w2 = strata_xcalloc(n, 4), *g = strata_xcalloc(n, 4);
    float *m = strata_xcalloc(n, 4), *v = strata_xcalloc(n, 4), *out = strata_xcalloc(n, 4);
    uint16_t *hm = strata_xcalloc(n, 2), *hv = strata_xcalloc(n, 2);
    for (size_t i = 0; i < n; i++) w[i] = w2[i] = strata_rand_normal(1, 0, i) * 0.02f;
    int same = 1;
    for (int t = 1; t <= 3; t++) {
        for (size_t i = 0; i < n; i++) g[i] = strata_rand_normal(2, (uint64_t)t, i);
        strata_adamw_args a = args_at(t);
        /* the fp32 step on the widened moments, rounded after: what bf16 state means */
        for (size_t i = 0; i < n; i++) {
            m[i] = strata_bf16_to_f32(hm[i]);
            v[i] = strata_bf16_to_f32(hv[i]);
        }
        K->adamw(NULL, w, NULL, g, m, v, n, &a);
        K->adamw_bf16(NULL, w2, out, g, hm, hv, n, &a);
        for (size_t i = 0; i < n; i++)
            same &= u_of(w[i]) == u_of(w2[i]) && u_of(out[i]) == u_of(w2[i]) && hm[i] == strata_f32_to_bf16(m[i]) &&
                    hv[i] == strata_f32_to_bf16(v[i]);
    }
    CHECK(same, "adamw_bf16 x3: the fp32 step on the widened moments, rounded to nearest even after, bit for bit");
    free(w), free(w2), free(g), free(m), free(v), free(out), free(hm), free(hv);
}

/* A range of 3 blocks and a partial one cut into segments as a unit would be: quantized ones
 * (decayed or not), fp32 ones, and a gap no segment covers (left alone). */
static void test_adamw_q8(const char *dir) {
    size_t n = 3 * STRATA_Q8_BLOCK + 700, nb = strata_q8_blocks(n);
    strata_adamw_segment seg[] = {
        {0, 1000, 0, 0, 0},                     /* fp32 moments: not this kernel's */
        {1000, 3000, 1, 1, 0},                  /* quantized, decayed, across a block boundary */
        {4000, 300, 0, 1, 0},                   /* quantized, no decay */
        {4300, 96, 0, 0, 1000},                 /* fp32 inside a block of quantized elements */
        {4396, 1604, 1, 1, 0},                  /* quantized, into the partial last block */
        {6000, 744, 0, 1, 0},                   /* quantized, up to a gap of 100 at the end */
    };
    int n_seg = (int)(sizeof seg / sizeof seg[0]);
    float *w = strata_xcalloc(n, 4), *w0 = strata_xcalloc(n, 4), *g = strata_xcalloc(n, 4), *out = strata_xcalloc(n, 4);
    float *fm = strata_xcalloc(n, 4), *fv = strata_xcalloc(n, 4), *fw = strata_xcalloc(n, 4);
    uint8_t *c1 = strata_xcalloc(n, 1), *c2 = strata_xcalloc(n, 1);
    float *a1 = strata_xcalloc(nb, 4), *a2 = strata_xcalloc(nb, 4);
    memset(c1, STRATA_Q8_ZERO_SIGNED, n);
    for (size_t i = 0; i < n; i++) w[i] = w0[i] = fw[i] = strata_rand_normal(4, 0, i) * 0.02f;
    FILE *f = dump_open(dir, "adamw_q8");
    uint64_t segs[6 * 5];
    for (int i = 0; i < n_seg; i++) {
        segs[5 * i] = seg[i].lo, segs[5 * i + 1] = seg[i].n, segs[5 * i + 2] = (uint64_t)seg[i].decay;
        segs[5 * i + 3] = (uint64_t)seg[i].quant, segs[5 * i + 4] = seg[i].small;
    }
    dump_array(f, "segments", 2, segs, (size_t)n_seg * 5);
    dump_array(f, "master0", 0, w, n);
    dump_array(f, "code1_0", 1, c1, n);
    dump_array(f, "code2_0", 1, c2, n);
    dump_array(f, "absmax1_0", 0, a1, nb);
    dump_array(f, "absmax2_0", 0, a2, nb);
    double worst_m = 0, worst_w = 0;
    for (int t = 1; t <= 3; t++) {
        for (size_t i = 0; i < n; i++) g[i] = strata_rand_normal(5, (uint64_t)t, i) * (i % 977 == 0 ? 100.0f : 1.0f);
        g[1234] = 1e4f; /* an outlier gradient */
        strata_adamw_args a = args_at(t);
        K->adamw_q8(NULL, w, out, g, c1, c2, a1, a2, n, seg, n_seg, &a);
        /* the fp32 step on the same segments, for how far 8 bits take it */
        for (int i = 0; i < n_seg; i++) {
            if (!seg[i].quant) continue;
            strata_adamw_args sa = a;
            if (!seg[i].decay) sa.weight_decay = 0;
            K->adamw(NULL, fw + seg[i].lo, NULL, g + seg[i].lo, fm + seg[i].lo, fv + seg[i].lo, seg[i].n, &sa);
        }
        char nm[32];
        float args[8] = {a.lr, a.beta1, a.beta2, a.eps, a.weight_decay, a.bc1, a.bc2, a.grad_scale};
        snprintf(nm, sizeof nm, "args_%d", t);
        dump_array(f, nm, 0, args, 8);
        snprintf(nm, sizeof nm, "grad_%d", t);
        dump_array(f, nm, 0, g, n);
        snprintf(nm, sizeof nm, "master_%d", t);
        dump_array(f, nm, 0, w, n);
        snprintf(nm, sizeof nm, "code1_%d", t);
        dump_array(f, nm, 1, c1, n);
        snprintf(nm, sizeof nm, "code2_%d", t);
        dump_array(f, nm, 1, c2, n);
        snprintf(nm, sizeof nm, "absmax1_%d", t);
        dump_array(f, nm, 0, a1, nb);
        snprintf(nm, sizeof nm, "absmax2_%d", t);
        dump_array(f, nm, 0, a2, nb);
    }
    dump_close(f);
    const strata_q8_map *qs = strata_q8_signed();
    int untouched = 1, out_ok = 1;
    for (int i = 0; i < n_seg; i++)
        for (size_t j = seg[i].lo; j < seg[i].lo + seg[i].n; j++) {
            if (!seg[i].quant) {
                untouched &= w[j] == w0[j] && c1[j] == STRATA_Q8_ZERO_SIGNED && c2[j] == 0;
                continue;
            }
            out_ok &= u_of(out[j]) == u_of(w[j]);
            /* block 0 holds the 1e4 outlier: its other second moments sit at the map's
             * smallest step, never 0, so their steps are smaller than fp32's, not larger */
            double dm = fabs(qs->value[c1[j]] * a1[j / STRATA_Q8_BLOCK] - fm[j]) / (a1[j / STRATA_Q8_BLOCK] + 1e-30);
            double dw = fabs((double)w[j] - fw[j]);
            if (dm > worst_m) worst_m = dm;
            if (dw > worst_w) worst_w = dw;
        }
    for (size_t j = n - 100; j < n; j++) untouched &= w[j] == w0[j];
    CHECK(untouched, "adamw_q8 leaves fp32-moment segments and elements outside every segment alone");
    CHECK(out_ok, "adamw_q8 writes the updated master to param_out");
    /* 3 steps of lr 1e-3 with x100 gradients here and there: within ten steps' worth */
    CHECK(worst_m < 0.05 && worst_w < 3e-2, "adamw_q8 x3 tracks fp32 moments, the outlier's block too: m within %.3f "
          "of its block's absmax, weights within %.2e", worst_m, worst_w);
    free(w), free(w0), free(g), free(out), free(fm), free(fv), free(fw), free(c1), free(c2), free(a1), free(a2);
}

/* An element whose gradient was 10^4 times below its block's largest, then 0 (an untied
 * embedding's row whose token the next batch lacks): its second moment is 10^8 below the
 * block's absmax, under the map's first midpoint. Stored as 0, the next step would be
 * lr x m / eps, thousands of times lr; kept at the smallest code, it is at most a few lr,
 * as with fp32 moments. */
static void test_adamw_q8_zero_gradient(void) {
    enum { N = STRATA_Q8_BLOCK };
    strata_adamw_segment seg = {0, N, 0, 1, 0};
    float *w = strata_xcalloc(N, 4), *g = strata_xcalloc(N, 4), *w1 = strata_xcalloc(N, 4);
    uint8_t *c1 = strata_xcalloc(N, 1), *c2 = strata_xcalloc(N, 1);
    float a1 = 0, a2 = 0;
    memset(c1, STRATA_Q8_ZERO_SIGNED, N);
    for (int t = 1; t <= 2; t++) {
        for (size_t i = 0; i < N; i++) g[i] = i == 0 ? 2.0f : t == 1 ? 2e-4f : 0.0f;
        strata_adamw_args a = args_at(t);
        a.weight_decay = 0;
        memcpy(w1, w, N * 4);
        K->adamw_q8(NULL, w, NULL, g, c1, c2, &a1, &a2, N, &seg, 1, &a);
    }
    double worst = 0;
    for (size_t i = 1; i < N; i++) worst = fmax(worst, fabs((double)w[i] - w1[i]));
    int v_kept = 1;
    for (size_t i = 1; i < N; i++) v_kept &= c2[i] != 0;
    CHECK(v_kept, "a positive second moment 10^8 below its block's absmax keeps a nonzero code");
    CHECK(worst < 3e-3, "the step after a zero gradient, second moment 10^8 below the block's: %.2e (lr 1e-3)", worst);
    free(w), free(g), free(w1), free(c1), free(c2);
}

int main(int argc, char **argv) {
    const char *dir = argc == 3 && !strcmp(argv[1], "--dump") ? argv[2] : NULL;
    test_maps();
    test_nearest();
    test_blocks(dir);
    test_adamw_bf16();
    test_adamw_q8_zero_gradient();
    test_adamw_q8(dir);
    return check_report();
}
