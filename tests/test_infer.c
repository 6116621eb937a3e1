/* tests/test_infer.c: a checkpoint's weights alone (launcher/infer.c, what `strata sample`
 * runs) give the logits a training engine's model gives from the same checkpoint, with
 * every block on the device and with every block copied in from pinned host memory for
 * each forward (two slots refilled block after block, forward after forward), for GPT-2
 * and a Llama-family shape with what the family adds (grouped key/value heads, Qwen3's q/k
 * norms, an untied head), at lengths 1 to the window, and decoding a token at a time from
 * the cache of q|k|v rows (strata_model_extend) gives them too; and strata_generate draws
 * the same tokens from both, greedy and at temperature 1, past the window. Bit for bit on
 * the CPU backend (the engine's model and this one run the same kernels on the same
 * weights); on CUDA, where a GPU answers, the two placements bit for bit and the engine's
 * model within bf16's tolerance (its head multiplies every row at once, this one only the
 * last). The ThreadSanitizer build runs it too: the copies run on a stream of their own,
 * ordered by events. */
#include <math.h>
#include <omp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "io/checkpoint.h"
#include "io/config.h"
#include "io/files.h"
#include "launcher/build.h"
#include "launcher/infer.h"
#include "launcher/sample.h"
#include "tests/check.h"

#define T_MAX 24

static char root[256];

typedef struct family_case {
    const char *what;
    const char *model; /* the model: line of the config */
} family_case;

static const family_case families[] = {
    {"gpt2", "model: {n_layer: 3, n_head: 4, n_embd: 64, seq_len: 24, vocab_size: 300}\n"},
    {"llama", "model: {arch: llama, n_layer: 3, n_head: 4, n_kv_head: 2, n_embd: 64, intermediate_size: 96, "
              "vocab_size: 300, seq_len: 24, qk_norm: true, tie_embeddings: false}\n"},
};

/* Row `row` of m->logits (counted from logits_first's), copied to the host as floats. */
static int logits_row(strata_model *m, int row, float *out) {
    strata_device *d = m->dev;
    size_t es = strata_dtype_size(d->compute_dtype);
    int Vp = m->shape.padded_vocab_size;
    void *buf = strata_xmalloc((size_t)Vp * es);
    int rc = strata_memcpy_async(d, d->compute, buf, (char *)m->logits + (size_t)(row - m->logits_first) * Vp * es,
                                 (size_t)Vp * es) ||
             strata_stream_sync(d, d->compute);
    for (int v = 0; v < Vp && !rc; v++) {
        if (es == 4) out[v] = ((const float *)buf)[v];
        else {
            uint32_t u = (uint32_t)((const uint16_t *)buf)[v] << 16;
            memcpy(&out[v], &u, 4);
        }
    }
    free(buf);
    return rc ? -1 : 0;
}

/* The last row's logits after a forward over tokens[0, t). */
static int last_logits(strata_model *m, const int32_t *tokens, int t, float *out) {
    return strata_model_forward_logits(m, tokens, 1, t) || logits_row(m, t - 1, out) ? -1 : 0;
}

/* The last row's logits after strata_model_extend of n more tokens (the cache's). */
static int extend_logits(strata_model *m, const int32_t *tokens, int n, float *out) {
    return strata_model_extend(m, tokens, n) || logits_row(m, n - 1, out) ? -1 : 0;
}

typedef struct drawn {
    int32_t ids[64];
    int n;
} drawn;
static int keep(void *ctx, int32_t id) {
    drawn *d = ctx;
    d->ids[d->n++] = id;
    return 0;
}

/* Worst |a - b| over the row, relative to the row's largest |a|. */
static double row_diff(const float *a, const float *b, int n) {
    double worst = 0, scale = 1e-30;
    for (int i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]);
        if (d > worst) worst = d;
        if (fabs(a[i]) > scale) scale = fabs(a[i]);
    }
    return worst / scale;
}

