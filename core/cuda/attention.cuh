/* core/cuda/attention.cuh: what the attention dispatcher (core/cuda/attention.cu) and its
 * two implementations (core/cuda/attention_simt.cu on the CUDA cores,
 * core/cuda/attention_tc.cu on the tensor cores) share: each implementation's forward and
 * backward, and the tensor-core kernels' row tile, which the dispatcher's eligibility test
 * needs. For .cu files only. */
#ifndef STRATA_ATTENTION_CUH
#define STRATA_ATTENTION_CUH

#include <cuda_runtime.h>

/* A tensor-core block is TC_WARPS warps of 16 rows each (attention_tc.cu); the dispatcher
 * sends a call there only while its ceil(T / TC_ROWS) row tiles fit in grid.y. */
#define TC_WARPS 4
#define TC_ROWS (16 * TC_WARPS)    /* rows a block owns: 64 */

/* The arguments of core/kernels.h's attention_forward and attention_backward, with the
 * stream's cudaStream_t: qkv and dqkv (B,T,(NH+2NKV)hs), out and dout (B,T,NH hs) bf16, lse
 * (B,NH,T) fp32, pos (B,T) int32 or NULL; NH a multiple of NKV. The dispatcher has checked
 * the shape and returned for B or T <= 0. With pos, query t of row b sees keys
 * lo = t - pos[b,t] .. t: lo is the first token of its document, and never decreases
 * along a row, so a tile of queries starts at its first query's lo (att_doc_lo below). */

/* CUDA cores: head sizes 16, 32, 64, 80, 96 and 128; any other is fatal. */
void strata_cuda_attention_simt_forward(cudaStream_t st, void *out, float *lse, const void *qkv, const int *pos,
                                        int B, int T, int NH, int NKV, int hs);
void strata_cuda_attention_simt_backward(cudaStream_t st, void *dqkv, const void *dout, const void *qkv,
                                         const void *out, const float *lse, const int *pos, int B, int T, int NH,
                                         int NKV, int hs);

/* tensor cores: head size 64 or 128, 16-byte aligned tensors and at most 65535 row tiles,
 * which the dispatcher has checked */
void strata_cuda_attention_tc_forward(cudaStream_t st, void *out, float *lse, const void *qkv, const int *pos,
                                      int B, int T, int NH, int NKV, int hs);
void strata_cuda_attention_tc_backward(cudaStream_t st, void *dqkv, const void *dout, const void *qkv,
                                       const void *out, const float *lse, const int *pos, int B, int T, int NH,
                                       int NKV, int hs);

/* The first key query t of a row may see: 0 without documents (pos NULL), else the first
 * token of its document. pos_row is the row's pos. */
__device__ __forceinline__ int att_doc_lo(const int *pos_row, int t) { return pos_row ? t - pos_row[t] : 0; }

/* One past the last query of a row that sees key `key`: the first query after it whose
 * document starts after it (T when none), by bisection over the row's lo, which never
 * decreases; every thread of a block that asks the same gets the same answer. */
__device__ __forceinline__ int att_doc_end(const int *pos_row, int key, int T) {
    if (!pos_row) return T;
    int a = key + 1, b = T; /* the answer is in [a, b] */
    while (a < b) {
        int mid = (a + b) >> 1;
        if (mid - pos_row[mid] > key) b = mid;
        else a = mid + 1;
    }
    return a;
}

#endif
