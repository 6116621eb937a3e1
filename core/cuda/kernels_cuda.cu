/* core/cuda/kernels_cuda.cu: the CUDA backend of core/kernels.h. Activations and parameters
 * are bf16 (__nv_bfloat16); every sum is accumulated in fp32 (double where the CPU
 * oracle uses double for a whole-tensor total); weight gradients, LayerNorm statistics,
 * attention log-sum-exp and losses are fp32, as the header prescribes.
 *
 * Matrix products go through cuBLASLt: one handle per device and one 32 MiB workspace,
 * both made at device open. A product's descriptors and the algorithm the heuristic
 * picks are cached per shape (and per pointer alignment, which limits the algorithms),
 * so a step after the first creates nothing. Only the compute stream uses the shared
 * workspace; a product enqueued on another stream runs without one, so two streams never
 * race on it. The forward's bias (and bias+GELU, via the GELU_AUX_BIAS epilogue: D gets
 * gelu, the aux matrix the pre-activation) is fused; weight gradients are accumulated
 * straight into fp32 (C = D fp32, beta = 1, bf16 inputs).
 *
 * Attention is computed without a T x T buffer: the forward streams key tiles through
 * shared memory with an online softmax (four threads per query, fp32 state) and saves
 * the row log-sum-exp; the backward recomputes probabilities from it in two passes, dQ
 * (per query) and dK/dV (per key), so every output element has one writer and needs no
 * atomics. These run on the CUDA cores. STRATA_ATTENTION=tc selects FlashAttention-2
 * style kernels on the tensor cores instead (mma.sync, head sizes 64 and 128), with the
 * same contract and the same one-writer, atomic-free backward.
 *
 * Kernels have no status to return, so a failed launch or cuBLASLt call is fatal and
 * names the kernel; CUDA's asynchronous errors surface at the next synchronisation. */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "core/cuda/cuda_common.h"

typedef __nv_bfloat16 bf16;

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f
#define LT_WORKSPACE_BYTES ((size_t)32 << 20) /* cuBLASLt's advice for Hopper */
#define PLAN_MAX 128

/* a kernel launch's status: out of memory is a recorded device fault (core/cuda/cuda_common.h) */
#define LAUNCH_CHECK(what) CUDA_LAUNCH_CHECK(what)

/* ---------------------------------------------------------------------------------- */
/* Scalar helpers                                                                        */

__device__ __forceinline__ float ld(bf16 x) { return __bfloat162float(x); }

/* Round to nearest even, NaN kept quiet: bit for bit the CPU oracle's conversion. */
__device__ __forceinline__ bf16 to_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    uint16_t h;
    if ((u & 0x7fffffffu) > 0x7f800000u) h = (uint16_t)((u >> 16) | 0x0040u);
    else h = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return __ushort_as_bfloat16(h);
}

/* GELU, tanh form, as x * sigmoid(2u), like the CPU oracle */
#define GELU_K0 0.7978845608028654f
#define GELU_K1 0.044715f

__device__ __forceinline__ float gelu_f(float x) {
    float u = GELU_K0 * (x + GELU_K1 * x * x * x);
    return x / (1.0f + expf(-2.0f * u));
}

__device__ __forceinline__ float gelu_grad_f(float x) {
    float x2 = x * x;
    float u = GELU_K0 * (x + GELU_K1 * x2 * x);
    float s = 1.0f / (1.0f + expf(-2.0f * u));
    float du = GELU_K0 * (1.0f + 3.0f * GELU_K1 * x2);
    return s + 2.0f * x * s * (1.0f - s) * du;
}

__device__ __forceinline__ float warp_sum(float v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

__device__ __forceinline__ double warp_sum_d(double v) {
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    return v;
}

/* Sum over a block of at most 1024 threads; every thread gets the total. */
__device__ double block_sum_d(double v) {
    __shared__ double part[32];
    __shared__ double total;
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nwarps = (blockDim.x + 31) >> 5;
    v = warp_sum_d(v);
    if (lane == 0) part[warp] = v;
    __syncthreads();
    if (warp == 0) {
        double x = lane < nwarps ? part[lane] : 0.0;
        x = warp_sum_d(x);
        if (lane == 0) total = x;
    }
    __syncthreads();
    double r = total;
    __syncthreads(); /* part/total may be reused by a second call */
    return r;
}

#define EW_THREADS 256

static unsigned grid_for(size_t n, int threads) {
    size_t blocks = (n + (size_t)threads - 1) / (size_t)threads;
    const size_t cap = (size_t)1 << 20; /* grid-stride loops cover the rest */
    if (blocks < 1) blocks = 1;
    return (unsigned)(blocks < cap ? blocks : cap);
}

static int aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

#define GRID_STRIDE(i, n)                                                                 \
    for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x; i < (n);               \
         i += (size_t)gridDim.x * blockDim.x)

/* ---------------------------------------------------------------------------------- */
/* Element-wise: out[i] = op(a[i], b[i]) over bf16, in packs of 8 (16-byte loads) when    */
/* every pointer allows it. out may alias a or b: each element is read, then written,   */
/* by one thread.                                                                        */

struct op_gelu_fwd {
    __device__ float operator()(float x, float) const { return gelu_f(x); }
};
struct op_gelu_bwd { /* a = inp, b = dout */
    __device__ float operator()(float x, float d) const { return d * gelu_grad_f(x); }
};
struct op_add {
    __device__ float operator()(float x, float y) const { return x + y; }
};

template <class Op>
__global__ void ew_bf16_kernel(bf16 *out, const bf16 *a, const bf16 *b, size_t n, int vec, Op op) {
    size_t done = 0;
    if (vec) {
        size_t packs = n / 8;
        GRID_STRIDE(p, packs) {
            uint4 ra = ((const uint4 *)a)[p], rb = ((const uint4 *)b)[p], ro;
            const bf16 *ea = (const bf16 *)&ra, *eb = (const bf16 *)&rb;
            bf16 *eo = (bf16 *)&ro;
#pragma unroll
            for (int k = 0; k < 8; k++) eo[k] = to_bf16(op(ld(ea[k]), ld(eb[k])));
            ((uint4 *)out)[p] = ro;
        }
        done = packs * 8;
    }
    size_t tail = n - done;
    GRID_STRIDE(i, tail) out[done + i] = to_bf16(op(ld(a[done + i]), ld(b[done + i])));
}

template <class Op>
static void ew_bf16(strata_stream *s, const char *what, void *out, const void *a, const void *b,
                    size_t n, Op op) {
    if (!n) return;
    cudaStream_t st = strata_cuda_stream_handle(s);
    int vec = aligned16(out) && aligned16(a) && aligned16(b);
    size_t work = vec ? n / 8 + (n & 7) : n;
    ew_bf16_kernel<<<grid_for(work, EW_THREADS), EW_THREADS, 0, st>>>(
        (bf16 *)out, (const bf16 *)a, (const bf16 *)b, n, vec, op);
    LAUNCH_CHECK(what);
}

static void cuda_gelu_forward(strata_stream *s, void *out, const void *inp, size_t n) {
    ew_bf16(s, "gelu_forward", out, inp, inp, n, op_gelu_fwd());
}

/* dinp may alias dout (the model computes the gradient in place) */
static void cuda_gelu_backward(strata_stream *s, void *dinp, const void *inp, const void *dout,
                               size_t n) {
    ew_bf16(s, "gelu_backward", dinp, inp, dout, n, op_gelu_bwd());
}

static void cuda_residual_forward(strata_stream *s, void *out, const void *a, const void *b, size_t n) {
    ew_bf16(s, "residual_forward", out, a, b, n, op_add());
}

static void cuda_add_inplace(strata_stream *s, void *dst, const void *src, size_t n) {
    ew_bf16(s, "add_inplace", dst, dst, src, n, op_add());
}

/* ---------------------------------------------------------------------------------- */
/* Encoder                                                                               */

__global__ void encoder_fwd_kernel(bf16 *out, const int32_t *tok, const bf16 *wte,
                                   const bf16 *wpe, int T, int C, size_t n) {
    GRID_STRIDE(i, n) {
        size_t bt = i / (size_t)C;
        int c = (int)(i % (size_t)C), t = (int)(bt % (size_t)T);
        out[i] = to_bf16(ld(wte[(size_t)tok[bt] * C + c]) + ld(wpe[(size_t)t * C + c]));
    }
}

static void cuda_encoder_forward(strata_stream *s, void *out, const int32_t *tok, const void *wte,
                                 const void *wpe, int B, int T, int C) {
    size_t n = (size_t)B * T * C;
    if (!n) return;
    encoder_fwd_kernel<<<grid_for(n, EW_THREADS), EW_THREADS, 0, strata_cuda_stream_handle(s)>>>(
        (bf16 *)out, tok, (const bf16 *)wte, (const bf16 *)wpe, T, C, n);
    LAUNCH_CHECK("encoder_forward");
}

/* Repeated tokens meet in dwte, and the B rows of a position in dwpe: fp32 atomics. */
__global__ void encoder_bwd_kernel(float *dwte, float *dwpe, const bf16 *dout, const int32_t *tok,
                                   int T, int C, size_t n) {
    GRID_STRIDE(i, n) {
        size_t bt = i / (size_t)C;
        int c = (int)(i % (size_t)C), t = (int)(bt % (size_t)T);
        float d = ld(dout[i]);
        atomicAdd(dwte + (size_t)tok[bt] * C + c, d);
        atomicAdd(dwpe + (size_t)t * C + c, d);
    }
}

static void cuda_encoder_backward(strata_stream *s, float *dwte, float *dwpe, const void *dout,
                                  const int32_t *tok, int B, int T, int C) {
    size_t n = (size_t)B * T * C;
    if (!n) return;
    encoder_bwd_kernel<<<grid_for(n, EW_THREADS), EW_THREADS, 0, strata_cuda_stream_handle(s)>>>(
        dwte, dwpe, (const bf16 *)dout, tok, T, C, n);
    LAUNCH_CHECK("encoder_backward");
}

/* ---------------------------------------------------------------------------------- */
/* LayerNorm: one warp per row                                                          */

#define LN_WARPS 8

__global__ void ln_fwd_kernel(bf16 *out, float *mean, float *rstd, const bf16 *inp, const bf16 *w,
                              const bf16 *b, int N, int C) {
    int row = blockIdx.x * LN_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const bf16 *x = inp + (size_t)row * C;
    bf16 *o = out + (size_t)row * C;
    float sum = 0.0f;
    for (int c = lane; c < C; c += 32) sum += ld(x[c]);
    float m = warp_sum(sum) / (float)C;
    float var = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float d = ld(x[c]) - m;
        var += d * d;
    }
    float rs = rsqrtf(warp_sum(var) / (float)C + 1e-5f);
    for (int c = lane; c < C; c += 32) o[c] = to_bf16((ld(x[c]) - m) * rs * ld(w[c]) + ld(b[c]));
    if (lane == 0) {
        mean[row] = m;
        rstd[row] = rs;
    }
}

static void cuda_layernorm_forward(strata_stream *s, void *out, float *mean, float *rstd,
                                   const void *inp, const void *w, const void *b, int N, int C) {
    if (N <= 0 || C <= 0) return;
    ln_fwd_kernel<<<(N + LN_WARPS - 1) / LN_WARPS, LN_WARPS * 32, 0, strata_cuda_stream_handle(s)>>>(
        (bf16 *)out, mean, rstd, (const bf16 *)inp, (const bf16 *)w, (const bf16 *)b, N, C);
    LAUNCH_CHECK("layernorm_forward");
}

/* dinp (+=), one warp per row */
__global__ void ln_bwd_dinp_kernel(bf16 *dinp, const bf16 *dout, const bf16 *inp, const bf16 *w,
                                   const float *mean, const float *rstd, int N, int C) {
    int row = blockIdx.x * LN_WARPS + (threadIdx.x >> 5), lane = threadIdx.x & 31;
    if (row >= N) return;
    const bf16 *x = inp + (size_t)row * C, *d = dout + (size_t)row * C;
    bf16 *di = dinp + (size_t)row * C;
    float m = mean[row], rs = rstd[row];
    float sd = 0.0f, sdn = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float norm = (ld(x[c]) - m) * rs, dnorm = ld(w[c]) * ld(d[c]);
        sd += dnorm;
        sdn += dnorm * norm;
    }
    float dmean = warp_sum(sd) / (float)C, dnmean = warp_sum(sdn) / (float)C;
    for (int c = lane; c < C; c += 32) {
        float norm = (ld(x[c]) - m) * rs, dnorm = ld(w[c]) * ld(d[c]);
        di[c] = to_bf16(ld(di[c]) + (dnorm - dmean - norm * dnmean) * rs);
    }
}

