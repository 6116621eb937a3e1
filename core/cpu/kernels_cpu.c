/* core/cpu/kernels_cpu.c: the fp32 OpenMP backend of core/kernels.h, the oracle the CUDA
 * kernels are tested against and the speed reference for CPU training.
 *
 * Determinism: every output element is computed by exactly one thread, summing its
 * terms in an order fixed by the shapes alone (never by the thread count, never with
 * atomics), so results are bitwise identical run to run and for any OMP_NUM_THREADS.
 * Reductions that span rows (weight and bias gradients) are parallelised over the
 * output columns and walk the rows in order.
 *
 * Speed: matrix products go through one packed, register-blocked GEMM (gemm_block) whose
 * 8x32 micro-kernel GCC keeps in registers and vectorises to fused multiply-adds, or,
 * for the linear layers' products where it measured faster, through BLIS (gemm_blas;
 * the choice, by shape only, is explained above gemm_blas_takes). A row's result never
 * depends on the row count, on either path. Exponentials use exp_fast, a branch-free
 * polynomial that vectorises (libm's expf does not without -ffast-math).
 *
 * Every function ignores its stream: the CPU compute stream runs work inline. */
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#ifdef _OPENMP
#include <omp.h>
#endif
#if defined(__AVX512F__) || defined(__AVX__)
#include <immintrin.h>
#endif
#ifdef STRATA_HAVE_BLAS
#include <blis.h>
#endif

#include "core/common.h"
#include "core/device.h"
#include "core/kernels.h"
#include "core/optim.h"
#include "core/quant.h"

/* Fused multiply-add where the hardware has it (one rounding, vectorises to vfmadd);
 * a plain multiply-add elsewhere, where fmaf would be a slow library call. The choice
 * is fixed at build time, so a given binary is still deterministic. */
#ifdef FP_FAST_FMAF
#define FMADD(a, b, c) fmaf((a), (b), (c))
#else
#define FMADD(a, b, c) ((a) * (b) + (c))
#endif

/* Below this many elements an OpenMP team costs more than it saves. */
#define PAR_MIN 16384

static int max_threads(void)
{
#ifdef _OPENMP
    return omp_get_max_threads();
#else
    return 1;
#endif
}

static void *scratch_alloc(size_t floats)
{
    void *p = NULL;
    if (posix_memalign(&p, 64, floats * sizeof(float) + 64) != 0)
        strata_panic(__FILE__, __LINE__, "kernels_cpu: out of memory for %zu bytes of scratch",
                     floats * sizeof(float));
    return p;
}

/* ---------------------------------------------------------------------------------- */
/* Vectorisable scalar helpers                                                          */

/* e^x with about 1 ulp of error for x in [-87.3, 88], where the caller keeps x (exp_fast
 * clamps it there). Written without branches or library calls so GCC vectorises loops
 * that use it. */
static inline float exp_poly(float x)
{
    /* n = round(x / ln2): adding 1.5 * 2^23 rounds to an integer, which then sits in the
     * low mantissa bits of t (no float-to-int conversion, so NaN stays defined) */
    union {
        float f;
        uint32_t u;
    } t = {.f = x * 1.44269504088896341f + 12582912.0f};
    float n = t.f - 12582912.0f;
    float r = FMADD(-n, 0.693145751953125f, x); /* Cody-Waite: ln2 split in two parts */
    r = FMADD(-n, 1.428606765330187e-06f, r);   /* |r| <= ln2 / 2 */
    /* Taylor polynomial of degree 7: truncation error below 5e-9 on |r| <= 0.347 */
    float p = 1.0f / 5040.0f;
    p = FMADD(p, r, 1.0f / 720.0f);
    p = FMADD(p, r, 1.0f / 120.0f);
    p = FMADD(p, r, 1.0f / 24.0f);
    p = FMADD(p, r, 1.0f / 6.0f);
    p = FMADD(p, r, 0.5f);
    p = FMADD(p, r, 1.0f);
    p = FMADD(p, r, 1.0f);
    union {
        uint32_t u;
        float f;
    } s = {.u = (t.u - 0x4b400000u + 127u) << 23}; /* 2^n, n in [-126, 127] */
    return p * s.f;
}

/* e^x, inputs clamped to [-87.3, 88] (e^-87.3 ~ 1e-38 stands in for smaller results);
 * NaN propagates */
static inline float exp_fast(float x)
{
    x = x < -87.3f ? -87.3f : x;
    x = x > 88.0f ? 88.0f : x;
    return exp_poly(x);
}

#define LANES 16 /* float lanes of the blocked reductions (one AVX-512 register) */
#define DLANES 8 /* double lanes */

/* max of x[0..n), n >= 1; exact, so the lane order does not matter for the value */
static float max_f32(const float *x, int n)
{
    float m = x[0];
    int i = 0;
    if (n >= LANES) {
        float acc[LANES];
        for (int l = 0; l < LANES; l++) acc[l] = x[l];
        for (i = LANES; i + LANES <= n; i += LANES)
            for (int l = 0; l < LANES; l++) acc[l] = x[i + l] > acc[l] ? x[i + l] : acc[l];
        for (int l = 0; l < LANES; l++) m = acc[l] > m ? acc[l] : m;
    }
    for (; i < n; i++) m = x[i] > m ? x[i] : m;
    return m;
}

/* sum of x[0..n) in double, in DLANES interleaved partial sums combined in order */
static double sum_f64(const float *x, size_t n)
{
    double acc[DLANES] = {0};
    size_t i = 0;
    for (; i + DLANES <= n; i += DLANES)
        for (int l = 0; l < DLANES; l++) acc[l] += (double)x[i + l];
    double s = 0.0;
    for (int l = 0; l < DLANES; l++) s += acc[l];
    for (; i < n; i++) s += (double)x[i];
    return s;
}

/* sum of x[i] * y[i] in double, blocked as sum_f64 */
static double dot_f64(const float *x, const float *y, size_t n)
{
    double acc[DLANES] = {0};
    size_t i = 0;
    for (; i + DLANES <= n; i += DLANES)
        for (int l = 0; l < DLANES; l++) acc[l] += (double)x[i + l] * (double)y[i + l];
    double s = 0.0;
    for (int l = 0; l < DLANES; l++) s += acc[l];
    for (; i < n; i++) s += (double)x[i] * (double)y[i];
    return s;
}

/* sum of (x[i] - c)^2 in double, blocked as sum_f64 */
static double sqdev_f64(const float *x, double c, size_t n)
{
    double acc[DLANES] = {0};
    size_t i = 0;
    for (; i + DLANES <= n; i += DLANES)
        for (int l = 0; l < DLANES; l++) {
            double d = (double)x[i + l] - c;
            acc[l] += d * d;
        }
    double s = 0.0;
    for (int l = 0; l < DLANES; l++) s += acc[l];
    for (; i < n; i++) {
        double d = (double)x[i] - c;
        s += d * d;
    }
    return s;
}

/* GELU, tanh form, written as x * sigmoid(2u) since 0.5 (1 + tanh u) = sigmoid(2u):
 * no cancellation near zero and no tanhf call. */
#define GELU_K0 0.7978845608028654f /* sqrt(2 / pi) */
#define GELU_K1 0.044715f

static inline float gelu_f(float x)
{
    float u = GELU_K0 * (x + GELU_K1 * x * x * x);
    return x / (1.0f + exp_fast(-2.0f * u));
}

static inline float gelu_grad_f(float x)
{
    float x2 = x * x;
    float u = GELU_K0 * (x + GELU_K1 * x2 * x);
    float s = 1.0f / (1.0f + exp_fast(-2.0f * u));
    float du = GELU_K0 * (1.0f + 3.0f * GELU_K1 * x2);
    return s + 2.0f * x * s * (1.0f - s) * du;
}

/* ---------------------------------------------------------------------------------- */
/* GEMM: C (M,N) = init + A (M,K) @ B (K,N)                                             */
/*
 * A's element (i, r) is a[i * a_rs + r * a_cs] and B's (r, j) is b[r * b_rs + j * b_cs],
 * so one routine serves plain and transposed operands; C is row-major with row stride
 * ldc. init is C itself when accumulate is set, else the bias row (broadcast) or zero.
 *
 * A task owns a block of C and walks K in KC slices. Each slice of B is packed into
 * NR-wide panels (KC x NR = 32 KiB, L1-resident) and reused by every row of the block,
 * so blocks are made tall. A is read in place when it is row- or column-major (the
 * micro-kernel takes either), and only a short edge sliver is copied. The micro-kernel
 * keeps an MR x NR tile of C in 16 vector registers; every C element receives its K
 * products one by one in increasing r, whatever the blocking or the thread count, and
 * edge tiles go through a zero-padded copy of the same kernel. */
#define MR 8
#define NR 32
#define KC 256
#define MB_MAX 512 /* multiple of MR */
#define NB_MAX 256 /* multiple of NR */

typedef struct gemm_args {
    int M, N, K;
    const float *a;
    size_t a_rs, a_cs;
    const float *b;
    size_t b_rs, b_cs;
    float *c;
    size_t ldc;
    const float *bias; /* (N) or NULL; used when !accumulate */
    int accumulate;
    float *gelu_out; /* (M,N) with row stride ldc, or NULL: receives gelu(C) */
    int kind;        /* which product of a linear layer, for the BLAS choice: GEMM_* below */
    int w_layout;    /* the layer's STRATA_W_* (core/kernels.h), for the same choice */
    int band;        /* causal attention's zeros: BAND_* below (0: none) */
    int band_off;    /* the offset of the band's diagonal */
} gemm_args;

/* Causal attention's products hold a triangle of zeros (or of entries never read), which
 * a tile skips: terms that are exact zeros add nothing (x + 0 * b is x for finite b), so
 * the results are the bits of the full product (but for the sign of a zero).
 *  BAND_A_LOWER: A (i, r) is zero for r > i + band_off (probabilities, query rows)
 *  BAND_A_UPPER: A (i, r) is zero for r < i - band_off (probabilities, key rows)
 *  BAND_C_UPPER: C (i, j) is never read for j < i - band_off (scores, key rows) */
