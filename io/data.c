/* io/data.c: llm.c-format token shards (write, mmap, validate), text preparation (bytes,
 * or a BPE's ids through io/bpe.c), the chunked batch reader with per-epoch seeded
 * shuffling, and llm.c's GPT-2 tokenizer file for decoding samples. See io/data.h for
 * the formats. */
#include "io/data.h"

#include "core/common.h"
#include "io/bpe.h"
#include "io/files.h"
#include "io/text.h"

#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <glob.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

/* Shards and tokenizer files are little-endian; we read and write them by memcpy. */
#if defined(__BYTE_ORDER__) && __BYTE_ORDER__ != __ORDER_LITTLE_ENDIAN__
#error "io/data.c assumes a little-endian host (llm.c shard format)"
#endif

#define HEADER_BYTES (STRATA_SHARD_HEADER_INTS * sizeof(int32_t))
#define TOKENIZER_MAGIC 20240328u
/* Stream id that separates the shuffle's random numbers from every other use of a seed. */
#define SHUFFLE_STREAM 0x53485546464C45ull /* "SHUFFLE" */

/* ---- shards ---- */

/* Writes header and up to two payloads as path, atomically. */
static int write_shard_file(const char *path, const int32_t *header, const void *a, size_t a_bytes, const void *b,
                            size_t b_bytes) {
    char tmp[PATH_MAX];
    if (snprintf(tmp, sizeof tmp, "%s.tmp", path) >= (int)sizeof tmp)
        return strata_fail("%s: path too long", path);
    /* On a failure the temporary file is abandoned: closing and removing it is best
     * effort (path itself is untouched, and a shard glob does not match "*.bin.tmp"). */
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0644);
    if (fd < 0) return strata_fail("%s: cannot create: %s", tmp, strerror(errno));
    if (strata_write_all(fd, header, HEADER_BYTES, tmp) != 0 || (a_bytes && strata_write_all(fd, a, a_bytes, tmp) != 0) ||
        (b_bytes && strata_write_all(fd, b, b_bytes, tmp) != 0)) {
        (void)close(fd);
        (void)unlink(tmp);
        return -1;
    }
    if (fsync(fd) != 0) {
        int err = errno;
        (void)close(fd);
        (void)unlink(tmp);
        return strata_fail("%s: fsync failed: %s", tmp, strerror(err));
    }
    if (close(fd) != 0) {
        int err = errno;
        (void)unlink(tmp);
        return strata_fail("%s: close failed: %s", tmp, strerror(err));
    }
    if (rename(tmp, path) != 0) {
        int err = errno;
        (void)unlink(tmp);
        return strata_fail("%s: cannot rename %s into place: %s", path, tmp, strerror(err));
    }
    char dir[PATH_MAX];
    strata_path_dir(dir, sizeof dir, path);
    return strata_fsync_dir(dir); /* the rename survives a crash */
}

static int check_count(const char *path, size_t n_tokens) {
    if (n_tokens > (size_t)INT32_MAX)
        return strata_fail("%s: %zu tokens do not fit one shard (the header counts in int32; "
                           "split into shards of at most %d tokens)",
                           path, n_tokens, INT32_MAX);
    return 0;
}

int strata_shard_write(const char *path, const uint16_t *tokens, size_t n_tokens) {
    STRATA_TRY(check_count(path, n_tokens));
    int32_t header[STRATA_SHARD_HEADER_INTS] = {0};
    header[0] = STRATA_SHARD_MAGIC;
    header[1] = STRATA_SHARD_VERSION;
    header[2] = (int32_t)n_tokens;
    return write_shard_file(path, header, tokens, n_tokens * sizeof(uint16_t), NULL, 0);
}

int strata_shard_write32(const char *path, const uint32_t *tokens, const uint8_t *mask, size_t n_tokens, int seq_len,
                         int docs) {
    STRATA_TRY(check_count(path, n_tokens));
    if (seq_len < 0) return strata_fail("%s: packed sequence length %d is negative", path, seq_len);
    int32_t header[STRATA_SHARD_HEADER_INTS] = {0};
    header[0] = STRATA_SHARD_MAGIC;
    header[1] = STRATA_SHARD_VERSION_32;
    header[2] = (int32_t)n_tokens;
    header[3] = mask ? STRATA_SHARD_FLAG_MASK | (docs ? STRATA_SHARD_FLAG_DOCS : 0) : 0;
    header[4] = seq_len;
    return write_shard_file(path, header, tokens, n_tokens * sizeof(uint32_t), mask, mask ? n_tokens : 0);
}

/* Why header h does not describe a shard of `payload` bytes, in msg; NULL when it does.
 * Sets *bits (16 or 32), *masked and *docs (the mask marks document starts). */
static const char *header_problem(const int32_t *h, size_t payload, char *msg, size_t n, int *bits, int *masked,
                                  int *docs) {
    *bits = 16;
    *masked = 0;
    *docs = 0;
    if (h[0] == STRATA_SHARD_MAGIC) {
        if (h[1] == STRATA_SHARD_VERSION_32) {
            *bits = 32;
            if (h[3] & ~(STRATA_SHARD_FLAG_MASK | STRATA_SHARD_FLAG_DOCS)) {
                snprintf(msg, n, "flags 0x%x in header[3] name bits this reader does not know (only bit 0, the loss "
                         "mask, and bit 1, document starts)", (unsigned)h[3]);
                return msg;
            }
            if ((h[3] & STRATA_SHARD_FLAG_DOCS) && !(h[3] & STRATA_SHARD_FLAG_MASK)) {
                snprintf(msg, n, "flags 0x%x in header[3]: bit 1 (document starts, kept in the mask) without bit 0 "
                         "(a mask)", (unsigned)h[3]);
                return msg;
            }
            *masked = h[3] & STRATA_SHARD_FLAG_MASK;
            *docs = (h[3] & STRATA_SHARD_FLAG_DOCS) != 0;
            if (h[4] < 0) {
                snprintf(msg, n, "header[4], the packed sequence length, is %d (negative; corrupt header)", h[4]);
                return msg;
            }
        } else if (h[1] != STRATA_SHARD_VERSION) {
            snprintf(msg, n, "unsupported shard version %d (expected %d, uint16 tokens, or %d, uint32 tokens)", h[1],
                     STRATA_SHARD_VERSION, STRATA_SHARD_VERSION_32);
            return msg;
        }
    } else if (h[0] == STRATA_SHARD_LLMC32_MAGIC) {
        if (h[1] != STRATA_SHARD_LLMC32_VERSION) {
            snprintf(msg, n, "unsupported llm.c Llama 3 shard version %d (expected %d)", h[1], STRATA_SHARD_LLMC32_VERSION);
            return msg;
        }
        *bits = 32;
    } else {
        snprintf(msg, n, "bad magic %d (expected %d; not a token shard)", h[0], STRATA_SHARD_MAGIC);
        return msg;
    }
    size_t per = (size_t)(*bits / 8) + (size_t)*masked; /* bytes per token */
    const char *unit = *masked ? "uint32 tokens and their mask bytes" : *bits == 32 ? "uint32 tokens" : "uint16 tokens";
    if (h[2] < 0) {
        snprintf(msg, n, "header says %d tokens (negative; corrupt header)", h[2]);
        return msg;
    }
    if (payload / per != (size_t)h[2]) {
        snprintf(msg, n, "header says %d tokens but the file holds %zu", h[2], payload / per);
        return msg;
    }
    if (payload % per != 0) {
        snprintf(msg, n, "%zu bytes after the header are not a whole number of %s", payload, unit);
        return msg;
    }
    return NULL;
}

