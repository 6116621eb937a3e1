/* io/text.h: what the readers and writers of text share, written once: UTF-8, a growing
 * text buffer, the one libyaml reader, and YAML scalars written so that they read back
 * byte for byte (io/files.h holds the file side: kinds, bounded reads, durable writes).
 *
 * Everything here fails the project's way (core/common.h): 0 or -1 with the reason in
 * strata_error(), naming the file. */
#ifndef STRATA_TEXT_H
#define STRATA_TEXT_H

#include <stddef.h>
#include <stdint.h>
#include <yaml.h>

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

/* ---- YAML ---- */

/* Parses text (len bytes, named `name` in messages) as exactly one YAML document into
 * *doc (the caller deletes it with yaml_document_delete). Refused, with FILE:LINE:COL
 * where libyaml knows it: text that is not YAML, a scalar holding a NUL byte (it would
 * cut a C string short unseen), and a second document ("a second YAML document starts
 * here; <one_what> is one document", one_what like "a config"). An empty text gives a
 * document without a root node. */
int strata_yaml_load(yaml_document_t *doc, const char *name, const char *text, size_t len, const char *one_what);
/* A node's line, 1-based, for messages. */
int strata_yaml_line(const yaml_node_t *n);

/* s[0, n) as a double-quoted YAML scalar that reads back byte for byte: quotes,
 * backslashes, control characters and what YAML would fold or drop (NEL, LS, PS, BOM,
 * C1 controls) escaped; other characters pass through as UTF-8. -1 + error naming `what`
 * when s is not valid UTF-8, which no YAML text can hold. */
int strata_yaml_quoted(strata_sbuf *b, const char *s, size_t n, const char *what);
/* `key: <text>` and a newline, text reproduced exactly on reading: readable text as a
 * literal block (an explicit indentation indicator, so leading spaces are content; strip
 * or keep chomping, so the trailing newlines are the text's own), anything else quoted. */
int strata_yaml_text_value(strata_sbuf *b, const char *key, const char *text, const char *what);

#endif
