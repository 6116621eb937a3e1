/* io/safetensors.h: reading safetensors files (Hugging Face's weight format), whoever
 * wrote them.
 *
 * Layout: u64 little-endian N, then N bytes of a JSON object
 *   {"__metadata__": {"key": "value", ...},          (optional, strings only)
 *    "name": {"dtype": "F32", "shape": [d0, d1], "data_offsets": [begin, end]}, ...}
 * then the data region; offsets are relative to its start (byte 8 + N of the file). The
 * tensors must tile the data region exactly: sorted by offset, each begins where the
 * previous ended, the last ends at the end of the file, and each spans
 * numel * sizeof(dtype) bytes. That is what Hugging Face's own reader demands, so a file
 * Strata accepts is one transformers accepts, and vice versa.
 *
 * The header parser takes (bytes, len) and reads nothing outside them, whatever they hold;
 * the file functions use it and then read tensor ranges with pread, converting F32, F16,
 * BF16 and F64 to fp32, so a reader never needs a whole tensor (or file) in memory. */
#ifndef STRATA_SAFETENSORS_H
#define STRATA_SAFETENSORS_H

#include <stddef.h>
#include <stdint.h>

#define STRATA_ST_MAX_DIMS 8
#define STRATA_ST_MAX_HEADER (100u * 1000u * 1000u) /* Hugging Face's own limit */

typedef enum strata_st_dtype {
    STRATA_ST_BOOL, STRATA_ST_U8, STRATA_ST_I8, STRATA_ST_F8_E4M3, STRATA_ST_F8_E5M2, STRATA_ST_I16,
    STRATA_ST_U16, STRATA_ST_F16, STRATA_ST_BF16, STRATA_ST_I32, STRATA_ST_U32, STRATA_ST_F32,
    STRATA_ST_I64, STRATA_ST_U64, STRATA_ST_F64, STRATA_ST_DTYPES
} strata_st_dtype;

typedef struct strata_st_tensor {
    char *name;
    strata_st_dtype dtype;
    int ndim;
    int64_t shape[STRATA_ST_MAX_DIMS];
    uint64_t numel;
    uint64_t begin, end; /* bytes, relative to the data region */
} strata_st_tensor;

typedef struct strata_safetensors {
    char path[1024];        /* the file, or the name given to the parser */
    uint64_t data_offset;   /* 8 + N: where the data region starts in the file */
    uint64_t file_bytes;
    int n_tensors;
    strata_st_tensor *tensors; /* in header order */
    int n_meta;
    char **meta_keys, **meta_values;
    int fd;                 /* -1 when parsed from memory */
} strata_safetensors;

/* Parses and validates a header. bytes[0, len) is the start of a file of file_bytes bytes
 * (len <= file_bytes; the whole file when it is in memory): the 8-byte length and the
 * header must lie within len, and the tensors must tile [8 + N, file_bytes). `name`
 * names the file in messages. On failure nothing needs freeing. */
int strata_safetensors_parse(strata_safetensors *st, const void *bytes, size_t len, uint64_t file_bytes,
                             const char *name);
/* Opens and validates a file (the header only is read). */
int strata_safetensors_open(strata_safetensors *st, const char *path);
void strata_safetensors_close(strata_safetensors *st);

const strata_st_tensor *strata_safetensors_find(const strata_safetensors *st, const char *name);
const char *strata_safetensors_meta(const strata_safetensors *st, const char *key); /* NULL if absent */
const char *strata_st_dtype_name(strata_st_dtype d);
size_t strata_st_dtype_bytes(strata_st_dtype d);

/* Elements [lo, hi) of tensor t (row-major), as fp32, into dst. Fails naming the file and
 * tensor for a dtype other than F32, F16, BF16, F64, or a short read. */
int strata_safetensors_read_f32(const strata_safetensors *st, const strata_st_tensor *t, uint64_t lo, uint64_t hi,
                                float *dst);

#endif
