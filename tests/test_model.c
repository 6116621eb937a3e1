/* tests/test_model.c: the whole model against finite differences, and activation
 * checkpointing against the plain backward (bitwise). */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/arena.h"
#include "core/common.h"
#include "core/device.h"
#include "core/kernels.h"
#include "core/model.h"
#include "tests/check.h"


enum { B = 2, T = 6 };

typedef struct rig {
    strata_device *dev;
    strata_model m;
    strata_arena arena;
    float **params, **grads;
    int32_t inputs[B * T], targets[B * T];
} rig;

static void rig_open(rig *r, int ckpt_every) {
    memset(r, 0, sizeof *r);
    r->dev = strata_device_open("cpu", 0);
    strata_model_shape shape = {.n_layer = 2, .n_head = 2, .n_embd = 8, .max_seq_len = 8,
                                .vocab_size = 11, .padded_vocab_size = 16, .init_std = 0.3f};
    strata_model_init(&r->m, &shape);
    strata_arena_init(&r->arena, r->dev);
    r->params = calloc(r->m.n_units, sizeof(float *));
    r->grads = calloc(r->m.n_units, sizeof(float *));
    for (int u = 0; u < r->m.n_units; u++) {
        strata_arena_reserve(&r->arena, STRATA_MEM_DEVICE, STRATA_CAT_PARAMS, "p", r->m.units[u].numel * 4, (void **)&r->params[u]);
        strata_arena_reserve(&r->arena, STRATA_MEM_DEVICE, STRATA_CAT_GRADS, "g", r->m.units[u].numel * 4, (void **)&r->grads[u]);
    }
    strata_model_plan(&r->m, &r->arena, r->dev, STRATA_F32, B, T, ckpt_every);
    if (strata_arena_commit(&r->arena)) { printf("commit: %s\n", strata_error()); exit(1); }
    for (int u = 0; u < r->m.n_units; u++) {
        size_t n = r->m.units[u].numel;
        strata_model_init_params(&r->m, u, 7, 0, n, r->params[u]);
        /* perturb LayerNorm and bias values away from 1/0 so their gradients are generic */
        for (size_t i = 0; i < n; i++) r->params[u][i] += 0.05f * strata_rand_normal(99, u, i);
        r->m.params[u] = r->params[u];
        r->m.grads[u] = r->grads[u];
    }
    /* padded vocabulary rows stay zero, as in training */
    for (size_t i = (size_t)shape.vocab_size * shape.n_embd; i < (size_t)shape.padded_vocab_size * shape.n_embd; i++)
        r->params[0][i] = 0;
    for (int i = 0; i < B * T; i++) {
        r->inputs[i] = (int32_t)(strata_hash64(i) % 11);
        r->targets[i] = (int32_t)(strata_hash64(1000 + i) % 11);
    }
    r->targets[3] = -1; /* an ignored position */
}

static void rig_close(rig *r) {
    strata_arena_release(&r->arena);
    strata_model_free(&r->m);
    strata_device_close(r->dev);
    free(r->params);
    free(r->grads);
}

/* Mean loss over the batch (ignored positions count zero), forward only. */
static double loss_of(rig *r) {
    strata_model *m = &r->m;
    strata_model_set_batch(m, r->inputs, r->targets);
    *m->loss_sum = 0;
    for (int u = 0; u < m->n_units; u++) strata_model_forward_unit(m, u, 0, 0.0f, 1.0f);
    double s = 0;
    for (int i = 0; i < B * T; i++) s += m->losses[i];
    return s / (B * T);
}

static double train_step(rig *r) {
    strata_model *m = &r->m;
    for (int u = 0; u < m->n_units; u++) memset(r->grads[u], 0, m->units[u].numel * 4);
    strata_model_set_batch(m, r->inputs, r->targets);
    *m->loss_sum = 0;
    for (int u = 0; u < m->n_units; u++) strata_model_forward_unit(m, u, 1, 1.0f / (B * T), 1.0f / (B * T));
    for (int u = m->n_units - 1; u >= 0; u--) CHECK(strata_model_backward_unit(m, u) == 0, "backward of unit %d", u);
    return *m->loss_sum;
}