int strata_shard_open(strata_shard *sh, const char *path) {
    memset(sh, 0, sizeof *sh);
    if (snprintf(sh->path, sizeof sh->path, "%s", path) >= (int)sizeof sh->path)
        return strata_fail("%s: path longer than %zu bytes", path, sizeof sh->path - 1);
    /* a FIFO must not block the open; fd is read-only, so no close of it is checked */
    int fd = open(path, O_RDONLY | O_CLOEXEC | O_NONBLOCK);
    if (fd < 0) return strata_fail("%s: cannot open token shard: %s", path, strerror(errno));
    struct stat st;
    if (fstat(fd, &st) != 0) {
        int err = errno;
        (void)close(fd);
        return strata_fail("%s: cannot stat: %s", path, strerror(err));
    }
    if (!S_ISREG(st.st_mode)) {
        (void)close(fd);
        strata_fail("%s: is %s, not a token shard file (data.train and data.val name shard files, e.g. "
                    "\"data/train_*.bin\")",
                    path, strata_file_kind(st.st_mode));
        return STRATA_DATA_NOT_SHARDS;
    }
    size_t bytes = (size_t)st.st_size;
    if (bytes < HEADER_BYTES) {
        (void)close(fd);
        return strata_fail("%s: file is %zu bytes, shorter than the %zu-byte shard header "
                           "(not a token shard, or truncated)",
                           path, bytes, (size_t)HEADER_BYTES);
    }
    void *map = mmap(NULL, bytes, PROT_READ, MAP_PRIVATE, fd, 0);
    int err = errno;
    (void)close(fd); /* the mapping keeps the file alive */
    if (map == MAP_FAILED) return strata_fail("%s: mmap failed: %s", path, strerror(err));

    int32_t h[5];
    memcpy(h, map, sizeof h);
    char msg[256];
    int bits, masked, docs;
    const char *why = header_problem(h, bytes - HEADER_BYTES, msg, sizeof msg, &bits, &masked, &docs);
    if (why) {
        (void)munmap(map, bytes); /* our own whole mapping: it cannot fail */
        return strata_fail("%s: %s", path, why);
    }
    sh->map = map;
    sh->map_bytes = bytes;
    sh->n_tokens = (size_t)h[2];
    sh->seq_len = bits == 32 && h[0] == STRATA_SHARD_MAGIC ? h[4] : 0;
    const char *payload = (const char *)map + HEADER_BYTES;
    if (bits == 16) sh->tokens = (const uint16_t *)payload;
    else sh->tokens32 = (const uint32_t *)payload;
    if (masked) sh->mask = (const uint8_t *)payload + sh->n_tokens * sizeof(uint32_t);
    sh->docs = docs;
    return 0;
}

void strata_shard_close(strata_shard *sh) {
    if (sh->map) (void)munmap(sh->map, sh->map_bytes); /* our own whole mapping: it cannot fail */
    memset(sh, 0, sizeof *sh);
}

int strata_shards_info(const char *glob_pattern, int *wide, int *seq_len, int *docs) {
    *wide = 0;
    *seq_len = 0;
    if (docs) *docs = 0;
    glob_t g;
    int grc = glob(glob_pattern, 0, NULL, &g);
    if (grc == GLOB_NOMATCH) return strata_fail("no token shards match '%s'", glob_pattern);
    if (grc != 0) return strata_fail("'%s': glob failed (code %d)", glob_pattern, grc);
    int rc = 0;
    for (size_t i = 0; i < g.gl_pathc && !rc; i++) {
        strata_shard sh;
        rc = strata_shard_open(&sh, g.gl_pathv[i]) ? -1 : 0;
        if (!rc && sh.tokens32) *wide = 1;
        if (!rc && sh.docs && docs) *docs = 1;
        if (!rc && i == 0) *seq_len = sh.seq_len;
        else if (!rc && sh.seq_len != *seq_len) *seq_len = -1;
        strata_shard_close(&sh);
    }
    globfree(&g);
    return rc;
}

int strata_shards_mark_documents(const char *glob_pattern) {
    int wide, seq_len, docs = 0;
    if (!glob_pattern[0]) return 0;
    if (strata_shards_info(glob_pattern, &wide, &seq_len, &docs)) docs = 0;
    return docs;
}

/* ---- the shards of one split, as they fill ---- */

void strata_shard_sink_init(strata_shard_sink *s, const char *dir, const char *prefix, size_t max_tokens, int wide,
                            int masked, int seq_len) {
    memset(s, 0, sizeof *s);
    snprintf(s->out_dir, sizeof s->out_dir, "%s", dir);
    s->prefix = prefix;
    s->max_tokens = max_tokens;
    s->wide = wide || masked;
    s->masked = masked & STRATA_SHARD_FLAG_MASK;
    s->docs = s->masked && (masked & STRATA_SHARD_FLAG_DOCS);
    s->seq_len = seq_len;
}

