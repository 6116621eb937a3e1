/* launcher/sample.h: text generation from a model whose parameters are resident. */
#ifndef STRATA_SAMPLE_H
#define STRATA_SAMPLE_H

#include <stdint.h>
#include <stdio.h>

#include "core/common.h"
#include "core/model.h"
#include "io/bpe.h"
#include "io/data.h"

/* The most tokens one `strata sample` generates. */
#define STRATA_SAMPLE_MAX_TOKENS 1048576

/* Receives each generated token as it is made; STRATA_TOKEN_STOP ends the generation there
 * (a chat's end of turn), any other nonzero stops it with an error. */
typedef int (*strata_token_sink)(void *ctx, int32_t id);
#define STRATA_TOKEN_STOP 2

/* Generates n_new tokens after the prompt, each drawn from softmax(logits / temperature)
 * restricted to the top_k most likely (top_k 0: all; temperature 0: greedy), and hands
 * each to sink as soon as it is drawn. The context is the last T tokens (T = the model's
 * planned sequence length), held in a window of 2T: memory does not grow with n_new. An
 * empty prompt starts from a newline (byte-level models) or token 0. A model planned with a
 * key/value cache (m->kv) runs only what its cache lacks: the rows of the prompt's prefix
 * the cache already holds stand (a conversation's earlier turns), then a token at a time
 * (strata_model_extend); otherwise each token runs the whole context. 0 (also when the sink
 * ended it with STRATA_TOKEN_STOP), or -1 with strata_error() set (a prompt id outside the
 * vocabulary, or the sink failed). */
int strata_generate(strata_model *m, const int32_t *prompt, int n_prompt, int n_new, float temperature, int top_k,
                    strata_rng *rng, strata_token_sink sink, void *ctx);

/* Tokens as text, written and flushed one token at a time: decoded by the BPE (bpe; as
 * Hugging Face decodes, special tokens as their text, bytes that are not UTF-8 become
 * U+FFFD, a character split across tokens waits for its last byte, and the spaces the
 * decoder strips off the start of a text (Llama's one) are left out), llm.c's tokenizer
 * pieces (tk), bytes for byte-level models without either (non-printable ones escaped),
 * "<id>" otherwise. The text is the same as decoding all the tokens at once. With
 * stop_id set, that token (written) ends the generation: STRATA_TOKEN_STOP. */
typedef struct strata_text_out {
    FILE *f;
    int vocab_size;
    const strata_tokenizer *tk;
    const strata_bpe *bpe;
    unsigned char *pend; /* BPE bytes not yet written: an unfinished UTF-8 character */
    size_t n_pend, cap;
    size_t strip;   /* spaces still to leave out at the start of the text */
    int32_t stop_id; /* -1: none */
} strata_text_out;
void strata_text_out_init(strata_text_out *o, FILE *f, int vocab_size, const strata_tokenizer *tk,
                          const strata_bpe *bpe);
int strata_text_out_put(void *o, int32_t id); /* a strata_token_sink; nonzero if the write failed */
/* Writes what is pending (as U+FFFD where it is no character), flushes, frees. */
void strata_text_out_finish(strata_text_out *o);

#endif
