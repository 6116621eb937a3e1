/* shard/acts_home.h: the residual streams in pinned host memory (offload.activations: cpu).
 *
 * A model's L+1 residual streams (B,T,C) are the activations that outlive a block: the
 * input of block l is stream l, read again by its backward (and, with activation
 * checkpointing, all a recomputed block keeps). With offload.activations the model keeps K
 * of them on the device (STRATA_ACTS_HOME_SLOTS; stream l in buffer l % K,
 * strata_model_resid), and this moves the others: in training, the stream unit u writes
 * (the embedding stream 0, block l stream l+1) is copied out on a DEVICE stream of its own
 * once written, if a later forward writes over its buffer before the backward reads it;
 * before unit u's backward (which reads stream u-1), the stream the next backward reads is
 * copied back in on another, behind the backward at hand. Compute waits for a buffer's copy
 * out before writing over it, and for a copy in before reading it: every copy a micro-step
 * starts is waited for within it, so evaluation and sampling, which write the buffers
 * without copies, need nothing from here. The values are the same bits wherever they
 * live, so a run is bitwise the run that keeps every stream on the device.
 *
 * The engine calls the three hooks around each unit's forward and backward of a training
 * micro-step, in the schedule's order (the forward 0..L+1, the backward L+1..0), and waits
 * (with its own accounting) for the events they hand back. */
#ifndef STRATA_ACTS_HOME_H
#define STRATA_ACTS_HOME_H

#include <stdint.h>

#include "core/arena.h"
#include "core/device.h"
#include "core/model.h"

/* Residual streams kept on the device: the one a block reads, the one it writes, and one
 * whose copy out (or in) has a block's time to finish. */
#define STRATA_ACTS_HOME_SLOTS 3

typedef struct strata_acts_home strata_acts_home;

/* After strata_model_plan with resid_slots STRATA_ACTS_HOME_SLOTS: reserves the pinned
 * copies (activations) of the streams the device does not keep through the forward, each
 * B*T*C elements of `es` bytes (the compute dtype's). NULL
 * when it keeps them all (a model of fewer than STRATA_ACTS_HOME_SLOTS blocks). */
strata_acts_home *strata_acts_home_plan(const strata_model *m, strata_arena *a, size_t es);
/* Its copy streams and events (a run with a device). */
void strata_acts_home_open(strata_acts_home *h, strata_device *dev);
void strata_acts_home_free(strata_acts_home *h);
/* Pinned bytes it reserved. */
size_t strata_acts_home_bytes(const strata_acts_home *h);

/* Before unit u's forward: the event compute waits for before u writes its stream over its
 * buffer's last one (that one's copy out), or NULL. */
strata_event *strata_acts_home_before_forward(strata_acts_home *h, int u);
/* After unit u's forward in training: its stream's copy out, if the backward needs it back. */
int strata_acts_home_after_forward(strata_acts_home *h, int u);
/* Before unit u's backward: the copy in of the stream the next backward reads, behind this
 * one; *wait = the event compute waits for before u reads its own (its copy in), or NULL. */
int strata_acts_home_before_backward(strata_acts_home *h, int u, strata_event **wait);
/* The bytes copied out and in since the last call. */
void strata_acts_home_take_bytes(strata_acts_home *h, uint64_t *d2h, uint64_t *h2d);

#endif