enum { BAND_NONE = 0, BAND_A_LOWER = 1, BAND_A_UPPER = 2, BAND_C_UPPER = 3 };

/* the three products of a linear layer; attention's products are none of them (0) */
enum { GEMM_FWD = 1, GEMM_DINP = 2, GEMM_DW = 3 };

/* one thread's packing buffers */
typedef struct gemm_scratch {
    float *bp;   /* (KC, NB_MAX): a slice of B as panels */
    float *apad; /* (KC, MR): an edge sliver of A, zero-padded */
} gemm_scratch;

/* Scratch lives in thread-local buffers that only ever grow, so after the first step a
 * kernel call allocates nothing (OpenMP keeps its worker threads, and their buffers, for
 * the life of the process). GEMM and attention keep separate buffers. */
typedef struct tls_buf {
    float *p;
    size_t cap; /* floats */
} tls_buf;

static float *tls_get(tls_buf *b, size_t floats)
{
    if (b->cap < floats) {
        free(b->p);
        b->p = scratch_alloc(floats);
        b->cap = floats;
    }
    return b->p;
}

enum { SCRATCH_GEMM = 0, SCRATCH_ATTN = 1 };
static __thread tls_buf tls_bp[2], tls_apad[2], tls_st, tls_dpt;

static void gemm_scratch_init(gemm_scratch *w, int owner)
{
    w->bp = tls_get(&tls_bp[owner], (size_t)KC * NB_MAX);
    w->apad = tls_get(&tls_apad[owner], (size_t)KC * MR);
}

static const float zero_row[NR]; /* the init row of a bias-free, non-accumulating tile */

/* c (MR,NR) = init (MR,NR; row stride ldi, 0 broadcasts one row) + A (MR,kc) @ bp (kc,NR
 * packed). A's element (i, r) is a[i * a_i + r * a_r]; init may equal c. */
static inline __attribute__((always_inline)) void
micro_body(int kc, const float *restrict a, size_t a_i, size_t a_r, const float *restrict bp,
           const float *init, size_t ldi, float *c, size_t ldc)
{
    float acc[MR][NR];
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) acc[i][j] = init[i * ldi + j];
    for (int r = 0; r < kc; r++) {
        const float *b = bp + (size_t)r * NR;
        for (int i = 0; i < MR; i++) {
            float ai = a[i * a_i + r * a_r];
            for (int j = 0; j < NR; j++) acc[i][j] = FMADD(ai, b[j], acc[i][j]);
        }
    }
    for (int i = 0; i < MR; i++)
        for (int j = 0; j < NR; j++) c[i * ldc + j] = acc[i][j];
}

/* Sanitizer instrumentation of the register tile forces it into memory and makes the
 * kernel some 200x slower, which would leave sanitizer builds unable to train; its
 * operand bounds are set by gemm_tile, whose own accesses stay instrumented. */
#if defined(__GNUC__)
#define HOT_UNSANITIZED __attribute__((no_sanitize_address, no_sanitize_thread))
#else
#define HOT_UNSANITIZED
#endif

/* A row-major: (i, r) at a[i * lda + r] */
HOT_UNSANITIZED static void micro_rows(int kc, const float *a, size_t lda, const float *bp, const float *init,
                       size_t ldi, float *c, size_t ldc)
{
    micro_body(kc, a, lda, 1, bp, init, ldi, c, ldc);
}

/* A column-major: (i, r) at a[r * lda + i] */
HOT_UNSANITIZED static void micro_cols(int kc, const float *a, size_t lda, const float *bp, const float *init,
                       size_t ldi, float *c, size_t ldc)
{
    micro_body(kc, a, 1, lda, bp, init, ldi, c, ldc);
}

/* B rows [k0, k0+kc), columns [j0, j0+nb) -> panels of (kc, NR), columns past N zero */
static void pack_b(const gemm_args *g, int k0, int kc, int j0, int nb, float *bp)
{
    for (int p = 0; p < nb; p += NR) {
        float *dst = bp + (size_t)p * kc;
        int cols = nb - p < NR ? nb - p : NR;
        if (g->b_cs == 1) {
            for (int r = 0; r < kc; r++) {
                const float *src = g->b + (size_t)(k0 + r) * g->b_rs + (size_t)(j0 + p);
                for (int j = 0; j < cols; j++) dst[r * NR + j] = src[j];
                for (int j = cols; j < NR; j++) dst[r * NR + j] = 0.0f;
            }
        } else { /* transposed B: each column is contiguous in r */
            for (int j = 0; j < cols; j++) {
                const float *src = g->b + (size_t)(j0 + p + j) * g->b_cs + (size_t)k0 * g->b_rs;
                for (int r = 0; r < kc; r++) dst[r * NR + j] = src[(size_t)r * g->b_rs];
            }
            for (int j = cols; j < NR; j++)
                for (int r = 0; r < kc; r++) dst[r * NR + j] = 0.0f;
        }
    }
}

/* One MR x NR tile of C at (i, j) over K slice [k0, k0+kc) */
static void gemm_tile(const gemm_args *g, int i, int j, int k0, int kc, const float *bp,
                      float *apad)
{
    float *c = g->c + (size_t)i * g->ldc + j;
    int rows = g->M - i < MR ? g->M - i : MR;
    int cols = g->N - j < NR ? g->N - j : NR;
    const float *init = c;
    size_t ldi = g->ldc;
    if (k0 == 0 && !g->accumulate) {
        init = g->bias ? g->bias + j : zero_row;
        ldi = 0;
    }
    int r0 = k0, r1 = k0 + kc; /* the terms this tile adds: [r0, r1) */
    if (g->band == BAND_C_UPPER && j + cols - 1 < i - g->band_off) return;
    if (g->band == BAND_A_LOWER && r1 > i + MR + g->band_off) r1 = i + MR + g->band_off;
    if (g->band == BAND_A_UPPER && r0 < i - g->band_off) r0 = i - g->band_off;
    if (r0 >= r1) {
        if (init != c)
            for (int ii = 0; ii < rows; ii++)
                for (int jj = 0; jj < cols; jj++) c[(size_t)ii * g->ldc + jj] = init[ii * ldi + jj];
        return;
    }
    bp += (size_t)(r0 - k0) * NR;
    kc = r1 - r0;
    k0 = r0;
    const float *a;
    size_t lda;
    int by_rows = 0;
    if (rows == MR && g->a_cs == 1) {
        a = g->a + (size_t)i * g->a_rs + k0;
        lda = g->a_rs;
        by_rows = 1;
    } else if (rows == MR && g->a_rs == 1) {
        a = g->a + (size_t)k0 * g->a_cs + i;
        lda = g->a_cs;
    } else { /* edge rows (or a general stride): a zero-padded column-major copy */
        for (int r = 0; r < kc; r++) {
            const float *src = g->a + (size_t)i * g->a_rs + (size_t)(k0 + r) * g->a_cs;
            for (int ii = 0; ii < MR; ii++) apad[r * MR + ii] = ii < rows ? src[ii * g->a_rs] : 0.0f;
        }
        a = apad;
        lda = MR;
    }
    if (rows == MR && cols == NR) {
        if (by_rows) micro_rows(kc, a, lda, bp, init, ldi, c, g->ldc);
        else micro_cols(kc, a, lda, bp, init, ldi, c, g->ldc);
        return;
    }
    float tmp[MR * NR];
    for (int ii = 0; ii < MR; ii++)
        for (int jj = 0; jj < NR; jj++)
            tmp[ii * NR + jj] = (ii < rows && jj < cols) ? init[ii * ldi + jj] : 0.0f;
    if (by_rows) micro_rows(kc, a, lda, bp, tmp, NR, tmp, NR);
    else micro_cols(kc, a, lda, bp, tmp, NR, tmp, NR);
    for (int ii = 0; ii < rows; ii++)
        for (int jj = 0; jj < cols; jj++) c[(size_t)ii * g->ldc + jj] = tmp[ii * NR + jj];
}

/* C rows [i0,i1), columns [j0,j1), complete over K, on the calling thread */
static void gemm_block(const gemm_args *g, int i0, int i1, int j0, int j1, gemm_scratch *w)
{
    for (int jb = j0; jb < j1; jb += NB_MAX) {
        int nb = j1 - jb < NB_MAX ? j1 - jb : NB_MAX;
        int k0 = 0;
        do { /* at least once, so K == 0 still writes init */
            int kc = g->K - k0 < KC ? g->K - k0 : KC;
            pack_b(g, k0, kc, jb, nb, w->bp);
            for (int ib = i0; ib < i1; ib += MB_MAX) { /* A's rows stay in L2 across panels */
                int ie = i1 - ib < MB_MAX ? i1 : ib + MB_MAX;
                for (int p = 0; p < nb; p += NR)
                    for (int i = ib; i < ie; i += MR)
                        gemm_tile(g, i, jb + p, k0, kc, w->bp + (size_t)p * kc, w->apad);
            }
            k0 += KC;
        } while (k0 < g->K);
        if (g->gelu_out)
            for (int i = i0; i < i1; i++) {
                const float *c = g->c + (size_t)i * g->ldc;
                float *o = g->gelu_out + (size_t)i * g->ldc;
                for (int j = jb; j < jb + nb; j++) o[j] = gelu_f(c[j]);
            }
    }
}

/* The parallel driver: C is split into blocks, each computed by one thread. Blocks are
 * as tall as possible (a packed B slice is reused by every row) and are narrowed, then
 * shortened, until each thread has a few; block shapes never change the arithmetic. */