void strata_shard_sink_free(strata_shard_sink *s) {
    free(s->buf16);
    free(s->buf32);
    free(s->mask);
    s->buf16 = NULL;
    s->buf32 = NULL;
    s->mask = NULL;
    s->len = s->cap = 0;
}

static int sink_flush(strata_shard_sink *s) {
    if (s->len == 0 || (s->seq_len && s->n_shards > 0 && s->len == 1)) return 0;
    char path[PATH_MAX];
    snprintf(path, sizeof path, "%s/%s_%06d.bin", s->out_dir, s->prefix, s->n_shards);
    int rc = s->wide ? strata_shard_write32(path, s->buf32, s->masked ? s->mask : NULL, s->len, s->seq_len, s->docs)
                     : strata_shard_write(path, s->buf16, s->len);
    if (rc) return -1;
    STRATA_DEBUG("data", "%s: %zu tokens", path, s->len);
    size_t carried = s->seq_len && s->n_shards > 0 ? 1 : 0; /* counted with the shard before */
    s->total += s->len - carried;
    for (size_t i = carried; i < s->len; i++) s->learned += s->masked ? s->mask[i] & STRATA_MASK_LEARNED : 1;
    s->n_shards++;
    if (s->seq_len) { /* the last token begins the next shard */
        if (s->wide) s->buf32[0] = s->buf32[s->len - 1];
        else s->buf16[0] = s->buf16[s->len - 1];
        if (s->masked) s->mask[0] = s->mask[s->len - 1];
        s->len = 1;
    } else {
        s->len = 0;
    }
    return 0;
}

int strata_shard_sink_push(strata_shard_sink *s, const int32_t *ids, const uint8_t *mask, size_t n) {
    while (n > 0) {
        if (s->len == s->cap) {
            /* Grow toward max_tokens rather than allocating it up front: small inputs
             * with a large shard limit stay small. */
            size_t cap = s->cap ? s->cap * 2 : 1 << 16;
            if (cap > s->max_tokens) cap = s->max_tokens;
            if (s->wide) s->buf32 = strata_xrealloc(s->buf32, cap * sizeof *s->buf32);
            else s->buf16 = strata_xrealloc(s->buf16, cap * sizeof *s->buf16);
            if (s->masked) s->mask = strata_xrealloc(s->mask, cap);
            s->cap = cap;
        }
        size_t take = s->cap - s->len;
        if (take > n) take = n;
        if (s->wide)
            for (size_t i = 0; i < take; i++) s->buf32[s->len + i] = (uint32_t)ids[i];
        else
            for (size_t i = 0; i < take; i++) s->buf16[s->len + i] = (uint16_t)ids[i];
        if (s->masked) {
            if (mask) memcpy(s->mask + s->len, mask, take);
            else memset(s->mask + s->len, 1, take);
        }
        ids += take;
        if (mask) mask += take;
        s->len += take;
        n -= take;
        if (s->len == s->max_tokens && sink_flush(s) != 0) return -1;
    }
    return 0;
}

int strata_shard_sink_finish(strata_shard_sink *s) {
    int rc = sink_flush(s);
    strata_shard_sink_free(s);
    return rc;
}

/* ---- text preparation ---- */

/* Appends n bytes as tokens (ids = byte values). */
static int push_bytes(strata_shard_sink *s, const unsigned char *bytes, size_t n) {
    int32_t ids[4096];
    while (n > 0) {
        size_t k = n < 4096 ? n : 4096;
        for (size_t i = 0; i < k; i++) ids[i] = bytes[i];
        if (strata_shard_sink_push(s, ids, NULL, k)) return -1;
        bytes += k;
        n -= k;
    }
    return 0;
}

/* The BPE encoder's sink: ids into a shard sink. */
static int push_ids(void *ctx, const int32_t *ids, size_t n) { return strata_shard_sink_push(ctx, ids, NULL, n); }

/* ---- one document on several threads ---- */

/* The first cut strata_bpe_line_cuts allows at or after `from` (just after a '\n' that
 * follows a visible ASCII character and precedes an ASCII letter), or n. */
static size_t line_cut(const char *s, size_t from, size_t n) {
    for (size_t q = from > 1 ? from - 1 : 1; q + 1 < n;) {
        const char *nl = memchr(s + q, '\n', n - 1 - q);
        if (!nl) break;
        q = (size_t)(nl - s);
        unsigned char before = (unsigned char)s[q - 1], after = (unsigned char)s[q + 1] | 0x20;
        if (before > ' ' && before < 0x7f && after >= 'a' && after <= 'z') return q + 1;
        q++;
    }
    return n;
}

/* One part of a document, encoded by a thread into ids. */
typedef struct doc_part {
    strata_bpe *tk;
    const char *s, *name;
    size_t n;
    int32_t *ids;
    size_t n_ids, cap;
    int rc;
    char *why;
} doc_part;

static int keep_ids(void *ctx, const int32_t *ids, size_t n) {
    doc_part *p = ctx;
    if (p->n_ids + n > p->cap) {
        p->cap = p->n_ids + n > 2 * p->cap ? p->n_ids + n : 2 * p->cap;
        p->ids = strata_xrealloc(p->ids, p->cap * sizeof *p->ids);
    }
    memcpy(p->ids + p->n_ids, ids, n * sizeof *ids);
    p->n_ids += n;
    return 0;
}

static void *encode_part(void *arg) {
    doc_part *p = arg;
    p->n_ids = 0;
    p->rc = strata_bpe_encode(p->tk, p->s, p->n, p->name, keep_ids, p);
    p->why = p->rc ? strata_xstrdup(strata_error()) : NULL;
    return NULL;
}

/* A part holds about text / (threads * PARTS_PER_THREAD) bytes, within these bounds: the
 * threads share the work evenly, and the ids made ahead of the sink stay small. */
#define PARTS_PER_THREAD 4
#define PART_MIN ((size_t)64 << 10)
#define PART_MAX ((size_t)8 << 20)

/* strata_bpe_encode_doc of text[0, n) into sink, on up to `threads` threads when the
 * tokenizer allows its cuts (strata_bpe_line_cuts): parts cut there, a round of `threads`
 * at a time, pushed in order, so the ids are the text's encoded whole. */
