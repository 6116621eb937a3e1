/* launcher/build.h: a rank's model, memory plan and engine made from a config, in one place
 * for every command that needs them (train, memory.auto's trials, plan, dump-grads; sample and
 * eval hold the weights alone, launcher/infer.h). */
#ifndef STRATA_BUILD_H
#define STRATA_BUILD_H

#include "core/arena.h"
#include "core/model.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "shard/comm.h"
#include "shard/engine.h"

/* The device backend cfg->device names ("cpu", "cuda" or "auto"), for strata_device_open. */
const char *strata_backend_name(const strata_config *cfg);

/* Makes rank `rank` of `world`'s model in *m, its memory plan in *arena (reserved, not yet
 * committed: the plan can be read and checked first) and its engine, handed the update tier
 * cfg->offload asks for. dev and comm may be NULL to plan without a device. */
strata_engine *strata_build(const strata_config *cfg, strata_device *dev, strata_comm *comm, int rank, int world,
                            strata_model *m, strata_arena *arena);
/* Undoes strata_build. */
void strata_unbuild(strata_engine *e, strata_arena *arena, strata_model *m);

/* One rank alone on cfg's device, a training engine holding a checkpoint: what dump-grads
 * runs the model with (it needs the gradients), and test_infer's oracle for infer.h. */
typedef struct strata_loaded {
    strata_device *dev;
    strata_comm *comm;
    strata_model m;
    strata_arena arena;
    strata_engine *engine;
} strata_loaded;
/* Opens the device, builds, commits the plan, loads ck and makes the parameters resident.
 * 0, or -1 with strata_error() set and nothing left open. */
int strata_load_model(strata_loaded *l, const strata_config *cfg, strata_ckpt *ck);
void strata_loaded_free(strata_loaded *l);

#endif
