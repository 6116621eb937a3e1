/* shard/mpi.c: the MPI job itself (shard/mpi.h): start-up only under mpirun, the thread
 * level and the lock below MPI_THREAD_MULTIPLE, ending every rank at once, and the
 * start-up agreement on MPI_COMM_WORLD. */
#include "shard/mpi.h"

#include <limits.h>
#include <mpi.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"

static int mpi_is_active = 0;
static int mpi_thread_level = MPI_THREAD_SINGLE;
/* Below MPI_THREAD_MULTIPLE, two comm streams must not call MPI at the same time. */
static pthread_mutex_t mpi_lock = PTHREAD_MUTEX_INITIALIZER;

void strata_mpi_enter(void) {
    if (mpi_thread_level < MPI_THREAD_MULTIPLE) pthread_mutex_lock(&mpi_lock);
}
void strata_mpi_leave(void) {
    if (mpi_thread_level < MPI_THREAD_MULTIPLE) pthread_mutex_unlock(&mpi_lock);
}

static const char *thread_level_name(int level) {
    switch (level) {
    case MPI_THREAD_SINGLE: return "MPI_THREAD_SINGLE";
    case MPI_THREAD_FUNNELED: return "MPI_THREAD_FUNNELED";
    case MPI_THREAD_SERIALIZED: return "MPI_THREAD_SERIALIZED";
    case MPI_THREAD_MULTIPLE: return "MPI_THREAD_MULTIPLE";
    }
    return "an unknown MPI thread level";
}

/* Started by a process manager MPI can talk to: mpirun (Open MPI's variables), or srun
 * with a PMI plugin (--mpi=pmix: PMIX_RANK; --mpi=pmi2: PMI_SIZE). */
static int launched_by_mpirun(void) {
    return getenv("OMPI_COMM_WORLD_SIZE") || getenv("PMI_SIZE") || getenv("PMIX_RANK");
}

/* A non-negative integer environment variable: 1 and *v, or 0 when unset or not one. */
static int env_count(const char *name, long *v) {
    const char *s = getenv(name);
    char *end = NULL;
    if (!s || !*s) return 0;
    long x = strtol(s, &end, 10);
    if (*end || x < 0 || x >= INT_MAX) return 0;
    *v = x;
    return 1;
}

static const char *local_rank_from = "none (world 1)";

const char *strata_mpi_local_rank_source(void) { return local_rank_from; }

/* This rank's index among its node's ranks: Open MPI's mpirun says it
 * (OMPI_COMM_WORLD_LOCAL_RANK); srun says it (SLURM_LOCALID) for the task it started,
 * which is this rank only when SLURM_PROCID is this rank and the step's task count the
 * world (inside an sbatch script, mpirun's ranks inherit the script's own SLURM_LOCALID=0);
 * any other MPI: the ranks that share this node's memory. */
static void find_local_rank(int rank, int world, int *local_rank) {
    /* collective: every rank splits, whatever its environment says, or one would wait */
    MPI_Comm node;
    int shared = 0;
    MPI_Comm_split_type(MPI_COMM_WORLD, MPI_COMM_TYPE_SHARED, rank, MPI_INFO_NULL, &node);
    MPI_Comm_rank(node, &shared);
    MPI_Comm_free(&node);
    long v = 0, procid = -1, tasks = -1;
    if (env_count("OMPI_COMM_WORLD_LOCAL_RANK", &v)) {
        *local_rank = (int)v;
        local_rank_from = "OMPI_COMM_WORLD_LOCAL_RANK";
    } else if (env_count("SLURM_LOCALID", &v) && env_count("SLURM_PROCID", &procid) && procid == rank &&
               (env_count("SLURM_STEP_NUM_TASKS", &tasks) || env_count("SLURM_NTASKS", &tasks)) && tasks == world) {
        *local_rank = (int)v;
        local_rank_from = "SLURM_LOCALID";
    } else {
        *local_rank = shared;
        local_rank_from = "MPI_COMM_TYPE_SHARED";
    }
}

