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

/* How Adam's moments are stored (optim.state); the fp32 master weights stay fp32 in all three:
 *   fp32  m and v fp32 (4 + 4 + 4 bytes per parameter with the master)
 *   bf16  m and v bf16, rounded to nearest even after each update (4 + 2 + 2)
 *   int8  m and v as 8-bit codes with an fp32 absmax per 2048-element block, tensors under
 *         4096 elements kept fp32 (core/quant.h; 4 + 1 + 1 + 8/2048) */
typedef enum { STRATA_OPTIM_STATE_FP32 = 0, STRATA_OPTIM_STATE_BF16, STRATA_OPTIM_STATE_INT8 } strata_optim_state;

/* AdamW and its learning-rate schedule (a config's `optim` section). */
typedef struct strata_optim_settings {
    double lr, min_lr;
    int warmup_steps;
    double warmup_ratio; /* config: warmup_steps as a share of train.steps (the run sets warmup_steps) */
    strata_schedule schedule;
    double beta1, beta2, eps, weight_decay, grad_clip;
    strata_optim_state state;
} strata_optim_settings;

/* "fp32", "bf16", "int8" */
const char *strata_optim_state_name(strata_optim_state s);
/* Bytes of one stored moment element: 4, 2 or 1 (int8's small tensors and absmax apart). */
size_t strata_optim_moment_bytes(strata_optim_state s);

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
 * tensor: weight decay applies to it or not (matrices only, model.h's decay flags). With
 * int8 state, `quant` says its moments are 8-bit codes (a tensor of at least
 * STRATA_Q8_MIN_NUMEL elements, or the padding after the last tensor, which stays 0); a piece
 * of a smaller tensor keeps fp32 moments, packed with the range's other such pieces in two
 * arrays of their own: `small` is where its first element is there. */
typedef struct strata_adamw_segment {
    size_t lo, n;
    int decay;
    int quant;
    size_t small;
} strata_adamw_segment;

/* Splits elements [lo, lo + n) of unit u's flat buffer at tensor boundaries (the padding
 * after the last tensor is one piece without decay); returns the number of pieces. Every
 * piece has quant 0, small 0: fp32 (and bf16) state. */
int strata_adamw_segments(const strata_model *m, int u, size_t lo, size_t n,
                          strata_adamw_segment seg[STRATA_ADAMW_MAX_SEGMENTS]);
/* The same pieces for moments stored as `state` says: with int8 state, quant and small as
 * described above. */
int strata_adamw_segments_for(const strata_model *m, int u, size_t lo, size_t n, strata_optim_state state,
                              strata_adamw_segment seg[STRATA_ADAMW_MAX_SEGMENTS]);
/* int8 state: elements of [lo, lo + n) of unit u whose moments stay fp32 (the length of the
 * range's packed arrays); 0 for fp32 and bf16 state. */
size_t strata_adamw_small_count(const strata_model *m, int u, size_t lo, size_t n, strata_optim_state state);
/* Whether a tensor of numel elements keeps fp32 moments under int8 state. */
int strata_q8_small_tensor(size_t numel);

/* Where each unit's optimizer state lives when it is split between a faster and a slower
 * place (offload.optimizer_ratio: device | tier; offload.nvme_ratio: pinned | NVMe): units,
 * in forward order, stay in the faster one while the elements kept there stay within
 * `faster_share` (0..1) of all; the others get slower[u] = 1. A unit of n[u] = 0 is in
 * neither (slower[u] = 0). The first units are the first the next forward needs. */
void strata_split_units(const size_t *n, int count, double faster_share, unsigned char *slower);

#endif
