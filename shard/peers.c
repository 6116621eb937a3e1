/* shard/peers.c: who is in the job, on which host, and who of it is gone (shard/peers.h).
 *
 * The probe port is a listening TCP socket that is never served: the kernel completes a
 * connect to it from its backlog while the process lives, whatever the process is doing
 * (computing, waiting in MPI, stopped), and refuses one once the process is gone. A prober
 * closes its end at once; the half-open entries it leaves in its peer's backlog are taken
 * off by that peer's own next probe (drain_backlog), and a job makes a handful of probes
 * in its life, at its start and at its end. */
#include "shard/peers.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "core/common.h"
#include "shard/mpi.h"

static strata_peer *peers; /* every rank's, world of them; NULL at world 1 and before the exchange */
static int peers_n, peers_me;
static int *host_of;       /* rank -> the lowest rank on its host: hosts in order of first rank */
static int n_hosts = 1;
static int device_index;
static int probe_fd = -1;  /* this rank's listening socket */
static strata_peers_note_fn note_fn;
static unsigned char *explain_state; /* strata_peers_explain's probe results (world) */
static volatile sig_atomic_t explaining;
static volatile sig_atomic_t reported; /* a report of lost ranks was written by this process */
static volatile unsigned char *told_alive; /* ranks whose note said they were alive when they reported */

/* ---- async-signal-safe text ---- */

void strata_peers_puts(char *buf, size_t *o, size_t cap, const char *s) {
    while (*s && *o + 1 < cap) buf[(*o)++] = *s++;
    if (*o < cap) buf[*o] = 0;
}

void strata_peers_putn(char *buf, size_t *o, size_t cap, int64_t v) {
    char d[24];
    int n = 0;
    uint64_t u = v < 0 ? (uint64_t)(-(v + 1)) + 1 : (uint64_t)v;
    do d[n++] = (char)('0' + u % 10); while ((u /= 10) && n < 23);
    if (v < 0) d[n++] = '-';
    while (n > 0 && *o + 1 < cap) buf[(*o)++] = d[--n];
    if (*o < cap) buf[*o] = 0;
}

/* ranks[0..n) (ascending) as "4, 5" or, for runs of three or more, "0-7". */
static void put_rank_list(char *buf, size_t *o, size_t cap, const int *ranks, int n) {
    for (int i = 0; i < n;) {
        int j = i;
        while (j + 1 < n && ranks[j + 1] == ranks[j] + 1) j++;
        if (i) strata_peers_puts(buf, o, cap, ", ");
        strata_peers_putn(buf, o, cap, ranks[i]);
        if (j - i >= 2) {
            strata_peers_puts(buf, o, cap, "-");
            strata_peers_putn(buf, o, cap, ranks[j]);
            i = j + 1;
        } else {
            i++;
        }
    }
}

/* ---- the exchange ---- */

static void fill_addrs(strata_peer *p) {
    struct ifaddrs *ifs = NULL;
    int n = 0;
    if (getifaddrs(&ifs) == 0) {
        for (struct ifaddrs *i = ifs; i && n < STRATA_PEER_ADDRS; i = i->ifa_next) {
            if (!i->ifa_addr || i->ifa_addr->sa_family != AF_INET) continue;
            if (!(i->ifa_flags & IFF_UP) || (i->ifa_flags & IFF_LOOPBACK)) continue;
            uint32_t a = ((const struct sockaddr_in *)i->ifa_addr)->sin_addr.s_addr;
            if ((ntohl(a) >> 16) == 0xa9fe) continue; /* 169.254/16, link-local: no route off this link */
            p->addr[n++] = a;
        }
        freeifaddrs(ifs);
    }
    if (n == 0) p->addr[0] = htonl(INADDR_LOOPBACK); /* a host with no network: its own ranks only */
}

/* The listening socket: any address, a port the kernel picks. 0 on failure (the rank is
 * then asked after by pid alone, or taken as alive). */
static uint16_t open_probe_port(void) {
    int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
    if (fd < 0) return 0;
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_ANY), .sin_port = 0};
    socklen_t len = sizeof a;
    if (bind(fd, (struct sockaddr *)&a, sizeof a) != 0 || listen(fd, SOMAXCONN) != 0 ||
        getsockname(fd, (struct sockaddr *)&a, &len) != 0) {
        (void)close(fd); /* no probe port: this rank is asked after by pid alone */
        return 0;
    }
    probe_fd = fd;
    return ntohs(a.sin_port);
}

