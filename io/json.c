/* io/json.c: the strict JSON reader of io/json.h (recursive descent, bounded depth,
 * every read checked against the input's length), and a string writer. */
#include "io/json.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "io/files.h"
#include "io/text.h"

/* ---- the pool: chunks freed together ---- */

typedef struct chunk {
    struct chunk *next;
    size_t used, cap;
    _Alignas(16) unsigned char data[];
} chunk;

static void *pool_alloc(chunk **pool, size_t bytes) {
    bytes = (bytes + 15) & ~(size_t)15;
    chunk *c = *pool;
    if (!c || c->cap - c->used < bytes) {
        size_t cap = bytes > (1u << 16) ? bytes : (1u << 16);
        c = strata_xmalloc(sizeof *c + cap);
        c->next = *pool;
        c->used = 0;
        c->cap = cap;
        *pool = c;
    }
    void *p = c->data + c->used;
    c->used += bytes;
    return p;
}

static void pool_free(chunk *c) {
    while (c) {
        chunk *next = c->next;
        free(c);
        c = next;
    }
}

/* ---- the parser ---- */

typedef struct parser {
    const unsigned char *s;
    size_t len, pos;
    const char *name;
    chunk *pool;
} parser;

void strata_json_line_col(const void *bytes, size_t len, size_t offset, int *line, int *col) {
    const unsigned char *s = bytes;
    int l = 1, c = 1;
    for (size_t i = 0; i < offset && i < len; i++) {
        if (s[i] == '\n') l++, c = 1;
        else if ((s[i] & 0xC0) != 0x80) c++; /* count characters, not UTF-8 continuation bytes */
    }
    *line = l;
    *col = c;
}

static int fail_at(const parser *p, size_t offset, const char *what) {
    int line, col;
    strata_json_line_col(p->s, p->len, offset, &line, &col);
    return strata_fail("%s: byte %zu (line %d, column %d): %s", p->name, offset, line, col, what);
}

static void skip_ws(parser *p) {
    while (p->pos < p->len) {
        unsigned char c = p->s[p->pos];
        if (c != ' ' && c != '\t' && c != '\n' && c != '\r') break;
        p->pos++;
    }
}

/* What the byte at pos is, for "expected X, got Y" messages. */
static void describe_here(const parser *p, char *buf, size_t n) {
    if (p->pos >= p->len) {
        snprintf(buf, n, "the end of the input");
        return;
    }
    unsigned char c = p->s[p->pos];
    if (c >= 0x20 && c < 0x7f) snprintf(buf, n, "'%c'", c);
    else snprintf(buf, n, "byte 0x%02x", c);
}

static int expected(const parser *p, const char *what) {
    char here[32], msg[160];
    describe_here(p, here, sizeof here);
    snprintf(msg, sizeof msg, "expected %s, got %s", what, here);
    return fail_at(p, p->pos, msg);
}

static int hex4(const parser *p, size_t at, uint32_t *out) {
    if (at + 4 > p->len) return fail_at(p, at, "a \\u escape needs four hexadecimal digits");
    uint32_t v = 0;
    for (size_t i = 0; i < 4; i++) {
        unsigned char c = p->s[at + i];
        int d = c >= '0' && c <= '9' ? c - '0' : c >= 'a' && c <= 'f' ? c - 'a' + 10 : c >= 'A' && c <= 'F' ? c - 'A' + 10 : -1;
        if (d < 0) return fail_at(p, at + i, "a \\u escape needs four hexadecimal digits");
        v = v << 4 | (uint32_t)d;
    }
    *out = v;
    return 0;
}

/* A string starting at the opening quote; decoded into the pool (never longer than its
 * raw bytes, so the raw length bounds the allocation). */