int main(void) {
    check_quiet = 1; /* one check per finite-difference probe: print failures only */
    rig r;
    rig_open(&r, 0);
    double loss = train_step(&r);
    double loss_fwd = loss_of(&r);
    CHECK(fabs(loss - loss_fwd) < 1e-6, "training forward loss %.9g == eval loss %.9g", loss, loss_fwd);
    CHECK(loss > 1.5 && loss < 4.0, "initial loss %.4f near ln(11) = 2.40", loss);

    /* finite differences of the whole model, a few elements of every tensor */
    strata_model *m = &r.m;
    double worst = 0;
    for (int ti = 0; ti < m->n_tensors; ti++) {
        const strata_param_tensor *t = &m->tensors[ti];
        int picks = t->numel < 6 ? (int)t->numel : 6;
        for (int p = 0; p < picks; p++) {
            size_t e = t->offset + strata_hash64(ti * 100 + p) % t->numel;
            if (ti == 0 && e / 8 >= 11) continue; /* padded vocabulary row */
            float *w = &r.params[t->unit][e];
            float orig = *w, h = 1e-2f;
            *w = orig + h;
            double lp = loss_of(&r);
            *w = orig - h;
            double lm = loss_of(&r);
            *w = orig;
            double fd = (lp - lm) / (2.0 * (double)h);
            double an = r.grads[t->unit][e];
            double err = fabs(fd - an) / (fabs(fd) + fabs(an) + 1e-3);
            if (err > worst) worst = err;
            CHECK(err < 2e-2, "%s[%zu]: analytic %.6g vs finite difference %.6g", t->name, e - t->offset, an, fd);
        }
    }
    printf("model gradient vs finite differences: worst relative error %.2e\n", worst);

    /* padded vocabulary rows get exactly zero gradient */
    double pad = 0;
    for (size_t i = 11 * 8; i < 16 * 8; i++) pad += fabs(r.grads[0][i]);
    CHECK(pad == 0.0, "padded wte rows have zero gradient (sum |g| = %g)", pad);

    /* activation checkpointing: same loss and gradients, bit for bit */
    size_t total = 0;
    for (int u = 0; u < m->n_units; u++) total += m->units[u].numel;
    float *g0 = malloc(total * 4);
    size_t o = 0;
    for (int u = 0; u < m->n_units; u++) {
        memcpy(g0 + o, r.grads[u], m->units[u].numel * 4);
        o += m->units[u].numel;
    }
    size_t acts_plain = strata_arena_bytes(&r.arena, -1, STRATA_CAT_ACTIVATIONS);
    for (int k = 1; k <= 2; k++) {
        rig c;
        rig_open(&c, k);
        double lc = train_step(&c);
        CHECK(memcmp(&lc, &loss, sizeof loss) == 0, "checkpointing every %d: loss %.9g == %.9g bitwise", k, lc, loss);
        int same = 1;
        o = 0;
        for (int u = 0; u < m->n_units; u++) {
            same &= memcmp(g0 + o, c.grads[u], m->units[u].numel * 4) == 0;
            o += m->units[u].numel;
        }
        CHECK(same, "checkpointing every %d: gradients bitwise identical", k);
        size_t acts = strata_arena_bytes(&c.arena, -1, STRATA_CAT_ACTIVATIONS);
        /* recomputed blocks share one buffer set: with 2 blocks, every:1 recomputes both
         * (one set saved), every:2 recomputes only block 0 (nothing saved) */
        CHECK(k == 1 ? acts < acts_plain : acts <= acts_plain, "checkpointing every %d: activation memory %zu vs %zu", k, acts, acts_plain);
        rig_close(&c);
    }
    free(g0);

    /* every id into the embedding and the loss is checked before it is copied: an id
     * outside [0, V) is refused with its value and place, the device buffers untouched */
    int32_t bad[B * T];
    memcpy(bad, r.inputs, sizeof bad);
    int32_t before[B * T];
    memcpy(before, m->inputs, sizeof before);
    bad[T + 4] = 11; /* = vocab_size */
    CHECK(strata_model_set_batch(m, bad, r.targets) != 0 &&
              !strcmp(strata_error(), "token id 11 at row 1, position 4 of the batch is outside the vocabulary [0, 11)"),
          "an input id = vocab_size is refused, naming it: %s", strata_error());
    CHECK(!memcmp(before, m->inputs, sizeof before), "a refused batch copies nothing");
    bad[T + 4] = -7;
    CHECK(strata_model_set_batch(m, bad, r.targets) != 0 && strstr(strata_error(), "token id -7 at row 1, position 4"),
          "a negative input id is refused: %s", strata_error());
    memcpy(bad, r.targets, sizeof bad);
    bad[5] = 1 << 30;
    CHECK(strata_model_set_batch(m, r.inputs, bad) != 0 &&
              strstr(strata_error(), "target id 1073741824 at row 0, position 5"),
          "a target id past the vocabulary is refused: %s", strata_error());
    CHECK(strata_model_set_batch(m, r.inputs, r.targets) == 0, "ids in range, and an ignored (-1) target, pass");
    CHECK(strata_model_forward_logits(m, bad, 1, T) != 0, "forward_logits refuses out-of-range ids too");

    /* names and layout are Hugging Face's */
    CHECK(!strcmp(m->tensors[0].name, "transformer.wte.weight"), "first tensor %s", m->tensors[0].name);
    CHECK(!strcmp(m->tensors[2 + 2].name, "transformer.h.0.attn.c_attn.weight") && m->tensors[4].shape[0] == 8 &&
              m->tensors[4].shape[1] == 24, "c_attn weight (C, 3C) Conv1D layout");
    CHECK(!strcmp(m->tensors[m->n_tensors - 1].name, "transformer.ln_f.bias"), "last tensor %s", m->tensors[m->n_tensors - 1].name);
    rig_close(&r);
    printf("%s: %d checks, %d failures\n", failures ? "FAIL" : "PASS", checks, failures);
    return failures ? 1 : 0;
}
