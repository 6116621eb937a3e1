/* tests/test_model.c: the whole model of each family against finite differences, activation
 * checkpointing against the plain backward (bitwise), the tensor tables' names and shapes,
 * the Llama family's init rule and RoPE frequencies. */
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

static const strata_model_shape gpt2_shape = {.n_layer = 2, .n_head = 2, .n_embd = 8, .max_seq_len = 8,
                                              .vocab_size = 11, .padded_vocab_size = 16, .init_std = 0.3f};

/* The Llama family: grouped-query attention, q/k/v biases, an untied head ... */
static const strata_model_shape llama_gqa = {
    .n_layer = 2, .n_head = 4, .n_embd = 8, .max_seq_len = 8, .vocab_size = 11, .padded_vocab_size = 16,
    .init_std = 0.3f, .arch = STRATA_ARCH_LLAMA, .n_kv_head = 2, .head_dim = 2, .intermediate_size = 12,
    .rope_theta = 10000.0, .rms_norm_eps = 1e-5f, .tie_embeddings = 0, .qkv_bias = 1};
/* ... and multi-head attention with a head size that is not n_embd / n_head, q/k norms, Llama
 * 3.1's RoPE scaling and a tied head */
static const strata_model_shape llama_qk = {
    .n_layer = 2, .n_head = 2, .n_embd = 8, .max_seq_len = 8, .vocab_size = 11, .padded_vocab_size = 16,
    .init_std = 0.3f, .arch = STRATA_ARCH_LLAMA, .n_kv_head = 2, .head_dim = 6, .intermediate_size = 10,
    .rope_theta = 50.0, .rope_type = STRATA_ROPE_LLAMA3, .rope_factor = 8.0, .rope_low_freq_factor = 1.0,
    .rope_high_freq_factor = 4.0, .rope_original_context = 16, .rms_norm_eps = 1e-6f, .tie_embeddings = 1,
    .qk_norm = 1};

static int rig_documents; /* what the next rig's plan says of packed documents */

static void rig_open_chunked(rig *r, const strata_model_shape *shape_in, int ckpt_every, size_t logits_chunk_bytes,
                             size_t mlp_chunk_bytes) {
    memset(r, 0, sizeof *r);
    r->dev = strata_device_open("cpu", 0);
    strata_model_shape shape = *shape_in;
    strata_model_init(&r->m, &shape);
    strata_arena_init(&r->arena, r->dev);
    r->params = calloc(r->m.n_units, sizeof(float *));
    r->grads = calloc(r->m.n_units, sizeof(float *));
    for (int u = 0; u < r->m.n_units; u++) {
        strata_arena_reserve(&r->arena, STRATA_MEM_DEVICE, STRATA_CAT_PARAMS, "p", r->m.units[u].numel * 4, (void **)&r->params[u]);
        strata_arena_reserve(&r->arena, STRATA_MEM_DEVICE, STRATA_CAT_GRADS, "g", r->m.units[u].numel * 4, (void **)&r->grads[u]);
    }
    strata_model_plan_opts o = {.ckpt_every = ckpt_every, .logits_chunk_bytes = logits_chunk_bytes,
                                .mlp_chunk_bytes = mlp_chunk_bytes, .documents = rig_documents};
    strata_model_plan(&r->m, &r->arena, r->dev, STRATA_F32, B, T, &o);
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
    for (int ti = 0; ti < r->m.n_tensors; ti++) {
        const strata_param_tensor *t = &r->m.tensors[ti];
        size_t cols = t->ndim > 1 ? (size_t)t->shape[1] : 1;
        for (size_t i = (size_t)strata_model_real_rows(&r->m, ti) * cols; i < t->numel; i++)
            r->params[t->unit][t->offset + i] = 0;
    }
    for (int i = 0; i < B * T; i++) {
        r->inputs[i] = (int32_t)(strata_hash64(i) % 11);
        r->targets[i] = (int32_t)(strata_hash64(1000 + i) % 11);
    }
    r->targets[3] = -1; /* an ignored position */
}

