/* shard/collective.h: the collectives every backend moves (shard/comm.c, the MPI and
 * single-rank ones; shard/comm_nccl.cu, NCCL's half), and their names for messages. */
#ifndef STRATA_COLLECTIVE_H
#define STRATA_COLLECTIVE_H

typedef enum strata_coll_kind {
    STRATA_COLL_ALLREDUCE = 0,
    STRATA_COLL_REDUCE_SCATTER,
    STRATA_COLL_ALLGATHER,
    STRATA_COLL_BROADCAST,
    STRATA_COLL_BARRIER,
    STRATA_COLL_KINDS,
} strata_coll_kind;

static inline const char *strata_coll_name(strata_coll_kind k) {
    switch (k) {
    case STRATA_COLL_ALLREDUCE: return "all-reduce";
    case STRATA_COLL_REDUCE_SCATTER: return "reduce-scatter";
    case STRATA_COLL_ALLGATHER: return "all-gather";
    case STRATA_COLL_BROADCAST: return "broadcast";
    case STRATA_COLL_BARRIER: return "barrier";
    case STRATA_COLL_KINDS: break;
    }
    return "unknown collective";
}

#endif
