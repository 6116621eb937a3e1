/* tests/test_checkpoint.c: checkpoints written at one world size read back bit for bit
 * at others; metadata and config text round trip; retention, `latest` and its fallback;
 * corruption, truncation, bad manifests and write failures give errors naming the file
 * and tensor; a writer killed at random moments never breaks the previous checkpoint. */
#include "io/checkpoint.h"
#include "io/files.h"

#include "core/common.h"
#include "tests/check.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <ftw.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/resource.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

/* The error text must be exactly `want`. */
#define CHECK_ERR(rc_failed, want, what)                                          \
    do {                                                                          \
        int same_ = (rc_failed) && !strcmp(strata_error(), (want));               \
        CHECK(same_, "%s", what);                                                 \
        if (!same_) printf("      want:       %s\n", want);                        \
    } while (0)

/* ---- a synthetic model: three units of odd sizes ---- */

#define MAX_T 8
#define MAX_U 4

typedef struct model {
    int n_units, n_tensors;
    size_t numel[MAX_U], padded[MAX_U];
    strata_param_tensor t[MAX_T];
    float *data[MAX_U][STRATA_CKPT_KINDS]; /* padded elements; padding holds junk on purpose */
    strata_param_layout L;
} model;

static void add_tensor(model *m, const char *name, int unit, int ndim, const int64_t *shape) {
    strata_param_tensor *t = &m->t[m->n_tensors++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->unit = unit;
    t->offset = m->numel[unit];
    t->ndim = ndim;
    t->numel = 1;
    for (int d = 0; d < ndim; d++) t->shape[d] = shape[d], t->numel *= (size_t)shape[d];
    m->numel[unit] += t->numel;
}

static uint64_t mix(uint64_t x) {
    x += 0x9E3779B97F4A7C15ull;
    x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9ull;
    x = (x ^ (x >> 27)) * 0x94D049BB133111EBull;
    return x ^ (x >> 31);
}

/* Any 32-bit pattern (NaNs, denormals included): the round trip must be bitwise. */
static void fill(model *m, uint64_t seed) {
    for (int u = 0; u < m->n_units; u++)
        for (int k = 0; k < STRATA_CKPT_KINDS; k++) {
            float *p = m->data[u][k];
            if (!p) p = m->data[u][k] = malloc(m->padded[u] * sizeof(float));
            for (size_t i = 0; i < m->padded[u]; i++) {
                uint32_t bits = (uint32_t)mix(seed ^ ((uint64_t)u << 56) ^ ((uint64_t)k << 48) ^ i);
                memcpy(&p[i], &bits, 4);
            }
        }
}

static void finish(model *m, size_t pad_multiple) {
    for (int u = 0; u < m->n_units; u++) m->padded[u] = strata_round_up(m->numel[u], pad_multiple);
    m->L = (strata_param_layout){m->n_units, m->numel, m->padded, m->n_tensors, m->t};
}

/* Units: 2 tensors (37, 101), 3 tensors (5x13, 101, 1), 1 tensor (7), padded to 60 so
 * worlds 3, 4 and 5 all divide them (at world 4, ranks 1..3 hold nothing of unit 2). */
static void small_model(model *m, uint64_t seed) {
    memset(m, 0, sizeof *m);
    m->n_units = 3;
    add_tensor(m, "transformer.wte.weight", 0, 1, (int64_t[]){37});
    add_tensor(m, "transformer.wpe.weight", 0, 1, (int64_t[]){101});
    add_tensor(m, "transformer.h.0.attn.c_attn.weight", 1, 2, (int64_t[]){5, 13});
    add_tensor(m, "transformer.h.0.attn.c_attn.bias", 1, 1, (int64_t[]){101});
    add_tensor(m, "transformer.h.0.ln_1.weight", 1, 1, (int64_t[]){1});
    add_tensor(m, "transformer.ln_f.weight", 2, 1, (int64_t[]){7});
    finish(m, 60);
    fill(m, seed);
}

/* Two units of two tensors, 3 kinds: about 64 MB of fp32. */
static void big_model(model *m, uint64_t seed) {
    memset(m, 0, sizeof *m);
    m->n_units = 2;
    add_tensor(m, "big.a", 0, 2, (int64_t[]){1024, 2731});
    add_tensor(m, "big.b", 0, 1, (int64_t[]){3});
    add_tensor(m, "big.c", 1, 2, (int64_t[]){1000, 2793});
    add_tensor(m, "big.d", 1, 1, (int64_t[]){17});
    finish(m, 12);
    fill(m, seed);
}

static void free_model(model *m) {
    for (int u = 0; u < m->n_units; u++)
        for (int k = 0; k < STRATA_CKPT_KINDS; k++) free(m->data[u][k]);
}

static strata_ckpt_meta make_meta(int64_t step, int world, const char *config) {
    return (strata_ckpt_meta){.step = step, .world = world, .stage = 2, .seed = 1234,
                              .rng_state = 0xFEDCBA9876543210ull + (uint64_t)step, .tokens_seen = 1e6 * step + 0.25,
                              .last_loss = 0.1 + 0.2, .config_yaml = config};
}

/* Every rank's write_rank (all in this process), then commit (val < 0: the step did not
 * validate). */
static int save_val(const char *run, model *m, int world, int64_t step, const char *config, int keep, int keep_best,
                    double val) {
    char tmp[4096], final[4096];
    if (strata_ckpt_tmp_dir(tmp, sizeof tmp, run, step) != 0) return -1;
    for (int r = 0; r < world; r++) {
        const float *shards[MAX_U][STRATA_CKPT_KINDS];
        for (int u = 0; u < m->n_units; u++)
            for (int k = 0; k < STRATA_CKPT_KINDS; k++)
                shards[u][k] = m->data[u][k] + (size_t)r * (m->padded[u] / (size_t)world);
        if (strata_ckpt_write_rank(tmp, &m->L, r, world, (const float *const (*)[STRATA_CKPT_KINDS])shards) != 0)
            return -1;
    }
    strata_ckpt_meta meta = make_meta(step, world, config);
    meta.validated = val >= 0;
    meta.val_loss = val;
    return strata_ckpt_commit(run, tmp, &m->L, &meta, keep, keep_best, final, sizeof final);
}

static int save(const char *run, model *m, int world, int64_t step, const char *config, int keep) {
    return save_val(run, m, world, step, config, keep, 0, -1);
}

/* Elements [lo, hi) of (u, k) as the checkpoint must return them: data, zeros in padding. */
static int range_matches(const model *m, int u, int k, size_t lo, size_t hi, const float *got) {
    for (size_t i = lo; i < hi; i++) {
        uint32_t a, b = 0;
        memcpy(&a, &got[i - lo], 4);
        if (i < m->numel[u]) memcpy(&b, &m->data[u][k][i], 4);
        if (a != b) return 0;
    }
    return 1;
}

/* Reads every (unit, kind) as the ranks of `world` would ask for it. */
static int read_as_world(strata_ckpt *ck, const model *m, int world) {
    for (int u = 0; u < m->n_units; u++)
        for (int k = 0; k < STRATA_CKPT_KINDS; k++) {
            size_t S = m->padded[u] / (size_t)world;
            float *buf = malloc(S * sizeof(float) + 1);
            for (int r = 0; r < world; r++) {
                if (strata_ckpt_read_range(ck, u, k, (size_t)r * S, (size_t)(r + 1) * S, buf) != 0 ||
                    !range_matches(m, u, k, (size_t)r * S, (size_t)(r + 1) * S, buf)) {
                    free(buf);
                    return 0;
                }
            }
            free(buf);
        }
    return 1;
}

/* The segments of rank r's .bin in file order, computed independently of the library. */
typedef struct segloc {
    int unit, kind, tensor;
    uint64_t offset, bytes;
} segloc;

static int oracle_segments(const model *m, int rank, int world, segloc *out) {
    int n = 0;
    uint64_t off = 0;
    for (int u = 0; u < m->n_units; u++) {
        size_t S = m->padded[u] / (size_t)world, a = (size_t)rank * S, b = a + S;
        if (b > m->numel[u]) b = m->numel[u];
        if (a >= b) continue;
        for (int k = 0; k < STRATA_CKPT_KINDS; k++)
            for (int t = 0; t < m->n_tensors; t++) {
                const strata_param_tensor *T = &m->t[t];
                if (T->unit != u) continue;
                size_t lo = T->offset > a ? T->offset : a, hi = T->offset + T->numel < b ? T->offset + T->numel : b;
                if (lo >= hi) continue;
                out[n++] = (segloc){u, k, t, off, (hi - lo) * 4};
                off += (hi - lo) * 4;
            }
    }
    return n;
}

static const char *kind_str(int k) { return k == 0 ? "param" : k == 1 ? "m" : "v"; }

/* ---- small file-system helpers ---- */

static int rm_cb(const char *p, const struct stat *sb, int flag, struct FTW *f) {
    (void)sb;
    (void)f;
    return flag == FTW_DP ? rmdir(p) : unlink(p);
}
static void rm_rf(const char *p) { nftw(p, rm_cb, 16, FTW_DEPTH | FTW_PHYS); }

static int exists(const char *fmt, const char *a, const char *b) {
    char p[4096];
    struct stat st;
    snprintf(p, sizeof p, fmt, a, b);
    return stat(p, &st) == 0;
}

/* Entries of dir whose names end in suffix. */
static int count_entries(const char *dir, const char *suffix) {
    DIR *d = opendir(dir);
    if (!d) return -1;
    int n = 0;
    size_t ls = strlen(suffix);
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        size_t l = strlen(e->d_name);
        n += l >= ls && !strcmp(e->d_name + l - ls, suffix);
    }
    closedir(d);
    return n;
}

