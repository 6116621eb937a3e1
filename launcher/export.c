/* launcher/export.c: `strata export`, a checkpoint as a Hugging Face model directory or
 * one safetensors file (launcher/export.h); the files are written by
 * io/safetensors_write.h. */
#include "launcher/export.h"

#include <glob.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "core/model.h"
#include "io/bpe.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "io/files.h"
#include "io/json.h"
#include "io/text.h"
#include "launcher/commands.h"
#include "launcher/tokenizer.h"

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
    strata_st_out w;
    strata_st_out_init(&w, path);
    strata_st_out_checkpoint_meta(&w, o);
    for (int i = t0; i < t1; i++) strata_st_out_add_param(&w, "", m, i);
    int rc = strata_st_out_begin(&w);
    for (int i = t0; i < t1 && !rc; i++) {
        const strata_param_tensor *t = &m->tensors[i];
        size_t n = w.t[i - t0].bytes / sizeof(float); /* wte: only the real vocabulary's rows */
        rc = strata_ckpt_read_range(o->ck, t->unit, STRATA_CKPT_PARAM, t->offset, t->offset + n, buf) ||
             strata_st_out_write(&w, i - t0, buf);
    }
    if (!rc) rc = strata_st_out_commit(&w);
    strata_st_out_free(&w);
    return rc ? -1 : 0;
}


/* The token ids a GPT-2 config names: <|endoftext|> when the run's tokenizer has it. */
static void sb_token_id(strata_sbuf *b, int id) {
    if (id >= 0) strata_sbuf_printf(b, "%d", id);
    else strata_sbuf_putn(b, "null", 4);
}

/* What transformers' GPT2Config needs; no dropout, since Strata trains without it. */
static void gpt2_config(strata_sbuf *b, const strata_config *c, const char *std) {
    strata_sbuf_printf(b, "{\n  \"architectures\": [\"GPT2LMHeadModel\"],\n  \"model_type\": \"gpt2\",\n");
    strata_sbuf_printf(b, "  \"vocab_size\": %d,\n  \"n_positions\": %d,\n  \"n_ctx\": %d,\n", c->model.vocab_size,
                       c->model.seq_len, c->model.seq_len);
    strata_sbuf_printf(b, "  \"n_embd\": %d,\n  \"n_layer\": %d,\n  \"n_head\": %d,\n  \"n_inner\": null,\n",
                       c->model.n_embd, c->model.n_layer, c->model.n_head);
    strata_sbuf_printf(b, "  \"activation_function\": \"gelu_new\",\n  \"layer_norm_epsilon\": 1e-05,\n");
    strata_sbuf_printf(b, "  \"initializer_range\": %s,\n  \"resid_pdrop\": 0.0,\n  \"embd_pdrop\": 0.0,\n  \"attn_pdrop\": 0.0,\n", std);
    strata_sbuf_printf(b, "  \"scale_attn_weights\": true,\n  \"tie_word_embeddings\": true,\n  \"use_cache\": true,\n");
}

/* The Llama family's config.json under the model_type the run keeps (model.hf_model_type),
 * in transformers 4.x's words (rope_theta, rope_scaling), which 5.x reads too; no dropout,
 * no sliding window, no biases but Qwen2's (which its model_type implies). */
static void llama_config(strata_sbuf *b, const strata_config *c, const char *std) {
    static const struct { const char *type, *arch; } archs[] = {
        {"llama", "LlamaForCausalLM"}, {"mistral", "MistralForCausalLM"},
        {"qwen2", "Qwen2ForCausalLM"}, {"qwen3", "Qwen3ForCausalLM"},
    };
    const char *type = strata_config_hf_model_type(c), *arch = archs[0].arch;
    for (size_t i = 0; i < sizeof archs / sizeof archs[0]; i++)
        if (!strcmp(archs[i].type, type)) arch = archs[i].arch;
    strata_sbuf_printf(b, "{\n  \"architectures\": [\"%s\"],\n  \"model_type\": \"%s\",\n", arch, type);
    strata_sbuf_printf(b, "  \"vocab_size\": %d,\n  \"hidden_size\": %d,\n  \"intermediate_size\": %d,\n",
                       c->model.vocab_size, c->model.n_embd, c->model.intermediate_size);
    strata_sbuf_printf(b, "  \"num_hidden_layers\": %d,\n  \"num_attention_heads\": %d,\n  \"num_key_value_heads\": %d,\n",
                       c->model.n_layer, c->model.n_head, c->model.n_kv_head);
    strata_sbuf_printf(b, "  \"head_dim\": %d,\n  \"hidden_act\": \"silu\",\n  \"max_position_embeddings\": %d,\n",
                       c->model.head_dim, c->model.max_position_embeddings);
    strata_sbuf_printf(b, "  \"initializer_range\": %s,\n  \"rms_norm_eps\": %.9g,\n  \"rope_theta\": %.17g,\n", std,
                       c->model.rms_norm_eps, c->model.rope_theta);
    if (c->model.rope_scaling == STRATA_ROPE_LLAMA3)
        strata_sbuf_printf(b, "  \"rope_scaling\": {\"rope_type\": \"llama3\", \"factor\": %.17g, \"low_freq_factor\": %.17g, "
                              "\"high_freq_factor\": %.17g, \"original_max_position_embeddings\": %d},\n",
                           c->model.rope_factor, c->model.rope_low_freq_factor, c->model.rope_high_freq_factor,
                           c->model.rope_original_context);
    else strata_sbuf_printf(b, "  \"rope_scaling\": null,\n");
    if (!strcmp(type, "llama") || !strcmp(type, "qwen3")) strata_sbuf_printf(b, "  \"attention_bias\": false,\n");
    if (!strcmp(type, "llama")) strata_sbuf_printf(b, "  \"mlp_bias\": false,\n");
    if (!strcmp(type, "mistral")) strata_sbuf_printf(b, "  \"sliding_window\": null,\n");
    if (!strcmp(type, "qwen2") || !strcmp(type, "qwen3"))
        strata_sbuf_printf(b, "  \"use_sliding_window\": false,\n  \"sliding_window\": null,\n");
    strata_sbuf_printf(b, "  \"attention_dropout\": 0.0,\n  \"tie_word_embeddings\": %s,\n  \"use_cache\": true,\n",
                       c->model.tie_embeddings ? "true" : "false");
}