int strata_peers_exchange(int rank, int world, int local_rank, const char *local_from) {
    if (world <= 1 || peers) return 0;
    strata_peer me;
    memset(&me, 0, sizeof me);
    me.pid = (int64_t)getpid();
    if (gethostname(me.host, sizeof me.host - 1) != 0) snprintf(me.host, sizeof me.host, "?");
    ssize_t n = readlink("/proc/self/ns/pid", me.pid_ns, sizeof me.pid_ns - 1);
    me.pid_ns[n > 0 ? n : 0] = 0;
    me.local_rank = local_rank;
    snprintf(me.local_from, sizeof me.local_from, "%s", local_from ? local_from : "?");
    fill_addrs(&me);
    me.port = open_probe_port();
    strata_peer *all = strata_xcalloc((size_t)world, sizeof *all);
    if (strata_mpi_allgather(&me, all, sizeof me)) {
        free(all);
        return -1;
    }
    host_of = strata_xcalloc((size_t)world, sizeof *host_of);
    n_hosts = 0;
    for (int r = 0; r < world; r++) {
        host_of[r] = r;
        for (int q = 0; q < r; q++)
            if (!strcmp(all[q].host, all[r].host)) {
                host_of[r] = host_of[q];
                break;
            }
        n_hosts += host_of[r] == r;
    }
    /* the launcher's local rank, unless another rank of this host has it too */
    int position = 0, clash = 0;
    for (int q = 0; q < world; q++) {
        if (q == rank || host_of[q] != host_of[rank]) continue;
        position += q < rank;
        clash |= all[q].local_rank == local_rank;
    }
    device_index = clash ? position : local_rank;
    explain_state = strata_xcalloc((size_t)world, 1);
    told_alive = strata_xcalloc((size_t)world, 1);
    peers_n = world;
    peers_me = rank;
    peers = all; /* whole before a signal handler may see it */
    return 0;
}

int strata_peers_world(void) { return peers ? peers_n : 0; }
int strata_peers_me(void) { return peers_me; }
const strata_peer *strata_peers_get(int r) { return peers && r >= 0 && r < peers_n ? &peers[r] : NULL; }
const char *strata_peers_host(int r) { return peers && r >= 0 && r < peers_n ? peers[r].host : "?"; }
int strata_peers_n_hosts(void) { return peers ? n_hosts : 1; }
int strata_peers_device_index(void) { return device_index; }

void strata_peers_local_clash(char *buf, size_t cap) {
    size_t o = 0;
    buf[0] = 0;
    if (!peers) return;
    for (int h = 0; h < peers_n; h++) {
        if (host_of[h] != h) continue;
        for (int a = h; a < peers_n; a++)
            for (int b = a + 1; b < peers_n; b++) {
                if (host_of[a] != h || host_of[b] != h || peers[a].local_rank != peers[b].local_rank) continue;
                snprintf(buf + o, cap - o, "on host %s, ranks %d and %d both have local rank %d (from %s): the "
                         "launcher's environment does not describe this job, so each rank of %s takes the device "
                         "of its position among that host's ranks instead", peers[h].host, a, b,
                         (int)peers[a].local_rank, peers[a].local_from, peers[h].host);
                return;
            }
    }
}

/* ---- the probe ---- */

/* A survivor that reported tells the ranks it found alive (strata_peers_tell_alive): this
 * header, on a connection to their probe port, read when they next probe. */
typedef struct alive_note {
    char magic[8]; /* "strata1" */
    int32_t rank, world;
} alive_note;
static const char note_magic[8] = "strata1";

/* The connections other ranks' probes left in this rank's backlog: a probe's carries
 * nothing; a survivor's note says that rank was alive when it reported, so that it is not
 * taken for lost once it has gone (mpirun kills the survivors of one host a second before
 * it signals those of the next). */
static void drain_backlog(void) {
    if (probe_fd < 0) return;
    for (int i = 0; i < 4096; i++) {
        int c = accept(probe_fd, NULL, NULL);
        if (c < 0) break;
        alive_note n;
        ssize_t got = recv(c, &n, sizeof n, MSG_DONTWAIT);
        if (got == (ssize_t)sizeof n && !memcmp(n.magic, note_magic, sizeof n.magic) && n.world == peers_n &&
            n.rank >= 0 && n.rank < peers_n)
            told_alive[n.rank] = 1;
        (void)close(c); /* read, or a probe's, which carries nothing */
    }
}

static int64_t now_ms(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000;
}

