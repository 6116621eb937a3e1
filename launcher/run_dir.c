/* launcher/run_dir.c: taking run.dir for one training run, and under mpirun checking that
 * every host sees it (launcher/run_dir.h). */
#include "launcher/run_dir.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/common.h"
#include "io/checkpoint.h"
#include "io/files.h"
#include "shard/mpi.h"
#include "shard/peers.h"
#include "launcher/agree.h"

/* A directory the run writes into (run.dir; run.dir/ckpt, where checkpoints go) is one,
 * or is missing and can be made: a symbolic link loop, a link to nothing, a file or a
 * directory the run cannot write would otherwise fail the first checkpoint, after the
 * steps before it were computed. Returns an exit code: 2 naming what is wrong there (the
 * config names a place that cannot work), 1 when it cannot even be looked at. */
static int check_writable_dir(const char *path, const char *what) {
    struct stat st;
    if (stat(path, &st) == 0) {
        if (!S_ISDIR(st.st_mode)) {
            strata_fail("%s '%s' is %s, not a directory: saving there would fail; move it "
                        "away or set run.dir to another directory", what, path, strata_file_kind(st.st_mode));
            return STRATA_EXIT_USAGE;
        }
        if (access(path, W_OK | X_OK) != 0) {
            strata_fail("%s '%s' cannot be written by this user (%s): saving there would fail", what, path,
                        strerror(errno));
            return STRATA_EXIT_USAGE;
        }
        return 0;
    }
    int e = errno;
    if (e == ENOENT && lstat(path, &st) != 0) return 0; /* missing: made when it is needed */
    if (e == ELOOP) {
        strata_fail("%s '%s' is a symbolic link loop (%s): saving there would fail; remove the link or "
                    "point it at a directory", what, path, strerror(e));
        return STRATA_EXIT_USAGE;
    }
    if (e == ENOENT) {
        char to[PATH_MAX] = "?";
        ssize_t n = readlink(path, to, sizeof to - 1);
        to[n > 0 ? n : 1] = 0;
        strata_fail("%s '%s' is a symbolic link to %s, which does not exist: saving there would fail; "
                    "make that directory or remove the link", what, path, to);
        return STRATA_EXIT_USAGE;
    }
    if (e == ENOTDIR) {
        strata_fail("%s '%s': a component of the path is not a directory", what, path);
        return STRATA_EXIT_USAGE;
    }
    strata_fail("%s '%s': cannot look at it: %s", what, path, strerror(e));
    return STRATA_EXIT_ERROR;
}

/* Takes run.dir for this run: flock(2) on run.dir/lock, held until the process
 * ends (the kernel lets go of it however the process ends, so a crashed or killed run
 * never leaves it stuck), with this process's pid and host written in it for whoever
 * is refused. Returns an exit code: 2 when another run holds it. */
static int lock_run_dir(const char *dir, int *lock_fd) {
    char path[STRATA_PATH_MAX + 32];
    int rc = check_writable_dir(dir, "run.dir");
    if (rc) return rc;
    if (strata_mkdir_p(dir)) {
        strata_fail_wrap("run.dir '%s'", dir);
        return STRATA_EXIT_ERROR;
    }
    snprintf(path, sizeof path, "%s/lock", dir);
    char who[256];
    int taken = strata_lock_take(path, lock_fd, who, sizeof who);
    if (taken < 0) return STRATA_EXIT_ERROR;
    if (taken > 0) {
        strata_fail("run.dir '%s' is in use by another `strata train` (%s; it holds %s). Two runs in one directory "
                    "would mix their checkpoints and metrics: wait for that run to end, stop it, or set run.dir "
                    "to another directory", dir, who[0] ? who : "it has not written its pid yet", path);
        return STRATA_EXIT_USAGE;
    }
    return 0;
}

int strata_run_dir_take(const char *dir, int *lock_fd) {
    int rc = lock_run_dir(dir, lock_fd);
    if (rc) return rc;
    char ckpt[STRATA_PATH_MAX + 32];
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", dir);
    if ((rc = check_writable_dir(ckpt, "the checkpoint directory"))) return rc;
    char removed[1024];
    int n = strata_ckpt_clean_stale(dir, removed, sizeof removed);
    if (n < 0) return STRATA_EXIT_ERROR;
    if (n > 0)
        STRATA_INFO("ckpt", "removed %d unfinished checkpoint%s that a run killed while saving left in %s/ckpt: %s",
                    n, n == 1 ? "" : "s", dir, removed);
    return 0;
}

/* ---- one directory for every host ---- */

enum { SEEN = 0, MISSING, OTHER, UNREADABLE };

