/* io/checkpoint_prune.h: removing checkpoints a run no longer needs: the retention that
 * follows every commit (io/checkpoint_write.c calls it). strata_ckpt_clean_stale, the
 * same job at the start of a run, is public (io/checkpoint.h). */
#ifndef STRATA_CHECKPOINT_PRUNE_H
#define STRATA_CHECKPOINT_PRUNE_H

/* After a commit: the newest `keep` complete checkpoints in ckpt_dir stay (0 keeps all;
 * `current`, the step directory just committed, always stays, and so does `protect`, the
 * one of the best validation loss with run.keep_best; "" for none), and every unfinished
 * step_*.tmp or step_*.old directory goes. Failures are warnings: the new checkpoint is
 * already safe. */
void strata_ckpt_prune(const char *ckpt_dir, const char *current, int keep, const char *protect);

#endif