static int encode_doc_threads(strata_bpe *tk, const char *text, size_t n, const char *name, int threads,
                              strata_shard_sink *sink) {
    if (threads > STRATA_PREPARE_MAX_THREADS) threads = STRATA_PREPARE_MAX_THREADS;
    if (threads < 2 || n < 2 * PART_MIN || !strata_bpe_line_cuts(tk))
        return strata_bpe_encode_doc(tk, text, n, name, push_ids, sink);
    const int32_t *prefix, *suffix;
    int n_prefix, n_suffix;
    strata_bpe_template(tk, &prefix, &n_prefix, &suffix, &n_suffix);
    if (n_prefix && strata_shard_sink_push(sink, prefix, NULL, (size_t)n_prefix)) return -1;
    size_t size = n / ((size_t)threads * PARTS_PER_THREAD);
    size = size < PART_MIN ? PART_MIN : size > PART_MAX ? PART_MAX : size;
    doc_part part[STRATA_PREPARE_MAX_THREADS] = {{0}};
    pthread_t tid[STRATA_PREPARE_MAX_THREADS];
    int rc = 0;
    size_t parts = 0;
    for (size_t at = 0; at < n && !rc;) {
        int k = 0, started[STRATA_PREPARE_MAX_THREADS] = {0};
        for (; k < threads && at < n; k++, parts++) {
            size_t end = n - at > size ? line_cut(text, at + size, n) : n;
            part[k].tk = tk, part[k].s = text + at, part[k].n = end - at, part[k].name = name;
            at = end;
            started[k] = !pthread_create(&tid[k], NULL, encode_part, &part[k]);
            if (!started[k]) encode_part(&part[k]);
        }
        for (int i = 0; i < k; i++)
            if (started[i]) pthread_join(tid[i], NULL);
        for (int i = 0; i < k; i++) {
            if (!rc && part[i].rc) rc = strata_fail("%s", part[i].why);
            if (!rc) rc = strata_shard_sink_push(sink, part[i].ids, NULL, part[i].n_ids);
            free(part[i].why);
            part[i].why = NULL;
        }
    }
    for (int i = 0; i < threads; i++) free(part[i].ids);
    STRATA_DEBUG("data", "%s: %zu bytes encoded in %zu parts on %d threads", name, n, parts, threads);
    if (!rc && n_suffix) rc = strata_shard_sink_push(sink, suffix, NULL, (size_t)n_suffix);
    return rc ? -1 : 0;
}

static int read_whole_file(const char *path, unsigned char **out, size_t *out_len) {
    char *buf;
    size_t len;
    if (strata_read_file_bounded(path, STRATA_TEXT_MAX_BYTES, &buf, &len)) return -1;
    if (len == 0) {
        free(buf);
        return strata_fail("%s: text file is empty (nothing to tokenise)", path);
    }
    *out = (unsigned char *)buf;
    *out_len = len;
    return 0;
}

/* What strata_prepare_text fills a directory with. */
typedef struct text_job {
    const char *const *files;
    int n_files;
    double val_fraction;
    size_t max_shard_tokens;
    strata_bpe *tk;
    int threads;
    strata_shard_sink train, val;
} text_job;

/* Encodes the text files into train and val shards and the tokenizer files, in dir. */
static int write_prepared(void *ctx, const char *dir) {
    text_job *j = ctx;
    strata_bpe *tk = j->tk;
    int wide = tk && strata_bpe_vocab_size(tk) > 65536;
    strata_shard_sink *train = &j->train, *val = &j->val;
    strata_shard_sink_init(train, dir, "train", j->max_shard_tokens, wide, 0, 0);
    strata_shard_sink_init(val, dir, "val", j->max_shard_tokens, wide, 0, 0);
    int rc = 0;
    for (int i = 0; i < j->n_files && rc == 0; i++) {
        const char *path = j->files[i];
        unsigned char *bytes = NULL;
        size_t len = 0;
        if (read_whole_file(path, &bytes, &len) != 0) {
            rc = -1;
            break;
        }
        /* The tail of each file is held out, so val text is never seen in training even
         * when files are concatenated. With a tokenizer the cut moves back to the start of a
         * UTF-8 character, and each side is encoded on its own, as a document. */
        size_t n_val = (size_t)((double)len * j->val_fraction);
        size_t n_train = len - n_val;
        /* checked whole, so that a bad byte is named by its offset in the file */
        size_t bad = tk && !strata_bpe_is_bytes(tk) ? strata_utf8_invalid_at(bytes, len) : len;
        if (bad < len) {
            free(bytes);
            rc = strata_fail("%s: byte %zu is not valid UTF-8 (the BPE tokenizer reads UTF-8 text)", path, bad);
            break;
        }
        if (tk)
            while (n_train > 0 && n_train < len && (bytes[n_train] & 0xC0) == 0x80) n_train--, n_val++;
        STRATA_DEBUG("data", "%s: %zu bytes -> %zu train, %zu val", path, len, n_train, n_val);
        if (!tk) {
            rc = push_bytes(train, bytes, n_train);
            if (rc == 0) rc = push_bytes(val, bytes + n_train, n_val);
        } else {
            rc = encode_doc_threads(tk, (const char *)bytes, n_train, path, j->threads, train);
            if (rc == 0 && n_val) rc = encode_doc_threads(tk, (const char *)bytes + n_train, n_val, path, j->threads, val);
        }
        free(bytes);
    }
    if (rc == 0) rc = strata_shard_sink_finish(train);
    if (rc == 0) rc = strata_shard_sink_finish(val);
    strata_shard_sink_free(train);
    strata_shard_sink_free(val);
    if (rc != 0) return -1;
    return strata_prepare_write_tokenizer(dir, tk);
}

int strata_prepare_write_tokenizer(const char *dir, const strata_bpe *tk) {
    /* the tokenizer goes with the shards: training records it, export ships it */
    char path[PATH_MAX];
    STRATA_TRY(strata_path_join(path, sizeof path, dir, "tokenizer.json"));
    strata_bpe *bytes_tk = tk ? NULL : strata_bpe_bytes();
    int rc = strata_bpe_save(tk ? tk : bytes_tk, path);
    strata_bpe_free(bytes_tk);
    if (!rc && tk && strata_bpe_has_config(tk)) {
        STRATA_TRY(strata_path_join(path, sizeof path, dir, "tokenizer_config.json"));
        rc = strata_bpe_save_config(tk, path, 0);
    }
    if (rc) return -1;
    return strata_fsync_dir(dir);
}