static void write_text(const char *path, const char *text) {
    FILE *f = fopen(path, "w");
    fputs(text, f);
    fclose(f);
}

/* An edited manifest with its checksum line made to match, as a forger would: what the
 * parser does with the contents behind a valid checksum. */
static void write_manifest(const char *path, const char *text) {
    const char *body = strncmp(text, "manifest_crc32c: ", 17) ? text : strchr(text, '\n') + 1;
    FILE *f = fopen(path, "w");
    fprintf(f, "manifest_crc32c: 0x%08x\n%s", strata_crc32c(0, body, strlen(body)), body);
    fclose(f);
}

static void read_text(const char *path, char *buf, size_t len) {
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, len - 1, f) : 0;
    buf[n] = 0;
    if (f) fclose(f);
}

/* ---- tests ---- */

static void test_round_trip(const char *root) {
    char run[1024], dir[4096];
    snprintf(run, sizeof run, "%s/rt", root);
    model m;
    small_model(&m, 1);
    const char *cfg = "model: {n_layer: 2}\n";
    CHECK(save(run, &m, 4, 120, cfg, 0) == 0, "save at world 4 and commit step 120");
    CHECK(exists("%s/ckpt/step_00000120/%s", run, "manifest.yaml") &&
              exists("%s/ckpt/step_00000120/%s", run, "rank00003.bin") &&
              exists("%s/ckpt/step_00000120/%s", run, "rank00003.yaml") && !exists("%s/ckpt/step_00000120.tmp%s", run, ""),
          "step_00000120 holds manifest and rank files; the .tmp directory is gone");
    char latest[256];
    snprintf(dir, sizeof dir, "%s/ckpt/latest", run);
    read_text(dir, latest, sizeof latest);
    CHECK(!strcmp(latest, "step_00000120\n"), "ckpt/latest reads \"step_00000120\\n\"");

    CHECK(strata_ckpt_resolve("latest", run, dir, sizeof dir) == 0, "resolve latest");
    strata_ckpt *ck = strata_ckpt_open(dir);
    CHECK(ck != NULL, "open the checkpoint");
    if (!ck) return;
    CHECK(strata_ckpt_check_layout(ck, &m.L) == 0, "saved layout matches the model's");
    int full_ok = 1;
    for (int u = 0; u < 3; u++)
        for (int k = 0; k < STRATA_CKPT_KINDS; k++) {
            float *buf = malloc(m.padded[u] * sizeof(float));
            for (size_t i = 0; i < m.padded[u]; i++) buf[i] = 7.0f;
            full_ok &= strata_ckpt_read_range(ck, u, k, 0, m.padded[u], buf) == 0 &&
                       range_matches(&m, u, k, 0, m.padded[u], buf);
            free(buf);
        }
    CHECK(full_ok, "every unit and kind reads back bitwise over its full padded range (padding = 0)");
    CHECK(read_as_world(ck, &m, 4), "ranges of world 4 (same as saved) read back bitwise");
    CHECK(read_as_world(ck, &m, 3), "ranges of world 3 read back bitwise");
    CHECK(read_as_world(ck, &m, 5), "ranges of world 5 read back bitwise");
    CHECK(read_as_world(ck, &m, 1), "ranges of world 1 read back bitwise");
    strata_ckpt_close(ck);

    /* At world 20 rank 19 holds only padding: its index has no segments at all. */
    char run20[1100];
    snprintf(run20, sizeof run20, "%s/w20", root);
    CHECK(save(run20, &m, 20, 5, cfg, 0) == 0, "save at world 20 (rank 19 holds nothing)");
    ck = strata_ckpt_resolve("latest", run20, dir, sizeof dir) == 0 ? strata_ckpt_open(dir) : NULL;
    CHECK(ck && read_as_world(ck, &m, 4) && read_as_world(ck, &m, 3), "world-20 checkpoint reads back as worlds 4 and 3");
    strata_ckpt_close(ck);
    ck = strata_ckpt_resolve("latest", run, dir, sizeof dir) == 0 ? strata_ckpt_open(dir) : NULL;
    if (!ck) return;

    /* Arbitrary ranges, including ones past the saved padding (a bigger world's padding). */
    uint64_t s = 99;
    int rand_ok = 1;
    float buf[400];
    for (int it = 0; it < 500 && rand_ok; it++) {
        int u = (int)((s = mix(s)) % 3), k = (int)((s = mix(s)) % 3);
        size_t lim = m.padded[u] + 40, lo = (s = mix(s)) % lim, hi = lo + (s = mix(s)) % (lim - lo + 1);
        rand_ok = strata_ckpt_read_range(ck, u, k, lo, hi, buf) == 0 && range_matches(&m, u, k, lo, hi, buf);
        if (!rand_ok) printf("      failed at unit %d kind %d [%zu, %zu): %s\n", u, k, lo, hi, strata_error());
    }
    CHECK(rand_ok, "500 random ranges read back bitwise");

    const strata_ckpt_meta *meta = strata_ckpt_get_meta(ck);
    strata_ckpt_meta want = make_meta(120, 4, cfg);
    CHECK(meta->step == 120 && meta->world == 4 && meta->stage == 2 && meta->seed == 1234 &&
              meta->rng_state == want.rng_state,
          "meta: step, world, stage, seed, rng_state (0x%016llx) round trip", (unsigned long long)meta->rng_state);
    CHECK(!memcmp(&meta->tokens_seen, &want.tokens_seen, 8) && !memcmp(&meta->last_loss, &want.last_loss, 8),
          "meta: tokens_seen and last_loss (0.1+0.2) round trip bitwise");
    const strata_param_layout *L = strata_ckpt_get_layout(ck);
    CHECK(L->n_units == 3 && L->n_tensors == 6 && L->unit_padded[1] == 180 && L->tensors[2].ndim == 2 &&
              L->tensors[2].shape[0] == 5 && L->tensors[2].shape[1] == 13 && L->tensors[3].offset == 65,
          "get_layout: units, padding, shapes and offsets as saved");
    strata_ckpt_close(ck);
    free_model(&m);
}