/* Column reductions (dw, db, dbias): a block owns 32 columns and COL_ROWS rows; its
 * 8 row-lanes' partial sums meet in shared memory and go out with one atomic each. */
#define COL_ROWS 128

__global__ void ln_bwd_dwdb_kernel(float *dw, float *db, const bf16 *dout, const bf16 *inp,
                                   const float *mean, const float *rstd, int N, int C) {
    __shared__ float sw[8][33], sb[8][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    int r0 = blockIdx.y * COL_ROWS, r1 = min(N, r0 + COL_ROWS);
    float aw = 0.0f, ab = 0.0f;
    if (c < C) {
        for (int r = r0 + threadIdx.y; r < r1; r += 8) {
            float d = ld(dout[(size_t)r * C + c]);
            aw += (ld(inp[(size_t)r * C + c]) - mean[r]) * rstd[r] * d;
            ab += d;
        }
    }
    sw[threadIdx.y][threadIdx.x] = aw;
    sb[threadIdx.y][threadIdx.x] = ab;
    __syncthreads();
    if (threadIdx.y == 0 && c < C) {
        for (int y = 1; y < 8; y++) {
            aw += sw[y][threadIdx.x];
            ab += sb[y][threadIdx.x];
        }
        atomicAdd(dw + c, aw);
        atomicAdd(db + c, ab);
    }
}

static void cuda_layernorm_backward(strata_stream *s, void *dinp, float *dw, float *db,
                                    const void *dout, const void *inp, const void *w,
                                    const float *mean, const float *rstd, int N, int C) {
    if (N <= 0 || C <= 0) return;
    cudaStream_t st = strata_cuda_stream_handle(s);
    ln_bwd_dinp_kernel<<<(N + LN_WARPS - 1) / LN_WARPS, LN_WARPS * 32, 0, st>>>(
        (bf16 *)dinp, (const bf16 *)dout, (const bf16 *)inp, (const bf16 *)w, mean, rstd, N, C);
    LAUNCH_CHECK("layernorm_backward (dinp)");
    dim3 grid((C + 31) / 32, (N + COL_ROWS - 1) / COL_ROWS), block(32, 8);
    ln_bwd_dwdb_kernel<<<grid, block, 0, st>>>(dw, db, (const bf16 *)dout, (const bf16 *)inp, mean,
                                                rstd, N, C);
    LAUNCH_CHECK("layernorm_backward (dw, db)");
}

/* out (N) += column sums of x (M,N) */
__global__ void colsum_kernel(float *out, const bf16 *x, int M, int N) {
    __shared__ float part[8][33];
    int c = blockIdx.x * 32 + threadIdx.x;
    int r0 = blockIdx.y * COL_ROWS, r1 = min(M, r0 + COL_ROWS);
    float acc = 0.0f;
    if (c < N)
        for (int r = r0 + threadIdx.y; r < r1; r += 8) acc += ld(x[(size_t)r * N + c]);
    part[threadIdx.y][threadIdx.x] = acc;
    __syncthreads();
    if (threadIdx.y == 0 && c < N) {
        for (int y = 1; y < 8; y++) acc += part[y][threadIdx.x];
        atomicAdd(out + c, acc);
    }
}

/* ---------------------------------------------------------------------------------- */
/* cuBLASLt                                                                              */

/* Everything that selects descriptors and an algorithm. Row-major tensors are handed to
 * cuBLASLt as their column-major transposes, so m/n/k below are in that view. */
typedef struct gemm_key {
    int m, n, k;
    int ta, tb;             /* cublasOperation_t of A and B */
    int lda, ldb, ldd;
    int d_f32;              /* C = D fp32 (weight gradients) instead of bf16 */
    int epilogue;           /* cublasLtEpilogue_t */
    int align[5];           /* byte alignment of A, B, D, bias, aux (1..256) */
    int use_workspace;
} gemm_key;

typedef struct gemm_plan {
    gemm_key key;
    cublasLtMatmulDesc_t desc;
    cublasLtMatrixLayout_t la, lb, ld;
    cublasLtMatmulAlgo_t algo;
    int found; /* 0: the heuristic offered nothing for this key */
} gemm_plan;

struct strata_cuda_kstate {
    int ordinal;
    cublasLtHandle_t lt;
    void *workspace;
    pthread_mutex_t mu; /* the plan cache, and descriptor pointers set per call */
    gemm_plan plans[PLAN_MAX];
    int n_plans, next_evict;
};

#define LT_CHECK(call)                                                                    \
    do {                                                                                  \
        cublasStatus_t lt_st_ = (call);                                                   \
        if (lt_st_ != CUBLAS_STATUS_SUCCESS)                                              \
            strata_panic(__FILE__, __LINE__, "%s failed: %s", #call,                      \
                         cublasLtGetStatusString(lt_st_));                                \
    } while (0)

int strata_cuda_kstate_create(int ordinal, strata_cuda_kstate **out) {
    strata_cuda_kstate *ks = (strata_cuda_kstate *)strata_xcalloc(1, sizeof *ks);
    ks->ordinal = ordinal;
    cublasStatus_t st = cublasLtCreate(&ks->lt);
    if (st != CUBLAS_STATUS_SUCCESS) {
        free(ks);
        return strata_fail("cublasLtCreate on cuda:%d failed: %s", ordinal, cublasLtGetStatusString(st));
    }
    cudaError_t e = cudaMalloc(&ks->workspace, LT_WORKSPACE_BYTES);
    if (e != cudaSuccess) {
        cublasLtDestroy(ks->lt);
        free(ks);
        return strata_fail("cuBLASLt workspace of %zu MiB on cuda:%d: cudaMalloc failed: %s",
                           LT_WORKSPACE_BYTES >> 20, ordinal, cudaGetErrorString(e));
    }
    pthread_mutex_init(&ks->mu, NULL);
    *out = ks;
    return 0;
}

static void plan_release(gemm_plan *p) {
    cublasLtMatrixLayoutDestroy(p->la);
    cublasLtMatrixLayoutDestroy(p->lb);
    cublasLtMatrixLayoutDestroy(p->ld);
    cublasLtMatmulDescDestroy(p->desc);
}

void strata_cuda_kstate_destroy(strata_cuda_kstate *ks) {
    if (!ks) return;
    for (int i = 0; i < ks->n_plans; i++) plan_release(&ks->plans[i]);
    cudaFree(ks->workspace);
    cublasLtDestroy(ks->lt);
    pthread_mutex_destroy(&ks->mu);
    free(ks);
}

static int align_of(const void *p) {
    uintptr_t x = (uintptr_t)p;
    int a = 256;
    while (a > 1 && (x & (uintptr_t)(a - 1))) a >>= 1;
    return a;
}

typedef struct gemm_call {
    int m, n, k;
    cublasOperation_t ta, tb;
    int lda, ldb, ldd;
    const void *a, *b;
    void *d; /* also C when beta != 0 */
    int d_f32;
    float beta;
    const void *bias; /* bf16 (m), or NULL */
    void *aux;        /* bf16 (m,n) with leading dimension ldd: GELU's input, or NULL */
} gemm_call;

static void set_attr(cublasLtMatmulDesc_t desc, cublasLtMatmulDescAttributes_t attr, const void *v,
                     size_t bytes) {
    LT_CHECK(cublasLtMatmulDescSetAttribute(desc, attr, v, bytes));
}

/* The per-call pointers live in the descriptor: set them under the lock that also
 * covers the enqueue. */
static void plan_set_pointers(gemm_plan *p, const gemm_call *g) {
    if (g->bias) set_attr(p->desc, CUBLASLT_MATMUL_DESC_BIAS_POINTER, &g->bias, sizeof g->bias);
    if (g->aux) set_attr(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_POINTER, &g->aux, sizeof g->aux);
}

static gemm_plan *plan_build(strata_cuda_kstate *ks, const gemm_key *key, const gemm_call *g) {
    gemm_plan *p;
    if (ks->n_plans < PLAN_MAX) {
        p = &ks->plans[ks->n_plans++];
    } else { /* a full cache recycles its slots in turn */
        p = &ks->plans[ks->next_evict];
        ks->next_evict = (ks->next_evict + 1) % PLAN_MAX;
        plan_release(p);
    }
    memset(p, 0, sizeof *p);
    p->key = *key;
    cudaDataType_t dt = key->d_f32 ? CUDA_R_32F : CUDA_R_16BF;
    LT_CHECK(cublasLtMatmulDescCreate(&p->desc, CUBLAS_COMPUTE_32F, CUDA_R_32F));
    cublasOperation_t ta = (cublasOperation_t)key->ta, tb = (cublasOperation_t)key->tb;
    set_attr(p->desc, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof ta);
    set_attr(p->desc, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof tb);
    cublasLtEpilogue_t epi = (cublasLtEpilogue_t)key->epilogue;
    set_attr(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE, &epi, sizeof epi);
    if (g->bias) {
        cudaDataType_t bt = CUDA_R_16BF;
        set_attr(p->desc, CUBLASLT_MATMUL_DESC_BIAS_DATA_TYPE, &bt, sizeof bt);
    }
    if (g->aux) {
        int64_t aux_ld = key->ldd;
        int32_t aux_t = CUDA_R_16BF;
        set_attr(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_LD, &aux_ld, sizeof aux_ld);
        set_attr(p->desc, CUBLASLT_MATMUL_DESC_EPILOGUE_AUX_DATA_TYPE, &aux_t, sizeof aux_t);
    }
    plan_set_pointers(p, g);
    int a_rows = key->ta == CUBLAS_OP_N ? key->m : key->k, a_cols = key->ta == CUBLAS_OP_N ? key->k : key->m;
    int b_rows = key->tb == CUBLAS_OP_N ? key->k : key->n, b_cols = key->tb == CUBLAS_OP_N ? key->n : key->k;
    LT_CHECK(cublasLtMatrixLayoutCreate(&p->la, CUDA_R_16BF, a_rows, a_cols, key->lda));
    LT_CHECK(cublasLtMatrixLayoutCreate(&p->lb, CUDA_R_16BF, b_rows, b_cols, key->ldb));
    LT_CHECK(cublasLtMatrixLayoutCreate(&p->ld, dt, key->m, key->n, key->ldd));

    cublasLtMatmulPreference_t pref;
    LT_CHECK(cublasLtMatmulPreferenceCreate(&pref));
    size_t ws = key->use_workspace ? LT_WORKSPACE_BYTES : 0;
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof ws));
    static const cublasLtMatmulPreferenceAttributes_t align_attr[3] = {
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES,
        CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES};
    for (int i = 0; i < 3; i++) {
        uint32_t al = (uint32_t)key->align[i];
        LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, align_attr[i], &al, sizeof al));
    }
    uint32_t al_c = (uint32_t)key->align[2];
    LT_CHECK(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &al_c, sizeof al_c));
    cublasLtMatmulHeuristicResult_t res;
    int found = 0;
    cublasStatus_t st = cublasLtMatmulAlgoGetHeuristic(ks->lt, p->desc, p->la, p->lb, p->ld, p->ld,
                                                       pref, 1, &res, &found);
    cublasLtMatmulPreferenceDestroy(pref);
    if (st == CUBLAS_STATUS_SUCCESS && found > 0) {
        p->algo = res.algo;
        p->found = 1;
    }
    return p;
}

/* Enqueues D = A op B (+ beta C) with the key's epilogue. Returns -1 (nothing enqueued)
 * when cuBLASLt has no algorithm for this combination, so the caller can fall back. */
