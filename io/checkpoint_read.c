/* io/checkpoint_read.c: opening a checkpoint and reading it back at any world size
 * (io/checkpoint.h describes the directory): which checkpoint a name means, the manifest
 * and rank indices parsed and validated (libyaml's document API; every key known, every
 * element covered once, every file the size its index promises), and range reads that
 * visit whichever rank files hold the range, checking each segment's CRC-32C the first
 * time it is touched. */
#include "io/checkpoint.h"

#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include "core/common.h"
#include "core/quant.h"
#include "io/checkpoint_format.h"
#include "io/files.h"
#include "io/yaml.h"

/* Per-rank state is allocated for the manifest's world before any rank file is opened:
 * bound it, so a hostile manifest cannot ask for gigabytes. */
#define CKPT_MAX_WORLD (1 << 20)

/* ---- resolving what to load ---- */

/* The checkpoint `latest` names in ckpt_dir (a run's ckpt/); if that file is missing or
 * names something incomplete, the newest complete step directory. */
static int resolve_latest(const char *ckpt_dir, char *out, size_t outlen) {
    char latest[CKPT_PATH_MAX];
    if (strata_ckpt_fmt_path(latest, sizeof latest, "%s/latest", ckpt_dir) != 0) return -1;
    if (!strata_is_dir(ckpt_dir)) return strata_fail("no checkpoint in %s (no such directory)", ckpt_dir);
    FILE *f = fopen(latest, "r");
    if (f) {
        char name[256] = {0};
        size_t n = fread(name, 1, sizeof name - 1, f);
        (void)fclose(f); /* read-only: nothing to lose */
        name[n] = 0;
        while (n > 0 && (name[n - 1] == '\n' || name[n - 1] == '\r' || name[n - 1] == ' ')) name[--n] = 0;
        char dir[CKPT_PATH_MAX], man[CKPT_PATH_MAX];
        /* Only a plain directory name inside ckpt/ is trusted. */
        if (n > 0 && !strchr(name, '/') && strcmp(name, ".") && strcmp(name, "..") &&
            strata_ckpt_fmt_path(dir, sizeof dir, "%s/%s", ckpt_dir, name) == 0 &&
            strata_ckpt_fmt_path(man, sizeof man, "%s/manifest.yaml", dir) == 0 && strata_is_file(man))
            return strata_ckpt_fmt_path(out, outlen, "%s", dir);
        STRATA_WARN("ckpt", "%s names '%s', which is not a complete checkpoint; using the newest complete one",
                    latest, name);
    } else if (errno != ENOENT) {
        STRATA_WARN("ckpt", "%s: cannot read (%s); using the newest complete checkpoint", latest, strerror(errno));
    }
    strata_ckpt_step *v;
    int n;
    if (strata_ckpt_list_steps(ckpt_dir, "", &v, &n) != 0) return -1;
    int found = -1;
    for (int i = 0; i < n && found < 0; i++)
        if (v[i].complete) found = i;
    int rc = found < 0 ? strata_fail("no checkpoint in %s", ckpt_dir)
                       : strata_ckpt_fmt_path(out, outlen, "%s/%s", ckpt_dir, v[found].name);
    free(v);
    return rc;
}

int strata_ckpt_best(const char *ckpt_dir, char *name, size_t name_len, double *val_loss) {
    char path[CKPT_PATH_MAX], text[400];
    if (strata_ckpt_fmt_path(path, sizeof path, "%s/best", ckpt_dir) != 0) return -1;
    FILE *f = fopen(path, "r");
    if (!f) return errno == ENOENT ? 0 : strata_fail("%s: cannot read: %s", path, strerror(errno));
    size_t n = fread(text, 1, sizeof text - 1, f);
    (void)fclose(f); /* read-only */
    text[n] = 0;
    char step[64];
    long long k = -1;
    int used = 0;
    /* "step_N\nval_loss: X\n", N a plain number: a name inside ckpt/ and nothing else */
    if (sscanf(text, "%63[^\n]\nval_loss: %lf\n%n", step, val_loss, &used) != 2 || (size_t)used != n ||
        sscanf(step, "step_%lld", &k) != 1 || k < 0 || strspn(step + 5, "0123456789") != strlen(step + 5) ||
        strlen(step) >= name_len)
        return strata_fail("%s: not what a run writes there (\"step_N\", then \"val_loss: X\")", path);
    snprintf(name, name_len, "%s", step);
    return 1;
}

/* The checkpoint ckpt_dir/best names, when it is still there. */
static int resolve_best(const char *ckpt_dir, char *out, size_t outlen) {
    char name[256], man[CKPT_PATH_MAX];
    double val = NAN;
    int have = strata_ckpt_best(ckpt_dir, name, sizeof name, &val);
    if (have < 0) return -1;
    if (!have)
        return strata_fail("%s/best: none yet (a checkpoint becomes the best when its step validated: run.checkpoint_every "
                           "a multiple of train.eval_every, or the last step)", ckpt_dir);
    if (strata_ckpt_fmt_path(out, outlen, "%s/%s", ckpt_dir, name) != 0 ||
        strata_ckpt_fmt_path(man, sizeof man, "%s/manifest.yaml", out) != 0)
        return -1;
    if (!strata_is_file(man))
        return strata_fail("%s/best names %s (validation loss %.6g), which run.keep has removed since: run.keep_best: true "
                           "keeps it", ckpt_dir, name, val);
    return 0;
}

