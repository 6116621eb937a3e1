/* launcher/signals.c: a training run's signals (launcher/signals.h).
 *
 * When one rank dies (SIGKILL, a crash), Open MPI's mpirun sends the others SIGCONT, then
 * SIGTERM about a second later, then SIGKILL, and exits with the dead rank's status (128 +
 * its signal: 137 for SIGKILL); nothing a survivor does changes that status. What a
 * survivor can do is say who is gone and what it was doing: at start every rank learns
 * every rank's pid and host (the host name and pid namespace), and on those signals a
 * survivor looks for a rank of its own host whose pid no longer exists. If it finds one
 * it writes its message and exits 1 at once (async-signal-safe calls only); otherwise
 * SIGTERM and SIGINT are a request to stop, as without mpirun.
 *
 * What the handler reads is file-static here; the training loop reaches it only through
 * launcher/signals.h. */
#include "launcher/signals.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "shard/mpi.h"

typedef struct rank_id {
    int64_t pid;
    char host[64];   /* gethostname() */
    char pid_ns[48]; /* /proc/self/ns/pid: ranks on one host in different namespaces cannot see each other's pids */
} rank_id;

static volatile sig_atomic_t stop_requested;
static rank_id *peers;          /* every rank's, world of them (NULL at world 1) */
static int peers_n, peers_me;
static volatile sig_atomic_t doing; /* what this rank is in, an index into doing_what */
static const char *const doing_what[] = {"starting up", "a training step", "validation", "agreeing on the step's end",
                                         "saving a checkpoint", "the final optimizer update"};
static volatile int64_t doing_step;   /* 1-based step in progress */
static volatile int64_t saved_step = -1; /* the last checkpoint this run wrote or resumed from */

/* async-signal-safe text building, for the message written from the signal handler */
static void sig_puts(char *buf, size_t *o, size_t cap, const char *s) {
    while (*s && *o + 1 < cap) buf[(*o)++] = *s++;
    buf[*o] = 0;
}
static void sig_putn(char *buf, size_t *o, size_t cap, int64_t v) {
    char d[24];
    int n = 0;
    uint64_t u = v < 0 ? (uint64_t)(-(v + 1)) + 1 : (uint64_t)v;
    do d[n++] = (char)('0' + u % 10); while ((u /= 10) && n < 23);
    if (v < 0) d[n++] = '-';
    while (n > 0 && *o + 1 < cap) buf[(*o)++] = d[--n];
    buf[*o] = 0;
}

/* SIGINT, SIGTERM, and SIGCONT at world > 1: a vanished rank of this host ends this one
 * with its message; otherwise a stop request (SIGCONT alone asks nothing). */
static void on_signal(int sig) {
    int saved_errno = errno;
    for (int r = 0; peers && r < peers_n; r++) {
        const rank_id *p = &peers[r], *me = &peers[peers_me];
        if (r == peers_me || strcmp(p->host, me->host) || strcmp(p->pid_ns, me->pid_ns)) continue;
        if (kill((pid_t)p->pid, 0) == 0 || errno != ESRCH) continue;
        static char msg[1024];
        size_t o = 0, cap = sizeof msg;
        sig_puts(msg, &o, cap, "[rank ");
        sig_putn(msg, &o, cap, peers_me);
        sig_puts(msg, &o, cap, "] error: [train] rank ");
        sig_putn(msg, &o, cap, r);
        sig_puts(msg, &o, cap, " (pid ");
        sig_putn(msg, &o, cap, p->pid);
        sig_puts(msg, &o, cap, " on ");
        sig_puts(msg, &o, cap, p->host);
        sig_puts(msg, &o, cap, ") is gone: killed, or crashed (a rank that failed by itself wrote its reason "
                               "above). This rank was in ");
        sig_puts(msg, &o, cap, doing_what[doing]);
        if (doing != STRATA_DOING_START) {
            sig_puts(msg, &o, cap, " (step ");
            sig_putn(msg, &o, cap, doing_step);
            sig_puts(msg, &o, cap, ")");
        }
        sig_puts(msg, &o, cap, " and exits 1; mpirun ends the job with the lost rank's own status (137 after SIGKILL). ");
        if (saved_step >= 0) {
            sig_puts(msg, &o, cap, "The last checkpoint, step ");
            sig_putn(msg, &o, cap, saved_step);
            sig_puts(msg, &o, cap, ", is intact: resume with --resume latest.\n");
        } else {
            sig_puts(msg, &o, cap, "No checkpoint was written yet.\n");
        }
        ssize_t w = write(STDERR_FILENO, msg, o);
        (void)w;
        _exit(STRATA_EXIT_ERROR);
    }
    if (sig != SIGCONT) stop_requested = sig;
    errno = saved_errno;
}

/* This process: its pid, host and pid namespace. */
static void fill_rank_id(rank_id *id) {
    memset(id, 0, sizeof *id);
    id->pid = (int64_t)getpid();
    if (gethostname(id->host, sizeof id->host - 1) != 0) snprintf(id->host, sizeof id->host, "?");
    ssize_t n = readlink("/proc/self/ns/pid", id->pid_ns, sizeof id->pid_ns - 1);
    id->pid_ns[n > 0 ? n : 0] = 0;
}


int strata_signals_exchange_peers(int rank, int world) {
    if (world <= 1) return 0;
    rank_id me;
    fill_rank_id(&me);
    rank_id *all = strata_xcalloc((size_t)world, sizeof *all);
    if (strata_mpi_allgather(&me, all, sizeof me)) {
        free(all);
        return -1;
    }
    peers = all; /* whole before the handler may see it */
    peers_n = world;
    peers_me = rank;
    return 0;
}

void strata_signals_install(int world) {
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    /* a signal while a checkpoint is written must not fail a system call of the save */
    sa.sa_flags = SA_RESTART;
    sigaction(SIGINT, &sa, NULL);
    sigaction(SIGTERM, &sa, NULL);
    if (world > 1) sigaction(SIGCONT, &sa, NULL); /* mpirun's first word when a rank has died */
    /* `strata train | tee log`, then Ctrl-C, ends tee too: a write to the pipe must fail
     * (EPIPE, taken by core/common.c's checked output), not end the run before its checkpoint */
    struct sigaction ign = {0};
    ign.sa_handler = SIG_IGN;
    sigaction(SIGPIPE, &ign, NULL);
}

int strata_signals_stop_requested(void) { return stop_requested; }

void strata_signals_doing(strata_doing what) { doing = what; }
void strata_signals_step(int64_t step) { doing_step = step; }
void strata_signals_saved(int64_t step) { saved_step = step; }
