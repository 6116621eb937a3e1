/* io/pretrained.h: Hugging Face weights (GPT-2, the Llama family) as a source of initial
 * parameters (`model.init_from`).
 *
 * What `model.init_from` may name:
 *   - a model directory: config.json, and model.safetensors or the shards listed in
 *     model.safetensors.index.json ("weight_map": tensor name -> file in the directory);
 *   - one .safetensors file (config.json beside it is read when present; otherwise the
 *     shape comes from the tensors' shapes and, for n_head, from the YAML or the
 *     "strata.n_head" metadata Strata's own export writes).
 *
 * Tensor names may carry the prefix of the whole model's class ("transformer." of
 * GPT2LMHeadModel, "model." of LlamaForCausalLM and its kin) or not (GPT2Model,
 * LlamaModel); the buffers of old files (GPT-2's h.N.attn.bias and h.N.attn.masked_bias,
 * Llama's rotary_emb.inv_freq) are skipped. A tied model's lm_head.weight, when present,
 * must equal the token embedding, which each reader checks for the rows it reads; an
 * untied model's is a parameter like any other. Any other tensor is refused by name: the
 * model it belongs to is not one Strata computes.
 *
 * Reading is by element range of a unit's flat buffer (core/model.h), so each rank reads
 * only its own shard: at ZeRO stage 3 no rank ever holds the whole model. */
#ifndef STRATA_PRETRAINED_H
#define STRATA_PRETRAINED_H

#include <stddef.h>

#include "core/model.h"

typedef struct strata_pretrained strata_pretrained;

/* Opens init_from and checks it against the model: every parameter present with its
 * shape (the embedding and an untied head: vocab_size rows; GPT-2's wpe: model.seq_len
 * rows), in a dtype Strata converts (F32, F16, BF16, F64), and no tensor the model lacks. */
strata_pretrained *strata_pretrained_open(const char *init_from, const strata_model *m);
void strata_pretrained_close(strata_pretrained *p);
/* Elements [lo, hi) of unit u's flat fp32 buffer; the vocabulary's padding rows and the
 * unit's padding read as 0. A weight that is NaN or infinite is refused, naming the file, the
 * tensor and the element. The signature of a shard/engine.c parameter source. */
int strata_pretrained_read(void *p, const strata_model *m, int u, size_t lo, size_t hi, float *dst);
/* "N tensors in K file(s), dtype F32" for the log. */
const char *strata_pretrained_describe(const strata_pretrained *p);
/* Weights read from the files so far (what this rank's shards needed). */
size_t strata_pretrained_elements_read(const strata_pretrained *p);

#endif
