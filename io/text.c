/* io/text.c: UTF-8, the growing text buffer, the one libyaml reader and the YAML scalar
 * writer (io/text.h). */
#include "io/text.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"

/* ---- UTF-8 ---- */

size_t strata_utf8_decode(const void *bytes, size_t n, uint32_t *cp) {
    const unsigned char *s = bytes;
    if (n == 0) return 0;
    unsigned c = s[0];
    if (c < 0x80) {
        if (cp) *cp = c;
        return 1;
    }
    size_t len;
    uint32_t v, min;
    if ((c & 0xE0) == 0xC0) len = 2, v = c & 0x1F, min = 0x80;
    else if ((c & 0xF0) == 0xE0) len = 3, v = c & 0x0F, min = 0x800;
    else if ((c & 0xF8) == 0xF0) len = 4, v = c & 0x07, min = 0x10000;
    else return 0;
    if (len > n) return 0;
    for (size_t i = 1; i < len; i++) {
        if ((s[i] & 0xC0) != 0x80) return 0;
        v = v << 6 | (s[i] & 0x3F);
    }
    if (v < min || v > 0x10FFFF || (v >= 0xD800 && v <= 0xDFFF)) return 0;
    if (cp) *cp = v;
    return len;
}

size_t strata_utf8_encode(char *out, uint32_t cp) {
    if (cp < 0x80) {
        out[0] = (char)cp;
        return 1;
    }
    if (cp < 0x800) {
        out[0] = (char)(0xC0 | cp >> 6);
        out[1] = (char)(0x80 | (cp & 0x3F));
        return 2;
    }
    if (cp < 0x10000) {
        out[0] = (char)(0xE0 | cp >> 12);
        out[1] = (char)(0x80 | ((cp >> 6) & 0x3F));
        out[2] = (char)(0x80 | (cp & 0x3F));
        return 3;
    }
    out[0] = (char)(0xF0 | cp >> 18);
    out[1] = (char)(0x80 | ((cp >> 12) & 0x3F));
    out[2] = (char)(0x80 | ((cp >> 6) & 0x3F));
    out[3] = (char)(0x80 | (cp & 0x3F));
    return 4;
}

size_t strata_utf8_invalid_at(const void *bytes, size_t n) {
    const unsigned char *s = bytes;
    size_t i = 0;
    while (i < n) {
        if (s[i] < 0x80) { /* the common case, without a call */
            i++;
            continue;
        }
        size_t k = strata_utf8_decode(s + i, n - i, NULL);
        if (!k) return i;
        i += k;
    }
    return n;
}

/* ---- a growing text buffer ---- */

static void sbuf_reserve(strata_sbuf *b, size_t more) {
    if (b->len + more + 1 <= b->cap) return;
    size_t cap = b->cap ? b->cap : 4096;
    while (cap < b->len + more + 1) cap *= 2;
    b->p = strata_xrealloc(b->p, cap);
    b->cap = cap;
}

void strata_sbuf_putn(strata_sbuf *b, const char *s, size_t n) {
    sbuf_reserve(b, n);
    memcpy(b->p + b->len, s, n);
    b->len += n;
    b->p[b->len] = 0;
}

void strata_sbuf_puts(strata_sbuf *b, const char *s) { strata_sbuf_putn(b, s, strlen(s)); }

void strata_sbuf_printf(strata_sbuf *b, const char *fmt, ...) {
    va_list ap, ap2;
    va_start(ap, fmt);
    va_copy(ap2, ap);
    int n = vsnprintf(NULL, 0, fmt, ap);
    va_end(ap);
    STRATA_ASSERT(n >= 0);
    sbuf_reserve(b, (size_t)n);
    vsnprintf(b->p + b->len, b->cap - b->len, fmt, ap2);
    va_end(ap2);
    b->len += (size_t)n;
}

void strata_sbuf_free(strata_sbuf *b) {
    free(b->p);
    memset(b, 0, sizeof *b);
}

/* ---- YAML: reading ---- */

int strata_yaml_line(const yaml_node_t *n) { return (int)n->start_mark.line + 1; }

static int yaml_problem(const yaml_parser_t *p, const char *name) {
    const char *problem = p->problem ? p->problem : "unknown error";
    if (p->error == YAML_READER_ERROR)
        return strata_fail("%s: invalid YAML: %s at byte %zu", name, problem, p->problem_offset);
    if (p->error == YAML_MEMORY_ERROR) return strata_fail("%s: invalid YAML: out of memory", name);
    char context[160] = "";
    if (p->context) snprintf(context, sizeof context, " (%s)", p->context);
    return strata_fail("%s:%zu:%zu: invalid YAML: %s%s", name, p->problem_mark.line + 1, p->problem_mark.column + 1,
                       problem, context);
}

