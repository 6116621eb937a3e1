/* io/checkpoint_write.c: writing a checkpoint crash-safely (io/checkpoint.h describes the
 * directory): every rank's data file and index into step_N.tmp/, then rank 0's manifest,
 * the rename into place and `latest`.
 *
 * YAML files are emitted with printf into a memory buffer and written in one go. Tensor
 * data is raw fp32, one file per rank, cut into segments at tensor boundaries; every
 * segment's CRC-32C goes into the rank's index. */
#include "io/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "io/checkpoint_format.h"
#include "io/checkpoint_prune.h"
#include "io/files.h"
#include "io/text.h"
#include "io/yaml.h"

/* ---- every rank: its data file and its index ---- */

int strata_ckpt_tmp_dir(char *out, size_t outlen, const char *run_dir, int64_t step) {
    if (step < 0) return strata_fail("checkpoint step %lld is negative", (long long)step);
    if (strata_ckpt_fmt_path(out, outlen, "%s/ckpt/step_%08lld.tmp", run_dir, (long long)step) != 0) return -1;
    return strata_mkdir_p(out);
}

/* The part of unit u's padded buffer that rank r of `world` holds: [*a, *b), clipped to
 * the real elements (empty when the rank's shard is all padding). */
static void rank_range(const strata_param_layout *L, int u, int rank, int world, size_t *a, size_t *b) {
    size_t S = L->unit_padded[u] / (size_t)world;
    size_t lo = (size_t)rank * S, hi = lo + S;
    if (hi > L->unit_numel[u]) hi = L->unit_numel[u];
    if (lo > hi) lo = hi;
    *a = lo;
    *b = hi;
}

/* The bytes this rank's data file will hold, after checking that every unit's padded
 * size divides by world and that a shard was given for every (unit, kind) part the rank
 * holds (bin names the file in messages). */
static int rank_bin_bytes(const strata_param_layout *L, int rank, int world,
                          const float *const (*shards)[STRATA_CKPT_KINDS], const char *bin, uint64_t *total) {
    *total = 0;
    for (int u = 0; u < L->n_units; u++) {
        if (L->unit_padded[u] % (size_t)world != 0)
            return strata_fail("checkpoint layout: unit %d: padded size %zu is not a multiple of world size %d", u,
                               L->unit_padded[u], world);
        size_t a, b;
        rank_range(L, u, rank, world, &a, &b);
        for (int k = 0; k < STRATA_CKPT_KINDS; k++) {
            if (b > a && !shards[u][k])
                return strata_fail("%s: unit %d (%s): no shard given for this rank's %zu elements", bin, u,
                                   strata_ckpt_kind_name[k], b - a);
            *total += (uint64_t)(b - a) * sizeof(float);
        }
    }
    return 0;
}

/* The index's comment and header keys, up to "segments:". */
static void index_header(strata_sbuf *ix, int rank, int world, uint64_t total) {
    strata_sbuf_printf(ix, "# Strata checkpoint rank index: the segments of rank%05d.bin (fp32) in file order;\n"
                   "# lo/hi are element offsets in the unit's flat buffer.\n", rank);
    /* A rank whose shards are all padding holds nothing: an empty list, not a null. */
    strata_sbuf_printf(ix, "format: %s\nrank: %d\nworld: %d\ndtype: float32\nbin_bytes: %llu\nsegments:%s\n", CKPT_FORMAT,
              rank, world, (unsigned long long)total, total ? "" : " []");
}

/* The index lines of elements [a, b) of unit u, kind k (src holds them; they start at
 * byte `offset` of the data file): one segment per tensor the part touches, each with its
 * CRC-32C. order and first are strata_ckpt_layout_index's. */
static int index_part(strata_sbuf *ix, const strata_param_layout *L, const int *order, const int *first, int u,
                      int k, size_t a, size_t b, const float *src, uint64_t offset) {
    for (int j = first[u]; j < first[u + 1]; j++) {
        const strata_param_tensor *t = &L->tensors[order[j]];
        size_t lo = t->offset > a ? t->offset : a;
        size_t hi = t->offset + t->numel < b ? t->offset + t->numel : b;
        if (lo >= hi) continue;
        uint32_t crc = strata_crc32c(0, src + (lo - a), (hi - lo) * sizeof(float));
        strata_sbuf_printf(ix, "  - {kind: %s, tensor: ", strata_ckpt_kind_name[k]);
        if (strata_yaml_quoted(ix, t->name, strlen(t->name), "a tensor name")) return -1;
        strata_sbuf_printf(ix, ", unit: %d, lo: %zu, hi: %zu, offset: %llu, crc32c: 0x%08x}\n", u, lo, hi,
                  (unsigned long long)(offset + (lo - a) * sizeof(float)), crc);
    }
    return 0;
}

