/* shard/comm_nccl_stub.c: the NCCL half of the "nccl" backend (shard/comm_nccl.h) in a
 * build without NCCL, as core/device.c stands in for CUDA. comm.c asks
 * strata_nccl_available() before it picks the backend; the rest fail saying why, should
 * anything reach them. CMakeLists.txt compiles this file exactly when comm_nccl.cu is not. */
#include "shard/comm_nccl.h"

#include "core/common.h"

static int not_built(void) {
    return strata_fail("this strata was built without NCCL (CMake found no libnccl: configure with "
                       "-DNCCL_LIB=<path to libnccl.so> -DNCCL_INCLUDE_DIR=<dir of nccl.h>); use comm.backend: mpi");
}

int strata_nccl_available(void) { return 0; }

int strata_nccl_unique_id(unsigned char id[STRATA_NCCL_ID_BYTES]) { return not_built(); }

int strata_nccl_gpu_bus_id(int ordinal, char *buf, int n) { return not_built(); }

strata_nccl *strata_nccl_open(strata_stream *stream, int ordinal, const unsigned char id[STRATA_NCCL_ID_BYTES],
                              int rank, int world, double timeout_s, strata_nccl_done_fn done, void *ctx) {
    not_built();
    return NULL;
}

void strata_nccl_close(strata_nccl *n) {}

int strata_nccl_enqueue(strata_nccl *n, strata_coll_kind kind, void *out, const void *in, size_t count, int bf16,
                        int root, uint64_t full_bytes) {
    return not_built();
}
