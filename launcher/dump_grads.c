/* launcher/dump_grads.c: `strata dump-grads` (launcher/dump_grads.h): one forward and
 * backward of a checkpoint's model over one batch, written out with every gradient for
 * tests/torch_reference.py. Its steps: the command line, the checkpoint with the
 * overrides that make it a world-1 stage-0 run, the batch, the forward and backward, the
 * file. */
#include "launcher/dump_grads.h"

#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/device.h"
#include "core/model.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "io/data.h"
#include "shard/engine.h"
#include "launcher/build.h"
#include "launcher/commands.h"

/* The command line. */
typedef struct dump_args {
    const char *what, *out, *data;
    int B, T; /* --batch, --seq; 0: the checkpoint's */
    int cuda; /* --device cuda */
    /* the caller's overrides first; ours last, so the run is always world 1, stage 0, on
     * --device (fp32 on the CPU, bf16 on CUDA) */
    const char *sets[64 + 4];
    int n_sets;
} dump_args;

/* The batch and what one forward and backward made of it, on the host (and the device
 * buffers it went through). B sequences of T tokens, vocabulary V (padded Vp). */
typedef struct dump_batch {
    int B, T, V, Vp;
    int32_t *inputs, *targets; /* (B,T) */
    int32_t *positions;        /* (B,T): each input's position in its document, when the
                                  data marks packed documents and data.document_mask is on
                                  (the batch then trains as the run trains it); else NULL */
    float *logits;             /* (B,T,Vp) as copied; (B,T,V) once compacted */
    float **grads_host;        /* per unit, padded as the engine pads it */
    float loss, pad_max;       /* pad_max: the largest |gradient| in the vocabulary's padding rows */
    float **grads;             /* device: per unit */
    float *logits_f32;         /* device: the logits as fp32 */
    int n_units;
} dump_batch;

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

/* The command line into a, with the overrides that make the run world 1, stage 0, on
 * --device. Returns an exit code (0: go on), the usage error printed. */
static int parse_args(int argc, char **argv, dump_args *a) {
    const char *device = "cpu";
    memset(a, 0, sizeof *a);
    for (int i = 0; i < argc; i++) {
        const char *o = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(o, "--out") && v) a->out = argv[++i];
        else if (!strcmp(o, "--data") && v) a->data = argv[++i];
        else if (!strcmp(o, "--batch") && v) {
            if (parse_positive(o, argv[++i], &a->B)) return STRATA_EXIT_USAGE;
        } else if (!strcmp(o, "--seq") && v) {
            if (parse_positive(o, argv[++i], &a->T)) return STRATA_EXIT_USAGE;
        } else if (!strcmp(o, "--device") && v) {
            device = argv[++i];
            if (strcmp(device, "cpu") && strcmp(device, "cuda")) {
                fprintf(stderr, "strata dump-grads: --device expects cpu or cuda, got '%s'\n", device);
                return STRATA_EXIT_USAGE;
            }
        } else if (!strcmp(o, "--set") && v && a->n_sets < 64) a->sets[a->n_sets++] = argv[++i];
        else if (o[0] != '-' && !a->what) a->what = o;
        else {
            fprintf(stderr, "strata dump-grads: unexpected argument '%s'\n", o);
            return dump_usage();
        }
    }
    if (!a->what || !a->out || !a->data) return dump_usage();
    a->cuda = !strcmp(device, "cuda");
    a->sets[a->n_sets++] = a->cuda ? "device=cuda" : "device=cpu";
    a->sets[a->n_sets++] = "zero.stage=0";
    a->sets[a->n_sets++] = "train.grad_accum=1";
    a->sets[a->n_sets++] = a->cuda ? "train.dtype=bf16" : "train.dtype=fp32";
    return 0;
}

/* The checkpoint and its config, the overrides applied, then --batch and --seq (which
 * a->B and a->T become, whether given or the checkpoint's). Returns an exit code, the
 * error printed; on 0 the caller closes o->ck. */
static int open_checkpoint(dump_args *a, strata_opened_ckpt *o) {
    int rc = strata_open_checkpoint("dump-grads", a->what, a->sets, a->n_sets, o);
    if (rc) return rc;
    strata_config *cfg = &o->cfg;
    char set_b[64], set_t[64];
    if (a->B) snprintf(set_b, sizeof set_b, "train.micro_batch=%d", a->B);
    if (a->T) snprintf(set_t, sizeof set_t, "train.seq_len=%d", a->T);
    if ((a->B && strata_config_set(cfg, set_b)) || (a->T && strata_config_set(cfg, set_t)) ||
        strata_config_check(cfg, "--batch/--seq")) {
        fprintf(stderr, "strata dump-grads: %s\n", strata_error());
        strata_ckpt_close(o->ck);
        return STRATA_EXIT_USAGE;
    }
    a->B = cfg->train.micro_batch;
    a->T = strata_config_seq_len(cfg);
    /* the batch is --data's: the model plans for its documents, not the run's data's */
    snprintf(cfg->data.train, sizeof cfg->data.train, "%s", a->data);
    cfg->data.val[0] = 0;
    cfg->train.logits_chunk_mb = 0; /* every row's logits are dumped: the head holds them all */
    cfg->offload.activations = STRATA_OFFLOAD_NONE; /* the model runs here without the engine's copies */
    if (cfg->train.threads > 0) omp_set_num_threads(cfg->train.threads);
    return 0;
}

