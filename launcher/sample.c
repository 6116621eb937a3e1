/* launcher/sample.c: sampling, and `strata sample CKPT`. */
#include "launcher/sample.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "core/arena.h"
#include "core/checkpoint.h"
#include "core/config.h"
#include "launcher/build.h"
#include "launcher/commands.h"
#include "launcher/tokenizer.h"
#include "shard/comm.h"
#include "shard/engine.h"

static float bf16_to_f32(uint16_t h) {
    uint32_t u = (uint32_t)h << 16;
    float f;
    memcpy(&f, &u, 4);
    return f;
}

typedef struct { float p; int id; } cand;
static int cand_desc(const void *a, const void *b) {
    float x = ((const cand *)a)->p, y = ((const cand *)b)->p;
    if (x != y) return x < y ? 1 : -1;
    return ((const cand *)a)->id - ((const cand *)b)->id;
}

int strata_generate(strata_model *m, int32_t *tokens, int n_prompt, int n_new, float temperature,
                    int top_k, strata_rng *rng) {
    int V = m->shape.vocab_size, Vp = m->shape.padded_vocab_size, T = m->T;
    size_t es = strata_dtype_size(m->dev->compute_dtype);
    void *row = strata_xmalloc((size_t)Vp * es);
    cand *c = strata_xmalloc((size_t)V * sizeof *c);
    for (int i = 0; i < n_new; i++) {
        int n = n_prompt + i;
        int start = n > T ? n - T : 0, t = n - start;
        if (t == 0) { /* empty prompt on a byte-level model: start from a newline */
            tokens[n] = '\n' < V ? '\n' : 0;
            continue;
        }
        strata_model_forward_logits(m, tokens + start, 1, t);
        strata_memcpy_async(m->dev, m->dev->compute, row, (char *)m->logits + (size_t)(t - 1) * Vp * es, (size_t)Vp * es);
        strata_stream_sync(m->dev, m->dev->compute);
        float maxv = -INFINITY;
        for (int v = 0; v < V; v++) {
            float x = es == 4 ? ((float *)row)[v] : bf16_to_f32(((uint16_t *)row)[v]);
            c[v] = (cand){x, v};
            if (x > maxv) maxv = x;
        }
        int next = 0;
        if (temperature <= 0.0f) {
            for (int v = 1; v < V; v++) if (c[v].p > c[next].p) next = v;
        } else {
            double sum = 0;
            for (int v = 0; v < V; v++) {
                c[v].p = expf((c[v].p - maxv) / temperature);
                sum += c[v].p;
            }
            int k = V;
            if (top_k > 0 && top_k < V) {
                qsort(c, V, sizeof *c, cand_desc);
                k = top_k;
                sum = 0;
                for (int v = 0; v < k; v++) sum += c[v].p;
            }
            double r = strata_rng_uniform(rng) * sum, acc = 0;
            next = c[k - 1].id;
            for (int v = 0; v < k; v++) {
                acc += c[v].p;
                if (r < acc) {
                    next = c[v].id;
                    break;
                }
            }
        }
        tokens[n] = next;
    }
    free(row);
    free(c);
    return 0;
}

void strata_write_tokens(FILE *f, const int32_t *tokens, int n, int vocab_size, const strata_tokenizer *tk,
                         const strata_bpe *bpe) {
    /* byte-level models keep the escaping below for bytes that are not text */
    if (bpe && !strata_bpe_is_bytes(bpe)) {
        size_t len = 0;
        char *text = strata_bpe_decode(bpe, tokens, (size_t)(n > 0 ? n : 0), &len);
        fwrite(text, 1, len, f);
        free(text);
        return;
    }
    for (int i = 0; i < n; i++) {
        int t = tokens[i];
        if (tk && t >= 0 && t < tk->vocab_size) {
            fwrite(tk->pieces[t], 1, tk->lens[t], f);
        } else if (vocab_size <= 256) {
            unsigned char ch = (unsigned char)t;
            if (ch == '\n' || ch == '\t' || (ch >= 32 && ch != 127)) fputc(ch, f);
            else fprintf(f, "\\x%02x", ch);
        } else {
            fprintf(f, "<%d>", t);
        }
    }
}

