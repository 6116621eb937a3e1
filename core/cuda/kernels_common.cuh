/* core/cuda/kernels_common.cuh: what the CUDA kernel files share (kernels_cuda.cu, the
 * table and most kernels; attention.cu, attention_simt.cu and attention_tc.cu, attention's
 * dispatcher and its two implementations): the bf16 type and its conversions, the launch
 * check, and attention's two entry points for the table. For .cu files only. */
#ifndef STRATA_KERNELS_COMMON_CUH
#define STRATA_KERNELS_COMMON_CUH

#include <cuda_bf16.h>
#include <stdint.h>

#include "core/cuda/cuda_common.h"

typedef __nv_bfloat16 bf16;

#define LOG2E 1.4426950408889634f
#define LN2 0.6931471805599453f

/* a kernel launch's status: out of memory is a recorded device fault (core/cuda/cuda_common.h) */
#define LAUNCH_CHECK(what) CUDA_LAUNCH_CHECK(what)

__device__ __forceinline__ float ld(bf16 x) { return __bfloat162float(x); }

/* Round to nearest even, NaN kept quiet: bit for bit the CPU oracle's conversion. */
__device__ __forceinline__ bf16 to_bf16(float f) {
    uint32_t u = __float_as_uint(f);
    uint16_t h;
    if ((u & 0x7fffffffu) > 0x7f800000u) h = (uint16_t)((u >> 16) | 0x0040u);
    else h = (uint16_t)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
    return __ushort_as_bfloat16(h);
}

static inline int aligned16(const void *p) { return ((uintptr_t)p & 15u) == 0; }

/* core/kernels.h's attention_forward and attention_backward (core/cuda/attention.cu) */
void strata_cuda_attention_forward(strata_stream *s, void *out, float *lse, const void *qkv, const int32_t *pos,
                                   int B, int T, int NH, int NKV, int hs);
void strata_cuda_attention_backward(strata_stream *s, void *dqkv, const void *dout, const void *qkv, const void *out,
                                    const float *lse, const int32_t *pos, int B, int T, int NH, int NKV, int hs);

#endif
