/* io/checkpoint_write.c: writing a checkpoint crash-safely (io/checkpoint.h describes the
 * directory): every rank's data file and index into step_N.tmp/, then rank 0's manifest,
 * the rename into place and `latest`.
 *
 * YAML files are emitted with printf into a memory buffer and written in one go. Tensor
 * data is raw fp32 (moments as optim.state stores them), one file per rank, cut into
 * segments at tensor boundaries, written as the caller feeds it (strata_ckpt_writer); every
 * segment's CRC-32C, computed as its bytes pass, goes into the rank's index. */
#include "io/checkpoint.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/common.h"
#include "core/quant.h"
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

void strata_ckpt_rank_range(const strata_param_layout *L, int u, int rank, int world, size_t *lo, size_t *hi) {
    size_t S = L->unit_padded[u] / (size_t)world;
    size_t a = (size_t)rank * S, b = a + S;
    if (b > L->unit_numel[u]) b = L->unit_numel[u];
    if (a > b) a = b;
    *lo = a;
    *hi = b;
}

/* The index's comment and header keys, up to "segments:". fp32 state: format 1, as
 * always; other state: format 2 with its optim_state. */
static void index_header(strata_sbuf *ix, int rank, int world, uint64_t total, strata_optim_state state) {
    if (state == STRATA_OPTIM_STATE_FP32) {
        strata_sbuf_printf(ix, "# Strata checkpoint rank index: the segments of rank%05d.bin (fp32) in file order;\n"
                       "# lo/hi are element offsets in the unit's flat buffer.\n", rank);
        /* A rank whose shards are all padding holds nothing: an empty list, not a null. */
        strata_sbuf_printf(ix, "format: %s\nrank: %d\nworld: %d\ndtype: float32\nbin_bytes: %llu\nsegments:%s\n",
                           CKPT_FORMAT, rank, world, (unsigned long long)total, total ? "" : " []");
        return;
    }
    strata_sbuf_printf(ix, "# Strata checkpoint rank index: the segments of rank%05d.bin in file order (param fp32,\n"
                   "# m and v in their dtype); lo/hi are element offsets in the unit's flat buffer (blocks of\n"
                   "# 2048 elements for m_absmax and v_absmax).\n", rank);
    strata_sbuf_printf(ix, "format: %s\nrank: %d\nworld: %d\ndtype: float32\noptim_state: %s\nbin_bytes: %llu\nsegments:%s\n",
                       CKPT_FORMAT_2, rank, world, strata_optim_state_name(state), (unsigned long long)total,
                       total ? "" : " []");
}

/* The writer sits in one part (unit u, kind k: elements [a, b) of the unit, in file
 * order; blocks for the absmax kinds) at element pos, inside the segment of tensor order[j]
 * (a part is cut at tensor boundaries; an absmax part is one segment), whose CRC-32C so far
 * is crc and whose first byte is at file offset seg_offset. [ea, eb) are the unit's
 * elements this rank writes. u == L->n_units: every part was fed. */
struct strata_ckpt_writer {
    const strata_param_layout *L;
    int rank, world;
    strata_optim_state state;
    int kinds; /* strata_ckpt_kinds(state) */
    size_t ea, eb;
    int *order, *first; /* strata_ckpt_layout_index's */
    char dir[CKPT_PATH_MAX], bin[CKPT_PATH_MAX], idx[CKPT_PATH_MAX];
    int fd;
    strata_sbuf ix; /* the index so far */
    int u, k;
    size_t a, b, pos;
    int j;
    uint32_t crc;
    uint64_t offset, seg_offset; /* bytes written; where the segment being fed starts */
};

static int is_absmax(int kind) { return kind == STRATA_CKPT_M_ABSMAX || kind == STRATA_CKPT_V_ABSMAX; }

/* Moves j to the first tensor of the part, from j on, with elements at or after pos, and
 * starts its segment there (CRC 0, at the current file offset). */
static void skip_to_segment(strata_ckpt_writer *w) {
    const strata_param_layout *L = w->L;
    while (!is_absmax(w->k) && w->j < w->first[w->u + 1]) {
        const strata_param_tensor *t = &L->tensors[w->order[w->j]];
        if (t->offset + t->numel > w->pos) break;
        w->j++;
    }
    w->crc = 0;
    w->seg_offset = w->offset;
}

/* On to the next part with elements: the next kind of this unit, else the next unit
 * whose range is not empty. */
