/* offload/cpu_adam.c: the host AdamW of offload/cpu_adam.h.
 *
 * Three kernels over a span [i0, i1): scalar, AVX2 (8 lanes) and AVX-512 (16 lanes).
 * The SIMD ones are compiled with target attributes, so one binary carries all three
 * and picks at run time; their tails fall through to the scalar kernel. Each writes the
 * formula of core/kernels.h with one multiply, add, divide or square root per step and
 * no FMA (mul and add intrinsics are plain IEEE operations once -ffp-contract=off
 * stops the compiler from fusing them), and vdivps/vsqrtps round exactly like / and
 * sqrtf, so every lane matches the reference element for element. tests/test_cpu_adam.c
 * fails if a build ever contracts them. */
/* Belt and braces over the build's -ffp-contract=off: a fused multiply-add here would
 * silently break bitwise agreement with the reference. */
#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif

#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <math.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#define STRATA_X86 1
#endif

#include "core/common.h"
#include "core/quant.h"
#include "offload/cpu_adam.h"

/* Elements per OpenMP work item: 64 KiB of each array, a multiple of every vector width. */
#define ADAM_CHUNK 16384
/* Below this a team costs more than it saves. */
#define ADAM_PAR_MIN 65536

typedef void (*adam_span_fn)(float *master, void *out, strata_dtype out_dtype,
                             const float *grad, float *m, float *v, size_t i0, size_t i1,
                             const strata_adamw_args *a);

static void adam_span_scalar(float *master, void *out, strata_dtype out_dtype,
                             const float *grad, float *m, float *v, size_t i0, size_t i1,
                             const strata_adamw_args *a) {
    const float lr = a->lr, b1 = a->beta1, b2 = a->beta2, eps = a->eps, wd = a->weight_decay;
    const float bc1 = a->bc1, bc2 = a->bc2, gs = a->grad_scale;
    const float omb1 = 1.0f - b1, omb2 = 1.0f - b2;
    for (size_t i = i0; i < i1; i++) {
        float g = grad[i] * gs;
        float mi = b1 * m[i] + omb1 * g;
        float vi = b2 * v[i] + omb2 * g * g;
        m[i] = mi;
        v[i] = vi;
        float mhat = mi / bc1, vhat = vi / bc2;
        float p = master[i];
        p = p - lr * (mhat / (sqrtf(vhat) + eps) + wd * p);
        master[i] = p;
        if (out) {
            if (out_dtype == STRATA_BF16) ((uint16_t *)out)[i] = strata_f32_to_bf16(p);
            else ((float *)out)[i] = p;
        }
    }
}

/* Elements per widened piece: the fp32 copies of m and v live on the stack. */
#define WIDE_PIECE 512

static size_t out_bytes(strata_dtype out_dtype) { return out_dtype == STRATA_BF16 ? 2 : 4; }

/* The same with bf16 moments (optim.state bf16). */
typedef void (*adam_span16_fn)(float *master, void *out, strata_dtype out_dtype, const float *grad,
                               uint16_t *m, uint16_t *v, size_t i0, size_t i1, const strata_adamw_args *a);

/* [i0, i1) a piece at a time: m and v widened (exact), the scalar kernel over the copies,
 * rounded back to nearest even; the SIMD kernels' tails too. */
static void adam_span16_scalar(float *master, void *out, strata_dtype out_dtype, const float *grad, uint16_t *m,
                               uint16_t *v, size_t i0, size_t i1, const strata_adamw_args *a) {
    float tm[WIDE_PIECE], tv[WIDE_PIECE];
    for (size_t j0 = i0; j0 < i1; j0 += WIDE_PIECE) {
        size_t nb = i1 - j0 < WIDE_PIECE ? i1 - j0 : WIDE_PIECE;
        for (size_t i = 0; i < nb; i++) {
            tm[i] = strata_bf16_to_f32(m[j0 + i]);
            tv[i] = strata_bf16_to_f32(v[j0 + i]);
        }
        void *o = out ? (char *)out + j0 * out_bytes(out_dtype) : NULL;
        adam_span_scalar(master + j0, o, out_dtype, grad + j0, tm, tv, 0, nb, a);
        for (size_t i = 0; i < nb; i++) {
            m[j0 + i] = strata_f32_to_bf16(tm[i]);
            v[j0 + i] = strata_f32_to_bf16(tv[i]);
        }
    }
}

#ifdef STRATA_X86
/* The SIMD kernels, each with its moments in fp32 or in bf16 (widened exactly on load,
 * rounded to nearest even on store, in the registers: no second pass over a copy). One
 * always-inlined body per ISA; the wrappers below fix the moments' type at compile time. */
/* strata_f32_to_bf16 in 8 lanes: nearest even, a NaN quieted (both sides of the compare are
 * non-negative as int32, so the signed compare is the unsigned one) */
