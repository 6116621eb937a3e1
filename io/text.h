/* io/text.h: what the readers and writers of text share, written once: UTF-8 and a
 * growing text buffer (io/yaml.h holds the one libyaml reader and YAML writing, io/files.h
 * the file side: kinds, bounded reads, durable writes).
 *
 * Everything here fails the project's way (core/common.h): 0 or -1 with the reason in
 * strata_error(), naming the file. */
#ifndef STRATA_TEXT_H
#define STRATA_TEXT_H

#include <stddef.h>
#include <stdint.h>

/* ---- UTF-8 ---- */

/* The length (1-4) of the valid UTF-8 sequence at s, n bytes available, with its code
 * point in *cp (cp may be NULL); 0 when the bytes there are not one: a stray
 * continuation byte, a sequence cut short, overlong, a surrogate or past U+10FFFF. */
size_t strata_utf8_decode(const void *s, size_t n, uint32_t *cp);
/* Writes cp (at most U+10FFFF) as UTF-8 into out (room for 4 bytes); returns the length. */
size_t strata_utf8_encode(char *out, uint32_t cp);
/* The offset of the first byte of s[0, n) that starts no valid sequence, or n. */
size_t strata_utf8_invalid_at(const void *s, size_t n);

/* ---- a growing text buffer ---- */

/* Text built piece by piece (YAML, JSON headers); p is NUL-terminated once anything was
 * written, and freed by strata_sbuf_free. Growth aborts on exhausted memory, like
 * strata_xmalloc: these hold metadata, never training buffers. */
typedef struct strata_sbuf {
    char *p;
    size_t len, cap;
} strata_sbuf;
void strata_sbuf_putn(strata_sbuf *b, const char *s, size_t n);
void strata_sbuf_puts(strata_sbuf *b, const char *s);
void strata_sbuf_printf(strata_sbuf *b, const char *fmt, ...) __attribute__((format(printf, 2, 3)));
void strata_sbuf_free(strata_sbuf *b);

#endif