/* Whether prepare writes `name`: a shard (train_NNNNNN.bin, val_NNNNNN.bin), tokenizer.json,
 * tokenizer_config.json, or the temporary twin of one that a killed run left. These are replaced; anything else
 * in an existing out_dir is carried over into the new one. */
static int is_prepare_output(const char *name) {
    const char *rest = !strncmp(name, "train_", 6) ? name + 6 : !strncmp(name, "val_", 4) ? name + 4 : NULL;
    if (!rest)
        return !strcmp(name, "tokenizer.json") || !strncmp(name, "tokenizer.json.tmp", 18) ||
               !strcmp(name, "tokenizer_config.json") || !strncmp(name, "tokenizer_config.json.tmp", 25);
    int digits = 0;
    while (rest[digits] >= '0' && rest[digits] <= '9') digits++;
    return digits >= 6 && (!strcmp(rest + digits, ".bin") || !strncmp(rest + digits, ".bin.tmp", 8));
}

/* Links what the user keeps in the old out_dir (the text files, notes, folders: everything
 * prepare does not write) into the new one, so the swap loses nothing; *n counts them. */
static int carry_over(const char *old_dir, const char *new_dir, int *n) {
    *n = 0;
    DIR *d = opendir(old_dir);
    if (!d) return errno == ENOENT ? 0 : strata_fail("%s: cannot list: %s", old_dir, strerror(errno));
    int rc = 0;
    struct dirent *ent;
    errno = 0;
    while (!rc && (ent = readdir(d)) != NULL) {
        if (strcmp(ent->d_name, ".") && strcmp(ent->d_name, "..") && !is_prepare_output(ent->d_name)) {
            rc = strata_link_entry(old_dir, ent->d_name, new_dir);
            if (!rc) (*n)++;
        }
        errno = 0;
    }
    if (!rc && errno != 0) rc = strata_fail("%s: cannot list: %s", old_dir, strerror(errno));
    (void)closedir(d); /* a directory stream that was only read */
    if (rc) strata_fail_wrap("keeping what %s holds besides shards and tokenizer.json", old_dir);
    return rc;
}

/* Where prepare works for out_dir: the directory it replaces (its real path: through a
 * symbolic link, the directory it names), the folder holding that, and the prefix of
 * prepare's own names there (".<name>.prepare"). The folder is made when missing.
 * STRATA_PREPARE_REFUSED for a directory that cannot be replaced whole. */
static int resolve_out(const char *out_dir, char *target, char *parent, char *prefix) {
    char path[PATH_MAX];
    if (snprintf(path, sizeof path, "%s", out_dir) >= (int)sizeof path) return strata_fail("%s: path too long", out_dir);
    size_t n = strlen(path);
    while (n > 1 && path[n - 1] == '/') path[--n] = 0;
    struct stat st;
    if (stat(path, &st) == 0) {
        if (!S_ISDIR(st.st_mode)) return strata_fail("%s: is %s, not a directory", out_dir, strata_file_kind(st.st_mode));
        if (!realpath(path, target)) return strata_fail("%s: cannot resolve: %s", out_dir, strerror(errno));
    } else {
        if (errno != ENOENT || lstat(path, &st) == 0)
            return strata_fail("%s: cannot use as the output directory: %s", out_dir,
                               errno != ENOENT ? strerror(errno) : "a symbolic link to nothing");
        char dir[PATH_MAX], real[PATH_MAX];
        strata_path_dir(dir, sizeof dir, path);
        STRATA_TRY(strata_mkdir_p(dir));
        if (!realpath(dir, real)) return strata_fail("%s: cannot resolve: %s", dir, strerror(errno));
        const char *slash = strrchr(path, '/');
        STRATA_TRY(strata_path_join(target, PATH_MAX, real, slash ? slash + 1 : path));
    }
    strata_path_dir(parent, PATH_MAX, target);
    const char *name = strrchr(target, '/') + 1;
    if (!*name) {
        strata_fail("--out %s is the root directory, which prepare cannot replace whole: name a folder", out_dir);
        return STRATA_PREPARE_REFUSED;
    }
    char cwd[PATH_MAX];
    size_t tn = strlen(target);
    if (getcwd(cwd, sizeof cwd) && !strncmp(cwd, target, tn) && (cwd[tn] == 0 || cwd[tn] == '/')) {
        strata_fail("--out %s holds the current directory (%s): prepare replaces it whole, which would leave this "
                    "shell in a deleted directory; run it from outside (cd %s), naming the folder",
                    out_dir, cwd, parent);
        return STRATA_PREPARE_REFUSED;
    }
    if (snprintf(prefix, PATH_MAX, "%s/.%s.prepare", parent, name) >= PATH_MAX)
        return strata_fail("%s: path too long", target);
    return 0;
}

/* Removes the temporary directories of prepares into the same out_dir that were killed
 * (the caller holds the lock, so no other is at work): "<prefix>-*". */
static int remove_stale_temps(const char *parent, const char *prefix) {
    const char *base = strrchr(prefix, '/') + 1;
    size_t bn = strlen(base);
    DIR *d = opendir(parent);
    if (!d) return strata_fail("%s: cannot list: %s", parent, strerror(errno));
    int rc = 0;
    struct dirent *ent;
    errno = 0;
    while (!rc && (ent = readdir(d)) != NULL) {
        if (!strncmp(ent->d_name, base, bn) && ent->d_name[bn] == '-') {
            char p[PATH_MAX];
            rc = strata_path_join(p, sizeof p, parent, ent->d_name);
            if (!rc) rc = strata_rm_tree(p);
            if (!rc) STRATA_INFO("data", "removed %s, left by a prepare that did not finish", p);
        }
        errno = 0;
    }
    if (!rc && errno != 0) rc = strata_fail("%s: cannot list: %s", parent, strerror(errno));
    (void)closedir(d); /* a directory stream that was only read */
    return rc;
}

