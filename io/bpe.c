/* io/bpe.c: BPE tokenizers as Hugging Face `tokenizers` runs them (io/bpe.h): loading
 * tokenizer.json (its normalizer, pre-tokenizer, BPE model, decoder and post-processor, a
 * step list each), tokenizer_config.json beside it, or vocab.json + merges.txt; encoding
 * through added tokens, normalization (NFC through io/nfc.c), PCRE2's Unicode classes and
 * merges by rank; decoding; and writing the tokenizer back in Hugging Face's formats. */
#include "io/bpe.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <errno.h>
#include <fcntl.h>
#include <pcre2.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/common.h"
#include "io/files.h"
#include "io/json.h"
#include "io/nfc.h"
#include "io/text.h"

/* the largest published tokenizer.json files (vocabularies of 250k tokens) are tens of MiB */
#define MAX_TOKENIZER_BYTES ((size_t)128 << 20)
#define MAX_CONFIG_BYTES ((size_t)16 << 20) /* tokenizer_config.json: chat templates are a few KiB */
#define MAX_VOCAB (1 << 24)
#define MAX_STEPS 8 /* steps of a normalizer, pre-tokenizer or decoder, Sequences flattened */

/* GPT-2's pre-tokenisation pattern, as tokenizers' ByteLevel pre-tokenizer has it. */
static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

/* Llama 3's and Qwen2's Split patterns (Qwen2.5's and Qwen3's are Qwen2's), as their
 * tokenizer.json hold them: pieces they make never cross a cut strata_bpe_line_cuts names. */
static const char llama3_pattern[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| "
                                     "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";
static const char qwen2_pattern[] = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\\r\\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}| "
                                    "?[^\\s\\p{L}\\p{N}]+[\\r\\n]*|\\s*[\\r\\n]+|\\s+(?!\\S)|\\s+";

/* An added token and how tokenizers' AddedVocabulary matches it (io/bpe.h, step 1). */
typedef struct added_token {
    char *content;
    size_t len;
    int id;
    int special;
    int normalized;  /* matched in the second pass, in what the first left (the normalized text) */
    int single_word; /* kept only where no word character touches it on either side */
    int lstrip;      /* takes the whitespace before it along */
    int rstrip;      /* takes the whitespace after it along */
} added_token;

/* The added tokens of one pass, grouped by first byte and longest first within a group,
 * so the first that matches at a position is the longest there. */
typedef struct added_set {
    int *tok;       /* indices into strata_bpe.added */
    int first[257]; /* the tokens starting with byte b: tok[first[b] .. first[b + 1]) */
} added_set;

/* open addressing: vocabulary string -> id */
typedef struct vocab_slot {
    const char *key; /* NULL: empty */
    size_t len;
    int id;
} vocab_slot;

/* open addressing: (left id, right id) -> (rank, merged id) */
typedef struct merge_slot {
    uint64_t pair; /* UINT64_MAX: empty */
    int rank, id;
} merge_slot;

/* A normalizer step: NFC, Prepend (`to` before a non-empty text), Replace (every `from`
 * by `to`, left to right). */
enum { NORM_NFC, NORM_PREPEND, NORM_REPLACE };
typedef struct norm_step {
    int kind;
    char *from, *to;
    size_t from_len, to_len;
} norm_step;

/* A pre-tokenizer step; each splits every piece the step before made. Split: the pattern's
 * matches and the text between them are pieces ("Isolated"). ByteLevel: a space before a
 * piece that has none (add_prefix_space), then GPT-2's pattern (use_regex); its bytes
 * become GPT-2's characters in the model. Metaspace: spaces become the replacement
 * character, one goes before the text (prepend: never, the text's first piece, always),
 * and (split) a piece begins at each replacement character. */
enum { PRE_SPLIT, PRE_BYTELEVEL, PRE_METASPACE };
enum { PREPEND_NEVER, PREPEND_FIRST, PREPEND_ALWAYS };
typedef struct pre_step {
    int kind;
    pcre2_code *re;
    int add_prefix_space, use_regex;
    char rep[5];
    size_t rep_len;
    int prepend, split;
    int line_local; /* Split: Llama 3's or Qwen2's pattern (strata_bpe_line_cuts) */
} pre_step;

/* A decoder step over the tokens' strings: ByteLevel (characters back to bytes, all tokens
 * into one text), Replace (every `from` by `to` in each token), ByteFallback (a run of
 * "<0xNN>" tokens becomes its bytes, or one U+FFFD per byte when they are no UTF-8),
 * Fuse (all into one), Strip (up to `start` leading and `stop` trailing `ch` off each),
 * Metaspace (the replacement character back to a space; in the first token it goes,
 * unless prepend is never). */
enum { DEC_BYTELEVEL, DEC_REPLACE, DEC_BYTEFALLBACK, DEC_FUSE, DEC_STRIP, DEC_METASPACE };
typedef struct dec_step {
    int kind;
    char *from, *to;
    size_t from_len, to_len;
    uint32_t ch;
    int start, stop;
    char rep[5];
    size_t rep_len;
    int prepend;
} dec_step;

/* What tokenizer_config.json says that Strata uses or writes back. */
typedef struct tok_config {
    int present;
    char *class_name, *bos, *eos, *unk, *pad, *chat_template; /* NULL: not said */
    int add_bos, add_eos;                                     /* -1: not said */
} tok_config;

struct strata_bpe {
    char source[1100];
    int n_ids;                 /* highest id + 1 */
    char **token;              /* per id: its vocabulary string (byte-mapped), NULL for a hole */
    unsigned char **bytes;     /* per id: the bytes it decodes to */
    size_t *bytes_len;
    vocab_slot *vocab;
    size_t vocab_cap;          /* power of two */
    merge_slot *merges;
    size_t merges_cap;
    int n_merges;
    int (*merge_list)[2];      /* in rank order, for writing */
    int byte_id[256];          /* the id of each byte's character, -1 if the vocabulary lacks it */
    char byte_char[256][2];    /* each byte's character in UTF-8 (all below U+0800: 1-2 bytes) */
    unsigned char byte_char_len[256];
    added_token *added;
    int n_added;
    added_set pass[2];         /* [0]: tokens with normalized false, [1]: normalized true */
    pcre2_code *word_re;       /* one word character (Rust regex's \w), when a token is single_word */
    int add_prefix_space, use_regex, ignore_merges, fuse_unk, unk_id;
    int is_bytes;
    pcre2_code *re;            /* GPT-2's pattern, for a ByteLevel step with use_regex */
    int byte_level;            /* vocabulary strings are GPT-2's byte characters (a ByteLevel step) */
    int byte_fallback;         /* a character without a token becomes its bytes' "<0xNN>" tokens */
    int byte_token[256];       /* the id of "<0xNN>", -1 */
    norm_step norm[MAX_STEPS];
    int n_norm;
    pre_step pre[MAX_STEPS];
    int n_pre;
    dec_step dec[MAX_STEPS];
    int n_dec, decoder_null;   /* decoder null: the tokens joined by spaces */
    int32_t *prefix, *suffix;  /* the post-processor's ids around one text */
    int n_prefix, n_suffix;
    tok_config cfg;
    char *json;                /* the tokenizer.json it was loaded from, NULL when generated */
    size_t json_len;
};

/* ---- GPT-2's bytes-to-unicode table ---- */

/* Printable Latin-1 bytes stand for themselves; the other 68 (controls, space, 0x7f-0xa0,
 * 0xad) are moved to U+0100 onwards, so every byte is a visible character. */
static void byte_chars(uint32_t cp[256]) {
    int n = 0;
    for (int b = 0; b < 256; b++) {
        int printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
        cp[b] = printable ? (uint32_t)b : (uint32_t)(256 + n++);
    }
}

/* ---- hash tables ---- */

static uint64_t hash_bytes(const char *s, size_t n) {
    uint64_t h = 1469598103934665603ull;
    for (size_t i = 0; i < n; i++) h = (h ^ (unsigned char)s[i]) * 1099511628211ull;
    return h;
}

static size_t pow2_at_least(size_t n) {
    size_t c = 16;
    while (c < 2 * n) c *= 2;
    return c;
}

static int vocab_find(const strata_bpe *t, const char *s, size_t n) {
    if (!t->vocab_cap) return -1;
    for (size_t i = hash_bytes(s, n) & (t->vocab_cap - 1);; i = (i + 1) & (t->vocab_cap - 1)) {
        const vocab_slot *v = &t->vocab[i];
        if (!v->key) return -1;
        if (v->len == n && !memcmp(v->key, s, n)) return v->id;
    }
}

/* Adds s -> id; returns the id already there for s, or -1 when s is new. */
static int vocab_insert(strata_bpe *t, const char *s, size_t n, int id) {
    for (size_t i = hash_bytes(s, n) & (t->vocab_cap - 1);; i = (i + 1) & (t->vocab_cap - 1)) {
        vocab_slot *v = &t->vocab[i];
        if (!v->key) {
            *v = (vocab_slot){s, n, id};
            return -1;
        }
        if (v->len == n && !memcmp(v->key, s, n)) return v->id;
    }
}

static uint64_t pair_key(int a, int b) { return (uint64_t)(uint32_t)a << 32 | (uint32_t)b; }

static merge_slot *merge_slot_of(const strata_bpe *t, uint64_t key) {
    for (size_t i = strata_hash64(key) & (t->merges_cap - 1);; i = (i + 1) & (t->merges_cap - 1))
        if (t->merges[i].pair == key || t->merges[i].pair == UINT64_MAX) return &t->merges[i];
}

static const merge_slot *merge_find(const strata_bpe *t, int a, int b) {
    if (!t->merges_cap) return NULL;
    const merge_slot *m = merge_slot_of(t, pair_key(a, b));
    return m->pair == UINT64_MAX ? NULL : m;
}

/* ---- building ---- */

void strata_bpe_free(strata_bpe *t) {
    if (!t) return;
    for (int i = 0; i < t->n_ids; i++) {
        free(t->token[i]);
        free(t->bytes[i]);
    }
    free(t->token);
    free(t->bytes);
    free(t->bytes_len);
    free(t->vocab);
    free(t->merges);
    free(t->merge_list);
    for (int i = 0; i < t->n_added; i++) free(t->added[i].content);
    free(t->added);
    free(t->pass[0].tok);
    free(t->pass[1].tok);
    if (t->re) pcre2_code_free(t->re);
    if (t->word_re) pcre2_code_free(t->word_re);
    for (int i = 0; i < t->n_norm; i++) free(t->norm[i].from), free(t->norm[i].to);
    for (int i = 0; i < t->n_pre; i++)
        if (t->pre[i].re) pcre2_code_free(t->pre[i].re);
    for (int i = 0; i < t->n_dec; i++) free(t->dec[i].from), free(t->dec[i].to);
    free(t->prefix);
    free(t->suffix);
    free(t->cfg.class_name);
    free(t->cfg.bos);
    free(t->cfg.eos);
    free(t->cfg.unk);
    free(t->cfg.pad);
    free(t->cfg.chat_template);
    free(t->json);
    free(t);
}

static strata_bpe *bpe_new(const char *source) {
    strata_bpe *t = strata_xcalloc(1, sizeof *t);
    snprintf(t->source, sizeof t->source, "%s", source);
    t->unk_id = -1;
    t->use_regex = 1;
    t->cfg.add_bos = t->cfg.add_eos = -1;
    return t;
}

/* The pre-tokenizer of GPT-2's generated tokenizers: ByteLevel alone. */
static void set_byte_level_pre(strata_bpe *t) {
    t->pre[0] = (pre_step){.kind = PRE_BYTELEVEL, .add_prefix_space = t->add_prefix_space, .use_regex = t->use_regex};
    t->n_pre = 1;
    t->byte_level = 1;
}

static char *dup_n(const char *s, size_t n) {
    char *d = strata_xmalloc(n + 1);
    memcpy(d, s, n);
    d[n] = 0;
    return d;
}

