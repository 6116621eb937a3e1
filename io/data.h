/* io/data.h: token shards and the batch reader.
 *
 * Shard formats, all a header of 256 little-endian int32 then the tokens:
 *  - llm.c's GPT-2 shards (so its data scripts feed Strata unchanged): header[0] =
 *    20240520 magic, header[1] = 1 version, header[2] = number of tokens; uint16 tokens.
 *  - Strata's 32-bit shards, for vocabularies past 65,536 and for data with a loss mask:
 *    header[0] = 20240520, header[1] = 2, header[2] = number of tokens, header[3] = flags
 *    (bit 0: a loss mask follows; bit 1, only with bit 0: the mask marks where documents
 *    start; no other bit is defined), header[4] = the sequence length
 *    the tokens were packed to (prepare --jsonl's --seq-len; the loader refuses to read
 *    sequences of another length from it), 0 when they were not packed, the rest 0; uint32
 *    tokens, then, with the mask, one byte per token: bit 0 set when the token is learned
 *    (the loss counts it as the target of the token before it), clear when it is not (a
 *    prompt, padding); with flag bit 1, bit 1 set on the first token of each document (an
 *    example prepare --jsonl packed), so a reader can keep packed examples apart.
 *    `strata prepare` writes them when the tokenizer has more than 65,536 tokens or the
 *    data has a mask, and llm.c's format otherwise.
 *  - llm.c's Llama 3 shards: header[0] = 20240801, header[1] = 7; uint32 tokens.
 * Every reader checks the magic, the version, the flags and the token count against the
 * file's size; an id at or above the vocabulary and a mask byte with a bit the flags do not
 * define are named with their shard and position when a batch reads them.
 *
 * The reader treats the shards matched by a glob, in sorted order, as one sequence of
 * chunks of T+1 tokens (inputs and next-token targets; a target the mask does not learn
 * is -1, which the loss skips). Chunks are consumed in order, or
 * in a seeded permutation per epoch when shuffling. Sequence g of step s, for the global
 * batch of G = world * grad_accum * B sequences, is chunk number s*G + g of that order.
 * Rank r, micro-step a, row b reads g = a*(world*B) + r*B + b, so world N with micro-batch
 * B sees exactly the tokens world 1 sees with micro-batch N*B: the basis of the
 * equivalence tests. The position is a pure function of the step, which is what the
 * checkpoint records. */
#ifndef STRATA_DATA_H
#define STRATA_DATA_H

#include <stddef.h>
#include <stdint.h>

#define STRATA_SHARD_MAGIC 20240520
#define STRATA_SHARD_VERSION 1    /* uint16 tokens (llm.c's GPT-2 shards) */
#define STRATA_SHARD_VERSION_32 2 /* uint32 tokens, a loss mask when header[3] says so */
#define STRATA_SHARD_FLAG_MASK 1
#define STRATA_SHARD_FLAG_DOCS 2 /* with FLAG_MASK: mask bit 1 marks a document's first token */
#define STRATA_MASK_LEARNED 1    /* a mask byte's bits */
#define STRATA_MASK_DOC_START 2
#define STRATA_SHARD_LLMC32_MAGIC 20240801 /* llm.c's Llama 3 shards: uint32 tokens */
#define STRATA_SHARD_LLMC32_VERSION 7
#define STRATA_SHARD_HEADER_INTS 256

/* Writes tokens as one shard file (atomically: temp name, fsync, rename): llm.c's uint16
 * format, and the 32-bit one with an optional loss mask (mask may be NULL: no mask), the
 * sequence length its tokens were packed to (0: none) and whether the mask marks where
 * documents start (docs, with a mask only). */
int strata_shard_write(const char *path, const uint16_t *tokens, size_t n_tokens);
int strata_shard_write32(const char *path, const uint32_t *tokens, const uint8_t *mask, size_t n_tokens, int seq_len,
                         int docs);

/* A memory-mapped, validated shard: tokens (16-bit) or tokens32 (32-bit) is set. */
typedef struct strata_shard {
    char path[1024];
    const uint16_t *tokens;
    const uint32_t *tokens32;
    const uint8_t *mask; /* NULL: every token learned */
    int docs;            /* the mask marks where documents start (STRATA_MASK_DOC_START) */
    int seq_len;         /* the length its sequences were packed to; 0: not packed */
    size_t n_tokens;
    void *map;
    size_t map_bytes;
} strata_shard;
static inline uint32_t strata_shard_token(const strata_shard *sh, size_t i) {
    return sh->tokens32 ? sh->tokens32[i] : sh->tokens[i];
}
/* What strata_shard_open and strata_loader_open return (instead of -1) when the path
 * names no shard file at all: nothing matches, or a match is a directory, a device or a
 * FIFO. That is a config error (exit 2); -1 is a shard that is there but bad. */
