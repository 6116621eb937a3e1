/* tests/test_profile.c: the kernel profile (core/profile.h, STRATA_PROFILE=kernels) on the
 * CPU backend, through the real engine and model:
 *  - calls per step are the model's structure exactly, per phase (layernorm forward
 *    2 L + 1, one classifier, AdamW one per optimizer segment, a recompute phase with
 *    activation checkpointing, calls times grad_accum);
 *  - the groups' ms sum to no more than the step, and cover at least 80% of it (on the
 *    CPU every kernel is timed; "other" is memsets, the norm, the host's gaps);
 *  - losses are bitwise those of the same run without the profile (stage 0 and 3);
 *  - off, the engine makes no timed event at all;
 *  - the profiler alone: calls past the capacity are counted as untimed, a failed step's
 *    events are dropped, no step is an error, the first step is left out as warm-up,
 *    and the table prints a line per group with calls, the phase totals and the step. */
#include <math.h>
#include <omp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/arena.h"
#include "core/common.h"
#include "core/kernels.h"
#include "core/model.h"
#include "core/optim.h"
#include "core/profile.h"
#include "io/config.h"
#include "io/data.h"
#include "shard/comm.h"
#include "shard/engine.h"
#include "tests/check.h"

enum { STEPS = 3, L = 4 };
static char data_glob[256];
static strata_device *dev;
static strata_comm *single;

/* The CPU backend's table with timed-event creation counted: proves "off makes none". */
static strata_device_ops counting_ops;
static const strata_device_ops *real_ops;
static int timed_created;
static strata_event *count_event_create_timed(strata_device *d) {
    timed_created++;
    return real_ops->event_create_timed(d);
}

typedef struct run {
    strata_config cfg;
    strata_model m;
    strata_arena arena;
    strata_engine *e;
    strata_loader Ld;
    double loss[STEPS];
} run;

static void run_open(run *r, int stage, int accum, int ckpt_every, int profile) {
    memset(r, 0, sizeof *r);
    char sets[4][320];
    snprintf(sets[0], 320, "zero.stage=%d", stage);
    snprintf(sets[1], 320, "train.grad_accum=%d", accum);
    if (ckpt_every) snprintf(sets[2], 320, "train.activation_checkpointing=every:%d", ckpt_every);
    else snprintf(sets[2], 320, "train.activation_checkpointing=none");
    snprintf(sets[3], 320, "data.train=%s", data_glob);
    const char *sp[4] = {sets[0], sets[1], sets[2], sets[3]};
    const char *yaml = "device: cpu\n"
                       "model: {n_layer: 4, n_head: 2, n_embd: 64, seq_len: 32, vocab_size: 256}\n"
                       "data: {train: x, shuffle: false}\n"
                       "train: {steps: 3, seed: 5, micro_batch: 8}\n"
                       "optim: {lr: 1.0e-3, warmup_steps: 1, grad_clip: 1.0, weight_decay: 0.1}\n";
    if (strata_config_load_string(&r->cfg, "test.yaml", yaml, sp, 4)) {
        printf("config: %s\n", strata_error());
        exit(1);
    }
    strata_model_shape shape = strata_config_model_shape(&r->cfg);
    strata_model_init(&r->m, &shape);
    strata_arena_init(&r->arena, dev);
    r->e = strata_engine_create(&r->cfg, &r->m, &r->arena, dev, single, NULL, 0, 1);
    if (strata_arena_commit(&r->arena) || strata_engine_init_params(r->e, r->cfg.train.seed) ||
        strata_loader_open(&r->Ld, data_glob, 32, 256, 0, 5) || (profile && strata_engine_profile_kernels(r->e))) {
        printf("setup: %s\n", strata_error());
        exit(1);
    }
}

static void run_steps(run *r) {
    for (int s = 0; s < STEPS; s++) {
        strata_step_result res;
        if (strata_engine_step(r->e, &r->Ld, s, &res)) {
            printf("step: %s\n", strata_error());
            exit(1);
        }
        r->loss[s] = res.loss;
    }
    if (strata_engine_sync(r->e)) {
        printf("sync: %s\n", strata_error());
        exit(1);
    }
}

static void run_close(run *r) {
    strata_engine_destroy(r->e);
    strata_arena_release(&r->arena);
    strata_model_free(&r->m);
    strata_loader_close(&r->Ld);
}

