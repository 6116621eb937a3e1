/* io/hf_config.c: the model shape a Hugging Face checkpoint declares: its config.json,
 * checked against what Strata computes, or for a lone .safetensors file the tensors'
 * shapes (io/hf_config.h). */
#include "io/hf_config.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/model.h"
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

/* ---- the Llama family ---- */

static const char *const llama_types[] = {"llama", "mistral", "qwen2", "qwen3", NULL};

/* A number key (absent: def), as a double; "must be a number" otherwise. */
static int number_key(const strata_json *r, const char *key, double def, const char *path, double *out) {
    const strata_json *v = strata_json_get(r, key);
    *out = def;
    if (!v || v->type == STRATA_JSON_NULL) return 0;
    if (v->type != STRATA_JSON_NUMBER) return strata_fail("%s: \"%s\" must be a number, got %s", path, key, strata_json_kind(v));
    *out = v->number;
    return 0;
}

/* A string key (absent or null: NULL). */
static int string_key(const strata_json *r, const char *key, const char *path, const char **out) {
    const strata_json *v = strata_json_get(r, key);
    *out = NULL;
    if (!v || v->type == STRATA_JSON_NULL) return 0;
    if (v->type != STRATA_JSON_STRING || strlen(v->str) != v->len)
        return strata_fail("%s: \"%s\" must be a string, got %s", path, key, strata_json_kind(v));
    *out = v->str;
    return 0;
}

/* A positive integer that may be absent or null (then def). */
static int optional_int(const strata_json *r, const char *key, int def, const char *path, int *out) {
    const strata_json *v = strata_json_get(r, key);
    *out = def;
    if (!v || v->type == STRATA_JSON_NULL) return 0;
    return positive_int(r, key, path, out) < 0 ? -1 : 0;
}

/* RoPE: transformers 5.x's "rope_parameters" {rope_type, rope_theta, ...}, or 4.x's
 * "rope_theta" and "rope_scaling" (null, or {"rope_type" (older: "type"), ...}). */
static int read_rope(const strata_json *r, const char *path, strata_hf_shape *s) {
    const strata_json *params = strata_json_get(r, "rope_parameters");
    const strata_json *scaling = NULL;
    const char *where = "rope_parameters";
    s->rope_theta = 10000.0;
    if (params && params->type != STRATA_JSON_NULL) {
        if (params->type != STRATA_JSON_OBJECT)
            return strata_fail("%s: \"rope_parameters\" must be an object, got %s", path, strata_json_kind(params));
        if (number_key(params, "rope_theta", 10000.0, path, &s->rope_theta)) return -1;
        scaling = params;
    } else {
        if (number_key(r, "rope_theta", 10000.0, path, &s->rope_theta)) return -1;
        scaling = strata_json_get(r, "rope_scaling");
        where = "rope_scaling";
        if (scaling && scaling->type == STRATA_JSON_NULL) scaling = NULL;
        if (scaling && scaling->type != STRATA_JSON_OBJECT)
            return strata_fail("%s: \"rope_scaling\" must be null or an object, got %s", path, strata_json_kind(scaling));
    }
    if (!(s->rope_theta > 0))
        return strata_fail("%s: \"rope_theta\" is %g; RoPE's base must be positive", path, s->rope_theta);
    s->rope_type = STRATA_ROPE_DEFAULT;
    double partial;
    if (number_key(r, "partial_rotary_factor", 1.0, path, &partial) ||
        (scaling && number_key(scaling, "partial_rotary_factor", partial, path, &partial)))
        return -1;
    if (partial != 1.0)
        return strata_fail("%s: \"partial_rotary_factor\" is %g; Strata's RoPE turns every dimension of a head", path,
                           partial);
    if (!scaling) return 0;
    const char *type = NULL;
    if (string_key(scaling, "rope_type", path, &type) || (!type && string_key(scaling, "type", path, &type))) return -1;
    if (!type || !strcmp(type, "default")) return 0;
    if (strcmp(type, "llama3"))
        return strata_fail("%s: %s's \"rope_type\" is \"%.40s\"; Strata computes RoPE's default frequencies and Llama "
                           "3.1's rescaling (\"llama3\") only", path, where, type);
    s->rope_type = STRATA_ROPE_LLAMA3;
    static const char *const keys[] = {"factor", "low_freq_factor", "high_freq_factor"};
    double *dst[] = {&s->rope_factor, &s->rope_low_freq_factor, &s->rope_high_freq_factor};
    for (int i = 0; i < 3; i++) {
        const strata_json *v = strata_json_get(scaling, keys[i]);
        if (!v) return strata_fail("%s: %s of rope_type llama3 has no \"%s\"", path, where, keys[i]);
        if (number_key(scaling, keys[i], 0, path, dst[i])) return -1;
        if (!(*dst[i] > 0)) return strata_fail("%s: %s's \"%s\" must be positive, got %g", path, where, keys[i], *dst[i]);
    }
    if (!strata_json_get(scaling, "original_max_position_embeddings"))
        return strata_fail("%s: %s of rope_type llama3 has no \"original_max_position_embeddings\"", path, where);
    if (positive_int(scaling, "original_max_position_embeddings", path, &s->rope_original_context) < 0) return -1;
    return 0;
}

