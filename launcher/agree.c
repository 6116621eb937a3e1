/* launcher/agree.c: every rank's config, data and tokenizer against rank 0's, at the start
 * of a run (launcher/agree.h).
 *
 * Each rank reduces what it would train with to a few digests (rank_facts) and all ranks
 * gather them, so every rank sees the same differences and decides alike. Only when the
 * configs differ does more move: rank 0's config to every rank, each rank's list of the
 * keys that differ back, so rank 0 can name them. */
#include "launcher/agree.h"

#include <glob.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include <unistd.h>

#include "core/common.h"
#include "shard/mpi.h"
#include "shard/peers.h"

/* Keys a rank may set for its own machine: threads for its cores, a swap directory on its
 * own disk, and data at its own paths (their content is compared instead). */
static const char *const per_rank_keys[] = {"train.threads", "offload.nvme_path", "data.train", "data.val",
                                            "data.tokenizer", NULL};

enum { TRAIN = 0, VAL = 1 };

typedef struct rank_facts {
    uint32_t config;            /* strata_config_digest of the shared keys */
    uint32_t config_bytes;      /* sizeof (strata_config): the same build */
    uint32_t shards[2];         /* CRC-32C of the shard list (names and sizes): train, val */
    int64_t files[2], bytes[2]; /* how many shards, how many bytes */
    int64_t unreadable[2];      /* shards this rank cannot open for reading */
    uint32_t tokenizer;         /* strata_bpe_digest, when has_tokenizer */
    int32_t has_tokenizer, tokenizer_ids;
} rank_facts;

#define DIFF_BYTES 1024 /* one rank's list of differing keys */

/* The shards `pattern` matches, as the loader will open them (glob(3), sorted): how many,
 * their bytes, how many this rank cannot read, and a CRC of their names (without the
 * folder), sizes and readability. Nothing matched is 0 files; the loader says why later. */
static void shard_facts(const char *pattern, uint32_t *crc, int64_t *files, int64_t *bytes, int64_t *unreadable) {
    *crc = 0, *files = 0, *bytes = 0, *unreadable = 0;
    glob_t g;
    if (!pattern[0] || glob(pattern, 0, NULL, &g) != 0) return;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        struct stat st;
        int64_t size = stat(g.gl_pathv[i], &st) == 0 ? (int64_t)st.st_size : -1;
        int readable = access(g.gl_pathv[i], R_OK) == 0;
        const char *slash = strrchr(g.gl_pathv[i], '/');
        const char *base = slash ? slash + 1 : g.gl_pathv[i];
        *crc = strata_crc32c(*crc, base, strlen(base) + 1);
        *crc = strata_crc32c(*crc, &size, sizeof size);
        if (!readable) *crc = strata_crc32c(*crc, "unreadable", 10);
        (*files)++;
        *unreadable += !readable;
        *bytes += size > 0 ? size : 0;
    }
    globfree(&g);
}

static int collect(rank_facts *f, const strata_config *cfg, const strata_bpe *tk) {
    memset(f, 0, sizeof *f);
    f->config = strata_config_digest(cfg, per_rank_keys);
    f->config_bytes = (uint32_t)sizeof *cfg;
    shard_facts(cfg->data.train, &f->shards[TRAIN], &f->files[TRAIN], &f->bytes[TRAIN], &f->unreadable[TRAIN]);
    shard_facts(cfg->data.val, &f->shards[VAL], &f->files[VAL], &f->bytes[VAL], &f->unreadable[VAL]);
    if (tk) {
        f->has_tokenizer = 1;
        f->tokenizer_ids = strata_bpe_vocab_size(tk);
        if (strata_bpe_digest(tk, &f->tokenizer)) return -1;
    }
    return 0;
}

static void describe_shards(const rank_facts *f, int k, char *buf, size_t n) {
    if (!f->files[k]) {
        snprintf(buf, n, "no file");
        return;
    }
    int o = snprintf(buf, n, "%lld file%s of %lld bytes (digest %08x)", (long long)f->files[k],
                     f->files[k] == 1 ? "" : "s", (long long)f->bytes[k], f->shards[k]);
    if (f->unreadable[k] && o > 0 && (size_t)o < n)
        snprintf(buf + o, n - (size_t)o, ", %lld of them unreadable", (long long)f->unreadable[k]);
}

