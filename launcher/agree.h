/* launcher/agree.h: under mpirun, every rank's run against rank 0's, before any collective
 * work: its effective config (the keys that may differ per machine left out:
 * train.threads, offload.nvme_path, and the data paths, whose content is compared
 * instead), its data (the shard lists of data.train and data.val: names and sizes) and its
 * tokenizer. Ranks that differ would hang in a collective (train.steps), abort inside MPI
 * (model.n_layer, zero.stage) or train on silently (optim.lr). A rank that sees no shard,
 * or cannot read one, is named with its host, before step 1. */
#ifndef STRATA_AGREE_H
#define STRATA_AGREE_H

#include "io/bpe.h"
#include "io/config.h"

/* Every rank calls it with its own config and data tokenizer (NULL: none). Returns 0 when
 * every rank agrees with rank 0; 1 on every rank when one differs, rank 0 having printed
 * one line per difference, naming the ranks and the keys with both values ("rank 1's
 * config differs from rank 0's (rank 0's value first): train.steps 10 vs 12"); -1 + error
 * when the exchange itself failed. World 1 agrees at once. */
int strata_ranks_agree(const strata_config *cfg, const strata_bpe *tk, int rank, int world);

/* Before that, every rank's own refusal of its config (rc: 0, or the exit code it would
 * end with; why: its message, the config's path first), gathered: rank 0 prints a reason
 * every rank gives alike once, as a single rank would, and otherwise each reason with the
 * ranks and hosts that gave it ("ranks 2, 3 on h2: r.yaml: key 'offload.nvme_path': ...":
 * a path one host lacks). Returns the largest rc on every rank (0: every rank goes on), or
 * -1 + error when the exchange itself failed. Needs the ranks' hosts (shard/peers.h). */
int strata_ranks_refusals(int rc, const char *why, int rank, int world);

/* After rank 0 has said why the ranks refuse a run together: every rank waits for it (a
 * broadcast from rank 0), so none ends the job (MPI_Abort) while rank 0's lines are still
 * on their way. 0, or -1 + error. */
int strata_ranks_spoken(void);

#endif