__attribute__((target("avx2"), always_inline)) static inline __m128i bf16x8_avx2(__m256 x) {
    const __m256i u = _mm256_castps_si256(x), one = _mm256_set1_epi32(1);
    __m256i nan = _mm256_cmpgt_epi32(_mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)), _mm256_set1_epi32(0x7f800000));
    __m256i lsb = _mm256_and_si256(_mm256_srli_epi32(u, 16), one);
    __m256i rne = _mm256_srli_epi32(_mm256_add_epi32(_mm256_add_epi32(u, _mm256_set1_epi32(0x7fff)), lsb), 16);
    __m256i qn = _mm256_or_si256(_mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x0040));
    __m256i h = _mm256_blendv_epi8(rne, qn, nan);
    /* every lane is <= 0xffff, so the saturating pack only narrows */
    return _mm_packus_epi32(_mm256_castsi256_si128(h), _mm256_extracti128_si256(h, 1));
}
__attribute__((target("avx2"), always_inline)) static inline __m256 ld8_avx2(const void *p, size_t i, int m16) {
    if (!m16) return _mm256_loadu_ps((const float *)p + i);
    __m128i h = _mm_loadu_si128((const __m128i *)((const uint16_t *)p + i));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}
__attribute__((target("avx2"), always_inline)) static inline void st8_avx2(void *p, size_t i, __m256 x, int m16) {
    if (m16) _mm_storeu_si128((__m128i *)((uint16_t *)p + i), bf16x8_avx2(x));
    else _mm256_storeu_ps((float *)p + i, x);
}

/* [i0, i1) in steps of 8; returns where the scalar tail starts */
__attribute__((target("avx2"), always_inline)) static inline size_t adam_body_avx2(
    float *master, void *out, strata_dtype out_dtype, const float *grad, void *m, void *v, int m16, size_t i0,
    size_t i1, const strata_adamw_args *a) {
    const __m256 lr = _mm256_set1_ps(a->lr), b1 = _mm256_set1_ps(a->beta1);
    const __m256 b2 = _mm256_set1_ps(a->beta2), eps = _mm256_set1_ps(a->eps);
    const __m256 wd = _mm256_set1_ps(a->weight_decay), gs = _mm256_set1_ps(a->grad_scale);
    const __m256 bc1 = _mm256_set1_ps(a->bc1), bc2 = _mm256_set1_ps(a->bc2);
    const __m256 omb1 = _mm256_set1_ps(1.0f - a->beta1), omb2 = _mm256_set1_ps(1.0f - a->beta2);
    size_t i = i0;
    for (; i + 8 <= i1; i += 8) {
        __m256 g = _mm256_mul_ps(_mm256_loadu_ps(grad + i), gs);
        __m256 mi = _mm256_add_ps(_mm256_mul_ps(b1, ld8_avx2(m, i, m16)), _mm256_mul_ps(omb1, g));
        __m256 vi = _mm256_add_ps(_mm256_mul_ps(b2, ld8_avx2(v, i, m16)), _mm256_mul_ps(_mm256_mul_ps(omb2, g), g));
        st8_avx2(m, i, mi, m16);
        st8_avx2(v, i, vi, m16);
        __m256 mhat = _mm256_div_ps(mi, bc1);
        __m256 root = _mm256_sqrt_ps(_mm256_div_ps(vi, bc2));
        __m256 p = _mm256_loadu_ps(master + i);
        __m256 upd = _mm256_add_ps(_mm256_div_ps(mhat, _mm256_add_ps(root, eps)), _mm256_mul_ps(wd, p));
        p = _mm256_sub_ps(p, _mm256_mul_ps(lr, upd));
        _mm256_storeu_ps(master + i, p);
        if (!out) continue;
        if (out_dtype == STRATA_BF16) _mm_storeu_si128((__m128i *)((uint16_t *)out + i), bf16x8_avx2(p));
        else _mm256_storeu_ps((float *)out + i, p);
    }
    return i;
}
/* strata_f32_to_bf16 in 16 lanes */
__attribute__((target("avx512f"), always_inline)) static inline __m256i bf16x16_avx512(__m512 x) {
    const __m512i u = _mm512_castps_si512(x);
    __mmask16 nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(u, _mm512_set1_epi32(0x7fffffff)),
                                            _mm512_set1_epi32(0x7f800000));
    __m512i hi = _mm512_srli_epi32(u, 16);
    __m512i lsb = _mm512_and_si512(hi, _mm512_set1_epi32(1));
    __m512i rne = _mm512_srli_epi32(_mm512_add_epi32(_mm512_add_epi32(u, _mm512_set1_epi32(0x7fff)), lsb), 16);
    return _mm512_cvtepi32_epi16(_mm512_mask_blend_epi32(nan, rne, _mm512_or_si512(hi, _mm512_set1_epi32(0x0040))));
}
__attribute__((target("avx512f"), always_inline)) static inline __m512 ld16_avx512(const void *p, size_t i, int m16) {
    if (!m16) return _mm512_loadu_ps((const float *)p + i);
    __m256i h = _mm256_loadu_si256((const __m256i *)((const uint16_t *)p + i));
    return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}
__attribute__((target("avx512f"), always_inline)) static inline void st16_avx512(void *p, size_t i, __m512 x,
                                                                                 int m16) {
    if (m16) _mm256_storeu_si256((__m256i *)((uint16_t *)p + i), bf16x16_avx512(x));
    else _mm512_storeu_ps((float *)p + i, x);
}