static void describe_tokenizer(const rank_facts *f, char *buf, size_t n) {
    if (!f->has_tokenizer) snprintf(buf, n, "none");
    else snprintf(buf, n, "%d tokens (digest %08x)", f->tokenizer_ids, f->tokenizer);
}

/* What differs between rank 0's facts and rank r's in category c (0 config, 1 data.train,
 * 2 data.val, 3 tokenizer), into buf ("" when nothing does). */
static void difference(const rank_facts *all, const char *diffs, int r, int c, char *buf, size_t n) {
    const rank_facts *a = &all[0], *b = &all[r];
    char x[160], y[160];
    buf[0] = 0;
    switch (c) {
    case 0:
        if (a->config_bytes != b->config_bytes) snprintf(buf, n, "another build of strata (its config is laid out otherwise)");
        else if (a->config != b->config) snprintf(buf, n, "%s", diffs + (size_t)r * DIFF_BYTES);
        return;
    case 1:
    case 2:
        if (a->shards[c - 1] == b->shards[c - 1] && a->files[c - 1] == b->files[c - 1] &&
            a->unreadable[c - 1] == b->unreadable[c - 1])
            return;
        describe_shards(a, c - 1, x, sizeof x);
        describe_shards(b, c - 1, y, sizeof y);
        snprintf(buf, n, "%s vs %s", x, y);
        return;
    default:
        if (a->has_tokenizer == b->has_tokenizer && a->tokenizer == b->tokenizer) return;
        describe_tokenizer(a, x, sizeof x);
        describe_tokenizer(b, y, sizeof y);
        snprintf(buf, n, "%s vs %s", x, y);
    }
}

/* "rank 1's config differs from rank 0's" at one host; "ranks 2, 3 on h2: the config
 * differs from rank 0's" when the job spans several (the ranks named with their hosts). */
static void say_difference(const int *ranks, int n, const char *what, const char *diff) {
    char who[1024];
    size_t o = 0;
    who[0] = 0;
    strata_peers_describe_ranks(ranks, n, who, &o, sizeof who);
    if (n == 1 && strata_peers_n_hosts() <= 1)
        STRATA_ERROR("train", "rank %s's %s differs from rank 0's (rank 0's first): %s", who, what, diff);
    else
        STRATA_ERROR("train", "%s %s: the %s differs from rank 0's%s%s (rank 0's first): %s", n == 1 ? "rank" : "ranks",
                     who, what, strata_peers_n_hosts() > 1 ? " on " : "", strata_peers_n_hosts() > 1 ? strata_peers_host(0) : "",
                     diff);
}

/* Rank 0: one line per difference, the ranks with the same one together. */
static void report(const rank_facts *all, const char *diffs, int world) {
    static const char *const what[] = {"config", "data.train", "data.val", "tokenizer"};
    char *seen = strata_xcalloc((size_t)world, 1);
    int *ranks = strata_xcalloc((size_t)world, sizeof *ranks), no_data = 0;
    char mine[DIFF_BYTES + 200], other[DIFF_BYTES + 200];
    for (int c = 0; c < 4; c++) {
        memset(seen, 0, (size_t)world);
        for (int r = 1; r < world; r++) {
            if (seen[r]) continue;
            difference(all, diffs, r, c, mine, sizeof mine);
            if (!mine[0]) continue;
            int n = 0;
            for (int q = r; q < world; q++) {
                if (q != r) {
                    difference(all, diffs, q, c, other, sizeof other);
                    if (strcmp(mine, other)) continue;
                }
                seen[q] = 1;
                ranks[n++] = q;
            }
            if ((c == 1 || c == 2) && (!all[r].files[c - 1] || !all[0].files[c - 1] || all[r].unreadable[c - 1]))
                no_data = 1;
            say_difference(ranks, n, what[c], mine);
        }
    }
    free(ranks);
    free(seen);
    if (no_data)
        STRATA_ERROR("train", "a rank that sees no shard, or cannot read one, needs the data where its data.train "
                     "and data.val say: on a filesystem every host shares, or a copy of the same shards on each host");
    STRATA_ERROR("train", "every rank must train with the same config, data and tokenizer: give each the same");
}