/* Sets the vocabulary from (string, id) pairs; the strings are copied. */
static int set_vocab(strata_bpe *t, const char *const *strs, const size_t *lens, const int *ids, size_t n,
                     const char *where) {
    int max_id = -1;
    for (size_t i = 0; i < n; i++) max_id = ids[i] > max_id ? ids[i] : max_id;
    t->n_ids = max_id + 1;
    t->token = strata_xcalloc((size_t)t->n_ids + 1, sizeof *t->token);
    t->bytes = strata_xcalloc((size_t)t->n_ids + 1, sizeof *t->bytes);
    t->bytes_len = strata_xcalloc((size_t)t->n_ids + 1, sizeof *t->bytes_len);
    t->vocab_cap = pow2_at_least(n);
    t->vocab = strata_xcalloc(t->vocab_cap, sizeof *t->vocab);
    for (size_t i = 0; i < n; i++) {
        if (t->token[ids[i]])
            return strata_fail("%s: id %d is given to both \"%.60s\" and \"%.60s\"", where, ids[i], t->token[ids[i]],
                               strs[i]);
        char *s = strata_xmalloc(lens[i] + 1);
        memcpy(s, strs[i], lens[i]);
        s[lens[i]] = 0;
        t->token[ids[i]] = s;
        /* the strings are distinct (a JSON object's keys, or the 256 byte characters): none
         * is there already, so the id vocab_insert would report is always -1 */
        (void)vocab_insert(t, s, lens[i], ids[i]);
    }
    uint32_t cp[256];
    byte_chars(cp);
    for (int b = 0; b < 256; b++) {
        char c[4];
        size_t n = strata_utf8_encode(c, cp[b]);
        memcpy(t->byte_char[b], c, n);
        t->byte_char_len[b] = (unsigned char)n;
        t->byte_id[b] = vocab_find(t, c, n);
    }
    return 0;
}

/* Adds merge `rank`: the pair (a, b) of vocabulary strings becomes a+b. */
static int add_merge(strata_bpe *t, int rank, const char *a, size_t na, const char *b, size_t nb, const char *where) {
    int ia = vocab_find(t, a, na), ib = vocab_find(t, b, nb);
    char *ab = strata_xmalloc(na + nb + 1);
    memcpy(ab, a, na);
    memcpy(ab + na, b, nb);
    int iab = vocab_find(t, ab, na + nb);
    int rc = 0;
    if (ia < 0 || ib < 0 || iab < 0)
        rc = strata_fail("%s: merge %d (\"%.*s\" \"%.*s\"): \"%.*s\" is not in the vocabulary", where, rank, (int)na, a,
                         (int)nb, b, (int)(ia < 0 ? na : ib < 0 ? nb : na + nb), ia < 0 ? a : ib < 0 ? b : ab);
    free(ab);
    if (rc) return -1;
    merge_slot *m = merge_slot_of(t, pair_key(ia, ib));
    /* a repeated pair keeps its last rank, as tokenizers' hash map does */
    *m = (merge_slot){pair_key(ia, ib), rank, iab};
    t->merge_list[t->n_merges][0] = ia;
    t->merge_list[t->n_merges][1] = ib;
    t->n_merges++;
    return 0;
}

static void alloc_merges(strata_bpe *t, size_t n) {
    t->merges_cap = pow2_at_least(n);
    t->merges = strata_xmalloc(t->merges_cap * sizeof *t->merges);
    for (size_t i = 0; i < t->merges_cap; i++) t->merges[i].pair = UINT64_MAX;
    t->merge_list = strata_xcalloc(n ? n : 1, sizeof *t->merge_list);
}

/* Adds an added token with the flags single_word, lstrip, rstrip and normalized false;
 * the caller sets what its file says. */
static added_token *add_added(strata_bpe *t, const char *content, size_t len, int id, int special) {
    t->added = strata_xrealloc(t->added, (size_t)(t->n_added + 1) * sizeof *t->added);
    added_token *a = &t->added[t->n_added++];
    *a = (added_token){.content = strata_xmalloc(len + 1), .len = len, .id = id, .special = special};
    memcpy(a->content, content, len);
    a->content[len] = 0;
    return a;
}

/* s[0, n) with every `from` replaced by `to`, left to right, into b. */
static void replace_all(strata_sbuf *b, const char *s, size_t n, const char *from, size_t from_len, const char *to,
                        size_t to_len) {
    size_t i = 0;
    while (i < n) {
        if (from_len && from_len <= n - i && !memcmp(s + i, from, from_len)) {
            strata_sbuf_putn(b, to, to_len);
            i += from_len;
        } else {
            strata_sbuf_putn(b, s + i, 1);
            i++;
        }
    }
}

