/* io/tensorboard.c: TensorBoard event files (io/tensorboard.h): the record framing, the
 * few protobuf messages a run writes, encoded by hand, the cut-back of a resume, and the
 * writer. */
#include "io/tensorboard.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/common.h"
#include "io/files.h"

#define FILE_PREFIX "events.out.tfevents."
/* A resume's rewrite goes through this name, which holds no "tfevents": TensorBoard reads
 * every file whose name does, and must never read a half-written copy. */
#define TMP_NAME ".strata-events.tmp"
#define MAX_RECORD ((uint64_t)1 << 30)

/* ---- protobuf, by hand: varints, length-delimited fields, fixed32/fixed64 ---- */

enum { WIRE_VARINT = 0, WIRE_FIXED64 = 1, WIRE_LEN = 2, WIRE_FIXED32 = 5 };

static void pb_varint(strata_sbuf *b, uint64_t v) {
    char c[10];
    int n = 0;
    do {
        c[n] = (char)(v & 0x7f);
        v >>= 7;
        if (v) c[n] |= (char)0x80;
        n++;
    } while (v);
    strata_sbuf_putn(b, c, (size_t)n);
}

static void pb_key(strata_sbuf *b, int field, int wire) { pb_varint(b, (uint64_t)field << 3 | (uint64_t)wire); }

static void pb_le(strata_sbuf *b, uint64_t bits, int bytes) {
    char c[8];
    for (int i = 0; i < bytes; i++) c[i] = (char)(bits >> (8 * i));
    strata_sbuf_putn(b, c, (size_t)bytes);
}

static void pb_bytes(strata_sbuf *b, int field, const void *data, size_t len) {
    pb_key(b, field, WIRE_LEN);
    pb_varint(b, len);
    strata_sbuf_putn(b, data, len);
}

static void pb_string(strata_sbuf *b, int field, const char *s) { pb_bytes(b, field, s, strlen(s)); }

static void pb_double(strata_sbuf *b, int field, double v) {
    uint64_t bits;
    memcpy(&bits, &v, sizeof bits);
    pb_key(b, field, WIRE_FIXED64);
    pb_le(b, bits, 8);
}

static void pb_float(strata_sbuf *b, int field, float v) {
    uint32_t bits;
    memcpy(&bits, &v, sizeof bits);
    pb_key(b, field, WIRE_FIXED32);
    pb_le(b, bits, 4);
}

/* int64: a varint of its two's complement (10 bytes when negative), left out at 0 */
static void pb_int64(strata_sbuf *b, int field, int64_t v) {
    if (!v) return;
    pb_key(b, field, WIRE_VARINT);
    pb_varint(b, (uint64_t)v);
}

/* A message field: its bytes were made in sub, which is emptied. */
static void pb_message(strata_sbuf *b, int field, strata_sbuf *sub) {
    pb_bytes(b, field, sub->p ? sub->p : "", sub->len);
    sub->len = 0;
}

/* Field numbers (tensorflow/core/util/event.proto, framework/summary.proto, tensor.proto). */
enum {
    EVENT_WALL_TIME = 1, EVENT_STEP = 2, EVENT_FILE_VERSION = 3, EVENT_SUMMARY = 5,
    SUMMARY_VALUE = 1,
    VALUE_TAG = 1, VALUE_SIMPLE = 2, VALUE_TENSOR = 8, VALUE_METADATA = 9,
    METADATA_PLUGIN_DATA = 1, PLUGIN_NAME = 1,
    TENSOR_DTYPE = 1, TENSOR_SHAPE = 2, TENSOR_STRING_VAL = 8,
    DT_STRING = 7,
};

/* The Event around a Summary's bytes (sum), emptied. */
static void event_with_summary(strata_sbuf *out, double wall_time, int64_t step, strata_sbuf *sum) {
    pb_double(out, EVENT_WALL_TIME, wall_time);
    pb_int64(out, EVENT_STEP, step);
    pb_message(out, EVENT_SUMMARY, sum);
}

void strata_tb_event_file_version(strata_sbuf *out, double wall_time) {
    pb_double(out, EVENT_WALL_TIME, wall_time);
    pb_string(out, EVENT_FILE_VERSION, "brain.Event:2");
}

void strata_tb_event_scalars(strata_sbuf *out, double wall_time, int64_t step, const strata_tb_scalar *v, int n) {
    strata_sbuf sum = {0}, val = {0};
    for (int i = 0; i < n; i++) {
        pb_string(&val, VALUE_TAG, v[i].tag);
        pb_float(&val, VALUE_SIMPLE, v[i].value);
        pb_message(&sum, SUMMARY_VALUE, &val);
    }
    event_with_summary(out, wall_time, step, &sum);
    strata_sbuf_free(&sum);
    strata_sbuf_free(&val);
}