static void gemm_strata(const gemm_args *g)
{
    if (g->M <= 0 || g->N <= 0) return;
    int nt = max_threads();
    int mb = g->M < MB_MAX ? (g->M + MR - 1) / MR * MR : MB_MAX, nb = NB_MAX;
    for (;;) {
        long tasks = (long)((g->M + mb - 1) / mb) * ((g->N + nb - 1) / nb);
        if (tasks >= 4L * nt) break;
        if (nb > NR) nb /= 2;
        else if (mb > MR) mb = (mb / 2 + MR - 1) / MR * MR;
        else break;
    }
    int tm = (g->M + mb - 1) / mb, tn = (g->N + nb - 1) / nb;
    long tasks = (long)tm * tn;
    int par = tasks > 1 && 2.0 * g->M * g->N * (double)g->K > 1e6;
#pragma omp parallel if (par)
    {
        gemm_scratch w;
        gemm_scratch_init(&w, SCRATCH_GEMM);
#pragma omp for schedule(static)
        for (long t = 0; t < tasks; t++) {
            int i0 = (int)(t / tn) * mb, j0 = (int)(t % tn) * nb;
            int i1 = i0 + mb < g->M ? i0 + mb : g->M;
            int j1 = j0 + nb < g->N ? j0 + nb : g->N;
            gemm_block(g, i0, i1, j0, j1, &w);
        }
    }
}

/* ---------------------------------------------------------------------------------- */
/* The BLAS path and the choice between it and gemm_strata                               */
/*
 * With STRATA_HAVE_BLAS (CMakeLists.txt links BLIS's OpenMP build), linear layers' products
 * can go to BLIS. Through its typed API rather than cblas_sgemm, for three reasons:
 *  - the thread count travels with the call (a runtime object), with no global to set:
 *    omp_get_max_threads() from the compute thread, 1 inside one of our parallel regions;
 *  - BLIS's small-matrix ("sup") path is switched off: its results for a row depend on how
 *    many rows the call has (measured), which would make a sequence's activations depend
 *    on the batch it sits in, so ZeRO world sizes and evaluation batches would disagree
 *    in the last bits; the packed path is row-count independent, and faster on these
 *    shapes (the sup path fell to 80-90 GFLOP/s at 256 x 768 x 3072);
 *  - operands are passed with their row and column strides, as gemm_args holds them.
 * BLIS splits C, never K, across threads, so its results do not depend on the thread
 * count either (tests/test_kernels.c checks both properties). Attention's products stay on
 * gemm_block (one (batch, head) per thread: small, single-threaded products).
 * The choice depends on the shapes only, never on timing or the thread count, so runs stay
 * bitwise reproducible. STRATA_CPU_GEMM=strata|blas (or strata_cpu_gemm_select) forces one
 * for every linear layer's product. */

enum { GEMM_AUTO = 0, GEMM_STRATA = 1, GEMM_BLAS = 2 };
static pthread_once_t gemm_env_once = PTHREAD_ONCE_INIT;
static int gemm_env_choice = GEMM_AUTO;
static int gemm_forced = -1;    /* -1: the environment decides */
static int gemm_blas_takes_all; /* BLIS has AVX-512 kernels for this CPU: see below */

static void gemm_env_read(void)
{
#ifdef STRATA_HAVE_BLAS
    arch_t arch = bli_arch_query_id();
    gemm_blas_takes_all = arch == BLIS_ARCH_SKX || arch == BLIS_ARCH_KNL;
#endif
    const char *v = getenv("STRATA_CPU_GEMM");
    if (!v || !*v || !strcmp(v, "auto")) return;
    if (!strcmp(v, "strata")) gemm_env_choice = GEMM_STRATA;
    else if (!strcmp(v, "blas") && strata_cpu_gemm_has_blas()) gemm_env_choice = GEMM_BLAS;
    else
        strata_panic(__FILE__, __LINE__, "STRATA_CPU_GEMM=%s is not a choice: auto (the default), strata%s", v,
                     strata_cpu_gemm_has_blas() ? " or blas" : " (this build has no BLAS: -DSTRATA_BLAS=none)");
}

static int gemm_choice(void)
{
    pthread_once(&gemm_env_once, gemm_env_read);
    int forced = __atomic_load_n(&gemm_forced, __ATOMIC_ACQUIRE);
    return forced >= 0 ? forced : gemm_env_choice;
}

int strata_cpu_gemm_has_blas(void)
{
#ifdef STRATA_HAVE_BLAS
    return 1;
#else
    return 0;
#endif
}

int strata_cpu_gemm_select(int impl)
{
    int before = gemm_choice();
    if (impl == GEMM_BLAS && !strata_cpu_gemm_has_blas()) impl = GEMM_STRATA;
    __atomic_store_n(&gemm_forced, impl < 0 ? -1 : impl, __ATOMIC_RELEASE);
    return before;
}

#ifdef STRATA_HAVE_BLAS
/* The context of the Llama family's products (STRATA_W_NK): BLIS's own with K blocked by
 * 512 rather than 256, so each of the layer's products with K = 512 makes one pass over C
 * instead of two: a training step of bench/bench_cpu_llama.sh took about 1% less (810 against
 * 816-824 ms, interleaved runs). BLIS adds a K block's sum to C, so KC sets the rounding:
 * GPT-2's products keep the default context, and their bits. Where BLIS runs its AVX-512
 * kernels (gemm_blas_takes_all) the default stands for every product. */
static pthread_once_t blas_nk_once = PTHREAD_ONCE_INIT;
static cntx_t blas_nk_cntx;

static void blas_nk_init(void)
{
    blas_nk_cntx = *bli_gks_query_cntx();
    blksz_t *kc = bli_cntx_get_blksz(BLIS_KC, &blas_nk_cntx);
    bli_blksz_set_def(512, BLIS_FLOAT, kc);
    bli_blksz_set_max(512, BLIS_FLOAT, kc);
}

static cntx_t *blas_nk_context(void)
{
    if (gemm_blas_takes_all) return NULL;
    pthread_once(&blas_nk_once, blas_nk_init);
    return &blas_nk_cntx;
}

/* C (=) init + A @ B through BLIS. The bias row is copied into C first (beta 1), and
 * GELU runs as its own pass after the product. */
static void gemm_blas(const gemm_args *g)
{
    rntm_t rntm = BLIS_RNTM_INITIALIZER;
    int nt = max_threads();
#ifdef _OPENMP
    if (omp_in_parallel()) nt = 1;
#endif
    bli_rntm_set_num_threads(nt, &rntm);
    bli_rntm_disable_l3_sup(&rntm);
    float one = 1.0f, beta = g->accumulate ? 1.0f : 0.0f;
    if (!g->accumulate && g->bias) {
#pragma omp parallel for schedule(static) if ((long)g->M * g->N > PAR_MIN)
        for (int i = 0; i < g->M; i++) memcpy(g->c + (size_t)i * g->ldc, g->bias, (size_t)g->N * sizeof(float));
        beta = 1.0f;
    }
    cntx_t *cntx = g->w_layout == STRATA_W_NK ? blas_nk_context() : NULL;
    bli_sgemm_ex(BLIS_NO_TRANSPOSE, BLIS_NO_TRANSPOSE, g->M, g->N, g->K, &one, (float *)g->a, (inc_t)g->a_rs,
                 (inc_t)g->a_cs, (float *)g->b, (inc_t)g->b_rs, (inc_t)g->b_cs, &beta, g->c, (inc_t)g->ldc, 1, cntx,
                 &rntm);
    if (g->gelu_out) {
#pragma omp parallel for schedule(static) if ((long)g->M * g->N > PAR_MIN)
        for (int i = 0; i < g->M; i++) {
            const float *c = g->c + (size_t)i * g->ldc;
            float *o = g->gelu_out + (size_t)i * g->ldc;
            for (int j = 0; j < g->N; j++) o[j] = gelu_f(c[j]);
        }
    }
}
#endif

/* Which kernel takes a linear layer's product (STRATA_CPU_GEMM=auto), from
 * bench/bench_gemm on the development machine (AMD Zen 4, 2 cores; the table is in
 * docs/benchmarks.md). There BLIS 0.9, which has no Zen 4 kernels, runs its AVX2 (zen3)
 * ones, and gemm_strata's AVX-512 tile is as fast or faster on many shapes. GFLOP/s on
 * the model shapes of bench/bench_cpu.sh, BLIS against gemm_strata:
 *  - input gradients (dout @ W^T, where gemm_strata packs W^T column by column): BLIS,
 *    184-216 against 158-222;
 *  - forward products: BLIS when a dimension is 128 or less (n_embd 128: 156-200 against
 *    160-167), gemm_strata otherwise (175-224 against 184-213);
 *  - weight gradients, which sum over the M = B*T rows: BLIS for 512 rows or fewer (B*T
 *    256: 210-215 against 157-201), gemm_strata over more (176-220 against 155-207).
 * A row's forward output and input gradient never depend on the row count (neither rule
 * looks at it), so a sequence's activations are the same bits in any batch.
 * The Llama family's nn.Linear (out, in) weights (STRATA_W_NK) go to BLIS in every
 * direction: on its layer shapes (bench/bench_gemm llama) BLIS is as fast or faster on
 * most products, and in a training step (8 layers, 512 channels, T=256) all of them on
 * BLIS took 826 ms against 920 ms with the rules above (STRATA_PROFILE=kernels). GPT-2's
 * products keep the rules above, so its results are the bits they were.
 * Where BLIS has AVX-512 kernels (Intel Skylake-X and later), every linear layer's product
 * goes to it: on such a machine gemm_strata reached 208-223 GFLOP/s against a BLAS's
 * 330-397 (issue 16). Attention's products always stay on gemm_block. */
static int gemm_blas_takes(const gemm_args *g)
{
#ifdef STRATA_HAVE_BLAS
    if (!g->kind) return 0;
    int c = gemm_choice();
    if (c != GEMM_AUTO) return c == GEMM_BLAS;
    if (gemm_blas_takes_all || g->w_layout == STRATA_W_NK) return 1;
    switch (g->kind) {
    case GEMM_FWD: return (g->K < g->N ? g->K : g->N) <= 128;
    case GEMM_DINP: return 1;
    default: return g->K <= 512;
    }
#else
    (void)g;
    return 0;
#endif
}

