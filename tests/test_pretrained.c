/* tests/test_pretrained.c: Hugging Face weights into the model's units (GPT-2's, and the
 * Llama family's names at the end). Files are
 * written here with known values; every unit is read back in the shards of a world-3
 * partition (padding included) and compared element by element: names with and without
 * "transformer.", the old attention-mask buffers, a tied lm_head.weight (and an untied one,
 * refused at the element that differs), sharded directories, BF16, a NaN or an Inf refused
 * where it is read (tensor, element, row and column), and the refusals
 * (unknown, missing, misshapen or integer tensors, an index pointing outside its directory,
 * pytorch_model.bin, config.json keys Strata does not compute). Then the config loader:
 * shape keys taken from config.json, and a YAML shape that disagrees refused naming both. */
#include "core/common.h"
#include "core/model.h"
#include "io/config.h"
#include "io/hf_config.h"
#include "io/pretrained.h"
#include "tests/check.h"

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#define L 1
#define NH 2
#define C 8
#define V 10
#define P 4

static char root[64];
static strata_model model;

/* The value a test file gives element i of model tensor k. */
static float val(int k, size_t i) { return (float)(k + 1) + (float)i / 1024.0f; }

typedef struct entry {
    char name[160];
    const char *dtype; /* F32, BF16 or I32 */
    int ndim;
    int64_t shape[2];
    float *data; /* numel values (converted on writing) */
} entry;

static size_t numel(const entry *e) { return (size_t)e->shape[0] * (e->ndim > 1 ? (size_t)e->shape[1] : 1); }

static void write_st(const char *path, entry *es, int n, const char *meta) {
    char header[16384];
    size_t o = (size_t)snprintf(header, sizeof header, "{\"__metadata__\":{\"format\":\"pt\"%s}", meta ? meta : "");
    size_t off = 0;
    for (int i = 0; i < n; i++) {
        size_t bytes = numel(&es[i]) * (strcmp(es[i].dtype, "BF16") ? 4 : 2);
        o += (size_t)snprintf(header + o, sizeof header - o, ",\"%s\":{\"dtype\":\"%s\",\"shape\":[%lld", es[i].name,
                              es[i].dtype, (long long)es[i].shape[0]);
        if (es[i].ndim > 1) o += (size_t)snprintf(header + o, sizeof header - o, ",%lld", (long long)es[i].shape[1]);
        o += (size_t)snprintf(header + o, sizeof header - o, "],\"data_offsets\":[%zu,%zu]}", off, off + bytes);
        off += bytes;
    }
    o += (size_t)snprintf(header + o, sizeof header - o, "}");
    FILE *f = fopen(path, "wb");
    uint64_t hl = o;
    fwrite(&hl, 8, 1, f);
    fwrite(header, 1, o, f);
    for (int i = 0; i < n; i++) {
        for (size_t k = 0; k < numel(&es[i]); k++) {
            float v = es[i].data[k];
            if (!strcmp(es[i].dtype, "BF16")) {
                uint16_t h = strata_f32_to_bf16(v);
                fwrite(&h, 2, 1, f);
            } else if (!strcmp(es[i].dtype, "I32")) {
                int32_t x = (int32_t)v;
                fwrite(&x, 4, 1, f);
            } else {
                fwrite(&v, 4, 1, f);
            }
        }
    }
    fclose(f);
}

/* The model's tensors as a Hugging Face file has them (wte with V rows), named with or
 * without the "transformer." prefix. */
static int model_entries(entry *es, int prefix, const char *dtype) {
    int n = 0;
    for (int k = 0; k < model.n_tensors; k++) {
        const strata_param_tensor *t = &model.tensors[k];
        entry *e = &es[n++];
        snprintf(e->name, sizeof e->name, "%s", prefix ? t->name : t->name + strlen("transformer."));
        e->dtype = dtype;
        e->ndim = t->ndim;
        e->shape[0] = k == 0 ? V : t->shape[0];
        e->shape[1] = t->shape[1];
        e->data = malloc(numel(e) * sizeof(float));
        for (size_t i = 0; i < numel(e); i++) e->data[i] = val(k, i);
    }
    return n;
}