/* The attention window: Mistral's sliding_window; Qwen2's and Qwen3's when
 * use_sliding_window is on (or layer_types names a sliding layer). 0: none. */
static int read_window(const strata_json *r, const char *path, strata_hf_shape *s) {
    int window = 0, use = 1;
    if (optional_int(r, "sliding_window", 0, path, &window)) return -1;
    if (strcmp(s->model_type, "mistral")) {
        if (bool_key(r, "use_sliding_window", 0, path, &use)) return -1;
        const strata_json *types = strata_json_get(r, "layer_types");
        for (size_t i = 0; types && types->type == STRATA_JSON_ARRAY && i < types->len; i++) {
            const strata_json *t = &types->items[i];
            if (t->type == STRATA_JSON_STRING && !strcmp(t->str, "sliding_attention")) use = 1;
        }
    }
    s->sliding_window = use ? window : 0;
    return 0;
}

/* Everything a Llama-family config.json says, and what Strata does not compute refused. */
static int read_llama(const strata_json *r, const char *path, strata_hf_shape *s) {
    static const char *const required[] = {"num_hidden_layers", "num_attention_heads", "hidden_size",
                                           "intermediate_size", "vocab_size", "max_position_embeddings"};
    int *dst[] = {&s->n_layer, &s->n_head, &s->n_embd, &s->intermediate_size, &s->vocab_size, &s->n_positions};
    for (int i = 0; i < 6; i++) {
        int rc = positive_int(r, required[i], path, dst[i]);
        if (rc < 0) return -1;
        if (rc > 0) return strata_fail("%s: missing \"%s\"", path, required[i]);
    }
    s->arch = STRATA_ARCH_LLAMA;
    if (optional_int(r, "num_key_value_heads", s->n_head, path, &s->n_kv_head) ||
        optional_int(r, "head_dim", 0, path, &s->head_dim))
        return -1;
    if (!s->head_dim) {
        if (s->n_embd % s->n_head)
            return strata_fail("%s: hidden_size (%d) is not a multiple of num_attention_heads (%d), and no \"head_dim\" "
                               "says the head size", path, s->n_embd, s->n_head);
        s->head_dim = s->n_embd / s->n_head;
    }
    const char *act = NULL;
    if (string_key(r, "hidden_act", path, &act)) return -1;
    if (act && strcmp(act, "silu"))
        return strata_fail("%s: \"hidden_act\" is \"%.40s\"; Strata's SwiGLU MLP computes silu only", path, act);
    if (number_key(r, "rms_norm_eps", 1e-6, path, &s->rms_norm_eps)) return -1;
    if (!(s->rms_norm_eps > 0 && s->rms_norm_eps < 1))
        return strata_fail("%s: \"rms_norm_eps\" is %g; it must be between 0 and 1", path, s->rms_norm_eps);
    if (bool_key(r, "tie_word_embeddings", 0, path, &s->tie_embeddings)) return -1;
    int attention_bias, mlp_bias;
    if (bool_key(r, "attention_bias", 0, path, &attention_bias) || bool_key(r, "mlp_bias", 0, path, &mlp_bias))
        return -1;
    if (attention_bias)
        return strata_fail("%s: \"attention_bias\" is true: %s adds biases to q, k, v and o_proj, and Strata computes "
                           "q/k/v biases (Qwen2's) without an o_proj bias", path, s->model_type);
    if (mlp_bias) return strata_fail("%s: \"mlp_bias\" is true; Strata's SwiGLU MLP has no biases", path);
    static const char *const moe[] = {"num_experts", "num_local_experts", "num_experts_per_tok", "moe_intermediate_size"};
    for (size_t i = 0; i < sizeof moe / sizeof moe[0]; i++) {
        const strata_json *v = strata_json_get(r, moe[i]);
        if (v && v->type != STRATA_JSON_NULL && !(v->type == STRATA_JSON_NUMBER && v->number == 0))
            return strata_fail("%s: \"%s\" says mixture-of-experts; Strata computes one dense MLP per block", path,
                               moe[i]);
    }
    s->qkv_bias = !strcmp(s->model_type, "qwen2"); /* Qwen2's q, k and v projections always have biases */
    s->qk_norm = !strcmp(s->model_type, "qwen3");  /* Qwen3 norms q and k per head, always */
    return read_rope(r, path, s) || read_window(r, path, s) ? -1 : 0;
}