static void rig_open(rig *r, const strata_model_shape *shape, int ckpt_every) { rig_open_chunked(r, shape, ckpt_every, 0, 0); }

static void rig_close(rig *r) {
    strata_arena_release(&r->arena);
    strata_model_free(&r->m);
    strata_device_close(r->dev);
    free(r->params);
    free(r->grads);
}

/* One training step's gradients, concatenated over the units (n floats, allocated), with
 * the batch's positions (NULL: none); *losses receives the B*T losses. */
static float *step_grads(rig *r, const int32_t *pos, float *losses, size_t *n) {
    strata_model *m = &r->m;
    for (int u = 0; u < m->n_units; u++) memset(r->grads[u], 0, m->units[u].numel * 4);
    CHECK(strata_model_set_batch(m, r->inputs, r->targets, pos) == 0, "set_batch: %s", strata_error());
    *m->loss_sum = 0;
    for (int u = 0; u < m->n_units; u++) strata_model_forward_unit(m, u, 1, 1.0f, 1.0f);
    memcpy(losses, m->losses, sizeof(float) * B * T);
    for (int u = m->n_units - 1; u >= 0; u--) CHECK(strata_model_backward_unit(m, u) == 0, "backward of unit %d", u);
    *n = 0;
    for (int u = 0; u < m->n_units; u++) *n += m->units[u].numel;
    float *g = malloc(*n * sizeof(float)), *p = g;
    for (int u = 0; u < m->n_units; u++, p += m->units[u - 1].numel) memcpy(p, r->grads[u], m->units[u].numel * 4);
    return g;
}

/* Packed documents train as each alone: a batch of documents packed into its rows, with
 * their positions, gives each document's tokens the losses it gets alone at the start of a
 * row (the rest of the batch's targets ignored), and the gradients their sum; with the
 * positions of one document a row, the same bits as no positions; every block recomputed,
 * the same bits as none; positions that do not count up are refused. */
