/* core/model.h: the model as a list of units, each with one flat parameter buffer, for
 * either family Strata computes (model.arch): GPT-2 (core/model_gpt2.c) and the Llama
 * family (core/model_llama.c: Llama 2/3, Mistral, Qwen2/2.5, Qwen3).
 *
 * Units, in forward order, in both families:
 *   unit 0        embed: the token embedding (Vp,C; rows V..Vp-1 stay zero), and GPT-2's
 *                        learned positions
 *   unit 1..L     block l = u-1
 *   unit L+1      head: the final norm, and an LM head of its own when it is not tied; a tied
 *                        head READS unit 0's parameters and ADDS to unit 0's gradient.
 * Tensor names are Hugging Face's (GPT-2's Conv1D (in, out) layout; the Llama family's
 * nn.Linear (out, in)), so exports and model.init_from need no renaming table. Each family
 * file lists its tensors and shapes.
 *
 * The family-specific parts (the tensor tables, the activations and their plan, forward and
 * backward of a unit, the init rule, FLOPs) are a table of functions each family fills in
 * (core/model_family.h); this interface and core/model.c are all the engine, the tiers and
 * the checkpoint code see, so none of them knows which family it runs.
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

typedef enum { STRATA_ARCH_GPT2 = 0, STRATA_ARCH_LLAMA = 1 } strata_arch;
/* RoPE's inverse frequencies: the plain ones (theta^(-2i/hd)), or Llama 3.1's rescaling of
 * the long wavelengths (transformers' rope_type "llama3") */
typedef enum { STRATA_ROPE_DEFAULT = 0, STRATA_ROPE_LLAMA3 = 1 } strata_rope_type;

typedef struct strata_model_shape {
    int n_layer, n_head, n_embd;
    int max_seq_len; /* GPT-2: rows of wpe; the Llama family: the longest context planned */
    int vocab_size, padded_vocab_size;
    float init_std;
    /* the family, and what only the Llama family reads (GPT-2 leaves them 0) */
    int arch;              /* strata_arch */
    int n_kv_head;         /* NKV key/value heads; n_head a multiple of it (0: n_head) */
    int head_dim;          /* hd; may differ from n_embd / n_head (0: n_embd / n_head) */
    int intermediate_size; /* I, the SwiGLU MLP's width */
    double rope_theta;     /* RoPE's base */
    int rope_type;         /* strata_rope_type */
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor; /* llama3 */
    int rope_original_context; /* llama3: original_max_position_embeddings */
    float rms_norm_eps;
    int tie_embeddings; /* the LM head reads the token embedding (GPT-2: always) */
    int qkv_bias;       /* q, k and v projections have biases (Qwen2) */
    int qk_norm;        /* per-head RMSNorm of q and k before RoPE (Qwen3) */
} strata_model_shape;

enum { STRATA_UNIT_EMBED = 0, STRATA_UNIT_BLOCK = 1, STRATA_UNIT_HEAD = 2 };

typedef struct strata_unit {
    int kind;
    int layer;          /* block index, -1 otherwise */
    size_t numel;       /* parameters in the flat buffer */
    int first_tensor;   /* into strata_model.tensors */
    int n_tensors;
} strata_unit;

struct strata_model_family; /* core/model_family.h */