/* The byte "<0xNN>" stands for, or -1 when s[0, n) is no such token. */
static int byte_token_value(const char *s, size_t n) {
    if (n != 6 || memcmp(s, "<0x", 3) || s[5] != '>') return -1;
    int v = 0;
    for (int i = 3; i < 5; i++) {
        char c = s[i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'A' && c <= 'F' ? c - 'A' + 10 : c >= 'a' && c <= 'f' ? c - 'a' + 10 : -1;
        if (d < 0) return -1;
        v = v * 16 + d;
    }
    return v;
}

/* The bytes a token decodes to on its own, for a tokenizer whose vocabulary is text: its
 * string through the decoder's steps that work token by token (Replace, ByteFallback of
 * one "<0xNN>", Metaspace's replacement back to a space); Fuse and Strip act on the whole
 * text (strata_bpe_decode does them, and the start strip is strata_bpe_strip_start's). */
static void text_token_bytes(const strata_bpe *t, const char *tok, strata_sbuf *out) {
    strata_sbuf cur = {0}, next = {0};
    strata_sbuf_putn(&cur, tok, strlen(tok));
    for (int k = 0; k < t->n_dec; k++) {
        const dec_step *d = &t->dec[k];
        next.len = 0;
        if (d->kind == DEC_REPLACE) {
            replace_all(&next, cur.p, cur.len, d->from, d->from_len, d->to, d->to_len);
        } else if (d->kind == DEC_METASPACE) {
            replace_all(&next, cur.p, cur.len, d->rep, d->rep_len, " ", 1);
        } else if (d->kind == DEC_BYTEFALLBACK && byte_token_value(cur.p, cur.len) >= 0) {
            char b = (char)byte_token_value(cur.p, cur.len);
            strata_sbuf_putn(&next, &b, 1);
        } else {
            continue;
        }
        strata_sbuf tmp = cur;
        cur = next;
        next = tmp;
    }
    out->len = 0;
    if (cur.len) strata_sbuf_putn(out, cur.p, cur.len);
    strata_sbuf_free(&cur);
    strata_sbuf_free(&next);
}

/* Decoded bytes of every id. Byte-level vocabularies: the ByteLevel decoder, each
 * character back to its byte (a token with a character outside the table, like an added
 * token's text, is its own UTF-8). Others: text_token_bytes. */
static void build_decoding(strata_bpe *t) {
    uint32_t cp[256];
    byte_chars(cp);
    int rev[324];
    for (int i = 0; i < 324; i++) rev[i] = -1;
    for (int b = 0; b < 256; b++) rev[cp[b]] = b;
    for (int i = 0; i < t->n_added; i++) {
        int id = t->added[i].id;
        if (!t->token[id]) t->token[id] = strata_xstrdup(t->added[i].content);
    }
    strata_sbuf tb = {0};
    for (int id = 0; id < t->n_ids; id++) {
        const unsigned char *s = (const unsigned char *)t->token[id];
        if (!s) continue;
        size_t n = strlen((const char *)s), k = 0;
        if (!t->byte_level) {
            text_token_bytes(t, (const char *)s, &tb);
            t->bytes[id] = (unsigned char *)dup_n(tb.len ? tb.p : "", tb.len);
            t->bytes_len[id] = tb.len;
            continue;
        }
        unsigned char *out = strata_xmalloc(n + 1);
        int mapped = 1;
        for (size_t i = 0; i < n && mapped;) {
            uint32_t c;
            if (s[i] < 0x80) c = s[i++];
            else if ((s[i] & 0xE0) == 0xC0 && i + 1 < n) c = (uint32_t)(s[i] & 0x1F) << 6 | (s[i + 1] & 0x3F), i += 2;
            else c = 0xFFFFFFFF, i = n;
            if (c < 324 && rev[c] >= 0) out[k++] = (unsigned char)rev[c];
            else mapped = 0;
        }
        if (!mapped) {
            memcpy(out, s, n);
            k = n;
        }
        t->bytes[id] = out;
        t->bytes_len[id] = k;
    }
    strata_sbuf_free(&tb);
}

/* PCRE2's text for error code err (cut to fit n bytes), or "PCRE2 error N" for a code it
 * has no text for, which would leave buf unwritten. */
static const char *pcre2_message(int err, char *buf, size_t n) {
    if (pcre2_get_error_message(err, (PCRE2_UCHAR *)buf, n) == PCRE2_ERROR_BADDATA)
        snprintf(buf, n, "PCRE2 error %d", err);
    return buf;
}

static int compile_pattern(pcre2_code **re, const char *pattern, const char *what) {
    int err;
    PCRE2_SIZE off;
    *re = pcre2_compile((PCRE2_SPTR)pattern, PCRE2_ZERO_TERMINATED, PCRE2_UTF | PCRE2_UCP, &err, &off, NULL);
    if (!*re) {
        char msg[256];
        return strata_fail("PCRE2 cannot compile %s at %zu: %s", what, (size_t)off, pcre2_message(err, msg, sizeof msg));
    }
    /* faster where available; where JIT is not, its error is the answer and the
     * interpreter runs instead */
    (void)pcre2_jit_compile(*re, PCRE2_JIT_COMPLETE);
    return 0;
}

typedef struct added_key {
    unsigned char first;
    size_t len;
    int index;
} added_key;

/* by first byte, then longest first, then in the file's order */
static int added_key_cmp(const void *pa, const void *pb) {
    const added_key *a = pa, *b = pb;
    if (a->first != b->first) return a->first < b->first ? -1 : 1;
    if (a->len != b->len) return a->len > b->len ? -1 : 1;
    return a->index < b->index ? -1 : a->index > b->index;
}

/* Sorts the added tokens into their two passes (see added_set). */
static void build_added_sets(strata_bpe *t) {
    added_key *keys = strata_xmalloc((size_t)(t->n_added ? t->n_added : 1) * sizeof *keys);
    for (int p = 0; p < 2; p++) {
        added_set *set = &t->pass[p];
        int n = 0;
        for (int i = 0; i < t->n_added; i++)
            if (t->added[i].normalized == p)
                keys[n++] = (added_key){(unsigned char)t->added[i].content[0], t->added[i].len, i};
        qsort(keys, (size_t)n, sizeof *keys, added_key_cmp);
        set->tok = strata_xmalloc((size_t)(n ? n : 1) * sizeof *set->tok);
        for (int k = 0, b = 0; b <= 256; b++) {
            set->first[b] = k;
            while (b < 256 && k < n && keys[k].first == b) set->tok[k] = keys[k].index, k++;
        }
    }
    free(keys);
}

static int finish(strata_bpe *t) {
    build_decoding(t);
    build_added_sets(t);
    for (int b = 0; b < 256; b++) {
        char name[8];
        snprintf(name, sizeof name, "<0x%02X>", b);
        t->byte_token[b] = vocab_find(t, name, 6);
    }
    /* the byte-level identity (what strata_bpe_bytes writes), however it was spelled */
    int identity = t->byte_level && t->n_pre == 1 && !t->n_norm && !t->n_prefix && !t->n_suffix && t->n_ids == 256 &&
                   !t->n_merges && !t->n_added && !t->add_prefix_space && t->unk_id < 0;
    for (int b = 0; b < 256 && identity; b++) identity = t->byte_id[b] == b;
    t->is_bytes = identity;
    int single_word = 0;
    for (int i = 0; i < t->n_added; i++) single_word |= t->added[i].single_word;
    /* tokenizers tests single_word with Rust regex's Unicode \w: Alphabetic, marks, decimal
     * digits, connector punctuation and the two joiners (PCRE2's own \w differs) */
    if (single_word &&
        compile_pattern(&t->word_re, "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}]", "the word class"))
        return -1;
    int gpt2 = 0;
    for (int i = 0; i < t->n_pre; i++) gpt2 |= t->pre[i].kind == PRE_BYTELEVEL && t->pre[i].use_regex;
    return gpt2 ? compile_pattern(&t->re, gpt2_pattern, "GPT-2's pattern") : 0;
}

/* ---- tokenizer.json ---- */

static int is_null(const strata_json *v) { return !v || v->type == STRATA_JSON_NULL; }

static const char *type_of(const strata_json *v) {
    const strata_json *t = strata_json_get(v, "type");
    return t && t->type == STRATA_JSON_STRING ? t->str : "?";
}

static int bool_field(const strata_json *obj, const char *key, int def, const char *where, int *out) {
    const strata_json *v = strata_json_get(obj, key);
    *out = def;
    if (is_null(v)) return 0;
    if (v->type != STRATA_JSON_BOOL) return strata_fail("%s: \"%s\" must be true or false, got %s", where, key, strata_json_kind(v));
    *out = v->boolean;
    return 0;
}

/* A string field, or NULL (and an error) when it is missing or not a string. */
static const strata_json *string_field(const strata_json *obj, const char *key, const char *where) {
    const strata_json *v = strata_json_get(obj, key);
    if (!v || v->type != STRATA_JSON_STRING) {
        strata_fail("%s: \"%s\" must be a string, got %s", where, key, v ? strata_json_kind(v) : "nothing");
        return NULL;
    }
    return v;
}

/* A pattern {"String": s} (or, with allow_regex, {"Regex": r}): *is_regex says which. */
static const strata_json *pattern_field(const strata_json *obj, const char *where, int allow_regex, int *is_regex) {
    const strata_json *p = strata_json_get(obj, "pattern"), *v;
    *is_regex = 0;
    if (p && (v = strata_json_get(p, "String")) && v->type == STRATA_JSON_STRING) return v;
    if (p && (v = strata_json_get(p, "Regex")) && v->type == STRATA_JSON_STRING) {
        if (allow_regex) {
            *is_regex = 1;
            return v;
        }
        strata_fail("%s: its pattern is a Regex; Strata reads a String pattern here", where);
        return NULL;
    }
    strata_fail("%s: \"pattern\" must be {\"String\": ...}%s", where, allow_regex ? " or {\"Regex\": ...}" : "");
    return NULL;
}

/* One character of a string field (Metaspace's replacement, Strip's content), as UTF-8. */
static int char_field(const strata_json *obj, const char *key, const char *where, char *out, size_t *len, uint32_t *cp) {
    const strata_json *v = string_field(obj, key, where);
    if (!v) return -1;
    size_t n = v->len ? strata_utf8_decode(v->str, v->len, cp) : 0;
    if (!n || n != v->len) return strata_fail("%s: \"%s\" must be one character, got \"%.20s\"", where, key, v->str);
    memcpy(out, v->str, n);
    out[n] = 0;
    *len = n;
    return 0;
}

static int count_field(const strata_json *obj, const char *key, const char *where, int *out) {
    const strata_json *v = strata_json_get(obj, key);
    if (!v || v->type != STRATA_JSON_NUMBER || !v->is_int || v->integer < 0 || v->integer > 1000)
        return strata_fail("%s: \"%s\" must be a count in [0, 1000]", where, key);
    *out = (int)v->integer;
    return 0;
}

/* Metaspace's prepend_scheme, or (older files) add_prefix_space: always or never. */
static int prepend_field(const strata_json *obj, const char *where, int *out) {
    const strata_json *v = strata_json_get(obj, "prepend_scheme");
    if (!is_null(v)) {
        if (v->type == STRATA_JSON_STRING && !strcmp(v->str, "always")) *out = PREPEND_ALWAYS;
        else if (v->type == STRATA_JSON_STRING && !strcmp(v->str, "first")) *out = PREPEND_FIRST;
        else if (v->type == STRATA_JSON_STRING && !strcmp(v->str, "never")) *out = PREPEND_NEVER;
        else return strata_fail("%s: prepend_scheme must be \"always\", \"first\" or \"never\"", where);
        return 0;
    }
    int aps;
    if (bool_field(obj, "add_prefix_space", 1, where, &aps)) return -1;
    *out = aps ? PREPEND_ALWAYS : PREPEND_NEVER;
    return 0;
}

/* A Sequence's list under `key`, for the readers below to walk. */
static const strata_json *sequence_list(const strata_json *v, const char *key, const char *where, int depth) {
    const strata_json *list = strata_json_get(v, key);
    if (depth >= 4) {
        strata_fail("%s: Sequences nested more than 4 deep", where);
        return NULL;
    }
    if (!list || list->type != STRATA_JSON_ARRAY) {
        strata_fail("%s: a Sequence needs the array \"%s\"", where, key);
        return NULL;
    }
    return list;
}

/* normalizer: NFC, Prepend, Replace of a string, and Sequences of them. */
static int read_normalizer(strata_bpe *t, const strata_json *n, const char *path, int depth) {
    char where[1200];
    snprintf(where, sizeof where, "%s: normalizer", path);
    if (is_null(n)) return 0;
    const char *type = type_of(n);
    if (!strcmp(type, "Sequence")) {
        const strata_json *list = sequence_list(n, "normalizers", where, depth);
        if (!list) return -1;
        for (size_t i = 0; i < list->len; i++) STRATA_TRY(read_normalizer(t, &list->items[i], path, depth + 1));
        return 0;
    }
    if (t->n_norm == MAX_STEPS) return strata_fail("%s: more than %d steps", where, MAX_STEPS);
    norm_step st = {0};
    int is_regex;
    const strata_json *v;
    if (!strcmp(type, "NFC")) {
        st.kind = NORM_NFC;
    } else if (!strcmp(type, "Prepend")) {
        if (!(v = string_field(n, "prepend", where))) return -1;
        st.kind = NORM_PREPEND;
        st.to = dup_n(v->str, v->len), st.to_len = v->len;
    } else if (!strcmp(type, "Replace")) {
        const strata_json *content;
        if (!(v = pattern_field(n, where, 0, &is_regex)) || !(content = string_field(n, "content", where))) return -1;
        st.kind = NORM_REPLACE;
        st.from = dup_n(v->str, v->len), st.from_len = v->len;
        st.to = dup_n(content->str, content->len), st.to_len = content->len;
    } else {
        return strata_fail("%s is %s; Strata reads NFC, Prepend, Replace of a string, and Sequences of them (the "
                           "normalizers of Llama 3, Qwen2/2.5/3, Llama 2, Mistral and GPT-2)", where, type);
    }
    t->norm[t->n_norm++] = st;
    return 0;
}

static int compile_split(pcre2_code **re, const strata_json *pat, int is_regex, const char *where) {
    int err;
    PCRE2_SIZE off;
    *re = pcre2_compile((PCRE2_SPTR)pat->str, pat->len, PCRE2_UTF | PCRE2_UCP | (is_regex ? 0 : PCRE2_LITERAL), &err, &off,
                        NULL);
    if (!*re) {
        char msg[256];
        return strata_fail("%s: PCRE2 cannot compile the pattern at %zu: %s", where, (size_t)off,
                           pcre2_message(err, msg, sizeof msg));
    }
    (void)pcre2_jit_compile(*re, PCRE2_JIT_COMPLETE); /* where JIT is not, the interpreter runs */
    return 0;
}

/* pre_tokenizer: Split (Isolated), ByteLevel, Metaspace, and Sequences of them. */
static int read_pre_tokenizer(strata_bpe *t, const strata_json *pt, const char *path, int depth) {
    char where[1200];
    snprintf(where, sizeof where, "%s: pre_tokenizer", path);
    if (is_null(pt)) return 0;
    if (pt->type != STRATA_JSON_OBJECT) return strata_fail("%s must be an object, got %s", where, strata_json_kind(pt));
    const char *type = type_of(pt);
    if (!strcmp(type, "Sequence")) {
        const strata_json *list = sequence_list(pt, "pretokenizers", where, depth);
        if (!list) return -1;
        for (size_t i = 0; i < list->len; i++) STRATA_TRY(read_pre_tokenizer(t, &list->items[i], path, depth + 1));
        return 0;
    }
    if (t->n_pre == MAX_STEPS) return strata_fail("%s: more than %d steps", where, MAX_STEPS);
    pre_step *st = &t->pre[t->n_pre];
    *st = (pre_step){0};
    if (!strcmp(type, "ByteLevel")) {
        st->kind = PRE_BYTELEVEL;
        if (bool_field(pt, "add_prefix_space", 1, where, &st->add_prefix_space) ||
            bool_field(pt, "use_regex", 1, where, &st->use_regex))
            return -1;
        if (!t->byte_level) t->add_prefix_space = st->add_prefix_space, t->use_regex = st->use_regex;
        t->byte_level = 1;
    } else if (!strcmp(type, "Split")) {
        int is_regex, invert;
        const strata_json *pat = pattern_field(pt, where, 1, &is_regex), *behavior = strata_json_get(pt, "behavior");
        if (!pat || bool_field(pt, "invert", 0, where, &invert)) return -1;
        if (invert || !behavior || behavior->type != STRATA_JSON_STRING || strcmp(behavior->str, "Isolated"))
            return strata_fail("%s: Split with behavior %s%s; Strata reads Isolated (each match a piece, as Llama 3's and "
                               "Qwen's tokenizers split)", where,
                               behavior && behavior->type == STRATA_JSON_STRING ? behavior->str : "?",
                               invert ? ", inverted" : "");
        st->kind = PRE_SPLIT;
        if (compile_split(&st->re, pat, is_regex, where)) return -1;
        st->line_local = is_regex && (!strcmp(pat->str, llama3_pattern) || !strcmp(pat->str, qwen2_pattern));
    } else if (!strcmp(type, "Metaspace")) {
        uint32_t cp;
        st->kind = PRE_METASPACE;
        if (char_field(pt, "replacement", where, st->rep, &st->rep_len, &cp) || prepend_field(pt, where, &st->prepend) ||
            bool_field(pt, "split", 1, where, &st->split))
            return -1;
    } else {
        return strata_fail("%s is of type %s; Strata reads ByteLevel, Split (Isolated), Metaspace and Sequences of them "
                           "(the pre-tokenizers of Llama 3, Qwen2/2.5/3, Mistral and GPT-2)", where, type);
    }
    t->n_pre++;
    return 0;
}

/* decoder: ByteLevel for byte-level vocabularies; Replace, ByteFallback, Fuse, Strip and
 * Metaspace (and Sequences of them) for vocabularies of text. */
static int read_decoder(strata_bpe *t, const strata_json *d, const char *path, int depth) {
    char where[1200];
    snprintf(where, sizeof where, "%s: decoder", path);
    if (is_null(d)) {
        if (depth == 0) t->decoder_null = 1;
        return 0;
    }
    const char *type = type_of(d);
    if (!strcmp(type, "Sequence")) {
        const strata_json *list = sequence_list(d, "decoders", where, depth);
        if (!list) return -1;
        for (size_t i = 0; i < list->len; i++) STRATA_TRY(read_decoder(t, &list->items[i], path, depth + 1));
        return 0;
    }
    if (t->n_dec == MAX_STEPS) return strata_fail("%s: more than %d steps", where, MAX_STEPS);
    dec_step st = {0};
    int is_regex;
    const strata_json *v, *content;
    if (!strcmp(type, "ByteLevel")) {
        st.kind = DEC_BYTELEVEL;
    } else if (!strcmp(type, "Replace")) {
        if (!(v = pattern_field(d, where, 0, &is_regex)) || !(content = string_field(d, "content", where))) return -1;
        st.kind = DEC_REPLACE;
        st.from = dup_n(v->str, v->len), st.from_len = v->len;
        st.to = dup_n(content->str, content->len), st.to_len = content->len;
    } else if (!strcmp(type, "ByteFallback")) {
        st.kind = DEC_BYTEFALLBACK;
    } else if (!strcmp(type, "Fuse")) {
        st.kind = DEC_FUSE;
    } else if (!strcmp(type, "Strip")) {
        char c[5];
        size_t n;
        st.kind = DEC_STRIP;
        if (char_field(d, "content", where, c, &n, &st.ch) || count_field(d, "start", where, &st.start) ||
            count_field(d, "stop", where, &st.stop))
            return -1;
    } else if (!strcmp(type, "Metaspace")) {
        uint32_t cp;
        st.kind = DEC_METASPACE;
        if (char_field(d, "replacement", where, st.rep, &st.rep_len, &cp) || prepend_field(d, where, &st.prepend)) return -1;
    } else {
        return strata_fail("%s is %s; Strata decodes with ByteLevel, or Replace, ByteFallback, Fuse, Strip and Metaspace "
                           "(and Sequences of them)", where, type);
    }
    t->dec[t->n_dec++] = st;
    return 0;
}

/* The decoder must fit the vocabulary: ByteLevel (or none) for byte-level BPE, no
 * ByteLevel step for a vocabulary of text. */
static int check_decoder(const strata_bpe *t, const char *path) {
    int byte_steps = 0;
    for (int i = 0; i < t->n_dec; i++) byte_steps += t->dec[i].kind == DEC_BYTELEVEL;
    if (t->byte_level && (t->n_dec > 1 || (t->n_dec == 1 && !byte_steps)))
        return strata_fail("%s: decoder is %s; byte-level BPE decodes with ByteLevel", path,
                           t->n_dec > 1 ? "a Sequence" : "not ByteLevel");
    if (!t->byte_level && byte_steps)
        return strata_fail("%s: decoder is ByteLevel, but the pre-tokenizer has no ByteLevel step (the vocabulary is not "
                           "byte-level)", path);
    return 0;
}

static int read_model(strata_bpe *t, const strata_json *model, const char *path) {
    char where[1200];
    snprintf(where, sizeof where, "%s: model", path);
    if (!model || model->type != STRATA_JSON_OBJECT) return strata_fail("%s: expected an object, got %s", where, strata_json_kind(model));
    const strata_json *type = strata_json_get(model, "type");
    if (type && (type->type != STRATA_JSON_STRING || strcmp(type->str, "BPE")))
        return strata_fail("%s: type is %s; Strata encodes BPE models", where, type->type == STRATA_JSON_STRING ? type->str : strata_json_kind(type));
    const strata_json *v;
    if (!is_null(v = strata_json_get(model, "dropout")))
        return strata_fail("%s: dropout is set; BPE dropout makes encoding random, which a corpus does not want "
                           "(set it to null)", where);
    static const char *const affixes[] = {"continuing_subword_prefix", "end_of_word_suffix"};
    for (int i = 0; i < 2; i++)
        if (!is_null(v = strata_json_get(model, affixes[i])) && !(v->type == STRATA_JSON_STRING && v->len == 0))
            return strata_fail("%s: %s is set; GPT-2's byte-level BPE has none", where, affixes[i]);
    int byte_fallback;
    if (bool_field(model, "byte_fallback", 0, where, &byte_fallback) ||
        bool_field(model, "fuse_unk", 0, where, &t->fuse_unk) ||
        bool_field(model, "ignore_merges", 0, where, &t->ignore_merges))
        return -1;
    if (byte_fallback && t->byte_level) return strata_fail("%s: byte_fallback is true; byte-level BPE never needs it", where);
    t->byte_fallback = byte_fallback;
    const strata_json *vocab = strata_json_get(model, "vocab");
    if (!vocab || vocab->type != STRATA_JSON_OBJECT) return strata_fail("%s: \"vocab\" must be an object, got %s", where, strata_json_kind(vocab));
    size_t n = vocab->len;
    const char **strs = strata_xmalloc((n ? n : 1) * sizeof *strs);
    size_t *lens = strata_xmalloc((n ? n : 1) * sizeof *lens);
    int *ids = strata_xmalloc((n ? n : 1) * sizeof *ids);
    int rc = 0;
    for (size_t i = 0; i < n && !rc; i++) {
        const strata_json_member *m = &vocab->members[i];
        if (m->value.type != STRATA_JSON_NUMBER || !m->value.is_int || m->value.integer < 0 || m->value.integer >= MAX_VOCAB)
            rc = strata_fail("%s: vocab \"%.60s\" must have an id in [0, %d)", where, m->key, MAX_VOCAB);
        strs[i] = m->key;
        lens[i] = m->key_len;
        ids[i] = (int)m->value.integer;
    }
    if (!rc) rc = set_vocab(t, strs, lens, ids, n, where);
    free(strs);
    free(lens);
    free(ids);
    if (rc) return -1;
    const strata_json *unk = strata_json_get(model, "unk_token");
    if (!is_null(unk)) {
        if (unk->type != STRATA_JSON_STRING || (t->unk_id = vocab_find(t, unk->str, unk->len)) < 0)
            return strata_fail("%s: unk_token must be a token of the vocabulary", where);
    }
    const strata_json *merges = strata_json_get(model, "merges");
    if (!merges || merges->type != STRATA_JSON_ARRAY) return strata_fail("%s: \"merges\" must be an array, got %s", where, strata_json_kind(merges));
    alloc_merges(t, merges->len);
    for (size_t r = 0; r < merges->len; r++) {
        const strata_json *m = &merges->items[r];
        if (m->type == STRATA_JSON_STRING) { /* "a b" */
            const char *sp = memchr(m->str, ' ', m->len);
            if (!sp || memchr(sp + 1, ' ', m->len - (size_t)(sp + 1 - m->str)))
                return strata_fail("%s: merge %zu \"%.60s\" must be two tokens separated by one space", where, r, m->str);
            if (add_merge(t, (int)r, m->str, (size_t)(sp - m->str), sp + 1, m->len - (size_t)(sp + 1 - m->str), where)) return -1;
        } else if (m->type == STRATA_JSON_ARRAY && m->len == 2 && m->items[0].type == STRATA_JSON_STRING &&
                   m->items[1].type == STRATA_JSON_STRING) { /* ["a", "b"] */
            if (add_merge(t, (int)r, m->items[0].str, m->items[0].len, m->items[1].str, m->items[1].len, where)) return -1;
        } else {
            return strata_fail("%s: merge %zu must be \"a b\" or [\"a\", \"b\"], got %s", where, r, strata_json_kind(m));
        }
    }
    return 0;
}

/* post_processor: the ids TemplateProcessing's single template puts before and after the
 * text ($A), ByteLevel (offsets only: none), and Sequences of them. */
static int read_post_processor(strata_bpe *t, const strata_json *pp, const char *path, int depth, int *templates) {
    char where[1200];
    snprintf(where, sizeof where, "%s: post_processor", path);
    if (is_null(pp)) return 0;
    const char *type = type_of(pp);
    if (!strcmp(type, "ByteLevel")) return 0;
    if (!strcmp(type, "Sequence")) {
        const strata_json *list = sequence_list(pp, "processors", where, depth);
        if (!list) return -1;
        for (size_t i = 0; i < list->len; i++)
            STRATA_TRY(read_post_processor(t, &list->items[i], path, depth + 1, templates));
        return 0;
    }
    if (strcmp(type, "TemplateProcessing"))
        return strata_fail("%s is %s; Strata reads TemplateProcessing (the tokens around one text), ByteLevel and "
                           "Sequences of them", where, type);
    if (++*templates > 1) return strata_fail("%s: more than one TemplateProcessing", where);
    const strata_json *single = strata_json_get(pp, "single"), *specials = strata_json_get(pp, "special_tokens");
    if (!single || single->type != STRATA_JSON_ARRAY) return strata_fail("%s: TemplateProcessing needs the array \"single\"", where);
    int seen_a = 0;
    for (size_t i = 0; i < single->len; i++) {
        const strata_json *item = &single->items[i], *seq = strata_json_get(item, "Sequence"),
                          *sp = strata_json_get(item, "SpecialToken"), *id;
        if (seq) {
            if (seen_a++ || !(id = strata_json_get(seq, "id")) || id->type != STRATA_JSON_STRING || strcmp(id->str, "A"))
                return strata_fail("%s: the single template must hold the text ($A) once", where);
            continue;
        }
        if (!sp || !(id = strata_json_get(sp, "id")) || id->type != STRATA_JSON_STRING)
            return strata_fail("%s: single[%zu] must be a SpecialToken or the Sequence A", where, i);
        const strata_json *entry = strata_json_get(specials, id->str), *ids = strata_json_get(entry, "ids");
        if (!ids || ids->type != STRATA_JSON_ARRAY || !ids->len)
            return strata_fail("%s: special token \"%.60s\" has no ids in \"special_tokens\"", where, id->str);
        for (size_t k = 0; k < ids->len; k++) {
            const strata_json *x = &ids->items[k];
            if (x->type != STRATA_JSON_NUMBER || !x->is_int || x->integer < 0 || x->integer >= MAX_VOCAB)
                return strata_fail("%s: special token \"%.60s\" has an id outside [0, %d)", where, id->str, MAX_VOCAB);
            int32_t **list = seen_a ? &t->suffix : &t->prefix;
            int *n = seen_a ? &t->n_suffix : &t->n_prefix;
            *list = strata_xrealloc(*list, (size_t)(*n + 1) * sizeof **list);
            (*list)[(*n)++] = (int32_t)x->integer;
        }
    }
    if (!seen_a) return strata_fail("%s: the single template must hold the text ($A) once", where);
    return 0;
}

static int read_added(strata_bpe *t, const strata_json *added, const char *path) {
    if (is_null(added)) return 0;
    if (added->type != STRATA_JSON_ARRAY) return strata_fail("%s: added_tokens must be an array, got %s", path, strata_json_kind(added));
    for (size_t i = 0; i < added->len; i++) {
        const strata_json *a = &added->items[i];
        const strata_json *id = strata_json_get(a, "id"), *content = strata_json_get(a, "content");
        if (!id || id->type != STRATA_JSON_NUMBER || !id->is_int || id->integer < 0 || id->integer >= MAX_VOCAB ||
            !content || content->type != STRATA_JSON_STRING || content->len == 0)
            return strata_fail("%s: added_tokens[%zu] needs an \"id\" in [0, %d) and a non-empty \"content\"", path, i, MAX_VOCAB);
        char where[1200];
        snprintf(where, sizeof where, "%s: added_tokens[%zu]", path, i);
        /* tokenizers writes every flag; where one is missing, normalized follows its
         * AddedToken::from (special tokens are not normalized), the others are off */
        int special, normalized, single_word, lstrip, rstrip;
        if (bool_field(a, "special", 0, where, &special) || bool_field(a, "normalized", !special, where, &normalized) ||
            bool_field(a, "single_word", 0, where, &single_word) || bool_field(a, "lstrip", 0, where, &lstrip) ||
            bool_field(a, "rstrip", 0, where, &rstrip))
            return -1;
        int vid = vocab_find(t, content->str, content->len);
        if (vid >= 0 && vid != (int)id->integer)
            return strata_fail("%s: added token \"%.40s\" has id %lld but the vocabulary gives it %d", path, content->str,
                               (long long)id->integer, vid);
        if (id->integer >= t->n_ids) { /* beyond the vocabulary: grow the per-id tables */
            int n = (int)id->integer + 1;
            t->token = strata_xrealloc(t->token, (size_t)n * sizeof *t->token);
            t->bytes = strata_xrealloc(t->bytes, (size_t)n * sizeof *t->bytes);
            t->bytes_len = strata_xrealloc(t->bytes_len, (size_t)n * sizeof *t->bytes_len);
            for (int k = t->n_ids; k < n; k++) t->token[k] = NULL, t->bytes[k] = NULL, t->bytes_len[k] = 0;
            t->n_ids = n;
        } else if (vid < 0 && t->token[id->integer]) {
            return strata_fail("%s: added token \"%.40s\" has id %lld, which is the vocabulary's \"%.40s\"", path,
                               content->str, (long long)id->integer, t->token[id->integer]);
        }
        added_token *at = add_added(t, content->str, content->len, (int)id->integer, special);
        at->normalized = normalized;
        at->single_word = single_word;
        at->lstrip = lstrip;
        at->rstrip = rstrip;
    }
    return 0;
}

/* Every id the template names must be a token. */
static int check_template(const strata_bpe *t, const char *path) {
    for (int k = 0; k < t->n_prefix + t->n_suffix; k++) {
        int32_t id = k < t->n_prefix ? t->prefix[k] : t->suffix[k - t->n_prefix];
        if (id >= t->n_ids || !t->token[id])
            return strata_fail("%s: post_processor's template names id %d, which is no token of the vocabulary", path, id);
    }
    return 0;
}

/* The id of token text s: an added token's, else the vocabulary's; -1. */
static int token_id(const strata_bpe *t, const char *s) {
    for (int i = 0; i < t->n_added; i++)
        if (!strcmp(t->added[i].content, s)) return t->added[i].id;
    return vocab_find(t, s, strlen(s));
}

/* A token of tokenizer_config.json: a string, or an object with "content"; NULL when null. */
static int config_token(const strata_json *cfg, const char *key, const char *where, char **out) {
    const strata_json *v = strata_json_get(cfg, key);
    if (is_null(v)) return 0;
    if (v->type == STRATA_JSON_OBJECT) v = strata_json_get(v, "content");
    if (!v || v->type != STRATA_JSON_STRING)
        return strata_fail("%s: \"%s\" must be a string or an object with \"content\"", where, key);
    *out = dup_n(v->str, v->len);
    return 0;
}

/* tokenizer_config.json beside a tokenizer.json: the settings Strata uses (the BOS and EOS
 * tokens, the chat template) and carries to an export. With a Llama tokenizer class,
 * add_bos_token and add_eos_token decide the tokens around a text, as transformers 4's
 * LlamaTokenizerFast rebuilds its post-processor from them. */
static int read_config(strata_bpe *t, const char *json_path) {
    const char *slash = strrchr(json_path, '/');
    if (strcmp(slash ? slash + 1 : json_path, "tokenizer.json")) return 0;
    char path[STRATA_PATH_MAX + 32];
    snprintf(path, sizeof path, "%.*stokenizer_config.json", slash ? (int)(slash + 1 - json_path) : 0, json_path);
    if (!strata_is_file(path)) return 0;
    strata_json_doc doc;
    if (strata_json_parse_file(&doc, path, MAX_CONFIG_BYTES)) return -1;
    const strata_json *r = &doc.root, *v;
    tok_config *c = &t->cfg;
    int rc = r->type == STRATA_JSON_OBJECT ? 0 : strata_fail("%s: expected an object, got %s", path, strata_json_kind(r));
    if (!rc && !is_null(v = strata_json_get(r, "tokenizer_class"))) {
        if (v->type == STRATA_JSON_STRING) c->class_name = dup_n(v->str, v->len);
        else rc = strata_fail("%s: \"tokenizer_class\" must be a string", path);
    }
    if (!rc) rc = config_token(r, "bos_token", path, &c->bos) || config_token(r, "eos_token", path, &c->eos) ||
                  config_token(r, "unk_token", path, &c->unk) || config_token(r, "pad_token", path, &c->pad);
    if (!rc && !is_null(v = strata_json_get(r, "add_bos_token"))) rc = bool_field(r, "add_bos_token", 0, path, &c->add_bos);
    if (!rc && !is_null(v = strata_json_get(r, "add_eos_token"))) rc = bool_field(r, "add_eos_token", 0, path, &c->add_eos);
    if (!rc && (v = strata_json_get(r, "chat_template")) && v->type == STRATA_JSON_STRING)
        c->chat_template = dup_n(v->str, v->len); /* a list of named templates is not carried */
    strata_json_free(&doc);
    if (rc) return -1;
    c->present = 1;
    static const char *const llama[] = {"LlamaTokenizer", "LlamaTokenizerFast", "CodeLlamaTokenizer",
                                        "CodeLlamaTokenizerFast"};
    int is_llama = 0;
    for (int i = 0; i < 4; i++) is_llama |= c->class_name && !strcmp(c->class_name, llama[i]);
    if (is_llama && (c->add_bos >= 0 || c->add_eos >= 0)) {
        int add_bos = c->add_bos != 0, add_eos = c->add_eos == 1; /* LlamaTokenizerFast's defaults */
        int bos = c->bos ? token_id(t, c->bos) : -1, eos = c->eos ? token_id(t, c->eos) : -1;
        if ((add_bos && bos < 0) || (add_eos && eos < 0))
            return strata_fail("%s: add_%s_token is true, but its %s_token is %s", path, add_bos && bos < 0 ? "bos" : "eos",
                               add_bos && bos < 0 ? "bos" : "eos", "not a token of the tokenizer");
        t->n_prefix = t->n_suffix = 0;
        if (add_bos) {
            t->prefix = strata_xrealloc(t->prefix, sizeof *t->prefix);
            t->prefix[t->n_prefix++] = bos;
        }
        if (add_eos) {
            t->suffix = strata_xrealloc(t->suffix, sizeof *t->suffix);
            t->suffix[t->n_suffix++] = eos;
        }
    }
    return 0;
}

static strata_bpe *load_json(const char *path) {
    strata_bpe *t = bpe_new(path);
    if (strata_read_file_bounded(path, MAX_TOKENIZER_BYTES, &t->json, &t->json_len)) {
        strata_bpe_free(t);
        return NULL;
    }
    strata_json_doc doc;
    if (strata_json_parse(&doc, t->json, t->json_len, path)) {
        strata_bpe_free(t);
        return NULL;
    }
    const strata_json *r = &doc.root;
    int rc = 0;
    if (r->type != STRATA_JSON_OBJECT) rc = strata_fail("%s: expected a tokenizer object, got %s", path, strata_json_kind(r));
    int templates = 0;
    if (!rc) rc = read_normalizer(t, strata_json_get(r, "normalizer"), path, 0);
    if (!rc) rc = read_pre_tokenizer(t, strata_json_get(r, "pre_tokenizer"), path, 0);
    if (!rc) rc = read_decoder(t, strata_json_get(r, "decoder"), path, 0);
    if (!rc) rc = check_decoder(t, path);
    if (!rc) rc = read_post_processor(t, strata_json_get(r, "post_processor"), path, 0, &templates);
    if (!rc) rc = read_model(t, strata_json_get(r, "model"), path);
    if (!rc) rc = read_added(t, strata_json_get(r, "added_tokens"), path);
    strata_json_free(&doc);
    if (!rc) rc = finish(t);
    if (!rc) rc = check_template(t, path);
    if (!rc) rc = read_config(t, path);
    if (rc) {
        strata_bpe_free(t);
        return NULL;
    }
    return t;
}

/* ---- vocab.json + merges.txt ---- */

static strata_bpe *load_vocab_merges(const char *vocab_path, const char *merges_path, const char *source) {
    strata_bpe *t = bpe_new(source);
    t->add_prefix_space = 0; /* GPT-2's own settings */
    strata_json_doc doc;
    if (strata_json_parse_file(&doc, vocab_path, MAX_TOKENIZER_BYTES)) {
        strata_bpe_free(t);
        return NULL;
    }
    const strata_json *vocab = &doc.root;
    int rc = 0;
    if (vocab->type != STRATA_JSON_OBJECT) rc = strata_fail("%s: expected an object {token: id}, got %s", vocab_path, strata_json_kind(vocab));
    size_t n = rc ? 0 : vocab->len;
    const char **strs = strata_xmalloc((n ? n : 1) * sizeof *strs);
    size_t *lens = strata_xmalloc((n ? n : 1) * sizeof *lens);
    int *ids = strata_xmalloc((n ? n : 1) * sizeof *ids);
    for (size_t i = 0; i < n && !rc; i++) {
        const strata_json_member *m = &vocab->members[i];
        if (m->value.type != STRATA_JSON_NUMBER || !m->value.is_int || m->value.integer < 0 || m->value.integer >= MAX_VOCAB)
            rc = strata_fail("%s: \"%.60s\" must have an id in [0, %d)", vocab_path, m->key, MAX_VOCAB);
        strs[i] = m->key;
        lens[i] = m->key_len;
        ids[i] = (int)m->value.integer;
    }
    if (!rc) rc = set_vocab(t, strs, lens, ids, n, vocab_path);
    free(strs);
    free(lens);
    free(ids);
    strata_json_free(&doc);
    if (!rc) rc = strata_check_file_bounded(merges_path, MAX_TOKENIZER_BYTES);
    FILE *f = rc ? NULL : fopen(merges_path, "rb");
    if (!rc && !f) rc = strata_fail("%s: cannot open: %s", merges_path, strerror(errno));
    if (f) {
        char *line = NULL;
        size_t cap = 0, lineno = 0, count = 0;
        ssize_t len;
        while (getline(&line, &cap, f) >= 0) count++; /* sizes the table */
        rewind(f);
        alloc_merges(t, count);
        int rank = 0;
        while (!rc && (len = getline(&line, &cap, f)) >= 0) {
            lineno++;
            while (len > 0 && (line[len - 1] == '\n' || line[len - 1] == '\r')) line[--len] = 0;
            if (!strncmp(line, "#version", 8)) continue;
            char *sp = memchr(line, ' ', (size_t)len);
            if (!sp || memchr(sp + 1, ' ', (size_t)(line + len - sp - 1)) || sp == line || sp + 1 == line + len)
                rc = strata_fail("%s:%zu: expected two tokens separated by one space, got \"%.60s\"", merges_path, lineno, line);
            else
                rc = add_merge(t, rank++, line, (size_t)(sp - line), sp + 1, (size_t)(line + len - sp - 1), merges_path);
        }
        free(line);
        (void)fclose(f); /* read-only: nothing to lose */
    }
    int eot = rc ? -1 : vocab_find(t, "<|endoftext|>", 13);
    if (eot >= 0) add_added(t, "<|endoftext|>", 13, eot, 1); /* its flags off, as in GPT-2's tokenizer.json */
    set_byte_level_pre(t);
    if (!rc) rc = finish(t);
    if (rc) {
        strata_bpe_free(t);
        return NULL;
    }
    return t;
}

strata_bpe *strata_bpe_load(const char *path) {
    struct stat sb;
    if (stat(path, &sb) != 0) {
        strata_fail("tokenizer %s: %s", path, strerror(errno));
        return NULL;
    }
    if (!S_ISDIR(sb.st_mode)) return load_json(path);
    char a[STRATA_PATH_MAX + 32], b[STRATA_PATH_MAX + 32];
    if (strata_path_join(a, sizeof a, path, "tokenizer.json")) return NULL;
    if (strata_is_file(a)) return load_json(a);
    if (strata_path_join(a, sizeof a, path, "vocab.json") || strata_path_join(b, sizeof b, path, "merges.txt"))
        return NULL;
    if (strata_is_file(a) && strata_is_file(b)) return load_vocab_merges(a, b, path);
    strata_fail("tokenizer %s: the directory has neither tokenizer.json nor vocab.json + merges.txt", path);
    return NULL;
}

strata_bpe *strata_bpe_bytes(void) {
    strata_bpe *t = bpe_new("byte-level");
    t->is_bytes = 1;
    t->use_regex = 0;
    set_byte_level_pre(t);
    uint32_t cp[256];
    byte_chars(cp);
    char chars[256][4];
    const char *strs[256];
    size_t lens[256];
    int ids[256];
    for (int b = 0; b < 256; b++) {
        lens[b] = strata_utf8_encode(chars[b], cp[b]);
        strs[b] = chars[b];
        ids[b] = b;
    }
    /* 256 distinct ids: set_vocab has nothing to refuse */
    if (set_vocab(t, strs, lens, ids, 256, "byte-level") != 0)
        strata_panic(__FILE__, __LINE__, "byte-level vocabulary: %s", strata_error());
    alloc_merges(t, 0);
    build_decoding(t);
    return t;
}

int strata_bpe_vocab_size(const strata_bpe *t) { return t->n_ids; }
const char *strata_bpe_source(const strata_bpe *t) { return t->source; }
int strata_bpe_is_bytes(const strata_bpe *t) { return t->is_bytes; }
int strata_bpe_add_prefix_space(const strata_bpe *t) { return t->add_prefix_space; }

int strata_bpe_special_id(const strata_bpe *t, const char *content) {
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].special && !strcmp(t->added[i].content, content)) return t->added[i].id;
    return -1;
}

