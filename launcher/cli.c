/* launcher/cli.c: the command line `strata train` and `strata plan` share (launcher/cli.h). */
#include "launcher/cli.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"

int strata_cli_parse(int argc, char **argv, strata_cli *cli, const char *cmd, int allow_resume, int allow_world) {
    memset(cli, 0, sizeof *cli);
    cli->world = 1;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        if (!strcmp(a, "--set") || !strcmp(a, "-s")) {
            if (i + 1 >= argc) { fprintf(stderr, "strata %s: --set needs section.key=value\n", cmd); return STRATA_EXIT_USAGE; }
            if (cli->n_sets == 64) { fprintf(stderr, "strata %s: at most 64 --set overrides\n", cmd); return STRATA_EXIT_USAGE; }
            cli->sets[cli->n_sets++] = argv[++i];
        } else if (!strncmp(a, "--set=", 6)) {
            if (cli->n_sets == 64) { fprintf(stderr, "strata %s: at most 64 --set overrides\n", cmd); return STRATA_EXIT_USAGE; }
            cli->sets[cli->n_sets++] = a + 6;
        } else if (allow_resume && !strcmp(a, "--resume")) {
            if (i + 1 >= argc) { fprintf(stderr, "strata %s: --resume needs 'latest' or a checkpoint directory\n", cmd); return STRATA_EXIT_USAGE; }
            cli->resume = argv[++i];
        } else if (allow_resume && !strcmp(a, "--allow-new-tokenizer")) {
            cli->allow_new_tokenizer = 1;
        } else if (allow_world && (!strcmp(a, "--gpu-gb") || !strcmp(a, "--host-gb") || !strcmp(a, "--nvme-gb"))) {
            /* shorthands for the memory.* keys, checked like any --set */
            static char buf[3][64];
            int k = a[2] == 'g' ? 0 : a[2] == 'h' ? 1 : 2;
            if (i + 1 >= argc || cli->n_sets == 64) { fprintf(stderr, "strata %s: %s needs a number of GiB\n", cmd, a); return STRATA_EXIT_USAGE; }
            snprintf(buf[k], sizeof buf[k], "memory.%s_gb=%s", k == 0 ? "gpu" : k == 1 ? "host" : "nvme", argv[++i]);
            cli->sets[cli->n_sets++] = buf[k];
        } else if (allow_world && !strcmp(a, "--world")) {
            char *end = NULL;
            if (i + 1 >= argc || (cli->world = (int)strtol(argv[i + 1], &end, 10), *end) || cli->world < 1) {
                fprintf(stderr, "strata %s: --world expects a positive integer\n", cmd);
                return STRATA_EXIT_USAGE;
            }
            i++;
        } else if (a[0] == '-') {
            fprintf(stderr, "strata %s: unknown option '%s'\n", cmd, a);
            return STRATA_EXIT_USAGE;
        } else if (!cli->config_path) {
            cli->config_path = a;
        } else {
            fprintf(stderr, "strata %s: unexpected argument '%s' (one CONFIG file)\n", cmd, a);
            return STRATA_EXIT_USAGE;
        }
    }
    return 0;
}

