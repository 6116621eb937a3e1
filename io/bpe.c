/* io/bpe.c: GPT-2 byte-level BPE (io/bpe.h): loading tokenizer.json or vocab.json +
 * merges.txt, encoding through PCRE2's Unicode classes and merges by rank, decoding, and
 * writing the tokenizer back in Hugging Face's formats. */
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
#include "io/text.h"

/* the largest published tokenizer.json files (vocabularies of 250k tokens) are tens of MiB */
#define MAX_TOKENIZER_BYTES ((size_t)128 << 20)
#define MAX_VOCAB (1 << 24)

/* GPT-2's pre-tokenisation pattern, as tokenizers' ByteLevel pre-tokenizer has it. */
static const char gpt2_pattern[] =
    "'s|'t|'re|'ve|'m|'ll|'d| ?\\p{L}+| ?\\p{N}+| ?[^\\s\\p{L}\\p{N}]+|\\s+(?!\\S)|\\s+";

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
    added_token *added;
    int n_added;
    added_set pass[2];         /* [0]: tokens with normalized false, [1]: normalized true */
    pcre2_code *word_re;       /* one word character (Rust regex's \w), when a token is single_word */
    int add_prefix_space, use_regex, ignore_merges, fuse_unk, unk_id;
    int is_bytes;
    pcre2_code *re;
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
    free(t->json);
    free(t);
}

