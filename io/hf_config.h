/* io/hf_config.h: the model shape a Hugging Face checkpoint declares, for `model.init_from`.
 *
 * A model directory's config.json is read and checked against what Strata computes; a
 * lone GPT-2 .safetensors file gives its shape through its tensors (config.json beside it
 * is read when present), and n_head through the "strata.n_head" metadata Strata's own
 * export writes, or not at all (the YAML then names it); a lone Llama-family file needs
 * its config.json (RoPE and the norms' epsilon are in no tensor). io/config.c fills the model keys a YAML
 * leaves out from here; io/pretrained.c reads the weights. */
#ifndef STRATA_HF_CONFIG_H
#define STRATA_HF_CONFIG_H

#include "core/common.h"

/* The model shape a Hugging Face config.json (or a lone .safetensors file) gives. */
typedef struct strata_hf_shape {
    int arch; /* strata_arch (core/model.h) */
    int n_layer, n_head, n_embd, n_positions, vocab_size; /* 0: unknown */
    /* the Llama family's (model_type llama, mistral, qwen2, qwen3) */
    char model_type[16];
    int n_kv_head, head_dim, intermediate_size;
    double rope_theta;
    int rope_type; /* strata_rope_type */
    double rope_factor, rope_low_freq_factor, rope_high_freq_factor;
    int rope_original_context;
    double rms_norm_eps;
    int tie_embeddings, qkv_bias, qk_norm;
    int sliding_window; /* attention window of every layer; 0: none (a full causal mask) */
    char source[STRATA_PATH_MAX + 32]; /* what the values came from, for messages */
} strata_hf_shape;

/* Reads a config.json, refusing (naming the key) what Strata's models do not compute.
 * GPT-2 (model_type gpt2, or none): another activation_function than the tanh GELU,
 * layer_norm_epsilon other than 1e-5, untied embeddings, cross-attention, n_inner other
 * than 4 * n_embd, scale_attn_weights off, scale_attn_by_inverse_layer_idx.
 * The Llama family (llama, mistral, qwen2, qwen3; transformers 4.x's rope_theta and
 * rope_scaling or 5.x's rope_parameters): another hidden_act than silu, a RoPE type other
 * than default and llama3, partial rotary factors, MLP biases, Llama's and Qwen3's
 * attention_bias (it adds an o_proj bias too), mixture-of-experts keys; sliding_window is
 * returned for the caller to hold against the context. */
int strata_hf_config_read(const char *path, strata_hf_shape *shape);

/* The shape that init_from (a directory or a .safetensors file) implies. */
int strata_hf_shape_read(const char *init_from, strata_hf_shape *shape);

#endif
