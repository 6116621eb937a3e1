/* core/optim.h: the learning-rate schedule, AdamW's per-step arguments, and the walk that
 * splits a unit's optimizer range at tensor boundaries, which every AdamW (the device
 * kernels, the CPU's in offload/) shares. */
#ifndef STRATA_OPTIM_H
#define STRATA_OPTIM_H

#include <stddef.h>
#include <stdint.h>

#include "core/kernels.h"
#include "core/model.h"

typedef enum { STRATA_SCHEDULE_COSINE = 0, STRATA_SCHEDULE_LINEAR, STRATA_SCHEDULE_CONSTANT } strata_schedule;

/* AdamW and its learning-rate schedule (a config's `optim` section). */
typedef struct strata_optim_settings {
    double lr, min_lr;
    int warmup_steps;
    strata_schedule schedule;
    double beta1, beta2, eps, weight_decay, grad_clip;
} strata_optim_settings;

/* Learning rate for optimizer step `step` (0-based) of total_steps: linear warmup from
 * lr/warmup to lr over warmup_steps, then cosine (or linear) decay to min_lr at
 * total_steps, or constant. */
double strata_lr_at(const strata_optim_settings *o, int64_t total_steps, int64_t step);

/* AdamW arguments for step `step` (0-based; bias corrections use t = step + 1). */
strata_adamw_args strata_adamw_args_at(const strata_optim_settings *o, int64_t total_steps, int64_t step,
                                       float grad_scale);

/* The most pieces a unit's optimizer range splits into: a range crosses every tensor of its
 * unit at most once (a GPT-2 block has 12). */
#define STRATA_ADAMW_MAX_SEGMENTS 64

/* A piece [lo, lo + n) of an optimizer range, relative to the range's start, inside one
 * tensor: weight decay applies to it or not (matrices only, model.h's decay flags). */
typedef struct strata_adamw_segment {
    size_t lo, n;
    int decay;
} strata_adamw_segment;

/* Splits elements [lo, lo + n) of unit u's flat buffer at tensor boundaries (the padding
 * after the last tensor is one piece without decay); returns the number of pieces. */
int strata_adamw_segments(const strata_model *m, int u, size_t lo, size_t n,
                          strata_adamw_segment seg[STRATA_ADAMW_MAX_SEGMENTS]);

/* Where each unit's optimizer state lives when it is split between a faster and a slower
 * place (offload.optimizer_ratio: device | tier; offload.nvme_ratio: pinned | NVMe): units,
 * in forward order, stay in the faster one while the elements kept there stay within
 * `faster_share` (0..1) of all; the others get slower[u] = 1. A unit of n[u] = 0 is in
 * neither (slower[u] = 0). The first units are the first the next forward needs. */
void strata_split_units(const size_t *n, int count, double faster_share, unsigned char *slower);

#endif