int strata_hf_config_read(const char *path, strata_hf_shape *s) {
    memset(s, 0, sizeof *s);
    snprintf(s->source, sizeof s->source, "%s", path);
    strata_json_doc doc;
    if (strata_json_parse_file(&doc, path, MAX_CONFIG_BYTES)) return -1;
    const strata_json *r = &doc.root;
    int rc = -1;
    const strata_json *mt = r->type == STRATA_JSON_OBJECT ? strata_json_get(r, "model_type") : NULL;
    const char *type = mt && mt->type == STRATA_JSON_STRING ? mt->str : NULL;
    if (r->type != STRATA_JSON_OBJECT) {
        strata_fail("%s: expected a JSON object (a Hugging Face config.json), got %s", path, strata_json_kind(r));
    } else if (mt && (!type || strlen(type) != mt->len)) {
        strata_fail("%s: \"model_type\" must be a string, got %s", path, strata_json_kind(mt));
    } else if (!type || !strcmp(type, "gpt2")) {
        snprintf(s->model_type, sizeof s->model_type, "gpt2");
        s->arch = STRATA_ARCH_GPT2;
        s->tie_embeddings = 1;
        if (read_sizes(r, path, s) == 0 && check_math(r, path) == 0 && check_flags(r, path) == 0 &&
            check_inner(r, path, s) == 0)
            rc = 0;
    } else {
        int i = 0;
        while (llama_types[i] && strcmp(llama_types[i], type)) i++;
        if (!llama_types[i])
            strata_fail("%s: \"model_type\" is \"%.60s\"; Strata trains GPT-2 (\"gpt2\") and the Llama family (\"llama\", "
                        "\"mistral\", \"qwen2\", \"qwen3\")", path, type);
        else {
            snprintf(s->model_type, sizeof s->model_type, "%s", type);
            rc = read_llama(r, path, s);
        }
    }
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
        if (strstr(t->name, "embed_tokens.weight")) {
            strata_safetensors_close(&st);
            return strata_fail("model.init_from '%s': a Llama-family model's RoPE and norm settings are in no tensor: "
                               "put its config.json beside it (or name the model's directory)", path);
        }
        const char *n = !strncmp(t->name, PREFIX, strlen(PREFIX)) ? t->name + strlen(PREFIX) : t->name;
        if (!strcmp(n, "wte.weight") && t->ndim == 2) s->vocab_size = (int)t->shape[0], s->n_embd = (int)t->shape[1];
        else if (!strcmp(n, "wpe.weight") && t->ndim == 2) s->n_positions = (int)t->shape[0];
        else if (!strncmp(n, "h.", 2)) {
            int l = atoi(n + 2);
            if (l > max_layer) max_layer = l;
        }
    }
    s->n_layer = max_layer + 1;
    s->arch = STRATA_ARCH_GPT2;
    s->tie_embeddings = 1;
    snprintf(s->model_type, sizeof s->model_type, "gpt2");
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