const unsigned char *strata_bpe_token_bytes(const strata_bpe *t, int id, size_t *len) {
    if (id < 0 || id >= t->n_ids || !t->bytes[id]) return NULL;
    *len = t->bytes_len[id];
    return t->bytes[id];
}

/* ---- decoding ---- */

/* The decoder's steps for a vocabulary of text, over the tokens' strings (tokenizers'
 * decode_chain, step by step), then joined. */
typedef struct str_list {
    strata_sbuf *v;
    size_t n;
} str_list;

static void list_free(str_list *l) {
    for (size_t i = 0; i < l->n; i++) strata_sbuf_free(&l->v[i]);
    free(l->v);
    l->v = NULL;
    l->n = 0;
}

static strata_sbuf *list_add(str_list *l) {
    l->v = strata_xrealloc(l->v, (l->n + 1) * sizeof *l->v);
    l->v[l->n] = (strata_sbuf){0};
    return &l->v[l->n++];
}

/* One ByteFallback run: its bytes as text, or one U+FFFD per byte when they are no UTF-8. */
static void flush_bytes(str_list *out, strata_sbuf *run) {
    if (!run->len) return;
    strata_sbuf *d = list_add(out);
    if (strata_utf8_invalid_at(run->p, run->len) == run->len) strata_sbuf_putn(d, run->p, run->len);
    else
        for (size_t i = 0; i < run->len; i++) strata_sbuf_putn(d, "\xEF\xBF\xBD", 3);
    run->len = 0;
}