/* The whole contents of a file into buf (at most cap bytes); its length, or -1. */
static long slurp(const char *path, char *buf, size_t cap) {
    FILE *f = fopen(path, "rb");
    if (!f) return -1;
    size_t n = fread(buf, 1, cap, f);
    fclose(f);
    return (long)n;
}

/* Whether dir_a/name and dir_b/name hold the same bytes. */
static int same_file(const char *dir_a, const char *dir_b, const char *name) {
    static char a[65536], b[65536];
    char pa[4200], pb[4200];
    snprintf(pa, sizeof pa, "%s/%s", dir_a, name);
    snprintf(pb, sizeof pb, "%s/%s", dir_b, name);
    long na = slurp(pa, a, sizeof a), nb = slurp(pb, b, sizeof b);
    return na >= 0 && na == nb && !memcmp(a, b, (size_t)na);
}

/* Rank r's files fed to a strata_ckpt_writer in pieces of 1..max_piece elements (a piece
 * never spans two parts, as the writer requires; it may span segments). */
static int write_in_pieces(const char *dir, model *m, int r, int world, uint64_t seed, size_t max_piece) {
    strata_ckpt_writer *w = strata_ckpt_writer_open(dir, &m->L, r, world);
    if (!w) return -1;
    for (int u = 0; u < m->n_units; u++) {
        size_t a, b;
        strata_ckpt_rank_range(&m->L, u, r, world, &a, &b);
        for (int k = 0; a < b && k < STRATA_CKPT_KINDS; k++)
            for (size_t c = a; c < b;) {
                size_t n = 1 + (seed = mix(seed)) % max_piece;
                if (n > b - c) n = b - c;
                if (strata_ckpt_writer_put(w, u, k, m->data[u][k] + c, n) != 0) {
                    strata_ckpt_writer_abort(w);
                    return -1;
                }
                c += n;
            }
    }
    return strata_ckpt_writer_close(w);
}

/* Data fed piece by piece makes the very files whole shards make (the same bytes, the same
 * index with the same CRCs); a piece out of order, too long, or a writer closed early is
 * refused naming the part that comes next. */
static void test_writer_pieces(const char *root) {
    model m;
    small_model(&m, 12);
    char whole[1024], pieces[1024];
    snprintf(whole, sizeof whole, "%s/pieces_whole", root);
    snprintf(pieces, sizeof pieces, "%s/pieces", root);
    mkdir(whole, 0755);
    mkdir(pieces, 0755);
    int same = 1;
    for (int world = 1; world <= 4 && same; world++)
        for (int r = 0; r < world && same; r++)
            for (size_t max_piece = 1; max_piece <= 64 && same; max_piece *= 4) {
                const float *shards[MAX_U][STRATA_CKPT_KINDS];
                for (int u = 0; u < m.n_units; u++)
                    for (int k = 0; k < STRATA_CKPT_KINDS; k++)
                        shards[u][k] = m.data[u][k] + (size_t)r * (m.padded[u] / (size_t)world);
                char bin[32], idx[32];
                snprintf(bin, sizeof bin, "rank%05d.bin", r);
                snprintf(idx, sizeof idx, "rank%05d.yaml", r);
                same = strata_ckpt_write_rank(whole, &m.L, r, world, (const float *const (*)[STRATA_CKPT_KINDS])shards) == 0 &&
                       write_in_pieces(pieces, &m, r, world, 77 + max_piece, max_piece) == 0 &&
                       same_file(whole, pieces, bin) && same_file(whole, pieces, idx);
                if (!same) printf("      differs at world %d rank %d, pieces of up to %zu: %s\n", world, r, max_piece,
                                  strata_error());
            }
    CHECK(same, "worlds 1-4, every rank: pieces of 1..64 elements make the files whole shards make, byte for byte");

    char want[4300];
    strata_ckpt_writer *w = strata_ckpt_writer_open(pieces, &m.L, 0, 2);
    CHECK(w != NULL, "open a writer for rank 0 of 2");
    if (!w) return;
    /* unit 0: 138 elements padded to 180; rank 0 of 2 holds [0, 90), rank 1 [90, 138) */
    size_t a, b;
    strata_ckpt_rank_range(&m.L, 0, 0, 2, &a, &b);
    size_t a1, b1;
    strata_ckpt_rank_range(&m.L, 0, 1, 2, &a1, &b1);
    CHECK(a == 0 && b == 90 && a1 == 90 && b1 == 138, "rank_range: of unit 0, rank 0 of 2 holds [0, 90), rank 1 [90, 138)");
    snprintf(want, sizeof want, "%s/rank00000.bin: unit 0 (m) given where unit 0 (param) elements [0, 90) come next",
             pieces);
    CHECK_ERR(strata_ckpt_writer_put(w, 0, STRATA_CKPT_M, m.data[0][1], 10) != 0, want, "a kind out of order is refused");
    snprintf(want, sizeof want, "%s/rank00000.bin: unit 0 (param): 91 elements given at element 0, where the part ends at 90",
             pieces);
    CHECK_ERR(strata_ckpt_writer_put(w, 0, STRATA_CKPT_PARAM, m.data[0][0], 91) != 0, want,
              "a piece past its part's end is refused");
    CHECK(strata_ckpt_writer_put(w, 0, STRATA_CKPT_PARAM, m.data[0][0], 25) == 0, "25 elements of unit 0's param");
    snprintf(want, sizeof want, "%s/rank00000.bin: closed before unit 0 (param) elements [25, 90) were written", pieces);
    CHECK_ERR(strata_ckpt_writer_close(w) != 0, want, "closing before every part was fed fails naming what is missing");
    free_model(&m);
}

/* A part of a segment larger than the reader's scratch is checked by streaming the whole
 * segment through it: the part reads back bitwise, and damage anywhere in the segment,
 * far from the part, is still found. */
static void test_partial_read_large_segment(const char *root) {
    char run[1024], dir[4096], p[4200];
    snprintf(run, sizeof run, "%s/large", root);
    model m;
    big_model(&m, 21);
    CHECK(save(run, &m, 1, 3, "", 0) == 0, "save a checkpoint whose segments are 11 MB");
    snprintf(dir, sizeof dir, "%s/ckpt/step_00000003", run);
    strata_ckpt *ck = strata_ckpt_open(dir);
    static float buf[300000];
    CHECK(ck && strata_ckpt_read_range(ck, 0, STRATA_CKPT_M, 1000000, 1300000, buf) == 0 &&
              range_matches(&m, 0, STRATA_CKPT_M, 1000000, 1300000, buf),
          "300000 elements from the middle of big.a (m), unverified before, read back bitwise");
    strata_ckpt_close(ck);
    /* the last byte of big.a (v): segments in file order are a, b of each kind */
    segloc segs[16];
    int ns = oracle_segments(&m, 0, 1, segs), hit = -1;
    for (int i = 0; i < ns; i++)
        if (segs[i].tensor == 0 && segs[i].kind == STRATA_CKPT_V) hit = i;
    snprintf(p, sizeof p, "%s/rank00000.bin", dir);
    int fd = open(p, O_RDWR);
    unsigned char byte = 0;
    off_t at = (off_t)(segs[hit].offset + segs[hit].bytes - 1);
    CHECK(fd >= 0 && pread(fd, &byte, 1, at) == 1, "read the last byte of big.a (v)");
    byte ^= 1;
    CHECK(pwrite(fd, &byte, 1, at) == 1, "flip a bit of it");
    close(fd);
    ck = strata_ckpt_open(dir);
    CHECK(ck && strata_ckpt_read_range(ck, 0, STRATA_CKPT_V, 5, 10, buf) != 0 && strstr(strata_error(), "big.a (v): checksum mismatch"),
          "a read of elements [5, 10) finds the damage at the segment's end: %s", strata_error());
    strata_ckpt_close(ck);
    free_model(&m);
}

