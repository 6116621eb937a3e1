/* launcher/cli.h: the command line `strata train` and `strata plan` share: CONFIG (or none
 * for the built-in quickstart), --set section.key=value overrides, and each command's own
 * few options (--resume for train; --world and the memory shorthands for plan). */
#ifndef STRATA_CLI_H
#define STRATA_CLI_H

typedef struct strata_cli {
    const char *config_path; /* NULL: built-in default */
    const char *sets[64];
    int n_sets;
    const char *resume;      /* --resume latest|DIR */
    int allow_new_tokenizer; /* --allow-new-tokenizer: a resume may change the run's tokenizer */
    int world;               /* --world N (strata plan) */
} strata_cli;

/* Parses argv into cli for command `cmd` (named in messages): --resume and
 * --allow-new-tokenizer are taken when allow_resume, --world and --gpu-gb/--host-gb/--nvme-gb when allow_world. Returns 0, or
 * prints the error as "strata CMD: ..." and returns 2 (a usage error). */
int strata_cli_parse(int argc, char **argv, strata_cli *cli, const char *cmd, int allow_resume, int allow_world);

#endif
