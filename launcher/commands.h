/* launcher/commands.h: the subcommands of the `strata` program. Each returns a process
 * exit code (core/common.h). Every rank runs the same command under mpirun. */
#ifndef STRATA_COMMANDS_H
#define STRATA_COMMANDS_H

#include "io/checkpoint.h"
#include "io/config.h"
#include "io/safetensors_write.h"

/* A checkpoint opened for a subcommand (sample, export, dump-grads), with the config it was
 * saved with. */
typedef struct strata_opened_ckpt {
    char dir[STRATA_PATH_MAX];
    strata_ckpt *ck;
    strata_config cfg;
} strata_opened_ckpt;
/* Resolves and opens CKPT|RUNDIR and parses its config, `sets` applied on top; a set that
 * changes a key the weights' meaning depends on (model.n_head, ...) is refused (exit 2).
 * Prints the error as "strata CMD: ..." and returns an exit code. */
int strata_open_checkpoint(const char *cmd, const char *what, const char *const *sets, int n_sets,
                           strata_opened_ckpt *o);

/* A model to run inference on (sample, eval): CKPT|RUNDIR as strata_open_checkpoint opens
 * it, or a Hugging Face model (a .safetensors file, or a directory with config.json that
 * holds neither manifest.yaml nor ckpt/), whose config.json gives the shape
 * (model.init_from; o->ck stays NULL). device "cpu" or "cuda" moves it there (NULL: the
 * run's device; a Hugging Face model's is a GPU when one answers). Prints the error as
 * "strata CMD: ..." and returns an exit code. */
int strata_open_model(const char *cmd, const char *what, const char *device, strata_opened_ckpt *o);
/* --device's value: cpu or cuda. --weights's: auto, device or host (a strata_weights_home,
 * launcher/infer.h). Each 0, or prints "strata CMD: OPT expects ..." and returns an exit code. */
int strata_parse_device(const char *cmd, const char *v);
int strata_parse_weights(const char *cmd, const char *v, int *home);

/* What export's and dump-grads' files share. */
/* The metadata safetensors readers need, and where it came from: "format": "pt",
 * "strata.checkpoint", "strata.step", "strata.arch", "strata.n_layer", ..., "strata.config"
 * (the YAML). */
void strata_st_out_checkpoint_meta(strata_st_out *w, const strata_opened_ckpt *o);
/* Declares the model's tensor ti (F32) as prefix + its Hugging Face name, with its real
 * rows: the embedding and an untied LM head lose their padding rows
 * (strata_model_real_rows). */
void strata_st_out_add_param(strata_st_out *w, const char *prefix, const strata_model *m, int ti);

int strata_cmd_train(int argc, char **argv, int rank, int world, int local_rank);
int strata_cmd_plan(int argc, char **argv);
int strata_cmd_sample(int argc, char **argv);
int strata_cmd_eval(int argc, char **argv);
int strata_cmd_chat(int argc, char **argv);

#endif
