/* io/json.h: one small, strict JSON reader (RFC 8259) for every JSON file Strata reads:
 * safetensors headers, Hugging Face config.json, tokenizer.json, vocab.json, sharded-weight
 * indices and DeepSpeed configs.
 *
 * Strict means: one value and nothing after it but whitespace; no comments, trailing
 * commas, single quotes, NaN/Infinity, leading zeros, raw control bytes in strings, lone
 * UTF-16 surrogates, invalid or overlong UTF-8, a byte order mark, or a key repeated in an
 * object. Input may come from anyone (a downloaded model, a fuzzer), so the parser reads
 * only bytes [0, len), never recurses deeper than STRATA_JSON_MAX_DEPTH, and refuses a
 * string or number longer than the input could hold. Every error names the input and the
 * byte offset (with line and column):
 *   NAME: byte 1234 (line 3, column 17): expected ',' or '}' after an object member
 *
 * The parsed document is a tree of strata_json values in one allocation pool, freed at
 * once by strata_json_free. Object members keep document order. */
#ifndef STRATA_JSON_H
#define STRATA_JSON_H

#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

#include "io/text.h"

#define STRATA_JSON_MAX_DEPTH 64

typedef enum strata_json_type {
    STRATA_JSON_NULL = 0,
    STRATA_JSON_BOOL,
    STRATA_JSON_NUMBER,
    STRATA_JSON_STRING,
    STRATA_JSON_ARRAY,
    STRATA_JSON_OBJECT,
} strata_json_type;

typedef struct strata_json strata_json;
typedef struct strata_json_member strata_json_member;

struct strata_json {
    strata_json_type type;
    size_t offset; /* byte offset of the value in the input, for messages */
    size_t len;    /* STRING: bytes (a string may hold NUL); ARRAY, OBJECT: entries */
    int boolean;   /* BOOL */
    int is_int;    /* NUMBER: written without fraction or exponent, and fits int64 */
    int64_t integer; /* NUMBER with is_int */
    double number;   /* NUMBER */
    const char *str;              /* STRING: decoded UTF-8, NUL-terminated */
    strata_json *items;           /* ARRAY */
    strata_json_member *members;  /* OBJECT, in document order */
};

struct strata_json_member {
    const char *key; /* decoded, NUL-terminated */
    size_t key_len;
    size_t key_offset;
    strata_json value;
};

typedef struct strata_json_doc {
    strata_json root;
    void *pool; /* every string and container of the tree */
} strata_json_doc;

/* Parses bytes [0, len) as one JSON document named `name` in messages. On failure returns
 * -1 with the message in strata_error() and leaves nothing to free. */
int strata_json_parse(strata_json_doc *doc, const void *bytes, size_t len, const char *name);
/* Reads a whole file (at most max_bytes) and parses it; the file's path names it. */
int strata_json_parse_file(strata_json_doc *doc, const char *path, size_t max_bytes);
void strata_json_free(strata_json_doc *doc);

/* The member `key` of an object, or NULL (also when v is not an object). */
const strata_json *strata_json_get(const strata_json *v, const char *key);
/* "null", "a boolean", "a number", "a string", "an array", "an object" */
const char *strata_json_kind(const strata_json *v);
/* Line and column (from 1) of byte `offset` of the input, for messages of callers that
 * still hold the input. */
void strata_json_line_col(const void *bytes, size_t len, size_t offset, int *line, int *col);

/* s[0, n) as a JSON string literal (quotes, backslashes and control bytes escaped; UTF-8
 * passes through), appended to b or written to f (a failed write sets f's error flag, for
 * the caller to check once it has written everything). */
void strata_json_string(strata_sbuf *b, const char *s, size_t n);
void strata_json_write_string(FILE *f, const char *s, size_t n);

#endif
