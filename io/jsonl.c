/* io/jsonl.c: JSON Lines into packed, masked token shards (io/jsonl.h): a line at a time
 * through the strict JSON reader, each example as ids and a mask (io/chat.h for messages),
 * packed into seq_len sequences by a packer per split over io/data.h's shard sink. */
#include "io/jsonl.h"

#include <errno.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "io/data.h"
#include "io/files.h"
#include "io/json.h"
#include "io/text.h"

/* ---- packing ---- */

/* The sequences best-fit packing fills at once (--pack best-fit); in order, one. */
#define PACK_OPEN_BEST_FIT 64

/* A sequence being filled: its tokens so far. */
typedef struct pack_seq {
    int32_t *ids;
    uint8_t *mask;
    size_t used;
} pack_seq;

/* One split's sequences, T tokens each, padding not learned, written to the sink as they
 * are closed. Up to open_max fill at once (pack_seq, oldest first): an example goes into
 * the open one it leaves the least room in (the oldest among equals); when none has room,
 * a new one opens, after the fullest open one (the oldest among equals) is padded out and
 * written if open_max are open already. With open_max 1 that is packing in order: an
 * example that does not fit what is left of the current sequence starts the next. A
 * sequence filled exactly is written at once. */
typedef struct packer {
    strata_shard_sink sink;
    int T, open_max;
    int32_t pad;
    pack_seq *open; /* open_max slots, the first n_open in use, oldest first */
    int n_open;
    int any; /* an example was packed */
    size_t padding;
} packer;

static int push_pad(packer *p, size_t n) {
    int32_t ids[256];
    uint8_t mask[256] = {0};
    for (int i = 0; i < 256; i++) ids[i] = p->pad;
    p->padding += n;
    while (n > 0) {
        size_t k = n < 256 ? n : 256;
        if (strata_shard_sink_push(&p->sink, ids, mask, k)) return -1;
        n -= k;
    }
    return 0;
}

/* Writes open sequence i, padded out, and closes it (the younger ones move up a slot; its
 * buffers go to the last slot, for the next to open). */
static int close_sequence(packer *p, int i) {
    pack_seq s = p->open[i];
    if (strata_shard_sink_push(&p->sink, s.ids, s.mask, s.used) || push_pad(p, (size_t)p->T - s.used)) return -1;
    memmove(p->open + i, p->open + i + 1, (size_t)(p->n_open - i - 1) * sizeof *p->open);
    s.used = 0;
    p->open[--p->n_open] = s;
    return 0;
}

/* Closes the fullest open sequence (the oldest among equals). */
static int close_fullest(packer *p) {
    int full = 0;
    for (int i = 1; i < p->n_open; i++)
        if (p->open[i].used > p->open[full].used) full = i;
    return close_sequence(p, full);
}

/* A new open sequence (the fullest closed first when every slot is in use). */
static pack_seq *open_sequence(packer *p) {
    if (p->n_open == p->open_max && close_fullest(p)) return NULL;
    pack_seq *s = &p->open[p->n_open++];
    if (!s->ids) {
        s->ids = strata_xmalloc((size_t)p->T * sizeof *s->ids);
        s->mask = strata_xmalloc((size_t)p->T);
    }
    s->used = 0;
    return s;
}

/* Packs one example (ex->mask[0] marks its start and is not learned). One longer than T
 * was decided on by the caller: its whole sequences are written at once (after the
 * fullest open sequence, when every slot is in use) and what is left of it begins a new
 * open one, so each part starts a sequence and keeps the tokens before it within its
 * sequence's window. A sequence's last target is the first token of the sequence written
 * next, learned only when that continues the same example: with more than one sequence
 * open, others may be written between the whole sequences and the rest, so the rest's
 * first token is not learned there and starts a document, as every open sequence's first
 * token then does. */
static int pack(packer *p, const strata_tokens *ex) {
    size_t T = (size_t)p->T, n = ex->n, at = 0;
    p->any = 1;
    if (n > T) {
        if (p->n_open == p->open_max && close_fullest(p)) return -1;
        at = n / T * T;
        if (strata_shard_sink_push(&p->sink, ex->ids, ex->mask, at)) return -1;
        if (at == n) return 0;
    }
    int best = -1; /* the open sequence the example leaves the least room in */
    for (int i = 0; i < p->n_open && !at; i++) {
        size_t room = T - p->open[i].used;
        if (room >= n && (best < 0 || room < T - p->open[best].used)) best = i;
    }
    pack_seq *s = best >= 0 ? &p->open[best] : open_sequence(p);
    if (!s) return -1;
    memcpy(s->ids + s->used, ex->ids + at, (n - at) * sizeof *s->ids);
    memcpy(s->mask + s->used, ex->mask + at, n - at);
    if (at && p->open_max > 1) s->mask[s->used] = STRATA_MASK_DOC_START;
    s->used += n - at;
    return s->used == T ? close_sequence(p, (int)(s - p->open)) : 0;
}

/* The open sequences written, oldest first, then one token more: the target of the last
 * position. */