/* The rank's data, unit by unit and kind by kind, into fd (the file bin), and the index
 * lines that describe it into ix. */
static int write_rank_data(int fd, const char *bin, strata_sbuf *ix, const strata_param_layout *L, const int *order,
                           const int *first, int rank, int world, const float *const (*shards)[STRATA_CKPT_KINDS]) {
    uint64_t offset = 0;
    for (int u = 0; u < L->n_units; u++) {
        size_t a, b;
        rank_range(L, u, rank, world, &a, &b);
        if (a == b) continue;
        for (int k = 0; k < STRATA_CKPT_KINDS; k++) {
            const float *src = shards[u][k];
            /* The rank's part of one (unit, kind) is contiguous: one large write. */
            if (strata_write_all(fd, src, (b - a) * sizeof(float), bin) != 0) return -1;
            if (index_part(ix, L, order, first, u, k, a, b, src, offset) != 0) return -1;
            offset += (b - a) * sizeof(float);
        }
    }
    return 0;
}

/* fsync, then close, both checked: the data is durable only once both succeed. fd is
 * closed either way. */
static int sync_close(int fd, const char *path) {
    if (fsync(fd) != 0) {
        int e = errno;
        (void)close(fd); /* failing already: the .tmp directory will not be committed */
        return strata_fail("%s: fsync failed: %s", path, strerror(e));
    }
    if (close(fd) != 0) return strata_fail("%s: close failed: %s", path, strerror(errno));
    return 0;
}

int strata_ckpt_write_rank(const char *tmp_dir, const strata_param_layout *L, int rank, int world,
                           const float *const (*shards)[STRATA_CKPT_KINDS]) {
    if (world < 1 || rank < 0 || rank >= world)
        return strata_fail("checkpoint %s: rank %d of world %d is out of range", tmp_dir, rank, world);
    int *order, *first;
    if (strata_ckpt_layout_index(L, "checkpoint layout", &order, &first) != 0) return -1;
    char bin[CKPT_PATH_MAX], idx[CKPT_PATH_MAX];
    int fd = -1, rc = -1;
    strata_sbuf ix = {0};
    uint64_t total;
    if (strata_ckpt_fmt_path(bin, sizeof bin, "%s/rank%05d.bin", tmp_dir, rank) != 0 ||
        strata_ckpt_fmt_path(idx, sizeof idx, "%s/rank%05d.yaml", tmp_dir, rank) != 0 ||
        rank_bin_bytes(L, rank, world, shards, bin, &total) != 0)
        goto out;
    index_header(&ix, rank, world, total);
    fd = open(bin, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        strata_fail("%s: cannot create: %s", bin, strerror(errno));
        goto out;
    }
    if (write_rank_data(fd, bin, &ix, L, order, first, rank, world, shards) != 0) goto out;
    int cfd = fd;
    fd = -1;
    if (sync_close(cfd, bin) != 0) goto out;
    if (strata_write_file_synced(idx, ix.p, ix.len) != 0) goto out;
    if (strata_fsync_dir(tmp_dir) != 0) goto out;
    rc = 0;
out:
    if (fd >= 0) (void)close(fd); /* failing already: the .tmp directory will not be committed */
    free(ix.p);
    free(order);
    free(first);
    return rc;
}

/* ---- rank 0: the manifest, the rename, `latest` ---- */

/* Leftovers of an earlier, killed attempt at the same step in tmp_dir (rank files of a
 * larger world, a half-written manifest) must not become part of this checkpoint. */