static void test_config_text(const char *root) {
    static const char *const texts[] = {
        "# Strata run config: \"quoted\", 'single' and key: value\n"
        "model:\n  n_layer: 2   # trailing comment\n  name: \"gpt2: tiny\"\n\n  quote: 'it''s'\n\n"
        "data: {path: \"a#b\", list: [1, 2]}\n",
        "no trailing newline: x",
        "trailing blank lines\n\n\n",
        "  leading spaces\n\ttab first\n   \nlast line with spaces  ",
        "",
        "\n\nstarts with blank lines\n",
        "---\n...\n- a\n--- |\n",
        "crlf\r\nline\r\n",
        "control \x01 and \x7f bytes\n",
        "utf8: caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\n",
        "line sep \xe2\x80\xa8 and nel \xc2\x85 and bom \xef\xbb\xbf\n",
        "   \n",
    };
    char run[1024], dir[4096];
    snprintf(run, sizeof run, "%s/cfg", root);
    model m;
    small_model(&m, 2);
    int n = (int)(sizeof texts / sizeof *texts);
    for (int i = 0; i < n; i++) {
        int ok = save(run, &m, 2, i, texts[i], 1) == 0 && strata_ckpt_resolve("latest", run, dir, sizeof dir) == 0;
        strata_ckpt *ck = ok ? strata_ckpt_open(dir) : NULL;
        ok = ck && !strcmp(strata_ckpt_get_meta(ck)->config_yaml, texts[i]);
        CHECK(ok, "config text %d reads back byte-identical", i);
        if (ck && !ok) printf("      got: [%s]\n", strata_ckpt_get_meta(ck)->config_yaml);
        if (i == 0 && ck) {
            char man[4096 + 16], text[8192];
            snprintf(man, sizeof man, "%s/manifest.yaml", dir);
            read_text(man, text, sizeof text);
            CHECK(strstr(text, "config: |2+\n  # Strata run config") != NULL,
                  "a readable config is stored as a literal block");
        }
        strata_ckpt_close(ck);
    }
    CHECK(save(run, &m, 2, 50, "bad \xff byte", 1) != 0 && strstr(strata_error(), "not valid UTF-8") != NULL,
          "config text that is not UTF-8 is refused: %s", strata_error());
    free_model(&m);
}

static void test_retention_and_resolve(const char *root) {
    char run[1024], dir[4096], want[4096], p[4096 + 16];
    snprintf(run, sizeof run, "%s/ret", root);
    model m;
    small_model(&m, 3);
    int ok = 1;
    for (int step = 10; step <= 40; step += 10) ok &= save(run, &m, 4, step, "x: 1\n", 2) == 0;
    CHECK(ok, "four commits with keep=2");
    CHECK(!exists("%s/ckpt/step_00000010%s", run, "") && !exists("%s/ckpt/step_00000020%s", run, "") &&
              exists("%s/ckpt/step_00000030%s", run, "") && exists("%s/ckpt/step_00000040%s", run, ""),
          "keep=2 leaves step 30 and 40 only");
    snprintf(p, sizeof p, "%s/ckpt", run);
    CHECK(count_entries(p, ".old") == 0 && count_entries(p, ".tmp") == 0, "no .old or .tmp directories left over");

    snprintf(want, sizeof want, "%s/ckpt/step_00000040", run);
    CHECK(strata_ckpt_resolve("latest", run, dir, sizeof dir) == 0 && !strcmp(dir, want), "latest -> %s", dir);
    CHECK(strata_ckpt_resolve(run, NULL, dir, sizeof dir) == 0 && !strcmp(dir, want), "a run directory -> its latest");
    snprintf(p, sizeof p, "%s/ckpt/step_00000030", run);
    CHECK(strata_ckpt_resolve(p, NULL, dir, sizeof dir) == 0 && !strcmp(dir, p), "a checkpoint directory -> itself");
    CHECK(strata_ckpt_resolve("step_00000030", run, dir, sizeof dir) == 0 && !strcmp(dir, p),
          "a bare step name -> that step of the run");

    /* Re-saving the same step replaces it (new data) and leaves nothing aside. */
    model m2;
    small_model(&m2, 33);
    CHECK(save(run, &m2, 3, 40, "x: 2\n", 2) == 0, "re-save step 40 at world 3 over the existing step 40");
    strata_ckpt *ck = strata_ckpt_open(want);
    CHECK(ck && strata_ckpt_get_meta(ck)->world == 3 && read_as_world(ck, &m2, 4) &&
              !strcmp(strata_ckpt_get_meta(ck)->config_yaml, "x: 2\n"),
          "step 40 now holds the re-saved data");
    strata_ckpt_close(ck);
    snprintf(p, sizeof p, "%s/ckpt", run);
    CHECK(count_entries(p, ".old") == 0 && count_entries(p, ".tmp") == 0 &&
              !exists("%s/ckpt/step_00000040/%s", run, "rank00003.bin"),
          "no leftovers of the replaced step 40 (no rank00003 from world 4)");

    snprintf(p, sizeof p, "%s/ckpt/latest", run);
    unlink(p);
    strata_log_set_level(STRATA_LOG_ERROR); /* the fallback warns; keep the output short */
    CHECK(strata_ckpt_resolve("latest", run, dir, sizeof dir) == 0 && !strcmp(dir, want),
          "latest file deleted: falls back to the newest complete step");
    write_text(p, "step_00000099\n");
    CHECK(strata_ckpt_resolve("latest", run, dir, sizeof dir) == 0 && !strcmp(dir, want),
          "latest names a missing directory: falls back to the newest complete step");
    snprintf(p, sizeof p, "%s/ckpt/step_00000040/manifest.yaml", run);
    unlink(p);
    snprintf(want, sizeof want, "%s/ckpt/step_00000030", run);
    CHECK(strata_ckpt_resolve("latest", run, dir, sizeof dir) == 0 && !strcmp(dir, want),
          "a step directory without manifest.yaml is skipped");
    strata_log_set_level(STRATA_LOG_INFO);

    char empty[4096], msg[8300];
    snprintf(empty, sizeof empty, "%s/empty", root);
    snprintf(p, sizeof p, "%s/ckpt", empty);
    CHECK(strata_mkdir_p(p) == 0, "mkdir -p %s: %s", p, strata_error());
    snprintf(msg, sizeof msg, "no checkpoint in %s/ckpt", empty);
    CHECK_ERR(strata_ckpt_resolve("latest", empty, dir, sizeof dir) != 0, msg,
              "an empty ckpt/ gives \"no checkpoint in RUN/ckpt\"");
    snprintf(p, sizeof p, "%s/nothing_here", root);
    CHECK(strata_ckpt_resolve(p, NULL, dir, sizeof dir) != 0 && strstr(strata_error(), p) != NULL,
          "a missing path is an error naming it: %s", strata_error());
    snprintf(msg, sizeof msg, "%s: neither a checkpoint directory (no manifest.yaml) nor a run directory (no ckpt/)", root);
    CHECK_ERR(strata_ckpt_resolve(root, NULL, dir, sizeof dir) != 0, msg, "a directory that is neither is refused");
    free_model(&m);
    free_model(&m2);
}

/* ckpt/best: the step of the lowest validation loss among the saved steps that validated;
 * kept by retention with keep_best (and removed without it, still named); dropped when a
 * resume from an earlier step saves; resolved as "best" and as the file RUN/ckpt/best. */