enum { BATCH = 128 };

/* An address of another host's rank that this host has too (docker0's 172.17.0.1 on every
 * machine) leads here, not there: it is never asked. */
static int usable_addr(const strata_peer *p, int a) {
    const strata_peer *me = &peers[peers_me];
    if (!p->addr[a]) return 0;
    if (p == me || !strcmp(p->host, me->host)) return 1;
    for (int m = 0; m < STRATA_PEER_ADDRS; m++)
        if (me->addr[m] == p->addr[a]) return 0;
    return 1;
}

/* What one finished connect says of its rank: connected beats refused beats silence. */
static void take_result(unsigned char *state, int r, int err) {
    if (err == 0) state[r] = STRATA_PEER_ALIVE;
    else if (err == ECONNREFUSED && state[r] != STRATA_PEER_ALIVE) state[r] = STRATA_PEER_GONE;
}

/* Waits (at most wait_ms) for the batch's connects; closes them all. */
static void run_batch(unsigned char *state, struct pollfd *pfd, const int *owner, int n, int wait_ms) {
    int64_t deadline = now_ms() + wait_ms;
    int open = 0;
    for (int i = 0; i < n; i++) open += pfd[i].fd >= 0;
    while (open > 0) {
        int64_t left = deadline - now_ms();
        if (left <= 0) break;
        int k = poll(pfd, (nfds_t)n, (int)left);
        if (k < 0 && errno == EINTR) continue;
        if (k <= 0) break;
        for (int i = 0; i < n; i++) {
            if (pfd[i].fd < 0 || !pfd[i].revents) continue;
            int err = 0;
            socklen_t len = sizeof err;
            if (getsockopt(pfd[i].fd, SOL_SOCKET, SO_ERROR, &err, &len) != 0) err = errno;
            take_result(state, owner[i], err);
            (void)close(pfd[i].fd); /* the answer is in; the connection carries nothing */
            pfd[i].fd = -1;
            open--;
        }
    }
    for (int i = 0; i < n; i++)
        if (pfd[i].fd >= 0) (void)close(pfd[i].fd); /* no answer in time: silent */
}

int strata_peers_probe(unsigned char *state, int wait_ms) {
    if (!peers) return 0;
    int saved_errno = errno;
    drain_backlog();
    const strata_peer *me = &peers[peers_me];
    struct pollfd pfd[BATCH];
    int owner[BATCH], n = 0;
    for (int r = 0; r < peers_n; r++) {
        const strata_peer *p = &peers[r];
        state[r] = STRATA_PEER_ALIVE;
        if (r == peers_me) continue;
        if (!strcmp(p->host, me->host) && !strcmp(p->pid_ns, me->pid_ns)) {
            if (kill((pid_t)p->pid, 0) != 0 && errno == ESRCH) state[r] = STRATA_PEER_GONE;
            continue;
        }
        if (p->port == 0) continue; /* it has no probe port: taken as alive */
        if (n + STRATA_PEER_ADDRS > BATCH) {
            run_batch(state, pfd, owner, n, wait_ms);
            n = 0;
        }
        int usable = 0;
        for (int a = 0; a < STRATA_PEER_ADDRS; a++) usable += usable_addr(p, a);
        if (!usable) continue; /* no address that leads there: taken as alive */
        state[r] = STRATA_PEER_SILENT;
        for (int a = 0; a < STRATA_PEER_ADDRS && p->addr[a]; a++) {
            if (!usable_addr(p, a)) continue;
            int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
            if (fd < 0) {
                state[r] = STRATA_PEER_ALIVE; /* out of descriptors: nothing can be said of it */
                continue;
            }
            struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(p->port)};
            sa.sin_addr.s_addr = p->addr[a];
            int err = connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 ? 0 : errno;
            if (err != EINPROGRESS) {
                take_result(state, r, err);
                (void)close(fd); /* answered at once */
                continue;
            }
            pfd[n] = (struct pollfd){.fd = fd, .events = POLLOUT};
            owner[n++] = r;
        }
    }
    if (n) run_batch(state, pfd, owner, n, wait_ms);
    drain_backlog(); /* notes that came in while this probe waited */
    for (int r = 0; r < peers_n; r++)
        if (told_alive[r]) state[r] = STRATA_PEER_ALIVE; /* a survivor that reported, and has ended since */
    int lost = 0;
    for (int r = 0; r < peers_n; r++) lost += state[r] != STRATA_PEER_ALIVE;
    errno = saved_errno;
    return lost;
}