static int pack_finish(packer *p) {
    while (p->n_open)
        if (close_sequence(p, 0)) return -1;
    if (p->any && push_pad(p, 1)) return -1;
    if (p->any) p->padding--; /* the trailing token is no sequence's padding */
    return strata_shard_sink_finish(&p->sink);
}

static void pack_free(packer *p) {
    for (int i = 0; p->open && i < p->open_max; i++) {
        free(p->open[i].ids);
        free(p->open[i].mask);
    }
    free(p->open);
    p->open = NULL;
}

/* ---- one line ---- */

/* What turns a line into an example. The threads share it read-only, each with its own
 * copy for where. */
typedef struct line_maker {
    const strata_jsonl_opts *o;
    strata_bpe *tk;
    strata_chat chat;
    int32_t eos;
    const int32_t *prefix, *suffix;
    int n_prefix, n_suffix;
    char where[1200]; /* "FILE:LINE" of the line at hand */
} line_maker;

/* The top-level key whose member holds byte `off` of the line (a key itself counts), for
 * messages about bytes the JSON reader refused; "" when there is none. */
static void field_at(const char *s, size_t n, size_t off, char *out, size_t cap) {
    out[0] = 0;
    int depth = 0;
    for (size_t i = 0; i < n && i <= off; i++) {
        char c = s[i];
        if (c == '{' || c == '[') depth++;
        else if (c == '}' || c == ']') depth--;
        if (c != '"') continue;
        size_t j = i + 1;
        while (j < n && s[j] != '"') j += s[j] == '\\' ? 2 : 1;
        size_t k = j + 1;
        while (k < n && (s[k] == ' ' || s[k] == '\t')) k++;
        if (depth == 1 && k < n && s[k] == ':') /* a key: the member from here on is its */
            snprintf(out, cap, "%.*s", (int)(j - i - 1 < 200 ? j - i - 1 : 200), s + i + 1);
        i = j;
    }
}

/* The byte offset an error of io/json.c names ("NAME: byte N ..."), or SIZE_MAX. */
static size_t error_offset(const char *msg, const char *name) {
    size_t n = strlen(name), off;
    if (strncmp(msg, name, n) || sscanf(msg + n, ": byte %zu", &off) != 1) return SIZE_MAX;
    return off;
}

static int bad(line_maker *j, const char *field, const char *fmt, const char *what) {
    if (field && field[0]) strata_fail("%s: field '%s' %s", j->where, field, fmt ? fmt : what);
    else strata_fail("%s: %s", j->where, fmt ? fmt : what);
    return 1;
}

/* A string member `key` of obj: NULL, with the line called bad, when it is missing or not a
 * string (or empty, unless allow_empty). */
static const strata_json *string_member(line_maker *j, const strata_json *obj, const char *key, const char *shown,
                                        int allow_empty, int *is_bad) {
    const strata_json *v = strata_json_get(obj, key);
    char msg[128];
    if (!v) *is_bad = bad(j, shown, "is missing", NULL);
    else if (v->type != STRATA_JSON_STRING) {
        snprintf(msg, sizeof msg, "is %s, not a string", strata_json_kind(v));
        *is_bad = bad(j, shown, msg, NULL);
    } else if (!allow_empty && v->len == 0) {
        *is_bad = bad(j, shown, "is empty (nothing to learn)", NULL);
    } else {
        return v;
    }
    return NULL;
}

/* A message's role and content: {"role": ..., "content": ...} as OpenAI's and Hugging
 * Face's chat data write it, or {"from": ..., "value": ...} as ShareGPT's does (from human,
 * gpt or system; user and assistant too). *role is "system", "user" or "assistant". 0, or 1
 * (a bad line, error set). */
static int message_parts(line_maker *j, const strata_json *msgv, const char *m, size_t i, const char **role,
                         const strata_json **content) {
    char field[400];
    int is_bad = 0, sharegpt = !strata_json_get(msgv, "role") && strata_json_get(msgv, "from");
    snprintf(field, sizeof field, "%s[%zu].%s", m, i, sharegpt ? "from" : "role");
    const strata_json *who = string_member(j, msgv, sharegpt ? "from" : "role", field, 0, &is_bad);
    if (!who) return 1;
    static const char *const names[][2] = {{"system", "system"}, {"user", "user"},        {"assistant", "assistant"},
                                           {"human", "user"},    {"gpt", "assistant"}};
    *role = NULL;
    for (size_t k = 0; k < sizeof names / sizeof *names && !*role; k++)
        if ((sharegpt || k < 3) && !strcmp(who->str, names[k][0])) *role = names[k][1];
    if (!*role)
        return bad(j, field, sharegpt ? "is not system, human or gpt (ShareGPT's roles; user and assistant also do)"
                                      : "is not system, user or assistant", NULL);
    int learned = !strcmp(*role, "assistant");
    snprintf(field, sizeof field, "%s[%zu].%s", m, i, sharegpt ? "value" : "content");
    *content = string_member(j, msgv, sharegpt ? "value" : "content", field, !learned, &is_bad);
    return *content ? 0 : 1;
}