/* AdamW calls a step makes at world 1: one per segment of every unit's padded buffer. */
static int adamw_calls(run *r) {
    const size_t *padded = strata_engine_padded(r->e);
    strata_adamw_segment seg[STRATA_ADAMW_MAX_SEGMENTS];
    int n = 0;
    for (int u = 0; u < r->m.n_units; u++) n += strata_adamw_segments(&r->m, u, 0, padded[u], seg);
    return n;
}

#define F STRATA_PROF_FORWARD
#define BW STRATA_PROF_BACKWARD
#define RC STRATA_PROF_RECOMPUTE

/* Calls per step, phase by phase, against the model's structure (A micro-steps, every
 * K-th block recomputed; K = 0: none). */
static void check_structure(const char *what, const strata_prof_report *p, int A, int K, int adamw) {
    int rec = 0;
    for (int l = 0; l < L && K > 0; l++) rec += l % K == 0;
    struct { int ph, g, n; } want[] = {
        {F, STRATA_PROF_EMBEDDING, 1},       {F, STRATA_PROF_LAYERNORM, 2 * L + 1}, {F, STRATA_PROF_MATMUL_QKV, L},
        {F, STRATA_PROF_ATTENTION, L},       {F, STRATA_PROF_MATMUL_ATTPROJ, L},    {F, STRATA_PROF_RESIDUAL, 2 * L},
        {F, STRATA_PROF_MATMUL_FC, L},       {F, STRATA_PROF_GELU, 0},              {F, STRATA_PROF_MATMUL_FCPROJ, L},
        {F, STRATA_PROF_CLASSIFIER, 1},      {F, STRATA_PROF_CROSSENTROPY, 1},      {BW, STRATA_PROF_EMBEDDING, 1},
        {BW, STRATA_PROF_LAYERNORM, 2 * L + 1}, {BW, STRATA_PROF_MATMUL_QKV, L},    {BW, STRATA_PROF_ATTENTION, L},
        {BW, STRATA_PROF_MATMUL_ATTPROJ, L}, {BW, STRATA_PROF_RESIDUAL, 0},         {BW, STRATA_PROF_MATMUL_FC, L},
        {BW, STRATA_PROF_GELU, 2 * L},       {BW, STRATA_PROF_MATMUL_FCPROJ, L},    {BW, STRATA_PROF_CLASSIFIER, 1},
        {BW, STRATA_PROF_CROSSENTROPY, 0},   {RC, STRATA_PROF_LAYERNORM, 2 * rec},  {RC, STRATA_PROF_MATMUL_QKV, rec},
        {RC, STRATA_PROF_ATTENTION, rec},    {RC, STRATA_PROF_RESIDUAL, rec},       {RC, STRATA_PROF_CLASSIFIER, 0},
        /* a recompute rebuilds the block up to its MLP and c_fc, not c_proj and the residual
         * add after it, which its backward never reads */
        {RC, STRATA_PROF_MATMUL_FC, rec},    {RC, STRATA_PROF_MATMUL_FCPROJ, 0},
    };
    for (size_t i = 0; i < sizeof want / sizeof want[0]; i++) {
        double got = p->calls[want[i].ph][want[i].g], expect = (double)want[i].n * A;
        CHECK(got == expect, "%s: %s %s calls per step %g, the model makes %g", what,
              strata_prof_phase_name(want[i].ph), strata_prof_group_name(want[i].g), got, expect);
    }
    CHECK(p->calls[STRATA_PROF_UPDATE][STRATA_PROF_ADAMW] == adamw, "%s: adamw calls per step %g, segments %d", what,
          p->calls[STRATA_PROF_UPDATE][STRATA_PROF_ADAMW], adamw);
    CHECK(p->untimed == 0, "%s: every call timed (%g untimed): the capacity covers the step", what, p->untimed);
}

static void check_sums(const char *what, const strata_prof_report *p) {
    double sum = 0;
    for (int ph = 0; ph < STRATA_PROF_PHASES; ph++)
        for (int g = 0; g < STRATA_PROF_GROUPS; g++) sum += p->ms[ph][g];
    CHECK(fabs(sum - p->timed_ms) < 1e-9 && fabs(p->step_ms - sum - p->other_ms) < 1e-9,
          "%s: timed %.3f + other %.3f = step %.3f ms", what, p->timed_ms, p->other_ms, p->step_ms);
    CHECK(p->step_ms > 0 && sum <= p->step_ms, "%s: the groups' %.3f ms fit in the step's %.3f ms", what, sum, p->step_ms);
    printf("%s: step %.3f ms, groups %.3f ms (%.1f%%), other %.3f ms\n", what, p->step_ms, sum, 100.0 * sum / p->step_ms,
           p->other_ms);
}