void strata_peers_tell_alive(const unsigned char *state, int wait_ms) {
    if (!peers) return;
    int saved_errno = errno;
    alive_note note;
    memcpy(note.magic, note_magic, sizeof note.magic);
    note.rank = peers_me;
    note.world = peers_n;
    struct pollfd pfd[BATCH];
    int n = 0;
    int64_t deadline = now_ms() + wait_ms;
    for (int r = 0; r <= peers_n; r++) {
        /* each alive rank's first address, connected without waiting; then, a batch at a time, the note */
        const strata_peer *p = r < peers_n ? &peers[r] : NULL;
        int a = 0;
        while (p && a < STRATA_PEER_ADDRS && p->addr[a] && !usable_addr(p, a)) a++;
        if (p && r != peers_me && state[r] == STRATA_PEER_ALIVE && p->port && a < STRATA_PEER_ADDRS && p->addr[a]) {
            int fd = socket(AF_INET, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
            struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(p->port)};
            sa.sin_addr.s_addr = p->addr[a];
            if (fd >= 0 && (connect(fd, (struct sockaddr *)&sa, sizeof sa) == 0 || errno == EINPROGRESS))
                pfd[n++] = (struct pollfd){.fd = fd, .events = POLLOUT};
            else if (fd >= 0)
                (void)close(fd); /* it cannot be told */
        }
        if (n == BATCH || (r == peers_n && n)) {
            int open = n;
            while (open > 0) {
                int64_t left = deadline - now_ms();
                int k = left > 0 ? poll(pfd, (nfds_t)n, (int)left) : 0;
                if (k < 0 && errno == EINTR) continue;
                if (k <= 0) break;
                for (int i = 0; i < n; i++) {
                    if (pfd[i].fd < 0 || !pfd[i].revents) continue;
                    ssize_t w = send(pfd[i].fd, &note, sizeof note, MSG_NOSIGNAL | MSG_DONTWAIT);
                    (void)w; /* a rank that cannot be told may take this one for lost: nothing worse */
                    (void)close(pfd[i].fd);
                    pfd[i].fd = -1;
                    open--;
                }
            }
            for (int i = 0; i < n; i++)
                if (pfd[i].fd >= 0) (void)close(pfd[i].fd); /* no answer in time */
            n = 0;
        }
    }
    errno = saved_errno;
}

int strata_peers_unreachable(char *buf, size_t cap, int wait_ms) {
    buf[0] = 0;
    if (!peers) return 0;
    unsigned char *state = strata_xcalloc((size_t)peers_n, 1);
    int *ranks = strata_xcalloc((size_t)peers_n, sizeof *ranks), n = 0;
    if (strata_peers_probe(state, wait_ms) > 0)
        for (int r = 0; r < peers_n; r++)
            if (state[r] != STRATA_PEER_ALIVE) ranks[n++] = r;
    size_t o = 0;
    strata_peers_describe_ranks(ranks, n, buf, &o, cap);
    free(ranks);
    free(state);
    return n;
}

/* ---- descriptions ---- */

void strata_peers_describe_hosts(char *buf, size_t *o, size_t cap) {
    if (!peers) return;
    int ranks[256];
    for (int h = 0, first = 1; h < peers_n; h++) {
        if (host_of[h] != h) continue;
        int n = 0, more = 0;
        for (int r = h; r < peers_n; r++)
            if (host_of[r] == h) {
                if (n < 256) ranks[n++] = r;
                else more++;
            }
        if (!first) strata_peers_puts(buf, o, cap, ", ");
        first = 0;
        strata_peers_puts(buf, o, cap, peers[h].host);
        strata_peers_puts(buf, o, cap, n + more == 1 ? " (rank " : " (ranks ");
        put_rank_list(buf, o, cap, ranks, n);
        if (more) strata_peers_puts(buf, o, cap, ", ...");
        strata_peers_puts(buf, o, cap, ")");
    }
}