static void next_part(strata_ckpt_writer *w) {
    const strata_param_layout *L = w->L;
    if (++w->k == w->kinds) {
        w->k = 0;
        for (w->u++; w->u < L->n_units; w->u++) {
            strata_ckpt_rank_range(L, w->u, w->rank, w->world, &w->ea, &w->eb);
            if (w->eb > w->ea) break;
        }
    }
    if (w->u == L->n_units) return;
    w->a = w->ea, w->b = w->eb;
    if (is_absmax(w->k)) { /* the blocks of the elements; ea is a block boundary (writer_open checked) */
        w->a = w->ea / STRATA_Q8_BLOCK;
        w->b = strata_ckpt_unit_blocks(w->eb);
    }
    w->pos = w->a;
    w->j = w->first[w->u];
    skip_to_segment(w);
}

/* The index line of the segment that ends at pos: tensor order[j]'s elements in the part
 * (m and v with their dtype in format 2), or an absmax part's blocks. */
static int index_segment(strata_ckpt_writer *w) {
    if (is_absmax(w->k)) {
        strata_sbuf_printf(&w->ix, "  - {kind: %s, unit: %d, lo: %zu, hi: %zu, offset: %llu, crc32c: 0x%08x}\n",
                           strata_ckpt_kind_name[w->k], w->u, w->a, w->pos, (unsigned long long)w->seg_offset, w->crc);
        return 0;
    }
    const strata_param_tensor *t = &w->L->tensors[w->order[w->j]];
    size_t lo = t->offset > w->a ? t->offset : w->a;
    strata_sbuf_printf(&w->ix, "  - {kind: %s, tensor: ", strata_ckpt_kind_name[w->k]);
    if (strata_yaml_quoted(&w->ix, t->name, strlen(t->name), "a tensor name")) return -1;
    if (w->state != STRATA_OPTIM_STATE_FP32 && (w->k == STRATA_CKPT_M || w->k == STRATA_CKPT_V))
        strata_sbuf_printf(&w->ix, ", dtype: %s", strata_ckpt_moment_dtype(w->state, w->k, t));
    strata_sbuf_printf(&w->ix, ", unit: %d, lo: %zu, hi: %zu, offset: %llu, crc32c: 0x%08x}\n", w->u, lo, w->pos,
                       (unsigned long long)w->seg_offset, w->crc);
    return 0;
}

static void writer_free(strata_ckpt_writer *w) {
    if (w->fd >= 0) (void)close(w->fd); /* failing already: the .tmp directory will not be committed */
    free(w->ix.p);
    free(w->order);
    free(w->first);
    free(w);
}

void strata_ckpt_writer_abort(strata_ckpt_writer *w) {
    if (w) writer_free(w);
}

/* Bytes rank `rank` writes of unit u: each kind's elements of its range, as stored. */
static uint64_t unit_bytes(const strata_ckpt_writer *w, int u, size_t a, size_t b) {
    const strata_param_layout *L = w->L;
    uint64_t total = 0;
    for (int k = 0; k < w->kinds; k++) {
        if (is_absmax(k)) {
            total += (uint64_t)(strata_ckpt_unit_blocks(b) - a / STRATA_Q8_BLOCK) * sizeof(float);
            continue;
        }
        for (int i = w->first[u]; i < w->first[u + 1]; i++) {
            const strata_param_tensor *t = &L->tensors[w->order[i]];
            size_t lo = t->offset > a ? t->offset : a, hi = t->offset + t->numel < b ? t->offset + t->numel : b;
            if (lo < hi) total += (uint64_t)(hi - lo) * strata_ckpt_elem_bytes(w->state, k, t);
        }
    }
    return total;
}

strata_ckpt_writer *strata_ckpt_writer_open(const char *tmp_dir, const strata_param_layout *L, int rank, int world) {
    return strata_ckpt_writer_open_state(tmp_dir, L, rank, world, STRATA_OPTIM_STATE_FP32);
}

