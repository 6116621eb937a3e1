/* launcher/signals.c: a training run's signals (launcher/signals.h).
 *
 * When one rank dies (SIGKILL, a crash, its host lost), Open MPI's mpirun sends the others
 * SIGCONT, then SIGTERM about a second later, then SIGKILL, and exits with the dead rank's
 * status (128 + its signal: 137 for SIGKILL); nothing a survivor does changes that status.
 * What a survivor can do is say who is gone and what it was itself doing: on each of those
 * signals, until the run's last collective is behind it, it asks after every rank (shard/peers.h: by pid on its own host, by a TCP connect
 * elsewhere, within half a second), and if some rank is gone or its host does not answer,
 * it writes their ranks and hosts, what it was in and the checkpoint to resume from, and
 * exits 1 (async-signal-safe calls only) a few seconds later, unless mpirun's SIGKILL ends
 * it first: the other survivors, asking then, must not find it gone. Otherwise SIGTERM and SIGINT are a
 * request to stop, as without mpirun. The same note (what this rank was in, the checkpoint)
 * ends the message of a collective that timed out (shard/comm.c), through
 * strata_peers_set_note.
 *
 * What the handler reads is file-static here; the training loop reaches it only through
 * launcher/signals.h. */
#include "launcher/signals.h"

#include <errno.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "core/common.h"
#include "shard/peers.h"

static volatile sig_atomic_t stop_requested;
static unsigned char *probe_state; /* the handler's two probes' results, world each (NULL at world 1) */
static volatile sig_atomic_t doing; /* what this rank is in, an index into doing_what */
static const char *const doing_what[] = {"starting up", "a training step", "validation", "agreeing on the step's end",
                                         "saving a checkpoint", "the final optimizer update",
                                         "a trial step of memory.auto", "the run's end"};
static volatile int64_t doing_step;   /* 1-based step in progress */
static volatile int64_t saved_step = -1; /* the last checkpoint this run wrote or resumed from */
static int64_t doing_since_us;           /* when doing or doing_step last changed (the watchdog's) */
static char run_dir[STRATA_PATH_MAX];    /* where that checkpoint is */

enum { PROBE_MS = 500 };  /* well within the second between mpirun's SIGCONT and its SIGTERM */
enum { SETTLE_MS = 200 };  /* between the two probes of a handler that found a rank lost */
/* How long a survivor that reported stays for the others' probes (a SIGKILL from mpirun
 * ends it sooner): those of its own host ask at about the same time; those of other hosts,
 * which Open MPI's mpirun signals a second later, learn from its note that it was one. */
enum { LINGER_MS = 1000 };

#define PUTS(s) strata_peers_puts(buf, o, cap, (s))
#define PUTN(v) strata_peers_putn(buf, o, cap, (v))

/* "This rank was in a training step (step 7)" */
static void put_doing(char *buf, size_t *o, size_t cap) {
    PUTS("This rank was in ");
    PUTS(doing_what[doing]);
    if (doing != STRATA_DOING_START) {
        PUTS(" (step ");
        PUTN(doing_step);
        PUTS(")");
    }
}

/* The checkpoint to resume from, with its directory. */
static void put_checkpoint(char *buf, size_t *o, size_t cap) {
    if (saved_step < 0) {
        PUTS("No checkpoint was written yet.");
        return;
    }
    PUTS("The last checkpoint, step ");
    PUTN(saved_step);
    if (run_dir[0]) {
        char digits[24];
        size_t d = 0;
        strata_peers_putn(digits, &d, sizeof digits, saved_step);
        PUTS(" (");
        PUTS(run_dir);
        PUTS("/ckpt/step_");
        for (size_t z = d; z < 8; z++) PUTS("0");
        PUTS(digits);
        PUTS(")");
    }
    PUTS(", is intact: resume with --resume latest");
    if (strata_peers_n_hosts() > 1) PUTS(", on the hosts that are left if one is down (a checkpoint resumes at any world size)");
    PUTS(".");
}

/* What a collective that timed out says after who is gone (strata_peers_set_note). */
static void timeout_note(char *buf, size_t *o, size_t cap) {
    put_doing(buf, o, cap);
    PUTS(". ");
    put_checkpoint(buf, o, cap);
}

