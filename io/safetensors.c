/* io/safetensors.c: the safetensors header parser (bounds-checked, over io/json.c)
 * and range reads with conversion to fp32. Format and rules: io/safetensors.h. */
#include "io/safetensors.h"

#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/common.h"
#include "io/files.h"
#include "io/json.h"

#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "io/safetensors.c assumes a little-endian host (safetensors data is little-endian)"
#endif

static const struct {
    const char *name;
    size_t bytes;
} dtypes[STRATA_ST_DTYPES] = {
    [STRATA_ST_BOOL] = {"BOOL", 1},      [STRATA_ST_U8] = {"U8", 1},   [STRATA_ST_I8] = {"I8", 1},
    [STRATA_ST_F8_E4M3] = {"F8_E4M3", 1}, [STRATA_ST_F8_E5M2] = {"F8_E5M2", 1},
    [STRATA_ST_I16] = {"I16", 2},        [STRATA_ST_U16] = {"U16", 2}, [STRATA_ST_F16] = {"F16", 2},
    [STRATA_ST_BF16] = {"BF16", 2},      [STRATA_ST_I32] = {"I32", 4}, [STRATA_ST_U32] = {"U32", 4},
    [STRATA_ST_F32] = {"F32", 4},        [STRATA_ST_I64] = {"I64", 8}, [STRATA_ST_U64] = {"U64", 8},
    [STRATA_ST_F64] = {"F64", 8},
};

const char *strata_st_dtype_name(strata_st_dtype d) { return (unsigned)d < STRATA_ST_DTYPES ? dtypes[d].name : "?"; }
size_t strata_st_dtype_bytes(strata_st_dtype d) { return (unsigned)d < STRATA_ST_DTYPES ? dtypes[d].bytes : 0; }

static void free_fields(strata_safetensors *st) {
    for (int i = 0; i < st->n_tensors; i++) free(st->tensors[i].name);
    free(st->tensors);
    for (int i = 0; i < st->n_meta; i++) {
        free(st->meta_keys[i]);
        free(st->meta_values[i]);
    }
    free(st->meta_keys);
    free(st->meta_values);
    st->tensors = NULL;
    st->meta_keys = st->meta_values = NULL;
    st->n_tensors = st->n_meta = 0;
}

/* Header errors name the file and the tensor (JSON syntax errors give offsets within the
 * header JSON, which starts at byte 8 of the file). The message is formatted before the
 * fields it may quote are freed. For functions with `st` and the file's `name` at hand. */
#define HDR_FAIL(fmt, ...) (strata_fail("%s: safetensors header: " fmt, name, __VA_ARGS__), free_fields(st), -1)

static int uint_value(const strata_json *v, uint64_t *out) {
    if (!v || v->type != STRATA_JSON_NUMBER || !v->is_int || v->integer < 0) return -1;
    *out = (uint64_t)v->integer;
    return 0;
}

static int by_begin(const void *a, const void *b) {
    const strata_st_tensor *x = *(const strata_st_tensor *const *)a, *y = *(const strata_st_tensor *const *)b;
    if (x->begin != y->begin) return x->begin < y->begin ? -1 : 1;
    return x->end < y->end ? -1 : x->end > y->end; /* empty tensors first at a shared offset */
}

/* The first 8 bytes: the header's length n, little-endian, checked against the format's
 * limit and the bytes at hand; the header must open with '{'. */