static void check_documents(const strata_model_shape *shape, const char *what) {
    rig r, rc;
    rig_documents = 1;
    rig_open(&r, shape, 0);
    rig_open(&rc, shape, 1);
    rig_documents = 0;
    /* row 0: documents [0,3) [3,6); row 1: [0,2) [2,3) [3,6) */
    const int32_t pos[B * T] = {0, 1, 2, 0, 1, 2, 0, 1, 0, 0, 1, 2};
    int32_t in0[B * T], tg0[B * T];
    memcpy(in0, r.inputs, sizeof in0);
    memcpy(tg0, r.targets, sizeof tg0);
    float packed_loss[B * T], alone_loss[B * T], loss_ckpt[B * T], want_loss[B * T];
    size_t n;
    float *packed = step_grads(&r, pos, packed_loss, &n);
    memcpy(rc.inputs, in0, sizeof in0);
    memcpy(rc.targets, tg0, sizeof tg0);
    float *ckpt = step_grads(&rc, pos, loss_ckpt, &n);
    int same = !memcmp(packed, ckpt, n * sizeof(float)) && !memcmp(packed_loss, loss_ckpt, sizeof loss_ckpt);
    double *want = calloc(n, sizeof(double));
    int docs = 0;
    for (int i = 0; i < B * T;) {
        int e = i + 1;
        while (e % T && pos[e]) e++;
        /* the document alone at the start of row 0; every other target ignored */
        for (int k = 0; k < B * T; k++) {
            r.inputs[k] = (int32_t)((k * 7 + 3) % 11);
            r.targets[k] = -1;
        }
        memcpy(r.inputs, in0 + i, (size_t)(e - i) * sizeof(int32_t));
        memcpy(r.targets, tg0 + i, (size_t)(e - i) * sizeof(int32_t));
        float *g = step_grads(&r, NULL, alone_loss, &n);
        for (size_t k = 0; k < n; k++) want[k] += g[k];
        memcpy(want_loss + i, alone_loss, (size_t)(e - i) * sizeof(float));
        free(g);
        docs++;
        i = e;
    }
    double worst = 0, mx = 0, lerr = 0;
    for (size_t k = 0; k < n; k++) mx = fabs(want[k]) > mx ? fabs(want[k]) : mx;
    for (size_t k = 0; k < n; k++) {
        double e = fabs(packed[k] - want[k]) / (fabs(want[k]) + 1e-3 * mx);
        worst = e > worst ? e : worst;
    }
    for (int i = 0; i < B * T; i++) {
        double e = fabs(packed_loss[i] - want_loss[i]) / (fabs(want_loss[i]) + 1e-6);
        lerr = e > lerr ? e : lerr;
    }
    printf("%-60s losses %.1e, gradients %.1e vs %d documents alone\n", what, lerr, worst, docs);
    CHECK(lerr < 1e-5 && worst < 1e-4, "%s: packed documents differ from each alone: losses %.3e, gradients %.3e", what,
          lerr, worst);
    CHECK(same, "%s: with documents, every block recomputed gives the same bits as none", what);

    /* one document a row: the same bits as no positions */
    memcpy(r.inputs, in0, sizeof in0);
    memcpy(r.targets, tg0, sizeof tg0);
    int32_t ident[B * T];
    for (int i = 0; i < B * T; i++) ident[i] = i % T;
    float l1[B * T], l2[B * T];
    float *g1 = step_grads(&r, ident, l1, &n), *g2 = step_grads(&r, NULL, l2, &n);
    CHECK(!memcmp(g1, g2, n * sizeof(float)) && !memcmp(l1, l2, sizeof l1),
          "%s: positions 0 .. T-1 in every row are no positions, bit for bit", what);
    int32_t bad[B * T];
    memcpy(bad, pos, sizeof bad);
    bad[T + 4] = 3;
    CHECK(strata_model_set_batch(&r.m, r.inputs, r.targets, bad) != 0 &&
              strstr(strata_error(), "position 3 at row 1, position 4 of the batch does not follow 0: a document "
                                     "starts at 0 and counts up by one"),
          "%s: a position that does not count up is refused: %s", what, strata_error());
    rig_close(&r);
    rig_close(&rc);
    rig_open(&r, shape, 0); /* planned without documents */
    CHECK(strata_model_set_batch(&r.m, r.inputs, r.targets, pos) != 0 && strstr(strata_error(), "reserved no room"),
          "%s: positions for a model planned without them are refused: %s", what, strata_error());
    rig_close(&r);
    free(packed), free(ckpt), free(want), free(g1), free(g2);
}

/* Mean loss over the batch (ignored positions count zero), forward only. */
static double loss_of(rig *r) {
    strata_model *m = &r->m;
    strata_model_set_batch(m, r->inputs, r->targets, NULL);
    *m->loss_sum = 0;
    for (int u = 0; u < m->n_units; u++) strata_model_forward_unit(m, u, 0, 0.0f, 1.0f);
    double s = 0;
    for (int i = 0; i < B * T; i++) s += m->losses[i];
    return s / (B * T);
}

static double train_step(rig *r) {
    strata_model *m = &r->m;
    for (int u = 0; u < m->n_units; u++) memset(r->grads[u], 0, m->units[u].numel * 4);
    strata_model_set_batch(m, r->inputs, r->targets, NULL);
    *m->loss_sum = 0;
    for (int u = 0; u < m->n_units; u++) strata_model_forward_unit(m, u, 1, 1.0f / (B * T), 1.0f / (B * T));
    for (int u = m->n_units - 1; u >= 0; u--) CHECK(strata_model_backward_unit(m, u) == 0, "backward of unit %d", u);
    return *m->loss_sum;
}

/* Finite differences of the whole model (a few elements of every tensor), zero gradients
 * in the padding rows, and activation checkpointing bit for bit; leaves r open. */