static void gemm(const gemm_args *g)
{
    if (g->M <= 0 || g->N <= 0) return;
#ifdef STRATA_HAVE_BLAS
    if (g->K > 0 && gemm_blas_takes(g)) {
        gemm_blas(g);
        return;
    }
#endif
    gemm_strata(g);
}

/* ---------------------------------------------------------------------------------- */
/* Encoder                                                                               */

static void cpu_encoder_forward(strata_stream *s, void *out_, const int32_t *tok, const int32_t *pos,
                                const void *wte_, const void *wpe_, int B, int T, int C)
{
    float *out = out_;
    const float *wte = wte_, *wpe = wpe_;
#pragma omp parallel for schedule(static) if ((long)B * T * C > PAR_MIN)
    for (long bt = 0; bt < (long)B * T; bt++) {
        const float *e = wte + (size_t)tok[bt] * C;
        float *o = out + (size_t)bt * C;
        if (!wpe) { /* the Llama family: positions enter through the rotation of q and k */
            memcpy(o, e, (size_t)C * sizeof(float));
            continue;
        }
        const float *p = wpe + (size_t)(pos ? pos[bt] : bt % T) * C;
        for (int c = 0; c < C; c++) o[c] = e[c] + p[c];
    }
}

/* Channel blocks are the unit of parallelism: a thread owns columns [c0, c1) of dwte
 * and dwpe and adds the (b,t) rows in order, so repeated tokens never race. A block's
 * width never changes a channel's order of additions, so it is chosen for speed: up to 64
 * channels (four vectors of sums in flight: RMSNorm's backward at 512 channels 0.19 ->
 * 0.15 ms, LayerNorm's 0.39 -> 0.32) while every thread still gets four blocks or more. */
#define CH_BLOCK_MAX 64

static int ch_block(int C)
{
    int w = C / (4 * max_threads()) / 16 * 16;
    return w < 16 ? 16 : w > CH_BLOCK_MAX ? CH_BLOCK_MAX : w;
}

/* Position order already (each channel block walks the batch in order): order and
 * pos_order are unused. */
static void cpu_encoder_backward(strata_stream *s, float *dwte, float *dwpe, const void *dout_,
                                 const int32_t *tok, const int32_t *order, const int32_t *pos,
                                 const int32_t *pos_order, int B, int T, int C)
{
    (void)order;
    (void)pos_order;
    const float *dout = dout_;
    int cb = ch_block(C), nblk = (C + cb - 1) / cb;
#pragma omp parallel for schedule(static) if ((long)B * T * C > PAR_MIN)
    for (int blk = 0; blk < nblk; blk++) {
        int c0 = blk * cb, c1 = c0 + cb < C ? c0 + cb : C;
        for (int b = 0; b < B; b++)
            for (int t = 0; t < T; t++) {
                const float *d = dout + ((size_t)b * T + t) * C;
                float *we = dwte + (size_t)tok[(size_t)b * T + t] * C;
                if (!dwpe) {
                    for (int c = c0; c < c1; c++) we[c] += d[c];
                    continue;
                }
                float *wp = dwpe + (size_t)(pos ? pos[(size_t)b * T + t] : t) * C;
                for (int c = c0; c < c1; c++) {
                    we[c] += d[c];
                    wp[c] += d[c];
                }
            }
    }
}

/* ---------------------------------------------------------------------------------- */
/* LayerNorm                                                                             */

static void cpu_layernorm_forward(strata_stream *s, void *out_, float *mean, float *rstd,
                                  const void *inp_, const void *w_, const void *b_, int N, int C)
{
    float *out = out_;
    const float *inp = inp_, *w = w_, *b = b_;
#pragma omp parallel for schedule(static) if ((long)N * C > PAR_MIN)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C;
        float *o = out + (size_t)n * C;
        double m = sum_f64(x, (size_t)C) / C;
        double var = sqdev_f64(x, m, (size_t)C) / C;
        float mf = (float)m, rs = (float)(1.0 / sqrt(var + 1e-5));
        for (int c = 0; c < C; c++) o[c] = (x[c] - mf) * rs * w[c] + b[c];
        mean[n] = mf;
        rstd[n] = rs;
    }
}

static void cpu_layernorm_backward(strata_stream *s, void *dinp_, float *dw, float *db,
                                   const void *dout_, const void *inp_, const void *w_,
                                   const float *mean, const float *rstd, int N, int C)
{
    float *dinp = dinp_;
    const float *dout = dout_, *inp = inp_, *w = w_;
    int par = (long)N * C > PAR_MIN;
    /* dinp, row by row */
#pragma omp parallel for schedule(static) if (par)
    for (int n = 0; n < N; n++) {
        const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
        float *di = dinp + (size_t)n * C;
        float m = mean[n], rs = rstd[n];
        double acc_d[DLANES] = {0}, acc_dn[DLANES] = {0};
        int c = 0;
        for (; c + DLANES <= C; c += DLANES)
            for (int l = 0; l < DLANES; l++) {
                float norm = (x[c + l] - m) * rs, dnorm = w[c + l] * d[c + l];
                acc_d[l] += dnorm;
                acc_dn[l] += (double)dnorm * norm;
            }
        double sd = 0.0, sdn = 0.0;
        for (int l = 0; l < DLANES; l++) {
            sd += acc_d[l];
            sdn += acc_dn[l];
        }
        for (; c < C; c++) {
            float norm = (x[c] - m) * rs, dnorm = w[c] * d[c];
            sd += dnorm;
            sdn += (double)dnorm * norm;
        }
        float dmean = (float)(sd / C), dnmean = (float)(sdn / C);
        for (c = 0; c < C; c++) {
            float norm = (x[c] - m) * rs, dnorm = w[c] * d[c];
            di[c] += (dnorm - dmean - norm * dnmean) * rs;
        }
    }
    /* dw, db: a thread owns a block of channels and walks the rows in order */
    int cb = ch_block(C), nblk = (C + cb - 1) / cb;
#pragma omp parallel for schedule(static) if (par)
    for (int blk = 0; blk < nblk; blk++) {
        int c0 = blk * cb, c1 = c0 + cb < C ? c0 + cb : C;
        for (int n = 0; n < N; n++) {
            const float *x = inp + (size_t)n * C, *d = dout + (size_t)n * C;
            float m = mean[n], rs = rstd[n];
            for (int c = c0; c < c1; c++) {
                dw[c] += (x[c] - m) * rs * d[c];
                db[c] += d[c];
            }
        }
    }
}

/* ---------------------------------------------------------------------------------- */
/* Matmul                                                                                */

static void cpu_matmul_forward(strata_stream *s, void *out, void *gelu_out, const void *inp,
                               const void *w, const void *bias, int M, int K, int N, int w_nk)
{
    gemm_args g = {
        .M = M, .N = N, .K = K,
        .a = inp, .a_rs = (size_t)K, .a_cs = 1,
        .b = w, .b_rs = w_nk ? 1 : (size_t)N, .b_cs = w_nk ? (size_t)K : 1,
        .c = out, .ldc = (size_t)N,
        .bias = bias, .accumulate = 0, .gelu_out = gelu_out, .kind = GEMM_FWD, .w_layout = w_nk,
    };
    gemm(&g);
}

/* column sums of x (M,N) added to out (N): column blocks in parallel, rows in order */
static void colsum_add(float *out, const float *x, int M, int N)
{
    int cb = ch_block(N), nblk = (N + cb - 1) / cb;
#pragma omp parallel for schedule(static) if ((long)M * N > PAR_MIN)
    for (int blk = 0; blk < nblk; blk++) {
        int j0 = blk * cb, j1 = j0 + cb < N ? j0 + cb : N;
        float acc[CH_BLOCK_MAX];
        for (int j = j0; j < j1; j++) acc[j - j0] = out[j];
        for (int m = 0; m < M; m++) {
            const float *row = x + (size_t)m * N;
            for (int j = j0; j < j1; j++) acc[j - j0] += row[j];
        }
        for (int j = j0; j < j1; j++) out[j] = acc[j - j0];
    }
}

static void cpu_matmul_backward(strata_stream *s, void *dinp, float *dw, float *dbias,
                                const void *dout, const void *inp, const void *w, int M, int K,
                                int N, int w_nk)
{
    if (dinp) { /* dinp (M,K) = dout (M,N) @ W^T, W^T (N,K) read in place */
        gemm_args g = {
            .M = M, .N = K, .K = N,
            .a = dout, .a_rs = (size_t)N, .a_cs = 1,
            .b = w, .b_rs = w_nk ? (size_t)K : 1, .b_cs = w_nk ? 1 : (size_t)N,
            .c = dinp, .ldc = (size_t)K, .kind = GEMM_DINP, .w_layout = w_nk,
        };
        gemm(&g);
    }
    if (w_nk == 0) { /* dW (K,N) += inp^T (K,M) @ dout (M,N) */
        gemm_args g = {
            .M = K, .N = N, .K = M,
            .a = inp, .a_rs = 1, .a_cs = (size_t)K,
            .b = dout, .b_rs = (size_t)N, .b_cs = 1,
            .c = dw, .ldc = (size_t)N, .accumulate = 1, .kind = GEMM_DW, .w_layout = w_nk,
        };
        gemm(&g);
    } else { /* dW (N,K) += dout^T (N,M) @ inp (M,K) */
        gemm_args g = {
            .M = N, .N = K, .K = M,
            .a = dout, .a_rs = 1, .a_cs = (size_t)N,
            .b = inp, .b_rs = (size_t)K, .b_cs = 1,
            .c = dw, .ldc = (size_t)K, .accumulate = 1, .kind = GEMM_DW, .w_layout = w_nk,
        };
        gemm(&g);
    }
    if (dbias) colsum_add(dbias, dout, M, N);
}

