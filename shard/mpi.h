/* shard/mpi.h: the MPI job itself, apart from collectives on a stream (shard/comm.h):
 * start-up, whether MPI is active, ending every rank at once, the start-up agreement, and
 * the lock every MPI call takes when the library gives less than MPI_THREAD_MULTIPLE.
 * Both halves of the collectives use it: comm.c, and comm_nccl.cu's watchdog, which ends
 * the job when a collective hangs. */
#ifndef STRATA_MPI_H
#define STRATA_MPI_H

#include <stddef.h>

#include "core/common.h"

/* MPI start-up: call first thing in main. Initialises MPI (with MPI_THREAD_MULTIPLE, at
 * least MPI_THREAD_SERIALIZED required) only when launched by mpirun or by srun with a PMI
 * plugin (OMPI_COMM_WORLD_SIZE, PMI_SIZE or PMIX_RANK in the environment), so plain
 * `strata` runs as world size 1 without MPI; refuses (-1 + error) srun's several tasks
 * without one, which would each train alone. Sets *rank, *world, *local_rank (Open MPI's
 * OMPI_COMM_WORLD_LOCAL_RANK, srun's SLURM_LOCALID, else MPI's shared-memory split). */
int strata_mpi_init(int *argc, char ***argv, int *rank, int *world, int *local_rank);
/* Where the local rank came from: the environment variable, "MPI_COMM_TYPE_SHARED", or
 * "none (world 1)". */
const char *strata_mpi_local_rank_source(void);
void strata_mpi_finalize(void);
int strata_mpi_active(void);
/* Ends every rank of the job at once (MPI_Abort when MPI is active, else exit). */
_Noreturn void strata_mpi_abort(int code);
/* Start-up agreement before any comm is open (strata train decides on rank 0 whether the
 * run may start at all, and every rank must hear the answer before it does collective
 * work): a blocking MPI_Bcast / MPI_Allgather of bytes on MPI_COMM_WORLD from the calling
 * thread. Without MPI, bcast does nothing and allgather copies in to out. 0, or -1 +
 * error naming the call. */
int strata_mpi_bcast(void *buf, size_t bytes, int root);
int strata_mpi_allgather(const void *in, void *out, size_t bytes_per_rank);

/* Around every MPI call made after start-up (the collectives' worker threads): a lock
 * when MPI gives less than MPI_THREAD_MULTIPLE, nothing otherwise. */
void strata_mpi_enter(void);
void strata_mpi_leave(void);

#endif