static void check_gradients(rig *r, const strata_model_shape *shape, const char *what) {
    double loss = train_step(r);
    double loss_fwd = loss_of(r);
    CHECK(fabs(loss - loss_fwd) < 1e-6, "%s: training forward loss %.9g == eval loss %.9g", what, loss, loss_fwd);
    CHECK(loss > 1.0 && loss < 5.0, "%s: initial loss %.4f near ln(11) = 2.40", what, loss);

    strata_model *m = &r->m;
    double worst = 0;
    for (int ti = 0; ti < m->n_tensors; ti++) {
        const strata_param_tensor *t = &m->tensors[ti];
        int picks = t->numel < 6 ? (int)t->numel : 6;
        for (int p = 0; p < picks; p++) {
            size_t e = t->offset + strata_hash64(ti * 100 + p) % t->numel;
            if ((int64_t)((e - t->offset) / (t->ndim > 1 ? (size_t)t->shape[1] : 1)) >= strata_model_real_rows(m, ti))
                continue; /* a padded vocabulary row */
            float *w = &r->params[t->unit][e];
            float orig = *w, h = 1e-2f;
            *w = orig + h;
            double lp = loss_of(r);
            *w = orig - h;
            double lm = loss_of(r);
            *w = orig;
            double fd = (lp - lm) / (2.0 * (double)h);
            double an = r->grads[t->unit][e];
            double err = fabs(fd - an) / (fabs(fd) + fabs(an) + 1e-3);
            if (err > worst) worst = err;
            CHECK(err < 2e-2, "%s: %s[%zu]: analytic %.6g vs finite difference %.6g", what, t->name, e - t->offset, an, fd);
        }
    }
    CHECK(worst < 2e-2, "%s: model gradient vs finite differences: worst relative error %.2e over %d tensors", what, worst,
          m->n_tensors);

    /* padded vocabulary rows get exactly zero gradient */
    double pad = 0;
    for (int ti = 0; ti < m->n_tensors; ti++) {
        const strata_param_tensor *t = &m->tensors[ti];
        size_t cols = t->ndim > 1 ? (size_t)t->shape[1] : 1;
        for (size_t i = (size_t)strata_model_real_rows(m, ti) * cols; i < t->numel; i++)
            pad += fabs(r->grads[t->unit][t->offset + i]);
    }
    CHECK(pad == 0.0, "%s: padded vocabulary rows have zero gradient (sum |g| = %g)", what, pad);

    /* activation checkpointing: same loss and gradients, bit for bit */
    size_t total = 0;
    for (int u = 0; u < m->n_units; u++) total += m->units[u].numel;
    float *g0 = malloc(total * 4);
    size_t o = 0;
    for (int u = 0; u < m->n_units; u++) {
        memcpy(g0 + o, r->grads[u], m->units[u].numel * 4);
        o += m->units[u].numel;
    }
    size_t acts_plain = strata_arena_bytes(&r->arena, -1, STRATA_CAT_ACTIVATIONS);
    for (int k = 1; k <= 2; k++) {
        rig c;
        rig_open(&c, shape, k);
        double lc = train_step(&c);
        CHECK(memcmp(&lc, &loss, sizeof loss) == 0, "%s: checkpointing every %d: loss %.9g == %.9g bitwise", what, k, lc,
              loss);
        int same = 1;
        o = 0;
        for (int u = 0; u < m->n_units; u++) {
            same &= memcmp(g0 + o, c.grads[u], m->units[u].numel * 4) == 0;
            o += m->units[u].numel;
        }
        CHECK(same, "%s: checkpointing every %d: gradients bitwise identical", what, k);
        size_t acts = strata_arena_bytes(&c.arena, -1, STRATA_CAT_ACTIVATIONS);
        /* recomputed blocks share one buffer set: with 2 blocks, every:1 recomputes both
         * (one set saved), every:2 recomputes only block 0 (nothing saved) */
        CHECK(k == 1 ? acts < acts_plain : acts <= acts_plain, "%s: checkpointing every %d: activation memory %zu vs %zu",
              what, k, acts, acts_plain);
        rig_close(&c);
    }

    /* the head in chunks of 5 rows (train.logits_chunk_mb; 12 rows: 5, 5, 2): the loss bit
     * for bit (each row's is its own), the gradients within the rounding of the classifier's
     * weight gradient summed over its rows in three pieces; evaluation's loss bit for bit;
     * sampling's last row's logits too, from a buffer that holds only the last 5 rows */
    rig c;
    size_t Vp = (size_t)shape->padded_vocab_size;
    rig_open_chunked(&c, shape, 0, 5 * Vp * sizeof(float), 0);
    CHECK(c.m.head_rows == 5, "%s: a 5-row chunk of logits plans 5 rows (%d)", what, c.m.head_rows);
    double lc = train_step(&c), worst_g = 0;
    o = 0;
    for (int u = 0; u < m->n_units; u++)
        for (size_t i = 0; i < m->units[u].numel; i++, o++) {
            double d = fabs((double)g0[o] - c.grads[u][i]) / (fabs(g0[o]) + 1e-6);
            if (d > worst_g) worst_g = d;
        }
    CHECK(memcmp(&lc, &loss, sizeof loss) == 0, "%s: the head in 5-row chunks: loss %.9g == %.9g bitwise", what, lc, loss);
    CHECK(worst_g < 1e-4, "%s: the head in 5-row chunks: gradients within %.1e of the whole head's (the classifier's "
          "weight gradient sums its rows chunk by chunk)", what, worst_g);    double ec = loss_of(&c), ep = loss_of(r);
    CHECK(memcmp(&ec, &ep, sizeof ec) == 0, "%s: the head in 5-row chunks: evaluation loss %.9g == %.9g", what, ec, ep);
    CHECK(strata_model_forward_logits(&c.m, r->inputs, 1, T) == 0 && strata_model_forward_logits(m, r->inputs, 1, T) == 0 &&
              c.m.logits_first == T - 5 && m->logits_first == 0 &&
              !memcmp((float *)c.m.logits + (size_t)(T - 1 - c.m.logits_first) * Vp,
                      (float *)m->logits + (size_t)(T - 1) * Vp, Vp * sizeof(float)),
          "%s: sampling from the head in 5-row chunks: the last position's logits, bitwise (first row %d)", what,
          c.m.logits_first);
    CHECK(strata_arena_bytes(&c.arena, -1, STRATA_CAT_ACTIVATIONS) < acts_plain,
          "%s: the chunked head plans less activation memory", what);
    rig_close(&c);

    /* the blocks' MLPs in chunks of 5 rows (train.mlp_chunk_mb), with every block kept,
     * every block recomputed and every other one: each row's output is its own, so the loss
     * and the evaluation loss bit for bit; the weight and bias gradients sum their rows in
     * three pieces. Recomputing every block, only a chunk's gate|up (c_fc) is kept. */
    size_t mlp_row = (shape->arch == STRATA_ARCH_LLAMA ? 2 * (size_t)shape->intermediate_size : 4 * (size_t)shape->n_embd) *
                     sizeof(float);
    size_t saved_kept = 0;
    for (int k = 0; k <= 2; k++) {
        rig plain, c;
        rig_open(&plain, shape, k);
        size_t acts_k = strata_arena_bytes(&plain.arena, -1, STRATA_CAT_ACTIVATIONS);
        rig_close(&plain);
        rig_open_chunked(&c, shape, k, 0, 5 * mlp_row + mlp_row / 2);
        CHECK(c.m.mlp_rows == 5, "%s, checkpointing every %d: a 5.5-row chunk of the MLP plans 5 rows (%d)", what, k,
              c.m.mlp_rows);
        lc = train_step(&c);
        worst_g = 0;
        o = 0;
        for (int u = 0; u < m->n_units; u++)
            for (size_t i = 0; i < m->units[u].numel; i++, o++) {
                double d = fabs((double)g0[o] - c.grads[u][i]) / (fabs(g0[o]) + 1e-6);
                if (d > worst_g) worst_g = d;
            }
        CHECK(memcmp(&lc, &loss, sizeof loss) == 0, "%s, checkpointing every %d: the MLP in 5-row chunks: loss %.9g == "
              "%.9g bitwise", what, k, lc, loss);
        CHECK(worst_g < 1e-4, "%s, checkpointing every %d: the MLP in 5-row chunks: gradients within %.1e of the whole "
              "MLP's", what, k, worst_g);
        ec = loss_of(&c);
        CHECK(memcmp(&ec, &ep, sizeof ec) == 0, "%s, checkpointing every %d: the MLP in 5-row chunks: evaluation loss "
              "%.9g == %.9g", what, k, ec, ep);
        /* kept: the gradient buffers and silu(gate)*up (gelu(c_fc)) shrink to a chunk's;
         * recomputed: the shared gate|up (c_fc output) too (the arena rounds each buffer up) */
        size_t saved = acts_k - strata_arena_bytes(&c.arena, -1, STRATA_CAT_ACTIVATIONS);
        if (k == 0) saved_kept = saved;
        CHECK(acts_k > saved && saved > 0 && (k == 0 || saved > saved_kept),
              "%s, checkpointing every %d: the MLP in chunks plans %zu bytes less activation memory, more with "
              "recomputed blocks than the %zu without", what, k, saved, saved_kept);
        rig_close(&c);
    }
    free(g0);
}