static void decode_step(const dec_step *d, str_list *in, str_list *out) {
    strata_sbuf run = {0};
    for (size_t i = 0; i < in->n; i++) {
        const strata_sbuf *tk = &in->v[i];
        const char *p = tk->len ? tk->p : "";
        if (d->kind == DEC_FUSE) {
            if (!out->n) list_add(out);
            strata_sbuf_putn(&out->v[0], p, tk->len);
            continue;
        }
        if (d->kind == DEC_BYTEFALLBACK) {
            int b = byte_token_value(p, tk->len);
            if (b >= 0) {
                char c = (char)b;
                strata_sbuf_putn(&run, &c, 1);
                continue;
            }
            flush_bytes(out, &run);
            strata_sbuf_putn(list_add(out), p, tk->len);
            continue;
        }
        strata_sbuf *o = list_add(out);
        if (d->kind == DEC_REPLACE) {
            replace_all(o, p, tk->len, d->from, d->from_len, d->to, d->to_len);
        } else if (d->kind == DEC_METASPACE) { /* the first token loses its replacement characters */
            replace_all(o, p, tk->len, d->rep, d->rep_len, i == 0 && d->prepend != PREPEND_NEVER ? "" : " ",
                        i == 0 && d->prepend != PREPEND_NEVER ? 0 : 1);
        } else { /* Strip: up to start leading and stop trailing d->ch, by characters */
            size_t a = 0, z = tk->len;
            uint32_t c;
            for (int k = 0, len; k < d->start && a < z && (len = (int)strata_utf8_decode(p + a, z - a, &c)) > 0 && c == d->ch; k++)
                a += (size_t)len;
            for (int k = 0; k < d->stop && z > a; k++) {
                size_t st = z - 1;
                while (st > a && ((unsigned char)p[st] & 0xC0) == 0x80) st--;
                if (strata_utf8_decode(p + st, z - st, &c) != z - st || c != d->ch) break;
                z = st;
            }
            strata_sbuf_putn(o, p + a, z - a);
        }
    }
    flush_bytes(out, &run);
    strata_sbuf_free(&run);
}