/* [i0, i1) in steps of 16; returns where the scalar tail starts */
__attribute__((target("avx512f"), always_inline)) static inline size_t adam_body_avx512(
    float *master, void *out, strata_dtype out_dtype, const float *grad, void *m, void *v, int m16, size_t i0,
    size_t i1, const strata_adamw_args *a) {
    const __m512 lr = _mm512_set1_ps(a->lr), b1 = _mm512_set1_ps(a->beta1);
    const __m512 b2 = _mm512_set1_ps(a->beta2), eps = _mm512_set1_ps(a->eps);
    const __m512 wd = _mm512_set1_ps(a->weight_decay), gs = _mm512_set1_ps(a->grad_scale);
    const __m512 bc1 = _mm512_set1_ps(a->bc1), bc2 = _mm512_set1_ps(a->bc2);
    const __m512 omb1 = _mm512_set1_ps(1.0f - a->beta1), omb2 = _mm512_set1_ps(1.0f - a->beta2);
    size_t i = i0;
    for (; i + 16 <= i1; i += 16) {
        __m512 g = _mm512_mul_ps(_mm512_loadu_ps(grad + i), gs);
        __m512 mi = _mm512_add_ps(_mm512_mul_ps(b1, ld16_avx512(m, i, m16)), _mm512_mul_ps(omb1, g));
        __m512 vi = _mm512_add_ps(_mm512_mul_ps(b2, ld16_avx512(v, i, m16)),
                                  _mm512_mul_ps(_mm512_mul_ps(omb2, g), g));
        st16_avx512(m, i, mi, m16);
        st16_avx512(v, i, vi, m16);
        __m512 mhat = _mm512_div_ps(mi, bc1);
        __m512 root = _mm512_sqrt_ps(_mm512_div_ps(vi, bc2));
        __m512 p = _mm512_loadu_ps(master + i);
        __m512 upd = _mm512_add_ps(_mm512_div_ps(mhat, _mm512_add_ps(root, eps)), _mm512_mul_ps(wd, p));
        p = _mm512_sub_ps(p, _mm512_mul_ps(lr, upd));
        _mm512_storeu_ps(master + i, p);
        if (!out) continue;
        if (out_dtype == STRATA_BF16) _mm256_storeu_si256((__m256i *)((uint16_t *)out + i), bf16x16_avx512(p));
        else _mm512_storeu_ps((float *)out + i, p);
    }
    return i;
}

/* the kernels: fp32 moments (tail: the scalar kernel) and bf16 moments (tail: widened) */
#define ADAM_SIMD_KERNELS(isa, target_isa)                                                                           \
    __attribute__((target(target_isa))) static void adam_span_##isa(float *master, void *out, strata_dtype out_dtype, \
                                                                    const float *grad, float *m, float *v, size_t i0, \
                                                                    size_t i1, const strata_adamw_args *a) {          \
        size_t i = adam_body_##isa(master, out, out_dtype, grad, m, v, 0, i0, i1, a);                                 \
        if (i < i1) adam_span_scalar(master, out, out_dtype, grad, m, v, i, i1, a);                                   \
    }                                                                                                                \
    __attribute__((target(target_isa))) static void adam_span16_##isa(float *master, void *out,                      \
                                                                      strata_dtype out_dtype, const float *grad,      \
                                                                      uint16_t *m, uint16_t *v, size_t i0, size_t i1, \
                                                                      const strata_adamw_args *a) {                   \
        size_t i = adam_body_##isa(master, out, out_dtype, grad, m, v, 1, i0, i1, a);                                 \
        if (i < i1) adam_span16_scalar(master, out, out_dtype, grad, m, v, i, i1, a);                                 \
    }
ADAM_SIMD_KERNELS(avx2, "avx2")
ADAM_SIMD_KERNELS(avx512, "avx512f")
#endif

int strata_cpu_isa_supported(strata_cpu_isa isa) {
    switch (isa) {
    case STRATA_ISA_AUTO:
    case STRATA_ISA_SCALAR: return 1;
#ifdef STRATA_X86
    case STRATA_ISA_AVX2: return __builtin_cpu_supports("avx2") ? 1 : 0;
    case STRATA_ISA_AVX512: return __builtin_cpu_supports("avx512f") ? 1 : 0;
#endif
    default: return 0;
    }
}

const char *strata_cpu_isa_name(strata_cpu_isa isa) {
    switch (isa) {
    case STRATA_ISA_AUTO: return "auto";
    case STRATA_ISA_SCALAR: return "scalar";
    case STRATA_ISA_AVX2: return "avx2";
    case STRATA_ISA_AVX512: return "avx512";
    }
    return "unknown";
}

static strata_cpu_isa auto_isa = STRATA_ISA_SCALAR;
static pthread_once_t auto_once = PTHREAD_ONCE_INIT;

static void pick_auto_isa(void) {
    strata_cpu_isa best = STRATA_ISA_SCALAR;
    if (strata_cpu_isa_supported(STRATA_ISA_AVX2)) best = STRATA_ISA_AVX2;
    if (strata_cpu_isa_supported(STRATA_ISA_AVX512)) best = STRATA_ISA_AVX512;
    const char *env = getenv("STRATA_CPU_ADAM_ISA");
    if (env && *env) {
        strata_cpu_isa cap = STRATA_ISA_AUTO;
        for (int k = STRATA_ISA_SCALAR; k <= STRATA_ISA_AVX512; k++)
            if (!strcmp(env, strata_cpu_isa_name((strata_cpu_isa)k))) cap = (strata_cpu_isa)k;
        if (cap == STRATA_ISA_AUTO)
            STRATA_WARN("adam", "STRATA_CPU_ADAM_ISA=%s is not one of scalar, avx2, avx512; "
                                "using %s", env, strata_cpu_isa_name(best));
        else if (cap < best) best = cap;
    }
    auto_isa = best;
}