/* The conversation of field M as a chat (io/chat.h): M may list fields, comma-separated
 * (TRL's conversational prompt,completion), whose messages follow one another, and then only
 * the last one's assistant turns are learned. 0, 1 (a bad line, error set), -1. */
static int messages_example(line_maker *j, const strata_json *root, strata_tokens *ex) {
    char m[256] = "", field[400], msg[128];
    strata_chat_begin(&j->chat, ex);
    int assistant = 0, first = 1;
    for (const char *p = j->o->messages_field; *p;) {
        size_t n = strcspn(p, ",");
        snprintf(m, sizeof m, "%.*s", (int)(n < sizeof m - 1 ? n : sizeof m - 1), p);
        p += n + (p[n] == ',');
        int learns = !*p; /* the last field's assistant turns (all of them with one field) */
        const strata_json *list = strata_json_get(root, m);
        if (!list) return bad(j, m, "is missing", NULL);
        if (list->type != STRATA_JSON_ARRAY) {
            snprintf(msg, sizeof msg, "is %s, not an array of messages", strata_json_kind(list));
            return bad(j, m, msg, NULL);
        }
        for (size_t i = 0; i < list->len; i++) {
            const strata_json *msgv = &list->items[i];
            snprintf(field, sizeof field, "%s[%zu]", m, i);
            if (msgv->type != STRATA_JSON_OBJECT) {
                snprintf(msg, sizeof msg, "is %s, not a message object", strata_json_kind(msgv));
                return bad(j, field, msg, NULL);
            }
            const char *role;
            const strata_json *content;
            if (message_parts(j, msgv, m, i, &role, &content)) return 1;
            /* --system-prompt: before a conversation that does not begin with the system's */
            if (first && j->o->system_prompt && strcmp(role, "system") &&
                strata_chat_message(&j->chat, ex, "system", j->o->system_prompt, strlen(j->o->system_prompt), 0,
                                    j->where))
                return -1;
            first = 0;
            int learned = learns && !strcmp(role, "assistant");
            assistant |= learned;
            if (strata_chat_message(&j->chat, ex, role, content->str, content->len, learned, j->where)) return -1;
        }
    }
    if (!assistant)
        return bad(j, m, strchr(j->o->messages_field, ',') ? "has no assistant message (nothing to learn: only the last "
                                                              "field's are)" : "has no assistant message (nothing to learn)",
                   NULL);
    return 0;
}

/* The prompt of a prompt/response line: --prompt-field's fields (comma-separated, as
 * Alpaca's instruction,input), those not empty joined by a blank line into text, as one
 * string (so it is tokenized as a Python script's f"{instruction}\n\n{input}" is). The first
 * must be a string (it may be empty); a later one may be missing or null, or else must be
 * a string. 0, or 1 (a bad line, error set). */
static int prompt_text(line_maker *j, const strata_json *root, strata_sbuf *text) {
    const char *list = j->o->prompt_field;
    char key[256];
    int is_bad = 0, first = 1;
    for (const char *p = list; *p; first = 0) {
        size_t n = strcspn(p, ",");
        snprintf(key, sizeof key, "%.*s", (int)(n < sizeof key - 1 ? n : sizeof key - 1), p);
        p += n + (p[n] == ',');
        const strata_json *v = strata_json_get(root, key);
        if (!first && (!v || v->type == STRATA_JSON_NULL)) continue;
        v = string_member(j, root, key, key, 1, &is_bad);
        if (!v) return 1;
        if (!v->len) continue;
        if (text->len) strata_sbuf_puts(text, "\n\n");
        strata_sbuf_putn(text, v->str, v->len);
    }
    return 0;
}

