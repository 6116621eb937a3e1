/* launcher/signals.h: what a training run does on a signal. SIGINT and SIGTERM ask it to
 * stop (the loop checkpoints and ends once every rank agrees); under mpirun, the signals
 * mpirun sends the survivors when a rank has vanished make a survivor name the lost ranks
 * and their hosts, what it was itself doing and the checkpoint to resume from, then exit 1
 * at once (launcher/signals.c says why).
 *
 * The training loop tells this module where it is (strata_signals_doing, _step, _saved),
 * so the message written from the handler can say it; nothing else is shared with the
 * handler. */
#ifndef STRATA_SIGNALS_H
#define STRATA_SIGNALS_H

#include <stddef.h>
#include <stdint.h>

/* What this rank is in, as the vanished-rank message names it. */
typedef enum strata_doing {
    STRATA_DOING_START,  /* starting up (the message names no step) */
    STRATA_DOING_STEP,   /* a training step */
    STRATA_DOING_EVAL,   /* validation */
    STRATA_DOING_AGREE,  /* agreeing on the step's end */
    STRATA_DOING_SAVE,   /* saving a checkpoint */
    STRATA_DOING_FINISH, /* the final optimizer update */
    STRATA_DOING_TRIAL,  /* a step of a memory.auto trial (launcher/auto.c), before the run's first */
    STRATA_DOING_END,    /* past the run's last collective: a rank that is gone may have ended as it should */
} strata_doing;

/* Where the run's checkpoints are (run.dir), for the messages; also makes the note a
 * collective that times out ends with (shard/peers.h) say what this rank was in and the
 * checkpoint to resume from. */
void strata_signals_run_dir(const char *dir);
/* Handles SIGINT and SIGTERM, and at world > 1 SIGCONT (mpirun's first word when a rank
 * has died; the ranks must have met first, strata_peers_exchange, for the handler to ask
 * after them); ignores SIGPIPE, so a terminal that is gone fails writes instead of ending the
 * run. A stop request is acted on at the step's end, and within a batch or a token by
 * validation and the final sample; a second signal asks nothing more: the stop is under
 * way, and a checkpoint being written is finished, never cut off. */
void strata_signals_install(int world);
/* The signal that asked this rank to stop (SIGINT or SIGTERM), 0 if none came. */
int strata_signals_stop_requested(void);

void strata_signals_doing(strata_doing what);
void strata_signals_step(int64_t step);  /* the step in progress, 1-based */
void strata_signals_saved(int64_t step); /* the last checkpoint written or resumed from (-1: none) */

/* For launcher/watchdog.c, from its own thread: what the rank is in, and since when
 * (strata_now_ms of the last strata_signals_doing or _step). */
strata_doing strata_signals_where(double *since_ms);
/* "This rank was in a training step (step 7). The last checkpoint, step 6 (DIR/ckpt/
 * step_00000006), is intact: resume with --resume latest." into buf (cap bytes). */
void strata_signals_note(char *buf, size_t cap);

#endif