strata_cpu_isa strata_cpu_isa_auto(void) {
    pthread_once(&auto_once, pick_auto_isa);
    return auto_isa;
}

static adam_span_fn span_fn(strata_cpu_isa isa) {
#ifdef STRATA_X86
    if (isa == STRATA_ISA_AVX512) return adam_span_avx512;
    if (isa == STRATA_ISA_AVX2) return adam_span_avx2;
#endif
    (void)isa;
    return adam_span_scalar;
}

static adam_span16_fn span16_fn(strata_cpu_isa isa) {
#ifdef STRATA_X86
    if (isa == STRATA_ISA_AVX512) return adam_span16_avx512;
    if (isa == STRATA_ISA_AVX2) return adam_span16_avx2;
#endif
    (void)isa;
    return adam_span16_scalar;
}

int strata_cpu_adamw_ex(strata_cpu_isa isa, int n_threads, float *master, void *param_out,
                        strata_dtype out_dtype, const float *grad, float *m, float *v, size_t n,
                        const strata_adamw_args *a) {
    if (isa == STRATA_ISA_AUTO) isa = strata_cpu_isa_auto();
    if (!strata_cpu_isa_supported(isa))
        return strata_fail("cpu adamw: ISA %s is not supported by this CPU or build",
                           strata_cpu_isa_name(isa));
    adam_span_fn fn = span_fn(isa);
    size_t chunks = (n + ADAM_CHUNK - 1) / ADAM_CHUNK;
    int nt = 1;
#ifdef _OPENMP
    nt = n_threads > 0 ? n_threads : omp_get_max_threads();
#endif
    if (n < ADAM_PAR_MIN || nt <= 1) {
        if (n) fn(master, param_out, out_dtype, grad, m, v, 0, n, a);
        return 0;
    }
    if ((size_t)nt > chunks) nt = (int)chunks;
    /* element-wise, so the split changes nothing in the results */
#pragma omp parallel for schedule(static) num_threads(nt)
    for (size_t c = 0; c < chunks; c++) {
        size_t i0 = c * ADAM_CHUNK, i1 = i0 + ADAM_CHUNK < n ? i0 + ADAM_CHUNK : n;
        fn(master, param_out, out_dtype, grad, m, v, i0, i1, a);
    }
    return 0;
}

void strata_cpu_adamw(float *master, void *param_out, strata_dtype out_dtype, const float *grad,
                      float *m, float *v, size_t n, const strata_adamw_args *a) {
    /* AUTO is always supported, so this cannot fail */
    STRATA_IGNORE(strata_cpu_adamw_ex(STRATA_ISA_AUTO, 0, master, param_out, out_dtype, grad, m, v, n, a));
}

/* ---- bf16 moments ---- */

/* The ISA and thread count as strata_cpu_adamw_ex resolves them; -1 when the ISA cannot run. */
static int resolve(strata_cpu_isa *isa, int n_threads, size_t n, size_t item, size_t *items) {
    if (*isa == STRATA_ISA_AUTO) *isa = strata_cpu_isa_auto();
    if (!strata_cpu_isa_supported(*isa))
        return strata_fail("cpu adamw: ISA %s is not supported by this CPU or build", strata_cpu_isa_name(*isa));
    *items = (n + item - 1) / item;
    int nt = 1;
#ifdef _OPENMP
    nt = n_threads > 0 ? n_threads : omp_get_max_threads();
#endif
    if (n < ADAM_PAR_MIN) nt = 1;
    if ((size_t)nt > *items) nt = (int)*items;
    return nt < 1 ? 1 : nt;
}

int strata_cpu_adamw_bf16_ex(strata_cpu_isa isa, int n_threads, float *master, void *param_out, strata_dtype out_dtype,
                             const float *grad, uint16_t *m, uint16_t *v, size_t n, const strata_adamw_args *a) {
    size_t chunks;
    int nt = resolve(&isa, n_threads, n, ADAM_CHUNK, &chunks);
    if (nt < 0) return -1;
    adam_span16_fn fn = span16_fn(isa);
    if (nt <= 1) {
        if (n) fn(master, param_out, out_dtype, grad, m, v, 0, n, a);
        return 0;
    }
#pragma omp parallel for schedule(static) num_threads(nt)
    for (size_t c = 0; c < chunks; c++) {
        size_t i0 = c * ADAM_CHUNK, i1 = i0 + ADAM_CHUNK < n ? i0 + ADAM_CHUNK : n;
        fn(master, param_out, out_dtype, grad, m, v, i0, i1, a);
    }
    return 0;
}

void strata_cpu_adamw_bf16(float *master, void *param_out, strata_dtype out_dtype, const float *grad, uint16_t *m,
                           uint16_t *v, size_t n, const strata_adamw_args *a) {
    /* AUTO is always supported, so this cannot fail */
    STRATA_IGNORE(strata_cpu_adamw_bf16_ex(STRATA_ISA_AUTO, 0, master, param_out, out_dtype, grad, m, v, n, a));
}

