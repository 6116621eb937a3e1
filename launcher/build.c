/* launcher/build.c: a rank's model, memory plan and engine made from a config. */
#include "launcher/build.h"

#include <string.h>

#include "core/common.h"
#include "offload/pipeline.h"

const char *strata_backend_name(const strata_config *cfg) {
    return cfg->device == STRATA_BACKEND_CUDA ? "cuda" : cfg->device == STRATA_BACKEND_CPU ? "cpu" : "auto";
}

strata_engine *strata_build(const strata_config *cfg, strata_device *dev, strata_comm *comm, int rank, int world,
                            strata_model *m, strata_arena *arena) {
    strata_model_shape shape = strata_config_model_shape(cfg);
    strata_model_init(m, &shape);
    strata_arena_init(arena, dev);
    return strata_engine_create(cfg, m, arena, dev, comm, strata_offload_tier(cfg, dev, rank), rank, world);
}

void strata_unbuild(strata_engine *e, strata_arena *arena, strata_model *m) {
    strata_engine_destroy(e);
    strata_arena_release(arena);
    strata_model_free(m);
}

int strata_load_model(strata_loaded *l, const strata_config *cfg, strata_ckpt *ck) {
    memset(l, 0, sizeof *l);
    l->dev = strata_device_open(strata_backend_name(cfg), 0);
    if (!l->dev) return -1;
    l->comm = strata_comm_open_local(l->dev);
    l->engine = strata_build(cfg, l->dev, l->comm, 0, 1, &l->m, &l->arena);
    if (strata_arena_commit(&l->arena) || strata_engine_load(l->engine, ck) || strata_engine_params_resident(l->engine)) {
        char err[1024];
        snprintf(err, sizeof err, "%s", strata_error());
        strata_loaded_free(l);
        return strata_fail("%s", err);
    }
    return 0;
}

void strata_loaded_free(strata_loaded *l) {
    if (l->engine) strata_unbuild(l->engine, &l->arena, &l->m);
    if (l->comm) strata_comm_close(l->comm);
    if (l->dev) strata_device_close(l->dev);
    memset(l, 0, sizeof *l);
}