static int header_length(const unsigned char *b, size_t len, uint64_t file_bytes, const char *name, uint64_t *n_out) {
    if (len > file_bytes) return strata_fail("%s: %zu header bytes given for a file of %llu", name, len,
                                             (unsigned long long)file_bytes);
    if (len < 8)
        return strata_fail("%s: %zu bytes, shorter than the 8-byte header length of a safetensors file", name, len);
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | b[i];
    if (n > STRATA_ST_MAX_HEADER)
        return strata_fail("%s: header length %llu is more than the %u bytes safetensors allows (not a safetensors "
                           "file?)", name, (unsigned long long)n, STRATA_ST_MAX_HEADER);
    if (n > len - 8)
        return strata_fail("%s: header of %llu bytes runs past the end of the %s (%zu bytes)", name,
                           (unsigned long long)n, len == file_bytes ? "file" : "bytes read", len);
    if (n < 2 || b[8] != '{')
        return strata_fail("%s: the header does not start with '{' (not a safetensors file?)", name);
    *n_out = n;
    return 0;
}

/* "__metadata__": an object of strings, copied into st. */
static int parse_metadata(strata_safetensors *st, const strata_json *v, const char *name) {
    if (v->type != STRATA_JSON_OBJECT)
        return HDR_FAIL("__metadata__ must be an object of strings, got %s", strata_json_kind(v));
    st->meta_keys = strata_xcalloc(v->len ? v->len : 1, sizeof(char *));
    st->meta_values = strata_xcalloc(v->len ? v->len : 1, sizeof(char *));
    for (size_t k = 0; k < v->len; k++) {
        const strata_json_member *e = &v->members[k];
        if (e->value.type != STRATA_JSON_STRING)
            return HDR_FAIL("__metadata__ \"%s\" must be a string, got %s", e->key, strata_json_kind(&e->value));
        st->meta_keys[st->n_meta] = strata_xstrdup(e->key);
        st->meta_values[st->n_meta] = strata_xstrdup(e->value.str);
        st->n_meta++;
    }
    return 0;
}

/* A tensor's object has exactly the fields dtype, shape and data_offsets (each may be
 * missing here: the caller says which). */
static int tensor_fields(strata_safetensors *st, const strata_json_member *m, const strata_json **dtype,
                         const strata_json **shape, const strata_json **offs, const char *name) {
    const strata_json *v = &m->value;
    *dtype = *shape = *offs = NULL;
    for (size_t k = 0; k < v->len; k++) {
        const strata_json_member *e = &v->members[k];
        if (!strcmp(e->key, "dtype")) *dtype = &e->value;
        else if (!strcmp(e->key, "shape")) *shape = &e->value;
        else if (!strcmp(e->key, "data_offsets")) *offs = &e->value;
        else
            return HDR_FAIL("tensor \"%s\": unknown field \"%s\" (expected dtype, shape, data_offsets)", m->key,
                            e->key);
    }
    return 0;
}

/* t's dtype: one of the names in dtypes[]. */
static int tensor_dtype(strata_safetensors *st, strata_st_tensor *t, const char *key, const strata_json *dtype,
                        const char *name) {
    if (!dtype || dtype->type != STRATA_JSON_STRING)
        return HDR_FAIL("tensor \"%s\": \"dtype\" must be a string, got %s", key, strata_json_kind(dtype));
    int d = -1;
    for (int k = 0; k < STRATA_ST_DTYPES; k++)
        if (!strcmp(dtype->str, dtypes[k].name)) d = k;
    if (d < 0) return HDR_FAIL("tensor \"%s\": unknown dtype \"%.40s\"", key, dtype->str);
    t->dtype = (strata_st_dtype)d;
    return 0;
}

/* t's shape and element count: at most STRATA_ST_MAX_DIMS non-negative integers whose
 * product fits 64 bits. */
