/* core/cuda/attention_tc.cu: causal self-attention of core/kernels.h on the tensor cores,
 * for head sizes 64 and 128: FlashAttention-2 style kernels with mma.sync, taken when
 * STRATA_ATTENTION=tc (or strata_cuda_attention_select) asks for them and the call suits
 * them (core/cuda/attention.cu decides; everything else runs on the CUDA-core kernels of
 * core/cuda/attention_simt.cu). Everything but the two entry points at the bottom
 * (declared in core/cuda/attention.cuh) is private to this file. */
#include <cuda_bf16.h>
#include <math.h>
#include <stdint.h>
#include <string.h>

#include "core/cuda/attention.cuh"
#include "core/cuda/cuda_common.h"
#include "core/cuda/kernels_common.cuh"

/*
 * The same contract as the CUDA-core kernels (attention_simt.cu), computed as
 * FlashAttention-2 style tiles with mma.sync.m16n8k16 (bf16 inputs, fp32 accumulation).
 * qkv rows are W = (NH + 2 NKV) hs wide: query head h at h hs, its key/value head
 * kvh = h / (NH / NKV) at (NH + kvh) hs and (NH + NKV + kvh) hs; out and dout rows NH hs.
 * Blocks compute their base pointers once; the tile loops are the same for every NKV.
 * A block is TC_WARPS = 4 warps and each warp owns 16 rows (queries in the forward and dQ
 * kernels, keys in the dK/dV kernel), so a row's softmax state and accumulators live in
 * one warp's registers and row reductions are shuffles within a quad of lanes. Tiles of
 * qkv and dout are copied into shared memory with cp.async (double-buffered along the
 * streamed dimension) and read into fragments with ldmatrix.
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
 *   2. attn_tc_bwd_dkv_kernel: a block takes 64 keys of one key/value head and streams
 *      the query tiles at or after them of each query head of its group in turn:
 *      S^T = K Q^T, P^T = exp2(S^T qscale - lse log2 e), dV += P^T dO, dP^T = V dO^T,
 *      dS^T = P^T (dP^T - D), dK += scale dS^T Q (dK, dV sum over the group's heads in
 *      registers and are stored once);
 *   3. attn_tc_bwd_dq_kernel: a block takes 64 queries, reads their D (before anything
 *      overwrites it: only this block writes these dq slots, at its very end) and streams
 *      key tiles: S, P, dP = dO V^T, dS as above, dQ += scale dS K.
 * Rows past T are zero in shared memory (cp.async zero-fill), so nothing read there is
 * NaN; the causal mask is by index; a query past T gets lse = +inf in the backward, so
 * its P is exactly 0 and it adds nothing to dK and dV.
 * With documents (pos), a query's keys start at its lo (attention.cuh), masked like the
 * causal mask: the forward and dQ kernels start at the key tile holding their first
 * query's lo, and the dK/dV kernel stops at the end of its last key's document.
 *
 * Head sizes 64 and 128 with 16-byte aligned qkv, out, dout and dqkv take this path;
 * anything else runs on the CUDA-core kernels (att_tc_takes in attention.cu decides). */

/* TC_WARPS and TC_ROWS (a block's warps and rows) are in core/cuda/attention.cuh: the
 * dispatcher bounds the grid's row tiles by TC_ROWS. */
#define TC_THREADS (32 * TC_WARPS) /* 128 */
#define TC_PAD 8                   /* bf16 of padding per shared row */

extern __shared__ __align__(16) unsigned char tc_shared[];