static void test_best(const char *root) {
    char run[1024], ckpt[1100], dir[4096], want[4096], p[4200], name[256];
    snprintf(run, sizeof run, "%s/best", root);
    snprintf(ckpt, sizeof ckpt, "%s/ckpt", run);
    model m;
    small_model(&m, 5);
    double val = 0;
    /* validations 3.0, 2.5, (none), 2.75, 2.5 (a tie keeps the older), keep 1 with keep_best */
    const double vals[] = {3.0, 2.5, -1, 2.75, 2.5};
    int ok = 1;
    for (int i = 0; i < 5; i++) ok &= save_val(run, &m, 2, 10 * (i + 1), "x: 1\n", 1, 1, vals[i]) == 0;
    CHECK(ok, "five commits, keep 1, keep_best");
    CHECK(strata_ckpt_best(ckpt, name, sizeof name, &val) == 1 && !strcmp(name, "step_00000020") && val == 2.5,
          "best: step 20 (2.5; step 50's tie keeps the older): %s %g", name, val);
    CHECK(exists("%s/step_00000020%s", ckpt, "") && exists("%s/step_00000050%s", ckpt, "") &&
              !exists("%s/step_00000010%s", ckpt, "") && !exists("%s/step_00000030%s", ckpt, "") &&
              !exists("%s/step_00000040%s", ckpt, ""),
          "retention keeps the newest (50) and the best (20) only");
    snprintf(want, sizeof want, "%s/step_00000020", ckpt);
    CHECK(strata_ckpt_resolve("best", run, dir, sizeof dir) == 0 && !strcmp(dir, want), "\"best\" -> %s", dir);
    snprintf(p, sizeof p, "%s/best", ckpt);
    CHECK(strata_ckpt_resolve(p, NULL, dir, sizeof dir) == 0 && !strcmp(dir, want), "RUN/ckpt/best -> %s", dir);
    snprintf(p, sizeof p, "%s/latest", ckpt);
    snprintf(want, sizeof want, "%s/step_00000050", ckpt);
    CHECK(strata_ckpt_resolve(p, NULL, dir, sizeof dir) == 0 && !strcmp(dir, want), "RUN/ckpt/latest -> %s", dir);
    snprintf(want, sizeof want, "%s/step_00000020", ckpt);
    strata_ckpt *ck = strata_ckpt_open(want);
    CHECK(ck && strata_ckpt_get_meta(ck)->validated && strata_ckpt_get_meta(ck)->val_loss == 2.5,
          "step 20's manifest records its validation loss, bit for bit");
    strata_ckpt_close(ck);
    snprintf(want, sizeof want, "%s/step_00000050", ckpt);
    ck = strata_ckpt_open(want);
    CHECK(ck && strata_ckpt_get_meta(ck)->validated, "step 50 validated too");
    strata_ckpt_close(ck);

    /* a lower one replaces it; without keep_best retention removes it, best still names it */
    CHECK(save_val(run, &m, 2, 60, "x: 1\n", 1, 0, 2.0) == 0 && save_val(run, &m, 2, 70, "x: 1\n", 1, 0, 2.2) == 0,
          "steps 60 (2.0) and 70 (2.2) without keep_best");
    CHECK(strata_ckpt_best(ckpt, name, sizeof name, &val) == 1 && !strcmp(name, "step_00000060") &&
              !exists("%s/step_00000060%s", ckpt, "") && !exists("%s/step_00000020%s", ckpt, ""),
          "best names step 60 (2.0), which keep 1 removed; step 20 went too");
    CHECK(strata_ckpt_resolve("best", run, dir, sizeof dir) != 0 && strstr(strata_error(), "step_00000060") &&
              strstr(strata_error(), "run.keep_best: true keeps it"),
          "\"best\" of a removed checkpoint says what removed it: %s", strata_error());

    /* a resume from before the best: the next save drops it (another history) */
    CHECK(save_val(run, &m, 2, 55, "x: 1\n", 0, 1, -1) == 0 && strata_ckpt_best(ckpt, name, sizeof name, &val) == 0,
          "a save of step 55 (a resume from before step 60) drops best");
    CHECK(save_val(run, &m, 2, 56, "x: 1\n", 0, 1, 9.0) == 0 && strata_ckpt_best(ckpt, name, sizeof name, &val) == 1 &&
              !strcmp(name, "step_00000056"),
          "and the next validated save is the best");

    /* what no run writes is refused, naming the file */
    snprintf(p, sizeof p, "%s/best", ckpt);
    const char *bad[] = {"../step_00000010\nval_loss: 1\n", "step_00000010\n", "step_1x\nval_loss: 1\n", ""};
    for (int i = 0; i < 4; i++) {
        write_text(p, bad[i]);
        CHECK(strata_ckpt_best(ckpt, name, sizeof name, &val) < 0 && strstr(strata_error(), p),
              "a best file of %s is refused: %s", i == 3 ? "nothing" : "another form", strata_error());
    }
    free_model(&m);
}

