/* io/hf_config.h: the model shape a Hugging Face checkpoint declares, for `model.init_from`.
 *
 * A model directory's config.json is read and checked against what Strata computes; a
 * lone .safetensors file gives its shape through its tensors (config.json beside it is
 * read when present), and n_head through the "strata.n_head" metadata Strata's own export
 * writes, or not at all (the YAML then names it). io/config.c fills the model keys a YAML
 * leaves out from here; io/pretrained.c reads the weights. */
#ifndef STRATA_HF_CONFIG_H
#define STRATA_HF_CONFIG_H

#include "core/common.h"

/* The model shape a Hugging Face GPT-2 config.json (or a lone .safetensors file) gives. */
typedef struct strata_hf_shape {
    int n_layer, n_head, n_embd, n_positions, vocab_size; /* 0: unknown */
    char source[STRATA_PATH_MAX + 32]; /* what the values came from, for messages */
} strata_hf_shape;

/* Reads a GPT-2 config.json, refusing (naming the key) what Strata's model does not
 * compute: another model_type, activation_function other than the tanh GELU,
 * layer_norm_epsilon other than 1e-5, untied embeddings, cross-attention, n_inner other
 * than 4 * n_embd, scale_attn_weights off, scale_attn_by_inverse_layer_idx. */
int strata_hf_config_read(const char *path, strata_hf_shape *shape);

/* The shape that init_from (a directory or a .safetensors file) implies. */
int strata_hf_shape_read(const char *init_from, strata_hf_shape *shape);

#endif