/* ---------------------------------------------------------------------------------- */
/* Attention                                                                             */
/*
 * One (batch, head) is one task on one thread, so dK and dV accumulate over query
 * blocks in a fixed order. Queries go in blocks of QB. A block's scores against keys
 * [0, t1) are kept transposed, S^T (nk, QB), in a per-thread scratch (never
 * B*NH*T*T): every product then reads q, k, v in place or packs only a (hs, QB) slice,
 * and the softmax runs over keys with the block's queries as vector lanes. Key u is
 * visible to query t0 + i when i >= u - t0 (causal) and, with documents (pos), when
 * u >= lo[i] = t0 + i - pos[t0 + i], the first key of the query's own document. lo never
 * decreases along a row, so a block's keys start at k0 = lo[0] (0 without documents) and
 * packed documents cost about what each would alone; row u - k0 of S^T holds key u, and
 * the keys a block's query cannot see are exact zeros in its products. */
#define QB 64

typedef struct attn_scratch {
    float *st, *dpt; /* (T, QB) each: scores or probabilities, and dP, transposed */
    gemm_scratch g;
} attn_scratch;

static void attn_scratch_init(attn_scratch *w, int T, int backward)
{
    w->st = tls_get(&tls_st, (size_t)T * QB);
    w->dpt = backward ? tls_get(&tls_dpt, (size_t)T * QB) : NULL;
    gemm_scratch_init(&w->g, SCRATCH_ATTN);
}

/* first query column of the block that sees key u */
static inline int attn_first(int u, int t0)
{
    return u > t0 ? u - t0 : 0;
}

/* lo[i], the first key query t0 + i may see, for the block's nq queries (pos_row: the
 * row's positions, NULL without documents); returns the block's first key, lo[0] */
static int attn_doc_lo(const int32_t *pos_row, int t0, int nq, int *lo)
{
    for (int i = 0; i < nq; i++) lo[i] = pos_row ? t0 + i - pos_row[t0 + i] : 0;
    return lo[0];
}

/* one past the last query column of the block that sees key u: the queries whose document
 * starts at or before u, a prefix of the block; *e carries the answer for the key before
 * (keys are walked upwards, and the prefix only grows) */
static inline int attn_last(const int *lo, int nq, int u, int *e)
{
    while (*e < nq && lo[*e] <= u) (*e)++;
    return *e;
}

/* st (nk, QB) = k[k0..k0+nk) @ q[t0..t0+nq)^T: unscaled scores, transposed; q and k rows
 * are W elements apart (a qkv row) */
static void attn_scores_t(attn_scratch *w, const float *q, const float *k, int t0, int nq, int k0,
                          int nk, int W, int hs)
{
    gemm_args g = {
        .M = nk, .N = nq, .K = hs,
        .a = k + (size_t)k0 * W, .a_rs = (size_t)W, .a_cs = 1,
        .b = q + (size_t)t0 * W, .b_rs = 1, .b_cs = (size_t)W,
        .c = w->st, .ldc = QB, .band = BAND_C_UPPER, .band_off = t0 - k0,
    };
    gemm_block(&g, 0, nk, 0, nq, &w->g);
}

static void cpu_attention_forward(strata_stream *s, void *out_, float *lse, const void *qkv_,
                                  const int32_t *pos, int B, int T, int NH, int NKV, int hs)
{
    float *out = out_;
    const float *qkv = qkv_;
    int C = NH * hs, W = (NH + 2 * NKV) * hs, group = NH / NKV;
    float scale = (float)(1.0 / sqrt((double)hs));
#pragma omp parallel if (B * NH > 1 && (long)T * C > 4096)
    {
        attn_scratch w;
        attn_scratch_init(&w, T, 0);
#pragma omp for schedule(static)
        for (int bh = 0; bh < B * NH; bh++) {
            int b = bh / NH, h = bh % NH, kv = h / group;
            const float *row0 = qkv + (size_t)b * T * W;
            const float *q = row0 + (size_t)h * hs;
            const float *k = row0 + (size_t)(NH + kv) * hs, *v = row0 + (size_t)(NH + NKV + kv) * hs;
            float *o = out + (size_t)b * T * C + (size_t)h * hs;
            float *l = lse + (size_t)bh * T;
            const int32_t *pos_row = pos ? pos + (size_t)b * T : NULL;
            for (int t0 = 0; t0 < T; t0 += QB) {
                int nq = T - t0 < QB ? T - t0 : QB, lo[QB];
                int k0 = attn_doc_lo(pos_row, t0, nq, lo), nk = t0 + nq - k0, e;
                attn_scores_t(&w, q, k, t0, nq, k0, nk, W, hs);
                float mx[QB], inv[QB];
                double sum[QB];
                for (int i = 0; i < nq; i++) {
                    mx[i] = -INFINITY;
                    sum[i] = 0.0;
                }
                e = 0;
                for (int u = 0; u < nk; u++) {
                    float *row = w.st + (size_t)u * QB;
                    int last = attn_last(lo, nq, k0 + u, &e);
                    for (int i = attn_first(k0 + u, t0); i < last; i++) {
                        row[i] *= scale;
                        mx[i] = row[i] > mx[i] ? row[i] : mx[i];
                    }
                }
                e = 0;
                for (int u = 0; u < nk; u++) {
                    float *row = w.st + (size_t)u * QB;
                    int first = attn_first(k0 + u, t0), last = attn_last(lo, nq, k0 + u, &e);
                    for (int i = 0; i < first; i++) row[i] = 0.0f;
                    for (int i = first; i < last; i++) {
                        row[i] = exp_fast(row[i] - mx[i]);
                        sum[i] += (double)row[i];
                    }
                    for (int i = last > first ? last : first; i < nq; i++) row[i] = 0.0f;
                }
                for (int i = 0; i < nq; i++) {
                    inv[i] = (float)(1.0 / sum[i]);
                    l[t0 + i] = (float)((double)mx[i] + log(sum[i]));
                }
                e = 0;
                for (int u = 0; u < nk; u++) {
                    float *row = w.st + (size_t)u * QB;
                    int last = attn_last(lo, nq, k0 + u, &e);
                    for (int i = attn_first(k0 + u, t0); i < last; i++) row[i] *= inv[i];
                }
                /* o[t0..t0+nq) (=) p (nq, nk) @ v[k0..k0+nk) */
                gemm_args g = {
                    .M = nq, .N = hs, .K = nk,
                    .a = w.st, .a_rs = 1, .a_cs = QB,
                    .b = v + (size_t)k0 * W, .b_rs = (size_t)W, .b_cs = 1,
                    .c = o + (size_t)t0 * C, .ldc = (size_t)C, .band = BAND_A_LOWER, .band_off = t0 - k0,
                };
                gemm_block(&g, 0, nq, 0, hs, &w.g);
            }
        }
    }
}