#define STRATA_DATA_NOT_SHARDS (-2)

/* Checks magic, version, flags, token count against the file size; errors name the file. */
int strata_shard_open(strata_shard *sh, const char *path);
void strata_shard_close(strata_shard *sh);

/* One text file for strata_prepare_text is read whole; a larger corpus comes as several
 * files. */
#define STRATA_TEXT_MAX_BYTES ((size_t)4 << 30)

/* Splits text files into train and val shards in out_dir (train_000000.bin ...,
 * val_000000.bin), val_fraction of each file's bytes going to val (taken from the end).
 * Tokens are bytes when tk is NULL, else tk's BPE ids (io/bpe.h), each side of each file
 * encoded as a document (with the tokens the tokenizer's post-processor puts around one:
 * Llama's BOS); either way the tokenizer is written beside the shards as tokenizer.json
 * (for bytes, the equivalent Hugging Face tokenizer; tokenizer_config.json too when the
 * tokenizer has one), which is how a run learns what its tokens mean.
 * max_shard_tokens bounds a shard's size. Reports counts through the info log. A document
 * is encoded on up to `threads` threads (0: the CPUs it may use) in parts, when the
 * tokenizer allows the cuts (io/bpe.h strata_bpe_line_cuts), else on one: the ids are the
 * same.
 *
 * out_dir is replaced whole, never mixed: everything is written into a fresh directory
 * beside it (".<name>.prepare-<pid>"), which then takes its place in one step
 * (io/files.h strata_dir_swap), so a failure, a kill or a full disk leaves the old data as
 * it was, and a run that opens the data finds all of the old or all of the new (one that
 * has its shards open already keeps reading the old ones, which stay while mapped). What
 * else the old directory holds (text files, notes, folders) is hard-linked into the new
 * one; earlier shards and tokenizer.json are not. Beside out_dir the old and the new data
 * exist at once while it runs, and it needs write access to the folder holding out_dir.
 * One prepare per directory at a time: flock on ".<name>.prepare.lock" beside it, and a
 * second is refused naming the first's pid and host. STRATA_PREPARE_REFUSED (nothing
 * written) when out_dir is in use, is "/" or holds the current directory; -1 on a
 * failure; the error says which. */
#define STRATA_PREPARE_REFUSED (-2)
struct strata_bpe;
int strata_prepare_text(const char *const *text_files, int n_files, const char *out_dir,
                        double val_fraction, size_t max_shard_tokens, struct strata_bpe *tk, int threads);
/* The threads a preparation encodes on at most (threads 0: the CPUs it may use). */
#define STRATA_PREPARE_MAX_THREADS 64

/* What every kind of preparation shares (strata_prepare_text, io/jsonl.h): fill(ctx, dir)
 * writes the new data into the fresh directory `dir`; out_dir is then replaced by it as
 * described above. *kept counts the old directory's other entries carried over. Returns
 * 0, STRATA_PREPARE_REFUSED or -1, as strata_prepare_text, or fill's own code when it
 * returned one below -1. */
typedef int (*strata_prepare_fill)(void *ctx, const char *dir);
int strata_prepare_dir(const char *out_dir, strata_prepare_fill fill, void *ctx, int *kept);
/* Writes tk (NULL: the byte-level one) beside the shards in dir: tokenizer.json, and
 * tokenizer_config.json when the tokenizer has settings of that file (io/bpe.h). */
int strata_prepare_write_tokenizer(const char *dir, const struct strata_bpe *tk);

/* The shards of one split ("train", "val") as they fill, in dir: <prefix>_NNNNNN.bin of
 * at most max_tokens each, llm.c's uint16 format unless wide (32-bit) or masked (32-bit
 * with a loss mask: masked is STRATA_SHARD_FLAG_MASK, with | STRATA_SHARD_FLAG_DOCS when
 * the mask bytes pushed mark where documents start). With sequences packed seq_len tokens apart (io/jsonl.c; 0: not
 * packed), each shard after the first begins with the last token of the one before, so a
 * shard of k*seq_len + 1 tokens holds k whole chunks and none crosses into the next shard;
 * the shards record seq_len (32-bit ones only: pass wide or masked with it). */