typedef struct strata_model {
    strata_model_shape shape;
    const struct strata_model_family *family; /* chosen by shape.arch */
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
    unsigned char *vocab_rows;   /* per tensor: 1 when it has a row per padded vocabulary entry
                                    (the embedding, an untied LM head): rows >= V are padding */

    void **params;   /* per unit, set by the engine before running it */
    float **grads;   /* per unit, set by the engine before running its backward */

    /* activations both families have (arena) */
    /* the residual streams (B,T,C): stream l (0: the embeddings, l: block l-1's output) in
     * buffer l % resid_slots (strata_model_resid) */
    void **resid;
    int resid_slots;          /* L+1, or fewer (offload.activations) */
    void *logits;             /* (head_rows,Vp); holds dlogits after a training forward */
    int head_rows;            /* rows of logits held at once: B*T, or fewer (train.logits_chunk_mb) */
    int mlp_rows;             /* rows the blocks' MLPs take at a time: B*T, or fewer */
    int logits_first;         /* strata_model_forward_logits: the row m->logits starts at */
    float head_dloss, head_loss_scale; /* a chunked head's training forward, for its backward */
    float *losses;            /* (B,T) */
    float *loss_sum;          /* (1) accumulated mean loss of the step */
    void *dresid;             /* (B,T,C) gradient of the residual stream being walked */
    int32_t *inputs, *targets; /* (B,T) on the device */
    int32_t *order;           /* (B,T) on the device: the inputs' positions by token (strata_token_order) */
    int32_t *order_host;      /* (B,T) host staging for order */
    int32_t *token_counts;    /* (V+1) host: the counting sort's scratch */
    /* packed documents (strata_model_plan_opts.documents): each input's position in its
     * document (device), and (GPT-2's learned positions) the positions sorted by it, as
     * order is by token, with its host staging and counting sort's scratch; NULL when not
     * planned */
    int32_t *pos, *pos_order, *pos_order_host, *pos_counts;
    const int32_t *cur_pos;   /* what the kernels get: pos, or NULL while the batch's rows are
                                 each one document (or no positions were given) */
    /* the family's own activations, gradient buffers and constants (arena): a struct only
     * its file knows (GPT-2's gpt2_acts, the Llama family's llama_acts) */
    void *acts;
    int constants_ready;      /* the family's constants (RoPE's frequencies) are on the device */
    /* the kernel profile (core/profile.h), set by the engine for the span of a profiled
     * training step; NULL otherwise (eval, sampling, and every run without STRATA_PROFILE) */
    struct strata_prof *prof;
    /* strata_model_forward_logits calls it, when set, before each unit's forward, to make
     * m->params[u] ready (launcher/infer.c copies blocks in from host memory): 0, or -1 */
    int (*before_unit)(void *ctx, struct strata_model *m, int u);
    void *before_unit_ctx;
    /* incremental decoding (strata_model_extend; strata_model_plan_opts.kv_cache): per
     * block, the q|k|v rows of the kv_len positions seen so far (at most T), NULL when not
     * planned; the rows being added: their positions (device), and their host staging */
    void **kv;
    int kv_len;
    int extending; /* during strata_model_extend's forward: the families read the cache */
    int32_t *kv_pos, *kv_pos_host;
    int32_t *kv_ids; /* host: the tokens whose rows the cache holds, kv_len of them */
} strata_model;

/* Residual stream l's device buffer. */
static inline void *strata_model_resid(const strata_model *m, int l) { return m->resid[l % m->resid_slots]; }

/* Builds the unit and tensor tables of shape->arch's family (no memory for parameters). */
void strata_model_init(strata_model *m, const strata_model_shape *shape);
/* "gpt2" or "llama" */
const char *strata_model_family_name(const strata_model *m);
void strata_model_free(strata_model *m);
size_t strata_model_num_params(const strata_model *m); /* real parameters (V rows, not Vp) */
/* Rows of tensor ti that hold the model's values: vocab_size for the tensors with a row per
 * padded vocabulary entry, shape[0] for every other (1-D tensors: their length). */
int64_t strata_model_real_rows(const strata_model *m, int ti);
/* Training FLOPs per token at context T (forward + backward, the usual 6N + 12 L H T with
 * N the parameters that multiply: blocks and the head; embeddings are lookups; H the width
 * of the attention's queries, n_head * head size). */
double strata_model_flops_per_token(const strata_model *m, int T);
/* RoPE's inverse frequencies of a Llama-family shape (head_dim / 2 floats), as
 * transformers computes them in fp32 (core/model_llama.c). */
void strata_model_rope_inv_freq(const strata_model_shape *s, float *inv_freq);
/* The most kernel calls one micro-step's forward and backward time under the kernel
 * profile (core/profile.h). */
int strata_model_timed_calls(const strata_model *m);
/* The layout checkpoints use; unit_padded supplied by the engine. */
strata_param_layout strata_model_layout(const strata_model *m, const size_t *unit_padded);

/* How the activations are laid out (strata_model_plan). */
typedef struct strata_model_plan_opts {
    int ckpt_every; /* activation checkpointing: 0 none, K: blocks l % K == 0 recomputed */
    /* > 0: the head holds at most that many bytes of logits at once (whole rows, at least
     * one), computing the classifier and the loss a chunk of rows at a time */
    size_t logits_chunk_bytes;
    /* > 0: likewise the blocks' MLPs, their widest activation (Llama's gate|up, GPT-2's c_fc
     * output) at most that many bytes at once: the activations they keep between forward
     * and backward are then a chunk's where blocks are recomputed (only their inputs stay),
     * and their gradient buffers a chunk's everywhere */
    size_t mlp_chunk_bytes;
    /* > 0: the L+1 residual streams share this many device buffers, resid[l] in buffer
     * l % resid_slots (offload.activations: the rest are copied to and from host memory
     * around their use, shard/acts_home.c); 0: one each */
    int resid_slots;
    /* 1: batches may hold packed documents (strata_model_set_batch's positions): reserves
     * the buffers their positions need */
    int documents;
    /* 1: a cache of every block's q|k|v rows for T positions, for strata_model_extend (B 1) */
    int kv_cache;
} strata_model_plan_opts;