static void cpu_attention_backward(strata_stream *s, void *dqkv_, const void *dout_,
                                   const void *qkv_, const void *out_, const float *lse,
                                   const int32_t *pos, int B, int T, int NH, int NKV, int hs)
{
    float *dqkv = dqkv_;
    const float *dout = dout_, *qkv = qkv_, *out = out_;
    int C = NH * hs, W = (NH + 2 * NKV) * hs, group = NH / NKV;
    float scale = (float)(1.0 / sqrt((double)hs));
    /* one task per (batch, key/value head): its query heads in order, so dK and dV, which
     * the group shares, have one writer and a fixed order of additions */
#pragma omp parallel if (B * NKV > 1 && (long)T * C > 4096)
    {
        attn_scratch w;
        attn_scratch_init(&w, T, 1);
#pragma omp for schedule(static)
        for (int bkv = 0; bkv < B * NKV; bkv++) {
            int b = bkv / NKV, kv = bkv % NKV;
            size_t row0 = (size_t)b * T * W;
            const float *k = qkv + row0 + (size_t)(NH + kv) * hs, *v = qkv + row0 + (size_t)(NH + NKV + kv) * hs;
            float *dk = dqkv + row0 + (size_t)(NH + kv) * hs, *dv = dqkv + row0 + (size_t)(NH + NKV + kv) * hs;
            const int32_t *pos_row = pos ? pos + (size_t)b * T : NULL;
            for (int t = 0; t < T; t++) { /* dK and dV accumulate below */
                memset(dk + (size_t)t * W, 0, (size_t)hs * sizeof(float));
                memset(dv + (size_t)t * W, 0, (size_t)hs * sizeof(float));
            }
            for (int h = kv * group; h < (kv + 1) * group; h++) {
                int bh = b * NH + h;
                size_t ooff = (size_t)b * T * C + (size_t)h * hs;
                const float *q = qkv + row0 + (size_t)h * hs;
                float *dq = dqkv + row0 + (size_t)h * hs;
                const float *o = out + ooff, *dout_bh = dout + ooff;
                const float *l = lse + (size_t)bh * T;
                for (int t0 = 0; t0 < T; t0 += QB) {
                    int nq = T - t0 < QB ? T - t0 : QB, lo[QB];
                    int k0 = attn_doc_lo(pos_row, t0, nq, lo), nk = t0 + nq - k0, e;
                    const float *dob = dout_bh + (size_t)t0 * C;
                    /* probabilities from the saved log-sum-exp */
                    attn_scores_t(&w, q, k, t0, nq, k0, nk, W, hs);
                    e = 0;
                    for (int u = 0; u < nk; u++) {
                        float *row = w.st + (size_t)u * QB;
                        int first = attn_first(k0 + u, t0), last = attn_last(lo, nq, k0 + u, &e);
                        for (int i = 0; i < first; i++) row[i] = 0.0f;
                        for (int i = first; i < last; i++) row[i] = exp_fast(row[i] * scale - l[t0 + i]);
                        for (int i = last > first ? last : first; i < nq; i++) row[i] = 0.0f;
                    }
                    /* dp^T (nk, nq) = v[k0..k0+nk) @ dout block^T */
                    gemm_args gdp = {
                        .M = nk, .N = nq, .K = hs,
                        .a = v + (size_t)k0 * W, .a_rs = (size_t)W, .a_cs = 1,
                        .b = dob, .b_rs = 1, .b_cs = (size_t)C,
                        .c = w.dpt, .ldc = QB, .band = BAND_C_UPPER, .band_off = t0 - k0,
                    };
                    gemm_block(&gdp, 0, nk, 0, nq, &w.g);
                    /* dv[k0..k0+nk) += p^T @ dout block */
                    gemm_args gdv = {
                        .M = nk, .N = hs, .K = nq,
                        .a = w.st, .a_rs = QB, .a_cs = 1,
                        .b = dob, .b_rs = (size_t)C, .b_cs = 1,
                        .c = dv + (size_t)k0 * W, .ldc = (size_t)W, .accumulate = 1, .band = BAND_A_UPPER,
                        .band_off = t0 - k0,
                    };
                    gemm_block(&gdv, 0, nk, 0, hs, &w.g);
                    /* ds^T = scale * p^T * (dp^T - rowsum(dout * out)), in place of p^T */
                    float D[QB];
                    for (int i = 0; i < nq; i++)
                        D[i] = (float)dot_f64(dob + (size_t)i * C, o + (size_t)(t0 + i) * C, (size_t)hs);
                    e = 0;
                    for (int u = 0; u < nk; u++) {
                        float *row = w.st + (size_t)u * QB;
                        const float *dpr = w.dpt + (size_t)u * QB;
                        int last = attn_last(lo, nq, k0 + u, &e);
                        for (int i = attn_first(k0 + u, t0); i < last; i++)
                            row[i] = scale * row[i] * (dpr[i] - D[i]);
                    }
                    /* dq block (=) ds (nq, nk) @ k[k0..k0+nk) */
                    gemm_args gdq = {
                        .M = nq, .N = hs, .K = nk,
                        .a = w.st, .a_rs = 1, .a_cs = QB,
                        .b = k + (size_t)k0 * W, .b_rs = (size_t)W, .b_cs = 1,
                        .c = dq + (size_t)t0 * W, .ldc = (size_t)W, .band = BAND_A_LOWER, .band_off = t0 - k0,
                    };
                    gemm_block(&gdq, 0, nq, 0, hs, &w.g);
                    /* dk[k0..k0+nk) += ds^T @ q block */
                    gemm_args gdk = {
                        .M = nk, .N = hs, .K = nq,
                        .a = w.st, .a_rs = QB, .a_cs = 1,
                        .b = q + (size_t)t0 * W, .b_rs = (size_t)W, .b_cs = 1,
                        .c = dk + (size_t)k0 * W, .ldc = (size_t)W, .accumulate = 1, .band = BAND_A_UPPER,
                        .band_off = t0 - k0,
                    };
                    gemm_block(&gdk, 0, nk, 0, hs, &w.g);
                }
            }
        }
    }
}

/* ---------------------------------------------------------------------------------- */
/* Element-wise                                                                          */

static void cpu_gelu_forward(strata_stream *s, void *out_, const void *inp_, size_t n)
{
    float *out = out_;
    const float *inp = inp_;
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) out[i] = gelu_f(inp[i]);
}

/* dinp may alias dout (the model computes the gradient in place) */
static void cpu_gelu_backward(strata_stream *s, void *dinp_, const void *inp_, const void *dout_,
                              size_t n)
{
    float *dinp = dinp_;
    const float *inp = inp_, *dout = dout_;
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) dinp[i] = dout[i] * gelu_grad_f(inp[i]);
}

static void cpu_residual_forward(strata_stream *s, void *out_, const void *a_, const void *b_,
                                 size_t n)
{
    float *out = out_;
    const float *a = a_, *b = b_;
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) out[i] = a[i] + b[i];
}

static void cpu_add_inplace(strata_stream *s, void *dst_, const void *src_, size_t n)
{
    float *dst = dst_;
    const float *src = src_;
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) dst[i] += src[i];
}

/* ---------------------------------------------------------------------------------- */
/* Cross-entropy                                                                         */

static void cpu_crossentropy(strata_stream *s, float *losses, void *dlogits_,
                             const void *logits_, const int32_t *targets, int N, int V, int Vp,
                             float dloss)
{
    float *dlogits = dlogits_;
    const float *logits = logits_;
#pragma omp parallel for schedule(static) if ((long)N * Vp > PAR_MIN)
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * Vp;
        float *d = dlogits ? dlogits + (size_t)n * Vp : NULL;
        int tgt = targets[n];
        if (tgt < 0) {
            losses[n] = 0.0f;
            if (d) memset(d, 0, (size_t)Vp * sizeof(float));
            continue;
        }
        float xt = x[tgt]; /* read before d (possibly x itself) is overwritten */
        float m = max_f32(x, V);
        double sum;
        if (d) {
            for (int i = 0; i < V; i++) d[i] = exp_fast(x[i] - m);
            sum = sum_f64(d, (size_t)V);
        } else {
            double acc[DLANES] = {0};
            int i = 0;
            for (; i + DLANES <= V; i += DLANES)
                for (int l = 0; l < DLANES; l++) acc[l] += (double)exp_fast(x[i + l] - m);
            sum = 0.0;
            for (int l = 0; l < DLANES; l++) sum += acc[l];
            for (; i < V; i++) sum += (double)exp_fast(x[i] - m);
        }
        losses[n] = (float)((double)m + log(sum) - (double)xt);
        if (d) {
            float f = (float)((double)dloss / sum);
            double pt = (double)d[tgt] / sum;
            for (int i = 0; i < V; i++) d[i] *= f;
            d[tgt] = (float)((pt - 1.0) * (double)dloss);
            for (int i = V; i < Vp; i++) d[i] = 0.0f;
        }
    }
}

static void cpu_loss_accumulate(strata_stream *s, float *acc, const float *losses, int n,
                                float scale)
{
    *acc += (float)((double)scale * sum_f64(losses, n > 0 ? (size_t)n : 0));
}

/* ---------------------------------------------------------------------------------- */
/* Optimizer and utilities                                                               */

/* Elements [i0, i1) in the documented order. sqrtf keeps a loop scalar (its errno path
 * blocks vectorisation without -fno-math-errno), so the square roots run alone in the
 * middle pass over a small block, as vector instructions where the build has them (IEEE
 * square roots are correctly rounded, so the bits are sqrtf's; the scalar pass held a
 * GPT-2 124M step's update at half the speed), and the arithmetic around it vectorises;
 * every operation is still one IEEE operation in the same order. */
#define ADAMW_BLOCK 256

static void sqrt_block(float *x, int n)
{
    int i = 0;
#if defined(__AVX512F__)
    for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, _mm512_sqrt_ps(_mm512_loadu_ps(x + i)));
#elif defined(__AVX__)
    for (; i + 8 <= n; i += 8) _mm256_storeu_ps(x + i, _mm256_sqrt_ps(_mm256_loadu_ps(x + i)));
#endif
    for (; i < n; i++) x[i] = sqrtf(x[i]);
}

static void adamw_span(float *restrict master, float *restrict m, float *restrict v,
                       const float *restrict grad, size_t i0, size_t i1,
                       const strata_adamw_args *a)
{
    const float lr = a->lr, b1 = a->beta1, b2 = a->beta2, eps = a->eps, wd = a->weight_decay;
    const float bc1 = a->bc1, bc2 = a->bc2, gs = a->grad_scale;
    float mhat[ADAMW_BLOCK], root[ADAMW_BLOCK];
    for (size_t j0 = i0; j0 < i1; j0 += ADAMW_BLOCK) {
        int nb = i1 - j0 < ADAMW_BLOCK ? (int)(i1 - j0) : ADAMW_BLOCK;
        float *mb = m + j0, *vb = v + j0, *pb = master + j0;
        const float *gb = grad + j0;
        for (int i = 0; i < nb; i++) {
            float g = gb[i] * gs;
            float mi = b1 * mb[i] + (1.0f - b1) * g;
            float vi = b2 * vb[i] + (1.0f - b2) * g * g;
            mb[i] = mi;
            vb[i] = vi;
            mhat[i] = mi / bc1;
            root[i] = vi / bc2; /* vhat */
        }
        sqrt_block(root, nb);
        for (int i = 0; i < nb; i++) pb[i] -= lr * (mhat[i] / (root[i] + eps) + wd * pb[i]);
    }
}

#define ADAMW_SPAN 8192

/* exactly the order documented in core/kernels.h; -ffp-contract=off keeps it */
static void cpu_adamw(strata_stream *s, float *master, void *param_out_, const float *grad,
                      float *m, float *v, size_t n, const strata_adamw_args *a)
{
    float *param_out = param_out_;
    size_t spans = (n + ADAMW_SPAN - 1) / ADAMW_SPAN;
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (size_t k = 0; k < spans; k++) {
        size_t i0 = k * ADAMW_SPAN, i1 = i0 + ADAMW_SPAN < n ? i0 + ADAMW_SPAN : n;
        adamw_span(master, m, v, grad, i0, i1, a);
        if (param_out) memcpy(param_out + i0, master + i0, (i1 - i0) * sizeof(float));
    }
}

/* bf16 moments: each ADAMW_BLOCK widened to fp32 (exact), stepped by adamw_span, rounded
 * back to nearest even; the master's update reads the fp32 values, as the header says. */