enum { REFUSAL_BYTES = 1024 };

int strata_ranks_refusals(int rc, const char *why, int rank, int world) {
    if (world <= 1) return rc;
    struct {
        int32_t rc;
        char why[REFUSAL_BYTES];
    } mine, *all = strata_xcalloc((size_t)world, sizeof mine);
    memset(&mine, 0, sizeof mine);
    mine.rc = rc;
    snprintf(mine.why, sizeof mine.why, "%s", rc && why ? why : "");
    if (strata_mpi_allgather(&mine, all, sizeof mine)) {
        free(all);
        return -1;
    }
    int agreed = 0, refused = 0, same = 1;
    for (int r = 0; r < world; r++) {
        if (all[r].rc > agreed) agreed = all[r].rc;
        refused += all[r].rc != 0;
        same &= all[r].rc != 0 && !strcmp(all[r].why, all[0].why);
    }
    if (rank == 0 && refused) {
        if (same) {
            if (all[0].why[0]) strata_out_printf(stderr, "%s\n", all[0].why); /* one config, refused alike everywhere */
        } else {
            /* the ranks that give the same reason together, with their hosts */
            int *ranks = strata_xcalloc((size_t)world, sizeof *ranks);
            char *said = strata_xcalloc((size_t)world, 1);
            for (int r = 0; r < world; r++) {
                if (!all[r].rc || said[r] || !all[r].why[0]) continue;
                int n = 0;
                for (int q = r; q < world; q++)
                    if (all[q].rc && !said[q] && !strcmp(all[q].why, all[r].why)) {
                        said[q] = 1;
                        ranks[n++] = q;
                    }
                char who[1024];
                size_t o = 0;
                who[0] = 0;
                strata_peers_describe_ranks(ranks, n, who, &o, sizeof who);
                STRATA_ERROR("train", "%s %s: %s", n == 1 ? "rank" : "ranks", who, all[r].why);
            }
            free(said);
            free(ranks);
        }
    }
    free(all);
    if (refused && strata_ranks_spoken()) return -1;
    return agreed;
}

int strata_ranks_spoken(void) {
    int32_t done = 1;
    return strata_mpi_bcast(&done, sizeof done, 0);
}

int strata_ranks_agree(const strata_config *cfg, const strata_bpe *tk, int rank, int world) {
    if (world <= 1) return 0;
    rank_facts mine;
    if (collect(&mine, cfg, tk)) return -1;
    rank_facts *all = strata_xcalloc((size_t)world, sizeof *all);
    char *diffs = NULL;
    strata_config *first = NULL;
    int rc = -1;
    if (strata_mpi_allgather(&mine, all, sizeof mine)) goto out;
    int config_differs = 0, differs = 0;
    for (int r = 1; r < world; r++) {
        char buf[DIFF_BYTES + 200];
        int cfg_r = all[r].config != all[0].config || all[r].config_bytes != all[0].config_bytes;
        config_differs |= cfg_r;
        for (int c = 1; c < 4; c++) {
            difference(all, NULL, r, c, buf, sizeof buf);
            differs |= buf[0] != 0;
        }
        differs |= cfg_r;
    }
    diffs = strata_xcalloc((size_t)world, DIFF_BYTES);
    if (config_differs) {
        /* rank 0's config to every rank, each rank's differing keys back to every rank */
        first = strata_xmalloc(sizeof *first);
        if (rank == 0) *first = *cfg;
        char line[DIFF_BYTES] = "";
        if (strata_mpi_bcast(first, sizeof *first, 0)) goto out;
        if (mine.config_bytes == all[0].config_bytes && mine.config != all[0].config &&
            strata_config_diff(first, cfg, per_rank_keys, line, sizeof line) == 0)
            snprintf(line, sizeof line, "the same values, other digests"); /* cannot happen: the digest reads them */
        if (strata_mpi_allgather(line, diffs, DIFF_BYTES)) goto out;
    }
    if (differs && rank == 0) report(all, diffs, world);
    rc = differs;
    if (differs && strata_ranks_spoken()) rc = -1;
out:
    free(first);
    free(diffs);
    free(all);
    return rc;
}