/* The host buffers of b for the loaded model; the device ones come with run_batch. */
static void batch_init(dump_batch *b, const strata_model *m, int B, int T) {
    int documents = m->pos != NULL; /* the engine planned for them (launcher/build.c) */
    memset(b, 0, sizeof *b);
    b->B = B;
    b->T = T;
    b->V = m->shape.vocab_size;
    b->Vp = m->shape.padded_vocab_size;
    b->n_units = m->n_units;
    size_t BT = (size_t)B * T;
    b->grads = strata_xcalloc(m->n_units, sizeof *b->grads);
    b->grads_host = strata_xcalloc(m->n_units, sizeof *b->grads_host);
    b->inputs = strata_xmalloc(BT * sizeof(int32_t));
    b->targets = strata_xmalloc(BT * sizeof(int32_t));
    b->positions = documents ? strata_xmalloc(BT * sizeof(int32_t)) : NULL;
    b->logits = strata_xmalloc(BT * b->Vp * sizeof(float));
}

static void batch_free(dump_batch *b, strata_device *dev) {
    for (int u = 0; u < b->n_units; u++) {
        if (b->grads[u]) strata_free(dev, STRATA_MEM_DEVICE, b->grads[u]);
        free(b->grads_host[u]);
    }
    if (b->logits_f32) strata_free(dev, STRATA_MEM_DEVICE, b->logits_f32);
    free(b->grads);
    free(b->grads_host);
    free(b->inputs);
    free(b->targets);
    free(b->positions);
    free(b->logits);
}

/* The first B sequences of GLOB, as the trainer reads them (from sequence 0, unshuffled).
 * 0, or -1 with the error set. */
static int read_batch(dump_batch *b, const char *data, uint64_t seed) {
    strata_loader loader;
    if (strata_loader_open(&loader, data, b->T, b->V, 0, seed)) return -1;
    int rc = strata_loader_read(&loader, 0, b->B, b->inputs, b->targets, b->positions);
    strata_loader_close(&loader);
    return rc ? -1 : 0;
}

/* Zeroed gradient buffers for every unit (the model accumulates into them), their host
 * copies, and the fp32 logits buffer. 0, or -1 with the error set. */
static int alloc_device(dump_batch *b, strata_model *m, const size_t *padded) {
    strata_device *dev = m->dev;
    for (int u = 0; u < m->n_units; u++) {
        b->grads[u] = strata_alloc(dev, STRATA_MEM_DEVICE, padded[u] * sizeof(float));
        if (!b->grads[u]) return -1;
        STRATA_TRY(strata_memset_async(dev, dev->compute, b->grads[u], 0, padded[u] * sizeof(float)));
        m->grads[u] = b->grads[u];
        b->grads_host[u] = strata_xmalloc(padded[u] * sizeof(float));
    }
    b->logits_f32 = strata_alloc(dev, STRATA_MEM_DEVICE, (size_t)b->B * b->T * b->Vp * sizeof(float));
    return b->logits_f32 ? 0 : -1;
}

/* Forward with the loss but without the gradient, so the logits survive to be read;
 * then the head again in training mode (it turns logits into dlogits in place) and the
 * backward of every unit, head first, as the engine's micro-step runs them. The loss,
 * the logits and every gradient are copied to the host. 0, or -1 with the error set. */
static int forward_backward(dump_batch *b, strata_model *m, const size_t *padded, const char *data) {
    strata_device *dev = m->dev;
    size_t BT = (size_t)b->B * b->T, learned = 0;
    for (size_t i = 0; i < BT; i++) learned += b->targets[i] >= 0; /* a masked target is -1 */
    if (strata_model_set_batch(m, b->inputs, b->targets, b->positions)) return strata_fail_wrap("--data %s", data);
    STRATA_TRY(strata_memset_async(dev, dev->compute, m->loss_sum, 0, sizeof(float)));
    for (int u = 0; u < m->n_units; u++) strata_model_forward_unit(m, u, 0, 0.0f, 1.0f / (float)BT);
    dev->k->convert(dev->compute, b->logits_f32, STRATA_F32, m->logits, dev->compute_dtype, BT * b->Vp);
    STRATA_TRY(strata_memcpy_async(dev, dev->compute, b->logits, b->logits_f32, BT * b->Vp * sizeof(float)));
    STRATA_TRY(strata_memcpy_async(dev, dev->compute, &b->loss, m->loss_sum, sizeof(float)));
    /* the mean over the learned targets, as a training step takes it */
    strata_model_forward_unit(m, m->n_units - 1, 1, learned ? 1.0f / (float)learned : 0.0f, 0.0f);
    for (int u = m->n_units - 1; u >= 0; u--) STRATA_TRY(strata_model_backward_unit(m, u));
    for (int u = 0; u < m->n_units; u++)
        STRATA_TRY(strata_memcpy_async(dev, dev->compute, b->grads_host[u], b->grads[u], padded[u] * sizeof(float)));
    STRATA_TRY(strata_stream_sync(dev, dev->compute));
    if (learned != BT) b->loss = learned ? (float)((double)b->loss * ((double)BT / (double)learned)) : 0.0f;
    return 0;
}