/* The example of one line. 0, 1 (a bad line, error set), -1 (a failure). */
static int example_of(line_maker *j, const char *line, size_t len, strata_tokens *ex) {
    const strata_jsonl_opts *o = j->o;
    char field[256];
    size_t invalid = strata_utf8_invalid_at(line, len);
    if (invalid < len) {
        field_at(line, len, invalid, field, sizeof field);
        char msg[128];
        snprintf(msg, sizeof msg, "holds a byte that is not valid UTF-8 (byte %zu of the line)", invalid);
        return bad(j, field, msg, "");
    }
    strata_json_doc doc;
    if (strata_json_parse(&doc, line, len, j->where)) {
        char why[2048];
        snprintf(why, sizeof why, "%s", strata_error());
        size_t off = error_offset(why, j->where);
        field_at(line, len, off, field, sizeof field);
        if (field[0]) strata_fail("%s (in field '%s'; not valid JSON)", why, field);
        else strata_fail("%s (not valid JSON)", why);
        return 1;
    }
    const strata_json *root = &doc.root;
    int rc = 0, is_bad = 0;
    if (root->type != STRATA_JSON_OBJECT) {
        char msg[128];
        snprintf(msg, sizeof msg, "is %s, not a JSON object", strata_json_kind(root));
        rc = bad(j, NULL, msg, NULL);
    } else if (o->kind == STRATA_JSONL_MESSAGES) {
        rc = messages_example(j, root, ex);
    } else {
        const strata_json *b = NULL;
        strata_sbuf prompt = {0};
        const char *a_str = NULL;
        size_t a_len = 0;
        if (o->kind == STRATA_JSONL_TEXT) {
            const strata_json *a = string_member(j, root, o->text_field, o->text_field, 0, &is_bad);
            if (a) a_str = a->str, a_len = a->len;
        } else if (!prompt_text(j, root, &prompt)) {
            a_str = prompt.p ? prompt.p : "";
            a_len = prompt.len;
            b = string_member(j, root, o->response_field, o->response_field, 0, &is_bad);
        }
        if (is_bad || !a_str || (o->kind == STRATA_JSONL_PROMPT && !b)) {
            rc = 1;
        } else {
            for (int i = 0; i < j->n_prefix; i++) strata_tokens_push(ex, j->prefix[i], 0);
            rc = strata_tokens_encode(ex, j->tk, a_str, a_len, o->kind == STRATA_JSONL_TEXT, j->where);
            if (!rc && b) rc = strata_tokens_encode(ex, j->tk, b->str, b->len, 1, j->where);
            /* the EOS: the template's own when it puts one after a text, else the tokenizer's */
            if (!rc && j->n_suffix)
                for (int i = 0; i < j->n_suffix; i++) strata_tokens_push(ex, j->suffix[i], 1);
            else if (!rc)
                strata_tokens_push(ex, j->eos, 1);
            if (rc) rc = -1;
        }
        strata_sbuf_free(&prompt);
    }
    strata_json_free(&doc);
    /* nothing of its own predicts an example's first token; the mark keeps the examples
     * packed into one sequence apart when a run trains on them (io/data.h) */
    if (!rc && ex->n) ex->mask[0] = STRATA_MASK_DOC_START;
    return rc;
}

/* ---- the files ---- */

/* Whether an example learns a token (a truncated one may not). */
static int learns(const strata_tokens *ex) {
    for (size_t i = 0; i < ex->n; i++)
        if (ex->mask[i] & STRATA_MASK_LEARNED) return 1;
    return 0;
}

/* Which of a file's n examples are among its n_val for validation: the last ones, or
 * spread (those whose index hashes lowest: strata_hash64, ties to the earlier). */
typedef struct ranked {
    uint64_t h;
    size_t k;
} ranked;
static int cmp_ranked(const void *a, const void *b) {
    const ranked *x = a, *y = b;
    return x->h != y->h ? (x->h > y->h) - (x->h < y->h) : (x->k > y->k) - (x->k < y->k);
}
static unsigned char *val_lines(size_t n, size_t n_val, int at_end) {
    unsigned char *val = strata_xcalloc(n ? n : 1, 1);
    if (at_end) {
        for (size_t k = n - n_val; k < n; k++) val[k] = 1;
        return val;
    }
    ranked *r = strata_xmalloc((n ? n : 1) * sizeof *r);
    for (size_t k = 0; k < n; k++) r[k] = (ranked){strata_hash64(k), k};
    qsort(r, n, sizeof *r, cmp_ranked);
    for (size_t i = 0; i < n_val; i++) val[r[i].k] = 1;
    free(r);
    return val;
}

/* What a run of prepare holds: the packers, the report, and how lines become examples. */
typedef struct jsonl_job {
    const strata_jsonl_opts *o;
    line_maker mk;
    int threads;
    packer train, val;
    strata_jsonl_report *r;
    size_t *lengths, n_lengths, cap_lengths; /* every well-formed example's, for the report */
    uint64_t *seen;    /* the examples so far, by content (example_key): an open-addressed set, 0 empty */
    size_t seen_cap, n_seen;
} jsonl_job;

/* An example's content as a key: a 64-bit hash of its length, its ids and which of them are
 * learned (never 0, the set's empty slot). Two different examples share one with odds of
 * about n^2 / 2^65 over n examples. */
static uint64_t example_key(const strata_tokens *ex) {
    uint64_t h = strata_hash64((uint64_t)ex->n);
    for (size_t i = 0; i < ex->n; i++)
        h = strata_hash64(h ^ ((uint64_t)(uint32_t)ex->ids[i] << 1 | (ex->mask[i] & STRATA_MASK_LEARNED ? 1 : 0)));
    return h ? h : 1;
}

/* 1 when an example with this key came before (else it is added). */
static int seen_before(jsonl_job *j, uint64_t key) {
    if (2 * (j->n_seen + 1) > j->seen_cap) { /* rehash at half full */
        size_t cap = j->seen_cap ? 2 * j->seen_cap : 4096;
        uint64_t *t = strata_xcalloc(cap, sizeof *t);
        for (size_t i = 0; i < j->seen_cap; i++)
            if (j->seen[i])
                for (size_t k = j->seen[i] & (cap - 1);; k = (k + 1) & (cap - 1))
                    if (!t[k]) { t[k] = j->seen[i]; break; }
        free(j->seen);
        j->seen = t;
        j->seen_cap = cap;
    }
    for (size_t k = key & (j->seen_cap - 1);; k = (k + 1) & (j->seen_cap - 1)) {
        if (j->seen[k] == key) return 1;
        if (!j->seen[k]) {
            j->seen[k] = key;
            j->n_seen++;
            return 0;
        }
    }
}