static void check_family(const family_case *f, const char *device) {
    char yaml[1024], run_dir[400], dir[600], data[320];
    snprintf(yaml, sizeof yaml, "device: %s\n%sdata: {train: x}\ntrain: {steps: 1, micro_batch: 1, seed: 7}\n", device,
             f->model);
    snprintf(run_dir, sizeof run_dir, "%s/%s-%s", root, f->what, device);
    snprintf(data, sizeof data, "data.train=%s/none_*.bin", root);
    const char *sets[] = {data};
    strata_config cfg;
    if (strata_config_load_string(&cfg, "test.yaml", yaml, sets, 1)) {
        CHECK(0, "%s: config: %s", f->what, strata_error());
        return;
    }
    /* a checkpoint of random weights, written by a training engine */
    strata_device *dev = strata_device_open(device, 0);
    strata_comm *comm = dev ? strata_comm_open_local(dev) : NULL;
    if (!comm) {
        CHECK(0, "%s on %s: open: %s", f->what, device, strata_error());
        if (dev) strata_device_close(dev);
        return;
    }
    strata_model em;
    strata_arena arena;
    strata_engine *e = strata_build(&cfg, dev, comm, 0, 1, &em, &arena);
    strata_ckpt_meta meta = {.step = 1, .world = 1, .stage = 0, .seed = 7, .config_yaml = ""};
    int saved = strata_arena_commit(&arena) == 0 && strata_engine_init_params(e, 7) == 0 &&
                strata_engine_save(e, run_dir, &meta, dir, sizeof dir) == 0;
    CHECK(saved, "%s on %s: a checkpoint saved: %s", f->what, device, saved ? dir : strata_error());
    strata_unbuild(e, &arena, &em);
    strata_comm_close(comm);
    strata_device_close(dev);
    strata_ckpt *ck = saved ? strata_ckpt_open(dir) : NULL;
    if (!ck) return;

    strata_loaded ref; /* the engine's model, as sampling ran before launcher/infer.c */
    strata_infer inf[2];
    static const strata_weights_home homes[2] = {STRATA_WEIGHTS_DEVICE, STRATA_WEIGHTS_HOST};
    static const char *home_names[2] = {"every block on the device", "every block streamed from host memory"};
    strata_infer_batch batch = STRATA_INFER_SAMPLING(T_MAX);
    int opened = strata_load_model(&ref, &cfg, ck) == 0;
    CHECK(opened, "%s on %s: the engine's model loads: %s", f->what, device, opened ? "" : strata_error());
    for (int h = 0; h < 2; h++) {
        int ok = strata_infer_open_weights(&inf[h], &cfg, ck, &batch, homes[h]) == 0;
        CHECK(ok, "%s on %s, %s: the weights load: %s", f->what, device, home_names[h], ok ? "" : strata_error());
        opened &= ok;
        if (!ok) memset(&inf[h], 0, sizeof inf[h]);
    }
    int L = cfg.model.n_layer;
    CHECK(!opened || (inf[0].n_streamed == 0 && inf[1].n_streamed == L && inf[1].device_weight_bytes < inf[0].device_weight_bytes),
          "%s on %s: %d and %d of %d blocks streamed", f->what, device, inf[0].n_streamed, inf[1].n_streamed, L);
    int cuda = !strcmp(device, "cuda");
    int Vp = ref.m.shape.padded_vocab_size, V = cfg.model.vocab_size;
    float *want = strata_xmalloc((size_t)Vp * sizeof(float)), *got = strata_xmalloc((size_t)Vp * sizeof(float));
    int32_t tokens[T_MAX];
    uint64_t x = 12345;
    for (int i = 0; i < T_MAX; i++) tokens[i] = (int32_t)((x = x * 6364136223846793005ULL + 1442695040888963407ULL) >> 33) % V;
    static const int lengths[] = {1, 2, 7, T_MAX, 5}; /* the last after the longest: nothing stale counts */
    for (size_t li = 0; opened && li < sizeof lengths / sizeof *lengths; li++) {
        int t = lengths[li];
        MUST(last_logits(&ref.m, tokens, t, want));
        for (int h = 0; h < 2; h++)
            for (int rep = 0; rep < 2; rep++) { /* the second forward refills the slots the first left */
                MUST(last_logits(&inf[h].m, tokens, t, got));
                double d = row_diff(want, got, Vp);
                int same = !memcmp(want, got, (size_t)Vp * sizeof(float));
                CHECK(cuda ? d <= 1e-2 : same, "%s on %s, %s, length %d, forward %d: the last row's logits %s the "
                      "engine's model's (worst difference %.3g of the largest)", f->what, device, home_names[h], t,
                      rep + 1, cuda ? "within 1e-2 of" : "equal to", d);
                if (h == 1) { /* the two placements: one code path, the same bits on every backend */
                    float *dev_row = strata_xmalloc((size_t)Vp * sizeof(float));
                    MUST(last_logits(&inf[0].m, tokens, t, dev_row));
                    CHECK(!memcmp(dev_row, got, (size_t)Vp * sizeof(float)), "%s on %s, length %d: streamed blocks "
                          "give the logits of resident ones bit for bit", f->what, device, t);
                    free(dev_row);
                }
            }
    }
    /* decoding with the cache: the prompt's rows at once, then a token at a time, each
     * step's last row as the whole prefix's forward gives it (bit for bit on the CPU, whose
     * products sum each row alone; within bf16's rounding on CUDA), resident and streamed */
    for (int h = 0; opened && h < 2; h++) {
        strata_model *m = &inf[h].m;
        double worst = 0;
        int same = 1;
        m->kv_len = 0;
        for (int t = 5; t <= T_MAX; t++) {
            MUST(last_logits(&ref.m, tokens, t, want));
            MUST(t == 5 ? extend_logits(m, tokens, 5, got) : extend_logits(m, tokens + t - 1, 1, got));
            double dd = row_diff(want, got, Vp);
            if (dd > worst) worst = dd;
            same &= !memcmp(want, got, (size_t)Vp * sizeof(float));
        }
        CHECK(m->kv_len == T_MAX && (cuda ? worst <= 1e-2 : same), "%s on %s, %s: decoding from the cache (5 tokens, then "
              "one at a time to %d) gives the logits of the whole prefix's forward (worst difference %.3g)", f->what,
              device, home_names[h], T_MAX, worst);
    }
    /* generation: greedy and sampled, the same draws (on CUDA the engine's rows may round apart) */
    for (int temp = 0; opened && !cuda && temp < 2; temp++) {
        drawn a = {.n = 0}, b = {.n = 0};
        strata_rng ra, rb;
        strata_rng_seed(&ra, 99);
        strata_rng_seed(&rb, 99);
        MUST(strata_generate(&ref.m, tokens, 3, 40, (float)temp, 0, &ra, keep, &a));
        MUST(strata_generate(&inf[1].m, tokens, 3, 40, (float)temp, 0, &rb, keep, &b));
        CHECK(a.n == 40 && b.n == 40 && !memcmp(a.ids, b.ids, sizeof a.ids), "%s on %s: 40 tokens past the "
              "window at temperature %d, the same from streamed weights as from the engine's model", f->what, device, temp);
    }
    /* a conversation's next turn: the prompt holds the last one's tokens and its reply, whose
     * rows the cache keeps (strata_generate extends it from where the two part) */
    if (opened && !cuda) {
        drawn a = {.n = 0}, b = {.n = 0}, c = {.n = 0};
        strata_rng ra, rb, rc2;
        strata_rng_seed(&ra, 5);
        MUST(strata_generate(&inf[0].m, tokens, 4, 6, 0.0f, 0, &ra, keep, &a));
        int32_t next[T_MAX];
        int n = 0;
        for (int i = 0; i < 4; i++) next[n++] = tokens[i];
        for (int i = 0; i < a.n; i++) next[n++] = a.ids[i];
        for (int i = 0; i < 4; i++) next[n++] = tokens[10 + i];
        int cached = inf[0].m.kv_len;
        strata_rng_seed(&rb, 6);
        strata_rng_seed(&rc2, 6);
        MUST(strata_generate(&inf[0].m, next, n, 6, 1.0f, 0, &rb, keep, &b));
        MUST(strata_generate(&ref.m, next, n, 6, 1.0f, 0, &rc2, keep, &c));
        CHECK(cached == 4 + a.n - 1 && b.n == 6 && c.n == 6 && !memcmp(b.ids, c.ids, sizeof b.ids),
              "%s on %s: the next turn of a conversation (%d of its %d tokens in the cache) draws what the whole "
              "prompt's forward draws", f->what, device, cached, n);
    }
    /* another model's checkpoint is refused, naming the first tensor that differs */
    strata_config other = cfg;
    other.model.n_embd = 32;
    strata_infer bad;
    int refused = strata_infer_open_weights(&bad, &other, ck, &batch, STRATA_WEIGHTS_AUTO) != 0;
    CHECK(refused && strstr(strata_error(), "has shape"), "%s on %s: a checkpoint of another width is refused: %s",
          f->what, device, refused ? strata_error() : "it loaded");
    if (!refused) strata_infer_close(&bad);
    free(want);
    free(got);
    for (int h = 0; h < 2; h++)
        if (inf[h].dev) strata_infer_close(&inf[h]);
    if (ref.dev) strata_loaded_free(&ref);
    strata_ckpt_close(ck);
}

int main(void) {
    strata_log_set_level(STRATA_LOG_WARN);
    check_quiet = 1; /* a line for each failure, the tally at the end */
    /* one thread: the models are tiny, and the streamed blocks' copies run on a thread of
     * their own, which spinning OpenMP workers keep waiting for a core on a loaded 2-core
     * machine (10 s rather than 0.5 there) */
    omp_set_num_threads(1);
    const char *base = getenv("TMPDIR");
    snprintf(root, sizeof root, "%s/strata_infer_XXXXXX", base && *base ? base : "/tmp");
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    for (size_t i = 0; i < sizeof families / sizeof *families; i++) check_family(&families[i], "cpu");
    if (strata_cuda_available())
        for (size_t i = 0; i < sizeof families / sizeof *families; i++) check_family(&families[i], "cuda");
    else
        printf("no GPU: the CUDA cases skip\n");
    if (strata_rm_tree(root)) printf("could not remove %s: %s\n", root, strata_error());
    return check_report();
}
