/* core/pretrained.c: Hugging Face GPT-2 config.json and weights (one safetensors file or
 * a sharded directory) read into the model's units by element range. See
 * core/pretrained.h for what is accepted and refused. */
#include "core/pretrained.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "core/common.h"
#include "core/json.h"
#include "core/safetensors.h"

#define MAX_CONFIG_BYTES ((size_t)1 << 20) /* config.json: a few dozen keys */
#define MAX_INDEX_BYTES ((size_t)16 << 20) /* model.safetensors.index.json: a line per tensor */
#define PREFIX "transformer."

static int is_dir(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISDIR(sb.st_mode);
}

static int is_file(const char *path) {
    struct stat sb;
    return stat(path, &sb) == 0 && S_ISREG(sb.st_mode);
}

/* dir/file into out; a path too long for it becomes "" (which then fails to open). */
static void join(char *out, size_t n, const char *dir, const char *file) {
    size_t dl = strlen(dir);
    if ((size_t)snprintf(out, n, "%s%s%s", dir, dl && dir[dl - 1] == '/' ? "" : "/", file) >= n) out[0] = 0;
}

/* The directory holding `path` (a file), "." when it has none. */
static void dir_of(char *out, size_t n, const char *path) {
    const char *slash = strrchr(path, '/');
    if (!slash) snprintf(out, n, ".");
    else if (slash == path) snprintf(out, n, "/");
    else snprintf(out, n, "%.*s", (int)(slash - path), path);
}

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

int strata_hf_config_read(const char *path, strata_hf_shape *s) {
    memset(s, 0, sizeof *s);
    snprintf(s->source, sizeof s->source, "%s", path);
    strata_json_doc doc;
    if (strata_json_parse_file(&doc, path, MAX_CONFIG_BYTES)) return -1;
    const strata_json *r = &doc.root;
    int rc = -1;
    const strata_json *v;
    if (r->type != STRATA_JSON_OBJECT) {
        strata_fail("%s: expected a JSON object (a Hugging Face config.json), got %s", path, strata_json_kind(r));
        goto done;
    }
    if ((v = strata_json_get(r, "model_type")) && (v->type != STRATA_JSON_STRING || strcmp(v->str, "gpt2"))) {
        strata_fail("%s: \"model_type\" is %s%.60s%s; Strata trains GPT-2 (\"gpt2\") models", path,
                    v->type == STRATA_JSON_STRING ? "\"" : "", v->type == STRATA_JSON_STRING ? v->str : strata_json_kind(v),
                    v->type == STRATA_JSON_STRING ? "\"" : "");
        goto done;
    }
    static const char *const required[] = {"n_layer", "n_head", "n_embd", "vocab_size"};
    int *dst[] = {&s->n_layer, &s->n_head, &s->n_embd, &s->vocab_size};
    for (int i = 0; i < 4; i++) {
        int r_ = positive_int(r, required[i], path, dst[i]);
        if (r_ < 0) goto done;
        if (r_ > 0) {
            strata_fail("%s: missing \"%s\"", path, required[i]);
            goto done;
        }
    }
    int p = positive_int(r, "n_positions", path, &s->n_positions);
    if (p < 0 || (p > 0 && positive_int(r, "n_ctx", path, &s->n_positions) != 0)) {
        if (p > 0) strata_fail("%s: missing \"n_positions\" (or the older \"n_ctx\")", path);
        goto done;
    }
    if ((v = strata_json_get(r, "activation_function"))) {
        if (v->type != STRATA_JSON_STRING ||
            (strcmp(v->str, "gelu_new") && strcmp(v->str, "gelu_pytorch_tanh") && strcmp(v->str, "gelu_fast"))) {
            strata_fail("%s: \"activation_function\" is %s%.60s%s; Strata computes GPT-2's tanh GELU (gelu_new, "
                        "gelu_pytorch_tanh, gelu_fast) only", path, v->type == STRATA_JSON_STRING ? "\"" : "",
                        v->type == STRATA_JSON_STRING ? v->str : strata_json_kind(v), v->type == STRATA_JSON_STRING ? "\"" : "");
            goto done;
        }
    }
    if ((v = strata_json_get(r, "layer_norm_epsilon"))) {
        if (v->type != STRATA_JSON_NUMBER || fabs(v->number - 1e-5) > 1e-12) {
            char got[64];
            if (v->type == STRATA_JSON_NUMBER) snprintf(got, sizeof got, "%g", v->number);
            else snprintf(got, sizeof got, "%s", strata_json_kind(v));
            strata_fail("%s: \"layer_norm_epsilon\" is %s; Strata's layer norm uses 1e-05", path, got);
            goto done;
        }
    }
    int tie, cross, scale, inv_idx;
    if (bool_key(r, "tie_word_embeddings", 1, path, &tie) || bool_key(r, "add_cross_attention", 0, path, &cross) ||
        bool_key(r, "scale_attn_weights", 1, path, &scale) ||
        bool_key(r, "scale_attn_by_inverse_layer_idx", 0, path, &inv_idx))
        goto done;
    if (!tie) {
        strata_fail("%s: \"tie_word_embeddings\" is false; Strata's LM head is tied to the token embedding", path);
        goto done;
    }
    if (cross) {
        strata_fail("%s: \"add_cross_attention\" is true; Strata's GPT-2 has no cross-attention", path);
        goto done;
    }
    if (!scale) {
        strata_fail("%s: \"scale_attn_weights\" is false; Strata scales attention by 1/sqrt(head size)", path);
        goto done;
    }
    if (inv_idx) {
        strata_fail("%s: \"scale_attn_by_inverse_layer_idx\" is true; Strata does not scale attention by layer", path);
        goto done;
    }
    if ((v = strata_json_get(r, "n_inner")) && v->type != STRATA_JSON_NULL &&
        !(v->type == STRATA_JSON_NUMBER && v->is_int && v->integer == 4ll * s->n_embd)) {
        strata_fail("%s: \"n_inner\" must be null or 4 * n_embd (%d); Strata's MLP is 4 * n_embd wide", path,
                    4 * s->n_embd);
        goto done;
    }
    rc = 0;
done:
    strata_json_free(&doc);
    return rc;
}

