/* io/safetensors_write.c: writing safetensors files (io/safetensors_write.h). */
#include "io/safetensors_write.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/files.h"
#include "io/json.h"

void strata_st_out_init(strata_st_out *w, const char *path) {
    memset(w, 0, sizeof *w);
    snprintf(w->path, sizeof w->path, "%s", path);
    w->fd = -1;
}

void strata_st_out_free(strata_st_out *w) {
    free(w->t);
    free(w->meta.p);
    if (w->fd >= 0) { /* not committed: leave no half-written file behind */
        (void)close(w->fd); /* a file about to be removed: nothing to learn from its close */
        unlink(w->tmp);
    }
    memset(w, 0, sizeof *w);
    w->fd = -1;
}

void strata_st_out_meta(strata_st_out *w, const char *key, const char *value) {
    if (w->meta.len) strata_sbuf_putn(&w->meta, ",", 1);
    strata_json_string(&w->meta, key, strlen(key));
    strata_sbuf_putn(&w->meta, ":", 1);
    strata_json_string(&w->meta, value ? value : "", strlen(value ? value : ""));
}

void strata_st_out_meta_int(strata_st_out *w, const char *key, long long value) {
    char v[32];
    snprintf(v, sizeof v, "%lld", value);
    strata_st_out_meta(w, key, v);
}

void strata_st_out_add(strata_st_out *w, const char *name, const char *dtype, int ndim, int64_t d0, int64_t d1,
                       int64_t d2) {
    if (w->n == w->cap) {
        w->cap = w->cap ? 2 * w->cap : 64;
        w->t = strata_xrealloc(w->t, (size_t)w->cap * sizeof *w->t);
    }
    strata_st_out_tensor *t = &w->t[w->n++];
    memset(t, 0, sizeof *t);
    snprintf(t->name, sizeof t->name, "%s", name);
    t->dtype = dtype;
    t->ndim = ndim;
    int64_t d[3] = {d0, d1, d2};
    size_t numel = 1;
    for (int i = 0; i < ndim; i++) {
        t->shape[i] = d[i];
        numel *= (size_t)d[i];
    }
    t->bytes = numel * 4;
}

int strata_st_out_begin(strata_st_out *w) {
    strata_sbuf h = {0};
    strata_sbuf_putn(&h, "{\"__metadata__\":{", 17);
    if (w->meta.len) strata_sbuf_putn(&h, w->meta.p, w->meta.len);
    strata_sbuf_putn(&h, "}", 1);
    size_t off = 0;
    for (int i = 0; i < w->n; i++) {
        const strata_st_out_tensor *t = &w->t[i];
        strata_sbuf_putn(&h, ",", 1);
        strata_json_string(&h, t->name, strlen(t->name));
        strata_sbuf_printf(&h, ":{\"dtype\":\"%s\",\"shape\":[", t->dtype);
        for (int d = 0; d < t->ndim; d++) strata_sbuf_printf(&h, d ? ",%lld" : "%lld", (long long)t->shape[d]);
        strata_sbuf_printf(&h, "],\"data_offsets\":[%zu,%zu]}", off, off + t->bytes);
        off += t->bytes;
    }
    strata_sbuf_putn(&h, "}", 1);
    while (h.len % 8) strata_sbuf_putn(&h, " ", 1); /* 8 + N stays a multiple of 8: aligned data */
    unsigned char len[8];
    for (int i = 0; i < 8; i++) len[i] = (unsigned char)((uint64_t)h.len >> (8 * i));

    snprintf(w->tmp, sizeof w->tmp, "%s.tmp.%d", w->path, (int)getpid());
    w->fd = open(w->tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    int rc = 0;
    if (w->fd < 0) rc = strata_fail("%s: cannot create: %s", w->tmp, strerror(errno));
    else rc = strata_write_all(w->fd, len, 8, w->tmp) || strata_write_all(w->fd, h.p, h.len, w->tmp) ? -1 : 0;
    free(h.p);
    return rc;
}

int strata_st_out_write(strata_st_out *w, int i, const void *data) {
    STRATA_ASSERT(i == w->next && i < w->n);
    w->next++;
    return strata_write_all(w->fd, data, w->t[i].bytes, w->tmp);
}

int strata_st_out_commit(strata_st_out *w) {
    STRATA_ASSERT(w->next == w->n);
    if (fsync(w->fd) != 0) return strata_fail("%s: fsync failed: %s", w->tmp, strerror(errno));
    int fd = w->fd;
    w->fd = -1;
    if (close(fd) != 0) {
        int e = errno;
        unlink(w->tmp);
        return strata_fail("%s: close failed: %s", w->tmp, strerror(e));
    }
    if (rename(w->tmp, w->path) != 0) {
        int e = errno;
        unlink(w->tmp);
        return strata_fail("cannot rename %s to %s: %s", w->tmp, w->path, strerror(e));
    }
    char dir[STRATA_PATH_MAX];
    strata_path_dir(dir, sizeof dir, w->path);
    return strata_fsync_dir(dir); /* the rename survives a crash */
}