int strata_open_checkpoint(const char *cmd, const char *what, const char *const *sets, int n_sets,
                           strata_opened_ckpt *o) {
    memset(o, 0, sizeof *o);
    if (strata_ckpt_resolve(what, ".", o->dir, sizeof o->dir)) {
        fprintf(stderr, "strata %s: %s\n", cmd, strata_error());
        return STRATA_EXIT_USAGE;
    }
    o->ck = strata_ckpt_open(o->dir);
    if (!o->ck) {
        fprintf(stderr, "strata %s: %s\n", cmd, strata_error());
        return STRATA_EXIT_ERROR;
    }
    char name[STRATA_PATH_MAX + 32];
    snprintf(name, sizeof name, "%s/manifest.yaml", o->dir);
    /* the weights are the checkpoint's: the run's model.init_from need not exist any more */
    const char *all[64 + 1];
    int n_all = 0;
    for (int i = 0; i < n_sets && i < 64; i++) all[n_all++] = sets[i];
    all[n_all++] = "model.init_from=";
    if (strata_config_load_string(&o->cfg, name, strata_ckpt_get_meta(o->ck)->config_yaml, all, n_all)) {
        fprintf(stderr, "strata %s: %s\n", cmd, strata_error());
        strata_ckpt_close(o->ck);
        o->ck = NULL;
        return STRATA_EXIT_ERROR;
    }
    return STRATA_EXIT_OK;
}

/* The BPE encoder's sink for a prompt: ids into a growing array. */
typedef struct ids_buf {
    int32_t *ids;
    size_t n, cap;
} ids_buf;

static int collect_ids(void *ctx, const int32_t *ids, size_t n) {
    ids_buf *b = ctx;
    if (b->n + n > b->cap) {
        b->cap = (b->n + n) * 2;
        b->ids = strata_xrealloc(b->ids, b->cap * sizeof *b->ids);
    }
    memcpy(b->ids + b->n, ids, n * sizeof *ids);
    b->n += n;
    return 0;
}

static int usage(void) {
    fprintf(stderr, "usage: strata sample CKPT|RUNDIR [--prompt TEXT] [--tokens N] [--temperature T]\n"
                    "                     [--top-k K] [--seed S] [--tokenizer FILE]\n");
    return STRATA_EXIT_USAGE;
}