/* The Llama family's tensor table: Hugging Face's names, nn.Linear's (out, in) shapes, q|k|v
 * and gate|up adjacent, and the init rule (matrices normal(0, init_std), norms 1, biases 0,
 * padding rows 0). */
static void check_llama_layout(void) {
    strata_model m;
    strata_model_init(&m, &llama_gqa);
    static const char *const block0[] = {
        "model.layers.0.input_layernorm.weight", "model.layers.0.self_attn.q_proj.weight",
        "model.layers.0.self_attn.k_proj.weight", "model.layers.0.self_attn.v_proj.weight",
        "model.layers.0.self_attn.q_proj.bias", "model.layers.0.self_attn.k_proj.bias",
        "model.layers.0.self_attn.v_proj.bias", "model.layers.0.self_attn.o_proj.weight",
        "model.layers.0.post_attention_layernorm.weight", "model.layers.0.mlp.gate_proj.weight",
        "model.layers.0.mlp.up_proj.weight", "model.layers.0.mlp.down_proj.weight"};
    int ok = m.n_units == 4 && m.units[1].n_tensors == 12 && !strcmp(m.tensors[0].name, "model.embed_tokens.weight");
    for (int i = 0; ok && i < 12; i++) ok = !strcmp(m.tensors[1 + i].name, block0[i]);
    CHECK(ok, "llama: unit 0 the embedding, block 0's tensors in order, Hugging Face's names");
    const strata_param_tensor *q = &m.tensors[2], *k = &m.tensors[3], *v = &m.tensors[4], *o = &m.tensors[8];
    CHECK(q->shape[0] == 8 && q->shape[1] == 8 && k->shape[0] == 4 && v->shape[0] == 4 && k->offset == q->offset + q->numel &&
              v->offset == k->offset + k->numel && m.tensors[5].offset == v->offset + v->numel && o->shape[0] == 8 &&
              o->shape[1] == 8,
          "llama: q (NH hd, C), k and v (NKV hd, C) adjacent, their biases after them, o_proj (C, NH hd)");
    const strata_param_tensor *gate = &m.tensors[10], *up = &m.tensors[11], *down = &m.tensors[12];
    CHECK(gate->shape[0] == 12 && up->offset == gate->offset + gate->numel && down->shape[0] == 8 && down->shape[1] == 12,
          "llama: gate_proj and up_proj (I, C) adjacent, down_proj (C, I)");
    const strata_param_tensor *norm = &m.tensors[m.n_tensors - 2], *lm = &m.tensors[m.n_tensors - 1];
    CHECK(!strcmp(norm->name, "model.norm.weight") && !strcmp(lm->name, "lm_head.weight") && lm->shape[0] == 16 &&
              strata_model_real_rows(&m, m.n_tensors - 1) == 11 && strata_model_real_rows(&m, 0) == 11,
          "llama: the head unit holds model.norm.weight and an untied lm_head.weight (Vp rows, V real)");
    CHECK(strata_model_num_params(&m) == (size_t)(m.unit_numel[0] + m.unit_numel[1] + m.unit_numel[2] + m.unit_numel[3]) -
                                             2 * 5 * 8,
          "llama: parameters count neither padding rows of the embedding nor of the head");
    CHECK(!m.decay[1] && m.decay[2] && !m.decay[5], "llama: weight decay on matrices only");
    /* the init rule */
    int head = m.n_units - 1;
    float *w = malloc(m.unit_numel[head] * sizeof(float));
    strata_model_init_params(&m, head, 3, 0, m.unit_numel[head], w);
    int norms_one = 1, pad_zero = 1;
    double sum2 = 0;
    for (size_t i = 0; i < norm->numel; i++) norms_one &= w[i] == 1.0f;
    for (size_t i = 0; i < lm->numel; i++) {
        float x = w[lm->offset + i];
        if (i >= 11 * 8) pad_zero &= x == 0.0f;
        else sum2 += (double)x * x;
    }
    double std = sqrt(sum2 / (11 * 8));
    CHECK(norms_one && pad_zero && std > 0.2 && std < 0.4,
          "llama init: the norm's weight 1, lm_head normal(0, init_std 0.3) (std %.3f), its padding rows 0", std);
    free(w);
    float *b = malloc(m.unit_numel[1] * sizeof(float));
    strata_model_init_params(&m, 1, 3, 0, m.unit_numel[1], b);
    int bias_zero = 1;
    for (int i = 5; i <= 7; i++)
        for (size_t e = 0; e < m.tensors[i].numel; e++) bias_zero &= b[m.tensors[i].offset + e] == 0.0f;
    CHECK(bias_zero && b[0] == 1.0f && b[q->offset] != 0.0f, "llama init: q/k/v biases 0, input_layernorm 1, q_proj drawn");
    free(b);
    strata_model_free(&m);
}

