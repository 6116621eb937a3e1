/* core/cuda_common.h: what the two halves of the CUDA backend share, for .cu files only.
 * core/device_cuda.cu owns devices, streams and events; core/kernels_cuda.cu owns the
 * kernel table and cuBLASLt. The kernels reach a stream's cudaStream_t and the device's
 * cuBLASLt state through the accessors below, so neither file sees the other's structs.
 *
 * The C headers are included with C linkage; common.h's C11 `_Noreturn` is spelled as
 * the GNU attribute here because C++ has no such keyword. */
#ifndef STRATA_CUDA_COMMON_H
#define STRATA_CUDA_COMMON_H

#include <cuda_runtime.h>

#if defined(__cplusplus) && !defined(_Noreturn)
#define _Noreturn __attribute__((noreturn))
#endif

extern "C" {
#include "core/common.h"
#include "core/device.h"
#include "core/kernels.h"

extern const strata_kernels strata_kernels_cuda;
}

/* A CUDA runtime call that must not fail inside a void kernel wrapper: the table's
 * kernels have no status to return, so a failure is fatal and says which call failed. */
#define CUDA_CHECK(call)                                                                  \
    do {                                                                                  \
        cudaError_t cuda_err_ = (call);                                                   \
        if (cuda_err_ != cudaSuccess)                                                     \
            strata_panic(__FILE__, __LINE__, "%s failed: %s (%s)", #call,                 \
                         cudaGetErrorString(cuda_err_), cudaGetErrorName(cuda_err_));     \
    } while (0)

/* The same for a call whose failure the caller can report: returns strata_fail's -1. */
#define CUDA_TRY(call)                                                                    \
    do {                                                                                  \
        cudaError_t cuda_err_ = (call);                                                   \
        if (cuda_err_ != cudaSuccess)                                                     \
            return strata_fail("%s:%d: %s failed: %s", __FILE__, __LINE__, #call,        \
                               cudaGetErrorString(cuda_err_));                            \
    } while (0)

/* Per-device kernel state (cuBLASLt handle, its workspace, cached GEMM plans); defined
 * and built by core/kernels_cuda.cu, held by the device. */
typedef struct strata_cuda_kstate strata_cuda_kstate;
/* Called once at device open (the device is current on the calling thread) and once at
 * close. The workspace is allocated here and nowhere else. */
int strata_cuda_kstate_create(int ordinal, strata_cuda_kstate **out);
void strata_cuda_kstate_destroy(strata_cuda_kstate *ks);

/* The cudaStream_t of a DEVICE stream, with the stream's GPU made current on the calling
 * thread; panics on a HOST stream (kernels run only on device streams). */
cudaStream_t strata_cuda_stream_handle(strata_stream *s);
/* The device's kernel state, and whether s is the device's compute stream (only the
 * compute stream may use the shared cuBLASLt workspace; see kernels_cuda.cu). */
strata_cuda_kstate *strata_cuda_kstate_of(strata_stream *s);
int strata_cuda_is_compute(strata_stream *s);

#endif
