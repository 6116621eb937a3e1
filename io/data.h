/* io/data.h: token shards and the batch reader.
 *
 * Shard format (llm.c's, so its data scripts feed Strata unchanged): a header of 256
 * little-endian int32 (header[0] = 20240520 magic, header[1] = 1 version, header[2] =
 * number of tokens), then that many uint16 tokens.
 *
 * The reader treats the shards matched by a glob, in sorted order, as one sequence of
 * chunks of T+1 tokens (inputs and next-token targets). Chunks are consumed in order, or
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
#define STRATA_SHARD_VERSION 1
#define STRATA_SHARD_HEADER_INTS 256

/* Writes tokens as one shard file (atomically: temp name, fsync, rename). */
int strata_shard_write(const char *path, const uint16_t *tokens, size_t n_tokens);

/* A memory-mapped, validated shard. */
typedef struct strata_shard {
    char path[1024];
    const uint16_t *tokens;
    size_t n_tokens;
    void *map;
    size_t map_bytes;
} strata_shard;
/* What strata_shard_open and strata_loader_open return (instead of -1) when the path
 * names no shard file at all: nothing matches, or a match is a directory, a device or a
 * FIFO. That is a config error (exit 2); -1 is a shard that is there but bad. */
#define STRATA_DATA_NOT_SHARDS (-2)

/* Checks magic, version, token count against the file size; errors name the file. */
int strata_shard_open(strata_shard *sh, const char *path);
void strata_shard_close(strata_shard *sh);

/* One text file for strata_prepare_text is read whole; a larger corpus comes as several
 * files. */
#define STRATA_TEXT_MAX_BYTES ((size_t)4 << 30)

/* Splits text files into train and val shards in out_dir (train_000000.bin ...,
 * val_000000.bin), val_fraction of each file's bytes going to val (taken from the end).
 * Tokens are bytes when tk is NULL, else tk's BPE ids (io/bpe.h); either way the
 * tokenizer is written beside the shards as tokenizer.json (for bytes, the equivalent
 * Hugging Face tokenizer), which is how a run learns what its tokens mean.
 * max_shard_tokens bounds a shard's size. Reports counts through the info log.
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
                        double val_fraction, size_t max_shard_tokens, struct strata_bpe *tk);

typedef struct strata_loader {
    strata_shard *shards;
    int n_shards;
    int T;            /* tokens per sequence; a chunk is T+1 tokens */
    int vocab_size;   /* tokens must be below it: checked when a chunk is read */
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
 * sequences first_seq .. first_seq+n_seq-1 of the stream (wrapping over epochs). */
int strata_loader_read(strata_loader *L, uint64_t first_seq, int n_seq, int32_t *inputs,
                       int32_t *targets);

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
