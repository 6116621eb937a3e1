/* launcher/commands.c: what the subcommands share (launcher/commands.h): opening the
 * checkpoint sample, export and dump-grads read. */
#include "launcher/commands.h"

#include <stdio.h>
#include <string.h>

#include "core/common.h"

int strata_open_checkpoint(const char *cmd, const char *what, const char *const *sets, int n_sets,
                           strata_opened_ckpt *o) {
    memset(o, 0, sizeof *o);
    if (strata_ckpt_resolve(what, ".", o->dir, sizeof o->dir)) {
        fprintf(stderr, "strata %s: %s\n", cmd, strata_error());
        return STRATA_EXIT_USAGE;
    }
    int bad_manifest = 0;
    o->ck = strata_ckpt_open_checked(o->dir, &bad_manifest);
    if (!o->ck) {
        fprintf(stderr, "strata %s: %s\n", cmd, strata_error());
        return bad_manifest ? STRATA_EXIT_USAGE : STRATA_EXIT_ERROR;
    }
    char name[STRATA_PATH_MAX + 32];
    snprintf(name, sizeof name, "%s/manifest.yaml", o->dir);
    /* the weights are the checkpoint's: the run's model.init_from need not exist any more */
    const char *all[64 + 1];
    int n_all = 0;
    for (int i = 0; i < n_sets && i < 64; i++) all[n_all++] = sets[i];
    all[n_all++] = "model.init_from=";
    if (strata_config_load_string(&o->cfg, name, strata_ckpt_get_meta(o->ck)->config_yaml, all, n_all)) {
        fprintf(stderr, "strata %s: %s\n", cmd, strata_error());
        strata_ckpt_close(o->ck);
        o->ck = NULL;
        return STRATA_EXIT_ERROR;
    }
    return STRATA_EXIT_OK;
}
