/* io/yaml.h: the one libyaml reader, and YAML written to read back exactly.
 *
 * Reading: a document is loaded whole (exactly one; no scalar may hold a NUL byte) and
 * then read through typed accessors that refuse, with FILE: line N and the place in the
 * document, a missing key, a value of the wrong type or out of range, and a key the
 * caller does not know. The config (io/config.c) walks its document against its schema;
 * the checkpoint reader (io/checkpoint_read.c) uses the accessors. Writing: scalars
 * quoted, or text as a literal block, so that they read back byte for byte. */
#ifndef STRATA_YAML_H
#define STRATA_YAML_H

#include <stddef.h>
#include <stdint.h>
#include <yaml.h>

#include "io/text.h"

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

/* ---- a loaded document and its typed accessors ---- */

typedef struct strata_ydoc {
    yaml_document_t doc;
    const char *path; /* the file, for messages; must outlive the document */
} strata_ydoc;

/* Reads path (at most max_bytes, a regular file) and loads its one document, whose top
 * level must be a mapping: -1 + error otherwise ("<what>: empty" or "...: the top level is
 * not a mapping", what naming the kind of file). strata_ydoc_free releases it. */
int strata_ydoc_read(strata_ydoc *d, const char *path, size_t max_bytes, const char *what);
/* The same over text already in memory. */
int strata_ydoc_parse(strata_ydoc *d, const char *path, const char *text, size_t len, const char *what);
void strata_ydoc_free(strata_ydoc *d);
yaml_node_t *strata_ydoc_root(strata_ydoc *d);

/* In every accessor, ctx locates `map` in messages ("tensors[3]", "" for the top level),
 * and a failure is "<path>: line N: <ctx>: ...". */
/* Every key of map is one of `known` (NULL-terminated); `why` ends the refusal of another. */
int strata_ydoc_keys_known(strata_ydoc *d, yaml_node_t *map, const char *ctx, const char *const *known,
                           const char *why);
/* Whether map holds key (for a key that may be left out). */
int strata_ydoc_has(strata_ydoc *d, yaml_node_t *map, const char *key);
/* The value of key, of the given type; NULL + error when it is missing or of another type. */
yaml_node_t *strata_ydoc_get(strata_ydoc *d, yaml_node_t *map, const char *ctx, const char *key,
                             yaml_node_type_t type);
/* A node that must be a mapping (a list entry, named by ctx). */
int strata_ydoc_mapping(strata_ydoc *d, yaml_node_t *n, const char *ctx);
const char *strata_ydoc_scalar(const yaml_node_t *n);
/* An unsigned integer (base 10, or 16 written 0x...) no larger than max. */
int strata_ydoc_u64(strata_ydoc *d, yaml_node_t *map, const char *ctx, const char *key, int base, uint64_t max,
                    uint64_t *out);
int strata_ydoc_size(strata_ydoc *d, yaml_node_t *map, const char *ctx, const char *key, size_t max, size_t *out);
int strata_ydoc_int(strata_ydoc *d, yaml_node_t *map, const char *ctx, const char *key, int *out);
int strata_ydoc_double(strata_ydoc *d, yaml_node_t *map, const char *ctx, const char *key, double *out);
/* A scalar that must read exactly `want`. */
int strata_ydoc_expect(strata_ydoc *d, yaml_node_t *map, const char *ctx, const char *key, const char *want);
/* "<path>: line N: <ctx>: key 'K': 'V' is not <want>": for a value found but refused. */
int strata_ydoc_bad_value(strata_ydoc *d, const yaml_node_t *n, const char *ctx, const char *key, const char *want);
/* Parses s whole as an unsigned integer in base 10 or 16 (0x-prefixed); -1 without an error set. */
int strata_parse_u64(const char *s, int base, uint64_t *out);

#endif