static void free_entries(entry *es, int n) {
    for (int i = 0; i < n; i++) free(es[i].data);
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

#define GOOD_KEYS ",\"model_type\":\"gpt2\",\"n_layer\":1,\"activation_function\":\"gelu_new\",\"layer_norm_epsilon\":1e-05"

/* config.json: the shape but n_layer, then `keys` (GOOD_KEYS for a valid one) */
static const char *config_json(char *buf, size_t n, const char *keys) {
    snprintf(buf, n, "{\"n_head\":%d,\"n_embd\":%d,\"n_positions\":%d,\"vocab_size\":%d,\"resid_pdrop\":0.1%s}", NH, C,
             P, V, keys);
    return buf;
}

static const char *sub(const char *name) {
    static char p[160];
    snprintf(p, sizeof p, "%s/%s", root, name);
    return p;
}

static void make_dir(const char *name, int with_config) {
    mkdir(sub(name), 0755);
    if (with_config) {
        char cfg[1024], p[512];
        snprintf(p, sizeof p, "%s/config.json", sub(name));
        write_text(p, config_json(cfg, sizeof cfg, GOOD_KEYS));
    }
}

/* Reads every unit as world 3 would shard it and compares with the file's values. */
static int check_units(strata_pretrained *pt, int bf16) {
    int bad = 0;
    for (int u = 0; u < model.n_units && !bad; u++) {
        size_t padded = strata_round_up(model.units[u].numel, 3 * 64), S = padded / 3;
        float *buf = malloc(padded * sizeof(float));
        for (int r = 0; r < 3 && !bad; r++)
            if (strata_pretrained_read(pt, &model, u, r * S, (r + 1) * S, buf + r * S)) {
                printf("    unit %d rank %d: %s\n", u, r, strata_error());
                bad = 1;
            }
        for (size_t e = 0; e < padded && !bad; e++) {
            float want = 0.0f;
            for (int i = 0; i < model.units[u].n_tensors; i++) {
                int k = model.units[u].first_tensor + i;
                const strata_param_tensor *t = &model.tensors[k];
                if (e >= t->offset && e < t->offset + t->numel) {
                    size_t j = e - t->offset;
                    want = k == 0 && j >= (size_t)V * C ? 0.0f : val(k, j); /* wte's padding rows are 0 */
                    if (bf16) want = strata_bf16_to_f32(strata_f32_to_bf16(want));
                }
            }
            if (buf[e] != want) {
                printf("    unit %d element %zu: %g, expected %g\n", u, e, buf[e], want);
                bad = 1;
            }
        }
        free(buf);
    }
    return !bad;
}

static void test_layouts(void) {
    entry es[64];
    int n = model_entries(es, 1, "F32");
    /* old GPT-2 files: the attention-mask buffers, and the tied head written out */
    float mask[P * P];
    for (int i = 0; i < P * P; i++) mask[i] = 1;
    es[n++] = (entry){"transformer.h.0.attn.bias", "F32", 2, {P, P}, mask};
    es[n++] = (entry){"transformer.h.0.attn.masked_bias", "F32", 1, {1, 0}, mask};
    es[n] = (entry){"lm_head.weight", "F32", 2, {V, C}, es[0].data};
    make_dir("full", 1);
    char p[512];
    snprintf(p, sizeof p, "%s/model.safetensors", sub("full"));
    write_st(p, es, n + 1, NULL);
    strata_pretrained *pt = strata_pretrained_open(sub("full"), &model);
    CHECK(pt != NULL, "a directory with prefixed names, mask buffers and a tied lm_head opens (%s)", pt ? "" : strata_error());
    if (pt) {
        CHECK(check_units(pt, 0), "every unit, read as 3 shards, holds the file's values; padding reads 0");
        CHECK(strstr(strata_pretrained_describe(pt), "lm_head.weight tied") != NULL, "described: %s",
              strata_pretrained_describe(pt));
        strata_pretrained_close(pt);
    }
    /* an untied head: the read of the rows that differ fails there */
    float *head = malloc(V * C * sizeof(float));
    memcpy(head, es[0].data, V * C * sizeof(float));
    head[37] += 1.0f;
    es[n].data = head;
    write_st(p, es, n + 1, NULL);
    pt = strata_pretrained_open(sub("full"), &model);
    float buf[4096];
    CHECK(pt && strata_pretrained_read(pt, &model, 0, 0, 30, buf) == 0, "the rows before the difference read");
    CHECK(pt && strata_pretrained_read(pt, &model, 0, 30, 60, buf) != 0 &&
              strstr(strata_error(), "lm_head.weight differs from transformer.wte.weight at element 37"),
          "an untied lm_head is refused at the element that differs");
    strata_pretrained_close(pt);
    free(head);
    free_entries(es, model.n_tensors);

    /* GPT2Model's names (no prefix), BF16 */
    n = model_entries(es, 0, "BF16");
    make_dir("bare", 1);
    snprintf(p, sizeof p, "%s/model.safetensors", sub("bare"));
    write_st(p, es, n, NULL);
    pt = strata_pretrained_open(sub("bare"), &model);
    CHECK(pt && check_units(pt, 1), "names without 'transformer.', in BF16, read as their fp32 values");
    strata_pretrained_close(pt);

    /* sharded: three files and an index */
    make_dir("sharded", 1);
    int cut[4] = {0, 3, 9, n};
    char idx[8192];
    size_t o = (size_t)snprintf(idx, sizeof idx, "{\"metadata\":{\"total_size\":1},\"weight_map\":{");
    for (int s = 0; s < 3; s++) {
        char name[64];
        snprintf(name, sizeof name, "model-%05d-of-00003.safetensors", s + 1);
        snprintf(p, sizeof p, "%s/%s", sub("sharded"), name);
        write_st(p, es + cut[s], cut[s + 1] - cut[s], NULL);
        for (int i = cut[s]; i < cut[s + 1]; i++)
            o += (size_t)snprintf(idx + o, sizeof idx - o, "%s\"%s\":\"%s\"", i ? "," : "", es[i].name, name);
    }
    snprintf(idx + o, sizeof idx - o, "}}");
    snprintf(p, sizeof p, "%s/model.safetensors.index.json", sub("sharded"));
    write_text(p, idx);
    pt = strata_pretrained_open(sub("sharded"), &model);
    CHECK(pt && check_units(pt, 1) && strstr(strata_pretrained_describe(pt), "3 files (sharded"),
          "a sharded directory with an index reads alike");
    strata_pretrained_close(pt);
    /* an index that points out of its directory */
    write_text(p, "{\"weight_map\":{\"wte.weight\":\"../full/model.safetensors\"}}");
    CHECK(strata_pretrained_open(sub("sharded"), &model) == NULL && strstr(strata_error(), "same directory"),
          "an index naming a file outside its directory is refused");
    write_text(p, "{\"weight_map\":{\"wte.weight\":\"model-00002-of-00003.safetensors\"}}");
    CHECK(strata_pretrained_open(sub("sharded"), &model) == NULL && strstr(strata_error(), "which has no such tensor"),
          "an index that puts a tensor in the wrong file is refused");
    free_entries(es, n);
}

/* A NaN or an Inf in the weights is refused when it is read, by tensor and element, and
 * only by the reader whose range holds it. */
static void test_nonfinite(void) {
    entry es[64];
    int n = model_entries(es, 1, "F32");
    int last = n - 1; /* transformer.ln_f.bias: 1-D */
    es[0].data[21] = NAN;    /* wte [10, 8]: row 2, column 5 */
    es[last].data[3] = -INFINITY;
    es[last].data[5] = INFINITY;
    make_dir("nonfinite", 1);
    char p[512];
    snprintf(p, sizeof p, "%s/model.safetensors", sub("nonfinite"));
    write_st(p, es, n, NULL);
    strata_pretrained *pt = strata_pretrained_open(sub("nonfinite"), &model);
    CHECK(pt != NULL, "weights with a NaN open: the values are looked at as they are read (%s)", pt ? "" : strata_error());
    if (pt) {
        float buf[4096];
        CHECK(strata_pretrained_read(pt, &model, 0, 0, 21, buf) == 0, "the elements before the NaN read");
        CHECK(strata_pretrained_read(pt, &model, 0, 16, 40, buf) != 0 &&
                  strstr(strata_error(), "tensor \"transformer.wte.weight\" holds NaN at element 21 (row 2, column 5)") &&
                  strstr(strata_error(), "model.safetensors"),
              "a NaN is refused naming the file, the tensor, the element, its row and column: %s", strata_error());
        int u = model.n_units - 1;
        size_t off = model.tensors[last].offset;
        CHECK(strata_pretrained_read(pt, &model, u, off, off + C, buf) != 0 &&
                  strstr(strata_error(), "\"transformer.ln_f.bias\" holds -Inf at element 3, the first of 2 non-finite "
                                         "values among its elements 0-7"),
              "an Inf is refused too, with how many there are: %s", strata_error());
        strata_pretrained_close(pt);
    }
    free_entries(es, n);
}

static int open_fails(entry *es, int n, const char *what) {
    make_dir("bad", 1);
    char p[512];
    snprintf(p, sizeof p, "%s/model.safetensors", sub("bad"));
    write_st(p, es, n, NULL);
    strata_pretrained *pt = strata_pretrained_open(sub("bad"), &model);
    if (pt) {
        strata_pretrained_close(pt);
        return 0;
    }
    int ok = strstr(strata_error(), what) != NULL;
    if (!ok) printf("    message: %s\n", strata_error());
    return ok;
}

static void test_refusals(void) {
    entry es[64];
    int n = model_entries(es, 1, "F32");
    float x[C];
    memset(x, 0, sizeof x);
    es[n] = (entry){"transformer.h.1.ln_1.weight", "F32", 1, {C, 0}, x};
    CHECK(open_fails(es, n + 1, "\"transformer.h.1.ln_1.weight\" is not a parameter of Strata's GPT-2 with 1 layers"),
          "a tensor the model lacks (a deeper model)");
    CHECK(open_fails(es, n - 1, "no tensor transformer.ln_f.bias"), "a missing tensor");
    es[1].shape[0] = P + 1;
    float *wpe = es[1].data;
    es[1].data = malloc(numel(&es[1]) * sizeof(float));
    memset(es[1].data, 0, numel(&es[1]) * sizeof(float));
    CHECK(open_fails(es, n, "has shape [5, 8], but the model needs [4, 8]"), "a wpe with more rows than the model");
    free(es[1].data);
    es[1].data = wpe;
    es[1].shape[0] = P;
    es[2].dtype = "I32";
    CHECK(open_fails(es, n, "has dtype I32"), "an integer tensor");
    es[2].dtype = "F32";
    free_entries(es, n);
    char p[512];
    make_dir("torch", 1);
    snprintf(p, sizeof p, "%s/pytorch_model.bin", sub("torch"));
    write_text(p, "x");
    CHECK(strata_pretrained_open(sub("torch"), &model) == NULL && strstr(strata_error(), "safetensors only"),
          "pytorch_model.bin: refused with how to convert");
    CHECK(strata_pretrained_open(sub("nowhere"), &model) == NULL && strstr(strata_error(), "no such file"), "a missing path");

    /* config.json keys Strata does not compute */
    static const struct { const char *keys, *what; } bad[] = {
        {",\"n_layer\":1,\"activation_function\":\"gelu\"", "\"activation_function\" is \"gelu\""},
        {",\"n_layer\":1,\"layer_norm_epsilon\":1e-06", "\"layer_norm_epsilon\" is 1e-06"},
        {",\"n_layer\":1,\"tie_word_embeddings\":false", "\"tie_word_embeddings\" is false"},
        {",\"n_layer\":1,\"model_type\":\"bloom\"", "\"model_type\" is \"bloom\""},
        {",\"n_layer\":1,\"n_inner\":16", "\"n_inner\" must be null or 4 * n_embd (32)"},
        {",\"n_layer\":1,\"add_cross_attention\":true", "\"add_cross_attention\" is true"},
        {",\"n_layer\":1,\"scale_attn_by_inverse_layer_idx\":true", "scale_attn_by_inverse_layer_idx"},
        {",\"n_layer\":\"2\"", "\"n_layer\" must be a positive integer"},
        {"", "missing \"n_layer\""},
    };
    snprintf(p, sizeof p, "%s/config.json", root);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        char cfg[1024];
        write_text(p, config_json(cfg, sizeof cfg, bad[i].keys));
        strata_hf_shape s;
        CHECK(strata_hf_config_read(p, &s) != 0 && strstr(strata_error(), bad[i].what), "config.json%s refused: %s",
              bad[i].keys, strata_error());
    }
    char cfg[1024];
    strata_hf_shape s;
    write_text(p, config_json(cfg, sizeof cfg, ",\"n_ctx\":4,\"n_layer\":1,\"activation_function\":\"gelu_pytorch_tanh\","
                                               "\"n_inner\":null,\"attn_pdrop\":0.1"));
    CHECK(strata_hf_config_read(p, &s) == 0 && s.n_layer == L && s.n_positions == P,
          "gelu_pytorch_tanh, n_inner null and dropout are accepted (%s)", strata_error());
}

