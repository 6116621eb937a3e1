/* io/checkpoint_format.c: what the checkpoint writer, reader and pruner share
 * (io/checkpoint_format.h): kind names, path formatting, the layout checks run before a
 * write and after a read, and the list of a run's step directories. */
#include "io/checkpoint_format.h"

#include <dirent.h>
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "core/quant.h"
#include "io/files.h"
#include "io/text.h"

const char *const strata_ckpt_kind_name[STRATA_CKPT_MAX_KINDS] = {"param", "m", "v", "m_absmax", "v_absmax"};

/* ---- how the optimizer state is stored ---- */

int strata_ckpt_kinds(strata_optim_state state) {
    return state == STRATA_OPTIM_STATE_INT8 ? STRATA_CKPT_MAX_KINDS : STRATA_CKPT_KINDS;
}

size_t strata_ckpt_elem_bytes(strata_optim_state state, int kind, const strata_param_tensor *t) {
    if (kind != STRATA_CKPT_M && kind != STRATA_CKPT_V) return sizeof(float);
    if (state == STRATA_OPTIM_STATE_INT8) return strata_q8_small_tensor(t->numel) ? sizeof(float) : 1;
    return strata_optim_moment_bytes(state);
}

const char *strata_ckpt_moment_dtype(strata_optim_state state, int kind, const strata_param_tensor *t) {
    if (state == STRATA_OPTIM_STATE_BF16) return "bfloat16";
    if (state == STRATA_OPTIM_STATE_INT8 && !strata_q8_small_tensor(t->numel))
        return kind == STRATA_CKPT_M ? "q8_signed" : "q8_unsigned";
    return "float32";
}

const char *strata_ckpt_tensor_moments(strata_optim_state state, const strata_param_tensor *t) {
    if (state == STRATA_OPTIM_STATE_BF16) return "bfloat16";
    if (state == STRATA_OPTIM_STATE_INT8 && !strata_q8_small_tensor(t->numel)) return "q8";
    return "float32";
}

size_t strata_ckpt_unit_blocks(size_t numel) { return strata_q8_blocks(numel); }

/* ---- paths ---- */

int strata_ckpt_fmt_path(char *out, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    int n = vsnprintf(out, len, fmt, ap);
    va_end(ap);
    if (n < 0 || (size_t)n >= len)
        return strata_fail("path too long (at most %zu bytes): %.160s...", len - 1, out);
    return 0;
}

/* ---- layout checks ---- */

typedef struct tref {
    int unit;
    size_t offset;
    int idx;
} tref;

static int tref_cmp(const void *a, const void *b) {
    const tref *x = a, *y = b;
    if (x->unit != y->unit) return x->unit < y->unit ? -1 : 1;
    if (x->offset != y->offset) return x->offset < y->offset ? -1 : 1;
    return x->idx < y->idx ? -1 : x->idx > y->idx;
}

static int name_cmp(const void *a, const void *b) {
    return strcmp(*(const char *const *)a, *(const char *const *)b);
}

void strata_ckpt_shape_str(char *buf, size_t len, const strata_param_tensor *t) {
    size_t n = (size_t)snprintf(buf, len, "[");
    for (int d = 0; d < t->ndim && n < len; d++)
        n += (size_t)snprintf(buf + n, len - n, "%s%lld", d ? ", " : "", (long long)t->shape[d]);
    if (n < len) snprintf(buf + n, len - n, "]");
}

/* The layout's own fields: counts, arrays present, no unit padded below its size. */
static int check_units(const strata_param_layout *L, const char *what) {
    if (L->n_units < 0 || L->n_tensors < 0 || (L->n_units > 0 && (!L->unit_numel || !L->unit_padded)) ||
        (L->n_tensors > 0 && !L->tensors))
        return strata_fail("%s: malformed layout (%d units, %d tensors)", what, L->n_units, L->n_tensors);
    for (int u = 0; u < L->n_units; u++)
        if (L->unit_padded[u] < L->unit_numel[u])
            return strata_fail("%s: unit %d: padded size %zu is smaller than its %zu elements", what, u,
                               L->unit_padded[u], L->unit_numel[u]);
    return 0;
}

/* Tensor i alone: a UTF-8 name, a unit that exists, a shape whose element count is numel. */
static int check_tensor(const strata_param_layout *L, int i, const char *what) {
    const strata_param_tensor *t = &L->tensors[i];
    if (!memchr(t->name, 0, sizeof t->name) || !t->name[0] ||
        strata_utf8_invalid_at(t->name, strlen(t->name)) != strlen(t->name))
        return strata_fail("%s: tensor %d has an empty, unterminated or non-UTF-8 name", what, i);
    if (t->unit < 0 || t->unit >= L->n_units)
        return strata_fail("%s: tensor %s: unit %d is out of range (%d units)", what, t->name, t->unit, L->n_units);
    if (t->ndim < 0 || t->ndim > STRATA_TENSOR_MAX_DIMS)
        return strata_fail("%s: tensor %s: %d dimensions (at most %d)", what, t->name, t->ndim,
                           STRATA_TENSOR_MAX_DIMS);
    size_t prod = 1;
    for (int d = 0; d < t->ndim; d++) {
        if (t->shape[d] < 0)
            return strata_fail("%s: tensor %s: negative dimension %lld", what, t->name, (long long)t->shape[d]);
        /* a product that wraps could match numel: refuse it before it does */
        if (t->shape[d] && prod > SIZE_MAX / (size_t)t->shape[d])
            return strata_fail("%s: tensor %s: its shape's element count overflows", what, t->name);
        prod *= (size_t)t->shape[d];
    }
    if (prod != t->numel) {
        char sh[128];
        strata_ckpt_shape_str(sh, sizeof sh, t);
        return strata_fail("%s: tensor %s: shape %s has %zu elements, but numel is %zu", what, t->name, sh, prod,
                           t->numel);
    }
    return 0;
}