int strata_prepare_dir(const char *out_dir, strata_prepare_fill fill, void *ctx, int *kept) {
    *kept = 0;
    char target[PATH_MAX], parent[PATH_MAX], prefix[PATH_MAX], lock_path[PATH_MAX + 8], tmp[PATH_MAX + 32];
    int rc = resolve_out(out_dir, target, parent, prefix);
    if (rc) return rc;

    /* One prepare at a time per directory: a second is refused, naming the first, rather
     * than waiting (it would then replace what the first wrote, which the caller of the
     * first did not ask for) or interleaving with it. */
    int lock_fd = -1;
    char holder[256];
    snprintf(lock_path, sizeof lock_path, "%s.lock", prefix);
    rc = strata_lock_take(lock_path, &lock_fd, holder, sizeof holder);
    if (rc < 0) return strata_fail_wrap("prepare into %s", out_dir);
    if (rc > 0) {
        strata_fail("--out %s is being written by another `strata prepare` (%s; it holds %s). Two prepares into one "
                    "directory would mix their shards: wait for that one to end, or choose another --out",
                    out_dir, holder[0] ? holder : "it has not written its pid yet", lock_path);
        return STRATA_PREPARE_REFUSED;
    }

    /* Everything is written into a fresh directory beside out_dir, which then takes
     * out_dir's place in one step: a failure, a kill or a full disk leaves the old data
     * whole, and a reader finds all of the old data or all of the new. */
    char old[PATH_MAX + 64] = "";
    rc = remove_stale_temps(parent, prefix);
    /* its name is free: the lock keeps other prepares out, and the ones killed were just
     * removed. It takes the old directory's permissions, else mkdir -p's. */
    struct stat st;
    mode_t mode = stat(target, &st) == 0 ? st.st_mode & 07777 : 0755;
    if (!rc && snprintf(tmp, sizeof tmp, "%s-%ld", prefix, (long)getpid()) >= (int)sizeof tmp)
        rc = strata_fail("%s: path too long", prefix);
    if (!rc && mkdir(tmp, mode) != 0) {
        rc = strata_fail("%s: cannot create a directory beside %s (prepare writes there, then puts it in the place of "
                         "%s; it needs write access to %s): %s", tmp, out_dir, out_dir, parent, strerror(errno));
        tmp[0] = 0;
    }
    if (!rc && chmod(tmp, mode) != 0) rc = strata_fail("%s: cannot set its permissions: %s", tmp, strerror(errno));
    if (!rc) rc = fill(ctx, tmp);
    if (!rc) rc = carry_over(target, tmp, kept);
    if (!rc) rc = strata_fsync_dir(tmp);
    if (!rc) rc = strata_dir_swap(tmp, target, old, sizeof old);
    if (rc) {
        strata_fail_wrap("prepare into %s (left as it was)", out_dir);
        if (tmp[0]) {
            char why[2048];
            snprintf(why, sizeof why, "%s", strata_error());
            STRATA_IGNORE(strata_rm_tree(tmp)); /* already failing; the next prepare removes it too */
            strata_fail("%s", why);
        }
    } else if (old[0]) {
        /* the new data is in place; the old is unlinked, though a running reader that has
         * its shards open keeps them (mapped) until it closes them */
        STRATA_IGNORE(strata_rm_tree(old)); /* what is left, the next prepare removes */
    }
    (void)close(lock_fd); /* a lock file holding only our pid: closing it lets go */
    return rc < -1 ? rc : rc ? -1 : 0; /* a code of fill's own (io/jsonl.h's bad line) goes back as it is */
}

int strata_prepare_text(const char *const *text_files, int n_files, const char *out_dir,
                        double val_fraction, size_t max_shard_tokens, strata_bpe *tk, int threads) {
    if (n_files <= 0) return strata_fail("prepare: no text files given (out_dir %s)", out_dir);
    if (!(val_fraction >= 0.0 && val_fraction < 1.0))
        return strata_fail("prepare: val_fraction %g is outside [0, 1)", val_fraction);
    if (max_shard_tokens == 0 || max_shard_tokens > (size_t)INT32_MAX)
        return strata_fail("prepare: max_shard_tokens %zu is outside [1, %d]", max_shard_tokens,
                           INT32_MAX);
    text_job j = {.files = text_files, .n_files = n_files, .val_fraction = val_fraction,
                  .max_shard_tokens = max_shard_tokens, .tk = tk,
                  .threads = threads > 0 ? threads : strata_cpus_available()};
    int kept = 0;
    int rc = strata_prepare_dir(out_dir, write_prepared, &j, &kept);
    if (rc) return rc;
    char desc[1200];
    if (tk) snprintf(desc, sizeof desc, "tokenizer %s, vocab %d", strata_bpe_source(tk), strata_bpe_vocab_size(tk));
    else snprintf(desc, sizeof desc, "byte-level, vocab 256");
    STRATA_INFO("data", "%s: %zu train tokens in %d shard%s, %zu val tokens in %d shard%s "
                "(%s%s, from %d file%s; tokenizer.json beside them%s)",
                out_dir, j.train.total, j.train.n_shards, j.train.n_shards == 1 ? "" : "s", j.val.total,
                j.val.n_shards, j.val.n_shards == 1 ? "" : "s", desc, j.train.wide ? "; 32-bit shards" : "", n_files,
                n_files == 1 ? "" : "s", kept ? "; the directory's other files kept" : "");
    return 0;
}

/* ---- the batch reader ---- */

void strata_loader_close(strata_loader *L) {
    for (int i = 0; i < L->n_shards; i++) strata_shard_close(&L->shards[i]);
    free(L->shards);
    free(L->chunk_start);
    free(L->perm);
    memset(L, 0, sizeof *L);
    L->perm_epoch = UINT64_MAX;
}

