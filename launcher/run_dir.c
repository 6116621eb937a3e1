/* launcher/run_dir.c: taking run.dir for one training run (launcher/run_dir.h). */
#include "launcher/run_dir.h"

#include <errno.h>
#include <limits.h>
#include <stdio.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/common.h"
#include "io/checkpoint.h"
#include "io/files.h"

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