static int lt_matmul(strata_stream *s, const gemm_call *g) {
    cudaStream_t st = strata_cuda_stream_handle(s);
    strata_cuda_kstate *ks = strata_cuda_kstate_of(s);
    gemm_key key;
    memset(&key, 0, sizeof key); /* keys are compared bytewise */
    key.m = g->m;
    key.n = g->n;
    key.k = g->k;
    key.ta = (int)g->ta;
    key.tb = (int)g->tb;
    key.lda = g->lda;
    key.ldb = g->ldb;
    key.ldd = g->ldd;
    key.d_f32 = g->d_f32;
    key.epilogue = g->aux ? (g->bias ? CUBLASLT_EPILOGUE_GELU_AUX_BIAS : CUBLASLT_EPILOGUE_GELU_AUX)
                          : (g->bias ? CUBLASLT_EPILOGUE_BIAS : CUBLASLT_EPILOGUE_DEFAULT);
    key.align[0] = align_of(g->a);
    key.align[1] = align_of(g->b);
    key.align[2] = align_of(g->d);
    key.align[3] = g->bias ? align_of(g->bias) : 0;
    key.align[4] = g->aux ? align_of(g->aux) : 0;
    key.use_workspace = strata_cuda_is_compute(s);

    pthread_mutex_lock(&ks->mu);
    gemm_plan *p = NULL;
    for (int i = 0; i < ks->n_plans; i++) {
        if (!memcmp(&ks->plans[i].key, &key, sizeof key)) {
            p = &ks->plans[i];
            break;
        }
    }
    if (!p) p = plan_build(ks, &key, g);
    if (!p->found) {
        pthread_mutex_unlock(&ks->mu);
        return -1;
    }
    plan_set_pointers(p, g);
    float alpha = 1.0f, beta = g->beta;
    cublasStatus_t rc = cublasLtMatmul(ks->lt, p->desc, &alpha, g->a, p->la, g->b, p->lb, &beta, g->d,
                                       p->ld, g->d, p->ld, &p->algo,
                                       key.use_workspace ? ks->workspace : NULL,
                                       key.use_workspace ? LT_WORKSPACE_BYTES : 0, st);
    pthread_mutex_unlock(&ks->mu);
    if (rc == CUBLAS_STATUS_ALLOC_FAILED) /* no memory for it: a device fault, as CUDA_CHECK records */
        strata_cuda_record_oom(__FILE__, __LINE__, "cublasLtMatmul", 0, cublasLtGetStatusString(rc));
    else if (rc != CUBLAS_STATUS_SUCCESS)
        strata_panic(__FILE__, __LINE__, "cublasLtMatmul (m %d n %d k %d, epilogue %d, D %s) failed: %s",
                     g->m, g->n, g->k, key.epilogue, g->d_f32 ? "f32" : "bf16",
                     cublasLtGetStatusString(rc));
    return 0;
}

static void lt_matmul_or_die(strata_stream *s, const gemm_call *g, const char *what) {
    if (lt_matmul(s, g))
        strata_panic(__FILE__, __LINE__, "%s: cuBLASLt offers no algorithm for m %d n %d k %d "
                     "(lda %d ldb %d ldd %d, D %s)", what, g->m, g->n, g->k, g->lda, g->ldb, g->ldd,
                     g->d_f32 ? "f32" : "bf16");
}

/* out (M,N) = inp (M,K) @ W + bias. In cuBLASLt's column-major view: out^T (N,M) =
 * W^T (N,K) @ inp^T (K,M), where inp^T is inp as stored (ld K) and W^T is W as stored
 * (ld N) when w_nk == 0, or W stored (N,K) read transposed (ld K) when w_nk == 1. */
static void cuda_matmul_forward(strata_stream *s, void *out, void *gelu_out, const void *inp,
                                const void *w, const void *bias, int M, int K, int N, int w_nk) {
    if (M <= 0 || N <= 0) return;
    gemm_call g;
    memset(&g, 0, sizeof g);
    g.m = N;
    g.n = M;
    g.k = K;
    g.ta = w_nk ? CUBLAS_OP_T : CUBLAS_OP_N;
    g.lda = w_nk ? K : N;
    g.a = w;
    g.tb = CUBLAS_OP_N;
    g.ldb = K;
    g.b = inp;
    g.ldd = N;
    g.bias = bias;
    if (gelu_out) {
        /* GELU_AUX: D receives gelu(x + bias), the aux matrix x + bias itself */
        g.d = gelu_out;
        g.aux = out;
        if (N % 8 == 0 && lt_matmul(s, &g) == 0) return;
        g.aux = NULL; /* no fused algorithm: bias GEMM, then GELU on its own */
    }
    g.d = out;
    lt_matmul_or_die(s, &g, "matmul_forward");
    if (gelu_out) cuda_gelu_forward(s, gelu_out, out, (size_t)M * N);
}

static void cuda_matmul_backward(strata_stream *s, void *dinp, float *dw, float *dbias,
                                 const void *dout, const void *inp, const void *w, int M, int K,
                                 int N, int w_nk) {
    if (M <= 0 || N <= 0 || K <= 0) return;
    gemm_call g;
    if (dinp) {
        /* dinp^T (K,M) = W (K,N) @ dout^T (N,M) */
        memset(&g, 0, sizeof g);
        g.m = K;
        g.n = M;
        g.k = N;
        g.ta = w_nk ? CUBLAS_OP_N : CUBLAS_OP_T;
        g.lda = w_nk ? K : N;
        g.a = w;
        g.tb = CUBLAS_OP_N;
        g.ldb = N;
        g.b = dout;
        g.d = dinp;
        g.ldd = K;
        lt_matmul_or_die(s, &g, "matmul_backward (dinp)");
    }
    memset(&g, 0, sizeof g);
    g.k = M;
    g.d = dw;
    g.d_f32 = 1;
    g.beta = 1.0f;
    if (w_nk == 0) { /* dW^T (N,K) += dout^T (N,M) @ inp (M,K) */
        g.m = N;
        g.n = K;
        g.ta = CUBLAS_OP_N;
        g.lda = N;
        g.a = dout;
        g.tb = CUBLAS_OP_T;
        g.ldb = K;
        g.b = inp;
        g.ldd = N;
    } else { /* dW^T (K,N) += inp^T (K,M) @ dout (M,N) */
        g.m = K;
        g.n = N;
        g.ta = CUBLAS_OP_N;
        g.lda = K;
        g.a = inp;
        g.tb = CUBLAS_OP_T;
        g.ldb = N;
        g.b = dout;
        g.ldd = K;
    }
    lt_matmul_or_die(s, &g, "matmul_backward (dw)");
    if (dbias) {
        dim3 grid((N + 31) / 32, (M + COL_ROWS - 1) / COL_ROWS), block(32, 8);
        colsum_kernel<<<grid, block, 0, strata_cuda_stream_handle(s)>>>(dbias, (const bf16 *)dout, M, N);
        LAUNCH_CHECK("matmul_backward (dbias)");
    }
}

/* ---------------------------------------------------------------------------------- */
/* Attention                                                                             */
/*
 * qkv (B,T,3C): q of head h at [b,t, h*hs .. +hs), k at C + that, v at 2C + that.
 * Scores are kept in the log2 domain (q pre-scaled by scale * log2 e) so exp2f does the
 * exponentials; lse is saved in natural log, as the CPU oracle saves it.
 *
 * A row (a query, or in the dK/dV pass a key) belongs to ATT_SPLIT = 4 adjacent threads,
 * each holding a quarter of its head dimensions in registers, in 4-float chunks
 * interleaved across the four (thread `sub` owns dims 16c + 4 sub .. +3 for every chunk
 * c), so the four read one contiguous 64-byte run of a shared tile row: 16-byte loads,
 * no bank conflicts. A dot product is the four partial sums added by two shuffles. Every
 * lane of a warp runs the shuffles; rows outside the causal mask or past T take part
 * and have their results masked. */

#define ATT_SPLIT 4
#define ATT_ROWS 64                       /* rows per block */
#define ATT_THREADS (ATT_ROWS * ATT_SPLIT) /* 256 */
#define ATT_KT 32                         /* keys per shared tile (forward, dQ) */
#define ATT_QT 16                         /* queries per shared tile (dK/dV) */

__device__ __forceinline__ float quad_sum(float v) {
    v += __shfl_xor_sync(0xffffffffu, v, 1);
    v += __shfl_xor_sync(0xffffffffu, v, 2);
    return v;
}

/* this thread's HS/4 dims of a bf16 row, as fp32, times f */
template <int HS>
__device__ __forceinline__ void load_quarter(float *dst, const bf16 *row, int sub, float f) {
#pragma unroll
    for (int c = 0; c < HS / 16; c++)
#pragma unroll
        for (int e = 0; e < 4; e++) dst[4 * c + e] = ld(row[16 * c + 4 * sub + e]) * f;
}

/* partial dot of this thread's quarter with a shared fp32 row */
template <int HS>
__device__ __forceinline__ float dot_quarter(const float *x, const float *row, int sub) {
    float acc = 0.0f;
#pragma unroll
    for (int c = 0; c < HS / 16; c++) {
        float4 r = *(const float4 *)(row + 16 * c + 4 * sub);
        acc += x[4 * c] * r.x + x[4 * c + 1] * r.y + x[4 * c + 2] * r.z + x[4 * c + 3] * r.w;
    }
    return acc;
}

/* acc[quarter] += f * row[quarter] */
template <int HS>
__device__ __forceinline__ void axpy_quarter(float *acc, float f, const float *row, int sub) {
#pragma unroll
    for (int c = 0; c < HS / 16; c++) {
        float4 r = *(const float4 *)(row + 16 * c + 4 * sub);
        acc[4 * c] += f * r.x;
        acc[4 * c + 1] += f * r.y;
        acc[4 * c + 2] += f * r.z;
        acc[4 * c + 3] += f * r.w;
    }
}

template <int HS>
__device__ __forceinline__ void store_quarter(bf16 *row, const float *x, int sub, float f) {
#pragma unroll
    for (int c = 0; c < HS / 16; c++)
#pragma unroll
        for (int e = 0; e < 4; e++) row[16 * c + 4 * sub + e] = to_bf16(x[4 * c + e] * f);
}

/* keys [k0, k0 + ATT_KT) of head (b,h) into shared memory as fp32; rows past T are zero */
template <int HS>
__device__ __forceinline__ void load_kv_tile(float (*ks)[HS], float (*vs)[HS], const bf16 *base,
                                             size_t C3, int C, int k0, int T) {
    for (int e = threadIdx.x; e < ATT_KT * HS; e += blockDim.x) {
        int j = e / HS, d = e % HS, key = k0 + j;
        float kv = 0.0f, vv = 0.0f;
        if (key < T) {
            const bf16 *kp = base + (size_t)key * C3 + C;
            kv = ld(kp[d]);
            vv = ld(kp[C + d]);
        }
        ks[j][d] = kv;
        vs[j][d] = vv;
    }
}

