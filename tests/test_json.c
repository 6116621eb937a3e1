/* tests/test_json.c: the strict JSON reader: values it must read exactly, documents it must
 * refuse with the right byte offset, and (for the bounds) every prefix and many mutations
 * of valid documents, each parsed from a heap copy of exactly its length so that
 * AddressSanitizer catches any read past the end. */
#include "core/common.h"
#include "io/json.h"
#include "tests/check.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* Parses s[0, n) from a heap copy of exactly n bytes. */
static int parse_n(strata_json_doc *d, const char *s, size_t n) {
    char *copy = malloc(n ? n : 1);
    memcpy(copy, s, n);
    int rc = strata_json_parse(d, copy, n, "t.json");
    free(copy);
    return rc;
}

static int parse(strata_json_doc *d, const char *s) { return parse_n(d, s, strlen(s)); }

/* Refused, with "byte OFFSET" and `what` in the message. */
static int refused_at(const char *s, size_t len, long offset, const char *what) {
    strata_json_doc d;
    if (parse_n(&d, s, len) == 0) {
        strata_json_free(&d);
        printf("    accepted: %.60s\n", s);
        return 0;
    }
    char want[64];
    snprintf(want, sizeof want, "t.json: byte %ld ", offset);
    int ok = strstr(strata_error(), want) && (!what || strstr(strata_error(), what));
    if (!ok) printf("    message: %s\n", strata_error());
    return ok;
}
#define REFUSED(s, off, what) refused_at(s, sizeof(s) - 1, off, what)

static void test_values(void) {
    strata_json_doc d;
    const char *doc = " {\"a\": [1, -2, 3.5, 1e3, -0, 9223372036854775807, 9223372036854775808],\n"
                      "  \"s\": \"x\\\"\\\\\\/\\b\\f\\n\\r\\t\\u00e9\\ud83d\\ude00\\u0000y\", \"t\": true,"
                      " \"f\": false, \"n\": null, \"o\": {}, \"e\": [], \"u\": \"h\xc3\xa9 \xf0\x9f\x98\x80\"} ";
    CHECK(parse(&d, doc) == 0, "a document with every kind of value parses (%s)", strata_error());
    const strata_json *a = strata_json_get(&d.root, "a");
    CHECK(a && a->type == STRATA_JSON_ARRAY && a->len == 7, "array of 7 numbers");
    CHECK(a->items[0].is_int && a->items[0].integer == 1 && a->items[1].integer == -2, "integers");
    CHECK(!a->items[2].is_int && a->items[2].number == 3.5, "3.5 is a number, not an integer");
    CHECK(!a->items[3].is_int && a->items[3].number == 1000.0, "1e3 is 1000 and not written as an integer");
    CHECK(a->items[5].is_int && a->items[5].integer == INT64_MAX, "INT64_MAX is exact");
    CHECK(!a->items[6].is_int && a->items[6].number == 9223372036854775808.0, "2^63 is a number beyond int64");
    const strata_json *s = strata_json_get(&d.root, "s");
    const char want[] = "x\"\\/\b\f\n\r\t\xc3\xa9\xf0\x9f\x98\x80\0y";
    CHECK(s && s->type == STRATA_JSON_STRING && s->len == sizeof want - 1 && !memcmp(s->str, want, s->len),
          "escapes decode to UTF-8, a surrogate pair to one 4-byte character, \\u0000 is kept (len %zu)", s ? s->len : 0);
    CHECK(strata_json_get(&d.root, "t")->boolean == 1 && strata_json_get(&d.root, "f")->boolean == 0, "booleans");
    CHECK(strata_json_get(&d.root, "n")->type == STRATA_JSON_NULL, "null");
    CHECK(strata_json_get(&d.root, "o")->len == 0 && strata_json_get(&d.root, "e")->len == 0, "empty containers");
    CHECK(!strcmp(strata_json_get(&d.root, "u")->str, "h\xc3\xa9 \xf0\x9f\x98\x80"), "raw UTF-8 passes through");
    CHECK(strata_json_get(&d.root, "missing") == NULL && strata_json_get(a, "a") == NULL, "get: absent key, non-object");
    CHECK(d.root.members[0].key_offset == 2, "member offsets are byte offsets of the key");
    strata_json_free(&d);

    /* a large object (sorted duplicate check) and deep nesting within the bound */
    char big[20000];
    size_t o = (size_t)snprintf(big, sizeof big, "{");
    for (int i = 0; i < 1000; i++) o += (size_t)snprintf(big + o, sizeof big - o, "%s\"k%d\":%d", i ? "," : "", i, i);
    snprintf(big + o, sizeof big - o, "}");
    CHECK(parse(&d, big) == 0 && d.root.len == 1000 && strata_json_get(&d.root, "k999")->integer == 999,
          "an object of 1000 distinct keys");
    strata_json_free(&d);
    char deep[200];
    memset(deep, '[', STRATA_JSON_MAX_DEPTH);
    memset(deep + STRATA_JSON_MAX_DEPTH, ']', STRATA_JSON_MAX_DEPTH);
    deep[2 * STRATA_JSON_MAX_DEPTH] = 0;
    CHECK(parse(&d, deep) == 0, "%d nested arrays parse", STRATA_JSON_MAX_DEPTH);
    strata_json_free(&d);
    memset(deep, '[', STRATA_JSON_MAX_DEPTH + 1);
    memset(deep + STRATA_JSON_MAX_DEPTH + 1, ']', STRATA_JSON_MAX_DEPTH + 1);
    deep[2 * STRATA_JSON_MAX_DEPTH + 2] = 0;
    CHECK(refused_at(deep, strlen(deep), STRATA_JSON_MAX_DEPTH, "nested more than"), "%d levels are refused",
          STRATA_JSON_MAX_DEPTH + 1);
}