namespace {

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

/* out (B,T,NH hs), lse (B,NH,T) from qkv (B,T,W); grid (B*NH, ceil(T/64)), 128 threads,
 * (TC_ROWS + 4 KT) (HS + TC_PAD) bf16 of dynamic shared memory. */
template <int HS, int KT>
__global__ void __launch_bounds__(TC_THREADS) attn_tc_fwd_kernel(bf16 *out, float *lse, const bf16 *qkv,
                                                                 const int *pos, int T, int NH, int NKV,
                                                                 float qscale) {
    constexpr int S = HS + TC_PAD;
    bf16 *qs = (bf16 *)tc_shared; /* [TC_ROWS][S] queries; each warp stages its output rows here */
    bf16 *ks = qs + TC_ROWS * S;  /* [2][KT][S] key tiles */
    bf16 *vs = ks + 2 * KT * S;   /* [2][KT][S] value tiles */
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH, kvh = h / (NH / NKV);
    const int q0 = (gridDim.y - 1 - blockIdx.y) * TC_ROWS; /* the longest rows first */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wq = q0 + warp * 16;               /* this warp's first query */
    const int qrow[2] = {wq + g, wq + g + 8};    /* this lane's two queries */
    const int W = (NH + 2 * NKV) * HS, C = NH * HS; /* qkv and out row widths */
    const bf16 *rows = qkv + (size_t)b * T * W;
    const bf16 *qg = rows + (size_t)h * HS, *kg = rows + (size_t)(NH + kvh) * HS,
               *vg = rows + (size_t)(NH + NKV + kvh) * HS;
    const int nkt = (min(q0 + TC_ROWS, T) + KT - 1) / KT; /* keys up to min(q0 + 63, T - 1) */
    /* documents: the first key tile any query of the block sees, this lane's queries' first
     * keys, and the warp's last query's (the largest) */
    const int *pos_row = pos ? pos + (size_t)b * T : NULL;
    const int kt0 = att_doc_lo(pos_row, q0) / KT;
    int lo[2];
#pragma unroll
    for (int r = 0; r < 2; r++) lo[r] = qrow[r] < T ? att_doc_lo(pos_row, qrow[r]) : 0;
    const int wlo = att_doc_lo(pos_row, min(wq + 15, T - 1));

    tc_load_rows<HS, TC_ROWS>(qs, qg, W, q0, T);
    tc_cp_commit();
    tc_load_rows<HS, KT>(ks + (kt0 & 1) * KT * S, kg, W, kt0 * KT, T);
    tc_load_rows<HS, KT>(vs + (kt0 & 1) * KT * S, vg, W, kt0 * KT, T);
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

    for (int kt = kt0; kt < nkt; kt++) {
        const bf16 *kts = ks + (kt & 1) * KT * S, *vts = vs + (kt & 1) * KT * S;
        if (kt + 1 < nkt) { /* the next tile goes into the other buffer, freed last iteration */
            const int nx = (kt + 1) & 1;
            tc_load_rows<HS, KT>(ks + nx * KT * S, kg, W, (kt + 1) * KT, T);
            tc_load_rows<HS, KT>(vs + nx * KT * S, vg, W, (kt + 1) * KT, T);
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
        if (k0 + KT - 1 > wq || k0 < wlo) /* past the warp's first query, or before its last's document */
#pragma unroll
            for (int j = 0; j < KT / 8; j++)
#pragma unroll
                for (int e = 0; e < 4; e++) {
                    const int key = k0 + 8 * j + 2 * t + (e & 1);
                    if (key > qrow[e >> 1] || key < lo[e >> 1]) s[j][e] = -INFINITY;
                }

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
    tc_store_rows<HS>(out + (size_t)b * T * C + (size_t)h * HS, C, wq, T, qs + warp * 16 * S, o, f, lane);
    if (t == 0)
#pragma unroll
        for (int r = 0; r < 2; r++)
            if (qrow[r] < T) lse[(size_t)bh * T + qrow[r]] = mb[r] * LN2 + logf(l[r]);
}

/* Backward 1: D = dout . out for every (b, t, h), fp32, into the first 4 bytes of the
 * dq slot dqkv[b, t, h*HS ..] (rows W apart). HS/8 adjacent lanes share a row, 16 bytes
 * each. */
template <int HS>
__global__ void attn_tc_bwd_d_kernel(bf16 *dqkv, const bf16 *dout, const bf16 *out, size_t rows, int NH,
                                     size_t W) {
    const size_t C = (size_t)NH * HS;
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
    if (rh < rows * NH && c == 0) *(float *)(dqkv + (rh / NH) * W + (rh % NH) * HS) = d;
}

/* a query tile's lse (in log2 units, +inf past T) and D (0 past T) into shared memory */
template <int QT>
__device__ __forceinline__ void tc_load_row_stats(float *ls, float *ds, int *los, const float *lseg,
                                                  const bf16 *dslot, const int *pos_row, size_t W, int q0, int T) {
    if (threadIdx.x < QT) {
        const int qi = q0 + (int)threadIdx.x;
        float lv = INFINITY, dv = 0.0f;
        int lo = T;
        if (qi < T) {
            lv = lseg[qi] * LOG2E;
            dv = *(const float *)(dslot + (size_t)qi * W);
            lo = att_doc_lo(pos_row, qi);
        }
        ls[threadIdx.x] = lv;
        ds[threadIdx.x] = dv;
        los[threadIdx.x] = lo;
    }
}

/* Backward 2: dK, dV (=) of 64 keys of one key/value head per block, summed over the
 * NH / NKV query heads that share it: the block streams the query tiles at or after its
 * keys of each of those heads in turn (head order), so a key/value head's gradient has
 * one writer. Grid (B*NKV, ceil(T/64)), 128 threads, (2 TC_ROWS + 4 QT) (HS + TC_PAD)
 * bf16 + 4 QT floats + 2 QT ints of dynamic shared memory. */
template <int HS, int QT>
__global__ void __launch_bounds__(TC_THREADS) attn_tc_bwd_dkv_kernel(bf16 *dqkv, const bf16 *dout,
                                                                     const bf16 *qkv, const float *lse,
                                                                     const int *pos, int T, int NH, int NKV,
                                                                     float scale, float qscale) {
    constexpr int S = HS + TC_PAD;
    bf16 *ks = (bf16 *)tc_shared; /* [TC_ROWS][S] this block's keys, then each warp's dK rows */
    bf16 *vs = ks + TC_ROWS * S;  /* [TC_ROWS][S] its values, then each warp's dV rows */
    bf16 *qs = vs + TC_ROWS * S;  /* [2][QT][S] query tiles */
    bf16 *dos = qs + 2 * QT * S;  /* [2][QT][S] their dout */
    float *ls = (float *)(dos + 2 * QT * S); /* [2][QT] lse * log2 e */
    float *ds = ls + 2 * QT;                 /* [2][QT] D */
    int *los = (int *)(ds + 2 * QT);         /* [2][QT] each query's first visible key */
    const int bk = blockIdx.x, b = bk / NKV, kvh = bk % NKV, group = NH / NKV;
    const int k0 = blockIdx.y * TC_ROWS; /* key tile 0 sees every query: it starts first */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wk = k0 + warp * 16;               /* this warp's first key */
    const int krow[2] = {wk + g, wk + g + 8};    /* this lane's two keys */
    const int W = (NH + 2 * NKV) * HS, C = NH * HS; /* qkv and out row widths */
    /* this sequence's rows; query head h's q, dq slot (holding D) and dout at h HS in them */
    const bf16 *qg = qkv + (size_t)b * T * W, *dog = dout + (size_t)b * T * C;
    bf16 *dg = dqkv + (size_t)b * T * W;
    const float *lseg = lse + (size_t)b * NH * T; /* query head h's at h T */
    const size_t koff = (size_t)(NH + kvh) * HS, voff = (size_t)(NH + NKV + kvh) * HS;
    /* queries k0 .. tend - 1 per query head: those after the end of the last key's
     * document (documents, pos) see none of the block's keys */
    const int *pos_row = pos ? pos + (size_t)b * T : NULL;
    const int tend = att_doc_end(pos_row, min(k0 + TC_ROWS, T) - 1, T);
    const int nqt = (tend - k0 + QT - 1) / QT;
    const int h0 = kvh * group; /* the first query head of the group */

    tc_load_rows<HS, TC_ROWS>(ks, qg + koff, W, k0, T);
    tc_load_rows<HS, TC_ROWS>(vs, qg + voff, W, k0, T);
    tc_load_rows<HS, QT>(qs, qg + (size_t)h0 * HS, W, k0, T);
    tc_load_rows<HS, QT>(dos, dog + (size_t)h0 * HS, C, k0, T);
    tc_cp_commit();
    tc_load_row_stats<QT>(ls, ds, los, lseg + (size_t)h0 * T, dg + (size_t)h0 * HS, pos_row, W, k0, T);

    float dk[HS / 8][4], dv[HS / 8][4];
#pragma unroll
    for (int n = 0; n < HS / 8; n++)
#pragma unroll
        for (int e = 0; e < 4; e++) dk[n][e] = dv[n][e] = 0.0f;

    /* iteration it holds query head h's queries q0 .. q0 + QT - 1: the group's heads in
     * turn, each from k0 to tend - 1 */
    int h = h0, q0 = k0;
    for (int it = 0; it < group * nqt; it++) {
        const int cur = it & 1;
        const int last = q0 + QT >= tend; /* the head's last tile: the next starts the next head */
        const int hn = last ? h + 1 : h, qn = last ? k0 : q0 + QT;
        if (it + 1 < group * nqt) { /* the next tile goes into the other buffers, freed last iteration */
            const int nx = cur ^ 1;
            tc_load_rows<HS, QT>(qs + nx * QT * S, qg + (size_t)hn * HS, W, qn, T);
            tc_load_rows<HS, QT>(dos + nx * QT * S, dog + (size_t)hn * HS, C, qn, T);
            tc_cp_commit();
            tc_load_row_stats<QT>(ls + nx * QT, ds + nx * QT, los + nx * QT, lseg + (size_t)hn * T,
                                  dg + (size_t)hn * HS, pos_row, W, qn, T);
            tc_cp_wait<1>();
        } else {
            tc_cp_wait<0>();
        }
        __syncthreads();
        const bf16 *qts = qs + cur * QT * S, *dots = dos + cur * QT * S;
        const float *lts = ls + cur * QT, *dts = ds + cur * QT;
        const int *lots = los + cur * QT;

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
                const int kr = krow[e >> 1];
                const float p = kr <= q0 + qc && kr >= lots[qc] ? exp2f(st[j][e] * qscale - lts[qc]) : 0.0f;
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
        h = hn;
        q0 = qn;
    }

    /* the warp's own key and value rows are read by no other warp */
    const float fk[2] = {scale, scale}, fv[2] = {1.0f, 1.0f};
    tc_store_rows<HS>(dg + koff, W, wk, T, ks + warp * 16 * S, dk, fk, lane);
    tc_store_rows<HS>(dg + voff, W, wk, T, vs + warp * 16 * S, dv, fv, lane);
}

/* Backward 3: dQ (=) of 64 queries of one query head per block; grid (B*NH, ceil(T/64)),
 * 128 threads, (2 TC_ROWS + 4 KT) (HS + TC_PAD) bf16 of dynamic shared memory. */
template <int HS, int KT>
__global__ void __launch_bounds__(TC_THREADS) attn_tc_bwd_dq_kernel(bf16 *dqkv, const bf16 *dout,
                                                                    const bf16 *qkv, const float *lse,
                                                                    const int *pos, int T, int NH, int NKV,
                                                                    float scale, float qscale) {
    constexpr int S = HS + TC_PAD;
    bf16 *qs = (bf16 *)tc_shared; /* [TC_ROWS][S] queries, then each warp's dQ rows */
    bf16 *dos = qs + TC_ROWS * S; /* [TC_ROWS][S] their dout */
    bf16 *ks = dos + TC_ROWS * S; /* [2][KT][S] key tiles */
    bf16 *vs = ks + 2 * KT * S;   /* [2][KT][S] value tiles */
    const int bh = blockIdx.x, b = bh / NH, h = bh % NH, kvh = h / (NH / NKV);
    const int q0 = (gridDim.y - 1 - blockIdx.y) * TC_ROWS; /* the longest rows first */
    const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, t = lane & 3;
    const int wq = q0 + warp * 16;
    const int qrow[2] = {wq + g, wq + g + 8};
    const int W = (NH + 2 * NKV) * HS, C = NH * HS; /* qkv and out row widths */
    const bf16 *rows = qkv + (size_t)b * T * W;
    const bf16 *qg = rows + (size_t)h * HS, *kg = rows + (size_t)(NH + kvh) * HS,
               *vg = rows + (size_t)(NH + NKV + kvh) * HS;
    const bf16 *dog = dout + (size_t)b * T * C + (size_t)h * HS;
    bf16 *dg = dqkv + (size_t)b * T * W + (size_t)h * HS; /* dq slots, holding D until the end */
    const int nkt = (min(q0 + TC_ROWS, T) + KT - 1) / KT;
    const int *pos_row = pos ? pos + (size_t)b * T : NULL; /* documents: as in the forward */
    const int kt0 = att_doc_lo(pos_row, q0) / KT;
    int lo[2];
#pragma unroll
    for (int r = 0; r < 2; r++) lo[r] = qrow[r] < T ? att_doc_lo(pos_row, qrow[r]) : 0;

    tc_load_rows<HS, TC_ROWS>(qs, qg, W, q0, T);
    tc_load_rows<HS, TC_ROWS>(dos, dog, C, q0, T);
    tc_cp_commit();
    tc_load_rows<HS, KT>(ks + (kt0 & 1) * KT * S, kg, W, kt0 * KT, T);
    tc_load_rows<HS, KT>(vs + (kt0 & 1) * KT * S, vg, W, kt0 * KT, T);
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
            dd[r] = *(const float *)(dg + (size_t)qrow[r] * W);
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

    for (int kt = kt0; kt < nkt; kt++) {
        const bf16 *kts = ks + (kt & 1) * KT * S, *vts = vs + (kt & 1) * KT * S;
        if (kt + 1 < nkt) {
            const int nx = (kt + 1) & 1;
            tc_load_rows<HS, KT>(ks + nx * KT * S, kg, W, (kt + 1) * KT, T);
            tc_load_rows<HS, KT>(vs + nx * KT * S, vg, W, (kt + 1) * KT, T);
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
                const int r = e >> 1, key = k0 + 8 * j + 2 * t + (e & 1);
                const float p = key <= qrow[r] && key >= lo[r] ? exp2f(s[j][e] * qscale - l2[r]) : 0.0f;
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
    tc_store_rows<HS>(dg, W, wq, T, qs + warp * 16 * S, dq, f, lane);
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
static void attention_tc_forward_hs(cudaStream_t st, void *out, float *lse, const void *qkv, const int *pos, int B,
                                    int T, int NH, int NKV) {
    static unsigned smem_done;
    const int bytes = (TC_ROWS + 4 * KT) * (HS + TC_PAD) * (int)sizeof(bf16);
    tc_allow_smem((const void *)attn_tc_fwd_kernel<HS, KT>, bytes, &smem_done);
    const float scale = 1.0f / sqrtf((float)HS);
    dim3 grid(B * NH, (T + TC_ROWS - 1) / TC_ROWS);
    attn_tc_fwd_kernel<HS, KT><<<grid, TC_THREADS, bytes, st>>>((bf16 *)out, lse, (const bf16 *)qkv, pos, T, NH,
                                                                  NKV, scale * LOG2E);
    LAUNCH_CHECK("attention_forward (tensor cores)");
}

/* T2: the streamed tile of the backward (query tile of dK/dV, key tile of dQ) */
template <int HS, int T2>
static void attention_tc_backward_hs(cudaStream_t st, void *dqkv, const void *dout, const void *qkv,
                                     const void *out, const float *lse, const int *pos, int B, int T, int NH,
                                     int NKV) {
    static unsigned dkv_done, dq_done;
    const int S = HS + TC_PAD;
    const int dkv_bytes =
        (2 * TC_ROWS + 4 * T2) * S * (int)sizeof(bf16) + 4 * T2 * (int)sizeof(float) + 2 * T2 * (int)sizeof(int);
    const int dq_bytes = (2 * TC_ROWS + 4 * T2) * S * (int)sizeof(bf16);
    tc_allow_smem((const void *)attn_tc_bwd_dkv_kernel<HS, T2>, dkv_bytes, &dkv_done);
    tc_allow_smem((const void *)attn_tc_bwd_dq_kernel<HS, T2>, dq_bytes, &dq_done);
    const float scale = 1.0f / sqrtf((float)HS);
    const size_t rows = (size_t)B * T, lanes = rows * NH * (HS / 8), W = (size_t)(NH + 2 * NKV) * HS;
    attn_tc_bwd_d_kernel<HS><<<(unsigned)((lanes + 255) / 256), 256, 0, st>>>(
        (bf16 *)dqkv, (const bf16 *)dout, (const bf16 *)out, rows, NH, W);
    LAUNCH_CHECK("attention_backward (tensor cores, D)");
    const unsigned tiles = (unsigned)((T + TC_ROWS - 1) / TC_ROWS);
    attn_tc_bwd_dkv_kernel<HS, T2><<<dim3(B * NKV, tiles), TC_THREADS, dkv_bytes, st>>>(
        (bf16 *)dqkv, (const bf16 *)dout, (const bf16 *)qkv, lse, pos, T, NH, NKV, scale, scale * LOG2E);
    LAUNCH_CHECK("attention_backward (tensor cores, dk, dv)");
    attn_tc_bwd_dq_kernel<HS, T2><<<dim3(B * NH, tiles), TC_THREADS, dq_bytes, st>>>(
        (bf16 *)dqkv, (const bf16 *)dout, (const bf16 *)qkv, lse, pos, T, NH, NKV, scale, scale * LOG2E);
    LAUNCH_CHECK("attention_backward (tensor cores, dq)");
}

} /* namespace */

/* the dispatcher's call once att_tc_takes said yes: head size 64 or 128 */
void strata_cuda_attention_tc_forward(cudaStream_t st, void *out, float *lse, const void *qkv, const int *pos,
                                      int B, int T, int NH, int NKV, int hs) {
    if (hs == 64) attention_tc_forward_hs<64, 64>(st, out, lse, qkv, pos, B, T, NH, NKV);
    else attention_tc_forward_hs<128, 64>(st, out, lse, qkv, pos, B, T, NH, NKV);
}

void strata_cuda_attention_tc_backward(cudaStream_t st, void *dqkv, const void *dout, const void *qkv,
                                       const void *out, const float *lse, const int *pos, int B, int T, int NH,
                                       int NKV, int hs) {
    /* hs 128 streams 32-row tiles in the backward: its accumulators need the registers */
    if (hs == 64) attention_tc_backward_hs<64, 64>(st, dqkv, dout, qkv, out, lse, pos, B, T, NH, NKV);
    else attention_tc_backward_hs<128, 32>(st, dqkv, dout, qkv, out, lse, pos, B, T, NH, NKV);
}