static int parse_string(parser *p, const char **out, size_t *out_len) {
    size_t start = p->pos++; /* the opening quote */
    size_t end = p->pos;
    /* first pass: find the closing quote, skipping escaped characters */
    while (end < p->len && p->s[end] != '"') end += p->s[end] == '\\' ? 2 : 1;
    if (end >= p->len) return fail_at(p, start, "string is not closed before the end of the input");
    char *dst = pool_alloc(&p->pool, end - p->pos + 1);
    size_t n = 0;
    while (p->pos < end) {
        unsigned char c = p->s[p->pos];
        if (c == '\\') {
            unsigned char e = p->s[p->pos + 1]; /* pos + 1 < end: the scan above skipped it */
            size_t at = p->pos;
            p->pos += 2;
            switch (e) {
            case '"': dst[n++] = '"'; break;
            case '\\': dst[n++] = '\\'; break;
            case '/': dst[n++] = '/'; break;
            case 'b': dst[n++] = '\b'; break;
            case 'f': dst[n++] = '\f'; break;
            case 'n': dst[n++] = '\n'; break;
            case 'r': dst[n++] = '\r'; break;
            case 't': dst[n++] = '\t'; break;
            case 'u': {
                uint32_t cp;
                if (hex4(p, p->pos, &cp)) return -1;
                p->pos += 4;
                if (cp >= 0xDC00 && cp <= 0xDFFF) return fail_at(p, at, "\\u escape is a lone low surrogate");
                if (cp >= 0xD800 && cp <= 0xDBFF) {
                    uint32_t lo;
                    if (p->pos + 2 > end || p->s[p->pos] != '\\' || p->s[p->pos + 1] != 'u')
                        return fail_at(p, at, "\\u escape is a high surrogate without its low half");
                    if (hex4(p, p->pos + 2, &lo)) return -1;
                    if (lo < 0xDC00 || lo > 0xDFFF)
                        return fail_at(p, at, "\\u escape is a high surrogate without its low half");
                    p->pos += 6;
                    cp = 0x10000 + ((cp - 0xD800) << 10) + (lo - 0xDC00);
                }
                n += strata_utf8_encode(dst + n, cp); /* at most as long as the escape it replaces */
                break;
            }
            default: return fail_at(p, at, "invalid escape in a string (JSON allows \\\" \\\\ \\/ \\b \\f \\n \\r \\t \\uXXXX)");
            }
            if (p->pos > end) return fail_at(p, at, "escape runs past the end of the string");
        } else if (c < 0x20) {
            return fail_at(p, p->pos, "raw control character in a string (write it as an escape)");
        } else {
            size_t k = strata_utf8_decode(p->s + p->pos, end - p->pos, NULL);
            if (!k) return fail_at(p, p->pos, "invalid UTF-8 in a string");
            memcpy(dst + n, p->s + p->pos, k);
            n += k;
            p->pos += k;
        }
    }
    dst[n] = 0;
    p->pos = end + 1;
    *out = dst;
    *out_len = n;
    return 0;
}

#define MAX_NUMBER_CHARS 320 /* longer than any double needs, even written out in full */