strata_ckpt_writer *strata_ckpt_writer_open_state(const char *tmp_dir, const strata_param_layout *L, int rank, int world,
                                                  strata_optim_state state) {
    if (world < 1 || rank < 0 || rank >= world) {
        strata_fail("checkpoint %s: rank %d of world %d is out of range", tmp_dir, rank, world);
        return NULL;
    }
    strata_ckpt_writer *w = strata_xcalloc(1, sizeof *w);
    w->fd = -1;
    w->L = L;
    w->rank = rank;
    w->world = world;
    w->state = state;
    w->kinds = strata_ckpt_kinds(state);
    if (strata_ckpt_layout_index(L, "checkpoint layout", &w->order, &w->first) != 0 ||
        strata_ckpt_fmt_path(w->dir, sizeof w->dir, "%s", tmp_dir) != 0 ||
        strata_ckpt_fmt_path(w->bin, sizeof w->bin, "%s/rank%05d.bin", tmp_dir, rank) != 0 ||
        strata_ckpt_fmt_path(w->idx, sizeof w->idx, "%s/rank%05d.yaml", tmp_dir, rank) != 0)
        goto fail;
    uint64_t total = 0;
    size_t align = state == STRATA_OPTIM_STATE_INT8 ? (size_t)world * STRATA_Q8_BLOCK : (size_t)world;
    for (int u = 0; u < L->n_units; u++) {
        if (L->unit_padded[u] % align != 0) {
            strata_fail("checkpoint layout: unit %d: padded size %zu is not a multiple of %s%d", u, L->unit_padded[u],
                        state == STRATA_OPTIM_STATE_INT8 ? "2048 x world size " : "world size ", world);
            goto fail;
        }
        size_t a, b;
        strata_ckpt_rank_range(L, u, rank, world, &a, &b);
        if (b > a) total += unit_bytes(w, u, a, b);
    }
    index_header(&w->ix, rank, world, total, state);
    w->fd = open(w->bin, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (w->fd < 0) {
        strata_fail("%s: cannot create: %s", w->bin, strerror(errno));
        goto fail;
    }
    w->u = -1; /* before the first part: next_part finds it */
    w->k = w->kinds - 1;
    next_part(w);
    return w;
fail:
    writer_free(w);
    return NULL;
}

int strata_ckpt_writer_put(strata_ckpt_writer *w, int u, int kind, const void *src_, size_t n) {
    const char *src = src_;
    if (u != w->u || kind != w->k) {
        if (w->u == w->L->n_units)
            return strata_fail("%s: unit %d (%s) given after every part was written", w->bin, u,
                               kind >= 0 && kind < STRATA_CKPT_MAX_KINDS ? strata_ckpt_kind_name[kind] : "?");
        return strata_fail("%s: unit %d (%s) given where unit %d (%s) elements [%zu, %zu) come next", w->bin, u,
                           kind >= 0 && kind < STRATA_CKPT_MAX_KINDS ? strata_ckpt_kind_name[kind] : "?", w->u,
                           strata_ckpt_kind_name[w->k], w->pos, w->b);
    }
    if (n > w->b - w->pos)
        return strata_fail("%s: unit %d (%s): %zu elements given at element %zu, where the part ends at %zu", w->bin, u,
                           strata_ckpt_kind_name[kind], n, w->pos, w->b);
    while (n > 0) { /* the CRC of each segment the piece touches, as its bytes pass */
        size_t end = w->b, es = sizeof(float);
        if (!is_absmax(w->k)) {
            const strata_param_tensor *t = &w->L->tensors[w->order[w->j]];
            end = t->offset + t->numel < w->b ? t->offset + t->numel : w->b;
            es = strata_ckpt_elem_bytes(w->state, w->k, t);
        }
        size_t take = end - w->pos < n ? end - w->pos : n;
        if (strata_write_all(w->fd, src, take * es, w->bin) != 0) return -1;
        w->crc = strata_crc32c(w->crc, src, take * es);
        src += take * es;
        n -= take;
        w->pos += take;
        w->offset += take * es;
        if (w->pos == end) {
            if (index_segment(w) != 0) return -1;
            w->j++;
            skip_to_segment(w);
        }
    }
    if (w->pos == w->b) next_part(w);
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

int strata_ckpt_writer_close(strata_ckpt_writer *w) {
    int rc = -1;
    if (w->u != w->L->n_units) {
        strata_fail("%s: closed before unit %d (%s) elements [%zu, %zu) were written", w->bin, w->u,
                    strata_ckpt_kind_name[w->k], w->pos, w->b);
        goto out;
    }
    int fd = w->fd;
    w->fd = -1;
    if (sync_close(fd, w->bin) != 0) goto out;
    if (strata_write_file_synced(w->idx, w->ix.p, w->ix.len) != 0) goto out;
    if (strata_fsync_dir(w->dir) != 0) goto out;
    rc = 0;
out:
    writer_free(w);
    return rc;
}

int strata_ckpt_write_rank(const char *tmp_dir, const strata_param_layout *L, int rank, int world,
                           const float *const (*shards)[STRATA_CKPT_KINDS]) {
    strata_ckpt_writer *w = strata_ckpt_writer_open(tmp_dir, L, rank, world);
    if (!w) return -1;
    for (int u = 0; u < L->n_units; u++) {
        size_t a, b;
        strata_ckpt_rank_range(L, u, rank, world, &a, &b);
        if (a == b) continue;
        for (int k = 0; k < STRATA_CKPT_KINDS; k++) {
            if (!shards[u][k]) {
                strata_fail("%s/rank%05d.bin: unit %d (%s): no shard given for this rank's %zu elements", tmp_dir, rank,
                            u, strata_ckpt_kind_name[k], b - a);
                strata_ckpt_writer_abort(w);
                return -1;
            }
            if (strata_ckpt_writer_put(w, u, k, shards[u][k], b - a) != 0) {
                strata_ckpt_writer_abort(w);
                return -1;
            }
        }
    }
    return strata_ckpt_writer_close(w);
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

/* manifest.yaml's body: everything after its checksum line. fp32 state writes format 1
 * as always; other state format 2, with optim_state and each tensor's moments. */
static int build_manifest(strata_sbuf *b, const strata_param_layout *L, const strata_ckpt_meta *meta) {
    strata_optim_state st = meta->state;
    if (st == STRATA_OPTIM_STATE_FP32)
        strata_sbuf_printf(b, "# Strata checkpoint manifest. Tensor data: rankNNNNN.bin (fp32), indexed by rankNNNNN.yaml;\n"
                     "# each rank file holds its standard shard [r*S, (r+1)*S) of every unit, S = padded/world.\n");
    else
        strata_sbuf_printf(b, "# Strata checkpoint manifest. Tensor data: rankNNNNN.bin (fp32 master weights, Adam's moments\n"
                     "# as optim_state stores them), indexed by rankNNNNN.yaml; each rank file holds its standard\n"
                     "# shard [r*S, (r+1)*S) of every unit, S = padded/world.\n");
    strata_sbuf_printf(b, "format: %s\nstep: %lld\nworld: %d\nstage: %d\nseed: %llu\nrng_state: 0x%016llx\n",
              st == STRATA_OPTIM_STATE_FP32 ? CKPT_FORMAT : CKPT_FORMAT_2, (long long)meta->step, meta->world,
              meta->stage, (unsigned long long)meta->seed, (unsigned long long)meta->rng_state);
    /* 17 significant digits read back to the same double. */
    strata_sbuf_printf(b, "tokens_seen: %.17g\nlast_loss: %.17g\n", meta->tokens_seen, meta->last_loss);
    if (meta->validated) strata_sbuf_printf(b, "val_loss: %.17g\n", meta->val_loss);
    strata_sbuf_printf(b, "dtype: float32\n");
    if (st != STRATA_OPTIM_STATE_FP32) strata_sbuf_printf(b, "optim_state: %s\n", strata_optim_state_name(st));
    if (st == STRATA_OPTIM_STATE_INT8) strata_sbuf_printf(b, "optim_block: %d\n", STRATA_Q8_BLOCK);
    strata_sbuf_printf(b, "units:\n");
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
        if (st == STRATA_OPTIM_STATE_FP32) strata_sbuf_printf(b, "], dtype: float32}\n");
        else strata_sbuf_printf(b, "], dtype: float32, moments: %s}\n", strata_ckpt_tensor_moments(st, t));
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

/* `best` after step `name` is committed: it names this step when the step's val_loss is
 * finite and lower than the one `best` records (which may have been removed by retention
 * since: it still counts). A `best` of a later step than this one is of another history (a
 * resume from before it) and goes. *protect receives the name `best` holds afterwards ("":
 * none), for retention to keep. */
static int update_best(const char *ckpt_dir, const char *name, const strata_ckpt_meta *meta, char *protect,
                       size_t protect_len) {
    char path[CKPT_PATH_MAX], cur[256];
    double cur_val = NAN;
    protect[0] = 0;
    if (strata_ckpt_fmt_path(path, sizeof path, "%s/best", ckpt_dir) != 0) return -1;
    int have = strata_ckpt_best(ckpt_dir, cur, sizeof cur, &cur_val);
    if (have < 0) STRATA_WARN("ckpt", "%s; it is written anew", strata_error());
    if (have > 0 && strtoll(cur + 5, NULL, 10) > meta->step) { /* "step_N" (strata_ckpt_best checked) */
        if (unlink(path) != 0 && errno != ENOENT) return strata_fail("%s: cannot remove: %s", path, strerror(errno));
        have = 0;
    }
    if (!meta->validated || !isfinite(meta->val_loss) || (have > 0 && strcmp(cur, name) && !(meta->val_loss < cur_val))) {
        if (have > 0) snprintf(protect, protect_len, "%s", cur);
        return 0;
    }
    char text[320];
    int n = snprintf(text, sizeof text, "%s\nval_loss: %.17g\n", name, meta->val_loss);
    if (strata_write_file_atomic(path, text, (size_t)n) != 0) return -1; /* via best.tmp */
    snprintf(protect, protect_len, "%s", name);
    return 0;
}

int strata_ckpt_commit(const char *run_dir, const char *tmp_dir, const strata_param_layout *L,
                       const strata_ckpt_meta *meta, int keep, int keep_best, char *final_dir, size_t final_len) {
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

    char protect[256];
    if (update_best(ckpt_dir, name, meta, protect, sizeof protect) != 0) return -1;
    strata_ckpt_prune(ckpt_dir, name, keep, keep_best ? protect : "");
    if (final_dir && final_len > 0 && strata_ckpt_fmt_path(final_dir, final_len, "%s", final) != 0) return -1;
    STRATA_DEBUG("ckpt", "committed %s", final);
    return 0;
}
