/* shard/comm_nccl.h: what shard/comm.c asks of shard/comm_nccl.cu, the half of the NCCL
 * backend that speaks NCCL and CUDA. comm.c keeps everything MPI (the unique id's
 * broadcast, the shared-GPU check, the host f64 agreement) and the shared counting;
 * comm_nccl.cu enqueues the collectives on the comm's DEVICE stream and runs the
 * watchdog thread. A build without NCCL links shard/comm_nccl_stub.c instead, whose
 * functions fail saying so, so comm.c has no #ifdef. */
#ifndef STRATA_COMM_NCCL_H
#define STRATA_COMM_NCCL_H

#include <stddef.h>
#include <stdint.h>

#include "core/device.h"
#include "shard/collective.h"

#define STRATA_NCCL_ID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES */

typedef struct strata_nccl strata_nccl;

/* Called by the watchdog thread as each collective completes, in enqueue order. */
typedef void (*strata_nccl_done_fn)(void *ctx, strata_coll_kind kind, double start_ms, double end_ms);

/* 1 when this build has NCCL (comm_nccl.cu), 0 with the stub. */
int strata_nccl_available(void);

/* ncclGetUniqueId, on the rank that makes the id (rank 0, or the only rank). */
int strata_nccl_unique_id(unsigned char id[STRATA_NCCL_ID_BYTES]);
/* The PCI bus id of GPU `ordinal`, which names the physical GPU whatever
 * CUDA_VISIBLE_DEVICES says (two ranks with the same one share a GPU). */
int strata_nccl_gpu_bus_id(int ordinal, char *buf, int n);

/* ncclCommInitRank on `stream`'s GPU (a DEVICE stream), and the watchdog thread: a
 * collective that has started but not finished within timeout_s, or an asynchronous NCCL
 * error, aborts the communicator and ends the job. */
strata_nccl *strata_nccl_open(strata_stream *stream, int ordinal, const unsigned char id[STRATA_NCCL_ID_BYTES],
                              int rank, int world, double timeout_s, strata_nccl_done_fn done, void *ctx);
/* The stream must be idle (the caller synchronises it first). */
void strata_nccl_close(strata_nccl *n);

/* Enqueues one collective on the stream; count is elements (all-reduce, reduce-scatter per
 * rank: fp32, or bf16 with bf16 set) or bytes (all-gather per rank, broadcast); full_bytes
 * is only for messages. */
int strata_nccl_enqueue(strata_nccl *n, strata_coll_kind kind, void *out, const void *in, size_t count, int bf16,
                        int root, uint64_t full_bytes);

#endif
