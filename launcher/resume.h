/* launcher/resume.h: what `strata train --resume` must agree with before anything is
 * built: the checkpoint's own config and tokenizer.
 *
 * The keys the weights' meaning depends on (strata_config_check_same_model: the shapes and
 * model.n_head) must be the checkpoint's; a run that changes one is another run. The
 * data's tokenizer must be the one the checkpoint was trained with (launcher/tokenizer.h),
 * unless the change is asked for (--allow-new-tokenizer): token ids would silently mean
 * other text. */
#ifndef STRATA_RESUME_H
#define STRATA_RESUME_H

#include "io/bpe.h"
#include "io/config.h"

/* Resolves and opens `resume` (as --resume takes it, against cfg's run.dir) and checks cfg
 * and the data's tokenizer `data_tk` (NULL: the data has none) against it. 0, or -1 +
 * error, with *usage = 1 when that is bad input (a changed model key, another tokenizer
 * not allowed, an edited manifest: exit 2) and 0 for a failure (exit 1). */
int strata_resume_check(const strata_config *cfg, const char *resume, const strata_bpe *data_tk,
                        int allow_new_tokenizer, int *usage);

#endif