/* A line of a file that is no blank one: its bytes (without the '\r' before its '\n'). */
typedef struct line_span {
    size_t start, stop, lineno;
} line_span;

/* A file's lines that are examples (a blank one, of spaces, tabs and '\r' at most, is none). */
static line_span *example_lines(const char *buf, size_t len, size_t *n_lines) {
    size_t n = 0, cap = 1024, lineno = 0;
    line_span *lines = strata_xmalloc(cap * sizeof *lines);
    for (size_t i = 0; i < len;) {
        const char *nl = memchr(buf + i, '\n', len - i);
        size_t end = nl ? (size_t)(nl - buf) : len, stop = end, s = i, q = i;
        lineno++;
        i = end + 1;
        while (stop > s && buf[stop - 1] == '\r') stop--;
        while (q < stop && (buf[q] == ' ' || buf[q] == '\t' || buf[q] == '\r')) q++;
        if (q == stop) continue;
        if (n == cap) lines = strata_xrealloc(lines, (cap *= 2) * sizeof *lines);
        lines[n++] = (line_span){s, stop, lineno};
    }
    *n_lines = n;
    return lines;
}

/* What became of one line: its example (e 0), or e 1 (a bad line) or -1 (a failure) and
 * the error's text. */
typedef struct made_line {
    strata_tokens ex;
    int e;
    char *why;
} made_line;

/* A thread's share of a batch of lines: [from, to). */
typedef struct batch_part {
    line_maker mk; /* a copy: where is the thread's own */
    const char *path, *buf;
    const line_span *lines;
    made_line *made;
    size_t from, to;
} batch_part;

static void *make_lines(void *arg) {
    batch_part *p = arg;
    for (size_t i = p->from; i < p->to; i++) {
        made_line *m = &p->made[i];
        snprintf(p->mk.where, sizeof p->mk.where, "%s:%zu", p->path, p->lines[i].lineno);
        m->ex.n = 0;
        m->e = example_of(&p->mk, p->buf + p->lines[i].start, p->lines[i].stop - p->lines[i].start, &m->ex);
        free(m->why);
        m->why = m->e ? strata_xstrdup(strata_error()) : NULL;
    }
    return NULL;
}

/* A batch of a file's lines, [b, e), being made into made[0, e - b) by up to
 * STRATA_PREPARE_MAX_THREADS threads, each a run of lines of about the same bytes. */
typedef struct line_batch {
    size_t b, e;
    made_line *made;
    batch_part part[STRATA_PREPARE_MAX_THREADS];
    pthread_t tid[STRATA_PREPARE_MAX_THREADS];
    int started[STRATA_PREPARE_MAX_THREADS];
    int n_parts;
} line_batch;

/* Starts the threads of batch [b, e) of the file's lines. Which thread makes a line changes
 * nothing it becomes; a share whose thread cannot start is made here, at once. */
static void batch_start(jsonl_job *j, line_batch *B, const char *path, const char *buf, const line_span *lines, size_t b,
                        size_t e) {
    size_t n = e - b, bytes = 0, from = 0, done = 0;
    int t = j->threads < 1 ? 1 : j->threads;
    if ((size_t)t > n) t = (int)n;
    B->b = b, B->e = e, B->n_parts = t;
    for (size_t i = b; i < e; i++) bytes += lines[i].stop - lines[i].start + 1;
    for (int k = 0; k < t; k++) {
        size_t to = from, goal = bytes * (size_t)(k + 1) / (size_t)t;
        while (to < n && (to == from || done < goal)) done += lines[b + to].stop - lines[b + to].start + 1, to++;
        if (k == t - 1) to = n;
        B->part[k] = (batch_part){.mk = j->mk, .path = path, .buf = buf, .lines = lines + b, .made = B->made,
                                  .from = from, .to = to};
        from = to;
        B->started[k] = !pthread_create(&B->tid[k], NULL, make_lines, &B->part[k]);
        if (!B->started[k]) make_lines(&B->part[k]);
    }
}

static void batch_wait(line_batch *B) {
    for (int k = 0; k < B->n_parts; k++)
        if (B->started[k]) pthread_join(B->tid[k], NULL);
    B->n_parts = 0;
}

/* The lines a batch holds at most, and about the bytes, per thread: enough that starting
 * the threads costs nothing next to them, few enough that the examples made ahead of the
 * packer stay small (some MB of tokens a thread). */
#define BATCH_LINES 2048
#define BATCH_BYTES ((size_t)2 << 20)

/* The end of the batch that starts at line b. */
static size_t batch_end(const jsonl_job *j, const line_span *lines, size_t n, size_t b) {
    size_t cap_lines = BATCH_LINES * (size_t)j->threads, cap_bytes = BATCH_BYTES * (size_t)j->threads, bytes = 0, e;
    for (e = b; e < n && e - b < cap_lines && (e == b || bytes < cap_bytes); e++)
        bytes += lines[e].stop - lines[e].start + 1;
    return e;
}

