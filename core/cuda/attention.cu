/* core/cuda/attention.cu: causal self-attention of core/kernels.h on the GPU (NH query
 * heads over NKV key/value heads: grouped-query, or multi-head when NKV == NH), the choice
 * between its two implementations and the two entry points core/cuda/kernels_cuda.cu puts
 * into the kernel table (at the bottom of this file). Both implementations compute it
 * without a T x T buffer, save the row log-sum-exp in the forward and recompute the
 * probabilities from it in a backward where every output element has one writer (no
 * atomics, deterministic; a key/value head's gradient is summed over the query heads that
 * share it by the one block that writes it):
 *   core/cuda/attention_simt.cu  CUDA cores: online softmax, four threads per query; head
 *                                sizes 16, 32, 64, 80, 96 and 128; the default.
 *   core/cuda/attention_tc.cu    tensor cores: FlashAttention-2 style tiles with mma.sync;
 *                                head sizes 64 and 128.
 * STRATA_ATTENTION=tc (read once per process; strata_cuda_attention_select overrides it)
 * sends a call to the tensor cores when att_tc_takes says they can take it (head size,
 * 16-byte alignment, grid size); everything else runs on the CUDA cores.
 * core/cuda/attention.cuh declares what the three files share. */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>

#include "core/cuda/attention.cuh"
#include "core/cuda/cuda_common.h"
#include "core/cuda/kernels_common.cuh"

/* Which kernels run: STRATA_ATTENTION=tc the tensor-core ones (attention_tc.cu); unset,
 * empty or "simt" the CUDA-core ones (attention_simt.cu). The variable is read once per
 * process; strata_cuda_attention_select overrides it (tests and benchmarks compare the two). */
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
 * (cp.async and the output stores move 16 bytes; rows of (NH + 2NKV) hs and NH hs elements
 * keep every row and head 16-byte aligned at these head sizes), and at most 65535 row
 * tiles (grid.y) */
static int att_tc_takes(int hs, int T, const void *p0, const void *p1, const void *p2, const void *p3) {
    return att_choice() == ATT_TC && (hs == 64 || hs == 128) && (T + TC_ROWS - 1) / TC_ROWS <= 65535 &&
           aligned16(p0) && aligned16(p1) && aligned16(p2) && aligned16(p3);
}

/* query heads in whole groups per key/value head; anything else is a caller's bug */
static void att_check_heads(const char *what, int NH, int NKV, int hs) {
    if (NH <= 0 || NKV <= 0 || NH % NKV != 0 || hs <= 0)
        strata_panic(__FILE__, __LINE__, "%s: %d query heads cannot share %d key/value heads of size %d "
                     "(NH must be a positive multiple of NKV)", what, NH, NKV, hs);
}

void strata_cuda_attention_forward(strata_stream *s, void *out, float *lse, const void *qkv, const int32_t *pos,
                                   int B, int T, int NH, int NKV, int hs) {
    if (B <= 0 || T <= 0) return;
    att_check_heads("attention_forward", NH, NKV, hs);
    cudaStream_t st = strata_cuda_stream_handle(s);
    if (att_tc_takes(hs, T, out, qkv, qkv, out)) {
        strata_cuda_attention_tc_forward(st, out, lse, qkv, pos, B, T, NH, NKV, hs);
        return;
    }
    strata_cuda_attention_simt_forward(st, out, lse, qkv, pos, B, T, NH, NKV, hs);
}

void strata_cuda_attention_backward(strata_stream *s, void *dqkv, const void *dout, const void *qkv,
                                    const void *out, const float *lse, const int32_t *pos, int B, int T, int NH,
                                    int NKV, int hs) {
    if (B <= 0 || T <= 0) return;
    att_check_heads("attention_backward", NH, NKV, hs);
    cudaStream_t st = strata_cuda_stream_handle(s);
    if (att_tc_takes(hs, T, dqkv, dout, qkv, out)) {
        strata_cuda_attention_tc_backward(st, dqkv, dout, qkv, out, lse, pos, B, T, NH, NKV, hs);
        return;
    }
    strata_cuda_attention_simt_backward(st, dqkv, dout, qkv, out, lse, pos, B, T, NH, NKV, hs);
}