static void test_corruption(const char *root) {
    char run[1024], dir[4096], p[4200], msg[8600];
    snprintf(run, sizeof run, "%s/bad", root);
    model m;
    small_model(&m, 4);
    CHECK(save(run, &m, 4, 7, "a: 1\n", 0) == 0, "save a checkpoint to damage");
    snprintf(dir, sizeof dir, "%s/ckpt/step_00000007", run);

    /* Flip one bit inside rank 2's segment of c_attn.bias (v): unit 1, elements [90, 135). */
    segloc segs[64];
    int ns = oracle_segments(&m, 2, 4, segs), hit = -1;
    for (int i = 0; i < ns; i++)
        if (segs[i].tensor == 3 && segs[i].kind == STRATA_CKPT_V) hit = i;
    snprintf(p, sizeof p, "%s/rank00002.bin", dir);
    uint64_t at = segs[hit].offset + 21;
    int fd = open(p, O_RDWR);
    unsigned char byte;
    CHECK(pread(fd, &byte, 1, (off_t)at) == 1, "read a byte of rank00002.bin");
    byte ^= 0x10;
    CHECK(pwrite(fd, &byte, 1, (off_t)at) == 1, "flip one bit of it");
    close(fd);
    float good[45], bad[45];
    memcpy(good, m.data[1][STRATA_CKPT_V] + 90, sizeof good);
    memcpy(bad, good, sizeof bad);
    ((unsigned char *)bad)[21] ^= 0x10;
    snprintf(msg, sizeof msg,
             "%s/rank00002.bin: tensor transformer.h.0.attn.c_attn.bias (v): checksum mismatch (stored 0x%08x, "
             "computed 0x%08x)",
             dir, strata_crc32c(0, good, sizeof good), strata_crc32c(0, bad, sizeof bad));
    strata_ckpt *ck = strata_ckpt_open(dir);
    CHECK(ck != NULL, "open still succeeds (checksums are checked on read)");
    if (ck) {
        float buf[180];
        CHECK(strata_ckpt_read_range(ck, 1, STRATA_CKPT_PARAM, 0, 180, buf) == 0 &&
                  range_matches(&m, 1, STRATA_CKPT_PARAM, 0, 180, buf),
              "undamaged kinds of the same unit read fine");
        CHECK_ERR(strata_ckpt_read_range(ck, 1, STRATA_CKPT_V, 100, 101, buf) != 0, msg,
                  "partial read of the damaged segment: exact checksum error");
        CHECK_ERR(strata_ckpt_read_range(ck, 1, STRATA_CKPT_V, 90, 135, buf) != 0, msg,
                  "whole read of the damaged segment: exact checksum error");
        CHECK_ERR(strata_ckpt_read_range(ck, 1, STRATA_CKPT_V, 0, 180, buf) != 0, msg,
                  "full-unit read: exact checksum error");
        strata_ckpt_close(ck);
    }

    /* Truncate rank 1's file by 10 bytes: its last segment is c_attn.bias (v). */
    ns = oracle_segments(&m, 1, 4, segs);
    uint64_t total = segs[ns - 1].offset + segs[ns - 1].bytes, cut = total - 10;
    int first_short = 0;
    while (segs[first_short].offset + segs[first_short].bytes <= cut) first_short++;
    snprintf(p, sizeof p, "%s/rank00001.bin", dir);
    CHECK(truncate(p, (off_t)cut) == 0, "truncate rank00001.bin by 10 bytes");
    snprintf(msg, sizeof msg, "%s: truncated: expected %llu bytes, found %llu (tensor %s, %s)", p,
             (unsigned long long)total, (unsigned long long)cut, m.t[segs[first_short].tensor].name,
             kind_str(segs[first_short].kind));
    CHECK_ERR(strata_ckpt_open(dir) == NULL, msg, "open refuses a truncated rank file: exact error");
    /* A cut deep into the file names an earlier segment. */
    cut = segs[1].offset + 4;
    CHECK(truncate(p, (off_t)cut) == 0, "truncate rank00001.bin inside its second segment");
    snprintf(msg, sizeof msg, "%s: truncated: expected %llu bytes, found %llu (tensor %s, %s)", p,
             (unsigned long long)total, (unsigned long long)cut, m.t[segs[1].tensor].name, kind_str(segs[1].kind));
    CHECK_ERR(strata_ckpt_open(dir) == NULL, msg, "the error names the first segment not fully present");
    unlink(p);
    snprintf(msg, sizeof msg, "%s: cannot open: No such file or directory", p);
    CHECK_ERR(strata_ckpt_open(dir) == NULL, msg, "a missing rank file is named");

    /* Manifests: garbage, a different format version, an unknown tensor layout. */
    snprintf(p, sizeof p, "%s/manifest.yaml", dir);
    char orig[16384];
    read_text(p, orig, sizeof orig);
    write_text(p, "format: [strata\n  :: {{ \"unterminated\n");
    CHECK(strata_ckpt_open(dir) == NULL && !strncmp(strata_error(), p, strlen(p)),
          "garbage YAML manifest: error names it: %s", strata_error());
    write_text(p, "\xff\xfe garbage");
    CHECK(strata_ckpt_open(dir) == NULL && !strncmp(strata_error(), p, strlen(p)),
          "binary garbage manifest: error names it: %s", strata_error());
    write_text(p, "- just\n- a list\n");
    CHECK(strata_ckpt_open(dir) == NULL && !strncmp(strata_error(), p, strlen(p)),
          "a manifest that is not a mapping: %s", strata_error());
    int bad_manifest = 0;
    CHECK(strata_ckpt_open_checked(dir, &bad_manifest) == NULL && bad_manifest,
          "a manifest without a mapping is the manifest's fault (exit 2)");
    char *v2 = strdup(orig);
    memcpy(strstr(v2, "strata-checkpoint-1"), "strata-checkpoint-9", 19);
    write_manifest(p, v2);
    snprintf(msg, sizeof msg,
             "%s: format 'strata-checkpoint-9' is not strata-checkpoint-1 or strata-checkpoint-2 (written by another "
             "version of Strata?)", p);
    CHECK_ERR(strata_ckpt_open(dir) == NULL, msg, "another format version is refused clearly");
    /* format 2 says how the optimizer state is stored: without optim_state it is refused */
    memcpy(strstr(v2, "strata-checkpoint-9"), "strata-checkpoint-2", 19);
    write_manifest(p, v2);
    CHECK(strata_ckpt_open(dir) == NULL && strstr(strata_error(), "optim_state"),
          "a format-2 manifest without optim_state is refused naming it: %s", strata_error());
    free(v2);
    char *noworld = strdup(orig);
    memcpy(strstr(noworld, "\nworld:"), "\nwurld:", 7);
    write_manifest(p, noworld);
    CHECK(strata_ckpt_open(dir) == NULL && strstr(strata_error(), "line 6: unknown key 'wurld'") &&
              !strncmp(strata_error(), p, strlen(p)),
          "a renamed key is named: %s", strata_error());
    free(noworld);

    /* The checksum: one edited byte is refused, naming the file; the original loads. */
    char *edited = strdup(orig);
    char *step = strstr(edited, "\nstep: ");
    CHECK(step != NULL, "the manifest has a step line");
    if (step) step[7] = step[7] == '9' ? '8' : step[7] + 1;
    write_text(p, edited);
    CHECK(strata_ckpt_open_checked(dir, &bad_manifest) == NULL && bad_manifest &&
              !strncmp(strata_error(), p, strlen(p)) && strstr(strata_error(), ": checksum mismatch (manifest_crc32c says ") &&
              strstr(strata_error(), "the manifest was edited or corrupted; refusing it"),
          "an edited step is refused by the checksum: %s", strata_error());
    free(edited);
    write_text(p, orig);
    /* (this directory lost rank00001.bin above: the manifest passes, the data does not) */
    CHECK(strata_ckpt_open_checked(dir, &bad_manifest) == NULL && !bad_manifest &&
              strstr(strata_error(), "rank00001.bin: cannot open"),
          "the original manifest passes its checks: %s", strata_error());
    write_text(p, "manifest_crc32c: 0xzz\nformat: x\n");
    CHECK(strata_ckpt_open(dir) == NULL && strstr(strata_error(), "manifest_crc32c is not a 32-bit hex number"),
          "a malformed checksum line is refused: %s", strata_error());
    /* the checksum line moved off the first line is an edit too */
    char *moved = strdup(strchr(orig, '\n') + 1);
    write_text(p, moved);
    FILE *mf = fopen(p, "a");
    fputs("manifest_crc32c: 0x00000000\n", mf);
    fclose(mf);
    CHECK(strata_ckpt_open(dir) == NULL && strstr(strata_error(), "manifest_crc32c is not on the first line"),
          "a checksum line that is not first is refused: %s", strata_error());
    /* an old manifest (no checksum line) loads, unverified */
    write_text(p, moved);
    CHECK(strata_ckpt_open_checked(dir, &bad_manifest) == NULL && !bad_manifest &&
              strstr(strata_error(), "rank00001.bin: cannot open"),
          "a manifest without the checksum line (an older Strata's) passes, unverified: %s", strata_error());
    free(moved);

    /* A manifest names no files: a key that would (../x, an absolute path) is refused,
     * even behind a valid checksum, at the top level and inside a tensor. */
    static const char *const escapes[] = {"file: ../x\n", "data: /etc/passwd\n", "rank0: ../../step_00000001/rank00000.bin\n"};
    for (int i = 0; i < 3; i++) {
        size_t n = strlen(orig) + strlen(escapes[i]) + 1;
        char *esc = malloc(n);
        char *cfg = strstr(orig, "\nconfig: ");
        snprintf(esc, n, "%.*s\n%s%s", (int)(cfg - orig), orig, escapes[i], cfg + 1);
        write_manifest(p, esc);
        CHECK(strata_ckpt_open_checked(dir, &bad_manifest) == NULL && bad_manifest && strstr(strata_error(), "unknown key") &&
                  !strncmp(strata_error(), p, strlen(p)),
              "a manifest with '%.*s' is refused (exit 2): %s", (int)strlen(escapes[i]) - 1, escapes[i], strata_error());
        free(esc);
    }
    char *tfile = strdup(orig);
    char *dt = strstr(tfile, ", dtype: float32}");
    CHECK(dt != NULL, "a tensor line to edit");
    if (dt) memcpy(dt, ", file: ../../xy}", 17);
    write_manifest(p, tfile);
    CHECK(strata_ckpt_open_checked(dir, &bad_manifest) == NULL && bad_manifest && strstr(strata_error(), "unknown key 'file'"),
          "a tensor naming a file is refused: %s", strata_error());
    free(tfile);
    write_text(p, orig);
    free_model(&m);
}

