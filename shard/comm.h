/* shard/comm.h: collectives between ranks, enqueued on a stream.
 *
 * Every collective is enqueued on the comm's stream, so it overlaps compute and meets it
 * only through events. Three backends, picked by strata_comm_open_config from
 * comm.backend (auto|mpi|nccl), the device and the launch:
 *  - single: world size 1 without mpirun (comm.backend auto or mpi); collectives are
 *    copies (or nothing);
 *  - mpi: MPI_Iallreduce / MPI_Ireduce_scatter_block / MPI_Iallgather / MPI_Ibcast,
 *    driven on a HOST stream's worker thread by an MPI_Test loop with a watchdog: a
 *    collective that does not finish within comm.timeout_s ends the whole job
 *    (MPI_Abort) with a message, never a hang. Buffers MPI cannot read (any device but
 *    the CPU; STRATA_COMM_STAGE=1 forces it on the CPU, =0 off) go through a pinned
 *    staging buffer allocated at open (16 MiB, STRATA_COMM_STAGE_BYTES): copy a piece
 *    in, MPI on host memory, copy it out. This is how several ranks share one GPU;
 *  - nccl: one NCCL call per collective on a DEVICE stream (comm.backend nccl, or auto
 *    on a GPU under mpirun unless two ranks share a GPU, which NCCL refuses). Rank 0
 *    makes the unique id and MPI broadcasts it; without mpirun the one rank makes its
 *    own (world 1, for testing NCCL on one GPU). Counts are size_t, never chunked. A
 *    watchdog thread aborts the communicator and the job when a started collective
 *    exceeds comm.timeout_s or NCCL reports an asynchronous error.
 * On a GPU the single and nccl backends run on DEVICE streams, so the engine's streams
 * wait on them with native CUDA events; mpi keeps a HOST stream.
 *
 * Every call is counted: calls and bytes per kind. "Bytes" is what one rank sends under
 * the ring algorithm, the ZeRO paper's accounting: all-reduce 2(N-1)/N S, reduce-scatter
 * and all-gather (N-1)/N S, broadcast S (root) where S is the full buffer size. */
#ifndef STRATA_COMM_H
#define STRATA_COMM_H

#include <stddef.h>
#include <stdint.h>

#include "core/device.h"
#include "io/config.h"
#include "shard/collective.h"
#include "shard/mpi.h"

typedef struct strata_comm_stats {
    uint64_t calls[STRATA_COLL_KINDS];
    uint64_t bytes[STRATA_COLL_KINDS];
} strata_comm_stats;

/* One finished collective's wall-clock interval (strata_now_ms), for overlap tests. */
typedef struct strata_comm_span {
    strata_coll_kind kind;
    double start_ms, end_ms;
} strata_comm_span;

typedef struct strata_comm strata_comm;

/* Opens the backend the config asks for (see the top of this file) on a stream of the
 * right kind that the comm makes, owns and destroys at close. NULL + error naming
 * comm.backend when it cannot be had (nccl on the CPU, or in a build without NCCL, or
 * with two ranks on one GPU). Collective under mpirun: every rank calls it. */
strata_comm *strata_comm_open_config(strata_device *d, const strata_config *cfg);
/* A world of one on a stream it owns (DEVICE on a GPU), even inside an MPI job: for
 * commands that run one rank's engine (sample, export). */
strata_comm *strata_comm_open_local(strata_device *d);
/* On a caller's stream, which outlives the comm: "mpi" when MPI is active, "single"
 * otherwise. `stream` must be a HOST stream for the mpi backend. */
strata_comm *strata_comm_open(strata_device *d, strata_stream *stream, double timeout_s);
/* A world of one, even inside an MPI job (tests compute their single-rank reference so). */
strata_comm *strata_comm_open_single(strata_device *d, strata_stream *stream);
void strata_comm_close(strata_comm *c);
int strata_comm_rank(const strata_comm *c);
int strata_comm_world(const strata_comm *c);
const char *strata_comm_backend_name(const strata_comm *c);
strata_stream *strata_comm_stream(const strata_comm *c);
/* Pinned host bytes the comm holds (the mpi backend's staging buffer, else 0), allocated
 * at open: the memory plan counts them. */
size_t strata_comm_pinned_bytes(const strata_comm *c);
/* The same for a plan made before any comm is open: what a comm for cfg at `world` ranks
 * (on GPUs when `gpu`) will hold. MPI between several ranks stages; one rank, or NCCL,
 * holds none. */
size_t strata_comm_planned_pinned_bytes(const strata_config *cfg, int world, int gpu);
/* Host records of queued collectives made so far; they are reused, so once the deepest
 * queue of a run has been reached, steps make none. */
int strata_comm_task_records(const strata_comm *c);

/* Enqueued on the comm stream; return 0 or -1 when the enqueue itself fails. Errors of
 * the collective itself (MPI error, timeout) abort the job with the message. fp32 sums. */
int strata_allreduce(strata_comm *c, float *buf, size_t n);
/* in (n_per_rank * world) summed across ranks; out (n_per_rank) gets this rank's block.
 * out may alias in + rank * n_per_rank. */
int strata_reduce_scatter(strata_comm *c, float *out, const float *in, size_t n_per_rank);
/* The same two in bf16 (16-bit words, summed in fp32 and rounded to nearest even after each
 * addition, as NCCL's bf16 sum does): half the bytes of fp32, for train.grad_reduce_dtype. */
int strata_allreduce_bf16(strata_comm *c, void *buf, size_t n);
int strata_reduce_scatter_bf16(strata_comm *c, void *out, const void *in, size_t n_per_rank);
/* out (bytes_per_rank * world) gets every rank's in, in rank order; in may alias
 * out + rank * bytes_per_rank. */
int strata_allgather(strata_comm *c, void *out, const void *in, size_t bytes_per_rank);
int strata_broadcast(strata_comm *c, void *buf, size_t bytes, int root);
int strata_barrier(strata_comm *c);

/* Blocking, on the calling thread's behalf: enqueue, then wait (nccl: wait for the
 * stream, then MPI on this thread). For the small step-end agreement (loss, stop flag,
 * NaN flag) and start-up checks. Sum of doubles in host memory. */
int strata_allreduce_host_f64(strata_comm *c, double *buf, int n);

/* Counters since open (or the last reset), and an optional trace of spans. */
strata_comm_stats strata_comm_get_stats(const strata_comm *c);
void strata_comm_reset_stats(strata_comm *c);
/* Starts recording spans into a buffer of `capacity` (0 stops); returns recorded count. */
void strata_comm_trace(strata_comm *c, int capacity);
int strata_comm_spans(const strata_comm *c, const strata_comm_span **spans);

#endif