static void test_refusals(void) {
    CHECK(REFUSED("[1,]", 3, "trailing comma"), "trailing comma in an array, at its ']'");
    CHECK(REFUSED("{\"a\":1,}", 7, "trailing comma"), "trailing comma in an object");
    CHECK(REFUSED("[01]", 1, "leading zero"), "leading zero");
    CHECK(REFUSED("[NaN]", 1, "NaN"), "NaN");
    CHECK(REFUSED("[-Infinity]", 2, "a digit"), "-Infinity");
    CHECK(REFUSED("{'a':1}", 1, "member name in double quotes"), "single quotes");
    CHECK(REFUSED("[1] // c", 4, "unexpected data"), "a comment after the value");
    CHECK(REFUSED("[1 2]", 3, "',' or ']'"), "missing comma");
    CHECK(REFUSED("{\"a\" 1}", 5, "':'"), "missing colon");
    CHECK(REFUSED("[\"abc", 1, "not closed"), "unclosed string");
    CHECK(REFUSED("[\"a\tb\"]", 3, "control character"), "raw tab in a string");
    CHECK(REFUSED("[\"a\\xb\"]", 3, "invalid escape"), "\\x escape");
    CHECK(REFUSED("[\"\\u12g4\"]", 6, "hexadecimal"), "bad \\u digits");
    CHECK(REFUSED("[\"\\ud800\"]", 2, "high surrogate"), "lone high surrogate");
    CHECK(REFUSED("[\"\\udc00\"]", 2, "low surrogate"), "lone low surrogate");
    CHECK(REFUSED("[\"\\ud800\\u0041\"]", 2, "high surrogate"), "high surrogate followed by a non-surrogate");
    CHECK(REFUSED("[\"a\xff\"]", 3, "UTF-8"), "byte 0xff in a string");
    CHECK(REFUSED("[\"\xc0\xaf\"]", 2, "UTF-8"), "overlong UTF-8");
    CHECK(REFUSED("[\"\xed\xa0\x80\"]", 2, "UTF-8"), "a surrogate encoded in UTF-8");
    CHECK(REFUSED("[\"\xf4\x90\x80\x80\"]", 2, "UTF-8"), "a code point above U+10FFFF");
    CHECK(REFUSED("[\"\xe2\x82\"]", 2, "UTF-8"), "a truncated UTF-8 sequence");
    CHECK(REFUSED("{\"a\":1,\"b\":2,\"a\":3}", 13, "duplicate key \"a\" (first at line 1, column 2)"), "duplicate key");
    CHECK(REFUSED("{} x", 3, "unexpected data"), "data after the value");
    CHECK(REFUSED("", 0, "empty input"), "empty input");
    CHECK(REFUSED("   ", 3, "empty input"), "only whitespace");
    CHECK(REFUSED("\xef\xbb\xbf{}", 0, "byte order mark"), "a UTF-8 byte order mark");
    CHECK(REFUSED("tru", 0, "a JSON value"), "a truncated literal");
    CHECK(REFUSED("[1.]", 3, "decimal point"), "no digit after the decimal point");
    CHECK(REFUSED("[1e+]", 4, "exponent"), "no digit in the exponent");
    CHECK(REFUSED("[\n  1,\n  x]", 9, "(line 3, column 3)"), "line and column in the message");

    /* duplicates among many keys go through the sorted check */
    char big[4000];
    size_t o = (size_t)snprintf(big, sizeof big, "{");
    for (int i = 0; i < 100; i++) o += (size_t)snprintf(big + o, sizeof big - o, "%s\"k%d\":0", i ? "," : "", i);
    long dup_at = (long)o + 1;
    o += (size_t)snprintf(big + o, sizeof big - o, ",\"k42\":1}");
    CHECK(refused_at(big, o, dup_at, "duplicate key \"k42\""), "a duplicate among 101 keys, at the second one");

    /* a key with a NUL inside is a key; get() does not match it to a shorter one */
    strata_json_doc d;
    CHECK(parse(&d, "{\"a\\u0000b\":1}") == 0 && strata_json_get(&d.root, "a") == NULL && d.root.members[0].key_len == 3,
          "a key holding NUL is kept whole");
    strata_json_free(&d);
}

