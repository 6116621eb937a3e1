/* launcher/tokenizer.c: a run's tokenizer, found beside its data, recorded in its run
 * directory (and, when it changes, in the earlier checkpoints), found again from its
 * checkpoints (launcher/tokenizer.h). */
#include "launcher/tokenizer.h"

#include <dirent.h>
#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/common.h"
#include "io/files.h"

#define RUN_TOKENIZER "tokenizer.json"
#define RUN_TOKENIZER_CONFIG "tokenizer_config.json"
#define MAX_TOKENIZER_BYTES ((size_t)128 << 20) /* io/bpe.c's bound on what it reads */

int strata_run_tokenizer_open(const strata_config *cfg, strata_bpe **out) {
    *out = NULL;
    char path[STRATA_PATH_MAX + 32];
    const char *what = "data.tokenizer";
    if (cfg->data.tokenizer[0]) {
        snprintf(path, sizeof path, "%s", cfg->data.tokenizer);
    } else {
        /* beside the shards: the glob's directory */
        char dir[STRATA_PATH_MAX];
        snprintf(dir, sizeof dir, "%s", cfg->data.train);
        char *slash = strrchr(dir, '/');
        if (slash) *slash = 0;
        else snprintf(dir, sizeof dir, ".");
        if (strpbrk(dir, "*?[")) return 0; /* a glob over directories: no one place to look */
        snprintf(path, sizeof path, "%s/%s", dir, RUN_TOKENIZER);
        if (!strata_is_file(path)) return 0;
        what = "the tokenizer.json beside data.train";
    }
    strata_bpe *tk = strata_bpe_load(path);
    if (!tk) return strata_fail_wrap("%s", what);
    if (strata_bpe_vocab_size(tk) > cfg->model.vocab_size) {
        int n = strata_bpe_vocab_size(tk);
        strata_bpe_free(tk);
        return strata_fail("%s %s has %d tokens, more than model.vocab_size %d (set model.vocab_size to at least %d)",
                           what, path, n, cfg->model.vocab_size, n);
    }
    *out = tk;
    return 0;
}

/* A name the checkpoint writer gives a finished step: "step_" and digits, no suffix. */
static int is_step_name(const char *name) {
    if (strncmp(name, "step_", 5) || !name[5]) return 0;
    for (const char *p = name + 5; *p; p++)
        if (*p < '0' || *p > '9') return 0;
    return 1;
}

/* The run's tokenizer.json (old[0, n)) is about to be replaced by another: every checkpoint
 * of run.dir without a tokenizer.json of its own was trained with the old one, so each gets
 * a copy (atomically) before the run's changes. */
static int keep_old_tokenizer(const char *run_dir, const char *old, size_t n) {
    char ckpt[STRATA_PATH_MAX + 8], cfg_path[STRATA_PATH_MAX + 32];
    char *old_cfg = NULL;
    size_t cfg_n = 0;
    snprintf(cfg_path, sizeof cfg_path, "%s/%s", run_dir, RUN_TOKENIZER_CONFIG);
    if (strata_is_file(cfg_path) && strata_read_file_bounded(cfg_path, MAX_TOKENIZER_BYTES, &old_cfg, &cfg_n)) return -1;
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", run_dir);
    DIR *d = opendir(ckpt);
    if (!d) {
        free(old_cfg);
        return errno == ENOENT ? 0 : strata_fail("%s: cannot list: %s", ckpt, strerror(errno));
    }
    int rc = 0, kept = 0;
    struct dirent *e;
    while (!rc && (e = readdir(d)) != NULL) {
        char step[STRATA_PATH_MAX + 300], path[STRATA_PATH_MAX + 340];
        if (!is_step_name(e->d_name)) continue;
        snprintf(step, sizeof step, "%s/%s", ckpt, e->d_name);
        snprintf(path, sizeof path, "%s/%s", step, RUN_TOKENIZER);
        if (!strata_is_dir(step) || strata_is_file(path)) continue;
        if ((rc = strata_write_file_atomic(path, old, n)) == 0) kept++;
        if (!rc && old_cfg) { /* and the tokenizer_config.json beside it (its EOS, its chat template) */
            snprintf(path, sizeof path, "%s/%s", step, RUN_TOKENIZER_CONFIG);
            rc = strata_write_file_atomic(path, old_cfg, cfg_n);
        }
    }
    (void)closedir(d); /* read-only: nothing to lose */
    free(old_cfg);
    if (kept) STRATA_INFO("train", "the run's tokenizer changes: its %d earlier checkpoint%s keep%s the one %s trained "
                          "with (a copy in each)", kept, kept == 1 ? "" : "s", kept == 1 ? "s" : "",
                          kept == 1 ? "it was" : "they were");
    return rc;
}

int strata_run_tokenizer_record(const strata_config *cfg, const strata_bpe *tk) {
    if (strata_mkdir_p(cfg->run.dir)) return strata_fail_wrap("run.dir");
    char path[STRATA_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/%s", cfg->run.dir, RUN_TOKENIZER);
    if (strata_is_file(path)) {
        uint32_t mine = 0;
        char *old = NULL;
        size_t n = 0;
        if (strata_bpe_digest(tk, &mine) || strata_read_file_bounded(path, MAX_TOKENIZER_BYTES, &old, &n))
            return -1;
        int rc = strata_crc32c(0, old, n) == mine ? 0 : keep_old_tokenizer(cfg->run.dir, old, n);
        free(old);
        if (rc) return -1;
    }
    if (strata_bpe_save(tk, path)) return -1;
    /* tokenizer_config.json beside it: the data's (its EOS, its chat template), or none */
    snprintf(path, sizeof path, "%s/%s", cfg->run.dir, RUN_TOKENIZER_CONFIG);
    if (strata_bpe_has_config(tk)) return strata_bpe_save_config(tk, path, 0);
    if (unlink(path) != 0 && errno != ENOENT) return strata_fail("%s: cannot remove the earlier data's: %s", path, strerror(errno));
    return 0;
}

strata_bpe *strata_ckpt_tokenizer(const char *ckpt_dir, int *failed) {
    *failed = 0;
    char real[PATH_MAX], path[PATH_MAX + 32];
    if (!realpath(ckpt_dir, real)) return NULL;
    /* the step's own (kept when the run's changed since), else <run.dir>/ckpt/step_N's
     * run's: two levels up */
    snprintf(path, sizeof path, "%s/%s", real, RUN_TOKENIZER);
    if (!strata_is_file(path)) {
        snprintf(path, sizeof path, "%s", dirname(dirname(real)));
        size_t n = strlen(path);
        snprintf(path + n, sizeof path - n, "/%s", RUN_TOKENIZER);
    }
    if (!strata_is_file(path)) return NULL;
    strata_bpe *tk = strata_bpe_load(path);
    if (!tk) *failed = 1;
    return tk;
}