/* As tensorboard.plugins.text.summary_v2.text_pb makes it: a scalar DT_STRING tensor (an
 * empty shape), and metadata naming the text plugin with empty content (TextPluginData
 * version 0, all defaults, encodes to nothing). Fields in number order, as protobuf
 * writes them. */
void strata_tb_event_text(strata_sbuf *out, double wall_time, int64_t step, const char *tag, const char *text) {
    strata_sbuf sum = {0}, val = {0}, sub = {0}, sub2 = {0};
    pb_string(&val, VALUE_TAG, tag);
    pb_key(&sub, TENSOR_DTYPE, WIRE_VARINT);
    pb_varint(&sub, DT_STRING);
    pb_message(&sub, TENSOR_SHAPE, &sub2); /* a scalar: the shape is set, with no dims */
    pb_string(&sub, TENSOR_STRING_VAL, text);
    pb_message(&val, VALUE_TENSOR, &sub);
    pb_string(&sub2, PLUGIN_NAME, "text");
    pb_message(&sub, METADATA_PLUGIN_DATA, &sub2);
    pb_message(&val, VALUE_METADATA, &sub);
    pb_message(&sum, SUMMARY_VALUE, &val);
    event_with_summary(out, wall_time, step, &sum);
    strata_sbuf_free(&sum);
    strata_sbuf_free(&val);
    strata_sbuf_free(&sub);
    strata_sbuf_free(&sub2);
}

/* ---- records ---- */

uint32_t strata_tb_masked_crc(const void *data, size_t len) {
    uint32_t crc = strata_crc32c(0, data, len);
    return ((crc >> 15) | (crc << 17)) + 0xa282ead8u;
}