/* ---- 8-bit moments ---- */

/* The nearest code of core/quant.h from one table lookup instead of 8 dependent comparisons.
 * The key is a value's sign and the top 16 bits of its magnitude (8 exponent, 8 fraction
 * bits), so a key's values differ only in their low 15 bits; magnitudes below 2^-24 share
 * one key (every such value sits between the same two midpoints) and those past 1's key
 * another (no midpoint is above 1). At most one midpoint lies among a key's values (checked
 * when the table is built: the midpoints closest together, near 1 in the unsigned map, are
 * 0.0035 apart, a key there spans 0.0020), so an entry holds base, the code of the key's
 * smallest value, and thr, that midpoint's low 15 bits: a value is above the midpoint when
 * its low bits are above thr (positive) or below it (negative: a larger magnitude is a
 * smaller value). A key without a midpoint has the thr no value passes, 0x7fff when
 * positive and 0 when negative. Entry: base | thr << 8. */
#define Q8_MAG_LO 0x6700u /* 2^-24 */
#define Q8_MAG_HI 0x7F00u /* 1 */
#define Q8_KEYS (Q8_MAG_HI - Q8_MAG_LO + 3) /* with the tiny and the past-1 keys */

typedef struct q8_lut {
    const strata_q8_map *q;
    int32_t entry[2 * Q8_KEYS]; /* positive keys, then negative */
} q8_lut;

static q8_lut luts[2]; /* signed, unsigned */
static pthread_once_t luts_once = PTHREAD_ONCE_INIT;

static float float_of(uint32_t u) {
    float f;
    memcpy(&f, &u, sizeof f);
    return f;
}

/* The number of midpoints below x (or at most x). */
static unsigned count_below(const strata_q8_map *q, float x, int or_equal) {
    unsigned c = 0;
    while (c < 255 && (q->mid[c] < x || (or_equal && q->mid[c] == x))) c++;
    return c;
}

/* a magnitude's key, clamped to the table: 0 is tiny, Q8_KEYS - 1 past 1 */
static inline uint32_t q8_key(uint32_t u) {
    uint32_t mag = (u >> 15) & 0xffffu;
    mag = mag < Q8_MAG_LO - 1 ? Q8_MAG_LO - 1 : mag > Q8_MAG_HI + 1 ? Q8_MAG_HI + 1 : mag;
    return (u >> 31) * Q8_KEYS + (mag - (Q8_MAG_LO - 1));
}

static void build_lut(q8_lut *L, const strata_q8_map *q) {
    L->q = q;
    for (uint32_t sign = 0; sign < 2; sign++)
        for (uint32_t k = 0; k < Q8_KEYS; k++) {
            uint32_t key = Q8_MAG_LO - 1 + k;
            int clamped = k == 0 || k == Q8_KEYS - 1;
            /* the key's magnitudes [lo, top], in ascending order [first, last]: [lo, top]
             * when positive, [-top, -lo] when negative */
            float lo = k == 0 ? 0.0f : float_of(key << 15);
            float top = k == Q8_KEYS - 1 ? INFINITY : float_of(((key + 1) << 15) - 1);
            float first = sign ? -top : lo, last = sign ? -lo : top;
            unsigned b = count_below(q, first, 0), inside = count_below(q, last, 1) - b;
            STRATA_ASSERT(inside <= (clamped ? 0u : 1u));
            uint32_t thr = sign ? 0 : 0x7fffu, mid;
            if (inside) {
                memcpy(&mid, &q->mid[b], sizeof mid);
                STRATA_ASSERT(((mid >> 15) & 0xffffu) == key);
                thr = mid & 0x7fffu;
            }
            L->entry[sign * Q8_KEYS + k] = (int32_t)(b | thr << 8);
        }
}

static void build_luts(void) {
    build_lut(&luts[0], strata_q8_signed());
    build_lut(&luts[1], strata_q8_unsigned());
}

static inline uint8_t lut_code(const q8_lut *L, float x) {
    uint32_t u;
    memcpy(&u, &x, sizeof u);
    if ((u & 0x7fffffffu) > 0x7f800000u) return 0; /* NaN: no midpoint is below it */
    uint32_t e = (uint32_t)L->entry[q8_key(u)], thr = e >> 8, low = u & 0x7fffu;
    unsigned c = (e & 0xffu) + (u >> 31 ? thr > low : thr < low);
    return (uint8_t)(c + ((unsigned)(c == 0) & (unsigned)(x > 0.0f))); /* a positive x never code 0 (core/quant.h) */
}

uint8_t strata_cpu_q8_code(int is_signed, float x) {
    pthread_once(&luts_once, build_luts);
    return lut_code(&luts[is_signed ? 0 : 1], x);
}

typedef void (*q8_quantize_fn)(const q8_lut *L, const float *x, size_t n, float absmax, uint8_t *code);

static void lut_quantize(const q8_lut *L, const float *x, size_t n, float absmax, uint8_t *code) {
    if (!(absmax > 0.0f)) {
        uint8_t zero = lut_code(L, 0.0f);
        memset(code, zero, n);
        return;
    }
    for (size_t i = 0; i < n; i++) code[i] = lut_code(L, x[i] / absmax);
}

