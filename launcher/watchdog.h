/* launcher/watchdog.h: a training run that stops making progress ends, rather than hang.
 *
 * Several ranks have comm.timeout_s: a collective that never completes ends the job. One
 * rank has no collective to time out, and a device that never reaches a record (a kernel
 * that does not end, a lost GPU, a disk that does not answer) would hold it forever; the
 * backends only report such a wait (STRATA_WAIT_REPORT_S). So a thread watches where the
 * training loop is (launcher/signals.h's strata_signals_doing and _step, which mark every
 * step, validation and the final update as they begin): when one of those has gone on
 * longer than run.hang_timeout_s, it says what the rank was in and which checkpoint to
 * resume from, and ends the process with STRATA_EXIT_HUNG. Start-up is not watched (loading
 * a large model is slow), but memory.auto's trial steps in it are. A save cut off leaves the
 * last checkpoint as it was (a save is written aside and renamed into place), so saves are
 * watched too.
 *
 * run.hang_timeout_s 0 (auto): 20 times the longest of the same kind so far (steps,
 * validations, saves, ...), at least 20 minutes, and an hour for the first of a kind.
 * Saves keep auto's limit whatever run.hang_timeout_s says.
 * STRATA_WATCHDOG_MIN_S (tests) replaces the 20 minutes; the first of a kind gets three
 * times it. */
#ifndef STRATA_WATCHDOG_H
#define STRATA_WATCHDOG_H

/* Starts the watching thread (once; later calls do nothing). limit_s > 0: the fixed limit;
 * 0: auto. */
void strata_watchdog_start(double limit_s);

#endif
