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
 * Attention has a file of its own, core/cuda/attention.cu.
 *
 * Kernels have no status to return, so a failed launch or cuBLASLt call is fatal and
 * names the kernel; CUDA's asynchronous errors surface at the next synchronisation. */
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <limits.h>
#include <math.h>
#include <pthread.h>
#include <stdint.h>
#include <string.h>

#include "core/cuda/cuda_common.h"
#include "core/cuda/kernels_common.cuh"
extern "C" { /* C headers, C linkage (as core/cuda/cuda_common.h includes its own) */
#include "core/optim.h"
#include "core/quant.h"
}

#define LT_WORKSPACE_BYTES ((size_t)32 << 20) /* cuBLASLt's advice for Hopper */
#define PLAN_MAX 128

/* ---------------------------------------------------------------------------------- */
/* Scalar helpers                                                                        */

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

/* wpe NULL (the Llama family): out is wte's row, bit for bit; pos NULL: position t */
__global__ void encoder_fwd_kernel(bf16 *out, const int32_t *tok, const int32_t *pos, const bf16 *wte,
                                   const bf16 *wpe, int T, int C, size_t n) {
    GRID_STRIDE(i, n) {
        size_t bt = i / (size_t)C;
        int c = (int)(i % (size_t)C), t = pos ? pos[bt] : (int)(bt % (size_t)T);
        bf16 e = wte[(size_t)tok[bt] * C + c];
        out[i] = wpe ? to_bf16(ld(e) + ld(wpe[(size_t)t * C + c])) : e;
    }
}

static void cuda_encoder_forward(strata_stream *s, void *out, const int32_t *tok, const int32_t *pos,
                                 const void *wte, const void *wpe, int B, int T, int C) {
    size_t n = (size_t)B * T * C;
    if (!n) return;
    encoder_fwd_kernel<<<grid_for(n, EW_THREADS), EW_THREADS, 0, strata_cuda_stream_handle(s)>>>(
        (bf16 *)out, tok, pos, (const bf16 *)wte, (const bf16 *)wpe, T, C, n);
    LAUNCH_CHECK("encoder_forward");
}

/* The embedding's backward without atomics, so its sums are the same on every run: each
 * element of dwte and dwpe gets its rows added one by one in position order, starting from
 * its old value, as the CPU oracle adds them (the same bits, given the same dout).
 * dwpe: a thread per (t, c) walks the B rows of position t; with pos (packed documents),
 * dwte's kernel below with pos as the ids and pos_order as the order. */
__global__ void encoder_bwd_wpe_kernel(float *dwpe, const bf16 *dout, int B, size_t TC) {
    GRID_STRIDE(i, TC) {
        float acc = dwpe[i];
        for (int b = 0; b < B; b++) acc += ld(dout[(size_t)b * TC + i]);
        dwpe[i] = acc;
    }
}

/* dwte: order lists the positions by token, ties in position order, so a token's positions
 * are a run of it. Block (i, y) owns ENC_COLS channels of entry i; only the block at a run's
 * first entry works. It walks the run ENC_COLS entries at a time: the threads read a chunk's
 * positions into shared memory at once and find where the run ends in it (a shared
 * atomicMin: the smallest index wins whatever the order), then each adds the chunk's rows
 * of its channel in order. So a frequent token (a long run: padding, a space) costs a few
 * chunks' loads rather than a chain of dependent ones per entry. */
#define ENC_COLS 128

__global__ void __launch_bounds__(ENC_COLS)
    encoder_bwd_wte_kernel(float *dwte, const bf16 *dout, const int32_t *tok, const int32_t *order, int n, int C) {
    __shared__ int s_pos[ENC_COLS];
    __shared__ int s_end;
    const int i = blockIdx.x, c = blockIdx.y * ENC_COLS + threadIdx.x;
    const int v = tok[order[i]];
    if (i > 0 && tok[order[i - 1]] == v) return; /* the whole block: not the run's first entry */
    float acc = c < C ? dwte[(size_t)v * C + c] : 0.0f;
    for (int base = i;; base += ENC_COLS) {
        if (threadIdx.x == 0) s_end = n;
        __syncthreads();
        const int j = base + (int)threadIdx.x;
        int p = -1;
        if (j < n) {
            p = order[j];
            if (tok[p] != v) atomicMin(&s_end, j);
        }
        s_pos[threadIdx.x] = p;
        __syncthreads();
        const int stop = s_end; /* the run's end, if it is in this chunk (else n or later) */
        const int cnt = min(stop, base + ENC_COLS) - base;
        if (c < C) {
#pragma unroll 8
            for (int k = 0; k < cnt; k++) acc += ld(dout[(size_t)s_pos[k] * C + c]);
        }
        if (stop < base + ENC_COLS) break; /* the same s_end for every thread: all leave */
        __syncthreads();                   /* every thread has read s_pos and s_end */
    }
    if (c < C) dwte[(size_t)v * C + c] = acc;
}

