/* io/text.c: UTF-8 and the growing text buffer (io/text.h). */
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