template <int HS>
__global__ void __launch_bounds__(ATT_THREADS) attn_fwd_kernel(bf16 *out, float *lse, const bf16 *qkv,
                                                               int T, int C, int NH, float qscale) {
    __shared__ __align__(16) float ks[ATT_KT][HS];
    __shared__ __align__(16) float vs[ATT_KT][HS];
    int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    int q0 = (gridDim.x - 1 - blockIdx.x) * ATT_ROWS; /* longest blocks first */
    int sub = threadIdx.x & (ATT_SPLIT - 1), i = q0 + threadIdx.x / ATT_SPLIT;
    int active = i < T;
    size_t C3 = 3 * (size_t)C;
    const bf16 *base = qkv + (size_t)b * T * C3 + (size_t)h * HS;
    float q[HS / 4], o[HS / 4];
    if (active) load_quarter<HS>(q, base + (size_t)i * C3, sub, qscale);
#pragma unroll
    for (int d = 0; d < HS / 4; d++) {
        if (!active) q[d] = 0.0f;
        o[d] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    int kend = min(q0 + ATT_ROWS, T);
    for (int k0 = 0; k0 < kend; k0 += ATT_KT) {
        __syncthreads();
        load_kv_tile<HS>(ks, vs, base, C3, C, k0, T);
        __syncthreads();
        int nvis = active ? min(ATT_KT, i - k0 + 1) : 0; /* keys k0 .. i are visible */
        float sc[ATT_KT], mt = m;
#pragma unroll
        for (int j = 0; j < ATT_KT; j++) {
            sc[j] = quad_sum(dot_quarter<HS>(q, ks[j], sub));
            if (j < nvis) mt = fmaxf(mt, sc[j]);
        }
        if (nvis <= 0) continue;
        float corr = exp2f(m - mt); /* 0 on the first tile, where l and o are 0 */
        l *= corr;
#pragma unroll
        for (int d = 0; d < HS / 4; d++) o[d] *= corr;
#pragma unroll
        for (int j = 0; j < ATT_KT; j++) {
            float p = j < nvis ? exp2f(sc[j] - mt) : 0.0f;
            l += p;
            axpy_quarter<HS>(o, p, vs[j], sub);
        }
        m = mt;
    }
    if (!active) return;
    store_quarter<HS>(out + ((size_t)b * T + i) * C + (size_t)h * HS, o, sub, 1.0f / l);
    if (sub == 0) lse[(size_t)bh * T + i] = m * LN2 + logf(l);
}

/* dq (=), a query per row: p = exp(s - lse), ds = p (dout.v - D) with D = dout.out,
 * dq = scale * sum over visible keys of ds k. */
template <int HS>
__global__ void __launch_bounds__(ATT_THREADS) attn_bwd_dq_kernel(bf16 *dqkv, const bf16 *dout,
                                                                  const bf16 *qkv, const bf16 *out,
                                                                  const float *lse, int T, int C,
                                                                  int NH, float scale, float qscale) {
    __shared__ __align__(16) float ks[ATT_KT][HS];
    __shared__ __align__(16) float vs[ATT_KT][HS];
    int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    int q0 = (gridDim.x - 1 - blockIdx.x) * ATT_ROWS;
    int sub = threadIdx.x & (ATT_SPLIT - 1), i = q0 + threadIdx.x / ATT_SPLIT;
    int active = i < T;
    size_t C3 = 3 * (size_t)C;
    const bf16 *base = qkv + (size_t)b * T * C3 + (size_t)h * HS;
    size_t orow = ((size_t)b * T + i) * C + (size_t)h * HS;
    float q[HS / 4], dq[HS / 4], dov[HS / 4], ov[HS / 4];
    float lse2 = 0.0f;
    if (active) {
        load_quarter<HS>(q, base + (size_t)i * C3, sub, qscale);
        load_quarter<HS>(dov, dout + orow, sub, 1.0f);
        load_quarter<HS>(ov, out + orow, sub, 1.0f);
        lse2 = lse[(size_t)bh * T + i] * LOG2E;
    }
    float D = 0.0f;
#pragma unroll
    for (int d = 0; d < HS / 4; d++) {
        if (!active) q[d] = dov[d] = ov[d] = 0.0f;
        D += dov[d] * ov[d];
        dq[d] = 0.0f;
    }
    D = quad_sum(D);
    int kend = min(q0 + ATT_ROWS, T);
    for (int k0 = 0; k0 < kend; k0 += ATT_KT) {
        __syncthreads();
        load_kv_tile<HS>(ks, vs, base, C3, C, k0, T);
        __syncthreads();
        int nvis = active ? min(ATT_KT, i - k0 + 1) : 0;
        int jmax = min(ATT_KT, kend - k0); /* the same for every lane: shuffles stay converged */
        for (int j = 0; j < jmax; j++) {
            float sc = quad_sum(dot_quarter<HS>(q, ks[j], sub));
            float dp = quad_sum(dot_quarter<HS>(dov, vs[j], sub));
            float ds = j < nvis ? exp2f(sc - lse2) * (dp - D) : 0.0f;
            axpy_quarter<HS>(dq, ds, ks[j], sub);
        }
    }
    if (!active) return;
    store_quarter<HS>(dqkv + ((size_t)b * T + i) * C3 + (size_t)h * HS, dq, sub, scale);
}

/* dk, dv (=), a key per row, over the queries at or after it; query tiles, with their
 * lse and D = dout.out, stream through shared memory. */
template <int HS>
__global__ void __launch_bounds__(ATT_THREADS) attn_bwd_dkv_kernel(bf16 *dqkv, const bf16 *dout,
                                                                   const bf16 *qkv, const bf16 *out,
                                                                   const float *lse, int T, int C,
                                                                   int NH, float scale, float qscale) {
    __shared__ __align__(16) float qs[ATT_QT][HS];
    __shared__ __align__(16) float dos[ATT_QT][HS];
    __shared__ float ls[ATT_QT], Ds[ATT_QT];
    int bh = blockIdx.y, b = bh / NH, h = bh % NH;
    int j0 = blockIdx.x * ATT_ROWS;
    int sub = threadIdx.x & (ATT_SPLIT - 1), j = j0 + threadIdx.x / ATT_SPLIT;
    int active = j < T;
    size_t C3 = 3 * (size_t)C;
    const bf16 *base = qkv + (size_t)b * T * C3 + (size_t)h * HS;
    float kq[HS / 4], vq[HS / 4], dk[HS / 4], dv[HS / 4];
    if (active) {
        load_quarter<HS>(kq, base + (size_t)j * C3 + C, sub, 1.0f);
        load_quarter<HS>(vq, base + (size_t)j * C3 + 2 * C, sub, 1.0f);
    }
#pragma unroll
    for (int d = 0; d < HS / 4; d++) {
        if (!active) kq[d] = vq[d] = 0.0f;
        dk[d] = dv[d] = 0.0f;
    }
    /* D for the tile: 16 lanes per query, HS/16 dims each, reduced by shuffles */
    int dr = threadIdx.x / 16, dpart = threadIdx.x % 16;
    for (int t0 = j0; t0 < T; t0 += ATT_QT) {
        __syncthreads();
        for (int e = threadIdx.x; e < ATT_QT * HS; e += ATT_THREADS) {
            int r = e / HS, d = e % HS, qi = t0 + r;
            float qv = 0.0f, dv_ = 0.0f;
            if (qi < T) {
                qv = ld(base[(size_t)qi * C3 + d]) * qscale;
                dv_ = ld(dout[((size_t)b * T + qi) * C + (size_t)h * HS + d]);
            }
            qs[r][d] = qv;
            dos[r][d] = dv_;
        }
        {
            int qi = t0 + dr;
            float part = 0.0f;
            if (qi < T) {
                size_t orow = ((size_t)b * T + qi) * C + (size_t)h * HS;
                for (int d = dpart; d < HS; d += 16) part += ld(dout[orow + d]) * ld(out[orow + d]);
            }
            for (int o = 8; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
            if (dpart == 0) {
                Ds[dr] = part;
                ls[dr] = qi < T ? lse[(size_t)bh * T + qi] * LOG2E : 0.0f;
            }
        }
        __syncthreads();
        int rmax = min(ATT_QT, T - t0); /* the same for every lane */
        for (int r = 0; r < rmax; r++) {
            float sc = quad_sum(dot_quarter<HS>(kq, qs[r], sub));
            float dp = quad_sum(dot_quarter<HS>(vq, dos[r], sub));
            int visible = active && t0 + r >= j; /* query t0 + r sees key j */
            float p = visible ? exp2f(sc - ls[r]) : 0.0f;
            float ds = p * (dp - Ds[r]);
            axpy_quarter<HS>(dv, p, dos[r], sub);
            axpy_quarter<HS>(dk, ds, qs[r], sub);
        }
    }
    if (!active) return;
    /* qs holds q * scale * log2 e; dk = scale * sum ds q = ln 2 * sum ds qs */
    bf16 *krow = dqkv + ((size_t)b * T + j) * C3 + C + (size_t)h * HS;
    store_quarter<HS>(krow, dk, sub, LN2);
    store_quarter<HS>(krow + C, dv, sub, 1.0f);
}

template <int HS>
static void attention_forward_hs(cudaStream_t st, void *out, float *lse, const void *qkv, int B,
                                 int T, int C, int NH) {
    float scale = 1.0f / sqrtf((float)HS);
    dim3 grid((T + ATT_ROWS - 1) / ATT_ROWS, B * NH);
    attn_fwd_kernel<HS><<<grid, ATT_THREADS, 0, st>>>((bf16 *)out, lse, (const bf16 *)qkv, T, C, NH,
                                                       scale * LOG2E);
    LAUNCH_CHECK("attention_forward");
}

template <int HS>
static void attention_backward_hs(cudaStream_t st, void *dqkv, const void *dout, const void *qkv,
                                  const void *out, const float *lse, int B, int T, int C, int NH) {
    float scale = 1.0f / sqrtf((float)HS);
    dim3 grid((T + ATT_ROWS - 1) / ATT_ROWS, B * NH);
    attn_bwd_dq_kernel<HS><<<grid, ATT_THREADS, 0, st>>>((bf16 *)dqkv, (const bf16 *)dout,
                                                         (const bf16 *)qkv, (const bf16 *)out, lse, T,
                                                         C, NH, scale, scale * LOG2E);
    LAUNCH_CHECK("attention_backward (dq)");
    attn_bwd_dkv_kernel<HS><<<grid, ATT_THREADS, 0, st>>>((bf16 *)dqkv, (const bf16 *)dout,
                                                          (const bf16 *)qkv, (const bf16 *)out, lse, T,
                                                          C, NH, scale, scale * LOG2E);
    LAUNCH_CHECK("attention_backward (dk, dv)");
}

/* ---------------------------------------------------------------------------------- */
/* Attention on tensor cores (STRATA_ATTENTION=tc)                                       */
/*
 * The same contract as the kernels above, computed as FlashAttention-2 style tiles with
 * mma.sync.m16n8k16 (bf16 inputs, fp32 accumulation). A block is TC_WARPS = 4 warps and
 * each warp owns 16 rows (queries in the forward and dQ kernels, keys in the dK/dV
 * kernel), so a row's softmax state and accumulators live in one warp's registers and
 * row reductions are shuffles within a quad of lanes. Tiles of qkv and dout are copied
 * into shared memory with cp.async (double-buffered along the streamed dimension) and
 * read into fragments with ldmatrix.
 *
 * Fragment layouts relied on (PTX ISA, "Matrix Fragments for mma.m16n8k16 with floating
 * point type"); lane = 4 g + t, g = lane / 4 in 0..7, t = lane % 4 in 0..3:
 *   A (16x16, row-major), 4 registers of 2 bf16 (the lower column in the low 16 bits):
 *     a[0] = (row g, cols 2t, 2t+1)     a[1] = (row g+8, cols 2t, 2t+1)
 *     a[2] = (row g, cols 2t+8, 2t+9)   a[3] = (row g+8, cols 2t+8, 2t+9)
 *   B (16x8, k by n), 2 registers:  b[0] = (k 2t, 2t+1; n g)   b[1] = (k 2t+8, 2t+9; n g)
 *   C, D (16x8, fp32):  c[0], c[1] = (row g, cols 2t, 2t+1)   c[2], c[3] = (row g+8, same)
 * So the C fragments of two adjacent 8-column tiles, rounded to bf16 in pairs, are the A
 * fragment of that 16-column slice (tc_c_to_a): P and dS go from one product into the
 * next without a trip through shared memory.
 *   ldmatrix .x4: lanes 8i .. 8i+7 give the row addresses of 8x8 matrix i, and register i
 * receives matrix i with lane 4g + t holding (row g, cols 2t, 2t+1); with .trans it holds
 * (rows 2t, 2t+1; col g). Hence a row-major 16x16 A tile is read with lane l addressing
 * row l % 16, column 8 (l / 16) (tc_frag_a); a B operand stored one n per shared row (K
 * in S = Q K^T) without .trans (tc_frag_b_nmajor); one stored one k per row (V in
 * O = P V) with .trans (tc_frag_b_kmajor).
 *
 * Shared rows are HS + TC_PAD bf16 long. The 16 bytes of padding put the 8 rows of one
 * 8x8 matrix (one ldmatrix phase) in 8 different 4-bank groups, so ldmatrix, the
 * cp.async stores (8 lanes per 128-byte row segment) and the bf16x2 output staging are
 * free of bank conflicts.
 *
 * Forward (attn_tc_fwd_kernel): a block takes 64 queries and streams 64-key tiles of K
 * and V; per row it keeps the running max of the raw scores (m), its scaled copy
 * (mb = m * scale * log2 e, the exponent base) and lane-partial sums of exp2(s*qscale - mb).
 * Backward, three kernels; every output element has one writer (no atomics), so the
 * result is deterministic:
 *   1. attn_tc_bwd_d_kernel: D = dout . out per (row, head), fp32, stored in the first
 *      4 bytes of that row's dq slot of dqkv: dq is written last (kernel 3), so the slot
 *      is free scratch until then and the backward needs no buffer of its own;
 *   2. attn_tc_bwd_dkv_kernel: a block takes 64 keys and streams the query tiles at or
 *      after them: S^T = K Q^T, P^T = exp2(S^T qscale - lse log2 e), dV += P^T dO,
 *      dP^T = V dO^T, dS^T = P^T (dP^T - D), dK += scale dS^T Q;
 *   3. attn_tc_bwd_dq_kernel: a block takes 64 queries, reads their D (before anything
 *      overwrites it: only this block writes these dq slots, at its very end) and streams
 *      key tiles: S, P, dP = dO V^T, dS as above, dQ += scale dS K.
 * Rows past T are zero in shared memory (cp.async zero-fill), so nothing read there is
 * NaN; the causal mask is by index; a query past T gets lse = +inf in the backward, so
 * its P is exactly 0 and it adds nothing to dK and dV.
 *
 * Head sizes 64 and 128 with 16-byte aligned qkv, out, dout and dqkv take this path;
 * anything else runs on the CUDA-core kernels above. */

#include <stdlib.h>

#define TC_WARPS 4
#define TC_THREADS (32 * TC_WARPS) /* 128 */
#define TC_ROWS (16 * TC_WARPS)    /* rows a block owns: 64 */
#define TC_PAD 8                   /* bf16 of padding per shared row */

extern __shared__ __align__(16) unsigned char tc_shared[];

__device__ __forceinline__ uint32_t tc_saddr(const void *p) {
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* 16 bytes global -> shared without passing through registers; src_bytes 0 writes zeros */
__device__ __forceinline__ void tc_cp16(void *dst, const void *src, int src_bytes) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(tc_saddr(dst)), "l"(src),
                 "r"(src_bytes)
                 : "memory");
}
__device__ __forceinline__ void tc_cp_commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }
/* waits until at most N of this thread's committed groups are still in flight */
template <int N>
__device__ __forceinline__ void tc_cp_wait() {
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

__device__ __forceinline__ void tc_ldsm(uint32_t r[4], const bf16 *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(tc_saddr(p))
                 : "memory");
}
__device__ __forceinline__ void tc_ldsm_t(uint32_t r[4], const bf16 *p) {
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(tc_saddr(p))
                 : "memory");
}

