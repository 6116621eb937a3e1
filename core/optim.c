/* core/optim.c: learning-rate schedule. */
#include "core/optim.h"

#include <math.h>

double strata_lr_at(const strata_config *c, int64_t step) {
    double lr = c->optim.lr, min_lr = c->optim.min_lr;
    int64_t warmup = c->optim.warmup_steps, total = c->train.steps;
    if (step < warmup) return lr * (double)(step + 1) / (double)warmup;
    if (c->optim.schedule == STRATA_SCHEDULE_CONSTANT || total <= warmup) return lr;
    double progress = (double)(step - warmup) / (double)(total - warmup);
    if (progress > 1.0) progress = 1.0;
    double coeff = c->optim.schedule == STRATA_SCHEDULE_COSINE ? 0.5 * (1.0 + cos(M_PI * progress))
                                                                : 1.0 - progress;
    return min_lr + coeff * (lr - min_lr);
}

strata_adamw_args strata_adamw_args_at(const strata_config *c, int64_t step, float grad_scale) {
    double t = (double)(step + 1);
    return (strata_adamw_args){
        .lr = (float)strata_lr_at(c, step),
        .beta1 = (float)c->optim.beta1,
        .beta2 = (float)c->optim.beta2,
        .eps = (float)c->optim.eps,
        .weight_decay = (float)c->optim.weight_decay,
        .bc1 = (float)(1.0 - pow(c->optim.beta1, t)),
        .bc2 = (float)(1.0 - pow(c->optim.beta2, t)),
        .grad_scale = grad_scale,
    };
}
