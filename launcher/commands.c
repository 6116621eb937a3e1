/* launcher/commands.c: what the subcommands share (launcher/commands.h): opening the
 * checkpoint sample, eval, export and dump-grads read (or the Hugging Face model sample and
 * eval may read instead), and what export's and dump-grads' safetensors files carry. */
#include "launcher/commands.h"

#include <stdio.h>
#include <string.h>

#include "core/common.h"
#include "io/files.h"

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
    const char *yaml = strata_ckpt_get_meta(o->ck)->config_yaml;
    if (strata_config_load_string(&o->cfg, name, yaml, all, n_all)) {
        fprintf(stderr, "strata %s: %s\n", cmd, strata_error());
        strata_ckpt_close(o->ck);
        o->ck = NULL;
        return STRATA_EXIT_ERROR;
    }
    /* an override may change how the run computes, never what the weights mean (a head
     * count changes no tensor's shape, so nothing else would notice) */
    strata_config saved;
    if (n_sets > 0 && (strata_config_load_string(&saved, name, yaml, all + n_all - 1, 1) ||
                       strata_config_check_same_model(&saved, o->dir, &o->cfg))) {
        fprintf(stderr, "strata %s: --set: %s\n", cmd, strata_error());
        strata_ckpt_close(o->ck);
        o->ck = NULL;
        return STRATA_EXIT_USAGE;
    }
    return STRATA_EXIT_OK;
}

/* A Hugging Face model rather than a checkpoint or a run: a .safetensors file, or a
 * directory with config.json that has neither manifest.yaml nor ckpt/. */
static int is_hf_model(const char *what) {
    size_t n = strlen(what);
    if (n > 12 && !strcmp(what + n - 12, ".safetensors")) return strata_is_file(what);
    char p[STRATA_PATH_MAX + 32];
    snprintf(p, sizeof p, "%s/config.json", what);
    if (!strata_is_dir(what) || !strata_is_file(p)) return 0;
    snprintf(p, sizeof p, "%s/manifest.yaml", what);
    if (strata_is_file(p)) return 0;
    snprintf(p, sizeof p, "%s/ckpt", what);
    return !strata_is_dir(p);
}

/* A Hugging Face model's config: the shape its config.json gives (model.init_from), on a GPU
 * when one answers unless sets say otherwise. Prints the error; returns an exit code. */
static int open_hf(const char *cmd, const char *what, const char *const *sets, int n_sets, strata_opened_ckpt *o) {
    memset(o, 0, sizeof *o);
    snprintf(o->dir, sizeof o->dir, "%s", what);
    char init_from[STRATA_PATH_MAX + 32];
    snprintf(init_from, sizeof init_from, "model.init_from=%s", what);
    const char *all[8] = {init_from};
    int n = 1;
    for (int i = 0; i < n_sets && n < 8; i++) all[n++] = sets[i];
    if (strata_config_load_string(&o->cfg, what, "data: {train: none}\ntrain: {steps: 1}\n", all, n)) {
        fprintf(stderr, "strata %s: %s\n", cmd, strata_error());
        return STRATA_EXIT_USAGE;
    }
    return 0;
}

int strata_open_model(const char *cmd, const char *what, const char *device, strata_opened_ckpt *o) {
    /* the dtype the device's, and the collectives (none run) as that device's */
    char device_set[32];
    snprintf(device_set, sizeof device_set, "device=%s", device ? device : "");
    const char *sets[] = {device_set, "train.dtype=auto", "comm.backend=auto"};
    int n = device ? 3 : 0;
    return is_hf_model(what) ? open_hf(cmd, what, sets, n, o) : strata_open_checkpoint(cmd, what, sets, n, o);
}

int strata_parse_device(const char *cmd, const char *v) {
    if (!strcmp(v, "cpu") || !strcmp(v, "cuda")) return 0;
    fprintf(stderr, "strata %s: --device expects cpu or cuda, got '%s'\n", cmd, v);
    return STRATA_EXIT_USAGE;
}

int strata_parse_weights(const char *cmd, const char *v, int *home) {
    static const char *const names[] = {"auto", "device", "host"}; /* strata_weights_home's order */
    for (int i = 0; i < 3; i++)
        if (!strcmp(v, names[i])) {
            *home = i;
            return 0;
        }
    fprintf(stderr, "strata %s: --weights expects auto, device or host, got '%s'\n", cmd, v);
    return STRATA_EXIT_USAGE;
}

void strata_st_out_checkpoint_meta(strata_st_out *w, const strata_opened_ckpt *o) {
    const strata_config *c = &o->cfg;
    const strata_ckpt_meta *meta = strata_ckpt_get_meta(o->ck);
    strata_st_out_meta(w, "format", "pt");
    strata_st_out_meta(w, "strata.checkpoint", o->dir);
    strata_st_out_meta_int(w, "strata.step", (long long)meta->step);
    strata_st_out_meta(w, "strata.arch", c->model.arch == STRATA_ARCH_LLAMA ? "llama" : "gpt2");
    strata_st_out_meta_int(w, "strata.n_layer", c->model.n_layer);
    strata_st_out_meta_int(w, "strata.n_head", c->model.n_head);
    strata_st_out_meta_int(w, "strata.n_embd", c->model.n_embd);
    strata_st_out_meta_int(w, "strata.n_positions", c->model.seq_len);
    strata_st_out_meta_int(w, "strata.vocab_size", c->model.vocab_size);
    strata_st_out_meta_int(w, "strata.padded_vocab_size", strata_config_padded_vocab(c));
    strata_st_out_meta(w, "strata.config", meta->config_yaml);
}

void strata_st_out_add_param(strata_st_out *w, const char *prefix, const strata_model *m, int ti) {
    const strata_param_tensor *t = &m->tensors[ti];
    char name[sizeof w->t[0].name];
    snprintf(name, sizeof name, "%s%s", prefix, t->name);
    strata_st_out_add(w, name, "F32", t->ndim, strata_model_real_rows(m, ti), t->ndim > 1 ? t->shape[1] : 0, 0);
}