/* c (16x8 fp32) += a (16x16 bf16) b (16x8 bf16) */
__device__ __forceinline__ void tc_mma(float c[4], const uint32_t a[4], uint32_t b0, uint32_t b1) {
    asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, "
                 "{%4, %5, %6, %7}, {%8, %9}, {%0, %1, %2, %3};\n"
                 : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
                 : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* two floats as bf16 (round to nearest even), lo in the low 16 bits */
__device__ __forceinline__ uint32_t tc_pack(float lo, float hi) {
    __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
    uint32_t u;
    memcpy(&u, &v, sizeof u);
    return u;
}

/* A fragment of the 16x16 tile at (row0, col0) of a row-major shared tile, stride S */
template <int S>
__device__ __forceinline__ void tc_frag_a(uint32_t a[4], const bf16 *tile, int row0, int col0, int lane) {
    tc_ldsm(a, tile + (row0 + (lane & 15)) * S + col0 + (lane >> 4) * 8);
}

/* B fragments for k0 .. k0+15 of the n tiles n0 (b[0], b[1]) and n0 + 8 (b[2], b[3]),
 * from a shared tile holding one n per row (B[k][n] at tile[n][k]): matrix 0 is rows
 * n0..n0+7 at column k0, matrix 1 the same rows at k0 + 8, matrices 2 and 3 rows n0+8.. */
template <int S>
__device__ __forceinline__ void tc_frag_b_nmajor(uint32_t b[4], const bf16 *tile, int n0, int k0,
                                                 int lane) {
    tc_ldsm(b, tile + (n0 + (lane & 7) + (lane >> 4) * 8) * S + k0 + ((lane >> 3) & 1) * 8);
}

/* the same from a tile holding one k per row (B[k][n] at tile[k][n]), transposed by
 * ldmatrix: matrix 0 is rows k0..k0+7 at column n0, matrix 1 rows k0+8.. at n0,
 * matrices 2 and 3 the same rows at n0 + 8 */
template <int S>
__device__ __forceinline__ void tc_frag_b_kmajor(uint32_t b[4], const bf16 *tile, int k0, int n0,
                                                 int lane) {
    tc_ldsm_t(b, tile + (k0 + (lane & 7) + ((lane >> 3) & 1) * 8) * S + n0 + (lane >> 4) * 8);
}

/* the C fragments of n tiles 2kk (c0) and 2kk + 1 (c1) as the A fragment of slice kk */
__device__ __forceinline__ void tc_c_to_a(uint32_t a[4], const float c0[4], const float c1[4]) {
    a[0] = tc_pack(c0[0], c0[1]);
    a[1] = tc_pack(c0[2], c0[3]);
    a[2] = tc_pack(c1[0], c1[1]);
    a[3] = tc_pack(c1[2], c1[3]);
}

/* rows r0 .. r0 + ROWS - 1 of an HS-wide column block (row stride ld elements) into a
 * shared tile of stride HS + TC_PAD; rows at or past T are zero-filled. Issues cp.async
 * only: the caller commits and waits. */
template <int HS, int ROWS>
__device__ __forceinline__ void tc_load_rows(bf16 *dst, const bf16 *src, size_t ld, int r0, int T) {
    constexpr int CH = HS / 8; /* 16-byte chunks per row */
    static_assert((ROWS * CH) % TC_THREADS == 0, "tile chunks must split evenly over the block");
#pragma unroll
    for (int i = 0; i < ROWS * CH / TC_THREADS; i++) {
        int e = (int)threadIdx.x + i * TC_THREADS, r = e / CH, c = e % CH, row = r0 + r;
        const bf16 *g = src + (size_t)(row < T ? row : T - 1) * ld + c * 8; /* always valid */
        tc_cp16(dst + r * (HS + TC_PAD) + c * 8, g, row < T ? 16 : 0);
    }
}

/* A warp's 16 x HS accumulator (C fragments acc[n] for columns 8n..8n+7), times f[0] on
 * rows g and f[1] on rows g + 8, as bf16 into rows row0 .. row0 + 15 (those below T) of
 * dst (row stride ld), staged through the warp's own 16 shared rows so that global
 * stores are whole 16-byte chunks. */
template <int HS>
__device__ __forceinline__ void tc_store_rows(bf16 *dst, size_t ld, int row0, int T, bf16 *stage,
                                              const float (*acc)[4], const float f[2], int lane) {
    constexpr int S = HS + TC_PAD, CH = HS / 8;
    const int g = lane >> 2, t = lane & 3;
#pragma unroll
    for (int n = 0; n < HS / 8; n++) {
        *(__nv_bfloat162 *)(stage + g * S + 8 * n + 2 * t) =
            __floats2bfloat162_rn(acc[n][0] * f[0], acc[n][1] * f[0]);
        *(__nv_bfloat162 *)(stage + (g + 8) * S + 8 * n + 2 * t) =
            __floats2bfloat162_rn(acc[n][2] * f[1], acc[n][3] * f[1]);
    }
    __syncwarp();
#pragma unroll
    for (int i = 0; i < 16 * CH / 32; i++) {
        int e = lane + 32 * i, r = e / CH, c = e % CH;
        if (row0 + r < T)
            *(uint4 *)(dst + (size_t)(row0 + r) * ld + c * 8) = *(const uint4 *)(stage + r * S + c * 8);
    }
}

/* out (B,T,C), lse (B,NH,T) from qkv (B,T,3C); grid (B*NH, ceil(T/64)), 128 threads,
 * (TC_ROWS + 4 KT) (HS + TC_PAD) bf16 of dynamic shared memory. */
template <int HS, int KT>
__global__ void __launch_bounds__(TC_THREADS) attn_tc_fwd_kernel(bf16 *out, float *lse, const bf16 *qkv,
                                                                 int T, int C, int NH, float qscale) {
    constexpr int S = HS + TC_PAD;
    bf16 *qs = (bf16 *)tc_shared; /* [TC_ROWS][S] queries; each warp stages its output rows here */
    bf16 *ks = qs + TC_ROWS * S;  /* [2][KT][S] key tiles */
    bf16 *vs = ks + 2 * KT * S;   /* [2][KT][S] value tiles */
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * TC_ROWS; /* the longest rows first */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wq = q0 + warp * 16;               /* this warp's first query */
    const int qrow[2] = {wq + g, wq + g + 8};    /* this lane's two queries */
    const size_t C3 = 3 * (size_t)C;
    const bf16 *qg = qkv + (size_t)b * T * C3 + (size_t)h * HS, *kg = qg + C, *vg = qg + 2 * C;
    const int nkt = (min(q0 + TC_ROWS, T) + KT - 1) / KT; /* keys 0 .. min(q0 + 63, T - 1) */

    tc_load_rows<HS, TC_ROWS>(qs, qg, C3, q0, T);
    tc_cp_commit();
    tc_load_rows<HS, KT>(ks, kg, C3, 0, T);
    tc_load_rows<HS, KT>(vs, vg, C3, 0, T);
    tc_cp_commit();
    tc_cp_wait<1>(); /* the queries */
    __syncthreads();
    uint32_t qf[HS / 16][4];
#pragma unroll
    for (int kk = 0; kk < HS / 16; kk++) tc_frag_a<S>(qf[kk], qs, warp * 16, kk * 16, lane);

    float o[HS / 8][4];
#pragma unroll
    for (int n = 0; n < HS / 8; n++) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.0f;
    float m[2] = {-INFINITY, -INFINITY}, mb[2] = {0.0f, 0.0f}, l[2] = {0.0f, 0.0f};

    for (int kt = 0; kt < nkt; kt++) {
        const bf16 *kts = ks + (kt & 1) * KT * S, *vts = vs + (kt & 1) * KT * S;
        if (kt + 1 < nkt) { /* the next tile goes into the other buffer, freed last iteration */
            const int nx = (kt + 1) & 1;
            tc_load_rows<HS, KT>(ks + nx * KT * S, kg, C3, (kt + 1) * KT, T);
            tc_load_rows<HS, KT>(vs + nx * KT * S, vg, C3, (kt + 1) * KT, T);
            tc_cp_commit();
            tc_cp_wait<1>(); /* all but the tile just issued */
        } else {
            tc_cp_wait<0>();
        }
        __syncthreads();

        /* s (16 x KT) = q k^T, raw scores */
        float s[KT / 8][4];
#pragma unroll
        for (int j = 0; j < KT / 8; j++) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HS / 16; kk++)
#pragma unroll
            for (int np = 0; np < KT / 16; np++) {
                uint32_t kb[4];
                tc_frag_b_nmajor<S>(kb, kts, np * 16, kk * 16, lane);
                tc_mma(s[2 * np], qf[kk], kb[0], kb[1]);
                tc_mma(s[2 * np + 1], qf[kk], kb[2], kb[3]);
            }
        /* element (j, e) is query qrow[e / 2], key k0 + 8j + 2t + e % 2 */
        const int k0 = kt * KT;
        if (k0 + KT - 1 > wq) /* the tile reaches past this warp's first query */
#pragma unroll
            for (int j = 0; j < KT / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++)
                    if (k0 + 8 * j + 2 * t + (e & 1) > qrow[e >> 1]) s[j][e] = -INFINITY;

        /* online softmax; a row's max is shared by its quad (lanes 4g .. 4g+3) */
        float corr[2];
#pragma unroll
        for (int r = 0; r < 2; r++) {
            float mx = m[r];
#pragma unroll
            for (int j = 0; j < KT / 8; j++) mx = fmaxf(mx, fmaxf(s[j][2 * r], s[j][2 * r + 1]));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
            mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
            /* a row with nothing visible yet keeps base 0: no inf - inf below */
            const float base = mx == -INFINITY ? 0.0f : mx * qscale;
            corr[r] = exp2f(m[r] * qscale - base); /* 0 while m was -inf (l and o are 0) */
            m[r] = mx;
            mb[r] = base;
            l[r] *= corr[r];
        }
#pragma unroll
        for (int j = 0; j < KT / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                s[j][e] = exp2f(s[j][e] * qscale - mb[e >> 1]); /* masked: exp2(-inf) = 0 */
                l[e >> 1] += s[j][e];
            }
#pragma unroll
        for (int n = 0; n < HS / 8; n++) {
            o[n][0] *= corr[0];
            o[n][1] *= corr[0];
            o[n][2] *= corr[1];
            o[n][3] *= corr[1];
        }
        /* o (16 x HS) += p v */
#pragma unroll
        for (int kk = 0; kk < KT / 16; kk++) {
            uint32_t pa[4];
            tc_c_to_a(pa, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
            for (int np = 0; np < HS / 16; np++) {
                uint32_t vb[4];
                tc_frag_b_kmajor<S>(vb, vts, kk * 16, np * 16, lane);
                tc_mma(o[2 * np], pa, vb[0], vb[1]);
                tc_mma(o[2 * np + 1], pa, vb[2], vb[3]);
            }
        }
        __syncthreads(); /* the next iteration's copy reuses the other buffer */
    }

    float f[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 1);
        l[r] += __shfl_xor_sync(0xffffffffu, l[r], 2);
        f[r] = 1.0f / l[r]; /* l >= 1: the max itself contributes exp2(0) */
    }
    /* the warp's own query rows are free: its fragments were read before the loop */
    tc_store_rows<HS>(out + (size_t)b * T * C + (size_t)h * HS, (size_t)C, wq, T, qs + warp * 16 * S, o, f,
                      lane);
    if (t == 0)
#pragma unroll
        for (int r = 0; r < 2; r++)
            if (qrow[r] < T) lse[(size_t)bh * T + qrow[r]] = mb[r] * LN2 + logf(l[r]);
}