static char *decode_text(const strata_bpe *t, const int32_t *ids, size_t n, size_t *len) {
    str_list cur = {0}, next = {0};
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < t->n_ids && t->token[ids[i]])
            strata_sbuf_puts(list_add(&cur), t->token[ids[i]]);
    for (int k = 0; k < t->n_dec; k++) {
        decode_step(&t->dec[k], &cur, &next);
        list_free(&cur);
        cur = next;
        next = (str_list){0};
    }
    strata_sbuf all = {0};
    for (size_t i = 0; i < cur.n; i++) {
        if (t->decoder_null && i) strata_sbuf_putn(&all, " ", 1); /* no decoder: tokenizers joins with spaces */
        if (cur.v[i].len) strata_sbuf_putn(&all, cur.v[i].p, cur.v[i].len);
    }
    list_free(&cur);
    *len = all.len;
    return all.p ? all.p : dup_n("", 0);
}

char *strata_bpe_decode(const strata_bpe *t, const int32_t *ids, size_t n, size_t *len) {
    if (!t->byte_level) return decode_text(t, ids, n, len);
    size_t total = 0;
    for (size_t i = 0; i < n; i++)
        if (ids[i] >= 0 && ids[i] < t->n_ids && t->bytes[ids[i]]) total += t->bytes_len[ids[i]];
    unsigned char *raw = strata_xmalloc(total + 1);
    size_t k = 0;
    for (size_t i = 0; i < n; i++) {
        if (ids[i] < 0 || ids[i] >= t->n_ids || !t->bytes[ids[i]]) continue;
        memcpy(raw + k, t->bytes[ids[i]], t->bytes_len[ids[i]]);
        k += t->bytes_len[ids[i]];
    }
    char *out = strata_bpe_decode_bytes(raw, total, len);
    free(raw);
    return out;
}

size_t strata_bpe_strip_start(const strata_bpe *t, uint32_t *ch) {
    *ch = ' ';
    size_t n = 0;
    for (int k = 0; k < t->n_dec; k++) {
        if (t->dec[k].kind == DEC_STRIP && t->dec[k].ch == ' ') n += (size_t)t->dec[k].start;
        if (t->dec[k].kind == DEC_METASPACE && t->dec[k].prepend != PREPEND_NEVER) n += 1;
    }
    return n;
}

char *strata_bpe_decode_bytes(const unsigned char *raw, size_t total, size_t *len) {
    /* each byte that starts no valid UTF-8 sequence becomes U+FFFD (3 bytes) */
    char *out = strata_xmalloc(3 * total + 1);
    size_t o = 0, pos = 0;
    while (pos < total) {
        size_t bad = pos + strata_utf8_invalid_at(raw + pos, total - pos);
        memcpy(out + o, raw + pos, bad - pos);
        o += bad - pos;
        if (bad == total) break;
        memcpy(out + o, "\xEF\xBF\xBD", 3);
        o += 3;
        pos = bad + 1;
    }
    out[o] = 0;
    *len = o;
    return out;
}

/* ---- encoding ---- */

typedef struct symbol {
    int id;
    int prev, next; /* -1: none */
    int live;
} symbol;

typedef struct heap_entry {
    int rank, pos, id;
} heap_entry;

/* lowest rank first, then leftmost: tokenizers' merge order */
static int heap_less(const heap_entry *a, const heap_entry *b) {
    return a->rank != b->rank ? a->rank < b->rank : a->pos < b->pos;
}

typedef struct encoder {
    strata_bpe *t;
    strata_bpe_sink sink;
    void *ctx;
    int32_t out[4096];
    size_t n_out;
    symbol *sym;
    heap_entry *heap;
    size_t cap, n_heap;
    size_t unknown; /* bytes the vocabulary has no character for (dropped, as tokenizers does) */
    pcre2_match_data *md, *word_md; /* for t->re and t->word_re */
    pcre2_match_data *pre_md[MAX_STEPS]; /* for each Split step's pattern */
} encoder;

static int emit(encoder *e, int id) {
    e->out[e->n_out++] = id;
    if (e->n_out == sizeof e->out / sizeof e->out[0]) {
        size_t n = e->n_out;
        e->n_out = 0;
        return e->sink(e->ctx, e->out, n);
    }
    return 0;
}

static void heap_push(encoder *e, heap_entry x) {
    size_t i = e->n_heap++;
    while (i > 0) {
        size_t parent = (i - 1) / 2;
        if (!heap_less(&x, &e->heap[parent])) break;
        e->heap[i] = e->heap[parent];
        i = parent;
    }
    e->heap[i] = x;
}

static heap_entry heap_pop(encoder *e) {
    heap_entry top = e->heap[0], last = e->heap[--e->n_heap];
    size_t i = 0;
    for (;;) {
        size_t c = 2 * i + 1;
        if (c >= e->n_heap) break;
        if (c + 1 < e->n_heap && heap_less(&e->heap[c + 1], &e->heap[c])) c++;
        if (!heap_less(&e->heap[c], &last)) break;
        e->heap[i] = e->heap[c];
        i = c;
    }
    if (e->n_heap) e->heap[i] = last;
    return top;
}

static void push_pair(encoder *e, int pos) {
    int next = e->sym[pos].next;
    if (next < 0) return;
    const merge_slot *m = merge_find(e->t, e->sym[pos].id, e->sym[next].id);
    if (m) heap_push(e, (heap_entry){m->rank, pos, m->id});
}

/* Adds symbol `id` at position m of the piece's symbol list. */
static void add_symbol(encoder *e, int *m, int id) {
    e->sym[*m] = (symbol){id, *m - 1, -1, 1};
    if (*m > 0) e->sym[*m - 1].next = *m;
    (*m)++;
}

/* The symbols of a byte-level piece: its bytes' characters (a byte without one becomes the
 * unknown token, fused with one just before when fuse_unk, or is dropped). */
static int byte_symbols(encoder *e, const unsigned char *s, size_t n) {
    const strata_bpe *t = e->t;
    int m = 0;
    for (size_t i = 0; i < n; i++) {
        int id = t->byte_id[s[i]];
        if (id < 0) {
            if (t->unk_id < 0) {
                e->unknown++;
                continue;
            }
            if (t->fuse_unk && m > 0 && e->sym[m - 1].id == t->unk_id) continue;
            id = t->unk_id;
        }
        add_symbol(e, &m, id);
    }
    return m;
}

/* The symbols of a piece of a vocabulary of text: its characters' tokens, as tokenizers'
 * BPE::merge_word makes them. A character without a token becomes its bytes' "<0xNN>"
 * tokens (byte_fallback, when the vocabulary has all of them), else the unknown token,
 * which waits until the next character with a token (or the end) and, with fuse_unk,
 * takes the unknown characters after it along; without an unknown token it is dropped. */
static int text_symbols(encoder *e, const unsigned char *s, size_t n) {
    const strata_bpe *t = e->t;
    int m = 0, unk_pending = 0;
    for (size_t i = 0; i < n;) {
        size_t len = strata_utf8_decode(s + i, n - i, NULL);
        if (!len) len = 1; /* the text was checked: cannot happen */
        int id = vocab_find(t, (const char *)s + i, len);
        if (id >= 0) {
            if (unk_pending) add_symbol(e, &m, t->unk_id), unk_pending = 0;
            add_symbol(e, &m, id);
        } else {
            int all = t->byte_fallback;
            for (size_t k = 0; k < len && all; k++) all = t->byte_token[s[i + k]] >= 0;
            if (all) {
                for (size_t k = 0; k < len; k++) add_symbol(e, &m, t->byte_token[s[i + k]]);
            } else if (t->unk_id >= 0) {
                if (unk_pending && !t->fuse_unk) add_symbol(e, &m, t->unk_id);
                unk_pending = 1;
            } else {
                e->unknown += len;
            }
        }
        i += len;
    }
    if (unk_pending) add_symbol(e, &m, t->unk_id);
    return m;
}

/* One pre-tokenised piece: its symbols, merged by rank. */
static int encode_piece(encoder *e, const unsigned char *s, size_t n) {
    strata_bpe *t = e->t;
    if (!n) return 0;
    if (t->ignore_merges) { /* a piece that is itself a token skips the merges */
        int id;
        if (t->byte_level) {
            char small[512], *mapped = 2 * n <= sizeof small ? small : strata_xmalloc(2 * n);
            size_t k = 0;
            for (size_t i = 0; i < n; i++) {
                memcpy(mapped + k, t->byte_char[s[i]], 2);
                k += t->byte_char_len[s[i]];
            }
            id = vocab_find(t, mapped, k);
            if (mapped != small) free(mapped);
        } else {
            id = vocab_find(t, (const char *)s, n);
        }
        if (id >= 0) return emit(e, id);
    }
    if (n > e->cap) {
        e->cap = n;
        e->sym = strata_xrealloc(e->sym, n * sizeof *e->sym);
        e->heap = strata_xrealloc(e->heap, 2 * n * sizeof *e->heap);
    }
    int m = t->byte_level ? byte_symbols(e, s, n) : text_symbols(e, s, n);
    if (t->n_merges) {
        e->n_heap = 0;
        for (int i = 0; i + 1 < m; i++) push_pair(e, i);
        while (e->n_heap) {
            heap_entry top = heap_pop(e);
            symbol *a = &e->sym[top.pos];
            if (!a->live || a->next < 0) continue;
            symbol *b = &e->sym[a->next];
            const merge_slot *cur = merge_find(t, a->id, b->id);
            if (!cur || cur->id != top.id) continue; /* stale: a neighbour merged since it was queued */
            a->id = top.id;
            b->live = 0;
            a->next = b->next;
            if (b->next >= 0) e->sym[b->next].prev = top.pos;
            if (a->prev >= 0) push_pair(e, a->prev);
            push_pair(e, top.pos);
        }
    }
    for (int i = 0; i < m; i++)
        if (e->sym[i].live && emit(e, e->sym[i].id)) return -1;
    return 0;
}