/* RoPE's inverse frequencies against torch's (transformers 5.x, fp32 on the CPU):
 *   1.0 / (10000 ** (torch.arange(0, 8, 2).float() / 8)), exactly, and
 *   _compute_llama3_parameters of theta 500000, head_dim 64, factor 8, low 1, high 4,
 *   original context 8192 at i = 0, 14 (unscaled), 15, 16, 17 (smoothed), 31 (scaled), to
 *   1e-6: torch's vectorised pow over 32 frequencies may be an ulp from powf. */
static void check_rope(void) {
    strata_model_shape s = llama_gqa;
    s.n_embd = 32;
    s.n_head = 4;
    s.head_dim = 8;
    float f[32];
    strata_model_rope_inv_freq(&s, f);
    static const float want[4] = {1.0f, 0.1f, 0.0099999998f, 0.0010000000f};
    CHECK(!memcmp(f, want, sizeof want), "rope default: %.9g %.9g %.9g %.9g are torch's", f[0], f[1], f[2], f[3]);
    s.head_dim = 64;
    s.rope_theta = 500000.0;
    s.rope_type = STRATA_ROPE_LLAMA3;
    s.rope_factor = 8;
    s.rope_low_freq_factor = 1;
    s.rope_high_freq_factor = 4;
    s.rope_original_context = 8192;
    strata_model_rope_inv_freq(&s, f);
    static const int at[6] = {0, 14, 15, 16, 17, 31};
    static const float want3[6] = {1.0f, 0.00321144611f, 0.00137189368f, 0.000524846022f, 0.000178507791f, 3.7673226e-07f};
    int same = 1;
    for (int i = 0; i < 6; i++) same &= fabsf(f[at[i]] - want3[i]) <= 1e-6f * want3[i];
    CHECK(same, "rope llama3: %.9g %.9g %.9g %.9g %.9g %.9g are torch's", f[0], f[14], f[15], f[16], f[17], f[31]);
}