int strata_ckpt_resolve(const char *what, const char *run_dir, char *out, size_t outlen) {
    if (!what || !*what) return strata_fail("no checkpoint named (expected 'latest', a run or a checkpoint directory)");
    char p[CKPT_PATH_MAX];
    if (!strcmp(what, "latest") || !strcmp(what, "best")) {
        if (!run_dir || !*run_dir) return strata_fail("checkpoint '%s': no run directory given to look in", what);
        if (strata_ckpt_fmt_path(p, sizeof p, "%s/ckpt", run_dir) != 0) return -1;
        return what[0] == 'l' ? resolve_latest(p, out, outlen) : resolve_best(p, out, outlen);
    }
    /* a run's ckpt/latest or ckpt/best file: the checkpoint it names */
    const char *base = strrchr(what, '/');
    base = base ? base + 1 : what;
    if ((!strcmp(base, "latest") || !strcmp(base, "best")) && strata_is_file(what)) {
        if (base == what) snprintf(p, sizeof p, ".");
        else if (strata_ckpt_fmt_path(p, sizeof p, "%.*s", (int)(base - what - 1), what) != 0) return -1;
        return base[0] == 'l' ? resolve_latest(p, out, outlen) : resolve_best(p, out, outlen);
    }
    if (strata_ckpt_fmt_path(p, sizeof p, "%s/manifest.yaml", what) != 0) return -1;
    if (strata_is_file(p)) return strata_ckpt_fmt_path(out, outlen, "%s", what);
    if (strata_ckpt_fmt_path(p, sizeof p, "%s/ckpt", what) != 0) return -1;
    if (strata_is_dir(p)) return resolve_latest(p, out, outlen);
    /* A bare step name ("step_00000120") inside the run's ckpt/. */
    if (run_dir && *run_dir && !strchr(what, '/')) {
        char q[CKPT_PATH_MAX];
        if (strata_ckpt_fmt_path(p, sizeof p, "%s/ckpt/%s", run_dir, what) != 0 ||
            strata_ckpt_fmt_path(q, sizeof q, "%s/manifest.yaml", p) != 0)
            return -1;
        if (strata_is_file(q)) return strata_ckpt_fmt_path(out, outlen, "%s", p);
    }
    struct stat st;
    if (stat(what, &st) != 0) return strata_fail("checkpoint %s: %s", what, strerror(errno));
    return strata_fail("%s: neither a checkpoint directory (no manifest.yaml) nor a run directory (no ckpt/)", what);
}

/* ---- reading: YAML documents (io/yaml.h) ---- */

/* Index files grow with tensors x ranks; 256 MiB is thousands of ranks of a large model. */
#define CKPT_YAML_MAX_BYTES ((size_t)256 << 20)
#define CKPT_FILE "a Strata checkpoint file"
/* why a key the version never writes is refused */
#define CKPT_EDITED "checkpoint files name no other files or keys; this one was edited"

/* An element count or offset: anything that, as floats, fits the address space. */
static int get_elements(strata_ydoc *d, yaml_node_t *map, const char *ctx, const char *key, size_t *out) {
    return strata_ydoc_size(d, map, ctx, key, SIZE_MAX / sizeof(float), out);
}

/* format: 1 or 2 into *version; a value other than those is named as such, not as a bad key. */
static int expect_format(strata_ydoc *d, yaml_node_t *root, int *version) {
    yaml_node_t *n = strata_ydoc_get(d, root, "", "format", YAML_SCALAR_NODE);
    if (!n) return -1;
    if (!strcmp(strata_ydoc_scalar(n), CKPT_FORMAT)) *version = 1;
    else if (!strcmp(strata_ydoc_scalar(n), CKPT_FORMAT_2)) *version = 2;
    else
        return strata_fail("%s: format '%s' is not %s or %s (written by another version of Strata?)", d->path,
                           strata_ydoc_scalar(n), CKPT_FORMAT, CKPT_FORMAT_2);
    return 0;
}

/* ---- reading: an opened checkpoint's state ---- */

typedef struct seg {
    int rank, kind, unit, tensor; /* tensor -1: an absmax segment */
    size_t lo, hi;   /* elements of the unit's flat buffer (blocks for the absmax kinds) */
    size_t es;       /* bytes a stored element */
    uint64_t offset; /* bytes into the rank's .bin */
    uint32_t crc;
    int verified; /* checksum already matched once */
} seg;

/* Partly-read segments are checked by streaming them through a scratch buffer of this
 * many bytes, so a read holds no more memory than its destination, whatever the size of
 * the tensors. */
#define CKPT_VERIFY_CHUNK_BYTES ((size_t)1 << 20)

/* read_range updates the verified flags and uses the scratch buffer, so one strata_ckpt
 * serves one thread at a time. */
struct strata_ckpt {
    char dir[CKPT_PATH_MAX - 32]; /* room for "/rankNNNNN.yaml" in CKPT_PATH_MAX */
    strata_ckpt_meta meta;
    char *config;
    strata_param_layout layout;
    size_t *unit_numel, *unit_padded;
    strata_param_tensor *tensors;
    int world;
    int version;              /* the format: 1, or 2 (optimizer state other than fp32) */
    int kinds;                /* strata_ckpt_kinds(meta.state) */
    int *fds;                 /* rank .bin files, open for pread */
    seg *segs;                /* sorted by (unit, kind, lo) */
    size_t n_segs, cap_segs;
    size_t *uk_first;         /* segments of (unit u, kind k): [uk_first[u*K+k], uk_first[u*K+k+1]), K = MAX_KINDS */
    int bad_manifest;         /* manifest.yaml was edited or corrupted (not the data) */
    float *scratch;           /* CKPT_VERIFY_CHUNK_BYTES, made at the first partial read */
};

static void bin_path(const strata_ckpt *ck, int rank, char *out, size_t len) {
    snprintf(out, len, "%s/rank%05d.bin", ck->dir, rank);
}

/* ---- reading: manifest.yaml ---- */

/* manifest.yaml's first line against every byte after it. A checksum line that does not
 * match, or that is not the first line, is an edit; no checksum line at all is an older
 * Strata's manifest, loaded with a warning. */
static int check_manifest_crc(const char *path, const char *text, size_t len) {
    size_t plen = strlen(MANIFEST_CRC_PREFIX);
    if (len >= plen && !memcmp(text, MANIFEST_CRC_PREFIX, plen)) {
        const char *nl = memchr(text, '\n', len);
        uint64_t want = 0;
        char hex[32] = {0};
        size_t hl = nl ? (size_t)(nl - text) - plen : 0;
        if (nl && hl < sizeof hex) memcpy(hex, text + plen, hl);
        if (!nl || hl >= sizeof hex || strata_parse_u64(hex, 16, &want) != 0 || want > UINT32_MAX)
            return strata_fail("%s: line 1: manifest_crc32c is not a 32-bit hex number: the manifest was edited or "
                               "corrupted; refusing it", path);
        size_t body = (size_t)(nl + 1 - text);
        uint32_t got = strata_crc32c(0, text + body, len - body);
        if (got != (uint32_t)want)
            return strata_fail("%s: checksum mismatch (manifest_crc32c says 0x%08x, the contents give 0x%08x): the "
                               "manifest was edited or corrupted; refusing it", path, (unsigned)want, (unsigned)got);
        return 0;
    }
    if (strstr(text, "manifest_crc32c"))
        return strata_fail("%s: manifest_crc32c is not on the first line: the manifest was edited; refusing it", path);
    /* written before manifests carried a checksum: loaded, but nothing vouches for it */
    STRATA_WARN("ckpt", "%s has no checksum (written by an older Strata): loading it unverified; the next "
                "checkpoint saved will have one", path);
    return 0;
}