/* The Llama family's names: LlamaForCausalLM's ("model." + an untied lm_head.weight) and
 * LlamaModel's (no prefix), with the rotary_emb.inv_freq buffers old files carry, read
 * into the units; an untied model without lm_head.weight, and a tied one whose file
 * carries a different lm_head.weight, refused naming why. */
static void test_llama_names(void) {
    strata_model_shape shape = {.n_layer = 1, .n_head = 2, .n_embd = C, .max_seq_len = P, .vocab_size = V,
                                .padded_vocab_size = 16, .init_std = 0.02f, .arch = STRATA_ARCH_LLAMA, .n_kv_head = 1,
                                .head_dim = 4, .intermediate_size = 12, .rope_theta = 10000.0, .rms_norm_eps = 1e-5f,
                                .tie_embeddings = 0, .qkv_bias = 1};
    for (int prefixed = 1; prefixed >= 0; prefixed--) {
        strata_model m;
        strata_model_init(&m, &shape);
        entry es[32];
        int n = 0;
        for (int k = 0; k < m.n_tensors; k++) {
            const strata_param_tensor *t = &m.tensors[k];
            entry *e = &es[n++];
            const char *name = t->name;
            if (!prefixed && !strncmp(name, "model.", 6)) name += 6;
            snprintf(e->name, sizeof e->name, "%s", name);
            e->dtype = "F32";
            e->ndim = t->ndim;
            e->shape[0] = strata_model_real_rows(&m, k);
            e->shape[1] = t->shape[1];
            e->data = malloc(numel(e) * sizeof(float));
            for (size_t i = 0; i < numel(e); i++) e->data[i] = val(k, i);
        }
        es[n] = (entry){"", "F32", 1, {2, 0}, calloc(2, sizeof(float))};
        snprintf(es[n].name, sizeof es[n].name, "%slayers.0.self_attn.rotary_emb.inv_freq", prefixed ? "model." : "");
        n++;
        char dir[64], path[512];
        snprintf(dir, sizeof dir, "llama%d", prefixed);
        make_dir(dir, 0);
        snprintf(path, sizeof path, "%s/model.safetensors", sub(dir));
        write_st(path, es, n, NULL);
        strata_pretrained *pt = strata_pretrained_open(sub(dir), &m);
        int same = pt != NULL;
        for (int u = 0; same && u < m.n_units; u++) {
            float *buf = malloc(m.units[u].numel * sizeof(float));
            same = strata_pretrained_read(pt, &m, u, 0, m.units[u].numel, buf) == 0;
            for (int i = 0; same && i < m.units[u].n_tensors; i++) {
                int k = m.units[u].first_tensor + i;
                const strata_param_tensor *t = &m.tensors[k];
                size_t real = (size_t)strata_model_real_rows(&m, k) * (t->ndim > 1 ? (size_t)t->shape[1] : 1);
                for (size_t j = 0; same && j < t->numel; j++) same = buf[t->offset + j] == (j < real ? val(k, j) : 0.0f);
            }
            free(buf);
        }
        CHECK(same, "llama, %s names, rotary_emb.inv_freq skipped: every unit read, the embedding's and lm_head's "
              "padding rows 0 (%s)", prefixed ? "LlamaForCausalLM's" : "LlamaModel's", pt ? "" : strata_error());
        strata_pretrained_close(pt);
        if (prefixed) {
            write_st(path, es, n - 2, NULL); /* without lm_head.weight (and the buffer) */
            CHECK(strata_pretrained_open(sub(dir), &m) == NULL &&
                      strstr(strata_error(), "no tensor lm_head.weight, but model.tie_embeddings is false"),
                  "an untied model without lm_head.weight is refused: %s", strata_error());
        }
        free_entries(es, n);
        strata_model_free(&m);
    }
}

