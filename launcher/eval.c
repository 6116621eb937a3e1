/* launcher/eval.c: `strata eval MODEL`: the loss of a checkpoint or a Hugging Face model on
 * token shards, as a run's validation computes it (the mean over the learned targets,
 * packed documents kept apart), from the weights alone (launcher/infer.h): the model
 * before fine-tuning and after, or two checkpoints, on the same held-out data. */
#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "io/data.h"
#include "launcher/commands.h"
#include "launcher/infer.h"

/* The head's logits held at once when evaluating: a 128k vocabulary's are 1 GiB per 4096
 * tokens, which the loss needs one row at a time. */
#define EVAL_LOGITS_CHUNK_BYTES ((size_t)256 << 20)

typedef struct eval_args {
    const char *what, *data, *device;
    long long batches; /* 0: every whole batch of the data */
    int B, T, json;
    int weights; /* --weights: a strata_weights_home */
} eval_args;

static int usage(void) {
    fprintf(stderr, "usage: strata eval CKPT|RUNDIR|HF_MODEL [--data GLOB] [--batches N] [--micro-batch B] [--seq-len T]\n"
                    "                   [--device cpu|cuda] [--weights auto|device|host] [--json]\n");
    return STRATA_EXIT_USAGE;
}

/* A positive integer option's value, at most max; -1 (said) when it is not one. */
static long long positive(const char *opt, const char *v, long long max) {
    char *end = NULL;
    errno = 0;
    long long n = strtoll(v, &end, 10);
    if (!*v || *end || errno || n < 1 || n > max) {
        fprintf(stderr, "strata eval: %s expects an integer from 1 to %lld, got '%s'\n", opt, max, v);
        return -1;
    }
    return n;
}

static int parse_args(int argc, char **argv, eval_args *a) {
    *a = (eval_args){0};
    for (int i = 0; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        long long n = 0;
        if (!strcmp(o, "--data") && v) a->data = argv[++i];
        else if (!strcmp(o, "--device") && v) {
            if (strata_parse_device("eval", (a->device = argv[++i]))) return STRATA_EXIT_USAGE;
        } else if (!strcmp(o, "--weights") && v) {
            if (strata_parse_weights("eval", argv[++i], &a->weights)) return STRATA_EXIT_USAGE;
        } else if (!strcmp(o, "--batches") && v) {
            if ((n = positive(o, argv[++i], 1LL << 40)) < 0) return STRATA_EXIT_USAGE;
            a->batches = n;
        } else if (!strcmp(o, "--micro-batch") && v) {
            if ((n = positive(o, argv[++i], 65536)) < 0) return STRATA_EXIT_USAGE;
            a->B = (int)n;
        } else if (!strcmp(o, "--seq-len") && v) {
            if ((n = positive(o, argv[++i], 1048576)) < 0) return STRATA_EXIT_USAGE;
            a->T = (int)n;
        } else if (!strcmp(o, "--json")) a->json = 1;
        else if (o[0] != '-' && !a->what) a->what = o;
        else { fprintf(stderr, "strata eval: unexpected argument '%s'\n", o); return usage(); }
    }
    return a->what ? 0 : usage();
}

/* The sequence length: --seq-len, else what the shards were packed to, else the run's
 * (a checkpoint) or the model's context up to 1024 (a Hugging Face model); a length other
 * than the packing's is refused, as training refuses it. Returns an exit code. */
static int choose_T(const eval_args *a, const strata_config *cfg, int hf, int *T) {
    int wide = 0, packed = 0;
    if (strata_shards_info(a->data, &wide, &packed, NULL)) {
        fprintf(stderr, "strata eval: --data %s: %s\n", a->data, strata_error());
        return STRATA_EXIT_USAGE;
    }
    int context = cfg->model.seq_len;
    *T = a->T ? a->T : packed > 0 ? packed : hf ? (context < 1024 ? context : 1024) : strata_config_seq_len(cfg);
    if (packed > 0 && *T != packed) {
        fprintf(stderr, "strata eval: --seq-len %d, but %s was packed into sequences of %d tokens (prepare --seq-len): "
                        "evaluate at %d\n", *T, a->data, packed, packed);
        return STRATA_EXIT_USAGE;
    }
    if (*T > context) {
        fprintf(stderr, "strata eval: sequences of %d tokens are more than the model's context, %d (model.seq_len)\n", *T,
                context);
        return STRATA_EXIT_USAGE;
    }
    return 0;
}

/* n_batches micro-batches of B sequences (the first n_batches * B of the data, in order, as a
 * run's validation reads them at world 1): *loss the mean over their learned targets,
 * *learned how many. */