int strata_loader_open(strata_loader *L, const char *glob_pattern, int T, int vocab_size,
                       int shuffle, uint64_t seed) {
    memset(L, 0, sizeof *L);
    L->perm_epoch = UINT64_MAX;
    if (T < 1) return strata_fail("data %s: sequence length T = %d must be at least 1", glob_pattern, T);
    if (vocab_size < 1) return strata_fail("data %s: vocab_size %d is below 1", glob_pattern, vocab_size);
    glob_t g;
    int grc = glob(glob_pattern, 0, NULL, &g); /* glob(3) sorts unless GLOB_NOSORT */
    if (grc == GLOB_NOMATCH) {
        strata_fail("no token shards match '%s'", glob_pattern);
        return STRATA_DATA_NOT_SHARDS;
    }
    if (grc != 0) return strata_fail("'%s': glob failed (code %d)", glob_pattern, grc);
    if (g.gl_pathc > INT_MAX) {
        globfree(&g);
        return strata_fail("'%s' matches too many files (%zu)", glob_pattern, g.gl_pathc);
    }

    L->T = T;
    L->vocab_size = vocab_size;
    L->shuffle = shuffle != 0;
    L->seed = seed;
    L->shards = strata_xcalloc(g.gl_pathc, sizeof *L->shards);
    L->chunk_start = strata_xcalloc(g.gl_pathc + 1, sizeof *L->chunk_start);
    uint64_t n_tokens = 0;
    for (size_t i = 0; i < g.gl_pathc; i++) {
        int src = strata_shard_open(&L->shards[i], g.gl_pathv[i]);
        if (src != 0) {
            globfree(&g);
            strata_loader_close(L);
            return src;
        }
        L->n_shards++;
        if (L->shards[i].mask) L->has_mask = 1;
        if (L->shards[i].docs) L->has_docs = 1;
        int packed = L->shards[i].seq_len;
        if (packed && L->shards[i].mask && !L->shards[i].docs) L->unmarked_packed = 1;
        if (packed && packed != T) {
            /* its chunks would cut across the packed sequences: examples split mid-way */
            strata_fail("%s: its examples were packed into sequences of %d tokens (strata prepare --jsonl --seq-len %d), "
                        "but sequences of %d are read from it: train with train.seq_len %d, or prepare again with "
                        "--seq-len %d", L->shards[i].path, packed, packed, T, packed, T);
            globfree(&g);
            strata_loader_close(L);
            return -1;
        }
        size_t n = L->shards[i].n_tokens;
        /* Chunks never cross a shard boundary: shard i yields floor((n-1)/T) chunks of T+1
         * tokens starting at multiples of T (consecutive chunks share one token). */
        uint64_t chunks = n > 0 ? (uint64_t)(n - 1) / (uint64_t)T : 0;
        L->chunk_start[i + 1] = L->chunk_start[i] + chunks;
        n_tokens += n;
    }
    globfree(&g);
    L->n_chunks = L->chunk_start[L->n_shards];
    if (L->n_chunks == 0) {
        int n_sh = L->n_shards;
        strata_loader_close(L);
        return strata_fail("'%s': %d shard%s holding %llu tokens, but none holds a sequence of "
                           "T+1 = %d tokens (use more data or a shorter seq_len)",
                           glob_pattern, n_sh, n_sh == 1 ? "" : "s", (unsigned long long)n_tokens,
                           T + 1);
    }
    if (L->shuffle) {
        if (L->n_chunks > UINT32_MAX) {
            unsigned long long n = (unsigned long long)L->n_chunks;
            strata_loader_close(L);
            return strata_fail("'%s': %llu sequences are too many to shuffle (limit %u); "
                               "set data.shuffle: false",
                               glob_pattern, n, UINT32_MAX);
        }
        L->perm = strata_xmalloc((size_t)L->n_chunks * sizeof *L->perm);
    }
    STRATA_DEBUG("data", "'%s': %d shards, %llu tokens, %llu sequences of T=%d%s", glob_pattern,
                 L->n_shards, (unsigned long long)n_tokens, (unsigned long long)L->n_chunks, T,
                 L->shuffle ? ", shuffled per epoch" : "");
    return 0;
}

/* Fisher-Yates with draws from the counter RNG keyed by (seed, epoch): the order of an
 * epoch depends on nothing else, so resuming at any step reproduces it. */
static void build_perm(strata_loader *L, uint64_t epoch) {
    uint32_t n = (uint32_t)L->n_chunks;
    for (uint32_t i = 0; i < n; i++) L->perm[i] = i;
    uint64_t key = strata_hash64(strata_hash64(L->seed ^ SHUFFLE_STREAM) ^ epoch);
    for (uint32_t i = n - 1; i > 0; i--) {
        uint32_t j = (uint32_t)(strata_hash64(key ^ i) % ((uint64_t)i + 1));
        uint32_t t = L->perm[i];
        L->perm[i] = L->perm[j];
        L->perm[j] = t;
    }
    L->perm_epoch = epoch;
}

/* The shard holding global chunk c: the last i with chunk_start[i] <= c. */
static int shard_of_chunk(const strata_loader *L, uint64_t c) {
    int lo = 0, hi = L->n_shards - 1;
    while (lo < hi) {
        int mid = lo + (hi - lo + 1) / 2;
        if (L->chunk_start[mid] <= c) lo = mid;
        else hi = mid - 1;
    }
    return lo;
}

/* Where global sequence seq starts: its shard and the offset of its first token there. */
static const strata_shard *sequence_at(strata_loader *L, uint64_t seq, size_t *off) {
    uint64_t epoch = seq / L->n_chunks;
    uint64_t c = seq % L->n_chunks;
    if (L->shuffle) {
        if (L->perm_epoch != epoch) build_perm(L, epoch);
        c = L->perm[c];
    }
    int s = shard_of_chunk(L, c);
    *off = (size_t)(c - L->chunk_start[s]) * (size_t)L->T;
    return &L->shards[s];
}

/* A mask byte with a bit the shard's flags do not define among the T + 1 tokens of the
 * sequence at sh[off]: named. */
static int check_mask(const strata_shard *sh, size_t off, int T) {
    unsigned top = sh->docs ? STRATA_MASK_LEARNED | STRATA_MASK_DOC_START : STRATA_MASK_LEARNED;
    for (int t = 0; t <= T; t++)
        if (sh->mask[off + (size_t)t] & ~top)
            return strata_fail("%s: mask byte %u at position %zu is not one this shard's flags define (%s; a "
                               "corrupt shard?)",
                               sh->path, (unsigned)sh->mask[off + (size_t)t], off + (size_t)t,
                               sh->docs ? "0 to 3: learned, and a document's first token" : "0 or 1");
    return 0;
}

