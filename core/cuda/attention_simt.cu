/* core/cuda/attention_simt.cu: causal self-attention of core/kernels.h on the CUDA cores,
 * the default implementation (core/cuda/attention.cu chooses between this file and
 * core/cuda/attention_tc.cu), for head sizes 16, 32, 64, 80, 96 and 128. Computed without a
 * T x T buffer: the forward streams key tiles through shared memory with an online softmax
 * (four threads per query, fp32 state) and saves the row log-sum-exp; the backward
 * recomputes probabilities from it in two passes, dQ (per query head and query) and dK/dV
 * (per key/value head and key, over the query heads that share it), so every output
 * element has one writer and needs no atomics. Everything but the two entry points at the
 * bottom (declared in core/cuda/attention.cuh) is private to this file. */
#include <cuda_bf16.h>
#include <math.h>

#include "core/cuda/attention.cuh"
#include "core/cuda/cuda_common.h"
#include "core/cuda/kernels_common.cuh"

/*
 * qkv (B,T,W), W = (NH + 2 NKV) hs: query head h at [b,t, h hs .. +hs), its key/value head
 * kvh = h / (NH / NKV) at (NH + kvh) hs (k) and (NH + NKV + kvh) hs (v); out and dout
 * (B,T,NH hs). NKV == NH is multi-head attention (kvh = h). Each block computes its base
 * pointers once, so the loops below are the same for every NKV.
 * Scores are kept in the log2 domain (q pre-scaled by scale * log2 e) so exp2f does the
 * exponentials; lse is saved in natural log, as the CPU oracle saves it.
 *
 * A row (a query, or in the dK/dV pass a key) belongs to ATT_SPLIT = 4 adjacent threads,
 * each holding a quarter of its head dimensions in registers, in 4-float chunks
 * interleaved across the four (thread `sub` owns dims 16c + 4 sub .. +3 for every chunk
 * c), so the four read one contiguous 64-byte run of a shared tile row: 16-byte loads,
 * no bank conflicts. A dot product is the four partial sums added by two shuffles. Every
 * lane of a warp runs the shuffles; rows outside the causal mask or past T take part
 * and have their results masked.
 * With documents (pos), a row's visible keys start at its lo (attention.cuh): the query
 * kernels start at the key tile holding their first row's lo, and the dK/dV kernel stops
 * at the end of its last key's document (att_doc_end); within, lo masks like causality. */