/* One made line, in the file's order: an error, or its example packed (or dropped). */
static int take_line(jsonl_job *j, made_line *m, int to_val) {
    const strata_jsonl_opts *o = j->o;
    if (m->e < 0) return strata_fail("%s", m->why);
    if (m->e > 0) {
        if (!o->skip_bad) {
            strata_fail("%s (--skip-bad skips such lines and counts them)", m->why);
            return STRATA_JSONL_BAD_LINE;
        }
        STRATA_DEBUG("data", "skipped: %s", m->why);
        j->r->bad++;
        return 0;
    }
    strata_tokens *ex = &m->ex;
    if (seen_before(j, example_key(ex))) {
        j->r->duplicates++;
        if (o->dedup) return 0;
    }
    if (j->n_lengths == j->cap_lengths) {
        j->cap_lengths = j->cap_lengths ? 2 * j->cap_lengths : 1024;
        j->lengths = strata_xrealloc(j->lengths, j->cap_lengths * sizeof *j->lengths);
    }
    j->lengths[j->n_lengths++] = ex->n;
    int longer = ex->n > (size_t)o->seq_len;
    if (longer && o->overflow == STRATA_JSONL_TRUNCATE) ex->n = (size_t)o->seq_len;
    if (longer && (o->overflow == STRATA_JSONL_DROP || !learns(ex))) {
        j->r->dropped++;
        return 0;
    }
    j->r->split += longer && o->overflow == STRATA_JSONL_SPLIT;
    j->r->truncated += longer && o->overflow == STRATA_JSONL_TRUNCATE;
    j->r->examples++;
    return pack(to_val ? &j->val : &j->train, ex);
}

/* Every PROGRESS_MS while a file is prepared: how far it is, and how long the rest takes. */
#define PROGRESS_MS 10000.0
static void say_progress(const char *path, size_t done, size_t len, double t0, double *said) {
    double now = strata_now_ms(), mb_s = (double)done / 1048576.0 / ((now - t0) / 1000.0);
    if (now - *said < PROGRESS_MS || mb_s <= 0) return;
    *said = now;
    STRATA_INFO("data", "%s: %.0f of %.0f MB (%.0f%%), %.1f MB/s, about %.0f s to go", path, (double)done / 1048576.0,
                (double)len / 1048576.0, 100.0 * (double)done / (double)len, mb_s,
                (double)(len - done) / 1048576.0 / mb_s);
}

/* One file: its lines made into examples a batch at a time, on the threads, and taken in
 * order, so the shards are those of one thread whatever their number; each batch is taken
 * (packed and written) while the threads make the next. */
static int one_file(jsonl_job *j, const char *path) {
    const strata_jsonl_opts *o = j->o;
    char *buf = NULL;
    size_t len = 0, n = 0;
    if (strata_read_file_bounded(path, STRATA_TEXT_MAX_BYTES, &buf, &len)) return -1;
    line_span *lines = example_lines(buf, len, &n);
    size_t n_val = (size_t)((double)n * o->val_fraction), cap = BATCH_LINES * (size_t)j->threads;
    unsigned char *val = val_lines(n, n_val, o->val_at_end);
    line_batch *B = strata_xcalloc(2, sizeof *B);
    for (int k = 0; k < 2; k++) B[k].made = strata_xcalloc(cap, sizeof *B[k].made);
    int rc = 0;
    double t0 = strata_now_ms(), said = t0;
    if (n) batch_start(j, &B[0], path, buf, lines, 0, batch_end(j, lines, n, 0));
    for (int k = 0; n; k ^= 1) {
        line_batch *cur = &B[k], *next = &B[k ^ 1];
        batch_wait(cur);
        if (cur->e < n) batch_start(j, next, path, buf, lines, cur->e, batch_end(j, lines, n, cur->e));
        for (size_t i = cur->b; i < cur->e && !rc; i++) rc = take_line(j, &cur->made[i - cur->b], val[i]);
        if (!rc && cur->e < n) say_progress(path, lines[cur->e].start, len, t0, &said);
        if (rc || cur->e == n) {
            batch_wait(next);
            break;
        }
    }
    for (int k = 0; k < 2; k++) {
        for (size_t i = 0; i < cap; i++) {
            strata_tokens_free(&B[k].made[i].ex);
            free(B[k].made[i].why);
        }
        free(B[k].made);
    }
    free(B);
    free(val);
    free(lines);
    free(buf);
    return rc;
}

static int fill(void *ctx, const char *dir) {
    jsonl_job *j = ctx;
    const strata_jsonl_opts *o = j->o;
    /* shards of k whole sequences and the token after them */
    size_t k = o->max_shard_tokens > 1 ? (o->max_shard_tokens - 1) / (size_t)o->seq_len : 1;
    if (k < 1) k = 1;
    const int flags = STRATA_SHARD_FLAG_MASK | STRATA_SHARD_FLAG_DOCS;
    strata_shard_sink_init(&j->train.sink, dir, "train", k * (size_t)o->seq_len + 1, 1, flags, o->seq_len);
    strata_shard_sink_init(&j->val.sink, dir, "val", k * (size_t)o->seq_len + 1, 1, flags, o->seq_len);
    int rc = 0;
    for (int i = 0; i < o->n_files && !rc; i++) rc = one_file(j, o->files[i]);
    if (!rc) rc = pack_finish(&j->train);
    if (!rc) rc = pack_finish(&j->val);
    strata_shard_sink_free(&j->train.sink);
    strata_shard_sink_free(&j->val.sink);
    if (!rc && !j->train.any)
        rc = strata_fail("--jsonl: no example to train on (%zu bad line%s skipped, %zu dropped as longer than --seq-len)",
                         j->r->bad, j->r->bad == 1 ? "" : "s", j->r->dropped);
    if (rc) return rc;
    return strata_prepare_write_tokenizer(dir, j->mk.tk);
}