/* Reserves activation memory for micro-batch B x T in the arena, with activations in
 * `dtype` (the device's compute dtype; dev may be NULL for a plan that is only printed),
 * laid out as o says. */
void strata_model_plan(strata_model *m, strata_arena *a, strata_device *dev, strata_dtype dtype, int B,
                       int T, const strata_model_plan_opts *o);
/* Whole rows of row_bytes each that fit in chunk_bytes, at least 1, at most all n of them
 * (chunk_bytes 0: all of them). */
int strata_model_chunk_rows(size_t chunk_bytes, size_t row_bytes, size_t n);

/* Fills elements [lo, hi) of unit u's flat fp32 buffer with the initial values, a pure
 * function of (seed, tensor, element index) so any rank can init any shard. */
void strata_model_init_params(const strata_model *m, int u, uint64_t seed, size_t lo, size_t hi,
                              float *dst);

/* order (n) = the positions 0..n-1 sorted by tok[position], ties in position order: a
 * counting sort over count (V+1 entries, scratch). The embedding's backward adds each
 * token's rows in this order, so its sums do not depend on thread timing. */
void strata_token_order(const int32_t *tok, size_t n, int V, int32_t *count, int32_t *order);

/* Uploads a micro-batch's tokens (host int32 (B,T)) to the device buffers: the one way
 * into m->inputs, m->targets and m->order, so the one place ids are checked. An input outside
 * [0, vocab_size) or a target >= vocab_size (negative: ignored) is refused, naming the id,
 * its row and position, before anything is copied: 0, or -1 with strata_error() set. The
 * first call also uploads the family's constants (the Llama family's RoPE frequencies),
 * so every forward comes after one.
 * positions (host int32 (B,T), or NULL: each row one document) is each input's position in
 * its document (io/data.h's strata_loader_read): the attention then stays within each
 * document, and positions (RoPE's, GPT-2's learned ones) count from each document's start,
 * as if every document were alone in its row. Needs a plan with documents; a position that
 * does not follow the one before it (0, or the previous one + 1) is refused. */
int strata_model_set_batch(strata_model *m, const int32_t *inputs, const int32_t *targets,
                           const int32_t *positions);

/* Forward of one unit. The head computes the loss: losses (B,T), *loss_sum += mean over
 * the B*T tokens times loss_scale; when `train`, it leaves dlogits in place, scaled by
 * dloss (the weight of one token in the step's mean loss). */
void strata_model_forward_unit(strata_model *m, int u, int train, float dloss, float loss_scale);
/* Backward of one unit, in reverse order (head first). Accumulates into m->grads[u]
 * (and m->grads[0] for a tied head's weight). 0, or -1 when a device call failed (a
 * kernel's own failure is a recorded device fault, core/common.h). */
int strata_model_backward_unit(strata_model *m, int u);

/* Inference for sampling, every unit's parameters resident or made ready by
 * m->before_unit: forward over host tokens (B,T) with B, T
 * at most the planned ones; the logits of rows [m->logits_first, B*T) are left in
 * m->logits (all of them, first 0, unless the head holds fewer rows: then the last
 * m->head_rows, the rows sampling reads). */
int strata_model_forward_logits(strata_model *m, const int32_t *tokens, int B, int T); /* 0, or -1: a bad id */
/* Decoding a token at a time (a plan with kv_cache, B 1): the forward of n more tokens
 * after the m->kv_len whose q|k|v rows the cache holds (positions kv_len .. kv_len+n-1,
 * at most T in all), which attend to those and to each other; only the new rows' q|k|v are
 * computed, and added to the cache. The last row's logits are left as
 * strata_model_forward_logits leaves them (m->logits_first). strata_model_forward_logits
 * over the same tokens gives the same logits, up to the order of their sums (each row of
 * a matrix product computed in a batch of other rows). 0, or -1: a bad id.
 * m->kv_ids holds the tokens the cache is of; m->kv_len = k keeps the first k. */
int strata_model_extend(strata_model *m, const int32_t *tokens, int n);
/* Evaluation with every unit's parameters resident or made ready by m->before_unit: the
 * forward of the batch strata_model_set_batch uploaded (targets and positions included),
 * *m->loss_sum += the mean loss over its B*T rows times loss_scale. 0, or -1. */
int strata_model_forward_scored(strata_model *m, float loss_scale);

#endif
