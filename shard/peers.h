/* shard/peers.h: who is in the job, on which host, and who of it is gone.
 *
 * Once at start every rank tells every rank its pid, host name, pid namespace, the local
 * rank its launcher gave it, and a probe address: the IPv4 addresses of its host and a TCP
 * port it listens on and never serves. A rank is then asked after by the cheapest means
 * that answers: on this host (same name, same pid namespace) by its pid; elsewhere by a
 * TCP connect to its port, which the peer's kernel completes whatever the process is
 * doing, refuses once the process is gone, and leaves unanswered when the host is down or
 * cut off. The probe and the descriptions use only async-signal-safe calls, so a signal
 * handler may use them (launcher/signals.c, when mpirun ends the job), and so may a
 * collective that timed out (shard/comm.c, comm_nccl.cu's watchdog). */
#ifndef STRATA_PEERS_H
#define STRATA_PEERS_H

#include <stddef.h>
#include <stdint.h>

enum { STRATA_PEER_ADDRS = 4 };

typedef struct strata_peer {
    int64_t pid;
    char host[64];   /* gethostname() */
    char pid_ns[48]; /* /proc/self/ns/pid: ranks on one host in different namespaces cannot see each other's pids */
    int32_t local_rank;               /* as the launcher gave it (shard/mpi.h) */
    char local_from[32];              /* the environment variable it came from, or how MPI found it */
    uint32_t addr[STRATA_PEER_ADDRS]; /* the host's IPv4 addresses, network order (0: none) */
    uint16_t port;                    /* the probe port, host order (0: none could be opened) */
} strata_peer;

/* What a probe found of one rank. */
enum { STRATA_PEER_ALIVE = 0, STRATA_PEER_GONE = 1, STRATA_PEER_SILENT = 2 };

/* Collective (MPI_Allgather): every rank's strata_peer, and this rank's probe port opened.
 * At world 1 nothing is exchanged. 0, or -1 + error. */
int strata_peers_exchange(int rank, int world, int local_rank, const char *local_from);

/* After the exchange: the world (0 before it), this rank, rank r's record. */
int strata_peers_world(void);
int strata_peers_me(void);
const strata_peer *strata_peers_get(int r);
/* Rank r's host name ("?" before the exchange); how many distinct hosts the job spans. */
const char *strata_peers_host(int r);
int strata_peers_n_hosts(void);

/* The device index this rank should take: the launcher's local rank, unless another rank
 * of this host has the same one (a launcher's environment that does not describe this
 * job), in which case this rank's position among its host's ranks. */
int strata_peers_device_index(void);
/* "" when every host's local ranks are distinct; else one line naming the host, the ranks
 * and where their local ranks came from (rank 0 warns with it). */
void strata_peers_local_clash(char *buf, size_t cap);

/* Asks after every rank: state[r] (world entries) is ALIVE, GONE (the process is not
 * there: its pid on this host, or its host refused the connect) or SILENT (no answer
 * within wait_ms: its host is down or cut off from this one). This rank is ALIVE.
 * Async-signal-safe. Returns how many ranks are not ALIVE. */
int strata_peers_probe(unsigned char *state, int wait_ms);

/* At start: probes every rank (wait_ms) and names those it cannot reach into buf ("4, 5
 * on h3"); returns how many. A firewall between hosts shows here, where it costs a warning,
 * rather than when a host is lost and every remote rank would look cut off. */
int strata_peers_unreachable(char *buf, size_t cap, int wait_ms);

/* After reporting lost ranks, a survivor tells each rank its probe found alive that it is
 * one (a note on a connection to their probe port, sent within wait_ms): their own probe,
 * which may come after this process has ended (mpirun signals one host's ranks, kills them,
 * then signals the next host's), then counts it among the survivors, not the lost.
 * Async-signal-safe. */
void strata_peers_tell_alive(const unsigned char *state, int wait_ms);

/* Appends to buf at *o (async-signal-safe): the ranks a probe found not alive, by host
 * ("ranks 4, 5 on h3 do not answer: h3 is down or cut off from h1"); the job's hosts
 * ("h1 (ranks 0-1), h2 (ranks 2-3)"); a list of ranks with their hosts. */
void strata_peers_describe_lost(const unsigned char *state, char *buf, size_t *o, size_t cap);
void strata_peers_describe_hosts(char *buf, size_t *o, size_t cap);
void strata_peers_describe_ranks(const int *ranks, int n, char *buf, size_t *o, size_t cap);

/* What the layer above adds to a report of lost ranks (the launcher: what this rank was
 * doing, the checkpoint to resume from). Appends at *o; must be async-signal-safe. */
typedef void (*strata_peers_note_fn)(char *buf, size_t *o, size_t cap);
void strata_peers_set_note(strata_peers_note_fn fn);
void strata_peers_note(char *buf, size_t *o, size_t cap);

/* For a collective that did not complete in time: probes (wait_ms), then appends who is
 * gone or that every rank still answers, the job's hosts when there are several, and the
 * note; marks the report written (strata_peers_reported). Async-signal-safe once the
 * exchange is done; before it, appends nothing. */
void strata_peers_explain(char *buf, size_t *o, size_t cap, int wait_ms);

/* This process has written (or is writing) a report of lost ranks: a second one, from the
 * signal mpirun sends after the first made the job abort, would say it again. */
void strata_peers_set_reported(void);
int strata_peers_reported(void);

/* Async-signal-safe text building: a string, a decimal number. */
void strata_peers_puts(char *buf, size_t *o, size_t cap, const char *s);
void strata_peers_putn(char *buf, size_t *o, size_t cap, int64_t v);

#endif