/* Reads manifest.yaml, checks its checksum line and parses it into d. */
static int load_manifest(strata_ydoc *d, const char *path) {
    char *text;
    size_t len;
    if (strata_read_file_bounded(path, CKPT_YAML_MAX_BYTES, &text, &len)) return -1;
    int rc = check_manifest_crc(path, text, len);
    if (rc == 0) rc = strata_ydoc_parse(d, path, text, len, CKPT_FILE);
    free(text);
    return rc;
}

/* The global facts: format, step, world, stage, seed, RNG state, progress, dtype and the
 * config text. */
static int parse_meta(strata_ckpt *ck, strata_ydoc *d) {
    yaml_node_t *root = strata_ydoc_root(d), *n;
    uint64_t v;
    if (expect_format(d, root, &ck->version) != 0) return -1;
    if (strata_ydoc_u64(d, root, "", "step", 10, INT64_MAX, &v) != 0) return -1;
    ck->meta.step = (int64_t)v;
    if (strata_ydoc_int(d, root, "", "world", &ck->world) != 0 || strata_ydoc_int(d, root, "", "stage", &ck->meta.stage) != 0 ||
        strata_ydoc_u64(d, root, "", "seed", 10, UINT64_MAX, &ck->meta.seed) != 0 ||
        strata_ydoc_u64(d, root, "", "rng_state", 16, UINT64_MAX, &ck->meta.rng_state) != 0 ||
        strata_ydoc_double(d, root, "", "tokens_seen", &ck->meta.tokens_seen) != 0 ||
        strata_ydoc_double(d, root, "", "last_loss", &ck->meta.last_loss) != 0 ||
        strata_ydoc_expect(d, root, "", "dtype", "float32") != 0)
        return -1;
    ck->meta.val_loss = NAN; /* written only by a step that validated */
    ck->meta.validated = strata_ydoc_has(d, root, "val_loss");
    if (ck->meta.validated && strata_ydoc_double(d, root, "", "val_loss", &ck->meta.val_loss) != 0) return -1;
    if (ck->world < 1 || ck->world > CKPT_MAX_WORLD)
        return strata_fail("%s: world %d must be between 1 and %d", d->path, ck->world, CKPT_MAX_WORLD);
    ck->meta.world = ck->world;
    /* format 2: how the optimizer's moments are stored */
    ck->meta.state = STRATA_OPTIM_STATE_FP32;
    if (ck->version == 2) {
        yaml_node_t *st = strata_ydoc_get(d, root, "", "optim_state", YAML_SCALAR_NODE);
        if (!st) return -1;
        int found = 0;
        for (int k = STRATA_OPTIM_STATE_FP32; k <= STRATA_OPTIM_STATE_INT8; k++)
            if (!strcmp(strata_ydoc_scalar(st), strata_optim_state_name((strata_optim_state)k)))
                ck->meta.state = (strata_optim_state)k, found = 1;
        if (!found) return strata_ydoc_bad_value(d, st, "", "optim_state", "one of fp32, bf16, int8");
        if (ck->meta.state == STRATA_OPTIM_STATE_INT8 && strata_ydoc_expect(d, root, "", "optim_block", "2048") != 0)
            return -1;
    }
    ck->kinds = strata_ckpt_kinds(ck->meta.state);
    if (!(n = strata_ydoc_get(d, root, "", "config", YAML_SCALAR_NODE))) return -1;
    ck->config = strata_xmalloc(n->data.scalar.length + 1);
    memcpy(ck->config, n->data.scalar.value, n->data.scalar.length);
    ck->config[n->data.scalar.length] = 0;
    ck->meta.config_yaml = ck->config;
    return 0;
}

/* An entry of units: or tensors: a mapping of keys this version writes; an unknown key
 * is an edit, so it marks the manifest itself bad. */
static int manifest_entry(strata_ckpt *ck, strata_ydoc *d, yaml_node_t *m, const char *ctx, const char *const *keys) {
    if (strata_ydoc_mapping(d, m, ctx) != 0) return -1;
    if (strata_ydoc_keys_known(d, m, ctx, keys, CKPT_EDITED) != 0) {
        ck->bad_manifest = 1;
        return -1;
    }
    return 0;
}

/* units: every unit's numel and padded size; *nu_out gets their count. */
static int parse_units(strata_ckpt *ck, strata_ydoc *d, int *nu_out) {
    static const char *const unit_keys[] = {"numel", "padded", NULL};
    yaml_node_t *units = strata_ydoc_get(d, strata_ydoc_root(d), "", "units", YAML_SEQUENCE_NODE);
    if (!units) return -1;
    int nu = (int)(units->data.sequence.items.top - units->data.sequence.items.start);
    ck->unit_numel = strata_xcalloc((size_t)nu + 1, sizeof(size_t));
    ck->unit_padded = strata_xcalloc((size_t)nu + 1, sizeof(size_t));
    for (int u = 0; u < nu; u++) {
        yaml_node_t *m = yaml_document_get_node(&d->doc, units->data.sequence.items.start[u]);
        char ctx[64];
        snprintf(ctx, sizeof ctx, "units[%d]", u);
        if (manifest_entry(ck, d, m, ctx, unit_keys) != 0 ||
            get_elements(d, m, ctx, "numel", &ck->unit_numel[u]) != 0 ||
            get_elements(d, m, ctx, "padded", &ck->unit_padded[u]) != 0)
            return -1;
    }
    *nu_out = nu;
    return 0;
}

/* A tensor's shape: a list of at most STRATA_TENSOR_MAX_DIMS non-negative integers. */
static int parse_shape(strata_ydoc *d, yaml_node_t *m, const char *ctx, strata_param_tensor *t) {
    yaml_node_t *shape = strata_ydoc_get(d, m, ctx, "shape", YAML_SEQUENCE_NODE);
    if (!shape) return -1;
    int nd = (int)(shape->data.sequence.items.top - shape->data.sequence.items.start);
    if (nd > STRATA_TENSOR_MAX_DIMS)
        return strata_fail("%s: line %zu: %s: %d dimensions (at most %d)", d->path, shape->start_mark.line + 1, ctx,
                           nd, STRATA_TENSOR_MAX_DIMS);
    t->ndim = nd;
    for (int k = 0; k < nd; k++) {
        yaml_node_t *dn = yaml_document_get_node(&d->doc, shape->data.sequence.items.start[k]);
        uint64_t v;
        if (dn->type != YAML_SCALAR_NODE || strata_parse_u64(strata_ydoc_scalar(dn), 10, &v) != 0 || v > INT64_MAX)
            return strata_fail("%s: line %zu: %s: shape entry %d is not a non-negative integer", d->path,
                               dn->start_mark.line + 1, ctx, k);
        t->shape[k] = (int64_t)v;
    }
    return 0;
}

