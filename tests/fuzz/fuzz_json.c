/* tests/fuzz/fuzz_json.c: the JSON reader (io/json.c) and the two Hugging Face files
 * that come through it from anyone's model folder: config.json (io/hf_config.c) and
 * tokenizer.json (io/bpe.c).
 *
 * Input: one JSON document. Checked beyond "no crash": every string is NUL-terminated at
 * its length, strata_json_get finds each member of an object by its key, and a string
 * written by strata_json_write_string parses back to the same bytes. A document that is
 * an object is then read as config.json and as tokenizer.json; a tokenizer that loads
 * encodes (also as a document, with its template's tokens) and decodes a short text, and
 * encodes one of combining marks, Hangul jamo and a metaspace (its normalizers). */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/common.h"
#include "io/bpe.h"
#include "io/hf_config.h"
#include "io/json.h"
#include "io/pretrained.h"
#include "fuzz.h"

static void check_string_round_trip(const char *s, size_t len) {
    char *text = NULL;
    size_t text_len = 0;
    FILE *f = open_memstream(&text, &text_len);
    if (!f) abort();
    strata_json_write_string(f, s, len);
    fclose(f);
    strata_json_doc back;
    if (strata_json_parse(&back, text, text_len, "written string"))
        fuzz_violation("strata_json_write_string wrote %s, which does not parse: %s", text, strata_error());
    if (back.root.type != STRATA_JSON_STRING || back.root.len != len || memcmp(back.root.str, s, len))
        fuzz_violation("the string %s does not parse back to the %zu bytes written", text, len);
    strata_json_free(&back);
    free(text);
}

static void walk(const strata_json *v, size_t input_len, int depth) {
    if (depth > STRATA_JSON_MAX_DEPTH) fuzz_violation("a value nested %d deep was accepted", depth);
    if (v->offset >= input_len) fuzz_violation("a value's offset %zu is outside the input", v->offset);
    switch (v->type) {
    case STRATA_JSON_STRING:
        if (v->str[v->len] != 0) fuzz_violation("a string is not NUL-terminated at its length");
        check_string_round_trip(v->str, v->len);
        break;
    case STRATA_JSON_ARRAY:
        for (size_t i = 0; i < v->len; i++) walk(&v->items[i], input_len, depth + 1);
        break;
    case STRATA_JSON_OBJECT:
        for (size_t i = 0; i < v->len; i++) {
            const strata_json_member *m = &v->members[i];
            if (m->key[m->key_len] != 0) fuzz_violation("a key is not NUL-terminated at its length");
            /* keys are unique, so the lookup must land on this member (keys holding a
             * NUL cannot be named through a C string) */
            if (strlen(m->key) == m->key_len && strata_json_get(v, m->key) != &m->value)
                fuzz_violation("strata_json_get does not find member %zu by its key", i);
            walk(&m->value, input_len, depth + 1);
        }
        break;
    default: break;
    }
}

static int count_ids(void *ctx, const int32_t *ids, size_t n) {
    (void)ids;
    *(size_t *)ctx += n;
    return 0;
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size) {
    strata_json_doc doc;
    if (strata_json_parse(&doc, data, size, "fuzz.json")) return 0;
    walk(&doc.root, size, 1);
    int line, col;
    strata_json_line_col(data, size, size, &line, &col);
    int is_object = doc.root.type == STRATA_JSON_OBJECT;
    strata_json_free(&doc);
    fuzz_accepted = 1;
    if (!is_object) return 0;

    const char *path = fuzz_write("config.json", data, size);
    strata_hf_shape shape;
    int config_ok = strata_hf_config_read(path, &shape) == 0;
    if (config_ok && (shape.n_layer < 1 || shape.n_head < 1 || shape.n_embd < 1 || shape.vocab_size < 1))
        fuzz_violation("config.json accepted with n_layer %d, n_head %d, n_embd %d, vocab_size %d", shape.n_layer,
                       shape.n_head, shape.n_embd, shape.vocab_size);

    path = fuzz_write("tokenizer.json", data, size);
    strata_bpe *tk = strata_bpe_load(path);
    if (tk) {
        static const char text[] = "Hello, world! It's 2024 <|endoftext|> caf\xc3\xa9  \n";
        size_t n_ids = 0;
        strata_bpe_encode(tk, text, sizeof text - 1, "sample text", count_ids, &n_ids);
        strata_bpe_encode_doc(tk, text, sizeof text - 1, "sample text", count_ids, &n_ids);
        static const char marks[] = "A\xcc\x8a\xcc\x81\xe1\x84\x80\xe1\x85\xa1 \xe2\x96\x81<s>\xf0\x9f\x98\x80";
        strata_bpe_encode(tk, marks, sizeof marks - 1, "marks", count_ids, &n_ids);
        int32_t ids[] = {0, 1, 2, 255, 256, 50256, -1, 1 << 30};
        size_t len = 0;
        char *out = strata_bpe_decode(tk, ids, sizeof ids / sizeof *ids, &len);
        free(out);
        strata_bpe_free(tk);
    }
    (void)config_ok; /* refusing a config.json is a fine outcome: the JSON was accepted */
    return 0;
}