int main(void) {
    check_quiet = 1; /* one check per finite-difference probe: print failures only */
    check_llama_layout();
    check_rope();
    static const struct { const strata_model_shape *shape; const char *what; } models[] = {
        {&llama_gqa, "llama (GQA, q/k/v biases, untied head)"},
        {&llama_qk, "llama (head_dim 6, q/k norms, llama3 RoPE, tied head)"},
    };
    for (size_t i = 0; i < sizeof models / sizeof models[0]; i++) {
        rig r;
        rig_open(&r, models[i].shape, 0);
        check_gradients(&r, models[i].shape, models[i].what);
        rig_close(&r);
    }
    check_documents(&llama_gqa, "llama (GQA), packed documents");
    check_documents(&llama_qk, "llama (q/k norms, llama3 RoPE), packed documents");
    check_documents(&gpt2_shape, "gpt2 (learned positions), packed documents");
    rig r;
    rig_open(&r, &gpt2_shape, 0);
    check_gradients(&r, &gpt2_shape, "gpt2");
    strata_model *m = &r.m;

    /* every id into the embedding and the loss is checked before it is copied: an id
     * outside [0, V) is refused with its value and place, the device buffers untouched */
    int32_t bad[B * T];
    memcpy(bad, r.inputs, sizeof bad);
    int32_t before[B * T];
    memcpy(before, m->inputs, sizeof before);
    bad[T + 4] = 11; /* = vocab_size */
    CHECK(strata_model_set_batch(m, bad, r.targets, NULL) != 0 &&
              !strcmp(strata_error(), "token id 11 at row 1, position 4 of the batch is outside the vocabulary [0, 11)"),
          "an input id = vocab_size is refused, naming it: %s", strata_error());
    CHECK(!memcmp(before, m->inputs, sizeof before), "a refused batch copies nothing");
    bad[T + 4] = -7;
    CHECK(strata_model_set_batch(m, bad, r.targets, NULL) != 0 && strstr(strata_error(), "token id -7 at row 1, position 4"),
          "a negative input id is refused: %s", strata_error());
    memcpy(bad, r.targets, sizeof bad);
    bad[5] = 1 << 30;
    CHECK(strata_model_set_batch(m, r.inputs, bad, NULL) != 0 &&
              strstr(strata_error(), "target id 1073741824 at row 0, position 5"),
          "a target id past the vocabulary is refused: %s", strata_error());
    CHECK(strata_model_set_batch(m, r.inputs, r.targets, NULL) == 0, "ids in range, and an ignored (-1) target, pass");
    /* the embedding's backward on a GPU adds each token's rows in the order set_batch
     * uploads (the CPU's kernel walks positions itself, so only this sees a wrong one) */
    int32_t want[B * T], counts[11 + 1];
    strata_token_order(r.inputs, B * T, 11, counts, want);
    MUST(strata_stream_sync(r.dev, r.dev->compute));
    int sorted = 1;
    for (int i = 1; i < B * T; i++)
        sorted &= r.inputs[want[i - 1]] < r.inputs[want[i]] ||
                  (r.inputs[want[i - 1]] == r.inputs[want[i]] && want[i - 1] < want[i]);
    CHECK(sorted && !memcmp(m->order, want, sizeof want),
          "set_batch uploads the positions sorted by token, ties in position order");
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