static uint32_t le32(const unsigned char *p) {
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

void strata_tb_frame(strata_sbuf *out, const void *data, size_t len) {
    strata_sbuf head = {0};
    pb_le(&head, (uint64_t)len, 8);
    strata_sbuf_putn(out, head.p, 8);
    pb_le(out, strata_tb_masked_crc(head.p, 8), 4);
    strata_sbuf_putn(out, data, len);
    pb_le(out, strata_tb_masked_crc(data, len), 4);
    strata_sbuf_free(&head);
}

int strata_tb_read_record(FILE *f, strata_sbuf *data, const char **why) {
    unsigned char head[12], tail[4];
    size_t got = fread(head, 1, sizeof head, f);
    if (got == 0 && !ferror(f)) return 0;
    if (got < sizeof head) {
        *why = ferror(f) ? "a read error" : "a header cut short";
        return -1;
    }
    if (strata_tb_masked_crc(head, 8) != le32(head + 8)) {
        *why = "a header whose checksum does not match";
        return -1;
    }
    uint64_t len = (uint64_t)le32(head) | (uint64_t)le32(head + 4) << 32;
    if (len > MAX_RECORD) {
        *why = "a record longer than 1 GiB";
        return -1;
    }
    data->len = 0;
    strata_sbuf_putn(data, "", 0);
    for (uint64_t done = 0; done < len;) { /* a piece at a time: a length is only trusted as far as bytes come */
        char piece[65536];
        size_t want = len - done < sizeof piece ? (size_t)(len - done) : sizeof piece;
        size_t n = fread(piece, 1, want, f);
        strata_sbuf_putn(data, piece, n);
        done += n;
        if (n < want) {
            *why = ferror(f) ? "a read error" : "data cut short";
            return -1;
        }
    }
    if (fread(tail, 1, sizeof tail, f) < sizeof tail) {
        *why = ferror(f) ? "a read error" : "a data checksum cut short";
        return -1;
    }
    if (strata_tb_masked_crc(data->p, data->len) != le32(tail)) {
        *why = "data whose checksum does not match";
        return -1;
    }
    return 1;
}

/* ---- decoding, as far as a resume needs ---- */

static int pb_read_varint(const unsigned char **p, const unsigned char *end, uint64_t *v) {
    *v = 0;
    for (int shift = 0; shift < 64; shift += 7) {
        if (*p == end) return -1;
        unsigned char c = *(*p)++;
        *v |= (uint64_t)(c & 0x7f) << shift;
        if (!(c & 0x80)) return 0;
    }
    return -1;
}

/* Skips the value of a field of this wire type; for WIRE_LEN, its bytes go to *sub, *sub_len. */
static int pb_skip(const unsigned char **p, const unsigned char *end, int wire, const unsigned char **sub,
                   size_t *sub_len) {
    uint64_t v;
    switch (wire) {
    case WIRE_VARINT: return pb_read_varint(p, end, &v);
    case WIRE_FIXED64: if (end - *p < 8) return -1; *p += 8; return 0;
    case WIRE_FIXED32: if (end - *p < 4) return -1; *p += 4; return 0;
    case WIRE_LEN:
        if (pb_read_varint(p, end, &v) || v > (uint64_t)(end - *p)) return -1;
        if (sub) *sub = *p, *sub_len = (size_t)v;
        *p += v;
        return 0;
    default: return -1; /* groups: not in these messages */
    }
}

/* Calls each field of message [p, end): its number, wire type, and its value (the varint,
 * or the bytes of a length-delimited one). */
typedef int (*pb_field_fn)(void *ctx, int field, int wire, uint64_t varint, const unsigned char *sub, size_t sub_len);
static int pb_walk(const unsigned char *p, size_t len, pb_field_fn fn, void *ctx) {
    const unsigned char *end = p + len;
    while (p < end) {
        uint64_t key, v = 0;
        const unsigned char *sub = NULL;
        size_t sub_len = 0;
        if (pb_read_varint(&p, end, &key)) return -1;
        int wire = (int)(key & 7);
        if (wire == WIRE_VARINT) {
            if (pb_read_varint(&p, end, &v)) return -1;
        } else if (pb_skip(&p, end, wire, &sub, &sub_len)) {
            return -1;
        }
        if (fn(ctx, (int)(key >> 3), wire, v, sub, sub_len)) return -1;
    }
    return 0;
}

typedef struct event_info {
    int64_t step;
    int has_metadata;
} event_info;

static int value_field(void *ctx, int field, int wire, uint64_t v, const unsigned char *sub, size_t n) {
    (void)v, (void)sub, (void)n;
    if (field == VALUE_METADATA && wire == WIRE_LEN) ((event_info *)ctx)->has_metadata = 1;
    return 0;
}

static int summary_field(void *ctx, int field, int wire, uint64_t v, const unsigned char *sub, size_t n) {
    (void)v;
    if (field == SUMMARY_VALUE && wire == WIRE_LEN) return pb_walk(sub, n, value_field, ctx);
    return 0;
}

static int event_field(void *ctx, int field, int wire, uint64_t v, const unsigned char *sub, size_t n) {
    event_info *e = ctx;
    if (field == EVENT_STEP && wire == WIRE_VARINT) e->step = (int64_t)v;
    else if (field == EVENT_SUMMARY && wire == WIRE_LEN) return pb_walk(sub, n, summary_field, ctx);
    return 0;
}

int strata_tb_event_info(const unsigned char *data, size_t len, int64_t *step, int *has_metadata) {
    event_info e = {0, 0};
    if (pb_walk(data, len, event_field, &e)) return -1;
    *step = e.step;
    *has_metadata = e.has_metadata;
    return 0;
}

/* ---- the directory's files ---- */

/* The names of the events files in dir (regular files named events.out.tfevents.*),
 * sorted: the newest last, as the time in their names sorts. *names is freed by the
 * caller (each name, then the array). */
static int list_events(const char *dir, char ***names, int *n) {
    *names = NULL;
    *n = 0;
    DIR *d = opendir(dir);
    if (!d) return strata_fail("%s: cannot list its TensorBoard events: %s", dir, strerror(errno));
    struct dirent *e;
    int cap = 0;
    while ((e = readdir(d))) {
        if (strncmp(e->d_name, FILE_PREFIX, strlen(FILE_PREFIX))) continue;
        if (*n == cap) {
            cap = cap ? 2 * cap : 8;
            *names = strata_xrealloc(*names, (size_t)cap * sizeof **names);
        }
        (*names)[(*n)++] = strata_xstrdup(e->d_name);
    }
    (void)closedir(d); /* a directory read to its end: nothing to lose */
    for (int i = 1; i < *n; i++) /* a handful of names: insertion sort */
        for (int j = i; j > 0 && strcmp((*names)[j - 1], (*names)[j]) > 0; j--) {
            char *t = (*names)[j];
            (*names)[j] = (*names)[j - 1];
            (*names)[j - 1] = t;
        }
    return 0;
}

static void free_names(char **names, int n) {
    for (int i = 0; i < n; i++) free(names[i]);
    free(names);
}

/* Rewrites path keeping its whole records of steps up to keep (at keep itself, not those
 * with plugin metadata: the resumed run writes its memory plan there again), through tmp;
 * the original is replaced only when something was dropped, and is untouched on any
 * failure. *dropped counts the records left out; *torn says where a torn or corrupt
 * record ended what was kept (-1: none); *last_scalars is raised to the step of the
 * newest kept Event without plugin metadata (a step's scalars). */
static int cut_back(const char *path, const char *tmp, int64_t keep, int *dropped, long *torn, const char **why,
                    int64_t *last_scalars) {
    *dropped = 0;
    *torn = -1;
    FILE *in = fopen(path, "rb");
    if (!in) return strata_fail("%s: cannot read: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fileno(in), &st) != 0 || !S_ISREG(st.st_mode)) {
        (void)fclose(in); /* read-only */
        return strata_fail("%s is not a regular file: cannot cut it back to the resumed step", path);
    }
    FILE *out = fopen(tmp, "wb");
    if (!out) {
        int e = errno;
        (void)fclose(in); /* read-only */
        return strata_fail("%s: cannot create: %s", tmp, strerror(e));
    }
    strata_sbuf data = {0}, rec = {0};
    int e = 0, r;
    long at = 0;
    while ((r = strata_tb_read_record(in, &data, why)) == 1) {
        int64_t step = 0;
        int meta = 0;
        /* a record that is not an Event of ours is kept: it is not ours to judge */
        int known = strata_tb_event_info((const unsigned char *)data.p, data.len, &step, &meta) == 0;
        if (known && (step > keep || (step == keep && meta))) {
            ++*dropped;
        } else {
            if (known && !meta && step > *last_scalars) *last_scalars = step;
            rec.len = 0;
            strata_tb_frame(&rec, data.p, data.len);
            if (fwrite(rec.p, 1, rec.len, out) != rec.len) {
                e = errno ? errno : EIO;
                break;
            }
        }
        at = ftell(in);
    }
    if (r < 0 && !e) {
        if (ferror(in)) e = errno ? errno : EIO;
        else *torn = at;
    }
    strata_sbuf_free(&data);
    strata_sbuf_free(&rec);
    (void)fclose(in); /* read-only */
    int changed = *dropped > 0 || *torn >= 0;
    if (!e && changed && (fflush(out) != 0 || fsync(fileno(out)) != 0)) e = errno;
    if (fclose(out) != 0 && !e && changed) e = errno;
    if (!e && changed && rename(tmp, path) != 0) e = errno;
    if (e || !changed) (void)unlink(tmp); /* nothing to keep of it: the original stands */
    if (e)
        return strata_fail("%s: cutting it back to step %lld through %s failed: %s (errno %d)", path, (long long)keep,
                           tmp, strerror(e), e);
    return 0;
}

/* ---- the writer ---- */

struct strata_tb_writer {
    int fd;
    char path[STRATA_PATH_MAX + 128];
    off_t good_bytes; /* the file's length after its last whole record */
    int64_t last_kept; /* a resume: the newest step whose scalars the files kept */
    strata_sbuf event, record;
};

static double wall_clock(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (double)ts.tv_sec + ts.tv_nsec * 1e-9;
}

/* One record of w->event; on failure the file is cut back to its last whole record. */
static int write_record(strata_tb_writer *w) {
    w->record.len = 0;
    strata_tb_frame(&w->record, w->event.p, w->event.len);
    w->event.len = 0;
    if (strata_write_all(w->fd, w->record.p, w->record.len, w->path)) {
        if (ftruncate(w->fd, w->good_bytes) != 0)
            STRATA_WARN("tb", "%s: cannot cut back its partial last record: %s", w->path, strerror(errno));
        return -1;
    }
    w->good_bytes += (off_t)w->record.len;
    return 0;
}

/* A new events file in dir, opened for appending, with its file_version record. */
static int create_file(strata_tb_writer *w, const char *dir) {
    char host[256];
    if (gethostname(host, sizeof host - 1) != 0) snprintf(host, sizeof host, "localhost"); /* only part of a name */
    host[sizeof host - 1] = 0;
    for (char *c = host; *c; c++)
        if (*c == '/') *c = '_';
    char name[STRATA_PATH_MAX];
    snprintf(name, sizeof name, FILE_PREFIX "%010lld.%s", (long long)time(NULL), host);
    if (strata_path_join(w->path, sizeof w->path, dir, name)) return -1;
    w->fd = open(w->path, O_WRONLY | O_CREAT | O_EXCL | O_APPEND | O_CLOEXEC, 0644);
    if (w->fd < 0) return strata_fail("%s: cannot create: %s", w->path, strerror(errno));
    strata_tb_event_file_version(&w->event, wall_clock());
    return write_record(w);
}

/* A fresh run: the events files an earlier run left in dir go, as metrics.jsonl is
 * rewritten, so TensorBoard shows this run alone. */
static int remove_earlier(const char *dir, char **names, int n) {
    char path[STRATA_PATH_MAX + 128], list[512] = "";
    for (int i = 0; i < n; i++) {
        if (strata_path_join(path, sizeof path, dir, names[i])) return -1;
        if (unlink(path) != 0)
            return strata_fail("%s: cannot remove the events file of an earlier run: %s", path, strerror(errno));
        size_t o = strlen(list);
        snprintf(list + o, sizeof list - o, "%s%s", i ? ", " : "", names[i]);
    }
    if (n) STRATA_INFO("tb", "a fresh run: removed %d TensorBoard events file%s an earlier run left in %s: %s", n,
                       n == 1 ? "" : "s", dir, list);
    return 0;
}

/* A resume: every file cut back to resume_step, then the newest appended to. */
static int resume_files(strata_tb_writer *w, const char *dir, char **names, int n, int64_t resume_step) {
    char path[STRATA_PATH_MAX + 128], tmp[STRATA_PATH_MAX + 64];
    if (strata_path_join(tmp, sizeof tmp, dir, TMP_NAME)) return -1;
    for (int i = 0; i < n; i++) {
        if (strata_path_join(path, sizeof path, dir, names[i])) return -1;
        int dropped = 0;
        long torn = -1;
        const char *why = "";
        if (cut_back(path, tmp, resume_step, &dropped, &torn, &why, &w->last_kept)) return -1;
        if (torn >= 0)
            STRATA_INFO("tb", "%s: byte %ld starts %s (a run killed while writing it?): the file is kept up to there",
                        path, torn, why);
        if (dropped)
            STRATA_DEBUG("tb", "%s: %d record%s past step %lld dropped", path, dropped, dropped == 1 ? "" : "s",
                         (long long)resume_step);
    }
    if (n && strata_fsync_dir(dir)) return -1;
    if (!n) return create_file(w, dir);
    if (strata_path_join(w->path, sizeof w->path, dir, names[n - 1])) return -1;
    w->fd = open(w->path, O_WRONLY | O_APPEND | O_CLOEXEC);
    if (w->fd < 0) return strata_fail("%s: cannot open to append: %s", w->path, strerror(errno));
    struct stat st;
    if (fstat(w->fd, &st) != 0) return strata_fail("%s: cannot stat: %s", w->path, strerror(errno));
    w->good_bytes = st.st_size;
    return 0;
}

int strata_tb_open(strata_tb_writer **out, const char *dir, int64_t resume_step) {
    *out = NULL;
    if (strata_mkdir_p(dir)) return -1;
    char tmp[STRATA_PATH_MAX + 64];
    if (strata_path_join(tmp, sizeof tmp, dir, TMP_NAME)) return -1;
    if (unlink(tmp) == 0) STRATA_INFO("tb", "removed %s, left by a run killed while resuming", tmp);
    char **names;
    int n;
    if (list_events(dir, &names, &n)) return -1;
    strata_tb_writer *w = strata_xcalloc(1, sizeof *w);
    w->fd = -1;
    int rc = resume_step < 0 ? remove_earlier(dir, names, n) || create_file(w, dir)
                             : resume_files(w, dir, names, n, resume_step);
    free_names(names, n);
    if (rc) {
        if (w->fd >= 0) (void)close(w->fd); /* already failing: the open's error is the one to report */
        w->fd = -1;
        STRATA_IGNORE(strata_tb_close(w));
        return -1;
    }
    *out = w;
    return 0;
}

const char *strata_tb_path(const strata_tb_writer *w) { return w->path; }

int64_t strata_tb_last_kept(const strata_tb_writer *w) { return w->last_kept; }

int strata_tb_write_scalars(strata_tb_writer *w, int64_t step, const strata_tb_scalar *v, int n) {
    strata_tb_event_scalars(&w->event, wall_clock(), step, v, n);
    return write_record(w);
}

int strata_tb_write_text(strata_tb_writer *w, int64_t step, const char *tag, const char *text) {
    strata_tb_event_text(&w->event, wall_clock(), step, tag, text);
    return write_record(w);
}

int strata_tb_close(strata_tb_writer *w) {
    if (!w) return 0;
    int rc = 0;
    if (w->fd >= 0 && close(w->fd) != 0) {
        int e = errno;
        rc = strata_fail("closing %s failed: %s (errno %d)", w->path, strerror(e), e);
    }
    strata_sbuf_free(&w->event);
    strata_sbuf_free(&w->record);
    free(w);
    return rc;
}
