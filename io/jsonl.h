/* io/jsonl.h: fine-tuning data as people have it, JSON Lines, into token shards with a loss
 * mask (io/data.h's 32-bit format).
 *
 * Each line is a JSON object (io/json.c's strict reader; blank lines are skipped), one
 * example, written as token ids with a mask byte each (1: learned):
 *   text      field T, a plain document: the tokenizer's template around it (Llama's BOS)
 *             and its EOS after, all learned but what comes before the text;
 *   prompt    fields P and R: the template's BOS and P's tokens not learned, R's tokens and
 *             the EOS learned (an empty R is a bad line: nothing would be learned but EOS);
 *             P may list fields, comma-separated (Alpaca's instruction,input): the first
 *             must be there, the others may be missing or null, and those not empty are
 *             joined by a blank line and tokenized as one string;
 *   messages  field M, an array of {"role": "system"|"user"|"assistant", "content": "..."},
 *             or ShareGPT's {"from": "system"|"human"|"gpt", "value": "..."} (user and
 *             assistant too), in a chat format (io/chat.h): only assistant turns learned (a
 *             conversation without an assistant turn, or with an empty one, is a bad line);
 *             with system_prompt, one whose first message is not the system's gets that one
 *             first, as the template written beside the shards does at inference. M may
 *             list fields (TRL's conversational prompt,completion): their messages follow
 *             one another, and only the last field's assistant turns are learned.
 * The EOS is the tokenizer's (strata_bpe_eos_id). An example's first token is never
 * learned (nothing of its own comes before it).
 *
 * Examples are packed into sequences of seq_len tokens, a sequence's room left over padded
 * with a token that is not learned (the tokenizer's pad token, else its EOS). Best fit
 * (the default): up to 64 sequences fill at once, each example going into the one it
 * leaves the least room in, and when none has room for it the fullest is written out if
 * all 64 are open, so little is padding whatever the lengths; in order (pack_in_order):
 * an example that does not fit what is left of the current sequence starts the next one.
 * The examples of a sequence are kept apart when a run trains on them (the shards mark
 * where each starts: io/data.h), so which share one changes nothing an example learns. An
 * example longer than seq_len is split (it starts a sequence and runs on into the next
 * ones, so every part keeps the tokens before it within its sequence's window, and no
 * token of it is lost), dropped, or truncated to its first seq_len tokens (dropped when
 * those learn nothing). A sequence's last target is the next sequence's first token: the
 * shards overlap by that one token (strata_shard_sink's overlap), so the loader's chunks
 * are exactly the packed sequences. The shards record seq_len, and the loader refuses to
 * read sequences of another length from them.
 *
 * val_fraction of each file's examples (by line, rounded down) go to val shards, the rest
 * to train: spread over the file (the default: the lines whose index hashes lowest, so a
 * file ordered by source, topic or length gives a validation set like the rest), or its
 * last ones (val_at_end). A malformed line (not JSON, invalid UTF-8, not an object, a field missing, not a
 * string, empty, a message without a role or content, a role other than system, user,
 * assistant) is an error naming the file, line and field, or is skipped and counted.
 *
 * The lines are tokenized on several threads, a batch of them at a time, and each batch is
 * packed in the file's order on one more while the next is tokenized: the shards, the
 * report and the first bad line named are those of one thread. */
#ifndef STRATA_JSONL_H
#define STRATA_JSONL_H

#include <stddef.h>

#include "io/bpe.h"
#include "io/chat.h"

/* What strata_prepare_jsonl returns for a malformed line (as opposed to -1, a failure, or
 * io/data.h's STRATA_PREPARE_REFUSED): bad input, exit 2. */
#define STRATA_JSONL_BAD_LINE (-3)

typedef enum strata_jsonl_kind { STRATA_JSONL_TEXT, STRATA_JSONL_PROMPT, STRATA_JSONL_MESSAGES } strata_jsonl_kind;

/* What becomes of an example longer than seq_len: split (it runs on into the next
 * sequences), dropped, or truncated to its first seq_len tokens (dropped when those learn
 * nothing: a conversation whose first answer starts past them). */
typedef enum strata_jsonl_overflow {
    STRATA_JSONL_SPLIT = 0,
    STRATA_JSONL_DROP,
    STRATA_JSONL_TRUNCATE,
} strata_jsonl_overflow;

typedef struct strata_jsonl_opts {
    const char *const *files;
    int n_files;
    strata_jsonl_kind kind;
    const char *text_field, *prompt_field, *response_field, *messages_field;
    strata_chat_format chat_format; /* MESSAGES */
    const char *system_prompt;      /* MESSAGES: the system message of a conversation without one; NULL: none */
    int seq_len;
    strata_jsonl_overflow overflow; /* an example longer than seq_len */
    int pack_in_order;  /* 1: pack examples in order, 0: best fit (the default) */
    int val_at_end;     /* 1: each file's last examples are the validation set, 0: spread */
    int skip_bad;       /* 1: skip and count a malformed line, 0: stop at it */
    int dedup;          /* 1: drop an example that repeats an earlier one (the same tokens, the same of them
                         * learned), in the files' order; 0: keep it (the report counts them either way) */
    double val_fraction;
    size_t max_shard_tokens;
    int threads;        /* threads tokenizing lines (one more packs): 0, the CPUs this process may use; at
                         * most STRATA_PREPARE_MAX_THREADS (io/data.h) */
} strata_jsonl_opts;


typedef struct strata_jsonl_report {
    size_t examples, bad;             /* examples packed; lines skipped */
    size_t duplicates;                /* examples repeating an earlier one (dropped with dedup) */
    size_t split, dropped, truncated; /* longer than seq_len, by what became of them */
    size_t train_seqs, val_seqs;
    size_t train_tokens, val_tokens, train_learned, val_learned, padding;
    int train_shards, val_shards;
    /* every well-formed example's length in tokens, whatever became of it: the median, the
     * 99th percentile and the longest (nearest rank), to choose --seq-len by */
    size_t len_median, len_p99, len_max;
    int threads; /* the lines were tokenized on */
} strata_jsonl_report;

/* The kind and fields of a JSONL file's examples, from the keys of its first example, as
 * the common layouts name them (the first that fits): "messages" or "conversations" (a
 * chat; ShareGPT's from/value too), "prompt" and "completion" both arrays of messages (TRL's
 * conversational prompt-completion), "prompt" with "completion" or "response", "instruction"
 * with "output" (Alpaca's: "instruction,input" the prompt), "text". Sets o->kind and its
 * fields (static strings) and writes what it chose, and why, into said. 0; or -1 + an error
 * naming the file and the keys it found when none fits, the file cannot be read or its
 * first example is not a JSON object. */
int strata_jsonl_detect(const char *path, strata_jsonl_opts *o, char *said, size_t said_len);

/* Prepares out_dir (replaced whole, as io/data.h's strata_prepare_dir) from the JSONL files
 * with tokenizer tk, which is written beside the shards (with the chat template of a
 * messages format in its tokenizer_config.json). Returns 0, STRATA_JSONL_BAD_LINE,
 * STRATA_PREPARE_REFUSED or -1, the error set. */
int strata_prepare_jsonl(const strata_jsonl_opts *o, const char *out_dir, strata_bpe *tk, strata_jsonl_report *r);

#endif
