/* io/checkpoint_prune.c: removing checkpoints a run no longer needs: retention after a
 * commit (keep the newest N) and the leftovers of killed saves (step_N.tmp, step_N.old,
 * latest.tmp), at a commit and at the start of a run. A finished checkpoint is retired
 * by renaming it to step_N.old first, so a crash half-way never leaves something that
 * looks complete. */
#include "io/checkpoint_prune.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "io/checkpoint.h"
#include "io/checkpoint_format.h"
#include "io/files.h"

/* Deletes a whole checkpoint directory: first renamed to step_N.old so a crash half-way
 * never leaves something that looks like a complete checkpoint (the next commit removes
 * leftover .old directories). */
static int retire_dir(const char *ckpt_dir, const char *name) {
    char p[CKPT_PATH_MAX], old[CKPT_PATH_MAX];
    if (strata_ckpt_fmt_path(p, sizeof p, "%s/%s", ckpt_dir, name) != 0) return -1;
    if (strata_ckpt_fmt_path(old, sizeof old, "%s/%s.old", ckpt_dir, name) != 0) return -1;
    if (strata_rm_tree(old) != 0) return -1;
    if (rename(p, old) != 0) return strata_fail("%s: cannot rename to %s: %s", p, old, strerror(errno));
    return strata_rm_tree(old);
}

void strata_ckpt_prune(const char *ckpt_dir, const char *current, int keep, const char *protect) {
    static const char *const leftovers[] = {".tmp", ".old"};
    for (int s = 0; s < 2; s++) {
        strata_ckpt_step *v;
        int n;
        if (strata_ckpt_list_steps(ckpt_dir, leftovers[s], &v, &n) != 0) {
            STRATA_WARN("ckpt", "%s", strata_error());
            continue;
        }
        for (int i = 0; i < n; i++) {
            char p[CKPT_PATH_MAX];
            if (strata_ckpt_fmt_path(p, sizeof p, "%s/%s", ckpt_dir, v[i].name) != 0 || strata_rm_tree(p) != 0)
                STRATA_WARN("ckpt", "removing a stale directory: %s", strata_error());
            else STRATA_DEBUG("ckpt", "removed stale %s", p);
        }
        free(v);
    }
    if (keep <= 0) return;
    strata_ckpt_step *v;
    int n;
    if (strata_ckpt_list_steps(ckpt_dir, "", &v, &n) != 0) {
        STRATA_WARN("ckpt", "%s", strata_error());
        return;
    }
    int kept = 0;
    for (int i = 0; i < n; i++) {
        if (!v[i].complete) continue;
        if (kept < keep || !strcmp(v[i].name, current)) {
            kept++;
            continue;
        }
        if (!strcmp(v[i].name, protect)) continue; /* the best: kept besides the newest */
        if (retire_dir(ckpt_dir, v[i].name) != 0) STRATA_WARN("ckpt", "retention: %s", strata_error());
        else STRATA_DEBUG("ckpt", "retention: removed %s/%s", ckpt_dir, v[i].name);
    }
    free(v);
}

static void append_name(char *buf, size_t len, const char *name) {
    size_t o = strlen(buf);
    if (o + 1 >= len) return;
    snprintf(buf + o, len - o, "%s%s", o ? ", " : "", name);
}

int strata_ckpt_clean_stale(const char *run_dir, char *removed, size_t removed_len) {
    char ckpt_dir[CKPT_PATH_MAX], p[CKPT_PATH_MAX], done[CKPT_PATH_MAX];
    if (removed_len) removed[0] = 0;
    if (strata_ckpt_fmt_path(ckpt_dir, sizeof ckpt_dir, "%s/ckpt", run_dir) != 0) return -1;
    if (!strata_is_dir(ckpt_dir)) return 0;
    int n_removed = 0;
    static const char *const leftovers[] = {".tmp", ".old"};
    for (int s = 0; s < 2; s++) {
        strata_ckpt_step *v;
        int n;
        if (strata_ckpt_list_steps(ckpt_dir, leftovers[s], &v, &n) != 0) return -1;
        for (int i = 0; i < n; i++) {
            if (strata_ckpt_fmt_path(p, sizeof p, "%s/%s", ckpt_dir, v[i].name) != 0) continue;
            if (s == 1) { /* .old: the previous copy of a re-saved step; only once the new one is in place */
                if (strata_ckpt_fmt_path(done, sizeof done, "%s/step_%08lld/manifest.yaml", ckpt_dir,
                                         (long long)v[i].step) != 0 ||
                    !strata_is_file(done))
                    continue;
            }
            if (strata_rm_tree(p) != 0) {
                free(v);
                return -1;
            }
            append_name(removed, removed_len, v[i].name);
            n_removed++;
        }
        free(v);
    }
    if (strata_ckpt_fmt_path(p, sizeof p, "%s/latest.tmp", ckpt_dir) == 0 && strata_is_file(p)) {
        if (unlink(p) != 0) return strata_fail("%s: cannot remove: %s", p, strerror(errno));
        append_name(removed, removed_len, "latest.tmp");
        n_removed++;
    }
    if (n_removed && strata_fsync_dir(ckpt_dir) != 0) return -1;
    return n_removed;
}