static void cpu_adamw_bf16(strata_stream *s, float *master, void *param_out_, const float *grad,
                           uint16_t *m, uint16_t *v, size_t n, const strata_adamw_args *a)
{
    float *param_out = param_out_;
    size_t blocks = (n + ADAMW_BLOCK - 1) / ADAMW_BLOCK;
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (size_t k = 0; k < blocks; k++) {
        float tm[ADAMW_BLOCK], tv[ADAMW_BLOCK];
        size_t i0 = k * ADAMW_BLOCK, nb = n - i0 < ADAMW_BLOCK ? n - i0 : ADAMW_BLOCK;
        for (size_t i = 0; i < nb; i++) {
            tm[i] = strata_bf16_to_f32(m[i0 + i]);
            tv[i] = strata_bf16_to_f32(v[i0 + i]);
        }
        adamw_span(master + i0, tm, tv, grad + i0, 0, nb, a);
        for (size_t i = 0; i < nb; i++) {
            m[i0 + i] = strata_f32_to_bf16(tm[i]);
            v[i0 + i] = strata_f32_to_bf16(tv[i]);
        }
        if (param_out) memcpy(param_out + i0, master + i0, nb * sizeof(float));
    }
}

/* One quantization block [b0, b1) of an 8-bit range: every quantized piece of the segments in
 * it dequantized with the block's old absmax, stepped by adamw_span in fp32 (its weight decay
 * by segment), then the block's new absmax over those pieces and their codes. */
static void adamw_q8_block(float *master, float *param_out, const float *grad, uint8_t *c1, uint8_t *c2,
                           float *absmax1, float *absmax2, size_t b0, size_t b1, const strata_adamw_segment *seg,
                           int n_seg, const strata_adamw_args *a)
{
    const strata_q8_map *qs = strata_q8_signed(), *qu = strata_q8_unsigned();
    float tm[STRATA_Q8_BLOCK], tv[STRATA_Q8_BLOCK];
    size_t blk = b0 / STRATA_Q8_BLOCK;
    float old1 = absmax1[blk], old2 = absmax2[blk], new1 = 0.0f, new2 = 0.0f;
    for (int i = 0; i < n_seg; i++) {
        size_t lo = seg[i].lo > b0 ? seg[i].lo : b0, hi = seg[i].lo + seg[i].n < b1 ? seg[i].lo + seg[i].n : b1;
        if (!seg[i].quant || lo >= hi) continue;
        strata_adamw_args sa = *a;
        if (!seg[i].decay) sa.weight_decay = 0.0f;
        strata_q8_dequantize(qs, c1 + lo, hi - lo, old1, tm + (lo - b0));
        strata_q8_dequantize(qu, c2 + lo, hi - lo, old2, tv + (lo - b0));
        adamw_span(master + b0, tm, tv, grad + b0, lo - b0, hi - b0, &sa);
        if (param_out) memcpy(param_out + lo, master + lo, (hi - lo) * sizeof(float));
        float x1 = strata_q8_absmax(tm + (lo - b0), hi - lo), x2 = strata_q8_absmax(tv + (lo - b0), hi - lo);
        new1 = x1 > new1 ? x1 : new1;
        new2 = x2 > new2 ? x2 : new2;
    }
    absmax1[blk] = new1;
    absmax2[blk] = new2;
    for (int i = 0; i < n_seg; i++) {
        size_t lo = seg[i].lo > b0 ? seg[i].lo : b0, hi = seg[i].lo + seg[i].n < b1 ? seg[i].lo + seg[i].n : b1;
        if (!seg[i].quant || lo >= hi) continue;
        strata_q8_quantize(qs, tm + (lo - b0), hi - lo, new1, c1 + lo);
        strata_q8_quantize(qu, tv + (lo - b0), hi - lo, new2, c2 + lo);
    }
}

/* Blocks are independent: one OpenMP item each. */
static void cpu_adamw_q8(strata_stream *s, float *master, void *param_out, const float *grad, uint8_t *m1,
                         uint8_t *m2, float *absmax1, float *absmax2, size_t n, const strata_adamw_segment *seg,
                         int n_seg, const strata_adamw_args *a)
{
    size_t blocks = strata_q8_blocks(n);
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (size_t b = 0; b < blocks; b++) {
        size_t b0 = b * STRATA_Q8_BLOCK, b1 = b0 + STRATA_Q8_BLOCK < n ? b0 + STRATA_Q8_BLOCK : n;
        adamw_q8_block(master, param_out, grad, m1, m2, absmax1, absmax2, b0, b1, seg, n_seg, a);
    }
}

/* sumsq splits x into SUMSQ_CHUNKS pieces whose bounds depend only on n, so the
 * partial sums, and their in-order total, do not depend on the thread count. */
#define SUMSQ_CHUNKS 64

static void cpu_sumsq(strata_stream *s, double *out, const float *x, size_t n)
{
    double part[SUMSQ_CHUNKS];
    size_t chunk = (n + SUMSQ_CHUNKS - 1) / SUMSQ_CHUNKS;
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (int c = 0; c < SUMSQ_CHUNKS; c++) {
        size_t i0 = (size_t)c * chunk, i1 = i0 + chunk < n ? i0 + chunk : n;
        part[c] = i0 < i1 ? dot_f64(x + i0, x + i0, i1 - i0) : 0.0;
    }
    double total = 0.0;
    for (int c = 0; c < SUMSQ_CHUNKS; c++) total += part[c];
    *out += total;
}

static void cpu_accumulate_f32(strata_stream *s, float *dst, const void *src,
                               strata_dtype src_dtype, size_t n)
{
    if (src_dtype == STRATA_BF16) {
        const uint16_t *h = src;
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
        for (size_t i = 0; i < n; i++) dst[i] += strata_bf16_to_f32(h[i]);
    } else {
        const float *f = src;
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
        for (size_t i = 0; i < n; i++) dst[i] += f[i];
    }
}

static void cpu_convert(strata_stream *s, void *dst, strata_dtype dst_dtype, const void *src,
                        strata_dtype src_dtype, size_t n)
{
    if (dst_dtype == src_dtype) {
        if (dst != src) memcpy(dst, src, n * (dst_dtype == STRATA_BF16 ? 2 : 4));
    } else if (dst_dtype == STRATA_BF16) {
        uint16_t *h = dst;
        const float *f = src;
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
        for (size_t i = 0; i < n; i++) h[i] = strata_f32_to_bf16(f[i]);
    } else {
        float *f = dst;
        const uint16_t *h = src;
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
        for (size_t i = 0; i < n; i++) f[i] = strata_bf16_to_f32(h[i]);
    }
}

static void cpu_scale_f32(strata_stream *s, float *x, float scale, size_t n)
{
#pragma omp parallel for schedule(static) if (n > PAR_MIN)
    for (size_t i = 0; i < n; i++) x[i] *= scale;
}

/* ---------------------------------------------------------------------------------- */
/* RMSNorm                                                                               */
/*
 * Vector v of the N * heads starts at element (v / heads) * ld + (v % heads) * C, and
 * rstd[v] is its statistic; elements between vectors are neither read nor written. The
 * arithmetic follows transformers' LlamaRMSNorm in fp32 (x.pow(2).mean(-1), then
 * torch.rsqrt(variance + eps), then weight * (x * rstd)): the mean of squares is summed in
 * double and rounded once to float (PyTorch's fp32 sum lands within an ulp or two of it),
 * then 1.0f / sqrtf(mean + eps) and w * (x * rstd), one fp32 rounding a step as there.
 * out may be inp (each vector is read whole before it is written). */

static inline size_t rms_offset(long v, int heads, int C, int ld)
{
    return (size_t)(v / heads) * (size_t)ld + (size_t)(v % heads) * (size_t)C;
}

static void cpu_rmsnorm_forward(strata_stream *s, void *out_, float *rstd, const void *inp_,
                                const void *w_, int N, int heads, int C, int ld, float eps)
{
    float *out = out_;
    const float *inp = inp_, *w = w_;
    long nv = (long)N * heads;
#pragma omp parallel for schedule(static) if (nv * C > PAR_MIN)
    for (long v = 0; v < nv; v++) {
        size_t off = rms_offset(v, heads, C, ld);
        const float *x = inp + off;
        float *o = out + off;
        float ms = (float)(dot_f64(x, x, (size_t)C) / C);
        float rs = 1.0f / sqrtf(ms + eps);
        for (int c = 0; c < C; c++) o[c] = w[c] * (x[c] * rs);
        rstd[v] = rs;
    }
}

/* With norm = x * rstd and dnorm = w * dout: dinp = rstd * (dnorm - norm * mean(dnorm * norm))
 * (LayerNorm's backward without the mean terms), dw = sum over vectors of dout * norm. */
static void cpu_rmsnorm_backward(strata_stream *s, void *dinp_, float *dw, const void *dout_,
                                 const void *inp_, const void *w_, const float *rstd, int N,
                                 int heads, int C, int ld)
{
    float *dinp = dinp_;
    const float *dout = dout_, *inp = inp_, *w = w_;
    long nv = (long)N * heads;
    int par = nv * C > PAR_MIN;
#pragma omp parallel for schedule(static) if (par)
    for (long v = 0; v < nv; v++) {
        size_t off = rms_offset(v, heads, C, ld);
        const float *x = inp + off, *d = dout + off;
        float *di = dinp + off;
        float rs = rstd[v];
        double acc[DLANES] = {0};
        int c = 0;
        for (; c + DLANES <= C; c += DLANES)
            for (int l = 0; l < DLANES; l++) acc[l] += (double)(w[c + l] * d[c + l]) * (x[c + l] * rs);
        double sdn = 0.0;
        for (int l = 0; l < DLANES; l++) sdn += acc[l];
        for (; c < C; c++) sdn += (double)(w[c] * d[c]) * (x[c] * rs);
        float dnmean = (float)(sdn / C);
        for (c = 0; c < C; c++) di[c] += (w[c] * d[c] - (x[c] * rs) * dnmean) * rs;
    }
    /* dw: a thread owns a block of channels and walks the vectors in order */
    int cb = ch_block(C), nblk = (C + cb - 1) / cb;
#pragma omp parallel for schedule(static) if (par)
    for (int blk = 0; blk < nblk; blk++) {
        int c0 = blk * cb, c1 = c0 + cb < C ? c0 + cb : C;
        float acc[CH_BLOCK_MAX];
        for (int c = c0; c < c1; c++) acc[c - c0] = dw[c];
        for (int n = 0; n < N; n++)
            for (int h = 0; h < heads; h++) {
                size_t off = (size_t)n * ld + (size_t)h * C;
                const float *x = inp + off, *d = dout + off;
                float rs = rstd[(size_t)n * heads + h];
                for (int c = c0; c < c1; c++) acc[c - c0] += d[c] * (x[c] * rs);
            }
        for (int c = c0; c < c1; c++) dw[c] = acc[c - c0];
    }
}