static int write_job_file(const char *dir, const char *token, const char *about) {
    char path[STRATA_PATH_MAX + 32], text[4096];
    snprintf(path, sizeof path, "%s/job.txt", dir);
    int n = snprintf(text, sizeof text, "token %s\n%s\nEvery rank reads this file back at its start: run.dir must be "
                     "one directory that every host of the job shares.\n", token, about);
    if (n < 0 || (size_t)n >= sizeof text) n = (int)sizeof text - 1;
    if (strata_write_file_atomic(path, text, (size_t)n)) return strata_fail_wrap("run.dir: writing %s", path);
    return 0;
}

/* What this rank sees of dir/job.txt: SEEN (this job's token), MISSING (after waiting),
 * OTHER (another job's file: another directory at the same path), UNREADABLE (error set). */
static int32_t job_file_seen(const char *dir, const char *token) {
    char path[STRATA_PATH_MAX + 32], want[96];
    snprintf(path, sizeof path, "%s/job.txt", dir);
    int n = snprintf(want, sizeof want, "token %s\n", token);
    /* a file another host created a moment ago: NFS may cache the name's absence for a few
     * seconds (its negative lookups), so look again for up to 5 s before saying it is not there */
    for (int tries = 0;; tries++) {
        char *text = NULL;
        size_t len = 0;
        if (strata_read_file_bounded(path, 1 << 16, &text, &len) == 0) {
            int mine = len >= (size_t)n && !memcmp(text, want, (size_t)n);
            free(text);
            return mine ? SEEN : OTHER;
        }
        if (access(path, F_OK) == 0 || errno != ENOENT) return UNREADABLE; /* the error says why */
        if (tries >= 50) return MISSING;
        struct timespec nap = {0, 100 * 1000000L};
        nanosleep(&nap, NULL);
    }
}

int strata_run_dir_shared(const char *dir, int rank, int world) {
    struct {
        int32_t rc;
        char token[40];
    } job = {0, ""};
    if (rank == 0) {
        uint64_t r[2] = {0, 0};
        if (getrandom(r, sizeof r, 0) != (ssize_t)sizeof r) /* no entropy source: the time and pid do here */
            r[0] = (uint64_t)(strata_now_ms() * 1e3), r[1] = (uint64_t)getpid();
        snprintf(job.token, sizeof job.token, "%016llx%016llx", (unsigned long long)r[0], (unsigned long long)r[1]);
        char about[1200];
        size_t o = (size_t)snprintf(about, sizeof about, "rank 0: pid %lld on %s; world %d on %d host%s: ",
                                    (long long)getpid(), strata_peers_host(0), world, strata_peers_n_hosts(),
                                    strata_peers_n_hosts() == 1 ? "" : "s");
        strata_peers_describe_hosts(about, &o, sizeof about);
        if (write_job_file(dir, job.token, about)) {
            STRATA_ERROR("train", "%s", strata_error());
            job.rc = STRATA_EXIT_ERROR;
        }
    }
    if (strata_mpi_bcast(&job, sizeof job, 0)) return -1;
    if (job.rc) return job.rc;
    int32_t seen = job_file_seen(dir, job.token), *all = strata_xcalloc((size_t)world, sizeof *all);
    if (seen == UNREADABLE) STRATA_ERROR("train", "run.dir on %s: %s", strata_peers_host(rank), strata_error());
    if (strata_mpi_allgather(&seen, all, sizeof seen)) {
        free(all);
        return -1;
    }
    static const char *const what[] = {"", "cannot see the job.txt rank 0 just wrote there",
                                       "see another job's job.txt there: a directory of their own at that path",
                                       "cannot read the job.txt rank 0 just wrote there (said above)"};
    int *ranks = strata_xcalloc((size_t)world, sizeof *ranks), refused = 0;
    for (int k = MISSING; k <= UNREADABLE; k++) {
        int n = 0;
        for (int r = 0; r < world; r++)
            if (all[r] == k) ranks[n++] = r;
        refused |= n > 0;
        if (!n || rank != 0) continue;
        char who[1024];
        size_t o = 0;
        who[0] = 0;
        strata_peers_describe_ranks(ranks, n, who, &o, sizeof who);
        STRATA_ERROR("train", "run.dir '%s': %s %s %s", dir, n == 1 ? "rank" : "ranks", who, what[k]);
    }
    if (refused && rank == 0)
        STRATA_ERROR("train", "every rank writes its part of each checkpoint into run.dir/ckpt, rank 0 commits them, and "
                     "a resume reads them all, so run.dir must be one directory every host shares (NFS, Lustre, ...) at "
                     "the same path; a node-local disk serves offload.nvme_path, not run.dir");
    free(ranks);
    free(all);
    if (refused && strata_ranks_spoken()) return -1;
    return refused ? STRATA_EXIT_USAGE : 0;
}
