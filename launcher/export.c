/* launcher/export.c: `strata export` (checkpoint -> a Hugging Face model directory, or one
 * safetensors file) and `strata dump-grads` (one forward/backward written out for
 * tests/torch_reference.py).
 *
 * safetensors layout: u64 little-endian N, then N bytes of JSON
 *   {"__metadata__": {"k": "v", ...}, "name": {"dtype": "F32", "shape": [..],
 *    "data_offsets": [begin, end]}, ...}
 * padded with spaces so the data starts 8-byte aligned, then the tensors' bytes back to
 * back in header order (offsets relative to the start of the data). */
#include "launcher/export.h"
#include "launcher/commands.h"

#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <libgen.h>
#include <math.h>
#include <omp.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/arena.h"
#include "core/common.h"
#include "core/kernels.h"
#include "core/model.h"
#include "io/bpe.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "io/data.h"
#include "io/files.h"
#include "io/json.h"
#include "shard/comm.h"
#include "shard/engine.h"
#include "launcher/build.h"
#include "launcher/tokenizer.h"

#define WTE_NAME "transformer.wte.weight"

/* ---- safetensors writer ---- */

typedef struct st_tensor {
    char name[STRATA_TENSOR_NAME_MAX + 8]; /* "grad." + a model tensor name */
    const char *dtype;                    /* "F32" or "I32" */
    int ndim;
    int64_t shape[3];
    size_t bytes;
} st_tensor;

typedef struct st_writer {
    char path[STRATA_PATH_MAX], tmp[STRATA_PATH_MAX + 32];
    st_tensor *t;
    int n, cap;
    int next;   /* the tensor whose bytes come next */
    int fd;
    strata_sbuf meta;  /* "key": "value" pairs, comma separated, already JSON */
} st_writer;

static void st_init(st_writer *w, const char *path) {
    memset(w, 0, sizeof *w);
    snprintf(w->path, sizeof w->path, "%s", path);
    w->fd = -1;
}

static void st_free(st_writer *w) {
    free(w->t);
    free(w->meta.p);
    if (w->fd >= 0) {
        close(w->fd);
        unlink(w->tmp); /* not committed: leave no half-written file behind */
    }
    memset(w, 0, sizeof *w);
    w->fd = -1;
}

static void st_meta(st_writer *w, const char *key, const char *value) {
    if (w->meta.len) strata_sbuf_putn(&w->meta, ",", 1);
    strata_json_string(&w->meta, key, strlen(key));
    strata_sbuf_putn(&w->meta, ":", 1);
    strata_json_string(&w->meta, value ? value : "", strlen(value ? value : ""));
}

static void st_meta_int(st_writer *w, const char *key, long long value) {
    char v[32];
    snprintf(v, sizeof v, "%lld", value);
    st_meta(w, key, v);
}

/* Declares the next tensor (dtype elements are 4 bytes: F32 or I32). */
static void st_add(st_writer *w, const char *name, const char *dtype, int ndim, int64_t d0, int64_t d1,
                   int64_t d2) {
    if (w->n == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 64;
        w->t = strata_xrealloc(w->t, (size_t)w->cap * sizeof *w->t);
    }
    st_tensor *t = &w->t[w->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dtype;
    t->ndim = ndim;
    int64_t d[3] = {d0, d1, d2};
    size_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = d[i];
        numel *= (size_t)d[i];
    }
    t->bytes = numel * 4;
}


