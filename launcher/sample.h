/* launcher/sample.h: text generation from a model whose parameters are resident. */
#ifndef STRATA_SAMPLE_H
#define STRATA_SAMPLE_H

#include <stdint.h>
#include <stdio.h>

#include "core/bpe.h"
#include "core/common.h"
#include "core/data.h"
#include "core/model.h"

/* Appends n_new tokens to `tokens` (which holds n_prompt, room for n_prompt + n_new),
 * each drawn from softmax(logits / temperature) restricted to the top_k most likely
 * (top_k 0: all; temperature 0: greedy). The context is the last T tokens. */
int strata_generate(strata_model *m, int32_t *tokens, int n_prompt, int n_new, float temperature,
                    int top_k, strata_rng *rng);

/* Writes tokens as text: decoded by the BPE (bpe; as Hugging Face decodes, bytes that are
 * not UTF-8 become U+FFFD), llm.c's tokenizer pieces (tk), bytes for byte-level models
 * without either (non-printable ones escaped), "<id>" otherwise. */
void strata_write_tokens(FILE *f, const int32_t *tokens, int n, int vocab_size, const strata_tokenizer *tk,
                         const strata_bpe *bpe);

#endif
