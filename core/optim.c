/* core/optim.c: the learning-rate schedule, AdamW's arguments and its segment walk. */
#include "core/optim.h"

#include <math.h>

#include "core/common.h"
#include "core/quant.h"

const char *strata_optim_state_name(strata_optim_state s) {
    return s == STRATA_OPTIM_STATE_INT8 ? "int8" : s == STRATA_OPTIM_STATE_BF16 ? "bf16" : "fp32";
}

size_t strata_optim_moment_bytes(strata_optim_state s) {
    return s == STRATA_OPTIM_STATE_INT8 ? 1 : s == STRATA_OPTIM_STATE_BF16 ? 2 : 4;
}

int strata_q8_small_tensor(size_t numel) { return numel < STRATA_Q8_MIN_NUMEL; }

double strata_lr_at(const strata_optim_settings *o, int64_t total_steps, int64_t step) {
    double lr = o->lr, min_lr = o->min_lr;
    int64_t warmup = o->warmup_steps, total = total_steps;
    if (step < warmup) return lr * (double)(step + 1) / (double)warmup;
    if (o->schedule == STRATA_SCHEDULE_CONSTANT || total <= warmup) return lr;
    double progress = (double)(step - warmup) / (double)(total - warmup);
    if (progress > 1.0) progress = 1.0;
    double coeff = o->schedule == STRATA_SCHEDULE_COSINE ? 0.5 * (1.0 + cos(M_PI * progress))
                                                                : 1.0 - progress;
    return min_lr + coeff * (lr - min_lr);
}

strata_adamw_args strata_adamw_args_at(const strata_optim_settings *o, int64_t total_steps, int64_t step,
                                       float grad_scale) {
    double t = (double)(step + 1);
    return (strata_adamw_args){
        .lr = (float)strata_lr_at(o, total_steps, step),
        .beta1 = (float)o->beta1,
        .beta2 = (float)o->beta2,
        .eps = (float)o->eps,
        .weight_decay = (float)o->weight_decay,
        .bc1 = (float)(1.0 - pow(o->beta1, t)),
        .bc2 = (float)(1.0 - pow(o->beta2, t)),
        .grad_scale = grad_scale,
    };
}

int strata_adamw_segments_for(const strata_model *m, int u, size_t lo, size_t n, strata_optim_state state,
                              strata_adamw_segment seg[STRATA_ADAMW_MAX_SEGMENTS]) {
    const strata_unit *unit = &m->units[u];
    size_t hi = lo + n, pos = lo, small = 0;
    int k = 0;
    while (pos < hi) {
        size_t end = hi;
        int decay = 0, quant = state == STRATA_OPTIM_STATE_INT8; /* the padding: quantized, and 0 */
        for (int i = 0; i < unit->n_tensors; i++) {
            const strata_param_tensor *t = &m->tensors[unit->first_tensor + i];
            if (pos >= t->offset && pos < t->offset + t->numel) {
                end = t->offset + t->numel < hi ? t->offset + t->numel : hi;
                decay = m->decay[unit->first_tensor + i];
                quant = quant && !strata_q8_small_tensor(t->numel);
                break;
            }
        }
        STRATA_ASSERT(k < STRATA_ADAMW_MAX_SEGMENTS);
        int fp32_small = state == STRATA_OPTIM_STATE_INT8 && !quant;
        seg[k++] = (strata_adamw_segment){pos - lo, end - pos, decay, quant, fp32_small ? small : 0};
        if (fp32_small) small += end - pos;
        pos = end;
    }
    return k;
}

int strata_adamw_segments(const strata_model *m, int u, size_t lo, size_t n,
                          strata_adamw_segment seg[STRATA_ADAMW_MAX_SEGMENTS]) {
    return strata_adamw_segments_for(m, u, lo, n, STRATA_OPTIM_STATE_FP32, seg);
}

size_t strata_adamw_small_count(const strata_model *m, int u, size_t lo, size_t n, strata_optim_state state) {
    if (state != STRATA_OPTIM_STATE_INT8) return 0;
    strata_adamw_segment seg[STRATA_ADAMW_MAX_SEGMENTS];
    int k = strata_adamw_segments_for(m, u, lo, n, state, seg);
    size_t small = 0;
    for (int i = 0; i < k; i++)
        if (!seg[i].quant) small += seg[i].n;
    return small;
}

void strata_split_units(const size_t *n, int count, double faster_share, unsigned char *slower) {
    size_t total = 0, kept = 0;
    for (int u = 0; u < count; u++) total += n[u];
    double room = faster_share * (double)total;
    for (int u = 0; u < count; u++) {
        slower[u] = 0;
        if (!n[u]) continue;
        if ((double)(kept + n[u]) <= room) kept += n[u];
        else slower[u] = 1;
    }
}