/* ---- the layout of a file ---- */

int strata_jsonl_detect(const char *path, strata_jsonl_opts *o, char *said, size_t said_len) {
    FILE *f = fopen(path, "r");
    if (!f) return strata_fail("%s: cannot read: %s", path, strerror(errno));
    char *line = NULL;
    size_t cap = 0, lineno = 0;
    ssize_t n;
    while ((n = getline(&line, &cap, f)) > 0) { /* the first line that is no blank one */
        lineno++;
        if (strspn(line, " \t\r\n") < (size_t)n) break;
    }
    int read_failed = ferror(f);
    (void)fclose(f); /* read-only */
    if (n <= 0) {
        free(line);
        return read_failed ? strata_fail("%s: cannot read: %s", path, strerror(errno))
                           : strata_fail("%s: no example in it (every line is blank)", path);
    }
    char where[1200];
    snprintf(where, sizeof where, "%s:%zu", path, lineno);
    strata_json_doc doc;
    if (strata_json_parse(&doc, line, (size_t)n, where)) {
        free(line);
        return strata_fail_wrap("its layout is read from its first example");
    }
    free(line);
    const strata_json *root = &doc.root;
    if (root->type != STRATA_JSON_OBJECT) {
        strata_json_free(&doc);
        return strata_fail("%s: the first example is %s, not a JSON object", where, strata_json_kind(root));
    }
#define HAS(k) (strata_json_get(root, k) != NULL)
    int rc = 0;
    if (HAS("messages") || HAS("conversations")) {
        o->kind = STRATA_JSONL_MESSAGES;
        o->messages_field = HAS("messages") ? "messages" : "conversations";
        snprintf(said, said_len, "a chat in field '%s' (--messages-field %s)", o->messages_field, o->messages_field);
    } else if (HAS("prompt") && HAS("completion") && strata_json_get(root, "prompt")->type == STRATA_JSON_ARRAY &&
               strata_json_get(root, "completion")->type == STRATA_JSON_ARRAY) {
        o->kind = STRATA_JSONL_MESSAGES;
        o->messages_field = "prompt,completion";
        snprintf(said, said_len, "a chat in fields 'prompt' then 'completion', the completion's learned "
                                 "(--messages-field prompt,completion)");
    } else if (HAS("prompt") && (HAS("completion") || HAS("response"))) {
        o->kind = STRATA_JSONL_PROMPT;
        o->prompt_field = "prompt";
        o->response_field = HAS("completion") ? "completion" : "response";
        snprintf(said, said_len, "prompt/response in fields 'prompt' and '%s' (--prompt-field prompt --response-field %s)",
                 o->response_field, o->response_field);
    } else if (HAS("instruction") && HAS("output")) {
        o->kind = STRATA_JSONL_PROMPT;
        o->prompt_field = "instruction,input";
        o->response_field = "output";
        snprintf(said, said_len, "Alpaca's instruction, input and output (--prompt-field instruction,input "
                                 "--response-field output)");
    } else if (HAS("text")) {
        o->kind = STRATA_JSONL_TEXT;
        o->text_field = "text";
        snprintf(said, said_len, "a document in field 'text' (--text-field text)");
    } else {
        char keys[600] = "";
        for (size_t i = 0; i < root->len && strlen(keys) < 500; i++)
            snprintf(keys + strlen(keys), sizeof keys - strlen(keys), "%s'%.60s'", i ? ", " : "", root->members[i].key);
        rc = strata_fail("%s: the first example's keys (%s) are none of the layouts prepare knows (messages or "
                         "conversations; prompt with completion or response; instruction with output; text): name the "
                         "fields with --messages-field, --prompt-field and --response-field, or --text-field", where,
                         root->len ? keys : "none");
    }
#undef HAS
    strata_json_free(&doc);
    return rc;
}

static int cmp_size(const void *a, const void *b) {
    size_t x = *(const size_t *)a, y = *(const size_t *)b;
    return (x > y) - (x < y);
}

/* The report's median, 99th percentile and longest of n lengths (nearest rank: the
 * ceil(p n)-th smallest); sorts them. */
static void length_stats(strata_jsonl_report *r, size_t *len, size_t n) {
    if (!n) return;
    qsort(len, n, sizeof *len, cmp_size);
    r->len_median = len[(n + 1) / 2 - 1];
    r->len_p99 = len[(99 * n + 99) / 100 - 1];
    r->len_max = len[n - 1];
}

