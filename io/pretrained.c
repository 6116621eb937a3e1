/* io/pretrained.c: Hugging Face weights of either family (one safetensors file or a
 * sharded directory) read into the model's units by element range. See io/pretrained.h
 * for what is accepted and refused. */
#include "io/pretrained.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "io/files.h"
#include "io/json.h"
#include "io/safetensors.h"
#include "io/text.h"

#define MAX_INDEX_BYTES ((size_t)16 << 20) /* model.safetensors.index.json: a line per tensor */
#define LM_HEAD "lm_head.weight"

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

/* Adds path to the list unless it is there already (an index names a file per tensor). */
static void add_file(file_list *f, const char *path) {
    for (int i = 0; i < f->n; i++)
        if (!strcmp(f->path[i], path)) return;
    f->path = strata_xrealloc(f->path, (size_t)(f->n + 1) * sizeof *f->path);
    snprintf(f->path[f->n++], STRATA_PATH_MAX, "%s", path);
}

static int list_files(const char *init_from, file_list *f, strata_json_doc *index) {
    memset(f, 0, sizeof *f);
    memset(index, 0, sizeof *index);
    if (!strata_is_dir(init_from)) {
        if (!strata_is_file(init_from))
            return strata_fail("model.init_from '%s': no such file or directory", init_from);
        add_file(f, init_from);
        return 0;
    }
    char p[STRATA_PATH_MAX];
    if (strata_path_join(f->index, sizeof f->index, init_from, "model.safetensors.index.json"))
        return strata_fail_wrap("model.init_from");
    if (strata_is_file(f->index)) {
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
            if (strata_path_join(p, sizeof p, init_from, file)) return strata_fail_wrap("%s", f->index);
            add_file(f, p);
        }
        if (!f->n) return strata_fail("%s: weight_map lists no tensors", f->index);
        return 0;
    }
    f->index[0] = 0;
    if (strata_path_join(p, sizeof p, init_from, "model.safetensors")) return strata_fail_wrap("model.init_from");
    if (strata_is_file(p)) {
        add_file(f, p);
        return 0;
    }
    char bin[STRATA_PATH_MAX];
    if (!strata_path_join(bin, sizeof bin, init_from, "pytorch_model.bin") && strata_is_file(bin))
        return strata_fail("model.init_from '%s' holds pytorch_model.bin; Strata reads safetensors only: convert it "
                           "with transformers (model = AutoModelForCausalLM.from_pretrained(DIR); "
                           "model.save_pretrained(DIR2, safe_serialization=True))", init_from);
    return strata_fail("model.init_from '%s': found neither model.safetensors nor model.safetensors.index.json in "
                       "the directory", init_from);
}

/* ---- the weights ---- */