/* One entry of tensors (ctx "tensors[3]"): name, unit, offset, numel, dtype, shape; in
 * format 2 the moments' dtype, which must be the one this version stores for the tensor. */
static int parse_tensor(const strata_ckpt *ck, strata_ydoc *d, yaml_node_t *m, const char *ctx, strata_param_tensor *t) {
    yaml_node_t *n = strata_ydoc_get(d, m, ctx, "name", YAML_SCALAR_NODE);
    if (!n) return -1;
    if (n->data.scalar.length == 0 || n->data.scalar.length >= sizeof t->name ||
        strlen(strata_ydoc_scalar(n)) != n->data.scalar.length)
        return strata_fail("%s: line %zu: %s: name '%s' is empty, too long or holds a NUL byte", d->path,
                           n->start_mark.line + 1, ctx, strata_ydoc_scalar(n));
    memcpy(t->name, strata_ydoc_scalar(n), n->data.scalar.length + 1);
    char named[64]; /* from here on, messages name the tensor */
    snprintf(named, sizeof named, "tensor %.40s", t->name);
    if (strata_ydoc_int(d, m, named, "unit", &t->unit) != 0 || get_elements(d, m, named, "offset", &t->offset) != 0 ||
        get_elements(d, m, named, "numel", &t->numel) != 0 || strata_ydoc_expect(d, m, named, "dtype", "float32") != 0)
        return -1;
    if (ck->version == 2 &&
        strata_ydoc_expect(d, m, named, "moments", strata_ckpt_tensor_moments(ck->meta.state, t)) != 0)
        return -1;
    return parse_shape(d, m, named, t);
}

/* tensors: every tensor's entry; *nt_out gets their count. */
static int parse_tensors(strata_ckpt *ck, strata_ydoc *d, int *nt_out) {
    static const char *const tensor_keys[] = {"name", "unit", "offset", "numel", "shape", "dtype", NULL};
    static const char *const tensor_keys_2[] = {"name", "unit", "offset", "numel", "shape", "dtype", "moments", NULL};
    yaml_node_t *tens = strata_ydoc_get(d, strata_ydoc_root(d), "", "tensors", YAML_SEQUENCE_NODE);
    if (!tens) return -1;
    int nt = (int)(tens->data.sequence.items.top - tens->data.sequence.items.start);
    ck->tensors = strata_xcalloc((size_t)nt + 1, sizeof *ck->tensors);
    for (int i = 0; i < nt; i++) {
        yaml_node_t *m = yaml_document_get_node(&d->doc, tens->data.sequence.items.start[i]);
        char ctx[64];
        snprintf(ctx, sizeof ctx, "tensors[%d]", i);
        if (manifest_entry(ck, d, m, ctx, ck->version == 2 ? tensor_keys_2 : tensor_keys) != 0 ||
            parse_tensor(ck, d, m, ctx, &ck->tensors[i]) != 0)
            return -1;
    }
    *nt_out = nt;
    return 0;
}

/* manifest.yaml: its checksum and keys, the global facts, units and tensors, and the
 * layout they make checked as the writer checked it. */
static int parse_manifest(strata_ckpt *ck) {
    static const char *const top_keys[] = {"manifest_crc32c", "format", "step", "world", "stage", "seed", "rng_state",
                                           "tokens_seen", "last_loss", "val_loss", "dtype", "units", "tensors",
                                           "config", "optim_state", "optim_block", NULL};
    char path[CKPT_PATH_MAX];
    if (strata_ckpt_fmt_path(path, sizeof path, "%s/manifest.yaml", ck->dir) != 0) return -1;
    if (!strata_is_file(path)) {
        if (!strata_is_dir(ck->dir)) return strata_fail("checkpoint %s: no such directory", ck->dir);
        return strata_fail("%s: missing (not a checkpoint directory, or an unfinished one)", path);
    }
    ck->bad_manifest = 1; /* until the checksum and the keys are found good */
    strata_ydoc d;
    if (load_manifest(&d, path) != 0) return -1;
    int rc = -1, nu, nt;
    if (strata_ydoc_keys_known(&d, strata_ydoc_root(&d), "", top_keys, CKPT_EDITED) != 0) goto out;
    ck->bad_manifest = 0;
    if (parse_meta(ck, &d) != 0 || parse_units(ck, &d, &nu) != 0 || parse_tensors(ck, &d, &nt) != 0) goto out;
    ck->layout = (strata_param_layout){nu, ck->unit_numel, ck->unit_padded, nt, ck->tensors};
    int *order, *first;
    if (strata_ckpt_layout_index(&ck->layout, path, &order, &first) != 0) goto out;
    free(order);
    free(first);
    /* 8-bit state: every rank's shard starts on a block (io/checkpoint.h) */
    for (int u = 0; u < nu && ck->meta.state == STRATA_OPTIM_STATE_INT8; u++)
        if (ck->unit_padded[u] % ((size_t)ck->world * STRATA_Q8_BLOCK) != 0) {
            strata_fail("%s: unit %d: padded size %zu is not a multiple of 2048 x world %d, as int8 state needs", path, u,
                        ck->unit_padded[u], ck->world);
            goto out;
        }
    rc = 0;
out:
    strata_ydoc_free(&d);
    return rc;
}

/* ---- reading: the rank indices ---- */

/* The tensor called `name`; segments come in layout order, so the one after `hint`
 * is tried first. */
static int find_tensor(const strata_ckpt *ck, const char *name, int hint) {
    int nt = ck->layout.n_tensors;
    for (int k = 0; k < nt; k++) {
        int i = (hint + 1 + k) % nt;
        if (!strcmp(ck->tensors[i].name, name)) return i;
    }
    return -1;
}

/* A rank index's own keys: format, rank (it must be rank `rank` of the manifest's world),
 * dtype, and bin_bytes, the size its data file must have. */
static int parse_rank_header(strata_ckpt *ck, strata_ydoc *d, int rank, uint64_t *bin_bytes) {
    static const char *const rank_keys[] = {"format", "rank", "world", "dtype", "bin_bytes", "segments", NULL};
    static const char *const rank_keys_2[] = {"format", "rank", "world", "dtype", "optim_state", "bin_bytes", "segments",
                                              NULL};
    yaml_node_t *root = strata_ydoc_root(d);
    int r, w, version;
    if (strata_ydoc_keys_known(d, root, "", ck->version == 2 ? rank_keys_2 : rank_keys, CKPT_EDITED) != 0) return -1;
    if (expect_format(d, root, &version) != 0 || strata_ydoc_int(d, root, "", "rank", &r) != 0 ||
        strata_ydoc_int(d, root, "", "world", &w) != 0 || strata_ydoc_expect(d, root, "", "dtype", "float32") != 0 ||
        strata_ydoc_u64(d, root, "", "bin_bytes", 10, INT64_MAX, bin_bytes) != 0)
        return -1;
    if (version != ck->version)
        return strata_fail("%s: format %d, but the manifest's is %d (a file from another checkpoint?)", d->path, version,
                           ck->version);
    if (version == 2 && strata_ydoc_expect(d, root, "", "optim_state", strata_optim_state_name(ck->meta.state)) != 0)
        return -1;
    if (r != rank || w != ck->world)
        return strata_fail("%s: says rank %d of world %d, but the manifest expects rank %d of world %d", d->path, r,
                           w, rank, ck->world);
    return 0;
}