/* Writes the header to a temporary file next to the target; tensors follow with st_write. */
static int st_begin(st_writer *w) {
    strata_sbuf h = {0};
    strata_sbuf_putn(&h, "{\"__metadata__\":{", 17);
    if (w->meta.len) strata_sbuf_putn(&h, w->meta.p, w->meta.len);
    strata_sbuf_putn(&h, "}", 1);
    size_t off = 0;
    for (int i = 0; i < w->n; i++) {
        const st_tensor *t = &w->t[i];
        strata_sbuf_putn(&h, ",", 1);
        strata_json_string(&h, t->name, strlen(t->name));
        strata_sbuf_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[", t->dtype);
        for (int d = 0; d < t->ndim; d++) strata_sbuf_printf(&h, d ? ",%lld" : "%lld", (long long)t->shape[d]);
        strata_sbuf_printf(&h, "],\"data_offsets\":[%zu,%zu]}", off, off + t->bytes);
        off += t->bytes;
    }
    strata_sbuf_putn(&h, "}", 1);
    while (h.len % 8) strata_sbuf_putn(&h, " ", 1); /* 8 + N stays a multiple of 8: aligned data */
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)((uint64_t)h.len >> (8 * i));

    snprintf(w->tmp, sizeof w->tmp, "%s.tmp.%d", w->path, (int)getpid());
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int rc = 0;
    if (w->fd < 0) rc = strata_fail("%s: cannot create: %s", w->tmp, strerror(errno));
    else rc = strata_write_all(w->fd, len, 8, w->tmp) || strata_write_all(w->fd, h.p, h.len, w->tmp) ? -1 : 0;
    free(h.p);
    return rc;
}

/* The bytes of tensor `i`, which must be the next one declared. */
static int st_write(st_writer *w, int i, const void *data) {
    STRATA_ASSERT(i == w->next && i < w->n);
    w->next++;
    return strata_write_all(w->fd, data, w->t[i].bytes, w->tmp);
}

/* fsync, rename over the target, fsync the directory: a reader sees the old file or the
 * whole new one. */