int strata_prepare_jsonl(const strata_jsonl_opts *o, const char *out_dir, strata_bpe *tk, strata_jsonl_report *r) {
    memset(r, 0, sizeof *r);
    if (o->n_files <= 0) return strata_fail("prepare: no JSONL files given (out_dir %s)", out_dir);
    if (o->seq_len < 1) return strata_fail("prepare --jsonl: --seq-len %d must be at least 1", o->seq_len);
    if (!(o->val_fraction >= 0.0 && o->val_fraction < 1.0))
        return strata_fail("prepare: val_fraction %g is outside [0, 1)", o->val_fraction);
    if (o->max_shard_tokens == 0 || o->max_shard_tokens > (size_t)INT32_MAX)
        return strata_fail("prepare: max_shard_tokens %zu is outside [1, %d]", o->max_shard_tokens, INT32_MAX);
    int threads = o->threads > 0 ? o->threads : strata_cpus_available();
    if (threads > STRATA_PREPARE_MAX_THREADS) threads = STRATA_PREPARE_MAX_THREADS;
    jsonl_job j = {.o = o, .mk = {.o = o, .tk = tk}, .threads = threads, .r = r};
    j.train.T = j.val.T = o->seq_len;
    j.train.open_max = j.val.open_max = o->pack_in_order ? 1 : PACK_OPEN_BEST_FIT;
    j.mk.eos = strata_bpe_eos_id(tk);
    strata_bpe_template(tk, &j.mk.prefix, &j.mk.n_prefix, &j.mk.suffix, &j.mk.n_suffix);
    if (o->kind == STRATA_JSONL_MESSAGES) {
        if (strata_chat_open(&j.mk.chat, tk, o->chat_format)) return STRATA_PREPARE_REFUSED;
        j.mk.eos = strata_chat_turn_end(&j.mk.chat);
        /* the export's tokenizer_config.json: the template trained with, its BOS, and the turn's
         * end as EOS (what generation stops at), as instruct models' configs have them */
        char *template = strata_chat_template_with(o->chat_format, o->system_prompt);
        strata_bpe_set_chat(tk, template, o->chat_format == STRATA_CHAT_LLAMA3 ? "<|begin_of_text|>" : NULL,
                            o->chat_format == STRATA_CHAT_LLAMA3 ? "<|eot_id|>" : "<|im_end|>");
        free(template);
    } else if (j.mk.eos < 0 && !j.mk.n_suffix) {
        strata_fail("tokenizer %s names no end-of-sequence token (no eos_token in a tokenizer_config.json beside it, no "
                    "token its template puts after a text, no </s>, <|end_of_text|> or <|endoftext|>): put eos_token in "
                    "its tokenizer_config.json", strata_bpe_source(tk));
        return STRATA_PREPARE_REFUSED;
    }
    int32_t pad = strata_bpe_pad_id(tk);
    j.train.pad = j.val.pad = pad >= 0 ? pad : j.mk.eos >= 0 ? j.mk.eos : j.mk.suffix[j.mk.n_suffix - 1];
    int kept = 0;
    j.train.open = strata_xcalloc((size_t)j.train.open_max, sizeof *j.train.open);
    j.val.open = strata_xcalloc((size_t)j.val.open_max, sizeof *j.val.open);
    int rc = strata_prepare_dir(out_dir, fill, &j, &kept);
    pack_free(&j.train);
    pack_free(&j.val);
    length_stats(r, j.lengths, j.n_lengths);
    free(j.lengths);
    free(j.seen);
    if (rc) return rc;
    r->train_shards = j.train.sink.n_shards;
    r->val_shards = j.val.sink.n_shards;
    r->train_tokens = j.train.sink.total;
    r->val_tokens = j.val.sink.total;
    r->train_learned = j.train.sink.learned;
    r->val_learned = j.val.sink.learned;
    r->train_seqs = r->train_tokens ? (r->train_tokens - 1) / (size_t)o->seq_len : 0;
    r->val_seqs = r->val_tokens ? (r->val_tokens - 1) / (size_t)o->seq_len : 0;
    r->padding = j.train.padding + j.val.padding;
    r->threads = threads;
    STRATA_INFO("data", "%s: %zu examples from %d file%s (tokenized on %d thread%s) in %zu train + %zu val sequences "
                "of %d tokens (%zu + %zu tokens, %zu + %zu learned, %zu padding; 32-bit shards with a loss mask, %d + "
                "%d; tokenizer.json beside them%s); longer than --seq-len: %zu split, %zu truncated, %zu dropped; bad "
                "lines skipped: %zu; repeats of an earlier example: %zu%s",
                out_dir, r->examples, o->n_files, o->n_files == 1 ? "" : "s", threads, threads == 1 ? "" : "s",
                r->train_seqs, r->val_seqs, o->seq_len,
                r->train_tokens, r->val_tokens, r->train_learned, r->val_learned, r->padding, r->train_shards,
                r->val_shards, kept ? "; the directory's other files kept" : "", r->split, r->truncated, r->dropped,
                r->bad, r->duplicates, !r->duplicates ? "" : o->dedup ? " (dropped)" : " (kept)");
    return 0;
}
