/* io/bpe.h: BPE tokenizers as Hugging Face `tokenizers` runs them, encoding to exactly the
 * ids it produces: GPT-2's byte-level BPE, Llama 3's and Qwen2/2.5/3's (byte-level, with
 * their Split patterns, ignore_merges, NFC), and the SentencePiece-style BPE of Llama 2,
 * Mistral and TinyLlama (a vocabulary of text with "\u2581" for spaces, byte fallback).
 *
 * Sources: a tokenizer.json (model BPE; the normalizer, pre-tokenizer, decoder and
 * post-processor steps below), with the tokenizer_config.json beside it when there is one
 * (its BOS and EOS tokens and chat template, carried to an export), a model directory
 * holding them, or one holding vocab.json + merges.txt (GPT-2's original files;
 * "<|endoftext|>" becomes a special token when the vocabulary has it).
 *
 * Encoding, as `tokenizers` does it:
 *   1. added tokens ("<|endoftext|>", "<|eot_id|>", "<s>", ...) are cut out of the text
 *      where they occur literally (leftmost, longest first) and become their ids, as
 *      tokenizers' AddedVocabulary does: first those with normalized false, then, in each
 *      stretch between them after the normalizer ran on it, those with normalized true
 *      (so "Cit" unnormalized splits "Citizen" before a normalized "Citizen" is looked
 *      for); a single_word token only where no word character (Unicode \w) touches it;
 *      lstrip and rstrip take the whitespace before and after it along;
 *   2. the normalizer on each stretch: NFC (io/nfc.h), Prepend, Replace of a string;
 *   3. the pre-tokenizer's steps, each splitting the pieces of the one before: Split with
 *      the file's pattern through PCRE2 (UTF and Unicode properties; Isolated: matches and
 *      the text between are pieces), ByteLevel (a space first when add_prefix_space, then
 *      GPT-2's pattern when use_regex:
 *        's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+ ),
 *      Metaspace (spaces to its replacement, one before the text's first piece or every
 *      piece, and a split before each when split);
 *   4. each piece's symbols (byte-level: its bytes through GPT-2's bytes-to-unicode table;
 *      else its characters, one without a token becoming its bytes' "<0xNN>" tokens with
 *      byte_fallback, or the unknown token) are merged pairwise, lowest merge rank first
 *      (leftmost among equals), into vocabulary ids; with ignore_merges a piece that is a
 *      token is that token.
 * strata_bpe_encode_doc adds the tokens the post-processor's TemplateProcessing puts
 * around one text (Llama's BOS), or, with a Llama tokenizer class, those tokenizer_config
 * .json's add_bos_token and add_eos_token say. Input must be valid UTF-8 (an error names
 * the byte offset otherwise).
 *
 * Refused with a message naming the field: other normalizers, pre-tokenizers, decoders,
 * post-processors and models (WordPiece, Unigram, ...), BPE dropout, byte fallback in a
 * byte-level vocabulary, word prefixes/suffixes. truncation and padding (which only apply
 * to batches of model inputs) are ignored. */
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
/* Whether a text may be cut just after any '\n' that follows a visible ASCII character and
 * precedes an ASCII letter, its parts encoded apart (on several threads) and their ids
 * joined, with the ids of the text encoded whole: so for a byte-level tokenizer whose
 * pieces are GPT-2's pattern's or Llama 3's or Qwen2's Split's (a newline there ends a
 * piece, the letter starts the next, and no lookahead crosses it), no normalizer but NFC
 * (nothing composes with a newline), nothing before the first split that changes the text
 * (a prefix space, Metaspace), and no added token holding a newline or taking the
 * whitespace before it (lstrip). 0 for any other: it encodes on one thread. */
int strata_bpe_line_cuts(const strata_bpe *t);
/* The bytes token `id` stands for (what decoding writes); NULL for an id outside the
 * vocabulary. */
const unsigned char *strata_bpe_token_bytes(const strata_bpe *t, int id, size_t *len);

/* Decodes ids to text as tokenizers' decode(ids, skip_special_tokens=False) does (special
 * tokens are their text): byte-level, each token's bytes in turn (ids without a token give
 * none), then byte sequences that are not UTF-8 replaced by U+FFFD; otherwise the
 * decoder's steps over the tokens' strings. Returns a NUL-terminated string to free, its
 * length in *len. */
char *strata_bpe_decode(const strata_bpe *t, const int32_t *ids, size_t n, size_t *len);
/* For text decoded a token at a time with strata_bpe_token_bytes: how many leading *ch the
 * decoder takes off the whole text's start (Llama's Strip of one space). */
size_t strata_bpe_strip_start(const strata_bpe *t, uint32_t *ch);
/* Raw token bytes as that text: each byte that starts no valid UTF-8 sequence becomes
 * U+FFFD. decode(ids) is decode_bytes of their bytes concatenated. */
char *strata_bpe_decode_bytes(const unsigned char *raw, size_t n, size_t *len);

/* Writes the tokenizer as tokenizer.json to `path` (atomically): the file it was loaded
 * from byte for byte, or, for vocab.json + merges.txt and the byte-level tokenizer, an
 * equivalent one in Hugging Face's format. */
int strata_bpe_save(const strata_bpe *t, const char *path);
/* The ids around one text (strata_bpe_encode_doc's); returns how many there are. */
int strata_bpe_template(const strata_bpe *t, const int32_t **prefix, int *n_prefix, const int32_t **suffix,
                        int *n_suffix);
/* The id of a token's text (an added token's or the vocabulary's), or -1. */
int strata_bpe_token_id(const strata_bpe *t, const char *text);
/* The beginning- and end-of-sequence ids, or -1: tokenizer_config.json's bos_token and
 * eos_token; else the template's first and last id; for the end, else the special token
 * "</s>", "<|end_of_text|>" or "<|endoftext|>". */
int strata_bpe_bos_id(const strata_bpe *t);
int strata_bpe_eos_id(const strata_bpe *t);
/* tokenizer_config.json's pad_token's id, or -1. */
int strata_bpe_pad_id(const strata_bpe *t);

/* Whether the tokenizer has settings of tokenizer_config.json (read beside its
 * tokenizer.json, or set by strata_bpe_set_chat), and writes them as one (the class, the
 * BOS, EOS, unknown and padding tokens, add_bos_token and add_eos_token when said, the chat
 * template; model_max_length when above 0). */
int strata_bpe_has_config(const strata_bpe *t);
int strata_bpe_save_config(const strata_bpe *t, const char *path, int model_max_length);
/* Its chat template (a Jinja string), or NULL. */
const char *strata_bpe_chat_template(const strata_bpe *t);
/* Sets the chat template and, when not NULL, the BOS and EOS tokens (texts) it uses. */
void strata_bpe_set_chat(strata_bpe *t, const char *chat_template, const char *bos, const char *eos);
/* Writes vocab.json and merges.txt (GPT-2's original pair of files) into dir. */
int strata_bpe_save_vocab_merges(const strata_bpe *t, const char *dir);
/* Which tokenizer this is: the CRC-32C of the tokenizer.json strata_bpe_save writes, so a
 * tokenizer and the copy a run recorded of it have the same digest (that file's bytes). */
int strata_bpe_digest(const strata_bpe *t, uint32_t *crc);

#endif
