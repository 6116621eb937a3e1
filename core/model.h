/* core/model.h: GPT-2 as a list of units, each with one flat parameter buffer.
 *
 * Units, in forward order:
 *   unit 0        embed: transformer.wte.weight (Vp,C; rows V..Vp-1 stay zero),
 *                        transformer.wpe.weight (maxT,C)
 *   unit 1..L     block l = u-1: ln_1 (w,b), attn.c_attn (w (C,3C), b), attn.c_proj (w (C,C), b),
 *                        ln_2 (w,b), mlp.c_fc (w (C,4C), b), mlp.c_proj (w (4C,C), b)
 *   unit L+1      head: transformer.ln_f (w,b); the LM head is tied to wte, so the head
 *                        also READS unit 0's parameters and ADDS to unit 0's gradient.
 * Tensor names are Hugging Face GPT-2's and weights use its Conv1D (in, out) layout, so an
 * export needs no renaming or transposing table.
 *
 * The model owns activations only. Parameters and gradients belong to whoever schedules
 * the units (shard/engine.c): before running unit u it points m->params[u] (compute dtype)
 * and m->grads[u] (fp32, accumulated +=) at wherever the unit lives right now — a
 * replicated buffer, or a slot a ZeRO-3 all-gather just filled. */
#ifndef STRATA_MODEL_H
#define STRATA_MODEL_H

#include <stddef.h>
#include <stdint.h>

#include "core/arena.h"
#include "core/device.h"

#define STRATA_TENSOR_NAME_MAX 128
#define STRATA_TENSOR_MAX_DIMS 4

/* One parameter tensor of the model: its Hugging Face name, the unit whose flat buffer
 * holds it and where. Checkpoints, exports and pretrained readers all address tensors
 * through this table. */
typedef struct strata_param_tensor {
    char name[STRATA_TENSOR_NAME_MAX]; /* "transformer.h.3.attn.c_attn.weight" */
    int unit;
    size_t offset; /* elements from the start of the unit's flat buffer */
    size_t numel;
    int ndim;
    int64_t shape[STRATA_TENSOR_MAX_DIMS];
} strata_param_tensor;

/* The model's parameter layout, which a checkpoint records and checks: units of flat
 * buffers, tensors inside them. The tensors of a unit tile [0, unit_numel) in offset
 * order without gaps. */
typedef struct strata_param_layout {
    int n_units;
    const size_t *unit_numel;  /* real elements */
    const size_t *unit_padded; /* padded elements (a multiple of every world size used) */
    int n_tensors;
    const strata_param_tensor *tensors;
} strata_param_layout;

typedef struct strata_model_shape {
    int n_layer, n_head, n_embd;
    int max_seq_len; /* rows of wpe */
    int vocab_size, padded_vocab_size;
    float init_std;
} strata_model_shape;

enum { STRATA_UNIT_EMBED = 0, STRATA_UNIT_BLOCK = 1, STRATA_UNIT_HEAD = 2 };

typedef struct strata_unit {
    int kind;
    int layer;          /* block index, -1 otherwise */
    size_t numel;       /* parameters in the flat buffer */
    int first_tensor;   /* into strata_model.tensors */
    int n_tensors;
} strata_unit;

/* Activations of one block (B,T,...) — the shapes in the comments of model.c. */
typedef struct strata_block_acts {
    void *ln1;      /* (B,T,C) */
    float *ln1_mean, *ln1_rstd; /* (B,T) */
    void *qkv;      /* (B,T,3C) */
    void *atty;     /* (B,T,C) attention output before c_proj */
    float *att_lse; /* (B,NH,T) */
    void *resid2;   /* (B,T,C) x + attn(ln1(x)) */
    void *ln2;      /* (B,T,C) */
    float *ln2_mean, *ln2_rstd;
    void *fch;      /* (B,T,4C) c_fc pre-activation */
    void *fch_gelu; /* (B,T,4C) */
} strata_block_acts;

