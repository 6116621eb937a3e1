/* tests/test_sample.c: generated tokens written as text one at a time (launcher/sample.c)
 * read the same as the whole sequence decoded at once, a UTF-8 character split across
 * tokens included, and nothing waits for the end but such a character's missing bytes. */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/bpe.h"
#include "launcher/sample.h"
#include "tests/check.h"

/* Byte-level BPE characters: "Ã" (U+00C3) is byte 0xC3, "©" (U+00A9) byte 0xA9, so
 * token 1 and token 2 are the two halves of "é" (C3 A9) and token 3 the whole of it. */
static const char tokenizer[] =
    "{\"version\":\"1.0\",\"truncation\":null,\"padding\":null,\"added_tokens\":[],\"normalizer\":null,"
    "\"pre_tokenizer\":{\"type\":\"ByteLevel\",\"add_prefix_space\":false,\"trim_offsets\":true,\"use_regex\":true},"
    "\"post_processor\":null,\"decoder\":{\"type\":\"ByteLevel\"},"
    "\"model\":{\"type\":\"BPE\",\"dropout\":null,\"unk_token\":null,"
    "\"vocab\":{\"a\":0,\"\xc3\x83\":1,\"\xc2\xa9\":2,\"\xc3\x83\xc2\xa9\":3},\"merges\":[\"\xc3\x83 \xc2\xa9\"]}}";

/* Puts ids through a strata_text_out; returns what was written (to free), and in
 * *before_finish how many bytes had come out before the last put's finish. */
static char *stream(const strata_bpe *t, const int32_t *ids, int n, size_t *before_finish) {
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    strata_text_out o;
    strata_text_out_init(&o, f, 4, NULL, t);
    for (int i = 0; i < n; i++) CHECK(strata_text_out_put(&o, ids[i]) == 0, "put token %d", ids[i]);
    *before_finish = len; /* put flushes, so len is what the reader has seen */
    strata_text_out_finish(&o);
    fclose(f);
    return buf;
}

int main(void) {
    char path[] = "/tmp/strata_test_sample_XXXXXX";
    int fd = mkstemp(path);
    CHECK(fd >= 0 && write(fd, tokenizer, sizeof tokenizer - 1) == (ssize_t)(sizeof tokenizer - 1), "write tokenizer");
    close(fd);
    strata_bpe *t = strata_bpe_load(path);
    unlink(path);
    CHECK(t != NULL, "load the tokenizer: %s", t ? "" : strata_error());
    if (!t) return 1;

    static const int32_t cases[][5] = {{0, 1, 2, 0, -1}, {0, 3, 0, 3, -1}, {1, 0, 2, -1}, {2, 2, 1, -1}, {0, 1, -1}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        int n = 0;
        while (cases[c][n] >= 0) n++;
        size_t whole_len = 0, seen = 0;
        char *whole = strata_bpe_decode(t, cases[c], (size_t)n, &whole_len);
        char *streamed = stream(t, cases[c], n, &seen);
        CHECK(strlen(streamed) == whole_len && !memcmp(streamed, whole, whole_len),
              "case %zu: streamed '%s' == decoded at once '%s'", c, streamed, whole);
        free(whole);
        free(streamed);
    }
    /* "a" then the first half of "é": "a" is out at once, the half waits for the rest */
    size_t seen = 0;
    char *s = stream(t, (const int32_t[]){0, 1}, 2, &seen);
    CHECK(seen == 1, "after 'a' + half a character, the reader has seen 1 byte (%zu)", seen);
    CHECK(!strcmp(s, "a\xef\xbf\xbd"), "an unfinished character at the end becomes U+FFFD");
    free(s);
    s = stream(t, (const int32_t[]){0, 1, 2}, 3, &seen);
    CHECK(seen == 3 && !strcmp(s, "a\xc3\xa9"), "its second half completes it: 'a\xc3\xa9' seen before the end");
    free(s);
    strata_bpe_free(t);
    return check_report();
}