#ifdef STRATA_X86
/* lut_code, 8 and 16 lanes at a time: the same division, key, clamp and table (gathered),
 * the same two ordered compares (false for NaN), NaN to code 0 and a positive value never
 * to code 0; the tail by lut_code. Every lane equals lut_code (tests/test_cpu_adam.c). */
__attribute__((target("avx2"))) static void lut_quantize_avx2(const q8_lut *L, const float *x, size_t n, float absmax,
                                                            uint8_t *code) {
    if (!(absmax > 0.0f)) {
        lut_quantize(L, x, n, absmax, code);
        return;
    }
    const __m256 am = _mm256_set1_ps(absmax), zero = _mm256_setzero_ps();
    const __m256i mag_lo = _mm256_set1_epi32((int)Q8_MAG_LO - 1), mag_hi = _mm256_set1_epi32((int)Q8_MAG_HI + 1);
    const __m256i keys = _mm256_set1_epi32((int)Q8_KEYS), mag_mask = _mm256_set1_epi32(0xffff);
    const __m256i low_mask = _mm256_set1_epi32(0x7fff), byte = _mm256_set1_epi32(0xff);
    size_t i = 0;
    for (; i + 8 <= n; i += 8) {
        __m256 y = _mm256_div_ps(_mm256_loadu_ps(x + i), am);
        __m256i u = _mm256_castps_si256(y);
        __m256i mag = _mm256_and_si256(_mm256_srli_epi32(u, 15), mag_mask);
        mag = _mm256_min_epi32(_mm256_max_epi32(mag, mag_lo), mag_hi);
        __m256i neg = _mm256_srai_epi32(u, 31); /* all ones where negative */
        __m256i key = _mm256_add_epi32(_mm256_and_si256(neg, keys), _mm256_sub_epi32(mag, mag_lo));
        __m256i e = _mm256_i32gather_epi32(L->entry, key, 4);
        __m256i thr = _mm256_srli_epi32(e, 8), low = _mm256_and_si256(u, low_mask);
        /* above the midpoint: low > thr when positive, thr > low when negative (a true
         * compare is all ones, -1: subtracting it adds one) */
        __m256i above = _mm256_blendv_epi8(_mm256_cmpgt_epi32(low, thr), _mm256_cmpgt_epi32(thr, low), neg);
        __m256i c = _mm256_sub_epi32(_mm256_and_si256(e, byte), above);
        __m256i nan = _mm256_castps_si256(_mm256_cmp_ps(y, y, _CMP_UNORD_Q));
        c = _mm256_andnot_si256(nan, c);
        __m256i lift = _mm256_and_si256(_mm256_cmpeq_epi32(c, _mm256_setzero_si256()),
                                        _mm256_castps_si256(_mm256_cmp_ps(y, zero, _CMP_GT_OQ)));
        c = _mm256_sub_epi32(c, lift);
        __m128i w = _mm_packus_epi32(_mm256_castsi256_si128(c), _mm256_extracti128_si256(c, 1));
        _mm_storel_epi64((__m128i *)(code + i), _mm_packus_epi16(w, w));
    }
    for (; i < n; i++) code[i] = lut_code(L, x[i] / absmax);
}

__attribute__((target("avx512f"))) static void lut_quantize_avx512(const q8_lut *L, const float *x, size_t n,
                                                                 float absmax, uint8_t *code) {
    if (!(absmax > 0.0f)) {
        lut_quantize(L, x, n, absmax, code);
        return;
    }
    const __m512 am = _mm512_set1_ps(absmax), zero = _mm512_setzero_ps();
    const __m512i mag_lo = _mm512_set1_epi32((int)Q8_MAG_LO - 1), mag_hi = _mm512_set1_epi32((int)Q8_MAG_HI + 1);
    const __m512i keys = _mm512_set1_epi32((int)Q8_KEYS), mag_mask = _mm512_set1_epi32(0xffff);
    const __m512i low_mask = _mm512_set1_epi32(0x7fff), byte = _mm512_set1_epi32(0xff);
    const __m512i one = _mm512_set1_epi32(1);
    size_t i = 0;
    for (; i + 16 <= n; i += 16) {
        __m512 y = _mm512_div_ps(_mm512_loadu_ps(x + i), am);
        __m512i u = _mm512_castps_si512(y);
        __m512i mag = _mm512_and_si512(_mm512_srli_epi32(u, 15), mag_mask);
        mag = _mm512_min_epi32(_mm512_max_epi32(mag, mag_lo), mag_hi);
        __mmask16 neg = _mm512_cmplt_epi32_mask(u, _mm512_setzero_si512()); /* the sign bit */
        __m512i key = _mm512_mask_add_epi32(_mm512_sub_epi32(mag, mag_lo), neg, _mm512_sub_epi32(mag, mag_lo), keys);
        __m512i e = _mm512_i32gather_epi32(key, L->entry, 4);
        __m512i thr = _mm512_srli_epi32(e, 8), low = _mm512_and_si512(u, low_mask);
        /* above the midpoint: low > thr when positive, thr > low when negative */
        __mmask16 above = (_mm512_cmpgt_epi32_mask(low, thr) & (__mmask16)~neg) | (_mm512_cmpgt_epi32_mask(thr, low) & neg);
        __m512i c = _mm512_and_si512(e, byte);
        c = _mm512_mask_add_epi32(c, above, c, one);
        c = _mm512_mask_mov_epi32(c, _mm512_cmp_ps_mask(y, y, _CMP_UNORD_Q), _mm512_setzero_si512());
        __mmask16 lift = _mm512_cmpeq_epi32_mask(c, _mm512_setzero_si512()) & _mm512_cmp_ps_mask(y, zero, _CMP_GT_OQ);
        c = _mm512_mask_mov_epi32(c, lift, one);
        _mm_storeu_si128((__m128i *)(code + i), _mm512_cvtepi32_epi8(c));
    }
    for (; i < n; i++) code[i] = lut_code(L, x[i] / absmax);
}
#endif