static int parse_number(parser *p, strata_json *v) {
    size_t start = p->pos, i = p->pos;
    int integral = 1;
    if (i < p->len && p->s[i] == '-') i++;
    if (i >= p->len || p->s[i] < '0' || p->s[i] > '9') {
        p->pos = i;
        return expected(p, "a digit");
    }
    if (p->s[i] == '0') {
        i++;
        if (i < p->len && p->s[i] >= '0' && p->s[i] <= '9') return fail_at(p, start, "number has a leading zero");
    } else {
        while (i < p->len && p->s[i] >= '0' && p->s[i] <= '9') i++;
    }
    if (i < p->len && p->s[i] == '.') {
        integral = 0;
        i++;
        if (i >= p->len || p->s[i] < '0' || p->s[i] > '9') {
            p->pos = i;
            return expected(p, "a digit after the decimal point");
        }
        while (i < p->len && p->s[i] >= '0' && p->s[i] <= '9') i++;
    }
    if (i < p->len && (p->s[i] == 'e' || p->s[i] == 'E')) {
        integral = 0;
        i++;
        if (i < p->len && (p->s[i] == '+' || p->s[i] == '-')) i++;
        if (i >= p->len || p->s[i] < '0' || p->s[i] > '9') {
            p->pos = i;
            return expected(p, "a digit in the exponent");
        }
        while (i < p->len && p->s[i] >= '0' && p->s[i] <= '9') i++;
    }
    if (i - start > MAX_NUMBER_CHARS) return fail_at(p, start, "number is longer than 320 characters");
    char text[MAX_NUMBER_CHARS + 1];
    memcpy(text, p->s + start, i - start);
    text[i - start] = 0;
    v->type = STRATA_JSON_NUMBER;
    v->number = strtod(text, NULL); /* the "C" locale: Strata never calls setlocale */
    if (integral) {
        errno = 0;
        long long x = strtoll(text, NULL, 10);
        if (errno == 0) {
            v->is_int = 1;
            v->integer = x;
        }
    }
    p->pos = i;
    return 0;
}

static int key_cmp(const void *a, const void *b) {
    const strata_json_member *x = *(const strata_json_member *const *)a, *y = *(const strata_json_member *const *)b;
    if (x->key_len != y->key_len) return x->key_len < y->key_len ? -1 : 1;
    int c = memcmp(x->key, y->key, x->key_len);
    if (c) return c;
    return x->key_offset < y->key_offset ? -1 : x->key_offset > y->key_offset;
}

/* Refuses an object whose keys repeat, naming the key and both places. */
static int check_duplicates(parser *p, strata_json_member *m, size_t n) {
    const strata_json_member *first = NULL, *second = NULL;
    if (n <= 16) {
        for (size_t i = 0; i < n && !first; i++)
            for (size_t j = i + 1; j < n && !first; j++)
                if (m[i].key_len == m[j].key_len && !memcmp(m[i].key, m[j].key, m[i].key_len)) first = &m[i], second = &m[j];
    } else {
        const strata_json_member **idx = strata_xmalloc(n * sizeof *idx);
        for (size_t i = 0; i < n; i++) idx[i] = &m[i];
        qsort(idx, n, sizeof *idx, key_cmp);
        for (size_t i = 1; i < n && !first; i++)
            if (idx[i]->key_len == idx[i - 1]->key_len && !memcmp(idx[i]->key, idx[i - 1]->key, idx[i]->key_len))
                first = idx[i - 1], second = idx[i];
        free(idx);
    }
    if (!first) return 0;
    char msg[200];
    int line, col;
    strata_json_line_col(p->s, p->len, first->key_offset, &line, &col);
    snprintf(msg, sizeof msg, "duplicate key \"%.80s\" (first at line %d, column %d)", first->key, line, col);
    return fail_at(p, second->key_offset, msg);
}

static int parse_value(parser *p, strata_json *v, int depth);

static int parse_array(parser *p, strata_json *v, int depth) {
    p->pos++; /* '[' */
    size_t n = 0, cap = 0;
    strata_json *tmp = NULL;
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == ']') {
        p->pos++;
    } else {
        for (;;) {
            if (n == cap) tmp = strata_xrealloc(tmp, (cap = cap ? 2 * cap : 8) * sizeof *tmp);
            skip_ws(p);
            if (parse_value(p, &tmp[n], depth + 1)) {
                free(tmp);
                return -1;
            }
            n++;
            skip_ws(p);
            if (p->pos < p->len && p->s[p->pos] == ',') {
                p->pos++;
                skip_ws(p);
                if (p->pos < p->len && p->s[p->pos] == ']') {
                    free(tmp);
                    return fail_at(p, p->pos, "trailing comma before ']'");
                }
                continue;
            }
            if (p->pos < p->len && p->s[p->pos] == ']') {
                p->pos++;
                break;
            }
            free(tmp);
            return expected(p, "',' or ']' after an array element");
        }
    }
    v->type = STRATA_JSON_ARRAY;
    v->len = n;
    v->items = n ? pool_alloc(&p->pool, n * sizeof *tmp) : NULL;
    if (n) memcpy(v->items, tmp, n * sizeof *tmp);
    free(tmp);
    return 0;
}

