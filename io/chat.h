/* io/chat.h: the chat formats a fine-tuning example or a sample prompt is written in, as
 * token ids with a loss mask.
 *
 *   llama3  Llama 3 Instruct's template: <|begin_of_text|>, then per message
 *           <|start_header_id|>ROLE<|end_header_id|>"\n\n" CONTENT <|eot_id|>, the content
 *           trimmed of surrounding whitespace (Jinja's trim, Python's str.strip);
 *   chatml  Qwen's ChatML: per message <|im_start|>ROLE"\n" CONTENT <|im_end|>"\n" (no BOS,
 *           and no default system message).
 * Only an assistant message's content and its end token (<|eot_id|>, <|im_end|>) are
 * learned; headers, other roles and the newline after <|im_end|> are not. Each piece of
 * text is encoded on its own (the role, the header's newlines, the content), so no token
 * spans template and content: the content's tokens are those a model writes after the
 * generation prompt ("...assistant<|end_header_id|>\n\n", "<|im_start|>assistant\n"). That
 * is also what tokenizing the whole rendered conversation gives, except where a ChatML
 * content begins with whitespace holding a line break (the break would join the header's).
 * strata_chat_template gives each format as the Jinja template transformers'
 * apply_chat_template runs, which `strata export` writes into tokenizer_config.json. */
#ifndef STRATA_CHAT_H
#define STRATA_CHAT_H

#include <stddef.h>
#include <stdint.h>

#include "io/bpe.h"

typedef enum strata_chat_format { STRATA_CHAT_NONE = 0, STRATA_CHAT_LLAMA3, STRATA_CHAT_CHATML } strata_chat_format;

/* "llama3" or "chatml"; -1 (error set) for another name. */
int strata_chat_format_parse(const char *name, strata_chat_format *f);
const char *strata_chat_format_name(strata_chat_format f);
/* The format's Jinja chat template (bos_token is the format's BOS where it has one). */
const char *strata_chat_template(strata_chat_format f);
/* The format's template with `system` as its default system message (NULL: the plain
 * template): a conversation whose first message is not the system's gets that one first.
 * Malloc'd. */
char *strata_chat_template_with(strata_chat_format f, const char *system);
/* The format whose template tk's tokenizer_config.json holds (NONE for any other), with or
 * without a default system message. */
strata_chat_format strata_chat_format_of(const strata_bpe *tk);
/* The same, and the default system message that template holds in *system (malloc'd; NULL
 * when it has none). */
strata_chat_format strata_chat_format_system(const strata_bpe *tk, char **system);
/* The format a model with tokenizer tk is prompted in: the one its tokenizer_config.json's
 * template is, else the one whose special tokens it has (Llama 3's headers and <|eot_id|>,
 * or ChatML's <|im_start|> and <|im_end|>); NONE when it has neither set, or both. */
strata_chat_format strata_chat_format_detect(const strata_bpe *tk);

/* Token ids with a mask byte each (1: learned as a target), growing. */
typedef struct strata_tokens {
    int32_t *ids;
    uint8_t *mask;
    size_t n, cap;
} strata_tokens;
void strata_tokens_push(strata_tokens *t, int32_t id, uint8_t learned);
/* Encodes text[0, len) with tk and appends its ids with mask byte `learned`. */
int strata_tokens_encode(strata_tokens *t, strata_bpe *tk, const char *text, size_t len, uint8_t learned,
                         const char *name);
void strata_tokens_free(strata_tokens *t);

/* A format bound to a tokenizer: the ids of its special tokens. */
typedef struct strata_chat {
    strata_chat_format format;
    strata_bpe *tk;
    int32_t bos, start, end, turn_end; /* llama3: <|begin_of_text|>, <|start_header_id|>, <|end_header_id|>,
                                        * <|eot_id|>; chatml: -1, <|im_start|>, -1, <|im_end|> */
} strata_chat;
/* Fails (naming them) when tk lacks the format's special tokens. */
int strata_chat_open(strata_chat *c, strata_bpe *tk, strata_chat_format f);
/* What begins a conversation (llama3's BOS), not learned. */
void strata_chat_begin(const strata_chat *c, strata_tokens *out);
/* One message; its content and end learned when `learned`. */
int strata_chat_message(const strata_chat *c, strata_tokens *out, const char *role, const char *content, size_t len,
                        int learned, const char *name);
/* The assistant's header, after which a model writes its reply (not learned). */
int strata_chat_generation_prompt(const strata_chat *c, strata_tokens *out);
/* The token that ends an assistant's turn: where a sample stops. */
int32_t strata_chat_turn_end(const strata_chat *c);
/* Closes a reply the model wrote after strata_chat_generation_prompt (its ids already in
 * out): the turn's end when the model did not write it (ended 0: cut short), then what the
 * format puts after a turn (ChatML's newline), so the next message follows as the template
 * has it. */
int strata_chat_reply_end(const strata_chat *c, strata_tokens *out, int ended);

#endif