static int tensor_shape(strata_safetensors *st, strata_st_tensor *t, const char *key, const strata_json *shape,
                        const char *name) {
    if (!shape || shape->type != STRATA_JSON_ARRAY)
        return HDR_FAIL("tensor \"%s\": \"shape\" must be an array, got %s", key, strata_json_kind(shape));
    if (shape->len > STRATA_ST_MAX_DIMS)
        return HDR_FAIL("tensor \"%s\": %zu dimensions, more than %d", key, shape->len, STRATA_ST_MAX_DIMS);
    t->ndim = (int)shape->len;
    t->numel = 1;
    for (int k = 0; k < t->ndim; k++) {
        uint64_t dim;
        if (uint_value(&shape->items[k], &dim))
            return HDR_FAIL("tensor \"%s\": shape[%d] must be a non-negative integer", key, k);
        /* the byte count below must not overflow: bound each factor by the data size */
        if (dim && t->numel > UINT64_MAX / dim)
            return HDR_FAIL("tensor \"%s\": its shape's element count overflows 64 bits", key);
        t->shape[k] = (int64_t)dim;
        t->numel *= dim;
    }
    return 0;
}

/* t's data_offsets: [begin, end] inside the data_bytes after the header, spanning exactly
 * numel elements of its dtype. */
static int tensor_offsets(strata_safetensors *st, strata_st_tensor *t, const char *key, const strata_json *offs,
                          uint64_t data_bytes, const char *name) {
    if (!offs || offs->type != STRATA_JSON_ARRAY || offs->len != 2 || uint_value(&offs->items[0], &t->begin) ||
        uint_value(&offs->items[1], &t->end))
        return HDR_FAIL("tensor \"%s\": \"data_offsets\" must be [begin, end], two non-negative integers", key);
    if (t->begin > t->end || t->end > data_bytes)
        return HDR_FAIL("tensor \"%s\": data_offsets [%llu, %llu] lie outside the %llu bytes of data", key,
                        (unsigned long long)t->begin, (unsigned long long)t->end, (unsigned long long)data_bytes);
    uint64_t es = dtypes[t->dtype].bytes;
    if (t->numel > UINT64_MAX / es || t->end - t->begin != t->numel * es)
        return HDR_FAIL("tensor \"%s\": data_offsets span %llu bytes, but %llu %s elements take %llu", key,
                        (unsigned long long)(t->end - t->begin), (unsigned long long)t->numel, dtypes[t->dtype].name,
                        t->numel > UINT64_MAX / es ? 0ull : (unsigned long long)(t->numel * es));
    return 0;
}

/* One tensor's entry, appended to st->tensors. */
static int parse_tensor(strata_safetensors *st, const strata_json_member *m, uint64_t data_bytes, const char *name) {
    if (m->value.type != STRATA_JSON_OBJECT)
        return HDR_FAIL("tensor \"%s\": expected an object, got %s", m->key, strata_json_kind(&m->value));
    strata_st_tensor *t = &st->tensors[st->n_tensors];
    t->name = strata_xstrdup(m->key);
    st->n_tensors++;
    const strata_json *dtype, *shape, *offs;
    if (tensor_fields(st, m, &dtype, &shape, &offs, name) || tensor_dtype(st, t, m->key, dtype, name) ||
        tensor_shape(st, t, m->key, shape, name) || tensor_offsets(st, t, m->key, offs, data_bytes, name))
        return -1;
    return 0;
}

/* One member of the header object: __metadata__ or a tensor. */
static int parse_member(strata_safetensors *st, const strata_json_member *m, uint64_t data_bytes, const char *name) {
    if (strlen(m->key) != m->key_len)
        return HDR_FAIL("a tensor name holds a NUL byte (at byte %zu)", 8 + m->key_offset);
    if (!strcmp(m->key, "__metadata__")) return parse_metadata(st, &m->value, name);
    return parse_tensor(st, m, data_bytes, name);
}

