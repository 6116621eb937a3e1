/* io/bpe.h: GPT-2-style byte-level BPE, the tokenizer that ships with Hugging Face GPT-2
 * models, encoding to exactly the ids Hugging Face `tokenizers` produces.
 *
 * Sources: a tokenizer.json (model BPE, pre_tokenizer ByteLevel), a model directory
 * holding tokenizer.json, or one holding vocab.json + merges.txt (GPT-2's original files;
 * "<|endoftext|>" becomes a special token when the vocabulary has it).
 *
 * Encoding, as `tokenizers` does it:
 *   1. added tokens ("<|endoftext|>", ...) are cut out of the text where they occur
 *      literally (leftmost, longest first) and become their ids, as tokenizers'
 *      AddedVocabulary does: first those with normalized false, then, in each stretch
 *      between them, those with normalized true (so "Cit" unnormalized splits "Citizen"
 *      before a normalized "Citizen" is looked for); a single_word token only where no
 *      word character (Unicode \w) touches it; lstrip and rstrip take the whitespace before
 *      and after it along;
 *   2. each stretch between them is pre-tokenised with GPT-2's pattern
 *        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
 *      (PCRE2, UTF and Unicode properties; a space first when add_prefix_space);
 *   3. each piece's bytes become characters through GPT-2's bytes-to-unicode table and
 *      are merged pairwise, lowest merge rank first (leftmost among equals), into
 *      vocabulary ids.
 * Input must be valid UTF-8 (an error names the byte offset otherwise).
 *
 * Refused with a message naming the field: a normalizer, another pre-tokenizer or model
 * type, BPE dropout, byte fallback, word prefixes/suffixes, a post-processor that adds
 * tokens (a template of the text alone, as transformers writes for GPT-2, adds none).
 * truncation and padding (which only apply to batches of model inputs) are ignored. */
#ifndef STRATA_BPE_H
#define STRATA_BPE_H

#include <stddef.h>
#include <stdint.h>

typedef struct strata_bpe strata_bpe;

/* Loads tokenizer.json, or a directory with tokenizer.json or vocab.json + merges.txt. */
strata_bpe *strata_bpe_load(const char *path);
/* The tokenizer of byte-level runs: token id = byte value (256 ids, no merges), in
 * tokenizers' terms a ByteLevel BPE without merges, so `tokenizers` encodes any text to
 * its UTF-8 bytes with it too. */
strata_bpe *strata_bpe_bytes(void);
void strata_bpe_free(strata_bpe *t);

int strata_bpe_vocab_size(const strata_bpe *t); /* highest id + 1 */
const char *strata_bpe_source(const strata_bpe *t); /* the path it came from, or "byte-level" */
int strata_bpe_is_bytes(const strata_bpe *t);
int strata_bpe_add_prefix_space(const strata_bpe *t);
/* The id of special token `content` ("<|endoftext|>"), or -1. */
int strata_bpe_special_id(const strata_bpe *t, const char *content);

/* Receives ids in order, in batches; returns nonzero (with strata_fail) to stop. */
typedef int (*strata_bpe_sink)(void *ctx, const int32_t *ids, size_t n);
/* Encodes text[0, len) (`name` names it in messages) into the sink. */
int strata_bpe_encode(strata_bpe *t, const char *text, size_t len, const char *name, strata_bpe_sink sink,
                      void *ctx);
/* The same as a document: with the ids the tokenizer's post-processor puts around one text
 * (tokenizers' encode(text, add_special_tokens=True)). */
int strata_bpe_encode_doc(strata_bpe *t, const char *text, size_t len, const char *name, strata_bpe_sink sink,
                          void *ctx);
/* The bytes token `id` stands for (what decoding writes); NULL for an id outside the
 * vocabulary. */
const unsigned char *strata_bpe_token_bytes(const strata_bpe *t, int id, size_t *len);

/* Decodes ids to text as tokenizers' decode does: each token's bytes in turn (ids without
 * a token give none), then byte sequences that are not UTF-8 replaced by U+FFFD. Returns a
 * NUL-terminated string to free, its length in *len. */
char *strata_bpe_decode(const strata_bpe *t, const int32_t *ids, size_t n, size_t *len);
/* Raw token bytes as that text: each byte that starts no valid UTF-8 sequence becomes
 * U+FFFD. decode(ids) is decode_bytes of their bytes concatenated. */
char *strata_bpe_decode_bytes(const unsigned char *raw, size_t n, size_t *len);

/* Writes the tokenizer as tokenizer.json to `path` (atomically): the file it was loaded
 * from byte for byte, or, for vocab.json + merges.txt and the byte-level tokenizer, an
 * equivalent one in Hugging Face's format. */
int strata_bpe_save(const strata_bpe *t, const char *path);
/* Whether the tokenizer has settings of tokenizer_config.json (read beside its
 * tokenizer.json, or set by strata_bpe_set_chat_template), and writes them as one. */
int strata_bpe_has_config(const strata_bpe *t);
int strata_bpe_save_config(const strata_bpe *t, const char *path, int model_max_length);
/* Writes vocab.json and merges.txt (GPT-2's original pair of files) into dir. */
int strata_bpe_save_vocab_merges(const strata_bpe *t, const char *dir);
/* Which tokenizer this is: the CRC-32C of the tokenizer.json strata_bpe_save writes, so a
 * tokenizer and the copy a run recorded of it have the same digest (that file's bytes). */
int strata_bpe_digest(const strata_bpe *t, uint32_t *crc);

#endif