static int parse_object(parser *p, strata_json *v, int depth) {
    p->pos++; /* '{' */
    size_t n = 0, cap = 0;
    strata_json_member *tmp = NULL;
    skip_ws(p);
    if (p->pos < p->len && p->s[p->pos] == '}') {
        p->pos++;
    } else {
        for (;;) {
            if (n == cap) tmp = strata_xrealloc(tmp, (cap = cap ? 2 * cap : 8) * sizeof *tmp);
            skip_ws(p);
            strata_json_member *m = &tmp[n];
            memset(m, 0, sizeof *m);
            if (p->pos >= p->len || p->s[p->pos] != '"') {
                free(tmp);
                return expected(p, "a member name in double quotes");
            }
            m->key_offset = p->pos;
            if (parse_string(p, &m->key, &m->key_len)) {
                free(tmp);
                return -1;
            }
            skip_ws(p);
            if (p->pos >= p->len || p->s[p->pos] != ':') {
                free(tmp);
                return expected(p, "':' after a member name");
            }
            p->pos++;
            skip_ws(p);
            if (parse_value(p, &m->value, depth + 1)) {
                free(tmp);
                return -1;
            }
            n++;
            skip_ws(p);
            if (p->pos < p->len && p->s[p->pos] == ',') {
                p->pos++;
                skip_ws(p);
                if (p->pos < p->len && p->s[p->pos] == '}') {
                    free(tmp);
                    return fail_at(p, p->pos, "trailing comma before '}'");
                }
                continue;
            }
            if (p->pos < p->len && p->s[p->pos] == '}') {
                p->pos++;
                break;
            }
            free(tmp);
            return expected(p, "',' or '}' after an object member");
        }
    }
    if (check_duplicates(p, tmp, n)) {
        free(tmp);
        return -1;
    }
    v->type = STRATA_JSON_OBJECT;
    v->len = n;
    v->members = n ? pool_alloc(&p->pool, n * sizeof *tmp) : NULL;
    if (n) memcpy(v->members, tmp, n * sizeof *tmp);
    free(tmp);
    return 0;
}

static int literal(parser *p, const char *word) {
    size_t n = strlen(word);
    if (p->len - p->pos < n || memcmp(p->s + p->pos, word, n)) return expected(p, "a JSON value");
    p->pos += n;
    return 0;
}

static int parse_value(parser *p, strata_json *v, int depth) {
    memset(v, 0, sizeof *v);
    v->offset = p->pos;
    if (depth > STRATA_JSON_MAX_DEPTH) {
        char msg[96];
        snprintf(msg, sizeof msg, "nested more than %d levels deep", STRATA_JSON_MAX_DEPTH);
        return fail_at(p, p->pos, msg);
    }
    if (p->pos >= p->len) return expected(p, "a JSON value");
    switch (p->s[p->pos]) {
    case '{': return parse_object(p, v, depth);
    case '[': return parse_array(p, v, depth);
    case '"':
        v->type = STRATA_JSON_STRING;
        return parse_string(p, &v->str, &v->len);
    case 't':
        v->type = STRATA_JSON_BOOL;
        v->boolean = 1;
        return literal(p, "true");
    case 'f':
        v->type = STRATA_JSON_BOOL;
        return literal(p, "false");
    case 'n':
        v->type = STRATA_JSON_NULL;
        return literal(p, "null");
    default:
        if (p->s[p->pos] == '-' || (p->s[p->pos] >= '0' && p->s[p->pos] <= '9')) return parse_number(p, v);
        if (p->len - p->pos >= 3 && (!memcmp(p->s + p->pos, "NaN", 3) || !memcmp(p->s + p->pos, "Inf", 3)))
            return fail_at(p, p->pos, "NaN and Infinity are not JSON numbers");
        return expected(p, "a JSON value");
    }
}

