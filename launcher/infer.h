/* launcher/infer.h: a model's weights on a device for inference (strata sample, strata eval):
 * a checkpoint's or a Hugging Face model's.
 *
 * Inference needs the parameters in the compute dtype and the activations of one batch
 * (for sampling, with every block's keys and values of the tokens so far, so a token costs
 * one row's forward: strata_model_extend), nothing else a training step holds: no gradients, no fp32 master weights, no Adam
 * moments, and none of the run's offload settings. An 8B model that trained with its
 * optimizer (or, at stage 3, its parameters) in host memory samples from 16 GB of bf16
 * weights, not the 76 GB and 62 GB of pinned memory its training engine plans.
 *
 * Where the blocks do not all fit the device's free memory, the ones that do not live in
 * pinned host memory and are copied into one of two device slots ahead of their forward,
 * on a copy stream of their own: block l+1's copy runs beside block l's forward, and a
 * slot is refilled only once the forward that read it is done (events, core/device.h).
 * The embedding and the head stay on the device (a tied head reads the embedding). */
#ifndef STRATA_INFER_H
#define STRATA_INFER_H

#include "core/arena.h"
#include "core/model.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "shard/engine.h"

/* Where the blocks' weights live (--weights of sample and eval: auto, device, host, in this order). */
typedef enum strata_weights_home {
    STRATA_WEIGHTS_AUTO = 0, /* on the device as many blocks as fit, the rest streamed from host memory */
    STRATA_WEIGHTS_DEVICE,   /* every block on the device: refused, with the figures, when it does not fit */
    STRATA_WEIGHTS_HOST,     /* every block streamed from pinned host memory */
} strata_weights_home;

typedef struct strata_infer {
    strata_device *dev;
    strata_model m;
    strata_arena arena;
    int n_streamed;             /* blocks copied in for every forward */
    unsigned char *streamed;    /* per unit: 1 when it lives in host memory */
    void **host;                /* per unit: its pinned copy (streamed units), else NULL */
    void *slot[2];              /* device slots the streamed units are copied into */
    strata_stream *copy;        /* the streamed units' copies */
    strata_event *copied[2];    /* slot k holds the unit the forward reads next */
    strata_event *read[2];      /* the forward that read slot k is done: it may be refilled */
    int next;                   /* during a forward: index of the next streamed unit to copy */
    size_t device_weight_bytes, host_weight_bytes, activation_bytes; /* what it holds, for the summary */
    char from[STRATA_PATH_MAX + 1100]; /* a Hugging Face model's files, for the summary ("" for a checkpoint) */
} strata_infer;

/* The batches an inference model is planned for. */
typedef struct strata_infer_batch {
    int B, T;                  /* at most B sequences of at most T tokens */
    size_t logits_chunk_bytes; /* the head's logits held at once (whole rows, at least one):
                                  sampling reads the last row only, which is all the head
                                  then computes; 0 = every row */
    int documents;             /* batches may hold packed documents (positions) */
    int kv_cache;              /* B 1: every block's q|k|v for T positions, to decode a token at a time */
} strata_infer_batch;
/* Sampling's: one sequence of up to T tokens, one row of logits (the last), and the cache
 * of the positions so far (strata_model_extend). */
#define STRATA_INFER_SAMPLING(tokens) \
    ((strata_infer_batch){.B = 1, .T = (tokens), .logits_chunk_bytes = 1, .kv_cache = 1})

/* Opens cfg's device (cfg->device) and plans and allocates cfg's model for batches as `batch`
 * says, the blocks where `home` says; the weights are loaded next. 0, or -1 with
 * strata_error() set and nothing left open. */
int strata_infer_open(strata_infer *inf, const strata_config *cfg, const strata_infer_batch *batch,
                      strata_weights_home home);
/* Loads every unit from a parameter source (shard/engine.h: a checkpoint's master weights,
 * strata_infer_ckpt_source, or a Hugging Face model, io/pretrained.h), rounded to the
 * compute dtype as training rounds them. The forward is then strata_model_forward_logits(
 * &inf->m, ...), which gives the logits a training engine's model holding the same fp32
 * weights gives, bit for bit. 0, or -1 with strata_error() set (inf stays open). */
int strata_infer_load(strata_infer *inf, strata_param_source source, void *ctx);
/* strata_infer_open, then the weights: ck's (its fp32 master weights, once ck is checked to
 * hold this model's tensors), or with ck NULL those of the Hugging Face model
 * cfg->model.init_from names (io/pretrained.h). On failure nothing is left open. */
int strata_infer_open_weights(strata_infer *inf, const strata_config *cfg, strata_ckpt *ck,
                              const strata_infer_batch *batch, strata_weights_home home);
void strata_infer_close(strata_infer *inf);
/* One line of what it holds where: "weights 14.96 GiB in bf16 on the GPU, activations
 * 912.00 MiB for up to 4096 tokens" (and the streamed blocks, when there are). */
void strata_infer_describe(const strata_infer *inf, char *buf, size_t len);

#endif
