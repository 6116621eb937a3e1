/* core/profile.h: the kernel profile of a training step (STRATA_PROFILE=kernels): where
 * the compute stream's time goes, by kernel group and phase, as a table at the end of a run.
 *
 * Each timed call is a pair of timed events on the compute stream, one before the call is
 * enqueued and one after, so the device's own clock times it (core/device.h). A step also
 * records a start and an end event; what lies between them outside every pair (memsets,
 * the gradient norm, the loss's copy, the host's gaps) is "other". The events of a step go
 * into one of two banks, taken in turn, and a bank is read after the NEXT step's sync of
 * the compute stream (which has then passed the step's AdamW), or by strata_prof_flush at
 * the end of a run: the profile adds no sync inside a step.
 *
 * Off (the default) the engine makes no profiler and the model's hooks see a NULL pointer:
 * no events are made or recorded. All events are made at creation; a step allocates
 * nothing. Calls past the capacity are counted as untimed (their time lands in "other"). */
#ifndef STRATA_PROFILE_H
#define STRATA_PROFILE_H

#include <stdint.h>
#include <stdio.h>

#include "core/device.h"

/* Kernel groups; matrix products by role. */
typedef enum strata_prof_group {
    STRATA_PROF_EMBEDDING = 0,
    STRATA_PROF_LAYERNORM,
    STRATA_PROF_RMSNORM,         /* the Llama family's norms, the q/k norms included */
    STRATA_PROF_MATMUL_QKV,      /* attn.c_attn; self_attn.q|k|v_proj */
    STRATA_PROF_ROPE,            /* rotary positions on q and k */
    STRATA_PROF_ATTENTION,
    STRATA_PROF_MATMUL_ATTPROJ,  /* attn.c_proj; self_attn.o_proj */
    STRATA_PROF_RESIDUAL,
    STRATA_PROF_MATMUL_FC,       /* mlp.c_fc (forward: bias + GELU fused in); mlp.gate|up_proj */
    STRATA_PROF_GELU,
    STRATA_PROF_SWIGLU,
    STRATA_PROF_MATMUL_FCPROJ,   /* mlp.c_proj; mlp.down_proj */
    STRATA_PROF_CLASSIFIER,      /* the LM head */
    STRATA_PROF_CROSSENTROPY,    /* softmax cross-entropy and the loss sum */
    STRATA_PROF_ADAMW,
    STRATA_PROF_COMM_WAIT,       /* compute standing still for collectives */
    STRATA_PROF_GROUPS
} strata_prof_group;

/* Phases a step's calls are counted in; set by the engine (the model sets RECOMPUTE
 * around a checkpointed block's rebuild). */
typedef enum strata_prof_phase {
    STRATA_PROF_FORWARD = 0,
    STRATA_PROF_BACKWARD,
    STRATA_PROF_RECOMPUTE, /* activation checkpointing's forward, inside backward */
    STRATA_PROF_UPDATE,    /* after the micro-steps: the last reductions and AdamW */
    STRATA_PROF_PHASES
} strata_prof_phase;

const char *strata_prof_group_name(int g);
const char *strata_prof_phase_name(int ph);

typedef struct strata_prof_bank {
    strata_event *start, *end;
    strata_event **ev;    /* 2 * cap: [2i] before call i, [2i+1] after it */
    uint8_t *phase, *group; /* per call */
    int used, untimed;
    int pending;          /* recorded, not read yet */
} strata_prof_bank;

typedef struct strata_prof {
    strata_device *dev;
    int cap;   /* timed calls per step */
    int phase; /* the phase calls are counted in now */
    int cur;   /* the bank the step in progress records into, -1 between steps */
    int next;
    strata_prof_bank bank[2];
    /* sums over the steps read, and the first step's own (left out of the means: warm-up) */
    int steps, untimed, first_untimed, read_errors;
    double step_ms, first_step_ms;
    double ms[STRATA_PROF_PHASES][STRATA_PROF_GROUPS], first_ms[STRATA_PROF_PHASES][STRATA_PROF_GROUPS];
    uint64_t calls[STRATA_PROF_PHASES][STRATA_PROF_GROUPS], first_calls[STRATA_PROF_PHASES][STRATA_PROF_GROUPS];
} strata_prof;

/* A profiler timing up to cap calls per step; NULL + error when events cannot be made. */
strata_prof *strata_prof_create(strata_device *d, int cap);
void strata_prof_destroy(strata_prof *p);

/* The step's start, into the next bank (a bank still unread is read first). */
void strata_prof_step_begin(strata_prof *p);
/* The step's end; ok == 0 (the step failed) drops its events. */
void strata_prof_step_end(strata_prof *p, int ok);
/* Reads every finished step's bank, waiting for nothing after a sync of the compute
 * stream: call it right after the step's sync. 0, or -1 + error when an event can't be read. */
int strata_prof_collect(strata_prof *p);
/* End of a run: waits for the last step's end event, then reads it. */
int strata_prof_flush(strata_prof *p);

static inline void strata_prof_set_phase(strata_prof *p, strata_prof_phase ph) {
    if (p) p->phase = ph;
}
int strata_prof_begin_(strata_prof *p, strata_prof_group g);
void strata_prof_end_(strata_prof *p, int call);
/* Before a timed call: the call's index, or -1 (no profiler, or past the capacity). */
static inline int strata_prof_begin(strata_prof *p, strata_prof_group g) { return p ? strata_prof_begin_(p, g) : -1; }
/* After it (enqueued): closes call `call` from strata_prof_begin. */
static inline void strata_prof_end(strata_prof *p, int call) {
    if (p && call >= 0) strata_prof_end_(p, call);
}

/* The means per step: over the steps read, the first left out when there are two or more. */
typedef struct strata_prof_report {
    int steps;      /* steps averaged */
    int warmup;     /* 1: the first step was left out */
    double untimed; /* calls past the capacity, per step */
    double step_ms; /* the compute stream's span of a step, start to end */
    double ms[STRATA_PROF_PHASES][STRATA_PROF_GROUPS];
    double calls[STRATA_PROF_PHASES][STRATA_PROF_GROUPS];
    double timed_ms; /* the sum of ms */
    double other_ms; /* step_ms - timed_ms */
} strata_prof_report;

/* 0, or -1 + error when no step was read. */
int strata_prof_report_get(const strata_prof *p, strata_prof_report *r);
/* The table: phase, group, calls per step, ms per step, share of the step; a line per
 * group with calls, a total per phase, then other and the step. Each line starts with
 * `prefix`. */
void strata_prof_print(const strata_prof_report *r, const char *prefix, FILE *f);

#endif
