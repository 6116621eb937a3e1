/* launcher/tokenizer.h: which tokenizer a run's token ids mean, from data to export.
 *
 * `strata prepare` writes tokenizer.json beside the shards it makes. A run's tokenizer is
 * data.tokenizer when set, else that tokenizer.json beside the data.train shards; at the
 * start of training it is checked against model.vocab_size and copied into run.dir as
 * tokenizer.json, so the run's checkpoints (run.dir/ckpt/step_N) find it again: `strata
 * sample` encodes prompts and decodes with it, `strata export` ships it. Data without
 * one (llm.c's GPT-2 shards, shards made before this) leaves the run without one.
 *
 * A run's tokenizer changes only on purpose (`strata train --resume --allow-new-tokenizer`,
 * launcher/resume.h): the checkpoints written before then get a copy of the old one as
 * step_N/tokenizer.json, which is found first, so each step keeps the tokenizer it was
 * trained with. */
#ifndef STRATA_RUN_TOKENIZER_H
#define STRATA_RUN_TOKENIZER_H

#include <stddef.h>

#include "io/bpe.h"
#include "io/config.h"

/* The data's tokenizer (NULL, without error, when there is none). Fails, for exit 2, when
 * data.tokenizer cannot be read or the tokenizer has more tokens than model.vocab_size. */
int strata_run_tokenizer_open(const strata_config *cfg, strata_bpe **out);
/* Writes tk into run.dir as tokenizer.json (creating run.dir); when that replaces another
 * tokenizer, the run's checkpoints without one of their own first get a copy of the old. */
int strata_run_tokenizer_record(const strata_config *cfg, const strata_bpe *tk);
/* The tokenizer checkpoint `ckpt_dir` was trained with: its own tokenizer.json, else the
 * one recorded by the run it belongs to; NULL when there is none (NULL with strata_error()
 * set when one is there but unreadable: *failed = 1). */
strata_bpe *strata_ckpt_tokenizer(const char *ckpt_dir, int *failed);

#endif