int strata_cmd_sample(int argc, char **argv) {
    const char *what = NULL, *prompt = "", *tok_path = NULL;
    int n_tokens = 200, top_k = 0;
    double temperature = 1.0;
    uint64_t seed = 1337;
    for (int i = 0; i < argc; i++) {
        const char *a = argv[i];
        const char *v = i + 1 < argc ? argv[i + 1] : NULL;
        char *end = NULL;
        if (!strcmp(a, "--prompt") && v) prompt = argv[++i];
        else if (!strcmp(a, "--tokenizer") && v) tok_path = argv[++i];
        else if (!strcmp(a, "--tokens") && v) {
            n_tokens = (int)strtol(argv[++i], &end, 10);
            if (*end || n_tokens < 1) { fprintf(stderr, "strata sample: --tokens expects a positive integer, got '%s'\n", v); return STRATA_EXIT_USAGE; }
        } else if (!strcmp(a, "--top-k") && v) {
            top_k = (int)strtol(argv[++i], &end, 10);
            if (*end || top_k < 0) { fprintf(stderr, "strata sample: --top-k expects an integer >= 0, got '%s'\n", v); return STRATA_EXIT_USAGE; }
        } else if (!strcmp(a, "--temperature") && v) {
            temperature = strtod(argv[++i], &end);
            if (*end || !(temperature >= 0)) { fprintf(stderr, "strata sample: --temperature expects a number >= 0, got '%s'\n", v); return STRATA_EXIT_USAGE; }
        } else if (!strcmp(a, "--seed") && v) {
            seed = strtoull(argv[++i], &end, 10);
            if (*end) { fprintf(stderr, "strata sample: --seed expects an integer, got '%s'\n", v); return STRATA_EXIT_USAGE; }
        } else if (a[0] != '-' && !what) what = a;
        else { fprintf(stderr, "strata sample: unexpected argument '%s'\n", a); return usage(); }
    }
    if (!what) return usage();

    /* the checkpoint's own model, on one rank and replicated: any saved world and stage load */
    const char *sets[] = {"zero.stage=0", "train.micro_batch=1", "train.grad_accum=1"};
    strata_opened_ckpt o;
    int orc = strata_open_checkpoint("sample", what, sets, 3, &o);
    if (orc) return orc;
    strata_ckpt *ck = o.ck;
    strata_config cfg = o.cfg;
    int rc = STRATA_EXIT_ERROR;
    /* --tokenizer: llm.c's .bin (decoding only) or a Hugging Face BPE; default: the run's */
    strata_tokenizer tk = {0};
    int have_tk = 0, failed = 0;
    strata_bpe *bpe = NULL;
    if (tok_path && strlen(tok_path) > 4 && !strcmp(tok_path + strlen(tok_path) - 4, ".bin")) {
        if (strata_tokenizer_load(&tk, tok_path)) failed = 1;
        have_tk = !failed;
    } else if (tok_path) {
        failed = !(bpe = strata_bpe_load(tok_path));
    } else {
        bpe = strata_ckpt_tokenizer(o.dir, &failed);
    }
    if (failed) {
        fprintf(stderr, "strata sample: tokenizer: %s\n", strata_error());
        strata_ckpt_close(ck);
        return STRATA_EXIT_USAGE;
    }
    /* the prompt as token ids: the BPE's, or bytes for a byte-level model */
    size_t n_prompt = 0;
    int32_t *prompt_ids = NULL;
    if (bpe) {
        ids_buf b = {0};
        if (strata_bpe_encode(bpe, prompt, strlen(prompt), "--prompt", collect_ids, &b)) {
            fprintf(stderr, "strata sample: %s\n", strata_error());
            free(b.ids);
            strata_bpe_free(bpe);
            strata_ckpt_close(ck);
            return STRATA_EXIT_USAGE;
        }
        prompt_ids = b.ids;
        n_prompt = b.n;
    } else if (prompt[0]) {
        n_prompt = strlen(prompt);
        prompt_ids = strata_xmalloc(n_prompt * sizeof(int32_t));
        for (size_t i = 0; i < n_prompt; i++) prompt_ids[i] = (unsigned char)prompt[i];
        if (cfg.model.vocab_size > 256) {
            fprintf(stderr, "strata sample: --prompt needs the model's tokenizer: this checkpoint has vocab_size %d and "
                            "its run recorded none (pass --tokenizer tokenizer.json or a model directory)\n",
                    cfg.model.vocab_size);
            free(prompt_ids);
            strata_ckpt_close(ck);
            if (have_tk) strata_tokenizer_free(&tk);
            return STRATA_EXIT_USAGE;
        }
    }
    for (size_t i = 0; i < n_prompt; i++) {
        if (prompt_ids[i] >= cfg.model.vocab_size) {
            size_t len = 0;
            const unsigned char *text = bpe ? strata_bpe_token_bytes(bpe, prompt_ids[i], &len) : NULL;
            fprintf(stderr, "strata sample: --prompt: token %d (\"%.*s\") is outside the model's vocabulary of %d "
                            "(is this the tokenizer the model was trained with?)\n", prompt_ids[i], (int)len,
                    text ? (const char *)text : "", cfg.model.vocab_size);
            free(prompt_ids);
            strata_bpe_free(bpe);
            strata_ckpt_close(ck);
            return STRATA_EXIT_USAGE;
        }
    }
    /* an empty prompt on a GPT-2 vocabulary starts, as GPT-2 does, from <|endoftext|> */
    int eot = bpe ? strata_bpe_special_id(bpe, "<|endoftext|>") : -1;
    int start_eot = n_prompt == 0 && eot >= 0 && eot < cfg.model.vocab_size;
    strata_loaded l;
    int loaded = strata_load_model(&l, &cfg, ck) == 0;
    int32_t *tokens = strata_xcalloc(n_prompt + (size_t)n_tokens + 1, sizeof(int32_t));
    for (size_t i = 0; i < n_prompt; i++) tokens[i] = prompt_ids[i];
    if (start_eot) tokens[n_prompt++] = eot;
    free(prompt_ids);
    strata_rng rng;
    strata_rng_seed(&rng, seed);
    if (!loaded || strata_generate(&l.m, tokens, (int)n_prompt, n_tokens, (float)temperature, top_k, &rng)) {
        fprintf(stderr, "strata sample: %s\n", strata_error());
    } else {
        int skip = start_eot ? 1 : 0; /* the <|endoftext|> we started from is not part of the text */
        strata_write_tokens(stdout, tokens + skip, (int)n_prompt - skip + n_tokens, cfg.model.vocab_size,
                            have_tk ? &tk : NULL, bpe);
        fputc('\n', stdout);
        rc = STRATA_EXIT_OK;
    }
    free(tokens);
    if (loaded) strata_loaded_free(&l);
    strata_ckpt_close(ck);
    if (have_tk) strata_tokenizer_free(&tk);
    strata_bpe_free(bpe);
    return rc;
}