int strata_mpi_init(int *argc, char ***argv, int *rank, int *world, int *local_rank) {
    *rank = 0;
    *world = 1;
    *local_rank = 0;
    if (!launched_by_mpirun()) {
        long tasks = 0;
        /* srun without a PMI plugin starts every task as a job of its own: each would
         * train alone, all in the same run.dir */
        if ((env_count("SLURM_STEP_NUM_TASKS", &tasks) && tasks > 1) && getenv("SLURM_PROCID"))
            return strata_fail("srun started %ld tasks, but none of them can reach the others: no MPI process "
                               "manager interface is in the environment (PMIX_RANK for srun --mpi=pmix, PMI_SIZE "
                               "for --mpi=pmi2). Launch with `srun --mpi=pmix` (`srun --mpi=list` shows what this "
                               "Slurm has), or with mpirun inside the allocation", tasks);
        return 0;
    }

    int initialized = 0, provided = MPI_THREAD_SINGLE;
    MPI_Initialized(&initialized);
    if (initialized) {
        MPI_Query_thread(&provided);
    } else if (MPI_Init_thread(argc, argv, MPI_THREAD_MULTIPLE, &provided) != MPI_SUCCESS) {
        return strata_fail("MPI_Init_thread failed; check the mpirun command line and that "
                           "strata was built against the same MPI as that mpirun");
    }
    if (provided < MPI_THREAD_SERIALIZED) {
        if (!initialized) MPI_Finalize();
        return strata_fail("this MPI provides only %s; strata drives collectives from a worker "
                           "thread and needs at least MPI_THREAD_SERIALIZED (use an MPI built "
                           "with thread support)", thread_level_name(provided));
    }
    mpi_thread_level = provided;
    mpi_is_active = 1;
    MPI_Comm_rank(MPI_COMM_WORLD, rank);
    MPI_Comm_size(MPI_COMM_WORLD, world);

    find_local_rank(*rank, *world, local_rank);
    return 0;
}

void strata_mpi_finalize(void) {
    if (!mpi_is_active) return;
    mpi_is_active = 0;
    MPI_Finalize();
}

int strata_mpi_active(void) { return mpi_is_active; }

_Noreturn void strata_mpi_abort(int code) {
    fflush(stdout);
    fflush(stderr);
    if (mpi_is_active) MPI_Abort(MPI_COMM_WORLD, code);
    exit(code);
}

static int startup_mpi_check(int rc, const char *call) {
    if (rc == MPI_SUCCESS) return 0;
    char msg[MPI_MAX_ERROR_STRING] = "";
    int len = 0;
    MPI_Error_string(rc, msg, &len);
    return strata_fail("%s at start-up failed: %s", call, msg);
}

int strata_mpi_bcast(void *buf, size_t bytes, int root) {
    if (!mpi_is_active) return 0;
    if (bytes > INT_MAX) return strata_fail("MPI_Bcast at start-up: %zu bytes is too many", bytes);
    strata_mpi_enter();
    int rc = MPI_Bcast(buf, (int)bytes, MPI_BYTE, root, MPI_COMM_WORLD);
    strata_mpi_leave();
    return startup_mpi_check(rc, "MPI_Bcast");
}

int strata_mpi_allgather(const void *in, void *out, size_t bytes_per_rank) {
    if (!mpi_is_active) {
        memmove(out, in, bytes_per_rank);
        return 0;
    }
    if (bytes_per_rank > INT_MAX) return strata_fail("MPI_Allgather at start-up: %zu bytes is too many", bytes_per_rank);
    strata_mpi_enter();
    int rc = MPI_Allgather(in, (int)bytes_per_rank, MPI_BYTE, out, (int)bytes_per_rank, MPI_BYTE, MPI_COMM_WORLD);
    strata_mpi_leave();
    return startup_mpi_check(rc, "MPI_Allgather");
}