void strata_peers_describe_ranks(const int *ranks, int n, char *buf, size_t *o, size_t cap) {
    if (!peers || n_hosts <= 1) {
        put_rank_list(buf, o, cap, ranks, n);
        return;
    }
    /* by host, in order of each host's first listed rank */
    int groups = 0, g = 0;
    for (int i = 0; i < n; i++) {
        int seen = 0;
        for (int j = 0; j < i; j++) seen |= host_of[ranks[j]] == host_of[ranks[i]];
        groups += !seen;
    }
    for (int i = 0; i < n; i++) {
        int h = host_of[ranks[i]], seen = 0;
        for (int j = 0; j < i; j++) seen |= host_of[ranks[j]] == h;
        if (seen) continue;
        int mine[256], m = 0;
        for (int j = i; j < n && m < 256; j++)
            if (host_of[ranks[j]] == h) mine[m++] = ranks[j];
        if (g) strata_peers_puts(buf, o, cap, g == groups - 1 ? " and " : ", ");
        g++;
        put_rank_list(buf, o, cap, mine, m);
        strata_peers_puts(buf, o, cap, " on ");
        strata_peers_puts(buf, o, cap, peers[h].host);
    }
}

void strata_peers_describe_lost(const unsigned char *state, char *buf, size_t *o, size_t cap) {
    if (!peers) return;
    const char *mine = peers[peers_me].host;
    int first = 1, ranks[256];
    for (int h = 0; h < peers_n; h++) {
        if (host_of[h] != h) continue;
        int on_host = 0, silent = 0, gone = 0;
        for (int r = h; r < peers_n; r++) {
            if (host_of[r] != h) continue;
            on_host++;
            silent += state[r] == STRATA_PEER_SILENT;
            gone += state[r] == STRATA_PEER_GONE;
        }
        for (int kind = STRATA_PEER_GONE; kind <= STRATA_PEER_SILENT; kind++) {
            int count = kind == STRATA_PEER_GONE ? gone : silent, n = 0;
            if (!count) continue;
            for (int r = h; r < peers_n && n < 256; r++)
                if (host_of[r] == h && state[r] == kind) ranks[n++] = r;
            if (!first) strata_peers_puts(buf, o, cap, "; ");
            first = 0;
            strata_peers_puts(buf, o, cap, n == 1 ? "rank " : "ranks ");
            put_rank_list(buf, o, cap, ranks, n);
            strata_peers_puts(buf, o, cap, " on ");
            strata_peers_puts(buf, o, cap, peers[h].host);
            if (kind == STRATA_PEER_GONE) {
                strata_peers_puts(buf, o, cap, n == 1 ? " is gone: " : " are gone: ");
                if (!strcmp(peers[h].host, mine)) {
                    strata_peers_puts(buf, o, cap, n == 1 ? "no such process on this host" : "no such processes on this host");
                } else {
                    strata_peers_puts(buf, o, cap, peers[h].host);
                    strata_peers_puts(buf, o, cap, n == 1 ? " answers, but the process is not there" : " answers, but the processes are not there");
                }
                strata_peers_puts(buf, o, cap, " (killed, or crashed)");
            } else {
                strata_peers_puts(buf, o, cap, n == 1 ? " does not answer (" : " do not answer (");
                strata_peers_puts(buf, o, cap, peers[h].host);
                strata_peers_puts(buf, o, cap, count == on_host ? " is down, or cut off from " : " answers in part from ");
                strata_peers_puts(buf, o, cap, mine);
                strata_peers_puts(buf, o, cap, ")");
            }
        }
    }
}

void strata_peers_set_note(strata_peers_note_fn fn) { note_fn = fn; }

void strata_peers_note(char *buf, size_t *o, size_t cap) {
    if (note_fn) note_fn(buf, o, cap);
}

void strata_peers_set_reported(void) { reported = 1; }
int strata_peers_reported(void) { return reported; }

void strata_peers_explain(char *buf, size_t *o, size_t cap, int wait_ms) {
    if (!peers) return;
    reported = 1;
    /* one explanation at a time (two comm streams may time out together): the second skips the probe */
    int lost = -1;
    if (!__atomic_exchange_n(&explaining, 1, __ATOMIC_ACQ_REL)) lost = strata_peers_probe(explain_state, wait_ms);
    if (lost > 0) {
        strata_peers_puts(buf, o, cap, ": ");
        strata_peers_describe_lost(explain_state, buf, o, cap);
        strata_peers_tell_alive(explain_state, wait_ms); /* this rank ends the job next */
    } else if (lost == 0) {
        strata_peers_puts(buf, o, cap, "; every rank still answers (one may be stuck or far behind, or the network "
                                       "between them is slow or losing packets)");
    }
    if (n_hosts > 1) {
        strata_peers_puts(buf, o, cap, ". The job's hosts: ");
        strata_peers_describe_hosts(buf, o, cap);
    }
    strata_peers_puts(buf, o, cap, ". ");
    strata_peers_note(buf, o, cap);
}
