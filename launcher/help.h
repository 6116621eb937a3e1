/* launcher/help.h: what `strata COMMAND --help` and `strata --version` print. */
#ifndef STRATA_HELP_H
#define STRATA_HELP_H

/* Whether the command line of a subcommand asks for help (-h or --help anywhere). */
int strata_help_asked(int argc, char **argv);
/* Prints COMMAND's usage and options on stdout; 0, or -1 for an unknown command. */
int strata_cmd_help(const char *cmd);
/* `strata --version`: the version and what this binary was built with. */
int strata_cmd_version(void);

#endif