int strata_json_parse(strata_json_doc *doc, const void *bytes, size_t len, const char *name) {
    memset(doc, 0, sizeof *doc);
    parser p = {.s = bytes, .len = len, .pos = 0, .name = name ? name : "<json>"};
    if (len >= 3 && !memcmp(bytes, "\xEF\xBB\xBF", 3))
        return fail_at(&p, 0, "starts with a UTF-8 byte order mark, which JSON does not allow (save it without one)");
    skip_ws(&p);
    if (p.pos >= len) {
        pool_free(p.pool);
        return fail_at(&p, p.pos, "empty input; expected a JSON value");
    }
    if (parse_value(&p, &doc->root, 1)) {
        pool_free(p.pool);
        return -1;
    }
    skip_ws(&p);
    if (p.pos < len) {
        pool_free(p.pool);
        return fail_at(&p, p.pos, "unexpected data after the JSON value");
    }
    doc->pool = p.pool;
    return 0;
}

int strata_json_parse_file(strata_json_doc *doc, const char *path, size_t max_bytes) {
    memset(doc, 0, sizeof *doc);
    char *buf;
    size_t n;
    if (strata_read_file_bounded(path, max_bytes, &buf, &n)) return -1;
    int rc = strata_json_parse(doc, buf, n, path);
    free(buf);
    return rc;
}

void strata_json_free(strata_json_doc *doc) {
    pool_free(doc->pool);
    memset(doc, 0, sizeof *doc);
}

const strata_json *strata_json_get(const strata_json *v, const char *key) {
    if (!v || v->type != STRATA_JSON_OBJECT) return NULL;
    size_t n = strlen(key);
    for (size_t i = 0; i < v->len; i++)
        if (v->members[i].key_len == n && !memcmp(v->members[i].key, key, n)) return &v->members[i].value;
    return NULL;
}

const char *strata_json_kind(const strata_json *v) {
    if (!v) return "nothing";
    switch (v->type) {
    case STRATA_JSON_NULL: return "null";
    case STRATA_JSON_BOOL: return "a boolean";
    case STRATA_JSON_NUMBER: return "a number";
    case STRATA_JSON_STRING: return "a string";
    case STRATA_JSON_ARRAY: return "an array";
    case STRATA_JSON_OBJECT: return "an object";
    }
    return "?";
}

void strata_json_string(strata_sbuf *b, const char *s, size_t n) {
    strata_sbuf_putn(b, "\"", 1);
    for (size_t i = 0; i < n; i++) {
        unsigned char c = (unsigned char)s[i];
        if (c == '"') strata_sbuf_putn(b, "\\\"", 2);
        else if (c == '\\') strata_sbuf_putn(b, "\\\\", 2);
        else if (c == '\n') strata_sbuf_putn(b, "\\n", 2);
        else if (c == '\r') strata_sbuf_putn(b, "\\r", 2);
        else if (c == '\t') strata_sbuf_putn(b, "\\t", 2);
        else if (c < 0x20 || c == 0x7f) strata_sbuf_printf(b, "\\u%04x", c);
        else strata_sbuf_putn(b, (const char *)&s[i], 1);
    }
    strata_sbuf_putn(b, "\"", 1);
}

void strata_json_write_string(FILE *f, const char *s, size_t n) {
    strata_sbuf b = {0};
    strata_json_string(&b, s, n);
    /* a short write sets f's error flag, which the writer checks once at the end
     * (io/bpe.c: write_atomic) */
    (void)fwrite(b.p, 1, b.len, f);
    strata_sbuf_free(&b);
}
