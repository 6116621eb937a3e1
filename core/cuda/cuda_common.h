/* core/cuda/cuda_common.h: what the two halves of the CUDA backend share, for .cu files only.
 * core/cuda/device_cuda.cu owns devices, streams and events; core/cuda/kernels_cuda.cu owns the
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

/* What CUDA_CHECK below does with a failure (core/cuda/device_cuda.cu): out of memory is handed to
 * strata_cuda_record_oom after clearing CUDA's (non-sticky) error; anything else panics. */
void strata_cuda_fault(const char *file, int line, const char *call, cudaError_t err, size_t bytes);
/* Records an out-of-memory device fault: "<call> at <file>:<line> failed: <why> (needed N
 * bytes; device free X of Y)". Also for cuBLASLt's CUBLAS_STATUS_ALLOC_FAILED. */
void strata_cuda_record_oom(const char *file, int line, const char *call, size_t bytes, const char *why);

/* A CUDA runtime call inside a void kernel wrapper, which has no status to return. Out of
 * memory (cudaErrorMemoryAllocation: another process took the memory, or a kernel module
 * loaded at first launch found none) is recorded as the process's device fault
 * (core/common.h) naming the call, the bytes it needed where known (0: unknown) and the
 * device's free memory, and the wrapper carries on: the work did not run, which spoils only
 * the step in flight, and the engine abandons that step before any update. Every other
 * error is a bug or a dead device: it panics, saying which call failed. */
#define CUDA_CHECK_BYTES(call, bytes)                                                     \
    do {                                                                                  \
        cudaError_t cuda_err_ = (call);                                                   \
        if (cuda_err_ != cudaSuccess)                                                     \
            strata_cuda_fault(__FILE__, __LINE__, #call, cuda_err_, (size_t)(bytes));      \
    } while (0)
#define CUDA_CHECK(call) CUDA_CHECK_BYTES(call, 0)

/* A kernel launch's status (cudaGetLastError right after it), handled as CUDA_CHECK does:
 * a launch that found no memory for its module or its local memory is a recorded fault. */
#define CUDA_LAUNCH_CHECK(what)                                                           \
    do {                                                                                  \
        cudaError_t cuda_err_ = cudaGetLastError();                                       \
        if (cuda_err_ != cudaSuccess)                                                     \
            strata_cuda_fault(__FILE__, __LINE__, what, cuda_err_, 0);                    \
    } while (0)

/* A CUDA runtime call whose failure the caller can report: returns strata_fail's -1. */
#define CUDA_TRY(call)                                                                    \
    do {                                                                                  \
        cudaError_t cuda_err_ = (call);                                                   \
        if (cuda_err_ != cudaSuccess)                                                     \
            return strata_fail("%s:%d: %s failed: %s", __FILE__, __LINE__, #call,        \
                               cudaGetErrorString(cuda_err_));                            \
    } while (0)

/* Per-device kernel state (cuBLASLt handle, its workspace, cached GEMM plans); defined
 * and built by core/cuda/kernels_cuda.cu, held by the device. */
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