/* One entry of segments (ctx "segments[3]") into *out: elements [lo, hi) of one kind of
 * one manifest tensor, at byte `running` of the data file (where the segments before it
 * end), and its CRC-32C. *hint is the tensor of the segment before. */
/* An absmax segment (int8 state): a unit's blocks [lo, hi), no tensor. */
static int parse_absmax_segment(strata_ckpt *ck, strata_ydoc *d, yaml_node_t *m, const char *ctx, uint64_t running,
                                seg *s) {
    static const char *const keys[] = {"kind", "unit", "lo", "hi", "offset", "crc32c", NULL};
    uint64_t crc;
    if (strata_ydoc_keys_known(d, m, ctx, keys, CKPT_EDITED) != 0 || strata_ydoc_int(d, m, ctx, "unit", &s->unit) != 0 ||
        get_elements(d, m, ctx, "lo", &s->lo) != 0 || get_elements(d, m, ctx, "hi", &s->hi) != 0 ||
        strata_ydoc_u64(d, m, ctx, "offset", 10, INT64_MAX, &s->offset) != 0 ||
        strata_ydoc_u64(d, m, ctx, "crc32c", 16, UINT32_MAX, &crc) != 0)
        return -1;
    s->crc = (uint32_t)crc;
    s->tensor = -1;
    s->es = sizeof(float);
    if (s->unit < 0 || s->unit >= ck->layout.n_units || s->lo >= s->hi ||
        s->hi > strata_ckpt_unit_blocks(ck->unit_numel[s->unit]))
        return strata_fail("%s: line %zu: %s: blocks [%zu, %zu) of unit %d are not among its blocks", d->path,
                           m->start_mark.line + 1, ctx, s->lo, s->hi, s->unit);
    if (s->offset != running)
        return strata_fail("%s: line %zu: %s: byte offset %llu, expected %llu (segments are stored back to back)",
                           d->path, m->start_mark.line + 1, ctx, (unsigned long long)s->offset,
                           (unsigned long long)running);
    return 0;
}

static int parse_segment(strata_ckpt *ck, strata_ydoc *d, yaml_node_t *m, const char *ctx, int rank, int *hint,
                         uint64_t running, seg *out) {
    static const char *const seg_keys[] = {"kind", "tensor", "unit", "lo", "hi", "offset", "crc32c", NULL};
    static const char *const seg_keys_2[] = {"kind", "tensor", "dtype", "unit", "lo", "hi", "offset", "crc32c", NULL};
    if (strata_ydoc_mapping(d, m, ctx) != 0) return -1;
    yaml_node_t *kn = strata_ydoc_get(d, m, ctx, "kind", YAML_SCALAR_NODE);
    if (!kn) return -1;
    seg s = {.rank = rank, .kind = -1};
    for (int k = 0; k < ck->kinds; k++)
        if (!strcmp(strata_ydoc_scalar(kn), strata_ckpt_kind_name[k])) s.kind = k;
    if (s.kind < 0)
        return strata_ydoc_bad_value(d, kn, ctx, "kind",
                                     ck->kinds > STRATA_CKPT_KINDS ? "one of param, m, v, m_absmax, v_absmax"
                                                                   : "one of param, m, v");
    if (s.kind == STRATA_CKPT_M_ABSMAX || s.kind == STRATA_CKPT_V_ABSMAX) {
        if (parse_absmax_segment(ck, d, m, ctx, running, &s) != 0) return -1;
        *out = s;
        return 0;
    }
    int moment = s.kind == STRATA_CKPT_M || s.kind == STRATA_CKPT_V;
    if (strata_ydoc_keys_known(d, m, ctx, ck->version == 2 && moment ? seg_keys_2 : seg_keys, CKPT_EDITED) != 0)
        return -1;
    yaml_node_t *tn = strata_ydoc_get(d, m, ctx, "tensor", YAML_SCALAR_NODE);
    if (!tn) return -1;
    s.tensor = find_tensor(ck, strata_ydoc_scalar(tn), *hint);
    if (s.tensor < 0)
        return strata_fail("%s: line %zu: %s: tensor %s is not in the manifest", d->path, tn->start_mark.line + 1,
                           ctx, strata_ydoc_scalar(tn));
    *hint = s.tensor;
    s.es = strata_ckpt_elem_bytes(ck->meta.state, s.kind, &ck->tensors[s.tensor]);
    if (ck->version == 2 && moment &&
        strata_ydoc_expect(d, m, ctx, "dtype", strata_ckpt_moment_dtype(ck->meta.state, s.kind, &ck->tensors[s.tensor])))
        return -1;
    uint64_t crc;
    if (strata_ydoc_int(d, m, ctx, "unit", &s.unit) != 0 || get_elements(d, m, ctx, "lo", &s.lo) != 0 ||
        get_elements(d, m, ctx, "hi", &s.hi) != 0 || strata_ydoc_u64(d, m, ctx, "offset", 10, INT64_MAX, &s.offset) != 0 ||
        strata_ydoc_u64(d, m, ctx, "crc32c", 16, UINT32_MAX, &crc) != 0)
        return -1;
    s.crc = (uint32_t)crc;
    const strata_param_tensor *t = &ck->tensors[s.tensor];
    if (s.unit != t->unit || s.lo >= s.hi || s.lo < t->offset || s.hi > t->offset + t->numel)
        return strata_fail("%s: line %zu: %s: elements [%zu, %zu) of unit %d are not inside tensor %s (unit %d, "
                           "[%zu, %zu))",
                           d->path, m->start_mark.line + 1, ctx, s.lo, s.hi, s.unit, t->name, t->unit, t->offset,
                           t->offset + t->numel);
    if (s.offset != running)
        return strata_fail("%s: line %zu: %s: byte offset %llu, expected %llu (segments are stored back to back)",
                           d->path, m->start_mark.line + 1, ctx, (unsigned long long)s.offset,
                           (unsigned long long)running);
    *out = s;
    return 0;
}