/* a quoted "\0" would end the C string early and cut a key or value short unseen */
static int nul_free(const yaml_document_t *doc, const char *name) {
    for (yaml_node_t *n = doc->nodes.start; n < doc->nodes.top; n++)
        if (n->type == YAML_SCALAR_NODE && strlen((const char *)n->data.scalar.value) != n->data.scalar.length)
            return strata_fail("%s:%d: '%s...' holds a NUL byte, which no key or value may", name, strata_yaml_line(n),
                               (const char *)n->data.scalar.value);
    return 0;
}

int strata_yaml_load(yaml_document_t *doc, const char *name, const char *text, size_t len, const char *one_what) {
    yaml_parser_t parser;
    if (!yaml_parser_initialize(&parser)) return strata_fail("%s: cannot start the YAML parser", name);
    yaml_parser_set_input_string(&parser, (const unsigned char *)text, len);
    int rc = 0;
    if (!yaml_parser_load(&parser, doc)) {
        rc = yaml_problem(&parser, name);
        yaml_parser_delete(&parser);
        return rc;
    }
    rc = nul_free(doc, name);
    /* a second `---` document would be silently ignored: refuse it instead */
    yaml_document_t next;
    if (!rc && !yaml_parser_load(&parser, &next)) {
        rc = yaml_problem(&parser, name);
    } else if (!rc) {
        if (yaml_document_get_root_node(&next))
            rc = strata_fail("%s:%d: a second YAML document starts here; %s is one document", name,
                             (int)next.start_mark.line + 1, one_what);
        yaml_document_delete(&next);
    }
    yaml_parser_delete(&parser);
    if (rc) yaml_document_delete(doc);
    return rc;
}

/* ---- YAML: writing ---- */

/* What YAML keeps as it is inside a scalar: tab, newline and the printable characters.
 * YAML turns CR and NEL, LS, PS into line breaks, drops a BOM, and libyaml refuses other
 * control characters, C1 ones included. */
static int yaml_printable(uint32_t cp) {
    return cp == '\t' || cp == '\n' || (cp >= 0x20 && cp <= 0x7E) ||
           (cp >= 0xA0 && cp <= 0xFFFD && cp != 0x2028 && cp != 0x2029 && cp != 0xFEFF) || cp >= 0x10000;
}

int strata_yaml_quoted(strata_sbuf *b, const char *s, size_t n, const char *what) {
    size_t bad = strata_utf8_invalid_at(s, n);
    if (bad < n) return strata_fail("%s is not valid UTF-8 (byte %zu), so YAML cannot hold it", what, bad);
    strata_sbuf_putn(b, "\"", 1);
    for (size_t i = 0; i < n;) {
        uint32_t cp;
        size_t len = strata_utf8_decode(s + i, n - i, &cp);
        if (cp == '"') strata_sbuf_putn(b, "\\\"", 2);
        else if (cp == '\\') strata_sbuf_putn(b, "\\\\", 2);
        else if (cp == '\n') strata_sbuf_putn(b, "\\n", 2);
        else if (cp == '\t') strata_sbuf_putn(b, "\\t", 2);
        else if (cp == '\r') strata_sbuf_putn(b, "\\r", 2);
        else if (cp == 0x85) strata_sbuf_putn(b, "\\N", 2);
        else if (cp == 0x2028) strata_sbuf_putn(b, "\\L", 2);
        else if (cp == 0x2029) strata_sbuf_putn(b, "\\P", 2);
        else if (cp < 0x20 || cp == 0x7F) strata_sbuf_printf(b, "\\x%02X", (unsigned)cp);
        else if (yaml_printable(cp)) strata_sbuf_putn(b, s + i, len);
        else strata_sbuf_printf(b, "\\u%04X", (unsigned)cp); /* C1 controls, BOM, U+FFFE/FFFF */
        i += len;
    }
    strata_sbuf_putn(b, "\"", 1);
    return 0;
}

int strata_yaml_text_value(strata_sbuf *b, const char *key, const char *text, const char *what) {
    size_t n = strlen(text);
    int literal_ok = n > 0;
    for (size_t i = 0; i < n && literal_ok;) {
        uint32_t cp;
        size_t len = strata_utf8_decode(text + i, n - i, &cp);
        literal_ok = len > 0 && yaml_printable(cp);
        i += len ? len : 1;
    }
    if (!literal_ok) {
        strata_sbuf_printf(b, "%s: ", key);
        if (strata_yaml_quoted(b, text, n, what)) return -1;
        strata_sbuf_putn(b, "\n", 1);
        return 0;
    }
    strata_sbuf_printf(b, "%s: |2%c\n", key, text[n - 1] == '\n' ? '+' : '-');
    for (size_t pos = 0; pos < n;) {
        const char *nl = memchr(text + pos, '\n', n - pos);
        size_t end = nl ? (size_t)(nl - text) : n;
        if (end > pos) {
            strata_sbuf_putn(b, "  ", 2);
            strata_sbuf_putn(b, text + pos, end - pos);
        }
        strata_sbuf_putn(b, "\n", 1);
        pos = end + 1;
    }
    return 0;
}
