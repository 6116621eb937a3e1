/* launcher/tokenizer.c: a run's tokenizer, found beside its data, recorded in its run
 * directory, found again from its checkpoints (launcher/tokenizer.h). */
#include "launcher/tokenizer.h"

#include <errno.h>
#include <libgen.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/common.h"
#include "io/files.h"

#define RUN_TOKENIZER "tokenizer.json"

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

int strata_run_tokenizer_record(const strata_config *cfg, const strata_bpe *tk) {
    if (strata_mkdir_p(cfg->run.dir)) return strata_fail_wrap("run.dir");
    char path[STRATA_PATH_MAX + 32];
    snprintf(path, sizeof path, "%s/%s", cfg->run.dir, RUN_TOKENIZER);
    return strata_bpe_save(tk, path);
}

strata_bpe *strata_ckpt_tokenizer(const char *ckpt_dir, int *failed) {
    *failed = 0;
    char real[PATH_MAX], path[PATH_MAX + 32];
    if (!realpath(ckpt_dir, real)) return NULL;
    /* <run.dir>/ckpt/step_N: two levels up */
    snprintf(path, sizeof path, "%s", dirname(dirname(real)));
    size_t n = strlen(path);
    snprintf(path + n, sizeof path - n, "/%s", RUN_TOKENIZER);
    if (!strata_is_file(path)) return NULL;
    strata_bpe *tk = strata_bpe_load(path);
    if (!tk) *failed = 1;
    return tk;
}