static void test_check_layout(const char *root) {
    char run[1024], dir[4096], msg[8300];
    snprintf(run, sizeof run, "%s/lay", root);
    model m;
    small_model(&m, 5);
    save(run, &m, 2, 1, "", 0);
    strata_ckpt_resolve("latest", run, dir, sizeof dir);
    strata_ckpt *ck = strata_ckpt_open(dir);
    CHECK(ck != NULL, "open for layout checks");
    if (!ck) return;
    model o = m;
    o.L.tensors = o.t;
    o.t[2].shape[0] = 13, o.t[2].shape[1] = 5;
    snprintf(msg, sizeof msg,
             "checkpoint %s: tensor transformer.h.0.attn.c_attn.weight has shape [5, 13], but the model's has [13, 5]",
             dir);
    CHECK_ERR(strata_ckpt_check_layout(ck, &o.L) != 0, msg, "a transposed shape is named");
    o = m;
    o.L.tensors = o.t;
    snprintf(o.t[4].name, sizeof o.t[4].name, "transformer.h.0.ln_2.weight");
    snprintf(msg, sizeof msg,
             "checkpoint %s: tensor 4 is transformer.h.0.ln_1.weight, but the model's is transformer.h.0.ln_2.weight",
             dir);
    CHECK_ERR(strata_ckpt_check_layout(ck, &o.L) != 0, msg, "a renamed tensor is named");
    o = m;
    o.L.tensors = o.t;
    o.L.n_tensors = 5;
    CHECK(strata_ckpt_check_layout(ck, &o.L) != 0 && strstr(strata_error(), "transformer.ln_f.weight"),
          "a missing tensor is named: %s", strata_error());
    strata_ckpt_close(ck);
    free_model(&m);
}

/* A file-size limit makes write() fail (EFBIG) as a full disk would (ENOSPC). */
static void test_write_failure(const char *root) {
    char run[1024];
    snprintf(run, sizeof run, "%s/full", root);
    int pfd[2];
    if (pipe(pfd) != 0) return;
    pid_t pid = fork();
    if (pid == 0) {
        close(pfd[0]);
        signal(SIGXFSZ, SIG_IGN);
        struct rlimit rl = {4096, 4096};
        setrlimit(RLIMIT_FSIZE, &rl);
        model m;
        small_model(&m, 6);
        m.numel[0] = 1100, m.padded[0] = 1200; /* a unit bigger than the limit */
        m.t[1].shape[0] = 1063, m.t[1].numel = 1063;
        for (int k = 0; k < 3; k++) m.data[0][k] = calloc(1200, sizeof(float));
        const char *e = save(run, &m, 1, 1, "", 0) == 0 ? "no error" : strata_error();
        if (write(pfd[1], e, strlen(e)) < 0) _exit(2);
        _exit(0);
    }
    close(pfd[1]);
    char got[2048] = {0};
    ssize_t n = read(pfd[0], got, sizeof got - 1);
    (void)n;
    close(pfd[0]);
    waitpid(pid, NULL, 0);
    char want[4300];
    snprintf(want, sizeof want, "%s/ckpt/step_00000001.tmp/rank00000.bin: write failed: %s", run, strerror(EFBIG));
    CHECK(!strcmp(got, want), "a failing write is reported naming the file: %s", got);
    CHECK(!exists("%s/ckpt/step_00000001%s", run, ""), "nothing was committed after the failed write");
}

/* Forks a writer of a 64 MB step-2 checkpoint (world 2) and SIGKILLs it `delay_us` after
 * it created its .tmp directory, or after it finished writing and entered commit when
 * `in_commit`. Returns whether the writer had reached commit. */
static int kill_writer(const char *run, int delay_us, int in_commit) {
    int pfd[2];
    if (pipe(pfd) != 0) return -1;
    pid_t pid = fork();
    if (pid == 0) {
        close(pfd[0]);
        model b;
        big_model(&b, 100);
        char tmp[4096];
        if (strata_ckpt_tmp_dir(tmp, sizeof tmp, run, 2) != 0 || write(pfd[1], "S", 1) != 1) _exit(2);
        const float *shards[MAX_U][STRATA_CKPT_KINDS];
        for (int r = 0; r < 2; r++) {
            for (int u = 0; u < b.n_units; u++)
                for (int k = 0; k < 3; k++) shards[u][k] = b.data[u][k] + (size_t)r * (b.padded[u] / 2);
            if (strata_ckpt_write_rank(tmp, &b.L, r, 2, (const float *const (*)[STRATA_CKPT_KINDS])shards) != 0)
                _exit(3);
        }
        if (write(pfd[1], "C", 1) != 1) _exit(2);
        strata_ckpt_meta meta = make_meta(2, 2, "step: 2\n");
        _exit(strata_ckpt_commit(run, tmp, &b.L, &meta, 3, 0, NULL, 0) == 0 ? 0 : 4);
    }
    close(pfd[1]);
    char c = 0;
    if (read(pfd[0], &c, 1) != 1) c = 0;
    if (in_commit && read(pfd[0], &c, 1) != 1) c = 0;
    if (delay_us) {
        struct timespec ts = {0, delay_us * 1000L};
        nanosleep(&ts, NULL);
    }
    kill(pid, SIGKILL);
    int status;
    waitpid(pid, &status, 0);
    fcntl(pfd[0], F_SETFL, O_NONBLOCK);
    int reached = c == 'C' || (read(pfd[0], &c, 1) == 1 && c == 'C');
    close(pfd[0]);
    return reached;
}

/* Kill a writer of a 64 MB checkpoint at several moments; the previous checkpoint must
 * stay loadable, and the next commit must clean up after it. */
static void test_crash_safety(const char *root) {
    char run[1024], dir[4096], step1[4096], tmp2[4200], ckdir[1100];
    snprintf(run, sizeof run, "%s/crash", root);
    snprintf(ckdir, sizeof ckdir, "%s/ckpt", run);
    snprintf(tmp2, sizeof tmp2, "%s/ckpt/step_00000002.tmp", run);
    model m, b;
    small_model(&m, 7);
    big_model(&b, 100);
    CHECK(save(run, &m, 4, 1, "step: 1\n", 3) == 0, "commit step 1");
    snprintf(step1, sizeof step1, "%s/ckpt/step_00000001", run);

    /* Kills while the rank files are being written: latest must be step 1. */
    static const int delays_us[] = {20000, 10000, 3000, 1000, 0}; /* the last one kills right away */
    int reached = 0; /* once a writer got into commit (a very fast disk), step 2 may be published */
    for (int it = 0; it < (int)(sizeof delays_us / sizeof *delays_us); it++) {
        reached |= kill_writer(run, delays_us[it], 0) == 1;
        strata_ckpt *ck = NULL;
        int ok = strata_ckpt_resolve("latest", run, dir, sizeof dir) == 0 && (ck = strata_ckpt_open(dir)) != NULL;
        if (reached) {
            ok = ok && (!strcmp(dir, step1) ? read_as_world(ck, &m, 4) : read_as_world(ck, &b, 2));
            CHECK(ok, "killed %d us in, a writer had finished writing: latest (%s) reads back intact", delays_us[it],
                  dir);
        } else {
            ok = ok && !strcmp(dir, step1) && read_as_world(ck, &m, 4);
            CHECK(ok, "killed %5d us into writing step 2: latest is step 1 and reads back intact", delays_us[it]);
        }
        strata_ckpt_close(ck);
    }
    struct stat st;
    CHECK(stat(tmp2, &st) == 0, "the killed writer left step_00000002.tmp behind");

    /* Kills inside commit (manifest, validation, renames, latest, clean-up): latest must
     * name a whole checkpoint, step 1 or step 2. */
    static const int commit_delays_us[] = {0, 300, 1000, 3000, 10000};
    int n2 = 0;
    for (int it = 0; it < (int)(sizeof commit_delays_us / sizeof *commit_delays_us); it++) {
        kill_writer(run, commit_delays_us[it], 1);
        strata_ckpt *ck = NULL;
        int ok = strata_ckpt_resolve("latest", run, dir, sizeof dir) == 0 && (ck = strata_ckpt_open(dir)) != NULL;
        int is1 = ok && !strcmp(dir, step1);
        n2 += ok && !is1;
        ok = ok && (is1 ? read_as_world(ck, &m, 4) : read_as_world(ck, &b, 2));
        CHECK(ok, "killed %5d us into commit: latest is step %d and reads back intact", commit_delays_us[it],
              is1 ? 1 : 2);
        strata_ckpt_close(ck);
    }
    printf("      (step 2 had been published in %d of those runs)\n", n2);

    CHECK(save(run, &m, 2, 3, "step: 3\n", 3) == 0, "a later commit (step 3) succeeds");
    CHECK(stat(tmp2, &st) != 0 && count_entries(ckdir, ".tmp") == 0 && count_entries(ckdir, ".old") == 0,
          "and removes the stale step_00000002.tmp (no .tmp or .old left)");
    CHECK(strata_ckpt_resolve("latest", run, dir, sizeof dir) == 0 && strstr(dir, "step_00000003"),
          "latest is step 3");
    free_model(&m);
    free_model(&b);
}