/* A block's moments out of their codes (value = map value x the block's old absmax, one
 * multiply), and the largest magnitude of the updated ones (a NaN ignored: max with the
 * running maximum as its second operand keeps that operand), scalar and in 16 lanes. */
typedef void (*q8_dequant_fn)(const float *vs, const float *vu, const uint8_t *c1, const uint8_t *c2, float old1,
                              float old2, float *tm, float *tv, size_t n);
typedef void (*q8_absmax_fn)(const float *tm, const float *tv, size_t n, float *new1, float *new2);

static void dequant_scalar(const float *vs, const float *vu, const uint8_t *c1, const uint8_t *c2, float old1,
                           float old2, float *tm, float *tv, size_t n) {
    for (size_t j = 0; j < n; j++) {
        tm[j] = vs[c1[j]] * old1;
        tv[j] = vu[c2[j]] * old2;
    }
}

static void absmax_scalar(const float *tm, const float *tv, size_t n, float *new1, float *new2) {
    float a1 = *new1, a2 = *new2;
    for (size_t j = 0; j < n; j++) {
        float y1 = fabsf(tm[j]), y2 = fabsf(tv[j]);
        a1 = y1 > a1 ? y1 : a1; /* a NaN compares false: ignored, as core/quant.c does */
        a2 = y2 > a2 ? y2 : a2;
    }
    *new1 = a1, *new2 = a2;
}

#ifdef STRATA_X86
__attribute__((target("avx512f"))) static void dequant_avx512(const float *vs, const float *vu, const uint8_t *c1,
                                                            const uint8_t *c2, float old1, float old2, float *tm,
                                                            float *tv, size_t n) {
    const __m512 o1 = _mm512_set1_ps(old1), o2 = _mm512_set1_ps(old2);
    size_t j = 0;
    for (; j + 16 <= n; j += 16) {
        __m512i k1 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(c1 + j)));
        __m512i k2 = _mm512_cvtepu8_epi32(_mm_loadu_si128((const __m128i *)(c2 + j)));
        _mm512_storeu_ps(tm + j, _mm512_mul_ps(_mm512_i32gather_ps(k1, vs, 4), o1));
        _mm512_storeu_ps(tv + j, _mm512_mul_ps(_mm512_i32gather_ps(k2, vu, 4), o2));
    }
    dequant_scalar(vs, vu, c1 + j, c2 + j, old1, old2, tm + j, tv + j, n - j);
}

__attribute__((target("avx512f"))) static void absmax_avx512(const float *tm, const float *tv, size_t n, float *new1,
                                                           float *new2) {
    const __m512i abs_mask = _mm512_set1_epi32(0x7fffffff);
    __m512 a1 = _mm512_setzero_ps(), a2 = _mm512_setzero_ps();
    size_t j = 0;
    for (; j + 16 <= n; j += 16) {
        __m512 y1 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(_mm512_loadu_ps(tm + j)), abs_mask));
        __m512 y2 = _mm512_castsi512_ps(_mm512_and_si512(_mm512_castps_si512(_mm512_loadu_ps(tv + j)), abs_mask));
        a1 = _mm512_max_ps(y1, a1); /* NaN in y: a kept */
        a2 = _mm512_max_ps(y2, a2);
    }
    float r1 = _mm512_reduce_max_ps(a1), r2 = _mm512_reduce_max_ps(a2);
    *new1 = r1 > *new1 ? r1 : *new1;
    *new2 = r2 > *new2 ? r2 : *new2;
    absmax_scalar(tm + j, tv + j, n - j, new1, new2);
}
#endif

static q8_dequant_fn dequant_fn(strata_cpu_isa isa) {
#ifdef STRATA_X86
    if (isa == STRATA_ISA_AVX512) return dequant_avx512;
#endif
    (void)isa;
    return dequant_scalar;
}

static q8_absmax_fn absmax_fn(strata_cpu_isa isa) {
#ifdef STRATA_X86
    if (isa == STRATA_ISA_AVX512) return absmax_avx512;
#endif
    (void)isa;
    return absmax_scalar;
}

static q8_quantize_fn quantize_fn(strata_cpu_isa isa) {
#ifdef STRATA_X86
    if (isa == STRATA_ISA_AVX512) return lut_quantize_avx512;
    if (isa == STRATA_ISA_AVX2) return lut_quantize_avx2;
#endif
    (void)isa;
    return lut_quantize;
}

