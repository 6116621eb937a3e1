/* launcher/resume.c: what `strata train --resume` must agree with: the checkpoint's model
 * keys and its tokenizer (launcher/resume.h). */
#include "launcher/resume.h"

#include <stdio.h>

#include "core/common.h"
#include "io/checkpoint.h"
#include "launcher/tokenizer.h"

/* "PATH (N tokens, digest XXXXXXXX)" for messages. */
static void describe(const strata_bpe *tk, uint32_t digest, char *buf, size_t n) {
    snprintf(buf, n, "%s (%d tokens, digest %08x)", strata_bpe_source(tk), strata_bpe_vocab_size(tk), digest);
}

/* The data's tokenizer against the one the checkpoint in `dir` was trained with. */
static int check_tokenizer(const char *dir, const strata_bpe *data_tk, int allow, int *usage) {
    int failed = 0;
    strata_bpe *old = strata_ckpt_tokenizer(dir, &failed);
    if (failed) return strata_fail_wrap("the tokenizer %s was trained with", dir);
    /* none on either side says nothing about what the ids mean: nothing to compare */
    if (!old || !data_tk) {
        strata_bpe_free(old);
        return 0;
    }
    uint32_t a = 0, b = 0;
    int rc = strata_bpe_digest(old, &a) || strata_bpe_digest(data_tk, &b) ? -1 : 0;
    if (!rc && a != b) {
        char was[1200], now[1200];
        describe(old, a, was, sizeof was);
        describe(data_tk, b, now, sizeof now);
        if (allow) {
            STRATA_WARN("train", "--allow-new-tokenizer: %s was trained with tokenizer %s; this run's data has %s. The "
                        "run continues with the new one; the earlier checkpoints keep theirs", dir, was, now);
        } else {
            *usage = 1;
            rc = strata_fail("the data's tokenizer %s is not the one %s was trained with, %s: its token ids would mean "
                             "other text. Use the data prepared with that tokenizer, or pass --allow-new-tokenizer to "
                             "go on with the new one (earlier checkpoints keep theirs)", now, dir, was);
        }
    }
    strata_bpe_free(old);
    return rc;
}

int strata_resume_check(const strata_config *cfg, const char *resume, const strata_bpe *data_tk,
                        int allow_new_tokenizer, int *usage) {
    *usage = 0;
    char dir[STRATA_PATH_MAX];
    if (strata_ckpt_resolve(resume, cfg->run.dir, dir, sizeof dir)) return -1; /* it says what it looked for */
    int bad_manifest = 0;
    strata_ckpt *ck = strata_ckpt_open_checked(dir, &bad_manifest);
    if (!ck) {
        *usage = bad_manifest; /* an edited manifest is bad input, not a failed run */
        return strata_fail_wrap("opening the checkpoint");
    }
    /* the checkpoint's own config; its model.init_from was read when it started and need
     * not exist any more */
    char name[STRATA_PATH_MAX + 32];
    snprintf(name, sizeof name, "%s/manifest.yaml", dir);
    const char *no_init = "model.init_from=";
    strata_config saved;
    int rc = strata_config_load_string(&saved, name, strata_ckpt_get_meta(ck)->config_yaml, &no_init, 1);
    strata_ckpt_close(ck);
    if (rc) {
        *usage = 1;
        return strata_fail_wrap("the config %s was trained with", dir);
    }
    if (strata_config_check_same_model(&saved, dir, cfg)) {
        *usage = 1;
        return -1;
    }
    return check_tokenizer(dir, data_tk, allow_new_tokenizer, usage);
}