/* Some rank is gone or does not answer: say who, what this rank was in, and the checkpoint. */
static _Noreturn void report_lost(void) {
    static char msg[4096];
    size_t off = 0, *o = &off, cap = sizeof msg;
    char *buf = msg;
    int me = strata_peers_me(), world = strata_peers_world(), lost = -1, n_lost = 0;
    for (int r = 0; r < world; r++)
        if (probe_state[r] != STRATA_PEER_ALIVE) {
            lost = r;
            n_lost++;
        }
    const strata_peer *p = strata_peers_get(lost), *self = strata_peers_get(me);
    PUTS("[rank ");
    PUTN(me);
    PUTS("] error: [train] ");
    if (n_lost == 1 && probe_state[lost] == STRATA_PEER_GONE && !strcmp(p->host, self->host)) {
        PUTS("rank ");
        PUTN(lost);
        PUTS(" (pid ");
        PUTN(p->pid);
        PUTS(" on ");
        PUTS(p->host);
        PUTS(") is gone: killed, or crashed (a rank that failed by itself wrote its reason above). ");
    } else {
        strata_peers_describe_lost(probe_state, buf, o, cap);
        PUTS(". A rank that failed by itself wrote its reason above. ");
    }
    put_doing(buf, o, cap);
    PUTS(" and exits 1; mpirun ends the job with the lost rank's own status (137 after SIGKILL). ");
    if (strata_peers_n_hosts() > 1) {
        PUTS("The job's hosts: ");
        strata_peers_describe_hosts(buf, o, cap);
        PUTS(". ");
    }
    put_checkpoint(buf, o, cap);
    PUTS("\n");
    strata_peers_set_reported();
    ssize_t w = write(STDERR_FILENO, msg, off);
    (void)w; /* nowhere else to say it */
    strata_peers_tell_alive(probe_state, PROBE_MS);
    /* The other survivors ask after every rank about now, or a second later, from their own
     * handlers: one that exited at once would look lost to them. So it told them it is one,
     * and it stays (its probe port open) for LINGER_MS, unless mpirun's SIGKILL comes first;
     * SIGTERM waits, blocked. */
    for (int i = 0; i < LINGER_MS / 50; i++) {
        struct timespec nap = {0, 50 * 1000000L};
        nanosleep(&nap, NULL);
    }
    _exit(STRATA_EXIT_ERROR);
}

/* SIGINT, SIGTERM, and SIGCONT at world > 1: a rank that is gone or cut off ends this one
 * with its message; otherwise a stop request (SIGCONT alone asks nothing). The three are
 * blocked while it runs, so the probe's results are never written twice at once. */
static void on_signal(int sig) {
    int saved_errno = errno;
    /* a collective that timed out said who is gone already, and is ending the job; past the
     * last collective, the other ranks may have ended as they should, and mpirun, stopping
     * the job on a Ctrl-C, signals those that are left (across hosts, a host's ranks that
     * stopped and ended were named lost by the others) */
    if (probe_state && doing != STRATA_DOING_END && !strata_peers_reported() &&
        strata_peers_probe(probe_state, PROBE_MS) > 0) {
        /* the ranks of a lost host do not all vanish in the same millisecond: ask again a
         * moment later, and report every rank either probe found lost */
        int world = strata_peers_world();
        unsigned char *again = probe_state + world;
        struct timespec nap = {0, SETTLE_MS * 1000000L};
        nanosleep(&nap, NULL);
        strata_peers_probe(again, PROBE_MS);
        for (int r = 0; r < world; r++)
            if (again[r] > probe_state[r]) probe_state[r] = again[r];
        report_lost();
    }
    if (sig != SIGCONT) stop_requested = sig;
    errno = saved_errno;
}

#undef PUTS
#undef PUTN

void strata_signals_run_dir(const char *dir) {
    snprintf(run_dir, sizeof run_dir, "%s", dir);
    strata_peers_set_note(timeout_note);
}

void strata_signals_install(int world) {
    if (world > 1 && strata_peers_world() == world && !probe_state) probe_state = strata_xcalloc(2 * (size_t)world, 1);
    struct sigaction sa = {0};
    sa.sa_handler = on_signal;
    /* a signal while a checkpoint is written must not fail a system call of the save */
    sa.sa_flags = SA_RESTART;
    sigemptyset(&sa.sa_mask);
    sigaddset(&sa.sa_mask, SIGINT);
    sigaddset(&sa.sa_mask, SIGTERM);
    sigaddset(&sa.sa_mask, SIGCONT);
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

static void note_progress(void) { __atomic_store_n(&doing_since_us, (int64_t)(strata_now_ms() * 1e3), __ATOMIC_RELEASE); }
void strata_signals_doing(strata_doing what) {
    doing = what;
    note_progress();
}
void strata_signals_step(int64_t step) {
    doing_step = step;
    note_progress();
}

strata_doing strata_signals_where(double *since_ms) {
    *since_ms = (double)__atomic_load_n(&doing_since_us, __ATOMIC_ACQUIRE) / 1e3;
    return (strata_doing)doing;
}

void strata_signals_note(char *buf, size_t cap) {
    size_t off = 0;
    if (cap) buf[0] = 0;
    timeout_note(buf, &off, cap); /* strata_peers_puts keeps it terminated */
}
void strata_signals_saved(int64_t step) { saved_step = step; }