/* segments: each appended to ck->segs; stored back to back, they fill bin_bytes exactly. */
static int parse_segments(strata_ckpt *ck, strata_ydoc *d, int rank, uint64_t bin_bytes) {
    yaml_node_t *segs = strata_ydoc_get(d, strata_ydoc_root(d), "", "segments", YAML_SEQUENCE_NODE);
    if (!segs) return -1;
    int ns = (int)(segs->data.sequence.items.top - segs->data.sequence.items.start);
    uint64_t running = 0;
    int hint = -1;
    for (int i = 0; i < ns; i++) {
        yaml_node_t *m = yaml_document_get_node(&d->doc, segs->data.sequence.items.start[i]);
        char ctx[64];
        snprintf(ctx, sizeof ctx, "segments[%d]", i);
        seg s;
        if (parse_segment(ck, d, m, ctx, rank, &hint, running, &s) != 0) return -1;
        running += (uint64_t)(s.hi - s.lo) * s.es;
        if (ck->n_segs == ck->cap_segs) {
            ck->cap_segs = ck->cap_segs ? ck->cap_segs * 2 : 256;
            ck->segs = strata_xrealloc(ck->segs, sizeof *ck->segs * ck->cap_segs);
        }
        ck->segs[ck->n_segs++] = s;
    }
    if (running != bin_bytes)
        return strata_fail("%s: segments hold %llu bytes, but bin_bytes says %llu", d->path,
                           (unsigned long long)running, (unsigned long long)bin_bytes);
    return 0;
}

/* Opens the rank's data file `bin` for reading and holds it to its index (index_path): a
 * file too short for its segments is truncated (the message names the first tensor cut
 * off), any other size is a file from another checkpoint. The rank's segments are
 * ck->segs[first_seg ..]. */