/* The tensors tile the data region: no overlap, no hole, nothing after the last. */
static int check_tiling(strata_safetensors *st, uint64_t data_bytes, const char *name) {
    strata_st_tensor **order = strata_xmalloc((st->n_tensors ? st->n_tensors : 1) * sizeof *order);
    for (int i = 0; i < st->n_tensors; i++) order[i] = &st->tensors[i];
    qsort(order, st->n_tensors, sizeof *order, by_begin);
    uint64_t pos = 0;
    int rc = 0;
    for (int i = 0; i < st->n_tensors && !rc; i++) {
        const strata_st_tensor *t = order[i];
        if (t->begin < pos)
            rc = HDR_FAIL("tensor \"%s\": bytes [%llu, %llu) overlap tensor \"%s\"", t->name,
                          (unsigned long long)t->begin, (unsigned long long)t->end, order[i - 1]->name);
        else if (t->begin > pos)
            rc = HDR_FAIL("%llu bytes at data offset %llu belong to no tensor (before \"%s\")",
                          (unsigned long long)(t->begin - pos), (unsigned long long)pos, t->name);
        else pos = t->end;
    }
    free(order);
    if (rc) return -1;
    if (pos != data_bytes)
        return HDR_FAIL("the tensors end at data offset %llu, but the file has %llu bytes of data after the header",
                        (unsigned long long)pos, (unsigned long long)data_bytes);
    return 0;
}

int strata_safetensors_parse(strata_safetensors *st, const void *bytes, size_t len, uint64_t file_bytes,
                             const char *name) {
    memset(st, 0, sizeof *st);
    st->fd = -1;
    snprintf(st->path, sizeof st->path, "%s", name);
    const unsigned char *b = bytes;
    uint64_t n = 0;
    if (header_length(b, len, file_bytes, name, &n) != 0) return -1;
    char jname[1100];
    snprintf(jname, sizeof jname, "%s (header JSON, from byte 8)", name);
    strata_json_doc doc;
    if (strata_json_parse(&doc, b + 8, (size_t)n, jname)) return -1;
    const strata_json *root = &doc.root;
    if (root->type != STRATA_JSON_OBJECT) {
        strata_json_free(&doc);
        return strata_fail("%s: safetensors header: expected an object, got %s", name, strata_json_kind(root));
    }
    st->data_offset = 8 + n;
    st->file_bytes = file_bytes;
    uint64_t data_bytes = file_bytes - st->data_offset;
    st->tensors = strata_xcalloc(root->len ? root->len : 1, sizeof *st->tensors);
    int rc = 0;
    for (size_t i = 0; i < root->len && !rc; i++) rc = parse_member(st, &root->members[i], data_bytes, name);
    strata_json_free(&doc);
    if (rc) return -1;
    return check_tiling(st, data_bytes, name);
}

/* The bytes of `what` (a tensor's name, or the header) at offset. */
static int read_at(int fd, void *buf, size_t bytes, uint64_t offset, const char *path, const char *what) {
    if (strata_pread_all(fd, buf, bytes, offset, path)) return strata_fail_wrap("tensor \"%s\"", what);
    return 0;
}

int strata_safetensors_open(strata_safetensors *st, const char *path) {
    memset(st, 0, sizeof *st);
    st->fd = -1;
    /* read-only: no close of fd can lose data, so none is checked */
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd < 0) return strata_fail("%s: cannot open: %s", path, strerror(errno));
    struct stat sb;
    if (fstat(fd, &sb) != 0 || !S_ISREG(sb.st_mode)) {
        (void)close(fd);
        return strata_fail("%s: not a regular file", path);
    }
    uint64_t size = (uint64_t)sb.st_size;
    unsigned char len8[8];
    if (size < 8) {
        (void)close(fd);
        return strata_fail("%s: %llu bytes, shorter than the 8-byte header length of a safetensors file", path,
                           (unsigned long long)size);
    }
    if (read_at(fd, len8, 8, 0, path, "(header length)")) {
        (void)close(fd);
        return -1;
    }
    uint64_t n = 0;
    for (int i = 7; i >= 0; i--) n = n << 8 | len8[i];
    /* read no more than the file and the format allow; the parser reports what is wrong */
    uint64_t want = 8 + (n < STRATA_ST_MAX_HEADER ? n : 0);
    if (want > size) want = size;
    unsigned char *buf = strata_xmalloc((size_t)want);
    int rc = read_at(fd, buf, (size_t)want, 0, path, "(header)");
    if (!rc) rc = strata_safetensors_parse(st, buf, (size_t)want, size, path);
    free(buf);
    if (rc) {
        (void)close(fd);
        return -1;
    }
    st->fd = fd;
    return 0;
}