static void cuda_encoder_backward(strata_stream *s, float *dwte, float *dwpe, const void *dout,
                                  const int32_t *tok, const int32_t *order, const int32_t *pos,
                                  const int32_t *pos_order, int B, int T, int C) {
    int n = B * T;
    if (n <= 0 || C <= 0) return;
    cudaStream_t st = strata_cuda_stream_handle(s);
    dim3 grid((unsigned)n, (unsigned)((C + ENC_COLS - 1) / ENC_COLS));
    encoder_bwd_wte_kernel<<<grid, ENC_COLS, 0, st>>>(dwte, (const bf16 *)dout, tok, order, n, C);
    LAUNCH_CHECK("encoder_backward (dwte)");
    if (dwpe && pos) { /* a position's rows are a run of pos_order, as a token's are of order */
        encoder_bwd_wte_kernel<<<grid, ENC_COLS, 0, st>>>(dwpe, (const bf16 *)dout, pos, pos_order, n, C);
        LAUNCH_CHECK("encoder_backward (dwpe by position)");
    } else if (dwpe) {
        size_t TC = (size_t)T * C;
        encoder_bwd_wpe_kernel<<<grid_for(TC, EW_THREADS), EW_THREADS, 0, st>>>(dwpe, (const bf16 *)dout, B, TC);
        LAUNCH_CHECK("encoder_backward (dwpe)");
    }
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

/* Column sums without atomics (LayerNorm's dw and db, a bias's gradient), the same on every
 * run: a block owns COL_COLS columns of a chunk of rows, its COL_LANES row lanes taking
 * every COL_LANES-th row of the chunk in order, and their partial sums meet in shared
 * memory in lane order. A warp reads two rows' 16 columns, two 32-byte segments. One
 * block per COL_COLS columns alone leaves a narrow matrix's GPU mostly idle (GPT-2 124M's 768 columns: 48 blocks for 132 SMs), so the rows are cut into
 * chunks (grid.y; col_chunks decides from N and C alone, so the bits never depend on the
 * GPU): each chunk's sums go to the device's buffer for them (strata_cuda_kstate) and
 * colsum_parts_kernel adds them in chunk order. A single chunk adds to out directly.
 * Op(r, c, &a0, &a1) gives row r's terms of column c; a1 is dropped when out1 is NULL. */
#define COL_COLS 16
#define COL_LANES 64       /* 1024 threads */
#define COL_BLOCKS 1024    /* chunks x column blocks, at most (about 4 waves of 2 per SM) */
#define COL_CHUNK_ROWS 256 /* rows a chunk has at least */
/* the chunks' sums of both outputs: chunks * C <= COL_BLOCKS * COL_COLS (col_chunks) */
#define COL_PART_FLOATS (2 * COL_BLOCKS * COL_COLS)

static int col_chunks(int N, int C) {
    int blocks_x = (C + COL_COLS - 1) / COL_COLS;
    int by_rows = (N + COL_CHUNK_ROWS - 1) / COL_CHUNK_ROWS, by_grid = COL_BLOCKS / blocks_x;
    int chunks = by_rows < by_grid ? by_rows : by_grid;
    return chunks > 1 ? chunks : 1;
}

template <class Op>
__global__ void __launch_bounds__(COL_COLS * COL_LANES)
    colsum2_kernel(Op op, float *out0, float *out1, float *part, int N, int C, int chunk_rows) {
    __shared__ float p0[COL_LANES][COL_COLS + 1], p1[COL_LANES][COL_COLS + 1];
    const int col = threadIdx.x % COL_COLS, lane = threadIdx.x / COL_COLS;
    const int c = blockIdx.x * COL_COLS + col;
    const int r0 = blockIdx.y * chunk_rows, r1 = N - r0 < chunk_rows ? N : r0 + chunk_rows;
    float a0 = 0.0f, a1 = 0.0f;
    if (c < C)
        for (int r = r0 + lane; r < r1; r += COL_LANES) op(r, c, a0, a1);
    p0[lane][col] = a0;
    p1[lane][col] = a1;
    __syncthreads();
    if (lane == 0 && c < C) {
        float s0 = 0.0f, s1 = 0.0f;
        for (int l = 0; l < COL_LANES; l++) {
            s0 += p0[l][col];
            s1 += p1[l][col];
        }
        if (gridDim.y == 1) {
            out0[c] += s0;
            if (out1) out1[c] += s1;
        } else {
            part[(size_t)blockIdx.y * C + c] = s0;
            if (out1) part[((size_t)gridDim.y + blockIdx.y) * C + c] = s1;
        }
    }
}

/* out0[c] (and out1[c]) += the chunks' sums of column c, in chunk order */
__global__ void colsum_parts_kernel(float *out0, float *out1, const float *part, int chunks, int C) {
    int c = blockIdx.x * blockDim.x + threadIdx.x;
    if (c >= C) return;
    float s0 = 0.0f, s1 = 0.0f;
    for (int k = 0; k < chunks; k++) {
        s0 += part[(size_t)k * C + c];
        if (out1) s1 += part[(size_t)(chunks + k) * C + c];
    }
    out0[c] += s0;
    if (out1) out1[c] += s1;
}

struct ln_dwdb_terms { /* a0: dout * norm (dw), a1: dout (db) */
    const bf16 *dout, *inp;
    const float *mean, *rstd;
    int C;
    __device__ void operator()(int r, int c, float &a0, float &a1) const {
        const size_t i = (size_t)r * C + c;
        const float d = ld(dout[i]);
        a0 += (ld(inp[i]) - mean[r]) * rstd[r] * d;
        a1 += d;
    }
};

struct col_terms { /* a0: x */
    const bf16 *x;
    int C;
    __device__ void operator()(int r, int c, float &a0, float &) const { a0 += ld(x[(size_t)r * C + c]); }
};

static float *col_part_of(strata_stream *s); /* the chunks' buffer (kstate, below) */

/* The chunks' sums share one buffer per device, so column sums run on the compute stream
 * only (where the model calls them), in stream order, as sumsq does. */
template <class Op>
static void colsum2_launch(strata_stream *s, const char *what, Op op, float *out0, float *out1, int N, int C) {
    if (!strata_cuda_is_compute(s))
        strata_panic(__FILE__, __LINE__, "%s launched off the compute stream: column sums run there only (their "
                     "chunks' sums share one buffer)", what);
    cudaStream_t st = strata_cuda_stream_handle(s);
    int chunks = col_chunks(N, C), chunk_rows = (N + chunks - 1) / chunks;
    float *part = col_part_of(s);
    dim3 grid((unsigned)((C + COL_COLS - 1) / COL_COLS), (unsigned)chunks);
    colsum2_kernel<<<grid, COL_COLS * COL_LANES, 0, st>>>(op, out0, out1, part, N, C, chunk_rows);
    LAUNCH_CHECK(what);
    if (chunks > 1) {
        colsum_parts_kernel<<<(C + EW_THREADS - 1) / EW_THREADS, EW_THREADS, 0, st>>>(out0, out1, part, chunks, C);
        LAUNCH_CHECK(what);
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
    colsum2_launch(s, "layernorm_backward (dw, db)", ln_dwdb_terms{(const bf16 *)dout, (const bf16 *)inp, mean, rstd, C},
                   dw, db, N, C);
}

/* ---------------------------------------------------------------------------------- */
/* RMSNorm: one warp per vector                                                          */
/*
 * Vector v of the N * heads starts at (v / heads) * stride + (v % heads) * C (stride is the
 * header's ld, renamed here: ld() loads a bf16); rstd[v] is its.
 * As the CPU oracle: rstd = 1 / sqrt(mean(x^2) + eps) (IEEE sqrtf and division: no fast
 * math here), out = w * (x * rstd). A warp reads its whole vector before it writes any of
 * it, and a lane writes only the elements it read, so out may alias inp. */

#define RMS_WARPS 8

__device__ __forceinline__ size_t rms_offset(size_t v, int heads, int C, int stride) {
    return v / (size_t)heads * (size_t)stride + v % (size_t)heads * (size_t)C;
}

__global__ void rms_fwd_kernel(bf16 *out, float *rstd, const bf16 *inp, const bf16 *w, size_t nv, int heads,
                               int C, int stride, float eps) {
    size_t v = (size_t)blockIdx.x * RMS_WARPS + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (v >= nv) return; /* the whole warp */
    size_t off = rms_offset(v, heads, C, stride);
    const bf16 *x = inp + off;
    bf16 *o = out + off;
    float ss = 0.0f;
    for (int c = lane; c < C; c += 32) {
        float xv = ld(x[c]);
        ss += xv * xv;
    }
    float rs = 1.0f / sqrtf(warp_sum(ss) / (float)C + eps);
    for (int c = lane; c < C; c += 32) o[c] = to_bf16(ld(w[c]) * (ld(x[c]) * rs));
    if (lane == 0) rstd[v] = rs;
}

static void cuda_rmsnorm_forward(strata_stream *s, void *out, float *rstd, const void *inp, const void *w,
                                 int N, int heads, int C, int stride, float eps) {
    if (N <= 0 || heads <= 0 || C <= 0) return;
    size_t nv = (size_t)N * heads;
    rms_fwd_kernel<<<(unsigned)((nv + RMS_WARPS - 1) / RMS_WARPS), RMS_WARPS * 32, 0,
                     strata_cuda_stream_handle(s)>>>((bf16 *)out, rstd, (const bf16 *)inp, (const bf16 *)w, nv,
                                                     heads, C, stride, eps);
    LAUNCH_CHECK("rmsnorm_forward");
}

/* dinp (+=), one warp per vector: with norm = x rstd and dnorm = w dout,
 * dinp = rstd (dnorm - norm mean(dnorm norm)), LayerNorm's backward without the mean */
__global__ void rms_bwd_dinp_kernel(bf16 *dinp, const bf16 *dout, const bf16 *inp, const bf16 *w,
                                    const float *rstd, size_t nv, int heads, int C, int stride) {
    size_t v = (size_t)blockIdx.x * RMS_WARPS + (threadIdx.x >> 5);
    int lane = threadIdx.x & 31;
    if (v >= nv) return;
    size_t off = rms_offset(v, heads, C, stride);
    const bf16 *x = inp + off, *d = dout + off;
    bf16 *di = dinp + off;
    float rs = rstd[v], sdn = 0.0f;
    for (int c = lane; c < C; c += 32) sdn += (ld(w[c]) * ld(d[c])) * (ld(x[c]) * rs);
    float dnmean = warp_sum(sdn) / (float)C;
    for (int c = lane; c < C; c += 32)
        di[c] = to_bf16(ld(di[c]) + (ld(w[c]) * ld(d[c]) - (ld(x[c]) * rs) * dnmean) * rs);
}

/* dw (+=) = sum over vectors of dout * norm: colsum2's column sums over the N * heads
 * vectors (a term's offset takes one integer division, beside two loads) */
struct rms_dw_terms { /* a0: dout * norm */
    const bf16 *dout, *inp;
    const float *rstd;
    int heads, C, stride;
    __device__ void operator()(int v, int c, float &a0, float &) const {
        const int n = v / heads, hd = v - n * heads;
        const size_t off = (size_t)n * stride + (size_t)hd * C + (size_t)c;
        a0 += ld(dout[off]) * (ld(inp[off]) * rstd[v]);
    }
};

static void cuda_rmsnorm_backward(strata_stream *s, void *dinp, float *dw, const void *dout, const void *inp,
                                  const void *w, const float *rstd, int N, int heads, int C, int stride) {
    if (N <= 0 || heads <= 0 || C <= 0) return;
    cudaStream_t st = strata_cuda_stream_handle(s);
    size_t nv = (size_t)N * heads;
    rms_bwd_dinp_kernel<<<(unsigned)((nv + RMS_WARPS - 1) / RMS_WARPS), RMS_WARPS * 32, 0, st>>>(
        (bf16 *)dinp, (const bf16 *)dout, (const bf16 *)inp, (const bf16 *)w, rstd, nv, heads, C, stride);
    LAUNCH_CHECK("rmsnorm_backward (dinp)");
    if (nv > INT_MAX) strata_panic(__FILE__, __LINE__, "rmsnorm_backward: %zu vectors (dw sums at most INT_MAX)", nv);
    colsum2_launch(s, "rmsnorm_backward (dw)", rms_dw_terms{(const bf16 *)dout, (const bf16 *)inp, rstd, heads, C, stride},
                   dw, NULL, (int)nv, C);
}

/* ---------------------------------------------------------------------------------- */
/* Rotary positions, in place: a warp per row, a lane per pair, over the row's heads     */
/*
 * Pair i of a head is elements i and i + hs/2 (Hugging Face's rotate_half layout); row r
 * of the B*T is position t = r % T (pos[r] with packed documents), its angle
 * (float)t * inv_freq[i] in fp32 and its cosine and sine from sincosf, the accurate one (no
 * fast math here; the CPU oracle uses cosf and sinf, so the two agree to an ulp or two, not
 * bit for bit). The forward turns
 * (x1, x2) by +angle: (x1 cos - x2 sin, x2 cos + x1 sin); the backward by -angle, the
 * rotation's transpose, which is the same with sin negated (exactly). Each thread reads
 * its two elements before it writes them, so in place is safe. */

#define ROPE_ROWS 8 /* rows per block of (32, ROPE_ROWS) threads */

__global__ void rope_kernel(bf16 *x, const float *inv_freq, const int32_t *pos, size_t rows, int T, int heads,
                            int hs, int stride, float dir) {
    const int half = hs / 2;
    for (size_t r = (size_t)blockIdx.x * ROPE_ROWS + threadIdx.y; r < rows; r += (size_t)gridDim.x * ROPE_ROWS) {
        const int t = pos ? pos[r] : (int)(r % (size_t)T);
        bf16 *row = x + r * (size_t)stride;
        for (int i = threadIdx.x; i < half; i += 32) {
            float sn, cs;
            sincosf((float)t * inv_freq[i], &sn, &cs);
            sn *= dir;
            bf16 *a = row + i;
            for (int h = 0; h < heads; h++, a += hs) {
                const float x1 = ld(a[0]), x2 = ld(a[half]);
                a[0] = to_bf16(x1 * cs - x2 * sn);
                a[half] = to_bf16(x2 * cs + x1 * sn);
            }
        }
    }
}

static void rope_launch(strata_stream *s, const char *what, void *x, const float *inv_freq, const int32_t *pos,
                        int B, int T, int heads, int hs, int stride, float dir) {
    if (B <= 0 || T <= 0 || heads <= 0 || hs < 2) return;
    size_t rows = (size_t)B * T;
    rope_kernel<<<grid_for(rows, ROPE_ROWS), dim3(32, ROPE_ROWS), 0, strata_cuda_stream_handle(s)>>>(
        (bf16 *)x, inv_freq, pos, rows, T, heads, hs, stride, dir);
    LAUNCH_CHECK(what);
}

static void cuda_rope_forward(strata_stream *s, void *x, const float *inv_freq, const int32_t *pos, int B, int T,
                              int heads, int hs, int stride) {
    rope_launch(s, "rope_forward", x, inv_freq, pos, B, T, heads, hs, stride, 1.0f);
}

static void cuda_rope_backward(strata_stream *s, void *dx, const float *inv_freq, const int32_t *pos, int B, int T,
                               int heads, int hs, int stride) {
    rope_launch(s, "rope_backward", dx, inv_freq, pos, B, T, heads, hs, stride, -1.0f);
}

/* ---------------------------------------------------------------------------------- */
/* SwiGLU: a thread per (row, j), gate gu[n, j] and up gu[n, I + j]                      */
/*
 * silu(x) = x sigmoid(x) through e = exp(-|x|), which never overflows, as the CPU oracle
 * computes it: sigmoid(x) = 1 / (1 + e) for x >= 0 and e / (1 + e) below, 1 - sigmoid(x)
 * the other of the two. A thread reads gate and up before it writes their gradients, so
 * dgu may alias gu. */

__device__ __forceinline__ void swiglu_sigmoid(float x, float &sig, float &sig_c) {
    float e = expf(-fabsf(x)), r = 1.0f / (1.0f + e);
    sig = (x >= 0.0f ? 1.0f : e) * r;
    sig_c = (x >= 0.0f ? e : 1.0f) * r; /* 1 - sigmoid(x) */
}

/* Rows stride over blockIdx.y (at most 65535), columns j over blockIdx.x: no division. */
#define SWIGLU_ROWS_Y(row, N) for (size_t row = blockIdx.y; row < (size_t)(N); row += gridDim.y)
#define SWIGLU_COLS_X(j, I) for (int j = blockIdx.x * blockDim.x + threadIdx.x; j < (I); j += gridDim.x * blockDim.x)

__global__ void swiglu_fwd_kernel(bf16 *out, const bf16 *gu, int N, int I) {
    SWIGLU_ROWS_Y(row, N) {
        const bf16 *g = gu + row * 2 * (size_t)I, *u = g + I;
        bf16 *o = out + row * (size_t)I;
        SWIGLU_COLS_X(j, I) {
            float x = ld(g[j]), sig, sig_c;
            swiglu_sigmoid(x, sig, sig_c);
            o[j] = to_bf16((x * sig) * ld(u[j]));
        }
    }
}

/* dgate = dout * up * silu'(gate), silu' = sigmoid (1 + x (1 - sigmoid)); dup = dout * silu */
__global__ void swiglu_bwd_kernel(bf16 *dgu, const bf16 *dout, const bf16 *gu, int N, int I) {
    SWIGLU_ROWS_Y(row, N) {
        const bf16 *g = gu + row * 2 * (size_t)I, *u = g + I, *d = dout + row * (size_t)I;
        bf16 *dg = dgu + row * 2 * (size_t)I, *du = dg + I;
        SWIGLU_COLS_X(j, I) {
            float x = ld(g[j]), uj = ld(u[j]), dj = ld(d[j]), sig, sig_c;
            swiglu_sigmoid(x, sig, sig_c);
            dg[j] = to_bf16(dj * uj * (sig * (1.0f + x * sig_c)));
            du[j] = to_bf16(dj * (x * sig));
        }
    }
}

static dim3 swiglu_grid(int N, int I) {
    return dim3((unsigned)((I + EW_THREADS - 1) / EW_THREADS), (unsigned)(N < 65535 ? N : 65535));
}

static void cuda_swiglu_forward(strata_stream *s, void *out, const void *gu, int N, int I) {
    if (N <= 0 || I <= 0) return;
    swiglu_fwd_kernel<<<swiglu_grid(N, I), EW_THREADS, 0, strata_cuda_stream_handle(s)>>>(
        (bf16 *)out, (const bf16 *)gu, N, I);
    LAUNCH_CHECK("swiglu_forward");
}

static void cuda_swiglu_backward(strata_stream *s, void *dgu, const void *dout, const void *gu, int N, int I) {
    if (N <= 0 || I <= 0) return;
    swiglu_bwd_kernel<<<swiglu_grid(N, I), EW_THREADS, 0, strata_cuda_stream_handle(s)>>>(
        (bf16 *)dgu, (const bf16 *)dout, (const bf16 *)gu, N, I);
    LAUNCH_CHECK("swiglu_backward");
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

#define SUMSQ_BLOCKS 1024

struct strata_cuda_kstate {
    int ordinal;
    cublasLtHandle_t lt;
    void *workspace;
    double *sumsq_part; /* SUMSQ_BLOCKS block sums of sumsq, compute stream only */
    float *col_part;    /* COL_PART_FLOATS: the chunks' column sums, compute stream only */
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

static int upload_q8_tables(int ordinal);

int strata_cuda_kstate_create(int ordinal, strata_cuda_kstate **out) {
    strata_cuda_kstate *ks = (strata_cuda_kstate *)strata_xcalloc(1, sizeof *ks);
    ks->ordinal = ordinal;
    cublasStatus_t st = cublasLtCreate(&ks->lt);
    if (st != CUBLAS_STATUS_SUCCESS) {
        free(ks);
        return strata_fail("cublasLtCreate on cuda:%d failed: %s", ordinal, cublasLtGetStatusString(st));
    }
    cudaError_t e = cudaMalloc(&ks->workspace, LT_WORKSPACE_BYTES);
    if (e == cudaSuccess) {
        e = cudaMalloc(&ks->sumsq_part, SUMSQ_BLOCKS * sizeof(double));
        if (e != cudaSuccess) cudaFree(ks->workspace);
    }
    if (e == cudaSuccess) {
        e = cudaMalloc(&ks->col_part, COL_PART_FLOATS * sizeof(float));
        if (e != cudaSuccess) cudaFree(ks->sumsq_part), cudaFree(ks->workspace);
    }
    if (e != cudaSuccess) {
        cublasLtDestroy(ks->lt);
        free(ks);
        return strata_fail("the kernels' buffers on cuda:%d (cuBLASLt workspace of %zu MiB, column and norm "
                           "sums): cudaMalloc failed: %s", ordinal, LT_WORKSPACE_BYTES >> 20, cudaGetErrorString(e));
    }
    if (upload_q8_tables(ordinal)) {
        cudaFree(ks->col_part);
        cudaFree(ks->sumsq_part);
        cudaFree(ks->workspace);
        cublasLtDestroy(ks->lt);
        free(ks);
        return -1;
    }
    pthread_mutex_init(&ks->mu, NULL);
    *out = ks;
    return 0;
}

static float *col_part_of(strata_stream *s) { return strata_cuda_kstate_of(s)->col_part; }

static void plan_release(gemm_plan *p) {
    cublasLtMatrixLayoutDestroy(p->la);
    cublasLtMatrixLayoutDestroy(p->lb);
    cublasLtMatrixLayoutDestroy(p->ld);
    cublasLtMatmulDescDestroy(p->desc);
}

void strata_cuda_kstate_destroy(strata_cuda_kstate *ks) {
    if (!ks) return;
    for (int i = 0; i < ks->n_plans; i++) plan_release(&ks->plans[i]);
    cudaFree(ks->col_part);
    cudaFree(ks->sumsq_part);
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
        colsum2_launch(s, "matmul_backward (dbias)", col_terms{(const bf16 *)dout, N}, dbias, NULL, M, N);
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

/* bf16 moments (optim.state: bf16): widened exactly, the step above in fp32, each written
 * back rounded to nearest even (to_bf16, the CPU's strata_f32_to_bf16). */
__global__ void adamw_bf16_kernel(float *master, bf16 *param_out, const float *grad, uint16_t *m, uint16_t *v,
                                  size_t n, strata_adamw_args a) {
    GRID_STRIDE(i, n) {
        float m0 = __uint_as_float((uint32_t)m[i] << 16), v0 = __uint_as_float((uint32_t)v[i] << 16);
        float g = __fmul_rn(grad[i], a.grad_scale);
        float mi = __fadd_rn(__fmul_rn(a.beta1, m0), __fmul_rn(__fsub_rn(1.0f, a.beta1), g));
        float vi = __fadd_rn(__fmul_rn(a.beta2, v0), __fmul_rn(__fmul_rn(__fsub_rn(1.0f, a.beta2), g), g));
        m[i] = __bfloat16_as_ushort(to_bf16(mi));
        v[i] = __bfloat16_as_ushort(to_bf16(vi));
        float mhat = __fdiv_rn(mi, a.bc1), vhat = __fdiv_rn(vi, a.bc2);
        float p = master[i];
        float step = __fadd_rn(__fdiv_rn(mhat, __fadd_rn(__fsqrt_rn(vhat), a.eps)), __fmul_rn(a.weight_decay, p));
        p = __fsub_rn(p, __fmul_rn(a.lr, step));
        master[i] = p;
        if (param_out) param_out[i] = to_bf16(p);
    }
}

static void cuda_adamw_bf16(strata_stream *s, float *master, void *param_out, const float *grad, uint16_t *m,
                            uint16_t *v, size_t n, const strata_adamw_args *a) {
    if (!n) return;
    adamw_bf16_kernel<<<grid_for(n, EW_THREADS), EW_THREADS, 0, strata_cuda_stream_handle(s)>>>(
        master, (bf16 *)param_out, grad, m, v, n, *a);
    LAUNCH_CHECK("adamw_bf16");
}

/* 8-bit moments (optim.state: int8; core/quant.h). The two maps, each its 256 values then
 * its 255 midpoints (signed first), uploaded once per device (strata_cuda_kstate_create)
 * from core/quant.c's tables, so both backends search the same floats. */
#define Q8_TABLE 511
__constant__ float q8_tables[2 * Q8_TABLE];

/* The quantized segments of a range, by value (about 1 KiB of kernel parameters). */
struct q8_segments {
    unsigned long long lo[STRATA_ADAMW_MAX_SEGMENTS], hi[STRATA_ADAMW_MAX_SEGMENTS];
    unsigned char decay[STRATA_ADAMW_MAX_SEGMENTS];
    int n;
};

#define Q8_THREADS 256
#define Q8_PER_THREAD (STRATA_Q8_BLOCK / Q8_THREADS)

/* core/quant.h's nearest code: the number of midpoints strictly below x (ties go low), a
 * positive x never code 0. */
__device__ __forceinline__ uint8_t q8_code(const float *mid, float x) {
    unsigned lo = 0;
    for (unsigned step = 128; step; step >>= 1) lo = mid[lo + step - 1] < x ? lo + step : lo;
    return (uint8_t)(lo + (lo == 0 && x > 0.0f)); /* a positive x never code 0 (core/quant.h) */
}

__device__ __forceinline__ float block_max(float v, float *part) {
    int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
    for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
    if (lane == 0) part[warp] = v;
    __syncthreads();
    float r = 0.0f;
    for (int w = 0; w < Q8_THREADS / 32; w++) r = fmaxf(r, part[w]);
    return r;
}

/* One CUDA block per quantization block of 2048 elements, 8 per thread: dequantize with the
 * old absmax, the AdamW step as adamw_kernel does it, the new absmax (a max: the same in any
 * order, NaN ignored as on the CPU), then the codes. Elements of no quantized segment (fp32
 * small tensors) are left alone and count for nothing. */
__global__ void __launch_bounds__(Q8_THREADS) adamw_q8_kernel(float *master, bf16 *param_out, const float *grad,
                                                              uint8_t *c1, uint8_t *c2, float *absmax1, float *absmax2,
                                                              size_t n, q8_segments segs, strata_adamw_args a) {
    __shared__ float tab[2 * Q8_TABLE];
    __shared__ float part1[Q8_THREADS / 32], part2[Q8_THREADS / 32];
    for (int i = threadIdx.x; i < 2 * Q8_TABLE; i += Q8_THREADS) tab[i] = q8_tables[i];
    __syncthreads();
    const float *val_s = tab, *mid_s = tab + 256, *val_u = tab + Q8_TABLE, *mid_u = tab + Q8_TABLE + 256;
    size_t b0 = (size_t)blockIdx.x * STRATA_Q8_BLOCK;
    float old1 = absmax1[blockIdx.x], old2 = absmax2[blockIdx.x];
    float mv[Q8_PER_THREAD] = {0}, vv[Q8_PER_THREAD] = {0};
    int in_seg[Q8_PER_THREAD];
    float mx1 = 0.0f, mx2 = 0.0f;
    for (int j = 0; j < Q8_PER_THREAD; j++) {
        size_t i = b0 + (size_t)j * Q8_THREADS + threadIdx.x;
        in_seg[j] = 0;
        if (i >= n) continue;
        int lo = 0, hi = segs.n; /* the first segment that ends after i */
        while (lo < hi) {
            int mid = (lo + hi) / 2;
            if (segs.hi[mid] <= i) lo = mid + 1;
            else hi = mid;
        }
        if (lo == segs.n || segs.lo[lo] > i) continue;
        in_seg[j] = 1;
        float wd = segs.decay[lo] ? a.weight_decay : 0.0f;
        float m0 = __fmul_rn(val_s[c1[i]], old1), v0 = __fmul_rn(val_u[c2[i]], old2);
        float g = __fmul_rn(grad[i], a.grad_scale);
        float mi = __fadd_rn(__fmul_rn(a.beta1, m0), __fmul_rn(__fsub_rn(1.0f, a.beta1), g));
        float vi = __fadd_rn(__fmul_rn(a.beta2, v0), __fmul_rn(__fmul_rn(__fsub_rn(1.0f, a.beta2), g), g));
        float mhat = __fdiv_rn(mi, a.bc1), vhat = __fdiv_rn(vi, a.bc2);
        float p = master[i];
        float step = __fadd_rn(__fdiv_rn(mhat, __fadd_rn(__fsqrt_rn(vhat), a.eps)), __fmul_rn(wd, p));
        p = __fsub_rn(p, __fmul_rn(a.lr, step));
        master[i] = p;
        if (param_out) param_out[i] = to_bf16(p);
        mv[j] = mi;
        vv[j] = vi;
        mx1 = fmaxf(mx1, fabsf(mi));
        mx2 = fmaxf(mx2, fabsf(vi));
    }
    float new1 = block_max(mx1, part1), new2 = block_max(mx2, part2);
    if (threadIdx.x == 0) {
        absmax1[blockIdx.x] = new1;
        absmax2[blockIdx.x] = new2;
    }
    for (int j = 0; j < Q8_PER_THREAD; j++) {
        if (!in_seg[j]) continue;
        size_t i = b0 + (size_t)j * Q8_THREADS + threadIdx.x;
        c1[i] = q8_code(mid_s, new1 > 0.0f ? __fdiv_rn(mv[j], new1) : 0.0f);
        c2[i] = q8_code(mid_u, new2 > 0.0f ? __fdiv_rn(vv[j], new2) : 0.0f);
    }
}

static void cuda_adamw_q8(strata_stream *s, float *master, void *param_out, const float *grad, uint8_t *m1,
                          uint8_t *m2, float *absmax1, float *absmax2, size_t n, const strata_adamw_segment *seg,
                          int n_seg, const strata_adamw_args *a) {
    if (!n) return;
    q8_segments segs;
    memset(&segs, 0, sizeof segs);
    for (int i = 0; i < n_seg; i++) {
        if (!seg[i].quant || !seg[i].n) continue;
        segs.lo[segs.n] = seg[i].lo;
        segs.hi[segs.n] = seg[i].lo + seg[i].n;
        segs.decay[segs.n] = (unsigned char)(seg[i].decay != 0);
        segs.n++;
    }
    unsigned blocks = (unsigned)strata_q8_blocks(n);
    adamw_q8_kernel<<<blocks, Q8_THREADS, 0, strata_cuda_stream_handle(s)>>>(
        master, (bf16 *)param_out, grad, m1, m2, absmax1, absmax2, n, segs, *a);
    LAUNCH_CHECK("adamw_q8");
}

/* The quantization maps into this device's constant memory (once per device open). */
static int upload_q8_tables(int ordinal) {
    float host[2 * Q8_TABLE];
    const strata_q8_map *maps[2] = {strata_q8_signed(), strata_q8_unsigned()};
    for (int k = 0; k < 2; k++) {
        memcpy(host + k * Q8_TABLE, maps[k]->value, 256 * sizeof(float));
        memcpy(host + k * Q8_TABLE + 256, maps[k]->mid, 255 * sizeof(float));
    }
    cudaError_t e = cudaMemcpyToSymbol(q8_tables, host, sizeof host);
    if (e != cudaSuccess)
        return strata_fail("uploading the 8-bit quantization maps to cuda:%d failed: %s", ordinal, cudaGetErrorString(e));
    return 0;
}

#define SUMSQ_THREADS 256

/* In two kernels, without atomics, so the sum is the same on every run: each of at most
 * SUMSQ_BLOCKS blocks writes its part of the sum, then one block adds the parts in a fixed
 * tree. The parts live in the device's one buffer for them, so sumsq runs on the compute
 * stream only (where the engine calls it), in stream order. */
__global__ void sumsq_part_kernel(double *part, const float *x, size_t n) {
    double acc = 0.0;
    GRID_STRIDE(i, n) {
        double v = (double)x[i];
        acc += v * v;
    }
    acc = block_sum_d(acc);
    if (threadIdx.x == 0) part[blockIdx.x] = acc;
}

__global__ void __launch_bounds__(SUMSQ_BLOCKS) sumsq_total_kernel(double *out, const double *part, unsigned nb) {
    double total = block_sum_d(threadIdx.x < nb ? part[threadIdx.x] : 0.0);
    if (threadIdx.x == 0) *out += total;
}

static void cuda_sumsq(strata_stream *s, double *out, const float *x, size_t n) {
    if (!n) return;
    if (!strata_cuda_is_compute(s))
        strata_panic(__FILE__, __LINE__, "sumsq launched off the compute stream: it runs there only (its block "
                     "sums share one buffer)");
    unsigned blocks = grid_for(n, SUMSQ_THREADS);
    if (blocks > SUMSQ_BLOCKS) blocks = SUMSQ_BLOCKS;
    double *part = strata_cuda_kstate_of(s)->sumsq_part;
    cudaStream_t st = strata_cuda_stream_handle(s);
    sumsq_part_kernel<<<blocks, SUMSQ_THREADS, 0, st>>>(part, x, n);
    LAUNCH_CHECK("sumsq (parts)");
    sumsq_total_kernel<<<1, SUMSQ_BLOCKS, 0, st>>>(out, part, blocks);
    LAUNCH_CHECK("sumsq (total)");
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

/* Designated, in the order of struct strata_kernels: nvcc's front end rejects an entry out
 * of order and the host compiler warns about a missing one. */
extern "C" const strata_kernels strata_kernels_cuda = {
    .encoder_forward = cuda_encoder_forward,
    .encoder_backward = cuda_encoder_backward,
    .layernorm_forward = cuda_layernorm_forward,
    .layernorm_backward = cuda_layernorm_backward,
    .matmul_forward = cuda_matmul_forward,
    .matmul_backward = cuda_matmul_backward,
    .attention_forward = strata_cuda_attention_forward,
    .attention_backward = strata_cuda_attention_backward,
    .gelu_forward = cuda_gelu_forward,
    .gelu_backward = cuda_gelu_backward,
    .residual_forward = cuda_residual_forward,
    .add_inplace = cuda_add_inplace,
    .crossentropy = cuda_crossentropy,
    .loss_accumulate = cuda_loss_accumulate,
    .adamw = cuda_adamw,
    .adamw_bf16 = cuda_adamw_bf16,
    .adamw_q8 = cuda_adamw_q8,
    .sumsq = cuda_sumsq,
    .accumulate_f32 = cuda_accumulate_f32,
    .convert = cuda_convert,
    .scale_f32 = cuda_scale_f32,
    .rmsnorm_forward = cuda_rmsnorm_forward,
    .rmsnorm_backward = cuda_rmsnorm_backward,
    .rope_forward = cuda_rope_forward,
    .rope_backward = cuda_rope_backward,
    .swiglu_forward = cuda_swiglu_forward,
    .swiglu_backward = cuda_swiglu_backward,
};
