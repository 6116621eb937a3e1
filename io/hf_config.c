/* io/hf_config.c: the model shape a Hugging Face checkpoint declares: its config.json,
 * checked against what Strata computes, or for a lone .safetensors file the tensors'
 * shapes (io/hf_config.h). */
#include "io/hf_config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "io/files.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "io/text.h"

#define MAX_CONFIG_BYTES ((size_t)1 << 20) /* config.json: a few dozen keys */
#define PREFIX "transformer."

/* ---- config.json ---- */

static int positive_int(const strata_json *root, const char *key, const char *path, int *out) {
    const strata_json *v = strata_json_get(root, key);
    if (!v) return 1; /* absent */
    if (v->type != STRATA_JSON_NUMBER || !v->is_int || v->integer < 1 || v->integer > (1 << 30))
        return strata_fail("%s: \"%s\" must be a positive integer, got %s", path, key, strata_json_kind(v));
    *out = (int)v->integer;
    return 0;
}

static int bool_key(const strata_json *root, const char *key, int def, const char *path, int *out) {
    const strata_json *v = strata_json_get(root, key);
    *out = def;
    if (!v) return 0;
    if (v->type != STRATA_JSON_BOOL) return strata_fail("%s: \"%s\" must be true or false, got %s", path, key, strata_json_kind(v));
    *out = v->boolean;
    return 0;
}

/* "model_type", where given, is "gpt2". */
static int check_model_type(const strata_json *r, const char *path) {
    const strata_json *v = strata_json_get(r, "model_type");
    if (v && (v->type != STRATA_JSON_STRING || strcmp(v->str, "gpt2")))
        return strata_fail("%s: \"model_type\" is %s%.60s%s; Strata trains GPT-2 (\"gpt2\") models", path,
                           v->type == STRATA_JSON_STRING ? "\"" : "",
                           v->type == STRATA_JSON_STRING ? v->str : strata_json_kind(v),
                           v->type == STRATA_JSON_STRING ? "\"" : "");
    return 0;
}

/* The sizes into s: n_layer, n_head, n_embd, vocab_size, and n_positions (or the older
 * n_ctx), all required. */
static int read_sizes(const strata_json *r, const char *path, strata_hf_shape *s) {
    static const char *const required[] = {"n_layer", "n_head", "n_embd", "vocab_size"};
    int *dst[] = {&s->n_layer, &s->n_head, &s->n_embd, &s->vocab_size};
    for (int i = 0; i < 4; i++) {
        int r_ = positive_int(r, required[i], path, dst[i]);
        if (r_ < 0) return -1;
        if (r_ > 0) return strata_fail("%s: missing \"%s\"", path, required[i]);
    }
    int p = positive_int(r, "n_positions", path, &s->n_positions);
    if (p < 0 || (p > 0 && positive_int(r, "n_ctx", path, &s->n_positions) != 0)) {
        if (p > 0) strata_fail("%s: missing \"n_positions\" (or the older \"n_ctx\")", path);
        return -1;
    }
    return 0;
}

/* The activation and the layer norm's epsilon, where given, are what Strata computes. */
static int check_math(const strata_json *r, const char *path) {
    const strata_json *v;
    if ((v = strata_json_get(r, "activation_function"))) {
        if (v->type != STRATA_JSON_STRING ||
            (strcmp(v->str, "gelu_new") && strcmp(v->str, "gelu_pytorch_tanh") && strcmp(v->str, "gelu_fast")))
            return strata_fail("%s: \"activation_function\" is %s%.60s%s; Strata computes GPT-2's tanh GELU "
                               "(gelu_new, gelu_pytorch_tanh, gelu_fast) only", path,
                               v->type == STRATA_JSON_STRING ? "\"" : "",
                               v->type == STRATA_JSON_STRING ? v->str : strata_json_kind(v),
                               v->type == STRATA_JSON_STRING ? "\"" : "");
    }
    if ((v = strata_json_get(r, "layer_norm_epsilon"))) {
        if (v->type != STRATA_JSON_NUMBER || fabs(v->number - 1e-5) > 1e-12) {
            char got[64];
            if (v->type == STRATA_JSON_NUMBER) snprintf(got, sizeof got, "%g", v->number);
            else snprintf(got, sizeof got, "%s", strata_json_kind(v));
            return strata_fail("%s: \"layer_norm_epsilon\" is %s; Strata's layer norm uses 1e-05", path, got);
        }
    }
    return 0;
}

/* The architecture flags, where given, have GPT-2's values: a tied LM head, no
 * cross-attention, attention scaled by 1/sqrt(head size) and not by layer. */