static int clean_tmp_dir(const char *tmp_dir, int world) {
    DIR *d = opendir(tmp_dir);
    if (!d) return strata_fail("%s: cannot list: %s", tmp_dir, strerror(errno));
    struct dirent *e;
    int rc = 0;
    while ((e = readdir(d)) != NULL) {
        const char *nm = e->d_name;
        int stale = !strcmp(nm, "manifest.yaml") || !strcmp(nm, "manifest.yaml.tmp");
        /* rankNNNNN.bin / rankNNNNN.yaml of a rank this world does not have */
        if (!strncmp(nm, "rank", 4) && strspn(nm + 4, "0123456789") == 5 &&
            (!strcmp(nm + 9, ".bin") || !strcmp(nm + 9, ".yaml")))
            stale = atoi(nm + 4) >= world;
        if (!stale) continue;
        char p[CKPT_PATH_MAX];
        if (strata_ckpt_fmt_path(p, sizeof p, "%s/%s", tmp_dir, nm) != 0 || (unlink(p) != 0 && errno != ENOENT)) {
            rc = strata_fail("%s: cannot remove a stale file: %s", p, strerror(errno));
            break;
        }
    }
    (void)closedir(d); /* a directory stream: nothing to lose */
    return rc;
}

/* manifest.yaml's body: everything after its checksum line. */
static int build_manifest(strata_sbuf *b, const strata_param_layout *L, const strata_ckpt_meta *meta) {
    strata_sbuf_printf(b, "# Strata checkpoint manifest. Tensor data: rankNNNNN.bin (fp32), indexed by rankNNNNN.yaml;\n"
                 "# each rank file holds its standard shard [r*S, (r+1)*S) of every unit, S = padded/world.\n");
    strata_sbuf_printf(b, "format: %s\nstep: %lld\nworld: %d\nstage: %d\nseed: %llu\nrng_state: 0x%016llx\n", CKPT_FORMAT,
              (long long)meta->step, meta->world, meta->stage, (unsigned long long)meta->seed,
              (unsigned long long)meta->rng_state);
    /* 17 significant digits read back to the same double. */
    strata_sbuf_printf(b, "tokens_seen: %.17g\nlast_loss: %.17g\ndtype: float32\nunits:\n", meta->tokens_seen,
              meta->last_loss);
    for (int u = 0; u < L->n_units; u++)
        strata_sbuf_printf(b, "  - {numel: %zu, padded: %zu}\n", L->unit_numel[u], L->unit_padded[u]);
    strata_sbuf_printf(b, "tensors:\n");
    for (int i = 0; i < L->n_tensors; i++) {
        const strata_param_tensor *t = &L->tensors[i];
        size_t n = strlen(t->name);
        strata_sbuf_printf(b, "  - {name: ");
        if (strata_yaml_quoted(b, t->name, n, "a tensor name")) return -1;
        strata_sbuf_printf(b, ", unit: %d, offset: %zu, numel: %zu, shape: [", t->unit, t->offset, t->numel);
        for (int d = 0; d < t->ndim; d++) strata_sbuf_printf(b, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
        strata_sbuf_printf(b, "], dtype: float32}\n");
    }
    /* Last, so a literal block's trailing blank lines are plainly its own. */
    return strata_yaml_text_value(b, "config", meta->config_yaml ? meta->config_yaml : "", "checkpoint config text");
}

/* Puts tmp_dir at final_dir. A re-save of the same step swaps the directories atomically
 * (RENAME_EXCHANGE) so the step never disappears; where the file system cannot swap,
 * the old one is moved aside first. */
static int install_dir(const char *ckpt_dir, const char *tmp_dir, const char *final_dir) {
    if (rename(tmp_dir, final_dir) == 0) return 0;
    if (errno != ENOTEMPTY && errno != EEXIST)
        return strata_fail("%s: cannot rename to %s: %s", tmp_dir, final_dir, strerror(errno));
    if (renameat2(AT_FDCWD, tmp_dir, AT_FDCWD, final_dir, RENAME_EXCHANGE) == 0) {
        if (strata_fsync_dir(ckpt_dir) != 0) return -1;
        return strata_rm_tree(tmp_dir); /* now holds the replaced checkpoint */
    }
    char old[CKPT_PATH_MAX];
    if (strata_ckpt_fmt_path(old, sizeof old, "%s.old", final_dir) != 0 || strata_rm_tree(old) != 0) return -1;
    if (rename(final_dir, old) != 0)
        return strata_fail("%s: cannot move aside to %s: %s", final_dir, old, strerror(errno));
    if (rename(tmp_dir, final_dir) != 0)
        return strata_fail("%s: cannot rename to %s: %s", tmp_dir, final_dir, strerror(errno));
    if (strata_fsync_dir(ckpt_dir) != 0) return -1;
    return strata_rm_tree(old);
}

/* manifest.yaml into tmp_dir: the CRC-32C line, then the body it checks, written and
 * fsynced as mtmp, renamed to mpath, and the directory fsynced. */
static int write_manifest(const char *tmp_dir, const char *mtmp, const char *mpath, const strata_param_layout *L,
                          const strata_ckpt_meta *meta) {
    strata_sbuf body = {0}, m = {0};
    int rc = build_manifest(&body, L, meta);
    if (rc == 0) { /* the first line checks every byte after it */
        strata_sbuf_printf(&m, "%s0x%08x\n", MANIFEST_CRC_PREFIX, strata_crc32c(0, body.p, body.len));
        strata_sbuf_putn(&m, body.p, body.len);
        rc = strata_write_file_synced(mtmp, m.p, m.len);
    }
    free(body.p);
    free(m.p);
    if (rc != 0) return -1;
    if (rename(mtmp, mpath) != 0) return strata_fail("%s: cannot rename to %s: %s", mtmp, mpath, strerror(errno));
    return strata_fsync_dir(tmp_dir);
}

int strata_ckpt_commit(const char *run_dir, const char *tmp_dir, const strata_param_layout *L,
                       const strata_ckpt_meta *meta, int keep, char *final_dir, size_t final_len) {
    if (!meta || meta->step < 0 || meta->world < 1)
        return strata_fail("checkpoint %s: invalid step %lld / world %d", tmp_dir, meta ? (long long)meta->step : -1LL,
                           meta ? meta->world : 0);
    int *order, *first;
    if (strata_ckpt_layout_index(L, "checkpoint layout", &order, &first) != 0) return -1;
    free(order);
    free(first);
    char ckpt_dir[CKPT_PATH_MAX], final[CKPT_PATH_MAX], name[64], mtmp[CKPT_PATH_MAX], mpath[CKPT_PATH_MAX];
    char latest[CKPT_PATH_MAX];
    snprintf(name, sizeof name, "step_%08lld", (long long)meta->step);
    if (strata_ckpt_fmt_path(ckpt_dir, sizeof ckpt_dir, "%s/ckpt", run_dir) != 0 ||
        strata_ckpt_fmt_path(final, sizeof final, "%s/%s", ckpt_dir, name) != 0 ||
        strata_ckpt_fmt_path(mtmp, sizeof mtmp, "%s/manifest.yaml.tmp", tmp_dir) != 0 ||
        strata_ckpt_fmt_path(mpath, sizeof mpath, "%s/manifest.yaml", tmp_dir) != 0 ||
        strata_ckpt_fmt_path(latest, sizeof latest, "%s/latest", ckpt_dir) != 0)
        return -1;
    if (!strata_is_dir(tmp_dir)) return strata_fail("%s: no such directory (nothing was written to commit)", tmp_dir);
    if (clean_tmp_dir(tmp_dir, meta->world) != 0) return -1;

    if (write_manifest(tmp_dir, mtmp, mpath, L, meta) != 0) return -1;

    /* Never publish a checkpoint that would not load: every rank's files present, sizes
     * as promised, every element covered once. */
    strata_ckpt *ck = strata_ckpt_open(tmp_dir);
    if (!ck) return strata_fail_wrap("refusing to commit %s", tmp_dir);
    strata_ckpt_close(ck);

    if (install_dir(ckpt_dir, tmp_dir, final) != 0) return -1;
    if (strata_fsync_dir(ckpt_dir) != 0) return -1;

    char text[80];
    int n = snprintf(text, sizeof text, "%s\n", name);
    if (strata_write_file_atomic(latest, text, (size_t)n) != 0) return -1; /* via latest.tmp */

    strata_ckpt_prune(ckpt_dir, name, keep);
    if (final_dir && final_len > 0 && strata_ckpt_fmt_path(final_dir, final_len, "%s", final) != 0) return -1;
    STRATA_DEBUG("ckpt", "committed %s", final);
    return 0;
}