static int write_configs(const char *dir, const strata_config *c, int bos, int eos) {
    char path[STRATA_PATH_MAX + 64];
    char std[64];
    snprintf(std, sizeof std, "%.9g", c->model.init_std);
    strata_sbuf b = {0};
    if (c->model.arch == STRATA_ARCH_LLAMA) llama_config(&b, c, std);
    else gpt2_config(&b, c, std);
    strata_sbuf_printf(&b, "  \"torch_dtype\": \"float32\",\n  \"bos_token_id\": ");
    sb_token_id(&b, bos);
    strata_sbuf_printf(&b, ",\n  \"eos_token_id\": ");
    sb_token_id(&b, eos);
    strata_sbuf_printf(&b, "\n}\n");
    snprintf(path, sizeof path, "%s/config.json", dir);
    int rc = strata_write_file_atomic(path, b.p, b.len);
    b.len = 0;
    strata_sbuf_printf(&b, "{\n  \"_from_model_config\": true,\n  \"bos_token_id\": ");
    sb_token_id(&b, bos);
    strata_sbuf_printf(&b, ",\n  \"eos_token_id\": ");
    sb_token_id(&b, eos);
    strata_sbuf_printf(&b, "\n}\n");
    snprintf(path, sizeof path, "%s/generation_config.json", dir);
    if (!rc) rc = strata_write_file_atomic(path, b.p, b.len);
    free(b.p);
    return rc;
}

/* tokenizer.json (as trained with), and tokenizer_config.json: the one the data came with
 * (its class, BOS, EOS and chat template: prepare --chat-format's, so apply_chat_template
 * writes what the run trained on) when there is one; else, for GPT-2, vocab.json +
 * merges.txt (its original tokenizer class), and for the Llama family the class that
 * reads tokenizer.json alone (PreTrainedTokenizerFast): GPT2Tokenizer is not what a
 * Llama, Mistral or Qwen model's AutoTokenizer should build. */
static int write_tokenizer(const char *dir, const strata_bpe *tk, int eot, int max_len, int gpt2) {
    char path[STRATA_PATH_MAX + 64];
    snprintf(path, sizeof path, "%s/tokenizer.json", dir);
    if (strata_bpe_save(tk, path) || (gpt2 && strata_bpe_save_vocab_merges(tk, dir))) return -1;
    snprintf(path, sizeof path, "%s/tokenizer_config.json", dir);
    if (strata_bpe_has_config(tk)) return strata_bpe_save_config(tk, path, max_len);
    strata_sbuf b = {0};
    strata_sbuf_printf(&b, "{\n  \"tokenizer_class\": \"%s\",\n  \"model_max_length\": %d,\n",
                       gpt2 ? "GPT2Tokenizer" : "PreTrainedTokenizerFast", max_len);
    strata_sbuf_printf(&b, "  \"add_prefix_space\": %s,\n  \"add_bos_token\": false,\n", strata_bpe_add_prefix_space(tk) ? "true" : "false");
    static const char *const roles[] = {"bos_token", "eos_token", "unk_token"};
    for (int i = 0; i < 3; i++) {
        strata_sbuf_printf(&b, "  \"%s\": ", roles[i]);
        if (eot >= 0) strata_json_string(&b, "<|endoftext|>", strlen("<|endoftext|>"));
        else strata_sbuf_putn(&b, "null", 4);
        strata_sbuf_putn(&b, ",\n", 2);
    }
    strata_sbuf_printf(&b, "  \"pad_token\": null\n}\n");
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
        uint64_t bytes = (uint64_t)strata_model_real_rows(m, i) * (t->ndim > 1 ? (uint64_t)t->shape[1] : 1) * 4;
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
    /* GPT-2's <|endoftext|> is both; a Llama-family tokenizer says its own */
    int eot = tk ? strata_bpe_special_id(tk, "<|endoftext|>") : -1, V = o->cfg.model.vocab_size;
    int eos = tk ? strata_bpe_eos_id(tk) : -1, bos = tk ? strata_bpe_bos_id(tk) : -1;
    if (bos < 0) bos = eos;
    if (eot >= V) eot = -1;
    if (eos >= V) eos = -1;
    if (bos >= V) bos = -1;
    rc = write_configs(dir, &o->cfg, bos, eos);
    int gpt2 = o->cfg.model.arch == STRATA_ARCH_GPT2;
    if (!rc && tk) rc = write_tokenizer(dir, tk, eot, gpt2 ? o->cfg.model.seq_len : o->cfg.model.max_position_embeddings, gpt2);
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