static int st_commit(st_writer *w) {
    STRATA_ASSERT(w->next == w->n);
    if (fsync(w->fd) != 0) return strata_fail("%s: fsync failed: %s", w->tmp, strerror(errno));
    int fd = w->fd;
    w->fd = -1;
    if (close(fd) != 0) {
        int e = errno;
        unlink(w->tmp);
        return strata_fail("%s: close failed: %s", w->tmp, strerror(e));
    }
    if (rename(w->tmp, w->path) != 0) {
        int e = errno;
        unlink(w->tmp);
        return strata_fail("cannot rename %s to %s: %s", w->tmp, w->path, strerror(e));
    }
    char dir[STRATA_PATH_MAX];
    snprintf(dir, sizeof dir, "%s", w->path);
    int dfd = open(dirname(dir), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (dfd >= 0) {
        fsync(dfd); /* best effort: some file systems refuse fsync on a directory */
        close(dfd);
    }
    return 0;
}

/* ---- the checkpoint and its config ---- */


/* Metadata both files share: what transformers' GPT2Config needs, and where it came from. */
static void common_meta(st_writer *w, const strata_opened_ckpt *o) {
    const strata_config *c = &o->cfg;
    const strata_ckpt_meta *meta = strata_ckpt_get_meta(o->ck);
    st_meta(w, "format", "pt");
    st_meta(w, "strata.checkpoint", o->dir);
    st_meta_int(w, "strata.step", (long long)meta->step);
    st_meta_int(w, "strata.n_layer", c->model.n_layer);
    st_meta_int(w, "strata.n_head", c->model.n_head);
    st_meta_int(w, "strata.n_embd", c->model.n_embd);
    st_meta_int(w, "strata.n_positions", c->model.seq_len);
    st_meta_int(w, "strata.vocab_size", c->model.vocab_size);
    st_meta_int(w, "strata.padded_vocab_size", strata_config_padded_vocab(c));
    st_meta(w, "strata.config", meta->config_yaml);
}

/* Rows a tensor has in the exported file: wte loses its padding rows. */
static int64_t export_rows(const strata_param_tensor *t, int vocab_size) {
    return strcmp(t->name, WTE_NAME) == 0 ? vocab_size : t->shape[0];
}

static void add_model_tensor(st_writer *w, const char *prefix, const strata_param_tensor *t, int vocab_size) {
    char name[sizeof w->t[0].name];
    snprintf(name, sizeof name, "%s%s", prefix, t->name);
    st_add(w, name, "F32", t->ndim, export_rows(t, vocab_size), t->ndim > 1 ? t->shape[1] : 0, 0);
}

/* ---- strata export ---- */

static int export_usage(void) {
    fprintf(stderr, "usage: strata export CKPT|RUNDIR --out DIR [--max-shard-size SIZE]\n"
                    "       strata export CKPT|RUNDIR --out FILE.safetensors\n");
    return STRATA_EXIT_USAGE;
}

/* "5GB", "500MB", "2GiB", "123456": bytes, as transformers' max_shard_size reads them. */
static int parse_size(const char *s, uint64_t *out) {
    char *end = NULL;
    double v = strtod(s, &end);
    if (end == s || !(v > 0)) return -1;
    static const struct { const char *unit; double mul; } units[] = {
        {"", 1}, {"B", 1}, {"KB", 1e3}, {"MB", 1e6}, {"GB", 1e9}, {"TB", 1e12},
        {"KiB", 1024.0}, {"MiB", 1048576.0}, {"GiB", 1073741824.0}, {"TiB", 1099511627776.0},
    };
    for (size_t i = 0; i < sizeof units / sizeof units[0]; i++) {
        if (!strcmp(end, units[i].unit)) {
            *out = (uint64_t)(v * units[i].mul);
            return *out >= 1 ? 0 : -1;
        }
    }
    return -1;
}


/* Writes the model's tensors [t0, t1) as one safetensors file. */
static int write_weights(const strata_opened_ckpt *o, const strata_model *m, const char *path, int t0, int t1,
                         float *buf) {
    st_writer w;
    st_init(&w, path);
    common_meta(&w, o);
    for (int i = t0; i < t1; i++) add_model_tensor(&w, "", &m->tensors[i], m->shape.vocab_size);
    int rc = st_begin(&w);
    for (int i = t0; i < t1 && !rc; i++) {
        const strata_param_tensor *t = &m->tensors[i];
        size_t n = w.t[i - t0].bytes / sizeof(float); /* wte: only the real vocabulary's rows */
        rc = strata_ckpt_read_range(o->ck, t->unit, STRATA_CKPT_PARAM, t->offset, t->offset + n, buf) ||
             st_write(&w, i - t0, buf);
    }
    if (!rc) rc = st_commit(&w);
    st_free(&w);
    return rc ? -1 : 0;
}


/* The token ids a GPT-2 config names: <|endoftext|> when the run's tokenizer has it. */
static void sb_token_id(strata_sbuf *b, int id) {
    if (id >= 0) strata_sbuf_printf(b, "%d", id);
    else strata_sbuf_putn(b, "null", 4);
}

static int write_configs(const char *dir, const strata_config *c, int eot) {
    char path[STRATA_PATH_MAX + 64];
    char std[64];
    snprintf(std, sizeof std, "%.9g", c->model.init_std);
    strata_sbuf b = {0};
    /* what transformers' GPT2Config needs; no dropout, since Strata trains without it */
    strata_sbuf_printf(&b, "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n");
    strata_sbuf_printf(&b, "  \"vocab_size\": %d,\n  \"n_positions\": %d,\n  \"n_ctx\": %d,\n", c->model.vocab_size,
              c->model.seq_len, c->model.seq_len);
    strata_sbuf_printf(&b, "  \"n_embd\": %d,\n  \"n_layer\": %d,\n  \"n_head\": %d,\n  \"n_inner\": null,\n", c->model.n_embd,
              c->model.n_layer, c->model.n_head);
    strata_sbuf_printf(&b, "  \"activation_function\": \"gelu_new\",\n  \"layer_norm_epsilon\": 1e-05,\n");
    strata_sbuf_printf(&b, "  \"initializer_range\": %s,\n  \"resid_pdrop\": 0.0,\n  \"embd_pdrop\": 0.0,\n  \"attn_pdrop\": 0.0,\n", std);
    strata_sbuf_printf(&b, "  \"scale_attn_weights\": true,\n  \"tie_word_embeddings\": true,\n  \"use_cache\": true,\n");
    strata_sbuf_printf(&b, "  \"torch_dtype\": \"float32\",\n  \"bos_token_id\": ");
    sb_token_id(&b, eot);
    strata_sbuf_printf(&b, ",\n  \"eos_token_id\": ");
    sb_token_id(&b, eot);
    strata_sbuf_printf(&b, "\n}\n");
    snprintf(path, sizeof path, "%s/config.json", dir);
    int rc = strata_write_file_atomic(path, b.p, b.len);
    b.len = 0;
    strata_sbuf_printf(&b, "{\n  \"_from_model_config\": true,\n  \"bos_token_id\": ");
    sb_token_id(&b, eot);
    strata_sbuf_printf(&b, ",\n  \"eos_token_id\": ");
    sb_token_id(&b, eot);
    strata_sbuf_printf(&b, "\n}\n");
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    if (!rc) rc = strata_write_file_atomic(path, b.p, b.len);
    free(b.p);
    return rc;
}

/* tokenizer.json (as trained with), vocab.json + merges.txt (for GPT-2's original
 * tokenizer class) and tokenizer_config.json. */
static int write_tokenizer(const char *dir, const strata_bpe *tk, int eot, int max_len) {
    char path[STRATA_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (strata_bpe_save(tk, path) || strata_bpe_save_vocab_merges(tk, dir)) return -1;
    strata_sbuf b = {0};
    strata_sbuf_printf(&b, "{\n  \"tokenizer_class\": \"GPT2Tokenizer\",\n  \"model_max_length\": %d,\n", max_len);
    strata_sbuf_printf(&b, "  \"add_prefix_space\": %s,\n  \"add_bos_token\": false,\n", strata_bpe_add_prefix_space(tk) ? "true" : "false");
    static const char *const roles[] = {"bos_token", "eos_token", "unk_token"};
    for (int i = 0; i < 3; i++) {
        strata_sbuf_printf(&b, "  \"%s\": ", roles[i]);
        if (eot >= 0) strata_json_string(&b, "<|endoftext|>", strlen("<|endoftext|>"));
        else strata_sbuf_putn(&b, "null", 4);
        strata_sbuf_putn(&b, ",\n", 2);
    }
    strata_sbuf_printf(&b, "  \"pad_token\": null\n}\n");
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    int rc = strata_write_file_atomic(path, b.p, b.len);
    free(b.p);
    return rc;
}

/* Weight files of an earlier export that this one did not write (a stale index would
 * make from_pretrained load the old shards). */
static void remove_stale_weights(const char *dir, int n_shards) {
    char pat[STRATA_PATH_MAX + 64], keep[64];
    snprintf(pat, sizeof pat, "%s/model-*-of-*.safetensors", dir);
    snprintf(keep, sizeof keep, "-of-%05d.safetensors", n_shards);
    glob_t g;
    if (glob(pat, 0, NULL, &g) == 0) {
        for (size_t i = 0; i < g.gl_pathc; i++) {
            const char *p = g.gl_pathv[i];
            size_t n = strlen(p), k = strlen(keep);
            if (n_shards > 1 && n >= k && !strcmp(p + n - k, keep)) continue;
            unlink(p);
        }
        globfree(&g);
    }
    snprintf(pat, sizeof pat, "%s/%s", dir, n_shards > 1 ? "model.safetensors" : "model.safetensors.index.json");
    unlink(pat);
}

static int export_dir(const strata_opened_ckpt *o, const strata_model *m, const char *dir, uint64_t max_shard,
                      float *buf, int *n_files) {
    if (strata_mkdir_p(dir)) return -1;
    /* shards in tensor order: a new file when the next tensor would pass max_shard (a
     * tensor larger than that gets a file of its own, as transformers does) */
    int *first = strata_xcalloc((size_t)m->n_tensors + 1, sizeof *first);
    int n = 0;
    uint64_t in_shard = 0, total = 0;
    for (int i = 0; i < m->n_tensors; i++) {
        const strata_param_tensor *t = &m->tensors[i];
        uint64_t bytes = (uint64_t)export_rows(t, m->shape.vocab_size) * (t->ndim > 1 ? (uint64_t)t->shape[1] : 1) * 4;
        if (n == 0 || (in_shard + bytes > max_shard && in_shard > 0)) {
            first[n++] = i;
            in_shard = 0;
        }
        in_shard += bytes;
        total += bytes;
    }
    first[n] = m->n_tensors;
    int rc = 0;
    char path[STRATA_PATH_MAX + 64];
    strata_sbuf idx = {0};
    if (n > 1) strata_sbuf_printf(&idx, "{\n  \"metadata\": {\"total_size\": %llu},\n  \"weight_map\": {", (unsigned long long)total);
    for (int s = 0; s < n && !rc; s++) {
        char name[64];
        if (n == 1) snprintf(name, sizeof name, "model.safetensors");
        else snprintf(name, sizeof name, "model-%05d-of-%05d.safetensors", s + 1, n);
        snprintf(path, sizeof path, "%s/%s", dir, name);
        rc = write_weights(o, m, path, first[s], first[s + 1], buf);
        for (int i = first[s]; n > 1 && i < first[s + 1]; i++) {
            strata_sbuf_putn(&idx, i ? ",\n    " : "\n    ", i ? 6 : 5);
            strata_json_string(&idx, m->tensors[i].name, strlen(m->tensors[i].name));
            strata_sbuf_putn(&idx, ": ", 2);
            strata_json_string(&idx, name, strlen(name));
        }
    }
    if (!rc && n > 1) {
        strata_sbuf_printf(&idx, "\n  }\n}\n");
        snprintf(path, sizeof path, "%s/model.safetensors.index.json", dir);
        rc = strata_write_file_atomic(path, idx.p, idx.len);
    }
    free(idx.p);
    free(first);
    if (rc) return -1;
    remove_stale_weights(dir, n);
    *n_files = n;
    /* the tokenizer the run trained with, recorded in its run directory */
    int failed = 0;
    strata_bpe *tk = strata_ckpt_tokenizer(o->dir, &failed);
    if (failed) return strata_fail_wrap("the run's tokenizer");
    int eot = tk ? strata_bpe_special_id(tk, "<|endoftext|>") : -1;
    if (eot >= o->cfg.model.vocab_size) eot = -1;
    rc = write_configs(dir, &o->cfg, eot);
    if (!rc && tk) rc = write_tokenizer(dir, tk, eot, o->cfg.model.seq_len);
    if (!tk)
        STRATA_WARN("export", "the run recorded no tokenizer (its data came without tokenizer.json), so %s has none: "
                    "copy the tokenizer files of the data in yourself", dir);
    strata_bpe_free(tk);
    return rc;
}

int strata_cmd_export(int argc, char **argv) {
    const char *what = NULL, *out = NULL, *max_size = NULL;
    for (int i = 0; i < argc; i++) {
        if (!strcmp(argv[i], "--out") && i + 1 < argc) out = argv[++i];
        else if (!strcmp(argv[i], "--max-shard-size") && i + 1 < argc) max_size = argv[++i];
        else if (argv[i][0] != '-' && !what) what = argv[i];
        else {
            fprintf(stderr, "strata export: unexpected argument '%s'\n", argv[i]);
            return export_usage();
        }
    }
    if (!what || !out) return export_usage();
    size_t out_len = strlen(out);
    int one_file = out_len > 12 && !strcmp(out + out_len - 12, ".safetensors");
    uint64_t max_shard = 5000000000ull; /* transformers' default, "5GB" */
    if (max_size && (one_file || parse_size(max_size, &max_shard))) {
        if (one_file) fprintf(stderr, "strata export: --max-shard-size applies to a directory (--out DIR), not to %s\n", out);
        else fprintf(stderr, "strata export: --max-shard-size expects a size like 5GB, 500MB or 2GiB, got '%s'\n", max_size);
        return STRATA_EXIT_USAGE;
    }
    strata_opened_ckpt o;
    int rc = strata_open_checkpoint("export", what, NULL, 0, &o);
    if (rc) return rc;
    strata_model_shape shape = strata_config_model_shape(&o.cfg);
    strata_model m;
    strata_model_init(&m, &shape);
    strata_param_layout layout = strata_model_layout(&m, NULL);
    float *buf = NULL;
    size_t max_numel = 0;
    int n_files = 1;
    rc = STRATA_EXIT_ERROR;
    if (strata_ckpt_check_layout(o.ck, &layout)) goto done;
    for (int i = 0; i < m.n_tensors; i++)
        if (m.tensors[i].numel > max_numel) max_numel = m.tensors[i].numel;
    buf = strata_xmalloc(max_numel * sizeof(float));
    if (one_file ? write_weights(&o, &m, out, 0, m.n_tensors, buf) : export_dir(&o, &m, out, max_shard, buf, &n_files))
        goto done;
    printf("wrote %s: %d tensors, %zu parameters, step %lld%s\n", out, m.n_tensors, strata_model_num_params(&m),
           (long long)strata_ckpt_get_meta(o.ck)->step, one_file ? "" : n_files > 1 ? " (sharded, with an index)" : "");
    rc = STRATA_EXIT_OK;
done:
    if (rc) fprintf(stderr, "strata export: %s\n", strata_error());
    free(buf);
    strata_model_free(&m);
    strata_ckpt_close(o.ck);
    return rc;
}

/* ---- strata dump-grads ---- */

static int dump_usage(void) {
    fprintf(stderr, "usage: strata dump-grads CKPT|RUNDIR --data GLOB --out FILE.safetensors [--batch B] [--seq T]\n"
                    "                         [--device cpu|cuda] [--set section.key=value]...\n"
                    "  --device cuda computes in bf16 on the GPU (fp32 on the CPU, the default)\n");
    return STRATA_EXIT_USAGE;
}

static int parse_positive(const char *opt, const char *s, int *out) {
    char *end = NULL;
    long v = strtol(s, &end, 10);
    if (!*s || *end || v < 1 || v > 1 << 20) {
        fprintf(stderr, "strata dump-grads: %s expects a positive integer, got '%s'\n", opt, s);
        return STRATA_EXIT_USAGE;
    }
    *out = (int)v;
    return 0;
}

int strata_cmd_dump_grads(int argc, char **argv) {
    const char *what = NULL, *out = NULL, *data = NULL, *device = "cpu";
    int B = 0, T = 0;
    /* the caller's overrides first; ours last, so the run is always world 1, stage 0, on
     * --device (fp32 on the CPU, bf16 on CUDA) */
    const char *sets[64 + 4];
    int n_sets = 0;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--out") && v) out = argv[++i];
        else if (!strcmp(a, "--data") && v) data = argv[++i];
        else if (!strcmp(a, "--batch") && v) {
            if (parse_positive(a, argv[++i], &B)) return STRATA_EXIT_USAGE;
        } else if (!strcmp(a, "--seq") && v) {
            if (parse_positive(a, argv[++i], &T)) return STRATA_EXIT_USAGE;
        } else if (!strcmp(a, "--device") && v) {
            device = argv[++i];
            if (strcmp(device, "cpu") && strcmp(device, "cuda")) {
                fprintf(stderr, "strata dump-grads: --device expects cpu or cuda, got '%s'\n", device);
                return STRATA_EXIT_USAGE;
            }
        } else if (!strcmp(a, "--set") && v && n_sets < 64) sets[n_sets++] = argv[++i];
        else if (a[0] != '-' && !what) what = a;
        else {
            fprintf(stderr, "strata dump-grads: unexpected argument '%s'\n", a);
            return dump_usage();
        }
    }
    if (!what || !out || !data) return dump_usage();
    int cuda = !strcmp(device, "cuda");
    sets[n_sets++] = cuda ? "device=cuda" : "device=cpu";
    sets[n_sets++] = "zero.stage=0";
    sets[n_sets++] = "train.grad_accum=1";
    sets[n_sets++] = cuda ? "train.dtype=bf16" : "train.dtype=fp32";
    strata_opened_ckpt o;
    int rc = strata_open_checkpoint("dump-grads", what, sets, n_sets, &o);
    if (rc) return rc;
    strata_config *cfg = &o.cfg;
    char set_b[64], set_t[64];
    if (B) snprintf(set_b, sizeof set_b, "train.micro_batch=%d", B);
    if (T) snprintf(set_t, sizeof set_t, "train.seq_len=%d", T);
    if ((B && strata_config_set(cfg, set_b)) || (T && strata_config_set(cfg, set_t)) ||
        strata_config_check(cfg, "--batch/--seq")) {
        fprintf(stderr, "strata dump-grads: %s\n", strata_error());
        strata_ckpt_close(o.ck);
        return STRATA_EXIT_USAGE;
    }
    B = cfg->train.micro_batch;
    T = strata_config_seq_len(cfg);
    if (cfg->train.threads > 0) omp_set_num_threads(cfg->train.threads);

    strata_loaded l;
    if (strata_load_model(&l, cfg, o.ck)) {
        fprintf(stderr, "strata dump-grads: %s\n", strata_error());
        strata_ckpt_close(o.ck);
        return STRATA_EXIT_ERROR;
    }
    strata_device *dev = l.dev;
    strata_model *m = &l.m;
    int V = m->shape.vocab_size, Vp = m->shape.padded_vocab_size, C = m->shape.n_embd;
    size_t BT = (size_t)B * T;
    const size_t *padded = strata_engine_padded(l.engine);
    float **grads = strata_xcalloc(m->n_units, sizeof *grads);      /* device */
    float **grads_host = strata_xcalloc(m->n_units, sizeof *grads); /* their copies */
    float *logits_f32 = NULL;                                        /* device: logits as fp32 */
    int32_t *inputs = strata_xmalloc(BT * sizeof(int32_t)), *targets = strata_xmalloc(BT * sizeof(int32_t));
    float *logits = strata_xmalloc(BT * Vp * sizeof(float));
    float loss = 0.0f, pad_max = 0.0f;
    char pad_str[32];
    strata_loader loader;
    int have_loader = 0;
    st_writer w;
    st_init(&w, out);
    rc = STRATA_EXIT_ERROR;

    if (strata_loader_open(&loader, data, T, V, 0, cfg->train.seed)) goto done;
    have_loader = 1;
    if (strata_loader_read(&loader, 0, B, inputs, targets)) goto done;
    for (int u = 0; u < m->n_units; u++) {
        grads[u] = strata_alloc(dev, STRATA_MEM_DEVICE, padded[u] * sizeof(float));
        if (!grads[u]) goto done;
        strata_memset_async(dev, dev->compute, grads[u], 0, padded[u] * sizeof(float));
        m->grads[u] = grads[u];
        grads_host[u] = strata_xmalloc(padded[u] * sizeof(float));
    }
    logits_f32 = strata_alloc(dev, STRATA_MEM_DEVICE, BT * Vp * sizeof(float));
    if (!logits_f32) goto done;

    /* Forward with the loss but without the gradient, so the logits survive to be read;
     * then the head again in training mode (it turns logits into dlogits in place) and
     * the backward of every unit, head first, as the engine's micro-step runs them. */
    if (strata_model_set_batch(m, inputs, targets)) {
        strata_fail_wrap("--data %s", data);
        goto done;
    }
    strata_memset_async(dev, dev->compute, m->loss_sum, 0, sizeof(float));
    for (int u = 0; u < m->n_units; u++) strata_model_forward_unit(m, u, 0, 0.0f, 1.0f / (float)BT);
    dev->k->convert(dev->compute, logits_f32, STRATA_F32, m->logits, dev->compute_dtype, BT * Vp);
    strata_memcpy_async(dev, dev->compute, logits, logits_f32, BT * Vp * sizeof(float));
    strata_memcpy_async(dev, dev->compute, &loss, m->loss_sum, sizeof(float));
    strata_model_forward_unit(m, m->n_units - 1, 1, 1.0f / (float)BT, 0.0f);
    for (int u = m->n_units - 1; u >= 0; u--) strata_model_backward_unit(m, u);
    for (int u = 0; u < m->n_units; u++)
        strata_memcpy_async(dev, dev->compute, grads_host[u], grads[u], padded[u] * sizeof(float));
    strata_stream_sync(dev, dev->compute);
    if (!isfinite(loss)) STRATA_WARN("export", "loss is %g: the checkpoint or the data is broken", loss);

    /* rows V..Vp-1 of wte never meet a token or a target: their gradient must be exactly 0 */
    for (size_t i = (size_t)V * C; i < (size_t)Vp * C; i++) pad_max = fmaxf(pad_max, fabsf(grads_host[0][i]));
    for (size_t r = 0; r < BT; r++) memmove(logits + r * V, logits + r * Vp, (size_t)V * sizeof(float));

    common_meta(&w, &o);
    st_meta_int(&w, "strata.batch", B);
    st_meta_int(&w, "strata.seq_len", T);
    snprintf(pad_str, sizeof pad_str, "%.9g", pad_max);
    st_meta(&w, "strata.wte_padding_grad_max_abs", pad_str);
    st_add(&w, "loss", "F32", 1, 1, 0, 0);
    st_add(&w, "logits", "F32", 3, B, T, V);
    st_add(&w, "inputs", "I32", 2, B, T, 0);
    st_add(&w, "targets", "I32", 2, B, T, 0);
    for (int i = 0; i < m->n_tensors; i++) add_model_tensor(&w, "grad.", &m->tensors[i], V);
    if (st_begin(&w) || st_write(&w, 0, &loss) || st_write(&w, 1, logits) || st_write(&w, 2, inputs) ||
        st_write(&w, 3, targets))
        goto done;
    for (int i = 0; i < m->n_tensors; i++) {
        const strata_param_tensor *t = &m->tensors[i];
        if (st_write(&w, 4 + i, grads_host[t->unit] + t->offset)) goto done;
    }
    if (st_commit(&w)) goto done;
    printf("wrote %s: loss %.6f over %d x %d tokens, %d gradients (step %lld)\n", out, loss, B, T, m->n_tensors,
           (long long)strata_ckpt_get_meta(o.ck)->step);
    rc = STRATA_EXIT_OK;
done:
    if (rc) fprintf(stderr, "strata dump-grads: %s\n", strata_error());
    st_free(&w);
    for (int u = 0; u < m->n_units; u++) {
        if (grads[u]) strata_free(dev, STRATA_MEM_DEVICE, grads[u]);
        free(grads_host[u]);
    }
    if (logits_f32) strata_free(dev, STRATA_MEM_DEVICE, logits_f32);
    free(grads);
    free(grads_host);
    free(inputs);
    free(targets);
    free(logits);
    if (have_loader) strata_loader_close(&loader);
    strata_loaded_free(&l);
    strata_ckpt_close(o.ck);
    return rc;
}