/* The share of the step the groups cover. Steps here take 5-30 ms, so one time slice lost
 * to another test on a loaded machine (the suite runs two at once on two cores) can leave
 * half a step untimed: a call the profile misses is missed every time, a slice lost only
 * now and then, so the check takes the best of up to three runs. */
static void check_coverage(const char *what, const strata_prof_report *first, int stage, int accum, int ckpt) {
    double best = first->timed_ms / first->step_ms;
    for (int again = 0; again < 2 && best < 0.8; again++) {
        run r;
        run_open(&r, stage, accum, ckpt, 1);
        run_steps(&r);
        strata_prof_report p;
        if (strata_engine_kernel_profile(r.e, &p) == 0) {
            printf("%s, again: step %.3f ms, groups %.3f ms (%.1f%%)\n", what, p.step_ms, p.timed_ms,
                   100.0 * p.timed_ms / p.step_ms);
            if (p.timed_ms / p.step_ms > best) best = p.timed_ms / p.step_ms;
        }
        run_close(&r);
    }
    CHECK(best >= 0.8, "%s: the groups cover %.1f%% of the step in the best of three runs (>= 80%% on the CPU)", what,
          100.0 * best);
}

static void engine_cases(void) {
    /* stage 0, then stage 3 at world 1 (its waits on gathers), and accumulation with
     * activation checkpointing */
    struct { int stage, accum, ckpt; } cases[] = {{0, 1, 0}, {3, 1, 0}, {0, 2, 2}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        char what[64];
        snprintf(what, sizeof what, "stage %d accum %d ckpt %d", cases[c].stage, cases[c].accum, cases[c].ckpt);
        timed_created = 0;
        run off;
        run_open(&off, cases[c].stage, cases[c].accum, cases[c].ckpt, 0);
        run_steps(&off);
        strata_prof_report p;
        CHECK(strata_engine_kernel_profile(off.e, &p) == -1 && strstr(strata_error(), "STRATA_PROFILE"),
              "%s: without the profile, asking for one fails: %s", what, strata_error());
        CHECK(timed_created == 0, "%s: off, the engine makes no timed event (%d made)", what, timed_created);
        run_close(&off);

        run on;
        run_open(&on, cases[c].stage, cases[c].accum, cases[c].ckpt, 1);
        CHECK(timed_created > 0, "%s: on, the events are made up front (%d)", what, timed_created);
        int made = timed_created;
        run_steps(&on);
        CHECK(timed_created == made, "%s: steps make no events (%d after %d)", what, timed_created, made);
        int same = 1;
        for (int s = 0; s < STEPS; s++) same &= memcmp(&on.loss[s], &off.loss[s], sizeof(double)) == 0;
        CHECK(same, "%s: losses bitwise equal with the profile on and off (%.9g, %.9g)", what, on.loss[STEPS - 1],
              off.loss[STEPS - 1]);
        if (strata_engine_kernel_profile(on.e, &p)) {
            CHECK(0, "%s: profile: %s", what, strata_error());
        } else {
            CHECK(p.steps == STEPS - 1 && p.warmup, "%s: %d steps averaged, the first left out", what, p.steps);
            check_structure(what, &p, cases[c].accum, cases[c].ckpt, adamw_calls(&on));
            check_sums(what, &p);
            check_coverage(what, &p, cases[c].stage, cases[c].accum, cases[c].ckpt);
            if (cases[c].stage == 3)
                CHECK(p.calls[F][STRATA_PROF_COMM_WAIT] > 0, "%s: waits for gathers are timed (%g per step)", what,
                      p.calls[F][STRATA_PROF_COMM_WAIT]);
        }
        run_close(&on);
    }
}