typedef struct strata_shard_sink {
    char out_dir[1024];
    const char *prefix;
    size_t max_tokens;
    int wide, masked, docs, seq_len;
    uint16_t *buf16;
    uint32_t *buf32;
    uint8_t *mask;
    size_t len, cap;
    int n_shards;
    size_t total;   /* tokens written, a carried-over token counted once */
    size_t learned; /* of those, learned (masked: mask bit 0; else all) */
} strata_shard_sink;
void strata_shard_sink_init(strata_shard_sink *s, const char *dir, const char *prefix, size_t max_tokens, int wide,
                            int masked, int seq_len);
/* Appends n ids with their mask bytes (mask NULL: every one learned). */
int strata_shard_sink_push(strata_shard_sink *s, const int32_t *ids, const uint8_t *mask, size_t n);
/* Writes what is left (packed, a last shard of the carried token alone is not
 * written: it holds no chunk) and frees the buffers; free alone on a failure path. */
int strata_shard_sink_finish(strata_shard_sink *s);
void strata_shard_sink_free(strata_shard_sink *s);

/* What the shards matching glob_pattern hold, from their headers: *wide = 1 if any holds
 * 32-bit tokens, 0 if every one is llm.c's uint16; *seq_len the length their sequences
 * were packed to (0: none is packed; -1 when two shards disagree); *docs = 1 if any marks
 * where its documents start (docs may be NULL). -1 (error set) when none matches or one
 * is not a shard. */
int strata_shards_info(const char *glob_pattern, int *wide, int *seq_len, int *docs);
/* 1 when some shard matching glob_pattern marks where its documents start; 0 when none
 * does, and when the pattern is empty or names no readable shard (opening the data says
 * why, later). */
int strata_shards_mark_documents(const char *glob_pattern);

typedef struct strata_loader {
    strata_shard *shards;
    int n_shards;
    int T;            /* tokens per sequence; a chunk is T+1 tokens */
    int vocab_size;   /* tokens must be below it: checked when a chunk is read */
    int has_mask;     /* some shard has a loss mask: targets may be -1 */
    int has_docs;     /* some shard marks where its packed documents start */
    int unmarked_packed; /* some shard was packed from examples (masked, seq_len) without
                            marking where they start: prepared before Strata marked them */
    uint64_t *chunk_start; /* per shard: first global chunk index (prefix sums), n_shards+1 */
    uint64_t n_chunks;
    int shuffle;
    uint64_t seed;
    uint32_t *perm;        /* the current epoch's permutation when shuffling */
    uint64_t perm_epoch;   /* which epoch perm holds; UINT64_MAX = none yet */
} strata_loader;

/* Opens every shard matching `glob_pattern`; errors name the pattern or the file.
 * STRATA_DATA_NOT_SHARDS when it names no shard file (see above), -1 for a bad shard. */
int strata_loader_open(strata_loader *L, const char *glob_pattern, int T, int vocab_size,
                       int shuffle, uint64_t seed);
void strata_loader_close(strata_loader *L);

/* Fills inputs[n_seq*T] and targets[n_seq*T] (host int32) with the consecutive global
 * sequences first_seq .. first_seq+n_seq-1 of the stream (wrapping over epochs); a
 * target whose token the mask does not learn is -1. positions (n_seq*T, or NULL: not
 * wanted) receives each input's position in its document: 0 at a row's start and at each
 * token the mask marks as a document's first, else one more than the token before (so
 * t in a row of a shard that marks none). */
int strata_loader_read(strata_loader *L, uint64_t first_seq, int n_seq, int32_t *inputs,
                       int32_t *targets, int32_t *positions);
/* The learned targets of those sequences (n_seq * T without a mask): what the engine
 * divides the step's loss by, known before any micro-batch is read. */
int strata_loader_count_learned(strata_loader *L, uint64_t first_seq, int n_seq, uint64_t *count);
/* A pass's loss as the mean over its learned targets: `mean` is the loss summed over the
 * learned targets and divided by all `all` targets (ignored ones add 0), so with a mask it
 * is scaled by all / learned (0 when nothing is learned); without one it is the mean. */
double strata_loss_over_learned(double mean, uint64_t learned, uint64_t all, int has_mask);

/* The global sequence index of row b of micro-step a on rank r at step `step`. */
uint64_t strata_batch_seq(int64_t step, int micro, int rank, int row, int world, int grad_accum,
                          int B);

/* GPT-2 BPE decoding for samples of llm.c-tokenised data: llm.c's tokenizer file
 * (header 256 uint32: magic 20240328, version, vocab size, [eot]; then per token a uint8
 * length and its bytes). Byte-level models need no tokenizer. */
typedef struct strata_tokenizer {
    int vocab_size;
    char **pieces;
    unsigned char *lens;
} strata_tokenizer;
int strata_tokenizer_load(strata_tokenizer *tk, const char *path);
void strata_tokenizer_free(strata_tokenizer *tk);

#endif