void strata_safetensors_close(strata_safetensors *st) {
    if (st->fd >= 0) (void)close(st->fd); /* read-only */
    free_fields(st);
    memset(st, 0, sizeof *st);
    st->fd = -1;
}

const strata_st_tensor *strata_safetensors_find(const strata_safetensors *st, const char *name) {
    for (int i = 0; i < st->n_tensors; i++)
        if (!strcmp(st->tensors[i].name, name)) return &st->tensors[i];
    return NULL;
}

const char *strata_safetensors_meta(const strata_safetensors *st, const char *key) {
    for (int i = 0; i < st->n_meta; i++)
        if (!strcmp(st->meta_keys[i], key)) return st->meta_values[i];
    return NULL;
}

/* IEEE half to float, exactly (subnormals, infinities and NaN included). */
static float f16_to_f32(uint16_t h) {
    uint32_t sign = (uint32_t)(h >> 15) << 31, exp = (h >> 10) & 0x1F, man = h & 0x3FF, u;
    if (exp == 0x1F) {
        u = sign | 0x7F800000u | man << 13;
    } else if (exp) {
        u = sign | (exp + 112) << 23 | man << 13;
    } else if (man) { /* subnormal: man * 2^-24, exact in fp32 */
        float f = ldexpf((float)man, -24);
        memcpy(&u, &f, 4);
        u |= sign;
    } else {
        u = sign;
    }
    float f;
    memcpy(&f, &u, 4);
    return f;
}

int strata_safetensors_read_f32(const strata_safetensors *st, const strata_st_tensor *t, uint64_t lo, uint64_t hi,
                                float *dst) {
    if (lo > hi || hi > t->numel)
        return strata_fail("%s: tensor \"%s\": elements [%llu, %llu) asked of %llu", st->path, t->name,
                           (unsigned long long)lo, (unsigned long long)hi, (unsigned long long)t->numel);
    if (st->fd < 0) return strata_fail("%s: not opened from a file", st->path);
    size_t es = dtypes[t->dtype].bytes;
    uint64_t at = st->data_offset + t->begin + lo * es;
    if (t->dtype == STRATA_ST_F32) return read_at(st->fd, dst, (size_t)(hi - lo) * 4, at, st->path, t->name);
    if (t->dtype != STRATA_ST_F16 && t->dtype != STRATA_ST_BF16 && t->dtype != STRATA_ST_F64)
        return strata_fail("%s: tensor \"%s\" has dtype %s; Strata reads weights stored as F32, F16, BF16 or F64",
                           st->path, t->name, dtypes[t->dtype].name);
    enum { CHUNK = 1 << 16 };
    unsigned char *buf = strata_xmalloc(CHUNK * es);
    int rc = 0;
    for (uint64_t i = lo; i < hi && !rc; i += CHUNK) {
        size_t n = (size_t)(hi - i < CHUNK ? hi - i : CHUNK);
        rc = read_at(st->fd, buf, n * es, at + (i - lo) * es, st->path, t->name);
        float *out = dst + (i - lo);
        for (size_t k = 0; k < n && !rc; k++) {
            if (t->dtype == STRATA_ST_F64) {
                double v;
                memcpy(&v, buf + 8 * k, 8);
                out[k] = (float)v;
            } else {
                uint16_t h;
                memcpy(&h, buf + 2 * k, 2);
                out[k] = t->dtype == STRATA_ST_BF16 ? strata_bf16_to_f32(h) : f16_to_f32(h);
            }
        }
    }
    free(buf);
    return rc;
}
