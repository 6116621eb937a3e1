/* launcher/plan_cmd.c: `strata plan`, a config's memory plan per rank, printed without
 * training: the model, the plan of every tier, and when it does not fit the cheapest
 * change that does (exit 3). The plan itself is launcher/plan.c's. */
#include <stdio.h>

#include "core/common.h"
#include "core/model.h"
#include "io/config.h"
#include "launcher/cli.h"
#include "launcher/commands.h"
#include "launcher/plan.h"

int strata_cmd_plan(int argc, char **argv) {
    strata_cli cli;
    int rc = strata_cli_parse(argc, argv, &cli, "plan", 0, 1);
    if (rc) return rc;
    strata_config cfg;
    if (strata_config_load(&cfg, cli.config_path, cli.sets, cli.n_sets) ||
        strata_config_set_world(&cfg, cfg.path[0] ? cfg.path : "<built-in>", cli.world)) {
        fprintf(stderr, "%s\n", strata_error());
        return STRATA_EXIT_USAGE;
    }
    if (strata_plan_check_paths(&cfg)) {
        fprintf(stderr, "%s\n", strata_error());
        return STRATA_EXIT_USAGE;
    }
    int opt_auto = cfg.offload.optimizer_ratio == STRATA_AUTO, nvme_auto = cfg.offload.nvme_ratio == STRATA_AUTO;
    strata_plan_resolve_auto(&cfg, cli.world, NULL);
    if (opt_auto) printf("offload.optimizer_ratio: auto is %g\n", cfg.offload.optimizer_ratio);
    if (nvme_auto) printf("offload.nvme_ratio: auto is %g\n", cfg.offload.nvme_ratio);
    strata_plan p;
    strata_plan_compute(&p, &cfg, cli.world);
    strata_plan_check(&p, &cfg, NULL);
    strata_model_shape shape = strata_config_model_shape(&cfg);
    strata_model m;
    strata_model_init(&m, &shape);
    char desc[256];
    strata_config_model_describe(&cfg, desc, sizeof desc);
    printf("model: %s, %zu parameters; batch %d x %d x %d accumulation\n", desc, strata_model_num_params(&m),
           cfg.train.micro_batch, strata_config_seq_len(&cfg), cfg.train.grad_accum);
    strata_model_free(&m);
    strata_plan_print(&p, stdout);
    char hint[400];
    if (p.fits && strata_plan_auto_hint(&cfg, cli.world, NULL, hint, sizeof hint)) printf("  %s\n", hint);
    if (!p.fits) {
        /* the remedy ladder with its 8-bit rung: named when it is the cheapest, marked, with
         * the cheapest change that keeps the optimizer's numerics after it */
        char sets[STRATA_PLAN_MAX_SETS][96], line[800];
        double cost;
        strata_config any = cfg, keep = cfg;
        any.memory.allow_int8_state = 1;
        keep.memory.allow_int8_state = 0;
        int n = strata_plan_suggest(&any, cli.world, NULL, sets, STRATA_PLAN_MAX_SETS, line, sizeof line, &cost);
        if (n > 0 && strata_plan_changes_numerics(sets, n)) {
            printf("  cheapest change that fits (about +%.0f%% step time; changes the optimizer's numerics, 8-bit Adam "
                   "moments): %s\n", cost * 100, line);
            n = strata_plan_suggest(&keep, cli.world, NULL, sets, STRATA_PLAN_MAX_SETS, line, sizeof line, &cost);
            if (n > 0) printf("  cheapest change that keeps the optimizer's numerics (about +%.0f%% step time): %s\n",
                              cost * 100, line);
            else printf("  no change that keeps the optimizer's numerics fits\n");
        } else if (n > 0) {
            printf("  cheapest change that fits (about +%.0f%% step time): %s\n", cost * 100, line);
        } else {
            printf("  no change within reach fits: more ranks, or offload, are needed\n");
        }
        return STRATA_EXIT_NOFIT;
    }
    return STRATA_EXIT_OK;
}