static void test_config(void) {
    char yaml[1024];
    strata_config c;
    snprintf(yaml, sizeof yaml, "model: {init_from: \"%s\"}\ndata: {train: x}\ntrain: {steps: 1}\n", sub("full"));
    CHECK(strata_config_load_string(&c, "ft.yaml", yaml, NULL, 0) == 0 && c.model.n_layer == L && c.model.n_head == NH &&
              c.model.n_embd == C && c.model.seq_len == P && c.model.vocab_size == V,
          "the shape keys the YAML leaves out come from config.json (%s)", strata_error());
    snprintf(yaml, sizeof yaml, "model: {init_from: \"%s\", n_layer: 1, n_embd: 8}\ndata: {train: x}\ntrain: {steps: 1}\n",
             sub("full"));
    CHECK(strata_config_load_string(&c, "ft.yaml", yaml, NULL, 0) == 0, "keys that agree are accepted");
    snprintf(yaml, sizeof yaml, "model: {init_from: \"%s\", n_embd: 16}\ndata: {train: x}\ntrain: {steps: 1}\n", sub("full"));
    CHECK(strata_config_load_string(&c, "ft.yaml", yaml, NULL, 0) != 0 &&
              strstr(strata_error(), "ft.yaml: model.n_embd is 16, but model.init_from's") &&
              strstr(strata_error(), "config.json has n_embd 8"),
          "a YAML shape that disagrees is refused naming both values: %s", strata_error());
    const char *set = "model.seq_len=8";
    snprintf(yaml, sizeof yaml, "model: {init_from: \"%s\"}\ndata: {train: x}\ntrain: {steps: 1}\n", sub("full"));
    CHECK(strata_config_load_string(&c, "ft.yaml", yaml, &set, 1) != 0 && strstr(strata_error(), "has n_positions 4"),
          "so is a --set that disagrees");

    /* a lone file without config.json: n_head from the YAML or Strata's export metadata */
    entry es[64];
    int n = model_entries(es, 1, "F32");
    mkdir(sub("lone"), 0755);
    char p[512];
    snprintf(p, sizeof p, "%s/w.safetensors", sub("lone"));
    write_st(p, es, n, NULL);
    snprintf(yaml, sizeof yaml, "model: {init_from: \"%s\"}\ndata: {train: x}\ntrain: {steps: 1}\n", p);
    CHECK(strata_config_load_string(&c, "ft.yaml", yaml, NULL, 0) != 0 &&
              strstr(strata_error(), "missing required key 'model.n_head'"),
          "a lone file gives every key but n_head: %s", strata_error());
    snprintf(yaml, sizeof yaml, "model: {init_from: \"%s\", n_head: 2}\ndata: {train: x}\ntrain: {steps: 1}\n", p);
    CHECK(strata_config_load_string(&c, "ft.yaml", yaml, NULL, 0) == 0 && c.model.n_layer == L && c.model.vocab_size == V &&
              c.model.seq_len == P, "with n_head in the YAML, the rest comes from the tensors' shapes");
    write_st(p, es, n, ",\"strata.n_head\":\"2\"");
    snprintf(yaml, sizeof yaml, "model: {init_from: \"%s\"}\ndata: {train: x}\ntrain: {steps: 1}\n", p);
    CHECK(strata_config_load_string(&c, "ft.yaml", yaml, NULL, 0) == 0 && c.model.n_head == NH,
          "or from the strata.n_head metadata of Strata's export");
    strata_pretrained *pt = strata_pretrained_open(p, &model);
    CHECK(pt && check_units(pt, 0), "a lone .safetensors file reads like a directory");
    strata_pretrained_close(pt);
    free_entries(es, n);
}

int main(void) {
    snprintf(root, sizeof root, "/tmp/strata-test-pretrained-XXXXXX");
    if (!mkdtemp(root)) return 1;
    strata_model_shape shape = {.n_layer = L, .n_head = NH, .n_embd = C, .max_seq_len = P, .vocab_size = V,
                                .padded_vocab_size = 128, .init_std = 0.02f};
    strata_model_init(&model, &shape);
    test_layouts();
    test_nonfinite();
    test_refusals();
    test_config();
    test_llama_names();
    strata_model_free(&model);
    char cmd[128];
    snprintf(cmd, sizeof cmd, "rm -rf %s", root);
    if (system(cmd) != 0) return 1;
    return check_report();
}