/* ---------------------------------------------------------------------------------- */
/* Rotary positions                                                                      */
/*
 * The angle of position t and pair i is (float)t * inv_freq[i] in fp32 and its cosine and
 * sine are cosf and sinf of it, as transformers computes cos and sin in fp32 (its
 * inv_freq @ position_ids is one fp32 product per element); the rotation is then
 * out[i] = x[i] cos - x[i + hs/2] sin, out[i + hs/2] = x[i + hs/2] cos + x[i] sin, which is
 * apply_rotary_pos_emb's q * cos + rotate_half(q) * sin, operation for operation.
 * The angles depend on t and i only, so the (T, hs/2) cosines and sines are a table kept
 * per calling thread and shared by every rotation of a step (q and k, every layer, both
 * directions); it is rebuilt when the rows need a later position or inv_freq's values
 * change, so it never grows inside a step after the first. */

typedef struct rope_table {
    tls_buf tab;  /* cosines (T, half), then sines (T, half) */
    tls_buf freq; /* the inv_freq values the table was built from (half) */
    int T, half;
} rope_table;

static __thread rope_table tls_rope;

/* the caller thread's table for positions [0, T) of inv_freq (half), built if need be */
static const float *rope_cos_sin(const float *inv_freq, int T, int half)
{
    rope_table *r = &tls_rope;
    if (r->half == half && r->T >= T && !memcmp(r->freq.p, inv_freq, (size_t)half * sizeof(float)))
        return r->tab.p;
    int Tt = r->half == half && r->T > T ? r->T : T; /* keep the positions it had */
    float *tab = tls_get(&r->tab, 2 * (size_t)Tt * half);
    float *freq = tls_get(&r->freq, (size_t)half);
    memcpy(freq, inv_freq, (size_t)half * sizeof(float));
    float *cs = tab, *sn = tab + (size_t)Tt * half;
#pragma omp parallel for schedule(static) if ((long)Tt * half > 4096)
    for (int t = 0; t < Tt; t++)
        for (int i = 0; i < half; i++) {
            float a = (float)t * freq[i];
            cs[(size_t)t * half + i] = cosf(a);
            sn[(size_t)t * half + i] = sinf(a);
        }
    r->T = Tt;
    r->half = half;
    return tab;
}

/* dir 1 turns by +angle (the forward), -1 by -angle (the backward: the transpose) */
static void rope_turn(float *x, const float *inv_freq, const int32_t *pos, int B, int T, int heads, int hs, int ld,
                      int dir)
{
    if (B <= 0 || T <= 0 || heads <= 0 || hs < 2) return;
    int half = hs / 2;
    long rows = (long)B * T;
    int need = T; /* the table's positions: the rows' own, which decoding puts past T */
    for (long r = 0; pos && r < rows; r++)
        if (pos[r] >= need) need = pos[r] + 1;
    const float *tab = rope_cos_sin(inv_freq, need, half);
    size_t plane = (size_t)tls_rope.T * half;
#pragma omp parallel for schedule(static) if (rows * heads * hs > PAR_MIN)
    for (long r = 0; r < rows; r++) {
        size_t t = (size_t)(pos ? pos[r] : r % T); /* below need */
        const float *cs = tab + t * half, *sn = tab + plane + t * half;
        for (int h = 0; h < heads; h++) {
            float *restrict a = x + (size_t)r * ld + (size_t)h * hs; /* i < hs/2 */
            float *restrict b = a + half;                           /* i + hs/2 */
            if (dir > 0)
                for (int i = 0; i < half; i++) {
                    float x1 = a[i], x2 = b[i];
                    a[i] = x1 * cs[i] - x2 * sn[i];
                    b[i] = x2 * cs[i] + x1 * sn[i];
                }
            else
                for (int i = 0; i < half; i++) {
                    float y1 = a[i], y2 = b[i];
                    a[i] = y1 * cs[i] + y2 * sn[i];
                    b[i] = y2 * cs[i] - y1 * sn[i];
                }
        }
    }
}

static void cpu_rope_forward(strata_stream *s, void *x, const float *inv_freq, const int32_t *pos, int B, int T,
                             int heads, int hs, int ld)
{
    rope_turn(x, inv_freq, pos, B, T, heads, hs, ld, 1);
}

static void cpu_rope_backward(strata_stream *s, void *dx, const float *inv_freq, const int32_t *pos, int B, int T,
                              int heads, int hs, int ld)
{
    rope_turn(dx, inv_freq, pos, B, T, heads, hs, ld, -1);
}

/* ---------------------------------------------------------------------------------- */
/* SwiGLU                                                                                */
/*
 * silu(x) = x sigmoid(x), through e = exp(-|x|), which never overflows: sigmoid(x) is
 * 1 / (1 + e) for x >= 0 and e / (1 + e) below, and 1 - sigmoid(x) the other of the two,
 * so neither side cancels. e is 0 past |x| = 87 (exp_fast would hold it at 1e-38 there):
 * silu(-100) is -0, as PyTorch's x / (1 + exp(-x)) gives, and silu(100) is 100. Selects,
 * not branches, so the loops vectorise. */

static inline float exp_neg_abs(float x)
{
    float ax = fabsf(x);
    float e = exp_poly(-(ax < 87.0f ? ax : 87.0f)); /* exp_fast's bits, one select fewer */
    return ax > 87.0f ? 0.0f : e;
}

static void cpu_swiglu_forward(strata_stream *s, void *out_, const void *gu_, int N, int I)
{
    float *out = out_;
    const float *gu = gu_;
#pragma omp parallel for schedule(static) if ((long)N * I > PAR_MIN)
    for (int n = 0; n < N; n++) {
        const float *g = gu + (size_t)n * 2 * I, *u = g + I;
        float *o = out + (size_t)n * I;
        for (int j = 0; j < I; j++) {
            float x = g[j], e = exp_neg_abs(x);
            float silu = (x >= 0.0f ? x : x * e) / (1.0f + e);
            o[j] = silu * u[j];
        }
    }
}

/* dgate = dout * up * silu'(gate), silu' = sigmoid (1 + x (1 - sigmoid)); dup = dout * silu.
 * A row goes in blocks read whole before they are written, so dgu may alias gu. */
#define SWIGLU_BLOCK 256

static void cpu_swiglu_backward(strata_stream *s, void *dgu_, const void *dout_, const void *gu_, int N,
                                int I)
{
    float *dgu = dgu_;
    const float *dout = dout_, *gu = gu_;
#pragma omp parallel for schedule(static) if ((long)N * I > PAR_MIN)
    for (int n = 0; n < N; n++) {
        const float *g = gu + (size_t)n * 2 * I, *u = g + I, *d = dout + (size_t)n * I;
        float *dg = dgu + (size_t)n * 2 * I, *du = dg + I;
        for (int j0 = 0; j0 < I; j0 += SWIGLU_BLOCK) {
            int nb = I - j0 < SWIGLU_BLOCK ? I - j0 : SWIGLU_BLOCK;
            float bg[SWIGLU_BLOCK], bu[SWIGLU_BLOCK];
            for (int j = 0; j < nb; j++) {
                float x = g[j0 + j], e = exp_neg_abs(x), r = 1.0f / (1.0f + e);
                float sig = (x >= 0.0f ? 1.0f : e) * r, sig_c = (x >= 0.0f ? e : 1.0f) * r;
                float dj = d[j0 + j];
                bg[j] = dj * u[j0 + j] * (sig * (1.0f + x * sig_c));
                bu[j] = dj * (x * sig);
            }
            memcpy(dg + j0, bg, (size_t)nb * sizeof(float));
            memcpy(du + j0, bu, (size_t)nb * sizeof(float));
        }
    }
}

const strata_kernels strata_kernels_cpu = {
    .encoder_forward = cpu_encoder_forward,
    .encoder_backward = cpu_encoder_backward,
    .layernorm_forward = cpu_layernorm_forward,
    .layernorm_backward = cpu_layernorm_backward,
    .matmul_forward = cpu_matmul_forward,
    .matmul_backward = cpu_matmul_backward,
    .attention_forward = cpu_attention_forward,
    .attention_backward = cpu_attention_backward,
    .gelu_forward = cpu_gelu_forward,
    .gelu_backward = cpu_gelu_backward,
    .residual_forward = cpu_residual_forward,
    .add_inplace = cpu_add_inplace,
    .crossentropy = cpu_crossentropy,
    .loss_accumulate = cpu_loss_accumulate,
    .adamw = cpu_adamw,
    .adamw_bf16 = cpu_adamw_bf16,
    .adamw_q8 = cpu_adamw_q8,
    .sumsq = cpu_sumsq,
    .accumulate_f32 = cpu_accumulate_f32,
    .convert = cpu_convert,
    .scale_f32 = cpu_scale_f32,
    .rmsnorm_forward = cpu_rmsnorm_forward,
    .rmsnorm_backward = cpu_rmsnorm_backward,
    .rope_forward = cpu_rope_forward,
    .rope_backward = cpu_rope_backward,
    .swiglu_forward = cpu_swiglu_forward,
    .swiglu_backward = cpu_swiglu_backward,
};