struct strata_pretrained {
    char init_from[STRATA_PATH_MAX];
    int n_files;
    strata_safetensors *files;
    const strata_st_tensor **src;    /* per model tensor: where it is */
    int *src_file;
    const strata_st_tensor *lm_head; /* a tied model's: NULL when absent */
    int lm_head_file;
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

/* Buffers old files carry that are no parameters: GPT-2's causal-mask buffers
 * ("h.3.attn.bias", "h.3.attn.masked_bias") and Llama's RoPE frequencies
 * ("layers.3.self_attn.rotary_emb.inv_freq"), names without their prefix. */
static int is_buffer(const char *n) {
    static const char rope[] = ".rotary_emb.inv_freq";
    size_t len = strlen(n);
    if (len > sizeof rope - 1 && !strcmp(n + len - (sizeof rope - 1), rope)) return 1;
    if (strncmp(n, "h.", 2)) return 0;
    const char *dot = strchr(n + 2, '.');
    return dot && (!strcmp(dot, ".attn.bias") || !strcmp(dot, ".attn.masked_bias"));
}

/* A name without the prefix of the whole model's class ("transformer." of
 * GPT2LMHeadModel, "model." of LlamaForCausalLM and the like): GPT2Model and LlamaModel
 * save theirs without it. */
static const char *bare(const char *name) {
    static const char *const prefixes[] = {"transformer.", "model."};
    for (int i = 0; i < 2; i++)
        if (!strncmp(name, prefixes[i], strlen(prefixes[i]))) return name + strlen(prefixes[i]);
    return name;
}

/* The model's tensor called lm_head.weight (an untied head), or -1. */
static int own_lm_head(const strata_model *m) {
    for (int j = 0; j < m->n_tensors; j++)
        if (!strcmp(m->tensors[j].name, LM_HEAD)) return j;
    return -1;
}

static void fmt_shape(char *buf, size_t n, int ndim, const int64_t *shape) {
    size_t o = (size_t)snprintf(buf, n, "[");
    for (int i = 0; i < ndim && o < n; i++) o += (size_t)snprintf(buf + o, n - o, i ? ", %lld" : "%lld", (long long)shape[i]);
    if (o < n) snprintf(buf + o, n - o, "]");
}

static const char *family_name(const strata_model *m) {
    return m->shape.arch == STRATA_ARCH_LLAMA ? "Llama-family" : "GPT-2";
}

/* Opens every file and finds, for each tensor of the model, the file tensor holding it
 * (and lm_head.weight, when present); a tensor the model lacks, or one found twice, is
 * refused by name. */
static int match_tensors(strata_pretrained *p, const file_list *fl, const strata_model *m) {
    for (int f = 0; f < fl->n; f++) {
        if (strata_safetensors_open(&p->files[f], fl->path[f])) return -1;
        p->n_files++;
        const strata_safetensors *st = &p->files[f];
        for (int i = 0; i < st->n_tensors; i++) {
            const strata_st_tensor *t = &st->tensors[i];
            const char *n = bare(t->name);
            if (is_buffer(n)) continue;
            if (!strcmp(t->name, LM_HEAD) && own_lm_head(m) < 0) { /* a tied head's copy */
                if (p->lm_head)
                    return strata_fail("lm_head.weight is in both %s and %s", p->files[p->lm_head_file].path, st->path);
                p->lm_head = t;
                p->lm_head_file = f;
                continue;
            }
            int k = -1;
            for (int j = 0; j < m->n_tensors; j++)
                if (!strcmp(bare(m->tensors[j].name), n)) k = j;
            if (k < 0)
                return strata_fail("%s: tensor \"%s\" is not a parameter of Strata's %s with %d layers (is the file "
                                   "a %s model of this shape?)", st->path, t->name,
                                   m->shape.arch == STRATA_ARCH_LLAMA ? "Llama-family model" : "GPT-2",
                                   m->shape.n_layer, family_name(m));
            if (p->src[k])
                return strata_fail("tensor %s is in the weights twice: \"%s\" in %s and \"%s\" in %s", m->tensors[k].name,
                                   p->src[k]->name, p->files[p->src_file[k]].path, t->name, st->path);
            p->src[k] = t;
            p->src_file[k] = f;
        }
    }
    return 0;
}

/* Every tensor the index promises is in the file it names. */
static int check_index(const strata_pretrained *p, const file_list *fl, const strata_json_doc *index) {
    const strata_json *map = fl->index[0] ? strata_json_get(&index->root, "weight_map") : NULL;
    for (size_t i = 0; map && i < map->len; i++) {
        const strata_json_member *e = &map->members[i];
        char path[STRATA_PATH_MAX];
        if (strata_path_join(path, sizeof path, p->init_from, e->value.str)) return strata_fail_wrap("%s", fl->index);
        for (int f = 0; f < p->n_files; f++)
            if (!strcmp(p->files[f].path, path) && !strata_safetensors_find(&p->files[f], e->key))
                return strata_fail("%s: weight_map puts \"%s\" in %s, which has no such tensor", fl->index, e->key, path);
    }
    return 0;
}

/* Every parameter is present, with the model's shape (the embedding and an untied head:
 * vocab_size rows; Strata pads to Vp) in a dtype Strata converts; a tied model's
 * lm_head, when present, has the embedding's shape. */
static int check_tensors(const strata_pretrained *p, const strata_model *m) {
    for (int k = 0; k < m->n_tensors; k++) {
        const strata_param_tensor *mt = &m->tensors[k];
        const strata_st_tensor *t = p->src[k];
        if (!t) {
            if (!strcmp(mt->name, LM_HEAD))
                return strata_fail("model.init_from '%s': no tensor lm_head.weight, but model.tie_embeddings is false "
                                   "(a tied model's head is its token embedding: set it true)", p->init_from);
            return strata_fail("model.init_from '%s': no tensor %s (or %s)", p->init_from, mt->name, bare(mt->name));
        }
        int64_t want[2] = {strata_model_real_rows(m, k), mt->shape[1]};
        int same = t->ndim == mt->ndim;
        for (int d = 0; same && d < mt->ndim; d++) same = t->shape[d] == want[d];
        if (!same) {
            char a[96], b[96];
            fmt_shape(a, sizeof a, t->ndim, t->shape);
            fmt_shape(b, sizeof b, mt->ndim, want);
            return strata_fail("%s: tensor \"%s\" has shape %s, but the model needs %s", p->files[p->src_file[k]].path,
                               t->name, a, b);
        }
        if (t->dtype != STRATA_ST_F32 && t->dtype != STRATA_ST_F16 && t->dtype != STRATA_ST_BF16 &&
            t->dtype != STRATA_ST_F64)
            return strata_fail("%s: tensor \"%s\" has dtype %s; Strata reads weights stored as F32, F16, BF16 or F64",
                               p->files[p->src_file[k]].path, t->name, strata_st_dtype_name(t->dtype));
    }
    const strata_st_tensor *w = p->src[0];
    if (p->lm_head && (p->lm_head->ndim != 2 || p->lm_head->shape[0] != w->shape[0] || p->lm_head->shape[1] != w->shape[1]))
        return strata_fail("%s: lm_head.weight's shape differs from %s's, but the model's LM head is tied to the token "
                           "embedding", p->files[p->lm_head_file].path, w->name);
    return 0;
}

/* "N tensors in K files (sharded, with an index), BF16, lm_head.weight tied" for the log. */
static void describe(strata_pretrained *p, const strata_model *m, const file_list *fl) {
    const char *dt = strata_st_dtype_name(p->src[0]->dtype);
    int mixed = 0;
    for (int k = 1; k < m->n_tensors; k++) mixed |= p->src[k]->dtype != p->src[0]->dtype;
    snprintf(p->desc, sizeof p->desc, "%d tensors in %d file%s%s, %s%s", m->n_tensors, p->n_files,
             p->n_files == 1 ? "" : "s", fl->index[0] ? " (sharded, with an index)" : "", mixed ? "mixed dtypes" : dt,
             p->lm_head ? ", lm_head.weight tied" : "");
}

strata_pretrained *strata_pretrained_open(const char *init_from, const strata_model *m) {
    file_list fl;
    strata_json_doc index;
    strata_pretrained *p = NULL;
    int rc = list_files(init_from, &fl, &index);
    if (!rc) {
        p = strata_xcalloc(1, sizeof *p);
        snprintf(p->init_from, sizeof p->init_from, "%s", init_from);
        p->files = strata_xcalloc((size_t)fl.n, sizeof *p->files);
        p->src = strata_xcalloc((size_t)m->n_tensors, sizeof *p->src);
        p->src_file = strata_xcalloc((size_t)m->n_tensors, sizeof *p->src_file);
        rc = match_tensors(p, &fl, m) || check_index(p, &fl, &index) || check_tensors(p, m) ? -1 : 0;
        if (!rc) describe(p, m, &fl);
    }
    file_list_free(&fl);
    strata_json_free(&index);
    if (rc) {
        strata_pretrained_close(p);
        return NULL;
    }
    return p;
}

/* Elements [ta, tb) of model tensor k, just read into v, are all finite: a NaN or an Inf
 * would make the first step's loss NaN and the run advise a lower learning rate, when the
 * fault is in the file. Refused at the first, by tensor, element (row and column) and
 * file, with how many there are in this range. */
static int check_finite(const strata_pretrained *p, int k, const float *v, size_t ta, size_t tb) {
    size_t n_bad = 0, first = 0;
    for (size_t e = 0; e < tb - ta; e++)
        if (!isfinite(v[e]) && n_bad++ == 0) first = e;
    if (!n_bad) return 0;
    const strata_st_tensor *t = p->src[k];
    size_t at = ta + first;
    char where[96] = "", more[128] = "";
    if (t->ndim == 2) snprintf(where, sizeof where, " (row %zu, column %zu)", at / (size_t)t->shape[1], at % (size_t)t->shape[1]);
    if (n_bad > 1) snprintf(more, sizeof more, ", the first of %zu non-finite values among its elements %zu-%zu", n_bad, ta, tb - 1);
    return strata_fail("%s: tensor \"%s\" holds %s at element %zu%s%s: the weights are damaged (or were saved from a "
                       "run that had diverged), and a model cannot train from them",
                       p->files[p->src_file[k]].path, t->name, isnan(v[first]) ? "NaN" : v[first] > 0 ? "+Inf" : "-Inf",
                       at, where, more);
}

int strata_pretrained_read(void *ctx, const strata_model *m, int u, size_t lo, size_t hi, float *dst) {
    strata_pretrained *p = ctx;
    const strata_unit *unit = &m->units[u];
    float *check = NULL;
    int rc = 0;
    for (int i = 0; i < unit->n_tensors && !rc; i++) {
        int k = unit->first_tensor + i;
        const strata_param_tensor *mt = &m->tensors[k];
        size_t a = mt->offset > lo ? mt->offset : lo;
        size_t b = mt->offset + mt->numel < hi ? mt->offset + mt->numel : hi;
        if (a >= b) continue;
        size_t ta = a - mt->offset, tb = b - mt->offset; /* within the tensor */
        size_t real = (size_t)strata_model_real_rows(m, k) * (mt->ndim > 1 ? (size_t)mt->shape[1] : 1); /* rows >= V: padding */
        size_t rb = tb < real ? tb : real;
        float *out = dst + (a - lo);
        if (ta < rb) rc = strata_safetensors_read_f32(&p->files[p->src_file[k]], p->src[k], ta, rb, out);
        if (!rc && ta < rb) rc = check_finite(p, k, out, ta, rb);
        if (ta < rb) p->elements_read += rb - ta;
        if (rb < tb) memset(out + (rb > ta ? rb - ta : 0), 0, (tb - (rb > ta ? rb : ta)) * sizeof(float));
        if (!rc && k == 0 && p->lm_head && ta < rb) {
            /* the tied head: this range of lm_head.weight must be these very numbers */
            check = strata_xmalloc((rb - ta) * sizeof(float));
            rc = strata_safetensors_read_f32(&p->files[p->lm_head_file], p->lm_head, ta, rb, check);
            for (size_t e = 0; !rc && e < rb - ta; e++)
                if (memcmp(&check[e], &out[e], sizeof(float)))
                    rc = strata_fail("%s: lm_head.weight differs from %s at element %zu (%g vs %g): the model's LM head "
                                     "is tied to the token embedding (model.tie_embeddings), so untied weights cannot be "
                                     "loaded into it",
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