int strata_loader_read(strata_loader *L, uint64_t first_seq, int n_seq, int32_t *inputs,
                       int32_t *targets, int32_t *positions) {
    const int T = L->T;
    for (int r = 0; r < n_seq; r++) {
        size_t off;
        const strata_shard *sh = sequence_at(L, first_seq + (uint64_t)r, &off);
        for (int t = 0; t <= T; t++) {
            uint32_t tok = strata_shard_token(sh, off + (size_t)t);
            if (tok >= (uint32_t)L->vocab_size)
                return strata_fail("%s: token %u at position %zu is >= vocab_size %d "
                                   "(data tokenised for a larger vocabulary?)",
                                   sh->path, (unsigned)tok, off + (size_t)t, L->vocab_size);
        }
        if (sh->mask && check_mask(sh, off, T)) return -1;
        int32_t *in = inputs + (size_t)r * T, *tg = targets + (size_t)r * T;
        for (int t = 0; t < T; t++) {
            in[t] = (int32_t)strata_shard_token(sh, off + (size_t)t);
            tg[t] = (int32_t)strata_shard_token(sh, off + (size_t)t + 1);
        }
        if (sh->mask) /* a target the mask does not learn is -1, which the loss skips */
            for (int t = 0; t < T; t++)
                if (!(sh->mask[off + (size_t)t + 1] & STRATA_MASK_LEARNED)) tg[t] = -1;
        if (positions) {
            int32_t *p = positions + (size_t)r * T;
            for (int t = 0; t < T; t++)
                p[t] = t && !(sh->docs && (sh->mask[off + (size_t)t] & STRATA_MASK_DOC_START)) ? p[t - 1] + 1 : 0;
        }
    }
    return 0;
}

int strata_loader_count_learned(strata_loader *L, uint64_t first_seq, int n_seq, uint64_t *count) {
    const int T = L->T;
    *count = 0;
    if (!L->has_mask) {
        *count = (uint64_t)n_seq * (uint64_t)T;
        return 0;
    }
    for (int r = 0; r < n_seq; r++) {
        size_t off;
        const strata_shard *sh = sequence_at(L, first_seq + (uint64_t)r, &off);
        if (!sh->mask) {
            *count += (uint64_t)T;
            continue;
        }
        if (check_mask(sh, off, T)) return -1;
        for (int t = 1; t <= T; t++) *count += sh->mask[off + (size_t)t] & STRATA_MASK_LEARNED;
    }
    return 0;
}

uint64_t strata_batch_seq(int64_t step, int micro, int rank, int row, int world, int grad_accum,
                          int B) {
    uint64_t G = (uint64_t)world * (uint64_t)grad_accum * (uint64_t)B;
    return (uint64_t)step * G + (uint64_t)micro * ((uint64_t)world * B) + (uint64_t)rank * B +
           (uint64_t)row;
}

/* ---- llm.c tokenizer ---- */

void strata_tokenizer_free(strata_tokenizer *tk) {
    if (tk->pieces)
        for (int i = 0; i < tk->vocab_size; i++) free(tk->pieces[i]);
    free(tk->pieces);
    free(tk->lens);
    memset(tk, 0, sizeof *tk);
}

int strata_tokenizer_load(strata_tokenizer *tk, const char *path) {
    memset(tk, 0, sizeof *tk);
    /* a header, then at most 65536 tokens of at most 256 bytes each */
    if (strata_check_file_bounded(path, 1024 + (size_t)65536 * 256)) return -1;
    FILE *f = fopen(path, "rb"); /* read-only: no fclose of it can lose data, so none is checked */
    if (!f) return strata_fail("%s: cannot open tokenizer: %s", path, strerror(errno));
    uint32_t h[256];
    if (fread(h, sizeof h, 1, f) != 1) {
        (void)fclose(f);
        return strata_fail("%s: shorter than the 1024-byte tokenizer header (truncated?)", path);
    }
    if (h[0] != TOKENIZER_MAGIC) {
        (void)fclose(f);
        return strata_fail("%s: bad magic %u (expected %u; not an llm.c tokenizer file)", path,
                           h[0], TOKENIZER_MAGIC);
    }
    if (h[1] != 1 && h[1] != 2) {
        (void)fclose(f);
        return strata_fail("%s: unsupported tokenizer version %u (expected 1 or 2)", path, h[1]);
    }
    if (h[2] == 0 || h[2] > 65536) {
        (void)fclose(f);
        return strata_fail("%s: vocab size %u is outside [1, 65536]", path, h[2]);
    }
    /* Version 2 adds the end-of-text id in h[3]; decoding needs only the pieces. */
    if (h[1] == 2 && h[3] >= h[2]) {
        (void)fclose(f);
        return strata_fail("%s: end-of-text token %u is outside the vocabulary of %u", path, h[3],
                           h[2]);
    }
    int n = (int)h[2];
    tk->pieces = strata_xcalloc((size_t)n, sizeof *tk->pieces);
    tk->lens = strata_xcalloc((size_t)n, sizeof *tk->lens);
    tk->vocab_size = n;
    for (int i = 0; i < n; i++) {
        unsigned char len;
        char *piece = NULL;
        int ok = fread(&len, 1, 1, f) == 1;
        if (ok) {
            piece = strata_xmalloc((size_t)len + 1);
            ok = len == 0 || fread(piece, len, 1, f) == 1;
        }
        if (!ok) {
            free(piece);
            (void)fclose(f);
            strata_tokenizer_free(tk);
            return strata_fail("%s: truncated at token %d of %d", path, i, n);
        }
        piece[len] = 0;
        tk->pieces[i] = piece;
        tk->lens[i] = len;
    }
    int extra = fgetc(f) != EOF;
    (void)fclose(f);
    if (extra) {
        strata_tokenizer_free(tk);
        return strata_fail("%s: trailing bytes after the %d tokens the header declares", path, n);
    }
    return 0;
}

double strata_loss_over_learned(double mean, uint64_t learned, uint64_t all, int has_mask) {
    if (!has_mask || learned == all) return mean;
    return learned ? mean * ((double)all / (double)learned) : 0.0;
}