static int eval_pass(strata_infer *inf, strata_loader *L, int B, int n_batches, int docs, double *loss,
                     uint64_t *learned) {
    strata_model *m = &inf->m;
    strata_device *d = inf->dev;
    size_t BT = (size_t)B * L->T;
    int32_t *in = strata_xmalloc(BT * sizeof *in), *tg = strata_xmalloc(BT * sizeof *tg);
    int32_t *pos = docs ? strata_xmalloc(BT * sizeof *pos) : NULL;
    float sum = 0;
    int rc = strata_memset_async(d, d->compute, m->loss_sum, 0, sizeof(float));
    *learned = 0;
    for (int b = 0; b < n_batches && !rc; b++) {
        uint64_t first = (uint64_t)b * (uint64_t)B, n = 0;
        rc = strata_loader_count_learned(L, first, B, &n) || strata_loader_read(L, first, B, in, tg, pos) ||
             strata_model_set_batch(m, in, tg, pos) || strata_model_forward_scored(m, 1.0f / (float)(BT * n_batches));
        *learned += n;
    }
    if (!rc) rc = strata_memcpy_async(d, d->compute, &sum, m->loss_sum, sizeof sum) || strata_stream_sync(d, d->compute);
    free(in);
    free(tg);
    free(pos);
    if (rc) return -1;
    /* the rule of a run's validation: the mean over the learned targets */
    *loss = strata_loss_over_learned(sum, *learned, (uint64_t)BT * (uint64_t)n_batches, L->has_mask);
    return 0;
}

int strata_cmd_eval(int argc, char **argv) {
    eval_args a;
    int rc = parse_args(argc, argv, &a);
    if (rc) return rc;
    strata_opened_ckpt o;
    if ((rc = strata_open_model("eval", a.what, a.device, &o))) return rc;
    int hf = o.ck == NULL;
    if (!a.data) a.data = hf ? NULL : o.cfg.data.val[0] ? o.cfg.data.val : NULL;
    int T = 0;
    strata_loader L;
    int have_data = 0;
    rc = STRATA_EXIT_USAGE;
    if (!a.data) fprintf(stderr, "strata eval: --data GLOB names the token shards to evaluate on (%s)\n",
                         hf ? "a Hugging Face model has none of its own" : "this run had no data.val");
    else if (!choose_T(&a, &o.cfg, hf, &T)) {
        int err = strata_loader_open(&L, a.data, T, o.cfg.model.vocab_size, 0, 0);
        if (err) fprintf(stderr, "strata eval: --data %s: %s\n", a.data, strata_error());
        else have_data = 1;
    }
    int B = a.B ? a.B : hf ? 1 : o.cfg.train.micro_batch;
    if (have_data && !a.B && !a.batches && L.n_chunks < (uint64_t)B) { /* all of a small set in one batch */
        fprintf(stderr, "[eval] %s holds %llu sequences of %d tokens: one micro-batch of them\n", a.data,
                (unsigned long long)L.n_chunks, T);
        B = (int)L.n_chunks;
    }
    uint64_t whole = have_data ? L.n_chunks / (uint64_t)B : 0;
    if (have_data && whole == 0 && !a.batches) {
        fprintf(stderr, "strata eval: %s holds %llu sequences of %d tokens, fewer than one micro-batch of %d "
                        "(--micro-batch)\n", a.data, (unsigned long long)L.n_chunks, T, B);
        have_data = 0;
        strata_loader_close(&L);
    }
    if (have_data) {
        long long n = a.batches ? a.batches : (long long)(whole < (uint64_t)INT32_MAX ? whole : INT32_MAX);
        if ((uint64_t)n * (uint64_t)B > L.n_chunks) /* as a run's validation does: from the start again */
            fprintf(stderr, "[eval] %lld batches of %d take %llu sequences, and %s holds %llu: they repeat from its "
                            "start, as a run's validation repeats them\n", n, B, (unsigned long long)n * B, a.data,
                    (unsigned long long)L.n_chunks);
        {
            int docs = o.cfg.data.document_mask && L.has_docs;
            strata_infer inf;
            strata_infer_batch batch = {.B = B, .T = T, .logits_chunk_bytes = EVAL_LOGITS_CHUNK_BYTES, .documents = docs};
            double loss = 0;
            uint64_t learned = 0;
            rc = STRATA_EXIT_ERROR;
            if (strata_infer_open_weights(&inf, &o.cfg, o.ck, &batch, (strata_weights_home)a.weights)) {
                fprintf(stderr, "strata eval: %s\n", strata_error());
            } else {
                char held[sizeof inf.from + 512];
                strata_infer_describe(&inf, held, sizeof held);
                fprintf(stderr, "[eval] %s\n", held);
                double t0 = strata_now_ms();
                if (eval_pass(&inf, &L, B, (int)n, docs, &loss, &learned)) {
                    fprintf(stderr, "strata eval: %s\n", strata_error());
                } else {
                    double s = (strata_now_ms() - t0) / 1000.0;
                    if (a.json)
                        printf("{\"loss\": %.9g, \"perplexity\": %.9g, \"batches\": %lld, \"micro_batch\": %d, "
                               "\"seq_len\": %d, \"tokens\": %llu, \"learned_tokens\": %llu, \"seconds\": %.3f}\n",
                               loss, exp(loss), n, B, T, (unsigned long long)((uint64_t)n * B * T),
                               (unsigned long long)learned, s);
                    else
                        printf("loss %.6f (perplexity %.4g) over %lld batch%s of %d x %d tokens (%llu learned) of %s, "
                               "%.1f s\n", loss, exp(loss), n, n == 1 ? "" : "es", B, T, (unsigned long long)learned,
                               a.data, s);
                    rc = STRATA_EXIT_OK;
                }
                strata_infer_close(&inf);
            }
        }
        strata_loader_close(&L);
    }
    strata_ckpt_close(o.ck);
    return rc;
}
