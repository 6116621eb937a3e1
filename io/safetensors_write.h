/* io/safetensors_write.h: writing a safetensors file (io/safetensors.h reads them):
 * declare the metadata and the tensors, then write the header and each tensor's bytes in
 * order, then commit. The file appears whole or not at all (a temporary name beside it,
 * fsync, rename, the folder fsynced). `strata export` and `strata dump-grads` write so.
 *
 * Layout: u64 little-endian N, then N bytes of JSON
 *   {"__metadata__": {"k": "v", ...}, "name": {"dtype": "F32", "shape": [..],
 *    "data_offsets": [begin, end]}, ...}
 * padded with spaces so the data starts 8-byte aligned, then the tensors' bytes back to
 * back in header order (offsets relative to the start of the data). */
#ifndef STRATA_SAFETENSORS_WRITE_H
#define STRATA_SAFETENSORS_WRITE_H

#include <stddef.h>
#include <stdint.h>

#include "core/common.h"
#include "core/model.h"
#include "io/text.h"

typedef struct strata_st_out_tensor {
    char name[STRATA_TENSOR_NAME_MAX + 8]; /* "grad." + a model tensor name */
    const char *dtype;                    /* "F32" or "I32" */
    int ndim;
    int64_t shape[3];
    size_t bytes;
} strata_st_out_tensor;

typedef struct strata_st_out {
    char path[STRATA_PATH_MAX], tmp[STRATA_PATH_MAX + 32];
    strata_st_out_tensor *t;
    int n, cap;
    int next;   /* the tensor whose bytes come next */
    int fd;
    strata_sbuf meta;  /* "key": "value" pairs, comma separated, already JSON */
} strata_st_out;

void strata_st_out_init(strata_st_out *w, const char *path);
/* Frees w; a file not committed is removed. */
void strata_st_out_free(strata_st_out *w);
void strata_st_out_meta(strata_st_out *w, const char *key, const char *value);
void strata_st_out_meta_int(strata_st_out *w, const char *key, long long value);
/* Declares the next tensor (dtype elements are 4 bytes: F32 or I32); shape d0..d(ndim-1). */
void strata_st_out_add(strata_st_out *w, const char *name, const char *dtype, int ndim, int64_t d0, int64_t d1,
                       int64_t d2);
/* Writes the header to a temporary file next to the target; tensors follow with
 * strata_st_out_write. 0, or -1 with the error set. */
int strata_st_out_begin(strata_st_out *w);
/* The bytes of tensor `i`, which must be the next one declared. 0, or -1. */
int strata_st_out_write(strata_st_out *w, int i, const void *data);
/* fsync, rename over the target, fsync the directory: a reader sees the old file or the
 * whole new one. 0, or -1. */
int strata_st_out_commit(strata_st_out *w);

#endif