/* Backward 1: D = dout . out for every (b, t, h), fp32, into the first 4 bytes of the
 * dq slot dqkv[b, t, h*HS ..]. HS/8 adjacent lanes share a row, 16 bytes each. */
template <int HS>
__global__ void attn_tc_bwd_d_kernel(bf16 *dqkv, const bf16 *dout, const bf16 *out, size_t rows, int C,
                                     int NH) {
    constexpr int G = HS / 8;
    const size_t e = (size_t)blockIdx.x * blockDim.x + threadIdx.x, rh = e / G;
    const int c = (int)(e % G);
    float d = 0.0f;
    if (rh < rows * NH) {
        const size_t off = (rh / NH) * C + (rh % NH) * HS + (size_t)c * 8;
        const uint4 a = *(const uint4 *)(dout + off), o = *(const uint4 *)(out + off);
        const uint32_t aw[4] = {a.x, a.y, a.z, a.w}, ow[4] = {o.x, o.y, o.z, o.w};
#pragma unroll
        for (int i = 0; i < 4; i++) { /* bf16 -> fp32 is exact: the bits, shifted */
            d += __uint_as_float(aw[i] << 16) * __uint_as_float(ow[i] << 16);
            d += __uint_as_float(aw[i] & 0xffff0000u) * __uint_as_float(ow[i] & 0xffff0000u);
        }
    }
    /* every lane reaches the shuffles: groups of G lanes are whole within a warp */
#pragma unroll
    for (int w = G / 2; w > 0; w >>= 1) d += __shfl_xor_sync(0xffffffffu, d, w);
    if (rh < rows * NH && c == 0) *(float *)(dqkv + (rh / NH) * 3 * (size_t)C + (rh % NH) * HS) = d;
}

/* a query tile's lse (in log2 units, +inf past T) and D (0 past T) into shared memory */
template <int QT>
__device__ __forceinline__ void tc_load_row_stats(float *ls, float *ds, const float *lseg,
                                                  const bf16 *dslot, size_t C3, int q0, int T) {
    if (threadIdx.x < QT) {
        const int qi = q0 + (int)threadIdx.x;
        float lv = INFINITY, dv = 0.0f;
        if (qi < T) {
            lv = lseg[qi] * LOG2E;
            dv = *(const float *)(dslot + (size_t)qi * C3);
        }
        ls[threadIdx.x] = lv;
        ds[threadIdx.x] = dv;
    }
}

/* Backward 2: dK, dV (=) of 64 keys per block; grid (B*NH, ceil(T/64)), 128 threads,
 * (2 TC_ROWS + 4 QT) (HS + TC_PAD) bf16 + 4 QT floats of dynamic shared memory. */