static int check_flags(const strata_json *r, const char *path) {
    int tie, cross, scale, inv_idx;
    if (bool_key(r, "tie_word_embeddings", 1, path, &tie) || bool_key(r, "add_cross_attention", 0, path, &cross) ||
        bool_key(r, "scale_attn_weights", 1, path, &scale) ||
        bool_key(r, "scale_attn_by_inverse_layer_idx", 0, path, &inv_idx))
        return -1;
    if (!tie)
        return strata_fail("%s: \"tie_word_embeddings\" is false; Strata's LM head is tied to the token embedding",
                           path);
    if (cross) return strata_fail("%s: \"add_cross_attention\" is true; Strata's GPT-2 has no cross-attention", path);
    if (!scale)
        return strata_fail("%s: \"scale_attn_weights\" is false; Strata scales attention by 1/sqrt(head size)", path);
    if (inv_idx)
        return strata_fail("%s: \"scale_attn_by_inverse_layer_idx\" is true; Strata does not scale attention by "
                           "layer", path);
    return 0;
}

/* "n_inner", where given, is null or 4 * n_embd. */
static int check_inner(const strata_json *r, const char *path, const strata_hf_shape *s) {
    const strata_json *v = strata_json_get(r, "n_inner");
    if (v && v->type != STRATA_JSON_NULL &&
        !(v->type == STRATA_JSON_NUMBER && v->is_int && v->integer == 4ll * s->n_embd))
        return strata_fail("%s: \"n_inner\" must be null or 4 * n_embd (%d); Strata's MLP is 4 * n_embd wide", path,
                           4 * s->n_embd);
    return 0;
}

int strata_hf_config_read(const char *path, strata_hf_shape *s) {
    memset(s, 0, sizeof *s);
    snprintf(s->source, sizeof s->source, "%s", path);
    strata_json_doc doc;
    if (strata_json_parse_file(&doc, path, MAX_CONFIG_BYTES)) return -1;
    const strata_json *r = &doc.root;
    int rc = -1;
    if (r->type != STRATA_JSON_OBJECT)
        strata_fail("%s: expected a JSON object (a Hugging Face config.json), got %s", path, strata_json_kind(r));
    else if (check_model_type(r, path) == 0 && read_sizes(r, path, s) == 0 && check_math(r, path) == 0 &&
             check_flags(r, path) == 0 && check_inner(r, path, s) == 0)
        rc = 0;
    strata_json_free(&doc);
    return rc;
}

/* ---- the shape ---- */

/* The shape a lone .safetensors file implies: everything but n_head from its tensors. */
static int shape_from_tensors(const char *path, strata_hf_shape *s) {
    strata_safetensors st;
    if (strata_safetensors_open(&st, path)) return -1;
    memset(s, 0, sizeof *s);
    snprintf(s->source, sizeof s->source, "%s (tensor shapes)", path);
    int max_layer = -1;
    for (int i = 0; i < st.n_tensors; i++) {
        const strata_st_tensor *t = &st.tensors[i];
        const char *n = !strncmp(t->name, PREFIX, strlen(PREFIX)) ? t->name + strlen(PREFIX) : t->name;
        if (!strcmp(n, "wte.weight") && t->ndim == 2) s->vocab_size = (int)t->shape[0], s->n_embd = (int)t->shape[1];
        else if (!strcmp(n, "wpe.weight") && t->ndim == 2) s->n_positions = (int)t->shape[0];
        else if (!strncmp(n, "h.", 2)) {
            int l = atoi(n + 2);
            if (l > max_layer) max_layer = l;
        }
    }
    s->n_layer = max_layer + 1;
    const char *nh = strata_safetensors_meta(&st, "strata.n_head");
    if (nh) s->n_head = atoi(nh);
    strata_safetensors_close(&st);
    return 0;
}

int strata_hf_shape_read(const char *init_from, strata_hf_shape *s) {
    char cfg[STRATA_PATH_MAX];
    if (strata_is_dir(init_from)) {
        if (strata_path_join(cfg, sizeof cfg, init_from, "config.json")) return strata_fail_wrap("model.init_from");
        if (!strata_is_file(cfg))
            return strata_fail("model.init_from '%s': the directory has no config.json (a Hugging Face model "
                               "directory holds config.json and model.safetensors)", init_from);
        return strata_hf_config_read(cfg, s);
    }
    if (!strata_is_file(init_from)) return strata_fail("model.init_from '%s': no such file or directory", init_from);
    char dir[STRATA_PATH_MAX];
    strata_path_dir(dir, sizeof dir, init_from);
    if (strata_path_join(cfg, sizeof cfg, dir, "config.json")) return strata_fail_wrap("model.init_from");
    if (strata_is_file(cfg)) return strata_hf_config_read(cfg, s);
    return shape_from_tensors(init_from, s);
}

