/* core/model_family.h: what a model family fills in, and what core/model.c lends it.
 *
 * A family (core/model_gpt2.c, core/model_llama.c) is one table of functions: its unit
 * and tensor tables, the plan of its activations, the forward and backward of a unit, how
 * each tensor starts, its FLOPs. core/model.c holds what both share (the unit and tensor
 * bookkeeping, the residual streams, logits and losses, set_batch, the layout) and
 * dispatches through m->family; nothing outside core/ includes this header. */
#ifndef STRATA_MODEL_FAMILY_H
#define STRATA_MODEL_FAMILY_H

#include <stddef.h>
#include <stdint.h>

#include "core/arena.h"
#include "core/profile.h"

/* core/model.h's, which includes this file's users but not this file (no loop of
 * includes: model.c needs the table, the table names the model) */
struct strata_model;
typedef struct strata_model strata_model;

/* How a tensor starts: std > 0, normal(0, std) drawn from (seed, tensor, element); else
 * every element `value`. Rows past the vocabulary (strata_model.vocab_rows) are 0 either
 * way. */
typedef struct strata_init_rule {
    float std;
    float value;
} strata_init_rule;

/* The embedding and the head have at most this many tensors in either family. */
#define STRATA_FAMILY_UNIT_TENSORS 4

typedef struct strata_model_family {
    const char *name;  /* "gpt2", "llama" */
    int learned_positions; /* an embedding of positions (GPT-2's wpe), whose backward needs
                              the batch's positions sorted (strata_model.pos_order) */
    int block_tensors; /* the most tensors a block of the family has */
    /* The units (strata_model_set_unit) and their tensors (strata_model_add_tensor), in
     * flat-buffer order. */
    void (*build)(strata_model *m);
    /* Reserves the family's activations, gradient buffers and constants for m->B x m->T
     * rows in the compute dtype's `es` bytes, and sets m->acts and m->mlp_rows (the rows
     * of its MLP's widest activation that fit mlp_chunk_bytes; 0: all of them). */
    void (*plan)(strata_model *m, strata_arena *a, size_t es, size_t mlp_chunk_bytes);
    /* Uploads the family's constants into their planned buffers (the first set_batch); NULL
     * when it has none. 0, or -1. */
    int (*upload_constants)(strata_model *m);
    void (*forward)(strata_model *m, int u, int train, float dloss, float loss_scale);
    int (*backward)(strata_model *m, int u);
    strata_init_rule (*init_rule)(const strata_model *m, int tensor);
    double (*flops_per_token)(const strata_model *m, int T);
    /* The most kernel calls one micro-step's forward and backward time (a recomputed
     * block's forward included), for the kernel profile's table of event pairs. */
    int (*timed_calls)(const strata_model *m);
    void (*free_acts)(strata_model *m); /* the host side of m->acts */
    /* Elements of a block's q|k|v row, what strata_model.kv caches a position of: GPT-2's
     * 3 C, the Llama family's (n_head + 2 n_kv_head) head_dim. */
    size_t (*qkv_width)(const strata_model *m);
} strata_model_family;

extern const strata_model_family strata_family_gpt2;
extern const strata_model_family strata_family_llama;

/* Unit u is a `kind` (STRATA_UNIT_*) of block `layer` (-1 for the embedding and head). */
void strata_model_set_unit(strata_model *m, int u, int kind, int layer);
/* Appends a tensor to unit u's flat buffer: 1-D (d0) or 2-D (d0, d1). Weight decay applies
 * to 2-D tensors; vocab_rows marks a tensor whose rows past vocab_size are padding. */
void strata_model_add_tensor(strata_model *m, int u, const char *name, int ndim, int64_t d0, int64_t d1,
                             int vocab_rows);
/* An activation buffer of the plan (device memory, category activations). */
void strata_model_reserve(strata_arena *a, const char *name, size_t bytes, void **dst);
/* Block l is recomputed in its backward (activation checkpointing every:K, l % K == 0);
 * recomputed blocks share one set of activation buffers. */
int strata_model_block_recomputed(const strata_model *m, int l);
/* The head's classifier and loss, from x (B*T rows of C, the final norm's output) and the
 * head's weight w (Vp rows of C, in `layout`), as the head's forward ends in either family:
 * logits = x w^T, losses (B,T), *loss_sum += their mean times loss_scale; in training the
 * logits become dlogits in place, scaled by dloss. With m->head_rows below B*T
 * (train.logits_chunk_mb) only a chunk of rows' logits is ever held, so in training the
 * whole of it waits for strata_model_head_backward, which runs the chunks' forward, loss
 * and backward one after another. */
void strata_model_head_forward(strata_model *m, const void *x, const void *w, int layout, int C, int train,
                               float dloss, float loss_scale);
/* The classifier's backward: dx (B*T rows of C) = dlogits w, dw (+=) = dlogits^T x. */
void strata_model_head_backward(strata_model *m, const void *x, const void *w, int layout, int C, void *dx, float *dw);

/* Tensor i of unit u inside a unit buffer whose elements are `es` bytes. */
void *strata_model_tensor_ptr(const strata_model *m, void *base, int u, int i, size_t es);

/* Kernel call(s) timed as one call of group g when the step is profiled (core/profile.h;
 * m->prof is NULL otherwise, and this is the call alone). */
#define TIMED(g, ...)                                                   \
    do {                                                                \
        int prof_call_ = strata_prof_begin(m->prof, STRATA_PROF_##g);   \
        __VA_ARGS__;                                                    \
        strata_prof_end(m->prof, prof_call_);                           \
    } while (0)

#endif