/* ---- where the files are ---- */

/* Fills `files` (n_files) with the safetensors files of init_from. */
typedef struct file_list {
    char (*path)[STRATA_PATH_MAX];
    int n;
    char index[STRATA_PATH_MAX]; /* the index file, "" without one */
} file_list;

static void file_list_free(file_list *f) {
    free(f->path);
    memset(f, 0, sizeof *f);
}

static int add_file(file_list *f, const char *path) {
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->path[i], path)) return 0;
    f->path = strata_xrealloc(f->path, (size_t)(f->n + 1) * sizeof *f->path);
    snprintf(f->path[f->n++], STRATA_PATH_MAX, "%s", path);
    return 0;
}

static int list_files(const char *init_from, file_list *f, strata_json_doc *index) {
    memset(f, 0, sizeof *f);
    memset(index, 0, sizeof *index);
    if (!is_dir(init_from)) {
        if (!is_file(init_from))
            return strata_fail("model.init_from '%s': no such file or directory", init_from);
        return add_file(f, init_from);
    }
    char p[STRATA_PATH_MAX];
    join(f->index, sizeof f->index, init_from, "model.safetensors.index.json");
    if (is_file(f->index)) {
        if (strata_json_parse_file(index, f->index, MAX_INDEX_BYTES)) return -1;
        const strata_json *map = strata_json_get(&index->root, "weight_map");
        if (!map || map->type != STRATA_JSON_OBJECT)
            return strata_fail("%s: expected an object with \"weight_map\": {tensor name: file name}", f->index);
        for (size_t i = 0; i < map->len; i++) {
            const strata_json_member *m = &map->members[i];
            const char *file = m->value.type == STRATA_JSON_STRING ? m->value.str : NULL;
            /* a file name inside the directory: no path separators, no way out of it */
            if (!file || !file[0] || strchr(file, '/') || !strcmp(file, ".") || !strcmp(file, "..") ||
                strlen(file) != m->value.len)
                return strata_fail("%s: weight_map \"%s\" must name a file in the same directory, got %s%.80s%s",
                                   f->index, m->key, file ? "'" : "", file ? file : strata_json_kind(&m->value),
                                   file ? "'" : "");
            join(p, sizeof p, init_from, file);
            add_file(f, p);
        }
        if (!f->n) return strata_fail("%s: weight_map lists no tensors", f->index);
        return 0;
    }
    f->index[0] = 0;
    join(p, sizeof p, init_from, "model.safetensors");
    if (is_file(p)) return add_file(f, p);
    char bin[STRATA_PATH_MAX];
    join(bin, sizeof bin, init_from, "pytorch_model.bin");
    if (is_file(bin))
        return strata_fail("model.init_from '%s' holds pytorch_model.bin; Strata reads safetensors only: convert it "
                           "with transformers (model = AutoModelForCausalLM.from_pretrained(DIR); "
                           "model.save_pretrained(DIR2, safe_serialization=True))", init_from);
    return strata_fail("model.init_from '%s': found neither model.safetensors nor model.safetensors.index.json in "
                       "the directory", init_from);
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

int strata_pretrained_shape(const char *init_from, strata_hf_shape *s) {
    char cfg[STRATA_PATH_MAX];
    if (is_dir(init_from)) {
        join(cfg, sizeof cfg, init_from, "config.json");
        if (!is_file(cfg))
            return strata_fail("model.init_from '%s': the directory has no config.json (a Hugging Face model "
                               "directory holds config.json and model.safetensors)", init_from);
        return strata_hf_config_read(cfg, s);
    }
    if (!is_file(init_from)) return strata_fail("model.init_from '%s': no such file or directory", init_from);
    char dir[STRATA_PATH_MAX];
    dir_of(dir, sizeof dir, init_from);
    join(cfg, sizeof cfg, dir, "config.json");
    if (is_file(cfg)) return strata_hf_config_read(cfg, s);
    return shape_from_tensors(init_from, s);
}

int strata_pretrained_apply_shape(strata_config *c, const int set[5], const char *name) {
    strata_hf_shape s;
    if (strata_pretrained_shape(c->model.init_from, &s)) return strata_fail_wrap("%s", name);
    int *yaml[5] = {&c->model.n_layer, &c->model.n_head, &c->model.n_embd, &c->model.seq_len, &c->model.vocab_size};
    const int hf[5] = {s.n_layer, s.n_head, s.n_embd, s.n_positions, s.vocab_size};
    static const char *const keys[5] = {"n_layer", "n_head", "n_embd", "seq_len", "vocab_size"};
    static const char *const hf_keys[5] = {"n_layer", "n_head", "n_embd", "n_positions", "vocab_size"};
    for (int i = 0; i < 5; i++) {
        if (hf[i] <= 0) {
            if (!set[i])
                return strata_fail("%s: missing required key 'model.%s' (model.init_from %s does not give %s)", name,
                                   keys[i], s.source, hf_keys[i]);
            continue;
        }
        if (!set[i]) *yaml[i] = hf[i];
        else if (*yaml[i] != hf[i])
            return strata_fail("%s: model.%s is %d, but model.init_from's %s has %s %d (leave model.%s out to take "
                               "it from there)", name, keys[i], *yaml[i], s.source, hf_keys[i], hf[i], keys[i]);
    }
    return 0;
}

/* ---- the weights ---- */

struct strata_pretrained {
    char init_from[STRATA_PATH_MAX];
    int n_files;
    strata_safetensors *files;
    int n_model;                     /* the model's tensors */
    const strata_st_tensor **src;    /* per model tensor: where it is */
    int *src_file;
    const strata_st_tensor *lm_head; /* NULL when absent */
    int lm_head_file;
    size_t v_rows;                   /* real vocabulary rows of wte */
    size_t elements_read;            /* from the files, by this process */
    char desc[256];
};

void strata_pretrained_close(strata_pretrained *p) {
    if (!p) return;
    for (int i = 0; i < p->n_files; i++) strata_safetensors_close(&p->files[i]);
    free(p->files);
    free(p->src);
    free(p->src_file);
    free(p);
}

const char *strata_pretrained_describe(const strata_pretrained *p) { return p->desc; }
size_t strata_pretrained_elements_read(const strata_pretrained *p) { return p->elements_read; }

/* "h.3.attn.bias" / "h.3.attn.masked_bias": the causal-mask buffers old files carry. */
static int is_mask_buffer(const char *n) {
    if (strncmp(n, "h.", 2)) return 0;
    const char *dot = strchr(n + 2, '.');
    return dot && (!strcmp(dot, ".attn.bias") || !strcmp(dot, ".attn.masked_bias"));
}

static const char *bare(const char *name) {
    return !strncmp(name, PREFIX, strlen(PREFIX)) ? name + strlen(PREFIX) : name;
}

static void fmt_shape(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t o = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && o < n; i++) o += (size_t)snprintf(buf + o, n - o, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

strata_pretrained *strata_pretrained_open(const char *init_from, const strata_model *m) {
    file_list fl;
    strata_json_doc index;
    if (list_files(init_from, &fl, &index)) {
        file_list_free(&fl);
        strata_json_free(&index);
        return NULL;
    }
    strata_pretrained *p = strata_xcalloc(1, sizeof *p);
    snprintf(p->init_from, sizeof p->init_from, "%s", init_from);
    p->files = strata_xcalloc((size_t)fl.n, sizeof *p->files);
    p->n_model = m->n_tensors;
    p->src = strata_xcalloc((size_t)m->n_tensors, sizeof *p->src);
    p->src_file = strata_xcalloc((size_t)m->n_tensors, sizeof *p->src_file);
    p->v_rows = (size_t)m->shape.vocab_size;
    int bad = 0;
    for (int f = 0; f < fl.n && !bad; f++) {
        if (strata_safetensors_open(&p->files[f], fl.path[f])) {
            bad = -1;
            break;
        }
        p->n_files++;
        const strata_safetensors *st = &p->files[f];
        for (int i = 0; i < st->n_tensors && !bad; i++) {
            const strata_st_tensor *t = &st->tensors[i];
            const char *n = bare(t->name);
            if (is_mask_buffer(n)) continue;
            if (!strcmp(t->name, "lm_head.weight")) {
                if (p->lm_head) {
                    bad = strata_fail("lm_head.weight is in both %s and %s", p->files[p->lm_head_file].path, st->path);
                    break;
                }
                p->lm_head = t;
                p->lm_head_file = f;
                continue;
            }
            int k = -1;
            for (int j = 0; j < m->n_tensors; j++)
                if (!strcmp(bare(m->tensors[j].name), n)) k = j;
            if (k < 0) {
                bad = strata_fail("%s: tensor \"%s\" is not a parameter of Strata's GPT-2 with %d layers (is the file "
                                 "a GPT-2 model of this shape?)", st->path, t->name, m->shape.n_layer);
                break;
            }
            if (p->src[k]) {
                bad = strata_fail("tensor %s is in the weights twice: \"%s\" in %s and \"%s\" in %s", m->tensors[k].name,
                                 p->src[k]->name, p->files[p->src_file[k]].path, t->name, st->path);
                break;
            }
            p->src[k] = t;
            p->src_file[k] = f;
        }
    }
    /* every tensor the index promises is in the file it names */
    const strata_json *map = !bad && fl.index[0] ? strata_json_get(&index.root, "weight_map") : NULL;
    for (size_t i = 0; map && i < map->len && !bad; i++) {
        const strata_json_member *e = &map->members[i];
        char path[STRATA_PATH_MAX];
        join(path, sizeof path, init_from, e->value.str);
        for (int f = 0; f < p->n_files; f++)
            if (!strcmp(p->files[f].path, path) && !strata_safetensors_find(&p->files[f], e->key))
                bad = strata_fail("%s: weight_map puts \"%s\" in %s, which has no such tensor", fl.index, e->key, path);
    }
    for (int k = 0; k < m->n_tensors && !bad; k++) {
        const strata_ckpt_tensor *mt = &m->tensors[k];
        const strata_st_tensor *t = p->src[k];
        if (!t) {
            bad = strata_fail("model.init_from '%s': no tensor %s (or %s)", init_from, mt->name, bare(mt->name));
            break;
        }
        int64_t want[2] = {mt->shape[0], mt->shape[1]};
        if (k == 0) want[0] = m->shape.vocab_size; /* wte: the file has V rows, Strata pads to Vp */
        int same = t->ndim == mt->ndim;
        for (int d = 0; same && d < mt->ndim; d++) same = t->shape[d] == want[d];
        if (!same) {
            char a[96], b[96];
            fmt_shape(a, sizeof a, t->ndim, t->shape);
            fmt_shape(b, sizeof b, mt->ndim, want);
            bad = strata_fail("%s: tensor \"%s\" has shape %s, but the model needs %s", p->files[p->src_file[k]].path,
                             t->name, a, b);
            break;
        }
        if (t->dtype != STRATA_ST_F32 && t->dtype != STRATA_ST_F16 && t->dtype != STRATA_ST_BF16 &&
            t->dtype != STRATA_ST_F64) {
            bad = strata_fail("%s: tensor \"%s\" has dtype %s; Strata reads weights stored as F32, F16, BF16 or F64",
                             p->files[p->src_file[k]].path, t->name, strata_st_dtype_name(t->dtype));
            break;
        }
    }
    if (!bad && p->lm_head) {
        const strata_st_tensor *w = p->src[0];
        if (p->lm_head->ndim != 2 || p->lm_head->shape[0] != w->shape[0] || p->lm_head->shape[1] != w->shape[1])
            bad = strata_fail("%s: lm_head.weight's shape differs from %s's; Strata's LM head is tied to the token "
                             "embedding", p->files[p->lm_head_file].path, w->name);
    }
    if (!bad) {
        const char *dt = strata_st_dtype_name(p->src[0]->dtype);
        int mixed = 0;
        for (int k = 1; k < m->n_tensors; k++) mixed |= p->src[k]->dtype != p->src[0]->dtype;
        snprintf(p->desc, sizeof p->desc, "%d tensors in %d file%s%s, %s%s", m->n_tensors, p->n_files,
                 p->n_files == 1 ? "" : "s", fl.index[0] ? " (sharded, with an index)" : "", mixed ? "mixed dtypes" : dt,
                 p->lm_head ? ", lm_head.weight tied" : "");
    }
    file_list_free(&fl);
    strata_json_free(&index);
    if (bad) {
        strata_pretrained_close(p);
        return NULL;
    }
    return p;
}

int strata_pretrained_read(void *ctx, const strata_model *m, int u, size_t lo, size_t hi, float *dst) {
    strata_pretrained *p = ctx;
    const strata_unit *unit = &m->units[u];
    float *check = NULL;
    int rc = 0;
    for (int i = 0; i < unit->n_tensors && !rc; i++) {
        int k = unit->first_tensor + i;
        const strata_ckpt_tensor *mt = &m->tensors[k];
        size_t a = mt->offset > lo ? mt->offset : lo;
        size_t b = mt->offset + mt->numel < hi ? mt->offset + mt->numel : hi;
        if (a >= b) continue;
        size_t ta = a - mt->offset, tb = b - mt->offset; /* within the tensor */
        size_t real = k == 0 ? p->v_rows * (size_t)m->shape.n_embd : mt->numel; /* wte: rows >= V are padding */
        size_t rb = tb < real ? tb : real;
        float *out = dst + (a - lo);
        if (ta < rb) rc = strata_safetensors_read_f32(&p->files[p->src_file[k]], p->src[k], ta, rb, out);
        if (ta < rb) p->elements_read += rb - ta;
        if (rb < tb) memset(out + (rb > ta ? rb - ta : 0), 0, (tb - (rb > ta ? rb : ta)) * sizeof(float));
        if (!rc && k == 0 && p->lm_head && ta < rb) {
            /* the tied head: this range of lm_head.weight must be these very numbers */
            check = strata_xmalloc((rb - ta) * sizeof(float));
            rc = strata_safetensors_read_f32(&p->files[p->lm_head_file], p->lm_head, ta, rb, check);
            for (size_t e = 0; !rc && e < rb - ta; e++)
                if (memcmp(&check[e], &out[e], sizeof(float)))
                    rc = strata_fail("%s: lm_head.weight differs from %s at element %zu (%g vs %g): Strata's LM head is "
                                     "tied to the token embedding, so untied weights cannot be loaded",
                                     p->files[p->lm_head_file].path, p->src[0]->name, ta + e, check[e], out[e]);
            free(check);
            check = NULL;
        }
    }
    /* the unit's padding */
    for (size_t e = unit->numel > lo ? unit->numel : lo; e < hi && !rc; e++) dst[e - lo] = 0.0f;
    if (rc) return strata_fail_wrap("model.init_from '%s'", p->init_from);
    return 0;
}