namespace {

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

/* keys [k0, k0 + ATT_KT) of one sequence's key/value head (kb, vb: its row 0, rows W
 * apart) into shared memory as fp32; rows past T are zero */
template <int HS>
__device__ __forceinline__ void load_kv_tile(float (*ks)[HS], float (*vs)[HS], const bf16 *kb,
                                             const bf16 *vb, size_t W, int k0, int T) {
    for (int e = threadIdx.x; e < ATT_KT * HS; e += blockDim.x) {
        int j = e / HS, d = e % HS, key = k0 + j;
        float kv = 0.0f, vv = 0.0f;
        if (key < T) {
            kv = ld(kb[(size_t)key * W + d]);
            vv = ld(vb[(size_t)key * W + d]);
        }
        ks[j][d] = kv;
        vs[j][d] = vv;
    }
}

/* out, lse of one query head: grid (row tiles, B NH) */
template <int HS>
__global__ void __launch_bounds__(ATT_THREADS) attn_fwd_kernel(bf16 *out, float *lse, const bf16 *qkv,
                                                               const int *pos, int T, int NH, int NKV,
                                                               float qscale) {
    __shared__ __align__(16) float ks[ATT_KT][HS];
    __shared__ __align__(16) float vs[ATT_KT][HS];
    int bh = blockIdx.y, b = bh / NH, h = bh % NH, kvh = h / (NH / NKV);
    int q0 = (gridDim.x - 1 - blockIdx.x) * ATT_ROWS; /* longest blocks first */
    int sub = threadIdx.x & (ATT_SPLIT - 1), i = q0 + threadIdx.x / ATT_SPLIT;
    int active = i < T;
    int W = (NH + 2 * NKV) * HS, C = NH * HS; /* qkv and out row widths */
    const bf16 *rows = qkv + (size_t)b * T * W;
    const bf16 *qb = rows + (size_t)h * HS, *kb = rows + (size_t)(NH + kvh) * HS,
               *vb = rows + (size_t)(NH + NKV + kvh) * HS;
    float q[HS / 4], o[HS / 4];
    if (active) load_quarter<HS>(q, qb + (size_t)i * W, sub, qscale);
#pragma unroll
    for (int d = 0; d < HS / 4; d++) {
        if (!active) q[d] = 0.0f;
        o[d] = 0.0f;
    }
    float m = -INFINITY, l = 0.0f;
    const int *pos_row = pos ? pos + (size_t)b * T : NULL;
    const int lo = active ? att_doc_lo(pos_row, i) : 0;
    int kend = min(q0 + ATT_ROWS, T);
    for (int k0 = att_doc_lo(pos_row, q0) / ATT_KT * ATT_KT; k0 < kend; k0 += ATT_KT) {
        __syncthreads();
        load_kv_tile<HS>(ks, vs, kb, vb, W, k0, T);
        __syncthreads();
        int nvis = active ? min(ATT_KT, i - k0 + 1) : 0; /* keys k0 + jlo .. i are visible */
        int jlo = max(0, lo - k0);
        float sc[ATT_KT], mt = m;
#pragma unroll
        for (int j = 0; j < ATT_KT; j++) {
            sc[j] = quad_sum(dot_quarter<HS>(q, ks[j], sub));
            if (j >= jlo && j < nvis) mt = fmaxf(mt, sc[j]);
        }
        if (nvis <= jlo) continue;
        float corr = exp2f(m - mt); /* 0 on the first tile, where l and o are 0 */
        l *= corr;
#pragma unroll
        for (int d = 0; d < HS / 4; d++) o[d] *= corr;
#pragma unroll
        for (int j = 0; j < ATT_KT; j++) {
            float p = j >= jlo && j < nvis ? exp2f(sc[j] - mt) : 0.0f;
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
 * dq = scale * sum over visible keys of ds k. Grid (row tiles, B NH). */
template <int HS>
__global__ void __launch_bounds__(ATT_THREADS) attn_bwd_dq_kernel(bf16 *dqkv, const bf16 *dout,
                                                                  const bf16 *qkv, const bf16 *out,
                                                                  const float *lse, const int *pos, int T, int NH,
                                                                  int NKV, float scale, float qscale) {
    __shared__ __align__(16) float ks[ATT_KT][HS];
    __shared__ __align__(16) float vs[ATT_KT][HS];
    int bh = blockIdx.y, b = bh / NH, h = bh % NH, kvh = h / (NH / NKV);
    int q0 = (gridDim.x - 1 - blockIdx.x) * ATT_ROWS;
    int sub = threadIdx.x & (ATT_SPLIT - 1), i = q0 + threadIdx.x / ATT_SPLIT;
    int active = i < T;
    int W = (NH + 2 * NKV) * HS, C = NH * HS; /* qkv and out row widths */
    const bf16 *rows = qkv + (size_t)b * T * W;
    const bf16 *qb = rows + (size_t)h * HS, *kb = rows + (size_t)(NH + kvh) * HS,
               *vb = rows + (size_t)(NH + NKV + kvh) * HS;
    size_t orow = ((size_t)b * T + i) * C + (size_t)h * HS;
    float q[HS / 4], dq[HS / 4], dov[HS / 4], ov[HS / 4];
    float lse2 = 0.0f;
    if (active) {
        load_quarter<HS>(q, qb + (size_t)i * W, sub, qscale);
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
    const int *pos_row = pos ? pos + (size_t)b * T : NULL;
    const int lo = active ? att_doc_lo(pos_row, i) : 0;
    int kend = min(q0 + ATT_ROWS, T);
    for (int k0 = att_doc_lo(pos_row, q0) / ATT_KT * ATT_KT; k0 < kend; k0 += ATT_KT) {
        __syncthreads();
        load_kv_tile<HS>(ks, vs, kb, vb, W, k0, T);
        __syncthreads();
        int nvis = active ? min(ATT_KT, i - k0 + 1) : 0;
        int jlo = max(0, lo - k0);
        int jmax = min(ATT_KT, kend - k0); /* the same for every lane: shuffles stay converged */
        for (int j = 0; j < jmax; j++) {
            float sc = quad_sum(dot_quarter<HS>(q, ks[j], sub));
            float dp = quad_sum(dot_quarter<HS>(dov, vs[j], sub));
            float ds = j >= jlo && j < nvis ? exp2f(sc - lse2) * (dp - D) : 0.0f;
            axpy_quarter<HS>(dq, ds, ks[j], sub);
        }
    }
    if (!active) return;
    store_quarter<HS>(dqkv + ((size_t)b * T + i) * W + (size_t)h * HS, dq, sub, scale);
}

/* dk, dv (=) of one key/value head, a key per row, summed over the NH / NKV query heads
 * that share it (in head order) and their queries at or after the key; query tiles, with
 * their lse and D = dout.out, stream through shared memory. Grid (row tiles, B NKV): a
 * key/value head's gradient is written once, by this block. */
template <int HS>
__global__ void __launch_bounds__(ATT_THREADS) attn_bwd_dkv_kernel(bf16 *dqkv, const bf16 *dout,
                                                                   const bf16 *qkv, const bf16 *out,
                                                                   const float *lse, const int *pos, int T, int NH,
                                                                   int NKV, float scale, float qscale) {
    __shared__ __align__(16) float qs[ATT_QT][HS];
    __shared__ __align__(16) float dos[ATT_QT][HS];
    __shared__ float ls[ATT_QT], Ds[ATT_QT];
    __shared__ int los[ATT_QT]; /* each query's first visible key */
    int bk = blockIdx.y, b = bk / NKV, kvh = bk % NKV, G = NH / NKV;
    int j0 = blockIdx.x * ATT_ROWS;
    int sub = threadIdx.x & (ATT_SPLIT - 1), j = j0 + threadIdx.x / ATT_SPLIT;
    int active = j < T;
    int W = (NH + 2 * NKV) * HS, C = NH * HS; /* qkv and out row widths */
    const bf16 *rows = qkv + (size_t)b * T * W;
    const size_t koff = (size_t)(NH + kvh) * HS, voff = (size_t)(NH + NKV + kvh) * HS;
    float kq[HS / 4], vq[HS / 4], dk[HS / 4], dv[HS / 4];
    if (active) {
        load_quarter<HS>(kq, rows + (size_t)j * W + koff, sub, 1.0f);
        load_quarter<HS>(vq, rows + (size_t)j * W + voff, sub, 1.0f);
    }
#pragma unroll
    for (int d = 0; d < HS / 4; d++) {
        if (!active) kq[d] = vq[d] = 0.0f;
        dk[d] = dv[d] = 0.0f;
    }
    /* D for the tile: 16 lanes per query, HS/16 dims each, reduced by shuffles */
    int dr = threadIdx.x / 16, dpart = threadIdx.x % 16;
    /* queries past the end of the last key's document see none of this block's keys */
    const int *pos_row = pos ? pos + (size_t)b * T : NULL;
    const int tend = att_doc_end(pos_row, min(j0 + ATT_ROWS, T) - 1, T);
    for (int h = kvh * G; h < (kvh + 1) * G; h++) {
        /* query head h: its q in qkv's rows, its dout and out rows, its lse */
        const bf16 *qb = rows + (size_t)h * HS;
        const bf16 *dob = dout + (size_t)b * T * C + (size_t)h * HS, *ob = out + (size_t)b * T * C + (size_t)h * HS;
        const float *lseh = lse + ((size_t)b * NH + h) * T;
        for (int t0 = j0; t0 < tend; t0 += ATT_QT) {
            __syncthreads();
            for (int e = threadIdx.x; e < ATT_QT * HS; e += ATT_THREADS) {
                int r = e / HS, d = e % HS, qi = t0 + r;
                float qv = 0.0f, dv_ = 0.0f;
                if (qi < T) {
                    qv = ld(qb[(size_t)qi * W + d]) * qscale;
                    dv_ = ld(dob[(size_t)qi * C + d]);
                }
                qs[r][d] = qv;
                dos[r][d] = dv_;
            }
            {
                int qi = t0 + dr;
                float part = 0.0f;
                if (qi < T) {
                    size_t orow = (size_t)qi * C;
                    for (int d = dpart; d < HS; d += 16) part += ld(dob[orow + d]) * ld(ob[orow + d]);
                }
                for (int o = 8; o > 0; o >>= 1) part += __shfl_xor_sync(0xffffffffu, part, o);
                if (dpart == 0) {
                    Ds[dr] = part;
                    ls[dr] = qi < T ? lseh[qi] * LOG2E : 0.0f;
                    los[dr] = qi < T ? att_doc_lo(pos_row, qi) : T;
                }
            }
            __syncthreads();
            int rmax = min(ATT_QT, T - t0); /* the same for every lane */
            for (int r = 0; r < rmax; r++) {
                float sc = quad_sum(dot_quarter<HS>(kq, qs[r], sub));
                float dp = quad_sum(dot_quarter<HS>(vq, dos[r], sub));
                int visible = active && t0 + r >= j && los[r] <= j; /* query t0 + r sees key j */
                float p = visible ? exp2f(sc - ls[r]) : 0.0f;
                float ds = p * (dp - Ds[r]);
                axpy_quarter<HS>(dv, p, dos[r], sub);
                axpy_quarter<HS>(dk, ds, qs[r], sub);
            }
        }
    }
    if (!active) return;
    /* qs holds q * scale * log2 e; dk = scale * sum ds q = ln 2 * sum ds qs */
    bf16 *drow = dqkv + ((size_t)b * T + j) * W;
    store_quarter<HS>(drow + koff, dk, sub, LN2);
    store_quarter<HS>(drow + voff, dv, sub, 1.0f);
}

template <int HS>
static void attention_forward_hs(cudaStream_t st, void *out, float *lse, const void *qkv, const int *pos, int B,
                                 int T, int NH, int NKV) {
    float scale = 1.0f / sqrtf((float)HS);
    dim3 grid((T + ATT_ROWS - 1) / ATT_ROWS, B * NH);
    attn_fwd_kernel<HS><<<grid, ATT_THREADS, 0, st>>>((bf16 *)out, lse, (const bf16 *)qkv, pos, T, NH, NKV,
                                                       scale * LOG2E);
    LAUNCH_CHECK("attention_forward");
}

template <int HS>
static void attention_backward_hs(cudaStream_t st, void *dqkv, const void *dout, const void *qkv,
                                  const void *out, const float *lse, const int *pos, int B, int T, int NH,
                                  int NKV) {
    float scale = 1.0f / sqrtf((float)HS);
    dim3 grid_q((T + ATT_ROWS - 1) / ATT_ROWS, B * NH), grid_kv((T + ATT_ROWS - 1) / ATT_ROWS, B * NKV);
    attn_bwd_dq_kernel<HS><<<grid_q, ATT_THREADS, 0, st>>>((bf16 *)dqkv, (const bf16 *)dout,
                                                           (const bf16 *)qkv, (const bf16 *)out, lse, pos, T,
                                                           NH, NKV, scale, scale * LOG2E);
    LAUNCH_CHECK("attention_backward (dq)");
    attn_bwd_dkv_kernel<HS><<<grid_kv, ATT_THREADS, 0, st>>>((bf16 *)dqkv, (const bf16 *)dout,
                                                             (const bf16 *)qkv, (const bf16 *)out, lse, pos, T,
                                                             NH, NKV, scale, scale * LOG2E);
    LAUNCH_CHECK("attention_backward (dk, dv)");
}

} /* namespace */

#define ATT_HEAD_SIZES "16, 32, 64, 80, 96 or 128"

/* the dispatcher's call when the tensor cores do not take it: one instantiation per head size */
void strata_cuda_attention_simt_forward(cudaStream_t st, void *out, float *lse, const void *qkv, const int *pos,
                                        int B, int T, int NH, int NKV, int hs) {
    switch (hs) {
    case 16: attention_forward_hs<16>(st, out, lse, qkv, pos, B, T, NH, NKV); break;
    case 32: attention_forward_hs<32>(st, out, lse, qkv, pos, B, T, NH, NKV); break;
    case 64: attention_forward_hs<64>(st, out, lse, qkv, pos, B, T, NH, NKV); break;
    case 80: attention_forward_hs<80>(st, out, lse, qkv, pos, B, T, NH, NKV); break;
    case 96: attention_forward_hs<96>(st, out, lse, qkv, pos, B, T, NH, NKV); break;
    case 128: attention_forward_hs<128>(st, out, lse, qkv, pos, B, T, NH, NKV); break;
    default:
        strata_panic(__FILE__, __LINE__, "attention_forward: head size %d (NH %d, NKV %d) is not "
                     "one the CUDA kernels are built for (" ATT_HEAD_SIZES ")", hs, NH, NKV);
    }
}

void strata_cuda_attention_simt_backward(cudaStream_t st, void *dqkv, const void *dout, const void *qkv,
                                         const void *out, const float *lse, const int *pos, int B, int T, int NH,
                                         int NKV, int hs) {
    switch (hs) {
    case 16: attention_backward_hs<16>(st, dqkv, dout, qkv, out, lse, pos, B, T, NH, NKV); break;
    case 32: attention_backward_hs<32>(st, dqkv, dout, qkv, out, lse, pos, B, T, NH, NKV); break;
    case 64: attention_backward_hs<64>(st, dqkv, dout, qkv, out, lse, pos, B, T, NH, NKV); break;
    case 80: attention_backward_hs<80>(st, dqkv, dout, qkv, out, lse, pos, B, T, NH, NKV); break;
    case 96: attention_backward_hs<96>(st, dqkv, dout, qkv, out, lse, pos, B, T, NH, NKV); break;
    case 128: attention_backward_hs<128>(st, dqkv, dout, qkv, out, lse, pos, B, T, NH, NKV); break;
    default:
        strata_panic(__FILE__, __LINE__, "attention_backward: head size %d (NH %d, NKV %d) is not "
                     "one the CUDA kernels are built for (" ATT_HEAD_SIZES ")", hs, NH, NKV);
    }
}