static strata_bpe *bpe_new(const char *source) {
    strata_bpe *t = strata_xcalloc(1, sizeof *t);
    snprintf(t->source, sizeof t->source, "%s", source);
    t->unk_id = -1;
    t->use_regex = 1;
    return t;
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
        t->byte_id[b] = vocab_find(t, c, strata_utf8_encode(c, cp[b]));
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

/* Decoded bytes of every id (the ByteLevel decoder: each character back to its byte; a
 * token with a character outside the table, like an added token's text, is its own UTF-8). */
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
    for (int id = 0; id < t->n_ids; id++) {
        const unsigned char *s = (const unsigned char *)t->token[id];
        if (!s) continue;
        size_t n = strlen((const char *)s), k = 0;
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
    /* the byte-level identity (what strata_bpe_bytes writes), however it was spelled */
    int identity = t->n_ids == 256 && !t->n_merges && !t->n_added && !t->add_prefix_space && t->unk_id < 0;
    for (int b = 0; b < 256 && identity; b++) identity = t->byte_id[b] == b;
    t->is_bytes = identity;
    int single_word = 0;
    for (int i = 0; i < t->n_added; i++) single_word |= t->added[i].single_word;
    /* tokenizers tests single_word with Rust regex's Unicode \w: Alphabetic, marks, decimal
     * digits, connector punctuation and the two joiners (PCRE2's own \w differs) */
    if (single_word &&
        compile_pattern(&t->word_re, "[\\p{Alphabetic}\\p{M}\\p{Nd}\\p{Pc}\\p{Join_Control}]", "the word class"))
        return -1;
    return t->use_regex ? compile_pattern(&t->re, gpt2_pattern, "GPT-2's pattern") : 0;
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

/* pre_tokenizer: ByteLevel. */
static int read_pre_tokenizer(strata_bpe *t, const strata_json *pt, const char *path) {
    char where[1200];
    snprintf(where, sizeof where, "%s: pre_tokenizer", path);
    if (is_null(pt) || pt->type != STRATA_JSON_OBJECT || strcmp(type_of(pt), "ByteLevel"))
        return strata_fail("%s is %s%s; Strata encodes GPT-2-style byte-level BPE, whose pre_tokenizer is ByteLevel",
                           where, is_null(pt) ? "null" : "of type ", is_null(pt) ? "" : type_of(pt));
    if (bool_field(pt, "add_prefix_space", 1, where, &t->add_prefix_space) ||
        bool_field(pt, "use_regex", 1, where, &t->use_regex))
        return -1;
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
    if (byte_fallback) return strata_fail("%s: byte_fallback is true; byte-level BPE never needs it", where);
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

/* Whether a post-processor adds tokens to a single text: ByteLevel (offsets only) does not,
 * nor does a TemplateProcessing whose single template is the text alone (what
 * transformers writes for GPT-2); a Sequence adds what its parts add. */
static int adds_tokens(const strata_json *pp, int depth) {
    if (is_null(pp)) return 0;
    const char *type = type_of(pp);
    if (!strcmp(type, "ByteLevel")) return 0;
    if (!strcmp(type, "TemplateProcessing")) {
        const strata_json *single = strata_json_get(pp, "single");
        return !single || single->type != STRATA_JSON_ARRAY || single->len != 1 || !strata_json_get(&single->items[0], "Sequence");
    }
    if (!strcmp(type, "Sequence") && depth < 4) {
        const strata_json *procs = strata_json_get(pp, "processors");
        if (!procs || procs->type != STRATA_JSON_ARRAY) return 1;
        for (size_t i = 0; i < procs->len; i++)
            if (adds_tokens(&procs->items[i], depth + 1)) return 1;
        return 0;
    }
    return 1;
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
    const strata_json *r = &doc.root, *v;
    int rc = 0;
    if (r->type != STRATA_JSON_OBJECT) rc = strata_fail("%s: expected a tokenizer object, got %s", path, strata_json_kind(r));
    if (!rc && !is_null(v = strata_json_get(r, "normalizer")))
        rc = strata_fail("%s: normalizer is %s; GPT-2's byte-level BPE has none (null)", path, type_of(v));
    if (!rc && adds_tokens(v = strata_json_get(r, "post_processor"), 0))
        rc = strata_fail("%s: post_processor is %s, which adds tokens around every text; Strata's corpora take the "
                         "text's own tokens (ByteLevel, a template of the text alone, or null)", path, type_of(v));
    if (!rc && !is_null(v = strata_json_get(r, "decoder")) && strcmp(type_of(v), "ByteLevel"))
        rc = strata_fail("%s: decoder is %s; byte-level BPE decodes with ByteLevel", path, type_of(v));
    if (!rc) rc = read_pre_tokenizer(t, strata_json_get(r, "pre_tokenizer"), path);
    if (!rc) rc = read_model(t, strata_json_get(r, "model"), path);
    if (!rc) rc = read_added(t, strata_json_get(r, "added_tokens"), path);
    strata_json_free(&doc);
    if (!rc) rc = finish(t);
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

char *strata_bpe_decode(const strata_bpe *t, const int32_t *ids, size_t n, size_t *len) {
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

/* One pre-tokenised piece: its bytes' characters, merged by rank. */
static int encode_piece(encoder *e, const unsigned char *s, size_t n) {
    strata_bpe *t = e->t;
    if (!n) return 0;
    if (t->ignore_merges) { /* a piece that is itself a token skips the merges */
        char *mapped = strata_xmalloc(2 * n);
        size_t k = 0;
        uint32_t cp[256];
        byte_chars(cp);
        for (size_t i = 0; i < n; i++) k += strata_utf8_encode(mapped + k, cp[s[i]]);
        int id = vocab_find(t, mapped, k);
        free(mapped);
        if (id >= 0) return emit(e, id);
    }
    if (n > e->cap) {
        e->cap = n;
        e->sym = strata_xrealloc(e->sym, n * sizeof *e->sym);
        e->heap = strata_xrealloc(e->heap, 2 * n * sizeof *e->heap);
    }
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
        e->sym[m] = (symbol){id, m - 1, -1, 1};
        if (m > 0) e->sym[m - 1].next = m;
        m++;
    }
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

/* A stretch of text between added tokens: pre-tokenised, then each piece encoded. */
static int encode_segment(encoder *e, const char *s, size_t n) {
    strata_bpe *t = e->t;
    if (!n) return 0;
    char *copy = NULL;
    if (t->add_prefix_space && s[0] != ' ') {
        copy = strata_xmalloc(n + 1);
        copy[0] = ' ';
        memcpy(copy + 1, s, n);
        s = copy;
        n++;
    }
    int rc = 0;
    if (!t->use_regex) {
        rc = encode_piece(e, (const unsigned char *)s, n);
    } else {
        size_t pos = 0;
        while (pos < n && !rc) {
            int r = pcre2_match(t->re, (PCRE2_SPTR)s, n, pos, PCRE2_NO_UTF_CHECK, e->md, NULL);
            if (r == PCRE2_ERROR_NOMATCH) {
                rc = encode_piece(e, (const unsigned char *)s + pos, n - pos); /* the unmatched tail is a piece too */
                break;
            }
            if (r < 0) {
                char msg[256];
                rc = strata_fail("pre-tokenising at byte %zu: %s", pos, pcre2_message(r, msg, sizeof msg));
                break;
            }
            PCRE2_SIZE *ov = pcre2_get_ovector_pointer(e->md);
            if (ov[0] > pos) rc = encode_piece(e, (const unsigned char *)s + pos, ov[0] - pos);
            if (!rc) rc = encode_piece(e, (const unsigned char *)s + ov[0], ov[1] - ov[0]);
            if (ov[1] == ov[0]) { /* cannot happen with GPT-2's pattern; never loop on an empty match */
                rc = strata_fail("pre-tokenising at byte %zu: empty match", pos);
                break;
            }
            pos = ov[1];
        }
    }
    free(copy);
    return rc;
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
static int split_added(encoder *e, int p, const char *s, size_t n) {
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
        if (done < start) rc = p == 0 ? split_added(e, 1, s + done, start - done) : encode_segment(e, s + done, start - done);
        if (!rc) rc = emit(e, a->id);
        done = stop;
    }
    if (!rc && done < n) rc = p == 0 ? split_added(e, 1, s + done, n - done) : encode_segment(e, s + done, n - done);
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
    e.md = t->re ? pcre2_match_data_create_from_pattern(t->re, NULL) : NULL;
    e.word_md = t->word_re ? pcre2_match_data_create_from_pattern(t->word_re, NULL) : NULL;
    int rc = (t->re && !e.md) || (t->word_re && !e.word_md) ? strata_fail("out of memory for PCRE2's match data")
                                                           : split_added(&e, 0, text, len);
    if (!rc && e.n_out) rc = sink(ctx, e.out, e.n_out);
    if (!rc && e.unknown)
        STRATA_WARN("bpe", "%s: %zu bytes have no token in %s and were dropped (as tokenizers drops them)", name,
                    e.unknown, t->source);
    if (e.md) pcre2_match_data_free(e.md);
    if (e.word_md) pcre2_match_data_free(e.word_md);
    free(e.sym);
    free(e.heap);
    if (rc) return strata_fail_wrap("%s", name);
    return 0;
}

int strata_bpe_encode_doc(strata_bpe *t, const char *text, size_t len, const char *name, strata_bpe_sink sink,
                          void *ctx) {
    return strata_bpe_encode(t, text, len, name, sink, ctx);
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

int strata_bpe_has_config(const strata_bpe *t) { (void)t; return 0; }
int strata_bpe_save_config(const strata_bpe *t, const char *path, int model_max_length) {
    (void)t; (void)path; (void)model_max_length;
    return 0;
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