template <int HS, int QT>
__global__ void __launch_bounds__(TC_THREADS) attn_tc_bwd_dkv_kernel(bf16 *dqkv, const bf16 *dout,
                                                                     const bf16 *qkv, const float *lse,
                                                                     int T, int C, int NH, float scale,
                                                                     float qscale) {
    constexpr int S = HS + TC_PAD;
    bf16 *ks = (bf16 *)tc_shared; /* [TC_ROWS][S] this block's keys, then each warp's dK rows */
    bf16 *vs = ks + TC_ROWS * S;  /* [TC_ROWS][S] its values, then each warp's dV rows */
    bf16 *qs = vs + TC_ROWS * S;  /* [2][QT][S] query tiles */
    bf16 *dos = qs + 2 * QT * S;  /* [2][QT][S] their dout */
    float *ls = (float *)(dos + 2 * QT * S); /* [2][QT] lse * log2 e */
    float *ds = ls + 2 * QT;                 /* [2][QT] D */
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int k0 = blockIdx.y * TC_ROWS; /* key tile 0 sees every query: it starts first */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wk = k0 + warp * 16;               /* this warp's first key */
    const int krow[2] = {wk + g, wk + g + 8};    /* this lane's two keys */
    const size_t C3 = 3 * (size_t)C;
    const bf16 *qg = qkv + (size_t)b * T * C3 + (size_t)h * HS;
    const bf16 *dog = dout + (size_t)b * T * C + (size_t)h * HS;
    bf16 *dg = dqkv + (size_t)b * T * C3 + (size_t)h * HS; /* dq slots (holding D), dk at +C, dv at +2C */
    const float *lseg = lse + (size_t)bh * T;
    const int nqt = (T - k0 + QT - 1) / QT; /* queries k0 .. T - 1 */

    tc_load_rows<HS, TC_ROWS>(ks, qg + C, C3, k0, T);
    tc_load_rows<HS, TC_ROWS>(vs, qg + 2 * C, C3, k0, T);
    tc_load_rows<HS, QT>(qs, qg, C3, k0, T);
    tc_load_rows<HS, QT>(dos, dog, C, k0, T);
    tc_cp_commit();
    tc_load_row_stats<QT>(ls, ds, lseg, dg, C3, k0, T);

    float dk[HS / 8][4], dv[HS / 8][4];
#pragma unroll
    for (int n = 0; n < HS / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[n][e] = dv[n][e] = 0.0f;

    for (int it = 0; it < nqt; it++) {
        const int q0 = k0 + it * QT, cur = it & 1;
        if (it + 1 < nqt) { /* the next tile goes into the other buffers, freed last iteration */
            const int nx = cur ^ 1;
            tc_load_rows<HS, QT>(qs + nx * QT * S, qg, C3, q0 + QT, T);
            tc_load_rows<HS, QT>(dos + nx * QT * S, dog, C, q0 + QT, T);
            tc_cp_commit();
            tc_load_row_stats<QT>(ls + nx * QT, ds + nx * QT, lseg, dg, C3, q0 + QT, T);
            tc_cp_wait<1>();
        } else {
            tc_cp_wait<0>();
        }
        __syncthreads();
        const bf16 *qts = qs + cur * QT * S, *dots = dos + cur * QT * S;
        const float *lts = ls + cur * QT, *dts = ds + cur * QT;

        /* st (16 keys x QT queries) = k q^T; dpt = v dout^T */
        float st[QT / 8][4], dpt[QT / 8][4];
#pragma unroll
        for (int j = 0; j < QT / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) st[j][e] = dpt[j][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HS / 16; kk++) {
            uint32_t ka[4], va[4];
            tc_frag_a<S>(ka, ks, warp * 16, kk * 16, lane);
            tc_frag_a<S>(va, vs, warp * 16, kk * 16, lane);
#pragma unroll
            for (int np = 0; np < QT / 16; np++) {
                uint32_t qb[4], ob[4];
                tc_frag_b_nmajor<S>(qb, qts, np * 16, kk * 16, lane);
                tc_frag_b_nmajor<S>(ob, dots, np * 16, kk * 16, lane);
                tc_mma(st[2 * np], ka, qb[0], qb[1]);
                tc_mma(st[2 * np + 1], ka, qb[2], qb[3]);
                tc_mma(dpt[2 * np], va, ob[0], ob[1]);
                tc_mma(dpt[2 * np + 1], va, ob[2], ob[3]);
            }
        }
        /* element (j, e) is key krow[e / 2], query q0 + qc, qc = 8j + 2t + e % 2:
         * st becomes p^T, dpt becomes ds^T */
#pragma unroll
        for (int j = 0; j < QT / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int qc = 8 * j + 2 * t + (e & 1);
                const float p = krow[e >> 1] <= q0 + qc ? exp2f(st[j][e] * qscale - lts[qc]) : 0.0f;
                st[j][e] = p;
                dpt[j][e] = p * (dpt[j][e] - dts[qc]);
            }
        /* dv += p^T dout; dk += ds^T q */
#pragma unroll
        for (int kk = 0; kk < QT / 16; kk++) {
            uint32_t pa[4], da[4];
            tc_c_to_a(pa, st[2 * kk], st[2 * kk + 1]);
            tc_c_to_a(da, dpt[2 * kk], dpt[2 * kk + 1]);
#pragma unroll
            for (int np = 0; np < HS / 16; np++) {
                uint32_t ob[4], qb[4];
                tc_frag_b_kmajor<S>(ob, dots, kk * 16, np * 16, lane);
                tc_mma(dv[2 * np], pa, ob[0], ob[1]);
                tc_mma(dv[2 * np + 1], pa, ob[2], ob[3]);
                tc_frag_b_kmajor<S>(qb, qts, kk * 16, np * 16, lane);
                tc_mma(dk[2 * np], da, qb[0], qb[1]);
                tc_mma(dk[2 * np + 1], da, qb[2], qb[3]);
            }
        }
        __syncthreads(); /* the next iteration's copy reuses the other buffers */
    }

    /* the warp's own key and value rows are read by no other warp */
    const float fk[2] = {scale, scale}, fv[2] = {1.0f, 1.0f};
    tc_store_rows<HS>(dg + C, C3, wk, T, ks + warp * 16 * S, dk, fk, lane);
    tc_store_rows<HS>(dg + 2 * C, C3, wk, T, vs + warp * 16 * S, dv, fv, lane);
}

/* Backward 3: dQ (=) of 64 queries per block; grid (B*NH, ceil(T/64)), 128 threads,
 * (2 TC_ROWS + 4 KT) (HS + TC_PAD) bf16 of dynamic shared memory. */
template <int HS, int KT>
__global__ void __launch_bounds__(TC_THREADS) attn_tc_bwd_dq_kernel(bf16 *dqkv, const bf16 *dout,
                                                                    const bf16 *qkv, const float *lse,
                                                                    int T, int C, int NH, float scale,
                                                                    float qscale) {
    constexpr int S = HS + TC_PAD;
    bf16 *qs = (bf16 *)tc_shared; /* [TC_ROWS][S] queries, then each warp's dQ rows */
    bf16 *dos = qs + TC_ROWS * S; /* [TC_ROWS][S] their dout */
    bf16 *ks = dos + TC_ROWS * S; /* [2][KT][S] key tiles */
    bf16 *vs = ks + 2 * KT * S;   /* [2][KT][S] value tiles */
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH;
    const int q0 = (gridDim.y - 1 - blockIdx.y) * TC_ROWS; /* the longest rows first */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wq = q0 + warp * 16;
    const int qrow[2] = {wq + g, wq + g + 8};
    const size_t C3 = 3 * (size_t)C;
    const bf16 *qg = qkv + (size_t)b * T * C3 + (size_t)h * HS, *kg = qg + C, *vg = qg + 2 * C;
    const bf16 *dog = dout + (size_t)b * T * C + (size_t)h * HS;
    bf16 *dg = dqkv + (size_t)b * T * C3 + (size_t)h * HS; /* dq slots, holding D until the end */
    const int nkt = (min(q0 + TC_ROWS, T) + KT - 1) / KT;

    tc_load_rows<HS, TC_ROWS>(qs, qg, C3, q0, T);
    tc_load_rows<HS, TC_ROWS>(dos, dog, C, q0, T);
    tc_cp_commit();
    tc_load_rows<HS, KT>(ks, kg, C3, 0, T);
    tc_load_rows<HS, KT>(vs, vg, C3, 0, T);
    tc_cp_commit();

    /* this lane's rows: lse in log2 units (+inf past T, so P is 0 there) and D, read here,
     * long before this warp's dq stores at the end overwrite it */
    float l2[2], dd[2];
#pragma unroll
    for (int r = 0; r < 2; r++) {
        l2[r] = INFINITY;
        dd[r] = 0.0f;
        if (qrow[r] < T) {
            l2[r] = lse[(size_t)bh * T + qrow[r]] * LOG2E;
            dd[r] = *(const float *)(dg + (size_t)qrow[r] * C3);
        }
    }
    tc_cp_wait<1>(); /* the queries and their dout */
    __syncthreads();
    uint32_t qf[HS / 16][4], of[HS / 16][4];
#pragma unroll
    for (int kk = 0; kk < HS / 16; kk++) {
        tc_frag_a<S>(qf[kk], qs, warp * 16, kk * 16, lane);
        tc_frag_a<S>(of[kk], dos, warp * 16, kk * 16, lane);
    }
    float dq[HS / 8][4];
#pragma unroll
    for (int n = 0; n < HS / 8; n++) dq[n][0] = dq[n][1] = dq[n][2] = dq[n][3] = 0.0f;

    for (int kt = 0; kt < nkt; kt++) {
        const bf16 *kts = ks + (kt & 1) * KT * S, *vts = vs + (kt & 1) * KT * S;
        if (kt + 1 < nkt) {
            const int nx = (kt + 1) & 1;
            tc_load_rows<HS, KT>(ks + nx * KT * S, kg, C3, (kt + 1) * KT, T);
            tc_load_rows<HS, KT>(vs + nx * KT * S, vg, C3, (kt + 1) * KT, T);
            tc_cp_commit();
            tc_cp_wait<1>();
        } else {
            tc_cp_wait<0>();
        }
        __syncthreads();

        /* s (16 x KT) = q k^T; dp = dout v^T */
        float s[KT / 8][4], dp[KT / 8][4];
#pragma unroll
        for (int j = 0; j < KT / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) s[j][e] = dp[j][e] = 0.0f;
#pragma unroll
        for (int kk = 0; kk < HS / 16; kk++)
#pragma unroll
            for (int np = 0; np < KT / 16; np++) {
                uint32_t kb[4], vb[4];
                tc_frag_b_nmajor<S>(kb, kts, np * 16, kk * 16, lane);
                tc_frag_b_nmajor<S>(vb, vts, np * 16, kk * 16, lane);
                tc_mma(s[2 * np], qf[kk], kb[0], kb[1]);
                tc_mma(s[2 * np + 1], qf[kk], kb[2], kb[3]);
                tc_mma(dp[2 * np], of[kk], vb[0], vb[1]);
                tc_mma(dp[2 * np + 1], of[kk], vb[2], vb[3]);
            }
        /* element (j, e) is query qrow[e / 2], key k0 + 8j + 2t + e % 2; s becomes ds */
        const int k0 = kt * KT;
#pragma unroll
        for (int j = 0; j < KT / 8; j++)
#pragma unroll
            for (int e = 0; e < 4; e++) {
                const int r = e >> 1;
                const float p = k0 + 8 * j + 2 * t + (e & 1) <= qrow[r] ? exp2f(s[j][e] * qscale - l2[r]) : 0.0f;
                s[j][e] = p * (dp[j][e] - dd[r]);
            }
        /* dq += ds k */
#pragma unroll
        for (int kk = 0; kk < KT / 16; kk++) {
            uint32_t da[4];
            tc_c_to_a(da, s[2 * kk], s[2 * kk + 1]);
#pragma unroll
            for (int np = 0; np < HS / 16; np++) {
                uint32_t kb[4];
                tc_frag_b_kmajor<S>(kb, kts, kk * 16, np * 16, lane);
                tc_mma(dq[2 * np], da, kb[0], kb[1]);
                tc_mma(dq[2 * np + 1], da, kb[2], kb[3]);
            }
        }
        __syncthreads();
    }

    const float f[2] = {scale, scale};
    tc_store_rows<HS>(dg, C3, wq, T, qs + warp * 16 * S, dq, f, lane);
}

/* Kernels whose shared memory passes 48 KiB must say so, once per device (the attribute
 * belongs to the device's context); devices past 31 simply set it every time. */
static void tc_allow_smem(const void *kernel, int bytes, unsigned *devices_done) {
    int dev = 0;
    CUDA_CHECK(cudaGetDevice(&dev));
    const unsigned bit = dev < 32 ? 1u << dev : 0u;
    if (bit && (__atomic_load_n(devices_done, __ATOMIC_ACQUIRE) & bit)) return;
    CUDA_CHECK(cudaFuncSetAttribute(kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes));
    if (bit) __atomic_fetch_or(devices_done, bit, __ATOMIC_RELEASE);
}

template <int HS, int KT>
static void attention_tc_forward_hs(cudaStream_t st, void *out, float *lse, const void *qkv, int B, int T,
                                    int C, int NH) {
    static unsigned smem_done;
    const int bytes = (TC_ROWS + 4 * KT) * (HS + TC_PAD) * (int)sizeof(bf16);
    tc_allow_smem((const void *)attn_tc_fwd_kernel<HS, KT>, bytes, &smem_done);
    const float scale = 1.0f / sqrtf((float)HS);
    dim3 grid(B * NH, (T + TC_ROWS - 1) / TC_ROWS);
    attn_tc_fwd_kernel<HS, KT><<<grid, TC_THREADS, bytes, st>>>((bf16 *)out, lse, (const bf16 *)qkv, T, C,
                                                                  NH, scale * LOG2E);
    LAUNCH_CHECK("attention_forward (tensor cores)");
}

/* T2: the streamed tile of the backward (query tile of dK/dV, key tile of dQ) */
template <int HS, int T2>
static void attention_tc_backward_hs(cudaStream_t st, void *dqkv, const void *dout, const void *qkv,
                                     const void *out, const float *lse, int B, int T, int C, int NH) {
    static unsigned dkv_done, dq_done;
    const int S = HS + TC_PAD;
    const int dkv_bytes = (2 * TC_ROWS + 4 * T2) * S * (int)sizeof(bf16) + 4 * T2 * (int)sizeof(float);
    const int dq_bytes = (2 * TC_ROWS + 4 * T2) * S * (int)sizeof(bf16);
    tc_allow_smem((const void *)attn_tc_bwd_dkv_kernel<HS, T2>, dkv_bytes, &dkv_done);
    tc_allow_smem((const void *)attn_tc_bwd_dq_kernel<HS, T2>, dq_bytes, &dq_done);
    const float scale = 1.0f / sqrtf((float)HS);
    const size_t rows = (size_t)B * T, lanes = rows * NH * (HS / 8);
    attn_tc_bwd_d_kernel<HS><<<(unsigned)((lanes + 255) / 256), 256, 0, st>>>(
        (bf16 *)dqkv, (const bf16 *)dout, (const bf16 *)out, rows, C, NH);
    LAUNCH_CHECK("attention_backward (tensor cores, D)");
    dim3 grid(B * NH, (T + TC_ROWS - 1) / TC_ROWS);
    attn_tc_bwd_dkv_kernel<HS, T2><<<grid, TC_THREADS, dkv_bytes, st>>>(
        (bf16 *)dqkv, (const bf16 *)dout, (const bf16 *)qkv, lse, T, C, NH, scale, scale * LOG2E);
    LAUNCH_CHECK("attention_backward (tensor cores, dk, dv)");
    attn_tc_bwd_dq_kernel<HS, T2><<<grid, TC_THREADS, dq_bytes, st>>>(
        (bf16 *)dqkv, (const bf16 *)dout, (const bf16 *)qkv, lse, T, C, NH, scale, scale * LOG2E);
    LAUNCH_CHECK("attention_backward (tensor cores, dq)");
}

/* Which kernels run: STRATA_ATTENTION=tc the tensor-core ones above; unset, empty or
 * "simt" the CUDA-core ones. The variable is read once per process;
 * strata_cuda_attention_select overrides it (tests and benchmarks compare the two). */
enum { ATT_SIMT = 0, ATT_TC = 1 };
static pthread_once_t att_env_once = PTHREAD_ONCE_INIT;
static int att_env_choice = ATT_SIMT;
static int att_forced = -1; /* -1: the environment decides */

static void att_env_read(void) {
    const char *v = getenv("STRATA_ATTENTION");
    if (!v || !*v || !strcmp(v, "simt")) return;
    if (strcmp(v, "tc"))
        strata_panic(__FILE__, __LINE__, "STRATA_ATTENTION=%s is not a choice: tc (tensor cores) or simt "
                     "(CUDA cores, the default)", v);
    att_env_choice = ATT_TC;
    STRATA_INFO("cuda", "attention on tensor cores (STRATA_ATTENTION=tc) for head sizes 64 and 128");
}

static int att_choice(void) {
    int forced = __atomic_load_n(&att_forced, __ATOMIC_ACQUIRE);
    if (forced >= 0) return forced;
    pthread_once(&att_env_once, att_env_read);
    return att_env_choice;
}

/* 0 CUDA cores, 1 tensor cores, for every later attention call in the process; -1 goes
 * back to STRATA_ATTENTION. Returns the choice in effect before the call. */
extern "C" int strata_cuda_attention_select(int impl) {
    int before = att_choice();
    __atomic_store_n(&att_forced, impl < 0 ? -1 : impl ? ATT_TC : ATT_SIMT, __ATOMIC_RELEASE);
    return before;
}

/* whether the tensor-core kernels take this call: head size, 16-byte aligned bf16 tensors
 * (cp.async and the output stores move 16 bytes), and at most 65535 row tiles (grid.y) */
static int att_tc_takes(int hs, int T, int C, int NH, const void *p0, const void *p1, const void *p2,
                        const void *p3) {
    return att_choice() == ATT_TC && (hs == 64 || hs == 128) && hs * NH == C &&
           (T + TC_ROWS - 1) / TC_ROWS <= 65535 && aligned16(p0) && aligned16(p1) && aligned16(p2) &&
           aligned16(p3);
}

#define ATT_HEAD_SIZES "16, 32, 64, 80, 96 or 128"

static void cuda_attention_forward(strata_stream *s, void *out, float *lse, const void *qkv, int B,
                                   int T, int C, int NH) {
    if (B <= 0 || T <= 0) return;
    cudaStream_t st = strata_cuda_stream_handle(s);
    int hs = C / NH;
    if (att_tc_takes(hs, T, C, NH, out, qkv, qkv, out)) {
        if (hs == 64) attention_tc_forward_hs<64, 64>(st, out, lse, qkv, B, T, C, NH);
        else attention_tc_forward_hs<128, 64>(st, out, lse, qkv, B, T, C, NH);
        return;
    }
    switch (hs) {
    case 16: attention_forward_hs<16>(st, out, lse, qkv, B, T, C, NH); break;
    case 32: attention_forward_hs<32>(st, out, lse, qkv, B, T, C, NH); break;
    case 64: attention_forward_hs<64>(st, out, lse, qkv, B, T, C, NH); break;
    case 80: attention_forward_hs<80>(st, out, lse, qkv, B, T, C, NH); break;
    case 96: attention_forward_hs<96>(st, out, lse, qkv, B, T, C, NH); break;
    case 128: attention_forward_hs<128>(st, out, lse, qkv, B, T, C, NH); break;
    default:
        strata_panic(__FILE__, __LINE__, "attention_forward: head size %d (C %d / NH %d) is not "
                     "one the CUDA kernels are built for (" ATT_HEAD_SIZES ")", hs, C, NH);
    }
}

static void cuda_attention_backward(strata_stream *s, void *dqkv, const void *dout, const void *qkv,
                                    const void *out, const float *lse, int B, int T, int C, int NH) {
    if (B <= 0 || T <= 0) return;
    cudaStream_t st = strata_cuda_stream_handle(s);
    int hs = C / NH;
    if (att_tc_takes(hs, T, C, NH, dqkv, dout, qkv, out)) {
        /* hs 128 streams 32-row tiles in the backward: its accumulators need the registers */
        if (hs == 64) attention_tc_backward_hs<64, 64>(st, dqkv, dout, qkv, out, lse, B, T, C, NH);
        else attention_tc_backward_hs<128, 32>(st, dqkv, dout, qkv, out, lse, B, T, C, NH);
        return;
    }
    switch (hs) {
    case 16: attention_backward_hs<16>(st, dqkv, dout, qkv, out, lse, B, T, C, NH); break;
    case 32: attention_backward_hs<32>(st, dqkv, dout, qkv, out, lse, B, T, C, NH); break;
    case 64: attention_backward_hs<64>(st, dqkv, dout, qkv, out, lse, B, T, C, NH); break;
    case 80: attention_backward_hs<80>(st, dqkv, dout, qkv, out, lse, B, T, C, NH); break;
    case 96: attention_backward_hs<96>(st, dqkv, dout, qkv, out, lse, B, T, C, NH); break;
    case 128: attention_backward_hs<128>(st, dqkv, dout, qkv, out, lse, B, T, C, NH); break;
    default:
        strata_panic(__FILE__, __LINE__, "attention_backward: head size %d (C %d / NH %d) is not "
                     "one the CUDA kernels are built for (" ATT_HEAD_SIZES ")", hs, C, NH);
    }
}

/* ---------------------------------------------------------------------------------- */
/* Cross-entropy: one block per row                                                     */

#define XENT_THREADS 512

/* (m, s) pairs of a running max and the sum of exp(x - m) */
__device__ __forceinline__ void lse_merge(float &m, float &s, float m2, float s2) {
    if (m2 == -INFINITY) return;
    if (m == -INFINITY) {
        m = m2;
        s = s2;
        return;
    }
    float M = fmaxf(m, m2);
    s = s * expf(m - M) + s2 * expf(m2 - M);
    m = M;
}

__global__ void __launch_bounds__(XENT_THREADS) xent_kernel(float *losses, bf16 *dlogits,
                                                            const bf16 *logits, const int32_t *targets,
                                                            int V, int Vp, float dloss) {
    __shared__ float sm[32], ss[32];
    int row = blockIdx.x, tid = threadIdx.x, lane = tid & 31, warp = tid >> 5;
    const bf16 *x = logits + (size_t)row * Vp;
    bf16 *d = dlogits ? dlogits + (size_t)row * Vp : NULL;
    int tgt = targets[row];
    if (tgt < 0) { /* ignored row: the whole block takes this branch */
        if (tid == 0) losses[row] = 0.0f;
        if (d)
            for (int c = tid; c < Vp; c += blockDim.x) d[c] = to_bf16(0.0f);
        return;
    }
    float xt = ld(x[tgt]); /* every read of x happens before the barrier below, every
                            * write of d (possibly x itself) after it */
    float m = -INFINITY, s = 0.0f;
    for (int c = tid; c < V; c += blockDim.x) {
        float v = ld(x[c]);
        if (v > m) {
            s = s * expf(m - v) + 1.0f;
            m = v;
        } else {
            s += expf(v - m);
        }
    }
    for (int o = 16; o > 0; o >>= 1) {
        float m2 = __shfl_xor_sync(0xffffffffu, m, o), s2 = __shfl_xor_sync(0xffffffffu, s, o);
        lse_merge(m, s, m2, s2);
    }
    if (lane == 0) {
        sm[warp] = m;
        ss[warp] = s;
    }
    __syncthreads();
    int nwarps = blockDim.x >> 5;
    float M = sm[0], S = ss[0];
    for (int w = 1; w < nwarps; w++) lse_merge(M, S, sm[w], ss[w]);
    if (tid == 0) losses[row] = M + logf(S) - xt;
    if (!d) return;
    float f = dloss / S;
    for (int c = tid; c < Vp; c += blockDim.x) {
        float g = 0.0f;
        if (c < V) {
            float p = expf(ld(x[c]) - M);
            g = c == tgt ? (p / S - 1.0f) * dloss : p * f;
        }
        d[c] = to_bf16(g);
    }
}

static void cuda_crossentropy(strata_stream *s, float *losses, void *dlogits, const void *logits,
                              const int32_t *targets, int N, int V, int Vp, float dloss) {
    if (N <= 0) return;
    xent_kernel<<<N, XENT_THREADS, 0, strata_cuda_stream_handle(s)>>>(
        losses, (bf16 *)dlogits, (const bf16 *)logits, targets, V, Vp, dloss);
    LAUNCH_CHECK("crossentropy");
}

__global__ void loss_acc_kernel(float *acc, const float *losses, int n, float scale) {
    double sum = 0.0;
    for (int i = threadIdx.x; i < n; i += blockDim.x) sum += (double)losses[i];
    sum = block_sum_d(sum);
    if (threadIdx.x == 0) *acc += (float)((double)scale * sum);
}

static void cuda_loss_accumulate(strata_stream *s, float *acc, const float *losses, int n, float scale) {
    loss_acc_kernel<<<1, 1024, 0, strata_cuda_stream_handle(s)>>>(acc, losses, n > 0 ? n : 0, scale);
    LAUNCH_CHECK("loss_accumulate");
}

/* ---------------------------------------------------------------------------------- */
/* Optimizer and utilities                                                               */

/* The documented order, one IEEE operation at a time: the _rn intrinsics are never
 * fused into FMAs, so the result is bit for bit the CPU oracle's. */
__global__ void adamw_kernel(float *master, bf16 *param_out, const float *grad, float *m, float *v,
                             size_t n, strata_adamw_args a) {
    GRID_STRIDE(i, n) {
        float g = __fmul_rn(grad[i], a.grad_scale);
        float mi = __fadd_rn(__fmul_rn(a.beta1, m[i]), __fmul_rn(__fsub_rn(1.0f, a.beta1), g));
        float vi = __fadd_rn(__fmul_rn(a.beta2, v[i]), __fmul_rn(__fmul_rn(__fsub_rn(1.0f, a.beta2), g), g));
        m[i] = mi;
        v[i] = vi;
        float mhat = __fdiv_rn(mi, a.bc1), vhat = __fdiv_rn(vi, a.bc2);
        float p = master[i];
        float step = __fadd_rn(__fdiv_rn(mhat, __fadd_rn(__fsqrt_rn(vhat), a.eps)),
                               __fmul_rn(a.weight_decay, p));
        p = __fsub_rn(p, __fmul_rn(a.lr, step));
        master[i] = p;
        if (param_out) param_out[i] = to_bf16(p);
    }
}

static void cuda_adamw(strata_stream *s, float *master, void *param_out, const float *grad, float *m,
                       float *v, size_t n, const strata_adamw_args *a) {
    if (!n) return;
    adamw_kernel<<<grid_for(n, EW_THREADS), EW_THREADS, 0, strata_cuda_stream_handle(s)>>>(
        master, (bf16 *)param_out, grad, m, v, n, *a);
    LAUNCH_CHECK("adamw");
}

#define SUMSQ_THREADS 256

__global__ void sumsq_kernel(double *out, const float *x, size_t n) {
    double acc = 0.0;
    GRID_STRIDE(i, n) {
        double v = (double)x[i];
        acc += v * v;
    }
    acc = block_sum_d(acc);
    if (threadIdx.x == 0) atomicAdd(out, acc);
}

static void cuda_sumsq(strata_stream *s, double *out, const float *x, size_t n) {
    if (!n) return;
    unsigned blocks = grid_for(n, SUMSQ_THREADS);
    if (blocks > 1024) blocks = 1024; /* few atomics on one double */
    sumsq_kernel<<<blocks, SUMSQ_THREADS, 0, strata_cuda_stream_handle(s)>>>(out, x, n);
    LAUNCH_CHECK("sumsq");
}

__global__ void acc_bf16_kernel(float *dst, const bf16 *src, size_t n) {
    GRID_STRIDE(i, n) dst[i] += ld(src[i]);
}
__global__ void acc_f32_kernel(float *dst, const float *src, size_t n) {
    GRID_STRIDE(i, n) dst[i] += src[i];
}

static void cuda_accumulate_f32(strata_stream *s, float *dst, const void *src, strata_dtype src_dtype,
                                size_t n) {
    if (!n) return;
    cudaStream_t st = strata_cuda_stream_handle(s);
    if (src_dtype == STRATA_BF16)
        acc_bf16_kernel<<<grid_for(n, EW_THREADS), EW_THREADS, 0, st>>>(dst, (const bf16 *)src, n);
    else
        acc_f32_kernel<<<grid_for(n, EW_THREADS), EW_THREADS, 0, st>>>(dst, (const float *)src, n);
    LAUNCH_CHECK("accumulate_f32");
}

__global__ void f32_to_bf16_kernel(bf16 *dst, const float *src, size_t n) {
    GRID_STRIDE(i, n) dst[i] = to_bf16(src[i]);
}
__global__ void bf16_to_f32_kernel(float *dst, const bf16 *src, size_t n) {
    GRID_STRIDE(i, n) dst[i] = ld(src[i]);
}

static void cuda_convert(strata_stream *s, void *dst, strata_dtype dst_dtype, const void *src,
                         strata_dtype src_dtype, size_t n) {
    if (!n) return;
    cudaStream_t st = strata_cuda_stream_handle(s);
    if (dst_dtype == src_dtype) {
        if (dst != src)
            CUDA_CHECK(cudaMemcpyAsync(dst, src, n * strata_dtype_size(dst_dtype), cudaMemcpyDefault, st));
        return;
    }
    if (dst_dtype == STRATA_BF16)
        f32_to_bf16_kernel<<<grid_for(n, EW_THREADS), EW_THREADS, 0, st>>>((bf16 *)dst, (const float *)src, n);
    else
        bf16_to_f32_kernel<<<grid_for(n, EW_THREADS), EW_THREADS, 0, st>>>((float *)dst, (const bf16 *)src, n);
    LAUNCH_CHECK("convert");
}

__global__ void scale_kernel(float *x, float scale, size_t n) {
    GRID_STRIDE(i, n) x[i] *= scale;
}

static void cuda_scale_f32(strata_stream *s, float *x, float scale, size_t n) {
    if (!n) return;
    scale_kernel<<<grid_for(n, EW_THREADS), EW_THREADS, 0, strata_cuda_stream_handle(s)>>>(x, scale, n);
    LAUNCH_CHECK("scale_f32");
}

/* In the order of struct strata_kernels (C++17 has no designated initialisers). */
extern "C" const strata_kernels strata_kernels_cuda = {
    cuda_encoder_forward,
    cuda_encoder_backward,
    cuda_layernorm_forward,
    cuda_layernorm_backward,
    cuda_matmul_forward,
    cuda_matmul_backward,
    cuda_attention_forward,
    cuda_attention_backward,
    cuda_gelu_forward,
    cuda_gelu_backward,
    cuda_residual_forward,
    cuda_add_inplace,
    cuda_crossentropy,
    cuda_loss_accumulate,
    cuda_adamw,
    cuda_sumsq,
    cuda_accumulate_f32,
    cuda_convert,
    cuda_scale_f32,
};