static int open_rank_bin(strata_ckpt *ck, int rank, const char *bin, const char *index_path, uint64_t bin_bytes,
                         size_t first_seg) {
    int fd = open(bin, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return strata_fail("%s: cannot open: %s", bin, strerror(errno));
    ck->fds[rank] = fd;
    struct stat st;
    if (fstat(fd, &st) != 0) return strata_fail("%s: cannot stat: %s", bin, strerror(errno));
    uint64_t size = (uint64_t)st.st_size;
    if (size < bin_bytes) {
        for (size_t i = first_seg; i < ck->n_segs; i++) {
            const seg *s = &ck->segs[i];
            if (s->offset + (uint64_t)(s->hi - s->lo) * s->es > size)
                return strata_fail("%s: truncated: expected %llu bytes, found %llu (%s %s, %s)", bin,
                                   (unsigned long long)bin_bytes, (unsigned long long)size,
                                   s->tensor >= 0 ? "tensor" : "unit",
                                   s->tensor >= 0 ? ck->tensors[s->tensor].name : "of the absmax",
                                   strata_ckpt_kind_name[s->kind]);
        }
    }
    if (size != bin_bytes)
        return strata_fail("%s: %llu bytes, but its index %s promises %llu (a file from another checkpoint?)", bin,
                           (unsigned long long)size, index_path, (unsigned long long)bin_bytes);
    return 0;
}

/* rankNNNNN.yaml and rankNNNNN.bin of one rank: the index parsed, its segments added to
 * ck->segs, the data file opened and its size checked. */
static int parse_rank(strata_ckpt *ck, int rank) {
    char path[CKPT_PATH_MAX], bin[CKPT_PATH_MAX];
    if (strata_ckpt_fmt_path(path, sizeof path, "%s/rank%05d.yaml", ck->dir, rank) != 0 ||
        strata_ckpt_fmt_path(bin, sizeof bin, "%s/rank%05d.bin", ck->dir, rank) != 0)
        return -1;
    strata_ydoc d;
    if (strata_ydoc_read(&d, path, CKPT_YAML_MAX_BYTES, CKPT_FILE) != 0) return -1;
    uint64_t bin_bytes;
    size_t first_seg = ck->n_segs;
    int rc = parse_rank_header(ck, &d, rank, &bin_bytes);
    if (rc == 0) rc = parse_segments(ck, &d, rank, bin_bytes);
    if (rc == 0) rc = open_rank_bin(ck, rank, bin, path, bin_bytes, first_seg);
    strata_ydoc_free(&d);
    return rc;
}

/* ---- reading: open, close, range reads ---- */

static int seg_cmp(const void *a, const void *b) {
    const seg *x = a, *y = b;
    if (x->unit != y->unit) return x->unit < y->unit ? -1 : 1;
    if (x->kind != y->kind) return x->kind < y->kind ? -1 : 1;
    return x->lo < y->lo ? -1 : x->lo > y->lo;
}

/* The elements of (unit u, kind k) the segments tile: its numel, or its blocks. */
static size_t kind_end(const strata_ckpt *ck, int u, int k) {
    if (k == STRATA_CKPT_M_ABSMAX || k == STRATA_CKPT_V_ABSMAX) return strata_ckpt_unit_blocks(ck->unit_numel[u]);
    return ck->unit_numel[u];
}

/* Every (unit, kind) must be tiled exactly once by the segments of all ranks together. */
static int check_coverage(strata_ckpt *ck) {
    int nu = ck->layout.n_units;
    qsort(ck->segs, ck->n_segs, sizeof *ck->segs, seg_cmp);
    ck->uk_first = strata_xcalloc((size_t)nu * STRATA_CKPT_MAX_KINDS + 1, sizeof(size_t));
    size_t i = 0;
    for (int u = 0; u < nu; u++)
        for (int k = 0; k < STRATA_CKPT_MAX_KINDS; k++) {
            ck->uk_first[u * STRATA_CKPT_MAX_KINDS + k] = i;
            if (k >= ck->kinds) continue;
            size_t at = 0;
            for (; i < ck->n_segs && ck->segs[i].unit == u && ck->segs[i].kind == k; i++) {
                const seg *s = &ck->segs[i];
                if (s->lo > at)
                    return strata_fail("checkpoint %s: unit %d (%s): elements [%zu, %zu) are in no rank file", ck->dir,
                                       u, strata_ckpt_kind_name[k], at, s->lo);
                if (s->lo < at)
                    return strata_fail("checkpoint %s: unit %d (%s): elements [%zu, %zu) are in both "
                                       "rank%05d.bin and rank%05d.bin",
                                       ck->dir, u, strata_ckpt_kind_name[k], s->lo, at < s->hi ? at : s->hi,
                                       ck->segs[i - 1].rank, s->rank);
                at = s->hi;
            }
            if (at != kind_end(ck, u, k))
                return strata_fail("checkpoint %s: unit %d (%s): elements [%zu, %zu) are in no rank file", ck->dir, u,
                                   strata_ckpt_kind_name[k], at, kind_end(ck, u, k));
        }
    ck->uk_first[(size_t)nu * STRATA_CKPT_MAX_KINDS] = i;
    return 0;
}

strata_ckpt *strata_ckpt_open(const char *dir) { return strata_ckpt_open_checked(dir, NULL); }

strata_ckpt *strata_ckpt_open_checked(const char *dir, int *bad_manifest) {
    if (bad_manifest) *bad_manifest = 0;
    strata_ckpt *ck = strata_xcalloc(1, sizeof *ck);
    if (strata_ckpt_fmt_path(ck->dir, sizeof ck->dir, "%s", dir) != 0) goto fail;
    for (size_t n = strlen(ck->dir); n > 1 && ck->dir[n - 1] == '/';) ck->dir[--n] = 0;
    if (parse_manifest(ck) != 0) goto fail;
    ck->fds = strata_xmalloc(sizeof *ck->fds * (size_t)ck->world);
    for (int r = 0; r < ck->world; r++) ck->fds[r] = -1;
    for (int r = 0; r < ck->world; r++)
        if (parse_rank(ck, r) != 0) goto fail;
    if (check_coverage(ck) != 0) goto fail;
    return ck;
fail:
    if (bad_manifest) *bad_manifest = ck->bad_manifest;
    strata_ckpt_close(ck);
    return NULL;
}

void strata_ckpt_close(strata_ckpt *ck) {
    if (!ck) return;
    if (ck->fds)
        for (int r = 0; r < ck->world; r++)
            if (ck->fds[r] >= 0) (void)close(ck->fds[r]); /* read-only: nothing to lose */
    free(ck->fds);
    free(ck->config);
    free(ck->unit_numel);
    free(ck->unit_padded);
    free(ck->tensors);
    free(ck->segs);
    free(ck->uk_first);
    free(ck->scratch);
    free(ck);
}

const strata_ckpt_meta *strata_ckpt_get_meta(const strata_ckpt *ck) { return &ck->meta; }
const strata_param_layout *strata_ckpt_get_layout(const strata_ckpt *ck) { return &ck->layout; }

int strata_ckpt_check_layout(const strata_ckpt *ck, const strata_param_layout *L) {
    const strata_param_layout *C = &ck->layout;
    int n = C->n_tensors < L->n_tensors ? C->n_tensors : L->n_tensors;
    for (int i = 0; i < n; i++) {
        const strata_param_tensor *a = &C->tensors[i], *b = &L->tensors[i];
        if (strcmp(a->name, b->name) != 0)
            return strata_fail("checkpoint %s: tensor %d is %s, but the model's is %s", ck->dir, i, a->name, b->name);
        int same_shape = a->ndim == b->ndim;
        for (int d = 0; same_shape && d < a->ndim; d++) same_shape = a->shape[d] == b->shape[d];
        if (!same_shape) {
            char sa[128], sb[128];
            strata_ckpt_shape_str(sa, sizeof sa, a);
            strata_ckpt_shape_str(sb, sizeof sb, b);
            return strata_fail("checkpoint %s: tensor %s has shape %s, but the model's has %s", ck->dir, a->name, sa,
                               sb);
        }
        if (a->unit != b->unit || a->offset != b->offset || a->numel != b->numel)
            return strata_fail("checkpoint %s: tensor %s is at unit %d offset %zu (%zu elements), but the model's "
                               "is at unit %d offset %zu (%zu elements)",
                               ck->dir, a->name, a->unit, a->offset, a->numel, b->unit, b->offset, b->numel);
    }
    if (C->n_tensors != L->n_tensors)
        return strata_fail("checkpoint %s has %d tensors, the model %d (first unmatched: %s)", ck->dir, C->n_tensors,
                           L->n_tensors, C->n_tensors > n ? C->tensors[n].name : L->tensors[n].name);
    if (C->n_units != L->n_units)
        return strata_fail("checkpoint %s has %d units, the model %d", ck->dir, C->n_units, L->n_units);
    for (int u = 0; u < C->n_units; u++)
        if (C->unit_numel[u] != L->unit_numel[u])
            return strata_fail("checkpoint %s: unit %d has %zu elements, the model's has %zu", ck->dir, u,
                               C->unit_numel[u], L->unit_numel[u]);
    return 0;
}

/* The segment's name in messages: "tensor X (m)" or "unit 3 (m_absmax)". */
static void seg_name(const strata_ckpt *ck, const seg *s, char *buf, size_t len) {
    if (s->tensor >= 0) snprintf(buf, len, "tensor %s (%s)", ck->tensors[s->tensor].name, strata_ckpt_kind_name[s->kind]);
    else snprintf(buf, len, "unit %d (%s)", s->unit, strata_ckpt_kind_name[s->kind]);
}

static int checksum_mismatch(const strata_ckpt *ck, const seg *s, const char *bin, uint32_t crc) {
    char name[192];
    seg_name(ck, s, name, sizeof name);
    return strata_fail("%s: %s: checksum mismatch (stored 0x%08x, computed 0x%08x)", bin, name, s->crc, crc);
}

/* Segment s whole into dst ((s->hi - s->lo) * es bytes), checked against its CRC-32C; a
 * match marks it verified, so later reads of parts of it skip the check. */
static int read_segment_checked(strata_ckpt *ck, seg *s, void *dst) {
    size_t bytes = (s->hi - s->lo) * s->es;
    char bin[CKPT_PATH_MAX];
    bin_path(ck, s->rank, bin, sizeof bin);
    if (strata_pread_all(ck->fds[s->rank], dst, bytes, s->offset, bin) != 0) return -1;
    uint32_t crc = strata_crc32c(0, dst, bytes);
    if (crc != s->crc) return checksum_mismatch(ck, s, bin, crc);
    s->verified = 1;
    return 0;
}

/* Elements [a, z) of segment s into out, the segment checked first: its bytes stream
 * through the scratch buffer, the CRC-32C computed on the way and the wanted part copied
 * out as it passes; a match marks the segment verified. */
static int read_part_checked(strata_ckpt *ck, seg *s, size_t a, size_t z, char *out) {
    if (!ck->scratch) ck->scratch = strata_xmalloc(CKPT_VERIFY_CHUNK_BYTES);
    const size_t chunk = CKPT_VERIFY_CHUNK_BYTES / s->es, es = s->es;
    char *scratch = (char *)ck->scratch;
    char bin[CKPT_PATH_MAX];
    bin_path(ck, s->rank, bin, sizeof bin);
    uint32_t crc = 0;
    for (size_t lo = s->lo; lo < s->hi; lo += chunk) {
        size_t hi = s->hi - lo < chunk ? s->hi : lo + chunk;
        if (strata_pread_all(ck->fds[s->rank], scratch, (hi - lo) * es, s->offset + (lo - s->lo) * es, bin) != 0)
            return -1;
        crc = strata_crc32c(crc, scratch, (hi - lo) * es);
        size_t ca = a > lo ? a : lo, cz = z < hi ? z : hi; /* the wanted part of this chunk */
        if (ca < cz) memcpy(out + (ca - a) * es, scratch + (ca - lo) * es, (cz - ca) * es);
    }
    if (crc != s->crc) return checksum_mismatch(ck, s, bin, crc);
    s->verified = 1;
    return 0;
}

/* Elements [a, z) of segment i into out, as stored: straight from its file once it was
 * verified; otherwise checked first, in place when the whole segment is wanted, else
 * streamed. */
static int read_part(strata_ckpt *ck, size_t i, size_t a, size_t z, void *out) {
    seg *s = &ck->segs[i];
    if (s->verified) {
        char bin[CKPT_PATH_MAX];
        bin_path(ck, s->rank, bin, sizeof bin);
        return strata_pread_all(ck->fds[s->rank], out, (z - a) * s->es, s->offset + (a - s->lo) * s->es, bin);
    }
    if (a == s->lo && z == s->hi) return read_segment_checked(ck, s, out);
    return read_part_checked(ck, s, a, z, out);
}

/* The first segment of (unit, kind) that ends after element lo (binary search). */
static size_t first_segment_after(const strata_ckpt *ck, int unit, int kind, size_t lo) {
    size_t b = ck->uk_first[unit * STRATA_CKPT_MAX_KINDS + kind],
           e = ck->uk_first[unit * STRATA_CKPT_MAX_KINDS + kind + 1];
    while (b < e) {
        size_t mid = b + (e - b) / 2;
        if (ck->segs[mid].hi <= lo) b = mid + 1;
        else e = mid;
    }
    return b;
}

/* Calls part(ck, i, a, z, arg) for each piece [a, z) of segment i that [lo, hi) covers, in
 * order. */
typedef int (*part_fn)(strata_ckpt *ck, size_t i, size_t a, size_t z, size_t lo, void *arg);
static int for_each_part(strata_ckpt *ck, int unit, int kind, size_t lo, size_t hi, part_fn part, void *arg) {
    size_t e = ck->uk_first[unit * STRATA_CKPT_MAX_KINDS + kind + 1];
    for (size_t i = first_segment_after(ck, unit, kind, lo); i < e && ck->segs[i].lo < hi; i++) {
        const seg *s = &ck->segs[i];
        size_t a = s->lo > lo ? s->lo : lo, z = s->hi < hi ? s->hi : hi;
        if (part(ck, i, a, z, lo, arg) != 0) return -1;
    }
    return 0;
}

static int bad_read(const strata_ckpt *ck, int unit, int kind, size_t lo, size_t hi) {
    return strata_fail("checkpoint %s: invalid read of unit %d kind %d elements [%zu, %zu)", ck->dir, unit, kind, lo, hi);
}

/* read_raw's pieces: back to back, each as stored */
static int raw_part(strata_ckpt *ck, size_t i, size_t a, size_t z, size_t lo, void *arg) {
    char **out = arg;
    if (read_part(ck, i, a, z, *out) != 0) return -1;
    *out += (z - a) * ck->segs[i].es;
    return 0;
}

int strata_ckpt_read_raw(strata_ckpt *ck, int unit, int kind, size_t lo, size_t hi, void *dst) {
    if (unit < 0 || unit >= ck->layout.n_units || kind < 0 || kind >= ck->kinds || lo > hi ||
        hi > kind_end(ck, unit, kind))
        return bad_read(ck, unit, kind, lo, hi);
    char *out = dst;
    return for_each_part(ck, unit, kind, lo, hi, raw_part, &out);
}

/* read_range's pieces: each as fp32 at its element's place in dst. A piece stored narrower
 * is read into the tail of its place and widened front to back: value i, written to bytes
 * [4i, 4i + 4), never reaches the stored bytes of any element after i. */
static int fp32_part(strata_ckpt *ck, size_t i, size_t a, size_t z, size_t lo, void *arg) {
    float *out = (float *)arg + (a - lo);
    const seg *s = &ck->segs[i];
    size_t n = z - a;
    if (s->es == sizeof(float)) return read_part(ck, i, a, z, out);
    unsigned char *stored = (unsigned char *)out + (sizeof(float) - s->es) * n;
    if (read_part(ck, i, a, z, stored) != 0) return -1;
    if (s->es == 2) { /* bf16 */
        for (size_t k = 0; k < n; k++) {
            uint16_t h;
            memcpy(&h, stored + 2 * k, 2);
            out[k] = strata_bf16_to_f32(h);
        }
        return 0;
    }
    /* 8-bit codes: dequantized with each block's absmax (one read per block) */
    const strata_q8_map *q = s->kind == STRATA_CKPT_M ? strata_q8_signed() : strata_q8_unsigned();
    int absmax_kind = s->kind == STRATA_CKPT_M ? STRATA_CKPT_M_ABSMAX : STRATA_CKPT_V_ABSMAX;
    size_t blk = SIZE_MAX;
    float absmax = 0;
    for (size_t k = 0; k < n; k++) {
        size_t b = (a + k) / STRATA_Q8_BLOCK;
        if (b != blk && strata_ckpt_read_raw(ck, s->unit, absmax_kind, b, b + 1, &absmax) != 0) return -1;
        blk = b;
        out[k] = q->value[stored[k]] * absmax;
    }
    return 0;
}

int strata_ckpt_read_range(strata_ckpt *ck, int unit, int kind, size_t lo, size_t hi, float *dst) {
    if (unit < 0 || unit >= ck->layout.n_units || kind < 0 || kind >= STRATA_CKPT_KINDS || lo > hi)
        return bad_read(ck, unit, kind, lo, hi);
    size_t numel = ck->unit_numel[unit];
    size_t real_hi = hi < numel ? hi : numel;
    /* Padding beyond the real elements reads as zeros. */
    if (hi > (lo > numel ? lo : numel)) {
        size_t z0 = lo > numel ? lo : numel;
        memset(dst + (z0 - lo), 0, (hi - z0) * sizeof(float));
    }
    if (lo >= real_hi) return 0;
    return for_each_part(ck, unit, kind, lo, real_hi, fp32_part, dst);
}