/* One block [b0, b1) of the range: core/cpu/kernels_cpu.c's adamw_q8_block with the ISA's span
 * and the table's codes. */
typedef struct q8_isa {
    adam_span_fn span;
    q8_dequant_fn dequant;
    q8_absmax_fn absmax;
    q8_quantize_fn quantize;
} q8_isa;

static void q8_block(const q8_isa *k, float *master, void *out, strata_dtype out_dtype, const float *grad, uint8_t *c1,
                     uint8_t *c2, float *absmax1, float *absmax2, size_t b0, size_t b1, const strata_adamw_segment *seg,
                     int n_seg, const strata_adamw_args *a) {
    const q8_lut *ls = &luts[0], *lu = &luts[1];
    float tm[STRATA_Q8_BLOCK], tv[STRATA_Q8_BLOCK];
    size_t blk = b0 / STRATA_Q8_BLOCK;
    float old1 = absmax1[blk], old2 = absmax2[blk], new1 = 0.0f, new2 = 0.0f;
    void *out_b0 = out ? (char *)out + b0 * out_bytes(out_dtype) : NULL;
    for (int i = 0; i < n_seg; i++) {
        size_t lo = seg[i].lo > b0 ? seg[i].lo : b0, hi = seg[i].lo + seg[i].n < b1 ? seg[i].lo + seg[i].n : b1;
        if (!seg[i].quant || lo >= hi) continue;
        strata_adamw_args sa = *a;
        if (!seg[i].decay) sa.weight_decay = 0.0f;
        k->dequant(ls->q->value, lu->q->value, c1 + lo, c2 + lo, old1, old2, tm + (lo - b0), tv + (lo - b0), hi - lo);
        k->span(master + b0, out_b0, out_dtype, grad + b0, tm, tv, lo - b0, hi - b0, &sa);
        k->absmax(tm + (lo - b0), tv + (lo - b0), hi - lo, &new1, &new2);
    }
    absmax1[blk] = new1;
    absmax2[blk] = new2;
    for (int i = 0; i < n_seg; i++) {
        size_t lo = seg[i].lo > b0 ? seg[i].lo : b0, hi = seg[i].lo + seg[i].n < b1 ? seg[i].lo + seg[i].n : b1;
        if (!seg[i].quant || lo >= hi) continue;
        k->quantize(ls, tm + (lo - b0), hi - lo, new1, c1 + lo);
        k->quantize(lu, tv + (lo - b0), hi - lo, new2, c2 + lo);
    }
}

int strata_cpu_q8_quantize_ex(strata_cpu_isa isa, int is_signed, const float *x, size_t n, float absmax, uint8_t *code) {
    if (isa == STRATA_ISA_AUTO) isa = strata_cpu_isa_auto();
    if (!strata_cpu_isa_supported(isa))
        return strata_fail("cpu q8: ISA %s is not supported by this CPU or build", strata_cpu_isa_name(isa));
    pthread_once(&luts_once, build_luts);
    quantize_fn(isa)(&luts[is_signed ? 0 : 1], x, n, absmax, code);
    return 0;
}

/* Blocks per OpenMP work item: 16384 elements, as the fp32 path's chunks. */
#define Q8_ITEM_BLOCKS (ADAM_CHUNK / STRATA_Q8_BLOCK)

int strata_cpu_adamw_q8_ex(strata_cpu_isa isa, int n_threads, float *master, void *param_out, strata_dtype out_dtype,
                           const float *grad, uint8_t *m1, uint8_t *m2, float *absmax1, float *absmax2, size_t n,
                           const strata_adamw_segment *seg, int n_seg, const strata_adamw_args *a) {
    size_t items;
    int nt = resolve(&isa, n_threads, n, ADAM_CHUNK, &items);
    if (nt < 0) return -1;
    pthread_once(&luts_once, build_luts);
    const q8_isa k = {span_fn(isa), dequant_fn(isa), absmax_fn(isa), quantize_fn(isa)};
    size_t blocks = strata_q8_blocks(n);
#pragma omp parallel for schedule(static) num_threads(nt) if (nt > 1)
    for (size_t c = 0; c < items; c++)
        for (size_t b = c * Q8_ITEM_BLOCKS; b < (c + 1) * Q8_ITEM_BLOCKS && b < blocks; b++) {
            size_t b0 = b * STRATA_Q8_BLOCK, b1 = b0 + STRATA_Q8_BLOCK < n ? b0 + STRATA_Q8_BLOCK : n;
            q8_block(&k, master, param_out, out_dtype, grad, m1, m2, absmax1, absmax2, b0, b1, seg, n_seg, a);
        }
    return 0;
}

void strata_cpu_adamw_q8(float *master, void *param_out, strata_dtype out_dtype, const float *grad, uint8_t *m1,
                         uint8_t *m2, float *absmax1, float *absmax2, size_t n, const strata_adamw_segment *seg,
                         int n_seg, const strata_adamw_args *a) {
    /* AUTO is always supported, so this cannot fail */
    STRATA_IGNORE(strata_cpu_adamw_q8_ex(STRATA_ISA_AUTO, 0, master, param_out, out_dtype, grad, m1, m2, absmax1,
                                         absmax2, n, seg, n_seg, a));
}