static int pre_tokenize(encoder *e, int k, const char *s, size_t n, int at_start);

/* The pieces of s[0, n) that `re` makes (its matches, and the text between them: Split's
 * Isolated behaviour, and ByteLevel's use_regex), each through the steps after k. An empty
 * match makes no piece; the search goes on a character later, as tokenizers' find_iter. */
static int split_by(encoder *e, int k, const pcre2_code *re, pcre2_match_data *md, const char *s, size_t n, int at_start) {
    size_t pos = 0, from = 0; /* pos: where the search goes on; from: the start of the next piece */
    int rc = 0;
    while (from < n && !rc) {
        int r = pos <= n ? pcre2_match(re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, md, NULL) : PCRE2_ERROR_NOMATCH;
        if (r == PCRE2_ERROR_NOMATCH) {
            rc = pre_tokenize(e, k + 1, s + from, n - from, at_start && from == 0); /* the unmatched tail is a piece too */
            break;
        }
        if (r < 0) {
            char msg[256];
            return strata_fail("pre-tokenising at byte %zu: %s", pos, pcre2_message(r, msg, sizeof msg));
        }
        PCRE2_SIZE *ov = pcre2_get_ovector_pointer(md);
        size_t m0 = ov[0], m1 = ov[1]; /* before the steps below use their own match data */
        if (m1 == m0) { /* empty: no piece; on by one character */
            pos = m1 + (m1 < n ? strata_utf8_decode(s + m1, n - m1, NULL) : 1);
            if (pos == m1) pos++;
            continue;
        }
        if (m0 > from) rc = pre_tokenize(e, k + 1, s + from, m0 - from, at_start && from == 0);
        if (!rc) rc = pre_tokenize(e, k + 1, s + m0, m1 - m0, at_start && m0 == 0);
        from = pos = m1;
    }
    return rc;
}

/* Step k of the pre-tokenizer on the piece s[0, n) (at_start: the piece begins the text,
 * which Metaspace's "first" prepend asks); past the last step, the piece is encoded. */
static int pre_tokenize(encoder *e, int k, const char *s, size_t n, int at_start) {
    const strata_bpe *t = e->t;
    if (!n) return 0;
    if (k == t->n_pre) return encode_piece(e, (const unsigned char *)s, n);
    const pre_step *st = &t->pre[k];
    if (st->kind == PRE_SPLIT) return split_by(e, k, st->re, e->pre_md[k], s, n, at_start);
    strata_sbuf b = {0};
    int rc = 0;
    if (st->kind == PRE_BYTELEVEL) {
        if (st->add_prefix_space && s[0] != ' ') {
            strata_sbuf_putn(&b, " ", 1);
            strata_sbuf_putn(&b, s, n);
            s = b.p;
            n = b.len;
        }
        rc = st->use_regex ? split_by(e, k, t->re, e->md, s, n, at_start) : pre_tokenize(e, k + 1, s, n, at_start);
    } else { /* Metaspace */
        int starts = n >= st->rep_len && !memcmp(s, st->rep, st->rep_len);
        int has_space = s[0] == ' ';
        if ((st->prepend == PREPEND_ALWAYS || (st->prepend == PREPEND_FIRST && at_start)) && !starts && !has_space)
            strata_sbuf_putn(&b, st->rep, st->rep_len);
        replace_all(&b, s, n, " ", 1, st->rep, st->rep_len);
        if (!st->split) {
            rc = pre_tokenize(e, k + 1, b.p, b.len, at_start);
        } else { /* a piece begins at each replacement character (MergedWithNext) */
            size_t from = 0;
            for (size_t i = st->rep_len; i <= b.len && !rc; i++) {
                if (i < b.len && (b.len - i < st->rep_len || memcmp(b.p + i, st->rep, st->rep_len))) continue;
                rc = pre_tokenize(e, k + 1, b.p + from, i - from, at_start && from == 0);
                from = i;
            }
        }
    }
    strata_sbuf_free(&b);
    return rc;
}

/* A stretch of text between the added tokens of both passes: through the pre-tokenizer,
 * each piece encoded. */
static int encode_segment(encoder *e, const char *s, size_t n, int at_start) { return pre_tokenize(e, 0, s, n, at_start); }

/* The normalizer on a stretch between the tokens of pass 0, into *out (NULL: unchanged). */
static void normalize(const strata_bpe *t, const char *s, size_t n, char **out, size_t *out_len) {
    *out = NULL;
    *out_len = n;
    for (int k = 0; k < t->n_norm; k++) {
        const norm_step *st = &t->norm[k];
        const char *cur = *out ? *out : s;
        size_t len = *out_len;
        char *next = NULL;
        size_t next_len = 0;
        if (st->kind == NORM_NFC) {
            next = strata_nfc(cur, len, &next_len);
        } else if (len) { /* Prepend and Replace leave empty text as it is */
            strata_sbuf b = {0};
            if (st->kind == NORM_PREPEND) {
                strata_sbuf_putn(&b, st->to, st->to_len);
                strata_sbuf_putn(&b, cur, len);
            } else {
                replace_all(&b, cur, len, st->from, st->from_len, st->to, st->to_len);
            }
            next = b.p ? b.p : dup_n("", 0);
            next_len = b.len;
        }
        if (next) {
            free(*out);
            *out = next;
            *out_len = next_len;
        }
    }
}

/* ---- added tokens, as tokenizers' AddedVocabulary finds them ---- */

/* Rust regex's Unicode \s (the White_Space property), what lstrip and rstrip take. */
static int is_space(uint32_t c) {
    return (c >= 0x09 && c <= 0x0D) || c == 0x20 || c == 0x85 || c == 0xA0 || c == 0x1680 ||
           (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

/* Where the character of valid UTF-8 text that ends at s + end (end > 0) starts. */
static size_t char_start(const char *s, size_t end) {
    size_t k = end - 1;
    while (k > 0 && ((unsigned char)s[k] & 0xC0) == 0x80) k--;
    return k;
}

/* Whether the character at s (n > 0 bytes there) is a word character. */
static int word_at(encoder *e, const char *s, size_t n) {
    return pcre2_match(e->t->word_re, (PCRE2_SPTR)s, n, 0, PCRE2_ANCHORED | PCRE2_NO_UTF_CHECK, e->word_md, NULL) >= 0;
}

/* Whether a word character touches s[start, stop) within s[0, n): a single_word token
 * there is part of a word. */
static int touches_word(encoder *e, const char *s, size_t n, size_t start, size_t stop) {
    if (start > 0) {
        size_t c = char_start(s, start);
        if (word_at(e, s + c, start - c)) return 1;
    }
    return stop < n && word_at(e, s + stop, n - stop);
}

/* Where the run of whitespace that ends at s + end starts (end itself when there is none). */
static size_t space_run_start(const char *s, size_t end) {
    while (end > 0) {
        size_t c = char_start(s, end);
        uint32_t cp = 0;
        /* the text was checked: s[c, end) is one character */
        if (strata_utf8_decode(s + c, end - c, &cp) == 0 || !is_space(cp)) break;
        end = c;
    }
    return end;
}

/* The bytes of the run of whitespace at the start of s[0, n). */
static size_t space_run_len(const char *s, size_t n) {
    size_t k = 0;
    uint32_t c;
    for (size_t len; k < n && (len = strata_utf8_decode(s + k, n - k, &c)) > 0 && is_space(c);) k += len;
    return k;
}

/* The leftmost token of `set` that occurs in s[pos, n), the longest of those starting
 * there (leftmost-longest, as tokenizers' Aho-Corasick automaton finds them), or NULL. */
static const added_token *find_added(const strata_bpe *t, const added_set *set, const char *s, size_t n, size_t pos,
                                     size_t *at) {
    if (set->first[256] == 0) return NULL;
    for (size_t i = pos; i < n; i++) {
        unsigned char b = (unsigned char)s[i];
        for (int k = set->first[b]; k < set->first[b + 1]; k++) {
            const added_token *a = &t->added[set->tok[k]];
            if (a->len <= n - i && !memcmp(s + i, a->content, a->len)) {
                *at = i;
                return a;
            }
        }
    }
    return NULL;
}

/* Splits s[0, n) at the tokens of pass p and encodes each part: a token as its id, the
 * text between as pass 1 does (after pass 0) or as a segment (after pass 1). Pass 0 looks
 * for the tokens that are not normalized in the text itself, pass 1 for the normalized
 * ones in each stretch pass 0 left (with no normalizer, the same text), so a
 * non-normalized token wins over a normalized one that contains it: tokenizers'
 * extract_and_normalize. Within a pass, its find_matches:
 *  - the search goes on after each match, also after one single_word drops, so a dropped
 *    match still hides the tokens inside it;
 *  - a single_word match is dropped when a word character (Rust's Unicode \w) touches it
 *    on either side, within this stretch;
 *  - lstrip takes the whitespace before the match along, but nothing of an earlier match;
 *    rstrip takes the whitespace after it along. The next match is looked for after the
 *    token itself, so one can start inside whitespace rstrip took: its id comes out all
 *    the same, and the text after it resumes where it ends (tokenizers' `start_offset`). */
static int split_added(encoder *e, int p, const char *s, size_t n, int at_start);

/* A stretch that pass 0 left: normalized, then split at the normalized tokens (pass 1),
 * as tokenizers' extract_and_normalize. */
static int normalized_pass(encoder *e, const char *s, size_t n, int at_start) {
    char *ns;
    size_t nn;
    normalize(e->t, s, n, &ns, &nn);
    int rc = split_added(e, 1, ns ? ns : s, nn, at_start);
    free(ns);
    return rc;
}

static int split_added(encoder *e, int p, const char *s, size_t n, int at_start) {
    const strata_bpe *t = e->t;
    size_t done = 0, pos = 0, at = 0; /* done: the end of what was encoded */
    const added_token *a;
    int rc = 0;
    while (!rc && pos < n && (a = find_added(t, &t->pass[p], s, n, pos, &at))) {
        size_t start = at, stop = at + a->len;
        pos = stop;
        if (a->single_word && touches_word(e, s, n, start, stop)) continue;
        if (a->lstrip) {
            start = space_run_start(s, start);
            if (start < done) start = done;
        }
        if (a->rstrip) stop += space_run_len(s + stop, n - stop);
        if (done < start)
            rc = p == 0 ? normalized_pass(e, s + done, start - done, at_start && done == 0)
                        : encode_segment(e, s + done, start - done, at_start && done == 0);
        if (!rc) rc = emit(e, a->id);
        done = stop;
    }
    if (!rc && done < n)
        rc = p == 0 ? normalized_pass(e, s + done, n - done, at_start && done == 0)
                    : encode_segment(e, s + done, n - done, at_start && done == 0);
    return rc;
}

int strata_bpe_encode(strata_bpe *t, const char *text, size_t len, const char *name, strata_bpe_sink sink, void *ctx) {
    size_t bad = t->is_bytes ? len : strata_utf8_invalid_at(text, len);
    if (bad < len)
        return strata_fail("%s: byte %zu is not valid UTF-8 (the BPE tokenizer reads UTF-8 text)", name, bad);
    if (t->is_bytes) { /* ids are the bytes themselves */
        int32_t buf[4096];
        for (size_t i = 0; i < len;) {
            size_t k = 0;
            while (k < 4096 && i < len) buf[k++] = (unsigned char)text[i++];
            if (sink(ctx, buf, k)) return -1;
        }
        return 0;
    }
    encoder e = {.t = t, .sink = sink, .ctx = ctx};
    int no_memory = 0;
    e.md = t->re ? pcre2_match_data_create_from_pattern(t->re, NULL) : NULL;
    e.word_md = t->word_re ? pcre2_match_data_create_from_pattern(t->word_re, NULL) : NULL;
    no_memory |= (t->re && !e.md) || (t->word_re && !e.word_md);
    for (int k = 0; k < t->n_pre; k++)
        if (t->pre[k].re && !(e.pre_md[k] = pcre2_match_data_create_from_pattern(t->pre[k].re, NULL))) no_memory = 1;
    int rc = no_memory ? strata_fail("out of memory for PCRE2's match data") : split_added(&e, 0, text, len, 1);
    if (!rc && e.n_out) rc = sink(ctx, e.out, e.n_out);
    if (!rc && e.unknown)
        STRATA_WARN("bpe", "%s: %zu bytes have no token in %s and were dropped (as tokenizers drops them)", name,
                    e.unknown, t->source);
    if (e.md) pcre2_match_data_free(e.md);
    if (e.word_md) pcre2_match_data_free(e.word_md);
    for (int k = 0; k < t->n_pre; k++)
        if (e.pre_md[k]) pcre2_match_data_free(e.pre_md[k]);
    free(e.sym);
    free(e.heap);
    if (rc) return strata_fail_wrap("%s", name);
    return 0;
}

int strata_bpe_line_cuts(const strata_bpe *t) {
    if (!t->byte_level || t->is_bytes) return 0;
    for (int k = 0; k < t->n_norm; k++)
        if (t->norm[k].kind != NORM_NFC) return 0;
    int splits = 0; /* a step before the first that splits sees the whole text: it must change nothing */
    for (int k = 0; k < t->n_pre; k++) {
        const pre_step *st = &t->pre[k];
        if (st->kind == PRE_METASPACE || (st->kind == PRE_BYTELEVEL && st->add_prefix_space && !splits)) return 0;
        if (st->kind == PRE_SPLIT && !st->line_local && !splits) return 0;
        splits |= st->kind == PRE_SPLIT || (st->kind == PRE_BYTELEVEL && st->use_regex);
    }
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].lstrip || memchr(t->added[i].content, '\n', t->added[i].len)) return 0;
    return splits;
}