/* No name twice among the n tensor names (sorted here). */
static int check_names_unique(const char **names, int n, const char *what) {
    qsort(names, (size_t)n, sizeof *names, name_cmp);
    for (int i = 1; i < n; i++)
        if (!strcmp(names[i - 1], names[i])) return strata_fail("%s: tensor name %s appears twice", what, names[i]);
    return 0;
}

/* Each unit's tensors, refs sorted by (unit, offset), tile it from 0 to its numel; fills
 * order and first as strata_ckpt_layout_index returns them. */
static int check_tiling(const strata_param_layout *L, const tref *refs, int *order, int *first, const char *what) {
    int j = 0;
    for (int u = 0; u < L->n_units; u++) {
        first[u] = j;
        size_t expect = 0;
        for (; j < L->n_tensors && refs[j].unit == u; j++) {
            const strata_param_tensor *t = &L->tensors[refs[j].idx];
            if (t->offset != expect)
                return strata_fail("%s: unit %d: tensor %s starts at element %zu, expected %zu (a unit's tensors "
                                   "must tile it without gaps or overlaps)",
                                   what, u, t->name, t->offset, expect);
            expect += t->numel;
            order[j] = refs[j].idx;
        }
        if (expect != L->unit_numel[u])
            return strata_fail("%s: unit %d: its tensors cover %zu elements, but the unit has %zu", what, u, expect,
                               L->unit_numel[u]);
    }
    first[L->n_units] = j;
    return 0;
}

int strata_ckpt_layout_index(const strata_param_layout *L, const char *what, int **order_out, int **first_out) {
    if (check_units(L, what) != 0) return -1;
    const char **names = strata_xmalloc(sizeof *names * (size_t)(L->n_tensors + 1));
    tref *refs = strata_xmalloc(sizeof *refs * (size_t)(L->n_tensors + 1));
    int *order = NULL, *first = NULL;
    int rc = -1;
    for (int i = 0; i < L->n_tensors; i++) {
        if (check_tensor(L, i, what) != 0) goto out;
        names[i] = L->tensors[i].name;
        refs[i] = (tref){L->tensors[i].unit, L->tensors[i].offset, i};
    }
    if (check_names_unique(names, L->n_tensors, what) != 0) goto out;
    qsort(refs, (size_t)L->n_tensors, sizeof *refs, tref_cmp);
    order = strata_xmalloc(sizeof *order * (size_t)(L->n_tensors + 1));
    first = strata_xmalloc(sizeof *first * (size_t)(L->n_units + 1));
    if (check_tiling(L, refs, order, first, what) != 0) goto out;
    *order_out = order;
    *first_out = first;
    order = first = NULL;
    rc = 0;
out:
    free(names);
    free(refs);
    free(order);
    free(first);
    return rc;
}

/* ---- the step directories of a run ---- */

/* Parses "step_<digits><suffix>" and returns the step, or -1 when name is not that. */
static int64_t parse_step_name(const char *name, const char *suffix) {
    if (strncmp(name, "step_", 5) != 0) return -1;
    const char *p = name + 5;
    int64_t v = 0;
    int digits = 0;
    for (; *p >= '0' && *p <= '9'; p++, digits++) {
        if (v > (INT64_MAX - 9) / 10) return -1;
        v = v * 10 + (*p - '0');
    }
    if (digits == 0 || strcmp(p, suffix) != 0) return -1;
    return v;
}

static int step_desc(const void *a, const void *b) {
    const strata_ckpt_step *x = a, *y = b;
    return x->step > y->step ? -1 : x->step < y->step;
}

int strata_ckpt_list_steps(const char *ckpt_dir, const char *suffix, strata_ckpt_step **out, int *n_out) {
    DIR *d = opendir(ckpt_dir);
    if (!d) return strata_fail("%s: cannot list: %s", ckpt_dir, strerror(errno));
    strata_ckpt_step *v = NULL;
    int n = 0, cap = 0;
    struct dirent *e;
    while ((e = readdir(d)) != NULL) {
        int64_t step = parse_step_name(e->d_name, suffix);
        if (step < 0 || strlen(e->d_name) >= sizeof v->name) continue;
        char p[CKPT_PATH_MAX], m[CKPT_PATH_MAX];
        if (strata_ckpt_fmt_path(p, sizeof p, "%s/%s", ckpt_dir, e->d_name) != 0 || !strata_is_dir(p)) continue;
        if (strata_ckpt_fmt_path(m, sizeof m, "%s/manifest.yaml", p) != 0) continue;
        if (n == cap) v = strata_xrealloc(v, sizeof *v * (size_t)(cap = cap ? cap * 2 : 16));
        v[n].step = step;
        v[n].complete = strata_is_file(m);
        memcpy(v[n].name, e->d_name, strlen(e->d_name) + 1);
        n++;
    }
    (void)closedir(d); /* read-only: nothing to lose */
    if (n > 1) qsort(v, (size_t)n, sizeof *v, step_desc);
    *out = v;
    *n_out = n;
    return 0;
}