/* Checks the results and puts them in the file's shapes: rows V..Vp-1 of the embedding
 * (and of an untied LM head) never meet a token or a target, so their gradient must be
 * exactly 0 (pad_max says how far it is); the logits lose their padding columns. */
static void check_and_compact(dump_batch *b, const strata_model *m) {
    if (!isfinite(b->loss)) STRATA_WARN("export", "loss is %g: the checkpoint or the data is broken", b->loss);
    for (int ti = 0; ti < m->n_tensors; ti++) {
        const strata_param_tensor *t = &m->tensors[ti];
        size_t cols = t->ndim > 1 ? (size_t)t->shape[1] : 1;
        const float *g = b->grads_host[t->unit] + t->offset;
        for (size_t i = (size_t)strata_model_real_rows(m, ti) * cols; i < t->numel; i++) b->pad_max = fmaxf(b->pad_max, fabsf(g[i]));
    }
    for (size_t r = 0; r < (size_t)b->B * b->T; r++)
        memmove(b->logits + r * b->V, b->logits + r * b->Vp, (size_t)b->V * sizeof(float));
}

/* The file: the checkpoint's metadata and the batch's shape, then "loss", "logits",
 * "inputs", "targets", "positions" (packed documents only) and "grad.<name>" for every
 * parameter. 0, or -1 with the error set. */
static int write_dump(const char *out, const strata_opened_ckpt *o, const strata_model *m, const dump_batch *b) {
    strata_st_out w;
    char pad_str[32];
    strata_st_out_init(&w, out);
    strata_st_out_checkpoint_meta(&w, o);
    strata_st_out_meta_int(&w, "strata.batch", b->B);
    strata_st_out_meta_int(&w, "strata.seq_len", b->T);
    snprintf(pad_str, sizeof pad_str, "%.9g", b->pad_max);
    strata_st_out_meta(&w, "strata.wte_padding_grad_max_abs", pad_str);
    strata_st_out_add(&w, "loss", "F32", 1, 1, 0, 0);
    strata_st_out_add(&w, "logits", "F32", 3, b->B, b->T, b->V);
    strata_st_out_add(&w, "inputs", "I32", 2, b->B, b->T, 0);
    strata_st_out_add(&w, "targets", "I32", 2, b->B, b->T, 0);
    int first_grad = 4;
    if (b->positions) {
        strata_st_out_add(&w, "positions", "I32", 2, b->B, b->T, 0);
        first_grad = 5;
    }
    for (int i = 0; i < m->n_tensors; i++) strata_st_out_add_param(&w, "grad.", m, i);
    int rc = strata_st_out_begin(&w) || strata_st_out_write(&w, 0, &b->loss) || strata_st_out_write(&w, 1, b->logits) ||
             strata_st_out_write(&w, 2, b->inputs) || strata_st_out_write(&w, 3, b->targets) ||
             (b->positions && strata_st_out_write(&w, 4, b->positions));
    for (int i = 0; i < m->n_tensors && !rc; i++) {
        const strata_param_tensor *t = &m->tensors[i];
        rc = strata_st_out_write(&w, first_grad + i, b->grads_host[t->unit] + t->offset);
    }
    if (!rc) rc = strata_st_out_commit(&w);
    strata_st_out_free(&w);
    return rc ? -1 : 0;
}

int strata_cmd_dump_grads(int argc, char **argv) {
    dump_args a;
    strata_opened_ckpt o;
    int rc = parse_args(argc, argv, &a);
    if (rc || (rc = open_checkpoint(&a, &o))) return rc;
    strata_loaded l;
    if (strata_load_model(&l, &o.cfg, o.ck)) {
        fprintf(stderr, "strata dump-grads: %s\n", strata_error());
        strata_ckpt_close(o.ck);
        return STRATA_EXIT_ERROR;
    }
    strata_model *m = &l.m;
    const size_t *padded = strata_engine_padded(l.engine);
    dump_batch b;
    batch_init(&b, m, a.B, a.T);
    rc = STRATA_EXIT_ERROR;
    if (read_batch(&b, a.data, o.cfg.train.seed) || alloc_device(&b, m, padded) ||
        forward_backward(&b, m, padded, a.data))
        goto done;
    check_and_compact(&b, m);
    if (write_dump(a.out, &o, m, &b)) goto done;
    printf("wrote %s: loss %.6f over %d x %d tokens, %d gradients (step %lld)\n", a.out, b.loss, b.B, b.T,
           m->n_tensors, (long long)strata_ckpt_get_meta(o.ck)->step);
    rc = STRATA_EXIT_OK;
done:
    if (rc) fprintf(stderr, "strata dump-grads: %s\n", strata_error());
    batch_free(&b, l.dev);
    strata_loaded_free(&l);
    strata_ckpt_close(o.ck);
    return rc;
}