/* Every prefix of a valid document is refused (or, for the whole, read), never read past. */
static void test_prefixes_and_mutations(void) {
    const char *doc = "{\"dtype\":\"F32\",\"shape\":[2,3],\"data_offsets\":[0,24],\"s\":\"\\ud83d\\ude00 \xc3\xa9\\n\","
                      "\"x\":[true,false,null,-1.5e-3,{\"y\":[]}]}";
    size_t n = strlen(doc);
    int bad = 0;
    check_quiet = 1;
    for (size_t k = 0; k < n; k++) {
        strata_json_doc d;
        if (parse_n(&d, doc, k) == 0) {
            strata_json_free(&d);
            bad++;
        }
    }
    CHECK(bad == 0, "all %zu proper prefixes are refused", n);
    /* every single-byte change to a few values: parsed or refused, without a stray read */
    static const unsigned char subst[] = {0, '"', '\\', '{', '}', '[', ']', ',', ':', '0', 'e', '-', 0x80, 0xff, 'u', ' '};
    char *m = malloc(n);
    int parsed = 0, refused = 0;
    for (size_t k = 0; k < n; k++) {
        for (size_t j = 0; j < sizeof subst; j++) {
            memcpy(m, doc, n);
            m[k] = (char)subst[j];
            strata_json_doc d;
            if (parse_n(&d, m, n) == 0) {
                parsed++;
                strata_json_free(&d);
            } else {
                refused++;
                if (!strstr(strata_error(), "t.json: byte ")) bad++;
            }
        }
    }
    free(m);
    check_quiet = 0;
    CHECK(bad == 0 && refused > 0, "%d mutated documents: %d parsed, %d refused, every refusal names a byte offset",
          parsed + refused, parsed, refused);
}

int main(void) {
    test_values();
    test_refusals();
    test_prefixes_and_mutations();
    return check_report();
}