/* The profiler alone, on the CPU's compute stream. */
static void profiler_cases(void) {
    strata_prof *p = strata_prof_create(dev, 2);
    strata_prof_report r;
    CHECK(strata_prof_report_get(p, &r) == -1 && strstr(strata_error(), "no step"), "no step yet: %s", strata_error());

    /* a failed step: its events are dropped */
    strata_prof_step_begin(p);
    strata_prof_end(p, strata_prof_begin(p, STRATA_PROF_GELU));
    strata_prof_step_end(p, 0);
    CHECK(strata_prof_flush(p) == 0 && p->steps == 0, "a failed step is not counted (%d)", p->steps);

    /* three calls against a capacity of two: the third is untimed */
    float x[4096], y[4096];
    for (int i = 0; i < 4096; i++) x[i] = (float)i / 4096.0f;
    for (int step = 0; step < 2; step++) {
        strata_prof_step_begin(p);
        strata_prof_set_phase(p, STRATA_PROF_BACKWARD);
        for (int i = 0; i < 3; i++) {
            int call = strata_prof_begin(p, STRATA_PROF_GELU);
            CHECK(call == (i < 2 ? i : -1), "call %d of step %d: index %d", i, step, call);
            strata_kernels_cpu.gelu_forward(dev->compute, y, x, 4096);
            strata_prof_end(p, call);
        }
        strata_prof_step_end(p, 1);
        if (step == 0) CHECK(strata_prof_collect(p) == 0 && p->steps == 1, "collect reads the finished step");
    }
    CHECK(strata_prof_flush(p) == 0 && p->steps == 2, "flush reads the last step (%d steps)", p->steps);
    CHECK(strata_prof_report_get(p, &r) == 0 && r.steps == 1 && r.warmup, "the first step is left out: %d step", r.steps);
    CHECK(r.calls[STRATA_PROF_BACKWARD][STRATA_PROF_GELU] == 2 && r.untimed == 1,
          "2 calls timed, 1 past the capacity counted (%g, %g)", r.calls[STRATA_PROF_BACKWARD][STRATA_PROF_GELU],
          r.untimed);
    CHECK(r.ms[STRATA_PROF_BACKWARD][STRATA_PROF_GELU] >= 0 && r.timed_ms <= r.step_ms, "timed %.4f ms of %.4f",
          r.timed_ms, r.step_ms);

    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    strata_prof_print(&r, "[p] ", f);
    fclose(f);
    CHECK(strstr(buf, "[p] kernel profile: compute stream, mean of 1 step (the first left out: warm-up)") != NULL,
          "table header");
    CHECK(strstr(buf, "backward   gelu") && strstr(buf, "backward   (all)") && strstr(buf, "step       other") &&
              strstr(buf, "step       total") && strstr(buf, "100.0%"),
          "table rows: the group, the phase's total, other, the step");
    CHECK(!strstr(buf, "forward") && !strstr(buf, "layernorm"), "no line for groups without calls");
    CHECK(strstr(buf, "1 calls per step past the profile's capacity") != NULL, "untimed calls are said");
    if (failures) printf("%s", buf);
    free(buf);
    strata_prof_destroy(p);
}

int main(void) {
    strata_log_set_level(STRATA_LOG_WARN);
    check_quiet = 1;
    /* one thread: the 80% check weighs the host's own work between kernels against the
     * kernels, and idle OpenMP workers on a loaded 2-core machine only add noise to it */
    omp_set_num_threads(1);
    dev = strata_device_open("cpu", 0);
    real_ops = dev->ops;
    counting_ops = *dev->ops;
    counting_ops.event_create_timed = count_event_create_timed;
    dev->ops = &counting_ops;
    strata_stream *single_stream = strata_stream_create(dev, "single", STRATA_STREAM_HOST);
    single = strata_comm_open_single(dev, single_stream);

    char dir[64] = "/tmp/strata-test-profile-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    size_t n_tok = 20000;
    uint16_t *tok = malloc(n_tok * 2);
    for (size_t i = 0; i < n_tok; i++) tok[i] = (uint16_t)((i % 7 == 0) ? strata_hash64(i) % 256 : (i * 31 + i / 7) % 97);
    char path[512];
    snprintf(path, sizeof path, "%s/train_000000.bin", dir);
    if (strata_shard_write(path, tok, n_tok)) return 1;
    free(tok);
    snprintf(data_glob, sizeof data_glob, "%s/train_*.bin", dir);

    profiler_cases();
    engine_cases();

    unlink(path);
    rmdir(dir);
    strata_comm_close(single);
    strata_stream_destroy(dev, single_stream);
    dev->ops = real_ops;
    strata_device_close(dev);
    return check_report();
}
