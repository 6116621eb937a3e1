/* core/optim.h: the learning-rate schedule and AdamW's per-step arguments. */
#ifndef STRATA_OPTIM_H
#define STRATA_OPTIM_H

#include <stdint.h>

#include "core/config.h"
#include "core/kernels.h"

/* Learning rate for optimizer step `step` (0-based): linear warmup from lr/warmup to lr
 * over warmup_steps, then cosine (or linear) decay to min_lr at train.steps, or constant. */
double strata_lr_at(const strata_config *c, int64_t step);

/* AdamW arguments for step `step` (0-based; bias corrections use t = step + 1). */
strata_adamw_args strata_adamw_args_at(const strata_config *c, int64_t step, float grad_scale);

#endif