typedef struct strata_model {
    strata_model_shape shape;
    strata_device *dev;
    int B, T;                    /* the batch the activations were planned for */
    int cur_B, cur_T;            /* the batch being run (<= B, T; sampling runs B=1, short T) */
    int ckpt_every;              /* activation checkpointing: 0 none, K: recompute blocks l%K==0 */

    int n_units;
    strata_unit *units;
    size_t *unit_numel;          /* units[u].numel, as an array for the checkpoint layout */
    int n_tensors;
    strata_param_tensor *tensors; /* names, shapes, unit offsets */
    unsigned char *decay;        /* per tensor: 1 for 2-D weights (weight decay applies) */

    void **params;   /* per unit, set by the engine before running it */
    float **grads;   /* per unit, set by the engine before running its backward */

    /* activations (arena) */
    void **resid;             /* L+1 residual streams (B,T,C); resid[0] = embeddings */
    strata_block_acts *acts;  /* per block; blocks recomputed in backward share `recompute` */
    strata_block_acts recompute;
    void *scratch_btc;        /* (B,T,C) c_proj outputs before the residual add */
    void *lnf;                /* (B,T,C) */
    float *lnf_mean, *lnf_rstd;
    void *logits;             /* (B,T,Vp); holds dlogits after a training forward */
    float *losses;            /* (B,T) */
    float *loss_sum;          /* (1) accumulated mean loss of the step */
    /* gradient buffers for backward (arena) */
    void *dresid;             /* (B,T,C) gradient of the residual stream being walked */
    void *dbtc;               /* (B,T,C) */
    void *dbtc2;              /* (B,T,C) */
    void *dqkv;               /* (B,T,3C) */
    void *dfch;               /* (B,T,4C) */
    int32_t *inputs, *targets; /* (B,T) on the device */
    /* the kernel profile (core/profile.h), set by the engine for the span of a profiled
     * training step; NULL otherwise (eval, sampling, and every run without STRATA_PROFILE) */
    struct strata_prof *prof;
} strata_model;

/* Builds the unit and tensor tables (no memory for parameters). */
void strata_model_init(strata_model *m, const strata_model_shape *shape);
void strata_model_free(strata_model *m);
size_t strata_model_num_params(const strata_model *m); /* real parameters (V rows, not Vp) */
/* Training FLOPs per token at context T (forward + backward, the usual 6N + 12 L C T with
 * N the parameters that multiply: blocks and the tied head; embeddings are lookups). */
double strata_model_flops_per_token(const strata_model *m, int T);
/* The layout checkpoints use; unit_padded supplied by the engine. */
strata_param_layout strata_model_layout(const strata_model *m, const size_t *unit_padded);

/* Reserves activation memory for micro-batch B x T in the arena, with activations in
 * `dtype` (the device's compute dtype; dev may be NULL for a plan that is only printed). */
void strata_model_plan(strata_model *m, strata_arena *a, strata_device *dev, strata_dtype dtype, int B,
                       int T, int ckpt_every);

/* Fills elements [lo, hi) of unit u's flat fp32 buffer with the initial values, a pure
 * function of (seed, tensor, element index) so any rank can init any shard. */
void strata_model_init_params(const strata_model *m, int u, uint64_t seed, size_t lo, size_t hi,
                              float *dst);

/* Uploads a micro-batch's tokens (host int32 (B,T)) to the device buffers: the one way
 * into m->inputs and m->targets, so the one place ids are checked. An input outside
 * [0, vocab_size) or a target >= vocab_size (negative: ignored) is refused, naming the id,
 * its row and position, before anything is copied: 0, or -1 with strata_error() set. */
int strata_model_set_batch(strata_model *m, const int32_t *inputs, const int32_t *targets);

/* Forward of one unit. The head computes the loss: losses (B,T), *loss_sum += mean over
 * the B*T tokens times loss_scale; when `train`, it leaves dlogits in place, scaled by
 * dloss (the weight of one token in the step's mean loss). */
void strata_model_forward_unit(strata_model *m, int u, int train, float dloss, float loss_scale);
/* Backward of one unit, in reverse order (head first). Accumulates into m->grads[u]
 * (and m->grads[0] for the head's tied weight). 0, or -1 when a device call failed (a
 * kernel's own failure is a recorded device fault, core/common.h). */
int strata_model_backward_unit(strata_model *m, int u);

/* Inference for sampling, all units resident: forward over host tokens (B,T) with B, T
 * at most the planned ones; logits (B,T,Vp) are left in m->logits. */
int strata_model_forward_logits(strata_model *m, const int32_t *tokens, int B, int T); /* 0, or -1: a bad id */

#endif
