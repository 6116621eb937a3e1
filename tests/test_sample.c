/* tests/test_sample.c: generated tokens written as text one at a time (launcher/sample.c)
 * read the same as the whole sequence decoded at once, a UTF-8 character split across
 * tokens included, and nothing waits for the end but such a character's missing bytes;
 * so does a SentencePiece-style vocabulary (its ▁, byte fallback, the one leading
 * space its decoder strips, special tokens as their text); a stop token ends the stream. */
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

    /* Llama 2's layout: 0 <s>, 1 "▁Hi", 2 "▁", 3 <0xC3>, 4 <0xA9>, 5 "x", 6 </s> */
    static const char spm[] =
        "{\"added_tokens\":[{\"id\":0,\"content\":\"<s>\",\"special\":true,\"normalized\":false},{\"id\":6,"
        "\"content\":\"</s>\",\"special\":true,\"normalized\":false}],\"normalizer\":{\"type\":\"Sequence\","
        "\"normalizers\":[{\"type\":\"Prepend\",\"prepend\":\"\xe2\x96\x81\"},{\"type\":\"Replace\",\"pattern\":"
        "{\"String\":\" \"},\"content\":\"\xe2\x96\x81\"}]},\"pre_tokenizer\":null,\"post_processor\":null,"
        "\"decoder\":{\"type\":\"Sequence\",\"decoders\":[{\"type\":\"Replace\",\"pattern\":{\"String\":"
        "\"\xe2\x96\x81\"},\"content\":\" \"},{\"type\":\"ByteFallback\"},{\"type\":\"Fuse\"},{\"type\":\"Strip\","
        "\"content\":\" \",\"start\":1,\"stop\":0}]},\"model\":{\"type\":\"BPE\",\"byte_fallback\":true,\"vocab\":"
        "{\"<s>\":0,\"\xe2\x96\x81Hi\":1,\"\xe2\x96\x81\":2,\"<0xC3>\":3,\"<0xA9>\":4,\"x\":5,\"</s>\":6},\"merges\":[]}}";
    char path2[] = "/tmp/strata_test_sample_XXXXXX";
    fd = mkstemp(path2);
    CHECK(fd >= 0 && write(fd, spm, sizeof spm - 1) == (ssize_t)(sizeof spm - 1), "write the SentencePiece-style tokenizer");
    close(fd);
    t = strata_bpe_load(path2);
    unlink(path2);
    CHECK(t != NULL, "load it: %s", t ? "" : strata_error());
    if (!t) return check_report();
    static const int32_t sp_cases[][7] = {{1, 2, 3, 4, 5, -1}, {2, 1, 1, -1}, {5, 1, 6, 1, -1}, {3, 4, 2, 2, 5, -1}};
    for (size_t c = 0; c < sizeof sp_cases / sizeof sp_cases[0]; c++) {
        int n = 0;
        while (sp_cases[c][n] >= 0) n++;
        size_t whole_len = 0, seen = 0;
        char *whole = strata_bpe_decode(t, sp_cases[c], (size_t)n, &whole_len);
        char *streamed = stream(t, sp_cases[c], n, &seen);
        CHECK(strlen(streamed) == whole_len && !memcmp(streamed, whole, whole_len),
              "SentencePiece case %zu: streamed '%s' == decoded at once '%s'", c, streamed, whole);
        free(whole);
        free(streamed);
    }
    /* a stop token: written, then STRATA_TOKEN_STOP */
    char *buf = NULL;
    size_t len = 0;
    FILE *f = open_memstream(&buf, &len);
    strata_text_out o;
    strata_text_out_init(&o, f, 7, NULL, t);
    o.stop_id = 6;
    int first = strata_text_out_put(&o, 1), stop = strata_text_out_put(&o, 6);
    strata_text_out_finish(&o);
    fclose(f);
    CHECK(first == 0 && stop == STRATA_TOKEN_STOP && !strcmp(buf, "Hi</s>"),
          "the stop token is written, and ends the stream: '%s'", buf);
    free(buf);
    strata_bpe_free(t);
    return check_report();
}