int strata_bpe_encode_doc(strata_bpe *t, const char *text, size_t len, const char *name, strata_bpe_sink sink,
                          void *ctx) {
    if (t->n_prefix && sink(ctx, t->prefix, (size_t)t->n_prefix)) return -1;
    if (strata_bpe_encode(t, text, len, name, sink, ctx)) return -1;
    if (t->n_suffix && sink(ctx, t->suffix, (size_t)t->n_suffix)) return -1;
    return 0;
}

/* ---- writing ---- */

typedef int (*write_fn)(const strata_bpe *t, FILE *f);

/* Writes through `fn` into path's temporary twin, fsyncs, renames over path. The writers
 * below leave each fputs and fprintf unchecked on purpose: a failed write sets the
 * stream's error flag, which is checked here, once, before anything is renamed. */
static int write_atomic(const strata_bpe *t, const char *path, write_fn fn) {
    char tmp[1200];
    snprintf(tmp, sizeof tmp, "%s.tmp.%d", path, (int)getpid());
    FILE *f = fopen(tmp, "wb");
    if (!f) return strata_fail("%s: cannot create: %s", tmp, strerror(errno));
    int rc = fn(t, f);
    if (fflush(f) != 0 || ferror(f)) rc = strata_fail("%s: write failed: %s", tmp, strerror(errno));
    if (!rc && fsync(fileno(f)) != 0) rc = strata_fail("%s: fsync failed: %s", tmp, strerror(errno));
    if (fclose(f) != 0 && !rc) rc = strata_fail("%s: close failed: %s", tmp, strerror(errno));
    if (!rc && rename(tmp, path) != 0) rc = strata_fail("cannot rename %s to %s: %s", tmp, path, strerror(errno));
    if (rc) (void)unlink(tmp); /* best effort: path itself is untouched */
    return rc;
}

static void write_token(FILE *f, const strata_bpe *t, int id) {
    strata_json_write_string(f, t->token[id], strlen(t->token[id]));
}

/* Ids in vocabulary order, added tokens left out (they are listed on their own). */
static int is_added(const strata_bpe *t, int id) {
    for (int i = 0; i < t->n_added; i++)
        if (t->added[i].id == id && vocab_find(t, t->added[i].content, t->added[i].len) != id) return 1;
    return 0;
}

static void write_vocab_object(const strata_bpe *t, FILE *f) {
    fputc('{', f);
    int first = 1;
    for (int id = 0; id < t->n_ids; id++) {
        if (!t->token[id] || is_added(t, id)) continue;
        if (!first) fputc(',', f);
        first = 0;
        write_token(f, t, id);
        fprintf(f, ":%d", id);
    }
    fputc('}', f);
}

static int write_json(const strata_bpe *t, FILE *f) {
    if (t->json) return fwrite(t->json, 1, t->json_len, f) == t->json_len ? 0 : -1;
    fputs("{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":[", f);
    for (int i = 0; i < t->n_added; i++) {
        fprintf(f, "%s{\"id\":%d,\"content\":", i ? "," : "", t->added[i].id);
        strata_json_write_string(f, t->added[i].content, t->added[i].len);
        const added_token *a = &t->added[i];
        fprintf(f, ",\"single_word\":%s,\"lstrip\":%s,\"rstrip\":%s,\"normalized\":%s,\"special\":%s}",
                a->single_word ? "true" : "false", a->lstrip ? "true" : "false", a->rstrip ? "true" : "false",
                a->normalized ? "true" : "false", a->special ? "true" : "false");
    }
    fprintf(f, "],\"normalizer\":null,\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":%s,"
               "\"trim_offsets\":true,\"use_regex\":%s},",
            t->add_prefix_space ? "true" : "false", t->use_regex ? "true" : "false");
    fputs("\"post_processor\":{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"trim_offsets\":false,"
          "\"use_regex\":true},\"decoder\":{\"type\":\"ByteLevel\",\"add_prefix_space\":true,\"trim_offsets\":true,"
          "\"use_regex\":true},\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":", f);
    if (t->unk_id >= 0) write_token(f, t, t->unk_id);
    else fputs("null", f);
    fprintf(f, ",\"continuing_subword_prefix\":null,\"end_of_word_suffix\":null,\"fuse_unk\":%s,\"byte_fallback\":false,"
               "\"ignore_merges\":%s,\"vocab\":",
            t->fuse_unk ? "true" : "false", t->ignore_merges ? "true" : "false");
    write_vocab_object(t, f);
    fputs(",\"merges\":[", f);
    for (int i = 0; i < t->n_merges; i++) {
        /* "a b": the form every tokenizers version reads */
        char *a = t->token[t->merge_list[i][0]], *b = t->token[t->merge_list[i][1]];
        size_t na = strlen(a), nb = strlen(b);
        char *ab = strata_xmalloc(na + nb + 2);
        memcpy(ab, a, na);
        ab[na] = ' ';
        memcpy(ab + na + 1, b, nb);
        fputs(i ? "," : "", f);
        strata_json_write_string(f, ab, na + nb + 1);
        free(ab);
    }
    fputs("]}}\n", f);
    return 0;
}

int strata_bpe_save(const strata_bpe *t, const char *path) { return write_atomic(t, path, write_json); }

static int write_vocab_json(const strata_bpe *t, FILE *f) {
    /* vocab.json holds the added tokens that have ids of their own too, as GPT-2's does */
    fputc('{', f);
    for (int id = 0, first = 1; id < t->n_ids; id++) {
        if (!t->token[id]) continue;
        if (!first) fputc(',', f);
        first = 0;
        write_token(f, t, id);
        fprintf(f, ":%d", id);
    }
    fputs("}\n", f);
    return 0;
}

static int write_merges_txt(const strata_bpe *t, FILE *f) {
    fputs("#version: 0.2\n", f);
    for (int i = 0; i < t->n_merges; i++) fprintf(f, "%s %s\n", t->token[t->merge_list[i][0]], t->token[t->merge_list[i][1]]);
    return 0;
}

int strata_bpe_save_vocab_merges(const strata_bpe *t, const char *dir) {
    char p[1100];
    snprintf(p, sizeof p, "%s/vocab.json", dir);
    if (write_atomic(t, p, write_vocab_json)) return -1;
    snprintf(p, sizeof p, "%s/merges.txt", dir);
    return write_atomic(t, p, write_merges_txt);
}

/* ---- the tokens around a text, and tokenizer_config.json ---- */

int strata_bpe_template(const strata_bpe *t, const int32_t **prefix, int *n_prefix, const int32_t **suffix, int *n_suffix) {
    *prefix = t->prefix;
    *n_prefix = t->n_prefix;
    *suffix = t->suffix;
    *n_suffix = t->n_suffix;
    return t->n_prefix + t->n_suffix;
}

int strata_bpe_token_id(const strata_bpe *t, const char *text) { return token_id(t, text); }

int strata_bpe_bos_id(const strata_bpe *t) {
    if (t->cfg.bos && token_id(t, t->cfg.bos) >= 0) return token_id(t, t->cfg.bos);
    return t->n_prefix ? t->prefix[0] : -1;
}

int strata_bpe_eos_id(const strata_bpe *t) {
    if (t->cfg.eos && token_id(t, t->cfg.eos) >= 0) return token_id(t, t->cfg.eos);
    if (t->n_suffix) return t->suffix[t->n_suffix - 1];
    static const char *const names[] = {"</s>", "<|end_of_text|>", "<|endoftext|>"};
    for (int i = 0; i < 3; i++)
        if (strata_bpe_special_id(t, names[i]) >= 0) return strata_bpe_special_id(t, names[i]);
    return -1;
}

int strata_bpe_pad_id(const strata_bpe *t) { return t->cfg.pad ? token_id(t, t->cfg.pad) : -1; }

int strata_bpe_has_config(const strata_bpe *t) { return t->cfg.present; }
const char *strata_bpe_chat_template(const strata_bpe *t) { return t->cfg.chat_template; }

void strata_bpe_set_chat(strata_bpe *t, const char *chat_template, const char *bos, const char *eos) {
    tok_config *c = &t->cfg;
    free(c->chat_template);
    c->chat_template = strata_xstrdup(chat_template);
    if (bos) {
        free(c->bos);
        c->bos = strata_xstrdup(bos);
    }
    if (eos) {
        free(c->eos);
        c->eos = strata_xstrdup(eos);
    }
    c->present = 1;
}

static void config_entry(strata_sbuf *b, const char *key, const char *value) {
    strata_sbuf_printf(b, ",\n  \"%s\": ", key);
    if (value) strata_json_string(b, value, strlen(value));
    else strata_sbuf_puts(b, "null");
}

int strata_bpe_save_config(const strata_bpe *t, const char *path, int model_max_length) {
    const tok_config *c = &t->cfg;
    strata_sbuf b = {0};
    strata_sbuf_puts(&b, "{\n  \"tokenizer_class\": ");
    const char *cls = c->class_name ? c->class_name : "PreTrainedTokenizerFast";
    strata_json_string(&b, cls, strlen(cls));
    config_entry(&b, "bos_token", c->bos);
    config_entry(&b, "eos_token", c->eos);
    config_entry(&b, "unk_token", c->unk);
    config_entry(&b, "pad_token", c->pad);
    if (c->add_bos >= 0) strata_sbuf_printf(&b, ",\n  \"add_bos_token\": %s", c->add_bos ? "true" : "false");
    if (c->add_eos >= 0) strata_sbuf_printf(&b, ",\n  \"add_eos_token\": %s", c->add_eos ? "true" : "false");
    if (model_max_length > 0) strata_sbuf_printf(&b, ",\n  \"model_max_length\": %d", model_max_length);
    if (c->chat_template) config_entry(&b, "chat_template", c->chat_template);
    strata_sbuf_puts(&b, "\n}\n");
    int rc = strata_write_file_atomic(path, b.p, b.len);
    strata_sbuf_free(&b);
    return rc;
}

/* ---- identity ---- */

int strata_bpe_digest(const strata_bpe *t, uint32_t *crc) {
    if (t->json) {
        *crc = strata_crc32c(0, t->json, t->json_len);
        return 0;
    }
    char *text = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&text, &len);
    if (!f) return strata_fail("tokenizer %s: out of host memory for its digest", t->source);
    int rc = write_json(t, f);
    if (fclose(f) != 0) rc = -1;
    if (!rc) *crc = strata_crc32c(0, text, len);
    free(text);
    return rc ? strata_fail("tokenizer %s: out of host memory for its digest", t->source) : 0;
}