/* What killed saves leave (an unfinished step_N.tmp, the moved-aside copy of a re-saved
 * step, a half-written latest.tmp) is removed at start; finished steps are not, nor is an
 * .old whose step has no finished copy (it may be the only one). */
static void test_clean_stale(const char *root) {
    char run[1024], p[4096], removed[256];
    snprintf(run, sizeof run, "%s/clean", root);
    CHECK(strata_ckpt_clean_stale(run, removed, sizeof removed) == 0, "clean_stale: a run without ckpt/ has nothing to clean");
    model m;
    small_model(&m, 11);
    CHECK(save(run, &m, 2, 4, "a: 1\n", 0) == 0 && save(run, &m, 2, 8, "a: 1\n", 0) == 0, "clean_stale: two checkpoints saved");
    char tmp[4096];
    strata_ckpt_tmp_dir(tmp, sizeof tmp, run, 12); /* a save of step 12 killed half-way */
    const float *shards[MAX_U][STRATA_CKPT_KINDS];
    for (int u = 0; u < m.n_units; u++)
        for (int k = 0; k < STRATA_CKPT_KINDS; k++) shards[u][k] = m.data[u][k];
    strata_ckpt_write_rank(tmp, &m.L, 0, 2, (const float *const (*)[STRATA_CKPT_KINDS])shards);
    snprintf(p, sizeof p, "%s/ckpt/step_00000004.old", run); /* step 4 re-saved: the old copy left */
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/ckpt/step_00000006.old", run); /* moved aside, the new copy never installed */
    mkdir(p, 0755);
    snprintf(p, sizeof p, "%s/ckpt/latest.tmp", run);
    write_text(p, "step_00000012\n");
    int n = strata_ckpt_clean_stale(run, removed, sizeof removed);
    CHECK(n == 3, "clean_stale: 3 leftovers removed, got %d: '%s'", n, removed);
    CHECK(strstr(removed, "step_00000012.tmp") && strstr(removed, "step_00000004.old") && strstr(removed, "latest.tmp"),
          "clean_stale: their names are reported: '%s'", removed);
    CHECK(!exists("%s/ckpt/step_00000012.tmp%s", run, "") && !exists("%s/ckpt/step_00000004.old%s", run, ""),
          "clean_stale: step_00000012.tmp and step_00000004.old are gone");
    CHECK(exists("%s/ckpt/step_00000006.old%s", run, ""), "clean_stale: an .old without a finished step stays");
    CHECK(exists("%s/ckpt/step_00000004/manifest.yaml%s", run, "") && exists("%s/ckpt/step_00000008/manifest.yaml%s", run, ""),
          "clean_stale: finished checkpoints are untouched");
    char dir[4096];
    CHECK(strata_ckpt_resolve("latest", run, dir, sizeof dir) == 0 && strstr(dir, "step_00000008"),
          "clean_stale: latest still names step 8");
    CHECK(strata_ckpt_clean_stale(run, removed, sizeof removed) == 0, "clean_stale: a second pass finds nothing");
    free_model(&m);
}

/* Replaces the first `from` in the manifest of dir with `to` (a hand edit, as an attacker would). */
static void edit_manifest(const char *dir, const char *orig, const char *from, const char *to) {
    char p[4200], text[16384];
    snprintf(p, sizeof p, "%s/manifest.yaml", dir);
    const char *at = strstr(orig, from);
    CHECK(at != NULL, "the manifest holds '%s'", from);
    if (!at) return;
    snprintf(text, sizeof text, "%.*s%s%s", (int)(at - orig), orig, to, at + strlen(from));
    write_manifest(p, text); /* with its checksum made to match: the parser behind it is what is tested */
}

/* Manifests that asked for what the bytes do not hold (found by tests/fuzz/fuzz_checkpoint). */
static void test_hostile_manifest(const char *root) {
    char run[1024], dir[4096], p[4200], msg[8600], orig[16384];
    snprintf(run, sizeof run, "%s/hostile", root);
    model m;
    small_model(&m, 5);
    CHECK(save(run, &m, 2, 3, "a: 1\n", 0) == 0, "save a checkpoint to edit");
    snprintf(dir, sizeof dir, "%s/ckpt/step_00000003", run);
    snprintf(p, sizeof p, "%s/manifest.yaml", dir);
    read_text(p, orig, sizeof orig);

    /* a world of 2^31-1 ranks: per-rank state for all of them was allocated (8 GiB) */
    edit_manifest(dir, orig, "\nworld: 2\n", "\nworld: 2147483647\n");
    snprintf(msg, sizeof msg, "%s: world 2147483647 must be between 1 and 1048576", p);
    CHECK_ERR(strata_ckpt_open(dir) == NULL, msg, "a manifest's absurd world is refused before allocating");

    /* (2^63-1)^2 wraps to 1 in 64 bits, so this shape "had" 37 elements */
    edit_manifest(dir, orig, "numel: 37, shape: [37]", "numel: 37, shape: [9223372036854775807, 9223372036854775807, 37]");
    snprintf(msg, sizeof msg, "%s: tensor transformer.wte.weight: its shape's element count overflows", p);
    CHECK_ERR(strata_ckpt_open(dir) == NULL, msg, "a shape whose element count wraps around is refused");

    write_text(p, orig);
    strata_ckpt *ck = strata_ckpt_open(dir);
    CHECK(ck != NULL, "the unedited manifest still opens (%s)", ck ? "" : strata_error());
    strata_ckpt_close(ck);
    free_model(&m);
}

int main(void) {
    const char *base = getenv("TMPDIR");
    char root[256];
    /* mkdtemp's template: the name followed by six 'X' it replaces */
    int len = snprintf(root, sizeof root - 8, "%s/strata_ckpt_", base && *base ? base : "/tmp");
    if (len < 0 || len >= (int)sizeof root - 8) {
        fprintf(stderr, "TMPDIR is too long\n");
        return 1;
    }
    memset(root + len, 'X', 6);
    root[len + 6] = 0;
    if (!mkdtemp(root)) {
        perror("mkdtemp");
        return 1;
    }
    double t0 = strata_now_ms();
    test_round_trip(root);
    test_writer_pieces(root);
    test_partial_read_large_segment(root);
    test_config_text(root);
    test_retention_and_resolve(root);
    test_best(root);
    test_corruption(root);
    test_check_layout(root);
    test_write_failure(root);
    test_crash_safety(root);
    test_clean_stale(root);
    test_hostile_manifest(root);
    rm_rf(root);
    printf("%s: %d failure(s), %.0f ms\n", failures ? "FAILED" : "passed", failures, strata_now_ms() - t0);
    return failures ? 1 : 0;
}
